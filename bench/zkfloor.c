/*
 * zkfloor: the ZooKeeper floor for the zklock benchmark.
 *
 * What the cheapest client of libzookeeper_mt pays for the requests a lock
 * cycle needs, on the same ensemble, with nothing of PostgreSQL around it.
 *
 *   zkfloor HOSTS MODE N R WARMUP PARENT
 *
 * MODE, one cycle on a child of PARENT:
 *   awaited    create EPHEMERAL|SEQUENTIAL, await; delete, await
 *              (two writes, two round trips)
 *   listed     create, await; get_children(PARENT), await; delete, await
 *   recipe     create and get_children sent back to back, await both;
 *              delete, await: what an uncontended zk_lock + zk_unlock asks
 *              of ZooKeeper (two writes, two round trips)
 *   pipelined  create and get_children sent back to back, await both;
 *              delete sent and NOT awaited: the next cycle's create follows
 *              it, and the session applies them in order (the last delete
 *              is awaited after the timed loop ends, outside the timing)
 *   handoff    sessions A and B: A creates a node (awaited, untimed), B sets
 *              a get-data watch on it (awaited, untimed); timed from A
 *              sending the delete to B receiving the reply of the
 *              get_children it sends from its watcher: one write, one
 *              notification, one read
 *   requeue-K  K sessions run the lock recipe on PARENT, each re-queueing
 *              as soon as its release is answered, as K zklock backends
 *              cycling on one lock do: a contender creates its node and
 *              lists the children (pipelined); the lowest holds; any other
 *              sets a get-data watch on its predecessor.  When the watched
 *              node is deleted, the deletion alone grants if the last
 *              listing showed that node at the head of the queue, else the
 *              contender lists again (zklock's rule for its own nodes).  A
 *              holder releases at once (delete, awaited, then re-queue).
 *              Timed: from a holder sending its delete to the next grant;
 *              N such handoffs after WARMUP untimed ones
 *   woken-K    the same, but a grant is taken (timed, then released) by a
 *              thread of the contender's own that sleeps on an eventfd
 *              until the library's completion thread wakes it, as a zklock
 *              backend's main thread is woken by its library's threads:
 *              woken-K minus requeue-K is what that wake-up costs
 *   yield      sessions A and B: A has a node under PARENT and a child
 *              watch on PARENT (both awaited, untimed), as a zklock backend
 *              keeping its released node (zklock.keep_released) has; timed
 *              from B sending its create and listing (pipelined, as zk_lock
 *              does) to B's grant: A's watcher sends A's delete as soon as
 *              B's node appears, and B, whose listing showed A's node ahead,
 *              is granted by the deletion through a get-data watch (or lists
 *              again if A's node was gone before the watch was set).  Two
 *              writes, two notifications, a read; then B deletes its node
 *              (awaited, untimed)
 *
 * Each of the R repeats opens fresh sessions to HOSTS (the benchmark gives
 * one server, so that both sides of a comparison use the same one), runs
 * WARMUP untimed cycles, then N timed cycles, and prints one line:
 *
 *   FLOOR mode=M rep=I n=N mean_ms=... p50_ms=... min_ms=... max_ms=... cpu_us=...
 *
 * mean_ms is the wall time of the N cycles divided by N (for handoff, yield
 * and requeue-K, the mean of the N timed intervals); p50/min/max are of single
 * cycles; cpu_us is this process's CPU time (user+system, all threads, so the client
 * library's I/O and completion threads too) over the N cycles, divided
 * by N.
 *
 * With ZKFLOOR_STAMPS=FILE, requeue-K and woken-K also write each timed
 * handoff's release and grant to FILE in wall-clock seconds, one "r g"
 * line each, for bench/wire.py to split against a packet capture.
 *
 * With ZKFLOOR_BURN_US=U, a requeue-K or woken-K releaser spends U
 * microseconds of CPU on its own thread once its delete is answered, before
 * it re-queues, as a backend finishes its statement and pgbench sends the
 * next one: the floor for a client that spends that much more CPU per
 * handoff on cores the ensemble shares.
 *
 * PARENT is created (persistent, with its ancestors) if missing and
 * deleted at the end.  Node names and data look like zklock's:
 * "_c_<uuid>-lock-<seq>" holding a ~110-byte JSON identity.
 *
 * Build: gcc -O2 -DTHREADED -o zkfloor zkfloor.c -lzookeeper_mt -lpthread
 * Exit status 0 on success; any ZooKeeper error is fatal (status 1).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <zookeeper/zookeeper.h>

#define PATH_MAX_LEN 1024
#define SESSION_TIMEOUT_MS 10000
#define CONNECT_WAIT_S 15
#define OP_WAIT_S 30

static const char *hosts;
static const char *parent;
static char prefix[PATH_MAX_LEN];
static char node_data[512];

static void
die(const char *fmt, ...)
{
	va_list		ap;

	va_start(ap, fmt);
	fprintf(stderr, "zkfloor: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void
deadline_after(struct timespec *ts, int seconds)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += seconds;
}

/* One outstanding request, completed on the library's completion thread. */
typedef struct Op
{
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int			done;
	int			rc;
	double		done_ms;		/* when the completion ran */
	char		path[PATH_MAX_LEN];
	int			nchildren;
} Op;

