/* test_dtype.c - specification of fsdp.h's dtypes: f32 <-> bf16 and f32 <-> f16 conversions
   (round to nearest, ties to even; overflow to infinity; NaN stays a quiet NaN with its sign;
   f16 subnormals), fsdp_convert, dtype metadata and result-code strings.

   Expected values are hand-computed bit patterns; the sweeps compare against an independent
   reference that rounds in double precision with rint() (round-half-even in the default mode).

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_dtype.c \
              tests/unity/unity.c -o /tmp/test_dtype -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <float.h>

void setUp(void) {}
void tearDown(void) {}

/* ---------------------------------------------------------------------------------------------
   helpers
   --------------------------------------------------------------------------------------------- */
static int bf16_is_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }
static int f16_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }

/* The value of an f16 bit pattern, from the IEEE 754 binary16 definition. */
static double f16_value_by_definition(uint16_t h) {
    int exponent = (h >> 10) & 0x1F;
    int mantissa = h & 0x3FF;
    double magnitude;
    if (exponent == 0) magnitude = ldexp((double)mantissa, -24);
    else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
    else magnitude = ldexp((double)(mantissa + 1024), exponent - 25);
    return (h & 0x8000u) ? -magnitude : magnitude;
}

/* Reference f32 -> f16 rounding done in double: scale to an integer significand, rint (ties to
   even), and let a carry out of the significand bump the exponent. */
static uint16_t reference_f32_to_f16(float value) {
    uint16_t sign = (uint16_t)((bits_of(value) >> 16) & 0x8000u);
    double magnitude = fabs((double)value);
    int exponent;
    double significand;
    if (isnan(value)) return (uint16_t)(sign | 0x7E00u);
    if (isinf(value)) return (uint16_t)(sign | 0x7C00u);
    if (magnitude < ldexp(1.0, -14)) { /* subnormal range: multiples of 2^-24 */
        significand = rint(ldexp(magnitude, 24));
        return (uint16_t)(sign | (uint16_t)significand); /* 1024 is exactly 0x0400 */
    }
    (void)frexp(magnitude, &exponent);
    exponent -= 1; /* magnitude in [2^exponent, 2^(exponent+1)) */
    significand = rint(ldexp(magnitude, 10 - exponent)); /* in [1024, 2048] */
    if (significand == 2048.0) {
        significand = 1024.0;
        exponent += 1;
    }
    if (exponent + 15 >= 31) return (uint16_t)(sign | 0x7C00u);
    return (uint16_t)(sign | (uint16_t)((exponent + 15) << 10) | (uint16_t)(significand - 1024.0));
}

/* Reference f32 -> bf16 rounding done in double, same method with 8 significant bits. */
static uint16_t reference_f32_to_bf16(float value) {
    uint16_t sign = (uint16_t)((bits_of(value) >> 16) & 0x8000u);
    double magnitude = fabs((double)value);
    int exponent;
    double significand;
    if (isnan(value)) return (uint16_t)(sign | 0x7FC0u);
    if (isinf(value)) return (uint16_t)(sign | 0x7F80u);
    if (magnitude < ldexp(1.0, -126)) { /* subnormal range: multiples of 2^-133 */
        significand = rint(ldexp(magnitude, 133));
        return (uint16_t)(sign | (uint16_t)significand); /* 128 is exactly 0x0080 */
    }
    (void)frexp(magnitude, &exponent);
    exponent -= 1;
    significand = rint(ldexp(magnitude, 7 - exponent)); /* in [128, 256] */
    if (significand == 256.0) {
        significand = 128.0;
        exponent += 1;
    }
    if (exponent + 127 >= 255) return (uint16_t)(sign | 0x7F80u);
    return (uint16_t)(sign | (uint16_t)((exponent + 127) << 7) | (uint16_t)(significand - 128.0));
}

static void assert_f16_of(uint16_t expected, float input, const char *what) {
    char message[160];
    snprintf(message, sizeof message, "%s: f32 0x%08X (%.9g)", what, (unsigned)bits_of(input),
             (double)input);
    TEST_ASSERT_EQUAL_HEX16_MESSAGE(expected, fsdp_f32_to_f16(input), message);
}

static void assert_bf16_of(uint16_t expected, float input, const char *what) {
    char message[160];
    snprintf(message, sizeof message, "%s: f32 0x%08X (%.9g)", what, (unsigned)bits_of(input),
             (double)input);
    TEST_ASSERT_EQUAL_HEX16_MESSAGE(expected, fsdp_f32_to_bf16(input), message);
}

