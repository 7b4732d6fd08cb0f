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

# --- a root or a parent made by others -----------------------------------
#
# ZooKeeper checks a delete against the parent's ACL: under a root or a
# parent with an open ACL, a client without credentials could delete a
# holder's node and let a second holder in.  zklock refuses to use them.
my $v = zk_session($node);
$v->query_safe('\set VERBOSITY verbose');
# Names of this run's own: what a client makes by hand outlives the test.
my $open_root = "/zklock_t008_open_$$";
ZkTest::zkinspect('create', "$open_root/victim");
($out, $err) = run_sql($v, "SET zklock.root = '$open_root'; SELECT zk_lock('victim')");
like($err, qr/ERROR:  55000: ZooKeeper node "\Q$open_root\E" lets clients without zklock's credentials delete lock nodes/,
	'a root made with an open ACL by a client without credentials is refused');
like($err, qr/DETAIL:  Its ACL grants "cdrwa" to world:anyone/, 'the DETAIL names the entry');
like($err, qr/HINT:  .*setAcl \Q$open_root\E auth::cdrwa/, 'the HINT says how to fix it');
is(scalar(ZkTest::zk_children("$open_root/victim")), 0, 'the refused lock leaves no node');
($out) = run_sql($v, "SELECT 'still usable'");
is($out, 'still usable', 'and the backend keeps working');

# A root whose administrator lets anyone create under it (and nothing
# more): a client without credentials makes a lock's parent there first,
# with an open ACL.
my $shared_root = "/zklock_t008_shared_$$";
{
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	ZkTest::zkinspect('create', $shared_root);
	ZkTest::zkinspect('set-acl', $shared_root, 'c');
}
ZkTest::zkinspect('create', "$shared_root/victim");
($out, $err) = run_sql($v, "SET zklock.root = '$shared_root'; SELECT zk_lock('victim')");
like($err, qr/ERROR:  55000: ZooKeeper node "\Q$shared_root\E\/victim" lets clients without zklock's credentials delete lock nodes/,
	'a lock parent made first by a client without credentials is refused');
($out, $err) = run_sql($v, "SELECT zk_lock('other_name'), zk_unlock('other_name')");
is("$out$err", '|t', 'while the root itself, closed to deletes, is used');

# A parent under zklock's own root, made by a peer with the credentials
# but an open ACL.
{
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	ZkTest::zkinspect('create', "$root/squatted_$$");
}
($out, $err) = run_sql($v, "RESET zklock.root; SELECT zk_lock('squatted_$$')");
like($err, qr/ERROR:  55000: ZooKeeper node "\Q$root\E\/squatted_\Q$$\E" lets clients without zklock's credentials delete lock nodes/,
	'a lock parent with an open ACL is refused');
{
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	is(scalar(ZkTest::zk_children("$root/squatted_$$")), 0, 'and gets no node');
	# The fix the HINT gives: the credentials' ACL alone.
	ZkTest::zkinspect('set-acl', "$root/squatted_$$");
}
($out, $err) = run_sql($v, "SELECT zk_lock('squatted_$$')");
is($err, '', 'once its ACL is set right, zklock reads it again and locks');
my @squatted = do {
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	zk_contenders("$root/squatted_$$");
};
is(ZkTest::zkinspect('try-delete', "$root/squatted_$$/$squatted[0]"), "NoAuthError\n",
	'and a client without credentials cannot delete the holder\'s node');
run_sql($v, "SELECT zk_unlock('squatted_$$')");

# The verdict is kept: a parent made by another backend costs one read of
# its ACL, the first time only.
sub requests_of
{
	my ($s, $sql) = @_;
	my ($server) = run_sql($s, 'SELECT server FROM zk_status()');
	my ($id) = run_sql($s, 'SELECT session_id FROM zk_status()');
	my $before = zk_session_last_xid($server, $id);
	run_sql($s, $sql);
	return zk_session_last_xid($server, $id) - $before;
}
my $keeper = zk_session($node);
run_sql($keeper, "SELECT zk_lock_shared('kept_parent')");
my $cycle = "SELECT zk_lock_shared('kept_parent'); SELECT zk_unlock_shared('kept_parent')";
my $first = requests_of($v, $cycle);
my $second = requests_of($v, $cycle);
is($first, $second + 1, 'a parent made by another backend: its ACL read once');
is(requests_of($v, $cycle), $second, 'and never again');
run_sql($keeper, "SELECT zk_unlock_shared('kept_parent')");
$_->quit for ($v, $keeper);

