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

#include "base/zk_layout.h"

/* A wait published in ZooKeeper; path[0] is '\0' while there is none. */
typedef struct ZkdWait
{
	char		path[ZKL_WAIT_PATH_MAX];
	int64		czxid;			/* of the published node: its age */
} ZkdWait;

/* How many waiting sessions one check follows at most. */
#define ZKD_MAX_MEMBERS		1024

extern int	zklock_deadlock_timeout;
extern int	zkd_test_confirm_delay_ms;
extern int	zkd_test_max_members;
extern int	zkd_test_check_ms;

/* How a deadlock check ended, if not with "deadlock detected". */
typedef enum ZkdResult
{
	ZKD_DONE,					/* no deadlock of which this wait is the victim */
	ZKD_AGAIN,					/* could not finish: check again later */
	ZKD_TOO_LARGE				/* too many waiting sessions to follow */
} ZkdResult;

extern void zkd_define_settings(void);
extern ZkdResult zkd_check(const char *parent, const char *node_path,
						   const char *identity, ZkdWait *published,
						   TimestampTz deadline, uint64 generation);
extern bool zkd_withdraw(ZkdWait *published);

#endif							/* ZK_DEADLOCK_H */
