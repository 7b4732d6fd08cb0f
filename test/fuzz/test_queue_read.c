/*
 * Unit tests for the queue reader (zk_queue_read.c), built from the
 * extension's own source with the session and the few PostgreSQL calls it
 * makes stubbed out: a listing is a reply made up from a table of nodes,
 * every request the reader sends is answered from that table and counted,
 * and every request and every allocation must be given back by
 * zkqr_release.  The reader's Asserts are compiled in, so a broken promise
 * of a caller fails here too.
 *
 * Covered: contenders of every client kind among children that are not
 * contenders, ties, wrapped and malformed sequence numbers, a backend
 * holding both modes, the recipe's own node and strays, failed and vanished
 * reads, deadlines and watches, semaphores, zkqr_find, and empty or
 * all-malformed listings.
 */
#include "postgres.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "recipe/zk_queue_read.h"

/* The C library's printing: PostgreSQL's own port of it is not linked in. */
#undef printf
#undef fprintf
#undef snprintf
#undef vsnprintf

static int	failures = 0;

#define CHECK(cond, what) \
	do { \
		if (!(cond)) \
		{ \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, what); \
			failures++; \
		} \
	} while (0)

/*
 * PostgreSQL's memory and errors.  The reader raises only for running out
 * of memory, which these stubs never do, so any error fails the test.
 */
static long allocations = 0;

static void *
counted(void *p)
{
	if (p == NULL)
		abort();
	allocations++;
	return p;
}

void *
palloc(Size size)
{
	return counted(malloc(size));
}

void *
palloc0(Size size)
{
	return counted(calloc(1, size));
}

void
pfree(void *pointer)
{
	allocations--;
	free(pointer);
}

char *
psprintf(const char *fmt,...)
{
	va_list		args;
	char	   *s;
	int			len;

	va_start(args, fmt);
	len = vsnprintf(NULL, 0, fmt, args);
	va_end(args);
	s = counted(malloc(len + 1));
	va_start(args, fmt);
	vsnprintf(s, len + 1, fmt, args);
	va_end(args);
	return s;
}

bool
errstart(int elevel, const char *domain)
{
	fprintf(stderr, "FAIL: the reader raised an error (level %d)\n", elevel);
	abort();
}

bool
errstart_cold(int elevel, const char *domain)
{
	return errstart(elevel, domain);
}

int
errcode(int sqlerrcode)
{
	return 0;
}

int
errmsg(const char *fmt,...)
{
	return 0;
}

void
errfinish(const char *filename, int lineno, const char *funcname)
{
	abort();
}

#if PG_VERSION_NUM >= 160000
void
ExceptionalCondition(const char *conditionName, const char *fileName,
					 int lineNumber)
#else
void
ExceptionalCondition(const char *conditionName, const char *errorType,
					 const char *fileName, int lineNumber)
#endif
{
	fprintf(stderr, "FAIL: Assert(%s) at %s:%d\n", conditionName, fileName,
			lineNumber);
	abort();
}

/*
 * The session: one parent, whose children are the nodes of a table.  A
 * node's read is answered with its rc (ZOK, ZNONODE for a node gone since
 * the listing, or any other failure) and, if ZOK, its czxid, and its name
 * as data.  Every reply comes at once, unless the deadline or the watch
 * set for the test comes first.
 */
#define PARENT "/zklock/locks/n"

typedef struct Node
{
	char		name[128];
	int64		czxid;
	int			rc;
	bool		deleting;		/* this session is deleting it */
	int			reads;			/* how often the reader read it */
} Node;

static Node nodes[16];
static int	nnodes;
static int	list_rc;			/* the listing's answer */
static int64 creates;			/* the parent's count of creates */
static int	replies_left;		/* replies before the deadline; -1: all */
static int	fire_after;			/* replies after which the watch fires */
static uint64 generation;
static int	sent;
static int	released;
static char strays[4][128];		/* what the janitor was given */
static int	nstrays;

/*
 * Serve a listing of "name czxid [gone|failed|deleting]" lines, in listing
 * order.  The parent's count of creates is one past the largest sequence
 * number, as while its counter is far from going round, and at least the
 * number of children.
 */
