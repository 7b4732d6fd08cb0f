/*-------------------------------------------------------------------------
 *
 * zk_text.h
 *	  Text between the database encoding and what ZooKeeper holds.
 *
 *-------------------------------------------------------------------------
 */
#ifndef ZK_TEXT_H
#define ZK_TEXT_H

extern char *zkt_convert_lossy(const char *src, int len, int src_encoding,
							   int dest_encoding, bool hex_escape);
extern bool zkt_is_utf8(const char *data, int len);
extern Datum zkt_shown_name(const char *utf8);
extern char *zkt_node_data(const char *data, int len);

#endif							/* ZK_TEXT_H */
