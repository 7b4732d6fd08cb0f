# zklock.keep_released: a released exclusive lock's node is kept, and the
# lock taken again without a request while nobody else wants it.  Each way
# a kept node is given up: a zklock, kazoo or Curator contender coming, its
# time running out, zk_unlock_all, DISCARD ALL, the backend's exit, a lost
# session, and the backend waiting in another queue.  A kept lock is not
# held: nothing is lost with it, and its token comes back with it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use ZkTest;

my $root = '/zklock_t026';
# A long session timeout: the leader sync that confirms a session heard
# from more than a sixth of it ago would count as a request.
# Sessions are not closed for idleness, but where a test says so: that
# gives kept nodes up too, and would hide the other ways.
my $node = zk_cluster('keeping', $root, 'zklock.session_timeout' => '30s',
	'zklock.idle_session_timeout' => '0');
$node->safe_psql('postgres', q{
	CREATE FUNCTION zk_test_session_credentials() RETURNS text
	AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
	CREATE FUNCTION zk_test_requests_sent() RETURNS bigint
	AS '$libdir/zklock', 'zk_test_requests_sent' LANGUAGE C;
	CREATE FUNCTION zk_test_keeping_decided() RETURNS boolean
	AS '$libdir/zklock', 'zk_test_keeping_decided' LANGUAGE C;
	CREATE FUNCTION zk_test_connection_count() RETURNS bigint
	AS '$libdir/zklock', 'zk_test_connection_count' LANGUAGE C;
});
my ($out, $err);

sub nodes_of
{
	my ($name) = @_;
	return zk_contenders("$root/$name");
}

sub kept_rows
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM zk_locks WHERE name = '$name' AND state = 'kept'");
}

sub requests_sent
{
	my ($s) = @_;
	my ($n) = run_sql($s, 'SELECT zk_test_requests_sent()');
	return $n;
}

# --- off by default, and bounded ---------------------------------------------
{
	my $s = zk_session($node);
	for my $bad ('-1', '2h')
	{
		($out, $err) = run_sql($s, "SET zklock.keep_released = '$bad'");
		like($err, qr/ERROR:  .* is outside the valid range for parameter "zklock\.keep_released"/,
			"keep_released = $bad is refused");
	}
	run_sql($s, "SELECT zk_lock('off'); SELECT zk_unlock('off')");
	is_deeply([ nodes_of('off') ], [], 'off: the node goes at release');
	$s->quit;
}

# --- kept, taken again without a request, shown, counted --------------------
{
	my $s = zk_session($node);
	run_sql($s, "SET zklock.keep_released = '60s'");
	($out) = run_sql($s, "SELECT zk_lock('again'); SELECT zk_lock_token('again')");
	my $token = $out;
	run_sql($s, "SELECT zk_unlock('again')");
	my @kept = nodes_of('again');
	is(scalar @kept, 1, 'kept: the node stays after the release');
	ok(wait_until('the node shown kept', sub { kept_rows('again') eq '1' }),
		'zk_locks shows it kept');
	is($node->safe_psql('postgres',
			"SELECT holds || ' ' || coalesce(scope, 'none') FROM zk_locks WHERE name = 'again'"),
		'0 none', 'with no hold and no scope');
	ok(wait_until('the listing to answer',
			sub { my ($n) = run_sql($s, 'SELECT zk_test_keeping_decided()'); $n eq 't' }),
		'the release\'s listing answered');

	my $before = requests_sent($s);
	($out) = run_sql($s, "SELECT zk_lock('again'); SELECT zk_lock_token('again')");
	is($out, $token, 'taken again: the same token');
	is(requests_sent($s), $before, 'without a request');
	is_deeply([ nodes_of('again') ], \@kept, 'on the same node');
	is($node->safe_psql('postgres',
			"SELECT state FROM zk_locks WHERE name = 'again'"),
		'held', 'shown held again');
	run_sql($s, "SELECT zk_unlock('again')");
	($out) = run_sql($s, "SELECT zk_lock('again'); SELECT zk_unlock('again')");
	is(requests_sent($s), $before, 'a whole cycle sends nothing either');
	is($node->safe_psql('postgres',
			"SELECT kept_acquisitions FROM zk_stat_locks WHERE name = 'again'"),
		'2', 'zk_stat_locks counts the acquisitions from the kept node');

	# A transaction lock keeps its node at COMMIT, and takes it back.
	run_sql($s, "BEGIN; SELECT zk_xact_lock('again'); COMMIT");
	is(requests_sent($s), $before, 'a transaction lock takes the kept node too');
	is(kept_rows('again'), '1', 'and keeps it at COMMIT');

	# Another backend's wait ends at once: the node is given up.
	my $c = zk_session($node);
	my $t0 = time;
	($out, $err) = run_sql($c, "SELECT zk_lock('again', interval '10 s')");
	is($out, 't', 'a zklock contender is granted');
	cmp_ok(time - $t0, '<', 3, 'within 3 s');
	ok(wait_until('the view to drop it', sub { kept_rows('again') eq '0' }),
		'no longer shown kept');
	send_query($s, "SELECT 'relocked' FROM zk_lock('again');");
	ok(wait_for_zk_wait($node, $s->{zk_pid}), 'the keeper now waits like anyone');
	run_sql($c, "SELECT zk_unlock('again')");
	ok(await_output($s, qr/relocked/), 'and is granted at the release');
	($out) = run_sql($s, "SELECT zk_lock_token('again')");
	cmp_ok($out, '>', $token, 'on a new node, with a greater token');
	run_sql($s, "SELECT zk_unlock_all()");
	$_->quit for ($s, $c);
}

