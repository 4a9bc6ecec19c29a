/*
 * selftest.c - exercises tests/unity (or real Unity 2.7) and shows its
 * output: PASS lines, FAIL lines with Unity's messages, IGNORE lines and
 * the summary.  Most tests here fail on purpose, one failure kind each.
 *
 * Exit status: 0 when exactly SELFTEST_EXPECTED_FAILURES tests failed and
 * the runner's own checks (test_runner_bookkeeping) passed, 1 otherwise.
 * Compiles as C99/C11 and as C++ (g++ -x c++).
 */
#include "unity.h"

#include <stdint.h>
#include <string.h>

#define SELFTEST_EXPECTED_FAILURES 42

static int teardown_calls;
static int after_failure_ran;   /* set by code that must never run */
static int fail_in_teardown;

void setUp(void) { }

void tearDown(void)
{
    teardown_calls++;
    if (fail_in_teardown) {
        fail_in_teardown = 0;
        TEST_FAIL_MESSAGE("failed in tearDown");
    }
}

/* ---- everything passes -------------------------------------------------- */
static void test_all_assertions_pass(void)
{
    int ints[3] = {1, -2, 3};
    int ints2[3] = {1, -2, 3};
    float floats[2] = {1.5f, -0.25f};
    float floats2[2] = {1.5f, -0.25f};
    unsigned char mem[4] = {1, 2, 3, 4};
    const char *nothing = NULL;
    const char *text = "abc";

    TEST_MESSAGE("messages appear on their own INFO line");
    TEST_ASSERT(1);
    TEST_ASSERT_TRUE(2 > 1);
    TEST_ASSERT_FALSE(0);
    TEST_ASSERT_NULL(nothing);
    TEST_ASSERT_NOT_NULL(text);
    TEST_ASSERT_EQUAL(5, 5);
    TEST_ASSERT_NOT_EQUAL(5, 6);
    TEST_ASSERT_EQUAL_INT(-7, -7);
    TEST_ASSERT_EQUAL_INT32(-70000, -70000);
    TEST_ASSERT_EQUAL_INT64(-5000000000LL, -5000000000LL);
    TEST_ASSERT_EQUAL_UINT(7u, 7u);
    TEST_ASSERT_EQUAL_UINT8(300, 44);          /* both truncate to 44 */
    TEST_ASSERT_EQUAL_UINT16(65535u, 65535u);
    TEST_ASSERT_EQUAL_UINT32(4000000000u, 4000000000u);
    TEST_ASSERT_EQUAL_UINT64(18000000000000000000ULL, 18000000000000000000ULL);
    TEST_ASSERT_EQUAL_size_t(sizeof(int), sizeof(int));
    TEST_ASSERT_EQUAL_HEX8(0xAB, 0xAB);
    TEST_ASSERT_EQUAL_HEX16(0xABCD, 0xABCD);
    TEST_ASSERT_EQUAL_HEX32(0xDEADBEEFu, 0xDEADBEEFu);
    TEST_ASSERT_EQUAL_HEX64(0x0123456789ABCDEFULL, 0x0123456789ABCDEFULL);
    TEST_ASSERT_GREATER_THAN(5, 6);
    TEST_ASSERT_GREATER_OR_EQUAL(5, 5);
    TEST_ASSERT_LESS_THAN(5, 4);
    TEST_ASSERT_LESS_OR_EQUAL(5, 5);
    TEST_ASSERT_INT_WITHIN(2, 10, 12);
    TEST_ASSERT_UINT_WITHIN(2u, 10u, 8u);
    TEST_ASSERT_FLOAT_WITHIN(0.1f, 1.0f, 1.05f);
    TEST_ASSERT_EQUAL_FLOAT(3.25f, 3.25f);
    TEST_ASSERT_EQUAL_PTR(text, text);
    TEST_ASSERT_EQUAL_STRING("abc", text);
    TEST_ASSERT_EQUAL_MEMORY(mem, mem, sizeof mem);
    TEST_ASSERT_EQUAL_INT_ARRAY(ints, ints2, 3);
    TEST_ASSERT_EQUAL_FLOAT_ARRAY(floats, floats2, 2);

    TEST_ASSERT_MESSAGE(1, "m");
    TEST_ASSERT_TRUE_MESSAGE(1, "m");
    TEST_ASSERT_FALSE_MESSAGE(0, "m");
    TEST_ASSERT_NULL_MESSAGE(nothing, "m");
    TEST_ASSERT_NOT_NULL_MESSAGE(text, "m");
    TEST_ASSERT_EQUAL_MESSAGE(1, 1, "m");
    TEST_ASSERT_NOT_EQUAL_MESSAGE(1, 2, "m");
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, 1, "m");
    TEST_ASSERT_EQUAL_INT32_MESSAGE(1, 1, "m");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(1, 1, "m");
    TEST_ASSERT_EQUAL_UINT_MESSAGE(1u, 1u, "m");
    TEST_ASSERT_EQUAL_UINT8_MESSAGE(1u, 1u, "m");
    TEST_ASSERT_EQUAL_UINT16_MESSAGE(1u, 1u, "m");
    TEST_ASSERT_EQUAL_UINT32_MESSAGE(1u, 1u, "m");
    TEST_ASSERT_EQUAL_UINT64_MESSAGE(1u, 1u, "m");
    TEST_ASSERT_EQUAL_size_t_MESSAGE(sizeof(char), 1u, "m");
    TEST_ASSERT_EQUAL_HEX8_MESSAGE(1, 1, "m");
    TEST_ASSERT_EQUAL_HEX16_MESSAGE(1, 1, "m");
    TEST_ASSERT_EQUAL_HEX32_MESSAGE(1, 1, "m");
    TEST_ASSERT_EQUAL_HEX64_MESSAGE(1, 1, "m");
    TEST_ASSERT_GREATER_THAN_MESSAGE(1, 2, "m");
    TEST_ASSERT_GREATER_OR_EQUAL_MESSAGE(1, 1, "m");
    TEST_ASSERT_LESS_THAN_MESSAGE(2, 1, "m");
    TEST_ASSERT_LESS_OR_EQUAL_MESSAGE(1, 1, "m");
    TEST_ASSERT_INT_WITHIN_MESSAGE(1, 5, 4, "m");
    TEST_ASSERT_UINT_WITHIN_MESSAGE(1u, 5u, 6u, "m");
    TEST_ASSERT_FLOAT_WITHIN_MESSAGE(0.5f, 1.0f, 1.25f, "m");
    TEST_ASSERT_EQUAL_FLOAT_MESSAGE(-2.0f, -2.0f, "m");
    TEST_ASSERT_EQUAL_PTR_MESSAGE(nothing, NULL, "m");
    TEST_ASSERT_EQUAL_STRING_MESSAGE(nothing, nothing, "m");
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE("ab", "ab", 2, "m");
    TEST_ASSERT_EQUAL_INT_ARRAY_MESSAGE(ints, ints, 3, "m");
    TEST_ASSERT_EQUAL_FLOAT_ARRAY_MESSAGE(floats, floats2, 2, "m");
}

