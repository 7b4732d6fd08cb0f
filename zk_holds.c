/*-------------------------------------------------------------------------
 *
 * zk_holds.c
 *	  The table of zklocks this backend holds.
 *
 * Holds stack as advisory locks do.  One lock node serves every hold on a
 * name, session and transaction level alike, so a repeated acquire costs no
 * ZooKeeper request; the node is deleted when the last hold ends.
 *
 * Each transaction hold remembers the subtransaction that took it, so
 * ROLLBACK TO a savepoint ends the holds taken after it, and RELEASE
 * SAVEPOINT passes them to the parent.  COMMIT and ABORT end all of them;
 * those callbacks run with interrupts held and must not raise an ERROR, so
 * they only hand the nodes to the janitor and wait a bounded time.
 *
 * When the ZooKeeper session is lost, every hold moves to a second table of
 * lost holds.  They keep their counts so that zk_unlock can say the lock was
 * lost, and so that a transaction holding a lost lock cannot commit: the
 * pre-commit callback raises an ERROR naming it.  Ending them (unlock,
 * unlock_all, transaction end) just forgets them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "zk_holds.h"
#include "zk_session.h"

static HTAB *holds = NULL;
static HTAB *lost_holds = NULL;
static int64 losses = 0;

static HTAB *
make_table(const char *name)
{
	HASHCTL		ctl;

	ctl.keysize = ZKH_KEY_MAX;
	ctl.entrysize = sizeof(ZkHold);
	return hash_create(name, 16, &ctl, HASH_ELEM | HASH_STRINGS);
}

static void
ensure_tables(void)
{
	if (holds == NULL)
		holds = make_table("zklock holds");
	if (lost_holds == NULL)
		lost_holds = make_table("zklock lost holds");
}

/* A lock name's two modes are separate locks, with separate nodes. */
static void
make_key(char key[ZKH_KEY_MAX], const char *parent, bool shared)
{
	size_t		len = strlen(parent);

	Assert(len + 2 <= ZKH_KEY_MAX);
	memcpy(key, parent, len);
	key[len] = shared ? 's' : 'x';
	key[len + 1] = '\0';
}

static ZkHold *
find_in(HTAB *table, const char *parent, bool shared)
{
	char		key[ZKH_KEY_MAX];

	if (table == NULL)
		return NULL;
	make_key(key, parent, shared);
	return hash_search(table, key, HASH_FIND, NULL);
}

ZkHold *
zkh_find(const char *parent, bool shared)
{
	return find_in(holds, parent, shared);
}

/* Make an entry for a lock about to be acquired. */
ZkHold *
zkh_reserve(const char *parent, bool shared, const char *name)
{
	ZkHold	   *hold;
	char		key[ZKH_KEY_MAX];
	bool		found;

	ensure_tables();
	make_key(key, parent, shared);
	hold = hash_search(holds, key, HASH_ENTER, &found);
	Assert(!found);
	strlcpy(hold->parent, parent, sizeof(hold->parent));
	hold->shared = shared;
	hold->since = 0;
	strlcpy(hold->name, name, sizeof(hold->name));
	hold->node.path[0] = '\0';
	hold->node.czxid = 0;
	hold->contact_epoch = zks_contact_epoch();
	hold->session_count = 0;
	hold->xact_count = 0;
	hold->xact_subids = NULL;
	hold->xact_alloc = 0;
	return hold;
}

static void
reserve_subids(ZkHold *hold, int needed)
{
	int			alloc;

	if (needed <= hold->xact_alloc)
		return;
	alloc = Max(needed, Max(4, hold->xact_alloc * 2));
	/* Record the new size only once the memory is there. */
	if (hold->xact_subids == NULL)
		hold->xact_subids = MemoryContextAlloc(TopMemoryContext,
											   alloc * sizeof(SubTransactionId));
	else
		hold->xact_subids = repalloc(hold->xact_subids,
									 alloc * sizeof(SubTransactionId));
	hold->xact_alloc = alloc;
}

/*
 * Make room for one more transaction hold, so that zkh_add_hold, which runs
 * once the lock is ours, cannot fail.
 */
