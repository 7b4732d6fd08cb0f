/*-------------------------------------------------------------------------
 *
 * zk_wait.c
 *	  How the backend waits for ZooKeeper: for a reply, a watch, a
 *	  connection, or the janitor to settle, on a WaitEventSet of its latch,
 *	  postmaster death and the eventfd that the library's threads write to
 *	  (zkln_wake_backend, zk_link.c), so that cancel, statement_timeout,
 *	  lock_timeout and termination all reach a waiting backend.  And the
 *	  wait before COMMIT for the leader to confirm the session
 *	  (zks_confirm_contact).
 *
 * Everything here runs on the backend's thread.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "base/zk_memory.h"
#include "session/zk_session.h"
#include "session/zk_session_int.h"

/* The backend's own; wake_fd is zk_link.c's eventfd, which it reads. */
static int	wake_fd = -1;
static uint32 lock_wait_event = PG_WAIT_EXTENSION;	/* in a lock's queue */
static uint32 request_wait_event = PG_WAIT_EXTENSION;	/* for ZooKeeper */
static WaitEventSet *wait_set = NULL;

/* A wait that watches the session looks at it at least this often. */
#define SESSION_CHECK_MS			1000

/* How often a wait for an unsure session to settle looks again. */
#define UNSURE_POLL_MS				100

/* One read empties an eventfd: it returns the count and sets it to zero. */
static void
drain_wake_fd(void)
{
	uint64		count;
	ssize_t		rc pg_attribute_unused();

	rc = read(wake_fd, &count, sizeof(count));
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

	if (timeout_ms > ZKW_MAX_SLEEP_MS)
		timeout_ms = ZKW_MAX_SLEEP_MS;
	(void) WaitEventSetWait(wait_set, timeout_ms, &event, 1, wait_event);
	ResetLatch(MyLatch);
	drain_wake_fd();

	/*
	 * What the client library said meanwhile: a wait that watches the
	 * session wakes at least once a second.
	 */
	zks_log_client_messages();
	if (interruptible)
		CHECK_FOR_INTERRUPTS();
}

/* Sleep waiting for ZooKeeper; see sleep_for. */
void
zkw_sleep(long timeout_ms, bool interruptible)
{
	sleep_for(request_wait_event, timeout_ms, interruptible);
}

static void
check_session_alive(void)
{
	bool		rejected;

	pthread_mutex_lock(&zks_mutex);
	rejected = zks_link.auth_failed;
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
		zkw_sleep(UNSURE_POLL_MS, true);
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
		timeout = zkw_ms_until(deadline);
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
	generation = zks_link.watch_generation;
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
	is_connected = (zks_link.conn_state == ZOO_CONNECTED_STATE);
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
		timeout = zkw_ms_until(deadline);
		if (!busy || timeout == 0)
			return;
		zkw_sleep(timeout, false);
	}
}

static bool
kept_decided(const void *arg)
{
	return !zks_kept_deciding((const char *) arg);
}

/*
 * Wait until the listing that decides whether a node under parent is kept
 * has answered, until deadline (0: the session's checks bound it); false
 * if it did not.
 */
bool
zks_await_kept_decided(const char *parent, TimestampTz deadline)
{
	return await_until(kept_decided, parent, deadline, true,
					   request_wait_event);
}

/*
 * Make what the waits need, once per backend: the eventfd, the named wait
 * events, and the set that waits for them.
 */
void
zkw_prepare(void)
{
	wake_fd = zkln_wake_fd();
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
}

/* Send a sync and wait for it until deadline; false if unanswered. */
static bool
sync_with_leader(TimestampTz deadline, int *rc)
{
	ZkRequest  *sync = zkrq_sync("/");
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
 * sixth of the timeout T and answered proves otherwise, else syncs are
 * sent until one is answered within a sixth of T of being sent.  If that
 * takes T in all, the session may be gone: it is declared lost.  Returns
 * true if the session is fine.
 *
 * The margin.  The leader does not refresh a session when it handles a
 * request that a follower forwards; it refreshes the sessions a follower
 * reports in its answer to the leader's ping, sent every tickTime / 2.  So
 * if the follower is cut off from the leader just after it forwarded our
 * sync, the leader's last refresh may come from a contact that many pings
 * older than the sync: the contact before the last reported ping, at most
 * a quarter of T before it (the heartbeat), which is at most tickTime / 2
 * before the sync.  The session then outlives the check by at least
 * T - T/6 - T/4 - tickTime/2, and since ZooKeeper makes T at least
 * 2 tickTime, at least T/3; connected to the leader itself, at least 5T/6.
 */
#define LEADER_CONTACT_WINDOW(timeout)	((timeout) / 6)

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
		if (zkct_ms_since_leader_heard() <= LEADER_CONTACT_WINDOW(timeout))
			return true;
		if (give_up == 0)
			give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  timeout);
		else if (GetCurrentTimestamp() >= give_up)
		{
			pthread_mutex_lock(&zks_mutex);
			zkct_declare_lost_locked();
			pthread_mutex_unlock(&zks_mutex);
			return false;
		}

		answered = sync_with_leader(give_up, &rc);
		if (answered && zkct_server_answered(rc) &&
			zkct_ms_since_leader_heard() <= LEADER_CONTACT_WINDOW(timeout))
			return zks_state() == ZKS_CONNECTED;
		if (answered && !zkct_server_answered(rc) && !zks_is_retryable(rc))
			zks_report_error(rc, ZKS_SYNC, "/");
	}
}
