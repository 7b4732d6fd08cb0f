/*-------------------------------------------------------------------------
 *
 * zk_keeping.c
 *	  Lock nodes kept after their release (zklock.keep_released), so that
 *	  this backend takes the lock again without a request while nobody else
 *	  wants it, and given up the moment someone does.
 *
 * A kept node is not held: the hold table has let it go, nothing is vouched
 * by it, and a loss has nothing to report of it.  It stays in the
 * janitor's list as a held node all the same, so that a lost session that
 * comes back deletes it, and the budget counts it.
 *
 * Whether anyone else wants the lock is learnt from a child watch on the
 * lock's parent, armed by a listing sent at the release that keeps the
 * node: the node is kept only if that listing shows no other contender.
 * Any change among the parent's children after that (a Curator, kazoo or
 * zklock contender's node made, or any node deleted, ours included) fires
 * the watch, and the watcher, on the library's completion thread, gives
 * every node kept under that parent to the janitor at once.  A watch not
 * fired since it was armed lets a later release keep its node without a
 * new listing, so a job that locks and unlocks one name again and again
 * sends nothing at all while nobody else comes.  A watch that fires while
 * our node is held again makes its next release an ordinary one.
 *
 * Connections.  A change made while we were cut off is told only once the
 * library has set its watches again after the reconnect, which may come
 * after a take that sent nothing.  So nothing kept or armed on one
 * connection is trusted on the next: a kept node is given up rather than
 * taken back, and a release after a reconnect lists again.
 *
 * A node is also given up once it has been kept for zklock.keep_released
 * (by the watchdog, which wakes for it), when the backend asks
 * (zk_unlock_all, DISCARD ALL, before it waits in a queue, when the node
 * budget needs room), and with the session: closed, its nodes go with it;
 * lost, the janitor deletes its held nodes.  The backend learns of a node
 * given up when it next looks (zks_take_given_up), and meanwhile a flag in
 * shared memory, cleared by whoever gives it up, stops the server-wide
 * view from showing it.
 *
 * Everything here is under zks_mutex; the watcher and the listing's
 * completion run on the completion thread and use nothing of PostgreSQL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <time.h>

#include "port/atomics.h"

#include "session/zk_session.h"
#include "session/zk_session_int.h"

typedef enum KeptState
{
	KEPT_DECIDING,				/* the listing that decides is on its way */
	KEPT,						/* kept: may be taken again */
	KEPT_GIVEN_UP				/* given to the janitor; the backend not told */
} KeptState;

/* A node kept after its release; malloc'd, zks_mutex. */
typedef struct KeptNode
{
	struct KeptNode *next;
	KeptState	state;
	char	   *path;
	char	   *parent;
	int64		czxid;
	int			cookie;			/* the backend's, returned with the node */
	pg_atomic_uint32 *shown;	/* 1 while kept, or NULL */
	struct timespec until;		/* given up then */
	uint64		connect_count;	/* the connection it was kept on */
} KeptNode;

/*
 * A child watch on a parent: armed once a listing with it showed no other
 * contender, and disarmed when it fires.  One per parent with a node of
 * ours under it, kept or held again; our own delete of that node fires
 * it, so none outlives our nodes.
 */
typedef struct KeepWatch
{
	struct KeepWatch *next;
	char	   *parent;
	bool		armed;
	bool		listing;		/* the listing that arms it is on its way */
	bool		fired;			/* ... and it fired meanwhile */
	bool		contended;		/* it fired while our node was held */
	uint64		connect_count;	/* the connection it was armed on */
} KeepWatch;

/* The listing's own copy of what it decides about. */
typedef struct KeepListing
{
	uint64		generation;
	char	   *parent;
	char	   *child;			/* the kept node's name under parent */
} KeepListing;

static KeptNode *kept_nodes = NULL;
static KeepWatch *keep_watches = NULL;

/* A node given up that the backend has not collected; read without the mutex. */
static int	given_up_pending = 0;

/* Listings sent to decide on keeping; the backend's, for the tests. */
static uint64 listings_sent = 0;

