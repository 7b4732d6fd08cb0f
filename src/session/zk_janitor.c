/*-------------------------------------------------------------------------
 *
 * zk_janitor.c
 *	  The janitor: deleting the lock nodes a backend gives up, whatever the
 *	  connection does meanwhile.
 *
 * A node that a backend gave up on (try-lock lost, timeout, cancel, error,
 * release) must be deleted even if the connection drops at that moment, or
 * it would "hold" the lock for nobody until the session ends.  Such deletes
 * are kept in a list and re-sent after each reconnect, from the completion
 * thread, until the server confirms them or the session ends and takes the
 * nodes with it.  A sweep task lists a parent and deletes every child
 * carrying an acquisition's unique id; it covers a create whose reply was
 * lost, and because one session's requests are applied in order it also
 * catches a create that was still in flight when the sweep was sent.
 *
 * Every node a backend holds is in the list too, marked held: a release
 * clears the mark, and so does a lost session, so that a session that comes
 * back after its locks were given up deletes them rather than hold them for
 * nobody.
 *
 * So the list is every lock node the session may own but the one an
 * acquisition is making: the janitor keeps count of them and of the bytes
 * of their paths, for the session's budget (zk_budget.c).  A sweep counts
 * as one node of the longest name its uuid can have.
 *
 * The completions (janitor_delete_done, janitor_sweep_done) and
 * zkj_kick after a reconnect run on the library's completion thread,
 * so this code uses nothing of PostgreSQL but ereport on the backend-only
 * entry points (zks_delete_later and the like), and calls the library only
 * without holding zks_mutex.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <time.h>

#include "port/atomics.h"

#include "base/zk_layout.h"
#include "base/zk_names.h"
#include "session/zk_session.h"
#include "session/zk_session_int.h"

/* Janitor tasks sent per pass, and nodes deleted per sweep listing. */
#define JANITOR_BATCH				64
#define SWEEP_BATCH					32

typedef struct JanitorTask
{
	struct JanitorTask *next;
	bool		sweep;			/* list path, delete the children of guid */
	bool		held;			/* a held node: deleted on release or loss */
	bool		in_flight;
	bool		orphaned;		/* dropped from the list; its completion frees it */
	bool		sending;		/* janitor_send is in the library call for it */
	bool		answered_early; /* its completion came during that call ... */
	int			early_rc;		/* ... with this result */
	char	   *path;			/* node to delete, or parent to sweep */
	int			path_bytes;		/* of the node(s) it stands for, counted */
	char		guid[ZKN_GUID_LEN + 1];
	struct timespec sent_at;	/* when last sent */
} JanitorTask;

/* Protected by zks_mutex. */
static JanitorTask *janitor_tasks = NULL;
static bool janitor_failed = false;	/* a delete lost track of, or refused */

/*
 * The last delete the server refused, for the loss's messages: kept until
 * a new handle is made, since the session it ended is closed first.
 */
static char refused_path[ZKL_NODE_MAX] = "";
static int	refused_rc = ZOK;
static bool refusal_unreported = false;

/*
 * The tasks in the list, and the bytes of the paths of the nodes they stand
 * for: written under zks_mutex, and read without it by the budget check
 * that every acquisition makes, hence atomics (zkj_prepare makes them).
 */
static pg_atomic_uint32 janitor_nodes;
static pg_atomic_uint32 janitor_path_bytes;

/* A task leaves the list (it stays allocated if in flight). */
static void
janitor_uncount_locked(const JanitorTask *task)
{
	pg_atomic_sub_fetch_u32(&janitor_nodes, 1);
	pg_atomic_sub_fetch_u32(&janitor_path_bytes, task->path_bytes);
}

static void janitor_send(zhandle_t *handle, JanitorTask *task);
static void janitor_push_locked(JanitorTask *task);

static void
janitor_free(JanitorTask *task)
{
	free(task->path);
	free(task);
}

/*
 * Drop every janitor task; the session's nodes are gone with it.  A task
 * whose request is in flight is left for its completion to free.
 */
