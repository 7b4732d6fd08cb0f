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
my ($out, $err);

# Garbage children are not contenders.
for my $child ('garbage', 'x-lock-abc', 'x-lock-12345678901', 'x-lock-',
	'x__lock__-12345678', "_c_zz-lock-99999999999")
{
	ZkTest::zkinspect('create', "$root/garbage/$child", 'junk');
}
($out, $err) = run_sql($s, "SELECT zk_try_lock('garbage'), zk_unlock('garbage')");
is($out, 't|t', 'garbage children do not block the lock');
($out) = run_sql($s, "SELECT count(*) FROM zk_lock_contenders('garbage')");
is($out, '0', 'nor are they listed as contenders');

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
my $w = zk_session($node);
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
		ZkTest::zkinspect('delete', "$root/vanishing");
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

for my $path ('garbage', 'binary', 'fake')
{
	ZkTest::zkinspect('delete', "$root/$path");
}
$s->quit;
$w->quit;
done_testing();
