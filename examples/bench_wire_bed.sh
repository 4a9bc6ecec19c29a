#!/bin/bash
# examples/bench_wire_bed.sh - the GPT across hosts with fewer bytes on the links (issue 37):
# quantized parameter gathers, quantized gradient reductions and resharding to the host, against
# bf16 and f32 FULL_SHARD, on the multi-host test bed (tests/multihost/hostbed.sh: each "host" a
# network + mount + UTS namespace, joined by veths, each host's egress shaped by tc to the rate).
#
# For each case (HOSTSxRANKS@RATE; default 4x2@1gbit, 4x2@10gbit, 8x2@1gbit) and row, build/gpt runs
# on the bed as torchrun would start it (FULL_SHARD; hierarchical: shared memory inside a host,
# TCP across), and one table per case prints:
#   fsdp B/step   bytes all ranks sent across hosts per step, counted by fsdp.h (fsdp_step_report,
#                 summed over the ranks by gpt; steps 2.., the first warms up)
#   link B/step   the same from the links: every host's eth0 tx_bytes, read when rank 0 has printed
#                 step 2 and when it prints the last, divided by the steps between (TCP/IP headers
#                 and ACKs included; also the loss's all-reduce, printing, polled every 50 ms)
#   ratio         fsdp B/step against bf16's
#   step ms       rank 0's median step (steps 2..)
#   tokens/s      the global batch's tokens / step
#   link ms       the busiest host's share of link B/step at the link's rate: the step's floor when
#                 nothing else costs
#   compute ms    the same GPT and ranks on one host over shared memory (bf16; no link): the nearest
#                 to compute-only this machine can run, since the hosts share its cores
#   vs bf16       bf16's step ms / this row's (> 1: faster)
#   vs roofline   step ms / max(compute ms, link ms) (1: as fast as the slower of the two allows)
#   cpu idle      the machine's CPU time left idle over the same steps as link B/step (/proc/stat:
#                 all hosts share its cores): near 0 means the step is bound by the CPU
#   runs          with --repeat N: each run's step ms (the columns before are medians over the runs)
#   link b/i/w    with --link-sample MS: over the same steps, the share of MS-long intervals in which
#                 a host's link was busy (sent >= half its rate), idle (< a fifth, no TCP socket
#                 holding a byte at its end: nothing to send) or waiting (< a fifth, bytes held:
#                 out and not yet acknowledged), in percent, the mean of the hosts
#                 (examples/link_sample.c)
# The rows (each from the bf16 one up adds to the row before; rows gpt cannot run are left out with
# the reason):
#   f32           --param-dtype f32
#   bf16          --param-dtype bf16
#   bf16+host     + --reshard-after-forward host (backward gathers inside the host)
#   int8          + --param-wire int8 (forward gathers move int8 codes)
#   int8+g8       + --grad-wire int8
#   int8+g4       --grad-wire int4 instead
#   int8+g4+ef    + --error-feedback
#   int8+g4+step  int8+g4 (no error feedback) + --overlap-step: the optimizer step on a thread of its
#                 own behind the next forward, the first gathers on the links meanwhile
#
# Command (root; iproute2, OpenBLAS), from anywhere; run it on an otherwise idle machine:
#   bash examples/bench_wire_bed.sh                           # issue 37's table (about 30 min)
#   bash examples/bench_wire_bed.sh --cases 2x2@1gbit --steps 4 --gpt-args "--layers 2 --channels 128 --heads 4"
# Options (defaults in brackets):
#   --cases C,...      HxR@RATE: H hosts, R ranks per host, tc rate [4x2@1gbit,4x2@10gbit,8x2@1gbit]
#   --rows R,...       a subset of the rows above [all]
#   --steps N          GPT steps per run, >= 4 [8]
#   --repeat N         run each row (and the compute-only run) N times, one after the other, and
#                      print medians over the runs [1]: on a shared VM the same build's step moves
#                      by 15% from run to run (BENCHMARKS section 9)
#   --batch-per-rank B sequences per rank; the global batch is B x ranks [1]
#   --gpt-args "..."   the model and anything else for every run [demo-big's model, shorter sequences:
#                      --layers 12 --channels 768 --heads 12 --seq-len 32]
#   --tcp-cc NAME      the hosts' TCP congestion control (one the kernel allows a network namespace:
#                      /proc/sys/net/ipv4/tcp_allowed_congestion_control; machine: the machine's
#                      own) [reno: loss-based like Linux's default cubic, which a namespace may not
#                      take here; on the bed's shaped links bbr misjudges the rate and slows the
#                      step, BENCHMARKS section 9]; the header says which ran
#   --link-sample MS   sample every host's link every MS ms (1..1000) for the link b/i/w column [0: off]
#   --timeout S        bound on each run [1800]
#   --keep-logs DIR    copy every run's logs to DIR
#   --trace DIR        every run writes fsdp.h's per-rank traces (FSDP_TRACE) to DIR/CASE.ROW
#                      (the compute-only run to DIR/CASE.compute); read them with build/trace_tool
#                      (summary, svg). Tracing costs a little time: leave it off for the table.
# Environment: BUILD (binaries, default build; not under /tmp: the hosts have their own /tmp).
# Exit status: 0 every run succeeded, 1 a run failed, 2 bad usage or a binary missing, 77 cannot run
# here (not root, no namespaces, no iproute2: the reason is printed). The bed is torn down however
# the script ends.
set -u
ME=examples/bench_wire_bed.sh
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
TOP=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD ;; *) BIN=$TOP/$BUILD ;; esac

