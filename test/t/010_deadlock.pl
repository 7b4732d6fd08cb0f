# Deadlock detection across clusters: a cycle of zklock waits ends with
# exactly one "deadlock detected" (40P01), the survivors go on, and waits
# that are merely long, or that end while the check runs, never raise it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use ZkTest;

my $root = '/zklock_t010';
# A session's published waits are named for its ZooKeeper session, which
# must outlive the idle pauses of these tests for the name to hold.
my %conf = ('zklock.idle_session_timeout' => 0);
my $east = zk_cluster('east', $root, %conf);
my $west = zk_cluster('west', $root, %conf);
my $waits = "$root/%waits";
for my $node ($east, $west)
{
	$node->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_delay_deadlock_confirmation(int) RETURNS void
		AS '$libdir/zklock', 'zk_test_delay_deadlock_confirmation' LANGUAGE C;
		CREATE FUNCTION zk_test_deadlock_max_members(int) RETURNS void
		AS '$libdir/zklock', 'zk_test_deadlock_max_members' LANGUAGE C;
		CREATE TABLE rows (id int PRIMARY KEY);
		INSERT INTO rows VALUES (1)});
}

# A session with its ZooKeeper session open, printing SQLSTATEs with its
# errors; wait_node is the name its published waits get: the session id.
sub session
{
	my ($node) = @_;
	my $s = zk_session($node);
	$s->query_safe('\set VERBOSITY verbose');
	$s->query_safe("SELECT zk_try_lock('warm_up'), zk_unlock('warm_up')");
	$s->{wait_node} = wait_node($s);
	return $s;
}

# Pump the sessions until $done says so or $timeout seconds pass.
sub pump_sessions
{
	my ($timeout, $done, @sessions) = @_;
	my $deadline = time + $timeout;
	while (time < $deadline)
	{
		$_->{run}->pump_nb for @sessions;
		return 1 if $done->();
		usleep(50_000);
	}
	return 0;
}

sub deadlocked
{
	my ($s) = @_;
	return $s->{stderr} =~ /ERROR:  40P01: deadlock detected/;
}

# Wait until one of the sessions reports the deadlock; returns it.
sub first_victim
{
	my ($timeout, @sessions) = @_;
	pump_sessions($timeout, sub { grep { deadlocked($_) } @sessions }, @sessions);
	my ($victim) = grep { deadlocked($_) } @sessions;
	return $victim;
}

# Wait until one of the sessions reports the deadlock, then a while
# longer, so that a second report would be seen too.  Returns the
# sessions that reported one.
sub victims
{
	my ($timeout, @sessions) = @_;
	first_victim($timeout, @sessions);
	pump_sessions(3, sub { 0 }, @sessions);
	return grep { deadlocked($_) } @sessions;
}

sub clear
{
	$_->{stdout} = $_->{stderr} = '' for @_;
}

