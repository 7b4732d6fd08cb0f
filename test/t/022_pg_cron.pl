# zklock under pg_cron, in both of pg_cron's ways to run a job: east runs
# its jobs over libpq connections, west in background workers.
#
#   - The README's "once across all clusters" recipe, its SQL as written
#     (only the data store's address filled in), scheduled every second on
#     both clusters with 4-second ticks against a third cluster as the
#     data store: each tick's work and mark are in the data store exactly
#     once, though both clusters ran the job in every tick, and runs never
#     overlap, though each lasts longer than the schedule's period.
#     A skipped run says why in the server log.  A lost lock commits
#     neither the work nor the mark.
#   - In each mode: a wait for a lock can be cancelled, a lost lock cancels
#     the job's statement and its work does not commit, and a job that
#     ends (terminated, or failed after taking a session-level lock)
#     leaves no lock behind.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use ZkTest;

my $pkglibdir = `pg_config --pkglibdir`;
chomp $pkglibdir;
plan skip_all => "pg_cron is not installed (scripts/build-pg-cron installs it)"
  unless -f "$pkglibdir/pg_cron.so";

my $root = '/zklock_t022';
my %cron = (
	shared_preload_libraries => "'zklock,pg_cron'",
	max_worker_processes => 20,
	'cron.database_name' => "'postgres'",
	'zklock.session_timeout' => '4s');
# pg_cron's libpq connections go to the clusters' socket directory.
my $east = zk_cluster('east', $root, %cron,
	'cron.host' => "'$PostgreSQL::Test::Cluster::test_pghost'");
my $west = zk_cluster('west', $root, %cron,
	'cron.use_background_workers' => 'on');
my %mode = (east => 'libpq', west => 'background worker');
my $files = PostgreSQL::Test::Utils::tempdir();

# The README's SQL blocks of "Once across all clusters", in order.
my $readme = slurp_file("$ENV{ZKLOCK_SRC}/README.md");
$readme =~ /\*\*Once across all clusters\.\*\*(.*?)\*\*No overlap/s
  or die "README.md: no \"Once across all clusters\" recipe";
my ($store_sql, $cluster_sql, $schedule_sql) = $1 =~ /^```sql\n(.*?)^```$/gms;
like($schedule_sql, qr/cron\.schedule/,
	"the README's recipe: the data store's tables, each cluster's, the schedule");

# The data store, where the jobs connect as the README's role.
my $store = PostgreSQL::Test::Cluster->new('store');
$store->init;
$store->start;
$store->safe_psql('postgres', q{
	CREATE ROLE exporter LOGIN;
	CREATE DATABASE datastore_a OWNER exporter});
my ($rc, $out, $err) = $store->psql('datastore_a', $store_sql,
	extra_params => [ '-U', 'exporter', '-v', 'ON_ERROR_STOP=1' ]);
is($rc . $err, '0', "the README's data store tables");
# The work lasts 1.2 s, longer than the schedule's period: a run whose work
# starts while another's goes on finds the advisory lock taken, and logs it.
$store->safe_psql('datastore_a', q{
	CREATE FUNCTION slow_work() RETURNS trigger LANGUAGE plpgsql AS $f$
	BEGIN
		IF NOT pg_try_advisory_xact_lock(22) THEN
			RAISE LOG 't022: two runs work at once';
		END IF;
		PERFORM pg_sleep(1.2);
		RETURN NEW;
	END $f$;
	CREATE TRIGGER slow_work BEFORE INSERT ON exports
		FOR EACH ROW EXECUTE FUNCTION slow_work()});
my ($store_host, $store_port) = ($store->host, $store->port);
$cluster_sql =~ s/host 'datastore-a\.example\.com', port '5432'/host '$store_host', port '$store_port'/
  or die "README.md: the data store's address is not where the test fills it in";

