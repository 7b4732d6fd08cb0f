/*-------------------------------------------------------------------------
 *
 * zk_compat.h
 *	  What differs between the PostgreSQL majors zklock supports (15, 17
 *	  and 18), in one place.
 *
 * - pg_noreturn: 18 marks functions that do not return with a prefix
 *   (pg_noreturn) and dropped the older suffix, pg_attribute_noreturn();
 *   the prefix form is used throughout, defined here for older majors.
 * - WaitEventSets: 17 gives CreateWaitEventSet a resource owner where
 *   earlier majors take a memory context (zk_session.c).
 * - Wait events: 17 lets an extension name its own (WaitEventExtensionNew);
 *   earlier majors show every extension's wait as "Extension" (zk_session.c).
 * - Intervals: 17 accepts 'infinity' (INTERVAL_NOT_FINITE; zklock.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_COMPAT_H
#define ZK_COMPAT_H

#include "c.h"

#if PG_VERSION_NUM < 180000
#define pg_noreturn pg_attribute_noreturn()
#endif

#endif							/* ZK_COMPAT_H */
