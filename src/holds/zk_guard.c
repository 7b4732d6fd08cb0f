/*-------------------------------------------------------------------------
 *
 * zk_guard.c
 *	  The statement guard: what zklock does around every statement and
 *	  every commit so that work done under a lock this backend no longer
 *	  holds never commits.
 *
 * Cancelling.  When the session is lost while a statement runs, the loss
 * watchdog (zk_watchdog.c) cancels it.  The watchdog is a thread of its own,
 * and PostgreSQL gives such a thread one way to stop the backend: SIGINT,
 * its query cancel, which ends the statement with "canceling statement
 * due to user request".  So the executor and utility hooks here wrap every
 * statement: while one runs, the watchdog may cancel it, and the cancel
 * that comes out of it is caught and raised again in zklock's words
 * (zkh_raise_loss_cancel).  A cancel sent just as the statement ends, too
 * late to interrupt it, is taken back and raised as the statement ends; a
 * user's cancel that arrives in the same instant is taken back with it,
 * which loses nothing, since the statement fails either way.  Outside a
 * statement (idle, parsing, a transaction statement, the commit's own
 * bookkeeping) the watchdog sends nothing: a COMMIT fails from the commit
 * check, or as the cancel of a query it runs (a deferred trigger's), or,
 * in a procedure, whose CALL still runs, as the CALL's cancel.
 *
 * A loss found while no statement runs (idle, parsing, between one
 * statement's executor calls) cancels nothing; the commit checks stop what
 * follows.
 *
 * Committing.  The commit check (zkh_check_commit) needs to know whether
 * the transaction wrote: it has an xid, or it ran INSERT, UPDATE, DELETE
 * or MERGE (on any table, foreign ones included), COPY FROM, or any other
 * utility statement but the few that change nothing (transaction control,
 * settings, cursors, prepared statements, EXPLAIN, LISTEN, LOCK ...).  It
 * runs in the pre-commit callback, which every commit passes (COMMIT, an
 * autocommit statement, a procedure's COMMIT, PREPARE TRANSACTION) after
 * the work PostgreSQL does at commit (deferred triggers, WITH HOLD
 * cursors): until then the transaction is an ordinary one, whose
 * statements a loss cancels and whose lease runs out.  Other extensions
 * commit things of their own in pre-commit callbacks too (postgres_fdw its
 * remote transactions), and PostgreSQL calls the newest first; so at the
 * end of every statement of a backend that holds zklocks, its callback is
 * registered anew, to be called before any registered during the
 * statement (stay_first_at_commit says how far that goes).  From the check
 * to the transaction's end no loss cancel is sent and no lease runs out.
 *
 * Some statements are checked before they run as well: a utility
 * statement that runs in a transaction of its own, since some commit by
 * themselves (VACUUM) or cannot be undone (DROP DATABASE), and COMMIT
 * PREPARED, which commits a transaction prepared earlier from one that
 * writes nothing.
 *
 * Resetting.  DISCARD ALL, which poolers run between two clients of one
 * server connection, releases the session-level holds as it releases
 * advisory locks (see release_on_discard_all).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"

#include "holds/zk_guard.h"
#include "holds/zk_holds.h"
#include "session/zk_session.h"

static ExecutorStart_hook_type prev_ExecutorStart = NULL;
static ExecutorRun_hook_type prev_ExecutorRun = NULL;
static ExecutorFinish_hook_type prev_ExecutorFinish = NULL;
static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/* Statements nested in the one running (SPI, triggers), that one included. */
static int	statement_depth = 0;

/* This transaction ran a statement that writes (see the header comment). */
static bool transaction_wrote = false;

/*
 * This transaction ran DISCARD ALL, which runs alone in its transaction.
 * The xid it takes to drop the session's temporary tables marks no work
 * done under a lock, so it does not make the commit one that wrote: as a
 * write, it would be refused for the very losses it acknowledged.  A
 * statement that writes through the executor still counts.
 */
static bool discarded_all = false;

/* This transaction's commit check has begun. */
static bool committing = false;

/* This transaction's pre-commit callbacks are being called. */
static bool in_pre_commit = false;

