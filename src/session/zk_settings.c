/*-------------------------------------------------------------------------
 *
 * zk_settings.c
 *	  The settings a ZooKeeper session is made with: where it connects, as
 *	  whom (digest credentials and the ACL of the nodes it creates) and over
 *	  what (TLS), and whether the open session still matches them; and how
 *	  long it may stay open holding nothing.
 *
 * Everything here runs on the backend's own thread, under PostgreSQL's
 * rules: the client library's threads never read a setting.  What a
 * session was opened with is kept (zkset_remember_opened), so that a
 * session made for other hosts, credentials or TLS files is not used on:
 * the hold table closes it once nothing is held (zks_settings_changed),
 * and the next lock opens one with the new settings.
 * Secrets (zklock.auth, the file's contents, zklock.tls_key_password) are
 * never shown; the copies made to hand them to the library are wiped once
 * handed over, while the opened session's settings keep zklock.auth and
 * the TLS password to compare them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_OPENSSL_H
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

#include "common/hashfn.h"
#include "storage/fd.h"
#include "utils/guc.h"

#include "base/zk_memory.h"
#include "session/zk_session.h"
#include "session/zk_session_int.h"

/* Settings; their defaults are in zks_define_settings. */
static char *zklock_hosts = NULL;
static int	zklock_session_timeout;
int			zklock_connect_timeout;
static int	zklock_client_log_level;
static char *zklock_auth = NULL;
static char *zklock_auth_file = NULL;
static bool zklock_world_readable;
static char *zklock_tls_ca = NULL;
static char *zklock_tls_cert = NULL;
static char *zklock_tls_key = NULL;
static char *zklock_tls_key_password = NULL;
static int	zklock_idle_session_timeout;

static const struct config_enum_entry client_log_levels[] = {
	{"error", ZOO_LOG_LEVEL_ERROR, false},
	{"warn", ZOO_LOG_LEVEL_WARN, false},
	{"info", ZOO_LOG_LEVEL_INFO, false},
	{"debug", ZOO_LOG_LEVEL_DEBUG, false},
	{NULL, 0, false}
};

/*
 * Bumped by every assignment of a setting the session is made with, so
 * that a lock call compares them only after one may have changed.
 */
static uint64 settings_generation = 1;

static void
settings_assigned(void)
{
	settings_generation++;
}

static void
string_setting_assigned(const char *newval, void *extra)
{
	settings_assigned();
}

static void
bool_setting_assigned(bool newval, void *extra)
{
	settings_assigned();
}

static void
int_setting_assigned(int newval, void *extra)
{
	settings_assigned();
}

/* The settings the open session was made with. */
typedef struct SessionSettings
{
	uint64		generation;		/* settings_generation when last compared */
	char	   *hosts;
	char	   *auth;			/* zklock.auth as set */
	char	   *auth_file;		/* zklock.auth_file as set */
	char	   *tls;			/* the zklock.tls_* settings, one per line */
	int			session_timeout;
	int			client_log_level;
	bool		world_readable;
} SessionSettings;

static SessionSettings opened;

/*
 * The ACL for the nodes this session creates: open to all without
 * zklock.auth; with it, everything for the authenticated creator and, if
 * zklock.world_readable, reading for anyone.
 */
static struct ACL creator_acl_entries[2];
struct ACL_vector zks_node_acl;

/*
 * Who the open session is to the servers, as far as their ACLs go: bumped
 * when a session is opened with other hosts, credentials or TLS files
 * than the one before, so that what was judged of ACLs for the one is not
 * taken for the other (zk_acl_check.c).  Only a hash of the credentials is
 * kept.  has_credentials says whether the open session has any.
 */
static uint64 identity_generation = 0;
static uint32 identity_hash = 0;
static bool has_credentials = false;

static void
note_identity(const char *credentials)
{
	uint32		hash = hash_combine(hash_combine(hash_bytes((const unsigned char *) opened.hosts,
															 strlen(opened.hosts)),
											  hash_bytes((const unsigned char *) credentials,
														 strlen(credentials))),
									hash_bytes((const unsigned char *) opened.tls,
											   strlen(opened.tls)));

	if (identity_generation == 0 || hash != identity_hash)
		identity_generation++;
	identity_hash = hash;
	has_credentials = credentials[0] != '\0';
}

