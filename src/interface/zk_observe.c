/*-------------------------------------------------------------------------
 *
 * zk_observe.c
 *	  SQL functions that show who holds what: the locks of this backend and
 *	  of the server (zk_locks), the whole queue of a lock or a semaphore
 *	  across every client of the ensemble (zk_lock_contenders,
 *	  zk_semaphore_contenders), whom a waiting backend waits for
 *	  (zk_blockers), every backend's session (zk_sessions), this backend's
 *	  session and counters (zk_status), and the statistics per lock name
 *	  (zk_stat_locks and its bounds; zk_stat_locks_reset empties them).
 *
 * Those that show a queue read it from ZooKeeper with the queue reader
 * (zk_queue_read.c), so they open the session if need be; the others look
 * at this backend and shared memory alone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "base/zk_text.h"
#include "holds/zk_holds.h"
#include "interface/zk_args.h"
#include "recipe/zk_deadlock.h"
#include "recipe/zk_queue_read.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

PG_FUNCTION_INFO_V1(zk_locks);
PG_FUNCTION_INFO_V1(zk_lock_contenders);
PG_FUNCTION_INFO_V1(zk_semaphore_contenders);
PG_FUNCTION_INFO_V1(zk_blockers);
PG_FUNCTION_INFO_V1(zk_status);
PG_FUNCTION_INFO_V1(zk_sessions);
PG_FUNCTION_INFO_V1(zk_stat_locks);
PG_FUNCTION_INFO_V1(zk_stat_locks_reset);
PG_FUNCTION_INFO_V1(zk_stat_wait_time_bounds);
PG_FUNCTION_INFO_V1(zk_stat_hold_time_bounds);

/* A session's state as zks_show_state_in shows it, by name. */
static const char *
shown_state_name(uint32 shown)
{
	switch (shown)
	{
		case ZKS_SHOWN_CLOSED:
			return "closed";
		case ZKS_SHOWN_OPEN + ZKS_CONNECTED:
			return "connected";
		case ZKS_SHOWN_OPEN + ZKS_UNSURE:
			return "unsure";
		case ZKS_SHOWN_OPEN + ZKS_LOST:
			return "lost";
	}
	return "unknown";
}

/* This backend's session state, read live. */
static const char *
session_state_name(void)
{
	return shown_state_name(zks_shown_state());
}

#define ZK_LOCKS_COLUMNS	11

static const char *
mode_name(bool shared, bool semaphore)
{
	return semaphore ? "semaphore" : shared ? "shared" : "exclusive";
}

