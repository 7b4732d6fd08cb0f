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

/* Hash key: the lock's parent path and a mode suffix. */
#define ZKH_KEY_MAX			(ZKR_PARENT_MAX + 2)

/* The refused COMMIT of a transaction whose zklock was lost. */
#define ZKH_CANNOT_COMMIT_MSG \
	"cannot commit: zklock lost transaction-level lock %s"
#define ZKH_CANNOT_COMMIT_DETAIL \
	"The ZooKeeper session expired or was cut off for longer than its timeout while the transaction held the lock."
#define ZKH_CANNOT_COMMIT_HINT \
	"The transaction is rolled back.  Retry it under a new lock."

typedef struct ZkHold
{
	char		key[ZKH_KEY_MAX];	/* hash key */
	char		parent[ZKR_PARENT_MAX];
	char		name[ZKN_NAME_MAX + 1]; /* the lock name, for messages */
	bool		shared;
	ZkLockNode	node;			/* path[0] is '\0' while being acquired */
	uint64		contact_epoch;	/* zks_contact_epoch when last known ours */
	TimestampTz since;			/* when granted */
	int			session_count;
	int			xact_count;
	SubTransactionId *xact_subids;	/* subtransaction of each xact hold */
	int			xact_alloc;
} ZkHold;

extern ZkHold *zkh_find(const char *parent, bool shared);
extern ZkHold *zkh_reserve(const char *parent, bool shared, const char *name);
extern void zkh_prepare_hold(ZkHold *hold);
extern void zkh_add_hold(ZkHold *hold, bool xact);
extern void zkh_forget(ZkHold *hold);
extern bool zkh_release_session_hold(const char *parent, bool shared,
									 const char *name);
extern void zkh_release_all_session_holds(void);
extern bool zkh_is_empty(void);
extern void zkh_mark_all_lost(void);
extern char *zkh_xact_hold_names(void);
extern bool zkh_committing(void);
extern int64 zkh_token(const char *parent);
extern int	zkh_list(ZkHold **holds_out, bool **lost_out);
extern int64 zkh_losses(void);

extern void zkh_xact_callback(XactEvent event, void *arg);
extern void zkh_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

#endif							/* ZK_HOLDS_H */