/* ---- one failure each --------------------------------------------------- */
static void test_fail_assert(void)    { TEST_ASSERT(1 == 2); }
static void test_fail_true(void)      { TEST_ASSERT_TRUE(0); }
static void test_fail_false(void)     { TEST_ASSERT_FALSE(1); }
static void test_fail_null(void)      { TEST_ASSERT_NULL("x"); }
static void test_fail_not_null(void)  { const char *p = NULL; TEST_ASSERT_NOT_NULL(p); }
static void test_fail_equal(void)     { TEST_ASSERT_EQUAL(5, 6); }
static void test_fail_not_equal(void) { TEST_ASSERT_NOT_EQUAL(3, 3); }
static void test_fail_int(void)       { TEST_ASSERT_EQUAL_INT(5, 6); }
static void test_fail_int32(void)     { TEST_ASSERT_EQUAL_INT32(-1, 2147483647); }
static void test_fail_int64(void)     { TEST_ASSERT_EQUAL_INT64(-5000000000LL, 5000000000LL); }
static void test_fail_uint(void)      { TEST_ASSERT_EQUAL_UINT(1u, 4000000000u); }
static void test_fail_uint8(void)     { TEST_ASSERT_EQUAL_UINT8(255, -2); }
static void test_fail_uint16(void)    { TEST_ASSERT_EQUAL_UINT16(1, 65535); }
static void test_fail_uint32(void)    { TEST_ASSERT_EQUAL_UINT32(0, -1); }
static void test_fail_uint64(void)    { TEST_ASSERT_EQUAL_UINT64(1, 18446744073709551615ULL); }
static void test_fail_size_t(void)    { TEST_ASSERT_EQUAL_size_t(3, strlen("four")); }
static void test_fail_hex8(void)      { TEST_ASSERT_EQUAL_HEX8(0x0A, 0xFB); }
static void test_fail_hex16(void)     { TEST_ASSERT_EQUAL_HEX16(0x12, 0xBEEF); }
static void test_fail_hex32(void)     { TEST_ASSERT_EQUAL_HEX32(0xDEADBEEFu, 0x1u); }
static void test_fail_hex64(void)     { TEST_ASSERT_EQUAL_HEX64(0xFFFFFFFFFFFFFFFFULL, 0xAULL); }
static void test_fail_greater_than(void)     { TEST_ASSERT_GREATER_THAN(5, 3); }
static void test_fail_greater_or_equal(void) { TEST_ASSERT_GREATER_OR_EQUAL(5, 4); }
static void test_fail_less_than(void)        { TEST_ASSERT_LESS_THAN(5, 5); }
static void test_fail_less_or_equal(void)    { TEST_ASSERT_LESS_OR_EQUAL(-5, 7); }
static void test_fail_int_within(void)       { TEST_ASSERT_INT_WITHIN(2, 10, 15); }
static void test_fail_uint_within(void)      { TEST_ASSERT_UINT_WITHIN(3u, 100u, 90u); }
static void test_fail_float_within(void)     { TEST_ASSERT_FLOAT_WITHIN(0.25f, 1.5f, 2.5f); }
static void test_fail_equal_float(void)      { TEST_ASSERT_EQUAL_FLOAT(0.1f, 123456789.0f); }

