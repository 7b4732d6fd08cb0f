/*-------------------------------------------------------------------------
 *
 * zk_session_int.h
 *	  What the session's own files share, and nothing else includes.  The
 *	  session's files, which make its public API (zk_session.h), top to
 *	  bottom: each calls only the files below it.
 *
 *	  zk_session.c		the session's life: opening and closing the
 *						handle, and the library's events about it
 *	  zk_budget.c		how many lock nodes, and bytes of their paths,
 *						a session may have
 *	  zk_wait.c			the backend's waits, and the leader sync
 *						before COMMIT
 *	  zk_watchdog.c		the loss watchdog, its heartbeats and cancels,
 *						the lease
 *	  zk_session_state.c	the session's state, its id, and parking it
 *						while idle
 *	  zk_keeping.c		nodes kept after their release, and giving them
 *						up when anyone else comes
 *	  zk_janitor.c		deleting the nodes a backend gives up
 *	  zk_requests.c		requests and their completions, the
 *						watch-then-list handoff, request errors
 *	  zk_settings.c		the settings a session is made with, its
 *						credentials and TLS files
 *	  zk_client_log.c	the library's own messages, queued on its threads
 *						and logged by the backend
 *	  zk_contact.c		the contact clock, and whether the session is lost
 *	  zk_link.c			what the others share with the library's threads:
 *						the mutex, the handle, ZksLink, the eventfd that
 *						wakes the backend, the watchdog's wake-up and thread
 *
 * Thread rules (see zk_session.c): the completion thread and the watchdog
 * call into these files, so everything those two reach here either runs
 * under zks_mutex (the _locked functions, which expect it held) or touches
 * nothing of PostgreSQL.  The others must be called without the mutex:
 * zkj_kick and zkln_stop_watchdog take it, and zkj_kick, zkrq_send_sync and
 * zkrq_send_claimed call the client library.
 * Functions that may raise an ERROR, wait or use PostgreSQL's memory run
 * on the backend's thread only; zk_settings.c is all of that kind but the
 * credentials' empty completion.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_SESSION_INT_H
#define ZK_SESSION_INT_H

#include <pthread.h>

#include "utils/timestamp.h"

#include "session/zk_session.h"

/* zk_watchdog.c */
extern void zkwd_reset_locked(void);
extern bool zkwd_start(void);

/* zk_wait.c */
extern void zkw_prepare(void);
extern void zkw_sleep(long timeout_ms, bool interruptible);

/* The longest single sleep: WaitEventSetWait takes an int of milliseconds. */
#define ZKW_MAX_SLEEP_MS	60000

/*
 * Milliseconds left until deadline (0: none, -1 returned), capped; inline,
 * as every wait for a reply asks it.
 */
static inline long
zkw_ms_until(TimestampTz deadline)
{
	if (deadline == 0)
		return -1;
	return Min(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline),
			   ZKW_MAX_SLEEP_MS);
}

/* zk_session_state.c */
extern void zkst_unpark(void);
extern bool zkst_unpark_ready(void);
extern void zkst_set_session_id(int64 id);
extern void zks_show_state_locked(void);
extern bool zks_idle_since_locked(struct timespec *since, int *ms);
extern void zks_close_idle_locked(void);

/* zk_keeping.c, for the session */
extern bool zkk_give_up_due_locked(const struct timespec *now,
								   struct timespec *next, bool *any);
extern void zkk_lost_locked(void);
extern void zkk_clear_locked(void);

/* zk_janitor.c, for the session */
extern void zkj_kick(zhandle_t *handle);
extern void zkj_clear_locked(void);
extern void zkj_release_held_locked(void);
extern bool zkj_busy_locked(void);
extern void zkj_prepare(void);
extern bool zkj_refusal_locked(char *buf, size_t size);
extern void zkj_forget_refusal_locked(void);
extern void zkj_footprint(int *nodes, int64 *path_bytes);
extern bool zkj_deleting_any_locked(void);
extern bool zkj_give_up_held_locked(const char *path);
extern bool zkj_is_held_locked(const char *path);
extern bool zkj_holds_under_locked(const char *parent);

/* zk_requests.c */
typedef struct PendingListing PendingListing;
extern PendingListing *zkrq_claim_listing_locked(int type, const char *path,
												 bool *discard);
