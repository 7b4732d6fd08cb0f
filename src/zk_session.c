/*-------------------------------------------------------------------------
 *
 * zk_session.c
 *	  The backend's ZooKeeper session and the rules for living with the
 *	  client library's threads (the janitor, which deletes given-up nodes
 *	  under the same rules, is in zk_janitor.c; the settings a session is
 *	  made with, among them its credentials and TLS files, in
 *	  zk_settings.c; what becomes of the library's own messages, in
 *	  zk_client_log.c).
 *
 * libzookeeper_mt runs an I/O thread and a completion thread.  Watchers and
 * completions run on the completion thread, where nothing of PostgreSQL may
 * be called: no palloc, no elog, not even SetLatch.  So the callbacks here
 * only touch malloc'd memory under one pthread mutex and then write to an
 * eventfd.  The backend waits for that eventfd, its latch and postmaster
 * death in a WaitEventSet, and runs CHECK_FOR_INTERRUPTS() on each wake-up,
 * so cancel, statement_timeout, lock_timeout and termination all reach a
 * waiting backend.  The synchronous zoo_* calls are never used: they block in
 * pthread_cond_wait where none of that reaches.
 *
 * The session is opened lazily on the first lock call (threads do not
 * survive fork, so never in the postmaster), with every signal blocked so the
 * library's threads never run PostgreSQL's signal handlers, and closed at
 * backend exit so the server drops our ephemeral nodes at once.
 *
 * The handle is made on a short-lived thread of its own, because making it
 * resolves the host names, which can take long and must stay cancellable;
 * the backend waits for that thread as for any reply.
 *
 * Contact.  The server expires a session one session timeout T after it
 * last heard from the client, while the library reports a disconnection
 * only two thirds of T after the last reply.  So zklock keeps its own clock:
 * the send time of the newest request the server answered (a reconnect
 * counts as an answer).  Its loss watchdog sends a cheap read whenever a
 * quarter of T passes without one, and declares the session lost when T
 * passes without an answer: never later than the server could expire it.
 * A read may be answered by a follower that has lost its leader, which
 * then keeps the client content until it gives up, while the leader
 * expires the session.  So COMMIT of a transaction holding zklocks also
 * asks for an answer from the leader (a sync) unless a write or sync was
 * answered within the last third of T.
 *
 * Deleting the nodes a backend gives up is the janitor's job
 * (zk_janitor.c): it shares the session's mutex and handle, and is driven
 * by its events, through zk_session_int.h, which nothing else includes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "zk_memory.h"
#include "zk_names.h"
#include "zk_session.h"
#include "zk_session_int.h"

/*
 * State shared with the library's threads.  Everything below is protected by
 * zks_mutex; the backend alone writes zks_zh.
 */
pthread_mutex_t zks_mutex = PTHREAD_MUTEX_INITIALIZER;
zhandle_t  *zks_zh = NULL;
static int	conn_state = 0;
static bool session_expired = false;
static bool auth_failed = false;
static bool ever_connected = false;
static int	negotiated_timeout = 0;
static uint64 watch_generation = 0;
static uint64 connect_count = 0;

/*
 * Every event carries the generation of the handle it is about: a handle
 * given up while it was being made, or closed, must not touch the state of
 * the one in use.
 */
static uint64 handle_generation = 0;

/* The contact clock (see the header comment), on CLOCK_MONOTONIC. */
static struct timespec connecting_since;	/* since the last disconnection */
static struct timespec last_heard;
static struct timespec last_leader_heard;
static struct timespec last_heartbeat;	/* when one was last sent */
static bool heartbeat_in_flight = false;

/*
 * A waiter's next listing of its queue, sent by the watcher itself when the
 * node the waiter watches changes, so the read that decides the handoff
 * does not first wait for the backend to wake up.  Armed by
 * zks_watch_then_list; claimed by the watcher, which moves the request to
 * listing_sent and owns the rest; taken by the backend (zks_take_listing).
 * A waiter whose grant the node's deletion alone decides (zk_recipe.c)
 * needs no listing then: the watcher only notes the deletion
 * (watched_deleted).  Such a waiter watches its own node too (own), and
 * any news of that comes first, in the server's order, and claims the
 * listing, so a deletion noted is never one that followed our own node's.
 */
typedef struct PendingListing
{
	char	   *watched;
	char	   *parent;
	char	   *own;			/* NULL unless the deletion decides */
	ZkRequest  *listing;
} PendingListing;

static PendingListing *listing_armed = NULL;
static ZkRequest *listing_sent = NULL;
static bool watched_deleted = false;

/*
 * The loss watchdog: a plain thread that keeps the contact clock going and
 * notices when the session has gone unheard for its timeout (no library
 * event says so) or has expired, and then, if holds that guard commits
 * exist and a statement runs, cancels that statement with SIGINT so the
 * work under the lock stops at once (see below, and zk_guard.c).  Also
 * protected by zks_mutex.
 */
static pthread_cond_t watchdog_cond;
static pthread_t watchdog_thread;
static bool watchdog_running = false;
static bool watchdog_stop = false;

/* Handles being closed on a thread of their own (zks_close); zks_mutex. */
static int	closers_running = 0;
static pthread_cond_t closers_done = PTHREAD_COND_INITIALIZER;
static bool loss_acted_on = false;
static bool declared_lost = false;	/* sticky until a new handle is opened */

/*
 * The lease (zklock.lease, kept by the hold table): when the earliest
 * leased hold's deadline passes, the watchdog declares the session lost,
 * exactly as if it had expired, and has the janitor delete the held nodes
 * at once, since the session itself may be well.  lease_ran_out says why,
 * for the loss's messages; both reset with a new handle.
 */
static bool lease_armed = false;
static struct timespec lease_deadline;
static int	lease_length_ms;
static bool lease_ran_out = false;

/*
 * Whether the watchdog may cancel the running statement on a loss: only
 * while holds that a loss must stop exist (the hold table says), a
 * statement runs inside the statement guard's hooks (zk_guard.c), and the
 * transaction is not committing, since the commit checks decide then.  A
 * cancel sent is flagged until the backend takes it (zks_take_loss_cancel,
 * take_back_loss_cancel).  These belong to the backend, not to a handle.
 */
static bool cancel_on_loss = false;
static bool statement_running = false;
static bool committing = false;
static bool loss_cancel_sent = false;

/* Backend-only state. */
static int	wake_fd = -1;
static uint32 lock_wait_event = PG_WAIT_EXTENSION;	/* in a lock's queue */
static uint32 request_wait_event = PG_WAIT_EXTENSION;	/* for ZooKeeper */
static WaitEventSet *wait_set = NULL;
static bool exit_callback_registered = false;

static int64 session_id = 0;
static bool handle_uses_tls = false;	/* the open handle was made for TLS */

/* How often the library may resolve the host names again. */
#define HOST_RESOLUTION_DELAY_MS	60000

/* The longest single sleep: WaitEventSetWait takes an int of milliseconds. */
#define MAX_SLEEP_MS				60000

/* A wait that watches the session looks at it at least this often. */
#define SESSION_CHECK_MS			1000

/* How often a wait for an unsure session to settle looks again. */
#define UNSURE_POLL_MS				100

/* Wake the backend.  Safe on any thread: a plain system call. */
void
zks_wake_backend(void)
{
	uint64		one = 1;
	ssize_t		rc pg_attribute_unused();

	rc = write(wake_fd, &one, sizeof(one));
}

