#!/bin/bash
# examples/bench_multihost.sh - fsdp.h's collectives across hosts: hierarchical vs flat vs Open MPI.
#
# What it measures: in the multi-host test bed (tests/multihost/hostbed.sh: each "host" is a network
# + mount + UTS + IPC namespace with its own address, /dev/shm and /tmp, joined by veths on a bridge,
# every host's egress shaped by tc tbf to --rate), for each layout (hosts x ranks per host; default
# 2x2 and 2x4) and size (the full buffer, default 64M), in one run:
#   flat   fsdp.h's socket backend with FSDP_HIERARCHICAL=0: every byte over TCP, also inside a host
#   hier   fsdp.h's default for ranks spanning hosts (transport socket+shm): shared memory inside a
#          host, sockets between hosts carrying only what each host must exchange
#   1/host fsdp.h's socket backend with one rank per host (H ranks, the same full buffer): the same
#          bytes cross the links as in hier, with no shared-memory half; the floor hier can reach
#          when its shared-memory work hides behind the network (on a machine whose cores all the
#          hosts share, TCP's own CPU cost can make this floor higher than the link's rate)
#   ompi   Open MPI's own collectives (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce, and
#          MPI_Bcast where bench_comm has broadcast) under mpirun across the same hosts (orted started
#          in the other hosts through the bed's rsh agent; --mca btl self,vader,tcp: vader inside a
#          host, tcp across)
# with build/bench_comm --from-env (ranks started in the hosts with torchrun's variables) and
# build/bench_comm_mpi --mpi-native, for all_gather, reduce_scatter, all_reduce (and broadcast if
# bench_comm --help lists it). Time = median over iterations of the slowest rank (bench_comm's).
# It prints one table: layout, op, bytes, flat ms, hier ms, 1/host ms, ompi ms, hier/flat speedup
# (flat ms / hier ms) and ompi/hier (ompi ms / hier ms; > 1: fsdp.h faster), then the goals below.
# With --gpt also the GPT's median ms/step (build/gpt, rank 0's median step after the first):
# HYBRID_SHARD on 2 hosts x 2 ranks (socket, launched from the environment as torchrun would)
# against FULL_SHARD on 4 ranks of one host (--nproc 4, shared memory), same model and batch, and
# HYBRID_SHARD on 4 ranks of one host (two replicas over shared memory): the strategy's own cost
# (a second reduction, twice the optimizer work per rank) apart from the link's.
#
# Goals (issue 10, "Measure", at 64 MiB and a 10 Gbit/s link):
#   hier >= 1.8x flat for all_gather, reduce_scatter and all_reduce at 2x2 (the link bound is 2x)
#   hier >= 3x flat at 2x4
#   hier >= 4x Open MPI (ompi/hier >= 4) at 2x2
#   GPT HYBRID_SHARD across 2 hosts within 10% of FULL_SHARD on 4 ranks of one host
#
# Command (root, iproute2; Open MPI for the ompi column; OpenBLAS for --gpt), from anywhere:
#   make bench-multihost                              # builds what it needs, runs with --gpt
#   bash examples/bench_multihost.sh [--gpt]          # the measurement of the issue
#   bash examples/bench_multihost.sh --sizes 1M --iters 3 --layouts 2x2   # a quick check
# Options (defaults in brackets):
#   --layouts L,...   HxR: H hosts, R ranks per host [2x2,2x4]
#   --rate R          link rate of every host (tc units: 10gbit, 1gbit, 100mbit), or off [10gbit]
#   --sizes S,...     full buffer sizes, K/M/G = 1024^n [64M]
#   --iters N         timed iterations per size [bench_comm's: min(200, max(5, 2 GiB / size))]
#   --warmup N        untimed iterations per size [3]
#   --no-mpi          leave out the Open MPI column
#   --fsdp-spin auto|0|1  FSDP_SPIN for fsdp.h's ranks; auto: 0 when a run has more ranks than the
#                     machine has cores [auto]. Like Open MPI's yield, for the same reason: each
#                     host sees all the machine's cores, and its ranks would spin while the other
#                     host's ranks need the core (fsdp.h's own rule counts only its host's ranks)
#   --ompi-yield auto|0|1  Open MPI's mpi_yield_when_idle; auto: 1 when a layout has more ranks than
#                     the machine has cores [auto]. Each host sees all the machine's cores, so Open
#                     MPI cannot tell that the hosts share them, and its busy-polling ranks then
#                     starve each other (measured here: 2x2 on 2 cores, 1 MiB all_gather 104 ms
#                     without yielding, 1.5 ms with)
#   --gpt             also the GPT comparison
#   --gpt-steps N     GPT steps per run [30]
#   --gpt-args "..."  extra gpt flags (model, batch) for both GPT runs [gpt's defaults]
#   --timeout S       bound on each run [1800]
#   --keep-logs DIR   copy every run's logs to DIR
# Environment: BUILD (binaries, default build; not under /tmp: the hosts have their own /tmp);
# FSDP_* variables exported to it reach every fsdp.h rank (e.g. FSDP_HIER_STEP_MIB=0).
# Exit status: 0 every run succeeded (the goals are reported, not enforced), 1 a run failed,
# 2 bad usage or a binary missing, 77 cannot run here (not root, no namespaces, no iproute2: the
# reason is printed). The bed is torn down however the script ends.
# The machine's cores are shared by every rank of every host: run it on an otherwise idle machine.
set -u
ME=examples/bench_multihost.sh
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
TOP=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD ;; *) BIN=$TOP/$BUILD ;; esac

