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
 * Each has a _shared variant; a backend's holds of the two modes of a name
 * never conflict with each other, only with other clients'.
 *
 * The code is split by responsibility:
 *	  zklock.c		SQL lock functions and GUCs (this file)
 *	  zk_observe.c	SQL functions that show locks, queues and the session
 *	  zk_holds.c	the backend's table of held locks, transaction callbacks
 *	  zk_recipe.c	the ZooKeeper lock recipe
 *	  zk_queue.c	the queue rules: order, who holds, whom to wait for
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
#include "catalog/namespace.h"
#include "commands/dbcommands.h"
#include "mb/pg_wchar.h"
#include "postmaster/postmaster.h"
#include "storage/proc.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/ps_status.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "zk_deadlock.h"
#include "zk_holds.h"
#include "zk_session.h"
#include "zk_shared.h"
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

/* Whatever zklock.auth holds, it is shown as this, to everyone. */
static const char *
show_auth(void)
{
	return zklock_auth && zklock_auth[0] != '\0' ? "********" : "";
}

/* Whatever zklock.tls_key_password holds, it is shown as this, to everyone. */
static const char *
show_tls_key_password(void)
{
	return zklock_tls_key_password && zklock_tls_key_password[0] != '\0' ?
		"********" : "";
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
							   "When set, zklock's nodes are created with the creator-all ACL.  Its value is never shown; zklock.auth_file keeps it out of the settings altogether.",
							   &zklock_auth,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   check_auth, NULL, show_auth);
	DefineCustomStringVariable("zklock.auth_file",
							   "File holding the ZooKeeper digest credentials, \"user:password\" on its first line.",
							   "It must be owned by the server's user and readable by no one else.  Read when a session is opened.",
							   &zklock_auth_file,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomBoolVariable("zklock.world_readable",
							 "With zklock.auth, whether anyone may read zklock's nodes (not change them).",
							 NULL,
							 &zklock_world_readable,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("zklock.tls_ca",
							   "File of the CA certificate (PEM) that signed the ZooKeeper servers' certificates.",
							   "With zklock.tls_cert and zklock.tls_key, sessions use TLS, trusting this CA only.  Needs a TLS-capable build.",
							   &zklock_tls_ca,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("zklock.tls_cert",
							   "File of the client certificate (PEM, with its chain) that sessions present to ZooKeeper.",
							   NULL,
							   &zklock_tls_cert,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("zklock.tls_key",
							   "File of the client certificate's private key (PEM).",
							   "It must be owned by the server's user and readable by no one else.",
							   &zklock_tls_key,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("zklock.tls_key_password",
							   "Password of zklock.tls_key, if it is encrypted.",
							   "Its value is never shown.",
							   &zklock_tls_key_password,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   NULL, NULL, show_tls_key_password);
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
							 true,
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
	zkd_define_settings();
	zksh_define_settings();
	MarkGUCPrefixReserved("zklock");
	zksh_request_shmem();

	RegisterXactCallback(zkh_xact_callback, NULL);
	RegisterSubXactCallback(zkh_subxact_callback, NULL);

	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = explain_loss_cancel;
}

/*
 * Before any lock work: if the session was lost (or closed under held
 * locks, or a release could not be kept track of), report the lost locks
 * and close it;
 * if settings changed and nothing is held, close it so the next lock opens
 * one with the new settings.
 */
void
zkl_check_session(void)
{
	/* A loss cancel that never reached a statement is moot now. */
	(void) zks_take_loss_cancel();
	if (!zks_is_open() || zks_is_lost() || zks_janitor_failed())
	{
		zkh_mark_all_lost();
		zks_close();
	}
	else if (zks_settings_changed() && zkh_is_empty())
		zks_close();
}

/*
 * Add an error context line naming what was being done, for errors raised
 * while converting a lock name to UTF-8.
 */
static void
name_conversion_context(void *arg)
{
	errcontext("converting the zklock name to UTF-8, the encoding of lock names in ZooKeeper");
}

static void name_to_parent(text *arg, const char *space,
						   char parent[ZKR_PARENT_MAX], char **name);

/*
 * Read the lock name argument and compute its parent path.  The name is
 * mapped from its UTF-8 form, so one text names one node whatever the
 * database encoding; SQL_ASCII databases, which know no encoding, map the
 * bytes as they are.  *name is the name as given, for messages.
 */
void
zkl_get_lock_parent(FunctionCallInfo fcinfo, char parent[ZKR_PARENT_MAX],
					char **name)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock name must not be null")));
	name_to_parent(PG_GETARG_TEXT_PP(0), "", parent, name);
}

/*
 * The parent path of a name under the root, in a space of its own ("" for
 * locks, "%semaphores/" for semaphores: no lock name maps there).
 */
static void
name_to_parent(text *arg, const char *space, char parent[ZKR_PARENT_MAX],
			   char **name)
{
	char		encoded[ZKN_ENCODED_MAX];
	char	   *utf8;
	int			len;
	ErrorContextCallback errcallback;

	*name = text_to_cstring(arg);
	len = strlen(*name);

	utf8 = *name;
	if (GetDatabaseEncoding() != PG_SQL_ASCII)
	{
		errcallback.callback = name_conversion_context;
		errcallback.arg = NULL;
		errcallback.previous = error_context_stack;
		error_context_stack = &errcallback;
		utf8 = pg_server_to_any(*name, len, PG_UTF8);
		error_context_stack = errcallback.previous;
		len = strlen(utf8);
	}

	switch (zkn_encode_name(utf8, len, encoded))
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
					 errdetail("The name is %d bytes long in UTF-8; the limit is %d bytes.",
							   len, ZKN_NAME_MAX)));
			break;
		case ZKN_OK:
			break;
	}
	if (utf8 != *name)
		pfree(utf8);
	snprintf(parent, ZKR_PARENT_MAX, "%s/%s%s", zklock_root, space, encoded);
}

