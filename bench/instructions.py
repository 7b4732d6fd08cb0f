#!/usr/bin/python3
"""Instructions a zklock cycle costs the backend's own code, under callgrind.

Run by bench/run before the postmaster starts: it drives single-user
backends (postgres --single) on the benchmark's cluster under valgrind's
callgrind, whose instruction counts do not depend on the machine's load.

  instructions.py PGBIN PGDATA OUTFILE

With --toggle-collect on zk_lock and zk_unlock, callgrind counts only the
instructions the backend's main thread runs inside those two functions and
what they call: zklock's code, the PostgreSQL and libc functions it uses,
and the client library's request calls (zoo_acreate and friends, which
marshal a request and queue it).  Time asleep waiting for ZooKeeper runs no
instructions.  The library's own threads are not counted.  A run of
WARM cycles is subtracted from a run of WARM + N cycles, so opening the
session is left out.  The same is done for pg_advisory_lock and
pg_advisory_unlock, and for zk_lock and zk_unlock without zklock preloaded
(so without the server-wide view's shared memory).

To turn instructions into time on this machine, a PL/pgSQL loop of
pg_advisory_lock cycles is counted whole under callgrind and timed without
it; the zklock figure in microseconds is its instruction count at that
rate.  Writes "IR name=value" lines to OUTFILE.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

QUICK = os.environ.get("BENCH_QUICK", "0") not in ("", "0")
WARM = 20
N = 100 if QUICK else 500
CALIBRATION_N = 2000
TIMED_N = 20000 if QUICK else 200000

PGBIN, PGDATA, OUTFILE = sys.argv[1:4]
WORK = tempfile.mkdtemp(prefix="callgrind.")

ZK = "PERFORM zk_lock('bench_ir'); PERFORM zk_unlock('bench_ir');"
ADV = "PERFORM pg_advisory_lock(7); PERFORM pg_advisory_unlock(7);"


def loop(body, n):
    return "DO $$ BEGIN FOR i IN 1..%d LOOP %s END LOOP; END $$;\n" % (n, body)


def single_user(script, valgrind_args=None, timeout=900, options=()):
    cmd = [os.path.join(PGBIN, "postgres"), "--single", "-D", PGDATA] + list(options) + ["postgres"]
    if valgrind_args is not None:
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes"] + valgrind_args + cmd
    p = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0 or "ERROR:" in p.stdout + p.stderr:
        sys.exit("instructions.py: single-user backend failed:\n%s\n%s"
                 % (p.stdout[-2000:], p.stderr[-2000:]))


def self_costs(path):
    """Instructions per object file and per (object, source file), each
    function's own (not its callees'); inlined code counts for the file it
    was inlined from."""
    names = {"ob": {}, "fl": {}}
    costs = {}
    by_file = {}
    current = None
    fn_file = file = None
    skip_next = False
    with open(path) as f:
        for line in f:
            key = line.split("=", 1)[0]
            if key in ("ob", "cob", "fl", "fi", "fe", "cfi", "cfl"):
                # Names are compressed: "(id) name" the first time, "(id)" after;
                # the object keys share one table, the file keys another.
                table = names["ob" if key in ("ob", "cob") else "fl"]
                value = line.strip().split("=", 1)[1]
                m = re.match(r"\((\d+)\)(?: (.*))?", value)
                if m:
                    if m.group(2):
                        table[m.group(1)] = m.group(2)
                    value = table[m.group(1)]
                if key == "ob":
                    current = value
                elif key == "fl":
                    fn_file = file = value
                elif key in ("fi", "fe"):
                    file = value
            elif key == "fn":
                file = fn_file
            elif line.startswith("calls="):
                skip_next = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                fields = line.split()
                if len(fields) >= 2 and current is not None:
                    costs[current] = costs.get(current, 0) + int(fields[1])
                    k = (current, file)
                    by_file[k] = by_file.get(k, 0) + int(fields[1])
    return costs, by_file


def counted(script, toggles, tag, options=()):
    out = os.path.join(WORK, tag + ".%p")
    args = ["--callgrind-out-file=" + out]
    if toggles:
        args += ["--collect-atstart=no"] + ["--toggle-collect=" + t for t in toggles]
    single_user(script, args, options=options)
    # The main thread's file; the library's threads run nothing toggled.
    files = [f for f in os.listdir(WORK) if f.startswith(tag + ".") and f.endswith("-01")]
    if len(files) != 1:
        sys.exit("instructions.py: no callgrind output for " + tag)
    return self_costs(os.path.join(WORK, files[0]))


def per_cycle(body, toggles, tag, n, options=()):
    """Instructions per cycle by object, and by (object, source file)."""
    setup = "CREATE EXTENSION IF NOT EXISTS zklock;\n"
    base, base_files = counted(setup + loop(body, WARM), toggles, tag + "_base", options)
    full, full_files = counted(setup + loop(body, WARM) + loop(body, n), toggles, tag + "_full",
                               options)
    return ({ob: (full.get(ob, 0) - base.get(ob, 0)) / n for ob in set(base) | set(full)},
            {k: (full_files.get(k, 0) - base_files.get(k, 0)) / n
             for k in set(base_files) | set(full_files)})


def kind(ob):
    base = os.path.basename(ob)
    if base.startswith("zklock"):
        return "zklock"
    if base.startswith("libzookeeper"):
        return "library"
    if base.startswith("libc."):
        return "libc"
    if base == "postgres":
        return "postgres"
    return "other"


def timed_us_per_cycle(body):
    def wall(script):
        t0 = time.monotonic()
        single_user(script)
        return time.monotonic() - t0
    short = min(wall(loop(body, 1)) for _ in range(3))
    long_ = min(wall(loop(body, TIMED_N)) for _ in range(3))
    return (long_ - short) * 1e6 / TIMED_N


zk, zk_files = per_cycle(ZK, ["zk_lock", "zk_unlock"], "zk", N)
# The cluster preloads zklock; without it nothing is shown server-wide, so
# the difference is what showing the holds costs a cycle.
zk_plain, _ = per_cycle(ZK, ["zk_lock", "zk_unlock"], "zkplain", N,
                        ["-c", "shared_preload_libraries="])
adv, _ = per_cycle(ADV, ["pg_advisory_lock_int8", "pg_advisory_unlock_int8"], "adv", N)
calibration = sum(per_cycle(ADV, None, "advloop", CALIBRATION_N)[0].values())
adv_loop_us = timed_us_per_cycle(ADV)
rate = calibration / adv_loop_us  # instructions per microsecond

results = {"ir_zk_cycle": sum(zk.values()), "ir_adv_cycle": sum(adv.values()),
           "ir_zk_cycle_not_preloaded": sum(zk_plain.values()),
           "ir_adv_loop": calibration, "adv_loop_us": adv_loop_us, "ir_per_us": rate}
for k in ("zklock", "postgres", "libc", "library", "other"):
    results["ir_zk_" + k] = sum(v for ob, v in zk.items() if kind(ob) == k)
# zklock's own instructions by its source files (one module each).
for (ob, path), v in zk_files.items():
    if kind(ob) == "zklock" and path:
        key = "ir_zk_file_" + re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(path))
        results[key] = results.get(key, 0) + v
results["zk_own_us"] = results["ir_zk_cycle"] / rate
results["zk_own_us_without_library"] = (results["ir_zk_cycle"] - results["ir_zk_library"]) / rate

with open(OUTFILE, "w") as f:
    for k, v in results.items():
        f.write("IR %s=%.3f\n" % (k, v))
shutil.rmtree(WORK)
print("   zk_lock + zk_unlock: %.0f instructions per cycle (%.1f us at %.0f per us); "
      "pg_advisory_lock + unlock: %.0f"
      % (results["ir_zk_cycle"], results["zk_own_us"], rate, results["ir_adv_cycle"]))
