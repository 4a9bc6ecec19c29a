/* gpt_model.h - the GPT-2 model of examples/gpt.c, shared with tests/test_gpt.c.

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
   transpose them when moving weights to or from transformers.)

   The same forward and backward run on FSDP-managed weights (gpt.ctx set: the hooks gather and
   reshard around each block) or on plain arrays (gpt.ctx NULL: the no-FSDP baseline the test
   compares against, and the sampler at the end of training).

   Include after fsdp.h (with FSDP_IMPLEMENTATION) and <cblas.h>. Everything here is static. */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_common.h"

#if defined(__GNUC__) || defined(__clang__)
#  define GPT_UNUSED __attribute__((unused)) /* for what only one of the two programs calls */
#else
#  define GPT_UNUSED
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
/* layers */

// out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) token ids, wte (V,C), wpe (maxT,C)
static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            const float *wte_ix = wte + (size_t)inp[b * T + t] * C, *wpe_t = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i] + wpe_t[i];
        }
}

// dwte (V,C) += dout at each token's row; dwpe (maxT,C) += dout at each position's row
static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
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
static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C) {
    const float eps = 1e-5f; // PyTorch's default
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *x = inp + bt * C;
        float *out_bt = out + bt * C, m = 0, v = 0, s;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C; // biased variance, as PyTorch's LayerNorm
        s = 1.0f / sqrtf(v + eps);
        for (int i = 0; i < C; i++) out_bt[i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[bt] = m, rstd[bt] = s;
    }
}

// dinp (B,T,C) +=, dweight (C) +=, dbias (C) += the gradients of layernorm_forward given dout (B,T,C)
static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *dout_bt = dout + bt * C, *x = inp + bt * C;
        float *dinp_bt = dinp + bt * C, m = mean[bt], s = rstd[bt], dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) { // two reductions: the mean of dnorm and of dnorm * norm
            float norm = (x[i] - m) * s, dnorm = weight[i] * dout_bt[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C, dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
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
    int N = B * T;
    if (bias) for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * (size_t)OC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

// dinp (B,T,C) += dout (B,T,OC) @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += dout summed over B,T
// dbias may be NULL (no bias)
static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int B, int T, int C, int OC) {
    int N = B * T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
}

// Causal multi-head self-attention. inp (B,T,3C) holds query, key, value side by side (c_attn's
// output); out (B,T,C) the heads' outputs side by side. preatt, att (B,NH,T,T): scores and their
// softmax, kept for backward (entries t2 > t unused and left zero in att).
static void attention_forward(float *out, float *preatt, float *att, const float *inp, int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *query_t = inp + ((size_t)b * T + t) * C3 + h * hs;
                float *preatt_bth = preatt + (((size_t)b * NH + h) * T + t) * T;
                float *att_bth = att + (((size_t)b * NH + h) * T + t) * T;
                float *out_bth = out + ((size_t)b * T + t) * C + h * hs;
                float maxval = -INFINITY, expsum = 0;
                for (int t2 = 0; t2 <= t; t2++) { // scores against every key up to t
                    const float *key_t2 = inp + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float dot = 0;
                    for (int i = 0; i < hs; i++) dot += query_t[i] * key_t2[i];
                    preatt_bth[t2] = dot * scale;
                    if (preatt_bth[t2] > maxval) maxval = preatt_bth[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) expsum += att_bth[t2] = expf(preatt_bth[t2] - maxval);
                for (int t2 = 0; t2 < T; t2++) att_bth[t2] = t2 <= t ? att_bth[t2] / expsum : 0.0f;
                for (int i = 0; i < hs; i++) out_bth[i] = 0;
                for (int t2 = 0; t2 <= t; t2++) { // weighted sum of the values
                    const float *value_t2 = inp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) out_bth[i] += att_bth[t2] * value_t2[i];
                }
            }
}