/*
 * Open a file named by a setting; ERROR if it cannot be read.  With secret,
 * the file must be owned by the server's user and readable by it alone, as
 * PostgreSQL asks of its TLS key.
 */
static FILE *
open_setting_file(const char *path, const char *setting, bool secret)
{
	FILE	   *file = AllocateFile(path, "r");
	struct stat st;

	if (file == NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not open %s \"%s\": %m", setting, path)));
	if (fstat(fileno(file), &st) != 0)
	{
		int			save_errno = errno;

		FreeFile(file);
		errno = save_errno;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not stat %s \"%s\": %m", setting, path)));
	}
	if (!S_ISREG(st.st_mode) ||
		(secret && (st.st_uid != geteuid() || (st.st_mode & (S_IRWXG | S_IRWXO)))))
	{
		FreeFile(file);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 secret ?
				 errmsg("%s \"%s\" must be a file owned by the database server's user and readable by no one else",
						setting, path) :
				 errmsg("%s \"%s\" must be a regular file", setting, path),
				 secret ? errhint("Make it owned by the server's user, with mode 0600.") : 0));
	}
	return file;
}

/*
 * The credentials in zklock.auth_file: its first line.  What it holds
 * never appears in a message.
 */
static char *
read_auth_file(const char *path)
{
	FILE	   *file = open_setting_file(path, "zklock.auth_file", true);
	char		line[1024];
	char	   *colon;
	bool		readable;

	readable = fgets(line, sizeof(line), file) != NULL;
	FreeFile(file);
	line[strcspn(line, "\r\n")] = '\0';
	colon = readable ? strchr(line, ':') : NULL;
	if (colon == NULL || colon == line)
	{
		explicit_bzero(line, sizeof(line));
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("zklock.auth_file \"%s\" must hold \"user:password\" on its first line",
						path)));
	}
	return pstrdup(line);
}

/* Whatever zklock.auth holds, it is shown as this, to everyone. */
static const char *
show_auth(void)
{
	return zklock_auth && zklock_auth[0] != '\0' ? "********" : "";
}

/* Whatever zklock.tls_key_password holds, it is shown as this, to everyone. */
static const char *
show_tls_key_password(void)
{
	return zklock_tls_key_password && zklock_tls_key_password[0] != '\0' ?
		"********" : "";
}

/* Digest credentials are "user:password" with a non-empty user. */
static bool
check_auth(char **newval, void **extra, GucSource source)
{
	const char *colon = strchr(*newval, ':');

	if ((*newval)[0] != '\0' && (colon == NULL || colon == *newval))
	{
		GUC_check_errdetail("zklock.auth must have the form \"user:password\".");
		return false;
	}
	return true;
}

