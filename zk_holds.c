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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "zk_holds.h"

static HTAB *holds = NULL;

static void
ensure_table(void)
{
	HASHCTL		ctl;

	if (holds)
		return;
	ctl.keysize = ZKR_PARENT_MAX;
	ctl.entrysize = sizeof(ZkHold);
	holds = hash_create("zklock holds", 16, &ctl, HASH_ELEM | HASH_STRINGS);
}

ZkHold *
zkh_find(const char *parent)
{
	if (holds == NULL)
		return NULL;
	return hash_search(holds, parent, HASH_FIND, NULL);
}

/* Make an entry for a lock about to be acquired. */
ZkHold *
zkh_reserve(const char *parent, const char *name)
{
	ZkHold	   *hold;
	bool		found;

	ensure_table();
	hold = hash_search(holds, parent, HASH_ENTER, &found);
	Assert(!found);
	strlcpy(hold->name, name, sizeof(hold->name));
	hold->node.path[0] = '\0';
	hold->node.czxid = 0;
	hold->session_count = 0;
	hold->xact_count = 0;
	hold->xact_subids = NULL;
	hold->xact_alloc = 0;
	return hold;
}

/*
 * Make room for one more transaction hold, so that zkh_add_hold, which runs
 * once the lock is ours, cannot fail.
 */
void
zkh_prepare_hold(ZkHold *hold)
{
	if (hold->xact_count < hold->xact_alloc)
		return;
	if (hold->xact_subids == NULL)
	{
		hold->xact_alloc = 4;
		hold->xact_subids = MemoryContextAlloc(TopMemoryContext,
											   hold->xact_alloc * sizeof(SubTransactionId));
	}
	else
	{
		hold->xact_alloc *= 2;
		hold->xact_subids = repalloc(hold->xact_subids,
									 hold->xact_alloc * sizeof(SubTransactionId));
	}
}

void
zkh_add_hold(ZkHold *hold, bool xact)
{
	if (xact)
		hold->xact_subids[hold->xact_count++] = GetCurrentSubTransactionId();
	else
		hold->session_count++;
}

/* Drop an entry without touching its node. */
void
zkh_forget(ZkHold *hold)
{
	if (hold->xact_subids)
		pfree(hold->xact_subids);
	hash_search(holds, hold->parent, HASH_REMOVE, NULL);
}

/* If no hold is left, delete the node and drop the entry. */
static bool
release_if_unheld(ZkHold *hold)
{
	if (hold->session_count > 0 || hold->xact_count > 0)
		return false;
	zkr_release(hold->node.path);
	zkh_forget(hold);
	return true;
}

bool
zkh_release_session_hold(const char *parent, const char *name)
{
	ZkHold	   *hold = zkh_find(parent);

	if (hold == NULL || hold->session_count == 0)
	{
		ereport(WARNING,
				(errmsg("zklock \"%s\" is not held at session level by this backend",
						name)));
		return false;
	}
	hold->session_count--;
	if (release_if_unheld(hold))
		zkr_wait_released();
	return true;
}

void
zkh_release_all_session_holds(void)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;
	bool		released = false;

	if (holds == NULL)
		return;
	hash_seq_init(&status, holds);
	while ((hold = hash_seq_search(&status)) != NULL)
	{
		hold->session_count = 0;
		released |= release_if_unheld(hold);
	}
	if (released)
		zkr_wait_released();
}

bool
zkh_is_empty(void)
{
	return holds == NULL || hash_get_num_entries(holds) == 0;
}

/*
 * The session that held our nodes is gone, and the nodes with it.  Say
 * which locks were lost and forget them.
 */
void
zkh_drop_lost(void)
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
		appendStringInfo(&names, "%s\"%s\"", names.len > 0 ? ", " : "",
						 hold->name);
		zkh_forget(hold);
	}
	ereport(WARNING,
			(errmsg("zklock lost its ZooKeeper session and with it these locks: %s",
					names.data),
			 errhint("Another client may have acquired them since.  Redo the work they protect under a new lock.")));
	pfree(names.data);
}

/* End the transaction holds taken in subid, or in any subtransaction. */
static void
end_xact_holds(SubTransactionId subid, bool all)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;
	bool		released = false;

	if (holds == NULL)
		return;
	hash_seq_init(&status, holds);
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
		released |= release_if_unheld(hold);
	}
	if (released)
		zkr_wait_released();
}

static bool
has_xact_holds(void)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (holds == NULL)
		return false;
	hash_seq_init(&status, holds);
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
		case XACT_EVENT_PRE_PREPARE:
			/* A ZooKeeper lock cannot outlive this backend's session. */
			if (has_xact_holds())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that holds transaction-level zklocks"),
						 errhint("Use session-level zklocks, released with zk_unlock(), around two-phase transactions.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			end_xact_holds(InvalidSubTransactionId, true);
			break;
		default:
			break;
	}
}

void
zkh_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS status;
	ZkHold	   *hold;

	if (holds == NULL)
		return;
	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			end_xact_holds(mySubid, false);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			hash_seq_init(&status, holds);
			while ((hold = hash_seq_search(&status)) != NULL)
			{
				int			i;

				for (i = 0; i < hold->xact_count; i++)
					if (hold->xact_subids[i] == mySubid)
						hold->xact_subids[i] = parentSubid;
			}
			break;
		default:
			break;
	}
}
