/*-------------------------------------------------------------------------
 *
 * zk_fail_closed.c
 *	  What a lost ZooKeeper session does to the hold table
 *	  (zk_hold_table.c): work done under a lock this backend no longer
 *	  holds never commits.
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
 * A lease (zklock.lease, armed by zk_holds.c) ends the same way: the
 * session is given up when a hold outlives it, and every hold is lost as
 * above.
 *
 * zk_holds.c calls in here whenever it changes the table, and this file
 * works on the table by calling down into zk_hold_table.c, never back into
 * zk_holds.c (zk_holds_int.h).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/zk_memory.h"
#include "holds/zk_holds.h"
#include "holds/zk_holds_int.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

/*
 * Names of lost session-level holds acknowledged in this transaction: a
 * transaction that acknowledges a loss must not commit what it wrote,
 * since that work was done under the lost lock (zkh_check_commit).
 */
static StringInfo acknowledged_in_xact = NULL;

/*
 * The session whose session-level holds this transaction released, or
 * RELEASED_IN_SESSIONS if several: what the transaction wrote before may
 * have been written after a loss not yet noticed, so its commit must find
 * that session still confirmed (zkh_check_commit).  0 if none.
 */
#define RELEASED_IN_SESSIONS (-1)
static int64 released_in_session = 0;

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

/* Whether a lost session-level hold keeps writing transactions from committing. */
static bool zklock_fail_closed;

/* zklock.fail_closed changed: whether a loss cancels may have too. */
static bool cancel_on_loss_stale = false;

static void
fail_closed_assigned(bool newval, void *extra)
{
	cancel_on_loss_stale = true;
}

