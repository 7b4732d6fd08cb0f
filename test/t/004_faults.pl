# Lock loss and faults against the real ensemble: a leader dies, the whole
# ensemble stops, a holder is killed or paused, a session is expired on
# purpose, a create's reply is lost.  Never two holders, never a stuck lock.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use ZkTest;

my $root = '/zklock_t004';
my %conf = ('zklock.session_timeout' => '4s', 'zklock.connect_timeout' => '3s');
my $east = zk_cluster('east', $root, %conf);
my $west = zk_cluster('west', $root, %conf);
for my $node ($east, $west)
{
	$node->safe_psql('postgres', q{
		CREATE FUNCTION zk_test_session_credentials() RETURNS text
		AS '$libdir/zklock', 'zk_test_session_credentials' LANGUAGE C;
		CREATE TABLE work (what text)});
}
my ($out, $err);

sub nodes_left
{
	my ($name) = @_;
	return scalar zk_contenders("$root/$name");
}

# --- the leader dies while one backend holds and another waits ------------
{
	my $h = zk_session($east);
	my $w = zk_session($west);
	# An election and reconnect can outlast 4 s on a loaded machine; this
	# block is about surviving it, not about the timeout.
	run_sql($_, "SET zklock.session_timeout = '20s'") for ($h, $w);
	run_sql($h, "SELECT zk_lock('leader')");
	send_query($w, "SELECT 'granted after election' FROM zk_lock('leader');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a waiter queues behind the holder');
	my $leader = zk_ensemble('leader');
	chomp $leader;
	zk_ensemble('kill', $leader);
	zk_ensemble('wait-quorum');
	sleep 1;
	my $t = zk_session($west);
	($out) = run_sql($t, "SELECT zk_try_lock('leader')");
	is($out, 'f', 'after the leader died the lock is still held');
	is($west->safe_psql('postgres',
			"SELECT wait_event_type FROM pg_stat_activity WHERE pid = $w->{zk_pid}"),
		'Extension', 'and the waiter still waits');
	($out, $err) = run_sql($h, "SELECT zk_unlock('leader')");
	is($out, 't', 'the holder releases normally after re-election');
	ok(await_output($w, qr/granted after election/), 'and the waiter gets it');
	run_sql($w, "SELECT zk_unlock('leader')");
	zk_ensemble('start-server', $leader);
	is_deeply([ zk_lock_nodes($root) ], [],
		'no node left, with every session still open');
	$_->quit for ($h, $w, $t);
}

# --- the whole ensemble stops for less than the session timeout ----------
{
	my $h = zk_session($east);
	# Stopping and starting three servers may take a while on a loaded
	# machine: the timeout must outlast it for this "short" outage.
	run_sql($h, "SET zklock.session_timeout = '40s'");
	run_sql($h, "SELECT zk_lock('short_outage'); BEGIN; SELECT zk_xact_lock('short_outage_x')");
	zk_ensemble('stop');
	send_query($h, "COMMIT;\nSELECT 'after commit';");
	ok(still_waiting($east, $h, qr/after commit/, statement => qr/^COMMIT;?$/, seconds => 2),
		'COMMIT during an outage waits for the session to come back');
	zk_ensemble('start');
	ok(await_output($h, qr/after commit/), 'and then commits, without an error');
	my $t = zk_session($west);
	($out) = run_sql($t, "SELECT zk_try_lock('short_outage')");
	is($out, 'f', 'the session hold survived the outage');
	($out, $err) = run_sql($h, "SELECT zk_unlock('short_outage')");
	is($out, 't', 'and is released normally');
	is($err, '', 'without a warning');
	($out) = run_sql($t, "SELECT zk_try_lock('short_outage') AND zk_unlock('short_outage')");
	is($out, 't', 'then the other cluster gets it');
	is_deeply([ zk_lock_nodes($root) ], [],
		'no node left, with every session still open');
	$_->quit for ($h, $t);
}

# --- the whole ensemble stops for longer than the session timeout --------
{
	my $s = zk_session($east);    # session hold
	my $x = zk_session($east);    # transaction hold, idle in transaction
	my $r = zk_session($east);    # transaction hold, statement running
	run_sql($s, "SELECT zk_lock('long_outage_s')");
	run_sql($x, "BEGIN; SELECT zk_xact_lock('long_outage_x'); INSERT INTO work VALUES ('x')");
	run_sql($r, "BEGIN; SELECT zk_xact_lock('long_outage_r'); INSERT INTO work VALUES ('r')");
	send_query($r, "SELECT pg_sleep(60);");
	zk_ensemble('stop');
	# The cut-off starts somewhere while the servers stop, one by one.
	my $t_stopped = time;
	ok(await_output($r,
			qr/canceling statement because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "long_outage_r"\./),
		'the running statement of a transaction whose lock was lost is cancelled');
	# The loss is due one session timeout after the server was last heard
	# from; test/t/009_safety.pl measures that against the last reply itself.
	cmp_ok(time - $t_stopped, '<', 4 + 1.5, 'within the session timeout of the stop');
	run_sql($r, 'COMMIT');

	($out, $err) = run_sql($x, 'COMMIT');
	like($err, qr/ERROR:  cannot commit because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "long_outage_x"\./,
		'COMMIT of an idle transaction whose lock was lost fails');
	is($east->safe_psql('postgres', 'SELECT count(*) FROM work'), '0',
		'and nothing of either transaction was committed');

	zk_ensemble('start');
	($out, $err) = run_sql($s, "SELECT zk_unlock('long_outage_s')");
	is($out, 'f', 'unlock of a lost session lock returns false');
	like($err, qr/WARNING:  zklock lost its ZooKeeper session\nDETAIL:  These locks were held, and are lost: "long_outage_s"\./,
		'the next call names the lost locks');
	like($err, qr/"long_outage_s" was lost with the ZooKeeper session and is not held/,
		'and unlock says the lock was lost');
	# The lost session's node goes when the server expires that session,
	# if the backend closed it before it could reconnect.
	ok(zk_wait_contenders("$root/long_outage_s", 0, 15), 'the lost node goes');
	($out, $err) = run_sql($s, "SELECT zk_try_lock('long_outage_s'), zk_unlock('long_outage_s')");
	is($out, 't|t', 'a new lock works on a new session');
	($out) = run_sql($s, 'SELECT losses, state FROM zk_status()');
	is($out, '1|connected', 'zk_status counts the loss and shows the new session');
	for my $name (qw(long_outage_s long_outage_x long_outage_r))
	{
		ok(zk_wait_contenders("$root/$name", 0, 15), "no node of $name is left");
	}
	$_->quit for ($s, $x, $r);
}

# --- kill -9 of a holding backend ---------------------------------------
{
	my $h = zk_session($east);
	my $w = zk_session($west);
	run_sql($h, "SELECT zk_lock('crash')");
	send_query($w, "SELECT 'granted after crash' FROM zk_lock('crash');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a waiter on the other cluster queues');
	my $t0 = time;
	kill 'KILL', $h->{zk_pid};
	ok(await_output($w, qr/granted after crash/),
		'the waiter is granted once the dead backend\'s session expires');
	cmp_ok(time - $t0, '<', 4 + 4, 'within the session timeout plus a margin');
	run_sql($w, "SELECT zk_unlock('crash')");
	$w->quit;
	# restart_after_crash is off in test clusters: bring east back.
	wait_until('east to shut down', sub { !-e $east->data_dir . '/postmaster.pid' });
	$east->stop('immediate', fail_ok => 1);
	$east->start;
}

# --- a holder paused for longer than the session timeout ----------------
{
	my $r = zk_session($east);    # statement running when paused
	my $x = zk_session($east);    # idle in transaction when paused
	my $w = zk_session($west);
	run_sql($r, "BEGIN; SELECT zk_xact_lock('paused'); INSERT INTO work VALUES ('paused r')");
	($out) = run_sql($r, "SELECT zk_lock_token('paused')");
	my $paused_token = $out;
	run_sql($x, "BEGIN; SELECT zk_xact_lock('paused_idle'); INSERT INTO work VALUES ('paused x')");
	send_query($r, "SELECT pg_sleep(60);");
	send_query($w, "SELECT zk_lock('paused'); SELECT zk_lock('paused_idle'); "
		  . "SELECT 'granted ' || zk_lock_token('paused');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a waiter on the other cluster queues');
	kill 'STOP', $r->{zk_pid}, $x->{zk_pid};
	my $t0 = time;
	$w->{timeout}->start();
	$w->{run}->pump until $w->{stdout} =~ /granted (\d+)\n/ || $w->{timeout}->is_expired;
	my $new_token = $1;
	ok(defined $new_token, 'the waiter gets the locks of the paused holders');
	cmp_ok(time - $t0, '<', 4 + 4, 'after the session timeout plus a margin');
	cmp_ok($new_token, '>', $paused_token, 'with a larger fencing token');
	# The idle holder reads this COMMIT the moment it resumes, while its
	# watchdog is sending the loss cancel: the cancel may land inside the
	# commit's own checks, and must read as the refused commit all the same.
	send_query($x, 'COMMIT;');
	kill 'CONT', $r->{zk_pid}, $x->{zk_pid};
	ok(await_output($r, qr/canceling statement because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "paused"\./),
		'once resumed, the paused holder\'s running statement is cancelled');
	run_sql($r, 'COMMIT');
	ok(await_output($x, qr/ERROR:  cannot commit because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "paused_idle"\./),
		'the idle paused holder\'s COMMIT fails');
	is($east->safe_psql('postgres', 'SELECT count(*) FROM work'), '0',
		'nothing the paused holders did was committed');
	run_sql($w, 'SELECT zk_unlock_all()');
	$_->quit for ($r, $x, $w);
}

# --- a session expired on purpose, as Curator's tests do ------------------
{
	my $h = zk_session($east);
	my $w = zk_session($west);
	run_sql($h, "SELECT zk_lock('expire_s'); BEGIN; SELECT zk_xact_lock('expire_x')");
	($out) = run_sql($h, 'SELECT zk_test_session_credentials()');
	my $creds = $out;
	my ($password) = $creds =~ /:([0-9a-f]+)$/;
	($out) = run_sql($h, 'SELECT zk_status()::text');
	unlike($out, qr/$password/, 'zk_status never shows the session password');
	my ($sid) = $creds =~ /^([0-9a-f]+):/;
	like($out, qr/0x$sid/, 'but shows the session id');
	send_query($h, "SELECT pg_sleep(60);");
	send_query($w, "SELECT 'granted after expiry' FROM zk_lock('expire_x');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'a waiter queues behind the holder');

	my $q = zk_session($east);    # a waiter whose own session expires
	run_sql($q, "SELECT zk_try_lock('warm_up'), zk_unlock('warm_up')");
	($out) = run_sql($q, 'SELECT zk_test_session_credentials()');
	my $q_creds = $out;

	ZkTest::zkinspect('expire', $creds);
	ok(await_output($h, qr/canceling statement because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "expire_x"\./),
		'an expired session cancels the holder\'s running statement');
	ok(await_output($w, qr/granted after expiry/), 'and the waiter is granted at once');
	run_sql($h, 'ROLLBACK');
	($out, $err) = run_sql($h, "SELECT zk_unlock('expire_s')");
	is($out, 'f', 'the lost session lock cannot be unlocked');
	like($err, qr/"expire_s" was lost/, 'with a clear message');

	send_query($q, "SELECT zk_lock('expire_x');");
	ok(wait_for_zk_wait($east, $q->{zk_pid}), 'another waiter queues');
	ok(zk_wait_contenders("$root/expire_x", 2), 'with a node of its own');
	ZkTest::zkinspect('expire', $q_creds);
	# Joining the session may first knock the waiter's connection over; if
	# it reconnects before the session is closed, its next listing can come
	# back without its node, and that is the error it sees.  Either way the
	# wait ends in an ERROR.
	ok(await_output($q,
			qr/ERROR:  zklock (lost its ZooKeeper session|lock node "[^"]+" disappeared while waiting)/),
		'a waiter whose session expires gets an ERROR');
	is(nodes_left('expire_x'), 1, 'and is not re-queued');
	# After "disappeared", the backend learns of the expiry a moment later,
	# from the library; a lock call before then finds the session expired.
	ok(wait_for_session_lost($east, $q->{zk_pid}), 'the waiter knows its session ended');
	($out) = run_sql($q, "SELECT zk_try_lock('warm_up'), zk_unlock('warm_up')");
	is($out, 't|t', 'the backend opens a new session');
	run_sql($w, "SELECT zk_unlock('expire_x')");
	$_->quit for ($h, $w, $q);
}

# --- a create whose reply is lost, through a proxy -------------------------
{
	my ($proxy, $proxy_port, $control) = start_proxy();
	sleep 1;
	my $p = zk_session($east);
	run_sql($p, "SET zklock.hosts = '127.0.0.1:$proxy_port'");
	($out) = run_sql($p, "SELECT zk_try_lock('proxied'), zk_unlock('proxied')");
	is($out, 't|t', 'locks work through the proxy');
	($out) = run_sql($p, 'SELECT zk_test_session_credentials()');
	my ($session) = $out =~ /^([0-9a-f]+):/;

	for my $fault ('drop-create-reply', 'drop-create-request')
	{
		PostgreSQL::Test::Utils::append_to_file("$control/$fault", '');
		($out, $err) = run_sql($p, "SELECT zk_try_lock('proxied')");
		is($out, 't', "$fault: the lock is acquired across the dropped connection");
		is(proxy_fired($control, $fault), 1, "$fault: the fault fired");
		my @nodes = zk_contenders("$root/proxied");
		is(scalar @nodes, 1, "$fault: exactly one node, none orphaned");
		my ($owner) = ZkTest::zkinspect('stat', "$root/proxied/$nodes[0]") =~ /0x([0-9a-f]+)/;
		is($owner, $session, "$fault: owned by the backend's session");
		run_sql($p, "SELECT zk_unlock('proxied')");
		ok(zk_wait_contenders("$root/proxied", 0), "$fault: released");
	}

	my $w = zk_session($west);
	run_sql($w, "SELECT zk_lock('proxied')");
	PostgreSQL::Test::Utils::append_to_file("$control/drop-create-reply", '');
	($out) = run_sql($p, "SELECT zk_lock('proxied', '3s')");
	is($out, 'f', 'a timed wait whose create reply was lost times out');
	ok(zk_wait_contenders("$root/proxied", 1), 'and leaves no node behind');
	# Without the fault it would time out all the same.
	is(proxy_fired($control, 'drop-create-reply'), 2, 'the timed wait: the fault fired');
	run_sql($w, "SELECT zk_unlock('proxied')");
	is_deeply([ zk_lock_nodes($root) ], [],
		'no node left, with every session still open');
	$proxy->kill_kill;
	$_->quit for ($p, $w);
}

done_testing();
