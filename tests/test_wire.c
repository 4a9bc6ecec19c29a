/* test_wire.c - specification of fsdp.h's wire formats (>>wire): the bytes of f32, bf16, f16,
   int8 and int4 runs, their layout, the block quantization's arithmetic to the bit, non-finite
   blocks, the round trip's error, and every kernel level the CPU has (scalar, AVX2, AVX-512)
   against the scalar one.

   The quantized wires are checked against reference_encode/reference_decode below, written from
   the documentation at the >>wire section and nothing else (their own max, their own rounding
   to nearest even, their own packing): equal bytes prove that the documentation is exact.

   This CPU's levels only: tests/wire_avx512_simde.sh runs the AVX-512 kernels (and the AVX2
   ones) through portable emulations of their intrinsics where the CPU lacks them.

   Build: make build/test_wire */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <float.h>

void setUp(void) {}
void tearDown(void) { fsdp__wire_isa = -1; }

/* ---------------------------------------------------------------------------------------------
   the reference, from the documentation
   --------------------------------------------------------------------------------------------- */
static int levels_of(fsdp_wire wire) { return wire == FSDP_WIRE_INT8 ? 127 : 7; }
static int bits_per_code(fsdp_wire wire) { return wire == FSDP_WIRE_INT8 ? 8 : 4; }

/* Nearest integer to v, ties to the even one, without rint: v's floor and what is left over. */
static int32_t round_half_even(float v) {
    double whole = floor((double)v), rest = (double)v - whole; /* exact: v is an f32 of |v| < 2^24 */
    int32_t n = (int32_t)whole;
    if (rest > 0.5 || (rest == 0.5 && (n & 1))) n++;
    return n;
}

static void put_code(unsigned char *codes, size_t i, int32_t code, int bits) {
    if (bits == 8) codes[i] = (unsigned char)(code & 0xff);
    else codes[i / 2] = (unsigned char)(codes[i / 2] | ((code & 15) << (i % 2 ? 4 : 0)));
}

static int32_t get_code(const unsigned char *codes, size_t i, int bits) {
    int32_t raw = bits == 8 ? codes[i] : (codes[i / 2] >> (i % 2 ? 4 : 0)) & 15;
    int32_t half = bits == 8 ? 128 : 8;
    return raw >= half ? raw - 2 * half : raw;
}

/* One block: its scale and codes (codes zeroed by the caller). Returns 1 if it holds NaN or an
   infinity, and its first such index in *bad. */
static int reference_block(unsigned char *codes, float *scale_out, const float *x, size_t len, int q, int bits,
                           size_t *bad) {
    const float levels = (float)q;
    float a = 0.0f, scale, t, m;
    size_t i;
    for (i = 0; i < len; i++) {
        if (isnan(x[i]) || isinf(x[i])) {
            *bad = i;
            *scale_out = float_of(0x7fc00000u);
            return 1;
        }
        if (fabsf(x[i]) > a) a = fabsf(x[i]);
    }
    *scale_out = 0.0f;
    if (a == 0.0f) return 0;
    scale = a / levels;
    if (levels * scale > a) scale = nextafterf(scale, 0.0f);
    t = a < ldexpf(1.0f, -64) ? ldexpf(1.0f, 64) : 1.0f;
    m = levels / (a * t);
    for (i = 0; i < len; i++) {
        float xt = x[i] * t, v = xt * m;
        int32_t code = round_half_even(v);
        code = code < -q ? -q : code > q ? q : code;
        put_code(codes, i, code, bits);
    }
    *scale_out = scale;
    return 0;
}

/* A run, block by block: scale then codes. Returns the first non-finite index or n. */
static size_t reference_encode(unsigned char *out, fsdp_wire wire, size_t block, const float *x, size_t n) {
    const int bits = bits_per_code(wire);
    size_t start, first = n;
    for (start = 0; start < n; start += block) {
        size_t len = n - start < block ? n - start : block, bad = 0, code_bytes = (len * (size_t)bits + 7) / 8;
        float scale;
        memset(out + 4, 0, code_bytes);
        if (reference_block(out + 4, &scale, x + start, len, levels_of(wire), bits, &bad) && first == n) first = start + bad;
        memcpy(out, &scale, 4);
        out += 4 + code_bytes;
    }
    return first;
}

