/*-------------------------------------------------------------------------
 *
 * zk_args.c
 *	  Reading the SQL functions' arguments: lock and semaphore names (to
 *	  their parent paths under zklock.root), arrays of names, timeouts and
 *	  semaphore sizes.
 *
 * Every argument is checked here, and every bad one is an ERROR: NULL,
 * an empty name, a name too long, a negative timeout, a size out of range.
 * A job that believes it holds a lock must really hold it, so nothing here
 * ever lets a call go on with a NULL.
 *
 * A name is mapped from its UTF-8 form, so one text names one node
 * whatever the database encoding; SQL_ASCII databases, which know no
 * encoding, map the bytes as they are.  Semaphores live under
 * "<root>/%semaphores/" (zk_layout.h).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "interface/zk_args.h"

static char *zklock_root = NULL;

/*
 * zklock.root must be an absolute path of plain components, short enough
 * for every lock path to fit, and outside ZooKeeper's own /zookeeper tree.
 */
static bool
check_root(char **newval, void **extra, GucSource source)
{
	const char *root = *newval;
	const char *p;

	if (root[0] != '/' || strlen(root) > ZKL_ROOT_MAX ||
		root[strlen(root) - 1] == '/')
	{
		GUC_check_errdetail("zklock.root must be an absolute ZooKeeper path of at most %d bytes, without a trailing slash.",
							ZKL_ROOT_MAX);
		return false;
	}
	for (p = root; *p; p++)
	{
		if (!(isalnum((unsigned char) *p) || *p == '_' || *p == '-' ||
			  *p == '.' || *p == '/'))
		{
			GUC_check_errdetail("zklock.root may contain only letters, digits, \"_\", \"-\", \".\" and \"/\".");
			return false;
		}
		if (*p == '/' &&
			(p[1] == '/' ||
			 (p[1] == '.' && (p[2] == '/' || p[2] == '\0')) ||
			 (p[1] == '.' && p[2] == '.' && (p[3] == '/' || p[3] == '\0'))))
		{
			GUC_check_errdetail("zklock.root must not contain empty, \".\" or \"..\" components.");
			return false;
		}
	}
	if (strcmp(root, "/zookeeper") == 0 || strncmp(root, "/zookeeper/", 11) == 0)
	{
		GUC_check_errdetail("The /zookeeper tree belongs to ZooKeeper itself.");
		return false;
	}
	return true;
}

void
zka_define_settings(void)
{
	DefineCustomStringVariable("zklock.root",
							   "Sets the ZooKeeper path under which zklock keeps its lock nodes.",
							   "A name is looked up under the root in force when the call is made.",
							   &zklock_root,
							   "/zklock",
							   PGC_SUSET,
							   0,
							   check_root, NULL, NULL);
}

/*
 * Add an error context line naming what was being done, for errors raised
 * while converting a lock name to UTF-8.
 */
static void
name_conversion_context(void *arg)
{
	errcontext("converting the zklock name to UTF-8, the encoding of lock names in ZooKeeper");
}

/*
 * <root>/<space><encoded>.  The lengths are bounded by zklock.root's check
 * and ZKN_ENCODED_MAX.
 */
static void
join_parent(char parent[ZKL_PARENT_MAX], const char *space,
			const char *encoded)
{
	size_t		rlen = strlen(zklock_root);
	size_t		slen = strlen(space);
	size_t		elen = strlen(encoded);

	Assert(rlen + 1 + slen + elen < ZKL_PARENT_MAX);
	memcpy(parent, zklock_root, rlen);
	parent[rlen] = '/';
	memcpy(parent + rlen + 1, space, slen);
	memcpy(parent + rlen + 1 + slen, encoded, elen + 1);
}

/*
 * The parent path of a name under the root, in a space of its own ("" for
 * locks).  *name is the name as given, for messages.
 */
static void
make_parent(text *arg, const char *space, char parent[ZKL_PARENT_MAX],
			char **name)
{
	char		encoded[ZKN_ENCODED_MAX];
	char	   *utf8;
	int			len;
	ErrorContextCallback errcallback;

	*name = text_to_cstring(arg);
	len = strlen(*name);

	utf8 = *name;
	if (GetDatabaseEncoding() != PG_SQL_ASCII)
	{
		errcallback.callback = name_conversion_context;
		errcallback.arg = NULL;
		errcallback.previous = error_context_stack;
		error_context_stack = &errcallback;
		utf8 = pg_server_to_any(*name, len, PG_UTF8);
		error_context_stack = errcallback.previous;
		len = strlen(utf8);
	}

	switch (zkn_encode_name(utf8, len, encoded))
	{
		case ZKN_EMPTY:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("zklock name must not be empty")));
			break;
		case ZKN_TOO_LONG:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("zklock name is too long"),
					 errdetail("The name is %d bytes long in UTF-8; the limit is %d bytes.",
							   len, ZKN_NAME_MAX)));
			break;
		case ZKN_OK:
			break;
	}
	if (utf8 != *name)
		pfree(utf8);
	join_parent(parent, space, encoded);
}

