/*-------------------------------------------------------------------------
 *
 * zk_recipe.c
 *	  The lock recipe, exclusive and shared, run inside the backend.
 *
 * To acquire, create "<parent>/_c_<uuid>-lock-" as an ephemeral sequential
 * node (Curator's InterProcessMutex format, so Curator and kazoo clients
 * share the queue; a shared contender is "_c_<uuid>-read-lock-", which
 * peers' exclusive locks still see as a contender) and, without waiting,
 * list the parent.  One session's requests are applied in order, so the
 * listing already contains the new node and acquiring costs one round trip
 * when the lock is free.  The queue rules (zk_queue.c) then say whether we
 * hold the lock or whom to wait for: a get-data watch on that one node
 * only, after which we list again, because the node may have been a waiter
 * that gave up rather than the holder.  The watcher sends that listing
 * itself, from the library's thread, so a handoff does not wait for the
 * backend to wake up before its read.  The queue reader (zk_queue_read.c)
 * parses the listing, and, when its sequence numbers cannot order the
 * queue (the server's counter wrapped), reads each contender's czxid too.
 *
 * A handoff without the listing.  An exclusive waiter with no other node on
 * the name, whose last listing showed only zklock-named contenders and
 * nothing but the watched node that it must wait for (zkq_holds_without),
 * is granted by that node's deletion alone: whatever is created later
 * stands behind it.  Two things a listing would have caught are watched
 * instead.  Its own node may be deleted under it (by hand): it watches that
 * node too, before the predecessor, so the news of its going comes first
 * and forces the listing.  And a reconnect may hide anything: a deletion
 * seen across one is not trusted.  Shared waiters, semaphores and queues
 * with other clients' nodes keep the listing.  The rule trusts the server's
 * numbering: a node made by hand after our listing with a name in zklock's
 * form and a number the server did not give (or a marker and no number)
 * is not seen until the next listing.  Only a client that may write under
 * the lock's parent can make one, and such a client can break any lock by
 * deleting its holder's node (docs/security.md).
 *
 * Every attempt has a fresh uuid, kept across its retries; a node of the
 * other mode taken while the first is held shares the holder part of the
 * first's uuid (zk_queue.c).  A waiter that must queue again (zk_queue.c)
 * starts a new attempt.
 * After a connection loss during create, the node is looked for by that
 * uuid and adopted only if its ephemeralOwner is our session.  Any second
 * node carrying the uuid (a create applied after we gave up on its reply) is
 * deleted when seen.
 *
 * Every way out other than being granted hands the node to the janitor in
 * zk_janitor.c, which deletes it even across a reconnect, and waits a
 * bounded time for that to be done.  A sweep by uuid covers a create whose
 * reply never came.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/pg_prng.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "recipe/zk_acl_check.h"
#include "recipe/zk_deadlock.h"
#include "recipe/zk_queue.h"
#include "recipe/zk_queue_read.h"
#include "recipe/zk_recipe.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

/* Ancestors of a lock parent that we may have to create. */
#define MAX_PATH_DEPTH		32

/* Everything an acquisition must clean up if it does not end granted. */
typedef struct Acquisition
{
	const char *parent;
	char		guid[ZKN_GUID_LEN + 1];
	char		prefix[ZKL_NODE_MAX];
	ZkLockNode *node;			/* path[0] is '\0' until a node is ours */
	const char *data;			/* the node data: who holds */
	bool		shared;
	int			slots;			/* a semaphore's size as asked; 0: a lock */
	TimestampTz deadline;		/* 0: none */
	bool		waited;			/* had to wait behind another contender */
	TimestampTz deadlock_check_at;	/* 0: no deadlock check due */
	int			deadlock_backoff;	/* checks put off since the last done */
	bool		deadlock_too_large; /* said so in the log, for this wait */
	ZkdWait		published;		/* our wait, once published for that check */
	bool		timed_out;		/* the deadline passed */
	bool		reply_lost;		/* a create may have been applied unseen */
	ZkRequest  *create;
	ZkRequest  *list;
	ZkRequest  *watch;
	ZkqrOptions read_options;	/* how decide reads the queue */
	ZkqrQueue	queue;			/* what it read, while it decides */
	ZkRequest **holder_watches; /* a semaphore's first waiter's, in flight */
	int			nholder_watches;
	ZkRequest  *path_creates[MAX_PATH_DEPTH];
	int			npath_creates;
	char	  **watched;		/* a semaphore's first waiter: its watches */
	int			nwatched;
	bool		followed;		/* someone queued behind our node */
	char	   *relisted_for;	/* a semaphore's predecessor ... */
	int32		relisted_version;	/* ... and data version listed again for */
	bool		has_other;		/* we have a node of the other mode */
	uint64		listed_at;		/* connection count as the listing was read */
	bool		deletion_decides;	/* the watched node's going grants us */
	ZkRequest  *own_watch;		/* the watch on our own node, if set */
	bool		own_watched;	/* a watch may be left on our own node */
} Acquisition;