static void
serve(const char *const *lines)
{
	nnodes = 0;
	list_rc = ZOK;
	creates = 0;
	replies_left = -1;
	fire_after = -1;
	for (; *lines; lines++)
	{
		Node	   *node;
		long long	czxid;
		char		state[16] = "";
		ZknContender c;

		if (nnodes == lengthof(nodes))
			abort();
		node = &nodes[nnodes++];
		if (sscanf(*lines, "%127s %lld %15s", node->name, &czxid, state) < 2)
			abort();
		node->czxid = czxid;
		node->rc = strcmp(state, "gone") == 0 ? ZNONODE :
			strcmp(state, "failed") == 0 ? ZCONNECTIONLOSS : ZOK;
		node->deleting = strcmp(state, "deleting") == 0;
		node->reads = 0;
		if ((zkn_parse_contender(node->name, &c) == ZKN_SEQUENCED ||
			 zkn_parse_slot(node->name, &c) == ZKN_SEQUENCED) &&
			c.sequence >= creates)
			creates = (int64) c.sequence + 1;
	}
	/* Every child was created once at least. */
	creates = Max(creates, nnodes);
}

static Node *
node_named(const char *name)
{
	int			i;

	for (i = 0; i < nnodes; i++)
		if (strcmp(nodes[i].name, name) == 0)
			return &nodes[i];
	return NULL;
}

/* A request sent, counted; it keeps the path asked, for the checks. */
static ZkRequest *
request(const char *path)
{
	ZkRequest  *req = calloc(1, sizeof(ZkRequest));

	if (req == NULL || (req->path = strdup(path)) == NULL)
		abort();
	sent++;
	return req;
}

ZkRequest *
zks_get_children(const char *path)
{
	ZkRequest  *req = request(path);
	int			i;

	CHECK(strcmp(path, PARENT) == 0, "the listing is of the parent asked");
	req->rc = list_rc;
	if (list_rc != ZOK)
		return req;
	req->nchildren = nnodes;
	req->children = calloc(Max(nnodes, 1), sizeof(char *));
	for (i = 0; i < nnodes; i++)
		req->children[i] = nodes[i].name;
	/* As the server shows it: cversion = 2 * creates - numChildren. */
	req->stat.cversion = (int32) (uint32) (2 * creates - nnodes);
	req->stat.numChildren = nnodes;
	return req;
}

static ZkRequest *
read_node(const char *path, bool data)
{
	ZkRequest  *req = request(path);
	Node	   *node = NULL;

	if (strncmp(path, PARENT "/", strlen(PARENT) + 1) == 0)
		node = node_named(path + strlen(PARENT) + 1);
	if (node == NULL)
	{
		CHECK(false, "a read of a node that was never listed");
		req->rc = ZNONODE;
		return req;
	}
	node->reads++;
	req->rc = node->rc;
	if (req->rc == ZOK)
	{
		req->stat.czxid = node->czxid;
		if (data)
		{
			req->data = strdup(node->name);
			req->datalen = strlen(node->name);
		}
	}
	return req;
}

ZkRequest *
zks_exists(const char *path)
{
	return read_node(path, false);
}

ZkRequest *
zks_get_data(const char *path)
{
	return read_node(path, true);
}

bool
zks_await(ZkRequest *req, TimestampTz deadline)
{
	if (replies_left == 0)
		return false;
	if (replies_left > 0)
		replies_left--;
	if (fire_after >= 0 && fire_after-- == 0)
		generation++;
	req->done = true;
	return true;
}

uint64
zks_watch_generation(void)
{
	return generation;
}

void
zks_release_request(ZkRequest *req)
{
	if (req == NULL)
		return;
	released++;
	free(req->path);
	free(req->children);
	free(req->data);
	free(req);
}

bool
zks_deleting(const char *parent, const char *child)
{
	Node	   *node = node_named(child);

	CHECK(strcmp(parent, PARENT) == 0, "asked about the parent read");
	return node != NULL && node->deleting;
}

