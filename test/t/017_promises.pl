# What the README promises and no other suite covers: the statistics of
# cancellations, deadlocks and losses, the "unsure" state, the rate limit
# on the client library's own messages, the text form of a name that looks
# like an array, semaphore waits outside deadlock detection, and the loss
# cancel's wording when errors are not logged.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use ZkTest;

my $root = '/zklock_t017';
my %conf = (
	'zklock.session_timeout' => "'6s'",
	'zklock.connect_timeout' => "'3s'");
my $east = zk_cluster('east', $root, %conf);
my $west = zk_cluster('west', $root, %conf);
$_->safe_psql('postgres', q{
	CREATE FUNCTION zk_test_session_credentials() RETURNS text
	AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C}) for ($east, $west);
my ($out, $err);

sub query { return $_[0]->safe_psql('postgres', $_[1]); }

sub stat_of
{
	my ($node, $name, $column) = @_;
	return query($node, "SELECT coalesce(sum($column), 0) FROM zk_stat_locks WHERE name = '$name'");
}

sub expire
{
	my ($s) = @_;
	my ($creds) = run_sql($s, 'SELECT zk_test_session_credentials()');
	ZkTest::zkinspect('expire', $creds);
	return;
}

# --- zk_stat_locks: cancellations, deadlocks, losses ---------------------------
{
	my $h = zk_session($east);
	my $w = zk_session($east);
	run_sql($h, "SELECT zk_lock('st_cancel')");
	send_query($w, "SELECT zk_lock('st_cancel');");
	ok(wait_for_zk_wait($east, $w->{zk_pid}), 'statistics: a waiter');
	query($east, "SELECT pg_cancel_backend($w->{zk_pid})");
	ok(await_output($w, qr/canceling statement due to user request/), 'statistics: is cancelled');
	is(stat_of($east, 'st_cancel', 'cancellations'), '1', 'statistics: one cancellation counted');
	run_sql($h, "SELECT zk_unlock('st_cancel')");

	# A 2-cycle: the younger wait, on st_dl_a, is the victim.
	run_sql($h, "BEGIN; SELECT zk_xact_lock('st_dl_b')");
	run_sql($w, "BEGIN; SELECT zk_xact_lock('st_dl_a')");
	my $h_wait = wait_node($h);
	send_query($h, "SELECT 'h granted' FROM zk_xact_lock('st_dl_a');");
	ok(wait_for_zk_wait($east, $h->{zk_pid}), 'statistics: a first wait of a cycle');
	ok(await_published($root, $h_wait), 'statistics: published, so the older');
	send_query($w, "SELECT zk_xact_lock('st_dl_b');");
	ok(await_output($w, qr/ERROR:  deadlock detected/), 'statistics: the second is the victim');
	run_sql($w, 'ROLLBACK');
	ok(await_output($h, qr/h granted/), 'statistics: the first is granted');
	run_sql($h, 'ROLLBACK');
	is(stat_of($east, 'st_dl_b', 'deadlocks'), '1', 'statistics: the deadlock counted on its lock');

	# Holds lost with their session: one name held in both modes is two
	# holds, and zk_stat_locks and zk_status count them alike.
	run_sql($h, "SELECT zk_lock('st_lost'), zk_lock_shared('st_lost')");
	expire($h);
	ok(zk_wait_contenders("$root/st_lost", 0), 'statistics: a session expires under a hold');
	($out, $err) = run_sql($h, "SELECT zk_unlock('st_lost')");
	like($err, qr/was lost/, 'statistics: the loss is reported');
	is(stat_of($east, 'st_lost', 'losses'), '2', 'statistics: and counted, a hold per mode');
	($out) = run_sql($h, 'SELECT losses FROM zk_status()');
	is($out, '2', 'statistics: zk_status counts the same holds');
	run_sql($h, "SELECT zk_unlock_shared('st_lost')");
	no_node_left($root, 'statistics');
	$_->quit for ($h, $w);
}