static void
release_request(ZkRequest **req)
{
	zks_release_request(*req);
	*req = NULL;
}

static void
release_holder_watches(Acquisition *acq)
{
	int			i;

	for (i = 0; i < acq->nholder_watches; i++)
		release_request(&acq->holder_watches[i]);
	if (acq->holder_watches)
		pfree(acq->holder_watches);
	acq->holder_watches = NULL;
	acq->nholder_watches = 0;
}

/* The waits of an acquisition: false, and timed_out, at the deadline. */

static bool
await_reply(Acquisition *acq, ZkRequest *req)
{
	if (zks_await(req, acq->deadline))
		return true;
	acq->timed_out = true;
	return false;
}

static bool
await_connected(Acquisition *acq)
{
	if (zks_await_connected(acq->deadline))
		return true;
	acq->timed_out = true;
	return false;
}

/*
 * Start the deadlock timer for a wait that begins now (the first one of
 * this attempt); zklock.deadlock_timeout = 0 turns it off.
 */
static void
start_deadlock_timer(Acquisition *acq)
{
	if (acq->deadlock_check_at == 0 && acq->published.path[0] == '\0' &&
		zklock_deadlock_timeout > 0)
		acq->deadlock_check_at =
			TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										zklock_deadlock_timeout);
}

/* A check put off this many times waits, and may take, 64 times as long. */
#define MAX_DEADLOCK_BACKOFF	6

/* The longest a deadlock check may take, unless connect_timeout is longer. */
#define MAX_DEADLOCK_CHECK_MS	60000

/*
 * A deadlock check could not finish: in time (the ensemble is slow or the
 * graph large), or because a cycle it saw did not hold; or the graph had
 * more waiting sessions than a check follows, which is said once per wait.
 * Check again ever less often, twice the time each time up to 64
 * deadlock_timeouts, so that checks that cannot finish do not load the
 * ensemble without end; each such check may take as many times
 * zklock.connect_timeout (up to a minute, or connect_timeout if longer),
 * so that one that did not fit in its time fits at last.  A check that
 * stopped because our watch fired says nothing of the load: the wait
 * looks at its queue at once, and the next check comes as it would have.
 */
static void
check_again_later(Acquisition *acq, bool too_large, bool watch_fired)
{
	if (too_large && !acq->deadlock_too_large)
		ereport(LOG,
				(errmsg("zklock deadlock check put off: the wait-for graph has more waiting sessions than it follows"),
				 errdetail("Lock node \"%s\".", acq->node->path)));
	acq->deadlock_too_large |= too_large;
	if (!watch_fired)
		acq->deadlock_backoff = Min(acq->deadlock_backoff + 1,
									MAX_DEADLOCK_BACKOFF);
	acq->deadlock_check_at =
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									(int64) zklock_deadlock_timeout << acq->deadlock_backoff);
}

/*
 * Wait for the watch; on the way, once deadlock_timeout has passed, check
 * for a deadlock (zk_deadlock.c), which may end the wait with an ERROR.  A
 * check that could not finish is tried again later (check_again_later).
 */
static bool
await_watch(Acquisition *acq, uint64 generation)
{
	for (;;)
	{
		TimestampTz until = acq->deadline;
		TimestampTz check_deadline;
		int64		check_ms;

		if (acq->deadlock_check_at != 0 &&
			(until == 0 || acq->deadlock_check_at < until))
			until = acq->deadlock_check_at;
		if (zks_await_watch(generation, until))
			return true;
		if (until == acq->deadline)
		{
			acq->timed_out = true;
			return false;
		}
		check_ms = (int64) (zkd_test_check_ms > 0 ? zkd_test_check_ms :
							zklock_connect_timeout) << acq->deadlock_backoff;
		check_ms = Min(check_ms, Max(MAX_DEADLOCK_CHECK_MS, zklock_connect_timeout));
		check_deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), check_ms);
		if (acq->deadline != 0 && acq->deadline < check_deadline)
			check_deadline = acq->deadline;
		acq->deadlock_check_at = 0;
		switch (zkd_check(acq->parent, acq->node->path, acq->data,
						  &acq->published, check_deadline, generation))
		{
			case ZKD_DONE:
				acq->deadlock_backoff = 0;
				break;
			case ZKD_AGAIN:
				check_again_later(acq, false,
								  zks_watch_generation() != generation);
				break;
			case ZKD_TOO_LARGE:
				check_again_later(acq, true, false);
				break;
		}
	}
}

/*
 * A fresh uuid for an attempt, beginning with owner's first ZKQ_OWNER_LEN
 * characters if given: a holder's nodes on one name share those (see
 * zk_queue.c), and every attempt is told apart by the rest.  Node ids need
 * to be unique, not secret: they are drawn from a generator seeded once
 * per backend from the strong source, which costs a fraction of asking
 * that source for every acquisition.
 */
