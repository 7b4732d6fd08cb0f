# Mutual exclusion under faults, proved from the whole history.
#
# Clients on two clusters take one lock, exclusive and shared, at session
# and transaction level, and one semaphore of 2 slots, beside a kazoo Lock
# on the same lock, and two more clients on a second lock; two of the
# exclusive clients keep their nodes after each release
# (zklock.keep_released), taking them again or giving them up to the
# others, and on a third lock a keeper takes its node back while a
# visitor comes now and then; each records
# every hold (test/tools/history_check.pl says how), and the writes under
# them are judged by their commit timestamps, while the leader is killed
# and restarted, a follower and the leader are paused past syncLimit x
# tickTime, a holder's backend is frozen past the session timeout with a
# write in flight while its job goes on, one client's connection is cut
# through the proxy, and a holder's session is expired.  A fault counts
# only by its effect: a new leader, a follower dropped by the leader, or
# the client it aimed at reporting the loss of its session; every kind must
# have hit.  The checker then requires that no two vouched holds overlap
# beyond the mode, kazoo's among them, that fencing tokens grow in grant
# order (a kept node taken again brings its token back), that no hold frozen past the session timeout was vouched for, and
# that every client made progress once the faults stopped; and, with every
# session still open, no node is left.  Some handoffs must have been
# granted by the predecessor's deletion alone (zk_recipe.c), so that rule
# is among what the history proves.
#
# First the checker is shown to fail, on histories written by hand, for
# each rule it has.
#
# ZKLOCK_HISTORY_SECONDS sets the length of the run (default 70): the
# faults repeat, in turn, while one can start before the last 12 seconds,
# and the clients stop 12 quiet seconds after the last one ended, so a run
# can overrun by one fault.  One round of every kind always runs, about
# 45 s; in it a kind that missed is tried again, up to 3 times in all,
# while a try can start.
# ZKLOCK_HISTORY_BROKEN_SECONDS, when set (scripts/test-all sets 20 on one
# major), adds a run of about that length with zklock.fail_closed off,
# which lets session-level holds commit after a loss, and only frozen
# holders: the checker must find their writes committed after the freeze
# or overlapping another holder's.
use strict;
use warnings;

use DBI;
use DBD::Pg qw(:async);
use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);
use ZkTest;

my $seconds = $ENV{ZKLOCK_HISTORY_SECONDS} // 70;
my $broken_seconds = $ENV{ZKLOCK_HISTORY_BROKEN_SECONDS} // 0;
my $quiet_seconds = 12;
my $session_timeout = 6;
my $root = '/zklock_t016';
my $lock = 'h';
my $pair_lock = 'hp';
my $keep_lock = 'hk';
my $semaphore = 'hs';
my $slots = 2;
my $checker = "$ENV{ZKLOCK_SRC}/test/tools/history_check.pl";

# The history's clock: the wall clock, which PostgreSQL's commit
# timestamps are on.
sub now { return time(); }

# Run the checker on the histories in $dir; returns its exit status and
# what it printed.
sub check_history
{
	my ($dir, @opts) = @_;
	my ($stdout, $stderr);
	IPC::Run::run([ 'perl', $checker, @opts, glob("$dir/*.history") ],
		'>', \$stdout, '2>', \$stderr);
	return ($? >> 8, $stdout . $stderr);
}

# --- the checker, on histories written by hand ------------------------------
# Each rule must be able to fail: a small history breaks it, and the
# checker must say so.

# A hold record as the clients write it, with defaults for what a case
# leaves out.
sub hold_line
{
	my %h = (pid => 1, mode => 'exclusive', slots => 0, token => 1, res => $lock,
		rel => 0, reldone => 0, relok => 0, @_);
	$h{id} //= "$h{client}:$h{acq}";
	return 'hold ' . join(' ', map { "$_=$h{$_}" } sort keys %h) . "\n";
}

