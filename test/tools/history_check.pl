#!/usr/bin/perl
# Check a history of lock holds for mutual exclusion (test/t/016_history.pl).
#
# Usage: history_check.pl [--quiet-from SECONDS] [--session-timeout SECONDS] FILE...
#
# Each line of the input is a record of words "key=value" after a kind:
#
#   hold client=C pid=P res=R mode=M slots=N acq=T token=K
#        w=T wdone=T wok=0|1 rel=T reldone=T relok=0|1
#       one hold: R the resource (a lock name or a semaphore's), M exclusive,
#       shared or slot (N slots), acq when the acquire returned; w when the
#       last committed write under it was sent (wok: there was one); rel
#       when the release (or COMMIT) was sent, relok whether it succeeded;
#       times in seconds on one monotonic clock.  Other words (when each
#       returned) are for reading.
#   freeze pid=P from=T to=T
#       the backend P was stopped from..to (SIGSTOP).
#
# A hold is vouched for when zklock (or the peer client) said it was held:
# its release or COMMIT succeeded, or a write under it committed.  Its
# vouched interval runs from acq to the latest of those moments, which lies
# inside the real hold.  The checker fails on:
#   - two vouched intervals of one lock that overlap, unless both shared;
#   - more vouched intervals of one semaphore at once than its slots;
#   - a vouched exclusive hold whose token is not larger than the token of
#     every vouched hold of that lock that began before it;
#   - a hold of a backend frozen for longer than the session timeout,
#     taken before the freeze, that something sent after the freeze ended
#     vouched for (a write that committed, a release that succeeded): the
#     backend did that after it woke, when the lock was no longer its own;
#   - a client with no vouched hold that began after --quiet-from (the last
#     fault), when that is given.
# It prints its counts, and each violation, and exits 1 if there is one.
use strict;
use warnings;

use Getopt::Long;

my ($quiet_from, $session_timeout);
GetOptions('quiet-from=f' => \$quiet_from,
	'session-timeout=f' => \$session_timeout)
  or die "usage: $0 [--quiet-from S] [--session-timeout S] FILE...\n";

my (@holds, @freezes, %clients);
while (my $line = <>)
{
	chomp $line;
	next if $line =~ /^\s*(#|$)/;
	my ($kind, @words) = split ' ', $line;
	my %r = map { split /=/, $_, 2 } @words;
	if ($kind eq 'hold')
	{
		$clients{ $r{client} } = 1;
		my @vouched;
		push @vouched, $r{rel} if $r{relok};
		push @vouched, $r{w} if $r{wok};
		next unless @vouched;
		$r{end} = (sort { $b <=> $a } @vouched)[0];
		push @holds, \%r;
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

my @violations;

sub describe
{
	my ($h) = @_;
	return sprintf('%s (pid %s, %s) %.3f..%.3f token %s',
		$h->{client}, $h->{pid}, $h->{mode}, $h->{acq}, $h->{end}, $h->{token});
}

# Overlaps, resource by resource: a sweep in order of acquisition.
my %by_res;
push @{ $by_res{ $_->{res} } }, $_ for @holds;
for my $res (sort keys %by_res)
{
	my @sorted = sort { $a->{acq} <=> $b->{acq} } @{ $by_res{$res} };
	my @active;
	my $max_token = 0;
	for my $h (@sorted)
	{
		@active = grep { $_->{end} > $h->{acq} } @active;
		if ($h->{mode} eq 'slot')
		{
			my $slots = $h->{slots};
			push @violations, sprintf('%s: %d holders of %d slots at %.3f: %s',
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
			push @violations, sprintf('%s: token %s of %s is not larger than %s, held before',
				$res, $h->{token}, describe($h), $max_token)
			  if $h->{mode} eq 'exclusive' && $h->{token} <= $max_token;
			$max_token = $h->{token} if $h->{token} > $max_token;
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
		push @violations, sprintf('vouched for after a freeze of pid %s (%.3f..%.3f): %s',
			$f->{pid}, $f->{from}, $f->{to}, describe($h))
		  if $h->{acq} < $f->{from}
		  && (($h->{wok} && $h->{w} > $f->{to})
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
print "violation: $_\n" for @violations;
exit(@violations ? 1 : 0);
