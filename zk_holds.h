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

#include "zk_recipe.h"

typedef struct ZkHold
{
	char		parent[ZKR_PARENT_MAX]; /* hash key: the lock's parent path */
	char		name[ZKN_NAME_MAX + 1]; /* the lock name, for messages */
	ZkLockNode	node;			/* path[0] is '\0' while being acquired */
	uint64		connect_count;	/* session connects when last known ours */
	int			session_count;
	int			xact_count;
	SubTransactionId *xact_subids;	/* subtransaction of each xact hold */
	int			xact_alloc;
} ZkHold;

extern ZkHold *zkh_find(const char *parent);
extern ZkHold *zkh_reserve(const char *parent, const char *name);
extern void zkh_prepare_hold(ZkHold *hold);
extern void zkh_add_hold(ZkHold *hold, bool xact);
extern void zkh_forget(ZkHold *hold);
extern bool zkh_release_session_hold(const char *parent, const char *name);
extern void zkh_release_all_session_holds(void);
extern bool zkh_is_empty(void);
extern void zkh_mark_all_lost(void);
extern char *zkh_xact_hold_names(void);
extern int64 zkh_token(const char *parent);

extern void zkh_xact_callback(XactEvent event, void *arg);
extern void zkh_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

#endif							/* ZK_HOLDS_H */
