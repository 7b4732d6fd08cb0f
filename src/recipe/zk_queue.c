/*-------------------------------------------------------------------------
 *
 * zk_queue.c
 *	  The rules of a lock's queue, decided from one listing of its parent.
 *
 * Order.  Contenders stand in the order the server created them.  Their
 * sequence numbers say so, as long as the parent's signed child counter
 * has not gone near 2^31: from there on ZooKeeper hands out the same number
 * again, or negative ones, and after 2^32 creates small positive ones
 * again, so an older node can carry a larger number than a newer one.  A
 * listing whose parent's Stat (which the listing carries) says the counter
 * may have gone that far, or that shows a number the server
 * cannot have handed out in order, is therefore ordered by each node's
 * czxid, the zxid of its creation, which the caller then reads
 * (zkq_needs_czxid): it is global and strictly increasing, so every client
 * that reads it agrees, and a node already granted never finds a later one
 * placed before it.  (Ordering ties by name would let a newcomer whose name sorts first
 * join a holder.)  A child with a lock marker but no sequence number after
 * it cannot be placed: it stands ahead of everyone, as an exclusive
 * contender, so it makes others wait rather than vanish from the queue.
 *
 * A backend's nodes on one name.  A backend that holds a name in one mode
 * and asks for the other creates a second node whose uuid begins like its
 * first's: the first ZKQ_OWNER_LEN characters name the holder, the rest
 * the attempt.  Nodes of one holder never block each other, and the queue
 * places all of them at the place of the earliest, which is where that
 * holder stands.  So the later node, although it was created behind other
 * clients' nodes, stands ahead of them all, and every zklock client queued
 * there sees it: a reader queued behind a writer that gives up does not
 * slip in beside a backend that upgraded to exclusive.  (Curator and kazoo
 * clients are held back by the earlier node itself, since they see any
 * zklock node as a writer.)  A backend keeps its earliest node until its
 * last hold on the name ends (zk_holds.c): were it to go first, its later
 * node would fall back to its own place, behind the clients it let wait.
 *
 * Holding.  An exclusive contender holds the lock when nobody else stands
 * ahead of it; a shared one when no one else's exclusive contender does.
 *
 * Waiting.  A contender waits for the nearest contender ahead of it that
 * conflicts with it: any one for an exclusive request, an exclusive one for
 * a shared request.  A backend's new node of the other mode stands at its
 * first node's place, so the clients queued behind that place do not hold
 * it up (they wait for the backend already, as advisory locks put such a
 * request ahead of the waiters it blocks); those among them that may hold
 * the lock now (readers let in beside a shared first node) still count.
 *
 * Which readers behind its first node hold the lock, an upgrading backend
 * cannot tell from one listing: a reader with no writer left between it
 * and that node may have been let in before the upgrade came, or may have
 * waited for a writer that left after it.  So it waits for every such
 * reader.  A reader, in turn, knows it is waiting; when everything it waits
 * for is such an upgrade, created after it, it gives up its place and
 * queues again behind them (ZKQ_REQUEUE), or the two could wait for each
 * other.  Until then it watches the nearest contender it waits for that is
 * not such an upgrade, so it wakes when that goes.
 *
 *-------------------------------------------------------------------------
 */
#include "recipe/zk_queue.h"

#include <stdlib.h>
#include <string.h>

/*
 * How many children were ever created under a parent, from its Stat as a
 * listing carries it.  The server counts creates, and hands the count to
 * clients as cversion = 2 * creates - numChildren (ZooKeeper's DataNode),
 * in a 32-bit int that overflows once creates pass 2^30; the count itself
 * never passes 2^31 - 1, where the server stops raising it.
 */
int64_t
zkq_parent_creates(int32_t cversion, int32_t num_children)
{
	return ((int64_t) (uint32_t) cversion + (uint32_t) num_children) / 2;
}

