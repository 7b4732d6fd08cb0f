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

-- The fencing token of the lock this backend holds on name: the czxid of
-- its lock node, strictly increasing across successive holders.  NULL if
-- this backend does not hold the lock.

CREATE FUNCTION zk_lock_token(name text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'zk_lock_token'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