static void
make_guid(char guid[ZKN_GUID_LEN + 1], const char *owner)
{
	static pg_prng_state guid_state;
	static bool guid_state_seeded = false;
	static const char hex[] = "0123456789abcdef";
	uint8		bytes[16];
	uint64		half;
	char	   *out = guid;
	int			i;

	if (!guid_state_seeded)
	{
		if (!pg_prng_strong_seed(&guid_state))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate a random lock node id")));
		guid_state_seeded = true;
	}
	half = pg_prng_uint64(&guid_state);
	memcpy(bytes, &half, 8);
	half = pg_prng_uint64(&guid_state);
	memcpy(bytes + 8, &half, 8);
	/* RFC 4122 version 4, lowercase, as Curator writes it. */
	bytes[6] = (bytes[6] & 0x0f) | 0x40;
	bytes[8] = (bytes[8] & 0x3f) | 0x80;
	for (i = 0; i < 16; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*out++ = '-';
		*out++ = hex[bytes[i] >> 4];
		*out++ = hex[bytes[i] & 0x0f];
	}
	*out = '\0';
	Assert(out - guid == ZKN_GUID_LEN);
	if (owner)
		memcpy(guid, owner, ZKQ_OWNER_LEN);
}

/* Start an attempt: a new uuid and the node path prefix that goes with it. */
static void
new_attempt(Acquisition *acq, const char *owner)
{
	make_guid(acq->guid, owner);
	if (acq->slots > 0)
		snprintf(acq->prefix, sizeof(acq->prefix), "%s/_c_%s-sem%d-",
				 acq->parent, acq->guid, acq->slots);
	else
	{
		/* Every lock acquisition builds one; snprintf costs more. */
		size_t		plen = strlen(acq->parent);
		const char *marker = acq->shared ? "-read-lock-" : "-lock-";
		char	   *p = acq->prefix;

		Assert(plen + 4 + ZKN_GUID_LEN + strlen(marker) < sizeof(acq->prefix));
		memcpy(p, acq->parent, plen);
		p += plen;
		memcpy(p, "/_c_", 4);
		p += 4;
		memcpy(p, acq->guid, ZKN_GUID_LEN);
		p += ZKN_GUID_LEN;
		strcpy(p, marker);
	}
}

/* Copy a node path the server returned; every acquisition does once. */
static void
copy_path(char dest[ZKL_NODE_MAX], const char *path)
{
	size_t		len = strlen(path);

	if (len >= ZKL_NODE_MAX)
		elog(ERROR, "zklock node path too long: \"%s\"", path);
	memcpy(dest, path, len + 1);
}

/*
 * The parent (a container, so the server reaps it once unused) or the root
 * above it is missing.  Create the root's components and the parent in one
 * pipeline; those that exist already just answer ZNODEEXISTS.  Returns
 * false at the deadline.
 */
static bool
create_parent_path(Acquisition *acq)
{
	char		path[ZKL_PARENT_MAX];
	const char *slash;
	int			i;

	for (slash = strchr(acq->parent + 1, '/'); slash;
		 slash = strchr(slash + 1, '/'))
	{
		if (acq->npath_creates >= MAX_PATH_DEPTH - 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("zklock.root has too many levels")));
		memcpy(path, acq->parent, slash - acq->parent);
		path[slash - acq->parent] = '\0';
		acq->path_creates[acq->npath_creates++] =
			zks_create(path, NULL, -1, ZOO_PERSISTENT);
	}
	acq->path_creates[acq->npath_creates++] =
		zks_create(acq->parent, NULL, -1, ZOO_CONTAINER);

	for (i = 0; i < acq->npath_creates; i++)
	{
		ZkRequest  *req = acq->path_creates[i];

		if (!await_reply(acq, req))
			return false;
		if (req->rc == ZOK)
			zkac_created(req->path, &req->stat);
		else if (req->rc != ZNODEEXISTS && !zks_is_retryable(req->rc))
			zks_report_error(req->rc, ZKS_CREATE, acq->parent);
	}
	for (i = 0; i < acq->npath_creates; i++)
		release_request(&acq->path_creates[i]);
	acq->npath_creates = 0;
	return true;
}

typedef enum Search
{
	SEARCH_FOUND,
	SEARCH_NOT_FOUND,
	SEARCH_TIMED_OUT
} Search;

/*
 * After a create whose reply was lost, look for the node by our uuid and
 * adopt it only if this session owns it: a node left by an expired session
 * is about to vanish.  The listing is synced, since the server we are now
 * connected to may not have seen the create yet.
 */
