/*-------------------------------------------------------------------------
 *
 * zk_session_int.h
 *	  What zk_session.c and zk_janitor.c share, and nothing else sees: the
 *	  handle, the mutex that guards state shared with the library's threads,
 *	  and the janitor's hooks into session events.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_SESSION_INT_H
#define ZK_SESSION_INT_H

#include <pthread.h>
#include <time.h>

#include <zookeeper/zookeeper.h>

extern pthread_mutex_t zks_mutex;
extern zhandle_t *zks_zh;

extern void zks_wake_backend(void);
extern bool zks_refused_outright(int rc);
extern int	zks_send_sync(zhandle_t *handle, const char *path);
extern void zks_note_heard_locked(const struct timespec *sent_at,
								  bool via_leader, int rc);

/* zk_janitor.c; the _locked ones are called with zks_mutex held. */
extern void janitor_kick(zhandle_t *handle);
extern void janitor_clear_locked(void);
extern void janitor_wake_dormant_locked(void);
extern bool janitor_busy_locked(void);

#endif							/* ZK_SESSION_INT_H */
