/*-------------------------------------------------------------------------
 *
 * zk_holds.c
 *	  The table of zklocks this backend holds.
 *
 * One entry per lock name, with a slot for each mode.  Holds stack as
 * advisory locks do.  One lock node serves every hold of a mode, session
 * and transaction level alike, so a repeated acquire costs no ZooKeeper
 * request.
 *
 * A mode's node is deleted when its last hold ends, with one exception
 * that the queue rules need (zk_queue.c): while the other mode is still
 * held, a node created before the other mode's node stays, holding the
 * backend's place in the queue, so no client queued between the two nodes
 * is granted beside the later one.  It goes with the last hold on the name,
 * and a new acquire of its mode meanwhile takes it up again at no cost.
 *
 * Each transaction hold remembers the subtransaction that took it, so
 * ROLLBACK TO a savepoint ends the holds taken after it, and RELEASE
 * SAVEPOINT passes them to the parent.  COMMIT and ABORT end all of them;
 * those callbacks run after the commit record, with interrupts held, and
 * must not raise an ERROR: they allocate nothing from PostgreSQL, hand the
 * nodes to the janitor and wait a bounded time.
 *
 * When the ZooKeeper session is lost, every entry moves to a second table
 * of lost holds.  They keep their counts so that zk_unlock can say the
 * lock was lost, and so that work done under them cannot commit
 * (zkh_check_commit, called by the statement guard, zk_guard.c): a
 * transaction holding a lost transaction-level lock never commits, and
 * while a lost session-level hold is remembered no transaction that wrote
 * commits, unless zklock.fail_closed is off.  Ending a lost hold (unlock,
 * unlock_all, semaphore release, transaction end) just forgets it: for a
 * session-level hold that is how the job acknowledges the loss.  A
 * multi-lock giving back the holds it took itself (zkh_undo_hold) does not
 * acknowledge: no work ran under them, and earlier holds on the name stay
 * counted.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "zk_holds.h"
#include "zk_layout.h"
#include "zk_memory.h"
#include "zk_session.h"
#include "zk_shared.h"

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
	bool		lost;			/* in lost_holds, not holds */
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
 * walk that only reads is fine (update_lease, from remove_entry, does one).
 * A walk left before its end must be stopped (walk_stop).
 */
typedef struct EntryWalk
{
	HTAB	   *tables[2];		/* in walking order; NULL for none */
	int			next;			/* index in tables of the next to start */
	bool		scanning;		/* status is a scan under way */
	HASH_SEQ_STATUS status;
} EntryWalk;

static HTAB *holds = NULL;
static HTAB *lost_holds = NULL;
static int64 losses = 0;

/*
 * Names of lost session-level holds acknowledged in this transaction: a
 * transaction that acknowledges a loss must not commit what it wrote,
 * since that work was done under the lost lock (zkh_check_commit).
 */
static StringInfo acknowledged_in_xact = NULL;

/*
 * The wording of a loss that stops a statement or a commit.  The detail
 * names the locks.
 */
#define LOST_CANCEL_MSG \
	"canceling statement because zklock lost its ZooKeeper session"
#define LOST_COMMIT_MSG \
	"cannot commit because zklock lost its ZooKeeper session"
#define LOST_XACT_DETAIL "The transaction held these locks, now lost: %s."
#define LOST_SESSION_DETAIL \
	"This backend held these locks at session level, now lost: %s."
#define LOST_XACT_CANCEL_HINT \
	"The transaction cannot commit.  Roll it back and retry it under a new lock."
#define LOST_XACT_COMMIT_HINT \
	"The transaction is rolled back.  Retry it under a new lock."
#define LOST_SESSION_HINT \
	"No transaction that writes can commit until the loss is acknowledged: release each lost lock (zk_unlock, zk_semaphore_release) or call zk_unlock_all(), then redo the work under a new lock."

/* Whether COMMIT and ROLLBACK wait for their releases to be confirmed. */
static bool zklock_synchronous_release;

/* Whether a lost session-level hold keeps writing transactions from committing. */
static bool zklock_fail_closed;

/*
 * How long a hold may last, in ms, from its grant (0: for ever).  Past it,
 * the session is given up as if it were lost (zks_set_lease).
 */
static int	zklock_lease;

/* Whether the session has a lease armed for one of our holds. */
static bool lease_published = false;

/* zklock.fail_closed changed: whether a loss cancels may have too. */
static bool cancel_on_loss_stale = false;

static void
fail_closed_assigned(bool newval, void *extra)
{
	cancel_on_loss_stale = true;
}