static void
op_init(Op *op)
{
	pthread_mutex_init(&op->mu, NULL);
	pthread_cond_init(&op->cv, NULL);
	op->done = 0;
}

static void
op_reset(Op *op)
{
	pthread_mutex_lock(&op->mu);
	op->done = 0;
	op->rc = 0;
	op->path[0] = '\0';
	op->nchildren = -1;
	pthread_mutex_unlock(&op->mu);
}

static void
op_finish(Op *op, int rc)
{
	double		t = now_ms();

	pthread_mutex_lock(&op->mu);
	op->rc = rc;
	op->done_ms = t;
	op->done = 1;
	pthread_cond_broadcast(&op->cv);
	pthread_mutex_unlock(&op->mu);
}

static void
op_wait(Op *op, const char *what)
{
	struct timespec deadline;

	deadline_after(&deadline, OP_WAIT_S);
	pthread_mutex_lock(&op->mu);
	while (!op->done)
	{
		if (pthread_cond_timedwait(&op->cv, &op->mu, &deadline) == ETIMEDOUT)
			die("%s: no reply within %d s", what, OP_WAIT_S);
	}
	pthread_mutex_unlock(&op->mu);
	if (op->rc != ZOK)
		die("%s: %s", what, zerror(op->rc));
}

static void
create_done(int rc, const char *value, const struct Stat *stat, const void *data)
{
	Op		   *op = (Op *) data;

	if (rc == ZOK && value)
		snprintf(op->path, sizeof(op->path), "%s", value);
	op_finish(op, rc);
}

static void
children_done(int rc, const struct String_vector *strings, const void *data)
{
	Op		   *op = (Op *) data;

	op->nchildren = (rc == ZOK && strings) ? strings->count : -1;
	op_finish(op, rc);
}

static void
void_done(int rc, const void *data)
{
	op_finish((Op *) data, rc);
}

static void
data_done(int rc, const char *value, int value_len, const struct Stat *stat,
		  const void *data)
{
	op_finish((Op *) data, rc);
}

/* Unawaited deletes of the pipelined mode. */
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pending_cv = PTHREAD_COND_INITIALIZER;
static int	pending_deletes = 0;
static int	pending_error = ZOK;

static void
pending_delete_done(int rc, const void *data)
{
	pthread_mutex_lock(&pending_mu);
	pending_deletes--;
	if (rc != ZOK && pending_error == ZOK)
		pending_error = rc;
	pthread_cond_broadcast(&pending_cv);
	pthread_mutex_unlock(&pending_mu);
}

static void
pending_drain(void)
{
	struct timespec deadline;

	deadline_after(&deadline, OP_WAIT_S);
	pthread_mutex_lock(&pending_mu);
	while (pending_deletes > 0)
	{
		if (pthread_cond_timedwait(&pending_cv, &pending_mu, &deadline) == ETIMEDOUT)
			die("unawaited deletes: no reply within %d s", OP_WAIT_S);
	}
	if (pending_error != ZOK)
		die("unawaited delete: %s", zerror(pending_error));
	pthread_mutex_unlock(&pending_mu);
}

/* Session handling. */
typedef struct Session
{
	zhandle_t  *zh;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int			state;
} Session;

static void
session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	Session    *s = (Session *) ctx;

	if (type != ZOO_SESSION_EVENT)
		return;
	pthread_mutex_lock(&s->mu);
	s->state = state;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void
session_open(Session *s)
{
	struct timespec deadline;

	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->state = 0;
	s->zh = zookeeper_init(hosts, session_watcher, SESSION_TIMEOUT_MS, NULL, s, 0);
	if (!s->zh)
		die("zookeeper_init(%s): %s", hosts, strerror(errno));
	/* As zklock does: re-resolve host names once a minute, not every loop. */
	zoo_set_servers_resolution_delay(s->zh, 60000);
	deadline_after(&deadline, CONNECT_WAIT_S);
	pthread_mutex_lock(&s->mu);
	while (s->state != ZOO_CONNECTED_STATE)
	{
		if (s->state == ZOO_EXPIRED_SESSION_STATE || s->state == ZOO_AUTH_FAILED_STATE)
			die("session failed (state %d)", s->state);
		if (pthread_cond_timedwait(&s->cv, &s->mu, &deadline) == ETIMEDOUT)
			die("could not connect to %s within %d s", hosts, CONNECT_WAIT_S);
	}
	pthread_mutex_unlock(&s->mu);
}

