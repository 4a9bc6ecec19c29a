/* test_runtime_errors.c - specification of how the FSDP runtime is configured and how it fails:
   wrap policies give the documented units; invalid model calls and invalid fsdp_desc values are
   rejected with FSDP_ERR_INVALID_ARG and a message naming the field; hooks called out of order
   return FSDP_ERR_STATE naming the unit; ranks that run units in different orders get an error on
   every rank, bounded in time, not a hang; destroying a context mid-iteration leaves the
   communicator usable. The numerics are specified in test_runtime.c.

   Single-rank tests run in this process on a communicator of one rank (created in the test,
   destroyed in tearDown). Multi-rank tests fork ranks with fsdp_launch_ex; the ranks write what
   happened into a MAP_SHARED region the parent mapped before the launch, and only the parent
   asserts.

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_runtime_errors.c tests/unity/unity.c -o /tmp/trt_errors -lpthread -lm */
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
#define ORDER_TIMEOUT_MS 2000  /* the communicators' bound on any wait in the order tests */
#define MARGIN_MS 1000         /* allowed on top of it before we call it a hang */
#define LAUNCH_TIMEOUT_MS 20000

static char message[1024];

/* ---------------------------------------------------------------------------------------------
   fixtures: a small model (root scale + three Linear units) and a one-rank communicator
   --------------------------------------------------------------------------------------------- */
typedef struct small_model {
    fsdp_model *model;
    int layers;      /* "layers", a ModuleList: not a unit under TYPES {"Linear"} */
    int layer[3];    /* "layers.0" .. "layers.2" */
    int weight[3], bias[3], scale;
} small_model;

static int small_build(small_model *m) {
    fsdp_init_rule rule = {FSDP_INIT_UNIFORM, -0.5f, 0.5f, NULL, NULL};
    int64_t shape_scale[1] = {5}, shape_w[3][2] = {{7, 5}, {6, 7}, {3, 6}}, shape_b[3][1] = {{7}, {6}, {3}};
    static const char *const names[3] = {"0", "1", "2"};
    int l, rc;
    memset(m, 0, sizeof *m);
    if ((rc = fsdp_model_create(&m->model, "MLP")) != 0) return rc;
    if ((m->scale = fsdp_model_param(m->model, 0, "scale", 1, shape_scale, rule)) < 0) return m->scale;
    if ((m->layers = fsdp_model_module(m->model, 0, "layers", "ModuleList")) < 0) return m->layers;
    for (l = 0; l < 3; l++) {
        if ((m->layer[l] = fsdp_model_module(m->model, m->layers, names[l], "Linear")) < 0) return m->layer[l];
        if ((m->weight[l] = fsdp_model_param(m->model, m->layer[l], "weight", 2, shape_w[l], rule)) < 0) return m->weight[l];
        if ((m->bias[l] = fsdp_model_param(m->model, m->layer[l], "bias", 1, shape_b[l], rule)) < 0) return m->bias[l];
    }
    return 0;
}

static const char *const linear_types[] = {"Linear", NULL};

static fsdp_desc small_desc(fsdp_comm *comm, fsdp_strategy strategy) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = strategy;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = linear_types;
    d.optimizer.kind = FSDP_SGD;
    d.optimizer.lr = 0.1f;
    return d;
}

/* In-process objects of the single-rank tests; tearDown releases whatever a test left. */
static fsdp_comm *comm1;
static fsdp_ctx *ctx;
static small_model net;

void setUp(void) {}

void tearDown(void) {
    release_one_rank(&ctx, &net.model, &comm1);
    memset(&net, 0, sizeof net);
}

static fsdp_comm *one_rank_comm(void) {
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, open_one_rank_comm(&comm1, "test-runtime-errors"), "fsdp_comm_init (one rank)");
    return comm1;
}

/* A one-rank context over `net` (FULL_SHARD, units root and layers.0..2). */
static void start_one_rank(fsdp_strategy strategy) {
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT(0, small_build(&net));
    d = small_desc(one_rank_comm(), strategy);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
}

static void assert_error_names(const char *what, const char *expected_word) {
    snprintf(message, sizeof message, "the message should name '%s': \"%s\"", expected_word, what ? what : "(null)");
    TEST_ASSERT_NOT_NULL_MESSAGE(what, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(what, expected_word), message);
}

/* ---------------------------------------------------------------------------------------------
   hooks called out of order
   --------------------------------------------------------------------------------------------- */
static void test_hook_post_forward_without_pre_forward_returns_state_error_naming_the_unit(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_post_forward(ctx, net.layer[1]));
    assert_error_names(fsdp_last_error(ctx), "layers.1");
}

static void test_hook_pre_backward_before_forward_ran_returns_state_error_naming_the_unit(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_pre_backward(ctx, net.layer[2]));
    assert_error_names(fsdp_last_error(ctx), "layers.2");
}

static void test_hook_post_backward_without_pre_backward_returns_state_error_naming_the_unit(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[0]));
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, net.layer[0]));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_post_backward(ctx, net.layer[0]));
    assert_error_names(fsdp_last_error(ctx), "layers.0");
}

/* A unit's forward runs once per iteration; nested calls on modules of one unit are counted
   (next test), a second forward after its post_forward is an error. */
static void test_hook_pre_forward_twice_in_one_iteration_returns_state_error_naming_the_unit(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[1]));
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, net.layer[1]));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_pre_forward(ctx, net.layer[1]));
    assert_error_names(fsdp_last_error(ctx), "layers.1");
}

static void test_hook_on_module_inside_a_unit_is_reference_counted_with_its_unit(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layers)); /* owned by the root unit */
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, net.layers));
    TEST_ASSERT_NOT_NULL_MESSAGE(fsdp_param(ctx, net.scale), "the root is still in its forward");
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_post_forward(ctx, 0)); /* one more than were opened */
}

static void test_hook_on_module_that_does_not_exist_returns_invalid_arg(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_pre_forward(ctx, 99));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_pre_forward(ctx, -1));
    assert_error_names(fsdp_last_error(ctx), "module");
}

