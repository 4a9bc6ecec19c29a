/* test_training_features.c - specification of the training features of issue 12: activation
   checkpointing (a unit's forward recomputed during backward), frozen parameters, parameter
   groups and FSDP_STRATEGY_AUTO.

   The model is test_runtime.c's, in tests/test_mlp.h: x * scale, then Linear 5 -> 7, tanh,
   Linear 7 -> 11, tanh, Linear 11 -> 5, and the mean squared error; four units under
   FSDP_WRAP_TYPES {"Linear"}, the root holding only `scale`; no size divides by P = 2, 3 or 4.
   A unit's forward is its Linear and the tanh after it.

   Recompute modes (the backward keeps only what it says; outputs come from the recomputation):
       OWN     every Linear unit re-runs its forward inside its own backward (pre_forward and
               post_forward between its pre_backward and post_backward), from its stored input;
       SPAN    inside layers.2's backward, layers.1 (whose backward has not begun: gathered again)
               and then layers.2 are recomputed; layers.1's backward reuses that; layers.0 as OWN;
       REGION  right after the root's pre_backward, layers.1 and layers.2 are recomputed, both
               before their own backward; layers.0 as OWN.
   Frozen sets: MIXED freezes module layers.0 (a unit of its own) and layers.1.bias (a unit that
   mixes both); SKIP also freezes `scale`, so no input gradient is needed through layers.0 and
   its backward hooks are skipped; SKIP_ALL skips the (now frozen) root's hooks as well.

   The reference is plain C: the same layer functions on one process and the whole batch, then
   PyTorch's update rules written out, per element with its group's lr and weight decay, frozen
   elements left alone (no decay, no moments). fsdp.h only provides the initial values.

   How it runs: one fsdp_launch_ex per world size (P = 1, 2, 3, and 4 for HYBRID_SHARD). Each
   rank trains every configuration that runs at that P, then (P = 1, 2) the special cases:
   checkpoints, AUTO, hook misuse, invalid groups. Ranks write into MAP_SHARED regions mapped
   before the launch; children never assert, the parent compares.

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_training_features.c tests/unity/unity.c -o /tmp/ttf -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"
#include "test_mlp.h"

#define MAX_WORLD 4
#define SEED 20260522u
#define LAUNCH_TIMEOUT_MS 20000 /* bound on any wait for another rank; only reached on a hang */

/* Runs are compared with the reference within 1e-6 relative to max(|ref|, REL_FLOOR): the
   runs average per-rank gradients where the reference sums one batch, a rounding apart; 1e-2
   is the scale of the smallest parameters (biases are U(-0.1, 0.1)). */
#define TOLERANCE 1e-6
#define REL_FLOOR 1e-2

/* ---------------------------------------------------------------------------------------------
   the model (tests/test_mlp.h) and its runs
   --------------------------------------------------------------------------------------------- */
#define ROWS 48  /* rows per optimizer step, over all ranks and micro-steps; divides by 4 * P */
#define MICRO 4  /* micro-steps of the accumulation runs */
#define STEPS 3  /* optimizer steps per run */
#define UNITS 4  /* root, layers.0, layers.1, layers.2 */

static const int dims[4] = {IN, H1, H2, OUT}; /* layer l maps dims[l] -> dims[l + 1] */

/* ---------------------------------------------------------------------------------------------
   configurations
   --------------------------------------------------------------------------------------------- */
enum { RC_NONE, RC_OWN, RC_SPAN, RC_REGION };
static const char *const recompute_names[4] = {"", ", recompute OWN", ", recompute SPAN", ", recompute REGION"};
enum { FZ_NONE, FZ_MIXED, FZ_SKIP, FZ_SKIP_ALL };
static const char *const frozen_names[4] = {"", ", frozen layers.0 + layers.1.bias",
                                            ", frozen scale + layers.0 + layers.1.bias, layers.0 backward skipped",
                                            ", frozen scale + layers.0 + layers.1.bias, root and layers.0 backward skipped"};
enum { GR_NONE, GR_GPT, GR_GPT_SWAPPED, GR_SGD };
static const char *const group_names[4] = {"", ", groups {NULL ndim 0..1 wd 0} {layers.2.* wd 0.1 lr x0.5}",
                                           ", groups {layers.2.* wd 0.1 lr x0.5} {NULL ndim 0..1 wd 0}",
                                           ", groups {*.bias wd 0 lr x2} {NULL ndim 2..2 wd 0.05}"};
enum { PF_PRE, PF_POST, PF_NONE };
static const char *const prefetch_names[3] = {"", ", BACKWARD_POST", ", no prefetch"};

typedef struct optimizer_config {
    fsdp_optimizer_kind kind;
    float lr, momentum, weight_decay;
    const char *name;
    double tolerance;   /* relative, against the reference */
} optimizer_config;
enum { OPT_ADAMW, OPT_ADAM, OPT_SGD_MOMENTUM, OPT_ADAGRAD, OPTIMIZERS };
static const optimizer_config optimizers[OPTIMIZERS] = {
    {FSDP_ADAMW, 0.01f, 0.0f, 0.05f, "AdamW(lr 0.01, wd 0.05)", TOLERANCE},
    {FSDP_ADAM, 0.01f, 0.0f, 0.01f, "Adam(lr 0.01, wd 0.01)", TOLERANCE},
    {FSDP_SGD, 0.05f, 0.9f, 0.01f, "SGD(lr 0.05, momentum 0.9, wd 0.01)", TOLERANCE},
    /* Adagrad's first step moves each element by lr g / |g|: the reduction's rounding (ranks'
       averages against the reference's full batch) shows through its normalisation, 1e-6 there */
    {FSDP_OPTIMIZER_CUSTOM, 0.05f, 0.0f, 0.01f, "Adagrad(lr 0.05, wd 0.01), a row of the test's", 1e-5},
};
#define BETA1 0.9f
#define BETA2 0.999f
#define EPS 1e-8f
#define ADAGRAD_EPS 1e-10f /* torch.optim.Adagrad's default, filled in by the row's defaults */

/* An optimizer the library does not ship, added as one row (torch.optim.Adagrad without lr
   decay: sum += g^2; p -= lr g / (sqrt(sum) + eps), g with weight decay): training with it
   must match the reference below, and its state travels in checkpoints as <param>.sum. */
static void adagrad_defaults(fsdp_optimizer_desc *d) {
    if (d->eps == 0.0f) d->eps = ADAGRAD_EPS;
}
static const char *adagrad_check(const fsdp_optimizer_desc *d) { return d->eps >= 0 ? NULL : "eps must be >= 0"; }
static void adagrad_update(const fsdp_optimizer_step *s) {
    size_t i;
    for (i = 0; i < s->count; i++) {
        float g = s->grad[i] + s->weight_decay * s->param[i];
        s->state[0][i] += g * g;
        s->param[i] -= s->lr * g / (sqrtf(s->state[0][i]) + s->desc->eps);
    }
}
static const fsdp_optimizer adagrad = {"adagrad", {"sum", NULL}, NULL, adagrad_defaults, adagrad_check, adagrad_update};

/* The groups as given to fsdp_desc, and what each parameter gets from them, worked out by hand
   (wd -1: the optimizer's weight decay; lr_scale 1 unless said). */
static const fsdp_param_group groups_gpt[2] = {{NULL, 0, 1, 0.0f, 0.0f}, {"layers.2.*", 0, 0, 0.1f, 0.5f}};
static const fsdp_param_group groups_gpt_swapped[2] = {{"layers.2.*", 0, 0, 0.1f, 0.5f}, {NULL, 0, 1, 0.0f, 0.0f}};
static const fsdp_param_group groups_sgd[2] = {{"*.bias", 0, 0, 0.0f, 2.0f}, {NULL, 2, 2, 0.05f, 0.0f}};
/*                                            scale   L0.w   L0.b  L1.w   L1.b  L2.w  L2.b */
static const float expected_wd[4][NPARAMS] = {{-1, -1, -1, -1, -1, -1, -1},
                                              {0, -1, 0, -1, 0, 0.1f, 0},
                                              {0, -1, 0, -1, 0, 0.1f, 0.1f},
                                              {-1, 0.05f, 0, 0.05f, 0, 0.05f, 0}};
static const float expected_lr_scale[4][NPARAMS] = {{1, 1, 1, 1, 1, 1, 1},
                                                    {1, 1, 1, 1, 1, 0.5f, 1},
                                                    {1, 1, 1, 1, 1, 0.5f, 0.5f},
                                                    {1, 1, 2, 1, 2, 1, 2}};

#define W1 (1 << 1)
#define W2 (1 << 2)
#define W3 (1 << 3)
#define W4 (1 << 4)

typedef struct run_config {
    fsdp_strategy strategy;
    int optimizer, recompute, frozen, groups, prefetch;
    int no_sync;       /* MICRO micro-steps, no_sync on all but the last */
    int count_comm;    /* run on a user backend that counts collectives (wrapping the rank's comm) */
    int worlds;        /* W1 | W2 ...: the world sizes it runs at */
} run_config;

#define MAX_CONFIGS 64
static run_config configs[MAX_CONFIGS];
static int num_configs;

static int add(fsdp_strategy strategy, int optimizer, int recompute, int frozen, int groups, int prefetch, int no_sync,
               int count_comm, int worlds) {
    run_config *c = &configs[num_configs];
    c->strategy = strategy;
    c->optimizer = optimizer;
    c->recompute = recompute;
    c->frozen = frozen;
    c->groups = groups;
    c->prefetch = prefetch;
    c->no_sync = no_sync;
    c->count_comm = count_comm;
    c->worlds = worlds;
    return num_configs++;
}

static const fsdp_strategy plain_strategies[3] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD};

static void build_configs(void) {
    int s, r;
    num_configs = 0;
    /* recompute: every mode, every strategy, P = 1..3; HYBRID_SHARD at P = 2 (groups of 1) and 4 (of 2) */
    for (s = 0; s < 3; s++)
        for (r = RC_NONE; r <= RC_REGION; r++)
            add(plain_strategies[s], OPT_ADAMW, r, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W1 | W2 | W3);
    for (r = RC_NONE; r <= RC_REGION; r++) add(FSDP_HYBRID_SHARD, OPT_ADAMW, r, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W2 | W4);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_SPAN, FZ_NONE, GR_NONE, PF_POST, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_REGION, FZ_NONE, GR_NONE, PF_NONE, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 1, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_OWN, FZ_NONE, GR_NONE, PF_PRE, 1, 0, W2 | W3);
    /* all-gathers counted per unit (FULL_SHARD at P = 2, no prefetch: one gather per use) */
    for (r = RC_NONE; r <= RC_REGION; r++) add(FSDP_FULL_SHARD, OPT_ADAMW, r, FZ_NONE, GR_NONE, PF_NONE, 0, 1, W2);
    /* frozen parameters */
    for (s = 0; s < 3; s++) add(plain_strategies[s], OPT_ADAMW, RC_NONE, FZ_MIXED, GR_NONE, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_HYBRID_SHARD, OPT_ADAMW, RC_NONE, FZ_MIXED, GR_NONE, PF_PRE, 0, 0, W4);
    add(FSDP_FULL_SHARD, OPT_ADAM, RC_NONE, FZ_MIXED, GR_NONE, PF_PRE, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_SGD_MOMENTUM, RC_NONE, FZ_MIXED, GR_NONE, PF_PRE, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_SPAN, FZ_MIXED, GR_NONE, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_SKIP, GR_NONE, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_NO_SHARD, OPT_ADAMW, RC_NONE, FZ_SKIP, GR_NONE, PF_PRE, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_SKIP_ALL, GR_NONE, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_SHARD_GRAD_OP, OPT_ADAMW, RC_NONE, FZ_SKIP_ALL, GR_NONE, PF_POST, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_SKIP_ALL, GR_NONE, PF_PRE, 1, 0, W1 | W2 | W3);
    add(FSDP_NO_SHARD, OPT_SGD_MOMENTUM, RC_NONE, FZ_SKIP, GR_NONE, PF_PRE, 1, 0, W2 | W3);
    /* parameter groups */
    for (s = 0; s < 3; s++) add(plain_strategies[s], OPT_ADAMW, RC_NONE, FZ_NONE, GR_GPT, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_HYBRID_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_GPT, PF_PRE, 0, 0, W4);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_GPT_SWAPPED, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_FULL_SHARD, OPT_SGD_MOMENTUM, RC_NONE, FZ_NONE, GR_SGD, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_NO_SHARD, OPT_SGD_MOMENTUM, RC_NONE, FZ_NONE, GR_SGD, PF_PRE, 0, 0, W2 | W3);
    add(FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_MIXED, GR_GPT, PF_PRE, 0, 0, W1 | W2 | W3);
    /* an optimizer of the test's own (one row), every strategy, with groups and frozen parameters */
    for (s = 0; s < 3; s++) add(plain_strategies[s], OPT_ADAGRAD, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W1 | W2 | W3);
    add(FSDP_HYBRID_SHARD, OPT_ADAGRAD, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W2 | W4);
    add(FSDP_FULL_SHARD, OPT_ADAGRAD, RC_NONE, FZ_MIXED, GR_GPT, PF_PRE, 0, 0, W2 | W3);
    /* HYBRID_SHARD on a user backend: its shard and replica groups are the backend's own split */
    add(FSDP_HYBRID_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 1, W2 | W4);
}