/* The settings of the session: where to connect, how, and as whom. */
void
zks_define_settings(void)
{
	DefineCustomStringVariable("zklock.hosts",
							   "Sets the ZooKeeper servers to connect to, such as \"zk1:2181,zk2:2181,zk3:2181\".",
							   "Takes effect when the backend next opens a ZooKeeper session.",
							   &zklock_hosts,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, string_setting_assigned, NULL);
	DefineCustomStringVariable("zklock.auth",
							   "Sets the ZooKeeper digest credentials, \"user:password\", of each session.",
							   "When set, zklock's nodes are created with the creator-all ACL.  Its value is never shown; zklock.auth_file keeps it out of the settings altogether.",
							   &zklock_auth,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   check_auth, string_setting_assigned, show_auth);
	DefineCustomStringVariable("zklock.auth_file",
							   "Sets the file that holds the ZooKeeper digest credentials, \"user:password\" on its first line.",
							   "It must be owned by the server's user and readable by no one else.  Read when a session is opened.",
							   &zklock_auth_file,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, string_setting_assigned, NULL);
	DefineCustomBoolVariable("zklock.world_readable",
							 "Sets whether, with zklock.auth, anyone may read zklock's nodes (not change them).",
							 NULL,
							 &zklock_world_readable,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, bool_setting_assigned, NULL);
	DefineCustomStringVariable("zklock.tls_ca",
							   "Sets the file of the CA certificate (PEM) that signed the ZooKeeper servers' certificates.",
							   "With zklock.tls_cert and zklock.tls_key, sessions use TLS, trusting this CA only.  Needs a TLS-capable build.",
							   &zklock_tls_ca,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, string_setting_assigned, NULL);
	DefineCustomStringVariable("zklock.tls_cert",
							   "Sets the file of the client certificate (PEM, with its chain) that sessions present to ZooKeeper.",
							   NULL,
							   &zklock_tls_cert,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, string_setting_assigned, NULL);
	DefineCustomStringVariable("zklock.tls_key",
							   "Sets the file of the client certificate's private key (PEM).",
							   "It must be owned by the server's user and readable by no one else.",
							   &zklock_tls_key,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, string_setting_assigned, NULL);
	DefineCustomStringVariable("zklock.tls_key_password",
							   "Sets the password of zklock.tls_key, if it is encrypted.",
							   "Its value is never shown.",
							   &zklock_tls_key_password,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   NULL, string_setting_assigned, show_tls_key_password);
	DefineCustomIntVariable("zklock.session_timeout",
							"Sets the ZooKeeper session timeout that each backend asks for.",
							"The ensemble may clamp it.  Takes effect when the backend next opens a session.",
							&zklock_session_timeout,
							10000, 1000, 600000,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, int_setting_assigned, NULL);
	DefineCustomIntVariable("zklock.connect_timeout",
							"Sets how long a lock call waits for ZooKeeper to answer before it fails.",
							NULL,
							&zklock_connect_timeout,
							5000, 100, 600000,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomEnumVariable("zklock.client_log_level",
							 "Sets the level of the ZooKeeper client library's own messages in the server log.",
							 NULL,
							 &zklock_client_log_level,
							 ZOO_LOG_LEVEL_ERROR,
							 client_log_levels,
							 PGC_SUSET,
							 0,
							 NULL, int_setting_assigned, NULL);
	DefineCustomIntVariable("zklock.idle_session_timeout",
							"Sets how long a backend's ZooKeeper session may stay open while it holds and waits for nothing.",
							"Past it the session is closed, freeing its connection to the ensemble; the next lock call opens a new one.  0 keeps it open until the backend exits.",
							&zklock_idle_session_timeout,
							10000, 0, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

static const char *
setting_or_empty(const char *value)
{
	return value ? value : "";
}

/* The zklock.tls_* settings, one per line: what a session was made with. */
static char *
tls_settings(void)
{
	return psprintf("%s\n%s\n%s\n%s", setting_or_empty(zklock_tls_ca),
					setting_or_empty(zklock_tls_cert),
					setting_or_empty(zklock_tls_key),
					setting_or_empty(zklock_tls_key_password));
}

#ifdef HAVE_OPENSSL_H
/* Hands OpenSSL zklock.tls_key_password; with none set, no password at all. */
static int
key_password(char *buf, int size, int rwflag, void *userdata)
{
	const char *password = userdata;
	int			len = strlen(password);

	if (len == 0 || len >= size)
		return 0;
	memcpy(buf, password, len);
	return len;
}

/*
 * Load the CA, certificate and key as the client library will, and report
 * what OpenSSL finds wrong.  Given files it cannot load, the library keeps
 * its connection half made and retries at once, without end and without a
 * useful message; given an encrypted key and no password, it would ask for
 * one on the terminal.
 */
static void
check_tls_files(const char *ca, const char *cert, const char *key,
				const char *password)
{
	SSL_CTX    *ctx;
	const char *setting = NULL;
	const char *path = NULL;
	char		reason[256];

	ERR_clear_error();
	ctx = SSL_CTX_new(TLS_client_method());
	if (ctx == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	SSL_CTX_set_default_passwd_cb(ctx, key_password);
	SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *) password);
	if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
		setting = "zklock.tls_ca", path = ca;
	else if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
		setting = "zklock.tls_cert", path = cert;
	else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
			 SSL_CTX_check_private_key(ctx) != 1)
		setting = "zklock.tls_key", path = key;
	ERR_error_string_n(ERR_peek_last_error(), reason, sizeof(reason));
	SSL_CTX_free(ctx);
	ERR_clear_error();
	if (setting != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("could not load %s \"%s\"", setting, path),
				 errdetail("OpenSSL reported: %s.", reason),
				 strcmp(setting, "zklock.tls_key") == 0 ?
				 errhint("The key must be the one of zklock.tls_cert, and an encrypted key needs zklock.tls_key_password.") : 0));
}
#endif