cases=4x2@1gbit,4x2@10gbit,8x2@1gbit rows=all steps=8 bpr=1 run_timeout=1800 keep='' trace='' repeat=1 tcp_cc=reno link_ms=0
gpt_model='--layers 12 --channels 768 --heads 12 --seq-len 32'
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "$ME: $*" >&2; echo "(--help for the options)" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in -h | --help) usage; exit 0 ;; esac
    [ $# -ge 2 ] || die_usage "$1 needs a value"
    case $1 in
    --cases) cases=$2 ;;
    --rows) rows=$2 ;;
    --steps) steps=$2 ;;
    --repeat) repeat=$2 ;;
    --batch-per-rank) bpr=$2 ;;
    --gpt-args) gpt_model=$2 ;;
    --timeout) run_timeout=$2 ;;
    --tcp-cc) tcp_cc=$2 ;;
    --link-sample) link_ms=$2 ;;
    --keep-logs) keep=$2 ;;
    --trace) trace=$2 ;;
    *) die_usage "unknown option '$1'" ;;
    esac
    shift 2
done
for v in "steps:$steps" "batch-per-rank:$bpr" "timeout:$run_timeout" "repeat:$repeat" "link-sample:$link_ms"; do
    case ${v#*:} in '' | *[!0-9]*) die_usage "--${v%%:*} takes a number, not '${v#*:}'" ;; esac
done
[ "$steps" -ge 4 ] || die_usage "--steps must be at least 4 (the links are counted from step 2's end)"
[ "$bpr" -ge 1 ] || die_usage "--batch-per-rank must be at least 1"
{ [ "$repeat" -ge 1 ] && [ "$repeat" -le 20 ]; } || die_usage "--repeat must be from 1 to 20"
[ "$link_ms" -le 1000 ] || die_usage "--link-sample must be from 1 to 1000 ms (0: off)"
if [ -n "$keep" ]; then mkdir -p "$keep" || die_usage "--keep-logs: cannot make directory '$keep'"; fi
if [ -n "$trace" ]; then
    mkdir -p "$trace" || die_usage "--trace: cannot make directory '$trace'"
    trace=$(cd "$trace" && pwd)
    case $trace in /tmp | /tmp/* | /dev/shm | /dev/shm/*) die_usage "--trace $trace: the hosts have their own /tmp and /dev/shm; name a directory elsewhere" ;; esac
fi
IFS=, read -ra CASES <<<"$cases"
[ ${#CASES[@]} -gt 0 ] || die_usage "--cases is empty"
nhosts=2
for c in "${CASES[@]}"; do
    [[ $c =~ ^([1-9][0-9]?)x([1-9][0-9]?)@([0-9]+[kmg]?bit)$ ]] ||
        die_usage "bad case '$c' (HxR@RATE: H hosts, R ranks per host, a tc rate such as 1gbit)"
    [ "${BASH_REMATCH[1]}" -ge 2 ] || die_usage "case '$c': at least 2 hosts"
    [ "${BASH_REMATCH[1]}" -gt $nhosts ] && nhosts=${BASH_REMATCH[1]}
done
[ $nhosts -le 32 ] || die_usage "at most 32 hosts (the bed's limit)"
case $BIN in /tmp | /tmp/* | /dev/shm | /dev/shm/*) die_usage "BUILD=$BUILD: the hosts have their own /tmp and /dev/shm; build elsewhere" ;; esac

ROW_NAMES=(f32 bf16 bf16+host int8 int8+g8 int8+g4 int8+g4+ef int8+g4+step)
ROW_ARGS=("--param-dtype f32"
    "--param-dtype bf16"
    "--param-dtype bf16 --reshard-after-forward host"
    "--param-dtype bf16 --reshard-after-forward host --param-wire int8"
    "--param-dtype bf16 --reshard-after-forward host --param-wire int8 --grad-wire int8"
    "--param-dtype bf16 --reshard-after-forward host --param-wire int8 --grad-wire int4"
    "--param-dtype bf16 --reshard-after-forward host --param-wire int8 --grad-wire int4 --error-feedback"
    "--param-dtype bf16 --reshard-after-forward host --param-wire int8 --grad-wire int4 --overlap-step")
want_row() { [ "$rows" = all ] || [[ ",$rows," == *",$1,"* ]]; }
if [ "$rows" != all ]; then
    IFS=, read -ra asked <<<"$rows"
    for r in "${asked[@]}"; do [[ " ${ROW_NAMES[*]} " == *" $r "* ]] || die_usage "unknown row '$r' (rows: ${ROW_NAMES[*]})"; done
fi

# --- can it run here? ------------------------------------------------------------------------------
. tests/multihost/hostbed.sh
if ! hostbed_require 2>/dev/null; then
    echo "$ME: cannot run: ${HOSTBED_SKIP_REASON:-no test bed here}: run it as root on Linux with iproute2." >&2
    exit 77
fi
tools="gpt bench_train"
[ "$link_ms" -gt 0 ] && tools="$tools link_sample"
for t in $tools; do
    make --no-print-directory -s BUILD="$BUILD" "$BUILD/$t" >/dev/null 2>"$BIN.make.err" ||
        { echo "$ME: $BUILD/$t does not build:" >&2; cat "$BIN.make.err" >&2; rm -f "$BIN.make.err"; exit 2; }
done
rm -f "$BIN.make.err"
gpt_help=$("$BIN/gpt" --help 2>&1)
# row_missing ARGS: the first gpt flag of ARGS this gpt does not have ('' if it has them all)
row_missing() {
    local a
    for a in $1; do case $a in --*) grep -q -- "  $a" <<<"$gpt_help" || { echo "$a"; return; } ;; esac; done
}

export OPENBLAS_NUM_THREADS=1 FSDP_TIMEOUT_MS=${FSDP_TIMEOUT_MS:-600000} FSDP_SPIN=0
export FSDP_SECRET=${FSDP_SECRET:-bench-wire-bed-$$-$RANDOM$RANDOM}
unset FSDP_HIERARCHICAL FSDP_BACKEND FSDP_TRACE
export HOSTBED_MAX_SECONDS=${HOSTBED_MAX_SECONDS:-21600}
RES=$(mktemp -d) || exit 2
cleanup() { hostbed_down; rm -rf "$RES"; }
echo "$ME: building a bed of $nhosts hosts" >&2
[ "$tcp_cc" = machine ] && tcp_cc=''
hostbed_up "$nhosts" ${tcp_cc:+--tcp-cc "$tcp_cc"}
s=$?
if [ $s -ne 0 ]; then
    rm -rf "$RES"
    [ $s = 77 ] && { echo "$ME: cannot run: ${HOSTBED_SKIP_REASON:-the bed cannot be built here}" >&2; exit 77; }
    echo "$ME: the test bed did not come up (status $s)" >&2
    exit 1
fi
trap 'cleanup' EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM
trap 'cleanup; trap - EXIT; exit 129' HUP

failed=0 port=29600
# tx_bytes H: each of hosts h0..h(H-1)'s eth0 transmitted bytes, one per line
tx_bytes() {
    local i
    for ((i = 0; i < $1; i++)); do hostbed_exec h$i cat /sys/class/net/eth0/statistics/tx_bytes; done
}
# rate_bps RATE: a tc rate (1gbit, 500mbit, 100kbit) in bits per second
rate_bps() {
    local n=${1%bit} m=1
    case $n in *k) m=1000 ;; *m) m=1000000 ;; *g) m=1000000000 ;; esac
    echo $((${n%[kmg]} * m))
}
# nap S: sleeps S seconds without starting a process (read times out on a pipe only we hold)
exec {nap_fd}<> <(:)
nap() { read -r -t "$1" -u "$nap_fd" _; }
# wait_step N S: until rank 0 has printed step N (0), or its ranks ended or S seconds passed (1).
# Bash builtins only: a grep and a sleep 20 times a second took a fifth of a core from the ranks
# (perf, 2026-12-05), which the compute-only run, started without this wait, did not pay.
wait_step() {
    local deadline=$((SECONDS + $2)) r line lines=()
    while [ $SECONDS -lt $deadline ]; do
        [ -r "$HOSTBED_SHARE/rank0.log" ] && mapfile -t lines <"$HOSTBED_SHARE/rank0.log"
        for line in "${lines[@]}"; do [[ $line =~ ^step\ +$1/ ]] && return 0; done
        for r in "${HOSTBED_RANK_PIDS[@]}"; do kill -0 "$r" 2>/dev/null || return 1; done
        nap 0.05
    done
    return 1
}
# trace_to NAME: the runs started next trace to $trace/NAME (nothing without --trace)
trace_to() {
    [ -n "$trace" ] || return 0
    rm -rf "${trace:?}/$1" && mkdir -p "$trace/$1" && export FSDP_TRACE=$trace/$1
}
median_ms() { sed -n 's/.*(median step \([0-9.]*\) ms on rank 0).*/\1/p' "$1" | tail -n 1; }
fsdp_bytes() { sed -n 's/^bytes sent per step, all [0-9]* ranks: \([0-9]*\) across hosts.*/\1/p' "$1" | tail -n 1; }
failed_run() {
    echo "$ME: $1 FAILED; the end of its log:" >&2
    tail -n 15 "$2" | sed 's/^/    /' >&2
    failed=1
}

# cpu_ticks: the machine's CPU time so far, "idle total" in ticks (/proc/stat; iowait counts as idle)
cpu_ticks() { awk '/^cpu /{t=0; for (i=2; i<=9; i++) t+=$i; print $5+$6, t; exit}' /proc/stat; }
# median N...: the middle one (the mean of the two middle ones for an even count; integers stay integers)
median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        print (m == int(m)) ? sprintf("%d", m) : sprintf("%.1f", m) }'
}

