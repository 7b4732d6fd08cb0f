/*-------------------------------------------------------------------------
 *
 * zk_client_log.c
 *	  The ZooKeeper client library's own messages: passed on to the server
 *	  log, a few at a time, and what they say of a failed connection (the
 *	  last TLS complaint, the last connection a server closed) kept for the
 *	  error a backend reports when it cannot connect.
 *
 * zkcl_log runs on the library's threads, so it uses nothing of PostgreSQL
 * but strlcpy, and only its own mutex.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "zk_session_int.h"

/*
 * The client library's own messages go to standard error, which the server
 * log collects.  While an ensemble is down the library reports every
 * failed reconnect, many times a second, so let a few lines through per
 * interval and count the rest.
 */
#define CLIENT_LOG_INTERVAL_SEC	10
#define CLIENT_LOG_LINES		5

static pthread_mutex_t client_log_mutex = PTHREAD_MUTEX_INITIALIZER;
static time_t client_log_interval_start = 0;
static int	client_log_lines = 0;
static int	client_log_suppressed = 0;

/*
 * The library says why a TLS handshake failed only in its log: the last
 * such message since the handle was made, for the error a backend reports
 * when it cannot connect.  Protected by client_log_mutex.
 */
static char tls_failure[ZKCL_FAILURE_SIZE] = "";

/*
 * A server that takes the connection and closes it before a session is
 * made (this host is over its maxClientCnxns, or it is not serving) sends
 * nothing back; the library logs the socket error, "Socket <server> zk
 * retcode=-4, errno=<e>(...): ...", with an end of stream (which it
 * reports as EHOSTDOWN), a reset or a broken pipe.  The last such message
 * since the handle was made, "" if none.  Protected by client_log_mutex.
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
		if (client_log_suppressed > 0)
			fprintf(stderr, "zklock: %d more ZooKeeper client messages suppressed\n",
					client_log_suppressed);
		client_log_interval_start = now;
		client_log_lines = 0;
		client_log_suppressed = 0;
	}
	if (client_log_lines < CLIENT_LOG_LINES)
	{
		client_log_lines++;
		fprintf(stderr, "zklock: %s\n", message);
	}
	else
		client_log_suppressed++;
	pthread_mutex_unlock(&client_log_mutex);
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
