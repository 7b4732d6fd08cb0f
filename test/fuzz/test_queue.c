/*
 * Unit tests for the contender parser (zk_names.c) and the queue rules
 * (zk_queue.c): markers of every client, wrapped and malformed sequence
 * numbers, ties, and a backend holding both modes of a name.
 *
 * Each listing is written as lines "name czxid"; an entry's czxid is its
 * creation order, which the rules may use only when they ask for it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/zk_queue.h"

static int	failures = 0;

#define CHECK(cond, what) \
	do { \
		if (!(cond)) \
		{ \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, what); \
			failures++; \
		} \
	} while (0)

#define ZK "_c_0f0e0d0c-0b0a-4909-8807-0605040302"

static void
test_parse(void)
{
	static const struct
	{
		const char *child;
		ZknForm		form;
		bool		shared;
		int32_t		sequence;
	}			cases[] =
	{
		{ZK "01-lock-0000000007", ZKN_SEQUENCED, false, 7},
		{ZK "01-read-lock-0000000007", ZKN_SEQUENCED, true, 7},
		{ZK "01-lock-2147483647", ZKN_SEQUENCED, false, 2147483647},
		{ZK "01-lock--2147483648", ZKN_WRAPPED, false, -2147483647 - 1},
		{ZK "01-read-lock--000000001", ZKN_WRAPPED, true, -1},
		{ZK "01-lock-2147483648", ZKN_MALFORMED, false, 0},
		{ZK "01-lock-00000000001", ZKN_MALFORMED, false, 0},
		{ZK "01-read-lock-abc", ZKN_MALFORMED, false, 0},
		{"x-lock-", ZKN_MALFORMED, false, 0},
		{"0123456789abcdef0123456789abcdef__lock__0000000003", ZKN_SEQUENCED, false, 3},
		{"0123456789abcdef0123456789abcdef__rlock__0000000003", ZKN_SEQUENCED, true, 3},
		{"_c_aa-__READ__0000000004", ZKN_SEQUENCED, true, 4},
		{"_c_aa-__WRIT__0000000004", ZKN_SEQUENCED, false, 4},
		{"x-lock-0000000001-lock-0000000002", ZKN_SEQUENCED, false, 2},
		{"garbage", ZKN_NOT_CONTENDER, false, 0},
		{"0000000001", ZKN_NOT_CONTENDER, false, 0},
		{"", ZKN_NOT_CONTENDER, false, 0},
	};
	size_t		i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		ZknContender c;
		ZknForm		form = zkn_parse_contender(cases[i].child, &c);
		char		what[256];

		snprintf(what, sizeof(what), "parse %s", cases[i].child);
		CHECK(form == cases[i].form && c.form == form, what);
		CHECK(c.shared == cases[i].shared, what);
		if (form == ZKN_SEQUENCED || form == ZKN_WRAPPED)
			CHECK(c.sequence == cases[i].sequence, what);
	}
}

/*
 * A listing from a string of "name czxid" lines, in listing order, and how
 * many creates its parent saw (zkq_parent_creates): by default one past the
 * largest sequence number, as while the counter is far from going round.
 */
typedef struct Listing
{
	ZkqEntry	entries[16];
	char		names[16][128];
	int			n;
	int64_t		creates;
} Listing;

static void
make_listing(Listing *l, const char *const *lines)
{
	l->n = 0;
	for (; *lines; lines++)
	{
		ZkqEntry   *e = &l->entries[l->n];
		long long	czxid;

		if (sscanf(*lines, "%127s %lld", l->names[l->n], &czxid) != 2)
			abort();
		e->name = l->names[l->n];
		e->czxid = czxid;
		if (zkn_parse_contender(e->name, &e->contender) == ZKN_NOT_CONTENDER)
			abort();
		l->n++;
	}
	l->creates = 0;
	for (int i = 0; i < l->n; i++)
		if (l->entries[i].contender.form == ZKN_SEQUENCED &&
			l->entries[i].contender.sequence >= l->creates)
			l->creates = (int64_t) l->entries[i].contender.sequence + 1;
}

