# Helpers for the zklock TAP tests: clusters wired to the test ensemble,
# background sessions, and a look at ZooKeeper from outside through kazoo.
package ZkTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(zk_cluster zk_configure zk_session zk_children zk_contenders
  zk_wait_contenders zk_get wait_until wait_for_zk_wait still_waiting
  send_query run_sql await_output await_output_and_stderr zk_ensemble
  wait_for_session_lost start_peer peer_send peer_expect peer_silent peer_quit proxy_fired zk_session_last_xid
  wait_node published_waits await_published
  zk_lock_nodes no_node_left start_proxy);

# The ensemble the helpers look at; a test with an ensemble of its own may
# point them there.
our $hosts = $ENV{ZKLOCK_TEST_HOSTS}
  or die "ZKLOCK_TEST_HOSTS is not set: run the suites with scripts/test-all";
my $src = $ENV{ZKLOCK_SRC} or die "ZKLOCK_SRC is not set";

# A started cluster with zklock preloaded and created, using its own lock
# root so tests do not see each other's nodes.  %conf adds settings, or
# overrides these (shared_preload_libraries => "''" for none).
sub zk_cluster
{
	my ($name, $root, %conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	zk_configure($node, $root, %conf);
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION zklock');
	return $node;
}

# zk_cluster's settings, for a cluster a test initializes itself (one that
# streams to a standby, say).
sub zk_configure
{
	my ($node, $root, %conf) = @_;
	%conf = (shared_preload_libraries => "'zklock'", %conf);
	$node->append_conf('postgresql.conf', "zklock.hosts = '$hosts'\n"
		  . "zklock.root = '$root'\n"
		  . "log_statement = none\n"
		  . join('', map { "$_ = $conf{$_}\n" } sort keys %conf));
	return;
}

# A psql session that keeps going after an error, so a cancelled query can
# be followed by more; as $user if given.
sub zk_session
{
	my ($node, $dbname, $user) = @_;
	my $s = $node->background_psql($dbname // 'postgres', on_error_stop => 0,
		extra_params => $user ? [ '-U', $user ] : []);
	$s->set_query_timer_restart();
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	chomp $pid;
	$s->{zk_pid} = $pid;
	return $s;
}

# Send SQL without waiting for it to finish.
sub send_query
{
	my ($session, $sql) = @_;
	$session->{stdin} .= "$sql\n";
	$session->{run}->pump_nb();
	return;
}

# Run SQL to completion; returns (stdout, stderr) of just this statement.
sub run_sql
{
	my ($session, $sql) = @_;
	$session->{stderr} = '';
	my $out = $session->query($sql);
	my $err = $session->{stderr};
	$session->{stderr} = '';
	return ($out, $err);
}

# An error as psql prints it ("psql:<stdin>:3: ERROR:  ...").
my $pg_error_re = qr/(?:^|: )(?:ERROR|FATAL|PANIC):  /m;

# Wait until a session prints something matching $re on stdout or stderr,
# for a query sent with send_query.  An ERROR that $re does not match fails
# the wait, whether it comes before the match or with it: a marker printed
# after a failed statement means nothing.  psql writes its errors to
# stderr and its results to stdout, which arrive here in no fixed order;
# so once the marker is seen, a line that psql writes to stderr after
# everything before it is awaited too, and only then is the output judged.
sub await_output
{
	my ($session, $re) = @_;
	my ($ok) = await_output_and_stderr($session, $re);
	return $ok;
}

# As await_output, and what came on stderr too (notices, say).
sub await_output_and_stderr
{
	my ($session, $re) = @_;
	$session->{timeout}->start();
	$session->{run}->pump()
	  until $session->{stdout} =~ $re
	  || $session->{stderr} =~ $re
	  || $session->{stderr} =~ $pg_error_re
	  || $session->{timeout}->is_expired;
	if (!$session->{timeout}->is_expired)
	{
		$session->{stdin} .= "\\warn __zk_stderr_sync__\n";
		$session->{run}->pump()
		  until $session->{stderr} =~ /__zk_stderr_sync__/
		  || $session->{timeout}->is_expired;
	}
	my $errors = $session->{stderr} =~ s/^__zk_stderr_sync__\n//mr;
	my $ok = !$session->{timeout}->is_expired
	  && ($errors !~ $pg_error_re || $errors =~ $re);
	diag("waiting for $re, got:\n$errors") if !$ok;
	$session->{stdout} = '';
	$session->{stderr} = '';
	return ($ok, $errors);
}

# Run test/tools/zkinspect.py; any failure, a missing node included, dies.
sub zkinspect
{
	my (@args) = @_;
	local $ENV{ZKINSPECT_AUTH} = $ENV{ZKINSPECT_AUTH};
	my ($stdout, $stderr);
	# An ensemble that takes connections but never serves would hold it.
	IPC::Run::run([ '/usr/bin/python3', "$src/test/tools/zkinspect.py",
			$hosts, @args ], '>', \$stdout, '2>', \$stderr,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default))
	  or die "zkinspect @args failed (exit " . ($? >> 8) . "): $stderr";
	return $stdout;
}

