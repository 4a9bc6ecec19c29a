/* test_grad_wire.c - specification of quantized gradient reduction in training (issue 37 item 3,
   ZeRO++'s qgZ): fsdp_desc.grad_wire INT8/INT4 and error_feedback, on test_mlp.h's model trained
   by forked ranks on 2 hosts x 2 ranks (each rank in a UTS namespace of its own, as
   test_hierarchical.c makes hosts; socket world).

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
   - HYBRID_SHARD, uneven hosts and a float wire other than reduce_dtype are refused, naming the
     unit; the estimator counts the residual as fsdp_memory_stats does.
   Ranks write into a MAP_SHARED board; only the parent asserts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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
    d->wire_block = BLOCK;
    d->error_feedback = c->error_feedback;
    d->trace_dir = c->trace_dir;
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
    if ((rc = iterate(ctx, m, add_local, &s)) != 0 || (rc = fsdp_step(ctx, 0.0f, &rep)) != 0) return rc;
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
    if (!rc && fsdp_memory_stats_get(ctx, &st) == 0 && fsdp_memory_estimate(m.model, &d, WORLD, &est) == 0) {
        r->grad_shard_bytes = st.grad_shard_bytes;
        r->estimate_grad_shard_bytes = est.grad_shard_bytes;
    }
    if (rc) snprintf(r->message, sizeof r->message, "rank %d: %.300s", rank, fsdp_last_error(ctx));
    fsdp_destroy(ctx);
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
    float final_master[NELEM];
    float *residual[NUNITS][WORLD]; /* [HOSTS * S] per unit and rank, zero at the start */
    float *reduced[NUNITS];         /* [padded at world 4] the averaged gradient of the step */
    int64_t flat[NPARAMS];          /* each parameter's offset in its unit's flat parameter */
    int unit_of[NPARAMS];
    int64_t shard[NUNITS];          /* S at world 4: the flat length rounded up to 4, over 4 */
    int rc;
    char message[300];
} reference;

/* fsdp_reduce_scatter_wire's documented steps on the four ranks' flat gradients G[rank] of one
   unit, shards of S: into ref->reduced[u]. */
static void reference_reduce(reference *ref, int u, float *const *G) {
    int64_t S = ref->shard[u];
    size_t bytes = fsdp_wire_bytes(ref->config.wire, (size_t)S, BLOCK);
    unsigned char *codes = (unsigned char *)malloc(bytes + 4);
    float *z = (float *)malloc(sizeof(float) * (size_t)S + 4), *dec[HOSTS][WORLD];
    int h, l, g;
    int64_t i;
    for (h = 0; h < HOSTS; h++)
        for (g = 0; g < HOSTS; g++)
            for (l = 0; l < LOCAL; l++) { /* rank (h, l) encodes its host's partial of shard g L + l */
                const int64_t at = (int64_t)(g * LOCAL + l) * S;
                float *res = ref->residual[u][h * LOCAL + l] + (size_t)g * (size_t)S;
                dec[h][g * LOCAL + l] = (float *)malloc(sizeof(float) * (size_t)S + 4);
                for (i = 0; i < S; i++) z[i] = G[h * LOCAL][at + i] + G[h * LOCAL + 1][at + i];
                if (ref->config.error_feedback)
                    for (i = 0; i < S; i++) z[i] = z[i] + res[i];
                fsdp_wire_encode(codes, ref->config.wire, BLOCK, z, (size_t)S, NULL);
                fsdp_wire_decode(dec[h][g * LOCAL + l], FSDP_F32, codes, ref->config.wire, BLOCK, (size_t)S);
                if (ref->config.error_feedback)
                    for (i = 0; i < S; i++)
                        res[i] = dec[h][g * LOCAL + l][i] != dec[h][g * LOCAL + l][i] ? 0.0f
                                                                                        : z[i] - dec[h][g * LOCAL + l][i];
            }
    for (g = 0; g < WORLD; g++) { /* rank g folds the hosts' pieces of its shard in host order */
        const void *srcs[HOSTS];
        for (h = 0; h < HOSTS; h++) srcs[h] = dec[h][g];
        fsdp_reduce_ranks(ref->reduced[u] + (size_t)g * (size_t)S, srcs, HOSTS, (size_t)S, FSDP_F32, FSDP_AVG, WORLD);
    }
    for (h = 0; h < HOSTS; h++)
        for (g = 0; g < WORLD; g++) free(dec[h][g]);
    free(codes);
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
    static float w[NELEM], g[WORLD][NELEM];
    float *G[NUNITS][WORLD];
    int p, r, u, rc = fsdp_zero_grad(ctx);
    if (!rc) rc = gather_all(ctx, m, w);
    memset(g, 0, sizeof g);
    for (r = 0; r < WORLD && !rc; r++) {
        float *wp[NPARAMS], *gp[NPARAMS];
        for (p = 0; p < NPARAMS; p++) wp[p] = w + param_offset[p], gp[p] = g[r] + param_offset[p];
        local_gradient(wp, gp, step, r);
    }
    for (u = 0; u < NUNITS; u++)
        for (r = 0; r < WORLD; r++) G[u][r] = (float *)calloc((size_t)(WORLD * ref->shard[u]) + 1, sizeof(float));
    for (p = 0; p < NPARAMS; p++)
        for (r = 0; r < WORLD; r++)
            memcpy(G[ref->unit_of[p]][r] + ref->flat[p], g[r] + param_offset[p], sizeof(float) * (size_t)param_numel[p]);
    for (u = 0; u < NUNITS; u++) reference_reduce(ref, u, G[u]);
    for (u = 0; u < NUNITS; u++)
        for (r = 0; r < WORLD; r++) free(G[u][r]);
    if (!rc) rc = iterate(ctx, m, put_reduced, ref);
    return rc ? rc : fsdp_step(ctx, 0.0f, NULL);
}

