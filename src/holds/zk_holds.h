/*-------------------------------------------------------------------------
 *
 * zk_holds.h
 *	  The backend's table of held zklocks and semaphore slots, with session
 *	  and transaction hold counts; its transaction callbacks end
 *	  transaction holds (zk_holds.c).  What a lost session means for them,
 *	  and what may commit then, is decided in zk_fail_closed.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_HOLDS_H
#define ZK_HOLDS_H

#include "datatype/timestamp.h"

#include "base/zk_compat.h"
#include "recipe/zk_recipe.h"

/* One row of zk_locks: a lock, mode and scope this backend holds. */
typedef struct ZkHoldRow
{
	const char *name;
	bool		shared;
	bool		semaphore;		/* a semaphore's slot */
	bool		xact;
	int			count;
	bool		lost;
	const char *node;
	int64		token;
	TimestampTz since;
} ZkHoldRow;

/* zk_holds.c: holds taken, ended and shown */
extern void zkh_define_settings(void);
extern void zkh_register_callbacks(void);
extern bool zkh_add_if_held(const char *parent, bool shared, bool xact);
extern ZkrResult zkh_acquire(const char *parent, const char *name,
							 bool shared, bool xact, const char *data,
							 bool wait, TimestampTz deadline, bool *waited);
extern void zkh_undo_hold(const char *parent, bool shared, bool xact);
extern ZkrResult zkh_acquire_slot(const char *parent, const char *name,
								  int slots, bool xact, const char *data,
								  bool wait, TimestampTz deadline,
								  bool *waited);
extern bool zkh_release_slot(const char *parent, const char *name);
extern int64 zkh_slot_token(const char *parent);
extern bool zkh_release_session_hold(const char *parent, bool shared,
									 const char *name);
extern void zkh_release_all_session_holds(void);
extern int64 zkh_token(const char *parent);
extern bool zkh_owns_node(const char *parent, const char *child);
extern int	zkh_rows(ZkHoldRow **rows);
extern int	zkh_held_count(void);

/* zk_fail_closed.c: what a loss does to it */
extern void zkh_check_session(void);
extern void zkh_check_commit(bool wrote, bool prepare);
extern void zkh_check_commit_prepared(const char *gid);
pg_noreturn extern void zkh_raise_loss_cancel(void);
extern bool zkh_any(void);
extern int	zkh_unacknowledged_losses(void);
extern int64 zkh_losses(void);

#endif							/* ZK_HOLDS_H */
