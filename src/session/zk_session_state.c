/*-------------------------------------------------------------------------
 *
 * zk_session_state.c
 *	  The session's state as the backend and the server see it (connected,
 *	  unsure, lost, or closed), its id, and parking it while it holds
 *	  nothing, so that the watchdog closes it once it has been idle for
 *	  zklock.idle_session_timeout.
 *
 * The backend parks the session when a transaction ends with no lock node
 * of its own in use (zks_set_idle), and takes it back before it next
 * sends anything (zkst_unpark_ready, zkst_unpark).  While it is parked
 * the backend only reads its state, and the watchdog, the one thread that is awake then, closes
 * the handle once the idle time has passed (zks_close_idle_locked).  The
 * backend then finds it closed (absorb_idle_close), as if it had closed it
 * itself, and its next lock opens a new session, as the first one did.
 *
 * What the watchdog calls here (the _locked functions) runs under
 * zks_mutex and uses nothing of PostgreSQL but the atomics that show the
 * state; the rest is the backend's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <time.h>

#include "port/atomics.h"

#include "session/zk_session.h"
#include "session/zk_session_int.h"

/*
 * The idle close.  parked, idle_since and idle_close_ms are written by the
 * backend, under zks_mutex; idle_close by the watchdog as it closes, and
 * by the backend once it has taken notice, under zks_mutex too.  The
 * backend alone writes parked_here, its own copy of parked, and reads it
 * without the mutex: the watchdog closes nothing that is not parked.
 */
typedef enum IdleClose
{
	IDLE_OPEN,					/* not closed for idleness */
	IDLE_CLOSING,				/* the watchdog is closing the handle */
	IDLE_CLOSED					/* ... and has closed it */
} IdleClose;

static bool parked = false;
static bool parked_here = false;
static struct timespec idle_since;
static int	idle_close_ms = 0;
static IdleClose idle_close = IDLE_OPEN;
static pthread_cond_t idle_close_done = PTHREAD_COND_INITIALIZER;
static bool pinned = false;		/* a parked handle is read by the backend */

static void absorb_idle_close(void);
static bool pin_handle(void);
static void unpin_handle(void);

/* The open session's id, once it connected; 0 otherwise. */
static int64 session_id = 0;
/* The server the session is connected to, or NULL. */
const char *
zks_current_server(void)
{
	const char *server = NULL;

	if (!pin_handle())
		return NULL;
	if (zks_state() == ZKS_CONNECTED)
		server = zoo_get_current_server(zks_zh);
	unpin_handle();
	return server;
}

/*
 * Connected: our nodes are there.  Unsure: disconnected, but heard from
 * within the session timeout, so they may be.  Lost: they are gone.
 */
static ZksState
state_locked(void)
{
	if (zkct_lost_locked())
		return ZKS_LOST;
	if (zks_link.conn_state == ZOO_CONNECTED_STATE)
		return ZKS_CONNECTED;
	return ZKS_UNSURE;
}

ZksState
zks_state(void)
{
	ZksState	state;

	absorb_idle_close();
	if (zks_zh == NULL)
		return ZKS_LOST;
	pthread_mutex_lock(&zks_mutex);
	state = state_locked();
	pthread_mutex_unlock(&zks_mutex);
	return state;
}

/*
 * The session's state as shown: closed, also while the watchdog closes it
 * for idleness, or open in a ZksState.  Caller holds zks_mutex.
 */
