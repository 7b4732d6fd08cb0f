/*-------------------------------------------------------------------------
 *
 * zk_link.c
 *	  What the backend and the client library's threads reach each other
 *	  through: the session's mutex, its handle, what the library's events say
 *	  of the handle (ZksLink), the eventfd that wakes the backend, and the
 *	  condition and thread handle of the watchdog.
 *
 * The lowest file of the session: every other one shares this state, and
 * this file calls none of them, so each calls down into it.  What runs on
 * the library's threads here is a system call or a pthread call; the
 * backend alone makes the eventfd and starts and stops the watchdog.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "session/zk_session.h"
#include "session/zk_session_int.h"

/*
 * State shared with the library's threads.  Everything below is protected by
 * zks_mutex; the backend alone writes zks_zh.
 */
pthread_mutex_t zks_mutex = PTHREAD_MUTEX_INITIALIZER;
zhandle_t  *zks_zh = NULL;
ZksLink		zks_link;

/* The backend's own; the library's threads only write to it. */
static int	wake_fd = -1;

/*
 * The watchdog's wake-up, which every event, answer and change of what it
 * watches signals (zks_mutex), and its thread, which the backend alone
 * starts and stops.  watchdog_stop is read by the watchdog under the mutex.
 */
static pthread_cond_t watchdog_cond;
static pthread_t watchdog_thread;
static bool watchdog_running = false;
static bool watchdog_stop = false;

/* Whether the watchdog sleeps, and until when if it set a time; zks_mutex. */
static bool watchdog_sleeping = false;
static bool watchdog_until_set = false;
static struct timespec watchdog_until;

int
zks_negotiated_timeout(void)
{
	int			timeout;

	pthread_mutex_lock(&zks_mutex);
	timeout = zks_link.negotiated_timeout;
	pthread_mutex_unlock(&zks_mutex);
	return timeout;
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
	count = zks_link.connect_count;
	pthread_mutex_unlock(&zks_mutex);
	return count;
}

/* Start a thread with every signal blocked, detached unless thread is given. */
bool
zks_start_thread(pthread_t *thread, void *(*main) (void *), void *arg)
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

/*
 * The eventfd the library's threads wake the backend with, made on first
 * use; ERROR if it cannot be.  The backend waits for it and reads it
 * (zk_wait.c).
 */
int
zkln_wake_fd(void)
{
	if (wake_fd < 0)
	{
		wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (wake_fd < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("could not create eventfd: %m")));
	}
	return wake_fd;
}

/* Wake the backend if it waits; a plain system call, safe on any thread. */
void
zkln_wake_backend(void)
{
	uint64		one = 1;
	ssize_t		rc pg_attribute_unused();

	rc = write(wake_fd, &one, sizeof(one));
}

/*
 * Once per backend: the watchdog's condition variable, which measures the
 * cut-off on the monotonic clock.
 */
void
zkln_prepare_watchdog(void)
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

/* Have the watchdog look again.  Caller holds zks_mutex. */
void
zkln_wake_watchdog_locked(void)
{
	pthread_cond_signal(&watchdog_cond);
}

/*
 * For the watchdog: sleep until woken, or until the monotonic time until if
 * it is given.  Caller holds zks_mutex.
 */
void
zkln_watchdog_sleep_locked(const struct timespec *until)
{
	watchdog_sleeping = true;
	watchdog_until_set = until != NULL;
	if (until)
	{
		watchdog_until = *until;
		pthread_cond_timedwait(&watchdog_cond, &zks_mutex, until);
	}
	else
		pthread_cond_wait(&watchdog_cond, &zks_mutex);
	watchdog_sleeping = false;
}

/*
 * Have the watchdog look again by due (CLOCK_MONOTONIC) at the latest: a
 * new deadline.  It is woken only if it sleeps past due, so that a lock
 * cycle that sets a deadline each time costs no wake-up while the watchdog
 * is due to look before it anyway (it then sees the deadline).  Caller
 * holds zks_mutex.
 */
void
zkln_wake_watchdog_by_locked(const struct timespec *due)
{
	if (!watchdog_sleeping)
		return;					/* it looks again before it sleeps */
	if (watchdog_until_set &&
		(watchdog_until.tv_sec < due->tv_sec ||
		 (watchdog_until.tv_sec == due->tv_sec &&
		  watchdog_until.tv_nsec <= due->tv_nsec)))
		return;
	pthread_cond_signal(&watchdog_cond);
}

/* For the watchdog: has the backend asked it to end?  Caller holds zks_mutex. */
bool
zkln_watchdog_stopping_locked(void)
{
	return watchdog_stop;
}

/* Start the watchdog, running main; false, with errno, if not. */
bool
zkln_start_watchdog(void *(*main) (void *))
{
	watchdog_running = zks_start_thread(&watchdog_thread, main, NULL);
	return watchdog_running;
}

/*
 * Stop the watchdog, if it runs, and wait for it to end; it may have ended
 * already, having closed a parked session, and is then only joined.
 */
void
zkln_stop_watchdog(void)
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
