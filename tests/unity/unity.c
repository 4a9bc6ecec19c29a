/*
 * unity.c - runner and assertion back end for tests/unity/unity.h.
 *
 * An independent implementation of the Unity 2.7 default output format:
 *
 *   FILE:LINE:TEST:PASS
 *   FILE:LINE:TEST:FAIL: Expected 5 Was 6. user message
 *   FILE:LINE:TEST:IGNORE: message
 *
 *   -----------------------
 *   N Tests M Failures K Ignored
 *   OK | FAIL
 *
 * A failing assertion longjmps out of the test; tearDown() still runs.
 */
#include "unity.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef UNITY_FLOAT_PRECISION
#define UNITY_FLOAT_PRECISION (0.00001f)
#endif
/* Separator before a user message (Unity 2.7's UnityStrSpacer). */
#ifndef UNITY_FAILURE_DETAIL_SEPARATOR /* Unity's fixed UnityStrSpacer */
#define UNITY_FAILURE_DETAIL_SEPARATOR ". "
#endif

/* The only global state: one static struct, as Unity has one. */
static struct {
    const char *file;        /* file given to UnityBegin() */
    const char *test;        /* name of the running test */
    unity__line_t test_line; /* line of its RUN_TEST */
    unsigned long tests, failures, ignores;
    int failed, ignored;     /* state of the running test */
    int protected_;          /* abort_frame is valid */
    jmp_buf abort_frame;
} S;

/*--------------------------------------------------------------------------
 * Output
 *------------------------------------------------------------------------*/
static void put(const char *s) { fputs(s, stdout); }

/* A string as Unity prints it: printable ASCII as is, CR and LF as \r and
 * \n, anything else as \xHH. */
static void put_escaped(const char *s)
{
    for (; s != NULL && *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 32 && c <= 126)
            putchar(c);
        else if (c == '\r')
            put("\\r");
        else if (c == '\n')
            put("\\n");
        else
            printf("\\x%02X", c);
    }
}

static void put_int(long long v) { printf("%lld", v); }
static void put_uint(unsigned long long v) { printf("%llu", v); }

/* hex_digits == 0: unsigned decimal; otherwise 0x and that many digits. */
static void put_unsigned(unsigned long long v, int hex_digits)
{
    if (hex_digits == 0) {
        put_uint(v);
        return;
    }
    if (hex_digits < 16)
        v &= (1ULL << (4 * hex_digits)) - 1;
    printf("0x%0*llX", hex_digits, v);
}

/* Floats as Unity prints them without UNITY_INCLUDE_DOUBLE: like "%.7g",
 * with magnitudes below the float precision shown as 0. */
static void put_float(float f)
{
    char buf[40];
    if ((f < 0.0f ? -f : f) < UNITY_FLOAT_PRECISION) {
        put("0");
    } else if (isnan(f)) {
        put("NaN");
    } else if (isinf(f)) {
        put(f < 0.0f ? "Negative Infinity" : "Infinity");
    } else {
        snprintf(buf, sizeof buf, "%.7g", (double)f);
        put(buf);
    }
}

/* "FILE:LINE:TEST:" */
static void begin_line(unity__line_t line)
{
    put_escaped(S.file);
    printf(":%lu:", line);
    put_escaped(S.test);
    putchar(':');
}

/* "FILE:LINE:TEST:FAIL:" -- the details that follow start with a space. */
static void begin_fail(unity__line_t line)
{
    begin_line(line);
    put("FAIL:");
}

static void add_message(const char *msg)
{
    if (msg != NULL) {
        put(UNITY_FAILURE_DETAIL_SEPARATOR);
        put_escaped(msg);
    }
}

/*--------------------------------------------------------------------------
 * Control flow
 *------------------------------------------------------------------------*/
static UNITY__NORETURN void bail(void)
{
    fflush(stdout);
    if (!S.protected_) {
        put("\nunity: assertion outside RUN_TEST\n");
        fflush(stdout);
        abort();
    }
    longjmp(S.abort_frame, 1);
}

static UNITY__NORETURN void fail_and_bail(const char *msg)
{
    add_message(msg);
    S.failed = 1;
    bail();
}

/* Like Unity, an assertion made after the test already failed or was
 * ignored (e.g. in tearDown) ends that function silently. */
static void skip_if_done(void)
{
    if (S.failed || S.ignored)
        bail();
}

