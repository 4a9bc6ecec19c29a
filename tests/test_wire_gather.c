/* test_wire_gather.c - specification of the parameter side of issue 37 (ZeRO++'s qwZ and hpZ):
   quantized parameter gathers (fsdp_desc.param_wire INT8/INT4) and the host reshard after
   forward (FSDP_RESHARD_HOST), on test_mlp.h's model trained by forked ranks.

   - A quantized gather gives every rank, in forward, exactly fsdp_wire_decode(fsdp_wire_encode(
     the f32 master shard)) of each rank's shard, decoded into param_dtype: at P = 1..4, on shm and
     sockets, FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD, f32 and bf16 parameters; the same bits at
     every P (shards are whole blocks); training with it is bitwise run to run.
   - FSDP_RESHARD_HOST on several hosts (ranks in UTS namespaces of their own, as
     test_hierarchical.c makes them; 2+2 and 2+1+3 ranks): backward sees exactly forward's weights
     (quantized ones too), training gives the bits of the same run without it, the units say
     HOST and their host shard's size, and the peak stays within the estimate.
   - What means nothing is refused or ignored, naming the unit.
   Ranks write into a MAP_SHARED board; only the parent asserts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_mlp.h"

#define MAX_RANKS 6
#define ROWS 3 /* batch rows per rank */
#define TIMEOUT_MS 30000
#define NUNITS 4

typedef struct run_config {
    fsdp_strategy strategy;
    fsdp_dtype dtype;
    fsdp_wire wire;
    fsdp_reshard_mode reshard;
    size_t block;
    int steps;
    int shard_group_size;
    int recompute;        /* backward recomputes each layer's forward before its pre_backward */
    int offload_params;   /* masters on disk (offload_dir, tmpfs allowed) */
    int layer1_full_shard; /* layers.1 FULL_SHARD (fsdp_model_set_strategy), whatever the strategy */
} run_config;

typedef struct rank_result {
    int done, rc;
    char message[400];
    int checked, mismatched;          /* forward weights against decode(encode(master shards)) */
    int bwd_checked, bwd_mismatched;  /* backward weights against forward's */
    float first_forward[NELEM];       /* the weights of the first forward, widened to f32 */
    float final_master[NELEM];        /* after the last step */
    int reshard_mode[NUNITS];
    int64_t host_numel[NUNITS], padded[NUNITS];
    size_t peak_unsharded, estimate_peak_unsharded;
    size_t estimate_peak_as_all;      /* the estimate of the same description with FSDP_RESHARD_ALL */
    size_t live_after_eval;           /* gathered bytes left after a forward-only pass and fsdp_finish_backward */
    int printed_to_host, printed_wire;
} rank_result;

static rank_result *results; /* [MAX_RANKS], MAP_SHARED before any fork */
static char offload_dir[512];
static char message[900];

void setUp(void) { memset(results, 0, sizeof *results * MAX_RANKS); }
void tearDown(void) {}

/* ---------------------------------------------------------------------------------------------
   a rank
   --------------------------------------------------------------------------------------------- */
/* What the forward of unit u must see: every rank's piece of its flat parameter (the f32
   masters, zeros in gaps and padding) encoded alone and decoded into param_dtype. */
static int expected_unit(fsdp_ctx *ctx, const mlp *m, const run_config *c, int unit, unsigned char *out) {
    fsdp_unit_info ui;
    float *flat;
    size_t esize = fsdp_dtype_size(c->dtype);
    int64_t piece;
    int p, rc = fsdp_unit_info_get(ctx, unit, &ui);
    if (rc) return rc;
    if (!(flat = (float *)calloc((size_t)ui.padded_numel + 1, sizeof(float)))) return FSDP_ERR_OUT_OF_MEMORY;
    for (p = 0; p < NPARAMS && !rc; p++) {
        fsdp_param_info pi;
        fsdp_param_info_get(ctx, m->param[p], &pi);
        if (pi.unit == unit) rc = fsdp_gather_param(ctx, m->param[p], flat + pi.flat_offset);
    }
    for (piece = 0; !rc && piece < ui.padded_numel; piece += ui.shard_numel) {
        size_t bytes = fsdp_wire_bytes(c->wire, (size_t)ui.shard_numel, c->block);
        void *codes = malloc(bytes + 1);
        if (!codes) rc = FSDP_ERR_OUT_OF_MEMORY;
        if (!rc) rc = fsdp_wire_encode(codes, c->wire, c->block, flat + piece, (size_t)ui.shard_numel, NULL);
        if (!rc) rc = fsdp_wire_decode(out + (size_t)piece * esize, c->dtype, codes, c->wire, c->block,
                                       (size_t)ui.shard_numel);
        free(codes);
    }
    free(flat);
    return rc;
}

