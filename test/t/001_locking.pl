# Several backends of one cluster contending through the real ensemble:
# exclusion, handoff, FIFO order, and every way out of a wait.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);
use ZkTest;

my $root = '/zklock_t001';
my $node = zk_cluster('locking', $root, 'zklock.session_timeout' => '20s');

# --- exclusion and handoff -------------------------------------------------
my $a = zk_session($node);
my $b = zk_session($node);

run_sql($a, "SELECT zk_lock('handoff')");
my @nodes = zk_contenders("$root/handoff");
is(scalar @nodes, 1, 'a holder has exactly one node');
like($nodes[0], qr/^_c_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}-lock-\d{10}$/,
	'the node is named in Curator InterProcessMutex format');
like(zk_get("$root/handoff/$nodes[0]"),
	qr/^\{"host":"[^"]+","port":\d+,"pid":$a->{zk_pid},"database":"postgres","user":"[^"]+","application_name":"[^"]*"\}$/,
	'the node data names the holding backend');

run_sql($a, "SELECT zk_lock('handoff')");
is(scalar zk_contenders("$root/handoff"), 1,
	'a repeated acquire by the holder adds no node');

send_query($b, "SELECT 'b granted' FROM zk_lock('handoff');");
ok(wait_for_zk_wait($node, $b->{zk_pid}),
	'a second backend waits, shown as wait_event_type Extension');
# PostgreSQL 17 and later name an extension's wait events.
my $wait_event = $node->pg_version >= 17 ? 'ZkLockWait' : 'Extension';
ok(wait_until("wait_event $wait_event",
		sub { $node->safe_psql('postgres',
				"SELECT wait_event FROM pg_stat_activity WHERE pid = $b->{zk_pid}") eq $wait_event }),
	"with wait_event $wait_event");
ok(zk_wait_contenders("$root/handoff", 2), 'the waiter queued one node');
like($node->safe_psql('postgres',
		"SELECT query FROM pg_stat_activity WHERE pid = $b->{zk_pid}"),
	qr/zk_lock\('handoff'\)/, 'pg_stat_activity shows which lock it waits for');
like(slurp_file("/proc/$b->{zk_pid}/cmdline"), qr/waiting for zklock "handoff"/,
	'and so does its process title');
run_sql($a, "SELECT zk_unlock('handoff')");
is($node->safe_psql('postgres',
		"SELECT wait_event_type FROM pg_stat_activity WHERE pid = $b->{zk_pid}"),
	'Extension', 'one unlock of a twice-held lock does not hand it over');
run_sql($a, "SELECT zk_unlock('handoff')");
ok(await_output($b, qr/b granted/), 'the last unlock hands the lock over');
unlike(slurp_file("/proc/$b->{zk_pid}/cmdline"), qr/waiting for zklock/,
	'the process title no longer says it waits');
my ($out) = run_sql($a, "SELECT zk_try_lock('handoff')");
is($out, 'f', 'the new holder excludes the old one');
run_sql($b, "SELECT zk_unlock('handoff')");
ok(zk_wait_contenders("$root/handoff", 0), 'no node left after handoff');

