#!/usr/bin/python3
"""The zklock benchmark's measurements; bench/run sets the stage and calls this.

Runs as the unprivileged user, against the ensemble and the cluster that
bench/run started, and prints the results table plus one machine-readable
"BENCH name=..." line per figure.  Everything is configured by the
environment bench/run passes:

  BENCH_WORK      work directory (scratch files go to BENCH_WORK/scratch)
  BENCH_SRC       directory holding this script's siblings (mntr, the peers)
  BENCH_ZKFLOOR   the compiled bench/zkfloor
  BENCH_CLASSPATH Curator's classpath (test/peers/curator-classpath.txt)
  ZK_HOSTS        connect string of the ensemble; ZK_PORTS its client ports
  PGHOST, PGPORT, PGDATABASE, PGUSER   the cluster, with zklock created
  BENCH_QUICK     1: tiny smoke-test sizes
  BENCH_R, BENCH_N, BENCH_CONTENTION_SECONDS   override repeats, cycles
                  per measurement, seconds per contention run
  BENCH_RESULTS   file to write the table and BENCH lines to
  BENCH_STRICT    1: exit 1 if a goal is missed (default: only failed
                  measurements and failed correctness checks exit 1)

Each repeated figure is measured R times, round-robin (repeat 1 of every
figure, then repeat 2, ...), so drift of the machine hits every figure
alike; the table shows the median of the R per-repeat values.
"""

import glob
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import threading
import time

import wire

PGBIN = "/usr/lib/postgresql/15/bin"
PSQL = os.path.join(PGBIN, "psql")
PGBENCH = os.path.join(PGBIN, "pgbench")

WORK = os.environ["BENCH_WORK"]
SRC = os.environ["BENCH_SRC"]
ZKFLOOR = os.environ["BENCH_ZKFLOOR"]
CLASSPATH = os.environ["BENCH_CLASSPATH"]
ZK_HOSTS = os.environ["ZK_HOSTS"]
ZK_PORTS = [int(p) for p in os.environ["ZK_PORTS"].split(",")]
MNTR = os.path.join(SRC, "mntr")
SCRATCH = os.path.join(WORK, "scratch")
QUICK = os.environ.get("BENCH_QUICK", "0") not in ("", "0", "no")
STRICT = os.environ.get("BENCH_STRICT", "0") not in ("", "0", "no")
RESULTS = os.environ.get("BENCH_RESULTS", "")
TCPDUMP = os.environ.get("BENCH_TCPDUMP", "")


def env_int(name, default):
    v = os.environ.get(name, "")
    return int(v) if v else default


# Sizes.  Full: about 15 minutes on 2 cores; quick: well under a minute.
if QUICK:
    R = env_int("BENCH_R", 1)
    N = env_int("BENCH_N", 20)
    WARMUP = 10
    N_REENTRANT = 50
    N_FIRST = 10
    CONTENTION = [2, 4]
    DETECTION_K = 4
    CONTENTION_S = env_int("BENCH_CONTENTION_SECONDS", 1)
    FIFO_WAITERS = 5
    KEEP_N, KEEP_WAITS = 200, 5
    RSS_SAMPLES = 1
    LEAK_WARM, LEAK_CYCLES, LEAK_CHUNKS = 100, 500, 2
    CURATOR_JVM_WARMUP = 100
else:
    R = env_int("BENCH_R", 7)
    N = env_int("BENCH_N", 500)
    WARMUP = 20
    N_REENTRANT = 2000
    N_FIRST = 200
    CONTENTION = [2, 10, 50]
    DETECTION_K = 10
    CONTENTION_S = env_int("BENCH_CONTENTION_SECONDS", 5)
    FIFO_WAITERS = 200
    KEEP_N, KEEP_WAITS = 10000, 50
    RSS_SAMPLES = 5
    LEAK_WARM, LEAK_CYCLES, LEAK_CHUNKS = 2000, 100000, 10
    CURATOR_JVM_WARMUP = 2000

CLK_TCK = os.sysconf("SC_CLK_TCK")
T0 = time.monotonic()

# Keeping (zklock.keep_released): set only in the PGOPTIONS of the backends
# that measure it, on lock names of their own ('k', 'kw', 'kb'), so no other
# figure runs with it.  60 s outlasts every run; a kept node goes with its
# backend's session when pgbench ends.
KEEP_OPTIONS = "-c zklock.keep_released=60s"
# A kept cycle takes about as long as an advisory one, a few hundredths of
# a ms: N of them last a few tens of ms, which one hiccup of the machine
# swamps.  KEEP_N cycles on each side of that ratio last a second or so.
# The waiter of the keeping figure asks every KEEP_WAIT_GAP s ("now and
# then": the keeper is back to taking its kept node long before), and gives
# up after KEEP_WAIT_LIMIT rather than hang if the keeper does not let go.
KEEP_WAIT_GAP = 0.2
KEEP_WAIT_LIMIT = "5 s"


class BenchError(Exception):
    pass


# The ZooKeeper server every client of the current repeat connects to (a
# connect string of one server), or None for the whole ensemble.  A client
# on the leader commits a write one hop sooner than a client on a follower,
# so a ratio between two clients on different servers measures the draw,
# not the clients: each repeat pins both sides of every comparison to one
# server, and the repeats take the servers in turn.
PIN = None

# The (release stamp, grant stamp) pairs of the last release_to_grant run.
LAST_HANDOFFS = []
LAST_CLIENT_CPU = [None]  # of the last release_to_grant: see CpuSampler

# The parts of a handoff split on the wire (bench/wire.py).
WIRE_PARTS = ("releaser", "ensemble", "waiter")


def zk_hosts():
    return PIN or ZK_HOSTS


def pg_env(options="", **extra):
    """Environment for psql/pgbench: zklock.hosts pinned like the rest, and
    any further settings ("-c name=value ...")."""
    env = dict(os.environ, **extra)
    if PIN:
        options = "-c zklock.hosts=%s %s" % (PIN, options)
    if options.strip():
        env["PGOPTIONS"] = options.strip()
    return env


def log(msg):
    print("[%6.1fs] %s" % (time.monotonic() - T0, msg), flush=True)


def run(cmd, timeout=600, **kw):
    """Run cmd, return stdout; raise BenchError with its output on failure."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise BenchError("%s: timed out after %ss" % (cmd[0], timeout)) from e
    if p.returncode != 0:
        raise BenchError("%s failed (exit %d):\n%s%s" % (" ".join(cmd), p.returncode,
                                                         p.stdout[-2000:], p.stderr[-2000:]))
    return p.stdout


def scratch(name):
    return os.path.join(SCRATCH, name)


def write_file(name, text):
    path = scratch(name)
    with open(path, "w") as f:
        f.write(text)
    return path


def kv(line):
    """'TAG a=1 b=x' -> {'a': '1', 'b': 'x'}"""
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)


# ---------------------------------------------------------------- ZooKeeper

def mntr():
    """{port: {key: value}} for every server, read through bash /dev/tcp."""
    out = run([MNTR] + [str(p) for p in ZK_PORTS], timeout=30)
    res = {p: {} for p in ZK_PORTS}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        try:
            res[int(parts[0])][parts[1]] = float(parts[2])
        except ValueError:
            res[int(parts[0])][parts[1]] = parts[2]
    return res


def mntr_delta(before, after, key):
    return sum(after[p][key] - before[p][key] for p in ZK_PORTS)


def four_letter(port, word):
    return run(["bash", "-c",
                'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf %s "$2" >&3 && timeout 5 cat <&3',
                "_", str(port), word], timeout=30)


def session_counters(server, session_id):
    """(lcxid, recved) of one session from the 'cons' word of its server.

    lcxid is the xid of the last request the session sent; pings carry a
    negative xid and leave it alone, so its change counts real requests."""
    port = int(server.rsplit(":", 1)[1])
    sid = int(session_id, 16)
    for line in four_letter(port, "cons").splitlines():
        m = re.search(r"sid=0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) == sid:
            lcxid = re.search(r"lcxid=0x([0-9a-f]+)", line)
            recved = re.search(r"recved=(\d+)", line)
            return (int(lcxid.group(1), 16) if lcxid else 0,
                    int(recved.group(1)) if recved else 0)
    raise BenchError("session %s not found in 'cons' of %s" % (session_id, server))


# --------------------------------------------------------------- PostgreSQL

class Psql(object):
    """One psql session driven through a pipe: one backend, one ZK session."""
    MARK = "__ZKBENCH_DONE__"

    def __init__(self, app="zkbench"):
        env = pg_env(PGAPPNAME=app)
        self.p = subprocess.Popen(
            [PSQL, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=env)
        self.buf = b""
        self.pid = int(self.query("SELECT pg_backend_pid()")[0])

    def run(self, text, timeout=900):
        """Send text (SQL and meta-commands); return its output lines."""
        self.p.stdin.write((text.rstrip("\n") + "\n\\echo " + self.MARK + "\n").encode())
        self.p.stdin.flush()
        deadline = time.monotonic() + timeout
        lines = []
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                line = line.decode(errors="replace")
                if line == self.MARK:
                    return lines
                lines.append(line)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError("psql: no answer within %ss to %r" % (timeout, text[:200]))
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 65536)
                if not chunk:
                    raise BenchError("psql exited (%s) running %r:\n%s" % (
                        self.p.wait(), text[:200], "\n".join(lines[-20:]) + self.buf.decode()))
                self.buf += chunk

    def query(self, sql, timeout=900):
        return [l for l in self.run(sql.rstrip().rstrip(";") + ";", timeout) if l != ""]

    def value(self, sql):
        rows = self.query(sql)
        if len(rows) != 1:
            raise BenchError("expected one row from %r, got %r" % (sql, rows))
        return rows[0]

    def close(self):
        end_process(self.p)


def end_process(p, goodbye=None):
    """Close a client's stdin (after a last word), wait, kill if it hangs."""
    if p.poll() is not None:
        return
    try:
        if goodbye:
            p.stdin.write(goodbye)
        p.stdin.close()
    except BrokenPipeError:
        pass
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def psql_one(sql):
    return run([PSQL, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql]).strip()


def proc_status(pid):
    vals = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                vals[k] = int(v.split()[0])      # kB
    return vals


