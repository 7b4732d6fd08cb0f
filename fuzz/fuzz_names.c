/*
 * libFuzzer harness for zk_names.c: the lock name mapping, the contender
 * node name parser and the holder identity parser, linked from the same
 * source the extension uses.
 *
 * Checks, beyond memory safety: an encoded name is a single plain znode
 * name (no '/', not "." or "..", printable ASCII) that decodes back to the
 * input, and decoding never accepts what encoding cannot produce.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../zk_names.h"

static void
check_encoding(const char *name, size_t len)
{
	char		encoded[ZKN_ENCODED_MAX];
	char		decoded[ZKN_NAME_MAX + 1];
	size_t		decoded_len;
	size_t		i;

	switch (zkn_encode_name(name, len, encoded))
	{
		case ZKN_EMPTY:
			assert(len == 0);
			return;
		case ZKN_TOO_LONG:
			assert(len > ZKN_NAME_MAX);
			return;
		case ZKN_OK:
			break;
	}
	assert(strcmp(encoded, ".") != 0 && strcmp(encoded, "..") != 0);
	for (i = 0; encoded[i]; i++)
		assert(encoded[i] > 0x20 && encoded[i] < 0x7f && encoded[i] != '/');
	assert(zkn_decode_name(encoded, decoded, sizeof(decoded), &decoded_len));
	assert(decoded_len == len && memcmp(decoded, name, len) == 0);
}

static void
check_decoding(const char *node)
{
	char		decoded[ZKN_NAME_MAX + 1];
	char		encoded[ZKN_ENCODED_MAX];
	size_t		decoded_len;

	if (!zkn_decode_name(node, decoded, sizeof(decoded), &decoded_len))
		return;
	/* Whatever decodes must be exactly what the encoder writes for it. */
	assert(zkn_encode_name(decoded, decoded_len, encoded) == ZKN_OK);
	assert(strcmp(encoded, node) == 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *text = malloc(size + 1);
	int32_t		sequence;
	bool		shared;
	ZknIdentity id;

	memcpy(text, data, size);
	text[size] = '\0';

	/* Lock names are text: no NUL inside. */
	check_encoding(text, strlen(text));
	check_decoding(text);
	if (zkn_parse_contender(text, &sequence, &shared))
		assert(strlen(text) >= 10);
	(void) zkn_has_guid(text, "0f0e0d0c-0b0a-4909-8807-060504030201");
	(void) zkn_parse_identity((const char *) data, size, &id);

	free(text);
	return 0;
}
