/*-------------------------------------------------------------------------
 *
 * zk_holds.c
 *	  Taking and ending the zklocks this backend holds.
 *
 * The table (zk_hold_table.c, which this file calls down into) has one
 * entry per lock name, with a slot for each mode.  Holds stack as
 * advisory locks do.  One lock node serves every hold of a mode, session
 * and transaction level alike, so a repeated acquire costs no ZooKeeper
 * request.
 *
 * A mode's node is deleted when its last hold ends (zkht_settle), with one
 * exception that the queue rules need (zk_queue.c): while the other mode is
 * still held, a node created before the other mode's node stays, holding
 * the backend's place in the queue, so no client queued between the two
 * nodes is granted beside the later one.  It goes with the last hold on
 * the name, and a new acquire of its mode meanwhile takes it up again at no
 * cost.
 *
 * Each transaction hold remembers the subtransaction that took it, so
 * ROLLBACK TO a savepoint ends the holds taken after it, and RELEASE
 * SAVEPOINT passes them to the parent.  COMMIT and ABORT end all of them;
 * those callbacks run after the commit record, with interrupts held, and
 * must not raise an ERROR: they allocate nothing from PostgreSQL, hand the
 * nodes to the janitor and wait a bounded time.
 *
 * When the ZooKeeper session is lost, every entry moves to a second table
 * of lost holds; moving them there, and what that means for commits, is
 * zk_fail_closed.c's, which this file tells of every change through the
 * hooks in zk_holds_int.h.  Ending a lost hold here (unlock, unlock_all, a
 * semaphore's release) is how the job acknowledges the loss, and the
 * release functions tell zk_fail_closed.c so; a multi-lock's undo of its
 * own holds is not.  A lease (zklock.lease) is taken here with each hold,
 * and the table arms the session's for the earliest: the session is given
 * up when a hold outlives it, which fails closed as any loss does.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "holds/zk_holds.h"
#include "holds/zk_holds_int.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

/* Whether COMMIT and ROLLBACK wait for their releases to be confirmed. */
static bool zklock_synchronous_release;

/*
 * How long a hold may last, in ms, from its grant (0: for ever).  Past it,
 * the session is given up as if it were lost (zks_set_lease), and fails
 * closed as any loss does (zk_fail_closed.c).
 */
static int	zklock_lease;

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
	zkfc_define_settings();
	zkht_define_settings();
	DefineCustomIntVariable("zklock.lease",
							"Sets how long a zklock may be held before zklock gives it up by itself.",
							"Counted from each grant; applies to the locks and slots granted while it is set.  When a hold outlives it, the backend's ZooKeeper session is given up as if it were lost: every lock it holds is released and fails closed.  0 means no lease.",
							&zklock_lease,
							0, 0, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
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
	zkfc_hold_added(xact);
}

/*
 * A lock this backend has a node for already, in this mode: take one more
 * hold at no cost.  The node may be one kept only to hold our place while
 * the other mode is held; it is still ours and still in place.
 */