/*
 * This transaction is a block that BEGIN started (not one that a query of
 * several statements makes, whose commit no COMMIT statement announces),
 * and a COMMIT or PREPARE TRANSACTION statement has set it to end.
 */
static bool explicit_block = false;
static bool block_ending = false;

/*
 * The pre-commit callback is registered once for good (the first of
 * registration_args) and again, later, to be called first (see
 * stay_first_at_commit); its argument tells the registrations apart.  Any
 * of them checks the commit, the first called; the later ones go at the
 * transaction's end.  At most MAX_LATER_REGISTRATIONS are kept at once.
 */
#define MAX_LATER_REGISTRATIONS 1000
static char registration_args[1 + MAX_LATER_REGISTRATIONS];
static int	later_registrations = 0;

static void guard_xact_callback(XactEvent event, void *arg);

/* A statement, or part of one, run inside the guard. */
typedef void (*StatementPart) (void *arg);

/*
 * Drop the later registrations; only where no callback can be being
 * called, or from the lasting registration's own call, after theirs.
 */
static void
forget_later_registrations(void)
{
	for (; later_registrations > 0; later_registrations--)
		UnregisterXactCallback(guard_xact_callback,
							   &registration_args[later_registrations]);
}

/*
 * A statement ended: make the pre-commit callback the first again, ahead of
 * any registered during the statement (postgres_fdw registers on its first
 * use), so that the commit check comes before their pre-commit work.
 *
 * PostgreSQL follows the list of callbacks while it calls them, so no
 * registration may be dropped while they could be being called: that is,
 * inside a commit, where a callback ahead of ours may run statements.  A
 * statement at the top of a block that BEGIN started and that is not
 * ending is not inside a commit: there the earlier registrations are
 * dropped.  Elsewhere one is only added, up to the bound; past it, a
 * callback registered later may come first.
 */
static void
stay_first_at_commit(void)
{
	if (in_pre_commit || !zkh_any())
		return;
	if (statement_depth == 0 && explicit_block && !block_ending)
		forget_later_registrations();
	if (later_registrations == MAX_LATER_REGISTRATIONS)
	{
		elog(DEBUG1, "zklock keeps %d registrations of its pre-commit callback, and adds no more in this transaction",
			 later_registrations);
		return;
	}
	RegisterXactCallback(guard_xact_callback,
						 &registration_args[later_registrations + 1]);
	later_registrations++;
}

static void
enter_statement(void)
{
	if (statement_depth++ == 0)
		(void) zks_set_running(true);
}

/*
 * The statement ended normally.  If the watchdog cancelled it too late to
 * interrupt it, the loss is reported now.
 */
static void
leave_statement(void)
{
	if (--statement_depth == 0 && zks_set_running(false))
		zkh_raise_loss_cancel();
}

/*
 * The statement ended in an ERROR, which the caller re-throws unless it is
 * the watchdog's cancel, raised here anew in zklock's words.
 */
static void
leave_statement_on_error(void)
{
	/* Taken before the statement stops running, which takes it back. */
	bool		loss_cancel = geterrcode() == ERRCODE_QUERY_CANCELED &&
		zks_take_loss_cancel();

	if (--statement_depth == 0)
		(void) zks_set_running(false);
	if (loss_cancel)
	{
		FlushErrorState();
		zkh_raise_loss_cancel();
	}
}

static void
run_guarded(StatementPart part, void *arg)
{
	MemoryContext context = CurrentMemoryContext;

	enter_statement();
	PG_TRY();
	{
		part(arg);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		leave_statement_on_error();
		PG_RE_THROW();
	}
	PG_END_TRY();
	leave_statement();
}

/* From here to the transaction's end no loss cancel and no lease. */
static void
start_committing(void)
{
	if (!committing)
	{
		committing = true;
		(void) zks_set_committing(true);
	}
}

/*
 * The commit check.  Where the commit itself follows (commits), it stops
 * loss cancels and leases from then on: the check finds a loss itself.
 */
static void
check_commit(bool prepare, bool commits)
{
	if (!zkh_any())
		return;
	if (commits)
		start_committing();
	zkh_check_commit(transaction_wrote ||
					 (!discarded_all &&
					  TransactionIdIsValid(GetTopTransactionIdIfAny())),
					 prepare);
}