static int hybrid_group(int world) { return world == 4 ? 2 : 1; }

static void describe(char *out, size_t size, const run_config *c, int world) {
    snprintf(out, size, "P=%d %s%s, %s%s%s%s%s%s%s", world, fsdp_strategy_name(c->strategy),
             c->strategy == FSDP_HYBRID_SHARD ? (hybrid_group(world) == 2 ? "(group 2)" : "(group 1)") : "",
             optimizers[c->optimizer].name, recompute_names[c->recompute], frozen_names[c->frozen],
             group_names[c->groups], prefetch_names[c->prefetch], c->no_sync ? ", 4 micro-steps with no_sync" : "",
             c->count_comm ? ", counting backend" : "");
}

static void apply_frozen(const mlp *m, int frozen) {
    if (frozen == FZ_NONE) return;
    fsdp_model_set_trainable(m->model, m->layer[0], 0);
    fsdp_model_param_set_trainable(m->model, m->param[P_B1], 0);
    if (frozen >= FZ_SKIP) fsdp_model_param_set_trainable(m->model, m->param[P_SCALE], 0);
}

static int is_frozen(int frozen, int p) {
    if (frozen == FZ_NONE) return 0;
    return p == P_W0 || p == P_B0 || p == P_B1 || (frozen >= FZ_SKIP && p == P_SCALE);
}

static void desc_for(fsdp_desc *d, const run_config *c, fsdp_comm *comm, int world) {
    const optimizer_config *o = &optimizers[c->optimizer];
    static const char *const linear[] = {"Linear", NULL};
    memset(d, 0, sizeof *d);
    d->comm = comm;
    d->strategy = c->strategy;
    d->wrap.kind = FSDP_WRAP_TYPES;
    d->wrap.types = linear;
    d->forward_prefetch = c->prefetch == PF_PRE;
    d->backward_prefetch = c->prefetch == PF_PRE    ? FSDP_BACKWARD_PRE
                           : c->prefetch == PF_POST ? FSDP_BACKWARD_POST
                                                    : FSDP_BACKWARD_PREFETCH_NONE;
    if (c->strategy == FSDP_HYBRID_SHARD) d->shard_group_size = hybrid_group(world);
    d->seed = SEED;
    d->optimizer.kind = o->kind;
    d->optimizer.custom = o->kind == FSDP_OPTIMIZER_CUSTOM ? &adagrad : NULL;
    d->optimizer.lr = o->lr;
    d->optimizer.momentum = o->momentum;
    d->optimizer.weight_decay = o->weight_decay;
    d->optimizer.weight_decay_set = 1;
    d->param_groups = c->groups == GR_GPT           ? groups_gpt
                      : c->groups == GR_GPT_SWAPPED ? groups_gpt_swapped
                      : c->groups == GR_SGD         ? groups_sgd
                                                    : NULL;
    d->num_param_groups = d->param_groups ? 2 : 0;
}

/* ---------------------------------------------------------------------------------------------
   forward and backward with FSDP's hooks (no-ops for the reference)
   --------------------------------------------------------------------------------------------- */
typedef struct tensors {
    fsdp_ctx *ctx;          /* NULL: the reference */
    const mlp *m;
    float *params, *grads;  /* the reference's, NELEM each */
    int recompute, frozen;  /* the run's modes (the reference: RC_NONE, and computes every gradient) */
    long grad_violations;   /* fsdp_grad of a frozen parameter not NULL */
    long own_growth, span_growth; /* most unsharded bytes a recomputation's pre_forward added, */
    int own_recomputes;     /*   inside the unit's own backward, and before it */
    const char *failed;     /* the call that failed */
    /* activations: act[l] is layer l's input (act[0] = x0), act[3] = y; rec[l] layer l's
       recomputed output */
    float x[ROWS * IN], target[ROWS * OUT];
    float act[4][ROWS * H2], rec[3][ROWS * H2], dact[4][ROWS * H2];
    float scratch[NELEM];   /* where the gradients of frozen parameters go (discarded) */
} tensors;

static float *weight_of(tensors *t, int p) {
    return t->ctx ? fsdp_param(t->ctx, t->m->param[p]) : t->params + param_offset[p];
}

/* The gradient to accumulate into: fsdp_grad, which must be NULL exactly for frozen parameters
   (then a scratch buffer takes the discarded gradient). NULL: a trainable one had none. */
static float *grad_of(tensors *t, int p) {
    float *g;
    if (!t->ctx) return t->grads + param_offset[p];
    g = fsdp_grad(t->ctx, t->m->param[p]);
    if (!is_frozen(t->frozen, p)) return g;
    if (g) t->grad_violations++;
    return t->scratch + param_offset[p];
}

/* (a run without t->ctx is the reference: no hooks) */
#define HOOK(call, name)                                     \
    do {                                                     \
        if (t->ctx) RETURN_IF_FAILED(call, t->failed, name); \
    } while (0)
#define NEED(ptr, name) RETURN_IF_NULL(ptr, t->failed, name)

static const char *const pre_forward_names[3] = {"pre_forward(layers.0)", "pre_forward(layers.1)", "pre_forward(layers.2)"};
static const char *const post_forward_names[3] = {"post_forward(layers.0)", "post_forward(layers.1)",
                                                  "post_forward(layers.2)"};

/* The unsharded bytes live now (the comm thread may free some meanwhile, never add any). */
static long live_bytes(fsdp_ctx *ctx) {
    fsdp_memory_stats st;
    return fsdp_memory_stats_get(ctx, &st) == 0 ? (long)st.unsharded_bytes : -1000000;
}

enum { RECOMPUTE_NOT, RECOMPUTE_OWN, RECOMPUTE_SPANNING };

/* Layer l's forward with its hooks: out = tanh(in @ W^T + b) (no tanh for layers.2). The same
   call is a forward or, during backward, a recomputation (fsdp.h tells them apart); for those
   the bytes its pre_forward gathered are recorded. */
static int layer_forward(tensors *t, int l, float *out, const float *in, int n, int recompute) {
    float *w, *b;
    int rc, i;
    long before = t->ctx && recompute ? live_bytes(t->ctx) : 0, growth;
    HOOK(fsdp_pre_forward(t->ctx, t->m->layer[l]), pre_forward_names[l]);
    if (t->ctx && recompute) {
        growth = live_bytes(t->ctx) - before;
        if (recompute == RECOMPUTE_OWN) {
            t->own_recomputes++;
            if (growth > t->own_growth) t->own_growth = growth;
        } else if (growth > t->span_growth) {
            t->span_growth = growth;
        }
    }
    NEED(w = weight_of(t, P_W0 + 2 * l), "fsdp_param(weight) returned NULL in forward");
    NEED(b = weight_of(t, P_B0 + 2 * l), "fsdp_param(bias) returned NULL in forward");
    linear_forward(out, in, w, b, n, dims[l], dims[l + 1]);
    if (l < 2)
        for (i = 0; i < n * dims[l + 1]; i++) out[i] = tanhf(out[i]);
    HOOK(fsdp_post_forward(t->ctx, t->m->layer[l]), post_forward_names[l]);
    return 0;
}

/* Forward over rows [lo, hi) of step `step`; act[] holds each layer's input and y. */
static int forward(tensors *t, int step, int lo, int hi) {
    float *scale;
    int n = hi - lo, rc, i, k, l;
    load_batch(step, lo, hi, t->x, t->target);
    HOOK(fsdp_pre_forward(t->ctx, 0), "pre_forward(root)");
    NEED(scale = weight_of(t, P_SCALE), "fsdp_param(scale) returned NULL");
    for (i = 0; i < n; i++)
        for (k = 0; k < IN; k++) t->act[0][i * IN + k] = t->x[i * IN + k] * scale[k];
    for (l = 0; l < 3; l++)
        if ((rc = layer_forward(t, l, t->act[l + 1], t->act[l], n, RECOMPUTE_NOT)) != 0) return rc;
    HOOK(fsdp_post_forward(t->ctx, 0), "post_forward(root)");
    return 0;
}

/* Layer l's backward (hooks around it by the caller): dout is the gradient w.r.t. its output,
   out its output (tanh's), in its input; din += the gradient w.r.t. its input. */
static int layer_backward(tensors *t, int l, float *din, float *dout, const float *out, const float *in, int n) {
    float *w, *gw, *gb;
    int i;
    if (l < 2)
        for (i = 0; i < n * dims[l + 1]; i++) dout[i] *= 1.0f - out[i] * out[i];
    NEED(w = weight_of(t, P_W0 + 2 * l), "fsdp_param(weight) returned NULL in backward");
    NEED(gw = grad_of(t, P_W0 + 2 * l), "fsdp_grad(weight) of a trainable weight returned NULL");
    NEED(gb = grad_of(t, P_B0 + 2 * l), "fsdp_grad(bias) of a trainable bias returned NULL");
    linear_backward(din, gw, gb, dout, in, w, n, dims[l], dims[l + 1]);
    return 0;
}

static const char *const pre_backward_names[3] = {"pre_backward(layers.0)", "pre_backward(layers.1)",
                                                  "pre_backward(layers.2)"};
static const char *const post_backward_names[3] = {"post_backward(layers.0)", "post_backward(layers.1)",
                                                   "post_backward(layers.2)"};

/* Backward in autograd's order, recomputing as t->recompute says and skipping the hooks of
   frozen units as t->frozen says. Gradients of loss * grad_scale are accumulated. */
static int backward(tensors *t, int n, float grad_scale) {
    const mlp *m = t->m;
    const float *out[3], *in[3];
    int rc, i, k, l;
    int skip_layer0 = t->ctx && t->frozen >= FZ_SKIP, skip_root = t->ctx && t->frozen == FZ_SKIP_ALL;
    for (i = 0; i < n * OUT; i++) t->dact[3][i] = (t->act[3][i] - t->target[i]) / (float)n * grad_scale;
    for (l = 0; l < 3; l++) {
        memset(t->dact[l], 0, sizeof t->dact[l]);
        in[l] = t->act[l];
        out[l] = t->recompute == RC_NONE ? t->act[l + 1] : NULL; /* recompute: only inputs are kept */
    }
    if (!skip_root) HOOK(fsdp_pre_backward(t->ctx, 0), "pre_backward(root)");
    if (t->recompute == RC_REGION) { /* layers.1 and layers.2, before either's backward */
        if ((rc = layer_forward(t, 1, t->rec[1], in[1], n, RECOMPUTE_SPANNING)) != 0 ||
            (rc = layer_forward(t, 2, t->rec[2], t->rec[1], n, RECOMPUTE_SPANNING)) != 0)
            return rc;
        out[1] = in[2] = t->rec[1];
        out[2] = t->rec[2];
    }
    for (l = 2; l >= 0; l--) {
        if (l == 0 && skip_layer0) break; /* nothing needs the input gradient of a frozen layers.0 */
        HOOK(fsdp_pre_backward(t->ctx, m->layer[l]), pre_backward_names[l]);
        if (t->recompute == RC_SPAN && l == 2) { /* layers.1 gathered again, then layers.2 in its own backward */
            if ((rc = layer_forward(t, 1, t->rec[1], in[1], n, RECOMPUTE_SPANNING)) != 0) return rc;
            out[1] = in[2] = t->rec[1];
        }
        if (!out[l]) { /* recompute inside the unit's own backward */
            if ((rc = layer_forward(t, l, t->rec[l], in[l], n, RECOMPUTE_OWN)) != 0) return rc;
            out[l] = t->rec[l];
        }
        if ((rc = layer_backward(t, l, t->dact[l], t->dact[l + 1], out[l], in[l], n)) != 0) return rc;
        HOOK(fsdp_post_backward(t->ctx, m->layer[l]), post_backward_names[l]);
    }
    if (!skip_layer0) {
        float *gs;
        NEED(gs = grad_of(t, P_SCALE), "fsdp_grad(scale) returned NULL");
        for (i = 0; i < n; i++)
            for (k = 0; k < IN; k++) gs[k] += t->dact[0][i * IN + k] * t->x[i * IN + k];
    }
    if (!skip_root) HOOK(fsdp_post_backward(t->ctx, 0), "post_backward(root)");
    return 0;
}

