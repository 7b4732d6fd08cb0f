# Fail closed: work done under a lost lock never commits, whatever the
# lock's scope or mode and however the transaction ends.  A job holding a
# session-level lock is frozen past the session timeout while others take
# the lock; it cannot commit a write until it acknowledges the loss.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use ZkTest;

my $root = '/zklock_t015';
my %conf = (
	'zklock.session_timeout' => '4s',
	'zklock.connect_timeout' => '3s',
	'max_prepared_transactions' => 2);
my $east = zk_cluster('east', $root, %conf);
my $west = zk_cluster('west', $root, %conf);
$east->safe_psql('postgres', q{
	CREATE FUNCTION zk_test_session_credentials() RETURNS text
	AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
	CREATE TABLE work (what text);
	CREATE PROCEDURE insert_and_commit(what text) LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO work VALUES (what);
		COMMIT;
	END $$;
	CREATE FUNCTION insert_and_unlock(what text, name text) RETURNS boolean
	LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO work VALUES (what);
		RETURN zk_unlock(name);
	END $$;
	-- Work that COMMIT runs: one deferred trigger that runs a query, and
	-- one that runs none, only expressions.
	CREATE TABLE deferred_work (what text);
	CREATE FUNCTION sleep_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_sleep(30);
		RETURN NULL;
	END $$;
	CREATE CONSTRAINT TRIGGER sleeps AFTER INSERT ON deferred_work
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sleep_at_commit();
	CREATE TABLE busy_work (what text);
	CREATE FUNCTION busy_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
	DECLARE
		until timestamptz := clock_timestamp() + interval '6 s';
	BEGIN
		WHILE clock_timestamp() < until LOOP
		END LOOP;
		RETURN NULL;
	END $$;
	CREATE CONSTRAINT TRIGGER busy AFTER INSERT ON busy_work
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION busy_at_commit();
	CREATE EXTENSION postgres_fdw;});
$west->safe_psql('postgres', 'CREATE TABLE remote (what text)');
my ($west_host, $west_port) = ($west->host, $west->port);
$east->safe_psql('postgres', qq{
	CREATE SERVER west FOREIGN DATA WRAPPER postgres_fdw
		OPTIONS (host '$west_host', port '$west_port', dbname 'postgres');
	CREATE USER MAPPING FOR CURRENT_USER SERVER west;
	CREATE FOREIGN TABLE remote (what text) SERVER west});
my ($out, $err);

# The lost-session errors, as psql prints them with VERBOSITY verbose.
my $refused = qr/ERROR:  40000: cannot commit because zklock lost its ZooKeeper session\nDETAIL:  /;
my $cancelled = qr/ERROR:  57014: canceling statement because zklock lost its ZooKeeper session\nDETAIL:  /;

sub job
{
	my $s = zk_session($east);
	run_sql($s, '\set VERBOSITY verbose');
	return $s;
}

sub committed
{
	my ($what) = @_;
	return $east->safe_psql('postgres', "SELECT count(*) FROM work WHERE what = '$what'");
}

# Expire the job's session from outside, while it runs a statement that the
# loss must cancel; returns what that statement printed.
sub expire_while_running
{
	my ($s) = @_;
	my ($creds) = run_sql($s, 'SELECT zk_test_session_credentials()');
	send_query($s, "SELECT pg_sleep(20);");
	wait_until('the sleep to run', sub {
		$east->safe_psql('postgres',
			"SELECT wait_event FROM pg_stat_activity WHERE pid = $s->{zk_pid}") eq 'PgSleep'
	});
	ZkTest::zkinspect('expire', $creds);
	# All of the error, its DETAIL and HINT too, not what one read got.
	my (undef, $printed) = await_output_and_stderr($s, qr/ERROR/);
	return $printed;
}

