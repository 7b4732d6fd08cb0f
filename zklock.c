/*-------------------------------------------------------------------------
 *
 * zklock.c
 *	  Cluster-wide locks for SQL, backed by Apache ZooKeeper: the SQL lock,
 *	  multi-lock and semaphore functions, and the module's start.
 *
 * The functions mirror PostgreSQL's advisory locks.  zk_lock() and friends
 * take session-level holds, ended by zk_unlock() or zk_unlock_all();
 * zk_xact_lock() and friends take transaction-level holds, ended by COMMIT
 * or ROLLBACK (or ROLLBACK TO the savepoint before them).  Holds stack.
 * Each has a _shared variant; a backend's holds of the two modes of a name
 * never conflict with each other, only with other clients'.
 *
 * This file reads arguments (zk_args.c), counts acquisitions and waits
 * (zk_shared.c), opens the session when a call needs one, and asks the
 * hold table (zk_holds.h) for holds; the hold table shows the wait
 * (zk_shared.c) and runs the recipe (zk_recipe.c), which talks to the
 * session (zk_session.h).  CONTRIBUTING.md, Layout, draws the whole
 * structure.
 *
 * Rules that hold throughout:
 *	- Nothing of PostgreSQL runs on a ZooKeeper client thread.
 *	- Every wait is interruptible (cancel, statement_timeout, lock_timeout,
 *	  termination, postmaster death).
 *	- Every way out of a wait other than a grant deletes the waiter's node.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "commands/dbcommands.h"
#include "mb/pg_wchar.h"
#include "postmaster/postmaster.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "base/zk_memory.h"
#include "base/zk_text.h"
#include "holds/zk_guard.h"
#include "holds/zk_holds.h"
#include "interface/zk_args.h"
#include "recipe/zk_deadlock.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

typedef enum LockMode
{
	MODE_EXCLUSIVE,
	MODE_SHARED
} LockMode;

typedef enum HoldScope
{
	SCOPE_SESSION,
	SCOPE_TRANSACTION
} HoldScope;

/* Long enough to mean "no limit", short enough not to overflow. */
#define MAX_TIMEOUT_MS	((int64) 100 * 365 * SECS_PER_DAY * 1000)

/* Room for this host's name in the holder identity. */
#define HOST_NAME_SIZE	256

/*
 * zklock.session_locks: off for clients behind a pooler in transaction
 * mode, where a session-level lock would stay on a server connection that
 * the next client gets, and nothing would ever release it.
 */
static bool zklock_session_locks = true;

static void
define_settings(void)
{
	DefineCustomBoolVariable("zklock.session_locks",
							 "Allows session-level zklocks.",
							 "Turn it off for the roles or databases whose clients connect through a pooler in transaction mode: session-level calls then fail, where their locks would stay on a server connection other clients share.",
							 &zklock_session_locks,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
}

void
_PG_init(void)
{
	define_settings();
	zka_define_settings();
	zks_define_settings();
	zks_define_budget_settings();
	zkh_define_settings();
	zkd_define_settings();
	zksh_define_settings();
	MarkGUCPrefixReserved("zklock");
	zksh_request_shmem();
	zkh_register_callbacks();
	zkg_install();
}

/* Append s, in the database encoding, as a JSON string in UTF-8. */
static void
append_json_utf8(StringInfo buf, const char *s)
{
	char	   *utf8 = zkt_convert_lossy(s, strlen(s), GetDatabaseEncoding(),
										 PG_UTF8, false);

	escape_json(buf, utf8);
	pfree(utf8);
}

/*
 * Who holds the node, as a small JSON document in UTF-8, so an operator
 * looking at ZooKeeper can tell which backend holds a lock.  zk_names.c
 * parses exactly this format back.  Built once, and again only when
 * application_name changes, since it is sent with every acquire.
 */
static const char *
holder_identity(void)
{
	static char *identity = NULL;
	static char *identity_app = NULL;
	const char *app = application_name ? application_name : "";
	char		host[HOST_NAME_SIZE];
	StringInfoData buf;

	if (identity && strcmp(identity_app, app) == 0)
		return identity;

	if (gethostname(host, sizeof(host)) != 0)
		strlcpy(host, "unknown", sizeof(host));
	host[sizeof(host) - 1] = '\0';

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"host\":");
	append_json_utf8(&buf, host);
	appendStringInfo(&buf, ",\"port\":%d,\"pid\":%d,\"database\":",
					 PostPortNumber, MyProcPid);
	append_json_utf8(&buf, get_database_name(MyDatabaseId));
	appendStringInfoString(&buf, ",\"user\":");
	append_json_utf8(&buf, GetUserNameFromId(GetSessionUserId(), false));
	appendStringInfoString(&buf, ",\"application_name\":");
	append_json_utf8(&buf, app);
	appendStringInfoChar(&buf, '}');

	if (identity)
	{
		pfree(identity);
		pfree(identity_app);
	}
	identity = MemoryContextStrdup(zk_memory(), buf.data);
	identity_app = MemoryContextStrdup(zk_memory(), app);
	pfree(buf.data);
	return identity;
}


