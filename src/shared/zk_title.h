/*-------------------------------------------------------------------------
 *
 * zk_title.h
 *	  The process title of a backend that waits for a zklock.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_TITLE_H
#define ZK_TITLE_H

extern void zkti_prepare(const char *name, bool shared, bool semaphore);
extern void zkti_waiting(void);
extern void zkti_done(void);

#endif							/* ZK_TITLE_H */