# Every client's contender markers, and a zklock semaphore slot's, with the
# sequence number after them.
my $contender_re = qr/(?:-lock-|__lock__|__rlock__|__READ__|__WRIT__|-sem\d+-)(-?\d+)$/;

# The lock nodes anywhere under a path.  Run it while the sessions that
# made them are still open and idle: a node left behind by a live session
# stays, while any session that ends takes its nodes with it.
sub zk_lock_nodes
{
	my ($path) = @_;
	return grep { /$contender_re/ } split /\n/, zkinspect('tree', $path);
}

# Check, while the sessions of a test are still open (see zk_lock_nodes),
# that no lock node is left under $path.
sub no_node_left
{
	my ($path, $what) = @_;
	return is_deeply([ zk_lock_nodes($path) ], [],
		"$what: no node left, with every session still open");
}

sub zk_get
{
	my ($path) = @_;
	return zkinspect('get', $path);
}

sub zk_children
{
	my ($path) = @_;
	return grep { length } split /\n/, zkinspect('children', $path);
}

# Contender nodes under a lock's parent, with every client's markers, in
# sequence order ("%010d" of a signed int after the marker).
sub zk_contenders
{
	my ($path) = @_;
	my @c = grep { /$contender_re/ } zk_children($path);
	my %seq = map { /$contender_re/; ($_ => $1) } @c;
	my @sorted = sort { $seq{$a} <=> $seq{$b} } @c;
	return @sorted;
}

sub wait_until
{
	my ($what, $cond, $timeout) = @_;
	$timeout //= $PostgreSQL::Test::Utils::timeout_default;
	my $deadline = time + $timeout;
	while (time < $deadline)
	{
		return 1 if $cond->();
		usleep(50_000);
	}
	diag("timed out waiting for $what");
	return 0;
}

sub zk_wait_contenders
{
	my ($path, $n, $timeout) = @_;
	my @c;
	return wait_until("$n contenders under $path",
		sub { @c = zk_contenders($path); @c == $n }, $timeout);
}

# Read what psql has written until a quarter of a second passes with
# nothing more: one read may leave some of it in the pipe.
sub drain_output
{
	my ($session) = @_;
	# A session's timer may have run since its last query; pumping with it
	# expired would die.
	$session->{timeout}->start();
	my $seen = -1;
	while ($seen != length($session->{stdout}) + length($session->{stderr}))
	{
		$seen = length($session->{stdout}) + length($session->{stderr});
		usleep(250_000);
		$session->{run}->pump_nb;
	}
	return;
}

