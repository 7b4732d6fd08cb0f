--
-- Seeing who holds what: zk_locks, zk_lock_contenders, zk_status,
-- zk_sessions.
--
-- "other" is a second backend, reached through dblink: other_try(name)
-- says whether the lock is free there right now (setup.sql).
SELECT dblink_connect('other', other_conn());

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
-- The other backend's release is confirmed by the server it is connected
-- to; this backend may read from another, which applies it a moment later.
DO $$
BEGIN
  FOR i IN 1..200 LOOP
    EXIT WHEN (SELECT count(*) FROM zk_lock_contenders('queue')) = 0;
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT count(*) AS contenders_left FROM zk_lock_contenders('queue');
SELECT count(*) AS no_such_lock FROM zk_lock_contenders('never_used');

-- zk_status: this backend's session and counters; never the password.
-- A wait that times out and one that is cancelled, to count (from fresh
-- server-wide statistics, which the next section reads).
SELECT zk_stat_locks_reset();
SELECT other_query($$SELECT zk_lock('counted')::text$$);
SELECT zk_lock('counted', '200ms');
SET statement_timeout = '300ms';
SELECT zk_lock('counted');
RESET statement_timeout;
SELECT other_query($$SELECT zk_unlock('counted')::text$$);
SELECT state, server ~ '^127\.0\.0\.1:[0-9]+$' AS server_ok,
       session_id ~ '^0x[0-9a-f]+$' AS session_id_ok,
       session_timeout_ms = 10000 AS timeout_ok, locks_held,
       acquisitions > 0 AS acquired, waits > 0 AS waited,
       wait_time_ms > 0 AS wait_time_ok, timeouts > 0 AS timed_out,
       cancellations > 0 AS cancelled, losses, deadlocks
FROM zk_status();
SELECT count(*) AS columns FROM pg_attribute
WHERE attrelid = 'zk_locks'::regclass AND attnum > 0;

-- What zklock keeps for the backend's lifetime is in a memory context of
-- its own.
SELECT count(*) AS zklock_context FROM pg_backend_memory_contexts
WHERE name = 'zklock';

-- zk_sessions: every backend's session; this one and the other backend
-- that took locks are connected.
SELECT state, database = current_database() AS this_database,
       state_since <= now() AS since_ok
FROM zk_sessions WHERE pid = pg_backend_pid();
SELECT state AS other_state FROM zk_sessions
WHERE pid = (SELECT pid FROM dblink('other', 'SELECT pg_backend_pid()') AS t (pid int));

-- zk_stat_locks: the "counted" wait that timed out is in the bucket of
-- 1 s and every bucket above (they are cumulative); the cancelled one
-- counts as a cancellation, not a wait.
SELECT zk_stat_wait_time_bounds();
SELECT waits, timeouts, cancellations, wait_time_buckets
FROM zk_stat_locks WHERE name = 'counted';

-- Hold times: "counted" was held once by the other backend, for more than
-- 200 ms (this backend's timed-out and cancelled waits took that long).
SELECT zk_stat_hold_time_bounds();
SELECT releases, hold_time_ms > 200 AS held_long_enough,
       hold_time_buckets[2] AS within_100ms
FROM zk_stat_locks WHERE name = 'counted';

-- zk_lock_activity: what each name is doing on this server now.
SELECT zk_lock('busy');
SELECT other_query($$SELECT zk_lock_shared('busy', '100ms')::text$$);
SELECT name, semaphore, holders, waiters, lost, longest_hold > '0'::interval AS held,
       longest_wait
FROM zk_lock_activity WHERE name = 'busy';
SELECT zk_unlock('busy');
SELECT count(*) AS busy_left FROM zk_lock_activity WHERE name = 'busy';

SELECT dblink_disconnect('other');
