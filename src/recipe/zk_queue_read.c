/*-------------------------------------------------------------------------
 *
 * zk_queue_read.c
 *	  The one reader of a lock's or a semaphore's queue, for the recipe
 *	  (zk_recipe.c), deadlock detection (zk_deadlock.c) and the views
 *	  (zk_observe.c).
 *
 * A queue is read in up to three steps.  The listing of the parent is
 * parsed into contenders (zkqr_parse): children that are not contenders
 * are left out, and so, as asked, are the nodes this session is deleting
 * and strays of the caller's own attempt (a create applied after its reply
 * was lost), which are handed to the janitor.  Then, where the order needs
 * them (zkq_needs_czxid) or the caller wants them, every contender's stat
 * or data is read, in one pipeline (zkqr_read_contenders); a contender gone
 * since the listing is left out.  Last, if asked, the queue is ordered as
 * the queue rules describe it.  zkqr_read_queue does all three, sending
 * the listing itself; a missing parent is then an empty queue, whose order
 * and holds stay NULL.
 *
 * The recipe lists in ways of its own (behind its create, or from the
 * watcher's thread) and looks at its listing's answer itself, so it calls
 * the steps: when the lock is free, one parse of the listing it has, and
 * nothing is read.
 *
 * Every request sent is in the queue as soon as it is sent, so the
 * caller's error cleanup releases it with zkqr_release.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "recipe/zk_queue_read.h"

/* False at the deadline, or once the watch fired if that stops the read. */
static bool
await_reply(ZkRequest *req, const ZkqrOptions *options)
{
	return zks_await(req, options->deadline) &&
		(!options->stop_on_watch ||
		 zks_watch_generation() == options->generation);
}

/* Read child as a lock's or a semaphore's contender. */
static ZknForm
parse_contender(const char *child, ZknContender *contender,
				const ZkqrOptions *options)
{
	return options->semaphore ? zkn_parse_slot(child, contender) :
		zkn_parse_contender(child, contender);
}

/* Is child named as a node of the caller's attempt? */
static bool
is_of_attempt(const char *child, const ZkqrOptions *options)
{
	return options->semaphore ? zkn_is_slot_of(child, options->attempt) :
		zkn_is_node_of(child, options->attempt, options->shared);
}

/*
 * Is child a contender of the caller's attempt?  For the recipe's search
 * for its own node after a create's reply was lost.
 */
bool
zkqr_is_attempt_node(const char *child, const ZkqrOptions *options)
{
	ZknContender contender;

	return is_of_attempt(child, options) &&
		parse_contender(child, &contender, options) != ZKN_NOT_CONTENDER;
}

/* A second node of the caller's attempt: the janitor deletes it. */
static void
delete_stray(const char *parent, const char *child)
{
	char	   *stray = psprintf("%s/%s", parent, child);

	if (!zks_delete_later(stray))
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	pfree(stray);
}

/*
 * Parse the contenders of list, a successful listing of parent that the
 * caller keeps, into q, and say whether they must be ordered by czxid.
 */
void
zkqr_parse(ZkqrQueue *q, const char *parent, const ZkRequest *list,
		   const ZkqrOptions *options)
{
	int			i;

	Assert(!options->attempt || options->own);
	Assert(q->entries == NULL && q->reads == NULL);
	q->parent = parent;
	q->entries = palloc(Max(list->nchildren, 1) * sizeof(ZkqEntry));
	q->n = 0;
	q->own = -1;
	for (i = 0; i < list->nchildren; i++)
	{
		const char *child = list->children[i];
		ZkqEntry   *e = &q->entries[q->n];

		if (parse_contender(child, &e->contender, options) == ZKN_NOT_CONTENDER)
			continue;

		/*
		 * Our own node first: the caller gives an attempt's nodes up only
		 * after its last look at the queue (see ZkqrOptions.own), so it is
		 * never one this session is deleting, and the uncontended cycle asks
		 * the janitor nothing.
		 */
		if (options->attempt && is_of_attempt(child, options))
		{
			if (strcmp(child, options->own) != 0)
			{
				if (!(options->skip_deleting && zks_deleting(parent, child)))
					delete_stray(parent, child);
				continue;
			}
			Assert(!(options->skip_deleting && zks_deleting(parent, child)));
			q->own = q->n;
		}
		else if (options->skip_deleting && zks_deleting(parent, child))
			continue;
		e->name = child;
		e->czxid = 0;
		q->n++;
	}
	q->by_czxid = options->reads != ZKQR_STAT_IF_UNORDERED ||
		zkq_needs_czxid(q->entries, q->n,
						zkq_parent_creates(list->stat.cversion,
										   list->stat.numChildren));
}

