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
 * recipe decides anything from a queue, its parent and the root above it
 * must grant DELETE to no one but the credentials' own digest id, nor
 * ADMIN, with which one could grant oneself DELETE.  Others may still be
 * granted READ, WRITE (the parent's data, which zklock does not use) and
 * CREATE: a node created by hand can delay the queue, as any contender
 * can, but not let two holders in.
 *
 * The verdict is kept for the backend.  A parent's listing returns its
 * Stat, and a parent is trusted while its czxid and aversion are those its
 * ACL was read with: one made anew (a container the server reaped, then a
 * squatter's) or given another ACL is read again, and an unchanged one
 * costs a hash lookup.  A parent or root component zklock created itself
 * is trusted from its create's reply.  The root is read once by path: a
 * root made anew by others can hold only parents checked here.  The
 * verdicts are forgotten when the credentials change, and all at once when
 * there are too many.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/hsearch.h"

#include "zk_acl_check.h"
#include "zk_layout.h"
#include "zk_memory.h"

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

static HTAB *trusted = NULL;
static char *trusted_for = NULL;	/* the credentials id they hold for */

/* The verdicts for the open session's credentials, which are id. */
static HTAB *
verdicts(const char *id)
{
	HASHCTL		ctl;

	if (trusted != NULL &&
		(strcmp(trusted_for, id) != 0 ||
		 hash_get_num_entries(trusted) >= MAX_TRUSTED))
	{
		hash_destroy(trusted);
		trusted = NULL;
		pfree(trusted_for);
	}
	if (trusted == NULL)
	{
		ctl.keysize = ZKL_PARENT_MAX;
		ctl.entrysize = sizeof(TrustedNode);
		ctl.hcxt = zk_memory();
		trusted = hash_create("zklock trusted parents", 64, &ctl,
							  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		trusted_for = MemoryContextStrdup(zk_memory(), id);
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

static bool
is_trusted(HTAB *table, const char *path, const struct Stat *stat)
{
	TrustedNode *node;

	if (strlen(path) >= ZKL_PARENT_MAX)
		return false;
	node = hash_search(table, path, HASH_FIND, NULL);
	return node != NULL &&
		(node->czxid == ANY_CZXID ||
		 (stat != NULL && node->czxid == stat->czxid &&
		  node->aversion == stat->aversion));
}

/*
 * zklock created this node (a parent or a root component), with the ACL of
 * its credentials: trusted as it is.
 */
void
zkac_created(const char *path, const struct Stat *stat)
{
	const char *id = zks_credentials_id();

	if (id != NULL)
		remember(verdicts(id), path, stat->czxid, stat->aversion);
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
 * Refuse a node whose ACL, just read, lets someone other than id delete
 * its children or change the ACL.
 */
static void
judge(const char *path, const ZkRequest *req, const char *id)
{
	int			i;

	for (i = 0; i < req->nacl; i++)
	{
		const struct ACL *entry = &req->acl[i];
		bool		ours = strcmp(entry->id.scheme, "digest") == 0 &&
			strcmp(entry->id.id, id) == 0;

		if (!ours && (entry->perms & (ZOO_PERM_DELETE | ZOO_PERM_ADMIN)))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("ZooKeeper node \"%s\" lets clients without zklock's credentials delete lock nodes",
							path),
					 errdetail("Its ACL grants \"%s\" to %s:%s; zklock uses a root and lock parents that grant DELETE and ADMIN to its credentials alone, since a client that deletes a holder's node lets a second holder in.",
							   perms_text(entry->perms), entry->id.scheme,
							   entry->id.id),
					 errhint("Give the node an ACL that grants DELETE and ADMIN to zklock's credentials alone (in zkCli.sh, after \"addauth digest\" with them: setAcl %s auth::cdrwa), or, if no client uses it, delete it so that zklock creates it anew.",
							 path)));
	}
}

typedef enum AclRead
{
	ACL_READ_DONE,
	ACL_READ_AGAIN,				/* the connection dropped: read again */
	ACL_READ_LATE				/* the deadline passed */
} AclRead;

/*
 * Read the ACLs of the nodes in paths (n of them, at most two) and judge
 * each; their Stats, as read, go to stats.
 */
static AclRead
read_and_judge_once(const char **paths, int n, const char *id,
					TimestampTz deadline, struct Stat *stats)
{
	ZkRequest  *volatile reads[2] = {NULL, NULL};
	volatile AclRead result = ACL_READ_DONE;
	int			i;

	Assert(n <= lengthof(reads));
	PG_TRY();
	{
		for (i = 0; i < n; i++)
			reads[i] = zks_get_acl(paths[i]);
		for (i = 0; i < n && result == ACL_READ_DONE; i++)
		{
			ZkRequest  *req = reads[i];

			if (!zks_await(req, deadline))
				result = ACL_READ_LATE;
			else if (zks_is_retryable(req->rc))
				result = ACL_READ_AGAIN;
			else if (req->rc != ZOK)
				zks_report_error(req->rc, ZKS_READ, paths[i]);
			else
			{
				judge(paths[i], req, id);
				stats[i] = req->stat;
			}
		}
	}
	PG_CATCH();
	{
		for (i = 0; i < n; i++)
			zks_release_request(reads[i]);
		PG_RE_THROW();
	}
	PG_END_TRY();
	for (i = 0; i < n; i++)
		zks_release_request(reads[i]);
	return result;
}

/* The same until it is done, across reconnects; false at the deadline. */
static bool
read_and_judge(const char **paths, int n, const char *id,
			   TimestampTz deadline, struct Stat *stats)
{
	for (;;)
	{
		switch (read_and_judge_once(paths, n, id, deadline, stats))
		{
			case ACL_READ_DONE:
				return true;
			case ACL_READ_LATE:
				return false;
			case ACL_READ_AGAIN:
				if (!zks_await_connected(deadline))
					return false;
				break;
		}
	}
}

/*
 * Before the recipe trusts the queue under parent (a semaphore's, if
 * semaphore), whose listing returned parent_stat: with credentials, check
 * that the parent and the root keep out those without them, and raise an
 * ERROR if not.  Returns false at the deadline.
 */
bool
zkac_check_parent(const char *parent, bool semaphore,
				  const struct Stat *parent_stat, TimestampTz deadline)
{
	const char *id = zks_credentials_id();
	HTAB	   *table;
	char		root[ZKL_PARENT_MAX];
	const char *paths[2];
	struct Stat stats[2];
	int			n = 0;
	bool		root_checked;

	if (id == NULL)
		return true;
	table = verdicts(id);
	if (is_trusted(table, parent, parent_stat))
		return true;

	/* <root>/<name>, or <root>/%semaphores/<name> */
	strlcpy(root, parent, sizeof(root));
	root[zkl_parent_length(root)] = '\0';
	if (semaphore)
		root[zkl_parent_length(root)] = '\0';
	root_checked = is_trusted(table, root, NULL);
	if (!root_checked)
		paths[n++] = root;
	paths[n++] = parent;
	if (!read_and_judge(paths, n, id, deadline, stats))
		return false;
	if (!root_checked)
		remember(table, root, ANY_CZXID, 0);
	/* Trusted as its ACL was read: a later listing shows any change since. */
	remember(table, parent, stats[n - 1].czxid, stats[n - 1].aversion);
	return true;
}
