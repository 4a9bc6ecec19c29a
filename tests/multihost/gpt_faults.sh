# tests/multihost/gpt_faults.sh: a host of the bed lost, and started again, at a known point of
# examples/gpt.c's run (bash library), so that runs with the same schedule can be compared bit for
# bit; used by tests/multihost/test_recover.sh and tests/chaos.sh. Source it after hostbed.sh.
#
# The job is started by hostbed_ranks --no-wait with gpt --recover and GPT_FAULT_HOST=H
# GPT_FAULT_AT_STEP=S GPT_FAULT_SIGNAL=STOP in its environment: H's ranks stop themselves (SIGSTOP)
# at the start of step S, and the survivors wait in the step's first op that needs them; for a
# rejoin also --recovery-port P and GPT_PAUSE_AT_STEP=S2 (rank 0 of the survivors, the rendezvous,
# stops at the start of steps S2 and S2+1; examples/gpt.c's inject_fault says why).
#
#   gpt_host_ranks HOST          prints the ranks hostbed_ranks put on HOST (h<i>), one per line
#   gpt_logged FILE REGEX        until FILE has a line matching REGEX (grep's), at most 60 s; 1 if not
#   gpt_stopped HOST STEP        until every rank of HOST said it stopped at the start of STEP, at
#                                most 60 s each; 1 if one did not
#   gpt_lose_host HOST STEP FAULT
#                                once HOST's ranks stopped at STEP (and 0.2 s more), FAULT loses it:
#                                kill (hostbed_kill: SIGKILL of every process in the host; its ranks
#                                waited for at once) or silent (hostbed_link down: it sends nothing);
#                                prints the time of the fault (date +%s.%N)
#   gpt_wait_survivors HOST FAULT
#                                waits for the survivors; a silent host's ranks (alive, stopped) are
#                                then killed and its link restored.
#                                HOSTBED_RANK_STATUS as hostbed_ranks_wait's; 0 if every survivor
#                                exited 0
#   gpt_rejoin [--timeout S] HOST PORT PAUSE OUT CMD [ARGS...]
#                                HOST's ranks (lost by kill) started again, CMD ARGS (gpt ... --rejoin)
#                                with the environment hostbed_ranks gave them and FSDP_RECOVERY_PEERS
#                                (every host's first rank's address, at PORT + its rank), rank r's
#                                output in OUTr, once the rendezvous stopped at step PAUSE; lets the
#                                rendezvous go at PAUSE once every joiner's connection waits at its
#                                listener (PAUSE's commit point challenges them) and at PAUSE+1 once
#                                their hellos (the answers) wait there (PAUSE+1's commit point admits
#                                them): every run admits them after step PAUSE+1, and PAUSE+2 is their
#                                first step. GPT_REJOIN_PIDS: the joiners' pids, for `wait`. Prints
#                                what it waited for and how long (a line each).
#   gpt_cut_pairs add|del        a 2|2 partition of 4 hosts, h0,h1 | h2,h3 (below)
#   gpt_partition STEP           the job (4 hosts, started with GPT_FAULT_HOST=1 GPT_FAULT_AT_STEP=STEP
#                                GPT_FAULT_SIGNAL=STOP) split 2|2 at STEP: h1's ranks stop at its
#                                start (the others then wait in its first op across hosts), the
#                                partition is made, h1's ranks go on, both halves whole and alive;
#                                waits for every rank, then mends the links. 0 if every rank stopped
#                                (a non-zero exit, not the bound's 124) naming the partition ("not a
#                                strict majority") and none reached the last step (GPT_STEPS)