# run_row H R RATE LOG ARGS...: one run of the row on the bed; sets ms (rank 0's median step), fb
# (fsdp.h's bytes), total and busiest (the links' bytes a step: all hosts, the busiest) and idle
# (percent of CPU time idle over the counted steps); status 1 if it failed
run_row() {
    local H=$1 R=$2 rate=$3 log=$4 counts i rc c0 c1 i0 t0 i1 t1 bits
    biw=''
    shift 4
    counts=$(printf "$R%.0s," $(seq "$H")); counts=${counts%,}
    port=$((port + 1))
    rm -f "$HOSTBED_SHARE"/rank*.log
    hostbed_ranks --no-wait --timeout "$run_timeout" --port $port "$counts" "$BIN/gpt" "$@"
    # the links' counters (and the CPU's) when rank 0 has printed step 2 and when it prints the
    # last: the steps between, without the rendezvous, the first step's warm-up and the held-out loss after
    local before=() after=() samplers=()
    wait_step 2 "$run_timeout" && c0=$(cpu_ticks) && mapfile -t before < <(tx_bytes "$H")
    if [ "$link_ms" -gt 0 ]; then
        bits=$(rate_bps "$rate")
        for ((i = 0; i < H; i++)); do
            hostbed_spawn --timeout "$run_timeout" "h$i" "$BIN/link_sample" eth0 "$bits" \
                --interval-ms "$link_ms" >"$RES/link.$i" 2>&1 && samplers+=("$HOSTBED_SPAWNED")
        done
    fi
    wait_step "$steps" "$run_timeout" && c1=$(cpu_ticks) && mapfile -t after < <(tx_bytes "$H")
    [ ${#samplers[@]} = 0 ] || { kill -TERM "${samplers[@]}" 2>/dev/null; wait "${samplers[@]}" 2>/dev/null; }
    hostbed_ranks_wait
    rc=$?
    [ ${#after[@]} = "$H" ] && [ ${#before[@]} = "$H" ] || rc=1
    for ((i = 0; i < H * R; i++)); do echo "== rank $i"; cat "$HOSTBED_SHARE/rank$i.log"; done >"$log"
    [ $rc = 0 ] || return 1
    busiest=0 total=0
    for ((i = 0; i < H; i++)); do
        local d=$(((after[i] - before[i]) / (steps - 2)))
        total=$((total + d)); [ $d -gt $busiest ] && busiest=$d
    done
    ms=$(median_ms "$HOSTBED_SHARE/rank0.log") fb=$(fsdp_bytes "$HOSTBED_SHARE/rank0.log")
    read -r i0 t0 <<<"$c0"; read -r i1 t1 <<<"$c1"
    idle=$(awk -v a="$((i1 - i0))" -v t="$((t1 - t0))" 'BEGIN { printf "%.0f", (t > 0 ? 100 * a / t : 0) }')
    [ "$link_ms" -gt 0 ] && biw=$(link_shares "$H")
    return 0
}

# link_shares H: "busy idle waiting", each the mean over the H hosts' link_sample lines (or "? ? ?")
link_shares() {
    local i
    for ((i = 0; i < $1; i++)); do cat "$RES/link.$i"; done | awk -v H="$1" '
        /^link_sample: .* busy [0-9]+% idle [0-9]+% waiting [0-9]+% / { for (k = 1; k <= NF; k++) v[$k] = $(k + 1)
            b += v["busy"]; i += v["idle"]; w += v["waiting"]; n++ }
        END { if (n == H) printf "%.0f %.0f %.0f", b / n, i / n, w / n; else print "? ? ?" }'
}

# run_case H R RATE: prints the case's table
run_case() {
    local H=$1 R=$2 rate=$3 P=$(($1 * $2)) k name args miss log bps compute='' bf16_ms='' bf16_bytes='' t rep
    local runs_ms all_ms all_bus all_tot all_idle all_b all_i all_w shares comps=()
    read -ra model <<<"$gpt_model"
    local common=(--steps "$steps" --print-every 1 --ckpt none --sample 0 --batch $((bpr * P)) "${model[@]}")
    bps=$(rate_bps "$rate")
    hostbed_shape all off >/dev/null 2>&1
    t=$SECONDS
    trace_to "${H}x${R}@$rate.compute"
    for ((rep = 1; rep <= repeat; rep++)); do
        hostbed_exec --timeout "$run_timeout" h0 "$BIN/gpt" --nproc "$P" "${common[@]}" --param-dtype bf16 >"$RES/compute.log" 2>&1 &&
            comps+=("$(median_ms "$RES/compute.log")") || failed_run "compute-only (one host, $P ranks)" "$RES/compute.log"
    done
    [ ${#comps[@]} -gt 0 ] && compute=$(median "${comps[@]}")
    echo "$ME: ${H}x$R: compute-only run done ($((SECONDS - t)) s${comps[1]:+; runs: ${comps[*]} ms})" >&2
    [ -n "$keep" ] && cp "$RES/compute.log" "$keep/${H}x${R}@$rate.compute.log"
    hostbed_shape all --rate "$rate" || { echo "$ME: cannot shape the links to $rate" >&2; failed=1; return; }
    echo
    echo "${H} hosts x $R ranks, links $rate (gpt ${common[*]}):"
    printf '%-12s %12s %12s %7s %9s %9s %9s %10s %8s %11s %8s%s\n' row "fsdp B/step" "link B/step" ratio "step ms" tokens/s \
        "link ms" "compute ms" "vs bf16" "vs roofline" "cpu idle" "$([ "$link_ms" -gt 0 ] && echo "  link b/i/w")$([ "$repeat" -gt 1 ] && echo "  runs (step ms)")"
    for ((k = 0; k < ${#ROW_NAMES[@]}; k++)); do
        name=${ROW_NAMES[$k]} args=${ROW_ARGS[$k]}
        want_row "$name" || continue
        miss=$(row_missing "$args")
        if [ -n "$miss" ]; then printf '%-12s (left out: this gpt has no %s)\n' "$name" "$miss"; continue; fi
        all_ms=() all_bus=() all_tot=() all_idle=() all_b=() all_i=() all_w=()
        t=$SECONDS
        trace_to "${H}x${R}@$rate.$name"
        for ((rep = 1; rep <= repeat; rep++)); do
            log=$RES/${H}x$R.$name.$rep.log
            # shellcheck disable=SC2086
            if ! run_row "$H" "$R" "$rate" "$log" "${common[@]}" $args; then
                failed_run "${H}x$R@$rate $name (run $rep)" "$log"
                continue
            fi
            [ -n "$keep" ] && cp "$log" "$keep/${H}x${R}@$rate.$name$([ "$repeat" -gt 1 ] && echo ".$rep").log"
            all_ms+=("$ms") all_bus+=("$busiest") all_tot+=("$total") all_idle+=("$idle")
            if [[ $biw =~ ^([0-9]+)\ ([0-9]+)\ ([0-9]+)$ ]]; then
                all_b+=("${BASH_REMATCH[1]}") all_i+=("${BASH_REMATCH[2]}") all_w+=("${BASH_REMATCH[3]}")
            fi
        done
        echo "$ME: ${H}x$R@$rate $name done ($((SECONDS - t)) s)" >&2
        if [ ${#all_ms[@]} = 0 ]; then printf '%-12s FAILED\n' "$name"; continue; fi
        ms=$(median "${all_ms[@]}") busiest=$(median "${all_bus[@]}") total=$(median "${all_tot[@]}") idle=$(median "${all_idle[@]}")
        [ "$name" = bf16 ] && bf16_ms=$ms bf16_bytes=$fb
        runs_ms='' shares=''
        if [ "$link_ms" -gt 0 ]; then
            shares=-
            [ ${#all_b[@]} -gt 0 ] && shares="$(median "${all_b[@]}")/$(median "${all_i[@]}")/$(median "${all_w[@]}")"
            shares="  $(printf '%10s' "$shares")"
        fi
        [ "$repeat" -gt 1 ] && runs_ms="  ${all_ms[*]}"
        runs_ms=$shares$runs_ms
        awk -v n="$name" -v fb="${fb:-0}" -v tot="$total" -v bus="$busiest" -v st=1 -v ms="${ms:-0}" \
            -v tok=$((bpr * P)) -v model="$gpt_model" -v bps="$bps" -v comp="${compute:-0}" -v b16="${bf16_ms:-0}" \
            -v b16b="${bf16_bytes:-0}" -v idle="$idle" -v runs="$runs_ms" 'BEGIN {
            seq = 64; k = split(model, a, " "); for (i = 1; i < k; i++) if (a[i] == "--seq-len") seq = a[i + 1]
            link_ms = bus / st * 8 / bps * 1e3; roof = (comp > link_ms) ? comp : link_ms
            ratio = (b16b > 0) ? sprintf("%.3f", fb / b16b) : "-"
            tps = (ms > 0) ? tok * seq / (ms / 1e3) : 0
            vs = (b16 > 0 && ms > 0) ? sprintf("%.2fx", b16 / ms) : "-"
            vr = (roof > 0) ? sprintf("%.2f", ms / roof) : "-"
            printf "%-12s %12.0f %12.0f %7s %9.1f %9.0f %9.1f %10.1f %8s %11s %7s%%%s\n", n, fb, tot / st, ratio, ms, tps,
                link_ms, comp, vs, vr, idle, runs }'
    done
}

echo "$ME: $("$BIN/bench_train" --machine)"
echo "$ME: fsdp.h $(git -C "$TOP" log -1 --format=%h 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC'); the hosts' TCP congestion control: $(hostbed_tcp_cc h0)"
for c in "${CASES[@]}"; do
    [[ $c =~ ^([0-9]+)x([0-9]+)@(.*)$ ]]
    run_case "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
done
[ $failed = 0 ] || { echo "$ME: some runs failed (above)" >&2; exit 1; }
exit 0