/* One read empties an eventfd: it returns the count and sets it to zero. */
static void
drain_wake_fd(void)
{
	uint64		count;
	ssize_t		rc pg_attribute_unused();

	rc = read(wake_fd, &count, sizeof(count));
}

static void send_claimed_listing(zhandle_t *handle, PendingListing *claimed);
static void request_free(ZkRequest *req);
static void pending_listing_free(PendingListing *pending);

static int64
ms_since(const struct timespec *then, const struct timespec *now)
{
	return (int64) (now->tv_sec - then->tv_sec) * 1000 +
		(now->tv_nsec - then->tv_nsec) / 1000000;
}

static bool
later(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec > b->tv_sec ||
		(a->tv_sec == b->tv_sec && a->tv_nsec > b->tv_nsec);
}

/* Did the server answer a request with this result?  (Else the library did.) */
static bool
server_answered(int rc)
{
	return rc == ZOK ||
		(rc <= ZAPIERROR && rc != ZCLOSING && rc != ZSESSIONEXPIRED &&
		 rc != ZSESSIONMOVED);
}

/*
 * A request sent at sent_at was answered: the server heard from us then.
 * Caller holds zks_mutex.
 */
void
zks_note_heard_locked(const struct timespec *sent_at, bool via_leader, int rc)
{
	if (!server_answered(rc))
		return;
	if (later(sent_at, &last_heard))
		last_heard = *sent_at;
	if (via_leader && later(sent_at, &last_leader_heard))
		last_leader_heard = *sent_at;
}

static void *
generation_context(uint64 generation)
{
	return (void *) (uintptr_t) generation;
}

/*
 * The watcher for session events and for the watches the recipe sets.  A
 * watch carries no context but the handle's generation: any watch firing
 * bumps a generation counter and the waiting backend re-reads the queue, so
 * a stale watch from an earlier wait costs one harmless re-read.  A watch on
 * the node a waiter watches now also sends the waiter's listing (see
 * PendingListing).
 */
static void
session_watcher(zhandle_t *handle, int type, int state, const char *path,
				void *context)
{
	bool		reconnected = false;
	int			timeout = zoo_recv_timeout(handle);
	PendingListing *claimed = NULL;
	bool		discard_listing = false;

	/*
	 * On a reconnect, re-send the deletes that wait for one before the
	 * backend can see the session connected and send anything else: one
	 * session's requests are applied in order, so its next listing or
	 * create comes after them.
	 */
	if (type == ZOO_SESSION_EVENT && state == ZOO_CONNECTED_STATE)
	{
		pthread_mutex_lock(&zks_mutex);
		reconnected = (uint64) (uintptr_t) context == handle_generation;
		pthread_mutex_unlock(&zks_mutex);
		if (reconnected)
			zkj_kick(handle);
	}

	pthread_mutex_lock(&zks_mutex);
	if ((uint64) (uintptr_t) context != handle_generation)
	{
		pthread_mutex_unlock(&zks_mutex);
		return;
	}
	if (type != ZOO_SESSION_EVENT && listing_armed != NULL && path != NULL &&
		(strcmp(path, listing_armed->watched) == 0 ||
		 (listing_armed->own != NULL && strcmp(path, listing_armed->own) == 0)))
	{
		claimed = listing_armed;
		listing_armed = NULL;
		if (type == ZOO_DELETED_EVENT && claimed->own != NULL &&
			strcmp(path, claimed->watched) == 0)
			watched_deleted = discard_listing = true;
		else
			listing_sent = claimed->listing;
	}
	if (type == ZOO_SESSION_EVENT)
	{
		conn_state = state;
		if (state == ZOO_CONNECTED_STATE)
		{
			ever_connected = true;
			negotiated_timeout = timeout;
			connect_count++;

			/*
			 * The server renewed the session to let us in, at some time after
			 * we began connecting, which is all we know for sure; a heartbeat
			 * follows at once and tells more.
			 */
			if (later(&connecting_since, &last_heard))
				last_heard = connecting_since;
			if (later(&connecting_since, &last_leader_heard))
				last_leader_heard = connecting_since;
		}
		else if (state == ZOO_EXPIRED_SESSION_STATE)
		{
			session_expired = true;
			zkj_clear_locked();
		}
		else if (state == ZOO_AUTH_FAILED_STATE)
			auth_failed = true;
		else
			clock_gettime(CLOCK_MONOTONIC, &connecting_since);
	}
	/* After a reconnect a waiter re-checks the queue too. */
	watch_generation++;
	pthread_cond_signal(&watchdog_cond);
	pthread_mutex_unlock(&zks_mutex);

	if (claimed && discard_listing)
	{
		request_free(claimed->listing);
		pending_listing_free(claimed);
	}
	else if (claimed)
		send_claimed_listing(handle, claimed);
	zks_wake_backend();
}

/* Completion callbacks: copy the result out, then mark the request done. */

/* For the credentials (zk_settings.c): a rejection comes as a session event. */
void
zks_auth_done(int rc, const void *data)
{
}

static void
request_free_contents(ZkRequest *req)
{
	int			i;

	free(req->path);
	free(req->data);
	for (i = 0; i < req->nchildren; i++)
		free(req->children[i]);
	free(req->children);
}

static void
request_free(ZkRequest *req)
{
	request_free_contents(req);
	free(req);
}

/*
 * Requests the backend is done with, kept for its next ones: a lock cycle
 * makes two or three, and malloc's per-thread caches serve them poorly, as
 * the completion thread frees what it finishes itself.  Backend thread
 * only.
 */
#define SPARE_REQUESTS		4
static ZkRequest *spare_requests[SPARE_REQUESTS];
static int	nspare_requests = 0;

static void
request_recycle(ZkRequest *req)
{
	request_free_contents(req);
	if (nspare_requests < SPARE_REQUESTS)
		spare_requests[nspare_requests++] = req;
	else
		free(req);
}

static void
request_finish(ZkRequest *req, int rc)
{
	bool		abandoned;

	pthread_mutex_lock(&zks_mutex);
	if (req->done)
	{
		/* The late completion of a request we finished ourselves. */
		req->late_done = true;
		abandoned = req->abandoned;
		pthread_mutex_unlock(&zks_mutex);
		if (abandoned)
			request_free(req);
		return;
	}
	zks_note_heard_locked(&req->sent_at, req->via_leader, rc);
	req->rc = rc;
	req->done = true;
	abandoned = req->abandoned;
	pthread_mutex_unlock(&zks_mutex);

	if (abandoned)
		request_free(req);
	else
		zks_wake_backend();
}

static void
create_done(int rc, const char *path, const struct Stat *stat,
			const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK)
	{
		req->path = strdup(path);
		if (req->path == NULL)
			rc = ZSYSTEMERROR;
		if (stat)
			req->stat = *stat;
	}
	request_finish(req, rc);
}

static void
stat_done(int rc, const struct Stat *stat, const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && stat)
		req->stat = *stat;
	request_finish(req, rc);
}

static void
data_done(int rc, const char *value, int value_len, const struct Stat *stat,
		  const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && value && value_len > 0)
	{
		req->data = malloc(value_len);
		if (req->data == NULL)
			rc = ZSYSTEMERROR;
		else
		{
			memcpy(req->data, value, value_len);
			req->datalen = value_len;
		}
	}
	stat_done(rc, stat, data);
}

