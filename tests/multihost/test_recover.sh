#!/bin/bash
# tests/multihost/test_recover.sh: in-job recovery across hosts (issue 38; make test-recover).
#
# The GPT (build/gpt --recover, HYBRID_SHARD, a replica per host) on 4 hosts x 2 ranks of the bed
# (tests/multihost/hostbed.sh; root), one host lost at a known step: the lost host's ranks stop
# themselves at the start of that step (GPT_FAULT_HOST, GPT_FAULT_SIGNAL=STOP) and the script then
# kills them (hostbed_kill: SIGKILL of every process in the host) or cuts the host's link, so that
# every run loses the host at the same point and runs with the same schedule can be compared bit
# for bit:
#   - h2 killed at each of the 10 steps (a GPT started anew each time: 2-3 s a run on the bed), and
#     h0 (the rendezvous's host) at step 4: the survivors reach step 10, every replica's master
#     weights bitwise equal (gpt's checksums, gathered from every replica), and each loss rank 0
#     printed equal to the run with no loss within 2e-3 relative (the survivors take the same global
#     batch, summed in another order);
#   - h2 killed at step 5 twice: the two runs' checksums and losses are equal;
#   - h2 made silent (its link cut at the switch: it sends nothing) at step 5: the survivors
#     detect it within detect_ms (5000) + 3000 ms of margin, not the op timeout (default), and
#     reach the last step;
#   - a 2|2 partition (h0,h1 | h2,h3: each host sends what is for the other pair to a hardware
#     address nobody has; hostbed_link can only cut a host from every other) at step 5: every rank
#     of both halves stops, naming its half as not a strict majority;
#   - recovery off (no --recover), h2 killed at step 5: every survivor ends (as today), naming
#     the lost host's address;
#   - rejoin (gpt --rejoin; every rank given --recovery-port): h2 killed at step 3 and its ranks
#     started again while the survivors' rank 0 is stopped at the start of step 5
#     (GPT_PAUSE_AT_STEP), let go once both connections wait at its listener (step 5's commit point
#     challenges them) and again at the start of step 6 once both hellos (the answers) wait there,
#     so that every run admits them after step 6: every rank (the rejoined ones too) reaches step 10, the 4 replicas bitwise
#     equal, the losses those of the run with no loss within 2e-3, the admission's timeline printed;
#     the same schedule run twice ends bitwise equal (checksums and losses); the rendezvous's host
#     h0 killed and rejoined likewise; a joiner with another secret refused (its fsdp_init fails
#     naming the rendezvous) while the survivors finish with 3 replicas. About 2 s a run on the bed.
# Prints one line per check, "tests/multihost/test_recover.sh:0:<name>:PASS" or ":FAIL" (with the
# logs), and ends with "N passed, N failed". Where no bed can be built (not root, no namespaces) it
# says why and prints "0 passed, 0 failed". BUILD (default build) holds the binaries; RECOVER_ONLY
# (an extended regular expression: kill, same, silent, partition, off, rejoin) runs only the checks whose
# names match it (the run with no loss always runs: the others compare with it).
set -u
cd "$(dirname "$0")/../.." || exit 1
TOP=$(pwd -P)
BUILD=${BUILD:-build}
case $TOP in /tmp | /tmp/* | /dev/shm | /dev/shm/*)
    echo "$0: the checkout $TOP is under /tmp or /dev/shm, which every host mounts its own: run it from elsewhere"
    echo "0 passed, 1 failed"; exit 1 ;;
esac
case $BUILD in /*) BIN=$BUILD ;; *) BIN=$TOP/$BUILD ;; esac
ME=tests/multihost/test_recover.sh
passed=0
failed=0

. tests/multihost/hostbed.sh
. tests/multihost/gpt_faults.sh
if ! hostbed_require 2>/dev/null; then
    echo "$ME: skipped: ${HOSTBED_SKIP_REASON:-no test bed here}"
    echo "0 passed, 0 failed"
    exit 0
fi
if ! make --no-print-directory BUILD="$BUILD" "$BUILD/gpt" >/dev/null 2>&1; then
    echo "$ME: skipped: $BUILD/gpt does not build (apt-get install libopenblas-dev)"
    echo "0 passed, 0 failed"
    exit 0
fi
export FSDP_SECRET=recover-test-secret OPENBLAS_NUM_THREADS=1
unset FSDP_TIMEOUT_MS FSDP_BACKEND FSDP_HIERARCHICAL # (the op timeout at its default: detection must not need it)
LOG=$(mktemp -d)

STEPS=10
gpt_args="--strategy hybrid --layers 2 --channels 64 --heads 2 --seq-len 32 --batch 24 --steps $STEPS --print-every 1
    --ckpt none --sample 0"

# run NAME HOST STEP FAULT [--no-recover] [GPT FLAGS...]: the GPT on 4 hosts x 2 with --recover;
# HOST's ranks stop at the start of STEP and FAULT (kill, silent; none: no fault) then loses it. The ranks' logs are concatenated in $LOG/NAME.log, rank 0 of the survivors' (the
# one that printed the timeline, or rank 0) copied to $LOG/NAME.rank0, the statuses in
# $LOG/NAME.status (one per rank), the time of the fault in $LOG/NAME.t.
run() {
    local name=$1 host=$2 step=$3 fault=$4 recover=--recover printer
    shift 4
    [ "${1:-}" = --no-recover ] && { recover=; shift; }
    if [ "$fault" = none ]; then
        hostbed_ranks --timeout 300 2,2,2,2 "$BIN/gpt" $gpt_args $recover "$@"
    else
        GPT_FAULT_HOST=${host#h} GPT_FAULT_AT_STEP=$step GPT_FAULT_SIGNAL=STOP \
            hostbed_ranks --timeout 300 --no-wait 2,2,2,2 "$BIN/gpt" $gpt_args $recover "$@"
        gpt_lose_host "$host" "$step" "$fault" >"$LOG/$name.t"
        gpt_wait_survivors "$host" "$fault"
    fi
    for ((r = 0; r < 8; r++)); do echo "${HOSTBED_RANK_STATUS[r]}"; done >"$LOG/$name.status"
    for ((r = 0; r < 8; r++)); do echo "== rank $r (exit status ${HOSTBED_RANK_STATUS[r]})"; cat "$HOSTBED_SHARE/rank$r.log"; done >"$LOG/$name.log"
    printer=$(grep -l 'the timeline on rank 0 of the survivors' "$HOSTBED_SHARE"/rank*.log | head -n 1)
    cp "${printer:-$HOSTBED_SHARE/rank0.log}" "$LOG/$name.rank0"
    # (what rank 0 printed before the loss, where rank 0 was on the lost host)
    grep '^step ' "$HOSTBED_SHARE/rank0.log" >>"$LOG/$name.rank0"
}

# The survivors of the lost host (all ranks of the job's 8 but its two) exited 0.
survivors_ok() { awk -v h="$1" 'NR <= 8 && NR - 1 != 2 * h && NR - 1 != 2 * h + 1 && $1 != 0 { bad = 1 } END { exit bad }' "$LOG/$2.status"; }

checksum() { sed -n 's/^replicas: the [0-9]* replicas. master weights are bitwise equal (checksum \([0-9a-f]*\)).*/\1/p' "$1"; }

