#!/bin/bash
# examples/recover_bed.sh - lose a host, keep training (issue 38): the GPT with --recover on the
# multi-host test bed (tests/multihost/hostbed.sh: each "host" a network + mount + UTS namespace,
# joined by veths, each host's egress shaped by tc to the rate), HYBRID_SHARD with a replica per
# host. When rank 0 has printed step --kill-at-step, one host is lost:
#   kill     its ranks are SIGKILLed (hostbed_kill: every process in the host; the survivors' links
#            to it reset at once)
#   silent   its link is cut at the switch (hostbed_link down: it sends nothing, as a host powered
#            off; the survivors notice within --detect-ms); its ranks are killed after the run
# and the survivors train on to the last step. The output: the timeline, each event in ms after the
# kill (the script's clock; gpt prints wall-clock times, so the two compare):
#   killed               the script killed the host (or cut its link)
#   last step done       the last step rank 0 of the survivors completed before it saw the loss
#   detected             that rank's first op to fail of the loss (a hook's, or fsdp_step's): the
#                        phases from here to rebuilt are fsdp_recovery_timeline_get's
#   stopped              everything in flight stopped
#   agreed               the survivors agreed on the new membership
#   rebuilt              the survivors' world made
#   fsdp_step returned   with the new epoch: the step in flight dropped (taken again) or applied
#   next step done       the first step the survivors completed after the loss
# then the rejoin (unless --no-rejoin): once the survivors' rank 0 has printed step --rejoin-at-step,
# the lost host's ranks are started again (a silent host's killed and its link put back first) with
# the environment they first had and gpt --rejoin (the host's world made anew, the job found at
# the survivors' --recovery-port listeners, admitted after their next step, each rank's state
# received from its counterpart). Its timeline, in ms after the kill too:
#   rejoin started       the script started the host's ranks again
#   requested            the host's first rank sent its hello (fsdp_init with recovery.rejoin)
#   admission began     the survivors, after the step whose commit point carried the request
#   world made           the world of every replica made again (fsdp.h's join_world)
#   first part sent      what a step needs (master shards, step, the data position): the rest of
#                        the admitting step's pause
#   fsdp_step returned   the admitting step
#   state sent           bytes, ms, MB/s a rank (master shards, then the AdamW state behind
#                        training: the next step runs meanwhile); the summary: the host's ranks
#                        together against the link's rate
#   caught up            the first step done with every replica, and the survivors' pause: what the
#                        admitting step and this one took beyond the step before them
#   first step done      the rejoined host's first rank's first step (and how long after its start)
# then the losses rank 0 (of the survivors, after the loss) printed, the replicas' checksums, and a
# summary line:
#   summary: fault F, detected +D ms, agreed +A ms, next step done +N ms after the kill; steps lost 0
#   summary: rejoin, requested +R ms, B bytes a rank in S ms (M MB/s; the host's, F of the link),
#            survivors' pause P ms (against the host's bytes at the link rate),
#            caught up +C ms after the kill; the rejoined rank's first step X ms after its start
# With --restart, the same failure is handled by today's restart from a checkpoint instead: the
# ranks run under torchrun (tests/torchrun.py, static rendezvous, --max_restarts 1; the GPT with
# --resume auto and --save-every), the lost host's ranks are SIGKILLed (its torchrun agent stays:
# the host "comes back" at once, the kindest case for a restart), every agent restarts its ranks
# and they continue from the last checkpoint. Its timeline: killed, the first step after the
# restart (each of rank 0's lines stamped by the script as it is written), and the steps lost (the
# steps done since the last save, on every host).
#
# --loopback runs the same without the bed (no root or network namespaces needed, only unshare
# --uts): each host a UTS namespace of its own name, every rank on 127.0.0.1, no link shaping (the
# rate is not applied) and no silent fault (there is no link to cut).
#
# Command (root; iproute2, OpenBLAS; --restart also /usr/bin/python3 with torch):
#   bash examples/recover_bed.sh                      # make demo-recover: 4 hosts x 2, h2 killed at step 8
#   bash examples/recover_bed.sh --fault silent --kill-host h0
#   bash examples/recover_bed.sh --model big --rate 2gbit --restart
# Options (defaults in brackets):
#   --hosts H          hosts, at least 3 (a strict majority must survive) [4]
#   --ranks R          ranks per host (one replica per host) [2]
#   --kill-host h<i>   the host lost [h2]
#   --kill-at-step S   lose it once rank 0 has printed step S [8]
#   --rejoin-at-step S start its ranks again once the survivors' rank 0 has printed step S [kill + 3]
#   --no-rejoin        do not start them again (the survivors train on to the end without them)
#   --steps N          GPT steps [20]
#   --fault kill|silent  [kill]
#   --detect-ms MS     gpt --detect-ms: a silent host's detection bound [fsdp.h's, 5000]
#   --rate R           the links' rate (tc: 1gbit, 2gbit, ...) [2gbit]
#   --model tiny|small|medium|big  tiny: 2 layers of 64 channels; small: 4 x 128 (gpt's default, 0.9 M
#                      parameters); medium: 6 x 384, 6 heads (11 M); big: demo-big's shape (12 x 768,
#                      12 heads, 85 M) with --recompute [small]
#   --batch B          global batch (sequences); with --recover it must split evenly over every
#                      replica count down to 2 [24]
#   --gpt-args "..."   more gpt flags for every run
#   --restart          today's restart from a checkpoint instead of --recover
#   --save-every K     with --restart: checkpoint every K steps [5]
#   --timeout S        bound on the run [900]
#   --keep-logs DIR    copy the ranks' logs to DIR
#   --trace DIR        every rank (the rejoining ones too) writes fsdp.h's trace (FSDP_TRACE) to DIR:
#                      read it with build/trace_tool (summary, svg). Tracing costs a little time
#   --loopback         fake hosts over loopback instead of the bed (see above)
# Environment: BUILD (binaries, default build; not under /tmp: the hosts have their own /tmp).
# Exit status: 0 the survivors reached the last step, 1 they did not (their logs' ends are shown),
# 2 bad usage or gpt does not build, 77 cannot run here (not root, no namespaces, no iproute2; with
# --loopback no UTS namespace; no torch for --restart: the reason is printed). The bed is torn down however the script ends.
set -u
ME=examples/recover_bed.sh
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
TOP=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD ;; *) BIN=$TOP/$BUILD ;; esac

