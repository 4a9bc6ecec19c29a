#!/bin/sh
# Runs the given test programs from $BUILD, then the checks that are not Unity programs (the
# header compiled as C99/C11/C++, include-order rules, the MPI bridge under mpirun), and ends
# with the line CI reads: "N passed, N failed".
BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD ;; *) BIN=./$BUILD ;; esac
passed=0
failed=0
log=$(mktemp)
timings=$(mktemp) # one line per program and check: wall seconds, CPU seconds, name
trap 'rm -f "$log" "$timings" "$timings.cpu0" "$timings.cpu1"' EXIT

# Where the time goes: wall and CPU seconds (user + system of the waited-for children, which
# include a program's forked ranks) around each program and check: the shell's `times` builtin,
# redirected to a file, never in a command substitution (a subshell, whose children are none).
timer_start() { timer_wall=$(date +%s.%N); times >"$timings.cpu0"; }
timer_stop() { # $1 = name: prints nothing, records "wall cpu name" in $timings
    times >"$timings.cpu1"
    cat "$timings.cpu0" "$timings.cpu1" | awk -v w0="$timer_wall" -v w1="$(date +%s.%N)" -v name="$1" '
        function seconds(t) { split(t, ms, "m"); return ms[1] * 60 + ms[2] }
        NR == 2 || NR == 4 { cpu[NR] = seconds($1) + seconds($2) }
        END { printf "%.1f %.1f %s\n", w1 - w0, cpu[4] - cpu[2], name }' >>"$timings"
}
timed() { # name, command...: runs the command, records its time
    timed_name=$1
    shift
    timer_start
    "$@"
    timed_status=$?
    timer_stop "$timed_name"
    return $timed_status
}
last_timing() { tail -n 1 "$timings" | awk '{ printf "%s s wall, %s s CPU", $1, $2 }'; }

count_unity() { # $1 = name, output in $log, $2 = exit status
    summary=$(grep -E '^[0-9]+ Tests [0-9]+ Failures [0-9]+ Ignored' "$log" | tail -n 1)
    if [ -z "$summary" ]; then
        echo "$1: no Unity summary (exit status $2): the program crashed or hung"
        failed=$((failed + 1))
        return
    fi
    name=$1 status=$2
    set -- $summary
    passed=$((passed + $1 - $3 - $5))
    failed=$((failed + $3))
    if [ "$status" -ne 0 ] && [ "$3" -eq 0 ]; then # e.g. another MPI rank failed, or a crash at exit
        echo "$name: exit status $status although its summary reports no failure"
        failed=$((failed + 1))
    fi
}

for t in "$@"; do
    echo "== $t"
    timer_start
    timeout 600 "$BIN/$t" >"$log" 2>&1
    status=$?
    timer_stop "$t"
    cat "$log"
    count_unity "$t" "$status"
    echo "($t: $(last_timing))"
done

check() { # name, command...
    name=$1
    shift
    timer_start
    "$@" >"$log" 2>&1
    check_status=$?
    timer_stop "$name"
    if [ "$check_status" -eq 0 ]; then
        echo "tests/run.sh:0:$name:PASS"
        passed=$((passed + 1))
    else
        echo "tests/run.sh:0:$name:FAIL"
        sed 's/^/    /' "$log" | head -20
        failed=$((failed + 1))
    fi
}