/* Compares parameter p's gathered bytes with want; counts into checked and wrong. */
static void check_param(fsdp_ctx *ctx, const mlp *m, int p, const unsigned char *want, size_t esize, int *checked,
                        int *wrong) {
    const unsigned char *raw = (const unsigned char *)fsdp_param_raw(ctx, m->param[p]);
    (*checked)++;
    if (!raw || memcmp(raw, want, (size_t)param_numel[p] * esize) != 0) (*wrong)++;
}

/* The weights of a parameter as f32 while its unit is gathered. */
static void widen(fsdp_ctx *ctx, const mlp *m, int p, fsdp_dtype dtype, float *out) {
    const void *raw = fsdp_param_raw(ctx, m->param[p]);
    if (raw) fsdp_convert(out, FSDP_F32, raw, dtype, (size_t)param_numel[p]);
}

typedef struct step_state {
    float x[ROWS * IN], target[ROWS * OUT], x0[ROWS * IN], h[3][ROWS * H2], a[3][ROWS * H2];
    float w[NPARAMS][H2 * H1];                 /* the f32 weights seen in forward */
    unsigned char raw[NPARAMS][H2 * H1 * 4];   /* their gathered bytes */
    unsigned char *want[NUNITS];               /* the reference of each unit's gathered buffer */
} step_state;

static const int dims[4] = {IN, H1, H2, OUT};

/* Forward of test_mlp.h's model, checking each unit's weights against the reference. */
static int forward(fsdp_ctx *ctx, const mlp *m, const run_config *c, step_state *s, rank_result *r, int first) {
    size_t esize = fsdp_dtype_size(c->dtype);
    int l, p, rc;
    fsdp_param_info pi;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0) return rc;
    fsdp_param_info_get(ctx, m->param[P_SCALE], &pi);
    if (s->want[pi.unit])
        check_param(ctx, m, P_SCALE, s->want[pi.unit] + (size_t)pi.flat_offset * esize, esize, &r->checked, &r->mismatched);
    widen(ctx, m, P_SCALE, c->dtype, s->w[P_SCALE]);
    memcpy(s->raw[P_SCALE], fsdp_param_raw(ctx, m->param[P_SCALE]), (size_t)IN * esize);
    scale_forward(s->x0, s->x, s->w[P_SCALE], ROWS, IN);
    for (l = 0; l < 3; l++) {
        const float *in = l == 0 ? s->x0 : s->a[l - 1];
        if ((rc = fsdp_pre_forward(ctx, m->layer[l])) != 0) return rc;
        for (p = P_W0 + 2 * l; p <= P_B0 + 2 * l; p++) {
            fsdp_param_info_get(ctx, m->param[p], &pi);
            if (s->want[pi.unit])
                check_param(ctx, m, p, s->want[pi.unit] + (size_t)pi.flat_offset * esize, esize, &r->checked, &r->mismatched);
            widen(ctx, m, p, c->dtype, s->w[p]);
            memcpy(s->raw[p], fsdp_param_raw(ctx, m->param[p]), (size_t)param_numel[p] * esize);
            if (first) memcpy(r->first_forward + param_offset[p], s->w[p], sizeof(float) * (size_t)param_numel[p]);
        }
        linear_forward(s->h[l], in, s->w[P_W0 + 2 * l], s->w[P_B0 + 2 * l], ROWS, dims[l], dims[l + 1]);
        for (p = 0; p < ROWS * dims[l + 1]; p++) s->a[l][p] = l < 2 ? tanhf(s->h[l][p]) : s->h[l][p];
        if ((rc = fsdp_post_forward(ctx, m->layer[l])) != 0) return rc;
    }
    if (first) memcpy(r->first_forward, s->w[P_SCALE], sizeof(float) * IN);
    return fsdp_post_forward(ctx, 0);
}

