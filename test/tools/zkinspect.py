#!/usr/bin/python3
"""Look at a ZooKeeper ensemble from outside, for the zklock tests.

Usage: zkinspect.py HOSTS COMMAND PATH [ARGS]

  children PATH              sorted child names, one per line
                             (nothing if PATH does not exist)
  get PATH                   node data as UTF-8 (exit 3 if missing)
  stat PATH                  "CZXID 0xEPHEMERAL_OWNER" (exit 3 if missing)
  tree PATH                  every descendant path, depth first, sorted
                             (PATH itself excluded; nothing if missing)
  create PATH [DATA]         create PATH (and missing parents); DATA
                             "hex:..." gives raw bytes
  delete PATH                delete PATH and everything below it
                             (exit 3 if missing)
  try-delete PATH            try to delete PATH alone; print "ok" or the
                             error's class name (exit 0 either way)
  try-set PATH DATA          likewise for setting PATH's data
  try-children PATH          likewise for listing PATH's children: the
                             sorted names, one per line, or the error's
                             class name
  set-acl PATH [PERMS]       give PATH an ACL that grants everything to the
                             digest credentials of ZKINSPECT_AUTH, and
                             PERMS ("c", "cr", ...) to anyone (none: nothing)
  expire SESSION:PASSWORD    join the session with this id and password
                             (both hex) and close it, which expires it for
                             its owner, as Curator's tests do
  wait-children PATH N TIMEOUT_S
                             wait until PATH has exactly N children
                             (a missing PATH has 0; exit 4 on timeout)

Exit status: 0 success, 2 usage or connection error, 3 missing node,
4 timeout.  Anything else that goes wrong (an exception: a connection lost
for good, a retry deadline, an authentication error) exits with 1, so a
caller can tell a failure from an answer.
"""

import logging
import os
import sys
import time

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_acl, make_digest_acl

CONNECT_TIMEOUT_S = 10.0


def expire(hosts, credentials):
    """Join the session and close it, then join again until the server says
    it has expired: a close lost with its connection (the owner's client
    taking the session back meanwhile) leaves the session alive."""
    session, password = credentials.split(":")
    client_id = (int(session, 16), bytes.fromhex(password))
    deadline = time.time() + 2 * CONNECT_TIMEOUT_S
    joined_once = False
    while time.time() < deadline:
        lost = []
        zk = KazooClient(hosts=hosts, timeout=CONNECT_TIMEOUT_S,
                         client_id=client_id)
        zk.add_listener(lambda state: lost.append(state)
                        if state == KazooState.LOST else None)
        try:
            zk.start(timeout=3.0)
            joined_once = True
        except KazooTimeoutError:
            pass
        zk.stop()
        zk.close()
        if lost:
            return
    fail("session %s %s" % (session, "did not expire" if joined_once
                                     else "could not be joined"), 2)


def usage():
    sys.stderr.write(__doc__.split("\n\n", 1)[1])
    sys.exit(2)


MISSING = 3
TIMEOUT = 4


def fail(msg, code):
    sys.stderr.write("zkinspect: %s\n" % msg)
    sys.exit(code)


def connect(hosts):
    # Retry individual requests across connection loss so a check that
    # runs during a leader election does not fail spuriously.
    # ZKINSPECT_AUTH="user:password" authenticates with the digest scheme.
    auth = os.environ.get("ZKINSPECT_AUTH")
    zk = KazooClient(
        hosts=hosts,
        timeout=CONNECT_TIMEOUT_S,
        auth_data=[("digest", auth)] if auth else None,
        command_retry=dict(max_tries=-1, delay=0.1, max_delay=1.0,
                           deadline=CONNECT_TIMEOUT_S),
    )
    try:
        zk.start(timeout=CONNECT_TIMEOUT_S)
    except KazooTimeoutError:
        zk.close()
        fail("cannot connect to %s" % hosts, 2)
    return zk


def children(zk, path):
    # The server we happen to be connected to may lag the leader: sync first
    # so a check sees every write that has completed.
    try:
        zk.retry(zk.sync, path)
        return sorted(zk.retry(zk.get_children, path))
    except NoNodeError:
        return []


