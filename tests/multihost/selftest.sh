#!/bin/bash
# tests/multihost/selftest.sh: proves the multi-host test bed (tests/multihost/hostbed.sh) with plain
# tools: 3 hosts with distinct hostnames, private /dev/shm and /tmp, TCP between hosts, no route
# out, tc rate / delay / loss, a cut link, mpirun across 2 hosts through the rsh agent, a killed
# host, and teardown (normal, after a failing command, on SIGTERM, on SIGKILL through the watchdog,
# and a stale bed cleaned by the next hostbed_up). One line per check,
#     tests/multihost/selftest.sh:0:<name>:PASS   (or :FAIL, followed by indented details)
# then "N passed, N failed". Exit status: 0 all passed, 1 a check failed, 77 skipped (the reason on
# one line: not root, no namespaces, no iproute2/tc, ...). About 10 s.
#   usage: bash tests/multihost/selftest.sh     (as root; any working directory)
#          SELFTEST_VERBOSE=1 bash tests/multihost/selftest.sh    shows every check's measurements
ME=tests/multihost/selftest.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/hostbed.sh"
PROBE=$HERE/netprobe.pl
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if ! hostbed_require 2>/dev/null; then
    echo "$ME: skip: $HOSTBED_SKIP_REASON"
    exit 77
fi

passed=0
failed=0
T0=$EPOCHREALTIME
WORK=$(mktemp -d)
LOG=$WORK/check.log

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

check() { # name function [args]: the function's output is shown only if it fails
    local name=$1 t=$EPOCHREALTIME
    shift
    if "$@" >"$LOG" 2>&1; then
        echo "$ME:0:$name:PASS"
        passed=$((passed + 1))
    else
        echo "$ME:0:$name:FAIL"
        sed 's/^/    /' "$LOG" | head -30
        failed=$((failed + 1))
    fi
    if [ -n "${SELFTEST_VERBOSE:-}" ]; then
        sed 's/^/    /' "$LOG"
        echo "    ($(elapsed "$t") s)"
    fi
    return 0
}

have_perl=1
perl -MIO::Socket::INET -MTime::HiRes -e 1 2>/dev/null || have_perl=0

# --- the bed's own checks ------------------------------------------------------------------------

t_up() {
    local t=$EPOCHREALTIME
    hostbed_up 3 || return 1
    echo "up in $(elapsed "$t") s: $HOSTBED_DIR"
    NS_INODES=$(bed_inodes)
    BED_DIR=$HOSTBED_DIR
}

t_hostnames() {
    local h names=
    for h in h0 h1 h2; do names="$names $(hostbed_exec --timeout 10 $h hostname)"; done
    names="$names $(hostbed_exec --timeout 10 h1 hostname)" # the UTS namespace persists
    echo "hostnames:$names (root: $(hostname))"
    [ "$names" = " fsdp-h0 fsdp-h1 fsdp-h2 fsdp-h1" ] && [ "$(hostname)" != fsdp-h0 ]
}

t_addresses() {
    local h i=0 out
    for h in h0 h1 h2; do
        i=$((i + 1))
        out=$(hostbed_exec --timeout 10 $h ip -4 -o addr show dev eth0)
        echo "$h: $out"
        case $out in *" $HOSTBED_SUBNET.$i/24 "*) ;; *) return 1 ;; esac
        [ "$(hostbed_ip $h)" = "$HOSTBED_SUBNET.$i" ] || return 1
    done
    out=$(hostbed_exec --timeout 10 h0 getent hosts fsdp-h2)
    echo "h0 resolves fsdp-h2: $out"
    case $out in "$HOSTBED_SUBNET.3 "*) ;; *) return 1 ;; esac
}