static int forward_backward(tensors *t, int step, int lo, int hi, float grad_scale) {
    int rc = forward(t, step, lo, hi);
    return rc ? rc : backward(t, hi - lo, grad_scale);
}

/* ---------------------------------------------------------------------------------------------
   a user backend that counts the runtime's collectives per unit and forwards them to the
   rank's shm communicator (the tag of a unit's gather is unit * 4 + 1, of its reduction * 4 + 2)
   --------------------------------------------------------------------------------------------- */
typedef struct counting_impl {
    fsdp_comm *inner;
    long gathers[UNITS], reduces[UNITS];
    int owned;              /* made by counting_split: it and its inner comm are the backend's to free */
} counting_impl;

static void count_tag(counting_impl *ci, uint32_t tag) {
    if (tag / 4 < UNITS && tag % 4 == 1) ci->gathers[tag / 4]++;
    if (tag / 4 < UNITS && tag % 4 == 2) ci->reduces[tag / 4]++;
}
static int counting_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    counting_impl *ci = (counting_impl *)impl;
    (void)comm;
    count_tag(ci, c->tag);
    return fsdp_all_gather(ci->inner, c->send, c->recv, c->count, c->dtype);
}
static int counting_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    counting_impl *ci = (counting_impl *)impl;
    (void)comm;
    count_tag(ci, c->tag);
    return fsdp_reduce_scatter(ci->inner, c->send, c->recv, c->count, c->dtype, c->op);
}
static int counting_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    counting_impl *ci = (counting_impl *)impl;
    (void)comm;
    count_tag(ci, c->tag);
    return fsdp_all_reduce(ci->inner, c->send, c->recv, c->count, c->dtype, c->op);
}
static int counting_broadcast(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    return fsdp_broadcast(((counting_impl *)impl)->inner, c->recv, c->count, c->dtype, c->root);
}
static int counting_barrier(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    (void)c;
    return fsdp_barrier(((counting_impl *)impl)->inner);
}
/* A sub-communicator (HYBRID_SHARD's groups): the inner comm split alike, counted on its own. */
static int counting_split(fsdp_comm *parent, void *impl, const fsdp_split_info *info, void **child_impl) {
    counting_impl *child = (counting_impl *)calloc(1, sizeof *child);
    int rc;
    (void)parent;
    if (!child) return FSDP_ERR_OUT_OF_MEMORY;
    if ((rc = fsdp_comm_split(((counting_impl *)impl)->inner, info->color, info->key, &child->inner)) != 0) {
        free(child);
        return rc;
    }
    child->owned = 1;
    *child_impl = child;
    return 0;
}
static void counting_destroy(fsdp_comm *comm, void *impl) {
    counting_impl *ci = (counting_impl *)impl;
    (void)comm;
    if (!ci->owned) return; /* the top comm's is on its creator's stack */
    fsdp_comm_destroy(ci->inner);
    free(ci);
}
static const fsdp_backend counting_backend = {"counting", counting_all_gather, counting_reduce_scatter,
                                              counting_all_reduce, counting_broadcast, counting_barrier,
                                              NULL, counting_destroy, 0, counting_split, NULL};

/* ---------------------------------------------------------------------------------------------
   what the ranks report (MAP_SHARED)
   --------------------------------------------------------------------------------------------- */
typedef struct rank_result {
    int done, rc;
    char error[240];
    float init[NELEM];
    float after[STEPS][NELEM];
    double grad_norm[STEPS];
    fsdp_memory_stats memory;           /* after the last step */
    int64_t shard_numel[UNITS];
    long grad_violations;               /* fsdp_grad of a frozen parameter not NULL */
    long grad_shard_violations;         /* fsdp_param_info.grad_shard NULL for a trainable one, or not for a frozen */
    long gathers[UNITS], reduces[UNITS]; /* count_comm runs */
    long own_growth, span_growth;       /* tensors' */
    int own_recomputes;
} rank_result;

typedef struct matrix_results {
    int launch_rc[MAX_WORLD + 1];
    char launch_message[MAX_WORLD + 1][256];
    double seconds;
    rank_result result[MAX_WORLD + 1][MAX_CONFIGS][MAX_WORLD];
} matrix_results;
static matrix_results *matrix;

/* Checkpoints (P = 2, FULL_SHARD, AdamW, frozen SKIP): A trains 2 steps, saves full and sharded,
   trains a third; B and C start from another seed, load one each, train the third step. */
typedef struct checkpoint_report {
    int done, rc;
    char error[240];
    float init_b[NELEM];                       /* B's own init, before its load */
    float saved[NELEM], loaded_full[NELEM], loaded_sharded[NELEM];
    float after_a[NELEM], after_full[NELEM], after_sharded[NELEM];
    int loaded_tensors_full, loaded_tensors_sharded;
} checkpoint_report;

/* AUTO (P = 2, AdamW, the deep model below) */
#define AUTO_CASES 6
#define DEEP_LAYERS 8
#define DEEP_WIDTH 16
typedef struct auto_report {
    int done;
    size_t peak[4];                            /* estimates, by fsdp_strategy */
    size_t budget[AUTO_CASES];
    int num_units[AUTO_CASES], unit_strategy[AUTO_CASES][DEEP_LAYERS + 1];
    int init_rc[AUTO_CASES], helper_rc[AUTO_CASES];
    fsdp_strategy helper_chosen[AUTO_CASES];
    char why[AUTO_CASES][256], init_error[AUTO_CASES][256];
    int no_budget_rc, bad_group_rc;
    char no_budget_error[256], bad_group_error[256];
} auto_report;

/* Hook misuse (P = 2) and invalid groups (P = 1) */
typedef struct misuse_report {
    int done;
    int open_recompute_pre_rc, open_recompute_rc;  /* pre_forward (recompute) then post_backward */
    char open_recompute_error[256];
    int open_span_pre_rc, open_span_rc;            /* spanning recompute left open, then pre_backward */
    char open_span_error[256];
} misuse_report;

typedef struct bad_groups_report {
    int done;
    int rc[3];
    char error[3][256];
} bad_groups_report;

typedef struct special_results {
    checkpoint_report checkpoint[MAX_WORLD];
    checkpoint_report custom_checkpoint[MAX_WORLD]; /* the same with the test's Adagrad row */
    auto_report autos[MAX_WORLD];
    misuse_report misuse[MAX_WORLD];
    bad_groups_report bad_groups;
} special_results;
static special_results *special;
static char ckpt_dir[256]; /* made by the parent before the launches (the children inherit it) */

/* ---------------------------------------------------------------------------------------------
   the ranks
   --------------------------------------------------------------------------------------------- */
static void record_error(int *rc_out, char *error, size_t size, int rc, const char *where, const char *message) {
    *rc_out = rc;
    snprintf(error, size, "%.60s: %.24s (%.140s)", where, fsdp_result_name(rc), message);
}

/* One optimizer step's worth of forward/backward on this rank's rows, then fsdp_step. */
static int train_step(fsdp_ctx *ctx, tensors *t, const run_config *c, int step, int rank, int world, double *norm) {
    fsdp_step_report report;
    int rc = 0, k;
    if (!c->no_sync) {
        rc = forward_backward(t, step, rank * ROWS / world, (rank + 1) * ROWS / world, 1.0f);
    } else {
        int per_micro = ROWS / MICRO;
        for (k = 0; k < MICRO && rc == 0; k++) {
            int lo = k * per_micro + rank * per_micro / world, hi = k * per_micro + (rank + 1) * per_micro / world;
            if ((rc = fsdp_set_no_sync(ctx, k < MICRO - 1)) != 0) {
                t->failed = "fsdp_set_no_sync";
                break;
            }
            rc = forward_backward(t, step, lo, hi, 1.0f / MICRO);
        }
    }
    if (rc) return rc;
    if ((rc = fsdp_step(ctx, 0.0f, &report)) != 0) {
        t->failed = "fsdp_step";
        return rc;
    }
    if (norm) *norm = report.grad_norm;
    if ((rc = fsdp_zero_grad(ctx)) != 0) t->failed = "fsdp_zero_grad";
    return rc;
}

