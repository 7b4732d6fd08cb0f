/*-------------------------------------------------------------------------
 *
 * zk_test_support.c
 *	  What the fault tests need from inside a backend, and nothing else
 *	  does.  None of it is part of the extension's SQL: a test creates the
 *	  SQL function itself, which takes a superuser.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#include "recipe/zk_deadlock.h"
#include "session/zk_session.h"

PG_FUNCTION_INFO_V1(zk_test_session_credentials);

/*
 * The session id and password, so that a test can expire the session from
 * another client, as Curator's tests do.
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
	if (!zks_is_open() || zks_session_id() == 0 ||
		!zks_session_password(passwd))
		PG_RETURN_NULL();
	passwd_hex[hex_encode(passwd, sizeof(passwd), passwd_hex)] = '\0';
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("%llx:%s",
											  (unsigned long long) zks_session_id(),
											  passwd_hex)));
}

PG_FUNCTION_INFO_V1(zk_test_delay_deadlock_confirmation);

/*
 * Make this backend's deadlock checks wait this many milliseconds between
 * finding a cycle and reading it again, so that a test can break the cycle
 * in between.
 */
Datum
zk_test_delay_deadlock_confirmation(PG_FUNCTION_ARGS)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be superuser to delay deadlock checks")));
	zkd_test_confirm_delay_ms = PG_GETARG_INT32(0);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(zk_test_deadlock_max_members);

/*
 * Make this backend's deadlock checks follow at most this many waiting
 * sessions (1 to the built-in limit), so that a test can meet the limit.
 */
Datum
zk_test_deadlock_max_members(PG_FUNCTION_ARGS)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be superuser to limit deadlock checks")));
	zkd_test_max_members = Max(1, Min(PG_GETARG_INT32(0), ZKD_MAX_MEMBERS));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(zk_test_deadlock_check_time);

/*
 * Give this backend's deadlock checks this many milliseconds, instead of
 * zklock.connect_timeout (0: that again), so that a test can make them run
 * out of time.
 */
Datum
zk_test_deadlock_check_time(PG_FUNCTION_ARGS)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be superuser to limit deadlock checks")));
	zkd_test_check_ms = Max(PG_GETARG_INT32(0), 0);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(zk_test_lose_session_after_grants);

/*
 * Declare this backend's session lost right after its next n grants, so
 * that a test can lose it between two names of a multi-lock.
 */
Datum
zk_test_lose_session_after_grants(PG_FUNCTION_ARGS)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be superuser to lose ZooKeeper sessions")));
	zks_test_lose_after_grants = Max(PG_GETARG_INT32(0), 0);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(zk_test_requests_sent);

/*
 * The requests this backend's session sent through zk_requests.c, and the
 * listings that decide whether a released node is kept (zk_keeping.c).
 */
Datum
zk_test_requests_sent(PG_FUNCTION_ARGS)
{
	int			kept;
	int			deciding;
	uint64		listings;

	zks_keeping_counts(&kept, &deciding, &listings);
	PG_RETURN_INT64((int64) (zks_requests_sent() + listings));
}

PG_FUNCTION_INFO_V1(zk_test_keeping_decided);

/* Is a node kept, and has every listing that decides on one answered? */
Datum
zk_test_keeping_decided(PG_FUNCTION_ARGS)
{
	int			kept;
	int			deciding;
	uint64		listings;

	zks_keeping_counts(&kept, &deciding, &listings);
	PG_RETURN_BOOL(kept > 0 && deciding == 0);
}

PG_FUNCTION_INFO_V1(zk_test_connection_count);

/* The connections the session has made, reconnects included. */
Datum
zk_test_connection_count(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64((int64) zks_connection_count());
}
