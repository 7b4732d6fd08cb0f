#!/usr/bin/python3
"""A TCP proxy between ZooKeeper clients and one server, for fault tests.

Usage: zkproxy.py LISTEN_PORT SERVER_PORT CONTROL_DIR

Forwards every client connection on 127.0.0.1:LISTEN_PORT to the server on
127.0.0.1:SERVER_PORT.  A fault is armed by creating a file in CONTROL_DIR
and fires once, on the next create of a lock node (a path containing
"-lock-"); the file is removed when the fault is taken, and the fault's
name is appended to CONTROL_DIR/fired once it has done its harm:

  drop-create-reply    forward the create, and when the server's reply
                       comes, drop the connection instead of passing it on:
                       the node exists but the client never hears of it
  drop-create-request  drop the connection instead of forwarding the create:
                       the server never sees it

and, on the next create of a published wait (a path containing "%waits/"):

  drop-wait-create-reply  as drop-create-reply

and, on the next watch notification the server sends:

  drop-notification    drop the connection instead of passing it on: the
                       client hears of the change only from the server it
                       reconnects to

and faults that stay armed while their file exists:

  blackhole            forward nothing in either direction, on open
                       connections and new ones alike, as a cut cable
                       would: the client hears nothing and the server
                       nothing, but no connection is closed
  hold-reads           hold back a node read (getData), and whatever the
                       client sends after it, until the file is removed:
                       the test can change the tree between a listing
                       and the reads that follow it ("fired" once per
                       read held)

The proxy writes the wall-clock time (seconds since the epoch) at which it
last passed a frame from the server to a client to CONTROL_DIR/last-reply.

Runs until killed.
"""

import os
import socket
import struct
import sys
import threading
import time

CREATE_OPS = {1, 15, 19, 21}  # create, create2, createContainer, createTTL
GET_DATA_OP = 4
NOTIFICATION_XID = -1


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def read_frame(sock):
    (length,) = struct.unpack(">i", read_exact(sock, 4))
    return read_exact(sock, length)


def blackholed(control):
    return os.path.exists(os.path.join(control, "blackhole"))


def swallow(sock):
    """Read and drop everything from sock until it closes."""
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def note_reply(control):
    path = os.path.join(control, "last-reply")
    with open(path + ".tmp", "w") as f:
        f.write("%.3f\n" % time.time())
    os.replace(path + ".tmp", path)


def take_fault(control, name):
    path = os.path.join(control, name)
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def record_fired(control, name):
    """Append NAME to CONTROL_DIR/fired once its fault has done its harm:
    a fault taken but never carried out must not look fired."""
    with open(os.path.join(control, "fired"), "a") as f:
        f.write(name + "\n")


class Connection:
    def __init__(self, client, server_port, control):
        self.client = client
        self.server = socket.create_connection(("127.0.0.1", server_port))
        self.control = control
        # (xid, fault) of a create whose reply is to be dropped.
        self.drop = None
        self.closed = threading.Event()

    def close(self):
        self.closed.set()
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def hold_reads(self):
        return os.path.exists(os.path.join(self.control, "hold-reads"))

    def client_to_server(self):
        try:
            self.server.sendall(frame(read_frame(self.client)))  # connect
            while True:
                body = read_frame(self.client)
                if blackholed(self.control):
                    continue
                if len(body) >= 12:
                    xid, op, pathlen = struct.unpack(">iii", body[:12])
                    path = body[12:12 + max(pathlen, 0)]
                    if op in CREATE_OPS and b"-lock-" in path:
                        if take_fault(self.control, "drop-create-request"):
                            record_fired(self.control, "drop-create-request")
                            raise EOFError
                        if take_fault(self.control, "drop-create-reply"):
                            self.drop = (xid, "drop-create-reply")
                    if op in CREATE_OPS and b"%waits/" in path:
                        if take_fault(self.control, "drop-wait-create-reply"):
                            self.drop = (xid, "drop-wait-create-reply")
                    if op == GET_DATA_OP and self.hold_reads():
                        record_fired(self.control, "hold-reads")
                        while self.hold_reads() and not self.closed.is_set():
                            time.sleep(0.05)
                self.server.sendall(frame(body))
        except (EOFError, OSError):
            self.close()

    def server_to_client(self):
        try:
            self.client.sendall(frame(read_frame(self.server)))  # connect
            while True:
                body = read_frame(self.server)
                if blackholed(self.control):
                    continue
                (xid,) = struct.unpack(">i", body[:4])
                if self.drop is not None and xid == self.drop[0]:
                    record_fired(self.control, self.drop[1])
                    raise EOFError
                if xid == NOTIFICATION_XID and take_fault(self.control, "drop-notification"):
                    record_fired(self.control, "drop-notification")
                    raise EOFError
                self.client.sendall(frame(body))
                note_reply(self.control)
        except (EOFError, OSError):
            self.close()


def frame(body):
    return struct.pack(">i", len(body)) + body


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        sys.exit(2)
    listen_port, server_port, control = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", listen_port))
    listener.listen(16)
    while True:
        client, _ = listener.accept()
        if blackholed(control):
            threading.Thread(target=swallow, args=(client,), daemon=True).start()
            continue
        try:
            conn = Connection(client, server_port, control)
        except OSError:
            client.close()
            continue
        for target in (conn.client_to_server, conn.server_to_client):
            threading.Thread(target=target, daemon=True).start()


if __name__ == "__main__":
    main()
