/* test_tied.c - specification of tied weights (issue 36): one parameter used twice in a forward,
   as GPT-2 uses its token embedding again as its output layer.

   The model (V = 13 tokens, C = 5 channels: E's 65 elements divide by none of P = 2, 3, 4, so
   its shards are uneven and padded):
       x    = E[token]                      E: wte.weight (V,C), module wte (Embedding)
       h    = tanh(h.weight x + h.bias)     module h (Block): weight (C,C), bias (C)
       z    = E h                           the output layer: E^T as a Linear, logits (V)
       loss = mean over rows of the cross-entropy of softmax(z) against the target token
   E receives gradient twice: from the output layer at the start of backward and from the
   embedding at its end.

   The pattern that works, and the one README and examples/PORTING.md describe: E in the root
   unit (the wrap policy wraps only "Block"), the root's forward hooks around the whole forward and
   its backward hooks around the whole backward, the block's inside them. E is then gathered at
   both uses and both gradients land in its one gradient buffer, under every strategy. E in a unit
   of its own whose hooks are held open just as long (around the whole forward, around the whole
   backward) works too, and saves nothing; it is trained as well.
   What breaks when E sits in a unit of its own (wrap policy {"Block", "Embedding"}) whose hooks
   close after the embedding: under FULL_SHARD its post_forward reshards it, so the output layer
   cannot read it (fsdp_param returns NULL) and cannot open its forward again (FSDP_ERR_STATE);
   under SHARD_GRAD_OP it stays readable in forward, but its backward, opened for the output
   layer's gradient and closed, cannot be opened again for the embedding's (FSDP_ERR_STATE).

   The reference is plain C: the same function (forward_backward) with the hooks turned into
   no-ops, on one process and the whole batch, then AdamW's rule written out (torch.optim.AdamW).
   fsdp.h only provides the initial values (fsdp_init_value).

   How it runs: one fsdp_launch_ex per P = 1..4; each rank trains the model in both layouts and
   every strategy in turn and writes what it gathered after each step into a MAP_SHARED region
   the parent mapped before the launch; at P = 2 the ranks also run the misuse cases. Children
   never assert.

   Build: make build/test_tied */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#define MAX_WORLD 4
#define SEED 20260522u
#define LAUNCH_TIMEOUT_MS 20000 /* bound on any wait for another rank; only reached on a hang */

/* Runs are compared with the reference within 1e-5 relative to max(|ref|, REL_FLOOR), README's
   promise for every strategy at P = 1..4: the runs average per-rank gradients where the
   reference sums one batch, a rounding apart. 1e-2 is the scale of the smallest parameters. */
#define TOLERANCE 1e-5
#define REL_FLOOR 1e-2

#define V 13     /* tokens */
#define C 5      /* channels */
#define ROWS 24  /* rows per step over all ranks; divides by P = 1..4 */
#define STEPS 4

enum { P_WTE, P_HW, P_HB, NPARAMS };
static const char *const param_names[NPARAMS] = {"wte.weight", "h.weight", "h.bias"};
static const int param_numel[NPARAMS] = {V * C, C * C, C};
static const int param_offset[NPARAMS] = {0, V * C, V * C + C * C};
#define NELEM (V * C + C * C + C) /* every parameter, concatenated in that order */

/* AdamW(lr 0.02, weight decay 0.05), PyTorch's defaults otherwise */
#define LR 0.02f
#define WEIGHT_DECAY 0.05f
#define BETA1 0.9f
#define BETA2 0.999f
#define EPS 1e-8f

static const fsdp_strategy strategies[4] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_HYBRID_SHARD};
#define NSTRATEGIES 4

/* Where E lives and whose hooks enclose both of its uses */
enum { IN_ROOT, OWN_UNIT_HELD_OPEN, LAYOUTS };
static const char *const layout_names[LAYOUTS] = {"E in the root unit", "E in its own unit held open for the whole pass"};
static const char *const blocks[] = {"Block", NULL};
static const char *const blocks_and_embeddings[] = {"Block", "Embedding", NULL};

/* ---------------------------------------------------------------------------------------------
   the model
   --------------------------------------------------------------------------------------------- */
