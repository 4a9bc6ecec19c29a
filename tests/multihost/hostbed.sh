# tests/multihost/hostbed.sh: a multi-host test bed on one Linux machine (bash library).
#
# Builds N simulated hosts h0..h(N-1). Each host is its own network + mount + UTS + IPC namespace:
#   - hostname fsdp-h<i>, address 10.77.0.<i+1>/24 on eth0 (a veth into a private bridge), lo up;
#     /etc/hosts inside lists every host (fsdp-h<i> and h<i>), so names resolve in the bed;
#   - a private tmpfs on /dev/shm and on /tmp, /sys showing only the host's interfaces;
#   - no route anywhere but the bed's subnet: no default route, no NAT, nothing in the root
#     namespace's network (the bridge lives in a separate "switch" network namespace).
# The namespaces persist until hostbed_down, held by one process per host ("holder": `sleep infinity`
# renamed "hostbed-holder <dir> h<i>", in its own session), so every command run in a host sees the
# same /dev/shm, /tmp and hostname. Nothing is mounted in the root namespace (bind-mounting
# namespace files would need a private mount there, which a shared / propagates into every slave
# mount namespace, e.g. systemd services', where it would stay).
#
# Usage (bash; root; CI is root):
#   . tests/multihost/hostbed.sh
#   hostbed_up 3 [--rate 10gbit] [--delay 20ms] [--loss 5%] || exit $?   # 77 = skip (reason printed)
#   hostbed_exec h0 hostname                       # foreground, exit status passed through
#   hostbed_spawn h1 build/prog args >log 2>&1; pid=$HOSTBED_SPAWNED  # background; `wait $pid`
#   hostbed_down                                   # also run by the traps hostbed_up installs
#
# Functions (HOST is h<i>, fsdp-h<i>, <i> or the host's address; TARGET is HOST or "all"):
#   hostbed_require                  0 if a bed can be built here, else 77 and a one-line reason on
#                                    stderr (also in $HOSTBED_SKIP_REASON): not root, no namespaces,
#                                    no ip/tc/unshare/nsenter, no veth/bridge/tbf in the kernel
#   hostbed_up N [--rate R] [--delay D] [--loss L] [--tcp-cc NAME]
#                                    builds hosts h0..h(N-1) (1 <= N <= 32) and shapes every link;
#                                    --tcp-cc: the hosts' TCP congestion control (default
#                                    $HOSTBED_TCP_CC, else the machine's, which a new network
#                                    namespace inherits: see hostbed_tcp_cc);
#                                    cleans up stale beds of dead processes first; installs
#                                    `trap ... EXIT INT TERM HUP` that calls hostbed_down (a caller
#                                    that needs its own traps must call hostbed_down from them).
#                                    Call it in the main shell, not inside $(...) or a pipeline.
#                                    Returns 0, 77 (skip), or 1 (error, bed torn down).
#   hostbed_exec [--timeout S] HOST CMD [ARGS...]
#                                    runs CMD (an executable, not a shell function; use `bash -c`)
#                                    inside HOST in the foreground; stdin/stdout/stderr and the exit
#                                    status pass through; killed (with its process group) after S
#                                    seconds (default $HOSTBED_EXEC_TIMEOUT = 600) -> status 124.
#                                    The working directory is the caller's, unless it is under /tmp
#                                    or /dev/shm (private in a host): then /.
#   hostbed_spawn [--timeout S] HOST CMD [ARGS...]
#                                    same in the background; sets HOSTBED_SPAWNED to the pid (of the
#                                    `timeout` wrapper: `wait $HOSTBED_SPAWNED` gives CMD's status,
#                                    124 on timeout; `kill $HOSTBED_SPAWNED` is forwarded to CMD).
#                                    Redirect its output on the call: hostbed_spawn h0 cmd >log 2>&1
#   hostbed_ip HOST                  prints the host's address (10.77.0.<i+1>)
#   hostbed_hostname HOST            prints the host's hostname (fsdp-h<i>)
#   hostbed_hosts                    prints h0 .. h(N-1), one per line
#   hostbed_tcp_cc HOST              prints the TCP congestion control of HOST's new connections
#                                    (what a shaped link's throughput depends on: BENCHMARKS.md,
#                                    section 9); a host may use only the kernel's allowed ones
#                                    (/proc/sys/net/ipv4/tcp_allowed_congestion_control)
#   hostbed_pids HOST                prints the pids of every process inside HOST
#   hostbed_kill HOST [SIGNAL]       sends SIGNAL (default KILL) to every process inside HOST (a
#                                    host crash); its namespaces, /dev/shm and /tmp stay
#   hostbed_shape TARGET [--rate R|off] [--delay D|off] [--loss L|off]   (or: hostbed_shape TARGET off)
#                                    changes the shaping of what TARGET sends, at run time; options
#                                    not given keep their value. R: tc rate (100mbit, 10gbit, ...),
#                                    D: 20ms, 500us, 1s; L: percent (5%, 0.5, 100% = black hole).
#                                    rate: tc tbf on the host's egress (a host receiving from k hosts
#                                    can receive k*R); delay and loss: tc netem on the same egress,
#                                    so the RTT between two hosts both delayed by D is 2D. Returns
#                                    77 if delay/loss is asked for and cannot be provided (below).
#   hostbed_link TARGET down|up      cuts / restores TARGET's link at the switch, as a pulled cable:
#                                    packets to and from it are lost, nobody gets an error at once
#                                    (over the veths, a peer that has to ask ARP for it again gets
#                                    "no route to host" after ~3 s, as on a real LAN); `up` restores
#                                    it, and connections survive if TCP has not given up meanwhile
#   hostbed_ranks [--timeout S] [--port P] [--no-wait] COUNTS CMD [ARGS...]
#                                    starts ranks with torchrun's environment: COUNTS is ranks per
#                                    host from h0 on ("2,2"; "2,1,3" for an uneven layout), ranks
#                                    numbered host after host; each gets RANK WORLD_SIZE LOCAL_RANK
#                                    LOCAL_WORLD_SIZE GROUP_RANK=NODE_RANK=host index, MASTER_ADDR
#                                    (h0's address) MASTER_PORT (P, default 29500), plus the caller's
#                                    exported environment (FSDP_SECRET=... hostbed_ranks ... works);
#                                    rank r's output goes to $HOSTBED_SHARE/rank<r>.log, its host's
#                                    index is HOSTBED_RANK_HOST[r]. Waits for
#                                    all (each bounded by S) and returns 0 if every rank exited 0,
#                                    else 1; HOSTBED_RANK_STATUS[r] has rank r's status (124: timed
#                                    out). With --no-wait it returns at once (HOSTBED_RANK_PIDS[r]),
#                                    e.g. to cut a link or kill a host meanwhile; then call
#   hostbed_ranks_wait               waits for them as above
#   hostbed_hostfile SLOTS [HOST...] writes an Open MPI hostfile ("fsdp-h<i> slots=SLOTS" for the given
#                                    hosts, default all) in $HOSTBED_SHARE and prints its path
#   hostbed_down                     tears everything down; idempotent; safe without a bed
#   hostbed_report NAME STATUS LOG   a test script's result: "$ME:0:NAME:PASS" (STATUS 0) or ":FAIL"
#                                    with LOG's last 30 lines indented; counts in passed / failed
#
# Variables set by hostbed_up (exported, so they reach processes in the hosts):
#   HOSTBED_DIR     the bed's state directory ($HOSTBED_BASE/<owner pid>.<its start time>: never
#                   the name of an earlier bed, even if the pid was reused)
#   HOSTBED_N       number of hosts
#   HOSTBED_SHARE   a directory every host and the caller see (logs, files to exchange); /tmp is not
#                   shared: each host has its own
#   HOSTBED_SUBNET  the first three octets (10.77.0)
#   HOSTBED_AGENT   the rsh agent for Open MPI (tests/multihost/hostbed-agent)
#   HOSTBED_MPI_ARGS  "--mca plm_rsh_agent $HOSTBED_AGENT --mca oob_tcp_if_include 10.77.0.0/24
#                   --mca btl_tcp_if_include 10.77.0.0/24": mpirun run in one host launches orted in
#                   the others through the agent, e.g.
#                     hostbed_exec h0 mpirun $HOSTBED_MPI_ARGS --host fsdp-h0:2,fsdp-h1:2 -np 4 prog
#                   (as root, also --allow-run-as-root or OMPI_ALLOW_RUN_AS_ROOT=1
#                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). Run mpirun inside a host: the root namespace
#                   has no route into the bed.
#   HOSTBED_IMPAIR  after the first delay/loss shaping: "netem", or "linkd" (see below)
#
# Settings (environment, before hostbed_up): HOSTBED_BASE (default /run/fsdp-hostbed; must not be
# under /tmp), HOSTBED_SUBNET (default 10.77.0), HOSTBED_EXEC_TIMEOUT (600 s), HOSTBED_MAX_SECONDS
# (3600: a bed older than this is torn down by its watchdog), HOSTBED_IMPAIR=netem|linkd (force the
# delay/loss implementation), HOSTBED_TCP_CC (hostbed_up's --tcp-cc), CC (compiler for the linkd
# fallback).
#
# Delay and loss without netem: kernels built without sch_netem (e.g. some VM kernels; Debian's own
# kernels have it) cannot delay or randomly drop packets in tc. hostbed_shape then compiles and
# starts tests/multihost/hostbed_linkd.c (needs a C compiler): a user-space line that creates a tun
# device "imp0" in every host, and the bed's subnet is routed over imp0 instead of eth0 from then
# on; the daemon applies each host's delay and loss to what it sends, tc tbf on imp0 still does the
# rate. Same semantics as netem (loss is per packet; packets are up to 65000 bytes there, as netem
# on a veth drops whole GSO packets of up to 64 KiB). $HOSTBED_IMPAIR says which one is in use.
#
# Teardown: hostbed_down (and the traps) kill every process inside the hosts and the holders (TERM,
# then KILL after 2 s): the namespaces go with their last process, and with them the veths, the
# bridge, the tun devices and the tmpfs mounts; then the state directory is removed. If the caller
# dies without running its traps (SIGKILL), a watchdog process started by hostbed_up (in its own
# session) notices within 0.5 s and does the same, and hostbed_linkd exits within 0.2 s by itself;
# if the watchdog was killed too, the next hostbed_up (or `bash tests/multihost/hostbed.sh clean`)
# removes every bed whose owner process is dead. Until then, processes inside the hosts run on, at
# most until their hostbed_exec/hostbed_spawn timeout. Only processes in the bed's own network
# namespaces are ever signalled (plus its watchdog and linkd, checked by command line): a last guard
# refuses any pid in the root's network namespace.
#
# Paths: the hosts see the caller's filesystem except /dev/shm and /tmp (their own), so the programs
# they run and the files they share must live elsewhere (the repository, $HOSTBED_SHARE).
#
# Command line: bash tests/multihost/hostbed.sh clean     removes stale beds of dead processes
#               bash tests/multihost/hostbed.sh list      lists beds (owner pid, alive or stale)