/*
 * Can these contenders only be ordered by czxid?  parent_creates is what
 * zkq_parent_creates says of their parent in the same listing (-1:
 * unknown).  The server numbers a new node with that count and then raises
 * the count past the number; it never lowers it, even where its counter
 * goes round.  So while the count is at most ZKQ_TRUSTED_CREATES, the
 * counter cannot have gone round (that takes 2^31 creates, and the count
 * would have passed the bound first and stayed there): the numbers a
 * server handed out are distinct, below the count, and in creation order.
 * Any other listing, or one showing a wrapped number, a repeated one, or
 * one at or above the count (a node not numbered by the server), is
 * ordered by czxid.
 */
bool
zkq_needs_czxid(const ZkqEntry *entries, int n, int64_t parent_creates)
{
	int			i,
				j;

	if (parent_creates < 0 || parent_creates > ZKQ_TRUSTED_CREATES)
		return true;
	for (i = 0; i < n; i++)
	{
		const ZknContender *a = &entries[i].contender;

		if (a->form == ZKN_WRAPPED)
			return true;
		if (a->form != ZKN_SEQUENCED)
			continue;
		if (a->sequence >= parent_creates)
			return true;
		for (j = i + 1; j < n; j++)
		{
			const ZknContender *b = &entries[j].contender;

			if (b->form == ZKN_SEQUENCED && b->sequence == a->sequence)
				return true;
		}
	}
	return false;
}

/*
 * Creation order: negative if a was created before b.  Unplaceable
 * contenders come first, among themselves by name only so that the order
 * is total.
 */
static int
created_order(const ZkqEntry *a, const ZkqEntry *b, bool by_czxid)
{
	bool		a_malformed = a->contender.form == ZKN_MALFORMED;
	bool		b_malformed = b->contender.form == ZKN_MALFORMED;

	if (a_malformed || b_malformed)
	{
		if (a_malformed != b_malformed)
			return a_malformed ? -1 : 1;
		return strcmp(a->name, b->name);
	}
	if (by_czxid)
		return (a->czxid > b->czxid) - (a->czxid < b->czxid);
	return (a->contender.sequence > b->contender.sequence) -
		(a->contender.sequence < b->contender.sequence);
}

/* The holder part of a "_c_<uuid>-" name, or NULL for other names. */
static const char *
owner_of(const ZkqEntry *e)
{
	if (e->contender.form == ZKN_MALFORMED ||
		strncmp(e->name, "_c_", 3) != 0 ||
		strlen(e->name) <= 3 + ZKN_GUID_LEN ||
		e->name[3 + ZKN_GUID_LEN] != '-')
		return NULL;
	return e->name + 3;
}

typedef struct Owned
{
	const char *owner;
	int			index;
} Owned;

static int
by_owner(const void *a, const void *b)
{
	return strncmp(((const Owned *) a)->owner, ((const Owned *) b)->owner,
				   ZKQ_OWNER_LEN);
}

/*
 * The earliest node of each entry's holder: where that holder stands.
 * NULL if memory ran out.
 */
static int *
find_places(const ZkqEntry *entries, int n, bool by_czxid)
{
	int		   *place = malloc((n > 0 ? n : 1) * sizeof(int));
	Owned	   *owned = malloc((n > 0 ? n : 1) * sizeof(Owned));
	int			m = 0;
	int			i,
				j;

	if (place == NULL || owned == NULL)
	{
		free(place);
		free(owned);
		return NULL;
	}
	for (i = 0; i < n; i++)
	{
		place[i] = i;
		if ((owned[m].owner = owner_of(&entries[i])) != NULL)
			owned[m++].index = i;
	}
	qsort(owned, m, sizeof(Owned), by_owner);
	for (i = 0; i < m; i = j)
	{
		int			earliest = owned[i].index;
		int			k;

		for (j = i + 1; j < m && by_owner(&owned[i], &owned[j]) == 0; j++)
			if (created_order(&entries[owned[j].index], &entries[earliest],
							  by_czxid) < 0)
				earliest = owned[j].index;
		for (k = i; k < j; k++)
			place[owned[k].index] = earliest;
	}
	free(owned);
	return place;
}