/*
 * Wait in ZooKeeper's queue, under lock_timeout as a heavyweight lock is:
 * until timeout_ms, or without limit (ZKA_WAIT_FOREVER); ZKA_TRY_ONCE does
 * not wait, but still needs ZooKeeper to answer, within
 * zklock.connect_timeout.
 */
static bool
wait_for_grant(const char *parent, const char *name, LockMode mode, int slots,
			   HoldScope scope, int64 timeout_ms)
{
	const char *identity = holder_identity();
	bool		semaphore = slots > 0;
	bool		xact = scope == SCOPE_TRANSACTION;
	bool		wait = timeout_ms != ZKA_TRY_ONCE;
	bool		arm_lock_timeout = wait && LockTimeout > 0;
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz deadline = 0;
	ZkrResult	result;
	bool		waited = false;

	if (!wait)
		deadline = TimestampTzPlusMilliseconds(start, zklock_connect_timeout);
	else if (timeout_ms != ZKA_WAIT_FOREVER)
		deadline = TimestampTzPlusMilliseconds(start,
											   Min(timeout_ms, MAX_TIMEOUT_MS));

	if (arm_lock_timeout)
		enable_timeout_after(LOCK_TIMEOUT, LockTimeout);
	if (semaphore)
		result = zkh_acquire_slot(parent, name, slots, xact, identity, wait,
								  deadline, &waited);
	else
		result = zkh_acquire(parent, name, mode == MODE_SHARED, xact, identity,
							 wait, deadline, &waited);
	if (arm_lock_timeout)
		disable_timeout(LOCK_TIMEOUT, false);

	if (waited)
	{
		zksh_count_wait(parent, semaphore, GetCurrentTimestamp() - start);
	}
	if (result == ZKR_TIMED_OUT && !wait)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("ZooKeeper did not answer within %d ms", zklock_connect_timeout),
				 errhint("Check that the ensemble is reachable, or raise zklock.connect_timeout.")));
	if (result == ZKR_TIMED_OUT)
		zksh_count(parent, semaphore, ZKSH_TIMEOUTS, 1);
	return result == ZKR_GRANTED;
}

/*
 * Take one hold on the lock under parent in the given mode, or with
 * slots > 0 one slot of the semaphore of that size under parent.  A lock
 * this backend has a node for already just gains a hold.
 */