/*
 * The last name made into a parent, with what it was made under: a job
 * mostly locks one name again and again, and converting and encoding it
 * costs more than the rest of a lock call's own work.  Names longer than
 * the buffer are not remembered.
 */
#define REMEMBERED_NAME_MAX		256

static struct
{
	bool		valid;
	int			len;
	char		name[REMEMBERED_NAME_MAX];	/* as given, not terminated */
	const char *space;
	char		root[ZKL_ROOT_MAX + 1];
	char		parent[ZKL_PARENT_MAX];
}			last_parent;

static void
name_to_parent(text *arg, const char *space, char parent[ZKL_PARENT_MAX],
			   char **name)
{
	int			len = VARSIZE_ANY_EXHDR(arg);

	if (last_parent.valid && last_parent.len == len &&
		last_parent.space == space &&
		memcmp(last_parent.name, VARDATA_ANY(arg), len) == 0 &&
		strcmp(last_parent.root, zklock_root) == 0)
	{
		strcpy(parent, last_parent.parent);
		*name = pnstrdup(last_parent.name, len);
		return;
	}
	last_parent.valid = false;
	make_parent(arg, space, parent, name);
	if (len <= REMEMBERED_NAME_MAX)
	{
		last_parent.len = len;
		memcpy(last_parent.name, VARDATA_ANY(arg), len);
		last_parent.space = space;
		strcpy(last_parent.root, zklock_root);
		strcpy(last_parent.parent, parent);
		last_parent.valid = true;
	}
}

/* The lock name argument and its parent path. */
void
zka_lock_parent(FunctionCallInfo fcinfo, int argno,
				char parent[ZKL_PARENT_MAX], char **name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock name must not be null")));
	name_to_parent(PG_GETARG_TEXT_PP(argno), "", parent, name);
}

/* The semaphore name argument and its parent path. */
void
zka_semaphore_parent(FunctionCallInfo fcinfo, int argno,
					 char parent[ZKL_PARENT_MAX], char **name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock semaphore name must not be null")));
	name_to_parent(PG_GETARG_TEXT_PP(argno), ZKL_SEMAPHORE_SPACE, parent, name);
}

static int
by_parent(const void *a, const void *b)
{
	return strcmp(((const ZkaName *) a)->parent, ((const ZkaName *) b)->parent);
}

/*
 * The names of a text[] argument, each once, in one canonical order
 * whatever order the caller gives: by their node's name.  Two multi-locks
 * then never take two names in opposite orders, so never deadlock each
 * other.  Returns how many.
 */
int
zka_lock_names(FunctionCallInfo fcinfo, int argno, ZkaName **names)
{
	ArrayType  *array;
	Datum	   *elements;
	bool	   *nulls;
	int			n;
	int			kept = 0;
	int			i;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock names must not be null")));
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("zklock names must be a one-dimensional array")));
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT,
					  &elements, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock names must not be an empty array")));
	*names = palloc(n * sizeof(ZkaName));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("zklock names must not contain a null")));
		name_to_parent(DatumGetTextPP(elements[i]), "", (*names)[i].parent,
					   &(*names)[i].name);
	}
	qsort(*names, n, sizeof(ZkaName), by_parent);
	for (i = 0; i < n; i++)
		if (kept == 0 || strcmp((*names)[kept - 1].parent, (*names)[i].parent) != 0)
			(*names)[kept++] = (*names)[i];
	return kept;
}

/* The timeout argument in milliseconds; ZKA_WAIT_FOREVER for 'infinity'. */
int64
zka_timeout_ms(FunctionCallInfo fcinfo, int argno)
{
	Interval   *timeout;
	int64		ms;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock timeout must not be null")));
	timeout = PG_GETARG_INTERVAL_P(argno);
#ifdef INTERVAL_NOT_FINITE
	/* PostgreSQL 17 and later: 'infinity' waits without limit. */
	if (INTERVAL_IS_NOEND(timeout))
		return ZKA_WAIT_FOREVER;
	if (INTERVAL_IS_NOBEGIN(timeout))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock timeout must not be negative")));
#endif
	ms = timeout->time / 1000 +
		((int64) timeout->month * DAYS_PER_MONTH + timeout->day) *
		SECS_PER_DAY * 1000;
	if (ms < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock timeout must not be negative")));
	return ms;
}

/* The semaphore size argument. */
int
zka_slots(FunctionCallInfo fcinfo, int argno)
{
	int32		slots;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("zklock semaphore size must not be null")));
	slots = PG_GETARG_INT32(argno);
	if (slots < 1 || slots > ZKN_SLOTS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock semaphore size must be between 1 and %d",
						ZKN_SLOTS_MAX)));
	return slots;
}
