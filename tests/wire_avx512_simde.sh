#!/bin/sh
# tests/wire_avx512_simde.sh - fsdp.h's AVX-512 (and AVX2) wire kernels run on a CPU without
# AVX-512: their text is taken from fsdp.h (>>wire), the target attributes dropped, and compiled
# against SIMDe's portable implementations of the intrinsics (Debian: apt-get install
# libsimde-dev), then compared bit for bit with the scalar kernels on random, tie and FLT_MAX
# runs of every length 0..99 and longer ones. tests/test_wire.c runs the real instructions where
# the CPU has them; this is for machines (and CI) that do not. Not part of make test (it needs the
# package). Usage: sh tests/wire_avx512_simde.sh   (exit 0: equal or skipped; 1: a difference)
FSDP_H=${FSDP_H:-fsdp.h}
CC=${CC:-cc}
if [ ! -r /usr/include/simde/x86/avx512.h ]; then echo "skipped: no SIMDe (apt-get install libsimde-dev)"; exit 0; fi
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
# the block arithmetic and scalar kernels, then the vector kernels (without their target attributes
# and the g++ diagnostic pragmas around them)
awk '/^#define FSDP__WIRE_BLOCK /{p=1} /^#if FSDP__HAVE_STREAM_AVX2$/{p=0} p' "$FSDP_H" >"$tmp/scalar_part.h"
awk '/^\/\* --- AVX2 kernels/{p=1} /^#  define FSDP__WIRE_LEVELS\(kernel\) \{kernel##_scalar, kernel##_avx2/{p=0} p' "$FSDP_H" |
    sed -e 's/__attribute__((target("[^"]*")))//' -e '/^#  *pragma/d' -e '/^#  *if defined(__cplusplus)/d' \
        -e '/^#  *endif/d' >"$tmp/vector_part.h"
[ -s "$tmp/scalar_part.h" ] && [ -s "$tmp/vector_part.h" ] || { echo "cannot find the wire kernels in $FSDP_H"; exit 1; }
cat >"$tmp/harness.c" <<'EOF'
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
typedef enum { FSDP_DTYPE_DEFAULT = 0, FSDP_F32 = 1, FSDP_BF16 = 2, FSDP_F16 = 3 } fsdp_dtype;
#define FSDP__PRIVATE static __attribute__((unused))
static inline uint32_t fsdp__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fsdp__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
#include "scalar_part.h"
/* what SIMDe 0.7 lacks, lane by lane from the instructions' definitions (cvtps2dq: nearest even) */
static simde__m512i emu_cvtps_epi32(simde__m512 v) {
    float f[16]; int32_t r[16]; int i; simde__m512i o;
    memcpy(f, &v, 64);
    for (i = 0; i < 16; i++) r[i] = f[i] != f[i] || fabsf(f[i]) >= 2147483648.0f ? INT32_MIN : (int32_t)nearbyintf(f[i]);
    memcpy(&o, r, 64);
    return o;
}
static simde__m512 emu_cvtepi32_ps(simde__m512i v) {
    int32_t f[16]; float r[16]; int i; simde__m512 o;
    memcpy(f, &v, 64);
    for (i = 0; i < 16; i++) r[i] = (float)f[i];
    memcpy(&o, r, 64);
    return o;
}
static simde__m512i emu_cvtepi8_epi32(simde__m128i v) {
    int8_t f[16]; int32_t r[16]; int i; simde__m512i o;
    memcpy(f, &v, 16);
    for (i = 0; i < 16; i++) r[i] = f[i];
    memcpy(&o, r, 64);
    return o;
}
#define _mm512_cvtps_epi32 emu_cvtps_epi32
#define _mm512_cvtepi32_ps emu_cvtepi32_ps
#define _mm512_cvtepi8_epi32 emu_cvtepi8_epi32
#include "vector_part.h"
static uint32_t mix32(uint32_t x) { x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16; return x; }
static long checks, differ;
static void expect(int same, const char *what, size_t n) {
    checks++;
    if (!same && ++differ <= 10) printf("%s differs from the scalar kernel at n = %lu\n", what, (unsigned long)n);
}
int main(void) {
    static float x[5000], want[5000], got[5000];
    static unsigned char want_codes[5000], got_codes[5000];
    int trial;
    for (trial = 0; trial < 300; trial++) {
        size_t n = trial < 100 ? (size_t)trial : (size_t)(mix32((uint32_t)trial) % 4096), i;
        uint32_t amax;
        fsdp__wire_scale s8, s4;
        for (i = 0; i < n; i++) {
            uint32_t r = mix32((uint32_t)(i * 7919 + (size_t)trial));
            x[i] = ldexpf((float)(r >> 8) / 8388608.0f - 1.0f, (int)(mix32((uint32_t)trial * 31) % 80) - 140 + (trial % 3) * 60);
            if (trial % 7 == 0 && i % 5 == 0) x[i] = (float)((int)(r % 20) - 10) + 0.5f; /* ties */
            if (trial == 5) x[i] = (i & 1) ? -3.40282347e38f : 3.40282347e38f;
        }
        amax = fsdp__wire_amax_scalar(x, n);
        expect(fsdp__wire_amax_avx2(x, n) == amax, "amax avx2", n);
        expect(fsdp__wire_amax_avx512(x, n) == amax, "amax avx512", n);
        if (amax == 0 || amax >= 0x7f800000u) continue;
        s8 = fsdp__wire_block_scale(amax, 127);
        s4 = fsdp__wire_block_scale(amax, 7);
#define QUANTIZE(bits, s, kernel) \
        memset(want_codes, 0x5a, sizeof want_codes); memset(got_codes, 0x5a, sizeof got_codes); \
        fsdp__wire_quantize##bits##_scalar(want_codes, x, n, &s); \
        fsdp__wire_quantize##bits##_##kernel(got_codes, x, n, &s); \
        expect(!memcmp(want_codes, got_codes, sizeof want_codes), "quantize int" #bits " " #kernel, n); \
        fsdp__wire_dequantize##bits##_scalar(want, want_codes, n, s.scale); \
        memset(got, 0, sizeof got); \
        fsdp__wire_dequantize##bits##_##kernel(got, want_codes, n, s.scale); \
        expect(!memcmp(want, got, n * sizeof(float)), "dequantize int" #bits " " #kernel, n);
        QUANTIZE(8, s8, avx2)
        QUANTIZE(8, s8, avx512)
        QUANTIZE(4, s4, avx2)
        QUANTIZE(4, s4, avx512)
    }
    printf("%ld comparisons of the AVX2 and AVX-512 kernels (SIMDe) with the scalar ones: %ld differ\n", checks, differ);
    return differ != 0;
}
EOF
$CC -std=c99 -O1 -w -Wno-psabi -I"$tmp" "$tmp/harness.c" -o "$tmp/harness" -lm || { echo "the harness does not compile"; exit 1; }
"$tmp/harness"