# rank0_losses FILE: "step loss" per step rank 0 printed, in step order
rank0_losses() { grep -o '^step *[0-9]*/[0-9]*  loss [0-9.a-z]*' "$1" | awk '{ sub("/.*", "", $2); print $2, $4 }' | sort -un -k1,1; }

# close_losses A B: every step 1..STEPS has a loss in both, equal within 2e-3 relative
close_losses() {
    awk -v n="$STEPS" 'NR == FNR { ref[$1] = $2; next }
        ($1 in ref) { k++; d = $2 - ref[$1]; if (d < 0) d = -d
                      if (!($2 + 0 == $2) || d > 2e-3 * (ref[$1] < 0 ? -ref[$1] : ref[$1])) { print "step " $1 ": " $2 " vs " ref[$1]; bad = 1 } }
        END { if (k != n) print k " steps compared of " n; exit bad || k != n }' <(rank0_losses "$2") <(rank0_losses "$1")
}

# survived NAME HOST: the survivors reached the last step with replicas bitwise equal to each other
# and the losses of the run with no loss
survived() {
    local log=$LOG/$1.log
    {
        echo "exit statuses: $(tr '\n' ' ' <"$LOG/$1.status")"
        grep -h '^recovery: ' "$LOG/$1.rank0"
        grep -h '^replicas: ' "$LOG/$1.rank0"
    } >>"$log"
    survivors_ok "$2" "$1" &&
        grep -q "^step *$STEPS/$STEPS " "$LOG/$1.rank0" &&
        grep -q '^recovery: next step done at ' "$LOG/$1.rank0" &&
        [ -n "$(checksum "$LOG/$1.rank0")" ] &&
        close_losses "$LOG/$1.rank0" "$LOG/reference.rank0" >>"$log"
}

