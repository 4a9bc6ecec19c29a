#!/bin/bash
# examples/bench_scale.sh - fsdp.h at hundreds of ranks on the multi-host bed (issue 27).
#
# Every "host" is a namespace of tests/multihost/hostbed.sh (own address, /dev/shm, /tmp); ranks are
# started in them with torchrun's variables (hostbed_ranks), R per host, a shared secret. On one
# machine all ranks share its cores: this measures counts and correctness, and times that are
# start-up bound, not bandwidth.
#   1. Forming a job, at each scale (default 16, 64, 128, 256 ranks: 2, 8, 16, 32 hosts of 8):
#      tests/multihost/mh_check.c with tiny messages (every collective, dtype and op up to 64
#      elements, bitwise against the documented order). Printed per scale: the time from the first
#      rank's start to the last rank's return from fsdp_comm_init_from_env (wall clock, the same in
#      every host), the whole run's time, the sockets each rank holds once joined (min-max), and
#      whether every rank passed.
#   2. The GPT at the largest scale (tiny model, a global batch of one sequence per rank): FULL_SHARD
#      and HYBRID_SHARD across the hosts against FULL_SHARD on as many ranks of one host (shared
#      memory): the losses of every step, compared at 1e-5 relative.
#   3. A rank killed (SIGKILL) while the GPT trains across the hosts: every other rank must fail
#      within its timeout (FSDP_TIMEOUT_MS, 20 s here) naming the lost rank or its host, and no host
#      may keep anything in /dev/shm.
# With --model, instead: the measurements behind the model of BENCHMARKS.md section 8. The
# hierarchical collectives (build/bench_comm --from-env: median of the slowest rank) on H hosts of
# --model-per-host ranks for each H of --model-hosts, every host's link shaped to --rate:
# all_gather, reduce_scatter and all_reduce of a 64 MiB buffer and all_reduce of 1 KiB. The model
# (per op: bytes over each host's link V, synchronising steps n, P = H * R ranks):
#     t = max(V / link, H * V / cpu) + n * step * P
#   all_gather, reduce_scatter: V = (H-1)/H * B, n = pipeline steps of 2 MiB of a block B/P (1
#   below 1 MiB); all_reduce of B >= 64 KiB: V = 2 (H-1)/H * B, n = 2 per 2 MiB of a rank's
#   piece B/R; all_reduce below: V = (H-1) * B among the first ranks, n = ceil(log2 H) where
#   H >= 4 and H * B <= 64 KiB (Bruck), else 1.
#   link: the rate a host's link gives TCP; cpu: what this machine's cores move through TCP in
#   all (every host shares them: the bed's own bound, absent where hosts have their own cores);
#   step: what a synchronising step costs per rank (all P processes must run on the 2 cores
#   before it ends). link, cpu and step are fitted to the 64 MiB rows, a separate step to the 1
#   KiB ones where the ranks outnumber twice the cores (below, ranks hardly wait for a core: such
#   rows are shown, not fitted); grid search, smallest worst relative error. Each row is printed
#   with the model's time and the error, then the parameters.
#
# Command (root, iproute2, OpenBLAS for the GPT), from anywhere:
#   make bench-scale                       # the issue's measurement (about 2 minutes on 2 cores)
#   bash examples/bench_scale.sh --scales 16,64 --no-gpt    # a quick look
#   bash examples/bench_scale.sh --model                    # section 8's model (about 3 minutes)
# Options: --scales N,... (ranks; multiples of --per-host) [16,64,128,256]; --per-host R [8];
#          --no-gpt; --no-kill; --timeout S per run [600]; --model; --model-hosts H,...
#          [2,4,8,16,32]; --model-per-host R [2]; --rate R (tc units) [2gbit].
#          Exit status 0 if everything passed.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
scales=16,64,128,256 per_host=8 do_gpt=1 do_kill=1 timeout=600 model=0 model_hosts=2,4,8,16,32 model_per_host=2 rate=2gbit
while [ $# -gt 0 ]; do
    case $1 in
    --scales) scales=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --no-gpt) do_gpt=0; shift ;;
    --no-kill) do_kill=0; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --model) model=1; shift ;;
    --model-hosts) model_hosts=$2; shift 2 ;;
    --model-per-host) model_per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "bench_scale: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case $(pwd -P) in /tmp | /tmp/* | /dev/shm | /dev/shm/*)
    echo "bench_scale: run it from a checkout outside /tmp and /dev/shm (every host mounts its own)" >&2; exit 2 ;;