# Only superusers can set or see the credentials.  (PostgreSQL 15 words
# the refusal to show a setting differently.)
my $cannot_examine = qr/ERROR:  42501: (?:permission denied|must be superuser or have privileges of pg_read_all_settings) to examine "zklock\.auth"/;
for my $case ([ "SHOW zklock.auth", $cannot_examine ],
	[ "SELECT current_setting('zklock.auth')", $cannot_examine ],
	[ "SET zklock.auth = 'x:y'", qr/ERROR:  42501: permission denied to set parameter "zklock\.auth"/ ])
{
	my ($sql, $refusal) = @$case;
	my ($rc, $stdout, $stderr) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET ROLE plain; $sql");
	like($stderr, $refusal, "a non-superuser cannot run: $sql");
	unlike("$stdout$stderr", qr/\Q$password\E/, 'and does not see the password');
}
is($node->safe_psql('postgres',
		"SET ROLE plain; SELECT count(*) FROM pg_settings WHERE name = 'zklock.auth'"),
	'0', 'pg_settings hides zklock.auth from non-superusers');

# Members of pg_read_all_settings (pg_monitor among them) may read every
# setting, but zklock.auth shows only that it is set.
$node->safe_psql('postgres', 'CREATE ROLE monitor LOGIN IN ROLE pg_monitor');
for my $sql ("SHOW zklock.auth", "SELECT current_setting('zklock.auth')")
{
	my ($rc, $stdout, $stderr) = $node->psql('postgres', "SET ROLE monitor; $sql");
	is("$rc|$stdout", '0|********', "a pg_monitor member sees ******** for: $sql");
	unlike("$stdout$stderr", qr/\Q$password\E/, 'and not the password');
}
is($node->safe_psql('postgres',
		"SET ROLE monitor; SELECT count(*) FROM pg_settings WHERE name = 'zklock.auth'"),
	'0', 'pg_settings does not list it even to a pg_monitor member');
is($node->safe_psql('postgres', 'SHOW zklock.auth'), '********',
	'and so does a superuser');

($out) = run_sql($s, 'SELECT zk_status()::text');
unlike($out, qr/\Q$password\E/, 'zk_status does not show the password');
run_sql($s, "SELECT zk_unlock('secured')");
$s->quit;
$node->stop;
unlike(slurp_file($node->logfile), qr/\Q$password\E/,
	'the password never reaches the server log');

# The credentials in a file instead: owned by the server's user, mode 0600.
my $file_node = zk_cluster('auth_file', $root, 'shared_preload_libraries' => "'zklock'");
my $auth_file = $file_node->data_dir . '/zklock.auth';
PostgreSQL::Test::Utils::append_to_file($auth_file, "zkuser:$password\n");
chmod 0600, $auth_file;
$file_node->append_conf('postgresql.conf', "zklock.auth_file = '$auth_file'");
$file_node->reload;
my $f = zk_session($file_node);
($out, $err) = run_sql($f, "SELECT zk_lock('from_file')");
is($err, '', 'credentials from zklock.auth_file work');
my @file_nodes = do {
	local $ENV{ZKINSPECT_AUTH} = "zkuser:$password";
	zk_contenders("$root/from_file");
};
is(ZkTest::zkinspect('try-delete', "$root/from_file/$file_nodes[0]"), "NoAuthError\n",
	'and protect the lock node from an unauthenticated client');
# The root was made with the credentials of zklock.auth, the same ones.
($out, $err) = run_sql($f, "SELECT zk_try_lock('secured'), zk_unlock('secured')");
is("$out$err", 't|t', 'and work under the root made with the same credentials');
run_sql($f, "SELECT zk_unlock('from_file')");
$f->quit;

chmod 0644, $auth_file;
$f = zk_session($file_node);
($out, $err) = run_sql($f, "SELECT zk_try_lock('from_file')");
like($err, qr/ERROR:  zklock.auth_file ".*" must be a file owned by the database server's user and readable by no one else/,
	'a credentials file others can read is refused');
unlike($err, qr/\Q$password\E/, 'without showing what it holds');
run_sql($f, "SET zklock.auth_file = '" . $file_node->data_dir . "/missing'");
($out, $err) = run_sql($f, "SELECT zk_try_lock('from_file')");
like($err, qr/ERROR:  could not open zklock.auth_file ".*missing": No such file or directory/,
	'a missing one gives a clear error');
run_sql($f, "SET zklock.auth = 'zkuser:$password'; RESET zklock.auth_file");
run_sql($f, "SET zklock.auth_file = '$auth_file'");
($out, $err) = run_sql($f, "SELECT zk_try_lock('from_file')");
like($err, qr/ERROR:  zklock.auth and zklock.auth_file are both set/,
	'and so do both settings at once');
($out) = run_sql($f, "SELECT 'still usable'");
is($out, 'still usable', 'the backend keeps working');
$f->quit;
$file_node->stop;

done_testing();
