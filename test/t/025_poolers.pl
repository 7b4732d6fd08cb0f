# zklock behind a real PgBouncer (Debian's pgbouncer, on 127.0.0.1):
#
# - session pooling: the pooler's DISCARD ALL between two clients of one
#   server connection releases the first client's session-level locks and
#   acknowledges their loss, so the next client neither finds them held
#   nor has its writes refused;
# - transaction pooling: many clients on few server connections take
#   transaction-level locks, and no two recorded holds overlap;
# - transaction pooling with zklock.session_locks off on the pooled role:
#   session-level calls fail with a clear error instead of stranding their
#   lock on a server connection, as one does when the setting is on.
use strict;
use warnings;

use DBI;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $pgbouncer = '/usr/sbin/pgbouncer';
plan skip_all => "$pgbouncer is not installed (scripts/install-deps installs it)"
  unless -x $pgbouncer;

my $root = '/zklock_t025';
my $node = zk_cluster('pooled', $root);
my $su = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql('postgres', q{
	CREATE ROLE pooled LOGIN;
	ALTER ROLE pooled SET zklock.session_locks = off;
	CREATE TABLE work (client int, what text);
	CREATE TABLE holds (client int, pid int, since timestamptz, till timestamptz);
	GRANT ALL ON work, holds TO pooled;
	CREATE FUNCTION zk_test_session_credentials() RETURNS text
	AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
});

# --- the pooler -----------------------------------------------------------------
my $dir = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $server = sprintf('host=%s port=%d dbname=postgres', $node->host, $node->port);
my $pool_size = 2;
PostgreSQL::Test::Utils::append_to_file("$dir/users.txt", qq{"$su" ""\n"pooled" ""\n});
PostgreSQL::Test::Utils::append_to_file("$dir/pgbouncer.ini", <<"INI");
[databases]
session = $server pool_mode=session pool_size=1
transaction = $server pool_mode=transaction pool_size=$pool_size
guarded = $server user=pooled pool_mode=transaction pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
server_reset_query = DISCARD ALL
logfile = $dir/pgbouncer.log
max_client_conn = 50
INI
my $bouncer = IPC::Run::start([ $pgbouncer, "$dir/pgbouncer.ini" ],
	'<', \undef, '>&', "$dir/pgbouncer.out");
END { $bouncer->kill_kill if $bouncer && $bouncer->pumpable; }

sub client
{
	my ($db, $user) = @_;
	return DBI->connect("dbi:Pg:host=127.0.0.1;port=$port;dbname=$db",
		$user // $su, '',
		{ AutoCommit => 1, RaiseError => 0, PrintError => 0, pg_server_prepare => 0 });
}
my $probe;
wait_until('PgBouncer to take connections', sub { $probe = client('session') });
$probe->disconnect;

# Whether a client connected to the server itself gets the lock now (and
# lets it go again).
sub free_now
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT zk_try_lock('$name') AND zk_unlock('$name')") eq 't';
}

sub backend_of { return ($_[0]->selectrow_array('SELECT pg_backend_pid()'))[0]; }

# --- session pooling: DISCARD ALL between clients ----------------------------------
{
	my $a = client('session');
	my $pid = backend_of($a);
	$a->do("SELECT zk_lock('left_behind'), zk_lock('left_behind'), zk_lock_shared('left_shared')");
	ok(!free_now('left_behind') && !free_now('left_shared'), 'session pooling: a client holds two locks');
	$a->disconnect;

	my $b = client('session');
	is(backend_of($b), $pid, 'the next client gets the same server connection');
	ok(free_now('left_behind') && free_now('left_shared'),
		'the first client left without unlocking, and its locks are free');
	is(($b->selectrow_array('SELECT count(*) FROM zk_locks WHERE pid = pg_backend_pid()'))[0],
		0, 'the server connection shows no hold');

	# A lock lost while the first client held it: that client's writes are
	# refused until it acknowledges the loss, and it leaves without doing so,
	# and with a temporary table, whose drop makes DISCARD ALL a write.
	$b->do("SELECT zk_lock('lost_here')");
	$b->do('CREATE TEMP TABLE scratch (x int)');
	my ($creds) = $b->selectrow_array('SELECT zk_test_session_credentials()');
	ZkTest::zkinspect('expire', $creds);
	my $refused = wait_until('the loss to refuse a write', sub {
		!$b->do("INSERT INTO work VALUES (1, 'under a lost lock')")
		  && $b->errstr =~ /zklock/;
	});
	ok($refused, 'a write after the loss is refused');
	like($b->errstr, qr/lost/, 'for the lost lock');
	$b->disconnect;

	my $c = client('session');
	is(backend_of($c), $pid, 'the next client again gets that server connection');
	# PgBouncer hands the connection on even if its reset query failed.
	is(($c->selectrow_array("SELECT count(*) FROM pg_class WHERE relname = 'scratch'"))[0],
		0, 'DISCARD ALL committed: the temporary table is gone');
	ok($c->do("INSERT INTO work VALUES (2, 'next client')"),
		'and its writes are not refused for the loss of the client before')
	  or diag($c->errstr);
	$c->disconnect;
}