/* Queue order: by the holder's place, then by creation. */
static int
queue_order(const ZkqEntry *entries, const int *place, int a, int b,
			bool by_czxid)
{
	int			c = created_order(&entries[place[a]], &entries[place[b]],
								  by_czxid);

	return c != 0 ? c : created_order(&entries[a], &entries[b], by_czxid);
}

static bool
conflict(const ZkqEntry *a, const ZkqEntry *b)
{
	return !a->contender.shared || !b->contender.shared;
}

/*
 * Does the contender at i hold the lock, counting every contender but the
 * one at skip (-1: none) and those marked in ignore (may be NULL)?
 */
static bool
holds_without(const ZkqEntry *entries, int n, const int *place, int i,
			  int skip, const bool *ignore, bool by_czxid)
{
	int			j;

	for (j = 0; j < n; j++)
	{
		if (j == skip || place[j] == place[i] || (ignore && ignore[j]))
			continue;
		if (queue_order(entries, place, j, i, by_czxid) < 0 &&
			conflict(&entries[i], &entries[j]))
			return false;
	}
	return true;
}

/*
 * Must the contender at own wait for the one at i?  So if i is someone
 * else's, conflicts with own, and stands ahead of own's place or, behind
 * it, holds the lock now.  *ahead says which.
 */
static bool
blocks(const ZkqEntry *entries, int n, const int *place, int i, int own,
	   bool by_czxid, bool *ahead)
{
	const ZkqEntry *e = &entries[i];
	const ZkqEntry *self = &entries[own];

	if (place[i] == place[own] || !conflict(e, self))
		return false;
	*ahead = queue_order(entries, place, i, own, by_czxid) < 0;
	return *ahead ||
		(created_order(e, self, by_czxid) < 0 &&
		 holds_without(entries, n, place, i, own, NULL, by_czxid));
}

/* zkq_decide, with the places found. */
static ZkqVerdict
decide(const ZkqEntry *entries, int n, const int *place, int own,
	   bool by_czxid, int *watch)
{
	const ZkqEntry *self = &entries[own];
	int			nearest = -1;
	int			nearest_plain = -1;
	int			i;

	for (i = 0; i < n; i++)
	{
		const ZkqEntry *e = &entries[i];
		bool		ahead;
		bool		later_upgrade;

		if (!blocks(entries, n, place, i, own, by_czxid, &ahead))
			continue;
		later_upgrade = ahead && place[i] != i &&
			created_order(self, e, by_czxid) < 0;
		if (nearest < 0 || queue_order(entries, place, i, nearest, by_czxid) > 0)
			nearest = i;
		if (!later_upgrade &&
			(nearest_plain < 0 ||
			 queue_order(entries, place, i, nearest_plain, by_czxid) > 0))
			nearest_plain = i;
	}
	if (nearest < 0)
		return ZKQ_HOLDS;
	if (nearest_plain >= 0)
	{
		*watch = nearest_plain;
		return ZKQ_WAIT;
	}
	/* Only upgrades created after us; a holder's later node stays put. */
	if (place[own] == own)
		return ZKQ_REQUEUE;
	*watch = nearest;
	return ZKQ_WAIT;
}

/*
 * Does the contender at own hold the lock, must it wait (for the node at
 * *watch, whose going may change the answer), or must it queue again?
 */
ZkqVerdict
zkq_decide(const ZkqEntry *entries, int n, int own, bool by_czxid,
		   int *watch)
{
	int		   *place;
	ZkqVerdict	verdict;

	/* Alone in the queue: the uncontended case, every cycle. */
	if (n == 1)
		return ZKQ_HOLDS;
	place = find_places(entries, n, by_czxid);
	if (place == NULL)
		return ZKQ_NO_MEMORY;
	verdict = decide(entries, n, place, own, by_czxid, watch);
	free(place);
	return verdict;
}

