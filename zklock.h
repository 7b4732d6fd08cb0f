/*-------------------------------------------------------------------------
 *
 * zklock.h
 *	  What the SQL-facing files share: argument handling, the session check
 *	  every call makes, and the backend's counters.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZKLOCK_H
#define ZKLOCK_H

#include "fmgr.h"

#include "zk_recipe.h"

/* This backend's counters, shown by zk_status(). */
typedef struct ZkStats
{
	int64		acquisitions;	/* holds granted, repeated acquires included */
	int64		waits;			/* acquisitions that queued behind another */
	int64		wait_time_us;	/* time spent in those waits */
	int64		timeouts;		/* timed waits that ran out */
	int64		cancellations;	/* waits ended by an error or interrupt */
} ZkStats;

extern ZkStats zk_stats;

extern void zkl_check_session(void);
extern void zkl_get_lock_parent(FunctionCallInfo fcinfo,
								char parent[ZKR_PARENT_MAX], char **name);
extern void zkl_get_semaphore_parent(FunctionCallInfo fcinfo,
									 char parent[ZKR_PARENT_MAX], char **name);
extern char *zkl_convert_lossy(const char *src, int len, int src_encoding,
							   int dest_encoding, bool hex_escape);

#endif							/* ZKLOCK_H */