t_no_route_out() {
    local out rootaddr
    out=$(hostbed_exec --timeout 10 h0 ip route show)
    echo "routes in h0: $out"
    [ -z "$(hostbed_exec --timeout 10 h0 ip route show default)" ] || return 1
    ! hostbed_exec --timeout 10 h0 ip route get 1.1.1.1 || return 1
    # nor to the root namespace's own address
    rootaddr=$(ip -4 -o addr show scope global | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
    [ -z "$rootaddr" ] || ! hostbed_exec --timeout 10 h1 ip route get "$rootaddr"
}

t_shm_private() {
    local f=hostbed_selftest_$$
    hostbed_exec --timeout 10 h0 sh -c "echo h0 >/dev/shm/$f && echo h0 >/tmp/$f" || return 1
    echo "h0 sees (2nd command): $(hostbed_exec --timeout 10 h0 ls /dev/shm /tmp | tr '\n' ' ')"
    hostbed_exec --timeout 10 h0 test -f /dev/shm/$f || return 1
    hostbed_exec --timeout 10 h0 test -f /tmp/$f || return 1
    echo "h1 sees: $(hostbed_exec --timeout 10 h1 ls /dev/shm /tmp | tr '\n' ' ')"
    ! hostbed_exec --timeout 10 h1 test -e /dev/shm/$f || return 1
    ! hostbed_exec --timeout 10 h1 test -e /tmp/$f || return 1
    ! hostbed_exec --timeout 10 h2 test -e /dev/shm/$f || return 1
    [ ! -e /dev/shm/$f ] && [ ! -e /tmp/$f ] || { echo "visible in the root namespace"; return 1; }
    # and the shared directory is shared
    hostbed_exec --timeout 10 h2 sh -c "echo shared >$HOSTBED_SHARE/$f" && [ "$(cat "$HOSTBED_SHARE/$f")" = shared ]
}

# server command in host A, client command in host B; prints the client's output
serve_and_run() { # A server-args... -- B client-args...
    local a=$1 srv=() b s rc
    shift
    while [ "$1" != -- ]; do srv+=("$1"); shift; done
    shift
    b=$1
    shift
    hostbed_spawn --timeout 30 "$a" perl "$PROBE" "${srv[@]}" >"$WORK/server.out" 2>&1
    s=$HOSTBED_SPAWNED
    hostbed_exec --timeout 30 "$b" perl "$PROBE" "$@"
    rc=$?
    wait "$s" || { echo "server: $(cat "$WORK/server.out")"; return 1; }
    return $rc
}

t_tcp() {
    local out
    out=$(serve_and_run h1 tcp-echo 5101 20 -- h0 tcp-rtt fsdp-h1 5101 20 20) || return 1
    echo "h0 -> h1 RTT ms (min median max): $out"
    out=$(serve_and_run h0 tcp-echo 5102 20 -- h2 tcp-rtt "$(hostbed_ip h0)" 5102 20 20) || return 1
    echo "h2 -> h0 RTT ms: $out"
    serve_and_run h2 tcp-sink 5103 20 -- h1 tcp-send fsdp-h2 5103 50000000 20 || return 1
    echo "h1 -> h2 50 MB: $(cat "$WORK/server.out") (bytes s Mbit/s)"
    set -- $(cat "$WORK/server.out")
    [ "$1" = 50000000 ]
}

measure_rate() { # prints Mbit/s measured at h1 for 6 MB sent by h0
    serve_and_run h1 tcp-sink "$1" 20 -- h0 tcp-send fsdp-h1 "$1" 6000000 20 >/dev/null || return 1
    set -- $(cat "$WORK/server.out")
    [ "$1" = 6000000 ] || return 1
    echo "$3"
}

t_rate() {
    local port=$1 mbit
    hostbed_shape h0 --rate 100mbit || return 1
    hostbed_exec --timeout 10 h0 tc qdisc show
    mbit=$(measure_rate "$port") || return 1
    echo "h0 shaped to 100 Mbit/s: measured $mbit Mbit/s (6 MB h0 -> h1)"
    hostbed_shape h0 --rate off || return 1
    awk -v m="$mbit" 'BEGIN { exit !(m >= 50 && m <= 200) }'
}

t_delay() {
    local out min med
    hostbed_shape h0 --delay 20ms || return 1
    echo "delay and loss by: $HOSTBED_IMPAIR"
    out=$(serve_and_run h1 tcp-echo 5201 20 -- h0 tcp-rtt fsdp-h1 5201 10 20) || return 1
    echo "h0 delayed 20 ms: RTT h0 -> h1 (min median max): $out"
    set -- $out
    min=$1 med=$2
    out=$(serve_and_run h2 tcp-echo 5202 20 -- h1 tcp-rtt fsdp-h2 5202 10 20) || return 1
    echo "unshaped pair h1 -> h2: $out"
    set -- $out
    hostbed_shape h0 --delay off || return 1
    awk -v a="$min" -v b="$med" -v c="$2" 'BEGIN { exit !(a >= 20 && b < 100 && c < 10) }'
}

t_loss() {
    local got
    hostbed_shape h0 --loss 25% || return 1
    hostbed_spawn --timeout 30 h1 perl "$PROBE" udp-sink 5301 1 >"$WORK/udp.out" 2>&1
    local s=$HOSTBED_SPAWNED
    sleep 0.2
    hostbed_exec --timeout 20 h0 perl "$PROBE" udp-send fsdp-h1 5301 400 || return 1
    wait "$s" || return 1
    got=$(cat "$WORK/udp.out")
    hostbed_shape h0 --loss off || return 1
    echo "h0 with 25% loss: $got of 400 datagrams arrived (expected 300 +- 60)"
    [ "$got" -ge 240 ] && [ "$got" -le 360 ]
}

t_link_cut() {
    local t port=$1
    hostbed_spawn --timeout 30 h1 perl "$PROBE" tcp-echo $port 25 10 >/dev/null 2>&1
    local s=$HOSTBED_SPAWNED
    hostbed_exec --timeout 10 h0 perl "$PROBE" tcp-rtt fsdp-h1 $port 1 5 >/dev/null || return 1 # listening now
    hostbed_link h1 down || return 1
    t=$EPOCHREALTIME
    if hostbed_exec --timeout 10 h0 perl "$PROBE" tcp-connect fsdp-h1 $port 1; then
        echo "connected through a cut link"
        return 1
    fi
    echo "h1 cut: a connection from h0 timed out after $(elapsed "$t") s (limit 1 s)"
    hostbed_exec --timeout 10 h2 perl "$PROBE" tcp-connect fsdp-h1 $port 1 && { echo "h2 reached the cut h1"; return 1; }
    hostbed_exec --timeout 10 h0 perl "$PROBE" tcp-connect fsdp-h2 $port 1 # (refused: nobody listens in h2)
    [ $? = 1 ] || return 1
    hostbed_link h1 up || return 1
    hostbed_exec --timeout 10 h0 perl "$PROBE" tcp-rtt fsdp-h1 $port 3 5 || return 1
    echo "h1 restored: reachable again"
    kill "$s" 2>/dev/null
    wait "$s" 2>/dev/null
    return 0
}

t_mpirun() {
    local out
    out=$(hostbed_exec --timeout 60 h0 mpirun $HOSTBED_MPI_ARGS --host fsdp-h0:2,fsdp-h1:2 -np 4 hostname) || { echo "$out"; return 1; }
    echo "mpirun -np 4 hostname from h0:" $out
    [ "$(echo "$out" | sort | tr '\n' ' ')" = "fsdp-h0 fsdp-h0 fsdp-h1 fsdp-h1 " ]
}

t_mpi_allreduce() {
    local out f
    cat >"$HOSTBED_SHARE/mpi_hello.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size;
    char host[64];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s: sum %ld\n", rank, size, host, sum);
    MPI_Finalize();
    return sum != (long)size * (size + 1) / 2;
}
EOF
    mpicc -O1 -o "$HOSTBED_SHARE/mpi_hello" "$HOSTBED_SHARE/mpi_hello.c" || return 1
    hostfile=$(hostbed_hostfile 2 h0 h1) || return 1
    # through the hostfile, TCP between hosts only (vader inside a host, tcp across)
    out=$(hostbed_exec --timeout 60 h0 mpirun $HOSTBED_MPI_ARGS --hostfile "$hostfile" -np 4 "$HOSTBED_SHARE/mpi_hello") || { echo "$out"; return 1; }
    echo "$out"
    [ "$(echo "$out" | grep -c 'sum 10$')" = 4 ] && [ "$(echo "$out" | grep -c 'on fsdp-h1')" = 2 ]
}

