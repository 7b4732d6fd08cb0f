# Hostile neighbours: other clients put garbage children and undecodable
# data under a lock's parent, or delete the parent while contenders wait.
# zklock keeps working or gives a clear error, and never crashes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $root = '/zklock_t007';

my $node = zk_cluster('hostile', $root);
my $s = zk_session($node);
my $w = zk_session($node);
my ($out, $err);

# Children without a lock marker are not contenders.
ZkTest::zkinspect('create', "$root/garbage/notes.txt", 'junk');
($out, $err) = run_sql($s, "SELECT zk_try_lock('garbage'), zk_unlock('garbage')");
is($out, 't|t', 'children without a lock marker do not block the lock');
($out) = run_sql($s, "SELECT count(*) FROM zk_lock_contenders('garbage')");
is($out, '0', 'nor are they listed as contenders');

# A child with a lock marker but no sequence number after it cannot be
# placed in the queue: it stands ahead of everyone, so it blocks (a holder
# of some other client's making must not be overlooked), and is shown.
for my $child ('x-lock-abc', 'x-lock-12345678901', 'x-lock-',
	'x__lock__-12345678', '_c_zz-lock-99999999999', 'x-read-lock-0000000001.bak')
{
	ZkTest::zkinspect('create', "$root/garbage/$child", 'junk');
	($out, $err) = run_sql($s, "SELECT zk_try_lock_shared('garbage')");
	is($out, 'f', "$child: blocks even a reader");
	is($err, '', "$child: without an error");
	($out) = run_sql($s,
		"SELECT queue_position, node, mode, holds FROM zk_lock_contenders('garbage')");
	is($out, "1|$child|exclusive|t", "$child: listed first, as an exclusive holder");
	ZkTest::zkinspect('delete', "$root/garbage/$child");
	($out) = run_sql($s, "SELECT zk_try_lock('garbage'), zk_unlock('garbage')");
	is($out, 't|t', "$child: once it is gone the lock is free");
}

# Sequence numbers that cannot order the queue.  A parent's counter counts
# every child created or deleted under it, so after another client's
# non-sequential create the next sequential one gets the same number: two
# tied contenders.  The one created first holds, whatever the names say
# (this node's name sorts after any zklock node's).
my $tied = '_c_ffffffff-ffff-4fff-bfff-ffffffffffff-lock-0000000001';
ZkTest::zkinspect('create', "$root/tie", '');
ZkTest::zkinspect('create', "$root/tie/$tied", 'holder');
($out) = run_sql($s, "SELECT zk_try_lock('tie')");
is($out, 'f', 'a contender tied with an earlier holder does not get the lock');
($out) = run_sql($s, "SELECT node, holds FROM zk_lock_contenders('tie')");
is($out, "$tied|t", 'the earlier, tied node is shown holding');
send_query($s, "SELECT 'tie granted' FROM zk_lock('tie');");
ok(wait_until('a tied waiter to queue',
		sub { grep { /-lock-0000000002$/ } ZkTest::zk_children("$root/tie") }),
	'a waiter queues behind the tied holder');
ZkTest::zkinspect('delete', "$root/tie/$tied");
ok(await_output($s, qr/tie granted/), 'and is granted once it is gone');
run_sql($s, "SELECT zk_unlock('tie')");

# A negative number, as ZooKeeper hands out once the counter has wrapped,
# goes by its creation: behind the holder created before it, ahead of a
# waiter created after it.
my $wrapped = '_c_00000000-0000-4000-8000-000000000000-lock--2147483648';
run_sql($w, "SELECT zk_lock('wrap')");
ZkTest::zkinspect('create', "$root/wrap/$wrapped", 'after the wrap');
($out) = run_sql($s, "SELECT zk_try_lock('wrap')");
is($out, 'f', 'a holder excludes others beside a wrapped node');
($out) = run_sql($s,
	"SELECT string_agg(queue_position || ':' || holds, ',') FROM zk_lock_contenders('wrap')");
is($out, '1:true,2:false', 'the wrapped node queues behind the holder created before it');
run_sql($w, "SELECT zk_unlock('wrap')");
($out) = run_sql($s, "SELECT zk_try_lock('wrap')");
is($out, 'f', 'and holds the lock after it, so a later contender waits');
ZkTest::zkinspect('delete', "$root/wrap/$wrapped");
($out) = run_sql($s, "SELECT zk_try_lock('wrap'), zk_unlock('wrap')");
is($out, 't|t', 'until it is gone');

# A foreign contender whose name is longer than any zklock path: a waiter
# watches it like any other, and does not spin while it waits.
my $long = ('x' x 3000) . '-lock-0000000000';
ZkTest::zkinspect('create', "$root/longname/$long", 'long');
($out) = run_sql($s, 'SELECT server, session_id FROM zk_status()');
my ($server, $sid) = split /\|/, $out;
my $xid_before = zk_session_last_xid($server, $sid);
($out, $err) = run_sql($s, "SELECT zk_lock('longname', '3s')");
is($out, 'f', 'a waiter behind a long-named holder times out');
is($err, '', 'without an error');
cmp_ok(zk_session_last_xid($server, $sid) - $xid_before, '<', 20,
	'having sent a handful of requests in 3 s, not a stream');
ZkTest::zkinspect('delete', "$root/longname/$long");

