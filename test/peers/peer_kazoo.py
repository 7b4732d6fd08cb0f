#!/usr/bin/python3
"""A kazoo lock client that the zklock tests drive over stdin/stdout.

Usage: peer_kazoo.py [--kind lock|read|write] [--reuse-lock]
                     [--tls CA,CERT,KEY] HOSTS LOCKPATH

Connects to HOSTS, prints "ready", then reads one command per line and
answers each with exactly one line:

  acquire   block until the lock is held          -> acquired
  try       one non-blocking attempt               -> acquired | busy
  release   give the lock up                       -> released
  fake-wait DIR DATA
            publish a wait as zklock does, under DIR, named by this
            session's id, with DATA ("\\n" for a line break); one made
            earlier is replaced                    -> published
  quit      release if held, close, exit 0 (also on end of input);
            no answer line

Anything that goes wrong is answered with "error: MESSAGE" and the peer
carries on ("acquire"/"try" while holding, "release" while not holding,
unknown commands, ZooKeeper errors). If it cannot connect it prints
"error: ..." instead of "ready" and exits 1.

--kind picks kazoo's Lock (default), ReadLock or WriteLock. Every kind is
created with extra_lock_patterns=["-lock-"], so Curator InterProcessMutex
and zklock nodes ("..-lock-<seq>") count as contenders, and identifier
"kazoo-peer" (the node data). kazoo names its own nodes
"<32 hex>__lock__<seq>" (Lock, WriteLock) or "<32 hex>__rlock__<seq>"
(ReadLock).

A "try" that finds the lock busy deletes the node it created before it
answers "busy" (kazoo's own cleanup after a failed non-blocking acquire).
End of input while "acquire" blocks cancels the wait (the node is deleted)
and exits. SIGTERM closes the session, which removes the node at once,
instead of leaving it until the session times out.

Each acquire uses a new lock object, and tries once more with another on
NoNodeError, as the README advises kazoo users; --reuse-lock keeps one
object for the peer's life, as kazoo's examples do, and does not retry, to
show what that meets when the lock's container parent is reaped.

--tls connects over TLS, trusting the CA file CA and presenting the
certificate CERT with its key KEY (PEM files).

Logging goes to stderr at WARNING.
"""

import argparse
import logging
import queue
import signal
import sys
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import CancelledError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

SESSION_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
IDENTIFIER = "kazoo-peer"
EXTRA_LOCK_PATTERNS = ["-lock-"]


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def error(exc_or_msg):
    if isinstance(exc_or_msg, BaseException):
        msg = "%s: %s" % (type(exc_or_msg).__name__, exc_or_msg)
    else:
        msg = exc_or_msg
    say("error: " + " ".join(str(msg).split()))


class Peer(object):
    def __init__(self, zk, make_lock, reuse_lock):
        self.zk = zk
        self.make_lock = make_lock
        self.reuse_lock = reuse_lock
        self.lock = make_lock()
        self.held = False
        self.commands = queue.Queue()
        self.state = threading.Lock()
        self.acquiring = False
        self.eof = False

    def read_stdin(self):
        """Feed stdin lines to the main thread; None marks end of input."""
        try:
            for line in iter(sys.stdin.readline, ""):
                self.commands.put(line)
        finally:
            with self.state:
                self.eof = True
                if self.acquiring:
                    # Nobody is left to wait for the answer: give up the
                    # wait, which also deletes our node.
                    self.lock.cancel()
            self.commands.put(None)

    def do_acquire(self, blocking):
        if self.held:
            error("lock already held")
            return
        # A kazoo lock makes sure of its parent only the first time, and
        # then creates its node; zklock's parents are containers the server
        # removes once empty, so a reused lock object meets NoNodeError, and
        # so can a fresh one when the parent goes between those two steps.
        # As the README advises kazoo users: a fresh lock object per
        # acquisition, and one more try on NoNodeError.
        for attempt in (1, 2):
            with self.state:
                if blocking and self.eof:
                    return
                self.acquiring = blocking
                if not self.reuse_lock:
                    self.lock = self.make_lock()
            try:
                got = self.lock.acquire(blocking=blocking)
                break
            except NoNodeError:
                if self.reuse_lock or attempt == 2:
                    raise
            finally:
                with self.state:
                    self.acquiring = False
        if got:
            self.held = True
            say("acquired")
        else:
            say("busy")

    def do_fake_wait(self, directory, data):
        """A published wait that zklock did not write, for hostile tests."""
        path = "%s/%016x" % (directory, self.zk.client_id[0])
        if self.zk.exists(path):
            self.zk.delete(path)
        self.zk.create(path, data.replace("\\n", "\n").encode("utf-8"),
                       ephemeral=True, makepath=True)
        say("published")

    def do_release(self):
        if not self.held:
            error("lock not held")
            return
        self.lock.release()
        self.held = False
        say("released")

    def run(self):
        threading.Thread(target=self.read_stdin, daemon=True).start()
        say("ready")
        while True:
            line = self.commands.get()
            if line is None:
                break
            cmd = line.strip()
            if cmd == "":
                continue
            if cmd == "quit":
                break
            try:
                if cmd == "acquire":
                    self.do_acquire(blocking=True)
                elif cmd == "try":
                    self.do_acquire(blocking=False)
                elif cmd == "release":
                    self.do_release()
                elif cmd.startswith("fake-wait "):
                    self.do_fake_wait(*cmd.split(" ", 2)[1:])
                else:
                    error("unknown command %r" % cmd)
            except CancelledError:
                break           # end of input during a blocking acquire
            except Exception as e:
                error(e)
        if self.held:
            try:
                self.lock.release()
            except Exception as e:
                sys.stderr.write("peer_kazoo: release at exit: %s\n" % e)
            self.held = False


def on_sigterm(signum, frame):
    sys.exit(143)   # unwinds to the finally below, which closes the session


def main():
    parser = argparse.ArgumentParser(
        description="kazoo lock peer for the zklock tests")
    parser.add_argument("--kind", choices=("lock", "read", "write"),
                        default="lock")
    parser.add_argument("--reuse-lock", action="store_true")
    parser.add_argument("--tls", metavar="CA,CERT,KEY")
    parser.add_argument("hosts")
    parser.add_argument("lockpath")
    args = parser.parse_args()
    tls = {}
    if args.tls:
        ca, certfile, keyfile = args.tls.split(",")
        tls = dict(use_ssl=True, verify_certs=True, ca=ca, certfile=certfile,
                   keyfile=keyfile)

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="peer_kazoo: %(levelname)s %(name)s: "
                               "%(message)s")
    signal.signal(signal.SIGTERM, on_sigterm)

    zk = KazooClient(hosts=args.hosts, timeout=SESSION_TIMEOUT_S, **tls)
    try:
        try:
            zk.start(timeout=CONNECT_TIMEOUT_S)
        except KazooTimeoutError:
            error("cannot connect to %s" % args.hosts)
            return 1
        factory = {"lock": zk.Lock, "read": zk.ReadLock,
                   "write": zk.WriteLock}[args.kind]
        Peer(zk, lambda: factory(args.lockpath, IDENTIFIER,
                                 extra_lock_patterns=EXTRA_LOCK_PATTERNS),
             args.reuse_lock).run()
        return 0
    finally:
        # Closing the session removes any node we still have right away.
        try:
            zk.stop()
            zk.close()
        except Exception:
            pass


if __name__ == "__main__":
    sys.exit(main())