# ranks 2+1+3 with torchrun's environment: rank 0 (in h0) accepts one connection from every other
# rank at MASTER_ADDR:MASTER_PORT, each rank writes what it saw
t_ranks() {
    local r rc
    hostbed_ranks --timeout 30 --port 29517 2,1,3 sh -c '
        echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK of $LOCAL_WORLD_SIZE node $NODE_RANK on $(hostname) master $MASTER_ADDR:$MASTER_PORT"
        if [ "$RANK" = 0 ]; then exec perl "$0" tcp-echo "$MASTER_PORT" 20 $((WORLD_SIZE - 1)); fi
        exec perl "$0" tcp-rtt "$MASTER_ADDR" "$MASTER_PORT" 3 20' "$PROBE"
    rc=$?
    echo "statuses: ${HOSTBED_RANK_STATUS[*]}"
    cat "$HOSTBED_SHARE"/rank*.log
    [ $rc = 0 ] || return 1
    for r in 0 1; do grep -q "^rank $r of 6 local $r of 2 node 0 on fsdp-h0 master $HOSTBED_SUBNET.1:29517" "$HOSTBED_SHARE/rank$r.log" || return 1; done
    grep -q "^rank 2 of 6 local 0 of 1 node 1 on fsdp-h1 " "$HOSTBED_SHARE/rank2.log" || return 1
    for r in 3 4 5; do grep -q "^rank $r of 6 local $((r - 3)) of 3 node 2 on fsdp-h2 " "$HOSTBED_SHARE/rank$r.log" || return 1; done
}

