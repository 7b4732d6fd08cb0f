# A good neighbour on a shared ensemble: nothing an ordinary role does
# breaks the ensemble or keeps other roles from it.
#
# On an ensemble of its own (ZooKeeper's default jute.maxbuffer), restarted
# in the middle with maxClientCnxns low:
#   - the budget of nodes per backend: an ordinary role goes over it by
#     names, by an array and by semaphore slots, and is refused each time;
#     its backends are then killed holding all they were allowed, and the
#     ensemble serves others throughout and survives a restart of every
#     server.  ZKLOCK_NEIGHBOUR_BUDGET=raised lifts the budget far above
#     the default for that role, and this part must then fail: the record
#     of the session's close is past jute.maxbuffer (ZOOKEEPER-4306);
#   - what a deadlock check costs with a crowded queue, and a check that
#     cannot finish in its time, put off ever longer until it does;
#   - idle sessions closed, so that one role's idle backends do not use up
#     the ensemble's connections, and a refused connection said so.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use ZkTest;

my $raised = ($ENV{ZKLOCK_NEIGHBOUR_BUDGET} // '') eq 'raised';
my $root = '/zklock_t023';

# --- an ensemble of this test's own -----------------------------------------
my ($main_port) = $ENV{ZKLOCK_TEST_HOSTS} =~ /^[^:]+:(\d+)/;
my $base = $main_port - 1 + 100;
my $ensemble = PostgreSQL::Test::Utils::tempdir();
my $max_cnxns = '';

sub own_ensemble
{
	my (@args) = @_;
	my ($stdout, $stderr);
	local $ENV{ZK_BASE_PORT} = $base;
	local $ENV{ZK_MAX_CLIENT_CNXNS} = $max_cnxns;
	local $ENV{ZK_START_TIMEOUT} = 40;
	IPC::Run::run([ "$ENV{ZKLOCK_SRC}/scripts/zk-ensemble", $ensemble, @args ],
		'>', \$stdout, '2>', \$stderr)
	  or die "zk-ensemble @args failed: $stderr";
	return (split /\n/, $stdout)[-1];
}
my $own_hosts = own_ensemble('start');
END { own_ensemble('stop') if defined $own_hosts; }
$ZkTest::hosts = $own_hosts;

my $node = zk_cluster('neighbour', $root,
	'zklock.session_timeout' => "'2s'",
	'zklock.connect_timeout' => "'2s'",
	'zklock.idle_session_timeout' => "'2s'",
	'max_connections' => 60);
$node->safe_psql('postgres', q{
	CREATE ROLE plain LOGIN;
	CREATE ROLE other LOGIN;
	CREATE FUNCTION zk_test_delay_deadlock_confirmation(int) RETURNS void
	AS '$libdir/zklock', 'zk_test_delay_deadlock_confirmation' LANGUAGE C;
	CREATE FUNCTION zk_test_deadlock_check_time(int) RETURNS void
	AS '$libdir/zklock', 'zk_test_deadlock_check_time' LANGUAGE C});
$node->safe_psql('postgres', q{
	ALTER ROLE plain SET zklock.max_session_nodes = 100000;
	ALTER ROLE plain SET zklock.max_session_path_bytes = '64MB'}) if $raised;
my ($out, $err);

sub verbose_session
{
	my ($user) = @_;
	my $s = zk_session($node, 'postgres', $user);
	$s->query_safe('\set VERBOSITY verbose');
	return $s;
}

# The locks and slots a session holds, as it counts them itself.
sub held_by
{
	my ($s) = @_;
	my ($held) = run_sql($s, 'SELECT locks_held FROM zk_status()');
	return $held;
}

# --- the budget: by names, by an array, by semaphore slots -------------------
#
# Names of 240 '~' and a number: each '~' is three bytes in the node's path
# (%7E), so each path is about 800 bytes, and 2,700 of them make a record
# of some 2.2 MB when the session ends.
my $long = q{repeat('~', 240) || i};
my $names = verbose_session('plain');
($out, $err) = run_sql($names,
	"DO \$\$ BEGIN FOR i IN 1..2700 LOOP PERFORM zk_lock($long); END LOOP; END \$\$");
like($err, qr/ERROR:  53400: too many bytes of zklock node paths for this backend/,
	'budget: names past the budget of path bytes are refused (53400)');
like($err, qr/HINT:  .*zklock\.max_session_path_bytes/, 'budget: the hint names the setting');
my $held = held_by($names);
cmp_ok($held, '>', 250, "budget: the names within it are held ($held)");
cmp_ok($held, '<', 400, 'budget: and no more');
is(scalar(ZkTest::zk_lock_nodes($root)), $held,
	'budget: the refused name left no node behind');

($out, $err) = run_sql($names,
	q{SELECT zk_lock(ARRAY['one more ' || repeat('~', 240), 'and another ' || repeat('~', 240)])});
like($err, qr/ERROR:  53400: too many bytes of zklock node paths/,
	'budget: an array of names past it is refused too');
is(held_by($names), $held, 'budget: and takes nothing');
($out, $err) = run_sql($names, "SELECT zk_lock_shared(repeat('~', 240) || 2)");
like($err, qr/ERROR:  53400: too many bytes of zklock node paths/,
	'budget: so is the other mode of a name it holds, a node of its own');
is(held_by($names), $held, 'budget: which takes nothing either');
($out, $err) = run_sql($names, "SELECT zk_unlock(repeat('~', 240) || 1)");
is("$out$err", 't', 'budget: the backend goes on working, and can let a name go');
($out, $err) = run_sql($names, "SELECT zk_lock(repeat('~', 240) || 1)");
is($err, '', 'budget: which makes room for one again');

my $slots = verbose_session('plain');
($out, $err) = run_sql($slots,
	"DO \$\$ BEGIN FOR i IN 1..1100 LOOP PERFORM zk_semaphore_acquire('slots', 10000); END LOOP; END \$\$");
like($err, qr/ERROR:  53400: too many zklock nodes for this backend/,
	'budget: semaphore slots past the budget of nodes are refused');
like($err, qr/HINT:  .*zklock\.max_session_nodes/, 'budget: the hint names that setting');
is(held_by($slots), '1000', 'budget: the backend holds the 1000 slots it may');
my ($slots_held) = run_sql($slots, "SELECT count(*) FROM zk_semaphore_contenders('slots')");
is($slots_held, '1000', 'budget: and the refused slot left no node');

# Killed holding all of it: the ensemble ends the two sessions, each in
# one record that lists every path, and must go on serving.
my @killed = ($names->{zk_pid}, $slots->{zk_pid});
kill 'KILL', @killed;
$_->{run}->kill_kill for ($names, $slots);
# restart_after_crash is off in test clusters: bring it back.
wait_until('the cluster to shut down', sub { !-e $node->data_dir . '/postmaster.pid' });
$node->stop('immediate', fail_ok => 1);
$node->start;
ok(wait_until('the killed sessions to expire and their nodes to go',
		sub { my @left = eval { ZkTest::zk_lock_nodes($root) }; !$@ && !@left }, 60),
	'budget: the killed backends\' sessions end, and their nodes go');
my $o = verbose_session('other');
($out, $err) = run_sql($o, "SELECT zk_lock('after_the_kill'), zk_unlock('after_the_kill')");
is("$out$err", '|t', 'budget: the ensemble serves another role meanwhile');
$o->quit;
own_ensemble('stop');
ok(eval { own_ensemble('start'); 1 }, 'budget: every server starts again')
  or diag($@);
$o = verbose_session('other');
($out, $err) = run_sql($o, "SELECT zk_lock('after_the_restart'), zk_unlock('after_the_restart')");
is("$out$err", '|t', 'budget: and the ensemble serves once restarted');
$o->quit;
# With the budget raised, the ensemble is broken for good: nothing after
# this part could pass.
if ($raised)
{
	$node->stop('immediate');
	done_testing();
	exit;
}

# --- a delete the servers refuse -------------------------------------------
#
# A parent that lets zklock create but not delete: the released node would
# stay, held for nobody and out of the budget's count.  The session is
# ended instead, which deletes it.
{
	local $ENV{ZKINSPECT_AUTH} = 'owner:owner-pw';
	ZkTest::zkinspect('create', "$root/undeletable");
	ZkTest::zkinspect('set-acl', "$root/undeletable", 'crw');
}
{
	my $d = verbose_session('plain');
	($out, $err) = run_sql($d, "SELECT zk_lock('undeletable')");
	is($err, '', 'refused delete: a lock under a parent that denies zklock DELETE');
	($out, $err) = run_sql($d, "SELECT zk_unlock('undeletable')");
	is("$out$err", 't', 'refused delete: released');
	ok(wait_until('the node to be gone', sub { !ZkTest::zk_children("$root/undeletable") }),
		'refused delete: the session is ended, and its node goes with it');
	($out, $err) = run_sql($d, "SELECT zk_try_lock('after_refusal') AND zk_unlock('after_refusal')");
	like($err, qr/WARNING:  01000: zklock ended its ZooKeeper session\nDETAIL:  ZooKeeper refused to delete lock node "\Q$root\E\/undeletable\/[^"]+" \(not authenticated\)/,
		'refused delete: the next call says why');
	is($out, 't', 'refused delete: and locks on a new session');
	$d->quit;
}