/* A listing: the children, and the parent's Stat (its cversion orders them). */
static void
children_done(int rc, const struct String_vector *strings,
			  const struct Stat *stat, const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && stat)
		req->stat = *stat;
	if (rc == ZOK && strings && strings->count > 0)
	{
		int			i;

		req->children = calloc(strings->count, sizeof(char *));
		if (req->children == NULL)
			rc = ZSYSTEMERROR;
		for (i = 0; rc == ZOK && i < strings->count; i++)
		{
			req->children[i] = strdup(strings->data[i]);
			req->nchildren = i + 1;
			if (req->children[i] == NULL)
				rc = ZSYSTEMERROR;
		}
	}
	request_finish(req, rc);
}

static ZkRequest *
request_new(bool via_leader)
{
	ZkRequest  *req;

	if (nspare_requests > 0)
	{
		req = spare_requests[--nspare_requests];
		memset(req, 0, sizeof(ZkRequest));
	}
	else
		req = calloc(1, sizeof(ZkRequest));
	if (req == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	req->via_leader = via_leader;
	clock_gettime(CLOCK_MONOTONIC, &req->sent_at);
	return req;
}

/* Report a request the library did not queue. */
static ZkRequest *
request_queued(ZkRequest *req, int rc, ZksOperation op, const char *path)
{
	if (rc != ZOK)
	{
		if (zks_refused_outright(rc))
			free(req);
		else
			zks_release_request(req);	/* its completion frees it */
		zks_report_error(rc, op, path);
	}
	return req;
}

ZkRequest *
zks_create(const char *path, const char *data, int datalen, int mode)
{
	ZkRequest  *req = request_new(true);

	return request_queued(req,
						  zoo_acreate2(zks_zh, path, data, datalen,
									   &zks_node_acl, mode,
									   create_done, req),
						  ZKS_CREATE, path);
}

ZkRequest *
zks_get_children(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aget_children2(zks_zh, path, 0, children_done, req),
						  ZKS_LIST, path);
}

/*
 * List children as the leader has them: the listing is queued behind a
 * sync, so it reflects every write the session made, even one whose reply
 * was lost on a previous connection.
 */
ZkRequest *
zks_get_children_synced(const char *path)
{
	ZkRequest  *req = request_new(false);
	int			rc = zks_send_sync(zks_zh, path);

	if (rc == ZOK)
		rc = zoo_aget_children2(zks_zh, path, 0, children_done, req);
	return request_queued(req, rc, ZKS_LIST, path);
}

ZkRequest *
zks_exists(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aexists(zks_zh, path, 0, stat_done, req),
						  ZKS_CHECK, path);
}

/* Check a node as the leader has it, likewise. */
ZkRequest *
zks_exists_synced(const char *path)
{
	ZkRequest  *req = request_new(false);
	int			rc = zks_send_sync(zks_zh, path);

	if (rc == ZOK)
		rc = zoo_aexists(zks_zh, path, 0, stat_done, req);
	return request_queued(req, rc, ZKS_CHECK, path);
}

static void
sync_done(int rc, const char *value, const void *data)
{
	request_finish((ZkRequest *) data, rc);
}

/* Ask the leader for an answer: a sync, which the leader replies to. */
static ZkRequest *
zks_sync(const char *path)
{
	ZkRequest  *req = request_new(true);

	return request_queued(req, zoo_async(zks_zh, path, sync_done, req),
						  ZKS_SYNC, path);
}

ZkRequest *
zks_get_data(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aget(zks_zh, path, 0, data_done, req),
						  ZKS_READ, path);
}

/* The server the session is connected to, or NULL. */
const char *
zks_current_server(void)
{
	if (zks_zh == NULL || zks_state() != ZKS_CONNECTED)
		return NULL;
	return zoo_get_current_server(zks_zh);
}

int
zks_negotiated_timeout(void)
{
	int			timeout;

	pthread_mutex_lock(&zks_mutex);
	timeout = negotiated_timeout;
	pthread_mutex_unlock(&zks_mutex);
	return timeout;
}

/* Read a node and leave a watch on it; see session_watcher. */
ZkRequest *
zks_watch_data(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_awget(zks_zh, path, session_watcher,
									generation_context(handle_generation),
									data_done, req),
						  ZKS_WATCH, path);
}

/* Change a node's data, whatever its version. */
ZkRequest *
zks_set_data(const char *path, const char *data, int datalen)
{
	ZkRequest  *req = request_new(true);

	return request_queued(req,
						  zoo_aset(zks_zh, path, data, datalen, -1, stat_done, req),
						  ZKS_SET_DATA, path);
}

static void
remove_watch_done(int rc, const void *data)
{
}

/*
 * Take back the data watches this session left on a node, so that the
 * node's going later notifies nobody; without waiting for the answer
 * (there may be no such watch any more, which is fine).  Only "remove
 * all" reaches the server: removing one watcher only stops the library
 * calling it, while the server still sends the notification.
 */
void
zks_remove_watch(const char *path)
{
	/* The library declares the completion oddly but stores it as given. */
	(void) zoo_aremove_all_watches(zks_zh, path, ZWATCHTYPE_DATA, 0,
								   (void_completion_t *) remove_watch_done,
								   NULL);
}

static void
pending_listing_free(PendingListing *pending)
{
	free(pending->watched);
	free(pending->parent);
	free(pending->own);
	free(pending);
}

/* On the completion thread, the mutex not held: the library is called. */
static void
send_claimed_listing(zhandle_t *handle, PendingListing *claimed)
{
	int			rc;

	clock_gettime(CLOCK_MONOTONIC, &claimed->listing->sent_at);
	rc = zoo_aget_children2(handle, claimed->parent, 0, children_done,
							claimed->listing);

	/*
	 * Refused outright, no completion comes; after ZMARSHALLINGERROR one
	 * may or may not.  The waiter must not wait for it: finish it as a
	 * connection loss (the waiter lists again), and let a late completion
	 * find it done.
	 */
	if (rc != ZOK && zks_refused_outright(rc))
		request_finish(claimed->listing, rc);
	else if (rc != ZOK)
	{
		pthread_mutex_lock(&zks_mutex);
		if (!claimed->listing->done)
		{
			claimed->listing->maybe_late = true;
			claimed->listing->rc = ZCONNECTIONLOSS;
			claimed->listing->done = true;
		}
		pthread_mutex_unlock(&zks_mutex);
		zks_wake_backend();
	}
	pending_listing_free(claimed);
}

/*
 * Watch a node as zks_watch_data does, and have the watcher list parent as
 * soon as the node changes or goes.  With own (the waiter's node, for a
 * waiter whose grant the watched node's deletion decides), watch that too,
 * first, its request in *own_watch; then the watcher lists on any news of
 * own, and on the watched node's deletion only notes it.  The backend picks
 * up either with zks_take_listing once the watch generation moves.
 */