static void
kept_free(KeptNode *kept)
{
	free(kept->path);
	free(kept->parent);
	free(kept);
}

static void
watch_free(KeepWatch *watch)
{
	free(watch->parent);
	free(watch);
}

static KeepWatch *
find_watch_locked(const char *parent)
{
	KeepWatch  *watch;

	for (watch = keep_watches; watch; watch = watch->next)
		if (strcmp(watch->parent, parent) == 0)
			return watch;
	return NULL;
}

static void
drop_watch_locked(KeepWatch *target)
{
	KeepWatch **link;

	for (link = &keep_watches; *link; link = &(*link)->next)
		if (*link == target)
		{
			*link = target->next;
			watch_free(target);
			return;
		}
}

/*
 * Give a kept node to the janitor and mark it given up for the backend.
 * Returns whether the janitor has a delete to send.  Caller holds
 * zks_mutex.
 */
static bool
give_up_locked(KeptNode *kept)
{
	bool		delete;

	if (kept->state == KEPT_GIVEN_UP)
		return false;
	delete = zkj_give_up_held_locked(kept->path);
	kept->state = KEPT_GIVEN_UP;
	if (kept->shown)
		pg_atomic_write_u32(kept->shown, 0);
	__atomic_store_n(&given_up_pending, 1, __ATOMIC_RELEASE);
	return delete;
}

/* Give up every node kept under parent; whether a delete is to be sent. */
static bool
give_up_parent_locked(const char *parent)
{
	KeptNode   *kept;
	bool		delete = false;

	for (kept = kept_nodes; kept; kept = kept->next)
		if (strcmp(kept->parent, parent) == 0)
			delete |= give_up_locked(kept);
	return delete;
}

/* Have the janitor send what was given up. */
static void
send_deletes(bool delete)
{
	zhandle_t  *handle;

	if (!delete)
		return;
	pthread_mutex_lock(&zks_mutex);
	handle = zks_zh;
	pthread_mutex_unlock(&zks_mutex);
	if (handle)
		zkj_kick(handle);
}

/*
 * The child watch on a parent fired: someone came or went.  On the
 * completion thread.  Session events say nothing of the children: the
 * library sets the watch again after a reconnect, and an expiry is a loss.
 */
static void
keep_watcher(zhandle_t *handle, int type, int state, const char *path,
			 void *context)
{
	KeepWatch  *watch;
	bool		delete = false;

	if (type == ZOO_SESSION_EVENT || path == NULL)
		return;
	pthread_mutex_lock(&zks_mutex);
	if ((uint64) (uintptr_t) context != zks_link.generation)
	{
		pthread_mutex_unlock(&zks_mutex);
		return;
	}
	watch = find_watch_locked(path);
	delete = give_up_parent_locked(path);
	if (watch && watch->listing)
		watch->fired = true;
	else if (watch && !delete && zkj_holds_under_locked(path))
	{
		/* Someone came while our node was held: release it as usual. */
		watch->armed = false;
		watch->contended = true;
	}
	else if (watch)
		drop_watch_locked(watch);
	pthread_mutex_unlock(&zks_mutex);
	if (delete)
		zkj_kick(handle);
	zkln_wake_backend();
}

/*
 * The listing sent at a release: the node is kept if it shows no other
 * contender, and the watch it left is armed.  On the completion thread.
 */