# --- what a deadlock check costs ----------------------------------------------
#
# Twenty readers hold a name; ten writers queue behind them, each waiting
# for every reader and every writer ahead.  The last writer's check reads
# the queue once (a listing and a stat per contender) and each blocking
# session's published wait once: about 60 requests, where reading the
# readers' waits again for every writer it follows cost about 240.
{
	my @readers = map { zk_session($node) } 1 .. 20;
	run_sql($_, "SELECT zk_lock_shared('crowded')") for @readers;
	my @writers = map { zk_session($node) } 1 .. 10;
	for my $w (@writers)
	{
		$w->query_safe("SET zklock.deadlock_timeout = '200ms'");
		$w->query_safe("SET client_min_messages = debug1");
	}
	my $waits_published = sub {
		my ($n) = @_;
		return published_waits($root) == $n;
	};
	for my $i (0 .. 8)
	{
		send_query($writers[$i], "SELECT 'writer granted' FROM zk_lock('crowded');");
		ok(wait_until("writer $i to publish its wait", sub { $waits_published->($i + 1) }),
			"cost: writer $i waits, its wait published");
	}
	my $last = $writers[9];
	$last->{stderr} = '';
	send_query($last, "SELECT 'last granted' FROM zk_lock('crowded');");
	my $cost;
	ok(wait_until('the last writer\'s check',
			sub {
				$last->{run}->pump_nb;
				($cost) = $last->{stderr} =~ /zklock deadlock check: (\d+) requests, \d+ ms, (\d+) waiting sessions, no cycle/;
				defined $cost;
			}),
		'cost: the last writer checks for a deadlock, and finds none');
	my ($members) = $last->{stderr} =~ /zklock deadlock check: \d+ requests, \d+ ms, (\d+) waiting sessions/;
	note("one check, 20 readers and 10 writers queued: $cost requests, $members waiting sessions");
	is($members, 10, 'cost: it follows every writer');
	# Its own wait published (1), the queue (1 + 30), the 29 other sessions.
	cmp_ok($cost, '<=', 1 + 1 + 30 + 29 + 2,
		'cost: it reads the queue and each blocking session\'s wait once');
	run_sql($_, 'SELECT zk_unlock_all()') for @readers;
	for my $w (@writers)
	{
		ok(await_output($w, qr/granted/), 'cost: the writers are granted in turn');
		run_sql($w, 'SELECT zk_unlock_all()');
	}
	$_->quit for (@readers, @writers);
}