static int
find(const Listing *l, const char *prefix)
{
	int			i;

	for (i = 0; i < l->n; i++)
		if (strncmp(l->names[i], prefix, strlen(prefix)) == 0)
			return i;
	abort();
}

/* What happens to the node whose name starts with own: whom it waits for. */
static const char *
verdict(const Listing *l, const char *own)
{
	int			watch = -1;

	switch (zkq_decide(l->entries, l->n, find(l, own),
					   zkq_needs_czxid(l->entries, l->n, l->creates), &watch))
	{
		case ZKQ_HOLDS:
			return "holds";
		case ZKQ_REQUEUE:
			return "requeue";
		case ZKQ_WAIT:
			return l->names[watch];
		case ZKQ_NO_MEMORY:
			break;
	}
	abort();
}

static void
expect(const Listing *l, const char *own, const char *want, const char *what)
{
	const char *got = verdict(l, own);

	if (strncmp(got, want, strlen(want)) != 0)
	{
		fprintf(stderr, "FAIL %s: %s -> %s, expected %s\n", what, own, got, want);
		failures++;
	}
}

static int
holders(const Listing *l)
{
	int			order[16];
	bool		holds[16];
	int			n = 0;
	int			i;

	if (!zkq_describe(l->entries, l->n, zkq_needs_czxid(l->entries, l->n, l->creates),
					  order, holds))
		abort();
	for (i = 0; i < l->n; i++)
		n += holds[i];
	return n;
}

/*
 * Nodes of one holder share the first 23 characters of their uuid; each
 * attempt differs in the rest.
 */
#define A1 "_c_aaaaaaaa-aaaa-4aaa-8aaa-000000000001-"
#define A2 "_c_aaaaaaaa-aaaa-4aaa-8aaa-000000000002-"
#define B1 "_c_bbbbbbbb-bbbb-4bbb-8bbb-000000000001-"
#define B2 "_c_bbbbbbbb-bbbb-4bbb-8bbb-000000000002-"
#define S1 "_c_cccccccc-cccc-4ccc-8ccc-000000000001-"
#define T1 "_c_dddddddd-dddd-4ddd-8ddd-000000000001-"
#define W1 "_c_eeeeeeee-eeee-4eee-8eee-000000000001-"

