# Interop with the real peers on the same ensemble: kazoo's Lock (with
# extra_lock_patterns=["-lock-"]), ReadLock and WriteLock, and Curator's
# InterProcessMutex, against zklock's exclusive and shared modes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $root = '/zklock_t006';
my $node = zk_cluster('interop', $root);
my ($out, $err);

sub sql_try
{
	my ($s, $what) = @_;
	my ($r) = run_sql($s, "SELECT $what");
	return $r;
}

# A peer and SQL exclude each other in both directions, for both modes.
for my $kind ('kazoo', 'curator')
{
	my $name = "with_$kind";
	my $peer = start_peer($kind, "$root/$name");
	my $s = zk_session($node);

	run_sql($s, "SELECT zk_lock('$name')");
	peer_send($peer, 'try');
	ok(peer_expect($peer, qr/^busy$/m), "$kind: excluded by a zklock holder");
	peer_send($peer, 'acquire');
	ok(zk_wait_contenders("$root/$name", 2), "$kind: queues behind zklock");
	run_sql($s, "SELECT zk_unlock('$name')");
	ok(peer_expect($peer, qr/^acquired$/m), "$kind: granted when zklock releases");

	is(sql_try($s, "zk_try_lock('$name')"), 'f', "$kind: excludes a zklock writer");
	is(sql_try($s, "zk_try_lock_shared('$name')"), 'f', "$kind: excludes a zklock reader");
	send_query($s, "SELECT 'sql granted' FROM zk_lock('$name');");
	ok(wait_for_zk_wait($node, $s->{zk_pid}), "$kind: zklock queues behind it");
	peer_send($peer, 'release');
	ok(peer_expect($peer, qr/^released$/m), "$kind: releases");
	ok(await_output($s, qr/sql granted/), "$kind: zklock granted when it releases");
	run_sql($s, "SELECT zk_unlock('$name')");

	run_sql($s, "SELECT zk_lock_shared('$name')");
	peer_send($peer, 'try');
	ok(peer_expect($peer, qr/^busy$/m), "$kind: excluded by a zklock reader");
	run_sql($s, "SELECT zk_unlock_shared('$name')");
	peer_send($peer, 'try');
	ok(peer_expect($peer, qr/^acquired$/m), "$kind: gets it once the reader is gone");
	my @contenders = split /\n/, $node->safe_psql('postgres',
		"SELECT client || ' ' || mode || ' ' || holds FROM zk_lock_contenders('$name')");
	is_deeply(\@contenders, ["$kind exclusive true"],
		"$kind: zk_lock_contenders names the peer's node");
	peer_send($peer, 'release');
	peer_expect($peer, qr/^released$/m);
	peer_quit($peer);
	$s->quit;
	ok(zk_wait_contenders("$root/$name", 0), "$kind: no node left");
}