/*
 * The client library's TLS argument, "ca,cert,key[,password]" (malloc'd),
 * from the zklock.tls_* settings; NULL when none is set.  A session never
 * falls back to plain text: settings this build cannot honour, incomplete
 * settings and unusable files are ERRORs.  The files are checked here
 * because the library, given one it cannot load, retries without end
 * instead of failing.
 */
char *
zkset_tls_argument(void)
{
	const char *files[] = {zklock_tls_ca, zklock_tls_cert, zklock_tls_key};
	const char *password = setting_or_empty(zklock_tls_key_password);
	bool		any = password[0] != '\0';
	size_t		i;

	for (i = 0; i < lengthof(files); i++)
		any |= files[i] && files[i][0] != '\0';
	if (!any)
		return NULL;
#ifndef HAVE_OPENSSL_H
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("zklock.tls_* is set, but this build of zklock has no TLS support"),
			 errdetail("Its ZooKeeper client library was built without OpenSSL; zklock never falls back to plain text."),
			 errhint("Build a TLS-capable client library with scripts/build-zookeeper-tls and zklock against it (make ZK_TLS_PREFIX=...), or clear the zklock.tls_* settings.")));
	return NULL;
#else
	{
		const char *names[] = {"zklock.tls_ca", "zklock.tls_cert", "zklock.tls_key"};
		char	   *argument;
		char	   *copy;

		for (i = 0; i < lengthof(files); i++)
			if (files[i] == NULL || files[i][0] == '\0')
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("zklock.tls_ca, zklock.tls_cert and zklock.tls_key must all be set for TLS"),
						 errhint("The ZooKeeper client always presents a certificate: TLS to ZooKeeper is mutual.")));
		for (i = 0; i < lengthof(files); i++)
		{
			/* The library splits its argument at commas. */
			if (strchr(files[i], ',') != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("%s must not contain a comma", names[i])));
			FreeFile(open_setting_file(files[i], names[i], i == 2));
		}
		if (strchr(password, ',') != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("zklock.tls_key_password must not contain a comma")));
		check_tls_files(files[0], files[1], files[2], password);
		argument = psprintf("%s,%s,%s%s%s", files[0], files[1], files[2],
							password[0] != '\0' ? "," : "", password);
		copy = strdup(argument);
		explicit_bzero(argument, strlen(argument));
		pfree(argument);
		/* Never NULL: to the caller, NULL means plain text. */
		if (copy == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		return copy;
	}
#endif
}

/*
 * The credentials' completion, on the library's completion thread: it does
 * nothing, as a rejection comes as a session event (zk_session.c).
 */
static void
auth_sent(int rc, const void *data)
{
}

/*
 * Add the digest credentials, from zklock.auth_file or zklock.auth, to the
 * new session; the library sends them on every (re)connect.  Choose the
 * ACL for our nodes to match.  The password goes nowhere else: not into
 * messages, logs or node data, and our copy is wiped once handed over.
 * On an ERROR the caller closes the session.
 */