void
zkh_define_settings(void)
{
	DefineCustomBoolVariable("zklock.synchronous_release",
							 "Sets whether COMMIT and ROLLBACK wait for ZooKeeper to confirm the release of transaction-level locks.",
							 "When off, the release is sent and retried until confirmed, but the transaction ends at once.",
							 &zklock_synchronous_release,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("zklock.fail_closed",
							 "Sets whether session-level zklocks guard commits as transaction-level ones do.",
							 "When on, a loss cancels the running statement, and after a session-level lock is lost no transaction that writes commits until the loss is acknowledged.  When off, a session-level loss is only reported, by a WARNING at the next zklock call.",
							 &zklock_fail_closed,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, fail_closed_assigned, NULL);
	DefineCustomIntVariable("zklock.lease",
							"Sets how long a zklock may be held before zklock gives it up by itself.",
							"Counted from each grant; applies to the locks and slots granted while it is set.  When a hold outlives it, the backend's ZooKeeper session is given up as if it were lost: every lock it holds is released and fails closed.  0 means no lease.",
							&zklock_lease,
							0, 0, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* How many holds a mode has at scope. */
static int
hold_count(const HoldMode *mode, CountScope scope)
{
	return (scope != HOLD_XACT ? mode->session_count : 0) +
		(scope != HOLD_SESSION ? mode->xact_count : 0);
}

/* How many of an entry's modes have a hold at scope. */
static int
modes_held(const LockEntry *entry, CountScope scope)
{
	return (hold_count(&entry->modes[0], scope) > 0) +
		(hold_count(&entry->modes[1], scope) > 0);
}

/* How many entries a table has; none before it is made. */
static int64
entry_count(HTAB *table)
{
	return table == NULL ? 0 : hash_get_num_entries(table);
}

static void
walk_begin(EntryWalk *walk, HTAB *first, HTAB *second)
{
	walk->tables[0] = first;
	walk->tables[1] = second;
	walk->next = 0;
	walk->scanning = false;
}

/* The next entry of a walk, or NULL at its end. */
static LockEntry *
walk_next(EntryWalk *walk)
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

static void
walk_stop(EntryWalk *walk)
{
	if (walk->scanning)
		hash_seq_term(&walk->status);
	walk->scanning = false;
}

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
	walk_begin(&walk, holds, NULL);
	while ((entry = walk_next(&walk)) != NULL)
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

/*
 * A hold is taken under the current zklock.lease.  The first hold on a
 * node (fresh: none was left on it) starts its lease anew; a stacked one
 * may only bring the deadline closer, so no hold outlives its own lease.
 */
static void
take_lease(HoldMode *mode, bool fresh)
{
	int64		until;

	if (fresh)
		mode->lease_until = 0;
	if (zklock_lease <= 0)
		return;
	until = zks_monotonic_ms() + zklock_lease;
	if (mode->lease_until == 0 || until < mode->lease_until)
	{
		mode->lease_until = until;
		mode->lease_ms = zklock_lease;
	}
}

static void note_acknowledged(const char *name);

static HTAB *
make_table(const char *name)
{
	HASHCTL		ctl;

	ctl.keysize = ZKL_NODE_MAX;
	ctl.entrysize = sizeof(LockEntry);
	ctl.hcxt = zk_memory();
	return hash_create(name, 16, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

static void
ensure_tables(void)
{
	if (holds == NULL)
		holds = make_table("zklock holds");
	if (lost_holds == NULL)
		lost_holds = make_table("zklock lost holds");
}

static LockEntry *
find_in(HTAB *table, const char *key)
{
	if (table == NULL)
		return NULL;
	return hash_search(table, key, HASH_FIND, NULL);
}

/* Find or make an entry; a new one has no node and no hold. */
static LockEntry *
enter(HTAB *table, const char *key, const char *name)
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
		Assert(table == holds || table == lost_holds);
		entry->lost = table == lost_holds;
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

static bool
has_node(const HoldMode *mode)
{
	return mode->node.path[0] != '\0';
}

static void
remove_entry(LockEntry *entry)
{
	HTAB	   *table = entry->lost ? lost_holds : holds;
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

static void
reserve_subids(HoldMode *mode, int needed)
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

/* Tell the session whether a loss should cancel, when that changes. */
static void
tell_cancel_on_loss(bool cancel)
{
	static int	told = -1;

	if (told != cancel)
		zks_set_cancel_on_loss(cancel);
	told = cancel;
}

/* Room for the hold was reserved by the caller, so this cannot fail. */
static void
add_hold(HoldMode *mode, bool xact)
{
	if (xact)
	{
		Assert(mode->xact_count < mode->xact_alloc);
		mode->xact_subids[mode->xact_count++] = GetCurrentSubTransactionId();
	}
	else
		mode->session_count++;
	if (xact || zklock_fail_closed)
		tell_cancel_on_loss(true);
}

/* Has any entry of table a hold at scope? */
static bool
any_held(HTAB *table, CountScope scope)
{
	EntryWalk	walk;
	LockEntry  *entry;

	walk_begin(&walk, table, NULL);
	while ((entry = walk_next(&walk)) != NULL)
	{
		if (modes_held(entry, scope) > 0)
		{
			walk_stop(&walk);
			return true;
		}
	}
	return false;
}

/* How many modes of the entries of table have a hold at scope. */
static int
count_modes_held(HTAB *table, CountScope scope)
{
	EntryWalk	walk;
	LockEntry  *entry;
	int			n = 0;

	walk_begin(&walk, table, NULL);
	while ((entry = walk_next(&walk)) != NULL)
		n += modes_held(entry, scope);
	return n;
}

/*
 * A loss cancels the running statement while a live hold guards commits:
 * any transaction-level one, or with zklock.fail_closed any at all.
 */
static void
update_cancel_on_loss(void)
{
	tell_cancel_on_loss(any_held(holds, zklock_fail_closed ? HOLD_ANY :
								 HOLD_XACT));
}

static int64 entry_token(const LockEntry *entry);

/*
 * Show the holds of one entry to the rest of the server (zk_shared.c),
 * after a change to them.  Writes shared memory only; never fails.
 */
static void
show_entry(LockEntry *entry)
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
										entry_token(entry), mode->since);
		else if (mode->shown != 0)
		{
			zksh_drop_hold(mode->shown);
			mode->shown = 0;
		}
	}
}

/* Show every hold, after a change to many. */
static void
show_holds(void)
{
	EntryWalk	walk;
	LockEntry  *entry;

	/* Else show_entry updates the lease for each entry shown. */
	if (!zksh_enabled())
	{
		update_lease(false);
		return;
	}
	walk_begin(&walk, holds, lost_holds);
	while ((entry = walk_next(&walk)) != NULL)
		show_entry(entry);
}

/*
 * A lock this backend has a node for already, in this mode: take one more
 * hold at no cost.  The node may be one kept only to hold our place while
 * the other mode is held; it is still ours and still in place.
 */
bool
zkh_add_if_held(const char *parent, bool shared, bool xact)
{
	LockEntry  *entry = find_in(holds, parent);
	HoldMode   *mode;

	if (entry == NULL)
		return false;
	mode = &entry->modes[shared];
	if (!has_node(mode) || mode->acquiring)
		return false;
	reserve_subids(mode, mode->xact_count + 1);
	/* A fresh hold on a node kept to hold our place starts now. */
	if (hold_count(mode, HOLD_ANY) == 0)
		mode->since = GetCurrentTimestamp();
	take_lease(mode, hold_count(mode, HOLD_ANY) == 0);
	add_hold(mode, xact);
	show_entry(entry);
	return true;
}

/* What the releases of one operation left to do; see finish_releases. */
static bool releases_pending = false;
static bool release_failed = false;

static void
release_node(HoldMode *mode)
{
	if (zkr_release(mode->node.path))
		releases_pending = true;
	else
		release_failed = true;
	mode->node.path[0] = '\0';
	mode->node.czxid = 0;
}

/*
 * After holds ended: release each mode that has no hold left, unless it
 * keeps our place for the other mode (see the header comment); drop the
 * entry once nothing is left.  Nodes are czxid-ordered: both are ours.
 */
static bool
settle(LockEntry *entry)
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
		if (!entry->lost)
			release_node(mode);
		else
			mode->node.path[0] = '\0';
	}
	for (m = 0; m < 2; m++)
	{
		HoldMode   *mode = &entry->modes[m];

		if (hold_count(mode, HOLD_ANY) > 0 || has_node(mode) ||
			mode->acquiring)
			return true;
	}
	remove_entry(entry);
	return false;
}

/* End one hold of a mode at scope: at transaction scope, the newest. */
static void
end_hold(LockEntry *entry, int m, CountScope scope)
{
	HoldMode   *mode = &entry->modes[m];

	Assert(scope != HOLD_ANY && hold_count(mode, scope) > 0);
	if (scope == HOLD_XACT)
		mode->xact_count--;
	else
		mode->session_count--;
	if (settle(entry))
		show_entry(entry);
}

/*
 * Wait for the nodes released to be gone, if the caller must.  If one could
 * not even be handed to the janitor (out of memory), end the session: that
 * deletes every node this backend has, so no lock is left stuck, and the
 * holds left are reported lost by the next zklock call (nothing here may
 * allocate: the transaction-end callbacks call this).
 */
static void
finish_releases(bool wait)
{
	if (release_failed || zks_janitor_failed())
		zks_close();
	else if (releases_pending && wait)
		zkr_wait_released();
	releases_pending = false;
	release_failed = false;
}

/*
 * Acquire the lock: make a slot for the mode, run the recipe, and on a
 * grant take the first hold.  Whatever goes wrong, the slot is dropped
 * again; the recipe deletes its node.
 */
ZkrResult
zkh_acquire(const char *parent, const char *name, bool shared, bool xact,
			const char *data, bool wait, TimestampTz deadline, bool *waited)
{
	LockEntry  *entry;
	HoldMode   *mode;
	HoldMode   *other;
	ZkrResult	result;

	ensure_tables();
	entry = enter(holds, parent, name);
	mode = &entry->modes[shared];
	other = &entry->modes[!shared];
	Assert(!has_node(mode) && !mode->acquiring);
	mode->acquiring = true;

	PG_TRY();
	{
		reserve_subids(mode, mode->xact_count + 1);
		zksh_wait_begin(parent, name, shared, false, xact);
		result = zkr_acquire(parent, shared, 0,
							 has_node(other) ? other->node.path : NULL,
							 data, wait, deadline, &mode->node, waited);
		zksh_wait_end();
	}
	PG_CATCH();
	{
		zksh_wait_end();
		mode->acquiring = false;
		mode->node.path[0] = '\0';
		settle(entry);
		PG_RE_THROW();
	}
	PG_END_TRY();

	mode->acquiring = false;
	if (result == ZKR_GRANTED)
	{
		mode->since = GetCurrentTimestamp();
		take_lease(mode, true);
		mode->verified_at = zks_connection_count();
		add_hold(mode, xact);
		show_entry(entry);
	}
	else if (settle(entry))
		show_entry(entry);
	return result;
}

/*
 * Take back the last hold this backend took on a lock at this scope, live
 * or lost: a multi-lock that did not get every name gives back what it
 * took.  At transaction scope that is the newest transaction hold, which
 * the current subtransaction took.
 */
void
zkh_undo_hold(const char *parent, bool shared, bool xact)
{
	CountScope	scope = xact ? HOLD_XACT : HOLD_SESSION;
	LockEntry  *entry = find_in(holds, parent);

	/*
	 * The live hold if there is one, else a lost one: a name lost before and
	 * taken again by this call must keep its unacknowledged lost hold.
	 */
	if (entry == NULL || hold_count(&entry->modes[shared], scope) == 0)
		entry = find_in(lost_holds, parent);
	if (entry != NULL && hold_count(&entry->modes[shared], scope) > 0)
		end_hold(entry, shared, scope);
	update_cancel_on_loss();
	finish_releases(true);
}

bool
zkh_release_session_hold(const char *parent, bool shared, const char *name)
{
	LockEntry  *entry;

	/* A lost hold is reported first, so the job learns of the loss. */
	entry = find_in(lost_holds, parent);
	if (entry && entry->modes[shared].session_count > 0)
	{
		note_acknowledged(name);
		end_hold(entry, shared, HOLD_SESSION);
		ereport(WARNING,
				(errmsg("zklock \"%s\" was lost with the ZooKeeper session and is not held",
						name),
				 errhint("Another client may have held it since the loss.")));
		return false;
	}

	entry = find_in(holds, parent);
	if (entry == NULL || entry->modes[shared].session_count == 0)
	{
		ereport(WARNING,
				(errmsg("zklock \"%s\" is not held in %s mode at session level by this backend",
						name, shared ? "shared" : "exclusive")));
		return false;
	}
	end_hold(entry, shared, HOLD_SESSION);
	finish_releases(true);
	update_cancel_on_loss();
	return true;
}

void
zkh_release_all_session_holds(void)
{
	EntryWalk	walk;
	LockEntry  *entry;

	walk_begin(&walk, lost_holds, holds);
	while ((entry = walk_next(&walk)) != NULL)
	{
		if (entry->lost && modes_held(entry, HOLD_SESSION) > 0)
			note_acknowledged(entry->name);
		entry->modes[0].session_count = 0;
		entry->modes[1].session_count = 0;
		settle(entry);
	}
	show_holds();
	finish_releases(true);
	update_cancel_on_loss();
}

/* Move one live entry to the lost table, merging with an earlier loss. */
static void
move_to_lost(LockEntry *entry)
{
	LockEntry  *lost = enter(lost_holds, entry->key, entry->name);
	int			m;

	lost->semaphore = entry->semaphore;
	for (m = 0; m < 2; m++)
	{
		HoldMode   *from = &entry->modes[m];
		HoldMode   *to = &lost->modes[m];
		int			i;

		if (hold_count(from, HOLD_ANY) == 0)
			continue;
		losses++;
		if (to->since == 0)
		{
			to->since = from->since;
			to->node = from->node;
		}
		reserve_subids(to, to->xact_count + from->xact_count);
		for (i = 0; i < from->xact_count; i++)
			to->xact_subids[to->xact_count++] = from->xact_subids[i];
		to->session_count += from->session_count;
	}
	settle(lost);
	remove_entry(entry);
}

static void
append_name(StringInfo names, const char *name)
{
	appendStringInfo(names, "%s\"%s\"", names->len > 0 ? ", " : "", name);
}

/*
 * The session that held our nodes is gone, or must be taken as gone: end
 * it, which deletes any node of ours it still has, move every entry to the
 * lost table and, if warn, say which locks were lost (the commit checks
 * say so in their ERROR instead).  The session is ended first, and the
 * WARNING comes last: a WARNING services interrupts, and a loss cancel
 * landing in it must find the bookkeeping done and no node left behind.
 */
static void
lose_session(bool warn)
{
	EntryWalk	walk;
	LockEntry  *entry;
	StringInfoData names;

	zks_close();
	if (entry_count(holds) == 0)
		return;
	initStringInfo(&names);
	walk_begin(&walk, holds, NULL);
	while ((entry = walk_next(&walk)) != NULL)
	{
		if (modes_held(entry, HOLD_ANY) > 0)
		{
			append_name(&names, entry->name);
			zksh_count(entry->key, entry->semaphore, ZKSH_LOSSES, 1);
		}
		move_to_lost(entry);
	}
	show_holds();
	tell_cancel_on_loss(false);
	if (warn && names.len > 0)
		ereport(WARNING,
				(errmsg("zklock lost its ZooKeeper session"),
				 errdetail("These locks were held, and are lost: %s.  %s",
						   names.data, zks_loss_reason()),
				 errhint(zklock_fail_closed ? LOST_SESSION_HINT :
						 "Another client may have acquired them since.  Redo the work they protect under a new lock.")));
	pfree(names.data);
}

/* Names of the lost holds still remembered at scope, for messages. */
static void
append_lost_names(StringInfo names, CountScope scope)
{
	EntryWalk	walk;
	LockEntry  *entry;

	walk_begin(&walk, lost_holds, NULL);
	while ((entry = walk_next(&walk)) != NULL)
		if (modes_held(entry, scope) > 0)
			append_name(names, entry->name);
}

/*
 * Raise the ERROR of a loss: a refused commit (40000), or a cancelled
 * statement (57014), naming the lost locks of each scope that counts, and
 * saying how to go on.
 */
pg_noreturn static void
raise_loss(bool commit, bool xact, bool session)
{
	StringInfoData xact_names;
	StringInfoData session_names;
	StringInfoData detail;

	initStringInfo(&xact_names);
	initStringInfo(&session_names);
	initStringInfo(&detail);
	if (xact)
		append_lost_names(&xact_names, HOLD_XACT);
	if (session)
		append_lost_names(&session_names, HOLD_SESSION);
	if (xact_names.len > 0)
		appendStringInfo(&detail, LOST_XACT_DETAIL "  ", xact_names.data);
	if (session_names.len > 0)
		appendStringInfo(&detail, LOST_SESSION_DETAIL "  ", session_names.data);
	appendStringInfoString(&detail, zks_loss_reason());
	if (xact_names.len > 0 || session_names.len > 0)
		appendStringInfoString(&detail, "  Another client may hold them now.");
	ereport(ERROR,
			(errcode(commit ? ERRCODE_TRANSACTION_ROLLBACK :
					 ERRCODE_QUERY_CANCELED),
			 errmsg(commit ? LOST_COMMIT_MSG : LOST_CANCEL_MSG),
			 errdetail_internal("%s", detail.data),
			 session_names.len > 0 ? errhint(LOST_SESSION_HINT) :
			 xact_names.len > 0 ?
			 errhint(commit ? LOST_XACT_COMMIT_HINT : LOST_XACT_CANCEL_HINT) : 0));
}

/*
 * The watchdog cancelled the running statement because the session was
 * lost (zk_guard.c catches that cancel): raise it anew in zklock's words.
 * Session-level holds are named there only where they guard commits; with
 * zklock.fail_closed off they get the plain WARNING.
 */
void
zkh_raise_loss_cancel(void)
{
	lose_session(!zklock_fail_closed);
	raise_loss(false, true, zklock_fail_closed);
}

/*
 * The fencing token of an entry: the czxid of the backend's earliest node
 * on the name, which is where it stands in the queue (zk_queue.c), so every
 * earlier exclusive holder's token is smaller and every later one's larger.
 */
static int64
entry_token(const LockEntry *entry)
{
	int64		token = 0;
	int			m;

	for (m = 0; m < 2; m++)
		if (has_node(&entry->modes[m]) &&
			(token == 0 || entry->modes[m].node.czxid < token))
			token = entry->modes[m].node.czxid;
	return token;
}

/* The fencing token of a held lock, or 0 if it is not held. */
int64
zkh_token(const char *parent)
{
	LockEntry  *entry = find_in(holds, parent);

	if (entry == NULL || modes_held(entry, HOLD_ANY) == 0)
		return 0;
	return entry_token(entry);
}

/*
 * Acquire one slot of the semaphore of this size under parent; a slot is
 * recorded only once granted, as an entry of its own.
 */
ZkrResult
zkh_acquire_slot(const char *parent, const char *name, int slots, bool xact,
				 const char *data, bool wait, TimestampTz deadline,
				 bool *waited)
{
	ZkLockNode	node;
	volatile ZkrResult result = ZKR_BUSY;

	ensure_tables();
	zksh_wait_begin(parent, name, false, true, xact);
	PG_TRY();
	{
		result = zkr_acquire(parent, false, slots, NULL, data, wait, deadline,
							 &node, waited);
	}
	PG_FINALLY();
	{
		zksh_wait_end();
	}
	PG_END_TRY();
	if (result != ZKR_GRANTED)
		return result;

	/* Should the slot not be recorded, its node goes at once. */
	PG_TRY();
	{
		LockEntry  *entry = enter(holds, node.path, name);
		HoldMode   *mode = &entry->modes[0];

		entry->semaphore = true;
		mode->node = node;
		reserve_subids(mode, 1);
		mode->since = GetCurrentTimestamp();
		take_lease(mode, true);
		mode->verified_at = zks_connection_count();
		add_hold(mode, xact);
		show_entry(entry);
	}
	PG_CATCH();
	{
		LockEntry  *entry = find_in(holds, node.path);

		if (entry)
			remove_entry(entry);
		if (!zkr_release(node.path))
			zks_close();
		PG_RE_THROW();
	}
	PG_END_TRY();
	return result;
}

/* Is an entry a slot of the semaphore under parent? */
static bool
is_slot_of(const LockEntry *entry, const char *parent)
{
	size_t		len = strlen(parent);

	return entry->semaphore && strncmp(entry->key, parent, len) == 0 &&
		entry->key[len] == '/';
}

/*
 * The newest slot this backend holds at session level of the semaphore
 * under parent, in table; NULL if none.
 */
static LockEntry *
newest_session_slot(HTAB *table, const char *parent)
{
	EntryWalk	walk;
	LockEntry  *entry;
	LockEntry  *newest = NULL;

	walk_begin(&walk, table, NULL);
	while ((entry = walk_next(&walk)) != NULL)
		if (is_slot_of(entry, parent) && entry->modes[0].session_count > 0 &&
			(newest == NULL ||
			 entry->modes[0].node.czxid > newest->modes[0].node.czxid))
			newest = entry;
	return newest;
}

/*
 * Release one session-level slot of the semaphore under parent, the newest;
 * false with a WARNING if there is none, or it was lost.
 */
bool
zkh_release_slot(const char *parent, const char *name)
{
	LockEntry  *entry = newest_session_slot(lost_holds, parent);

	if (entry)
	{
		note_acknowledged(name);
		end_hold(entry, 0, HOLD_SESSION);
		ereport(WARNING,
				(errmsg("zklock semaphore \"%s\" lost a slot with the ZooKeeper session",
						name),
				 errhint("Another client may have held it since the loss.")));
		return false;
	}
	entry = newest_session_slot(holds, parent);
	if (entry == NULL)
	{
		ereport(WARNING,
				(errmsg("zklock semaphore \"%s\" has no slot held at session level by this backend",
						name)));
		return false;
	}
	end_hold(entry, 0, HOLD_SESSION);
	finish_releases(true);
	update_cancel_on_loss();
	return true;
}

/*
 * The fencing token of this backend's oldest slot of the semaphore under
 * parent, or 0 if it holds none.
 */
int64
zkh_slot_token(const char *parent)
{
	EntryWalk	walk;
	LockEntry  *entry;
	int64		token = 0;

	walk_begin(&walk, holds, NULL);
	while ((entry = walk_next(&walk)) != NULL)
		if (is_slot_of(entry, parent) && modes_held(entry, HOLD_ANY) > 0 &&
			(token == 0 || entry->modes[0].node.czxid < token))
			token = entry->modes[0].node.czxid;
	return token;
}

/* Is this child of parent one of this backend's nodes? */
bool
zkh_owns_node(const char *parent, const char *child)
{
	LockEntry  *entry = find_in(holds, parent);
	int			m;

	if (entry == NULL)
		return false;
	for (m = 0; m < 2; m++)
	{
		const char *path = entry->modes[m].node.path;

		if (path[0] != '\0' && strcmp(zkl_basename(path), child) == 0)
			return true;
	}
	return false;
}

/* How many locks and modes this backend holds now. */
int
zkh_held_count(void)
{
	return count_modes_held(holds, HOLD_ANY);
}

/*
 * Before any lock work: if the session was lost (or closed under held
 * locks, or a release could not be kept track of), report the lost locks
 * and close it; if settings changed and nothing is held, close it so the
 * next lock opens one with the new settings.
 */
void
zkh_check_session(void)
{
	if (!zks_is_open() || zks_is_lost() || zks_janitor_failed())
		lose_session(true);
	else if (zks_settings_changed() && entry_count(holds) == 0)
		zks_close();
	if (cancel_on_loss_stale)
	{
		cancel_on_loss_stale = false;
		update_cancel_on_loss();
	}
}

/*
 * Does this backend hold any zklock, remember any lost one, or has this
 * transaction acknowledged a loss?
 */
bool
zkh_any(void)
{
	return entry_count(holds) > 0 || entry_count(lost_holds) > 0 ||
		(acknowledged_in_xact != NULL && acknowledged_in_xact->len > 0);
}

/*
 * How many locks and semaphore slots this backend lost at session level
 * and has not yet let go of (acknowledged).
 */
int
zkh_unacknowledged_losses(void)
{
	return count_modes_held(lost_holds, HOLD_SESSION);
}

/* How many holds were lost with a session, over this backend's life. */
int64
zkh_losses(void)
{
	return losses;
}

/*
 * One row per lock, mode and scope held, live or lost, for zk_locks.
 * Returns how many; the rows point into the table, so read them at once.
 */
int
zkh_rows(ZkHoldRow **rows_out)
{
	int64		capacity = 4 * (entry_count(holds) + entry_count(lost_holds));
	ZkHoldRow  *rows = palloc(Max(capacity, 1) * sizeof(ZkHoldRow));
	int			n = 0;
	EntryWalk	walk;
	LockEntry  *entry;

	walk_begin(&walk, holds, lost_holds);
	while ((entry = walk_next(&walk)) != NULL)
	{
		int			m;
		CountScope	scope;

		for (m = 0; m < 2; m++)
		{
			HoldMode   *mode = &entry->modes[m];

			/* The two scopes a hold is taken at, not HOLD_ANY. */
			for (scope = HOLD_SESSION; scope <= HOLD_XACT; scope++)
			{
				int			count = hold_count(mode, scope);

				if (count == 0)
					continue;
				rows[n].name = entry->name;
				rows[n].shared = m;
				rows[n].semaphore = entry->semaphore;
				rows[n].xact = scope == HOLD_XACT;
				rows[n].count = count;
				rows[n].lost = entry->lost;
				rows[n].node = mode->node.path;
				rows[n].token = entry->lost ? mode->node.czxid :
					entry_token(entry);
				rows[n].since = mode->since;
				n++;
			}
		}
	}
	*rows_out = rows;
	return n;
}

/* A lost session-level hold of this name was let go: remember it. */
static void
note_acknowledged(const char *name)
{
	char	   *quoted = psprintf("\"%s\"", name);

	if (acknowledged_in_xact == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(zk_memory());

		acknowledged_in_xact = makeStringInfo();
		MemoryContextSwitchTo(old);
	}
	if (strstr(acknowledged_in_xact->data, quoted) == NULL)
		append_name(acknowledged_in_xact, name);
	pfree(quoted);
}

/*
 * Before a commit: are the live holds that guard it (transaction-level
 * ones, and with session_too every one) still held?  Wait out a
 * disconnection (unsure) until the session is back or lost, make sure the
 * session reached the leader recently enough (zks_confirm_contact), and
 * after a reconnect check that each of their nodes is still ours.  If not,
 * every hold moves to the lost table.
 */
static void
confirm_holds(bool session_too)
{
	EntryWalk	walk;
	LockEntry  *entry;
	StringInfoData lost_names;

	if (entry_count(holds) == 0)
		return;
	if (!zks_confirm_contact())
	{
		lose_session(false);
		return;
	}

	/*
	 * After a reconnect, check every node of every name that guards the
	 * commit, the one kept for its place included.  One missing means
	 * another client deleted it: the session's other nodes cannot be
	 * trusted either, so the session is ended, which deletes them, and
	 * every hold is lost.
	 */
	initStringInfo(&lost_names);
	walk_begin(&walk, holds, NULL);
	while ((entry = walk_next(&walk)) != NULL)
	{
		int			m;

		if (modes_held(entry, session_too ? HOLD_ANY : HOLD_XACT) == 0)
			continue;
		for (m = 0; m < 2; m++)
		{
			HoldMode   *mode = &entry->modes[m];

			if (!has_node(mode) || mode->verified_at == zks_connection_count())
				continue;
			if (zkr_verify(mode->node.path))
				mode->verified_at = zks_connection_count();
			else if (lost_names.len == 0)
				append_name(&lost_names, entry->name);
		}
	}
	if (lost_names.len > 0)
	{
		lose_session(false);
		ereport(WARNING,
				(errmsg("zklock found a lock node gone after reconnecting"),
				 errdetail("Another client deleted the node of lock %s; the ZooKeeper session is ended so that none of its other nodes is trusted.",
						   lost_names.data)));
	}
	pfree(lost_names.data);
	update_cancel_on_loss();
}

/*
 * May the transaction commit, or with prepare be prepared?  Not if it holds
 * a transaction-level lock that is lost, nor, when it wrote and
 * zklock.fail_closed is on, while this backend holds a session-level lock
 * that is lost (and not yet acknowledged) or that the session cannot
 * confirm.  Raises the ERROR that refuses the commit; the statement guard
 * (zk_guard.c) calls this where a commit begins.
 */
void
zkh_check_commit(bool wrote, bool prepare)
{
	bool		session_too = wrote && zklock_fail_closed;

	/* A ZooKeeper lock cannot outlive this backend's session. */
	if (prepare && (any_held(holds, HOLD_XACT) ||
					any_held(lost_holds, HOLD_XACT)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that holds transaction-level zklocks"),
				 errhint("Use session-level zklocks, released with zk_unlock(), around two-phase transactions.")));
	if (any_held(holds, HOLD_XACT) || (session_too && entry_count(holds) > 0))
		confirm_holds(session_too);
	if (any_held(lost_holds, session_too ? HOLD_ANY : HOLD_XACT))
		raise_loss(true, true, session_too);
	if (session_too && acknowledged_in_xact && acknowledged_in_xact->len > 0)
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_ROLLBACK),
				 errmsg(LOST_COMMIT_MSG),
				 errdetail("This transaction wrote, and acknowledged the loss of these locks held at session level: %s.  What it did may have been done under them after they were lost.",
						   acknowledged_in_xact->data),
				 errhint("The transaction is rolled back.  Acknowledge a loss in a transaction of its own, then redo the work under a new lock.")));
}