static void
keep_listed(int rc, const struct String_vector *children, const void *data)
{
	KeepListing *listing = (KeepListing *) data;
	bool		alone = rc == ZOK;
	bool		own_seen = false;
	bool		delete = false;
	zhandle_t  *handle;
	KeepWatch  *watch;
	KeptNode   *kept;
	int			i;

	/* Our node, and no other: a node of ours gone meanwhile is not kept. */
	for (i = 0; alone && i < children->count; i++)
	{
		if (strcmp(children->data[i], listing->child) == 0)
			own_seen = true;
		else
			alone = false;
	}
	alone = alone && own_seen;

	pthread_mutex_lock(&zks_mutex);
	handle = zks_zh;
	if (listing->generation == zks_link.generation)
	{
		watch = find_watch_locked(listing->parent);
		if (watch)
		{
			watch->listing = false;
			/* It fired already if something changed since the listing. */
			watch->armed = alone && !watch->fired;
			watch->connect_count = zks_link.connect_count;
		}
		for (kept = kept_nodes; kept; kept = kept->next)
			if (kept->state == KEPT_DECIDING &&
				strcmp(kept->parent, listing->parent) == 0)
			{
				if (alone && watch && watch->armed)
					kept->state = KEPT;
				else
					delete |= give_up_locked(kept);
			}
		if (watch && !watch->armed)
			drop_watch_locked(watch);
	}
	zkln_wake_watchdog_locked();
	pthread_mutex_unlock(&zks_mutex);
	free(listing->parent);
	free(listing->child);
	free(listing);
	if (delete && handle)
		zkj_kick(handle);
	zkln_wake_backend();
}

/*
 * Keep a released node of ours under parent for keep_ms, instead of
 * deleting it: at once if the parent's watch was armed on the connection
 * the node was last verified on, which is the current one; else once the
 * listing sent now shows our node and no other.  Not if someone came while
 * it was held (the watch fired then): that release goes as usual, and is
 * waited for as usual.  cookie and shown are the caller's (shown, if not
 * NULL, is set while the node is kept).  Never raises an ERROR nor uses
 * PostgreSQL's memory: transaction end calls it.  False if it could not
 * keep the node, and the caller then releases it as usual.
 */
bool
zks_keep_released(const char *path, const char *parent, int64 czxid,
				  uint64 verified_on, int keep_ms, int cookie,
				  pg_atomic_uint32 *shown)
{
	KeptNode   *kept = calloc(1, sizeof(KeptNode));
	KeepListing *listing = calloc(1, sizeof(KeepListing));
	KeepWatch  *new_watch = calloc(1, sizeof(KeepWatch));
	KeepWatch  *watch;
	const char *child = strrchr(path, '/');
	zhandle_t  *handle = zks_zh;
	bool		send = false;
	int			rc;

	if (kept == NULL || listing == NULL || new_watch == NULL ||
		handle == NULL || child == NULL ||
		(kept->path = strdup(path)) == NULL ||
		(kept->parent = strdup(parent)) == NULL ||
		(listing->parent = strdup(parent)) == NULL ||
		(listing->child = strdup(child + 1)) == NULL ||
		(new_watch->parent = strdup(parent)) == NULL)
		goto fail;
	kept->czxid = czxid;
	kept->cookie = cookie;
	kept->shown = shown;
	clock_gettime(CLOCK_MONOTONIC, &kept->until);
	kept->until.tv_sec += keep_ms / 1000;
	kept->until.tv_nsec += (long) (keep_ms % 1000) * 1000000;
	if (kept->until.tv_nsec >= 1000000000)
	{
		kept->until.tv_sec++;
		kept->until.tv_nsec -= 1000000000;
	}

	pthread_mutex_lock(&zks_mutex);
	watch = find_watch_locked(parent);

	/*
	 * Kept only while the janitor has it as held, to delete it when it is
	 * given up; and not if a contender came while it was held.
	 */
	if (!zkj_is_held_locked(path) || (watch && watch->contended))
	{
		if (watch && !watch->listing)
			drop_watch_locked(watch);
		pthread_mutex_unlock(&zks_mutex);
		goto fail;
	}
	kept->connect_count = zks_link.connect_count;

	/*
	 * A watch armed on this connection, on a node verified on it: nothing
	 * changed under the parent since the listing that armed it.
	 */
	if (watch && watch->armed && !watch->listing &&
		watch->connect_count == zks_link.connect_count &&
		verified_on == zks_link.connect_count)
	{
		kept->state = KEPT;
		if (shown)
			pg_atomic_write_u32(shown, 1);
		kept->next = kept_nodes;
		kept_nodes = kept;
		zkln_wake_watchdog_by_locked(&kept->until);
		pthread_mutex_unlock(&zks_mutex);
		free(listing->parent);
		free(listing->child);
		free(listing);
		watch_free(new_watch);
		return true;
	}
	if (watch == NULL)
	{
		watch = new_watch;
		new_watch = NULL;
		watch->next = keep_watches;
		keep_watches = watch;
	}
	kept->state = KEPT_DECIDING;
	if (shown)
		pg_atomic_write_u32(shown, 1);
	kept->next = kept_nodes;
	kept_nodes = kept;
	/* One listing on its way decides for this node too. */
	if (!watch->listing)
	{
		watch->listing = true;
		watch->armed = false;
		watch->fired = false;
		listing->generation = zks_link.generation;
		send = true;
	}
	pthread_mutex_unlock(&zks_mutex);
	if (new_watch)
		watch_free(new_watch);
	if (!send)
	{
		free(listing->parent);
		free(listing->child);
		free(listing);
		return true;
	}

	listings_sent++;
	rc = zoo_awget_children(handle, parent, keep_watcher,
							zks_generation_context(listing->generation),
							keep_listed, listing);
	if (rc != ZOK && zkrq_refused_outright(rc))
		keep_listed(rc, NULL, listing);
	else if (rc != ZOK)
	{
		/*
		 * The library may still call the completion, which frees the
		 * listing; decide now, without it.
		 */
		bool		delete;

		pthread_mutex_lock(&zks_mutex);
		watch = find_watch_locked(parent);
		if (watch)
			drop_watch_locked(watch);
		delete = give_up_parent_locked(parent);
		pthread_mutex_unlock(&zks_mutex);
		send_deletes(delete);
	}
	return true;

fail:
	if (kept)
	{
		free(kept->path);
		free(kept->parent);
		free(kept);
	}
	if (listing)
	{
		free(listing->parent);
		free(listing->child);
		free(listing);
	}
	if (new_watch)
		watch_free(new_watch);
	return false;
}