static bool
acquire_name(const char *parent, const char *name, LockMode mode, int slots,
			 HoldScope scope, int64 timeout_ms)
{
	bool		semaphore = slots > 0;
	bool		granted = false;
	MemoryContext context = CurrentMemoryContext;

	if (scope == SCOPE_SESSION && !zklock_session_locks)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("session-level zklocks are disabled"),
				 errdetail("zklock.session_locks is off.  A session-level lock outlives its transaction, and behind a pooler in transaction mode it would stay on a server connection that other clients share."),
				 errhint("Use the transaction-level functions, those with \"xact\" in their names (zk_xact_lock, zk_try_xact_lock, zk_xact_semaphore_acquire and the others), which COMMIT and ROLLBACK release.")));

	zkh_check_session();
	if (!semaphore && zkh_add_if_held(parent, mode == MODE_SHARED,
									  scope == SCOPE_TRANSACTION))
	{
		zksh_count(parent, semaphore, ZKSH_ACQUISITIONS, 1);
		return true;
	}

	zksh_show_session();
	zks_open();
	PG_TRY();
	{
		granted = wait_for_grant(parent, name, mode, slots, scope, timeout_ms);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		disable_timeout(LOCK_TIMEOUT, false);
		zksh_count(parent, semaphore, ZKSH_CANCELLATIONS, 1);

		/*
		 * The watchdog's cancel can end an acquire's wait before the wait
		 * itself sees the loss: it is the loss all the same.
		 */
		if (geterrcode() == ERRCODE_QUERY_CANCELED && zks_take_loss_cancel())
		{
			FlushErrorState();
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("zklock lost its ZooKeeper session"),
					 errdetail_internal("%s", zks_loss_reason())));
		}
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (granted)
		zksh_count(parent, semaphore, ZKSH_ACQUISITIONS, 1);
	return granted;
}

/* Take one hold on the lock named by argument 0. */
static bool
acquire(FunctionCallInfo fcinfo, LockMode mode, HoldScope scope,
		int64 timeout_ms)
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;

	zka_lock_parent(fcinfo, 0, parent, &name);
	return acquire_name(parent, name, mode, 0, scope, timeout_ms);
}

PG_FUNCTION_INFO_V1(zk_lock);
PG_FUNCTION_INFO_V1(zk_lock_timeout);
PG_FUNCTION_INFO_V1(zk_try_lock);
PG_FUNCTION_INFO_V1(zk_xact_lock);
PG_FUNCTION_INFO_V1(zk_xact_lock_timeout);
PG_FUNCTION_INFO_V1(zk_try_xact_lock);
PG_FUNCTION_INFO_V1(zk_lock_shared);
PG_FUNCTION_INFO_V1(zk_lock_shared_timeout);
PG_FUNCTION_INFO_V1(zk_try_lock_shared);
PG_FUNCTION_INFO_V1(zk_xact_lock_shared);
PG_FUNCTION_INFO_V1(zk_xact_lock_shared_timeout);
PG_FUNCTION_INFO_V1(zk_try_xact_lock_shared);
PG_FUNCTION_INFO_V1(zk_unlock);
PG_FUNCTION_INFO_V1(zk_unlock_shared);
PG_FUNCTION_INFO_V1(zk_unlock_all);
PG_FUNCTION_INFO_V1(zk_lock_token);

Datum
zk_lock(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, MODE_EXCLUSIVE, SCOPE_SESSION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_lock_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_EXCLUSIVE, SCOPE_SESSION,
						   zka_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_lock(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_EXCLUSIVE, SCOPE_SESSION, ZKA_TRY_ONCE));
}

Datum
zk_xact_lock(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, MODE_EXCLUSIVE, SCOPE_TRANSACTION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_xact_lock_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_EXCLUSIVE, SCOPE_TRANSACTION,
						   zka_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_xact_lock(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_EXCLUSIVE, SCOPE_TRANSACTION, ZKA_TRY_ONCE));
}

Datum
zk_lock_shared(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, MODE_SHARED, SCOPE_SESSION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_lock_shared_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_SHARED, SCOPE_SESSION,
						   zka_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_lock_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_SHARED, SCOPE_SESSION, ZKA_TRY_ONCE));
}

Datum
zk_xact_lock_shared(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, MODE_SHARED, SCOPE_TRANSACTION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_xact_lock_shared_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_SHARED, SCOPE_TRANSACTION,
						   zka_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_xact_lock_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, MODE_SHARED, SCOPE_TRANSACTION, ZKA_TRY_ONCE));
}