# --- the "unsure" state, through a proxy that is paused ---------------------
#
# A paused proxy keeps its connections open and forwards nothing: the
# library notices the silence after two thirds of the session timeout.
# Resumed, it forwards what waited, and the library reconnects.
{
	my ($proxy, $proxy_port, $control) = start_proxy();
	sleep 1;
	my $u = zk_session($east);
	run_sql($u, "SET zklock.hosts = '127.0.0.1:$proxy_port'");
	# Noticed after two thirds of the timeout, the silence leaves a third
	# for the library to reconnect before the session expires: 15 s, enough
	# on a loaded machine.
	run_sql($u, "SET zklock.session_timeout = '45s'");
	run_sql($u, "SELECT zk_lock('unsure')");
	($out) = run_sql($u, "SELECT state FROM zk_status()");
	is($out, 'connected', 'unsure: connected at first');
	my $proxy_pid = $proxy->{KIDS}[0]{PID};
	kill 'STOP', $proxy_pid;
	ok(wait_until('the session to be unsure',
			sub { (run_sql($u, 'SELECT state FROM zk_status()'))[0] eq 'unsure' }, 60),
		'unsure: zk_status says so once the library notices the silence');
	($out) = run_sql($u, "SELECT state FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'unsure', 'unsure: and so does the backend\'s own zk_locks row');
	kill 'CONT', $proxy_pid;
	ok(wait_until('the session to be back',
			sub { (run_sql($u, 'SELECT state FROM zk_status()'))[0] eq 'connected' }, 30),
		'unsure: connected again once the connection is back, before the timeout');
	($out, $err) = run_sql($u, "SELECT zk_unlock('unsure')");
	is($out . $err, 't', 'unsure: the lock was held throughout');
	$u->quit;
	$proxy->kill_kill;
}

# --- the client library's own messages are rate-limited ----------------------
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $c = zk_session($west);
	run_sql($c, "SET zklock.hosts = '127.0.0.1:$port'");
	my $start = -s $west->logfile;
	for (1 .. 2)
	{
		($out, $err) = run_sql($c, "SELECT zk_try_lock('nowhere')");
		like($err, qr/could not connect to ZooKeeper/, "rate limit: a lock call fails ($_)");
	}
	my $lines = () = slurp_file($west->logfile, $start) =~ /LOG:  zookeeper client: .*ZOO_/mg;
	cmp_ok($lines, '>=', 1, 'rate limit: the library\'s messages reach the server log');
	is($lines, 5, 'rate limit: five of them in 10 s, however many the library wrote');
	sleep 10;
	run_sql($c, "SELECT zk_try_lock('nowhere')");
	like(slurp_file($west->logfile, $start), qr/LOG:  zookeeper client: \d+ more messages? suppressed$/m,
		'rate limit: then a count of the rest');
	$c->quit;
}

# --- a name that looks like an array is one name ------------------------------
{
	my $n = zk_session($east);
	($out, $err) = run_sql($n, "SELECT zk_lock('{a,b}')");
	is($err, '', 'the text form takes \'{a,b}\'');
	($out) = run_sql($n, "SELECT string_agg(name, ' ') FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, '{a,b}', 'as one lock named {a,b}');
	is(scalar zk_contenders("$root/%7Ba%2Cb%7D"), 1, 'under one parent');
	run_sql($n, "SELECT zk_unlock('{a,b}')");
	no_node_left($root, 'array-like name');
	$n->quit;
}

# --- semaphore waits take no part in deadlock detection ------------------------
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	run_sql($a, "SELECT zk_semaphore_acquire('sem_cycle', 1)");
	run_sql($b, "SELECT zk_lock('lock_cycle')");
	send_query($a, "SELECT 'a granted' FROM zk_lock('lock_cycle');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), 'semaphore cycle: one waits for a lock');
	send_query($b, "SELECT 'b granted' FROM zk_semaphore_acquire('sem_cycle', 1);");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'the other for a slot');
	sleep 2;    # past deadlock_timeout for both
	ok(still_waiting($west, $b, qr/b granted/), 'semaphore cycle: the slot waiter still waits');
	ok(still_waiting($east, $a, qr/a granted/), 'semaphore cycle: and so does the lock waiter: no deadlock is detected');
	is(scalar published_waits($root), 1, 'semaphore cycle: only the lock wait is published');
	query($west, "SELECT pg_cancel_backend($b->{zk_pid})");
	ok(await_output($b, qr/canceling statement due to user request/), 'semaphore cycle: a cancel ends it');
	run_sql($b, "SELECT zk_unlock('lock_cycle')");
	ok(await_output($a, qr/a granted/), 'semaphore cycle: and the other goes on once the lock is free');
	run_sql($_, 'SELECT zk_unlock_all()') for ($a, $b);
	no_node_left($root, 'semaphore cycle');
	$_->quit for ($a, $b);
}

# --- the loss cancel's wording does not depend on what the server logs -------
{
	my $q = zk_session($east);
	run_sql($q, 'SET log_min_messages = fatal');
	run_sql($q, '\set VERBOSITY verbose');
	run_sql($q, "BEGIN; SELECT zk_xact_lock('quiet_log')");
	my ($creds) = run_sql($q, 'SELECT zk_test_session_credentials()');
	send_query($q, "SELECT pg_sleep(20);");
	ok(wait_until('the sleep to run',
			sub { query($east, "SELECT wait_event FROM pg_stat_activity WHERE pid = $q->{zk_pid}") eq 'PgSleep' }),
		'quiet log: a statement runs under a transaction-level lock');
	ZkTest::zkinspect('expire', $creds);
	ok(await_output($q, qr/ERROR:  57014: canceling statement because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "quiet_log"\./),
		'quiet log: with log_min_messages = fatal, the loss still reads as the loss');
	run_sql($q, 'ROLLBACK');
	$q->quit;
}

done_testing();
