/*-------------------------------------------------------------------------
 *
 * zk_acl_check.c
 *	  With credentials (zklock.auth), whether the root and a lock's parent
 *	  keep every client without them from deleting lock nodes.
 *
 * ZooKeeper checks a delete against the ACL of the node's parent, not the
 * node's own.  zklock creates its root and parents with the creator-all ACL
 * (zk_settings.c), but one that exists already may have been made by
 * anyone, or before credentials were set: with an open ACL there, a client
 * without credentials can delete a holder's node, and the next waiter is
 * granted while the holder still works under the lock.  So before the
 * recipe decides anything from a queue, its parent and the root must grant
 * DELETE to no one but zklock itself, nor ADMIN, with which one could grant
 * oneself DELETE; and the parent must grant zklock DELETE, or its nodes
 * would stay after their release.  Others may still be granted READ, WRITE
 * (the parent's data, which zklock does not use) and CREATE: a node made
 * by hand can delay the queue, as any contender can, but not let two
 * holders in.  A semaphore's parent, <root>/%semaphores/<name>, is judged
 * the same way; %semaphores itself guards nothing but empty parents.
 *
 * Who zklock is: the ids the server puts in the ACL of a node it creates
 * with the creator-all ACL, which are every id its session authenticated
 * as (the digest of its credentials, and over TLS its certificate's x509
 * id).  They are read once from the ACL of a node the backend just made,
 * its contender node, the first time a judgement needs them, if that node
 * is still the one it made; "world" is never one of them.  A zklock
 * backend on another host, with the same credentials but its own
 * certificate, makes parents that grant everything to the credentials'
 * digest id and to that certificate's id: an id that the servers
 * authenticate (a certificate, SASL, not an address) is accepted beside
 * the credentials' own id with every permission, which only a client that
 * knows that id's digest could write.  A server shows digest ids in full
 * only to those with ADMIN on the node: zklock cannot tell its own from
 * another's without it, and refuses the node.
 *
 * The verdicts are kept for the backend, and forgotten when it opens a
 * session as someone else (other hosts, credentials or TLS files), and all
 * at once when there are too many.  A parent's listing returns its Stat,
 * and a parent is trusted while its czxid and aversion are those its ACL
 * was read with: one made anew (a container the server reaped, then a
 * squatter's) or given another ACL is read again, and an unchanged one
 * costs a hash lookup.  An ACL read that finds another version than the
 * listing's has the queue listed again, so that no decision rests on a
 * listing made under an ACL that was not judged.  A parent or root
 * component zklock created itself is trusted from its create's reply.  The
 * root is judged once by path: a root made anew by others can hold only
 * parents judged here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "base/zk_layout.h"
#include "base/zk_memory.h"
#include "recipe/zk_acl_check.h"

/* Verdicts kept before they are all forgotten. */
#define MAX_TRUSTED			1024

/* The czxid of a node trusted by path, whatever it is now: the root. */
#define ANY_CZXID			(-1)

typedef struct TrustedNode
{
	char		path[ZKL_PARENT_MAX];	/* hash key */
	int64		czxid;
	int32		aversion;
} TrustedNode;

/* The verdicts, and the ids zklock has in ACLs, for identity_for. */
static HTAB *trusted = NULL;
static struct ACL *own_ids = NULL;	/* NULL until read */
static int	nown_ids = 0;
static uint64 identity_for = 0;

static void
forget_own_ids(void)
{
	int			i;

	for (i = 0; i < nown_ids; i++)
	{
		pfree(own_ids[i].id.scheme);
		pfree(own_ids[i].id.id);
	}
	if (own_ids)
		pfree(own_ids);
	own_ids = NULL;
	nown_ids = 0;
}

