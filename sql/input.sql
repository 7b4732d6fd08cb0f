--
-- Bad arguments, and how names map to nodes.
--
-- "other" is a second backend, reached through dblink: other_try(name)
-- says whether the lock is free there right now (setup.sql).
SELECT dblink_connect('other', other_conn());

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

-- Multi-locks: the array, each element and the timeout must be given.
SELECT zk_lock(NULL::text[]);
SELECT zk_lock('{}'::text[]);
SELECT zk_lock(ARRAY['a', NULL]);
SELECT zk_lock(ARRAY[['a', 'b'], ['c', 'd']]);
SELECT zk_lock(ARRAY['a', ''], '1s');
SELECT zk_lock(ARRAY['a'], NULL);
SELECT zk_try_lock(ARRAY['listed', 'listed']) AS duplicates_count_once;
SELECT zk_unlock(ARRAY['listed']) AS released_once;
SELECT zk_unlock(ARRAY['listed']);

-- Semaphores: a name and a size from 1 to 10000.
SELECT zk_semaphore_acquire(NULL, 1);
SELECT zk_semaphore_acquire('s', NULL);
SELECT zk_semaphore_acquire('s', 0);
SELECT zk_semaphore_acquire('s', 10001);
SELECT zk_semaphore_acquire('', 1);
SELECT zk_semaphore_acquire('s', 1, '-1s');
SELECT zk_semaphore_release(NULL);
SELECT zk_semaphore_release('never_acquired');
SELECT zk_semaphore_token('never_acquired') IS NULL AS no_token;
SELECT * FROM zk_semaphore_contenders(NULL);
SELECT zk_try_semaphore_acquire('s', 2) AND zk_try_semaphore_acquire('s', 2)
  AS two_slots;
SELECT zk_try_semaphore_acquire('s', 2) AS third_slot;
SELECT count(*) AS slots FROM zk_semaphore_contenders('s');
SELECT zk_semaphore_release('s') AND zk_semaphore_release('s') AS released;

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
