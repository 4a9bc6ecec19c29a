#!/bin/bash
# tests/mutants.sh - the mutation probe: do the tests fail where it matters?
#
# Puts deliberate bugs (mutants) into copies of fsdp.h, one at a time, builds the test programs
# that must catch each against its copy, runs them, and prints a table: per mutant and check,
# killed (the program failed: the first failing test is named) or survived (it passed), then a
# total and the time taken. Exits non-zero if a mutant survived a check, no longer applies (its
# text is not in fsdp.h exactly once: fsdp.h changed there; rewrite the mutant), or its copy did
# not build. Not part of make test or CI: run it after changing a guard or its tests.
#
# The mutants are listed in tests/mutants.txt (its top comment gives the format): a name, what
# the bug is, an exact text of fsdp.h that must occur exactly once, its replacement, and the
# checks that must kill it, each on its own. A check is a test program (test_hostile:
# tests/test_hostile.c, built with the Makefile's rule against the mutated copy, which comes first
# on the include path; killed if any of its tests fails or it dies), one test of a program
# (test_hostile:test_peer_trickling_bytes_fails_the_op_within_its_total_deadline: killed if that
# test fails; the program runs until it reports), mpirun:<program>[:<test>] (the same, built with the
# Makefile's MPI rule and run under mpirun -np 2, as tests/run.sh runs test_mpi; skipped where
# mpicc or mpirun is missing), or multihost:<check> (a check of
# tests/multihost/test_multihost.sh, which needs root and network namespaces of its own: listed,
# never run here, shown as skipped).
#
# Usage: tests/mutants.sh [options] [NAME...]
#   NAME...        only these mutants (default: all of them, in the file's order)
#   -l, --list     list the mutants (name, checks, what the bug is) and exit
#   -j N           run N mutants at once (default 1: the tests have timing bounds, and a test that
#                  fails only because the machine is overloaded kills a mutant it should not)
#   -f FILE        the mutants file (default tests/mutants.txt)
#   --baseline     first build and run every program the chosen mutants name against the
#                  unmutated fsdp.h: each must pass, else no kill means anything (exit 2)
#   --timeout S    bound on each test program's run (default 600 s, as tests/run.sh)
#   --keep         keep every mutant's directory (mutated header, binaries, logs), not only those
#                  of mutants that survived, are stale or could not be built or run; says where
#   -h, --help     this text
# Runs under nice -n 10. Safe to run several at once (each mutant builds in a directory of its
# own under $TMPDIR). A program is stopped at its first failing test (its process group is
# killed): a killed mutant costs the build and the tests before that one. OPT (default -O2) and
# CC are passed to make. The first 21 mutants of tests/mutants.txt took 17 minutes on 2 cores that
# other jobs kept busy (load 10-20), 7.7 minutes of CPU; --baseline adds 12 minutes there; 32 of
# them took 521 s with -j 2 on a quieter machine (BENCHMARKS.md section 10).
set -u
if [ -z "${FSDP_MUTANTS_NICED:-}" ]; then
    export FSDP_MUTANTS_NICED=1
    exec nice -n 10 bash "$0" "$@"
fi
cd "$(dirname "$0")/.." || exit 2
# (Everything runs from main, called on the last line: bash has read the whole file before it
# starts, so editing the script while it runs cannot change what the running one does.)

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

# --- the mutants file: blocks of "key value" lines (mutant, area, find, replace, kill) ----------
NAMES=() AREAS=() FINDS=() REPLACES=() KILLS=()
parse_error() { echo "$FILE:$1: $2" >&2; exit 2; }
read_mutants() {
    local line key value n i lineno=0
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        case $line in '' | '#'*) continue ;; esac
        key=${line%%[[:space:]]*}
        value=${line#"$key"}
        value=${value#"${value%%[![:space:]]*}"}
        case $key in
            mutant)
                for n in ${NAMES[@]+"${NAMES[@]}"}; do [ "$n" = "$value" ] && parse_error $lineno "mutant $value listed twice"; done
                NAMES+=("$value") AREAS+=("") FINDS+=("") REPLACES+=("") KILLS+=("") ;;
            area | find | replace | kill)
                [ ${#NAMES[@]} -gt 0 ] || parse_error $lineno "'$key' before the first 'mutant'"
                i=$((${#NAMES[@]} - 1))
                case $key in
                    area) AREAS[$i]=$value ;;
                    find) FINDS[$i]=$value ;;
                    replace) REPLACES[$i]=$value ;;
                    kill) KILLS[$i]=$value ;;
                esac ;;
            *) parse_error $lineno "unknown key '$key' (mutant, area, find, replace, kill)" ;;
        esac
    done <"$FILE"
    for i in "${!NAMES[@]}"; do
        [ -n "${FINDS[$i]}" ] && [ -n "${KILLS[$i]}" ] || { echo "$FILE: mutant ${NAMES[$i]} needs find and kill" >&2; exit 2; }
    done
}

