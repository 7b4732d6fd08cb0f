--
-- Transaction-level locks: COMMIT, ROLLBACK, savepoints, procedures,
-- PREPARE and the asynchronous release.
--
-- "other" is a second backend, reached through dblink: other_try(name)
-- says whether the lock is free there right now (setup.sql).
SELECT dblink_connect('other', other_conn());

-- Transaction holds end at COMMIT and at ROLLBACK.
BEGIN;
SELECT zk_xact_lock('txn');
SELECT zk_xact_lock('txn');
SELECT other_try('txn');
COMMIT;
SELECT other_try('txn');
BEGIN;
SELECT zk_try_xact_lock('txn');
SELECT other_try('txn');
ROLLBACK;
SELECT other_try('txn');
-- An error aborts the transaction and ends its holds too.
BEGIN;
SELECT zk_xact_lock('txn');
SELECT 1 / 0;
ROLLBACK;
SELECT other_try('txn');
-- A transaction hold cannot be unlocked by hand.
BEGIN;
SELECT zk_xact_lock('txn');
SELECT zk_unlock('txn');
SELECT other_try('txn');
COMMIT;
-- Outside a transaction block the statement is the transaction.
SELECT zk_xact_lock('txn');
SELECT other_try('txn');

-- Savepoints: ROLLBACK TO ends the holds taken after the savepoint,
-- RELEASE passes them to the parent.
BEGIN;
SELECT zk_xact_lock('before_sp');
SAVEPOINT sp;
SELECT zk_xact_lock('after_sp');
SELECT zk_xact_lock('before_sp');
ROLLBACK TO SAVEPOINT sp;
SELECT other_try('after_sp');
SELECT other_try('before_sp');
SAVEPOINT sp2;
SELECT zk_xact_lock('released_sp');
SAVEPOINT sp3;
SELECT zk_xact_lock('released_sp');
RELEASE SAVEPOINT sp2;
SELECT other_try('released_sp');
COMMIT;
SELECT other_try('before_sp');
SELECT other_try('released_sp');
-- A PL/pgSQL exception block is a subtransaction too.
DO $$
BEGIN
  BEGIN
    PERFORM zk_xact_lock('in_block');
    RAISE EXCEPTION 'undo';
  EXCEPTION WHEN raise_exception THEN
    RAISE NOTICE 'in_block free after the block: %', other_try('in_block');
  END;
END $$;

-- Session and transaction holds on one name share one node.
SELECT zk_lock('both');
BEGIN;
SELECT zk_xact_lock('both');
COMMIT;
SELECT other_try('both');
BEGIN;
SELECT zk_xact_lock('both');
SELECT zk_unlock('both');
SELECT other_try('both');
COMMIT;
SELECT other_try('both');

-- zk_unlock_all ends every session hold and leaves transaction holds alone.
BEGIN;
SELECT zk_xact_lock('xact_only');
SELECT zk_lock('session_only');
SELECT zk_lock('session_only');
SELECT zk_lock('xact_only');
SELECT zk_unlock_all();
SELECT other_try('session_only');
SELECT other_try('xact_only');
COMMIT;
SELECT other_try('xact_only');

-- PREPARE TRANSACTION is refused while transaction holds exist, and the
-- resulting abort releases them.  Session holds do not prevent it.
BEGIN;
SELECT zk_xact_lock('two_phase');
PREPARE TRANSACTION 'zk_2pc';
SELECT other_try('two_phase');
SELECT zk_lock('two_phase_session');
BEGIN;
PREPARE TRANSACTION 'zk_2pc';
COMMIT PREPARED 'zk_2pc';
SELECT other_try('two_phase_session');
SELECT zk_unlock('two_phase_session');

-- COMMIT inside a procedure ends the transaction holds taken so far.
CREATE PROCEDURE commit_between() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM zk_xact_lock('proc_lock');
  RAISE NOTICE 'held in first transaction, free elsewhere: %', other_try('proc_lock');
  COMMIT;
  RAISE NOTICE 'after COMMIT, free elsewhere: %', other_try('proc_lock');
  PERFORM zk_xact_lock('proc_lock');
  ROLLBACK;
  RAISE NOTICE 'after ROLLBACK, free elsewhere: %', other_try('proc_lock');
END $$;
CALL commit_between();

-- With synchronous_release off, COMMIT does not wait for the release, but
-- the release is sent before COMMIT returns: another backend gets the lock
-- within a round trip, and this backend's next acquire is ordered after its
-- own release, so it finds the lock free at once.
SET zklock.synchronous_release = off;
BEGIN;
SELECT zk_xact_lock('async');
COMMIT;
SELECT other_query($$SELECT zk_lock('async', '5s')::text$$) AS other_gets_it;
SELECT other_query($$SELECT zk_unlock('async')::text$$);
BEGIN;
SELECT zk_xact_lock('async');
COMMIT;
BEGIN;
SELECT zk_try_xact_lock('async') AS reacquired_at_once;
ROLLBACK;
RESET zklock.synchronous_release;

SELECT dblink_disconnect('other');
