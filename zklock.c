/*-------------------------------------------------------------------------
 *
 * zklock.c
 *	  Cluster-wide locks for SQL, backed by Apache ZooKeeper: the SQL-facing
 *	  functions and the extension's settings.
 *
 * The functions mirror PostgreSQL's advisory locks.  zk_lock() and friends
 * take session-level holds, ended by zk_unlock() or zk_unlock_all();
 * zk_xact_lock() and friends take transaction-level holds, ended by COMMIT
 * or ROLLBACK (or ROLLBACK TO the savepoint before them).  Holds stack.
 * Each has a _shared variant; the two modes of a name are separate locks
 * that conflict with each other only across backends.
 *
 * The code is split by responsibility:
 *	  zklock.c		SQL lock functions and GUCs (this file)
 *	  zk_observe.c	SQL functions that show locks, queues and the session
 *	  zk_holds.c	the backend's table of held locks, transaction callbacks
 *	  zk_recipe.c	the ZooKeeper lock recipe
 *	  zk_session.c	the ZooKeeper session, its threads, waiting, loss watchdog
 *	  zk_janitor.c	deleting the nodes given up, across reconnects
 *	  zk_names.c	lock names to znode names, contender node parsing
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
#include "access/xact.h"
#include "commands/dbcommands.h"
#include "postmaster/postmaster.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/ps_status.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "zk_holds.h"
#include "zk_session.h"
#include "zklock.h"

PG_MODULE_MAGIC;

static char *zklock_root = NULL;

ZkStats		zk_stats;
static emit_log_hook_type prev_emit_log_hook = NULL;

static const struct config_enum_entry client_log_levels[] = {
	{"error", ZOO_LOG_LEVEL_ERROR, false},
	{"warn", ZOO_LOG_LEVEL_WARN, false},
	{"info", ZOO_LOG_LEVEL_INFO, false},
	{"debug", ZOO_LOG_LEVEL_DEBUG, false},
	{NULL, 0, false}
};

void		_PG_init(void);

/*
 * When the loss watchdog cancels a statement because a transaction's lock
 * was lost, say so instead of "canceling statement due to user request";
 * during COMMIT, say that the commit is refused, as it is.
 */