static void reference_decode(float *dst, const unsigned char *in, fsdp_wire wire, size_t block, size_t n) {
    const int bits = bits_per_code(wire);
    size_t start, i;
    for (start = 0; start < n; start += block) {
        size_t len = n - start < block ? n - start : block;
        float scale;
        memcpy(&scale, in, 4);
        for (i = 0; i < len; i++) dst[start + i] = (float)get_code(in + 4, i, bits) * scale;
        in += 4 + (len * (size_t)bits + 7) / 8;
    }
}

/* ---------------------------------------------------------------------------------------------
   data and comparisons
   --------------------------------------------------------------------------------------------- */
static const fsdp_wire quantized[2] = {FSDP_WIRE_INT8, FSDP_WIRE_INT4};
static const size_t blocks[] = {8, 24, 32, 64, 128, 256, 512, 4096};
static const char *const level_names[3] = {"scalar", "AVX2", "AVX-512"};

/* Values of mixed signs and magnitudes: per block of 97 a magnitude from 2^-30 to 2^30, so
   blocks of every size see large and small neighbours. */
static void fill_random(float *x, size_t n, uint32_t seed) {
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t r = mix32((uint32_t)i * 2654435761u + seed);
        float unit = (float)(r >> 8) / 16777216.0f * 2.0f - 1.0f; /* [-1, 1) */
        x[i] = ldexpf(unit, (int)(mix32((uint32_t)(i / 97) + seed) % 61) - 30);
    }
}

/* The sizes a run is tried at for one block size: empty, shorter than a block, whole blocks,
   a short last block of odd and even length, many blocks. */
static size_t sizes_for(size_t block, size_t *sizes) {
    size_t k = 0;
    sizes[k++] = 0;
    sizes[k++] = 1;
    sizes[k++] = 7;
    sizes[k++] = block - 1;
    sizes[k++] = block;
    sizes[k++] = block + 1;
    sizes[k++] = 3 * block + 5;
    sizes[k++] = 10007;
    return k;
}

/* Encodes at the given level with fsdp_wire_encode; checks the size it promised on the way. */
static size_t encode_at(int level, unsigned char *out, fsdp_wire wire, size_t block, const float *x, size_t n) {
    size_t first = (size_t)-1;
    fsdp__wire_isa = level;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_wire_encode(out, wire, block, x, n, &first));
    fsdp__wire_isa = -1;
    return first;
}

static void decode_at(int level, void *dst, fsdp_dtype dtype, const unsigned char *in, fsdp_wire wire, size_t block,
                      size_t n) {
    fsdp__wire_isa = level;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_wire_decode(dst, dtype, in, wire, block, n));
    fsdp__wire_isa = -1;
}

/* Every level's encoding of x equals the reference's, byte for byte, and so do the decodes (to
   f32; to bf16 and f16, the reference's f32 rounded by test_common's own conversions). */
static void check_against_reference(const float *x, size_t n, fsdp_wire wire, size_t block, const char *what) {
    size_t bytes = fsdp_wire_bytes(wire, n, block), i;
    unsigned char *want = (unsigned char *)malloc(bytes + 1), *got = (unsigned char *)malloc(bytes + 1);
    float *want_x = (float *)malloc((n + 1) * sizeof(float)), *got_x = (float *)malloc((n + 1) * sizeof(float));
    uint16_t *got_half = (uint16_t *)malloc((n + 1) * sizeof(uint16_t));
    size_t want_first = reference_encode(want, wire, block, x, n);
    int level, top = fsdp__wire_isa_supported();
    char message[300];
    TEST_ASSERT_TRUE(want && got && want_x && got_x && got_half);
    reference_decode(want_x, want, wire, block, n);
    for (level = 0; level <= top; level++) {
        snprintf(message, sizeof message, "%s: %s, K = %lu, n = %lu, %s kernel", what, fsdp_wire_name(wire),
                 (unsigned long)block, (unsigned long)n, level_names[level]);
        memset(got, 0xA5, bytes + 1);
        TEST_ASSERT_EQUAL_size_t_MESSAGE(want_first, encode_at(level, got, wire, block, x, n), message);
        if (bytes) TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, got, bytes, message);
        TEST_ASSERT_EQUAL_HEX8_MESSAGE(0xA5, got[bytes], message); /* nothing written past the size */
        decode_at(level, got_x, FSDP_F32, got, wire, block, n);
        for (i = 0; i < n; i++)
            if (bits_of(got_x[i]) != bits_of(want_x[i])) TEST_ASSERT_EQUAL_HEX32_MESSAGE(bits_of(want_x[i]), bits_of(got_x[i]), message);
        decode_at(level, got_half, FSDP_BF16, got, wire, block, n);
        for (i = 0; i < n; i++)
            if (got_half[i] != reference_bf16(want_x[i])) TEST_ASSERT_EQUAL_HEX16_MESSAGE(reference_bf16(want_x[i]), got_half[i], message);
        decode_at(level, got_half, FSDP_F16, got, wire, block, n);
        for (i = 0; i < n; i++)
            if (got_half[i] != reference_f16(want_x[i])) TEST_ASSERT_EQUAL_HEX16_MESSAGE(reference_f16(want_x[i]), got_half[i], message);
    }
    free(want);
    free(got);
    free(want_x);
    free(got_x);
    free(got_half);
}