hosts=4 ranks=2 kill_host=h2 kill_step=8 steps=20 fault=kill detect_ms='' rate=2gbit model=small batch=24
more_args='' restart=0 save_every=5 run_timeout=900 keep='' loopback=0 rejoin=1 rejoin_step='' trace=''
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "$ME: $*" >&2; echo "(--help for the options)" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --restart) restart=1; shift; continue ;;
    --loopback) loopback=1; shift; continue ;;
    --no-rejoin) rejoin=0; shift; continue ;;
    esac
    [ $# -ge 2 ] || die_usage "$1 needs a value"
    case $1 in
    --hosts) hosts=$2 ;;
    --ranks) ranks=$2 ;;
    --kill-host) kill_host=$2 ;;
    --kill-at-step) kill_step=$2 ;;
    --rejoin-at-step) rejoin_step=$2 ;;
    --steps) steps=$2 ;;
    --fault) fault=$2 ;;
    --detect-ms) detect_ms=$2 ;;
    --rate) rate=$2 ;;
    --model) model=$2 ;;
    --batch) batch=$2 ;;
    --gpt-args) more_args=$2 ;;
    --save-every) save_every=$2 ;;
    --timeout) run_timeout=$2 ;;
    --keep-logs) keep=$2 ;;
    --trace) trace=$2 ;;
    *) die_usage "unknown option '$1'" ;;
    esac
    shift 2