static Search
find_own_node(Acquisition *acq)
{
	char		found[ZKL_NODE_MAX] = "";
	int			i;
	int			rc;

	acq->list = zks_get_children_synced(acq->parent);
	if (!await_reply(acq, acq->list))
		return SEARCH_TIMED_OUT;
	rc = acq->list->rc;
	for (i = 0; rc == ZOK && i < acq->list->nchildren && found[0] == '\0'; i++)
	{
		const char *child = acq->list->children[i];

		/* Any second node of ours is deleted as a stray when listed. */
		if (zkqr_is_attempt_node(child, &acq->read_options) &&
			strlen(acq->parent) + 1 + strlen(child) < sizeof(found))
			snprintf(found, sizeof(found), "%s/%s", acq->parent, child);
	}
	release_request(&acq->list);
	if (found[0] == '\0')
		return SEARCH_NOT_FOUND;

	acq->create = zks_exists(found);
	if (!await_reply(acq, acq->create))
		return SEARCH_TIMED_OUT;
	if (acq->create->rc == ZOK &&
		acq->create->stat.ephemeralOwner == zks_session_id())
	{
		strlcpy(acq->node->path, found, sizeof(acq->node->path));
		acq->node->czxid = acq->create->stat.czxid;
	}
	release_request(&acq->create);
	return acq->node->path[0] != '\0' ? SEARCH_FOUND : SEARCH_NOT_FOUND;
}

/*
 * Create our contender node and send the first listing right behind it.
 * Returns false at the deadline.
 */
static bool
create_node(Acquisition *acq)
{
	int			missing_parent = 0;

	zks_check_node_budget(acq->prefix);
	for (;;)
	{
		int			rc;

		acq->create = zks_create(acq->prefix, acq->data, strlen(acq->data),
								 ZOO_EPHEMERAL_SEQUENTIAL);
		acq->list = zks_get_children(acq->parent);

		/*
		 * Replies come in order, so awaiting the listing's first saves a
		 * second wake-up when the two arrive apart.
		 */
		if (!await_reply(acq, acq->list) || !await_reply(acq, acq->create))
			return false;
		rc = acq->create->rc;
		if (rc == ZOK)
		{
			copy_path(acq->node->path, acq->create->path);
			acq->node->czxid = acq->create->stat.czxid;
			release_request(&acq->create);
			return true;
		}
		release_request(&acq->create);
		release_request(&acq->list);

		/* Only a refusal by the server proves no node was made. */
		if (rc != ZNONODE && rc != ZNOAUTH && rc != ZBADARGUMENTS &&
			rc != ZINVALIDACL)
			acq->reply_lost = true;

		if (rc == ZNONODE && ++missing_parent <= 3)
		{
			if (!create_parent_path(acq))
				return false;
		}
		else if (zks_is_retryable(rc))
		{
			if (!await_connected(acq))
				return false;
			switch (find_own_node(acq))
			{
				case SEARCH_FOUND:
					return true;
				case SEARCH_TIMED_OUT:
					return false;
				case SEARCH_NOT_FOUND:
					break;
			}
		}
		else
			zks_report_error(rc, ZKS_CREATE, acq->prefix);
	}
}

pg_noreturn static void report_node_gone(Acquisition *acq);

/* Our node, or its whole parent, is gone from under us. */
static void
report_node_gone(Acquisition *acq)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("zklock lock node \"%s\" disappeared while waiting",
					acq->node->path),
			 errdetail("The ZooKeeper session was lost or another client deleted the node.")));
}

/* Are all contenders named as zklock names them (zkn_has_zklock_form)? */
static bool
all_zklock_named(const ZkqEntry *entries, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (!zkn_has_zklock_form(entries[i].name))
			return false;
	return true;
}

/*
 * From the listing in acq->list, decide by the queue rules (zk_queue.c)
 * whether we hold the lock, must wait (for the nodes whose palloc'd paths
 * are in *watches: the predecessor, or every holder for the first waiter
 * of a semaphore, *first_waiter set) or must queue again.  Returns false if
 * the listing must be taken again, or at the deadline (timed_out set).
 */
