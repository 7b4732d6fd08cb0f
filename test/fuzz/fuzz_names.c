/*
 * libFuzzer harness for zk_names.c and zk_queue.c: the lock name mapping,
 * the contender node name parser, the holder identity parser and the queue
 * rules, linked from the same source the extension uses.
 *
 * Checks, beyond memory safety: an encoded name is a single plain znode
 * name (no '/', not "." or "..", printable ASCII) that decodes back to the
 * input, and decoding never accepts what encoding cannot produce; a parsed
 * sequence number prints back as the text it was read from; and in any
 * queue made of the input's lines, never two holders hold the lock when
 * either is exclusive, and a contender that holds has nobody to wait for;
 * and a published wait parses into terminated fields.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "recipe/zk_queue.h"

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

/* A sequence number read from a name is the "%010d" the name ends with. */
static void
check_contender(const char *child)
{
	ZknContender c;
	char		printed[16];
	size_t		len = strlen(child);

	switch (zkn_parse_contender(child, &c))
	{
		case ZKN_SEQUENCED:
		case ZKN_WRAPPED:
			snprintf(printed, sizeof(printed), "%010d", c.sequence);
			assert(len >= strlen(printed) &&
				   strcmp(child + len - strlen(printed), printed) == 0);
			assert((c.form == ZKN_WRAPPED) == (c.sequence < 0));
			break;
		case ZKN_MALFORMED:
			assert(!c.shared);
			break;
		case ZKN_NOT_CONTENDER:
			break;
	}
}

/* One holder's nodes share the first characters of "_c_<uuid>-" (zk_queue.c). */
static bool
is_owned(const ZkqEntry *e)
{
	size_t		len = 3 + ZKN_GUID_LEN;

	return e->contender.form != ZKN_MALFORMED &&
		strncmp(e->name, "_c_", 3) == 0 && strlen(e->name) > len &&
		e->name[len] == '-';
}

static bool
same_owner(const ZkqEntry *a, const ZkqEntry *b)
{
	return is_owned(a) && is_owned(b) &&
		strncmp(a->name, b->name, 3 + ZKQ_OWNER_LEN) == 0;
}

/*
 * The input's lines as one queue, created in line order (the czxid).  No
 * two holders of different owners where either is exclusive, and whoever
 * the rules let through holds.  (Not the other way round: whether a reader
 * behind an upgrade was let in before it cannot be told from one listing,
 * see zk_queue.c, so a queue shown can name an upgrade as holding while it
 * waits for such a reader.)
 */
static void
check_queue(char *text)
{
	ZkqEntry	entries[32];
	int			order[32];
	bool		holds[32];
	int			n = 0;
	char	   *line;
	char	   *save = NULL;
	bool		by_czxid;
	int64_t		creates;
	int			i,
				j;

	for (line = strtok_r(text, "\n", &save); line && n < 32;
		 line = strtok_r(NULL, "\n", &save))
	{
		bool		repeated = false;

		/* A parent's children have distinct names. */
		for (i = 0; i < n; i++)
			repeated |= strcmp(entries[i].name, line) == 0;
		if (repeated ||
			zkn_parse_contender(line, &entries[n].contender) == ZKN_NOT_CONTENDER)
			continue;
		entries[n].name = line;
		entries[n].czxid = n + 1;
		n++;
	}
	/* The count of creates a server would report for these numbers. */
	creates = 0;
	for (i = 0; i < n; i++)
		if (entries[i].contender.form == ZKN_SEQUENCED &&
			entries[i].contender.sequence >= creates)
			creates = (int64_t) entries[i].contender.sequence + 1;
	by_czxid = zkq_needs_czxid(entries, n, creates);
	assert(zkq_describe(entries, n, by_czxid, order, holds));
	for (i = 0; i < n; i++)
		for (j = 0; j < n; j++)
			if (i != j && holds[i] && holds[j] &&
				!same_owner(&entries[i], &entries[j]))
				assert(entries[i].contender.shared && entries[j].contender.shared);
	for (i = 0; i < n; i++)
	{
		int			watch = -1;
		ZkqVerdict	verdict = zkq_decide(entries, n, i, by_czxid, &watch);

		assert(verdict != ZKQ_NO_MEMORY);
		if (verdict == ZKQ_WAIT)
			assert(watch >= 0 && watch < n && watch != i &&
				   !same_owner(&entries[watch], &entries[i]));
		/* Whom the rules let through holds. */
		if (verdict == ZKQ_HOLDS)
			assert(holds[i]);
	}
}

/* A published wait parses into terminated fields, or not at all. */
static void
check_wait(const char *data, size_t size)
{
	ZknWait		wait;

	if (!zkn_parse_wait(data, size, &wait))
		return;
	assert(wait.parent[0] == '/' && strlen(wait.parent) < sizeof(wait.parent));
	assert(strlen(wait.node) < sizeof(wait.node) && strchr(wait.node, '/') == NULL);
	assert(memchr(data, '\n', size) != NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *text = malloc(size + 1);
	ZknIdentity id;

	memcpy(text, data, size);
	text[size] = '\0';

	/* Lock names are text: no NUL inside. */
	check_encoding(text, strlen(text));
	check_decoding(text);
	check_contender(text);
	(void) zkn_is_node_of(text, "0f0e0d0c-0b0a-4909-8807-060504030201", true);
	(void) zkn_parse_identity((const char *) data, size, &id);
	check_wait((const char *) data, size);
	check_queue(text);

	free(text);
	return 0;
}