# detected_within NAME MS: the timeline's "detected" at most MS after the fault
detected_within() {
    local t d
    t=$(cat "$LOG/$1.t")
    d=$(sed -n 's/^recovery: detected at \([0-9.]*\) .*/\1/p' "$LOG/$1.rank0" | head -n 1)
    [ -n "$d" ] && awk -v t="$t" -v d="$d" -v max="$2" 'BEGIN { ms = (d - t) * 1000; printf "detected %.0f ms after the fault (at most %d)\n", ms, max; exit !(ms <= max) }' >>"$LOG/$1.log"
}

want() { [ -z "${RECOVER_ONLY:-}" ] || [[ $1 =~ $RECOVER_ONLY ]]; }

hostbed_up 4 || { s=$?; echo "$ME: the test bed did not come up (status $s)"; echo "0 passed, 1 failed"; exit 1; }

run reference h2 0 none
grep -q "^step *$STEPS/$STEPS " "$LOG/reference.rank0" && [ -n "$(checksum "$LOG/reference.rank0")" ]
hostbed_report recover_with_no_loss_trains_with_bitwise_equal_replicas $? "$LOG/reference.log"

for step in 1 2 3 4 5 6 7 8 9 10; do
    want "kill$step" || continue
    run "kill$step" h2 "$step" kill
    survived "kill$step" 2
    hostbed_report "recover_h2_killed_at_step_${step}_survivors_finish_replicas_bitwise_equal_losses_as_without_loss" $? "$LOG/kill$step.log"
done
if want kill4h0; then
    run kill4h0 h0 4 kill
    survived kill4h0 0
    hostbed_report recover_rendezvous_host_killed_at_step_4_survivors_finish_replicas_bitwise_equal $? "$LOG/kill4h0.log"
fi

if want same; then
    [ -f "$LOG/kill5.rank0" ] || run kill5 h2 5 kill
    run kill5again h2 5 kill
    survived kill5again 2 && [ "$(checksum "$LOG/kill5.rank0")" = "$(checksum "$LOG/kill5again.rank0")" ] &&
        diff <(rank0_losses "$LOG/kill5.rank0") <(rank0_losses "$LOG/kill5again.rank0") >>"$LOG/kill5again.log"
    s=$?
    echo "checksums: $(checksum "$LOG/kill5.rank0") and $(checksum "$LOG/kill5again.rank0")" >>"$LOG/kill5again.log"
    hostbed_report recover_same_failure_schedule_twice_ends_bitwise_equal $s "$LOG/kill5again.log"
fi