/* The verdicts for whom the open session is, made or forgotten as needed. */
static HTAB *
verdicts(void)
{
	HASHCTL		ctl;

	if (trusted != NULL &&
		(identity_for != zks_identity_generation() ||
		 hash_get_num_entries(trusted) >= MAX_TRUSTED))
	{
		hash_destroy(trusted);
		trusted = NULL;
	}
	if (identity_for != zks_identity_generation())
	{
		forget_own_ids();
		identity_for = zks_identity_generation();
	}
	if (trusted == NULL)
	{
		ctl.keysize = ZKL_PARENT_MAX;
		ctl.entrysize = sizeof(TrustedNode);
		ctl.hcxt = zk_memory();
		trusted = hash_create("zklock trusted parents", 64, &ctl,
							  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	return trusted;
}

static void
remember(HTAB *table, const char *path, int64 czxid, int32 aversion)
{
	TrustedNode *node;

	if (strlen(path) >= ZKL_PARENT_MAX)
		return;
	node = hash_search(table, path, HASH_ENTER, NULL);
	node->czxid = czxid;
	node->aversion = aversion;
}

/*
 * Is the node at path trusted: as it is now, with stat, or by path alone
 * (the root), with no stat?
 */
static bool
is_trusted(HTAB *table, const char *path, const struct Stat *stat)
{
	TrustedNode *node;

	if (strlen(path) >= ZKL_PARENT_MAX)
		return false;
	node = hash_search(table, path, HASH_FIND, NULL);
	return node != NULL &&
		(stat == NULL || node->czxid == ANY_CZXID ||
		 (node->czxid == stat->czxid && node->aversion == stat->aversion));
}

/*
 * zklock created this node (a parent or a root component), with the
 * creator-all ACL: trusted as it is.
 */
void
zkac_created(const char *path, const struct Stat *stat)
{
	if (zks_has_credentials())
		remember(verdicts(), path, stat->czxid, stat->aversion);
}

/*
 * Learn who zklock is from the ACL of the node this acquisition created,
 * with czxid own_czxid.  False if that node is gone: another client
 * deleted it, and one of the same name, whose ACL would say nothing of
 * zklock, may stand in its place.
 */
static bool
learn_own_ids(const ZkRequest *own_node, int64 own_czxid)
{
	MemoryContext old;
	int			i;

	if (own_node->stat.czxid != own_czxid ||
		own_node->stat.ephemeralOwner != zks_session_id())
		return false;
	old = MemoryContextSwitchTo(zk_memory());
	forget_own_ids();
	own_ids = palloc0(Max(own_node->nacl, 1) * sizeof(struct ACL));
	for (i = 0; i < own_node->nacl; i++)
	{
		const struct ACL *entry = &own_node->acl[i];

		if (strcmp(entry->id.scheme, "world") == 0)
			continue;
		own_ids[nown_ids].perms = entry->perms;
		own_ids[nown_ids].id.scheme = pstrdup(entry->id.scheme);
		own_ids[nown_ids].id.id = pstrdup(entry->id.id);
		nown_ids++;
	}
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * Is entry the id of a client the servers authenticated, by certificate or
 * SASL, rather than anyone, an address or a password digest?
 */
static bool
is_authenticated_id(const struct ACL *entry)
{
	return strcmp(entry->id.scheme, "world") != 0 &&
		strcmp(entry->id.scheme, "ip") != 0 &&
		strcmp(entry->id.scheme, "digest") != 0;
}

static bool
is_own(const struct ACL *entry)
{
	int			i;

	for (i = 0; i < nown_ids; i++)
		if (strcmp(entry->id.scheme, own_ids[i].id.scheme) == 0 &&
			strcmp(entry->id.id, own_ids[i].id.id) == 0)
			return true;
	return false;
}

/* A digest id as the server shows it without ADMIN: "user:x". */
static bool
is_masked(const struct ACL *entry)
{
	const char *colon = strchr(entry->id.id, ':');

	return strcmp(entry->id.scheme, "digest") == 0 && colon != NULL &&
		strcmp(colon, ":x") == 0;
}

/* "cdrwa"-style letters for the permissions of an ACL entry. */
static const char *
perms_text(int32 perms)
{
	static char text[6];
	char	   *p = text;

	if (perms & ZOO_PERM_CREATE)
		*p++ = 'c';
	if (perms & ZOO_PERM_DELETE)
		*p++ = 'd';
	if (perms & ZOO_PERM_READ)
		*p++ = 'r';
	if (perms & ZOO_PERM_WRITE)
		*p++ = 'w';
	if (perms & ZOO_PERM_ADMIN)
		*p++ = 'a';
	*p = '\0';
	return text;
}

/*
 * Who an entry names, for a message: a digest id without its hash, which
 * stands for the password.
 */
static char *
who(const struct ACL *entry)
{
	const char *colon = strchr(entry->id.id, ':');

	if (strcmp(entry->id.scheme, "digest") == 0 && colon != NULL)
		return psprintf("digest:%.*s", (int) (colon - entry->id.id),
						entry->id.id);
	return psprintf("%s:%s", entry->id.scheme, entry->id.id);
}

#define ACL_HINT \
	"Give the node an ACL that grants DELETE and ADMIN to zklock's credentials alone (in zkCli.sh, after \"addauth digest\" with them: setAcl %s auth::cdrwa), or, if no client uses it, delete it so that zklock creates it anew."

/*
 * Refuse a node whose ACL, just read, lets someone other than zklock delete
 * its children or change the ACL, or that zklock cannot judge; with
 * lock_parent, also one whose children zklock may not delete.
 */
static void
judge(const char *path, const ZkRequest *req, bool lock_parent)
{
	bool		own_delete = false;
	bool		own_digest_all = false;
	int			i;

	for (i = 0; i < req->nacl; i++)
		own_digest_all |= is_own(&req->acl[i]) &&
			strcmp(req->acl[i].id.scheme, "digest") == 0 &&
			(req->acl[i].perms & ZOO_PERM_ALL) == ZOO_PERM_ALL;
	for (i = 0; i < req->nacl; i++)
	{
		const struct ACL *entry = &req->acl[i];

		if (is_masked(entry))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("zklock cannot tell who may delete lock nodes under ZooKeeper node \"%s\"",
							path),
					 errdetail("Its ACL names %s, whose password digest ZooKeeper shows only to those with ADMIN on the node, which zklock's credentials lack.",
							   who(entry)),
					 errhint(ACL_HINT, path)));
		if (is_own(entry))
			own_delete |= (entry->perms & ZOO_PERM_DELETE) != 0;
		else if ((entry->perms & (ZOO_PERM_DELETE | ZOO_PERM_ADMIN)) &&
				 !(own_digest_all && is_authenticated_id(entry)))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("ZooKeeper node \"%s\" lets clients without zklock's credentials delete lock nodes",
							path),
					 errdetail("Its ACL grants \"%s\" to %s; zklock uses a root and lock parents that grant DELETE and ADMIN to its credentials alone, since a client that deletes a holder's node lets a second holder in.",
							   perms_text(entry->perms), who(entry)),
					 errhint(ACL_HINT, path)));
	}
	if (lock_parent && !own_delete)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("ZooKeeper node \"%s\" does not let zklock delete its lock nodes",
						path),
				 errdetail("Its ACL grants DELETE to none of the ids of zklock's credentials, so a released lock would stay held."),
				 errhint(ACL_HINT, path)));
}

