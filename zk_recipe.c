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
 * when the lock is free.  The
 * exclusive contender with the lowest sequence holds the lock; any other
 * waits for a watch on its immediate predecessor only, then lists again,
 * because the predecessor may have been a waiter that gave up rather than
 * the holder.  The watcher sends that listing itself, from the library's
 * thread, so a handoff does not wait for the backend to wake up before its
 * read.  A shared contender holds the lock when no exclusive one is
 * ahead of it, and otherwise watches the nearest exclusive one ahead.
 *
 * The uuid is fresh for each acquisition and kept across its retries.
 * After a connection loss during create, the node is looked for by that
 * uuid and adopted only if its ephemeralOwner is our session.  Any second
 * node carrying the uuid (a create applied after we gave up on its reply) is
 * deleted when seen.
 *
 * Every way out other than being granted hands the node to the janitor in
 * zk_session.c, which deletes it even across a reconnect, and waits a
 * bounded time for that to be done.  A sweep by uuid covers a create whose
 * reply never came.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/pg_prng.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "zk_recipe.h"
#include "zk_session.h"

/* Ancestors of a lock parent that we may have to create. */
#define MAX_PATH_DEPTH		32

/* Everything an acquisition must clean up if it does not end granted. */
typedef struct Acquisition
{
	const char *parent;
	char		guid[ZKN_GUID_LEN + 1];
	char		prefix[ZKR_NODE_MAX];
	ZkLockNode *node;			/* path[0] is '\0' until a node is ours */
	bool		shared;
	const char *skip;			/* our node of the other mode, or NULL */
	TimestampTz deadline;		/* 0: none */
	bool		waited;			/* had to wait behind another contender */
	bool		timed_out;		/* the deadline passed */
	bool		reply_lost;		/* a create may have been applied unseen */
	ZkRequest  *create;
	ZkRequest  *list;
	ZkRequest  *watch;
	ZkRequest  *path_creates[MAX_PATH_DEPTH];
	int			npath_creates;
} Acquisition;

