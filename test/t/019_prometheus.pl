# zklock's figures through the Prometheus exporter users already run:
# Debian's prometheus-postgres-exporter, started against a cluster with
# monitoring/postgres-exporter.yaml, scraped over HTTP after a known
# sequence of locks, waits, a timeout, a cancel and a hold in progress;
# then a second one with --auto-discover-databases, over databases with
# and without zklock.
use strict;
use warnings;

use HTTP::Tiny;
use IPC::Run;
use List::Util qw(pairkeys);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $exporter = '/usr/bin/prometheus-postgres-exporter';
plan skip_all => "$exporter is not installed (scripts/install-deps installs it)"
  unless -x $exporter;

my $node = zk_cluster('prom', '/zklock_t019');
my $queries = "$ENV{ZKLOCK_SRC}/monitoring/postgres-exporter.yaml";
ok(-f $queries, 'the shipped queries file exists');

my $tempdir = PostgreSQL::Test::Utils::tempdir();
# As docs/monitoring.md sets it up: a role that is no superuser, only a
# member of pg_monitor.
$node->safe_psql('postgres', 'CREATE ROLE prometheus LOGIN IN ROLE pg_monitor');
my $dsn = sprintf('host=%s port=%d user=prometheus dbname=postgres sslmode=disable',
	$node->host, $node->port);

# The exporters started, stopped at the end whatever happens.
my @exporters;
END { $_->kill_kill for grep { $_->pumpable } @exporters; }

# An exporter with this file and @flags, logging to $log; returns it and
# its port.
sub start_exporter
{
	my ($log, @flags) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $proc = IPC::Run::start(
		[
			$exporter, "--extend.query-path=$queries",
			'--disable-default-metrics', '--disable-settings-metrics',
			'--no-collector.database', '--no-collector.bgwriter',
			"--web.listen-address=127.0.0.1:$port", @flags
		],
		'<', \undef, '>&', $log,
		init => sub { $ENV{DATA_SOURCE_NAME} = $dsn });
	push @exporters, $proc;
	return ($proc, $port);
}

my $log = "$tempdir/exporter.log";
my ($proc, $port) = start_exporter($log);

sub get_metrics
{
	my ($at) = @_;
	return HTTP::Tiny->new(timeout => 30)->get("http://127.0.0.1:$at/metrics");
}