/* Read the timeout argument as milliseconds; -1 for 'infinity'. */
static int64
get_timeout_ms(FunctionCallInfo fcinfo, int argno)
{
	Interval   *timeout;
	int64		ms;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock timeout must not be null")));
	timeout = PG_GETARG_INTERVAL_P(argno);
#ifdef INTERVAL_NOT_FINITE
	/* PostgreSQL 17 and later: 'infinity' waits without limit. */
	if (INTERVAL_IS_NOEND(timeout))
		return -1;
	if (INTERVAL_IS_NOBEGIN(timeout))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock timeout must not be negative")));
#endif
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
 * Convert text between encodings without failing: a character that the
 * target encoding lacks, or bytes that are not valid in the source one,
 * become '?' or, with hex_escape, "\\x" and the hex of each byte.  Used for
 * what zklock writes to and reads from ZooKeeper about holders, which must
 * never stop a lock call or a listing.
 */
char *
zkl_convert_lossy(const char *src, int len, int src_encoding,
				  int dest_encoding, bool hex_escape)
{
	StringInfoData out;
	Oid			proc = InvalidOid;
	unsigned char *buf = NULL;
	int			bufsize = len * MAX_CONVERSION_GROWTH + 1;
	int			pos = 0;

	initStringInfo(&out);
	if (src_encoding == dest_encoding || dest_encoding == PG_SQL_ASCII)
	{
		appendBinaryStringInfo(&out, src, len);
		return out.data;
	}
	if (src_encoding != PG_SQL_ASCII)
	{
		proc = FindDefaultConversionProc(src_encoding, dest_encoding);
		buf = palloc(bufsize);
	}
	while (pos < len)
	{
		unsigned char c = (unsigned char) src[pos];
		int			bad;
		int			i;

		if (OidIsValid(proc))
		{
			int			done;

			done = pg_do_encoding_conversion_buf(proc, src_encoding,
												 dest_encoding,
												 (unsigned char *) src + pos,
												 len - pos, buf, bufsize,
												 true);
			appendStringInfoString(&out, (char *) buf);
			pos += done;
			if (pos >= len)
				break;
			c = (unsigned char) src[pos];
		}
		else if (!IS_HIGHBIT_SET(c))
		{
			appendStringInfoChar(&out, (char) c);
			pos++;
			continue;
		}
		else if (dest_encoding == PG_UTF8 &&
				 pg_utf_mblen(&c) <= len - pos &&
				 pg_utf8_islegal((const unsigned char *) src + pos,
								 pg_utf_mblen(&c)))
		{
			/* SQL_ASCII bytes that happen to be UTF-8 stay as they are. */
			appendBinaryStringInfo(&out, src + pos, pg_utf_mblen(&c));
			pos += pg_utf_mblen(&c);
			continue;
		}
		bad = src_encoding == PG_SQL_ASCII ? 1 :
			Min(Max(pg_encoding_mblen(src_encoding, src + pos), 1), len - pos);
		for (i = 0; i < bad; i++)
		{
			if (hex_escape)
				appendStringInfo(&out, "\\x%02x", (unsigned char) src[pos + i]);
			else if (i == 0)
				appendStringInfoChar(&out, '?');
		}
		pos += bad;
	}
	if (buf)
		pfree(buf);
	return out.data;
}

/* Append s, in the database encoding, as a JSON string in UTF-8. */
static void
append_json_utf8(StringInfo buf, const char *s)
{
	char	   *utf8 = zkl_convert_lossy(s, strlen(s), GetDatabaseEncoding(),
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
	char		host[256];
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
	identity = MemoryContextStrdup(TopMemoryContext, buf.data);
	identity_app = MemoryContextStrdup(TopMemoryContext, app);
	pfree(buf.data);
	return identity;
}

/*
 * Count into the server-wide statistics, which are kept for locks (a
 * semaphore of the same name would otherwise be counted with its lock).
 */
static void
count(const char *parent, int slots, ZkshCounter counter, int64 amount)
{
	if (slots == 0)
		zksh_count(parent, counter, amount);
}

/* Long enough to mean "no limit", short enough not to overflow. */
#define MAX_TIMEOUT_MS	((int64) 100 * 365 * SECS_PER_DAY * 1000)

/*
 * Wait in ZooKeeper's queue, under lock_timeout as a heavyweight lock is:
 * not at all (try), until timeout_ms (>= 0), or without limit (-1).  A try
 * still needs ZooKeeper to answer, within zklock.connect_timeout.
 */
static bool
wait_for_grant(const char *parent, const char *name, bool shared, int slots,
			   bool xact, bool try_only, int64 timeout_ms)
{
	const char *identity = holder_identity();
	bool		wait = !try_only && timeout_ms != 0;
	bool		arm_lock_timeout = wait && LockTimeout > 0;
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz deadline = 0;
	ZkrResult	result;
	bool		waited = false;

	if (!wait)
		deadline = TimestampTzPlusMilliseconds(start, zklock_connect_timeout);
	else if (timeout_ms > 0)
		deadline = TimestampTzPlusMilliseconds(start,
											   Min(timeout_ms, MAX_TIMEOUT_MS));

	if (arm_lock_timeout)
		enable_timeout_after(LOCK_TIMEOUT, LockTimeout);
	if (slots > 0)
		result = zkh_acquire_slot(parent, name, slots, xact, identity, wait,
								  deadline, &waited);
	else
		result = zkh_acquire(parent, name, shared, xact, identity, wait,
							 deadline, &waited);
	if (arm_lock_timeout)
		disable_timeout(LOCK_TIMEOUT, false);

	if (waited)
	{
		int64		wait_time_us = GetCurrentTimestamp() - start;

		zk_stats.waits++;
		zk_stats.wait_time_us += wait_time_us;
		count(parent, slots, ZKSH_WAITS, 1);
		count(parent, slots, ZKSH_WAIT_TIME_US, wait_time_us);
	}
	if (result == ZKR_TIMED_OUT && !wait)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("ZooKeeper did not answer within %d ms", zklock_connect_timeout),
				 errhint("Check that the ensemble is reachable, or raise zklock.connect_timeout.")));
	if (result == ZKR_TIMED_OUT)
	{
		zk_stats.timeouts++;
		count(parent, slots, ZKSH_TIMEOUTS, 1);
	}
	return result == ZKR_GRANTED;
}

