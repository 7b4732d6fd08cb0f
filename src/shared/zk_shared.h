/*-------------------------------------------------------------------------
 *
 * zk_shared.h
 *	  What each backend shows the rest of its server in shared memory: its
 *	  zklock holds, its current wait, its session's state, and per-lock
 *	  statistics; and the backend's own counters.  A wait is shown in the
 *	  process title too (zk_title.c), by the same calls: zksh_wait_begin
 *	  when a lock call starts, zksh_wait_node once it waits in the queue,
 *	  zksh_wait_end however it ends.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_SHARED_H
#define ZK_SHARED_H

#include "datatype/timestamp.h"

#include "base/zk_layout.h"

/* One hold of a backend, as shown server-wide (one per name and mode). */
typedef struct ZkshHold
{
	int			pid;
	Oid			role;			/* who took the slot: a role's share is capped */
	Oid			database;
	char		name[ZKN_NAME_MAX + 1];	/* UTF-8 */
	bool		shared;
	bool		semaphore;		/* a semaphore's slot */
	bool		lost;
	int			session_count;
	int			xact_count;
	int64		token;
	TimestampTz since;
	/*
	 * With no holds: 1 while the node is kept after its release
	 * (zklock.keep_released), written by whoever keeps or gives it up, the
	 * client library's threads included; 0 once given up.
	 */
	pg_atomic_uint32 kept;
	char		node[ZKL_NODE_MAX];
} ZkshHold;

/* A backend's wait, as shown server-wide. */
typedef struct ZkshWait
{
	int			pid;
	Oid			database;
	char		name[ZKN_NAME_MAX + 1];	/* UTF-8 */
	bool		shared;
	bool		semaphore;		/* for a semaphore's slot */
	bool		xact;
	TimestampTz since;
	char		node[ZKL_NODE_MAX];	/* "" until the waiting node is made */
} ZkshWait;

/* A backend's ZooKeeper session, as shown server-wide. */
typedef struct ZkshSession
{
	int			pid;
	Oid			database;
	uint32		state;			/* ZKS_SHOWN_CLOSED, or ZKS_SHOWN_OPEN + ZksState */
	TimestampTz since;			/* when it took that state */
} ZkshSession;

/*
 * The upper bounds, in ms, of the wait-time histogram's buckets: each bucket
 * counts the waits that ended within its bound and above the one before.
 */
#define ZKSH_WAIT_BUCKETS 7
extern const int zksh_wait_bounds_ms[ZKSH_WAIT_BUCKETS];

/* The same for the hold-time histogram, whose holds last longer. */
#define ZKSH_HOLD_BUCKETS 8
extern const int zksh_hold_bounds_ms[ZKSH_HOLD_BUCKETS];

/*
 * The counters, per lock and per backend.  A histogram's buckets are
 * consecutive members.  Adding one: a member here, zksh_count where it
 * happens, and its column in zklock--1.0.sql and in zk_observe.c's
 * stat_columns, which says how zk_stat_locks shows it.
 */
typedef enum ZkshCounter
{
	ZKSH_ACQUISITIONS,
	ZKSH_WAITS,
	ZKSH_WAIT_TIME_US,
	ZKSH_TIMEOUTS,
	ZKSH_CANCELLATIONS,
	ZKSH_DEADLOCKS,
	ZKSH_LOSSES,
	ZKSH_WAIT_BUCKET,			/* the first of ZKSH_WAIT_BUCKETS */
	ZKSH_RELEASES = ZKSH_WAIT_BUCKET + ZKSH_WAIT_BUCKETS,
	ZKSH_HOLD_TIME_US,
	ZKSH_HOLD_BUCKET,			/* the first of ZKSH_HOLD_BUCKETS */
	ZKSH_KEPT_ACQUISITIONS = ZKSH_HOLD_BUCKET + ZKSH_HOLD_BUCKETS,
	ZKSH_NCOUNTERS
} ZkshCounter;

/* Per-lock statistics, as shown by zk_stat_locks. */
typedef struct ZkshStats
{
	char		name[ZKN_NAME_MAX + 1];	/* UTF-8 */
	int64		counters[ZKSH_NCOUNTERS];
} ZkshStats;

extern void zksh_define_settings(void);
extern void zksh_request_shmem(void);
extern bool zksh_enabled(void);

extern void zksh_name_of(const char *parent, char name[ZKN_NAME_MAX + 1]);

extern int	zksh_put_hold(int slot, const char *parent, bool shared,
						  bool semaphore, bool lost, int session_count,
						  int xact_count, const char *node, int64 token,
						  TimestampTz since);
extern void zksh_drop_hold(int slot);
extern pg_atomic_uint32 *zksh_keep_hold(int slot);

extern void zksh_show_session(void);

extern void zksh_wait_begin(const char *parent, const char *name, bool shared,
							bool semaphore, bool xact);
extern void zksh_wait_node(const char *node);
extern void zksh_wait_end(void);

extern void zksh_count(const char *parent, bool semaphore, ZkshCounter counter,
					   int64 amount);
extern void zksh_count_wait(const char *parent, bool semaphore, int64 wait_us);
extern int64 zksh_backend_count(ZkshCounter counter);

extern int	zksh_holds(ZkshHold **holds);
extern int	zksh_waits(ZkshWait **waits);
extern int	zksh_sessions(ZkshSession **sessions);
extern bool zksh_wait_of(int pid, ZkshWait *wait);
extern int	zksh_stats(ZkshStats **stats);
extern void zksh_reset_stats(void);

#endif							/* ZK_SHARED_H */