# --- one mutant ---------------------------------------------------------------------------------
# Writes fsdp.h with the mutation into dir; prints how often the text occurs when not once.
# "\n" in find and replace stands for a line break ("\\" for a backslash).
mutate() { # dir, find, replace
    FIND=$2 REPLACE=$3 perl -e '
        sub unescape { my $s = shift; $s =~ s/\\(\\|n)/$1 eq "n" ? "\n" : "\\"/ge; return $s; }
        my ($find, $replace) = (unescape($ENV{FIND}), unescape($ENV{REPLACE}));
        local $/; open(my $in, "<", "fsdp.h") or die "fsdp.h: $!\n"; my $text = <$in>; close $in;
        my ($count, $at) = (0, -1);
        for (my $p = index($text, $find); $p >= 0; $p = index($text, $find, $p + 1)) { $count++; $at = $p if $at < 0; }
        if ($count != 1) { print "$count\n"; exit 1; }
        substr($text, $at, length $find) = $replace;
        open(my $out, ">", "$ARGV[0]/fsdp.h") or die "$ARGV[0]/fsdp.h: $!\n"; print $out $text; close $out;
    ' "$1"
}

# Builds program against the header in dir (the Makefile's rule; -I dir ahead of the repository;
# the MPI rule takes no CFLAGS, so its compiler carries it).
build_program() { # dir, program
    make --no-print-directory -s BUILD="$1/build" CFLAGS="-I$1" MPICC="${MPICC:-mpicc} -I$1" OPT="${OPT:--O2}" \
        "$1/build/$2" >"$1/build-$2.log" 2>&1
}

# The message of a Unity FAIL line, shortened.
fail_message() { printf '%s\n' "${1#*:FAIL[.:] }" | cut -c1-140; }

# Runs a test program from the repository's root in a process group of its own (its id in
# log.pgid while it runs), stopped at its first failing test or, given a test, once that test
# reported. Prints "killed (why)", "survived" or "error (why)"; the output is in log.
run_program() { # binary, log[, test[, launcher: the words that run the binary, as mpirun -np 2]]
    local pid status waited=0 line stop=':FAIL'
    [ -n "${3:-}" ] && stop=":$3:(PASS|FAIL|IGNORE)"
    # shellcheck disable=SC2086 # (the launcher's words)
    setsid ${4:-} "$1" >"$2" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$2.pgid"
    while kill -0 "$pid" 2>/dev/null && ! grep -Eq "$stop" "$2" && [ $waited -lt $((LIMIT * 5)) ]; do
        sleep 0.2
        waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null # the program and its ranks
    wait "$pid" 2>/dev/null
    status=$?
    rm -f "$2.pgid"
    line=$(grep -Em1 "$stop" "$2")
    if [ -n "${3:-}" ]; then
        case $line in
            *":$3:FAIL"*) echo "killed ($(fail_message "$line"))" ;;
            *":$3:PASS"*) echo "survived" ;;
            *":$3:IGNORE"*) echo "error (ignored: ${line#*IGNORE})" ;;
            *) [ $waited -ge $((LIMIT * 5)) ] && echo "error (still running after $LIMIT s, before $3 reported)" ||
                echo "error (the program ended before $3 reported: exit status $status)" ;;
        esac
    elif [ -n "$line" ]; then
        echo "killed ($(echo "$line" | cut -d: -f3): $(fail_message "$line"))"
    elif [ $waited -ge $((LIMIT * 5)) ]; then
        echo "killed (no end after $LIMIT s)"
    elif [ $status -ne 0 ]; then
        echo "killed (exit status $status, no failing test: $(tail -n 1 "$2" | cut -c1-80))"
    else
        echo "survived"
    fi
}