# --- given up when its time runs out ----------------------------------------
{
	my $s = zk_session($node);
	run_sql($s, "SET zklock.keep_released = '1s'; SELECT zk_lock('timed'); SELECT zk_unlock('timed')");
	is(scalar nodes_of('timed'), 1, 'timed: kept');
	ok(wait_until('the node to go', sub { scalar nodes_of('timed') == 0 }, 10),
		'timed: deleted once its time ran out, the backend idle');
	ok(wait_until('the view to drop it', sub { kept_rows('timed') eq '0' }),
		'timed: no longer shown');
	my $before = requests_sent($s);
	run_sql($s, "SELECT zk_lock('timed'); SELECT zk_unlock('timed')");
	cmp_ok(requests_sent($s), '>', $before, 'timed: the next lock asks ZooKeeper');
	$s->quit;
}

# --- given up by zk_unlock_all, DISCARD ALL, exit ---------------------------
for my $how ('zk_unlock_all', 'DISCARD ALL', 'exit')
{
	my $name = "by_" . ($how =~ s/\W+/_/gr);
	my $s = zk_session($node);
	run_sql($s, "SET zklock.keep_released = '60s'; SELECT zk_lock('$name'); SELECT zk_unlock('$name')");
	is(scalar nodes_of($name), 1, "$how: kept");
	if ($how eq 'exit')
	{
		$s->quit;
	}
	else
	{
		run_sql($s, $how eq 'zk_unlock_all' ? 'SELECT zk_unlock_all()' : $how);
	}
	# Well before the 60 s it is kept for.
	ok(wait_until("the node to go", sub { scalar nodes_of($name) == 0 }, 5),
		"$how: the kept node is deleted");
	$s->quit unless $how eq 'exit';
}

