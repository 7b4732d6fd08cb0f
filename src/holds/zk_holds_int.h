/*-------------------------------------------------------------------------
 *
 * zk_holds_int.h
 *	  What the hold table's three files share, and nothing else includes:
 *	  the table's entries, the walks over them and the operations on them
 *	  (zk_hold_table.c), and the hooks by which zk_holds.c tells
 *	  zk_fail_closed.c of its changes.  zk_holds.c and zk_fail_closed.c
 *	  make the public API, zk_holds.h, and all three run on the backend's
 *	  thread only.
 *
 * The calls run one way, down: zk_holds.c > zk_fail_closed.c >
 * zk_hold_table.c.  zk_holds.c takes and ends holds in the table, and
 * calls the zkfc_ hooks when a hold is taken or ended, a lost hold let go,
 * or a transaction ended, so that what may commit, and whether a loss
 * cancels, follows.  zk_fail_closed.c moves a lost session's entries to
 * the lost table and reads the tables for its checks.  zk_hold_table.c
 * calls neither.  The transaction-end callbacks call two of the hooks,
 * zkfc_update_cancel_on_loss and zkfc_xact_ended, which must not raise an
 * ERROR nor allocate.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_HOLDS_INT_H
#define ZK_HOLDS_INT_H

#include "access/xact.h"
#include "utils/hsearch.h"

#include "base/zk_layout.h"
#include "recipe/zk_recipe.h"

/* zk_hold_table.c */

typedef struct HoldMode
{
	bool		acquiring;		/* zkh_acquire is filling the node in */
	int			session_count;
	int			xact_count;
	SubTransactionId *xact_subids;	/* subtransaction of each xact hold */
	int			xact_alloc;
	TimestampTz since;			/* when the node was granted */
	int64		lease_until;	/* zks_monotonic_ms deadline; 0 for none */
	int			lease_ms;		/* the lease it came from, for messages */
	uint64		verified_at;	/* zks_connection_count when last known ours */
	int			shown;			/* slot showing it server-wide (zk_shared.c) */
	/* Last, so that a new entry clears the rest without the long path. */
	ZkLockNode	node;			/* path[0] is '\0' when there is none */
} HoldMode;

/*
 * A lock name this backend holds, or one slot of a semaphore: each slot is
 * a node of its own, and so an entry of its own, keyed by that node's path
 * and using modes[0] only.
 */
typedef struct LockEntry
{
	char		key[ZKL_NODE_MAX];	/* hash key: the lock's parent path, or
									 * the slot's node path */
	char	   *name;			/* the lock name, for messages */
	bool		semaphore;		/* a slot */
	bool		lost;			/* in zkht_lost, not zkht_live */
	HoldMode	modes[2];		/* indexed by shared */
} LockEntry;

/*
 * Which holds of a mode a count is of.  Counts never go below zero, so "a
 * hold at HOLD_ANY" is "a hold at HOLD_SESSION or at HOLD_XACT".
 */
typedef enum CountScope
{
	HOLD_SESSION,
	HOLD_XACT,
	HOLD_ANY					/* of either scope */
} CountScope;

/*
 * A walk over the entries of one table, or of two one after the other.
 * The entry just returned may be removed meanwhile, as dynahash allows, and
 * no other; nothing may be entered into a table being walked, but a nested
 * walk that only reads is fine (update_lease, from zkht_remove_entry, does
 * one).  A walk left before its end must be stopped (zkht_walk_stop).
 */
typedef struct EntryWalk
{
	HTAB	   *tables[2];		/* in walking order; NULL for none */
	int			next;			/* index in tables of the next to start */
	bool		scanning;		/* status is a scan under way */
	HASH_SEQ_STATUS status;
} EntryWalk;

/* The live holds and the lost ones; NULL until first needed. */
extern HTAB *zkht_live;
extern HTAB *zkht_lost;

/* How many holds a mode has at scope. */
static inline int
hold_count(const HoldMode *mode, CountScope scope)
{
	return (scope != HOLD_XACT ? mode->session_count : 0) +
		(scope != HOLD_SESSION ? mode->xact_count : 0);
}

