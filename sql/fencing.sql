--
-- Fencing tokens.
--
-- "other" is a second backend, reached through dblink: other_try(name)
-- says whether the lock is free there right now (setup.sql).
SELECT dblink_connect('other', other_conn());

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

-- The fencing pattern from docs/failures.md: the data store keeps the newest
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

SELECT dblink_disconnect('other');