static void test_step_after_unit_ran_forward_but_not_backward_returns_state_error_naming_the_unit(void) {
    int l;
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    for (l = 0; l < 3; l++) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, net.layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(ctx, 0));
    for (l = 2; l >= 1; l--) { /* layers.0 never runs backward */
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(ctx, net.layer[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(ctx, net.layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_step(ctx, 0, NULL));
    assert_error_names(fsdp_last_error(ctx), "layers.0");
}

static void forward_pass(void) {
    int l;
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    for (l = 0; l < 3; l++) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[l]));
        TEST_ASSERT_NOT_NULL(fsdp_param(ctx, net.weight[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, net.layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, 0));
}

/* Evaluation: forward passes without backward, each ended by fsdp_finish_backward. */
static void test_forward_only_pass_ended_by_finish_backward_allows_another_forward(void) {
    fsdp_memory_stats st;
    start_one_rank(FSDP_SHARD_GRAD_OP); /* keeps units gathered after forward: they must be released */
    forward_pass();
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_finish_backward(ctx), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT(0, fsdp_memory_stats_get(ctx, &st));
    TEST_ASSERT_EQUAL_UINT64(0, (uint64_t)st.unsharded_bytes);
    forward_pass();
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_finish_backward(ctx), fsdp_last_error(ctx));
}

static void test_second_forward_without_ending_the_first_returns_state_error_that_says_what_to_do(void) {
    start_one_rank(FSDP_FULL_SHARD);
    forward_pass();
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_pre_forward(ctx, 0));
    assert_error_names(fsdp_last_error(ctx), "fsdp_finish_backward");
}

/* ---------------------------------------------------------------------------------------------
   setting parameters from outside: a full tensor from rank 0, or each rank's own slice
   --------------------------------------------------------------------------------------------- */
typedef struct set_report {
    int rc;
    char error[600];
} set_report;

static set_report *set_reports; /* MAP_SHARED [MAX_WORLD] */

static float full_value(int64_t i) { return 0.25f * (float)i - 3.0f; }
static float slice_value(int rank, int64_t i) { return (float)(100 * (rank + 1)) + (float)i; }

/* Every parameter set with fsdp_set_param_full (rank 0's values) or fsdp_set_param_shard (each
   rank its slice); gathering them back must give exactly those values on every rank. */
static int set_params_rank(fsdp_comm *comm, void *arg) {
    set_report *r = &set_reports[fsdp_comm_rank(comm)];
    int use_shard = *(const int *)arg, me = fsdp_comm_rank(comm), p, P = fsdp_comm_size(comm), q;
    small_model m;
    fsdp_ctx *c = NULL;
    fsdp_desc d;
    float buf[64], got[64];
    if (small_build(&m) != 0) return 2;
    d = small_desc(comm, FSDP_FULL_SHARD);
    if ((r->rc = fsdp_init(&c, m.model, &d)) != 0) { snprintf(r->error, sizeof r->error, "fsdp_init: %s", fsdp_last_error(NULL)); return 3; }
    for (p = 0; p < fsdp_model_num_params(m.model); p++) {
        fsdp_param_info info;
        int64_t i, n = fsdp_model_param_numel(m.model, p);
        fsdp_param_info_get(c, p, &info);
        if (use_shard) {
            for (i = info.shard_begin; i < info.shard_end; i++) buf[i - info.shard_begin] = slice_value(me, i);
            r->rc = fsdp_set_param_shard(c, p, buf);
        } else {
            for (i = 0; i < n; i++) buf[i] = full_value(i);
            r->rc = fsdp_set_param_full(c, p, me == 0 ? buf : NULL);
        }
        if (r->rc) { snprintf(r->error, sizeof r->error, "set %s: %s", fsdp_model_param_name(m.model, p), fsdp_last_error(c)); return 4; }
    }
    for (p = 0; p < fsdp_model_num_params(m.model); p++) {
        int64_t i, n = fsdp_model_param_numel(m.model, p);
        if ((r->rc = fsdp_gather_param(c, p, got)) != 0) { snprintf(r->error, sizeof r->error, "gather: %s", fsdp_last_error(c)); return 5; }
        for (i = 0; i < n; i++) {
            float want = full_value(i);
            if (use_shard) { /* the rank whose slice holds element i set it */
                for (q = 0; q < P; q++) {
                    fsdp_param_info info; /* ranges are the same function of the rank on every rank */
                    int64_t lo, hi, S;
                    fsdp_unit_info u;
                    fsdp_param_info_get(c, p, &info);
                    fsdp_unit_info_get(c, info.unit, &u);
                    S = u.shard_numel;
                    lo = q * S - info.flat_offset;
                    hi = lo + S;
                    if (i >= lo && i < hi) want = slice_value(q, i);
                }
            }
            if (got[i] != want) {
                snprintf(r->error, sizeof r->error, "%s[%lld] is %g, expected %g", fsdp_model_param_name(m.model, p),
                         (long long)i, (double)got[i], (double)want);
                r->rc = -1;
                return 6;
            }
        }
    }
    fsdp_destroy(c);
    fsdp_model_destroy(m.model);
    return 0;
}

static void assert_set_params(int use_shard) {
    fsdp_launch_status st;
    int P, r;
    set_reports = (set_report *)mmap(NULL, sizeof *set_reports * MAX_WORLD, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TEST_ASSERT_TRUE(set_reports != MAP_FAILED);
    for (P = 1; P <= 3; P++) {
        memset(set_reports, 0, sizeof *set_reports * MAX_WORLD);
        r = launch_ranks(P, FSDP_BACKEND_SHM, 10000, set_params_rank, &use_shard, &st);
        snprintf(message, sizeof message, "P=%d: %s | rank 0: %s", P, st.message, set_reports[0].error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r, message);
    }
    munmap(set_reports, sizeof *set_reports * MAX_WORLD);
}

static void test_set_param_full_from_rank0_reaches_every_rank_exactly(void) { assert_set_params(0); }
static void test_set_param_shard_sets_exactly_this_ranks_slice(void) { assert_set_params(1); }

static void test_set_param_during_an_iteration_returns_state_error(void) {
    float values[35] = {0};
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_set_param_full(ctx, net.weight[0], values));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_set_param_shard(ctx, net.weight[0], values));
}

static int units_lines;
static int units_named;
static void count_unit_line(void *user, const char *line) {
    (void)user;
    units_lines++;
    if (strstr(line, "layers.1") && strstr(line, "FULL_SHARD")) units_named++;
}

static void test_print_units_lists_a_header_and_every_unit(void) {
    start_one_rank(FSDP_FULL_SHARD);
    units_lines = units_named = 0;
    fsdp_print_units(ctx, count_unit_line, NULL);
    TEST_ASSERT_EQUAL_INT(1 + fsdp_num_units(ctx) + 1, units_lines); /* and the optimizer's line */
    TEST_ASSERT_EQUAL_INT(1, units_named);
}

