/*
 * unity.h - a small, independent stand-in for the subset of the Unity
 * (ThrowTheSwitch) 2.7 test API that this project's tests use.
 *
 * Test files written against this header compile unchanged against real
 * Unity 2.7 (src/unity.h + src/unity.c), and the runner prints results in
 * Unity 2.7's default output format.  See README.md for the macro list and
 * for the few places where the output may differ from real Unity.
 *
 * This is not Unity's code: it is a separate implementation of the same
 * public API (macro names, argument order, semantics, output format).
 */
#ifndef UNITY_FRAMEWORK_H
#define UNITY_FRAMEWORK_H
#define UNITY

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define UNITY__NORETURN __attribute__((noreturn))
#else
#define UNITY__NORETURN
#endif

/* Provided by the test file. */
void setUp(void);
void tearDown(void);

/*---------------------------------------------------------------------------
 * Runner (same names and signatures as Unity)
 *-------------------------------------------------------------------------*/
typedef void (*UnityTestFunction)(void);

void UnityBegin(const char *filename);
int  UnityEnd(void);
void UnityDefaultTestRun(UnityTestFunction Func, const char *FuncName,
                         const int FuncLineNum);

#define UNITY_BEGIN() UnityBegin(__FILE__)
#define UNITY_END()   UnityEnd()

/* Like Unity: RUN_TEST(func) or RUN_TEST(func, line) when variadic macros
 * are available (C99 and later), only RUN_TEST(func) otherwise (C++). */
#ifndef UNITY_SUPPORT_VARIADIC_MACROS
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L
#define UNITY_SUPPORT_VARIADIC_MACROS
#endif
#endif
#ifdef UNITY_SUPPORT_VARIADIC_MACROS
#define RUN_TEST(...) RUN_TEST_AT_LINE(__VA_ARGS__, __LINE__, throwaway)
#define RUN_TEST_AT_LINE(func, line, ...) UnityDefaultTestRun(func, #func, line)
#else
#define RUN_TEST(func) UnityDefaultTestRun(func, #func, __LINE__)
#endif

/*---------------------------------------------------------------------------
 * Private helpers (called only through the macros below)
 *-------------------------------------------------------------------------*/
typedef unsigned long unity__line_t;

UNITY__NORETURN void unity__fail(const char *msg, unity__line_t line);
UNITY__NORETURN void unity__ignore(const char *msg, unity__line_t line);
UNITY__NORETURN void unity__pass(void);
void unity__message(const char *msg, unity__line_t line);
void unity__int(long long expected, long long actual,
                const char *msg, unity__line_t line);
void unity__uint(unsigned long long expected, unsigned long long actual,
                 int hex_digits, const char *msg, unity__line_t line);
void unity__compare(long long threshold, long long actual, int how,
                    const char *msg, unity__line_t line);
void unity__int_within(unsigned long long delta, long long expected,
                       long long actual, const char *msg, unity__line_t line);
void unity__uint_within(unsigned long long delta, unsigned long long expected,
                        unsigned long long actual, const char *msg,
                        unity__line_t line);
void unity__float_within(float delta, float expected, float actual,
                         const char *msg, unity__line_t line);
void unity__float_equal(float expected, float actual,
                        const char *msg, unity__line_t line);
void unity__string(const char *expected, const char *actual,
                   const char *msg, unity__line_t line);
void unity__memory(const void *expected, const void *actual, size_t len,
                   const char *msg, unity__line_t line);
void unity__int_array(const void *expected, const void *actual, size_t count,
                      const char *msg, unity__line_t line);
void unity__float_array(const float *expected, const float *actual,
                        size_t count, const char *msg, unity__line_t line);

/* how for unity__compare: bit 1 = greater than, bit 2 = less than,
 * bit 0 = or equal (Unity's comparison encoding). */
#define UNITY__GT 2
#define UNITY__GE 3
#define UNITY__LT 4
#define UNITY__LE 5