HOSTBED_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
HOSTBED_HOME=${HOSTBED_LIB%/*}
HOSTBED_BASE=${HOSTBED_BASE:-/run/fsdp-hostbed}
HOSTBED_SUBNET=${HOSTBED_SUBNET:-10.77.0}
HOSTBED_EXEC_TIMEOUT=${HOSTBED_EXEC_TIMEOUT:-600}
# (HOSTBED_MAX_SECONDS is read when hostbed_up starts the watchdog, not here: a script that sources
# this file and then sets it, as tests/chaos.sh does from its plan, must not find a default already in it)
HOSTBED_MAX_HOSTS=32
HOSTBED_SKIP=77

_hb_log() { echo "hostbed: $*" >&2; }

# the 22nd field (start time) of /proc/PID/stat, robust to spaces in the command name
_hb_starttime() {
    local line rest
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    rest=${line##*) }
    set -- $rest
    echo "${20}"
}

_hb_pgrp() {
    local line rest
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    rest=${line##*) }
    set -- $rest
    echo "$3"
}

# 0 if PID is alive (not a zombie) and started at START (not a reused pid)
_hb_alive() {
    local line rest
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    rest=${line##*) }
    set -- "${2:-}" $rest
    case $2 in Z | X | x) return 1 ;; esac
    [ -z "$1" ] || [ "$1" = "${21}" ]
}

# 0 if /proc/PID/cmdline contains WORD
_hb_cmdline_has() {
    local c
    c=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
    case $c in *"$2"*) return 0 ;; esac
    return 1
}

hostbed_require() {
    local - c
    set +e
    HOSTBED_SKIP_REASON=
    if [ -n "${_HB_REQUIRE_OK:-}" ]; then return 0; fi
    if [ "$(id -u)" != 0 ]; then
        HOSTBED_SKIP_REASON="not root (namespaces, veth and tc need root)"
    else
        for c in ip tc unshare nsenter timeout setsid flock stat awk mount umount; do
            if ! command -v "$c" >/dev/null 2>&1; then
                case $c in
                ip | tc) HOSTBED_SKIP_REASON="'$c' not found (apt-get install iproute2)" ;;
                unshare | nsenter | setsid | flock | mount | umount) HOSTBED_SKIP_REASON="'$c' not found (util-linux/mount)" ;;
                *) HOSTBED_SKIP_REASON="'$c' not found" ;;
                esac
                break
            fi
        done
    fi
    if [ -z "$HOSTBED_SKIP_REASON" ] && ! unshare --net --mount --uts --ipc true 2>/dev/null; then
        HOSTBED_SKIP_REASON="cannot create network/mount/UTS/IPC namespaces here (unshare failed; a restricted container?)"
    fi
    if [ -z "$HOSTBED_SKIP_REASON" ]; then
        local err
        err=$(unshare --net sh -c 'ip link add hbA type veth peer name hbB &&
            ip link add hbBr type bridge &&
            tc qdisc add dev hbA root tbf rate 1mbit burst 32kb latency 50ms' 2>&1)
        if [ $? -ne 0 ]; then
            HOSTBED_SKIP_REASON="the kernel lacks veth, bridge or tc tbf (${err%%$'\n'*})"
        fi
    fi
    if [ -n "$HOSTBED_SKIP_REASON" ]; then
        _hb_log "skip: $HOSTBED_SKIP_REASON"
        return $HOSTBED_SKIP
    fi
    _HB_REQUIRE_OK=1
    return 0
}

# sets _HB_I to the index of HOST (h3, fsdp-h3, 3, 10.77.0.4); 1 with a message if unknown
_hb_index() {
    local h=$1 i=
    case $h in
    h[0-9] | h[0-9][0-9]) i=${h#h} ;;
    fsdp-h[0-9] | fsdp-h[0-9][0-9]) i=${h#fsdp-h} ;;
    fsdp-h[0-9].* | fsdp-h[0-9][0-9].*) i=${h#fsdp-h}; i=${i%%.*} ;;
    [0-9] | [0-9][0-9]) i=$h ;;
    "$HOSTBED_SUBNET".[0-9] | "$HOSTBED_SUBNET".[0-9][0-9] | "$HOSTBED_SUBNET".[0-9][0-9][0-9])
        i=${h##*.}
        i=$((10#$i - 1))
        ;;
    esac
    if [ -n "$i" ] && [ "$i" != -1 ]; then i=$((10#$i)); fi
    if [ -z "$i" ] || [ "$i" -lt 0 ] || [ -z "${HOSTBED_N:-}" ] || [ "$i" -ge "$HOSTBED_N" ]; then
        _hb_log "no host '$h' in the bed (hosts: h0..h$((${HOSTBED_N:-0} - 1)))"
        return 1
    fi
    _HB_I=$i
}

_hb_need_bed() {
    if [ -z "${HOSTBED_DIR:-}" ] || [ ! -f "$HOSTBED_DIR/owner" ]; then
        _hb_log "no bed is up (call hostbed_up first)"
        return 1
    fi
}

# sets _HB_HP to the pid of the holder of NAME (h<i>, or sw for the switch) of the bed in
# HOSTBED_DIR, after checking that it is still that process; 1 with a message otherwise
_hb_holder() {
    local pid start
    if read -r pid start 2>/dev/null <"$HOSTBED_DIR/holders/$1.pid" && _hb_alive "$pid" "$start"; then
        _HB_HP=$pid
        return 0
    fi
    _hb_log "host $1 of the bed is gone (its namespace holder process exited)"
    return 1
}
_hb_net() { # runs CMD in host I's network namespace only (ip, tc)
    local i=$1
    shift
    _hb_holder "h$i" || return 1
    nsenter -t "$_HB_HP" --net "$@"
}
_hb_sw() {
    _hb_holder sw || return 1
    nsenter -t "$_HB_HP" --net "$@"
}

# the network namespace inodes that are never the bed's: PID 1's and this process's (the root's)
_hb_root_netns() {
    echo " $(stat -L -c %i /proc/1/ns/net /proc/self/ns/net "/proc/$$/ns/net" 2>/dev/null | tr '\n' ' ')"
}

# " NETINODE " of the holder PID: the network namespace it holds, never the root's (empty then).
# Processes are matched by network namespace only: the switch's holder shares the root's mount
# namespace, so a mount namespace must never select processes.
_hb_ns_inodes() {
    local i
    i=$(stat -L -c %i "/proc/$1/ns/net" 2>/dev/null) || return 0
    case $(_hb_root_netns) in *" $i "*) return 0 ;; esac
    echo " $i "
}

# pids of the processes whose network namespace has one of the INODES (" i1 i2 "), but not those
# in EXCLUDE (" p1 p2 "); never one in the root's network namespace, never PID 1 or this shell
_hb_pids_in() {
    local inodes=$1 excl=" ${2:-} 1 $$ $BASHPID " root p rest
    root=$(_hb_root_netns)
    [ -n "${inodes// /}" ] || return 0
    while read -r p rest; do
        case $inodes in *" $rest "*) ;; *) continue ;; esac
        case $root in *" $rest "*) continue ;; esac
        p=${p#/proc/}
        p=${p%%/*}
        case $excl in *" $p "*) continue ;; esac
        echo "$p"
    done < <(stat -L -c '%n %i' /proc/[0-9]*/ns/net 2>/dev/null) | sort -un
}

