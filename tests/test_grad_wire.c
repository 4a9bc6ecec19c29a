/* test_grad_wire.c - specification of quantized gradient reduction in training (issue 37 item 3,
   ZeRO++'s qgZ): fsdp_desc.grad_wire INT8/INT4 and error_feedback, on test_mlp.h's model trained
   by forked ranks on 2 hosts x 2 ranks, and on hosts of unequal sizes (each rank in a UTS
   namespace of its own, as test_hierarchical.c makes hosts; socket world).

   - Training equals, bit for bit, a plain reference run in one process: fsdp at world 1 (f32,
     same optimizer) whose gradients are made by hand from the four ranks' local gradients with
     the documented arithmetic of fsdp_reduce_scatter_wire (each host's two partials summed,
     plus the residual under error feedback, fsdp_wire_encode, the residual updated, decoded,
     folded in host order by fsdp_reduce_ranks with FSDP_AVG over 4), on every unit's flat
     gradient cut into the world-4 shards. int8 and int4, with and without error feedback.
   - Error feedback changes the result; its residual goes through a sharded checkpoint (save,
     load into a new job, continue = the uninterrupted run, bitwise); a checkpoint without it
     loads with zero residual and says so.
   - A NaN in one rank's gradient skips the step on every rank, the rank naming the unit.
   - HYBRID_SHARD (shard groups of a host's 2 ranks, replicas across 2 and 3 hosts) equals, bit
     for bit on every rank, the reference made by the documented order of >>qcomm: each group's
     average (fsdp_reduce_ranks), each rank's pieces of it (plus its residual) encoded, folded at
     their owner in replica order over R, the sum (plus the owner's residual) encoded again and
     its decode applied everywhere. int8 and int4, with and without error feedback; run to run;
     the residuals (replicas' too) through a sharded checkpoint; the bytes sent across hosts; one
     replica trains as FULL_SHARD; one host ignores grad_wire (the plain bits).
   - Hosts of unequal sizes (2+1+3, 2+1, 1+3 ranks): FULL_SHARD and SHARD_GRAD_OP equal, bit for
     bit, the reference made by >>qcomm's order over lanes (each host's partial of every shard,
     summed over its ranks in rank order, plus the residual of its rank j mod L_h at lane j / L_h,
     encoded, decoded, folded in host order); int8 and int4, with and without error feedback; run
     to run; with int8 gathers and the host reshard too; the codes each rank sends on its lanes;
     a NaN of the rank alone on its host skips the step everywhere; the residual through a
     sharded checkpoint.
   - Shard groups spanning hosts under HYBRID_SHARD, recovery with it, hosts interleaved and a
     float wire other than reduce_dtype are refused, naming the unit; the estimator counts the
     residual as fsdp_memory_stats does.
   - A step that repeats the last one (int8 gathers, host reshard, int4 gradients) allocates
     nothing in its hooks and fsdp_step: the gathers', host shards', gradients' and quantized
     reductions' buffers come back from the pool (fresh pages cost a step more than its compute
     on a VM).
   Ranks write into a MAP_SHARED board; only the parent asserts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <unistd.h>
/* fsdp.h's allocator (a documented configuration macro), counting while a rank arms it: each rank
   is a process, and its comm thread allocates through it too */
static int allocations_counted, counting_allocations;
static void *counted_malloc(size_t size) {
    if (__atomic_load_n(&counting_allocations, __ATOMIC_RELAXED)) __atomic_add_fetch(&allocations_counted, 1, __ATOMIC_RELAXED);
    return malloc(size);
}
#define FSDP_MALLOC(size) counted_malloc(size)
#define FSDP_REALLOC(ptr, size) realloc(ptr, size)
#define FSDP_FREE(ptr) free(ptr)
/* fsdp.h's hook around a quantized reduction's second half (event 0: the comm thread handed it to
   the wire thread; 1: the wire thread is about to run it). Armed (wire_hold), the first half to
   run waits, at most 10 s, until the comm thread has handed the next one: which it can do only
   while the first one's exchange across hosts has not run, if the two threads overlap. */
static int wire_hold, wire_handed, wire_overlapped;
static void wire_half(int event) {
    int waited;
    if (event == 0) {
        __atomic_add_fetch(&wire_handed, 1, __ATOMIC_SEQ_CST);
        return;
    }
    if (!__atomic_exchange_n(&wire_hold, 0, __ATOMIC_SEQ_CST)) return;
    for (waited = 0; waited < 10000 && __atomic_load_n(&wire_handed, __ATOMIC_SEQ_CST) < 2; waited++) usleep(1000);
    __atomic_store_n(&wire_overlapped, __atomic_load_n(&wire_handed, __ATOMIC_SEQ_CST) >= 2, __ATOMIC_SEQ_CST);
}
#define FSDP__WIRE_HALF(ctx, unit, event) wire_half(event)
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_mlp.h"

#define WORLD 4
#define HOSTS 2
#define LOCAL 2
#define MAX_RANKS 6
#define ROWS 3 /* batch rows per rank */
#define STEPS 4
#define TIMEOUT_MS 30000
#define NUNITS 4
#define BLOCK 8

typedef struct run_config {
    fsdp_wire wire;
    int error_feedback;
    fsdp_strategy strategy;
    int first_step, last_step;  /* steps first_step .. last_step - 1 */
    const char *save_dir;       /* saved sharded after the last step (NULL: not) */
    const char *load_dir;       /* loaded sharded before the first step (NULL: not) */
    int nan_rank, nan_step;     /* that rank's gradient gets a NaN at that step (nan_rank -1: never) */
    const char *trace_dir;      /* fsdp_desc.trace_dir (NULL: no trace) */
    int save_async;             /* save_dir by fsdp_save_sharded_async, then one more step, then fsdp_save_wait */
    int shard_group_size;       /* fsdp_desc.shard_group_size (0: the ranks per host) */
    int recovery;               /* fsdp_desc.recovery.enabled */
    fsdp_wire param_wire;       /* fsdp_desc.param_wire (the gathers' wire; the test's weights are the masters) */
    fsdp_reshard_mode reshard;  /* fsdp_desc.reshard_after_forward */
    int count_from;             /* > 0: count FSDP_MALLOC calls in the hooks and fsdp_step from this step on */
    int hold_wire;              /* arm wire_half: the first reduction's exchange waits for the next one's host sums */
} run_config;

typedef struct rank_result {
    int done, rc;
    char message[400];
    float final_master[NELEM];
    int skipped[STEPS];
    int64_t steps_taken;
    size_t grad_shard_bytes, estimate_grad_shard_bytes;
    uint64_t bytes_sent_net;          /* the last step's report: sent to other hosts */
    int64_t shard[NUNITS];
    char logged[1200];
    int allocations;                  /* FSDP_MALLOC calls counted (run_config.count_from) */
    int overlapped;                   /* run_config.hold_wire: the next reduction was handed meanwhile */
} rank_result;

static rank_result *results; /* [MAX_RANKS], MAP_SHARED before any fork */
static char message[900];
static char ckpt_root[512];

void setUp(void) { memset(results, 0, sizeof *results * MAX_RANKS); }
void tearDown(void) {}

static void capture_log(void *user, fsdp_log_level level, const char *text) {
    rank_result *r = (rank_result *)user;
    (void)level;
    if (strstr(text, "grad_wire") || strstr(text, "residual") || strstr(text, "skipped"))
        append_text(r->logged, sizeof r->logged, text);
}

/* ---------------------------------------------------------------------------------------------
   the model's math, shared by the ranks and the reference
   --------------------------------------------------------------------------------------------- */
