/*-------------------------------------------------------------------------
 *
 * zk_session.c
 *	  The backend's ZooKeeper session and the rules for living with the
 *	  client library's threads.
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
 * Deleting the nodes a backend gives up is the janitor's job (zk_janitor.c);
 * noticing a lost session while the backend is busy elsewhere is the loss
 * watchdog's, below.
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
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "zk_names.h"
#include "zk_session.h"
#include "zk_session_int.h"

char	   *zklock_hosts = NULL;
int			zklock_session_timeout = 10000;
int			zklock_connect_timeout = 5000;
int			zklock_client_log_level = ZOO_LOG_LEVEL_ERROR;
bool		zklock_synchronous_release = false;
char	   *zklock_auth = NULL;
bool		zklock_world_readable = false;

/*
 * State shared with the library's threads.  Everything below is protected by
 * zks_mutex (zk_session_int.h); the backend alone writes zks_zh.
 */
pthread_mutex_t zks_mutex = PTHREAD_MUTEX_INITIALIZER;
zhandle_t  *zks_zh = NULL;
static int	conn_state = 0;
static bool session_expired = false;
static bool auth_failed = false;
static bool ever_connected = false;
static struct timespec disconnected_at;
static int	negotiated_timeout = 0;
static uint64 watch_generation = 0;
static uint64 connect_count = 0;

/*
 * A frozen process (SIGSTOP, a paused VM) hears nothing from ZooKeeper, and
 * on waking the library still says "connected" until its I/O thread looks;
 * the session may have expired meanwhile.  The watchdog turns every quarter
 * session timeout, and a gap of half a timeout between turns counts as a
 * freeze, so holds are verified again as after a reconnect.
 */
static struct timespec last_turn;
static uint64 freeze_count = 0;

/*
 * A waiter's next listing of its queue, sent by the watcher itself when the
 * node the waiter watches changes, so the read that decides the handoff
 * does not first wait for the backend to wake up.  Armed by
 * zks_watch_then_list; claimed by the watcher, which moves the request to
 * listing_sent and owns the rest; taken by the backend (zks_take_listing).
 */
typedef struct PendingListing
{
	char	   *watched;
	char	   *parent;
	ZkRequest  *listing;
} PendingListing;

static PendingListing *listing_armed = NULL;
static ZkRequest *listing_sent = NULL;

/*
 * The loss watchdog: a plain thread that notices when the session has been
 * cut off for as long as its timeout (no library event says so) or has
 * expired, and then, if a transaction holds zklocks, cancels the running
 * statement with SIGINT so the critical section stops at once.  Also
 * protected by zks_mutex.
 */
static pthread_cond_t watchdog_cond;
static pthread_t watchdog_thread;
static bool watchdog_running = false;
static bool watchdog_stop = false;
static bool loss_acted_on = false;
static bool declared_lost = false;	/* sticky until a new handle is opened */
static bool cancel_on_loss = false;
static bool loss_cancel_sent = false;

/* Backend-only state. */
static int	wake_fd = -1;
static WaitEventSet *wait_set = NULL;
static bool exit_callback_registered = false;
static char *opened_hosts = NULL;
static int	opened_session_timeout = 0;
static char *opened_auth = NULL;
static bool opened_world_readable = false;

/*
 * The ACL for the nodes this session creates: open to all without
 * zklock.auth; with it, everything for the authenticated creator and, if
 * zklock.world_readable, reading for anyone.
 */
static struct ACL creator_acl_entries[2];
static struct ACL_vector node_acl;
static int64 session_id = 0;

/*
 * The client library's own messages go to standard error, which the server
 * log collects.  While an ensemble is down the library reports every
 * failed reconnect, many times a second, so let a few lines through per
 * interval and count the rest.
 */
#define HOST_RESOLUTION_DELAY_MS	60000

#define CLIENT_LOG_INTERVAL_SEC	10
#define CLIENT_LOG_LINES		5

static pthread_mutex_t client_log_mutex = PTHREAD_MUTEX_INITIALIZER;
static time_t client_log_interval_start = 0;
static int	client_log_lines = 0;
static int	client_log_suppressed = 0;

