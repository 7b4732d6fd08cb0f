# TLS to ZooKeeper.  With ZKLOCK_EXPECT_TLS=1 (scripts/test-tls, against a
# build with a TLS-capable client library): a 3-server ensemble with TLS
# client ports, certificates made here with openssl and keytool; zklock
# takes, waits for and releases locks over TLS, shares a lock with a kazoo
# client over TLS, works with zklock.auth and an encrypted key, and fails
# with a clear error, within zklock.connect_timeout, given a wrong CA, a
# client certificate the servers do not trust, a plain-text port, or a
# server that never answers the handshake (which leaves no thread behind and
# does not keep the other servers from being used); incomplete settings and
# files OpenSSL cannot load are an ERROR at once.  Without it (the default build):
# setting TLS up is an ERROR that says how to get a TLS build, never a
# session in plain text.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time);
use ZkTest;

my $root = '/zklock_t012';
my $certs = PostgreSQL::Test::Utils::tempdir();
my ($out, $err);

# --- a build without TLS support ---------------------------------------------
if (!$ENV{ZKLOCK_EXPECT_TLS})
{
	my $node = zk_cluster('plain', $root,
		'zklock.tls_ca' => "'$certs/ca.pem'",
		'zklock.tls_cert' => "'$certs/client.pem'",
		'zklock.tls_key' => "'$certs/client.key'");
	my $s = zk_session($node);
	($out, $err) = run_sql($s, "SELECT zk_try_lock('plain')");
	like($err, qr/ERROR:  zklock.tls_\* is set, but this build of zklock has no TLS support/,
		'without TLS support, TLS settings make a lock call fail');
	like($err, qr/HINT:  Build a TLS-capable client library with scripts\/build-zookeeper-tls/,
		'with a hint how to get a TLS build');
	($out) = run_sql($s, 'SELECT state, tls FROM zk_status()');
	is($out, 'closed|f', 'and no session is opened, in plain text or otherwise');
	$s->quit;
	done_testing();
	exit 0;
}

# --- certificates --------------------------------------------------------------
sub run_or_die
{
	my @cmd = @_;
	my ($stdout, $stderr);
	IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr)
	  or die "@cmd failed: $stderr";
	return;
}

# A CA, and a certificate it signs for each name.
sub make_ca
{
	my ($name) = @_;
	run_or_die('openssl', 'req', '-x509', '-new', '-newkey', 'rsa:2048', '-nodes',
		'-keyout', "$certs/$name.key", '-out', "$certs/$name.pem", '-days', '2',
		'-subj', "/CN=zklock test $name",
		'-addext', 'basicConstraints=critical,CA:TRUE',
		'-addext', 'keyUsage=critical,keyCertSign,cRLSign');
	return;
}

sub make_cert
{
	my ($name, $ca, $usage, $san) = @_;
	PostgreSQL::Test::Utils::append_to_file("$certs/$name.ext",
		"keyUsage=critical,digitalSignature,keyEncipherment\n"
		  . "extendedKeyUsage=$usage\n" . ($san ? "subjectAltName=$san\n" : ''));
	run_or_die('openssl', 'req', '-new', '-newkey', 'rsa:2048', '-nodes',
		'-keyout', "$certs/$name.key", '-out', "$certs/$name.csr",
		'-subj', "/CN=zklock test $name");
	run_or_die('openssl', 'x509', '-req', '-in', "$certs/$name.csr",
		'-CA', "$certs/$ca.pem", '-CAkey', "$certs/$ca.key", '-CAcreateserial',
		'-out', "$certs/$name.pem", '-days', '2', '-sha256',
		'-extfile', "$certs/$name.ext");
	chmod 0600, "$certs/$name.key";
	return;
}

make_ca('ca');
make_ca('other-ca');
make_cert('server', 'ca', 'serverAuth,clientAuth', 'DNS:localhost,IP:127.0.0.1');
make_cert('client', 'ca', 'clientAuth');
make_cert('client2', 'ca', 'clientAuth');
make_cert('stranger', 'other-ca', 'clientAuth');
run_or_die('openssl', 'pkey', '-in', "$certs/client.key", '-aes256',
	'-passout', 'pass:key secret', '-out', "$certs/client-encrypted.key");
chmod 0600, "$certs/client-encrypted.key";
run_or_die('openssl', 'pkcs12', '-export', '-in', "$certs/server.pem",
	'-inkey', "$certs/server.key", '-certfile', "$certs/ca.pem",
	'-out', "$certs/server.p12", '-passout', 'pass:serverpw');