/*
 * Take back a node kept under parent: ZKS_KEPT_TAKEN with its path, czxid
 * and the cookie it was kept with, the node held again; ZKS_KEPT_NONE; or
 * ZKS_KEPT_DECIDING while the listing that decides is on its way.  The
 * caller confirms the session first.
 */
ZksKeptTake
zks_take_kept(const char *parent, char *path, size_t path_size, int64 *czxid,
			  int *cookie)
{
	KeptNode  **link;
	ZksKeptTake result = ZKS_KEPT_NONE;
	bool		delete = false;

	pthread_mutex_lock(&zks_mutex);
	for (link = &kept_nodes; *link; link = &(*link)->next)
	{
		KeptNode   *kept = *link;

		if (kept->state == KEPT_GIVEN_UP || strcmp(kept->parent, parent) != 0)
			continue;
		if (kept->state == KEPT_DECIDING)
		{
			result = ZKS_KEPT_DECIDING;
			break;
		}

		/*
		 * Across a reconnect, a change to the parent is told only once the
		 * library has set its watches again, which may be after this: the
		 * node is not trusted, as a held one would be verified.
		 */
		if (kept->connect_count != zks_link.connect_count)
		{
			delete = give_up_locked(kept);
			break;
		}
		strlcpy(path, kept->path, path_size);
		*czxid = kept->czxid;
		*cookie = kept->cookie;
		*link = kept->next;
		kept_free(kept);
		result = ZKS_KEPT_TAKEN;
		break;
	}
	pthread_mutex_unlock(&zks_mutex);
	send_deletes(delete);
	return result;
}

/*
 * For the tests: how many nodes are kept and may be taken again, how many
 * wait for the listing that decides, and how many listings were sent.
 */
void
zks_keeping_counts(int *kept, int *deciding, uint64 *listings)
{
	KeptNode   *node;

	*kept = *deciding = 0;
	pthread_mutex_lock(&zks_mutex);
	for (node = kept_nodes; node; node = node->next)
	{
		*kept += node->state == KEPT;
		*deciding += node->state == KEPT_DECIDING;
	}
	pthread_mutex_unlock(&zks_mutex);
	*listings = listings_sent;
}

/*
 * Is any node kept?  One load, without the mutex: the backend alone adds
 * and removes records.
 */