layouts=2x2,2x4 rate=10gbit sizes=64M iters='' warmup='' use_mpi=1 gpt=0 gpt_steps=30 gpt_extra=''
run_timeout=1800 keep='' ompi_yield=auto fsdp_spin=auto
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "$ME: $*" >&2; echo "(--help for the options)" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --no-mpi) use_mpi=0; shift; continue ;;
    --gpt) gpt=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || die_usage "$1 needs a value"
    case $1 in
    --layouts) layouts=$2 ;;
    --rate) rate=$2 ;;
    --sizes) sizes=$2 ;;
    --iters) iters=$2 ;;
    --warmup) warmup=$2 ;;
    --gpt-steps) gpt_steps=$2 ;;
    --gpt-args) gpt_extra=$2 ;;
    --timeout) run_timeout=$2 ;;
    --keep-logs) keep=$2 ;;
    --ompi-yield) ompi_yield=$2 ;;
    --fsdp-spin) fsdp_spin=$2 ;;
    *) die_usage "unknown option '$1'" ;;
    esac
    shift 2
done
for v in "iters:$iters" "warmup:$warmup" "gpt-steps:$gpt_steps" "timeout:$run_timeout"; do
    case ${v#*:} in '') ;; *[!0-9]*) die_usage "--${v%%:*} takes a number, not '${v#*:}'" ;; esac
done
case $ompi_yield in auto | 0 | 1) ;; *) die_usage "--ompi-yield takes auto, 0 or 1" ;; esac
case $fsdp_spin in auto | 0 | 1) ;; *) die_usage "--fsdp-spin takes auto, 0 or 1" ;; esac
[ "$gpt_steps" -ge 2 ] || die_usage "--gpt-steps must be at least 2 (the first step is not timed)"
IFS=, read -ra LAYOUTS <<<"$layouts"
[ ${#LAYOUTS[@]} -gt 0 ] || die_usage "--layouts is empty"
nhosts=2
for l in "${LAYOUTS[@]}"; do
    [[ $l =~ ^([1-9][0-9]?)x([1-9][0-9]?)$ ]] || die_usage "bad layout '$l' (HxR: H hosts, R ranks per host, e.g. 2x4)"
    [ "${BASH_REMATCH[1]}" -ge 2 ] || die_usage "layout '$l': at least 2 hosts"
    [ "${BASH_REMATCH[1]}" -gt $nhosts ] && nhosts=${BASH_REMATCH[1]}
done
case $BIN in /tmp | /tmp/* | /dev/shm | /dev/shm/*) die_usage "BUILD=$BUILD: the hosts have their own /tmp and /dev/shm; build elsewhere" ;; esac

# --- can it run here? ------------------------------------------------------------------------------
. tests/multihost/hostbed.sh
if ! hostbed_require 2>/dev/null; then
    echo "$ME: cannot run: ${HOSTBED_SKIP_REASON:-no test bed here}." >&2
    echo "$ME: it builds simulated hosts from network/mount/UTS namespaces joined by veths and shapes" >&2
    echo "    their links with tc: run it as root on Linux with iproute2 (apt-get install iproute2)." >&2
    exit 77
fi

# --- binaries -------------------------------------------------------------------------------------
targets=("$BUILD/bench_comm")
[ $use_mpi = 1 ] && targets+=("$BUILD/bench_comm_mpi")
[ $gpt = 1 ] && targets+=("$BUILD/gpt")
for t in "${targets[@]}"; do
    if ! make --no-print-directory -s BUILD="$BUILD" "$t" >/dev/null 2>"$BIN.make.err"; then
        case $t in
        */bench_comm_mpi)
            echo "$ME: no Open MPI column: $t does not build ($(grep -m1 . "$BIN.make.err"))" >&2
            use_mpi=0 ;;
        *) echo "$ME: $t does not build:" >&2; cat "$BIN.make.err" >&2; rm -f "$BIN.make.err"; exit 2 ;;
        esac
    fi
