/*-------------------------------------------------------------------------
 *
 * zk_watchdog.c
 *	  The session's loss watchdog: heartbeats that keep the contact clock
 *	  (zk_contact.c) going, declaring the session lost when it may have
 *	  expired, cancelling the statement that works under a lost lock, and
 *	  the lease (zklock.lease).
 *
 * The watchdog sends a cheap read whenever a quarter of the session
 * timeout T passes without an answer, so that the server keeps hearing
 * from us, and acts on a loss as soon as T passes without one.
 *
 * The watchdog is a plain thread, started with the handle and stopped
 * before it is closed (its thread handle is in zk_link.c).  It is also the
 * thread that closes a session that has held nothing for
 * zklock.idle_session_timeout (zk_session_state.c), and ends once it has.
 * What it and the completions run here runs under zks_mutex and uses
 * nothing of PostgreSQL.  The backend's own are take_back_loss_cancel,
 * zks_loss_reason and zkwd_start; the functions it calls to set the flags
 * take the mutex themselves.
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

/* The heartbeats, on CLOCK_MONOTONIC; zks_mutex. */
static struct timespec last_heartbeat;	/* when one was last sent */
static bool heartbeat_in_flight = false;

/*
 * The loss watchdog notices when the session has gone unheard for its
 * timeout (no library event says so) or has expired, and then, if holds
 * that guard commits exist and a statement runs, cancels that statement
 * with SIGINT so the work under the lock stops at once (see zk_guard.c).
 * Whether it acted on the loss resets with a new handle; zks_mutex.
 */
static bool loss_acted_on = false;

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
		zkln_wake_watchdog_locked();	/* a lease may be due */
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
		zkct_note_heard_locked(&beat->sent_at, false, rc);
		heartbeat_in_flight = false;
		zkln_wake_watchdog_locked();
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
	zkln_wake_watchdog_locked();
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
	zkln_watchdog_sleep_locked(idle ? idle_due : NULL);
}

static void *
watchdog_main(void *arg)
{
	pthread_mutex_lock(&zks_mutex);
	while (!zkln_watchdog_stopping_locked())
	{
		struct timespec now;
		struct timespec until;
		struct timespec beat_due;
		struct timespec idle_due;
		struct timespec idle_since;
		struct timespec last_heard;
		struct timespec keep_due;
		int			idle_ms;
		bool		idle;
		bool		keeping;

		clock_gettime(CLOCK_MONOTONIC, &now);

		/*
		 * A session that has held nothing for zklock.idle_session_timeout
		 * is closed, lost or not; this thread's work for it is then done.
		 */
		idle = zks_idle_since_locked(&idle_since, &idle_ms);
		if (idle)
			idle_due = plus_ms(&idle_since, idle_ms);
		if (idle && !zkct_later(&idle_due, &now))
		{
			zks_close_idle_locked();
			break;
		}
		/*
		 * A lease never runs out during a commit: the commit checks passed
		 * while it held, and the nodes must stay until the commit is
		 * visible.  zks_set_committing(false) wakes us after it.
		 */
		if (lease_armed && !zkct_later(&lease_deadline, &now) &&
			!zkct_declared_lost_locked() && !committing)
		{
			lease_armed = false;
			lease_ran_out = true;
			zkct_declare_lost_locked();
		}
		if (zkct_lost_locked())
		{
			if (!loss_acted_on)
			{
				zhandle_t  *handle = zks_zh;

				loss_acted_on = true;
				zkj_release_held_locked();
				zkk_lost_locked();
				if (cancel_on_loss && statement_running && !committing)
				{
					/* Sent under the mutex: see take_back_loss_cancel. */
					loss_cancel_sent = true;
					kill(getpid(), SIGINT);
				}
				zkln_wake_backend();

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
		last_heard = zkct_last_heard_locked();
		beat_due = zkct_later(&last_heartbeat, &last_heard) ? last_heartbeat : last_heard;
		beat_due = plus_ms(&beat_due, zks_link.negotiated_timeout / 4);
		if (zks_link.conn_state == ZOO_CONNECTED_STATE && !heartbeat_in_flight &&
			!zkct_later(&beat_due, &now))
		{
			send_heartbeat_locked(&now);
			continue;
		}
		/* Nodes kept past zklock.keep_released go to the janitor. */
		if (zkk_give_up_due_locked(&now, &keep_due, &keeping))
		{
			zhandle_t  *handle = zks_zh;

			pthread_mutex_unlock(&zks_mutex);
			if (handle != NULL)
				zkj_kick(handle);
			pthread_mutex_lock(&zks_mutex);
			continue;
		}
		/*
		 * Wake when the loss would be due, the next heartbeat, the lease, or
		 * a kept node's time.
		 */
		until = plus_ms(&last_heard, zks_link.negotiated_timeout + 1);
		if (zks_link.conn_state == ZOO_CONNECTED_STATE && !heartbeat_in_flight &&
			zkct_later(&until, &beat_due))
			until = beat_due;
		if (lease_armed && !committing && zkct_later(&until, &lease_deadline))
			until = lease_deadline;
		if (idle && zkct_later(&until, &idle_due))
			until = idle_due;
		if (keeping && zkct_later(&until, &keep_due))
			until = keep_due;
		zks_show_state_locked();
		zkln_watchdog_sleep_locked(&until);
	}
	pthread_mutex_unlock(&zks_mutex);
	return NULL;
}

/*
 * A new handle is being made: the watchdog has not acted on a loss, no
 * lease is armed and no heartbeat sent.  Caller holds zks_mutex.
 */
void
zkwd_reset_locked(void)
{
	loss_acted_on = false;
	lease_armed = false;
	lease_ran_out = false;
	heartbeat_in_flight = false;
	memset(&last_heartbeat, 0, sizeof(last_heartbeat));
}

/* Start the watchdog for a handle just made; false, with errno, if not. */
bool
zkwd_start(void)
{
	return zkln_start_watchdog(watchdog_main);
}