void
zkj_clear_locked(void)
{
	pg_atomic_write_u32(&janitor_nodes, 0);
	pg_atomic_write_u32(&janitor_path_bytes, 0);
	/* What the session owned is gone with it: nothing is left to end. */
	janitor_failed = false;
	while (janitor_tasks)
	{
		JanitorTask *task = janitor_tasks;

		janitor_tasks = task->next;
		if (task->in_flight)
			task->orphaned = true;
		else
			janitor_free(task);
	}
}

/*
 * Re-send janitor tasks that are not in flight.  Called on the completion
 * thread after a reconnect, and by the backend after adding tasks.
 */
void
zkj_kick(zhandle_t *handle)
{
	JanitorTask *to_send[JANITOR_BATCH];
	JanitorTask *task;
	int			rounds = 0;
	int			n;

	do
	{
		int			i;

		n = 0;
		pthread_mutex_lock(&zks_mutex);
		/* One pass over the list; a task replaced on the way waits. */
		if (rounds == 0)
			for (rounds = 1, task = janitor_tasks; task; task = task->next)
				rounds += (++n % (int) lengthof(to_send)) == 0;
		n = 0;
		for (task = janitor_tasks; task && n < (int) lengthof(to_send);
			 task = task->next)
		{
			if (!task->in_flight && !task->held)
			{
				task->in_flight = true;
				to_send[n++] = task;
			}
		}
		pthread_mutex_unlock(&zks_mutex);

		/* The library is never called with our mutex held. */
		for (i = 0; i < n; i++)
			janitor_send(handle, to_send[i]);
	} while (n == (int) lengthof(to_send) && --rounds > 0);
}

static void
janitor_unlink_locked(JanitorTask *target)
{
	JanitorTask **link;

	for (link = &janitor_tasks; *link; link = &(*link)->next)
	{
		if (*link == target)
		{
			*link = target->next;
			janitor_uncount_locked(target);
			janitor_free(target);
			return;
		}
	}
}

/*
 * A task is finished when the server answered it.  The library fails the
 * pending requests with whatever tore the connection down, a connection
 * loss or any other of its own errors, and those are sent again, as is one
 * the server turned away because the session moved to another server.
 */
static bool
janitor_should_retry(int rc)
{
	return (rc < 0 && rc > ZAPIERROR && rc != ZINVALIDSTATE &&
			rc != ZBADARGUMENTS) || rc == ZSESSIONMOVED;
}

static void
janitor_finish(JanitorTask *task, int rc)
{
	pthread_mutex_lock(&zks_mutex);
	if (task->sending)
	{
		/* janitor_send settles it once the library call has returned. */
		task->answered_early = true;
		task->early_rc = rc;
		pthread_mutex_unlock(&zks_mutex);
		return;
	}
	if (!task->sweep)
		zkct_note_heard_locked(&task->sent_at, true, rc);
	task->in_flight = false;
	if (task->orphaned)
		janitor_free(task);
	else if (rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE || rc == ZCLOSING)
		zkj_clear_locked();
	else if (!janitor_should_retry(rc))
	{
		/*
		 * Refused by the server (a parent that does not let zklock delete,
		 * say): the node stays, for nobody, and outside the budget's count.
		 * The backend must end the session, which deletes it.
		 */
		if (rc != ZOK && rc != ZNONODE && rc != ZBADARGUMENTS)
		{
			janitor_failed = true;
			strlcpy(refused_path, task->path, sizeof(refused_path));
			refused_rc = rc;
			refusal_unreported = true;
		}
		janitor_unlink_locked(task);
	}
	/* A parked session waits for its deletes before it is closed. */
	zkln_wake_watchdog_locked();
	pthread_mutex_unlock(&zks_mutex);
	zkln_wake_backend();
}

static void
janitor_delete_done(int rc, const void *data)
{
	janitor_finish((JanitorTask *) data, rc);
}

/*
 * A task, counted for the path of the node it stands for: a sweep's is its
 * parent's, a uuid and the longest marker and sequence number.
 */
