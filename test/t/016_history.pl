# Mutual exclusion under faults, proved from the whole history.
#
# Clients on two clusters take one lock, exclusive and shared, at session
# and transaction level, and one semaphore of 2 slots, beside a kazoo Lock
# on the same lock, and two more clients on a second lock; each records
# every hold (test/tools/history_check.pl says how) while the leader is
# killed and restarted, a follower and the leader are paused past
# syncLimit x tickTime, a holder's backend is frozen past the session
# timeout while its job goes on, one client's connection is cut through
# the proxy, and a holder's session is expired.  The checker then requires
# that no two vouched holds overlap beyond the mode, that fencing tokens
# grow in grant order, that no hold frozen past the session timeout was
# vouched for, and that every client made progress once the faults
# stopped; and, with every session still open, no node is left.  Some
# handoffs must have been granted by the predecessor's deletion alone
# (zk_recipe.c), so that rule is among what the history proves.
#
# ZKLOCK_HISTORY_SECONDS sets the length of the run (default 70): the
# faults repeat, in turn, until the last 12 seconds, which are quiet.  One
# round of every kind, about 41 s, always runs, so the default leaves the
# quiet end more than its 12 seconds.
# ZKLOCK_HISTORY_FAIL_CLOSED=off runs it with zklock.fail_closed off, which
# lets session-level holds commit after a loss: the checker must then fail.
use strict;
use warnings;

use DBI;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use POSIX ();
use Test::More;
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC sleep);
use ZkTest;

my $seconds = $ENV{ZKLOCK_HISTORY_SECONDS} // 70;
my $quiet_seconds = 12;
my $session_timeout = 6;
my $root = '/zklock_t016';
my $lock = 'h';
my $pair_lock = 'hp';
my $semaphore = 'hs';
my $slots = 2;

sub now { return clock_gettime(CLOCK_MONOTONIC); }

my %conf = (
	'zklock.session_timeout' => "'${session_timeout}s'",
	'zklock.connect_timeout' => "'3s'",
	'zklock.fail_closed' => $ENV{ZKLOCK_HISTORY_FAIL_CLOSED} // 'on');
my $east = zk_cluster('east', $root, %conf);
my $west = zk_cluster('west', $root, %conf);
for my $node ($east, $west)
{
	$node->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_session_credentials() RETURNS text
		AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
		CREATE TABLE work (client text, token bigint)});
}

# One client's connection goes through the proxy, to server 1.
my ($proxy, $proxy_port, $control) = start_proxy();

my $dir = PostgreSQL::Test::Utils::tempdir();
my $driver = $$;
my $start = now();
my $end = $start + $seconds;

# name => [cluster, mode, scope, zklock.hosts or undef]
my %clients = (
	'east-x-session' => [ $east, 'exclusive', 'session' ],
	'east-x-xact' => [ $east, 'exclusive', 'xact' ],
	'east-s-session' => [ $east, 'shared', 'session' ],
	'east-slot-session' => [ $east, 'slot', 'session' ],
	'west-x-session' => [ $west, 'exclusive', 'session' ],
	'west-x-xact-proxied' => [ $west, 'exclusive', 'xact', "127.0.0.1:$proxy_port" ],
	'west-s-xact' => [ $west, 'shared', 'xact' ],
	'west-slot-xact' => [ $west, 'slot', 'xact' ],
	# Two exclusive clients alone on a lock of their own: each usually
	# queues behind the other's hold alone, and is granted by its deletion.
	'east-pair-session' => [ $east, 'pair', 'session' ],
	'west-pair-xact' => [ $west, 'pair', 'xact' ]);

# The SQL of each mode at each scope: acquire (with a timeout), token,
# release (session level).
my %sql = (
	exclusive => {
		session => "SELECT zk_lock('$lock', '3s')",
		xact => "SELECT zk_xact_lock('$lock', '3s')",
		token => "SELECT zk_lock_token('$lock')",
		release => "SELECT zk_unlock('$lock')" },
	shared => {
		session => "SELECT zk_lock_shared('$lock', '3s')",
		xact => "SELECT zk_xact_lock_shared('$lock', '3s')",
		token => "SELECT zk_lock_token('$lock')",
		release => "SELECT zk_unlock_shared('$lock')" },
	pair => {
		session => "SELECT zk_lock('$pair_lock', '3s')",
		xact => "SELECT zk_xact_lock('$pair_lock', '3s')",
		token => "SELECT zk_lock_token('$pair_lock')",
		release => "SELECT zk_unlock('$pair_lock')" },
	slot => {
		session => "SELECT zk_semaphore_acquire('$semaphore', $slots, '3s')",
		xact => "SELECT zk_xact_semaphore_acquire('$semaphore', $slots, '3s')",
		token => "SELECT zk_semaphore_token('$semaphore')",
		release => "SELECT zk_semaphore_release('$semaphore')" });