/* The process title says which lock a backend waits for, as for others. */
static char *
show_waiting(const char *name, bool shared, bool semaphore)
{
	int			len;
	const char *activity = get_ps_display(&len);
	char	   *saved = pnstrdup(activity, len);

	if (update_process_title)
	{
		char	   *title = psprintf("%s waiting for zklock %s\"%s\"%s", saved,
									 semaphore ? "semaphore " : "", name,
									 shared ? " (shared)" : "");

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

static bool acquire_name(const char *parent, const char *name, bool shared,
						 int slots, bool xact, bool try_only,
						 int64 timeout_ms);

/*
 * Take one hold on the lock named by argument 0, in the given mode.  A
 * lock this backend has a node for already just gains a hold.  Otherwise
 * wait in ZooKeeper's queue: not at all (try), until timeout_ms (>= 0), or
 * without limit (-1).
 */
static bool
acquire(FunctionCallInfo fcinfo, bool shared, bool xact, bool try_only,
		int64 timeout_ms)
{
	char		parent[ZKR_PARENT_MAX];
	char	   *name;

	zkl_get_lock_parent(fcinfo, parent, &name);
	return acquire_name(parent, name, shared, 0, xact, try_only, timeout_ms);
}

/*
 * acquire, for the lock under parent; with slots > 0, one slot of the
 * semaphore of that size under parent.
 */
static bool
acquire_name(const char *parent, const char *name, bool shared, int slots,
			 bool xact, bool try_only, int64 timeout_ms)
{
	char	   *saved_title;
	bool		granted = false;

	zkl_check_session();

	if (slots == 0 && zkh_add_if_held(parent, shared, xact))
	{
		zk_stats.acquisitions++;
		count(parent, slots, ZKSH_ACQUISITIONS, 1);
		return true;
	}

	zks_open();
	saved_title = show_waiting(name, shared, slots > 0);
	PG_TRY();
	{
		granted = wait_for_grant(parent, name, shared, slots, xact, try_only,
								 timeout_ms);
	}
	PG_CATCH();
	{
		disable_timeout(LOCK_TIMEOUT, false);
		end_waiting(saved_title);
		zk_stats.cancellations++;
		count(parent, slots, ZKSH_CANCELLATIONS, 1);
		PG_RE_THROW();
	}
	PG_END_TRY();

	end_waiting(saved_title);
	if (granted)
	{
		zk_stats.acquisitions++;
		count(parent, slots, ZKSH_ACQUISITIONS, 1);
	}
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
	PG_RETURN_BOOL(acquire(fcinfo, false, false, false, get_timeout_ms(fcinfo, 1)));
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
	PG_RETURN_BOOL(acquire(fcinfo, false, true, false, get_timeout_ms(fcinfo, 1)));
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
	PG_RETURN_BOOL(acquire(fcinfo, true, false, false, get_timeout_ms(fcinfo, 1)));
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
	PG_RETURN_BOOL(acquire(fcinfo, true, true, false, get_timeout_ms(fcinfo, 1)));
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
	char	   *name;

	zkl_get_lock_parent(fcinfo, parent, &name);
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

/* One name of a multi-lock. */
typedef struct LockName
{
	char		parent[ZKR_PARENT_MAX];
	char	   *name;
} LockName;

static int
by_parent(const void *a, const void *b)
{
	return strcmp(((const LockName *) a)->parent, ((const LockName *) b)->parent);
}

/*
 * The names of a text[] argument 0, each once, in one canonical order
 * whatever order the caller gives: by their node's name.  Two multi-locks
 * then never take two names in opposite orders, so never deadlock each
 * other.
 */
static int
get_lock_names(FunctionCallInfo fcinfo, LockName **names)
{
	ArrayType  *array;
	Datum	   *elements;
	bool	   *nulls;
	int			n;
	int			kept = 0;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock names must not be null")));
	array = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("zklock names must be a one-dimensional array")));
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT,
					  &elements, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock names must not be an empty array")));
	*names = palloc(n * sizeof(LockName));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("zklock names must not contain a null")));
		name_to_parent(DatumGetTextPP(elements[i]), "", (*names)[i].parent,
					   &(*names)[i].name);
	}
	qsort(*names, n, sizeof(LockName), by_parent);
	for (i = 0; i < n; i++)
		if (kept == 0 || strcmp((*names)[kept - 1].parent, (*names)[i].parent) != 0)
			(*names)[kept++] = (*names)[i];
	return kept;
}