static void
session_close(Session *s)
{
	zookeeper_close(s->zh);
	s->zh = NULL;
}

static void
check_send(int rc, const char *what)
{
	if (rc != ZOK)
		die("sending %s: %s", what, zerror(rc));
}

static void
send_create(zhandle_t *zh, Op *op)
{
	op_reset(op);
	check_send(zoo_acreate2(zh, prefix, node_data, (int) strlen(node_data),
							&ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
							create_done, op), "create");
}

static void
send_children(zhandle_t *zh, Op *op)
{
	op_reset(op);
	check_send(zoo_aget_children(zh, parent, 0, children_done, op), "get_children");
}

static void
send_delete(zhandle_t *zh, const char *path, Op *op)
{
	op_reset(op);
	check_send(zoo_adelete(zh, path, -1, void_done, op), "delete");
}

/* Create and list, pipelined, as zk_lock does; await both. */
static void
create_and_list(zhandle_t *zh, Op *create, Op *list)
{
	send_create(zh, create);
	send_children(zh, list);
	op_wait(create, "create");
	op_wait(list, "get_children");
	if (list->nchildren < 1)
		die("get_children after create saw %d children", list->nchildren);
}

/* Create PARENT and its ancestors (persistent); existing ones are fine. */
static void
parent_create_done(int rc, const char *value, const void *data)
{
	op_finish((Op *) data, rc);
}

static void
create_ancestors(zhandle_t *zh)
{
	char		path[PATH_MAX_LEN];
	const char *slash = parent;
	Op			op;

	op_init(&op);
	for (;;)
	{
		slash = strchr(slash + 1, '/');
		if (slash)
		{
			memcpy(path, parent, slash - parent);
			path[slash - parent] = '\0';
		}
		else
			snprintf(path, sizeof(path), "%s", parent);
		op_reset(&op);
		check_send(zoo_acreate(zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0,
							   parent_create_done, &op), "create parent");
		pthread_mutex_lock(&op.mu);
		while (!op.done)
			pthread_cond_wait(&op.cv, &op.mu);
		pthread_mutex_unlock(&op.mu);
		if (op.rc != ZOK && op.rc != ZNODEEXISTS)
			die("create %s: %s", path, zerror(op.rc));
		if (!slash)
			break;
	}
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return (x > y) - (x < y);
}

/* Handoff: B's watcher sends get_children at once, from the completion thread. */
typedef struct Handoff
{
	Op			watch_reply;	/* B's get-data that sets the watch */
	Op			listed;			/* B's get_children after the watch fired */
	zhandle_t  *zh_b;
	int			fired_type;
} Handoff;

static void
handoff_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	Handoff    *h = (Handoff *) ctx;
	int			rc;

	if (type == ZOO_SESSION_EVENT)
		return;
	h->fired_type = type;
	rc = zoo_aget_children(zh, parent, 0, children_done, &h->listed);
	if (rc != ZOK)
		op_finish(&h->listed, rc);
}

/*
 * One repeat: returns per-cycle times in ms in times[] (for the loop
 * modes, each cycle's own duration) and the loop's wall time.
 */
static double
cpu_now_us(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec * 1e6 + ru.ru_utime.tv_usec +
		ru.ru_stime.tv_sec * 1e6 + ru.ru_stime.tv_usec;
}