/* ---------------------------------------------------------------------------------------------
   names, sizes, arguments
   --------------------------------------------------------------------------------------------- */
static void test_wire_names_are_the_formats(void) {
    TEST_ASSERT_EQUAL_STRING("default", fsdp_wire_name(FSDP_WIRE_DEFAULT));
    TEST_ASSERT_EQUAL_STRING("f32", fsdp_wire_name(FSDP_WIRE_F32));
    TEST_ASSERT_EQUAL_STRING("bf16", fsdp_wire_name(FSDP_WIRE_BF16));
    TEST_ASSERT_EQUAL_STRING("f16", fsdp_wire_name(FSDP_WIRE_F16));
    TEST_ASSERT_EQUAL_STRING("int8", fsdp_wire_name(FSDP_WIRE_INT8));
    TEST_ASSERT_EQUAL_STRING("int4", fsdp_wire_name(FSDP_WIRE_INT4));
    TEST_ASSERT_EQUAL_STRING("invalid", fsdp_wire_name((fsdp_wire)6));
    TEST_ASSERT_EQUAL_STRING("invalid", fsdp_wire_name((fsdp_wire)-1));
}

static void test_wire_bytes_are_scales_plus_codes_of_count_and_block(void) {
    TEST_ASSERT_EQUAL_size_t(40, fsdp_wire_bytes(FSDP_WIRE_F32, 10, 0));
    TEST_ASSERT_EQUAL_size_t(20, fsdp_wire_bytes(FSDP_WIRE_BF16, 10, 3)); /* float wires ignore the block */
    TEST_ASSERT_EQUAL_size_t(20, fsdp_wire_bytes(FSDP_WIRE_F16, 10, 0));
    TEST_ASSERT_EQUAL_size_t(0, fsdp_wire_bytes(FSDP_WIRE_INT8, 0, 32));
    TEST_ASSERT_EQUAL_size_t(4 + 1, fsdp_wire_bytes(FSDP_WIRE_INT8, 1, 32));
    TEST_ASSERT_EQUAL_size_t(4 * 2 + 33, fsdp_wire_bytes(FSDP_WIRE_INT8, 33, 32));
    TEST_ASSERT_EQUAL_size_t(4 * 8 + 1000, fsdp_wire_bytes(FSDP_WIRE_INT8, 1000, 0)); /* default K = 128 */
    TEST_ASSERT_EQUAL_size_t(4 + 1, fsdp_wire_bytes(FSDP_WIRE_INT4, 1, 8));
    TEST_ASSERT_EQUAL_size_t(4 * 2 + 5, fsdp_wire_bytes(FSDP_WIRE_INT4, 9, 8));
    TEST_ASSERT_EQUAL_size_t(4 * 3 + 9, fsdp_wire_bytes(FSDP_WIRE_INT4, 17, 8));
    TEST_ASSERT_EQUAL_size_t(4 * 1 + 2048, fsdp_wire_bytes(FSDP_WIRE_INT4, 4096, 4096));
}