bool
zks_delete_later(const char *path)
{
	if (nstrays == lengthof(strays))
		abort();
	snprintf(strays[nstrays++], sizeof(strays[0]), "%s", path);
	return true;
}

/*
 * The queue as read must be consistent: each contender's read is its own,
 * own and zkqr_find agree with the names.  Then release it, and the
 * listing the caller kept (NULL: none), and check that everything sent and
 * allocated was given back.
 */
static void
finish(ZkqrQueue *q, ZkRequest *list, const char *what)
{
	ZkqrQueue	zero = {0};
	char		why[256];
	int			i;

	snprintf(why, sizeof(why), "%s: each read is its contender's", what);
	for (i = 0; q->reads && i < q->n; i++)
		CHECK(i == q->own ? q->reads[i] == NULL :
			  q->reads[i] != NULL &&
			  strcmp(q->reads[i]->path + strlen(PARENT) + 1,
					 q->entries[i].name) == 0, why);
	snprintf(why, sizeof(why), "%s: zkqr_find finds every contender", what);
	for (i = 0; i < q->n; i++)
		CHECK(zkqr_find(q, q->entries[i].name) == i, why);
	zkqr_release(q);
	zks_release_request(list);
	snprintf(why, sizeof(why), "%s: released and zeroed", what);
	CHECK(memcmp(q, &zero, sizeof(zero)) == 0, why);
	snprintf(why, sizeof(why), "%s: every request released (%d sent, %d released)",
			 what, sent, released);
	CHECK(sent == released, why);
	snprintf(why, sizeof(why), "%s: every allocation freed (%ld left)",
			 what, allocations);
	CHECK(allocations == 0, why);
	sent = released = 0;
	allocations = 0;
	nstrays = 0;
}

/* Read the queue anew with these options. */
static ZkqrStatus
read_queue(ZkqrQueue *q, const ZkqrOptions *options)
{
	memset(q, 0, sizeof(ZkqrQueue));
	return zkqr_read_queue(q, PARENT, options);
}

/* A view's options: data read, ordered (zk_observe.c). */
static ZkqrOptions
view_options(void)
{
	ZkqrOptions options = {0};

	options.reads = ZKQR_DATA;
	options.order = true;
	return options;
}

/* Only the order: read nothing the sequence numbers make needless. */
static ZkqrOptions
order_options(void)
{
	ZkqrOptions options = {0};

	options.reads = ZKQR_STAT_IF_UNORDERED;
	options.order = true;
	return options;
}

static int
index_of(const ZkqrQueue *q, const char *prefix)
{
	int			i;

	for (i = 0; i < q->n; i++)
		if (strncmp(q->entries[i].name, prefix, strlen(prefix)) == 0)
			return i;
	return -1;
}

/*
 * Is q, ordered, the contenders whose names begin with want[], in this
 * order, each holding where holds[] says 'h' and waiting where 'w'?
 */
static void
expect_queue(const ZkqrQueue *q, const char *const *want, const char *holds,
			 const char *what)
{
	int			k;
	bool		ok = q->order != NULL && q->n == (int) strlen(holds);

	for (k = 0; ok && k < q->n; k++)
	{
		const char *name = q->entries[q->order[k]].name;

		ok = strncmp(name, want[k], strlen(want[k])) == 0 &&
			q->holds[q->order[k]] == (holds[k] == 'h');
	}
	if (!ok)
	{
		fprintf(stderr, "FAIL %s: the queue reads", what);
		for (k = 0; q->order && k < q->n; k++)
			fprintf(stderr, " %s%s", q->entries[q->order[k]].name,
					q->holds[q->order[k]] ? "(h)" : "");
		fprintf(stderr, "\n");
		failures++;
	}
}

/* Reads sent to the nodes, in all. */
static int
reads_sent(void)
{
	int			n = 0;
	int			i;

	for (i = 0; i < nnodes; i++)
		n += nodes[i].reads;
	return n;
}

