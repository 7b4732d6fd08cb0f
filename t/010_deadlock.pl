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
my $east = zk_cluster('east', $root);
my $west = zk_cluster('west', $root);
my $waits = "$root/%waits";

# A session with its ZooKeeper session open, printing SQLSTATEs with its
# errors; wait_node is the name its published waits get: the session id.
sub session
{
	my ($node) = @_;
	my $s = zk_session($node);
	$s->query_safe('\set VERBOSITY verbose');
	$s->query_safe("SELECT zk_try_lock('warm_up'), zk_unlock('warm_up')");
	my $id = $s->query_safe('SELECT session_id FROM zk_status()');
	chomp $id;
	$id =~ s/^0x//;
	$s->{wait_node} = sprintf('%016s', $id) =~ tr/ /0/r;
	return $s;
}

sub published_waits
{
	return grep { /^[0-9a-f]{16}$/ } ZkTest::zk_children($waits);
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
	my $t0 = time;
	send_query($b, "SELECT 'b granted' FROM zk_xact_lock('two_a');");
	my $victim = first_victim(15, $a, $b);
	ok($victim, '2-cycle: a backend gets "deadlock detected"');
	cmp_ok(time - $t0, '<', 1 + 4, 'within deadlock_timeout and a few seconds');
	is(scalar(grep { $_ eq $victim->{wait_node} } published_waits()), 0,
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
	is(scalar(grep { $_ eq $survivor->{wait_node} } published_waits()), 0,
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
	ok(wait_until('the wait to be published',
			sub { grep { $_ eq $published } published_waits() }, 10),
		'after deadlock_timeout its wait is published');
	ok(await_output($w, qr/timed out: true/), 'the wait just times out, no deadlock');
	is(scalar(grep { $_ eq $published } published_waits()), 0,
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
	is_deeply([ grep { $_ eq $a->{wait_node} || $_ eq $b->{wait_node} } published_waits() ],
		[], 'and neither wait is published');
	$east->safe_psql('postgres', "SELECT pg_cancel_backend($a->{zk_pid})");
	ok(pump_sessions(10, sub { $b->{stdout} =~ /b granted/ }, $a, $b),
		'a cancel ends it');
	run_sql($_, 'ROLLBACK') for ($a, $b);
	is_deeply([ zk_lock_nodes($root) ], [], 'no lock node left, with the sessions open');
	$_->quit for ($a, $b);
}

done_testing();
