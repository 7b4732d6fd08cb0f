/*-------------------------------------------------------------------------
 *
 * zk_title.c
 *	  The process title of a backend that waits for a zklock.
 *
 * As for PostgreSQL's own locks, the title says "waiting for zklock ..."
 * only once the backend really waits.  The wait shown server-wide drives
 * it (zk_shared.c): a lock call prepares the words (zkti_prepare), they
 * are shown when it starts to wait in the queue (zkti_waiting), and the
 * title is put back however the call ends (zkti_done).  A call granted at
 * once never touches the title.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/memutils.h"
#include "utils/ps_status.h"

#include "zk_memory.h"
#include "zk_title.h"

/* The lock call under way: the name is the caller's, until zkti_done. */
static const char *lock_name = NULL;
static bool lock_shared;
static bool lock_semaphore;

/* The title before "waiting", once shown. */
static char *saved_title = NULL;

void
zkti_prepare(const char *name, bool shared, bool semaphore)
{
	lock_name = name;
	lock_shared = shared;
	lock_semaphore = semaphore;
}

void
zkti_waiting(void)
{
	int			len;
	const char *activity;
	char	   *title;

	if (lock_name == NULL || saved_title != NULL || !update_process_title)
		return;
	activity = get_ps_display(&len);
	saved_title = MemoryContextAllocZero(zk_memory(), len + 1);
	memcpy(saved_title, activity, len);
	title = psprintf("%s waiting for zklock %s\"%s\"%s", saved_title,
					 lock_semaphore ? "semaphore " : "", lock_name,
					 lock_shared ? " (shared)" : "");
	set_ps_display(title);
	pfree(title);
}

/* Never raises an ERROR: it runs on the way out of one too. */
void
zkti_done(void)
{
	lock_name = NULL;
	if (saved_title == NULL)
		return;
	set_ps_display(saved_title);
	pfree(saved_title);
	saved_title = NULL;
}
