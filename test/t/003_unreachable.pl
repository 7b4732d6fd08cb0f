# ZooKeeper missing, unreachable or down: a clear error within
# zklock.connect_timeout, a backend that keeps working, and locks that work
# again once ZooKeeper is back.  Settings take effect at the next session.
# What the client library says of it reaches the server log through
# PostgreSQL's logging (the cluster logs to csvlog alone).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use ZkTest;

my $root = '/zklock_t003';
my $node = zk_cluster('unreachable', $root,
	'zklock.connect_timeout' => '1500ms',
	logging_collector => 'on',
	log_destination => "'csvlog'");
my $csvlog = $node->data_dir . '/'
  . $node->safe_psql('postgres', "SELECT pg_current_logfile('csvlog')");
my $s = zk_session($node);
my ($out, $err);

# The records of the csvlog, each a hash of the fields looked at.
sub csvlog_records
{
	my $text = -e $csvlog ? slurp_file($csvlog) : '';
	my (@records, @fields);
	pos($text) = 0;
	while (pos($text) < length $text
		&& $text =~ /\G(?:"((?:[^"]|"")*)"|([^,\n]*))(,|\n|\z)/gc)
	{
		push @fields, defined $1 ? $1 =~ s/""/"/gr : $2;
		next if $3 eq ',';
		push @records, {
			pid => $fields[3],
			severity => $fields[11],
			message => $fields[13],
			statement => $fields[19] };
		@fields = ();
	}
	return @records;
}

# The library's lines that a backend logged: records at LOG from its pid.
sub client_lines
{
	my ($pid, $re) = @_;
	return grep {
		$_->{pid} eq $pid && $_->{severity} eq 'LOG'
		  && $_->{message} =~ /^zookeeper client: / && $_->{message} =~ $re
	} csvlog_records();
}

($out, $err) = run_sql($s, "SET zklock.hosts = ''; SELECT zk_lock('x')");
like($err, qr/ERROR:  zklock.hosts is not set/, 'no hosts: an error');
like($err, qr/HINT:  Set zklock.hosts/, 'with a hint saying what to set');
run_sql($s, 'RESET zklock.hosts');

($out, $err) = run_sql($s, "SELECT zk_lock('x'); SELECT zk_unlock('x')");
is($err, '', 'a lock works with the configured hosts');

# Nothing is held, so the changed setting applies to the next lock call.
run_sql($s, "SET zklock.hosts = '127.0.0.1:1'");
my $t0 = time;
($out, $err) = run_sql($s, "SELECT zk_lock('x')");
my $elapsed = time - $t0;
like($err, qr/could not connect to ZooKeeper at "127\.0\.0\.1:1" within 1500 ms/,
	'an unreachable ensemble gives an error naming the hosts');
cmp_ok($elapsed, '<', 4, 'within the connect timeout (plus margin)');
($out) = run_sql($s, "SELECT 'still usable'");
is($out, 'still usable', 'the backend keeps working');

# The library's complaint about that host is a LOG record of the backend's,
# without the statement, logged before the backend's ERROR; none of it is
# written to standard error, which the collector keeps in a file of its own.
my $connect_error = qr/^could not connect to ZooKeeper at "127\.0\.0\.1:1"/;
ok(wait_until('the ERROR to reach the csvlog',
		sub { grep { $_->{pid} eq $s->{zk_pid} && $_->{message} =~ $connect_error } csvlog_records() }),
	'the ERROR reaches the csvlog');
my $refused = qr/ZOO_ERROR\@.*127\.0\.0\.1:1\b/;
my @lines = client_lines($s->{zk_pid}, $refused);
ok(@lines >= 1, 'the client library\'s log reaches the csvlog, as the backend\'s LOG')
  or diag(join("\n", map { "$_->{pid} $_->{severity} $_->{message}" } csvlog_records()));
is($lines[0]{statement} // '', '', 'without the statement that happened to run');
my @mine = grep { $_->{pid} eq $s->{zk_pid} } csvlog_records();
my ($first_line) =
  grep { $mine[$_]{message} =~ /^zookeeper client: / && $mine[$_]{message} =~ $refused } 0 .. $#mine;
my ($error) = grep { $mine[$_]{message} =~ $connect_error } 0 .. $#mine;
ok(defined $first_line && defined $error && $first_line < $error,
	'and before the ERROR it explains');
my $stderr_text = join('', map { slurp_file($_) } glob($node->data_dir . '/log/*.log'));
unlike($stderr_text, qr/ZOO_/, 'nothing of it on standard error');

run_sql($s, 'RESET zklock.hosts');
($out, $err) = run_sql($s, "SELECT zk_lock('x')");
is($err, '', 'the next call with good settings succeeds');

# While a lock is held, the open session is kept even if settings change.
run_sql($s, "SET zklock.hosts = '127.0.0.1:1'");
($out, $err) = run_sql($s, "SELECT zk_lock('y'); SELECT zk_unlock('y')");
is($err, '', 'a held lock keeps the current session');
run_sql($s, "RESET zklock.hosts; SELECT zk_unlock('x')");
$s->quit;

# A backend idle between statements logs nothing: what the library says
# of a connection cut meanwhile waits for the backend's next statement, or
# its exit, which logs it all and counts what the rate limit held back.
{
	my ($proxy, $proxy_port) = start_proxy();
	sleep 1;
	my $i = zk_session($node);
	($out, $err) = run_sql($i,
		"SET zklock.hosts = '127.0.0.1:$proxy_port'; SET zklock.idle_session_timeout = 0;"
		  . "SELECT zk_lock('idle'); SELECT zk_unlock('idle')");
	is($err, '', 'idle: a session through a proxy');
	$proxy->kill_kill;
	# The library reports the cut and every reconnect refused since.
	sleep 3;
	is(scalar client_lines($i->{zk_pid}, qr/ZOO_/), 0, 'idle: nothing logged while idle');
	$i->quit;
	ok(wait_until('the exiting backend to log the library\'s lines',
			sub { client_lines($i->{zk_pid}, qr/ZOO_ERROR\@.*127\.0\.0\.1:$proxy_port\b/) }),
		'idle: the library\'s lines logged at exit');
	# The count is logged after the lines, and may reach the file a moment later.
	ok(wait_until('the count of the lines held back',
			sub { client_lines($i->{zk_pid}, qr/^zookeeper client: \d+ more messages? suppressed$/) }),
		'idle: with a count of those the rate limit held back');
}

# The whole ensemble down: a new backend fails cleanly, then succeeds once
# the ensemble is back.
zk_ensemble('stop');
my $t = zk_session($node);
$t0 = time;
($out, $err) = run_sql($t, "SELECT zk_try_lock('x')");
$elapsed = time - $t0;
like($err, qr/could not connect to ZooKeeper at "[^"]+" within 1500 ms/,
	'a stopped ensemble gives an error');
cmp_ok($elapsed, '<', 4, 'within the connect timeout (plus margin)');
zk_ensemble('start');
# Servers just restarted may take longer than 1500 ms to take a session.
($out, $err) = run_sql($t, "SET zklock.connect_timeout = '20s'; SELECT zk_try_lock('x')");
is($out, 't', 'the same backend locks once the ensemble is back');
is($err, '', 'without error');
run_sql($t, "SELECT zk_unlock('x')");
$t->quit;

done_testing();
