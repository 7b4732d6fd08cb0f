/*-------------------------------------------------------------------------
 *
 * zk_names.c
 *	  Lock names to znode names and back, and contender node parsing.
 *
 * A lock name made only of letters, digits, '_', '-' and '.' is used as the
 * znode name unchanged (except "." and ".."), so other clients find
 * "datastore_a" at <root>/datastore_a.  Every other name is percent-encoded
 * byte by byte, '.' included.  An encoded name therefore always contains '%'
 * while an unchanged one never does, which keeps the mapping one-to-one, and
 * the result never contains '/', never is "." or "..", and is pure ASCII, so
 * no name can reach a node outside its own parent.
 *
 * Contenders are the children whose names carry one of the markers below,
 * normally followed by the server's sequence number, printed as a signed
 * 32-bit "%010d".
 *
 *-------------------------------------------------------------------------
 */
#include "base/zk_names.h"

#include <string.h>

static const char hexdigits[] = "0123456789ABCDEF";

static bool
is_plain_byte(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') || c == '_' || c == '-';
}

static bool
is_plain_name(const char *name, size_t len)
{
	size_t		i;

	if ((len == 1 && name[0] == '.') ||
		(len == 2 && name[0] == '.' && name[1] == '.'))
		return false;
	for (i = 0; i < len; i++)
		if (!is_plain_byte((unsigned char) name[i]) && name[i] != '.')
			return false;
	return true;
}

/*
 * Encode a lock name of len bytes (it may contain NUL-free arbitrary bytes)
 * into the znode name under the root.
 */
ZknStatus
zkn_encode_name(const char *name, size_t len, char out[ZKN_ENCODED_MAX])
{
	size_t		i;
	char	   *p = out;

	if (len == 0)
		return ZKN_EMPTY;
	if (len > ZKN_NAME_MAX)
		return ZKN_TOO_LONG;

	if (is_plain_name(name, len))
	{
		memcpy(out, name, len);
		out[len] = '\0';
		return ZKN_OK;
	}

	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) name[i];

		if (is_plain_byte(c))
			*p++ = (char) c;
		else
		{
			*p++ = '%';
			*p++ = hexdigits[c >> 4];
			*p++ = hexdigits[c & 0x0F];
		}
	}
	*p = '\0';
	return ZKN_OK;
}

