/*-------------------------------------------------------------------------
 *
 * zk_acl_check.h
 *	  With credentials, whether the root and a lock's parent keep clients
 *	  without them from deleting lock nodes (zk_acl_check.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_ACL_CHECK_H
#define ZK_ACL_CHECK_H

#include "datatype/timestamp.h"

#include "session/zk_session.h"

typedef enum ZkacVerdict
{
	ZKAC_TRUSTED,
	ZKAC_LIST_AGAIN,			/* the ACL changed since the listing */
	ZKAC_LATE,					/* the deadline passed */
	ZKAC_NODE_GONE				/* the acquisition's node is not its own */
} ZkacVerdict;

extern ZkacVerdict zkac_check_parent(const char *parent, bool semaphore,
									 const char *own_node, int64 own_czxid,
									 const struct Stat *parent_stat,
									 TimestampTz deadline);
extern void zkac_created(const char *path, const struct Stat *stat);

#endif							/* ZK_ACL_CHECK_H */