esac
. tests/multihost/hostbed.sh
hostbed_require || exit $?
mkdir -p "$BUILD" || exit 1
cc -std=c99 -O2 -Wall -Wextra -Werror -I. tests/multihost/mh_check.c -o "$BUILD/mh_check" -lpthread -lm || exit 1
if [ $do_gpt = 1 ] || [ $do_kill = 1 ]; then make --no-print-directory "$BUILD/gpt" >/dev/null || exit 1; fi
BIN=$(cd "$BUILD" && pwd -P)
export FSDP_SECRET=bench-scale-secret-$$-$RANDOM
failed=0
layout_of() { local n=$(($1 / per_host)) l="" i; for ((i = 0; i < n; i++)); do l="$l${l:+,}$per_host"; done; echo "$l"; }

cpu_line="$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') (family $(grep -m1 'cpu family' /proc/cpuinfo |
    sed 's/.*: //') model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | sed 's/.*: //'))"

if [ $model = 1 ]; then
    make --no-print-directory "$BUILD/bench_comm" >/dev/null || exit 1
    echo "bench_scale --model: fsdp.h $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cpu_line, links $rate," \
        "$model_per_host ranks per host"
    IFS=, read -ra hs <<<"$model_hosts"
    top=0
    for h in "${hs[@]}"; do
        case $h in '' | *[!0-9]*) echo "bench_scale: bad host count '$h'" >&2; exit 2 ;; esac
        [ "$h" -ge 2 ] && [ "$h" -le 32 ] || { echo "bench_scale: --model-hosts: 2..32 hosts" >&2; exit 2; }
        [ "$h" -gt $top ] && top=$h
    done
    hostbed_up "$top" --rate "$rate" >/dev/null 2>&1 || { echo "bench_scale: the bed of $top hosts did not come up"; exit 1; }
    rows=$(mktemp)
    for h in "${hs[@]}"; do
        layout=$(per_host=$model_per_host layout_of $((h * model_per_host)))
        for run in "all_gather 64M 5" "reduce_scatter 64M 5" "all_reduce 64M 5" "all_reduce 1K 300"; do
            read -r op size iters <<<"$run"
            FSDP_SPIN=0 FSDP_TIMEOUT_MS=600000 hostbed_ranks --timeout "$timeout" "$layout" "$BIN/bench_comm" --from-env \
                --op "$op" --sizes "$size" --iters "$iters" --warmup 2 --csv >/dev/null 2>&1
            line=$(grep -E "^socket\+shm,[0-9]+,$op," "$HOSTBED_SHARE/rank0.log" | head -n 1)
            if [ -z "$line" ]; then
                echo "bench_scale: $h hosts, $op $size failed:" >&2; tail -n 3 "$HOSTBED_SHARE/rank0.log" >&2; failed=1; continue
            fi
            echo "$h $model_per_host $line" >>"$rows"
        done
    done
    hostbed_down
    rate_bps=$(echo "$rate" | awk '{ v = $0 + 0; u = tolower($0); sub(/^[0-9.]+/, "", u)
        m = u ~ /^gbit/ ? 1e9 : u ~ /^mbit/ ? 1e6 : u ~ /^kbit/ ? 1e3 : 1; print v * m }')
    awk -v nominal="$rate_bps" -v cores="$(nproc)" '
    function ceil_log2(h,  n, d) { n = 0; for (d = 1; d < h; d *= 2) n++; return n }
    function ceil_div(a, b) { return int((a + b - 1) / b) }
    # bytes over each host link gV, synchronising steps gN (pipeline steps of 2 MiB, rounds) of row i
    function shape(i,  H, R, B) { H = hh[i]; R = rr[i]; B = bb[i]
        if (op[i] == "all_reduce" && B < 65536) { gV = (H - 1) * B; gN = H >= 4 && H * B <= 65536 ? ceil_log2(H) : 1 }
        else if (op[i] == "all_reduce") { gV = 2 * (H - 1) / H * B; gN = B / R >= 1048576 ? 2 * ceil_div(B / R, 2097152) : 2 }
        else { gV = (H - 1) / H * B; gN = B / (H * R) >= 1048576 ? ceil_div(B / (H * R), 2097152) : 1 } }
    function predict(i, link, cpu, step,  a, b) { shape(i); a = gV / link; b = hh[i] * gV / cpu
        return (a > b ? a : b) + gN * step * hh[i] * rr[i] }
    # row i is fitted: 64 MiB rows always, small ones where ranks outnumber twice the cores (the
    # regime where a round costs the scheduling of every rank)
    function fitted(i) { return bb[i] >= 65536 || hh[i] * rr[i] > 2 * cores }
    function worst(large, link, cpu, step,  i, e, w) { w = 0
        for (i = 1; i <= n; i++) if ((bb[i] >= 65536) == large && fitted(i)) { e = predict(i, link, cpu, step) / t[i] - 1
            if (e < 0) e = -e; if (e > w) w = e }
        return w }
    { n++; hh[n] = $1; rr[n] = $2; split($3, f, ","); op[n] = f[3]; bb[n] = f[4]; t[n] = f[5] * 1e-6 }
    END {
        best = 1e9
        for (a = 0.80; a <= 1.0001; a += 0.01) for (k = 0; k <= 40; k++) for (j = 0; j <= 50; j++) {
            c = 5e8 * 10 ^ (k / 40); st = 1e-6 * 10 ^ (j / 20)
            w = worst(1, nominal / 8 * a, c, st); if (w < best) { best = w; link = nominal / 8 * a; cpu = c; step = st } }
        best2 = 1e9
        for (j = 0; j <= 80; j++) { st = 1e-7 * 10 ^ (j / 40); w = worst(0, link, cpu, st); if (w < best2) { best2 = w; small = st } }
        printf "%6s %6s %-15s %10s %6s %12s %12s %8s\n", "hosts", "ranks", "op", "bytes", "steps", "measured ms", "model ms", "error"
        for (i = 1; i <= n; i++) { p = predict(i, link, cpu, bb[i] >= 65536 ? step : small); shape(i)
            printf "%6d %6d %-15s %10d %6d %12.3f %12.3f %+7.1f%%%s\n", hh[i], hh[i] * rr[i], op[i], bb[i], gN, t[i] * 1e3, p * 1e3,
                (p / t[i] - 1) * 100, fitted(i) ? "" : "  (not fitted: ranks <= 2 x cores)" }
        printf "\nfitted: link %.2f Gbit/s (%.0f%% of %.2g), cpu %.2f GB/s in all, a step %.1f us per rank (64 MiB ops), a" \
            " round %.1f us per rank (1 KiB); worst error %.1f%% (64 MiB), %.1f%% (1 KiB)\n", link * 8e-9, link * 8 / nominal * 100,
            nominal, cpu * 1e-9, step * 1e6, small * 1e6, best * 100, best2 * 100
    }' "$rows"
    rm -f "$rows"
    exit $failed