def proc_cpu_ticks(pid):
    """utime+stime of the whole process (all threads) from /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])      # fields 14 and 15


def main_thread_user_sys_ticks(pid):
    """utime and stime of the main thread alone, from /proc/PID/task/PID/stat."""
    with open("/proc/%d/task/%d/stat" % (pid, pid)) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def proc_cpu_ns(pid):
    """CPU time, ns, from /proc/PID/task/*/schedstat: (main thread, the
    other live threads, i.e. the ZooKeeper client library's)."""
    main = others = 0
    for path in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            with open(path) as f:
                ns = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if path == "/proc/%d/task/%d/schedstat" % (pid, pid):
            main += ns
        else:
            others += ns
    return main, others


def cycle_file(name, statements, count):
    """A file repeating statements count times, for psql's \\i."""
    return write_file(name, ("\n".join(statements) + "\n") * count)


# ------------------------------------------------------------------ pgbench

def pgbench(script, extra, tag, timeout=900, options=""):
    """Run pgbench with per-transaction logging; return the sorted
    transaction end times in seconds, and the number of failed ones."""
    prefix = scratch("pgb-" + tag)
    for f in glob.glob(prefix + ".*"):
        os.unlink(f)
    out = run([PGBENCH, "-n", "-f", script, "-l", "--log-prefix=" + prefix] + extra,
              timeout=timeout, cwd=SCRATCH, env=pg_env(options))
    m = re.search(r"number of failed transactions: (\d+)", out)
    failed = int(m.group(1)) if m else 0
    ends = []
    for f in glob.glob(prefix + ".*"):
        with open(f) as fh:
            for line in fh:
                w = line.split()
                # client_id transaction_no time script_no time_epoch time_us
                ends.append(int(w[4]) + int(w[5]) / 1e6)
        os.unlink(f)
    ends.sort()
    if failed:
        raise BenchError("pgbench %s: %d failed transactions:\n%s" % (tag, failed, out))
    return ends


def pgbench_period_ms(script, n, warmup, tag, extra=(), options=""):
    """One client, warmup+n transactions: mean time per transaction of the
    last n, from the transaction end times (so it includes everything
    between two transactions, like a loop's wall time / n)."""
    ends = pgbench(script, ["-c", "1", "-t", str(warmup + n)] + list(extra), tag,
                   options=options)
    if len(ends) != warmup + n:
        raise BenchError("pgbench %s: %d transactions logged, expected %d"
                         % (tag, len(ends), warmup + n))
    return (ends[-1] - ends[warmup - 1]) * 1e3 / n


def commit_latency_ms(pause_s, n):
    """Mean latency of COMMIT in BEGIN; zk_xact_lock; pg_sleep(pause); COMMIT
    (pgbench -r), with a 3 s session timeout: a pause past a sixth of it
    makes COMMIT ask the leader for a sync first."""
    out = run([PGBENCH, "-n", "-r", "-f", SQL["commit_check"], "-c", "1", "-t", str(n),
               "-D", "pause=%g" % pause_s], cwd=SCRATCH,
              env=pg_env("-c zklock.session_timeout=3000"))
    for line in out.splitlines():
        if line.strip().endswith("COMMIT;"):
            return float(line.split()[0])
    raise BenchError("pgbench -r printed no COMMIT latency:\n" + out)


def commit_check(rep):
    """The cost of COMMIT's leader check: COMMIT after a pause of 1.2 s
    (over a sixth of the 3 s session timeout) minus COMMIT right away."""
    n = 3 if QUICK else 8
    fresh = commit_latency_ms(0, n)
    stale = commit_latency_ms(1.2, n)
    RES.add("commit_fresh_ms", fresh)
    RES.add("commit_stale_ms", stale)
    RES.add("commit_check_extra_ms", stale - fresh)
    return stale - fresh


# ------------------------------------------------------------------ results

class Results(object):
    def __init__(self):
        self.values = {}          # name -> list of per-repeat values
        self.notes = {}           # name -> extra text
        self.failures = []        # correctness failures
        self.servers = []         # server (and its role) of each repeat

    def add(self, name, value):
        self.values.setdefault(name, []).append(value)

    def median(self, name):
        v = self.values.get(name)
        return statistics.median(v) if v else None

    def fail(self, msg):
        log("FAILED CHECK: " + msg)
        self.failures.append(msg)


RES = Results()


# ============================================================= measurements

def library_digest():
    """sha256 of the installed zklock.so (another make install during the
    run would mix builds in the figures)."""
    import hashlib
    libdir = run([os.path.join(PGBIN, "pg_config"), "--pkglibdir"]).strip()
    with open(os.path.join(libdir, "zklock.so"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def zk_log_warnings():
    """Slow fsyncs and other stalls the servers logged (their logs go away
    with the work directory)."""
    fsyncs = []
    other = {}
    for path in sorted(glob.glob(os.path.join(WORK, "zk", "zk*", "server.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(r"fsync-ing the write ahead log in \S+ took (\d+)ms", line)
                if m:
                    fsyncs.append(int(m.group(1)))
                    continue
                for pat in ("Too many connections", "Exception causing close of session",
                            "shutting down", "LOOKING"):
                    if pat in line and (" WARN " in line or " ERROR " in line):
                        other[pat] = other.get(pat, 0) + 1
    RES.fsyncs = fsyncs
    RES.zk_other_warnings = other
    try:
        m = mntr()
        RES.fsync_mntr = " ".join(
            "%d:%s" % (p, ",".join("%s=%s" % (k[3:], fmt(v, 1)) for k, v in sorted(m[p].items())
                                  if "fsync" in k and not isinstance(v, str)))
            for p in ZK_PORTS)
    except BenchError:
        RES.fsync_mntr = "unavailable"


def calibrate_mntr():
    """mntr's own connection counts as a packet received: measure it."""
    a = mntr()
    b = mntr()
    per_read = {p: b[p]["zk_packets_received"] - a[p]["zk_packets_received"] for p in ZK_PORTS}
    RES.mntr_self = sum(per_read.values())
    log("each mntr read counts as %s packet(s) received per server (%s)"
        % (sorted(set(per_read.values())), per_read))


def calibrate_watch_counters():
    """What the watch counters count (run last: its 3-watcher deletes
    would otherwise show in the lifetime max the contention runs check)."""
    log("== watch counter calibration")
    out = run(["/usr/bin/python3", os.path.join(SRC, "watch_counters.py"), MNTR,
               ",".join(str(p) for p in ZK_PORTS), "/zkbench/watchcal"], timeout=120)
    RES.watchcal = [l for l in out.splitlines() if l.startswith("WATCHCAL")]
    for l in RES.watchcal:
        log(l)
        if "ok=1" not in l:
            RES.fail("watch counter calibration: " + l)


def floor_result(out):
    """zkfloor's FLOOR line: its mean handoff or cycle (ms) and its own CPU
    per cycle (us)."""
    line = kv([l for l in out.splitlines() if l.startswith("FLOOR")][0])
    return float(line["mean_ms"]), float(line["cpu_us"])


def take_stamps(path):
    """The release and grant stamps zkfloor wrote (ZKFLOOR_STAMPS), in pairs;
    the file is removed."""
    with open(path) as f:
        pairs = [tuple(float(x) for x in line.split()) for line in f if line.strip()]
    os.unlink(path)
    return pairs


def floor(mode):
    return floor_result(run([ZKFLOOR, zk_hosts(), mode, str(N), "1", str(WARMUP),
                             "/zkbench/floor-" + mode]))


class Peer(object):
    def __init__(self, name, cmd):
        self.name = name
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(scratch(name + ".err"), "w"), text=True,
                                  bufsize=1, cwd=SCRATCH)
        line = self.p.stdout.readline().strip()
        if line != "ready":
            raise BenchError("%s peer did not start: %r\n%s" % (
                name, line, open(scratch(name + ".err")).read()[-2000:]))

    def cycle_ms(self, n, warmup):
        self.p.stdin.write("run %d %d %s\n" % (n, warmup, zk_hosts()))
        self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        if not line.startswith("PEER"):
            raise BenchError("%s peer failed: %r\n%s" % (
                self.name, line, open(scratch(self.name + ".err")).read()[-2000:]))
        return float(kv(line)["mean_ms"])

    def close(self):
        end_process(self.p, "quit\n")


def reentrant(rep):
    """A holder re-acquires N times: time per call, and ZooKeeper requests."""
    lock_f = cycle_file("reent-lock.sql", ["SELECT zk_lock('r');"], N_REENTRANT)
    unlock_f = cycle_file("reent-unlock.sql", ["SELECT zk_unlock('r');"], N_REENTRANT)
    s = Psql("zkbench-reentrant")
    try:
        # A long session timeout: the session's heartbeat, sent a quarter
        # timeout after the last answer, then falls outside the window.
        s.query("SET zklock.session_timeout = '60s'")
        s.query("SELECT zk_lock('r')")
        st = s.query("SELECT server, session_id, acquisitions, waits FROM zk_status()")[0].split("|")
        server, sid, acq0, waits0 = st[0], st[1], int(st[2]), int(st[3])
        if PIN and server != PIN:
            RES.fail("zklock.hosts pinning did not take: session on %s, expected %s"
                     % (server, PIN))
        c0 = session_counters(server, sid)
        m0 = mntr()
        w0 = time.monotonic()
        out = s.run("SELECT extract(epoch FROM clock_timestamp());\n\\o /dev/null\n\\i %s\n\\o\n"
                    "SELECT extract(epoch FROM clock_timestamp());\n\\o /dev/null\n\\i %s\n\\o\n"
                    "SELECT extract(epoch FROM clock_timestamp());" % (lock_f, unlock_f))
        window = time.monotonic() - w0
        m1 = mntr()
        c1 = session_counters(server, sid)
        ts = [float(x) for x in out if x.strip()]
        st = s.query("SELECT acquisitions, waits, locks_held FROM zk_status()")[0].split("|")
        acq1, waits1 = int(st[0]), int(st[1])
        holds = s.value("SELECT holds FROM zk_locks WHERE name = 'r'")
        # The same window with the session idle: pings only.
        m2 = mntr()
        time.sleep(window)
        m3 = mntr()
        if s.value("SELECT zk_unlock('r')") != "t":
            RES.fail("re-entrant: final zk_unlock did not return true")
        if s.query("SELECT * FROM zk_locks"):
            RES.fail("re-entrant: locks left after the unlocks")
    finally:
        s.close()
    # The same statements with advisory locks, which stack the same way.
    adv_lock_f = cycle_file("reent-adv-lock.sql", ["SELECT pg_advisory_lock(9);"], N_REENTRANT)
    adv_unlock_f = cycle_file("reent-adv-unlock.sql", ["SELECT pg_advisory_unlock(9);"],
                              N_REENTRANT)
    s = Psql("zkbench-reentrant-adv")
    try:
        s.query("SELECT pg_advisory_lock(9)")
        out = s.run("SELECT extract(epoch FROM clock_timestamp());\n\\o /dev/null\n\\i %s\n\\o\n"
                    "SELECT extract(epoch FROM clock_timestamp());\n\\o /dev/null\n\\i %s\n\\o\n"
                    "SELECT extract(epoch FROM clock_timestamp());" % (adv_lock_f, adv_unlock_f))
        adv = [float(x) for x in out if x.strip()]
    finally:
        s.close()
    RES.add("reentrant_adv_lock_us", (adv[1] - adv[0]) * 1e6 / N_REENTRANT)
    RES.add("reentrant_adv_unlock_us", (adv[2] - adv[1]) * 1e6 / N_REENTRANT)
    lock_us = (ts[1] - ts[0]) * 1e6 / N_REENTRANT
    unlock_us = (ts[2] - ts[1]) * 1e6 / N_REENTRANT
    packets = mntr_delta(m0, m1, "zk_packets_received") - RES.mntr_self
    idle = mntr_delta(m2, m3, "zk_packets_received") - RES.mntr_self
    RES.add("reentrant_lock_us", lock_us)
    RES.add("reentrant_unlock_us", unlock_us)
    RES.add("reentrant_session_requests", c1[0] - c0[0])
    RES.add("reentrant_session_packets", c1[1] - c0[1])
    RES.add("reentrant_ensemble_packets", packets)
    RES.add("reentrant_idle_packets", idle)
    RES.add("reentrant_acquisitions", acq1 - acq0)
    RES.add("reentrant_waits", waits1 - waits0)
    if acq1 - acq0 != N_REENTRANT:
        RES.fail("re-entrant: zk_status acquisitions grew by %d, expected %d"
                 % (acq1 - acq0, N_REENTRANT))
    if holds != "1":
        RES.fail("re-entrant: %s holds after N locks and N unlocks, expected 1" % holds)
    return lock_us


def cpu_cycles(kind, n, warmup):
    """Backend CPU per cycle over n cycles in one fresh backend."""
    stmts = {"zk": ["SELECT zk_lock('cpu');", "SELECT zk_unlock('cpu');"],
             "adv": ["SELECT pg_advisory_lock(1);", "SELECT pg_advisory_unlock(1);"]}[kind]
    warm_f = cycle_file("cpu-warm-%s.sql" % kind, stmts, warmup)
    main_f = cycle_file("cpu-main-%s.sql" % kind, stmts, n)
    s = Psql("zkbench-cpu")
    try:
        s.run("\\o /dev/null\n\\i %s\n\\o" % warm_f)
        t0, c0 = proc_cpu_ticks(s.pid), proc_cpu_ns(s.pid)
        w0 = time.monotonic()
        s.run("\\o /dev/null\n\\i %s\n\\o" % main_f)
        wall = time.monotonic() - w0
        t1, c1 = proc_cpu_ticks(s.pid), proc_cpu_ns(s.pid)
    finally:
        s.close()
    return ((t1 - t0) * 1e6 / CLK_TCK / n, (sum(c1) - sum(c0)) / 1e3 / n,
            (c1[0] - c0[0]) / 1e3 / n, (c1[1] - c0[1]) / 1e3 / n)


def contention(k, rep):
    """k backends cycling zk_lock/zk_unlock on one lock for CONTENTION_S s."""
    before = mntr()
    ends = pgbench(SQL["contend"], ["-c", str(k), "-j", "2", "-T", str(CONTENTION_S)],
                   "contend%d" % k, timeout=CONTENTION_S + 300)
    after = mntr()
    total = len(ends)
    if total < 10:
        raise BenchError("contention %d: only %d cycles" % (k, total))
    # Leave out the start (connections, first sessions) from the rate.
    skip = min(max(k, total // 10), total // 2)
    window = ends[-1] - ends[skip]
    rate = (total - 1 - skip) / window
    fired = mntr_delta(before, after, "zk_sum_node_deleted_watch_count")
    events = mntr_delta(before, after, "zk_cnt_node_deleted_watch_count")
    children = mntr_delta(before, after, "zk_sum_node_children_watch_count")
    changed = mntr_delta(before, after, "zk_sum_node_changed_watch_count")
    created = mntr_delta(before, after, "zk_sum_node_created_watch_count")
    maxper = max(after[p]["zk_max_node_deleted_watch_count"] for p in ZK_PORTS)
    RES.add("contention_c%d_cycles_per_s" % k, rate)
    RES.add("contention_c%d_period_ms" % k, 1e3 / rate)
    RES.add("contention_c%d_watchers_per_release" % k, fired / total)
    RES.add("contention_c%d_watch_events_per_release" % k, events / total)
    RES.add("contention_c%d_other_watchers" % k, children + changed + created)
    RES.add("contention_c%d_max_watchers_one_delete" % k, maxper)
    return rate


def release_to_grant(k, rep, options="", suffix=""):
    """k backends cycling on one lock, each stamping the moment its grant
    returned (after zk_lock, in the statement that took it) and the moment
    just before its release (in the statement of zk_unlock).  The interval
    from each release to the next grant is the handoff proper, without the
    client's round trips; stamps that do not alternate release, grant,
    release... would mean two holders at once.  options are further
    settings for the backends; suffix tells their figures apart."""
    psql_one("TRUNCATE zkbench_handoff")
    sampler = CpuSampler()
    try:
        pgbench(SQL["handoff"], ["-c", str(k), "-j", "2", "-T", str(CONTENTION_S)],
                "handoff%d%s" % (k, suffix), timeout=CONTENTION_S + 300, options=options)
    finally:
        sampler.stop()
    rows = psql_one("SELECT what || ' ' || extract(epoch FROM at) FROM zkbench_handoff "
                    "ORDER BY at").split("\n")
    events = [(w, float(t)) for w, t in (r.split() for r in rows if r.strip())]
    if len(events) < 20:
        raise BenchError("handoff %d: only %d stamps" % (k, len(events)))
    # Leave out the start (connections, first sessions).
    skip = min(max(2 * k, len(events) // 10), len(events) // 2)
    intervals = []
    if events[0][0] != "g":
        RES.fail("handoff %d: the first stamp is a release" % k)
        return None
    for (w1, t1), (w2, t2) in zip(events, events[1:]):
        if w1 == w2:
            RES.fail("handoff %d: two %s stamps in a row: the lock had two holders, "
                     "or a stamp was lost" % (k, "grant" if w1 == "g" else "release"))
            return None
    pairs = [(t1, t2) for (w1, t1), (w2, t2) in zip(events[skip:], events[skip + 1:])
             if w1 == "r" and w2 == "g"]
    intervals = [(g - r) * 1e3 for r, g in pairs]
    mean = statistics.mean(intervals)
    RES.add("contention_c%d_release_to_grant%s_ms" % (k, suffix), mean)
    RES.add("contention_c%d_release_to_grant%s_p50_ms" % (k, suffix),
            statistics.median(intervals))
    LAST_HANDOFFS[:] = pairs
    LAST_CLIENT_CPU[0] = sampler.per_handoff_ms(pairs)
    if LAST_CLIENT_CPU[0] is not None:
        RES.add("contention_c%d_client_cpu%s_ms" % (k, suffix), LAST_CLIENT_CPU[0])
    return mean


def floor_requeue(k, rep, burn_us=0):
    """requeue-K, each releaser first spending burn_us of CPU on its own
    thread (ZKFLOOR_BURN_US), for 2N handoffs: the CPU figure is read off
    100 Hz tick counts, which a run of N alone leaves coarse.  Returns the
    mean handoff, zkfloor's own CPU per handoff, and the CPU the machine
    spent outside the ensemble per handoff (None in a quick run)."""
    stamps = scratch("floor-cpu-stamps-%d-%d" % (k, rep))
    sampler = CpuSampler()
    try:
        out = run([ZKFLOOR, zk_hosts(), "requeue-%d" % k, str(2 * N), "1", str(WARMUP),
                   "/zkbench/floor-requeue"],
                  env=dict(os.environ, ZKFLOOR_STAMPS=stamps, ZKFLOOR_BURN_US=str(int(burn_us))))
    finally:
        sampler.stop()
    mean, own_cpu = floor_result(out)
    return mean, own_cpu, sampler.per_handoff_ms(take_stamps(stamps))


def lock_stats(name):
    """(acquisitions, kept_acquisitions) of a lock name, server-wide
    (zk_stat_locks)."""
    out = psql_one("SELECT coalesce(sum(acquisitions), 0) || ' ' || "
                   "coalesce(sum(kept_acquisitions), 0) FROM zk_stat_locks "
                   "WHERE name = '%s'" % name)
    acquisitions, kept = out.split()
    return int(acquisitions), int(kept)


def keep_cycle(rep):
    """The uncontended cycle with keeping on: pgbench -c 1 on a name of its
    own; its backend keeps the node at each release and takes it back at
    the next zk_lock.  Also what share of the cycles took the kept node."""
    before = lock_stats("k")
    v = pgbench_period_ms(SQL["keep"], KEEP_N, WARMUP, "keep", options=KEEP_OPTIONS)
    after = lock_stats("k")
    RES.add("keep_cycle_kept", (after[1] - before[1]) / (WARMUP + KEEP_N))
    return v


class KeepLoop(object):
    """A backend looping zk_lock + zk_unlock on name with keeping on
    (pgbench -c 1), in the background until stopped: the keeper."""

    def __init__(self, name):
        self.name = name
        script = write_file("keep-%s.sql" % name, "SELECT zk_lock('%s');\n"
                            "SELECT zk_unlock('%s');\n" % (name, name))
        self.before = lock_stats(name)
        self.out = open(scratch("keep-%s.log" % name), "w+")
        # -T far beyond any use: stop() ends it.
        self.p = subprocess.Popen([PGBENCH, "-n", "-f", script, "-c", "1", "-T", "900"],
                                  stdout=self.out, stderr=subprocess.STDOUT, cwd=SCRATCH,
                                  env=pg_env(KEEP_OPTIONS))
        # Started once its cycles take the kept node (its first cycles open
        # the session and make the node).
        deadline = time.monotonic() + 30
        while lock_stats(name)[1] - self.before[1] < WARMUP:
            self.check_running()
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError("keeping loop on '%s': not taking its kept node after 30 s"
                                 % name)
            time.sleep(0.05)

    def check_running(self):
        if self.p.poll() is not None:
            self.out.seek(0)
            raise BenchError("keeping loop on '%s' ended (exit %s):\n%s"
                             % (self.name, self.p.returncode, self.out.read()[-2000:]))

    def stop(self):
        """Returns the name's (acquisitions, kept acquisitions) since the
        start, read while the loop still runs; an error if it had ended."""
        after = lock_stats(self.name)
        self.check_running()
        self.kill()
        return after[0] - self.before[0], after[1] - self.before[1]

    def kill(self):
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait()
        self.out.close()


def floor_yield_busy():
    """floor yield while a keeper loops on another name: the machine as
    busy as while the keeping figure's waiter waits."""
    loop = KeepLoop("kb")
    try:
        v, _ = floor("yield")
        loop.stop()
    finally:
        loop.kill()
    return v


def keep_waits(rep):
    """A keeper loops zk_lock + zk_unlock on 'kw' with keeping on; a second
    backend of the same cluster (its own ZooKeeper session, keeping off)
    asks for the lock every KEEP_WAIT_GAP s, stamping clock_timestamp()
    just before its zk_lock and as it returns, in the statement that takes
    the lock (a target list is evaluated in order).  Returns the mean wait
    from request to grant; records the keeper's cycles served from its
    kept node."""
    waiter = Psql("zkbench-keep-waiter")
    try:
        # Its session opens at its first lock: before the keeper runs.
        waiter.query("SELECT zk_lock('kw')")
        waiter.query("SELECT zk_unlock('kw')")
        keeper = KeepLoop("kw")
        try:
            waits = []
            # The first request is a warm-up.
            for i in range(KEEP_WAITS + 1):
                time.sleep(KEEP_WAIT_GAP)
                asked, got, granted = waiter.value(
                    "SELECT extract(epoch FROM clock_timestamp()), "
                    "zk_lock('kw', interval '%s'), extract(epoch FROM clock_timestamp())"
                    % KEEP_WAIT_LIMIT).split("|")
                if got != "t":
                    raise BenchError("the waiter was not granted within %s: the keeper kept "
                                     "its node" % KEEP_WAIT_LIMIT)
                waiter.query("SELECT zk_unlock('kw')")
                if i > 0:
                    waits.append((float(granted) - float(asked)) * 1e3)
            acquisitions, kept = keeper.stop()
        finally:
            keeper.kill()
    finally:
        waiter.close()
    cycles = acquisitions - (KEEP_WAITS + 1)
    mean = statistics.mean(waits)
    RES.add("keep_waiter_ms", mean)
    RES.add("keep_waiter_p50_ms", statistics.median(waits))
    RES.add("keep_waiter_max_ms", max(waits))
    waits.sort()
    log("keeping: the waiter's %d waits, ms: min %.3f, p50 %.3f, p90 %.3f, max %.3f"
        % (len(waits), waits[0], statistics.median(waits), waits[int(0.9 * (len(waits) - 1))],
           waits[-1]))
    RES.add("keep_keeper_cycles", cycles)
    RES.add("keep_keeper_kept", kept / cycles)
    # Besides its first cycle (no node yet), each request costs the keeper
    # the cycle it queues behind the waiter in; more would be kept nodes
    # given up for nothing.
    RES.add("keep_keeper_not_kept_per_wait", (cycles - 1 - kept) / (KEEP_WAITS + 1))
    return mean


class Capture(object):
    """tcpdump on the loopback, writing the ensemble's client traffic to a
    pcap file until stopped."""

    def __init__(self, name):
        self.path = scratch(name + ".pcap")
        ports = " or ".join("port %d" % p for p in ZK_PORTS)
        self.err = open(scratch(name + ".tcpdump.log"), "w+")
        # Immediate mode: packets still in a half-filled kernel block when
        # tcpdump stops would be lost.
        self.proc = subprocess.Popen([TCPDUMP, "-i", "lo", "-n", "-s", "0", "-B", "65536",
                                      "--immediate-mode", "-U",
                                      "--time-stamp-precision=nano", "-w", self.path,
                                      "tcp and (%s)" % ports],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.err.seek(0)
            text = self.err.read()
            if "listening on" in text:
                return
            if self.proc.poll() is not None:
                raise BenchError("tcpdump exited: %s" % text.strip())
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise BenchError("tcpdump did not start listening within 10 s")

    def stop(self):
        """Stop; returns the pcap file's path.  Dropped packets are an error:
        a missing delete or notification would pair the wrong events."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        dropped = re.search(r"(\d+) packets? dropped by kernel", text)
        captured = re.search(r"(\d+) packets? captured", text)
        received = re.search(r"(\d+) packets? received by filter", text)
        # On the loopback the filter sees each packet twice; a few may be
        # left unread when it stops, after the run (the servers' pings).
        if dropped is None or captured is None or received is None or \
                int(dropped.group(1)) != 0 or \
                int(received.group(1)) > 2 * int(captured.group(1)) + 200:
            raise BenchError("tcpdump lost packets, or said nothing of them: %s" % text.strip())
        return self.path


def cpu_ticks():
    """(busy, total) jiffies of the whole machine, from /proc/stat: busy is
    user, nice, system, irq and softirq; total adds idle, iowait and steal
    (guest time is already in user)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


def ensemble_pids():
    """The ensemble's server processes: their command lines name the work
    directory's zk/."""
    mark = (WORK + "/zk/").encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if mark in f.read():
                    pids.append(pid)
        except OSError:
            pass
    return pids


class CpuSampler(object):
    """Samples, every 0.1 s on a thread of its own, the wall clock, the
    machine's busy jiffies and the ensemble's, so that the CPU the machine
    spent outside the ensemble can be read between any two moments of a
    run (sessions opening at its start are thus left out, as the timed
    handoffs leave them out)."""

    def __init__(self):
        self.pids = ensemble_pids()
        # Without all three servers' CPU the figures would mean nothing:
        # they are then left out (None), and the run goes on.
        self.broken = len(self.pids) != len(ZK_PORTS)
        if self.broken:
            log("CPU sampler: found %d ensemble processes, not %d; no CPU figures"
                % (len(self.pids), len(ZK_PORTS)))
        self.samples = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def ensemble_ticks(self):
        total = 0
        for pid in self.pids:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total

    def loop(self):
        while not self.broken:
            busy, _ = cpu_ticks()
            try:
                ensemble = self.ensemble_ticks()
            except OSError:
                self.broken = True
                return
            self.samples.append((time.time(), busy - ensemble))
            if self.stop_flag.wait(0.1):
                return

    def stop(self):
        self.stop_flag.set()
        self.thread.join()

    def per_handoff_ms(self, pairs):
        """Outside-ensemble CPU per handoff, in ms, between the first and
        the last sample that fall within the timed handoffs (release and
        grant stamps in pairs), over the handoffs released between them;
        None when the run was too short for that (a quick run)."""
        if self.broken:
            return None
        first, last = pairs[0][0], pairs[-1][1]
        inside = [(t, b) for t, b in self.samples if first <= t <= last]
        if len(inside) < 3:
            return None
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        count = sum(1 for r, _ in pairs if t0 <= r < t1)
        if count < 10:
            return None
        return (b1 - b0) * 1e3 / os.sysconf("SC_CLK_TCK") / count


def under_capture(name, fn):
    """Run fn under a capture.  Returns the pcap file and the share of the
    cores that were busy meanwhile."""
    cap = Capture(name)
    b0, t0 = cpu_ticks()
    try:
        fn()
    finally:
        pcap = cap.stop()
    b1, t1 = cpu_ticks()
    return pcap, (b1 - b0) / max(1, t1 - t0)


def split_on_the_wire(k, who, pairs, pcap, busy):
    """Record the split of one side's handoffs (release and grant stamps in
    pairs) from its capture; returns (releaser, ensemble, waiter) means."""
    deletes, notes = wire.deletes_and_notifications(pcap, ZK_PORTS)
    os.unlink(pcap)
    rel, ens, wai, other = wire.split_handoffs(pairs, deletes, notes)
    if len(rel) < max(5, len(pairs) // 10):
        raise BenchError("%s, %d contenders: only %d of %d handoffs were granted by a "
                         "notification" % (who, k, len(rel), len(pairs)))
    parts = (statistics.mean(rel), statistics.mean(ens), statistics.mean(wai))
    for name, v in zip(WIRE_PARTS, parts):
        RES.add("wire_c%d_%s_%s_ms" % (k, who, name), v)
    RES.add("wire_c%d_%s_total_ms" % (k, who), sum(parts))
    RES.add("wire_c%d_%s_notified" % (k, who), len(rel) / (len(rel) + other))
    RES.add("wire_c%d_%s_cpu_busy" % (k, who), busy)
    log("on the wire, %d contenders, %s: %.3f ms = releaser %.3f + ensemble %.3f + waiter "
        "%.3f (%d of %d handoffs granted by a notification; the cores %.0f %% busy)"
        % ((k, who, sum(parts)) + parts + (len(rel), len(rel) + other, 100 * busy)))
    return parts


def handoff_on_the_wire(k, rep):
    """Split handoffs into the releaser's side, the ensemble's and the
    waiter's (bench/wire.py), for the floor's contenders and for zklock's
    backends, each run once more under a capture.  Only handoffs granted
    by a deletion's notification split; the others (the successor asked
    for its predecessor after the delete, was told it was gone, and
    listed) are counted apart."""
    stamps = scratch("floor-stamps-%d-%d" % (k, rep))
    pcap, busy = under_capture("floor-requeue-%d-%d" % (k, rep), lambda: run(
        [ZKFLOOR, zk_hosts(), "requeue-%d" % k, str(N), "1", str(WARMUP),
         "/zkbench/floor-wire"], env=dict(os.environ, ZKFLOOR_STAMPS=stamps)))
    pairs = take_stamps(stamps)
    floor_parts = split_on_the_wire(k, "floor", pairs, pcap, busy)
    pcap, busy = under_capture("handoff-%d-%d" % (k, rep),
                               lambda: release_to_grant(k, rep, suffix="_traced"))
    zk_parts = split_on_the_wire(k, "zklock", list(LAST_HANDOFFS), pcap, busy)
    for name, z, f in zip(WIRE_PARTS, zk_parts, floor_parts):
        RES.add("wire_c%d_%s_extra_ms" % (k, name), z - f)
    RES.add("ratio_wire_c%d_total" % k, sum(zk_parts) / sum(floor_parts))


def first_lock(kind):
    ends = pgbench(SQL["first_" + kind], ["-C", "-c", "1", "-t", str(N_FIRST + 1)],
                   "first" + kind)
    return (ends[-1] - ends[0]) * 1e3 / N_FIRST


def attempt(what, fn, *args, **kwargs):
    """Run one measurement.  A failure is a failure: it is recorded (the run
    then exits non-zero) and the repeat it belongs to ends."""
    try:
        return fn(*args, **kwargs)
    except BenchError as e:
        raise BenchError("%s: %s" % (what, " / ".join(str(e).strip().splitlines()[-3:])))


def repeat(rep, kazoo, curator):
    """One repeat of every repeated figure.  Each zklock figure runs right
    after the floor it is compared with, and the per-repeat ratio is kept,
    so a slow phase of the machine hits both sides of a ratio alike."""
    global PIN
    port = ZK_PORTS[(rep - 1) % len(ZK_PORTS)]
    PIN = "127.0.0.1:%d" % port
    role = mntr()[port].get("zk_server_state", "?")
    RES.servers.append("%d:%s" % (port, role))
    log("== repeat %d/%d: every client on server %s (%s)" % (rep, R, PIN, role))

    def run_floor(mode):
        v, cpu = attempt("floor " + mode, floor, mode)
        key = "floor_" + mode.replace("-", "_")
        RES.add(key, v)
        RES.add(key + "_cpu_us", cpu)
        log("floor %-9s %.3f ms (client CPU %.0f us per cycle)" % (mode, v, cpu))
        return v

    # The floor of an SQL cycle: what ZooKeeper must do for it (the recipe
    # floor) plus what PostgreSQL must do for two statements (an advisory
    # cycle, the same statements with a local lock), measured back to back.
    fr = run_floor("recipe")
    ac = attempt("advisory cycle", pgbench_period_ms, SQL["advisory"], N, WARMUP, "advisory")
    RES.add("advisory_cycle", ac)
    axc = attempt("advisory transaction cycle", pgbench_period_ms, SQL["advisory_xact"], N,
                  WARMUP, "advisory_xact")
    RES.add("advisory_xact_cycle", axc)
    log("pg_advisory_lock cycle %.4f ms, transaction cycle %.4f ms" % (ac, axc))
    sc = attempt("session cycle", pgbench_period_ms, SQL["session"], N, WARMUP, "session")
    RES.add("session_cycle", sc)
    RES.add("ratio_session_cycle", sc / (fr + ac))
    RES.add("session_own_ms", sc - fr - ac)
    RES.add("ratio_advisory_cycle", sc / ac)
    log("zklock session cycle %.3f ms (%.3f x floor recipe + advisory cycle)"
        % (sc, sc / (fr + ac)))
    v = attempt("semaphore cycle", pgbench_period_ms, SQL["semaphore"], N, WARMUP, "semaphore")
    RES.add("semaphore_cycle", v)
    RES.add("ratio_semaphore_cycle", v / (fr + ac))
    log("zklock semaphore cycle %.3f ms (%.3f x floor recipe + advisory cycle)"
        % (v, v / (fr + ac)))
    v = attempt("transaction cycle", pgbench_period_ms, SQL["xact"], N, WARMUP, "xact")
    RES.add("xact_cycle", v)
    RES.add("ratio_xact_cycle", v / (fr + axc))
    log("zklock transaction cycle %.3f ms (%.3f x floor recipe + advisory transaction cycle)"
        % (v, v / (fr + axc)))
    fp = run_floor("pipelined")
    v = attempt("transaction cycle, release not awaited", pgbench_period_ms, SQL["xact"], N,
                WARMUP, "xact_async", options="-c zklock.synchronous_release=off")
    RES.add("xact_async_cycle", v)
    RES.add("ratio_xact_async_cycle", v / (fp + axc))
    log("zklock transaction cycle, synchronous_release off %.3f ms (%.3f x floor pipelined + "
        "advisory transaction cycle)" % (v, v / (fp + axc)))
    fa = run_floor("awaited")
    RES.add("ratio_session_cycle_awaited", sc / fa)
    v = attempt("COMMIT's leader check", commit_check, rep)
    log("COMMIT after a pause past a sixth of the session timeout: +%.3f ms (%.3f vs %.3f)"
        % (v, RES.values["commit_stale_ms"][-1], RES.values["commit_fresh_ms"][-1]))
    for peer, name in ((kazoo, "kazoo"), (curator, "curator")):
        v = attempt(name + " cycle", peer.cycle_ms, N, WARMUP)
        RES.add(name + "_cycle", v)
        RES.add("ratio_%s_cycle" % name, v / sc)
        log("%s cycle %.3f ms (zklock does %.2f x its cycles/s)" % (name, v, v / sc))
    run_floor("listed")
    v = attempt("re-entrant", reentrant, rep)
    log("re-entrant zk_lock %.1f us/call, session requests %d, ensemble packets %d (idle %d)"
        % (v, RES.values["reentrant_session_requests"][-1],
           RES.values["reentrant_ensemble_packets"][-1], RES.values["reentrant_idle_packets"][-1]))
    zk = attempt("first lock", first_lock, "zk")
    load = attempt("first lock (load)", first_lock, "load")
    adv = attempt("first lock (advisory)", first_lock, "adv")
    RES.add("first_lock_zk", zk)
    RES.add("first_lock_adv", adv)
    RES.add("first_lock_extra", zk - adv)
    RES.add("ratio_first_lock_extra", (zk - adv) / sc)
    RES.add("first_lock_load", load - adv)
    RES.add("first_lock_session", zk - load - sc)
    log("new connection + lock cycle: zklock %.3f ms, advisory %.3f ms; loading zklock %.3f ms, "
        "opening the session %.3f ms" % (zk, adv, load - adv, zk - load - sc))
    zt, zn, zmain, zthreads = attempt("CPU", cpu_cycles, "zk", N, WARMUP)
    at, an, _, _ = attempt("CPU (advisory)", cpu_cycles, "adv", N, WARMUP)
    RES.add("cpu_zk_main_us", zmain)
    RES.add("cpu_zk_threads_us", zthreads)
    RES.add("cpu_zk_stat_us", zt)
    RES.add("cpu_zk_us", zn)
    RES.add("cpu_adv_stat_us", at)
    RES.add("cpu_adv_us", an)
    RES.add("cpu_extra_us", zn - an)
    log("backend CPU per cycle: zklock %.1f us (main thread %.1f, library threads %.1f; "
        "stat %.0f), advisory %.1f us (stat %.0f)" % (zn, zmain, zthreads, zt, an, at))
    fh = run_floor("handoff")
    for k in CONTENTION:
        rate = attempt("contention %d" % k, contention, k, rep)
        RES.add("ratio_contention_c%d_handoff" % k, 1e3 / rate / fh)
        log("contention %d backends: %.0f cycles/s (%.3f ms per cycle, %.3f x floor handoff), "
            "%.3f watchers fired per release"
            % (k, rate, 1e3 / rate, 1e3 / rate / fh,
               RES.values["contention_c%d_watchers_per_release" % k][-1]))
        # Like with like: K floor contenders re-queueing as the backends do,
        # right before the backends' own release -> grant run.
        # The same with each grant taken by a woken thread, as a backend's
        # main thread is woken by its library's: what that wake-up costs.
        fq, fq_own, fq_cpu = attempt("floor requeue-%d" % k, floor_requeue, k, rep)
        RES.add("floor_requeue_%d" % k, fq)
        RES.add("floor_requeue_%d_cpu_us" % k, fq_own)
        if fq_cpu is not None:
            RES.add("floor_requeue_%d_client_cpu_ms" % k, fq_cpu)
        log("floor requeue-%d %.3f ms (client CPU %.0f us per cycle)" % (k, fq, fq_own))
        fw = run_floor("woken-%d" % k)
        RES.add("ratio_floor_woken_%d" % k, fw / fq)
        handoff = attempt("release to grant %d" % k, release_to_grant, k, rep)
        if handoff is not None:
            RES.add("ratio_contention_c%d_release_to_grant" % k, handoff / fq)
            RES.add("ratio_contention_c%d_release_to_grant_woken" % k, handoff / fw)
            RES.add("ratio_contention_c%d_release_to_grant_idle" % k, handoff / fh)
            log("contention %d backends: release -> next grant %.3f ms (%.3f x floor requeue-%d, "
                "%.3f x floor woken-%d, %.3f x floor handoff)"
                % (k, handoff, handoff / fq, k, handoff / fw, k, handoff / fh))
            # What the floor's handoff becomes when its contenders spend, per
            # handoff, as much CPU outside the ensemble as the backends,
            # PostgreSQL and pgbench did: on cores the ensemble shares, CPU
            # spent anywhere delays the quorum write and the notification.
            zk_cpu = LAST_CLIENT_CPU[0]
            if zk_cpu is not None and fq_cpu is not None:
                burn = max(0.0, zk_cpu - fq_cpu) * 1e3
                fl, _, fl_cpu = attempt("floor requeue-%d, loaded" % k, floor_requeue, k, rep,
                                        burn)
                # A burn does not add exactly its own CPU per handoff (a
                # slower floor spends more of everything): scale it once so
                # that the loaded floor spends what the backends did.
                if fl_cpu is not None and fl_cpu > fq_cpu and burn > 0:
                    burn *= (zk_cpu - fq_cpu) / (fl_cpu - fq_cpu)
                    fl, _, fl_cpu = attempt("floor requeue-%d, loaded again" % k,
                                            floor_requeue, k, rep, burn)
                RES.add("floor_loaded_%d" % k, fl)
                RES.add("floor_loaded_%d_burn_us" % k, burn)
                if fl_cpu is not None:
                    RES.add("floor_loaded_%d_client_cpu_ms" % k, fl_cpu)
                RES.add("ratio_floor_loaded_%d" % k, fl / fq)
                RES.add("ratio_contention_c%d_release_to_grant_loaded" % k, handoff / fl)
                log("floor requeue-%d with each releaser spending %.0f us: %.3f ms; outside the "
                    "ensemble per handoff: floor %.3f ms, backends %.3f ms, loaded floor %s "
                    "ms; release -> next grant %.3f x the loaded floor"
                    % (k, burn, fl, fq_cpu, zk_cpu, fmt(fl_cpu), handoff / fl))
        if TCPDUMP:
            attempt("handoff on the wire %d" % k, handoff_on_the_wire, k, rep)
    # Deadlock detection costs nothing for waits shorter than its timeout:
    # the same handoff with detection off, back to back.
    k = DETECTION_K
    on = attempt("release to grant %d, detection on" % k, release_to_grant, k, rep,
                 suffix="_detect_on")
    off = attempt("release to grant %d, detection off" % k, release_to_grant, k, rep,
                  "-c zklock.deadlock_timeout=0", "_detect_off")
    if on is not None and off is not None:
        RES.add("ratio_detection_on_off", on / off)
        log("contention %d backends: release -> next grant %.3f ms with deadlock detection, "
            "%.3f ms without (%.3f x)" % (k, on, off, on / off))
    # Keeping last, so that the figures above run as they did; its lock
    # names are its own.  The kept cycle, back to back with an advisory
    # cycle of as many cycles.
    kac = attempt("advisory cycle, long", pgbench_period_ms, SQL["advisory"], KEEP_N, WARMUP,
                  "keep_advisory")
    RES.add("keep_advisory_cycle", kac)
    kc = attempt("keeping cycle", keep_cycle, rep)
    RES.add("keep_cycle", kc)
    RES.add("ratio_keep_cycle", kc / kac)
    log("zklock cycle with keeping %.4f ms (%.3f x advisory cycle of as many cycles, %.4f ms; "
        "%.4f of the cycles from the kept node)"
        % (kc, kc / kac, kac, RES.values["keep_cycle_kept"][-1]))
    # A waiter now and then.  The floor: a holder that lets go as soon as
    # someone asks, idle and under the keeper's load, right before the
    # waiter's run.
    fy = run_floor("yield")
    fyb = attempt("floor yield, busy", floor_yield_busy)
    RES.add("floor_yield_busy", fyb)
    RES.add("ratio_floor_yield_busy", fyb / fy)
    log("floor yield %.3f ms idle, %.3f ms while a keeper loops on another name"
        % (fy, fyb))
    v = attempt("keeping, a waiter now and then", keep_waits, rep)
    RES.add("ratio_keep_waiter", v / fyb)
    RES.add("ratio_keep_waiter_idle", v / fy)
    RES.add("ratio_keep_waiter_handoff", v / fh)
    log("keeping: a waiter's request -> grant %.3f ms (%.3f x floor yield busy, %.3f x idle, "
        "%.3f x floor handoff); the keeper's cycles from its kept node %.4f (%d cycles)"
        % (v, v / fyb, v / fy, v / fh, RES.values["keep_keeper_kept"][-1],
           RES.values["keep_keeper_cycles"][-1]))


def fifo_and_waiter_rss():
    """FIFO_WAITERS backends queue one after another behind a holder; each
    records when it is granted.  Also: the memory of a waiting backend, and
    what the last waiter's deadlock check costs, with every waiter ahead of
    it in the graph."""
    k = FIFO_WAITERS
    log("== FIFO: %d backends queued on one lock" % k)
    mon = Psql("zkbench-monitor")
    holder = Psql("zkbench-holder")
    fresh = None
    procs = []
    try:
        mon.query("DROP TABLE IF EXISTS fifo_order")
        mon.query("CREATE TABLE fifo_order (arrival int, pid int, "
                  "granted_at timestamptz DEFAULT clock_timestamp(), "
                  "grant_seq bigserial)")
        holder.query("SELECT zk_lock('fifo')")
        t_queue = time.monotonic()
        for i in range(1, k + 1):
            sql = ["SELECT zk_lock('fifo')",
                   "INSERT INTO fifo_order (arrival, pid) VALUES (%d, pg_backend_pid())" % i,
                   "SELECT zk_unlock('fifo')"]
            cmd = [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1"]
            for q in sql:
                cmd += ["-c", q]
            errf = open(scratch("fifo-%d.err" % i), "w")
            env = dict(os.environ, PGAPPNAME="zkbench-fifo")
            # The last waiter says what its deadlock check cost (DEBUG1).
            if i == k:
                env["PGOPTIONS"] = "-c client_min_messages=debug1"
            procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf,
                                           env=env), errf))
            deadline = time.monotonic() + 60
            while True:
                n = int(mon.value("SELECT count(*) FROM zk_lock_contenders('fifo')"))
                if n == i + 1:
                    break
                if n > i + 1:
                    raise BenchError("fifo: %d contenders, expected %d" % (n, i + 1))
                if procs[-1][0].poll() is not None:
                    raise BenchError("fifo: waiter %d exited early: %s"
                                     % (i, open(scratch("fifo-%d.err" % i)).read()))
                if time.monotonic() > deadline:
                    raise BenchError("fifo: waiter %d not queued after 60 s" % i)
                time.sleep(0.002)
        log("all %d queued in %.1f s" % (k, time.monotonic() - t_queue))
        # The last one queued may still be setting its watches, and any may
        # be running its deadlock check: give them a moment to be seen
        # asleep all at once.
        deadline = time.monotonic() + 5
        while True:
            waiting = mon.query("SELECT pid FROM pg_stat_activity "
                                "WHERE wait_event_type = 'Extension' "
                                "AND application_name = 'zkbench-fifo'")
            if len(waiting) == k or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if len(waiting) != k:
            RES.fail("fifo: %d backends wait on wait_event_type Extension, expected %d"
                     % (len(waiting), k))
        check = None
        deadline = time.monotonic() + 10
        while check is None and time.monotonic() < deadline:
            check = re.search(r"zklock deadlock check: (\d+) requests, (\d+) ms, "
                              r"(\d+) waiting sessions, no cycle",
                              open(scratch("fifo-%d.err" % k)).read())
            time.sleep(0.1)
        if check is None:
            RES.fail("fifo: the last waiter reported no deadlock check")
        else:
            RES.add("deadlock_check_requests", int(check.group(1)))
            RES.add("deadlock_check_ms", int(check.group(2)))
            RES.add("deadlock_check_members", int(check.group(3)))
        rss = [proc_status(int(p))["VmRSS"] for p in waiting]
        fresh = Psql("zkbench-fresh")
        fresh_rss = proc_status(fresh.pid)["VmRSS"]
        RES.add("waiter_rss_kb", statistics.mean(rss))
        RES.add("fresh_rss_kb", fresh_rss)
        RES.add("waiter_extra_rss_kb", statistics.mean(rss) - fresh_rss)
        before = mntr()
        t_release = float(holder.value("SELECT extract(epoch FROM clock_timestamp())"))
        holder.query("SELECT zk_unlock('fifo')")
        for p, errf in procs:
            try:
                rc = p.wait(max(60, k))
            except subprocess.TimeoutExpired:
                raise BenchError("fifo: a waiter did not finish")
            errf.close()
            if rc != 0:
                RES.fail("fifo: a waiter failed (exit %d)" % rc)
        procs = []
        after = mntr()
        order = [int(x) for x in mon.query("SELECT arrival FROM fifo_order ORDER BY grant_seq")]
        last = float(mon.value("SELECT extract(epoch FROM max(granted_at)) FROM fifo_order"))
        in_order = order == list(range(1, k + 1))
        RES.add("fifo_in_order", 1 if in_order else 0)
        RES.add("fifo_granted", len(order))
        RES.add("fifo_per_grant_ms", (last - t_release) * 1e3 / k)
        RES.add("fifo_watchers_per_grant",
                mntr_delta(before, after, "zk_sum_node_deleted_watch_count") / k)
        if not in_order:
            bad = [(pos + 1, a) for pos, a in enumerate(order) if a != pos + 1][:10]
            RES.fail("fifo: grant order differs from arrival order (position, arrival): %s" % bad)
        if mon.query("SELECT * FROM zk_lock_contenders('fifo')"):
            RES.fail("fifo: contenders left after the cascade")
        log("FIFO: %d granted, in arrival order: %s; %.3f ms per grant; waiting backend RSS "
            "%.0f kB vs fresh %d kB" % (len(order), in_order, RES.values["fifo_per_grant_ms"][-1],
                                         statistics.mean(rss), fresh_rss))
        mon.query("DROP TABLE fifo_order")
    finally:
        for p, errf in procs:
            p.kill()
            p.wait()
            errf.close()
        for s in (mon, holder, fresh):
            if s:
                s.close()


def rss_per_session():
    """A backend's VmRSS before and after its first zk_lock (and, as a
    control, before and after its first pg_advisory_lock)."""
    log("== RSS of a backend's first lock (%d backends each)" % RSS_SAMPLES)
    for kind, lock, unlock in (("zk", "zk_lock('rss')", "zk_unlock('rss')"),
                               ("adv", "pg_advisory_lock(7)", "pg_advisory_unlock(7)")):
        for _ in range(RSS_SAMPLES):
            s = Psql("zkbench-rss")
            try:
                s.query("SELECT 1")
                a = proc_status(s.pid)
                s.query("SELECT %s" % lock)
                s.query("SELECT %s" % unlock)
                b = proc_status(s.pid)
            finally:
                s.close()
            RES.add("first_lock_rss_%s_kb" % kind, b["VmRSS"] - a["VmRSS"])
            RES.add("first_lock_anon_%s_kb" % kind, b["RssAnon"] - a["RssAnon"])
            RES.add("first_lock_file_%s_kb" % kind, b["RssFile"] - a["RssFile"])
            RES.add("fresh_backend_rss_kb", a["VmRSS"])
    RES.add("rss_extra_per_session_kb",
            RES.median("first_lock_rss_zk_kb") - RES.median("first_lock_rss_adv_kb"))
    log("first zk_lock adds %s kB VmRSS (anon %s, file %s); first pg_advisory_lock adds %s kB"
        % (RES.median("first_lock_rss_zk_kb"), RES.median("first_lock_anon_zk_kb"),
           RES.median("first_lock_file_zk_kb"), RES.median("first_lock_rss_adv_kb")))


def leak_run():
    """RSS growth over LEAK_CYCLES cycles in one backend, after LEAK_WARM;
    its CPU, and the same CPU figure for pg_advisory_lock."""
    log("== %d zk_lock/zk_unlock cycles in one backend (after %d warm-up)"
        % (LEAK_CYCLES, LEAK_WARM))
    chunk = LEAK_CYCLES // LEAK_CHUNKS
    stmts = ["SELECT zk_lock('leak');", "SELECT zk_unlock('leak');"]
    warm_f = cycle_file("leak-warm.sql", stmts, LEAK_WARM)
    chunk_f = cycle_file("leak-chunk.sql", stmts, chunk)
    s = Psql("zkbench-leak")
    samples = []
    try:
        s.run("\\o /dev/null\n\\i %s\n\\o" % warm_f)
        base = proc_status(s.pid)
        t0, w0 = proc_cpu_ticks(s.pid), time.monotonic()
        u0, k0 = main_thread_user_sys_ticks(s.pid)
        for i in range(LEAK_CHUNKS):
            s.run("\\o /dev/null\n\\i %s\n\\o" % chunk_f)
            samples.append(proc_status(s.pid)["VmRSS"] - base["VmRSS"])
        wall = time.monotonic() - w0
        t1 = proc_cpu_ticks(s.pid)
        u1, k1 = main_thread_user_sys_ticks(s.pid)
        end = proc_status(s.pid)
        acq = int(s.value("SELECT acquisitions FROM zk_status()"))
    finally:
        s.close()
    n = chunk * LEAK_CHUNKS
    if acq != LEAK_WARM + n:
        RES.fail("leak run: zk_status acquisitions %d, expected %d" % (acq, LEAK_WARM + n))
    RES.add("rss_growth_kb", end["VmRSS"] - base["VmRSS"])
    RES.add("rss_growth_anon_kb", end["RssAnon"] - base["RssAnon"])
    RES.notes["rss_growth_kb"] = "VmRSS after each %d cycles, kB over the warm backend's %d kB: %s" % (
        chunk, base["VmRSS"], " ".join(str(x) for x in samples))
    RES.add("leak_cycle_ms", wall * 1e3 / n)
    RES.add("cpu_zk_long_stat_us", (t1 - t0) * 1e6 / CLK_TCK / n)
    RES.add("cpu_zk_main_user_us", (u1 - u0) * 1e6 / CLK_TCK / n)
    RES.add("cpu_zk_main_sys_us", (k1 - k0) * 1e6 / CLK_TCK / n)
    log("RSS growth %d kB (anon %d kB) over %d cycles; samples %s; %.3f ms per cycle; CPU %.1f us per cycle"
        % (end["VmRSS"] - base["VmRSS"], end["RssAnon"] - base["RssAnon"], n, samples,
           wall * 1e3 / n, (t1 - t0) * 1e6 / CLK_TCK / n))
    adv_f = cycle_file("leak-adv.sql", ["SELECT pg_advisory_lock(1);",
                                        "SELECT pg_advisory_unlock(1);"], n)
    warm_adv = cycle_file("leak-adv-warm.sql", ["SELECT pg_advisory_lock(1);",
                                                "SELECT pg_advisory_unlock(1);"], LEAK_WARM)
    s = Psql("zkbench-leak-adv")
    try:
        s.run("\\o /dev/null\n\\i %s\n\\o" % warm_adv)
        t0 = proc_cpu_ticks(s.pid)
        u0, k0 = main_thread_user_sys_ticks(s.pid)
        s.run("\\o /dev/null\n\\i %s\n\\o" % adv_f)
        t1 = proc_cpu_ticks(s.pid)
        u1, k1 = main_thread_user_sys_ticks(s.pid)
    finally:
        s.close()
    RES.add("cpu_adv_long_stat_us", (t1 - t0) * 1e6 / CLK_TCK / n)
    RES.add("cpu_adv_user_us", (u1 - u0) * 1e6 / CLK_TCK / n)
    RES.add("cpu_adv_sys_us", (k1 - k0) * 1e6 / CLK_TCK / n)
    RES.add("cpu_extra_long_stat_us",
            RES.values["cpu_zk_long_stat_us"][-1] - RES.values["cpu_adv_long_stat_us"][-1])
    log("advisory CPU %.1f us per cycle over %d cycles" % (RES.values["cpu_adv_long_stat_us"][-1], n))


# ================================================================ reporting

def fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return "%.*f" % (digits, v)
    return "%d" % v


def ratio_of(a, b):
    return a / b if a is not None and b else None


def verdict(values, test):
    """A goal on per-repeat ratios: met when every repeat meets it, missed
    when none does, and no verdict ("noise") when the repeats disagree."""
    if not values:
        return None
    passed = [test(v) for v in values]
    if all(passed):
        return True
    if not any(passed):
        return False
    return "noise"


STATUS = {True: "met", False: "MISSED", None: "MISSING", "noise": "in noise"}


def report(elapsed):
    med = RES.median
    rows = []          # (name, value, unit, ratio, spread, ref, goal, met, desc, digits) or a heading
    bench = []

    def vmax(key):
        v = RES.values.get(key)
        return max(v) if v else None

    def heading(text):
        rows.append(text)

    def row(name, value, unit, desc, ratio_key=None, ref="", goal="", test=None, met=None,
            digits=3, key=None, extra=None):
        """ratio_key: the per-repeat ratios (their median and spread are
        shown); test: the goal on each of them.  met: the verdict of a goal
        that is not a ratio (True/False, None when the figure is missing)."""
        if isinstance(ratio_key, float):
            ratios = None
            ratio, spread = ratio_key, None
        else:
            ratios = RES.values.get(ratio_key) if ratio_key else None
            ratio = statistics.median(ratios) if ratios else None
            spread = (min(ratios), max(ratios)) if ratios else None
        if test is not None:
            met = verdict(ratios, test)
        if goal and value is None:
            met = None
        rows.append((name, value, unit, ratio, spread, ref, goal, met, desc, digits))
        vals = RES.values.get(key or name)
        fields = ["BENCH", "name=" + name, "median_%s=%s" % (
            unit.replace("/", "_per_"), "missing" if value is None else fmt(value, max(digits, 4)))]
        if ratio is not None:
            fields.append("ratio=%.3f" % ratio)
            if spread:
                fields.append("ratio_min=%.3f ratio_max=%.3f" % spread)
            fields.append("ratio_vs=" + ref)
        for k, v in (extra or {}).items():
            fields.append("%s=%s" % (k, "missing" if v is None else fmt(v, 1)))
        if goal:
            fields.append("goal=" + goal.replace(" ", ""))
            fields.append("met=" + {True: "yes", False: "no", None: "missing",
                                    "noise": "noise"}[met])
        if vals and len(vals) > 1:
            fields.append("values=" + ",".join(fmt(x, 4) for x in vals))
        if ratios and len(ratios) > 1:
            fields.append("ratios=" + ",".join(fmt(x, 4) for x in ratios))
        fields.append("reps=%d" % (len(vals) if vals else 0))
        bench.append(" ".join(fields))

    def at_most(limit):
        return lambda r: r <= limit

    def per_s(ms):
        return None if not ms else 1e3 / ms

    heading("Uncontended cycles")
    row("floor_recipe", med("floor_recipe"), "ms",
        "floor (zkfloor.c): create + get_children pipelined, delete awaited (what zk_lock + "
        "zk_unlock ask of ZooKeeper)")
    row("floor_awaited", med("floor_awaited"), "ms", "floor: create + delete, each awaited")
    row("floor_listed", med("floor_listed"), "ms",
        "floor: create, get_children, delete, each awaited")
    row("floor_pipelined", med("floor_pipelined"), "ms",
        "floor: create+get_children pipelined, delete not awaited")
    ac = med("advisory_cycle")
    row("advisory_cycle", ac, "ms",
        "PostgreSQL's part: pg_advisory_lock + unlock, pgbench -c 1 (ratio: zklock session "
        "cycle / this)", "ratio_advisory_cycle", "advisory_cycle", digits=4)
    row("advisory_xact_cycle", med("advisory_xact_cycle"), "ms",
        "PostgreSQL's part of a transaction cycle: BEGIN; pg_advisory_xact_lock; COMMIT",
        digits=4)
    sc = med("session_cycle")
    row("session_cycle", sc, "ms", "zklock: zk_lock + zk_unlock, pgbench -c 1 (ratio: / "
        "floor_recipe + advisory_cycle of the same repeat)", "ratio_session_cycle",
        "recipe+advisory", "<= 1.05x", at_most(1.05), extra={"cycles_per_s": per_s(sc)})
    row("session_own", med("session_own_ms"), "ms",
        "  zklock's own share: session_cycle - floor_recipe - advisory_cycle (per repeat)",
        key="session_own_ms")
    row("session_cycle_vs_awaited", sc, "ms",
        "  the same cycle / floor_awaited (the older, narrower floor)",
        "ratio_session_cycle_awaited", "floor_awaited", key="session_cycle")
    smc = med("semaphore_cycle")
    row("semaphore_cycle", smc, "ms", "zklock: zk_semaphore_acquire(name, 3) + "
        "zk_semaphore_release, pgbench -c 1 (ratio: / floor_recipe + advisory_cycle)",
        "ratio_semaphore_cycle", "recipe+advisory", "<= 1.05x", at_most(1.05),
        extra={"cycles_per_s": per_s(smc)})
    xc = med("xact_cycle")
    row("xact_cycle", xc, "ms", "zklock: BEGIN; zk_xact_lock; COMMIT, pgbench -c 1 "
        "(COMMIT waits for the release: the default; ratio: / floor_recipe + "
        "advisory_xact_cycle)", "ratio_xact_cycle", "recipe+adv. xact", "<= 1.05x",
        at_most(1.05), extra={"cycles_per_s": per_s(xc)})
    xa = med("xact_async_cycle")
    row("xact_async_cycle", xa, "ms", "the same with zklock.synchronous_release = off (ratio: "
        "/ floor_pipelined + advisory_xact_cycle)", "ratio_xact_async_cycle",
        "pipelined+adv. xact", "<= 1.05x", at_most(1.05), extra={"cycles_per_s": per_s(xa)})
    row("commit_check_extra", med("commit_check_extra_ms"), "ms",
        "COMMIT's leader check: COMMIT after a pause past T/3 (a sync first) minus COMMIT "
        "right after the lock (%.3f vs %.3f ms)"
        % (med("commit_stale_ms") or 0, med("commit_fresh_ms") or 0),
        key="commit_check_extra_ms")
    for peer, desc in (("kazoo", "kazoo Lock acquire+release"),
                       ("curator", "Curator InterProcessMutex acquire+release")):
        pc = med(peer + "_cycle")
        row(peer + "_cycle", pc, "ms",
            desc + ", same ensemble (ratio: zklock cycles/s / %s cycles/s)" % peer,
            "ratio_%s_cycle" % peer, "session_cycle", ">= 2x", lambda r: r >= 2.0,
            extra={"cycles_per_s": per_s(pc)})

    heading("Re-entrant acquire by the holder (%d calls)" % N_REENTRANT)
    rl = med("reentrant_lock_us")
    row("reentrant_lock", rl, "us", "re-entrant zk_lock by the holder, per call (psql, \\i)",
        digits=1, key="reentrant_lock_us")
    row("reentrant_unlock", med("reentrant_unlock_us"), "us",
        "matching zk_unlock (the base hold remains), per call", digits=1,
        key="reentrant_unlock_us")
    row("reentrant_adv_lock", med("reentrant_adv_lock_us"), "us",
        "reference: re-entrant pg_advisory_lock, same method (ratio: zklock's / this)",
        ratio_of(rl, med("reentrant_adv_lock_us")), "reentrant_lock", digits=1,
        key="reentrant_adv_lock_us")
    row("reentrant_adv_unlock", med("reentrant_adv_unlock_us"), "us",
        "reference: matching pg_advisory_unlock, per call", digits=1,
        key="reentrant_adv_unlock_us")
    rq = vmax("reentrant_session_requests")
    row("reentrant_requests", rq, "req",
        "ZooKeeper requests the holder's session sent during the %d locks + %d unlocks "
        "(max over repeats; 'cons' lcxid, pings excluded)" % (N_REENTRANT, N_REENTRANT),
        goal="== 0", met=None if rq is None else rq == 0, digits=0,
        key="reentrant_session_requests")
    row("reentrant_ensemble_packets", vmax("reentrant_ensemble_packets"), "packets",
        "zk_packets_received delta over those calls, 3 servers, max over repeats (mntr's own "
        "connections subtracted; a ping would count)", digits=0)
    row("reentrant_idle_packets", vmax("reentrant_idle_packets"), "packets",
        "the same over an equally long idle window (pings only)", digits=0)
    row("reentrant_acquisitions", med("reentrant_acquisitions"), "count",
        "zk_status().acquisitions delta over the calls (waits delta: %s)"
        % fmt(vmax("reentrant_waits")), digits=0)

    heading("Handoff under contention (pgbench -c K -j 2 -T %d, one lock)" % CONTENTION_S)
    for k in CONTENTION:
        rate = med("contention_c%d_cycles_per_s" % k)
        period = med("contention_c%d_period_ms" % k)
        row("contention_c%d_cycles_per_s" % k, rate, "cycles/s",
            "%d backends: lock/unlock cycles per second" % k, digits=1)
        row("contention_c%d_cycle" % k, period, "ms",
            "%d backends: wall time / cycles (a handoff plus the new holder's round trips "
            "to pgbench)" % k, "ratio_contention_c%d_handoff" % k, "floor_handoff",
            key="contention_c%d_period_ms" % k)
        row("floor_requeue_%d" % k, med("floor_requeue_%d" % k), "ms",
            "floor: %d zkfloor contenders re-queueing at once; delete sent -> next grant (by "
            "the deletion when the listing showed the node deleted first, else a new listing)"
            % k)
        row("floor_woken_%d" % k, med("floor_woken_%d" % k), "ms",
            "floor: the same, each grant taken by a thread woken through an eventfd, as a "
            "backend's main thread is (ratio: / floor_requeue_%d)" % k,
            "ratio_floor_woken_%d" % k, "floor_requeue_%d" % k)
        row("contention_c%d_handoff" % k, med("contention_c%d_release_to_grant_ms" % k), "ms",
            "%d backends: mean time from a holder's release (stamped just before zk_unlock) "
            "to the next grant (stamped as zk_lock returns; median %s ms; %s x floor_handoff)"
            % (k, fmt(med("contention_c%d_release_to_grant_p50_ms" % k)),
               fmt(med("ratio_contention_c%d_release_to_grant_idle" % k))),
            "ratio_contention_c%d_release_to_grant" % k, "floor_requeue_%d" % k, "<= 1.1x",
            at_most(1.1), key="contention_c%d_release_to_grant_ms" % k)
        row("contention_c%d_handoff_vs_woken" % k, med("contention_c%d_release_to_grant_ms" % k),
            "ms", "  the same handoff / floor_woken_%d of the same repeat" % k,
            "ratio_contention_c%d_release_to_grant_woken" % k, "floor_woken_%d" % k,
            key="contention_c%d_release_to_grant_ms" % k)
        row("floor_loaded_%d" % k, med("floor_loaded_%d" % k), "ms",
            "floor: floor_requeue_%d again, each releaser first spending (median) %s us of CPU, "
            "scaled so that the machine spends per handoff outside the ensemble what it did "
            "during the backends' run (outside the ensemble per handoff: floor %s ms, "
            "backends %s ms, this floor %s ms)"
            % (k, fmt(med("floor_loaded_%d_burn_us" % k), 0),
               fmt(med("floor_requeue_%d_client_cpu_ms" % k)),
               fmt(med("contention_c%d_client_cpu_ms" % k)),
               fmt(med("floor_loaded_%d_client_cpu_ms" % k))),
            "ratio_floor_loaded_%d" % k, "floor_requeue_%d" % k)
        row("contention_c%d_handoff_vs_loaded" % k, med("contention_c%d_release_to_grant_ms" % k),
            "ms", "  the same handoff / floor_loaded_%d of the same repeat: the floor for a "
            "client that spends the CPU these backends do" % k,
            "ratio_contention_c%d_release_to_grant_loaded" % k, "floor_loaded_%d" % k,
            "<= 1.1x", at_most(1.1), key="contention_c%d_release_to_grant_ms" % k)
        if RES.values.get("wire_c%d_zklock_total_ms" % k):
            def split_of(who):
                return "%s of the handoffs granted by a notification, cores %s busy; %s ms" % (
                    fmt(med("wire_c%d_%s_notified" % (k, who))),
                    fmt(med("wire_c%d_%s_cpu_busy" % (k, who))),
                    ", ".join("%s %s" % (part, fmt(med("wire_c%d_%s_%s_ms" % (k, who, part))))
                              for part in WIRE_PARTS))
            row("wire_c%d_floor" % k, med("wire_c%d_floor_total_ms" % k), "ms",
                "  on the wire, floor_requeue_%d again under a packet capture (release stamp "
                "-> delete sent -> notification sent -> grant): %s" % (k, split_of("floor")),
                key="wire_c%d_floor_total_ms" % k)
            row("wire_c%d_zklock" % k, med("wire_c%d_zklock_total_ms" % k), "ms",
                "  the same for the %d backends: %s; over the floor: %s ms"
                % (k, split_of("zklock"),
                   ", ".join("%s %+.3f" % (part, med("wire_c%d_%s_extra_ms" % (k, part)))
                             for part in WIRE_PARTS)),
                "ratio_wire_c%d_total" % k, "wire_c%d_floor" % k,
                key="wire_c%d_zklock_total_ms" % k)
        wpr = med("contention_c%d_watchers_per_release" % k)
        other = vmax("contention_c%d_other_watchers" % k)
        mx = vmax("contention_c%d_max_watchers_one_delete" % k)
        row("contention_c%d_watchers_per_release" % k, wpr, "watchers",
            "%d backends: watchers fired per release, sum over 3 servers (largest single "
            "delete on one server: %s; children/data/created watchers fired: %s)"
            % (k, fmt(mx), fmt(other)), goal="<= 1 (no herd)",
            met=None if wpr is None or mx is None else
            (wpr <= 1.0 + 1e-9 and mx <= 1 and other == 0), extra={"max_one_delete": mx},
            digits=3)

    heading("Keeping a released lock (zklock.keep_released = 60 s, set for these backends "
            "alone)")
    row("keep_advisory_cycle", med("keep_advisory_cycle"), "ms",
        "advisory_cycle over %d cycles, as keep_cycle, right before it" % KEEP_N, digits=4)
    kc = med("keep_cycle")
    row("keep_cycle", kc, "ms",
        "zklock with keeping: zk_lock('k') + zk_unlock('k'), pgbench -c 1, %d cycles, the node "
        "kept at each release and taken back without a request (%s of the cycles from the "
        "kept node; ratio: / keep_advisory_cycle of the same repeat)"
        % (KEEP_N, fmt(med("keep_cycle_kept"), 4)), "ratio_keep_cycle", "keep_advisory_cycle",
        "<= 1.2x", at_most(1.2), digits=4, extra={"cycles_per_s": per_s(kc)})
    row("floor_yield", med("floor_yield"), "ms",
        "floor: A holds a node and a child watch on the parent; from B sending create + "
        "listing to B's grant by A's delete, which A sends as B's node appears")
    row("floor_yield_busy", med("floor_yield_busy"), "ms",
        "floor: the same while a backend loops zk_lock + zk_unlock with keeping on another "
        "name, as the keeper does during keep_waiter (ratio: / floor_yield)",
        "ratio_floor_yield_busy", "floor_yield")
    row("keep_waiter", med("keep_waiter_ms"), "ms",
        "a keeper loops zk_lock + zk_unlock on 'kw' with keeping (pgbench -c 1); a second "
        "backend (same cluster, its own ZooKeeper session, keeping off) asks every %g s: its "
        "zk_lock from request to grant, stamped in the statement (median %s ms, max %s ms; "
        "%s x floor_yield, %s x floor_handoff; ratio: / floor_yield_busy of the same repeat)"
        % (KEEP_WAIT_GAP, fmt(med("keep_waiter_p50_ms")), fmt(vmax("keep_waiter_max_ms")),
           fmt(med("ratio_keep_waiter_idle")), fmt(med("ratio_keep_waiter_handoff"))),
        "ratio_keep_waiter", "floor_yield_busy", "<= 1.2x", at_most(1.2),
        key="keep_waiter_ms")
    row("keep_keeper_kept", med("keep_keeper_kept"), "share",
        "  the keeper's cycles served from its kept node meanwhile: kept_acquisitions delta / "
        "its cycles (%s cycles; cycles not from the kept node per request of the waiter: %s)"
        % (fmt(med("keep_keeper_cycles"), 0), fmt(med("keep_keeper_not_kept_per_wait"))),
        digits=4)

    heading("A backend's first lock (pgbench -C: a new connection per cycle)")
    row("first_lock_zk", med("first_lock_zk"), "ms", "connect + zk_lock + zk_unlock + disconnect")
    row("first_lock_adv", med("first_lock_adv"), "ms",
        "connect + pg_advisory_lock + unlock + disconnect")
    row("first_lock_extra", med("first_lock_extra"), "ms",
        "what a backend's first zk_lock costs over advisory (ratio: / session cycle)",
        "ratio_first_lock_extra", "session_cycle")
    row("first_lock_load", med("first_lock_load"), "ms",
        "  of it, loading zklock.so and its libraries (-C with zk_lock_token, which opens no "
        "session, minus advisory)")
    row("first_lock_session", med("first_lock_session"), "ms",
        "  of it, opening the ZooKeeper session (the rest minus one session cycle)")

    heading("FIFO order and memory")
    fio = (RES.values.get("fifo_in_order") or [None])[-1]
    granted = (RES.values.get("fifo_granted") or [None])[-1]
    row("fifo_order", granted, "granted",
        "%d backends queued one after another, granted in arrival order?" % FIFO_WAITERS,
        goal="all, in FIFO order", met=None if fio is None else
        (fio == 1 and granted == FIFO_WAITERS), digits=0, key="fifo_granted")
    row("fifo_per_grant", med("fifo_per_grant_ms"), "ms",
        "FIFO cascade: holder's release -> last grant, / waiters", key="fifo_per_grant_ms")
    row("fifo_watchers_per_grant", med("fifo_watchers_per_grant"), "watchers",
        "FIFO cascade: watchers fired per grant, 3 servers", digits=3)
    row("deadlock_check_requests", med("deadlock_check_requests"), "req",
        "the last waiter's deadlock check: requests, with %s waiting sessions in its graph "
        "(its DEBUG1 line)" % fmt(med("deadlock_check_members"), 0), digits=0,
        goal="<= 2 x waiters + 10", met=None if med("deadlock_check_requests") is None else
        med("deadlock_check_requests") <= 2 * FIFO_WAITERS + 10)
    row("deadlock_check_ms", med("deadlock_check_ms"), "ms",
        "  and its time", digits=0)
    row("waiter_extra_rss", med("waiter_extra_rss_kb"), "kB",
        "VmRSS of a waiting backend minus a fresh backend's (mean of the waiters)", digits=0,
        key="waiter_extra_rss_kb")
    row("first_lock_rss", med("first_lock_rss_zk_kb"), "kB",
        "VmRSS growth of a backend at its first zk_lock (RssAnon %s, RssFile %s)"
        % (fmt(med("first_lock_anon_zk_kb")), fmt(med("first_lock_file_zk_kb"))), digits=0,
        key="first_lock_rss_zk_kb")
    row("rss_extra_per_session", med("rss_extra_per_session_kb"), "kB",
        "the same minus a first pg_advisory_lock's growth (%s kB)"
        % fmt(med("first_lock_rss_adv_kb")), digits=0, key="rss_extra_per_session_kb")
    g = med("rss_growth_kb")
    row("rss_growth", g, "kB", "VmRSS growth over %d cycles in one backend after %d warm-up "
        "(RssAnon %s)" % (LEAK_CYCLES, LEAK_WARM, fmt(med("rss_growth_anon_kb"))),
        goal="< 1024 kB", met=None if g is None else g < 1024, digits=0, key="rss_growth_kb")

    heading("CPU per cycle, outside ZooKeeper waits")
    row("floor_awaited_cpu", med("floor_awaited_cpu_us"), "us",
        "zkfloor's CPU per awaited cycle (2 requests; all threads, getrusage)", digits=1,
        key="floor_awaited_cpu_us")
    row("floor_listed_cpu", med("floor_listed_cpu_us"), "us",
        "zkfloor's CPU per listed cycle (3 requests, like a zklock cycle)", digits=1,
        key="floor_listed_cpu_us")
    row("cpu_zk", med("cpu_zk_us"), "us",
        "backend CPU per zklock session cycle (all threads, schedstat)", digits=1,
        key="cpu_zk_us")
    row("cpu_zk_main", med("cpu_zk_main_us"), "us", "  of it, the backend's main thread",
        digits=1, key="cpu_zk_main_us")
    row("cpu_zk_threads", med("cpu_zk_threads_us"), "us",
        "  of it, the ZooKeeper client library's threads", digits=1, key="cpu_zk_threads_us")
    row("cpu_adv", med("cpu_adv_us"), "us", "backend CPU per pg_advisory_lock cycle", digits=1,
        key="cpu_adv_us")
    row("cpu_extra", med("cpu_extra_us"), "us",
        "CPU a zklock cycle adds over an advisory one (ratio: / zkfloor listed CPU)",
        ratio_of(med("cpu_extra_us"), med("floor_listed_cpu_us")), "floor_listed_cpu",
        digits=1, key="cpu_extra_us")
    row("cpu_zk_stat", med("cpu_zk_long_stat_us"), "us",
        "utime+stime (/proc/PID/stat) per zklock cycle over the %d-cycle run" % LEAK_CYCLES,
        digits=1, key="cpu_zk_long_stat_us")
    row("cpu_adv_stat", med("cpu_adv_long_stat_us"), "us",
        "utime+stime per advisory cycle over %d cycles" % LEAK_CYCLES, digits=1,
        key="cpu_adv_long_stat_us")
    row("cpu_extra_stat", med("cpu_extra_long_stat_us"), "us",
        "zklock - advisory, utime+stime", digits=1, key="cpu_extra_long_stat_us")
    row("cpu_zk_main_user", med("cpu_zk_main_user_us"), "us",
        "  the main thread's utime per zklock cycle in that run (advisory: %s)"
        % fmt(med("cpu_adv_user_us"), 1), digits=1, key="cpu_zk_main_user_us")
    row("cpu_zk_main_sys", med("cpu_zk_main_sys_us"), "us",
        "  the main thread's stime (the kernel: system calls, wake-ups) (advisory: %s)"
        % fmt(med("cpu_adv_sys_us"), 1), digits=1, key="cpu_zk_main_sys_us")
    row("leak_cycle", med("leak_cycle_ms"), "ms",
        "zklock cycle time during that run (psql \\i)", key="leak_cycle_ms")

    k = DETECTION_K
    row("detection_on_off", med("ratio_detection_on_off"), "x",
        "%d backends: release -> next grant with zklock.deadlock_timeout = 1 s (waits of a "
        "few ms, never checked) over the same with 0, back to back (%s vs %s ms)"
        % (k, fmt(med("contention_c%d_release_to_grant_detect_on_ms" % k)),
           fmt(med("contention_c%d_release_to_grant_detect_off_ms" % k))),
        key="ratio_detection_on_off", digits=3)

    heading("Instructions per session cycle in the backend's main thread (callgrind)")
    ir = med("ir_zk_cycle")
    row("ir_zk_cycle", ir, "instr",
        "inside zk_lock + zk_unlock and all they call, asleep time excluded "
        "(zklock preloaded: the server-wide view's shared memory included)", digits=0,
        goal="<= 20000", met=None if ir is None else ir <= 20000)
    ir_plain = med("ir_zk_cycle_not_preloaded")
    row("ir_zk_cycle_not_preloaded", ir_plain, "instr",
        "  the same without zklock preloaded (nothing shown server-wide); showing the "
        "holds costs %s instructions per cycle"
        % fmt(None if ir is None or ir_plain is None else ir - ir_plain, 0), digits=0)
    for k, what in (("zklock", "zklock's code"), ("postgres", "PostgreSQL functions"),
                    ("libc", "libc (malloc, locks, strings; the library's too)"),
                    ("library", "the client library's request calls (zoo_acreate, ...)")):
        row("ir_zk_" + k, med("ir_zk_" + k), "instr", "  of it, in " + what, digits=0)
    files = sorted((k for k in RES.values if k.startswith("ir_zk_file_") and med(k) >= 1),
                   key=lambda k: -(med(k) or 0))
    for k in files:
        row(k, med(k), "instr", "    of zklock's, in %s (inlined code counts for the file it "
            "comes from)" % re.sub(r"_([ch])$", r".\1", k[len("ir_zk_file_"):]),
            digits=0)
    row("ir_adv_cycle", med("ir_adv_cycle"), "instr",
        "inside pg_advisory_lock + pg_advisory_unlock", digits=0)
    row("zk_own_us", med("zk_own_us"), "us",
        "zk_lock + zk_unlock's own work per cycle, at the rate this machine runs a PL/pgSQL "
        "pg_advisory_lock loop (%s instructions/us); the kernel's share of its system calls "
        "and wake-ups is not in it" % fmt(med("ir_per_us"), 0), digits=1,
        goal="a few us", met=None if ir is None else med("zk_own_us") < 10)

    lines = []
    lines.append("zklock benchmark: R=%d repeats (median shown), N=%d cycles per measurement%s"
                 % (R, N, "; QUICK smoke test: figures are indicative only" if QUICK else ""))
    lines.append("zklock %s (zklock.so sha256 %s); ensemble: 3 servers on 127.0.0.1, "
                 "forceSync=yes; PostgreSQL 15 (fsync=off); %d CPUs"
                 % (os.environ.get("BENCH_REVISION", "?"), RES.digest[:12], os.cpu_count()))
    lines.append("ratio: the median of the per-repeat ratios, each pair measured back to back "
                 "(for peers: peer cycle time / zklock's = zklock cycles/s / peer's); spread: "
                 "the lowest and highest per-repeat ratio; a goal is met when every repeat "
                 "meets it, missed when none does, and has no verdict (in noise) otherwise")
    lines.append("repeat r pins every client (zkfloor, zklock.hosts, kazoo, Curator) to one "
                 "server, in turn: %s" % " ".join(RES.servers))
    hdr = "%-36s %11s %-8s %7s %-13s %-19s %-10s %s" % (
        "figure", "median", "unit", "ratio", "spread", "ratio vs", "goal", "")
    for r in rows:
        if isinstance(r, str):
            lines.append("")
            lines.append("-- " + r)
            lines.append(hdr)
            continue
        name, value, unit, ratio, spread, ref, goal, met, desc, digits = r
        status = "" if not goal else STATUS[met]
        lines.append("%-36s %11s %-8s %7s %-13s %-19s %-10s %s" % (
            name, "-" if value is None else fmt(value, digits), unit,
            "" if ratio is None else "%.3f" % ratio,
            "" if spread is None else "%.3f-%.3f" % spread,
            ref if ratio is not None else "", goal, status))
    lines.append("")
    lines.append("What each figure is:")
    for r in rows:
        if not isinstance(r, str):
            lines.append("  %-34s %s" % (r[0], r[8]))
    for name, note in RES.notes.items():
        lines.append("  note %s: %s" % (name, note))
    lines.append("")
    lines.append("Watch counters: zk_{cnt,sum}_node_deleted_watch_count per server, checked "
                 "(per_server=port:cnt/sum):")
    for l in getattr(RES, "watchcal", []):
        lines.append("  " + l)
    lines.append("  each mntr read adds %s to zk_packets_received over the 3 servers "
                 "(subtracted above)" % fmt(getattr(RES, "mntr_self", None)))
    fs = getattr(RES, "fsyncs", [])
    lines.append("ZooKeeper server logs: %d slow fsync warnings (> 1 s)%s%s" % (
        len(fs), ", longest %d ms" % max(fs) if fs else "",
        "; other warnings: %s" % RES.zk_other_warnings if getattr(RES, "zk_other_warnings", None)
        else ""))
    lines.append("ZooKeeper fsync counters (mntr, per server, whole run): %s"
                 % getattr(RES, "fsync_mntr", "-"))
    lines.append("")
    goals = [(r[0], r[7]) for r in rows if not isinstance(r, str) and r[6]]
    met = [n for n, m in goals if m is True]
    missed = [n for n, m in goals if m is False]
    noise = [n for n, m in goals if m == "noise"]
    missing = [n for n, m in goals if m is None]
    lines.append("goals: %d met, %d missed%s, %d without a verdict (in noise)%s%s" % (
        len(met), len(missed), " (" + ", ".join(missed) + ")" if missed else "",
        len(noise), " (" + ", ".join(noise) + ")" if noise else "",
        "; %d MISSING (%s)" % (len(missing), ", ".join(missing)) if missing else ""))
    if RES.failures:
        lines.append("FAILED (measurements or checks):")
        lines.extend("  " + f.replace("\n", "\n    ") for f in RES.failures)
    lines.append("run time: %.0f s" % elapsed)
    lines.append("")
    lines.extend(bench)
    lines.append("BENCH name=zk_slow_fsyncs count=%d max_ms=%d" % (len(fs), max(fs) if fs else 0))
    lines.append("BENCH name=summary goals_met=%d goals_missed=%d goals_in_noise=%d "
                 "goals_missing=%d failures=%d seconds=%.0f quick=%d"
                 % (len(met), len(missed), len(noise), len(missing), len(RES.failures),
                    elapsed, 1 if QUICK else 0))
    text = "\n".join(lines) + "\n"
    print()
    print(text, end="", flush=True)
    if RESULTS:
        with open(RESULTS, "w") as f:
            f.write(text)
    return missed


def read_instructions():
    """The callgrind figures bench/instructions.py wrote before the run."""
    path = os.environ.get("BENCH_IR_FILE")
    if not path or not os.path.exists(path):
        RES.fail("no instruction counts (bench/instructions.py did not run)")
        return
    with open(path) as f:
        for line in f:
            if line.startswith("IR "):
                name, value = line[3:].strip().split("=", 1)
                RES.add(name, float(value))


SQL = {}


def main():
    os.makedirs(SCRATCH, exist_ok=True)
    SQL["session"] = write_file("session.sql", "SELECT zk_lock('b');\nSELECT zk_unlock('b');\n")
    SQL["xact"] = write_file("xact.sql", "BEGIN;\nSELECT zk_xact_lock('b');\nCOMMIT;\n")
    SQL["semaphore"] = write_file("semaphore.sql",
                                  "SELECT zk_semaphore_acquire('b', 3);\n"
                                  "SELECT zk_semaphore_release('b');\n")
    SQL["commit_check"] = write_file("commit_check.sql",
                                     "BEGIN;\nSELECT zk_xact_lock('cc');\n"
                                     "SELECT pg_sleep(:pause);\nCOMMIT;\n")
    SQL["advisory"] = write_file("advisory.sql",
                                 "SELECT pg_advisory_lock(1);\nSELECT pg_advisory_unlock(1);\n")
    SQL["advisory_xact"] = write_file("advisory_xact.sql",
                                      "BEGIN;\nSELECT pg_advisory_xact_lock(1);\nCOMMIT;\n")
    SQL["keep"] = write_file("keep.sql", "SELECT zk_lock('k');\nSELECT zk_unlock('k');\n")
    SQL["contend"] = write_file("contend.sql", "SELECT zk_lock('h');\nSELECT zk_unlock('h');\n")
    # Target lists are evaluated in order: the first stamp follows the
    # grant, the second precedes the release.
    SQL["handoff"] = write_file("handoff.sql", (
        "INSERT INTO zkbench_handoff SELECT 'g', clock_timestamp() "
        "FROM (SELECT zk_lock('hs')) AS granted;\n"
        "INSERT INTO zkbench_handoff SELECT 'r', at "
        "FROM (SELECT clock_timestamp() AS at, zk_unlock('hs')) AS released;\n"))
    psql_one("CREATE UNLOGGED TABLE IF NOT EXISTS zkbench_handoff (what text, at timestamptz)")
    SQL["first_zk"] = write_file("first_zk.sql",
                                 "SELECT zk_lock('first');\nSELECT zk_unlock('first');\n")
    SQL["first_load"] = write_file("first_load.sql",
                                   "SELECT zk_lock_token('first');\nSELECT 1;\n")
    SQL["first_adv"] = write_file("first_adv.sql",
                                  "SELECT pg_advisory_lock(2);\nSELECT pg_advisory_unlock(2);\n")

    log("zklock benchmark: R=%d N=%d quick=%s, ensemble %s" % (R, N, QUICK, ZK_HOSTS))
    read_instructions()
    digest = RES.digest = library_digest()
    calibrate_mntr()
    # The "load" variant of the first-lock figure relies on this.
    state = run([PSQL, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                 "-c", "SELECT zk_lock_token('first') IS NULL",
                 "-c", "SELECT state FROM zk_status()"]).strip()
    if state.split() != ["t", "closed"]:
        RES.fail("zk_lock_token in a fresh backend: expected NULL and no session, got %r" % state)
    log("starting the kazoo and Curator peers (Curator warms its JVM up with %d cycles)"
        % CURATOR_JVM_WARMUP)
    kazoo = curator = None
    try:
        kazoo = Peer("kazoo", ["/usr/bin/python3", os.path.join(SRC, "kazoo_cycle.py"), ZK_HOSTS,
                               "/zklock/zkbench-kazoo"])
        curator = Peer("curator", [
            "java", "-XX:-UsePerfData", "-Xmx256m", "-Djava.io.tmpdir=" + os.environ["TMPDIR"],
            "-cp", CLASSPATH, os.path.join(SRC, "CuratorCycle.java"), ZK_HOSTS,
            "/zklock/zkbench-curator", str(CURATOR_JVM_WARMUP)])
        for rep in range(1, R + 1):
            try:
                repeat(rep, kazoo, curator)
            except BenchError as e:
                RES.fail("repeat %d: %s" % (rep, e))
            finally:
                global PIN
                PIN = None
    except BenchError as e:
        RES.fail("repeated measurements: %s" % e)
    finally:
        for peer in (kazoo, curator):
            if peer:
                peer.close()
    for phase in (fifo_and_waiter_rss, rss_per_session, leak_run, calibrate_watch_counters):
        try:
            phase()
        except BenchError as e:
            RES.fail("%s: %s" % (phase.__name__, e))
    zk_log_warnings()
    if library_digest() != digest:
        RES.fail("the installed zklock.so changed during the run (another make install?): "
                 "the figures may mix two builds")
    missed = report(time.monotonic() - T0)
    if RES.failures:
        return 1
    if STRICT and missed:
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    try:
        sys.exit(main())
    except BenchError as e:
        log("ERROR: %s" % e)
        sys.exit(1)