static JanitorTask *
janitor_new_task(bool sweep, const char *path, const char *guid)
{
	JanitorTask *task = calloc(1, sizeof(JanitorTask));
	size_t		len = strlen(path);

	if (task == NULL)
		return NULL;
	task->sweep = sweep;
	task->path = malloc(len + 1);
	if (task->path == NULL)
	{
		free(task);
		return NULL;
	}
	memcpy(task->path, path, len + 1);
	task->path_bytes = len;
	if (sweep)
		task->path_bytes += (int) strlen("/_c_") + ZKN_GUID_LEN +
			(int) strlen("-read-lock-") + ZKL_SEQUENCE_MAX;
	if (guid)
		strlcpy(task->guid, guid, sizeof(task->guid));
	return task;
}

static void
janitor_sweep_done(int rc, const struct String_vector *children,
				   const void *data)
{
	JanitorTask *sweep = (JanitorTask *) data;
	JanitorTask *found[SWEEP_BATCH];
	int			nfound = 0;
	bool		complete = true;
	int			i;
	zhandle_t  *handle = NULL;

	pthread_mutex_lock(&zks_mutex);
	if (sweep->orphaned)
		rc = ZCLOSING;			/* janitor_finish frees it */
	pthread_mutex_unlock(&zks_mutex);

	if (rc == ZOK)
	{
		pthread_mutex_lock(&zks_mutex);
		handle = zks_zh;
		for (i = 0; i < children->count; i++)
		{
			JanitorTask *task = NULL;
			char	   *path;

			if (!zkn_has_guid(children->data[i], sweep->guid))
				continue;
			path = malloc(strlen(sweep->path) + strlen(children->data[i]) + 2);
			if (path != NULL && nfound < (int) lengthof(found))
			{
				sprintf(path, "%s/%s", sweep->path, children->data[i]);
				task = janitor_new_task(false, path, NULL);
			}
			free(path);
			if (task == NULL)
			{
				complete = false;
				continue;
			}
			task->in_flight = true;
			janitor_push_locked(task);
			found[nfound++] = task;
		}
		pthread_mutex_unlock(&zks_mutex);

		for (i = 0; i < nfound; i++)
			janitor_send(handle, found[i]);
	}

	/*
	 * Sweep again for what did not fit; the new listing is ordered after the
	 * deletes just sent, so it shows only what is left.
	 */
	if (!complete)
	{
		janitor_finish(sweep, ZCONNECTIONLOSS);
		zkj_kick(handle);
		return;
	}
	janitor_finish(sweep, rc == ZNONODE ? ZOK : rc);
}

/*
 * Send a task's request.  A completion may run on the completion thread
 * before the library call returns; janitor_finish then leaves the task to
 * be settled here.  When the library did not say whether a completion
 * will come (ZMARSHALLINGERROR), the task is left to that completion, if
 * any, to free, and a copy takes its place in the list, to be sent again;
 * if there is no memory for the copy, the backend is told to end the
 * session, which deletes the node with every other.
 */
static void
janitor_send(zhandle_t *handle, JanitorTask *task)
{
	bool		early;
	int			early_rc;
	int			rc;

	pthread_mutex_lock(&zks_mutex);
	task->sending = true;
	clock_gettime(CLOCK_MONOTONIC, &task->sent_at);
	pthread_mutex_unlock(&zks_mutex);

	if (handle == NULL)
		rc = ZCLOSING;
	else if (task->sweep)
	{
		rc = zkrq_send_sync(handle, task->path);
		if (rc == ZOK)
			rc = zoo_aget_children(handle, task->path, 0, janitor_sweep_done,
								   task);
	}
	else
		rc = zoo_adelete(handle, task->path, -1, janitor_delete_done, task);

	pthread_mutex_lock(&zks_mutex);
	task->sending = false;
	early = task->answered_early;
	early_rc = task->early_rc;
	task->answered_early = false;
	if (!early && rc != ZOK && !zkrq_refused_outright(rc))
	{
		JanitorTask *copy = janitor_new_task(task->sweep, task->path,
											 task->guid);
		JanitorTask **link;

		for (link = &janitor_tasks; *link; link = &(*link)->next)
		{
			if (*link == task)
			{
				*link = task->next;
				janitor_uncount_locked(task);
				if (copy)
				{
					janitor_push_locked(copy);
					copy = NULL;
				}
				else
					janitor_failed = true;
				break;
			}
		}
		if (copy)
			janitor_free(copy);	/* dropped meanwhile: nothing to redo */
		task->orphaned = true;
	}
	pthread_mutex_unlock(&zks_mutex);

	if (early)
		janitor_finish(task, early_rc);
	else if (zkrq_refused_outright(rc))
		janitor_finish(task, rc);
}