static void
test_queue(void)
{
	Listing		l;

	/* Plain FIFO: exclusive waits for its predecessor, readers share. */
	make_listing(&l, (const char *const[]) {
		"a-lock-0000000002 3", "b-read-lock-0000000003 4",
		"c-read-lock-0000000004 5", "d-lock-0000000005 6",
		"e-read-lock-0000000006 7", NULL});
	expect(&l, "a", "holds", "first writer");
	expect(&l, "b", "a", "reader behind a writer");
	expect(&l, "c", "a", "reader waits for the nearest writer");
	expect(&l, "d", "c", "writer waits for its predecessor");
	expect(&l, "e", "d", "reader behind the second writer");
	CHECK(holders(&l) == 1, "one writer holds");

	/* Whether the watched node's going alone grants the waiter. */
	CHECK(zkq_holds_without(l.entries, l.n, find(&l, "d"), find(&l, "c"),
							false) == false,
		  "a writer behind three: its predecessor's going does not decide");
	make_listing(&l, (const char *const[]) {
		"a-lock-0000000002 3", "d-lock-0000000005 6", NULL});
	CHECK(zkq_holds_without(l.entries, l.n, find(&l, "d"), find(&l, "a"),
							false),
		  "second in the queue: the head's going grants it");
	make_listing(&l, (const char *const[]) {
		"a-read-lock-0000000002 3", "b-read-lock-0000000003 4",
		"d-lock-0000000005 6", NULL});
	CHECK(!zkq_holds_without(l.entries, l.n, find(&l, "d"), find(&l, "b"),
							 false),
		  "behind two readers: one reader's going does not decide");

	/* Listing order is not queue order. */
	make_listing(&l, (const char *const[]) {
		"z-read-lock-0000000009 9", "y-read-lock-0000000001 1", NULL});
	expect(&l, "z", "holds", "readers share");
	CHECK(holders(&l) == 2, "two readers hold");

	/*
	 * A backend holding x at A1, with B queued behind it, asks for shared:
	 * its second node stands at its first's place and holds at once; B is
	 * not let in beside it.
	 */
	make_listing(&l, (const char *const[]) {
		A1 "lock-0000000001 1", B1 "lock-0000000002 2",
		A2 "read-lock-0000000003 3", NULL});
	expect(&l, A2, "holds", "shared under own exclusive");
	expect(&l, B1, A1, "the writer in between still waits");

	/* Holding shared at A1, asking for exclusive past a writer B. */
	make_listing(&l, (const char *const[]) {
		A1 "read-lock-0000000001 1", B1 "lock-0000000002 2",
		S1 "read-lock-0000000003 3", A2 "lock-0000000004 4", NULL});
	expect(&l, A2, "holds", "upgrade skips the clients queued behind its first node");
	expect(&l, B1, A1, "the writer in between waits");
	expect(&l, S1, B1, "a reader behind it watches the writer, not the upgrade");

	/*
	 * ... and when the writer gives up, the reader behind it does not slip
	 * in beside the upgrade; it only waits for an upgrade made after it,
	 * which cannot tell it from a holder, so it queues again.
	 */
	make_listing(&l, (const char *const[]) {
		A1 "read-lock-0000000001 1", S1 "read-lock-0000000003 3",
		A2 "lock-0000000004 4", NULL});
	expect(&l, S1, "requeue", "a reader left behind an upgrade queues again");
	expect(&l, A2, S1, "the upgrade waits for that reader meanwhile");

	/* Queued again, the reader waits for the upgrade like for any writer. */
	make_listing(&l, (const char *const[]) {
		A1 "read-lock-0000000001 1", A2 "lock-0000000004 4",
		S1 "read-lock-0000000005 5", NULL});
	expect(&l, S1, A2, "a reader created after the upgrade waits for it");
	expect(&l, A2, "holds", "and the upgrade holds");
	CHECK(holders(&l) == 2, "only the upgraded backend's nodes hold");

	/* An upgrade waits for a third reader that holds the lock now. */
	make_listing(&l, (const char *const[]) {
		A1 "read-lock-0000000001 1", T1 "read-lock-0000000002 2",
		B1 "lock-0000000003 3", A2 "lock-0000000004 4", NULL});
	expect(&l, A2, T1, "upgrade waits for a holding reader");
	CHECK(holders(&l) == 2, "the two readers hold, the upgrade waits");

	/* ... and for readers ahead of its first node. */
	make_listing(&l, (const char *const[]) {
		T1 "read-lock-0000000001 1", A1 "read-lock-0000000002 2",
		A2 "lock-0000000004 4", NULL});
	expect(&l, A2, T1, "upgrade waits for an earlier reader");

	/*
	 * Two backends upgrade and wait for each other, as advisory locks do; a
	 * reader behind a writer that gave up, with both upgrades made after
	 * it, queues again rather than watch either of them.
	 */
	make_listing(&l, (const char *const[]) {
		A1 "read-lock-0000000001 1", B1 "read-lock-0000000002 2",
		S1 "read-lock-0000000004 4", B2 "lock-0000000005 5",
		A2 "lock-0000000006 6", NULL});
	expect(&l, A2, B1, "two upgrades: A waits for B's shared hold");
	expect(&l, B2, A1, "and B for A's");
	expect(&l, S1, "requeue", "a reader behind both queues again");

	/* A reader also behind a plain writer watches the writer. */
	make_listing(&l, (const char *const[]) {
		A1 "read-lock-0000000001 1", W1 "lock-0000000002 2",
		S1 "read-lock-0000000004 4", A2 "lock-0000000006 6", NULL});
	expect(&l, S1, W1, "a reader behind a writer and an upgrade watches the writer");

	/*
	 * Ties: the server handed out 2147483647 twice.  h was granted first;
	 * n's name sorts first, yet it must wait for h.
	 */
	make_listing(&l, (const char *const[]) {
		"h-lock-2147483647 100", "n-lock-2147483647 200", NULL});
	l.creates = 2147483647;
	CHECK(zkq_needs_czxid(l.entries, l.n, l.creates), "a tie needs czxids");
	expect(&l, "n", "h", "a tied newcomer waits for the holder");
	expect(&l, "h", "holds", "the tied holder holds");
	CHECK(holders(&l) == 1, "exactly one of two tied writers holds");

	/* Wrapped sequences come after the ones before the wrap. */
	make_listing(&l, (const char *const[]) {
		"w-lock--2147483648 300", "h-lock-2147483646 100",
		"t-lock-2147483647 200", NULL});
	expect(&l, "w", "t", "a wrapped node waits in creation order");
	expect(&l, "h", "holds", "the first before the wrap holds");
	CHECK(holders(&l) == 1, "one holder across the wrap");

	/*
	 * The counter went all the way round: h took 5 long ago, t took 3
	 * after 2^32 creates.  The server's count of creates stays at 2^31 - 1
	 * once it gets there, so the listing says the numbers cannot be
	 * trusted, and t waits for h.
	 */
	make_listing(&l, (const char *const[]) {
		"h-lock-0000000005 100", "t-lock-0000000003 200", NULL});
	l.creates = 2147483647;
	CHECK(zkq_needs_czxid(l.entries, l.n, l.creates),
		  "a counter that may have gone round needs czxids");
	expect(&l, "t", "h", "a newcomer after the counter went round waits");
	expect(&l, "h", "holds", "the old holder keeps holding");
	CHECK(holders(&l) == 1, "one holder across the full turn");
	l.creates = ZKQ_TRUSTED_CREATES + 1;
	CHECK(zkq_needs_czxid(l.entries, l.n, l.creates),
		  "a child version past the bound needs czxids");
	l.creates = 4;
	CHECK(zkq_needs_czxid(l.entries, l.n, l.creates),
		  "a number at or above the child version needs czxids");
	l.creates = -1;
	CHECK(zkq_needs_czxid(l.entries, l.n, l.creates),
		  "an unknown child version needs czxids");

	/* The count of creates, from the cversion that counts deletes too. */
	CHECK(zkq_parent_creates(10, 0) == 5, "5 creates and 5 deletes");
	CHECK(zkq_parent_creates(7, 3) == 5, "5 creates, 3 children left");
	CHECK(zkq_parent_creates(-3, 1) == 2147483647,
		  "a cversion that overflowed: 2^31 - 1 creates, 1 child left");

	/* Far from the bound, sequence numbers alone order the queue. */
	make_listing(&l, (const char *const[]) {
		"h-lock-0000000005 100", "t-lock-0000000007 200", NULL});
	CHECK(!zkq_needs_czxid(l.entries, l.n, l.creates),
		  "a young counter's numbers are trusted");
	l.creates = ZKQ_TRUSTED_CREATES;
	CHECK(!zkq_needs_czxid(l.entries, l.n, l.creates),
		  "up to the bound itself");

	/* An unplaceable contender stands ahead of everyone, exclusive. */
	make_listing(&l, (const char *const[]) {
		"a-lock-0000000001 1", "x-read-lock-junk 5",
		"b-read-lock-0000000002 2", NULL});
	expect(&l, "a", "x", "a malformed node blocks the first");
	expect(&l, "b", "a", "and a reader waits for the writer");
	CHECK(holders(&l) == 1, "the malformed node is the one holder");

	/* Mixed clients: Curator, kazoo and zklock nodes in one queue. */
	make_listing(&l, (const char *const[]) {
		"0123456789abcdef0123456789abcdef__lock__0000000002 2",
		"_c_aa-lock-0000000001 1",
		ZK "01-read-lock-0000000003 3", NULL});
	expect(&l, ZK "01", "0123", "zklock reader behind kazoo");
	expect(&l, "0123", "_c_aa", "kazoo behind Curator");
}

