/*-------------------------------------------------------------------------
 *
 * zk_hold_table.c
 *	  The table of zklocks this backend holds: its entries, live and lost,
 *	  and the operations on them that zk_holds.c and zk_fail_closed.c share.
 *
 * An entry is entered, given up (its nodes handed to the janitor) and
 * removed here, and shown to the rest of the server; the session's lease
 * follows the live holds' earliest deadline.  What a hold means, and when
 * one is taken or ended, is zk_holds.c's; what a loss does to them,
 * zk_fail_closed.c's.
 *
 * This is the folder's lowest file: it calls nothing above it, neither
 * zk_holds.c nor zk_fail_closed.c's hooks, so that both call down into it
 * and the calls between the folder's files run one way.  The lookups that
 * every lock call makes are inline in zk_holds_int.h.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "base/zk_layout.h"
#include "base/zk_memory.h"
#include "holds/zk_holds_int.h"
#include "recipe/zk_recipe.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

HTAB	   *zkht_live = NULL;
HTAB	   *zkht_lost = NULL;

/* zklock.keep_released: how long a released exclusive lock's node is kept. */
static int	zklock_keep_released = 0;

/* Set while every lock is let go (zk_unlock_all, DISCARD ALL): none is kept. */
bool		zkht_keeping_suspended = false;

