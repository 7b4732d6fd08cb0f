/*-------------------------------------------------------------------------
 *
 * zk_session.c
 *	  The backend's ZooKeeper session: opening and closing its handle, and
 *	  the library's events about it.  The rest of the session is in the
 *	  files zk_session_int.h lists, which this one calls: the state, the
 *	  requests, waits, the watchdog, the janitor, the settings, the
 *	  library's log, the contact clock and the link they all share.
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
 * that lock, not every backend that ever locked (zk_session_state.c).
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

/* Handles being closed on a thread of their own (zks_close); zks_mutex. */
static int	closers_running = 0;
static pthread_cond_t closers_done = PTHREAD_COND_INITIALIZER;

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
static void
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
			zkct_note_connected_locked();
		}
		else if (state == ZOO_EXPIRED_SESSION_STATE)
		{
			zks_link.expired = true;
			zkj_clear_locked();
			zkk_clear_locked();
		}
		else if (state == ZOO_AUTH_FAILED_STATE)
			zks_link.auth_failed = true;
		else
			zkct_note_disconnected_locked();
	}
	/* After a reconnect a waiter re-checks the queue too. */
	zks_link.watch_generation++;
	zkln_wake_watchdog_locked();
	pthread_mutex_unlock(&zks_mutex);

	if (claimed)
		zkrq_send_claimed(handle, claimed, discard_listing);
	zkln_wake_backend();
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
 * the watchdog's (zkln_prepare_watchdog), and the exit callback.
 */
static void
prepare_backend_resources(void)
{
	static bool exit_callback_registered = false;

	zkw_prepare();
	zkln_prepare_watchdog();
	zkj_prepare();
	if (!exit_callback_registered)
	{
		on_proc_exit(close_at_exit, (Datum) 0);
		exit_callback_registered = true;
	}
}

/* Does the open session speak TLS? */
bool
zks_uses_tls(void)
{
	return zks_zh != NULL && handle_uses_tls;
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
		zkln_wake_backend();
	else
	{
		if (handle != NULL)
			zookeeper_close(handle);
		opener_free(opener);
	}
	return NULL;
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
	zkct_reset_locked();
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
	if (zkst_unpark_ready())
		return;

	prepare_backend_resources();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	if (zks_zh == NULL)
	{
		open_handle(deadline);
		zkset_remember_opened();
		zkst_set_session_id(0);
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
	zkst_set_session_id(zoo_client_id(zks_zh)->client_id);
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
	zkst_unpark();
	handle = zks_zh;
	zkln_stop_watchdog();
	if (handle == NULL)
		return;
	zks_cancel_listing();
	pthread_mutex_lock(&zks_mutex);
	zks_zh = NULL;
	zks_link.generation++;
	zkj_clear_locked();
	zkk_clear_locked();
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
	zkst_set_session_id(0);
}