/* The reference's layout: each parameter's unit and flat offset, each unit's S at world 4. */
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
        ref->shard[u] = (ui.padded_numel + WORLD - 1) / WORLD; /* (at world 1 padded is the flat length) */
        ref->reduced[u] = (float *)calloc((size_t)(WORLD * ref->shard[u]) + 1, sizeof(float));
        for (r = 0; r < WORLD; r++) ref->residual[u][r] = (float *)calloc((size_t)(HOSTS * ref->shard[u]) + 1, sizeof(float));
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
    plain.error_feedback = 0;
    describe(&d, comm, &plain, &results[0]);
    if ((rc = mlp_build(&m)) == 0 && (rc = fsdp_init(&ctx, m.model, &d)) == 0) rc = reference_layout(ctx, &m, ref);
    for (step = 0; step < ref->config.last_step && !rc; step++) rc = reference_step(ctx, &m, ref, step);
    if (!rc) rc = gather_all(ctx, &m, ref->final_master);
    if (rc) snprintf(ref->message, sizeof ref->message, "reference: %.250s", fsdp_last_error(ctx));
    ref->rc = rc;
    for (u = 0; u < NUNITS; u++) {
        free(ref->reduced[u]);
        for (r = 0; r < WORLD; r++) free(ref->residual[u][r]);
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    return 0;
}

/* The reference's final masters for config (run in a forked world of one rank). */
static void reference_run(const run_config *c, float *final_master) {
    reference *ref = (reference *)map_shared(sizeof *ref);
    fsdp_launch_status st;
    TEST_ASSERT_NOT_NULL(ref);
    memset(ref, 0, sizeof *ref);
    ref->config = *c;
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

static void assert_training_equals_reference(fsdp_wire wire, int error_feedback) {
    static float want[NELEM];
    run_config c = config(wire, error_feedback);
    int r;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    reference_run(&c, want);
    for (r = 0; r < WORLD; r++) {
        snprintf(message, sizeof message, "2x2 %s%s rank %d against the reference", fsdp_wire_name(wire),
                 error_feedback ? " + error feedback" : "", r);
        assert_masters_equal(want, results[r].final_master, message);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(STEPS, results[r].steps_taken, message);
    }
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

static void assert_residual_round_trips(int save_async) {
    static float whole[NELEM];
    char dir[600];
    run_config c = config(FSDP_WIRE_INT4, 1);
    int r;
    c.save_async = save_async;
    snprintf(dir, sizeof dir, "%s/ef", ckpt_root);
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    memcpy(whole, results[0].final_master, sizeof whole);
    c.last_step = 2;
    c.save_dir = dir;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    c.save_dir = NULL;
    c.load_dir = dir;
    c.first_step = 2;
    c.last_step = STEPS;
    if (run_hosts(WORLD, two_by_two, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < WORLD; r++) {
        snprintf(message, sizeof message, "rank %d: saved after step 2%s, loaded, continued", r,
                 save_async ? " (asynchronously)" : "");
        assert_masters_equal(whole, results[r].final_master, message);
    }
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

static void test_grad_wire_with_hybrid_shard_is_refused_naming_the_unit(void) {
    run_config c = config(FSDP_WIRE_INT8, 0);
    c.strategy = FSDP_HYBRID_SHARD;
    TEST_ASSERT_NOT_EQUAL(0, run_hosts(WORLD, two_by_two, &c));
    assert_says(results[0].message, "grad_wire int8 with HYBRID_SHARD: not supported");
}

static void test_grad_wire_on_uneven_hosts_is_refused_naming_the_unit(void) {
    static const int two_plus_one[3] = {0, 0, 1};
    run_config c = config(FSDP_WIRE_INT4, 0);
    TEST_ASSERT_NOT_EQUAL(0, run_hosts(3, two_plus_one, &c));
    assert_says(results[0].message, "grad_wire int4 needs every host to hold the same number of ranks");
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
    RUN_TEST(test_grad_wire_trace_shows_the_quantize_and_dequantize_spans_of_each_reduction);
    RUN_TEST(test_grad_wire_step_report_counts_the_codes_sent_across_hosts);
    RUN_TEST(test_grad_wire_with_hybrid_shard_is_refused_naming_the_unit);
    RUN_TEST(test_grad_wire_on_uneven_hosts_is_refused_naming_the_unit);
    RUN_TEST(test_grad_wire_float_other_than_reduce_dtype_is_refused_naming_the_unit);
    failures = UNITY_END();
    remove_tree(ckpt_root);
    return failures;
}