static tensors *new_tensors(fsdp_ctx *ctx, const mlp *m, const run_config *c) {
    tensors *t = (tensors *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ctx = ctx;
    t->m = m;
    t->recompute = c->recompute;
    t->frozen = c->frozen;
    return t;
}

static void train_config(fsdp_comm *rank_comm, const run_config *c, rank_result *r) {
    int rank = fsdp_comm_rank(rank_comm), world = fsdp_comm_size(rank_comm), rc, step, p, u;
    fsdp_comm *comm = rank_comm, *counting = NULL;
    counting_impl counts;
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    tensors *t = NULL;
    mlp m;
    memset(r, 0, sizeof *r);
    memset(&counts, 0, sizeof counts);
    if (mlp_build(&m) != 0) {
        record_error(&r->rc, r->error, sizeof r->error, FSDP_ERR_STATE, "building the model", "");
        fsdp_model_destroy(m.model);
        return;
    }
    apply_frozen(&m, c->frozen);
    if (c->count_comm) {
        fsdp_comm_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.backend = FSDP_BACKEND_USER;
        cd.rank = rank;
        cd.world_size = world;
        cd.local_rank = rank;
        cd.local_world_size = world;
        cd.user_backend = &counting_backend;
        cd.user_impl = &counts;
        counts.inner = rank_comm;
        if ((rc = fsdp_comm_init(&counting, &cd)) != 0) {
            record_error(&r->rc, r->error, sizeof r->error, rc, "fsdp_comm_init(counting)", fsdp_comm_last_error(NULL));
            fsdp_model_destroy(m.model);
            return;
        }
        comm = counting;
    }
    desc_for(&desc, c, comm, world);
    if ((rc = fsdp_init(&ctx, m.model, &desc)) != 0) {
        record_error(&r->rc, r->error, sizeof r->error, rc, "fsdp_init", fsdp_last_error(NULL));
        goto done;
    }
    for (p = 0; p < NPARAMS; p++) {
        fsdp_param_info info;
        if (fsdp_param_info_get(ctx, m.param[p], &info) != 0 || (info.grad_shard == NULL) != is_frozen(c->frozen, p))
            r->grad_shard_violations++;
    }
    for (u = 0; u < UNITS; u++) {
        fsdp_unit_info info;
        if (fsdp_unit_info_get(ctx, u, &info) == 0) r->shard_numel[u] = info.shard_numel;
    }
    if (!(t = new_tensors(ctx, &m, c))) {
        record_error(&r->rc, r->error, sizeof r->error, FSDP_ERR_OUT_OF_MEMORY, "calloc", "");
        goto done;
    }
    if ((rc = gather_all(ctx, &m, r->init)) != 0) {
        record_error(&r->rc, r->error, sizeof r->error, rc, "fsdp_gather_param after init", fsdp_last_error(ctx));
        goto done;
    }
    for (step = 0; step < STEPS; step++) {
        if ((rc = train_step(ctx, t, c, step, rank, world, &r->grad_norm[step])) != 0) {
            record_error(&r->rc, r->error, sizeof r->error, rc, t->failed ? t->failed : "?", fsdp_last_error(ctx));
            goto done;
        }
        if ((rc = gather_all(ctx, &m, r->after[step])) != 0) {
            record_error(&r->rc, r->error, sizeof r->error, rc, "fsdp_gather_param after a step", fsdp_last_error(ctx));
            goto done;
        }
    }
    fsdp_memory_stats_get(ctx, &r->memory);
    r->grad_violations = t->grad_violations;
    r->own_growth = t->own_growth;
    r->span_growth = t->span_growth;
    r->own_recomputes = t->own_recomputes;
    r->done = 1;
done:
    fsdp_destroy(ctx);
    fsdp_comm_destroy(counting);
    memcpy(r->gathers, counts.gathers, sizeof counts.gathers);
    memcpy(r->reduces, counts.reduces, sizeof counts.reduces);
    free(t);
    fsdp_model_destroy(m.model);
}

/* --- checkpoints --------------------------------------------------------------------------- */
static const run_config checkpoint_config = {FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_SKIP, GR_NONE, PF_PRE, 0, 0, W2};
static const run_config custom_checkpoint_config = {FSDP_FULL_SHARD, OPT_ADAGRAD, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0,
                                                    W2};

/* Where the runs of config c save (one pair of paths per optimizer). */
static void checkpoint_paths(const run_config *c, char *full, char *sharded, size_t size) {
    const char *name = c->optimizer == OPT_ADAGRAD ? "adagrad" : "model";
    snprintf(full, size, "%s/%s.safetensors", ckpt_dir, name);
    snprintf(sharded, size, "%s/%s-sharded", ckpt_dir, name);
}

/* Trains steps [from, to) then, if save, saves; loads first if load_kind (1 full, 2 sharded). */
static int checkpoint_leg(fsdp_comm *comm, const run_config *c, uint64_t seed, int load_kind, checkpoint_report *r,
                          float *before_load, float *loaded, float *after) {
    int rank = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), rc, step;
    char full[320], sharded[320];
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    tensors *t = NULL;
    mlp m;
    checkpoint_paths(c, full, sharded, sizeof full);
    if (mlp_build(&m) != 0) return FSDP_ERR_STATE;
    apply_frozen(&m, c->frozen);
    desc_for(&desc, c, comm, world);
    desc.seed = seed;
    if ((rc = fsdp_init(&ctx, m.model, &desc)) != 0) {
        record_error(&r->rc, r->error, sizeof r->error, rc, "fsdp_init", fsdp_last_error(NULL));
        goto done;
    }
    if (!(t = new_tensors(ctx, &m, c))) {
        rc = FSDP_ERR_OUT_OF_MEMORY;
        goto done;
    }
    if (load_kind == 0) { /* A: two steps, save both ways */
        fsdp_save_options so;
        memset(&so, 0, sizeof so);
        so.with_optimizer = 1;
        for (step = 0; step < 2; step++)
            if ((rc = train_step(ctx, t, c, step, rank, world, NULL)) != 0) {
                record_error(&r->rc, r->error, sizeof r->error, rc, t->failed ? t->failed : "?", fsdp_last_error(ctx));
                goto done;
            }
        if ((rc = fsdp_save_full(ctx, full, &so)) != 0 || (rc = fsdp_save_sharded(ctx, sharded, &so)) != 0) {
            record_error(&r->rc, r->error, sizeof r->error, rc, "save", fsdp_last_error(ctx));
            goto done;
        }
        if ((rc = gather_all(ctx, &m, r->saved)) != 0) goto done;
    } else { /* B, C: load, then the third step */
        fsdp_load_options lo;
        fsdp_load_report report;
        memset(&lo, 0, sizeof lo);
        lo.strict = 1;
        lo.with_optimizer = 1;
        if ((rc = gather_all(ctx, &m, before_load)) != 0) goto done;
        rc = load_kind == 1 ? fsdp_load_full(ctx, full, &lo, &report) : fsdp_load_sharded(ctx, sharded, &lo, &report);
        if (rc) {
            record_error(&r->rc, r->error, sizeof r->error, rc, load_kind == 1 ? "fsdp_load_full" : "fsdp_load_sharded",
                         fsdp_last_error(ctx));
            goto done;
        }
        if (load_kind == 1) r->loaded_tensors_full = report.loaded;
        else r->loaded_tensors_sharded = report.loaded;
        if ((rc = gather_all(ctx, &m, loaded)) != 0) goto done;
    }
    if ((rc = train_step(ctx, t, c, 2, rank, world, NULL)) != 0) {
        record_error(&r->rc, r->error, sizeof r->error, rc, t->failed ? t->failed : "?", fsdp_last_error(ctx));
        goto done;
    }
    rc = gather_all(ctx, &m, after);
done:
    if (rc && !r->rc) record_error(&r->rc, r->error, sizeof r->error, rc, "checkpoint leg", fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    free(t);
    fsdp_model_destroy(m.model);
    return rc;
}

static void run_checkpoints(fsdp_comm *comm, const run_config *c, checkpoint_report *r) {
    float scratch[NELEM];
    memset(r, 0, sizeof *r);
    if (checkpoint_leg(comm, c, SEED, 0, r, NULL, NULL, r->after_a) != 0) return;
    if (checkpoint_leg(comm, c, SEED + 1, 1, r, r->init_b, r->loaded_full, r->after_full) != 0) return;
    if (checkpoint_leg(comm, c, SEED + 1, 2, r, scratch, r->loaded_sharded, r->after_sharded) != 0) return;
    r->done = 1;
}

/* --- AUTO ---------------------------------------------------------------------------------- */
/* AUTO needs FULL_SHARD to be the leanest, as in real models: more units than are gathered at
   once. DEEP_LAYERS Linear units of DEEP_WIDTH x DEEP_WIDTH, under a root without parameters. */
static int deep_build(fsdp_model **out) {
    fsdp_init_rule rule = {FSDP_INIT_NORMAL, 0.0f, 0.1f, NULL, NULL};
    int64_t shape_w[2] = {DEEP_WIDTH, DEEP_WIDTH}, shape_b[1] = {DEEP_WIDTH};
    int layers, l, module;
    char name[8];
    if (fsdp_model_create(out, "Deep") != 0 || (layers = fsdp_model_module(*out, 0, "layers", "ModuleList")) < 0) return -1;
    for (l = 0; l < DEEP_LAYERS; l++) {
        snprintf(name, sizeof name, "%d", l % 100);
        if ((module = fsdp_model_module(*out, layers, name, "Linear")) < 0 ||
            fsdp_model_param(*out, module, "weight", 2, shape_w, rule) < 0 ||
            fsdp_model_param(*out, module, "bias", 1, shape_b, rule) < 0)
            return -1;
    }
    return 0;
}

static void run_auto(fsdp_comm *comm, auto_report *r) {
    static const run_config base = {FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W2};
    static const fsdp_strategy strategies[3] = {FSDP_NO_SHARD, FSDP_SHARD_GRAD_OP, FSDP_FULL_SHARD};
    static const fsdp_param_group bad_group = {NULL, 0, 0, -0.1f, 0.0f};
    int world = fsdp_comm_size(comm), s, i, u;
    fsdp_model *model = NULL;
    fsdp_desc desc;
    fsdp_ctx *ctx;
    memset(r, 0, sizeof *r);
    if (deep_build(&model) != 0) {
        fsdp_model_destroy(model);
        return;
    }
    desc_for(&desc, &base, comm, world);
    for (s = 0; s < 3; s++) {
        fsdp_memory_stats est;
        desc.strategy = strategies[s];
        if (fsdp_memory_estimate(model, &desc, world, &est) == 0) r->peak[strategies[s]] = est.peak_bytes;
    }
    /* each estimate exactly, and one byte less */
    r->budget[0] = r->peak[FSDP_NO_SHARD];
    r->budget[1] = r->peak[FSDP_NO_SHARD] - 1;
    r->budget[2] = r->peak[FSDP_SHARD_GRAD_OP];
    r->budget[3] = r->peak[FSDP_SHARD_GRAD_OP] - 1;
    r->budget[4] = r->peak[FSDP_FULL_SHARD];
    r->budget[5] = r->peak[FSDP_FULL_SHARD] - 1;
    desc.strategy = FSDP_STRATEGY_AUTO;
    for (i = 0; i < AUTO_CASES; i++) {
        desc.memory_budget = r->budget[i];
        r->helper_rc[i] = fsdp_strategy_for_budget(model, &desc, world, r->budget[i], &r->helper_chosen[i], r->why[i],
                                                   sizeof r->why[i]);
        ctx = NULL;
        r->init_rc[i] = fsdp_init(&ctx, model, &desc);
        if (r->init_rc[i] == 0) {
            r->num_units[i] = fsdp_num_units(ctx);
            for (u = 0; u < r->num_units[i] && u <= DEEP_LAYERS; u++) {
                fsdp_unit_info info;
                r->unit_strategy[i][u] = fsdp_unit_info_get(ctx, u, &info) == 0 ? (int)info.strategy : -1;
            }
        } else {
            snprintf(r->init_error[i], sizeof r->init_error[i], "%.250s", fsdp_last_error(NULL));
        }
        fsdp_destroy(ctx);
    }
    desc.memory_budget = 0;
    ctx = NULL;
    r->no_budget_rc = fsdp_init(&ctx, model, &desc);
    snprintf(r->no_budget_error, sizeof r->no_budget_error, "%.250s", fsdp_last_error(NULL));
    fsdp_destroy(ctx);
    desc.memory_budget = (size_t)1 << 30;
    desc.param_groups = &bad_group;
    desc.num_param_groups = 1;
    ctx = NULL;
    r->bad_group_rc = fsdp_init(&ctx, model, &desc);
    snprintf(r->bad_group_error, sizeof r->bad_group_error, "%.250s", fsdp_last_error(NULL));
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    r->done = 1;
}

/* --- misuse -------------------------------------------------------------------------------- */
static void run_misuse(fsdp_comm *comm, misuse_report *r) {
    static const run_config base = {FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W2};
    int rank = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), leg;
    fsdp_desc desc;
    mlp m;
    memset(r, 0, sizeof *r);
    r->open_recompute_pre_rc = r->open_recompute_rc = r->open_span_pre_rc = r->open_span_rc = -999;
    for (leg = 0; leg < 2; leg++) {
        fsdp_ctx *ctx = NULL;
        tensors *t = NULL;
        if (mlp_build(&m) != 0) return;
        desc_for(&desc, &base, comm, world);
        if (fsdp_init(&ctx, m.model, &desc) == 0 && (t = new_tensors(ctx, &m, &base)) != NULL &&
            forward(t, 0, rank * ROWS / world, (rank + 1) * ROWS / world) == 0 && fsdp_pre_backward(ctx, 0) == 0) {
            if (leg == 0) { /* recompute inside layers.2's backward, post_backward before its post_forward */
                if (fsdp_pre_backward(ctx, m.layer[2]) == 0) {
                    r->open_recompute_pre_rc = fsdp_pre_forward(ctx, m.layer[2]);
                    r->open_recompute_rc = fsdp_post_backward(ctx, m.layer[2]);
                    snprintf(r->open_recompute_error, sizeof r->open_recompute_error, "%.250s", fsdp_last_error(ctx));
                }
            } else { /* layers.2 recomputed before its backward, and its backward begun while that is open */
                r->open_span_pre_rc = fsdp_pre_forward(ctx, m.layer[2]);
                r->open_span_rc = fsdp_pre_backward(ctx, m.layer[2]);
                snprintf(r->open_span_error, sizeof r->open_span_error, "%.250s", fsdp_last_error(ctx));
            }
        }
        fsdp_destroy(ctx);
        free(t);
        fsdp_model_destroy(m.model);
    }
    r->done = 1;
}

static void run_bad_groups(fsdp_comm *comm, bad_groups_report *r) {
    static const run_config base = {FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W1};
    static const fsdp_param_group negative_wd[2] = {{"*.bias", 0, 0, 0.0f, 0.0f}, {NULL, 0, 0, -0.01f, 0.0f}};
    static const fsdp_param_group min_above_max[1] = {{NULL, 2, 1, 0.0f, 0.0f}};
    int i;
    fsdp_desc desc;
    mlp m;
    if (mlp_build(&m) != 0) return;
    for (i = 0; i < 3; i++) {
        fsdp_ctx *ctx = NULL;
        desc_for(&desc, &base, comm, fsdp_comm_size(comm));
        desc.param_groups = i == 0 ? negative_wd : i == 1 ? min_above_max : NULL;
        desc.num_param_groups = i == 0 ? 2 : 1;
        r->rc[i] = fsdp_init(&ctx, m.model, &desc);
        snprintf(r->error[i], sizeof r->error[i], "%.250s", fsdp_last_error(NULL));
        fsdp_destroy(ctx);
    }
    fsdp_model_destroy(m.model);
    r->done = 1;
}

static int matrix_rank(fsdp_comm *comm, void *arg) {
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm), i;
    (void)arg;
    for (i = 0; i < num_configs; i++)
        if (configs[i].worlds & (1 << world)) train_config(comm, &configs[i], &matrix->result[world][i][rank]);
    if (world == 2) {
        run_checkpoints(comm, &checkpoint_config, &special->checkpoint[rank]);
        run_checkpoints(comm, &custom_checkpoint_config, &special->custom_checkpoint[rank]);
        run_auto(comm, &special->autos[rank]);
        run_misuse(comm, &special->misuse[rank]);
    }
    if (world == 1) run_bad_groups(comm, &special->bad_groups);
    return 0;
}