static void test_step_while_no_sync_holds_unreduced_gradients_returns_state_error(void) {
    int l;
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_set_no_sync(ctx, 1));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    for (l = 0; l < 3; l++) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, net.layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(ctx, 0));
    for (l = 2; l >= 0; l--) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(ctx, net.layer[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(ctx, net.layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_step(ctx, 0, NULL));
    assert_error_names(fsdp_last_error(ctx), "no_sync");
}

/* ---------------------------------------------------------------------------------------------
   ranks that run the units in different orders (P = 2, short timeouts)
   --------------------------------------------------------------------------------------------- */
typedef struct order_report {
    int done;
    int rc;                 /* the first failure */
    char where[48];         /* which call returned it */
    char error[600];        /* fsdp_last_error */
    double elapsed_ms;      /* from the first hook to that failure */
} order_report;

static order_report *order_reports; /* MAP_SHARED [MAX_WORLD] */

typedef struct order_job {
    fsdp_strategy strategy;
    int swap_backward;      /* rank 1 also runs backward in its own (swapped) order */
} order_job;

#define ORDER_CALL(call, name)                                                \
    do {                                                                      \
        if (rc == 0 && (rc = (call)) != 0) snprintf(r->where, sizeof r->where, "%s", name); \
    } while (0)

/* Rank 0 runs root, layers.0, layers.1, layers.2; rank 1 swaps layers.1 and layers.2. */
static int order_rank(fsdp_comm *comm, void *arg) {
    const order_job *job = (const order_job *)arg;
    int rank = fsdp_comm_rank(comm), rc = 0, i;
    order_report *r = &order_reports[rank];
    int fwd[3] = {0, 1, 2}, bwd[3] = {2, 1, 0};
    small_model m;
    fsdp_ctx *c = NULL;
    fsdp_desc d;
    double start;
    if (rank == 1) {
        fwd[1] = 2;
        fwd[2] = 1;
        if (job->swap_backward) {
            bwd[0] = 1;
            bwd[1] = 2;
        }
    }
    if (small_build(&m) != 0) return 2;
    d = small_desc(comm, job->strategy);
    d.forward_prefetch = 0;
    d.backward_prefetch = FSDP_BACKWARD_PREFETCH_NONE;
    if ((rc = fsdp_init(&c, m.model, &d)) != 0) {
        r->rc = rc;
        snprintf(r->where, sizeof r->where, "fsdp_init");
        snprintf(r->error, sizeof r->error, "%s", fsdp_last_error(NULL));
        fsdp_model_destroy(m.model);
        return 0;
    }
    start = fsdp_now();
    ORDER_CALL(fsdp_pre_forward(c, 0), "pre_forward(root)");
    for (i = 0; i < 3; i++) {
        ORDER_CALL(fsdp_pre_forward(c, m.layer[fwd[i]]), "pre_forward");
        ORDER_CALL(fsdp_post_forward(c, m.layer[fwd[i]]), "post_forward");
    }
    ORDER_CALL(fsdp_post_forward(c, 0), "post_forward(root)");
    ORDER_CALL(fsdp_pre_backward(c, 0), "pre_backward(root)");
    for (i = 0; i < 3; i++) {
        ORDER_CALL(fsdp_pre_backward(c, m.layer[bwd[i]]), "pre_backward");
        ORDER_CALL(fsdp_post_backward(c, m.layer[bwd[i]]), "post_backward");
    }
    ORDER_CALL(fsdp_post_backward(c, 0), "post_backward(root)");
    ORDER_CALL(fsdp_step(c, 0, NULL), "fsdp_step");
    r->elapsed_ms = (fsdp_now() - start) * 1000.0;
    r->rc = rc;
    snprintf(r->error, sizeof r->error, "%s", fsdp_last_error(c));
    r->done = 1;
    fsdp_destroy(c);
    fsdp_model_destroy(m.model);
    return 0;
}

static void assert_order_mismatch_detected(fsdp_strategy strategy, int swap_backward) {
    fsdp_launch_status status;
    order_job job;
    double start;
    int rc, rank;
    memset(order_reports, 0, sizeof(order_report) * MAX_WORLD);
    job.strategy = strategy;
    job.swap_backward = swap_backward;
    start = fsdp_now();
    rc = launch_ranks(2, FSDP_BACKEND_SHM, ORDER_TIMEOUT_MS, order_rank, &job, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    snprintf(message, sizeof message, "the launch took %.0f ms", (fsdp_now() - start) * 1000.0);
    TEST_ASSERT_TRUE_MESSAGE((fsdp_now() - start) * 1000.0 < ORDER_TIMEOUT_MS + MARGIN_MS, message);
    for (rank = 0; rank < 2; rank++) {
        const order_report *r = &order_reports[rank];
        snprintf(message, sizeof message, "rank %d: %s returned %s after %.0f ms: %s", rank, r->where,
                 fsdp_result_name(r->rc), r->elapsed_ms, r->error);
        TEST_ASSERT_TRUE_MESSAGE(r->done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_MISMATCH, r->rc, message);
        TEST_ASSERT_TRUE_MESSAGE(strstr(r->error, "mismatch") || strstr(r->error, "order"), message);
        TEST_ASSERT_TRUE_MESSAGE(r->elapsed_ms < ORDER_TIMEOUT_MS + MARGIN_MS, message);
    }
}

/* FULL_SHARD gathers each unit as it starts: the ranks' gathers disagree at once. */
static void test_order_rank_with_different_forward_order_gets_mismatch_on_every_rank_within_timeout(void) {
    assert_order_mismatch_detected(FSDP_FULL_SHARD, 1);
}

/* NO_SHARD in f32 has no collective in forward and the backward orders agree here: only the
   comparison of the recorded orders at the end of the first iteration can catch it. */
static void test_order_rank_with_different_forward_order_and_no_collectives_gets_mismatch_at_step(void) {
    assert_order_mismatch_detected(FSDP_NO_SHARD, 0);
}

/* ---------------------------------------------------------------------------------------------
   destroying a context in the middle of an iteration
   --------------------------------------------------------------------------------------------- */
typedef struct destroy_report {
    int done, rounds, rc;
    float sum;
    char error[600];
} destroy_report;

static destroy_report *destroy_reports; /* MAP_SHARED [MAX_WORLD] */

#define DESTROY_ROUNDS 20 /* whether a reduction is still queued at destroy is a matter of timing */

/* Each round: a full training step (the order becomes known), then a forward and backward whose
   reductions are still queued when the context is destroyed; then an all_reduce on the comm. */
static int destroy_rank(fsdp_comm *comm, void *arg) {
    destroy_report *r = &destroy_reports[fsdp_comm_rank(comm)];
    int round, l, it, rc = 0;
    (void)arg;
    for (round = 0; round < DESTROY_ROUNDS && rc == 0; round++) {
        small_model m;
        fsdp_ctx *c = NULL;
        fsdp_desc d;
        float one = 1.0f, sum = 0.0f;
        r->rounds = round + 1;
        if (small_build(&m) != 0) return 2;
        d = small_desc(comm, FSDP_FULL_SHARD);
        if ((rc = fsdp_init(&c, m.model, &d)) != 0) {
            snprintf(r->error, sizeof r->error, "fsdp_init: %s", fsdp_last_error(NULL));
        }
        for (it = 0; it < 2 && rc == 0; it++) {
            if (rc == 0) rc = fsdp_pre_forward(c, 0);
            for (l = 0; l < 3 && rc == 0; l++)
                if ((rc = fsdp_pre_forward(c, m.layer[l])) == 0) rc = fsdp_post_forward(c, m.layer[l]);
            if (rc == 0) rc = fsdp_post_forward(c, 0);
            if (rc == 0) rc = fsdp_pre_backward(c, 0);
            for (l = 2; l >= 0 && rc == 0; l--)
                if ((rc = fsdp_pre_backward(c, m.layer[l])) == 0) rc = fsdp_post_backward(c, m.layer[l]);
            if (rc == 0) rc = fsdp_post_backward(c, 0);
            if (rc == 0 && it == 0) rc = fsdp_step(c, 0, NULL);
            if (rc) snprintf(r->error, sizeof r->error, "training: %s", fsdp_last_error(c));
        }
        fsdp_destroy(c); /* mid-iteration: the last backward's reductions were never waited for */
        fsdp_model_destroy(m.model);
        if (rc == 0 && (rc = fsdp_all_reduce(comm, &one, &sum, 1, FSDP_F32, FSDP_SUM)) != 0)
            snprintf(r->error, sizeof r->error, "all_reduce after fsdp_destroy (round %d): %s", round + 1,
                     fsdp_comm_last_error(comm));
        r->sum = sum;
    }
    r->rc = rc;
    r->done = 1;
    return 0;
}

static void test_destroy_in_the_middle_of_an_iteration_leaves_the_communicator_usable_on_every_rank(void) {
    fsdp_launch_status status;
    int rc, rank;
    memset(destroy_reports, 0, sizeof(destroy_report) * MAX_WORLD);
    rc = launch_ranks(2, FSDP_BACKEND_SHM, ORDER_TIMEOUT_MS, destroy_rank, NULL, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    for (rank = 0; rank < 2; rank++) {
        const destroy_report *r = &destroy_reports[rank];
        snprintf(message, sizeof message, "rank %d, round %d of %d: %s: %s", rank, r->rounds, DESTROY_ROUNDS,
                 fsdp_result_name(r->rc), r->error);
        TEST_ASSERT_TRUE_MESSAGE(r->done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r->rc, message);
        TEST_ASSERT_TRUE_MESSAGE(r->sum == 2.0f, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   invalid configurations: fsdp_init returns FSDP_ERR_INVALID_ARG, *out NULL, and a message
   (fsdp_last_error(NULL)) naming the field
   --------------------------------------------------------------------------------------------- */
static fsdp_desc valid_desc(void) {
    TEST_ASSERT_EQUAL_INT(0, small_build(&net));
    return small_desc(one_rank_comm(), FSDP_FULL_SHARD);
}

static void assert_init_rejected(const fsdp_desc *d, const char *field) {
    fsdp_ctx *out = (fsdp_ctx *)&out; /* not NULL: fsdp_init must clear it */
    int rc = fsdp_init(&out, net.model, d);
    if (rc == FSDP_SUCCESS) ctx = out; /* released by tearDown */
    snprintf(message, sizeof message, "fsdp_init returned %s: %s", fsdp_result_name(rc), fsdp_last_error(NULL));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    TEST_ASSERT_NULL_MESSAGE(out, "*out must be NULL after a failed fsdp_init");
    assert_error_names(fsdp_last_error(NULL), field);
}

static void test_init_with_valid_desc_succeeds(void) { /* the control for the tests below */
    fsdp_desc d = valid_desc();
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
    TEST_ASSERT_EQUAL_INT(4, fsdp_num_units(ctx));
}

static void test_init_with_invalid_param_dtype_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.param_dtype = (fsdp_dtype)7;
    assert_init_rejected(&d, "param_dtype");
}

static void test_init_with_invalid_reduce_dtype_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.reduce_dtype = (fsdp_dtype)9;
    assert_init_rejected(&d, "reduce_dtype");
}

/* lr 0 selects the default (1e-3), so the invalid values are negative or not finite. */
static void test_init_with_negative_lr_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.lr = -0.1f;
    assert_init_rejected(&d, "lr");
}

static void test_init_with_nan_lr_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.lr = NAN;
    assert_init_rejected(&d, "lr");
}

static void test_init_with_momentum_of_one_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.momentum = 1.0f;
    assert_init_rejected(&d, "momentum");
}

static void test_init_with_nesterov_without_momentum_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.nesterov = 1;
    assert_init_rejected(&d, "nesterov");
}