done
for v in "hosts:$hosts" "ranks:$ranks" "kill-at-step:$kill_step" "steps:$steps" "batch:$batch" \
    "save-every:$save_every" "timeout:$run_timeout" ${detect_ms:+"detect-ms:$detect_ms"} ${rejoin_step:+"rejoin-at-step:$rejoin_step"}; do
    case ${v#*:} in '' | *[!0-9]*) die_usage "--${v%%:*} takes a number, not '${v#*:}'" ;; esac
done
[ "$hosts" -ge 3 ] && [ "$hosts" -le 32 ] || die_usage "--hosts must be 3..32 (a strict majority must survive the loss)"
[ "$ranks" -ge 1 ] || die_usage "--ranks must be at least 1"
[[ $kill_host =~ ^h([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt "$hosts" ] || die_usage "--kill-host must be h0..h$((hosts - 1))"
kill_index=${kill_host#h}
[ "$kill_step" -ge 1 ] && [ "$kill_step" -lt "$steps" ] || die_usage "--kill-at-step must be 1..$((steps - 1)) (--steps $steps)"
rejoin_step=${rejoin_step:-$((kill_step + 3))}
[ $rejoin = 0 ] || [ $restart = 1 ] || { [ "$rejoin_step" -gt "$kill_step" ] && [ "$rejoin_step" -lt "$((steps - 1))" ]; } ||
    die_usage "--rejoin-at-step must be $((kill_step + 1))..$((steps - 2)) (after the loss, and steps left to rejoin at; or --no-rejoin)"
case $fault in kill | silent) ;; *) die_usage "--fault is kill or silent" ;; esac
[ $loopback = 1 ] && [ "$fault" = silent ] && die_usage "--fault silent cuts a link: it needs the bed, not --loopback"
[ $restart = 1 ] && [ "$fault" = silent ] && die_usage "--restart with --fault silent: torchrun's agent of a silent host cannot restart anything; use --fault kill"
case $model in
tiny) model_args="--layers 2 --channels 64 --heads 2 --seq-len 32" ;;
small) model_args="--layers 4 --channels 128 --heads 4 --seq-len 64" ;;
medium) model_args="--layers 6 --channels 384 --heads 6 --seq-len 64 --lr 1e-3" ;;
big) model_args="--layers 12 --channels 768 --heads 12 --seq-len 64 --recompute --lr 3e-4 --warmup 3" ;;
*) die_usage "--model is tiny, small, medium or big" ;;
esac
case $BIN in /tmp | /tmp/* | /dev/shm | /dev/shm/*) die_usage "BUILD=$BUILD: the hosts have their own /tmp and /dev/shm; build elsewhere" ;; esac

# --- the hosts: the bed's, or UTS namespaces over loopback ----------------------------------------
# bed_check (exit 77 with the reason if they cannot be had), bed_up, bed_down; SHARE: a directory
# every host sees; spawn_in HOST CMD... (background, output as redirected on the call; SPAWNED: its
# pid); master_addr; lose_host (kill or cut kill_host, prints the time); host_gpt_pids HOST.
if [ $loopback = 1 ]; then
    bed_check() {
        unshare --uts true 2>/dev/null && return 0
        echo "$ME: cannot run --loopback: no UTS namespaces here (unshare --uts: root or user namespaces needed)" >&2
        exit 77
    }
    bed_up() { SHARE=$RES/share; mkdir -p "$SHARE"; }
    bed_down() { local p; for p in $(host_gpt_pids all); do kill -KILL "$p" 2>/dev/null; done; }
    spawn_in() {
        local i=${1#h}
        shift
        timeout -k 5 "$run_timeout" unshare --uts sh -c 'hostname "$0"; exec "$@"' "fsdp-lo$$-h$i" "$@" &
        SPAWNED=$!
    }
    master_addr() { echo 127.0.0.1; }
    # the gpt processes of a host (all: of every host), by their host's name
    host_gpt_pids() {
        local p name
        for p in $(pgrep -x gpt); do
            name=$(nsenter -t "$p" --uts hostname 2>/dev/null) || continue
            if [ "$1" = all ]; then [[ $name == "fsdp-lo$$-h"* ]] && echo "$p"; else [ "$name" = "fsdp-lo$$-$1" ] && echo "$p"; fi
        done
    }
    lose_host() { local t pids; pids=$(host_gpt_pids "$kill_host"); t=$(now); kill -KILL $pids; echo "$t"; }
else
    . tests/multihost/hostbed.sh
    bed_check() {
        hostbed_require 2>/dev/null && return 0
        echo "$ME: cannot run: ${HOSTBED_SKIP_REASON:-no test bed here}: run it as root on Linux with iproute2 (or try --loopback)." >&2
        exit 77
    }
    bed_up() {
        echo "$ME: building a bed of $hosts hosts, links at $rate" >&2
        hostbed_up "$hosts" --rate "$rate"
        local s=$?
        [ $s = 0 ] && { SHARE=$HOSTBED_SHARE; return 0; }
        rm -rf "$RES"
        [ $s = 77 ] && { echo "$ME: cannot run: ${HOSTBED_SKIP_REASON:-the bed cannot be built here}" >&2; exit 77; }
        echo "$ME: the test bed did not come up (status $s)" >&2
        exit 1
    }
    bed_down() { hostbed_down; }
    spawn_in() { hostbed_spawn --timeout "$run_timeout" "$@"; SPAWNED=$HOSTBED_SPAWNED; }
    master_addr() { hostbed_ip h0; }
    host_gpt_pids() {
        local p
        for p in $(hostbed_pids "$1"); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = gpt ] && echo "$p"; done
    }
    lose_host() { # (the host's processes found first, so that the time is the kill's: as hostbed_kill, timed)
        local t pids
        [ "$fault" = kill ] && pids=$(hostbed_pids "$kill_host")
        t=$(now)
        if [ "$fault" = silent ]; then hostbed_link "$kill_host" down; else kill -KILL $pids; fi
        echo "$t"
    }
fi
now() { date +%s.%N; }

bed_check
if [ $restart = 1 ] && ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    echo "$ME: cannot run --restart: /usr/bin/python3 has no torch for torchrun (apt-get install python3-torch)" >&2
    exit 77
fi
make --no-print-directory -s BUILD="$BUILD" "$BUILD/gpt" >/dev/null 2>"$BIN.make.err" ||
    { echo "$ME: $BUILD/gpt does not build:" >&2; cat "$BIN.make.err" >&2; rm -f "$BIN.make.err"; exit 2; }
rm -f "$BIN.make.err"

export OPENBLAS_NUM_THREADS=1
export FSDP_SECRET=${FSDP_SECRET:-recover-bed-$$-$RANDOM$RANDOM}
unset FSDP_HIERARCHICAL FSDP_BACKEND FSDP_TRACE FSDP_TIMEOUT_MS # (the op timeout at its default: detection must not need it)
if [ -n "$trace" ]; then mkdir -p "$trace" && export FSDP_TRACE=$(cd "$trace" && pwd) || die_usage "--trace: cannot make '$trace'"; fi
RES=$(mktemp -d "${TMPDIR:-/var/tmp}/recover_bed.XXXXXX") || exit 2
cleanup() { bed_down; rm -rf "$RES"; }
bed_up
trap 'cleanup' EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM
trap 'cleanup; trap - EXIT; exit 129' HUP
where=$([ $loopback = 1 ] && echo "fake hosts over loopback, links not shaped" || echo "links $rate")
port=$((29710 + RANDOM % 200))

counts=$(printf "$ranks%.0s," $(seq "$hosts")); counts=${counts%,}
read -ra gpt_args <<<"--strategy hybrid --steps $steps --batch $batch --print-every 1 --sample 0 $model_args $more_args"
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }

# wait_for PATTERN FILE S [PID]: until FILE has a line matching PATTERN (0), or S seconds passed or
# process PID ended (1)
wait_for() {
    local deadline=$((SECONDS + $3))
    while [ $SECONDS -lt $deadline ]; do
        grep -qE "$1" "$2" 2>/dev/null && return 0
        [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && { grep -qE "$1" "$2" 2>/dev/null; return; }
        sleep 0.02
    done
    return 1
}

# --- today's restart from a checkpoint ---------------------------------------------------------------
# The ranks under torchrun on every host; rank 0's lines stamped with the time they were written.
if [ $restart = 1 ]; then
    ckpt=$SHARE/ckpt
    for ((i = 0; i < hosts; i++)); do
        spawn_in "h$i" bash -c 'out=$1; shift; "$@" 2>&1 |
            while IFS= read -r line; do printf "%s %s\n" "$(date +%s.%N)" "$line"; done >"$out"' _ \
            "$SHARE/torchrun$i.log" /usr/bin/python3 tests/torchrun.py --nnodes "$hosts" --node_rank "$i" \
            --nproc_per_node "$ranks" --master_addr "$(master_addr)" --master_port "$port" --max_restarts 1 \
            --monitor_interval 1 --no_python "$BIN/gpt" "${gpt_args[@]}" --ckpt "$ckpt" --save-every "$save_every" \
            --resume auto >/dev/null 2>&1
        pids[i]=$SPAWNED
    done
    wait_for "^[0-9.]+ step +$kill_step/" "$SHARE/torchrun0.log" "$run_timeout" ||
        { echo "$ME: rank 0 did not reach step $kill_step" >&2; tail -n 20 "$SHARE/torchrun0.log" >&2; exit 1; }
    victims=$(host_gpt_pids "$kill_host") # its ranks, not its agent
    t_kill=$(now)
    kill -KILL $victims
    rc=0
    for ((i = 0; i < hosts; i++)); do wait "${pids[i]}" || rc=1; done
    log=$SHARE/torchrun0.log
    [ -n "$keep" ] && mkdir -p "$keep" && cp "$SHARE"/torchrun*.log "$keep/"
    resumed=$(sed -n 's/^[0-9.]* resuming from .* at step \([0-9]*\) (restart 1).*/\1/p' "$log" | head -n 1)
    last_before=$(awk -v t="$t_kill" '$2 == "step" && $1 < t { s = $3 } END { sub("/.*", "", s); print s + 0 }' "$log")
    first_after=$(awk -v t="$t_kill" '$2 == "step" && $1 > t && seen { print $1, $3; exit } / resuming from / && $1 > t { seen = 1 }' "$log")
    # the first step past the last one done before the kill: where the survivors of a recovery are at "next step done"
    caught_up=$(awk -v t="$t_kill" -v last="$last_before" '$2 == "step" && $1 > t && seen { n = $3; sub("/.*", "", n); if (n + 0 > last) { print $1, $3; exit } }
        / resuming from / && $1 > t { seen = 1 }' "$log")
    echo
    echo "restart from a checkpoint ($hosts hosts x $ranks ranks, $where; torchrun --max_restarts 1, gpt --resume auto --save-every $save_every):"
    echo "  killed               +0 ms   the ranks of $kill_host (SIGKILL; its torchrun agent stays)"
    if [ -n "$first_after" ] && [ -n "$resumed" ]; then
        echo "  first step after the restart  +$(ms_between "$t_kill" "${first_after%% *}") ms   step ${first_after#* } (resumed from step $resumed)"
        [ -n "$caught_up" ] && echo "  caught up                     +$(ms_between "$t_kill" "${caught_up%% *}") ms   step ${caught_up#* } (the first step past the last done before the kill)"
        echo "  steps lost: $((last_before - resumed)) done since the last save, on every host, plus the step in flight"
        echo "summary: restart, fault kill, first step after the restart +$(ms_between "$t_kill" "${first_after%% *}") ms, caught up +$(ms_between "$t_kill" "${caught_up%% *}") ms after the kill; steps lost $((last_before - resumed))"
    else
        echo "  the job did not restart: the end of rank 0's log:"; tail -n 20 "$log" | sed 's/^/    /'
        rc=1
    fi
    echo
    echo "losses (rank 0):"
    grep -E '^[0-9.]+ step ' "$log" | cut -d' ' -f2- | grep -o '^step *[0-9]*/[0-9]*  loss [0-9.a-z]*'
    exit $rc
fi

# --- in-job recovery ---------------------------------------------------------------------------------
rport=$((port + 1000)) # gpt --recovery-port: rank r listens at rport + r (a host's ranks started again: rport + world + ...)
world=$((hosts * ranks))
peers=$(for ((i = 0; i < hosts; i++)); do printf '%s:%d,' "$(if [ $loopback = 1 ]; then master_addr; else hostbed_ip "h$i"; fi)" $((rport + i * ranks)); done)
peers=${peers%,}
# start_rank R [FLAGS...]: rank R on its host, with the environment torchrun would give it (hostbed_ranks does the same)
start_rank() {
    local r=$1
    shift
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % ranks)) LOCAL_WORLD_SIZE=$ranks GROUP_RANK=$((r / ranks)) \
        MASTER_ADDR=$(master_addr) MASTER_PORT=$port spawn_in "h$((r / ranks))" "$BIN/gpt" "${gpt_args[@]}" --recover \
        --ckpt none --recovery-port "$rport" ${detect_ms:+--detect-ms "$detect_ms"} "$@"
}
for ((r = 0; r < world; r++)); do
    start_rank "$r" >"$SHARE/rank$r.log" 2>&1
    rank_pids[r]=$SPAWNED