# Runs mutant i in dir; writes a row "check<TAB>verdict" per check, and its time, into result.
run_mutant() { # index, dir, result file
    local i=$1 dir=$2 result=$3 count check program test verdict start=$SECONDS
    mkdir -p "$dir" && : >"$result"
    if ! count=$(mutate "$dir" "${FINDS[$i]}" "${REPLACES[$i]}"); then
        printf 'fsdp.h\tstale (no longer applies: its text occurs %s times in fsdp.h, not once)\n' "${count:-?}" >>"$result"
    else
        for check in ${KILLS[$i]}; do
            program=${check%%:*} test=
            [ "$program" != "$check" ] && test=${check#*:}
            case $check in
                multihost:*) verdict="skipped (needs root and network namespaces of its own: make test-multihost)" ;;
                mpirun:*)
                    program=${check#mpirun:} test=
                    [ "${program%%:*}" != "$program" ] && test=${program#*:} program=${program%%:*}
                    if ! command -v "${MPICC:-mpicc}" >/dev/null 2>&1 || ! command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
                        verdict="skipped (needs mpicc and mpirun)"
                    elif [ ! -f "tests/$program.c" ]; then verdict="error (no tests/$program.c)"
                    elif [ ! -x "$dir/build/$program" ] && ! build_program "$dir" "$program"; then
                        verdict="error (does not build: build-$program.log)"
                    else verdict=$(run_program "$dir/build/$program" "$dir/$check.log" "$test" \
                                   "${MPIRUN:-mpirun} --allow-run-as-root --oversubscribe -np 2" 2>/dev/null)
                    fi ;;
                test_*)
                    if [ ! -f "tests/$program.c" ]; then verdict="error (no tests/$program.c)"
                    elif [ ! -x "$dir/build/$program" ] && ! build_program "$dir" "$program"; then
                        verdict="error (does not build: build-$program.log)"
                    else verdict=$(run_program "$dir/build/$program" "$dir/$check.log" "$test" 2>/dev/null)
                    fi ;;
                *) verdict="error (not a check: a test program, program:test, mpirun:program[:test] or multihost:check)" ;;
            esac
            printf '%s\t%s\n' "$check" "$verdict" >>"$result"
        done
    fi
    printf 'time\t%d\n' $((SECONDS - start)) >>"$result"
}

# --- the whole run ------------------------------------------------------------------------------
# Builds and runs every program the chosen mutants name against the unmutated header: 0 if all pass.
baseline() {
    local p verdict bad=0 dir="$WORK/baseline"
    mkdir -p "$dir" && cp fsdp.h "$dir/fsdp.h"
    for p in $(for i in "${CHOSEN[@]}"; do for c in ${KILLS[$i]}; do case $c in test_*) echo "${c%%:*}" ;; esac; done; done |
               sort -u); do
        if ! build_program "$dir" "$p"; then
            echo "baseline: $p does not build against the unmutated fsdp.h:"
            cat "$dir/build-$p.log"
            bad=1
            continue
        fi
        verdict=$(run_program "$dir/build/$p" "$dir/$p.log" 2>/dev/null)
        if [ "$verdict" = survived ]; then
            printf 'baseline: %-24s passes on the unmutated fsdp.h\n' "$p"
        else
            printf 'baseline: %-24s FAILS on the unmutated fsdp.h: %s\n' "$p" "$verdict"
            bad=1
        fi
    done
    [ $bad = 0 ] || echo "baseline failed: no kill means anything until these pass (a loaded machine can fail timing bounds)"
    return $bad
}

# One row per check: result, the mutant's time, mutant, check and why. Sets the counts.
print_table() {
    local i r t first outcome check verdict word detail
    killed=0 survived=0 stale=0 errors=0 skipped=0
    printf '%-9s %5s  %-36s %s\n' result time mutant "check (and what failed)"
    for i in "${CHOSEN[@]}"; do
        r="$WORK/$i.result"
        t=$(grep $'^time\t' "$r" | cut -f2)
        first=1 outcome=killed
        while IFS=$'\t' read -r check verdict; do
            word=${verdict%% *} detail=
            [ "$word" != "$verdict" ] && detail=" ${verdict#* }"
            case $word in
                survived) word=SURVIVED outcome=survived ;;
                stale) word=STALE outcome=stale ;;
                error) word=ERROR; [ $outcome = killed ] && outcome=error ;;
                skipped) skipped=$((skipped + 1)) ;;
            esac
            printf '%-9s %5s  %-36s %s%s\n' "$word" "$([ $first = 1 ] && echo "${t}s")" \
                "$([ $first = 1 ] && echo "${NAMES[$i]}")" "$check" "$detail"
            first=0
        done < <(grep -v $'^time\t' "$r")
        [ -d "$KEPT/${NAMES[$i]}" ] && echo "          kept: $KEPT/${NAMES[$i]}"
        case $outcome in
            killed) killed=$((killed + 1)) ;;
            survived) survived=$((survived + 1)) ;;
            stale) stale=$((stale + 1)) ;;
            error) errors=$((errors + 1)) ;;
        esac
    done
}

