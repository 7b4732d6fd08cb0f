# All-or-nothing multi-locks: names taken in one canonical order whatever
# order they are listed in, so two multi-locks never deadlock each other;
# a timeout, a failed try, a cancel, an error in a savepoint or a session
# that expires while the call waits gives back every hold the call took.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use ZkTest;

my $root = '/zklock_t014';
my $east = zk_cluster('east', $root);
my $west = zk_cluster('west', $root);
my ($out, $err);

# --- two backends, opposite orders, 50 times each --------------------------
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	# Detection off: a deadlock would show as a hang, not as a 40P01.
	run_sql($_, 'SET zklock.deadlock_timeout = 0') for ($a, $b);
	send_query($a, "SELECT count(*) FROM generate_series(1, 50) i, "
		  . "LATERAL (SELECT zk_lock(ARRAY['pair_x', 'pair_y']), zk_unlock(ARRAY['pair_x', 'pair_y'])) t; "
		  . "SELECT 'a done';");
	send_query($b, "SELECT count(*) FROM generate_series(1, 50) i, "
		  . "LATERAL (SELECT zk_lock(ARRAY['pair_y', 'pair_x']), zk_unlock(ARRAY['pair_y', 'pair_x'])) t; "
		  . "SELECT 'b done';");
	ok(await_output($a, qr/a done/), 'one backend takes [x, y] 50 times');
	ok(await_output($b, qr/b done/), 'the other takes [y, x] 50 times, and neither deadlocks');
	no_node_left($root, 'opposite orders');
	$_->quit for ($a, $b);
}

