/*-------------------------------------------------------------------------
 *
 * zk_requests.c
 *	  The backend's requests to ZooKeeper: sending them, the completions
 *	  that fill them in on the library's completion thread, giving them up,
 *	  and the errors they end in; and the watch-then-list handoff, where the
 *	  session's watcher sends a waiter's next listing itself.
 *
 * A request is malloc'd, filled in by its completion and marked done under
 * zks_mutex, and handed back to the backend by zkln_wake_backend
 * (zk_link.c).  A backend that stops waiting for one marks it abandoned,
 * and its completion frees it; every answer the server gives moves the
 * contact clock (zkct_note_heard_locked, zk_contact.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <time.h>

#include "session/zk_session.h"
#include "session/zk_session_int.h"

/*
 * A waiter's next listing of its queue, sent by the watcher itself when the
 * node the waiter watches changes, so the read that decides the handoff
 * does not first wait for the backend to wake up.  Armed by
 * zks_watch_then_list; claimed by the watcher, which moves the request to
 * listing_sent and owns the rest; taken by the backend (zks_take_listing).
 * A waiter whose grant the node's deletion alone decides (zk_recipe.c)
 * needs no listing then: the watcher only notes the deletion
 * (watched_deleted).  Such a waiter watches its own node too (own), and
 * any news of that comes first, in the server's order, and claims the
 * listing, so a deletion noted is never one that followed our own node's.
 */
struct PendingListing
{
	char	   *watched;
	char	   *parent;
	char	   *own;			/* NULL unless the deletion decides */
	ZkRequest  *listing;
};

static PendingListing *listing_armed = NULL;
static ZkRequest *listing_sent = NULL;
static bool watched_deleted = false;

/* Completion callbacks: copy the result out, then mark the request done. */

static void
request_free_contents(ZkRequest *req)
{
	int			i;

	free(req->path);
	free(req->data);
	for (i = 0; i < req->nchildren; i++)
		free(req->children[i]);
	free(req->children);
	for (i = 0; i < req->nacl; i++)
	{
		free(req->acl[i].id.scheme);
		free(req->acl[i].id.id);
	}
	free(req->acl);
}

static void
request_free(ZkRequest *req)
{
	request_free_contents(req);
	free(req);
}

/*
 * Requests the backend is done with, kept for its next ones: a lock cycle
 * makes two or three, and malloc's per-thread caches serve them poorly, as
 * the completion thread frees what it finishes itself.  Backend thread
 * only.
 */
#define SPARE_REQUESTS		4
static ZkRequest *spare_requests[SPARE_REQUESTS];
static int	nspare_requests = 0;

static void
request_recycle(ZkRequest *req)
{
	request_free_contents(req);
	if (nspare_requests < SPARE_REQUESTS)
		spare_requests[nspare_requests++] = req;
	else
		free(req);
}

static void
request_finish(ZkRequest *req, int rc)
{
	bool		abandoned;

	pthread_mutex_lock(&zks_mutex);
	if (req->done)
	{
		/* The late completion of a request we finished ourselves. */
		req->late_done = true;
		abandoned = req->abandoned;
		pthread_mutex_unlock(&zks_mutex);
		if (abandoned)
			request_free(req);
		return;
	}
	zkct_note_heard_locked(&req->sent_at, req->via_leader, rc);
	req->rc = rc;
	req->done = true;
	abandoned = req->abandoned;
	pthread_mutex_unlock(&zks_mutex);

	if (abandoned)
		request_free(req);
	else
		zkln_wake_backend();
}

static void
create_done(int rc, const char *path, const struct Stat *stat,
			const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK)
	{
		req->path = strdup(path);
		if (req->path == NULL)
			rc = ZSYSTEMERROR;
		if (stat)
			req->stat = *stat;
	}
	request_finish(req, rc);
}

static void
stat_done(int rc, const struct Stat *stat, const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && stat)
		req->stat = *stat;
	request_finish(req, rc);
}

static void
data_done(int rc, const char *value, int value_len, const struct Stat *stat,
		  const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && value && value_len > 0)
	{
		req->data = malloc(value_len);
		if (req->data == NULL)
			rc = ZSYSTEMERROR;
		else
		{
			memcpy(req->data, value, value_len);
			req->datalen = value_len;
		}
	}
	stat_done(rc, stat, data);
}

