# Counting semaphores across two clusters: never more than N holders,
# granted in FIFO order, every way out of a wait leaving no node, slots
# freed by COMMIT and by a holder's death, and a release waking only the
# waiter that gets the slot.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DBI;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time sleep);
use ZkTest;

my $root = '/zklock_t013';
my $east = zk_cluster('east', $root);
my $west = zk_cluster('west', $root);
my ($out, $err);

sub slots_of { return scalar zk_contenders("$root/%semaphores/$_[0]"); }


# --- N holders on two clusters; the next waits, FIFO ----------------------------
{
	my @h = (zk_session($east), zk_session($west), zk_session($east));
	run_sql($_, "SELECT zk_semaphore_acquire('fifo', 3)") for @h;
	is(slots_of('fifo'), 3, 'three holders of a 3-slot semaphore, on two clusters');
	my $t = zk_session($west);
	($out) = run_sql($t, "SELECT zk_try_semaphore_acquire('fifo', 3)");
	is($out, 'f', 'a fourth try gets no slot');
	$t->quit;
	my $w1 = zk_session($west);
	my $w2 = zk_session($east);
	send_query($w1, "SELECT 'w1 granted' FROM zk_semaphore_acquire('fifo', 3);");
	ok(wait_for_zk_wait($west, $w1->{zk_pid}), 'a fourth waits');
	ok(zk_wait_contenders("$root/%semaphores/fifo", 4), 'with a node');
	send_query($w2, "SELECT 'w2 granted' FROM zk_semaphore_acquire('fifo', 3);");
	ok(wait_for_zk_wait($east, $w2->{zk_pid}), 'a fifth waits behind it');
	ok(zk_wait_contenders("$root/%semaphores/fifo", 5), 'with a node');

	is($east->safe_psql('postgres',
			"SELECT string_agg(mode || ' ' || holds, ',' ORDER BY queue_position) FROM zk_semaphore_contenders('fifo')"),
		'semaphore true,semaphore true,semaphore true,semaphore false,semaphore false',
		'zk_semaphore_contenders shows three holding and two waiting');
	($out) = run_sql($h[0], "SELECT mode, scope, holds, state FROM zk_locks WHERE pid = pg_backend_pid()");
	is($out, 'semaphore|session|1|held', 'zk_locks shows a slot');
	is($east->safe_psql('postgres',
			"SELECT count(*) FROM zk_locks WHERE name = 'fifo' AND state = 'waiting' AND mode = 'semaphore'"),
		'1', 'and another backend\'s wait for one');

	($out) = run_sql($h[1], "SELECT zk_semaphore_release('fifo')");
	is($out, 't', 'a holder releases its slot');
	ok(await_output($w1, qr/w1 granted/), 'the first waiter gets it');
	ok(still_waiting($east, $w2, qr/w2 granted/), 'the second still waits');
	run_sql($h[0], "SELECT zk_semaphore_release('fifo')");
	ok(await_output($w2, qr/w2 granted/), 'and gets the next slot freed');
	($out, $err) = run_sql($h[0], "SELECT zk_semaphore_release('fifo')");
	is($out, 'f', 'releasing a slot not held returns false');
	like($err, qr/WARNING:  zklock semaphore "fifo" has no slot held at session level by this backend/,
		'with a WARNING');
	run_sql($_, "SELECT zk_semaphore_release('fifo')") for ($h[2], $w1, $w2);
	is(slots_of('fifo'), 0, 'every slot released');
	no_node_left($root, 'FIFO');
	$_->quit for (@h, $w1, $w2);
}