void unity__fail(const char *msg, unity__line_t line)
{
    skip_if_done();
    begin_line(line);
    put("FAIL");
    fail_and_bail(msg);
}

void unity__ignore(const char *msg, unity__line_t line)
{
    skip_if_done();
    begin_line(line);
    put("IGNORE");
    if (msg != NULL) {
        put(": ");
        put_escaped(msg);
    }
    S.ignored = 1;
    bail();
}

void unity__pass(void) { bail(); }

void unity__message(const char *msg, unity__line_t line)
{
    begin_line(line);
    put("INFO");
    if (msg != NULL) {
        put(": ");
        put_escaped(msg);
    }
    putchar('\n');
}

void UnityBegin(const char *filename)
{
    memset(&S, 0, sizeof S);
    S.file = filename;
}

static void conclude_test(void)
{
    if (S.ignored) {
        S.ignores++;
    } else if (!S.failed) {
        begin_line(S.test_line);
        put("PASS");
    } else {
        S.failures++;
    }
    S.failed = S.ignored = 0;
    putchar('\n');
    fflush(stdout); /* so a test that forks does not duplicate output */
}

void UnityDefaultTestRun(UnityTestFunction Func, const char *FuncName,
                         const int FuncLineNum)
{
    S.test = FuncName;
    S.test_line = (unity__line_t)FuncLineNum;
    S.tests++;
    S.protected_ = 1;
    if (setjmp(S.abort_frame) == 0) {
        setUp();
        Func();
    }
    if (setjmp(S.abort_frame) == 0)
        tearDown();
    S.protected_ = 0;
    conclude_test();
}

int UnityEnd(void)
{
    printf("\n-----------------------\n%lu Tests %lu Failures %lu Ignored \n",
           S.tests, S.failures, S.ignores);
    put(S.failures == 0 ? "OK\n" : "FAIL\n");
    fflush(stdout);
    return (int)S.failures;
}

/*--------------------------------------------------------------------------
 * Assertions
 *------------------------------------------------------------------------*/
void unity__int(long long expected, long long actual,
                const char *msg, unity__line_t line)
{
    skip_if_done();
    if (expected == actual)
        return;
    begin_fail(line);
    put(" Expected ");
    put_int(expected);
    put(" Was ");
    put_int(actual);
    fail_and_bail(msg);
}

void unity__uint(unsigned long long expected, unsigned long long actual,
                 int hex_digits, const char *msg, unity__line_t line)
{
    skip_if_done();
    if (expected == actual)
        return;
    begin_fail(line);
    put(" Expected ");
    put_unsigned(expected, hex_digits);
    put(" Was ");
    put_unsigned(actual, hex_digits);
    fail_and_bail(msg);
}

void unity__compare(long long threshold, long long actual, int how,
                    const char *msg, unity__line_t line)
{
    int ok_equal = how & 1, greater = how & 2;
    int ok = actual == threshold ? ok_equal
           : greater ? actual > threshold : actual < threshold;
    skip_if_done();
    if (ok)
        return;
    begin_fail(line);
    put(" Expected ");
    put_int(actual);
    put(greater ? " to be greater than " : " to be less than ");
    if (ok_equal)
        put("or equal to ");
    put_int(threshold);
    fail_and_bail(msg);
}

static void within_fail_head(unity__line_t line) /* up to the delta */
{
    begin_fail(line);
    put(" Values Not Within Delta ");
}

void unity__int_within(unsigned long long delta, long long expected,
                       long long actual, const char *msg, unity__line_t line)
{
    unsigned long long diff = actual > expected
        ? (unsigned long long)actual - (unsigned long long)expected
        : (unsigned long long)expected - (unsigned long long)actual;
    skip_if_done();
    if (diff <= delta)
        return;
    within_fail_head(line);
    put_int((long long)delta);
    put(" Expected ");
    put_int(expected);
    put(" Was ");
    put_int(actual);
    fail_and_bail(msg);
}

void unity__uint_within(unsigned long long delta, unsigned long long expected,
                        unsigned long long actual, const char *msg,
                        unity__line_t line)
{
    unsigned long long diff = actual > expected ? actual - expected
                                                : expected - actual;
    skip_if_done();
    if (diff <= delta)
        return;
    within_fail_head(line);
    put_uint(delta);
    put(" Expected ");
    put_uint(expected);
    put(" Was ");
    put_uint(actual);
    fail_and_bail(msg);
}