static void test_init_with_adam_beta1_of_one_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.kind = FSDP_ADAM;
    d.optimizer.beta1 = 1.0f;
    assert_init_rejected(&d, "betas");
}

static void test_init_with_negative_weight_decay_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.weight_decay = -0.01f;
    assert_init_rejected(&d, "weight_decay");
}

static void test_init_with_unknown_optimizer_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.optimizer.kind = (fsdp_optimizer_kind)7;
    assert_init_rejected(&d, "optimizer");
}

static void test_init_with_unknown_strategy_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.strategy = (fsdp_strategy)9;
    assert_init_rejected(&d, "strategy");
}

static void test_init_with_unknown_backward_prefetch_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.backward_prefetch = (fsdp_backward_prefetch)8;
    assert_init_rejected(&d, "backward_prefetch");
}

static void test_init_with_size_policy_and_zero_min_params_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.wrap.kind = FSDP_WRAP_SIZE;
    d.wrap.min_params = 0;
    assert_init_rejected(&d, "min_params");
}

static void test_init_with_types_policy_without_types_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.wrap.types = NULL;
    assert_init_rejected(&d, "TYPES");
}

static void test_init_with_predicate_policy_without_predicate_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.wrap.kind = FSDP_WRAP_PREDICATE;
    d.wrap.predicate = NULL;
    assert_init_rejected(&d, "PREDICATE");
}