/*
 * An exhaustive check of the rules over time.  Two-node clients take a
 * name in one mode and, once granted, the other; one-node clients queue
 * with one node of either mode, before, between and after those.  At every
 * step one event happens: the next node is created, a one-node client's
 * node goes (a waiter giving up, a holder releasing), or a two-node client
 * gives up its second node's wait or ends one of its holds, keeping its
 * first node while its second hold lasts (zk_holds.c).  A node evaluates
 * the listing when it is created and again only when the node it watches
 * goes, as a ZooKeeper watch fires, or, when its last evaluation said the
 * watched node's going alone decides (zkq_holds_without, as zk_recipe.c
 * uses it), holds as it goes, without evaluating; one the rules let
 * through holds until it goes, one that must queue again is created anew
 * at the end.
 *
 * Checked in every state: no two clients hold in conflicting modes, and no
 * waits form a cycle through a one-node client (two-node clients that both
 * upgrade wait for each other, as advisory locks do: that alone is not
 * counted).  A two-node client's first node waits, while its second does,
 * for the second.  Every case runs four times: with sequence numbers far
 * from the counter's turn, with numbers that cross into the negatives or
 * through zero again, and with small numbers out of creation order, as
 * after the counter went all the way round between creates; each time
 * with the count of creates the server would report.  Not modelled: reads
 * that lag the latest state, requeues as two separate steps, peers' own
 * rules.
 */