static double
run_repeat(const char *mode, int n, int warmup, double *times, double *cpu_us)
{
	double		cpu_start = 0;
	Session		a,
				b;
	Op			create,
				list,
				del;
	Handoff		h;
	double		wall_start = 0,
				wall = 0;
	int			i;
	int			tries;
	int			handoff = strcmp(mode, "handoff") == 0;

	op_init(&create);
	op_init(&list);
	op_init(&del);
	session_open(&a);
	if (handoff)
	{
		session_open(&b);
		op_init(&h.watch_reply);
		op_init(&h.listed);
		h.zh_b = b.zh;
	}

	for (i = 0; i < warmup + n; i++)
	{
		double		t0 = now_ms();

		if (i == warmup)
		{
			wall_start = t0;
			cpu_start = cpu_now_us();
		}

		if (strcmp(mode, "awaited") == 0)
		{
			send_create(a.zh, &create);
			op_wait(&create, "create");
			send_delete(a.zh, create.path, &del);
			op_wait(&del, "delete");
		}
		else if (strcmp(mode, "listed") == 0)
		{
			send_create(a.zh, &create);
			op_wait(&create, "create");
			send_children(a.zh, &list);
			op_wait(&list, "get_children");
			send_delete(a.zh, create.path, &del);
			op_wait(&del, "delete");
		}
		else if (strcmp(mode, "recipe") == 0)
		{
			create_and_list(a.zh, &create, &list);
			send_delete(a.zh, create.path, &del);
			op_wait(&del, "delete");
		}
		else if (strcmp(mode, "pipelined") == 0)
		{
			create_and_list(a.zh, &create, &list);
			pthread_mutex_lock(&pending_mu);
			pending_deletes++;
			pthread_mutex_unlock(&pending_mu);
			check_send(zoo_adelete(a.zh, create.path, -1, pending_delete_done, NULL),
					   "delete");
		}
		else if (handoff)
		{
			send_create(a.zh, &create);
			op_wait(&create, "create");
			op_reset(&h.watch_reply);
			op_reset(&h.listed);
			h.fired_type = 0;
			/*
			 * B's server may not have applied A's create yet: then the
			 * get-data answers ZNONODE and sets no watch, so ask again
			 * (untimed).
			 */
			for (tries = 0;; tries++)
			{
				op_reset(&h.watch_reply);
				check_send(zoo_awget(b.zh, create.path, handoff_watcher, &h,
									 data_done, &h.watch_reply), "get-data watch");
				pthread_mutex_lock(&h.watch_reply.mu);
				while (!h.watch_reply.done)
					pthread_cond_wait(&h.watch_reply.cv, &h.watch_reply.mu);
				pthread_mutex_unlock(&h.watch_reply.mu);
				if (h.watch_reply.rc != ZNONODE || tries >= 1000)
					break;
				usleep(100);
			}
			if (h.watch_reply.rc != ZOK)
				die("get-data watch: %s", zerror(h.watch_reply.rc));
			t0 = now_ms();
			send_delete(a.zh, create.path, &del);
			op_wait(&h.listed, "get_children after watch");
			if (h.fired_type != ZOO_DELETED_EVENT)
				die("watch fired with event type %d, not deleted", h.fired_type);
			if (i >= warmup)
				times[i - warmup] = h.listed.done_ms - t0;
			op_wait(&del, "delete");
			continue;
		}
		else
			die("unknown mode %s", mode);

		if (i >= warmup)
			times[i - warmup] = now_ms() - t0;
	}
	if (strcmp(mode, "pipelined") == 0)
	{
		wall = now_ms() - wall_start;
		pending_drain();
	}
	else if (handoff)
	{
		wall = 0;
		for (i = 0; i < n; i++)
			wall += times[i];
	}
	else
		wall = now_ms() - wall_start;
	*cpu_us = cpu_now_us() - cpu_start;

	session_close(&a);
	if (handoff)
		session_close(&b);
	return wall;
}

/*
 * requeue-K: K contenders on one lock, driven entirely from the client
 * library's completion threads; rq_mu serializes them.
 */
typedef struct Contender
{
	Session		s;
	char		prefix[PATH_MAX_LEN];	/* PARENT/_c_<uuid>-lock- */
	char		own[PATH_MAX_LEN];		/* its node, "" while none */
	char		pred[PATH_MAX_LEN];		/* the node it watches */
	int			pred_was_head;	/* last listing: pred first in the queue */
	int			wake_fd;		/* woken-K: eventfd its taker sleeps on */
	pthread_t	taker;
} Contender;

static pthread_mutex_t rq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rq_cv = PTHREAD_COND_INITIALIZER;
static int	rq_stopping;
static int	rq_handoffs;		/* grants that followed a release */
static int	rq_warmup;
static int	rq_n;
static double rq_release_ms;	/* when the last holder sent its delete */
static double *rq_times;
static double rq_release_epoch; /* the same, in seconds since the epoch */
static double *rq_stamps;		/* per timed handoff: release, grant (epoch) */

static int	rq_woken;			/* woken-K: grants taken by a woken thread */
static long rq_burn_us;			/* ZKFLOOR_BURN_US: CPU a releaser spends */

/* Spend us microseconds of this thread's CPU time. */
static void
burn_cpu(long us)
{
	struct timespec start;
	struct timespec now;

	if (us <= 0)
		return;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
	do
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
	while ((now.tv_sec - start.tv_sec) * 1000000L +
		   (now.tv_nsec - start.tv_nsec) / 1000 < us);
}