#define UNITY__ASSERT(cond, line, msg) \
    do { if (cond) { } else { unity__fail((msg), (unity__line_t)(line)); } } while (0)

#define UNITY__I(e, a, T, l, m)  unity__int((long long)(T)(e), (long long)(T)(a), (m), (l))
#define UNITY__U(e, a, T, h, l, m) \
    unity__uint((unsigned long long)(T)(e), (unsigned long long)(T)(a), (h), (m), (l))
#define UNITY__CMP(t, a, how, l, m) \
    unity__compare((long long)(t), (long long)(a), (how), (m), (l))
#define UNITY__PTR(e, a, l, m) \
    unity__uint((unsigned long long)(uintptr_t)(e), (unsigned long long)(uintptr_t)(a), \
                (int)(2 * sizeof(void *)), (m), (l))

/*---------------------------------------------------------------------------
 * Fail, ignore, pass, message
 *-------------------------------------------------------------------------*/
#define TEST_FAIL()                  unity__fail(NULL, __LINE__)
#define TEST_FAIL_MESSAGE(message)   unity__fail((message), __LINE__)
#define TEST_IGNORE()                unity__ignore(NULL, __LINE__)
#define TEST_IGNORE_MESSAGE(message) unity__ignore((message), __LINE__)
#define TEST_MESSAGE(message)        unity__message((message), __LINE__)
#define TEST_PASS()                  unity__pass()
#define TEST_PASS_MESSAGE(message) \
    do { unity__message((message), __LINE__); unity__pass(); } while (0)

/*---------------------------------------------------------------------------
 * Assertions (argument order as Unity: expected first, then actual;
 * threshold first for GREATER/LESS; delta first for WITHIN)
 *-------------------------------------------------------------------------*/
#define TEST_ASSERT(c)          UNITY__ASSERT((c), __LINE__, " Expression Evaluated To FALSE")
#define TEST_ASSERT_TRUE(c)     UNITY__ASSERT((c), __LINE__, " Expected TRUE Was FALSE")
#define TEST_ASSERT_FALSE(c)    UNITY__ASSERT(!(c), __LINE__, " Expected FALSE Was TRUE")
#define TEST_ASSERT_NULL(p)     UNITY__ASSERT(((p) == NULL), __LINE__, " Expected NULL")
#define TEST_ASSERT_NOT_NULL(p) UNITY__ASSERT(((p) != NULL), __LINE__, " Expected Non-NULL")

#define TEST_ASSERT_MESSAGE(c, m)          UNITY__ASSERT((c), __LINE__, (m))
#define TEST_ASSERT_TRUE_MESSAGE(c, m)     UNITY__ASSERT((c), __LINE__, (m))
#define TEST_ASSERT_FALSE_MESSAGE(c, m)    UNITY__ASSERT(!(c), __LINE__, (m))
#define TEST_ASSERT_NULL_MESSAGE(p, m)     UNITY__ASSERT(((p) == NULL), __LINE__, (m))
#define TEST_ASSERT_NOT_NULL_MESSAGE(p, m) UNITY__ASSERT(((p) != NULL), __LINE__, (m))

/* Unity's default ("old") shorthand. */
#define TEST_ASSERT_EQUAL(e, a)     UNITY__I(e, a, long long, __LINE__, NULL)
#define TEST_ASSERT_NOT_EQUAL(e, a) UNITY__ASSERT(((e) != (a)), __LINE__, " Expected Not-Equal")
#define TEST_ASSERT_EQUAL_MESSAGE(e, a, m)     UNITY__I(e, a, long long, __LINE__, (m))
#define TEST_ASSERT_NOT_EQUAL_MESSAGE(e, a, m) UNITY__ASSERT(((e) != (a)), __LINE__, (m))