/*
 * Names as each client makes them, before the marker: zklock's (a uuid),
 * Curator's (a shorter one; its mutex's marker is zklock's "-lock-", its
 * read-write lock's "__READ__" and "__WRIT__"), kazoo's (hex, then
 * "__lock__" or "__rlock__").
 */
#define ZK "_c_0f0e0d0c-0b0a-4909-8807-060504030201-"
#define CUR "_c_aa-"
#define KZ "0123456789abcdef0123456789abcdef"

/*
 * Nodes of one holder share the first 23 characters of their uuid; each
 * attempt differs in the rest.
 */
#define A1_GUID "aaaaaaaa-aaaa-4aaa-8aaa-000000000001"
#define A2_GUID "aaaaaaaa-aaaa-4aaa-8aaa-000000000002"
#define A1 "_c_" A1_GUID "-"
#define A2 "_c_" A2_GUID "-"
#define B1 "_c_bbbbbbbb-bbbb-4bbb-8bbb-000000000001-"

static void
test_clients(void)
{
	ZkqrQueue	q;
	ZkqrOptions options = order_options();

	/* Every client's markers, among children that are not contenders. */
	serve((const char *const[]) {
		KZ "__lock__0000000002 20", "leases 1",
		ZK "read-lock-0000000004 40", CUR "lock-0000000001 10",
		CUR "__READ__0000000003 30", "locks-0000000007 70",
		KZ "__rlock__0000000005 50", CUR "__WRIT__0000000006 60",
		"garbage 2", NULL});
	CHECK(read_queue(&q, &options) == ZKQR_DONE, "clients: read");
	CHECK(q.n == 6, "clients: the six contenders, the rest left out");
	CHECK(index_of(&q, KZ "__lock__") == 0 && index_of(&q, ZK) == 1 &&
		  index_of(&q, CUR "lock-") == 2 && index_of(&q, CUR "__READ__") == 3 &&
		  index_of(&q, KZ "__rlock__") == 4 && index_of(&q, CUR "__WRIT__") == 5,
		  "clients: entries in listing order");
	CHECK(!q.by_czxid && reads_sent() == 0,
		  "clients: numbers order the queue, so nothing is read");
	CHECK(q.own == -1, "clients: no own node without an attempt");
	expect_queue(&q, (const char *const[]) {
		CUR "lock-", KZ "__lock__", CUR "__READ__", ZK, KZ "__rlock__",
		CUR "__WRIT__"}, "hwwwww", "clients: in sequence order");
	CHECK(zkqr_find(&q, "leases") == -1 && zkqr_find(&q, "garbage") == -1 &&
		  zkqr_find(&q, "locks-0000000007") == -1,
		  "clients: zkqr_find: children that are not contenders are not there");
	CHECK(zkqr_find(&q, CUR "__READ__000000000") == -1 &&
		  zkqr_find(&q, CUR "__READ__00000000033") == -1,
		  "clients: zkqr_find takes the whole name, not a prefix");
	CHECK(zkqr_find(&q, "_c_bb-lock-0000000009") == -1,
		  "clients: zkqr_find: a node not listed is not there");
	finish(&q, NULL, "clients");

	/* The readers at the head share it. */
	serve((const char *const[]) {
		ZK "read-lock-0000000004 40", KZ "__rlock__0000000002 20",
		CUR "__READ__0000000003 30", CUR "lock-0000000005 50", NULL});
	read_queue(&q, &options);
	expect_queue(&q, (const char *const[]) {
		KZ "__rlock__", CUR "__READ__", ZK, CUR "lock-"}, "hhhw",
		"readers of every client share");
	finish(&q, NULL, "readers");

	/*
	 * A view reads every contender's data; one gone since the listing is
	 * left out, and zkqr_find no longer finds it.
	 */
	serve((const char *const[]) {
		KZ "__lock__0000000002 20", ZK "read-lock-0000000004 40 gone",
		CUR "lock-0000000001 10", CUR "__READ__0000000003 30 gone",
		KZ "__rlock__0000000005 50", NULL});
	options = view_options();
	CHECK(read_queue(&q, &options) == ZKQR_DONE, "view: read");
	CHECK(q.by_czxid && reads_sent() == 5, "view: every contender read");
	CHECK(q.n == 3, "view: the gone left out");
	expect_queue(&q, (const char *const[]) {
		CUR "lock-", KZ "__lock__", KZ "__rlock__"}, "hww", "view: by czxid");
	CHECK(zkqr_find(&q, ZK "read-lock-0000000004") == -1,
		  "view: zkqr_find: a node gone since the listing is not there");
	CHECK(zkqr_find(&q, CUR "__READ__0000000003") == -1,
		  "view: zkqr_find: nor is another gone");
	CHECK(zkqr_find(&q, KZ "__rlock__0000000005") == 2 &&
		  q.reads[2]->stat.czxid == 50 && q.entries[2].czxid == 50,
		  "view: zkqr_find: moved up past the left out, with its own read");
	finish(&q, NULL, "view");

	/* Any other failed read leaves the queue unknown: the first is named. */
	serve((const char *const[]) {
		KZ "__lock__0000000002 20", ZK "read-lock-0000000004 40 gone",
		CUR "lock-0000000001 10 failed", CUR "__READ__0000000003 30 failed",
		NULL});
	CHECK(read_queue(&q, &options) == ZKQR_FAILED &&
		  q.failed_rc == ZCONNECTIONLOSS &&
		  strcmp(q.failed_name, CUR "lock-0000000001") == 0 && q.order == NULL,
		  "a failed read: the first one named, the queue not ordered");
	finish(&q, NULL, "failed read");
}

