/*-------------------------------------------------------------------------
 *
 * zk_session_int.h
 *	  What the session's own files share, and nothing else includes: the
 *	  handle and the mutex that guards the session's state, the helpers the
 *	  janitor (zk_janitor.c) needs from the session (zk_session.c), the
 *	  janitor's entry points that the session drives, and the settings a
 *	  session is opened with (zk_settings.c).
 *
 * Thread rules (see zk_session.c): the completion thread and the watchdog
 * call into the session and the janitor, so everything those two declare
 * here either runs under zks_mutex (the _locked functions, which expect it
 * held) or touches nothing of PostgreSQL.  The others must be called
 * without the mutex: zkj_kick takes it, and it and zks_send_sync call the
 * client library.  zk_settings.c runs on the backend's thread alone, with
 * PostgreSQL's rules, and none of the library's threads may call it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_SESSION_INT_H
#define ZK_SESSION_INT_H

#include <pthread.h>
#include <time.h>

#include "zk_session.h"

/* The session's mutex, and its handle (NULL while none is open). */
extern pthread_mutex_t zks_mutex;
extern zhandle_t *zks_zh;

/* zk_session.c, for the janitor */
extern void zks_wake_backend(void);
extern void zks_note_heard_locked(const struct timespec *sent_at,
								  bool via_leader, int rc);
extern bool zks_refused_outright(int rc);
extern int	zks_send_sync(zhandle_t *handle, const char *path);
extern void zks_declare_lost_locked(void);

/* zk_session.c, for the settings: the credentials' completion (I/O thread) */
extern void zks_auth_done(int rc, const void *data);

/* zk_settings.c, for the session: read on the backend's thread only */
extern struct ACL_vector zks_node_acl;	/* for the nodes the session creates */
extern const char *zkset_hosts(void);
extern int	zkset_session_timeout(void);
extern int	zkset_client_log_level(void);
extern char *zkset_tls_argument(void);
extern void zkset_remember_opened(void);
extern const char *zkset_opened_hosts(void);
extern void zkset_authenticate(void);

/* zk_client_log.c: the library's messages; zkcl_log on any thread */
#define ZKCL_TLS_FAILURE_SIZE	256
extern void zkcl_log(const char *message);
extern void zkcl_forget_tls_failure(void);
extern void zkcl_tls_failure(char *buf, size_t size);

/* zk_janitor.c, for the session */
extern void zkj_kick(zhandle_t *handle);
extern void zkj_clear_locked(void);
extern void zkj_release_held_locked(void);
extern bool zkj_busy_locked(void);

#endif							/* ZK_SESSION_INT_H */