static void rq_enqueue(Contender *c);
static void rq_list(Contender *c);

static void
make_prefix(char *buf, size_t size)
{
	snprintf(buf, size, "%s/_c_%08lx-%04lx-4%03lx-8%03lx-%012lx-lock-", parent,
			 random() & 0xffffffffL, random() & 0xffffL, random() & 0xfffL,
			 random() & 0xfffL, ((unsigned long) random() << 16) & 0xffffffffffffL);
}

/* The wall clock, as PostgreSQL's clock_timestamp() and a capture read it. */
static double
epoch_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * With ZKFLOOR_STAMPS set, requeue-K and woken-K write there each timed
 * handoff's release and grant, in seconds since the epoch ("r g" per line),
 * so that a packet capture can split it (bench/wire.py).
 */
static void
write_stamps(int n)
{
	const char *path = getenv("ZKFLOOR_STAMPS");
	FILE	   *f;
	int			i;

	if (path == NULL || path[0] == '\0')
		return;
	f = fopen(path, "w");
	if (f == NULL)
		die("%s: %s", path, strerror(errno));
	for (i = 0; i < n; i++)
		fprintf(f, "%.9f %.9f\n", rq_stamps[2 * i], rq_stamps[2 * i + 1]);
	if (fclose(f) != 0)
		die("%s: %s", path, strerror(errno));
}

static long
sequence_of(const char *name)
{
	size_t		len = strlen(name);

	return len < 10 ? -1 : atol(name + len - 10);
}

static void
rq_delete_done(int rc, const void *data)
{
	Contender  *c = (Contender *) data;

	burn_cpu(rq_burn_us);
	pthread_mutex_lock(&rq_mu);
	if (!rq_stopping)
	{
		if (rc != ZOK)
			die("requeue: delete: %s", zerror(rc));
		c->own[0] = '\0';
		rq_enqueue(c);
	}
	pthread_mutex_unlock(&rq_mu);
}

/* Called with rq_mu held. */
static void
rq_take(Contender *c)
{
	double		t = now_ms();

	if (rq_release_ms > 0)
	{
		if (rq_handoffs >= rq_warmup)
		{
			rq_times[rq_handoffs - rq_warmup] = t - rq_release_ms;
			rq_stamps[2 * (rq_handoffs - rq_warmup)] = rq_release_epoch;
			rq_stamps[2 * (rq_handoffs - rq_warmup) + 1] = epoch_s();
		}
		rq_handoffs++;
		if (rq_handoffs == rq_warmup + rq_n)
		{
			/* The last holder keeps its node: closing its session drops it. */
			rq_stopping = 1;
			pthread_cond_broadcast(&rq_cv);
			return;
		}
	}
	rq_release_epoch = epoch_s();
	rq_release_ms = now_ms();
	check_send(zoo_adelete(c->s.zh, c->own, -1, rq_delete_done, c), "delete");
}

/*
 * Called with rq_mu held.  In woken-K mode the grant is taken, as in a
 * zklock backend, by another thread that sleeps until the library's
 * thread wakes it.
 */
static void
rq_grant(Contender *c)
{
	uint64_t	one = 1;

	if (!rq_woken)
		rq_take(c);
	else if (write(c->wake_fd, &one, sizeof(one)) != sizeof(one))
		die("requeue: eventfd write: %s", strerror(errno));
}

static void *
rq_taker(void *arg)
{
	Contender  *c = (Contender *) arg;
	uint64_t	count;

	for (;;)
	{
		if (read(c->wake_fd, &count, sizeof(count)) != sizeof(count))
			die("requeue: eventfd read: %s", strerror(errno));
		pthread_mutex_lock(&rq_mu);
		if (rq_stopping)
		{
			pthread_mutex_unlock(&rq_mu);
			return NULL;
		}
		rq_take(c);
		pthread_mutex_unlock(&rq_mu);
	}
}

static void
rq_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	Contender  *c = (Contender *) ctx;

	if (type == ZOO_SESSION_EVENT)
		return;
	pthread_mutex_lock(&rq_mu);
	if (!rq_stopping)
	{
		if (type != ZOO_DELETED_EVENT)
			die("requeue: watch fired with event type %d, not deleted", type);
		if (c->pred_was_head)
			rq_grant(c);
		else
			rq_list(c);
	}
	pthread_mutex_unlock(&rq_mu);
}