static void test_init_with_unknown_wrap_policy_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.wrap.kind = (fsdp_wrap_kind)12;
    assert_init_rejected(&d, "wrap policy");
}

static void test_init_with_shard_group_size_larger_than_world_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.strategy = FSDP_HYBRID_SHARD;
    d.shard_group_size = 2;
    assert_init_rejected(&d, "shard_group_size 2 must divide the world size 1: unit 0 '(root)' is HYBRID_SHARD (desc.strategy)");
}

/* Only HYBRID_SHARD units use the shard group: without one, a group size that does not divide the
   world (the default, ranks per host, on uneven hosts) is no error. */
static void test_init_with_shard_group_size_larger_than_world_and_no_hybrid_unit_succeeds(void) {
    fsdp_desc d = valid_desc();
    d.shard_group_size = 2;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
}

static void test_init_with_shard_group_size_larger_than_world_and_a_hybrid_unit_of_its_own_names_the_unit(void) {
    fsdp_desc d = valid_desc();
    d.shard_group_size = 2;
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_set_strategy(net.model, net.layer[1], FSDP_HYBRID_SHARD));
    assert_init_rejected(&d, "shard_group_size 2 must divide the world size 1: unit 2 'layers.1' is HYBRID_SHARD "
                             "(fsdp_model_set_strategy)");
}

static void test_init_without_comm_returns_invalid_arg(void) {
    fsdp_desc d = valid_desc();
    d.comm = NULL;
    assert_init_rejected(&d, "comm");
}

/* shard_group_size 3 with 4 ranks: every rank refuses, none waits for the others. */
typedef struct init_report {
    int done, rc, out_was_null;
    double elapsed_ms;
    char error[600];
} init_report;

static init_report *init_reports; /* MAP_SHARED [MAX_WORLD] */

static int bad_group_rank(fsdp_comm *comm, void *arg) {
    init_report *r = &init_reports[fsdp_comm_rank(comm)];
    small_model m;
    fsdp_ctx *c = (fsdp_ctx *)&c;
    fsdp_desc d;
    double start;
    (void)arg;
    if (small_build(&m) != 0) return 2;
    d = small_desc(comm, FSDP_HYBRID_SHARD);
    d.shard_group_size = 3;
    start = fsdp_now();
    r->rc = fsdp_init(&c, m.model, &d);
    r->elapsed_ms = (fsdp_now() - start) * 1000.0;
    r->out_was_null = c == NULL;
    snprintf(r->error, sizeof r->error, "%s", fsdp_last_error(NULL));
    if (r->rc == FSDP_SUCCESS) fsdp_destroy(c);
    fsdp_model_destroy(m.model);
    r->done = 1;
    return 0;
}

static void test_init_with_shard_group_size_not_dividing_world_returns_invalid_arg_on_every_rank(void) {
    fsdp_launch_status status;
    int rc, rank;
    memset(init_reports, 0, sizeof(init_report) * MAX_WORLD);
    rc = launch_ranks(4, FSDP_BACKEND_SHM, ORDER_TIMEOUT_MS, bad_group_rank, NULL, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    for (rank = 0; rank < 4; rank++) {
        const init_report *r = &init_reports[rank];
        snprintf(message, sizeof message, "rank %d: %s after %.0f ms: %s", rank, fsdp_result_name(r->rc), r->elapsed_ms,
                 r->error);
        TEST_ASSERT_TRUE_MESSAGE(r->done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, r->rc, message);
        TEST_ASSERT_TRUE_MESSAGE(r->out_was_null, message);
        TEST_ASSERT_TRUE_MESSAGE(r->elapsed_ms < ORDER_TIMEOUT_MS, message);
        assert_error_names(r->error, "shard_group_size");
    }
}

/* ---------------------------------------------------------------------------------------------
   invalid model calls
   --------------------------------------------------------------------------------------------- */
static const fsdp_init_rule zeros = {FSDP_INIT_ZEROS, 0, 0, NULL, NULL};

static fsdp_model *empty_model(void) {
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_model_create(&net.model, "Net"));
    return net.model;
}

static void test_model_duplicate_param_name_in_a_module_returns_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t shape[1] = {3};
    int block = fsdp_model_module(m, 0, "block", "Block");
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, block, "weight", 1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, block, "weight", 1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(1, fsdp_model_num_params(m));
}

static void test_model_duplicate_module_name_under_a_parent_returns_invalid_arg(void) {
    fsdp_model *m = empty_model();
    TEST_ASSERT_GREATER_THAN(0, fsdp_model_module(m, 0, "block", "Block"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_module(m, 0, "block", "Other"));
    TEST_ASSERT_EQUAL_INT(2, fsdp_model_num_modules(m));
}

static void test_model_same_local_name_under_different_parents_is_allowed(void) {
    fsdp_model *m = empty_model();
    int64_t shape[1] = {3};
    int a = fsdp_model_module(m, 0, "a", "Block"), b = fsdp_model_module(m, 0, "b", "Block");
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, a, "weight", 1, shape, zeros));
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, b, "weight", 1, shape, zeros));
    TEST_ASSERT_GREATER_THAN(0, fsdp_model_module(m, a, "inner", "X"));
    TEST_ASSERT_GREATER_THAN(0, fsdp_model_module(m, b, "inner", "X"));
}

static void test_model_names_with_a_dot_return_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t shape[1] = {3};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_module(m, 0, "layers.0", "Block"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w.b", 1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(1, fsdp_model_num_modules(m));
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_num_params(m));
}

static void test_model_empty_or_null_names_return_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t shape[1] = {3};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_module(m, 0, "", "Block"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_module(m, 0, NULL, "Block"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "", 1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, NULL, 1, shape, zeros));
}