# --- slots stack; each release frees one ---------------------------------------
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	run_sql($a, "SELECT zk_semaphore_acquire('stack', 2), zk_semaphore_acquire('stack', 2)");
	is(slots_of('stack'), 2, 'one backend takes both slots');
	($out) = run_sql($a, "SELECT count(*), sum(holds) FROM zk_locks WHERE name = 'stack' AND pid = pg_backend_pid()");
	is($out, '2|2', 'and shows two slots');
	send_query($b, "SELECT 'b granted' FROM zk_semaphore_acquire('stack', 2);");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'another waits');
	($out) = run_sql($a, "SELECT zk_semaphore_token('stack') > 0");
	is($out, 't', 'the holder has a fencing token');
	run_sql($a, "SELECT zk_semaphore_release('stack')");
	ok(await_output($b, qr/b granted/), 'one release frees one slot');
	is(slots_of('stack'), 2, 'one left with the first backend');
	run_sql($a, 'SELECT zk_unlock_all()');
	is(slots_of('stack'), 1, 'zk_unlock_all gives back the session slots too');
	run_sql($b, "SELECT zk_semaphore_release('stack')");
	no_node_left($root, 'stack');
	$_->quit for ($a, $b);
}

# --- every way out of a wait leaves nothing ---------------------------------
{
	my $h = zk_session($east);
	my $w = zk_session($west);
	run_sql($h, "SELECT zk_semaphore_acquire('ways', 1)");
	($out) = run_sql($w, "SELECT zk_try_semaphore_acquire('ways', 1)");
	is($out, 'f', 'a try fails');
	is(slots_of('ways'), 1, 'and leaves no node');
	($out) = run_sql($w, "SELECT zk_semaphore_acquire('ways', 1, '300ms')");
	is($out, 'f', 'a timed wait runs out');
	is(slots_of('ways'), 1, 'and leaves no node');
	send_query($w, "SELECT zk_semaphore_acquire('ways', 1);");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a waiter queues');
	$west->safe_psql('postgres', "SELECT pg_cancel_backend($w->{zk_pid})");
	ok(await_output($w, qr/canceling statement due to user request/), 'and is cancelled');
	is(slots_of('ways'), 1, 'leaving no node when the call returns');
	($out, $err) = run_sql($w, "SET lock_timeout = '300ms'; SELECT zk_semaphore_acquire('ways', 1)");
	like($err, qr/canceling statement due to lock timeout/, 'lock_timeout ends a wait');
	is(slots_of('ways'), 1, 'leaving no node');
	run_sql($w, 'RESET lock_timeout');

	# Transaction slots end with the transaction.
	run_sql($w, "BEGIN; SELECT zk_xact_semaphore_acquire('xact_sem', 1)");
	($out) = run_sql($h, "SELECT zk_try_semaphore_acquire('xact_sem', 1)");
	is($out, 'f', 'a transaction slot is held');
	run_sql($w, 'COMMIT');
	($out) = run_sql($h, "SELECT zk_try_semaphore_acquire('xact_sem', 1) AND zk_semaphore_release('xact_sem')");
	is($out, 't', 'and free once COMMIT returns');
	run_sql($w, "BEGIN; SELECT zk_try_xact_semaphore_acquire('xact_sem', 1); ROLLBACK");
	($out) = run_sql($h, "SELECT zk_try_semaphore_acquire('xact_sem', 1) AND zk_semaphore_release('xact_sem')");
	is($out, 't', 'and once ROLLBACK returns');

	# A lock and a semaphore of one name are separate.
	($out) = run_sql($w, "SELECT zk_try_lock('ways')");
	is($out, 't', 'a lock of the same name as a full semaphore is free');
	run_sql($w, "SELECT zk_unlock('ways')");
	run_sql($h, "SELECT zk_semaphore_release('ways')");
	no_node_left($root, 'ways out');
	$_->quit for ($h, $w);
}

