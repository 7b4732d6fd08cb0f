#!/usr/bin/python3
"""A kazoo Lock client that takes a lock over and over, for the history
checker (test/t/016_history.pl, test/tools/history_check.pl).

Usage: history_kazoo.py HOSTS ROOT NAME STOPFILE OUTFILE CLIENT

Until the file STOPFILE exists, acquires kazoo's Lock on ROOT/NAME, the node
of zklock's lock NAME under zklock.root ROOT (seeing zklock's nodes as
contenders: extra_lock_patterns=["-lock-"]) with a timeout, holds it a few
milliseconds, and releases it; each hold is a "hold" line in OUTFILE (see
history_check.pl) under the lock's name, as zklock's clients record
theirs, so that the checker compares them, with times on the wall clock.
A hold is vouched for (relok=1) only if the connection stayed connected
from the acquire to the release: kazoo tells its users that a suspended
connection may have cost the lock.  Then prints "done" and waits, with its
session open, until its input ends.

kazoo can leave its node behind when the connection drops while it
acquires (its clean-up is best effort), and that node then holds the lock
for nobody until the session ends; so after any failure this client starts
a new session, as a careful kazoo user does.
"""

import os
import random
import sys
import threading
import time

from kazoo.client import KazooClient, KazooState

hosts, root, name, stopfile, outfile, client = sys.argv[1:7]
path = root + "/" + name

changes = 0
changes_lock = threading.Lock()


def listener(state):
    global changes
    if state != KazooState.CONNECTED:
        with changes_lock:
            changes += 1


zk = KazooClient(hosts=hosts, timeout=6.0)
zk.add_listener(listener)
zk.start(timeout=30)
with open(outfile, "a", buffering=1) as out:
    out.write("client client=%s\n" % client)
    holds = 0
    while not os.path.exists(stopfile):
        lock = zk.Lock(path, "history", extra_lock_patterns=["-lock-"])
        try:
            with changes_lock:
                seen = changes
            if not lock.acquire(timeout=3):
                with changes_lock:
                    faulted = changes != seen
                if faulted:
                    zk.restart()
                continue
            acquired = time.time()
            holds += 1
            token = zk.exists(path + "/" + lock.node).czxid
            time.sleep(random.uniform(0, 0.05))
            released = time.time()
            with changes_lock:
                steady = changes == seen
            lock.release()
            out.write(
                "hold client=%s pid=kazoo id=%s:%d res=%s mode=exclusive "
                "slots=0 acq=%.6f token=%d rel=%.6f reldone=%.6f relok=%d\n"
                % (client, client, holds, name, acquired, token, released,
                   time.time(), int(steady))
            )
        except Exception as e:  # a fault: a new session, a new lock object
            sys.stderr.write("%s: %s\n" % (client, e))
            try:
                zk.restart()
            except Exception as e:
                sys.stderr.write("%s: restart: %s\n" % (client, e))
            time.sleep(0.2)
        time.sleep(random.uniform(0, 0.03))
print("done", flush=True)
sys.stdin.read()
zk.stop()
zk.close()