gpt_host_ranks() {
    local r
    for ((r = 0; r < ${#HOSTBED_RANK_HOST[@]}; r++)); do [ "h${HOSTBED_RANK_HOST[r]}" = "$1" ] && echo $r; done
}

gpt_logged() {
    local t
    for ((t = 0; t < 3000; t++)); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.02
    done
    return 1
}

gpt_stopped() {
    local r ok=0
    for r in $(gpt_host_ranks "$1"); do
        gpt_logged "$HOSTBED_SHARE/rank$r.log" "stopping this rank (SIGSTOP) at step $2\$" || ok=1
    done
    return $ok
}

# _gpt_killed HOST: HOST's ranks (killed) waited for, their statuses in HOSTBED_RANK_STATUS
_gpt_killed() {
    local r
    for r in $(gpt_host_ranks "$1"); do
        wait "${HOSTBED_RANK_PIDS[r]}"
        HOSTBED_RANK_STATUS[r]=$?
    done 2>/dev/null # (at once: no notices of the killed ranks)
}

gpt_lose_host() {
    gpt_stopped "$1" "$2"
    sleep 0.2 # (the survivors wait in the step's first op that needs the stopped host)
    date +%s.%N
    case $3 in
    kill) hostbed_kill "$1" && _gpt_killed "$1" ;;
    silent) hostbed_link "$1" down ;;
    esac
}

gpt_wait_survivors() {
    local r ok=0
    for ((r = 0; r < ${#HOSTBED_RANK_PIDS[@]}; r++)); do
        [ "h${HOSTBED_RANK_HOST[r]}" = "$1" ] && continue
        wait "${HOSTBED_RANK_PIDS[r]}" 2>/dev/null
        HOSTBED_RANK_STATUS[r]=$?
        [ "${HOSTBED_RANK_STATUS[r]}" = 0 ] || ok=1
    done
    [ "$2" = silent ] && { hostbed_kill "$1"; _gpt_killed "$1"; hostbed_link "$1" up; }
    return $ok
}

# _gpt_rendezvous_waits RANK PORT N CONDITION: until N established connections at PORT (the
# rendezvous RANK's listener) meet the awk CONDITION on ss's columns (Recv-Q first), at most 30 s;
# then 0.3 s more
_gpt_rendezvous_waits() {
    local t start=$SECONDS
    for ((t = 0; t < 1500; t++)); do
        [ "$(hostbed_exec "h${HOSTBED_RANK_HOST[$1]}" ss -Htn state established "( sport = :$2 )" | awk "$4" | wc -l)" -ge "$3" ] &&
            break
        sleep 0.02
    done
    echo "waiting at the rendezvous (rank $1, port $2) for $3 connections with '$4': $((t < 1500 ? 1 : 0)) (1: met, 0: gave up)" \
        "after $((SECONDS - start)) s"
    sleep 0.3
}

gpt_rejoin() {
    local timeout=120 host pport pause out r i first=() hosts=0 peers="" rz n
    [ "$1" = --timeout ] && { timeout=$2; shift 2; }
    host=$1 pport=$2 pause=$3 out=$4
    shift 4
    for ((r = ${#HOSTBED_RANK_HOST[@]} - 1; r >= 0; r--)); do first[HOSTBED_RANK_HOST[r]]=$r; done
    hosts=${#first[@]}
    for ((i = 0; i < hosts; i++)); do peers="$peers${peers:+,}$(hostbed_ip "h$i"):$((pport + first[i]))"; done
    rz=${first[$([ "$host" = h0 ] && echo 1 || echo 0)]} # the rendezvous: rank 0 of the survivors
    n=$(gpt_host_ranks "$host" | wc -l)
    GPT_REJOIN_PIDS=()
    gpt_logged "$HOSTBED_SHARE/rank$rz.log" "GPT_PAUSE_AT_STEP=$pause: .* at step $pause\$"
    for r in $(gpt_host_ranks "$host"); do
        FSDP_RECOVERY_PEERS=$peers RANK=$r WORLD_SIZE=${#HOSTBED_RANK_HOST[@]} LOCAL_RANK=$((r - first[${host#h}])) \
            LOCAL_WORLD_SIZE=$n MASTER_ADDR=$(hostbed_ip h0) MASTER_PORT=29500 \
            hostbed_spawn --timeout "$timeout" "$host" "$@" >"$out$r" 2>&1
        GPT_REJOIN_PIDS+=("$HOSTBED_SPAWNED")
    done
    _gpt_rendezvous_waits "$rz" $((pport + rz)) "$n" '1' # every joiner connected (PAUSE's commit point challenges them)
    hostbed_kill "h${HOSTBED_RANK_HOST[rz]}" CONT
    gpt_logged "$HOSTBED_SHARE/rank$rz.log" "GPT_PAUSE_AT_STEP=$pause: .* at step $((pause + 1))\$"
    _gpt_rendezvous_waits "$rz" $((pport + rz)) "$n" '$1 > 0' # their hellos wait unread (PAUSE+1's admits them)
    hostbed_kill "h${HOSTBED_RANK_HOST[rz]}" CONT
}

# gpt_cut_pairs add|del: each host sends what is for the other pair to a hardware address nobody
# has (a permanent neighbour entry): the switch floods it and every host drops it, so the senders
# see nothing, as when a switch stops forwarding between two groups of ports. (hostbed_link cuts a
# host from every other; tc's drop action is missing from some kernels.)
gpt_cut_pairs() {
    local i p peers
    for i in 0 1 2 3; do
        [ $i -lt 2 ] && peers="3 4" || peers="1 2"
        for p in $peers; do
            if [ "$1" = add ]; then
                hostbed_exec "h$i" ip neigh replace "$HOSTBED_SUBNET.$p" lladdr 02:00:00:00:00:01 nud permanent dev eth0 || return 1
            else
                hostbed_exec "h$i" ip neigh del "$HOSTBED_SUBNET.$p" dev eth0 2>/dev/null
            fi
        done
    done
}

gpt_partition() {
    local r ok=0
    gpt_stopped h1 "$1" || ok=1
    gpt_cut_pairs add || ok=1
    hostbed_kill h1 CONT
    hostbed_ranks_wait
    gpt_cut_pairs del
    for ((r = 0; r < ${#HOSTBED_RANK_STATUS[@]}; r++)); do
        [ "${HOSTBED_RANK_STATUS[r]}" != 0 ] && [ "${HOSTBED_RANK_STATUS[r]}" != 124 ] || ok=1
        grep -q "not a strict majority" "$HOSTBED_SHARE/rank$r.log" || ok=1
    done
    grep -q "^step *${GPT_STEPS:-0}/${GPT_STEPS:-0} " "$HOSTBED_SHARE"/rank*.log && ok=1
    return $ok
}
