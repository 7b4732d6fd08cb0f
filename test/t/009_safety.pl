# The safety rules under review: a backend's own holds never block it and
# never let another client in beside it; one name maps to one node in every
# database encoding; a lost session is declared no later than the server
# may expire it, and COMMIT checks with the leader; a lock released by
# COMMIT is free when COMMIT returns; a slow name lookup stays cancellable.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep usleep);
use ZkTest;

my $root = '/zklock_t009';
my @servers = split /,/, $ENV{ZKLOCK_TEST_HOSTS};
my $east = zk_cluster('east', $root);
my $west = zk_cluster('west', $root);
my ($out, $err);

# A waiter that must not have been granted: still waiting after a second,
# with no grant marker printed.

sub still_waiting_ok
{
	my ($node, $session, $marker, $name) = @_;
	ok(still_waiting($node, $session, $marker), $name);
	return;
}

# --- a backend's own holds never block it ---------------------------------
#
# Each case: a backend on east holds one mode, a client on west queues
# behind it, and the backend asks for the other mode.  It gets it at once,
# and the client queued in between is granted only after the backend's
# last hold on the name ends.
for my $case ([ 'exclusive then shared', 'own_xs', '', '_shared' ],
	[ 'shared then exclusive', 'own_sx', '_shared', '' ])
{
	my ($what, $name, $first, $second) = @$case;
	my $a = zk_session($east);
	my $b = zk_session($west);
	run_sql($a, "SELECT zk_lock$first('$name')");
	send_query($b, "SELECT 'b granted' FROM zk_lock('$name');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), "$what: a client on the other cluster queues");
	ok(zk_wait_contenders("$root/$name", 2), "$what: behind the holder's node");
	my $t0 = time;
	($out, $err) = run_sql($a, "SELECT zk_lock$second('$name', '20s')");
	is($out, 't', "$what: the holder gets the other mode");
	cmp_ok(time - $t0, '<', 3, "$what: at once, not after the queued client");
	is(scalar zk_contenders("$root/$name"), 3, "$what: with a node of its own");
	still_waiting_ok($west, $b, qr/b granted/, "$what: the queued client still waits");
	run_sql($a, "SELECT zk_unlock$first('$name')");
	still_waiting_ok($west, $b, qr/b granted/,
		"$what: and still after the first hold ends, while the second lasts");
	run_sql($a, "SELECT zk_unlock$second('$name')");
	ok(await_output($b, qr/b granted/), "$what: granted once the last hold ends");
	run_sql($b, "SELECT zk_unlock('$name')");
	$_->quit for ($a, $b);
}

# An upgrade still waits for another client's shared hold.
{
	my $a = zk_session($east);
	my $c = zk_session($west);
	my $b = zk_session($west);
	run_sql($a, "SELECT zk_lock_shared('own_third')");
	run_sql($c, "SELECT zk_lock_shared('own_third')");
	send_query($b, "SELECT 'b granted' FROM zk_lock('own_third');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'third holder: a writer queues behind two readers');
	send_query($a, "SELECT 'a upgraded' FROM zk_lock('own_third');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}),
		'third holder: the upgrade waits for the other reader');
	run_sql($c, "SELECT zk_unlock_shared('own_third')");
	ok(await_output($a, qr/a upgraded/), 'third holder: the upgrade is granted when it leaves');
	still_waiting_ok($west, $b, qr/b granted/, 'third holder: the queued writer still waits');
	run_sql($a, "SELECT zk_unlock_shared('own_third')");
	still_waiting_ok($west, $b, qr/b granted/, 'third holder: and still while the upgrade lasts');
	run_sql($a, "SELECT zk_unlock('own_third')");
	ok(await_output($b, qr/b granted/), 'third holder: granted after the last hold');
	run_sql($b, "SELECT zk_unlock('own_third')");
	$_->quit for ($a, $b, $c);
}

# A reader queued behind a writer that gives up after the upgrade does not
# slip in beside the upgraded backend.
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	my $r = zk_session($west);
	run_sql($a, "SELECT zk_lock_shared('own_giveup')");
	send_query($b, "SELECT zk_lock('own_giveup');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'writer gives up: a writer queues');
	ok(zk_wait_contenders("$root/own_giveup", 2), 'writer gives up: with a node');
	send_query($r, "SELECT 'r granted' FROM zk_lock_shared('own_giveup');");
	ok(wait_for_zk_wait($west, $r->{zk_pid}), 'writer gives up: a reader queues behind it');
	ok(zk_wait_contenders("$root/own_giveup", 3), 'writer gives up: with a node');
	($out) = run_sql($a, "SELECT zk_lock('own_giveup', '20s')");
	is($out, 't', 'writer gives up: the reader upgrades at once');
	$west->safe_psql('postgres', "SELECT pg_cancel_backend($b->{zk_pid})");
	ok(await_output($b, qr/canceling statement due to user request/),
		'writer gives up: the writer between is cancelled');
	still_waiting_ok($west, $r, qr/r granted/,
		'writer gives up: the reader behind it does not get in beside the upgrade');
	run_sql($a, "SELECT zk_unlock('own_giveup')");
	ok(await_output($r, qr/r granted/),
		'writer gives up: once the upgrade ends, the reader shares with the shared hold left');
	run_sql($a, "SELECT zk_unlock_shared('own_giveup')");
	run_sql($r, "SELECT zk_unlock_shared('own_giveup')");
	$_->quit for ($a, $b, $r);
}

# An upgrade that waits for a third reader, with a reader queued behind a
# writer that gives up meanwhile: that reader now waits only for the upgrade,
# which cannot tell it from a holder, so it queues again behind it instead
# of both waiting for ever.
{
	my $a = zk_session($east);
	my $t = zk_session($west);
	my $b = zk_session($west);
	my $r = zk_session($west);
	run_sql($a, "SELECT zk_lock_shared('own_requeue')");
	run_sql($t, "SELECT zk_lock_shared('own_requeue')");
	send_query($b, "SELECT zk_lock('own_requeue');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'requeue: a writer queues');
	ok(zk_wait_contenders("$root/own_requeue", 3), 'requeue: with a node');
	send_query($r, "SELECT 'r granted' FROM zk_lock_shared('own_requeue');");
	ok(wait_for_zk_wait($west, $r->{zk_pid}), 'requeue: a reader queues behind it');
	ok(zk_wait_contenders("$root/own_requeue", 4), 'requeue: with a node');
	send_query($a, "SELECT 'a upgraded' FROM zk_lock('own_requeue');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), 'requeue: the upgrade waits for the third reader');
	$west->safe_psql('postgres', "SELECT pg_cancel_backend($b->{zk_pid})");
	ok(await_output($b, qr/canceling statement due to user request/),
		'requeue: the writer between is cancelled');
	run_sql($t, "SELECT zk_unlock_shared('own_requeue')");
	ok(await_output($a, qr/a upgraded/), 'requeue: the upgrade is granted when the third reader leaves');
	still_waiting_ok($west, $r, qr/r granted/, 'requeue: the requeued reader waits');
	run_sql($a, "SELECT zk_unlock_shared('own_requeue'), zk_unlock('own_requeue')");
	ok(await_output($r, qr/r granted/), 'requeue: and is granted after the last hold');
	run_sql($r, "SELECT zk_unlock_shared('own_requeue')");
	$_->quit for ($a, $t, $b, $r);
}

# Two backends that hold a name shared both upgrade: they wait for each
# other, and, as with advisory locks, the deadlock check ends the younger
# wait with "deadlock detected".  A reader queued behind a writer that
# gives up meanwhile waits only for the two upgrades; it queues again
# behind them rather than watch one of them, which could end up waiting
# for it.
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	my $w = zk_session($west);
	my $r = zk_session($west);
	run_sql($a, "SELECT zk_lock_shared('two_up')");
	run_sql($b, "SELECT zk_lock_shared('two_up')");
	send_query($w, "SELECT zk_lock('two_up');");
	ok(wait_for_zk_wait($west, $w->{zk_pid}), 'two upgrades: a writer queues');
	ok(zk_wait_contenders("$root/two_up", 3), 'two upgrades: with a node');
	send_query($r, "SELECT 'r granted' FROM zk_lock_shared('two_up');");
	ok(wait_for_zk_wait($west, $r->{zk_pid}), 'two upgrades: a reader queues behind it');
	ok(zk_wait_contenders("$root/two_up", 4), 'two upgrades: with a node');
	my $b_wait = wait_node($b);
	send_query($b, "SELECT 'b upgraded' FROM zk_lock('two_up');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'two upgrades: one backend upgrades and waits');
	ok(await_published($root, $b_wait), 'two upgrades: its wait published');
	send_query($a, "SELECT zk_lock('two_up');");
	ok(wait_for_zk_wait($east, $a->{zk_pid}), 'two upgrades: and so does the other');
	$west->safe_psql('postgres', "SELECT pg_cancel_backend($w->{zk_pid})");
	ok(await_output($w, qr/canceling statement due to user request/),
		'two upgrades: the writer between is cancelled');
	ok(await_output($a, qr/ERROR:  deadlock detected/),
		'two upgrades: the deadlock check ends the younger upgrade');
	run_sql($a, "SELECT zk_unlock_shared('two_up')");
	ok(await_output($b, qr/b upgraded/),
		'two upgrades: the other is granted once the first lets its shared hold go');
	still_waiting_ok($west, $r, qr/r granted/, 'two upgrades: the reader waits');
	run_sql($b, "SELECT zk_unlock('two_up'), zk_unlock_shared('two_up')");
	ok(await_output($r, qr/r granted/), 'two upgrades: and is granted after the last hold');
	run_sql($r, "SELECT zk_unlock_shared('two_up')");
	$_->quit for ($a, $b, $w, $r);
}

# Curator and kazoo clients queued in between are never granted alongside.
for my $kind ('kazoo', 'curator')
{
	for my $case ([ '', '_shared' ], [ '_shared', '' ])
	{
		my ($first, $second) = @$case;
		my $name = "own_${kind}$first";
		my $what = "$kind between zk_lock$first and zk_lock$second";
		my $a = zk_session($east);
		# The lock first: a JVM starting meanwhile can hold up the connect
		# on a loaded machine.
		run_sql($a, "SELECT zk_lock$first('$name')");
		my $peer = start_peer($kind, "$root/$name");
		peer_send($peer, 'acquire');
		ok(zk_wait_contenders("$root/$name", 2), "$what: the peer queues");
		($out) = run_sql($a, "SELECT zk_lock$second('$name', '20s')");
		is($out, 't', "$what: the holder gets the other mode");
		run_sql($a, "SELECT zk_unlock$first('$name')");
		ok(peer_silent($peer, 2),
			"$what: the peer is not granted while the second hold lasts");
		run_sql($a, "SELECT zk_unlock$second('$name')");
		ok(peer_expect($peer, qr/^acquired$/m), "$what: the peer is granted after it");
		peer_send($peer, 'release');
		peer_expect($peer, qr/^released$/m);
		peer_quit($peer);
		$a->quit;
	}
}

# --- one name, one node, in every database encoding ------------------------
$east->safe_psql('postgres',
	"CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
$east->safe_psql('latin', 'CREATE EXTENSION zklock');
# A UTF-8 database whose name LATIN1 cannot spell: its backends' identity
# must still show in a LATIN1 database.
my $utf8_db = "utf_\xe6\x97\xa5\xe6\x9c\xac";
$west->safe_psql('postgres',
	"CREATE DATABASE \"$utf8_db\" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
$west->safe_psql($utf8_db, 'CREATE EXTENSION zklock');
{
	# chr(233) is é in both encodings.
	my $cafe = "'caf' || chr(233)";
	my $l = zk_session($east, 'latin');
	my $u = zk_session($west, $utf8_db);
	run_sql($l, "SELECT zk_lock($cafe)");
	ok((grep { $_ eq 'caf%C3%A9' } zk_children($root)),
		'a LATIN1 database maps the name from its UTF-8 form');
	($out) = run_sql($u, "SELECT zk_try_lock($cafe)");
	is($out, 'f', 'a UTF8 database on another cluster is excluded by the same name');
	send_query($u, "SELECT 'u granted' FROM zk_lock($cafe);");
	ok(wait_for_zk_wait($west, $u->{zk_pid}), 'and queues behind it');
	($out, $err) = run_sql($l,
		"SELECT queue_position, client, identity FROM zk_lock_contenders($cafe) ORDER BY 1");
	like($out, qr/^1\|zklock\|pid $l->{zk_pid} on .*, database latin,.*\n2\|zklock\|pid $u->{zk_pid} on .*, database utf_\\xe6\\x97\\xa5\\xe6\\x9c\\xac,/,
		'zk_lock_contenders in LATIN1 shows the UTF-8 database name it cannot spell, escaped');
	is($err, '', 'without an error');
	my $u2 = zk_session($west, $utf8_db);
	($out, $err) = run_sql($u2,
		"SELECT string_agg(queue_position::text, ',') FROM zk_lock_contenders($cafe)");
	is($out, '1,2', 'zk_lock_contenders works from the UTF8 database too');
	$u2->quit;
	run_sql($l, "SELECT zk_unlock($cafe)");
	ok(await_output($u, qr/u granted/), 'the waiter is granted when the LATIN1 holder unlocks');
	run_sql($u, "SELECT zk_unlock($cafe)");
	$_->quit for ($l, $u);
}

# --- a lock released by COMMIT or ROLLBACK is free when it returns ---------
#
# The two backends talk to different servers, so a release the releasing
# server has applied but the other has not yet would show.
$east->safe_psql('postgres', 'CREATE EXTENSION dblink');
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	run_sql($a, "SET zklock.hosts = '$servers[0]'");
	run_sql($b, "SET zklock.hosts = '$servers[1]'");
	my $try = "SELECT CASE WHEN zk_try_lock('handover') THEN zk_unlock('handover') ELSE false END";
	for my $end ('COMMIT', 'ROLLBACK')
	{
		my ($held, $busy) = (0, 0);
		for (1 .. 200)
		{
			my $err;
			($out, $err) = run_sql($a,
				"BEGIN; SELECT zk_xact_lock('handover'); SELECT zk_lock_token('handover') IS NOT NULL; $end");
			$held++ if $out =~ /^\s*t$/ && $err eq '';
			($out) = run_sql($b, $try);
			$busy++ if $out ne 't';
		}
		is($held, 200, "$end: the lock taken and held, without an error, 200 times of 200");
		is($busy, 0, "$end, then a try-lock from another cluster: free 200 times of 200");
	}

	# A procedure's COMMIT, with the other cluster asked from inside it.
	my $west_conn = 'host=' . $west->host . ' port=' . $west->port . ' dbname=postgres';
	$east->safe_psql('postgres', qq{
		CREATE PROCEDURE handover(n int) LANGUAGE plpgsql AS \$\$
		DECLARE busy int := 0; got boolean;
		BEGIN
		  PERFORM dblink_connect('west', '$west_conn');
		  PERFORM dblink_exec('west', 'SET zklock.hosts = ''$servers[1]''');
		  FOR i IN 1..n LOOP
		    PERFORM zk_xact_lock('handover');
		    COMMIT;
		    SELECT r INTO got FROM dblink('west', \$q\$$try\$q\$) AS t(r boolean);
		    IF NOT got THEN busy := busy + 1; END IF;
		  END LOOP;
		  PERFORM dblink_disconnect('west');
		  RAISE NOTICE 'busy after procedure commit: %', busy;
		END \$\$});
	($out, $err) = run_sql($a, 'CALL handover(200)');
	like($err, qr/busy after procedure commit: 0$/m,
		"a procedure's COMMIT, then a try-lock from another cluster: free 200 times of 200");
	$_->quit for ($a, $b);
}

# --- a cut connection is declared lost within the session timeout ----------
#
# Through a proxy that stops passing anything on, as a cut cable would.  The
# time from the last reply the proxy passed to the cancel of the holder's
# statement must not exceed the session timeout (plus a margin for the
# cancel itself): past it, the server may have expired the session.
{
	my ($proxy, $proxy_port, $control) = start_proxy();
	my $h = zk_session($east);
	run_sql($h, "SET zklock.hosts = '127.0.0.1:$proxy_port'");
	run_sql($h, "SET zklock.session_timeout = '4s'");
	ok(wait_until('the proxy to listen',
			sub { (run_sql($h, "SELECT zk_try_lock('warm'), zk_unlock('warm')"))[0] eq 't|t' }),
		'cut: locks work through the proxy');
	run_sql($h, "BEGIN; SELECT zk_xact_lock('cut')");
	($out) = run_sql($h, 'SELECT session_timeout_ms FROM zk_status()');
	my $timeout = $out / 1000;
	send_query($h, 'SELECT pg_sleep(60);');
	sleep 2;    # a few heartbeats
	PostgreSQL::Test::Utils::append_to_file("$control/blackhole", '');
	ok(await_output($h,
			qr/canceling statement because zklock lost its ZooKeeper session\nDETAIL:  The transaction held these locks, now lost: "cut"\./),
		'cut: the holder\'s statement is cancelled');
	my $lost_at = time;
	my $last_reply = slurp_file("$control/last-reply");
	my $delay = $lost_at - $last_reply;
	diag(sprintf('cut: lost declared %.2f s after the last reply; session timeout %.2f s',
			$delay, $timeout));
	cmp_ok($delay, '<=', $timeout + 0.5,
		'cut: no later than the session timeout after the last contact');
	cmp_ok($delay, '>', $timeout / 2, 'cut: and not long before it');
	unlink "$control/blackhole";
	run_sql($h, 'ROLLBACK');
	$h->quit;
	$proxy->kill_kill;
}

# --- COMMIT waits for the leader when its last word is old -----------------
#
# The backend talks to a follower only.  The leader is paused: the follower
# goes on answering reads until it gives up on the leader, while a real
# partition would let the leader expire the session meanwhile.  A COMMIT
# whose last write is older than a sixth of the session timeout must hear
# from the leader first.
$east->safe_psql('postgres', 'CREATE TABLE work (what text)');
{
	my $leader = zk_ensemble('leader');
	chomp $leader;
	my ($follower) = grep { $_ != $leader } (1, 2, 3);
	my $f = zk_session($east);
	run_sql($f, "SET zklock.hosts = '$servers[$follower - 1]'");
	run_sql($f, "SET zklock.session_timeout = '9s'");
	run_sql($f, "BEGIN; SELECT zk_xact_lock('leaderless'); INSERT INTO work VALUES ('leaderless')");
	sleep 1.8;    # past a sixth of the timeout since the create, short of a third
	zk_ensemble('pause', $leader);
	send_query($f, "COMMIT;\nSELECT 'after commit';");
	ok(still_waiting($east, $f, qr/after commit/, statement => qr/^COMMIT;?$/, seconds => 1),
		'leaderless: COMMIT waits while the follower cannot reach the leader');
	is($east->safe_psql('postgres', "SELECT count(*) FROM work WHERE what = 'leaderless'"), '0',
		'leaderless: before it commits');
	zk_ensemble('resume', $leader);
	$f->{timeout}->start();
	$f->{run}->pump until $f->{stdout} =~ /after commit/ || $f->{timeout}->is_expired;
	like($f->{stdout}, qr/after commit/, 'leaderless: and returns once the leader answers');
	unlike($f->{stderr}, qr/ERROR/, 'leaderless: having committed');
	$f->{stdout} = $f->{stderr} = '';
	is($east->safe_psql('postgres', "SELECT count(*) FROM work"), '1',
		'leaderless: the work is committed');
	zk_ensemble('wait-quorum');
	$f->quit;
}

# --- a slow name lookup stays cancellable and bounded ----------------------
{
	my $lib = PostgreSQL::Test::Utils::tempdir() . '/slow_dns.so';
	system('cc', '-shared', '-fPIC', '-O2', '-o', $lib,
		"$ENV{ZKLOCK_SRC}/test/tools/slow_dns.c", '-ldl') == 0
	  or die 'could not build the name-service fault';
	my $dns;
	{
		local $ENV{LD_PRELOAD} = $ENV{LD_PRELOAD} ? "$ENV{LD_PRELOAD}:$lib" : $lib;
		$dns = zk_cluster('dns', $root);
	}
	my $s = zk_session($dns);
	run_sql($s, "SET zklock.hosts = 'slow-dns.zklock.invalid:2181'");
	run_sql($s, "SET zklock.connect_timeout = '2s'");
	my $t0 = time;
	($out, $err) = run_sql($s, "SELECT zk_try_lock('dns')");
	like($err, qr/could not resolve the ZooKeeper hosts "slow-dns.zklock.invalid:2181" within 2000 ms/,
		'a name lookup that does not answer fails within connect_timeout');
	cmp_ok(time - $t0, '<', 5, 'and does not wait for the lookup');

	run_sql($s, "SET zklock.connect_timeout = '60s'");
	send_query($s, "SELECT zk_lock('dns');");
	sleep 1;
	$t0 = time;
	$dns->safe_psql('postgres', "SELECT pg_cancel_backend($s->{zk_pid})");
	ok(await_output($s, qr/canceling statement due to user request/),
		'pg_cancel_backend ends a slow name lookup');
	cmp_ok(time - $t0, '<', 3, 'within 3 s');
	($out, $err) = run_sql($s,
		"SET statement_timeout = '1s'; SELECT zk_lock('dns'); RESET statement_timeout");
	like($err, qr/canceling statement due to statement timeout/,
		'statement_timeout ends it too');
	run_sql($s, 'RESET zklock.hosts');
	($out) = run_sql($s, "SELECT zk_try_lock('dns'), zk_unlock('dns')");
	is($out, 't|t', 'the backend then locks with the right hosts');
	$s->quit;
	$dns->stop;
}

# --- a timed wait of 30 days ----------------------------------------------
{
	my $a = zk_session($east);
	my $b = zk_session($west);
	run_sql($a, "SELECT zk_lock('long_wait')");
	send_query($b, "SELECT 'b granted' WHERE zk_lock('long_wait', '30 days');");
	ok(wait_for_zk_wait($west, $b->{zk_pid}), 'a 30-day timed wait waits');
	still_waiting_ok($west, $b, qr/b granted/, 'and goes on waiting');
	run_sql($a, "SELECT zk_unlock('long_wait')");
	ok(await_output($b, qr/b granted/), 'and is granted on release');
	run_sql($b, "SELECT zk_unlock('long_wait')");

	# PostgreSQL 17 accepts 'infinity' as an interval: a wait without limit.
	if ($west->pg_version >= 17)
	{
		run_sql($a, "SELECT zk_lock('forever')");
		send_query($b, "SELECT 'b granted' WHERE zk_lock('forever', 'infinity');");
		ok(wait_for_zk_wait($west, $b->{zk_pid}), "a wait of 'infinity' waits");
		still_waiting_ok($west, $b, qr/b granted/, 'and goes on waiting');
		run_sql($a, "SELECT zk_unlock('forever')");
		ok(await_output($b, qr/b granted/), 'and is granted on release');
		run_sql($b, "SELECT zk_unlock('forever')");
		my ($out, $err) = run_sql($b, "SELECT zk_lock('forever', '-infinity')");
		like($err, qr/zklock timeout must not be negative/, "'-infinity' is refused");
	}
	else
	{
		my ($out, $err) = run_sql($b, "SELECT zk_lock('forever', 'infinity')");
		like($err, qr/invalid input syntax for type interval/,
			"'infinity' is no interval before PostgreSQL 17");
	}
	# While the sessions are open: a node left by a live one stays.
	is_deeply([ zk_lock_nodes($root) ], [], 'no lock node is left under the root');
	$_->quit for ($a, $b);
}

done_testing();