static void ensure_matrix(void) {
    static int launched;
    if (launched) return;
    launched = 1;
    matrix->seconds = launch_every_world(MAX_WORLD, LAUNCH_TIMEOUT_MS, matrix_rank, matrix->launch_rc,
                                         matrix->launch_message[0], sizeof matrix->launch_message[0]);
}

/* ---------------------------------------------------------------------------------------------
   the reference
   --------------------------------------------------------------------------------------------- */
typedef struct reference_result {
    float init[NELEM];
    float after[STEPS][NELEM];
    double grad_norm[STEPS]; /* of the trainable parameters' gradients */
} reference_result;

static mlp reference_model; /* only for fsdp_init_value */
static reference_result references[MAX_CONFIGS];

/* PyTorch's rules (torch.optim.SGD / Adam / AdamW, single-tensor path), each element with its
   group's lr and weight decay; frozen elements (lr 0 here) have no state and are not touched. */
static void reference_train(const run_config *c, reference_result *out) {
    static float params[NELEM], grads[NELEM], buf[NELEM], exp_avg[NELEM], exp_avg_sq[NELEM], sum[NELEM], lr[NELEM],
        wd[NELEM];
    static tensors t;
    const optimizer_config *o = &optimizers[c->optimizer];
    int p, i, step;
    memset(out, 0, sizeof *out);
    memset(buf, 0, sizeof buf);
    memset(exp_avg, 0, sizeof exp_avg);
    memset(exp_avg_sq, 0, sizeof exp_avg_sq);
    memset(sum, 0, sizeof sum);
    for (p = 0; p < NPARAMS; p++)
        for (i = 0; i < param_numel[p]; i++) {
            int e = param_offset[p] + i;
            params[e] = fsdp_init_value(reference_model.model, reference_model.param[p], i, SEED);
            lr[e] = is_frozen(c->frozen, p) ? 0.0f : o->lr * expected_lr_scale[c->groups][p];
            wd[e] = expected_wd[c->groups][p] < 0 ? o->weight_decay : expected_wd[c->groups][p];
        }
    memcpy(out->init, params, sizeof params);
    memset(&t, 0, sizeof t);
    t.m = &reference_model;
    t.params = params;
    t.grads = grads;
    for (step = 0; step < STEPS; step++) {
        double sumsq = 0, t1 = (double)(step + 1), bias_correction2_sqrt = sqrt(1.0 - pow(BETA2, t1));
        memset(grads, 0, sizeof grads);
        forward_backward(&t, step, 0, ROWS, 1.0f);
        for (i = 0; i < NELEM; i++)
            if (lr[i] != 0.0f) sumsq += (double)grads[i] * (double)grads[i];
        out->grad_norm[step] = sqrt(sumsq);
        for (i = 0; i < NELEM; i++) {
            float d = grads[i];
            if (lr[i] == 0.0f) continue;
            if (o->kind == FSDP_SGD) {
                d += wd[i] * params[i];
                buf[i] = step == 0 ? d : o->momentum * buf[i] + d; /* dampening 0, not nesterov */
                params[i] -= lr[i] * buf[i];
            } else if (o->kind == FSDP_OPTIMIZER_CUSTOM) { /* Adagrad */
                d += wd[i] * params[i];
                sum[i] += d * d;
                params[i] -= lr[i] * d / (sqrtf(sum[i]) + ADAGRAD_EPS);
            } else {
                double step_size = lr[i] / (1.0 - pow(BETA1, t1));
                if (o->kind == FSDP_ADAMW) params[i] *= 1.0f - lr[i] * wd[i];
                else d += wd[i] * params[i];
                exp_avg[i] = BETA1 * exp_avg[i] + (1.0f - BETA1) * d;
                exp_avg_sq[i] = BETA2 * exp_avg_sq[i] + (1.0f - BETA2) * d * d;
                params[i] -= (float)step_size * exp_avg[i] / (sqrtf(exp_avg_sq[i]) / (float)bias_correction2_sqrt + EPS);
            }
        }
        memcpy(out->after[step], params, sizeof params);
    }
}

/* ---------------------------------------------------------------------------------------------
   comparisons (parent only)
   --------------------------------------------------------------------------------------------- */
static char message[2048];

static int runs_at(int ci, int world) { return (configs[ci].worlds & (1 << world)) != 0; }

/* Asserts that the launch at P succeeded and that this rank trained config ci. */
static const rank_result *result_of(int world, int ci, int rank) {
    const rank_result *r = &matrix->result[world][ci][rank];
    char what[400];
    snprintf(message, sizeof message, "launch with P=%d failed: %s", world, matrix->launch_message[world]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, matrix->launch_rc[world], message);
    describe(what, sizeof what, &configs[ci], world);
    snprintf(message, sizeof message, "%s, rank %d did not finish: %s", what, rank, r->error);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

/* Compares every rank's parameters after every step with the reference; returns violations
   and describes the first into first. */
static int compare_with_reference(int ci, int world, char *first, size_t size) {
    const reference_result *ref = &references[ci];
    int rank, step, e, index, bad = 0;
    for (rank = 0; rank < world; rank++) {
        const rank_result *r = result_of(world, ci, rank);
        for (step = 0; step < STEPS; step++)
            for (e = 0; e < NELEM; e++) {
                double want = ref->after[step][e], got = r->after[step][e], rel = rel_error(got, want, REL_FLOOR);
                if (!(rel <= optimizers[configs[ci].optimizer].tolerance)) {
                    if (!bad++ && !*first) {
                        char what[400];
                        const char *name = param_of_element(e, &index);
                        describe(what, sizeof what, &configs[ci], world);
                        snprintf(first, size, "%s: rank %d step %d %s[%d] = %.9g, reference %.9g (rel %.2g)", what, rank,
                                 step, name, index, got, want, rel);
                    }
                }
            }
    }
    return bad;
}

/* Asserts each selected configuration matches the reference at every P it runs at. */
static void assert_family_matches_reference(int (*selected)(const run_config *)) {
    int ci, world, violations = 0, runs = 0;
    char first[600] = "";
    for (ci = 0; ci < num_configs; ci++) {
        if (!selected(&configs[ci])) continue;
        for (world = 1; world <= MAX_WORLD; world++)
            if (runs_at(ci, world)) {
                violations += compare_with_reference(ci, world, first, sizeof first);
                runs++;
            }
    }
    snprintf(message, sizeof message, "%d elements off the reference by more than the tolerance (%g relative, Adagrad "
             "%g) over %d runs; first: %s", violations, TOLERANCE, optimizers[OPT_ADAGRAD].tolerance, runs, first);
    TEST_ASSERT_TRUE_MESSAGE(runs > 0, "no configuration selected");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, violations, message);
}

/* The run without recompute that ci is compared with: same everything else. */
static int baseline_of(int ci) {
    const run_config *c = &configs[ci];
    int b;
    for (b = 0; b < num_configs; b++) {
        const run_config *o = &configs[b];
        if (o->recompute == RC_NONE && !o->count_comm && o->strategy == c->strategy && o->optimizer == c->optimizer &&
            o->frozen == c->frozen && o->groups == c->groups && o->no_sync == c->no_sync &&
            (o->worlds & c->worlds) == c->worlds)
            return b;
    }
    return -1;
}

/* Recompute runs of a mode give parameters bitwise identical to their baseline's, every rank,
   every step, every P. */
static void assert_recompute_bitwise(int mode) {
    int ci, world, rank, step, e, runs = 0, index = 0;
    char what[400];
    for (ci = 0; ci < num_configs; ci++) {
        int b;
        if (configs[ci].recompute != mode) continue;
        b = baseline_of(ci);
        describe(what, sizeof what, &configs[ci], 1);
        snprintf(message, sizeof message, "%s: no baseline configuration without recompute", what);
        TEST_ASSERT_TRUE_MESSAGE(b >= 0, message);
        for (world = 1; world <= MAX_WORLD; world++) {
            if (!runs_at(ci, world)) continue;
            runs++;
            for (rank = 0; rank < world; rank++) {
                const rank_result *r = result_of(world, ci, rank), *base = result_of(world, b, rank);
                for (step = 0; step < STEPS; step++)
                    for (e = 0; e < NELEM; e++)
                        if (memcmp(&r->after[step][e], &base->after[step][e], sizeof(float)) != 0) {
                            describe(what, sizeof what, &configs[ci], world);
                            snprintf(message, sizeof message,
                                     "%s, rank %d: after step %d %s[%d] = %.9g with recompute, %.9g without", what, rank,
                                     step, param_of_element(e, &index), index, r->after[step][e], base->after[step][e]);
                            TEST_FAIL_MESSAGE(message);
                        }
            }
        }
    }
    TEST_ASSERT_TRUE_MESSAGE(runs >= 3, "too few recompute runs");
}

/* ---------------------------------------------------------------------------------------------
   tests: recompute
   --------------------------------------------------------------------------------------------- */
static void test_recompute_inside_own_backward_gives_bitwise_identical_parameters_for_every_strategy(void) {
    ensure_matrix();
    assert_recompute_bitwise(RC_OWN);
}

static void test_recompute_of_an_earlier_unit_inside_a_later_units_backward_gives_bitwise_identical_parameters(void) {
    ensure_matrix();
    assert_recompute_bitwise(RC_SPAN);
}

static void test_recompute_of_a_region_before_its_units_backward_gives_bitwise_identical_parameters(void) {
    ensure_matrix();
    assert_recompute_bitwise(RC_REGION);
}

static int recompute_family(const run_config *c) { return c->frozen == FZ_NONE && c->groups == GR_NONE; }
static void test_recompute_and_plain_training_match_the_reference_within_1e_6(void) {
    ensure_matrix();
    assert_family_matches_reference(recompute_family);
}

/* FULL_SHARD at P = 2 without prefetch gathers the root once (it stays gathered from its
   pre_forward to its post_backward) and every Linear unit twice per iteration (forward,
   backward), and reduces each unit's gradient once. A recomputation inside the unit's own backward gathers
   nothing more; one before the unit's backward gathers once more for each unit it spans. */
static void test_recompute_inside_own_backward_issues_no_extra_all_gather_and_spanning_one_per_unit(void) {
    static const int expected[4][UNITS] = {{1, 2, 2, 2}, {1, 2, 2, 2}, {1, 2, 3, 2}, {1, 2, 3, 3}};
    int ci, rank, u, checked = 0;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        const run_config *c = &configs[ci];
        if (!c->count_comm || c->strategy != FSDP_FULL_SHARD) continue;
        for (rank = 0; rank < 2; rank++) {
            const rank_result *r = result_of(2, ci, rank);
            for (u = 0; u < UNITS; u++) {
                char what[400];
                describe(what, sizeof what, c, 2);
                snprintf(message, sizeof message, "%s, rank %d: all-gathers of unit %d over %d steps", what, rank, u, STEPS);
                TEST_ASSERT_EQUAL_INT_MESSAGE(expected[c->recompute][u] * STEPS, (int)r->gathers[u], message);
                snprintf(message, sizeof message, "%s, rank %d: reduce-scatters of unit %d over %d steps", what, rank, u,
                         STEPS);
                TEST_ASSERT_EQUAL_INT_MESSAGE(STEPS, (int)r->reduces[u], message);
            }
            checked++;
        }
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(8, checked, "counting runs");
}

/* Recomputing inside the unit's own backward uses the parameters gathered for it: its
   pre_forward adds no unsharded bytes, at any strategy and P. Recomputing before the unit's
   backward does gather (FULL_SHARD at P = 2 without prefetch: the counting runs), which shows
   the measure sees a gather. */
