/*-------------------------------------------------------------------------
 *
 * zk_session.h
 *	  The backend's one ZooKeeper session: sending asynchronous requests
 *	  (zk_requests.c), its state and parking it while idle
 *	  (zk_session_state.c), opening it (zk_session.c), waiting for replies
 *	  and watches (zk_wait.c), noticing its loss (zk_watchdog.c), its
 *	  settings (zk_settings.c), the client library's own messages
 *	  (zk_client_log.c), the budget of nodes it may have (zk_budget.c),
 *	  nodes kept after their release (zk_keeping.c), and the janitor that
 *	  makes sure abandoned lock nodes are deleted (zk_janitor.c).  Each section below is made by the file it names.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_SESSION_H
#define ZK_SESSION_H

#include "datatype/timestamp.h"
#include "port/atomics.h"

#include "base/zk_compat.h"

#include <time.h>

#include <zookeeper/zookeeper.h>

/* zk_requests.c: requests, the watch-then-list handoff, their errors */

/*
 * One asynchronous request.  The completion thread fills in the result and
 * sets done; nothing in it belongs to PostgreSQL's memory management, since
 * the completion thread may have to free it.
 */
typedef struct ZkRequest
{
	struct timespec sent_at;	/* when sent, on the monotonic clock */
	bool		via_leader;		/* a write or a sync: answered by the leader */
	bool		done;
	bool		abandoned;		/* the backend stopped waiting for it */
	bool		maybe_late;		/* finished by us; the library may still */
	bool		late_done;		/* ... and has now */
	int			rc;
	char	   *path;			/* create: the node created */
	struct Stat stat;			/* create, exists; a listing's parent */
	int			nchildren;		/* get_children */
	char	  **children;
	char	   *data;			/* get_data */
	int			datalen;
	struct ACL *acl;			/* get_acl */
	int			nacl;
} ZkRequest;

/* What a request was for, to say what failed. */
typedef enum ZksOperation
{
	ZKS_CREATE,
	ZKS_LIST,
	ZKS_CHECK,
	ZKS_SYNC,
	ZKS_READ,
	ZKS_WATCH,
	ZKS_SET_DATA
} ZksOperation;

extern ZkRequest *zks_create(const char *path, const char *data, int datalen,
							 int mode);
extern ZkRequest *zks_get_children(const char *path);
extern ZkRequest *zks_get_children_synced(const char *path);
extern ZkRequest *zks_exists(const char *path);
extern ZkRequest *zks_exists_synced(const char *path);
extern ZkRequest *zks_get_data(const char *path);
extern ZkRequest *zks_get_acl(const char *path);
extern ZkRequest *zks_watch_data(const char *path);
extern ZkRequest *zks_set_data(const char *path, const char *data, int datalen);
extern void zks_remove_watch(const char *path);
extern ZkRequest *zks_watch_then_list(const char *watched, const char *parent,
									  const char *own, ZkRequest **own_watch);
extern ZkRequest *zks_take_listing(bool *deleted);
extern void zks_cancel_listing(void);
extern void zks_release_request(ZkRequest *req);
extern uint64 zks_requests_sent(void);
pg_noreturn extern void zks_report_error(int rc, ZksOperation op, const char *path);

/*
 * A request failed only because the connection dropped or ZooKeeper did not
 * answer in time: the same request may be sent again once connected.
 */
static inline bool
zks_is_retryable(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

/* zk_session_state.c: the session's state, its id, parking it while idle */
typedef enum ZksState
{
	ZKS_CONNECTED,				/* our nodes are there */
	ZKS_UNSURE,					/* disconnected for less than the timeout */
	ZKS_LOST					/* expired, or cut off for the timeout */
} ZksState;

/*
 * The session's state as zks_show_state_in shows it to the rest of the
 * server: ZKS_SHOWN_CLOSED, or ZKS_SHOWN_OPEN plus a ZksState.
 */
#define ZKS_SHOWN_CLOSED	0
#define ZKS_SHOWN_OPEN		1

extern void zks_set_idle(void);
extern bool zks_is_open(void);
extern ZksState zks_state(void);
extern bool zks_is_lost(void);
extern uint32 zks_shown_state(void);
extern void zks_show_state_in(pg_atomic_uint32 *state, pg_atomic_uint32 *since);
extern int64 zks_session_id(void);
extern bool zks_session_password(char passwd[16]);
extern const char *zks_current_server(void);

/* zk_session.c: the session's life */
extern void zks_open(void);
extern void zks_close(void);
extern bool zks_uses_tls(void);

/* zk_link.c: what the library's events say of the handle */
extern uint64 zks_connection_count(void);
extern int	zks_negotiated_timeout(void);

/* zk_wait.c: the backend's waits, and the leader sync before COMMIT */
extern bool zks_confirm_contact(void);
extern bool zks_await(ZkRequest *req, TimestampTz deadline);
extern uint64 zks_watch_generation(void);
extern bool zks_await_watch(uint64 generation, TimestampTz deadline);
extern bool zks_await_connected(TimestampTz deadline);
extern bool zks_wait_while_unsure(void);
extern void zks_settle(int timeout_ms);
extern bool zks_await_kept_decided(const char *parent, TimestampTz deadline);

/* zk_watchdog.c: the loss, its cancels, the lease */
extern void zks_set_cancel_on_loss(bool cancel);
extern bool zks_set_running(bool running);
extern bool zks_set_committing(bool is_committing);
extern bool zks_take_loss_cancel(void);
extern int64 zks_monotonic_ms(void);
extern void zks_set_lease(int64 deadline_ms, int length_ms);
extern const char *zks_loss_reason(void);

/* zk_settings.c: the settings; zklock_connect_timeout is how long a lock
 * call waits for ZooKeeper to answer */
extern int	zklock_connect_timeout;
extern void zks_define_settings(void);
extern bool zks_settings_changed(void);
extern bool zks_has_credentials(void);
extern uint64 zks_identity_generation(void);

/* zk_client_log.c: the library's messages, logged by the backend */
extern void zks_log_client_messages(void);

/* zk_budget.c: the nodes a session may have */
extern void zks_define_budget_settings(void);
extern void zks_check_node_budget(const char *prefix);

/* zk_keeping.c: nodes kept after their release (zklock.keep_released) */
typedef enum ZksKeptTake
{
	ZKS_KEPT_NONE,
	ZKS_KEPT_TAKEN,
	ZKS_KEPT_DECIDING
} ZksKeptTake;

extern bool zks_keep_released(const char *path, const char *parent,
							  int64 czxid, uint64 verified_on, int keep_ms,
							  int cookie, pg_atomic_uint32 *shown);
extern ZksKeptTake zks_take_kept(const char *parent, char *path,
								 size_t path_size, int64 *czxid, int *cookie);
extern bool zks_kept_deciding(const char *parent);
extern bool zks_keeps_any(void);
extern bool zks_give_up_kept(void);
extern int	zks_take_given_up(int *cookies, int max);
extern void zks_forget_kept_shown(void);
extern void zks_keeping_counts(int *kept, int *deciding, uint64 *listings);

/* zk_janitor.c: deleting the nodes given up; zks_test_lose_after_grants
 * is for the fault tests only (see zks_keep_node) */
extern int	zks_test_lose_after_grants;
extern void zks_keep_node(const char *path);
extern bool zks_delete_later(const char *path);
extern void zks_send_pending_deletes(void);
extern bool zks_deleting(const char *parent, const char *child);
extern bool zks_sweep_later(const char *parent, const char *guid);
extern bool zks_janitor_failed(void);
extern bool zks_take_refusal(void);

#endif							/* ZK_SESSION_H */
