/*
 * A Curator InterProcessMutex client that the zklock tests drive over
 * stdin/stdout. Runs in source-file mode, no separate compile step:
 *
 *   java -cp "$(cat test/peers/curator-classpath.txt)" test/peers/PeerCurator.java HOSTS LOCKPATH
 *
 * Classpath (jars in /usr/share/java, Debian 12 packages; the same list,
 * as colon-separated absolute paths, is in test/peers/curator-classpath.txt):
 *
 *   curator-recipes.jar curator-framework.jar curator-client.jar
 *   zookeeper.jar zookeeper-jute.jar guava.jar slf4j-api.jar slf4j-simple.jar
 *
 * Nothing else is needed at compile or run time: the ZooKeeper client uses
 * its NIO socket (no netty), and Debian's guava.jar already contains
 * failureaccess (InternalFutureFailureAccess).
 *
 * Startup: about 1.3 s from launch to "ready" on 2 CPUs, of which about
 * 0.9 s is compiling this file; -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
 * brings it to about 0.8-1.0 s. -XX:-UsePerfData avoids an
 * /tmp/hsperfdata_<user>/<pid> file, which a killed JVM leaves behind.
 *
 * Protocol: prints "ready" once connected, then reads one command per line
 * and answers each with exactly one line:
 *
 *   acquire   block until the lock is held          -> acquired
 *   try       acquire(0, ms): one attempt           -> acquired | busy
 *   release   give the lock up                       -> released
 *   quit      release if held, close, exit 0 (also on end of input);
 *             no answer line
 *
 * Anything that goes wrong is answered with "error: MESSAGE" and the peer
 * carries on ("acquire"/"try" while holding, "release" while not holding,
 * unknown commands, ZooKeeper errors). If it cannot connect it prints
 * "error: ..." instead of "ready" and exits 1.
 *
 * Nodes are LOCKPATH/_c_<uuid>-lock-<seq> holding Curator's default data
 * (the local IP address). A "try" that loses deletes its node before
 * answering "busy". End of input while "acquire" blocks, and SIGTERM,
 * close the session, which removes the node at once.
 *
 * Logging (slf4j-simple) goes to stderr at WARN (ZooKeeper's ClientCnxn at
 * ERROR) unless -Dorg.slf4j.simpleLogger.... properties say otherwise;
 * connection state changes (SUSPENDED, RECONNECTED, LOST) are printed to
 * stderr.
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.state.ConnectionState;
import org.apache.curator.retry.RetryNTimes;

public class PeerCurator {
    static final int SESSION_TIMEOUT_MS = 10000;
    static final int CONNECT_TIMEOUT_MS = 10000;
    /* Each ZooKeeper operation is retried across connection loss for about
     * the session timeout. */
    static final int RETRIES = 50;
    static final int RETRY_SLEEP_MS = 200;

    static final String EOF = new String("<eof>"); /* compared by identity */
    static final LinkedBlockingQueue<String> commands = new LinkedBlockingQueue<>();
    static final Object state = new Object();
    static boolean acquiring;   /* guarded by state */
    static boolean eof;         /* guarded by state */

    static void logDefault(String property, String level) {
        if (System.getProperty(property) == null)
            System.setProperty(property, level);
    }

    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static void error(Throwable e) {
        String msg = e.getClass().getSimpleName()
            + (e.getMessage() != null ? ": " + e.getMessage() : "");
        error(msg);
    }

    static void error(String msg) {
        say("error: " + msg.replaceAll("\\s+", " ").trim());
    }

    public static void main(String[] args) throws Exception {
        logDefault("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        /* The ZooKeeper client warns about an EndOfStreamException on most
         * clean closes; connection trouble is reported by the listener
         * below instead. */
        logDefault("org.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn", "error");
        if (args.length != 2) {
            System.err.println("usage: PeerCurator HOSTS LOCKPATH");
            System.exit(2);
        }
        String hosts = args[0];
        String lockPath = args[1];

        CuratorFramework client = CuratorFrameworkFactory.newClient(
            hosts, SESSION_TIMEOUT_MS, CONNECT_TIMEOUT_MS,
            new RetryNTimes(RETRIES, RETRY_SLEEP_MS));
        /* On SIGTERM or System.exit: closing the session deletes our
         * ephemeral node now rather than after the session timeout.
         * close() is a no-op the second time. */
        Runtime.getRuntime().addShutdownHook(new Thread(client::close));
        client.getConnectionStateListenable().addListener((c, newState) -> {
            if (newState != ConnectionState.CONNECTED)
                System.err.println("PeerCurator: connection " + newState);
        });
        client.start();
        if (!client.blockUntilConnected(CONNECT_TIMEOUT_MS, TimeUnit.MILLISECONDS)) {
            error("cannot connect to " + hosts);
            System.exit(1);
        }
        InterProcessMutex mutex = new InterProcessMutex(client, lockPath);

        Thread reader = new Thread(PeerCurator::readStdin, "stdin");
        reader.setDaemon(true);
        reader.start();
        say("ready");

        boolean held = false;
        for (;;) {
            String cmd = commands.take();
            if (cmd == EOF || cmd.equals("quit"))
                break;
            if (cmd.isEmpty())
                continue;
            try {
                switch (cmd) {
                case "acquire":
                case "try":
                    if (held) {
                        error("lock already held");
                        break;
                    }
                    boolean blocking = cmd.equals("acquire");
                    synchronized (state) {
                        if (blocking && eof)
                            break;
                        acquiring = blocking;
                    }
                    boolean got;
                    try {
                        if (blocking) {
                            mutex.acquire();
                            got = true;
                        } else {
                            got = mutex.acquire(0, TimeUnit.MILLISECONDS);
                        }
                    } finally {
                        synchronized (state) {
                            acquiring = false;
                        }
                    }
                    held = got;
                    say(got ? "acquired" : "busy");
                    break;
                case "release":
                    if (!held) {
                        error("lock not held");
                        break;
                    }
                    mutex.release();
                    held = false;
                    say("released");
                    break;
                default:
                    error("unknown command '" + cmd + "'");
                }
            } catch (Exception e) {
                error(e);
            }
        }
        if (held) {
            try {
                mutex.release();
            } catch (Exception e) {
                System.err.println("PeerCurator: release at exit: " + e);
            }
        }
        client.close();
        System.exit(0);
    }

    /* Feed stdin lines to the main thread. At end of input during a
     * blocking acquire nobody is left to wait for the answer: exit, and
     * the shutdown hook closes the session, which deletes our node. */
    static void readStdin() {
        try (BufferedReader in = new BufferedReader(
                 new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null)
                commands.put(line.trim());
        } catch (Exception e) {
            System.err.println("PeerCurator: reading stdin: " + e);
        }
        synchronized (state) {
            eof = true;
            if (acquiring)
                System.exit(0);
        }
        commands.add(EOF);
    }
}
