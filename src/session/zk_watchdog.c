/*-------------------------------------------------------------------------
 *
 * zk_watchdog.c
 *	  The session's contact clock and its loss watchdog: when the server
 *	  last heard from us, heartbeats to keep it hearing, declaring the
 *	  session lost when it may have expired, cancelling the statement that
 *	  works under a lost lock, the lease (zklock.lease), and the leader
 *	  sync that COMMIT asks for.
 *
 * Contact.  The server expires a session one session timeout T after it
 * last heard from the client, while the library reports a disconnection
 * only two thirds of T after the last reply.  So zklock keeps its own clock:
 * the send time of the newest request the server answered (a reconnect
 * counts as an answer).  The watchdog sends a cheap read whenever a
 * quarter of T passes without one, and declares the session lost when T
 * passes without an answer: never later than the server could expire it.
 * A read may be answered by a follower that has lost its leader, which
 * then keeps the client content until it gives up, while the leader
 * expires the session.  So COMMIT of a transaction holding zklocks also
 * asks for an answer from the leader (a sync) unless a write or sync was
 * answered within the last sixth of T (see zks_confirm_contact).
 *
 * The watchdog is a plain thread, started with the handle and stopped
 * before it is closed.  It is also the thread that closes a session that
 * has held nothing for zklock.idle_session_timeout (zk_session.c), and
 * ends once it has.  What it and the completions that move the clock
 * run here runs under zks_mutex and uses nothing of PostgreSQL.  The
 * backend's own are zks_confirm_contact, take_back_loss_cancel,
 * zks_loss_reason and zkwd_prepare, zkwd_start and zkwd_stop; the
 * functions it calls to set the flags take the mutex themselves.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "miscadmin.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "session/zk_session.h"
#include "session/zk_session_int.h"

/* The contact clock (see the header comment), on CLOCK_MONOTONIC; zks_mutex. */
static struct timespec connecting_since;	/* since the last disconnection */
static struct timespec last_heard;
static struct timespec last_leader_heard;
static struct timespec last_heartbeat;	/* when one was last sent */
static bool heartbeat_in_flight = false;

/*
 * The loss watchdog: a plain thread that keeps the contact clock going and
 * notices when the session has gone unheard for its timeout (no library
 * event says so) or has expired, and then, if holds that guard commits
 * exist and a statement runs, cancels that statement with SIGINT so the
 * work under the lock stops at once (see zk_guard.c).  The backend alone
 * starts and stops it (watchdog_thread, watchdog_running); the rest below
 * is protected by zks_mutex.
 */
static pthread_cond_t watchdog_cond;
static pthread_t watchdog_thread;
static bool watchdog_running = false;
static bool watchdog_stop = false;

/*
 * Whether the session was declared lost (by the watchdog, the leader sync
 * or a fault test), and whether the watchdog acted on it; both reset with
 * a new handle.
 */
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
zkwd_note_heard_locked(const struct timespec *sent_at, bool via_leader, int rc)
{
	if (!server_answered(rc))
		return;
	if (later(sent_at, &last_heard))
		last_heard = *sent_at;
	if (via_leader && later(sent_at, &last_leader_heard))
		last_leader_heard = *sent_at;
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

	if (!zks_link.ever_connected)
		return false;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return ms_since(&last_heard, &now) >= zks_link.negotiated_timeout;
}

/*
 * Once lost, always lost: a session that comes back after we gave its
 * locks up (the ensemble cannot expire sessions while it has no quorum)
 * must not be taken as holding them again.
 */