# --- the headline: a job frozen past the session timeout -------------------
{
	my $j = job();
	my $w = zk_session($west);
	run_sql($j, "SELECT zk_lock('datastore_a')");
	($out) = run_sql($j, "SELECT zk_lock_token('datastore_a')");
	my $token = $out;
	kill 'STOP', $j->{zk_pid};
	my $t0 = time;
	($out, $err) = run_sql($w, "SELECT zk_lock('datastore_a', '20s')");
	is($out, 't', 'frozen: another cluster gets the lock once the session times out');
	cmp_ok(time - $t0, '<', 4 + 4, 'frozen: after about the session timeout');
	($out) = run_sql($w, "SELECT zk_lock_token('datastore_a') > $token, zk_unlock('datastore_a')");
	is($out, 't|t', 'frozen: with a larger fencing token, and lets it go');
	kill 'CONT', $j->{zk_pid};
	sleep 1;    # the job resumes and notices the loss while idle

	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('after freeze')");
	like($err, qr/$refused\QThis backend held these locks at session level, now lost: "datastore_a".\E/,
		'frozen: the job\'s next INSERT cannot commit, and says which lock was lost');
	like($err, qr/HINT:  No transaction that writes can commit until the loss is acknowledged/,
		'frozen: with a hint saying how to go on');
	is(committed('after freeze'), '0', 'frozen: nothing is committed');

	($out, $err) = run_sql($j, 'SELECT count(*) FROM work');
	is($out, '0', 'frozen: read-only work goes on');
	unlike($err, qr/ERROR/, 'frozen: without an error');
	($out, $err) = run_sql($j, "BEGIN; INSERT INTO work VALUES ('still lost'); COMMIT");
	like($err, $refused, 'frozen: an explicit transaction cannot commit either');
	($out, $err) = run_sql($j, "SELECT 'next'");
	is($out, 'next', 'frozen: the refused COMMIT ended the transaction, as a failed commit does');
	($out) = run_sql($j, 'SELECT state, locks_held, locks_lost FROM zk_status()');
	like($out, qr/^\w+\|0\|1$/, 'frozen: zk_status counts one lost lock not yet acknowledged');

	($out, $err) = run_sql($j, "SELECT zk_unlock('datastore_a')");
	is($out, 'f', 'frozen: zk_unlock of the lost lock returns false');
	like($err, qr/"datastore_a" was lost with the ZooKeeper session/, 'frozen: saying it was lost');
	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('acknowledged')");
	unlike($err, qr/ERROR/, 'frozen: once acknowledged, writes commit again');
	is(committed('acknowledged'), '1', 'frozen: and are committed');
	($out) = run_sql($j, 'SELECT locks_lost FROM zk_status()');
	is($out, '0', 'frozen: nothing is left to acknowledge');
	$_->quit for ($j, $w);
}

# --- frozen in the middle of a write ----------------------------------------
{
	my $j = job();
	run_sql($j, "SELECT zk_lock('datastore_b')");
	send_query($j, "INSERT INTO work SELECT 'slow write' FROM pg_sleep(10);");
	sleep 0.5;
	kill 'STOP', $j->{zk_pid};
	sleep 6;
	kill 'CONT', $j->{zk_pid};
	ok(await_output($j, qr/$cancelled\QThis backend held these locks at session level, now lost: "datastore_b".\E/),
		'frozen mid-write: the write is cancelled when the job resumes');
	is(committed('slow write'), '0', 'frozen mid-write: and not committed');
	$j->quit;
}

# --- a write queued while the job is frozen ---------------------------------
#
# The job reads the INSERT the moment it resumes, while its watchdog finds
# the loss: found while the INSERT runs, the loss cancels it (57014); found
# before, it refuses the INSERT's commit (40000).  Either way nothing
# commits.
{
	my $j = job();
	my $w = zk_session($west);
	run_sql($j, "SELECT zk_lock('datastore_q')");
	kill 'STOP', $j->{zk_pid};
	# psql sends it to the frozen backend while the other cluster waits.
	send_query($j, "INSERT INTO work VALUES ('queued while frozen');");
	($out) = run_sql($w, "SELECT zk_lock('datastore_q', '20s')");
	is($out, 't', 'frozen, write queued: another cluster gets the lock');
	kill 'CONT', $j->{zk_pid};
	ok(await_output($j,
			qr/(?:$cancelled|$refused)\QThis backend held these locks at session level, now lost: "datastore_q".\E/),
		'frozen, write queued: the write fails closed when the job resumes');
	is(committed('queued while frozen'), '0', 'frozen, write queued: and is not committed');
	run_sql($w, "SELECT zk_unlock('datastore_q')");
	$_->quit for ($j, $w);
}