/* How many of an entry's modes have a hold at scope. */
static inline int
modes_held(const LockEntry *entry, CountScope scope)
{
	return (hold_count(&entry->modes[0], scope) > 0) +
		(hold_count(&entry->modes[1], scope) > 0);
}

/* How many entries a table has; none before it is made. */
static inline int64
entry_count(HTAB *table)
{
	return table == NULL ? 0 : hash_get_num_entries(table);
}

static inline bool
has_node(const HoldMode *mode)
{
	return mode->node.path[0] != '\0';
}

/* The walk, inline: every lock call walks a table or two. */
static inline void
zkht_walk_begin(EntryWalk *walk, HTAB *first, HTAB *second)
{
	walk->tables[0] = first;
	walk->tables[1] = second;
	walk->next = 0;
	walk->scanning = false;
}

/* The next entry of a walk, or NULL at its end. */
static inline LockEntry *
zkht_walk_next(EntryWalk *walk)
{
	for (;;)
	{
		if (walk->scanning)
		{
			LockEntry  *entry = hash_seq_search(&walk->status);

			if (entry != NULL)
				return entry;
			/* At its end, hash_seq_search has ended the scan itself. */
			walk->scanning = false;
		}
		if (walk->next == lengthof(walk->tables))
			return NULL;
		/* A table is scanned as it is when its turn comes. */
		if (entry_count(walk->tables[walk->next]) > 0)
		{
			hash_seq_init(&walk->status, walk->tables[walk->next]);
			walk->scanning = true;
		}
		walk->next++;
	}
}

static inline void
zkht_walk_stop(EntryWalk *walk)
{
	if (walk->scanning)
		hash_seq_term(&walk->status);
	walk->scanning = false;
}

extern void zkht_define_settings(void);
extern bool zkht_keeping_suspended;
extern void zkht_collect_kept(void);
extern HTAB *zkht_make_table(const char *name);
extern LockEntry *zkht_enter(HTAB *table, const char *key, const char *name);
extern void zkht_remove_entry(LockEntry *entry);
extern void zkht_reserve_subids(HoldMode *mode, int needed);
extern bool zkht_settle(LockEntry *entry);
extern void zkht_show_entry(LockEntry *entry);
extern void zkht_show_holds(void);
extern bool zkht_any_held(HTAB *table, CountScope scope);
extern int	zkht_count_modes_held(HTAB *table, CountScope scope);

/*
 * What the releases of one operation left to do: set as zkht_settle gives
 * nodes up, read and reset by zk_holds.c once the operation is done.
 */
extern bool zkht_releases_pending;
extern bool zkht_release_failed;

/* Inline, as the walks are: zk_lock and zk_unlock look entries up. */
static inline void
zkht_ensure_tables(void)
{
	if (zkht_live == NULL)
		zkht_live = zkht_make_table("zklock holds");
	if (zkht_lost == NULL)
		zkht_lost = zkht_make_table("zklock lost holds");
}

static inline LockEntry *
zkht_find(HTAB *table, const char *key)
{
	if (table == NULL)
		return NULL;
	return hash_search(table, key, HASH_FIND, NULL);
}

/*
 * The fencing token of an entry: the czxid of the backend's earliest node
 * on the name, which is where it stands in the queue (zk_queue.c), so every
 * earlier exclusive holder's token is smaller and every later one's larger.
 */
static inline int64
zkht_entry_token(const LockEntry *entry)
{
	int64		token = 0;
	int			m;

	for (m = 0; m < 2; m++)
		if (has_node(&entry->modes[m]) &&
			(token == 0 || entry->modes[m].node.czxid < token))
			token = entry->modes[m].node.czxid;
	return token;
}

/* zk_fail_closed.c */
extern void zkfc_define_settings(void);
extern void zkfc_note_acknowledged(const char *name);
extern void zkfc_note_released(void);
/* No ERROR and no allocation in these: transaction end runs the last two. */
extern void zkfc_hold_added(bool xact);
extern void zkfc_update_cancel_on_loss(void);
extern void zkfc_xact_ended(void);

#endif							/* ZK_HOLDS_INT_H */