static void test_recompute_inside_own_backward_gathers_no_unsharded_bytes(void) {
    int ci, world, rank, checked = 0, span_checked = 0;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++)
        for (world = 1; world <= MAX_WORLD; world++) {
            if (!runs_at(ci, world) || configs[ci].recompute == RC_NONE) continue;
            for (rank = 0; rank < world; rank++) {
                char what[400];
                const rank_result *r = result_of(world, ci, rank);
                describe(what, sizeof what, &configs[ci], world);
                snprintf(message, sizeof message, "%s, rank %d: a recomputation's pre_forward in the unit's own backward "
                         "added %ld unsharded bytes", what, rank, r->own_growth);
                TEST_ASSERT_TRUE_MESSAGE(r->own_recomputes > 0, "no recomputation inside a unit's own backward");
                TEST_ASSERT_EQUAL_INT_MESSAGE(0, (int)r->own_growth, message);
                checked++;
                if (configs[ci].count_comm && configs[ci].recompute == RC_SPAN) {
                    snprintf(message, sizeof message, "%s, rank %d: the recomputation of layers.1 before its backward "
                             "gathered nothing (%ld bytes)", what, rank, r->span_growth);
                    TEST_ASSERT_TRUE_MESSAGE(r->span_growth >= 4 * H2 * H1, message);
                    span_checked++;
                }
            }
        }
    TEST_ASSERT_TRUE(checked > 10);
    TEST_ASSERT_EQUAL_INT(2, span_checked);
}

static void test_post_backward_with_an_open_recompute_hook_fails_with_state_error_naming_the_unit(void) {
    int rank;
    ensure_matrix();
    for (rank = 0; rank < 2; rank++) {
        const misuse_report *r = &special->misuse[rank];
        TEST_ASSERT_TRUE_MESSAGE(r->done, "the misuse ranks did not finish");
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r->open_recompute_pre_rc, "pre_forward inside the unit's own backward");
        snprintf(message, sizeof message, "rank %d: post_backward with the recompute open: %s", rank,
                 r->open_recompute_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_STATE, r->open_recompute_rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->open_recompute_error, "'layers.2'"), message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->open_recompute_error, "recomputation"), message);
    }
}

static void test_backward_of_a_unit_whose_spanning_recompute_is_open_fails_with_state_error(void) {
    int rank;
    ensure_matrix();
    for (rank = 0; rank < 2; rank++) {
        const misuse_report *r = &special->misuse[rank];
        TEST_ASSERT_TRUE_MESSAGE(r->done, "the misuse ranks did not finish");
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r->open_span_pre_rc, "pre_forward (recompute) before its backward");
        snprintf(message, sizeof message, "rank %d: pre_backward with its recompute open: %s", rank, r->open_span_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_STATE, r->open_span_rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->open_span_error, "layers.2"), message);
    }
}

/* ---------------------------------------------------------------------------------------------
   tests: frozen parameters
   --------------------------------------------------------------------------------------------- */
static int frozen_family(const run_config *c) { return c->frozen != FZ_NONE; }

static void test_frozen_parameters_stay_bitwise_at_their_initial_values(void) {
    int ci, world, rank, step, p, i, runs = 0;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        if (!frozen_family(&configs[ci])) continue;
        for (world = 1; world <= MAX_WORLD; world++) {
            if (!runs_at(ci, world)) continue;
            runs++;
            for (rank = 0; rank < world; rank++) {
                const rank_result *r = result_of(world, ci, rank);
                for (step = 0; step < STEPS; step++)
                    for (p = 0; p < NPARAMS; p++) {
                        if (!is_frozen(configs[ci].frozen, p)) continue;
                        for (i = 0; i < param_numel[p]; i++) {
                            int e = param_offset[p] + i;
                            float init = fsdp_init_value(reference_model.model, reference_model.param[p], i, SEED);
                            if (memcmp(&r->after[step][e], &init, sizeof init) != 0) {
                                char what[400];
                                describe(what, sizeof what, &configs[ci], world);
                                snprintf(message, sizeof message,
                                         "%s, rank %d: frozen %s[%d] is %.9g after step %d, was %.9g", what, rank,
                                         param_names[p], i, r->after[step][e], step, init);
                                TEST_FAIL_MESSAGE(message);
                            }
                        }
                    }
            }
        }
    }
    TEST_ASSERT_TRUE(runs > 10);
}

static void test_frozen_training_matches_a_reference_that_never_updates_frozen_parameters(void) {
    ensure_matrix();
    assert_family_matches_reference(frozen_family);
}

static int frozen_skip_family(const run_config *c) { return c->frozen >= FZ_SKIP; }
static void test_frozen_unit_whose_backward_hooks_are_skipped_trains_like_the_reference(void) {
    ensure_matrix();
    assert_family_matches_reference(frozen_skip_family);
}

static int frozen_no_sync_family(const run_config *c) { return c->frozen >= FZ_SKIP && c->no_sync; }
static void test_frozen_unit_skipping_backward_under_no_sync_starts_each_micro_step_as_a_new_iteration(void) {
    ensure_matrix();
    assert_family_matches_reference(frozen_no_sync_family);
}

static void test_frozen_step_reports_the_gradient_norm_of_the_trainable_parameters_only(void) {
    int ci, world, rank, step;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        if (!frozen_family(&configs[ci])) continue;
        for (world = 1; world <= MAX_WORLD; world++) {
            if (!runs_at(ci, world)) continue;
            for (rank = 0; rank < world; rank++) {
                const rank_result *r = result_of(world, ci, rank);
                for (step = 0; step < STEPS; step++) {
                    double want = references[ci].grad_norm[step];
                    if (fabs(r->grad_norm[step] - want) > 1e-5 * want) {
                        char what[400];
                        describe(what, sizeof what, &configs[ci], world);
                        snprintf(message, sizeof message, "%s, rank %d step %d: grad norm %.9g, reference %.9g", what, rank,
                                 step, r->grad_norm[step], want);
                        TEST_FAIL_MESSAGE(message);
                    }
                }
            }
        }
    }
}

static void test_frozen_parameters_have_no_gradient_and_no_gradient_shard(void) {
    int ci, world, rank;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++)
        for (world = 1; world <= MAX_WORLD; world++) {
            if (!runs_at(ci, world)) continue;
            for (rank = 0; rank < world; rank++) {
                char what[400];
                const rank_result *r = result_of(world, ci, rank);
                describe(what, sizeof what, &configs[ci], world);
                snprintf(message, sizeof message, "%s, rank %d: fsdp_grad of a frozen parameter was not NULL", what, rank);
                TEST_ASSERT_EQUAL_INT_MESSAGE(0, (int)r->grad_violations, message);
                snprintf(message, sizeof message, "%s, rank %d: fsdp_param_info.grad_shard is NULL for a trainable or "
                         "set for a frozen parameter", what, rank);
                TEST_ASSERT_EQUAL_INT_MESSAGE(0, (int)r->grad_shard_violations, message);
            }
        }
}

static fsdp_model *model_frozen(int frozen, mlp *m) {
    TEST_ASSERT_EQUAL_INT(0, mlp_build(m));
    apply_frozen(m, frozen);
    return m->model;
}

/* Gradient and optimizer bytes leave out the units whose parameters are all frozen (root and
   layers.0 under SKIP, layers.0 under MIXED) and keep the mixed unit whole; all equal the
   estimator's, exactly. */
static void test_frozen_units_have_no_gradient_or_optimizer_bytes_and_stats_equal_the_estimate(void) {
    int ci, world, rank, u, checked = 0, rc;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        const run_config *c = &configs[ci];
        if (!frozen_family(c)) continue;
        for (world = 1; world <= MAX_WORLD; world++) {
            fsdp_memory_stats est;
            fsdp_desc desc;
            mlp m;
            int nbuf = optimizers[c->optimizer].kind == FSDP_SGD || optimizers[c->optimizer].kind == FSDP_OPTIMIZER_CUSTOM ? 1 : 2;
            if (!runs_at(ci, world)) continue;
            desc_for(&desc, c, NULL, world);
            rc = fsdp_memory_estimate(model_frozen(c->frozen, &m), &desc, world, &est);
            fsdp_model_destroy(m.model);
            TEST_ASSERT_EQUAL_INT(0, rc);
            for (rank = 0; rank < world; rank++) {
                char what[400];
                const rank_result *r = result_of(world, ci, rank);
                size_t grad = 0, params = 0;
                for (u = 0; u < UNITS; u++) {
                    int all_frozen = u == 1 || (u == 0 && c->frozen >= FZ_SKIP);
                    params += 4 * (size_t)r->shard_numel[u];
                    if (!all_frozen) grad += 4 * (size_t)r->shard_numel[u];
                }
                describe(what, sizeof what, c, world);
                snprintf(message, sizeof message, "%s, rank %d: grad_shard_bytes", what, rank);
                TEST_ASSERT_EQUAL_INT_MESSAGE((int)grad, (int)r->memory.grad_shard_bytes, message);
                snprintf(message, sizeof message, "%s, rank %d: optimizer_bytes", what, rank);
                TEST_ASSERT_EQUAL_INT_MESSAGE((int)grad * nbuf, (int)r->memory.optimizer_bytes, message);
                snprintf(message, sizeof message, "%s, rank %d: param_shard_bytes", what, rank);
                TEST_ASSERT_EQUAL_INT_MESSAGE((int)params, (int)r->memory.param_shard_bytes, message);
                snprintf(message, sizeof message, "%s, rank %d: stats vs fsdp_memory_estimate (grad, optimizer, persistent)",
                         what, rank);
                TEST_ASSERT_EQUAL_INT_MESSAGE((int)est.grad_shard_bytes, (int)r->memory.grad_shard_bytes, message);
                TEST_ASSERT_EQUAL_INT_MESSAGE((int)est.optimizer_bytes, (int)r->memory.optimizer_bytes, message);
                TEST_ASSERT_EQUAL_INT_MESSAGE((int)est.persistent_bytes, (int)r->memory.persistent_bytes, message);
                if (!c->no_sync) {
                    snprintf(message, sizeof message, "%s, rank %d: peak unsharded %zu above the estimate %zu", what, rank,
                             r->memory.peak_unsharded_bytes, est.peak_unsharded_bytes);
                    TEST_ASSERT_TRUE_MESSAGE(r->memory.peak_unsharded_bytes <= est.peak_unsharded_bytes, message);
                }
                checked++;
            }
        }
    }
    TEST_ASSERT_TRUE(checked > 10);
}

/* A model whose parameters are all frozen (a teacher) costs its parameter shards only:
   4 bytes per parameter per rank under FULL_SHARD, with padding to the world size. */
static void test_frozen_estimate_of_an_all_frozen_model_counts_parameters_only(void) {
    static const run_config c = {FSDP_FULL_SHARD, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W4};
    fsdp_memory_stats frozen, trainable;
    fsdp_desc desc;
    mlp m;
    int rc;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    desc_for(&desc, &c, NULL, 4);
    rc = fsdp_memory_estimate(m.model, &desc, 4, &trainable);
    if (!rc) rc = fsdp_model_set_trainable(m.model, 0, 0); /* the root module: every parameter */
    if (!rc) rc = fsdp_memory_estimate(m.model, &desc, 4, &frozen);
    fsdp_model_destroy(m.model);
    TEST_ASSERT_EQUAL_INT(0, rc);
    TEST_ASSERT_EQUAL_INT(0, (int)frozen.grad_shard_bytes);
    TEST_ASSERT_EQUAL_INT(0, (int)frozen.optimizer_bytes);
    TEST_ASSERT_EQUAL_INT((int)trainable.param_shard_bytes, (int)frozen.param_shard_bytes);
    TEST_ASSERT_EQUAL_INT((int)frozen.param_shard_bytes, (int)frozen.persistent_bytes);
    snprintf(message, sizeof message, "param shard bytes %zu for %d parameters at P=4", frozen.param_shard_bytes, NELEM);
    TEST_ASSERT_TRUE_MESSAGE(frozen.param_shard_bytes >= 4 * (NELEM / 4) && frozen.param_shard_bytes <= 4 * (NELEM / 4 + 8),
                             message);
    TEST_ASSERT_TRUE(frozen.peak_unsharded_bytes < trainable.peak_unsharded_bytes); /* no gradient buffers */
}