done
wait_for "^step +$kill_step/" "$SHARE/rank0.log" "$run_timeout" ||
    { echo "$ME: rank 0 did not reach step $kill_step" >&2; tail -n 20 "$SHARE/rank0.log" >&2; exit 1; }
t_kill=$(lose_host)

# >>rejoin: once the survivors' rank 0 has printed --rejoin-at-step, the lost host's ranks are
# started again with the environment they first had and --rejoin (FSDP_JOB: gpt takes the token
# the job's ranks took from MASTER_PORT); they are admitted after the survivors' next step.
survivor0=$((kill_index == 0 ? ranks : 0)) # rank 0 of the survivors: the first rank of the lowest host left
if [ $rejoin = 1 ]; then
    wait_for "^step +$rejoin_step/" "$SHARE/rank$survivor0.log" "$run_timeout" "${rank_pids[survivor0]}" ||
        { echo "$ME: the survivors did not reach step $rejoin_step" >&2; tail -n 20 "$SHARE/rank$survivor0.log" >&2; exit 1; }
    if [ "$fault" = silent ]; then hostbed_kill "$kill_host"; hostbed_link "$kill_host" up; fi
    for ((r = kill_index * ranks; r < (kill_index + 1) * ranks; r++)); do wait "${rank_pids[r]}" 2>/dev/null; status[r]=$?; done
    t_rejoin=$(now)
    for ((r = kill_index * ranks; r < (kill_index + 1) * ranks; r++)); do
        FSDP_RECOVERY_PEERS=$peers start_rank "$r" --rejoin >"$SHARE/rejoin$r.log" 2>&1
        rejoin_pids[r]=$SPAWNED
    done
