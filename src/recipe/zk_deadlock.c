/*-------------------------------------------------------------------------
 *
 * zk_deadlock.c
 *	  Deadlock detection between zklock waiters of every cluster that
 *	  shares a ZooKeeper ensemble.
 *
 * A backend that has waited zklock.deadlock_timeout publishes its wait:
 * an ephemeral node "<root>/%waits/<session id>" holding the lock parent
 * it waits on, its waiting node and its identity (zk_layout.h); the node
 * goes with the session.  It then follows the wait-for graph: the
 * contenders its node waits for by the queue rules (zk_queue.c), their
 * owners (each node's ephemeralOwner is its session), what those sessions
 * have published, and so on.
 *
 * The victim.  Of a cycle, the member whose published node is youngest
 * (largest czxid, so the last to publish) is the victim, the same for
 * every member.  So a checker only follows sessions that published before
 * it did: it finds a cycle only if it is the youngest member, and then it
 * is the victim.  It always finds one it is the youngest of: every edge
 * u -> v of the graph stands by the time both u and v have published (it
 * appears when u's node is made, or v's upgrade node; both come before
 * their owner's publishing), so the last member to publish sees every
 * other member's wait in place, and ZooKeeper shows a session its own
 * create, and so every earlier write, in every later read.  One check per
 * published wait is therefore enough, as long as it finishes: a check that
 * could not (no answer in time, our own watch fired meanwhile, or a cycle
 * seen but not confirmed) is done again later (zk_recipe.c).  A
 * node that holds, or that the queue rules are about to queue again
 * (zk_queue.c), is in no stable wait and is left out: a waiter that queues
 * again publishes its new wait anew.
 *
 * Confirmation.  The reads of one check are not one snapshot, so a cycle
 * seen once may be made of edges that never stood at the same time.  The
 * victim reads the cycle again: every member's published node (same
 * czxid, so the same wait), its waiting node and the node it waits for.
 * One session's reads see ZooKeeper's state in order, so if each of those
 * nodes stood at both reads, they all stood at once between the two; and a
 * real cycle stays until one of its members gives up.  Only then does the
 * victim's wait end with "deadlock detected".  A search follows the whole
 * graph and tries every cycle back to us that it saw; if none holds when
 * read again (a member gave up meanwhile), the graph is searched afresh, a
 * few times, since another cycle may stand behind the broken one.
 *
 * Trust.  Only a published node that its own session made (ephemeralOwner
 * matches its name), that was never rewritten (version 0), that names a
 * lock parent under our root and a plain contender node, and whose
 * contender node its session owns, is followed; anything else is not a
 * member.  A publisher whose reply was lost adopts the node it made rather
 * than make a younger one, so every member agrees on its age.
 *
 * What a member does not tell: one that gives up its wait while cut off
 * from ZooKeeper (its session still alive) leaves its waiting node and its
 * published wait until it reconnects or its session expires; until then a
 * cycle through it stands in ZooKeeper, and its victim gets "deadlock
 * detected" although that member no longer waits.
 *
 * What cannot be seen: clients other than zklock (Curator, kazoo) publish
 * nothing, so a cycle through one of them is not found; and a backend with
 * detection off (zklock.deadlock_timeout = 0) does not publish either.
 *
 * Cost.  Every request made here is awaited with the checker's deadline; a
 * check that runs out of time has found nothing, and is done again later,
 * ever less often and with ever more time (zk_recipe.c).  Each queue is
 * read once per pass (zk_queue_read.c), however many members wait in it:
 * its listing and a stat per contender, kept with their requests (a few
 * hundred bytes each) until the next pass or the confirmation of a cycle
 * starts, or the check ends.  Each session that owns a blocking node has
 * its published wait read once per check, whether it turns out a member
 * or not, and is then found in a hash table.  So a pass costs one listing
 * per queue in the graph, one read per contender of those queues and one
 * per session that owns a blocker: linear in what it reads.  Confirming a
 * cycle reads each of its members' published waits and queues again.  A
 * graph of more than ZKD_MAX_MEMBERS waiting sessions is not followed
 * further: the check stops once a member's blockers would take it past
 * that size (the queues read up to then are read in full), and the caller
 * logs it once and checks again ever less often.  Each check's requests
 * and time are logged at DEBUG1.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/hsearch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "base/zk_text.h"
#include "recipe/zk_deadlock.h"
#include "recipe/zk_queue.h"
#include "recipe/zk_queue_read.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"

/* Set in zkd_define_settings, with its default. */
int			zklock_deadlock_timeout;

