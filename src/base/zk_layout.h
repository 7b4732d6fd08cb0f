/*-------------------------------------------------------------------------
 *
 * zk_layout.h
 *	  Where zklock's nodes live in the ZooKeeper tree, and how long their
 *	  paths may be:
 *
 *	  <root>/<encoded name>/<contender>              a lock's queue
 *	  <root>/%semaphores/<encoded name>/<contender>  a semaphore's queue
 *	  <root>/%waits/<session id>                     a published wait
 *
 *	  A lock's parent is its queue's node.  An encoded name has '%' only
 *	  before two hex digits (zk_names.c), so no lock name maps to
 *	  "%semaphores" or "%waits".  Contender names are zk_names.c's.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_LAYOUT_H
#define ZK_LAYOUT_H

#include <string.h>

#include "base/zk_names.h"

/* Longest zklock.root accepted, in bytes. */
#define ZKL_ROOT_MAX		200

/* Where semaphores' queues live under the root, and published waits. */
#define ZKL_SEMAPHORE_SPACE	"%semaphores/"
#define ZKL_WAITS_DIR		"%waits"

/* Longest queue parent: <root>/<encoded name>, or with the semaphore space. */
#define ZKL_PARENT_MAX		(ZKL_ROOT_MAX + 1 + (int) (sizeof(ZKL_SEMAPHORE_SPACE) - 1) + \
							 ZKN_ENCODED_MAX)

/* Longest sequence number the server appends: a wrapped one, "-%010d". */
#define ZKL_SEQUENCE_MAX	11

/*
 * Longest contender path: <parent>/_c_<guid>-read-lock-<sequence> (a
 * semaphore's "-sem<N>-" is no longer than "-read-lock-").
 */
#define ZKL_NODE_MAX		(ZKL_PARENT_MAX + 4 + ZKN_GUID_LEN + 11 + ZKL_SEQUENCE_MAX)

/* Longest path of a published wait: <root>/%waits/<session id>. */
#define ZKL_WAIT_PATH_MAX	(ZKL_ROOT_MAX + 32)

/* The last component of a path: a contender's name, or a queue's. */
static inline const char *
zkl_basename(const char *path)
{
	return strrchr(path, '/') + 1;
}

/* The length of the path of a path's parent: a node's queue, a queue's root. */
static inline int
zkl_parent_length(const char *path)
{
	return strrchr(path, '/') - path;
}

#endif							/* ZK_LAYOUT_H */
