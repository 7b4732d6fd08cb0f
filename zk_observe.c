/*-------------------------------------------------------------------------
 *
 * zk_observe.c
 *	  SQL functions that show who holds what: this backend's locks
 *	  (zk_locks), the whole queue of a lock across every client of the
 *	  ensemble (zk_lock_contenders), and this backend's session and counters
 *	  (zk_status).
 *
 * They only read.  zk_lock_contenders asks ZooKeeper, so it opens the
 * session if need be; the others look at this backend alone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "zk_holds.h"
#include "zk_session.h"
#include "zklock.h"

PG_FUNCTION_INFO_V1(zk_locks);
PG_FUNCTION_INFO_V1(zk_lock_contenders);
PG_FUNCTION_INFO_V1(zk_status);

static const char *
session_state_name(void)
{
	if (!zks_is_open())
		return "closed";
	switch (zks_state())
	{
		case ZKS_CONNECTED:
			return "connected";
		case ZKS_UNSURE:
			return "unsure";
		case ZKS_LOST:
			return "lost";
	}
	return "unknown";
}

/*
 * One row per lock, mode and scope this backend holds: hold count, state
 * (held, unsure while the session is disconnected, lost), node, fencing
 * token and since when.  A backend cannot run this while it waits, so no
 * row is ever "waiting": waits show in pg_stat_activity and in
 * zk_lock_contenders.
 */
Datum
zk_locks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ZkHold	   *holds;
	bool	   *lost;
	int			n;
	int			i;
	const char *live_state;

	InitMaterializedSRF(fcinfo, 0);
	n = zkh_list(&holds, &lost);
	switch (zks_state())
	{
		case ZKS_CONNECTED:
			live_state = "held";
			break;
		case ZKS_UNSURE:
			live_state = "unsure";
			break;
		default:
			live_state = "lost";
			break;
	}

	for (i = 0; i < n; i++)
	{
		int			scope;

		for (scope = 0; scope < 2; scope++)
		{
			Datum		values[8];
			bool		nulls[8] = {0};
			int			count = scope == 0 ? holds[i].session_count :
			holds[i].xact_count;

			if (count == 0)
				continue;
			values[0] = CStringGetTextDatum(holds[i].name);
			values[1] = CStringGetTextDatum(holds[i].shared ? "shared" : "exclusive");
			values[2] = CStringGetTextDatum(scope == 0 ? "session" : "transaction");
			values[3] = Int32GetDatum(count);
			values[4] = CStringGetTextDatum(lost[i] ? "lost" : live_state);
			values[5] = CStringGetTextDatum(holds[i].node.path);
			values[6] = Int64GetDatum(holds[i].node.czxid);
			values[7] = TimestampTzGetDatum(holds[i].since);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
								 nulls);
		}
	}
	PG_RETURN_VOID();
}

typedef struct Contender
{
	const char *name;
	int32_t		sequence;
	bool		shared;
	ZkRequest  *read;
} Contender;

static int
by_sequence(const void *a, const void *b)
{
	int32_t		sa = ((const Contender *) a)->sequence;
	int32_t		sb = ((const Contender *) b)->sequence;

	return (sa > sb) - (sa < sb);
}

/* Which client made a contender node, judged by its name and data. */
static const char *
client_of(const Contender *c, bool is_zklock)
{
	if (is_zklock)
		return "zklock";
	if (strstr(c->name, "__lock__") || strstr(c->name, "__rlock__"))
		return "kazoo";
	if (strncmp(c->name, "_c_", 3) == 0)
		return "curator";
	return "unknown";
}

static bool
is_valid_utf8(const char *data, int len)
{
	return pg_encoding_verifymbstr(PG_UTF8, data, len) == len;
}

/* Node data as text: UTF-8 if it is, else a hex dump. */
static char *
data_as_text(const char *data, int len)
{
	if (len == 0)
		return pstrdup("");
	if (is_valid_utf8(data, len))
		return pg_any_to_server(pnstrdup(data, len), len, PG_UTF8);
	else
	{
		char	   *hex = palloc(2 * len + 3);

		strcpy(hex, "\\x");
		hex[2 + hex_encode(data, len, hex + 2)] = '\0';
		return hex;
	}
}

/* Is this contender a node this backend holds? */
static bool
is_held_here(const char *parent, const Contender *c)
{
	ZkHold	   *hold = zkh_find(parent, c->shared);

	return hold && strcmp(strrchr(hold->node.path, '/') + 1, c->name) == 0;
}

/* Release every outstanding read if the listing is abandoned. */
static void
release_reads(Contender *contenders, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		zks_release_request(contenders[i].read);
}

static void
await_or_error(ZkRequest *req, TimestampTz deadline)
{
	if (!zks_await(req, deadline))
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("ZooKeeper did not answer within %d ms",
						zklock_connect_timeout)));
}