typedef struct tied {
    fsdp_model *model;
    int param[NPARAMS];
    int wte, block; /* module ids */
} tied;

static int tied_build(tied *m) {
    fsdp_init_rule normal = {FSDP_INIT_NORMAL, 0.0f, 0.5f, NULL, NULL};
    fsdp_init_rule bias_init = {FSDP_INIT_UNIFORM, -0.1f, 0.1f, NULL, NULL};
    int64_t wte_shape[2] = {V, C}, w_shape[2] = {C, C}, b_shape[1] = {C};
    int rc;
    memset(m, 0, sizeof *m);
    if ((rc = fsdp_model_create(&m->model, "Tied")) != FSDP_SUCCESS) return rc;
    if ((m->wte = fsdp_model_module(m->model, 0, "wte", "Embedding")) < 0) return m->wte;
    if ((m->block = fsdp_model_module(m->model, 0, "h", "Block")) < 0) return m->block;
    if ((m->param[P_WTE] = fsdp_model_param(m->model, m->wte, "weight", 2, wte_shape, normal)) < 0) return m->param[P_WTE];
    if ((m->param[P_HW] = fsdp_model_param(m->model, m->block, "weight", 2, w_shape, normal)) < 0) return m->param[P_HW];
    if ((m->param[P_HB] = fsdp_model_param(m->model, m->block, "bias", 1, b_shape, bias_init)) < 0) return m->param[P_HB];
    return FSDP_SUCCESS;
}

/* Row i of step `step`: a pure function, so every rank builds its own rows. */
static int token_of(int step, int i) { return (7 * i + 3 * step) % V; }
static int target_of(int step, int i) { return (5 * i + step + 1) % V; }

/* Where forward_backward gets weights and puts gradients: fsdp.h (ctx) or plain arrays. */
typedef struct tensors {
    fsdp_ctx *ctx;         /* NULL: the reference; the hooks do nothing */
    const tied *m;
    int outer;             /* the module whose hooks enclose each whole pass with the root's: 0 (the
                              root itself), or wte when it is a unit of its own held open */
    float *params, *grads; /* the reference's, NELEM each */
    const char *failed;    /* the call that failed */
} tensors;

static float *weight_of(tensors *t, int p) {
    return t->ctx ? fsdp_param(t->ctx, t->m->param[p]) : t->params + param_offset[p];
}

static float *grad_of(tensors *t, int p) {
    return t->ctx ? fsdp_grad(t->ctx, t->m->param[p]) : t->grads + param_offset[p];
}

/* (a run without t->ctx is the reference: no hooks) */
#define HOOK(call, name)                                     \
    do {                                                     \
        if (t->ctx) RETURN_IF_FAILED(call, t->failed, name); \
    } while (0)
#define NEED(ptr, name) RETURN_IF_NULL(ptr, t->failed, name " returned NULL")

/* z (V) = E h, E (V,C): the output layer, E^T as a Linear without bias */
static void output_forward(float *z, const float *E, const float *h) {
    int v, c;
    for (v = 0; v < V; v++) {
        float sum = 0;
        for (c = 0; c < C; c++) sum += E[v * C + c] * h[c];
        z[v] = sum;
    }
}

/* dE (V,C) += dz h^T; dh (C) += E^T dz */
static void output_backward(float *dE, float *dh, const float *dz, const float *E, const float *h) {
    int v, c;
    for (v = 0; v < V; v++)
        for (c = 0; c < C; c++) {
            dE[v * C + c] += dz[v] * h[c];
            dh[c] += E[v * C + c] * dz[v];
        }
}

/* One forward and backward over rows [lo, hi) of step `step`, in the order autograd would run
   it, the root's hooks (and t->outer's) around each whole pass. Gradients of the mean loss over the rows are
   accumulated (+=) into grad_of. Returns 0 or the failing hook's result (t->failed says which). */