for my $node ($east, $west)
{
	$node->safe_psql('postgres', $cluster_sql);
	$node->safe_psql('postgres', qq{
		CREATE EXTENSION pg_cron;
		CREATE FUNCTION zk_test_session_credentials() RETURNS text
		AS '\$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
		CREATE TABLE local_work (what text);
		CREATE TABLE tick_stop ();
		-- A mark outside any transaction, so that a run that fails still
		-- counts as the first.
		CREATE FUNCTION first_run(job text) RETURNS void LANGUAGE plpgsql AS \$f\$
		DECLARE
			mark text := '$files/ran_' || job;
		BEGIN
			IF (pg_stat_file(mark, true)).size IS NOT NULL THEN
				RAISE EXCEPTION 'job % ran already', job;
			END IF;
			EXECUTE format('COPY (SELECT 1) TO %L', mark);
		END \$f\$});
}

# The backends running this job's command, oldest first.
sub job_backends
{
	my ($node, $job) = @_;
	return split /\n/, $node->safe_psql('postgres', qq{
		SELECT pid FROM pg_stat_activity
		WHERE query LIKE '%first_run(''$job'')%' AND pid <> pg_backend_pid()
		ORDER BY backend_start});
}

# Start a job that runs once: its command, after a first statement that
# fails every run but the first.  (pg_cron runs an interval job first one
# interval after it is scheduled, and unscheduling a job while it runs
# would end the run in background-worker mode and abandon it in libpq
# mode.)  Returns the pid of the first run, once it is running.
sub start_job
{
	my ($node, $job, $command) = @_;
	my @pids;
	$node->safe_psql('postgres',
		"SELECT cron.schedule('$job', '2 seconds', \$c\$SELECT first_run('$job'); $command\$c\$)");
	wait_until("a run of $job on " . $node->name,
		sub { @pids = job_backends($node, $job); @pids > 0 });
	return $pids[0];
}

# The status and message pg_cron recorded for this job's run with this
# pid, once it ended and its process is gone (pg_cron may record the end
# first).  The job is unscheduled then, and any later run that is still
# going is ended.
sub job_outcome
{
	my ($node, $job, $pid) = @_;
	my $outcome = '';
	wait_until("the run of pid $pid to end", sub {
		$outcome = $node->safe_psql('postgres', qq{
			SELECT status || ': ' || coalesce(return_message, '<none>')
			FROM cron.job_run_details WHERE job_pid = $pid
			  AND status NOT IN ('starting', 'running')
			  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $pid)});
		$outcome ne '';
	});
	$node->safe_psql('postgres', "SELECT cron.unschedule('$job')");
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($_)")
	  for job_backends($node, $job);
	wait_until("the runs of $job to end", sub { !job_backends($node, $job) });
	return $outcome;
}

# --- once per tick across the fleet, no overlap ----------------------------
# The README's function with 4-second ticks, until tick_stop has a row.
my $tick = 'to_timestamp(floor(extract(epoch FROM now()) / 4) * 4)';
my %tick_job = map {
	$_->name => $_->safe_psql('postgres', qq{
		SELECT cron.schedule('tick', '1 seconds',
			'SELECT nightly_export($tick) WHERE NOT EXISTS (SELECT 1 FROM tick_stop)')})
} ($east, $west);
sleep 36;
# Stop the work first: unscheduling a job would end or abandon its run in
# progress.
my %stopped_at = map {
	$_->name => $_->safe_psql('postgres',
		'INSERT INTO tick_stop DEFAULT VALUES; SELECT now()')
} ($east, $west);
# The runs that the checks below count, by pg_cron's own start time (set
# before the run's backend reports its query), must have ended: unscheduled,
# a run still going would be recorded as failed.
ok(wait_until('the runs started before the stop to end', sub {
	join('', map {
		$_->safe_psql('postgres', qq{
			SELECT count(*) FROM cron.job_run_details
			WHERE jobid = $tick_job{$_->name}
			  AND status NOT IN ('succeeded', 'failed')
			  AND coalesce(start_time, '-infinity') < '$stopped_at{$_->name}'})
	} ($east, $west)) eq '00';
}), 'the runs started before the stop ended');
$_->safe_psql('postgres', q{SELECT cron.unschedule('tick')}) for ($east, $west);
ok(wait_until('the last run to end', sub {
	join('', map {
		$_->safe_psql('postgres', q{
			SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE '%nightly_export(%' AND pid <> pg_backend_pid()})
	} ($east, $west)) eq '00';
}), 'the last run ended');