/* f32 -> bf16 must give a quiet NaN (quiet bit 0x0040) with the input's sign. */
static void assert_bf16_quiet_nan_with_sign(uint32_t nan_bits) {
    char message[120];
    uint16_t h = fsdp_f32_to_bf16(float_of(nan_bits));
    snprintf(message, sizeof message, "NaN f32 0x%08X gave bf16 0x%04X", (unsigned)nan_bits, h);
    TEST_ASSERT_TRUE_MESSAGE(bf16_is_nan(h), message);
    TEST_ASSERT_TRUE_MESSAGE((h & 0x0040u) != 0, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE((int)(nan_bits >> 31), (int)(h >> 15), message);
}

static void assert_f16_quiet_nan_with_sign(uint32_t nan_bits) {
    char message[120];
    uint16_t h = fsdp_f32_to_f16(float_of(nan_bits));
    snprintf(message, sizeof message, "NaN f32 0x%08X gave f16 0x%04X", (unsigned)nan_bits, h);
    TEST_ASSERT_TRUE_MESSAGE(f16_is_nan(h), message);
    TEST_ASSERT_TRUE_MESSAGE((h & 0x0200u) != 0, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE((int)(nan_bits >> 31), (int)(h >> 15), message);
}

/* ---------------------------------------------------------------------------------------------
   f32 -> bf16
   --------------------------------------------------------------------------------------------- */
static void test_f32_to_bf16_exactly_representable_values_keep_their_bits(void) {
    assert_bf16_of(0x0000, 0.0f, "zero");
    assert_bf16_of(0x3F80, 1.0f, "one");
    assert_bf16_of(0xC000, -2.0f, "minus two");
    assert_bf16_of(0x3FC0, 1.5f, "one and a half");
    assert_bf16_of(0x4049, float_of(0x40490000u), "3.140625");
    assert_bf16_of(0x7F7F, float_of(0x7F7F0000u), "largest finite bf16");
    assert_bf16_of(0x0080, float_of(0x00800000u), "smallest normal");
}

static void test_f32_to_bf16_tie_with_even_lower_neighbour_rounds_down(void) {
    assert_bf16_of(0x3F80, float_of(0x3F808000u), "1 + 2^-8");
    assert_bf16_of(0xBF80, float_of(0xBF808000u), "-(1 + 2^-8)");
    assert_bf16_of(0x4000, float_of(0x40008000u), "2 + 2^-7");
}

static void test_f32_to_bf16_tie_with_odd_lower_neighbour_rounds_up(void) {
    assert_bf16_of(0x3F82, float_of(0x3F818000u), "1 + 3*2^-8");
    assert_bf16_of(0xBF82, float_of(0xBF818000u), "-(1 + 3*2^-8)");
    assert_bf16_of(0x3F80, float_of(0x3F7F8000u), "tie below one carries into the exponent");
}

static void test_f32_to_bf16_values_off_a_tie_round_to_nearest(void) {
    assert_bf16_of(0x3F81, float_of(0x3F808001u), "just above the tie");
    assert_bf16_of(0x3F80, float_of(0x3F807FFFu), "just below the tie");
    assert_bf16_of(0x3F81, float_of(0x3F81700Fu), "below the tie above an odd value");
    assert_bf16_of(0xBF81, float_of(0xBF808001u), "negative just above the tie");
}

static void test_f32_to_bf16_flt_max_overflows_to_infinity(void) {
    assert_bf16_of(0x7F80, FLT_MAX, "FLT_MAX");
    assert_bf16_of(0xFF80, -FLT_MAX, "-FLT_MAX");
    assert_bf16_of(0x7F80, float_of(0x7F7F8000u), "tie above the largest finite bf16");
    assert_bf16_of(0x7F7F, float_of(0x7F7F7FFFu), "just below that tie");
}

static void test_f32_to_bf16_negative_zero_keeps_its_sign(void) {
    assert_bf16_of(0x8000, -0.0f, "-0.0");
}

static void test_f32_to_bf16_infinities_stay_infinite(void) {
    assert_bf16_of(0x7F80, INFINITY, "+inf");
    assert_bf16_of(0xFF80, -INFINITY, "-inf");
}

static void test_f32_to_bf16_nan_stays_quiet_nan_with_its_sign(void) {
    assert_bf16_quiet_nan_with_sign(0x7FC00000u); /* the default quiet NaN */
    assert_bf16_quiet_nan_with_sign(0xFFC00000u);
    assert_bf16_quiet_nan_with_sign(0x7F800001u); /* signalling, payload only in the low bits */
    assert_bf16_quiet_nan_with_sign(0xFF800001u);
    assert_bf16_quiet_nan_with_sign(0x7FFFFFFFu); /* rounding this up naively would carry out */
    assert_bf16_quiet_nan_with_sign(0xFFFFFFFFu);
    assert_bf16_quiet_nan_with_sign(0x7F80FFFFu);
}

static void test_f32_to_bf16_subnormals_round_to_nearest_even(void) {
    assert_bf16_of(0x0001, float_of(0x00010000u), "smallest bf16 subnormal");
    assert_bf16_of(0x007F, float_of(0x007F0000u), "largest bf16 subnormal");
    assert_bf16_of(0x0000, float_of(0x00008000u), "half the smallest: tie to zero");
    assert_bf16_of(0x0001, float_of(0x00008001u), "just above half the smallest");
    assert_bf16_of(0x0002, float_of(0x00018000u), "tie above an odd subnormal");
    assert_bf16_of(0x0080, float_of(0x007F8000u), "tie up to the smallest normal");
    assert_bf16_of(0x8001, float_of(0x80010000u), "negative subnormal");
    assert_bf16_of(0x8000, float_of(0x80000001u), "tiny negative rounds to -0");
}

static void test_bf16_to_f32_widens_into_the_upper_half(void) {
    TEST_ASSERT_EQUAL_HEX32(0x3F800000u, bits_of(fsdp_bf16_to_f32(0x3F80)));
    TEST_ASSERT_EQUAL_HEX32(0x00010000u, bits_of(fsdp_bf16_to_f32(0x0001)));
    TEST_ASSERT_EQUAL_HEX32(0x80000000u, bits_of(fsdp_bf16_to_f32(0x8000)));
    TEST_ASSERT_EQUAL_HEX32(0x7F800000u, bits_of(fsdp_bf16_to_f32(0x7F80)));
    TEST_ASSERT_EQUAL_HEX32(0xFF800000u, bits_of(fsdp_bf16_to_f32(0xFF80)));
    TEST_ASSERT_TRUE(isnan(fsdp_bf16_to_f32(0x7FC0)));
}

static void test_bf16_every_pattern_round_trips_through_f32(void) {
    uint32_t pattern;
    char message[120];
    for (pattern = 0; pattern <= 0xFFFFu; pattern++) {
        uint16_t h = (uint16_t)pattern;
        float widened = fsdp_bf16_to_f32(h);
        uint16_t back = fsdp_f32_to_bf16(widened);
        snprintf(message, sizeof message, "bf16 0x%04X -> f32 0x%08X -> bf16 0x%04X", h,
                 (unsigned)bits_of(widened), back);
        if (bf16_is_nan(h)) {
            TEST_ASSERT_TRUE_MESSAGE(isnan(widened) && bf16_is_nan(back), message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(h >> 15, back >> 15, message);
        } else {
            TEST_ASSERT_EQUAL_HEX32_MESSAGE((uint32_t)h << 16, bits_of(widened), message);
            TEST_ASSERT_EQUAL_HEX16_MESSAGE(h, back, message);
        }
    }
}

static void test_f32_to_bf16_matches_reference_rounding_across_f32_range(void) {
    uint64_t pattern;
    uint32_t h;
    char message[40];
    /* a stride through every exponent and sign */
    for (pattern = 0; pattern <= 0xFFFFFFFFu; pattern += 997) {
        float value = float_of((uint32_t)pattern);
        if (isnan(value)) continue; /* NaNs are covered by their own test */
        if (fsdp_f32_to_bf16(value) != reference_f32_to_bf16(value)) {
            assert_bf16_of(reference_f32_to_bf16(value), value, "stride sweep");
        }
    }
    /* every tie between two neighbouring finite bf16 values, and its two f32 neighbours */
    for (h = 0; h <= 0x7F7Fu; h++) {
        uint32_t tie = (h << 16) | 0x8000u;
        uint32_t signs;
        for (signs = 0; signs < 2; signs++) {
            uint32_t sign = signs << 31;
            float tie_value = float_of(sign | tie);
            float below = float_of(sign | (tie - 1));
            float above = float_of(sign | (tie + 1));
            snprintf(message, sizeof message, "around bf16 0x%04X", (unsigned)h);
            if (fsdp_f32_to_bf16(tie_value) != reference_f32_to_bf16(tie_value))
                assert_bf16_of(reference_f32_to_bf16(tie_value), tie_value, message);
            if (fsdp_f32_to_bf16(below) != reference_f32_to_bf16(below))
                assert_bf16_of(reference_f32_to_bf16(below), below, message);
            if (fsdp_f32_to_bf16(above) != reference_f32_to_bf16(above))
                assert_bf16_of(reference_f32_to_bf16(above), above, message);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
   f32 -> f16
   --------------------------------------------------------------------------------------------- */
static void test_f32_to_f16_exactly_representable_values_keep_their_bits(void) {
    assert_f16_of(0x0000, 0.0f, "zero");
    assert_f16_of(0x3C00, 1.0f, "one");
    assert_f16_of(0xC000, -2.0f, "minus two");
    assert_f16_of(0x3800, 0.5f, "one half");
    assert_f16_of(0x3E00, 1.5f, "one and a half");
    assert_f16_of(0x7BFF, 65504.0f, "largest finite f16");
    assert_f16_of(0x0400, ldexpf(1.0f, -14), "smallest normal 2^-14");
    assert_f16_of(0x3C01, 1.0f + ldexpf(1.0f, -10), "one plus one ulp");
}

static void test_f32_to_f16_tie_with_even_lower_neighbour_rounds_down(void) {
    assert_f16_of(0x3C00, float_of(0x3F801000u), "1 + 2^-11");
    assert_f16_of(0xBC00, float_of(0xBF801000u), "-(1 + 2^-11)");
    assert_f16_of(0x6800, 2049.0f, "2049 between 2048 and 2050");
}

static void test_f32_to_f16_tie_with_odd_lower_neighbour_rounds_up(void) {
    assert_f16_of(0x3C02, float_of(0x3F803000u), "1 + 3*2^-11");
    assert_f16_of(0xBC02, float_of(0xBF803000u), "-(1 + 3*2^-11)");
    assert_f16_of(0x6802, 2051.0f, "2051 between 2050 and 2052");
    assert_f16_of(0x3C00, float_of(0x3F7FF000u), "tie below one carries into the exponent");
}

static void test_f32_to_f16_values_off_a_tie_round_to_nearest(void) {
    assert_f16_of(0x3C01, float_of(0x3F801001u), "just above the tie");
    assert_f16_of(0x3C00, float_of(0x3F800FFFu), "just below the tie");
    assert_f16_of(0xBC01, float_of(0xBF801001u), "negative just above the tie");
    assert_f16_of(0x3555, 1.0f / 3.0f, "one third");
}

static void test_f32_to_f16_just_below_65520_rounds_to_largest_finite(void) {
    assert_f16_of(0x7BFF, 65519.99f, "65519.99");
    assert_f16_of(0x7BFF, nextafterf(65520.0f, 0.0f), "the float just below 65520");
    assert_f16_of(0xFBFF, -nextafterf(65520.0f, 0.0f), "its negative");
}

static void test_f32_to_f16_at_or_above_65520_overflows_to_infinity(void) {
    assert_f16_of(0x7C00, 65520.0f, "65520 (tie above the largest finite)");
    assert_f16_of(0xFC00, -65520.0f, "-65520");
    assert_f16_of(0x7C00, 65536.0f, "65536");
    assert_f16_of(0x7C00, 1e10f, "1e10");
    assert_f16_of(0x7C00, FLT_MAX, "FLT_MAX");
    assert_f16_of(0xFC00, -FLT_MAX, "-FLT_MAX");
}

static void test_f32_to_f16_negative_zero_keeps_its_sign(void) {
    assert_f16_of(0x8000, -0.0f, "-0.0");
}

static void test_f32_to_f16_infinities_stay_infinite(void) {
    assert_f16_of(0x7C00, INFINITY, "+inf");
    assert_f16_of(0xFC00, -INFINITY, "-inf");
}

static void test_f32_to_f16_nan_stays_quiet_nan_with_its_sign(void) {
    assert_f16_quiet_nan_with_sign(0x7FC00000u);
    assert_f16_quiet_nan_with_sign(0xFFC00000u);
    assert_f16_quiet_nan_with_sign(0x7F800001u); /* payload only below f16's mantissa */
    assert_f16_quiet_nan_with_sign(0xFF800001u);
    assert_f16_quiet_nan_with_sign(0x7FFFFFFFu);
    assert_f16_quiet_nan_with_sign(0x7F801FFFu);
}

static void test_f32_to_f16_subnormals_are_produced_exactly(void) {
    assert_f16_of(0x0001, ldexpf(1.0f, -24), "smallest subnormal 2^-24");
    assert_f16_of(0x03FF, ldexpf(1023.0f, -24), "largest subnormal 1023*2^-24");
    assert_f16_of(0x0200, ldexpf(1.0f, -15), "2^-15");
    assert_f16_of(0x0005, ldexpf(5.0f, -24), "5*2^-24");
    assert_f16_of(0x8001, -ldexpf(1.0f, -24), "-2^-24");
}

static void test_f32_to_f16_below_half_the_smallest_subnormal_rounds_to_zero(void) {
    assert_f16_of(0x0000, ldexpf(1.0f, -26), "2^-26");
    assert_f16_of(0x0000, nextafterf(ldexpf(1.0f, -25), 0.0f), "just below 2^-25");
    assert_f16_of(0x0000, FLT_MIN, "FLT_MIN");
    assert_f16_of(0x0000, float_of(0x00000001u), "smallest f32 subnormal");
    assert_f16_of(0x8000, -ldexpf(1.0f, -26), "-2^-26 keeps its sign");
}

static void test_f32_to_f16_half_the_smallest_subnormal_ties_to_zero(void) {
    assert_f16_of(0x0000, ldexpf(1.0f, -25), "2^-25");
    assert_f16_of(0x8000, -ldexpf(1.0f, -25), "-2^-25");
}

static void test_f32_to_f16_just_above_half_the_smallest_subnormal_rounds_up(void) {
    assert_f16_of(0x0001, nextafterf(ldexpf(1.0f, -25), 1.0f), "just above 2^-25");
    assert_f16_of(0x0001, ldexpf(3.0f, -26), "0.75 * 2^-24");
}

static void test_f32_to_f16_subnormal_ties_round_to_even(void) {
    assert_f16_of(0x0002, ldexpf(3.0f, -25), "1.5 * 2^-24");
    assert_f16_of(0x0002, ldexpf(5.0f, -25), "2.5 * 2^-24");
    assert_f16_of(0x0004, ldexpf(7.0f, -25), "3.5 * 2^-24");
    assert_f16_of(0x0002, ldexpf(9.0f, -26), "2.25 * 2^-24 (not a tie)");
}

static void test_f32_to_f16_values_just_below_two_to_minus_14_round_up_to_smallest_normal(void) {
    assert_f16_of(0x0400, ldexpf(1023.5f, -24), "tie between 0x03FF and 0x0400");
    assert_f16_of(0x0400, ldexpf(1023.75f, -24), "1023.75*2^-24");
    assert_f16_of(0x0400, nextafterf(ldexpf(1.0f, -14), 0.0f), "the float just below 2^-14");
    assert_f16_of(0x03FF, ldexpf(1023.25f, -24), "1023.25*2^-24 stays subnormal");
}

static void test_f16_to_f32_reads_subnormals_exactly(void) {
    TEST_ASSERT_EQUAL_HEX32(0x33800000u, bits_of(fsdp_f16_to_f32(0x0001))); /* 2^-24 */
    TEST_ASSERT_EQUAL_HEX32(bits_of(ldexpf(1023.0f, -24)), bits_of(fsdp_f16_to_f32(0x03FF)));
    TEST_ASSERT_EQUAL_HEX32(0xB3800000u, bits_of(fsdp_f16_to_f32(0x8001)));
    TEST_ASSERT_EQUAL_HEX32(0x38000000u, bits_of(fsdp_f16_to_f32(0x0200))); /* 2^-15 */
}

static void test_f16_to_f32_reads_special_values(void) {
    TEST_ASSERT_EQUAL_HEX32(0x7F800000u, bits_of(fsdp_f16_to_f32(0x7C00)));
    TEST_ASSERT_EQUAL_HEX32(0xFF800000u, bits_of(fsdp_f16_to_f32(0xFC00)));
    TEST_ASSERT_EQUAL_HEX32(0x80000000u, bits_of(fsdp_f16_to_f32(0x8000)));
    TEST_ASSERT_EQUAL_HEX32(0x00000000u, bits_of(fsdp_f16_to_f32(0x0000)));
    TEST_ASSERT_EQUAL_HEX32(bits_of(65504.0f), bits_of(fsdp_f16_to_f32(0x7BFF)));
    TEST_ASSERT_TRUE(isnan(fsdp_f16_to_f32(0x7E00)));
    TEST_ASSERT_TRUE(isnan(fsdp_f16_to_f32(0x7C01)));
    TEST_ASSERT_TRUE(isnan(fsdp_f16_to_f32(0xFE00)) && signbit(fsdp_f16_to_f32(0xFE00)));
}

static void test_f16_every_pattern_decodes_to_its_exact_value(void) {
    uint32_t pattern;
    char message[100];
    for (pattern = 0; pattern <= 0xFFFFu; pattern++) {
        uint16_t h = (uint16_t)pattern;
        float decoded = fsdp_f16_to_f32(h);
        double expected = f16_value_by_definition(h);
        snprintf(message, sizeof message, "f16 0x%04X decoded to f32 0x%08X", h,
                 (unsigned)bits_of(decoded));
        if (f16_is_nan(h)) {
            TEST_ASSERT_TRUE_MESSAGE(isnan(decoded), message);
        } else {
            /* bits, so that -0.0 and +0.0 are told apart */
            TEST_ASSERT_EQUAL_HEX32_MESSAGE(bits_of((float)expected), bits_of(decoded), message);
        }
    }
}

static void test_f16_every_pattern_round_trips_through_f32(void) {
    uint32_t pattern;
    char message[120];
    for (pattern = 0; pattern <= 0xFFFFu; pattern++) {
        uint16_t h = (uint16_t)pattern;
        float widened = fsdp_f16_to_f32(h);
        uint16_t back = fsdp_f32_to_f16(widened);
        snprintf(message, sizeof message, "f16 0x%04X -> f32 0x%08X -> f16 0x%04X", h,
                 (unsigned)bits_of(widened), back);
        if (f16_is_nan(h)) {
            TEST_ASSERT_TRUE_MESSAGE(f16_is_nan(back), message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(h >> 15, back >> 15, message);
        } else {
            TEST_ASSERT_EQUAL_HEX16_MESSAGE(h, back, message);
        }
    }
}

static void test_f32_to_f16_matches_reference_rounding_across_f32_range(void) {
    uint64_t pattern;
    uint32_t h;
    for (pattern = 0; pattern <= 0xFFFFFFFFu; pattern += 997) {
        float value = float_of((uint32_t)pattern);
        if (isnan(value)) continue;
        if (fsdp_f32_to_f16(value) != reference_f32_to_f16(value)) {
            assert_f16_of(reference_f32_to_f16(value), value, "stride sweep");
        }
    }
    /* every tie between two neighbouring finite f16 values (and the one above 65504), with the
       floats on either side of it; the midpoints have 12 significant bits, so they are exact */
    for (h = 0; h <= 0x7BFFu; h++) {
        double low = f16_value_by_definition((uint16_t)h);
        double high = (h == 0x7BFFu) ? 65536.0 : f16_value_by_definition((uint16_t)(h + 1));
        float tie = (float)((low + high) / 2.0);
        int sign;
        for (sign = 0; sign < 2; sign++) {
            float candidates[3];
            int i;
            candidates[0] = sign ? -tie : tie;
            candidates[1] = nextafterf(candidates[0], 0.0f);
            candidates[2] = nextafterf(candidates[0], sign ? -INFINITY : INFINITY);
            for (i = 0; i < 3; i++) {
                if (fsdp_f32_to_f16(candidates[i]) != reference_f32_to_f16(candidates[i]))
                    assert_f16_of(reference_f32_to_f16(candidates[i]), candidates[i], "around a tie");
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
   fsdp_convert
   --------------------------------------------------------------------------------------------- */
#define CONVERT_COUNT 12

static const float convert_inputs[CONVERT_COUNT] = {
    0.0f, -0.0f, 1.0f, -2.5f, 1.00048828125f /* 1 + 2^-11: an f16 tie */,
    1.00390625f /* 1 + 2^-8: a bf16 tie */, 65504.0f, 70000.0f, 5.9604644775390625e-8f /* 2^-24 */,
    3.0e-39f /* f32 subnormal */, INFINITY, -1.0e-3f};

/* Encodes an f32 value as dtype using the scalar conversions (already specified above). */
static void store_as(void *buffer, fsdp_dtype dtype, size_t index, float value) {
    if (dtype == FSDP_F32) ((float *)buffer)[index] = value;
    else if (dtype == FSDP_BF16) ((uint16_t *)buffer)[index] = fsdp_f32_to_bf16(value);
    else ((uint16_t *)buffer)[index] = fsdp_f32_to_f16(value);
}

static float load_from(const void *buffer, fsdp_dtype dtype, size_t index) {
    if (dtype == FSDP_F32) return ((const float *)buffer)[index];
    if (dtype == FSDP_BF16) return fsdp_bf16_to_f32(((const uint16_t *)buffer)[index]);
    return fsdp_f16_to_f32(((const uint16_t *)buffer)[index]);
}

static void test_convert_every_dtype_pair_matches_scalar_conversions(void) {
    static const fsdp_dtype dtypes[3] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    int s, d;
    size_t i;
    for (s = 0; s < 3; s++) {
        for (d = 0; d < 3; d++) {
            fsdp_dtype src_dtype = dtypes[s], dst_dtype = dtypes[d];
            float src[CONVERT_COUNT], dst[CONVERT_COUNT + 1], expected[CONVERT_COUNT + 1];
            char message[120];
            for (i = 0; i < CONVERT_COUNT; i++) store_as(src, src_dtype, i, convert_inputs[i]);
            memset(dst, 0xA5, sizeof dst);
            memset(expected, 0xA5, sizeof expected); /* the element after the last stays untouched */
            for (i = 0; i < CONVERT_COUNT; i++)
                store_as(expected, dst_dtype, i, load_from(src, src_dtype, i));
            fsdp_convert(dst, dst_dtype, src, src_dtype, CONVERT_COUNT);
            for (i = 0; i < CONVERT_COUNT + 1; i++) {
                size_t size = fsdp_dtype_size(dst_dtype) ? fsdp_dtype_size(dst_dtype) : 4;
                snprintf(message, sizeof message, "%s -> %s, element %u (input %g)%s",
                         fsdp_dtype_name(src_dtype), fsdp_dtype_name(dst_dtype), (unsigned)i,
                         i < CONVERT_COUNT ? (double)convert_inputs[i] : 0.0,
                         i < CONVERT_COUNT ? "" : ": written past count");
                TEST_ASSERT_EQUAL_MEMORY_MESSAGE((const unsigned char *)expected + i * size,
                                                 (const unsigned char *)dst + i * size, size, message);
            }
        }
    }
}

/* fsdp_convert and fsdp_reduce_ranks convert whole arrays (vectorised where the CPU allows): bit for
   bit what the scalar conversions give, NaN payloads included, at any alignment and length. */
static void test_convert_bulk_matches_scalar_for_every_16_bit_pattern(void) {
    static uint16_t halves[65536 + 3], back[65536 + 3];
    static float widened[65536 + 3];
    static const fsdp_dtype dtypes[2] = {FSDP_BF16, FSDP_F16};
    char message[80];
    uint32_t i;
    int d, shift;
    for (i = 0; i < 65536; i++) halves[i + 1] = (uint16_t)i;
    for (d = 0; d < 2; d++) {
        for (shift = 0; shift < 2; shift++) { /* shift 1: every load and store one element off */
            fsdp_convert(widened + shift, FSDP_F32, halves + 1, dtypes[d], 65536);
            fsdp_convert(back + shift, dtypes[d], widened + shift, FSDP_F32, 65536);
            for (i = 0; i < 65536; i++) {
                uint16_t h = (uint16_t)i;
                float scalar = dtypes[d] == FSDP_BF16 ? fsdp_bf16_to_f32(h) : fsdp_f16_to_f32(h);
                uint16_t again = dtypes[d] == FSDP_BF16 ? fsdp_f32_to_bf16(scalar) : fsdp_f32_to_f16(scalar);
                if (bits_of(widened[i + shift]) == bits_of(scalar) && back[i + shift] == again) continue;
                snprintf(message, sizeof message, "%s 0x%04X, shift %d", fsdp_dtype_name(dtypes[d]), (unsigned)h, shift);
                TEST_ASSERT_EQUAL_HEX32_MESSAGE(bits_of(scalar), bits_of(widened[i + shift]), message);
                TEST_ASSERT_EQUAL_HEX16_MESSAGE(again, back[i + shift], message);
            }
        }
    }
}

static void test_convert_bulk_f32_to_16_bits_matches_scalar_across_f32_range(void) {
    /* a stride through every sign, exponent and NaN payload, then the f16 and bf16 edges: ties at
       the top of the f16 range and around 2^-14 and 2^-25, where the rounding changes regime */
    static float values[70000];
    static uint16_t bulk[70000];
    static const uint32_t edges[] = {0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x477FE000u, 0x38800000u, 0x387FFFFFu,
                                     0x387FF000u, 0x387FE000u, 0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x33400000u,
                                     0x00000001u, 0x007FFFFFu, 0x7F800000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FC00000u,
                                     0x7FFFFFFFu, 0x7F7FFFFFu, 0x3F800000u, 0x3F801000u, 0x3F803000u, 0x3F808000u};
    static const fsdp_dtype dtypes[2] = {FSDP_BF16, FSDP_F16};
    char message[80];
    size_t n = 0, i, e;
    uint64_t pattern;
    int d;
    for (pattern = 0; pattern <= 0xFFFFFFFFu; pattern += 65521) values[n++] = float_of((uint32_t)pattern);
    for (e = 0; e < sizeof edges / sizeof edges[0]; e++) {
        values[n++] = float_of(edges[e]);
        values[n++] = float_of(edges[e] | 0x80000000u);
    }
    TEST_ASSERT_TRUE(n <= sizeof values / sizeof values[0]);
    for (d = 0; d < 2; d++) {
        fsdp_convert(bulk, dtypes[d], values, FSDP_F32, n);
        for (i = 0; i < n; i++) {
            uint16_t scalar = dtypes[d] == FSDP_BF16 ? fsdp_f32_to_bf16(values[i]) : fsdp_f32_to_f16(values[i]);
            if (bulk[i] == scalar) continue;
            snprintf(message, sizeof message, "%s of f32 0x%08X", fsdp_dtype_name(dtypes[d]),
                     (unsigned)bits_of(values[i]));
            TEST_ASSERT_EQUAL_HEX16_MESSAGE(scalar, bulk[i], message);
        }
    }
}

static void test_reduce_ranks_folds_in_f32_in_rank_order_and_rounds_once(void) {
    enum { COUNT = 1003, MAX_RANKS = 4 };
    static float in[MAX_RANKS][COUNT], out[COUNT], expected[COUNT];
    static const fsdp_dtype dtypes[3] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const fsdp_reduce_op ops[3] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
    const void *srcs[MAX_RANKS];
    char message[80];
    int d, o, r, ranks, in_place;
    size_t i;
    for (d = 0; d < 3; d++) {
        fsdp_dtype dt = dtypes[d];
        size_t esize = fsdp_dtype_size(dt);
        for (ranks = 1; ranks <= MAX_RANKS; ranks++) {
            for (o = 0; o < 3; o++) {
                for (in_place = 0; in_place < 2; in_place++) {
                    for (r = 0; r < ranks; r++) {
                        for (i = 0; i < COUNT; i++) {
                            /* values of every size, with NaNs, Infs, zeros of both signs and subnormals */
                            float v = (float)(((i * 7919u + (size_t)r * 104729u) % 20011u) - 10005.0) *
                                      ldexpf(1.0f, (int)((i + (size_t)r) % 40) - 30);
                            if (i % 97 == (size_t)r) v = NAN;
                            if (i % 89 == 5) v = r == 1 ? -INFINITY : 1.0f;
                            if (i % 83 == 3) v = r == 2 ? -0.0f : 0.0f;
                            store_as(in[r], dt, i, v);
                        }
                        srcs[r] = in[r];
                    }
                    for (i = 0; i < COUNT; i++) {
                        float acc = load_from(in[0], dt, i), x;
                        for (r = 1; r < ranks; r++) {
                            x = load_from(in[r], dt, i);
                            if (ops[o] != FSDP_MAX) acc = acc + x;
                            else if (acc == acc) acc = x != x ? x : (acc > x ? acc : x);
                        }
                        if (ops[o] == FSDP_AVG) acc /= (float)ranks;
                        store_as(expected, dt, i, acc);
                    }
                    /* in place: the result overwrites rank 0's buffer, as the shm backend does */
                    fsdp_reduce_ranks(in_place ? in[0] : out, srcs, ranks, COUNT, dt, ops[o], ranks);
                    for (i = 0; i < COUNT; i++) {
                        const unsigned char *got = (const unsigned char *)(in_place ? in[0] : out) + i * esize;
                        float want = load_from(expected, dt, i), have = load_from(in_place ? in[0] : out, dt, i);
                        /* which NaN survives when two meet (Inf - Inf, then a NaN) is the compiler's
                           choice of operand order: NaN is checked as NaN, everything else bit for bit */
                        if (memcmp(got, (const unsigned char *)expected + i * esize, esize) == 0 ||
                            (want != want && have != have)) continue;
                        snprintf(message, sizeof message, "%s, %d ranks, op %d%s, element %u", fsdp_dtype_name(dt),
                                 ranks, (int)ops[o], in_place ? " in place" : "", (unsigned)i);
                        TEST_ASSERT_EQUAL_MEMORY_MESSAGE((const unsigned char *)expected + i * esize, got, esize, message);
                    }
                }
            }
        }
    }
}

static void test_convert_same_dtype_in_place_leaves_values_unchanged(void) {
    static const fsdp_dtype dtypes[3] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    int d;
    size_t i;
    for (d = 0; d < 3; d++) {
        float buffer[CONVERT_COUNT], original[CONVERT_COUNT];
        for (i = 0; i < CONVERT_COUNT; i++) store_as(buffer, dtypes[d], i, convert_inputs[i]);
        memcpy(original, buffer, sizeof buffer);
        fsdp_convert(buffer, dtypes[d], buffer, dtypes[d], CONVERT_COUNT);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(original, buffer, CONVERT_COUNT * fsdp_dtype_size(dtypes[d]),
                                         fsdp_dtype_name(dtypes[d]));
    }
}

static void test_convert_zero_count_writes_nothing(void) {
    uint16_t dst[4] = {0x1111, 0x2222, 0x3333, 0x4444};
    const uint16_t unchanged[4] = {0x1111, 0x2222, 0x3333, 0x4444};
    const float src[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    fsdp_convert(dst, FSDP_BF16, src, FSDP_F32, 0);
    TEST_ASSERT_EQUAL_MEMORY(unchanged, dst, sizeof dst);
}

/* ---------------------------------------------------------------------------------------------
   dtype metadata and result codes
   --------------------------------------------------------------------------------------------- */
static void test_dtype_size_gives_bytes_per_element_and_zero_when_invalid(void) {
    TEST_ASSERT_EQUAL_INT(4, (int)fsdp_dtype_size(FSDP_F32));
    TEST_ASSERT_EQUAL_INT(2, (int)fsdp_dtype_size(FSDP_BF16));
    TEST_ASSERT_EQUAL_INT(2, (int)fsdp_dtype_size(FSDP_F16));
    TEST_ASSERT_EQUAL_INT(0, (int)fsdp_dtype_size((fsdp_dtype)99));
    TEST_ASSERT_EQUAL_INT(0, (int)fsdp_dtype_size((fsdp_dtype)-1));
}

static void test_dtype_name_gives_short_names_and_invalid_otherwise(void) {
    TEST_ASSERT_EQUAL_STRING("f32", fsdp_dtype_name(FSDP_F32));
    TEST_ASSERT_EQUAL_STRING("bf16", fsdp_dtype_name(FSDP_BF16));
    TEST_ASSERT_EQUAL_STRING("f16", fsdp_dtype_name(FSDP_F16));
    TEST_ASSERT_EQUAL_STRING("invalid", fsdp_dtype_name((fsdp_dtype)99));
}

static void test_result_description_gives_the_sentence_of_known_codes(void) {
    TEST_ASSERT_EQUAL_STRING("success", fsdp_result_description(FSDP_SUCCESS));
    TEST_ASSERT_EQUAL_STRING("invalid argument", fsdp_result_description(FSDP_ERR_INVALID_ARG));
    TEST_ASSERT_EQUAL_STRING("timed out waiting for another rank",
                             fsdp_result_description(FSDP_ERR_TIMEOUT));
    TEST_ASSERT_EQUAL_STRING("ranks called different collectives",
                             fsdp_result_description(FSDP_ERR_MISMATCH));
    TEST_ASSERT_EQUAL_STRING("a launched rank crashed or exited with an error",
                             fsdp_result_description(FSDP_ERR_RANK_FAILED));
}

static void test_result_name_gives_the_enum_name_of_known_codes(void) {
    TEST_ASSERT_EQUAL_STRING("FSDP_SUCCESS", fsdp_result_name(FSDP_SUCCESS));
    TEST_ASSERT_EQUAL_STRING("FSDP_ERR_ENV", fsdp_result_name(FSDP_ERR_ENV));
    TEST_ASSERT_EQUAL_STRING("FSDP_ERR_TIMEOUT", fsdp_result_name(FSDP_ERR_TIMEOUT));
    TEST_ASSERT_EQUAL_STRING("FSDP_ERR_PEER_LOST", fsdp_result_name(FSDP_ERR_PEER_LOST));
    TEST_ASSERT_EQUAL_STRING("FSDP_ERR_RANK_FAILED", fsdp_result_name(FSDP_ERR_RANK_FAILED));
}

static void test_result_strings_of_unknown_codes_are_not_null_and_not_success(void) {
    static const int unknown_codes[4] = {-9, -19, -12345, 77};
    int i;
    for (i = 0; i < 4; i++) {
        const char *description = fsdp_result_description(unknown_codes[i]);
        const char *name = fsdp_result_name(unknown_codes[i]);
        TEST_ASSERT_NOT_NULL(description);
        TEST_ASSERT_NOT_NULL(name);
        TEST_ASSERT_TRUE_MESSAGE(strcmp(description, "success") != 0, "unknown code described as success");
        TEST_ASSERT_TRUE_MESSAGE(strcmp(name, "FSDP_SUCCESS") != 0, "unknown code named FSDP_SUCCESS");
    }
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_f32_to_bf16_exactly_representable_values_keep_their_bits);
    RUN_TEST(test_f32_to_bf16_tie_with_even_lower_neighbour_rounds_down);
    RUN_TEST(test_f32_to_bf16_tie_with_odd_lower_neighbour_rounds_up);
    RUN_TEST(test_f32_to_bf16_values_off_a_tie_round_to_nearest);
    RUN_TEST(test_f32_to_bf16_flt_max_overflows_to_infinity);
    RUN_TEST(test_f32_to_bf16_negative_zero_keeps_its_sign);
    RUN_TEST(test_f32_to_bf16_infinities_stay_infinite);
    RUN_TEST(test_f32_to_bf16_nan_stays_quiet_nan_with_its_sign);
    RUN_TEST(test_f32_to_bf16_subnormals_round_to_nearest_even);
    RUN_TEST(test_bf16_to_f32_widens_into_the_upper_half);
    RUN_TEST(test_bf16_every_pattern_round_trips_through_f32);
    RUN_TEST(test_f32_to_bf16_matches_reference_rounding_across_f32_range);

    RUN_TEST(test_f32_to_f16_exactly_representable_values_keep_their_bits);
    RUN_TEST(test_f32_to_f16_tie_with_even_lower_neighbour_rounds_down);
    RUN_TEST(test_f32_to_f16_tie_with_odd_lower_neighbour_rounds_up);
    RUN_TEST(test_f32_to_f16_values_off_a_tie_round_to_nearest);
    RUN_TEST(test_f32_to_f16_just_below_65520_rounds_to_largest_finite);
    RUN_TEST(test_f32_to_f16_at_or_above_65520_overflows_to_infinity);
    RUN_TEST(test_f32_to_f16_negative_zero_keeps_its_sign);
    RUN_TEST(test_f32_to_f16_infinities_stay_infinite);
    RUN_TEST(test_f32_to_f16_nan_stays_quiet_nan_with_its_sign);
    RUN_TEST(test_f32_to_f16_subnormals_are_produced_exactly);
    RUN_TEST(test_f32_to_f16_below_half_the_smallest_subnormal_rounds_to_zero);
    RUN_TEST(test_f32_to_f16_half_the_smallest_subnormal_ties_to_zero);
    RUN_TEST(test_f32_to_f16_just_above_half_the_smallest_subnormal_rounds_up);
    RUN_TEST(test_f32_to_f16_subnormal_ties_round_to_even);
    RUN_TEST(test_f32_to_f16_values_just_below_two_to_minus_14_round_up_to_smallest_normal);
    RUN_TEST(test_f16_to_f32_reads_subnormals_exactly);
    RUN_TEST(test_f16_to_f32_reads_special_values);
    RUN_TEST(test_f16_every_pattern_decodes_to_its_exact_value);
    RUN_TEST(test_f16_every_pattern_round_trips_through_f32);
    RUN_TEST(test_f32_to_f16_matches_reference_rounding_across_f32_range);

    RUN_TEST(test_convert_every_dtype_pair_matches_scalar_conversions);
    RUN_TEST(test_convert_bulk_matches_scalar_for_every_16_bit_pattern);
    RUN_TEST(test_convert_bulk_f32_to_16_bits_matches_scalar_across_f32_range);
    RUN_TEST(test_reduce_ranks_folds_in_f32_in_rank_order_and_rounds_once);
    RUN_TEST(test_convert_same_dtype_in_place_leaves_values_unchanged);
    RUN_TEST(test_convert_zero_count_writes_nothing);

    RUN_TEST(test_dtype_size_gives_bytes_per_element_and_zero_when_invalid);
    RUN_TEST(test_dtype_name_gives_short_names_and_invalid_otherwise);
    RUN_TEST(test_result_description_gives_the_sentence_of_known_codes);
    RUN_TEST(test_result_name_gives_the_enum_name_of_known_codes);
    RUN_TEST(test_result_strings_of_unknown_codes_are_not_null_and_not_success);
    return UNITY_END();
}
