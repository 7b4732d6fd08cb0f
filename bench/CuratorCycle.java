/*
 * Curator InterProcessMutex acquire+release cycles for the zklock
 * benchmark.  Runs in source-file mode:
 *
 *   java -cp "$(cat test/peers/curator-classpath.txt)" bench/CuratorCycle.java HOSTS LOCKPATH JVM_WARMUP
 *
 * First warms up the JVM with JVM_WARMUP untimed cycles on a session of
 * its own (so the JIT has compiled Curator's and the client's hot paths
 * before anything is timed), then prints "ready" and reads one command per
 * line:
 *
 *   run N WARMUP [H]  open a new session to H (default HOSTS; the
 *                  benchmark gives the one server the repeat pins every
 *                  client to), run WARMUP
 *                  untimed acquire+release cycles of a
 *                  new InterProcessMutex on LOCKPATH, then N timed ones,
 *                  close the session and print
 *                    PEER client=curator n=N mean_ms=... p50_ms=... min_ms=... max_ms=...
 *                  mean_ms is the wall time of the N cycles divided by N.
 *   quit           exit (also on end of input)
 *
 * Nobody else uses LOCKPATH, so every acquire is uncontended: Curator
 * creates its protected node "_c_<uuid>-lock-<seq>", lists the parent, and
 * release deletes the node.  Errors are fatal (exit 1).
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Locale;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorCycle {
    static final int SESSION_TIMEOUT_MS = 10000;
    static final int CONNECT_TIMEOUT_MS = 10000;

    static String hosts;
    static String lockPath;

    static void logDefault(String property, String level) {
        if (System.getProperty(property) == null)
            System.setProperty(property, level);
    }

    /* Returns per-cycle times in ms; the last element is the wall time. */
    static double[] cycles(String connect, int n, int warmup) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(
            connect, SESSION_TIMEOUT_MS, CONNECT_TIMEOUT_MS, new RetryNTimes(3, 200));
        client.start();
        try {
            if (!client.blockUntilConnected(CONNECT_TIMEOUT_MS, TimeUnit.MILLISECONDS))
                throw new RuntimeException("cannot connect to " + connect);
            InterProcessMutex mutex = new InterProcessMutex(client, lockPath);
            double[] times = new double[n + 1];
            long start = 0;
            for (int i = 0; i < warmup + n; i++) {
                long t0 = System.nanoTime();
                if (i == warmup)
                    start = t0;
                if (!mutex.acquire(30, TimeUnit.SECONDS))
                    throw new RuntimeException("acquire timed out");
                mutex.release();
                if (i >= warmup)
                    times[i - warmup] = (System.nanoTime() - t0) / 1e6;
            }
            times[n] = (System.nanoTime() - start) / 1e6;
            return times;
        } finally {
            client.close();
        }
    }

    public static void main(String[] args) throws Exception {
        logDefault("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        logDefault("org.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn", "error");
        if (args.length != 3) {
            System.err.println("usage: CuratorCycle HOSTS LOCKPATH JVM_WARMUP");
            System.exit(2);
        }
        hosts = args[0];
        lockPath = args[1];
        int jvmWarmup = Integer.parseInt(args[2]);
        try {
            if (jvmWarmup > 0)
                cycles(hosts, 1, jvmWarmup);
            System.out.println("ready");
            System.out.flush();
            BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                String[] w = line.trim().split("\\s+");
                if (w.length == 0 || w[0].isEmpty())
                    continue;
                if (w[0].equals("quit"))
                    break;
                if (!w[0].equals("run") || (w.length != 3 && w.length != 4)) {
                    System.err.println("CuratorCycle: bad command '" + line + "'");
                    System.exit(1);
                }
                int n = Integer.parseInt(w[1]);
                double[] t = cycles(w.length == 4 ? w[3] : hosts, n, Integer.parseInt(w[2]));
                double wall = t[n];
                double[] sorted = Arrays.copyOf(t, n);
                Arrays.sort(sorted);
                double p50 = (n % 2 == 1) ? sorted[n / 2]
                    : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
                System.out.println(String.format(Locale.ROOT,
                    "PEER client=curator n=%d mean_ms=%.4f p50_ms=%.4f min_ms=%.4f max_ms=%.4f",
                    n, wall / n, p50, sorted[0], sorted[n - 1]));
                System.out.flush();
            }
        } catch (Exception e) {
            System.err.println("CuratorCycle: " + e);
            e.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }
}
