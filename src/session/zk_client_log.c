/*-------------------------------------------------------------------------
 *
 * zk_client_log.c
 *	  The ZooKeeper client library's own messages: logged by the backend,
 *	  a few at a time, through PostgreSQL's logging, so that log_destination
 *	  (csvlog, jsonlog, syslog) applies to them as to the server's own; and
 *	  what they say of a failed connection (the last TLS complaint, the last
 *	  connection a server closed) kept for the error a backend reports when
 *	  it cannot connect.
 *
 * The library logs on its own threads (and on the backend's, in its calls),
 * where nothing of PostgreSQL may run.  So zkcl_log only queues the message
 * in fixed storage under its own mutex, using nothing of PostgreSQL but
 * strlcpy, and the backend logs what is queued (zks_log_client_messages)
 * where it runs zklock's code anyway: at each lock call, in every wait, at
 * the end of every transaction, when the session is opened, and at exit.
 * A backend idle between statements logs nothing: what the library says
 * meanwhile waits for its next statement, with the time the library wrote
 * it at the head of each line.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "miscadmin.h"

#include "session/zk_session.h"
#include "session/zk_session_int.h"

/*
 * While an ensemble is down the library reports every failed reconnect,
 * many times a second, so let a few lines through per interval and count
 * the rest.
 */
#define CLIENT_LOG_INTERVAL_SEC	10
#define CLIENT_LOG_LINES		5

/*
 * Lines queued for the backend: at the rate above, about a minute of them
 * while it runs no statement.  Longer ones are cut; the library's lines
 * are a few hundred bytes.
 */
#define CLIENT_LOG_SLOTS		32
#define CLIENT_LOG_LINE_SIZE	1024

typedef struct ClientLogLine
{
	int			suppressed_before;	/* by the rate limit, just before it */
	int			dropped_before; /* for want of a free slot, just before it */
	char		text[CLIENT_LOG_LINE_SIZE];	/* "" for counts alone */
} ClientLogLine;

/* Everything below is protected by client_log_mutex. */
static pthread_mutex_t client_log_mutex = PTHREAD_MUTEX_INITIALIZER;
static time_t client_log_interval_start = 0;
static int	client_log_lines = 0;

/* Messages not queued since the last line queued or counts logged. */
static int	client_log_suppressed = 0;
static int	client_log_dropped = 0;

/*
 * Whether anything waits to be logged, queued or counted: read without the
 * mutex, so that the backend's checks (at every lock call and the end of
 * every transaction, zklock's or not) cost one load while the library is
 * quiet.  Written under the mutex, with set_pending_locked.
 */
static int	log_pending = 0;

/* A ring of queued lines: queued_lines of them from first_line on. */
static ClientLogLine queue[CLIENT_LOG_SLOTS];
static int	first_line = 0;
static int	queued_lines = 0;

/*
 * The library says why a TLS handshake failed only in its log: the last
 * such message since the handle was made, for the error a backend reports
 * when it cannot connect.
 */
static char tls_failure[ZKCL_FAILURE_SIZE] = "";

/*
 * A server that takes the connection and closes it before a session is
 * made (this host is over its maxClientCnxns, or it is not serving) sends
 * nothing back; the library logs the socket error, "Socket <server> zk
 * retcode=-4, errno=<e>(...): ...", with an end of stream (which it
 * reports as EHOSTDOWN), a reset or a broken pipe.  The last such message
 * since the handle was made, "" if none.
 */
static char closed_by_server[ZKCL_FAILURE_SIZE] = "";

/* The text of a library message, without its "<time>:...@<where>: ". */
static const char *
message_text(const char *message)
{
	const char *text = strstr(message, "ZOO_");

	text = text ? strstr(text, ": ") : NULL;
	return text ? text + 2 : message;
}

/* Does a library message say that the server closed the connection? */
static bool
says_closed_by_server(const char *message)
{
	const char *e;
	int			error;

	if (strstr(message, "zk retcode=") == NULL ||
		(e = strstr(message, "errno=")) == NULL)
		return false;
	error = atoi(e + strlen("errno="));
	return error == EHOSTDOWN || error == ECONNRESET || error == EPIPE;
}

/*
 * Copy a message into a slot; one too long is cut at a character boundary
 * (the library writes UTF-8) and ends in "...".
 */
static void
copy_line(char *slot, const char *message)
{
	size_t		len;

	if (strlcpy(slot, message, CLIENT_LOG_LINE_SIZE) < CLIENT_LOG_LINE_SIZE)
		return;
	len = CLIENT_LOG_LINE_SIZE - 4;
	while (len > 0 && (slot[len] & 0xC0) == 0x80)
		len--;
	strcpy(slot + len, "...");
}

static void
set_pending_locked(void)
{
	__atomic_store_n(&log_pending,
					 queued_lines > 0 || client_log_suppressed > 0 ||
					 client_log_dropped > 0,
					 __ATOMIC_RELEASE);
}

/* Queue a message, or count it dropped if the queue is full. */
static void
queue_line_locked(const char *message)
{
	ClientLogLine *line;

	if (queued_lines == CLIENT_LOG_SLOTS)
	{
		client_log_dropped++;
		return;
	}
	line = &queue[(first_line + queued_lines) % CLIENT_LOG_SLOTS];
	line->suppressed_before = client_log_suppressed;
	line->dropped_before = client_log_dropped;
	client_log_suppressed = 0;
	client_log_dropped = 0;
	copy_line(line->text, message);
	queued_lines++;
}