static bool
is_retryable(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

static void
release_request(ZkRequest **req)
{
	zks_release_request(*req);
	*req = NULL;
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

static bool
await_watch(Acquisition *acq, uint64 generation)
{
	if (zks_await_watch(generation, acq->deadline))
		return true;
	acq->timed_out = true;
	return false;
}

/*
 * Node ids need to be unique, not secret: they are drawn from a generator
 * seeded once per backend from the strong source, which costs a fraction of
 * asking that source for every acquisition.
 */
static void
make_guid(char guid[ZKN_GUID_LEN + 1])
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
}

static const char *
basename_of(const char *path)
{
	return strrchr(path, '/') + 1;
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
	char		path[ZKR_PARENT_MAX];
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
		if (req->rc != ZOK && req->rc != ZNODEEXISTS &&
			!is_retryable(req->rc))
			zks_report_error(req->rc, "create", acq->parent);
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
	char		found[ZKR_NODE_MAX] = "";
	int32_t		found_seq = 0;
	int			i;
	int			rc;

	acq->list = zks_get_children_synced(acq->parent);
	if (!await_reply(acq, acq->list))
		return SEARCH_TIMED_OUT;
	rc = acq->list->rc;
	for (i = 0; rc == ZOK && i < acq->list->nchildren; i++)
	{
		const char *child = acq->list->children[i];
		int32_t		seq;
		bool		shared;

		if (zkn_has_guid(child, acq->guid) &&
			zkn_parse_contender(child, &seq, &shared) &&
			(found[0] == '\0' || seq < found_seq))
		{
			snprintf(found, sizeof(found), "%s/%s", acq->parent, child);
			found_seq = seq;
		}
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
create_node(Acquisition *acq, const char *data)
{
	int			missing_parent = 0;

	for (;;)
	{
		int			rc;

		acq->create = zks_create(acq->prefix, data, strlen(data),
								 ZOO_EPHEMERAL_SEQUENTIAL);
		acq->list = zks_get_children(acq->parent);
		if (!await_reply(acq, acq->create))
			return false;
		rc = acq->create->rc;
		if (rc == ZOK)
		{
			strlcpy(acq->node->path, acq->create->path,
					sizeof(acq->node->path));
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
		else if (is_retryable(rc))
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
			zks_report_error(rc, "create", acq->prefix);
	}
}

static void report_node_gone(Acquisition *acq) pg_attribute_noreturn();

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

/*
 * From a listing of the parent, find the contender we must wait for: for an
 * exclusive node the one just before it, for a shared node the nearest
 * earlier exclusive one (readers share).  Returns false if we hold the
 * lock.  Our own node of the other mode never blocks us, as a backend's
 * own advisory locks never conflict.  Deletes stray nodes of this
 * acquisition on the way.
 */
static bool
find_predecessor(Acquisition *acq, char *predecessor, size_t size)
{
	const char *own = basename_of(acq->node->path);
	int32_t		own_seq = 0;
	bool		own_shared;
	bool		own_seen = false;
	bool		found = false;
	int32_t		best_seq = 0;
	int			i;

	if (!zkn_parse_contender(own, &own_seq, &own_shared))
		elog(ERROR, "zklock created a node with an unexpected name: \"%s\"",
			 acq->node->path);

	for (i = 0; i < acq->list->nchildren; i++)
	{
		const char *child = acq->list->children[i];
		int32_t		seq;
		bool		shared;

		if (strcmp(child, own) == 0)
		{
			own_seen = true;
			continue;
		}
		if (zkn_has_guid(child, acq->guid))
		{
			char		stray[ZKR_NODE_MAX];

			snprintf(stray, sizeof(stray), "%s/%s", acq->parent, child);
			if (!zks_delete_later(stray))
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("out of memory")));
			continue;
		}
		if (acq->skip && strcmp(child, acq->skip) == 0)
			continue;
		if (!zkn_parse_contender(child, &seq, &shared) || seq >= own_seq)
			continue;
		if (acq->shared && shared)
			continue;
		if (!found || seq > best_seq)
		{
			found = true;
			best_seq = seq;
			snprintf(predecessor, size, "%s/%s", acq->parent, child);
		}
	}
	if (!own_seen)
		report_node_gone(acq);
	return found;
}

/*
 * Wait in the queue until ours is the lowest node.  Returns false if we may
 * not wait, or at the deadline.
 */
static bool
wait_in_queue(Acquisition *acq, bool wait)
{
	for (;;)
	{
		char		predecessor[ZKR_NODE_MAX];
		uint64		generation;
		int			rc;

		if (acq->list == NULL)
			acq->list = zks_take_listing();
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
			if (!is_retryable(rc))
				zks_report_error(rc, "list children of", acq->parent);
			if (!await_connected(acq))
				return false;
			continue;
		}
		if (!find_predecessor(acq, predecessor, sizeof(predecessor)))
		{
			release_request(&acq->list);
			return true;
		}
		release_request(&acq->list);
		if (!wait)
			return false;

		/* A get-data watch: an exists watch on a gone node would linger. */
		acq->waited = true;
		generation = zks_watch_generation();
		acq->watch = zks_watch_then_list(predecessor, acq->parent);
		if (!await_reply(acq, acq->watch))
			return false;
		rc = acq->watch->rc;
		release_request(&acq->watch);
		if (rc == ZOK)
		{
			if (!await_watch(acq, generation))
				return false;
		}
		else if (is_retryable(rc))
		{
			if (!await_connected(acq))
				return false;
		}
		else if (rc != ZNONODE)
			zks_report_error(rc, "watch", predecessor);
	}
}

/* Give up: hand every node this acquisition may have made to the janitor. */
static void
abandon(Acquisition *acq)
{
	int			i;

	if (acq->create)
		acq->reply_lost = true;
	release_request(&acq->create);
	release_request(&acq->list);
	release_request(&acq->watch);
	zks_cancel_listing();
	for (i = 0; i < acq->npath_creates; i++)
		release_request(&acq->path_creates[i]);

	if (acq->node->path[0] != '\0' && !zks_delete_later(acq->node->path))
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (acq->reply_lost)
		zks_sweep_later(acq->parent, acq->guid);
	acq->node->path[0] = '\0';
	zkr_wait_released();
}

/*
 * Acquire the lock whose contenders live under parent, in shared or
 * exclusive mode; other_node is this backend's node of the other mode on
 * the same parent, if it has one.  With wait
 * false, give up at once if another contender is ahead; otherwise wait
 * until the deadline (0: none).  Either way, talking to ZooKeeper ends at
 * the deadline.  On ZKR_GRANTED the node is filled in.
 */
ZkrResult
zkr_acquire(const char *parent, bool shared, const char *other_node,
			const char *data, bool wait, TimestampTz deadline,
			ZkLockNode *node, bool *waited)
{
	/* In palloc'd memory: the error path reads what the wait wrote. */
	Acquisition *acq = palloc0(sizeof(Acquisition));
	ZkrResult	result;

	acq->parent = parent;
	acq->node = node;
	acq->shared = shared;
	acq->skip = other_node ? basename_of(other_node) : NULL;
	acq->deadline = deadline;
	node->path[0] = '\0';
	make_guid(acq->guid);
	snprintf(acq->prefix, sizeof(acq->prefix), "%s/_c_%s-%slock-",
			 parent, acq->guid, shared ? "read-" : "");

	zks_send_pending_deletes();
	PG_TRY();
	{
		if (create_node(acq, data) && wait_in_queue(acq, wait))
		{
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
		ZkRequest  *req = zks_exists(node_path);
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
		if (!is_retryable(rc))
			zks_report_error(rc, "check", node_path);
		if (!zks_wait_while_unsure())
			return false;
	}
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