ZkRequest *
zks_watch_then_list(const char *watched, const char *parent, const char *own,
					ZkRequest **own_watch)
{
	PendingListing *pending = calloc(1, sizeof(PendingListing));

	if (pending != NULL)
	{
		pending->watched = strdup(watched);
		pending->parent = strdup(parent);
		pending->own = own ? strdup(own) : NULL;
		pending->listing = calloc(1, sizeof(ZkRequest));
		if (!pending->watched || !pending->parent || !pending->listing ||
			(own && !pending->own))
		{
			free(pending->listing);
			pending_listing_free(pending);
			pending = NULL;
		}
	}
	if (pending == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	zks_cancel_listing();
	pthread_mutex_lock(&zks_mutex);
	listing_armed = pending;
	pthread_mutex_unlock(&zks_mutex);
	if (own)
		*own_watch = zks_watch_data(own);
	return zks_watch_data(watched);
}

/*
 * The listing the watcher sent (in flight, or finished), or NULL if it sent
 * none; *deleted says whether, instead, it saw the watched node go for a
 * waiter whose grant that decides.  Either way nothing stays armed.
 */
ZkRequest *
zks_take_listing(bool *deleted)
{
	PendingListing *unsent;
	ZkRequest  *sent;

	pthread_mutex_lock(&zks_mutex);
	unsent = listing_armed;
	listing_armed = NULL;
	sent = listing_sent;
	listing_sent = NULL;
	*deleted = watched_deleted;
	watched_deleted = false;
	pthread_mutex_unlock(&zks_mutex);
	if (unsent)
	{
		request_free(unsent->listing);
		pending_listing_free(unsent);
	}
	return sent;
}

void
zks_cancel_listing(void)
{
	bool		deleted;

	zks_release_request(zks_take_listing(&deleted));
}

/*
 * Free a request, or, if its reply has not come, leave it for the completion
 * thread to free.
 */
void
zks_release_request(ZkRequest *req)
{
	bool		free_now;

	if (req == NULL)
		return;
	pthread_mutex_lock(&zks_mutex);
	free_now = req->done && (!req->maybe_late || req->late_done);
	if (!free_now)
		req->abandoned = true;
	pthread_mutex_unlock(&zks_mutex);
	if (free_now)
		request_recycle(req);
}

/* Milliseconds left until deadline (0: none, -1 returned), capped. */
static long
ms_until(TimestampTz deadline)
{
	if (deadline == 0)
		return -1;
	return Min(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline),
			   MAX_SLEEP_MS);
}

/*
 * Sleep until the library has something for us, the latch is set, or
 * timeout_ms (-1: no limit) passes, showing wait_event meanwhile.
 * Interrupts are serviced unless the caller is cleaning up and must not be
 * stopped.
 */
static void
sleep_for(uint32 wait_event, long timeout_ms, bool interruptible)
{
	WaitEvent	event;

	if (timeout_ms > MAX_SLEEP_MS)
		timeout_ms = MAX_SLEEP_MS;
	(void) WaitEventSetWait(wait_set, timeout_ms, &event, 1, wait_event);
	ResetLatch(MyLatch);
	drain_wake_fd();
	if (interruptible)
		CHECK_FOR_INTERRUPTS();
}

/* Sleep waiting for ZooKeeper; see sleep_for. */
static void
sleep_for_event(long timeout_ms, bool interruptible)
{
	sleep_for(request_wait_event, timeout_ms, interruptible);
}

/*
 * Has the server gone unheard for the session timeout?  It may then have
 * expired the session, even though the library can only say so after it
 * reconnects, so our nodes must be taken as gone.
 */
static bool
unheard_too_long_locked(void)
{
	struct timespec now;

	if (!ever_connected)
		return false;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return ms_since(&last_heard, &now) >= negotiated_timeout;
}

/*
 * Once lost, always lost: a session that comes back after we gave its
 * locks up (the ensemble cannot expire sessions while it has no quorum)
 * must not be taken as holding them again.
 */
static bool
lost_locked(void)
{
	if (session_expired || auth_failed || unheard_too_long_locked())
		declared_lost = true;
	return declared_lost;
}

/*
 * Connected: our nodes are there.  Unsure: disconnected, but heard from
 * within the session timeout, so they may be.  Lost: they are gone.
 */
static ZksState
state_locked(void)
{
	if (lost_locked())
		return ZKS_LOST;
	if (conn_state == ZOO_CONNECTED_STATE)
		return ZKS_CONNECTED;
	return ZKS_UNSURE;
}

ZksState
zks_state(void)
{
	ZksState	state;

	if (zks_zh == NULL)
		return ZKS_LOST;
	pthread_mutex_lock(&zks_mutex);
	state = state_locked();
	pthread_mutex_unlock(&zks_mutex);
	return state;
}

/*
 * Where the session's state is shown to the rest of the server (see
 * zks_show_state_in), or NULL.  Written under the mutex by the backend when
 * it opens or closes the session, and by the watchdog before each sleep:
 * every event of the session wakes it, and so does the moment the session
 * would be lost.
 */
static pg_atomic_uint32 *shown_state = NULL;
static pg_atomic_uint32 *shown_since = NULL;

/*
 * Called before the watchdog sleeps, so that what it last decided is shown
 * (a loss it declares wakes nobody else).  The time is read from the
 * system, not from PostgreSQL, and written before the state, so that a
 * reader who reads the state first sees a time no older than it.
 */
static void
show_state_locked(void)
{
	uint32		now_shown;

	if (shown_state == NULL)
		return;
	now_shown = zks_zh == NULL ? ZKS_SHOWN_CLOSED : ZKS_SHOWN_OPEN + state_locked();
	if (pg_atomic_read_u32(shown_state) == now_shown)
		return;
	pg_atomic_write_u32(shown_since, (uint32) time(NULL));
	pg_write_barrier();
	pg_atomic_write_u32(shown_state, now_shown);
}

/*
 * Show the session's state, from now on, in *state (ZKS_SHOWN_CLOSED, or
 * ZKS_SHOWN_OPEN plus a ZksState) and when it last changed in *since, in
 * seconds since the Unix epoch; NULL stops it, after which no thread
 * writes there.  Both are 32-bit atomics, native (no lock) on the
 * platforms zklock is built for.
 */
void
zks_show_state_in(pg_atomic_uint32 *state, pg_atomic_uint32 *since)
{
	pthread_mutex_lock(&zks_mutex);
	shown_state = state;
	shown_since = since;
	show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
}

/* Has this session ended or become unusable, so its locks are gone? */
bool
zks_is_lost(void)
{
	return zks_zh != NULL && zks_state() == ZKS_LOST;
}

/*
 * Changes on every reconnect: our nodes may have been deleted by another
 * client while we could not see.
 */
uint64
zks_connection_count(void)
{
	uint64		count;

	pthread_mutex_lock(&zks_mutex);
	count = connect_count;
	pthread_mutex_unlock(&zks_mutex);
	return count;
}

static void
check_session_alive(void)
{
	bool		rejected;

	pthread_mutex_lock(&zks_mutex);
	rejected = auth_failed;
	pthread_mutex_unlock(&zks_mutex);
	/* Terminal for the handle: the next call opens a new session. */
	if (rejected)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PASSWORD),
				 errmsg("ZooKeeper rejected the credentials in zklock.auth")));
	if (zks_is_lost())
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("zklock lost its ZooKeeper session"),
				 errdetail_internal("%s", zks_loss_reason())));
}

/*
 * While the session is unsure, wait until it is connected again or lost.
 * Returns true if connected.
 */
bool
zks_wait_while_unsure(void)
{
	for (;;)
	{
		ZksState	state = zks_state();

		if (state != ZKS_UNSURE)
			return state == ZKS_CONNECTED;
		sleep_for_event(UNSURE_POLL_MS, true);
	}
}