# sends SIG to the PIDS that are in a network namespace other than the root's (a last guard: the
# bed's processes and holders always are; nothing in the root namespace is ever signalled here)
_hb_kill_bed_pids() {
    local sig=$1 root p i ok=()
    shift
    root=$(_hb_root_netns)
    for p in "$@"; do
        case $p in '' | *[!0-9]*) continue ;; esac
        [ "$p" -gt 1 ] && [ "$p" != $$ ] && [ "$p" != "$BASHPID" ] || continue
        i=$(stat -L -c %i "/proc/$p/ns/net" 2>/dev/null) || continue
        case $root in *" $i "*) continue ;; esac
        ok+=("$p")
    done
    [ ${#ok[@]} -eq 0 ] || kill "-$sig" "${ok[@]}" 2>/dev/null
}

# pids of the holder processes of the bed in directory D (found by name: works without D)
_hb_find_holders() {
    local f
    for f in $(grep -l -a -F -f <(printf 'hostbed-holder %s \n' "$1") /proc/[0-9]*/cmdline 2>/dev/null); do
        f=${f#/proc/}
        echo "${f%/cmdline}"
    done
}

# what a holder runs (bash -c, inside its new namespaces): sets the host up, then sleeps forever
_HB_HOLDER_SCRIPT='
D=$1 name=$2
if [ "$name" = sw ]; then
    echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6
    echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6
    for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables \
        /proc/sys/net/bridge/bridge-nf-call-arptables; do
        [ -w $f ] && echo 0 >$f
    done
    ok=1
else
    { echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6; } 2>/dev/null
    hostname "fsdp-$name" &&
        mount -t tmpfs -o mode=1777 hostbed-shm /dev/shm &&
        mount -t tmpfs -o mode=1777 hostbed-tmp /tmp &&
        { ! umount -l /sys 2>/dev/null || mount -t sysfs sysfs /sys; } &&
        { [ ! -f /etc/hosts ] || mount --bind "$D/hosts" /etc/hosts; } &&
        ip link set lo up && ok=1
fi
if [ -z "$ok" ]; then echo failed >"$D/holders/$name.ready"; exit 1; fi
echo "ok $$" >"$D/holders/$name.ready"
exec -a "hostbed-holder $D $name" sleep infinity
'

# starts the holder of NAME with the unshare options given, in its own session
_hb_start_holder() {
    local name=$1
    shift
    setsid unshare "$@" bash -c "$_HB_HOLDER_SCRIPT" hostbed-holder "$HOSTBED_DIR" "$name" \
        </dev/null >>"$HOSTBED_DIR/holders.log" 2>&1 &
    disown "$!" 2>/dev/null # no "Killed" job report from the shell at teardown
}

# waits (5 s at most) for the holder of NAME to be ready ("ok PID", written by the holder itself:
# with job control, setsid forks and $! is not its pid), then records "pid starttime"
_hb_wait_holder() {
    local name=$1 k st pid
    for ((k = 0; k < 500; k++)); do
        [ -s "$HOSTBED_DIR/holders/$name.ready" ] && break
        sleep 0.01
    done
    read -r st pid 2>/dev/null <"$HOSTBED_DIR/holders/$name.ready"
    if [ "$st" != ok ] || [ -z "$pid" ]; then
        _hb_log "setting up $name failed: $(cat "$HOSTBED_DIR/holders.log" 2>/dev/null)"
        return 1
    fi
    echo "$pid $(_hb_starttime "$pid")" >"$HOSTBED_DIR/holders/$name.pid"
}

# the directory commands start in: the caller's, unless private in a host
_hb_wd() {
    case $PWD in
    /tmp | /tmp/* | /dev/shm | /dev/shm/*) echo / ;;
    *) echo "$PWD" ;;
    esac
}

hostbed_up() {
    local - n='' rate='' delay='' loss='' cc=${HOSTBED_TCP_CC:-} i D owner start
    set +e +u
    if [ -n "${HOSTBED_DIR:-}" ] && [ -d "$HOSTBED_DIR" ]; then
        _hb_log "a bed is already up in this shell ($HOSTBED_DIR); call hostbed_down first"
        return 1
    fi
    n=$1
    shift
    while [ $# -gt 0 ]; do
        case $1 in
        --rate) rate=$2; shift 2 ;;
        --delay) delay=$2; shift 2 ;;
        --loss) loss=$2; shift 2 ;;
        --tcp-cc) cc=$2; shift 2 ;;
        *) _hb_log "hostbed_up: unknown option '$1'"; return 1 ;;
        esac
    done
    case $n in '' | *[!0-9]*) n=0 ;; esac
    case $cc in *[!a-z0-9_]*) _hb_log "hostbed_up: --tcp-cc '$cc': not a congestion control's name"; return 1 ;; esac
    if [ "$n" -lt 1 ] || [ "$n" -gt $HOSTBED_MAX_HOSTS ]; then
        _hb_log "hostbed_up: N must be 1..$HOSTBED_MAX_HOSTS"
        return 1
    fi
    case $HOSTBED_BASE in
    /tmp | /tmp/* | /dev/shm* | *[[:space:]]*) _hb_log "HOSTBED_BASE must not be under /tmp or /dev/shm nor contain spaces"; return 1 ;;
    esac
    hostbed_require || return $?
    _hb_clean_stale

    owner=$BASHPID
    start=$(_hb_starttime "$owner")
    D=$HOSTBED_BASE/$owner.$start
    for i in 1 2 3; do # (a concurrent teardown may rmdir an empty HOSTBED_BASE in between)
        mkdir -p "$D/holders" "$D/share" "$D/state" "$D/linkd" 2>/dev/null && break
    done
    [ -d "$D/linkd" ] || { _hb_log "cannot create $D"; return 1; }
    chmod 1777 "$D/share"
    echo "$owner $start" >"$D/owner"
    echo "$n" >"$D/n"
    export HOSTBED_DIR=$D HOSTBED_N=$n HOSTBED_SHARE=$D/share HOSTBED_SUBNET
    export HOSTBED_OWNER=$owner HOSTBED_LIB HOSTBED_HOME HOSTBED_BASE
    export HOSTBED_AGENT=$HOSTBED_HOME/hostbed-agent
    export HOSTBED_MPI_ARGS="--mca plm_rsh_agent $HOSTBED_AGENT --mca oob_tcp_if_include $HOSTBED_SUBNET.0/24 --mca btl_tcp_if_include $HOSTBED_SUBNET.0/24"
    unset HOSTBED_IMPAIR_FORCED
    [ -n "${HOSTBED_IMPAIR:-}" ] && HOSTBED_IMPAIR_FORCED=$HOSTBED_IMPAIR
    trap 'hostbed_down' EXIT
    trap 'hostbed_down; trap - EXIT; exit 130' INT
    trap 'hostbed_down; trap - EXIT; exit 143' TERM
    trap 'hostbed_down; trap - EXIT; exit 129' HUP

    if ! _hb_build "$n"; then
        _hb_log "hostbed_up: building the bed failed; tearing down"
        hostbed_down
        return 1
    fi
    if [ -n "$cc" ] && ! _hb_set_tcp_cc "$n" "$cc"; then
        hostbed_down
        return 1
    fi
    setsid bash "$HOSTBED_LIB" __watchdog "$D" "${HOSTBED_MAX_SECONDS:-3600}" </dev/null >"$D/watchdog.log" 2>&1 &
    disown "$!" 2>/dev/null
    for ((i = 0; i < 100; i++)); do # so that hostbed_down finds it, however soon it comes
        [ -s "$D/watchdog.pid" ] && break
        sleep 0.02
    done
    if [ -n "$rate$delay$loss" ]; then
        hostbed_shape all ${rate:+--rate "$rate"} ${delay:+--delay "$delay"} ${loss:+--loss "$loss"}
        local rc=$?
        if [ $rc -ne 0 ]; then
            hostbed_down
            return $rc
        fi
    fi
    return 0
}

# sets the TCP congestion control of hosts h0..h(N-1) to CC (in their network namespaces only)
_hb_set_tcp_cc() {
    local n=$1 cc=$2 i
    for ((i = 0; i < n; i++)); do
        _hb_net "$i" sh -c 'echo "$1" >/proc/sys/net/ipv4/tcp_congestion_control' sh "$cc" 2>/dev/null &&
            [ "$(hostbed_tcp_cc "h$i")" = "$cc" ] && continue
        _hb_log "hostbed_up: cannot set TCP congestion control '$cc' in host h$i (a network namespace may use the" \
            "kernel's allowed ones only: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null))"
        return 1
    done
}

hostbed_tcp_cc() {
    _hb_index "$1" || return 1
    _hb_net "$_HB_I" cat /proc/sys/net/ipv4/tcp_congestion_control
}

_hb_build() {
    local n=$1 D=$HOSTBED_DIR i hp
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        for ((i = 0; i < n; i++)); do echo "$HOSTBED_SUBNET.$((i + 1)) fsdp-h$i h$i"; done
    } >"$D/hosts"
    # the switch (a bridge in a network namespace of its own: no IPv6, no netfilter on bridged
    # frames) and the hosts, their holders started in parallel
    _hb_start_holder sw --net
    for ((i = 0; i < n; i++)); do
        _hb_start_holder "h$i" --net --mount --uts --ipc --propagation private
    done
    _hb_wait_holder sw || return 1
    _hb_sw ip link add br0 type bridge stp_state 0 || return 1
    _hb_sw ip link set br0 up || return 1
    for ((i = 0; i < n; i++)); do
        _hb_wait_holder "h$i" && _hb_holder "h$i" || return 1
        hp=$_HB_HP
        _hb_sw ip link add "h$i" type veth peer name eth0 netns "$hp" || return 1
        _hb_sw ip link set "h$i" master br0 up || return 1
        _hb_net "$i" ip addr add "$HOSTBED_SUBNET.$((i + 1))/24" dev eth0 || return 1
        _hb_net "$i" ip link set eth0 up || return 1
        echo "- - - 0" >"$D/state/h$i" # rate delay loss down
    done
    return 0
}

# tears down the bed in directory D from its state alone (used by hostbed_down, the watchdog and
# the stale-bed cleanup); idempotent; finds the holders by name, so it works without D too
_hb_teardown() {
    local - D=$1 lockfd='' p k holders inodes left
    set +e +u
    case $D in "$HOSTBED_BASE"/[0-9]*) ;; *) _hb_log "not a bed directory: '$D'"; return 1 ;; esac
    if [ -d "$D" ]; then
        exec {lockfd}<"$D" && flock -w 60 "$lockfd"
    fi
    # the watchdog (unless it is us) and the delay/loss daemon
    p=$(cat "$D/watchdog.pid" 2>/dev/null)
    if [ -n "$p" ] && [ "$p" -gt 1 ] && [ "$p" != "$BASHPID" ] && [ "$p" != "$$" ] && _hb_cmdline_has "$p" "__watchdog $D"; then
        if [ "$(_hb_pgrp "$p")" = "$p" ]; then kill -TERM -- "-$p" 2>/dev/null; else kill -TERM "$p" 2>/dev/null; fi
    fi
    p=$(cat "$D/linkd/pid" 2>/dev/null)
    if [ -n "$p" ] && _hb_cmdline_has "$p" "$D/hostbed_linkd"; then kill -TERM "$p" 2>/dev/null; fi
    # every process inside the hosts (TERM, up to 2 s, then KILL, up to 2 s more), and only then
    # the holders. While a holder lives its namespace cannot be freed, so a namespace inode names
    # the bed's namespace and nothing else; once the holders are gone the kernel may give the
    # same inode number to a new namespace (of another bed), so processes are never looked up
    # by inode after that.
    holders=$(_hb_find_holders "$D" | tr '\n' ' ')
    inodes=" "
    for p in $holders; do inodes="$inodes$(_hb_ns_inodes "$p") "; done
    left=$(_hb_pids_in "$inodes" "$holders" | tr '\n' ' ')
    if [ -n "${left// /}" ]; then
        _hb_kill_bed_pids TERM $left
        for ((k = 0; k < 20; k++)); do
            left=$(_hb_pids_in "$inodes" "$holders" | tr '\n' ' ')
            [ -z "${left// /}" ] && break
            sleep 0.1
        done
        for ((k = 0; k < 20; k++)); do
            left=$(_hb_pids_in "$inodes" "$holders" | tr '\n' ' ')
            [ -z "${left// /}" ] && break
            _hb_kill_bed_pids KILL $left
            sleep 0.1
        done
    fi
    if [ -n "${holders// /}" ]; then
        _hb_kill_bed_pids KILL $holders
        for ((k = 0; k < 20; k++)); do
            left=$(for p in $holders; do _hb_alive "$p" && echo "$p"; done)
            [ -z "$left" ] && break
            sleep 0.05
        done
    fi
    # the daemon's exit removes its tun devices
    p=$(cat "$D/linkd/pid" 2>/dev/null)
    for ((k = 0; k < 20; k++)); do
        { [ -n "$p" ] && _hb_cmdline_has "$p" "$D/hostbed_linkd"; } || break
        sleep 0.1
    done
    { [ -n "$p" ] && _hb_cmdline_has "$p" "$D/hostbed_linkd"; } && kill -KILL "$p" 2>/dev/null
    rm -rf "$D"
    [ -n "$lockfd" ] && exec {lockfd}<&-
    rmdir "$HOSTBED_BASE" 2>/dev/null
    return 0
}

hostbed_down() {
    local - D=${HOSTBED_DIR:-}
    set +e +u
    [ -n "$D" ] || return 0
    _hb_teardown "$D"
    unset HOSTBED_DIR HOSTBED_N HOSTBED_SHARE HOSTBED_OWNER HOSTBED_IMPAIR HOSTBED_SPAWNED
    [ -n "${HOSTBED_IMPAIR_FORCED:-}" ] && HOSTBED_IMPAIR=$HOSTBED_IMPAIR_FORCED
    return 0
}

# removes every bed under HOSTBED_BASE whose owner process is gone (pid dead or reused), found by
# its directory or by its holder processes
_hb_clean_stale() {
    local - d pid start p beds
    set +e +u
    beds=$(
        for d in "$HOSTBED_BASE"/[0-9]*; do [ -d "$d" ] && echo "$d"; done
        for p in $(grep -l -a -F -f <(printf 'hostbed-holder %s/\n' "$HOSTBED_BASE") /proc/[0-9]*/cmdline 2>/dev/null); do
            d=$(tr '\0' '\n' 2>/dev/null <"$p" | head -n 1)
            set -- $d
            [ "$1" = hostbed-holder ] && echo "$2"
        done
    )
    for d in $(echo "$beds" | sort -u); do
        case $d in "$HOSTBED_BASE"/[0-9]*) ;; *) continue ;; esac
        pid=${d##*/} # <pid>.<start time>
        start=${pid#*.}
        pid=${pid%%.*}
        [ -f "$d/owner" ] && read -r pid start <"$d/owner"
        if ! _hb_alive "$pid" "$start"; then
            _hb_log "removing a stale bed left by process $pid ($d)"
            _hb_teardown "$d"
        fi
    done
}

hostbed_ip() {
    _hb_need_bed && _hb_index "$1" || return 1
    echo "$HOSTBED_SUBNET.$((_HB_I + 1))"
}

hostbed_hostname() {
    _hb_need_bed && _hb_index "$1" || return 1
    echo "fsdp-h$_HB_I"
}

hostbed_hosts() {
    local i
    _hb_need_bed || return 1
    for ((i = 0; i < HOSTBED_N; i++)); do echo "h$i"; done
}

hostbed_report() {
    if [ "$2" -eq 0 ]; then
        echo "$ME:0:$1:PASS"
        passed=$((passed + 1))
    else
        echo "$ME:0:$1:FAIL"
        sed 's/^/    /' "$3" | tail -n 30
        failed=$((failed + 1))
    fi
}

hostbed_exec() {
    local - t=$HOSTBED_EXEC_TIMEOUT pid rc wd
    set +e
    if [ "${1:-}" = --timeout ]; then t=$2; shift 2; fi
    _hb_need_bed && _hb_index "${1:-}" || return 2
    shift
    [ $# -gt 0 ] || { _hb_log "hostbed_exec: no command"; return 2; }
    _hb_holder "h$_HB_I" || return 2
    wd=$(_hb_wd)
    if [[ $- == *m* ]]; then # an interactive shell with job control: plain foreground, own the tty
        timeout --foreground -k 5 "$t" nsenter -t "$_HB_HP" --net --mount --uts --ipc \
            sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$wd" "$@"
        return
    fi
    # in the background + wait, so that a TERM/INT to the caller runs its trap at once
    timeout -k 5 "$t" nsenter -t "$_HB_HP" --net --mount --uts --ipc \
        sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$wd" "$@" 0<&0 &
    pid=$!
    wait "$pid"
    rc=$?
    return $rc
}

hostbed_spawn() {
    local - t=$HOSTBED_EXEC_TIMEOUT wd
    set +e
    if [ "${1:-}" = --timeout ]; then t=$2; shift 2; fi
    _hb_need_bed && _hb_index "${1:-}" || return 2
    shift
    [ $# -gt 0 ] || { _hb_log "hostbed_spawn: no command"; return 2; }
    _hb_holder "h$_HB_I" || return 2
    wd=$(_hb_wd)
    timeout -k 5 "$t" nsenter -t "$_HB_HP" --net --mount --uts --ipc \
        sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$wd" "$@" 0<&0 &
    HOSTBED_SPAWNED=$!
    return 0
}

hostbed_pids() {
    _hb_need_bed && _hb_index "${1:-}" && _hb_holder "h$_HB_I" || return 1
    _hb_pids_in "$(_hb_ns_inodes "$_HB_HP")" "$_HB_HP"
}

hostbed_kill() {
    local sig=${2:-KILL} pids
    _hb_need_bed && _hb_index "${1:-}" && _hb_holder "h$_HB_I" || return 1
    pids=$(_hb_pids_in "$(_hb_ns_inodes "$_HB_HP")" "$_HB_HP")
    [ -z "$pids" ] || _hb_kill_bed_pids "$sig" $pids
    return 0
}

# starts ranks across the hosts with torchrun's environment, then (unless --no-wait) waits for them
hostbed_ranks() {
    local - t=$HOSTBED_EXEC_TIMEOUT port=29500 nowait=0 cs=() c i l r=0 world=0 master
    set +e +u
    _hb_need_bed || return 2
    while [ $# -gt 0 ]; do
        case $1 in
        --timeout) t=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --no-wait) nowait=1; shift ;;
        *) break ;;
        esac
    done
    IFS=, read -ra cs <<<"${1:-}"
    shift
    if [ ${#cs[@]} -eq 0 ] || [ ${#cs[@]} -gt "$HOSTBED_N" ] || [ $# -eq 0 ]; then
        _hb_log "hostbed_ranks: usage: hostbed_ranks [--timeout S] [--port P] [--no-wait] COUNTS CMD [ARGS...] (COUNTS: ranks per host, e.g. 2,2 or 2,1,3; at most $HOSTBED_N hosts)"
        return 2
    fi
    for c in "${cs[@]}"; do
        case $c in '' | *[!0-9]*) _hb_log "hostbed_ranks: bad count '$c'"; return 2 ;; esac
        world=$((world + c))
    done
    master=$HOSTBED_SUBNET.1
    HOSTBED_RANK_PIDS=()
    HOSTBED_RANK_STATUS=()
    HOSTBED_RANK_HOST=()
    for ((i = 0; i < ${#cs[@]}; i++)); do
        for ((l = 0; l < cs[i]; l++)); do
            RANK=$r WORLD_SIZE=$world LOCAL_RANK=$l LOCAL_WORLD_SIZE=${cs[i]} GROUP_RANK=$i NODE_RANK=$i \
                MASTER_ADDR=$master MASTER_PORT=$port \
                hostbed_spawn --timeout "$t" "h$i" "$@" >"$HOSTBED_SHARE/rank$r.log" 2>&1
            HOSTBED_RANK_PIDS+=("$HOSTBED_SPAWNED")
            HOSTBED_RANK_HOST+=("$i")
            r=$((r + 1))
        done
    done
    [ $nowait = 1 ] && return 0
    hostbed_ranks_wait
}

# waits for the ranks hostbed_ranks started; HOSTBED_RANK_STATUS[r] = rank r's exit status
hostbed_ranks_wait() {
    local - r rc=0
    set +e
    HOSTBED_RANK_STATUS=()
    for ((r = 0; r < ${#HOSTBED_RANK_PIDS[@]}; r++)); do
        wait "${HOSTBED_RANK_PIDS[r]}"
        HOSTBED_RANK_STATUS[r]=$?
        [ "${HOSTBED_RANK_STATUS[r]}" = 0 ] || rc=1
    done
    return $rc
}

hostbed_hostfile() {
    local slots=${1:-1} f h
    _hb_need_bed || return 1
    shift
    f=$HOSTBED_SHARE/hostfile
    : >"$f"
    if [ $# -eq 0 ]; then set -- $(hostbed_hosts); fi
    for h in "$@"; do
        _hb_index "$h" || return 1
        echo "fsdp-h$_HB_I slots=$slots" >>"$f"
    done
    echo "$f"
}

# --- shaping -------------------------------------------------------------------------------------

# rate string -> bytes per second (tc's units: bit, kbit, mbit, gbit, tbit; SI)
_hb_rate_bytes() {
    echo "$1" | awk '{ s = tolower($0); n = s + 0; u = s; sub(/^[0-9.]+/, "", u);
        m = (u == "bit" || u == "") ? 1 : (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : (u == "tbit") ? 1e12 : -1;
        if (m < 0 || n <= 0) exit 1; printf "%.0f\n", n * m / 8 }'
}
_hb_delay_ns() {
    echo "$1" | awk '{ s = tolower($0); n = s + 0; u = s; sub(/^[0-9.]+/, "", u);
        m = (u == "us") ? 1e3 : (u == "ms") ? 1e6 : (u == "s") ? 1e9 : -1;
        if (m < 0 || s !~ /^[0-9.]+/) exit 1; printf "%.0f\n", n * m }'
}
_hb_loss_ppm() {
    echo "$1" | awk '{ s = $0; sub(/%$/, "", s); if (s !~ /^[0-9.]+$/ || s + 0 > 100) exit 1; printf "%.0f\n", s * 10000 }'
}

# decides (once per bed) how delay and loss are done: netem if the kernel has it, else linkd
_hb_impair_mode() {
    local f=$HOSTBED_DIR/state/impair m
    if [ -f "$f" ]; then cat "$f"; return 0; fi
    m=${HOSTBED_IMPAIR_FORCED:-}
    if [ -z "$m" ]; then
        if _hb_sw sh -c 'tc qdisc add dev br0 root netem delay 1ms && tc qdisc del dev br0 root' >/dev/null 2>&1; then
            m=netem
        else
            m=linkd
        fi
    fi
    echo "$m" >"$f"
    echo "$m"
}

_hb_linkd_running() {
    local p
    p=$(cat "$HOSTBED_DIR/linkd/pid" 2>/dev/null) && [ -n "$p" ] && _hb_cmdline_has "$p" "$HOSTBED_DIR/hostbed_linkd"
}

# compiles and starts hostbed_linkd, then routes the subnet over imp0 in every host
_hb_linkd_start() {
    local D=$HOSTBED_DIR i k args=() cc=${CC:-cc} err
    _hb_linkd_running && return 0
    if [ ! -e /dev/net/tun ]; then
        HOSTBED_SKIP_REASON="delay/loss: the kernel has no sch_netem and /dev/net/tun is missing for the user-space fallback"
        _hb_log "skip: $HOSTBED_SKIP_REASON"
        return $HOSTBED_SKIP
    fi
    if ! command -v "$cc" >/dev/null 2>&1; then
        HOSTBED_SKIP_REASON="delay/loss: the kernel has no sch_netem and no C compiler ($cc) for the user-space fallback"
        _hb_log "skip: $HOSTBED_SKIP_REASON"
        return $HOSTBED_SKIP
    fi
    if [ ! -x "$D/hostbed_linkd" ]; then
        err=$("$cc" -O2 -o "$D/hostbed_linkd" "$HOSTBED_HOME/hostbed_linkd.c" 2>&1) || {
            _hb_log "compiling hostbed_linkd.c failed: $err"
            return 1
        }
    fi
    for ((i = 0; i < HOSTBED_N; i++)); do
        _hb_holder "h$i" || return 1
        args+=("/proc/$_HB_HP/ns/net" "$HOSTBED_SUBNET.$((i + 1))")
    done
    rm -f "$D/linkd/ack" "$D/linkd/pid"
    setsid "$D/hostbed_linkd" "$HOSTBED_OWNER" "$D/linkd" imp0 "${args[@]}" </dev/null >"$D/linkd.log" 2>&1 &
    disown "$!" 2>/dev/null
    for ((k = 0; k < 100; k++)); do
        [ "$(cat "$D/linkd/ack" 2>/dev/null)" = 0 ] && break
        sleep 0.05
    done
    if [ "$(cat "$D/linkd/ack" 2>/dev/null)" != 0 ]; then
        _hb_log "hostbed_linkd did not start: $(cat "$D/linkd.log" 2>/dev/null)"
        return 1
    fi
    for ((i = 0; i < HOSTBED_N; i++)); do
        _hb_net "$i" sh -c '
            set -e
            echo 0 >/proc/sys/net/ipv4/conf/all/rp_filter
            echo 0 >/proc/sys/net/ipv4/conf/imp0/rp_filter
            ip link set imp0 mtu 65000 txqueuelen 10000 up
            ip route del "$1.0/24" dev eth0
            ip route add "$1.0/24" dev imp0 src "$2"' sh "$HOSTBED_SUBNET" "$HOSTBED_SUBNET.$((i + 1))" || {
            _hb_log "routing host h$i over imp0 failed"
            return 1
        }
    done
    return 0
}

# pushes every host's delay/loss/down to hostbed_linkd and waits until it is in force
_hb_linkd_push() {
    local D=$HOSTBED_DIR gen i r d l down k p
    gen=$(($(cat "$D/linkd/gen" 2>/dev/null || echo 0) + 1))
    echo "$gen" >"$D/linkd/gen"
    {
        echo "gen $gen"
        for ((i = 0; i < HOSTBED_N; i++)); do
            read -r r d l down <"$D/state/h$i"
            [ "$d" = - ] && d=0 || d=$(_hb_delay_ns "$d")
            [ "$l" = - ] && l=0 || l=$(_hb_loss_ppm "$l")
            echo "$i $d $l $down"
        done
    } >"$D/linkd/params.tmp" && mv "$D/linkd/params.tmp" "$D/linkd/params"
    p=$(cat "$D/linkd/pid" 2>/dev/null)
    { _hb_linkd_running && kill -HUP "$p" 2>/dev/null; } || { _hb_log "hostbed_linkd is not running"; return 1; }
    for ((k = 0; k < 100; k++)); do
        [ "$(cat "$D/linkd/ack" 2>/dev/null)" = "$gen" ] && return 0
        sleep 0.02
    done
    _hb_log "hostbed_linkd did not take the new parameters within 2 s"
    return 1
}

# applies host I's tc qdiscs from its state (rate always; delay/loss when netem does them)
_hb_apply_tc() {
    local i=$1 mode=$2 r d l down dev bytes burst netem rc=0
    read -r r d l down <"$HOSTBED_DIR/state/h$i"
    netem=
    if [ "$mode" = netem ]; then
        [ "$d" != - ] && netem="$netem delay $d"
        [ "$l" != - ] && netem="$netem loss ${l%\%}%"
    fi
    for dev in eth0 imp0; do
        [ $dev = imp0 ] && ! _hb_net "$i" ip link show imp0 >/dev/null 2>&1 && continue
        _hb_net "$i" tc qdisc del dev $dev root 2>/dev/null
        if [ "$r" != - ]; then
            bytes=$(_hb_rate_bytes "$r")
            burst=$((bytes / 250)) # 4 ms worth, at least 128 KiB (more than a 64 KiB GSO packet)
            [ $burst -lt 131072 ] && burst=131072
            _hb_net "$i" tc qdisc add dev $dev root handle 1: tbf rate "$r" burst "$burst" latency 50ms || rc=1
            if [ -n "$netem" ] && [ $dev = eth0 ]; then
                _hb_net "$i" tc qdisc add dev $dev parent 1:1 handle 10: netem $netem limit 100000 || rc=1
            fi
        elif [ -n "$netem" ] && [ $dev = eth0 ]; then
            _hb_net "$i" tc qdisc add dev $dev root handle 10: netem $netem limit 100000 || rc=1
        fi
    done
    return $rc
}

hostbed_shape() {
    local - target=${1:-} i first last r d l down nr='' nd='' nl='' mode='' rc=0 any_impair=0
    set +e +u
    _hb_need_bed || return 1
    shift
    if [ "${1:-}" = off ]; then nr=off nd=off nl=off; shift; fi
    while [ $# -gt 0 ]; do
        case $1 in
        --rate) nr=$2; shift 2 ;;
        --delay) nd=$2; shift 2 ;;
        --loss) nl=$2; shift 2 ;;
        *) _hb_log "hostbed_shape: unknown option '$1'"; return 1 ;;
        esac
    done
    case $nr in '' | off) ;; *) _hb_rate_bytes "$nr" >/dev/null || { _hb_log "hostbed_shape: bad rate '$nr' (e.g. 100mbit, 10gbit)"; return 1; } ;; esac
    case $nd in '' | off) ;; *) _hb_delay_ns "$nd" >/dev/null || { _hb_log "hostbed_shape: bad delay '$nd' (e.g. 20ms, 500us)"; return 1; } ;; esac
    case $nl in '' | off) ;; *) _hb_loss_ppm "$nl" >/dev/null || { _hb_log "hostbed_shape: bad loss '$nl' (e.g. 5%)"; return 1; } ;; esac
    if [ "$target" = all ]; then
        first=0 last=$((HOSTBED_N - 1))
    else
        _hb_index "$target" || return 1
        first=$_HB_I last=$_HB_I
    fi
    for ((i = first; i <= last; i++)); do
        read -r r d l down <"$HOSTBED_DIR/state/h$i"
        case $nr in off) r=- ;; '') ;; *) r=$nr ;; esac
        case $nd in off) d=- ;; '') ;; *) d=$nd ;; esac
        case $nl in off) l=- ;; '') ;; *) l=$nl ;; esac
        [ "$d" != - ] && [ "$(_hb_delay_ns "$d")" = 0 ] && d=-
        [ "$l" != - ] && [ "$(_hb_loss_ppm "$l")" = 0 ] && l=-
        echo "$r $d $l $down" >"$HOSTBED_DIR/state/h$i"
        [ "$d" != - ] || [ "$l" != - ] && any_impair=1
    done
    if [ $any_impair = 1 ] || [ -f "$HOSTBED_DIR/state/impair" ]; then
        mode=$(_hb_impair_mode)
        export HOSTBED_IMPAIR=$mode
    fi
    if [ "$mode" = linkd ] && [ $any_impair = 1 ] && ! _hb_linkd_running; then
        _hb_linkd_start || return $?
        first=0 last=$((HOSTBED_N - 1)) # every host now sends over imp0: its rate moves there
    fi
    for ((i = first; i <= last; i++)); do
        _hb_apply_tc "$i" "$mode" || rc=1
    done
    if [ "$mode" = linkd ] && _hb_linkd_running; then
        _hb_linkd_push || rc=1
    fi
    [ $rc = 0 ] || _hb_log "hostbed_shape $target: tc failed"
    return $rc
}