static void
client_log(const char *message)
{
	time_t		now = time(NULL);

	pthread_mutex_lock(&client_log_mutex);
	if (now - client_log_interval_start >= CLIENT_LOG_INTERVAL_SEC)
	{
		if (client_log_suppressed > 0)
			fprintf(stderr, "zklock: %d more ZooKeeper client messages suppressed\n",
					client_log_suppressed);
		client_log_interval_start = now;
		client_log_lines = 0;
		client_log_suppressed = 0;
	}
	if (client_log_lines < CLIENT_LOG_LINES)
	{
		client_log_lines++;
		fprintf(stderr, "zklock: %s\n", message);
	}
	else
		client_log_suppressed++;
	pthread_mutex_unlock(&client_log_mutex);
}

/* Wake the backend.  Safe on any thread: a plain system call. */
void
zks_wake_backend(void)
{
	uint64		one = 1;
	ssize_t		rc pg_attribute_unused();

	rc = write(wake_fd, &one, sizeof(one));
}

static void
drain_wake_fd(void)
{
	uint64		count;

	while (read(wake_fd, &count, sizeof(count)) > 0)
		;
}

static void send_claimed_listing(zhandle_t *handle, PendingListing *claimed);

/*
 * The watcher for session events and for the watches the recipe sets.  A
 * watch carries no context: any watch firing bumps a generation counter and
 * the waiting backend re-reads the queue, so a stale watch from an earlier
 * wait costs one harmless re-read.  A watch on the node a waiter watches
 * now also sends the waiter's listing (see PendingListing).
 */
static void
session_watcher(zhandle_t *handle, int type, int state, const char *path,
				void *context)
{
	bool		reconnected = false;
	int			timeout = zoo_recv_timeout(handle);
	PendingListing *claimed = NULL;

	pthread_mutex_lock(&zks_mutex);
	if (type != ZOO_SESSION_EVENT && listing_armed != NULL && path != NULL &&
		strcmp(path, listing_armed->watched) == 0)
	{
		claimed = listing_armed;
		listing_armed = NULL;
		listing_sent = claimed->listing;
	}
	if (type == ZOO_SESSION_EVENT)
	{
		conn_state = state;
		if (state == ZOO_CONNECTED_STATE)
		{
			ever_connected = true;
			reconnected = true;
			negotiated_timeout = timeout;
			connect_count++;
		}
		else if (state == ZOO_EXPIRED_SESSION_STATE)
		{
			session_expired = true;
			janitor_clear_locked();
		}
		else if (state == ZOO_AUTH_FAILED_STATE)
			auth_failed = true;
		else
			clock_gettime(CLOCK_MONOTONIC, &disconnected_at);
	}
	/* After a reconnect a waiter re-checks the queue too. */
	watch_generation++;
	pthread_cond_signal(&watchdog_cond);
	pthread_mutex_unlock(&zks_mutex);

	if (claimed)
		send_claimed_listing(handle, claimed);
	if (reconnected)
		janitor_kick(handle);
	zks_wake_backend();
}

/* Completion callbacks: copy the result out, then mark the request done. */

static void
request_free(ZkRequest *req)
{
	int			i;

	free(req->path);
	free(req->data);
	for (i = 0; i < req->nchildren; i++)
		free(req->children[i]);
	free(req->children);
	free(req);
}