void
zkht_define_settings(void)
{
	DefineCustomIntVariable("zklock.keep_released",
							"Sets how long this backend keeps the node of an exclusive zklock it released, to take the lock again without asking ZooKeeper.",
							"While the node is kept, another contender's arrival makes the backend delete it at once.  0 deletes it at release.",
							&zklock_keep_released,
							0, 0, 3600000,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* Whether the session has a lease armed for one of our holds. */
static bool lease_published = false;

/*
 * Arm the session's lease for the earliest deadline among the live holds
 * granted under one, or disarm it.  Called when holds change; nothing is
 * done when no lease is armed and the change brought none.
 */
static void
update_lease(bool leased_change)
{
	EntryWalk	walk;
	LockEntry  *entry;
	int64		earliest = 0;
	int			length = 0;
	int			m;

	if (!lease_published && !leased_change)
		return;
	zkht_walk_begin(&walk, zkht_live, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
		for (m = 0; m < 2; m++)
		{
			HoldMode   *mode = &entry->modes[m];

			if (mode->lease_until == 0 || mode->acquiring ||
				hold_count(mode, HOLD_ANY) == 0)
				continue;
			if (earliest == 0 || mode->lease_until < earliest)
			{
				earliest = mode->lease_until;
				length = mode->lease_ms;
			}
		}
	if (earliest == 0)
	{
		if (lease_published)
			zks_set_lease(-1, 0);
		lease_published = false;
		return;
	}
	zks_set_lease(earliest, length);
	lease_published = true;
}

HTAB *
zkht_make_table(const char *name)
{
	HASHCTL		ctl;

	ctl.keysize = ZKL_NODE_MAX;
	ctl.entrysize = sizeof(LockEntry);
	ctl.hcxt = zk_memory();
	return hash_create(name, 16, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/* Find or make an entry; a new one has no node and no hold. */
LockEntry *
zkht_enter(HTAB *table, const char *key, const char *name)
{
	LockEntry  *entry;
	bool		found;
	char	   *name_copy = MemoryContextStrdup(zk_memory(), name);

	entry = hash_search(table, key, HASH_ENTER, &found);
	if (found)
		pfree(name_copy);
	else
	{
		int			m;

		entry->name = name_copy;
		entry->semaphore = false;
		Assert(table == zkht_live || table == zkht_lost);
		entry->lost = table == zkht_lost;
		for (m = 0; m < 2; m++)
		{
			memset(&entry->modes[m], 0, offsetof(HoldMode, node));
			entry->modes[m].node.path[0] = '\0';
			entry->modes[m].node.czxid = 0;
		}
	}
	return entry;
}

/* The parent path of the lock or semaphore of an entry. */
static const char *
parent_of(const LockEntry *entry, char buf[ZKL_PARENT_MAX])
{
	if (!entry->semaphore)
		return entry->key;
	strlcpy(buf, entry->key, Min(ZKL_PARENT_MAX, zkl_parent_length(entry->key) + 1));
	return buf;
}

void
zkht_remove_entry(LockEntry *entry)
{
	HTAB	   *table = entry->lost ? zkht_lost : zkht_live;
	int			m;

	for (m = 0; m < 2; m++)
	{
		zksh_drop_hold(entry->modes[m].shown);
		if (entry->modes[m].xact_subids)
			pfree(entry->modes[m].xact_subids);
	}
	pfree(entry->name);
	hash_search(table, entry->key, HASH_REMOVE, NULL);
	update_lease(false);
}

void
zkht_reserve_subids(HoldMode *mode, int needed)
{
	int			alloc;

	if (needed <= mode->xact_alloc)
		return;
	alloc = Max(needed, Max(4, mode->xact_alloc * 2));
	/* Record the new size only once the memory is there. */
	if (mode->xact_subids == NULL)
		mode->xact_subids = MemoryContextAlloc(zk_memory(),
											   alloc * sizeof(SubTransactionId));
	else
		mode->xact_subids = repalloc(mode->xact_subids,
									 alloc * sizeof(SubTransactionId));
	mode->xact_alloc = alloc;
}

/* Has any entry of table a hold at scope? */
bool
zkht_any_held(HTAB *table, CountScope scope)
{
	EntryWalk	walk;
	LockEntry  *entry;

	/* Every release asks this of a table that is then mostly empty. */
	if (entry_count(table) == 0)
		return false;
	zkht_walk_begin(&walk, table, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
	{
		if (modes_held(entry, scope) > 0)
		{
			zkht_walk_stop(&walk);
			return true;
		}
	}
	return false;
}

/* How many modes of the entries of table have a hold at scope. */
int
zkht_count_modes_held(HTAB *table, CountScope scope)
{
	EntryWalk	walk;
	LockEntry  *entry;
	int			n = 0;

	zkht_walk_begin(&walk, table, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
		n += modes_held(entry, scope);
	return n;
}

/*
 * Show the holds of one entry to the rest of the server (zk_shared.c),
 * after a change to them.  Writes shared memory only; never fails.
 */
void
zkht_show_entry(LockEntry *entry)
{
	char		parent[ZKL_PARENT_MAX];
	int			m;

	update_lease(entry->modes[0].lease_until != 0 ||
				 entry->modes[1].lease_until != 0);
	if (!zksh_enabled())
		return;
	for (m = 0; m < 2; m++)
	{
		HoldMode   *mode = &entry->modes[m];

		if (hold_count(mode, HOLD_ANY) > 0)
			mode->shown = zksh_put_hold(mode->shown,
										parent_of(entry, parent), m,
										entry->semaphore, entry->lost,
										mode->session_count,
										mode->xact_count, mode->node.path,
										entry->lost ? mode->node.czxid :
										zkht_entry_token(entry), mode->since);
		else if (mode->shown != 0)
		{
			zksh_drop_hold(mode->shown);
			mode->shown = 0;
		}
	}
}

/* Show every hold, after a change to many. */
void
zkht_show_holds(void)
{
	EntryWalk	walk;
	LockEntry  *entry;

	/* Else zkht_show_entry updates the lease for each entry shown. */
	if (!zksh_enabled())
	{
		update_lease(false);
		return;
	}
	zkht_walk_begin(&walk, zkht_live, zkht_lost);
	while ((entry = zkht_walk_next(&walk)) != NULL)
		zkht_show_entry(entry);
}

/* What the releases of one operation left to do; see finish_releases. */
bool		zkht_releases_pending = false;
bool		zkht_release_failed = false;

static void
release_node(HoldMode *mode)
{
	if (zkr_release(mode->node.path))
		zkht_releases_pending = true;
	else
		zkht_release_failed = true;
	mode->node.path[0] = '\0';
	mode->node.czxid = 0;
}

/*
 * Keep the exclusive node of a lock released, if zklock.keep_released says
 * so and the lock has no shared node of ours: the session gives it up when
 * anyone else comes (zk_keeping.c), and the hold's slot shows it kept till
 * then.  Returns false if it is not kept, and the caller releases it.
 */
static bool
keep_node(LockEntry *entry, int m)
{
	HoldMode   *mode = &entry->modes[m];

	if (zklock_keep_released <= 0 || zkht_keeping_suspended || m != 0 ||
		entry->semaphore || has_node(&entry->modes[1]))
		return false;
	if (!zkr_keep(entry->key, &mode->node, mode->verified_at,
				  zklock_keep_released, mode->shown,
				  zksh_keep_hold(mode->shown)))
		return false;
	mode->shown = 0;			/* the kept node's now */
	mode->node.path[0] = '\0';
	mode->node.czxid = 0;
	return true;
}

/*
 * Free the slots that showed kept nodes the session has given up since.
 * Every lock call asks: one call while nothing is kept.
 */
void
zkht_collect_kept(void)
{
	int			slots[32];
	int			n;
	int			i;

	if (!zks_keeps_any())
		return;
	while ((n = zks_take_given_up(slots, lengthof(slots))) > 0)
		for (i = 0; i < n; i++)
			zksh_drop_hold(slots[i]);
}

/*
 * After holds ended: release each mode that has no hold left, unless it
 * keeps our place for the other mode (see zk_holds.c's header comment), or
 * keep it (keep_node); drop the entry once nothing is left.  Nodes are
 * czxid-ordered: both are ours.
 */
bool
zkht_settle(LockEntry *entry)
{
	int			m;

	for (m = 0; m < 2; m++)
	{
		HoldMode   *mode = &entry->modes[m];
		HoldMode   *other = &entry->modes[1 - m];

		if (hold_count(mode, HOLD_ANY) > 0 || !has_node(mode) ||
			mode->acquiring)
			continue;
		if (!entry->lost && hold_count(other, HOLD_ANY) > 0 &&
			has_node(other) && mode->node.czxid < other->node.czxid)
			continue;
		if (entry->lost)
			mode->node.path[0] = '\0';
		else if (!keep_node(entry, m))
			release_node(mode);
	}
	for (m = 0; m < 2; m++)
	{
		HoldMode   *mode = &entry->modes[m];

		if (hold_count(mode, HOLD_ANY) > 0 || has_node(mode) ||
			mode->acquiring)
			return true;
	}
	zkht_remove_entry(entry);
	return false;
}
