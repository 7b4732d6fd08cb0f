/*-------------------------------------------------------------------------
 *
 * zk_deadlock.h
 *	  Deadlock detection between zklock waiters of every cluster that
 *	  shares a ZooKeeper ensemble.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_DEADLOCK_H
#define ZK_DEADLOCK_H

#include "datatype/timestamp.h"

#include "zk_recipe.h"

/* Longest path of a published wait: <root>/%waits/<session id>. */
#define ZKD_PATH_MAX		(ZKR_ROOT_MAX + 32)

/* A wait published in ZooKeeper; path[0] is '\0' while there is none. */
typedef struct ZkdWait
{
	char		path[ZKD_PATH_MAX];
	int64		czxid;			/* of the published node: its age */
} ZkdWait;

extern int	zklock_deadlock_timeout;

extern void zkd_define_settings(void);
extern bool zkd_check(const char *parent, const char *node_path,
					  const char *identity, ZkdWait *published,
					  TimestampTz deadline, uint64 generation);
extern bool zkd_withdraw(ZkdWait *published);

#endif							/* ZK_DEADLOCK_H */