# A clean history: handoffs between zklock and kazoo, a write whose COMMIT
# was answered after the next holder's acquire returned (the lock was let
# go after the commit: a checker judging writes by their replies would
# fail here), shared holders and semaphore slots together, a holder frozen
# whose later write was refused.
my $clean = hold_line(client => 'a', acq => 10, token => 1, rel => 10.5, relok => 1)
  . "commit hold=a:10 at=10.2\n"
  . hold_line(client => 'kazoo', pid => 'kazoo', acq => 11, token => 2, rel => 11.5, relok => 1)
  . hold_line(client => 'b', mode => 'shared', acq => 12, token => 3, rel => 13, relok => 1)
  . hold_line(client => 'c', mode => 'shared', acq => 12.5, token => 4, rel => 13.5, relok => 1)
  . hold_line(client => 'd', acq => 14, token => 5, rel => 14.1, reldone => 14.3, relok => 1)
  . "commit hold=d:14 at=14.12\n"
  . hold_line(client => 'e', acq => 14.2, token => 6, rel => 14.5, relok => 1)
  . hold_line(client => 's1', mode => 'slot', slots => 2, res => 'hs', acq => 10, rel => 12, relok => 1)
  . hold_line(client => 's2', mode => 'slot', slots => 2, res => 'hs', acq => 11, rel => 13, relok => 1)
  . hold_line(client => 'f', pid => 7, acq => 20, token => 7)
  . "commit hold=f:20 at=20.1\n"
  . "freeze pid=7 from=20.2 to=28.3\n"
  . hold_line(client => 'g', acq => 27, token => 8, rel => 27.5, relok => 1)
  # A freeze no longer than the session timeout costs no hold.
  . hold_line(client => 'h', pid => 8, acq => 30, token => 9, rel => 36, relok => 1)
  . "freeze pid=8 from=30.5 to=36.4\n"
  # A node kept after its release and taken again: the same token twice.
  . hold_line(client => 'k', pid => 9, acq => 40, token => 10, rel => 40.5, relok => 1)
  . hold_line(client => 'k', pid => 9, acq => 41, token => 10, rel => 41.5, relok => 1);
my @self_tests = (
	[ 'a clean history', $clean, undef ],
	[ 'a kazoo hold overlapping an exclusive zklock hold',
		hold_line(client => 'a', acq => 10, token => 1, rel => 11, relok => 1)
		  . hold_line(client => 'kazoo', pid => 'kazoo', acq => 10.5, token => 2, rel => 10.8, relok => 1),
		qr/two holders: a .* and kazoo/ ],
	[ 'a shared hold overlapping an exclusive one',
		hold_line(client => 'a', acq => 10, token => 1, rel => 11, relok => 1)
		  . hold_line(client => 'b', mode => 'shared', acq => 10.5, token => 2, rel => 10.8, relok => 1),
		qr/two holders: a .* and b/ ],
	[ 'a hold whose later commit only overlaps the next',
		hold_line(client => 'a', acq => 10, token => 1)
		  . "commit hold=a:10 at=10.2\ncommit hold=a:10 at=12.5\n"
		  . hold_line(client => 'b', acq => 12, token => 2, rel => 13, relok => 1),
		qr/two holders: a .* and b/ ],
	[ 'a write sent before a grant elsewhere and committed after it',
		hold_line(client => 'a', acq => 10, token => 1)
		  . "commit hold=a:10 at=12.5\n"
		  . hold_line(client => 'b', acq => 12, token => 2, rel => 13, relok => 1),
		qr/two holders: a .* and b/ ],
	[ 'more semaphore holders than slots',
		join('', map { hold_line(client => "s$_", mode => 'slot', slots => 2, res => 'hs',
					acq => 10 + $_ / 10, rel => 12, relok => 1) } 1 .. 3),
		qr/3 holders of 2 slots/ ],
	[ 'a token not larger than one held before',
		hold_line(client => 'a', acq => 10, token => 5, rel => 10.5, relok => 1)
		  . hold_line(client => 'b', acq => 11, token => 4, rel => 11.5, relok => 1),
		qr/token 4 of b .* is not larger than 5/ ],
	[ 'another backend\'s hold with the same token',
		hold_line(client => 'a', pid => 1, acq => 10, token => 5, rel => 10.5, relok => 1)
		  . hold_line(client => 'b', pid => 2, acq => 11, token => 5, rel => 11.5, relok => 1),
		qr/token 5 of b .* is not larger than 5/ ],
	[ 'a write committed after a freeze past the session timeout',
		hold_line(client => 'f', pid => 7, acq => 20, token => 7)
		  . "commit hold=f:20 at=28.4\nfreeze pid=7 from=20.2 to=28.3\n",
		qr/vouched for after a freeze of pid 7/ ],
	[ 'a release sent after a freeze past the session timeout',
		hold_line(client => 'f', pid => 7, acq => 20, token => 7, rel => 28.5, relok => 1)
		  . "freeze pid=7 from=20.2 to=28.3\n",
		qr/vouched for after a freeze of pid 7/ ],
	[ 'a write under a hold no client recorded',
		"commit hold=x:1 at=10\n", qr/hold x:1, which no client recorded/ ],
	[ 'a client without progress after the faults', $clean,
		qr/a: no vouched hold after the faults stopped/, '--quiet-from', 25 ]);
