/* gpt_model.h - the GPT-2 model of examples/gpt.c, shared with tests/test_gpt.c and
   examples/bench_train.c.

   A GPT-2 style decoder over bytes, written llm.c style: one function per layer and direction,
   outputs first, gradients named d* and accumulated with +=, shapes in comments, parameters
   described by one sizes table. Names and layouts follow the Hugging Face GPT-2 state dict,
   with every matrix in PyTorch nn.Linear layout (out, in):

       GPT                          root: wte.weight (V,C), wpe.weight (maxT,C), ln_f.weight/bias (C)
       h            ModuleList
       h.<i>        Block           one FSDP unit each (wrap policy: type "Block")
         ln_1       LayerNorm       weight (C), bias (C)
         attn.c_attn  Linear        weight (3C,C), bias (3C)    fused query, key, value
         attn.c_proj  Linear        weight (C,C), bias (C)
         ln_2       LayerNorm
         mlp.c_fc   Linear          weight (4C,C), bias (4C)
         mlp.c_proj Linear          weight (C,4C), bias (C)

   The LM head is tied to wte (logits = ln_f(x) @ wte^T), as in GPT-2, so wte lives in the root
   unit and receives gradient twice: from the head at the start of backward and from the
   embedding at its end; the root's backward encloses the blocks', so both land in the same
   gradient buffer. (HF's GPT-2 stores these four matrices transposed, as Conv1D (in, out):
   transpose them when moving weights to or from transformers.) tests/torch_gpt.py is the same
   model in PyTorch; test_gpt checks that both give the same loss and gradients.

   The same forward and backward run on FSDP-managed weights (gpt.ctx set: the hooks gather and
   reshard around each block) or on plain arrays (gpt.ctx NULL: the no-FSDP baseline the test
   compares against, and the sampler at the end of training).

   Memory: with activation checkpointing (gpt_acts_alloc_ex's recompute_every) forward keeps only
   the inputs of the recomputed blocks, and backward runs each one's forward again inside its own
   backward, between fsdp_pre_backward and the gradient code, wrapped in fsdp_pre_forward /
   fsdp_post_forward (fsdp.h takes those as the recomputation: the unit is gathered already, so no
   second all-gather). Bitwise the same gradients. gpt_backward_from_dlogits starts backward from
   any loss's logit gradient (distill.c's); gpt_heldout_loss scores text forward only, through the
   hooks, each rank a share.

   Speed, on one core per rank: every matrix product, the attention's included (one per head),
   goes through example_sgemm (example_gemm.h: an AVX-512 kernel where the CPU has AVX-512 and
   OpenBLAS would run older kernels, OpenBLAS otherwise). The other layers are loops the compiler
   vectorises: no libm call per element (exp is gpt_expf below), float sums kept in GPT_LANES
   partial sums (a compiler may not reorder a float sum by itself), and, with GCC or clang on
   x86-64, each compiled three times (AVX-512, AVX2+FMA, SSE2) with the CPU's best picked at run
   time (GPT_SIMD). Backward keeps one layer's activation gradients at a time, not all of them.
   Pointers marked restrict must not overlap.
   Compile with -O3 -fno-math-errno -fno-trapping-math (the Makefile's EXAMPLE_OPT): GCC's -O2
   vectorises almost none of these loops; never with -ffast-math (see gpt_expf).

   Include after fsdp.h (with FSDP_IMPLEMENTATION) and <cblas.h>. Everything here is static. */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_common.h"
#include "example_gemm.h"

#if defined(__GNUC__) || defined(__clang__)
#  define GPT_UNUSED __attribute__((unused)) /* for what only one of the two programs calls */
#else
#  define GPT_UNUSED
#endif

/* One copy of a function per instruction set, chosen when the program starts (GCC/clang
   function multi-versioning through ifunc); elsewhere the plain function. */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__) && !defined(GPT_NO_CLONES)
#  define GPT_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#  define GPT_SIMD
#endif

#define GPT_MAX_LAYERS 64

typedef struct {
    int vocab_size;   // V: 256 for bytes
    int max_seq_len;  // maxT: rows of wpe
    int num_layers;   // L
    int num_heads;    // NH, divides C
    int channels;     // C
} gpt_config;

/* ----------------------------------------------------------------------------------------- */
/* arithmetic the compiler vectorises */

/* Partial sums per reduction. A loop `for (i...) lane[i % GPT_LANES] += ...` is GPT_LANES
   independent sums the compiler can put in one vector register; the lanes are added at the end.
   The order of the additions is fixed by this source, not by the instruction set. */
#define GPT_LANES 16

/* exp(x), within 2 ulp for x in [-87, 88] (clamped there: below, 1.6e-38 instead of a denormal
   or 0; above, 1.7e38). x = n ln2 + r with |r| <= ln2/2, exp(r) by its Taylor series to r^7
   (truncation 8e-9), then 2^n put into the exponent bits. n is rounded by adding 1.5 * 2^23,
   which leaves round(x / ln2) in the low mantissa bits (so never compile this with
   -ffast-math, which would fold (t + c) - c to t). No libm call and no branch, so loops over it
   vectorise (with -fno-trapping-math, which lets the compiler evaluate both arms of a clamp).
   The clamp is written as max and min, which the compiler turns into those instructions (they make
   a NaN -87: the NaN is given back at the end). Written instead as `x < -87 ? -87 : x`, which keeps
   a NaN by itself, GCC 12 specialised the clamped lanes with masked moves, and GELU's forward ran
   2.6x slower on this project's Zen 5 machine (8 M elements: 10.6 ms, now 4.0); same values. */
static inline float gpt_expf(float x) {
    const float round_magic = 12582912.0f; // 1.5 * 2^23
    float y = x > -87.0f ? x : -87.0f, t, n, r, p, two_n;
    int32_t i, bits;
    y = y < 88.0f ? y : 88.0f;
    t = y * 1.44269504f + round_magic;
    n = t - round_magic;                                   // round(y / ln2), as a float
    memcpy(&i, &t, sizeof i);
    i -= 0x4b400000;                                       // ... and as an integer: t's bits minus round_magic's
    r = (y - n * 0.693145751953125f) - n * 1.42860677e-6f; // ln2 in two parts: n * the first is exact
    p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    bits = (i + 127) << 23;
    memcpy(&two_n, &bits, sizeof two_n);
    return x == x ? p * two_n : x;
}

/* ----------------------------------------------------------------------------------------- */
/* layers */

// out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) token ids, wte (V,C), wpe (maxT,C)
GPT_SIMD static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            const float *wte_ix = wte + (size_t)inp[b * T + t] * C, *wpe_t = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i] + wpe_t[i];
        }
}

// dwte (V,C) += dout at each token's row; dwpe (maxT,C) += dout at each position's row
GPT_SIMD static void encoder_backward(float *restrict dwte, float *restrict dwpe, const float *restrict dout,
                                      const int *restrict inp, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwte_ix = dwte + (size_t)inp[b * T + t] * C, *dwpe_t = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                dwte_ix[i] += dout_bt[i];
                dwpe_t[i] += dout_bt[i];
            }
        }
}