t_kill_host() {
    hostbed_spawn --timeout 30 h0 sleep 60 # a bystander in another host
    local b=$HOSTBED_SPAWNED
    hostbed_spawn --timeout 30 h2 sleep 60
    local s=$HOSTBED_SPAWNED
    sleep 0.1
    echo "in h2: $(hostbed_pids h2 | tr '\n' ' ')"
    [ -n "$(hostbed_pids h2)" ] || return 1
    hostbed_kill h2
    wait "$s"
    local rc=$?
    echo "killed: status $rc; left in h2: '$(hostbed_pids h2 | tr '\n' ' ')'; in h0: '$(hostbed_pids h0 | tr '\n' ' ')'"
    [ $rc -ne 0 ] && [ -z "$(hostbed_pids h2)" ] && [ -n "$(hostbed_pids h0)" ] && hostbed_exec --timeout 10 h2 true || return 1
    kill "$b"
    wait "$b" 2>/dev/null
    return 0
}

# what is left of a bed: its directory, mounts, processes naming it, processes in its namespaces
leftovers() { # dir "ns inodes"
    local d=$1 inodes=" $2 " p rest e
    [ -e "$d" ] && echo "directory $d"
    grep -F "$d" /proc/self/mountinfo | awk '{print "mount " $5}'
    # processes naming the bed (watchdog, linkd, timeout wrappers); the pattern comes from a file so
    # that this grep does not find itself
    for p in $(grep -l -a -F -f <(echo "$d") /proc/[0-9]*/cmdline 2>/dev/null); do
        p=${p#/proc/}
        p=${p%/cmdline}
        echo "process $p: $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline")"
    done
    # processes in the bed's namespaces; once they are freed, the kernel reuses their inode numbers
    # for new namespaces: a process of another bed (its HOSTBED_DIR says so) is not ours
    if [ "$inodes" != "  " ]; then
        while read -r p rest; do
            case $inodes in *" $rest "*) ;; *) continue ;; esac
            p=${p#/proc/}
            p=${p%%/*}
            e=$(tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep '^HOSTBED_DIR=')
            [ -n "$e" ] && [ "$e" != "HOSTBED_DIR=$d" ] && continue
            echo "process $p in a namespace of the bed: $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline")"
        done < <(stat -L -c '%n %i' /proc/[0-9]*/ns/net /proc/[0-9]*/ns/mnt /proc/[0-9]*/ns/uts /proc/[0-9]*/ns/ipc 2>/dev/null)
    fi
}