// dinp (B,T,3C) += the gradient of attention_forward given dout (B,T,C). dpreatt, datt (B,NH,T,T)
// are scratch, accumulated into (+=): pass them zeroed.
static void attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout, const float *inp,
                               const float *att, int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *att_bth = att + (((size_t)b * NH + h) * T + t) * T;
                float *datt_bth = datt + (((size_t)b * NH + h) * T + t) * T;
                float *dpreatt_bth = dpreatt + (((size_t)b * NH + h) * T + t) * T;
                const float *query_t = inp + ((size_t)b * T + t) * C3 + h * hs;
                float *dquery_t = dinp + ((size_t)b * T + t) * C3 + h * hs;
                const float *dout_bth = dout + ((size_t)b * T + t) * C + h * hs;
                float dot = 0;
                for (int t2 = 0; t2 <= t; t2++) { // through the weighted sum of the values
                    const float *value_t2 = inp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    float *dvalue_t2 = dinp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        datt_bth[t2] += value_t2[i] * dout_bth[i];
                        dvalue_t2[i] += att_bth[t2] * dout_bth[i];
                    }
                }
                // through the softmax: dpreatt = att * (datt - sum over t2 of att * datt)
                for (int t2 = 0; t2 <= t; t2++) dot += att_bth[t2] * datt_bth[t2];
                for (int t2 = 0; t2 <= t; t2++) dpreatt_bth[t2] += att_bth[t2] * (datt_bth[t2] - dot);
                for (int t2 = 0; t2 <= t; t2++) { // through the query-key dot products
                    const float *key_t2 = inp + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float *dkey_t2 = dinp + ((size_t)b * T + t2) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dquery_t[i] += key_t2[i] * dpreatt_bth[t2] * scale;
                        dkey_t2[i] += query_t[i] * dpreatt_bth[t2] * scale;
                    }
                }
            }
}

#define GELU_SCALING_FACTOR 0.7978845608f // sqrt(2 / pi)

// out (N) = GELU(inp), tanh approximation (GPT-2's "gelu_new")
static void gelu_forward(float *out, const float *inp, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
    }
}

// dinp (N) += GELU'(inp) * dout
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        float tanh_arg = GELU_SCALING_FACTOR * (x + cube), tanh_out = tanhf(tanh_arg);
        float sech2 = 1.0f - tanh_out * tanh_out;
        float local_grad = 0.5f * (1.0f + tanh_out) +
                           x * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += local_grad * dout[i];
    }
}