/* The ACL reads of one check: the own node's (if needed), the root's, the parent's. */
typedef struct AclReads
{
	const char *paths[3];
	ZkRequest  *reads[3];
	int			n;
	int			own;			/* index of the own node's read; -1: none */
	int			root;			/* likewise */
	int			parent;
	int64		own_czxid;		/* of the own node, as created */
} AclReads;

typedef enum AclRead
{
	ACL_READ_DONE,
	ACL_READ_AGAIN,				/* the connection dropped: read again */
	ACL_READ_LATE,				/* the deadline passed */
	ACL_READ_NODE_GONE			/* our own node is not ours any more */
} AclRead;

/*
 * Send the reads, await them all, then learn who zklock is if asked and
 * judge the root and the parent; *parent_stat gets the parent's Stat as
 * read.
 */
static AclRead
read_and_judge_once(AclReads *r, TimestampTz deadline, struct Stat *parent_stat)
{
	volatile AclRead result = ACL_READ_DONE;
	int			i;

	PG_TRY();
	{
		for (i = 0; i < r->n; i++)
			r->reads[i] = zks_get_acl(r->paths[i]);
		for (i = 0; i < r->n && result == ACL_READ_DONE; i++)
		{
			if (!zks_await(r->reads[i], deadline))
				result = ACL_READ_LATE;
			else if (zks_is_retryable(r->reads[i]->rc))
				result = ACL_READ_AGAIN;
			else if (i == r->own && r->reads[i]->rc == ZNONODE)
				result = ACL_READ_NODE_GONE;
			else if (r->reads[i]->rc != ZOK)
				zks_report_error(r->reads[i]->rc, ZKS_READ, r->paths[i]);
		}
		if (result == ACL_READ_DONE && r->own >= 0 &&
			!learn_own_ids(r->reads[r->own], r->own_czxid))
			result = ACL_READ_NODE_GONE;
		if (result == ACL_READ_DONE)
		{
			if (r->root >= 0)
				judge(r->paths[r->root], r->reads[r->root], false);
			if (r->parent >= 0)
			{
				judge(r->paths[r->parent], r->reads[r->parent], true);
				*parent_stat = r->reads[r->parent]->stat;
			}
		}
	}
	PG_CATCH();
	{
		for (i = 0; i < r->n; i++)
			zks_release_request(r->reads[i]);
		PG_RE_THROW();
	}
	PG_END_TRY();
	for (i = 0; i < r->n; i++)
	{
		zks_release_request(r->reads[i]);
		r->reads[i] = NULL;
	}
	return result;
}

