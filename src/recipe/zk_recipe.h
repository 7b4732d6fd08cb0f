/*-------------------------------------------------------------------------
 *
 * zk_recipe.h
 *	  The ZooKeeper lock recipe: one ephemeral sequential node per
 *	  contender, the lowest sequence holds, each waiter watches only its
 *	  predecessor.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_RECIPE_H
#define ZK_RECIPE_H

#include "datatype/timestamp.h"
#include "port/atomics.h"

#include "base/zk_layout.h"

/* Longest wait for ZooKeeper to confirm a release. */
#define ZKR_RELEASE_WAIT_MAX_MS	2000

typedef enum ZkrResult
{
	ZKR_GRANTED,
	ZKR_BUSY,					/* another contender is ahead, and we may not wait */
	ZKR_TIMED_OUT				/* the deadline passed */
} ZkrResult;

typedef struct ZkLockNode
{
	char		path[ZKL_NODE_MAX];
	int64		czxid;
} ZkLockNode;

extern ZkrResult zkr_acquire(const char *parent, bool shared, int slots,
							 const char *other_node, const char *data,
							 bool wait, TimestampTz deadline,
							 ZkLockNode *node, bool *waited);
extern bool zkr_release(const char *node_path);
extern bool zkr_take_kept(const char *parent, ZkLockNode *node, int *cookie);
extern bool zkr_keep(const char *parent, const ZkLockNode *node,
					 uint64 verified_on, int keep_ms, int cookie,
					 pg_atomic_uint32 *shown);
extern bool zkr_verify(const char *node_path);
extern void zkr_wait_released(void);

#endif							/* ZK_RECIPE_H */