# --- a 2-cycle across two clusters, transaction-level locks ---------------
{
	my $a = session($east);
	my $b = session($west);
	run_sql($a, "BEGIN; SELECT zk_xact_lock('two_a')");
	run_sql($b, "BEGIN; SELECT zk_xact_lock('two_b')");
	send_query($a, "SELECT 'a granted' FROM zk_xact_lock('two_b');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), '2-cycle: the first backend waits');
	ok(await_published($root, $a->{wait_node}), '2-cycle: and its wait is published');
	my $t0 = time;
	send_query($b, "SELECT 'b granted' FROM zk_xact_lock('two_a');");
	my $victim = first_victim(15, $a, $b);
	ok($victim, '2-cycle: a backend gets "deadlock detected"');
	cmp_ok(time - $t0, '<', 1 + 4, 'within deadlock_timeout and a few seconds');
	is(scalar(grep { $_ eq $victim->{wait_node} } published_waits($root)), 0,
		'the victim\'s published wait is gone when the call returns');
	is(scalar zk_contenders("$root/two_a"), 1, 'and its waiting node too');
	is($victim, $b, 'the victim is the younger wait');
	my ($survivor) = grep { $_ != $victim } ($a, $b);
	pump_sessions(3, sub { 0 }, $a, $b);
	ok(!deadlocked($a), 'and the other is no victim');
	like($victim->{stderr},
		qr/DETAIL:  Process \d+ on [^:]+:\d+ waits for exclusive zklock "two_[ab]"; blocked by process \d+ on [^:]+:\d+\.\nProcess \d+ on [^:]+:\d+ waits for exclusive zklock "two_[ab]"; blocked by process \d+ on [^:]+:\d+\./,
		'the DETAIL names each process, the zklock it waits for and who blocks it');
	like($victim->{stderr}, qr/Process $victim->{zk_pid} on [^:]+:\d+ waits/,
		'the victim itself among them');
	diag("the victim's report:\n" . ($victim->{stderr} =~ s/^LOCATION:.*\n//mr));
	like($survivor->{stdout}, qr/granted/, 'the survivor gets its lock');
	is(scalar(grep { $_ eq $survivor->{wait_node} } published_waits($root)), 0,
		'and withdrew its published wait');
	clear($a, $b);
	my ($out, $err) = run_sql($victim, 'SELECT 1');
	like($err, qr/current transaction is aborted/,
		'the victim\'s transaction was aborted');
	run_sql($victim, 'ROLLBACK');
	($out, $err) = run_sql($survivor, 'COMMIT');
	is($err, '', 'the survivor commits');
	($out) = run_sql($victim, 'SELECT deadlocks FROM zk_status()');
	is($out, '1', 'zk_status counts the deadlock');
	$_->quit for ($a, $b);
}

# --- 2-cycles whose waits start at once, so both check at once -------------
{
	my $a = session($east);
	my $b = session($west);
	my $ok = 0;
	for my $round (1 .. 10)
	{
		run_sql($a, "BEGIN; SELECT zk_xact_lock('once_a')");
		run_sql($b, "BEGIN; SELECT zk_xact_lock('once_b')");
		send_query($a, "SELECT 'a granted' FROM zk_xact_lock('once_b');");
		send_query($b, "SELECT 'b granted' FROM zk_xact_lock('once_a');");
		my @victims = victims(15, $a, $b);
		my ($survivor) = grep { !deadlocked($_) } ($a, $b);
		$ok++ if @victims == 1 && $survivor->{stdout} =~ /granted/;
		diag("round $round: " . scalar(@victims) . ' victims') if @victims != 1;
		clear($a, $b);
		run_sql($_, 'ROLLBACK') for ($a, $b);
	}
	is($ok, 10, 'simultaneous 2-cycles: exactly one victim every time, and the other granted');
	$_->quit for ($a, $b);
}

# --- a 3-cycle across three backends --------------------------------------
{
	my @s = (session($east), session($west), session($east));
	run_sql($s[$_], "BEGIN; SELECT zk_xact_lock('three_$_')") for 0 .. 2;
	for my $i (0 .. 2)
	{
		my $next = ($i + 1) % 3;
		send_query($s[$i], "SELECT 'granted $i' FROM zk_xact_lock('three_$next');");
		ok(wait_for_zk_wait($i == 1 ? $west : $east, $s[$i]->{zk_pid}),
			"3-cycle: backend $i waits");
		ok(await_published($root, $s[$i]->{wait_node}),
			"3-cycle: backend ${i}'s wait is published")
		  if $i < 2;
	}
	my @victims = victims(15, @s);
	is(scalar @victims, 1, '3-cycle: exactly one victim');
	my ($victim) = grep { deadlocked($s[$_]) } 0 .. 2;
	is($victim, 2, 'the one whose wait began last');
	like($s[$victim]->{stderr}, qr/(?:Process .*\n){2}Process .*\./,
		'the DETAIL has three lines');
	# The one waiting for the victim gets its lock; once it commits, the
	# last one does.
	my $first = ($victim + 2) % 3;
	my $last = ($victim + 1) % 3;
	ok(pump_sessions(10, sub { $s[$first]->{stdout} =~ /granted $first/ }, @s),
		'the backend waiting for the victim is granted');
	run_sql($s[$first], 'COMMIT');
	ok(pump_sessions(10, sub { $s[$last]->{stdout} =~ /granted $last/ }, @s),
		'then the last one');
	run_sql($_, 'ROLLBACK') for @s;
	$_->quit for @s;
}

# --- a cycle of session-level locks -----------------------------------------
{
	my $a = session($east);
	my $b = session($west);
	run_sql($a, "SELECT zk_lock('sess_a')");
	run_sql($b, "SELECT zk_lock('sess_b')");
	send_query($a, "SELECT 'a granted' FROM zk_lock('sess_b');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), 'session cycle: the first backend waits');
	send_query($b, "SELECT 'b granted' FROM zk_lock('sess_a');");
	my @victims = victims(15, $a, $b);
	is(scalar @victims, 1, 'session cycle: exactly one victim');
	my ($victim) = @victims;
	my ($survivor) = grep { $_ != $victim } ($a, $b);
	unlike($survivor->{stdout}, qr/granted/,
		'the victim keeps its session lock, so the other still waits');
	my $held = $victim == $a ? 'sess_a' : 'sess_b';
	clear($a, $b);
	my ($out) = run_sql($victim, "SELECT zk_unlock('$held')");
	is($out, 't', 'the victim unlocks it');
	ok(pump_sessions(10, sub { $survivor->{stdout} =~ /granted/ }, $survivor),
		'and the other proceeds');
	run_sql($_, 'SELECT zk_unlock_all()') for ($a, $b);
	$_->quit for ($a, $b);
}

# --- a cycle mixing shared and exclusive, through timed waits ---------------
{
	my $a = session($east);
	my $b = session($west);
	run_sql($a, "BEGIN; SELECT zk_xact_lock_shared('mixed_x')");
	run_sql($b, "BEGIN; SELECT zk_xact_lock('mixed_y')");
	send_query($a, "SELECT 'a: ' || zk_xact_lock_shared('mixed_y', '60s');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), 'mixed cycle: a reader waits for a writer');
	send_query($b, "SELECT 'b: ' || zk_xact_lock('mixed_x', '60s');");
	my @victims = victims(15, $a, $b);
	is(scalar @victims, 1, 'mixed cycle: exactly one victim, long before the timed waits end');
	my ($victim) = @victims;
	like($victim->{stderr}, qr/waits for shared zklock "mixed_y"/,
		'the DETAIL gives the mode of each wait');
	my ($survivor) = grep { $_ != $victim } ($a, $b);
	ok(pump_sessions(10, sub { $survivor->{stdout} =~ /: true/ }, $survivor),
		'the survivor\'s timed wait is granted');
	run_sql($_, 'ROLLBACK') for ($a, $b);
	$_->quit for ($a, $b);
}

# --- no false positives -------------------------------------------------------
{
	# A long wait behind a holder that does not wait: published, never a
	# deadlock, and withdrawn when the wait ends.
	my $h = session($east);
	my $w = session($west);
	run_sql($h, "SELECT zk_lock('long_wait')");
	send_query($w, "SELECT 'timed out: ' || NOT zk_lock('long_wait', '4s');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a backend waits behind an idle holder');
	my $published = $w->{wait_node};
	ok(await_published($root, $published), 'after deadlock_timeout its wait is published');
	ok(await_output($w, qr/timed out: true/), 'the wait just times out, no deadlock');
	is(scalar(grep { $_ eq $published } published_waits($root)), 0,
		'and its published wait is gone when the call returns');

	# A chain that ends at a holder that works.
	my $c = session($east);
	run_sql($w, "SELECT zk_lock('chain_2')");
	send_query($h, "SELECT pg_sleep(5);");
	send_query($w, "SELECT 'w granted' FROM zk_lock('long_wait');");
	send_query($c, "SELECT 'c granted' FROM zk_lock('chain_2');");
	ok(wait_for_zk_wait($east, $c->{zk_pid}), 'a chain of two waits');
	ok(!pump_sessions(4, sub { ($w->{stderr} . $c->{stderr}) =~ /ERROR/ }, $w, $c),
		'a chain that ends at a working holder raises nothing');
	run_sql($h, "SELECT zk_unlock('long_wait')");
	ok(await_output($w, qr/w granted/), 'once the holder is done, the chain moves');
	run_sql($w, "SELECT zk_unlock('chain_2')");
	ok(await_output($c, qr/c granted/), 'to its end');
	run_sql($_, 'SELECT zk_unlock_all()') for ($h, $w, $c);

	# A cycle that ends by a timeout before the younger waiter checks: the
	# older one's check finds the other not yet published, its timed wait
	# runs out, and the other is granted.
	run_sql($h, "SET zklock.deadlock_timeout = '4s'");
	run_sql($w, "BEGIN; SELECT zk_xact_lock('brief_a')");
	run_sql($h, "BEGIN; SELECT zk_xact_lock('brief_b')");
	send_query($w, "SELECT 'w: ' || zk_xact_lock('brief_b', '2s');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a brief cycle: the first waits');
	send_query($h, "SELECT 'h: ' || zk_xact_lock('brief_a', '20s');");
	ok(await_output($w, qr/w: false/), 'its timed wait runs out, with no deadlock');
	run_sql($w, 'ROLLBACK');
	ok(await_output($h, qr/h: true/), 'and the other is granted, with no deadlock');
	run_sql($h, 'ROLLBACK');
	$_->quit for ($h, $w, $c);
}

# --- a cycle behind one that breaks while it is read again -----------------
#
# S holds l3 and l4, A and B hold l1 shared, C holds l2; A waits for C, C
# for S, B for S with a timeout, then S for A and B.  S is the youngest of
# two cycles, S-B-S and S-A-C-S.  Its check finds them, and, held between
# finding and reading again, lets B time out: the first cycle no longer
# holds, the second does, and S must still be the victim.
{
	my ($s, $a, $b, $c) = (session($east), session($west), session($east), session($west));
	run_sql($s, "SELECT zk_lock('l3'), zk_lock('l4')");
	run_sql($a, "SELECT zk_lock_shared('l1')");
	run_sql($b, "SELECT zk_lock_shared('l1')");
	run_sql($c, "SELECT zk_lock('l2')");
	send_query($a, "SELECT 'a granted' FROM zk_lock('l2');");
	send_query($c, "SELECT 'c granted' FROM zk_lock('l4');");
	send_query($b, "SELECT 'b: ' || zk_lock('l3', '3s');");
	ok(wait_until('three published waits',
			sub {
				my %published = map { $_ => 1 } published_waits($root);
				$published{ $a->{wait_node} }
				  && $published{ $b->{wait_node} }
				  && $published{ $c->{wait_node} };
			}),
		'two cycles: A, B and C wait, their waits published');
	run_sql($s, 'SELECT zk_test_delay_deadlock_confirmation(2500)');
	send_query($s, "SELECT 's granted' FROM zk_lock('l1');");
	ok(await_output($b, qr/b: false/), 'two cycles: B times out, ending the first cycle');
	my $victim = first_victim(20, $s, $a, $c);
	is($victim, $s, 'two cycles: S is found in the second one all the same');
	run_sql($_, 'SELECT zk_unlock_all()') for ($s, $b, $c);
	ok(await_output($a, qr/a granted/), 'two cycles: the others go on');
	run_sql($a, 'SELECT zk_unlock_all()');
	$_->quit for ($s, $a, $b, $c);
}

# --- a graph larger than a check follows ------------------------------------
{
	my ($h, $k, $w) = (session($east), session($west), session($east));
	run_sql($k, "SELECT zk_lock('big_b')");
	run_sql($h, "SELECT zk_lock('big_a')");
	send_query($h, "SELECT 'h granted' FROM zk_lock('big_b');");
	ok(await_published($root, $h->{wait_node}), 'too large: a holder waits in turn');
	run_sql($w, 'SELECT zk_test_deadlock_max_members(1)');
	my $log_start = -s $east->logfile;
	send_query($w, "SELECT 'w granted' FROM zk_lock('big_a');");
	ok(wait_for_zk_wait($east, $w->{zk_pid}), 'too large: a waiter behind it');
	sleep 8;
	my $log = slurp_file($east->logfile, $log_start);
	my $lines = () = $log =~ /zklock deadlock check put off/g;
	is($lines, 1, 'too large: the check says so once, not at every deadlock_timeout');
	run_sql($k, "SELECT zk_unlock('big_b')");
	ok(await_output($h, qr/h granted/), 'too large: the chain moves on');
	run_sql($h, 'SELECT zk_unlock_all()');
	ok(await_output($w, qr/w granted/), 'too large: to its end');
	run_sql($_, 'SELECT zk_unlock_all()') for ($w);
	$_->quit for ($h, $k, $w);
}

# --- a published wait whose create lost its reply --------------------------
#
# A's first publish is applied but its reply lost; A publishes again once B
# has published.  A must keep the age of its first node, older than B's, or
# both would take themselves for the youngest: B, whose check is held
# before it reads the cycle again, must be the one victim.
{
	my ($proxy, $proxy_port, $control) = start_proxy();
	sleep 1;
	my $a = zk_session($east);
	$a->query_safe('\set VERBOSITY verbose');
	$a->query_safe("SET zklock.hosts = '127.0.0.1:$proxy_port'");
	$a->query_safe("SELECT zk_try_lock('warm_up'), zk_unlock('warm_up')");
	my $b = session($west);
	# The fault must hit a create that makes A's node: one that finds the
	# waits' container reaped (it goes some time after its last child)
	# makes nothing.  A kazoo client's unreadable wait keeps it.
	my $keeper = start_peer('kazoo', "$root/keeper");
	peer_send($keeper, "fake-wait $waits garbage");
	ok(peer_expect($keeper, qr/^published$/m), 'lost reply: the waits\' container is kept');
	run_sql($a, "BEGIN; SELECT zk_xact_lock('lost_a')");
	run_sql($b, "BEGIN; SELECT zk_xact_lock('lost_b')");
	PostgreSQL::Test::Utils::append_to_file("$control/drop-wait-create-reply", '');
	send_query($a, "SELECT 'a granted' FROM zk_xact_lock('lost_b');");
	ok(wait_until('the reply to be dropped',
			sub { proxy_fired($control, 'drop-wait-create-reply') == 1 }),
		'lost reply: A\'s first publish loses its reply');
	# B publishes well before A tries again, a deadlock_timeout after the
	# failed attempt; its check is held before it reads the cycle again.
	run_sql($b, "SET zklock.deadlock_timeout = '300ms'");
	run_sql($b, 'SELECT zk_test_delay_deadlock_confirmation(3000)');
	send_query($b, "SELECT 'b granted' FROM zk_xact_lock('lost_a');");
	my @victims = victims(20, $a, $b);
	is(scalar @victims, 1, 'lost reply: exactly one victim');
	is($victims[0], $b, 'lost reply: the younger publisher, B');
	run_sql($_, 'ROLLBACK') for ($a, $b);
	peer_quit($keeper);
	$proxy->kill_kill;
	$_->quit for ($a, $b);
}

# --- a published wait for another session's node ---------------------------
#
# X holds f3, W waits for f3; a kazoo client holds f2 and X waits for it.
# The client publishes a wait naming W's node: were it believed, the
# client would wait for X, closing a cycle, and X would be a victim.
{
	my $x = session($east);
	my $w = session($west);
	run_sql($x, "BEGIN; SELECT zk_xact_lock('f3')");
	send_query($w, "SELECT 'w granted' FROM zk_xact_lock('f3');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'forged: W waits for X');
	my $w_node = (zk_contenders("$root/f3"))[1];
	my $peer = start_peer('kazoo', "$root/f2");
	peer_send($peer, 'acquire');
	ok(peer_expect($peer, qr/^acquired$/m), 'forged: a kazoo client holds f2');
	my $identity = '{"host":"forger","port":1,"pid":1,"database":"d","user":"u","application_name":"a"}';
	peer_send($peer, "fake-wait $waits $root/f3" . '\n' . $w_node . '\n' . $identity);
	ok(peer_expect($peer, qr/^published$/m), 'forged: and publishes a wait for W\'s node');
	send_query($x, "SELECT 'x granted' FROM zk_xact_lock('f2');");
	ok(wait_for_zk_wait($east, $x->{zk_pid}), 'forged: X waits for the client');
	is(scalar victims(5, $x), 0, 'forged: X is no victim of a wait for a node not its publisher\'s');
	peer_quit($peer);
	ok(await_output($x, qr/x granted/), 'forged: X is granted once the client goes');
	run_sql($x, 'COMMIT');
	ok(await_output($w, qr/w granted/), 'forged: and W after it');
	run_sql($w, 'COMMIT');
	$_->quit for ($x, $w);
}

# --- a cycle through a zklock and a row lock --------------------------------
#
# Neither detector sees it: PostgreSQL's knows no zklock, zklock's no row
# lock.  lock_timeout ends it, on either side.
{
	my $r = zk_session($east);
	my $z = zk_session($east);
	run_sql($r, "BEGIN; UPDATE rows SET id = 1 WHERE id = 1");
	run_sql($z, "BEGIN; SELECT zk_xact_lock('row_cycle')");
	send_query($z, "UPDATE rows SET id = 1 WHERE id = 1;\nSELECT 'z updated';");
	run_sql($r, "SET lock_timeout = '2s'");
	my ($out, $err) = run_sql($r, "SELECT zk_xact_lock('row_cycle')");
	like($err, qr/ERROR:  canceling statement due to lock timeout/,
		'row lock cycle: lock_timeout ends the zklock wait');
	run_sql($r, 'ROLLBACK');
	ok(await_output($z, qr/z updated/), 'row lock cycle: and the other goes on');
	run_sql($z, 'ROLLBACK');
	$_->quit for ($r, $z);
}

# --- detection off --------------------------------------------------------
{
	my $a = session($east);
	my $b = session($west);
	run_sql($_, 'SET zklock.deadlock_timeout = 0') for ($a, $b);
	run_sql($a, "BEGIN; SELECT zk_xact_lock('off_a')");
	run_sql($b, "BEGIN; SELECT zk_xact_lock('off_b')");
	send_query($a, "SELECT 'a granted' FROM zk_xact_lock('off_b');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), 'detection off: one waits');
	send_query($b, "SELECT 'b granted' FROM zk_xact_lock('off_a');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'and the other');
	is(scalar victims(3, $a, $b), 0, 'with zklock.deadlock_timeout = 0 nobody is a victim');
	is_deeply([ grep { $_ eq $a->{wait_node} || $_ eq $b->{wait_node} } published_waits($root) ],
		[], 'and neither wait is published');
	$east->safe_psql('postgres', "SELECT pg_cancel_backend($a->{zk_pid})");
	ok(pump_sessions(10, sub { $b->{stdout} =~ /b granted/ }, $a, $b),
		'a cancel ends it');
	run_sql($_, 'ROLLBACK') for ($a, $b);
	is_deeply([ zk_lock_nodes($root) ], [], 'no lock node left, with the sessions open');
	$_->quit for ($a, $b);
}

done_testing();