/* Backward, checking that each unit's weights are forward's, bit for bit. */
static int backward(fsdp_ctx *ctx, const mlp *m, const run_config *c, step_state *s, rank_result *r, int world) {
    float dout[ROWS * H2], din[ROWS * H2];
    size_t esize = fsdp_dtype_size(c->dtype);
    int l, p, rc;
    for (p = 0; p < ROWS * OUT; p++) dout[p] = (s->a[2][p] - s->target[p]) / (float)(ROWS * world);
    if ((rc = fsdp_pre_backward(ctx, 0)) != 0) return rc;
    check_param(ctx, m, P_SCALE, s->raw[P_SCALE], esize, &r->bwd_checked, &r->bwd_mismatched);
    for (l = 2; l >= 0; l--) {
        const float *in = l == 0 ? s->x0 : s->a[l - 1];
        if (c->recompute) { /* a checkpointed region: gathered again (from the host shard under HOST) */
            if ((rc = fsdp_pre_forward(ctx, m->layer[l])) != 0) return rc;
            for (p = P_W0 + 2 * l; p <= P_B0 + 2 * l; p++)
                check_param(ctx, m, p, s->raw[p], esize, &r->bwd_checked, &r->bwd_mismatched);
            if ((rc = fsdp_post_forward(ctx, m->layer[l])) != 0) return rc;
        }
        if ((rc = fsdp_pre_backward(ctx, m->layer[l])) != 0) return rc;
        for (p = P_W0 + 2 * l; p <= P_B0 + 2 * l; p++) check_param(ctx, m, p, s->raw[p], esize, &r->bwd_checked, &r->bwd_mismatched);
        memset(din, 0, sizeof din);
        linear_backward(din, fsdp_grad(ctx, m->param[P_W0 + 2 * l]), fsdp_grad(ctx, m->param[P_B0 + 2 * l]), dout, in,
                        s->w[P_W0 + 2 * l], ROWS, dims[l], dims[l + 1]);
        if ((rc = fsdp_post_backward(ctx, m->layer[l])) != 0) return rc;
        for (p = 0; p < ROWS * dims[l]; p++) dout[p] = l > 0 ? din[p] * (1.0f - s->a[l - 1][p] * s->a[l - 1][p]) : din[p];
    }
    scale_backward(fsdp_grad(ctx, m->param[P_SCALE]), dout, s->x, ROWS, IN);
    return fsdp_post_backward(ctx, 0);
}

static void collect_line(void *user, const char *line) {
    rank_result *r = (rank_result *)user;
    r->printed_to_host |= strstr(line, "to host") != NULL;
    r->printed_wire |= strstr(line, " int8 ") != NULL || strstr(line, " int4 ") != NULL;
}

/* The unit facts and the memory the run used against the estimate. */
static void record_units(fsdp_ctx *ctx, fsdp_model *model, const fsdp_desc *d, rank_result *r) {
    fsdp_memory_stats st, est;
    int u;
    for (u = 0; u < NUNITS && u < fsdp_num_units(ctx); u++) {
        fsdp_unit_info ui;
        fsdp_unit_info_get(ctx, u, &ui);
        r->reshard_mode[u] = (int)ui.reshard_mode;
        r->host_numel[u] = ui.host_shard_numel;
        r->padded[u] = ui.padded_numel;
    }
    fsdp_memory_stats_get(ctx, &st);
    r->peak_unsharded = st.peak_unsharded_bytes;
    if (fsdp_memory_estimate(model, d, fsdp_comm_size(d->comm), &est) == 0) r->estimate_peak_unsharded = est.peak_unsharded_bytes;
    {
        fsdp_desc all = *d;
        all.reshard_after_forward = FSDP_RESHARD_ALL;
        if (fsdp_memory_estimate(model, &all, fsdp_comm_size(d->comm), &est) == 0)
            r->estimate_peak_as_all = est.peak_unsharded_bytes;
    }
    fsdp_print_units(ctx, collect_line, r);
}

static void describe(fsdp_desc *d, fsdp_comm *comm, const run_config *c) {
    memset(d, 0, sizeof *d);
    d->comm = comm;
    d->strategy = c->strategy;
    d->wrap.kind = FSDP_WRAP_TYPES;
    {
        static const char *const types[] = {"Linear", NULL};
        d->wrap.types = types;
    }
    d->param_dtype = c->dtype;
    d->forward_prefetch = 1;
    d->seed = 7;
    d->optimizer.kind = FSDP_ADAMW;
    d->optimizer.lr = 0.05f;
    d->param_wire = c->wire;
    d->wire_block = c->block;
    d->reshard_after_forward = c->reshard;
    d->shard_group_size = c->shard_group_size;
    d->fp32_compute_view = c->dtype != FSDP_F32; /* (filled by every kind of gather) */
    d->offload.params = c->offload_params;
    d->offload.dir = offload_dir;
    d->offload.allow_tmpfs = 1;
}