static void
test_numbers(void)
{
	ZkqrQueue	q;
	ZkqrOptions options = order_options();

	/*
	 * Ties: the server handed out 2147483647 twice.  h was created first;
	 * n, listed first, must wait for it.
	 */
	serve((const char *const[]) {
		"n-lock-2147483647 200", "h-lock-2147483647 100", NULL});
	creates = 2147483647;
	read_queue(&q, &options);
	CHECK(q.by_czxid && reads_sent() == 2, "tie: czxids read");
	CHECK(q.entries[zkqr_find(&q, "h-lock-2147483647")].czxid == 100,
		  "tie: each czxid its node's");
	expect_queue(&q, (const char *const[]) {"h-", "n-"}, "hw",
				 "tie: by creation");
	finish(&q, NULL, "tie");

	/* Wrapped numbers stand after the ones before the wrap. */
	serve((const char *const[]) {
		"w-lock--2147483648 300", "h-lock-2147483646 100",
		"t-read-lock-2147483647 200", "v-read-lock--000000001 400", NULL});
	creates = 2147483647;
	read_queue(&q, &options);
	CHECK(q.by_czxid && reads_sent() == 4, "wrapped: czxids read");
	expect_queue(&q, (const char *const[]) {"h-", "t-", "w-", "v-"}, "hwww",
				 "wrapped: by creation");
	finish(&q, NULL, "wrapped");

	/* The counter went all the way round: small numbers out of order. */
	serve((const char *const[]) {
		"h-lock-0000000005 100", "t-lock-0000000003 200", NULL});
	creates = 2147483647;
	read_queue(&q, &options);
	CHECK(q.by_czxid, "full turn: czxids read");
	expect_queue(&q, (const char *const[]) {"h-", "t-"}, "hw",
				 "full turn: by creation");
	finish(&q, NULL, "full turn");

	/* A malformed number stands ahead of everyone, exclusive. */
	serve((const char *const[]) {
		"a-lock-0000000001 1", "x-read-lock-junk 5",
		"b-read-lock-0000000002 2", NULL});
	read_queue(&q, &options);
	CHECK(!q.by_czxid && reads_sent() == 0, "malformed: nothing read");
	expect_queue(&q, (const char *const[]) {"x-", "a-", "b-"}, "hww",
				 "malformed: ahead of all");
	CHECK(zkqr_find(&q, "x-read-lock-junk") == 1, "malformed: found");
	finish(&q, NULL, "malformed");
}