my $self_dir = PostgreSQL::Test::Utils::tempdir();
for my $t (@self_tests)
{
	my ($what, $history, $violation, @opts) = @$t;
	PostgreSQL::Test::Utils::append_to_file("$self_dir/self.history", $history);
	my ($status, $out) = check_history($self_dir, '--session-timeout', $session_timeout, @opts);
	unlink "$self_dir/self.history";
	if ($violation)
	{
		ok($status == 1 && $out =~ $violation, "the checker fails on $what") or diag($out);
	}
	else
	{
		ok($status == 0 && $out =~ /, 0 violations/, "the checker passes $what") or diag($out);
	}
}
# A record cut short (a hold whose commit timestamp was never read) is no
# history to judge.
PostgreSQL::Test::Utils::append_to_file("$self_dir/self.history", "commit hold=a:10 at=\n");
my ($bad_status, $bad_out) = check_history($self_dir);
unlink "$self_dir/self.history";
ok($bad_status == 2 && $bad_out =~ /^bad record \(field at\)/, 'the checker rejects a record with a field missing')
  or diag($bad_out);

# --- the clusters ------------------------------------------------------------
my %conf = (
	'zklock.session_timeout' => "'${session_timeout}s'",
	'zklock.connect_timeout' => "'3s'",
	'track_commit_timestamp' => 'on');
my $east = zk_cluster('east', $root, %conf);
my $west = zk_cluster('west', $root, %conf);
for my $node ($east, $west)
{
	$node->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_session_credentials() RETURNS text
		AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
		CREATE TABLE work (client text, token bigint, hold text)});
}

# One client's connection goes through the proxy, to server 1.
my ($proxy, $proxy_port, $control) = start_proxy();

my $driver = $$;

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
	'west-pair-xact' => [ $west, 'pair', 'xact' ],
	# Two that keep their nodes after each release (zklock.keep_released),
	# so that nodes kept, taken again and given up to the others are in
	# the history too.
	'east-x-session-kept' => [ $east, 'exclusive', 'session', undef, 1 ],
	'west-x-xact-kept' => [ $west, 'exclusive', 'xact', undef, 1 ],
	# A keeper on a lock of its own, mostly taking its node back, and a
	# visitor that comes now and then and makes it give the node up.
	'east-keeper-session' => [ $east, 'keep', 'session', undef, 1 ],
	'west-keep-visitor-xact' => [ $west, 'keep', 'xact', undef, 0, 0.5 ]);

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
	keep => {
		session => "SELECT zk_lock('$keep_lock', '3s')",
		xact => "SELECT zk_xact_lock('$keep_lock', '3s')",
		token => "SELECT zk_lock_token('$keep_lock')",
		release => "SELECT zk_unlock('$keep_lock')" },
	slot => {
		session => "SELECT zk_semaphore_acquire('$semaphore', $slots, '3s')",
		xact => "SELECT zk_xact_semaphore_acquire('$semaphore', $slots, '3s')",
		token => "SELECT zk_semaphore_token('$semaphore')",
		release => "SELECT zk_semaphore_release('$semaphore')" });

# The run in progress: its directory (its clients stop when the file
# "stop" appears there), and whether their sessions fail closed.
my ($dir, $fail_closed);

# Note in $client's events what happened, for the faults to see their
# effect.
sub event
{
	my ($client, $what) = @_;
	open my $e, '>>', "$dir/$client.events" or die;
	printf $e "%.6f %s\n", now(), $what =~ s/\s+/ /gr;
	close $e;
	return;
}

# Did the driver ask $client for this fault?  Taken, the request is gone.
sub requested
{
	my ($client, $fault) = @_;
	return unlink "$dir/$client.$fault";
}