static const int dims[4] = {IN, H1, H2, OUT};

/* One rank's forward and backward of its ROWS rows of step's batch on weights w (by parameter),
   accumulating its local gradient into g (by parameter, zero on entry), as every rank does. */
static void local_gradient(float *const *w, float *const *g, int step, int rank) {
    float x[ROWS * IN], target[ROWS * OUT], x0[ROWS * IN], h[3][ROWS * H2], a[3][ROWS * H2];
    float dout[ROWS * H2], din[ROWS * H2];
    int l, p;
    load_batch(step, rank * ROWS, rank * ROWS + ROWS, x, target);
    scale_forward(x0, x, w[P_SCALE], ROWS, IN);
    for (l = 0; l < 3; l++) {
        linear_forward(h[l], l == 0 ? x0 : a[l - 1], w[P_W0 + 2 * l], w[P_B0 + 2 * l], ROWS, dims[l], dims[l + 1]);
        for (p = 0; p < ROWS * dims[l + 1]; p++) a[l][p] = l < 2 ? tanhf(h[l][p]) : h[l][p];
    }
    for (p = 0; p < ROWS * OUT; p++) dout[p] = (a[2][p] - target[p]) / (float)(ROWS * WORLD);
    for (l = 2; l >= 0; l--) {
        memset(din, 0, sizeof din);
        linear_backward(din, g[P_W0 + 2 * l], g[P_B0 + 2 * l], dout, l == 0 ? x0 : a[l - 1], w[P_W0 + 2 * l], ROWS,
                        dims[l], dims[l + 1]);
        for (p = 0; p < ROWS * dims[l]; p++) dout[p] = l > 0 ? din[p] * (1.0f - a[l - 1][p] * a[l - 1][p]) : din[p];
    }
    scale_backward(g[P_SCALE], dout, x, ROWS, IN);
}

/* The hooks of one iteration around gradients written by fill (called between a unit's
   pre_backward and post_backward with the unit's module; 0 for the root). */
static int iterate(fsdp_ctx *ctx, const mlp *m, int (*fill)(fsdp_ctx *, const mlp *, int, void *), void *user) {
    int l, rc;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0) return rc;
    for (l = 0; l < 3; l++)
        if ((rc = fsdp_pre_forward(ctx, m->layer[l])) != 0 || (rc = fsdp_post_forward(ctx, m->layer[l])) != 0) return rc;
    if ((rc = fsdp_post_forward(ctx, 0)) != 0 || (rc = fsdp_pre_backward(ctx, 0)) != 0) return rc;
    for (l = 2; l >= 0; l--)
        if ((rc = fsdp_pre_backward(ctx, m->layer[l])) != 0 || (rc = fill(ctx, m, m->layer[l], user)) != 0 ||
            (rc = fsdp_post_backward(ctx, m->layer[l])) != 0)
            return rc;
    if ((rc = fill(ctx, m, 0, user)) != 0) return rc;
    return fsdp_post_backward(ctx, 0);
}

static int param_module(const mlp *m, int p) { return p == P_SCALE ? 0 : m->layer[(p - P_W0) / 2]; }

/* ---------------------------------------------------------------------------------------------
   a rank
   --------------------------------------------------------------------------------------------- */
typedef struct rank_step {
    float *w[NPARAMS], *g[NPARAMS];
    int nan;
} rank_step;

/* A rank's fill: its local gradient (made once the weights were gathered) added to fsdp_grad. */
static int add_local(fsdp_ctx *ctx, const mlp *m, int module, void *user) {
    const rank_step *s = (const rank_step *)user;
    int p, i;
    for (p = 0; p < NPARAMS; p++) {
        float *grad = param_module(m, p) == module ? fsdp_grad(ctx, m->param[p]) : NULL;
        if (!grad) continue;
        for (i = 0; i < param_numel[p]; i++) grad[i] += s->g[p][i];
        if (s->nan && p == P_W1) grad[3] = NAN;
    }
    return 0;
}

static void describe(fsdp_desc *d, fsdp_comm *comm, const run_config *c, rank_result *r) {
    static const char *const types[] = {"Linear", NULL};
    memset(d, 0, sizeof *d);
    d->comm = comm;
    d->strategy = c->strategy;
    d->wrap.kind = FSDP_WRAP_TYPES;
    d->wrap.types = types;
    d->seed = 7;
    d->optimizer.kind = FSDP_ADAMW;
    d->optimizer.lr = 0.05f;
    d->grad_wire = c->wire;
    d->param_wire = c->param_wire;
    d->reshard_after_forward = c->reshard;
    d->wire_block = BLOCK;
    d->error_feedback = c->error_feedback;
    d->trace_dir = c->trace_dir;
    d->shard_group_size = c->shard_group_size;
    d->recovery.enabled = c->recovery;
    d->logger.fn = capture_log;
    d->logger.user = r;
    d->logger.max_level = FSDP_LOG_INFO;
}

/* One step on a rank: weights gathered whole (f32: the masters' bits), the local gradient, the
   hooks around it, the step. */
static int rank_step_run(fsdp_ctx *ctx, const mlp *m, const run_config *c, int rank, int step, rank_result *r) {
    static float w[NELEM], g[NELEM];
    fsdp_step_report rep;
    rank_step s;
    int p, rc;
    memset(g, 0, sizeof g);
    for (p = 0; p < NPARAMS; p++) s.w[p] = w + param_offset[p], s.g[p] = g + param_offset[p];
    s.nan = rank == c->nan_rank && step == c->nan_step;
    if ((rc = fsdp_zero_grad(ctx)) != 0 || (rc = gather_all(ctx, m, w)) != 0) return rc;
    local_gradient(s.w, s.g, step, rank);
    if (c->count_from > 0 && step >= c->count_from) __atomic_store_n(&counting_allocations, 1, __ATOMIC_RELAXED);
    rc = iterate(ctx, m, add_local, &s);
    if (!rc) rc = fsdp_step(ctx, 0.0f, &rep);
    __atomic_store_n(&counting_allocations, 0, __ATOMIC_RELAXED);
    r->allocations = __atomic_load_n(&allocations_counted, __ATOMIC_RELAXED);
    if (rc) return rc;
    r->skipped[step] = rep.skipped;
    r->steps_taken = rep.step;
    r->bytes_sent_net = rep.bytes_sent_net;
    return 0;
}