run_or_die('keytool', '-importcert', '-noprompt', '-storetype', 'PKCS12',
	'-keystore', "$certs/truststore.p12", '-storepass', 'trustpw',
	'-alias', 'ca', '-file', "$certs/ca.pem");

# --- an ensemble with TLS client ports ---------------------------------------
my ($main_port) = $ENV{ZKLOCK_TEST_HOSTS} =~ /^[^:]+:(\d+)/;
my $tls_base = $main_port - 1 + 50;
my $ensemble = PostgreSQL::Test::Utils::tempdir();

sub tls_ensemble
{
	my (@args) = @_;
	my ($stdout, $stderr);
	local $ENV{ZK_BASE_PORT} = $tls_base;
	local $ENV{ZK_TLS_KEYSTORE} = "$certs/server.p12";
	local $ENV{ZK_TLS_KEYSTORE_PASSWORD} = 'serverpw';
	local $ENV{ZK_TLS_TRUSTSTORE} = "$certs/truststore.p12";
	local $ENV{ZK_TLS_TRUSTSTORE_PASSWORD} = 'trustpw';
	IPC::Run::run([ "$ENV{ZKLOCK_SRC}/scripts/zk-ensemble", $ensemble, @args ],
		'>', \$stdout, '2>', \$stderr)
	  or die "zk-ensemble @args failed: $stderr";
	return (split /\n/, $stdout)[-1];
}
my $plain_hosts = tls_ensemble('start');
my $tls_hosts = tls_ensemble('secure-hosts');
END { tls_ensemble('stop') if defined $tls_hosts; }
# Looked at from outside through its plain ports.
$ZkTest::hosts = $plain_hosts;

# The backends get OpenSSL's default trust store pointed at the right CA:
# zklock's client must trust zklock.tls_ca alone, so the wrong-CA case
# below fails all the same.
$ENV{SSL_CERT_FILE} = "$certs/ca.pem";
my $node = zk_cluster('tls', $root,
	'zklock.hosts' => "'$tls_hosts'",
	'zklock.tls_ca' => "'$certs/ca.pem'",
	'zklock.tls_cert' => "'$certs/client.pem'",
	'zklock.tls_key' => "'$certs/client.key'",
	'zklock.connect_timeout' => "'3s'");
delete $ENV{SSL_CERT_FILE};

# --- locking over TLS ------------------------------------------------------------
my $h = zk_session($node);
my $w = zk_session($node);
($out, $err) = run_sql($h, "SELECT zk_lock('over_tls')");
is($err, '', 'a lock is taken over TLS');
($out) = run_sql($h, 'SELECT state, tls FROM zk_status()');
is($out, 'connected|t', 'zk_status says the session speaks TLS');
($out) = run_sql($h, 'SELECT server FROM zk_status()');
ok((grep { $_ eq $out } split /,/, $tls_hosts), 'to a TLS port');
send_query($w, "SELECT 'w granted' FROM zk_lock('over_tls');");
ok(wait_for_zk_wait($node, $w->{zk_pid}), 'another backend waits over TLS');
run_sql($h, "SELECT zk_unlock('over_tls')");
ok(await_output($w, qr/w granted/), 'and is granted on release');
run_sql($w, "SELECT zk_unlock('over_tls')");

# --- a kazoo client over TLS on the same lock ------------------------------
{
	my $peer = start_peer('kazoo', "$root/shared_tls", hosts => $tls_hosts,
		tls => "$certs/ca.pem,$certs/client.pem,$certs/client.key");
	peer_send($peer, 'acquire');
	ok(peer_expect($peer, qr/^acquired$/m), 'a kazoo client holds a lock over TLS');
	($out) = run_sql($h, "SELECT zk_try_lock('shared_tls')");
	is($out, 'f', 'zklock is excluded by it');
	send_query($w, "SELECT 'after kazoo' FROM zk_lock('shared_tls');");
	ok(wait_for_zk_wait($node, $w->{zk_pid}), 'and queues behind it');
	peer_send($peer, 'release');
	ok(peer_expect($peer, qr/^released$/m), 'kazoo releases');
	ok(await_output($w, qr/after kazoo/), 'and zklock gets the lock');
	peer_send($peer, 'acquire');
	ok(zk_wait_contenders("$root/shared_tls", 2), 'kazoo queues behind zklock');
	run_sql($w, "SELECT zk_unlock('shared_tls')");
	ok(peer_expect($peer, qr/^acquired$/m), 'and gets it on release');
	peer_quit($peer);
}