#define TEST_ASSERT_EQUAL_INT(e, a)    UNITY__I(e, a, long long, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_INT32(e, a)  UNITY__I(e, a, int32_t, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_INT64(e, a)  UNITY__I(e, a, int64_t, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_UINT(e, a)   UNITY__U(e, a, unsigned long long, 0, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_UINT8(e, a)  UNITY__U(e, a, uint8_t, 0, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_UINT16(e, a) UNITY__U(e, a, uint16_t, 0, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_UINT32(e, a) UNITY__U(e, a, uint32_t, 0, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_UINT64(e, a) UNITY__U(e, a, uint64_t, 0, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_size_t(e, a) UNITY__U(e, a, unsigned long long, 0, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_HEX8(e, a)   UNITY__U(e, a, uint8_t, 2, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_HEX16(e, a)  UNITY__U(e, a, uint16_t, 4, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_HEX32(e, a)  UNITY__U(e, a, uint32_t, 8, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_HEX64(e, a)  UNITY__U(e, a, uint64_t, 16, __LINE__, NULL)

#define TEST_ASSERT_EQUAL_INT_MESSAGE(e, a, m)    UNITY__I(e, a, long long, __LINE__, (m))
#define TEST_ASSERT_EQUAL_INT32_MESSAGE(e, a, m)  UNITY__I(e, a, int32_t, __LINE__, (m))
#define TEST_ASSERT_EQUAL_INT64_MESSAGE(e, a, m)  UNITY__I(e, a, int64_t, __LINE__, (m))
#define TEST_ASSERT_EQUAL_UINT_MESSAGE(e, a, m)   UNITY__U(e, a, unsigned long long, 0, __LINE__, (m))
#define TEST_ASSERT_EQUAL_UINT8_MESSAGE(e, a, m)  UNITY__U(e, a, uint8_t, 0, __LINE__, (m))
#define TEST_ASSERT_EQUAL_UINT16_MESSAGE(e, a, m) UNITY__U(e, a, uint16_t, 0, __LINE__, (m))
#define TEST_ASSERT_EQUAL_UINT32_MESSAGE(e, a, m) UNITY__U(e, a, uint32_t, 0, __LINE__, (m))
#define TEST_ASSERT_EQUAL_UINT64_MESSAGE(e, a, m) UNITY__U(e, a, uint64_t, 0, __LINE__, (m))
#define TEST_ASSERT_EQUAL_size_t_MESSAGE(e, a, m) UNITY__U(e, a, unsigned long long, 0, __LINE__, (m))
#define TEST_ASSERT_EQUAL_HEX8_MESSAGE(e, a, m)   UNITY__U(e, a, uint8_t, 2, __LINE__, (m))
#define TEST_ASSERT_EQUAL_HEX16_MESSAGE(e, a, m)  UNITY__U(e, a, uint16_t, 4, __LINE__, (m))
#define TEST_ASSERT_EQUAL_HEX32_MESSAGE(e, a, m)  UNITY__U(e, a, uint32_t, 8, __LINE__, (m))
#define TEST_ASSERT_EQUAL_HEX64_MESSAGE(e, a, m)  UNITY__U(e, a, uint64_t, 16, __LINE__, (m))

#define TEST_ASSERT_GREATER_THAN(t, a)     UNITY__CMP(t, a, UNITY__GT, __LINE__, NULL)
#define TEST_ASSERT_GREATER_OR_EQUAL(t, a) UNITY__CMP(t, a, UNITY__GE, __LINE__, NULL)
#define TEST_ASSERT_LESS_THAN(t, a)        UNITY__CMP(t, a, UNITY__LT, __LINE__, NULL)
#define TEST_ASSERT_LESS_OR_EQUAL(t, a)    UNITY__CMP(t, a, UNITY__LE, __LINE__, NULL)
#define TEST_ASSERT_GREATER_THAN_MESSAGE(t, a, m)     UNITY__CMP(t, a, UNITY__GT, __LINE__, (m))
#define TEST_ASSERT_GREATER_OR_EQUAL_MESSAGE(t, a, m) UNITY__CMP(t, a, UNITY__GE, __LINE__, (m))
#define TEST_ASSERT_LESS_THAN_MESSAGE(t, a, m)        UNITY__CMP(t, a, UNITY__LT, __LINE__, (m))
#define TEST_ASSERT_LESS_OR_EQUAL_MESSAGE(t, a, m)    UNITY__CMP(t, a, UNITY__LE, __LINE__, (m))