# The series of a scrape, without the exporter's "server" label, as
# ('metric{label=value,...}', value) pairs, in the order they came.
sub series
{
	my ($content) = @_;
	my @s;
	for my $line (split /\n/, $content)
	{
		next if $line =~ /^#/;
		my ($name, $labels, $value) = $line =~ /^(\w+)(?:\{(.*)\})?\s+(\S+)$/
		  or next;
		my @l;
		while (($labels // '') =~ /(\w+)="((?:[^"\\]|\\.)*)"/g)
		{
			push @l, "$1=$2" unless $1 eq 'server';
		}
		push @s, $name . '{' . join(',', sort @l) . '}', $value;
	}
	return @s;
}

# The first exporter's metrics as 'metric{label=value,...}' => value.
sub scrape
{
	my $res = get_metrics($port);
	return undef unless $res->{success};
	return { series($res->{content}) };
}

my $m;
ok(wait_until('the exporter to answer', sub { $m = scrape() }),
	'the exporter answers on /metrics');

# --- a known sequence --------------------------------------------------------
my $a = zk_session($node);
my $b = zk_session($node);
my $c = zk_session($node);
run_sql($a, "SELECT zk_lock('prom_a'); SELECT zk_lock('prom_a');
	SELECT zk_unlock('prom_a'); SELECT zk_unlock('prom_a')");
run_sql($a, "SELECT zk_lock('prom_b')");
my ($out) = run_sql($b, "SELECT zk_lock('prom_b', interval '200 ms')");
is($out, 'f', 'a wait times out');
send_query($b, "SELECT 'b granted' FROM zk_lock('prom_b');");
# The view's wait starts once the waiting node is made, a little after the
# wait event is set.
ok(wait_until('the second wait to be shown',
		sub { $node->safe_psql('postgres',
				"SELECT count(*) FROM zk_locks WHERE pid = $b->{zk_pid} AND state = 'waiting'") eq '1' }),
	'a second wait begins');
sleep 1;

$m = scrape();
is($m->{'zklock_lock_activity_holders{kind=lock,name=prom_b}'}, 1, 'one holder now');
is($m->{'zklock_lock_activity_waiters{kind=lock,name=prom_b}'}, 1, 'one waiter now');
cmp_ok($m->{'zklock_lock_activity_longest_hold_seconds{kind=lock,name=prom_b}'},
	'>=', 1, 'the longest current hold, in seconds');
cmp_ok($m->{'zklock_lock_activity_longest_wait_seconds{kind=lock,name=prom_b}'},
	'>=', 1, 'the longest current wait, in seconds');
is($m->{'zklock_lock_activity_lost{kind=lock,name=prom_b}'}, 0, 'nothing lost');

run_sql($a, "SELECT zk_unlock('prom_b')");
ok(await_output($b, qr/b granted/), 'the waiter is granted');
send_query($c, "SELECT zk_lock('prom_b');");
ok(wait_for_zk_wait($node, $c->{zk_pid}), 'a third wait begins');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($c->{zk_pid})");
ok(await_output($c, qr/canceling statement due to user request/), 'and is cancelled');
run_sql($b, "SELECT zk_unlock('prom_b')");

$m = scrape();
my %want = (
	'zklock_stat_locks_acquisitions{name=prom_a}' => 2,
	'zklock_stat_locks_kept_acquisitions{name=prom_a}' => 0,
	'zklock_stat_locks_waits{name=prom_a}' => 0,
	'zklock_stat_locks_acquisitions{name=prom_b}' => 2,
	'zklock_stat_locks_waits{name=prom_b}' => 2,
	'zklock_stat_locks_timeouts{name=prom_b}' => 1,
	'zklock_stat_locks_cancellations{name=prom_b}' => 1,
	'zklock_stat_locks_deadlocks{name=prom_b}' => 0,
	'zklock_stat_locks_losses{name=prom_b}' => 0,
	'zklock_stat_locks_wait_seconds_count{name=prom_b}' => 2,
	# The timeout waited 0.2 s, the grant more than 1 s; the cancelled
	# wait is in cancellations only.
	'zklock_stat_locks_wait_seconds_bucket{le=0.001,name=prom_b}' => 0,
	'zklock_stat_locks_wait_seconds_bucket{le=0.01,name=prom_b}' => 0,
	'zklock_stat_locks_wait_seconds_bucket{le=0.1,name=prom_b}' => 0,
	'zklock_stat_locks_wait_seconds_bucket{le=1,name=prom_b}' => 1,
	'zklock_stat_locks_wait_seconds_bucket{le=10,name=prom_b}' => 2,
	'zklock_stat_locks_wait_seconds_bucket{le=60,name=prom_b}' => 2,
	'zklock_stat_locks_wait_seconds_bucket{le=600,name=prom_b}' => 2,
	'zklock_stat_locks_wait_seconds_bucket{le=+Inf,name=prom_b}' => 2,
	# prom_a's re-entrant hold ends once, in one psql call; prom_b's two
	# holds last more than 10 ms each, a's more than 1 s.
	'zklock_stat_locks_hold_seconds_count{name=prom_a}' => 1,
	'zklock_stat_locks_hold_seconds_bucket{le=1,name=prom_a}' => 1,
	'zklock_stat_locks_hold_seconds_count{name=prom_b}' => 2,
	'zklock_stat_locks_hold_seconds_bucket{le=0.01,name=prom_b}' => 0,
	'zklock_stat_locks_hold_seconds_bucket{le=86400,name=prom_b}' => 2,
	'zklock_stat_locks_hold_seconds_bucket{le=+Inf,name=prom_b}' => 2,
	# a, b and c each opened a session, which is still open.
	'zklock_sessions_backends{state=connected}' => 3,
	'zklock_sessions_backends{state=unsure}' => 0,
	'zklock_sessions_backends{state=lost}' => 0,
	'zklock_sessions_backends{state=closed}' => 0,
	'pg_exporter_last_scrape_error{}' => 0);
for my $key (sort keys %want)
{
	is($m->{$key}, $want{$key}, $key);
}
cmp_ok($m->{'zklock_stat_locks_wait_seconds_sum{name=prom_b}'}, '>', 1.2,
	'the wait time, in seconds');
cmp_ok($m->{'zklock_stat_locks_hold_seconds_sum{name=prom_b}'}, '>', 1.2,
	'the hold time, in seconds');
is( $m->{'zklock_stat_locks_hold_seconds_bucket{le=60,name=prom_b}'}
	  - $m->{'zklock_stat_locks_hold_seconds_bucket{le=1,name=prom_b}'},
	1, 'the hold that lasted more than 1 s is in the bucket of 1 to 60 s');
cmp_ok($m->{'zklock_sessions_longest_seconds{state=connected}'}, '>=', 1,
	'how long the oldest connected session has been connected');
ok(!defined $m->{'zklock_lock_activity_holders{kind=lock,name=prom_b}'},
	'a lock nobody holds or waits for leaves the activity');

# A semaphore's slot is shown apart from a lock of the same name.
run_sql($a, "SELECT zk_semaphore_acquire('prom_b', 2)");
$m = scrape();
is($m->{'zklock_lock_activity_holders{kind=semaphore,name=prom_b}'}, 1,
	'a semaphore slot holder, labelled kind="semaphore"');
run_sql($a, "SELECT zk_semaphore_release('prom_b')");

# A hold ends with its backend too.
run_sql($b, "SELECT zk_lock('prom_c')");
$b->quit;
ok(wait_until('the hold to end with its backend', sub {
		my $m = scrape();
		($m->{'zklock_stat_locks_hold_seconds_count{name=prom_c}'} // -1) == 1 }),
	'a hold that ends with its backend is counted');

$_->quit for ($a, $c);

# --- with --auto-discover-databases -----------------------------------------
# The exporter then scrapes every database of the server: here one more
# with zklock and one without.  zklock's figures are server-wide, so they
# must come once, from the DSN's database alone (master: true): twice
# would fail the whole scrape, and the database without zklock has no
# zk_stat_locks.
$node->safe_psql('postgres', 'CREATE DATABASE prom_zklock');
$node->safe_psql('postgres', 'CREATE DATABASE prom_plain');
$node->safe_psql('prom_zklock', 'CREATE EXTENSION zklock');
my $all_log = "$tempdir/exporter-all.log";
my ($all_proc, $all_port) = start_exporter($all_log, '--auto-discover-databases');
my $res;
ok(wait_until('the second exporter to answer',
		sub { $res = get_metrics($all_port); $res->{status} != 599 }),
	'the exporter over every database answers');
is($res->{status}, 200, 'its scrape succeeds') or diag($res->{content});
# A series that came twice is listed twice.
is_deeply([ sort grep { /^zklock_/ } pairkeys series($res->{content}) ],
	[ sort grep { /^zklock_/ } keys %{ scrape() // {} } ],
	'every zklock series of the DSN\'s database, each once');
$all_proc->signal('TERM');
$all_proc->finish;
# logfmt escapes the quotes.
unlike(slurp_file($all_log), qr/zk_stat_locks\\?" does not exist/,
	'no query ran in the database without zklock');

$proc->signal('TERM');
$proc->finish;
for ([ $log, 'the exporter' ], [ $all_log, 'the exporter over every database' ])
{
	my ($l, $which) = @$_;
	my $errors = join('', grep { /level=error/ } split /^/, slurp_file($l));
	is($errors, '', "$which logged no error");
}
done_testing();