static int
hexvalue(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * Invert zkn_encode_name.  Returns false for a node name that the encoder
 * cannot have produced, so foreign nodes are never shown as lock names.
 */
bool
zkn_decode_name(const char *node, char *out, size_t outsize, size_t *outlen)
{
	size_t		nodelen = strlen(node);
	size_t		n = 0;
	size_t		i;

	if (strchr(node, '%') == NULL)
	{
		if (!is_plain_name(node, nodelen) || nodelen == 0 ||
			nodelen > ZKN_NAME_MAX || nodelen >= outsize)
			return false;
		memcpy(out, node, nodelen + 1);
		*outlen = nodelen;
		return true;
	}

	for (i = 0; i < nodelen; i++)
	{
		unsigned char c;

		if (node[i] == '%')
		{
			int			hi,
						lo;

			if (i + 2 >= nodelen)
				return false;
			hi = hexvalue(node[i + 1]);
			lo = hexvalue(node[i + 2]);
			if (hi < 0 || lo < 0)
				return false;
			c = (unsigned char) (hi << 4 | lo);
			/* The encoder writes plain bytes unescaped, and never a NUL. */
			if (is_plain_byte(c) || c == '\0')
				return false;
			i += 2;
		}
		else if (is_plain_byte((unsigned char) node[i]))
			c = (unsigned char) node[i];
		else
			return false;
		if (n + 1 >= outsize || n >= ZKN_NAME_MAX)
			return false;
		out[n++] = (char) c;
	}
	out[n] = '\0';
	/* A name the encoder would have left plain was not encoded by it. */
	if (is_plain_name(out, n))
		return false;
	*outlen = n;
	return true;
}

/*
 * The contender name markers of zklock and its peers, each followed by the
 * sequence number.
 */
static const struct
{
	const char *marker;
	bool		shared;
}			contender_markers[] =
{
	{"-read-lock-", true},		/* zklock shared */
	{"-lock-", false},			/* zklock exclusive, Curator InterProcessMutex */
	{"__rlock__", true},		/* kazoo ReadLock */
	{"__lock__", false},		/* kazoo Lock and WriteLock */
	{"__READ__", true},			/* Curator InterProcessReadWriteLock */
	{"__WRIT__", false},
};

/*
 * Which peer made a contender node that is not zklock's (zklock's names
 * look like Curator's, so ask only about nodes whose data is not zklock's):
 * kazoo's markers are its own, and Curator starts every name with "_c_".
 */
const char *
zkn_peer_of(const char *child)
{
	if (strstr(child, "__lock__") || strstr(child, "__rlock__"))
		return "kazoo";
	if (strncmp(child, "_c_", 3) == 0)
		return "curator";
	return "unknown";
}

/*
 * Is child named the way zklock names a lock's nodes: "_c_", a uuid, then
 * "-lock-" or "-read-lock-"?  (Curator's InterProcessMutex names its nodes
 * alike; its recipe is the one zklock follows.)
 */
bool
zkn_has_zklock_form(const char *child)
{
	const char *marker = child + 3 + ZKN_GUID_LEN;

	return strncmp(child, "_c_", 3) == 0 &&
		memchr(child, '\0', 3 + ZKN_GUID_LEN) == NULL &&
		(strncmp(marker, "-lock-", 6) == 0 ||
		 strncmp(marker, "-read-lock-", 11) == 0);
}

/* Where the last occurrence of marker in child ends, or 0 if none. */
static size_t
marker_end(const char *child, size_t len, const char *marker)
{
	size_t		mlen = strlen(marker);
	size_t		start;

	for (start = len >= mlen ? len - mlen + 1 : 0; start > 0; start--)
		if (child[start - 1] == marker[0] &&
			memcmp(child + start - 1, marker, mlen) == 0)
			return start - 1 + mlen;
	return 0;
}

/* Parse n decimal digits; false if any is not a digit. */
static bool
parse_digits(const char *s, size_t n, int64_t *value)
{
	size_t		i;

	*value = 0;
	for (i = 0; i < n; i++)
	{
		if (s[i] < '0' || s[i] > '9')
			return false;
		*value = *value * 10 + (s[i] - '0');
	}
	return true;
}

/*
 * Read the text after the marker.  The server prints the parent's child
 * counter with "%010d": ten digits, or, once the signed counter has wrapped,
 * '-' and nine or ten digits.
 */
static ZknForm
parse_sequence(const char *s, int32_t *sequence)
{
	size_t		len = strlen(s);
	int64_t		value;

	if (len == 10 && parse_digits(s, 10, &value) && value <= INT32_MAX)
	{
		*sequence = (int32_t) value;
		return ZKN_SEQUENCED;
	}
	/* "%010d" pads to ten characters, so eleven only from -10^9 down. */
	if ((len == 10 || len == 11) && s[0] == '-' &&
		parse_digits(s + 1, len - 1, &value) &&
		value > 0 && value <= (int64_t) INT32_MAX + 1 &&
		(len == 10 || value >= 1000000000))
	{
		*sequence = (int32_t) -value;
		return ZKN_WRAPPED;
	}
	return ZKN_MALFORMED;
}

/*
 * Is this child a contender, and what does it ask for?  A child is a
 * contender if its name contains one of the markers; the marker that ends
 * last decides (the longer one where two end together, so "-read-lock-"
 * wins over the "-lock-" it ends with).  Every peer's writer counts as
 * exclusive and every peer's reader as shared, so zklock never lets a writer
 * in beside another client's reader, whatever that client's own rules are.
 * A marker followed by anything but a sequence number is a contender that
 * cannot be placed in the queue: it counts as exclusive, and the queue rules
 * put it ahead of everyone, so it makes others wait instead of vanishing.
 */
ZknForm
zkn_parse_contender(const char *child, ZknContender *contender)
{
	size_t		len = strlen(child);
	size_t		best_end = 0;
	size_t		best_len = 0;
	bool		best_shared = false;
	size_t		i;

	/*
	 * The common case first: a marker right before ten digits.  Every
	 * marker ends in '-' or '_', so none can end later than that.
	 */
	if (len > 10 && strspn(child + len - 10, "0123456789") == 10)
	{
		for (i = 0; i < sizeof(contender_markers) / sizeof(contender_markers[0]); i++)
		{
			const char *marker = contender_markers[i].marker;
			size_t		mlen = strlen(marker);

			if (len - 10 >= mlen && mlen > best_len &&
				memcmp(child + len - 10 - mlen, marker, mlen) == 0)
			{
				best_end = len - 10;
				best_len = mlen;
				best_shared = contender_markers[i].shared;
			}
		}
	}
	if (best_end == 0)
	{
		for (i = 0; i < sizeof(contender_markers) / sizeof(contender_markers[0]); i++)
		{
			const char *marker = contender_markers[i].marker;
			size_t		end = marker_end(child, len, marker);

			if (end > best_end || (end != 0 && end == best_end &&
								   strlen(marker) > best_len))
			{
				best_end = end;
				best_len = strlen(marker);
				best_shared = contender_markers[i].shared;
			}
		}
	}
	contender->sequence = 0;
	contender->shared = false;
	contender->slots = 0;
	if (best_end == 0)
		contender->form = ZKN_NOT_CONTENDER;
	else
	{
		contender->form = parse_sequence(child + best_end,
										 &contender->sequence);
		contender->shared = best_shared &&
			contender->form != ZKN_MALFORMED;
	}
	return contender->form;
}

/*
 * Was this child created with this uuid for this mode?  A backend's nodes
 * on one name share a uuid, one node per mode, so the uuid and the mode
 * marker together name the node of one acquisition.
 */
bool
zkn_is_node_of(const char *child, const char *guid, bool shared)
{
	const char *marker = shared ? "-read-lock-" : "-lock-";

	return strncmp(child, "_c_", 3) == 0 &&
		strncmp(child + 3, guid, ZKN_GUID_LEN) == 0 &&
		strncmp(child + 3 + ZKN_GUID_LEN, marker, strlen(marker)) == 0;
}

/*
 * A semaphore's contender: "_c_<uuid>-sem<N>-<sequence>", one node per
 * slot, N the size its caller asked for (1 to ZKN_SLOTS_MAX).  Semaphores
 * live apart from locks, under names no other client uses; a child that
 * does not read so is not a contender.
 */
ZknForm
zkn_parse_slot(const char *child, ZknContender *contender)
{
	const char *p = child + 3 + ZKN_GUID_LEN;
	int64_t		slots;
	size_t		digits;

	contender->form = ZKN_NOT_CONTENDER;
	contender->shared = false;
	contender->sequence = 0;
	contender->slots = 0;
	if (strncmp(child, "_c_", 3) != 0 ||
		strnlen(child, 3 + ZKN_GUID_LEN + 4) < 3 + ZKN_GUID_LEN + 4 ||
		strncmp(p, "-sem", 4) != 0)
		return ZKN_NOT_CONTENDER;
	p += 4;
	digits = strspn(p, "0123456789");
	if (digits == 0 || digits > 5 || p[digits] != '-' ||
		!parse_digits(p, digits, &slots) || slots < 1 || slots > ZKN_SLOTS_MAX)
		return ZKN_NOT_CONTENDER;
	contender->slots = (int32_t) slots;
	contender->form = parse_sequence(p + digits + 1, &contender->sequence);
	return contender->form;
}

/* Was this child created by the acquisition of this uuid, whatever it is? */
bool
zkn_has_guid(const char *child, const char *guid)
{
	return strncmp(child, "_c_", 3) == 0 &&
		strncmp(child + 3, guid, ZKN_GUID_LEN) == 0 &&
		child[3 + ZKN_GUID_LEN] == '-';
}

/* Was this semaphore contender created with this uuid? */
bool
zkn_is_slot_of(const char *child, const char *guid)
{
	return strncmp(child, "_c_", 3) == 0 &&
		strncmp(child + 3, guid, ZKN_GUID_LEN) == 0 &&
		strncmp(child + 3 + ZKN_GUID_LEN, "-sem", 4) == 0;
}

/*
 * Parsing the holder identity.  zklock writes exactly
 * {"host":S,"port":N,"pid":N,"database":S,"user":S,"application_name":S}
 * (see holder_identity() in zklock.c), so this reads exactly that and
 * rejects anything else: another client's data is shown raw instead.
 */
typedef struct Cursor
{
	const char *p;
	const char *end;
} Cursor;

static bool
expect_literal(Cursor *c, const char *literal)
{
	size_t		len = strlen(literal);

	if ((size_t) (c->end - c->p) < len || memcmp(c->p, literal, len) != 0)
		return false;
	c->p += len;
	return true;
}

static bool
parse_json_string(Cursor *c, char *out, size_t outsize)
{
	size_t		n = 0;

	if (!expect_literal(c, "\""))
		return false;
	while (c->p < c->end && *c->p != '"')
	{
		char		ch = *c->p++;

		if (ch == '\\')
		{
			if (c->p >= c->end)
				return false;
			ch = *c->p++;
			switch (ch)
			{
				case '"':
				case '\\':
				case '/':
					break;
				case 'b':
					ch = '\b';
					break;
				case 'f':
					ch = '\f';
					break;
				case 'n':
					ch = '\n';
					break;
				case 'r':
					ch = '\r';
					break;
				case 't':
					ch = '\t';
					break;
				case 'u':
					if (c->end - c->p < 4)
						return false;
					/* Only control characters are escaped this way. */
					ch = '?';
					c->p += 4;
					break;
				default:
					return false;
			}
		}
		else if ((unsigned char) ch < 0x20)
			return false;
		if (n + 1 >= outsize)
			return false;
		out[n++] = ch;
	}
	if (!expect_literal(c, "\""))
		return false;
	out[n] = '\0';
	return true;
}

static bool
parse_json_int(Cursor *c, long *value)
{
	long		v = 0;
	int			digits = 0;

	while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits < 10)
	{
		v = v * 10 + (*c->p++ - '0');
		digits++;
	}
	*value = v;
	return digits > 0;
}

