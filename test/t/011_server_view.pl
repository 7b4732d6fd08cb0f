# The server-wide view: with zklock preloaded, zk_locks shows every backend's
# holds and waits, zk_blockers names who blocks a waiter (from any cluster),
# zk_stat_locks adds up every backend's counters; without preloading, each
# backend sees only itself.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $root = '/zklock_t011';
my $east = zk_cluster('east', $root);
my $west = zk_cluster('west', $root);
my ($out, $err);

sub query
{
	my ($node, $sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# --- holds and waits of other backends -------------------------------------
my $h = zk_session($east);
my $w = zk_session($east);
run_sql($h, "SELECT zk_lock('view_x'); SELECT zk_lock('view_x'); BEGIN; SELECT zk_xact_lock_shared('view_y')");
send_query($w, "SELECT 'w granted' FROM zk_lock('view_x');");
ok(wait_for_zk_wait($east, $w->{zk_pid}), 'a backend waits for a lock another holds');
ok(wait_until('the waiting node to be shown',
		sub { query($east, "SELECT count(*) FROM zk_locks WHERE pid = $w->{zk_pid} AND node IS NOT NULL") eq '1' }),
	'the waiter shows its node once it has one');

# A monitoring role, no superuser, reads every view, as it reads pg_locks.
query($east, 'CREATE ROLE mon LOGIN IN ROLE pg_monitor');
for my $view (qw(zk_locks zk_stat_locks zk_lock_activity zk_sessions))
{
	my ($rc, $stdout, $stderr) = $east->psql('postgres', "SELECT count(*) > 0 FROM $view",
		extra_params => [ '-U', 'mon' ]);
	is("$rc|$stdout|$stderr", '0|t|', "a pg_monitor member reads $view");
}
is($east->safe_psql('postgres', "SELECT count(*) FROM zk_locks WHERE pid = $h->{zk_pid}",
		extra_params => [ '-U', 'mon' ]),
	'2', 'and sees another backend\'s holds there');

is(query($east, "SELECT name, mode, scope, holds, state, database, token > 0, held_since IS NOT NULL
	FROM zk_locks WHERE pid = $h->{zk_pid} ORDER BY name, scope"),
	"view_x|exclusive|session|2|held|postgres|t|t\nview_y|shared|transaction|1|held|postgres|t|t",
	'a third backend sees the holder\'s locks, with its pid and database');
is(query($east, "SELECT name, mode, scope, holds, state, waiting_since IS NOT NULL, held_since IS NULL,
	node LIKE '$root/view_x/_c_%-lock-%'
	FROM zk_locks WHERE pid = $w->{zk_pid}"),
	'view_x|exclusive|session|0|waiting|t|t|t',
	'and the waiter, as waiting, since when, with its node');

my $east_port = $east->port;
is(query($east, "SELECT name, mode, holds, client, port, pid, host IS NOT NULL, identity LIKE 'pid $h->{zk_pid} on %'
	FROM zk_blockers($w->{zk_pid})"),
	"view_x|exclusive|t|zklock|$east_port|$h->{zk_pid}|t|t",
	'zk_blockers names the holder');
is(query($east, "SELECT count(*) FROM zk_blockers($h->{zk_pid})"), '0',
	'a backend that does not wait has no blockers');

run_sql($h, "SELECT zk_unlock('view_x'); SELECT zk_unlock('view_x')");
ok(await_output($w, qr/w granted/), 'the waiter is granted');
is(query($east, "SELECT state, holds FROM zk_locks WHERE pid = $w->{zk_pid}"), 'held|1',
	'and shows as holding');
run_sql($h, 'COMMIT');
is(query($east, "SELECT count(*) FROM zk_locks WHERE pid = $h->{zk_pid}"), '0',
	'released holds are no longer shown');
$w->quit;
ok(wait_until('the exited backend\'s rows to go',
		sub { query($east, "SELECT count(*) FROM zk_locks WHERE pid = $w->{zk_pid}") eq '0' }),
	'nor are an exited backend\'s');

# --- a blocker on another cluster --------------------------------------------
{
	my $far = zk_session($west);
	my $near = zk_session($east);
	run_sql($far, "SELECT zk_lock('view_far')");
	send_query($near, "SELECT 'near granted' FROM zk_lock('view_far');");
	ok(wait_for_zk_wait($east, $near->{zk_pid}), 'a backend waits for a lock held on another cluster');
	my $west_port = $west->port;
	ok(wait_until('the waiter to show its node',
			sub { query($east, "SELECT count(*) FROM zk_blockers($near->{zk_pid})") eq '1' }),
		'zk_blockers sees the queue');
	is(query($east, "SELECT port, pid, holds FROM zk_blockers($near->{zk_pid})"),
		"$west_port|$far->{zk_pid}|t",
		'and names the holder on the other cluster, by port and pid');
	run_sql($far, "SELECT zk_unlock('view_far')");
	ok(await_output($near, qr/near granted/), 'the waiter is granted');
	run_sql($near, "SELECT zk_unlock('view_far')");
	$_->quit for ($far, $near);
}

# --- counters add up across backends ---------------------------------------
{
	query($east, 'SELECT zk_stat_locks_reset()');
	is(query($east, 'SELECT count(*) FROM zk_stat_locks'), '0', 'zk_stat_locks_reset empties the statistics');
	my @s = map { zk_session($east) } 1 .. 3;
	for my $s (@s)
	{
		run_sql($s, "SELECT zk_lock('counted'), zk_unlock('counted')") for 1 .. 4;
	}
	run_sql($s[0], "SELECT zk_lock('counted')");
	run_sql($s[1], "SELECT zk_lock('counted', '1s')");
	send_query($s[2], "SELECT 'third granted' FROM zk_lock('counted');");
	ok(wait_for_zk_wait($east, $s[2]->{zk_pid}), 'a third backend waits');
	run_sql($s[0], "SELECT zk_unlock('counted')");
	ok(await_output($s[2], qr/third granted/), 'and is granted');
	run_sql($s[2], "SELECT zk_unlock('counted')");

	my $backend_sum = 0;
	for my $s (@s)
	{
		($out) = run_sql($s, 'SELECT acquisitions FROM zk_status()');
		$backend_sum += $out;
	}
	is(query($east, "SELECT acquisitions, waits, timeouts, wait_time_ms > 0 FROM zk_stat_locks WHERE name = 'counted'"),
		"$backend_sum|2|1|t",
		'zk_stat_locks adds up every backend\'s acquisitions, waits and timeouts');
	is($backend_sum, 14, 'fourteen acquisitions in all');
	is(query($west, "SELECT count(*) FROM zk_stat_locks WHERE name = 'counted'"), '0',
		'statistics are per server');
	$_->quit for @s;

	my ($rc, $stdout, $stderr) = $east->psql('postgres',
		"\\set VERBOSITY verbose\nSET ROLE pg_monitor; SELECT zk_stat_locks_reset()");
	like($stderr, qr/ERROR:  42501: permission denied for function zk_stat_locks_reset/,
		'only privileged roles may reset them');
	is(query($east, "SELECT acquisitions FROM zk_stat_locks WHERE name = 'counted'"),
		$backend_sum, 'and a refused reset leaves them');
}

# --- more holds than slots, more names than statistics ---------------------
{
	my $small = zk_cluster('small', $root, 'zklock.max_shown_holds' => 16,
		'zklock.max_tracked_names' => 16);
	query($small, 'CREATE ROLE plain LOGIN; CREATE ROLE other LOGIN');
	my $s = zk_session($small);
	run_sql($s, 'SET ROLE plain');
	($out, $err) = run_sql($s,
		"SELECT count(*) FROM generate_series(1, 20) i, LATERAL zk_lock('slot_' || i)");
	is($out, '20', 'a backend takes more locks than there are slots');
	like($err, qr/WARNING:  zklock has no room left in shared memory for zklock.max_shown_holds/,
		'with a WARNING');
	my $warnings = () = $err =~ /no room left in shared memory for zklock.max_shown_holds/g;
	is($warnings, 1, 'just once');
	is(query($small, "SELECT count(*) FROM zk_locks WHERE pid = $s->{zk_pid}"), '12',
		'the other backends see what fits in three quarters of the slots, the share of one role');
	is(query($east, "SELECT count(*) FROM generate_series(1, 20) i WHERE zk_try_lock('slot_' || i)"), '0',
		'and every lock is held all the same');
	my $t = zk_session($small);
	run_sql($t, 'SET ROLE other');
	run_sql($t, "SELECT zk_lock('other_role')");
	is(query($small, "SELECT count(*) FROM zk_locks WHERE pid = $t->{zk_pid}"), '1',
		'another role\'s holds are still shown');

	# Statistics for more names than are tracked: a fixed-size table,
	# which never takes the server's spare shared memory.
	my $free = "SELECT size FROM pg_shmem_allocations WHERE name IS NULL";
	my $free_before = query($small, $free);
	my $u = zk_session($small);
	($out, $err) = run_sql($u,
		"SELECT count(*) FROM generate_series(1, 300) i WHERE zk_try_lock('name_' || i) AND zk_unlock('name_' || i)");
	is($out, '300', 'statistics: 300 names locked and unlocked');
	like($err, qr/no room left in shared memory for zklock.max_tracked_names/,
		'statistics: a WARNING once the table is full');
	like($err, qr/DETAIL:  Lock names that do not fit get no statistics.*until zk_stat_locks_reset\(\) is called/,
		'statistics: its DETAIL says the names stay until a reset');
	like($err, qr/HINT:  Ask a superuser, or a role granted EXECUTE on zk_stat_locks_reset\(\), to call it/,
		'statistics: and its HINT who may reset them');
	unlike($err, qr/max_shown_holds/,
		'statistics: the WARNING does not speak of the hold slots');
	$warnings = () = $err =~ /no room left/g;
	is($warnings, 1, 'statistics: just once');
	is(query($small, 'SELECT count(*) FROM zk_stat_locks'), '16',
		'statistics: no more names than zklock.max_tracked_names');
	is(query($small, $free), $free_before,
		'statistics: the server\'s spare shared memory is untouched');
	query($small, 'SELECT zk_stat_locks_reset()');
	is(query($small, 'SELECT count(*) FROM zk_stat_locks'), '0', 'statistics: a reset empties the table');
	($out) = run_sql($t, "SELECT zk_try_lock('after_reset') AND zk_unlock('after_reset')");
	is(query($small, "SELECT count(*) FROM zk_stat_locks WHERE name = 'after_reset'"), '1',
		'statistics: and makes room for new names');
	run_sql($_, 'SELECT zk_unlock_all()') for ($s, $t);
	$_->quit for ($s, $t, $u);
	$small->stop;
}

# --- a waiter that exits while it waits; a semaphore's blockers -------------
{
	my $x = zk_session($east);
	my $v = zk_session($east);
	run_sql($x, "SELECT zk_lock('fatal_wait')");
	send_query($v, "SELECT zk_lock('fatal_wait');");
	ok(wait_for_zk_wait($east, $v->{zk_pid}), 'a backend waits');
	query($east, "SELECT pg_terminate_backend($v->{zk_pid})");
	ok(wait_until('the waiter to be gone',
			sub { query($east, "SELECT count(*) FROM pg_stat_activity WHERE pid = $v->{zk_pid}") eq '0' }),
		'and is terminated while it waits');
	is(query($east, 'SELECT count(*) FROM zk_blockers(0)'), '0',
		'zk_blockers(0) shows no wait, not even the one of a backend gone');
	is(query($east, "SELECT count(*) FROM zk_locks WHERE state = 'waiting'"), '0',
		'nor does zk_locks');
	run_sql($x, "SELECT zk_unlock('fatal_wait')");

	# Two slots held, one waiter ahead of ours: the slot holders block it.
	my @s = map { zk_session($east) } 1 .. 4;
	run_sql($s[$_], "SELECT zk_semaphore_acquire('sem_view', 2)") for 0 .. 1;
	send_query($s[2], "SELECT zk_semaphore_acquire('sem_view', 2);");
	ok(wait_for_zk_wait($east, $s[2]->{zk_pid}), 'a semaphore waiter');
	send_query($s[3], "SELECT zk_semaphore_acquire('sem_view', 2);");
	ok(wait_for_zk_wait($east, $s[3]->{zk_pid}), 'and one behind it');
	ok(wait_until('both waits shown',
			sub { query($east, "SELECT count(*) FROM zk_locks WHERE name = 'sem_view' AND state = 'waiting' AND node IS NOT NULL") eq '2' }),
		'both waits are shown');
	is(query($east, "SELECT count(*), bool_and(holds), array_agg(pid ORDER BY pid) = ARRAY[$s[0]->{zk_pid}, $s[1]->{zk_pid}]::int[] FROM zk_blockers($s[3]->{zk_pid})"),
		'2|t|t',
		'a semaphore waiter is blocked by the slot holders, not by the waiter ahead');
	run_sql($_, 'SELECT zk_unlock_all()') for @s[0 .. 1];
	ok(wait_until('the waiters to be granted',
			sub { query($east, "SELECT count(*) FROM zk_locks WHERE name = 'sem_view' AND state = 'held'") eq '2' }),
		'the waiters take the slots');
	run_sql($_, 'SELECT zk_unlock_all()') for @s[2 .. 3];
	$_->quit for ($x, @s);
}

# --- a contender that cannot be read; one gone while the queue is read -------
#
# Another client's contender whose ACL denies zklock reading it: the views
# cannot know the queue without it, so they fail rather than leave it out.
# A contender deleted between the listing and its read has left the queue,
# and is left out.
{
	my $parent = "$root/view_unreadable";
	my $o = zk_session($east);
	my $w = zk_session($east);
	run_sql($o, "SELECT zk_lock('view_unreadable')");
	send_query($w, "SELECT 'w granted' FROM zk_lock('view_unreadable');");
	ok(wait_for_zk_wait($east, $w->{zk_pid}), 'unreadable: a zklock waiter');
	ok(wait_until('the waiter to show its node',
			sub { query($east, "SELECT count(*) FROM zk_locks WHERE pid = $w->{zk_pid} AND node IS NOT NULL") eq '1' }),
		'unreadable: the waiter shows its node');
	# Behind the waiter, which therefore never watches it: zklock cannot
	# watch what it may not read either.
	my $hidden = '0123456789abcdef0123456789abcdef__lock__0000000002';
	{
		local $ENV{ZKINSPECT_AUTH} = 'owner:owner-pw';
		ZkTest::zkinspect('create', "$parent/$hidden", 'another client');
		ZkTest::zkinspect('set-acl', "$parent/$hidden");
	}
	my $hidden_path = "$parent/$hidden";
	my $unreadable = qr/ERROR:  42501: could not read ZooKeeper node "\Q$hidden_path\E": not authenticated/;
	for my $call ("zk_lock_contenders('view_unreadable')", "zk_blockers($w->{zk_pid})")
	{
		my ($rc, $stdout, $stderr) = $east->psql('postgres',
			"\\set VERBOSITY verbose\nSELECT count(*) FROM $call");
		like($stderr, $unreadable, "unreadable: $call fails, naming the node");
	}
	{
		local $ENV{ZKINSPECT_AUTH} = 'owner:owner-pw';
		ZkTest::zkinspect('delete', "$parent/$hidden");
	}
	is(query($east, "SELECT string_agg(client || ':' || holds, ',' ORDER BY queue_position) FROM zk_lock_contenders('view_unreadable')"),
		'zklock:true,zklock:false', 'unreadable: once it is gone, the queue is shown');
	run_sql($o, "SELECT zk_unlock('view_unreadable')");
	ok(await_output($w, qr/w granted/), 'unreadable: the waiter is granted');
	run_sql($w, "SELECT zk_unlock('view_unreadable')");

	# The reads that follow the listing are held back at a proxy while a
	# contender is deleted.  Timeouts long enough for a loaded machine: the
	# session must not give up on a held read.
	my ($proxy, $proxy_port, $control) = start_proxy();
	my $gone = 'fedcba9876543210fedcba9876543210__lock__0000000009';
	run_sql($o, "SELECT zk_lock('view_unreadable')");
	ZkTest::zkinspect('create', "$parent/$gone", 'another client');
	sleep 1;
	my $r = zk_session($east);
	run_sql($r, "SET zklock.hosts = '127.0.0.1:$proxy_port'; SET zklock.session_timeout = '45s'; SET zklock.connect_timeout = '60s'");
	is((run_sql($r, "SELECT string_agg(client, ',' ORDER BY queue_position) FROM zk_lock_contenders('view_unreadable')"))[0],
		'zklock,kazoo', 'gone: both contenders are shown at first');
	PostgreSQL::Test::Utils::append_to_file("$control/hold-reads", '');
	send_query($r, "SELECT string_agg(client, ',' ORDER BY queue_position) FROM zk_lock_contenders('view_unreadable');");
	ok(wait_until('a read to be held', sub { proxy_fired($control, 'hold-reads') >= 1 }),
		'gone: the reads after the listing are held back');
	ZkTest::zkinspect('delete', "$parent/$gone");
	unlink "$control/hold-reads";
	ok(await_output($r, qr/^zklock$/m),
		'gone: a contender deleted between the listing and its read is left out, with no error');
	run_sql($o, "SELECT zk_unlock('view_unreadable')");
	$_->quit for ($o, $w, $r);
	$proxy->kill_kill;
}

# --- every backend's session ----------------------------------------------------
{
	$east->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_session_credentials() RETURNS text
		AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C});
	my $a = zk_session($east);
	my $q = "SELECT state, state_since IS NOT NULL, database FROM zk_sessions WHERE pid = $a->{zk_pid}";
	is(query($east, $q), '', 'a backend without a session is not shown');
	run_sql($a, "SELECT zk_lock('session_view')");
	is(query($east, $q), 'connected|t|postgres', 'another backend sees its session connected');
	my ($creds) = run_sql($a, 'SELECT zk_test_session_credentials()');
	ZkTest::zkinspect('expire', $creds);
	ok(wait_until('the loss to be shown', sub { query($east, $q) eq 'lost|t|postgres' }),
		'and then lost, while the backend itself sits idle');
	run_sql($a, 'SELECT zk_unlock_all()');
	run_sql($a, "SELECT zk_lock('session_view')");
	is(query($east, $q), 'connected|t|postgres', 'connected again once it takes a lock anew');
	my ($own) = run_sql($a, 'SELECT state FROM zk_sessions WHERE pid = pg_backend_pid()');
	is($own, 'connected', 'a backend sees its own session');

	# A lease that runs out is a loss no ZooKeeper event announces: the
	# watchdog declares it at the deadline, while the backend sits idle.
	run_sql($a, "SELECT zk_unlock_all(); SET zklock.lease = '1s'; SELECT zk_lock('session_view')");
	ok(wait_until('the lease to run out', sub { query($east, $q) eq 'lost|t|postgres' }),
		'a session given up at the end of a lease is shown lost, though the backend is idle');
	run_sql($a, 'RESET zklock.lease; SELECT zk_unlock_all()');
	$a->quit;
	ok(wait_until('the exit to be shown', sub { query($east, $q) eq '' }),
		'a backend that exits is no longer shown');
}

# --- without preloading ----------------------------------------------------------
{
	my $plain = zk_cluster('plain', $root, shared_preload_libraries => "''");
	my $a = zk_session($plain);
	run_sql($a, "SELECT zk_lock('plain_x')");
	is(query($plain, "SELECT count(*) FROM zk_locks"), '0',
		'without preloading, zk_locks shows no other backend\'s locks');
	($out) = run_sql($a, "SELECT name, pid = pg_backend_pid() FROM zk_locks");
	is($out, 'plain_x|t', 'but each backend sees its own');
	my ($rc, $stdout, $stderr) = $plain->psql('postgres', 'SELECT * FROM zk_blockers(1)');
	like($stderr, qr/zk_blockers needs zklock in shared_preload_libraries/,
		'zk_blockers says it needs preloading');
	($rc, $stdout, $stderr) = $plain->psql('postgres', 'SELECT * FROM zk_stat_locks');
	like($stderr, qr/zk_stat_locks needs zklock in shared_preload_libraries/,
		'and so does zk_stat_locks');
	($out) = run_sql($a, 'SELECT count(*), bool_and(pid = pg_backend_pid()) FROM zk_sessions');
	is($out, '1|t', 'and zk_sessions shows its own session alone');
	run_sql($a, 'SELECT zk_unlock_all()');
	$a->quit;
}

$h->quit;
is_deeply([ zk_lock_nodes($root) ], [], 'no lock node left');

done_testing();