fi

rc=0
for ((r = 0; r < world; r++)); do # the survivors first: a silent host's ranks live on, cut off
    [ $((r / ranks)) = "$kill_index" ] && continue
    wait "${rank_pids[r]}" 2>/dev/null # (no "Killed" notices)
    status[r]=$?
    [ "${status[r]}" = 0 ] || rc=1
done
[ "$fault" = silent ] && [ $rejoin = 0 ] && { hostbed_kill "$kill_host"; hostbed_link "$kill_host" up; }
for ((r = kill_index * ranks; r < (kill_index + 1) * ranks; r++)); do
    [ $rejoin = 1 ] || { wait "${rank_pids[r]}" 2>/dev/null; status[r]=$?; continue; }
    wait "${rejoin_pids[r]}"
    rejoin_status[r]=$?
    [ "${rejoin_status[r]}" = 0 ] || rc=1
done
[ -n "$keep" ] && mkdir -p "$keep" && cp "$SHARE"/rank*.log "$SHARE"/rejoin*.log "$keep/" 2>/dev/null
printer=$(grep -l 'recovery: epoch .*the timeline on rank 0 of the survivors' "$SHARE"/rank*.log | head -n 1)
rejoin_printer=$(grep -l 'rejoin: epoch .*the timeline on rank 0 of the survivors' "$SHARE"/rank*.log | head -n 1)
joiner=$SHARE/rejoin$((kill_index * ranks)).log
link_MBps=$([ $loopback = 1 ] && echo 0 || echo "$rate" | awk '/gbit$/ { print $0 * 1000 / 8; next } /mbit$/ { print $0 / 8; next } { print 0 }')