# Stops what still runs (the mutants' jobs and their programs' process groups); removes the work.
cleanup() {
    local f
    for f in "$WORK"/*/*.pgid; do [ -f "$f" ] && kill -KILL -- "-$(cat "$f")" 2>/dev/null; done
    jobs -p | xargs -r kill 2>/dev/null
    rm -rf "$WORK"
}

main() {
    local i running=0 start=$SECONDS
    FILE=tests/mutants.txt JOBS=1 BASELINE=0 KEEP=0 LIMIT=600 LIST=0
    local only=()
    while [ $# -gt 0 ]; do
        case $1 in
            -h | --help) usage; return 0 ;;
            -l | --list) LIST=1 ;;
            -j) JOBS=${2:-}; shift ;;
            -j*) JOBS=${1#-j} ;;
            -f) FILE=${2:-}; shift ;;
            --baseline) BASELINE=1 ;;
            --keep) KEEP=1 ;;
            --timeout) LIMIT=${2:-}; shift ;;
            -*) echo "$0: unknown option $1 (see --help)" >&2; return 2 ;;
            *) only+=("$1") ;;
        esac
        [ $# -gt 0 ] && shift
    done
    case $JOBS in '' | *[!0-9]* | 0) echo "$0: -j needs a positive number, not '$JOBS'" >&2; return 2 ;; esac
    case $LIMIT in '' | *[!0-9]* | 0) echo "$0: --timeout needs a positive number of seconds" >&2; return 2 ;; esac
    [ -f "$FILE" ] || { echo "$0: no mutants file '$FILE'" >&2; return 2; }
    read_mutants
    CHOSEN=("${!NAMES[@]}")
    if [ ${#only[@]} -gt 0 ]; then
        CHOSEN=()
        for want in "${only[@]}"; do
            for i in "${!NAMES[@]}"; do [ "${NAMES[$i]}" = "$want" ] && CHOSEN+=("$i") && continue 2; done
            echo "$0: no mutant named '$want' in $FILE (--list shows them)" >&2
            return 2
        done
    fi
    if [ "$LIST" = 1 ]; then
        for i in "${CHOSEN[@]}"; do
            printf '%s: %s\n' "${NAMES[$i]}" "${AREAS[$i]}"
            for c in ${KILLS[$i]}; do printf '    killed by %s\n' "$c"; done
        done
        return 0
    fi

    WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-mutants.XXXXXX") || return 2
    KEPT=$WORK.kept
    trap cleanup EXIT
    trap 'echo "$0: interrupted"; exit 130' INT TERM
    if [ "$BASELINE" = 1 ]; then baseline || return 2; fi
    for i in "${CHOSEN[@]}"; do
        if [ $running -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
        ( run_mutant "$i" "$WORK/${NAMES[$i]}" "$WORK/$i.result"
          if [ "$KEEP" = 1 ] || grep -q $'\t\\(error\\|survived\\)' "$WORK/$i.result"; then
              mkdir -p "$KEPT" && mv "$WORK/${NAMES[$i]}" "$KEPT/"
          fi
          printf '%s: %s\n' "${NAMES[$i]}" "$(grep -v $'^time\t' "$WORK/$i.result" | cut -f2 | cut -d' ' -f1 | xargs)" ) &
        running=$((running + 1))
    done
    wait
    echo
    print_table
    echo
    echo "${#CHOSEN[@]} mutants: $killed killed by every check named, $survived survived a check, $stale no longer apply," \
        "$errors could not be built or run; $skipped checks skipped; $((SECONDS - start)) s"
    [ $survived = 0 ] && [ $stale = 0 ] && [ $errors = 0 ]
}

main "$@"
exit $?