void
zkh_prepare_hold(ZkHold *hold)
{
	reserve_subids(hold, hold->xact_count + 1);
}

/* A loss should cancel the running statement only in a critical section. */
static void
update_cancel_on_loss(void)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;
	bool		any = false;

	if (holds)
	{
		hash_seq_init(&status, holds);
		while ((hold = hash_seq_search(&status)) != NULL)
			any |= hold->xact_count > 0;
	}
	zks_set_cancel_on_loss(any);
}

void
zkh_add_hold(ZkHold *hold, bool xact)
{
	if (xact)
	{
		hold->xact_subids[hold->xact_count++] = GetCurrentSubTransactionId();
		if (hold->xact_count == 1)
			zks_set_cancel_on_loss(true);
	}
	else
		hold->session_count++;
}

static void
remove_entry(HTAB *table, ZkHold *hold)
{
	if (hold->xact_subids)
		pfree(hold->xact_subids);
	hash_search(table, hold->key, HASH_REMOVE, NULL);
}

/* Drop an entry without touching its node. */
void
zkh_forget(ZkHold *hold)
{
	remove_entry(holds, hold);
}

/* What the releases of one operation left to do; see finish_releases. */
static bool releases_pending = false;
static bool release_failed = false;

/*
 * If no hold is left, hand the node to the janitor (lost holds have none
 * any more) and drop the entry.
 */
static void
release_if_unheld(HTAB *table, ZkHold *hold)
{
	if (hold->session_count > 0 || hold->xact_count > 0)
		return;
	if (table == holds)
	{
		if (zkr_release(hold->node.path))
			releases_pending = true;
		else
			release_failed = true;
	}
	remove_entry(table, hold);
}

/*
 * Wait for the nodes released to be gone, if the caller must.  If one could
 * not even be handed to the janitor (out of memory), end the session: that
 * deletes every node this backend has, so no lock is left stuck, and the
 * other holds are reported lost.  Raises no ERROR, for the transaction-end
 * callbacks.
 */
static void
finish_releases(bool wait)
{
	if (release_failed)
	{
		zkh_mark_all_lost();
		zks_close();
	}
	else if (releases_pending && wait)
		zkr_wait_released();
	releases_pending = false;
	release_failed = false;
}

bool
zkh_release_session_hold(const char *parent, bool shared, const char *name)
{
	ZkHold	   *hold;

	/* A lost hold is reported first, so the job learns of the loss. */
	hold = find_in(lost_holds, parent, shared);
	if (hold && hold->session_count > 0)
	{
		hold->session_count--;
		release_if_unheld(lost_holds, hold);
		ereport(WARNING,
				(errmsg("zklock \"%s\" was lost with the ZooKeeper session and is not held",
						name),
				 errhint("Another client may have held it since the loss.")));
		return false;
	}

	hold = zkh_find(parent, shared);
	if (hold == NULL || hold->session_count == 0)
	{
		ereport(WARNING,
				(errmsg("zklock \"%s\" is not held in %s mode at session level by this backend",
						name, shared ? "shared" : "exclusive")));
		return false;
	}
	hold->session_count--;
	release_if_unheld(holds, hold);
	finish_releases(true);
	return true;
}

static void
release_all_session_holds_in(HTAB *table)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (table == NULL)
		return;
	hash_seq_init(&status, table);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		hold->session_count = 0;
		release_if_unheld(table, hold);
	}
}

void
zkh_release_all_session_holds(void)
{
	release_all_session_holds_in(lost_holds);
	release_all_session_holds_in(holds);
	finish_releases(true);
}

bool
zkh_is_empty(void)
{
	return holds == NULL || hash_get_num_entries(holds) == 0;
}