# A contender another client made with bytes that are not UTF-8.
ZkTest::zkinspect('create', "$root/binary/_c_0f0e0d0c-0b0a-4909-8807-060504030201-lock-0000000000",
	'hex:fffe00c3');
($out, $err) = run_sql($s,
	"SELECT client, identity, holds FROM zk_lock_contenders('binary')");
is($out, 'curator|\\xfffe00c3|t', 'undecodable node data is shown as hex');
is($err, '', 'without an error');
($out) = run_sql($s, "SELECT zk_try_lock('binary')");
is($out, 'f', 'and the foreign contender still holds the lock');

# Data that looks like zklock's but is not is shown raw, not decoded.
ZkTest::zkinspect('create', "$root/fake/_c_0f0e0d0c-0b0a-4909-8807-060504030202-lock-0000000000",
	'{"host":"h","port":1,"pid":2,"database":"d","user":"u","application_name":"a"} trailing');
($out) = run_sql($s, "SELECT client FROM zk_lock_contenders('fake')");
is($out, 'curator', 'near-miss identity data is not taken for zklock\'s');

# Another client deletes a waiting contender's node, and then the holder's
# and the whole parent, while it waits.  (The waiter's node goes first: were
# the holder's to go first, the waiter would rightly be granted.)
for my $parent_goes (0, 1)
{
	my $what = $parent_goes ? 'with the parent' : 'alone';
	run_sql($s, "SELECT zk_lock('vanishing')");
	send_query($w, "SELECT zk_lock('vanishing');");
	ok(wait_for_zk_wait($node, $w->{zk_pid}), "$what: a waiter queues");
	ok(zk_wait_contenders("$root/vanishing", 2), "$what: behind the holder");
	my ($holder, $waiter) = zk_contenders("$root/vanishing");
	ZkTest::zkinspect('delete', "$root/vanishing/$waiter");
	if ($parent_goes)
	{
		ZkTest::zkinspect('delete', "$root/vanishing/$holder");
		# The server may reap the empty container first.
		like(ZkTest::zkinspect('try-delete', "$root/vanishing"), qr/^(ok|NoNodeError)$/,
			"$what: the parent is deleted");
	}
	else
	{
		run_sql($s, "SELECT zk_unlock('vanishing')");
	}
	ok(await_output($w, qr/ERROR:  zklock lock node ".*" disappeared while waiting/),
		"$what: the waiter gets a clear error when its node is deleted under it");
	($out, $err) = run_sql($w, "SELECT zk_try_lock('vanishing'), zk_unlock('vanishing')");
	is($out, 't|t', "$what: the lock works again afterwards");
	if ($parent_goes)
	{
		($out, $err) = run_sql($s, "SELECT zk_unlock('vanishing')");
		is($out, 't', 'the holder whose node was deleted still unlocks cleanly');
		is($err, '', 'without an error');
	}
}

# In a SQL_ASCII database a name may hold bytes that are not UTF-8 at all;
# they are percent-encoded like any other.
$node->safe_psql('postgres',
	"CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
$node->safe_psql('ascii', 'CREATE EXTENSION zklock');
# The hold is kept while listing: an empty container parent may be reaped
# by the ensemble at any moment once it is released.
my $ascii = zk_session($node, 'ascii');
my $odd_name = "convert_from('\\xff2fc0'::bytea, 'SQL_ASCII')";
($out, $err) = run_sql($ascii, "SELECT zk_try_lock($odd_name)");
is($out, 't', 'a name with invalid UTF-8 bytes locks in a SQL_ASCII database');
ok((grep { $_ eq '%FF%2F%C0' } ZkTest::zk_children($root)),
	'under one percent-encoded node directly below the root');
($out, $err) = run_sql($ascii, "SELECT zk_unlock($odd_name)");
is($out, 't', 'and unlocks');
$ascii->quit;

# Published waits that zklock did not write.  A kazoo client holds a lock
# and publishes a "wait" for its own session, which a zklock waiter behind
# it reads in its deadlock check: a path the client library would refuse,
# a parent under another root, a waiting node that does not exist.  None
# makes the waiter fail, and none makes a deadlock.
{
	my $peer = start_peer('kazoo', "$root/hostile_wait");
	peer_send($peer, 'acquire');
	ok(peer_expect($peer, qr/^acquired$/m), 'published waits: a kazoo client holds a lock');
	run_sql($s, "SELECT zk_lock('mine')");
	for my $data ("/a//b\\nx-lock-0000000001\\n{}",
		"/elsewhere/mine\\nx-lock-0000000001\\n{}",
		"$root/mine\\n_c_00000000-0000-4000-8000-000000000000-lock-0000000000\\n{}",
		'garbage')
	{
		peer_send($peer, "fake-wait $root/%waits $data");
		ok(peer_expect($peer, qr/^published$/m), "published waits: $data is published");
		($out, $err) = run_sql($w, "SELECT zk_lock('hostile_wait', '2s')");
		is($out, 'f', "published waits: $data: a waiter behind the client waits on");
		is($err, '', "published waits: $data: without an error");
	}
	peer_quit($peer);
	run_sql($s, "SELECT zk_unlock('mine')");
}

for my $path ('garbage', 'binary', 'fake', 'tie', 'longname', 'hostile_wait')
{
	ZkTest::zkinspect('delete', "$root/$path");
}
$s->quit;
$w->quit;
done_testing();