#define MC_MAX		6
#define MC_FIRED	6			/* the node it watched went */
#define MC_NONE		7

typedef struct McNode
{
	int			client;
	bool		shared;
	int			rank;			/* creation order; 0 until created */
	bool		gone;
	bool		holds;
	bool		kept;			/* its hold ended, the node kept in place */
	bool		deletion_decides;	/* its watched node's going grants it */
	int			watch;			/* the node it waits for, or MC_NONE */
	int			attempt;		/* how often it queued */
} McNode;

typedef struct McCase
{
	McNode		nodes[MC_MAX];
	int			n;
	int			first[2];		/* two-node clients' nodes, -1 if none */
	int			second[2];
} McCase;

#define MC_SLOTS	(1 << 20)
static uint64_t mc_keys[MC_SLOTS];
static unsigned mc_epochs[MC_SLOTS];
static unsigned mc_epoch = 0;
static long mc_states = 0;
static int	mc_violations = 0;

/*
 * Sequence numbers: creation rank + mc_offset as a signed 32-bit counter,
 * or with mc_scrambled small positive numbers out of creation order, as
 * when the counter went all the way round between creates.
 */
static uint32_t mc_offset = 0;
static bool mc_scrambled = false;
static int64_t mc_creates = 0;

static int32_t
mc_sequence(int rank)
{
	static const int32_t scrambled[] = {0, 5, 3, 9, 1, 7, 2, 8, 4, 6};

	if (mc_scrambled && rank >= 0 && rank < 10)
		return scrambled[rank];
	return (int32_t) ((uint32_t) rank + mc_offset);
}

static bool
mc_live(const McNode *node)
{
	return node->rank > 0 && !node->gone;
}

/* Ranks as creation order 1..k among live nodes, so equal states meet. */
static void
mc_normalize(McCase *c)
{
	int			rank[MC_MAX];
	int			i,
				j;

	for (i = 0; i < c->n; i++)
	{
		rank[i] = c->nodes[i].rank;
		if (!mc_live(&c->nodes[i]))
			continue;
		rank[i] = 1;
		for (j = 0; j < c->n; j++)
			if (mc_live(&c->nodes[j]) && c->nodes[j].rank < c->nodes[i].rank)
				rank[i]++;
	}
	for (i = 0; i < c->n; i++)
		c->nodes[i].rank = c->nodes[i].gone ? -1 : rank[i];
}

