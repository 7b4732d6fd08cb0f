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

#include "zk_session.h"

extern bool zkac_check_parent(const char *parent, bool semaphore,
							  const struct Stat *parent_stat,
							  TimestampTz deadline);
extern void zkac_created(const char *path, const struct Stat *stat);

#endif							/* ZK_ACL_CHECK_H */