/* One row of zk_locks; holds 0 for a wait or a kept node, whose scope is NULL. */
static void
put_lock_row(ReturnSetInfo *rsinfo, int pid, Oid database, Datum name,
			 const char *mode, const char *scope, int count,
			 const char *state, const char *node, int64 token,
			 TimestampTz held_since, TimestampTz waiting_since)
{
	Datum		values[ZK_LOCKS_COLUMNS];
	bool		nulls[ZK_LOCKS_COLUMNS] = {0};

	values[0] = Int32GetDatum(pid);
	values[1] = ObjectIdGetDatum(database);
	values[2] = name;
	values[3] = CStringGetTextDatum(mode);
	if (scope)
		values[4] = CStringGetTextDatum(scope);
	else
		nulls[4] = true;
	values[5] = Int32GetDatum(count);
	values[6] = CStringGetTextDatum(state);
	if (node && node[0] != '\0')
		values[7] = CStringGetTextDatum(node);
	else
		nulls[7] = true;
	values[8] = Int64GetDatum(token);
	nulls[8] = token == 0;
	values[9] = TimestampTzGetDatum(held_since);
	nulls[9] = held_since == 0;
	values[10] = TimestampTzGetDatum(waiting_since);
	nulls[10] = waiting_since == 0;
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * One row per backend, lock, mode and scope held, and one per backend
 * waiting, as pg_locks shows them: this backend's own holds from its table
 * (with the live state of its session: held, unsure, lost), and, with
 * zklock preloaded, every other backend's holds and waits from shared
 * memory (held or lost, as that backend last knew), and every backend's
 * nodes kept after their release.  A backend cannot run this while it
 * waits, so its own rows never say "waiting".
 */
Datum
zk_locks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ZkHoldRow  *rows;
	ZkshHold   *others;
	ZkshWait   *waits;
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
		put_lock_row(rsinfo, MyProcPid, MyDatabaseId,
					 CStringGetTextDatum(rows[i].name),
					 mode_name(rows[i].shared, rows[i].semaphore),
					 rows[i].xact ? "transaction" : "session", rows[i].count,
					 rows[i].lost ? "lost" : live_state, rows[i].node,
					 rows[i].token, rows[i].since, 0);

	n = zksh_holds(&others);
	for (i = 0; i < n; i++)
	{
		ZkshHold   *h = &others[i];
		int			scope;

		/*
		 * A node kept after its release (zklock.keep_released) is shown
		 * while its flag says it is still kept; this backend's own too,
		 * since its table no longer has it.
		 */
		if (h->session_count == 0 && h->xact_count == 0)
		{
			if (pg_atomic_read_u32(&h->kept) == 1)
				put_lock_row(rsinfo, h->pid, h->database,
							 zkt_shown_name(h->name),
							 mode_name(h->shared, h->semaphore), NULL, 0,
							 "kept", h->node, h->token, 0, 0);
			continue;
		}
		if (h->pid == MyProcPid)
			continue;
		for (scope = 0; scope < 2; scope++)
		{
			int			count = scope ? h->xact_count : h->session_count;

			if (count > 0)
				put_lock_row(rsinfo, h->pid, h->database, zkt_shown_name(h->name),
							 mode_name(h->shared, h->semaphore),
							 scope ? "transaction" : "session",
							 count, h->lost ? "lost" : "held", h->node,
							 h->token, h->since, 0);
		}
	}
	n = zksh_waits(&waits);
	for (i = 0; i < n; i++)
	{
		ZkshWait   *w = &waits[i];

		if (w->pid != MyProcPid)
			put_lock_row(rsinfo, w->pid, w->database, zkt_shown_name(w->name),
						 mode_name(w->shared, w->semaphore),
						 w->xact ? "transaction" : "session", 0,
						 "waiting", w->node, 0, 0, w->since);
	}
	PG_RETURN_VOID();
}

/* Which client made a contender node, judged by its name and data. */
static const char *
client_of(const char *name, bool is_zklock)
{
	return is_zklock ? "zklock" : zkn_peer_of(name);
}

/*
 * The queue of one lock or semaphore, as zk_lock_contenders and zk_blockers
 * show it (zk_queue_read.c): its contenders, each one's data and stat read
 * in one pipeline, in queue order.  A contender gone since the listing
 * is left out; one whose read failed otherwise (no permission to read it,
 * the connection lost) is an ERROR, since the queue without it would show
 * a waiter as holding.  On an ERROR the caller releases the queue.
 */
static void
read_queue(const char *parent, bool semaphore, TimestampTz deadline,
		   ZkqrQueue *q)
{
	ZkqrOptions options = {0};
	ZkqrStatus	status;

	options.semaphore = semaphore;
	options.reads = ZKQR_DATA;
	options.order = true;
	options.deadline = deadline;
	status = zkqr_read_queue(q, parent, &options);
	if (status == ZKQR_UNFINISHED)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("ZooKeeper did not answer within %d ms",
						zklock_connect_timeout)));
	if (status == ZKQR_FAILED && q->failed_name == NULL)
		zks_report_error(q->failed_rc, ZKS_LIST, parent);
	if (status == ZKQR_FAILED)
		zks_report_error(q->failed_rc, ZKS_READ,
						 psprintf("%s/%s", parent, q->failed_name));
}

/*
 * Who made the contender at index i: its identity, parsed if a zklock
 * backend made it (then *id is filled in and true is returned), else its
 * raw data, in *shown either way.
 */
static bool
identify(const ZkqrQueue *q, int i, ZknIdentity *id, Datum *shown)
{
	const ZkqEntry *e = &q->entries[i];
	const ZkRequest *read = q->reads[i];

	if (strncmp(e->name, "_c_", 3) == 0 && read->data &&
		zkt_is_utf8(read->data, read->datalen) &&
		zkn_parse_identity(read->data, read->datalen, id))
	{
		char	   *who = psprintf("pid %ld on %s:%ld, database %s, user %s, application %s",
								   id->pid, id->host, id->port, id->database,
								   id->user, id->application_name);

		*shown = CStringGetTextDatum(zkt_node_data(who, strlen(who)));
		return true;
	}
	*shown = CStringGetTextDatum(zkt_node_data(read->data, read->datalen));
	return false;
}

