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

#include "zk_names.h"

/* Longest zklock.root accepted, in bytes. */
#define ZKR_ROOT_MAX		200

/*
 * Longest lock parent path: <root>/<encoded name>, or, for a semaphore,
 * <root>/%semaphores/<encoded name>.
 */
#define ZKR_PARENT_MAX		(ZKR_ROOT_MAX + 1 + 12 + ZKN_ENCODED_MAX)

/*
 * Longest contender path: <parent>/_c_<guid>-read-lock-<sequence>, where a
 * wrapped sequence takes 11 characters (a semaphore's "-sem<N>-" is no
 * longer than "-read-lock-").
 */
#define ZKR_NODE_MAX		(ZKR_PARENT_MAX + 4 + ZKN_GUID_LEN + 11 + 11)

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
	char		path[ZKR_NODE_MAX];
	int64		czxid;
} ZkLockNode;

extern ZkrResult zkr_acquire(const char *parent, bool shared, int slots,
							 const char *other_node, const char *data,
							 bool wait, TimestampTz deadline,
							 ZkLockNode *node, bool *waited);
extern bool zkr_release(const char *node_path);
extern bool zkr_verify(const char *node_path);
extern void zkr_wait_released(void);

#endif							/* ZK_RECIPE_H */