done
rm -f "$BIN.make.err"
if [ $use_mpi = 1 ] && ! command -v mpirun >/dev/null 2>&1; then
    echo "$ME: no Open MPI column: mpirun not found (apt-get install openmpi-bin)" >&2
    use_mpi=0
fi

# the ops: bench_comm's, broadcast too if it has it
OPS=(all_gather reduce_scatter all_reduce)
"$BIN/bench_comm" --help 2>&1 | grep -q broadcast && OPS+=(broadcast)

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 FSDP_TIMEOUT_MS=${FSDP_TIMEOUT_MS:-600000}
export FSDP_SECRET=${FSDP_SECRET:-bench-multihost-$$-$RANDOM$RANDOM}
unset FSDP_HIERARCHICAL FSDP_BACKEND
export HOSTBED_MAX_SECONDS=${HOSTBED_MAX_SECONDS:-21600} # the bed's watchdog limit: a long run is fine

RES=$(mktemp -d) || exit 2
cleanup() { hostbed_down; rm -rf "$RES"; }
rate_args=()
[ "$rate" != off ] && rate_args=(--rate "$rate")
echo "$ME: building a bed of $nhosts hosts, links ${rate}" >&2
hostbed_up "$nhosts" "${rate_args[@]}"
s=$?
if [ $s -ne 0 ]; then
    rm -rf "$RES"
    [ $s = 77 ] && { echo "$ME: cannot run: ${HOSTBED_SKIP_REASON:-the bed cannot be built here}" >&2; exit 77; }
    echo "$ME: the test bed did not come up (status $s)" >&2
    exit 1
fi
# hostbed_up's traps, plus the results directory
trap 'cleanup' EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM
trap 'cleanup; trap - EXIT; exit 129' HUP

failed=0 ompi_yields=''
port=29500
bench_args=(--csv --sizes "$sizes")
[ -n "$iters" ] && bench_args+=(--iters "$iters")
[ -n "$warmup" ] && bench_args+=(--warmup "$warmup")
csv_lines() { grep -E '^[a-z+-]+,[0-9]+,[a-z_]+,[0-9]+,[0-9.]+,' "$@"; }
elapsed() { echo $((SECONDS - $1)); }
# spin_for RANKS: sets spin, FSDP_SPIN for a run of that many ranks ('': the library decides)
fsdp_spins='' spin=''
spin_for() {
    spin=$fsdp_spin
    if [ "$spin" = auto ]; then spin=''; [ "$1" -gt "$(nproc)" ] && spin=0; fi
    case "$fsdp_spins " in *" $1:"*) ;; *) fsdp_spins="$fsdp_spins $1:${spin:-auto}" ;; esac
}

# failed_run NAME LOG: reports a failed run with the end of its log
failed_run() {
    echo "$ME: $1 FAILED; the end of its log:" >&2
    tail -n 15 "$2" | sed 's/^/    /' >&2
    failed=1
}