/*
 * Will the contender at own hold the lock once the one at gone is deleted,
 * whatever else happens meanwhile?  So if, without gone, nothing stands
 * ahead of own that it waits for.  Nothing created later can then stand
 * ahead of it: contenders stand in creation order (for nodes the server
 * numbered; one named by hand is the caller's concern), and a later node of a
 * holder takes its earlier node's place only while that earlier node is
 * there, which it stays while the later one is held (zk_holds.c).  For an
 * exclusive contender with no other node of its own (the caller's part);
 * false if memory ran out.
 */
bool
zkq_holds_without(const ZkqEntry *entries, int n, int own, int gone,
				  bool by_czxid)
{
	ZkqEntry   *rest = malloc((n > 0 ? n : 1) * sizeof(ZkqEntry));
	int			m = 0;
	int			own_rest = -1;
	int			watch;
	int			i;
	ZkqVerdict	verdict;

	if (rest == NULL)
		return false;
	for (i = 0; i < n; i++)
	{
		if (i == gone)
			continue;
		if (i == own)
			own_rest = m;
		rest[m++] = entries[i];
	}
	verdict = own_rest >= 0 ?
		zkq_decide(rest, m, own_rest, by_czxid, &watch) : ZKQ_WAIT;
	free(rest);
	return verdict == ZKQ_HOLDS;
}

/*
 * Every contender the one at own must wait for before it holds the lock,
 * for deadlock detection and for showing who blocks a waiter: their
 * indexes go to blockers (room for n).  Returns how many, or -1 if memory
 * ran out.
 */
int
zkq_blockers(const ZkqEntry *entries, int n, int own, bool by_czxid,
			 int *blockers)
{
	int		   *place = find_places(entries, n, by_czxid);
	int			count = 0;
	int			i;

	if (place == NULL)
		return -1;
	for (i = 0; i < n; i++)
	{
		bool		ahead;

		if (blocks(entries, n, place, i, own, by_czxid, &ahead))
			blockers[count++] = i;
	}
	free(place);
	return count;
}

/*
 * For showing a queue: the positions of the contenders in queue order, and
 * whether each holds the lock now.  A holder's later node holds if the rules
 * let it through; it is left out when judging the others if not.  (Whether
 * a reader behind an upgrade holds depends on what happened before this
 * listing, so that one answer can be wrong while an upgrade is under way.)
 * false if memory ran out.
 */
bool
zkq_describe(const ZkqEntry *entries, int n, bool by_czxid, int *order,
			 bool *holds)
{
	int		   *place = find_places(entries, n, by_czxid);
	bool	   *ignore = malloc((n > 0 ? n : 1) * sizeof(bool));
	int			watch;
	int			i,
				j;

	if (place == NULL || ignore == NULL)
	{
		free(place);
		free(ignore);
		return false;
	}
	for (i = 0; i < n; i++)
	{
		ignore[i] = false;
		if (place[i] != i)
		{
			holds[i] = decide(entries, n, place, i, by_czxid, &watch) == ZKQ_HOLDS;
			ignore[i] = !holds[i];
		}
	}
	for (i = 0; i < n; i++)
	{
		if (place[i] == i)
			holds[i] = holds_without(entries, n, place, i, -1, ignore, by_czxid);
		/* Insertion sort: queues are short, and this is for showing. */
		for (j = i; j > 0 &&
			 queue_order(entries, place, order[j - 1], i, by_czxid) > 0; j--)
			order[j] = order[j - 1];
		order[j] = i;
	}
	free(place);
	free(ignore);
	return true;
}

/*
 * Semaphores.  A semaphore's contenders are its slots, one node each, and
 * stand in creation order (no places: a backend's slots are separate
 * holders).  The contender at position k holds a slot when fewer than
 * limit(k) contenders stand ahead of it, limit(k) being the smallest size
 * asked by it and by every contender ahead of it: so callers that disagree
 * on the size never see more holders than any of them asked for.  Holders
 * are then a prefix of the queue.
 *
 * Nobody is woken for nothing: the first waiter (every contender ahead of
 * it holds) watches all of them, since any of them leaving frees its slot;
 * every other waiter watches only its predecessor, which tells it, by a
 * change of its data, when it has taken a slot and so made it the first
 * waiter (zk_recipe.c).
 */