/* Should a loss cancel the running statement?  Set by the hold table. */
void
zks_set_cancel_on_loss(bool cancel)
{
	pthread_mutex_lock(&zks_mutex);
	cancel_on_loss = cancel;
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * A loss cancel was sent, but the backend has stopped being cancellable by
 * one: take the SIGINT back, so that it cannot surface later as
 * PostgreSQL's own "canceling statement due to user request".  The
 * watchdog sent it while holding zks_mutex, before the backend, which took
 * the mutex after it, got here; the signal can only go to this thread
 * (every other one blocks it), and a pending signal is delivered as a
 * system call returns.  So after one short sleep the cancel is either
 * pending, and cleared here, or was already turned into an ERROR.
 */
static void
take_back_loss_cancel(void)
{
	pg_usleep(1000L);
	/* A timeout that fired meanwhile keeps the cancel, which names it. */
	if (!get_timeout_indicator(STATEMENT_TIMEOUT, false) &&
		!get_timeout_indicator(LOCK_TIMEOUT, false))
		QueryCancelPending = false;
}

/*
 * The backend starts (true) or ends (false) a statement that a loss may
 * cancel.  Ending one returns whether a loss cancel was sent for it that
 * did not reach it: the caller raises the loss's error instead.
 */
bool
zks_set_running(bool running)
{
	bool		sent;

	pthread_mutex_lock(&zks_mutex);
	statement_running = running;
	sent = !running && loss_cancel_sent;
	if (sent)
		loss_cancel_sent = false;
	pthread_mutex_unlock(&zks_mutex);
	if (sent)
		take_back_loss_cancel();
	return sent;
}

/*
 * The transaction starts (true) or has ended (false) its commit checks; no
 * loss cancel is sent meanwhile.  Starting returns whether one was sent
 * before and did not reach a statement: the commit checks then find the
 * session lost.
 */
bool
zks_set_committing(bool is_committing)
{
	bool		sent;

	pthread_mutex_lock(&zks_mutex);
	committing = is_committing;
	if (!is_committing)
		pthread_cond_signal(&watchdog_cond);	/* a lease may be due */
	sent = is_committing && loss_cancel_sent;
	if (sent)
		loss_cancel_sent = false;
	pthread_mutex_unlock(&zks_mutex);
	if (sent)
		take_back_loss_cancel();
	return sent;
}

/*
 * Was the last query cancel sent by the watchdog because of a loss?  Clears
 * the answer.  Called from the backend only.
 */
bool
zks_take_loss_cancel(void)
{
	bool		sent;

	pthread_mutex_lock(&zks_mutex);
	sent = loss_cancel_sent;
	loss_cancel_sent = false;
	pthread_mutex_unlock(&zks_mutex);
	return sent;
}

/* A heartbeat read in flight; freed by its completion. */
typedef struct Heartbeat
{
	struct timespec sent_at;
	uint64		generation;
} Heartbeat;

static void
heartbeat_done(int rc, const struct Stat *stat, const void *data)
{
	Heartbeat  *beat = (Heartbeat *) data;

	pthread_mutex_lock(&zks_mutex);
	if (beat->generation == handle_generation)
	{
		zks_note_heard_locked(&beat->sent_at, false, rc);
		heartbeat_in_flight = false;
		pthread_cond_signal(&watchdog_cond);
	}
	pthread_mutex_unlock(&zks_mutex);
	free(beat);
}

/*
 * Send a heartbeat: the cheapest read the server answers.  Called by the
 * watchdog with zks_mutex held; the library is called without it.
 */
static void
send_heartbeat_locked(const struct timespec *now)
{
	Heartbeat  *beat = malloc(sizeof(Heartbeat));
	zhandle_t  *handle = zks_zh;
	int			rc;

	if (beat == NULL || handle == NULL)
	{
		free(beat);
		return;
	}
	beat->sent_at = *now;
	beat->generation = handle_generation;
	heartbeat_in_flight = true;
	last_heartbeat = *now;
	pthread_mutex_unlock(&zks_mutex);
	rc = zoo_aexists(handle, "/", 0, heartbeat_done, beat);
	pthread_mutex_lock(&zks_mutex);
	if (rc != ZOK)
	{
		/* Try again at the next turn; see janitor_send (zk_janitor.c) about the leak. */
		heartbeat_in_flight = false;
		if (zks_refused_outright(rc))
			free(beat);
	}
}

static struct timespec
plus_ms(const struct timespec *t, int64 ms)
{
	struct timespec r = *t;

	r.tv_sec += ms / 1000;
	r.tv_nsec += (long) (ms % 1000) * 1000000;
	if (r.tv_nsec >= 1000000000)
	{
		r.tv_sec++;
		r.tv_nsec -= 1000000000;
	}
	return r;
}

/* Milliseconds on the monotonic clock, which leases are measured on. */
int64
zks_monotonic_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (int64) now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/*
 * Arm the lease: the session is to be given up at deadline_ms
 * (zks_monotonic_ms), for a hold leased for length_ms; a negative
 * deadline_ms disarms it.  The hold table calls this whenever its earliest
 * leased hold changes.
 */
void
zks_set_lease(int64 deadline_ms, int length_ms)
{
	pthread_mutex_lock(&zks_mutex);
	lease_armed = deadline_ms >= 0;
	if (lease_armed)
	{
		lease_deadline.tv_sec = deadline_ms / 1000;
		lease_deadline.tv_nsec = (long) (deadline_ms % 1000) * 1000000;
		lease_length_ms = length_ms;
	}
	pthread_cond_signal(&watchdog_cond);
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * Why the session was lost, as a sentence for an error's detail: its lease
 * ran out, or it expired or was cut off.
 */
const char *
zks_loss_reason(void)
{
	static char reason[160];
	bool		lease;
	int			length;
	int			timeout;

	pthread_mutex_lock(&zks_mutex);
	lease = lease_ran_out;
	length = lease_length_ms;
	timeout = negotiated_timeout;
	pthread_mutex_unlock(&zks_mutex);
	if (lease)
		snprintf(reason, sizeof(reason),
				 _("A lock was held past its lease of %d ms (zklock.lease), so zklock gave the session up."),
				 length);
	else if (timeout > 0)
		snprintf(reason, sizeof(reason),
				 _("The session expired or was cut off for longer than its timeout of %d ms."),
				 timeout);
	else
		snprintf(reason, sizeof(reason), "%s",
				 _("The session expired or was cut off for longer than its timeout."));
	return reason;
}

static void *
watchdog_main(void *arg)
{
	pthread_mutex_lock(&zks_mutex);
	while (!watchdog_stop)
	{
		struct timespec now;
		struct timespec until;
		struct timespec beat_due;

		clock_gettime(CLOCK_MONOTONIC, &now);
		/*
		 * A lease never runs out during a commit: the commit checks passed
		 * while it held, and the nodes must stay until the commit is
		 * visible.  zks_set_committing(false) wakes us after it.
		 */
		if (lease_armed && !later(&lease_deadline, &now) && !declared_lost &&
			!committing)
		{
			lease_armed = false;
			lease_ran_out = true;
			declared_lost = true;
		}
		if (lost_locked())
		{
			if (!loss_acted_on)
			{
				zhandle_t  *handle = zks_zh;

				loss_acted_on = true;
				zkj_release_held_locked();
				if (cancel_on_loss && statement_running && !committing)
				{
					/* Sent under the mutex: see take_back_loss_cancel. */
					loss_cancel_sent = true;
					kill(getpid(), SIGINT);
				}
				zks_wake_backend();

				/*
				 * A lease that ran out leaves the session connected: its
				 * nodes must go now, not when the backend next looks.
				 */
				if (lease_ran_out && handle != NULL)
				{
					pthread_mutex_unlock(&zks_mutex);
					zkj_kick(handle);
					pthread_mutex_lock(&zks_mutex);
					/* A stop may have been asked meanwhile: look again. */
					continue;
				}
			}
			show_state_locked();
			pthread_cond_wait(&watchdog_cond, &zks_mutex);
			continue;
		}
		if (!ever_connected || negotiated_timeout <= 0)
		{
			show_state_locked();
			pthread_cond_wait(&watchdog_cond, &zks_mutex);
			continue;
		}
		/*
		 * Keep hearing from the server at least every quarter timeout, and
		 * send no more often than that, even when a send fails.
		 */
		beat_due = later(&last_heartbeat, &last_heard) ? last_heartbeat : last_heard;
		beat_due = plus_ms(&beat_due, negotiated_timeout / 4);
		if (conn_state == ZOO_CONNECTED_STATE && !heartbeat_in_flight &&
			!later(&beat_due, &now))
		{
			send_heartbeat_locked(&now);
			continue;
		}
		/* Wake when the loss would be due, the next heartbeat, or the lease. */
		until = plus_ms(&last_heard, negotiated_timeout + 1);
		if (conn_state == ZOO_CONNECTED_STATE && !heartbeat_in_flight &&
			later(&until, &beat_due))
			until = beat_due;
		if (lease_armed && !committing && later(&until, &lease_deadline))
			until = lease_deadline;
		show_state_locked();
		pthread_cond_timedwait(&watchdog_cond, &zks_mutex, &until);
	}
	pthread_mutex_unlock(&zks_mutex);
	return NULL;
}

/* How long ago, in ms, was the leader last heard from? */
static int64
ms_since_leader_heard(void)
{
	struct timespec now;
	int64		ms;

	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&zks_mutex);
	ms = ms_since(&last_leader_heard, &now);
	pthread_mutex_unlock(&zks_mutex);
	return ms;
}

/* Send a sync and wait for it until deadline; false if unanswered. */
static bool
sync_with_leader(TimestampTz deadline, int *rc)
{
	ZkRequest  *sync = zks_sync("/");
	bool		answered;

	PG_TRY();
	{
		answered = zks_await(sync, deadline);
	}
	PG_CATCH();
	{
		zks_release_request(sync);
		PG_RE_THROW();
	}
	PG_END_TRY();
	*rc = answered ? sync->rc : ZOPERATIONTIMEOUT;
	zks_release_request(sync);
	return answered;
}

/*
 * Before COMMIT of a transaction holding zklocks: make sure the session is
 * connected and was recently confirmed by the leader, so it outlives the
 * commit.  A follower cut off from its leader still answers reads while
 * the leader expires the session; a write or sync sent within the last
 * third of the timeout T and answered proves otherwise, else syncs are
 * sent until one is answered within a third of T of being sent.  Either
 * way the session outlives the check by two thirds of T.  If that takes T
 * in all, the session may be gone: it is declared lost.  Returns true if
 * the session is fine.
 */
bool
zks_confirm_contact(void)
{
	TimestampTz give_up = 0;

	for (;;)
	{
		int			timeout = zks_negotiated_timeout();
		bool		answered;
		int			rc;

		if (!zks_wait_while_unsure())
			return false;
		if (ms_since_leader_heard() <= timeout / 3)
			return true;
		if (give_up == 0)
			give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  timeout);
		else if (GetCurrentTimestamp() >= give_up)
		{
			pthread_mutex_lock(&zks_mutex);
			declared_lost = true;
			pthread_cond_signal(&watchdog_cond);
			pthread_mutex_unlock(&zks_mutex);
			return false;
		}

		answered = sync_with_leader(give_up, &rc);
		if (answered && server_answered(rc) &&
			ms_since_leader_heard() <= timeout / 3)
			return zks_state() == ZKS_CONNECTED;
		if (answered && !server_answered(rc) && !zks_is_retryable(rc))
			zks_report_error(rc, ZKS_SYNC, "/");
	}
}