static void test_wire_invalid_wire_block_or_buffer_is_rejected(void) {
    float x[16] = {0};
    unsigned char out[128];
    size_t first = 99;
    TEST_ASSERT_EQUAL_size_t(0, fsdp_wire_bytes(FSDP_WIRE_DEFAULT, 10, 0));
    TEST_ASSERT_EQUAL_size_t(0, fsdp_wire_bytes(FSDP_WIRE_INT8, 10, 12));   /* not a multiple of 8 */
    TEST_ASSERT_EQUAL_size_t(0, fsdp_wire_bytes(FSDP_WIRE_INT4, 10, 8192)); /* above 4096 */
    TEST_ASSERT_EQUAL_size_t(0, fsdp_wire_bytes(FSDP_WIRE_F32, (size_t)-1 / 4, 0)); /* would overflow */
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_encode(out, FSDP_WIRE_DEFAULT, 0, x, 16, &first));
    TEST_ASSERT_EQUAL_size_t(16, first);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_encode(out, (fsdp_wire)9, 0, x, 16, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_encode(out, FSDP_WIRE_INT8, 4, x, 16, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_encode(NULL, FSDP_WIRE_INT8, 8, x, 16, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_encode(out, FSDP_WIRE_INT8, 8, NULL, 16, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_wire_encode(NULL, FSDP_WIRE_INT8, 8, NULL, 0, &first));
    TEST_ASSERT_EQUAL_size_t(0, first);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_decode(x, FSDP_DTYPE_DEFAULT, out, FSDP_WIRE_INT8, 8, 16));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_decode(x, FSDP_F32, out, FSDP_WIRE_DEFAULT, 8, 16));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_decode(x, FSDP_F32, out, FSDP_WIRE_INT4, 9, 16));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_wire_decode(x, FSDP_F32, NULL, FSDP_WIRE_INT4, 8, 16));
}

/* ---------------------------------------------------------------------------------------------
   the documented arithmetic, every kernel
   --------------------------------------------------------------------------------------------- */
static void test_wire_quantized_random_runs_match_the_documented_arithmetic_at_every_level(void) {
    size_t sizes[16], b, k, count, most = 3 * 4096 + 5 > 10007 ? 3 * 4096 + 5 : 10007;
    float *x = (float *)malloc(most * sizeof(float));
    int w;
    TEST_ASSERT_NOT_NULL(x);
    for (b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
        count = sizes_for(blocks[b], sizes);
        for (k = 0; k < count; k++) {
            fill_random(x, sizes[k], (uint32_t)(b * 131 + k));
            for (w = 0; w < 2; w++) check_against_reference(x, sizes[k], quantized[w], blocks[b], "random");
        }
    }
    free(x);
}

/* A block whose largest value is FLT_MAX: 127 * (FLT_MAX / 127) rounds to infinity, so the scale
   steps one f32 toward 0 and every decoded value stays finite and within the block's max. */
static void test_wire_flt_max_block_decodes_finite(void) {
    float x[16] = {FLT_MAX, -FLT_MAX, FLT_MAX / 2, -1.0f, 0.0f, FLT_MIN, 3e37f, -3e37f,
                   1.0f, FLT_MAX / 127, -FLT_MAX / 3, 1e30f, -1e-30f, 2e38f, -2e38f, 5.0f};
    unsigned char enc[64];
    float back[16];
    size_t i;
    int w;
    for (w = 0; w < 2; w++) {
        check_against_reference(x, 16, quantized[w], 8, "FLT_MAX");
        encode_at(0, enc, quantized[w], 16, x, 16);
        decode_at(0, back, FSDP_F32, enc, quantized[w], 16, 16);
        for (i = 0; i < 16; i++) {
            TEST_ASSERT_TRUE_MESSAGE(isfinite(back[i]), fsdp_wire_name(quantized[w]));
            TEST_ASSERT_TRUE(fabsf(back[i]) <= FLT_MAX);
        }
        TEST_ASSERT_EQUAL_FLOAT(FLT_MAX, back[0]); /* 127 (or 7) scales: within an ulp of the max */
    }
}

/* Blocks of subnormals and of tiny normals: Q / a would overflow to infinity, so the block is
   lifted by 2^64 first; the codes still span [-Q, Q]. */