# --- every mode of a session-level hold guards commits ----------------------
for my $case (
	[ 'exclusive', "SELECT zk_lock('mode_x')", '"mode_x"', "SELECT zk_unlock('mode_x')" ],
	[ 'shared', "SELECT zk_lock_shared('mode_s')", '"mode_s"', "SELECT zk_unlock_shared('mode_s')" ],
	[ 'semaphore', "SELECT zk_semaphore_acquire('mode_sem', 2)", '"mode_sem"',
		"SELECT zk_semaphore_release('mode_sem')" ],
	[ 'multi-lock', "SELECT zk_lock(ARRAY['mode_m1', 'mode_m2'])", '"mode_m\d", "mode_m\d"',
		"SELECT zk_unlock(ARRAY['mode_m1', 'mode_m2'])" ])
{
	my ($mode, $take, $names, $acknowledge) = @$case;
	my $j = job();
	run_sql($j, $take);
	my $printed = expire_while_running($j);
	like($printed, qr/${cancelled}This backend held these locks at session level, now lost: $names\./,
		"$mode: a loss cancels the running statement, naming the locks");
	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('$mode lost')");
	like($err, qr/${refused}This backend held these locks at session level, now lost: $names\./,
		"$mode: a write cannot commit after the loss");
	($out, $err) = run_sql($j, $acknowledge);
	like($out, qr/^f?$/, "$mode: releasing the lost hold acknowledges the loss");
	like($err, qr/lost/, "$mode: and says it was lost");
	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('$mode acknowledged')");
	unlike($err, qr/ERROR/, "$mode: then writes commit");
	is(committed("$mode lost") . committed("$mode acknowledged"), '01',
		"$mode: only the write after the acknowledgement is committed");
	$j->quit;
}

