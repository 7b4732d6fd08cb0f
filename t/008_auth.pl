# ZooKeeper digest authentication and ACLs: with zklock.auth set, zklock's
# nodes are the creator's alone, an unauthenticated client cannot delete or
# overwrite them, and the password is shown to no one.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $root = '/zklock_t008';
my $password = 's3cret-pw-4242';
# Preloaded, so that zklock.auth is never an unprotected placeholder.
my $node = zk_cluster('auth', $root,
	'zklock.auth' => "'zkuser:$password'",
	'shared_preload_libraries' => "'zklock'");
$node->safe_psql('postgres', 'CREATE ROLE plain LOGIN');
my ($out, $err);

my $s = zk_session($node);
($out, $err) = run_sql($s, "SELECT zk_lock('secured')");
is($err, '', 'locks work with zklock.auth set');
my @nodes = do {
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	zk_contenders("$root/secured");
};
is(scalar @nodes, 1, 'the authenticated client sees the lock node');
my $lock_node = "$root/secured/$nodes[0]";

is(ZkTest::zkinspect('try-delete', $lock_node), "NoAuthError\n",
	'an unauthenticated client cannot delete the lock node');
is(ZkTest::zkinspect('try-set', $lock_node, 'x'), "NoAuthError\n",
	'nor overwrite it');
is(ZkTest::zkinspect('try-set', $root, 'x'), "NoAuthError\n",
	'nor overwrite the root');
is(ZkTest::zkinspect('try-delete', "$root/secured"), "NoAuthError\n",
	'nor delete the lock\'s parent');
is(ZkTest::zkinspect('try-set', "$root/secured", 'x'), "NoAuthError\n",
	'nor overwrite it');
is(ZkTest::zkinspect('try-children', "$root/secured"), "NoAuthError\n",
	'nor, by default, even list the queue');
{
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	unlike(ZkTest::zkinspect('get', $lock_node), qr/\Q$password\E/,
		'the node data holds no password');
}

# Readers are let in only when the administrator says so.
my $r = zk_session($node);
run_sql($r, "SET zklock.world_readable = on; SELECT zk_lock('readable')");
my @readable = ZkTest::zk_children("$root/readable");
is(scalar @readable, 1,
	'with zklock.world_readable an unauthenticated client can see the queue');
is(ZkTest::zkinspect('try-delete', "$root/readable/$readable[0]"), "NoAuthError\n",
	'but still cannot delete a lock node');
$r->quit;

# Other credentials cannot use a root made with these.
my $w = zk_session($node);
($out, $err) = run_sql($w, "SET zklock.auth = 'intruder:guess'; SELECT zk_try_lock('secured')");
like($err, qr/ERROR:  could not create ZooKeeper node ".*": not authenticated/,
	'other credentials get a clear error');
unlike($err, qr/guess|\Q$password\E/, 'that names no password');
($out) = run_sql($w, "SELECT 'still usable'");
is($out, 'still usable', 'and the backend keeps working');
$w->quit;

# Only superusers can set or see the credentials.
for my $sql ("SHOW zklock.auth", "SELECT current_setting('zklock.auth')",
	"SET zklock.auth = 'x:y'")
{
	my ($rc, $stdout, $stderr) = $node->psql('postgres', "SET ROLE plain; $sql");
	isnt($rc, 0, "a non-superuser cannot run: $sql");
	unlike("$stdout$stderr", qr/\Q$password\E/, 'and does not see the password');
}
is($node->safe_psql('postgres',
		"SET ROLE plain; SELECT count(*) FROM pg_settings WHERE name = 'zklock.auth'"),
	'0', 'pg_settings hides zklock.auth from non-superusers');

($out) = run_sql($s, 'SELECT zk_status()::text');
unlike($out, qr/\Q$password\E/, 'zk_status does not show the password');
run_sql($s, "SELECT zk_unlock('secured')");
$s->quit;
$node->stop;
unlike(slurp_file($node->logfile), qr/\Q$password\E/,
	'the password never reaches the server log');

done_testing();
