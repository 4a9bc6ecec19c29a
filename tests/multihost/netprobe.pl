#!/usr/bin/perl
# netprobe.pl: tiny TCP/UDP probes for the multi-host test bed (perl + Time::HiRes, which Debian's
# perl package has; build-essential pulls it in). Every mode is bounded by a timeout in seconds.
#
#   tcp-sink  PORT [TIMEOUT]            accept one connection, read to EOF; prints "BYTES SECONDS MBIT/S"
#   tcp-send  HOST PORT BYTES [TIMEOUT] connect (retrying until TIMEOUT), send BYTES, half-close, wait for EOF
#   tcp-echo  PORT [TIMEOUT] [CONNS]    accept CONNS (1) connections one after the other, echo each until EOF
#   tcp-rtt   HOST PORT COUNT [TIMEOUT] 1-byte ping-pong COUNT times; prints "MIN_MS MEDIAN_MS MAX_MS"
#   tcp-connect HOST PORT [TIMEOUT]     exit 0 if a connection is accepted within TIMEOUT, else 1
#   udp-sink  PORT SECONDS              count datagrams for SECONDS after the first; prints the count
#   udp-send  HOST PORT COUNT           send COUNT 100-byte datagrams, 200 us apart
# Exit status 0 on success, 1 on failure or timeout (with a message on stderr).
use strict;
use warnings;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY SOL_SOCKET SO_REUSEADDR);
use Time::HiRes qw(time sleep);

my $mode = shift @ARGV // '';
sub fail { print STDERR "netprobe $mode: @_\n"; exit 1; }
sub arm { my $t = shift; $SIG{ALRM} = sub { fail("timed out after $t s") }; alarm($t); }

sub listener {
    my ($port, $proto) = @_;
    my $s = IO::Socket::INET->new(LocalAddr => '0.0.0.0', LocalPort => $port, Proto => $proto,
                                  ReuseAddr => 1, ($proto eq 'tcp' ? (Listen => 64) : ()))
        or fail("cannot listen on port $port: $!");
    return $s;
}

sub connect_retry {
    my ($host, $port, $timeout) = @_;
    my $end = time + $timeout;
    while (1) {
        my $left = $end - time;
        fail("cannot connect to $host:$port within $timeout s") if $left <= 0;
        my $c = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Proto => 'tcp',
                                      Timeout => $left < 1 ? 1 : $left);
        if ($c) { setsockopt($c, IPPROTO_TCP, TCP_NODELAY, 1); return $c; }
        sleep 0.02;   # refused: the server is not listening yet
    }
}

if ($mode eq 'tcp-sink') {
    my ($port, $t) = @ARGV;
    $t //= 60;
    arm($t);
    my $l = listener($port, 'tcp');
    my $c = $l->accept or fail("accept: $!");
    my $t0 = time;
    my ($total, $buf) = (0, '');
    while (1) {
        my $n = sysread($c, $buf, 1 << 20);
        fail("read: $!") unless defined $n;
        last if $n == 0;
        $total += $n;
    }
    my $dt = time - $t0;
    close $c;
    printf "%d %.6f %.1f\n", $total, $dt, $dt > 0 ? $total * 8 / $dt / 1e6 : 0;
} elsif ($mode eq 'tcp-send') {
    my ($host, $port, $bytes, $t) = @ARGV;
    $t //= 60;
    arm($t);
    my $c = connect_retry($host, $port, $t);
    my $chunk = 'x' x (1 << 16);
    my $left = $bytes;
    while ($left > 0) {
        my $n = syswrite($c, $chunk, $left < length($chunk) ? $left : length($chunk));
        fail("write: $!") unless defined $n;
        $left -= $n;
    }
    shutdown($c, 1);
    my $buf;
    1 while sysread($c, $buf, 4096);   # until the sink closes: everything arrived
} elsif ($mode eq 'tcp-echo') {
    my ($port, $t, $conns) = @ARGV;
    $t //= 60;
    $conns //= 1;
    arm($t);
    my $l = listener($port, 'tcp');
    for (1 .. $conns) {
        my $c = $l->accept or fail("accept: $!");
        setsockopt($c, IPPROTO_TCP, TCP_NODELAY, 1);
        my $buf;
        while (1) {
            my $n = sysread($c, $buf, 65536);
            last unless $n;   # EOF, or a reset
            defined(syswrite($c, $buf, $n)) or last;
        }
        close $c;
    }
} elsif ($mode eq 'tcp-rtt') {
    my ($host, $port, $count, $t) = @ARGV;
    $t //= 60;
    arm($t);
    my $c = connect_retry($host, $port, $t);
    my @rtt;
    my $buf;
    for (1 .. $count) {
        my $t0 = time;
        syswrite($c, 'p', 1) == 1 or fail("write: $!");
        my $n = sysread($c, $buf, 1);
        fail("connection closed") unless $n;
        push @rtt, (time - $t0) * 1000;
    }
    shutdown($c, 1);
    @rtt = sort { $a <=> $b } @rtt;
    printf "%.3f %.3f %.3f\n", $rtt[0], $rtt[int(@rtt / 2)], $rtt[-1];
} elsif ($mode eq 'tcp-connect') {
    my ($host, $port, $t) = @ARGV;
    $t //= 5;
    my $c = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Proto => 'tcp', Timeout => $t);
    exit($c ? 0 : 1);
} elsif ($mode eq 'udp-sink') {
    my ($port, $secs) = @ARGV;
    arm($secs + 30);
    my $s = listener($port, 'udp');
    my ($count, $end, $buf) = (0, undef, '');
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    while (1) {
        my $wait = defined $end ? $end - time : 30;
        last if $wait <= 0;
        my $rout;
        last unless select($rout = $rin, undef, undef, $wait);
        recv($s, $buf, 2048, 0);
        $end //= time + $secs;
        $count++;
    }
    print "$count\n";
} elsif ($mode eq 'udp-send') {
    my ($host, $port, $count) = @ARGV;
    arm(60);
    my $s = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Proto => 'udp')
        or fail("socket: $!");
    my $msg = 'u' x 100;
    for (1 .. $count) { send($s, $msg, 0); sleep 0.0002; }
} else {
    print STDERR "usage: netprobe.pl tcp-sink|tcp-send|tcp-echo|tcp-rtt|tcp-connect|udp-sink|udp-send ARGS (see the header)\n";
    exit 2;
}
exit 0;
