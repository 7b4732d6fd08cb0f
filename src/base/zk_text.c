/*-------------------------------------------------------------------------
 *
 * zk_text.c
 *	  Text between the database encoding and what ZooKeeper holds: lock
 *	  names, holder identities and other clients' node data are UTF-8 (or
 *	  any bytes at all) in ZooKeeper, and are shown in the database
 *	  encoding without ever failing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"

#include "base/zk_text.h"

/*
 * Convert text between encodings without failing: a character that the
 * target encoding lacks, or bytes that are not valid in the source one,
 * become '?' or, with hex_escape, "\\x" and the hex of each byte.  Used for
 * what zklock writes to and reads from ZooKeeper about holders, which must
 * never stop a lock call or a listing.
 */
char *
zkt_convert_lossy(const char *src, int len, int src_encoding,
				  int dest_encoding, bool hex_escape)
{
	StringInfoData out;
	Oid			proc = InvalidOid;
	unsigned char *buf = NULL;
	int			bufsize = len * MAX_CONVERSION_GROWTH + 1;
	int			pos = 0;

	initStringInfo(&out);
	if (src_encoding == dest_encoding || dest_encoding == PG_SQL_ASCII)
	{
		appendBinaryStringInfo(&out, src, len);
		return out.data;
	}
	if (src_encoding != PG_SQL_ASCII)
	{
		proc = FindDefaultConversionProc(src_encoding, dest_encoding);
		buf = palloc(bufsize);
	}
	while (pos < len)
	{
		unsigned char c = (unsigned char) src[pos];
		int			bad;
		int			i;

		if (OidIsValid(proc))
		{
			int			done;

			done = pg_do_encoding_conversion_buf(proc, src_encoding,
												 dest_encoding,
												 (unsigned char *) src + pos,
												 len - pos, buf, bufsize,
												 true);
			appendStringInfoString(&out, (char *) buf);
			pos += done;
			if (pos >= len)
				break;
			c = (unsigned char) src[pos];
		}
		else if (!IS_HIGHBIT_SET(c))
		{
			appendStringInfoChar(&out, (char) c);
			pos++;
			continue;
		}
		else if (dest_encoding == PG_UTF8 &&
				 pg_utf_mblen(&c) <= len - pos &&
				 pg_utf8_islegal((const unsigned char *) src + pos,
								 pg_utf_mblen(&c)))
		{
			/* SQL_ASCII bytes that happen to be UTF-8 stay as they are. */
			appendBinaryStringInfo(&out, src + pos, pg_utf_mblen(&c));
			pos += pg_utf_mblen(&c);
			continue;
		}
		bad = src_encoding == PG_SQL_ASCII ? 1 :
			Min(Max(pg_encoding_mblen(src_encoding, src + pos), 1), len - pos);
		for (i = 0; i < bad; i++)
		{
			if (hex_escape)
				appendStringInfo(&out, "\\x%02x", (unsigned char) src[pos + i]);
			else if (i == 0)
				appendStringInfoChar(&out, '?');
		}
		pos += bad;
	}
	if (buf)
		pfree(buf);
	return out.data;
}

bool
zkt_is_utf8(const char *data, int len)
{
	return pg_encoding_verifymbstr(PG_UTF8, data, len) == len;
}

/*
 * A name kept in UTF-8 (zk_shared.c), in the database encoding; bytes
 * that are not UTF-8 (a SQL_ASCII database's name) or that the encoding
 * lacks are shown escaped.
 */
Datum
zkt_shown_name(const char *utf8)
{
	int			len = strlen(utf8);

	return CStringGetTextDatum(zkt_convert_lossy(utf8, len,
												 zkt_is_utf8(utf8, len) ?
												 PG_UTF8 : PG_SQL_ASCII,
												 GetDatabaseEncoding(), true));
}

/*
 * Node data as text: UTF-8 shown in the database encoding (characters it
 * lacks as escaped bytes), anything else as a hex dump.
 */
char *
zkt_node_data(const char *data, int len)
{
	if (len == 0)
		return pstrdup("");
	if (zkt_is_utf8(data, len))
		return zkt_convert_lossy(data, len, PG_UTF8, GetDatabaseEncoding(),
								 true);
	else
	{
		char	   *hex = palloc(2 * len + 3);

		strcpy(hex, "\\x");
		hex[2 + hex_encode(data, len, hex + 2)] = '\0';
		return hex;
	}
}