# --- transaction pooling: transaction-level locks, no overlap --------------------
{
	my $clients = 8;
	my $script = "$dir/holds.sql";
	# Each transaction records its hold, from inside the grant to before its
	# commit, under one of three ways to take the lock.
	PostgreSQL::Test::Utils::append_to_file($script, <<'SQL');
\set way random(1, 3)
BEGIN;
\if :way = 1
SELECT zk_xact_lock('pooled_xact');
\elif :way = 2
SELECT zk_xact_lock(ARRAY['pooled_xact', 'pooled_xact_too']);
\else
SELECT zk_xact_lock('pooled_xact', '30 s');
\endif
INSERT INTO holds VALUES (:client_id, pg_backend_pid(), clock_timestamp(), NULL);
SELECT pg_sleep(0.005);
UPDATE holds SET till = clock_timestamp() WHERE client = :client_id AND till IS NULL;
COMMIT;
SQL
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[
			'pgbench', '-n', '-c', $clients, '-j', 2, '-t', 15, '-f', $script,
			"host=127.0.0.1 port=$port dbname=transaction user=$su"
		],
		'>', \$out, '2>', \$err);
	ok($ok, "transaction pooling: $clients clients on $pool_size server connections ran")
	  or diag("$out\n$err");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM holds WHERE till IS NOT NULL'),
		$clients * 15, 'every transaction recorded its hold');
	is($node->safe_psql('postgres',
			"SELECT count(DISTINCT client) = $clients AND count(DISTINCT pid) <= $pool_size FROM holds"),
		't', "from all $clients clients, through at most $pool_size server connections");
	is($node->safe_psql('postgres', q{
			SELECT count(*) FROM holds a JOIN holds b
			  ON a.ctid < b.ctid
			 AND tstzrange(a.since, a.till) && tstzrange(b.since, b.till)}),
		'0', 'no two holds overlap');
	ok(free_now('pooled_xact') && free_now('pooled_xact_too'), 'and the locks are free after');
	no_node_left($root, 'transaction pooling');
}

# --- transaction pooling: session-level locks ------------------------------------
{
	# What zklock.session_locks prevents: on a transaction-pooled
	# connection a session-level lock outlives its client's transaction,
	# and its client, on a server connection the next client gets.
	my $a = client('transaction');
	ok($a->do("SELECT zk_lock('stranded')"), 'setting on: a session-level lock is taken');
	$a->disconnect;
	ok(!free_now('stranded'), 'and stays held on the server connection after its client left');

	my $g = client('guarded');
	ok(!$g->do("SELECT zk_lock('guarded_lock')"), 'setting off: zk_lock fails');
	is($g->state, '55000', 'with SQLSTATE 55000');
	like($g->errstr, qr/session-level zklocks are disabled/, 'saying session-level zklocks are disabled');
	like($g->errstr, qr/HINT:  Use the transaction-level functions/, 'pointing at the transaction-level functions');
	for my $call ("zk_try_lock('guarded_lock')", "zk_lock_shared('guarded_lock')",
		"zk_lock(ARRAY['guarded_lock'])", "zk_semaphore_acquire('guarded_slots', 2)")
	{
		ok(!$g->do("SELECT $call") && $g->state eq '55000', "setting off: $call fails");
	}
	ok(free_now('guarded_lock'), 'and leaves nothing held');
	$g->begin_work;
	ok($g->do("SELECT zk_xact_lock('guarded_lock')"), 'setting off: zk_xact_lock works');
	ok(!free_now('guarded_lock'), 'and holds the lock');
	$g->commit;
	ok(free_now('guarded_lock'), 'until COMMIT');
	$g->disconnect;

	# Stopping the pooler closes its server connections, which ends the
	# stranded lock.
	$bouncer->signal('TERM');
	$bouncer->finish;
	ok(wait_until('the stranded lock to end with its server connection',
			sub { free_now('stranded') }),
		'the stranded lock ends only with its server connection');
}

no_node_left($root, 'the poolers test');
done_testing();