// out (B,T,C) = (inp - mean) * rstd * weight + bias over the last dimension; mean, rstd (B,T) kept for backward
GPT_SIMD static void layernorm_forward(float *restrict out, float *restrict mean, float *restrict rstd,
                                       const float *restrict inp, const float *restrict weight, const float *restrict bias,
                                       int B, int T, int C) {
    const float eps = 1e-5f; // PyTorch's default
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *x = inp + bt * C;
        float *out_bt = out + bt * C, sum[GPT_LANES] = {0}, sumsq[GPT_LANES] = {0}, m = 0, v = 0, s;
        int i;
        for (i = 0; i + GPT_LANES <= C; i += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) sum[j] += x[i + j];
        for (; i < C; i++) sum[i % GPT_LANES] += x[i];
        for (int j = 0; j < GPT_LANES; j++) m += sum[j];
        m /= C;
        for (i = 0; i < C; i++) out_bt[i] = x[i] - m; // centred first: the variance without cancellation
        for (i = 0; i + GPT_LANES <= C; i += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) sumsq[j] += out_bt[i + j] * out_bt[i + j];
        for (; i < C; i++) sumsq[i % GPT_LANES] += out_bt[i] * out_bt[i];
        for (int j = 0; j < GPT_LANES; j++) v += sumsq[j];
        v /= C; // biased variance, as PyTorch's LayerNorm
        s = 1.0f / sqrtf(v + eps);
        for (i = 0; i < C; i++) out_bt[i] = out_bt[i] * s * weight[i] + bias[i];
        mean[bt] = m, rstd[bt] = s;
    }
}

// dinp (B,T,C) +=, dweight (C) +=, dbias (C) += the gradients of layernorm_forward given dout (B,T,C)
GPT_SIMD static void layernorm_backward(float *restrict dinp, float *restrict dweight, float *restrict dbias,
                                        const float *restrict dout, const float *restrict inp, const float *restrict weight,
                                        const float *restrict mean, const float *restrict rstd, int B, int T, int C) {
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *dout_bt = dout + bt * C, *x = inp + bt * C;
        float *dinp_bt = dinp + bt * C, m = mean[bt], s = rstd[bt], dnorm_mean = 0, dnorm_norm_mean = 0;
        float sum_dnorm[GPT_LANES] = {0}, sum_dnorm_norm[GPT_LANES] = {0};
        int i;
        for (i = 0; i + GPT_LANES <= C; i += GPT_LANES) // two reductions: the means of dnorm and of dnorm * norm
            for (int j = 0; j < GPT_LANES; j++) {
                float norm = (x[i + j] - m) * s, dnorm = weight[i + j] * dout_bt[i + j];
                sum_dnorm[j] += dnorm;
                sum_dnorm_norm[j] += dnorm * norm;
            }
        for (; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = weight[i] * dout_bt[i];
            sum_dnorm[i % GPT_LANES] += dnorm;
            sum_dnorm_norm[i % GPT_LANES] += dnorm * norm;
        }
        for (int j = 0; j < GPT_LANES; j++) dnorm_mean += sum_dnorm[j], dnorm_norm_mean += sum_dnorm_norm[j];
        dnorm_mean /= C, dnorm_norm_mean /= C;
        for (i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = weight[i] * dout_bt[i];
            dbias[i] += dout_bt[i];
            dweight[i] += norm * dout_bt[i];
            dinp_bt[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

// out (B,T,OC) = inp (B,T,C) @ weight^T + bias; weight (OC,C) as nn.Linear, bias (OC) or NULL
static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int B, int T, int C,
                           int OC) {
    example_sgemm_bias(0, 1, B * T, OC, C, inp, C, weight, C, bias, out, OC);
}

// the bias gradient: dbias (OC) += dout (N,OC) summed over its rows
GPT_SIMD static void bias_backward(float *dbias, const float *dout, int N, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
}

// dinp (B,T,C) += dout (B,T,OC) @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += dout summed over B,T
// dbias may be NULL (no bias)
static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int B, int T, int C, int OC) {
    int N = B * T;
    example_sgemm(0, 0, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    example_sgemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

// In place over each row t of att (T,T): the scaled scores of keys 0..t become their softmax,
// the entries t2 > t (future keys) become 0.
GPT_SIMD static void attention_softmax(float *att, int T, float scale) {
    for (int t = 0; t < T; t++) {
        float *row = att + (size_t)t * T, maxval = -INFINITY, expsum = 0, inv;
        float lane_max[GPT_LANES], lane_sum[GPT_LANES] = {0};
        int n = t + 1, i;
        for (int j = 0; j < GPT_LANES; j++) lane_max[j] = -INFINITY;
        for (i = 0; i + GPT_LANES <= n; i += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) lane_max[j] = row[i + j] > lane_max[j] ? row[i + j] : lane_max[j];
        for (; i < n; i++) lane_max[i % GPT_LANES] = row[i] > lane_max[i % GPT_LANES] ? row[i] : lane_max[i % GPT_LANES];
        for (int j = 0; j < GPT_LANES; j++) maxval = lane_max[j] > maxval ? lane_max[j] : maxval;
        for (i = 0; i < n; i++) row[i] = gpt_expf((row[i] - maxval) * scale);
        for (i = 0; i + GPT_LANES <= n; i += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) lane_sum[j] += row[i + j];
        for (; i < n; i++) lane_sum[i % GPT_LANES] += row[i];
        for (int j = 0; j < GPT_LANES; j++) expsum += lane_sum[j];
        inv = 1.0f / expsum;
        for (i = 0; i < n; i++) row[i] *= inv;
        for (; i < T; i++) row[i] = 0.0f;
    }
}

/* Queries are taken in blocks of this many: block [t0, t0 + rows) needs the keys [0, t0 + rows)
   only (causal), so the products skip the upper triangle block by block (3/8 of the work at
   T = 256, 1/4 at T = 128). A multiple of the sgemm tile's 32 columns. */
#define ATTENTION_BLOCK 64

// Causal multi-head self-attention. inp (B,T,3C) holds query, key, value side by side (c_attn's
// output); out (B,T,C) the heads' outputs side by side; att (B,NH,T,T) the attention weights,
// softmax(q k^T / sqrt(hs)) over keys up to each query, kept for backward (0 above the diagonal).
// Per (b, h), matrix products on strided views of inp: scores = Q K^T, out_h = att V.
static void attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *query = inp + (size_t)b * T * C3 + h * hs, *key = query + C, *value = query + 2 * C;
            float *att_bh = att + ((size_t)b * NH + h) * T * T, *out_bh = out + (size_t)b * T * C + h * hs;
            for (int t0 = 0; t0 < T; t0 += ATTENTION_BLOCK) { // (rows, keys) = (rows, hs) (hs, keys)
                int rows = T - t0 < ATTENTION_BLOCK ? T - t0 : ATTENTION_BLOCK, keys = t0 + rows;
                example_sgemm(0, 1, rows, keys, hs, 1.0f, query + (size_t)t0 * C3, C3, key, C3, 0.0f,
                              att_bh + (size_t)t0 * T, T);
            }
            attention_softmax(att_bh, T, scale);
            for (int t0 = 0; t0 < T; t0 += ATTENTION_BLOCK) { // (rows, hs) = (rows, keys) (keys, hs)
                int rows = T - t0 < ATTENTION_BLOCK ? T - t0 : ATTENTION_BLOCK, keys = t0 + rows;
                example_sgemm(0, 0, rows, hs, keys, 1.0f, att_bh + (size_t)t0 * T, T, value, C3, 0.0f,
                              out_bh + (size_t)t0 * C, C);
            }
        }
}

// In place over each row t of datt (T,T): the gradient of the attention weights becomes the
// gradient of the scores through the softmax, dpreatt = att * (datt - sum over t2 of att * datt),
// times the score scale; 0 above the diagonal (att is 0 there).
GPT_SIMD static void attention_softmax_backward(float *datt, const float *att, int T, float scale) {
    for (int t = 0; t < T; t++) {
        float *drow = datt + (size_t)t * T, dot = 0, lane[GPT_LANES] = {0};
        const float *row = att + (size_t)t * T;
        int n = t + 1, i;
        for (i = 0; i + GPT_LANES <= n; i += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) lane[j] += row[i + j] * drow[i + j];
        for (; i < n; i++) lane[i % GPT_LANES] += row[i] * drow[i];
        for (int j = 0; j < GPT_LANES; j++) dot += lane[j];
        for (i = 0; i < n; i++) drow[i] = row[i] * (drow[i] - dot) * scale;
        for (; i < T; i++) drow[i] = 0.0f;
    }
}

// dinp (B,T,3C) += the gradient of attention_forward given dout (B,T,C). datt (T,T) is scratch.
// Per (b, h): dV += att^T dout_h, datt = dout_h V^T, through the softmax, dQ += datt K,
// dK += datt^T Q; by blocks of ATTENTION_BLOCK queries (datt, dQ) or keys (dV, dK: key j only
// receives from queries t >= j).
static void attention_backward(float *dinp, float *datt, const float *dout, const float *inp, const float *att, int B,
                               int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *query = inp + (size_t)b * T * C3 + h * hs, *key = query + C, *value = query + 2 * C;
            float *dquery = dinp + (size_t)b * T * C3 + h * hs, *dkey = dquery + C, *dvalue = dquery + 2 * C;
            const float *att_bh = att + ((size_t)b * NH + h) * T * T, *dout_bh = dout + (size_t)b * T * C + h * hs;
            for (int t0 = 0; t0 < T; t0 += ATTENTION_BLOCK) {
                int n = T - t0 < ATTENTION_BLOCK ? T - t0 : ATTENTION_BLOCK, keys = t0 + n;
                // keys [t0, t0+n): (n, hs) += (T-t0, n)^T (T-t0, hs), the queries that see them
                example_sgemm(1, 0, n, hs, T - t0, 1.0f, att_bh + (size_t)t0 * T + t0, T, dout_bh + (size_t)t0 * C, C,
                              1.0f, dvalue + (size_t)t0 * C3, C3);
                // queries [t0, t0+n): (n, keys) = (n, hs) (hs, keys)
                example_sgemm(0, 1, n, keys, hs, 1.0f, dout_bh + (size_t)t0 * C, C, value, C3, 0.0f,
                              datt + (size_t)t0 * T, T);
            }
            attention_softmax_backward(datt, att_bh, T, scale);
            for (int t0 = 0; t0 < T; t0 += ATTENTION_BLOCK) {
                int n = T - t0 < ATTENTION_BLOCK ? T - t0 : ATTENTION_BLOCK, keys = t0 + n;
                // queries [t0, t0+n): (n, hs) += (n, keys) (keys, hs)
                example_sgemm(0, 0, n, hs, keys, 1.0f, datt + (size_t)t0 * T, T, key, C3, 1.0f, dquery + (size_t)t0 * C3,
                              C3);
                // keys [t0, t0+n): (n, hs) += (T-t0, n)^T (T-t0, hs)
                example_sgemm(1, 0, n, hs, T - t0, 1.0f, datt + (size_t)t0 * T + t0, T, query + (size_t)t0 * C3, C3,
                              1.0f, dkey + (size_t)t0 * C3, C3);
            }
        }
}