# One hold, recorded in %$h from the grant on (acq is set then), so that
# the caller writes the record even if a statement fails midway (a loss
# cancels the running statement): writes of the hold may have committed.
# Each write carries the hold's id, so that its commit timestamp can be
# read from the table afterwards.  The faults aimed at a holder are caused
# here when the driver asks for them, while the client holds, before its
# next write or COMMIT: so each hits a hold.
sub one_hold
{
	my ($dbh, $h, $client, $mode, $scope, $pid, $id) = @_;
	my $s = $sql{$mode};
	my $res = $mode eq 'slot' ? $semaphore : $mode eq 'pair' ? $pair_lock
	  : $mode eq 'keep' ? $keep_lock : $lock;
	$dbh->begin_work if $scope eq 'xact';
	my ($got) = $dbh->selectrow_array($s->{$scope});
	if (!$got)
	{
		$dbh->rollback if $scope eq 'xact';
		return;
	}
	%$h = (client => $client, pid => $pid, id => $id, res => $res,
		mode => $mode eq 'pair' || $mode eq 'keep' ? 'exclusive' : $mode,
		slots => $mode eq 'slot' ? $slots : 0, acq => now(), token => 0,
		rel => 0, reldone => 0, relok => 0);
	($h->{token}) = $dbh->selectrow_array($s->{token});
	$h->{token} //= 0;
	my @write = ('INSERT INTO work VALUES (?, ?, ?)', undef, $client, $h->{token}, $id);
	if ($scope eq 'session')
	{
		# The job goes on writing while it holds, each write committed.
		for (1 .. 3)
		{
			# Stop the backend with a write in flight, which it must
			# not commit once it wakes; then write on, which it must
			# refuse.  The write sleeps first, so that the stop lands
			# well before its commit starts: a stop between zklock's
			# commit check and the commit timestamp is outside what
			# zklock promises (history_check.pl).
			if (requested($client, 'freeze'))
			{
				$dbh->do('INSERT INTO work SELECT ?::text, ?::bigint, ?::text FROM pg_sleep(0.5)',
					{ pg_async => PG_ASYNC }, @write[ 2 .. 4 ]);
				sleep 0.1;
				my $from = now();
				kill 'STOP', $pid;
				event($client, sprintf('frozen %s %.6f', $pid, $from));
				eval { $dbh->pg_result; 1 } or event($client, "error $@");
			}
			# Hand the driver this session, the one that holds, and
			# write on once it has expired it.
			if (requested($client, 'expire'))
			{
				# (A go-ahead left by an expiry that missed is stale.)
				unlink "$dir/$client.expired";
				my ($creds) = $dbh->selectrow_array('SELECT zk_test_session_credentials()');
				event($client, "session $creds");
				my $deadline = now() + 60;
				sleep 0.1 until requested($client, 'expired') || now() > $deadline;
			}
			eval { $dbh->do(@write); 1 } or event($client, "error $@");
			sleep rand 0.04;
		}
		$h->{rel} = now();
		my ($released) = eval { $dbh->selectrow_array($s->{release}) };
		event($client, "error $@") if $@;
		# A lost hold's release returns false, with only a WARNING.
		event($client, 'lost: release refused') if !$@ && !$released;
		($h->{reldone}, $h->{relok}) = (now(), $released ? 1 : 0);
	}
	else
	{
		$dbh->do(@write);
		sleep rand 0.05;
		# Cut the connection, until the driver restores it, and commit
		# then.
		if (requested($client, 'cut'))
		{
			PostgreSQL::Test::Utils::append_to_file("$control/blackhole", '');
			event($client, 'cut');
			my $deadline = now() + 60;
			sleep 0.1 while -e "$control/blackhole" && now() < $deadline;
		}
		$h->{rel} = now();
		$h->{relok} = eval { $dbh->commit; 1 } ? 1 : 0;
		$h->{reldone} = now();
		if (!$h->{relok})
		{
			event($client, "error $@");
			eval { $dbh->rollback };
		}
	}
	return;
}