/* Move one live hold to the lost table, merging with an earlier loss. */
static void
move_to_lost(ZkHold *hold)
{
	ZkHold	   *lost;
	bool		found;
	int			i;

	losses++;
	lost = hash_search(lost_holds, hold->key, HASH_ENTER, &found);
	if (!found)
	{
		strlcpy(lost->parent, hold->parent, sizeof(lost->parent));
		lost->shared = hold->shared;
		lost->since = hold->since;
		strlcpy(lost->name, hold->name, sizeof(lost->name));
		lost->node = hold->node;
		lost->contact_epoch = hold->contact_epoch;
		lost->session_count = 0;
		lost->xact_count = 0;
		lost->xact_subids = NULL;
		lost->xact_alloc = 0;
	}
	reserve_subids(lost, lost->xact_count + hold->xact_count);
	for (i = 0; i < hold->xact_count; i++)
		lost->xact_subids[lost->xact_count++] = hold->xact_subids[i];
	lost->session_count += hold->session_count;
	remove_entry(holds, hold);
}

static void
append_name(StringInfo names, const char *name)
{
	appendStringInfo(names, "%s\"%s\"", names->len > 0 ? ", " : "", name);
}

/*
 * The session that held our nodes is gone, and the nodes with it.  Move
 * every hold to the lost table and say which locks were lost.
 */
void
zkh_mark_all_lost(void)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;
	StringInfoData names;

	if (zkh_is_empty())
		return;
	initStringInfo(&names);
	hash_seq_init(&status, holds);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		append_name(&names, hold->name);
		move_to_lost(hold);
	}
	zks_set_cancel_on_loss(false);
	ereport(WARNING,
			(errmsg("zklock lost its ZooKeeper session and with it these locks: %s",
					names.data),
			 errdetail("The session expired or was cut off for longer than its timeout."),
			 errhint("Another client may have acquired them since.  Redo the work they protect under a new lock.")));
	pfree(names.data);
}

static void
append_xact_hold_names(StringInfo names, HTAB *table)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (table == NULL)
		return;
	hash_seq_init(&status, table);
	while ((hold = hash_seq_search(&status)) != NULL)
		if (hold->xact_count > 0)
			append_name(names, hold->name);
}

/* Names of the locks held at transaction level, live or lost, for messages. */
char *
zkh_xact_hold_names(void)
{
	StringInfoData names;

	initStringInfo(&names);
	append_xact_hold_names(&names, holds);
	append_xact_hold_names(&names, lost_holds);
	return names.data;
}

/*
 * Inside the pre-commit checks.  A loss cancel can land there (any WARNING
 * services interrupts), and must then read as the refused commit it is.
 */
static bool committing = false;

bool
zkh_committing(void)
{
	return committing;
}

/*
 * The fencing token of a held lock, or 0 if it is not held: the exclusive
 * node's if held in both modes.
 */
int64
zkh_token(const char *parent)
{
	ZkHold	   *hold = zkh_find(parent, false);

	if (hold == NULL)
		hold = zkh_find(parent, true);
	return hold ? hold->node.czxid : 0;
}

/* How many holds were lost with a session, over this backend's life. */
int64
zkh_losses(void)
{
	return losses;
}

/*
 * Copies of every live and lost entry, for the zk_locks view.  Returns how
 * many; lost_out says which are lost.
 */
int
zkh_list(ZkHold **holds_out, bool **lost_out)
{
	HTAB	   *tables[2] = {holds, lost_holds};
	int			capacity = 0;
	int			n = 0;
	int			t;

	for (t = 0; t < 2; t++)
		if (tables[t])
			capacity += hash_get_num_entries(tables[t]);
	*holds_out = palloc(Max(capacity, 1) * sizeof(ZkHold));
	*lost_out = palloc(Max(capacity, 1) * sizeof(bool));
	for (t = 0; t < 2; t++)
	{
		HASH_SEQ_STATUS status;
		ZkHold	   *hold;

		if (tables[t] == NULL)
			continue;
		hash_seq_init(&status, tables[t]);
		while ((hold = hash_seq_search(&status)) != NULL)
		{
			(*holds_out)[n] = *hold;
			(*lost_out)[n] = (t == 1);
			n++;
		}
	}
	return n;
}

/*
 * Before COMMIT: a transaction must not commit unless its zklocks are
 * still held.  Wait out a disconnection (unsure) until the session is back
 * or lost; after a reconnect, check that each node is still ours.
 */