/*
 * The backend's wait: until ready(arg) holds, or the deadline passes
 * (false).  A wait that watches the session raises an ERROR once it is
 * lost, and wakes at least once a second to notice one cut off too long;
 * it looks at the session before it services interrupts, so a loss that
 * the watchdog also answers with a cancel ends the wait with the loss's
 * own ERROR.
 */
static bool
await_until(bool (*ready) (const void *arg), const void *arg,
			TimestampTz deadline, bool watch_session, uint32 wait_event)
{
	for (;;)
	{
		long		timeout;

		if (watch_session)
			check_session_alive();
		CHECK_FOR_INTERRUPTS();
		if (ready(arg))
			return true;
		timeout = ms_until(deadline);
		if (timeout == 0)
			return false;
		if (watch_session && (timeout < 0 || timeout > SESSION_CHECK_MS))
			timeout = SESSION_CHECK_MS;
		sleep_for(wait_event, timeout, false);
	}
}

static bool
request_done(const void *arg)
{
	const ZkRequest *req = arg;
	bool		done;

	pthread_mutex_lock(&zks_mutex);
	done = req->done;
	pthread_mutex_unlock(&zks_mutex);
	return done;
}

/*
 * Wait for a reply.  Returns false if the deadline (0: none) passes first.
 * A reply always comes: the library fails pending requests with a
 * connection loss when the connection drops.
 */
bool
zks_await(ZkRequest *req, TimestampTz deadline)
{
	return await_until(request_done, req, deadline, false,
					   request_wait_event);
}

uint64
zks_watch_generation(void)
{
	uint64		generation;

	pthread_mutex_lock(&zks_mutex);
	generation = watch_generation;
	pthread_mutex_unlock(&zks_mutex);
	return generation;
}

static bool
watch_fired(const void *arg)
{
	return zks_watch_generation() != *(const uint64 *) arg;
}

/*
 * Wait for any watch or session event after the given generation.  Returns
 * false if the deadline passes first; raises an ERROR if the session is
 * lost meanwhile.
 */
bool
zks_await_watch(uint64 generation, TimestampTz deadline)
{
	return await_until(watch_fired, &generation, deadline, true,
					   lock_wait_event);
}

static bool
connected(const void *arg)
{
	bool		is_connected;

	pthread_mutex_lock(&zks_mutex);
	is_connected = (conn_state == ZOO_CONNECTED_STATE);
	pthread_mutex_unlock(&zks_mutex);
	return is_connected;
}

/* Wait until the session is connected.  False if the deadline passes. */
bool
zks_await_connected(TimestampTz deadline)
{
	return await_until(connected, NULL, deadline, true, request_wait_event);
}

/*
 * Wait, without servicing interrupts, until every janitor task has been
 * answered or is waiting for a reconnect, or timeout_ms passes.  Used where
 * the caller must not be interrupted: error cleanup and transaction end.
 */
void
zks_settle(int timeout_ms)
{
	TimestampTz deadline;

	if (zks_zh == NULL)
		return;
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	for (;;)
	{
		bool		busy;
		long		timeout;

		pthread_mutex_lock(&zks_mutex);
		busy = zkj_busy_locked();
		pthread_mutex_unlock(&zks_mutex);
		timeout = ms_until(deadline);
		if (!busy || timeout == 0)
			return;
		sleep_for_event(timeout, false);
	}
}

/*
 * Close the session, and let handles still closing finish first: the
 * process must not exit while library threads are inside OpenSSL.  Each
 * ends within its handshake's time limit.
 */
static void
close_at_exit(int code, Datum arg)
{
	zks_close();
	pthread_mutex_lock(&zks_mutex);
	while (closers_running > 0)
		pthread_cond_wait(&closers_done, &zks_mutex);
	pthread_mutex_unlock(&zks_mutex);
}

static void
prepare_backend_resources(void)
{
	if (wake_fd < 0)
	{
		wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (wake_fd < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("could not create eventfd: %m")));
	}