static void test_fail_float_array(void)
{
    float e[3] = {1.0f, 2.0f, -3.5f};
    float a[3] = {1.0f, 2.0f, -3.25f};
    TEST_ASSERT_EQUAL_FLOAT_ARRAY(e, a, 3);
}

static void test_fail_ptr(void)
{
    TEST_ASSERT_EQUAL_PTR((const void *)(uintptr_t)0x1234, (const void *)(uintptr_t)0xBEEF);
}

static void test_fail_string(void)        { TEST_ASSERT_EQUAL_STRING("abc", "abd"); }
static void test_fail_string_length(void) { TEST_ASSERT_EQUAL_STRING("line\n", "line"); }
static void test_fail_string_null(void)   { TEST_ASSERT_EQUAL_STRING(NULL, "abc"); }

static void test_fail_memory(void)
{
    const unsigned char e[4] = {1, 2, 3, 4};
    const unsigned char a[4] = {1, 2, 0xF3, 4};
    TEST_ASSERT_EQUAL_MEMORY(e, a, sizeof e);
}

static void test_fail_int_array(void)
{
    int e[4] = {1, 2, 3, 4};
    int a[4] = {1, 2, 3, -4};
    TEST_ASSERT_EQUAL_INT_ARRAY(e, a, 4);
}

static void test_fail_int_array_empty(void)
{
    int e[1] = {1};
    TEST_ASSERT_EQUAL_INT_ARRAY(e, e, 0);
}

