/*-------------------------------------------------------------------------
 *
 * zk_guard.h
 *	  The statement guard: lets a lost session cancel the running
 *	  statement, in zklock's words, and runs the commit checks where a
 *	  commit begins.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_GUARD_H
#define ZK_GUARD_H

extern void zkg_install(void);

#endif							/* ZK_GUARD_H */