if want silent; then
    run silent5 h2 5 silent
    survived silent5 2 && detected_within silent5 8000
    hostbed_report recover_silent_host_detected_within_detect_ms_and_survived $? "$LOG/silent5.log"
fi

# 2|2 at step 5 (gpt_partition): h1's ranks stop at its start, the partition is made, and h1's
# ranks continue: both halves whole and alive; every rank must stop naming the partition.
partition() {
    local r ok=0
    GPT_FAULT_HOST=1 GPT_FAULT_AT_STEP=5 GPT_FAULT_SIGNAL=STOP \
        hostbed_ranks --timeout 120 --no-wait 2,2,2,2 "$BIN/gpt" $gpt_args --recover
    GPT_STEPS=$STEPS gpt_partition 5 || ok=1
    for ((r = 0; r < 8; r++)); do echo "== rank $r (exit status ${HOSTBED_RANK_STATUS[r]})"; tail -n 4 "$HOSTBED_SHARE/rank$r.log"; done >"$LOG/partition.log"
    return $ok
}
if want partition; then
    partition
    hostbed_report recover_2_2_partition_stops_both_halves_naming_it $? "$LOG/partition.log"
fi

if want off; then
    run off5 h2 5 kill --no-recover
    ok=0
    for r in 0 1 2 3 6 7; do
        [ "$(sed -n "$((r + 1))p" "$LOG/off5.status")" != 0 ] || ok=1
        sed -n "/^== rank $r /,/^== rank/p" "$LOG/off5.log" | grep -q "10\.77\.0\.3" || ok=1
    done
    grep -q '^recovery: ' "$LOG/off5.log" && ok=1
    hostbed_report recovery_off_a_killed_host_ends_every_survivor_naming_it $ok "$LOG/off5.log"
fi