# --- every way a transaction ends -------------------------------------------
{
	$east->safe_psql('postgres', 'CREATE DATABASE kept_after_loss');
	my $j = job();
	run_sql($j, "SELECT zk_lock('ways')");
	run_sql($j, "SELECT zk_lock('ways_other')");
	expire_while_running($j);

	($out, $err) = run_sql($j, "CALL insert_and_commit('procedure')");
	like($err, $refused, 'a procedure\'s COMMIT is refused');
	($out, $err) = run_sql($j, "BEGIN; INSERT INTO work VALUES ('prepared'); PREPARE TRANSACTION 'lost_2pc'");
	like($err, $refused, 'PREPARE TRANSACTION is refused');
	is($east->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'), '0',
		'and nothing is prepared');
	($out, $err) = run_sql($j, "BEGIN; SAVEPOINT s; INSERT INTO work VALUES ('released'); RELEASE s; COMMIT");
	like($err, $refused, 'a released savepoint\'s write cannot commit either');
	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('multi 1'); INSERT INTO work VALUES ('multi 2')");
	like($err, $refused, 'nor a multi-statement query');
	($out, $err) = run_sql($j, "BEGIN; SELECT count(*) FROM work; COMMIT");
	unlike($err, qr/ERROR/, 'a read-only transaction commits');
	is(committed('procedure') . committed('prepared') . committed('released')
		  . committed('multi 1'), '0000', 'no write was committed');

	# postgres_fdw commits its remote transactions in a pre-commit callback
	# registered after zklock's: the checks at COMMIT and at the end of an
	# autocommit statement run before it.
	($out, $err) = run_sql($j, "INSERT INTO remote VALUES ('fdw autocommit')");
	like($err, $refused, 'an autocommit write to a foreign table is refused');
	($out, $err) = run_sql($j, "BEGIN; INSERT INTO remote VALUES ('fdw block'); INSERT INTO work VALUES ('fdw block'); COMMIT");
	like($err, $refused, 'a transaction writing to a foreign table cannot commit');
	is($west->safe_psql('postgres', 'SELECT count(*) FROM remote'), '0',
		'and the remote server committed nothing');
	is(committed('fdw block'), '0', 'nor did the local one');

	# Acknowledging the loss in the transaction that wrote under it does
	# not let that work commit.
	($out, $err) = run_sql($j, "BEGIN; INSERT INTO work VALUES ('acknowledged inside'); SELECT zk_unlock_all(); COMMIT");
	like($err, qr/${refused}This transaction wrote, and acknowledged the loss of these locks held at session level: "ways", "ways_other"|${refused}This transaction wrote, and acknowledged the loss of these locks held at session level: "ways_other", "ways"/,
		'a transaction that writes and then acknowledges the loss cannot commit');
	is(committed('acknowledged inside'), '0', 'and its write is not committed');
	# The rollback does not undo the acknowledgement: take two new locks
	# and lose them again for the cases below.
	run_sql($j, "SELECT zk_lock('ways'), zk_lock('ways_other')");
	expire_while_running($j);
	($out, $err) = run_sql($j, "SELECT insert_and_unlock('function', 'ways')");
	like($err, $refused, 'nor a function that writes, then unlocks the lost lock');
	is(committed('function'), '0', 'whose write is not committed');
	($out, $err) = run_sql($j, "TRUNCATE remote");
	like($err, $refused, 'a TRUNCATE of a foreign table is a write too');
	($out, $err) = run_sql($j, "DROP DATABASE kept_after_loss");
	like($err, $refused, 'a statement that cannot run in a transaction is checked before it runs');
	my (undef, $whole) = $east->psql('kept_after_loss', 'SELECT 1');
	is($whole, '1', 'and has done nothing: the database it would drop is whole');

	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('one left')");
	like($err, qr/${refused}This backend held these locks at session level, now lost: "ways_other"\./,
		'a loss stays until every lost lock is acknowledged');
	run_sql($j, 'SELECT zk_unlock_all()');
	($out, $err) = run_sql($j, "INSERT INTO remote VALUES ('fdw after')");
	unlike($err, qr/ERROR/, 'zk_unlock_all() acknowledges them all');
	is($west->safe_psql('postgres', 'SELECT count(*) FROM remote'), '1',
		'and the remote write is committed');
	$j->quit;
}

# --- COMMIT PREPARED ---------------------------------------------------------
{
	my $j = job();
	run_sql($j, "SELECT zk_lock('two_phase')");
	run_sql($j, "BEGIN; INSERT INTO work VALUES ('prepared, then lost'); PREPARE TRANSACTION 'p_lost'");
	expire_while_running($j);
	($out, $err) = run_sql($j, "COMMIT PREPARED 'p_lost'");
	like($err, qr/ERROR:  55000: cannot commit prepared transaction "p_lost" because zklock lost its ZooKeeper session\nDETAIL:  This backend held these locks, now lost: "two_phase"\./,
		'COMMIT PREPARED in a backend with an unacknowledged loss is refused');
	like($err, qr/HINT:  The transaction stays prepared\.  Roll it back with ROLLBACK PREPARED/,
		'COMMIT PREPARED: saying what to do with it');
	is(committed('prepared, then lost'), '0', 'COMMIT PREPARED: nothing is committed');
	is($east->safe_psql('postgres', "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'p_lost'"),
		'1', 'COMMIT PREPARED: the transaction stays prepared');
	($out, $err) = run_sql($j, "ROLLBACK PREPARED 'p_lost'");
	unlike($err, qr/ERROR/, 'COMMIT PREPARED: it can be rolled back');
	run_sql($j, "SELECT zk_unlock('two_phase')");

	run_sql($j, "SELECT zk_lock('two_phase')");
	run_sql($j, "BEGIN; INSERT INTO work VALUES ('prepared, held'); PREPARE TRANSACTION 'p_held'");
	($out, $err) = run_sql($j, "COMMIT PREPARED 'p_held'");
	unlike($err, qr/ERROR/, 'COMMIT PREPARED under a held lock commits');
	is(committed('prepared, held'), '1', 'COMMIT PREPARED: what it prepared');
	run_sql($j, "SELECT zk_unlock('two_phase')");
	$j->quit;
}