static bool
decide(Acquisition *acq, ZkqVerdict *verdict, char ***watches, int *nwatch,
	   bool *first_waiter)
{
	ZkqrQueue  *q = &acq->queue;
	ZkqrStatus	reading = ZKQR_DONE;
	int			i;

	acq->read_options.own = zkl_basename(acq->node->path);
	acq->read_options.own_czxid = acq->node->czxid;
	zkqr_parse(q, acq->parent, acq->list, &acq->read_options);
	if (q->own < 0)
		report_node_gone(acq);
	if (q->entries[q->own].contender.form != ZKN_SEQUENCED &&
		q->entries[q->own].contender.form != ZKN_WRAPPED)
		elog(ERROR, "zklock created a node with an unexpected name: \"%s\"",
			 acq->node->path);

	/* Only a queue whose sequence numbers cannot order it costs reads. */
	if (q->by_czxid)
		reading = zkqr_read_contenders(q, &acq->read_options);
	if (reading == ZKQR_FAILED && !zks_is_retryable(q->failed_rc))
		zks_report_error(q->failed_rc, ZKS_CHECK, q->failed_name);
	*nwatch = 0;
	*first_waiter = false;
	if (reading == ZKQR_DONE)
	{
		const ZkqEntry *entries = q->entries;
		int			n = q->n;
		int			own = q->own;
		bool		by_czxid = q->by_czxid;
		int		   *watch = palloc(Max(n, 1) * sizeof(int));

		if (acq->slots > 0)
		{
			*verdict = zkq_slot_decide(entries, n, own, by_czxid, watch, nwatch,
									   first_waiter);
			acq->followed = false;
			for (i = 0; i < n; i++)
				acq->followed |= i != own &&
					(by_czxid ? entries[i].czxid > entries[own].czxid :
					 entries[i].contender.sequence > entries[own].contender.sequence);
		}
		else
		{
			*verdict = zkq_decide(entries, n, own, by_czxid, watch);
			*nwatch = *verdict == ZKQ_WAIT ? 1 : 0;
			acq->deletion_decides = *verdict == ZKQ_WAIT && !acq->shared &&
				!acq->has_other && all_zklock_named(entries, n) &&
				zkq_holds_without(entries, n, own, watch[0], by_czxid);
		}
		if (*verdict == ZKQ_NO_MEMORY)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		*watches = palloc(Max(*nwatch, 1) * sizeof(char *));
		for (i = 0; i < *nwatch; i++)
			(*watches)[i] = psprintf("%s/%s", acq->parent, entries[watch[i]].name);
		pfree(watch);
	}
	zkqr_release(q);
	if (reading == ZKQR_UNFINISHED)
		acq->timed_out = true;
	return reading == ZKQR_DONE;
}

static void
free_watches(char **watches, int nwatch)
{
	int			i;

	for (i = 0; i < nwatch; i++)
		pfree(watches[i]);
	pfree(watches);
}

/* Take back the watches left on a semaphore's holders. */
static void
unwatch_all(Acquisition *acq)
{
	int			i;

	for (i = 0; i < acq->nwatched; i++)
	{
		zks_remove_watch(acq->watched[i]);
		pfree(acq->watched[i]);
	}
	if (acq->watched)
		pfree(acq->watched);
	acq->watched = NULL;
	acq->nwatched = 0;
}

/*
 * As a semaphore's first waiter, watch every holder (the paths in watches,
 * which we take over) and wait until one goes.  Returns false at the
 * deadline.
 */
static bool
watch_all(Acquisition *acq, char **watches, int nwatch)
{
	uint64		generation = zks_watch_generation();
	bool		gone = false;
	bool		disconnected = false;
	int			i;

	unwatch_all(acq);
	/* Recorded first, so that an error while sending still takes all back. */
	acq->watched = watches;
	acq->nwatched = nwatch;
	acq->holder_watches = palloc0(nwatch * sizeof(ZkRequest *));
	acq->nholder_watches = nwatch;
	for (i = 0; i < nwatch; i++)
		acq->holder_watches[i] = zks_watch_data(watches[i]);
	for (i = 0; i < nwatch; i++)
	{
		int			rc;

		if (!await_reply(acq, acq->holder_watches[i]))
			return false;
		rc = acq->holder_watches[i]->rc;
		if (rc == ZNONODE)
			gone = true;
		else if (zks_is_retryable(rc))
			disconnected = true;
		else if (rc != ZOK)
			zks_report_error(rc, ZKS_WATCH, watches[i]);
	}
	release_holder_watches(acq);
	/* One went already, or the connection did: list again. */
	if (disconnected)
		return await_connected(acq);
	if (gone)
		return true;
	return await_watch(acq, generation);
}

/*
 * We hold a slot of a semaphore.  Take back the watches on the holders we
 * watched as the first waiter, and, if anyone stands behind us in the
 * listing that granted us, change our node's data: that one may have seen
 * us waiting and be watching us, and is now the first waiter.  This is done
 * even when we did not wait ourselves: another client's listing, or our own
 * taken late after a lost reply, may have shown us waiting.  Anyone queued
 * after that listing sees us holding and does not need the signal.
 * Returns false at the deadline.
 */
static bool
hand_on(Acquisition *acq)
{
	unwatch_all(acq);
	while (acq->followed)
	{
		ZkRequest  *set = zks_set_data(acq->node->path, acq->data,
									   strlen(acq->data));
		int			rc;

		if (!await_reply(acq, set))
		{
			release_request(&set);
			return false;
		}
		rc = set->rc;
		release_request(&set);
		if (rc == ZOK)
			break;
		if (!zks_is_retryable(rc))
			zks_report_error(rc, ZKS_SET_DATA, acq->node->path);
		if (!await_connected(acq))
			return false;
	}
	return true;
}

