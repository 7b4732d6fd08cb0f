/*-------------------------------------------------------------------------
 *
 * zk_session.c
 *	  The backend's ZooKeeper session: opening and closing its handle, the
 *	  library's events about it, and the state they add up to.  The rest of
 *	  the session is in the files zk_session_int.h lists: requests, waits,
 *	  the watchdog, the janitor, the settings and the library's log.
 *
 * libzookeeper_mt runs an I/O thread and a completion thread.  Watchers and
 * completions run on the completion thread, where nothing of PostgreSQL may
 * be called: no palloc, no elog, not even SetLatch.  So the callbacks only
 * touch malloc'd memory under one pthread mutex (zks_mutex) and then write
 * to an eventfd.  The backend waits for that eventfd, its latch and
 * postmaster death (zk_wait.c), and runs CHECK_FOR_INTERRUPTS() on each
 * wake-up, so cancel, statement_timeout, lock_timeout and termination all
 * reach a waiting backend.  The synchronous zoo_* calls are never used:
 * they block in pthread_cond_wait where none of that reaches.
 *
 * The session is opened lazily on the first lock call (threads do not
 * survive fork, so never in the postmaster), with every signal blocked so the
 * library's threads never run PostgreSQL's signal handlers, and closed at
 * backend exit so the server drops our ephemeral nodes at once.
 *
 * The handle is made on a short-lived thread of its own, because making it
 * resolves the host names, which can take long and must stay cancellable;
 * the backend waits for that thread as for any reply.  The watchdog
 * (zk_watchdog.c) starts with the handle and stops before it is closed.
 *
 * A session that holds nothing is closed after zklock.idle_session_timeout,
 * so that the connections a host has on the ensemble follow the backends
 * that lock, not every backend that ever locked.  The backend parks the
 * session when a transaction ends with no lock node of its own in use
 * (zks_set_idle), and takes it back before it next sends anything
 * (unpark).  While it is parked the backend only reads its state, and
 * the watchdog, the one thread that is awake then, closes the handle once
 * the idle time has passed (zks_close_idle_locked).  The backend then finds
 * it closed (absorb_idle_close), as if it had closed it itself, and its
 * next lock opens a new session, as the first one did.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "storage/ipc.h"
#include "utils/timestamp.h"

#include "session/zk_session.h"
#include "session/zk_session_int.h"

/*
 * State shared with the library's threads.  Everything below is protected by
 * zks_mutex; the backend alone writes zks_zh.
 */
pthread_mutex_t zks_mutex = PTHREAD_MUTEX_INITIALIZER;
zhandle_t  *zks_zh = NULL;
ZksLink		zks_link;

/* Handles being closed on a thread of their own (zks_close); zks_mutex. */
static int	closers_running = 0;
static pthread_cond_t closers_done = PTHREAD_COND_INITIALIZER;

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
static void unpark(void);
static bool pin_handle(void);
static void unpin_handle(void);

static int64 session_id = 0;
static bool handle_uses_tls = false;	/* the open handle was made for TLS */

/* How often the library may resolve the host names again. */
#define HOST_RESOLUTION_DELAY_MS	60000

/*
 * The watcher for session events and for the watches the recipe sets.  A
 * watch carries no context but the handle's generation: any watch firing
 * bumps a generation counter and the waiting backend re-reads the queue, so
 * a stale watch from an earlier wait costs one harmless re-read.  A watch on
 * the node a waiter watches now also sends the waiter's listing (see
 * PendingListing, zk_requests.c).
 */
void
zks_session_watcher(zhandle_t *handle, int type, int state, const char *path,
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
		reconnected = (uint64) (uintptr_t) context == zks_link.generation;
		pthread_mutex_unlock(&zks_mutex);
		if (reconnected)
			zkj_kick(handle);
	}

	pthread_mutex_lock(&zks_mutex);
	if ((uint64) (uintptr_t) context != zks_link.generation)
	{
		pthread_mutex_unlock(&zks_mutex);
		return;
	}
	if (type != ZOO_SESSION_EVENT)
		claimed = zkrq_claim_listing_locked(type, path, &discard_listing);
	else
	{
		zks_link.conn_state = state;
		if (state == ZOO_CONNECTED_STATE)
		{
			zks_link.ever_connected = true;
			zks_link.negotiated_timeout = timeout;
			zks_link.connect_count++;
			zkwd_note_connected_locked();
		}
		else if (state == ZOO_EXPIRED_SESSION_STATE)
		{
			zks_link.expired = true;
			zkj_clear_locked();
		}
		else if (state == ZOO_AUTH_FAILED_STATE)
			zks_link.auth_failed = true;
		else
			zkwd_note_disconnected_locked();
	}
	/* After a reconnect a waiter re-checks the queue too. */
	zks_link.watch_generation++;
	zkwd_wake_locked();
	pthread_mutex_unlock(&zks_mutex);

	if (claimed)
		zkrq_send_claimed(handle, claimed, discard_listing);
	zkw_wake_backend();
}

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
 * Connected: our nodes are there.  Unsure: disconnected, but heard from
 * within the session timeout, so they may be.  Lost: they are gone.
 */