static void
rq_watch_done(int rc, const char *value, int value_len, const struct Stat *stat,
			  const void *data)
{
	Contender  *c = (Contender *) data;

	pthread_mutex_lock(&rq_mu);
	if (!rq_stopping)
	{
		/* Gone before the watch was set: no notification will come. */
		if (rc == ZNONODE)
			rq_list(c);
		else if (rc != ZOK)
			die("requeue: get-data watch: %s", zerror(rc));
	}
	pthread_mutex_unlock(&rq_mu);
}

static void
rq_children_done(int rc, const struct String_vector *strings, const void *data)
{
	Contender  *c = (Contender *) data;
	const char *own_name;
	long		own_seq;
	long		pred_seq = -1;
	int			ahead = 0;
	int			i;

	pthread_mutex_lock(&rq_mu);
	if (rq_stopping)
	{
		pthread_mutex_unlock(&rq_mu);
		return;
	}
	if (rc != ZOK)
		die("requeue: get_children: %s", zerror(rc));
	own_name = strrchr(c->own, '/') + 1;
	own_seq = sequence_of(own_name);
	for (i = 0; i < strings->count; i++)
	{
		long		seq = sequence_of(strings->data[i]);

		if (seq < own_seq)
		{
			ahead++;
			if (seq > pred_seq)
			{
				pred_seq = seq;
				snprintf(c->pred, sizeof(c->pred), "%s/%s", parent, strings->data[i]);
			}
		}
	}
	if (ahead == 0)
		rq_grant(c);
	else
	{
		c->pred_was_head = (ahead == 1);
		check_send(zoo_awget(c->s.zh, c->pred, rq_watcher, c, rq_watch_done, c),
				   "get-data watch");
	}
	pthread_mutex_unlock(&rq_mu);
}

/* Called with rq_mu held. */
static void
rq_list(Contender *c)
{
	check_send(zoo_aget_children(c->s.zh, parent, 0, rq_children_done, c),
			   "get_children");
}

static void
rq_create_done(int rc, const char *value, const struct Stat *stat, const void *data)
{
	Contender  *c = (Contender *) data;

	pthread_mutex_lock(&rq_mu);
	if (!rq_stopping)
	{
		if (rc != ZOK || !value)
			die("requeue: create: %s", zerror(rc));
		snprintf(c->own, sizeof(c->own), "%s", value);
	}
	pthread_mutex_unlock(&rq_mu);
}

/* Called with rq_mu held: the listing is pipelined behind the create. */
static void
rq_enqueue(Contender *c)
{
	check_send(zoo_acreate2(c->s.zh, c->prefix, node_data, (int) strlen(node_data),
							&ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
							rq_create_done, c), "create");
	rq_list(c);
}

static double
run_requeue(int k, int n, int warmup, double *times, double *cpu_us)
{
	Contender  *cs = calloc(k, sizeof(Contender));
	struct timespec deadline;
	double		cpu_start,
				wall = 0;
	int			i;

	if (!cs)
		die("out of memory");
	rq_stopping = 0;
	for (i = 0; i < k; i++)
	{
		session_open(&cs[i].s);
		make_prefix(cs[i].prefix, sizeof(cs[i].prefix));
		if (rq_woken)
		{
			cs[i].wake_fd = eventfd(0, 0);
			if (cs[i].wake_fd < 0)
				die("eventfd: %s", strerror(errno));
			if (pthread_create(&cs[i].taker, NULL, rq_taker, &cs[i]) != 0)
				die("pthread_create failed");
		}
	}
	rq_handoffs = 0;
	rq_warmup = warmup;
	rq_n = n;
	rq_release_ms = 0;
	rq_times = times;
	rq_stamps = calloc(2 * n, sizeof(double));
	if (!rq_stamps)
		die("out of memory");
	cpu_start = cpu_now_us();
	deadline_after(&deadline, OP_WAIT_S + (n + warmup) / 10);
	pthread_mutex_lock(&rq_mu);
	for (i = 0; i < k; i++)
		rq_enqueue(&cs[i]);
	while (!rq_stopping)
	{
		if (pthread_cond_timedwait(&rq_cv, &rq_mu, &deadline) == ETIMEDOUT)
			die("requeue: only %d handoffs in time", rq_handoffs);
	}
	pthread_mutex_unlock(&rq_mu);
	*cpu_us = cpu_now_us() - cpu_start;
	for (i = 0; i < k && rq_woken; i++)
	{
		uint64_t	one = 1;

		if (write(cs[i].wake_fd, &one, sizeof(one)) != sizeof(one))
			die("eventfd write: %s", strerror(errno));
		pthread_join(cs[i].taker, NULL);
		close(cs[i].wake_fd);
	}
	for (i = 0; i < k; i++)
		session_close(&cs[i].s);
	free(cs);
	write_stamps(n);
	free(rq_stamps);
	for (i = 0; i < n; i++)
		wall += times[i];
	return wall;
}