# --- callers that disagree on the size ------------------------------------------
{
	my @s = map { zk_session($_ % 2 ? $west : $east) } 0 .. 3;
	run_sql($s[0], "SELECT zk_semaphore_acquire('sizes', 3)");
	run_sql($s[1], "SELECT zk_semaphore_acquire('sizes', 3)");
	send_query($s[2], "SELECT 'one granted' FROM zk_semaphore_acquire('sizes', 1);");
	ok(wait_for_zk_wait($east, $s[2]->{zk_pid}), 'a caller asking for 1 slot waits behind 2 holders');
	send_query($s[3], "SELECT 'three granted' FROM zk_semaphore_acquire('sizes', 3);");
	ok(wait_for_zk_wait($west, $s[3]->{zk_pid}),
		'and a caller asking for 3 queued behind it waits too: the smallest size ahead counts');
	run_sql($s[0], "SELECT zk_semaphore_release('sizes')");
	ok(still_waiting($east, $s[2], qr/one granted/), 'with one holder left, the 1-slot caller still waits');
	run_sql($s[1], "SELECT zk_semaphore_release('sizes')");
	ok(await_output($s[2], qr/one granted/), 'it is granted once it would be alone');
	ok(still_waiting($west, $s[3], qr/three granted/), 'and the caller behind it waits while it holds');
	run_sql($s[2], "SELECT zk_semaphore_release('sizes')");
	ok(await_output($s[3], qr/three granted/), 'and then is granted');
	run_sql($s[3], "SELECT zk_semaphore_release('sizes')");
	no_node_left($root, 'sizes');
	$_->quit for @s;
}

# --- a release wakes only the waiter that gets the slot ------------------------
sub four_letter
{
	my ($server, $word) = @_;
	my ($host, $port) = split /:/, $server;
	my $sock = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Timeout => 5)
	  or die "cannot reach $server";
	print $sock $word;
	return do { local $/; <$sock> };
}

sub mntr_sum
{
	my ($key) = @_;
	my $sum = 0;
	for my $server (split /,/, $ZkTest::hosts)
	{
		my $text = four_letter($server, 'mntr');
		$sum += $1 if $text =~ /^\Q$key\E\s+(\d+)$/m;
	}
	return $sum;
}