/*
 * Take every lock of a text[] argument 0, or none: all within timeout_ms
 * (the whole call's), in the canonical order.  A name not granted, an
 * error or an interrupt gives back every hold this call took, holds taken
 * before it staying as they were.
 */
static bool
acquire_all(FunctionCallInfo fcinfo, bool xact, bool try_only,
			int64 timeout_ms)
{
	LockName   *names;
	int			n = get_lock_names(fcinfo, &names);
	TimestampTz deadline = timeout_ms > 0 ?
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									Min(timeout_ms, MAX_TIMEOUT_MS)) : 0;
	volatile int taken = 0;
	int64		losses;
	int			i;

	/* Holds lost before the call are no concern of it. */
	zkl_check_session();
	losses = zkh_losses();
	PG_TRY();
	{
		for (; taken < n; taken++)
		{
			int64		left = timeout_ms;

			if (deadline != 0)
				left = Max(TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
														   deadline), 0);
			if (!acquire_name(names[taken].parent, names[taken].name, false, 0,
							  xact, try_only, left))
				break;

			/*
			 * A session lost between two names takes the earlier ones with
			 * it, and only a WARNING says so: give up the rest.
			 */
			if (zkh_losses() != losses)
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("zklock lost its ZooKeeper session while taking several locks"),
						 errdetail("None of the locks of this call is held."),
						 errhint("Call it again to take them all.")));
		}
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		for (i = taken - 1; i >= 0; i--)
			zkh_undo_hold(names[i].parent, false, xact);
		RESUME_INTERRUPTS();
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
	acquire_all(fcinfo, false, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_lock_array_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, false, false, get_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_lock_array(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, false, true, 0));
}