static void
explain_loss_cancel(ErrorData *edata)
{
	if (edata->elevel == ERROR && edata->sqlerrcode == ERRCODE_QUERY_CANCELED &&
		zks_take_loss_cancel())
	{
		char	   *names = zkh_xact_hold_names();

		if (names[0] == '\0')
			names = "(none left)";
		if (zkh_committing())
		{
			edata->sqlerrcode = ERRCODE_TRANSACTION_ROLLBACK;
			edata->message = psprintf(ZKH_CANNOT_COMMIT_MSG, names);
			edata->detail = pstrdup(ZKH_CANNOT_COMMIT_DETAIL);
			edata->hint = pstrdup(ZKH_CANNOT_COMMIT_HINT);
		}
		else
		{
			edata->message = psprintf("canceling statement because zklock lost transaction-level lock %s",
									  names);
			edata->detail = pstrdup("The ZooKeeper session expired or was cut off for longer than its timeout; another client may hold the lock now.");
			edata->hint = pstrdup("The transaction cannot commit.  Roll it back and retry it under a new lock.");
		}
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * zklock.root must be an absolute path of plain components, short enough
 * for every lock path to fit, and outside ZooKeeper's own /zookeeper tree.
 */
static bool
check_root(char **newval, void **extra, GucSource source)
{
	const char *root = *newval;
	const char *p;

	if (root[0] != '/' || strlen(root) > ZKR_ROOT_MAX ||
		root[strlen(root) - 1] == '/')
	{
		GUC_check_errdetail("zklock.root must be an absolute ZooKeeper path of at most %d bytes, without a trailing slash.",
							ZKR_ROOT_MAX);
		return false;
	}
	for (p = root; *p; p++)
	{
		if (!(isalnum((unsigned char) *p) || *p == '_' || *p == '-' ||
			  *p == '.' || *p == '/'))
		{
			GUC_check_errdetail("zklock.root may contain only letters, digits, \"_\", \"-\", \".\" and \"/\".");
			return false;
		}
		if (*p == '/' &&
			(p[1] == '/' ||
			 (p[1] == '.' && (p[2] == '/' || p[2] == '\0')) ||
			 (p[1] == '.' && p[2] == '.' && (p[3] == '/' || p[3] == '\0'))))
		{
			GUC_check_errdetail("zklock.root must not contain empty, \".\" or \"..\" components.");
			return false;
		}
	}
	if (strcmp(root, "/zookeeper") == 0 || strncmp(root, "/zookeeper/", 11) == 0)
	{
		GUC_check_errdetail("The /zookeeper tree belongs to ZooKeeper itself.");
		return false;
	}
	return true;
}

/* Digest credentials are "user:password" with a non-empty user. */
static bool
check_auth(char **newval, void **extra, GucSource source)
{
	const char *colon = strchr(*newval, ':');

	if ((*newval)[0] != '\0' && (colon == NULL || colon == *newval))
	{
		GUC_check_errdetail("zklock.auth must have the form \"user:password\".");
		return false;
	}
	return true;
}

void
_PG_init(void)
{
	DefineCustomStringVariable("zklock.hosts",
							   "ZooKeeper connect string, such as \"zk1:2181,zk2:2181,zk3:2181\".",
							   "Takes effect when the backend next opens a ZooKeeper session.",
							   &zklock_hosts,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("zklock.root",
							   "ZooKeeper path under which lock nodes are kept.",
							   NULL,
							   &zklock_root,
							   "/zklock",
							   PGC_SUSET,
							   0,
							   check_root, NULL, NULL);
	DefineCustomStringVariable("zklock.auth",
							   "ZooKeeper digest credentials, \"user:password\", for each session.",
							   "When set, zklock's nodes are created with the creator-all ACL.  Only superusers can set or read it.",
							   &zklock_auth,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   check_auth, NULL, NULL);
	DefineCustomBoolVariable("zklock.world_readable",
							 "With zklock.auth, whether anyone may read zklock's nodes (not change them).",
							 NULL,
							 &zklock_world_readable,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("zklock.session_timeout",
							"ZooKeeper session timeout requested by each backend.",
							"The ensemble may clamp it.  Takes effect when the backend next opens a session.",
							&zklock_session_timeout,
							10000, 1000, 600000,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("zklock.connect_timeout",
							"How long a lock call waits for ZooKeeper to answer before it fails.",
							NULL,
							&zklock_connect_timeout,
							5000, 100, 600000,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomBoolVariable("zklock.synchronous_release",
							 "Whether COMMIT and ROLLBACK wait for ZooKeeper to confirm the release of transaction-level locks.",
							 "When off, the release is sent and retried until confirmed, but the transaction ends at once.",
							 &zklock_synchronous_release,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomEnumVariable("zklock.client_log_level",
							 "Level of the ZooKeeper client library's own messages on the server's standard error.",
							 NULL,
							 &zklock_client_log_level,
							 ZOO_LOG_LEVEL_ERROR,
							 client_log_levels,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	MarkGUCPrefixReserved("zklock");

	RegisterXactCallback(zkh_xact_callback, NULL);
	RegisterSubXactCallback(zkh_subxact_callback, NULL);

	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = explain_loss_cancel;
}

/*
 * Before any lock work: if the session was lost, report the lost locks and
 * close it; if settings changed and nothing is held, close it so the next
 * lock opens one with the new settings.
 */
void
zkl_check_session(void)
{
	/* A loss cancel that never reached a statement is moot now. */
	(void) zks_take_loss_cancel();
	if (!zks_is_open())
		return;
	if (zks_is_lost())
	{
		zkh_mark_all_lost();
		zks_close();
	}
	else if (zks_settings_changed() && zkh_is_empty())
		zks_close();
}

/* Read the lock name argument and compute its parent path. */
void
zkl_get_lock_parent(FunctionCallInfo fcinfo, char parent[ZKR_PARENT_MAX],
				char name[ZKN_NAME_MAX + 1])
{
	text	   *arg;
	char		encoded[ZKN_ENCODED_MAX];
	int			len;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock name must not be null")));
	arg = PG_GETARG_TEXT_PP(0);
	len = VARSIZE_ANY_EXHDR(arg);

	switch (zkn_encode_name(VARDATA_ANY(arg), len, encoded))
	{
		case ZKN_EMPTY:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("zklock name must not be empty")));
			break;
		case ZKN_TOO_LONG:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("zklock name is too long"),
					 errdetail("The name is %d bytes long; the limit is %d bytes.",
							   len, ZKN_NAME_MAX)));
			break;
		case ZKN_OK:
			break;
	}
	memcpy(name, VARDATA_ANY(arg), len);
	name[len] = '\0';
	snprintf(parent, ZKR_PARENT_MAX, "%s/%s", zklock_root, encoded);
}

/* Read the timeout argument as milliseconds. */
static int64
get_timeout_ms(FunctionCallInfo fcinfo)
{
	Interval   *timeout;
	int64		ms;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock timeout must not be null")));
	timeout = PG_GETARG_INTERVAL_P(1);
	ms = timeout->time / 1000 +
		((int64) timeout->month * DAYS_PER_MONTH + timeout->day) *
		SECS_PER_DAY * 1000;
	if (ms < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock timeout must not be negative")));
	return ms;
}

/*
 * Who holds the node, as a small JSON document, so an operator looking at
 * ZooKeeper can tell which backend holds a lock.  zk_names.c parses exactly
 * this format back.  Built once, and again only when application_name
 * changes, since it is sent with every acquire.
 */
static const char *
holder_identity(void)
{
	static char *identity = NULL;
	static char *identity_app = NULL;
	const char *app = application_name ? application_name : "";
	char		host[256];
	StringInfoData buf;

	if (identity && strcmp(identity_app, app) == 0)
		return identity;

	if (gethostname(host, sizeof(host)) != 0)
		strlcpy(host, "unknown", sizeof(host));
	host[sizeof(host) - 1] = '\0';

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"host\":");
	escape_json(&buf, host);
	appendStringInfo(&buf, ",\"port\":%d,\"pid\":%d,\"database\":",
					 PostPortNumber, MyProcPid);
	escape_json(&buf, get_database_name(MyDatabaseId));
	appendStringInfoString(&buf, ",\"user\":");
	escape_json(&buf, GetUserNameFromId(GetSessionUserId(), false));
	appendStringInfoString(&buf, ",\"application_name\":");
	escape_json(&buf, app);
	appendStringInfoChar(&buf, '}');

	if (identity)
	{
		pfree(identity);
		pfree(identity_app);
	}
	identity = MemoryContextStrdup(TopMemoryContext, buf.data);
	identity_app = MemoryContextStrdup(TopMemoryContext, app);
	pfree(buf.data);
	return identity;
}

/* Long enough to mean "no limit", short enough not to overflow. */
#define MAX_TIMEOUT_MS	((int64) 100 * 365 * SECS_PER_DAY * 1000)

/*
 * Wait in ZooKeeper's queue, under lock_timeout as a heavyweight lock is:
 * not at all (try), until timeout_ms (>= 0), or without limit (-1).  A try
 * still needs ZooKeeper to answer, within zklock.connect_timeout.
 */
static bool
wait_for_grant(ZkHold *hold, bool try_only, int64 timeout_ms)
{
	ZkHold	   *other = zkh_find(hold->parent, !hold->shared);
	const char *identity = holder_identity();
	bool		wait = !try_only && timeout_ms != 0;
	bool		arm_lock_timeout = wait && LockTimeout > 0;
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz deadline = 0;
	ZkrResult	result;
	bool		waited;

	if (!wait)
		deadline = TimestampTzPlusMilliseconds(start, zklock_connect_timeout);
	else if (timeout_ms > 0)
		deadline = TimestampTzPlusMilliseconds(start,
											   Min(timeout_ms, MAX_TIMEOUT_MS));

	if (arm_lock_timeout)
		enable_timeout_after(LOCK_TIMEOUT, LockTimeout);
	result = zkr_acquire(hold->parent, hold->shared,
						 other ? other->node.path : NULL, identity,
						 wait, deadline, &hold->node, &waited);
	if (arm_lock_timeout)
		disable_timeout(LOCK_TIMEOUT, false);

	if (waited)
	{
		zk_stats.waits++;
		zk_stats.wait_time_us += GetCurrentTimestamp() - start;
	}
	if (result == ZKR_TIMED_OUT && !wait)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("ZooKeeper did not answer within %d ms", zklock_connect_timeout),
				 errhint("Check that the ensemble is reachable, or raise zklock.connect_timeout.")));
	if (result == ZKR_TIMED_OUT)
		zk_stats.timeouts++;
	return result == ZKR_GRANTED;
}

/* The process title says which lock a backend waits for, as for others. */
static char *
show_waiting(const char *name, bool shared)
{
	int			len;
	const char *activity = get_ps_display(&len);
	char	   *saved = pnstrdup(activity, len);

	if (update_process_title)
	{
		char	   *title = psprintf("%s waiting for zklock \"%s\"%s", saved,
									 name, shared ? " (shared)" : "");

		set_ps_display(title);
		pfree(title);
	}
	return saved;
}

static void
end_waiting(char *saved)
{
	if (update_process_title)
		set_ps_display(saved);
	pfree(saved);
}

/*
 * Take one hold on the lock named by argument 0, in the given mode.  A
 * lock this backend holds already just gains a hold.  Otherwise wait in
 * ZooKeeper's queue: not at all (try), until timeout_ms (>= 0), or without
 * limit (-1).
 */
static bool
acquire(FunctionCallInfo fcinfo, bool shared, bool xact, bool try_only,
		int64 timeout_ms)
{
	char		parent[ZKR_PARENT_MAX];
	char		name[ZKN_NAME_MAX + 1];
	ZkHold	   *hold;
	char	   *saved_title;
	bool		granted = false;

	zkl_get_lock_parent(fcinfo, parent, name);
	zkl_check_session();

	hold = zkh_find(parent, shared);
	if (hold)
	{
		zkh_prepare_hold(hold);
		zkh_add_hold(hold, xact);
		zk_stats.acquisitions++;
		return true;
	}

	zks_open();
	hold = zkh_reserve(parent, shared, name);
	saved_title = show_waiting(name, shared);

	PG_TRY();
	{
		zkh_prepare_hold(hold);
		granted = wait_for_grant(hold, try_only, timeout_ms);
	}
	PG_CATCH();
	{
		disable_timeout(LOCK_TIMEOUT, false);
		end_waiting(saved_title);
		zkh_forget(hold);
		zk_stats.cancellations++;
		PG_RE_THROW();
	}
	PG_END_TRY();

	end_waiting(saved_title);
	if (granted)
	{
		hold->since = GetCurrentTimestamp();
		zkh_add_hold(hold, xact);
		zk_stats.acquisitions++;
	}
	else
		zkh_forget(hold);
	return granted;
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
PG_FUNCTION_INFO_V1(zk_test_session_credentials);

Datum
zk_lock(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, false, false, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_lock_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, false, false, false, get_timeout_ms(fcinfo)));
}

Datum
zk_try_lock(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, false, false, true, 0));
}