static void
confirm_xact_holds(void)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;
	StringInfoData lost_names;

	if (zkh_is_empty())
		return;
	if (!zks_wait_while_unsure())
	{
		zkh_mark_all_lost();
		zks_close();
		return;
	}

	initStringInfo(&lost_names);
	hash_seq_init(&status, holds);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		if (hold->xact_count == 0 ||
			hold->contact_epoch == zks_contact_epoch())
			continue;
		if (zkr_verify(hold->node.path))
			hold->contact_epoch = zks_contact_epoch();
		else
		{
			append_name(&lost_names, hold->name);
			move_to_lost(hold);
		}
	}
	if (lost_names.len > 0)
		ereport(WARNING,
				(errmsg("zklock lost these locks while disconnected: %s",
						lost_names.data)));
	pfree(lost_names.data);
	update_cancel_on_loss();
}

static void
refuse_commit_of_lost_holds(void)
{
	StringInfoData names;

	initStringInfo(&names);
	append_xact_hold_names(&names, lost_holds);
	if (names.len > 0)
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_ROLLBACK),
				 errmsg(ZKH_CANNOT_COMMIT_MSG, names.data),
				 errdetail(ZKH_CANNOT_COMMIT_DETAIL),
				 errhint(ZKH_CANNOT_COMMIT_HINT)));
	pfree(names.data);
}

/* End the transaction holds taken in subid, or in any subtransaction. */
static void
end_xact_holds_in(HTAB *table, SubTransactionId subid, bool all)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (table == NULL)
		return;
	hash_seq_init(&status, table);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		int			kept = 0;
		int			i;

		for (i = 0; i < hold->xact_count; i++)
			if (!all && hold->xact_subids[i] != subid)
				hold->xact_subids[kept++] = hold->xact_subids[i];
		if (kept == hold->xact_count)
			continue;
		hold->xact_count = kept;
		release_if_unheld(table, hold);
	}
}

/*
 * Transaction-level releases do not wait for ZooKeeper unless asked to:
 * the delete is sent, the janitor sees it through, and this backend's next
 * acquire is ordered after it.  Another client may see the lock held for
 * one more round trip.
 */
static void
end_xact_holds(SubTransactionId subid, bool all)
{
	end_xact_holds_in(lost_holds, subid, all);
	end_xact_holds_in(holds, subid, all);
	finish_releases(zklock_synchronous_release);
	update_cancel_on_loss();
}

static bool
has_xact_holds_in(HTAB *table)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (table == NULL)
		return false;
	hash_seq_init(&status, table);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		if (hold->xact_count > 0)
		{
			hash_seq_term(&status);
			return true;
		}
	}
	return false;
}

void
zkh_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			committing = true;
			if (has_xact_holds_in(holds))
				confirm_xact_holds();
			refuse_commit_of_lost_holds();
			committing = false;
			break;
		case XACT_EVENT_PRE_PREPARE:
			/* A ZooKeeper lock cannot outlive this backend's session. */
			if (has_xact_holds_in(holds) || has_xact_holds_in(lost_holds))
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that holds transaction-level zklocks"),
						 errhint("Use session-level zklocks, released with zk_unlock(), around two-phase transactions.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			committing = false;
			end_xact_holds(InvalidSubTransactionId, true);
			/* A loss cancel that never reached a statement is moot now. */
			(void) zks_take_loss_cancel();
			break;
		default:
			break;
	}
}

static void
reassign_subxact(HTAB *table, SubTransactionId mySubid,
				 SubTransactionId parentSubid)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (table == NULL)
		return;
	hash_seq_init(&status, table);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		int			i;

		for (i = 0; i < hold->xact_count; i++)
			if (hold->xact_subids[i] == mySubid)
				hold->xact_subids[i] = parentSubid;
	}
}

void
zkh_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			end_xact_holds(mySubid, false);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			reassign_subxact(holds, mySubid, parentSubid);
			reassign_subxact(lost_holds, mySubid, parentSubid);
			break;
		default:
			break;
	}
}
