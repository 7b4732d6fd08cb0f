/*-------------------------------------------------------------------------
 *
 * zk_memory.c
 *	  The "zklock" memory context: the hold tables, the session's settings
 *	  as opened, the backend's identity and saved title live there, apart
 *	  from TopMemoryContext, so that pg_backend_memory_contexts (and a
 *	  memory context dump) shows what zklock keeps.  Never reset: what is
 *	  in it lives as long as the backend.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/zk_memory.h"

static MemoryContext zklock_context = NULL;

MemoryContext
zk_memory(void)
{
	if (zklock_context == NULL)
		zklock_context = AllocSetContextCreate(TopMemoryContext, "zklock",
											   ALLOCSET_SMALL_SIZES);
	return zklock_context;
}