static void test_set_trainable_marks_a_module_subtree_or_one_parameter(void) {
    int before[NPARAMS], after[NPARAMS], rc[7], p;
    mlp m;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    for (p = 0; p < NPARAMS; p++) before[p] = fsdp_model_param_trainable(m.model, m.param[p]);
    rc[0] = fsdp_model_set_trainable(m.model, m.layers, 0);    /* layers.* frozen */
    rc[1] = fsdp_model_set_trainable(m.model, m.layer[2], 1);  /* layers.2.* trainable again */
    rc[2] = fsdp_model_param_set_trainable(m.model, m.param[P_B2], 0);
    for (p = 0; p < NPARAMS; p++) after[p] = fsdp_model_param_trainable(m.model, m.param[p]);
    rc[3] = fsdp_model_param_trainable(m.model, NPARAMS);
    rc[4] = fsdp_model_param_trainable(NULL, 0);
    rc[5] = fsdp_model_set_trainable(m.model, 99, 0);
    rc[6] = fsdp_model_param_set_trainable(m.model, -1, 0);
    fsdp_model_destroy(m.model);
    for (p = 0; p < NPARAMS; p++) {
        snprintf(message, sizeof message, "%s: trainable before any call, and after", param_names[p]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, before[p], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(p == P_SCALE || p == P_W2, after[p], message);
    }
    TEST_ASSERT_EQUAL_INT(0, rc[0]);
    TEST_ASSERT_EQUAL_INT(0, rc[1]);
    TEST_ASSERT_EQUAL_INT(0, rc[2]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(-1, rc[3], "fsdp_model_param_trainable of a parameter that does not exist");
    TEST_ASSERT_EQUAL_INT_MESSAGE(-1, rc[4], "fsdp_model_param_trainable(NULL, 0)");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc[5], "fsdp_model_set_trainable of module 99");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc[6], "fsdp_model_param_set_trainable of parameter -1");
}

/* --- checkpoints --------------------------------------------------------------------------- */
static const checkpoint_report *checkpoint_of(int rank) {
    const checkpoint_report *r = &special->checkpoint[rank];
    ensure_matrix();
    snprintf(message, sizeof message, "checkpoint rank %d did not finish: %s", rank, r->error);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

/* Which of each parameter's tensors a checkpoint holds: [p][0] the parameter, [1] .exp_avg,
   [2] .exp_avg_sq. */
typedef int (*has_tensor_fn)(const void *file, const char *name);
static void tensor_presence(has_tensor_fn has, const void *file, int present[NPARAMS][3]) {
    static const char *const suffixes[3] = {"", ".exp_avg", ".exp_avg_sq"};
    char name[96];
    int p, s;
    for (p = 0; p < NPARAMS; p++)
        for (s = 0; s < 3; s++) {
            snprintf(name, sizeof name, "%s%s", param_names[p], suffixes[s]);
            present[p][s] = has(file, name);
        }
}

static void assert_frozen_tensors_without_optimizer_state(const char *where, int present[NPARAMS][3]) {
    static const char *const suffixes[3] = {"", ".exp_avg", ".exp_avg_sq"};
    int p, s;
    for (p = 0; p < NPARAMS; p++)
        for (s = 0; s < 3; s++) {
            int frozen = is_frozen(checkpoint_config.frozen, p), want = s == 0 || !frozen;
            snprintf(message, sizeof message, "%s: %s%s should be %s (the parameter is %s)", where, param_names[p],
                     suffixes[s], want ? "present" : "absent", frozen ? "frozen" : "trainable");
            TEST_ASSERT_EQUAL_INT_MESSAGE(want, present[p][s], message);
        }
}

static int st_has(const void *file, const char *name) { return fsdp_st_find((const fsdp_st_file *)file, name) >= 0; }
static int index_has(const void *index, const char *name) {
    return fsdp_index_find((const fsdp_index *)index, name) >= 0;
}

static void test_frozen_checkpoint_full_holds_frozen_tensors_without_optimizer_state(void) {
    char full[320], sharded[320], err[256] = "";
    float values[NELEM];
    fsdp_st_file *f = NULL;
    int present[NPARAMS][3], p, i, rc = 0;
    checkpoint_of(0);
    checkpoint_paths(&checkpoint_config, full, sharded, sizeof full);
    rc = fsdp_st_open(&f, full, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_st_open(%s): %s", full, err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, message);
    tensor_presence(st_has, f, present);
    for (p = 0; p < NPARAMS && !rc; p++)
        if (present[p][0]) rc = fsdp_st_read(f, fsdp_st_find(f, param_names[p]), 0, param_numel[p],
                                             values + param_offset[p], err, sizeof err);
    fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, err);
    assert_frozen_tensors_without_optimizer_state(full, present);
    for (p = 0; p < NPARAMS; p++) { /* the frozen values are the init values */
        if (!is_frozen(checkpoint_config.frozen, p)) continue;
        for (i = 0; i < param_numel[p]; i++) {
            float init = fsdp_init_value(reference_model.model, reference_model.param[p], i, SEED);
            snprintf(message, sizeof message, "%s[%d] in the file", param_names[p], i);
            TEST_ASSERT_EQUAL_MEMORY_MESSAGE(&init, &values[param_offset[p] + i], sizeof init, message);
        }
    }
}

static void test_frozen_checkpoint_sharded_holds_frozen_tensors_without_optimizer_state(void) {
    char full[320], sharded[320], err[256] = "";
    fsdp_index *index = NULL;
    int present[NPARAMS][3], rc;
    checkpoint_of(0);
    checkpoint_paths(&checkpoint_config, full, sharded, sizeof full);
    rc = fsdp_index_open(&index, sharded, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_index_open(%s): %s", sharded, err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, message);
    tensor_presence(index_has, index, present);
    fsdp_index_close(index);
    assert_frozen_tensors_without_optimizer_state(sharded, present);
}

static void assert_bitwise(const float *want, const float *got, const char *what, int rank) {
    int e, index = 0;
    for (e = 0; e < NELEM; e++)
        if (memcmp(&want[e], &got[e], sizeof(float)) != 0) {
            snprintf(message, sizeof message, "rank %d, %s: %s[%d] = %.9g, want %.9g", rank, what,
                     param_of_element(e, &index), index, got[e], want[e]);
            TEST_FAIL_MESSAGE(message);
        }
}

/* B and C start from another seed, so their frozen parameters differ until loaded; after the
   load every parameter is the saved one, and a further step (with the loaded Adam moments and
   step count) lands bitwise where the saving run's lands. */
static void test_frozen_checkpoint_load_restores_every_parameter_and_training_continues_bitwise(void) {
    int rank, differs = 0, e;
    for (rank = 0; rank < 2; rank++) {
        const checkpoint_report *r = checkpoint_of(rank);
        for (e = param_offset[P_W0]; e < param_offset[P_W0] + param_numel[P_W0]; e++) differs += r->init_b[e] != r->saved[e];
        assert_bitwise(r->saved, r->loaded_full, "loaded from the full file", rank);
        assert_bitwise(r->saved, r->loaded_sharded, "loaded from the sharded checkpoint", rank);
        assert_bitwise(r->after_a, r->after_full, "a step after loading the full file", rank);
        assert_bitwise(r->after_a, r->after_sharded, "a step after loading the sharded checkpoint", rank);
        TEST_ASSERT_EQUAL_INT_MESSAGE(NPARAMS, r->loaded_tensors_full, "parameters loaded from the full file");
    }
    TEST_ASSERT_TRUE_MESSAGE(differs > 0, "the loading runs' init equals the saved frozen weight: that proves nothing");
}

/* ---------------------------------------------------------------------------------------------
   tests: an optimizer of the test's own, and HYBRID_SHARD on a user backend
   --------------------------------------------------------------------------------------------- */
static int adagrad_family(const run_config *c) { return c->optimizer == OPT_ADAGRAD; }
static void test_custom_optimizer_row_adagrad_trains_like_the_reference_for_every_strategy(void) {
    ensure_matrix();
    assert_family_matches_reference(adagrad_family);
}

/* Its state is saved as <param>.sum (its state name) under metadata optimizer "adagrad", and a
   context loading either checkpoint continues bitwise as the run that saved it. */
static void test_custom_optimizer_state_travels_in_checkpoints_under_its_own_names(void) {
    char full[320], sharded[320], name[96], err[256] = "";
    fsdp_st_file *f = NULL;
    fsdp_index *index = NULL;
    int rank, p, rc;
    for (rank = 0; rank < 2; rank++) {
        const checkpoint_report *r = &special->custom_checkpoint[rank];
        ensure_matrix();
        snprintf(message, sizeof message, "Adagrad checkpoint rank %d did not finish: %s", rank, r->error);
        TEST_ASSERT_TRUE_MESSAGE(r->done, message);
        assert_bitwise(r->saved, r->loaded_full, "loaded from the full file", rank);
        assert_bitwise(r->after_a, r->after_full, "a step after loading the full file", rank);
        assert_bitwise(r->after_a, r->after_sharded, "a step after loading the sharded checkpoint", rank);
    }
    checkpoint_paths(&custom_checkpoint_config, full, sharded, sizeof full);
    rc = fsdp_st_open(&f, full, err, sizeof err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, err);
    rc = fsdp_index_open(&index, sharded, err, sizeof err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, err);
    TEST_ASSERT_EQUAL_STRING("adagrad", fsdp_st_metadata(f, "optimizer"));
    TEST_ASSERT_EQUAL_STRING("adagrad", fsdp_index_metadata(index, "optimizer"));
    for (p = 0; p < NPARAMS; p++) {
        snprintf(name, sizeof name, "%s.sum", param_names[p]);
        snprintf(message, sizeof message, "%s in the full file and the index", name);
        TEST_ASSERT_TRUE_MESSAGE(fsdp_st_find(f, name) >= 0 && fsdp_index_find(index, name) >= 0, message);
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(2 * NPARAMS, fsdp_st_num_tensors(f), "tensors: each parameter and its sum");
    fsdp_st_close(f);
    fsdp_index_close(index);
}

static int user_hybrid_family(const run_config *c) { return c->count_comm && c->strategy == FSDP_HYBRID_SHARD; }
static void test_hybrid_shard_on_a_user_backend_splits_it_and_trains_like_the_reference(void) {
    ensure_matrix();
    assert_family_matches_reference(user_hybrid_family);
}

/* ---------------------------------------------------------------------------------------------
   tests: parameter groups
   --------------------------------------------------------------------------------------------- */
static int gpt_groups(const run_config *c) { return c->groups == GR_GPT; }
static void test_param_groups_adamw_decaying_only_matrices_with_scaled_lr_match_the_reference(void) {
    ensure_matrix();
    assert_family_matches_reference(gpt_groups);
}

static int swapped_groups(const run_config *c) { return c->groups == GR_GPT_SWAPPED; }
static void test_param_groups_a_parameter_takes_the_first_group_that_matches_it(void) {
    int swapped, gpt;
    ensure_matrix();
    assert_family_matches_reference(swapped_groups);
    /* and the order matters: layers.2.bias (matching both) is decayed only when "layers.2.*" comes first */
    for (swapped = 0; configs[swapped].groups != GR_GPT_SWAPPED; swapped++) {}
    for (gpt = 0; !(configs[gpt].groups == GR_GPT && configs[gpt].strategy == FSDP_FULL_SHARD &&
                    configs[gpt].frozen == FZ_NONE);
         gpt++) {}
    TEST_ASSERT_TRUE_MESSAGE(memcmp(&result_of(1, swapped, 0)->after[STEPS - 1][param_offset[P_B2]],
                                    &result_of(1, gpt, 0)->after[STEPS - 1][param_offset[P_B2]], sizeof(float) * OUT) != 0,
                             "layers.2.bias trained the same whichever group came first");
}

static int sgd_groups(const run_config *c) { return c->groups == GR_SGD; }
static void test_param_groups_sgd_with_momentum_and_per_group_decay_and_lr_match_the_reference(void) {
    ensure_matrix();
    assert_family_matches_reference(sgd_groups);
}

static void test_param_groups_invalid_fail_init_with_invalid_arg_naming_the_group(void) {
    static const char *const what[3] = {"negative weight_decay in group 1", "min_ndim 2 > max_ndim 1",
                                        "num_param_groups 1 with param_groups NULL"};
    static const char *const needle[3] = {"param_groups[1]", "param_groups[0]", "param_groups"};
    int i;
    ensure_matrix();
    TEST_ASSERT_TRUE_MESSAGE(special->bad_groups.done, "the invalid-groups rank did not finish");
    for (i = 0; i < 3; i++) {
        const bad_groups_report *r = &special->bad_groups;
        snprintf(message, sizeof message, "%s: fsdp_init gave %s (%s)", what[i], fsdp_result_name(r->rc[i]), r->error[i]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, r->rc[i], message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->error[i], needle[i]), message);
    }
}

/* ---------------------------------------------------------------------------------------------
   tests: FSDP_STRATEGY_AUTO
   --------------------------------------------------------------------------------------------- */
static const auto_report *auto_of(int rank) {
    const auto_report *r = &special->autos[rank];
    ensure_matrix();
    TEST_ASSERT_TRUE_MESSAGE(r->done, "the AUTO ranks did not finish");
    snprintf(message, sizeof message,
             "deep model's estimates at P=2 not strictly ordered: NO_SHARD %zu, SHARD_GRAD_OP %zu, FULL_SHARD %zu",
             r->peak[FSDP_NO_SHARD], r->peak[FSDP_SHARD_GRAD_OP], r->peak[FSDP_FULL_SHARD]);
    TEST_ASSERT_TRUE_MESSAGE(r->peak[FSDP_NO_SHARD] > r->peak[FSDP_SHARD_GRAD_OP] &&
                                 r->peak[FSDP_SHARD_GRAD_OP] > r->peak[FSDP_FULL_SHARD] && r->peak[FSDP_FULL_SHARD] > 0,
                             message);
    return r;
}

static const fsdp_strategy auto_expected[AUTO_CASES] = {FSDP_NO_SHARD,      FSDP_SHARD_GRAD_OP, FSDP_SHARD_GRAD_OP,
                                                        FSDP_FULL_SHARD,    FSDP_FULL_SHARD,    FSDP_STRATEGY_AUTO};

static void test_auto_picks_the_least_sharded_strategy_whose_estimate_fits_the_budget(void) {
    int rank, i, u;
    for (rank = 0; rank < 2; rank++) {
        const auto_report *r = auto_of(rank);
        for (i = 0; i < AUTO_CASES - 1; i++) {
            snprintf(message, sizeof message, "rank %d, budget %zu: fsdp_init with AUTO: %s", rank, r->budget[i],
                     r->init_error[i]);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r->init_rc[i], message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(DEEP_LAYERS + 1, r->num_units[i], message);
            for (u = 0; u <= DEEP_LAYERS; u++) {
                snprintf(message, sizeof message, "rank %d, budget %zu (estimates %zu / %zu / %zu): unit %d's strategy", rank,
                         r->budget[i], r->peak[FSDP_NO_SHARD], r->peak[FSDP_SHARD_GRAD_OP], r->peak[FSDP_FULL_SHARD], u);
                TEST_ASSERT_EQUAL_STRING_MESSAGE(fsdp_strategy_name(auto_expected[i]),
                                                 fsdp_strategy_name((fsdp_strategy)r->unit_strategy[i][u]), message);
            }
            snprintf(message, sizeof message, "rank %d, budget %zu: fsdp_strategy_for_budget", rank, r->budget[i]);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r->helper_rc[i], message);
            TEST_ASSERT_EQUAL_STRING_MESSAGE(fsdp_strategy_name(auto_expected[i]), fsdp_strategy_name(r->helper_chosen[i]),
                                             message);
        }
    }
}

static void test_auto_says_which_strategy_it_chose_and_why(void) {
    const auto_report *r = auto_of(0);
    int i;
    for (i = 0; i < AUTO_CASES - 1; i++) {
        snprintf(message, sizeof message, "budget %zu: why = \"%s\"", r->budget[i], r->why[i]);
        TEST_ASSERT_TRUE_MESSAGE(strncmp(r->why[i], fsdp_strategy_name(auto_expected[i]),
                                         strlen(fsdp_strategy_name(auto_expected[i]))) == 0, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->why[i], "budget"), message);
        if (auto_expected[i] != FSDP_NO_SHARD) /* and what the least sharded would need */
            TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->why[i], "NO_SHARD needs"), message);
    }
}

