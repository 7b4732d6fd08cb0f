#!/usr/bin/python3
"""kazoo Lock acquire+release cycles for the zklock benchmark.

Usage: kazoo_cycle.py HOSTS LOCKPATH

Prints "ready", then reads one command per line:

  run N WARMUP [H]  open a new session to H (default HOSTS; the benchmark
                 gives the one server the repeat pins every client to),
                 make a kazoo Lock on LOCKPATH with extra_lock_patterns=["-lock-"]
                 (the setting zklock's README gives for sharing a queue with
                 zklock), run WARMUP untimed acquire+release cycles, then N
                 timed ones, close the session and print
                   PEER client=kazoo n=N mean_ms=... p50_ms=... min_ms=... max_ms=...
                 mean_ms is the wall time of the N cycles divided by N.
  quit           exit (also on end of input)

Nobody else uses LOCKPATH, so every acquire is uncontended: kazoo's Lock
creates its node, lists the parent (one round trip each), and release
deletes the node (one round trip).  Errors are fatal (exit 1).
"""

import logging
import statistics
import sys
import time

from kazoo.client import KazooClient

SESSION_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 15.0


def run(hosts, path, n, warmup):
    zk = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT_S)
    zk.start(timeout=CONNECT_TIMEOUT_S)
    try:
        lock = zk.Lock(path, "zkbench-kazoo", extra_lock_patterns=["-lock-"])
        times = []
        start = None
        for i in range(warmup + n):
            t0 = time.perf_counter()
            if i == warmup:
                start = t0
            if not lock.acquire(timeout=30):
                raise RuntimeError("acquire timed out")
            lock.release()
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        wall = (time.perf_counter() - start) * 1e3
    finally:
        zk.stop()
        zk.close()
    print("PEER client=kazoo n=%d mean_ms=%.4f p50_ms=%.4f min_ms=%.4f max_ms=%.4f"
          % (n, wall / n, statistics.median(times), min(times), max(times)),
          flush=True)


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: kazoo_cycle.py HOSTS LOCKPATH\n")
        return 2
    hosts, path = sys.argv[1], sys.argv[2]
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "run" and len(words) in (3, 4):
            run(words[3] if len(words) == 4 else hosts, path, int(words[1]), int(words[2]))
        else:
            sys.stderr.write("kazoo_cycle: bad command %r\n" % line)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
