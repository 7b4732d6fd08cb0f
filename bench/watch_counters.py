#!/usr/bin/python3
"""Check what ZooKeeper 3.8's mntr watch counters count, on a live ensemble.

Usage: watch_counters.py MNTR PORT1,PORT2,PORT3 PARENT

MNTR is bench/mntr.  Every ZooKeeper server keeps, in mntr,
zk_{cnt,sum,min,max,avg}_node_deleted_watch_count (and the same for
node_children, node_changed, node_created).  Reading the 3.8 server
(WatchManager.triggerWatch), each server, when it applies a delete of PATH,
calls triggerWatch for PATH's data watches (set by getData and exists),
then for PATH's child watches, then NodeChildrenChanged for the parent's
child watches; each call that finds at least one watcher ADDS the number
of watchers (distinct client connections) it fired to the Summary:
cnt += 1, sum += watchers.  A call that finds none adds nothing.  Watches
live only on the server the client is connected to, so the total number of
notifications a delete sent is the sum of the sum-deltas over all servers,
and cnt-deltas count (server, delete) pairs that fired anything.

This script proves it with kazoo sessions pinned to chosen servers, one
scenario at a time (persistent nodes under PARENT, so no session close
deletes anything behind our back):

  none          delete with no watcher                  -> 0 fired
  one           1 getData watcher on server 1            -> 1
  same-server   3 sessions on server 2 each watching     -> 1 event, 3 fired
  spread        1 watcher on each of the 3 servers       -> 3 events, 3 fired
  one-session   1 session, getData and exists watches    -> 1 fired (a
                on the same node                            connection is one
                                                            watcher)
  parent-child  getChildren watch on the parent, delete  -> 0 deleted-watch,
                a child                                     1 children-watch

It prints one line per scenario and exits 1 if any scenario disagrees:

  WATCHCAL scenario=S expect_events=E expect_fired=F events=... fired=...
           children_fired=... per_server=P:cnt/sum,... ok=1|0
"""

import subprocess
import sys
import threading

from kazoo.client import KazooClient

KEYS = ("zk_cnt_node_deleted_watch_count", "zk_sum_node_deleted_watch_count",
        "zk_sum_node_children_watch_count")


def mntr(script, ports):
    out = subprocess.run([script] + [str(p) for p in ports], check=True,
                         capture_output=True, text=True).stdout
    vals = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1] in KEYS:
            vals[(int(parts[0]), parts[1])] = int(float(parts[2]))
    return vals


class Calibrator(object):
    def __init__(self, script, ports, parent):
        self.script = script
        self.ports = ports
        self.parent = parent
        self.clients = []
        self.failed = False

    def client(self, port):
        zk = KazooClient(hosts="127.0.0.1:%d" % port, timeout=10.0)
        zk.start(timeout=15)
        self.clients.append(zk)
        return zk

    def close_all(self):
        for zk in self.clients:
            zk.stop()
            zk.close()
        self.clients = []

    def scenario(self, name, expect_events, expect_fired, setup):
        """setup(path, events) registers watches and returns the number of
        watch events to wait for (each watcher callback sets one Event)."""
        admin = self.client(self.ports[0])
        path = "%s/%s" % (self.parent, name)
        admin.ensure_path(self.parent)
        admin.create(path, b"x")
        if name == "parent-child":
            child = path + "/child"
            admin.create(child, b"x")
        events = []
        setup(path, events)
        # Every server has applied the creates and registered the watches.
        before = mntr(self.script, self.ports)
        admin.delete(child if name == "parent-child" else path)
        for ev in events:
            if not ev.wait(15):
                raise RuntimeError("%s: a watch did not fire" % name)
        # Every server has applied the delete before we read the counters.
        for port in self.ports:
            self.client(port).sync(self.parent)
        after = mntr(self.script, self.ports)
        if name == "parent-child":
            admin.delete(path)
        self.close_all()

        per_server = []
        events_n = fired = children = 0
        for port in self.ports:
            c = after[(port, KEYS[0])] - before[(port, KEYS[0])]
            s = after[(port, KEYS[1])] - before[(port, KEYS[1])]
            ch = after[(port, KEYS[2])] - before[(port, KEYS[2])]
            events_n += c
            fired += s
            children += ch
            per_server.append("%d:%d/%d" % (port, c, s))
        expect_children = 1 if name == "parent-child" else 0
        ok = (events_n == expect_events and fired == expect_fired
              and children == expect_children)
        if not ok:
            self.failed = True
        print("WATCHCAL scenario=%s expect_events=%d expect_fired=%d events=%d "
              "fired=%d children_fired=%d per_server=%s ok=%d"
              % (name, expect_events, expect_fired, events_n, fired, children,
                 ",".join(per_server), 1 if ok else 0), flush=True)


def data_watch(zk, path, events, how="get"):
    ev = threading.Event()
    events.append(ev)
    if how == "get":
        zk.get(path, watch=lambda e: ev.set())
    else:
        zk.exists(path, watch=lambda e: ev.set())


def main():
    if len(sys.argv) != 4:
        sys.stderr.write("usage: watch_counters.py MNTR PORT1,PORT2,PORT3 PARENT\n")
        return 2
    script = sys.argv[1]
    ports = [int(p) for p in sys.argv[2].split(",")]
    parent = sys.argv[3]
    cal = Calibrator(script, ports, parent)

    def none(path, events):
        pass

    def one(path, events):
        data_watch(cal.client(ports[0]), path, events)

    def same_server(path, events):
        for _ in range(3):
            data_watch(cal.client(ports[1]), path, events)

    def spread(path, events):
        for port in ports:
            data_watch(cal.client(port), path, events)

    def one_session(path, events):
        zk = cal.client(ports[2])
        data_watch(zk, path, events, "get")
        data_watch(zk, path, events, "exists")

    def parent_child(path, events):
        zk = cal.client(ports[1])
        ev = threading.Event()
        events.append(ev)
        zk.get_children(path, watch=lambda e: ev.set())

    try:
        cal.scenario("none", 0, 0, none)
        cal.scenario("one", 1, 1, one)
        cal.scenario("same-server", 1, 3, same_server)
        cal.scenario("spread", 3, 3, spread)
        cal.scenario("one-session", 1, 1, one_session)
        cal.scenario("parent-child", 0, 0, parent_child)
    finally:
        cal.close_all()
        zk = KazooClient(hosts="127.0.0.1:%d" % ports[0], timeout=10.0)
        zk.start(timeout=15)
        zk.delete(parent, recursive=True)
        zk.stop()
        zk.close()
    return 1 if cal.failed else 0


if __name__ == "__main__":
    sys.exit(main())