sub sql_worker
{
	my ($client, $node, $mode, $scope, $hosts, $keep, $pause) = @_;
	my $dsn = 'dbi:Pg:host=' . $node->host . ';port=' . $node->port . ';dbname=postgres';
	open my $out, '>>', "$dir/$client.history" or die;
	$out->autoflush(1);
	print $out "client client=$client\n";
	my ($dbh, $pid);
	my $n = 0;
	while (!-e "$dir/stop")
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
				$d->do("SET zklock.fail_closed = $fail_closed");
				$d->do("SET zklock.keep_released = '5s'") if $keep;
				$d;
			};
			if (!$dbh)
			{
				sleep 0.2;
				next;
			}
			($pid) = $dbh->selectrow_array('SELECT pg_backend_pid()');
		}
		my %h;
		my $ok = eval { one_hold($dbh, \%h, $client, $mode, $scope, $pid, "$client:" . ++$n); 1 };
		print $out 'hold ', join(' ',
			map { sprintf(/^(acq|rel|reldone)$/ ? '%s=%.6f' : '%s=%s', $_, $h{$_}) } sort keys %h),
		  "\n"
		  if defined $h{acq};
		if (!$ok)
		{
			event($client, "error $@");
			eval { $dbh->rollback } if $dbh && !$dbh->{AutoCommit};
			$dbh = undef if !$dbh->ping;
			sleep 0.1;
		}
		sleep($pause // rand 0.03);
	}
	# A kept node outlives the last release: give it up, so that none is
	# left at the end.
	eval { $dbh->do('SELECT zk_unlock_all()') } if $dbh && $keep;
	open my $done, '>', "$dir/$client.done" or die;
	close $done;
	sleep 0.1 until -e "$dir/quit" || getppid() != $driver;
	$dbh->disconnect if $dbh;
	POSIX::_exit(0);
}

# --- the faults --------------------------------------------------------------
# The current leader's number, or '' if there is none (an election).
sub leader
{
	my $l = eval { zk_ensemble('leader') } // '';
	chomp $l;
	return $l =~ /^\d+$/ ? $l : '';
}

# Poll $done until it is true or $seconds have passed; returns whether it
# became true.
sub poll
{
	my ($seconds, $done) = @_;
	my $deadline = now() + $seconds;
	until ($done->())
	{
		return 0 if now() > $deadline;
		sleep 0.25;
	}
	return 1;
}

# Server $n's answer to a four-letter word.
sub four_letter
{
	my ($n, $word) = @_;
	my $port = (split /:/, (split /,/, $ZkTest::hosts)[ $n - 1 ])[1];
	my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
		Timeout => 5)
	  or return '';
	print $sock $word;
	my $answer = do { local $/; <$sock> };
	close $sock;
	return $answer // '';
}

# The events of $client at or after $since matching $re, waiting up to
# $timeout seconds for one.
sub events_since
{
	my ($client, $since, $re, $timeout) = @_;
	my $deadline = now() + $timeout;
	while (1)
	{
		my $file = "$dir/$client.events";
		my @found = grep { /^(\S+) / && $1 >= $since && /$re/ }
		  split /\n/, (-e $file ? slurp_file($file) : '');
		return @found if @found || now() > $deadline;
		sleep 0.1;
	}
}

# Did $client report, at or after $since, that zklock lost its session?
# Its next statement after the fault reports it, within a second.
my $loss_re = qr/^\S+ (?:error .*zklock (?:lost|ended) its ZooKeeper session|lost: release refused$)/;
sub reported_loss
{
	my ($client, $since) = @_;
	return scalar events_since($client, $since, $loss_re, 3);
}

# Ask $client for a fault (see one_hold); returns the event by which it
# says it caused it, or nothing if it did not hold within 10 s.
sub ask
{
	my ($client, $fault, $re) = @_;
	my $request = "$dir/$client.$fault";
	my $t = now();
	PostgreSQL::Test::Utils::append_to_file($request, '');
	my ($done) = events_since($client, $t, $re, 10);
	# Taken by the client at the last moment, if it is gone.
	($done) = events_since($client, $t, $re, 5) if !$done && !unlink $request;
	return $done;
}

# Frozen backends and the cut, undone however the test ends.
my %frozen;
END
{
	return if $$ != $driver;
	kill 'CONT', keys %frozen if %frozen;
	unlink "$control/blackhole" if $control;
}

my $faults;
# The clients the freeze and the expiry aim at, in turn: one round's aim at
# different clients.
my @targets = ('east-x-session', 'west-x-session');
my ($freezes, $expiries) = (0, 1);