static bool
mc_visit(const McCase *c)
{
	uint64_t	key = 0;
	unsigned	slot;
	int			i;

	for (i = 0; i < c->n; i++)
		key = key << 10 | (uint64_t) ((c->nodes[i].rank + 1) << 7 |
									  c->nodes[i].deletion_decides << 6 |
									  c->nodes[i].watch << 3 |
									  c->nodes[i].holds << 2 |
									  c->nodes[i].kept << 1 | c->nodes[i].gone);
	slot = (unsigned) ((key * 0x9E3779B97F4A7C15ull) >> 44);
	for (;; slot = (slot + 1) & (MC_SLOTS - 1))
	{
		if (mc_epochs[slot] != mc_epoch)
		{
			mc_epochs[slot] = mc_epoch;
			mc_keys[slot] = key;
			return true;
		}
		if (mc_keys[slot] == key)
			return false;
	}
}

/*
 * The live nodes as a listing; index[] maps listing positions to nodes.
 * A two-node client's nodes share the holder part of their uuid.
 */
static int
mc_listing(const McCase *c, ZkqEntry *entries, char names[][96], int *index)
{
	int			m = 0;
	int			i;

	for (i = 0; i < c->n; i++)
	{
		const McNode *node = &c->nodes[i];

		if (!mc_live(node))
			continue;
		snprintf(names[m], 96,
				 "_c_%08x-0000-4000-8000-%06x%06x-%slock-%010d",
				 node->client, i, node->attempt,
				 node->shared ? "read-" : "", mc_sequence(node->rank));
		entries[m].name = names[m];
		entries[m].czxid = node->rank;
		zkn_parse_contender(names[m], &entries[m].contender);
		index[m++] = i;
	}
	return m;
}

static void mc_print(const McCase *c);

static void
mc_fail(const McCase *c, const char *what)
{
	if (mc_violations++ < 3)
	{
		fprintf(stderr, "FAIL model: %s\n", what);
		mc_print(c);
	}
	failures++;
}

/* Evaluate node i on the current listing. */
static void
mc_evaluate_node(McCase *c, int i)
{
	ZkqEntry	entries[MC_MAX];
	char		names[MC_MAX][96];
	int			index[MC_MAX];
	int			m = mc_listing(c, entries, names, index);
	int			own = -1;
	int			watch = -1;
	bool		by_czxid;
	int			k;

	for (k = 0; k < m; k++)
		if (index[k] == i)
			own = k;
	by_czxid = zkq_needs_czxid(entries, m, mc_creates);
	c->nodes[i].deletion_decides = false;
	switch (zkq_decide(entries, m, own, by_czxid, &watch))
	{
		case ZKQ_HOLDS:
			c->nodes[i].holds = true;
			c->nodes[i].watch = MC_NONE;
			break;
		case ZKQ_WAIT:
			c->nodes[i].watch = index[watch];
			/* As zk_recipe.c: exclusive, and no other node of its own. */
			c->nodes[i].deletion_decides = !c->nodes[i].shared &&
				i != c->second[0] && i != c->second[1] &&
				zkq_holds_without(entries, m, own, watch, by_czxid);
			break;
		case ZKQ_REQUEUE:
			/* Its old node goes, which fires the watches on it. */
			for (k = 0; k < c->n; k++)
				if (c->nodes[k].watch == i && !c->nodes[k].holds)
					c->nodes[k].watch = MC_FIRED;
			c->nodes[i].rank = 100 + ++c->nodes[i].attempt;
			mc_normalize(c);
			mc_evaluate_node(c, i);
			break;
		case ZKQ_NO_MEMORY:
			abort();
	}
}

/* Fire the watches of the nodes that went. */
static void
mc_wake(McCase *c)
{
	bool		again = true;

	while (again)
	{
		int			i;

		again = false;
		for (i = 0; i < c->n; i++)
		{
			McNode	   *node = &c->nodes[i];

			if (mc_live(node) && !node->holds && node->watch != MC_NONE &&
				(node->watch == MC_FIRED || !mc_live(&c->nodes[node->watch])))
			{
				/* Granted by the deletion alone, without a listing. */
				if (node->deletion_decides)
				{
					node->holds = true;
					node->watch = MC_NONE;
				}
				else
					mc_evaluate_node(c, i);
				again = true;
			}
		}
	}
}