// out (N) = inp1 + inp2
static void residual_forward(float *out, const float *inp1, const float *inp2, size_t N) {
    for (size_t i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

// dinp1 (N) += dout; dinp2 (N) += dout
static void residual_backward(float *dinp1, float *dinp2, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

// probs (B,T,V) = softmax(logits (B,T,V)); losses (B,T) = -log probs[target], computed as
// logsumexp - logit[target] (stable). targets NULL: probs only (sampling).
static void softmax_crossentropy_forward(float *losses, float *probs, const float *logits, const int *targets, int B,
                                         int T, int V) {
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *z = logits + bt * V;
        float *p = probs + bt * V, maxz = -INFINITY;
        double sum = 0;
        for (int v = 0; v < V; v++) maxz = z[v] > maxz ? z[v] : maxz;
        for (int v = 0; v < V; v++) sum += p[v] = expf(z[v] - maxz);
        for (int v = 0; v < V; v++) p[v] = (float)(p[v] / sum);
        if (targets) losses[bt] = (float)(log(sum) - (double)(z[targets[bt]] - maxz));
    }
}

// dlogits (B,T,V) += (probs - onehot(target)) * dlosses, the gradient through softmax and crossentropy
static void softmax_crossentropy_backward(float *dlogits, const float *dlosses, const float *probs, const int *targets,
                                          int B, int T, int V) {
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const float *p = probs + bt * V;
        float *dz = dlogits + bt * V;
        for (int v = 0; v < V; v++) dz[v] += (p[v] - (v == targets[bt] ? 1.0f : 0.0f)) * dlosses[bt];
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
    m->plain = (float *)malloc(sizeof(float) * m->num_params);
    m->dplain = (float *)calloc(m->num_params, sizeof(float));
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
    m->plain = (float *)malloc(sizeof(float) * m->num_params);
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

/* Activations of one local batch (B,T), one buffer carved by a sizes table, llm.c's layout. */
typedef struct {
    float *encoded;    // (B,T,C)
    float *ln1;        // (L,B,T,C)
    float *ln1_mean;   // (L,B,T)
    float *ln1_rstd;   // (L,B,T)
    float *qkv;        // (L,B,T,3C)
    float *atty;       // (L,B,T,C)
    float *preatt;     // (L,B,NH,T,T)
    float *att;        // (L,B,NH,T,T)
    float *attproj;    // (L,B,T,C)
    float *residual2;  // (L,B,T,C)
    float *ln2;        // (L,B,T,C)
    float *ln2_mean;   // (L,B,T)
    float *ln2_rstd;   // (L,B,T)
    float *fch;        // (L,B,T,4C)
    float *fch_gelu;   // (L,B,T,4C)
    float *fcproj;     // (L,B,T,C)
    float *residual3;  // (L,B,T,C)
    float *lnf;        // (B,T,C)
    float *lnf_mean;   // (B,T)
    float *lnf_rstd;   // (B,T)
    float *logits;     // (B,T,V)
    float *probs;      // (B,T,V)
    float *losses;     // (B,T)
} activations;
#define NUM_ACTIVATIONS 23

typedef struct {
    int B, T;                // the largest batch they hold
    activations a, da;       // the activations and their gradients (same layout)
    float *memory, *grad_memory;
    size_t num_floats;       // of each
    int *inputs, *targets;   // (B,T)
} gpt_acts;

static int gpt_acts_alloc(gpt_acts *acts, const gpt_config *c, int B, int T) {
    size_t L = (size_t)c->num_layers, NH = (size_t)c->num_heads, C = (size_t)c->channels, V = (size_t)c->vocab_size;
    size_t BT = (size_t)B * (size_t)T;
    size_t sizes[NUM_ACTIVATIONS] = {
        BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C, L * BT * NH * T, L * BT * NH * T,
        L * BT * C, L * BT * C, L * BT * C, L * BT, L * BT, L * BT * 4 * C, L * BT * 4 * C, L * BT * C, L * BT * C,
        BT * C, BT, BT, BT * V, BT * V, BT};
    activations *both[2];
    memset(acts, 0, sizeof *acts);
    acts->B = B, acts->T = T;
    for (int i = 0; i < NUM_ACTIVATIONS; i++) acts->num_floats += sizes[i];
    acts->memory = (float *)calloc(acts->num_floats, sizeof(float));
    acts->grad_memory = (float *)calloc(acts->num_floats, sizeof(float));
    acts->inputs = (int *)calloc(BT, sizeof(int));
    acts->targets = (int *)calloc(BT, sizeof(int));
    if (!acts->memory || !acts->grad_memory || !acts->inputs || !acts->targets) return -1;
    both[0] = &acts->a, both[1] = &acts->da;
    for (int k = 0; k < 2; k++) {
        activations *x = both[k];
        float **ptrs[NUM_ACTIVATIONS] = {&x->encoded, &x->ln1, &x->ln1_mean, &x->ln1_rstd, &x->qkv, &x->atty,
                                         &x->preatt, &x->att, &x->attproj, &x->residual2, &x->ln2, &x->ln2_mean,
                                         &x->ln2_rstd, &x->fch, &x->fch_gelu, &x->fcproj, &x->residual3, &x->lnf,
                                         &x->lnf_mean, &x->lnf_rstd, &x->logits, &x->probs, &x->losses};
        float *at = k ? acts->grad_memory : acts->memory;
        for (int i = 0; i < NUM_ACTIVATIONS; i++) *ptrs[i] = at, at += sizes[i];
    }
    return 0;
}

static void gpt_acts_free(gpt_acts *acts) {
    free(acts->memory);
    free(acts->grad_memory);
    free(acts->inputs);
    free(acts->targets);
    memset(acts, 0, sizeof *acts);
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

/* Forward over acts->inputs (B,T), B <= acts->B and T <= acts->T (smaller T: the sampler).
   With acts->targets (targets non-zero), *loss gets the mean loss over the B*T positions;
   otherwise only probs. Returns 0 or -1 (a hook failed; the message went to stderr). */
static int gpt_forward(gpt *m, gpt_acts *acts, int B, int T, int targets, float *loss) {
    const gpt_config *c = &m->config;
    int L = c->num_layers, NH = c->num_heads, C = c->channels, V = c->vocab_size;
    size_t BTC = (size_t)B * T * C;
    activations *a = &acts->a;
    float *root[NUM_ROOT_PARAMS], *residual;
    if (GPT_HOOK(m, fsdp_pre_forward, 0) || gpt_tensors(m, m->root_param, NUM_ROOT_PARAMS, 0, root, "not gathered"))
        return -1;
    encoder_forward(a->encoded, acts->inputs, root[WTE], root[WPE], B, T, C);
    for (int l = 0; l < L; l++) {
        float *w[NUM_BLOCK_PARAMS];
        float *l_ln1 = a->ln1 + l * BTC, *l_ln1_mean = a->ln1_mean + (size_t)l * B * T;
        float *l_ln1_rstd = a->ln1_rstd + (size_t)l * B * T, *l_qkv = a->qkv + l * 3 * BTC, *l_atty = a->atty + l * BTC;
        float *l_preatt = a->preatt + (size_t)l * B * NH * T * T, *l_att = a->att + (size_t)l * B * NH * T * T;
        float *l_attproj = a->attproj + l * BTC, *l_residual2 = a->residual2 + l * BTC, *l_ln2 = a->ln2 + l * BTC;
        float *l_ln2_mean = a->ln2_mean + (size_t)l * B * T, *l_ln2_rstd = a->ln2_rstd + (size_t)l * B * T;
        float *l_fch = a->fch + l * 4 * BTC, *l_fch_gelu = a->fch_gelu + l * 4 * BTC, *l_fcproj = a->fcproj + l * BTC;
        float *l_residual3 = a->residual3 + l * BTC;
        residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * BTC;
        if (GPT_HOOK(m, fsdp_pre_forward, m->block[l]) || gpt_tensors(m, m->param[l], NUM_BLOCK_PARAMS, 0, w, "not gathered"))
            return -1;
        layernorm_forward(l_ln1, l_ln1_mean, l_ln1_rstd, residual, w[LN1W], w[LN1B], B, T, C);
        matmul_forward(l_qkv, l_ln1, w[QKVW], w[QKVB], B, T, C, 3 * C);
        attention_forward(l_atty, l_preatt, l_att, l_qkv, B, T, C, NH);
        matmul_forward(l_attproj, l_atty, w[ATTPROJW], w[ATTPROJB], B, T, C, C);
        residual_forward(l_residual2, residual, l_attproj, BTC);
        layernorm_forward(l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, w[LN2W], w[LN2B], B, T, C);
        matmul_forward(l_fch, l_ln2, w[FCW], w[FCB], B, T, C, 4 * C);
        gelu_forward(l_fch_gelu, l_fch, 4 * BTC);
        matmul_forward(l_fcproj, l_fch_gelu, w[FCPROJW], w[FCPROJB], B, T, 4 * C, C);
        residual_forward(l_residual3, l_residual2, l_fcproj, BTC);
        if (GPT_HOOK(m, fsdp_post_forward, m->block[l])) return -1;
    }
    residual = a->residual3 + (L - 1) * BTC;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, root[LNFW], root[LNFB], B, T, C);
    matmul_forward(a->logits, a->lnf, root[WTE], NULL, B, T, C, V); // the LM head, tied to wte
    softmax_crossentropy_forward(a->losses, a->probs, a->logits, targets ? acts->targets : NULL, B, T, V);
    if (targets) {
        double sum = 0;
        for (size_t i = 0; i < (size_t)B * T; i++) sum += a->losses[i];
        *loss = (float)(sum / ((double)B * T));
    }
    return GPT_HOOK(m, fsdp_post_forward, 0);
}

/* Backward of the mean loss of the last gpt_forward (with targets, same B and T): accumulates
   into the parameters' gradients (fsdp_grad, or m->dplain). The root's backward encloses the
   blocks': the LM head and ln_f come first, the embeddings last. */
static int gpt_backward(gpt *m, gpt_acts *acts, int B, int T) {
    const gpt_config *c = &m->config;
    int L = c->num_layers, NH = c->num_heads, C = c->channels, V = c->vocab_size;
    size_t BTC = (size_t)B * T * C;
    activations *a = &acts->a, *da = &acts->da;
    float *root[NUM_ROOT_PARAMS], *droot[NUM_ROOT_PARAMS], *residual, *dresidual;
    memset(acts->grad_memory, 0, sizeof(float) * acts->num_floats);
    if (GPT_HOOK(m, fsdp_pre_backward, 0) || gpt_tensors(m, m->root_param, NUM_ROOT_PARAMS, 0, root, "not gathered") ||
        gpt_tensors(m, m->root_param, NUM_ROOT_PARAMS, 1, droot, "no gradient buffer"))
        return -1;
    for (size_t i = 0; i < (size_t)B * T; i++) da->losses[i] = 1.0f / ((float)B * T); // d(mean)/d(each loss)
    softmax_crossentropy_backward(da->logits, da->losses, a->probs, acts->targets, B, T, V);
    matmul_backward(da->lnf, droot[WTE], NULL, da->logits, a->lnf, root[WTE], B, T, C, V);
    residual = a->residual3 + (L - 1) * BTC;
    dresidual = da->residual3 + (L - 1) * BTC;
    layernorm_backward(dresidual, droot[LNFW], droot[LNFB], da->lnf, residual, root[LNFW], a->lnf_mean, a->lnf_rstd, B,
                       T, C);
    for (int l = L - 1; l >= 0; l--) {
        float *w[NUM_BLOCK_PARAMS], *dw[NUM_BLOCK_PARAMS];
        size_t at1 = (size_t)l * B * T, att_at = (size_t)l * B * NH * T * T;
        residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * BTC;
        dresidual = l == 0 ? da->encoded : da->residual3 + (l - 1) * BTC;
        if (GPT_HOOK(m, fsdp_pre_backward, m->block[l]) ||
            gpt_tensors(m, m->param[l], NUM_BLOCK_PARAMS, 0, w, "not gathered") ||
            gpt_tensors(m, m->param[l], NUM_BLOCK_PARAMS, 1, dw, "no gradient buffer"))
            return -1;
        residual_backward(da->residual2 + l * BTC, da->fcproj + l * BTC, da->residual3 + l * BTC, BTC);
        matmul_backward(da->fch_gelu + l * 4 * BTC, dw[FCPROJW], dw[FCPROJB], da->fcproj + l * BTC,
                        a->fch_gelu + l * 4 * BTC, w[FCPROJW], B, T, 4 * C, C);
        gelu_backward(da->fch + l * 4 * BTC, a->fch + l * 4 * BTC, da->fch_gelu + l * 4 * BTC, 4 * BTC);
        matmul_backward(da->ln2 + l * BTC, dw[FCW], dw[FCB], da->fch + l * 4 * BTC, a->ln2 + l * BTC, w[FCW], B, T, C,
                        4 * C);
        layernorm_backward(da->residual2 + l * BTC, dw[LN2W], dw[LN2B], da->ln2 + l * BTC, a->residual2 + l * BTC,
                           w[LN2W], a->ln2_mean + at1, a->ln2_rstd + at1, B, T, C);
        residual_backward(dresidual, da->attproj + l * BTC, da->residual2 + l * BTC, BTC);
        matmul_backward(da->atty + l * BTC, dw[ATTPROJW], dw[ATTPROJB], da->attproj + l * BTC, a->atty + l * BTC,
                        w[ATTPROJW], B, T, C, C);
        attention_backward(da->qkv + l * 3 * BTC, da->preatt + att_at, da->att + att_at, da->atty + l * BTC,
                           a->qkv + l * 3 * BTC, a->att + att_at, B, T, C, NH);
        matmul_backward(da->ln1 + l * BTC, dw[QKVW], dw[QKVB], da->qkv + l * 3 * BTC, a->ln1 + l * BTC, w[QKVW], B, T, C,
                        3 * C);
        layernorm_backward(dresidual, dw[LN1W], dw[LN1B], da->ln1 + l * BTC, residual, w[LN1W], a->ln1_mean + at1,
                           a->ln1_rstd + at1, B, T, C);
        if (GPT_HOOK(m, fsdp_post_backward, m->block[l])) return -1;
    }
    encoder_backward(droot[WTE], droot[WPE], da->encoded, acts->inputs, B, T, C);
    return GPT_HOOK(m, fsdp_post_backward, 0);
}

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

#endif /* GPT_MODEL_H */
