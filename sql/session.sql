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

-- DISCARD ALL, a pooler's reset between clients, releases session-level
-- holds, stacked and shared ones too, as it releases advisory locks.
SELECT zk_lock('discarded'), zk_lock('discarded'), zk_lock_shared('discarded_too');
SELECT other_try('discarded'), other_try('discarded_too');
DISCARD ALL;
SELECT other_try('discarded'), other_try('discarded_too');
SELECT count(*) FROM zk_locks WHERE pid = pg_backend_pid();
-- Not in a transaction block, where it fails and releases nothing.
SELECT zk_lock('kept');
BEGIN;
DISCARD ALL;
ROLLBACK;
SELECT other_try('kept');
DISCARD PLANS;
SELECT other_try('kept');
SELECT zk_unlock('kept');

-- With zklock.session_locks off (a pooler in transaction mode), every
-- session-level call fails, and the transaction-level ones work.
SET zklock.session_locks = off;
SELECT zk_lock('pooled');
SELECT zk_try_lock('pooled');
SELECT zk_lock_shared('pooled', '1 s');
SELECT zk_lock(ARRAY['pooled', 'pooled_too']);
SELECT zk_try_semaphore_acquire('pooled_slots', 2);
BEGIN;
SELECT zk_xact_lock('pooled'), zk_try_xact_lock_shared('pooled_shared'),
       zk_xact_lock(ARRAY['pooled_too']), zk_xact_semaphore_acquire('pooled_slots', 2);
SELECT other_try('pooled');
COMMIT;
SELECT other_try('pooled');
SELECT count(*) FROM zk_locks WHERE pid = pg_backend_pid();
RESET zklock.session_locks;

SELECT dblink_disconnect('other');