bool
zkh_add_if_held(const char *parent, bool shared, bool xact)
{
	LockEntry  *entry = zkht_find(zkht_live, parent);
	HoldMode   *mode;

	if (entry == NULL)
		return false;
	mode = &entry->modes[shared];
	if (!has_node(mode) || mode->acquiring)
		return false;
	zkht_reserve_subids(mode, mode->xact_count + 1);
	/* A fresh hold on a node kept to hold our place starts now. */
	if (hold_count(mode, HOLD_ANY) == 0)
		mode->since = GetCurrentTimestamp();
	take_lease(mode, hold_count(mode, HOLD_ANY) == 0);
	add_hold(mode, xact);
	zkht_show_entry(entry);
	return true;
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
	if (zkht_settle(entry))
		zkht_show_entry(entry);
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
	if (!zkht_release_failed && zkht_releases_pending && wait)
		zkr_wait_released();
	if (zkht_release_failed || zks_janitor_failed())
		zks_close();
	zkht_releases_pending = false;
	zkht_release_failed = false;
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
	bool		kept = false;

	zkht_ensure_tables();
	entry = zkht_enter(zkht_live, parent, name);
	mode = &entry->modes[shared];
	other = &entry->modes[!shared];
	Assert(!has_node(mode) && !mode->acquiring);
	mode->acquiring = true;

	PG_TRY();
	{
		zkht_reserve_subids(mode, mode->xact_count + 1);
		/* A node this backend kept at its last release, if nobody came. */
		kept = !shared && !has_node(other) && zks_keeps_any() &&
			zkr_take_kept(parent, &mode->node, &mode->shown);
		if (kept)
			result = ZKR_GRANTED;
		else
		{
			zksh_wait_begin(parent, name, shared, false, xact);
			result = zkr_acquire(parent, shared, 0,
								 has_node(other) ? other->node.path : NULL,
								 data, wait, deadline, &mode->node, waited);
			zksh_wait_end();
		}
	}
	PG_CATCH();
	{
		zksh_wait_end();
		mode->acquiring = false;
		mode->node.path[0] = '\0';
		zkht_settle(entry);
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
		zkht_show_entry(entry);
		if (kept)
			zksh_count(parent, false, ZKSH_KEPT_ACQUISITIONS, 1);
	}
	else if (zkht_settle(entry))
		zkht_show_entry(entry);
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
	LockEntry  *entry = zkht_find(zkht_live, parent);

	/*
	 * The live hold if there is one, else a lost one: a name lost before and
	 * taken again by this call must keep its unacknowledged lost hold.
	 */
	if (entry == NULL || hold_count(&entry->modes[shared], scope) == 0)
		entry = zkht_find(zkht_lost, parent);
	if (entry != NULL && hold_count(&entry->modes[shared], scope) > 0)
		end_hold(entry, shared, scope);
	zkfc_update_cancel_on_loss();
	finish_releases(true);
}

bool
zkh_release_session_hold(const char *parent, bool shared, const char *name)
{
	LockEntry  *entry;

	/* A lost hold is reported first, so the job learns of the loss. */
	entry = zkht_find(zkht_lost, parent);
	if (entry && entry->modes[shared].session_count > 0)
	{
		zkfc_note_acknowledged(name);
		end_hold(entry, shared, HOLD_SESSION);
		ereport(WARNING,
				(errmsg("zklock \"%s\" was lost with the ZooKeeper session and is not held",
						name),
				 errhint("Another client may have held it since the loss.")));
		return false;
	}

	entry = zkht_find(zkht_live, parent);
	if (entry == NULL || entry->modes[shared].session_count == 0)
	{
		ereport(WARNING,
				(errmsg("zklock \"%s\" is not held in %s mode at session level by this backend",
						name, shared ? "shared" : "exclusive")));
		return false;
	}
	zkfc_note_released();
	end_hold(entry, shared, HOLD_SESSION);
	finish_releases(true);
	zkfc_update_cancel_on_loss();
	return true;
}

void
zkh_release_all_session_holds(void)
{
	EntryWalk	walk;
	LockEntry  *entry;

	/* Kept nodes go too, waited for as released ones, and none is kept. */
	if (zks_give_up_kept())
		zkht_releases_pending = true;
	zkht_keeping_suspended = true;

	zkht_walk_begin(&walk, zkht_lost, zkht_live);
	while ((entry = zkht_walk_next(&walk)) != NULL)
	{
		if (modes_held(entry, HOLD_SESSION) > 0)
		{
			if (entry->lost)
				zkfc_note_acknowledged(entry->name);
			else
				zkfc_note_released();
		}
		entry->modes[0].session_count = 0;
		entry->modes[1].session_count = 0;
		zkht_settle(entry);
	}
	zkht_keeping_suspended = false;
	zkht_show_holds();
	finish_releases(true);
	zkfc_update_cancel_on_loss();
}