static int train(fsdp_comm *comm, const run_config *c, rank_result *r) {
    int rank = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), step, u, rc;
    step_state *s = (step_state *)calloc(1, sizeof *s);
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    mlp m;
    if (!s) return FSDP_ERR_OUT_OF_MEMORY;
    describe(&d, comm, c);
    if ((rc = mlp_build(&m)) == 0 && c->layer1_full_shard) rc = fsdp_model_set_strategy(m.model, m.layer[1], FSDP_FULL_SHARD);
    if (rc != 0 || (rc = fsdp_init(&ctx, m.model, &d)) != 0) {
        snprintf(r->message, sizeof r->message, "fsdp_init: %.300s", fsdp_last_error(NULL));
        fsdp_model_destroy(m.model);
        free(s);
        return rc;
    }
    for (step = 0; step < c->steps && !rc; step++) {
        for (u = 0; u < NUNITS && !rc; u++) {
            fsdp_unit_info ui;
            fsdp_unit_info_get(ctx, u, &ui);
            free(s->want[u]);
            s->want[u] = c->wire >= FSDP_WIRE_INT8 ? (unsigned char *)malloc((size_t)ui.padded_numel * 4 + 4) : NULL;
            if (s->want[u]) rc = expected_unit(ctx, &m, c, u, s->want[u]);
        }
        load_batch(step, rank * ROWS, rank * ROWS + ROWS, s->x, s->target);
        if (!rc) rc = forward(ctx, &m, c, s, r, step == 0);
        if (!rc) rc = backward(ctx, &m, c, s, r, world);
        if (!rc) rc = fsdp_step(ctx, 0.0f, NULL);
    }
    for (u = 0; u < NUNITS; u++) free(s->want[u]), s->want[u] = NULL;
    if (!rc) rc = forward(ctx, &m, c, s, r, 0); /* an evaluation: forward only, whose host shards are dropped */
    if (!rc) rc = fsdp_finish_backward(ctx);
    if (!rc) {
        fsdp_memory_stats st;
        fsdp_memory_stats_get(ctx, &st);
        r->live_after_eval = st.unsharded_bytes;
    }
    if (!rc) rc = gather_all(ctx, &m, r->final_master);
    if (!rc) record_units(ctx, m.model, &d, r);
    if (rc) snprintf(r->message, sizeof r->message, "rank %d: %.300s", rank, fsdp_last_error(ctx));
    for (u = 0; u < NUNITS; u++) free(s->want[u]);
    free(s);
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    return rc;
}

typedef struct world_arg {
    run_config config;
} world_arg;

static int rank_main(fsdp_comm *comm, void *arg) {
    rank_result *r = &results[fsdp_comm_rank(comm)];
    r->rc = train(comm, &((world_arg *)arg)->config, r);
    r->done = r->rc == 0;
    return 0;
}