bool
zkn_parse_identity(const char *data, size_t len, ZknIdentity *id)
{
	Cursor		c = {data, data + len};

	return expect_literal(&c, "{\"host\":") &&
		parse_json_string(&c, id->host, sizeof(id->host)) &&
		expect_literal(&c, ",\"port\":") &&
		parse_json_int(&c, &id->port) &&
		expect_literal(&c, ",\"pid\":") &&
		parse_json_int(&c, &id->pid) &&
		expect_literal(&c, ",\"database\":") &&
		parse_json_string(&c, id->database, sizeof(id->database)) &&
		expect_literal(&c, ",\"user\":") &&
		parse_json_string(&c, id->user, sizeof(id->user)) &&
		expect_literal(&c, ",\"application_name\":") &&
		parse_json_string(&c, id->application_name,
						  sizeof(id->application_name)) &&
		expect_literal(&c, "}") &&
		c.p == c.end;
}

/* Copy the line at *p (up to '\n') into out; false if it does not fit. */
static bool
take_line(const char **p, const char *end, char *out, size_t outsize)
{
	const char *nl = memchr(*p, '\n', end - *p);
	size_t		len;

	if (nl == NULL || (size_t) (nl - *p) >= outsize || nl == *p ||
		memchr(*p, '\0', nl - *p) != NULL)
		return false;
	len = nl - *p;
	memcpy(out, *p, len);
	out[len] = '\0';
	*p = nl + 1;
	return true;
}

/*
 * Parse a published wait: "<parent>\n<node>\n<identity>", as zk_deadlock.c
 * writes it.  The parent is an absolute path, the node a plain child name.
 */
bool
zkn_parse_wait(const char *data, size_t len, ZknWait *wait)
{
	const char *p = data;
	const char *end = data + len;

	return take_line(&p, end, wait->parent, sizeof(wait->parent)) &&
		wait->parent[0] == '/' &&
		take_line(&p, end, wait->node, sizeof(wait->node)) &&
		strchr(wait->node, '/') == NULL &&
		zkn_parse_identity(p, end - p, &wait->id);
}
