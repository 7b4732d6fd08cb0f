/*-------------------------------------------------------------------------
 *
 * zk_shared.c
 *	  What each backend shows the rest of its server in shared memory: its
 *	  zklock holds, its current wait, its session's state, and per-lock
 *	  statistics; and the backend's own counters, which zk_status() shows.
 *
 * Only with zklock in shared_preload_libraries: the memory is sized at
 * server start from zklock.max_shown_holds (hold slots, one per backend,
 * lock name and mode) and zklock.max_tracked_names (lock names whose
 * statistics are kept), plus one wait slot per possible backend.  Without
 * it nothing is shown to other backends, and the views show the calling
 * backend alone; the backend's own counters are kept either way.
 *
 * Publishing costs no ZooKeeper request: a backend writes its own slots
 * under one LWLock when its holds change (zk_holds.c), when it really
 * waits and when that wait ends (zk_recipe.c, zk_holds.c; an acquire
 * granted at once shows no wait), and counts into the statistics
 * (zksh_count, from zklock.c and the others) under the same lock, held shared, plus a
 * spinlock per name.  A session's state changes on the session's own
 * threads, which may not take an LWLock: they write it to the backend's
 * session slot atomically (zks_show_state_in), and stop before the slot is
 * freed at exit.  When a slot cannot be had (all in use, or too many
 * names tracked), what it would have shown is not shown, with one WARNING
 * per backend and setting; a lock call never fails for it.
 *
 * Every structure is sized at server start and never grows: the
 * statistics hash is fixed-size, so it never draws on the server's spare
 * shared memory, which the lock manager needs, and a reset returns its
 * entries to its own free list.  Since any role may take locks, no one
 * role may fill more than three quarters of the hold slots, so that one
 * role cannot hide every other role's holds.
 *
 * Names are kept in UTF-8, as ZooKeeper has them (decoded from the lock's
 * parent path), and shown in each reader's database encoding.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "base/zk_layout.h"
#include "session/zk_session.h"
#include "shared/zk_shared.h"
#include "shared/zk_title.h"

/* Settings; their defaults are in zksh_define_settings. */
static int	max_shown_holds;
static int	max_tracked_names;

typedef struct StatKey
{
	char		name[ZKN_NAME_MAX + 1];
} StatKey;

typedef struct StatEntry
{
	StatKey		key;			/* hash key: the UTF-8 name */
	slock_t		mutex;			/* protects the counters */
	int64		counters[ZKSH_NCOUNTERS];
} StatEntry;

/*
 * The share of the hold slots one role may take: all but a quarter, which
 * is kept for the other roles.
 */
#define ROLE_SHARE(nholds)		((nholds) - (nholds) / 4)

/*
 * A backend's ZooKeeper session.  The backend sets pid and database under
 * the lock; its session's watchdog thread, which may not take an LWLock,
 * writes the state itself (zks_show_state_in).
 */
typedef struct SessionSlot
{
	int			pid;			/* 0: free */
	Oid			database;
	pg_atomic_uint32 state;		/* ZKS_SHOWN_CLOSED, or ZKS_SHOWN_OPEN + ZksState */
	pg_atomic_uint32 since;		/* its last change, in seconds since 1970 */
} SessionSlot;

typedef struct SharedState
{
	LWLock	   *lock;
	int			nholds;
	int			nfree;			/* hold slots with pid 0 */
	int			free_hint;		/* where to look for one first */
	int			nwaits;			/* also the number of session slots */
	uint64		stats_resets;	/* zksh_reset_stats calls */
	TimestampTz stats_reset_at; /* the last one */
	ZkshHold   *holds;			/* pid 0: free */
	ZkshWait   *waits;			/* pid 0: free */
	SessionSlot *sessions;
} SharedState;

static SharedState *state = NULL;
static HTAB *stats = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* This backend's wait slot (index + 1; 0: none yet). */
static int	my_wait = 0;

/* This backend's session slot (index + 1; 0: none yet). */
static int	my_session = 0;