hostbed_link() {
    local - target=${1:-} state=${2:-} i first last r d l down
    set +e +u
    _hb_need_bed || return 1
    case $state in up | down) ;; *) _hb_log "hostbed_link: say up or down"; return 1 ;; esac
    if [ "$target" = all ]; then
        first=0 last=$((HOSTBED_N - 1))
    else
        _hb_index "$target" || return 1
        first=$_HB_I last=$_HB_I
    fi
    for ((i = first; i <= last; i++)); do
        read -r r d l down <"$HOSTBED_DIR/state/h$i"
        [ "$state" = down ] && down=1 || down=0
        echo "$r $d $l $down" >"$HOSTBED_DIR/state/h$i"
        _hb_sw ip link set "h$i" "$state" || return 1
    done
    if _hb_linkd_running; then _hb_linkd_push || return 1; fi
    return 0
}

# --- command line: watchdog, entering a host from anywhere (the MPI agent), cleanup -------------

_hb_watchdog() {
    local D=$1 owner start t0=$SECONDS
    echo $$ >"$D/watchdog.pid"
    read -r owner start 2>/dev/null <"$D/owner" || exit 0
    while _hb_alive "$owner" "$start" && [ -f "$D/owner" ]; do
        if [ $((SECONDS - t0)) -ge "$HOSTBED_MAX_SECONDS" ]; then
            echo "hostbed: the bed of process $owner is older than HOSTBED_MAX_SECONDS=$HOSTBED_MAX_SECONDS s; tearing it down" >&2
            break
        fi
        sleep 0.5
    done
    [ -f "$D/owner" ] && _hb_teardown "$D"
    exit 0
}