# One hold: returns the record, or nothing if the lock was not granted.
sub one_hold
{
	my ($dbh, $client, $mode, $scope, $pid) = @_;
	my $s = $sql{$mode};
	my $res = $mode eq 'slot' ? $semaphore : $mode eq 'pair' ? $pair_lock : $lock;
	my %h = (client => $client, pid => $pid, res => $res,
		mode => $mode eq 'pair' ? 'exclusive' : $mode,
		slots => $mode eq 'slot' ? $slots : 0, w => 0, wdone => 0, wok => 0,
		rel => 0, reldone => 0, relok => 0);
	$dbh->begin_work if $scope eq 'xact';
	my ($got) = $dbh->selectrow_array($s->{$scope});
	if (!$got)
	{
		$dbh->rollback if $scope eq 'xact';
		return;
	}
	$h{acq} = now();
	($h{token}) = $dbh->selectrow_array($s->{token});
	$h{token} //= 0;
	if ($scope eq 'session')
	{
		# The job goes on writing while it holds, each write committed.
		for (1 .. 3)
		{
			my $sent = now();
			next unless eval {
				$dbh->do('INSERT INTO work VALUES (?, ?)', undef, $client, $h{token});
				1;
			};
			($h{w}, $h{wdone}, $h{wok}) = ($sent, now(), 1);
			sleep rand 0.04;
		}
		$h{rel} = now();
		my ($released) = eval { $dbh->selectrow_array($s->{release}) };
		($h{reldone}, $h{relok}) = (now(), $released ? 1 : 0);
	}
	else
	{
		$dbh->do('INSERT INTO work VALUES (?, ?)', undef, $client, $h{token});
		sleep rand 0.05;
		$h{rel} = now();
		$h{relok} = eval { $dbh->commit; 1 } ? 1 : 0;
		$h{reldone} = now();
		eval { $dbh->rollback } unless $h{relok};
	}
	return \%h;
}

sub sql_worker
{
	my ($client, $node, $mode, $scope, $hosts) = @_;
	my $dsn = 'dbi:Pg:host=' . $node->host . ';port=' . $node->port . ';dbname=postgres';
	open my $out, '>>', "$dir/$client.history" or die;
	$out->autoflush(1);
	print $out "client client=$client\n";
	my ($dbh, $pid);
	while (now() < $end)
	{
		POSIX::_exit(1) if getppid() != $driver;
		if (!$dbh)
		{
			$dbh = eval {
				my $d = DBI->connect($dsn, '', '',
					{ AutoCommit => 1, RaiseError => 1, PrintError => 0 });
				$d->do("SET statement_timeout = '30s'");
				$d->do("SET client_min_messages = error");
				# Handoffs granted by a deletion alone are counted from
				# the server logs.
				$d->do("SET log_min_messages = debug2");
				$d->do("SET zklock.hosts = '$hosts'") if $hosts;
				$d;
			};
			if (!$dbh)
			{
				sleep 0.2;
				next;
			}
			($pid) = $dbh->selectrow_array('SELECT pg_backend_pid()');
		}
		my $h = eval { one_hold($dbh, $client, $mode, $scope, $pid) };
		if ($h)
		{
			print $out 'hold ', join(' ', map { "$_=$h->{$_}" } sort keys %$h), "\n";
			# For the expiry fault: this backend's session, as of now.
			my ($creds) = eval { $dbh->selectrow_array('SELECT zk_test_session_credentials()') };
			if ($creds)
			{
				open my $c, '>', "$dir/$client.creds.new" or die;
				print $c "$pid $creds\n";
				close $c;
				rename "$dir/$client.creds.new", "$dir/$client.creds";
			}
		}
		elsif ($@)
		{
			eval { $dbh->rollback } if $dbh && !$dbh->{AutoCommit};
			$dbh = undef if !$dbh->ping;
			sleep 0.1;
		}
		sleep rand 0.03;
	}
	open my $done, '>', "$dir/$client.done" or die;
	close $done;
	sleep 0.1 until -e "$dir/quit" || getppid() != $driver;
	$dbh->disconnect if $dbh;
	POSIX::_exit(0);
}

my @pids;
for my $client (sort keys %clients)
{
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		sql_worker($client, @{ $clients{$client} });
	}
	push @pids, $pid;
}
my $kazoo_in = '';
my $kazoo_out = '';
my $kazoo = IPC::Run::start(
	[ '/usr/bin/python3', "$ENV{ZKLOCK_SRC}/test/tools/history_kazoo.py",
		$ZkTest::hosts, "$root/$lock", $seconds, "$dir/kazoo.history", 'kazoo' ],
	'<', \$kazoo_in, '>', \$kazoo_out, '2>', "$dir/kazoo.stderr",
	IPC::Run::timeout($seconds + 120));