/*
 * For the fault tests only (zk_test_support.c): a pause between finding a
 * cycle and reading it again (see search()), a lower ZKD_MAX_MEMBERS, and
 * a shorter time for a check than zklock.connect_timeout (0: that one).
 */
int			zkd_test_confirm_delay_ms = 0;
int			zkd_test_max_members = ZKD_MAX_MEMBERS;
int			zkd_test_check_ms = 0;

/* How many times one check searches afresh after a cycle did not hold. */
#define MAX_SEARCHES		3

void
zkd_define_settings(void)
{
	DefineCustomIntVariable("zklock.deadlock_timeout",
							"Sets the time to wait for a zklock before checking for a deadlock.",
							"0 turns detection off: the waits of this backend are then not published, and cycles through it are not found.",
							&zklock_deadlock_timeout,
							1000, 0, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/*
 * A session that owns a blocking node, whose published wait the check has
 * read (or is reading), kept for the whole check: a wait published before
 * ours stays as it was while the check runs, and one published after ours
 * is not followed anyway (see the header comment).
 */
typedef enum OwnerWait
{
	OWNER_READING,				/* its read is in flight */
	OWNER_WAITS,				/* it published a wait before us: wait */
	OWNER_NOT_FOLLOWED			/* no wait, a younger one, or not trusted */
} OwnerWait;

typedef struct Owner
{
	int64		session;		/* hash key */
	OwnerWait	state;
	int64		published_czxid;	/* OWNER_WAITS: its wait's */
	ZknWait		wait;
	int			pass;			/* the pass in which it joined the graph */
} Owner;

/* One waiting session of the wait-for graph. */
typedef struct Member
{
	int64		session;
	int64		published_czxid;
	ZknWait		wait;
	int			waited_for_by;	/* the member waiting for this one; -1: us */
	char		blocking_node[ZKN_WAIT_NODE_MAX];	/* ours it waits for */
} Member;

/* A contender that a waiting node waits for, and whose session owns it. */
typedef struct Blocker
{
	const char *node;			/* in its queue's listing: valid until the
								 * queues are forgotten */
	int64		owner;
} Blocker;

typedef enum Reading
{
	READ_OK,
	READ_NOT_WAITING,			/* the node is gone, or not in a stable wait */
	READ_FAILED					/* no answer in time, or the wait moved on */
} Reading;

/* A cycle back to us seen by a search: the member that waits for us. */
typedef struct Closing
{
	int			member;
	char		node[ZKN_WAIT_NODE_MAX];	/* ours it waits for */
} Closing;

typedef struct Search
{
	const char *root;
	const char *waits_dir;
	TimestampTz deadline;
	uint64		generation;		/* our watch's; when it moves, stop */
	Member	   *members;
	int			nmembers;
	int			pass;			/* the search under way, from 1 */
	HTAB	   *owners;			/* Owner, by session: ours and every one read */
	Closing    *closings;		/* cycles back to us seen in this pass */
	int			nclosings;
	int			closing;		/* the one confirmed: index into closings */
	bool		too_large;		/* the graph outgrew ZKD_MAX_MEMBERS */
	ZkqrQueue  *queues;			/* read so far in this pass, with their
								 * requests */
	int			nqueues;
	/* Requests in flight, released together, or by the error cleanup. */
	ZkRequest **requests;
	int			nrequests;
	int			capacity;
} Search;

/*
 * Make room to track one more request; called before the request is made,
 * so running out of memory leaves none untracked.
 */
static void
make_room(Search *s)
{
	if (s->nrequests < s->capacity)
		return;
	s->capacity = Max(2 * s->capacity, 64);
	if (s->requests == NULL)
		s->requests = palloc(s->capacity * sizeof(ZkRequest *));
	else
		s->requests = repalloc(s->requests, s->capacity * sizeof(ZkRequest *));
}

static ZkRequest *
track(Search *s, ZkRequest *req)
{
	Assert(s->nrequests < s->capacity);
	s->requests[s->nrequests++] = req;
	return req;
}

static void
release_requests(Search *s)
{
	while (s->nrequests > 0)
		zks_release_request(s->requests[--s->nrequests]);
}

/*
 * Wait for every request in flight.  False at the deadline, or as soon as
 * our own watch fires: our wait may be over, and the check is then done
 * again later rather than hold up the grant.
 */
static bool
await_all(Search *s)
{
	int			i;

	for (i = 0; i < s->nrequests; i++)
		if (!zks_await(s->requests[i], s->deadline) ||
			zks_watch_generation() != s->generation)
			return false;
	return true;
}

static char *
published_path(const char *waits_dir, int64 session)
{
	return psprintf("%s/%016llx", waits_dir, (unsigned long long) session);
}

/* Only the characters zklock writes in a lock's path. */
static bool
is_plain(const char *name, const char *extra)
{
	const char *p;

	if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return false;
	for (p = name; *p; p++)
		if (!isalnum((unsigned char) *p) && strchr(extra, *p) == NULL)
			return false;
	return true;
}

/*
 * A published wait must name a lock parent under our root and a contender
 * node of plain characters: anything else was not written by zklock (and
 * could make the library refuse a request outright).
 */
static bool
is_valid_wait(const Search *s, const ZknWait *wait)
{
	size_t		rootlen = strlen(s->root);
	ZknContender contender;

	return strncmp(wait->parent, s->root, rootlen) == 0 &&
		wait->parent[rootlen] == '/' &&
		is_plain(wait->parent + rootlen + 1, "_.-%") &&
		is_plain(wait->node, "_.-") &&
		zkn_parse_contender(wait->node, &contender) != ZKN_NOT_CONTENDER;
}

/*
 * The queue under parent, read once per pass (zk_queue_read.c): the
 * listing, then each contender's stat, for its czxid and its owner (the
 * ephemeralOwner), in one pipeline; so it is ordered by czxid.  NULL if
 * the reads did not finish, or the listing or a read failed.
 */
static ZkqrQueue *
read_queue(Search *s, const char *parent)
{
	ZkqrOptions options = {0};
	char	   *parent_copy;
	ZkqrQueue  *q;
	int			i;

	for (i = 0; i < s->nqueues; i++)
		if (strcmp(s->queues[i].parent, parent) == 0)
			return &s->queues[i];

	release_requests(s);
	parent_copy = pstrdup(parent);
	s->queues = s->queues == NULL ? palloc(sizeof(ZkqrQueue)) :
		repalloc(s->queues, (s->nqueues + 1) * sizeof(ZkqrQueue));
	/* Counted before anything is sent, so the error cleanup releases it. */
	q = &s->queues[s->nqueues++];
	memset(q, 0, sizeof(ZkqrQueue));
	options.reads = ZKQR_STAT;
	options.deadline = s->deadline;
	options.stop_on_watch = true;
	options.generation = s->generation;
	if (zkqr_read_queue(q, parent_copy, &options) == ZKQR_DONE)
		return q;
	zkqr_release(q);
	s->nqueues--;
	return NULL;
}

/* Let go of this pass's queues, to read them anew. */
static void
forget_queues(Search *s)
{
	while (s->nqueues > 0)
		zkqr_release(&s->queues[--s->nqueues]);
}

/*
 * Whom a member's node waits for, by the queue rules.  A node that holds,
 * or that is about to queue again (zk_queue.c), is not in a wait that can
 * be part of a deadlock.  *blockers is palloc'd.
 */
static Reading
read_blockers(Search *s, const Member *m, Blocker **blockers, int *count)
{
	const ZknWait *wait = &m->wait;
	ZkqrQueue  *q = read_queue(s, wait->parent);
	int		   *indexes;
	int			own = -1;
	int			watch;
	int			n;
	int			i;

	if (q == NULL)
		return READ_FAILED;
	for (i = 0; i < q->n; i++)
		if (strcmp(q->entries[i].name, wait->node) == 0)
			own = i;
	/* A wait published for another session's node is not a wait. */
	if (own < 0 || q->reads[own]->stat.ephemeralOwner != m->session)
		return READ_NOT_WAITING;
	switch (zkq_decide(q->entries, q->n, own, true, &watch))
	{
		case ZKQ_WAIT:
			break;
		case ZKQ_HOLDS:
		case ZKQ_REQUEUE:
			return READ_NOT_WAITING;
		case ZKQ_NO_MEMORY:
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
	}
	indexes = palloc(q->n * sizeof(int));
	n = zkq_blockers(q->entries, q->n, own, true, indexes);
	if (n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	*blockers = palloc(Max(n, 1) * sizeof(Blocker));
	for (i = 0; i < n; i++)
	{
		(*blockers)[i].node = q->entries[indexes[i]].name;
		(*blockers)[i].owner = q->reads[indexes[i]]->stat.ephemeralOwner;
	}
	*count = n;
	return READ_OK;
}

/*
 * Add the session of an owner that waits to the graph, in this pass, as a
 * member waiting for blocker (a node waited for by member via).
 */
static void
add_member(Search *s, Owner *owner, const Blocker *blocker, int via)
{
	Member	   *m = &s->members[s->nmembers];

	m->session = owner->session;
	m->published_czxid = owner->published_czxid;
	m->wait = owner->wait;
	m->waited_for_by = via;
	strlcpy(m->blocking_node, blocker->node, sizeof(m->blocking_node));
	owner->pass = s->pass;
	s->nmembers++;
}

/*
 * Add to the graph the owners of blockers (waited for by member via) that
 * published a wait before us: reading what each published unless the check
 * did already.  Returns false if the reads did not finish, or if the graph
 * grew past ZKD_MAX_MEMBERS.
 */
static bool
add_waiting_owners(Search *s, const Blocker *blockers, int count, int via)
{
	ZkRequest **reads = palloc(Max(count, 1) * sizeof(ZkRequest *));
	Owner	  **to_read = palloc(Max(count, 1) * sizeof(Owner *));
	const Blocker **read_for = palloc(Max(count, 1) * sizeof(Blocker *));
	Owner	  **known = palloc(Max(count, 1) * sizeof(Owner *));
	const Blocker **known_for = palloc(Max(count, 1) * sizeof(Blocker *));
	int			nreads = 0;
	int			nknown = 0;
	int			i;

	release_requests(s);
	for (i = 0; i < count; i++)
	{
		const Blocker *b = &blockers[i];
		Owner	   *owner;
		bool		found;

		/* A node with no owner is persistent: nobody waits behind it. */
		if (b->owner == 0)
			continue;
		owner = hash_search(s->owners, &b->owner, HASH_ENTER, &found);
		if (!found)
		{
			owner->state = OWNER_READING;
			owner->pass = 0;
			to_read[nreads] = owner;
			read_for[nreads++] = b;
		}
		else if (owner->state == OWNER_WAITS && owner->pass != s->pass)
		{
			/* Read in an earlier pass: it joins this one as it is. */
			owner->pass = s->pass;
			known[nknown] = owner;
			known_for[nknown++] = b;
		}
	}
	/* Judged before anything is sent: reads past the size are not made. */
	if (s->nmembers + nknown + nreads > zkd_test_max_members)
	{
		s->too_large = true;
		return false;
	}
	s->members = repalloc(s->members,
						  (s->nmembers + nknown + nreads) * sizeof(Member));
	for (i = 0; i < nknown; i++)
		add_member(s, known[i], known_for[i], via);
	for (i = 0; i < nreads; i++)
	{
		make_room(s);
		reads[i] = track(s, zks_get_data(published_path(s->waits_dir,
														to_read[i]->session)));
	}
	if (!await_all(s))
		return false;
	for (i = 0; i < nreads; i++)
	{
		ZkRequest  *read = reads[i];
		Owner	   *owner = to_read[i];

		/* Only a missing node says "not waiting"; a failed read says nothing. */
		if (read->rc != ZOK && read->rc != ZNONODE)
			return false;

		/*
		 * Only a node its own session made, never rewritten, and made before
		 * ours counts: see the header comment.
		 */
		owner->state = OWNER_NOT_FOLLOWED;
		if (read->rc != ZOK || read->data == NULL ||
			read->stat.ephemeralOwner != owner->session ||
			read->stat.version != 0 ||
			read->stat.czxid >= s->members[0].published_czxid ||
			!zkn_parse_wait(read->data, read->datalen, &owner->wait) ||
			!is_valid_wait(s, &owner->wait))
			continue;
		owner->state = OWNER_WAITS;
		owner->published_czxid = read->stat.czxid;
		add_member(s, owner, read_for[i], via);
	}
	release_requests(s);
	return true;
}

typedef enum Found
{
	FOUND_CYCLE,
	FOUND_NONE,
	FOUND_UNKNOWN				/* the check could not finish */
} Found;

/*
 * Breadth first from us, through the whole graph: every member that waits
 * for a node of ours closes a cycle, back along the members that reached
 * it; they go to s->closings.
 */
static Found
find_cycles(Search *s)
{
	int64		self = s->members[0].session;
	int			q;

	for (q = 0; q < s->nmembers; q++)
	{
		Blocker    *blockers;
		int			count;
		int			i;

		switch (read_blockers(s, &s->members[q], &blockers, &count))
		{
			case READ_FAILED:
				return FOUND_UNKNOWN;
			case READ_NOT_WAITING:
				if (q == 0)
					return FOUND_NONE;
				continue;
			case READ_OK:
				break;
		}
		for (i = 0; i < count; i++)
		{
			Closing    *c;

			/* A node of our own ahead of ours is no cycle with anyone. */
			if (blockers[i].owner != self || q == 0)
				continue;
			s->closings = s->closings == NULL ? palloc(sizeof(Closing)) :
				repalloc(s->closings, (s->nclosings + 1) * sizeof(Closing));
			c = &s->closings[s->nclosings++];
			c->member = q;
			strlcpy(c->node, blockers[i].node, sizeof(c->node));
			break;
		}
		if (!add_waiting_owners(s, blockers, count, q))
			return FOUND_UNKNOWN;
	}
	return s->nclosings > 0 ? FOUND_CYCLE : FOUND_NONE;
}

/* Does member m still wait for node, owned by owner? */
static Found
still_waits_for(Search *s, const Member *m, const char *node, int64 owner)
{
	Blocker    *blockers;
	int			count;
	int			i;

	switch (read_blockers(s, m, &blockers, &count))
	{
		case READ_FAILED:
			return FOUND_UNKNOWN;
		case READ_NOT_WAITING:
			return FOUND_NONE;
		case READ_OK:
			break;
	}
	for (i = 0; i < count; i++)
		if (blockers[i].owner == owner && strcmp(blockers[i].node, node) == 0)
			return FOUND_CYCLE;
	return FOUND_NONE;
}

/*
 * Read the cycle closed by s->closings[s->closing] again (see the header
 * comment): every member still has the same published wait, and each
 * still waits for the node it waited for.
 */
static Found
confirm_cycle(Search *s)
{
	ZkRequest **reads = palloc(s->nmembers * sizeof(ZkRequest *));
	const Closing *closing = &s->closings[s->closing];
	Found		found;
	int			i;
	int			m;

	/* Every queue is read anew. */
	forget_queues(s);
	release_requests(s);
	for (m = closing->member, i = 0; m > 0; m = s->members[m].waited_for_by, i++)
	{
		make_room(s);
		reads[i] = track(s, zks_exists(published_path(s->waits_dir,
													  s->members[m].session)));
	}
	if (!await_all(s))
		return FOUND_UNKNOWN;
	for (m = closing->member, i = 0; m > 0; m = s->members[m].waited_for_by, i++)
	{
		if (reads[i]->rc == ZNONODE ||
			(reads[i]->rc == ZOK &&
			 (reads[i]->stat.czxid != s->members[m].published_czxid ||
			  reads[i]->stat.version != 0)))
		{
			/* Its wait is over: a later pass must not follow it as it was. */
			Owner	   *owner = hash_search(s->owners, &s->members[m].session,
											HASH_FIND, NULL);

			if (owner)
				owner->state = OWNER_NOT_FOLLOWED;
			return FOUND_NONE;
		}
		if (reads[i]->rc != ZOK)
			return FOUND_UNKNOWN;
	}
	release_requests(s);

	found = still_waits_for(s, &s->members[closing->member], closing->node,
							s->members[0].session);
	for (m = closing->member; m > 0 && found == FOUND_CYCLE;
		 m = s->members[m].waited_for_by)
	{
		const Member *waiter = &s->members[s->members[m].waited_for_by];

		found = still_waits_for(s, waiter, s->members[m].blocking_node,
								s->members[m].session);
	}
	return found;
}

/* The lock name a parent path stands for, in the database encoding. */
static char *
lock_name_of(const char *parent)
{
	const char *last = zkl_basename(parent);
	char		name[ZKN_NAME_MAX + 1];
	size_t		len;

	if (!zkn_decode_name(last, name, sizeof(name), &len))
		return pstrdup(last);
	return zkt_convert_lossy(name, len, PG_UTF8, GetDatabaseEncoding(), true);
}

/* "<pid> on <host>:<port>", for the deadlock report. */
static char *
process_of(const ZknIdentity *id)
{
	char	   *host = zkt_convert_lossy(id->host, strlen(id->host), PG_UTF8,
										 GetDatabaseEncoding(), true);

	return psprintf("%ld on %s:%ld", id->pid, host, id->port);
}

/*
 * End our wait as PostgreSQL ends a deadlocked one, naming each member of
 * the cycle, what it waits for and who blocks it.
 */
static void
report_deadlock(Search *s)
{
	int			path[ZKD_MAX_MEMBERS];
	int			len = 0;
	int			m;
	int			i;
	StringInfoData detail;

	/* path[] runs against the waits: path[i] waits for path[i - 1]. */
	for (m = s->closings[s->closing].member; m > 0;
		 m = s->members[m].waited_for_by)
		path[len++] = m;
	path[len++] = 0;
	initStringInfo(&detail);
	for (i = len - 1; i >= 0; i--)
	{
		const Member *waiter = &s->members[path[i]];
		const Member *holder = &s->members[path[i > 0 ? i - 1 : len - 1]];
		ZknContender contender;

		(void) zkn_parse_contender(waiter->wait.node, &contender);
		appendStringInfo(&detail, "%sProcess %s waits for %s zklock \"%s\"; blocked by process %s.",
						 detail.len > 0 ? "\n" : "",
						 process_of(&waiter->wait.id),
						 contender.shared ? "shared" : "exclusive",
						 lock_name_of(waiter->wait.parent),
						 process_of(&holder->wait.id));
	}
	zksh_count(s->members[0].wait.parent, false, ZKSH_DEADLOCKS, 1);
	ereport(ERROR,
			(errcode(ERRCODE_T_R_DEADLOCK_DETECTED),
			 errmsg("deadlock detected"),
			 errdetail_internal("%s", detail.data),
			 errhint("Take zklocks in the same order in every job.")));
}

/*
 * Publish our wait: the parent waited on, our node and who we are.  Returns
 * false if it did not happen in time; published->path is set as soon as a
 * node may exist, so zkd_withdraw deletes it whatever happened.  Each
 * create waits for a connection first, so the janitor's deletes of an
 * earlier wait's node, re-sent on a reconnect, go ahead of it.  A node that
 * exists already is this wait's own if it says what we would write: an
 * earlier create whose reply was lost.  It is adopted, with its czxid;
 * publishing anew would make this wait younger for us than for the others
 * who read the first node, and a cycle could then have two victims.
 */
static bool
publish(Search *s, const char *parent, const char *node, const char *identity,
		ZkdWait *published)
{
	char	   *path = published_path(s->waits_dir, zks_session_id());
	char	   *data = psprintf("%s\n%s\n%s", parent, node, identity);
	int			attempt;

	for (attempt = 0; attempt < 3; attempt++)
	{
		ZkRequest  *req;

		release_requests(s);
		if (!zks_await_connected(s->deadline))
			return false;
		make_room(s);
		req = track(s, zks_create(path, data, strlen(data), ZOO_EPHEMERAL));
		strlcpy(published->path, path, sizeof(published->path));
		if (!await_all(s))
			return false;
		if (req->rc == ZOK)
		{
			published->czxid = req->stat.czxid;
			return true;
		}
		if (req->rc == ZNONODE)
		{
			make_room(s);
			track(s, zks_create(s->waits_dir, NULL, -1, ZOO_CONTAINER));
		}
		else if (req->rc == ZNODEEXISTS)
		{
			ZkRequest  *read;

			release_requests(s);
			make_room(s);
			read = track(s, zks_get_data(path));
			if (!await_all(s))
				return false;
			if (read->rc == ZOK &&
				read->stat.ephemeralOwner == zks_session_id() &&
				read->stat.version == 0 && read->data != NULL &&
				read->datalen == (int) strlen(data) &&
				memcmp(read->data, data, read->datalen) == 0)
			{
				published->czxid = read->stat.czxid;
				return true;
			}

			/* An earlier wait's, its delete not yet done: replace it. */
			if (read->rc == ZOK && !zkd_withdraw(published))
				ereport(ERROR,
						(errcode(ERRCODE_OUT_OF_MEMORY),
						 errmsg("out of memory")));
		}
		else
			return false;
		if (!await_all(s))
			return false;
	}
	return false;
}

/*
 * Search the graph and try each cycle back to us that it shows; search
 * afresh if none of them holds any more.
 */
static Found
search(Search *s)
{
	int			attempt;

	for (attempt = 0; attempt < MAX_SEARCHES; attempt++)
	{
		Found		found;
		int64		self = s->members[0].session;
		Owner	   *owner = hash_search(s->owners, &self, HASH_FIND, NULL);

		/* We are member 0 of every pass. */
		s->pass++;
		owner->pass = s->pass;
		s->nmembers = 1;
		s->nclosings = 0;
		forget_queues(s);
		found = find_cycles(s);

		/*
		 * A graph too large to follow may still show cycles near us; we are
		 * the youngest of each, so each may be confirmed all the same.
		 */
		if (found != FOUND_CYCLE && !(s->too_large && s->nclosings > 0))
			return found;
		/* A test holds the window between search and confirmation open. */
		if (zkd_test_confirm_delay_ms > 0)
			pg_usleep(zkd_test_confirm_delay_ms * 1000L);
		for (s->closing = 0; s->closing < s->nclosings; s->closing++)
		{
			found = confirm_cycle(s);
			if (found != FOUND_NONE)
				return found;
		}
		if (s->too_large)
			return FOUND_UNKNOWN;
	}
	/* Cycles kept showing without holding: look again later. */
	return FOUND_UNKNOWN;
}

/*
 * Check for a deadlock in which this backend's wait, on node_path under
 * parent, is the youngest; publish the wait first if that is not done yet.
 * Raises "deadlock detected" if there is one.  Otherwise says whether the
 * check is done for this wait, should be done again later (it could not
 * finish by the deadline, the watch of generation fired meanwhile, or a
 * cycle seen did not hold), or met more waiting sessions than it follows.
 */
ZkdResult
zkd_check(const char *parent, const char *node_path, const char *identity,
		  ZkdWait *published, TimestampTz deadline, uint64 generation)
{
	MemoryContext check_context = AllocSetContextCreate(CurrentMemoryContext,
														"zklock deadlock check",
														ALLOCSET_DEFAULT_SIZES);
	MemoryContext old_context = MemoryContextSwitchTo(check_context);
	Search	   *s = palloc0(sizeof(Search));
	const char *node = zkl_basename(node_path);
	Member	   *self;
	Found		found = FOUND_UNKNOWN;
	ZkdResult	result = ZKD_AGAIN;
	HASHCTL		ctl;
	uint64		requests_before = zks_requests_sent();
	TimestampTz started = GetCurrentTimestamp();

	s->root = pnstrdup(parent, zkl_parent_length(parent));
	s->waits_dir = psprintf("%s/%s", s->root, ZKL_WAITS_DIR);
	s->deadline = deadline;
	s->generation = generation;
	s->members = palloc0(sizeof(Member));
	self = &s->members[0];
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(Owner);
	ctl.hcxt = check_context;
	s->owners = hash_create("zklock deadlock check owners", 64, &ctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	PG_TRY();
	{
		if (published->czxid != 0 ||
			publish(s, parent, node, identity, published))
		{
			Owner	   *owner;

			self->session = zks_session_id();
			self->published_czxid = published->czxid;
			self->waited_for_by = -1;
			strlcpy(self->wait.parent, parent, sizeof(self->wait.parent));
			strlcpy(self->wait.node, node, sizeof(self->wait.node));
			if (!zkn_parse_identity(identity, strlen(identity), &self->wait.id))
				memset(&self->wait.id, 0, sizeof(self->wait.id));
			owner = hash_search(s->owners, &self->session, HASH_ENTER, NULL);
			owner->state = OWNER_WAITS;
			found = search(s);
		}
		elog(DEBUG1, "zklock deadlock check: %llu requests, %ld ms, %d waiting sessions, %s",
			 (unsigned long long) (zks_requests_sent() - requests_before),
			 (long) ((GetCurrentTimestamp() - started) / 1000),
			 s->nmembers,
			 found == FOUND_CYCLE ? "a cycle" :
			 s->too_large ? "too many waiting sessions" :
			 found == FOUND_NONE ? "no cycle" : "unfinished");
		if (found == FOUND_CYCLE)
			report_deadlock(s);
		result = s->too_large ? ZKD_TOO_LARGE :
			found == FOUND_UNKNOWN ? ZKD_AGAIN : ZKD_DONE;
	}
	PG_FINALLY();
	{
		forget_queues(s);
		release_requests(s);
		MemoryContextSwitchTo(old_context);
		MemoryContextDelete(check_context);
	}
	PG_END_TRY();
	return result;
}

/*
 * Take a published wait back; the janitor deletes it.  Returns false if the
 * delete could not be recorded (out of memory): the wait stays until the
 * session ends.
 */
bool
zkd_withdraw(ZkdWait *published)
{
	bool		recorded = true;

	if (published->path[0] == '\0')
		return true;
	recorded = zks_delete_later(published->path);
	published->path[0] = '\0';
	published->czxid = 0;
	return recorded;
}
