/*-------------------------------------------------------------------------
 *
 * zk_names.h
 *	  Mapping between SQL lock names and znode names, and parsing of the
 *	  contender node names that zklock and its peers create.
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
extern bool zkn_parse_contender(const char *child, int32_t *sequence);
extern bool zkn_has_guid(const char *child, const char *guid);

#endif							/* ZK_NAMES_H */