/* Is this a statement that runs in a transaction of its own? */
static bool
in_own_transaction(void)
{
	return statement_depth == 0 && !IsTransactionBlock() &&
		IsTransactionState();
}

/*
 * Does this utility statement change anything?  Those that change nothing
 * by themselves are listed; the statements they run (CALL, DO, EXECUTE,
 * EXPLAIN ANALYZE) go through the executor hooks.
 */
static bool
utility_writes(Node *parsetree)
{
	switch (nodeTag(parsetree))
	{
		case T_TransactionStmt:
		case T_VariableSetStmt:
		case T_VariableShowStmt:
		case T_DeclareCursorStmt:
		case T_FetchStmt:
		case T_ClosePortalStmt:
		case T_PrepareStmt:
		case T_ExecuteStmt:
		case T_DeallocateStmt:
		case T_ExplainStmt:
		case T_CallStmt:
		case T_DoStmt:
		case T_ListenStmt:
		case T_UnlistenStmt:
		case T_LoadStmt:
		case T_DiscardStmt:
		case T_CheckPointStmt:
		case T_LockStmt:
		case T_ConstraintsSetStmt:
			return false;
		case T_CopyStmt:
			return ((CopyStmt *) parsetree)->is_from;
		default:
			return true;
	}
}

typedef struct StartCall
{
	QueryDesc  *queryDesc;
	int			eflags;
} StartCall;

static void
start_part(void *arg)
{
	StartCall  *call = arg;

	if (prev_ExecutorStart)
		prev_ExecutorStart(call->queryDesc, call->eflags);
	else
		standard_ExecutorStart(call->queryDesc, call->eflags);
}

static void
guard_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	StartCall	call = {queryDesc, eflags};

	if (!(eflags & EXEC_FLAG_EXPLAIN_ONLY) &&
		(queryDesc->operation != CMD_SELECT ||
		 queryDesc->plannedstmt->hasModifyingCTE))
		transaction_wrote = true;
	run_guarded(start_part, &call);
}

typedef struct RunCall
{
	QueryDesc  *queryDesc;
	ScanDirection direction;
	uint64		count;
#if PG_VERSION_NUM < 180000
	bool		execute_once;
#endif
} RunCall;

static void
run_part(void *arg)
{
	RunCall    *call = arg;

#if PG_VERSION_NUM >= 180000
	if (prev_ExecutorRun)
		prev_ExecutorRun(call->queryDesc, call->direction, call->count);
	else
		standard_ExecutorRun(call->queryDesc, call->direction, call->count);
#else
	if (prev_ExecutorRun)
		prev_ExecutorRun(call->queryDesc, call->direction, call->count,
						 call->execute_once);
	else
		standard_ExecutorRun(call->queryDesc, call->direction, call->count,
							 call->execute_once);
#endif
}

#if PG_VERSION_NUM >= 180000
static void
guard_ExecutorRun(QueryDesc *queryDesc, ScanDirection direction, uint64 count)
{
	RunCall		call = {queryDesc, direction, count};

	run_guarded(run_part, &call);
}
#else
static void
guard_ExecutorRun(QueryDesc *queryDesc, ScanDirection direction, uint64 count,
				  bool execute_once)
{
	RunCall		call = {queryDesc, direction, count, execute_once};

	run_guarded(run_part, &call);
}
#endif

static void
finish_part(void *arg)
{
	QueryDesc  *queryDesc = arg;

	if (prev_ExecutorFinish)
		prev_ExecutorFinish(queryDesc);
	else
		standard_ExecutorFinish(queryDesc);
}

/* A plannable statement ends here, after its AFTER triggers. */
static void
guard_ExecutorFinish(QueryDesc *queryDesc)
{
	run_guarded(finish_part, queryDesc);
	stay_first_at_commit();
}

typedef struct UtilityCall
{
	PlannedStmt *pstmt;
	const char *queryString;
	bool		readOnlyTree;
	ProcessUtilityContext context;
	ParamListInfo params;
	QueryEnvironment *queryEnv;
	DestReceiver *dest;
	QueryCompletion *qc;
} UtilityCall;