Datum
zk_xact_lock(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, false, true, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_xact_lock_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, false, true, false, get_timeout_ms(fcinfo)));
}

Datum
zk_try_xact_lock(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, false, true, true, 0));
}

Datum
zk_lock_shared(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, true, false, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_lock_shared_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, true, false, false, get_timeout_ms(fcinfo)));
}

Datum
zk_try_lock_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, true, false, true, 0));
}

Datum
zk_xact_lock_shared(PG_FUNCTION_ARGS)
{
	acquire(fcinfo, true, true, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_xact_lock_shared_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, true, true, false, get_timeout_ms(fcinfo)));
}

Datum
zk_try_xact_lock_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire(fcinfo, true, true, true, 0));
}

static bool
release(FunctionCallInfo fcinfo, bool shared)
{
	char		parent[ZKR_PARENT_MAX];
	char		name[ZKN_NAME_MAX + 1];

	zkl_get_lock_parent(fcinfo, parent, name);
	zkl_check_session();
	return zkh_release_session_hold(parent, shared, name);
}

Datum
zk_unlock(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(release(fcinfo, false));
}

Datum
zk_unlock_shared(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(release(fcinfo, true));
}

Datum
zk_unlock_all(PG_FUNCTION_ARGS)
{
	zkl_check_session();
	zkh_release_all_session_holds();
	PG_RETURN_VOID();
}

Datum
zk_lock_token(PG_FUNCTION_ARGS)
{
	char		parent[ZKR_PARENT_MAX];
	char		name[ZKN_NAME_MAX + 1];
	int64		token;

	zkl_get_lock_parent(fcinfo, parent, name);
	zkl_check_session();
	token = zkh_token(parent);
	if (token == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(token);
}

/*
 * For fault tests only, and not part of the extension's SQL: the session id
 * and password, so a test can expire the session from another client.  A
 * test creates the SQL function itself, which takes a superuser.
 */
Datum
zk_test_session_credentials(PG_FUNCTION_ARGS)
{
	char		passwd[16];
	char		passwd_hex[2 * sizeof(passwd) + 1];

	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be superuser to read ZooKeeper session credentials")));
	if (!zks_is_open() || zks_session_id() == 0)
		PG_RETURN_NULL();
	zks_session_password(passwd);
	passwd_hex[hex_encode(passwd, sizeof(passwd), passwd_hex)] = '\0';
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("%llx:%s",
											  (unsigned long long) zks_session_id(),
											  passwd_hex)));
}
