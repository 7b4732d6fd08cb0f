--
-- zklock regression tests, against a real ZooKeeper ensemble.
--
-- A second backend, reached through dblink, plays the other contender:
-- "other_try(name)" tries the lock there and releases it again at once, so
-- it says whether the lock is free right now.
--
-- Load the library so its settings are defined before the first lock call.
LOAD 'zklock';
-- The checks below look at a lock from the other backend right after COMMIT
-- or ROLLBACK: with the default zklock.synchronous_release = on, the lock is
-- free by then, as an advisory lock would be.  The opt-in "off" is tested
-- near the end.
SHOW zklock.synchronous_release;

SELECT format('dbname=%s port=%s host=%s', current_database(),
              current_setting('port'),
              split_part(current_setting('unix_socket_directories'), ',', 1))
  AS other_conn \gset
SELECT dblink_connect('other', :'other_conn');

CREATE FUNCTION other_try(name text) RETURNS boolean LANGUAGE sql AS $$
  SELECT got FROM dblink('other',
    format('SELECT zk_try_lock(%L) AND zk_unlock(%L)', name, name))
    AS t(got boolean)
$$;
CREATE FUNCTION other_query(sql text) RETURNS text LANGUAGE sql AS $$
  SELECT r FROM dblink('other', sql) AS t(r text)
$$;

-- The API, as created.
SELECT p.oid::regprocedure AS function, p.prorettype::regtype AS returns,
       p.provolatile, p.proparallel, p.proisstrict
FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'zklock'
ORDER BY p.oid;

-- Settings.
SHOW zklock.root;
SHOW zklock.session_timeout;
SHOW zklock.connect_timeout;
SET zklock.no_such_setting = 1;
SET zklock.root = 'relative';
SET zklock.root = '/trailing/';
SET zklock.root = '/a/../b';
SET zklock.root = '/a//b';
SET zklock.root = '/zookeeper/locks';
SET zklock.root = '/with space';

-- Only superusers may point zklock elsewhere or change its session.
CREATE ROLE zk_plain_user;
SET ROLE zk_plain_user;
DO $$
BEGIN
  SET zklock.hosts = '127.0.0.1:1';
EXCEPTION WHEN OTHERS THEN
  RAISE NOTICE 'SET zklock.hosts: % (%)', SQLERRM, SQLSTATE;
END $$;
SET zklock.hosts = '127.0.0.1:1';
SET zklock.root = '/elsewhere';
SET zklock.session_timeout = '1s';
SET zklock.client_log_level = debug;
SET zklock.connect_timeout = '3s';
SET zklock.synchronous_release = on;
SELECT zk_try_lock('plain_user_lock') AND zk_unlock('plain_user_lock') AS plain_user_locks;
RESET zklock.connect_timeout;
RESET ROLE;
DROP ROLE zk_plain_user;

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

-- Fencing tokens: NULL unless held, the same for every hold on one node,
-- and larger for each later holder, including one on another backend.
SELECT zk_lock_token('fenced') IS NULL AS not_held;
SELECT zk_lock('fenced');
SELECT zk_lock_token('fenced') AS first_token \gset
BEGIN;
SELECT zk_xact_lock('fenced');
SELECT zk_lock_token('fenced') = :first_token AS same_node;
COMMIT;
SELECT zk_unlock('fenced');
SELECT zk_lock_token('fenced') IS NULL AS released;
SELECT other_query($$SELECT zk_lock('fenced')::text$$);
SELECT other_query($$SELECT zk_lock_token('fenced')$$)::bigint > :first_token
  AS later_holder_has_larger_token;
SELECT other_query($$SELECT zk_unlock('fenced')::text$$);
SELECT zk_try_lock('fenced');
SELECT zk_lock_token('fenced') > :first_token AS larger_again;
SELECT zk_unlock('fenced');

-- The fencing pattern from the README: the data store keeps the newest
-- token it has seen and refuses writes that carry an older one.
CREATE TABLE fence (resource text PRIMARY KEY, token bigint NOT NULL);
INSERT INTO fence VALUES ('datastore_a', 0);
CREATE FUNCTION check_fence(res text, tok bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE fence SET token = tok WHERE resource = res AND token <= tok;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'stale fencing token for %', res;
  END IF;
END $$;
BEGIN;
SELECT zk_xact_lock('datastore_a');
SELECT zk_lock_token('datastore_a') AS old_token \gset
COMMIT;
SELECT other_query($$SELECT zk_lock('datastore_a')::text$$);
SELECT check_fence('datastore_a',
                   other_query($$SELECT zk_lock_token('datastore_a')$$)::bigint);
SELECT other_query($$SELECT zk_unlock('datastore_a')::text$$);
-- A holder that lost the lock in between comes back with its old token:
\set VERBOSITY terse
SELECT check_fence('datastore_a', :old_token);
\set VERBOSITY default

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

-- zk_locks: this backend's locks (other backends' are shown too, below).
SELECT zk_lock('v1');
SELECT zk_lock('v1');
SELECT zk_lock_shared('v2');
BEGIN;
SELECT zk_xact_lock('v1');
SELECT name, mode, scope, holds, state,
       node ~ ('^/zklock_regress/' || name || '/_c_[0-9a-f-]{36}-(read-)?lock-[0-9]{10}$') AS node_ok,
       token > 0 AS has_token, held_since <= now() AS since_ok