/*
 * End the transaction holds taken in subid, or with all in any
 * subtransaction.  By default the release waits (a bounded time) for
 * ZooKeeper to confirm it, so that the lock is free for others when COMMIT
 * or ROLLBACK returns; zklock.synchronous_release = off only sends it: the
 * janitor sees it through, and this backend's next acquire is ordered
 * after it.
 */
static void
end_xact_holds(SubTransactionId subid, bool all)
{
	EntryWalk	walk;
	LockEntry  *entry;

	walk_begin(&walk, lost_holds, holds);
	while ((entry = walk_next(&walk)) != NULL)
	{
		bool		ended = false;
		int			m;

		for (m = 0; m < 2; m++)
		{
			HoldMode   *mode = &entry->modes[m];
			int			kept = 0;
			int			i;

			for (i = 0; i < mode->xact_count; i++)
				if (!all && mode->xact_subids[i] != subid)
					mode->xact_subids[kept++] = mode->xact_subids[i];
			ended |= kept != mode->xact_count;
			mode->xact_count = kept;
		}
		if (ended)
			settle(entry);
	}
	show_holds();
	finish_releases(zklock_synchronous_release);
	update_cancel_on_loss();
}

static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			end_xact_holds(InvalidSubTransactionId, true);
			if (acknowledged_in_xact)
				resetStringInfo(acknowledged_in_xact);
			break;
		case XACT_EVENT_PREPARE:
			if (acknowledged_in_xact)
				resetStringInfo(acknowledged_in_xact);
			break;
		default:
			break;
	}
}

static void subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg);

/* Install the transaction callbacks that end transaction holds. */
void
zkh_register_callbacks(void)
{
	RegisterXactCallback(xact_callback, NULL);
	RegisterSubXactCallback(subxact_callback, NULL);
}

/* Pass the transaction holds of a committed subtransaction to its parent. */
static void
reassign_subxact(SubTransactionId mySubid, SubTransactionId parentSubid)
{
	EntryWalk	walk;
	LockEntry  *entry;

	walk_begin(&walk, holds, lost_holds);
	while ((entry = walk_next(&walk)) != NULL)
	{
		int			m;
		int			i;

		for (m = 0; m < 2; m++)
			for (i = 0; i < entry->modes[m].xact_count; i++)
				if (entry->modes[m].xact_subids[i] == mySubid)
					entry->modes[m].xact_subids[i] = parentSubid;
	}
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			end_xact_holds(mySubid, false);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			reassign_subxact(mySubid, parentSubid);
			break;
		default:
			break;
	}
}
