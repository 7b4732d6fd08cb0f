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
 * Every OS user can read a process title, and tools print it one line per
 * process: a lock name goes into it with its control characters escaped,
 * so that no name can forge a line or a terminal sequence there.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/memutils.h"
#include "utils/ps_status.h"

#include "base/zk_memory.h"
#include "shared/zk_title.h"

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

/*
 * Append name with C0 controls, DEL and the backslash written as escapes
 * (\n, \x1b, \\), and in UTF-8 the C1 controls too (\u0085), since some
 * terminals act on them.  Other bytes, multibyte characters included, are
 * copied.
 */
static void
append_escaped(StringInfo buf, const char *name)
{
	bool		utf8 = GetDatabaseEncoding() == PG_UTF8;
	const unsigned char *p;

	for (p = (const unsigned char *) name; *p; p++)
	{
		if (*p == '\\')
			appendStringInfoString(buf, "\\\\");
		else if (*p == '\n')
			appendStringInfoString(buf, "\\n");
		else if (*p == '\r')
			appendStringInfoString(buf, "\\r");
		else if (*p == '\t')
			appendStringInfoString(buf, "\\t");
		else if (*p < 0x20 || *p == 0x7f)
			appendStringInfo(buf, "\\x%02x", *p);
		else if (utf8 && p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
		{
			appendStringInfo(buf, "\\u%04x", p[1]);
			p++;
		}
		else
			appendStringInfoChar(buf, (char) *p);
	}
}

void
zkti_waiting(void)
{
	int			len;
	const char *activity;
	StringInfoData title;

	if (lock_name == NULL || saved_title != NULL || !update_process_title)
		return;
	activity = get_ps_display(&len);
	saved_title = MemoryContextAllocZero(zk_memory(), len + 1);
	memcpy(saved_title, activity, len);
	initStringInfo(&title);
	appendStringInfo(&title, "%s waiting for zklock %s\"", saved_title,
					 lock_semaphore ? "semaphore " : "");
	append_escaped(&title, lock_name);
	appendStringInfo(&title, "\"%s", lock_shared ? " (shared)" : "");
	set_ps_display(title.data);
	pfree(title.data);
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