static void test_model_zero_or_negative_dimension_returns_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t zero[2] = {3, 0}, negative[2] = {-2, 3};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w", 2, zero, zeros));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w", 2, negative, zeros));
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_num_params(m));
}

static void test_model_more_than_max_dims_or_missing_shape_returns_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t shape[FSDP_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w", FSDP_MAX_DIMS + 1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w", -1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w", 2, NULL, zeros));
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, 0, "w", FSDP_MAX_DIMS, shape, zeros));
}

static void test_model_unknown_parent_or_module_returns_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t shape[1] = {3};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_module(m, 5, "x", "X"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_module(m, -1, "x", "X"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 3, "w", 1, shape, zeros));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_wrap(m, 7));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_set_strategy(m, 7, FSDP_NO_SHARD));
}

static void test_model_callback_init_without_function_returns_invalid_arg(void) {
    fsdp_model *m = empty_model();
    int64_t shape[1] = {3};
    fsdp_init_rule callback = {FSDP_INIT_CALLBACK, 0, 0, NULL, NULL};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_model_param(m, 0, "w", 1, shape, callback));
}

static void test_model_full_names_are_dotted_paths_like_a_state_dict(void) {
    small_model m;
    TEST_ASSERT_EQUAL_INT(0, small_build(&m));
    net.model = m.model; /* released by tearDown */
    TEST_ASSERT_EQUAL_STRING("layers.1.weight", fsdp_model_param_name(m.model, m.weight[1]));
    TEST_ASSERT_EQUAL_STRING("scale", fsdp_model_param_name(m.model, m.scale));
    TEST_ASSERT_EQUAL_STRING("layers.2", fsdp_model_module_name(m.model, m.layer[2]));
    TEST_ASSERT_EQUAL_STRING("", fsdp_model_module_name(m.model, 0));
    TEST_ASSERT_EQUAL_INT(m.bias[0], fsdp_model_find_param(m.model, "layers.0.bias"));
    TEST_ASSERT_EQUAL_INT(-1, fsdp_model_find_param(m.model, "layers.0"));
}

/* ---------------------------------------------------------------------------------------------
   wrap policies
   The model:
       ""        Net          scale (5)
       embed     Embedding    weight 11x3 (33)
       layers    ModuleList
       layers.0  Block
         .attn   Linear       weight 7x5, bias 7 (42)
         .mlp    Linear       weight 5x7, bias 5 (40)
       layers.1  Block        (the same)
       head      Linear       weight 3x5 (15)
   --------------------------------------------------------------------------------------------- */
typedef struct wrap_model {
    int embed, layers, block[2], attn[2], mlp[2], head;
} wrap_model;

static wrap_model wm;

static void wrap_build(void) {
    int64_t s5[1] = {5}, s11x3[2] = {11, 3}, s7x5[2] = {7, 5}, s7[1] = {7}, s5x7[2] = {5, 7}, s3x5[2] = {3, 5};
    char name[16];
    int b;
    fsdp_model *m = empty_model();
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, 0, "scale", 1, s5, zeros));
    wm.embed = fsdp_model_module(m, 0, "embed", "Embedding");
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, wm.embed, "weight", 2, s11x3, zeros));
    wm.layers = fsdp_model_module(m, 0, "layers", "ModuleList");
    for (b = 0; b < 2; b++) {
        snprintf(name, sizeof name, "%d", b);
        wm.block[b] = fsdp_model_module(m, wm.layers, name, "Block");
        wm.attn[b] = fsdp_model_module(m, wm.block[b], "attn", "Linear");
        wm.mlp[b] = fsdp_model_module(m, wm.block[b], "mlp", "Linear");
        TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, wm.attn[b], "weight", 2, s7x5, zeros));
        TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, wm.attn[b], "bias", 1, s7, zeros));
        TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, wm.mlp[b], "weight", 2, s5x7, zeros));
        TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, wm.mlp[b], "bias", 1, s5, zeros));
    }
    wm.head = fsdp_model_module(m, 0, "head", "Linear");
    TEST_ASSERT_GREATER_OR_EQUAL(0, fsdp_model_param(m, wm.head, "weight", 2, s3x5, zeros));
}

static void wrap_init(fsdp_wrap_policy policy) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = one_rank_comm();
    d.wrap = policy;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
}

/* expected: "unit name: param param ...", one string per unit, "" names the root. Checks the
   unit count, each unit's parameter count and elements, and that each listed parameter belongs
   to that unit. */
