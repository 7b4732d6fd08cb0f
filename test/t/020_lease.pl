# zklock.lease: a hold that outlives its lease is given up by zklock itself,
# even while the holder hangs (idle in a transaction, or stuck in a long
# statement): the next waiter is granted, and the holder fails closed as
# after a lost session.  A hold released in time, or granted without a
# lease, is left alone, and a lease counts from the grant, not the wait.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use ZkTest;

my $root = '/zklock_t020';
my $node = zk_cluster('lease', $root);
$node->safe_psql('postgres', 'CREATE TABLE lease_work (v int)');
my $lease_detail = qr/held past its lease of 3000 ms \(zklock\.lease\)/;

sub state_of
{
	my ($session) = @_;
	my ($out) = run_sql($session, 'SELECT state FROM zk_status()');
	return $out;
}

# --- a holder idle in its transaction --------------------------------------
{
	my $a = zk_session($node);
	my $b = zk_session($node);
	run_sql($a, "SET zklock.lease = '3s'; BEGIN; SELECT zk_xact_lock('lease_idle');
		INSERT INTO lease_work VALUES (1)");
	my $granted_at = time;
	send_query($b, "SELECT 'b granted' FROM zk_lock('lease_idle');");
	ok(wait_for_zk_wait($node, $b->{zk_pid}), 'a second backend waits');
	ok(await_output($b, qr/b granted/), 'the waiter is granted while the holder stays idle');
	my $held = time - $granted_at;
	cmp_ok($held, '>=', 2.5, 'not before the lease ran out');
	cmp_ok($held, '<', 10, 'soon after it ran out');
	my ($out, $err) = run_sql($a, 'COMMIT');
	like($err, qr/cannot commit because zklock lost its ZooKeeper session/,
		'the holder\'s COMMIT is refused');
	like($err, $lease_detail, 'and says the lease ran out');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM lease_work'), '0',
		'its work is not committed');
	run_sql($b, "SELECT zk_unlock('lease_idle')");
	run_sql($a, "RESET zklock.lease");
	($out) = run_sql($a, "SELECT zk_try_lock('lease_idle')");
	is($out, 't', 'the holder can lock again');
	is(state_of($a), 'connected', 'on a new session');
	$_->quit for ($a, $b);
}

# --- a holder stuck in a statement ------------------------------------------
{
	my $a = zk_session($node);
	my $b = zk_session($node);
	run_sql($a, "SET zklock.lease = '3s'; SELECT zk_lock('lease_stuck')");
	send_query($b, "SELECT 'b granted' FROM zk_lock('lease_stuck');");
	ok(wait_for_zk_wait($node, $b->{zk_pid}), 'a second backend waits');
	my $t0 = time;
	send_query($a, "INSERT INTO lease_work SELECT 2 FROM pg_sleep(60);");
	my ($ok, $errors) = await_output_and_stderr($a,
		qr/canceling statement because zklock lost its ZooKeeper session/);
	ok($ok, 'the holder\'s long statement is cancelled');
	like($errors, $lease_detail, 'because the lease ran out');
	cmp_ok(time - $t0, '<', 10, 'soon after it ran out');
	ok(await_output($b, qr/b granted/), 'the waiter is granted');
	my ($out, $err) = run_sql($a, 'INSERT INTO lease_work VALUES (3)');
	like($err, qr/cannot commit because zklock lost/,
		'a write before the loss is acknowledged does not commit');
	($out) = run_sql($a, "SELECT zk_unlock('lease_stuck')");
	is($out, 'f', 'zk_unlock acknowledges the lost lock');
	($out, $err) = run_sql($a, 'INSERT INTO lease_work VALUES (4)');
	is($err, '', 'then writes commit again');
	run_sql($b, "SELECT zk_unlock('lease_stuck')");
	$_->quit for ($a, $b);
	$node->safe_psql('postgres', 'DELETE FROM lease_work');
}

# --- holds the lease leaves alone -------------------------------------------
{
	my $a = zk_session($node);
	run_sql($a, "SET zklock.lease = '1s'; SELECT zk_lock('lease_short');
		SELECT zk_unlock('lease_short'); RESET zklock.lease;
		SELECT zk_lock('lease_none')");
	sleep 3;
	is(state_of($a), 'connected', 'a leased hold released in time does not end the session');
	my ($out) = run_sql($a, "SELECT zk_unlock('lease_none')");
	is($out, 't', 'nor does a hold taken without a lease');

	# The lease counts from the grant: a long wait does not use it up.
	my $h = zk_session($node);
	run_sql($h, "SELECT zk_lock('lease_wait')");
	send_query($a, "SET zklock.lease = '3s'; SELECT 'a granted' FROM zk_lock('lease_wait');");
	ok(wait_for_zk_wait($node, $a->{zk_pid}), 'a leased acquire waits');
	sleep 4;
	run_sql($h, "SELECT zk_unlock('lease_wait')");
	ok(await_output($a, qr/a granted/), 'and is granted after longer than its lease');
	is(state_of($a), 'connected', 'with its session kept');
	($out) = run_sql($a, "SELECT zk_unlock('lease_wait')");
	is($out, 't', 'and its hold released by itself');
	no_node_left("$root/lease_wait", 'after a leased hold');
	$_->quit for ($a, $h);
}

done_testing();