/*
 * yield: a holder that lets go the moment someone asks, driven from the
 * completion threads like requeue-K, so that no wake-up of the main thread
 * is in the timed part.
 */
typedef struct Yield
{
	char		a_node[PATH_MAX_LEN];	/* A's node */
	char		b_prefix[PATH_MAX_LEN]; /* PARENT/_c_<uuid>-lock- of B */
	char		b_node[PATH_MAX_LEN];	/* B's node, "" until created */
	char		pred[PATH_MAX_LEN];		/* the node B watches */
	zhandle_t  *zh_b;
	Op			a_gone;			/* A's delete, answered */
	Op			granted;		/* B's grant; done_ms is its time */
} Yield;

static void
yd_a_deleted(int rc, const void *data)
{
	op_finish(&((Yield *) data)->a_gone, rc);
}

/* A's child watch: someone came, so A deletes its node at once. */
static void
yd_a_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	Yield	   *y = (Yield *) ctx;
	int			rc;

	if (type == ZOO_SESSION_EVENT)
		return;
	if (type != ZOO_CHILD_EVENT)
		die("yield: A's watch fired with event type %d, not children changed", type);
	rc = zoo_adelete(zh, y->a_node, -1, yd_a_deleted, y);
	if (rc != ZOK)
		op_finish(&y->a_gone, rc);
}

static void
yd_b_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	Yield	   *y = (Yield *) ctx;

	if (type == ZOO_SESSION_EVENT)
		return;
	if (type != ZOO_DELETED_EVENT)
		die("yield: B's watch fired with event type %d, not deleted", type);
	op_finish(&y->granted, ZOK);
}

static void yd_b_list(Yield *y);

static void
yd_b_watch_done(int rc, const char *value, int value_len, const struct Stat *stat,
				const void *data)
{
	Yield	   *y = (Yield *) data;

	/* Gone before the watch was set: no notification will come. */
	if (rc == ZNONODE)
		yd_b_list(y);
	else if (rc != ZOK)
		op_finish(&y->granted, rc);
}

static void
yd_b_created(int rc, const char *value, const struct Stat *stat, const void *data)
{
	Yield	   *y = (Yield *) data;

	if (rc != ZOK || !value)
		op_finish(&y->granted, rc != ZOK ? rc : ZSYSTEMERROR);
	else
		snprintf(y->b_node, sizeof(y->b_node), "%s", value);
}

/* B's listing: granted if nothing is ahead, else it watches its predecessor. */
static void
yd_b_listed(int rc, const struct String_vector *strings, const void *data)
{
	Yield	   *y = (Yield *) data;
	long		own_seq;
	long		pred_seq = -1;
	int			i;

	if (y->b_node[0] == '\0')
		return;					/* the create failed, and said so */
	if (rc != ZOK)
	{
		op_finish(&y->granted, rc);
		return;
	}
	own_seq = sequence_of(strrchr(y->b_node, '/') + 1);
	for (i = 0; i < strings->count; i++)
	{
		long		seq = sequence_of(strings->data[i]);

		if (seq < own_seq && seq > pred_seq)
		{
			pred_seq = seq;
			snprintf(y->pred, sizeof(y->pred), "%s/%s", parent, strings->data[i]);
		}
	}
	if (pred_seq < 0)
		op_finish(&y->granted, ZOK);
	else if ((rc = zoo_awget(y->zh_b, y->pred, yd_b_watcher, y, yd_b_watch_done, y)) != ZOK)
		op_finish(&y->granted, rc);
}

static void
yd_b_list(Yield *y)
{
	int			rc = zoo_aget_children(y->zh_b, parent, 0, yd_b_listed, y);

	if (rc != ZOK)
		op_finish(&y->granted, rc);
}