/*
 * Read every parsed contender's stat, or its data, in one pipeline, all
 * but our own node, whose czxid the caller knows; set each one's czxid.
 * A contender gone meanwhile is left out: it left the queue.  Any other
 * failed read leaves the queue unknown, so the first is returned.
 */
ZkqrStatus
zkqr_read_contenders(ZkqrQueue *q, const ZkqrOptions *options)
{
	ZkqrStatus	status = ZKQR_DONE;
	int			kept = 0;
	int			i;

	q->reads = palloc0(Max(q->n, 1) * sizeof(ZkRequest *));
	for (i = 0; i < q->n; i++)
	{
		char	   *path;

		if (i == q->own)
			continue;
		path = psprintf("%s/%s", q->parent, q->entries[i].name);
		q->reads[i] = options->reads == ZKQR_DATA ? zks_get_data(path) :
			zks_exists(path);
		pfree(path);
	}
	for (i = 0; i < q->n; i++)
	{
		if (q->reads[i] && !await_reply(q->reads[i], options))
			return ZKQR_UNFINISHED;
	}

	for (i = 0; i < q->n; i++)
	{
		ZkRequest  *read = q->reads[i];

		if (i == q->own)
			q->entries[i].czxid = options->own_czxid;
		else if (read->rc == ZOK)
			q->entries[i].czxid = read->stat.czxid;
		else if (read->rc == ZNONODE)
		{
			zks_release_request(read);
			continue;
		}
		else if (status == ZKQR_DONE)
		{
			status = ZKQR_FAILED;
			q->failed_rc = read->rc;
			q->failed_name = q->entries[i].name;
		}
		if (i == q->own)
			q->own = kept;
		q->entries[kept] = q->entries[i];
		q->reads[kept++] = read;
	}
	q->n = kept;
	return status;
}

/*
 * The index in q of the contender named name, or -1 if the queue as read
 * has none: not listed, or left out.  For a caller looking at someone
 * else's node, such as the views at a waiter's; the recipe knows its own
 * as ZkqrQueue.own.
 */
int
zkqr_find(const ZkqrQueue *q, const char *name)
{
	int			i;

	for (i = 0; i < q->n; i++)
		if (strcmp(q->entries[i].name, name) == 0)
			return i;
	return -1;
}

/* Fill in q->order and q->holds, as the queue rules describe the queue. */
static void
order_queue(ZkqrQueue *q, const ZkqrOptions *options)
{
	bool		described;

	q->order = palloc(Max(q->n, 1) * sizeof(int));
	q->holds = palloc(Max(q->n, 1) * sizeof(bool));
	if (options->semaphore)
		described = zkq_slot_describe(q->entries, q->n, q->by_czxid, q->order,
									  q->holds);
	else
		described = zkq_describe(q->entries, q->n, q->by_czxid, q->order,
								 q->holds);
	if (!described)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
}

/*
 * List parent and read its queue into q, as options say.  A parent that
 * is gone is a queue with no one in it.
 */
ZkqrStatus
zkqr_read_queue(ZkqrQueue *q, const char *parent, const ZkqrOptions *options)
{
	ZkqrStatus	status = ZKQR_DONE;

	q->parent = parent;
	q->own = -1;
	q->list = zks_get_children(parent);
	if (!await_reply(q->list, options))
		return ZKQR_UNFINISHED;
	if (q->list->rc == ZNONODE)
		return ZKQR_DONE;
	if (q->list->rc != ZOK)
	{
		q->failed_rc = q->list->rc;
		return ZKQR_FAILED;
	}
	zkqr_parse(q, parent, q->list, options);
	if (q->by_czxid)
		status = zkqr_read_contenders(q, options);
	if (status == ZKQR_DONE && options->order)
		order_queue(q, options);
	return status;
}

/* Release every request of the queue, free what it holds, and zero it. */
void
zkqr_release(ZkqrQueue *q)
{
	int			i;

	if (q->reads)
	{
		for (i = 0; i < q->n; i++)
			zks_release_request(q->reads[i]);
		pfree(q->reads);
	}
	if (q->list)
		zks_release_request(q->list);
	if (q->entries)
		pfree(q->entries);
	if (q->order)
		pfree(q->order);
	if (q->holds)
		pfree(q->holds);
	memset(q, 0, sizeof(ZkqrQueue));
}