static int forward_backward(tensors *t, int step, int lo, int hi) {
    float x[ROWS][C], h[ROWS][C], dz[ROWS][V], dh[ROWS][C], dx[ROWS][C];
    const tied *m = t->m;
    float *E, *W, *b, *dE, *dW, *db;
    int n = hi - lo, rc, i, v, c, k;
    /* forward: the root's hooks enclose both uses of E */
    HOOK(fsdp_pre_forward(t->ctx, 0), "pre_forward(root)");
    HOOK(fsdp_pre_forward(t->ctx, t->outer), "pre_forward(outer)");
    NEED(E = weight_of(t, P_WTE), "fsdp_param(wte.weight) for the embedding");
    for (i = 0; i < n; i++) memcpy(x[i], E + token_of(step, lo + i) * C, sizeof x[i]);
    HOOK(fsdp_pre_forward(t->ctx, m->block), "pre_forward(h)");
    NEED(W = weight_of(t, P_HW), "fsdp_param(h.weight)");
    NEED(b = weight_of(t, P_HB), "fsdp_param(h.bias)");
    for (i = 0; i < n; i++)
        for (c = 0; c < C; c++) {
            float sum = b[c];
            for (k = 0; k < C; k++) sum += W[c * C + k] * x[i][k];
            h[i][c] = tanhf(sum);
        }
    HOOK(fsdp_post_forward(t->ctx, m->block), "post_forward(h)");
    NEED(E = weight_of(t, P_WTE), "fsdp_param(wte.weight) for the output layer");
    for (i = 0; i < n; i++) { /* logits, then dz = (softmax(z) - onehot(target)) / n */
        float max, total = 0;
        output_forward(dz[i], E, h[i]);
        for (max = dz[i][0], v = 1; v < V; v++) max = dz[i][v] > max ? dz[i][v] : max;
        for (v = 0; v < V; v++) total += dz[i][v] = expf(dz[i][v] - max);
        for (v = 0; v < V; v++) dz[i][v] = (dz[i][v] / total - (v == target_of(step, lo + i))) / (float)n;
    }
    HOOK(fsdp_post_forward(t->ctx, t->outer), "post_forward(outer)");
    HOOK(fsdp_post_forward(t->ctx, 0), "post_forward(root)");
    /* backward: the root's hooks enclose the block's; the output layer's gradient comes first */
    memset(dh, 0, sizeof dh);
    memset(dx, 0, sizeof dx);
    HOOK(fsdp_pre_backward(t->ctx, 0), "pre_backward(root)");
    HOOK(fsdp_pre_backward(t->ctx, t->outer), "pre_backward(outer)");
    NEED(E = weight_of(t, P_WTE), "fsdp_param(wte.weight) in backward");
    NEED(dE = grad_of(t, P_WTE), "fsdp_grad(wte.weight) for the output layer");
    for (i = 0; i < n; i++) output_backward(dE, dh[i], dz[i], E, h[i]);
    HOOK(fsdp_pre_backward(t->ctx, m->block), "pre_backward(h)");
    NEED(W = weight_of(t, P_HW), "fsdp_param(h.weight) in backward");
    NEED(dW = grad_of(t, P_HW), "fsdp_grad(h.weight)");
    NEED(db = grad_of(t, P_HB), "fsdp_grad(h.bias)");
    for (i = 0; i < n; i++)
        for (c = 0; c < C; c++) {
            float dpre = dh[i][c] * (1.0f - h[i][c] * h[i][c]);
            db[c] += dpre;
            for (k = 0; k < C; k++) {
                dW[c * C + k] += dpre * x[i][k];
                dx[i][k] += W[c * C + k] * dpre;
            }
        }
    HOOK(fsdp_post_backward(t->ctx, m->block), "post_backward(h)");
    NEED(dE = grad_of(t, P_WTE), "fsdp_grad(wte.weight) for the embedding");
    for (i = 0; i < n; i++)
        for (c = 0; c < C; c++) dE[token_of(step, lo + i) * C + c] += dx[i][c];
    HOOK(fsdp_post_backward(t->ctx, t->outer), "post_backward(outer)");
    HOOK(fsdp_post_backward(t->ctx, 0), "post_backward(root)");
    return 0;
}

/* Every parameter, gathered in full, into out (NELEM floats). */
static int gather_all(fsdp_ctx *ctx, const tied *m, float *out) {
    int p, rc;
    for (p = 0; p < NPARAMS; p++)
        if ((rc = fsdp_gather_param(ctx, m->param[p], out + param_offset[p])) != 0) return rc;
    return 0;
}