static double
run_yield(int n, int warmup, double *times, double *cpu_us)
{
	Session		a,
				b;
	Op			create,
				list,
				del;
	Yield		y;
	double		cpu_start = 0,
				wall = 0;
	int			i;

	memset(&y, 0, sizeof(y));
	op_init(&create);
	op_init(&list);
	op_init(&del);
	op_init(&y.a_gone);
	op_init(&y.granted);
	session_open(&a);
	session_open(&b);
	y.zh_b = b.zh;
	make_prefix(y.b_prefix, sizeof(y.b_prefix));
	for (i = 0; i < warmup + n; i++)
	{
		double		t0;

		if (i == warmup)
			cpu_start = cpu_now_us();
		/* A's node, then its watch: a change after the listing fires it. */
		send_create(a.zh, &create);
		op_wait(&create, "A's create");
		snprintf(y.a_node, sizeof(y.a_node), "%s", create.path);
		op_reset(&list);
		check_send(zoo_awget_children(a.zh, parent, yd_a_watcher, &y, children_done, &list),
				   "child watch");
		op_wait(&list, "A's child watch");

		op_reset(&y.a_gone);
		op_reset(&y.granted);
		y.b_node[0] = '\0';
		t0 = now_ms();
		check_send(zoo_acreate2(b.zh, y.b_prefix, node_data, (int) strlen(node_data),
								&ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
								yd_b_created, &y), "create");
		yd_b_list(&y);
		op_wait(&y.granted, "B's grant");
		if (i >= warmup)
			times[i - warmup] = y.granted.done_ms - t0;
		op_wait(&y.a_gone, "A's delete");
		send_delete(b.zh, y.b_node, &del);
		op_wait(&del, "B's delete");
	}
	*cpu_us = cpu_now_us() - cpu_start;
	session_close(&a);
	session_close(&b);
	for (i = 0; i < n; i++)
		wall += times[i];
	return wall;
}

static void
delete_parent(void)
{
	Session		s;
	Op			op;

	session_open(&s);
	op_init(&op);
	send_delete(s.zh, parent, &op);
	pthread_mutex_lock(&op.mu);
	while (!op.done)
		pthread_cond_wait(&op.cv, &op.mu);
	pthread_mutex_unlock(&op.mu);
	if (op.rc != ZOK && op.rc != ZNONODE)
		fprintf(stderr, "zkfloor: delete %s: %s\n", parent, zerror(op.rc));
	session_close(&s);
}

int
main(int argc, char **argv)
{
	const char *mode;
	const char *burn;
	int			n,
				reps,
				warmup,
				contenders = 0,
				r;
	double	   *times;
	Session		setup;
	char		host[256];

	if (argc != 7)
	{
		fprintf(stderr, "usage: zkfloor HOSTS awaited|listed|recipe|pipelined|handoff|yield|requeue-K|woken-K N R WARMUP PARENT\n");
		return 2;
	}
	hosts = argv[1];
	mode = argv[2];
	n = atoi(argv[3]);
	reps = atoi(argv[4]);
	warmup = atoi(argv[5]);
	parent = argv[6];
	if (n < 1 || reps < 1 || warmup < 0 || parent[0] != '/')
		die("bad arguments");
	if ((burn = getenv("ZKFLOOR_BURN_US")) != NULL)
		rq_burn_us = atol(burn);
	if (strncmp(mode, "requeue-", 8) == 0 || strncmp(mode, "woken-", 6) == 0)
	{
		rq_woken = mode[0] == 'w';
		contenders = atoi(strchr(mode, '-') + 1);
		if (contenders < 2)
			die("%s: K must be at least 2", mode);
	}
	else if (strcmp(mode, "awaited") && strcmp(mode, "listed") &&
			 strcmp(mode, "recipe") && strcmp(mode, "pipelined") &&
			 strcmp(mode, "handoff") && strcmp(mode, "yield"))
		die("unknown mode %s", mode);

	zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
	srandom((unsigned) getpid() ^ (unsigned) time(NULL));

	/* zklock-like node name and data */
	make_prefix(prefix, sizeof(prefix));
	if (gethostname(host, sizeof(host)) != 0)
		snprintf(host, sizeof(host), "localhost");
	snprintf(node_data, sizeof(node_data),
			 "{\"host\":\"%s\",\"port\":5432,\"pid\":%d,\"database\":\"postgres\","
			 "\"user\":\"postgres\",\"application_name\":\"zkfloor\"}",
			 host, (int) getpid());

	session_open(&setup);
	create_ancestors(setup.zh);
	session_close(&setup);

	times = calloc(n, sizeof(double));
	if (!times)
		die("out of memory");
	for (r = 1; r <= reps; r++)
	{
		double		cpu_us;
		double		wall = contenders ?
			run_requeue(contenders, n, warmup, times, &cpu_us) :
			strcmp(mode, "yield") == 0 ?
			run_yield(n, warmup, times, &cpu_us) :
			run_repeat(mode, n, warmup, times, &cpu_us);
		double		p50;

		qsort(times, n, sizeof(double), cmp_double);
		p50 = (n % 2) ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
		printf("FLOOR mode=%s rep=%d n=%d mean_ms=%.4f p50_ms=%.4f min_ms=%.4f max_ms=%.4f cpu_us=%.1f\n",
			   mode, r, n, wall / n, p50, times[0], times[n - 1], cpu_us / n);
		fflush(stdout);
	}
	free(times);
	delete_parent();
	return 0;
}