/* One row of zk_lock_contenders: the contender at index i of the queue. */
static void
put_contender(ReturnSetInfo *rsinfo, const char *parent, const ZkqrQueue *q,
			  int i, int position)
{
	const ZkqEntry *e = &q->entries[i];
	Datum		values[7];
	bool		nulls[7] = {0};
	ZknIdentity id;
	bool		is_zklock = identify(q, i, &id, &values[5]);

	values[0] = Int32GetDatum(position);
	values[1] = CStringGetTextDatum(zkt_node_data(e->name, strlen(e->name)));
	values[2] = CStringGetTextDatum(mode_name(e->contender.shared,
											  e->contender.slots > 0));
	/* This backend's own lock nodes never block each other. */
	values[3] = BoolGetDatum(q->holds[i] ||
							 (e->contender.slots == 0 &&
							  zkh_owns_node(parent, e->name)));
	values[4] = CStringGetTextDatum(client_of(e->name, is_zklock));
	values[6] = Int64GetDatum(e->czxid);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * The whole queue for a lock name, across every client of the ensemble:
 * position, node, mode, whether it holds the lock now, the client that
 * made it, who holds or waits (decoded for zklock, raw for others) and the
 * node's czxid, the fencing token it carries.
 */
static void
contenders(FunctionCallInfo fcinfo, bool semaphore)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char		parent[ZKL_PARENT_MAX];
	char	   *name;
	TimestampTz deadline;
	ZkqrQueue	q = {0};

	if (semaphore)
		zka_semaphore_parent(fcinfo, 0, parent, &name);
	else
		zka_lock_parent(fcinfo, 0, parent, &name);
	InitMaterializedSRF(fcinfo, 0);
	zkh_check_session();
	zksh_show_session();
	zks_open();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	PG_TRY();
	{
		int			i;

		read_queue(parent, semaphore, deadline, &q);
		for (i = 0; i < q.n; i++)
			put_contender(rsinfo, parent, &q, q.order[i], i + 1);
	}
	PG_FINALLY();
	{
		zkqr_release(&q);
	}
	PG_END_TRY();
}

Datum
zk_lock_contenders(PG_FUNCTION_ARGS)
{
	contenders(fcinfo, false);
	PG_RETURN_VOID();
}

/* The same for a semaphore: its slots, holding and waiting. */
Datum
zk_semaphore_contenders(PG_FUNCTION_ARGS)
{
	contenders(fcinfo, true);
	PG_RETURN_VOID();
}

static void
require_shared_memory(const char *function)
{
	if (!zksh_enabled())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs zklock in shared_preload_libraries", function),
				 errhint("Add zklock to shared_preload_libraries and restart the server.")));
}

/*
 * In the spirit of pg_blocking_pids: for a backend of this server that
 * waits for a zklock, every contender it waits for, read from the queue in
 * ZooKeeper, with who made it (host, port and pid of a zklock backend
 * anywhere; raw data for other clients) and whether it holds the lock now.
 * For a semaphore's waiter, those are the slot holders.  No rows if that
 * backend waits for none.
 */
