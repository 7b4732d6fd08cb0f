--
-- zklock regression tests, against a real ZooKeeper ensemble; this file
-- runs first and sets up what the others use.  The server needs zklock in
-- shared_preload_libraries, zklock.hosts, and max_prepared_transactions > 0.
--
-- Load the library so its settings are defined before the first lock call.
LOAD 'zklock';
-- Every session of the test database, the dblink ones included, locks
-- under a root of its own.
ALTER DATABASE :"DBNAME" SET zklock.root = '/zklock_regress';
SET zklock.root = '/zklock_regress';
-- The checks look at a lock from the other backend right after COMMIT or
-- ROLLBACK: with the default zklock.synchronous_release = on, the lock is
-- free by then, as an advisory lock would be.  The opt-in "off" is tested
-- in xact.sql.
SHOW zklock.synchronous_release;

-- A second backend, reached through dblink, plays the other contender:
-- "other_try(name)" tries the lock there and releases it again at once, so
-- it says whether the lock is free right now.
CREATE FUNCTION other_conn() RETURNS text LANGUAGE sql AS $$
  SELECT format('dbname=%s port=%s host=%s', current_database(),
                current_setting('port'),
                split_part(current_setting('unix_socket_directories'), ',', 1))
$$;
CREATE FUNCTION other_try(name text) RETURNS boolean LANGUAGE sql AS $$
  SELECT got FROM dblink('other',
    format('SELECT zk_try_lock(%L) AND zk_unlock(%L)', name, name))
    AS t(got boolean)
$$;
CREATE FUNCTION other_query(sql text) RETURNS text LANGUAGE sql AS $$
  SELECT r FROM dblink('other', sql) AS t(r text)
$$;
SELECT dblink_connect('other', other_conn());

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
-- What one backend may keep on ZooKeeper, and how long it keeps a session
-- that holds nothing.
SHOW zklock.max_session_nodes;
SHOW zklock.max_session_path_bytes;
SHOW zklock.idle_session_timeout;
-- Keeping released locks is off by default (its bounds are checked in
-- test/t/026_keeping.pl: the range's message differs between majors).
SHOW zklock.keep_released;
SET zklock.max_session_nodes = 0;
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
-- Every view is readable by any role, as the functions behind it are.
SELECT c.relname AS view, has_table_privilege(c.oid, 'SELECT') AS readable
FROM pg_class c JOIN pg_depend d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'zklock'
WHERE c.relkind = 'v' ORDER BY 1;
SELECT (SELECT count(*) FROM zk_locks) + (SELECT count(*) FROM zk_stat_locks) +
       (SELECT count(*) FROM zk_lock_activity) + (SELECT count(*) FROM zk_sessions) >= 0
       AS every_view_read;
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
-- Nor lift the budget that keeps the ensemble safe, nor keep idle sessions.
SET zklock.max_session_nodes = 100000;
SET zklock.max_session_path_bytes = '64MB';
SET zklock.idle_session_timeout = 0;
SET zklock.connect_timeout = '3s';
SET zklock.synchronous_release = on;
SET zklock.keep_released = '10s';
RESET zklock.keep_released;
SELECT zk_try_lock('plain_user_lock') AND zk_unlock('plain_user_lock') AS plain_user_locks;
RESET zklock.connect_timeout;
RESET ROLE;
DROP ROLE zk_plain_user;

SELECT dblink_disconnect('other');
