#!/usr/bin/perl
# Check a history of lock holds for mutual exclusion (test/t/016_history.pl).
#
# Usage: history_check.pl [--quiet-from SECONDS] [--session-timeout SECONDS] FILE...
#
# Each line of the input is a record of words "key=value" after a kind:
#
#   hold client=C pid=P id=I res=R mode=M slots=N acq=T token=K
#        rel=T reldone=T relok=0|1
#       one hold, I naming it: R the lock's name (the name of a semaphore,
#       of a kazoo Lock's node under zklock.root: every client records the
#       same name for the same lock), M exclusive, shared or slot (N
#       slots), acq when the acquire returned; rel when the release (or
#       COMMIT) was sent, relok whether it succeeded.  Other words (when
#       the release returned) are for reading.
#   commit hold=I at=T
#       a write under the hold I committed, at T: its PostgreSQL commit
#       timestamp (track_commit_timestamp), read from the table afterwards.
#   freeze pid=P from=T to=T
#       the backend P was stopped from..to (SIGSTOP).
#   client client=C
#       C took part, vouched holds or not.
# Times are seconds on the system's wall clock, the clock of PostgreSQL's
# commit timestamps.
#
# A hold is vouched for when zklock (or the peer client) said it was held:
# a write under it committed, or its release or COMMIT succeeded.  Its
# vouched interval runs from acq to the latest commit timestamp of its
# writes and, if the release succeeded, the moment it was sent.  Where
# zklock keeps its word, each of those lies inside the real hold, however
# late a reply comes: the grant came before acq; a commit timestamp is
# taken as the transaction commits, after zklock's commit check and before
# a transaction-level lock is let go (if anything, a little before the
# commit is visible: that can hide an overlap); a release takes effect
# after it was sent.  So vouched intervals that overlap are holds that
# overlapped, provided nothing stalls the backend between zklock's commit
# check and the commit timestamp: a stall there (the commit margin) is
# outside what zklock promises, and the test's freezes land before a
# write's commit starts.  Neither the moment a write was sent
# (it can commit much later, after a freeze or a cut, when another client
# holds) nor the moment its reply came would do: the lock is free, and the
# next holder may have it, before a COMMIT's reply leaves the server.
#
# The checker fails on:
#   - two vouched intervals of one lock that overlap, unless both shared;
#   - more vouched intervals of one semaphore at once than its slots;
#   - a vouched exclusive hold whose token is not larger than the token of
#     every vouched hold of that lock that began before it, unless it is
#     equal to that of the latest such hold, by the same backend (a node
#     kept after its release and taken again, zklock.keep_released);
#   - a hold of a backend frozen for longer than the session timeout,
#     taken before the freeze, that something after the freeze ended
#     vouched for (a write that committed then, a release sent then that
#     succeeded): the backend did that after it woke, when the lock was no
#     longer its own;
#   - a write committed under a hold no client recorded;
#   - a client with no vouched hold that began after --quiet-from (the last
#     fault), when that is given.
# It prints its counts, each lock's vouched holds and clients, and each
# violation, and exits 1 if there is one; a record with a field missing or
# not a number where one is due makes it exit 2.
use strict;
use warnings;

use Getopt::Long;

my ($quiet_from, $session_timeout);
GetOptions('quiet-from=f' => \$quiet_from,
	'session-timeout=f' => \$session_timeout)
  or die "usage: $0 [--quiet-from S] [--session-timeout S] FILE...\n";

# The fields each kind of record must have, and which are numbers.
my $number = qr/^-?\d+(?:\.\d+)?$/;
my %fields = (
	hold => { map { $_ => (/^(acq|rel|relok|slots|token)$/ ? 1 : 0) }
		  qw(client pid id res mode slots acq token rel relok) },
	commit => { hold => 0, at => 1 },
	freeze => { pid => 0, from => 1, to => 1 },
	client => { client => 0 });