Datum
zk_blockers(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ZkshWait	wait;
	char	   *parent;
	TimestampTz deadline;
	ZkqrQueue	q = {0};

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("pid must not be null")));
	require_shared_memory("zk_blockers");
	InitMaterializedSRF(fcinfo, 0);
	if (!zksh_wait_of(PG_GETARG_INT32(0), &wait) || wait.node[0] == '\0')
		PG_RETURN_VOID();
	parent = pnstrdup(wait.node, zkl_parent_length(wait.node));

	zkh_check_session();
	zksh_show_session();
	zks_open();
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   zklock_connect_timeout);
	PG_TRY();
	{
		int		   *blockers;
		int			nblockers = 0;
		int			own;
		int			i;

		read_queue(parent, wait.semaphore, deadline, &q);
		own = zkqr_find(&q, zkl_basename(wait.node));
		blockers = palloc(Max(q.n, 1) * sizeof(int));
		if (own >= 0)
			nblockers = (wait.semaphore ? zkq_slot_blockers : zkq_blockers)
				(q.entries, q.n, own, true, blockers);
		if (nblockers < 0)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		for (i = 0; i < nblockers; i++)
		{
			const ZkqEntry *e = &q.entries[blockers[i]];
			Datum		values[9];
			bool		nulls[9] = {0};
			ZknIdentity id;
			bool		is_zklock = identify(&q, blockers[i], &id, &values[8]);

			values[0] = zkt_shown_name(wait.name);
			values[1] = CStringGetTextDatum(zkt_node_data(e->name, strlen(e->name)));
			values[2] = CStringGetTextDatum(e->contender.shared ? "shared" : "exclusive");
			values[3] = BoolGetDatum(q.holds[blockers[i]]);
			values[4] = CStringGetTextDatum(client_of(e->name, is_zklock));
			if (is_zklock)
			{
				values[5] = CStringGetTextDatum(zkt_node_data(id.host, strlen(id.host)));
				values[6] = Int32GetDatum((int32) id.port);
				values[7] = Int32GetDatum((int32) id.pid);
			}
			else
				nulls[5] = nulls[6] = nulls[7] = true;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
								 nulls);
		}
	}
	PG_FINALLY();
	{
		zkqr_release(&q);
	}
	PG_END_TRY();
	PG_RETURN_VOID();
}

/*
 * A histogram's buckets as Prometheus counts them: element i counts
 * everything within bound i, so each includes the ones before it.
 */