/* Runs config on world ranks of one host (backend shm or socket); 0 or why in message. */
static int run_world(int world, fsdp_backend_kind backend, const run_config *c) {
    world_arg a;
    fsdp_launch_status st;
    int rc, r;
    a.config = *c;
    memset(results, 0, sizeof *results * MAX_RANKS);
    rc = launch_ranks(world, backend, TIMEOUT_MS, rank_main, &a, &st);
    for (r = 0; r < world && !rc; r++)
        if (!results[r].done) rc = results[r].rc ? results[r].rc : -1;
    if (rc) snprintf(message, sizeof message, "P=%d: launch %d: %.400s", world, rc,
                     r > 0 && results[r - 1].message[0] ? results[r - 1].message : "(no message)");
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
   name can be had. */
static void run_hosts(int world, const int *host_of, const run_config *c) {
    run_config config = *c;
    int r;
    memset(results, 0, sizeof *results * MAX_RANKS);
    if (run_on_hosts(world, host_of, "fsdp-wire-host", TIMEOUT_MS, host_rank_main, &config))
        TEST_IGNORE_MESSAGE("no UTS namespace here: cannot make hosts");
    for (r = 0; r < world; r++) {
        snprintf(message, sizeof message, "rank %d (host %d): %.400s", r, host_of[r],
                 results[r].message[0] ? results[r].message : "no message");
        TEST_ASSERT_TRUE_MESSAGE(results[r].done, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   tests
   --------------------------------------------------------------------------------------------- */
static run_config config(fsdp_strategy strategy, fsdp_dtype dtype, fsdp_wire wire, fsdp_reshard_mode reshard) {
    run_config c;
    memset(&c, 0, sizeof c);
    c.strategy = strategy;
    c.dtype = dtype;
    c.wire = wire;
    c.reshard = reshard;
    c.block = 8; /* several blocks per unit of test_mlp.h's small layers */
    c.steps = 3;
    return c;
}

static void assert_forward_weights_are_decoded_pieces(fsdp_wire wire) {
    static const fsdp_strategy strategies[3] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_HYBRID_SHARD};
    static const fsdp_dtype dtypes[2] = {FSDP_F32, FSDP_BF16};
    static const fsdp_backend_kind backends[2] = {FSDP_BACKEND_SHM, FSDP_BACKEND_SOCKET};
    int world, s, t, b, r;
    for (world = 1; world <= 4; world++)
        for (b = 0; b < 2; b++)
            for (s = 0; s < 3; s++)
                for (t = 0; t < 2; t++) {
                    run_config c = config(strategies[s], dtypes[t], wire, FSDP_RESHARD_DEFAULT);
                    char what[200];
                    if (strategies[s] == FSDP_HYBRID_SHARD && world == 4) c.shard_group_size = 2; /* replicas too */
                    snprintf(what, sizeof what, "P=%d %s %s %s %s", world, b ? "socket" : "shm",
                             fsdp_strategy_name(strategies[s]), fsdp_dtype_name(dtypes[t]), fsdp_wire_name(wire));
                    if (run_world(world, backends[b], &c) != 0) TEST_FAIL_MESSAGE(message);
                    for (r = 0; r < world; r++) {
                        snprintf(message, sizeof message, "%s rank %d: %d of %d parameters in forward differ from "
                                 "decode(encode(master shards))", what, r, results[r].mismatched, results[r].checked);
                        TEST_ASSERT_EQUAL_INT_MESSAGE(NPARAMS * c.steps, results[r].checked, message);
                        TEST_ASSERT_EQUAL_INT_MESSAGE(0, results[r].mismatched, message);
                        TEST_ASSERT_EQUAL_INT_MESSAGE(0, results[r].bwd_mismatched, message);
                    }
                }
}

static void test_wire_gather_int8_forward_weights_equal_decoded_master_shards_at_p_1_to_4(void) {
    assert_forward_weights_are_decoded_pieces(FSDP_WIRE_INT8);
}

static void test_wire_gather_int4_forward_weights_equal_decoded_master_shards_at_p_1_to_4(void) {
    assert_forward_weights_are_decoded_pieces(FSDP_WIRE_INT4);
}

static void test_wire_gather_int8_first_forward_weights_are_identical_at_every_world_size(void) {
    static float at_one[NELEM];
    int world, r, e;
    for (world = 1; world <= 4; world++) {
        run_config c = config(FSDP_FULL_SHARD, FSDP_BF16, FSDP_WIRE_INT8, FSDP_RESHARD_DEFAULT);
        c.steps = 1;
        if (run_world(world, FSDP_BACKEND_SHM, &c) != 0) TEST_FAIL_MESSAGE(message);
        if (world == 1) memcpy(at_one, results[0].first_forward, sizeof at_one);
        for (r = 0; r < world; r++) {
            for (e = 0; e < NELEM && bits_of(results[r].first_forward[e]) == bits_of(at_one[e]); e++) {}
            if (e < NELEM) {
                int index;
                const char *name = param_of_element(e, &index);
                snprintf(message, sizeof message, "P=%d rank %d: %s[%d] is %a, at P=1 %a", world, r, name, index,
                         (double)results[r].first_forward[e], (double)at_one[e]);
                TEST_FAIL_MESSAGE(message);
            }
        }
    }
}

/* The masters after training, rank 0's, into out. */
static void final_masters(float *out) { memcpy(out, results[0].final_master, sizeof(float) * NELEM); }

static void assert_same_bits(const float *want, const char *what) {
    int e, r = 0;
    for (e = 0; e < NELEM && bits_of(results[r].final_master[e]) == bits_of(want[e]); e++) {}
    if (e < NELEM) {
        int index;
        const char *name = param_of_element(e, &index);
        snprintf(message, sizeof message, "%s: %s[%d] is %a, want %a", what, name, index,
                 (double)results[r].final_master[e], (double)want[e]);
        TEST_FAIL_MESSAGE(message);
    }
}

static void test_wire_gather_int8_training_is_bitwise_run_to_run(void) {
    static float first[NELEM], plain[NELEM];
    fsdp_backend_kind backend;
    for (backend = FSDP_BACKEND_SHM; backend <= FSDP_BACKEND_SOCKET; backend = (fsdp_backend_kind)(backend + 1)) {
        run_config c = config(FSDP_FULL_SHARD, FSDP_BF16, FSDP_WIRE_INT8, FSDP_RESHARD_DEFAULT);
        c.steps = 4;
        if (run_world(3, backend, &c) != 0) TEST_FAIL_MESSAGE(message);
        final_masters(first);
        if (run_world(3, backend, &c) != 0) TEST_FAIL_MESSAGE(message);
        assert_same_bits(first, "int8 gather, second run");
        c.wire = FSDP_WIRE_DEFAULT; /* and the quantization does change what training sees */
        if (run_world(3, backend, &c) != 0) TEST_FAIL_MESSAGE(message);
        final_masters(plain);
        TEST_ASSERT_TRUE_MESSAGE(memcmp(plain, first, sizeof plain) != 0, "int8 and bf16 gathers trained the same bits");
    }
}

/* Trains base with reshard ALL, then HOST, on hosts host_of: backward (and recomputation) sees
   forward's weights, the bits are ALL's; the units resolve to want[u] (NULL: HOST but the root). */
static void assert_host_reshard_as(int world, const int *host_of, const run_config *base, const int *want) {
    static float without[NELEM];
    run_config c = *base;
    fsdp_wire wire = c.wire;
    int r, u, recompute = c.recompute;
    c.reshard = FSDP_RESHARD_ALL;
    run_hosts(world, host_of, &c);
    final_masters(without);
    c.reshard = FSDP_RESHARD_HOST;
    run_hosts(world, host_of, &c);
    for (r = 0; r < world; r++) {
        const rank_result *res = &results[r];
        int L = 0, p;
        for (p = 0; p < world; p++) L += host_of[p] == host_of[r];
        snprintf(message, sizeof message, "rank %d (host %d of %d ranks, %s): %d of %d parameters in backward differ "
                 "from forward's", r, host_of[r], L, fsdp_wire_name(wire), res->bwd_mismatched, res->bwd_checked);
        TEST_ASSERT_EQUAL_INT_MESSAGE((NPARAMS + 6 * recompute) * c.steps, res->bwd_checked, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, res->bwd_mismatched, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, res->mismatched, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_RESHARD_NONE, res->reshard_mode[0], "the root keeps its parameters");
        for (u = 1; u < NUNITS; u++) {
            int host = !want || want[u] == FSDP_RESHARD_HOST;
            TEST_ASSERT_EQUAL_INT_MESSAGE(host ? FSDP_RESHARD_HOST : want[u], res->reshard_mode[u], message);
            TEST_ASSERT_EQUAL_INT64_MESSAGE(host ? (res->padded[u] + L - 1) / L : 0, res->host_numel[u], message);
        }
        TEST_ASSERT_TRUE_MESSAGE(res->printed_to_host, "fsdp_print_units says \"to host\"");
        snprintf(message, sizeof message, "rank %d: peak unsharded %zu bytes, estimate %zu", r, res->peak_unsharded,
                 res->estimate_peak_unsharded);
        TEST_ASSERT_TRUE_MESSAGE(res->peak_unsharded <= res->estimate_peak_unsharded, message);
        TEST_ASSERT_EQUAL_size_t_MESSAGE(0, res->live_after_eval, "bytes still held after an evaluation pass");
        if (!want) { /* every unit but the root keeps a host shard from forward to backward: counted */
            size_t kept = 0;
            for (u = 1; u < NUNITS; u++) kept += (size_t)res->host_numel[u] * fsdp_dtype_size(c.dtype);
            snprintf(message, sizeof message, "rank %d: estimate with HOST %zu, with ALL %zu: the %zu bytes of host "
                     "shards are not all counted", r, res->estimate_peak_unsharded, res->estimate_peak_as_all, kept);
            TEST_ASSERT_TRUE_MESSAGE(res->estimate_peak_unsharded >= res->estimate_peak_as_all + kept, message);
        }
    }
    assert_same_bits(without, "HOST against ALL (the host reshard moves bytes, never values)");
}

static void assert_host_reshard(int world, const int *host_of, fsdp_wire wire, int recompute) {
    run_config c = config(FSDP_FULL_SHARD, FSDP_BF16, wire, FSDP_RESHARD_ALL);
    c.recompute = recompute;
    assert_host_reshard_as(world, host_of, &c, NULL);
}

static void test_wire_gather_host_reshard_on_2_hosts_of_2_keeps_forward_weights_and_training_bits(void) {
    static const int host_of[4] = {0, 0, 1, 1};
    assert_host_reshard(4, host_of, FSDP_WIRE_DEFAULT, 0);
}

static void test_wire_gather_host_reshard_on_hosts_of_2_1_and_3_keeps_forward_weights_and_training_bits(void) {
    static const int host_of[6] = {0, 0, 1, 2, 2, 2};
    assert_host_reshard(6, host_of, FSDP_WIRE_DEFAULT, 0);
}

static void test_wire_gather_host_reshard_with_int8_gives_backward_the_decoded_forward_weights(void) {
    static const int host_of[6] = {0, 0, 1, 2, 2, 2};
    assert_host_reshard(6, host_of, FSDP_WIRE_INT8, 0);
    TEST_ASSERT_TRUE_MESSAGE(results[0].printed_wire, "fsdp_print_units names the wire");
}

static void test_wire_gather_host_reshard_with_recomputation_gives_it_and_backward_the_forward_weights(void) {
    static const int host_of[4] = {0, 0, 1, 1};
    assert_host_reshard(4, host_of, FSDP_WIRE_INT8, 1);
}

static void test_wire_gather_host_reshard_skips_hybrid_units_inside_a_host_and_keeps_a_full_shard_one(void) {
    static const int host_of[4] = {0, 0, 1, 1};
    static const int want[NUNITS] = {FSDP_RESHARD_NONE, FSDP_RESHARD_ALL, FSDP_RESHARD_HOST, FSDP_RESHARD_ALL};
    run_config c = config(FSDP_HYBRID_SHARD, FSDP_BF16, FSDP_WIRE_INT8, FSDP_RESHARD_ALL);
    c.layer1_full_shard = 1; /* its host gathers go over HYBRID's shard comm: the host */
    assert_host_reshard_as(4, host_of, &c, want);
}

static void test_wire_gather_int8_with_masters_on_disk_trains_the_bits_of_masters_in_ram(void) {
    static float in_ram[NELEM];
    run_config c = config(FSDP_FULL_SHARD, FSDP_BF16, FSDP_WIRE_INT8, FSDP_RESHARD_DEFAULT);
    int r;
    if (run_world(2, FSDP_BACKEND_SHM, &c) != 0) TEST_FAIL_MESSAGE(message);
    final_masters(in_ram);
    c.offload_params = 1;
    if (run_world(2, FSDP_BACKEND_SHM, &c) != 0) TEST_FAIL_MESSAGE(message);
    for (r = 0; r < 2; r++) {
        snprintf(message, sizeof message, "offload rank %d: %d of %d parameters in forward differ from "
                 "decode(encode(master shards))", r, results[r].mismatched, results[r].checked);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, results[r].mismatched, message);
    }
    assert_same_bits(in_ram, "int8 gather with the masters on disk against in RAM");
}

/* --- refusals --------------------------------------------------------------------------------- */
static char logged[2000];
static void capture_log(void *user, fsdp_log_level level, const char *text) {
    (void)user;
    (void)level;
    append_text(logged, sizeof logged, text);
    append_text(logged, sizeof logged, "\n");
}

/* fsdp_init on one rank with the description and the model's settings adjusted by edit: its result
   (and the resolved reshard mode of unit 2, layers.1). */
static int init_one(void (*edit)(fsdp_desc *, mlp *), int *mode_of_unit_2) {
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    run_config c = config(FSDP_FULL_SHARD, FSDP_F32, FSDP_WIRE_DEFAULT, FSDP_RESHARD_DEFAULT);
    mlp m;
    int rc;
    logged[0] = 0;
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm, "wire-refusal"));
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    describe(&d, comm, &c);
    d.logger.fn = capture_log;
    d.logger.max_level = FSDP_LOG_INFO;
    edit(&d, &m);
    rc = fsdp_init(&ctx, m.model, &d);
    if (mode_of_unit_2 && !rc) {
        fsdp_unit_info ui;
        fsdp_unit_info_get(ctx, 2, &ui);
        *mode_of_unit_2 = (int)ui.reshard_mode;
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    fsdp_comm_destroy(comm);
    return rc;
}

static void edit_grad_wire(fsdp_desc *d, mlp *m) { (void)m; d->grad_wire = FSDP_WIRE_INT8; }
static void edit_unit_grad_wire(fsdp_desc *d, mlp *m) {
    (void)d;
    fsdp_model_set_wire(m->model, m->layer[1], FSDP_WIRE_DEFAULT, FSDP_WIRE_INT4);
}
static void edit_float_wire(fsdp_desc *d, mlp *m) { (void)m; d->param_wire = FSDP_WIRE_BF16; }
static void edit_unit_float_wire(fsdp_desc *d, mlp *m) {
    (void)d;
    fsdp_model_set_wire(m->model, m->layer[1], FSDP_WIRE_F16, FSDP_WIRE_DEFAULT);
}
static void edit_block(fsdp_desc *d, mlp *m) { (void)m; d->param_wire = FSDP_WIRE_INT8; d->wire_block = 12; }
static void edit_unit_host(fsdp_desc *d, mlp *m) {
    (void)d;
    fsdp_model_set_reshard_after_forward(m->model, m->layer[1], FSDP_RESHARD_HOST);
}

static void test_wire_gather_grad_wire_on_one_host_is_ignored_with_a_message_naming_the_unit(void) {
    TEST_ASSERT_EQUAL_INT(0, init_one(edit_grad_wire, NULL));
    assert_says(logged, "unit 'layers.0': grad_wire ignored (its reduction lies inside one host)");
    TEST_ASSERT_EQUAL_INT(0, init_one(edit_unit_grad_wire, NULL));
    assert_says(logged, "unit 'layers.1': grad_wire ignored");
}

static void test_wire_gather_float_param_wire_other_than_param_dtype_is_refused_naming_the_unit(void) {
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, init_one(edit_float_wire, NULL));
    assert_says(fsdp_last_error(NULL), "param_wire bf16 differs from param_dtype f32");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, init_one(edit_unit_float_wire, NULL));
    assert_says(fsdp_last_error(NULL), "unit 'layers.1': param_wire f16 differs from param_dtype f32");
}