t_down() {
    local t=$EPOCHREALTIME left links
    hostbed_down
    echo "down in $(elapsed "$t") s"
    left=$(leftovers "$BED_DIR" "$NS_INODES")
    links=$(ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ')
    echo "root links now: $links"
    [ -z "$left" ] || { echo "left behind: $left"; return 1; }
    [ "$links" = "$ROOT_LINKS_BEFORE" ] || { echo "root links before: $ROOT_LINKS_BEFORE"; return 1; }
    [ -z "$(ip netns list 2>/dev/null | grep fsdp)" ] && [ -z "${HOSTBED_DIR:-}" ]
}

# the inodes of the bed's namespaces (those its holder processes are in), without the root's: the
# switch's holder has only a network namespace of its own
bed_inodes() {
    local f pid start root
    root=" $(stat -L -c %i /proc/self/ns/net /proc/self/ns/mnt /proc/self/ns/uts /proc/self/ns/ipc | tr '\n' ' ')"
    for f in "$HOSTBED_DIR"/holders/*.pid; do
        read -r pid start <"$f"
        stat -L -c %i /proc/"$pid"/ns/net /proc/"$pid"/ns/mnt /proc/"$pid"/ns/uts /proc/"$pid"/ns/ipc
    done | sort -u | while read -r f; do
        case $root in *" $f "*) ;; *) echo "$f" ;; esac
    done | tr '\n' ' '
}

# a child test script that builds a bed, records it, then runs $1
child() { # scenario
    cat >"$WORK/child.sh" <<EOF
. "$HERE/hostbed.sh"
$(declare -f bed_inodes)
hostbed_up 2 || exit \$?
echo "\$HOSTBED_DIR" >"$WORK/child.dir"
bed_inodes >"$WORK/child.inodes"
hostbed_shape h0 --delay 1ms || exit 1
hostbed_spawn h1 sleep 60
$1
EOF
    rm -f "$WORK/child.dir" "$WORK/child.inodes"
}

wait_for_file() { local k; for ((k = 0; k < 100; k++)); do [ -s "$1" ] && return 0; sleep 0.05; done; return 1; }

# polls until nothing of the child's bed is left (bounded), prints what is left otherwise
gone_within() { # seconds
    local k d inodes left
    d=$(cat "$WORK/child.dir") inodes=$(cat "$WORK/child.inodes")
    for ((k = 0; k < $1 * 10; k++)); do
        left=$(leftovers "$d" "$inodes")
        [ -z "$left" ] && return 0
        sleep 0.1
    done
    echo "left behind: $left"
    return 1
}

t_teardown_failing_command() {
    child 'set -e; hostbed_exec h0 sh -c "echo failing; exit 3"; echo "not reached"'
    timeout 60 bash "$WORK/child.sh"
    local rc=$?
    echo "child exited with $rc"
    [ $rc = 3 ] && gone_within 1
}

t_teardown_sigterm() {
    child 'hostbed_exec h0 sleep 60'
    bash "$WORK/child.sh" &
    local p=$! rc t
    wait_for_file "$WORK/child.inodes" || return 1
    sleep 0.3
    t=$EPOCHREALTIME
    kill -TERM "$p"
    wait "$p"
    rc=$?
    echo "child exited with $rc $(elapsed "$t") s after SIGTERM"
    [ $rc = 143 ] && gone_within 1
}

t_teardown_sigkill() {
    child 'hostbed_exec h0 sleep 60'
    bash "$WORK/child.sh" &
    local p=$! t
    wait_for_file "$WORK/child.inodes" || return 1
    sleep 0.3
    t=$EPOCHREALTIME
    kill -KILL "$p"
    wait "$p" 2>/dev/null
    gone_within 5 || return 1
    echo "SIGKILLed child: its watchdog removed the bed in $(elapsed "$t") s"
}

# a script that gives HOSTBED_MAX_SECONDS a default of its own after sourcing the library
# (tests/chaos.sh's from its plan, when the caller set none) gets that bound, not the library's hour
t_max_seconds_set_after_sourcing() {
    child 'sleep 30'
    sed -i '1a export HOSTBED_MAX_SECONDS=${HOSTBED_MAX_SECONDS:-3}' "$WORK/child.sh"
    env -u HOSTBED_MAX_SECONDS bash "$WORK/child.sh" &
    local p=$! t rc
    wait_for_file "$WORK/child.inodes" || { kill "$p"; wait "$p" 2>/dev/null; return 1; }
    t=$EPOCHREALTIME
    gone_within 10
    rc=$?
    kill "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    [ $rc = 0 ] || return 1
    echo "HOSTBED_MAX_SECONDS defaulting to 3 after sourcing: the watchdog removed the bed $(elapsed "$t") s after it was up"
}

t_stale_cleaned() {
    # a base directory of its own, so that a concurrent run's hostbed_up cannot clean it first
    local base=/run/fsdp-hostbed-selftest-$$
    child 'hostbed_exec h0 sleep 60'
    HOSTBED_BASE=$base bash "$WORK/child.sh" &
    local p=$! d w
    wait_for_file "$WORK/child.inodes" || return 1
    sleep 0.3
    d=$(cat "$WORK/child.dir")
    wait_for_file "$d/watchdog.pid" || return 1
    w=$(cat "$d/watchdog.pid")
    grep -q -a -F __watchdog "/proc/$w/cmdline" || { echo "no watchdog at pid $w"; return 1; }
    kill -KILL -- "-$w" "$p" # the owner and its watchdog (and the watchdog's sleep), as a machine-wide kill would
    wait "$p" 2>/dev/null
    sleep 0.3
    [ -d "$d" ] || { echo "the bed vanished without the watchdog"; return 1; }
    echo "left by the killed run: $(leftovers "$d" "$(cat "$WORK/child.inodes")" | wc -l) items"
    HOSTBED_BASE=$base timeout 60 bash -c ". '$HERE/hostbed.sh'; hostbed_up 1 && hostbed_down" || return 1
    gone_within 3 && [ ! -e "$base" ]
}

# --tcp-cc: every host's new connections use the congestion control asked for (one the kernel
# allows a namespace, other than the machine's default where it allows two), the root namespace's
# is untouched, and a name the kernel refuses fails hostbed_up with the allowed ones named
t_tcp_cc() {
    local base=/run/fsdp-hostbed-selftest-cc-$$ root want allowed out k
    root=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
    allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
    want=$(tr ' ' '\n' <<<"$allowed" | grep -vx "$root" | head -n 1)
    want=${want:-$root}
    echo "machine: $root; allowed in a namespace: $allowed; asking for $want"
    out=$(HOSTBED_BASE=$base timeout 60 bash -c ". '$HERE/hostbed.sh'; hostbed_up 2 --tcp-cc '$want' || exit 1
        hostbed_tcp_cc h0; hostbed_tcp_cc h1; hostbed_down") || return 1
    echo "hosts: $(echo $out)"
    [ "$out" = "$want"$'\n'"$want" ] || return 1
    [ "$(cat /proc/sys/net/ipv4/tcp_congestion_control)" = "$root" ] || { echo "the machine's changed"; return 1; }
    out=$(HOSTBED_BASE=$base timeout 60 bash -c ". '$HERE/hostbed.sh'; hostbed_up 1 --tcp-cc no_such_cc" 2>&1) &&
        { echo "no_such_cc was accepted"; return 1; }
    echo "no_such_cc: $out"
    grep -q "allowed ones only: $allowed" <<<"$out" || return 1
    for ((k = 0; k < 30; k++)); do [ -e "$base" ] || return 0; sleep 0.1; done
    echo "left behind: $(ls -A "$base")"
    return 1
}

# a process of the root namespace, in a session of its own, that no teardown may touch
t_bystander_alive() {
    _hb_kill_bed_pids KILL "$BYSTANDER" $$ 1 # the library's last guard refuses root-namespace pids
    sleep 0.1
    if [ -d "/proc/$BYSTANDER" ] && grep -q -a -F hostbed-selftest-bystander "/proc/$BYSTANDER/cmdline" 2>/dev/null; then
        echo "pid $BYSTANDER (outside the bed) is alive"
        return 0
    fi
    echo "pid $BYSTANDER (outside the bed) was killed"
    return 1
}

# --- run -----------------------------------------------------------------------------------------

ROOT_LINKS_BEFORE=$(ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ')
setsid bash -c 'exec -a hostbed-selftest-bystander sleep 120' </dev/null >/dev/null 2>&1 &
BYSTANDER=$!
cleanup_work() {
    rm -rf "$WORK"
    grep -q -a -F hostbed-selftest-bystander "/proc/$BYSTANDER/cmdline" 2>/dev/null && kill "$BYSTANDER" 2>/dev/null
}
check up t_up
if [ -z "${HOSTBED_DIR:-}" ]; then
    echo
    echo "$passed passed, $failed failed"
    cleanup_work
    exit 1
fi
check hostnames_distinct t_hostnames
check addresses_and_names t_addresses
check no_route_out t_no_route_out
check shm_and_tmp_private t_shm_private
if [ $have_perl = 1 ]; then
    check tcp_between_hosts t_tcp
    check rate_100mbit t_rate 5501
    check link_cut_and_restore t_link_cut 5401
    check delay_20ms t_delay
    check loss_25pct t_loss
    check rate_100mbit_after_delay t_rate 5502
    check link_cut_and_restore_after_delay t_link_cut 5402
else
    echo "(network checks skipped: perl with IO::Socket::INET and Time::HiRes is missing; apt-get install perl)"
fi
if command -v mpirun >/dev/null 2>&1; then
    check mpirun_two_hosts t_mpirun
    if command -v mpicc >/dev/null 2>&1; then
        check mpi_allreduce_two_hosts t_mpi_allreduce
    fi
else
    echo "(mpirun checks skipped: Open MPI not installed; apt-get install libopenmpi-dev openmpi-bin)"
fi
if [ $have_perl = 1 ]; then check ranks_uneven_2_1_3 t_ranks; fi
check kill_host t_kill_host
check down_leaves_nothing t_down
check teardown_after_failing_command t_teardown_failing_command
check teardown_on_sigterm t_teardown_sigterm
check teardown_on_sigkill_by_watchdog t_teardown_sigkill
check max_seconds_set_after_sourcing t_max_seconds_set_after_sourcing
check stale_bed_cleaned_by_next_up t_stale_cleaned
check tcp_congestion_control_per_host t_tcp_cc
check nothing_outside_the_bed_touched t_bystander_alive
cleanup_work
echo "($(elapsed "$T0") s)"
echo
echo "$passed passed, $failed failed"
[ $failed = 0 ]