/* A listing: the children, and the parent's Stat (its cversion orders them). */
static void
children_done(int rc, const struct String_vector *strings,
			  const struct Stat *stat, const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && stat)
		req->stat = *stat;
	if (rc == ZOK && strings && strings->count > 0)
	{
		int			i;

		req->children = calloc(strings->count, sizeof(char *));
		if (req->children == NULL)
			rc = ZSYSTEMERROR;
		for (i = 0; rc == ZOK && i < strings->count; i++)
		{
			req->children[i] = strdup(strings->data[i]);
			req->nchildren = i + 1;
			if (req->children[i] == NULL)
				rc = ZSYSTEMERROR;
		}
	}
	request_finish(req, rc);
}

/* Requests the backend has made, for what a deadlock check costs. */
static uint64 requests_sent = 0;

uint64
zks_requests_sent(void)
{
	return requests_sent;
}

/* A node's ACL, and its Stat (its aversion says when the ACL changes). */
static void
acl_done(int rc, struct ACL_vector *acl, struct Stat *stat, const void *data)
{
	ZkRequest  *req = (ZkRequest *) data;

	if (rc == ZOK && stat)
		req->stat = *stat;
	if (rc == ZOK && acl && acl->count > 0)
	{
		int			i;

		req->acl = calloc(acl->count, sizeof(struct ACL));
		if (req->acl == NULL)
			rc = ZSYSTEMERROR;
		for (i = 0; rc == ZOK && i < acl->count; i++)
		{
			req->acl[i].perms = acl->data[i].perms;
			req->acl[i].id.scheme = strdup(acl->data[i].id.scheme);
			req->acl[i].id.id = strdup(acl->data[i].id.id);
			req->nacl = i + 1;
			if (req->acl[i].id.scheme == NULL || req->acl[i].id.id == NULL)
				rc = ZSYSTEMERROR;
		}
	}
	request_finish(req, rc);
}

static ZkRequest *
request_new(bool via_leader)
{
	ZkRequest  *req;

	requests_sent++;
	if (nspare_requests > 0)
	{
		req = spare_requests[--nspare_requests];
		memset(req, 0, sizeof(ZkRequest));
	}
	else
		req = calloc(1, sizeof(ZkRequest));
	if (req == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	req->via_leader = via_leader;
	clock_gettime(CLOCK_MONOTONIC, &req->sent_at);
	return req;
}

/* Report a request the library did not queue. */
static ZkRequest *
request_queued(ZkRequest *req, int rc, ZksOperation op, const char *path)
{
	if (rc != ZOK)
	{
		if (zkrq_refused_outright(rc))
			free(req);
		else
			zks_release_request(req);	/* its completion frees it */
		zks_report_error(rc, op, path);
	}
	return req;
}

ZkRequest *
zks_create(const char *path, const char *data, int datalen, int mode)
{
	ZkRequest  *req = request_new(true);

	return request_queued(req,
						  zoo_acreate2(zks_zh, path, data, datalen,
									   &zks_node_acl, mode,
									   create_done, req),
						  ZKS_CREATE, path);
}

ZkRequest *
zks_get_children(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aget_children2(zks_zh, path, 0, children_done, req),
						  ZKS_LIST, path);
}

/*
 * List children as the leader has them: the listing is queued behind a
 * sync, so it reflects every write the session made, even one whose reply
 * was lost on a previous connection.
 */
ZkRequest *
zks_get_children_synced(const char *path)
{
	ZkRequest  *req = request_new(false);
	int			rc = zkrq_send_sync(zks_zh, path);

	if (rc == ZOK)
		rc = zoo_aget_children2(zks_zh, path, 0, children_done, req);
	return request_queued(req, rc, ZKS_LIST, path);
}

ZkRequest *
zks_exists(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aexists(zks_zh, path, 0, stat_done, req),
						  ZKS_CHECK, path);
}

/* Check a node as the leader has it, likewise. */
ZkRequest *
zks_exists_synced(const char *path)
{
	ZkRequest  *req = request_new(false);
	int			rc = zkrq_send_sync(zks_zh, path);

	if (rc == ZOK)
		rc = zoo_aexists(zks_zh, path, 0, stat_done, req);
	return request_queued(req, rc, ZKS_CHECK, path);
}

static void
sync_done(int rc, const char *value, const void *data)
{
	request_finish((ZkRequest *) data, rc);
}

/* Ask the leader for an answer: a sync, which the leader replies to. */
ZkRequest *
zkrq_sync(const char *path)
{
	ZkRequest  *req = request_new(true);

	return request_queued(req, zoo_async(zks_zh, path, sync_done, req),
						  ZKS_SYNC, path);
}

ZkRequest *
zks_get_data(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aget(zks_zh, path, 0, data_done, req),
						  ZKS_READ, path);
}

ZkRequest *
zks_get_acl(const char *path)
{
	ZkRequest  *req = request_new(false);

	return request_queued(req,
						  zoo_aget_acl(zks_zh, path, acl_done, req),
						  ZKS_READ, path);
}