static uint32
shown_locked(void)
{
	return zks_zh == NULL || idle_close != IDLE_OPEN ? ZKS_SHOWN_CLOSED :
		ZKS_SHOWN_OPEN + state_locked();
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
void
zks_show_state_locked(void)
{
	uint32		now_shown;

	if (shown_state == NULL)
		return;
	now_shown = shown_locked();
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
	zks_show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * The session's state as zks_show_state_in shows it (ZKS_SHOWN_CLOSED, or
 * ZKS_SHOWN_OPEN plus a ZksState), read at once, so that a session closed
 * meanwhile shows as closed, not lost.
 */
uint32
zks_shown_state(void)
{
	uint32		shown;

	absorb_idle_close();
	pthread_mutex_lock(&zks_mutex);
	shown = shown_locked();
	pthread_mutex_unlock(&zks_mutex);
	return shown;
}

/* Has this session ended or become unusable, so its locks are gone? */
bool
zks_is_lost(void)
{
	return zks_is_open() && zks_state() == ZKS_LOST;
}

bool
zks_is_open(void)
{
	absorb_idle_close();
	return zks_zh != NULL;
}

int64
zks_session_id(void)
{
	return session_id;
}

/* The session connected with this id, or (0) is closed. */
void
zkst_set_session_id(int64 id)
{
	session_id = id;
}

/*
 * The session password, for fault tests that expire the session; false if
 * no session is open.
 */
bool
zks_session_password(char passwd[16])
{
	if (!pin_handle())
		return false;
	memcpy(passwd, zoo_client_id(zks_zh)->passwd, 16);
	unpin_handle();
	return true;
}

/*
 * A transaction ended with no lock node of this backend's in use: park the
 * session, so that the watchdog closes it once it has been idle for
 * zklock.idle_session_timeout.  A session parked already keeps the time it
 * was parked.  Never raises an ERROR nor allocates: transaction end calls
 * this.
 */
void
zks_set_idle(void)
{
	int			timeout = zkset_idle_session_timeout();
	struct timespec due;

	if (parked_here || zks_zh == NULL || timeout <= 0)
		return;
	pthread_mutex_lock(&zks_mutex);
	parked = parked_here = true;
	clock_gettime(CLOCK_MONOTONIC, &idle_since);
	idle_close_ms = timeout;
	due = idle_since;
	due.tv_sec += timeout / 1000;
	due.tv_nsec += (long) (timeout % 1000) * 1000000;
	if (due.tv_nsec >= 1000000000)
	{
		due.tv_sec++;
		due.tv_nsec -= 1000000000;
	}
	zkln_wake_watchdog_by_locked(&due);
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * The watchdog closed the parked session: finish the close here, as
 * zks_close would have.  Caller holds zks_mutex, which this releases.
 * Neither raises an ERROR nor allocates, as zks_close may not.
 */
static void
forget_idle_closed_locked(void)
{
	idle_close = IDLE_OPEN;
	parked = parked_here = false;
	zks_zh = NULL;
	zkj_clear_locked();
	zkk_clear_locked();
	zks_show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
	/* The watchdog has left its loop: this only joins it. */
	zkln_stop_watchdog();
	session_id = 0;
}

/*
 * Wait out an idle close under way; if the watchdog closed the handle,
 * finish the close here and return true, with the mutex released.  Caller
 * holds zks_mutex.
 */
static bool
idle_closed_locked(void)
{
	while (idle_close == IDLE_CLOSING)
		pthread_cond_wait(&idle_close_done, &zks_mutex);
	if (idle_close != IDLE_CLOSED)
		return false;
	forget_idle_closed_locked();
	return true;
}

/*
 * If the watchdog closed the parked session, or is closing it, take notice:
 * wait for it to finish, and find the session closed.  Costs nothing while
 * the session is not parked.
 */
static void
absorb_idle_close(void)
{
	if (!parked_here)
		return;
	pthread_mutex_lock(&zks_mutex);
	if (!idle_closed_locked())
		pthread_mutex_unlock(&zks_mutex);
}

/*
 * The backend is about to use the session: it is no longer idle, and the
 * watchdog leaves it alone until the next transaction ends with nothing
 * held.  A session the watchdog closed first is found closed.
 */
static void
unpark(void)
{
	if (!parked_here)
		return;
	pthread_mutex_lock(&zks_mutex);
	if (idle_closed_locked())
		return;
	parked = parked_here = false;
	pthread_mutex_unlock(&zks_mutex);
}

/* unpark, for zks_close; zks_open's is inline in zkst_unpark_ready. */
void
zkst_unpark(void)
{
	unpark();
}

/*
 * Unpark the session before using it, as zks_open does on every lock call:
 * true if it is ready, made and connected once and not lost.  One call,
 * as this is on every lock's path.
 */
bool
zkst_unpark_ready(void)
{
	unpark();
	return zks_zh != NULL && session_id != 0 && !zks_is_lost();
}

/*
 * Keep the watchdog from closing a parked handle while the backend reads
 * it without using the session (zks_current_server): the session stays
 * parked, and its idle time runs on.  False if there is no handle.
 */
static bool
pin_handle(void)
{
	if (!parked_here)
		return zks_zh != NULL;
	pthread_mutex_lock(&zks_mutex);
	if (idle_closed_locked())
		return false;
	pinned = true;
	pthread_mutex_unlock(&zks_mutex);
	return true;
}

/* The backend alone writes pinned, so it may read it without the mutex. */
static void
unpin_handle(void)
{
	if (!pinned)
		return;
	pthread_mutex_lock(&zks_mutex);
	pinned = false;
	zkln_wake_watchdog_locked();
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * For the watchdog: when the parked session was parked, in *since, and how
 * long after that it is to be closed, in *ms; false if it is not parked, is
 * pinned, or must wait.  A session that may
 * still own nodes given up waits while it is cut off (closing could not
 * reach the server, which would keep them until the session expires) and
 * while the janitor has deletes under way (closing would drop them): a
 * reconnect, or the janitor's last answer, wakes the watchdog.  A session
 * lost, or never made, is closed all the same.  Caller holds zks_mutex.
 */
bool
zks_idle_since_locked(struct timespec *since, int *ms)
{
	if (!parked || pinned || idle_close != IDLE_OPEN || zks_zh == NULL)
		return false;
	if (zks_link.ever_connected && state_locked() != ZKS_LOST &&
		(zks_link.conn_state != ZOO_CONNECTED_STATE || zkj_deleting_any_locked()))
		return false;
	*since = idle_since;
	*ms = idle_close_ms;
	return true;
}

/*
 * For the watchdog, once the idle time has passed: close the parked
 * session's handle.  Its events and completions are ignored from now on,
 * as for any handle closed.  The mutex is released while the library
 * closes; the backend, should it need the session meanwhile, waits for the
 * close to finish (unpark).  Caller holds zks_mutex.
 */
void
zks_close_idle_locked(void)
{
	zhandle_t  *handle = zks_zh;

	idle_close = IDLE_CLOSING;
	zks_link.generation++;
	zkk_clear_locked();			/* kept nodes go with the session */
	zks_show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
	zookeeper_close(handle);
	pthread_mutex_lock(&zks_mutex);
	idle_close = IDLE_CLOSED;
	pthread_cond_broadcast(&idle_close_done);
}