static int train(fsdp_comm *comm, const run_config *c, rank_result *r) {
    int rank = fsdp_comm_rank(comm), step, rc;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    fsdp_memory_stats st, est;
    mlp m;
    describe(&d, comm, c, r);
    wire_hold = c->hold_wire;
    if ((rc = mlp_build(&m)) != 0 || (rc = fsdp_init(&ctx, m.model, &d)) != 0) {
        snprintf(r->message, sizeof r->message, "fsdp_init: %.300s", fsdp_last_error(NULL));
        fsdp_model_destroy(m.model);
        return rc;
    }
    if (c->load_dir) {
        fsdp_load_options lo;
        memset(&lo, 0, sizeof lo);
        lo.with_optimizer = 1;
        rc = fsdp_load_sharded(ctx, c->load_dir, &lo, NULL);
    }
    for (step = c->first_step; step < c->last_step && !rc; step++) rc = rank_step_run(ctx, &m, c, rank, step, r);
    if (!rc && c->save_dir) {
        fsdp_save_options so;
        memset(&so, 0, sizeof so);
        so.with_optimizer = 1;
        if (!c->save_async) rc = fsdp_save_sharded(ctx, c->save_dir, &so);
        else if ((rc = fsdp_save_sharded_async(ctx, c->save_dir, &so)) == 0 &&
                 (rc = rank_step_run(ctx, &m, c, rank, c->last_step, r)) == 0) /* (the residual changes meanwhile) */
            rc = fsdp_save_wait(ctx);
    }
    if (!rc) rc = gather_all(ctx, &m, r->final_master);
    for (step = 0; !rc && step < NUNITS; step++) {
        fsdp_unit_info ui;
        if (fsdp_unit_info_get(ctx, step, &ui) == 0) r->shard[step] = ui.shard_numel;
    }
    if (!rc && fsdp_memory_stats_get(ctx, &st) == 0 && fsdp_memory_estimate(m.model, &d, fsdp_comm_size(comm), &est) == 0) {
        r->grad_shard_bytes = st.grad_shard_bytes;
        r->estimate_grad_shard_bytes = est.grad_shard_bytes;
    }
    if (rc) snprintf(r->message, sizeof r->message, "rank %d: %.300s", rank, fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    r->overlapped = __atomic_load_n(&wire_overlapped, __ATOMIC_SEQ_CST);
    fsdp_model_destroy(m.model);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   several hosts on one machine
   --------------------------------------------------------------------------------------------- */
static void host_rank_main(fsdp_comm *comm, int join_rc, const char *why, int rank, void *arg) {
    rank_result *r = &results[rank];
    if (!comm) {
        r->rc = join_rc;
        snprintf(r->message, sizeof r->message, "%s", why);
        return;
    }
    r->rc = train(comm, (const run_config *)arg, r);
    r->done = r->rc == 0;
}

/* Runs config on a world whose rank r claims host host_of[r]; ignores the test where no host
   name can be had. 0 when every rank finished, else why in message. */
static int run_hosts(int world, const int *host_of, const run_config *c) {
    run_config config = *c;
    int r;
    memset(results, 0, sizeof *results * MAX_RANKS);
    if (run_on_hosts(world, host_of, "fsdp-grad-host", TIMEOUT_MS, host_rank_main, &config))
        TEST_IGNORE_MESSAGE("no UTS namespace here: cannot make hosts");
    for (r = 0; r < world; r++)
        if (!results[r].done) {
            snprintf(message, sizeof message, "rank %d (host %d): %.400s", r, host_of[r],
                     results[r].message[0] ? results[r].message : "no message");
            return -1;
        }
    return 0;
}

static const int two_by_two[WORLD] = {0, 0, 1, 1};

static run_config config(fsdp_wire wire, int error_feedback) {
    run_config c;
    memset(&c, 0, sizeof c);
    c.wire = wire;
    c.error_feedback = error_feedback;
    c.strategy = FSDP_FULL_SHARD;
    c.last_step = STEPS;
    c.nan_rank = -1;
    return c;
}

/* ---------------------------------------------------------------------------------------------
   the reference: one process, fsdp at world 1, gradients made by the documented arithmetic
   --------------------------------------------------------------------------------------------- */
typedef struct reference {
    run_config config;
    int world, hosts;               /* the layout reproduced: hosts (hybrid: of LOCAL ranks each) */
    int first[MAX_RANKS + 1];       /* the first rank of each host (numbered host by host) */
    int hybrid;                     /* HYBRID_SHARD's reduction: shard groups of LOCAL, one per host */
    float final_master[NELEM];
    float *residual[NUNITS][MAX_RANKS]; /* per unit and rank, zero at the start: [lanes x hosts x S]; hybrid: [S + S / hosts] */
    float *reduced[NUNITS];         /* [padded] the averaged gradient of the step */
    int64_t flat[NPARAMS];          /* each parameter's offset in its unit's flat parameter */
    int unit_of[NPARAMS];
    int64_t shard[NUNITS];          /* S: the flat length rounded up to the world, over 4 (hybrid: over LOCAL) */
    int rc;
    char message[300];
} reference;

/* fsdp_reduce_scatter_wire's documented steps (>>qcomm), on hosts of any sizes numbered host by
   host, on the ranks' flat gradients G[rank] of one unit, shards of S: rank s, local rank j of
   host g, gets from each host h its partial of shard s (summed over h's ranks in rank order),
   plus the residual of h's rank j mod L_h at lane k = j / L_h, piece (k hosts + g), encoded and
   decoded; then folds those in host order (FSDP_AVG over the world). Into ref->reduced[u]. */
static void reference_reduce(reference *ref, int u, float *const *G) {
    const int W = ref->world, H = ref->hosts;
    int64_t S = ref->shard[u], i;
    unsigned char *codes = (unsigned char *)malloc(fsdp_wire_bytes(ref->config.wire, (size_t)S, BLOCK) + 4);
    float *z = (float *)malloc(sizeof(float) * (size_t)S + 4), *dec[MAX_RANKS];
    int s, h, r;
    for (h = 0; h < H; h++) dec[h] = (float *)malloc(sizeof(float) * (size_t)S + 4);
    for (s = 0; s < W; s++) {
        const void *srcs[MAX_RANKS];
        int g = 0, j;
        while (ref->first[g + 1] <= s) g++;
        j = s - ref->first[g];
        for (h = 0; h < H; h++) {
            const int Lh = ref->first[h + 1] - ref->first[h];
            float *res = ref->residual[u][ref->first[h] + j % Lh] + (size_t)((j / Lh) * H + g) * (size_t)S;
            for (r = ref->first[h]; r < ref->first[h + 1]; r++) srcs[r - ref->first[h]] = G[r] + (size_t)s * (size_t)S;
            fsdp_reduce_ranks(z, srcs, Lh, (size_t)S, FSDP_F32, FSDP_SUM, 0);
            if (ref->config.error_feedback)
                for (i = 0; i < S; i++) z[i] = z[i] + res[i];
            fsdp_wire_encode(codes, ref->config.wire, BLOCK, z, (size_t)S, NULL);
            fsdp_wire_decode(dec[h], FSDP_F32, codes, ref->config.wire, BLOCK, (size_t)S);
            if (ref->config.error_feedback)
                for (i = 0; i < S; i++) res[i] = dec[h][i] != dec[h][i] ? 0.0f : z[i] - dec[h][i];
        }
        for (h = 0; h < H; h++) srcs[h] = dec[h];
        fsdp_reduce_ranks(ref->reduced[u] + (size_t)s * (size_t)S, srcs, H, (size_t)S, FSDP_F32, FSDP_AVG, W);
    }
    for (h = 0; h < H; h++) free(dec[h]);
    free(codes);
    free(z);
}

/* HYBRID_SHARD's documented steps (>>qcomm: the shard group's reduce-scatter, then
   fsdp__qar_run over the replicas) on the world's flat gradients G[rank] of one unit: shard
   groups of LOCAL ranks, one per host, so R = hosts replicas and pieces of n = S / R; into
   ref->reduced[u]. Rank r is replica r / LOCAL of shard l = r % LOCAL. */
static void reference_reduce_hybrid(reference *ref, int u, float *const *G) {
    const int R = ref->hosts, W = ref->world, ef = ref->config.error_feedback;
    const fsdp_wire wire = ref->config.wire;
    const int64_t S = ref->shard[u], n = S / R;
    unsigned char *codes = (unsigned char *)malloc(fsdp_wire_bytes(wire, (size_t)n, BLOCK) + 4);
    float *y = (float *)malloc(sizeof(float) * (size_t)S + 4), *z = (float *)malloc(sizeof(float) * (size_t)n + 4);
    float *dec[MAX_RANKS], *res;
    int r, m, k, l;
    int64_t i;
    for (r = 0; r < W; r++) { /* rank r: its group's average of shard l, its pieces k encoded for replica k */
        const void *srcs[LOCAL];
        for (m = 0; m < LOCAL; m++) srcs[m] = G[r / LOCAL * LOCAL + m] + (size_t)(r % LOCAL) * (size_t)S;
        fsdp_reduce_ranks(y, srcs, LOCAL, (size_t)S, FSDP_F32, FSDP_AVG, LOCAL);
        dec[r] = (float *)malloc(sizeof(float) * (size_t)S + 4);
        for (k = 0; k < R; k++) {
            res = ref->residual[u][r] + (size_t)k * (size_t)n;
            for (i = 0; i < n; i++) z[i] = ef ? y[k * n + i] + res[i] : y[k * n + i];
            fsdp_wire_encode(codes, wire, BLOCK, z, (size_t)n, NULL);
            fsdp_wire_decode(dec[r] + k * n, FSDP_F32, codes, wire, BLOCK, (size_t)n);
            for (i = 0; ef && i < n; i++) res[i] = dec[r][k * n + i] != dec[r][k * n + i] ? 0.0f : z[i] - dec[r][k * n + i];
        }
    }
    for (l = 0; l < LOCAL; l++)
        for (k = 0; k < R; k++) { /* replica k of shard l: the R pieces folded in replica order, encoded again */
            const void *srcs[MAX_RANKS];
            float *out = ref->reduced[u] + (size_t)l * (size_t)S + (size_t)k * (size_t)n;
            for (m = 0; m < R; m++) srcs[m] = dec[m * LOCAL + l] + k * n;
            fsdp_reduce_ranks(z, srcs, R, (size_t)n, FSDP_F32, FSDP_AVG, R);
            res = ref->residual[u][k * LOCAL + l] + (size_t)S;
            for (i = 0; ef && i < n; i++) z[i] = z[i] + res[i];
            fsdp_wire_encode(codes, wire, BLOCK, z, (size_t)n, NULL);
            fsdp_wire_decode(out, FSDP_F32, codes, wire, BLOCK, (size_t)n); /* what every replica applies */
            for (i = 0; ef && i < n; i++) res[i] = out[i] != out[i] ? 0.0f : z[i] - out[i];
        }
    for (r = 0; r < W; r++) free(dec[r]);
    free(codes);
    free(y);
    free(z);
}

/* The reference's fill: the reduced gradient, added to zero as the runtime adds it. */
static int put_reduced(fsdp_ctx *ctx, const mlp *m, int module, void *user) {
    const reference *ref = (const reference *)user;
    int p, i;
    for (p = 0; p < NPARAMS; p++) {
        float *grad = param_module(m, p) == module ? fsdp_grad(ctx, m->param[p]) : NULL;
        for (i = 0; grad && i < param_numel[p]; i++) grad[i] = 0.0f + ref->reduced[ref->unit_of[p]][ref->flat[p] + i];
    }
    return 0;
}

/* One reference step: the four ranks' local gradients on the masters, laid out flat per unit,
   reduced, then the hooks and the step. */
static int reference_step(fsdp_ctx *ctx, const mlp *m, reference *ref, int step) {
    static float w[NELEM], g[MAX_RANKS][NELEM];
    float *G[NUNITS][MAX_RANKS];
    int p, r, u, rc = fsdp_zero_grad(ctx);
    if (!rc) rc = gather_all(ctx, m, w);
    memset(g, 0, sizeof g);
    for (r = 0; r < ref->world && !rc; r++) {
        float *wp[NPARAMS], *gp[NPARAMS];
        for (p = 0; p < NPARAMS; p++) wp[p] = w + param_offset[p], gp[p] = g[r] + param_offset[p];
        local_gradient(wp, gp, step, r);
    }
    for (u = 0; u < NUNITS; u++)
        for (r = 0; r < ref->world; r++) G[u][r] = (float *)calloc((size_t)(ref->world * ref->shard[u]) + 1, sizeof(float));
    for (p = 0; p < NPARAMS; p++)
        for (r = 0; r < ref->world; r++)
            memcpy(G[ref->unit_of[p]][r] + ref->flat[p], g[r] + param_offset[p], sizeof(float) * (size_t)param_numel[p]);
    for (u = 0; u < NUNITS; u++) {
        if (ref->hybrid) reference_reduce_hybrid(ref, u, G[u]);
        else reference_reduce(ref, u, G[u]);
    }
    for (u = 0; u < NUNITS; u++)
        for (r = 0; r < ref->world; r++) free(G[u][r]);
    if (!rc) rc = iterate(ctx, m, put_reduced, ref);
    return rc ? rc : fsdp_step(ctx, 0.0f, NULL);
}

/* The reference's layout: each parameter's unit and flat offset, each unit's S (FULL_SHARD: at
   the world; hybrid: the flat length padded to the world, over LOCAL) and buffers. */
static int reference_layout(fsdp_ctx *ctx, const mlp *m, reference *ref) {
    int p, u;
    for (p = 0; p < NPARAMS; p++) {
        fsdp_param_info pi;
        int rc = fsdp_param_info_get(ctx, m->param[p], &pi);
        if (rc) return rc;
        ref->unit_of[p] = pi.unit;
        ref->flat[p] = pi.flat_offset;
    }
    for (u = 0; u < NUNITS; u++) {
        fsdp_unit_info ui;
        int r, rc = fsdp_unit_info_get(ctx, u, &ui);
        if (rc) return rc;
        ref->shard[u] = (ui.padded_numel + ref->world - 1) / ref->world; /* (at world 1 padded is the flat length) */
        if (ref->config.param_wire == FSDP_WIRE_INT8) /* shards of whole blocks */
            ref->shard[u] = (ui.padded_numel + ref->world * BLOCK - 1) / (ref->world * BLOCK) * BLOCK;
        if (ref->hybrid) ref->shard[u] = (ui.padded_numel + ref->world - 1) / ref->world * ref->world / LOCAL;
        ref->reduced[u] = (float *)calloc((size_t)(ref->world * ref->shard[u]) + 1, sizeof(float));
        for (r = 0; r < ref->world; r++) /* (at most 3 lanes of 3 hosts: 2+1+3, 1+3) */
            ref->residual[u][r] = (float *)calloc((size_t)(9 * ref->shard[u]) + 1, sizeof(float));
    }
    return 0;
}

static int reference_main(fsdp_comm *comm, void *arg) {
    reference *ref = (reference *)arg;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    run_config plain = ref->config;
    mlp m;
    int step, u, r, rc;
    plain.wire = FSDP_WIRE_DEFAULT;
    plain.param_wire = FSDP_WIRE_DEFAULT;
    plain.reshard = FSDP_RESHARD_DEFAULT;
    plain.error_feedback = 0;
    plain.strategy = FSDP_FULL_SHARD; /* (at world 1 every strategy is this) */
    plain.shard_group_size = 0;
    describe(&d, comm, &plain, &results[0]);
    if ((rc = mlp_build(&m)) == 0 && (rc = fsdp_init(&ctx, m.model, &d)) == 0) rc = reference_layout(ctx, &m, ref);
    for (step = 0; step < ref->config.last_step && !rc; step++) rc = reference_step(ctx, &m, ref, step);
    if (!rc) rc = gather_all(ctx, &m, ref->final_master);
    if (rc) snprintf(ref->message, sizeof ref->message, "reference: %.250s", fsdp_last_error(ctx));
    ref->rc = rc;
    for (u = 0; u < NUNITS; u++) {
        free(ref->reduced[u]);
        for (r = 0; r < ref->world; r++) free(ref->residual[u][r]);
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    return 0;
}

/* The reference's final masters for config on world ranks, rank r on host host_of[r] (numbered
   host by host; run in a forked world of one rank): HYBRID_SHARD with its default groups
   reduces as hybrid (hosts of LOCAL ranks), anything else as FULL_SHARD. */
static void reference_run(const run_config *c, int world, const int *host_of, float *final_master) {
    reference *ref = (reference *)map_shared(sizeof *ref);
    fsdp_launch_status st;
    int r;
    TEST_ASSERT_NOT_NULL(ref);
    memset(ref, 0, sizeof *ref);
    ref->config = *c;
    ref->world = world;
    for (r = 0; r < world; r++) ref->first[host_of[r] + 1] = r + 1;
    ref->hosts = host_of[world - 1] + 1;
    ref->hybrid = c->strategy == FSDP_HYBRID_SHARD && c->shard_group_size == 0;
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, launch_ranks(1, FSDP_BACKEND_SHM, TIMEOUT_MS, reference_main, ref, &st), "reference");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, ref->rc, ref->message);
    memcpy(final_master, ref->final_master, sizeof ref->final_master);
    munmap(ref, sizeof *ref);
}

/* ---------------------------------------------------------------------------------------------
   tests
   --------------------------------------------------------------------------------------------- */
static void assert_masters_equal(const float *want, const float *got, const char *what) {
    static char failure[1000];
    int e, index = 0;
    for (e = 0; e < NELEM && bits_of(want[e]) == bits_of(got[e]); e++) {}
    if (e == NELEM) return;
    snprintf(failure, sizeof failure, "%.400s: %s[%d] is %a, want %a", what, param_of_element(e, &index), index,
             (double)got[e], (double)want[e]);
    TEST_FAIL_MESSAGE(failure);
}

static const int three_by_two[3 * LOCAL] = {0, 0, 1, 1, 2, 2};

/* c trained on world ranks, rank r on host host_of[r]: every rank (so every replica) ends with
   the reference's masters. */
static void assert_trains_on_as_the_reference(const run_config *c, int world, const int *host_of, const char *layout) {
    static float want[NELEM];
    int r;
    if (run_hosts(world, host_of, c) != 0) TEST_FAIL_MESSAGE(message);
    reference_run(c, world, host_of, want);
    for (r = 0; r < world; r++) {
        snprintf(message, sizeof message, "%s %s %s%s rank %d against the reference", fsdp_strategy_name(c->strategy),
                 layout, fsdp_wire_name(c->wire), c->error_feedback ? " + error feedback" : "", r);
        assert_masters_equal(want, results[r].final_master, message);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(STEPS, results[r].steps_taken, message);
    }
}

/* c trained on hosts x LOCAL ranks. */
static void assert_trains_as_the_reference(const run_config *c, int hosts) {
    assert_trains_on_as_the_reference(c, hosts * LOCAL, hosts == 2 ? two_by_two : three_by_two, hosts == 2 ? "2x2" : "3x2");
}

static void assert_training_equals_reference(fsdp_wire wire, int error_feedback) {
    run_config c = config(wire, error_feedback);
    assert_trains_as_the_reference(&c, HOSTS);
}

static void test_grad_wire_int8_on_two_hosts_trains_as_the_reference_bitwise(void) {
    assert_training_equals_reference(FSDP_WIRE_INT8, 0);
}

static void test_grad_wire_int4_on_two_hosts_trains_as_the_reference_bitwise(void) {
    assert_training_equals_reference(FSDP_WIRE_INT4, 0);
}

static void test_grad_wire_int4_with_error_feedback_trains_as_the_reference_bitwise(void) {
    assert_training_equals_reference(FSDP_WIRE_INT4, 1);
}

static void test_grad_wire_int8_with_error_feedback_trains_as_the_reference_bitwise(void) {
    assert_training_equals_reference(FSDP_WIRE_INT8, 1);
}

static void test_grad_wire_error_feedback_changes_the_result_and_two_runs_give_the_same_bits(void) {
    static float without[NELEM], first[NELEM];
    run_config c = config(FSDP_WIRE_INT4, 0);
    int e, differ = 0;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    memcpy(without, results[0].final_master, sizeof without);
    c.error_feedback = 1;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    memcpy(first, results[0].final_master, sizeof first);
    for (e = 0; e < NELEM; e++) differ += bits_of(without[e]) != bits_of(first[e]);
    TEST_ASSERT_TRUE_MESSAGE(differ > 0, "error feedback changed nothing");
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    assert_masters_equal(first, results[0].final_master, "a second run with error feedback");
    TEST_ASSERT_EQUAL_UINT64_MESSAGE(results[0].estimate_grad_shard_bytes, results[0].grad_shard_bytes,
                                     "the estimator counts the residual as fsdp_memory_stats does");
}

/* c (error feedback on) trained whole, then saved sharded after step 2 into ckpt_root/subdir,
   loaded by a new job and continued: every rank ends with the bits of the whole run. */
static void assert_residual_round_trips_on(run_config c, int world, const int *host_of, const char *subdir,
                                           const char *what) {
    static float whole[NELEM];
    char dir[600];
    int r;
    snprintf(dir, sizeof dir, "%s/%s", ckpt_root, subdir);
    if (run_hosts(world, host_of, &c) != 0) TEST_FAIL_MESSAGE(message);
    memcpy(whole, results[0].final_master, sizeof whole);
    c.last_step = 2;
    c.save_dir = dir;
    if (run_hosts(world, host_of, &c) != 0) TEST_FAIL_MESSAGE(message);
    c.save_dir = NULL;
    c.load_dir = dir;
    c.first_step = 2;
    c.last_step = STEPS;
    if (run_hosts(world, host_of, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < world; r++) {
        snprintf(message, sizeof message, "%s rank %d: saved after step 2%s, loaded, continued", what, r,
                 c.save_async ? " (asynchronously)" : "");
        assert_masters_equal(whole, results[r].final_master, message);
    }
}

static void assert_residual_round_trips(int save_async) {
    run_config c = config(FSDP_WIRE_INT4, 1);
    c.save_async = save_async;
    assert_residual_round_trips_on(c, WORLD, two_by_two, "ef", "2x2");
}

static void test_grad_wire_residual_round_trips_through_a_sharded_checkpoint(void) { assert_residual_round_trips(0); }

static void test_grad_wire_residual_round_trips_through_an_asynchronous_sharded_checkpoint(void) {
    assert_residual_round_trips(1);
}

static void test_grad_wire_checkpoint_without_residual_loads_with_zero_residual_and_says_so(void) {
    char dir[600];
    run_config c = config(FSDP_WIRE_INT4, 0);
    snprintf(dir, sizeof dir, "%s/no-ef", ckpt_root);
    c.last_step = 1;
    c.save_dir = dir;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    c.save_dir = NULL;
    c.load_dir = dir;
    c.error_feedback = 1;
    c.first_step = 1;
    c.last_step = 2;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    assert_says(results[0].logged, "no error feedback residual");
}

static void test_grad_wire_nonfinite_gradient_skips_the_step_on_every_rank_naming_the_unit(void) {
    run_config c = config(FSDP_WIRE_INT8, 1);
    int r, named = 0;
    c.nan_rank = 1;
    c.nan_step = 1;
    c.last_step = 3;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < WORLD; r++) {
        snprintf(message, sizeof message, "rank %d: skipped %d %d %d", r, results[r].skipped[0], results[r].skipped[1],
                 results[r].skipped[2]);
        TEST_ASSERT_TRUE_MESSAGE(!results[r].skipped[0] && results[r].skipped[1] && !results[r].skipped[2], message);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(2, results[r].steps_taken, message);
        named |= contains(results[r].logged, "unit 'layers.1': grad_wire int8: a non-finite gradient");
    }
    TEST_ASSERT_TRUE_MESSAGE(named, results[0].logged);
}

/* The comm thread hands each reduction's exchange across hosts to the wire thread and goes on:
   the next unit's host sums run while the link carries the last one's codes, with the same bits. */
static void test_grad_wire_exchange_across_hosts_overlaps_the_next_reductions_host_sums_bitwise(void) {
    run_config c = config(FSDP_WIRE_INT4, 1);
    int r;
    c.hold_wire = 1;
    assert_trains_as_the_reference(&c, HOSTS);
    for (r = 0; r < WORLD; r++) {
        snprintf(message, sizeof message, "rank %d: the next reduction's host sums did not run while the first one's "
                 "exchange waited", r);
        TEST_ASSERT_TRUE_MESSAGE(results[r].overlapped, message);
    }
}

static void test_grad_wire_trace_shows_the_quantize_and_dequantize_spans_of_each_reduction(void) {
    char dir[600], path[700];
    size_t size = 0;
    unsigned char *text;
    run_config c = config(FSDP_WIRE_INT8, 1);
    c.last_step = 1;
    c.trace_dir = dir;
    snprintf(dir, sizeof dir, "%s/trace", ckpt_root);
    mkdir(dir, 0700);
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    snprintf(path, sizeof path, "%s/trace-rank00002.json", dir);
    text = read_whole_file(path, &size);
    TEST_ASSERT_NOT_NULL_MESSAGE(text, path);
    assert_says((const char *)text, "\"cat\":\"wire\",\"name\":\"quantize layers.1\"");
    assert_says((const char *)text, "\"cat\":\"wire\",\"name\":\"dequantize layers.1\"");
    assert_says((const char *)text, "\"cat\":\"wire\",\"name\":\"reduce_scatter_wire layers.1\"");
    assert_says((const char *)text, "\"cat\":\"wire\",\"name\":\"host_sums layers.1\"");
    assert_says((const char *)text, "\"tid\":5,\"name\":\"thread_name\",\"args\":{\"name\":\"wire\"}");
    free(text);
}

static void test_grad_wire_step_report_counts_the_codes_sent_across_hosts(void) {
    uint64_t sent[3];
    static const fsdp_wire wires[3] = {FSDP_WIRE_DEFAULT, FSDP_WIRE_INT8, FSDP_WIRE_INT4};
    uint64_t fewer = 0;
    int w, u;
    for (w = 0; w < 3; w++) {
        run_config c = config(wires[w], 0);
        if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
        sent[w] = results[0].bytes_sent_net;
    }
    for (u = 0; u < NUNITS; u++) /* one host partial of each unit leaves the host, in whole 4-byte words */
        fewer += (fsdp_wire_bytes(FSDP_WIRE_INT8, (size_t)results[0].shard[u], BLOCK) + 3) / 4 * 4 -
                 (fsdp_wire_bytes(FSDP_WIRE_INT4, (size_t)results[0].shard[u], BLOCK) + 3) / 4 * 4;
    snprintf(message, sizeof message, "bytes sent across hosts by rank 0 in a step: f32 %llu, int8 %llu, int4 %llu",
             (unsigned long long)sent[0], (unsigned long long)sent[1], (unsigned long long)sent[2]);
    TEST_ASSERT_TRUE_MESSAGE(sent[1] < sent[0], message);
    TEST_ASSERT_EQUAL_UINT64_MESSAGE(fewer, sent[1] - sent[2], message);
}

/* Hosts of unequal sizes (numbered host by host): lanes of one rank per host (>>qcomm) */
static const int two_one_three[6] = {0, 0, 1, 2, 2, 2}, two_one[3] = {0, 0, 1}, one_three[4] = {0, 1, 1, 1};

/* On 2+1+3, 2+1 and 1+3 ranks per host. */
static void assert_uneven_trains_as_the_reference(fsdp_strategy strategy, fsdp_wire wire, int error_feedback) {
    run_config c = config(wire, error_feedback);
    c.strategy = strategy;
    assert_trains_on_as_the_reference(&c, 6, two_one_three, "2+1+3");
    assert_trains_on_as_the_reference(&c, 3, two_one, "2+1");
    assert_trains_on_as_the_reference(&c, 4, one_three, "1+3");
}

static void test_grad_wire_int8_on_uneven_hosts_trains_as_the_reference_bitwise(void) {
    assert_uneven_trains_as_the_reference(FSDP_FULL_SHARD, FSDP_WIRE_INT8, 0);
}

static void test_grad_wire_int4_on_uneven_hosts_trains_as_the_reference_bitwise(void) {
    assert_uneven_trains_as_the_reference(FSDP_FULL_SHARD, FSDP_WIRE_INT4, 0);
}

static void test_grad_wire_int8_with_error_feedback_on_uneven_hosts_trains_as_the_reference_bitwise(void) {
    assert_uneven_trains_as_the_reference(FSDP_FULL_SHARD, FSDP_WIRE_INT8, 1);
}

static void test_grad_wire_int4_with_error_feedback_on_uneven_hosts_trains_as_the_reference_bitwise(void) {
    assert_uneven_trains_as_the_reference(FSDP_FULL_SHARD, FSDP_WIRE_INT4, 1);
}

static void test_grad_wire_shard_grad_op_on_uneven_hosts_trains_as_the_reference_bitwise(void) {
    run_config c = config(FSDP_WIRE_INT4, 1);
    c.strategy = FSDP_SHARD_GRAD_OP;
    assert_trains_on_as_the_reference(&c, 6, two_one_three, "2+1+3");
}

/* The three wires of issue 37 together on 2+1+3: int8 gathers and the host reshard move the same
   weights (the masters here), so the gradients reduce as the reference's. */
static void test_grad_wire_on_uneven_hosts_with_int8_gathers_and_host_reshard_trains_as_the_reference_bitwise(void) {
    run_config c = config(FSDP_WIRE_INT4, 1);
    c.param_wire = FSDP_WIRE_INT8;
    c.reshard = FSDP_RESHARD_HOST;
    assert_trains_on_as_the_reference(&c, 6, two_one_three, "2+1+3, int8 gathers, host reshard,");
}

/* The third and fourth steps repeat the buffer sizes of the first two: the pool serves them all,
   nothing is allocated (before, with at most 8 buffers kept, the host shards, grad_full and the
   reductions' scratch were freed and allocated anew each step). */
static void test_grad_wire_repeated_steps_with_int8_gathers_and_host_reshard_allocate_nothing(void) {
    run_config c = config(FSDP_WIRE_INT4, 0);
    int r;
    c.param_wire = FSDP_WIRE_INT8;
    c.reshard = FSDP_RESHARD_HOST;
    c.count_from = 2;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < WORLD; r++) {
        snprintf(message, sizeof message, "rank %d allocated %d times in steps 3 and 4 (hooks and fsdp_step)", r,
                 results[r].allocations);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, results[r].allocations, message);
    }
}