static void test_wire_subnormal_block_gets_full_range_codes(void) {
    float x[8] = {0x1p-149f, -0x1p-149f * 5, 0x1p-149f * 1000, -0x1p-149f * 999, 0.0f,
                  FLT_MIN / 2, -FLT_MIN / 3, FLT_MIN / 4};
    float tiny[8] = {1e-37f, -1e-37f, 5e-38f, 2.5e-38f, -7e-38f, 1e-38f, 3e-39f, 0.0f};
    unsigned char enc[16];
    int w;
    TEST_ASSERT_TRUE(isinf(127.0f / (FLT_MIN / 2))); /* what t avoids */
    for (w = 0; w < 2; w++) {
        int q = levels_of(quantized[w]);
        check_against_reference(x, 8, quantized[w], 8, "subnormals");
        check_against_reference(tiny, 8, quantized[w], 8, "tiny normals");
        encode_at(0, enc, quantized[w], 8, x, 8);
        TEST_ASSERT_EQUAL_INT32(q, get_code(enc + 4, 5, bits_per_code(quantized[w]))); /* FLT_MIN / 2 is the max */
        TEST_ASSERT_EQUAL_INT32(-(int32_t)lround(q * 2.0 / 3.0), get_code(enc + 4, 6, bits_per_code(quantized[w])));
    }
}

/* x * (Q / a) exactly halfway between two integers rounds to the even one. */
static void test_wire_halfway_values_round_to_even(void) {
    /* a = 127: scale 1, m 1, so the codes are the values rounded */
    float x8[8] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 126.5f};
    int32_t want8[8] = {127, 2, 4, -2, -4, 0, 0, 126};
    float x4[8] = {7.0f, 2.5f, 3.5f, -2.5f, -6.5f, 0.5f, 1.5f, -5.5f};
    int32_t want4[8] = {7, 2, 4, -2, -6, 0, 2, -6};
    unsigned char enc[16];
    int level, i;
    for (level = 0; level <= fsdp__wire_isa_supported(); level++) {
        encode_at(level, enc, FSDP_WIRE_INT8, 8, x8, 8);
        for (i = 0; i < 8; i++) TEST_ASSERT_EQUAL_INT32_MESSAGE(want8[i], get_code(enc + 4, (size_t)i, 8), level_names[level]);
        encode_at(level, enc, FSDP_WIRE_INT4, 8, x4, 8);
        for (i = 0; i < 8; i++) TEST_ASSERT_EQUAL_INT32_MESSAGE(want4[i], get_code(enc + 4, (size_t)i, 4), level_names[level]);
    }
    check_against_reference(x8, 8, FSDP_WIRE_INT8, 8, "ties");
    check_against_reference(x4, 8, FSDP_WIRE_INT4, 8, "ties");
}

/* The vector kernels see ties too: 64 values at k + 1/2 in a block of 64 (K = 64 puts them in
   the AVX loops, not the scalar tails). */
static void test_wire_halfway_values_in_vector_lanes_round_to_even(void) {
    float x[64];
    int i;
    for (i = 0; i < 64; i++) x[i] = (float)(i - 32) + 0.5f;
    x[0] = 127.0f; /* a = 127: m = 1 */
    check_against_reference(x, 64, FSDP_WIRE_INT8, 64, "ties in lanes");
    for (i = 0; i < 64; i++) x[i] = (float)((i % 14) - 7) + 0.5f;
    x[0] = 7.0f;
    check_against_reference(x, 64, FSDP_WIRE_INT4, 64, "ties in lanes");
}

static void test_wire_zero_block_has_zero_scale_and_codes(void) {
    float x[40];
    unsigned char enc[64];
    float back[40];
    size_t i;
    int w;
    for (i = 0; i < 40; i++) x[i] = i % 3 ? 0.0f : -0.0f;
    x[37] = 1.0f; /* only the last (short) block is not zero */
    for (w = 0; w < 2; w++) {
        size_t bytes = fsdp_wire_bytes(quantized[w], 32, 8);
        encode_at(fsdp__wire_isa_supported(), enc, quantized[w], 8, x, 40);
        TEST_ASSERT_TRUE_MESSAGE(bytes_all_equal(enc, bytes, 0), fsdp_wire_name(quantized[w]));
        decode_at(0, back, FSDP_F32, enc, quantized[w], 8, 40);
        for (i = 0; i < 32; i++) TEST_ASSERT_EQUAL_HEX32(0, bits_of(back[i])); /* +0, the sign not kept */
        check_against_reference(x, 40, quantized[w], 8, "zero blocks");
    }
}