/* Read a flag of the janitor's and clear it. */
static bool
take_flag(bool *flag)
{
	bool		was;

	pthread_mutex_lock(&zks_mutex);
	was = *flag;
	*flag = false;
	pthread_mutex_unlock(&zks_mutex);
	return was;
}

/*
 * Did the janitor lose track of a delete (out of memory), or have one
 * refused?  The caller must then end the session.  Clears the answer.
 */
bool
zks_janitor_failed(void)
{
	return take_flag(&janitor_failed);
}

static JanitorTask *
janitor_new_task_or_error(bool sweep, const char *path, const char *guid)
{
	JanitorTask *task = janitor_new_task(sweep, path, guid);

	if (task == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	return task;
}

static void
janitor_push_locked(JanitorTask *task)
{
	task->next = janitor_tasks;
	janitor_tasks = task;
	pg_atomic_add_fetch_u32(&janitor_nodes, 1);
	pg_atomic_add_fetch_u32(&janitor_path_bytes, task->path_bytes);
}

/* Once per backend, before the first session: the counters. */
void
zkj_prepare(void)
{
	static bool prepared = false;

	if (prepared)
		return;
	pg_atomic_init_u32(&janitor_nodes, 0);
	pg_atomic_init_u32(&janitor_path_bytes, 0);
	prepared = true;
}

/*
 * How many lock nodes the session may own (held, or being deleted), and
 * the bytes of their paths; without the mutex, as the library's threads
 * may be changing them: exact once they are done.
 */
void
zkj_footprint(int *nodes, int64 *path_bytes)
{
	*nodes = pg_atomic_read_u32(&janitor_nodes);
	*path_bytes = pg_atomic_read_u32(&janitor_path_bytes);
}

/* Is any node being deleted or swept (not held)?  Caller holds zks_mutex. */
bool
zkj_deleting_any_locked(void)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		if (!task->held)
			return true;
	return false;
}

/*
 * For the fault tests only (zk_test_support.c): after this many more
 * grants, the session is declared lost, as if it had expired right after
 * the last of them.  0: never.
 */
int			zks_test_lose_after_grants = 0;

/*
 * Remember a node this backend now holds.  It stays in the janitor's list,
 * marked held, so that it is deleted if the session is declared lost but comes
 * back: the locks are given up then, and must not block others.
 */
