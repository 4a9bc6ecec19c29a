/* example_args.h - command-line checks shared by the example programs (gpt, mlp, bench_train).
   Each program sets example_program to its name before parsing. */
#ifndef EXAMPLE_ARGS_H
#define EXAMPLE_ARGS_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#  define EXAMPLE_HELPER static __attribute__((unused)) /* not every program needs every helper */
#else
#  define EXAMPLE_HELPER static
#endif

static const char *example_program = "example";

/* Prints "<program>: <message>" and where the options are listed, then exits with status 2. */
EXAMPLE_HELPER void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", example_program);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(build/%s --help lists the options)\n", example_program);
    va_end(ap);
    exit(2);
}

EXAMPLE_HELPER long arg_int(const char *flag, const char *text, long lo, long hi) {
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < lo || v > hi) die_usage("%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, text);
    return v;
}

EXAMPLE_HELPER float arg_float(const char *flag, const char *text) {
    char *end;
    double v = strtod(text, &end);
    if (!*text || *end || !(v >= 0) || !isfinite(v)) die_usage("%s needs a number >= 0, got '%s'", flag, text);
    return (float)v;
}

/* The index + first of text in the NULL-terminated names, or a usage error listing them. */
EXAMPLE_HELPER int arg_choice(const char *flag, const char *text, const char *const *names, int first) {
    char list[128] = "";
    for (int i = 0; names[i]; i++) {
        if (strcmp(text, names[i]) == 0) return first + i;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    }
    die_usage("%s: unknown value '%s' (choose one of %s)", flag, text, list);
    return 0;
}

#endif
