"""Where a handoff's time goes, read off the wire.

A packet capture (tcpdump, pcap format) of the ensemble's client ports
gives two moments of every handoff that neither side can stamp for the
other: when the releaser's delete left it, and when the notification of
that deletion left the ensemble for the waiter.  With the releaser's and
the waiter's own stamps around them, a handoff splits into

    releaser side   release stamp  -> delete on the wire
    ensemble        delete         -> deletion notification on the wire
    waiter side     notification   -> grant stamp

The floor program's handoffs split the same way, its ensemble part read off
the wire and its client part the rest of its own mean.

Only what the split needs is decoded: a request frame is
[len][xid][type]..., a delete (type 2) carries [path][version]; a server
frame is [len][xid][zxid][err]..., a watch notification has xid -1 and a
WatcherEvent [type][state][path] with type 2 for a deletion.
"""
import struct

ZOO_DELETE_OP = 2
ZOO_DELETED_EVENT = 2
NOTIFICATION_XID = -1
MAX_FRAME = 1 << 20


def _packets(path):
    """(time, src port, dst port, TCP payload) of each IPv4/IPv6 TCP packet."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return
    magic = struct.unpack("<I", data[:4])[0]
    if magic in (0xa1b2c3d4, 0xa1b23c4d):
        end = "<"
    else:
        end = ">"
        magic = struct.unpack(">I", data[:4])[0]
    nano = magic == 0xa1b23c4d
    linktype = struct.unpack(end + "I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(end + "IIII", data[off:off + 16])
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        t = sec + frac * (1e-9 if nano else 1e-6)
        if linktype == 1:           # Ethernet (Linux's loopback)
            if len(frame) < 14:
                continue
            ethertype = struct.unpack(">H", frame[12:14])[0]
            ip = frame[14:]
        elif linktype == 113:       # Linux cooked capture
            if len(frame) < 16:
                continue
            ethertype = struct.unpack(">H", frame[14:16])[0]
            ip = frame[16:]
        else:
            raise ValueError("capture link type %d is not handled" % linktype)
        if ethertype == 0x0800 and len(ip) >= 20 and ip[9] == 6:
            tcp = ip[(ip[0] & 0x0f) * 4:]
        elif ethertype == 0x86dd and len(ip) >= 40 and ip[6] == 6:
            tcp = ip[40:]
        else:
            continue
        if len(tcp) < 20:
            continue
        sport, dport = struct.unpack(">HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            yield t, sport, dport, payload


def _frames(packets):
    """(time, src port, dst port, frame body) of each whole ZooKeeper frame,
    timed by the packet that completed it.  Frames are split across
    packets (the C client writes a frame's length apart from its body), so
    each direction of a connection is reassembled; a length that cannot be
    right (the capture began inside a frame) drops what is buffered."""
    streams = {}
    for t, sport, dport, payload in packets:
        buf = streams.setdefault((sport, dport), bytearray())
        buf += payload
        while len(buf) >= 4:
            n = struct.unpack(">i", buf[:4])[0]
            if n <= 0 or n > MAX_FRAME:
                buf.clear()
                break
            if len(buf) < 4 + n:
                break
            yield t, sport, dport, bytes(buf[4:4 + n])
            del buf[:4 + n]


def _string_at(body, off):
    if off + 4 > len(body):
        return None
    n = struct.unpack(">i", body[off:off + 4])[0]
    if n < 1 or off + 4 + n > len(body):
        return None
    return body[off + 4:off + 4 + n]


def deletes_and_notifications(path, zk_ports):
    """The deletes sent to, and the deletion notifications sent by, the
    servers on zk_ports: two lists of (time, node path), in time order.
    Paths are absolute: the recipe's clients use no chroot."""
    ports = set(zk_ports)
    deletes, notes = [], []
    for t, sport, dport, body in _frames(_packets(path)):
        if dport in ports and len(body) >= 16:
            _, op = struct.unpack(">ii", body[:8])
            node = _string_at(body, 8)
            # A delete is exactly [xid][type][path][version].
            if op == ZOO_DELETE_OP and node and node[:1] == b"/" \
                    and len(body) == 16 + len(node):
                deletes.append((t, node))
        elif sport in ports and len(body) >= 28:
            xid, = struct.unpack(">i", body[:4])
            event, = struct.unpack(">i", body[16:20])
            node = _string_at(body, 24)
            if xid == NOTIFICATION_XID and event == ZOO_DELETED_EVENT and node:
                notes.append((t, node))
    return deletes, notes


def _first_notification(notes):
    first = {}
    for t, node in notes:
        first.setdefault(node, t)
    return first


def split_handoffs(handoffs, deletes, notes):
    """handoffs: (release stamp, grant stamp) pairs.  Returns three lists in
    ms (releaser side, ensemble, waiter side) over the handoffs granted by a
    notification (the delete between the stamps notified a watcher before
    the grant), and how many handoffs were granted otherwise."""
    first = _first_notification(notes)
    rel, ens, wai = [], [], []
    other = 0
    i = 0
    for r, g in handoffs:
        while i < len(deletes) and deletes[i][0] < r:
            i += 1
        if i == len(deletes):
            break
        t, node = deletes[i]
        n = first.get(node)
        if t > g or n is None or not t <= n <= g:
            other += 1
            continue
        rel.append((t - r) * 1e3)
        ens.append((n - t) * 1e3)
        wai.append((g - n) * 1e3)
    return rel, ens, wai, other
