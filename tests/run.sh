#!/bin/sh
# Runs the given test programs from $BUILD, then the checks that are not Unity programs (the
# header compiled as C99/C11/C++, include-order rules, the MPI bridge under mpirun), and ends
# with the line CI reads: "N passed, N failed".
BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD ;; *) BIN=./$BUILD ;; esac
passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

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
    timeout 600 "$BIN/$t" >"$log" 2>&1
    status=$?
    cat "$log"
    count_unity "$t" "$status"
done

check() { # name, command...
    name=$1
    shift
    if "$@" >"$log" 2>&1; then
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
    # strict mode with a system header first must stop with the message that says what to do
    check header.after_stdio_c99_explains sh -c "! $CC -std=c99 $W -c '$tmp/after_stdio.c' -o '$tmp/a.o' 2>'$tmp/err' && grep -q 'define _GNU_SOURCE at the very top' '$tmp/err'"
    if command -v clang >/dev/null 2>&1; then
        check header.clang_c99 clang -std=c99 $W "$tmp/first.c" -o "$tmp/a" -lpthread -lm
    fi
    rm -rf "$tmp"

    # ckpt_tool on hostile files (issue 9): terminal escapes in names and metadata never reach
    # its output as ESC bytes, and a FIFO under a checkpoint's name fails at once
    if make --no-print-directory "$BUILD/ckpt_tool" BUILD="$BUILD" >"$log" 2>&1; then
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

    if [ -z "$SKIP_MPI" ] && [ -f tests/test_mpi.c ] && command -v "${MPICC:-mpicc}" >/dev/null 2>&1 && command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
        echo "== MPI bridge (mpirun)"
        if make --no-print-directory "$BUILD/test_mpi" BUILD="$BUILD" UNITY_DIR="$UNITY_DIR" >"$log" 2>&1; then
            for np in 2 3 4; do
                timeout 300 "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe -np $np "$BIN/test_mpi" >"$log" 2>&1
                status=$?
                sed "s/^/[np=$np] /" "$log"
                count_unity "test_mpi(np=$np)" "$status"
            done
        else
            cat "$log"
            echo "test_mpi: build failed"
            failed=$((failed + 1))
        fi
    else
        echo "(MPI bridge tests skipped: mpicc/mpirun not installed; sudo apt-get install libopenmpi-dev openmpi-bin)"
    fi
fi

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