# Each kind: its name and a sub that causes it and says whether it hit.
my %kind = (
	# A new leader is elected.
	'leader killed and restarted' => sub {
		my $l = leader() or return 0;
		zk_ensemble('kill', $l);
		my $hit = poll(12, sub { my $new = leader(); $new ne '' && $new ne $l });
		zk_ensemble('start-server', $l);
		zk_ensemble('wait-quorum');
		return $hit;
	},
	# The leader drops the follower (after syncLimit x tickTime, 5 s): it
	# has one synced follower left.
	'a follower paused' => sub {
		my $l = leader() or return 0;
		my ($f) = grep { $_ ne $l } (1, 2, 3);
		zk_ensemble('pause', $f);
		my $hit = poll(12, sub {
			my ($synced) = four_letter($l, 'mntr') =~ /^zk_synced_followers\s+(\d+)/m;
			defined $synced && $synced < 2 });
		zk_ensemble('resume', $f);
		zk_ensemble('wait-quorum');
		return $hit;
	},
	# Another server is elected while the leader is paused.
	'the leader paused' => sub {
		my $l = leader() or return 0;
		zk_ensemble('pause', $l);
		my $hit = poll(12, sub { my $new = leader(); $new ne '' && $new ne $l });
		zk_ensemble('resume', $l);
		zk_ensemble('wait-quorum');
		return $hit;
	},
	# A holder's backend is stopped just after its client sent a write,
	# which, or the write after it, must then be refused for the loss of
	# the session.
	'a holder frozen past the session timeout' => sub {
		my $client = $targets[ $freezes++ % @targets ];
		my $frozen = ask($client, 'freeze', qr/^\S+ frozen \d+ \S+$/) or return 0;
		my (undef, undef, $pid, $from) = split ' ', $frozen;
		$frozen{$pid} = 1;
		my $left = $from + $session_timeout + 2 - now();
		sleep $left if $left > 0;
		kill 'CONT', $pid;
		delete $frozen{$pid};
		printf $faults "freeze pid=%s from=%.6f to=%.6f\n", $pid, $from, now();
		return reported_loss($client, $from);
	},
	# The connection of the client behind the proxy is cut while it holds;
	# its COMMIT must then be refused.
	'a connection cut' => sub {
		my $client = 'west-x-xact-proxied';
		my $cut = ask($client, 'cut', qr/^\S+ cut$/);
		# A cut asked for too late may have been caused all the same.
		unlink "$control/blackhole" if !$cut;
		return 0 if !$cut;
		my ($from) = split ' ', $cut;
		my $left = $from + $session_timeout + 1 - now();
		sleep $left if $left > 0;
		unlink "$control/blackhole";
		return reported_loss($client, $from);
	},
	# A holder's session, the one it holds with, is expired; its next write
	# or release must then be refused.
	'a holder\'s session expired' => sub {
		my $client = $targets[ $expiries++ % @targets ];
		my $session = ask($client, 'expire', qr/^\S+ session [0-9a-f]+:[0-9a-f]+$/);
		# A client that took the request too late is let go on.
		PostgreSQL::Test::Utils::append_to_file("$dir/$client.expired", '') if !$session;
		return 0 if !$session;
		my ($from, undef, $creds) = split ' ', $session;
		my $expired = eval { ZkTest::zkinspect('expire', $creds); 1 };
		PostgreSQL::Test::Utils::append_to_file("$dir/$client.expired", '');
		return $expired && reported_loss($client, $from);
	});