# fsdp_run LAYOUT KIND(flat|hier) COUNTS [ops...]: bench_comm --from-env in the hosts; CSV rows to
# $RES/LAYOUT.KIND
fsdp_run() {
    local layout=$1 kind=$2 counts=$3 t=$SECONDS r k log=$RES/$1.$2.log op want
    shift 3
    spin_for $((${counts//,/+}))
    port=$((port + 1))
    if [ $# -eq 0 ]; then set -- all; fi
    for op in "$@"; do
        if [ $kind = flat ]; then
            FSDP_SPIN=$spin FSDP_HIERARCHICAL=0 hostbed_ranks --timeout "$run_timeout" --port $port "$counts" \
                "$BIN/bench_comm" --from-env "${bench_args[@]}" --op "$op"
        else
            FSDP_SPIN=$spin hostbed_ranks --timeout "$run_timeout" --port $port "$counts" \
                "$BIN/bench_comm" --from-env "${bench_args[@]}" --op "$op"
        fi
        r=$?
        for ((k = 0; k < ${#HOSTBED_RANK_STATUS[@]}; k++)); do
            echo "== rank $k (exit status ${HOSTBED_RANK_STATUS[k]})"
            cat "$HOSTBED_SHARE/rank$k.log"
        done >>"$log"
        [ $r = 0 ] || { failed_run "$layout $kind (--op $op)" "$log"; return 1; }
        csv_lines "$HOSTBED_SHARE/rank0.log" >>"$RES/$layout.$kind"
        port=$((port + 1))
    done
    want=$([ $kind = hier ] && echo socket+shm || echo socket)
    if [ -s "$RES/$layout.$kind" ] && awk -F, -v w="$want" '$1 != w { bad = 1 } END { exit !bad }' "$RES/$layout.$kind"; then
        echo "$ME: warning: $layout $kind ran on transport '$(cut -d, -f1 "$RES/$layout.$kind" | sort -u | tr '\n' ' ')', not $want" >&2
    fi
    echo "$ME: $layout $kind --op $* done ($(elapsed $t) s)" >&2
}

# ompi_run LAYOUT H R [ops...]: mpirun in h0 over H hosts, R ranks each; CSV rows to $RES/LAYOUT.ompi
ompi_run() {
    local layout=$1 H=$2 R=$3 t=$SECONDS hosts='' i log=$RES/$1.ompi.log op y=$ompi_yield
    shift 3
    if [ "$y" = auto ]; then y=0; [ $((H * R)) -gt "$(nproc)" ] && y=1; fi
    case "$ompi_yields " in *" $layout:"*) ;; *) ompi_yields="$ompi_yields $layout:$y" ;; esac
    if [ $# -eq 0 ]; then set -- all; fi
    for ((i = 0; i < H; i++)); do hosts=$hosts${hosts:+,}fsdp-h$i:$R; done
    for op in "$@"; do
        hostbed_exec --timeout "$run_timeout" h0 mpirun $HOSTBED_MPI_ARGS --host "$hosts" -np $((H * R)) \
            --mca btl self,vader,tcp --bind-to none --mca mpi_yield_when_idle "$y" \
            "$BIN/bench_comm_mpi" --backend mpi --mpi-native "${bench_args[@]}" --op "$op" >"$log.run" 2>&1
        local r=$?
        cat "$log.run" >>"$log"
        [ $r = 0 ] || { failed_run "$layout ompi (--op $op)" "$log.run"; return 1; }
        csv_lines "$log.run" >>"$RES/$layout.ompi"
    done
    echo "$ME: $layout ompi --op $* done ($(elapsed $t) s)" >&2
}

# the ops that "--op all" left out (e.g. broadcast, if bench_comm's "all" is only the first three)
missing_ops() { # FILE
    local op
    for op in "${OPS[@]}"; do
        [ -f "$1" ] && awk -F, -v o="$op" '$3 == o { f = 1 } END { exit !f }' "$1" || echo "$op"
    done
}

for l in "${LAYOUTS[@]}"; do
    H=${l%x*} R=${l#*x}
    counts=$(printf "$R,%.0s" $(seq "$H"))
    counts=${counts%,}
    fsdp_run "$l" flat "$counts" && { m=$(missing_ops "$RES/$l.flat"); [ -z "$m" ] || fsdp_run "$l" flat "$counts" $m; }
    fsdp_run "$l" hier "$counts" && { m=$(missing_ops "$RES/$l.hier"); [ -z "$m" ] || fsdp_run "$l" hier "$counts" $m; }
    if [ ! -f "$RES/${H}x1.link" ]; then # one rank per host: the same bytes across the links, no shm half
        ones=$(printf "1,%.0s" $(seq "$H"))
        fsdp_run "${H}x1" link "${ones%,}" && { m=$(missing_ops "$RES/${H}x1.link"); [ -z "$m" ] || fsdp_run "${H}x1" link "${ones%,}" $m; }
    fi
    [ -f "$RES/${H}x1.link" ] && cp "$RES/${H}x1.link" "$RES/$l.link"
    if [ $use_mpi = 1 ]; then
        ompi_run "$l" "$H" "$R" && {
            m=$(missing_ops "$RES/$l.ompi")
            # bench_comm_mpi --mpi-native may lack an op bench_comm has: ask only if its --help lists it
            for op in $m; do
                "$BIN/bench_comm_mpi" --help 2>&1 | grep -q "$op" && ompi_run "$l" "$H" "$R" "$op"
            done
        }
    fi
done

gpt_hybrid='' gpt_full='' gpt_hybrid1=''
if [ $gpt = 1 ]; then
    read -ra extra <<<"$gpt_extra"
    gpt_args=(--steps "$gpt_steps" --print-every "$gpt_steps" --ckpt none --sample 0 "${extra[@]}")
    gpt_median() { sed -n 's/.*(median step \([0-9.]*\) ms on rank 0).*/\1/p' "$1" | tail -n 1; }
    t=$SECONDS
    port=$((port + 1))
    spin_for 4
    FSDP_SPIN=$spin hostbed_ranks --timeout "$run_timeout" --port $port 2,2 "$BIN/gpt" "${gpt_args[@]}" --strategy HYBRID_SHARD
    r=$?
    for ((k = 0; k < 4; k++)); do echo "== rank $k"; cat "$HOSTBED_SHARE/rank$k.log"; done >"$RES/gpt_hybrid.log"
    if [ $r = 0 ]; then gpt_hybrid=$(gpt_median "$HOSTBED_SHARE/rank0.log"); else failed_run "GPT HYBRID_SHARD 2x2" "$RES/gpt_hybrid.log"; fi
    echo "$ME: GPT HYBRID_SHARD 2 hosts x 2 done ($(elapsed $t) s)" >&2
    t=$SECONDS
    FSDP_SPIN=$spin hostbed_exec --timeout "$run_timeout" h0 "$BIN/gpt" --nproc 4 "${gpt_args[@]}" --strategy FULL_SHARD >"$RES/gpt_full.log" 2>&1
    r=$?
    if [ $r = 0 ]; then gpt_full=$(gpt_median "$RES/gpt_full.log"); else failed_run "GPT FULL_SHARD 1x4" "$RES/gpt_full.log"; fi
    echo "$ME: GPT FULL_SHARD 1 host x 4 done ($(elapsed $t) s)" >&2
    t=$SECONDS
    FSDP_SPIN=$spin hostbed_exec --timeout "$run_timeout" h0 "$BIN/gpt" --nproc 4 "${gpt_args[@]}" --strategy HYBRID_SHARD >"$RES/gpt_hybrid1.log" 2>&1
    r=$?
    if [ $r = 0 ]; then gpt_hybrid1=$(gpt_median "$RES/gpt_hybrid1.log"); else failed_run "GPT HYBRID_SHARD 1x4" "$RES/gpt_hybrid1.log"; fi
    echo "$ME: GPT HYBRID_SHARD 1 host x 4 done ($(elapsed $t) s)" >&2
fi

if [ -n "$keep" ]; then
    mkdir -p "$keep" && cp -r "$RES"/. "$keep"/ && echo "$ME: logs in $keep" >&2
fi

# --- the table ------------------------------------------------------------------------------------
echo
echo "# bench_multihost: fsdp.h $(git describe --always --dirty 2>/dev/null || echo '?'), $(nproc) cores, links $rate"\
     "(tc tbf per host egress), sizes $sizes, iters ${iters:-auto}, warmup ${warmup:-3}"
echo "# time = median over iterations of the slowest rank; flat = socket with FSDP_HIERARCHICAL=0,"
echo "# hier = socket+shm (default), 1/host = socket with one rank per host (the same bytes across the links),"
echo "# ompi = Open MPI $(mpirun --version 2>/dev/null | sed -n '1s/.*) //p')" \
     "native collectives (btl self,vader,tcp${ompi_yields:+; mpi_yield_when_idle}$ompi_yields)"
echo "# FSDP_SPIN for fsdp.h's runs (ranks:value):$fsdp_spins"
{
    for l in "${LAYOUTS[@]}"; do
        for k in flat hier link ompi; do
            [ -f "$RES/$l.$k" ] && sed "s/^/$l,$k,/" "$RES/$l.$k"
        done
    done
} | awk -F, -v ops="${OPS[*]}" -v layouts="${LAYOUTS[*]}" '
    # layout,kind,backend,P,op,bytes,median_us,...
    { key = $1 SUBSEP $5 SUBSEP $6; ms[key, $2] = $7 / 1000
      if (!((key) in seen)) { seen[key] = 1; nb[$1, $5]++; b[$1, $5, nb[$1, $5]] = $6 } }
    function cell(v) { return v == "" ? sprintf("%9s", "-") : sprintf("%9.2f", v) }
    function ratio(a, c) { return (a == "" || c == "" || c == 0) ? sprintf("%9s", "-") : sprintf("%8.2fx", a / c) }
    END {
        printf "%-6s %-15s %10s %9s %9s %9s %9s %9s %9s\n", "layout", "op", "bytes", "flat ms", "hier ms", "1/host ms",
               "ompi ms", "hier/flat", "ompi/hier"
        n = split(layouts, L, " "); m = split(ops, O, " ")
        for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) for (s = 1; s <= nb[L[i], O[j]]; s++) {
            key = L[i] SUBSEP O[j] SUBSEP b[L[i], O[j], s]
            f = ((key, "flat") in ms) ? ms[key, "flat"] : ""
            h = ((key, "hier") in ms) ? ms[key, "hier"] : ""
            o = ((key, "ompi") in ms) ? ms[key, "ompi"] : ""
            k1 = ((key, "link") in ms) ? ms[key, "link"] : ""
            printf "%-6s %-15s %10s %s %s %s %s %s %s\n", L[i], O[j], b[L[i], O[j], s], cell(f), cell(h), cell(k1),
                   cell(o), ratio(f, h), ratio(o, h)
            if (O[j] == "broadcast") continue
            if (L[i] == "2x2" || L[i] == "2x4") {
                need = L[i] == "2x2" ? 1.8 : 3
                goal[++g] = sprintf("%s %s %s: hier/flat %s (goal >= %gx): %s", L[i], O[j], b[L[i], O[j], s],
                    f == "" || h == "" ? "-" : sprintf("%.2fx", f / h), need,
                    f == "" || h == "" ? "not measured" : f / h >= need ? "met" : "MISSED")
            }
            if (L[i] == "2x2")
                goal[++g] = sprintf("%s %s %s: ompi/hier %s (goal >= 4x): %s", L[i], O[j], b[L[i], O[j], s],
                    o == "" || h == "" ? "-" : sprintf("%.2fx", o / h),
                    o == "" || h == "" ? "not measured" : o / h >= 4 ? "met" : "MISSED")
        }
        if (g) { print ""; print "goals (issue 10; stated for 64 MiB at 10 Gbit/s):" }
        for (k = 1; k <= g; k++) print "  " goal[k]
    }'
if [ $gpt = 1 ]; then
    echo
    echo "GPT ms/step (median of steps 2..$gpt_steps on rank 0; gpt ${gpt_args[*]}):"
    printf '  HYBRID_SHARD, 2 hosts x 2 ranks (socket):     %s ms\n' "${gpt_hybrid:--}"
    printf '  FULL_SHARD,   1 host x 4 ranks (shm):         %s ms\n' "${gpt_full:--}"
    printf '  HYBRID_SHARD, 1 host x 4 ranks (shm):         %s ms\n' "${gpt_hybrid1:--}"
    if [ -n "$gpt_hybrid" ] && [ -n "$gpt_hybrid1" ]; then
        awk -v h="$gpt_hybrid" -v o="$gpt_hybrid1" 'BEGIN {
            printf "  hybrid across hosts / hybrid on one host %.3f (what the link costs)\n", h / o }'
    fi
    if [ -n "$gpt_hybrid" ] && [ -n "$gpt_full" ]; then
        awk -v h="$gpt_hybrid" -v f="$gpt_full" 'BEGIN {
            printf "  hybrid/full %.3f (goal <= 1.10, within 10%%): %s\n", h / f, h / f <= 1.10 ? "met" : "MISSED" }'
    else
        echo "  hybrid/full - (goal <= 1.10): not measured"
    fi
fi
[ $failed = 0 ] || echo "$ME: some runs failed (see above); their cells are '-'" >&2
exit $failed