static bool
release(FunctionCallInfo fcinfo, LockMode mode)
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;

	zka_lock_parent(fcinfo, 0, parent, &name);
	zkh_check_session();
	return zkh_release_session_hold(parent, mode == MODE_SHARED, name);
}

Datum
zk_unlock(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(release(fcinfo, MODE_EXCLUSIVE));
}

Datum
zk_unlock_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(release(fcinfo, MODE_SHARED));
}

Datum
zk_unlock_all(PG_FUNCTION_ARGS)
{
	zkh_check_session();
	zkh_release_all_session_holds();
	PG_RETURN_VOID();
}

Datum
zk_lock_token(PG_FUNCTION_ARGS)
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;
	int64		token;

	zka_lock_parent(fcinfo, 0, parent, &name);
	zkh_check_session();
	token = zkh_token(parent);
	if (token == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(token);
}

pg_noreturn static void
raise_multi_lock_loss(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("zklock lost its ZooKeeper session while taking several locks"),
			 errdetail("None of the locks of this call is held."),
			 errhint("Call it again to take them all.")));
}

/*
 * Take every lock of the text[] argument 0, or none: all within timeout_ms
 * (the whole call's), in the canonical order (zk_args.c).  A name not
 * granted, an error or an interrupt gives back every hold this call took,
 * holds taken before it staying as they were.
 */
static bool
acquire_all(FunctionCallInfo fcinfo, HoldScope scope, int64 timeout_ms)
{
	ZkaName    *names;
	int			n = zka_lock_names(fcinfo, 0, &names);
	bool		xact = scope == SCOPE_TRANSACTION;
	TimestampTz deadline = timeout_ms > 0 ?
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									Min(timeout_ms, MAX_TIMEOUT_MS)) : 0;
	volatile int taken = 0;
	int64		losses;
	MemoryContext context = CurrentMemoryContext;
	int			i;

	/* Holds lost before the call are no concern of it. */
	zkh_check_session();
	losses = zkh_losses();
	PG_TRY();
	{
		while (taken < n)
		{
			int64		left = timeout_ms;

			/*
			 * A timed call past its deadline has failed: trying the rest
			 * once (a timeout of 0) could still succeed, or fail with an
			 * ERROR, after the timeout.
			 */
			if (deadline != 0)
			{
				left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
													   deadline);
				if (left <= 0)
					break;
			}
			if (!acquire_name(names[taken].parent, names[taken].name,
							  MODE_EXCLUSIVE, 0, scope, left))
				break;
			taken++;

			/*
			 * A session lost since the call began took the names granted
			 * before it with it, and only a WARNING says so (the name just
			 * granted may be on a new session): give them all up.
			 */
			zkh_check_session();
			if (zkh_losses() != losses)
				raise_multi_lock_loss();
		}
	}
	PG_CATCH();
	{
		bool		lost;

		MemoryContextSwitchTo(context);
		HOLD_INTERRUPTS();
		for (i = taken - 1; i >= 0; i--)
			zkh_undo_hold(names[i].parent, false, xact);
		RESUME_INTERRUPTS();

		/*
		 * Whatever ended the wait when the session was lost (the loss
		 * itself, or the watchdog's cancel), the call failed for the loss.
		 */
		lost = zks_is_lost() || zkh_losses() != losses;
		if (lost && geterrcode() == ERRCODE_QUERY_CANCELED)
			(void) zks_take_loss_cancel();
		if (lost)
		{
			FlushErrorState();
			raise_multi_lock_loss();
		}
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (taken == n)
		return true;
	for (i = taken - 1; i >= 0; i--)
		zkh_undo_hold(names[i].parent, false, xact);
	return false;
}

PG_FUNCTION_INFO_V1(zk_lock_array);
PG_FUNCTION_INFO_V1(zk_lock_array_timeout);
PG_FUNCTION_INFO_V1(zk_try_lock_array);
PG_FUNCTION_INFO_V1(zk_xact_lock_array);
PG_FUNCTION_INFO_V1(zk_xact_lock_array_timeout);
PG_FUNCTION_INFO_V1(zk_try_xact_lock_array);
PG_FUNCTION_INFO_V1(zk_unlock_array);