/* The name of the parameter element e of the concatenation belongs to; its index there. */
static const char *param_of_element(int e, int *index) {
    int p;
    for (p = NPARAMS - 1; p > 0 && e < param_offset[p]; p--) {}
    *index = e - param_offset[p];
    return param_names[p];
}

static int hybrid_group(int world) { return world % 2 == 0 ? 2 : 1; }

static void desc_for(fsdp_desc *d, fsdp_strategy strategy, const char *const *wrap_types, fsdp_comm *comm) {
    memset(d, 0, sizeof *d);
    d->comm = comm;
    d->strategy = strategy;
    d->wrap.kind = FSDP_WRAP_TYPES;
    d->wrap.types = wrap_types;
    if (strategy == FSDP_HYBRID_SHARD) d->shard_group_size = hybrid_group(fsdp_comm_size(comm));
    d->seed = SEED;
    d->optimizer.kind = FSDP_ADAMW;
    d->optimizer.lr = LR;
    d->optimizer.weight_decay = WEIGHT_DECAY;
}

/* ---------------------------------------------------------------------------------------------
   what the ranks report (MAP_SHARED, mapped by the parent before any launch)
   --------------------------------------------------------------------------------------------- */
typedef struct rank_result {
    int done;
    char error[240];
    float init[NELEM];         /* gathered right after fsdp_init */
    float after[STEPS][NELEM]; /* gathered after each fsdp_step */
} rank_result;

/* E in a unit of its own, closed before its second use (P = 2) */
typedef struct misuse_report {
    int done;
    int full_shard_param_null;     /* fsdp_param(E) after its unit's post_forward, FULL_SHARD */
    int full_shard_reopen_rc;      /* fsdp_pre_forward(wte) again for the output layer */
    char full_shard_reopen_error[256];
    int grad_op_param_null;        /* the same read under SHARD_GRAD_OP */
    int grad_op_reopen_rc;         /* fsdp_pre_backward(wte) again for the embedding's gradient */
    char grad_op_reopen_error[256];
} misuse_report;

typedef struct results {
    int launch_rc[MAX_WORLD + 1];
    char launch_message[MAX_WORLD + 1][256];
    double seconds;
    rank_result result[MAX_WORLD + 1][LAYOUTS][NSTRATEGIES][MAX_WORLD];
    misuse_report misuse[MAX_WORLD];
} results;
static results *shared; /* MAP_SHARED */

static void record_error(rank_result *r, int rc, const char *where, const char *message) {
    snprintf(r->error, sizeof r->error, "%.60s: %.24s (%.140s)", where, fsdp_result_name(rc), message);
}

/* Trains the tied model laid out as `layout` (a pattern that works), under strategy s; everything
   into *r. */
static void train_strategy(fsdp_comm *comm, int layout, int s, rank_result *r) {
    int rank = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), rc, step;
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    tensors t;
    tied m;
    memset(r, 0, sizeof *r);
    if ((rc = tied_build(&m)) != FSDP_SUCCESS) {
        record_error(r, rc, "building the model", "");
        fsdp_model_destroy(m.model);
        return;
    }
    desc_for(&desc, strategies[s], layout == IN_ROOT ? blocks : blocks_and_embeddings, comm);
    if ((rc = fsdp_init(&ctx, m.model, &desc)) != FSDP_SUCCESS) {
        record_error(r, rc, "fsdp_init", fsdp_last_error(NULL));
        fsdp_model_destroy(m.model);
        return;
    }
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    t.m = &m;
    t.outer = layout == IN_ROOT ? 0 : m.wte;
    if ((rc = gather_all(ctx, &m, r->init)) != 0) {
        record_error(r, rc, "fsdp_gather_param after init", fsdp_last_error(ctx));
        goto done;
    }
    for (step = 0; step < STEPS; step++) {
        if ((rc = forward_backward(&t, step, rank * ROWS / world, (rank + 1) * ROWS / world)) != 0) {
            record_error(r, rc, t.failed ? t.failed : "?", fsdp_last_error(ctx));
            goto done;
        }
        if ((rc = fsdp_step(ctx, 0.0f, NULL)) != 0 || (rc = fsdp_zero_grad(ctx)) != 0) {
            record_error(r, rc, "fsdp_step or fsdp_zero_grad", fsdp_last_error(ctx));
            goto done;
        }
        if ((rc = gather_all(ctx, &m, r->after[step])) != 0) {
            record_error(r, rc, "fsdp_gather_param after a step", fsdp_last_error(ctx));
            goto done;
        }
    }
    r->done = 1;