static void
utility_part(void *arg)
{
	UtilityCall *call = arg;

	if (prev_ProcessUtility)
		prev_ProcessUtility(call->pstmt, call->queryString, call->readOnlyTree,
							call->context, call->params, call->queryEnv,
							call->dest, call->qc);
	else
		standard_ProcessUtility(call->pstmt, call->queryString,
								call->readOnlyTree, call->context,
								call->params, call->queryEnv, call->dest,
								call->qc);
}

/*
 * DISCARD ALL resets the session for its next user and releases its
 * session-level advisory locks.  It releases the session-level zklocks
 * too, lost ones included, which acknowledges their loss: a client that
 * left a pooled connection without unlocking then strands nothing, and
 * its losses do not refuse the next client's writes; and nodes kept after
 * their release are given up.  It runs outside any transaction block, so
 * no transaction-level hold can be in force.
 */
static void
release_on_discard_all(void)
{
	/* Nodes kept after their release go too. */
	if (zkh_any() || zks_keeps_any())
	{
		zkh_check_session();
		zkh_release_all_session_holds();
	}
}

/*
 * Transaction statements are not guarded: a COMMIT is checked, not
 * cancelled, in the pre-commit callback, which a refused COMMIT leaves as
 * PostgreSQL's own failures at commit do: with the transaction ended.
 */
static void
guard_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
					 bool readOnlyTree, ProcessUtilityContext context,
					 ParamListInfo params, QueryEnvironment *queryEnv,
					 DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;
	UtilityCall call = {pstmt, queryString, readOnlyTree, context, params,
	queryEnv, dest, qc};

	if (IsA(parsetree, TransactionStmt))
	{
		TransactionStmtKind kind = ((TransactionStmt *) parsetree)->kind;

		/* An aborted block ends without a commit, or any callback. */
		bool		aborted = IsAbortedTransactionBlockState();

		/*
		 * COMMIT PREPARED commits from a transaction that wrote nothing: it
		 * is checked before, and the check holds off the lease until that
		 * transaction ends, after the commit it makes.
		 */
		if (kind == TRANS_STMT_COMMIT_PREPARED && zkh_any())
		{
			start_committing();
			zkh_check_commit_prepared(((TransactionStmt *) parsetree)->gid);
		}
		utility_part(&call);
		if (kind == TRANS_STMT_BEGIN || kind == TRANS_STMT_START)
			explicit_block = true;
		else if ((kind == TRANS_STMT_COMMIT || kind == TRANS_STMT_PREPARE) &&
				 !aborted)
			block_ending = true;
		return;
	}
	if (utility_writes(parsetree))
	{
		transaction_wrote = true;
		if (in_own_transaction())
			check_commit(false, false);
	}
	run_guarded(utility_part, &call);
	if (IsA(parsetree, DiscardStmt) &&
		((DiscardStmt *) parsetree)->target == DISCARD_ALL)
	{
		discarded_all = true;
		release_on_discard_all();
	}
	stay_first_at_commit();
}

/*
 * Called once per registration: the first call at PRE_COMMIT or
 * PRE_PREPARE checks the commit, the end events reset the transaction's
 * state (again, harmlessly, in the later calls), and the lasting
 * registration, called after the later ones, drops them.
 */
static void
guard_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (!in_pre_commit)
			{
				in_pre_commit = true;
				check_commit(event == XACT_EVENT_PRE_PREPARE, true);
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			transaction_wrote = false;
			discarded_all = false;
			in_pre_commit = false;
			explicit_block = false;
			block_ending = false;
			if (committing)
			{
				committing = false;
				(void) zks_set_committing(false);
			}
			if (arg == &registration_args[0])
				forget_later_registrations();
			break;
		default:
			break;
	}
}

/* Install the hooks and the pre-commit callback; from _PG_init only. */
void
zkg_install(void)
{
	prev_ExecutorStart = ExecutorStart_hook;
	ExecutorStart_hook = guard_ExecutorStart;
	prev_ExecutorRun = ExecutorRun_hook;
	ExecutorRun_hook = guard_ExecutorRun;
	prev_ExecutorFinish = ExecutorFinish_hook;
	ExecutorFinish_hook = guard_ExecutorFinish;
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = guard_ProcessUtility;
	RegisterXactCallback(guard_xact_callback, &registration_args[0]);
}