void
zks_keep_node(const char *path)
{
	JanitorTask *task = janitor_new_task_or_error(false, path, NULL);

	task->held = true;
	pthread_mutex_lock(&zks_mutex);
	janitor_push_locked(task);
	if (zks_test_lose_after_grants > 0 && --zks_test_lose_after_grants == 0)
		zkct_declare_lost_locked();
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * Delete this node, retrying across reconnects until the session ends.
 * Never raises an ERROR, so transaction-end callbacks may call it; returns
 * false if it could not even record the task (out of memory).
 */
bool
zks_delete_later(const char *path)
{
	JanitorTask *task;

	pthread_mutex_lock(&zks_mutex);
	for (task = janitor_tasks; task; task = task->next)
	{
		if (task->held && strcmp(task->path, path) == 0)
		{
			task->held = false;
			break;
		}
	}
	pthread_mutex_unlock(&zks_mutex);

	if (task == NULL)
	{
		task = janitor_new_task(false, path, NULL);
		if (task == NULL)
			return false;
		pthread_mutex_lock(&zks_mutex);
		janitor_push_locked(task);
		pthread_mutex_unlock(&zks_mutex);
	}
	zkj_kick(zks_zh);
	return true;
}

/*
 * Is this child of parent a node this session gave up and is deleting (a
 * delete, or a sweep of its uuid, not yet confirmed)?  After a reconnect
 * the library may send a new create before the janitor re-sends such a
 * delete, so a new acquisition can list one of them ahead of its own node:
 * it is ours and on its way out, and must not make us wait for ourselves.
 */
bool
zks_deleting(const char *parent, const char *child)
{
	size_t		parent_len = strlen(parent);
	JanitorTask *task;
	bool		found = false;

	pthread_mutex_lock(&zks_mutex);
	for (task = janitor_tasks; task && !found; task = task->next)
	{
		if (task->held)
			continue;
		if (task->sweep)
			found = strcmp(task->path, parent) == 0 &&
				zkn_has_guid(child, task->guid);
		else
			found = strncmp(task->path, parent, parent_len) == 0 &&
				task->path[parent_len] == '/' &&
				strcmp(task->path + parent_len + 1, child) == 0;
	}
	pthread_mutex_unlock(&zks_mutex);
	return found;
}

/*
 * Queue every delete that is waiting for a reconnect before whatever the
 * caller sends next: one session's requests are applied in order, so an
 * acquire that follows a release in the same backend is ordered after it.
 */
void
zks_send_pending_deletes(void)
{
	zkj_kick(zks_zh);
}

/*
 * Delete every child of parent made with this guid for this mode, likewise;
 * false if the task could not be recorded (out of memory).
 */
bool
zks_sweep_later(const char *parent, const char *guid)
{
	JanitorTask *task = janitor_new_task(true, parent, guid);

	if (task == NULL)
		return false;
	pthread_mutex_lock(&zks_mutex);
	janitor_push_locked(task);
	pthread_mutex_unlock(&zks_mutex);
	zkj_kick(zks_zh);
	return true;
}

/* The session is declared lost: every held node is to go if it comes back. */
void
zkj_release_held_locked(void)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		task->held = false;
}

/* Is a node under parent held?  Caller holds zks_mutex. */
bool
zkj_holds_under_locked(const char *parent)
{
	size_t		len = strlen(parent);
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		if (task->held && !task->sweep &&
			strncmp(task->path, parent, len) == 0 && task->path[len] == '/')
			return true;
	return false;
}

/* Is this node held, in the list?  Caller holds zks_mutex. */
bool
zkj_is_held_locked(const char *path)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		if (task->held && !task->sweep && strcmp(task->path, path) == 0)
			return true;
	return false;
}

/*
 * A held node is given up (a kept node, zk_keeping.c): it is to be deleted.
 * Returns whether it was held, and so has a delete to send; the caller
 * kicks the janitor once it has let the mutex go.  Caller holds zks_mutex.
 */
bool
zkj_give_up_held_locked(const char *path)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		if (task->held && !task->sweep && strcmp(task->path, path) == 0)
		{
			task->held = false;
			return true;
		}
	return false;
}

/* Is any task waiting for its reply?  Caller holds zks_mutex. */
bool
zkj_busy_locked(void)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		if (task->in_flight)
			return true;
	return false;
}

/*
 * The last delete the server refused since the handle was made, as a
 * sentence for an error's detail into buf; false if none.  Caller holds
 * zks_mutex.
 */
bool
zkj_refusal_locked(char *buf, size_t size)
{
	if (refused_path[0] == '\0')
		return false;
	snprintf(buf, size,
			 _("ZooKeeper refused to delete lock node \"%s\" (%s), so zklock ended the session, which deletes its nodes."),
			 refused_path, zerror(refused_rc));
	return true;
}

/* A new handle is being made: its refusals start afresh.  Caller holds zks_mutex. */
void
zkj_forget_refusal_locked(void)
{
	refused_path[0] = '\0';
	refused_rc = ZOK;
}

/*
 * Has the server refused a delete that no message has told of yet?  Clears
 * the answer.
 */
bool
zks_take_refusal(void)
{
	return take_flag(&refusal_unreported);
}