/*
 * The node we watched is gone: does that grant us the lock?  If the last
 * listing said so (deletion_decides), no reconnect came since it was read
 * (the queue may have changed unseen), and the session is connected and
 * not lost now.  Said at DEBUG2, so a test can tell which way a grant came.
 */
static bool
granted_by_deletion(Acquisition *acq)
{
	if (!acq->deletion_decides ||
		zks_connection_count() != acq->listed_at ||
		zks_state() != ZKS_CONNECTED)
		return false;
	elog(DEBUG2, "zklock node \"%s\" granted by the deletion of the one it watched",
		 acq->node->path);
	return true;
}

/*
 * Take back the watch we may have left on our own node, before it is
 * deleted or kept: its going would otherwise wake this backend later, in
 * whatever wait it is in then.  A watch whose reply is still in flight
 * cannot be taken back (the library registers it when the reply comes);
 * it costs that later wait one spurious wake-up, nothing else, since no
 * later acquisition watches or owns the same path.
 */
static void
unwatch_own(Acquisition *acq)
{
	release_request(&acq->own_watch);
	if (acq->own_watched && acq->node->path[0] != '\0')
		zks_remove_watch(acq->node->path);
	acq->own_watched = false;
}

/*
 * Wait in the queue until the queue rules grant us the lock.  Returns
 * false if we may not wait, or at the deadline.
 */
static bool
wait_in_queue(Acquisition *acq, bool wait)
{
	for (;;)
	{
		char	  **watches;
		int			nwatch;
		bool		first_waiter;
		bool		granted_unseen;
		bool		deleted = false;
		ZkqVerdict	verdict;
		uint64		generation;
		int			rc;

		if (acq->list == NULL)
			acq->list = zks_take_listing(&deleted);
		if (deleted && granted_by_deletion(acq))
			return true;
		acq->deletion_decides = false;
		if (acq->list == NULL)
			acq->list = zks_get_children(acq->parent);
		if (!await_reply(acq, acq->list))
			return false;
		rc = acq->list->rc;
		if (rc != ZOK)
		{
			release_request(&acq->list);
			if (rc == ZNONODE)
				report_node_gone(acq);
			if (!zks_is_retryable(rc))
				zks_report_error(rc, ZKS_LIST, acq->parent);
			if (!await_connected(acq))
				return false;
			continue;
		}
		switch (zkac_check_parent(acq->parent, acq->slots > 0, acq->node->path,
								  acq->node->czxid, &acq->list->stat,
								  acq->deadline))
		{
			case ZKAC_TRUSTED:
				break;
			case ZKAC_LIST_AGAIN:
				release_request(&acq->list);
				continue;
			case ZKAC_LATE:
				acq->timed_out = true;
				return false;
			case ZKAC_NODE_GONE:
				report_node_gone(acq);
		}
		if (!decide(acq, &verdict, &watches, &nwatch, &first_waiter))
		{
			release_request(&acq->list);
			if (acq->timed_out || !await_connected(acq))
				return false;
			continue;
		}
		release_request(&acq->list);
		if (verdict != ZKQ_WAIT || !wait)
			free_watches(watches, nwatch);
		if (verdict == ZKQ_HOLDS)
			return acq->slots == 0 || hand_on(acq);
		if (!wait)
			return false;

		/*
		 * A backend that waits keeps no node: a waiter behind one of them
		 * could otherwise be taken for part of a deadlock with us.
		 */
		(void) zks_give_up_kept();
		if (first_waiter)
		{
			/* A semaphore's first waiter: any holder's going frees a slot. */
			acq->waited = true;
			zksh_wait_node(acq->node->path);
			if (!watch_all(acq, watches, nwatch))
				return false;
			continue;
		}
		if (verdict == ZKQ_REQUEUE)
		{
			/*
			 * Our old node goes the way of any given up; a new attempt, with
			 * a new uuid, so the queue reader never takes the old node for
			 * ours (ZkqrOptions.own).
			 */
			acq->waited = true;
			acq->deadlock_check_at = 0;
			acq->deadlock_backoff = 0;
			acq->deadlock_too_large = false;
			unwatch_own(acq);
			if (!zkd_withdraw(&acq->published) ||
				!zks_delete_later(acq->node->path) ||
				(acq->reply_lost && !zks_sweep_later(acq->parent, acq->guid)))
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("out of memory")));
			acq->node->path[0] = '\0';
			acq->reply_lost = false;
			new_attempt(acq, NULL);
			if (!create_node(acq))
				return false;
			continue;
		}

		/*
		 * A get-data watch: an exists watch on a gone node would linger; and
		 * a semaphore's waiter learns by a change of its predecessor's data
		 * that it has become the first waiter.  Only lock waits take part
		 * in deadlock detection.
		 */
		acq->waited = true;
		if (acq->slots == 0)
			start_deadlock_timer(acq);
		zksh_wait_node(acq->node->path);
		generation = zks_watch_generation();
		release_request(&acq->own_watch);
		acq->own_watched |= acq->deletion_decides;

		/*
		 * Read before the watches are set: a reconnect after this may
		 * re-fire their events out of order, and changes the count.
		 */
		acq->listed_at = zks_connection_count();
		acq->watch = zks_watch_then_list(watches[0], acq->parent,
										 acq->deletion_decides ?
										 acq->node->path : NULL,
										 &acq->own_watch);
		if (!await_reply(acq, acq->watch))
			return false;
		rc = acq->watch->rc;

		/* Replies come in order: the one for our own node is in. */
		if (acq->own_watch)
		{
			Assert(acq->own_watch->done);
			if (acq->own_watch->rc == ZNONODE)
				report_node_gone(acq);
			if (acq->own_watch->rc != ZOK)
				acq->deletion_decides = false;
			release_request(&acq->own_watch);
		}

		/*
		 * Gone before the watch was set: gone after our listing.  Unless
		 * the news of our own node's going took the armed listing first:
		 * then that listing decides.
		 */
		if (rc == ZNONODE && acq->deletion_decides)
		{
			bool		stale_deletion;

			acq->list = zks_take_listing(&stale_deletion);
			if (acq->list == NULL && granted_by_deletion(acq))
			{
				release_request(&acq->watch);
				free_watches(watches, nwatch);
				return true;
			}
		}

		/*
		 * A semaphore's predecessor, which we saw waiting, changes its data
		 * when granted: if it did so before our watch was set, that watch
		 * will never fire, so list again at once.  Only once for one change:
		 * a node that looks changed but waiting is not zklock's doing.
		 */
		granted_unseen = rc == ZOK && acq->slots > 0 &&
			acq->watch->stat.version != 0 &&
			(acq->relisted_for == NULL ||
			 strcmp(watches[0], acq->relisted_for) != 0 ||
			 acq->watch->stat.version != acq->relisted_version);
		if (granted_unseen)
		{
			if (acq->relisted_for)
				pfree(acq->relisted_for);
			acq->relisted_for = pstrdup(watches[0]);
			acq->relisted_version = acq->watch->stat.version;
		}
		release_request(&acq->watch);
		if (rc == ZOK && !granted_unseen)
		{
			if (!await_watch(acq, generation))
				return false;
		}
		else if (zks_is_retryable(rc))
		{
			if (!await_connected(acq))
				return false;
		}
		else if (rc != ZOK && rc != ZNONODE)
			zks_report_error(rc, ZKS_WATCH, watches[0]);
		free_watches(watches, nwatch);
	}
}