# rejoin_run NAME HOST [SECRET]: the GPT with --recover --recovery-port; HOST's ranks stop at the
# start of step 3 and are killed; the survivors' rank 0 stops at the start of steps 5 and 6; HOST's
# ranks are started again with --rejoin (and FSDP_SECRET=SECRET if given), rank 0 let go at 5 once
# both connect to its listener and at 6 once both hellos wait there (gpt_rejoin). Logs as run's, the
# rejoined ranks' as $LOG/NAME.rejoin<r> (and their statuses as the last two lines of $LOG/NAME.status).
RPORT=31000
rejoin_run() {
    local name=$1 host=$2 secret=${3:-} h r rendezvous
    h=${host#h}
    rendezvous=$((h == 0 ? 1 : 0))
    GPT_FAULT_HOST=$h GPT_FAULT_AT_STEP=3 GPT_FAULT_SIGNAL=STOP GPT_PAUSE_AT_STEP=5 \
        hostbed_ranks --timeout 120 --no-wait 2,2,2,2 "$BIN/gpt" $gpt_args --recover --recovery-port $RPORT
    gpt_lose_host "$host" 3 kill >/dev/null
    FSDP_SECRET=${secret:-$FSDP_SECRET} gpt_rejoin "$host" $RPORT 5 "$LOG/$name.rejoin" \
        "$BIN/gpt" $gpt_args --recover --recovery-port $RPORT --rejoin >"$LOG/waits"
    gpt_wait_survivors "$host" kill
    for r in 0 1; do wait "${GPT_REJOIN_PIDS[r]}"; HOSTBED_RANK_STATUS[8 + r]=$?; done
    for ((r = 0; r < 10; r++)); do echo "${HOSTBED_RANK_STATUS[r]}"; done >"$LOG/$name.status"
    { for ((r = 0; r < 8; r++)); do echo "== rank $r (exit status ${HOSTBED_RANK_STATUS[r]})"; cat "$HOSTBED_SHARE/rank$r.log"; done
      for r in $((2 * h)) $((2 * h + 1)); do echo "== rejoined rank $r (exit status ${HOSTBED_RANK_STATUS[8 + r % 2]})"; cat "$LOG/$name.rejoin$r"; done
      cat "$LOG/waits"; rm -f "$LOG/waits"; } >"$LOG/$name.log"
    cp "$HOSTBED_SHARE/rank$((2 * rendezvous)).log" "$LOG/$name.rank0"
    grep '^step ' "$HOSTBED_SHARE/rank0.log" >>"$LOG/$name.rank0"
}

# rejoined NAME HOST: every rank (the rejoined ones too) exited 0, the 4 replicas bitwise equal at
# step 10, admitted after step 6 (the joiners' first step and the first with all replicas: 7), the
# losses as with no loss
rejoined() {
    local log=$LOG/$1.log
    {
        echo "exit statuses: $(tr '\n' ' ' <"$LOG/$1.status")"
        grep -h '^recovery: \|^rejoin: \|^replicas: ' "$LOG/$1.rank0" "$LOG/$1.rejoin$((2 * ${2#h}))"
    } >>"$log"
    survivors_ok "${2#h}" "$1" && [ "$(sed -n '9p;10p' "$LOG/$1.status" | tr -d '\n')" = 00 ] &&
        grep -q "^step *$STEPS/$STEPS " "$LOG/$1.rank0" &&
        grep -q '^replicas: the 4 replicas. master weights are bitwise equal' "$LOG/$1.rank0" &&
        grep -q '^rejoin: caught up at .*: step 7 done with all 4 replicas' "$LOG/$1.rank0" &&
        grep -q '^rejoin: first step done at .*: step 7$' "$LOG/$1.rejoin$((2 * ${2#h}))" &&
        close_losses "$LOG/$1.rank0" "$LOG/reference.rank0" >>"$log"
}

if want rejoin; then
    rejoin_run rejoin h2
    rejoined rejoin h2
    hostbed_report recover_h2_killed_and_rejoined_every_replica_bitwise_equal_at_the_end_losses_as_without_loss $? "$LOG/rejoin.log"
    rejoin_run rejoinagain h2
    rejoined rejoinagain h2 && [ "$(checksum "$LOG/rejoin.rank0")" = "$(checksum "$LOG/rejoinagain.rank0")" ] &&
        diff <(rank0_losses "$LOG/rejoin.rank0") <(rank0_losses "$LOG/rejoinagain.rank0") >>"$LOG/rejoinagain.log"
    s=$?
    echo "checksums: $(checksum "$LOG/rejoin.rank0") and $(checksum "$LOG/rejoinagain.rank0")" >>"$LOG/rejoinagain.log"
    hostbed_report recover_same_kill_and_rejoin_schedule_twice_ends_bitwise_equal $s "$LOG/rejoinagain.log"
    rejoin_run rejoinh0 h0
    rejoined rejoinh0 h0
    hostbed_report recover_rendezvous_host_h0_killed_and_rejoined_every_replica_bitwise_equal $? "$LOG/rejoinh0.log"
    rejoin_run rejoinsecret h2 another-secret
    survivors_ok 2 rejoinsecret && grep -q "^step *$STEPS/$STEPS " "$LOG/rejoinsecret.rank0" &&
        grep -q '^replicas: the 3 replicas. master weights are bitwise equal' "$LOG/rejoinsecret.rank0" &&
        [ "$(sed -n '9p' "$LOG/rejoinsecret.status")" != 0 ] && [ "$(sed -n '10p' "$LOG/rejoinsecret.status")" != 0 ] &&
        grep -q 'recovery.rejoin: rank 0 of the host: the rendezvous at .* did not admit this rank' "$LOG/rejoinsecret.rejoin4" &&
        grep -q "a rejoin from .* refused: its hello does not answer this connection's challenge with this job's key" "$LOG/rejoinsecret.rank0"
    hostbed_report recover_joiner_with_another_secret_refused_survivors_finish $? "$LOG/rejoinsecret.log"
fi

hostbed_down
rm -rf "$LOG"
echo
echo "$passed passed, $failed failed"
[ $failed = 0 ]
