/*-------------------------------------------------------------------------
 *
 * zk_compat.h
 *	  What differs between the PostgreSQL majors zklock supports (15, 17
 *	  and 18): every difference is listed here; the one that a definition
 *	  can bridge is bridged here, and the others are handled where they
 *	  arise, in the file named, with a PG_VERSION_NUM test (or, for
 *	  intervals, a test of the macro itself).
 *
 * - pg_noreturn: 18 marks functions that do not return with a prefix
 *   (pg_noreturn) and dropped the older suffix, pg_attribute_noreturn();
 *   the prefix form is used throughout, defined here for older majors.
 * - ExecutorRun: 18 dropped its execute_once argument, so the hook that
 *   guards a statement has two signatures (zk_guard.c).
 * - WaitEventSets: 17 gives CreateWaitEventSet a resource owner where
 *   earlier majors take a memory context (zk_wait.c).
 * - Wait events: 17 lets an extension name its own (WaitEventExtensionNew);
 *   earlier majors show every extension's wait as "Extension" (zk_wait.c).
 * - Intervals: 17 accepts 'infinity' (INTERVAL_NOT_FINITE; zk_args.c).
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