#define GELU_SCALING_FACTOR 0.7978845608f // sqrt(2 / pi)

// out (N) = GELU(inp), tanh approximation (GPT-2's "gelu_new"):
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), written as x / (1 + exp(-2u)) (the same
// function: 0.5 (1 + tanh(u)) is the logistic sigmoid of 2u), which needs one exp and keeps its
// relative precision for negative x, where 1 + tanh(u) cancels.
GPT_SIMD static void gelu_forward(float *restrict out, const float *restrict inp, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i], u = GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x);
        float s = 1.0f / (1.0f + gpt_expf(-2.0f * u)); // (x times a reciprocal: GCC vectorises x / (...) badly here)
        out[i] = x * s;
    }
}

// dinp (N) += GELU'(inp) * dout. With s = sigmoid(2u): GELU = x s, GELU' = s + 2 x s (1 - s) du/dx
GPT_SIMD static void gelu_backward(float *restrict dinp, const float *restrict inp, const float *restrict dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i], u = GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x);
        float s = 1.0f / (1.0f + gpt_expf(-2.0f * u)), du = GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

// out (N) = inp1 + inp2
GPT_SIMD static void residual_forward(float *out, const float *inp1, const float *inp2, size_t N) {
    for (size_t i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

// dinp1 (N) += dout; dinp2 (N) += dout. (gpt_backward needs no call: it accumulates the residual
// stream's gradient in one buffer, which is both branches' dout. Not multi-versioned: clang does
// not take target_clones together with the unused attribute.)
GPT_UNUSED static void residual_backward(float *dinp1, float *dinp2, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

// probs (B,T,V) = softmax(logits (B,T,V)); losses (B,T) = -log probs[target], computed as
// log(sum of exp(logit - max)) - (logit[target] - max) (stable). targets NULL: probs only (sampling).
GPT_SIMD static void softmax_crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets,
                                                  int B, int T, int V) {
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *z = logits + bt * V;
        float *p = probs + bt * V, maxz = -INFINITY, sum = 0, inv, lane_max[GPT_LANES], lane_sum[GPT_LANES] = {0};
        int v;
        for (int j = 0; j < GPT_LANES; j++) lane_max[j] = -INFINITY;
        for (v = 0; v + GPT_LANES <= V; v += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) lane_max[j] = z[v + j] > lane_max[j] ? z[v + j] : lane_max[j];
        for (; v < V; v++) lane_max[v % GPT_LANES] = z[v] > lane_max[v % GPT_LANES] ? z[v] : lane_max[v % GPT_LANES];
        for (int j = 0; j < GPT_LANES; j++) maxz = lane_max[j] > maxz ? lane_max[j] : maxz;
        for (v = 0; v < V; v++) p[v] = gpt_expf(z[v] - maxz);
        for (v = 0; v + GPT_LANES <= V; v += GPT_LANES)
            for (int j = 0; j < GPT_LANES; j++) lane_sum[j] += p[v + j];
        for (; v < V; v++) lane_sum[v % GPT_LANES] += p[v];
        for (int j = 0; j < GPT_LANES; j++) sum += lane_sum[j];
        inv = 1.0f / sum;
        for (v = 0; v < V; v++) p[v] *= inv;
        if (targets) losses[bt] = logf(sum) - (z[targets[bt]] - maxz);
    }
}

// dlogits (B,T,V) += (probs - onehot(target)) * dlosses, the gradient through softmax and crossentropy
GPT_SIMD static void softmax_crossentropy_backward(float *dlogits, const float *dlosses, const float *probs,
                                                   const int *targets, int B, int T, int V) {
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *p = probs + bt * V;
        float *dz = dlogits + bt * V, dloss = dlosses[bt];
        for (int v = 0; v < V; v++) dz[v] += p[v] * dloss;
        dz[targets[bt]] -= dloss;
    }
}

/* ----------------------------------------------------------------------------------------- */
/* model */