my ($distinct, $marks, $work, $span, $first, $last, $by) = split /\|/,
  $store->safe_psql('datastore_a', q{
	SELECT count(DISTINCT tick), (SELECT count(*) FROM export_runs), count(*),
		(extract(epoch FROM max(tick) - min(tick)) / 4)::int + 1,
		extract(epoch FROM min(tick))::bigint, extract(epoch FROM max(tick))::bigint,
		string_agg(DISTINCT cluster, ',' ORDER BY cluster)
	FROM exports});
cmp_ok($distinct, '>=', 8, "the job did the work of many ticks ($distinct)");
is($marks, $distinct, 'one mark per tick in the data store');
is($work, $distinct, 'and one run\'s work: no tick\'s work was done twice across the two clusters');
is($span, $distinct, 'no tick was missed between the first and the last');
note("the clusters that did the work: $by");
for my $node ($east, $west)
{
	# Every tick strictly between the first and the last one done: those
	# two may lie partly outside the schedules.
	is( $node->safe_psql('postgres', qq{
			SELECT count(DISTINCT floor(extract(epoch FROM start_time) / 4))
			FROM cron.job_run_details WHERE jobid = $tick_job{$node->name}
			  AND start_time >= to_timestamp($first + 4)
			  AND start_time < to_timestamp($last)}),
		$distinct - 2,
		"$mode{$node->name} mode: the cluster ran the job in every tick");
	is( $node->safe_psql('postgres', qq{
			-- A run that started before the stop may still see tick_stop,
			-- and return no row: its message is not compared.
			SELECT string_agg(DISTINCT status || CASE WHEN status = 'succeeded' THEN ''
			                  ELSE ': ' || coalesce(return_message, '') END, ', ')
			FROM cron.job_run_details WHERE jobid = $tick_job{$node->name}
			  AND start_time < '$stopped_at{$node->name}'}),
		'succeeded',
		"$mode{$node->name} mode: every run, skipped or not, succeeded");
}
unlike(slurp_file($store->logfile), qr/LOG:  t022: two runs work at once/,
	'no two runs overlapped, though each lasts longer than the period');
my $log = join '', map { slurp_file($_->logfile) } ($east, $west);
ok($log =~ qr/LOG:  nightly_export: skipped, another run holds datastore_a/,
	'the server log shows a run skipped while another held the lock');
ok($log =~ qr/LOG:  nightly_export: skipped, the run of .+ is done/,
	'and one skipped because its tick was done');

# --- a lost lock commits neither the work nor the mark ----------------------
# The loss comes between the function's writes and COMMIT, where only the
# commit check stops them, and that check must come before postgres_fdw
# commits the remote transaction.
{
	my $s = zk_session($east);
	($out, $err) = run_sql($s, q{BEGIN; SELECT nightly_export('2000-01-01 UTC')});
	is($err, '', 'a run does the work under the lock');
	my ($creds) = run_sql($s, 'SELECT zk_test_session_credentials()');
	ZkTest::zkinspect('expire', $creds);
	ok(zk_wait_contenders("$root/datastore_a", 0), 'its session expires');
	ok(wait_for_session_lost($east, $s->{zk_pid}), 'and the run knows it');
	($out, $err) = run_sql($s, 'COMMIT');
	like($err, qr/ERROR:  cannot commit because zklock lost its ZooKeeper session/,
		'the COMMIT is refused');
	is( $store->safe_psql('datastore_a', q{
			SELECT (SELECT count(*) FROM exports WHERE tick = '2000-01-01 UTC')
				+ (SELECT count(*) FROM export_runs WHERE tick = '2000-01-01 UTC')}),
		'0', 'and the data store has neither its work nor its mark');
	$s->quit;
}