static bool
mc_holding(const McNode *node)
{
	return mc_live(node) && node->holds && !node->kept;
}

static bool
mc_two_node(const McCase *c, int client)
{
	return c->first[0] >= 0 && c->nodes[c->first[0]].client == client;
}

static void
mc_check(const McCase *c)
{
	int			waits_for[MC_MAX];
	int			i,
				j;

	for (i = 0; i < c->n; i++)
		for (j = i + 1; j < c->n; j++)
		{
			const McNode *a = &c->nodes[i];
			const McNode *b = &c->nodes[j];

			if (mc_holding(a) && mc_holding(b) && a->client != b->client &&
				(!a->shared || !b->shared))
				mc_fail(c, "two clients hold in conflicting modes");
		}

	for (i = 0; i < c->n; i++)
	{
		const McNode *node = &c->nodes[i];

		waits_for[i] = -1;
		if (!mc_live(node))
			continue;
		if (!node->holds)
			waits_for[i] = node->watch;
		for (j = 0; j < 2; j++)
			if (c->first[j] == i && mc_live(&c->nodes[c->second[j]]) &&
				!c->nodes[c->second[j]].holds)
				waits_for[i] = c->second[j];
	}
	for (i = 0; i < c->n; i++)
	{
		int			at = i;
		int			steps;
		bool		one_node = false;

		for (steps = 0; steps <= c->n && at >= 0 && at < MC_MAX; steps++)
			at = waits_for[at];
		if (at < 0 || at >= MC_MAX)
			continue;
		/* at is on a cycle: does it pass a one-node client? */
		for (steps = 0; steps <= c->n; steps++, at = waits_for[at])
			one_node |= !mc_two_node(c, c->nodes[at].client) &&
				!(c->first[1] >= 0 && c->nodes[c->first[1]].client == c->nodes[at].client);
		if (one_node)
		{
			mc_fail(c, "waits form a cycle through a one-node client");
			return;
		}
	}
}

static void mc_explore(McCase c);

static void
mc_then(McCase c, int gone1, int gone2, int kept)
{
	if (gone1 >= 0)
		c.nodes[gone1].gone = true;
	if (gone2 >= 0)
		c.nodes[gone2].gone = true;
	if (kept >= 0)
		c.nodes[kept].kept = true;
	mc_normalize(&c);
	mc_wake(&c);
	mc_explore(c);
}

static void
mc_explore(McCase c)
{
	int			next = -1;
	int			i,
				b;

	if (!mc_visit(&c))
		return;
	mc_states++;
	mc_check(&c);
	if (mc_violations)
		return;

	for (i = 0; i < c.n && next < 0; i++)
		if (c.nodes[i].rank == 0)
			next = i;
	if (next >= 0)
	{
		bool		allowed = true;

		/* A second node comes only while its client holds the first. */
		for (b = 0; b < 2; b++)
			if (next == c.second[b])
				allowed = mc_holding(&c.nodes[c.first[b]]);
		if (allowed)
		{
			McCase		d = c;

			d.nodes[next].rank = 100;
			mc_normalize(&d);
			mc_evaluate_node(&d, next);
			mc_wake(&d);
			mc_explore(d);
		}
	}

	for (i = 0; i < c.n; i++)
	{
		bool		one_node = true;

		for (b = 0; b < 2; b++)
			one_node &= i != c.first[b] && i != c.second[b];
		if (one_node && mc_live(&c.nodes[i]))
			mc_then(c, i, -1, -1);
	}

	for (b = 0; b < 2; b++)
	{
		McNode	   *first;
		McNode	   *second;

		if (c.first[b] < 0)
			continue;
		first = &c.nodes[c.first[b]];
		second = &c.nodes[c.second[b]];
		if (!mc_live(second) && mc_live(first))
			mc_then(c, c.first[b], -1, -1);
		else if (mc_live(second) && !second->holds)
			mc_then(c, c.second[b], -1, -1);
		else if (mc_live(second))
		{
			mc_then(c, c.second[b], first->kept ? c.first[b] : -1, -1);
			if (!first->kept)
				mc_then(c, -1, -1, c.first[b]);
		}
	}
}

