# The real use: jobs on different PostgreSQL clusters sharing one ensemble.
# Two clusters exclude each other, and backends on both keep an external
# counter exact under zk_xact_lock.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $root = '/zklock_t002';
my $east = zk_cluster('east', $root);
my $west = zk_cluster('west', $root);

# --- exclusion across clusters -------------------------------------------
my $e = zk_session($east);
my $w = zk_session($west);
my ($out, $err);

run_sql($e, "SELECT zk_lock('datastore_a')");
($out) = run_sql($w, "SELECT zk_try_lock('datastore_a')");
is($out, 'f', 'a lock held on one cluster excludes the other cluster');
send_query($w, "SELECT 'west granted' FROM zk_lock('datastore_a');");
ok(wait_for_zk_wait($west, $w->{zk_pid}), 'the other cluster waits');
run_sql($e, "SELECT zk_unlock('datastore_a')");
ok(await_output($w, qr/west granted/), 'and is granted on release');
($out) = run_sql($e, "SELECT zk_try_lock('datastore_a')");
is($out, 'f', 'now the first cluster is excluded');
run_sql($w, "SELECT zk_unlock('datastore_a')");

run_sql($e, "BEGIN; SELECT zk_xact_lock('datastore_b')");
($out) = run_sql($w, "SELECT zk_try_xact_lock('datastore_b')");
is($out, 'f', 'a transaction-level lock excludes the other cluster');
run_sql($e, 'COMMIT');
($out) = run_sql($w, "SELECT zk_xact_lock('datastore_b', '5s')");
is($out, 't', 'COMMIT on one cluster frees it for the other');
$e->quit;
$w->quit;

# --- no lost update -------------------------------------------------------
# The counter lives in a third cluster, the "data store" both clusters'
# jobs mutate.  Each increment reads it, pauses to widen the race window,
# and writes it back, in separate statements on the store.
my $store = PostgreSQL::Test::Cluster->new('store');
$store->init;
$store->start;
$store->safe_psql('postgres', 'CREATE TABLE counter (n int)');
my $store_conn = 'host=' . $store->host . ' port=' . $store->port . ' dbname=postgres';
for my $node ($east, $west)
{
	$node->safe_psql('postgres', qq{
		CREATE EXTENSION dblink;
		CREATE FUNCTION bump() RETURNS void LANGUAGE plpgsql AS \$\$
		DECLARE n int;
		BEGIN
			PERFORM dblink_connect('store', '$store_conn')
				WHERE dblink_get_connections() IS NULL;
			SELECT r INTO n FROM dblink('store', 'SELECT n FROM counter') AS t(r int);
			PERFORM pg_sleep(0.002);
			PERFORM dblink_exec('store', format('UPDATE counter SET n = %s', n + 1));
		END \$\$});
}

my $dir = PostgreSQL::Test::Utils::tempdir();
my $clients = 3;
my $per_client = 25;

sub run_increments
{
	my ($locked) = @_;
	$store->safe_psql('postgres', 'DELETE FROM counter; INSERT INTO counter VALUES (0)');
	my $script = "$dir/bump.sql";
	unlink $script;
	PostgreSQL::Test::Utils::append_to_file($script,
		"BEGIN;\n"
		  . ($locked ? "SELECT zk_xact_lock('counter');\n" : '')
		  . "SELECT bump();\nCOMMIT;\n");
	my @runs;
	for my $node ($east, $west)
	{
		my ($stdout, $stderr) = ('', '');
		my $h = IPC::Run::start(
			[
				'pgbench', '-n', '-c', $clients, '-j', $clients,
				'-t', $per_client, '-f', $script,
				'-h', $node->host, '-p', $node->port, 'postgres'
			],
			'>', \$stdout, '2>', \$stderr);
		push @runs, [ $h, \$stdout, \$stderr ];
	}
	my $committed = 0;
	for my $run (@runs)
	{
		my ($h, $stdout, $stderr) = @$run;
		$h->finish;
		diag($$stderr) if $$stderr =~ /error|abort/i;
		$committed += $1
		  if $$stdout =~ /number of transactions actually processed: (\d+)/;
	}
	return ($committed, $store->safe_psql('postgres', 'SELECT n FROM counter'));
}

my ($committed, $final) = run_increments(1);
is($committed, 2 * $clients * $per_client,
	'every increment under zk_xact_lock committed');
is($final, $committed, 'the counter equals the committed increments: no lost update');

# pgbench's sessions are gone, and their nodes with them whatever they
# left; sessions that stay open show a node left behind.
{
	my @sessions = (zk_session($east), zk_session($west));
	for my $round (1 .. 10)
	{
		for my $s (@sessions)
		{
			my ($out, $err) = run_sql($s, "BEGIN; SELECT zk_xact_lock('counter'); SELECT bump(); COMMIT");
			is($err, '', "round $round: an increment under the lock from an open session")
			  if $round == 1 || $err ne '';
		}
	}
	is_deeply([ zk_lock_nodes($root) ], [],
		'no lock node is left behind while the sessions are open');
	$_->quit for @sessions;
}

# The same workload without the lock loses updates, so the check above
# can fail.
($committed, $final) = run_increments(0);
cmp_ok($final, '<', $committed, 'without zk_xact_lock updates are lost');

done_testing();