static void test_grad_wire_on_uneven_hosts_two_runs_give_the_same_bits_and_the_estimate_counts_the_residual(void) {
    static float first[6][NELEM];
    run_config c = config(FSDP_WIRE_INT4, 1);
    int r;
    if (run_hosts(6, two_one_three, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 6; r++) memcpy(first[r], results[r].final_master, sizeof first[r]);
    if (run_hosts(6, two_one_three, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 6; r++) {
        snprintf(message, sizeof message, "2+1+3: a second run, rank %d", r);
        assert_masters_equal(first[r], results[r].final_master, message);
        TEST_ASSERT_EQUAL_UINT64_MESSAGE(results[r].estimate_grad_shard_bytes, results[r].grad_shard_bytes,
                                         "the estimator counts the residual as fsdp_memory_stats does");
    }
}

/* Each rank sends, per unit, its host's partials on each of its lanes to the other hosts' ranks
   of the lane (H - 1 pieces a lane): on 2+1+3, rank 2 (alone on its host) is on 3 lanes, the
   ranks of the first host on 2 and 1, those of the last host on 1. */
static void test_grad_wire_on_uneven_hosts_step_report_counts_the_codes_of_every_lane(void) {
    static const int lanes[6] = {2, 1, 3, 1, 1, 1};
    uint64_t int8[6], fewer = 0;
    run_config c = config(FSDP_WIRE_INT8, 0);
    int r, u;
    if (run_hosts(6, two_one_three, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 6; r++) int8[r] = results[r].bytes_sent_net;
    c.wire = FSDP_WIRE_INT4;
    if (run_hosts(6, two_one_three, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (u = 0; u < NUNITS; u++)
        fewer += (fsdp_wire_bytes(FSDP_WIRE_INT8, (size_t)results[0].shard[u], BLOCK) + 3) / 4 * 4 -
                 (fsdp_wire_bytes(FSDP_WIRE_INT4, (size_t)results[0].shard[u], BLOCK) + 3) / 4 * 4;
    for (r = 0; r < 6; r++) {
        snprintf(message, sizeof message, "2+1+3, rank %d: bytes sent across hosts in a step: int8 %llu, int4 %llu", r,
                 (unsigned long long)int8[r], (unsigned long long)results[r].bytes_sent_net);
        TEST_ASSERT_EQUAL_UINT64_MESSAGE((uint64_t)lanes[r] * 2 * fewer, int8[r] - results[r].bytes_sent_net, message);
    }
}

/* The NaN of rank 2, alone on its host and on 3 lanes, reaches every rank's step. */
static void test_grad_wire_on_uneven_hosts_nonfinite_gradient_skips_the_step_on_every_rank_naming_the_unit(void) {
    run_config c = config(FSDP_WIRE_INT8, 1);
    int r;
    c.nan_rank = 2;
    c.nan_step = 1;
    c.last_step = 3;
    if (run_hosts(6, two_one_three, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 6; r++) {
        snprintf(message, sizeof message, "2+1+3, rank %d: skipped %d %d %d", r, results[r].skipped[0],
                 results[r].skipped[1], results[r].skipped[2]);
        TEST_ASSERT_TRUE_MESSAGE(!results[r].skipped[0] && results[r].skipped[1] && !results[r].skipped[2], message);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(2, results[r].steps_taken, message);
    }
    assert_says(results[2].logged, "unit 'layers.1': grad_wire int8: a non-finite gradient");
}

static void test_grad_wire_on_uneven_hosts_residual_round_trips_through_a_sharded_checkpoint(void) {
    assert_residual_round_trips_on(config(FSDP_WIRE_INT4, 1), 4, one_three, "uneven-ef", "1+3");
}

/* HYBRID_SHARD: shard groups of the LOCAL ranks of a host, replicas across hosts */
static run_config hybrid_config(fsdp_wire wire, int error_feedback) {
    run_config c = config(wire, error_feedback);
    c.strategy = FSDP_HYBRID_SHARD;
    return c;
}

/* On 2 and on 3 hosts. */
static void assert_hybrid_trains_as_the_reference(fsdp_wire wire, int error_feedback) {
    run_config c = hybrid_config(wire, error_feedback);
    assert_trains_as_the_reference(&c, 2);
    assert_trains_as_the_reference(&c, 3);
}

static void test_grad_wire_hybrid_int8_on_two_and_three_hosts_trains_as_the_reference_bitwise(void) {
    assert_hybrid_trains_as_the_reference(FSDP_WIRE_INT8, 0);
}

static void test_grad_wire_hybrid_int4_on_two_and_three_hosts_trains_as_the_reference_bitwise(void) {
    assert_hybrid_trains_as_the_reference(FSDP_WIRE_INT4, 0);
}

static void test_grad_wire_hybrid_int8_with_error_feedback_trains_as_the_reference_bitwise(void) {
    assert_hybrid_trains_as_the_reference(FSDP_WIRE_INT8, 1);
}

static void test_grad_wire_hybrid_int4_with_error_feedback_trains_as_the_reference_bitwise(void) {
    assert_hybrid_trains_as_the_reference(FSDP_WIRE_INT4, 1);
}

static void test_grad_wire_hybrid_two_runs_give_the_same_bits_on_every_replica_and_the_estimate_counts_the_residual(void) {
    static float first[NELEM];
    run_config c = hybrid_config(FSDP_WIRE_INT4, 1);
    int r;
    if (run_hosts(3 * LOCAL, three_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    memcpy(first, results[0].final_master, sizeof first);
    if (run_hosts(3 * LOCAL, three_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 3 * LOCAL; r++) {
        snprintf(message, sizeof message, "a second run, rank %d (replica %d)", r, r / LOCAL);
        assert_masters_equal(first, results[r].final_master, message);
    }
    TEST_ASSERT_EQUAL_UINT64_MESSAGE(results[0].estimate_grad_shard_bytes, results[0].grad_shard_bytes,
                                     "the estimator counts the residual as fsdp_memory_stats does");
}

static void test_grad_wire_hybrid_residual_round_trips_through_a_sharded_checkpoint(void) {
    assert_residual_round_trips_on(hybrid_config(FSDP_WIRE_INT4, 1), 3 * LOCAL, three_by_two, "hybrid-ef",
                                   "HYBRID_SHARD");
}

static void test_grad_wire_hybrid_nonfinite_gradient_skips_the_step_on_every_replica_naming_the_unit(void) {
    run_config c = hybrid_config(FSDP_WIRE_INT8, 1);
    int r, named = 0;
    c.nan_rank = 1;
    c.nan_step = 1;
    c.last_step = 3;
    if (run_hosts(3 * LOCAL, three_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 3 * LOCAL; r++) {
        snprintf(message, sizeof message, "rank %d: skipped %d %d %d", r, results[r].skipped[0], results[r].skipped[1],
                 results[r].skipped[2]);
        TEST_ASSERT_TRUE_MESSAGE(!results[r].skipped[0] && results[r].skipped[1] && !results[r].skipped[2], message);
        assert_masters_equal(results[0].final_master, results[r].final_master, message);
        named |= contains(results[r].logged, "unit 'layers.1': grad_wire int8: a non-finite gradient (element") &&
                 contains(results[r].logged, "of this rank's shard, reduced over its shard group)");
    }
    TEST_ASSERT_TRUE_MESSAGE(named, results[1].logged);
}

static void test_grad_wire_hybrid_step_report_counts_the_codes_sent_across_hosts(void) {
    uint64_t sent[3];
    static const fsdp_wire wires[3] = {FSDP_WIRE_DEFAULT, FSDP_WIRE_INT8, FSDP_WIRE_INT4};
    uint64_t fewer = 0;
    int w, u;
    for (w = 0; w < 3; w++) {
        run_config c = hybrid_config(wires[w], 0);
        if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
        sent[w] = results[0].bytes_sent_net;
    }
    for (u = 0; u < NUNITS; u++) { /* of each unit, a piece of n = S / 2 elements leaves twice: partial, then sum */
        size_t n = (size_t)results[0].shard[u] / HOSTS;
        fewer += 2 * ((fsdp_wire_bytes(FSDP_WIRE_INT8, n, BLOCK) + 3) / 4 * 4 - (fsdp_wire_bytes(FSDP_WIRE_INT4, n, BLOCK) + 3) / 4 * 4);
    }
    snprintf(message, sizeof message, "HYBRID_SHARD: bytes sent across hosts by rank 0 in a step: f32 %llu, int8 %llu, "
             "int4 %llu", (unsigned long long)sent[0], (unsigned long long)sent[1], (unsigned long long)sent[2]);
    TEST_ASSERT_TRUE_MESSAGE(sent[1] < sent[0], message);
    TEST_ASSERT_EQUAL_UINT64_MESSAGE(fewer, sent[1] - sent[2], message);
}

static void test_grad_wire_hybrid_with_one_replica_trains_as_full_shard_bitwise(void) {
    run_config c = hybrid_config(FSDP_WIRE_INT8, 1);
    c.shard_group_size = WORLD; /* one replica: FULL_SHARD over the world, whose reference reference_run makes */
    assert_trains_as_the_reference(&c, HOSTS);
}

static void test_grad_wire_hybrid_on_one_host_is_ignored_with_the_plain_bits_and_says_so(void) {
    static const int one_host[WORLD] = {0, 0, 0, 0};
    static float plain[NELEM];
    run_config c = hybrid_config(FSDP_WIRE_DEFAULT, 0);
    c.shard_group_size = LOCAL; /* two replicas, both on the one host */
    if (run_hosts(WORLD, one_host, &c) != 0) TEST_FAIL_MESSAGE(message);
    memcpy(plain, results[0].final_master, sizeof plain);
    c.wire = FSDP_WIRE_INT8;
    if (run_hosts(WORLD, one_host, &c) != 0) TEST_FAIL_MESSAGE(message);
    assert_masters_equal(plain, results[3].final_master, "HYBRID_SHARD int8 on one host against grad_wire off");
    assert_says(results[0].logged, "grad_wire ignored (its reduction lies inside one host)");
}

static void test_grad_wire_hybrid_whose_shard_groups_span_hosts_is_refused_naming_the_unit(void) {
    static const int four_hosts[WORLD] = {0, 1, 2, 3};
    run_config c = hybrid_config(FSDP_WIRE_INT8, 0);
    c.shard_group_size = 2; /* groups {0, 1} and {2, 3}: each on two hosts */
    TEST_ASSERT_NOT_EQUAL(0, run_hosts(WORLD, four_hosts, &c));
    assert_says(results[0].message, "grad_wire int8 with HYBRID_SHARD whose shard groups of 2 ranks span hosts: "
                                    "not supported");
}

static void test_grad_wire_hybrid_with_recovery_is_refused(void) {
    run_config c = hybrid_config(FSDP_WIRE_INT4, 0);
    c.recovery = 1;
    TEST_ASSERT_NOT_EQUAL(0, run_hosts(WORLD, two_by_two, &c));
    assert_says(results[0].message, "recovery with grad_wire int4: not supported");
}

static void test_grad_wire_on_interleaved_hosts_is_refused_naming_the_unit(void) {
    static const int interleaved[3] = {0, 1, 0};
    run_config c = config(FSDP_WIRE_INT4, 0);
    TEST_ASSERT_NOT_EQUAL(0, run_hosts(3, interleaved, &c));
    assert_says(results[0].message, "unit '(root)': grad_wire int4 needs the ranks numbered host by host");
}

static void test_grad_wire_float_other_than_reduce_dtype_is_refused_naming_the_unit(void) {
    run_config c = config(FSDP_WIRE_BF16, 0);
    TEST_ASSERT_NOT_EQUAL(0, run_hosts(WORLD, two_by_two, &c));
    assert_says(results[0].message, "grad_wire bf16 differs from reduce_dtype f32");
}

int main(void) {
    int failures;
    results = (rank_result *)map_shared(sizeof *results * MAX_RANKS);
    if (make_temp_dir(ckpt_root, sizeof ckpt_root, "test_grad_wire") != 0) {
        perror("mkdtemp");
        return 1;
    }
    UNITY_BEGIN();
    RUN_TEST(test_grad_wire_int8_on_two_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_int4_on_two_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_int8_with_error_feedback_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_int4_with_error_feedback_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_error_feedback_changes_the_result_and_two_runs_give_the_same_bits);
    RUN_TEST(test_grad_wire_residual_round_trips_through_a_sharded_checkpoint);
    RUN_TEST(test_grad_wire_residual_round_trips_through_an_asynchronous_sharded_checkpoint);
    RUN_TEST(test_grad_wire_checkpoint_without_residual_loads_with_zero_residual_and_says_so);
    RUN_TEST(test_grad_wire_nonfinite_gradient_skips_the_step_on_every_rank_naming_the_unit);
    RUN_TEST(test_grad_wire_exchange_across_hosts_overlaps_the_next_reductions_host_sums_bitwise);
    RUN_TEST(test_grad_wire_trace_shows_the_quantize_and_dequantize_spans_of_each_reduction);
    RUN_TEST(test_grad_wire_step_report_counts_the_codes_sent_across_hosts);
    RUN_TEST(test_grad_wire_int8_on_uneven_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_int4_on_uneven_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_int8_with_error_feedback_on_uneven_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_int4_with_error_feedback_on_uneven_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_shard_grad_op_on_uneven_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_on_uneven_hosts_with_int8_gathers_and_host_reshard_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_repeated_steps_with_int8_gathers_and_host_reshard_allocate_nothing);
    RUN_TEST(test_grad_wire_on_uneven_hosts_two_runs_give_the_same_bits_and_the_estimate_counts_the_residual);
    RUN_TEST(test_grad_wire_on_uneven_hosts_step_report_counts_the_codes_of_every_lane);
    RUN_TEST(test_grad_wire_on_uneven_hosts_nonfinite_gradient_skips_the_step_on_every_rank_naming_the_unit);
    RUN_TEST(test_grad_wire_on_uneven_hosts_residual_round_trips_through_a_sharded_checkpoint);
    RUN_TEST(test_grad_wire_hybrid_int8_on_two_and_three_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_hybrid_int4_on_two_and_three_hosts_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_hybrid_int8_with_error_feedback_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_hybrid_int4_with_error_feedback_trains_as_the_reference_bitwise);
    RUN_TEST(test_grad_wire_hybrid_two_runs_give_the_same_bits_on_every_replica_and_the_estimate_counts_the_residual);
    RUN_TEST(test_grad_wire_hybrid_residual_round_trips_through_a_sharded_checkpoint);
    RUN_TEST(test_grad_wire_hybrid_nonfinite_gradient_skips_the_step_on_every_replica_naming_the_unit);
    RUN_TEST(test_grad_wire_hybrid_step_report_counts_the_codes_sent_across_hosts);
    RUN_TEST(test_grad_wire_hybrid_with_one_replica_trains_as_full_shard_bitwise);
    RUN_TEST(test_grad_wire_hybrid_on_one_host_is_ignored_with_the_plain_bits_and_says_so);
    RUN_TEST(test_grad_wire_hybrid_whose_shard_groups_span_hosts_is_refused_naming_the_unit);
    RUN_TEST(test_grad_wire_hybrid_with_recovery_is_refused);
    RUN_TEST(test_grad_wire_on_interleaved_hosts_is_refused_naming_the_unit);
    RUN_TEST(test_grad_wire_float_other_than_reduce_dtype_is_refused_naming_the_unit);
    failures = UNITY_END();
    remove_tree(ckpt_root);
    return failures;
}