static void
test_empty(void)
{
	ZkqrQueue	q;
	ZkqrOptions options = view_options();

	serve((const char *const[]) {NULL});
	CHECK(read_queue(&q, &options) == ZKQR_DONE && q.n == 0 &&
		  q.order != NULL && reads_sent() == 0, "empty listing: no one");
	CHECK(zkqr_find(&q, "a-lock-0000000001") == -1, "empty listing: find");
	finish(&q, NULL, "empty listing");

	list_rc = ZNONODE;
	CHECK(read_queue(&q, &options) == ZKQR_DONE && q.n == 0 &&
		  q.entries == NULL && q.order == NULL && q.holds == NULL,
		  "a parent gone: no one, nothing ordered");
	CHECK(zkqr_find(&q, "a-lock-0000000001") == -1, "a parent gone: find");
	finish(&q, NULL, "parent gone");

	serve((const char *const[]) {NULL});
	list_rc = ZNOAUTH;
	CHECK(read_queue(&q, &options) == ZKQR_FAILED && q.failed_rc == ZNOAUTH &&
		  q.failed_name == NULL, "a failed listing: the listing named");
	finish(&q, NULL, "failed listing");

	serve((const char *const[]) {
		"leases 1", "0000000001 2", "x-lock 3", NULL});
	CHECK(read_queue(&q, &options) == ZKQR_DONE && q.n == 0 &&
		  reads_sent() == 0, "no contender among the children");
	finish(&q, NULL, "no contender");

	/* Only malformed contenders: all ahead, among themselves by name. */
	serve((const char *const[]) {
		"x-lock-abc 1", "m-lock-00000000001 2", "a-read-lock- 3", NULL});
	options = order_options();
	CHECK(read_queue(&q, &options) == ZKQR_DONE && q.n == 3 && !q.by_czxid,
		  "all malformed: all contenders, nothing read");
	expect_queue(&q, (const char *const[]) {"a-", "m-", "x-"}, "hww",
				 "all malformed: by name, the first holds");
	finish(&q, NULL, "all malformed");
}

/*
 * The recipe: its own node is found by name during the parse, never read,
 * and given the czxid it was created with; another node of its attempt is
 * a stray, handed to the janitor; nodes it is deleting are left out.
 */
static void
test_recipe(void)
{
	ZkqrQueue	q = {0};
	ZkqrOptions options = {0};
	ZkRequest  *list;

	/*
	 * A backend holding A1 exclusive asks for shared (A2), with B1 queued
	 * in between; a reply of an earlier create of A2 was lost, so the
	 * server made a second node for it; C, and an older stray, are being
	 * deleted by us.
	 */
	serve((const char *const[]) {
		B1 "lock-0000000002 2", A2 "read-lock-0000000003 3",
		A1 "lock-0000000001 1", A2 "read-lock-0000000004 4",
		"_c_cc-lock-0000000005 5 deleting",
		A2 "read-lock-0000000006 6 deleting", NULL});
	options.reads = ZKQR_STAT;
	options.attempt = A2_GUID;
	options.shared = true;
	options.own = A2 "read-lock-0000000004";
	options.own_czxid = 44;
	options.skip_deleting = true;
	list = zks_get_children(PARENT);
	zkqr_parse(&q, PARENT, list, &options);
	CHECK(q.n == 3 && q.own == index_of(&q, A2 "read-lock-0000000004"),
		  "recipe: own found, the stray and the deleted left out");
	CHECK(nstrays == 1 &&
		  strcmp(strays[0], PARENT "/" A2 "read-lock-0000000003") == 0,
		  "recipe: the stray handed to the janitor, once");
	CHECK(zkqr_read_contenders(&q, &options) == ZKQR_DONE &&
		  node_named(A2 "read-lock-0000000004")->reads == 0 &&
		  reads_sent() == 2 && q.entries[q.own].czxid == 44,
		  "recipe: own never read, its czxid as created");
	finish(&q, list, "recipe");

	/* A node ahead of own gone since the listing: own moves up with it. */
	serve((const char *const[]) {
		B1 "lock-0000000002 2 gone", A1 "lock-0000000001 1",
		A2 "read-lock-0000000004 4", NULL});
	list = zks_get_children(PARENT);
	zkqr_parse(&q, PARENT, list, &options);
	CHECK(q.own == 2, "recipe: own at its listing place");
	CHECK(zkqr_read_contenders(&q, &options) == ZKQR_DONE && q.n == 2 &&
		  q.own == 1 && strcmp(q.entries[q.own].name, A2 "read-lock-0000000004") == 0,
		  "recipe: own follows its entry when one before it is gone");
	finish(&q, list, "recipe, gone");

	/* Own not listed: the caller reports its node gone. */
	serve((const char *const[]) {B1 "lock-0000000002 2", NULL});
	list = zks_get_children(PARENT);
	zkqr_parse(&q, PARENT, list, &options);
	CHECK(q.own == -1 && q.n == 1, "recipe: own not listed");
	finish(&q, list, "recipe, not listed");
}