static void test_wire_gather_invalid_wire_block_is_refused_naming_it(void) {
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, init_one(edit_block, NULL));
    assert_says(fsdp_last_error(NULL), "wire_block 12");
}

static void test_wire_gather_host_reshard_on_one_host_is_ignored_with_a_message_naming_the_unit(void) {
    int mode = -1;
    TEST_ASSERT_EQUAL_INT(0, init_one(edit_unit_host, &mode));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_RESHARD_ALL, mode, "HOST on one host reshards as ALL");
    assert_says(logged, "unit 'layers.1': reshard_after_forward HOST ignored");
}

static void test_wire_gather_setters_refuse_values_out_of_range(void) {
    mlp m;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_set_reshard_after_forward(m.model, 1, (fsdp_reshard_mode)4));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_set_wire(m.model, 1, (fsdp_wire)6, FSDP_WIRE_DEFAULT));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_set_wire(m.model, 99, FSDP_WIRE_INT8, FSDP_WIRE_DEFAULT));
    fsdp_model_destroy(m.model);
}

int main(void) {
    int failures;
    results = (rank_result *)map_shared(sizeof *results * MAX_RANKS);
    if (make_temp_dir(offload_dir, sizeof offload_dir, "test_wire_gather") != 0) {
        perror("mkdtemp");
        return 1;
    }
    UNITY_BEGIN();
    RUN_TEST(test_wire_gather_grad_wire_on_one_host_is_ignored_with_a_message_naming_the_unit);
    RUN_TEST(test_wire_gather_float_param_wire_other_than_param_dtype_is_refused_naming_the_unit);
    RUN_TEST(test_wire_gather_invalid_wire_block_is_refused_naming_it);
    RUN_TEST(test_wire_gather_host_reshard_on_one_host_is_ignored_with_a_message_naming_the_unit);
    RUN_TEST(test_wire_gather_setters_refuse_values_out_of_range);
    RUN_TEST(test_wire_gather_int8_forward_weights_equal_decoded_master_shards_at_p_1_to_4);
    RUN_TEST(test_wire_gather_int4_forward_weights_equal_decoded_master_shards_at_p_1_to_4);
    RUN_TEST(test_wire_gather_int8_first_forward_weights_are_identical_at_every_world_size);
    RUN_TEST(test_wire_gather_int8_training_is_bitwise_run_to_run);
    RUN_TEST(test_wire_gather_host_reshard_on_2_hosts_of_2_keeps_forward_weights_and_training_bits);
    RUN_TEST(test_wire_gather_host_reshard_on_hosts_of_2_1_and_3_keeps_forward_weights_and_training_bits);
    RUN_TEST(test_wire_gather_host_reshard_with_int8_gives_backward_the_decoded_forward_weights);
    RUN_TEST(test_wire_gather_host_reshard_with_recomputation_gives_it_and_backward_the_forward_weights);
    RUN_TEST(test_wire_gather_host_reshard_skips_hybrid_units_inside_a_host_and_keeps_a_full_shard_one);
    RUN_TEST(test_wire_gather_int8_with_masters_on_disk_trains_the_bits_of_masters_in_ram);
    failures = UNITY_END();
    remove_tree(offload_dir);
    return failures;
}