static Datum
cumulative_buckets(const int64 *counts, int n)
{
	Datum	   *buckets = palloc(n * sizeof(Datum));
	int64		within = 0;
	int			b;

	for (b = 0; b < n; b++)
	{
		within += counts[b];
		buckets[b] = Int64GetDatum(within);
	}
	return PointerGetDatum(construct_array(buckets, n, INT8OID, sizeof(int64),
										   FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/* An array of bounds in ms, as float8. */
static Datum
bounds_array(const int *bounds_ms, int n)
{
	Datum	   *bounds = palloc(n * sizeof(Datum));
	int			b;

	for (b = 0; b < n; b++)
		bounds[b] = Float8GetDatum((double) bounds_ms[b]);
	return PointerGetDatum(construct_array(bounds, n, FLOAT8OID, sizeof(float8),
										   FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/* How zk_stat_locks shows a counter. */
typedef enum StatShown
{
	STAT_COUNT,
	STAT_MS,					/* a time counted in us, shown in ms */
	STAT_HISTOGRAM				/* the counter and the buckets after it,
								 * cumulative */
} StatShown;

typedef struct StatColumn
{
	ZkshCounter counter;
	StatShown	shown;
	int			ncounters;		/* how many it shows: a histogram's buckets,
								 * else 1 */
} StatColumn;

/*
 * zk_stat_locks's columns after the name, in the order zklock--1.0.sql
 * declares them.  This one table both sizes the row and fills it, so the
 * column count checked against the declaration is the count filled in.
 */
static const StatColumn stat_columns[] = {
	{ZKSH_ACQUISITIONS, STAT_COUNT, 1},
	{ZKSH_WAITS, STAT_COUNT, 1},
	{ZKSH_WAIT_TIME_US, STAT_MS, 1},
	{ZKSH_TIMEOUTS, STAT_COUNT, 1},
	{ZKSH_CANCELLATIONS, STAT_COUNT, 1},
	{ZKSH_DEADLOCKS, STAT_COUNT, 1},
	{ZKSH_LOSSES, STAT_COUNT, 1},
	{ZKSH_WAIT_BUCKET, STAT_HISTOGRAM, ZKSH_WAIT_BUCKETS},
	{ZKSH_RELEASES, STAT_COUNT, 1},
	{ZKSH_HOLD_TIME_US, STAT_MS, 1},
	{ZKSH_HOLD_BUCKET, STAT_HISTOGRAM, ZKSH_HOLD_BUCKETS},
	{ZKSH_KEPT_ACQUISITIONS, STAT_COUNT, 1},
};

/* The name, then a column per entry of stat_columns. */
#define STAT_NCOLUMNS	((int) (1 + lengthof(stat_columns)))

/* Server-wide statistics per lock name, in the style of pg_stat_*. */
Datum
zk_stat_locks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ZkshStats  *stats;
	int			n;
	int			i;

	require_shared_memory("zk_stat_locks");
	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != STAT_NCOLUMNS)
		elog(ERROR, "zk_stat_locks is declared with %d columns but shows %d",
			 rsinfo->setDesc->natts, STAT_NCOLUMNS);
	n = zksh_stats(&stats);
	for (i = 0; i < n; i++)
	{
		int64	   *c = stats[i].counters;
		Datum		values[STAT_NCOLUMNS];
		bool		nulls[STAT_NCOLUMNS] = {0};
		int			column;

		values[0] = zkt_shown_name(stats[i].name);
		for (column = 1; column < STAT_NCOLUMNS; column++)
		{
			const StatColumn *sc = &stat_columns[column - 1];

			switch (sc->shown)
			{
				case STAT_COUNT:
					values[column] = Int64GetDatum(c[sc->counter]);
					break;
				case STAT_MS:
					values[column] = Float8GetDatum(c[sc->counter] / 1000.0);
					break;
				case STAT_HISTOGRAM:
					values[column] = cumulative_buckets(&c[sc->counter],
														sc->ncounters);
					break;
			}
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_VOID();
}

/* The upper bounds of zk_stat_locks.wait_time_buckets, in ms. */
Datum
zk_stat_wait_time_bounds(PG_FUNCTION_ARGS)
{
	PG_RETURN_DATUM(bounds_array(zksh_wait_bounds_ms, ZKSH_WAIT_BUCKETS));
}

/* The upper bounds of zk_stat_locks.hold_time_buckets, in ms. */
Datum
zk_stat_hold_time_bounds(PG_FUNCTION_ARGS)
{
	PG_RETURN_DATUM(bounds_array(zksh_hold_bounds_ms, ZKSH_HOLD_BUCKETS));
}

Datum
zk_stat_locks_reset(PG_FUNCTION_ARGS)
{
	require_shared_memory("zk_stat_locks_reset");
	zksh_reset_stats();
	PG_RETURN_VOID();
}

static void
put_session_row(ReturnSetInfo *rsinfo, int pid, Oid database,
				const char *state, TimestampTz since)
{
	Datum		values[4];
	bool		nulls[4] = {0};

	values[0] = Int32GetDatum(pid);
	values[1] = ObjectIdGetDatum(database);
	values[2] = CStringGetTextDatum(state);
	values[3] = TimestampTzGetDatum(since);
	nulls[3] = since == 0;
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * Every backend's ZooKeeper session: with zklock preloaded, each backend
 * that opened one, as its session's threads last showed it; this backend's
 * own state is read live.  Without preloading, this backend alone.
 */
Datum
zk_sessions(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ZkshSession *sessions;
	TimestampTz my_since = 0;
	bool		shown = false;
	int			n;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	n = zksh_sessions(&sessions);
	for (i = 0; i < n; i++)
	{
		if (sessions[i].pid == MyProcPid)
		{
			shown = true;
			my_since = sessions[i].since;
			continue;
		}
		put_session_row(rsinfo, sessions[i].pid, sessions[i].database,
						shown_state_name(sessions[i].state), sessions[i].since);
	}
	if (shown || zks_is_open())
		put_session_row(rsinfo, MyProcPid, MyDatabaseId, session_state_name(),
						my_since);
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
	Datum		values[14];
	bool		nulls[14] = {0};
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
	values[5] = Int32GetDatum(zkh_unacknowledged_losses());
	values[6] = Int64GetDatum(zksh_backend_count(ZKSH_ACQUISITIONS));
	values[7] = Int64GetDatum(zksh_backend_count(ZKSH_WAITS));
	values[8] = Float8GetDatum(zksh_backend_count(ZKSH_WAIT_TIME_US) / 1000.0);
	values[9] = Int64GetDatum(zksh_backend_count(ZKSH_TIMEOUTS));
	values[10] = Int64GetDatum(zksh_backend_count(ZKSH_CANCELLATIONS));
	values[11] = Int64GetDatum(zksh_backend_count(ZKSH_LOSSES));
	values[12] = Int64GetDatum(zksh_backend_count(ZKSH_DEADLOCKS));
	values[13] = BoolGetDatum(zks_uses_tls());

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
