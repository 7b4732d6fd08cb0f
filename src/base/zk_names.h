/*-------------------------------------------------------------------------
 *
 * zk_names.h
 *	  Mapping between SQL lock names and znode names, parsing of the
 *	  contender node names that zklock and its peers create, and of the
 *	  holder identity zklock stores in its nodes.
 *
 * Nothing here depends on PostgreSQL, so the same code can be linked into
 * small test and fuzzing harnesses.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_NAMES_H
#define ZK_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest lock name accepted, in bytes of the database encoding. */
#define ZKN_NAME_MAX		255

/* Worst case: every byte percent-encoded, plus the terminator. */
#define ZKN_ENCODED_MAX		(3 * ZKN_NAME_MAX + 1)

/* Length of the unique id zklock puts in its contender node names. */
#define ZKN_GUID_LEN		36

typedef enum ZknStatus
{
	ZKN_OK,
	ZKN_EMPTY,
	ZKN_TOO_LONG
} ZknStatus;

extern ZknStatus zkn_encode_name(const char *name, size_t len,
								 char out[ZKN_ENCODED_MAX]);
extern bool zkn_decode_name(const char *node, char *out, size_t outsize,
							size_t *outlen);

/* How a contender's sequence number reads. */
typedef enum ZknForm
{
	ZKN_NOT_CONTENDER,			/* no lock marker: not part of the queue */
	ZKN_SEQUENCED,				/* a sequence number, 0 to 2^31 - 1 */
	ZKN_WRAPPED,				/* a negative one: the server's counter wrapped */
	ZKN_MALFORMED				/* a marker, but no sequence number after it */
} ZknForm;

typedef struct ZknContender
{
	ZknForm		form;
	bool		shared;			/* a reader; never for ZKN_MALFORMED */
	int32_t		sequence;		/* for ZKN_SEQUENCED and ZKN_WRAPPED */
	int32_t		slots;			/* a semaphore's size as asked; 0 for locks */
} ZknContender;

/* The largest semaphore size accepted. */
#define ZKN_SLOTS_MAX		10000

extern ZknForm zkn_parse_contender(const char *child, ZknContender *contender);
extern const char *zkn_peer_of(const char *child);
extern bool zkn_has_zklock_form(const char *child);
extern bool zkn_is_node_of(const char *child, const char *guid, bool shared);
extern bool zkn_has_guid(const char *child, const char *guid);
extern ZknForm zkn_parse_slot(const char *child, ZknContender *contender);
extern bool zkn_is_slot_of(const char *child, const char *guid);

/* The holder identity zklock writes as node data. */
typedef struct ZknIdentity
{
	char		host[256];
	long		port;
	long		pid;
	char		database[256];
	char		user[256];
	char		application_name[256];
} ZknIdentity;

extern bool zkn_parse_identity(const char *data, size_t len, ZknIdentity *id);

/*
 * A published wait, for deadlock detection: the lock parent waited on, the
 * waiting node's name and the waiter's identity, one per line.
 */
#define ZKN_WAIT_PARENT_MAX	1024
#define ZKN_WAIT_NODE_MAX	128

typedef struct ZknWait
{
	char		parent[ZKN_WAIT_PARENT_MAX];
	char		node[ZKN_WAIT_NODE_MAX];
	ZknIdentity id;
} ZknWait;

extern bool zkn_parse_wait(const char *data, size_t len, ZknWait *wait);

#endif							/* ZK_NAMES_H */