if [ -z "$NO_EXTRA_CHECKS" ]; then
    echo "== header and build checks"
    # fsdp.h's documentation against its code: environment variables, configuration macros,
    # table of contents and section markers (tests/check_docs.sh), one check per property
    for property in env_vars_in_top_comment fsdp_env_vars_in_readme config_macros_in_top_comment toc_matches_markers \
        one_marker_style; do
        check docs.$property sh tests/check_docs.sh $property
    done
    # README.md stays within 24,576 bytes: what does not fit goes to examples/PORTING.md,
    # BENCHMARKS.md or fsdp.h's comments, and README links there (issue 36)
    check docs.readme_at_most_24576_bytes sh -c 'size=$(wc -c <README.md); echo "README.md: $size bytes (at most 24576)"; [ "$size" -le 24576 ]'
    # README's complete program (the C block after its "<!-- complete program" line) compiles
    # warning-free as printed, runs its 4 ranks and meets its own test of success (issue 36)
    readme_program() {
        rp_dir=$(mktemp -d) || return 1
        awk '/^<!-- complete program/ { found = 1; next } found && /^```c$/ { inside = 1; next }
             inside && /^```$/ { exit } inside { print }' README.md >"$rp_dir/train.c"
        if [ ! -s "$rp_dir/train.c" ]; then
            echo "README.md: no C block after a line '<!-- complete program ...'"
            rm -rf "$rp_dir"
            return 1
        fi
        ${CC:-cc} -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I"$PWD" "$rp_dir/train.c" -o "$rp_dir/train" -lpthread -lm &&
            (cd "$rp_dir" && timeout 120 ./train) && [ -s "$rp_dir/net.safetensors" ]
        rp_status=$?
        rm -rf "$rp_dir"
        return $rp_status
    }
    check readme.complete_program_compiles_and_runs readme_program
    CC=${CC:-cc}
    CXX=${CXX:-c++}
    tmp=$(mktemp -d)
    printf '#define FSDP_IMPLEMENTATION\n#include "fsdp.h"\nint main(void) { return fsdp_version_string()[0] == 0; }\n' >"$tmp/first.c"
    printf '#include <stdio.h>\n#define FSDP_IMPLEMENTATION\n#include "fsdp.h"\nint main(void) { return fsdp_version_string()[0] == 0; }\n' >"$tmp/after_stdio.c"
    printf '#define _GNU_SOURCE\n#include <stdio.h>\n#define FSDP_IMPLEMENTATION\n#include "fsdp.h"\nint main(void) { return fsdp_version_string()[0] == 0; }\n' >"$tmp/gnu_first.c"
    printf '#define FSDP_STATIC\n#define FSDP_IMPLEMENTATION\n#include "fsdp.h"\nint main(void) { return 0; }\n' >"$tmp/static.c"
    printf '#include "fsdp.h"\nint main(void) { return (int)fsdp_dtype_size(FSDP_F32) - 4; }\n' >"$tmp/decl_only.c"
    cp "$tmp/first.c" "$tmp/first.cpp"
    W="-Wall -Wextra -Wpedantic -Werror -I."
    check header.c99 $CC -std=c99 $W -O2 "$tmp/first.c" -o "$tmp/a" -lpthread -lm
    check header.c11 $CC -std=c11 $W -O2 "$tmp/first.c" -o "$tmp/a" -lpthread -lm
    check header.c99_O3 $CC -std=c99 $W -O3 "$tmp/first.c" -o "$tmp/a" -lpthread -lm
    check header.c99_O2_sanitizers $CC -std=c99 $W -O2 -fsanitize=address,undefined -c "$tmp/first.c" -o "$tmp/a.o"
    check header.cxx11 $CXX -std=c++11 $W -O2 "$tmp/first.cpp" -o "$tmp/a" -lpthread -lm
    check header.cxx17 $CXX -std=c++17 $W -O2 "$tmp/first.cpp" -o "$tmp/a" -lpthread -lm
    check header.static_c99 $CC -std=c99 $W "$tmp/static.c" -o "$tmp/a" -lpthread -lm
    check header.declarations_only $CC -std=c99 $W -c "$tmp/decl_only.c" -o "$tmp/a.o"
    check header.gnu_source_first_c99 $CC -std=c99 $W "$tmp/gnu_first.c" -o "$tmp/a" -lpthread -lm
    check header.after_stdio_gnu11 $CC -std=gnu11 $W "$tmp/after_stdio.c" -o "$tmp/a" -lpthread -lm
    # strict mode with a system header first must stop with the message that says what to do,
    # and with nothing else: one error line, not the cascade of the implementation after it
    check header.after_stdio_c99_explains sh -c "! $CC -std=c99 $W -c '$tmp/after_stdio.c' -o '$tmp/a.o' 2>'$tmp/err' && grep -q 'define _GNU_SOURCE at the very top' '$tmp/err'"
    check header.after_stdio_c99_reports_exactly_one_error sh -c "! $CC -std=c99 $W -c '$tmp/after_stdio.c' -o '$tmp/a.o' 2>'$tmp/err';
        cat '$tmp/err'; [ \$(grep -c 'error:' '$tmp/err') -eq 1 ] && [ \$(grep -c 'warning:' '$tmp/err') -eq 0 ]"
    # FSDP_ABORT_ON_MISUSE: fsdp_param outside its unit's hooks aborts there, printing its message
    cat >"$tmp/misuse.c" <<'EOF'
#define FSDP_ABORT_ON_MISUSE
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
int main(void) {
    fsdp_comm *comm = NULL;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_comm_desc cd;
    fsdp_desc d;
    fsdp_init_rule zeros = {FSDP_INIT_ZEROS, 0, 0, NULL, NULL};
    int64_t shape[1] = {4};
    memset(&cd, 0, sizeof cd);
    memset(&d, 0, sizeof d);
    cd.world_size = 1;
    cd.job = "abort-on-misuse";
    if (fsdp_comm_init(&comm, &cd) || fsdp_model_create(&model, "Net") ||
        fsdp_model_param(model, 0, "weight", 1, shape, zeros) != 0)
        return 2;
    d.comm = comm;
    if (fsdp_init(&ctx, model, &d)) return 3;
    return fsdp_param(ctx, 0) == NULL ? 0 : 4; /* no hook called: a misuse */
}
EOF
    check header.abort_on_misuse_macro_aborts_at_the_call_with_its_message sh -c "$CC -std=c99 $W '$tmp/misuse.c' -o '$tmp/misuse' -lpthread -lm &&
        { ulimit -c 0; '$tmp/misuse' 2>'$tmp/err'; status=\$?; cat '$tmp/err'; [ \$status -eq 134 ]; } &&
        grep -q \"fsdp_param(ctx, 0 'weight'): unit 0 (root) is sharded (not gathered): call fsdp_pre_forward(ctx, 0) first\" '$tmp/err'"
    if command -v clang >/dev/null 2>&1; then
        check header.clang_c99 clang -std=c99 $W "$tmp/first.c" -o "$tmp/a" -lpthread -lm
        # the examples' models too (their target_clones and AVX-512 kernel are compiler-specific)
        check examples.gpt_and_mlp_clang_c99 sh -c "clang -std=c99 $W -O1 examples/gpt.c -o '$tmp/a' -lopenblas -lpthread -lm &&
            clang -std=c99 $W -O1 examples/mlp.c -o '$tmp/a' -lopenblas -lpthread -lm"
    fi
    rm -rf "$tmp"

    # ckpt_tool on hostile files (issue 9): terminal escapes in names and metadata never reach
    # its output as ESC bytes, and a FIFO under a checkpoint's name fails at once
    if timed build:ckpt_tool make --no-print-directory "$BUILD/ckpt_tool" BUILD="$BUILD" >"$log" 2>&1; then
        tmp=$(mktemp -d)
        hdr='{"__metadata__":{"note\u001b[2J":"\u001b]0;owned\u0007","crc32c.evil\u001b]0;owned\u0007":"00000000"},"evil\u001b]0;owned\u0007":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
        { printf "\\$(printf %03o $((${#hdr} % 256)))\\$(printf %03o $((${#hdr} / 256)))\\000\\000\\000\\000\\000\\000"
          printf '%s' "$hdr"; printf '\001\002\003\004'; } >"$tmp/evil.safetensors"
        mkfifo "$tmp/fifo.safetensors"
        check ckpt_tool.inspect_prints_no_escape_bytes sh -c "'$BIN/ckpt_tool' inspect '$tmp/evil.safetensors' >'$tmp/out' 2>&1;
            grep -q evil '$tmp/out' && ! od -An -tx1 '$tmp/out' | grep -q ' 1b' || { od -c '$tmp/out' | grep 033; exit 1; }"
        check ckpt_tool.inspect_of_a_fifo_fails_within_5s sh -c "timeout 5 '$BIN/ckpt_tool' inspect '$tmp/fifo.safetensors'; rc=\$?; [ \$rc -ne 0 ] && [ \$rc -ne 124 ]"
        rm -rf "$tmp"
    else
        echo "(ckpt_tool checks skipped: $BUILD/ckpt_tool cannot be built)"
    fi

    # the examples' command lines (issue 10): --strategy takes PyTorch's and Hugging Face's
    # names in any case and lists them for a name it does not know; gpt --resume auto with
    # --max-restarts survives a rank killed mid-run and ends bitwise where a run never stopped ends
    if timed build:gpt,mlp,ckpt_tool make --no-print-directory "$BUILD/gpt" "$BUILD/mlp" "$BUILD/ckpt_tool" BUILD="$BUILD" >"$log" 2>&1; then
        tmp=$(mktemp -d)
        cp fsdp.h "$tmp/text" # a text that cannot change between the runs compared
        tiny="--data $tmp/text --layers 1 --channels 32 --heads 2 --seq-len 16 --batch 4 --sample 0"
        mlp_tiny="--samples 64 --features 4 --classes 2 --hidden 8 --layers 2 --batch 8 --steps 1"
        check examples.gpt_strategy_SHARD_GRAD_OP_accepted sh -c "'$BIN/gpt' $tiny --steps 1 --ckpt none --strategy SHARD_GRAD_OP |
            grep '^gpt: 1 rank (shm), SHARD_GRAD_OP, '"
        check examples.gpt_strategy_hybrid_shard_accepted sh -c "'$BIN/gpt' $tiny --steps 1 --ckpt none --nproc 2 --strategy hybrid_shard |
            grep '^gpt: 2 ranks (shm), HYBRID_SHARD '"
        check examples.mlp_strategy_No_Shard_and_2_accepted sh -c "'$BIN/mlp' $mlp_tiny --strategy No_Shard | grep '^mlp: 1 rank (shm), NO_SHARD, ' &&
            '$BIN/mlp' $mlp_tiny --strategy 2 | grep '^mlp: 1 rank (shm), SHARD_GRAD_OP, '"
        for prog in gpt mlp; do
            check examples.${prog}_unknown_strategy_fails_listing_the_names sh -c "! '$BIN/$prog' --strategy zero3 2>'$tmp/err' &&
                grep \"unknown strategy 'zero3' (choose one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD in any case,\" '$tmp/err' &&
                grep 'short full, grad_op, no_shard, hybrid)' '$tmp/err'"
        done
        elastic="--nproc 2 $tiny --steps 12 --print-every 1 --save-every 4"
        losses() { grep -o 'step *[0-9]*/12  loss [0-9.]*' "$1" | sort -u; } # a repeated step must repeat its loss
        gpt_elastic() {
            "$BIN/gpt" $elastic --ckpt "$tmp/ref" >"$tmp/ref.log" 2>&1 || { echo "uninterrupted run failed:"; cat "$tmp/ref.log"; return 1; }
            GPT_FAULT_AT_STEP=7 "$BIN/gpt" $elastic --ckpt "$tmp/el" --resume auto --max-restarts 1 >"$tmp/el.log" 2>&1
            status=$?
            tail -n 18 "$tmp/el.log"
            [ $status = 0 ] && grep -q "^no checkpoint in $tmp/el yet: starting from scratch" "$tmp/el.log" &&
                grep -q '^rank 1: GPT_FAULT_AT_STEP=7: killing this rank' "$tmp/el.log" &&
                grep -q "^resuming from $tmp/el at step 4 (restart 1)" "$tmp/el.log" &&
                grep -q '^gpt: finished after 1 restart' "$tmp/el.log" || return 1
            losses "$tmp/ref.log" >"$tmp/ref.losses"
            losses "$tmp/el.log" >"$tmp/el.losses"
            [ "$(wc -l <"$tmp/el.losses")" -eq 12 ] && cmp "$tmp/ref.losses" "$tmp/el.losses" || return 1
            "$BIN/ckpt_tool" consolidate "$tmp/ref" "$tmp/ref.safetensors" >/dev/null &&
                "$BIN/ckpt_tool" consolidate "$tmp/el" "$tmp/el.safetensors" >/dev/null &&
                cmp "$tmp/ref.safetensors" "$tmp/el.safetensors" # parameters and AdamW state
        }
        check examples.gpt_resume_auto_after_a_killed_rank_ends_bitwise_as_a_run_never_stopped gpt_elastic
        # issue 28: a rank killed while its asynchronous save is written (not committed): the restart
        # resumes from the save before, and the run ends as one never stopped (the sync run's files)
        gpt_async_killed() {
            if [ ! -f "$tmp/ref.safetensors" ]; then # (gpt_elastic made it, unless it failed early)
                "$BIN/gpt" $elastic --ckpt "$tmp/ref" >"$tmp/ref.log" 2>&1 && losses "$tmp/ref.log" >"$tmp/ref.losses" &&
                    "$BIN/ckpt_tool" consolidate "$tmp/ref" "$tmp/ref.safetensors" >/dev/null || return 1
            fi
            GPT_FAULT_IN_SAVE=8 "$BIN/gpt" $elastic --ckpt "$tmp/as" --async-ckpt --resume auto --max-restarts 1 \
                >"$tmp/as.log" 2>&1
            status=$?
            tail -n 18 "$tmp/as.log"
            [ $status = 0 ] && grep -q '^rank 1: GPT_FAULT_IN_SAVE=8: killing this rank' "$tmp/as.log" &&
                grep -q "^resuming from $tmp/as at step 4 (restart 1)" "$tmp/as.log" &&
                grep -q "behind the training: blocked" "$tmp/as.log" || return 1
            losses "$tmp/as.log" >"$tmp/as.losses"
            [ "$(wc -l <"$tmp/as.losses")" -eq 12 ] && cmp "$tmp/ref.losses" "$tmp/as.losses" || return 1
            "$BIN/ckpt_tool" consolidate "$tmp/as" "$tmp/as.safetensors" >/dev/null &&
                cmp "$tmp/ref.safetensors" "$tmp/as.safetensors"
        }
        check examples.gpt_async_ckpt_rank_killed_mid_save_resume_auto_ends_bitwise_as_a_run_never_stopped gpt_async_killed
        check examples.gpt_killed_rank_without_restarts_fails_naming_it sh -c "GPT_FAULT_AT_STEP=2 '$BIN/gpt' $elastic --ckpt none \
            >'$tmp/kill.log' 2>&1; status=\$?; cat '$tmp/kill.log'; [ \$status -ne 0 ] && grep -q '^gpt: rank 1 was killed by signal 9' '$tmp/kill.log'"
        rm -rf "$tmp"
    else
        echo "(example checks skipped: $BUILD/gpt, $BUILD/mlp or $BUILD/ckpt_tool cannot be built; they need libopenblas-dev)"
    fi

    # issue 12: gpt --recompute trains bitwise as without; --mem-budget refuses a rank count that
    # cannot fit before anything is allocated; distill trains a student from a frozen teacher
    # that build/gpt trained, at P = 2, and its loss falls
    if timed build:gpt,distill,ckpt_tool make --no-print-directory "$BUILD/gpt" "$BUILD/distill" "$BUILD/ckpt_tool" BUILD="$BUILD" >"$log" 2>&1; then
        tmp=$(mktemp -d)
        cp fsdp.h "$tmp/text"
        tiny="--data $tmp/text --layers 2 --channels 32 --heads 2 --seq-len 16 --batch 4 --sample 0 --ckpt none"
        losses() { grep -E '^(step|held-out)' "$1" | sed 's/ *[0-9.]* ms\/step.*//'; }
        gpt_recompute() {
            "$BIN/gpt" --nproc 2 $tiny --steps 8 --print-every 1 >"$tmp/kept.log" 2>&1 &&
                "$BIN/gpt" --nproc 2 $tiny --steps 8 --print-every 1 --recompute >"$tmp/recomputed.log" 2>&1 ||
                { cat "$tmp/kept.log" "$tmp/recomputed.log"; return 1; }
            losses "$tmp/kept.log" >"$tmp/kept.losses"
            losses "$tmp/recomputed.log" >"$tmp/recomputed.losses"
            cat "$tmp/recomputed.losses"
            grep -q '^activation checkpointing: blocks 0 1 recomputed in backward' "$tmp/recomputed.log" &&
                [ "$(wc -l <"$tmp/kept.losses")" -eq 9 ] && cmp "$tmp/kept.losses" "$tmp/recomputed.losses"
        }
        check examples.gpt_recompute_trains_bitwise_as_without gpt_recompute
        gpt_offload() { # (the build directory: on disk, where tmpfs would be refused)
            mkdir -p "$BUILD/offload-check" &&
                "$BIN/gpt" --nproc 2 $tiny --steps 8 --print-every 1 --offload all --offload-dir "$BUILD/offload-check" \
                    >"$tmp/offload.log" 2>&1 || { cat "$tmp/offload.log"; return 1; }
            [ -f "$tmp/kept.losses" ] || { "$BIN/gpt" --nproc 2 $tiny --steps 8 --print-every 1 >"$tmp/kept.log" 2>&1 &&
                losses "$tmp/kept.log" >"$tmp/kept.losses"; }
            losses "$tmp/offload.log" >"$tmp/offload.losses"
            grep '^offload: the parameters, gradients and optimizer state on disk' "$tmp/offload.log" &&
                [ -z "$(ls -A "$BUILD/offload-check")" ] && cmp "$tmp/kept.losses" "$tmp/offload.losses"
        }
        check examples.gpt_offload_all_trains_bitwise_as_in_ram_and_leaves_its_directory_empty gpt_offload
        # issue 28: gpt --log writes one JSON line per step (the printed loss, in order); f16 runs
        # carry the loss scale (65536 at first); an unwritable --log fails the run naming it
        gpt_log() {
            "$BIN/gpt" --nproc 2 $tiny --steps 5 --print-every 1 --param-dtype f16 --log "$tmp/steps.jsonl" \
                >"$tmp/logged.log" 2>&1 || { cat "$tmp/logged.log"; return 1; }
            cat "$tmp/steps.jsonl"
            [ "$(wc -l <"$tmp/steps.jsonl")" -eq 5 ] || return 1
            for k in 1 2 3 4 5; do
                line=$(sed -n "${k}p" "$tmp/steps.jsonl")
                case $line in "{\"step\":$k,\"loss\":"*'"grad_norm":'*'"loss_scale":'*'"in_fsdp_ms":'*'"peak_rss_mib":'*"}") ;;
                    *) echo "line $k: $line"; return 1 ;; esac
            done
            printed=$(grep -o 'step *5/5  loss [0-9.]*' "$tmp/logged.log" | awk '{print $NF}')
            logged=$(sed -n 5p "$tmp/steps.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\),.*/\1/')
            awk -v a="$printed" -v b="$logged" 'BEGIN { exit !(a - b < 1e-4 && b - a < 1e-4) }' || { echo "printed $printed, logged $logged"; return 1; }
            grep -q '"step":1,.*"loss_scale":65536,' "$tmp/steps.jsonl" || return 1
            if "$BIN/gpt" --nproc 2 $tiny --steps 2 --log "$tmp/no/such/dir/x.jsonl" >"$tmp/nolog.log" 2>&1; then return 1; fi
            grep -q "^gpt: --log $tmp/no/such/dir/x.jsonl: No such file or directory" "$tmp/nolog.log"
        }
        check examples.gpt_log_writes_a_json_line_per_step_and_refuses_an_unwritable_file gpt_log
        # issue 36: the held-out loss scores the same sequences at every P and sums them in an order
        # that does not depend on P: from the same weights (trained at P = 2, resumed with nothing
        # left to train) P = 1, 2 and 4 print the same line
        gpt_heldout() {
            "$BIN/gpt" --nproc 2 $tiny --steps 4 --ckpt "$tmp/heldout" >"$tmp/heldout.log" 2>&1 ||
                { cat "$tmp/heldout.log"; return 1; }
            for P in 1 2 4; do
                "$BIN/gpt" --nproc $P $tiny --steps 4 --resume "$tmp/heldout" >"$tmp/heldout$P.log" 2>&1 ||
                    { cat "$tmp/heldout$P.log"; return 1; }
                grep '^held-out loss' "$tmp/heldout$P.log" >"$tmp/heldout$P.line"
                echo "P=$P: $(cat "$tmp/heldout$P.line")"
            done
            grep -q '^held-out loss [0-9.]* ([0-9]* sequences x 16 bytes not trained on)$' "$tmp/heldout1.line" &&
                cmp "$tmp/heldout1.line" "$tmp/heldout2.line" && cmp "$tmp/heldout1.line" "$tmp/heldout4.line"
        }
        check examples.gpt_heldout_loss_line_is_identical_at_P_1_2_and_4 gpt_heldout
        big="--data $tmp/text --layers 8 --channels 256 --heads 4 --seq-len 16 --batch 4 --steps 1 --sample 0 --ckpt none"
        check examples.gpt_mem_budget_refuses_1_rank_naming_the_bytes_and_the_fewest_ranks sh -c "! '$BIN/gpt' $big --mem-budget 100 \
            >'$tmp/out' 2>'$tmp/err'; cat '$tmp/err'; grep -q '^gpt: --mem-budget 100 MiB: refusing to start 1 rank: each needs .*, [0-9]* bytes\$' '$tmp/err' &&
            grep -q '^the fewest ranks that fit (with --batch 4): --nproc 2, ' '$tmp/err' && ! grep -q '^step' '$tmp/out'"
        check examples.gpt_mem_budget_lets_2_ranks_train_and_compares_their_peak_rss sh -c "'$BIN/gpt' $big --mem-budget 100 --nproc 2 \
            >'$tmp/out' 2>&1; status=\$?; cat '$tmp/out'; [ \$status = 0 ] && grep -q '^memory budget 100 MiB per rank: peak RSS ' '$tmp/out'"
        distill_run() {
            "$BIN/gpt" $tiny --steps 40 --ckpt "$tmp/teacher" >"$tmp/teacher.log" 2>&1 &&
                "$BIN/ckpt_tool" consolidate "$tmp/teacher" "$tmp/teacher.safetensors" --params-only >/dev/null ||
                { cat "$tmp/teacher.log"; return 1; }
            "$BIN/distill" --nproc 2 --data "$tmp/text" --teacher "$tmp/teacher.safetensors" --layers 1 --channels 16 \
                --heads 2 --seq-len 16 --batch 4 --steps 30 --print-every 10 >"$tmp/distill.log" 2>&1
        }
        distill_loss_falls() {
            cat "$tmp/distill.log"
            grep -q '^teacher: .*: 2 blocks, 2 heads, 32 channels, context 16: .* frozen, FULL_SHARD, forward only' "$tmp/distill.log" &&
                awk '/^step/ { if (first == "") first = $4; last = $4 }
                     /^first step loss/ { held = $NF }
                     END { ok = first ~ /^[0-9]+[.][0-9]+$/ && last ~ /^[0-9]+[.][0-9]+$/ && held ~ /^[0-9]+[.][0-9]+$/
                           exit !(ok && last + 0 < first + 0) }' "$tmp/distill.log"
        }
        if distill_run; then
            check examples.distill_from_a_gpt_teacher_at_P2_runs_and_its_loss_falls distill_loss_falls
            check examples.distill_teacher_holds_4_bytes_per_parameter_over_P sh -c "cat '$tmp/distill.log';
                [ \$(grep -c '^ *[01]  .* MiB (2.000) ' '$tmp/distill.log') = 2 ]"
        else
            check examples.distill_from_a_gpt_teacher_at_P2_runs_and_its_loss_falls sh -c "cat '$tmp/distill.log'; false"
        fi
        rm -rf "$tmp"
    else
        echo "(gpt and distill checks skipped: $BUILD/gpt, $BUILD/distill or $BUILD/ckpt_tool cannot be built; they need libopenblas-dev)"
    fi

    if [ -z "$SKIP_MPI" ] && [ -f tests/test_mpi.c ] && command -v "${MPICC:-mpicc}" >/dev/null 2>&1 && command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
        echo "== MPI bridge (mpirun)"
        if timed build:test_mpi make --no-print-directory "$BUILD/test_mpi" BUILD="$BUILD" UNITY_DIR="$UNITY_DIR" >"$log" 2>&1; then
            # np 3 and 4 run at once: two jobs of a user on one host must not meet in a segment
            timer_start
            for np in 2 3+4; do
                pids=""
                for n in $(echo $np | tr + ' '); do
                    timeout 300 "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe -np $n "$BIN/test_mpi" >"$log.$n" 2>&1 &
                    pids="$pids $n:$!"
                done
                for entry in $pids; do
                    n=${entry%%:*}
                    wait "${entry#*:}"
                    status=$?
                    sed "s/^/[np=$n] /" "$log.$n"
                    mv "$log.$n" "$log"
                    count_unity "test_mpi(np=$n)" "$status"
                done
            done
            timer_stop test_mpi
            echo "(test_mpi, np 2, 3 and 4: $(last_timing))"
        else
            cat "$log"
            echo "test_mpi: build failed"
            failed=$((failed + 1))
        fi
    elif [ -n "$SKIP_MPI" ]; then
        echo "(MPI bridge tests skipped: SKIP_MPI is set, as the sanitizer run sets it)"
    else
        echo "(MPI bridge tests skipped: mpicc/mpirun not installed; sudo apt-get install libopenmpi-dev openmpi-bin)"
    fi
else
    echo "(header, docs, example and MPI checks skipped: NO_EXTRA_CHECKS is set; make test runs them)"
fi

echo
echo "slowest (wall s, CPU s):"
sort -k1,1 -rn "$timings" | head -n 10 | awk '{ printf "  %7.1f %7.1f  %s\n", $1, $2, $3 }'
awk '{ w += $1; c += $2 } END { printf "  %7.1f %7.1f  all %d programs and checks\n", w, c, NR }' "$timings"
echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
