/* zklock--1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION zklock" to load this file. \quit

-- None of the functions is STRICT: a NULL argument is an error, never a
-- silent NULL result, because a job that thinks it holds a lock must.

-- Session level, like pg_advisory_lock and friends.

CREATE FUNCTION zk_lock(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'zk_lock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_lock(name text, timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_lock_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_lock(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_lock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_unlock(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_unlock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_unlock_all()
RETURNS void
AS 'MODULE_PATHNAME', 'zk_unlock_all'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_lock_shared(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'zk_lock_shared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_lock_shared(name text, timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_lock_shared_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_lock_shared(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_lock_shared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_unlock_shared(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_unlock_shared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Transaction level, like pg_advisory_xact_lock and friends.

CREATE FUNCTION zk_xact_lock(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'zk_xact_lock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_lock(name text, timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_xact_lock_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_xact_lock(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_xact_lock'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_lock_shared(name text)
RETURNS void
AS 'MODULE_PATHNAME', 'zk_xact_lock_shared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_lock_shared(name text, timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_xact_lock_shared_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_xact_lock_shared(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_xact_lock_shared'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- All or nothing: several locks at once, taken in one canonical order
-- whatever order they are listed in (so two multi-locks never deadlock each
-- other), each name once.  A timeout covers the whole call; on a timeout,
-- a try that fails, a cancel or an error, every hold the call took is
-- given back.

CREATE FUNCTION zk_lock(names text[])
RETURNS void
AS 'MODULE_PATHNAME', 'zk_lock_array'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_lock(names text[], timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_lock_array_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_lock(names text[])
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_lock_array'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_lock(names text[])
RETURNS void
AS 'MODULE_PATHNAME', 'zk_xact_lock_array'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_lock(names text[], timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_xact_lock_array_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_xact_lock(names text[])
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_xact_lock_array'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_unlock(names text[])
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_unlock_array'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Counting semaphores: at most "slots" holders at once, whatever client or
-- cluster they are on.  Each acquire takes one slot (a backend may hold
-- several); each release gives back one.  Callers that ask for different
-- sizes never see more holders than the smallest size among those ahead
-- of them.  Semaphores and locks of the same name are separate.

CREATE FUNCTION zk_semaphore_acquire(name text, slots integer)
RETURNS void
AS 'MODULE_PATHNAME', 'zk_semaphore_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_semaphore_acquire(name text, slots integer, timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_semaphore_acquire_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_semaphore_acquire(name text, slots integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_semaphore_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_semaphore_acquire(name text, slots integer)
RETURNS void
AS 'MODULE_PATHNAME', 'zk_xact_semaphore_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_xact_semaphore_acquire(name text, slots integer, timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_xact_semaphore_acquire_timeout'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_try_xact_semaphore_acquire(name text, slots integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_try_xact_semaphore_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION zk_semaphore_release(name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'zk_semaphore_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The fencing token of this backend's oldest slot of the semaphore, or
-- NULL if it holds none.
CREATE FUNCTION zk_semaphore_token(name text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'zk_semaphore_token'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The fencing token of the lock this backend holds on name: the czxid of
-- its lock node, strictly increasing across successive holders.  NULL if
-- this backend does not hold the lock.

CREATE FUNCTION zk_lock_token(name text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'zk_lock_token'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Seeing who holds what.
--
-- The views are readable by every role, as pg_locks and pg_stat_activity
-- are, and as the functions behind them are executable by PUBLIC; so a
-- monitoring role (pg_monitor) needs no grant of its own.

-- Every backend's zklocks, held and waited for, in the spirit of pg_locks:
-- the calling backend's own, and with zklock in shared_preload_libraries
-- every other backend's of this server.
CREATE FUNCTION zk_locks(
    OUT pid integer,
    OUT database oid,
    OUT name text,
    OUT mode text,
    OUT scope text,
    OUT holds integer,
    OUT state text,
    OUT node text,
    OUT token bigint,
    OUT held_since timestamptz,
    OUT waiting_since timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'zk_locks'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW zk_locks AS
SELECT l.pid, d.datname AS database, l.name, l.mode, l.scope, l.holds,
       l.state, l.node, l.token, l.held_since, l.waiting_since
FROM zk_locks() l LEFT JOIN pg_catalog.pg_database d ON d.oid = l.database;
GRANT SELECT ON zk_locks TO PUBLIC;

-- Who holds what a waiting backend of this server waits for, in the spirit
-- of pg_blocking_pids(): the contenders ahead of it in ZooKeeper, from any
-- client.  Needs zklock in shared_preload_libraries.
CREATE FUNCTION zk_blockers(
    waiter integer,
    OUT name text,
    OUT node text,
    OUT mode text,
    OUT holds boolean,
    OUT client text,
    OUT host text,
    OUT port integer,
    OUT pid integer,
    OUT identity text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'zk_blockers'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Server-wide statistics per lock name, in the style of pg_stat_*.  Needs
-- zklock in shared_preload_libraries.
CREATE FUNCTION zk_stat_locks(
    OUT name text,
    OUT acquisitions bigint,
    OUT waits bigint,
    OUT wait_time_ms double precision,
    OUT timeouts bigint,
    OUT cancellations bigint,
    OUT deadlocks bigint,
    OUT losses bigint,              -- holds lost with a session, one per mode
    OUT wait_time_buckets bigint[],
    OUT releases bigint,
    OUT hold_time_ms double precision,
    OUT hold_time_buckets bigint[],
    OUT kept_acquisitions bigint)   -- of acquisitions, taken from a kept node
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'zk_stat_locks'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW zk_stat_locks AS SELECT * FROM zk_stat_locks();
GRANT SELECT ON zk_stat_locks TO PUBLIC;

-- The upper bounds, in ms, of zk_stat_locks.wait_time_buckets: element i
-- counts the waits that ended within bound i (cumulative, as Prometheus's
-- histogram buckets are).
CREATE FUNCTION zk_stat_wait_time_bounds()
RETURNS double precision[]
AS 'MODULE_PATHNAME', 'zk_stat_wait_time_bounds'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- The same for zk_stat_locks.hold_time_buckets: the holds of a lock that
-- ended (released, or ended with their backend), by how long they lasted.
CREATE FUNCTION zk_stat_hold_time_bounds()
RETURNS double precision[]
AS 'MODULE_PATHNAME', 'zk_stat_hold_time_bounds'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- What each lock name is doing on this server now: its holders and
-- waiters among this server's backends, and how long the longest of each
-- has been at it.  A monitor alerts on longest_hold (a hung holder) and
-- longest_wait; the queue across other clients is zk_lock_contenders().
-- Needs zklock in shared_preload_libraries to see other backends.
CREATE VIEW zk_lock_activity AS
SELECT name, mode = 'semaphore' AS semaphore,
       count(DISTINCT pid) FILTER (WHERE state IN ('held', 'unsure')) AS holders,
       count(DISTINCT pid) FILTER (WHERE state = 'waiting') AS waiters,
       count(DISTINCT pid) FILTER (WHERE state = 'lost') AS lost,
       max(pg_catalog.clock_timestamp() - held_since)
           FILTER (WHERE state IN ('held', 'unsure')) AS longest_hold,
       max(pg_catalog.clock_timestamp() - waiting_since) AS longest_wait
FROM zk_locks()
GROUP BY name, mode = 'semaphore';
GRANT SELECT ON zk_lock_activity TO PUBLIC;

CREATE FUNCTION zk_stat_locks_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'zk_stat_locks_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION zk_stat_locks_reset() FROM PUBLIC;

-- The whole queue for a lock name, across every client of the ensemble.
CREATE FUNCTION zk_lock_contenders(
    name text,
    OUT queue_position integer,
    OUT node text,
    OUT mode text,
    OUT holds boolean,
    OUT client text,
    OUT identity text,
    OUT token bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'zk_lock_contenders'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The whole queue of a semaphore: its slots, holding and waiting.
CREATE FUNCTION zk_semaphore_contenders(
    name text,
    OUT queue_position integer,
    OUT node text,
    OUT mode text,
    OUT holds boolean,
    OUT client text,
    OUT identity text,
    OUT token bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'zk_semaphore_contenders'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Every backend's ZooKeeper session, server-wide with zklock preloaded
-- (otherwise this backend's alone): connected, unsure, lost or closed.
CREATE FUNCTION zk_sessions(
    OUT pid integer,
    OUT database oid,
    OUT state text,
    OUT state_since timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'zk_sessions'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE VIEW zk_sessions AS
SELECT s.pid, d.datname AS database, s.state, s.state_since
FROM zk_sessions() s LEFT JOIN pg_catalog.pg_database d ON d.oid = s.database;
GRANT SELECT ON zk_sessions TO PUBLIC;

-- This backend's ZooKeeper session and counters.
CREATE FUNCTION zk_status(
    OUT state text,
    OUT server text,
    OUT session_id text,
    OUT session_timeout_ms integer,
    OUT locks_held integer,
    OUT locks_lost integer,
    OUT acquisitions bigint,
    OUT waits bigint,
    OUT wait_time_ms double precision,
    OUT timeouts bigint,
    OUT cancellations bigint,
    OUT losses bigint,              -- the same, semaphore slots included
    OUT deadlocks bigint,
    OUT tls boolean)
RETURNS record
AS 'MODULE_PATHNAME', 'zk_status'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
