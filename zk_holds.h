/*-------------------------------------------------------------------------
 *
 * zk_holds.h
 *	  The backend's table of held zklocks, with session and transaction
 *	  hold counts, and the transaction callbacks that end transaction holds.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_HOLDS_H
#define ZK_HOLDS_H

#include "access/xact.h"
#include "datatype/timestamp.h"

#include "zk_recipe.h"

/* The refused COMMIT of a transaction whose zklock was lost. */
#define ZKH_CANNOT_COMMIT_MSG \
	"cannot commit: zklock lost transaction-level lock %s"
#define ZKH_CANNOT_COMMIT_DETAIL \
	"The ZooKeeper session expired or was cut off for longer than its timeout while the transaction held the lock."
#define ZKH_CANNOT_COMMIT_HINT \
	"The transaction is rolled back.  Retry it under a new lock."

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
extern bool zkh_is_empty(void);
extern void zkh_mark_all_lost(void);
extern char *zkh_xact_hold_names(void);
extern bool zkh_committing(void);
extern int64 zkh_token(const char *parent);
extern bool zkh_owns_node(const char *parent, const char *child);
extern int	zkh_rows(ZkHoldRow **rows);
extern int	zkh_held_count(void);
extern int64 zkh_losses(void);

extern void zkh_xact_callback(XactEvent event, void *arg);
extern void zkh_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

#endif							/* ZK_HOLDS_H */