# --- one run -----------------------------------------------------------------
# Run the clients, with zklock.fail_closed $run_fail_closed, and the faults
# of @kinds in turn while one can start before the last $quiet_seconds of
# $run_seconds, each kind of the first round tried up to $tries times
# until it hits; the clients stop $quiet_seconds after the last fault.
# $label prefixes the names of its tests.  Returns the run's directory,
# when the faults stopped, and how often each kind was tried and hit.
sub run_history
{
	my ($label, $run_seconds, $run_fail_closed, $tries, @kinds) = @_;
	($dir, $fail_closed) = (PostgreSQL::Test::Utils::tempdir(), $run_fail_closed);
	$_->safe_psql('postgres', 'TRUNCATE work') for ($east, $west);
	my $start = now();
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
			$ZkTest::hosts, $root, $lock, "$dir/stop", "$dir/kazoo.history", 'kazoo' ],
		'<', \$kazoo_in, '>', \$kazoo_out, '2>', "$dir/kazoo.stderr",
		IPC::Run::timeout($run_seconds + 180));

	open $faults, '>>', "$dir/faults.history" or die;
	$faults->autoflush(1);
	# One round of every kind always runs; another fault, or another try
	# of a kind that missed in it, starts only before the quiet seconds.
	my $last_start = $start + $run_seconds - $quiet_seconds;
	my (%tried, %hit);
	for (my $i = 0; $i < @kinds || now() < $last_start; $i++)
	{
		my $what = $kinds[ $i % @kinds ];
		for my $try (1 .. ($i < @kinds ? $tries : 1))
		{
			my $t = now();
			my $hit = $kind{$what}->();
			$tried{$what}++;
			$hit{$what}++ if $hit;
			note(sprintf('%6.1f s: %s: %s', $t - $start, $what, $hit ? 'hit' : 'missed'));
			sleep 1;
			last if $hit || now() >= $last_start;
		}
	}
	my $quiet_from = now();
	close $faults;
	sleep $quiet_seconds;
	PostgreSQL::Test::Utils::append_to_file("$dir/stop", '');

	# The end: every client idle, its session open.
	ok(wait_until('every SQL client to finish',
			sub { scalar(grep { -e "$dir/$_.done" } keys %clients) == keys %clients }, 60),
		"${label}every SQL client finished");
	$kazoo->pump until $kazoo_out =~ /done/;
	is_deeply([ zk_lock_nodes($root) ], [], "${label}no node left, with every session still open");
	# Each write's commit, as the server has it.
	open my $commits, '>', "$dir/commits.history" or die;
	for my $node ($east, $west)
	{
		print $commits map { "commit hold=$_\n" } split /\n/, $node->safe_psql('postgres',
			q{SELECT hold || ' at=' || extract(epoch FROM pg_xact_commit_timestamp(xmin))
			  FROM work WHERE pg_xact_commit_timestamp(xmin) IS NOT NULL});
	}
	close $commits;
	PostgreSQL::Test::Utils::append_to_file("$dir/quit", '');
	$kazoo_in = '';
	$kazoo->finish;
	waitpid($_, 0) for @pids;
	diag(sprintf('%sthe run took %.0f s, its faults %.0f s', $label, now() - $start,
		$quiet_from - $start));
	return ($dir, $quiet_from, \%tried, \%hit);
}

my @all_kinds = ('leader killed and restarted', 'a follower paused', 'the leader paused',
	'a holder frozen past the session timeout', 'a connection cut',
	'a holder\'s session expired');
my ($run_dir, $quiet_from, $tried, $hit) = run_history('', $seconds, 'on', 3, @all_kinds);
my $faults_seen = join(', ', map { "$_: hit " . ($hit->{$_} // 0) . " of $tried->{$_}" } @all_kinds);
diag("faults: $faults_seen");
ok(scalar(grep { $hit->{$_} } @all_kinds) == @all_kinds, "every kind of fault hit: $faults_seen");
my ($status, $out) = check_history($run_dir, '--session-timeout', $session_timeout,
	'--quiet-from', $quiet_from);
diag($out);
is($status, 0, 'the checker finds no violation in the history');
my ($holds) = $out =~ /history: (\d+) vouched holds/;
cmp_ok($holds // 0, '>', 50, 'over a history of some length');
like($out, qr/^resource \Q$lock\E: .* by .*\beast-x-session\b.*\bkazoo\b/m,
	'kazoo\'s holds compared with zklock\'s');
my $by_deletion = () = (slurp_file($east->logfile) . slurp_file($west->logfile))
  =~ /granted by the deletion of the one it watched/g;
diag("handoffs granted by a deletion alone: $by_deletion");
cmp_ok($by_deletion, '>', 0, 'with handoffs granted by a deletion alone among them');
my ($taken_again) = $out =~ /kept node taken again: (\d+)/;
diag("exclusive holds on a kept node taken again: " . ($taken_again // 0));
cmp_ok($taken_again // 0, '>', 0, 'with kept nodes taken again among them');

if ($broken_seconds)
{
	# Only the freeze: its write in flight commits after the wake, and
	# the writes after it while another client holds.  (A loss there is
	# only a WARNING, and a cut or an expiry may find a transaction-level
	# holder, which fails closed all the same.)
	($run_dir) = run_history('fail_closed off: ', $broken_seconds, 'off', 1,
		'a holder frozen past the session timeout');
	($status, $out) = check_history($run_dir, '--session-timeout', $session_timeout);
	my @hits = grep { /^violation: .*(?:two holders|vouched for after a freeze)/ } split /\n/, $out;
	# The counts, and the first few violations.
	diag(join("\n", 'with zklock.fail_closed off:', (split /\n/, $out)[0],
		grep { defined } @hits[ 0 .. 4 ]));
	ok($status == 1 && @hits,
		'with zklock.fail_closed off, the checker finds holds that overlapped or outlived a freeze');
}
$proxy->kill_kill;

done_testing();
