/*-------------------------------------------------------------------------
 *
 * zk_budget.c
 *	  The budget of lock nodes one backend's ZooKeeper session may have:
 *	  how many, and how many bytes of paths.
 *
 * When a session closes or expires, ZooKeeper writes one transaction that
 * lists the path of every ephemeral node the session owns, and every
 * server must read it back, from its peers and from its log, within
 * jute.maxbuffer (1 MB by default, and as much again in ZooKeeper 3.8's
 * reader).  A larger one cannot be read: the
 * followers drop out, the ensemble loses its quorum, and a server whose
 * log holds it does not start again (ZOOKEEPER-4306).  So a client must
 * keep each session's nodes small itself, and an ordinary SQL role must
 * not be able to break an ensemble that other systems share.
 *
 * Every lock node of a session is in the janitor's list but the one an
 * acquisition is making (zk_janitor.c): held nodes, given-up nodes not yet
 * confirmed deleted, and sweeps of creates whose reply was lost.  Before
 * each contender node is created, the list's count and bytes plus the new
 * node's must stay within zklock.max_session_nodes and
 * zklock.max_session_path_bytes, or the acquisition fails with an ERROR
 * before anything is sent.  Deletes on their way still count; the check
 * waits for them a little before it refuses.  The session's one published
 * wait (zk_deadlock.c), at most ZKL_WAIT_PATH_MAX bytes, is outside the
 * budget.
 *
 * Both settings are the superuser's: the budget protects the ensemble from
 * the roles that lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <pthread.h>

#include "utils/guc.h"

#include "base/zk_layout.h"
#include "session/zk_session.h"
#include "session/zk_session_int.h"

/* Settings; their defaults, a quarter of jute.maxbuffer and less, below. */
static int	zklock_max_session_nodes;
static int	zklock_max_session_path_bytes;

/* How long a refusal first waits for deletes on their way. */
#define BUDGET_SETTLE_MS	2000

void
zks_define_budget_settings(void)
{
	DefineCustomIntVariable("zklock.max_session_nodes",
							"Sets how many lock nodes, held or waiting, one backend's ZooKeeper session may have.",
							"Keeps what ZooKeeper writes when the session ends within its jute.maxbuffer.",
							&zklock_max_session_nodes,
							1000, 1, 1000000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("zklock.max_session_path_bytes",
							"Sets how many bytes the paths of one backend's lock nodes may take in all.",
							"ZooKeeper lists every path when the session ends, in one record that must fit its jute.maxbuffer (1 MB by default).",
							&zklock_max_session_path_bytes,
							256 * 1024, 1024, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

static bool
deleting_any(void)
{
	bool		deleting;

	pthread_mutex_lock(&zks_mutex);
	deleting = zkj_deleting_any_locked();
	pthread_mutex_unlock(&zks_mutex);
	return deleting;
}

/*
 * May the session create one more lock node, named prefix plus the
 * sequence number the server appends?  If not, raise an ERROR: nothing
 * was sent, and the backend's holds are as they were.
 */
void
zks_check_node_budget(const char *prefix)
{
	int			new_bytes = strlen(prefix) + ZKL_SEQUENCE_MAX;
	int			nodes;
	int64		path_bytes;

	zkj_footprint(&nodes, &path_bytes);
	if (nodes < zklock_max_session_nodes &&
		path_bytes + new_bytes <= zklock_max_session_path_bytes)
		return;
	/* Nodes kept after their release make room first. */
	(void) zks_give_up_kept();
	if (deleting_any())
	{
		zks_settle(Min(zklock_connect_timeout, BUDGET_SETTLE_MS));
		zkj_footprint(&nodes, &path_bytes);
	}
	if (nodes >= zklock_max_session_nodes)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many zklock nodes for this backend"),
				 errdetail("Its ZooKeeper session has %d lock nodes, held, waiting or being deleted, and may have %d.",
						   nodes, zklock_max_session_nodes),
				 errhint("Release locks or semaphore slots first, or ask a superuser to increase \"zklock.max_session_nodes\".")));
	if (path_bytes + new_bytes > zklock_max_session_path_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many bytes of zklock node paths for this backend"),
				 errdetail("The paths of its ZooKeeper session's lock nodes take %lld bytes, a new node's would take up to %d more, and they may take %d.",
						   (long long) path_bytes, new_bytes,
						   zklock_max_session_path_bytes),
				 errhint("Release locks or semaphore slots first, use shorter names, or ask a superuser to increase \"zklock.max_session_path_bytes\".")));
}