/*
 * Read a node and leave a watch.  The watch goes to the handle's own
 * watcher, with the context the handle was made with: its generation (see
 * zks_session_watcher, zk_session.c).
 */
ZkRequest *
zks_watch_data(const char *path)
{
	ZkRequest  *req;

	/* zoo_aget reads the handle's watcher before it checks the handle. */
	Assert(zks_zh != NULL);
	req = request_new(false);

	return request_queued(req, zoo_aget(zks_zh, path, 1, data_done, req),
						  ZKS_WATCH, path);
}

/* Change a node's data, whatever its version. */
ZkRequest *
zks_set_data(const char *path, const char *data, int datalen)
{
	ZkRequest  *req = request_new(true);

	return request_queued(req,
						  zoo_aset(zks_zh, path, data, datalen, -1, stat_done, req),
						  ZKS_SET_DATA, path);
}

static void
remove_watch_done(int rc, const void *data)
{
}

/*
 * Take back the data watches this session left on a node, so that the
 * node's going later notifies nobody; without waiting for the answer
 * (there may be no such watch any more, which is fine).  Only "remove
 * all" reaches the server: removing one watcher only stops the library
 * calling it, while the server still sends the notification.
 */
void
zks_remove_watch(const char *path)
{
	/* The library declares the completion oddly but stores it as given. */
	(void) zoo_aremove_all_watches(zks_zh, path, ZWATCHTYPE_DATA, 0,
								   (void_completion_t *) remove_watch_done,
								   NULL);
}

static void
pending_listing_free(PendingListing *pending)
{
	free(pending->watched);
	free(pending->parent);
	free(pending->own);
	free(pending);
}

/* On the completion thread, the mutex not held: the library is called. */
static void
send_claimed_listing(zhandle_t *handle, PendingListing *claimed)
{
	int			rc;

	clock_gettime(CLOCK_MONOTONIC, &claimed->listing->sent_at);
	rc = zoo_aget_children2(handle, claimed->parent, 0, children_done,
							claimed->listing);

	/*
	 * Refused outright, no completion comes; after ZMARSHALLINGERROR one
	 * may or may not.  The waiter must not wait for it: finish it as a
	 * connection loss (the waiter lists again), and let a late completion
	 * find it done.
	 */
	if (rc != ZOK && zkrq_refused_outright(rc))
		request_finish(claimed->listing, rc);
	else if (rc != ZOK)
	{
		pthread_mutex_lock(&zks_mutex);
		if (!claimed->listing->done)
		{
			claimed->listing->maybe_late = true;
			claimed->listing->rc = ZCONNECTIONLOSS;
			claimed->listing->done = true;
		}
		pthread_mutex_unlock(&zks_mutex);
		zkln_wake_backend();
	}
	pending_listing_free(claimed);
}

/*
 * For the session's watcher, on an event that is not a session event:
 * claim the armed listing if the event is about the watched node or our
 * own.  *discard says that the event only noted the watched node's
 * deletion, and the listing is not to be sent.  Caller holds zks_mutex.
 */
PendingListing *
zkrq_claim_listing_locked(int type, const char *path, bool *discard)
{
	PendingListing *claimed = listing_armed;

	*discard = false;
	if (claimed == NULL || path == NULL ||
		(strcmp(path, claimed->watched) != 0 &&
		 (claimed->own == NULL || strcmp(path, claimed->own) != 0)))
		return NULL;
	listing_armed = NULL;
	if (type == ZOO_DELETED_EVENT && claimed->own != NULL &&
		strcmp(path, claimed->watched) == 0)
		watched_deleted = *discard = true;
	else
		listing_sent = claimed->listing;
	return claimed;
}

/*
 * Send what zkrq_claim_listing_locked claimed, or free it if it is not to
 * be sent.  On the completion thread, the mutex not held.
 */
void
zkrq_send_claimed(zhandle_t *handle, PendingListing *claimed, bool discard)
{
	if (discard)
	{
		request_free(claimed->listing);
		pending_listing_free(claimed);
	}
	else
		send_claimed_listing(handle, claimed);
}

/*
 * Watch a node as zks_watch_data does, and have the watcher list parent as
 * soon as the node changes or goes.  With own (the waiter's node, for a
 * waiter whose grant the watched node's deletion decides), watch that too,
 * first, its request in *own_watch; then the watcher lists on any news of
 * own, and on the watched node's deletion only notes it.  The backend picks
 * up either with zks_take_listing once the watch generation moves.
 */