# A mixed queue of SQL, Curator and kazoo contenders is granted in FIFO
# order.  Curator orders children by the text after its own "lock-", which
# kazoo's names lack, so a Curator contender never queues behind a kazoo one
# here (see docs/interop.md).
{
	my $path = "$root/mixed";
	my $h = zk_session($node);
	run_sql($h, "SELECT zk_lock('mixed')");
	my @queue = (
		[ 'curator', start_peer('curator', $path) ],
		[ 'sql',     zk_session($node) ],
		[ 'kazoo',   start_peer('kazoo', $path) ],
		[ 'sql',     zk_session($node) ],
		[ 'kazoo',   start_peer('kazoo', $path) ]);
	my $n = 1;
	for my $entry (@queue)
	{
		my ($kind, $c) = @$entry;
		if ($kind eq 'sql')
		{
			send_query($c, "SELECT 'sql granted' FROM zk_lock('mixed');");
		}
		else
		{
			peer_send($c, 'acquire');
		}
		$n++;
		ok(zk_wait_contenders($path, $n), "contender $n ($kind) queued");
	}
	is($node->safe_psql('postgres',
			"SELECT string_agg(client, ',' ORDER BY queue_position) FROM zk_lock_contenders('mixed')"),
		'zklock,curator,zklock,kazoo,zklock,kazoo',
		'zk_lock_contenders shows the mixed queue in order');
	like($node->safe_psql('postgres',
			"SELECT identity FROM zk_lock_contenders('mixed') WHERE client = 'kazoo' LIMIT 1"),
		qr/^kazoo-peer$/, 'a kazoo node\'s data is shown raw');

	run_sql($h, "SELECT zk_unlock('mixed')");
	for my $i (0 .. $#queue)
	{
		my ($kind, $c) = @{ $queue[$i] };
		my $granted = $kind eq 'sql'
		  ? await_output($c, qr/sql granted/)
		  : peer_expect($c, qr/^acquired$/m);
		ok($granted, "contender " . ($i + 2) . " ($kind) granted in turn");
		if ($i < $#queue)
		{
			# While it holds, the next in line still waits.
			my ($next_kind, $next) = @{ $queue[ $i + 1 ] };
			my $waits = $next_kind eq 'sql'
			  ? still_waiting($node, $next, qr/sql granted/)
			  : peer_silent($next, 1);
			ok($waits, "and contender " . ($i + 3) . " ($next_kind) still waits");
		}
		if ($kind eq 'sql')
		{
			run_sql($c, "SELECT zk_unlock('mixed')");
			$c->quit;
		}
		else
		{
			peer_send($c, 'release');
			peer_expect($c, qr/^released$/m);
			peer_quit($c);
		}
	}
	ok(zk_wait_contenders($path, 0), 'the mixed queue drained');
	$h->quit;
}

# The peers' own incompatibility docs/interop.md warns of: Curator orders
# children by the text after its "lock-", which kazoo's nodes lack, so a
# Curator client does not wait for a kazoo holder.  (zklock waits for both.)
{
	my $path = "$root/peers";
	my $s = zk_session($node);
	my $kazoo = start_peer('kazoo', $path);
	my $curator = start_peer('curator', $path);
	peer_send($kazoo, 'acquire');
	ok(peer_expect($kazoo, qr/^acquired$/m), 'peers: a kazoo client holds');
	peer_send($curator, 'try');
	ok(peer_expect($curator, qr/^acquired$/m),
		'peers: a Curator client gets the lock beside it (the caveat in docs/interop.md)');
	is(sql_try($s, "zk_try_lock('peers')"), 'f', 'peers: zklock is excluded by both');
	peer_send($_, 'release') for ($kazoo, $curator);
	peer_expect($_, qr/^released$/m) for ($kazoo, $curator);
	peer_quit($_) for ($kazoo, $curator);
	$s->quit;
}

# kazoo's read/write locks against zklock's modes.
{
	my $path = "$root/rw";
	my $s = zk_session($node);
	my $writer = start_peer('kazoo-write', $path);
	my $reader = start_peer('kazoo-read', $path);

	run_sql($s, "SELECT zk_lock_shared('rw')");
	peer_send($writer, 'try');
	ok(peer_expect($writer, qr/^busy$/m), 'a kazoo WriteLock is excluded by a zklock reader');
	run_sql($s, "SELECT zk_unlock_shared('rw')");

	peer_send($writer, 'acquire');
	ok(peer_expect($writer, qr/^acquired$/m), 'a kazoo WriteLock is acquired');
	is(sql_try($s, "zk_try_lock_shared('rw')"), 'f', 'it excludes a zklock reader');
	is(sql_try($s, "zk_try_lock('rw')"), 'f', 'and a zklock writer');
	peer_send($writer, 'release');
	peer_expect($writer, qr/^released$/m);

	run_sql($s, "SELECT zk_lock_shared('rw')");
	peer_send($reader, 'try');
	ok(peer_expect($reader, qr/^busy$/m),
		'a kazoo ReadLock waits for a zklock reader too (stricter, but safe)');
	run_sql($s, "SELECT zk_unlock_shared('rw')");

	peer_send($reader, 'acquire');
	ok(peer_expect($reader, qr/^acquired$/m), 'a kazoo ReadLock is acquired');
	is(sql_try($s, "zk_try_lock_shared('rw')"), 't', 'a zklock reader shares with it');
	is(sql_try($s, "zk_try_lock('rw')"), 'f', 'a zklock writer is excluded by it');
	run_sql($s, "SELECT zk_unlock_shared('rw')");
	peer_send($reader, 'release');
	peer_expect($reader, qr/^released$/m);

	peer_quit($_) for ($writer, $reader);
	$s->quit;
	ok(zk_wait_contenders($path, 0), 'no node left');
}

# The caveat in docs/interop.md on kazoo's ReadLock: a waiting kazoo reader waits for
# the newest writer in the queue, even one that queued after it and so
# waits for it in turn.  Here a kazoo writer and a zklock writer queue
# behind a waiting kazoo reader; once the first writer is gone, none of the
# three gets the lock.
{
	my $path = "$root/kazoo_read";
	my $s = zk_session($node);
	my $first = start_peer('kazoo-write', $path);
	my $reader = start_peer('kazoo-read', $path);
	my $second = start_peer('kazoo-write', $path);
	peer_send($first, 'acquire');
	ok(peer_expect($first, qr/^acquired$/m), 'kazoo ReadLock caveat: a kazoo writer holds');
	peer_send($reader, 'acquire');
	ok(zk_wait_contenders($path, 2), 'a kazoo reader queues behind it');
	peer_send($second, 'acquire');
	ok(zk_wait_contenders($path, 3), 'a second kazoo writer queues behind the reader');
	send_query($s, "SELECT 'zklock writer: ' || zk_lock('kazoo_read', '5s');");
	ok(zk_wait_contenders($path, 4), 'and so does a zklock writer');
	peer_send($first, 'release');
	ok(peer_expect($first, qr/^released$/m), 'the first writer releases');
	ok(await_output($s, qr/zklock writer: false/),
		'the zklock writer, waiting for the kazoo reader, times out');
	ok(peer_silent($reader, 2),
		'the kazoo reader, waiting for the newest writer, still waits');
	ok(peer_silent($second, 1),
		'and the second kazoo writer, waiting for the reader, too');
	peer_quit($_) for ($second, $reader, $first);
	$s->quit;
	ok(zk_wait_contenders($path, 0), 'no node left once the peers have gone');
}

# Curator's read/write lock nodes are not supported, but zklock still
# counts them: a writer node excludes, a reader node shares.
{
	my $s = zk_session($node);
	ZkTest::zkinspect('create', "$root/curator_rw/_c_0f0e0d0c-0b0a-4909-8807-060504030201-__WRIT__0000000000");
	is(sql_try($s, "zk_try_lock_shared('curator_rw')"), 'f',
		'a Curator __WRIT__ node excludes a zklock reader');
	ZkTest::zkinspect('delete', "$root/curator_rw/_c_0f0e0d0c-0b0a-4909-8807-060504030201-__WRIT__0000000000");
	ZkTest::zkinspect('create', "$root/curator_rw/_c_0f0e0d0c-0b0a-4909-8807-060504030201-__READ__0000000000");
	is(sql_try($s, "zk_try_lock_shared('curator_rw') AND zk_unlock_shared('curator_rw')"), 't',
		'a Curator __READ__ node shares with a zklock reader');
	is(sql_try($s, "zk_try_lock('curator_rw')"), 'f',
		'and excludes a zklock writer');
	ZkTest::zkinspect('delete', "$root/curator_rw");
	$s->quit;
}

# zklock's lock parents are containers, which the server removes once
# nobody holds or waits.  A kazoo lock object creates its parent only the
# first time it is used, so one kept across that meets NoNodeError (the
# caveat in docs/interop.md); a new lock object per acquisition works.
{
	my $path = "$root/reaped";
	my $s = zk_session($node);
	my $reused = start_peer('kazoo-reused', $path);
	run_sql($s, "SELECT zk_lock('reaped')");
	peer_send($reused, 'try');
	ok(peer_expect($reused, qr/^busy$/m), 'a reused kazoo lock object is excluded');
	run_sql($s, "SELECT zk_unlock('reaped')");
	ok(wait_until('the empty parent to be reaped',
			sub { !grep { $_ eq 'reaped' } ZkTest::zk_children($root) }),
		'the parent is reaped once empty');
	peer_send($reused, 'try');
	ok(peer_expect($reused, qr/^error: NoNodeError/m),
		'the reused kazoo lock object then fails with NoNodeError');
	peer_quit($reused);

	my $fresh = start_peer('kazoo', $path);
	peer_send($fresh, 'try');
	ok(peer_expect($fresh, qr/^acquired$/m),
		'a new kazoo lock object per acquisition works');
	is(sql_try($s, "zk_try_lock('reaped')"), 'f', 'and excludes zklock');
	peer_send($fresh, 'release');
	peer_expect($fresh, qr/^released$/m);
	peer_quit($fresh);
	$s->quit;
	ZkTest::zkinspect('delete', $path);
}

done_testing();