enum { WTE, WPE, LNFW, LNFB, NUM_ROOT_PARAMS };
enum { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, NUM_BLOCK_PARAMS };
enum { MOD_LN1, MOD_ATTN, MOD_C_ATTN, MOD_ATTN_C_PROJ, MOD_LN2, MOD_MLP, MOD_C_FC, MOD_MLP_C_PROJ, NUM_BLOCK_MODULES };

typedef struct {
    int module;          // MOD_* (block parameters) or -1 (a root module named like the parameter)
    const char *name;    // local name in its module
    int64_t rows, cols;  // shape (rows, cols); cols 0: a vector (rows)
    fsdp_init_rule init;
} param_spec;

/* The sizes table. Initialisation as GPT-2: matrices and embeddings N(0, 0.02), the two
   residual projections (c_proj) N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. Each
   element is computed from (seed, name, index), so every world size starts from bitwise the
   same model. */
static void gpt_param_specs(const gpt_config *c, param_spec root[NUM_ROOT_PARAMS], param_spec block[NUM_BLOCK_PARAMS]) {
    int64_t V = c->vocab_size, maxT = c->max_seq_len, C = c->channels;
    fsdp_init_rule normal = {FSDP_INIT_NORMAL, 0.0f, 0.02f, NULL, NULL};
    fsdp_init_rule scaled = {FSDP_INIT_NORMAL, 0.0f, 0.02f / sqrtf(2.0f * (float)c->num_layers), NULL, NULL};
    fsdp_init_rule zeros = {FSDP_INIT_ZEROS, 0.0f, 0.0f, NULL, NULL}, ones = {FSDP_INIT_ONES, 0.0f, 0.0f, NULL, NULL};
    param_spec r[NUM_ROOT_PARAMS] = {
        {-1, "wte", V, C, normal}, {-1, "wpe", maxT, C, normal}, {-1, "ln_f", C, 0, ones}, {-1, "ln_f", C, 0, zeros}};
    param_spec b[NUM_BLOCK_PARAMS] = {
        {MOD_LN1, "weight", C, 0, ones},           {MOD_LN1, "bias", C, 0, zeros},
        {MOD_C_ATTN, "weight", 3 * C, C, normal},  {MOD_C_ATTN, "bias", 3 * C, 0, zeros},
        {MOD_ATTN_C_PROJ, "weight", C, C, scaled}, {MOD_ATTN_C_PROJ, "bias", C, 0, zeros},
        {MOD_LN2, "weight", C, 0, ones},           {MOD_LN2, "bias", C, 0, zeros},
        {MOD_C_FC, "weight", 4 * C, C, normal},    {MOD_C_FC, "bias", 4 * C, 0, zeros},
        {MOD_MLP_C_PROJ, "weight", C, 4 * C, scaled}, {MOD_MLP_C_PROJ, "bias", C, 0, zeros}};
    memcpy(root, r, sizeof r);
    memcpy(block, b, sizeof b);
}

typedef struct {
    gpt_config config;
    fsdp_model *model;                          // names, shapes and init rules, for fsdp_init
    int root_param[NUM_ROOT_PARAMS];            // parameter ids of wte, wpe, ln_f.weight, ln_f.bias
    int block[GPT_MAX_LAYERS];                  // module id of h.<i>: the hooks' argument
    int param[GPT_MAX_LAYERS][NUM_BLOCK_PARAMS]; // parameter ids of h.<i>'s tensors
    size_t num_params;                          // elements of all parameters
    fsdp_ctx *ctx;                              // FSDP runtime; NULL: the plain arrays below
    float *plain, *dplain;                      // plain: every parameter and its gradient, in id order
    size_t *plain_offset;                       // where parameter id starts in plain and dplain
    int rank;                                   // for messages
    double hook_seconds;                        // time spent inside the fsdp hooks (waiting for gathers)
} gpt;

/* Describes the model to fsdp.h (registration order = HF state dict order: wte, wpe, h.0 ..
   h.<L-1>, ln_f). Returns 0, or -1 with a message on stderr. */
static int gpt_build(gpt *m, gpt_config config) {
    static const char *const block_modules[NUM_BLOCK_MODULES][3] = { // name, type, parent (MOD_* or "")
        {"ln_1", "LayerNorm", ""}, {"attn", "CausalSelfAttention", ""}, {"c_attn", "Linear", "attn"},
        {"c_proj", "Linear", "attn"}, {"ln_2", "LayerNorm", ""}, {"mlp", "MLP", ""}, {"c_fc", "Linear", "mlp"},
        {"c_proj", "Linear", "mlp"}};
    param_spec root[NUM_ROOT_PARAMS], block[NUM_BLOCK_PARAMS];
    int list, ln_f = 0, C = config.channels;
    memset(m, 0, sizeof *m);
    m->config = config;
    if (config.num_layers < 1 || config.num_layers > GPT_MAX_LAYERS || config.num_heads < 1 || C < 1 ||
        C % config.num_heads != 0 || config.vocab_size < 1 || config.max_seq_len < 1) {
        fprintf(stderr, "gpt: invalid model: %d layers (1..%d), %d heads, %d channels (a multiple of the heads)\n",
                config.num_layers, GPT_MAX_LAYERS, config.num_heads, C);
        return -1;
    }
    gpt_param_specs(&config, root, block);
    if (fsdp_model_create(&m->model, "GPT")) goto fail;
    for (int k = 0; k < 2; k++) { // wte, wpe: Embedding modules
        int64_t shape[2] = {root[k].rows, root[k].cols};
        int mod = fsdp_model_module(m->model, 0, root[k].name, "Embedding");
        if (mod < 0 || (m->root_param[k] = fsdp_model_param(m->model, mod, "weight", 2, shape, root[k].init)) < 0)
            goto fail;
    }
    if ((list = fsdp_model_module(m->model, 0, "h", "ModuleList")) < 0) goto fail;
    for (int l = 0; l < config.num_layers; l++) {
        int mod[NUM_BLOCK_MODULES];
        char name[16];
        snprintf(name, sizeof name, "%d", l);
        if ((m->block[l] = fsdp_model_module(m->model, list, name, "Block")) < 0) goto fail;
        for (int k = 0; k < NUM_BLOCK_MODULES; k++) {
            int parent = !block_modules[k][2][0] ? m->block[l] : !strcmp(block_modules[k][2], "attn") ? mod[MOD_ATTN] : mod[MOD_MLP];
            if ((mod[k] = fsdp_model_module(m->model, parent, block_modules[k][0], block_modules[k][1])) < 0) goto fail;
        }
        for (int k = 0; k < NUM_BLOCK_PARAMS; k++) {
            int64_t shape[2] = {block[k].rows, block[k].cols};
            if ((m->param[l][k] = fsdp_model_param(m->model, mod[block[k].module], block[k].name, block[k].cols ? 2 : 1,
                                                   shape, block[k].init)) < 0)
                goto fail;
        }
    }
    if ((ln_f = fsdp_model_module(m->model, 0, "ln_f", "LayerNorm")) < 0) goto fail;
    for (int k = LNFW; k <= LNFB; k++) {
        int64_t shape[1] = {root[k].rows};
        if ((m->root_param[k] = fsdp_model_param(m->model, ln_f, k == LNFW ? "weight" : "bias", 1, shape, root[k].init)) < 0)
            goto fail;
    }
    for (int p = 0; p < fsdp_model_num_params(m->model); p++) m->num_params += (size_t)fsdp_model_param_numel(m->model, p);
    return 0;
fail:
    fprintf(stderr, "gpt: describing the model to fsdp.h failed (out of memory?)\n");
    return -1;
}