static void test_fail_plain(void)      { TEST_FAIL(); }
static void test_fail_with_message(void) { TEST_FAIL_MESSAGE("boom"); }

static void test_fail_equal_int_message(void)
{
    TEST_ASSERT_EQUAL_INT_MESSAGE(5, 6, "user message");
}

static void test_fail_true_message(void)
{
    TEST_ASSERT_TRUE_MESSAGE(0, "only the user message");
}

static void test_fail_stops_the_test(void)
{
    TEST_ASSERT_EQUAL_INT(1, 2);
    after_failure_ran = 1;
}

static void test_fail_in_teardown(void) { fail_in_teardown = 1; }

/* ---- ignore and pass ---------------------------------------------------- */
static void test_ignore(void)
{
    TEST_IGNORE();
}

static void test_ignore_message(void)
{
    TEST_IGNORE_MESSAGE("not ready yet");
}

static void test_pass_ends_test(void)
{
    TEST_PASS();
}

static void test_pass_message(void)
{
    TEST_PASS_MESSAGE("passed early");
}

/* ---- the runner itself --------------------------------------------------- */
static void test_runner_bookkeeping(void)
{
    TEST_ASSERT_FALSE_MESSAGE(after_failure_ran, "code after a failure ran");
    /* every test before this one ran tearDown exactly once */
    TEST_ASSERT_EQUAL_INT_MESSAGE(47, teardown_calls, "tearDown count");
}

int main(void)
{
    int failures;

    UNITY_BEGIN();
    RUN_TEST(test_all_assertions_pass);
    RUN_TEST(test_fail_assert);
    RUN_TEST(test_fail_true);
    RUN_TEST(test_fail_false);
    RUN_TEST(test_fail_null);
    RUN_TEST(test_fail_not_null);
    RUN_TEST(test_fail_equal);
    RUN_TEST(test_fail_not_equal);
    RUN_TEST(test_fail_int);
    RUN_TEST(test_fail_int32);
    RUN_TEST(test_fail_int64);
    RUN_TEST(test_fail_uint);
    RUN_TEST(test_fail_uint8);
    RUN_TEST(test_fail_uint16);
    RUN_TEST(test_fail_uint32);
    RUN_TEST(test_fail_uint64);
    RUN_TEST(test_fail_size_t);
    RUN_TEST(test_fail_hex8);
    RUN_TEST(test_fail_hex16);
    RUN_TEST(test_fail_hex32);
    RUN_TEST(test_fail_hex64);
    RUN_TEST(test_fail_greater_than);
    RUN_TEST(test_fail_greater_or_equal);
    RUN_TEST(test_fail_less_than);
    RUN_TEST(test_fail_less_or_equal);
    RUN_TEST(test_fail_int_within);
    RUN_TEST(test_fail_uint_within);
    RUN_TEST(test_fail_float_within);
    RUN_TEST(test_fail_equal_float);
    RUN_TEST(test_fail_float_array);
    RUN_TEST(test_fail_ptr);
    RUN_TEST(test_fail_string);
    RUN_TEST(test_fail_string_length);
    RUN_TEST(test_fail_string_null);
    RUN_TEST(test_fail_memory);
    RUN_TEST(test_fail_int_array);
    RUN_TEST(test_fail_int_array_empty);
    RUN_TEST(test_fail_plain);
    RUN_TEST(test_fail_with_message);
    RUN_TEST(test_fail_equal_int_message);
    RUN_TEST(test_fail_true_message);
    RUN_TEST(test_fail_stops_the_test);
    RUN_TEST(test_fail_in_teardown);
    RUN_TEST(test_ignore);
    RUN_TEST(test_ignore_message);
    RUN_TEST(test_pass_ends_test);
    RUN_TEST(test_pass_message);
    RUN_TEST(test_runner_bookkeeping);
    failures = UNITY_END();
    return failures == SELFTEST_EXPECTED_FAILURES ? 0 : 1;
}