# --- a timeout with one name free and one held -------------------------------
{
	my $h = zk_session($west);
	my $m = zk_session($east);
	run_sql($h, "SELECT zk_lock('held_one')");
	my $t0 = time;
	($out) = run_sql($m, "SELECT zk_lock(ARRAY['free_one', 'held_one'], '1s')");
	is($out, 'f', 'a multi-lock times out when one name is held');
	cmp_ok(time - $t0, '<', 1 + 3, 'the timeout covers the whole call');
	($out) = run_sql($m, "SELECT count(*) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, '0', 'and holds nothing');
	is(scalar zk_contenders("$root/free_one"), 0, 'the free name is left unheld, with no node');
	($out) = run_sql($m, "SELECT zk_try_lock(ARRAY['free_one', 'held_one'])");
	is($out, 'f', 'a multi-try fails the same way');
	is(scalar zk_contenders("$root/free_one"), 0, 'leaving nothing either');

	send_query($m, "SELECT zk_lock(ARRAY['free_one', 'held_one']);");
	ok(wait_for_zk_wait($east, $m->{zk_pid}), 'a multi-lock waits for the held name');
	$east->safe_psql('postgres', "SELECT pg_cancel_backend($m->{zk_pid})");
	ok(await_output($m, qr/canceling statement due to user request/), 'and is cancelled');
	is(scalar zk_contenders("$root/free_one"), 0, 'giving back the name it had taken');
	run_sql($h, "SELECT zk_unlock('held_one')");

	# Transaction level: all at COMMIT.
	run_sql($m, "BEGIN; SELECT zk_xact_lock(ARRAY['txn_b', 'txn_a', 'txn_b'])");
	($out) = run_sql($m, "SELECT string_agg(name || ':' || holds, ',' ORDER BY name) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'txn_a:1,txn_b:1', 'a transaction multi-lock takes each name once');
	($out) = run_sql($h, "SELECT zk_try_lock(ARRAY['txn_a'])");
	is($out, 'f', 'and holds them');
	run_sql($m, 'COMMIT');
	($out) = run_sql($h, "SELECT zk_try_lock(ARRAY['txn_a', 'txn_b']) AND zk_unlock(ARRAY['txn_a', 'txn_b'])");
	is($out, 't', 'until COMMIT');
	no_node_left($root, 'timeouts and cancels');
	$_->quit for ($h, $m);
}

# --- stacking, unlock, and single-name holds -----------------------------------
{
	my $s = zk_session($east);
	run_sql($s, "SELECT zk_lock('single')");
	run_sql($s, "SELECT zk_lock(ARRAY['single', 'other'])");
	($out) = run_sql($s, "SELECT string_agg(name || ':' || holds, ',' ORDER BY name) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'other:1,single:2', 'a multi-lock stacks on a name already held');
	($out, $err) = run_sql($s, "SELECT zk_unlock(ARRAY['single', 'other', 'never'])");
	is($out, 'f', 'unlocking a list with a name not held returns false');
	like($err, qr/WARNING:  zklock "never" is not held/, 'with a WARNING for it');
	($out) = run_sql($s, "SELECT string_agg(name || ':' || holds, ',' ORDER BY name) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'single:1', 'and releases one hold of each name that was held');

	my $w = zk_session($west);
	run_sql($w, "SELECT zk_lock('blocked')");
	($out) = run_sql($s, "SELECT zk_lock(ARRAY['single', 'blocked'], '300ms')");
	is($out, 'f', 'a timed-out multi-lock');
	($out) = run_sql($s, "SELECT string_agg(name || ':' || holds, ',' ORDER BY name) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'single:1', 'leaves an earlier single-name hold as it was');
	run_sql($s, 'SELECT zk_unlock_all()');
	run_sql($w, 'SELECT zk_unlock_all()');
	no_node_left($root, 'stacking');
	$_->quit for ($s, $w);
}

# --- an error inside a savepoint gives back only what the call took -----------
{
	my $s = zk_session($east);
	my $w = zk_session($west);
	run_sql($w, "SELECT zk_lock('sp_blocked')");
	run_sql($s, "BEGIN; SELECT zk_xact_lock('sp_outer'); SAVEPOINT s; SET LOCAL statement_timeout = '300ms'");
	($out, $err) = run_sql($s, "SELECT zk_xact_lock(ARRAY['sp_a', 'sp_blocked'])");
	like($err, qr/canceling statement due to statement timeout/, 'a multi-lock in a savepoint runs into statement_timeout');
	run_sql($s, 'ROLLBACK TO s');
	($out) = run_sql($s, "SELECT string_agg(name || ':' || holds, ',' ORDER BY name) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'sp_outer:1', 'after ROLLBACK TO, the hold from before the savepoint stays, and only it');
	($out) = run_sql($w, "SELECT zk_try_lock('sp_a') AND zk_unlock('sp_a')");
	is($out, 't', 'the name the call had taken is free');
	run_sql($s, 'COMMIT');
	run_sql($w, "SELECT zk_unlock('sp_blocked')");
	no_node_left($root, 'a savepoint');
	$_->quit for ($s, $w);
}

# --- the session expires while a multi-lock waits for its second name --------
{
	$east->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_session_credentials() RETURNS text
		AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C});
	my $h = zk_session($west);
	my $m = zk_session($east);
	run_sql($h, "SELECT zk_lock('exp_b')");
	run_sql($m, "SELECT zk_try_lock('exp_warm_up') AND zk_unlock('exp_warm_up')");
	my ($creds) = run_sql($m, 'SELECT zk_test_session_credentials()');
	send_query($m, "SELECT 'm granted' FROM zk_lock(ARRAY['exp_a', 'exp_b']);");
	ok(wait_for_zk_wait($east, $m->{zk_pid}), 'a multi-lock holds one name and waits for the other');
	is(scalar zk_contenders("$root/exp_a"), 1, 'the first name is taken');
	ZkTest::zkinspect('expire', $creds);
	ok(await_output($m,
			qr/ERROR:  zklock (lost its ZooKeeper session|lock node "[^"]+" disappeared while waiting)/),
		'its session expires: the call ends with an ERROR');
	($out) = run_sql($m, "SELECT count(*) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, '0', 'and holds nothing, not even the lost first name');
	($out) = run_sql($h, "SELECT zk_try_lock('exp_a') AND zk_unlock('exp_a')");
	is($out, 't', 'the first name is free for others');
	($out) = run_sql($m, "SELECT zk_try_lock(ARRAY['exp_a']) AND zk_unlock(ARRAY['exp_a'])");
	is($out, 't', 'the backend locks again on a new session');
	run_sql($h, "SELECT zk_unlock('exp_b')");
	no_node_left($root, 'an expired session');
	$_->quit for ($h, $m);
}

# --- the session is lost between two names -----------------------------------
{
	$east->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_lose_session_after_grants(int) RETURNS void
		AS '$libdir/zklock', 'zk_test_lose_session_after_grants' LANGUAGE C});
	my $m = zk_session($east);
	my $t = zk_session($west);
	run_sql($m, '\set VERBOSITY verbose');
	run_sql($m, 'SELECT zk_test_lose_session_after_grants(1)');
	($out, $err) = run_sql($m, "SELECT zk_lock(ARRAY['between_a', 'between_b'])");
	like($err,
		qr/ERROR:  08006: zklock lost its ZooKeeper session while taking several locks\nDETAIL:  None of the locks of this call is held\./,
		'lost between two names: the documented error, with its SQLSTATE');
	($out) = run_sql($m, "SELECT count(*) FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, '0', 'lost between two names: nothing is held');
	($out) = run_sql($t, "SELECT zk_try_lock(ARRAY['between_a', 'between_b']) AND zk_unlock(ARRAY['between_a', 'between_b'])");
	is($out, 't', 'lost between two names: both names are free for others');
	no_node_left($root, 'lost between two names');
	$_->quit for ($m, $t);
}

done_testing();