def walk(zk, path):
    for name in children(zk, path):
        child = path.rstrip("/") + "/" + name
        yield child
        # Ephemeral children may vanish mid-walk; children() copes.
        yield from walk(zk, child)


def main(argv):
    if len(argv) < 4:
        usage()
    hosts, cmd, path, args = argv[1], argv[2], argv[3], argv[4:]
    nargs = {"children": 0, "get": 0, "stat": 0, "tree": 0,
             "delete": 0, "wait-children": 2, "expire": 0,
             "try-delete": 0, "try-set": 1, "try-children": 0}
    if cmd in ("create", "set-acl"):
        if len(args) > 1:
            usage()
    elif cmd not in nargs or len(args) != nargs[cmd]:
        usage()
    if cmd == "wait-children":
        try:
            want, timeout = int(args[0]), float(args[1])
        except ValueError:
            usage()

    if cmd == "expire":
        expire(hosts, path)
        return

    zk = connect(hosts)
    try:
        if cmd == "children":
            for name in children(zk, path):
                print(name)
        elif cmd == "tree":
            for p in walk(zk, path):
                print(p)
        elif cmd == "get":
            try:
                data, _ = zk.retry(zk.get, path)
            except NoNodeError:
                fail("%s: no such node" % path, MISSING)
            print((data or b"").decode("utf-8", "replace"))
        elif cmd == "stat":
            try:
                st = zk.retry(zk.exists, path)
            except NoNodeError:
                st = None
            if st is None:
                fail("%s: no such node" % path, MISSING)
            # Session ids are unsigned on the wire; kazoo hands back signed.
            print("%d 0x%x" % (st.czxid, st.ephemeralOwner & (2**64 - 1)))
        elif cmd == "create":
            data = args[0].encode("utf-8") if args else b""
            if data.startswith(b"hex:"):
                data = bytes.fromhex(data[4:].decode())
            try:
                zk.retry(zk.create, path, data, makepath=True)
            except NodeExistsError:
                fail("%s: node exists" % path, 1)
        elif cmd == "try-children":
            try:
                names = sorted(zk.get_children(path))
            except Exception as e:  # the class name is the answer
                names = [type(e).__name__]
            for name in names:
                print(name)
        elif cmd in ("try-delete", "try-set"):
            try:
                if cmd == "try-delete":
                    zk.delete(path)
                else:
                    zk.set(path, args[0].encode("utf-8"))
                print("ok")
            except Exception as e:  # the class name is the answer
                print(type(e).__name__)
        elif cmd == "set-acl":
            auth = os.environ.get("ZKINSPECT_AUTH")
            if not auth:
                fail("set-acl needs ZKINSPECT_AUTH", 2)
            user, password = auth.split(":", 1)
            acl = [make_digest_acl(user, password, all=True)]
            if args:
                perms = {"c": "create", "d": "delete", "r": "read", "w": "write",
                         "a": "admin"}
                acl.append(make_acl("world", "anyone",
                                    **{perms[p]: True for p in args[0]}))
            zk.retry(zk.set_acls, path, acl)
        elif cmd == "delete":
            if zk.retry(zk.exists, path) is None:
                fail("%s: no such node" % path, MISSING)
            zk.retry(zk.delete, path, recursive=True)
        elif cmd == "wait-children":
            deadline = time.monotonic() + timeout
            while True:
                have = len(children(zk, path))
                if have == want:
                    break
                if time.monotonic() >= deadline:
                    fail("%s: has %d children, wanted %d after %gs"
                         % (path, have, want, timeout), TIMEOUT)
                time.sleep(0.05)
    finally:
        zk.stop()
        zk.close()


if __name__ == "__main__":
    # Kazoo logs connection churn at WARNING/ERROR; tests only want our
    # output and exit status.
    kazoo_log = logging.getLogger("kazoo")
    kazoo_log.addHandler(logging.NullHandler())
    kazoo_log.propagate = False
    main(sys.argv)