FROM zk_locks WHERE pid = pg_backend_pid() ORDER BY name, mode, scope;
COMMIT;
SELECT zk_unlock_all();
SELECT count(*) AS locks_left FROM zk_locks WHERE pid = pg_backend_pid();

-- With zklock preloaded, zk_locks shows every backend of the server.
SELECT other_query($$SELECT zk_lock('seen')::text$$);
SELECT name, mode, scope, holds, state, pid <> pg_backend_pid() AS other_backend,
       database = current_database() AS same_database, token > 0 AS has_token
FROM zk_locks WHERE name = 'seen';
SELECT other_query($$SELECT zk_unlock('seen')::text$$);
SELECT count(*) AS seen_left FROM zk_locks WHERE name = 'seen';

-- zk_lock_contenders: the queue across every client.  The other backend
-- waits asynchronously behind us.
SELECT zk_lock('queue');
SELECT zk_lock_shared('queue');
SELECT dblink_send_query('other', $$SELECT zk_lock('queue')$$);
DO $$
BEGIN
  FOR i IN 1..200 LOOP
    EXIT WHEN (SELECT count(*) FROM zk_lock_contenders('queue')) = 3;
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT queue_position, mode, holds, client,
       identity LIKE format('pid %s on %%, database %s, user %s, application %%',
                            pg_backend_pid(), current_database(), current_user) AS this_backend,
       token > 0 AS has_token
FROM zk_lock_contenders('queue') ORDER BY queue_position;
SELECT zk_unlock('queue'), zk_unlock_shared('queue');
SELECT * FROM dblink_get_result('other') AS t(r text);
SELECT * FROM dblink_get_result('other') AS t(r text);
SELECT other_query($$SELECT zk_unlock('queue')::text$$);
SELECT count(*) AS contenders_left FROM zk_lock_contenders('queue');
SELECT count(*) AS no_such_lock FROM zk_lock_contenders('never_used');

-- zk_status: this backend's session and counters; never the password.
SELECT state, server ~ '^127\.0\.0\.1:[0-9]+$' AS server_ok,
       session_id ~ '^0x[0-9a-f]+$' AS session_id_ok,
       session_timeout_ms = 10000 AS timeout_ok, locks_held,
       acquisitions > 0 AS acquired, waits > 0 AS waited,
       wait_time_ms > 0 AS wait_time_ok, timeouts > 0 AS timed_out,
       cancellations > 0 AS cancelled, losses, deadlocks
FROM zk_status();
SELECT count(*) AS columns FROM pg_attribute
WHERE attrelid = 'zk_locks'::regclass AND attnum > 0;

-- Bad arguments are errors, never a silent NULL.
SELECT zk_lock(NULL);
SELECT zk_try_lock(NULL);
SELECT zk_unlock(NULL);
SELECT zk_xact_lock(NULL);
SELECT zk_lock('x', NULL);
SELECT zk_lock('x', '-1 s');
SELECT zk_lock('');
SELECT zk_lock(repeat('n', 256));
SELECT zk_try_lock(repeat('n', 255));
SELECT zk_unlock(repeat('n', 255));
SELECT zk_unlock('');
SELECT zk_lock_token(NULL);
SELECT zk_lock_shared(NULL);
SELECT zk_unlock_shared(NULL);
SELECT * FROM zk_lock_contenders(NULL);
SELECT * FROM zk_lock_contenders('');

-- Names outside the plain set map to one node each, directly under the
-- root: slashes, dots and the like cannot reach another node.
SELECT zk_lock('a/b');
SELECT other_try('a/b'), other_try('a'), other_try('a%2Fb');
SELECT zk_lock('..');
SELECT other_try('..'), other_try('.'), other_try('%2E%2E');
SELECT zk_lock('zookeeper');
SELECT zk_lock('ünïcode and spaces');
SELECT other_try('ünïcode and spaces');
SELECT zk_lock(E'control\x01char');
SELECT other_try(E'control\x01char');
SELECT zk_unlock_all();
SELECT other_try('a/b'), other_try('..'), other_try('zookeeper'),
       other_try('ünïcode and spaces');
SELECT dblink_disconnect('other');