# --- a check that does not fit in its time ----------------------------------
#
# A two-cycle; the younger member's checks have 50 ms, and each pauses
# 100 ms between finding the cycle and reading it again: the first two
# run out of time.  Each check put off waits twice as long as the one
# before, and has twice the time: the cycle is found all the same.
{
	my ($a, $b) = (verbose_session(), verbose_session());
	run_sql($a, "SET zklock.deadlock_timeout = '200ms'; SELECT zk_lock('cycle_a')");
	run_sql($b, "SET zklock.deadlock_timeout = '200ms'; SELECT zk_lock('cycle_b')");
	run_sql($b, 'SELECT zk_test_deadlock_check_time(50), zk_test_delay_deadlock_confirmation(100)');
	run_sql($b, 'SET log_min_messages = debug1');
	my $waits_before = () = published_waits($root);
	send_query($a, "SELECT 'a granted' FROM zk_lock('cycle_b');");
	ok(wait_until('A\'s wait to be published',
			sub { (() = published_waits($root)) > $waits_before }),
		'slow check: A waits first, its wait published');
	my $log_start = -s $node->logfile;
	send_query($b, "SELECT 'b granted' FROM zk_lock('cycle_a');");
	ok(wait_until('B to be the victim',
			sub { $b->{run}->pump_nb; $b->{stderr} =~ /ERROR:  40P01: deadlock detected/ }, 60),
		'slow check: the cycle is found, B the victim');
	# Session-level holds outlive the victim's wait, as advisory locks do.
	run_sql($b, 'SELECT zk_unlock_all()');
	ok(await_output($a, qr/a granted/), 'slow check: A goes on once B lets go');
	my @checks;
	for my $line (split /\n/, slurp_file($node->logfile, $log_start))
	{
		next unless $line =~ /^(\d+-\d+-\d+ (\d+):(\d+):([\d.]+)) .*\[$b->{zk_pid}\].*zklock deadlock check: \d+ requests, \d+ ms, \d+ waiting sessions, (.*)$/;
		push @checks, { at => $2 * 3600 + $3 * 60 + $4, result => $5 };
	}
	my @unfinished = grep { $_->{result} eq 'unfinished' } @checks;
	cmp_ok(scalar @unfinished, '>=', 2, 'slow check: checks ran out of time first');
	is($checks[-1]{result}, 'a cycle', 'slow check: the last found the cycle');
	# A check put off k times waits 200 ms << k before the next one.
	my $spaced = 1;
	for my $k (1 .. $#checks)
	{
		my $gap = $checks[$k]{at} - $checks[ $k - 1 ]{at};
		$spaced &&= $gap >= 0.9 * 0.2 * 2**$k;
		note(sprintf('check %d: %s, %.3f s after the one before', $k, $checks[$k]{result}, $gap));
	}
	ok($spaced, 'slow check: each check put off waits twice as long as the one before');
	run_sql($a, 'SELECT zk_unlock_all()');
	$_->quit for ($a, $b);
}

# --- idle sessions and the ensemble's connections ----------------------------
#
# Two connections per client host on each of three servers: six sessions
# from 127.0.0.1 at most.  Six idle backends of one role take them all.
$node->stop;
$max_cnxns = 2;
own_ensemble('stop');
own_ensemble('start');
$node->start;
{
	$node->safe_psql('postgres', 'ALTER ROLE plain SET zklock.idle_session_timeout = 0');
	my @idle = map { zk_session($node, 'postgres', 'plain') } 1 .. 6;
	for my $i (0 .. 5)
	{
		($out, $err) = run_sql($idle[$i], "SELECT zk_try_lock('idle_$i') AND zk_unlock('idle_$i')");
		is("$out$err", 't', "connections: idle backend $i locked once");
	}
	my $o = verbose_session('other');
	my $started = time;
	($out, $err) = run_sql($o, "SELECT zk_try_lock('other_lock')");
	like($err, qr/ERROR:  08004: ZooKeeper at "[^"]+" refused the connection/,
		'connections: with the idle sessions kept, another role is refused (08004)');
	like($err, qr/HINT:  .*maxClientCnxns.*zklock\.idle_session_timeout/,
		'connections: the hint names maxClientCnxns and zklock.idle_session_timeout');
	unlike($err, qr/connect_timeout/, 'connections: not the connect timeout');
	$_->quit for @idle;
	$o->quit;

	# Idle sessions closed after zklock.idle_session_timeout (2 s here).
	$node->safe_psql('postgres', 'ALTER ROLE plain RESET zklock.idle_session_timeout');
	@idle = map { zk_session($node, 'postgres', 'plain') } 1 .. 6;
	my @ids;
	for my $i (0 .. 5)
	{
		($out) = run_sql($idle[$i],
			"SELECT zk_try_lock('idle_$i') AND zk_unlock('idle_$i')");
		($ids[$i]) = run_sql($idle[$i], 'SELECT session_id FROM zk_status()');
	}
	my $pids = join(',', map { $_->{zk_pid} } @idle);
	ok(wait_until('the idle sessions to be closed',
			sub { $node->safe_psql('postgres',
					"SELECT count(*) FROM zk_sessions WHERE pid IN ($pids) AND state = 'closed'") eq '6' }),
		'connections: sessions that hold nothing are closed once idle');
	$o = verbose_session('other');
	($out, $err) = run_sql($o, "SELECT zk_lock('other_lock')");
	is($err, '', 'connections: and another role locks then');
	($out, $err) = run_sql($idle[0], "SELECT zk_try_lock('idle_again') AND zk_unlock('idle_again')");
	is("$out$err", 't', 'connections: a backend whose session was closed locks again');
	($out) = run_sql($idle[0], 'SELECT session_id FROM zk_status()');
	isnt($out, $ids[0], 'connections: on a new session');

	# A backend that holds a lock keeps its session past the idle time.
	run_sql($idle[1], "SELECT zk_lock('kept')");
	sleep 3;
	is($node->safe_psql('postgres',
			"SELECT state FROM zk_sessions WHERE pid = $idle[1]->{zk_pid}"),
		'connected', 'connections: a holder keeps its session past the idle time');
	($out) = run_sql($o, "SELECT zk_try_lock('kept')");
	is($out, 'f', 'connections: and its lock');
	run_sql($idle[1], "SELECT zk_unlock('kept')");
	run_sql($o, 'SELECT zk_unlock_all()');
	$_->quit for (@idle, $o);
}

$node->stop;
done_testing();