# timeline_of KIND FILE: "time event: what" for each "KIND: event at T (+N ms): what" line FILE has
timeline_of() { sed -n "s/^$1: \\([a-z_ ]*\\) at \\([0-9.]*\\) (+[0-9]* ms)\\(.*\\)\$/\\2 \\1\\3/p" "$2"; }
# show: each "time event: what" line in ms after the kill
show() {
    while read -r t event; do
        name=${event%%:*}
        printf '  %-20s %+8d ms   %s\n' "$name" "$(ms_between "$t_kill" "$t")" "$(echo "${event#"$name"}" | sed 's/^: //' | cut -c1-160)"
    done
}
echo
echo "in-job recovery ($hosts hosts x $ranks ranks, HYBRID_SHARD, $where; gpt --recover; $kill_host lost at step $kill_step$([ $rejoin = 1 ] && echo ", started again at step $rejoin_step"):"
printf '  %-20s %+8d ms   %s\n' killed 0 "$([ "$fault" = silent ] && echo "the link of $kill_host cut (it sends nothing)" || echo "every process of $kill_host (SIGKILL)")"
if [ -n "$printer" ]; then
    timeline_of recovery "$printer" | show
    ms_of() { sed -n "s/^$1: $2 at \([0-9.]*\) .*/\1/p" "$3" | head -n 1; }
    d=$(ms_of recovery detected "$printer") a=$(ms_of recovery agreed "$printer") n=$(ms_of recovery 'next step done' "$printer")
    summary="summary: recover, fault $fault, detected +$(ms_between "$t_kill" "$d") ms, agreed +$(ms_between "$t_kill" "$a") ms, next step done +$(ms_between "$t_kill" "$n") ms after the kill; steps lost 0"
else
    echo "  no survivor printed a recovery's timeline"
    rc=1
fi
if [ $rejoin = 1 ]; then
    printf '  %-20s %+8d ms   %s\n' "rejoin started" "$(ms_between "$t_kill" "$t_rejoin")" "the ranks of $kill_host started again: gpt --rejoin"
    if [ -n "$rejoin_printer" ] && grep -q '^rejoin: first step done' "$joiner"; then
        { timeline_of rejoin "$joiner" | grep -E '^[0-9.]+ (requested|first part received|state received|first step done)'
          timeline_of rejoin "$rejoin_printer" | grep -v ' last step done$'; } |
            sort -n -k1,1 | show
        bytes=$(sed -n 's/^rejoin: state sent at .*: \([0-9]*\) bytes (.* in \([0-9.]*\) ms, \([0-9.]*\) MB\/s.*/\1 \2 \3/p' "$rejoin_printer")
        read -r b s_ms mbps <<<"$bytes"
        pause=$(sed -n 's/.*the survivors. pause \(-\{0,1\}[0-9]*\) ms.*/\1/p' "$rejoin_printer")
        # (each of the host's ranks receives its own shard's state: the host's link carries ranks x the bytes)
        link=$(awk -v m="$mbps" -v l="$link_MBps" -v g="$ranks" 'BEGIN { printf "the host'"'"'s %d ranks %.1f MB/s", g, g * m; if (l > 0) printf ", %.2f of the link'"'"'s %g MB/s", g * m / l, l }')
        bound=$(awk -v b="$b" -v l="$link_MBps" -v p="$pause" -v g="$ranks" 'BEGIN { if (l > 0) printf "the host'"'"'s bytes at the link rate take %.0f ms: pause / that = %.2f", g * b / l / 1000, p / (g * b / l / 1000) }')
        req=$(ms_of rejoin requested "$joiner") cu=$(ms_of rejoin 'caught up' "$rejoin_printer")
        first=$(sed -n 's/^rejoin: first step done at [0-9.]* (+\([0-9]*\) ms).*/\1/p' "$joiner")
        summary="$summary
summary: rejoin, requested +$(ms_between "$t_kill" "$req") ms, $b bytes a rank in $s_ms ms ($mbps MB/s; $link), survivors' pause $pause ms (${bound:-links not shaped}), caught up +$(ms_between "$t_kill" "$cu") ms after the kill; the rejoined host's first step $first ms after its start"
    else
        echo "  the rejoin did not complete: the ends of the rejoining ranks' logs:"
        for ((r = kill_index * ranks; r < (kill_index + 1) * ranks; r++)); do tail -n 6 "$SHARE/rejoin$r.log" | cut -c1-300 | sed 's/^/    /'; done
        rc=1
    fi
fi
if [ -n "$printer" ]; then
    echo
    echo "losses (rank 0 until the loss, then rank 0 of the survivors):"
    cat "$SHARE/rank0.log" "$printer" | grep -o '^step *[0-9]*/[0-9]*  loss [0-9.a-z]*' | sort -u -k2,2n
    grep -h '^replicas: ' "$printer"
    echo "$summary"
fi
if [ $rc != 0 ]; then
    echo "$ME: the survivors did not all reach the last step; the ends of their logs:" >&2
    for ((r = 0; r < world; r++)); do
        [ $((r / ranks)) = "$kill_index" ] && continue
        echo "  rank $r (exit status ${status[r]}):" >&2
        tail -n 4 "$SHARE/rank$r.log" | cut -c1-300 | sed 's/^/    /' >&2
    done
fi
exit $rc