static void
mc_print(const McCase *c)
{
	int			i;

	for (i = 0; i < c->n; i++)
		fprintf(stderr, "  node %d: client %d %s rank %d%s%s%s watch %d\n", i,
				c->nodes[i].client, c->nodes[i].shared ? "shared" : "exclusive",
				c->nodes[i].rank, c->nodes[i].gone ? " gone" : "",
				c->nodes[i].holds ? " holds" : "",
				c->nodes[i].kept ? " kept" : "", c->nodes[i].watch);
}

/*
 * Every arrangement of `twos` two-node clients (their first node at
 * positions chosen among the creation order, each second node after its
 * first) and the rest one-node clients, with every choice of modes.
 */
static void
mc_cases(int twos, int n)
{
	int			slots[4];
	int			layout;
	int			nlayouts = 1;
	int			i;

	for (i = 0; i < 2 * twos; i++)
		nlayouts *= n;
	for (layout = 0; layout < nlayouts; layout++)
	{
		int			modes;
		int			x = layout;
		bool		ok = true;

		for (i = 0; i < 2 * twos; i++, x /= n)
			slots[i] = x % n;
		for (i = 0; i < 2 * twos && ok; i++)
		{
			int			j;

			for (j = 0; j < i; j++)
				ok &= slots[i] != slots[j];
		}
		for (i = 0; i < twos && ok; i++)
			ok &= slots[2 * i] < slots[2 * i + 1];
		if (!ok || (twos == 2 && slots[0] > slots[2]))
			continue;
		for (modes = 0; modes < (1 << n); modes++)
		{
			McCase		c;
			int			k = 10;

			memset(&c, 0, sizeof(c));
			c.n = n;
			c.first[0] = c.first[1] = c.second[0] = c.second[1] = -1;
			for (i = 0; i < n; i++)
			{
				McNode	   *node = &c.nodes[i];
				int			b;

				node->watch = MC_NONE;
				node->shared = (modes >> i) & 1;
				node->client = ++k;
				for (b = 0; b < twos; b++)
				{
					if (i == slots[2 * b])
					{
						node->client = b;
						c.first[b] = i;
					}
					if (i == slots[2 * b + 1])
					{
						node->client = b;
						c.second[b] = i;
					}
				}
			}
			/* A second node asks for the other mode than its first. */
			for (i = 0; i < twos; i++)
				if (c.nodes[c.first[i]].shared == c.nodes[c.second[i]].shared)
					ok = false;
			if (!ok)
			{
				ok = true;
				continue;
			}
			mc_epoch++;
			mc_explore(c);
		}
	}
}

static void
test_model(void)
{
	static const struct
	{
		uint32_t	offset;
		bool		scrambled;
		int64_t		creates;
	}			turns[] =
	{
		{0, false, 1 << 20},	/* far from the turn: numbers trusted */
		{2147483647u - 3, false, 2147483647},	/* into the negatives */
		{4294967295u - 3, false, 2147483647},	/* through zero again */
		{0, true, 2147483647},	/* all the way round, out of order */
	};
	size_t		t;
	int			n;

	for (t = 0; t < sizeof(turns) / sizeof(turns[0]); t++)
	{
		mc_offset = turns[t].offset;
		mc_scrambled = turns[t].scrambled;
		mc_creates = turns[t].creates;
		for (n = 2; n <= MC_MAX; n++)
			mc_cases(1, n);
		for (n = 4; n <= MC_MAX; n++)
			mc_cases(2, n);
	}
	printf("model: %ld states explored\n", mc_states);
}

int
main(void)
{
	test_parse();
	test_queue();
	test_model();
	if (failures)
	{
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("zk_names and zk_queue unit tests passed\n");
	return 0;
}
