#!/bin/sh
# tests/check_docs.sh - fsdp.h's documentation against its code (issue 24). fsdp.h is read by
# people who grep it: what it reads from the environment, the macros that configure it and the
# sections its table of contents promises must be written where they look.
#
#   env_vars_in_top_comment       every environment variable fsdp.h reads (getenv("X"), the names
#                                 in its *_vars[] arrays for fsdp__env_int) or sets for its ranks
#                                 (setenv("X", ...)) appears as a word in the top comment (all
#                                 before the line "#ifndef FSDP_H_INCLUDE")
#   fsdp_env_vars_in_readme       ... and each FSDP_* one also in README.md
#   config_macros_in_top_comment  every public macro (FSDP_ and an upper-case letter) tested by
#                                 #ifdef, #ifndef or defined() is in the top comment
#   toc_matches_markers           the TABLE OF CONTENTS (its "   >>name   description" lines, up to
#                                 the next blank line) and the section markers after
#                                 "#ifdef FSDP_IMPLEMENTATION" (lines "   >>name", three spaces)
#                                 list the same names, so that one grep finds every mechanism
#   one_marker_style              no line starts with "/* >>" (the old second marker style)
#
# Usage: sh tests/check_docs.sh [check...]   (none: all). Prints every problem, with the line of
# fsdp.h it comes from; exits 1 if there is one. FSDP_H and README override the files' paths.
FSDP_H=${FSDP_H:-fsdp.h}
README=${README:-README.md}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
if [ ! -r "$FSDP_H" ] || [ ! -r "$README" ]; then echo "cannot read $FSDP_H or $README"; exit 2; fi

sed '/^#ifndef FSDP_H_INCLUDE$/,$d' "$FSDP_H" >"$tmp/top"   # the top comment
sed -n '/^#ifndef FSDP_H_INCLUDE$/,$p' "$FSDP_H" >"$tmp/body"
top_start=$(($(wc -l <"$tmp/top") + 1))                      # line of fsdp.h where body starts

# "NAME LINE" for every environment variable fsdp.h reads or sets
env_vars() {
    grep -noE '(getenv|setenv)\("[A-Za-z_][A-Za-z0-9_]*"' "$FSDP_H" | sed -E 's/^([0-9]+):.*"(.*)"$/\2 \1/'
    awk '/_vars\[\][ \t]*=[ \t]*\{/ { collecting = 1 }
         collecting { s = $0; while (match(s, /"[^"]*"/)) { print substr(s, RSTART + 1, RLENGTH - 2), NR; s = substr(s, RSTART + RLENGTH) } }
         collecting && /\}/ { collecting = 0 }' "$FSDP_H"
}

first_place() { sort -k1,1 -k2,2n | awk '!seen[$1]++'; } # "NAME LINE": each name once, where it first occurs

env_vars_in_top_comment() {
    env_vars | first_place | while read -r name line; do
        grep -qw -- "$name" "$tmp/top" || echo "$FSDP_H:$line: $name is read or set here but not documented in the top comment"
    done
}

fsdp_env_vars_in_readme() {
    env_vars | grep '^FSDP_' | first_place | while read -r name line; do
        grep -qw -- "$name" "$README" || echo "$FSDP_H:$line: $name is read or set here but not documented in $README"
    done
}

# Not configuration, so not required: the include guard FSDP_H_INCLUDE, and a tested macro the
# header #defines itself without offering a default the user may replace (no #ifndef X or
# !defined(X) for it), such as a version number. None of the latter is tested today.
config_macros_in_top_comment() {
    pp='^[ \t]*#[ \t]*' end='([^A-Za-z0-9_]|$)'
    grep -nE "${pp}(ifdef|ifndef)[ \t]+FSDP_[A-Z]|${pp}(if|elif)[ \t].*defined" "$tmp/body" | while IFS=: read -r line rest; do
        printf '%s\n' "$rest" | sed -E 's/^[ \t]*#[ \t]*(ifdef|ifndef)[ \t]+/defined /' |
            grep -oE 'defined[ \t]*\(?[ \t]*FSDP_[A-Z][A-Z0-9_]*' | grep -oE 'FSDP_[A-Z][A-Z0-9_]*' |
            sed "s/\$/ $((line + top_start - 1))/"
    done | first_place | while read -r name line; do
        [ "$name" = FSDP_H_INCLUDE ] && continue
        if grep -qE "${pp}define[ \t]+$name$end" "$tmp/body" &&
            ! grep -qE "${pp}ifndef[ \t]+$name$end|![ \t]*defined[ \t]*\(?[ \t]*$name$end" "$tmp/body"; then
            continue # defined here as a value, not a setting
        fi
        grep -qw -- "$name" "$tmp/top" || echo "$FSDP_H:$line: $name configures fsdp.h (tested here) but is not documented in the top comment"
    done
}

toc_matches_markers() {
    awk '/TABLE OF CONTENTS/ { toc = 1; next } toc && /^[ \t]*$/ { exit }
         toc { if ($0 ~ /^ +>>[a-z_]+ +[^ ]/) print substr($1, 3), NR; else print "!malformed", NR }' "$tmp/top" >"$tmp/toc"
    [ -s "$tmp/toc" ] || echo "$FSDP_H: no table of contents (lines '   >>name   description' after 'TABLE OF CONTENTS')"
    impl=$(grep -n '^#ifdef FSDP_IMPLEMENTATION$' "$FSDP_H" | head -n 1 | cut -d: -f1)
    [ -n "$impl" ] || { echo "$FSDP_H: no line '#ifdef FSDP_IMPLEMENTATION'"; return; }
    awk -v from="$impl" 'NR > from && /^   >>[^ ]+( |$)/ { name = substr($1, 3); print name, NR }' "$FSDP_H" >"$tmp/markers"
    while read -r name line; do
        [ "$name" = '!malformed' ] && { echo "$FSDP_H:$line: a table of contents line not of the form '   >>name   description'"; continue; }
        grep -q "^$name " "$tmp/markers" ||
            echo "$FSDP_H:$line: >>$name is in the table of contents but no line '   >>$name' after line $impl marks its implementation"
    done <"$tmp/toc"
    while read -r name line; do
        grep -q "^$name " "$tmp/toc" || echo "$FSDP_H:$line: section marker >>$name is not in the table of contents"
    done <"$tmp/markers"
}

one_marker_style() {
    grep -n '^/\* >>' "$FSDP_H" | sed -E "s|^([0-9]+):(.*)|$FSDP_H:\\1: a marker in the old style (use '   >>name'): \\2|"
}

[ $# -gt 0 ] || set -- env_vars_in_top_comment fsdp_env_vars_in_readme config_macros_in_top_comment toc_matches_markers one_marker_style
status=0
for check in "$@"; do
    case $check in
    env_vars_in_top_comment | fsdp_env_vars_in_readme | config_macros_in_top_comment | toc_matches_markers | one_marker_style) ;;
    *) echo "unknown check: $check"; exit 2 ;;
    esac
    $check >"$tmp/out"
    if [ -s "$tmp/out" ]; then
        cat "$tmp/out"
        status=1
    fi
done
exit $status