Datum
zk_xact_lock_array(PG_FUNCTION_ARGS)
{
	acquire_all(fcinfo, true, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_xact_lock_array_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, true, false, get_timeout_ms(fcinfo, 1)));
}

Datum
zk_try_xact_lock_array(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_all(fcinfo, true, true, 0));
}

/*
 * Release one session hold on each name; true if every one was held (each
 * that was not gets a WARNING, as zk_unlock gives).
 */
Datum
zk_unlock_array(PG_FUNCTION_ARGS)
{
	LockName   *names;
	int			n = get_lock_names(fcinfo, &names);
	bool		all = true;
	int			i;

	zkl_check_session();
	for (i = 0; i < n; i++)
		all &= zkh_release_session_hold(names[i].parent, false, names[i].name);
	PG_RETURN_BOOL(all);
}

/* The semaphore name of argument 0 and its parent path. */
void
zkl_get_semaphore_parent(FunctionCallInfo fcinfo, char parent[ZKR_PARENT_MAX],
						 char **name)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock semaphore name must not be null")));
	name_to_parent(PG_GETARG_TEXT_PP(0), "%semaphores/", parent, name);
}

/* The semaphore size argument 1. */
static int
get_slots(FunctionCallInfo fcinfo)
{
	int32		slots;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock semaphore size must not be null")));
	slots = PG_GETARG_INT32(1);
	if (slots < 1 || slots > ZKN_SLOTS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock semaphore size must be between 1 and %d",
						ZKN_SLOTS_MAX)));
	return slots;
}

/* Take one slot of the semaphore named by argument 0, of size argument 1. */
static bool
acquire_slot(FunctionCallInfo fcinfo, bool xact, bool try_only,
			 int64 timeout_ms)
{
	char		parent[ZKR_PARENT_MAX];
	char	   *name;
	int			slots;

	zkl_get_semaphore_parent(fcinfo, parent, &name);
	slots = get_slots(fcinfo);
	return acquire_name(parent, name, false, slots, xact, try_only,
						timeout_ms);
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
	acquire_slot(fcinfo, false, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_semaphore_acquire_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, false, false, get_timeout_ms(fcinfo, 2)));
}

Datum
zk_try_semaphore_acquire(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, false, true, 0));
}

Datum
zk_xact_semaphore_acquire(PG_FUNCTION_ARGS)
{
	acquire_slot(fcinfo, true, false, -1);
	PG_RETURN_VOID();
}

Datum
zk_xact_semaphore_acquire_timeout(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, true, false, get_timeout_ms(fcinfo, 2)));
}

Datum
zk_try_xact_semaphore_acquire(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(acquire_slot(fcinfo, true, true, 0));
}

Datum
zk_semaphore_release(PG_FUNCTION_ARGS)
{
	char		parent[ZKR_PARENT_MAX];
	char	   *name;

	zkl_get_semaphore_parent(fcinfo, parent, &name);
	zkl_check_session();
	PG_RETURN_BOOL(zkh_release_slot(parent, name));
}

Datum
zk_semaphore_token(PG_FUNCTION_ARGS)
{
	char		parent[ZKR_PARENT_MAX];
	char	   *name;
	int64		token;

	zkl_get_semaphore_parent(fcinfo, parent, &name);
	zkl_check_session();
	token = zkh_slot_token(parent);
	if (token == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(token);
}

Datum
zk_lock_token(PG_FUNCTION_ARGS)
{
	char		parent[ZKR_PARENT_MAX];
	char	   *name;
	int64		token;

	zkl_get_lock_parent(fcinfo, parent, &name);
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