static void assert_units(const char *const *expected, int count) {
    int e, u, found, p;
    char names[512];
    snprintf(message, sizeof message, "number of units");
    TEST_ASSERT_EQUAL_INT_MESSAGE(count, fsdp_num_units(ctx), message);
    for (e = 0; e < count; e++) {
        const char *colon = strchr(expected[e], ':');
        fsdp_unit_info info;
        int64_t numel = 0;
        int params = 0;
        char *name, *save = NULL;
        size_t len = (size_t)(colon - expected[e]);
        for (u = 0, found = -1; u < fsdp_num_units(ctx); u++) {
            TEST_ASSERT_EQUAL_INT(0, fsdp_unit_info_get(ctx, u, &info));
            if (strlen(info.name) == len && strncmp(info.name, expected[e], len) == 0) found = u;
        }
        snprintf(message, sizeof message, "no unit named '%.*s'", (int)len, expected[e]);
        TEST_ASSERT_TRUE_MESSAGE(found >= 0, message);
        TEST_ASSERT_EQUAL_INT(0, fsdp_unit_info_get(ctx, found, &info));
        snprintf(names, sizeof names, "%s", colon + 1);
        for (name = strtok_r(names, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
            fsdp_param_info pinfo;
            p = fsdp_model_find_param(net.model, name);
            snprintf(message, sizeof message, "parameter %s", name);
            TEST_ASSERT_TRUE_MESSAGE(p >= 0, message);
            TEST_ASSERT_EQUAL_INT(0, fsdp_param_info_get(ctx, p, &pinfo));
            snprintf(message, sizeof message, "%s belongs to unit %d, expected unit '%.*s' (%d)", name, pinfo.unit, (int)len,
                     expected[e], found);
            TEST_ASSERT_EQUAL_INT_MESSAGE(found, pinfo.unit, message);
            numel += fsdp_model_param_numel(net.model, p);
            params++;
        }
        snprintf(message, sizeof message, "unit '%.*s': %d params, %lld elements", (int)len, expected[e], info.num_params,
                 (long long)info.numel);
        TEST_ASSERT_EQUAL_INT_MESSAGE(params, info.num_params, message);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(numel, info.numel, message);
    }
}

static void test_wrap_none_gives_one_root_unit_owning_every_parameter(void) {
    static const char *const expected[] = {
        ": scale embed.weight layers.0.attn.weight layers.0.attn.bias layers.0.mlp.weight layers.0.mlp.bias "
        "layers.1.attn.weight layers.1.attn.bias layers.1.mlp.weight layers.1.mlp.bias head.weight"};
    fsdp_wrap_policy policy = {FSDP_WRAP_NONE, 0, NULL, NULL, NULL};
    wrap_build();
    wrap_init(policy);
    assert_units(expected, 1);
}

static void test_wrap_types_wraps_every_listed_type_and_the_root_owns_the_rest(void) {
    static const char *const blocks[] = {"Block", NULL};
    static const char *const expected[] = {
        ": scale embed.weight head.weight",
        "layers.0: layers.0.attn.weight layers.0.attn.bias layers.0.mlp.weight layers.0.mlp.bias",
        "layers.1: layers.1.attn.weight layers.1.attn.bias layers.1.mlp.weight layers.1.mlp.bias"};
    fsdp_wrap_policy policy = {FSDP_WRAP_TYPES, 0, blocks, NULL, NULL};
    wrap_build();
    wrap_init(policy);
    assert_units(expected, 3);
}

/* min_params 41: each attn (42) becomes a unit, an mlp (40) does not, a Block then holds only
   its mlp's 40, and "layers" collects both mlps (80) and becomes a unit; embed (33) and head (15)
   stay with the root. */
static void test_wrap_size_counts_only_parameters_not_already_in_a_child_unit(void) {
    static const char *const expected[] = {
        ": scale embed.weight head.weight",
        "layers: layers.0.mlp.weight layers.0.mlp.bias layers.1.mlp.weight layers.1.mlp.bias",
        "layers.0.attn: layers.0.attn.weight layers.0.attn.bias",
        "layers.1.attn: layers.1.attn.weight layers.1.attn.bias"};
    fsdp_wrap_policy policy = {FSDP_WRAP_SIZE, 41, NULL, NULL, NULL};
    wrap_build();
    wrap_init(policy);
    assert_units(expected, 4);
}

typedef struct predicate_log {
    int64_t unwrapped[32];  /* what the predicate was told, per module; -1: not asked */
} predicate_log;

static int wrap_mlps(void *user, const fsdp_model *model, int module, int64_t unwrapped_params) {
    predicate_log *log = (predicate_log *)user;
    const char *name = fsdp_model_module_name(model, module);
    size_t len = strlen(name);
    if (module >= 0 && module < 32) log->unwrapped[module] = unwrapped_params;
    return len >= 3 && strcmp(name + len - 3, "mlp") == 0;
}

static void test_wrap_predicate_wraps_the_modules_it_accepts(void) {
    static const char *const expected[] = {
        ": scale embed.weight layers.0.attn.weight layers.0.attn.bias layers.1.attn.weight layers.1.attn.bias head.weight",
        "layers.0.mlp: layers.0.mlp.weight layers.0.mlp.bias", "layers.1.mlp: layers.1.mlp.weight layers.1.mlp.bias"};
    static predicate_log log;
    fsdp_wrap_policy policy = {FSDP_WRAP_PREDICATE, 0, NULL, wrap_mlps, &log};
    wrap_build();
    wrap_init(policy);
    assert_units(expected, 3);
}

/* The predicate sees the parameters of the module and of its children that did not become units. */
static void test_wrap_predicate_is_given_the_parameters_not_in_a_child_unit(void) {
    static predicate_log log;
    fsdp_wrap_policy policy = {FSDP_WRAP_PREDICATE, 0, NULL, wrap_mlps, &log};
    int i;
    for (i = 0; i < 32; i++) log.unwrapped[i] = -1;
    wrap_build();
    wrap_init(policy);
    TEST_ASSERT_EQUAL_INT64_MESSAGE(40, log.unwrapped[wm.mlp[0]], "layers.0.mlp");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(42, log.unwrapped[wm.attn[0]], "layers.0.attn");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(42, log.unwrapped[wm.block[0]], "layers.0 (its mlp is a unit)");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(84, log.unwrapped[wm.layers], "layers (both attns)");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(33, log.unwrapped[wm.embed], "embed");
}

static void test_wrap_manual_wraps_only_the_marked_modules(void) {
    static const char *const expected[] = {
        ": scale layers.0.attn.weight layers.0.attn.bias layers.0.mlp.weight layers.0.mlp.bias head.weight",
        "embed: embed.weight",
        "layers.1: layers.1.attn.weight layers.1.attn.bias layers.1.mlp.weight layers.1.mlp.bias"};
    fsdp_wrap_policy policy = {FSDP_WRAP_MANUAL, 0, NULL, NULL, NULL};
    wrap_build();
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_wrap(net.model, wm.embed));
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_wrap(net.model, wm.block[1]));
    wrap_init(policy);
    assert_units(expected, 3);
}

static void test_wrap_marked_module_is_a_unit_under_any_policy(void) {
    static const char *const blocks[] = {"Block", NULL};
    static const char *const expected[] = {
        ": scale embed.weight", "head: head.weight",
        "layers.0: layers.0.attn.weight layers.0.attn.bias layers.0.mlp.weight layers.0.mlp.bias",
        "layers.1: layers.1.attn.weight layers.1.attn.bias layers.1.mlp.weight layers.1.mlp.bias"};
    fsdp_wrap_policy policy = {FSDP_WRAP_TYPES, 0, blocks, NULL, NULL};
    wrap_build();
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_wrap(net.model, wm.head));
    wrap_init(policy);
    assert_units(expected, 4);
}

static void test_wrap_unit_with_its_own_strategy_reports_it(void) {
    static const char *const blocks[] = {"Block", NULL};
    fsdp_wrap_policy policy = {FSDP_WRAP_TYPES, 0, blocks, NULL, NULL};
    fsdp_unit_info info;
    int u, no_shard = 0, full_shard = 0;
    wrap_build();
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_set_strategy(net.model, wm.block[1], FSDP_NO_SHARD));
    wrap_init(policy);
    for (u = 0; u < fsdp_num_units(ctx); u++) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_unit_info_get(ctx, u, &info));
        if (strcmp(info.name, "layers.1") == 0) no_shard += info.strategy == FSDP_NO_SHARD;
        else full_shard += info.strategy == FSDP_FULL_SHARD;
    }
    TEST_ASSERT_EQUAL_INT(1, no_shard);
    TEST_ASSERT_EQUAL_INT(2, full_shard);
}