static ZksState
state_locked(void)
{
	if (zkwd_lost_locked())
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

/*
 * Close the session, and let handles still closing finish first: the
 * process must not exit while library threads are inside OpenSSL.  Each
 * ends within its handshake's time limit.  Then no handle is left to log,
 * and what the library said is logged before the backend goes.
 */
static void
close_at_exit(int code, Datum arg)
{
	zks_close();
	pthread_mutex_lock(&zks_mutex);
	while (closers_running > 0)
		pthread_cond_wait(&closers_done, &zks_mutex);
	pthread_mutex_unlock(&zks_mutex);
	zkcl_log_at_exit();
}

/*
 * What a session needs of the backend, made once: the waits' (zkw_prepare),
 * the watchdog's (zkwd_prepare), and the exit callback.
 */
static void
prepare_backend_resources(void)
{
	static bool exit_callback_registered = false;

	zkw_prepare();
	zkwd_prepare();
	zkj_prepare();
	if (!exit_callback_registered)
	{
		on_proc_exit(close_at_exit, (Datum) 0);
		exit_callback_registered = true;
	}
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

/* Does the open session speak TLS? */
bool
zks_uses_tls(void)
{
	return zks_zh != NULL && handle_uses_tls;
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
		handle = zookeeper_init_ssl(opener->hosts, opener->tls,
									zks_session_watcher, opener->timeout, NULL,
									zks_generation_context(opener->generation),
									0);
		error = errno;
		if (handle != NULL)
			zoo_set_log_callback(handle, zkcl_log);
	}
	else
#endif
	{
		handle = zookeeper_init2(opener->hosts, zks_session_watcher,
								 opener->timeout, NULL,
								 zks_generation_context(opener->generation), 0,
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
		zkw_wake_backend();
	else
	{
		if (handle != NULL)
			zookeeper_close(handle);
		opener_free(opener);
	}
	return NULL;
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
	zks_link.generation++;
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
			long		timeout = zkw_ms_until(deadline);

			if (timeout == 0)
				break;
			zkw_sleep(timeout, true);
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
	zkcl_forget_failures();
	opener->timeout = zkset_session_timeout();
	zoo_set_debug_level((ZooLogLevel) zkset_client_log_level());

	pthread_mutex_lock(&zks_mutex);
	zks_link.conn_state = 0;
	zks_link.expired = false;
	zks_link.auth_failed = false;
	zks_link.ever_connected = false;
	zkwd_reset_locked();
	zkj_forget_refusal_locked();
	opener->generation = ++zks_link.generation;
	pthread_mutex_unlock(&zks_mutex);

	if (!zks_start_thread(NULL, opener_main, opener))
		opener_free(opener);
	else
		handle = await_opener(opener, deadline);
	if (handle != NULL)
	{
		zks_zh = handle;
		if (zkwd_start())
			return;
	}
	save_errno = errno;
	zks_close();
	/* What the library said of it, before the error. */
	zks_log_client_messages();
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
	unpark();
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
		PG_TRY();
		{
			zkset_authenticate();
		}
		PG_CATCH();
		{
			zks_close();
			PG_RE_THROW();
		}
		PG_END_TRY();
	}

	if (!zks_await_connected(deadline))
	{
		char	   *hosts = pstrdup(zkset_opened_hosts());
		char		failure[ZKCL_FAILURE_SIZE] = "";
		char		closed[ZKCL_FAILURE_SIZE] = "";

		if (handle_uses_tls)
			zkcl_tls_failure(failure, sizeof(failure));
		zkcl_closed_by_server(closed, sizeof(closed));
		zks_close();
		zks_log_client_messages();
		if (failure[0] != '\0')
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("could not connect to ZooKeeper at \"%s\" over TLS within %d ms",
							hosts, zklock_connect_timeout),
					 errdetail("The TLS handshake failed: %s", failure),
					 errhint("Check that zklock.tls_ca holds the CA that signed the servers' certificates, that the servers trust the CA of zklock.tls_cert, and that zklock.hosts names their TLS ports.")));

		/*
		 * Taken and closed at once, without a word: the server's limit of
		 * connections per client host, or a server that is not serving.
		 * Waiting longer would not help, so the hint does not say so.
		 */
		if (closed[0] != '\0')
			ereport(ERROR,
					(errcode(ERRCODE_SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION),
					 errmsg("ZooKeeper at \"%s\" refused the connection", hosts),
					 errdetail("A server closed the connection before a session was made; the client library said: %s", closed),
					 errhint("A server does so when this host already has maxClientCnxns connections to it (60 by default), or when it is not serving.  Raise maxClientCnxns in the servers' configuration, or lower zklock.idle_session_timeout so that backends holding nothing close their sessions sooner; the servers' logs say which.")));
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("could not connect to ZooKeeper at \"%s\" within %d ms",
						hosts, zklock_connect_timeout),
				 errhint("Check that the ensemble is running and reachable, or raise zklock.connect_timeout.")));
	}
	session_id = zoo_client_id(zks_zh)->client_id;
	/* Shown at once, not when the watchdog next sleeps. */
	pthread_mutex_lock(&zks_mutex);
	zks_show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
	zks_log_client_messages();
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
	zhandle_t  *handle;

	/* Unparked first, so that the watchdog cannot start closing it too. */
	unpark();
	handle = zks_zh;
	zkwd_stop();
	if (handle == NULL)
		return;
	zks_cancel_listing();
	pthread_mutex_lock(&zks_mutex);
	zks_zh = NULL;
	zks_link.generation++;
	zkj_clear_locked();
	zks_show_state_locked();
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
		if (zks_start_thread(NULL, closer_main, handle))
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

	if (parked_here || zks_zh == NULL || timeout <= 0)
		return;
	pthread_mutex_lock(&zks_mutex);
	parked = parked_here = true;
	clock_gettime(CLOCK_MONOTONIC, &idle_since);
	idle_close_ms = timeout;
	zkwd_wake_locked();
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
	zks_show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
	/* The watchdog has left its loop: this only joins it. */
	zkwd_stop();
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
	zkwd_wake_locked();
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
	zks_show_state_locked();
	pthread_mutex_unlock(&zks_mutex);
	zookeeper_close(handle);
	pthread_mutex_lock(&zks_mutex);
	idle_close = IDLE_CLOSED;
	pthread_cond_broadcast(&idle_close_done);
}