void
zkset_authenticate(void)
{
	char	   *credentials;
	int			rc;

	if (opened.auth[0] != '\0' && opened.auth_file[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("zklock.auth and zklock.auth_file are both set"),
				 errhint("Set only one of them, preferably zklock.auth_file.")));
	if (opened.auth[0] == '\0' && opened.auth_file[0] == '\0')
	{
		zks_node_acl = ZOO_OPEN_ACL_UNSAFE;
		note_identity("");
		return;
	}
	creator_acl_entries[0].perms = ZOO_PERM_ALL;
	creator_acl_entries[0].id = ZOO_AUTH_IDS;
	creator_acl_entries[1].perms = ZOO_PERM_READ;
	creator_acl_entries[1].id = ZOO_ANYONE_ID_UNSAFE;
	zks_node_acl.data = creator_acl_entries;
	zks_node_acl.count = opened.world_readable ? 2 : 1;

	credentials = opened.auth[0] != '\0' ? pstrdup(opened.auth) :
		read_auth_file(opened.auth_file);
	note_identity(credentials);
	rc = zoo_add_auth(zks_zh, "digest", credentials, strlen(credentials),
					  auth_sent, NULL);
	explicit_bzero(credentials, strlen(credentials));
	pfree(credentials);
	if (rc != ZOK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION),
				 errmsg("could not add the zklock credentials to the ZooKeeper session")));
}

/* zklock.hosts as set, "" when it is not. */
const char *
zkset_hosts(void)
{
	return setting_or_empty(zklock_hosts);
}

int
zkset_session_timeout(void)
{
	return zklock_session_timeout;
}

int
zkset_client_log_level(void)
{
	return zklock_client_log_level;
}

/* Read at transaction end: a plain read, which never fails. */
int
zkset_idle_session_timeout(void)
{
	return zklock_idle_session_timeout;
}

/*
 * Keep what the handle just made was made with, for zks_settings_changed
 * and for zkset_authenticate.  Nothing can assign a setting between the
 * two on the backend's one thread.
 */
void
zkset_remember_opened(void)
{
	if (opened.hosts)
	{
		pfree(opened.hosts);
		pfree(opened.auth);
		pfree(opened.auth_file);
		pfree(opened.tls);
	}
	opened.hosts = MemoryContextStrdup(zk_memory(), setting_or_empty(zklock_hosts));
	opened.tls = MemoryContextStrdup(zk_memory(), tls_settings());
	opened.auth = MemoryContextStrdup(zk_memory(),
									  zklock_auth ? zklock_auth : "");
	opened.auth_file = MemoryContextStrdup(zk_memory(),
										   zklock_auth_file ? zklock_auth_file : "");
	opened.session_timeout = zklock_session_timeout;
	opened.client_log_level = zklock_client_log_level;
	opened.world_readable = zklock_world_readable;
	opened.generation = settings_generation;
}

/* The hosts the open session was made for. */
const char *
zkset_opened_hosts(void)
{
	return opened.hosts;
}

static bool
settings_differ(void)
{
	return strcmp(opened.hosts, zklock_hosts ? zklock_hosts : "") != 0 ||
		strcmp(opened.auth, zklock_auth ? zklock_auth : "") != 0 ||
		strcmp(opened.auth_file, zklock_auth_file ? zklock_auth_file : "") != 0 ||
		strcmp(opened.tls, tls_settings()) != 0 ||
		opened.world_readable != zklock_world_readable ||
		opened.session_timeout != zklock_session_timeout ||
		opened.client_log_level != zklock_client_log_level;
}

/*
 * Would opening a session now use other settings than the open one?
 * Compared only after a setting was assigned since the last comparison.
 */
bool
zks_settings_changed(void)
{
	if (zks_zh == NULL || opened.generation == settings_generation)
		return false;
	if (settings_differ())
		return true;
	opened.generation = settings_generation;
	return false;
}

/* Does the open session have credentials (zklock.auth, zklock.auth_file)? */
bool
zks_has_credentials(void)
{
	return zks_zh != NULL && has_credentials;
}

/*
 * Changes when a session is opened as someone else to the servers than
 * the one before it: other hosts, credentials or TLS files.
 */
uint64
zks_identity_generation(void)
{
	return identity_generation;
}