/* A backend holding both modes, as the views show it. */
static void
test_both_modes(void)
{
	ZkqrQueue	q;
	ZkqrOptions options = view_options();
	int			own;
	int			blockers[4];

	serve((const char *const[]) {
		B1 "lock-0000000002 2", A2 "read-lock-0000000003 3",
		A1 "lock-0000000001 1", NULL});
	read_queue(&q, &options);
	expect_queue(&q, (const char *const[]) {A1, A2, B1}, "hhw",
				 "both modes: the later node at the first's place");

	/* As zk_blockers: B waits for both of the backend's nodes. */
	own = zkqr_find(&q, B1 "lock-0000000002");
	CHECK(own == 0 && zkq_blockers(q.entries, q.n, own, true, blockers) == 2 &&
		  blockers[0] == zkqr_find(&q, A2 "read-lock-0000000003") &&
		  blockers[1] == zkqr_find(&q, A1 "lock-0000000001"),
		  "both modes: the waiter found, blocked by both nodes");
	finish(&q, NULL, "both modes");
}

static void
test_semaphore(void)
{
	ZkqrQueue	q;
	ZkqrOptions options = view_options();

	options.semaphore = true;
	serve((const char *const[]) {
		ZK "sem2-0000000003 3", A1 "sem2-0000000001 1",
		A1 "lock-0000000004 4", B1 "sem2-0000000002 2",
		"_c_short-sem2-0000000005 5", NULL});
	CHECK(read_queue(&q, &options) == ZKQR_DONE && q.n == 3,
		  "semaphore: slots only");
	expect_queue(&q, (const char *const[]) {A1, B1, ZK}, "hhw",
				 "semaphore: two slots held");
	CHECK(zkqr_find(&q, A1 "lock-0000000004") == -1,
		  "semaphore: a lock's node is no slot");
	finish(&q, NULL, "semaphore");
}

/* The deadline, or a watch that fires, cuts the reads short. */
static void
test_unfinished(void)
{
	ZkqrQueue	q;
	ZkqrOptions options = view_options();
	static const char *const lines[] = {
		"a-lock-0000000001 1", "b-lock-0000000002 2", "c-lock-0000000003 3",
		NULL};

	serve(lines);
	replies_left = 0;
	CHECK(read_queue(&q, &options) == ZKQR_UNFINISHED,
		  "deadline before the listing");
	finish(&q, NULL, "deadline, listing");

	serve(lines);
	replies_left = 2;
	CHECK(read_queue(&q, &options) == ZKQR_UNFINISHED && q.order == NULL,
		  "deadline among the reads");
	finish(&q, NULL, "deadline, reads");

	serve(lines);
	fire_after = 1;
	options.stop_on_watch = true;
	options.generation = generation;
	CHECK(read_queue(&q, &options) == ZKQR_UNFINISHED,
		  "a watch that fires stops the read");
	finish(&q, NULL, "watch");
}

int
main(void)
{
	test_clients();
	test_numbers();
	test_empty();
	test_recipe();
	test_both_modes();
	test_semaphore();
	test_unfinished();
	if (failures)
	{
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("zk_queue_read unit tests passed\n");
	return 0;
}