# --- zklock.auth and an encrypted key over TLS -------------------------------
#
# Under a root of their own: the one above was made without credentials,
# with an open ACL, which zklock refuses once it has them.
{
	my $auth_root = "${root}_auth";
	my @auth_settings = ("zklock.root = '$auth_root'",
		"zklock.auth = 'tls_user:tls_secret'",
		"zklock.tls_key = '$certs/client-encrypted.key'",
		"zklock.tls_key_password = 'key secret'");
	my $s = zk_session($node);
	run_sql($s, "SET $_") for @auth_settings;
	($out) = run_sql($s, 'SHOW zklock.tls_key_password');
	is($out, '********', 'the key password is never shown');
	($out, $err) = run_sql($s, "SELECT zk_lock('with_auth')");
	is($err, '', 'with an encrypted key and zklock.auth, a lock is taken over TLS');
	my ($node_name) = do
	{
		local $ENV{ZKINSPECT_AUTH} = 'tls_user:tls_secret';
		zk_contenders("$auth_root/with_auth");
	};
	like(ZkTest::zkinspect('try-delete', "$auth_root/with_auth/$node_name"), qr/^NoAuthError$/,
		'and an unauthenticated client cannot delete its node');

	# The root and the parent the first backend made grant its certificate's
	# x509 id too, beside the digest of the credentials: another backend with
	# both takes them for its own, and so does one with the same credentials
	# and a certificate of its own, as on another host.
	my $t = zk_session($node);
	run_sql($t, "SET $_") for @auth_settings;
	($out, $err) = run_sql($t, "SELECT zk_try_lock('with_auth')");
	is("$out$err", 'f', 'another backend with the same credentials trusts the nodes the first made');
	$t->quit;
	my $u = zk_session($node);
	run_sql($u, "SET $_") for @auth_settings[0 .. 1];
	run_sql($u, "SET zklock.tls_cert = '$certs/client2.pem'");
	run_sql($u, "SET zklock.tls_key = '$certs/client2.key'");
	($out, $err) = run_sql($u, "SELECT zk_try_lock('with_auth')");
	is("$out$err", 'f', 'and one with another certificate of the same CA');
	$u->quit;

	run_sql($s, "SELECT zk_unlock('with_auth')");
	{
		local $ENV{ZKINSPECT_AUTH} = 'tls_user:tls_secret';
		is(scalar zk_contenders("$auth_root/with_auth"), 0,
			'unlocked: no node left, with the session still open');
	}
	$s->quit;
}

# --- what fails, and how ------------------------------------------------------------
sub fails_within
{
	my ($settings, $re, $what) = @_;
	my $s = zk_session($node);
	run_sql($s, "SET $_") for @$settings;
	my $t0 = time;
	($out, $err) = run_sql($s, "SELECT zk_try_lock('failing')");
	my $took = time - $t0;
	like($err, $re, $what);
	cmp_ok($took, '<', 3 + 2, "$what: within zklock.connect_timeout (3 s)");
	($out) = run_sql($s, 'SELECT state FROM zk_status()');
	is($out, 'closed', "$what: no session is left open");
	$s->quit;
	return;
}

my $handshake = qr/ERROR:  could not connect to ZooKeeper at "[^"]+" over TLS within 3000 ms\nDETAIL:  The TLS handshake failed: /;
fails_within([ "zklock.tls_ca = '$certs/other-ca.pem'" ], $handshake,
	'a wrong CA, even with the right one as OpenSSL\'s default');
fails_within(
	[ "zklock.tls_cert = '$certs/stranger.pem'", "zklock.tls_key = '$certs/stranger.key'" ],
	qr/ERROR:  could not connect to ZooKeeper at "[^"]+"/,
	'a client certificate the servers do not trust');
fails_within([ "zklock.hosts = '$plain_hosts'" ], $handshake,
	'a plain-text port when TLS is configured');

# Incomplete or unusable settings are refused at once.
{
	my $s = zk_session($node);
	run_sql($s, "SET zklock.tls_cert = ''");
	($out, $err) = run_sql($s, "SELECT zk_try_lock('failing')");
	like($err, qr/ERROR:  zklock.tls_ca, zklock.tls_cert and zklock.tls_key must all be set for TLS/,
		'a missing client certificate is an ERROR at once');
	run_sql($s, 'RESET zklock.tls_cert');
	chmod 0640, "$certs/client.key";
	($out, $err) = run_sql($s, "SELECT zk_try_lock('failing')");
	like($err, qr/ERROR:  zklock.tls_key "[^"]+" must be a file owned by the database server's user and readable by no one else/,
		'a key others may read is refused');
	chmod 0600, "$certs/client.key";
	run_sql($s, "SET zklock.tls_ca = '$certs/missing.pem'");
	($out, $err) = run_sql($s, "SELECT zk_try_lock('failing')");
	like($err, qr/ERROR:  could not open zklock.tls_ca "[^"]+": No such file or directory/,
		'a missing CA file is an ERROR at once');
	$s->quit;
}