/*
 * Give up: hand every node this acquisition may have made to the janitor.
 * Never raises an ERROR (it runs while one is on its way out).  Should the
 * janitor be unable to take a node (out of memory), the session is closed,
 * which deletes every node it made: a node left behind would hold the lock
 * for nobody.  The hold table then finds the session closed under its
 * holds and reports them lost.
 */
static void
abandon(Acquisition *acq)
{
	bool		recorded;
	int			i;

	if (acq->create)
		acq->reply_lost = true;
	release_request(&acq->create);
	release_request(&acq->list);
	release_request(&acq->watch);
	zkqr_release(&acq->queue);
	release_holder_watches(acq);
	zks_cancel_listing();
	unwatch_own(acq);
	for (i = 0; i < acq->npath_creates; i++)
		release_request(&acq->path_creates[i]);
	recorded = zkd_withdraw(&acq->published);
	unwatch_all(acq);

	if (acq->node->path[0] != '\0')
		recorded &= zks_delete_later(acq->node->path);
	if (acq->reply_lost)
		recorded &= zks_sweep_later(acq->parent, acq->guid);
	acq->node->path[0] = '\0';
	if (recorded)
		zkr_wait_released();
	else
		zks_close();
}

/*
 * Acquire the lock whose contenders live under parent, in shared or
 * exclusive mode; other_node is this backend's node of the other mode on
 * the same parent, if it has one.  With slots > 0, acquire instead one
 * slot of the semaphore of that size under parent.  With wait false, give
 * up at once if another contender is ahead; otherwise wait until the
 * deadline (0: none).  Either way, talking to ZooKeeper ends at the
 * deadline.  On ZKR_GRANTED the node is filled in.
 */
