--
-- Shared mode, and a backend holding both modes of a name.
--
-- "other" is a second backend, reached through dblink: other_try(name)
-- says whether the lock is free there right now (setup.sql).
SELECT dblink_connect('other', other_conn());

-- Shared mode: readers share; a writer excludes readers and writers.
SELECT zk_lock_shared('rw');
SELECT other_query($$SELECT (zk_try_lock_shared('rw') AND zk_unlock_shared('rw'))::text$$)
  AS other_reader_shares;
SELECT other_try('rw') AS other_writer_gets_in;
SELECT zk_lock_shared('rw');
SELECT zk_unlock_shared('rw');
SELECT other_try('rw') AS writer_still_excluded;
SELECT zk_unlock_shared('rw');
SELECT other_try('rw') AS writer_gets_in_now;
SELECT zk_unlock_shared('rw');
SELECT zk_lock('rw');
SELECT other_query($$SELECT zk_try_lock_shared('rw')::text$$) AS reader_excluded;
SELECT other_query($$SELECT zk_lock_shared('rw', '200ms')::text$$) AS reader_times_out;
-- A backend's own locks never conflict with each other, as with advisory
-- locks: it may hold both modes, and take them in either order.
SELECT zk_lock_shared('rw', '2s') AS own_writer_does_not_block;
SELECT zk_unlock('rw');
-- Its earlier, exclusive node keeps its place in the queue until its last
-- hold on the name ends, so nobody queued behind it is let in beside the
-- shared hold (other clients see an exclusive contender until then)...
SELECT other_query($$SELECT zk_try_lock_shared('rw')::text$$)
  AS reader_waits_for_last_hold;
-- ... and taking the exclusive mode again reuses that node.
SELECT zk_lock('rw', '2s') AS own_reader_does_not_block;
SELECT count(*) AS nodes FROM zk_lock_contenders('rw');
SELECT other_query($$SELECT zk_try_lock_shared('rw')::text$$) AS reader_excluded_again;
SELECT zk_unlock_shared('rw');
SELECT other_query($$SELECT zk_try_lock_shared('rw')::text$$)
  AS still_excluded_by_writer;
SELECT zk_unlock('rw');
SELECT other_query($$SELECT (zk_try_lock_shared('rw') AND zk_unlock_shared('rw'))::text$$)
  AS shares_after_last_hold;
BEGIN;
SELECT zk_xact_lock_shared('rwx');
SELECT zk_try_xact_lock_shared('rwx');
SELECT zk_xact_lock_shared('rwx', '1s');
SELECT other_try('rwx') AS writer_excluded;
SELECT zk_unlock_shared('rwx');
COMMIT;
SELECT other_try('rwx') AS free_after_commit;
SELECT zk_lock_shared('both_modes');
SELECT zk_lock('both_modes');
SELECT zk_unlock_all();
SELECT other_try('both_modes') AS unlock_all_ends_shared_holds_too;

SELECT dblink_disconnect('other');