# Files OpenSSL cannot load are refused at once, with OpenSSL's reason: the
# client library would retry them without end.
{
	my $s = zk_session($node);
	my $refused = sub {
		my ($setting, $what) = @_;
		my $t0 = time;
		($out, $err) = run_sql($s, "SELECT zk_try_lock('failing')");
		like($err, qr/ERROR:  could not load zklock\.$setting "[^"]+"\nDETAIL:  OpenSSL reported: error:\S+/,
			"$what is an ERROR with OpenSSL's reason");
		cmp_ok(time - $t0, '<', 2, "$what: at once");
	};
	run_sql($s, "SET zklock.tls_key = '$certs/client-encrypted.key'");
	$refused->('tls_key', 'an encrypted key without its password');
	like($err, qr/HINT:  .*zklock\.tls_key_password/, 'the hint names the password setting');
	run_sql($s, "SET zklock.tls_key_password = 'not the secret'");
	$refused->('tls_key', 'a wrong key password');
	run_sql($s, 'RESET zklock.tls_key_password');
	run_sql($s, "SET zklock.tls_key = '$certs/stranger.key'");
	$refused->('tls_key', 'a key that is not the certificate\'s');
	run_sql($s, 'RESET zklock.tls_key');
	run_sql($s, "SET zklock.tls_ca = '$certs/client.key'");
	$refused->('tls_ca', 'a CA file without a certificate');
	($out) = run_sql($s, 'SELECT state FROM zk_status()');
	is($out, 'closed', 'and no session is opened');
	$s->quit;
}

# --- a server that takes the connection but never answers ---------------------
{
	# The kernel completes the connection into the backlog; nobody answers.
	my $frozen = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1',
		LocalPort => 0, Proto => 'tcp')
	  or die "cannot listen: $!";
	my $frozen_host = '127.0.0.1:' . $frozen->sockport;
	my $s = zk_session($node);
	my $threads = sub { scalar(() = glob("/proc/$s->{zk_pid}/task/*")) };
	my $before = $threads->();
	run_sql($s, "SET zklock.session_timeout = '3s'");
	run_sql($s, "SET zklock.hosts = '$frozen_host'");
	for my $try (1 .. 3)
	{
		my $t0 = time;
		($out, $err) = run_sql($s, "SELECT zk_try_lock('failing')");
		like($err, qr/ERROR:  could not connect to ZooKeeper at "\Q$frozen_host\E" over TLS within 3000 ms/,
			"a server that never answers the handshake fails, try $try");
		cmp_ok(time - $t0, '<', 3 + 2, "within zklock.connect_timeout, try $try");
	}
	ok(wait_until('the stuck handshakes to be given up',
			sub { $threads->() == $before }, 10),
		'each stuck handshake is given up: no thread is left behind');

	# The client library tries the servers in a random order: a frozen one
	# first must not keep it from the others.
	my @tls = split /,/, $tls_hosts;
	for my $try (1 .. 4)
	{
		my $hosts = join ',', $try % 2 ? ($frozen_host, $tls[0]) : ($tls[0], $frozen_host);
		run_sql($s, "SET zklock.hosts = '$hosts'");
		($out, $err) = run_sql($s, "SELECT zk_try_lock('past_frozen'), zk_unlock('past_frozen')");
		is($out, 't|t', "with a server that never answers among them, another one is used, try $try");
	}
	$s->quit;
	close $frozen;
}

# Only superusers may change where zklock connects and what it trusts.
$node->safe_psql('postgres', 'CREATE ROLE plain_user');
my ($rc, $stdout, $stderr) = $node->psql('postgres',
	"SET ROLE plain_user; SET zklock.tls_ca = '/tmp/x.pem'");
like($stderr, qr/permission denied to set parameter "zklock.tls_ca"/,
	'zklock.tls_ca is superuser-only');

is_deeply([ grep { /_tls|with_auth/ } ZkTest::zk_lock_nodes($root) ], [],
	'no lock node left, with the sessions that took them still open');
$_->quit for ($h, $w);

done_testing();