/* The no-FSDP baseline: parameters in one plain buffer, initialised exactly as fsdp_init would. */
GPT_UNUSED static int gpt_plain_init(gpt *m, uint64_t seed) {
    size_t at = 0;
    int n = fsdp_model_num_params(m->model);
    m->plain = example_floats(m->num_params, 0);
    m->dplain = example_floats(m->num_params, 1);
    m->plain_offset = (size_t *)malloc(sizeof(size_t) * (size_t)n);
    if (!m->plain || !m->dplain || !m->plain_offset) return -1;
    for (int p = 0; p < n; p++) {
        int64_t numel = fsdp_model_param_numel(m->model, p);
        m->plain_offset[p] = at;
        for (int64_t i = 0; i < numel; i++) m->plain[at + (size_t)i] = fsdp_init_value(m->model, p, i, seed);
        at += (size_t)numel;
    }
    return 0;
}

/* A plain copy of the FSDP-trained weights, for the sampler: collective (fsdp_gather_param on
   every rank; each then holds the whole model). Sets up m->plain and m->plain_offset like
   gpt_plain_init and leaves m->ctx alone. Returns 0, or -1 (out of memory, or a gather failed:
   fsdp_last_error says why); a rank that returns early makes the others' gathers fail, not hang,
   once it leaves its rank function. */
GPT_UNUSED static int gpt_plain_gather(gpt *m) {
    size_t at = 0;
    int n = fsdp_model_num_params(m->model);
    m->plain = example_floats(m->num_params, 0);
    m->plain_offset = (size_t *)malloc(sizeof(size_t) * (size_t)n);
    if (!m->plain || !m->plain_offset) return -1;
    for (int p = 0; p < n; p++) {
        m->plain_offset[p] = at;
        if (fsdp_gather_param(m->ctx, p, m->plain + at)) return -1;
        at += (size_t)fsdp_model_param_numel(m->model, p);
    }
    return 0;
}

static void gpt_free(gpt *m) {
    fsdp_model_destroy(m->model);
    free(m->plain);
    free(m->dplain);
    free(m->plain_offset);
    m->model = NULL, m->plain = m->dplain = NULL, m->plain_offset = NULL;
}

/* Activations of one local batch (B,T), one buffer carved by a sizes table, llm.c's layout:
   what forward keeps for backward. The block outputs (residual3) are kept for every layer: each
   is the next block's input. What a block keeps inside (ln1 .. fch_gelu) lives in a slot: every
   block has its own, except with activation checkpointing (gpt_acts_alloc_ex's
   recompute_every), where the recomputed blocks share one scratch slot. Forward fills it and
   moves on; backward runs the block's forward again into it (gpt_backward), so only the block's
   input has to survive from forward to backward. */
typedef struct {
    float *encoded;    // (B,T,C)
    float *ln1;        // (S,B,T,C)  S: slots
    float *ln1_mean;   // (S,B,T)
    float *ln1_rstd;   // (S,B,T)
    float *qkv;        // (S,B,T,3C)
    float *atty;       // (S,B,T,C)
    float *att;        // (S,B,NH,T,T)
    float *residual2;  // (S,B,T,C)
    float *ln2;        // (S,B,T,C)
    float *ln2_mean;   // (S,B,T)
    float *ln2_rstd;   // (S,B,T)
    float *fch;        // (S,B,T,4C)
    float *fch_gelu;   // (S,B,T,4C)
    float *residual3;  // (L,B,T,C)  block outputs
    float *lnf;        // (B,T,C)
    float *lnf_mean;   // (B,T)
    float *lnf_rstd;   // (B,T)
    float *logits;     // (B,T,V)
    float *probs;      // (B,T,V)
    float *losses;     // (B,T)
    float *proj;       // (B,T,C) scratch: c_proj's output before it joins the residual stream
} activations;
#define NUM_ACTIVATIONS 21

/* Their gradients, for one layer at a time: backward walks the layers down and needs only the
   current one's (they are zeroed before each use, so the layer functions can accumulate). */
typedef struct {
    float *dresidual;  // (B,T,C) the residual stream's: residual3 of the current layer, then residual2, then
                       //         the layer's input (residual3 of the one below); c_proj's dout on the way
    float *dln;        // (B,T,C) a LayerNorm output's (ln_f, ln_2, ln_1 in turn)
    float *dqkv;       // (B,T,3C)
    float *datty;      // (B,T,C)
    float *datt;       // (T,T) attention_backward's scratch
    float *dfch;       // (B,T,4C)
    float *dfch_gelu;  // (B,T,4C)
    float *dlogits;    // (B,T,V)
    float *dlosses;    // (B,T)
} activation_grads;
#define NUM_ACTIVATION_GRADS 9

typedef struct {
    int B, T;                // the largest batch they hold
    activations a;
    activation_grads da;     // all NULL when allocated without gradients (forward only)
    float *memory;           // both, in one allocation
    size_t num_floats;       // of memory
    int *inputs, *targets;   // (B,T)
    int num_slots;           // S
    int slot[GPT_MAX_LAYERS];          // where block l keeps its activations
    unsigned char recomputed[GPT_MAX_LAYERS]; // 1: block l's forward runs again in backward
} gpt_acts;

/* Whether block l is recomputed in backward when every recompute_every-th block is (blocks 0,
   k, 2k, ...; 1: all of them, 0: none). */
static int gpt_block_recomputed(int l, int recompute_every) { return recompute_every > 0 && l % recompute_every == 0; }

/* The slots: one per block kept whole, plus one shared by the recomputed blocks (if any). */
static int gpt_num_slots(int L, int recompute_every) {
    int recomputed = 0;
    for (int l = 0; l < L; l++) recomputed += gpt_block_recomputed(l, recompute_every);
    return L - recomputed + (recomputed > 0);
}

/* The sizes table: the elements of each buffer of activations, then of activation_grads (0 without
   gradients). */
static void gpt_acts_sizes(const gpt_config *c, int B, int T, int recompute_every, int with_grads,
                           size_t sizes[NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS]) {
    size_t L = (size_t)c->num_layers, NH = (size_t)c->num_heads, C = (size_t)c->channels, V = (size_t)c->vocab_size;
    size_t S = (size_t)gpt_num_slots(c->num_layers, recompute_every), BT = (size_t)B * (size_t)T, g = with_grads != 0;
    size_t table[NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS] = {
        BT * C, S * BT * C, S * BT, S * BT, S * BT * 3 * C, S * BT * C, S * BT * NH * T, S * BT * C, S * BT * C, S * BT,
        S * BT, S * BT * 4 * C, S * BT * 4 * C, L * BT * C, BT * C, BT, BT, BT * V, BT * V, BT, BT * C,
        g * BT * C, g * BT * C, g * BT * 3 * C, g * BT * C, g * T * T, g * BT * 4 * C, g * BT * 4 * C, g * BT * V, g * BT};
    memcpy(sizes, table, sizeof table);
}

/* The bytes of packing buffers example_sgemm touches for the largest of this model's products with
   B sequences of T: (columns, depth) of the Linear layers' forward (OC, C) and input gradient (C, OC),
   their weight gradients (C, B T rows), the LM head's (V, C) and (C, V), attention's (T, hs), (hs, T). */