Datum
zk_lock_array(PG_FUNCTION_ARGS)
{
	acquire_all(fcinfo, SCOPE_SESSION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_lock_array_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, SCOPE_SESSION, zka_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_lock_array(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, SCOPE_SESSION, ZKA_TRY_ONCE));
}

Datum
zk_xact_lock_array(PG_FUNCTION_ARGS)
{
	acquire_all(fcinfo, SCOPE_TRANSACTION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_xact_lock_array_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, SCOPE_TRANSACTION, zka_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_xact_lock_array(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, SCOPE_TRANSACTION, ZKA_TRY_ONCE));
}

/*
 * Release one session hold on each name; true if every one was held (each
 * that was not gets a WARNING, as zk_unlock gives).
 */
Datum
zk_unlock_array(PG_FUNCTION_ARGS)
{
	ZkaName    *names;
	int			n = zka_lock_names(fcinfo, 0, &names);
	bool		all = true;
	int			i;

	zkh_check_session();
	for (i = 0; i < n; i++)
		all &= zkh_release_session_hold(names[i].parent, false, names[i].name);
	PG_RETURN_BOOL(all);
}

/* Take one slot of the semaphore named by argument 0, of size argument 1. */
static bool
acquire_slot(FunctionCallInfo fcinfo, HoldScope scope, int64 timeout_ms)
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;
	int			slots;

	zka_semaphore_parent(fcinfo, 0, parent, &name);
	slots = zka_slots(fcinfo, 1);
	return acquire_name(parent, name, MODE_EXCLUSIVE, slots, scope, timeout_ms);
}

PG_FUNCTION_INFO_V1(zk_semaphore_acquire);
PG_FUNCTION_INFO_V1(zk_semaphore_acquire_timeout);
PG_FUNCTION_INFO_V1(zk_try_semaphore_acquire);
PG_FUNCTION_INFO_V1(zk_xact_semaphore_acquire);
PG_FUNCTION_INFO_V1(zk_xact_semaphore_acquire_timeout);
PG_FUNCTION_INFO_V1(zk_try_xact_semaphore_acquire);
PG_FUNCTION_INFO_V1(zk_semaphore_release);
PG_FUNCTION_INFO_V1(zk_semaphore_token);

Datum
zk_semaphore_acquire(PG_FUNCTION_ARGS)
{
	acquire_slot(fcinfo, SCOPE_SESSION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_semaphore_acquire_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, SCOPE_SESSION, zka_timeout_ms(fcinfo, 2)));
}

Datum
zk_try_semaphore_acquire(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, SCOPE_SESSION, ZKA_TRY_ONCE));
}

Datum
zk_xact_semaphore_acquire(PG_FUNCTION_ARGS)
{
	acquire_slot(fcinfo, SCOPE_TRANSACTION, ZKA_WAIT_FOREVER);
	PG_RETURN_VOID();
}

Datum
zk_xact_semaphore_acquire_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, SCOPE_TRANSACTION, zka_timeout_ms(fcinfo, 2)));
}

Datum
zk_try_xact_semaphore_acquire(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, SCOPE_TRANSACTION, ZKA_TRY_ONCE));
}

Datum
zk_semaphore_release(PG_FUNCTION_ARGS)
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;

	zka_semaphore_parent(fcinfo, 0, parent, &name);
	zkh_check_session();
	PG_RETURN_BOOL(zkh_release_slot(parent, name));
}

Datum
zk_semaphore_token(PG_FUNCTION_ARGS)
{
	char		parent[ZKL_PARENT_MAX];
	char	   *name;
	int64		token;

	zka_semaphore_parent(fcinfo, 0, parent, &name);
	zkh_check_session();
	token = zkh_slot_token(parent);
	if (token == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(token);
}