# --- a name with control characters, in the process title -----------------
# Every OS user reads process titles, one line per process: a name must not
# forge lines or terminal sequences there.  In a UTF-8 database, so that
# the C1 controls are characters too.
{
	$node->safe_psql('postgres',
		"CREATE DATABASE utf8_names ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	$node->safe_psql('utf8_names', 'CREATE EXTENSION zklock');
	my ($x, $y) = (zk_session($node, 'utf8_names'), zk_session($node, 'utf8_names'));
	my $raw_name = q{E'forged\nline\x1b[2J\u0085\\\\'};
	run_sql($x, "SELECT zk_lock($raw_name)");
	send_query($y, "SELECT 'y got forged' FROM zk_lock($raw_name);");
	my $title;
	ok(wait_until('the title to say it waits',
			sub { $title = slurp_file("/proc/$y->{zk_pid}/cmdline"); $title =~ /waiting for zklock/ }),
		'a backend waits for a name with control characters');
	like($title, qr/waiting for zklock "forged\\nline\\x1b\[2J\\u0085\\\\"/,
		'the process title shows them escaped');
	unlike($title, qr/[\n\r\x1b]|\xc2\x85/, 'and holds no control character');
	run_sql($x, "SELECT zk_unlock($raw_name)");
	ok(await_output($y, qr/y got forged/), 'the waiter is granted');
	run_sql($y, "SELECT zk_unlock($raw_name)");
	$_->quit for ($x, $y);
}

# --- FIFO order among 5 waiters -----------------------------------------
$node->safe_psql('postgres', 'CREATE TABLE grants (seq serial, who int)');
run_sql($a, "SELECT zk_lock('fifo')");
my @waiters;
for my $i (1 .. 5)
{
	my $s = zk_session($node);
	send_query($s,
		"INSERT INTO grants (who) SELECT $i FROM zk_lock('fifo'); "
		  . "SELECT 'waiter $i done' WHERE zk_unlock('fifo');");
	ok(wait_for_zk_wait($node, $s->{zk_pid}), "waiter $i waits");
	# Its node, not only its wait: the order is the nodes' order.
	ok(zk_wait_contenders("$root/fifo", $i + 1), "waiter $i queued");
	push @waiters, $s;
}
is(scalar zk_contenders("$root/fifo"), 6, 'holder and 5 waiters have a node each');
run_sql($a, "SELECT zk_unlock('fifo')");
ok(await_output($waiters[$_ - 1], qr/waiter $_ done/), "waiter $_ finished")
  for 1 .. 5;
is($node->safe_psql('postgres',
		"SELECT string_agg(who::text, ',' ORDER BY seq) FROM grants"),
	'1,2,3,4,5', 'waiters were granted in arrival order');
ok(zk_wait_contenders("$root/fifo", 0), 'no node left after the queue drained');
$_->quit for @waiters;

# --- try-lock loser, timeout, statement_timeout, lock_timeout ------------
run_sql($a, "SELECT zk_lock('giveup')");
my $err;
($out) = run_sql($b, "SELECT zk_try_lock('giveup')");
is($out, 'f', 'try-lock loses against a holder');
is(scalar zk_contenders("$root/giveup"), 1, 'the try-lock loser left no node');
($out) = run_sql($b, "SELECT zk_lock('giveup', '300ms')");
is($out, 'f', 'a timed wait returns false');
is(scalar zk_contenders("$root/giveup"), 1, 'the timed-out waiter left no node');
($out, $err) = run_sql($b,
	"SET statement_timeout = '300ms'; SELECT zk_xact_lock('giveup'); RESET statement_timeout");
like($err, qr/canceling statement due to statement timeout/,
	'statement_timeout ends a wait');
is(scalar zk_contenders("$root/giveup"), 1,
	'the waiter ended by statement_timeout left no node');
($out, $err) = run_sql($b,
	"SET lock_timeout = '300ms'; SELECT zk_lock('giveup'); RESET lock_timeout");
like($err, qr/canceling statement due to lock timeout/,
	'lock_timeout ends a wait');
is(scalar zk_contenders("$root/giveup"), 1,
	'the waiter ended by lock_timeout left no node');
($out) = run_sql($b, "SELECT 'still usable'");
is($out, 'still usable', 'the backend keeps working after those errors');

# --- cancel ---------------------------------------------------------------
my $c = zk_session($node);
send_query($b, "SELECT zk_lock('giveup');");
ok(wait_for_zk_wait($node, $b->{zk_pid}), 'first waiter queued');
send_query($c, "SELECT 'c granted' FROM zk_lock('giveup');");
ok(wait_for_zk_wait($node, $c->{zk_pid}), 'second waiter queued behind it');
ok(zk_wait_contenders("$root/giveup", 3), 'three nodes in the queue');
my $t0 = time;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($b->{zk_pid})");
ok(await_output($b, qr/canceling statement due to user request/),
	'pg_cancel_backend ends the wait');
cmp_ok(time - $t0, '<', 3, 'the cancel took effect within 3 s');
# Gone when the call returns, as the README promises: no polling.
is(scalar zk_contenders("$root/giveup"), 2,
	'the cancelled waiter\'s node is gone when the call returns');
run_sql($a, "SELECT zk_unlock('giveup')");
ok(await_output($c, qr/c granted/),
	'the waiter behind the cancelled one gets the lock');
run_sql($c, "SELECT zk_unlock('giveup')");
ok(zk_wait_contenders("$root/giveup", 0), 'the queue is empty');

# --- backend exit ---------------------------------------------------------
# The session timeout is 20 s: a grant within a few seconds shows the
# exiting backend closed its session rather than leaving it to expire.
run_sql($a, "SELECT zk_lock('exit')");
send_query($c, "SELECT 'c granted after exit' FROM zk_lock('exit');");
ok(wait_for_zk_wait($node, $c->{zk_pid}), 'waiter queued behind the holder');
$t0 = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($a->{zk_pid})");
ok(await_output($c, qr/c granted after exit/),
	'a terminated holder frees the lock');
cmp_ok(time - $t0, '<', 3, 'at once, not after the session timeout');

my $d = zk_session($node);
send_query($d, "SELECT 'd granted after quit' FROM zk_lock('exit');");
ok(wait_for_zk_wait($node, $d->{zk_pid}), 'waiter queued behind the holder');
$t0 = time;
$c->quit;
ok(await_output($d, qr/d granted after quit/),
	'a holder that disconnects frees the lock');
cmp_ok(time - $t0, '<', 3, 'at once, not after the session timeout');

# A terminated waiter leaves no node either.
my $e = zk_session($node);
send_query($e, "SELECT zk_lock('exit');");
ok(wait_for_zk_wait($node, $e->{zk_pid}), 'waiter queued');
ok(zk_wait_contenders("$root/exit", 2), 'two nodes');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($e->{zk_pid})");
# Well within the 20 s session timeout, so an expiry cannot pass for it.
ok(zk_wait_contenders("$root/exit", 1, 5),
	'a terminated waiter left no node: its session was closed');
run_sql($d, "SELECT zk_unlock('exit')");
ok(zk_wait_contenders("$root/exit", 0), 'the queue is empty');

# --- names and parents ----------------------------------------------------
run_sql($b, "SELECT zk_lock('plain-name_1.x'); SELECT zk_lock('a/b'); "
	  . "SELECT zk_lock('..'); SELECT zk_lock('zookeeper')");
my %parents = map { $_ => 1 } zk_children($root);
ok($parents{$_}, "lock parent $_ exists directly under the root")
  for ('plain-name_1.x', 'a%2Fb', '%2E%2E', 'zookeeper');
# Every path under the root is a parent or a contender directly below one.
my @deep = grep { tr{/}{} - $root =~ tr{/}{} > 2
	  || (tr{/}{} - $root =~ tr{/}{} == 2 && !m{/_c_[^/]+-lock-\d{10}$}) }
  split /\n/, ZkTest::zkinspect('tree', $root);
is_deeply(\@deep, [], 'no name reached below another node');
my ($old_token) = run_sql($b, "SELECT zk_lock_token('a/b')");
run_sql($b, 'SELECT zk_unlock_all()');

# Per-name parents are containers: the server reaps them once empty, and
# the next acquire creates the parent again.
ok(wait_until('the empty parent to be reaped',
		sub { !grep { $_ eq 'a%2Fb' } zk_children($root) }),
	'an unused lock parent is reaped by the server');
($out, $err) = run_sql($b, "SELECT zk_try_lock('a/b')");
is($out, 't', 'a lock whose parent was reaped is acquired again');
is(scalar zk_contenders("$root/a%2Fb"), 1, 'in a re-created parent');
my ($new_token) = run_sql($b, "SELECT zk_lock_token('a/b')");
cmp_ok($new_token, '>', $old_token,
	'the fencing token still grows across a re-created parent');
run_sql($b, "SELECT zk_unlock('a/b')");

# While every session is still open: a node left by a live session stays.
is_deeply([ zk_lock_nodes($root) ], [], 'no lock node is left under the root');
$b->quit;
$d->quit;
$node->stop;

# A single-user backend (maintenance, recovery) has no postmaster to watch;
# its locks must still work, and the wait for ZooKeeper must not hang.
my ($single_out, $single_err) = ('', '');
IPC::Run::run(
	[
		$node->config_data('--bindir') . '/postgres', '--single',
		'-D', $node->data_dir, 'postgres'
	],
	'<', \"SELECT zk_try_lock('single') AS got, zk_unlock('single') AS gone\n",
	'>', \$single_out, '2>', \$single_err,
	IPC::Run::timeout(60));
like($single_out, qr/got = "t".*gone = "t"/s,
	'a single-user backend locks and unlocks');
unlike($single_out . $single_err, qr/ERROR/, 'without an error');

# The client library's own chatter stays out of the server log.
my $log = slurp_file($node->logfile);
unlike($log, qr/ZOO_(INFO|DEBUG)/, 'no ZooKeeper client INFO or DEBUG lines in the server log');

done_testing();
