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

#include "zk_deadlock.h"
#include "zk_holds.h"
#include "zk_queue.h"
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
	ZkHoldRow  *rows;
	int			n;
	int			i;
	const char *live_state;

	InitMaterializedSRF(fcinfo, 0);
	n = zkh_rows(&rows);
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
		Datum		values[8];
		bool		nulls[8] = {0};

		values[0] = CStringGetTextDatum(rows[i].name);
		values[1] = CStringGetTextDatum(rows[i].shared ? "shared" : "exclusive");
		values[2] = CStringGetTextDatum(rows[i].xact ? "transaction" : "session");
		values[3] = Int32GetDatum(rows[i].count);
		values[4] = CStringGetTextDatum(rows[i].lost ? "lost" : live_state);
		values[5] = CStringGetTextDatum(rows[i].node);
		values[6] = Int64GetDatum(rows[i].token);
		values[7] = TimestampTzGetDatum(rows[i].since);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	PG_RETURN_VOID();
}

/* Which client made a contender node, judged by its name and data. */
static const char *
client_of(const char *name, bool is_zklock)
{
	if (is_zklock)
		return "zklock";
	if (strstr(name, "__lock__") || strstr(name, "__rlock__"))
		return "kazoo";
	if (strncmp(name, "_c_", 3) == 0)
		return "curator";
	return "unknown";
}

static bool
is_valid_utf8(const char *data, int len)
{
	return pg_encoding_verifymbstr(PG_UTF8, data, len) == len;
}

/*
 * Node data as text: UTF-8 shown in the database encoding (characters it
 * lacks as escaped bytes), anything else as a hex dump.
 */
static char *
data_as_text(const char *data, int len)
{
	if (len == 0)
		return pstrdup("");
	if (is_valid_utf8(data, len))
		return zkl_convert_lossy(data, len, PG_UTF8, GetDatabaseEncoding(),
								 true);
	else
	{
		char	   *hex = palloc(2 * len + 3);

		strcpy(hex, "\\x");
		hex[2 + hex_encode(data, len, hex + 2)] = '\0';
		return hex;
	}
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

/*
 * The queue of one lock, as read for zk_lock_contenders: the listing, its
 * contenders and a read of each node's data and stat.  entries[i] goes with
 * reads[i]; order lists the positions in queue order.
 */
typedef struct Queue
{
	ZkRequest  *list;
	ZkqEntry   *entries;
	ZkRequest **reads;
	int		   *order;
	bool	   *holds;
	int			n;
} Queue;

static void
release_queue(Queue *q)
{
	int			i;

	for (i = 0; i < q->n; i++)
		zks_release_request(q->reads[i]);
	q->n = 0;
	zks_release_request(q->list);
	q->list = NULL;
}

/*
 * List the contenders under parent and read every one's data and stat in
 * one pipeline; order them as the queue rules do.  A contender gone since
 * the listing is left out.  On an ERROR the caller releases the queue.
 */
static void
read_queue(const char *parent, TimestampTz deadline, Queue *q)
{
	int			nchildren;
	int			kept = 0;
	int			i;

	q->list = zks_get_children(parent);
	await_or_error(q->list, deadline);
	if (q->list->rc == ZNONODE)
		return;
	if (q->list->rc != ZOK)
		zks_report_error(q->list->rc, "list children of", parent);

	nchildren = Max(q->list->nchildren, 1);
	q->entries = palloc0(nchildren * sizeof(ZkqEntry));
	q->reads = palloc0(nchildren * sizeof(ZkRequest *));
	q->order = palloc(nchildren * sizeof(int));
	q->holds = palloc(nchildren * sizeof(bool));
	for (i = 0; i < q->list->nchildren; i++)
	{
		const char *child = q->list->children[i];
		ZkqEntry   *e = &q->entries[q->n];
		char	   *path;

		if (zkn_parse_contender(child, &e->contender) == ZKN_NOT_CONTENDER)
			continue;
		e->name = child;
		path = psprintf("%s/%s", parent, child);
		q->reads[q->n++] = zks_get_data(path);
		pfree(path);
	}
	for (i = 0; i < q->n; i++)
		await_or_error(q->reads[i], deadline);

	for (i = 0; i < q->n; i++)
	{
		if (q->reads[i]->rc != ZOK)
		{
			zks_release_request(q->reads[i]);
			continue;
		}
		q->entries[kept] = q->entries[i];
		q->entries[kept].czxid = q->reads[i]->stat.czxid;
		q->reads[kept] = q->reads[i];
		kept++;
	}
	q->n = kept;
	if (!zkq_describe(q->entries, q->n, zkq_needs_czxid(q->entries, q->n),
					  q->order, q->holds))
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
}

/* One row of zk_lock_contenders: the contender at index i of the queue. */
static void
put_contender(ReturnSetInfo *rsinfo, const char *parent, const Queue *q,
			  int i, int position)
{
	const ZkqEntry *e = &q->entries[i];
	const ZkRequest *read = q->reads[i];
	Datum		values[7];
	bool		nulls[7] = {0};
	ZknIdentity id;
	bool		is_zklock;

	is_zklock = strncmp(e->name, "_c_", 3) == 0 && read->data &&
		is_valid_utf8(read->data, read->datalen) &&
		zkn_parse_identity(read->data, read->datalen, &id);

	values[0] = Int32GetDatum(position);
	values[1] = CStringGetTextDatum(data_as_text(e->name, strlen(e->name)));
	values[2] = CStringGetTextDatum(e->contender.shared ? "shared" : "exclusive");
	/* This backend's own nodes never block each other. */
	values[3] = BoolGetDatum(q->holds[i] || zkh_owns_node(parent, e->name));
	values[4] = CStringGetTextDatum(client_of(e->name, is_zklock));
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
	char	   *name;
	TimestampTz deadline;
	Queue		q = {0};

	zkl_get_lock_parent(fcinfo, parent, &name);
	InitMaterializedSRF(fcinfo, 0);
	zkl_check_session();
	zks_open();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	PG_TRY();
	{
		int			i;

		read_queue(parent, deadline, &q);
		for (i = 0; i < q.n; i++)
			put_contender(rsinfo, parent, &q, q.order[i], i + 1);
	}
	PG_FINALLY();
	{
		release_queue(&q);
	}
	PG_END_TRY();
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
	Datum		values[12];
	bool		nulls[12] = {0};
	const char *server = zks_is_open() ? zks_current_server() : NULL;
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

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
	values[4] = Int32GetDatum(zkh_held_count());
	values[5] = Int64GetDatum(zk_stats.acquisitions);
	values[6] = Int64GetDatum(zk_stats.waits);
	values[7] = Float8GetDatum(zk_stats.wait_time_us / 1000.0);
	values[8] = Int64GetDatum(zk_stats.timeouts);
	values[9] = Int64GetDatum(zk_stats.cancellations);
	values[10] = Int64GetDatum(zkh_losses());
	values[11] = Int64GetDatum(zkd_deadlocks());

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
