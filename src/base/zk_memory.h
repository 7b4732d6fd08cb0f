/*-------------------------------------------------------------------------
 *
 * zk_memory.h
 *	  The memory context that holds what zklock keeps for the backend's
 *	  lifetime, named so that pg_backend_memory_contexts shows it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_MEMORY_H
#define ZK_MEMORY_H

#include "utils/memutils.h"

extern MemoryContext zk_memory(void);

#endif							/* ZK_MEMORY_H */