#define TEST_ASSERT_INT_WITHIN(d, e, a) \
    unity__int_within((unsigned long long)(d), (long long)(e), (long long)(a), NULL, __LINE__)
#define TEST_ASSERT_UINT_WITHIN(d, e, a) \
    unity__uint_within((unsigned long long)(d), (unsigned long long)(e), (unsigned long long)(a), NULL, __LINE__)
#define TEST_ASSERT_INT_WITHIN_MESSAGE(d, e, a, m) \
    unity__int_within((unsigned long long)(d), (long long)(e), (long long)(a), (m), __LINE__)
#define TEST_ASSERT_UINT_WITHIN_MESSAGE(d, e, a, m) \
    unity__uint_within((unsigned long long)(d), (unsigned long long)(e), (unsigned long long)(a), (m), __LINE__)

#define TEST_ASSERT_FLOAT_WITHIN(d, e, a) \
    unity__float_within((float)(d), (float)(e), (float)(a), NULL, __LINE__)
#define TEST_ASSERT_EQUAL_FLOAT(e, a) unity__float_equal((float)(e), (float)(a), NULL, __LINE__)
#define TEST_ASSERT_FLOAT_WITHIN_MESSAGE(d, e, a, m) \
    unity__float_within((float)(d), (float)(e), (float)(a), (m), __LINE__)
#define TEST_ASSERT_EQUAL_FLOAT_MESSAGE(e, a, m) \
    unity__float_equal((float)(e), (float)(a), (m), __LINE__)

#define TEST_ASSERT_EQUAL_PTR(e, a)            UNITY__PTR(e, a, __LINE__, NULL)
#define TEST_ASSERT_EQUAL_PTR_MESSAGE(e, a, m) UNITY__PTR(e, a, __LINE__, (m))
#define TEST_ASSERT_EQUAL_STRING(e, a) \
    unity__string((const char *)(e), (const char *)(a), NULL, __LINE__)
#define TEST_ASSERT_EQUAL_STRING_MESSAGE(e, a, m) \
    unity__string((const char *)(e), (const char *)(a), (m), __LINE__)
#define TEST_ASSERT_EQUAL_MEMORY(e, a, len) \
    unity__memory((const void *)(e), (const void *)(a), (size_t)(len), NULL, __LINE__)
#define TEST_ASSERT_EQUAL_MEMORY_MESSAGE(e, a, len, m) \
    unity__memory((const void *)(e), (const void *)(a), (size_t)(len), (m), __LINE__)

#define TEST_ASSERT_EQUAL_INT_ARRAY(e, a, n) \
    unity__int_array((const void *)(e), (const void *)(a), (size_t)(n), NULL, __LINE__)
#define TEST_ASSERT_EQUAL_INT_ARRAY_MESSAGE(e, a, n, m) \
    unity__int_array((const void *)(e), (const void *)(a), (size_t)(n), (m), __LINE__)
#define TEST_ASSERT_EQUAL_FLOAT_ARRAY(e, a, n) \
    unity__float_array((const float *)(e), (const float *)(a), (size_t)(n), NULL, __LINE__)
#define TEST_ASSERT_EQUAL_FLOAT_ARRAY_MESSAGE(e, a, n, m) \
    unity__float_array((const float *)(e), (const float *)(a), (size_t)(n), (m), __LINE__)

/* TEST_ASSERT_DOUBLE_WITHIN / TEST_ASSERT_EQUAL_DOUBLE are deliberately not
 * provided: real Unity only enables them when built with UNITY_INCLUDE_DOUBLE
 * (double support is off by default).  See README.md. */

#ifdef __cplusplus
}
#endif

#endif /* UNITY_FRAMEWORK_H */