# --- work that COMMIT runs stays under the loss cancel and the lease --------
#
# Deferred triggers and WITH HOLD cursors run at COMMIT, before the commit
# check: a lease runs out during them, and a loss cancels their queries.
for my $case (
	[ 'a deferred trigger', "INSERT INTO deferred_work VALUES ('deferred')" ],
	[ 'a WITH HOLD cursor', 'DECLARE held CURSOR WITH HOLD FOR SELECT pg_sleep(30)' ])
{
	my ($what, $work) = @$case;
	my $j = job();
	my $w = zk_session($west);
	run_sql($j, "SET zklock.lease = '4s'");
	run_sql($j, "BEGIN; SELECT zk_xact_lock('commit_work'); $work");
	my $started = time;
	send_query($j, "COMMIT;");
	($out) = run_sql($w, "SELECT zk_lock('commit_work', '25s')");
	is($out, 't', "$what: another cluster is granted the lock while COMMIT runs it");
	ok(await_output($j, qr/(?:$cancelled|$refused)The transaction held these locks, now lost: "commit_work"\.  A lock was held past its lease/),
		"$what: COMMIT fails, the lease having run out");
	cmp_ok(time - $started, '<', 20, "$what: long before the work would have ended");
	($out, $err) = run_sql($j, 'FETCH held');
	like($err, qr/cursor "held" does not exist/, "$what: no cursor is kept");
	is($east->safe_psql('postgres', "SELECT count(*) FROM deferred_work"), '0',
		"$what: no row is committed");
	run_sql($w, "SELECT zk_unlock('commit_work')");
	$_->quit for ($j, $w);
}