ZkrResult
zkr_acquire(const char *parent, bool shared, int slots,
			const char *other_node, const char *data, bool wait,
			TimestampTz deadline, ZkLockNode *node, bool *waited)
{
	/* In palloc'd memory: the error path reads what the wait wrote. */
	Acquisition *acq = palloc0(sizeof(Acquisition));
	ZkrResult	result;

	acq->parent = parent;
	acq->node = node;
	acq->shared = shared;
	acq->slots = slots;
	acq->deadline = deadline;
	acq->data = data;
	acq->has_other = other_node != NULL;
	acq->read_options.semaphore = slots > 0;
	acq->read_options.reads = ZKQR_STAT_IF_UNORDERED;
	acq->read_options.attempt = acq->guid;
	acq->read_options.shared = shared;
	acq->read_options.skip_deleting = true;
	acq->read_options.deadline = deadline;
	node->path[0] = '\0';
	/* A second mode's node shares the holder part of the first's uuid. */
	new_attempt(acq, other_node ? zkl_basename(other_node) + 3 : NULL);

	zks_send_pending_deletes();
	PG_TRY();
	{
		if (create_node(acq) && wait_in_queue(acq, wait))
		{
			if (!zkd_withdraw(&acq->published))
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("out of memory")));
			unwatch_own(acq);
			zks_keep_node(node->path);
			result = ZKR_GRANTED;
		}
		else
			result = acq->timed_out ? ZKR_TIMED_OUT : ZKR_BUSY;
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		abandon(acq);
		RESUME_INTERRUPTS();
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (result != ZKR_GRANTED)
		abandon(acq);
	*waited = acq->waited;
	if (acq->relisted_for)
		pfree(acq->relisted_for);
	pfree(acq);
	return result;
}

/*
 * Is this node still there and owned by our session?  Used after a
 * reconnect or a freeze of the process, before a transaction that holds it
 * commits.
 */
bool
zkr_verify(const char *node_path)
{
	for (;;)
	{
		ZkRequest  *req = zks_exists_synced(node_path);
		int			rc;
		bool		ours;

		PG_TRY();
		{
			zks_await(req, 0);
		}
		PG_CATCH();
		{
			zks_release_request(req);
			PG_RE_THROW();
		}
		PG_END_TRY();
		rc = req->rc;
		ours = rc == ZOK && req->stat.ephemeralOwner == zks_session_id();
		zks_release_request(req);

		/* A session found expired holds nothing. */
		if (rc == ZOK || rc == ZNONODE || rc == ZSESSIONEXPIRED)
			return ours;
		if (!zks_is_retryable(rc))
			zks_report_error(rc, ZKS_CHECK, node_path);
		if (!zks_wait_while_unsure())
			return false;
	}
}

/*
 * Take back the node this backend kept under parent at its last release
 * (zklock.keep_released), if nobody else came since: without a request
 * while the leader confirmed the session within the commit check's
 * margin, else after one sync.  On true the node is held again, in *node,
 * with the cookie it was kept with.  False, with nothing taken, if none
 * is kept or the session is not fine, and the caller acquires as usual.
 * The caller asks zks_keeps_any first, as this confirms the session.
 */
bool
zkr_take_kept(const char *parent, ZkLockNode *node, int *cookie)
{
	TimestampTz deadline = 0;

	for (;;)
	{
		/* What a confirmed session's watch said is seen by the take. */
		if (!zks_confirm_contact())
			return false;
		switch (zks_take_kept(parent, node->path, sizeof(node->path),
							  &node->czxid, cookie))
		{
			case ZKS_KEPT_TAKEN:
				return true;
			case ZKS_KEPT_NONE:
				return false;
			case ZKS_KEPT_DECIDING:
				break;
		}
		if (deadline == 0)
			deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												   zklock_connect_timeout);
		if (!zks_await_kept_decided(parent, deadline))
			return false;
	}
}

/*
 * Keep a released node for keep_ms instead of deleting it, for
 * zkr_take_kept; verified_on is the connection the node was last known
 * ours on (zks_connection_count), the cookie and shown as
 * zks_keep_released takes them.
 * Never raises an ERROR; false if it could not, and the caller releases
 * the node.
 */
bool
zkr_keep(const char *parent, const ZkLockNode *node, uint64 verified_on,
		 int keep_ms, int cookie, pg_atomic_uint32 *shown)
{
	return zks_keep_released(node->path, parent, node->czxid, verified_on,
							 keep_ms, cookie, shown);
}

/*
 * Delete a held lock's node; the janitor retries it across reconnects.
 * Never raises an ERROR.  Returns false if the delete could not even be
 * recorded (out of memory); the caller must then end the session.
 */
bool
zkr_release(const char *node_path)
{
	return zks_delete_later(node_path);
}

/*
 * Wait a bounded time for released nodes to be gone, so a caller that
 * returns has, when ZooKeeper is reachable, really let go.  The bound is
 * short and fixed: COMMIT waits here with interrupts held.
 */
void
zkr_wait_released(void)
{
	zks_settle(Min(zklock_connect_timeout, ZKR_RELEASE_WAIT_MAX_MS));
}