# --- the faults, in turn, until the quiet end ------------------------------
open my $faults, '>>', "$dir/faults.history" or die;
$faults->autoflush(1);
my %fired;

sub leader { my $l = zk_ensemble('leader'); chomp $l; return $l; }

# A backend of either cluster that holds the lock now, at session level if
# one does, or undef.
sub holder
{
	my @found;
	for my $node ($east, $west)
	{
		push @found, split /\n/, $node->safe_psql('postgres',
			"SELECT scope || ' ' || pid FROM zk_locks WHERE name = '$lock' AND state = 'held'");
	}
	my ($pick) = sort @found;    # "session" sorts before "transaction"
	return $pick ? (split ' ', $pick)[1] : undef;
}

my @kinds = (
	[ 'leader killed and restarted', sub {
		my $l = leader();
		zk_ensemble('kill', $l);
		zk_ensemble('wait-quorum');
		zk_ensemble('start-server', $l);
		return 1;
	} ],
	[ 'a follower paused', sub {
		my $l = leader();
		my ($f) = grep { $_ != $l } (1, 2, 3);
		zk_ensemble('pause', $f);
		sleep 6;
		zk_ensemble('resume', $f);
		zk_ensemble('wait-quorum');
		return 1;
	} ],
	[ 'the leader paused', sub {
		my $l = leader();
		zk_ensemble('pause', $l);
		sleep 6;
		zk_ensemble('resume', $l);
		zk_ensemble('wait-quorum');
		return 1;
	} ],
	[ 'a holder frozen past the session timeout', sub {
		my $pid;
		wait_until('a holder', sub { $pid = holder(); defined $pid }, 10) or return 0;
		my $from = now();
		kill 'STOP', $pid;
		sleep $session_timeout + 2;
		kill 'CONT', $pid;
		printf $faults "freeze pid=%s from=%.6f to=%.6f\n", $pid, $from, now();
		return 1;
	} ],
	[ 'a connection cut', sub {
		PostgreSQL::Test::Utils::append_to_file("$control/blackhole", '');
		sleep $session_timeout + 1;
		unlink "$control/blackhole";
		return 1;
	} ],
	[ 'a holder\'s session expired', sub {
		my $pid;
		wait_until('a holder', sub { $pid = holder(); defined $pid }, 10) or return 0;
		for my $file (glob "$dir/*.creds")
		{
			my ($owner, $creds) = split ' ', slurp_file($file);
			next unless $owner == $pid;
			return eval { ZkTest::zkinspect('expire', $creds); 1 };
		}
		return 0;
	} ]);

# One round of every kind always runs; after it, a fault starts only if
# even the longest (a frozen holder: up to 10 s to find one, then 8 s)
# ends before the quiet seconds.
my $longest_fault = 18;
my $quiet_from = $end - $quiet_seconds;
for (my $i = 0; $i < @kinds || now() < $quiet_from - $longest_fault; $i++)
{
	my ($what, $fault) = @{ $kinds[ $i % @kinds ] };
	my $t = now();
	$fired{$what}++ if $fault->();
	note(sprintf('%6.1f s: %s', $t - $start, $what));
	sleep 1;
}
$quiet_from = now();
ok(scalar(keys %fired) == @kinds,
	'every kind of fault fired: ' . join(', ', map { "$_ x$fired{$_}" } sort keys %fired));

# --- the end: every client idle, its session open --------------------------
ok(wait_until('every SQL client to finish',
		sub { scalar(grep { -e "$dir/$_.done" } keys %clients) == keys %clients },
		$quiet_seconds + 60),
	'every SQL client finished');
$kazoo->pump until $kazoo_out =~ /done/;
is_deeply([ zk_lock_nodes($root) ], [], 'no node left, with every session still open');
PostgreSQL::Test::Utils::append_to_file("$dir/quit", '');
$kazoo_in = '';
$kazoo->finish;
waitpid($_, 0) for @pids;
$proxy->kill_kill;

my ($stdout, $stderr);
IPC::Run::run(
	[ 'perl', "$ENV{ZKLOCK_SRC}/test/tools/history_check.pl",
		'--session-timeout', $session_timeout, '--quiet-from', $quiet_from,
		glob("$dir/*.history") ],
	'>', \$stdout, '2>', \$stderr);
my $status = $? >> 8;
diag($stdout . $stderr);
is($status, 0, 'the checker finds no violation in the history');
my ($holds) = $stdout =~ /history: (\d+) vouched holds/;
cmp_ok($holds // 0, '>', 50, 'over a history of some length');
my $by_deletion = () = (slurp_file($east->logfile) . slurp_file($west->logfile))
  =~ /granted by the deletion of the one it watched/g;
diag("handoffs granted by a deletion alone: $by_deletion");
cmp_ok($by_deletion, '>', 0, 'with handoffs granted by a deletion alone among them');

done_testing();
