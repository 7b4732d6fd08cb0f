/*-------------------------------------------------------------------------
 *
 * zk_contact.c
 *	  The session's contact clock: when the server, and the leader, last
 *	  heard from us, and whether the session is lost.
 *
 * The server expires a session one session timeout T after it last heard
 * from the client, while the library reports a disconnection only two
 * thirds of T after the last reply.  So zklock keeps its own clock: the
 * send time of the newest request the server answered (a reconnect counts
 * as an answer).  The watchdog (zk_watchdog.c) keeps it going with
 * heartbeats, and the session is taken as lost once T passes without an
 * answer: never later than the server could expire it.  The leader's own
 * clock serves the leader sync before COMMIT (zk_wait.c).
 *
 * Completions on the library's thread, the watchdog and the backend all
 * move or read the clock, under zks_mutex (the _locked functions expect it
 * held); nothing here uses PostgreSQL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <time.h>

#include "session/zk_session.h"
#include "session/zk_session_int.h"

/* The contact clock, on CLOCK_MONOTONIC; zks_mutex. */
static struct timespec connecting_since;	/* since the last disconnection */
static struct timespec last_heard;
static struct timespec last_leader_heard;

/*
 * Whether the session was declared lost (by the watchdog, the leader sync
 * or a fault test); sticky until a new handle is opened.
 */
static bool declared_lost = false;

static int64
ms_since(const struct timespec *then, const struct timespec *now)
{
	return (int64) (now->tv_sec - then->tv_sec) * 1000 +
		(now->tv_nsec - then->tv_nsec) / 1000000;
}

/*
 * A request sent at sent_at was answered: the server heard from us then.
 * Caller holds zks_mutex.
 */
void
zkct_note_heard_locked(const struct timespec *sent_at, bool via_leader, int rc)
{
	if (!zkct_server_answered(rc))
		return;
	if (zkct_later(sent_at, &last_heard))
		last_heard = *sent_at;
	if (via_leader && zkct_later(sent_at, &last_leader_heard))
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
 * must not be taken as holding them again.  Caller holds zks_mutex.
 */
bool
zkct_lost_locked(void)
{
	if (zks_link.expired || zks_link.auth_failed || unheard_too_long_locked())
		declared_lost = true;
	return declared_lost;
}

/*
 * Was the session declared lost, without looking at the clock?  For the
 * watchdog's lease, which gives up only a session not lost already.
 * Caller holds zks_mutex.
 */
bool
zkct_declared_lost_locked(void)
{
	return declared_lost;
}

/*
 * Declare the session lost, as the watchdog does at an expiry, and have the
 * watchdog act on it.  Caller holds zks_mutex.
 */
void
zkct_declare_lost_locked(void)
{
	declared_lost = true;
	zkln_wake_watchdog_locked();
}

/* When the server last heard from us.  Caller holds zks_mutex. */
struct timespec
zkct_last_heard_locked(void)
{
	return last_heard;
}

/* How long ago, in ms, was the leader last heard from? */
int64
zkct_ms_since_leader_heard(void)
{
	struct timespec now;
	int64		ms;

	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&zks_mutex);
	ms = ms_since(&last_leader_heard, &now);
	pthread_mutex_unlock(&zks_mutex);
	return ms;
}

/*
 * A new handle is being made: its clock starts from nothing, its
 * connecting from now, and nothing is lost yet.  Caller holds zks_mutex.
 */
void
zkct_reset_locked(void)
{
	declared_lost = false;
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
zkct_note_connected_locked(void)
{
	if (zkct_later(&connecting_since, &last_heard))
		last_heard = connecting_since;
	if (zkct_later(&connecting_since, &last_leader_heard))
		last_leader_heard = connecting_since;
}

/* The session is not connected (any more).  Caller holds zks_mutex. */
void
zkct_note_disconnected_locked(void)
{
	clock_gettime(CLOCK_MONOTONIC, &connecting_since);
}
