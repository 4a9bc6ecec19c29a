/* example_gemm.h - the matrix multiply of the example models (gpt_model.h, mlp_model.h).

   example_sgemm() takes cblas_sgemm's row-major arguments:

       C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C,   op(X) = X or X^T

   It runs either the blocked AVX-512 kernel below or OpenBLAS's cblas_sgemm, decided once per
   process (example_gemm_choose): the kernel where the CPU has AVX-512F (all the kernel uses) and
   OpenBLAS runs one of its kernels without AVX-512 (openblas_get_corename() names a core such as
   "Haswell" or "Zen"; OPENBLAS_CORETYPE, which changes what OpenBLAS runs, changes that name);
   cblas_sgemm elsewhere: on OpenBLAS's own AVX-512 kernels (SkylakeX, Cooperlake,
   SapphireRapids), without AVX-512, or under a core name not in the list. EXAMPLE_SGEMM=openblas
   in the environment forces cblas_sgemm, EXAMPLE_SGEMM=own the kernel (where the CPU has
   AVX-512F). Why a kernel of our own: Debian's OpenBLAS 0.3.21 does not know AMD Zen 4/5 and runs
   its AVX2 kernels there, about half of what a core does with AVX-512.

   The kernel is the textbook (Goto / BLIS) layout: B is packed into panels of KC x 32 columns and
   A into panels of 12 rows x KC (a block of MC rows of them in L2); a 12 x 32 block of C
   accumulates in 24 zmm registers over KC steps, streaming one panel of each. Partial tiles at
   the right edge use masked loads and stores; at the bottom edge the packed panel is padded with
   zeros and only the real rows are stored. Sums run over k in order within each KC block, so
   results differ from OpenBLAS's in the last bits only. The block is deep (KC 1024) because the
   kernel itself runs near the core's peak while C is what costs: a C of 2048 x 2048 does not stay
   in cache, and each further K block reads and writes it again.

   The packing buffers are per thread (4.2 MiB, allocated on the thread's first multiply on the
   AVX-512 path, freed when it exits; OpenBLAS is used if they cannot be had). Include after
   OpenBLAS's <cblas.h> (openblas_get_corename); link with -lopenblas -lpthread. */
#ifndef EXAMPLE_GEMM_H
#define EXAMPLE_GEMM_H

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(EXAMPLE_GEMM_NO_AVX512)
#  define EXAMPLE_GEMM_AVX512 1
#  include <immintrin.h>
#else
#  define EXAMPLE_GEMM_AVX512 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define EXAMPLE_GEMM_UNUSED __attribute__((unused))
#else
#  define EXAMPLE_GEMM_UNUSED
#endif

#if EXAMPLE_GEMM_AVX512

#define GEMM_MR 12   /* rows of a C tile: one broadcast of A each */
#define GEMM_NR 32   /* columns of a C tile: two zmm registers */
#define GEMM_KC 1024 /* depth of a packed block; each C tile is read and written once per block */
#define GEMM_MC 48   /* rows of A packed at once (192 KiB, in L2) */
#define GEMM_NC 1024 /* columns of B packed at once (4 MiB) */

/* The packing buffers of this thread, A's (MC x KC) then B's (KC x NC) in one allocation: made on
   its first multiply, freed when the thread exits (the key's destructor). */
static __thread float *gemm_packed;
static pthread_once_t gemm_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t gemm_key;
static int gemm_key_ok;

/* The columns [0, n) of a 32-wide tile as two 16-lane masks. */
static inline __mmask16 gemm_mask(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1); }

/* c (mr x nr, row stride ldc) = alpha * a @ b + beta * c (+ bias, a row of nr values, if not
   NULL), where a is a packed panel (kc x 12, row r of step k at a[k*12 + r]) and b a packed panel
   (kc x 32). beta is 0 or 1; with beta 0, c is not read. */