# Is this session's backend still waiting for zklock in the statement it
# ran $seconds (1 unless given) after it was sent, with nothing matching
# $marker printed and no error?  The statement is the one whose text
# matches $statement, or else $marker.  psql reads its next line only once
# a statement ends, so nothing sent through it can show that its output is
# complete while one runs; the server's view does.  The backend is seen in
# the statement, then everything psql printed before it is read, then the
# backend is seen in the same run of it still: it has not ended, so its
# result and its error cannot have been sent.  A waiter wakes up now and
# then to look at its queue again, so one of the two looks may find it
# running; the other must find it waiting for zklock.
sub still_waiting
{
	my ($node, $session, $marker, %opts) = @_;
	my $statement = $opts{statement} // $marker;
	my @seen;
	# The run of the statement the backend is in (its start), and whether
	# it was waiting for zklock.
	my $look = sub {
		my $row = $node->safe_psql('postgres',
			"SELECT state, wait_event_type, query_start, query "
			  . "FROM pg_stat_activity WHERE pid = $session->{zk_pid}");
		push @seen, $row;
		my ($state, $event, $start, $query) = split /\|/, $row, 4;
		return (undef, 0)
		  if ($state // '') ne 'active' || ($query // '') !~ $statement;
		return ($start, ($event // '') eq 'Extension');
	};
	sleep($opts{seconds} // 1);
	my ($run, $waiting) = $look->();
	drain_output($session);
	my ($still, $still_waiting) = $look->();
	my $ok = defined $run
	  && defined $still
	  && $still eq $run
	  && ($waiting || $still_waiting)
	  && $session->{stdout} !~ $marker
	  && $session->{stderr} !~ $pg_error_re;
	diag("backend $session->{zk_pid} not still waiting in $statement:\n"
		  . join("\n", @seen)
		  . "\nprinted:\n$session->{stdout}$session->{stderr}")
	  if !$ok;
	return $ok;
}

# The name a session's published waits get (its ZooKeeper session id),
# asked while the session is idle and its ZooKeeper session open.
sub wait_node
{
	my ($session) = @_;
	my $id = $session->query_safe('SELECT session_id FROM zk_status()');
	chomp $id;
	$id =~ s/^0x([0-9a-f]+)$/$1/ or die "no ZooKeeper session open: \"$id\"";
	return sprintf('%016s', $id) =~ tr/ /0/r;
}

# The waits the deadlock check has published under a lock root.
sub published_waits
{
	my ($root) = @_;
	return grep { /^[0-9a-f]{16}$/ } zk_children("$root/%waits");
}

# Wait until the wait named $wait_node is published under $root.  A
# cycle's victim is its youngest published wait, which on a loaded machine
# need not be the wait that began last: a test that expects a victim
# starts the next wait only once the one before is published.
sub await_published
{
	my ($root, $wait_node) = @_;
	return wait_until("wait $wait_node to be published",
		sub { grep { $_ eq $wait_node } published_waits($root) });
}

# Wait until the backend with this pid is waiting for a zklock, in the
# lock's queue: its wait shows in zk_locks with its node (with zklock
# preloaded).  The wait event alone is the same while the backend connects
# to ZooKeeper, before it has a node, and a cancel there ends no wait.
sub wait_for_zk_wait
{
	my ($node, $pid) = @_;
	return wait_until(
		"backend $pid waiting",
		sub {
			$node->safe_psql('postgres', qq{
				SELECT a.wait_event_type = 'Extension'
				  AND (current_setting('shared_preload_libraries') !~ 'zklock'
				       OR EXISTS (SELECT FROM zk_locks l
				                  WHERE l.pid = a.pid AND l.state = 'waiting'
				                    AND l.node IS NOT NULL))
				FROM pg_stat_activity a WHERE a.pid = $pid}) eq 't';
		});
}

# Wait until the backend with this pid knows that its ZooKeeper session
# ended (zk_sessions, with zklock preloaded, shows it lost, or closed once
# the backend dealt with the loss): a COMMIT sent before it knows may still
# find the session confirmed by its last contact with a server, and a lock
# call may still send requests on it.
sub wait_for_session_lost
{
	my ($node, $pid) = @_;
	return wait_until("backend $pid to know its session ended", sub {
		$node->safe_psql('postgres',
			"SELECT state IN ('lost', 'closed') FROM zk_sessions WHERE pid = $pid") eq 't';
	});
}

# The xid of the last request a ZooKeeper session sent, from the "cons" of
# the server it is connected to ("127.0.0.1:port", session id "0x..."): the
# difference between two readings counts the requests sent in between.
sub zk_session_last_xid
{
	my ($server, $session_id) = @_;
	my ($host, $port) = split /:/, $server;
	my $sock = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port,
		Timeout => 5)
	  or die "cannot reach $server: $!";
	print $sock 'cons';
	my $out = do { local $/; <$sock> };
	close $sock;
	$session_id = lc($session_id =~ s/^0x//r);
	for my $line (split /\n/, $out // '')
	{
		next unless $line =~ /sid=0x([0-9a-f]+)/ && $1 eq $session_id;
		return hex($1) if $line =~ /lcxid=0x([0-9a-f]+)/;
	}
	die "session 0x$session_id not in the cons of $server:\n" . ($out // '');
}

# Run the ensemble control script (stop, start, kill N, ...).
sub zk_ensemble
{
	my (@args) = @_;
	my ($stdout, $stderr);
	IPC::Run::run([ "$src/scripts/zk-ensemble", $ENV{ZKLOCK_TEST_ENSEMBLE},
			@args ], '>', \$stdout, '2>', \$stderr)
	  or die "zk-ensemble @args failed: $stderr";
	return $stdout;
}

# Start test/tools/zkproxy.py in front of the ensemble's first server.
# Returns the IPC::Run handle, the port to connect to, and the directory
# whose files tell the proxy which fault to cause.  The caller waits until
# it listens, and stops it with kill_kill.
sub start_proxy
{
	my ($server_port) = $hosts =~ /^[^:]+:(\d+)/;
	my $proxy_port = PostgreSQL::Test::Cluster::get_free_port();
	my $control = PostgreSQL::Test::Utils::tempdir();
	my $proxy = IPC::Run::start(
		[ '/usr/bin/python3', "$src/test/tools/zkproxy.py",
			$proxy_port, $server_port, $control ]);
	return ($proxy, $proxy_port, $control);
}

# How many times a fault of test/tools/zkproxy.py has done its harm.
sub proxy_fired
{
	my ($control, $fault) = @_;
	return 0 if !-e "$control/fired";
	return scalar grep { $_ eq $fault }
	  split /\n/, PostgreSQL::Test::Utils::slurp_file("$control/fired");
}

# A kazoo or Curator lock client on a lock path (test/peers/peer_kazoo.py,
# test/peers/PeerCurator.java), driven over stdin/stdout.  %opts: hosts
# (another connect string) and, for kazoo, tls ("CA,CERT,KEY" files).
sub start_peer
{
	my ($kind, $path, %opts) = @_;
	my $peer_hosts = $opts{hosts} // $hosts;
	my @cmd;
	if ($kind eq 'curator')
	{
		my $cp = slurp_file("$src/test/peers/curator-classpath.txt");
		chomp $cp;
		@cmd = ('java', '-XX:-UsePerfData', '-XX:TieredStopAtLevel=1',
			'-XX:+UseSerialGC', '-cp', $cp, "$src/test/peers/PeerCurator.java",
			$peer_hosts, $path);
	}
	else
	{
		my ($lock_kind) = $kind =~ /^kazoo-?(\w*)$/ or die "unknown peer $kind";
		my @reuse = $lock_kind eq 'reused' ? ('--reuse-lock') : ();
		$lock_kind = 'lock' if $lock_kind eq '' || $lock_kind eq 'reused';
		my @tls = $opts{tls} ? ('--tls', $opts{tls}) : ();
		@cmd = ('/usr/bin/python3', "$src/test/peers/peer_kazoo.py", '--kind',
			$lock_kind, @reuse, @tls, $peer_hosts, $path);
	}
	my $peer = { kind => $kind, in => '', out => '', err => '' };
	$peer->{timer} = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	$peer->{run} = IPC::Run::start(\@cmd, '<', \$peer->{in}, '>', \$peer->{out},
		'2>', \$peer->{err}, $peer->{timer});
	peer_expect($peer, qr/^ready$/m) or die "peer $kind did not start: $peer->{err}";
	return $peer;
}

sub peer_send
{
	my ($peer, $command) = @_;
	$peer->{in} .= "$command\n";
	$peer->{run}->pump_nb;
	return;
}

# Wait for a line matching $re; consumes output up to it.  False on
# timeout, and at once on an "error: ..." line that $re does not match.
sub peer_expect
{
	my ($peer, $re, $timeout) = @_;
	$peer->{timer}->start($timeout // $PostgreSQL::Test::Utils::timeout_default);
	$peer->{run}->pump
	  until $peer->{out} =~ $re
	  || $peer->{out} =~ /^error: /m
	  || $peer->{timer}->is_expired;
	if ($peer->{out} !~ $re)
	{
		diag("peer $peer->{kind}: waiting for $re, got:\n$peer->{out}")
		  if $peer->{out} =~ /^error: /m;
		$peer->{out} =~ s/^.*?^error: [^\n]*\n?//ms;
		return 0;
	}
	$peer->{out} =~ s/^.*?$re\n?//s;
	return 1;
}

# Does the peer print nothing at all for $seconds, and is it still
# running then?  Neither an answer, nor an error, nor an exit: "not
# granted" must not pass because the peer failed.
sub peer_silent
{
	my ($peer, $seconds) = @_;
	$peer->{timer}->start($seconds);
	# pump dies ("process ended prematurely") once the peer has exited.
	my $alive = eval {
		$peer->{run}->pump
		  until $peer->{out} =~ /\S/ || $peer->{timer}->is_expired;
		$peer->{run}->pumpable;
	};
	diag("peer $peer->{kind}: expected silence, got:\n$peer->{out}")
	  if $peer->{out} =~ /\S/;
	diag("peer $peer->{kind}: expected it waiting, but it has exited:\n"
		  . $peer->{err})
	  unless $alive;
	return $alive && $peer->{out} !~ /\S/;
}

sub peer_quit
{
	my ($peer) = @_;
	peer_send($peer, 'quit');
	$peer->{timer}->start(30);
	$peer->{run}->finish;
	return;
}


1;