bool
zks_keeps_any(void)
{
	return kept_nodes != NULL;
}

/* Is the listing that decides about a node kept under parent on its way? */
bool
zks_kept_deciding(const char *parent)
{
	KeptNode   *kept;
	bool		deciding = false;

	pthread_mutex_lock(&zks_mutex);
	for (kept = kept_nodes; kept; kept = kept->next)
		if (kept->state == KEPT_DECIDING && strcmp(kept->parent, parent) == 0)
			deciding = true;
	pthread_mutex_unlock(&zks_mutex);
	return deciding;
}

/*
 * Give up every kept node: zk_unlock_all, DISCARD ALL, a wait in a queue.
 * Returns whether deletes were sent, for a caller that waits for them as
 * for a release.
 */
bool
zks_give_up_kept(void)
{
	KeptNode   *kept;
	bool		delete = false;

	if (kept_nodes == NULL)
		return false;
	pthread_mutex_lock(&zks_mutex);
	for (kept = kept_nodes; kept; kept = kept->next)
		delete |= give_up_locked(kept);
	pthread_mutex_unlock(&zks_mutex);
	send_deletes(delete);
	return delete;
}

/*
 * Stop writing to the flags that show kept nodes: the backend frees the
 * slots they are in as it exits, while the session still runs.
 */
void
zks_forget_kept_shown(void)
{
	KeptNode   *kept;

	pthread_mutex_lock(&zks_mutex);
	for (kept = kept_nodes; kept; kept = kept->next)
		kept->shown = NULL;
	pthread_mutex_unlock(&zks_mutex);
}

/*
 * The cookies of nodes given up since the last call, at most max of them;
 * their records go.  Costs one load while nothing was given up.
 */
int
zks_take_given_up(int *cookies, int max)
{
	KeptNode  **link;
	int			n = 0;

	if (!__atomic_load_n(&given_up_pending, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&zks_mutex);
	link = &kept_nodes;
	while (*link && n < max)
	{
		KeptNode   *kept = *link;

		if (kept->state != KEPT_GIVEN_UP)
		{
			link = &kept->next;
			continue;
		}
		cookies[n++] = kept->cookie;
		*link = kept->next;
		kept_free(kept);
	}
	if (*link == NULL)
		__atomic_store_n(&given_up_pending, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&zks_mutex);
	return n;
}

/*
 * For the watchdog: give up the kept nodes whose time is up at now, and
 * say in *next (if one is kept) when the next one's is.  Returns whether
 * the janitor has deletes to send.  Caller holds zks_mutex.
 */
bool
zkk_give_up_due_locked(const struct timespec *now, struct timespec *next,
					   bool *any)
{
	KeptNode   *kept;
	bool		delete = false;

	*any = false;
	for (kept = kept_nodes; kept; kept = kept->next)
	{
		if (kept->state == KEPT_GIVEN_UP)
			continue;
		if (!zkct_later(&kept->until, now))
			delete |= give_up_locked(kept);
		else if (!*any || zkct_later(next, &kept->until))
		{
			*next = kept->until;
			*any = true;
		}
	}
	return delete;
}

/*
 * The session is lost: its kept nodes go with its held ones (the janitor
 * deletes those).  Caller holds zks_mutex.
 */
void
zkk_lost_locked(void)
{
	KeptNode   *kept;

	for (kept = kept_nodes; kept; kept = kept->next)
		if (kept->state != KEPT_GIVEN_UP)
		{
			kept->state = KEPT_GIVEN_UP;
			if (kept->shown)
				pg_atomic_write_u32(kept->shown, 0);
			__atomic_store_n(&given_up_pending, 1, __ATOMIC_RELEASE);
		}
	while (keep_watches)
	{
		KeepWatch  *watch = keep_watches;

		keep_watches = watch->next;
		watch_free(watch);
	}
}

/*
 * The session is closed: its nodes are gone with it, and its watches.
 * The backend still collects the cookies.  Caller holds zks_mutex.
 */
void
zkk_clear_locked(void)
{
	zkk_lost_locked();
}