/* The contenders under parent, in queue order.  Sets *n. */
static Contender *
list_contenders(const char *parent, TimestampTz deadline, int *n)
{
	ZkRequest  *list = zks_get_children(parent);
	Contender  *contenders;
	int			rc;
	int			i;

	PG_TRY();
	{
		await_or_error(list, deadline);
	}
	PG_CATCH();
	{
		zks_release_request(list);
		PG_RE_THROW();
	}
	PG_END_TRY();

	rc = list->rc;
	if (rc != ZOK)
	{
		zks_release_request(list);
		if (rc != ZNONODE)
			zks_report_error(rc, "list children of", parent);
		*n = 0;
		return NULL;
	}

	contenders = palloc0(Max(list->nchildren, 1) * sizeof(Contender));
	*n = 0;
	for (i = 0; i < list->nchildren; i++)
	{
		Contender  *c = &contenders[*n];

		if (zkn_parse_contender(list->children[i], &c->sequence, &c->shared))
		{
			c->name = pstrdup(list->children[i]);
			(*n)++;
		}
	}
	zks_release_request(list);
	qsort(contenders, *n, sizeof(Contender), by_sequence);
	return contenders;
}

/* Read every contender's data and stat in one pipeline. */
static void
read_contenders(const char *parent, Contender *contenders, int n,
				TimestampTz deadline)
{
	int			i;

	PG_TRY();
	{
		for (i = 0; i < n; i++)
		{
			char		path[ZKR_NODE_MAX + ZKR_PARENT_MAX];

			snprintf(path, sizeof(path), "%s/%s", parent, contenders[i].name);
			contenders[i].read = zks_get_data(path);
		}
		for (i = 0; i < n; i++)
			await_or_error(contenders[i].read, deadline);
	}
	PG_CATCH();
	{
		release_reads(contenders, n);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/*
 * The whole queue for a lock name, across every client of the ensemble:
 * position, node, mode, whether it holds the lock now, the client that
 * made it, who holds or waits (decoded for zklock, raw for others) and the
 * node's czxid, the fencing token it carries.
 */
Datum
zk_lock_contenders(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char		parent[ZKR_PARENT_MAX];
	char		name[ZKN_NAME_MAX + 1];
	TimestampTz deadline;
	Contender  *contenders;
	int			n;
	int			i;
	int			position = 0;
	bool		exclusive_ahead = false;

	zkl_get_lock_parent(fcinfo, parent, name);
	InitMaterializedSRF(fcinfo, 0);
	zkl_check_session();
	zks_open();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	contenders = list_contenders(parent, deadline, &n);
	read_contenders(parent, contenders, n, deadline);

	for (i = 0; i < n; i++)
	{
		Contender  *c = &contenders[i];
		ZkRequest  *read = c->read;
		Datum		values[7];
		bool		nulls[7] = {0};
		ZknIdentity id;
		bool		is_zklock;
		bool		holds;

		/* A node gone since the listing has left the queue. */
		if (read->rc != ZOK)
			continue;
		position++;
		holds = c->shared ? !exclusive_ahead : (position == 1);
		if (!c->shared)
			exclusive_ahead = true;
		/* This backend's own nodes never block each other. */
		holds |= is_held_here(parent, c);
		is_zklock = strncmp(c->name, "_c_", 3) == 0 && read->data &&
			is_valid_utf8(read->data, read->datalen) &&
			zkn_parse_identity(read->data, read->datalen, &id);

		values[0] = Int32GetDatum(position);
		values[1] = CStringGetTextDatum(c->name);
		values[2] = CStringGetTextDatum(c->shared ? "shared" : "exclusive");
		values[3] = BoolGetDatum(holds);
		values[4] = CStringGetTextDatum(client_of(c, is_zklock));
		if (is_zklock)
		{
			char	   *who = psprintf("pid %ld on %s:%ld, database %s, user %s, application %s",
									   id.pid, id.host, id.port, id.database,
									   id.user, id.application_name);

			values[5] = CStringGetTextDatum(data_as_text(who, strlen(who)));
		}
		else
			values[5] = CStringGetTextDatum(data_as_text(read->data, read->datalen));
		values[6] = Int64GetDatum(read->stat.czxid);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	release_reads(contenders, n);
	PG_RETURN_VOID();
}

/*
 * This backend's session and counters.  The session password is never
 * shown.
 */
Datum
zk_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[11];
	bool		nulls[11] = {0};
	const char *server = zks_is_open() ? zks_current_server() : NULL;
	ZkHold	   *holds;
	bool	   *lost;
	int			n;
	int			i;
	int			held = 0;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	n = zkh_list(&holds, &lost);
	for (i = 0; i < n; i++)
		held += !lost[i];

	values[0] = CStringGetTextDatum(session_state_name());
	if (server)
		values[1] = CStringGetTextDatum(server);
	else
		nulls[1] = true;
	if (zks_is_open() && zks_session_id() != 0)
	{
		values[2] = CStringGetTextDatum(psprintf("0x%llx",
												 (unsigned long long) zks_session_id()));
		values[3] = Int32GetDatum(zks_negotiated_timeout());
	}
	else
		nulls[2] = nulls[3] = true;
	values[4] = Int32GetDatum(held);
	values[5] = Int64GetDatum(zk_stats.acquisitions);
	values[6] = Int64GetDatum(zk_stats.waits);
	values[7] = Float8GetDatum(zk_stats.wait_time_us / 1000.0);
	values[8] = Int64GetDatum(zk_stats.timeouts);
	values[9] = Int64GetDatum(zk_stats.cancellations);
	values[10] = Int64GetDatum(zkh_losses());

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