bool
zkwd_lost_locked(void)
{
	if (zks_link.expired || zks_link.auth_failed || unheard_too_long_locked())
		declared_lost = true;
	return declared_lost;
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
	if (beat->generation == zks_link.generation)
	{
		zkwd_note_heard_locked(&beat->sent_at, false, rc);
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
	beat->generation = zks_link.generation;
	heartbeat_in_flight = true;
	last_heartbeat = *now;
	pthread_mutex_unlock(&zks_mutex);
	rc = zoo_aexists(handle, "/", 0, heartbeat_done, beat);
	pthread_mutex_lock(&zks_mutex);
	if (rc != ZOK)
	{
		/* Try again at the next turn; see janitor_send (zk_janitor.c) about the leak. */
		heartbeat_in_flight = false;
		if (zkrq_refused_outright(rc))
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
 * ran out, the server refused to delete one of its nodes, or it expired or
 * was cut off.
 */
const char *
zks_loss_reason(void)
{
	static char reason[ZKL_NODE_MAX + 200];
	bool		lease;
	bool		refused;
	int			length;
	int			timeout;

	pthread_mutex_lock(&zks_mutex);
	lease = lease_ran_out;
	length = lease_length_ms;
	timeout = zks_link.negotiated_timeout;
	refused = !lease && zkj_refusal_locked(reason, sizeof(reason));
	pthread_mutex_unlock(&zks_mutex);
	if (refused)
		return reason;
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

/*
 * Sleep until woken, or until the parked session's idle close is due if it
 * is parked.  Caller holds zks_mutex.
 */
static void
sleep_locked(bool idle, const struct timespec *idle_due)
{
	zks_show_state_locked();
	if (idle)
		pthread_cond_timedwait(&watchdog_cond, &zks_mutex, idle_due);
	else
		pthread_cond_wait(&watchdog_cond, &zks_mutex);
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
		struct timespec idle_due;
		struct timespec idle_since;
		int			idle_ms;
		bool		idle;

		clock_gettime(CLOCK_MONOTONIC, &now);

		/*
		 * A session that has held nothing for zklock.idle_session_timeout
		 * is closed, lost or not; this thread's work for it is then done.
		 */
		idle = zks_idle_since_locked(&idle_since, &idle_ms);
		if (idle)
			idle_due = plus_ms(&idle_since, idle_ms);
		if (idle && !later(&idle_due, &now))
		{
			zks_close_idle_locked();
			break;
		}
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
		if (zkwd_lost_locked())
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
				zkw_wake_backend();

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
			sleep_locked(idle, &idle_due);
			continue;
		}
		if (!zks_link.ever_connected || zks_link.negotiated_timeout <= 0)
		{
			sleep_locked(idle, &idle_due);
			continue;
		}
		/*
		 * Keep hearing from the server at least every quarter timeout, and
		 * send no more often than that, even when a send fails.
		 */
		beat_due = later(&last_heartbeat, &last_heard) ? last_heartbeat : last_heard;
		beat_due = plus_ms(&beat_due, zks_link.negotiated_timeout / 4);
		if (zks_link.conn_state == ZOO_CONNECTED_STATE && !heartbeat_in_flight &&
			!later(&beat_due, &now))
		{
			send_heartbeat_locked(&now);
			continue;
		}
		/* Wake when the loss would be due, the next heartbeat, or the lease. */
		until = plus_ms(&last_heard, zks_link.negotiated_timeout + 1);
		if (zks_link.conn_state == ZOO_CONNECTED_STATE && !heartbeat_in_flight &&
			later(&until, &beat_due))
			until = beat_due;
		if (lease_armed && !committing && later(&until, &lease_deadline))
			until = lease_deadline;
		if (idle && later(&until, &idle_due))
			until = idle_due;
		zks_show_state_locked();
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
		if (ms_since_leader_heard() <= LEADER_CONTACT_WINDOW(timeout))
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
			ms_since_leader_heard() <= LEADER_CONTACT_WINDOW(timeout))
			return zks_state() == ZKS_CONNECTED;
		if (answered && !server_answered(rc) && !zks_is_retryable(rc))
			zks_report_error(rc, ZKS_SYNC, "/");
	}
}

/*
 * Once per backend: the watchdog's condition variable, which measures the
 * cut-off on the monotonic clock.
 */
void
zkwd_prepare(void)
{
	static bool prepared = false;
	pthread_condattr_t attr;

	if (prepared)
		return;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&watchdog_cond, &attr);
	pthread_condattr_destroy(&attr);
	prepared = true;
}

/*
 * A new handle is being made: its contact clock starts from nothing, its
 * connecting from now, and nothing is lost yet.  Caller holds zks_mutex.
 */
void
zkwd_reset_locked(void)
{
	loss_acted_on = false;
	declared_lost = false;
	lease_armed = false;
	lease_ran_out = false;
	heartbeat_in_flight = false;
	memset(&last_heartbeat, 0, sizeof(last_heartbeat));
	memset(&last_heard, 0, sizeof(last_heard));
	memset(&last_leader_heard, 0, sizeof(last_leader_heard));
	clock_gettime(CLOCK_MONOTONIC, &connecting_since);
}

/*
 * The session connected: the server renewed it to let us in, at some time
 * after we began connecting, which is all we know for sure; a heartbeat
 * follows at once and tells more.  Caller holds zks_mutex.
 */
void
zkwd_note_connected_locked(void)
{
	if (later(&connecting_since, &last_heard))
		last_heard = connecting_since;
	if (later(&connecting_since, &last_leader_heard))
		last_leader_heard = connecting_since;
}

/* The session is not connected (any more).  Caller holds zks_mutex. */
void
zkwd_note_disconnected_locked(void)
{
	clock_gettime(CLOCK_MONOTONIC, &connecting_since);
}

/* Have the watchdog look again: an event came.  Caller holds zks_mutex. */
void
zkwd_wake_locked(void)
{
	pthread_cond_signal(&watchdog_cond);
}

/* Start the watchdog for a handle just made; false, with errno, if not. */
bool
zkwd_start(void)
{
	watchdog_running = zks_start_thread(&watchdog_thread, watchdog_main, NULL);
	return watchdog_running;
}

/* Stop the watchdog, if it runs, and wait for it to end. */
void
zkwd_stop(void)
{
	if (!watchdog_running)
		return;
	pthread_mutex_lock(&zks_mutex);
	watchdog_stop = true;
	pthread_cond_signal(&watchdog_cond);
	pthread_mutex_unlock(&zks_mutex);
	pthread_join(watchdog_thread, NULL);
	watchdog_stop = false;
	watchdog_running = false;
}

/*
 * Declare the session lost, as the watchdog does at an expiry; for the
 * fault tests (zks_test_lose_after_grants).  Caller holds zks_mutex.
 */
void
zkwd_declare_lost_locked(void)
{
	declared_lost = true;
	pthread_cond_signal(&watchdog_cond);
}