done:
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
}

static void quiet(void *user, fsdp_log_level level, const char *message) {
    (void)user;
    (void)level;
    (void)message;
}

/* A context of the tied model with E in a unit of its own, under strategy; NULL if it fails. */
static fsdp_ctx *own_unit_ctx(fsdp_comm *comm, fsdp_strategy strategy, tied *m) {
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    if (tied_build(m) != FSDP_SUCCESS) return NULL;
    desc_for(&desc, strategy, blocks_and_embeddings, comm);
    desc.logger.fn = quiet; /* the misuse is the point: no error lines in the test's output */
    if (fsdp_init(&ctx, m->model, &desc) != FSDP_SUCCESS) return NULL;
    return ctx;
}

/* E's unit closed after the embedding; the output layer then wants E (FULL_SHARD), or the
   embedding's gradient wants E's backward again after the output layer's closed it
   (SHARD_GRAD_OP). The hooks' results are recorded, nothing is computed. */
static void run_misuse(fsdp_comm *comm, misuse_report *r) {
    fsdp_ctx *ctx;
    tied m;
    memset(r, 0, sizeof *r);
    r->full_shard_reopen_rc = r->grad_op_reopen_rc = -999;
    /* These cases misuse the hooks on purpose: a build that aborts on misuse under FSDP_DEBUG >= 1
       must return the errors here instead (the environment is the child's own). */
    unsetenv("FSDP_DEBUG");
    if ((ctx = own_unit_ctx(comm, FSDP_FULL_SHARD, &m)) != NULL && fsdp_pre_forward(ctx, 0) == 0 &&
        fsdp_pre_forward(ctx, m.wte) == 0 && fsdp_param(ctx, m.param[P_WTE]) && fsdp_post_forward(ctx, m.wte) == 0 &&
        fsdp_pre_forward(ctx, m.block) == 0 && fsdp_post_forward(ctx, m.block) == 0) {
        r->full_shard_param_null = fsdp_param(ctx, m.param[P_WTE]) == NULL;
        r->full_shard_reopen_rc = fsdp_pre_forward(ctx, m.wte);
        snprintf(r->full_shard_reopen_error, sizeof r->full_shard_reopen_error, "%.250s", fsdp_last_error(ctx));
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    if ((ctx = own_unit_ctx(comm, FSDP_SHARD_GRAD_OP, &m)) != NULL && fsdp_pre_forward(ctx, 0) == 0 &&
        fsdp_pre_forward(ctx, m.wte) == 0 && fsdp_post_forward(ctx, m.wte) == 0 && fsdp_pre_forward(ctx, m.block) == 0 &&
        fsdp_post_forward(ctx, m.block) == 0) {
        r->grad_op_param_null = fsdp_param(ctx, m.param[P_WTE]) == NULL;
        if (fsdp_post_forward(ctx, 0) == 0 && fsdp_pre_backward(ctx, 0) == 0 && fsdp_pre_backward(ctx, m.wte) == 0 &&
            fsdp_grad(ctx, m.param[P_WTE]) && fsdp_post_backward(ctx, m.wte) == 0 && fsdp_pre_backward(ctx, m.block) == 0 &&
            fsdp_post_backward(ctx, m.block) == 0) {
            r->grad_op_reopen_rc = fsdp_pre_backward(ctx, m.wte);
            snprintf(r->grad_op_reopen_error, sizeof r->grad_op_reopen_error, "%.250s", fsdp_last_error(ctx));
        }
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    r->done = 1;
}

static int tied_rank(fsdp_comm *comm, void *arg) {
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm), layout, s;
    (void)arg;
    for (layout = 0; layout < LAYOUTS; layout++)
        for (s = 0; s < NSTRATEGIES; s++) train_strategy(comm, layout, s, &shared->result[world][layout][s][rank]);
    if (world == 2) run_misuse(comm, &shared->misuse[rank]);
    return 0;
}

static void ensure_launched(void) {
    static int launched;
    if (launched) return;
    launched = 1;
    shared->seconds = launch_every_world(MAX_WORLD, LAUNCH_TIMEOUT_MS, tied_rank, shared->launch_rc,
                                         shared->launch_message[0], sizeof shared->launch_message[0]);
}

/* ---------------------------------------------------------------------------------------------
   the reference: the same forward_backward on plain arrays, AdamW written out
   --------------------------------------------------------------------------------------------- */
static tied reference_model; /* built once in main: only for fsdp_init_value */
static float reference_init[NELEM], reference_after[STEPS][NELEM];

static void reference_train(void) {
    static float params[NELEM], grads[NELEM], exp_avg[NELEM], exp_avg_sq[NELEM];
    tensors t;
    int p, i, step;
    for (p = 0; p < NPARAMS; p++)
        for (i = 0; i < param_numel[p]; i++)
            params[param_offset[p] + i] = fsdp_init_value(reference_model.model, reference_model.param[p], i, SEED);
    memcpy(reference_init, params, sizeof params);
    memset(&t, 0, sizeof t);
    t.m = &reference_model;
    t.params = params;
    t.grads = grads;
    for (step = 0; step < STEPS; step++) {
        double t1 = (double)(step + 1), step_size = LR / (1.0 - pow(BETA1, t1)),
               bias_correction2_sqrt = sqrt(1.0 - pow(BETA2, t1));
        memset(grads, 0, sizeof grads);
        forward_backward(&t, step, 0, ROWS);
        for (i = 0; i < NELEM; i++) {
            params[i] *= 1.0f - LR * WEIGHT_DECAY;
            exp_avg[i] = BETA1 * exp_avg[i] + (1.0f - BETA1) * grads[i];
            exp_avg_sq[i] = BETA2 * exp_avg_sq[i] + (1.0f - BETA2) * grads[i] * grads[i];
            params[i] -= (float)step_size * exp_avg[i] / (sqrtf(exp_avg_sq[i]) / (float)bias_correction2_sqrt + EPS);
        }
        memcpy(reference_after[step], params, sizeof params);
    }
}

/* ---------------------------------------------------------------------------------------------
   comparisons (parent only)
   --------------------------------------------------------------------------------------------- */
static char message[1024];

static const rank_result *result_of(int world, int layout, int s, int rank) {
    const rank_result *r = &shared->result[world][layout][s][rank];
    snprintf(message, sizeof message, "launch with P=%d failed: %s", world, shared->launch_message[world]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared->launch_rc[world], message);
    snprintf(message, sizeof message, "P=%d %s, %s, rank %d did not finish: %s", world, fsdp_strategy_name(strategies[s]),
             layout_names[layout], rank, r->error[0] ? r->error : "no report");
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

static const misuse_report *misuse_of(int rank) {
    const misuse_report *r = &shared->misuse[rank];
    snprintf(message, sizeof message, "launch with P=2 failed: %s", shared->launch_message[2]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared->launch_rc[2], message);
    snprintf(message, sizeof message, "rank %d did not run the misuse cases", rank);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

static void assert_same_bits(const float *a, const float *b, const char *what) {
    int e, index;
    const char *name;
    if (memcmp(a, b, sizeof(float) * NELEM) == 0) return;
    for (e = 0; e < NELEM && memcmp(&a[e], &b[e], sizeof(float)) == 0; e++) {}
    name = param_of_element(e, &index);
    snprintf(message, sizeof message, "[%s] bits differ at %s[%d]: %.9g vs %.9g", what, name, index, (double)a[e],
             (double)b[e]);
    TEST_FAIL_MESSAGE(message);
}

/* ---------------------------------------------------------------------------------------------
   tests
   --------------------------------------------------------------------------------------------- */
/* Every rank's parameters after every step, every strategy, P = 1..4, within TOLERANCE of the
   reference. */
static void assert_layout_matches_reference(int layout) {
    int world, s, rank, step, e, index, runs = 0;
    double worst = 0;
    char line[200];
    ensure_launched();
    for (world = 1; world <= MAX_WORLD; world++)
        for (s = 0; s < NSTRATEGIES; s++)
            for (rank = 0; rank < world; rank++) {
                const rank_result *r = result_of(world, layout, s, rank);
                for (step = 0; step < STEPS; step++)
                    for (e = 0; e < NELEM; e++) {
                        double err = rel_error(r->after[step][e], reference_after[step][e], REL_FLOOR);
                        worst = err > worst ? err : worst;
                        if (!(err <= TOLERANCE)) {
                            const char *name = param_of_element(e, &index);
                            snprintf(message, sizeof message, "P=%d %s, %s, rank %d after step %d: %s[%d] = %.9g, "
                                     "reference %.9g (relative error %.3g)", world, fsdp_strategy_name(strategies[s]),
                                     layout_names[layout], rank, step + 1, name, index, (double)r->after[step][e],
                                     (double)reference_after[step][e], err);
                            TEST_FAIL_MESSAGE(message);
                        }
                    }
                runs++;
            }
    snprintf(line, sizeof line, "%s: %d rank runs within %g of the reference; worst relative error %.3g",
             layout_names[layout], runs, TOLERANCE, worst);
    TEST_MESSAGE(line);
}

static void test_tied_weight_in_the_root_unit_trains_like_the_reference_for_every_strategy_and_P_within_1e_5(void) {
    assert_layout_matches_reference(IN_ROOT);
}

/* Holding E's own unit open from the embedding to the output layer works as the root does (and
   keeps E gathered as long: it saves nothing). */
static void test_tied_weight_in_its_own_unit_held_open_for_the_whole_pass_trains_like_the_reference(void) {
    assert_layout_matches_reference(OWN_UNIT_HELD_OPEN);
}

/* The comparison above is only as strict as its reference: every parameter moves, and the output
   layer gives every element of E a gradient of its own (the embedding only the rows it read). */
static void test_tied_reference_moves_every_parameter_and_its_output_layer_reaches_all_of_E(void) {
    static float grads[NELEM];
    tensors t;
    int e, moved = 0, nonzero = 0;
    for (e = 0; e < NELEM; e++) moved += reference_after[STEPS - 1][e] != reference_init[e];
    TEST_ASSERT_EQUAL_INT_MESSAGE(NELEM, moved, "the reference leaves some parameter unchanged");
    memset(&t, 0, sizeof t);
    t.m = &reference_model;
    t.params = reference_init;
    t.grads = grads;
    TEST_ASSERT_EQUAL_INT(0, forward_backward(&t, 0, 0, ROWS));
    for (e = 0; e < V * C; e++) nonzero += grads[e] != 0.0f;
    TEST_ASSERT_EQUAL_INT_MESSAGE(V * C, nonzero, "some element of E gets no gradient");
}

static void test_tied_weight_every_rank_holds_bitwise_identical_parameters_after_each_step(void) {
    int world, layout, s, rank, step;
    char what[200];
    ensure_launched();
    for (world = 2; world <= MAX_WORLD; world++)
        for (layout = 0; layout < LAYOUTS; layout++)
            for (s = 0; s < NSTRATEGIES; s++)
                for (rank = 1; rank < world; rank++) {
                    const rank_result *a = result_of(world, layout, s, 0), *b = result_of(world, layout, s, rank);
                    for (step = 0; step < STEPS; step++) {
                        snprintf(what, sizeof what, "P=%d %s, %s: rank 0 vs rank %d after step %d", world,
                                 fsdp_strategy_name(strategies[s]), layout_names[layout], rank, step + 1);
                        assert_same_bits(a->after[step], b->after[step], what);
                    }
                }
}

/* README: the init rules give the same bits at any world size (and strategy, and wrap policy) */
static void test_tied_init_gives_bitwise_init_value_for_every_world_size_and_strategy(void) {
    int world, layout, s, rank;
    char what[200];
    ensure_launched();
    for (world = 1; world <= MAX_WORLD; world++)
        for (layout = 0; layout < LAYOUTS; layout++)
            for (s = 0; s < NSTRATEGIES; s++)
                for (rank = 0; rank < world; rank++) {
                    snprintf(what, sizeof what, "init at P=%d %s, %s, rank %d", world, fsdp_strategy_name(strategies[s]),
                             layout_names[layout], rank);
                    assert_same_bits(result_of(world, layout, s, rank)->init, reference_init, what);
                }
}

static void test_tied_weight_in_a_child_unit_is_unreadable_after_its_post_forward_under_full_shard(void) {
    int rank;
    ensure_launched();
    for (rank = 0; rank < 2; rank++) {
        const misuse_report *r = misuse_of(rank);
        snprintf(message, sizeof message, "rank %d: fsdp_param(wte.weight) after wte's post_forward under FULL_SHARD "
                 "returned a pointer", rank);
        TEST_ASSERT_TRUE_MESSAGE(r->full_shard_param_null, message);
        /* SHARD_GRAD_OP keeps it gathered: the same code reads it there, and fails only in backward */
        snprintf(message, sizeof message, "rank %d: under SHARD_GRAD_OP fsdp_param(wte.weight) after wte's post_forward "
                 "returned NULL", rank);
        TEST_ASSERT_FALSE_MESSAGE(r->grad_op_param_null, message);
    }
}

static void test_tied_weight_in_a_child_unit_cannot_open_its_forward_again_for_the_output_layer(void) {
    int rank;
    ensure_launched();
    for (rank = 0; rank < 2; rank++) {
        const misuse_report *r = misuse_of(rank);
        snprintf(message, sizeof message, "rank %d: second pre_forward(wte) gave %s (\"%s\")", rank,
                 fsdp_result_name(r->full_shard_reopen_rc), r->full_shard_reopen_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_STATE, r->full_shard_reopen_rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->full_shard_reopen_error, "'wte'"), message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->full_shard_reopen_error, "already ran"), message);
    }
}

static void test_tied_weight_in_a_child_unit_cannot_open_its_backward_again_for_the_embedding_gradient(void) {
    int rank;
    ensure_launched();
    for (rank = 0; rank < 2; rank++) {
        const misuse_report *r = misuse_of(rank);
        snprintf(message, sizeof message, "rank %d: second pre_backward(wte) under SHARD_GRAD_OP gave %s (\"%s\")", rank,
                 fsdp_result_name(r->grad_op_reopen_rc), r->grad_op_reopen_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_STATE, r->grad_op_reopen_rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->grad_op_reopen_error, "'wte'"), message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(r->grad_op_reopen_error, "backward already ran"), message);
    }
}