GPT_UNUSED static size_t gpt_sgemm_scratch_bytes(const gpt_config *c, int B, int T) {
    int C = c->channels, V = c->vocab_size, hs = C / c->num_heads;
    const int shapes[][2] = {{4 * C, C}, {C, 4 * C}, {3 * C, C}, {C, 3 * C}, {C, B * T}, {V, C}, {C, V}, {T, hs}, {hs, T}};
    size_t most = 0;
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        size_t bytes = example_sgemm_scratch_bytes(shapes[i][0], shapes[i][1]);
        most = bytes > most ? bytes : most;
    }
    return most;
}

/* Bytes gpt_acts_alloc_ex(c, B, T, recompute_every, with_grads) allocates for activations (for
   memory estimates before anything is allocated). */
GPT_UNUSED static size_t gpt_acts_bytes(const gpt_config *c, int B, int T, int recompute_every, int with_grads) {
    size_t sizes[NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS], floats = 0;
    gpt_acts_sizes(c, B, T, recompute_every, with_grads, sizes);
    for (int i = 0; i < NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS; i++) floats += (sizes[i] + 15) & ~(size_t)15;
    return sizeof(float) * floats;
}

/* Activations for batches up to (B,T). recompute_every: activation checkpointing of every k-th
   block (see gpt_block_recomputed; 0: off); with_grads 0: forward only (a teacher, evaluation),
   no activation gradients. Returns 0, or -1 if out of memory. */
static int gpt_acts_alloc_ex(gpt_acts *acts, const gpt_config *c, int B, int T, int recompute_every, int with_grads) {
    size_t sizes[NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS];
    activations *x = &acts->a;
    activation_grads *d = &acts->da;
    float **ptrs[NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS] = {
        &x->encoded, &x->ln1, &x->ln1_mean, &x->ln1_rstd, &x->qkv, &x->atty, &x->att, &x->residual2, &x->ln2,
        &x->ln2_mean, &x->ln2_rstd, &x->fch, &x->fch_gelu, &x->residual3, &x->lnf, &x->lnf_mean, &x->lnf_rstd,
        &x->logits, &x->probs, &x->losses, &x->proj,
        &d->dresidual, &d->dln, &d->dqkv, &d->datty, &d->datt, &d->dfch, &d->dfch_gelu, &d->dlogits, &d->dlosses};
    float *at;
    int own = 0, shared;
    memset(acts, 0, sizeof *acts);
    acts->B = B, acts->T = T;
    acts->num_slots = gpt_num_slots(c->num_layers, recompute_every);
    shared = acts->num_slots - 1; // the last slot: the recomputed blocks' (if any)
    for (int l = 0; l < c->num_layers; l++) {
        acts->recomputed[l] = (unsigned char)gpt_block_recomputed(l, recompute_every);
        acts->slot[l] = acts->recomputed[l] ? shared : own++;
    }
    gpt_acts_sizes(c, B, T, recompute_every, with_grads, sizes);
    for (int i = 0; i < NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS; i++) acts->num_floats += (sizes[i] + 15) & ~(size_t)15;
    acts->memory = (float *)calloc(acts->num_floats, sizeof(float));
    acts->inputs = (int *)calloc((size_t)B * T, sizeof(int));
    acts->targets = (int *)calloc((size_t)B * T, sizeof(int));
    if (!acts->memory || !acts->inputs || !acts->targets) return -1;
    // every page touched now, not in the first step: on a VM a fresh page costs tens of times its
    // memset, and a process that rejoins a job (gpt --rejoin) would make every survivor wait for
    // its first step's faults (about 0.3 s of the medium GPT's on the test bed)
    memset(acts->memory, 0, acts->num_floats * sizeof(float));
    at = acts->memory;
    for (int i = 0; i < NUM_ACTIVATIONS + NUM_ACTIVATION_GRADS; i++) {
        *ptrs[i] = sizes[i] ? at : NULL;
        at += (sizes[i] + 15) & ~(size_t)15;
    }
    return 0;
}

/* Every block's activations kept (no recomputation), with gradients: for training. */
GPT_UNUSED static int gpt_acts_alloc(gpt_acts *acts, const gpt_config *c, int B, int T) {
    return gpt_acts_alloc_ex(acts, c, B, T, 0, 1);
}

static void gpt_acts_free(gpt_acts *acts) {
    free(acts->memory);
    free(acts->inputs);
    free(acts->targets);
    memset(acts, 0, sizeof *acts);
}

/* Block l's activations for a batch (B,T): its input, what it keeps (in its slot) and its output. */
typedef struct {
    float *input, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu, *output;
} block_activations;

static block_activations gpt_block_activations(gpt_acts *acts, const gpt_config *c, int l, int B, int T) {
    activations *a = &acts->a;
    size_t C = (size_t)c->channels, BT = (size_t)B * T, BTC = BT * C, s = (size_t)acts->slot[l];
    block_activations v;
    v.input = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BTC;
    v.ln1 = a->ln1 + s * BTC, v.ln1_mean = a->ln1_mean + s * BT, v.ln1_rstd = a->ln1_rstd + s * BT;
    v.qkv = a->qkv + s * 3 * BTC, v.atty = a->atty + s * BTC, v.att = a->att + s * BT * (size_t)c->num_heads * T;
    v.residual2 = a->residual2 + s * BTC, v.ln2 = a->ln2 + s * BTC;
    v.ln2_mean = a->ln2_mean + s * BT, v.ln2_rstd = a->ln2_rstd + s * BT;
    v.fch = a->fch + s * 4 * BTC, v.fch_gelu = a->fch_gelu + s * 4 * BTC;
    v.output = a->residual3 + (size_t)l * BTC;
    return v;
}

