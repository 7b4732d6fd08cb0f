# ZooKeeper missing, unreachable or down: a clear error within
# zklock.connect_timeout, a backend that keeps working, and locks that work
# again once ZooKeeper is back.  Settings take effect at the next session.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use ZkTest;

my $root = '/zklock_t003';
my $node = zk_cluster('unreachable', $root, 'zklock.connect_timeout' => '1500ms');
my $s = zk_session($node);
my ($out, $err);

($out, $err) = run_sql($s, "SET zklock.hosts = ''; SELECT zk_lock('x')");
like($err, qr/ERROR:  zklock.hosts is not set/, 'no hosts: an error');
like($err, qr/HINT:  Set zklock.hosts/, 'with a hint saying what to set');
run_sql($s, 'RESET zklock.hosts');

($out, $err) = run_sql($s, "SELECT zk_lock('x'); SELECT zk_unlock('x')");
is($err, '', 'a lock works with the configured hosts');

# Nothing is held, so the changed setting applies to the next lock call.
run_sql($s, "SET zklock.hosts = '127.0.0.1:1'");
my $t0 = time;
($out, $err) = run_sql($s, "SELECT zk_lock('x')");
my $elapsed = time - $t0;
like($err, qr/could not connect to ZooKeeper at "127\.0\.0\.1:1" within 1500 ms/,
	'an unreachable ensemble gives an error naming the hosts');
cmp_ok($elapsed, '<', 4, 'within the connect timeout (plus margin)');
($out) = run_sql($s, "SELECT 'still usable'");
is($out, 'still usable', 'the backend keeps working');

run_sql($s, 'RESET zklock.hosts');
($out, $err) = run_sql($s, "SELECT zk_lock('x')");
is($err, '', 'the next call with good settings succeeds');

# While a lock is held, the open session is kept even if settings change.
run_sql($s, "SET zklock.hosts = '127.0.0.1:1'");
($out, $err) = run_sql($s, "SELECT zk_lock('y'); SELECT zk_unlock('y')");
is($err, '', 'a held lock keeps the current session');
run_sql($s, "RESET zklock.hosts; SELECT zk_unlock('x')");
$s->quit;

# The whole ensemble down: a new backend fails cleanly, then succeeds once
# the ensemble is back.
zk_ensemble('stop');
my $t = zk_session($node);
$t0 = time;
($out, $err) = run_sql($t, "SELECT zk_try_lock('x')");
$elapsed = time - $t0;
like($err, qr/could not connect to ZooKeeper at "[^"]+" within 1500 ms/,
	'a stopped ensemble gives an error');
cmp_ok($elapsed, '<', 4, 'within the connect timeout (plus margin)');
zk_ensemble('start');
# Servers just restarted may take longer than 1500 ms to take a session.
($out, $err) = run_sql($t, "SET zklock.connect_timeout = '20s'; SELECT zk_try_lock('x')");
is($out, 't', 'the same backend locks once the ensemble is back');
is($err, '', 'without error');
run_sql($t, "SELECT zk_unlock('x')");
$t->quit;

done_testing();