/* ---------------------------------------------------------------------------------------------
   runner
   --------------------------------------------------------------------------------------------- */
int main(void) {
    unsetenv("FSDP_DEBUG"); /* its misuse tests misuse on purpose: FSDP_DEBUG >= 1 would abort at the first */
    order_reports = (order_report *)map_shared(sizeof(order_report) * MAX_WORLD);
    destroy_reports = (destroy_report *)map_shared(sizeof(destroy_report) * MAX_WORLD);
    init_reports = (init_report *)map_shared(sizeof(init_report) * MAX_WORLD);
    UNITY_BEGIN();
    RUN_TEST(test_hook_post_forward_without_pre_forward_returns_state_error_naming_the_unit);
    RUN_TEST(test_hook_pre_backward_before_forward_ran_returns_state_error_naming_the_unit);
    RUN_TEST(test_hook_post_backward_without_pre_backward_returns_state_error_naming_the_unit);
    RUN_TEST(test_hook_pre_forward_twice_in_one_iteration_returns_state_error_naming_the_unit);
    RUN_TEST(test_hook_on_module_inside_a_unit_is_reference_counted_with_its_unit);
    RUN_TEST(test_hook_on_module_that_does_not_exist_returns_invalid_arg);
    RUN_TEST(test_step_after_unit_ran_forward_but_not_backward_returns_state_error_naming_the_unit);
    RUN_TEST(test_step_while_no_sync_holds_unreduced_gradients_returns_state_error);
    RUN_TEST(test_forward_only_pass_ended_by_finish_backward_allows_another_forward);
    RUN_TEST(test_set_param_full_from_rank0_reaches_every_rank_exactly);
    RUN_TEST(test_set_param_shard_sets_exactly_this_ranks_slice);
    RUN_TEST(test_set_param_during_an_iteration_returns_state_error);
    RUN_TEST(test_print_units_lists_a_header_and_every_unit);
    RUN_TEST(test_second_forward_without_ending_the_first_returns_state_error_that_says_what_to_do);

    RUN_TEST(test_order_rank_with_different_forward_order_gets_mismatch_on_every_rank_within_timeout);
    RUN_TEST(test_order_rank_with_different_forward_order_and_no_collectives_gets_mismatch_at_step);
    RUN_TEST(test_destroy_in_the_middle_of_an_iteration_leaves_the_communicator_usable_on_every_rank);

    RUN_TEST(test_init_with_valid_desc_succeeds);
    RUN_TEST(test_init_with_invalid_param_dtype_returns_invalid_arg);
    RUN_TEST(test_init_with_invalid_reduce_dtype_returns_invalid_arg);
    RUN_TEST(test_init_with_negative_lr_returns_invalid_arg);
    RUN_TEST(test_init_with_nan_lr_returns_invalid_arg);
    RUN_TEST(test_init_with_momentum_of_one_returns_invalid_arg);
    RUN_TEST(test_init_with_nesterov_without_momentum_returns_invalid_arg);
    RUN_TEST(test_init_with_adam_beta1_of_one_returns_invalid_arg);
    RUN_TEST(test_init_with_negative_weight_decay_returns_invalid_arg);
    RUN_TEST(test_init_with_unknown_optimizer_returns_invalid_arg);
    RUN_TEST(test_init_with_unknown_strategy_returns_invalid_arg);
    RUN_TEST(test_init_with_unknown_backward_prefetch_returns_invalid_arg);
    RUN_TEST(test_init_with_size_policy_and_zero_min_params_returns_invalid_arg);
    RUN_TEST(test_init_with_types_policy_without_types_returns_invalid_arg);
    RUN_TEST(test_init_with_predicate_policy_without_predicate_returns_invalid_arg);
    RUN_TEST(test_init_with_unknown_wrap_policy_returns_invalid_arg);
    RUN_TEST(test_init_with_shard_group_size_larger_than_world_returns_invalid_arg);
    RUN_TEST(test_init_with_shard_group_size_larger_than_world_and_no_hybrid_unit_succeeds);
    RUN_TEST(test_init_with_shard_group_size_larger_than_world_and_a_hybrid_unit_of_its_own_names_the_unit);
    RUN_TEST(test_init_without_comm_returns_invalid_arg);
    RUN_TEST(test_init_with_shard_group_size_not_dividing_world_returns_invalid_arg_on_every_rank);

    RUN_TEST(test_model_duplicate_param_name_in_a_module_returns_invalid_arg);
    RUN_TEST(test_model_duplicate_module_name_under_a_parent_returns_invalid_arg);
    RUN_TEST(test_model_same_local_name_under_different_parents_is_allowed);
    RUN_TEST(test_model_names_with_a_dot_return_invalid_arg);
    RUN_TEST(test_model_empty_or_null_names_return_invalid_arg);
    RUN_TEST(test_model_zero_or_negative_dimension_returns_invalid_arg);
    RUN_TEST(test_model_more_than_max_dims_or_missing_shape_returns_invalid_arg);
    RUN_TEST(test_model_unknown_parent_or_module_returns_invalid_arg);
    RUN_TEST(test_model_callback_init_without_function_returns_invalid_arg);
    RUN_TEST(test_model_full_names_are_dotted_paths_like_a_state_dict);

    RUN_TEST(test_wrap_none_gives_one_root_unit_owning_every_parameter);
    RUN_TEST(test_wrap_types_wraps_every_listed_type_and_the_root_owns_the_rest);
    RUN_TEST(test_wrap_size_counts_only_parameters_not_already_in_a_child_unit);
    RUN_TEST(test_wrap_predicate_wraps_the_modules_it_accepts);
    RUN_TEST(test_wrap_predicate_is_given_the_parameters_not_in_a_child_unit);
    RUN_TEST(test_wrap_manual_wraps_only_the_marked_modules);
    RUN_TEST(test_wrap_marked_module_is_a_unit_under_any_policy);
    RUN_TEST(test_wrap_unit_with_its_own_strategy_reports_it);
    return UNITY_END();
}