static void
request_finish(ZkRequest *req, int rc)
{
	bool		abandoned;

	pthread_mutex_lock(&zks_mutex);
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

static void
children_done(int rc, const struct String_vector *strings, const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

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
request_new(void)
{
	ZkRequest  *req = calloc(1, sizeof(ZkRequest));

	if (req == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	return req;
}

/* Report a request the library did not queue. */
static ZkRequest *
request_queued(ZkRequest *req, int rc, const char *what, const char *path)
{
	if (rc != ZOK)
	{
		if (zks_refused_outright(rc))
			free(req);
		else
			zks_release_request(req);	/* its completion frees it */
		zks_report_error(rc, what, path);
	}
	return req;
}

ZkRequest *
zks_create(const char *path, const char *data, int datalen, int mode)
{
	ZkRequest  *req = request_new();

	return request_queued(req,
						  zoo_acreate2(zks_zh, path, data, datalen,
									   &node_acl, mode,
									   create_done, req),
						  "create", path);
}

ZkRequest *
zks_get_children(const char *path)
{
	ZkRequest  *req = request_new();

	return request_queued(req,
						  zoo_aget_children(zks_zh, path, 0, children_done, req),
						  "list children of", path);
}

/*
 * List children as the leader has them: the listing is queued behind a
 * sync, so it reflects every write the session made, even one whose reply
 * was lost on a previous connection.
 */
ZkRequest *
zks_get_children_synced(const char *path)
{
	ZkRequest  *req = request_new();
	int			rc = zks_send_sync(zks_zh, path);

	if (rc == ZOK)
		rc = zoo_aget_children(zks_zh, path, 0, children_done, req);
	return request_queued(req, rc, "list children of", path);
}

ZkRequest *
zks_exists(const char *path)
{
	ZkRequest  *req = request_new();

	return request_queued(req,
						  zoo_aexists(zks_zh, path, 0, stat_done, req),
						  "check", path);
}

ZkRequest *
zks_get_data(const char *path)
{
	ZkRequest  *req = request_new();

	return request_queued(req,
						  zoo_aget(zks_zh, path, 0, data_done, req),
						  "read", path);
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
	ZkRequest  *req = request_new();

	return request_queued(req,
						  zoo_awget(zks_zh, path, session_watcher, NULL,
									data_done, req),
						  "watch", path);
}

static void
pending_listing_free(PendingListing *pending)
{
	free(pending->watched);
	free(pending->parent);
	free(pending);
}

/* On the completion thread, the mutex not held: the library is called. */
static void
send_claimed_listing(zhandle_t *handle, PendingListing *claimed)
{
	int			rc = zoo_aget_children(handle, claimed->parent, 0,
									   children_done, claimed->listing);

	/* Unless refused outright, the library completes the request. */
	if (rc != ZOK && zks_refused_outright(rc))
		request_finish(claimed->listing, rc);
	pending_listing_free(claimed);
}

/*
 * Watch a node as zks_watch_data does, and have the watcher list parent as
 * soon as the node changes or goes.  The backend picks that listing up with
 * zks_take_listing once the watch generation moves.
 */
ZkRequest *
zks_watch_then_list(const char *watched, const char *parent)
{
	PendingListing *pending = malloc(sizeof(PendingListing));

	if (pending != NULL)
	{
		pending->watched = strdup(watched);
		pending->parent = strdup(parent);
		pending->listing = calloc(1, sizeof(ZkRequest));
		if (!pending->watched || !pending->parent || !pending->listing)
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
	return zks_watch_data(watched);
}

/*
 * The listing the watcher sent (in flight, or finished), or NULL if it sent
 * none; either way nothing stays armed.
 */
ZkRequest *
zks_take_listing(void)
{
	PendingListing *unsent;
	ZkRequest  *sent;

	pthread_mutex_lock(&zks_mutex);
	unsent = listing_armed;
	listing_armed = NULL;
	sent = listing_sent;
	listing_sent = NULL;
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
	zks_release_request(zks_take_listing());
}

/*
 * Free a request, or, if its reply has not come, leave it for the completion
 * thread to free.
 */
void
zks_release_request(ZkRequest *req)
{
	bool		done;

	if (req == NULL)
		return;
	pthread_mutex_lock(&zks_mutex);
	done = req->done;
	if (!done)
		req->abandoned = true;
	pthread_mutex_unlock(&zks_mutex);
	if (done)
		request_free(req);
}

static long
ms_until(TimestampTz deadline)
{
	if (deadline == 0)
		return -1;
	return TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
}

/*
 * Sleep until the library has something for us, the latch is set, or
 * timeout_ms (-1: no limit) passes.  Interrupts are serviced unless the
 * caller is cleaning up and must not be stopped.
 */
static void
sleep_for_event(long timeout_ms, bool interruptible)
{
	WaitEvent	event;

	(void) WaitEventSetWait(wait_set, timeout_ms, &event, 1, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	drain_wake_fd();
	if (interruptible)
		CHECK_FOR_INTERRUPTS();
}

static int64
ms_since(const struct timespec *then, const struct timespec *now)
{
	return (int64) (now->tv_sec - then->tv_sec) * 1000 +
		(now->tv_nsec - then->tv_nsec) / 1000000;
}

/* A turn of the watchdog, or a look by the backend: notice a freeze. */
static void
note_turn_locked(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (negotiated_timeout > 0 && last_turn.tv_sec != 0 &&
		ms_since(&last_turn, &now) > negotiated_timeout / 2)
		freeze_count++;
	last_turn = now;
}

/*
 * Has the session been cut off for as long as its timeout?  The server has
 * then expired it, even though the library can only say so after it
 * reconnects, so our nodes must be taken as gone.
 */
static bool
cut_off_too_long_locked(void)
{
	struct timespec now;
	int64		elapsed_ms;

	if (conn_state == ZOO_CONNECTED_STATE || !ever_connected)
		return false;
	clock_gettime(CLOCK_MONOTONIC, &now);
	elapsed_ms = ms_since(&disconnected_at, &now);
	return elapsed_ms >= negotiated_timeout;
}

/*
 * Once lost, always lost: a session that comes back after we gave its
 * locks up (the ensemble cannot expire sessions while it has no quorum)
 * must not be taken as holding them again.
 */
static bool
lost_locked(void)
{
	if (session_expired || auth_failed || cut_off_too_long_locked())
		declared_lost = true;
	return declared_lost;
}

/*
 * Connected: our nodes are there.  Unsure: disconnected, but for less than
 * the session timeout, so they may be.  Lost: they are gone.
 */
ZksState
zks_state(void)
{
	ZksState	state;

	if (zks_zh == NULL)
		return ZKS_LOST;
	pthread_mutex_lock(&zks_mutex);
	if (lost_locked())
		state = ZKS_LOST;
	else if (conn_state == ZOO_CONNECTED_STATE)
		state = ZKS_CONNECTED;
	else
		state = ZKS_UNSURE;
	pthread_mutex_unlock(&zks_mutex);
	return state;
}

/* Has this session ended or become unusable, so its locks are gone? */
bool
zks_is_lost(void)
{
	return zks_zh != NULL && zks_state() == ZKS_LOST;
}

/*
 * Changes whenever our nodes may have gone unseen: on a reconnect, and when
 * the process was frozen for half a session timeout.
 */
uint64
zks_contact_epoch(void)
{
	uint64		epoch;

	pthread_mutex_lock(&zks_mutex);
	note_turn_locked();
	epoch = connect_count + freeze_count;
	pthread_mutex_unlock(&zks_mutex);
	return epoch;
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
				 errdetail("The session expired or was cut off for longer than its timeout of %d ms.",
						   negotiated_timeout)));
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
		sleep_for_event(100, true);
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

static void *
watchdog_main(void *arg)
{
	pthread_mutex_lock(&zks_mutex);
	while (!watchdog_stop)
	{
		note_turn_locked();
		if (lost_locked())
		{
			if (!loss_acted_on)
			{
				loss_acted_on = true;
				janitor_wake_dormant_locked();
				if (cancel_on_loss)
				{
					loss_cancel_sent = true;
					kill(getpid(), SIGINT);
				}
				zks_wake_backend();
			}
			pthread_cond_wait(&watchdog_cond, &zks_mutex);
		}
		else if (ever_connected && conn_state != ZOO_CONNECTED_STATE)
		{
			/* Sleep until the cut-off would reach the session timeout. */
			struct timespec until = disconnected_at;

			until.tv_sec += negotiated_timeout / 1000;
			until.tv_nsec += (long) (negotiated_timeout % 1000) * 1000000 + 1000000;
			if (until.tv_nsec >= 1000000000)
			{
				until.tv_sec++;
				until.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&watchdog_cond, &zks_mutex, &until);
		}
		else if (negotiated_timeout > 0)
		{
			struct timespec until;

			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_nsec += (long) (negotiated_timeout / 4) * 1000000;
			until.tv_sec += until.tv_nsec / 1000000000;
			until.tv_nsec %= 1000000000;
			pthread_cond_timedwait(&watchdog_cond, &zks_mutex, &until);
		}
		else
			pthread_cond_wait(&watchdog_cond, &zks_mutex);
	}
	pthread_mutex_unlock(&zks_mutex);
	return NULL;
}

/*
 * Wait for a reply.  Returns false if the deadline (0: none) passes first.
 * A reply always comes: the library fails pending requests with a
 * connection loss when the connection drops.
 */
bool
zks_await(ZkRequest *req, TimestampTz deadline)
{
	for (;;)
	{
		bool		done;
		long		timeout;

		pthread_mutex_lock(&zks_mutex);
		done = req->done;
		pthread_mutex_unlock(&zks_mutex);
		if (done)
			return true;
		timeout = ms_until(deadline);
		if (timeout == 0)
			return false;
		sleep_for_event(timeout, true);
	}
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

/*
 * Wait for any watch or session event after the given generation.  Returns
 * false if the deadline passes first; raises an ERROR if the session is
 * lost meanwhile.
 */
bool
zks_await_watch(uint64 generation, TimestampTz deadline)
{
	for (;;)
	{
		long		timeout;

		check_session_alive();
		if (zks_watch_generation() != generation)
			return true;
		timeout = ms_until(deadline);
		if (timeout == 0)
			return false;
		/* Wake up in time to notice a session that is cut off too long. */
		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
		sleep_for_event(timeout, true);
	}
}

/* Wait until the session is connected.  False if the deadline passes. */
bool
zks_await_connected(TimestampTz deadline)
{
	for (;;)
	{
		bool		connected;
		long		timeout;

		check_session_alive();
		pthread_mutex_lock(&zks_mutex);
		connected = (conn_state == ZOO_CONNECTED_STATE);
		pthread_mutex_unlock(&zks_mutex);
		if (connected)
			return true;
		timeout = ms_until(deadline);
		if (timeout == 0)
			return false;
		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
		sleep_for_event(timeout, true);
	}
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
		busy = janitor_busy_locked();
		pthread_mutex_unlock(&zks_mutex);
		timeout = ms_until(deadline);
		if (!busy || timeout == 0)
			return;
		sleep_for_event(timeout, false);
	}
}

static void
auth_done(int rc, const void *data)
{
}

/*
 * Add the zklock.auth digest credentials to the new session; the library
 * sends them on every (re)connect.  Choose the ACL for our nodes to match.
 * The password goes nowhere else: not into messages, logs or node data.
 */
static void
authenticate(void)
{
	if (opened_auth[0] == '\0')
	{
		node_acl = ZOO_OPEN_ACL_UNSAFE;
		return;
	}
	creator_acl_entries[0].perms = ZOO_PERM_ALL;
	creator_acl_entries[0].id = ZOO_AUTH_IDS;
	creator_acl_entries[1].perms = ZOO_PERM_READ;
	creator_acl_entries[1].id = ZOO_ANYONE_ID_UNSAFE;
	node_acl.data = creator_acl_entries;
	node_acl.count = opened_world_readable ? 2 : 1;
	if (zoo_add_auth(zks_zh, "digest", opened_auth, strlen(opened_auth),
					 auth_done, NULL) != ZOK)
	{
		zks_close();
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
				 errmsg("could not add the zklock.auth credentials to the ZooKeeper session")));
	}
}

static void
close_at_exit(int code, Datum arg)
{
	zks_close();
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
	if (wait_set == NULL)
	{
		/* Kept only once complete: a partial set would never see wake_fd. */
		WaitEventSet *set = CreateWaitEventSet(TopMemoryContext, 3);

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

/* Would opening a session now use other settings than the open one? */
bool
zks_settings_changed(void)
{
	return zks_zh != NULL &&
		(strcmp(opened_hosts, zklock_hosts ? zklock_hosts : "") != 0 ||
		 strcmp(opened_auth, zklock_auth ? zklock_auth : "") != 0 ||
		 opened_world_readable != zklock_world_readable ||
		 opened_session_timeout != zklock_session_timeout);
}

int64
zks_session_id(void)
{
	return session_id;
}

/* The session password, for fault tests that expire the session. */
void
zks_session_password(char passwd[16])
{
	memcpy(passwd, zoo_client_id(zks_zh)->passwd, 16);
}

/*
 * Open the session if there is none, and wait until it is connected.  The
 * handle stays open if the wait is interrupted, and the next call goes on
 * waiting for it.
 */
void
zks_open(void)
{
	TimestampTz deadline;

	if (zklock_hosts == NULL || zklock_hosts[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("zklock.hosts is not set"),
				 errhint("Set zklock.hosts to the ZooKeeper connect string, for example \"zk1:2181,zk2:2181,zk3:2181\", in postgresql.conf.")));

	prepare_backend_resources();

	if (zks_zh == NULL)
	{
		sigset_t	all_signals;
		sigset_t	saved_signals;
		char	   *hosts = MemoryContextStrdup(TopMemoryContext, zklock_hosts);

		zoo_set_debug_level((ZooLogLevel) zklock_client_log_level);

		pthread_mutex_lock(&zks_mutex);
		conn_state = 0;
		session_expired = false;
		auth_failed = false;
		ever_connected = false;
		loss_acted_on = false;
		declared_lost = false;
		loss_cancel_sent = false;
		last_turn.tv_sec = 0;
		pthread_mutex_unlock(&zks_mutex);

		/* Threads inherit this mask: keep our signals off them. */
		sigfillset(&all_signals);
		pthread_sigmask(SIG_SETMASK, &all_signals, &saved_signals);
		zks_zh = zookeeper_init2(hosts, session_watcher, zklock_session_timeout,
								 NULL, NULL, 0, client_log);

		/*
		 * By default the library resolves the host names again on every turn
		 * of its I/O loop, which costs more CPU than the lock itself.  Once a
		 * minute is plenty; it still resolves at once after a connection
		 * loss.
		 */
		if (zks_zh != NULL)
			zoo_set_servers_resolution_delay(zks_zh, HOST_RESOLUTION_DELAY_MS);
		if (zks_zh != NULL)
			watchdog_running = (pthread_create(&watchdog_thread, NULL,
											   watchdog_main, NULL) == 0);
		pthread_sigmask(SIG_SETMASK, &saved_signals, NULL);

		if (zks_zh == NULL || !watchdog_running)
		{
			int			save_errno = errno;

			zks_close();
			pfree(hosts);
			errno = save_errno;
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not start a ZooKeeper session for \"%s\": %m",
							zklock_hosts),
					 errhint("Check the connect string in zklock.hosts.")));
		}
		if (opened_hosts)
			pfree(opened_hosts);
		opened_hosts = hosts;
		opened_session_timeout = zklock_session_timeout;
		if (opened_auth)
			pfree(opened_auth);
		opened_auth = MemoryContextStrdup(TopMemoryContext,
										  zklock_auth ? zklock_auth : "");
		opened_world_readable = zklock_world_readable;
		session_id = 0;
		authenticate();
	}

	if (session_id != 0 && !zks_is_lost())
		return;

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	if (!zks_await_connected(deadline))
	{
		char	   *hosts = pstrdup(opened_hosts);

		zks_close();
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("could not connect to ZooKeeper at \"%s\" within %d ms",
						hosts, zklock_connect_timeout),
				 errhint("Check that the ensemble is running and reachable, or raise zklock.connect_timeout.")));
	}
	session_id = zoo_client_id(zks_zh)->client_id;
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
	janitor_clear_locked();
	pthread_mutex_unlock(&zks_mutex);
	zookeeper_close(handle);
	session_id = 0;
}

void
zks_report_error(int rc, const char *what, const char *path)
{
	if (rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("zklock lost its ZooKeeper session"),
				 errdetail("Could not %s \"%s\": %s.", what, path, zerror(rc))));
	ereport(ERROR,
			(errcode(rc == ZNOAUTH ? ERRCODE_INSUFFICIENT_PRIVILEGE :
					 ERRCODE_CONNECTION_FAILURE),
			 errmsg("could not %s ZooKeeper node \"%s\": %s",
					what, path, zerror(rc))));
}