/* Unity's float closeness rule: equal infinities and two NaNs match;
 * otherwise |actual - expected| must be finite and <= |delta|. */
static int floats_close(float delta, float expected, float actual)
{
    float diff;
    if (isinf(expected) && isinf(actual) && ((expected < 0) == (actual < 0)))
        return 1;
    if (isnan(expected) && isnan(actual))
        return 1;
    diff = actual - expected;
    if (diff < 0)
        diff = -diff;
    if (delta < 0)
        delta = -delta;
    return !(isnan(diff) || isinf(diff) || diff > delta);
}

static void float_fail_tail(float expected, float actual, const char *msg)
{
    put(" Expected ");
    put_float(expected);
    put(" Was ");
    put_float(actual);
    fail_and_bail(msg);
}

void unity__float_within(float delta, float expected, float actual,
                         const char *msg, unity__line_t line)
{
    skip_if_done();
    if (floats_close(delta, expected, actual))
        return;
    begin_fail(line);
    float_fail_tail(expected, actual, msg);
}

void unity__float_equal(float expected, float actual,
                        const char *msg, unity__line_t line)
{
    unity__float_within(expected * UNITY_FLOAT_PRECISION, expected, actual,
                        msg, line);
}

void unity__string(const char *expected, const char *actual,
                   const char *msg, unity__line_t line)
{
    size_t i = 0;
    skip_if_done();
    if (expected != NULL && actual != NULL) {
        while (expected[i] == actual[i] && expected[i] != '\0')
            i++;
        if (expected[i] == actual[i])
            return;
    } else if (expected == actual) {
        return;
    }
    begin_fail(line);
    put(" Expected ");
    if (expected != NULL) { putchar('\''); put_escaped(expected); putchar('\''); }
    else put("NULL");
    put(" Was ");
    if (actual != NULL) { putchar('\''); put_escaped(actual); putchar('\''); }
    else put("NULL");
    fail_and_bail(msg);
}

#define UNITY__POINTLESS " You Asked Me To Compare Nothing, Which Was Pointless."

/* Shared checks for array-like assertions; returns 1 when there is nothing
 * left to compare (same pointer), fails the test on NULL or zero length. */
static int array_preamble(const void *expected, const void *actual, size_t n,
                          const char *msg, unity__line_t line)
{
    skip_if_done();
    if (n == 0) {
        begin_fail(line);
        put(UNITY__POINTLESS);
        fail_and_bail(msg);
    }
    if (expected == actual)
        return 1;
    if (expected == NULL || actual == NULL) {
        begin_fail(line);
        put(expected == NULL ? " Expected pointer to be NULL"
                             : " Actual pointer was NULL");
        fail_and_bail(msg);
    }
    return 0;
}

void unity__memory(const void *expected, const void *actual, size_t len,
                   const char *msg, unity__line_t line)
{
    const unsigned char *e = (const unsigned char *)expected;
    const unsigned char *a = (const unsigned char *)actual;
    size_t i;
    if (array_preamble(expected, actual, len, msg, line))
        return;
    for (i = 0; i < len; i++) {
        if (e[i] != a[i]) {
            begin_fail(line);
            printf(" Memory Mismatch. Byte %lu Expected 0x%02X Was 0x%02X",
                   (unsigned long)i, e[i], a[i]);
            fail_and_bail(msg);
        }
    }
}

void unity__int_array(const void *expected, const void *actual, size_t count,
                      const char *msg, unity__line_t line)
{
    const int *e = (const int *)expected;
    const int *a = (const int *)actual;
    size_t i;
    if (array_preamble(expected, actual, count, msg, line))
        return;
    for (i = 0; i < count; i++) {
        if (e[i] != a[i]) {
            begin_fail(line);
            printf(" Element %lu Expected %d Was %d", (unsigned long)i, e[i], a[i]);
            fail_and_bail(msg);
        }
    }
}

void unity__float_array(const float *expected, const float *actual,
                        size_t count, const char *msg, unity__line_t line)
{
    size_t i;
    if (array_preamble(expected, actual, count, msg, line))
        return;
    for (i = 0; i < count; i++) {
        float delta = expected[i] * UNITY_FLOAT_PRECISION;
        if (!floats_close(delta < 0 ? -delta : delta, expected[i], actual[i])) {
            begin_fail(line);
            printf(" Element %lu", (unsigned long)i);
            float_fail_tail(expected[i], actual[i], msg);
        }
    }
}
