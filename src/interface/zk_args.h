/*-------------------------------------------------------------------------
 *
 * zk_args.h
 *	  Reading the SQL functions' arguments: lock and semaphore names (to
 *	  their parent paths under zklock.root), arrays of names, timeouts and
 *	  semaphore sizes.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_ARGS_H
#define ZK_ARGS_H

#include "fmgr.h"

#include "base/zk_layout.h"

/* A timeout that waits without limit, and one that tries once. */
#define ZKA_WAIT_FOREVER	((int64) -1)
#define ZKA_TRY_ONCE		((int64) 0)

/* One name of a multi-lock, with its parent path. */
typedef struct ZkaName
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;
} ZkaName;

extern void zka_define_settings(void);
extern void zka_lock_parent(FunctionCallInfo fcinfo, int argno,
							char parent[ZKL_PARENT_MAX], char **name);
extern void zka_semaphore_parent(FunctionCallInfo fcinfo, int argno,
								 char parent[ZKL_PARENT_MAX], char **name);
extern int	zka_lock_names(FunctionCallInfo fcinfo, int argno, ZkaName **names);
extern int64 zka_timeout_ms(FunctionCallInfo fcinfo, int argno);
extern int	zka_slots(FunctionCallInfo fcinfo, int argno);

#endif							/* ZK_ARGS_H */
