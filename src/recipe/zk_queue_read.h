/*-------------------------------------------------------------------------
 *
 * zk_queue_read.h
 *	  Reading a lock's or a semaphore's queue from ZooKeeper: the listing of
 *	  its parent, parsed into the contenders the queue rules (zk_queue.h)
 *	  take, and each contender's stat or data where asked, in one pipeline.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_QUEUE_READ_H
#define ZK_QUEUE_READ_H

#include "recipe/zk_queue.h"
#include "session/zk_session.h"

/* What is read of each contender after the listing. */
typedef enum ZkqrReads
{
	ZKQR_STAT_IF_UNORDERED,		/* its stat, only if sequence numbers cannot
								 * order the queue (zkq_needs_czxid) */
	ZKQR_STAT,					/* its stat: czxid and ephemeralOwner */
	ZKQR_DATA					/* its data, and its stat */
} ZkqrReads;

typedef struct ZkqrOptions
{
	bool		semaphore;		/* a semaphore's slots, not a lock's contenders */
	ZkqrReads	reads;

	/*
	 * The caller's own attempt, in the recipe (NULL: none): its node own is
	 * found as ZkqrQueue.own and never read (its czxid is own_czxid); any
	 * other node of the attempt is a stray, given to the janitor and left
	 * out.  The caller promises to give own up only after its last read of
	 * the queue, so own is never a node this session is deleting.
	 */
	const char *attempt;		/* the attempt's uuid */
	bool		shared;			/* and its mode */
	const char *own;
	int64		own_czxid;

	bool		skip_deleting;	/* leave out nodes this session is deleting */
	bool		order;			/* fill in ZkqrQueue.order and .holds */
	TimestampTz deadline;		/* for every reply; 0: none */
	bool		stop_on_watch;	/* stop once the watch of generation fires */
	uint64		generation;
} ZkqrOptions;

/*
 * One queue as read.  It starts zeroed, owns its requests until
 * zkqr_release, which the caller's error cleanup must call too, and is
 * zeroed again by it.
 */
typedef struct ZkqrQueue
{
	const char *parent;
	ZkRequest  *list;			/* the listing, if zkqr_read_queue sent it */
	ZkqEntry   *entries;		/* the contenders, in listing order */
	ZkRequest **reads;			/* entries[i]'s read, once read; own's NULL */
	int			n;
	int			own;			/* the index of options->own; -1: not listed */
	bool		by_czxid;		/* ordered by czxid, so they are read */
	int		   *order;			/* with options->order: the indexes in
								 * queue order */
	bool	   *holds;			/* ... and which contenders hold */
	int			failed_rc;		/* ZKQR_FAILED: ZooKeeper's answer ... */
	const char *failed_name;	/* ... to this contender's read; NULL: to
								 * the listing */
} ZkqrQueue;

typedef enum ZkqrStatus
{
	ZKQR_DONE,
	ZKQR_UNFINISHED,			/* the deadline passed, or the watch fired */
	ZKQR_FAILED					/* a request failed: see failed_rc */
} ZkqrStatus;

extern ZkqrStatus zkqr_read_queue(ZkqrQueue *q, const char *parent,
								  const ZkqrOptions *options);
extern void zkqr_parse(ZkqrQueue *q, const char *parent,
					   const ZkRequest *list, const ZkqrOptions *options);
extern ZkqrStatus zkqr_read_contenders(ZkqrQueue *q, const ZkqrOptions *options);
extern int	zkqr_find(const ZkqrQueue *q, const char *name);
extern bool zkqr_is_attempt_node(const char *child,
								 const ZkqrOptions *options);
extern void zkqr_release(ZkqrQueue *q);

#endif							/* ZK_QUEUE_READ_H */