/* NaN, +inf and -inf: the run's first one is reported, its block's scale is NaN and codes 0, it
   decodes to NaN; the other blocks are untouched. */
static void test_wire_nonfinite_block_is_reported_and_decodes_to_nan(void) {
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    float x[100], back[100], scale;
    unsigned char enc[256];
    size_t i;
    int w, b, level;
    for (w = 0; w < 2; w++)
        for (b = 0; b < 3; b++)
            for (level = 0; level <= fsdp__wire_isa_supported(); level++) {
                fill_random(x, 100, 7);
                x[70] = bad[b];
                x[45] = bad[(b + 1) % 3]; /* the first: block 1 of 32 */
                TEST_ASSERT_EQUAL_size_t(45, encode_at(level, enc, quantized[w], 32, x, 100));
                memcpy(&scale, enc + fsdp_wire_bytes(quantized[w], 32, 32), 4);
                TEST_ASSERT_EQUAL_HEX32(0x7fc00000u, bits_of(scale));
                decode_at(level, back, FSDP_F32, enc, quantized[w], 32, 100);
                for (i = 0; i < 100; i++) TEST_ASSERT_TRUE((i >= 32 && i < 96) == (isnan(back[i]) != 0));
                check_against_reference(x, 100, quantized[w], 32, "non-finite");
            }
}

/* |x - x'| <= scale (1/2 + 2^-14) + 2^-142 and |x'| <= the block's max |x|, as documented, over
   magnitudes from subnormal to 2^30. */
static void test_wire_round_trip_error_is_within_half_a_scale(void) {
    const size_t n = 20000, block = 64;
    float *x = (float *)malloc(n * sizeof(float)), *back = (float *)malloc(n * sizeof(float));
    unsigned char *enc = (unsigned char *)malloc(fsdp_wire_bytes(FSDP_WIRE_INT8, n, block));
    size_t i;
    int w;
    TEST_ASSERT_TRUE(x && back && enc);
    fill_random(x, n, 3);
    for (i = 0; i < 2000; i++) x[i] = ldexpf(x[i], -120); /* subnormal and tiny blocks */
    for (w = 0; w < 2; w++) {
        encode_at(fsdp__wire_isa_supported(), enc, quantized[w], block, x, n);
        decode_at(fsdp__wire_isa_supported(), back, FSDP_F32, enc, quantized[w], block, n);
        for (i = 0; i < n; i++) {
            float scale, amax = 0.0f;
            double bound;
            size_t j;
            memcpy(&scale, enc + fsdp_wire_bytes(quantized[w], i / block * block, block), 4);
            for (j = i / block * block; j < n && j < (i / block + 1) * block; j++) amax = fmaxf(amax, fabsf(x[j]));
            bound = (double)scale * (0.5 + ldexp(1.0, -14)) + ldexp(1.0, -142);
            if (!(fabs((double)x[i] - (double)back[i]) <= bound) || !(fabsf(back[i]) <= amax)) {
                char message[200];
                snprintf(message, sizeof message, "%s element %lu: %.9g decoded as %.9g, scale %.9g",
                         fsdp_wire_name(quantized[w]), (unsigned long)i, (double)x[i], (double)back[i], (double)scale);
                TEST_FAIL_MESSAGE(message);
            }
        }
    }
    free(x);
    free(back);
    free(enc);
}

/* int4: element 2j in the low nibble of byte j, two's complement; an odd count leaves the last
   high nibble 0. */
static void test_wire_int4_packs_low_nibble_first_and_pads_odd_counts(void) {
    float x[13] = {7.0f, -7.0f, 1.0f, -1.0f, 0.0f, 3.0f, -3.0f, 7.0f, /* block 0: a = 7, m = 1 */
                   -7.0f, 2.0f, 0.0f, 0.0f, -1.0f};                   /* block 1: 5 elements */
    const unsigned char want[4 + 4 + 4 + 3] = {0, 0, 0x80, 0x3f, 0x97, 0xf1, 0x30, 0x7d,  /* scale 1.0f */
                                               0, 0, 0x80, 0x3f, 0x29, 0x00, 0x0f};
    unsigned char enc[15];
    int level;
    for (level = 0; level <= fsdp__wire_isa_supported(); level++) {
        memset(enc, 0xA5, sizeof enc);
        encode_at(level, enc, FSDP_WIRE_INT4, 8, x, 13);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, enc, sizeof want, level_names[level]);
    }
    check_against_reference(x, 13, FSDP_WIRE_INT4, 8, "odd int4");
}