fi

echo "bench_scale: fsdp.h $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cpu_line, $per_host ranks per host," \
    "links unshaped"
echo
printf '%6s %6s %14s %12s %16s %s\n' ranks hosts "formed in s" "run in s" "sockets/rank" result
largest=0
IFS=, read -ra list <<<"$scales"
for n in "${list[@]}"; do
    hosts=$((n / per_host))
    if [ $((hosts * per_host)) != "$n" ] || [ $hosts -lt 1 ] || [ $hosts -gt 32 ]; then
        echo "bench_scale: $n ranks is not 1..32 hosts of $per_host" >&2; failed=1; continue
    fi
    [ "$n" -gt $largest ] && largest=$n
    hostbed_up $hosts >/dev/null 2>&1 || { echo "bench_scale: the bed of $hosts hosts did not come up"; failed=1; continue; }
    layout=$(layout_of "$n")
    t0=$(date +%s.%N)
    MH_LAYOUT=$layout MH_OPS_ONLY=1 MH_MAX_COUNT=64 FSDP_TIMEOUT_MS=120000 \
        hostbed_ranks --timeout "$timeout" "$layout" "$BIN/mh_check" >/dev/null 2>&1
    rc=$?
    t1=$(date +%s.%N)
    stats=$(cat "$HOSTBED_SHARE"/rank*.log | awk '
        /init from .* \(wall clock\)/ { s = $6; e = $8; k = $11
            if (first == "" || s < first) first = s; if (last == "" || e > last) last = e
            if (lo == "" || k < lo) lo = k; if (hi == "" || k > hi) hi = k; joined++ }
        / checks, 0 failed/ { ok++ }
        END { printf "%.2f %s-%s %d %d", last - first, lo, hi, joined, ok }')
    read -r formed sockets joined ok <<<"$stats"
    result="pass"
    [ $rc = 0 ] && [ "$joined" = "$n" ] && [ "$ok" = "$n" ] || { result="FAIL (exit $rc, $joined joined, $ok passed)"; failed=1; }
    printf '%6d %6d %14s %12.2f %16s %s\n' "$n" "$hosts" "$formed" "$(echo "$t1 - $t0" | bc)" "$sockets" "$result"
    hostbed_down
done

gpt_args="--layers 2 --channels 32 --heads 2 --seq-len 16 --steps 6 --print-every 1 --ckpt none --sample 0 --lr 0.01"
# the losses rank 0 logged (--log: full precision), one per line
gpt_losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
if [ $do_gpt = 1 ] && [ $largest -gt 0 ]; then
    n=$largest hosts=$((largest / per_host)) layout=$(layout_of "$largest")
    echo
    echo "GPT ($gpt_args --batch $n): losses across $hosts hosts against $n ranks of one host"
    share=$(mktemp -d /var/tmp/bench_scale.XXXXXX)
    FSDP_TIMEOUT_MS=120000 "$BIN/gpt" --nproc "$n" $gpt_args --batch "$n" --strategy FULL_SHARD --log "$share/one.jsonl" \
        >"$share/one.log" 2>&1 || { echo "  one host: FAILED"; tail -3 "$share/one.log"; failed=1; }
    hostbed_up $hosts >/dev/null 2>&1 || { echo "bench_scale: the bed did not come up"; exit 1; }
    for strategy in FULL_SHARD HYBRID_SHARD; do
        t0=$(date +%s.%N)
        FSDP_TIMEOUT_MS=120000 hostbed_ranks --timeout "$timeout" "$layout" "$BIN/gpt" $gpt_args --batch "$n" \
            --strategy $strategy --log "$share/$strategy.jsonl" >/dev/null 2>&1
        rc=$?
        t1=$(date +%s.%N)
        verdict=$(paste <(gpt_losses "$share/one.jsonl") <(gpt_losses "$share/$strategy.jsonl") | awk '
            NF != 2 { bad = 1 } NF == 2 { n++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d; if (d > 1e-5) bad = 1 }
            END { printf "%s: %d steps, largest relative difference %.2g", (bad || n < 6) ? "DIFFERENT" : "same", n, worst }')
        printf '  %-12s %d hosts x %d: %s (exit %d, %.1f s)\n' $strategy "$hosts" "$per_host" "$verdict" $rc \
            "$(echo "$t1 - $t0" | bc)"
        [ $rc = 0 ] && [ "${verdict%%:*}" = same ] || failed=1
    done
    hostbed_down
    rm -rf "$share"
fi

if [ $do_kill = 1 ] && [ $largest -gt 0 ]; then
    n=$largest hosts=$((largest / per_host)) layout=$(layout_of "$largest") victim=$((largest / 2 + 3))
    echo
    echo "rank $victim killed (SIGKILL) while the GPT trains on $hosts hosts x $per_host (FSDP_TIMEOUT_MS=20000)"
    hostbed_up $hosts >/dev/null 2>&1 || { echo "bench_scale: the bed did not come up"; exit 1; }
    FSDP_TIMEOUT_MS=20000 hostbed_ranks --timeout 300 --no-wait "$layout" "$BIN/gpt" \
        ${gpt_args/--steps 6/--steps 100000} --batch "$n" >/dev/null 2>&1
    for ((i = 0; i < 300; i++)); do grep -q '^step ' "$HOSTBED_SHARE/rank0.log" 2>/dev/null && break; sleep 1; done
    host=$((victim / per_host))
    pid=$(hostbed_exec "h$host" sh -c "for p in /proc/[0-9]*; do tr '\\0' '\\n' 2>/dev/null <\$p/environ | grep -qx 'RANK=$victim' &&
        grep -q gpt \$p/comm && echo \${p#/proc/}; done | head -n 1")
    t0=$(date +%s%N)
    hostbed_exec "h$host" kill -9 "$pid"
    hostbed_ranks_wait 2>/dev/null
    t1=$(date +%s%N)
    statuses=" ${HOSTBED_RANK_STATUS[*]} "
    named=$(grep -l -E "rank $victim\b|10\.77\.0\.$((host + 1))\b" "$HOSTBED_SHARE"/rank*.log | wc -l)
    zero=$(echo "$statuses" | grep -o ' 0 ' | wc -l)
    left=0
    for ((h = 0; h < hosts; h++)); do [ -z "$(hostbed_exec "h$h" ls -A /dev/shm)" ] || left=$((left + 1)); done
    printf '  ranks ended %.1f s after the kill; %d of %d exited 0 (expected 0); %d logs name rank %d or its host;' \
        "$(echo "($t1 - $t0) / 1000000000" | bc -l)" "$zero" "$n" "$named" "$victim"
    printf ' hosts with something left in /dev/shm: %d\n' "$left"
    other=$(grep -L -E "rank $victim\b|10\.77\.0\.$((host + 1))\b" "$HOSTBED_SHARE"/rank*.log | grep -v "/rank$victim.log" | head -n 1)
    [ -n "$other" ] && echo "  e.g. $(basename "$other"), naming neither: $(grep -m1 -i 'fail\|error\|lost\|died' "$other" | cut -c1-300)"
    [ "$zero" = 0 ] && [ $(((t1 - t0) / 1000000)) -lt 60000 ] && [ "$left" = 0 ] || failed=1
    hostbed_down
fi
exit $failed