my (%recorded, %committed, @freezes, %clients);
while (my $line = <>)
{
	chomp $line;
	next if $line =~ /^\s*(#|$)/;
	my ($kind, @words) = split ' ', $line;
	my %r = map { split /=/, $_, 2 } @words;
	if (my $need = $fields{$kind})
	{
		for my $f (sort keys %$need)
		{
			next if defined $r{$f} && $r{$f} ne '' && (!$need->{$f} || $r{$f} =~ $number);
			print "bad record (field $f): $line\n";
			exit 2;
		}
	}
	if ($kind eq 'hold')
	{
		$clients{ $r{client} } = 1;
		die "hold $r{id} recorded twice\n" if $recorded{ $r{id} };
		$recorded{ $r{id} } = \%r;
	}
	elsif ($kind eq 'commit')
	{
		$committed{ $r{hold} } = $r{at}
		  if !defined $committed{ $r{hold} } || $r{at} > $committed{ $r{hold} };
	}
	elsif ($kind eq 'freeze')
	{
		push @freezes, \%r;
	}
	elsif ($kind eq 'client')
	{
		$clients{ $r{client} } = 1;
	}
	else
	{
		die "unknown record: $line\n";
	}
}

my (@holds, @violations);
for my $id (sort keys %committed)
{
	push @violations, "writes committed under hold $id, which no client recorded"
	  unless $recorded{$id};
}
for my $h (values %recorded)
{
	my @vouched;
	push @vouched, $h->{rel} if $h->{relok};
	push @vouched, $committed{ $h->{id} } if defined $committed{ $h->{id} };
	next unless @vouched;
	$h->{end} = (sort { $b <=> $a } @vouched)[0];
	push @holds, $h;
}

sub describe
{
	my ($h) = @_;
	return sprintf('%s (pid %s, %s) %.6f..%.6f token %s',
		$h->{client}, $h->{pid}, $h->{mode}, $h->{acq}, $h->{end}, $h->{token});
}

# Overlaps, resource by resource: a sweep in order of acquisition.
my %by_res;
my $taken_again = 0;
push @{ $by_res{ $_->{res} } }, $_ for @holds;
for my $res (sort keys %by_res)
{
	my @sorted = sort { $a->{acq} <=> $b->{acq} } @{ $by_res{$res} };
	my @active;
	my $max_token = 0;
	my $max_pid = '';
	for my $h (@sorted)
	{
		@active = grep { $_->{end} > $h->{acq} } @active;
		if ($h->{mode} eq 'slot')
		{
			my $slots = $h->{slots};
			push @violations, sprintf('%s: %d holders of %d slots at %.6f: %s',
				$res, @active + 1, $slots, $h->{acq},
				join('; ', map { describe($_) } @active, $h))
			  if @active + 1 > $slots;
		}
		else
		{
			for my $other (@active)
			{
				next if $h->{mode} eq 'shared' && $other->{mode} eq 'shared';
				push @violations, sprintf('%s: two holders: %s and %s', $res,
					describe($other), describe($h));
			}
			my $again = $h->{mode} eq 'exclusive' && $h->{token} == $max_token &&
			  $h->{pid} eq $max_pid;
			$taken_again++ if $again;
			push @violations, sprintf('%s: token %s of %s is not larger than %s, held before',
				$res, $h->{token}, describe($h), $max_token)
			  if $h->{mode} eq 'exclusive' && $h->{token} <= $max_token && !$again;
			($max_token, $max_pid) = ($h->{token}, $h->{pid}) if $h->{token} > $max_token;
		}
		push @active, $h;
	}
}

# Holds vouched for across a freeze that outlasted the session.
for my $f (@freezes)
{
	next if defined $session_timeout && $f->{to} - $f->{from} <= $session_timeout;
	for my $h (grep { $_->{pid} eq $f->{pid} } @holds)
	{
		my $commit = $committed{ $h->{id} };
		push @violations, sprintf('vouched for after a freeze of pid %s (%.6f..%.6f): %s',
			$f->{pid}, $f->{from}, $f->{to}, describe($h))
		  if $h->{acq} < $f->{from}
		  && ((defined $commit && $commit > $f->{to})
			|| ($h->{relok} && $h->{rel} > $f->{to}));
	}
}

# Progress once the faults stopped.
if (defined $quiet_from)
{
	for my $client (sort keys %clients)
	{
		push @violations, "$client: no vouched hold after the faults stopped at $quiet_from"
		  unless grep { $_->{client} eq $client && $_->{acq} >= $quiet_from } @holds;
	}
}

printf "history: %d vouched holds by %d clients on %d resources, %d freezes, %d violations\n",
  scalar @holds, scalar keys %clients, scalar keys %by_res, scalar @freezes,
  scalar @violations;
printf "exclusive holds on a kept node taken again: %d\n", $taken_again;
for my $res (sort keys %by_res)
{
	my %by = map { $_->{client} => 1 } @{ $by_res{$res} };
	printf "resource %s: %d vouched holds by %s\n", $res, scalar @{ $by_res{$res} },
	  join(', ', sort keys %by);
}
print "violation: $_\n" for @violations;
exit(@violations ? 1 : 0);