/* Any whole number of blocks is a run of its own: encoding in pieces gives the same bytes. */
static void test_wire_runs_of_whole_blocks_concatenate(void) {
    const size_t n = 1000, block = 64, split = 5 * 64;
    float x[1000];
    unsigned char whole[1200], pieces[1200];
    int w;
    fill_random(x, n, 11);
    for (w = 0; w < 2; w++) {
        size_t head = fsdp_wire_bytes(quantized[w], split, block);
        encode_at(fsdp__wire_isa_supported(), whole, quantized[w], block, x, n);
        encode_at(fsdp__wire_isa_supported(), pieces, quantized[w], block, x, split);
        encode_at(fsdp__wire_isa_supported(), pieces + head, quantized[w], block, x + split, n - split);
        TEST_ASSERT_EQUAL_size_t(fsdp_wire_bytes(quantized[w], n, block), head + fsdp_wire_bytes(quantized[w], n - split, block));
        TEST_ASSERT_EQUAL_MEMORY(whole, pieces, fsdp_wire_bytes(quantized[w], n, block));
    }
}

/* The float wires are fsdp_convert: the same bits, NaN and infinity carried, never reported. */
static void test_wire_float_wires_are_the_dtype_conversions(void) {
    const fsdp_wire wires[3] = {FSDP_WIRE_F32, FSDP_WIRE_BF16, FSDP_WIRE_F16};
    const fsdp_dtype dtypes[3] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    float x[50], back[50], want_back[50];
    unsigned char enc[200], want[200];
    size_t first;
    int w;
    fill_random(x, 50, 5);
    x[3] = NAN;
    x[9] = -INFINITY;
    x[10] = 70000.0f; /* beyond f16 */
    for (w = 0; w < 3; w++) {
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_wire_encode(enc, wires[w], 0, x, 50, &first));
        TEST_ASSERT_EQUAL_size_t(50, first);
        fsdp_convert(want, dtypes[w], x, FSDP_F32, 50);
        TEST_ASSERT_EQUAL_MEMORY(want, enc, fsdp_wire_bytes(wires[w], 50, 0));
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_wire_decode(back, FSDP_F32, enc, wires[w], 0, 50));
        fsdp_convert(want_back, FSDP_F32, want, dtypes[w], 50);
        TEST_ASSERT_EQUAL_MEMORY(want_back, back, sizeof back);
    }
}

int main(void) {
    UNITY_BEGIN();
    printf("wire kernels tested here: scalar%s%s (the CPU's best: %s)\n", fsdp__wire_isa_supported() >= 1 ? ", AVX2" : "",
           fsdp__wire_isa_supported() >= 2 ? ", AVX-512" : "", level_names[fsdp__wire_isa_supported()]);
    RUN_TEST(test_wire_names_are_the_formats);
    RUN_TEST(test_wire_bytes_are_scales_plus_codes_of_count_and_block);
    RUN_TEST(test_wire_invalid_wire_block_or_buffer_is_rejected);
    RUN_TEST(test_wire_quantized_random_runs_match_the_documented_arithmetic_at_every_level);
    RUN_TEST(test_wire_flt_max_block_decodes_finite);
    RUN_TEST(test_wire_subnormal_block_gets_full_range_codes);
    RUN_TEST(test_wire_halfway_values_round_to_even);
    RUN_TEST(test_wire_halfway_values_in_vector_lanes_round_to_even);
    RUN_TEST(test_wire_zero_block_has_zero_scale_and_codes);
    RUN_TEST(test_wire_nonfinite_block_is_reported_and_decodes_to_nan);
    RUN_TEST(test_wire_round_trip_error_is_within_half_a_scale);
    RUN_TEST(test_wire_int4_packs_low_nibble_first_and_pads_odd_counts);
    RUN_TEST(test_wire_runs_of_whole_blocks_concatenate);
    RUN_TEST(test_wire_float_wires_are_the_dtype_conversions);
    return UNITY_END();
}
