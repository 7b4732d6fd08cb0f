/*-------------------------------------------------------------------------
 *
 * zk_queue.h
 *	  The rules of a lock's queue: in which order its contenders stand, who
 *	  holds the lock, and whom a contender must wait for.
 *
 * Nothing here depends on PostgreSQL or on the client library, so the same
 * code can be linked into small test and fuzzing harnesses.  It allocates
 * with malloc and reports running out instead of failing.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_QUEUE_H
#define ZK_QUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/zk_names.h"

/*
 * A holder's nodes share the first ZKQ_OWNER_LEN characters of their uuid
 * ("xxxxxxxx-xxxx-4xxx-yxxx"); the rest is drawn anew for every node, so
 * each node names one attempt to acquire.
 */
#define ZKQ_OWNER_LEN		23

/* One contender node of a listing. */
typedef struct ZkqEntry
{
	const char *name;			/* the child's name */
	ZknContender contender;		/* as parsed from the name */
	int64_t		czxid;			/* its creation's zxid, when known */
} ZkqEntry;

typedef enum ZkqVerdict
{
	ZKQ_HOLDS,					/* the contender holds the lock */
	ZKQ_WAIT,					/* wait for the node given */
	ZKQ_REQUEUE,				/* queue again: see zk_queue.c */
	ZKQ_NO_MEMORY
} ZkqVerdict;

/*
 * Up to this many creates under a parent, its children's sequence numbers
 * are in creation order (zkq_needs_czxid).
 */
#define ZKQ_TRUSTED_CREATES		(1 << 30)

extern int64_t zkq_parent_creates(int32_t cversion, int32_t num_children);
extern bool zkq_needs_czxid(const ZkqEntry *entries, int n,
							int64_t parent_creates);
extern ZkqVerdict zkq_decide(const ZkqEntry *entries, int n, int own,
							 bool by_czxid, int *watch);
extern bool zkq_holds_without(const ZkqEntry *entries, int n, int own,
							  int gone, bool by_czxid);
extern int	zkq_blockers(const ZkqEntry *entries, int n, int own,
						 bool by_czxid, int *blockers);
extern bool zkq_describe(const ZkqEntry *entries, int n, bool by_czxid,
						 int *order, bool *holds);
extern ZkqVerdict zkq_slot_decide(const ZkqEntry *entries, int n, int own,
								  bool by_czxid, int *watch, int *nwatch,
								  bool *first_waiter);
extern int	zkq_slot_blockers(const ZkqEntry *entries, int n, int own,
							  bool by_czxid, int *blockers);
extern bool zkq_slot_describe(const ZkqEntry *entries, int n, bool by_czxid,
							  int *order, bool *holds);

#endif							/* ZK_QUEUE_H */