# A loss while COMMIT's work runs no query cancels nothing; the commit check
# then comes before postgres_fdw commits its remote transaction, though
# postgres_fdw registered its callback after zklock's.
{
	my $j = job();
	run_sql($j, "SET zklock.lease = '3s'");
	run_sql($j, "SELECT zk_lock('fdw_commit')");
	($out, $err) = run_sql($j, "BEGIN; INSERT INTO remote VALUES ('fdw at commit');
		INSERT INTO busy_work VALUES ('fdw at commit'); COMMIT");
	like($err, qr/${refused}This backend held these locks at session level, now lost: "fdw_commit"\.  A lock was held past its lease/,
		'postgres_fdw: a loss while COMMIT runs a deferred trigger refuses the commit');
	is($west->safe_psql('postgres', "SELECT count(*) FROM remote WHERE what = 'fdw at commit'"), '0',
		'postgres_fdw: and the remote transaction is not committed');
	is($east->safe_psql('postgres', "SELECT count(*) FROM busy_work"), '0',
		'postgres_fdw: nor the local one');
	run_sql($j, 'SELECT zk_unlock_all()');
	$j->quit;
}

# --- a release in a transaction that wrote ----------------------------------
#
# The release is not proof that the lock was held when the write was done:
# the session may be cut off, its loss not yet known.  The commit confirms
# the session that held the lock.
{
	my ($proxy, $proxy_port, $control) = start_proxy();
	my $j = job();
	run_sql($j, "SET zklock.hosts = '127.0.0.1:$proxy_port'");
	run_sql($j, "SET zklock.session_timeout = '6s'");
	ok(wait_until('the proxy to listen',
			sub { (run_sql($j, "SELECT zk_try_lock('released')"))[0] eq 't' }),
		'released: a lock is taken through the proxy');
	sleep 2.5;    # the leader last heard from the session over a sixth of its timeout ago
	run_sql($j, "BEGIN; INSERT INTO work VALUES ('released, cut')");
	PostgreSQL::Test::Utils::append_to_file("$control/blackhole", '');
	($out, $err) = run_sql($j, "SELECT zk_unlock('released')");
	is($out, 't', 'released: the unlock returns before the cut is known');
	($out, $err) = run_sql($j, 'COMMIT');
	like($err, qr/${refused}This transaction wrote, then released a lock held at session level, and the ZooKeeper session that held it cannot be confirmed now/,
		'released: the COMMIT that follows is refused once the session is lost');
	is(committed('released, cut'), '0', 'released: nothing is committed');
	unlink "$control/blackhole";

	# The delete never reached ZooKeeper: the node goes when the cut-off
	# session expires.
	($out, $err) = run_sql($j, "SELECT zk_lock('released', '20s')");
	is($out, 't', 'released: the lock is taken again on a new session');
	run_sql($j, "BEGIN; INSERT INTO work VALUES ('released, held')");
	($out, $err) = run_sql($j, "SELECT zk_unlock('released'); COMMIT");
	unlike($err, qr/ERROR/, 'released: with the session confirmed, the COMMIT goes on');
	is(committed('released, held'), '1', 'released: and commits');
	$j->quit;
	$proxy->kill_kill;
}

# --- zklock.fail_closed = off: session-level losses are only reported ------
{
	my $j = job();
	run_sql($j, "SET zklock.fail_closed = off");
	run_sql($j, "SELECT zk_lock('relaxed')");
	my ($creds) = run_sql($j, 'SELECT zk_test_session_credentials()');
	ZkTest::zkinspect('expire', $creds);
	ok(zk_wait_contenders("$root/relaxed", 0), 'fail_closed off: the session expires');
	($out, $err) = run_sql($j, "SELECT 'not cancelled' FROM pg_sleep(2)");
	is($out, 'not cancelled', 'fail_closed off: a session-level loss cancels nothing');
	($out, $err) = run_sql($j, "INSERT INTO work VALUES ('relaxed')");
	unlike($err, qr/ERROR/, 'fail_closed off: nor does it stop a write');
	is(committed('relaxed'), '1', 'fail_closed off: which commits');
	($out, $err) = run_sql($j, "SELECT zk_unlock('relaxed')");
	like($err, qr/WARNING:  01000: zklock lost its ZooKeeper session\nDETAIL:  These locks were held, and are lost: "relaxed"\./,
		'fail_closed off: the loss is reported at the next zklock call');

	run_sql($j, "BEGIN; SELECT zk_xact_lock('strict')");
	my $printed = expire_while_running($j);
	like($printed, qr/${cancelled}The transaction held these locks, now lost: "strict"\./,
		'fail_closed off: a transaction-level loss still cancels');
	run_sql($j, 'ROLLBACK');

	my $u = job();
	run_sql($u, 'CREATE ROLE plain LOGIN');
	run_sql($u, 'SET ROLE plain');
	($out, $err) = run_sql($u, 'SET zklock.fail_closed = off');
	like($err, qr/ERROR:  42501: permission denied to set parameter "zklock.fail_closed"/,
		'fail_closed: only a superuser may turn it off');
	$_->quit for ($j, $u);
}

# --- a live session-level lock: COMMIT checks with the leader ---------------
{
	my @servers = split /,/, $ZkTest::hosts;
	my $leader = zk_ensemble('leader');
	chomp $leader;
	my ($follower) = grep { $_ != $leader } (1, 2, 3);
	my $f = job();
	run_sql($f, "SET zklock.hosts = '$servers[$follower - 1]'");
	run_sql($f, "SET zklock.session_timeout = '9s'");
	run_sql($f, "SELECT zk_lock('leaderless')");
	sleep 4;    # past a sixth of the timeout since the create
	zk_ensemble('pause', $leader);
	send_query($f, "INSERT INTO work VALUES ('leaderless');\nSELECT 'after insert';");
	ok(still_waiting($east, $f, qr/after insert/,
			statement => qr/^INSERT INTO work VALUES \('leaderless'\);?$/, seconds => 1),
		'leader paused: a write under a session-level lock waits for the leader');
	zk_ensemble('resume', $leader);
	ok(await_output($f, qr/after insert/), 'leader paused: and goes on once it answers');
	is(committed('leaderless'), '1', 'leader paused: having committed');
	($out) = run_sql($f, "SELECT zk_unlock('leaderless')");
	is($out, 't', 'leader paused: the lock was held throughout');
	zk_ensemble('wait-quorum');
	$f->quit;
}

done_testing();