/* ---------------------------------------------------------------------------------------------
   runner
   --------------------------------------------------------------------------------------------- */
void setUp(void) {}
void tearDown(void) {}

int main(void) {
    int rc;
    char line[120];
    if ((rc = tied_build(&reference_model)) != FSDP_SUCCESS) {
        fprintf(stderr, "cannot build the reference model: %s\n", fsdp_result_name(rc));
        return 1;
    }
    reference_train();
    shared = (results *)map_shared(sizeof *shared);

    UNITY_BEGIN();
    RUN_TEST(test_tied_reference_moves_every_parameter_and_its_output_layer_reaches_all_of_E);
    RUN_TEST(test_tied_weight_in_the_root_unit_trains_like_the_reference_for_every_strategy_and_P_within_1e_5);
    RUN_TEST(test_tied_weight_in_its_own_unit_held_open_for_the_whole_pass_trains_like_the_reference);
    RUN_TEST(test_tied_weight_every_rank_holds_bitwise_identical_parameters_after_each_step);
    RUN_TEST(test_tied_init_gives_bitwise_init_value_for_every_world_size_and_strategy);
    RUN_TEST(test_tied_weight_in_a_child_unit_is_unreadable_after_its_post_forward_under_full_shard);
    RUN_TEST(test_tied_weight_in_a_child_unit_cannot_open_its_forward_again_for_the_output_layer);
    RUN_TEST(test_tied_weight_in_a_child_unit_cannot_open_its_backward_again_for_the_embedding_gradient);
    snprintf(line, sizeof line, "tied-weights runs: 2 layouts x 4 strategies x P=1..4 in %.1f s", shared->seconds);
    puts(line);
    fsdp_model_destroy(reference_model.model);
    return UNITY_END();
}