static int
by_creation(const ZkqEntry *entries, int a, int b, bool by_czxid)
{
	return created_order(&entries[a], &entries[b], by_czxid);
}

/* Positions in creation order: order[k] is the k-th contender. */
static int *
creation_order(const ZkqEntry *entries, int n, bool by_czxid)
{
	int		   *order = malloc((n > 0 ? n : 1) * sizeof(int));
	int			i,
				j;

	if (order == NULL)
		return NULL;
	for (i = 0; i < n; i++)
	{
		/* Insertion sort: queues are short. */
		for (j = i; j > 0 && by_creation(entries, order[j - 1], i, by_czxid) > 0; j--)
			order[j] = order[j - 1];
		order[j] = i;
	}
	return order;
}

/* Which contenders hold a slot: holds[i] for the contender at index i. */
static void
slot_holders(const ZkqEntry *entries, int n, const int *order, bool *holds)
{
	int32_t		limit = ZKN_SLOTS_MAX;
	int			k;

	for (k = 0; k < n; k++)
	{
		const ZknContender *c = &entries[order[k]].contender;

		if (c->slots > 0 && c->slots < limit)
			limit = c->slots;
		holds[order[k]] = k < limit;
	}
}

/*
 * Does the semaphore contender at own hold a slot, or must it wait?  When
 * it waits, watch[0 .. *nwatch - 1] are the contenders to watch, and
 * *first_waiter says whether they are the holders (every contender ahead of
 * it holds) or its predecessor, itself a waiter.
 */
ZkqVerdict
zkq_slot_decide(const ZkqEntry *entries, int n, int own, bool by_czxid,
				int *watch, int *nwatch, bool *first_waiter)
{
	int		   *order = creation_order(entries, n, by_czxid);
	bool	   *holds = malloc((n > 0 ? n : 1) * sizeof(bool));
	ZkqVerdict	verdict = ZKQ_HOLDS;
	int			k;

	*nwatch = 0;
	*first_waiter = false;
	if (order == NULL || holds == NULL)
	{
		free(order);
		free(holds);
		return ZKQ_NO_MEMORY;
	}
	slot_holders(entries, n, order, holds);
	if (!holds[own])
	{
		verdict = ZKQ_WAIT;
		for (k = 0; order[k] != own; k++)
			;
		if (holds[order[k - 1]])
		{
			*first_waiter = true;
			for (*nwatch = 0; *nwatch < k; (*nwatch)++)
				watch[*nwatch] = order[*nwatch];
		}
		else
		{
			watch[0] = order[k - 1];
			*nwatch = 1;
		}
	}
	free(order);
	free(holds);
	return verdict;
}

/*
 * For showing who blocks a semaphore's waiter: the contenders holding its
 * slots, since any of them leaving lets the queue move (the waiters ahead
 * hold nothing).  Their indexes go to blockers (room for n); none if own
 * holds a slot.  Returns how many, or -1 if memory ran out.
 */
int
zkq_slot_blockers(const ZkqEntry *entries, int n, int own, bool by_czxid,
				  int *blockers)
{
	int		   *order = creation_order(entries, n, by_czxid);
	bool	   *holds = malloc((n > 0 ? n : 1) * sizeof(bool));
	int			count = 0;
	int			i;

	if (order == NULL || holds == NULL)
	{
		free(order);
		free(holds);
		return -1;
	}
	slot_holders(entries, n, order, holds);
	for (i = 0; i < n && !holds[own]; i++)
		if (holds[i])
			blockers[count++] = i;
	free(order);
	free(holds);
	return count;
}

/* For showing a semaphore's queue: as zkq_describe for a lock's. */
bool
zkq_slot_describe(const ZkqEntry *entries, int n, bool by_czxid, int *order,
				  bool *holds)
{
	int		   *sorted = creation_order(entries, n, by_czxid);

	if (sorted == NULL)
		return false;
	memcpy(order, sorted, n * sizeof(int));
	slot_holders(entries, n, sorted, holds);
	free(sorted);
	return true;
}