# --- given up with a session closed for idleness ------------------------------
{
	my $s = zk_session($node);
	run_sql($s, "SET zklock.idle_session_timeout = '1s'; SET zklock.keep_released = '60s';
		SELECT zk_lock('idle'); SELECT zk_unlock('idle')");
	is(scalar nodes_of('idle'), 1, 'idle: kept');
	ok(wait_until('the node to go', sub { scalar nodes_of('idle') == 0 }, 10),
		'idle: gone with the session closed for idleness');
	ok(wait_until('the view to drop it', sub { kept_rows('idle') eq '0' }, 5),
		'idle: no longer shown, the backend still idle');
	($out, $err) = run_sql($s, "SELECT zk_try_lock('idle'), zk_unlock('idle')");
	is($out, 't|t', 'idle: the next lock opens a new session');
	run_sql($s, 'RESET zklock.keep_released; SELECT zk_unlock_all()');
	$s->quit;
}

# --- the node budget makes room ----------------------------------------------
{
	my $s = zk_session($node);
	run_sql($s, "SET zklock.max_session_nodes = 2; SET zklock.keep_released = '60s';
		SELECT zk_lock('budget_a'); SELECT zk_unlock('budget_a');
		SELECT zk_lock('budget_b'); SELECT zk_unlock('budget_b')");
	is(scalar(nodes_of('budget_a')) + scalar(nodes_of('budget_b')), 2,
		'budget: two nodes kept, the budget full');
	($out, $err) = run_sql($s, "SELECT zk_try_lock('budget_c')");
	is($out, 't', 'budget: a third lock is granted, as kept nodes make room');
	is($err, '', 'budget: without an error');
	run_sql($s, 'RESET zklock.keep_released; SELECT zk_unlock_all()');
	$s->quit;
}

# --- a lost session: nothing to acknowledge ---------------------------------
{
	my $s = zk_session($node);
	run_sql($s, "CREATE TABLE IF NOT EXISTS keep_work (v int)");
	run_sql($s, "SET zklock.keep_released = '60s'; SELECT zk_lock('lost'); SELECT zk_unlock('lost')");
	my @kept = nodes_of('lost');
	($out) = run_sql($s, 'SELECT zk_test_session_credentials()');
	ZkTest::zkinspect('expire', $out);
	ok(wait_for_session_lost($node, $s->{zk_pid}), 'lost: the keeper learns of the expiry');
	($out, $err) = run_sql($s, 'INSERT INTO keep_work VALUES (1)');
	is($err, '', 'lost: a write commits, since nothing was held');
	($out, $err) = run_sql($s, "SELECT zk_try_lock('lost')");
	is($err, '', 'lost: the next lock call succeeds, with nothing to acknowledge');
	is($out, 't', 'lost: granted');
	my @now = nodes_of('lost');
	is(scalar @now, 1, 'lost: on one node');
	isnt($now[0], $kept[0], 'lost: a new one, not the node kept by the lost session');
	run_sql($s, "SELECT zk_unlock('lost')");
	run_sql($s, 'RESET zklock.keep_released; SELECT zk_unlock_all()');
	ok(wait_until('no node', sub { scalar nodes_of('lost') == 0 }, 10), 'lost: nothing left');
	$s->quit;
}

# --- a reconnect: a node kept before it is not taken back after it ----------
# A change made while the connection was down is told only once the library
# has set its watches again; a node kept before is given up, not trusted.
{
	my ($proxy, $proxy_port, $control) = start_proxy();
	my ($server_port) = $ZkTest::hosts =~ /^[^:]+:(\d+)/;
	my $s = zk_session($node);
	ok(wait_until('the proxy to listen', sub {
		my ($r, $e) = run_sql($s, "SET zklock.hosts = '127.0.0.1:$proxy_port';
			SELECT zk_try_lock('recon_warm'), zk_unlock('recon_warm')");
		$e eq '' }), 'reconnect: locks work through the proxy');
	run_sql($s, "SET zklock.keep_released = '60s'; SELECT zk_lock('recon'); SELECT zk_unlock('recon')");
	ok(wait_until('the listing to answer',
			sub { my ($n) = run_sql($s, 'SELECT zk_test_keeping_decided()'); $n eq 't' }),
		'reconnect: kept');
	my @kept = nodes_of('recon');
	($out) = run_sql($s, 'SELECT zk_test_connection_count()');
	my $connections = $out;

	# The proxy goes, and a new one takes its port: the session reconnects.
	$proxy->kill_kill;
	$proxy = IPC::Run::start([ '/usr/bin/python3', "$ENV{ZKLOCK_SRC}/test/tools/zkproxy.py",
			$proxy_port, $server_port, $control ]);
	ok(wait_until('the session to reconnect', sub {
		my ($n) = run_sql($s, 'SELECT zk_test_connection_count()');
		$n > $connections }), 'reconnect: the session reconnected');

	my $before = requests_sent($s);
	($out, $err) = run_sql($s, "SELECT zk_try_lock('recon')");
	is($out, 't', 'reconnect: the lock is granted');
	cmp_ok(requests_sent($s), '>', $before, 'reconnect: asking ZooKeeper');
	my @now = nodes_of('recon');
	is(scalar @now, 1, 'reconnect: on one node');
	isnt($now[0], $kept[0], 'reconnect: a new one, not the node kept before');
	run_sql($s, 'RESET zklock.keep_released; SELECT zk_unlock_all()');
	$s->quit;
	$proxy->kill_kill;
}

# --- another backend's try-lock: a kept node looks held to it once ----------
# A contender that does not wait lists right after its create, before the
# keeper, told of that create, has deleted the kept node: that one try
# fails, and the next succeeds.
{
	my $s = zk_session($node);
	my $c = zk_session($node);
	run_sql($s, "SET zklock.keep_released = '60s'; SELECT zk_lock('tried'); SELECT zk_unlock('tried')");
	ok(wait_until('the listing to answer',
			sub { my ($n) = run_sql($s, 'SELECT zk_test_keeping_decided()'); $n eq 't' }),
		'tried: kept');
	is(sql_try($c, "zk_try_lock('tried')"), 'f', 'tried: the first try fails, as on a held lock');
	ok(wait_until('a try to succeed', sub { sql_try($c, "zk_try_lock('tried')") eq 't' }, 3),
		'tried: a try soon after succeeds, the kept node given up');
	run_sql($c, "SELECT zk_unlock_all()");
	$_->quit for ($s, $c);
}

# --- unlock_all with the lock held: nothing kept ------------------------------
{
	my $s = zk_session($node);
	run_sql($s, "SET zklock.keep_released = '60s'; SELECT zk_lock('all_held')");
	run_sql($s, 'SELECT zk_unlock_all()');
	is(scalar nodes_of('all_held'), 0, 'zk_unlock_all of a held lock keeps no node');
	run_sql($s, "SELECT zk_lock('all_held')");
	run_sql($s, 'DISCARD ALL');
	is(scalar nodes_of('all_held'), 0, 'nor does DISCARD ALL');
	$s->quit;
}

# --- a waiting keeper gives its kept nodes up: no deadlock through them -----
{
	my $a = zk_session($node);
	my $b = zk_session($node);
	run_sql($a, "SET zklock.keep_released = '60s'; SELECT zk_lock('dl_x'); SELECT zk_unlock('dl_x')");
	run_sql($b, "SELECT zk_lock('dl_y')");
	send_query($a, "SELECT 'a got y' FROM zk_lock('dl_y');");
	ok(wait_for_zk_wait($node, $a->{zk_pid}), 'deadlock: the keeper waits for another lock');
	ok(wait_until('the kept node to go', sub { scalar nodes_of('dl_x') == 0 }, 10),
		'deadlock: and gave its kept node up, though nobody asked for it');
	($out, $err) = run_sql($b, "SELECT zk_lock('dl_x', interval '10 s')");
	is($out, 't', 'deadlock: the other backend takes it, no deadlock reported');
	run_sql($b, 'SELECT zk_unlock_all()');
	ok(await_output($a, qr/a got y/), 'deadlock: the keeper is granted in turn');
	run_sql($a, 'SELECT zk_unlock_all()');
	$_->quit for ($a, $b);
}

# --- kazoo and Curator contenders see a holder that lets go -----------------
for my $kind ('kazoo', 'curator')
{
	my $name = "peer_$kind";
	my $s = zk_session($node);
	my $peer = start_peer($kind, "$root/$name");
	run_sql($s, "SET zklock.keep_released = '60s'; SELECT zk_lock('$name'); SELECT zk_unlock('$name')");
	ok(wait_until('the listing to answer',
			sub { my ($n) = run_sql($s, 'SELECT zk_test_keeping_decided()'); $n eq 't' }),
		"$kind: the node is kept");
	my $t0 = time;
	peer_send($peer, 'acquire');
	ok(peer_expect($peer, qr/^acquired$/m), "$kind: granted");
	cmp_ok(time - $t0, '<', 3, "$kind: within 3 s");
	is(sql_try($s, "zk_try_lock('$name')"), 'f', "$kind: zklock is then excluded");
	peer_send($peer, 'release');
	ok(peer_expect($peer, qr/^released$/m), "$kind: releases");
	peer_quit($peer);
	$s->quit;
}

sub sql_try
{
	my ($s, $call) = @_;
	my ($r) = run_sql($s, "SELECT $call");
	return $r;
}

no_node_left($root, 'keeping');
done_testing();