/* The library's log callback, on whichever thread logs. */
void
zkcl_log(const char *message)
{
	time_t		now = time(NULL);

	pthread_mutex_lock(&client_log_mutex);
	if (strcasestr(message, "ssl") != NULL)
		strlcpy(tls_failure, message_text(message), sizeof(tls_failure));
	else if (says_closed_by_server(message))
		strlcpy(closed_by_server, message_text(message),
				sizeof(closed_by_server));
	if (now - client_log_interval_start >= CLIENT_LOG_INTERVAL_SEC)
	{
		client_log_interval_start = now;
		client_log_lines = 0;
	}
	if (client_log_lines < CLIENT_LOG_LINES)
	{
		client_log_lines++;
		queue_line_locked(message);
	}
	else
		client_log_suppressed++;
	set_pending_locked();
	pthread_mutex_unlock(&client_log_mutex);
}

/*
 * Take the next line off the queue into *line; with none left, the counts
 * of messages not queued since, if any is due (the suppressed ones once
 * their interval has ended, or at exit), in a line without text.  False
 * if there is nothing to log.
 */
static bool
take_line(ClientLogLine *line, bool at_exit)
{
	bool		found = true;

	pthread_mutex_lock(&client_log_mutex);
	if (queued_lines > 0)
	{
		*line = queue[first_line];
		first_line = (first_line + 1) % CLIENT_LOG_SLOTS;
		queued_lines--;
	}
	else
	{
		line->text[0] = '\0';
		line->suppressed_before = 0;
		line->dropped_before = client_log_dropped;
		client_log_dropped = 0;
		if (at_exit ||
			time(NULL) - client_log_interval_start >= CLIENT_LOG_INTERVAL_SEC)
		{
			line->suppressed_before = client_log_suppressed;
			client_log_suppressed = 0;
		}
		found = line->suppressed_before > 0 || line->dropped_before > 0;
	}
	set_pending_locked();
	pthread_mutex_unlock(&client_log_mutex);
	return found;
}

/*
 * Log one queued line, after the counts of what was not queued before it.
 * Only to the server log (LOG_SERVER_ONLY): the lines are the
 * administrator's, not the client's.  All at LOG, the library's level kept
 * in its text: zklock.client_log_level already chose which levels the
 * library writes, and a library ERROR is not the statement's.  The
 * statement and context that happen to be running are not theirs either.
 */
static void
log_line(const ClientLogLine *line)
{
	if (line->suppressed_before > 0)
		ereport(LOG_SERVER_ONLY,
				(errmsg_plural("zookeeper client: %d more message suppressed",
							   "zookeeper client: %d more messages suppressed",
							   line->suppressed_before,
							   line->suppressed_before),
				 errdetail("At most %d messages of the client library are logged every %d s.",
						   CLIENT_LOG_LINES, CLIENT_LOG_INTERVAL_SEC),
				 errhidestmt(true), errhidecontext(true)));
	if (line->dropped_before > 0)
		ereport(LOG_SERVER_ONLY,
				(errmsg_plural("zookeeper client: %d more message dropped",
							   "zookeeper client: %d more messages dropped",
							   line->dropped_before,
							   line->dropped_before),
				 errdetail("At most %d messages of the client library wait for the backend to log them.",
						   CLIENT_LOG_SLOTS),
				 errhidestmt(true), errhidecontext(true)));
	if (line->text[0] != '\0')
		ereport(LOG_SERVER_ONLY,
				(errmsg("zookeeper client: %s", line->text),
				 errhidestmt(true), errhidecontext(true)));
}

/*
 * Log what the library queued, on the backend's thread.  At most the
 * queue's length, plus the counts: lines queued meanwhile wait for the
 * next time.  ereport(LOG) is safe at transaction end and in error
 * cleanup: it raises nothing, and works in ErrorContext, which keeps room
 * for reporting when memory runs out.
 */
static void
log_queued(bool at_exit)
{
	ClientLogLine line;
	int			i;

	if (!__atomic_load_n(&log_pending, __ATOMIC_ACQUIRE))
		return;

	/*
	 * ereport below ERROR checks for interrupts when done; the waits that
	 * must not be interrupted (a release being confirmed, say) log too.
	 */
	HOLD_INTERRUPTS();
	for (i = 0; i <= CLIENT_LOG_SLOTS && take_line(&line, at_exit); i++)
		log_line(&line);
	RESUME_INTERRUPTS();
}

void
zks_log_client_messages(void)
{
	log_queued(false);
}

/*
 * At exit, once every handle is closed: log everything left, and how many
 * messages were suppressed even if their interval has not ended.
 */
void
zkcl_log_at_exit(void)
{
	log_queued(true);
}

/* A new handle is being made: its complaints start afresh. */
void
zkcl_forget_failures(void)
{
	pthread_mutex_lock(&client_log_mutex);
	tls_failure[0] = '\0';
	closed_by_server[0] = '\0';
	pthread_mutex_unlock(&client_log_mutex);
}

/* The last TLS complaint since the handle was made, "" if none. */
void
zkcl_tls_failure(char *buf, size_t size)
{
	pthread_mutex_lock(&client_log_mutex);
	strlcpy(buf, tls_failure, size);
	pthread_mutex_unlock(&client_log_mutex);
}

/*
 * The last message since the handle was made that says a server closed
 * the connection, "" if none.
 */
void
zkcl_closed_by_server(char *buf, size_t size)
{
	pthread_mutex_lock(&client_log_mutex);
	strlcpy(buf, closed_by_server, size);
	pthread_mutex_unlock(&client_log_mutex);
}