ZkRequest *
zks_watch_then_list(const char *watched, const char *parent, const char *own,
					ZkRequest **own_watch)
{
	PendingListing *pending = calloc(1, sizeof(PendingListing));

	if (pending != NULL)
	{
		pending->watched = strdup(watched);
		pending->parent = strdup(parent);
		pending->own = own ? strdup(own) : NULL;
		pending->listing = calloc(1, sizeof(ZkRequest));
		if (!pending->watched || !pending->parent || !pending->listing ||
			(own && !pending->own))
		{
			free(pending->listing);
			pending_listing_free(pending);
			pending = NULL;
		}
	}
	if (pending == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	zks_cancel_listing();
	pthread_mutex_lock(&zks_mutex);
	listing_armed = pending;
	pthread_mutex_unlock(&zks_mutex);
	if (own)
		*own_watch = zks_watch_data(own);
	return zks_watch_data(watched);
}

/*
 * The listing the watcher sent (in flight, or finished), or NULL if it sent
 * none; *deleted says whether, instead, it saw the watched node go for a
 * waiter whose grant that decides.  Either way nothing stays armed.
 */
ZkRequest *
zks_take_listing(bool *deleted)
{
	PendingListing *unsent;
	ZkRequest  *sent;

	pthread_mutex_lock(&zks_mutex);
	unsent = listing_armed;
	listing_armed = NULL;
	sent = listing_sent;
	listing_sent = NULL;
	*deleted = watched_deleted;
	watched_deleted = false;
	pthread_mutex_unlock(&zks_mutex);
	if (unsent)
	{
		request_free(unsent->listing);
		pending_listing_free(unsent);
	}
	return sent;
}

void
zks_cancel_listing(void)
{
	bool		deleted;

	zks_release_request(zks_take_listing(&deleted));
}

/*
 * Free a request, or, if its reply has not come, leave it for the completion
 * thread to free.
 */
void
zks_release_request(ZkRequest *req)
{
	bool		free_now;

	if (req == NULL)
		return;
	pthread_mutex_lock(&zks_mutex);
	free_now = req->done && (!req->maybe_late || req->late_done);
	if (!free_now)
		req->abandoned = true;
	pthread_mutex_unlock(&zks_mutex);
	if (free_now)
		request_recycle(req);
}

/* The message of a request that failed, whole, for each operation. */
static const char *
failure_message(ZksOperation op)
{
	switch (op)
	{
		case ZKS_CREATE:
			return gettext_noop("could not create ZooKeeper node \"%s\": %s");
		case ZKS_LIST:
			return gettext_noop("could not list children of ZooKeeper node \"%s\": %s");
		case ZKS_CHECK:
			return gettext_noop("could not check ZooKeeper node \"%s\": %s");
		case ZKS_SYNC:
			return gettext_noop("could not sync ZooKeeper node \"%s\": %s");
		case ZKS_READ:
			return gettext_noop("could not read ZooKeeper node \"%s\": %s");
		case ZKS_WATCH:
			return gettext_noop("could not watch ZooKeeper node \"%s\": %s");
		case ZKS_SET_DATA:
			return gettext_noop("could not set the data of ZooKeeper node \"%s\": %s");
	}
	return gettext_noop("could not use ZooKeeper node \"%s\": %s");
}

void
zks_report_error(int rc, ZksOperation op, const char *path)
{
	if (rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("zklock lost its ZooKeeper session"),
				 errdetail("ZooKeeper answered \"%s\" to a request on node \"%s\".",
						   zerror(rc), path)));
	ereport(ERROR,
			(errcode(rc == ZNOAUTH ? ERRCODE_INSUFFICIENT_PRIVILEGE :
					 ERRCODE_CONNECTION_FAILURE),
			 errmsg(failure_message(op), path, zerror(rc))));
}

/*
 * Did the library refuse a request before registering its completion?
 * Then none will come.  ZMARSHALLINGERROR is ambiguous: the library returns
 * it when the handle is closing (no completion) and when memory ran out
 * after the completion was registered (it comes, with an error, at the
 * next disconnect); callers must expect either.
 */
bool
zkrq_refused_outright(int rc)
{
	return rc == ZINVALIDSTATE || rc == ZBADARGUMENTS || rc == ZCLOSING;
}

static void
sync_unawaited(int rc, const char *value, const void *data)
{
}

/*
 * Make the server we are connected to catch up with the leader before the
 * next read.  After a reconnect it need not have seen a create whose reply
 * was lost; a read queued behind this sync has.
 */
int
zkrq_send_sync(zhandle_t *handle, const char *path)
{
	return zoo_async(handle, path, sync_unawaited, NULL);
}