/* Calls an fsdp hook (nothing without a runtime), timing it and naming the module on failure. */
#define GPT_HOOK(m, hook, module) \
    ((m)->ctx ? example_hook((m)->ctx, (m)->model, (m)->rank, &(m)->hook_seconds, hook, #hook, (module), "GPT") : 0)

/* A parameter's weights or gradient: gathered by FSDP (NULL when its unit is not gathered, or
   outside backward for gradients) or the plain arrays. */
static float *gpt_weight(gpt *m, int param) {
    return m->ctx ? fsdp_param(m->ctx, param) : m->plain + m->plain_offset[param];
}
static float *gpt_gradient(gpt *m, int param) {
    return m->ctx ? fsdp_grad(m->ctx, param) : m->dplain + m->plain_offset[param];
}

/* Fills out[k] with parameter ids[k] (weights, or gradients if grad) for k < n; -1 if one is missing. */
static int gpt_tensors(gpt *m, const int *ids, int n, int grad, float **out, const char *what) {
    for (int k = 0; k < n; k++)
        if (!(out[k] = grad ? gpt_gradient(m, ids[k]) : gpt_weight(m, ids[k]))) {
            fprintf(stderr, "rank %d: %s of %s: %s\n", m->rank, grad ? "gradient" : "weights",
                    fsdp_model_param_name(m->model, ids[k]), what);
            return -1;
        }
    return 0;
}

/* One block's forward, v.input to v.output, keeping the rest of v for backward; w its weights.
   proj (B,T,C) is scratch. The same float operations every time: a recomputation in backward
   reproduces forward's activations bit for bit. */
static void gpt_block_forward(const block_activations *v, float *const *w, float *proj, int B, int T, int C, int NH) {
    size_t BTC = (size_t)B * T * C;
    layernorm_forward(v->ln1, v->ln1_mean, v->ln1_rstd, v->input, w[LN1W], w[LN1B], B, T, C);
    matmul_forward(v->qkv, v->ln1, w[QKVW], w[QKVB], B, T, C, 3 * C);
    attention_forward(v->atty, v->att, v->qkv, B, T, C, NH);
    matmul_forward(proj, v->atty, w[ATTPROJW], w[ATTPROJB], B, T, C, C);
    residual_forward(v->residual2, v->input, proj, BTC);
    layernorm_forward(v->ln2, v->ln2_mean, v->ln2_rstd, v->residual2, w[LN2W], w[LN2B], B, T, C);
    matmul_forward(v->fch, v->ln2, w[FCW], w[FCB], B, T, C, 4 * C);
    gelu_forward(v->fch_gelu, v->fch, 4 * BTC);
    matmul_forward(proj, v->fch_gelu, w[FCPROJW], w[FCPROJB], B, T, 4 * C, C);
    residual_forward(v->output, v->residual2, proj, BTC);
}

/* Forward over acts->inputs (B,T), B <= acts->B and T <= acts->T (smaller T: the sampler).
   With acts->targets (targets non-zero), *loss gets the mean loss over the B*T positions;
   otherwise only probs. Returns 0 or -1 (a hook failed; the message went to stderr). */
static int gpt_forward(gpt *m, gpt_acts *acts, int B, int T, int targets, float *loss) {
    const gpt_config *c = &m->config;
    int L = c->num_layers, C = c->channels, V = c->vocab_size;
    size_t BTC = (size_t)B * T * C, BT = (size_t)B * T;
    activations *a = &acts->a;
    float *root[NUM_ROOT_PARAMS], *residual;
    if (GPT_HOOK(m, fsdp_pre_forward, 0) || gpt_tensors(m, m->root_param, NUM_ROOT_PARAMS, 0, root, "not gathered"))
        return -1;
    encoder_forward(a->encoded, acts->inputs, root[WTE], root[WPE], B, T, C);
    for (int l = 0; l < L; l++) {
        float *w[NUM_BLOCK_PARAMS];
        block_activations v = gpt_block_activations(acts, c, l, B, T);
        if (GPT_HOOK(m, fsdp_pre_forward, m->block[l]) || gpt_tensors(m, m->param[l], NUM_BLOCK_PARAMS, 0, w, "not gathered"))
            return -1;
        gpt_block_forward(&v, w, a->proj, B, T, C, c->num_heads);
        if (GPT_HOOK(m, fsdp_post_forward, m->block[l])) return -1;
    }
    residual = a->residual3 + (L - 1) * BTC;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, root[LNFW], root[LNFB], B, T, C);
    matmul_forward(a->logits, a->lnf, root[WTE], NULL, B, T, C, V); // the LM head, tied to wte
    softmax_crossentropy_forward(a->losses, a->probs, a->logits, targets ? acts->targets : NULL, B, T, V);
    if (targets) {
        double sum = 0;
        for (size_t i = 0; i < BT; i++) sum += a->losses[i];
        *loss = (float)(sum / (double)BT);
    }
    return GPT_HOOK(m, fsdp_post_forward, 0);
}

/* Backward from da->dlogits (B,T,V), the gradient of the loss with respect to the logits of the
   last gpt_forward (same B and T): accumulates into the parameters' gradients (fsdp_grad, or
   m->dplain). The root's backward encloses the blocks': the LM head and ln_f come first, the
   embeddings last. The residual stream's gradient lives in da->dresidual throughout: a residual
   add passes its dout unchanged to both branches, so each block's c_proj reads it as its dout
   and each LayerNorm adds its input gradient to it. A recomputed block runs its forward again
   first, between its pre_backward and its backward (fsdp.h takes forward hooks there as the
   recomputation: the block is gathered already). */
static int gpt_backward_from_dlogits(gpt *m, gpt_acts *acts, int B, int T) {
    const gpt_config *c = &m->config;
    int L = c->num_layers, NH = c->num_heads, C = c->channels, V = c->vocab_size;
    size_t BTC = (size_t)B * T * C;
    activations *a = &acts->a;
    activation_grads *da = &acts->da;
    float *root[NUM_ROOT_PARAMS], *droot[NUM_ROOT_PARAMS];
    if (!da->dlogits) {
        fprintf(stderr, "rank %d: gpt_backward: the activations were allocated without gradients\n", m->rank);
        return -1;
    }
    if (GPT_HOOK(m, fsdp_pre_backward, 0) || gpt_tensors(m, m->root_param, NUM_ROOT_PARAMS, 0, root, "not gathered") ||
        gpt_tensors(m, m->root_param, NUM_ROOT_PARAMS, 1, droot, "no gradient buffer"))
        return -1;
    memset(da->dln, 0, sizeof(float) * BTC);
    matmul_backward(da->dln, droot[WTE], NULL, da->dlogits, a->lnf, root[WTE], B, T, C, V);
    memset(da->dresidual, 0, sizeof(float) * BTC);
    layernorm_backward(da->dresidual, droot[LNFW], droot[LNFB], da->dln, a->residual3 + (L - 1) * BTC, root[LNFW],
                       a->lnf_mean, a->lnf_rstd, B, T, C);
    for (int l = L - 1; l >= 0; l--) {
        float *w[NUM_BLOCK_PARAMS], *dw[NUM_BLOCK_PARAMS];
        block_activations v = gpt_block_activations(acts, c, l, B, T);
        if (GPT_HOOK(m, fsdp_pre_backward, m->block[l]) ||
            gpt_tensors(m, m->param[l], NUM_BLOCK_PARAMS, 0, w, "not gathered") ||
            gpt_tensors(m, m->param[l], NUM_BLOCK_PARAMS, 1, dw, "no gradient buffer"))
            return -1;
        if (acts->recomputed[l]) { // its input survived forward; the rest is computed again (v.output: the same values)
            if (GPT_HOOK(m, fsdp_pre_forward, m->block[l])) return -1;
            gpt_block_forward(&v, w, a->proj, B, T, C, NH);
            if (GPT_HOOK(m, fsdp_post_forward, m->block[l])) return -1;
        }
        // da->dresidual holds the gradient of this block's output, residual3
        memset(da->dfch_gelu, 0, sizeof(float) * 4 * BTC);
        matmul_backward(da->dfch_gelu, dw[FCPROJW], dw[FCPROJB], da->dresidual, v.fch_gelu, w[FCPROJW], B, T, 4 * C, C);
        memset(da->dfch, 0, sizeof(float) * 4 * BTC);
        gelu_backward(da->dfch, v.fch, da->dfch_gelu, 4 * BTC);
        memset(da->dln, 0, sizeof(float) * BTC);
        matmul_backward(da->dln, dw[FCW], dw[FCB], da->dfch, v.ln2, w[FCW], B, T, C, 4 * C);
        layernorm_backward(da->dresidual, dw[LN2W], dw[LN2B], da->dln, v.residual2, w[LN2W], v.ln2_mean, v.ln2_rstd, B,
                           T, C);
        // now the gradient of residual2
        memset(da->datty, 0, sizeof(float) * BTC);
        matmul_backward(da->datty, dw[ATTPROJW], dw[ATTPROJB], da->dresidual, v.atty, w[ATTPROJW], B, T, C, C);
        memset(da->dqkv, 0, sizeof(float) * 3 * BTC);
        attention_backward(da->dqkv, da->datt, da->datty, v.qkv, v.att, B, T, C, NH);
        memset(da->dln, 0, sizeof(float) * BTC);
        matmul_backward(da->dln, dw[QKVW], dw[QKVB], da->dqkv, v.ln1, w[QKVW], B, T, C, 3 * C);
        layernorm_backward(da->dresidual, dw[LN1W], dw[LN1B], da->dln, v.input, w[LN1W], v.ln1_mean, v.ln1_rstd, B, T, C);
        // now the gradient of the block's input
        if (GPT_HOOK(m, fsdp_post_backward, m->block[l])) return -1;
    }
    encoder_backward(droot[WTE], droot[WPE], da->dresidual, acts->inputs, B, T, C);
    return GPT_HOOK(m, fsdp_post_backward, 0);
}

/* Backward of the mean cross-entropy loss over `parts` micro-batches of the last gpt_forward's
   size (with targets, same B and T): this micro-batch's share, accumulated into the gradients
   (gradient accumulation; 1: the loss of this batch alone), times the runtime's loss scale
   (fsdp_loss_scale: 1 unless loss scaling is on, for f16). */
GPT_UNUSED static int gpt_backward_part(gpt *m, gpt_acts *acts, int B, int T, int parts) {
    size_t BT = (size_t)B * T;
    activation_grads *da = &acts->da;
    float scale = m->ctx ? fsdp_loss_scale(m->ctx) : 1.0f;
    if (!da->dlogits) return gpt_backward_from_dlogits(m, acts, B, T); // says why it cannot
    for (size_t i = 0; i < BT; i++) da->dlosses[i] = scale / (float)(BT * parts); // d(scale x mean)/d(each loss)
    memset(da->dlogits, 0, sizeof(float) * BT * m->config.vocab_size);
    softmax_crossentropy_backward(da->dlogits, da->dlosses, acts->a.probs, acts->targets, B, T, m->config.vocab_size);
    return gpt_backward_from_dlogits(m, acts, B, T);
}

/* Backward of the mean cross-entropy loss of the last gpt_forward (gpt_backward_part of one part). */
GPT_UNUSED static int gpt_backward(gpt *m, gpt_acts *acts, int B, int T) { return gpt_backward_part(m, acts, B, T, 1); }

/* ----------------------------------------------------------------------------------------- */
/* data and schedule */

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) { int64_t r = a % b; a = b; b = r; }
    return a;
}