__attribute__((target("avx512f"))) static void gemm_kernel_12x32(int kc, const float *a, const float *b, float *c,
                                                                  int ldc, int mr, int nr, float alpha, float beta,
                                                                  const float *bias) {
    __m512 c0[GEMM_MR], c1[GEMM_MR];
    __mmask16 m0 = gemm_mask(nr), m1 = gemm_mask(nr - 16);
    __m512 va = _mm512_set1_ps(alpha), bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
    if (bias) bias0 = _mm512_maskz_loadu_ps(m0, bias), bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC unroll 12
#endif
    for (int r = 0; r < GEMM_MR; r++) c0[r] = _mm512_setzero_ps(), c1[r] = _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) { // the tile's rows are stored after the loop: fetch them meanwhile
        _mm_prefetch((const char *)(c + (size_t)r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)r * ldc + nr - 1), _MM_HINT_T0);
    }
    for (int k = 0; k < kc; k++, a += GEMM_MR, b += GEMM_NR) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC unroll 12
#endif
        for (int r = 0; r < GEMM_MR; r++) {
            __m512 ar = _mm512_set1_ps(a[r]);
            c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
        }
    }
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * ldc;
        __m512 x0 = _mm512_add_ps(_mm512_mul_ps(va, c0[r]), bias0), x1 = _mm512_add_ps(_mm512_mul_ps(va, c1[r]), bias1);
        if (beta != 0.0f) {
            x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, cr));
            x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, cr + 16));
        }
        _mm512_mask_storeu_ps(cr, m0, x0);
        _mm512_mask_storeu_ps(cr + 16, m1, x1);
    }
}

/* Transposes a 16 x 16 block held in 16 registers: afterwards r[c] holds what was column c. Four
   rounds of shuffles (pairs of floats, of doubles, then 128-bit lanes twice). */
__attribute__((target("avx512f"))) static inline void gemm_transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4) {
        __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
        __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2)), r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3)), r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int i = 0; i < 16; i += 8)
        for (int q = 0; q < 4; q++) {
            t[i + q] = _mm512_shuffle_f32x4(r[i + q], r[i + q + 4], 0x88);
            t[i + q + 4] = _mm512_shuffle_f32x4(r[i + q], r[i + q + 4], 0xdd);
        }
    for (int q = 0; q < 4; q++) {
        r[q] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0x88), r[q + 4] = _mm512_shuffle_f32x4(t[q + 4], t[q + 12], 0x88);
        r[q + 8] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0xdd), r[q + 12] = _mm512_shuffle_f32x4(t[q + 4], t[q + 12], 0xdd);
    }
}

/* Copies `rows` rows (row stride ld) of `cols` contiguous floats, the rest as zeros, transposed into
   dst: element (row, c) lands at dst[c * dst_ld + row], for row < width (16 or 12: the store mask),
   c < cols. 16 x 16 blocks through gemm_transpose16, so a panel of a row-major operand packs at
   vector speed. */
__attribute__((target("avx512f"))) static void gemm_pack_transposed(float *dst, int dst_ld, int width, const float *src,
                                                                     int ld, int rows, int cols) {
    __mmask16 store = width >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << width) - 1);
    for (int c0 = 0; c0 < cols; c0 += 16) {
        __m512 r[16];
        __mmask16 load = gemm_mask(cols - c0);
        int n = cols - c0 < 16 ? cols - c0 : 16;
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_maskz_loadu_ps(load, src + (size_t)i * ld + c0) : _mm512_setzero_ps();
        gemm_transpose16(r);
        for (int c = 0; c < n; c++) _mm512_mask_storeu_ps(dst + (size_t)(c0 + c) * dst_ld, store, r[c]);
    }
}