#if PG_VERSION_NUM >= 170000
	/* Named wait events, registered here and not in a callback that must not fail. */
	if (lock_wait_event == PG_WAIT_EXTENSION)
	{
		lock_wait_event = WaitEventExtensionNew("ZkLockWait");
		request_wait_event = WaitEventExtensionNew("ZkRequest");
	}
#endif
	if (wait_set == NULL)
	{
		/* Kept only once complete: a partial set would never see wake_fd. */
#if PG_VERSION_NUM >= 170000
		/* Owned by no resource owner: it lives as long as the backend. */
		WaitEventSet *set = CreateWaitEventSet(NULL, 3);
#else
		WaitEventSet *set = CreateWaitEventSet(zk_memory(), 3);
#endif

		PG_TRY();
		{
			AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch,
							  NULL);
			/* A single-user backend has no postmaster to watch. */
			if (IsUnderPostmaster)
				AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET,
								  NULL, NULL);
			AddWaitEventToSet(set, WL_SOCKET_READABLE, wake_fd, NULL, NULL);
		}
		PG_CATCH();
		{
			FreeWaitEventSet(set);
			PG_RE_THROW();
		}
		PG_END_TRY();
		wait_set = set;
	}
	if (!exit_callback_registered)
	{
		pthread_condattr_t attr;

		/* The watchdog measures the cut-off on the monotonic clock. */
		pthread_condattr_init(&attr);
		pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
		pthread_cond_init(&watchdog_cond, &attr);
		pthread_condattr_destroy(&attr);

		on_proc_exit(close_at_exit, (Datum) 0);
		exit_callback_registered = true;
	}
}

bool
zks_is_open(void)
{
	return zks_zh != NULL;
}

int64
zks_session_id(void)
{
	return session_id;
}

/* Does the open session speak TLS? */
bool
zks_uses_tls(void)
{
	return zks_zh != NULL && handle_uses_tls;
}

/* The session password, for fault tests that expire the session. */
void
zks_session_password(char passwd[16])
{
	memcpy(passwd, zoo_client_id(zks_zh)->passwd, 16);
}

/*
 * Making a handle resolves the host names, which can take long (a slow or
 * unreachable DNS server).  It happens on a thread of its own, started with
 * every signal blocked since the library's threads inherit its mask, while
 * the backend waits for it as it waits for a reply: interruptible and
 * bounded by zklock.connect_timeout.  If the backend gives up first, the
 * thread closes the handle it made and frees everything itself.
 */
typedef struct Opener
{
	char	   *hosts;
	char	   *tls;			/* "ca,cert,key[,password]", or NULL */
	int			timeout;
	uint64		generation;
	zhandle_t  *handle;			/* the result, once done */
	int			error;			/* errno if the handle could not be made */
	bool		done;
	bool		abandoned;		/* the backend no longer waits for it */
} Opener;

static void
opener_free(Opener *opener)
{
	free(opener->hosts);
	if (opener->tls)
	{
		explicit_bzero(opener->tls, strlen(opener->tls));
		free(opener->tls);
	}
	free(opener);
}

static void *
opener_main(void *arg)
{
	Opener	   *opener = arg;
	zhandle_t  *handle;
	int			error;
	bool		abandoned;

#ifdef HAVE_OPENSSL_H
	if (opener->tls)
	{
		/* The TLS variant takes no log callback: set it at once. */
		handle = zookeeper_init_ssl(opener->hosts, opener->tls, session_watcher,
									opener->timeout, NULL,
									generation_context(opener->generation), 0);
		error = errno;
		if (handle != NULL)
			zoo_set_log_callback(handle, zkcl_log);
	}
	else
#endif
	{
		handle = zookeeper_init2(opener->hosts, session_watcher,
								 opener->timeout, NULL,
								 generation_context(opener->generation), 0,
								 zkcl_log);
		error = errno;
	}

	/*
	 * By default the library resolves the host names again on every turn of
	 * its I/O loop, which costs more CPU than the lock itself.  Once a minute
	 * is plenty; it still resolves at once after a connection loss.
	 */
	if (handle != NULL)
		zoo_set_servers_resolution_delay(handle, HOST_RESOLUTION_DELAY_MS);

	pthread_mutex_lock(&zks_mutex);
	abandoned = opener->abandoned;
	opener->handle = handle;
	opener->error = error;
	opener->done = true;
	pthread_mutex_unlock(&zks_mutex);

	if (!abandoned)
		zks_wake_backend();
	else
	{
		if (handle != NULL)
			zookeeper_close(handle);
		opener_free(opener);
	}
	return NULL;
}

/* Start a thread with every signal blocked, detached unless thread is given. */
static bool
start_thread(pthread_t *thread, void *(*main) (void *), void *arg)
{
	sigset_t	all_signals;
	sigset_t	saved_signals;
	pthread_t	detached;
	int			rc;

	sigfillset(&all_signals);
	pthread_sigmask(SIG_SETMASK, &all_signals, &saved_signals);
	rc = pthread_create(thread ? thread : &detached, NULL, main, arg);
	if (rc == 0 && thread == NULL)
		pthread_detach(detached);
	pthread_sigmask(SIG_SETMASK, &saved_signals, NULL);
	errno = rc;
	return rc == 0;
}

static bool
opener_done(Opener *opener)
{
	bool		done;

	pthread_mutex_lock(&zks_mutex);
	done = opener->done;
	pthread_mutex_unlock(&zks_mutex);
	return done;
}

/*
 * Stop waiting for the opener: leave it to finish and clean up alone, and
 * have its handle's events ignored; or, if it finished just now, close
 * what it made.
 */
static void
give_up_opener(Opener *opener)
{
	bool		done;

	pthread_mutex_lock(&zks_mutex);
	done = opener->done;
	opener->abandoned = !done;
	handle_generation++;
	pthread_mutex_unlock(&zks_mutex);
	if (done)
	{
		if (opener->handle != NULL)
			zookeeper_close(opener->handle);
		opener_free(opener);
	}
}

/*
 * Wait for the opener until the deadline.  Returns the handle, or NULL with
 * errno set (ETIMEDOUT at the deadline).
 */
static zhandle_t *
await_opener(Opener *opener, TimestampTz deadline)
{
	zhandle_t  *handle;
	int			error;

	PG_TRY();
	{
		while (!opener_done(opener))
		{
			long		timeout = ms_until(deadline);

			if (timeout == 0)
				break;
			sleep_for_event(timeout, true);
		}
	}
	PG_CATCH();
	{
		give_up_opener(opener);
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (!opener_done(opener))
	{
		give_up_opener(opener);
		errno = ETIMEDOUT;
		return NULL;
	}
	handle = opener->handle;
	error = opener->error;
	opener_free(opener);
	errno = error;
	return handle;
}

/* Make a new handle for zklock.hosts; ERROR if that fails. */
static void
open_handle(TimestampTz deadline)
{
	char	   *tls = zkset_tls_argument();
	Opener	   *opener = calloc(1, sizeof(Opener));
	zhandle_t  *handle = NULL;
	int			save_errno;

	if (opener == NULL || (opener->hosts = strdup(zkset_hosts())) == NULL)
	{
		free(opener);
		free(tls);
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	}
	opener->tls = tls;
	handle_uses_tls = tls != NULL;
	zkcl_forget_tls_failure();
	opener->timeout = zkset_session_timeout();
	zoo_set_debug_level((ZooLogLevel) zkset_client_log_level());

	pthread_mutex_lock(&zks_mutex);
	conn_state = 0;
	session_expired = false;
	auth_failed = false;
	ever_connected = false;
	loss_acted_on = false;
	declared_lost = false;
	lease_armed = false;
	lease_ran_out = false;
	heartbeat_in_flight = false;
	memset(&last_heartbeat, 0, sizeof(last_heartbeat));
	memset(&last_heard, 0, sizeof(last_heard));
	memset(&last_leader_heard, 0, sizeof(last_leader_heard));
	clock_gettime(CLOCK_MONOTONIC, &connecting_since);
	opener->generation = ++handle_generation;
	pthread_mutex_unlock(&zks_mutex);

	if (!start_thread(NULL, opener_main, opener))
		opener_free(opener);
	else
		handle = await_opener(opener, deadline);
	if (handle != NULL)
	{
		zks_zh = handle;
		if (start_thread(&watchdog_thread, watchdog_main, NULL))
		{
			watchdog_running = true;
			return;
		}
	}
	save_errno = errno;
	zks_close();
	if (save_errno == ETIMEDOUT)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("could not resolve the ZooKeeper hosts \"%s\" within %d ms",
						zkset_hosts(), zklock_connect_timeout),
				 errhint("Check the host names in zklock.hosts and the name service.")));
	errno = save_errno;
	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("could not start a ZooKeeper session for \"%s\": %m",
					zkset_hosts()),
			 errhint("Check the connect string in zklock.hosts.")));
}