static int
add_read(AclReads *r, const char *path)
{
	r->paths[r->n] = path;
	r->reads[r->n] = NULL;
	return r->n++;
}

/*
 * The check itself, for a session with credentials; see zkac_check_parent.
 * Apart, so that every acquisition without credentials, which returns at
 * once, does not pay for this one's frame.
 */
static pg_noinline ZkacVerdict
check_parent(const char *parent, bool semaphore, const char *own_node,
			 int64 own_czxid, const struct Stat *parent_stat,
			 TimestampTz deadline)
{
	HTAB	   *table = verdicts();
	char		root[ZKL_PARENT_MAX];
	AclReads	r = {{0}};
	struct Stat read_stat = {0};
	bool		root_trusted;
	bool		parent_trusted;

	/* <root>/<name>, or <root>/%semaphores/<name> */
	strlcpy(root, parent, sizeof(root));
	root[zkl_parent_length(root)] = '\0';
	if (semaphore)
		root[zkl_parent_length(root)] = '\0';

	root_trusted = is_trusted(table, root, NULL);
	parent_trusted = is_trusted(table, parent, parent_stat);
	if (root_trusted && parent_trusted)
		return ZKAC_TRUSTED;
	r.own = own_ids == NULL ? add_read(&r, own_node) : -1;
	r.own_czxid = own_czxid;
	r.root = root_trusted ? -1 : add_read(&r, root);
	r.parent = parent_trusted ? -1 : add_read(&r, parent);

	for (;;)
	{
		switch (read_and_judge_once(&r, deadline, &read_stat))
		{
			case ACL_READ_DONE:
				break;
			case ACL_READ_LATE:
				return ZKAC_LATE;
			case ACL_READ_NODE_GONE:
				return ZKAC_NODE_GONE;
			case ACL_READ_AGAIN:
				if (!zks_await_connected(deadline))
					return ZKAC_LATE;
				continue;
		}
		break;
	}
	if (r.root >= 0)
		remember(table, root, ANY_CZXID, 0);
	if (r.parent < 0)
		return ZKAC_TRUSTED;

	/* Trusted as its ACL was read; the listing must show that very ACL. */
	remember(table, parent, read_stat.czxid, read_stat.aversion);
	return read_stat.czxid == parent_stat->czxid &&
		read_stat.aversion == parent_stat->aversion ?
		ZKAC_TRUSTED : ZKAC_LIST_AGAIN;
}

/*
 * Before the recipe trusts the queue under parent (a semaphore's, if
 * semaphore), whose listing returned parent_stat, with own_node the
 * acquisition's node in it (made with own_czxid): with credentials, check
 * that the parent and the root keep out those without them, and raise an
 * ERROR if not.
 */
ZkacVerdict
zkac_check_parent(const char *parent, bool semaphore, const char *own_node,
				  int64 own_czxid, const struct Stat *parent_stat,
				  TimestampTz deadline)
{
	if (!zks_has_credentials())
		return ZKAC_TRUSTED;
	return check_parent(parent, semaphore, own_node, own_czxid, parent_stat,
						deadline);
}
