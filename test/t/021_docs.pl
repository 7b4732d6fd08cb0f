# Every SQL example in the README and in docs/ runs as written: each
# ```sql block is run by psql (ON_ERROR_STOP, so psql's own \gset and \if
# work too) in a fresh database of a cluster with zklock (one that
# schedules a pg_cron job, in pg_cron's database), so the docs cannot drift
# from the functions, their arguments or their settings; and no SQL sits
# in a block of another kind, where it would not be run.
# Outputs are not compared: the examples show made-up data.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ZkTest;

my $src = $ENV{ZKLOCK_SRC};
my $pkglibdir = `pg_config --pkglibdir`;
chomp $pkglibdir;
my $have_cron = -f "$pkglibdir/pg_cron.so";
my $node = zk_cluster('docs', '/zklock_t021',
	shared_preload_libraries => $have_cron ? "'zklock,pg_cron'" : "'zklock'");

# The tables the examples write to.
my $fixtures = 'CREATE TABLE incoming (id int); CREATE TABLE batches (id int);
	CREATE TABLE job_state (finished timestamptz); INSERT INTO job_state VALUES (NULL)';

$node->safe_psql('postgres', "CREATE EXTENSION pg_cron; $fixtures") if $have_cron;

my @files = ("$src/README.md", sort glob("$src/docs/*.md"));
my $blocks = 0;
# Blocks of another kind (output, settings, shell) are not run, so SQL in
# one would break the README's promise unseen: a line that opens with a
# statement's first word marks one.
my $statement = qr/^(?:SELECT|WITH|CREATE|ALTER|DROP|INSERT|UPDATE|DELETE
	|BEGIN|COMMIT|SET|RESET|SHOW|GRANT|REVOKE|CALL|DO)(?:\s|;|$)/x;
my @sql_elsewhere;
for my $file (@files)
{
	my ($in, $kind, $start, @sql) = (0, '', 0);
	my $n = 0;
	for my $line (split /\n/, slurp_file($file))
	{
		$n++;
		if (!$in && $line =~ /^```(\S*)\s*$/)
		{
			($in, $kind, $start, @sql) = (1, $1, $n);
			next;
		}
		if ($in && $line =~ /^```/)
		{
			$in = 0;
			my $where = ($file =~ s{^\Q$src\E/}{}r) . ":$start";
			if ($kind ne 'sql')
			{
				push @sql_elsewhere, $where if grep { $_ =~ $statement } @sql;
				next;
			}
			my $db = 'docs_' . ++$blocks;
			my $text = join("\n", @sql) . "\n";
			# pg_cron's jobs are scheduled in the one database it lives in.
			my $cron = $text =~ /\bcron\./;
			if ($cron && !$have_cron)
			{
			  SKIP:
				{
					skip "$where: pg_cron is not installed (scripts/build-pg-cron installs it)", 1;
				}
				next;
			}
			if ($cron)
			{
				$db = 'postgres';
			}
			else
			{
				$node->safe_psql('postgres', "CREATE DATABASE $db");
				$node->safe_psql($db, "CREATE EXTENSION zklock; $fixtures")
				  if $text !~ /CREATE EXTENSION zklock/;
			}
			my ($rc, $out, $err) = $node->psql($db, $text,
				extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
			is($rc . $err, '0', "the SQL example at $where runs");
			$node->safe_psql($db, 'SELECT cron.unschedule(jobid) FROM cron.job') if $cron;
			next;
		}
		push @sql, $line if $in;
	}
	ok(!$in, "$file: every code block is closed");
}
cmp_ok($blocks, '>=', 9, 'the examples were found');
is_deeply(\@sql_elsewhere, [], 'every SQL example is in a block tagged sql');
done_testing();