/* The setting of failing closed, zklock.fail_closed. */
void
zkfc_define_settings(void)
{
	DefineCustomBoolVariable("zklock.fail_closed",
							 "Sets whether session-level zklocks guard commits as transaction-level ones do.",
							 "When on, a loss cancels the running statement, and after a session-level lock is lost no transaction that writes commits until the loss is acknowledged.  When off, a session-level loss is only reported, by a WARNING at the next zklock call.",
							 &zklock_fail_closed,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, fail_closed_assigned, NULL);
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

/*
 * A hold was taken: a loss must now cancel if the hold guards commits.
 * Never raises an ERROR nor allocates.
 */
void
zkfc_hold_added(bool xact)
{
	if (xact || zklock_fail_closed)
		tell_cancel_on_loss(true);
}

/*
 * A loss cancels the running statement while a live hold guards commits:
 * any transaction-level one, or with zklock.fail_closed any at all.  The
 * transaction-end callbacks call this: it never raises an ERROR nor
 * allocates.
 */
void
zkfc_update_cancel_on_loss(void)
{
	tell_cancel_on_loss(zkht_any_held(zkht_live,
									  zklock_fail_closed ? HOLD_ANY : HOLD_XACT));
}

/* Move one live entry to the lost table, merging with an earlier loss. */
static void
move_to_lost(LockEntry *entry)
{
	LockEntry  *lost = zkht_enter(zkht_lost, entry->key, entry->name);
	int			m;

	lost->semaphore = entry->semaphore;
	for (m = 0; m < 2; m++)
	{
		HoldMode   *from = &entry->modes[m];
		HoldMode   *to = &lost->modes[m];
		int			i;

		if (hold_count(from, HOLD_ANY) == 0)
			continue;
		if (to->since == 0)
		{
			to->since = from->since;
			to->node = from->node;
		}
		zkht_reserve_subids(to, to->xact_count + from->xact_count);
		for (i = 0; i < from->xact_count; i++)
			to->xact_subids[to->xact_count++] = from->xact_subids[i];
		to->session_count += from->session_count;
	}
	zkht_settle(lost);
	zkht_remove_entry(entry);
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
	if (entry_count(zkht_live) == 0)
		return;
	initStringInfo(&names);
	zkht_walk_begin(&walk, zkht_live, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
	{
		int			modes = modes_held(entry, HOLD_ANY);

		/*
		 * A hold is a mode held: a name held shared and exclusive loses
		 * two, as it would count two releases.
		 */
		if (modes > 0)
		{
			append_name(&names, entry->name);
			zksh_count(entry->key, entry->semaphore, ZKSH_LOSSES, modes);
		}
		move_to_lost(entry);
	}
	zkht_show_holds();
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

	zkht_walk_begin(&walk, zkht_lost, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
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
 * Before any lock work: if the session was lost (or closed under held
 * locks, or a release could not be kept track of or was refused), report
 * the lost locks and close it; if settings changed and nothing is held,
 * close it so the next lock opens one with the new settings.
 */
void
zkh_check_session(void)
{
	/* Read first, so that a session already closed does not keep it set. */
	bool		janitor_failed = zks_janitor_failed();

	/* What the client library said since, before what this call reports. */
	zks_log_client_messages();
	zkht_collect_kept();
	if (!zks_is_open() || zks_is_lost() || janitor_failed)
	{
		bool		held = entry_count(zkht_live) > 0;
		bool		refused = zks_take_refusal();

		lose_session(true);
		/* With nothing held, nothing else says why. */
		if (refused && !held)
			ereport(WARNING,
					(errmsg("zklock ended its ZooKeeper session"),
					 errdetail_internal("%s", zks_loss_reason())));
	}
	else if (zks_settings_changed() && entry_count(zkht_live) == 0)
		zks_close();
	if (cancel_on_loss_stale)
	{
		cancel_on_loss_stale = false;
		zkfc_update_cancel_on_loss();
	}
}

/*
 * Does this backend hold any zklock, remember any lost one, or has this
 * transaction acknowledged a loss?
 */
bool
zkh_any(void)
{
	return entry_count(zkht_live) > 0 || entry_count(zkht_lost) > 0 ||
		(acknowledged_in_xact != NULL && acknowledged_in_xact->len > 0) ||
		released_in_session != 0;
}

/*
 * How many locks and semaphore slots this backend lost at session level
 * and has not yet let go of (acknowledged).
 */
int
zkh_unacknowledged_losses(void)
{
	return zkht_count_modes_held(zkht_lost, HOLD_SESSION);
}

/*
 * How many holds (a mode of a name each) this backend lost with a session,
 * over its life, as zk_status shows them: a caller that compares it before
 * and after learns whether it lost any meanwhile.
 */
int64
zkh_losses(void)
{
	return zksh_backend_count(ZKSH_LOSSES);
}

/* A lost session-level hold of this name was let go: remember it. */
void
zkfc_note_acknowledged(const char *name)
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

/* A live session-level hold was released: remember by which session. */
void
zkfc_note_released(void)
{
	int64		session = zks_session_id();

	if (session == 0 ||
		(released_in_session != 0 && released_in_session != session))
		released_in_session = RELEASED_IN_SESSIONS;
	else
		released_in_session = session;
}

/*
 * The transaction ended: the losses it acknowledged and the holds it
 * released no longer matter.  Called at transaction end: never raises an
 * ERROR nor allocates.
 */
void
zkfc_xact_ended(void)
{
	if (acknowledged_in_xact)
		resetStringInfo(acknowledged_in_xact);
	released_in_session = 0;
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

	if (entry_count(zkht_live) == 0)
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
	zkht_walk_begin(&walk, zkht_live, NULL);
	while ((entry = zkht_walk_next(&walk)) != NULL)
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
	zkfc_update_cancel_on_loss();
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
	if (prepare && (zkht_any_held(zkht_live, HOLD_XACT) ||
					zkht_any_held(zkht_lost, HOLD_XACT)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that holds transaction-level zklocks"),
				 errhint("Use session-level zklocks, released with zk_unlock(), around two-phase transactions.")));
	if (zkht_any_held(zkht_live, HOLD_XACT) ||
		(session_too && entry_count(zkht_live) > 0))
		confirm_holds(session_too);
	if (zkht_any_held(zkht_lost, session_too ? HOLD_ANY : HOLD_XACT))
		raise_loss(true, true, session_too);
	if (session_too && acknowledged_in_xact && acknowledged_in_xact->len > 0)
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_ROLLBACK),
				 errmsg(LOST_COMMIT_MSG),
				 errdetail("This transaction wrote, and acknowledged the loss of these locks held at session level: %s.  What it did may have been done under them after they were lost.",
						   acknowledged_in_xact->data),
				 errhint("The transaction is rolled back.  Acknowledge a loss in a transaction of its own, then redo the work under a new lock.")));

	/*
	 * A release is confirmed by the server, or waited for only so long:
	 * what the transaction wrote under the lock is safe only if the session
	 * that held it is still the one confirmed now.
	 */
	if (session_too && released_in_session != 0)
	{
		bool		same_session = released_in_session == zks_session_id();

		if (same_session && zks_confirm_contact())
			return;
		if (same_session)
			lose_session(false);
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_ROLLBACK),
				 errmsg(LOST_COMMIT_MSG),
				 errdetail("This transaction wrote, then released a lock held at session level, and the ZooKeeper session that held it cannot be confirmed now: the write may have been done after the lock was lost.  %s",
						   same_session ? zks_loss_reason() :
						   _("That session, or one of them, has ended since.")),
				 errhint(LOST_XACT_COMMIT_HINT)));
	}
}

/*
 * May COMMIT PREPARED commit this prepared transaction?  Not while this
 * backend remembers a lost hold that guards commits: the transaction may
 * have been prepared under it.  The transaction stays prepared.
 */
void
zkh_check_commit_prepared(const char *gid)
{
	CountScope	scope = zklock_fail_closed ? HOLD_ANY : HOLD_XACT;
	StringInfoData names;

	if (zkht_any_held(zkht_live, scope))
		confirm_holds(zklock_fail_closed);
	if (!zkht_any_held(zkht_lost, scope))
		return;
	initStringInfo(&names);
	append_lost_names(&names, scope);
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot commit prepared transaction \"%s\" because zklock lost its ZooKeeper session",
					gid),
			 errdetail("This backend held these locks, now lost: %s.  %s  Another client may hold them now.",
					   names.data, zks_loss_reason()),
			 errhint("The transaction stays prepared.  Roll it back with ROLLBACK PREPARED, then redo its work under a new lock.")));
}
