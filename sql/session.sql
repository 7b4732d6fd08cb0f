--
-- Session-level locks: exclusion, stacking, try-locks and timeouts.
--
-- "other" is a second backend, reached through dblink: other_try(name)
-- says whether the lock is free there right now (setup.sql).
SELECT dblink_connect('other', other_conn());

-- Exclusion and stacking at session level.
SELECT zk_lock('datastore_a');
SELECT other_try('datastore_a');
SELECT zk_lock('datastore_a');
SELECT zk_try_lock('datastore_a');
SELECT zk_unlock('datastore_a');
SELECT zk_unlock('datastore_a');
SELECT other_try('datastore_a');
SELECT zk_unlock('datastore_a');
SELECT other_try('datastore_a');
-- Not held any more: false, with a warning, as pg_advisory_unlock.
SELECT zk_unlock('datastore_a');
SELECT zk_unlock('never_taken');

-- Try-lock and timeouts against a holder.
SELECT other_query($$SELECT zk_lock('busy')::text$$);
SELECT zk_try_lock('busy');
SELECT zk_try_xact_lock('busy');
SELECT zk_lock('busy', '200 ms');
SELECT zk_xact_lock('busy', '200 ms');
SELECT zk_lock('busy', '0');
SET statement_timeout = '300ms';
SELECT zk_lock('busy');
RESET statement_timeout;
SET lock_timeout = '300ms';
SELECT zk_lock('busy');
SELECT zk_xact_lock('busy');
RESET lock_timeout;
-- None of those waits left a node behind: once the holder lets go, the
-- lock is free at once.
SELECT other_query($$SELECT zk_unlock('busy')::text$$);
SELECT zk_try_lock('busy');
SELECT zk_unlock('busy');
SELECT zk_lock('busy', '1 s');
SELECT zk_unlock('busy');

-- Session holds survive an abort.
BEGIN;
SELECT zk_lock('survivor');
ROLLBACK;
SELECT other_try('survivor');
SELECT zk_unlock('survivor');

SELECT dblink_disconnect('other');