extern void zkrq_send_claimed(zhandle_t *handle, PendingListing *claimed,
							  bool discard);
extern ZkRequest *zkrq_sync(const char *path);
extern bool zkrq_refused_outright(int rc);
extern int	zkrq_send_sync(zhandle_t *handle, const char *path);

/* zk_settings.c, for the session: read on the backend's thread only */
extern struct ACL_vector zks_node_acl;	/* for the nodes the session creates */
extern const char *zkset_hosts(void);
extern int	zkset_session_timeout(void);
extern int	zkset_client_log_level(void);
extern char *zkset_tls_argument(void);
extern int	zkset_idle_session_timeout(void);
extern void zkset_remember_opened(void);
extern const char *zkset_opened_hosts(void);
extern void zkset_authenticate(void);

/* zk_client_log.c: the library's messages; zkcl_log on any thread */
#define ZKCL_FAILURE_SIZE	256
extern void zkcl_log(const char *message);
extern void zkcl_log_at_exit(void);
extern void zkcl_forget_failures(void);
extern void zkcl_tls_failure(char *buf, size_t size);
extern void zkcl_closed_by_server(char *buf, size_t size);

/* zk_contact.c: the contact clock; the _locked ones under zks_mutex */
extern void zkct_note_heard_locked(const struct timespec *sent_at,
								   bool via_leader, int rc);
extern bool zkct_lost_locked(void);
extern bool zkct_declared_lost_locked(void);
extern void zkct_declare_lost_locked(void);
extern struct timespec zkct_last_heard_locked(void);
extern int64 zkct_ms_since_leader_heard(void);
extern void zkct_reset_locked(void);
extern void zkct_note_connected_locked(void);
extern void zkct_note_disconnected_locked(void);

/* Is a later than b? */
static inline bool
zkct_later(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec > b->tv_sec ||
		(a->tv_sec == b->tv_sec && a->tv_nsec > b->tv_nsec);
}

/* Did the server answer a request with this result?  (Else the library did.) */
static inline bool
zkct_server_answered(int rc)
{
	return rc == ZOK ||
		(rc <= ZAPIERROR && rc != ZCLOSING && rc != ZSESSIONEXPIRED &&
		 rc != ZSESSIONMOVED);
}

/* zk_link.c: the mutex, and the handle (NULL while none is open) */
extern pthread_mutex_t zks_mutex;
extern zhandle_t *zks_zh;

/*
 * What the library's events say of the handle: written under zks_mutex by
 * the session's watcher, and reset by the backend when it opens a handle
 * (zk_session.c); read under the mutex elsewhere.  Only the backend writes
 * generation while it uses the handle (the watchdog does, under the mutex,
 * only as it closes a parked session), so the backend may read it without
 * the mutex then.
 */
typedef struct ZksLink
{
	/*
	 * Of the handle in use.  Every event carries its handle's: a handle
	 * given up while it was being made, or closed, must not touch the state
	 * of the one in use.
	 */
	uint64		generation;
	int			conn_state;		/* the library's last session state */
	bool		expired;
	bool		auth_failed;
	bool		ever_connected;
	int			negotiated_timeout;
	uint64		connect_count;	/* connections made, reconnects included */
	uint64		watch_generation;	/* bumped by every event */
} ZksLink;

extern ZksLink zks_link;

/* The context the library hands back with a handle's events. */
static inline void *
zks_generation_context(uint64 generation)
{
	return (void *) (uintptr_t) generation;
}

extern bool zks_start_thread(pthread_t *thread, void *(*main) (void *),
							 void *arg);
extern int	zkln_wake_fd(void);
extern void zkln_wake_backend(void);
extern void zkln_prepare_watchdog(void);
extern void zkln_wake_watchdog_locked(void);
extern void zkln_wake_watchdog_by_locked(const struct timespec *due);
extern void zkln_watchdog_sleep_locked(const struct timespec *until);
extern bool zkln_watchdog_stopping_locked(void);
extern bool zkln_start_watchdog(void *(*main) (void *));
extern void zkln_stop_watchdog(void);

#endif							/* ZK_SESSION_INT_H */