/*
 * Open the session if there is none, and wait until it is connected.  The
 * handle stays open if the wait for the connection is interrupted, and the
 * next call goes on waiting for it.
 */
void
zks_open(void)
{
	TimestampTz deadline;

	if (zkset_hosts()[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("zklock.hosts is not set"),
				 errhint("Set zklock.hosts to the ZooKeeper connect string, for example \"zk1:2181,zk2:2181,zk3:2181\", in postgresql.conf.")));
	if (zks_zh != NULL && session_id != 0 && !zks_is_lost())
		return;

	prepare_backend_resources();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	if (zks_zh == NULL)
	{
		open_handle(deadline);
		zkset_remember_opened();
		session_id = 0;
		zkset_authenticate();
	}

	if (!zks_await_connected(deadline))
	{
		char	   *hosts = pstrdup(zkset_opened_hosts());
		char		failure[ZKCL_TLS_FAILURE_SIZE] = "";

		if (handle_uses_tls)
			zkcl_tls_failure(failure, sizeof(failure));
		zks_close();
		if (failure[0] != '\0')
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not connect to ZooKeeper at \"%s\" over TLS within %d ms",
							hosts, zklock_connect_timeout),
					 errdetail("The TLS handshake failed: %s", failure),
					 errhint("Check that zklock.tls_ca holds the CA that signed the servers' certificates, that the servers trust the CA of zklock.tls_cert, and that zklock.hosts names their TLS ports.")));
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("could not connect to ZooKeeper at \"%s\" within %d ms",
						hosts, zklock_connect_timeout),
				 errhint("Check that the ensemble is running and reachable, or raise zklock.connect_timeout.")));
	}
	session_id = zoo_client_id(zks_zh)->client_id;
	/* Shown at once, not when the watchdog next sleeps. */
	pthread_mutex_lock(&zks_mutex);
	show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * The library's state while a TLS handshake runs; its header does not
 * declare it.
 */
#define SSL_CONNECTING_STATE	7

static void *
closer_main(void *arg)
{
	zookeeper_close((zhandle_t *) arg);
	pthread_mutex_lock(&zks_mutex);
	closers_running--;
	pthread_cond_broadcast(&closers_done);
	pthread_mutex_unlock(&zks_mutex);
	return NULL;
}

/*
 * Close the session.  The server deletes our ephemeral nodes at once.  Never
 * called from a library thread: zookeeper_close joins them.
 */
void
zks_close(void)
{
	zhandle_t  *handle = zks_zh;

	if (watchdog_running)
	{
		pthread_mutex_lock(&zks_mutex);
		watchdog_stop = true;
		pthread_cond_signal(&watchdog_cond);
		pthread_mutex_unlock(&zks_mutex);
		pthread_join(watchdog_thread, NULL);
		watchdog_stop = false;
		watchdog_running = false;
	}
	if (handle == NULL)
		return;
	zks_cancel_listing();
	pthread_mutex_lock(&zks_mutex);
	zks_zh = NULL;
	handle_generation++;
	zkj_clear_locked();
	show_state_locked();
	pthread_mutex_unlock(&zks_mutex);

	/*
	 * The library runs a TLS handshake in its I/O thread, and closing joins
	 * that thread: a server that took the connection but never answers
	 * would hold the backend until the handshake times out (a third of the
	 * session timeout, see scripts/build-zookeeper-tls).  No session exists
	 * yet then, so nothing is lost by closing on a thread of its own.
	 */
	if (zoo_state(handle) == SSL_CONNECTING_STATE)
	{
		pthread_mutex_lock(&zks_mutex);
		closers_running++;
		pthread_mutex_unlock(&zks_mutex);
		if (start_thread(NULL, closer_main, handle))
			handle = NULL;
		else
		{
			pthread_mutex_lock(&zks_mutex);
			closers_running--;
			pthread_mutex_unlock(&zks_mutex);
		}
	}
	if (handle != NULL)
		zookeeper_close(handle);
	session_id = 0;
}

/* The message of a request that failed, whole, for each operation. */
static const char *
failure_message(ZksOperation op)
{
	switch (op)
	{
		case ZKS_CREATE:
			return gettext_noop("could not create ZooKeeper node \"%s\": %s");
		case ZKS_LIST:
			return gettext_noop("could not list children of ZooKeeper node \"%s\": %s");
		case ZKS_CHECK:
			return gettext_noop("could not check ZooKeeper node \"%s\": %s");
		case ZKS_SYNC:
			return gettext_noop("could not sync ZooKeeper node \"%s\": %s");
		case ZKS_READ:
			return gettext_noop("could not read ZooKeeper node \"%s\": %s");
		case ZKS_WATCH:
			return gettext_noop("could not watch ZooKeeper node \"%s\": %s");
		case ZKS_SET_DATA:
			return gettext_noop("could not set the data of ZooKeeper node \"%s\": %s");
	}
	return gettext_noop("could not use ZooKeeper node \"%s\": %s");
}

void
zks_report_error(int rc, ZksOperation op, const char *path)
{
	if (rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("zklock lost its ZooKeeper session"),
				 errdetail("ZooKeeper answered \"%s\" to a request on node \"%s\".",
						   zerror(rc), path)));
	ereport(ERROR,
			(errcode(rc == ZNOAUTH ? ERRCODE_INSUFFICIENT_PRIVILEGE :
					 ERRCODE_CONNECTION_FAILURE),
			 errmsg(failure_message(op), path, zerror(rc))));
}

/*
 * Did the library refuse a request before registering its completion?
 * Then none will come.  ZMARSHALLINGERROR is ambiguous: the library returns
 * it when the handle is closing (no completion) and when memory ran out
 * after the completion was registered (it comes, with an error, at the
 * next disconnect); callers must expect either.
 */
bool
zks_refused_outright(int rc)
{
	return rc == ZINVALIDSTATE || rc == ZBADARGUMENTS || rc == ZCLOSING;
}

static void
sync_unawaited(int rc, const char *value, const void *data)
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
	return zoo_async(handle, path, sync_unawaited, NULL);
}

/*
 * Declare the session lost, as the watchdog does at an expiry; for the
 * fault tests (zks_test_lose_after_grants).  Caller holds zks_mutex.
 */
void
zks_declare_lost_locked(void)
{
	declared_lost = true;
	pthread_cond_signal(&watchdog_cond);
}