# enters HOST of the bed in $HOSTBED_DIR and runs CMD, from the root or from inside another host
_hb_enter() {
    local host=$1
    shift
    if [ -z "${HOSTBED_DIR:-}" ] || [ ! -f "$HOSTBED_DIR/owner" ]; then
        echo "hostbed: HOSTBED_DIR is not set to a live bed" >&2
        exit 2
    fi
    HOSTBED_N=$(cat "$HOSTBED_DIR/n")
    _hb_index "$host" && _hb_holder "h$_HB_I" || exit 2
    exec nsenter -t "$_HB_HP" --net --mount --uts --ipc \
        sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$(_hb_wd)" "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    case ${1:-} in
    __watchdog)
        HOSTBED_BASE=${2%/*}
        HOSTBED_MAX_SECONDS=${3:-3600}
        _hb_watchdog "$2"
        ;;
    __enter)
        shift
        _hb_enter "$@"
        ;;
    clean) _hb_clean_stale ;;
    list)
        for d in "$HOSTBED_BASE"/[0-9]*; do
            [ -d "$d" ] || continue
            read -r pid start 2>/dev/null <"$d/owner" || { pid=${d##*/}; pid=${pid%%.*}; }
            if _hb_alive "$pid" "$start"; then echo "$d: owner $pid alive"; else echo "$d: owner $pid gone (stale)"; fi
        done
        ;;
    *)
        echo "usage: . tests/multihost/hostbed.sh (a library; see its header), or: bash $0 clean|list" >&2
        exit 2
        ;;
    esac
fi