/* The fencing token of a held lock, or 0 if it is not held. */
int64
zkh_token(const char *parent)
{
	LockEntry  *entry = zkht_find(zkht_live, parent);

	if (entry == NULL || modes_held(entry, HOLD_ANY) == 0)
		return 0;
	return zkht_entry_token(entry);
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

	zkht_ensure_tables();
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
		LockEntry  *entry = zkht_enter(zkht_live, node.path, name);
		HoldMode   *mode = &entry->modes[0];

		entry->semaphore = true;
		mode->node = node;
		zkht_reserve_subids(mode, 1);
		mode->since = GetCurrentTimestamp();
		take_lease(mode, true);
		mode->verified_at = zks_connection_count();
		add_hold(mode, xact);
		zkht_show_entry(entry);
	}
	PG_CATCH();
	{
		LockEntry  *entry = zkht_find(zkht_live, node.path);

		if (entry)
			zkht_remove_entry(entry);
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

	zkht_walk_begin(&walk, table, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
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
	LockEntry  *entry = newest_session_slot(zkht_lost, parent);

	if (entry)
	{
		zkfc_note_acknowledged(name);
		end_hold(entry, 0, HOLD_SESSION);
		ereport(WARNING,
				(errmsg("zklock semaphore \"%s\" lost a slot with the ZooKeeper session",
						name),
				 errhint("Another client may have held it since the loss.")));
		return false;
	}
	entry = newest_session_slot(zkht_live, parent);
	if (entry == NULL)
	{
		ereport(WARNING,
				(errmsg("zklock semaphore \"%s\" has no slot held at session level by this backend",
						name)));
		return false;
	}
	zkfc_note_released();
	end_hold(entry, 0, HOLD_SESSION);
	finish_releases(true);
	zkfc_update_cancel_on_loss();
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

	zkht_walk_begin(&walk, zkht_live, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
		if (is_slot_of(entry, parent) && modes_held(entry, HOLD_ANY) > 0 &&
			(token == 0 || entry->modes[0].node.czxid < token))
			token = entry->modes[0].node.czxid;
	return token;
}

/* Is this child of parent one of this backend's nodes? */
bool
zkh_owns_node(const char *parent, const char *child)
{
	LockEntry  *entry = zkht_find(zkht_live, parent);
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
	return zkht_count_modes_held(zkht_live, HOLD_ANY);
}

/*
 * One row per lock, mode and scope held, live or lost, for zk_locks.
 * Returns how many; the rows point into the table, so read them at once.
 */
int
zkh_rows(ZkHoldRow **rows_out)
{
	int64		capacity = 4 * (entry_count(zkht_live) + entry_count(zkht_lost));
	ZkHoldRow  *rows = palloc(Max(capacity, 1) * sizeof(ZkHoldRow));
	int			n = 0;
	EntryWalk	walk;
	LockEntry  *entry;

	zkht_walk_begin(&walk, zkht_live, zkht_lost);
	while ((entry = zkht_walk_next(&walk)) != NULL)
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
					zkht_entry_token(entry);
				rows[n].since = mode->since;
				n++;
			}
		}
	}
	*rows_out = rows;
	return n;
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

	zkht_walk_begin(&walk, zkht_lost, zkht_live);
	while ((entry = zkht_walk_next(&walk)) != NULL)
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
			zkht_settle(entry);
	}
	zkht_show_holds();
	finish_releases(zklock_synchronous_release);
	zkfc_update_cancel_on_loss();
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
			zkfc_xact_ended();
			/* Holding nothing now, the session may be closed when idle. */
			if (entry_count(zkht_live) == 0)
				zks_set_idle();
			break;
		case XACT_EVENT_PREPARE:
			zkfc_xact_ended();
			break;
		default:
			return;
	}

	/*
	 * The end of every transaction, zklock's or not, logs what the client
	 * library said meanwhile.
	 */
	zks_log_client_messages();
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

	zkht_walk_begin(&walk, zkht_live, zkht_lost);
	while ((entry = zkht_walk_next(&walk)) != NULL)
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