/*
 * The lock this backend is acquiring, kept here until it really waits
 * (zksh_wait_node): an acquire that is granted at once shows nothing.
 */
static ZkshWait acquiring;
static const char *acquiring_parent;	/* the caller's, until zksh_wait_end */
static bool wait_shown = false;
static bool exit_callback_registered = false;

/*
 * Set once this backend's slots are freed as it exits: the transaction
 * callbacks that end its holds run after that (ShutdownPostgres), and must
 * not take a slot again.
 */
static bool exited = false;
static bool warned_full_holds = false;
static bool warned_full_names = false;

/*
 * Settings that size the shared memory; only when zklock is preloaded, as
 * a server-start setting cannot be defined later.
 */
void
zksh_define_settings(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("zklock.max_shown_holds",
							"Sets how many zklock holds the server-wide zk_locks view can show.",
							"One per backend, lock name and mode.  Takes effect at server start, with zklock in shared_preload_libraries.",
							&max_shown_holds,
							1000, 16, INT_MAX / 2,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("zklock.max_tracked_names",
							"Sets how many lock names zk_stat_locks keeps statistics for.",
							"Takes effect at server start, with zklock in shared_preload_libraries.",
							&max_tracked_names,
							1000, 16, INT_MAX / 2,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);
}

/* The state, hold, wait and session slots: all but the statistics. */
static Size
slots_size(void)
{
	Size		size = MAXALIGN(sizeof(SharedState));

	size = add_size(size, mul_size(max_shown_holds, sizeof(ZkshHold)));
	size = add_size(size, mul_size(MaxBackends, sizeof(ZkshWait)));
	return add_size(size, mul_size(MaxBackends, sizeof(SessionSlot)));
}

static Size
shared_size(void)
{
	return add_size(slots_size(), hash_estimate_size(max_tracked_names,
													 sizeof(StatEntry)));
}

static void
request_shmem(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(shared_size());
	RequestNamedLWLockTranche("zklock", 1);
}

static void
startup_shmem(void)
{
	bool		found;
	HASHCTL		ctl;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	state = ShmemInitStruct("zklock", slots_size(), &found);
	if (!found)
	{
		char	   *next = (char *) state + MAXALIGN(sizeof(SharedState));
		int			i;

		state->lock = &(GetNamedLWLockTranche("zklock"))->lock;
		state->nholds = max_shown_holds;
		state->nfree = max_shown_holds;
		state->free_hint = 0;
		state->nwaits = MaxBackends;
		state->stats_resets = 0;
		state->stats_reset_at = 0;
		state->holds = (ZkshHold *) next;
		state->waits = (ZkshWait *) (next + max_shown_holds * sizeof(ZkshHold));
		state->sessions = (SessionSlot *) (next + max_shown_holds * sizeof(ZkshHold) +
										   MaxBackends * sizeof(ZkshWait));
		memset(state->holds, 0, max_shown_holds * sizeof(ZkshHold));
		for (i = 0; i < max_shown_holds; i++)
			pg_atomic_init_u32(&state->holds[i].kept, 0);
		memset(state->waits, 0, MaxBackends * sizeof(ZkshWait));
		for (i = 0; i < MaxBackends; i++)
		{
			state->sessions[i].pid = 0;
			pg_atomic_init_u32(&state->sessions[i].state, ZKS_SHOWN_CLOSED);
			pg_atomic_init_u32(&state->sessions[i].since, 0);
		}
	}
	ctl.keysize = sizeof(StatKey);
	ctl.entrysize = sizeof(StatEntry);
	stats = ShmemInitHash("zklock statistics", max_tracked_names,
						  max_tracked_names, &ctl,
						  HASH_ELEM | HASH_STRINGS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* From _PG_init: ask for the memory, when loaded at server start. */
void
zksh_request_shmem(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = request_shmem;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = startup_shmem;
}

bool
zksh_enabled(void)
{
	return state != NULL;
}

/*
 * The lock name a parent path stands for, in UTF-8 (raw if undecodable).
 * The last one is remembered: a job mostly locks one name.
 */
void
zksh_name_of(const char *parent, char name[ZKN_NAME_MAX + 1])
{
	static char last_parent[ZKN_WAIT_PARENT_MAX];
	static char last_name[ZKN_NAME_MAX + 1];
	const char *last = zkl_basename(parent);
	size_t		len;

	if (strcmp(parent, last_parent) == 0)
	{
		strcpy(name, last_name);
		return;
	}
	if (!zkn_decode_name(last, name, ZKN_NAME_MAX + 1, &len))
		strlcpy(name, last, ZKN_NAME_MAX + 1);
	if (strlen(parent) < sizeof(last_parent))
	{
		strcpy(last_parent, parent);
		strcpy(last_name, name);
	}
}

/*
 * The hold slots are full (or this role has its share of them): once per
 * backend.
 */
static void
warn_holds_full(void)
{
	if (warned_full_holds)
		return;
	warned_full_holds = true;
	ereport(WARNING,
			(errmsg("zklock has no room left in shared memory for zklock.max_shown_holds"),
			 errdetail("Holds that do not fit are not shown server-wide; locking is not affected.  One role may take at most three quarters of zklock.max_shown_holds."),
			 errhint("Raise zklock.max_shown_holds and restart the server.")));
}

/*
 * The statistics table is full: once per backend.  Any role that locks
 * fills it, and only a reset empties it, so say who may reset it.
 */
static void
warn_names_full(void)
{
	if (warned_full_names)
		return;
	warned_full_names = true;
	ereport(WARNING,
			(errmsg("zklock has no room left in shared memory for zklock.max_tracked_names"),
			 errdetail("Lock names that do not fit get no statistics in zk_stat_locks; locking is not affected.  Any role that takes locks adds names, and the names stay until zk_stat_locks_reset() is called."),
			 errhint("Ask a superuser, or a role granted EXECUTE on zk_stat_locks_reset(), to call it, or raise zklock.max_tracked_names and restart the server.")));
}

/* Free hold slot i.  Caller holds the lock exclusively. */
static void
free_slot_locked(int i)
{
	if (state->holds[i].pid == 0)
		return;
	state->holds[i].pid = 0;
	state->nfree++;
}

/*
 * A free hold slot for this backend's role, or 0: one role may take no more
 * than its share, which matters only once few slots are left.  Caller holds
 * the lock exclusively.
 */
static int
take_slot_locked(void)
{
	Oid			role = GetUserId();
	int			i;

	if (state->nfree == 0)
		return 0;
	if (state->nfree <= state->nholds - ROLE_SHARE(state->nholds))
	{
		int			taken = 0;

		for (i = 0; i < state->nholds; i++)
			taken += state->holds[i].pid != 0 && state->holds[i].role == role;
		if (taken >= ROLE_SHARE(state->nholds))
			return 0;
	}
	for (i = 0; i < state->nholds; i++)
	{
		int			at = (state->free_hint + i) % state->nholds;

		if (state->holds[at].pid == 0)
		{
			state->holds[at].role = role;
			state->holds[at].pid = MyProcPid;
			state->nfree--;
			state->free_hint = (at + 1) % state->nholds;
			return at + 1;
		}
	}
	return 0;
}

static void count_hold_locked(const ZkshHold *h, TimestampTz now);

/* Free every slot of this backend as it exits: its holds end. */
static void
drop_all_at_exit(int code, Datum arg)
{
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	/*
	 * The session outlives this callback: stop it writing to its slot, and
	 * to the kept flags of the hold slots.
	 */
	if (my_session > 0)
		zks_show_state_in(NULL, NULL);
	zks_forget_kept_shown();
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	for (i = 0; i < state->nholds; i++)
		if (state->holds[i].pid == MyProcPid)
		{
			count_hold_locked(&state->holds[i], now);
			free_slot_locked(i);
		}
	if (my_wait > 0)
	{
		state->waits[my_wait - 1].pid = 0;
		state->waits[my_wait - 1].since = 0;
	}
	if (my_session > 0)
		state->sessions[my_session - 1].pid = 0;
	LWLockRelease(state->lock);
	my_wait = 0;
	my_session = 0;
	wait_shown = false;
	exited = true;
}

static void
register_exit_callback(void)
{
	if (exit_callback_registered)
		return;
	before_shmem_exit(drop_all_at_exit, (Datum) 0);
	exit_callback_registered = true;
}

/*
 * Show one hold: in slot (index + 1), or in a free slot if slot is 0.
 * Returns the slot used, or 0 if none was free.
 */
int
zksh_put_hold(int slot, const char *parent, bool shared, bool semaphore,
			  bool lost, int session_count, int xact_count, const char *node,
			  int64 token, TimestampTz since)
{
	ZkshHold   *h;
	bool		taken = false;

	if (state == NULL || exited)
		return 0;
	register_exit_callback();
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	if (slot == 0)
	{
		slot = take_slot_locked();
		taken = slot != 0;
	}
	if (slot == 0)
	{
		LWLockRelease(state->lock);
		warn_holds_full();
		return 0;
	}
	h = &state->holds[slot - 1];

	/* A slot shows one node of one lock from first to last: set those once. */
	if (taken)
	{
		size_t		len = strlen(node);

		h->database = MyDatabaseId;
		zksh_name_of(parent, h->name);
		h->shared = shared;
		h->semaphore = semaphore;
		if (len >= sizeof(h->node))
			len = sizeof(h->node) - 1;
		memcpy(h->node, node, len);
		h->node[len] = '\0';
		pg_atomic_write_u32(&h->kept, 0);
	}
	h->lost = lost;
	h->session_count = session_count;
	h->xact_count = xact_count;
	h->token = token;
	h->since = since;
	LWLockRelease(state->lock);
	return slot;
}

/*
 * Show this backend's session server-wide from now on (called before the
 * first one opens): the session keeps the state shown up to date.
 */
void
zksh_show_session(void)
{
	SessionSlot *slot = NULL;
	int			i;

	if (my_session != 0 || state == NULL || exited)
		return;
	register_exit_callback();
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	for (i = 0; i < state->nwaits && slot == NULL; i++)
		if (state->sessions[i].pid == 0)
		{
			slot = &state->sessions[i];
			slot->pid = MyProcPid;
			slot->database = MyDatabaseId;
			pg_atomic_write_u32(&slot->state, ZKS_SHOWN_CLOSED);
			pg_atomic_write_u32(&slot->since, 0);
			my_session = i + 1;
		}
	LWLockRelease(state->lock);
	if (slot != NULL)
		zks_show_state_in(&slot->state, &slot->since);
}

/*
 * The hold shown in slot ended, and its node is kept (zklock.keep_released):
 * count the hold's end, and show the slot as kept from now on.  Returns the
 * slot's kept flag, for the session to clear when it gives the node up, or
 * NULL if nothing is shown.
 */
pg_atomic_uint32 *
zksh_keep_hold(int slot)
{
	ZkshHold   *h;

	if (state == NULL || slot == 0 || exited)
		return NULL;
	h = &state->holds[slot - 1];
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	count_hold_locked(h, GetCurrentTimestamp());
	h->session_count = 0;
	h->xact_count = 0;
	h->since = 0;				/* counted: dropping it counts nothing */
	LWLockRelease(state->lock);
	return &h->kept;
}

/* The hold shown in slot ended: count it, and free the slot. */
void
zksh_drop_hold(int slot)
{
	TimestampTz now;

	if (state == NULL || slot == 0 || exited)
		return;
	now = GetCurrentTimestamp();
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	count_hold_locked(&state->holds[slot - 1], now);
	free_slot_locked(slot - 1);
	LWLockRelease(state->lock);
}

/*
 * This backend is about to acquire the lock under parent, called name
 * (both must stay as they are until zksh_wait_end); nothing is shown until
 * it waits.
 */
void
zksh_wait_begin(const char *parent, const char *name, bool shared,
				bool semaphore, bool xact)
{
	if (state != NULL)
	{
		acquiring_parent = parent;
		acquiring.shared = shared;
		acquiring.semaphore = semaphore;
		acquiring.xact = xact;
		acquiring.node[0] = '\0';
	}
	zkti_prepare(name, shared, semaphore);
}

/*
 * Show that this backend waits, with this node, for the lock it acquires:
 * server-wide, and in its process title.
 */
void
zksh_wait_node(const char *node)
{
	ZkshWait   *w;

	zkti_waiting();
	if (state == NULL || exited ||
		(wait_shown && strcmp(acquiring.node, node) == 0))
		return;
	/* Only a lock call that waits pays for these. */
	if (!wait_shown)
	{
		zksh_name_of(acquiring_parent, acquiring.name);
		acquiring.since = GetCurrentTimestamp();
	}
	strlcpy(acquiring.node, node, sizeof(acquiring.node));
	register_exit_callback();
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	if (my_wait == 0)
	{
		int			i;

		for (i = 0; i < state->nwaits && my_wait == 0; i++)
			if (state->waits[i].pid == 0)
				my_wait = i + 1;
	}
	if (my_wait > 0)
	{
		w = &state->waits[my_wait - 1];
		*w = acquiring;
		w->pid = MyProcPid;
		w->database = MyDatabaseId;
		wait_shown = true;
	}
	LWLockRelease(state->lock);
}

/* Never raises an ERROR: it runs on the way out of one too. */
void
zksh_wait_end(void)
{
	zkti_done();
	if (!wait_shown)
		return;
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	state->waits[my_wait - 1].since = 0;
	LWLockRelease(state->lock);
	wait_shown = false;
}

static void count_shared(const char *parent, const ZkshCounter *counters,
						 const int64 *amounts, int n);

/* Count to an entry found under the lock, held in either mode; releases it. */
static void
count_locked(StatEntry *entry, const ZkshCounter *counters,
			 const int64 *amounts, int n)
{
	int			i;

	SpinLockAcquire(&entry->mutex);
	for (i = 0; i < n; i++)
		entry->counters[counters[i]] += amounts[i];
	SpinLockRelease(&entry->mutex);
	LWLockRelease(state->lock);
}

/* This backend's counters, for zk_status(). */
static int64 backend_counts[ZKSH_NCOUNTERS];

int64
zksh_backend_count(ZkshCounter counter)
{
	return backend_counts[counter];
}

/*
 * Add amount to one of this backend's counters and, for a lock (not a
 * semaphore, which may share its name), to that lock's statistics.
 */
void
zksh_count(const char *parent, bool semaphore, ZkshCounter counter,
		   int64 amount)
{
	backend_counts[counter] += amount;
	if (!semaphore)
		count_shared(parent, &counter, &amount, 1);
}

const int	zksh_wait_bounds_ms[ZKSH_WAIT_BUCKETS] = {
	1, 10, 100, 1000, 10000, 60000, 600000
};

const int	zksh_hold_bounds_ms[ZKSH_HOLD_BUCKETS] = {
	10, 100, 1000, 10000, 60000, 600000, 3600000, 86400000
};

/*
 * Count a wait that ended (granted or timed out) after wait_us: its number,
 * its time and its bucket, under one lock.  A wait past the last bound is
 * in no bucket: the histogram's "+Inf" is the number of waits.
 */
void
zksh_count_wait(const char *parent, bool semaphore, int64 wait_us)
{
	ZkshCounter counters[3] = {ZKSH_WAITS, ZKSH_WAIT_TIME_US};
	int64		amounts[3] = {1, wait_us, 1};
	int			n = 2;
	int			i;

	for (i = 0; i < ZKSH_WAIT_BUCKETS; i++)
		if (wait_us <= (int64) zksh_wait_bounds_ms[i] * 1000)
		{
			counters[n++] = ZKSH_WAIT_BUCKET + i;
			break;
		}
	for (i = 0; i < n; i++)
		backend_counts[counters[i]] += amounts[i];
	if (!semaphore)
		count_shared(parent, counters, amounts, n);
}

/*
 * The statistics entry this backend counted to last, and the parent it is
 * for: a job mostly locks one name, and finding its entry costs more than
 * counting.  Entries go only with a reset, which stats_resets tells.
 */
static StatEntry *last_entry = NULL;
static uint64 last_entry_resets;
static char last_entry_parent[ZKN_WAIT_PARENT_MAX];

/* Add amounts to n statistics of the lock under parent. */
static void
count_shared(const char *parent, const ZkshCounter *counters,
			 const int64 *amounts, int n)
{
	StatKey		key;
	StatEntry  *entry;

	if (state == NULL)
		return;
	LWLockAcquire(state->lock, LW_SHARED);
	if (last_entry != NULL && last_entry_resets == state->stats_resets &&
		strcmp(last_entry_parent, parent) == 0)
	{
		count_locked(last_entry, counters, amounts, n);
		return;
	}
	zksh_name_of(parent, key.name);
	entry = hash_search(stats, &key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		bool		found;

		LWLockRelease(state->lock);
		LWLockAcquire(state->lock, LW_EXCLUSIVE);

		/*
		 * Full: refused here, since even a fixed-size hash that is full
		 * would first grow its directory, from the server's spare memory.
		 */
		entry = hash_search(stats, &key, HASH_FIND, NULL);
		if (entry == NULL && hash_get_num_entries(stats) >= max_tracked_names)
		{
			LWLockRelease(state->lock);
			warn_names_full();
			return;
		}
		if (entry == NULL)
			entry = hash_search(stats, &key, HASH_ENTER_NULL, &found);
		else
			found = true;
		if (entry == NULL)
		{
			LWLockRelease(state->lock);
			warn_names_full();
			return;
		}
		if (!found)
		{
			SpinLockInit(&entry->mutex);
			memset(entry->counters, 0, sizeof(entry->counters));
		}
	}
	last_entry = NULL;
	if (strlen(parent) < sizeof(last_entry_parent))
	{
		strcpy(last_entry_parent, parent);
		last_entry = entry;
		last_entry_resets = state->stats_resets;
	}
	count_locked(entry, counters, amounts, n);
}

/* Copies of every backend's holds, for zk_locks.  Returns how many. */
int
zksh_holds(ZkshHold **holds)
{
	int			n = 0;
	int			i;

	*holds = NULL;
	if (state == NULL)
		return 0;
	*holds = palloc(state->nholds * sizeof(ZkshHold));
	LWLockAcquire(state->lock, LW_SHARED);
	for (i = 0; i < state->nholds; i++)
		if (state->holds[i].pid != 0)
			(*holds)[n++] = state->holds[i];
	LWLockRelease(state->lock);
	return n;
}

/* Every backend's session, as last shown.  Returns how many. */
int
zksh_sessions(ZkshSession **sessions)
{
	int			n = 0;
	int			i;

	*sessions = NULL;
	if (state == NULL)
		return 0;
	*sessions = palloc(state->nwaits * sizeof(ZkshSession));
	LWLockAcquire(state->lock, LW_SHARED);
	for (i = 0; i < state->nwaits; i++)
	{
		SessionSlot *slot = &state->sessions[i];
		ZkshSession *s = &(*sessions)[n];
		uint32		since;

		if (slot->pid == 0)
			continue;
		s->pid = slot->pid;
		s->database = slot->database;
		s->state = pg_atomic_read_u32(&slot->state);
		pg_read_barrier();
		since = pg_atomic_read_u32(&slot->since);
		s->since = since == 0 ? 0 : time_t_to_timestamptz((pg_time_t) since);
		n++;
	}
	LWLockRelease(state->lock);
	return n;
}

/* Copies of every backend's current wait.  Returns how many. */
int
zksh_waits(ZkshWait **waits)
{
	int			n = 0;
	int			i;

	*waits = NULL;
	if (state == NULL)
		return 0;
	*waits = palloc(state->nwaits * sizeof(ZkshWait));
	LWLockAcquire(state->lock, LW_SHARED);
	for (i = 0; i < state->nwaits; i++)
		if (state->waits[i].pid != 0 && state->waits[i].since != 0)
			(*waits)[n++] = state->waits[i];
	LWLockRelease(state->lock);
	return n;
}

/* The current wait of the backend with this pid; false if it waits for none. */
bool
zksh_wait_of(int pid, ZkshWait *wait)
{
	bool		found = false;
	int			i;

	if (state == NULL)
		return false;
	LWLockAcquire(state->lock, LW_SHARED);
	for (i = 0; i < state->nwaits && !found && pid > 0; i++)
	{
		if (state->waits[i].pid == pid && state->waits[i].since != 0)
		{
			*wait = state->waits[i];
			found = true;
		}
	}
	LWLockRelease(state->lock);
	return found;
}

/* Copies of the statistics of every tracked name.  Returns how many. */
int
zksh_stats(ZkshStats **out)
{
	HASH_SEQ_STATUS status;
	StatEntry  *entry;
	int			n = 0;

	*out = NULL;
	if (state == NULL)
		return 0;
	LWLockAcquire(state->lock, LW_SHARED);
	*out = palloc(Max(hash_get_num_entries(stats), 1) * sizeof(ZkshStats));
	hash_seq_init(&status, stats);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		memcpy((*out)[n].name, entry->key.name, sizeof(entry->key.name));
		SpinLockAcquire(&entry->mutex);
		memcpy((*out)[n].counters, entry->counters, sizeof(entry->counters));
		SpinLockRelease(&entry->mutex);
		n++;
	}
	LWLockRelease(state->lock);
	return n;
}

void
zksh_reset_stats(void)
{
	HASH_SEQ_STATUS status;
	StatEntry  *entry;

	if (state == NULL)
		return;
	LWLockAcquire(state->lock, LW_EXCLUSIVE);
	hash_seq_init(&status, stats);
	while ((entry = hash_seq_search(&status)) != NULL)
		hash_search(stats, &entry->key, HASH_REMOVE, NULL);
	state->stats_resets++;
	state->stats_reset_at = GetCurrentTimestamp();
	LWLockRelease(state->lock);
}

/*
 * Count a hold of a lock that ended at now: its number, its time and its
 * bucket, as zksh_count_wait counts a wait.  The hold's slot has its name
 * and grant time, and the caller holds the lock exclusively, so this costs
 * a release no more than a name comparison and a spinlock: the entry is
 * the one this backend counted the acquisition to, unless it locked
 * another name since.  Not counted: a semaphore's slot, a hold already
 * lost, one granted before the last reset (its acquisition was not
 * counted), and a name the statistics do not track.
 */
static void
count_hold_locked(const ZkshHold *h, TimestampTz now)
{
	StatEntry  *entry = last_entry;
	int64		held_us;
	int			i;

	if (h->pid == 0 || h->semaphore || h->lost || h->since == 0 ||
		h->since < state->stats_reset_at)
		return;
	if (entry == NULL || last_entry_resets != state->stats_resets ||
		strcmp(entry->key.name, h->name) != 0)
	{
		StatKey		key;

		strlcpy(key.name, h->name, sizeof(key.name));
		entry = hash_search(stats, &key, HASH_FIND, NULL);
		if (entry == NULL)
			return;
	}
	held_us = Max(now - h->since, 0);
	SpinLockAcquire(&entry->mutex);
	entry->counters[ZKSH_RELEASES]++;
	entry->counters[ZKSH_HOLD_TIME_US] += held_us;
	for (i = 0; i < ZKSH_HOLD_BUCKETS; i++)
		if (held_us <= (int64) zksh_hold_bounds_ms[i] * 1000)
		{
			entry->counters[ZKSH_HOLD_BUCKET + i]++;
			break;
		}
	SpinLockRelease(&entry->mutex);
}
