#!/bin/bash
# bench_shm_paths.sh - the shm backend's copy paths and waits, two builds side by side (issue 29).
#
#   examples/bench_shm_paths.sh BEFORE AFTER [ROUNDS]
#
# BEFORE and AFTER are bench_comm binaries (e.g. build/bench_comm of two commits: build one, copy
# it away, build the other). Every round runs, for each size and op, BEFORE then AFTER (interleaved,
# so that both see the same windows of this machine), P = 2 shm with malloc buffers, as each build's
# defaults say; then, for 1 MiB, both builds under `taskset -c 0` with FSDP_SPIN unset and =0, and
# unpinned. Prints the median over the rounds of each run's median time (us), the ratio, and every
# round's value. ROUNDS defaults to 5. Needs taskset (util-linux) and two CPUs.
set -u
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: $0 BEFORE_BENCH_COMM AFTER_BENCH_COMM [ROUNDS]" >&2
    exit 2
fi
before=$1 after=$2 rounds=${3:-5}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
line() { "$@" --csv 2>/dev/null | tail -n 1 | cut -d, -f5; } # median_us of the last (only) size

for ((r = 1; r <= rounds; r++)); do
    for size in 64K 128K 256K 512K 1M 4M; do
        for op in all_gather broadcast all_reduce reduce_scatter; do
            for which in before after; do
                bin=$before; [ $which = after ] && bin=$after
                echo "$op $size $which $(line "$bin" --backend shm --nproc 2 --op $op --sizes $size)" >>"$tmp/paths"
            done
        done
    done
    for op in all_gather reduce_scatter all_reduce; do
        for which in before after; do
            bin=$before; [ $which = after ] && bin=$after
            echo "$op $which pinned $(line taskset -c 0 "$bin" --op $op --sizes 1M --iters 50)" >>"$tmp/pinned"
            echo "$op $which spin0 $(FSDP_SPIN=0 line taskset -c 0 "$bin" --op $op --sizes 1M --iters 50)" >>"$tmp/pinned"
            echo "$op $which unpinned $(line "$bin" --op $op --sizes 1M --iters 200)" >>"$tmp/pinned"
        done
    done
done

# median KEY... over the file's last column, grouped by the other columns
medians() {
    awk '{ key = $1; for (i = 2; i < NF; i++) key = key " " $i; v[key] = v[key] " " $NF }
         END { for (k in v) { n = split(substr(v[k], 2), a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
                   if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
                   m = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2; print k, m, v[k] } }' "$1"
}
"$after" --op all_gather --sizes 64K --iters 1 2>/dev/null | grep '^# machine'
echo "# P = 2, shm, malloc buffers; median over $rounds interleaved rounds of each run's median (us)"
printf '%-15s %6s | %9s %9s %8s | %s\n' op bytes before after ratio "rounds: before; after"
medians "$tmp/paths" | sort -k1,1 -k2,2 >"$tmp/pm"
for op in all_gather broadcast all_reduce reduce_scatter; do
    for size in 64K 128K 256K 512K 1M 4M; do
        b=$(awk -v o=$op -v s=$size '$1 == o && $2 == s && $3 == "before"' "$tmp/pm")
        a=$(awk -v o=$op -v s=$size '$1 == o && $2 == s && $3 == "after"' "$tmp/pm")
        mb=$(echo "$b" | awk '{print $4}') ma=$(echo "$a" | awk '{print $4}')
        printf '%-15s %6s | %9.1f %9.1f %7.2fx | %s; %s\n' $op $size "$mb" "$ma" "$(awk -v x="$ma" -v y="$mb" 'BEGIN { print x / y }')" \
            "$(echo "$b" | cut -d' ' -f5-)" "$(echo "$a" | cut -d' ' -f5-)"
    done
done
echo
echo "# 1 MiB, P = 2: taskset -c 0 (FSDP_SPIN unset, and =0), and unpinned; median us"
printf '%-15s | %-26s | %-26s | %s\n' op "before: pinned spin0 ratio" "after: pinned spin0 ratio" "unpinned before / after"
medians "$tmp/pinned" >"$tmp/qm"
for op in all_gather reduce_scatter all_reduce; do
    get() { awk -v o=$op -v w=$1 -v m=$2 '$1 == o && $2 == w && $3 == m { print $4 }' "$tmp/qm"; }
    bp=$(get before pinned) bs=$(get before spin0) ap=$(get after pinned) as=$(get after spin0)
    printf '%-15s | %7.0f %7.0f %8.2fx | %7.0f %7.0f %8.2fx | %7.0f / %.0f\n' $op "$bp" "$bs" \
        "$(awk -v x="$bp" -v y="$bs" 'BEGIN { print x / y }')" "$ap" "$as" "$(awk -v x="$ap" -v y="$as" 'BEGIN { print x / y }')" \
        "$(get before unpinned)" "$(get after unpinned)"
done
