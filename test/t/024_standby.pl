# A hot standby takes zklocks, since they live in ZooKeeper, not in the
# WAL: its session- and transaction-level locks keep the primary's backends
# out, and its commit check refuses a transaction whose lock was lost,
# read-only as it is.  A database with zklock, dumped with pg_dump and
# restored with pg_restore, gets CREATE EXTENSION and locks as before.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $root = '/zklock_t024';
my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
zk_configure($primary, $root, 'zklock.session_timeout' => '4s');
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION zklock;
	CREATE FUNCTION zk_test_session_credentials() RETURNS text
	AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
});
$primary->backup('base');
# The backup's postgresql.conf preloads zklock with the same settings.
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't',
	'the standby is in recovery');

# Does a new backend of the primary get the lock at once?  It lets it go
# as it exits.
sub primary_gets
{
	my ($name, $db) = @_;
	return $primary->safe_psql($db // 'postgres', "SELECT zk_try_lock('$name')");
}

my ($out, $err);
my $s = zk_session($standby);

# --- a standby's locks ------------------------------------------------------
($out, $err) = run_sql($s, "SELECT zk_lock('standby_a')");
is($err, '', 'standby: zk_lock is granted');
is($standby->safe_psql('postgres',
		"SELECT scope, state FROM zk_locks WHERE name = 'standby_a'"),
	'session|held', 'standby: zk_locks shows the hold to another backend');
is(primary_gets('standby_a'), 'f',
	'standby: its session-level lock keeps the primary out');
($out) = run_sql($s, "SELECT zk_unlock('standby_a')");
is($out, 't', 'standby: zk_unlock releases it');
is(primary_gets('standby_a'), 't', 'standby: then the primary gets it');

run_sql($s, 'BEGIN');
($out, $err) = run_sql($s, "SELECT current_setting('transaction_read_only'), zk_xact_lock('standby_b')");
is($out . $err, 'on|', 'standby: zk_xact_lock is granted in a read-only transaction');
is(primary_gets('standby_b'), 'f',
	'standby: its transaction-level lock keeps the primary out');
($out, $err) = run_sql($s, 'COMMIT');
is($err, '', 'standby: COMMIT passes the commit check');
is(primary_gets('standby_b'), 't', 'standby: then the primary gets it');

# The commit check needs no write: a lost lock fails a standby's COMMIT.
run_sql($s, 'BEGIN');
run_sql($s, "SELECT zk_xact_lock('standby_c')");
my ($creds) = run_sql($s, 'SELECT zk_test_session_credentials()');
ZkTest::zkinspect('expire', $creds);
ok(wait_for_session_lost($standby, $s->{zk_pid}), 'standby: the session is lost');
($out, $err) = run_sql($s, 'COMMIT');
like($err, qr/ERROR:  cannot commit because zklock lost its ZooKeeper session/,
	'standby: COMMIT fails once its lock is lost');
is(primary_gets('standby_c'), 't', 'standby: the lost lock is free for the primary');
$s->quit;

# --- pg_dump and pg_restore -------------------------------------------------
$primary->safe_psql('postgres', 'CREATE DATABASE jobs; CREATE ROLE lock_monitor');
$primary->safe_psql('jobs', q{
	CREATE EXTENSION zklock;
	CREATE FUNCTION take_a() RETURNS boolean
	BEGIN ATOMIC SELECT zk_try_lock('restored_a'); END;
	GRANT EXECUTE ON FUNCTION zk_stat_locks_reset() TO lock_monitor;
});
is($primary->safe_psql('jobs',
		"SELECT extconfig IS NULL FROM pg_extension WHERE extname = 'zklock'"),
	't', 'dump: zklock has no configuration table to dump');
my $dump = PostgreSQL::Test::Utils::tempdir() . '/jobs.dump';
$primary->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'jobs' ],
	'dump: pg_dump -Fc');
my $toc;
IPC::Run::run([ 'pg_restore', '-l', $dump ], '>', \$toc)
  or die 'pg_restore -l failed';
like($toc, qr/ EXTENSION - zklock\b/, 'dump: the extension is in the dump');
unlike($toc, qr/^\d+; \d+ \d+ (?:FUNCTION|VIEW) \S+ zk_/m,
	'dump: its functions and views are not, as CREATE EXTENSION makes them');

$primary->safe_psql('postgres', 'CREATE DATABASE restored');
$primary->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', 'restored', $dump ],
	'restore: pg_restore into a fresh database');
my $r = zk_session($primary, 'restored');
($out, $err) = run_sql($r, 'SELECT take_a()');
is($out . $err, 't', 'restore: the dumped function takes its lock');
is(primary_gets('restored_a', 'jobs'), 'f',
	'restore: which keeps the original database out');
($out, $err) = run_sql($r,
	"SELECT zk_unlock('restored_a'), zk_lock('restored_b', '5s'), zk_unlock('restored_b')");
is($out . $err, 't|t|t', 'restore: zk_unlock and zk_lock work');
is(primary_gets('restored_a', 'jobs'), 't', 'restore: the lock is free once released');
is($primary->safe_psql('restored',
		"SELECT has_function_privilege('lock_monitor', 'zk_stat_locks_reset()', 'EXECUTE')"),
	't', 'restore: with the grant made on one of its functions');
$r->quit;

done_testing();