/* Packs op(B) rows [k0, k0+kc), columns [j0, j0+nc) into panels of 32 columns (zero-padded). */
__attribute__((target("avx512f"))) static void gemm_pack_b(float *packed, int trans_b, const float *B, int ldb, int k0,
                                                            int kc, int j0, int nc) {
    for (int j = 0; j < nc; j += GEMM_NR) {
        float *panel = packed + (size_t)j * kc;
        int nr = nc - j < GEMM_NR ? nc - j : GEMM_NR;
        if (!trans_b) { // row k of op(B) is contiguous
            __mmask16 m0 = gemm_mask(nr), m1 = gemm_mask(nr - 16);
            for (int k = 0; k < kc; k++) {
                const float *src = B + (size_t)(k0 + k) * ldb + j0 + j;
                _mm512_store_ps(panel + k * GEMM_NR, _mm512_maskz_loadu_ps(m0, src));
                _mm512_store_ps(panel + k * GEMM_NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        } else // column n of op(B) is row n of B: two 16-row halves, transposed
            for (int half = 0; half < 2; half++)
                gemm_pack_transposed(panel + 16 * half, GEMM_NR, 16, B + (size_t)(j0 + j + 16 * half) * ldb + k0, ldb,
                                     nr - 16 * half, kc);
    }
}

/* Packs op(A) rows [i0, i0+mc), columns [k0, k0+kc) into panels of 12 rows (zero-padded). */
__attribute__((target("avx512f"))) static void gemm_pack_a(float *packed, int trans_a, const float *A, int lda, int i0,
                                                            int mc, int k0, int kc) {
    for (int i = 0; i < mc; i += GEMM_MR) {
        float *panel = packed + (size_t)i * kc;
        int mr = mc - i < GEMM_MR ? mc - i : GEMM_MR;
        if (trans_a) { // column k of op(A) is row k of A: 12 contiguous values per step
            __mmask16 load = gemm_mask(mr);
            for (int k = 0; k < kc; k++)
                _mm512_mask_storeu_ps(panel + k * GEMM_MR, 0x0fff, _mm512_maskz_loadu_ps(load, A + (size_t)(k0 + k) * lda + i0 + i));
        } else // row r of op(A) is contiguous: transposed
            gemm_pack_transposed(panel, GEMM_MR, GEMM_MR, A + (size_t)(i0 + i) * lda + k0, lda, mr, kc);
    }
}

__attribute__((target("avx512f"))) static void gemm_avx512(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                                            const float *A, int lda, const float *B, int ldb, float beta,
                                                            const float *bias, float *C, int ldc) {
    float *packed_a = gemm_packed, *packed_b = gemm_packed + GEMM_MC * GEMM_KC;
    for (int j0 = 0; j0 < N; j0 += GEMM_NC) {
        int nc = N - j0 < GEMM_NC ? N - j0 : GEMM_NC;
        for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
            int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
            float block_beta = k0 == 0 ? beta : 1.0f; // later K blocks add to what the first one wrote
            const float *block_bias = k0 == 0 ? bias : NULL; // ... which added the bias
            gemm_pack_b(packed_b, trans_b, B, ldb, k0, kc, j0, nc);
            for (int i0 = 0; i0 < M; i0 += GEMM_MC) {
                int mc = M - i0 < GEMM_MC ? M - i0 : GEMM_MC;
                gemm_pack_a(packed_a, trans_a, A, lda, i0, mc, k0, kc);
                for (int j = 0; j < nc; j += GEMM_NR)
                    for (int i = 0; i < mc; i += GEMM_MR)
                        gemm_kernel_12x32(kc, packed_a + (size_t)i * kc, packed_b + (size_t)j * kc,
                                          C + (size_t)(i0 + i) * ldc + j0 + j, ldc, mc - i < GEMM_MR ? mc - i : GEMM_MR,
                                          nc - j, alpha, block_beta, block_bias ? block_bias + j0 + j : NULL);
            }
        }
    }
}

static void gemm_make_key(void) { gemm_key_ok = pthread_key_create(&gemm_key, free) == 0; }

/* 1 once this thread has its packing buffers (allocated on its first call), 0 if they cannot be had. */
static int gemm_buffers(void) {
    void *both = NULL;
    if (gemm_packed) return 1;
    pthread_once(&gemm_key_once, gemm_make_key);
    if (!gemm_key_ok || posix_memalign(&both, 64, sizeof(float) * (GEMM_MC + GEMM_NC) * GEMM_KC)) return 0;
    if (pthread_setspecific(gemm_key, both) != 0) {
        free(both);
        return 0;
    }
    gemm_packed = (float *)both;
    return 1;
}

#endif /* EXAMPLE_GEMM_AVX512 */

/* OpenBLAS's x86-64 cores (as openblas_get_corename() names them) whose kernels are AVX2 or older. */
static const char *const example_gemm_pre_avx512_cores[] = {
    "Haswell",   "Zen",       "Sandybridge", "Excavator", "Steamroller", "Piledriver",
    "Bulldozer", "Nehalem",   "Barcelona",   "Core2",     "Penryn",      "Dunnington",
    "Atom",      "Nano",      "Bobcat",      "Opteron",   "Opteron_SSE3", "Prescott"};

/* c in lower case (ASCII: no locale). */
static int example_gemm_lower(char c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

/* a and b equal, ignoring case (an OpenBLAS built for one target names it in capitals: "HASWELL"). */
static int example_gemm_same_name(const char *a, const char *b) {
    for (; *a && example_gemm_lower(*a) == example_gemm_lower(*b); a++, b++) {}
    return example_gemm_lower(*a) == example_gemm_lower(*b);
}

/* The rule, without side effects: 1 to run the AVX-512 kernel, 0 to call cblas_sgemm, given whether
   the CPU (and OS) can run AVX-512F, openblas_get_corename()'s answer and EXAMPLE_SGEMM's value
   (either may be NULL). A core name not in the list (NULL, "", "Unknown", or a core newer than this
   file) gets OpenBLAS: the kernel is only known to win over OpenBLAS's pre-AVX-512 kernels. */
EXAMPLE_GEMM_UNUSED static int example_gemm_choose(int cpu_has_avx512f, const char *openblas_corename,
                                                   const char *example_sgemm_env) {
    if (!cpu_has_avx512f || (example_sgemm_env && strcmp(example_sgemm_env, "openblas") == 0)) return 0;
    if (example_sgemm_env && strcmp(example_sgemm_env, "own") == 0) return 1;
    if (!openblas_corename) return 0;
    for (size_t i = 0; i < sizeof example_gemm_pre_avx512_cores / sizeof example_gemm_pre_avx512_cores[0]; i++)
        if (example_gemm_same_name(openblas_corename, example_gemm_pre_avx512_cores[i])) return 1;
    return 0;
}

/* The choice and its name for the banners, made once per process (the CPU, the environment and
   OpenBLAS's core do not change). */
static int example_gemm_own;
static char example_gemm_name[96] = "OpenBLAS cblas_sgemm";

static void example_gemm_decide(void) {
    const char *core = openblas_get_corename();
#if EXAMPLE_GEMM_AVX512
    example_gemm_own = example_gemm_choose(__builtin_cpu_supports("avx512f"), core, getenv("EXAMPLE_SGEMM"));
#endif
    snprintf(example_gemm_name, sizeof example_gemm_name,
             example_gemm_own ? "own AVX-512 kernel (OpenBLAS would run its %.40s kernels)"
                              : "OpenBLAS cblas_sgemm, its %.40s kernels",
             core && *core ? core : "unnamed");
}

static pthread_once_t example_gemm_decided = PTHREAD_ONCE_INIT;

/* 1 if example_sgemm runs the AVX-512 kernel here, 0 if it calls OpenBLAS. */
EXAMPLE_GEMM_UNUSED static int example_sgemm_is_own(void) {
    pthread_once(&example_gemm_decided, example_gemm_decide);
    return example_gemm_own;
}

/* What example_sgemm uses, for the programs' banners. */
EXAMPLE_GEMM_UNUSED static const char *example_sgemm_name(void) {
    pthread_once(&example_gemm_decided, example_gemm_decide);
    return example_gemm_name;
}

/* The bytes of packing buffers a thread touches multiplying a product of N columns and depth K
   (0 where OpenBLAS does the work): for memory estimates (the largest over a model's products). */
EXAMPLE_GEMM_UNUSED static size_t example_sgemm_scratch_bytes(int N, int K) {
#if EXAMPLE_GEMM_AVX512
    size_t kc = (size_t)(K < GEMM_KC ? K : GEMM_KC), nc = (size_t)(N + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
    if (!example_sgemm_is_own() || N <= 0 || K <= 0) return 0;
    return sizeof(float) * kc * (GEMM_MC + (nc < GEMM_NC ? nc : GEMM_NC));
#else
    (void)N, (void)K;
    return 0;
#endif
}

/* C (M,N) = op(A) @ op(B) + beta * C, plus bias (N) on every row if not NULL: the one function
   behind example_sgemm and example_sgemm_bias. */
static void example_sgemm_any(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *B, int ldb, float beta, const float *bias, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
#if EXAMPLE_GEMM_AVX512
    if (example_sgemm_is_own() && (beta == 0.0f || beta == 1.0f) && K > 0 && gemm_buffers()) {
        gemm_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
        return;
    }
#endif
    if (bias) { // C += bias first, then the product on top
        for (int i = 0; i < M; i++) {
            float *row = C + (size_t)i * ldc;
            if (beta == 0.0f) memcpy(row, bias, sizeof(float) * (size_t)N);
            else for (int j = 0; j < N; j++) row[j] = beta * row[j] + bias[j];
        }
        beta = 1.0f;
    }
    if (K <= 0) { // no product: cblas may not accept it
        for (int i = 0; i < M && beta != 1.0f; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A, lda, B, ldb, beta, C, ldc);
}

/* cblas_sgemm(CblasRowMajor, ...) with 0/1 for the transposes; beta must be 0 or 1 on the AVX-512
   path (all the models need), anything on OpenBLAS's. */
EXAMPLE_GEMM_UNUSED static void example_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                                              int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    example_sgemm_any(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc);
}

/* C (M,N) = op(A) @ op(B) + bias (N) on every row: a Linear layer's forward. The AVX-512 kernel
   adds the bias as it stores C (no separate pass over C). */
EXAMPLE_GEMM_UNUSED static void example_sgemm_bias(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                                                   const float *B, int ldb, const float *bias, float *C, int ldc) {
    example_sgemm_any(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc);
}

/* "AMD EPYC 9R14 (family 25 model 17; AVX-512), 2 CPUs; example_sgemm 180 GFLOP/s on one core":
   the CPU and its measured peak for a benchmark's banner (machines change between runs, so every
   figure is printed beside them). The peak is the best of a few 512^3 products on this thread,
   through the kernel the examples use (about 0.1 s). */
EXAMPLE_GEMM_UNUSED static void example_machine_line(char *out, size_t size) {
    char cpu[256];
    int n = 512;
    example_cpu_line(cpu, sizeof cpu);
    float *a = example_floats((size_t)n * n, 1), *b = example_floats((size_t)n * n, 1), *c = example_floats((size_t)n * n, 1);
    double best = 0;
    for (int rep = 0; a && b && c && rep < 5; rep++) {
        double t = fsdp_now();
        example_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t = fsdp_now() - t;
        if (t > 0 && 2.0 * n * n * n / t > best) best = 2.0 * n * n * n / t;
    }
    free(a), free(b), free(c);
    snprintf(out, size, "%s; example_sgemm %.0f GFLOP/s on one core (%s)", cpu, best / 1e9, example_sgemm_name());
}

#endif /* EXAMPLE_GEMM_H */
