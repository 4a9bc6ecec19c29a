#!/bin/bash
# tests/multihost/test_multihost.sh: fsdp.h across several hosts (make test-multihost).
#
# Builds "hosts" on this machine with tests/multihost/hostbed.sh (network + mount + UTS
# namespaces: own address, /dev/shm, /tmp and host name; root needed) and runs ranks in them:
#   - collectives bitwise equal to the documented reduction order at 2x2, 3x2, 2+1+3 and 2+1+3+2 ranks
#     per host (2x2 also with large ops in one pipeline step, FSDP_HIER_STEP_MIB=0, and with
#     ranks asking for different steps), over sockets (hierarchical) and over the MPI bridge
#     under mpirun, with splits of one host's ranks on shared memory (tests/multihost/mh_check.c);
#   - the GPT example, FULL_SHARD and HYBRID_SHARD across 2 hosts, with the losses of 4 ranks
#     on one host;
#   - torchrun (static and c10d rendezvous, 2 nodes x 2 ranks; tests/torchrun.py) and mpirun
#     (sockets and the MPI bridge) across hosts;
#   - faults: a link cut mid-op (every rank fails within its timeout naming the other host, also
#     a rank whose wait was for a local peer that waits on the link),
#     5% loss and 20 ms delay (still right), a host killed (the others fail, nothing left in
#     /dev/shm), a rank killed under torchrun --max_restarts 1 (the GPT with --resume auto
#     continues from its last checkpoint on the loss curve of a run never stopped);
#   - 128 ranks on 16 hosts (8 each): the job forms, tiny collectives are bitwise, and every rank
#     holds 15 sockets (one to its counterpart on each other host; also checked at 2+1+3).
# Prints one line per check, "tests/multihost/test_multihost.sh:0:<name>:PASS" or ":FAIL" (with
# the logs), and ends with "N passed, N failed". Where no bed can be built (not root, no
# namespaces) it says why and prints "0 passed, 0 failed". BUILD (default build) holds the
# binaries, built here if missing. Tears the bed down whatever happens.
set -u
cd "$(dirname "$0")/../.." || exit 1
TOP=$(pwd -P)
BUILD=${BUILD:-build}
# Every host mounts its own /tmp and /dev/shm: a checkout under either is invisible inside the
# hosts. Run from a copy under /var/tmp then (removed afterwards).
case $TOP in
/tmp | /tmp/* | /dev/shm | /dev/shm/*)
    case $BUILD in /tmp/* | /dev/shm/*) echo "$0: BUILD=$BUILD is invisible inside the hosts"; echo "0 passed, 1 failed"; exit 1 ;; esac
    copy=$(mktemp -d /var/tmp/fsdp-multihost.XXXXXX) || { echo "$0: cannot copy the checkout out of $TOP"; echo "0 passed, 1 failed"; exit 1; }
    cp -a "$TOP/." "$copy/" || { rm -rf "$copy"; echo "$0: cannot copy the checkout to $copy"; echo "0 passed, 1 failed"; exit 1; }
    echo "$0: the checkout $TOP is under /tmp or /dev/shm, which every host mounts its own: running from a copy in $copy"
    BUILD=$BUILD bash "$copy/tests/multihost/test_multihost.sh"
    rc=$?
    rm -rf "$copy"
    exit $rc
    ;;
esac
case $BUILD in /*) BIN=$BUILD ;; *) BIN=$TOP/$BUILD ;; esac
ME=tests/multihost/test_multihost.sh
passed=0
failed=0

. tests/multihost/hostbed.sh
if ! hostbed_require 2>/dev/null; then
    echo "$ME: skipped: ${HOSTBED_SKIP_REASON:-no test bed here}"
    echo "0 passed, 0 failed"
    exit 0
fi

mkdir -p "$BIN"
cc=${CC:-cc}
if ! $cc -std=c99 -O2 -Wall -Wextra -Werror -I. tests/multihost/mh_check.c -o "$BIN/mh_check" -lpthread -lm; then
    echo "$ME: cannot build mh_check"; echo "0 passed, 1 failed"; exit 1
fi
have_mpi=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 &&
    mpicc -std=c99 -O2 -Wall -Wextra -Werror -DFSDP_WITH_MPI -I. tests/multihost/mh_check.c -o "$BIN/mh_check_mpi" -lpthread -lm; then
    have_mpi=1
fi
have_gpt=0
make --no-print-directory "$BUILD/gpt" >/dev/null 2>&1 && have_gpt=1
have_torch=0
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 && have_torch=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export FSDP_SECRET=multihost-test-secret
LOG=$(mktemp -d)

# The rank logs of the last hostbed_ranks, concatenated.
rank_logs() { cat "$HOSTBED_SHARE"/rank*.log 2>/dev/null; }

# ranks_ok LOG: every rank of the last hostbed_ranks exited 0.
ranks_ok() {
    rank_logs >"$1"
    echo "exit statuses: ${HOSTBED_RANK_STATUS[*]}" >>"$1"
    for s in "${HOSTBED_RANK_STATUS[@]}"; do [ "$s" = 0 ] || return 1; done
}

# collectives LAYOUT: mh_check on sockets with ranks placed as LAYOUT ("2,1,3").
collectives() {
    MH_LAYOUT=$1 FSDP_TIMEOUT_MS=60000 hostbed_ranks --timeout 240 "$1" "$BIN/mh_check"
    ranks_ok "$LOG/coll.log" && grep -q 'two-level order' "$LOG/coll.log"
}

# sockets_at_most N LOG: every rank of the last run held at most N sockets once joined (what
# mh_check prints: its connections, no listener); the counts go to LOG.
sockets_at_most() {
    rank_logs | awk -v max="$1" '/ sockets$/ { n++; k = $(NF - 1); if (k > hi) hi = k; if (lo == "" || k < lo) lo = k }
        END { printf "sockets per rank: %s-%s over %d ranks (at most %d allowed)\n", lo, hi, n, max; exit (n == 0 || hi > max) }' >>"$2"
}

# The losses rank 0 printed, one per line.
losses() { grep -o 'loss [0-9.]*' "$1" | awk '{print $2}'; }

# same_losses A B: the same number of losses, equal within 2e-3 relative (the hosts change
# the order in which FULL_SHARD's gradients are summed).
same_losses() {
    paste <(losses "$1") <(losses "$2") | awk '
        NF != 2 { bad = 1 } NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 2e-3 * ($2 < 0 ? -$2 : $2) + 1e-4) bad = 1 }
        END { exit (bad || n < 3) }'
}

gpt_args="--layers 2 --channels 64 --heads 2 --seq-len 32 --batch 8 --steps 30 --print-every 10 --ckpt none --sample 0"

# gpt_across STRATEGY: the GPT on 2x2 and on 4 ranks of one host.
gpt_across() {
    FSDP_TIMEOUT_MS=60000 hostbed_ranks --timeout 240 2,2 "$BIN/gpt" $gpt_args --strategy "$1"
    ranks_ok "$LOG/gpt2.log" || return 1
    cp "$HOSTBED_SHARE/rank0.log" "$LOG/gpt_hosts.log"
    cp "$HOSTBED_SHARE/rank0.log" "$LOG/gpt_hosts_$1.log" # (gpt_elastic compares with the full run)
    FSDP_TIMEOUT_MS=60000 hostbed_ranks --timeout 240 4 "$BIN/gpt" $gpt_args --strategy "$1"
    ranks_ok "$LOG/gpt1.log" || return 1
    cp "$HOSTBED_SHARE/rank0.log" "$LOG/gpt_one.log"
    { echo "== 2 hosts:"; grep loss "$LOG/gpt_hosts.log"; echo "== 1 host:"; grep loss "$LOG/gpt_one.log"; } >"$LOG/gpt.log"
    same_losses "$LOG/gpt_hosts.log" "$LOG/gpt_one.log"
}

# torchrun_2_nodes ARGS...: tests/torchrun.py on h0 and h1, 2 ranks each, running mh_check.
torchrun_2_nodes() {
    local p0 p1 s0 s1
    hostbed_spawn --timeout 240 h0 env MH_LAYOUT=2,2 MH_OPS_ONLY=1 MH_MAX_COUNT=100003 /usr/bin/python3 tests/torchrun.py \
        --nnodes 2 --node_rank 0 --nproc_per_node 2 "$@" --no_python "$BIN/mh_check" >"$LOG/tr0.log" 2>&1
    p0=$HOSTBED_SPAWNED
    hostbed_spawn --timeout 240 h1 env MH_LAYOUT=2,2 MH_OPS_ONLY=1 MH_MAX_COUNT=100003 /usr/bin/python3 tests/torchrun.py \
        --nnodes 2 --node_rank 1 --nproc_per_node 2 "$@" --no_python "$BIN/mh_check" >"$LOG/tr1.log" 2>&1
    p1=$HOSTBED_SPAWNED
    wait "$p0"; s0=$?
    wait "$p1"; s1=$?
    cat "$LOG/tr0.log" "$LOG/tr1.log" >"$LOG/tr.log"
    [ $s0 = 0 ] && [ $s1 = 0 ] && [ "$(grep -c ' 0 failed' "$LOG/tr.log")" = 4 ]
}

# gpt_elastic: torchrun on h0 and h1 (static rendezvous, 2 ranks each, --max_restarts 1) runs the
# GPT with --resume auto, saving every 10 steps to a directory both hosts see; rank 1 (on h0)
# kills itself at step 15 of the first attempt (GPT_FAULT_AT_STEP). Both agents restart their
# workers, which continue from step 10 to the end; every loss rank 0 printed (before the fault
# and after the restart) is the one the run never stopped printed for that step (gpt_across
# full, same flags and layout).
gpt_elastic() {
    local i pids=() s ok=0 ckpt=$HOSTBED_SHARE/elastic_ckpt
    rm -rf "$ckpt"
    for i in 0 1; do
        hostbed_spawn --timeout 240 "h$i" env GPT_FAULT_AT_STEP=15 FSDP_TIMEOUT_MS=60000 /usr/bin/python3 tests/torchrun.py \
            --nnodes 2 --node_rank "$i" --nproc_per_node 2 --master_addr 10.77.0.1 --master_port 29680 --max_restarts 1 \
            --monitor_interval 1 --no_python "$BIN/gpt" $gpt_args --strategy FULL_SHARD --ckpt "$ckpt" --save-every 10 \
            --resume auto >"$LOG/el$i.log" 2>&1
        pids+=("$HOSTBED_SPAWNED")
    done
    for i in 0 1; do wait "${pids[$i]}"; s=$?; echo "torchrun on h$i: exit status $s" >>"$LOG/el$i.log"; [ $s = 0 ] || ok=1; done
    cat "$LOG/el0.log" "$LOG/el1.log" >"$LOG/elastic.log"
    grep -q '^rank 1: GPT_FAULT_AT_STEP=15: killing this rank' "$LOG/el0.log" &&
        grep -q "^no checkpoint in $ckpt yet: starting from scratch" "$LOG/el0.log" &&
        grep -q "^resuming from $ckpt at step 10 (restart 1)" "$LOG/el0.log" &&
        grep -q '^step    30/30 ' "$LOG/el0.log" || ok=1
    if [ -f "$LOG/gpt_hosts_full.log" ]; then # step -> loss of the run never stopped; each printed loss must be it
        awk 'NR == FNR { if (/^step .* loss /) ref[$2] = $4; next }
             /^step .* loss / && ($2 in ref) { n++; if (ref[$2] != $4) { print "step " $2 ": loss " $4 ", never stopped: " ref[$2]; bad = 1 } }
             END { exit bad || n < 4 }' "$LOG/gpt_hosts_full.log" "$LOG/el0.log" >>"$LOG/elastic.log" || ok=1
    fi
    return $ok
}

# mpirun_2x2 PROGRAM ENV...: mpirun from h0 over h0 and h1, 2 ranks each.
mpirun_2x2() {
    local prog=$1
    shift
    hostbed_exec --timeout 240 h0 mpirun $HOSTBED_MPI_ARGS --host fsdp-h0:2,fsdp-h1:2 -np 4 -x MH_LAYOUT=2,2 \
        -x MH_MAX_COUNT=100003 "$@" "$prog" >"$LOG/mpi.log" 2>&1 && [ "$(grep -c ' 0 failed' "$LOG/mpi.log")" = 4 ]
}

# A fault while 2x2 ranks all_reduce in a loop: every rank must exit 3 (the op failed) within
# FSDP_TIMEOUT_MS + margin of the fault, saying which host was lost; /dev/shm of the surviving
# host stays empty.
# cut-lagging: the same while all-gathering with rank 3 joining every op 300 ms late, and rank 0's
# timeout set to 2500 ms (fsdp_comm_set_timeout), so that rank 0 times out waiting for its local
# peer rank 1 before rank 1's own wait on the link (for rank 3) ends: rank 0 must name the host
# from what rank 1 wrote in their segment, after 2500 ms (its host's part waits as long).
fault() { # what (cut | cut-lagging | kill)
    local t0 t1 s ok=0 op=all_reduce lag= set=
    [ "$1" = cut-lagging ] && op=all_gather lag=3 set=0:2500
    MH_LOOP_OP=$op MH_LAG_RANK=$lag MH_SET_TIMEOUT=$set FSDP_TIMEOUT_MS=4000 MH_LOOP_MS=30000 hostbed_ranks --timeout 60 --no-wait 2,2 "$BIN/mh_check"
    sleep 3
    t0=$(date +%s%N)
    if [ "$1" = kill ]; then hostbed_kill h1; else hostbed_link h1 down; fi
    hostbed_ranks_wait
    t1=$(date +%s%N)
    [ "$1" = kill ] || hostbed_link h1 up
    rank_logs >"$LOG/fault.log"
    { echo "exit statuses: ${HOSTBED_RANK_STATUS[*]}"; echo "ranks ended $(((t1 - t0) / 1000000)) ms after the fault"
      echo "h0 /dev/shm:"; hostbed_exec h0 ls -A /dev/shm; } >>"$LOG/fault.log" 2>&1
    [ $(((t1 - t0) / 1000000)) -lt 15000 ] || ok=1
    [ "${HOSTBED_RANK_STATUS[0]}" = 3 ] && [ "${HOSTBED_RANK_STATUS[1]}" = 3 ] || ok=1
    if [ "$1" != kill ]; then # the far side fails too, and every rank names the other host's address: the
        # ranks waiting on the link do, and a local peer that timed out waiting for one of them (they may
        # time out together) names it from what that rank wrote in the host's segment, or adopts its failure
        [ "${HOSTBED_RANK_STATUS[2]}" = 3 ] && [ "${HOSTBED_RANK_STATUS[3]}" = 3 ] || ok=1
        for r in 0 1 2 3; do
            grep -h "rank $r: loop failed" "$HOSTBED_SHARE/rank$r.log" | grep -q "10\.77\.0\.$((r < 2 ? 2 : 1))" || ok=1
        done
        if [ "$1" = cut-lagging ]; then
            grep -h "rank 0: loop failed" "$HOSTBED_SHARE/rank0.log" |
                grep "waited 2500 ms for rank 1 " |
                grep -q "rank 1 is alive but did not join this collective: it is waiting for rank 3 of the world at 10\.77\.0\.2" || ok=1
        fi
    fi
    [ -z "$(hostbed_exec h0 ls -A /dev/shm)" ] || ok=1
    return $ok
}

hostbed_up 4 || { s=$?; echo "$ME: the test bed did not come up (status $s)"; echo "0 passed, 1 failed"; exit 1; }

collectives 2,2;   hostbed_report collectives_2x2_bitwise_in_the_documented_order $? "$LOG/coll.log"
# FSDP_HIER_STEP_MIB=0: large ops in one pipeline step instead of 2 MiB ones
FSDP_HIER_STEP_MIB=0 collectives 2,2; hostbed_report collectives_2x2_in_one_pipeline_step_bitwise $? "$LOG/coll.log"

# Ranks asking for different steps (one step, 3 MiB, a malformed value, unset) agree on one
# (steps that differ between peers would pair the wrong phases), and the malformed one is named.
mixed_steps() {
    cat >"$HOSTBED_SHARE/mixed_steps.sh" <<'EOF_'
#!/bin/sh
case $RANK in 0) export FSDP_HIER_STEP_MIB=0 ;; 1) export FSDP_HIER_STEP_MIB=3 ;; 2) export FSDP_HIER_STEP_MIB=bogus ;; esac
exec "$@"
EOF_
    chmod +x "$HOSTBED_SHARE/mixed_steps.sh"
    MH_LAYOUT=2,2 FSDP_TIMEOUT_MS=60000 hostbed_ranks --timeout 240 2,2 "$HOSTBED_SHARE/mixed_steps.sh" "$BIN/mh_check"
    ranks_ok "$LOG/coll.log" && grep -q "FSDP_HIER_STEP_MIB='bogus' is not an integer" "$LOG/coll.log"
}
mixed_steps; hostbed_report collectives_2x2_ranks_asking_for_different_pipeline_steps_agree $? "$LOG/coll.log"
collectives 2,2,2; hostbed_report collectives_3x2_bitwise_in_the_documented_order $? "$LOG/coll.log"
# (2,1,3: a rank links to the ranks of other hosts it exchanges blocks with, fsdp__hier_links: the
# lone rank of the middle host to all 5, the others to 2 or 3; a full mesh would be 5 everywhere)
collectives 2,1,3 && sockets_at_most 5 "$LOG/coll.log" && [ "$(rank_logs | grep -c ' [23] sockets$')" = 5 ]
hostbed_report collectives_2_1_3_bitwise_in_the_documented_order_over_links_to_counterparts $? "$LOG/coll.log"
# 4 hosts of 2, 1, 3, 2 ranks: small all_reduces in log2(H) rounds (Bruck) among the first ranks
MH_MAX_COUNT=16411 MH_OPS_ONLY=1 collectives 2,1,3,2
hostbed_report collectives_2_1_3_2_bitwise_with_small_all_reduces_in_log_rounds $? "$LOG/coll.log"
if [ $have_mpi = 1 ]; then
    mpirun_2x2 "$BIN/mh_check_mpi"; hostbed_report mpirun_mpi_bridge_2x2_same_bits_as_sockets $? "$LOG/mpi.log"
    mpirun_2x2 "$BIN/mh_check" -x FSDP_BACKEND=socket -x MASTER_ADDR=10.77.0.1 -x MASTER_PORT=29650 -x FSDP_SECRET
    hostbed_report mpirun_sockets_2x2 $? "$LOG/mpi.log"
else
    echo "$ME: mpirun tests skipped: mpicc/mpirun not installed (apt-get install libopenmpi-dev openmpi-bin)"
fi
if [ $have_torch = 1 ]; then
    torchrun_2_nodes --master_addr 10.77.0.1 --master_port 29660
    hostbed_report torchrun_static_2_nodes_x_2 $? "$LOG/tr.log"
    torchrun_2_nodes --rdzv_backend c10d --rdzv_endpoint 10.77.0.1:29670 --rdzv_id mh-c10d
    hostbed_report torchrun_c10d_2_nodes_x_2 $? "$LOG/tr.log"
else
    echo "$ME: torchrun tests skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
fi
if [ $have_gpt = 1 ]; then
    gpt_across full;   hostbed_report gpt_full_shard_across_2_hosts_has_the_losses_of_one_host $? "$LOG/gpt.log"
    gpt_across hybrid; hostbed_report gpt_hybrid_shard_across_2_hosts_has_the_losses_of_one_host $? "$LOG/gpt.log"
    if [ $have_torch = 1 ]; then
        gpt_elastic; hostbed_report elastic_restart_after_a_killed_rank_continues_the_loss_curve $? "$LOG/elastic.log"
    fi
else
    echo "$ME: GPT tests skipped: $BUILD/gpt does not build (apt-get install libopenblas-dev)"
fi
fault cut;  hostbed_report link_cut_mid_op_fails_every_rank_within_its_timeout_naming_the_other_host $? "$LOG/fault.log"
fault cut-lagging
hostbed_report link_cut_a_rank_waiting_for_a_local_peer_names_the_host_that_peer_waits_for $? "$LOG/fault.log"
fault kill; hostbed_report host_killed_mid_op_fails_the_others_and_leaves_no_shared_memory $? "$LOG/fault.log"
if hostbed_shape all --loss 5% --delay 20ms >"$LOG/shape.log" 2>&1; then
    MH_MAX_COUNT=16411 MH_OPS_ONLY=1 collectives 2,2
    hostbed_report collectives_right_with_5_percent_loss_and_20ms_delay $? "$LOG/coll.log"
    hostbed_shape all off >/dev/null 2>&1
else
    echo "$ME: loss/delay test skipped: $(tail -1 "$LOG/shape.log")"
fi

# 128 ranks on 16 hosts (issue 27): the rendezvous forms however many ranks dial at once (an
# acceptor drops handshakes beyond the 64 it runs at once; those ranks dial again), tiny
# collectives are bitwise in the documented order, and a rank holds a socket to its counterpart
# on each other host only (15; a full mesh would be 127).
hostbed_down
if hostbed_up 16 >"$LOG/bed16.log" 2>&1; then
    layout=8,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8
    MH_MAX_COUNT=64 MH_OPS_ONLY=1 collectives $layout && sockets_at_most 15 "$LOG/coll.log"
    hostbed_report collectives_128_ranks_on_16_hosts_form_a_job_and_are_bitwise_with_15_sockets_a_rank $? "$LOG/coll.log"
else
    hostbed_report collectives_128_ranks_on_16_hosts_form_a_job_and_are_bitwise_with_15_sockets_a_rank 1 "$LOG/bed16.log"
fi

hostbed_down
rm -rf "$LOG"
echo
echo "$passed passed, $failed failed"
[ $failed = 0 ]