# Is the node at path watched by the session with this id ("0x..."), on
# any server?
sub watched_by
{
	my ($path, $session_id) = @_;
	for my $server (split /,/, $ZkTest::hosts)
	{
		my $path_seen;
		for my $line (split /\n/, four_letter($server, 'wchp'))
		{
			if ($line =~ /^\S/) { $path_seen = $line; next; }
			return 1 if $path_seen eq $path && $line =~ /^\s+\Q$session_id\E\s*$/i;
		}
	}
	return 0;
}
{
	my @h = map { zk_session($east) } 1 .. 2;
	my @w = map { zk_session($_ % 2 ? $west : $east) } 1 .. 4;
	run_sql($_, "SELECT zk_semaphore_acquire('herd', 2)") for @h;
	# Each waiter's session id, for "wchp"; a lock call opens the session.
	my @sessions = map
	{
		run_sql($_, "SELECT zk_try_lock('herd_warm_up') AND zk_unlock('herd_warm_up')");
		(run_sql($_, 'SELECT session_id FROM zk_status()'))[0]
	} @w;
	for my $i (0 .. $#w)
	{
		send_query($w[$i], "SELECT 'granted $i' FROM zk_semaphore_acquire('herd', 2);");
		ok(zk_wait_contenders("$root/%semaphores/herd", 3 + $i), "waiter $i queues");
	}
	my $deleted = mntr_sum('zk_sum_node_deleted_watch_count');
	my $changed = mntr_sum('zk_sum_node_changed_watch_count');
	my @holders = @h;
	for my $i (0 .. $#w)
	{
		# Release only once the first waiter watches both holders, so that
		# the count below does not depend on how fast it got there.
		my @holder_nodes = map { "$root/%semaphores/herd/$_" }
		  (zk_contenders("$root/%semaphores/herd"))[ 0 .. 1 ];
		ok(wait_until("waiter $i watching the holders",
				sub { !grep { !watched_by($_, $sessions[$i]) } @holder_nodes }),
			"waiter $i, the first, watches both holders");
		run_sql(shift @holders, "SELECT zk_semaphore_release('herd')");
		ok(await_output($w[$i], qr/granted $i/), "release $i: waiter $i gets the slot");
		push @holders, $w[$i];
	}
	$deleted = mntr_sum('zk_sum_node_deleted_watch_count') - $deleted;
	$changed = mntr_sum('zk_sum_node_changed_watch_count') - $changed;
	diag("4 releases to 4 waiters: $deleted node-deleted and $changed node-changed watch notifications");
	is($deleted, 4, 'each release notified exactly one waiter: the one that got the slot');
	is($changed, 3,
		'and each waiter granted with another behind it told that one it was now first, once');
	run_sql($_, "SELECT zk_semaphore_release('herd')") for @holders;
	no_node_left($root, 'herd');
	$_->quit for (@h, @w);
}

# --- kill -9 of a holder frees its slot --------------------------------------
{
	my $crash = zk_cluster('crash', $root, 'zklock.session_timeout' => "'4s'");
	my $h = zk_session($crash);
	my $w = zk_session($west);
	run_sql($h, "SELECT zk_semaphore_acquire('crash', 1)");
	send_query($w, "SELECT 'granted after crash' FROM zk_semaphore_acquire('crash', 1);");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a waiter queues behind a holder');
	kill 'KILL', $h->{zk_pid};
	ok(await_output($w, qr/granted after crash/), 'kill -9 of the holder frees its slot');
	run_sql($w, "SELECT zk_semaphore_release('crash')");
	$w->quit;
	$crash->stop('immediate', fail_ok => 1);
}

# --- 200 acquisitions by random holders on both clusters ----------------------
sub stress_worker
{
	my ($node, $store, $slots, $done, $quit) = @_;
	my $dbh = DBI->connect('dbi:Pg:host=' . $node->host . ';port=' . $node->port
		  . ';dbname=postgres', '', '', { RaiseError => 1, PrintError => 0 });
	my $gauge = DBI->connect('dbi:Pg:host=' . $store->host . ';port=' . $store->port
		  . ';dbname=postgres', '', '', { RaiseError => 1, PrintError => 0 });
	for (1 .. 25)
	{
		$dbh->do("SELECT zk_semaphore_acquire('stress', $slots)");
		$gauge->do('UPDATE gauge SET inside = inside + 1, entries = entries + 1, '
			  . 'peak = greatest(peak, inside + 1)');
		sleep rand(0.03);
		$gauge->do('UPDATE gauge SET inside = inside - 1');
		$dbh->do("SELECT zk_semaphore_release('stress')");
	}
	# Idle, with the session open, until the leftover check is done.
	PostgreSQL::Test::Utils::append_to_file($done, '');
	sleep 0.1 until -e $quit;
	return;
}

{
	my $store = PostgreSQL::Test::Cluster->new('store');
	$store->init;
	$store->start;
	$store->safe_psql('postgres', q{
		CREATE TABLE gauge (inside int, peak int, entries int);
		INSERT INTO gauge VALUES (0, 0, 0)});
	my $slots = 3;
	my $signals = PostgreSQL::Test::Utils::tempdir();
	my @pids;
	for my $i (0 .. 7)
	{
		my $node = $i % 2 ? $west : $east;
		my $pid = fork();
		die "fork: $!" unless defined $pid;
		if ($pid == 0)
		{
			# A stuck semaphore fails the test instead of hanging it; an
			# error ends the child without running the test's END blocks.
			alarm 180;
			my $ok = eval {
				stress_worker($node, $store, $slots, "$signals/done.$i", "$signals/quit");
				1;
			};
			print STDERR "worker $i: $@" unless $ok;
			POSIX::_exit($ok ? 0 : 1);
		}
		push @pids, $pid;
	}
	ok(wait_until('every worker to be done', sub { scalar(() = glob("$signals/done.*")) == 8 }, 170),
		'every worker did its 25 acquisitions');
	no_node_left($root, '200 acquisitions');
	PostgreSQL::Test::Utils::append_to_file("$signals/quit", '');
	my $failed = 0;
	for (@pids)
	{
		waitpid($_, 0);
		$failed++ if $?;
	}
	is($failed, 0, 'every worker finished without error or hang');
	is($store->safe_psql('postgres', 'SELECT entries, inside FROM gauge'), '200|0',
		'200 acquisitions by 8 backends on two clusters');
	my $peak = $store->safe_psql('postgres', 'SELECT peak FROM gauge');
	cmp_ok($peak, '<=', $slots, "never more than $slots holders at once (peak $peak)");
	is(slots_of('stress'), 0, 'and no slot left');
	$store->stop;
}

done_testing();