/* The text is cut into W = (size - 1) / T windows of T + 1 bytes (window k starts at byte k*T).
   Global sequence g = step*B + b reads window (g * stride) mod W, stride coprime to W near
   0.618 W, so consecutive sequences come from far-apart places and W sequences visit every
   window once. (Texts up to 2^31 * T bytes.) This rank takes sequences lo .. hi-1 of the global batch: inputs and targets
   (hi - lo, T), targets shifted by one byte. size must be at least T + 2. */
static void data_batch(const unsigned char *text, size_t size, long long step, int B, int T, int lo, int hi,
                       int *inputs, int *targets) {
    int64_t W = (int64_t)(size - 1) / T, stride = (int64_t)(0.618 * (double)W);
    if (stride < 1) stride = 1;
    while (gcd64(stride, W) != 1) stride++;
    for (int b = lo; b < hi; b++) {
        int64_t g = (int64_t)step * B + b, k = (g % W) * stride % W; // W < 2^31: no overflow
        const unsigned char *window = text + k * T;
        for (int t = 0; t < T; t++) {
            inputs[(b - lo) * T + t] = window[t];
            targets[(b - lo) * T + t] = window[t + 1];
        }
    }
}

/* Learning rate of step `step` (0-based): linear warmup to lr over `warmup` steps, then cosine
   decay to min_lr, reached at step `steps`. */
static float lr_schedule(long long step, int steps, int warmup, float lr, float min_lr) {
    double progress;
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    progress = steps > warmup ? (double)(step - warmup) / (double)(steps - warmup) : 1.0;
    if (progress > 1) progress = 1;
    return min_lr + (float)(0.5 * (1.0 + cos(3.14159265358979323846 * progress))) * (lr - min_lr);
}

/* How many sequences of T + 1 bytes the held-out text of size bytes gives gpt_heldout_loss: its
   distinct windows (data_batch's), at most `wanted`. */
GPT_UNUSED static int gpt_heldout_sequences(size_t size, int T, int wanted) {
    size_t windows = size > (size_t)T ? (size - 1) / (size_t)T : 0;
    return windows < (size_t)wanted ? (int)windows : wanted;
}

/* Mean loss over the held-out text's first `sequences` windows (data_batch's sequences 0 ..
   sequences-1 of step 0: distinct windows if sequences <= gpt_heldout_sequences), forward only.
   Through FSDP (m->ctx set; collective over comm, the context's communicator) rank r scores
   sequences r, r+P, ... (all ranks run the same number of passes) on gathered units, each pass
   ended by fsdp_finish_backward, so no rank needs the whole model; plain weights (m->ctx NULL):
   this rank scores them all. The same weights give the same figure, bit for bit, at any P: each
   pass scores one sequence (a BLAS may round a row of a product differently in a product of
   another size, as OpenBLAS's Haswell kernels do), each sequence's loss is the mean of its T
   positions', and the sequences' are summed in sequence order. Returns 0, or -1 (a hook or
   collective failed; said on stderr). */
GPT_UNUSED static int gpt_heldout_loss(gpt *m, gpt_acts *acts, fsdp_comm *comm, const unsigned char *text, size_t size,
                                       int sequences, double *mean_loss) {
    int rank = m->ctx ? fsdp_comm_rank(comm) : 0, P = m->ctx ? fsdp_comm_size(comm) : 1, rc = 0, T = acts->T;
    int rounds = (sequences + P - 1) / P;
    float *losses = (float *)calloc((size_t)sequences + 1, sizeof(float)), loss = 0; // per sequence; others' stay 0
    double sum = 0;
    *mean_loss = 0;
    if (!losses) { fprintf(stderr, "rank %d: out of memory for the held-out losses\n", m->rank); return -1; }
    for (int i = rank; i < rounds * P && !rc; i += P) { // i >= sequences: a repeat, to keep in step, not counted
        double position_sum = 0;
        data_batch(text, size, 0, sequences, T, i % sequences, i % sequences + 1, acts->inputs, acts->targets);
        rc = gpt_forward(m, acts, 1, T, 1, &loss);
        if (!rc && m->ctx && fsdp_finish_backward(m->ctx)) {
            fprintf(stderr, "rank %d: ending a forward-only pass: %s\n", m->rank, fsdp_last_error(m->ctx));
            rc = -1;
        }
        for (int t = 0; t < T; t++) position_sum += acts->a.losses[t];
        if (!rc && i < sequences) losses[i] = (float)(position_sum / T);
    }
    // adding zeros is exact: each sequence's loss arrives as the rank that scored it computed it
    if (!rc && m->ctx && fsdp_all_reduce(comm, losses, losses, (size_t)sequences, FSDP_F32, FSDP_SUM)) {
        fprintf(stderr, "rank %d: all_reduce of the held-out losses: %s\n", m->rank, fsdp_comm_last_error(comm));
        rc = -1;
    }
    for (int i = 0; i < sequences; i++) sum += losses[i];
    *mean_loss = sum / sequences;
    free(losses);
    return rc;
}

#endif /* GPT_MODEL_H */
