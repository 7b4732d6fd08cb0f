/*-------------------------------------------------------------------------
 *
 * zk_janitor.c
 *	  Deleting the lock nodes a backend gives up, whatever the connection
 *	  does meanwhile.
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
 * Every node a backend holds is in the list too, dormant: a release wakes
 * it, and so does a lost session, so that a session that comes back after
 * its locks were given up deletes them rather than hold them for nobody.
 *
 * This code runs on the backend and on the library's completion thread, so
 * it uses nothing of PostgreSQL but ereport on the backend-only entry
 * points, and calls the library only without holding zks_mutex.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>

#include "zk_names.h"
#include "zk_session.h"
#include "zk_session_int.h"

typedef struct JanitorTask
{
	struct JanitorTask *next;
	bool		sweep;			/* list path and delete children with guid */
	bool		dormant;		/* a held node: deleted on release or loss */
	bool		in_flight;
	bool		orphaned;		/* dropped from the list; its completion frees it */
	char	   *path;			/* node to delete, or parent to sweep */
	char		guid[ZKN_GUID_LEN + 1];
} JanitorTask;

/* Protected by zks_mutex. */
static JanitorTask *janitor_tasks = NULL;

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
janitor_clear_locked(void)
{
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
janitor_kick(zhandle_t *handle)
{
	JanitorTask *to_send[64];
	int			n;

	do
	{
		JanitorTask *task;
		int			i;

		n = 0;
		pthread_mutex_lock(&zks_mutex);
		for (task = janitor_tasks; task && n < (int) lengthof(to_send);
			 task = task->next)
		{
			if (!task->in_flight && !task->dormant)
			{
				task->in_flight = true;
				to_send[n++] = task;
			}
		}
		pthread_mutex_unlock(&zks_mutex);

		/* The library is never called with our mutex held. */
		for (i = 0; i < n; i++)
			janitor_send(handle, to_send[i]);
	} while (n == (int) lengthof(to_send));
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
			janitor_free(target);
			return;
		}
	}
}

/* A task is finished unless the request may not have reached the server. */
static bool
janitor_should_retry(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

static void
janitor_finish(JanitorTask *task, int rc)
{
	pthread_mutex_lock(&zks_mutex);
	task->in_flight = false;
	if (task->orphaned)
		janitor_free(task);
	else if (rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE || rc == ZCLOSING)
		janitor_clear_locked();
	else if (!janitor_should_retry(rc))
		janitor_unlink_locked(task);
	pthread_mutex_unlock(&zks_mutex);
	zks_wake_backend();
}

static void
janitor_delete_done(int rc, const void *data)
{
	janitor_finish((JanitorTask *) data, rc);
}

static JanitorTask *
janitor_new_task(bool sweep, const char *path, const char *guid)
{
	JanitorTask *task = calloc(1, sizeof(JanitorTask));

	if (task == NULL)
		return NULL;
	task->sweep = sweep;
	task->path = strdup(path);
	if (task->path == NULL)
	{
		free(task);
		return NULL;
	}
	if (guid)
		strlcpy(task->guid, guid, sizeof(task->guid));
	return task;
}

static void
janitor_sweep_done(int rc, const struct String_vector *children,
				   const void *data)
{
	JanitorTask *sweep = (JanitorTask *) data;
	JanitorTask *found[32];
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
			char		path[1024];
			JanitorTask *task = NULL;

			if (!zkn_has_guid(children->data[i], sweep->guid))
				continue;
			snprintf(path, sizeof(path), "%s/%s", sweep->path,
					 children->data[i]);
			if (nfound < (int) lengthof(found))
				task = janitor_new_task(false, path, NULL);
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
		janitor_kick(handle);
		return;
	}
	janitor_finish(sweep, rc == ZNONODE ? ZOK : rc);
}

/*
 * Did the library refuse a request before registering its completion?  For
 * other errors (out of memory while queueing) the completion is already
 * registered and will still come, with an error, on the next disconnect.
 */
bool
zks_refused_outright(int rc)
{
	return rc == ZINVALIDSTATE || rc == ZBADARGUMENTS || rc == ZCLOSING;
}

static void
sync_done(int rc, const char *value, const void *data)
{
}

/*
 * Make the server we are connected to catch up with the leader before the
 * next read.  After a reconnect it need not have seen a create whose reply
 * was lost; a read queued behind this sync has.
 */
int
zks_send_sync(zhandle_t *handle, const char *path)
{
	return zoo_async(handle, path, sync_done, NULL);
}

static void
janitor_send(zhandle_t *handle, JanitorTask *task)
{
	int			rc;

	if (handle == NULL)
		rc = ZCLOSING;
	else if (task->sweep)
	{
		rc = zks_send_sync(handle, task->path);
		if (rc == ZOK)
			rc = zoo_aget_children(handle, task->path, 0, janitor_sweep_done,
								   task);
	}
	else
		rc = zoo_adelete(handle, task->path, -1, janitor_delete_done, task);

	/* No completion will come, so settle it here. */
	if (zks_refused_outright(rc))
		janitor_finish(task, rc);
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
}

/*
 * Remember a node this backend now holds.  It stays in the janitor's list,
 * dormant, so that it is deleted if the session is declared lost but comes
 * back: the locks are given up then, and must not block others.
 */
void
zks_keep_node(const char *path)
{
	JanitorTask *task = janitor_new_task_or_error(false, path, NULL);

	task->dormant = true;
	pthread_mutex_lock(&zks_mutex);
	janitor_push_locked(task);
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
		if (task->dormant && strcmp(task->path, path) == 0)
		{
			task->dormant = false;
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
	janitor_kick(zks_zh);
	return true;
}

/*
 * Queue every delete that is waiting for a reconnect before whatever the
 * caller sends next: one session's requests are applied in order, so an
 * acquire that follows a release in the same backend is ordered after it.
 */
void
zks_send_pending_deletes(void)
{
	janitor_kick(zks_zh);
}

/* Delete every child of parent created with this guid, likewise. */
void
zks_sweep_later(const char *parent, const char *guid)
{
	JanitorTask *task = janitor_new_task_or_error(true, parent, guid);

	pthread_mutex_lock(&zks_mutex);
	janitor_push_locked(task);
	pthread_mutex_unlock(&zks_mutex);
	janitor_kick(zks_zh);
}

/* The session is declared lost: every held node is to go if it comes back. */
void
janitor_wake_dormant_locked(void)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		task->dormant = false;
}

/* Is any task waiting for its reply?  Caller holds zks_mutex. */
bool
janitor_busy_locked(void)
{
	JanitorTask *task;

	for (task = janitor_tasks; task; task = task->next)
		if (task->in_flight)
			return true;
	return false;
}