for my $node ($east, $west)
{
	my $name = $node->name;
	my $mode = $mode{$name};

	# --- a wait cancelled ---------------------------------------------------
	my $holder = zk_session($node);
	run_sql($holder, "SELECT zk_lock('t022_busy_$name')");
	my $pid = start_job($node, "wait_$name",
		"SELECT zk_lock('t022_busy_$name'); INSERT INTO local_work VALUES ('waited')");
	ok(defined $pid && wait_for_zk_wait($node, $pid), "$mode mode: the job waits for the lock");
	my $cancelled_at = time;
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
	like(job_outcome($node, "wait_$name", $pid), qr/^failed: ERROR: +canceling statement due to user request/,
		"$mode mode: a cancel ends the job's wait");
	cmp_ok(time - $cancelled_at, '<', 3, "$mode mode: within 3 s");
	is($node->safe_psql('postgres', "SELECT count(*) FROM local_work WHERE what = 'waited'"),
		'0', "$mode mode: the cancelled job did nothing after its wait");
	ok(zk_wait_contenders("$root/t022_busy_$name", 1),
		"$mode mode: the cancelled wait leaves no node");
	run_sql($holder, "SELECT zk_unlock('t022_busy_$name')");
	$holder->{run}->finish;

	# --- a lost lock --------------------------------------------------------
	my $creds_file = "$files/creds_$name";
	$pid = start_job($node, "lost_$name", qq{
		SELECT zk_xact_lock('t022_lost_$name');
		INSERT INTO local_work VALUES ('under the lost lock');
		COPY (SELECT zk_test_session_credentials()) TO '$creds_file';
		SELECT pg_sleep(30)});
	ok(defined $pid && wait_until('the job to hold the lock', sub { -s $creds_file }),
		"$mode mode: the job holds the lock and wrote under it");
	my $creds = slurp_file($creds_file);
	chomp $creds;
	ZkTest::zkinspect('expire', $creds);
	like(job_outcome($node, "lost_$name", $pid),
		qr/^failed: ERROR: +canceling statement because zklock lost its ZooKeeper session/,
		"$mode mode: the lost lock cancels the job's statement");
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM local_work WHERE what = 'under the lost lock'"),
		'0', "$mode mode: the job's work under the lost lock did not commit");
	ok(zk_wait_contenders("$root/t022_lost_$name", 0), "$mode mode: its node is gone");

	# --- the job's end releases its locks -----------------------------------
	$pid = start_job($node, "killed_$name",
		"SELECT zk_lock('t022_exit_$name'); SELECT pg_sleep(60)");
	ok(defined $pid && zk_wait_contenders("$root/t022_exit_$name", 1),
		"$mode mode: a job holds a session-level lock");
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	like(job_outcome($node, "killed_$name", $pid), qr/^failed: /, "$mode mode: the terminated job failed");
	ok(zk_wait_contenders("$root/t022_exit_$name", 0),
		"$mode mode: terminating the job released its lock");

	$pid = start_job($node, "error_$name", qq{
		SELECT zk_lock('t022_exit_$name'), zk_xact_lock('t022_exit_x_$name');
		SELECT pg_sleep(1);
		SELECT 1 / 0});
	isnt(job_outcome($node, "error_$name", $pid), '', "$mode mode: the failing job ended");
	# What pg_cron records for a background worker that failed is not
	# reliable (it recorded such a run as succeeded): read the server log.
	like(slurp_file($node->logfile), qr/\[$pid\] (pg_cron )?ERROR:  division by zero/,
		"$mode mode: a job fails after taking its locks");
	ok(zk_wait_contenders("$root/t022_exit_$name", 0)
		  && zk_wait_contenders("$root/t022_exit_x_$name", 0),
		"$mode mode: the failed job's end released its session and transaction locks");
	my $taken = $node->safe_psql('postgres',
		"SELECT zk_try_lock('t022_exit_$name') AND zk_unlock('t022_exit_$name')");
	is($taken, 't', "$mode mode: another backend takes the lock at once");
}

for my $node ($east, $west)
{
	unlike(slurp_file($node->logfile), qr/terminated by signal|TRAP:/,
		"$mode{$node->name} mode: no backend or worker crashed");
}
$_->stop for ($east, $west, $store);
done_testing();