static void test_auto_with_a_budget_below_full_shard_fails_out_of_memory_naming_the_bytes_needed(void) {
    int rank;
    for (rank = 0; rank < 2; rank++) {
        const auto_report *r = auto_of(rank);
        char needed[32];
        snprintf(needed, sizeof needed, "%zu", r->peak[FSDP_FULL_SHARD]);
        snprintf(message, sizeof message, "rank %d, budget %zu: fsdp_init gave %s (%s); helper: %s", rank,
                 r->budget[AUTO_CASES - 1], fsdp_result_name(r->init_rc[AUTO_CASES - 1]), r->init_error[AUTO_CASES - 1],
                 r->why[AUTO_CASES - 1]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_OUT_OF_MEMORY, r->init_rc[AUTO_CASES - 1], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_OUT_OF_MEMORY, r->helper_rc[AUTO_CASES - 1], message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->init_error[AUTO_CASES - 1], needed), message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->why[AUTO_CASES - 1], needed), message);
    }
}

static void test_auto_without_a_memory_budget_fails_init_with_invalid_arg(void) {
    const auto_report *r = auto_of(0);
    snprintf(message, sizeof message, "fsdp_init gave %s (%s)", fsdp_result_name(r->no_budget_rc), r->no_budget_error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, r->no_budget_rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->no_budget_error, "memory_budget"), message);
}

static void test_auto_with_an_invalid_param_group_fails_naming_the_group(void) {
    const auto_report *r = auto_of(0);
    snprintf(message, sizeof message, "fsdp_init gave %s (\"%s\")", fsdp_result_name(r->bad_group_rc), r->bad_group_error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, r->bad_group_rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->bad_group_error, "param_groups[0]"), message);
}

/* The estimate of an AUTO description is the estimate of the strategy it would choose. */
static void test_auto_estimate_is_the_estimate_of_the_chosen_strategy(void) {
    static const run_config c = {FSDP_SHARD_GRAD_OP, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W2};
    fsdp_memory_stats chosen, automatic;
    fsdp_model *model = NULL;
    fsdp_desc desc;
    int rc[2];
    TEST_ASSERT_EQUAL_INT(0, deep_build(&model));
    desc_for(&desc, &c, NULL, 2);
    rc[0] = fsdp_memory_estimate(model, &desc, 2, &chosen);
    desc.strategy = FSDP_STRATEGY_AUTO;
    desc.memory_budget = chosen.peak_bytes;
    rc[1] = fsdp_memory_estimate(model, &desc, 2, &automatic);
    fsdp_model_destroy(model);
    TEST_ASSERT_EQUAL_INT(0, rc[0]);
    TEST_ASSERT_EQUAL_INT(0, rc[1]);
    TEST_ASSERT_EQUAL_MEMORY(&chosen, &automatic, sizeof chosen);
}

/* AUTO tries FULL_SHARD last as the leanest: it keeps the persistent state of SHARD_GRAD_OP
   and gathers a subset of what SHARD_GRAD_OP keeps gathered, so its estimate must not be larger,
   also for a model with few units (here 3 resharded units, limit_all_gathers 2). */
static void test_auto_full_shard_estimate_never_exceeds_shard_grad_op(void) {
    static const run_config c = {FSDP_SHARD_GRAD_OP, OPT_ADAMW, RC_NONE, FZ_NONE, GR_NONE, PF_PRE, 0, 0, W2};
    fsdp_memory_stats sgo[MAX_WORLD + 1], full[MAX_WORLD + 1];
    fsdp_desc desc;
    mlp m;
    int world, rc = 0;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    for (world = 2; world <= MAX_WORLD; world++) {
        desc_for(&desc, &c, NULL, world);
        rc |= fsdp_memory_estimate(m.model, &desc, world, &sgo[world]);
        desc.strategy = FSDP_FULL_SHARD;
        rc |= fsdp_memory_estimate(m.model, &desc, world, &full[world]);
    }
    fsdp_model_destroy(m.model);
    TEST_ASSERT_EQUAL_INT(0, rc);
    for (world = 2; world <= MAX_WORLD; world++) {
        snprintf(message, sizeof message, "P=%d: FULL_SHARD peak_bytes %zu (unsharded %zu) > SHARD_GRAD_OP's %zu "
                 "(unsharded %zu)", world, full[world].peak_bytes, full[world].peak_unsharded_bytes,
                 sgo[world].peak_bytes, sgo[world].peak_unsharded_bytes);
        TEST_ASSERT_TRUE_MESSAGE(full[world].peak_bytes <= sgo[world].peak_bytes, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   runner
   --------------------------------------------------------------------------------------------- */
void setUp(void) {}
void tearDown(void) {}

int main(void) {
    int ci;
    char line[160];
    unsetenv("FSDP_DEBUG"); /* its hook misuse cases misuse on purpose: FSDP_DEBUG >= 1 would abort there */
    if (mlp_build(&reference_model) != 0) {
        fprintf(stderr, "cannot build the reference model\n");
        return 1;
    }
    if (make_temp_dir(ckpt_dir, sizeof ckpt_dir, "fsdp_test_training_features") != 0) {
        perror("mkdtemp");
        return 1;
    }
    build_configs();
    for (ci = 0; ci < num_configs; ci++) reference_train(&configs[ci], &references[ci]);
    matrix = (matrix_results *)map_shared(sizeof *matrix);
    special = (special_results *)map_shared(sizeof *special);

    UNITY_BEGIN();
    RUN_TEST(test_recompute_inside_own_backward_gives_bitwise_identical_parameters_for_every_strategy);
    RUN_TEST(test_recompute_of_an_earlier_unit_inside_a_later_units_backward_gives_bitwise_identical_parameters);
    RUN_TEST(test_recompute_of_a_region_before_its_units_backward_gives_bitwise_identical_parameters);
    RUN_TEST(test_recompute_and_plain_training_match_the_reference_within_1e_6);
    RUN_TEST(test_recompute_inside_own_backward_issues_no_extra_all_gather_and_spanning_one_per_unit);
    RUN_TEST(test_recompute_inside_own_backward_gathers_no_unsharded_bytes);
    RUN_TEST(test_post_backward_with_an_open_recompute_hook_fails_with_state_error_naming_the_unit);
    RUN_TEST(test_backward_of_a_unit_whose_spanning_recompute_is_open_fails_with_state_error);
    RUN_TEST(test_frozen_parameters_stay_bitwise_at_their_initial_values);
    RUN_TEST(test_frozen_training_matches_a_reference_that_never_updates_frozen_parameters);
    RUN_TEST(test_frozen_unit_whose_backward_hooks_are_skipped_trains_like_the_reference);
    RUN_TEST(test_frozen_unit_skipping_backward_under_no_sync_starts_each_micro_step_as_a_new_iteration);
    RUN_TEST(test_frozen_step_reports_the_gradient_norm_of_the_trainable_parameters_only);
    RUN_TEST(test_frozen_parameters_have_no_gradient_and_no_gradient_shard);
    RUN_TEST(test_frozen_units_have_no_gradient_or_optimizer_bytes_and_stats_equal_the_estimate);
    RUN_TEST(test_frozen_estimate_of_an_all_frozen_model_counts_parameters_only);
    RUN_TEST(test_set_trainable_marks_a_module_subtree_or_one_parameter);
    RUN_TEST(test_frozen_checkpoint_full_holds_frozen_tensors_without_optimizer_state);
    RUN_TEST(test_frozen_checkpoint_sharded_holds_frozen_tensors_without_optimizer_state);
    RUN_TEST(test_frozen_checkpoint_load_restores_every_parameter_and_training_continues_bitwise);
    RUN_TEST(test_custom_optimizer_row_adagrad_trains_like_the_reference_for_every_strategy);
    RUN_TEST(test_custom_optimizer_state_travels_in_checkpoints_under_its_own_names);
    RUN_TEST(test_hybrid_shard_on_a_user_backend_splits_it_and_trains_like_the_reference);
    RUN_TEST(test_param_groups_adamw_decaying_only_matrices_with_scaled_lr_match_the_reference);
    RUN_TEST(test_param_groups_a_parameter_takes_the_first_group_that_matches_it);
    RUN_TEST(test_param_groups_sgd_with_momentum_and_per_group_decay_and_lr_match_the_reference);
    RUN_TEST(test_param_groups_invalid_fail_init_with_invalid_arg_naming_the_group);
    RUN_TEST(test_auto_picks_the_least_sharded_strategy_whose_estimate_fits_the_budget);
    RUN_TEST(test_auto_says_which_strategy_it_chose_and_why);
    RUN_TEST(test_auto_with_a_budget_below_full_shard_fails_out_of_memory_naming_the_bytes_needed);
    RUN_TEST(test_auto_without_a_memory_budget_fails_init_with_invalid_arg);
    RUN_TEST(test_auto_with_an_invalid_param_group_fails_naming_the_group);
    RUN_TEST(test_auto_estimate_is_the_estimate_of_the_chosen_strategy);
    RUN_TEST(test_auto_full_shard_estimate_never_exceeds_shard_grad_op);
    snprintf(line, sizeof line, "training-features matrix: %d configurations over P=1..4 in %.1f s", num_configs,
             matrix->seconds);
    puts(line);
    remove_tree(ckpt_dir);
    fsdp_model_destroy(reference_model.model);
    return UNITY_END();
}
