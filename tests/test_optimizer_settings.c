/* test_optimizer_settings.c - specification of the optimizer's settings as a user meets them
   (issue 36: a port of llm.c, whose AdamW has no weight decay, silently got PyTorch's 0.01):
   FSDP_NO_WEIGHT_DECAY means exactly no decay where a zero field takes AdamW's default;
   fsdp_init logs the settings it resolved and where the weight decay came from, and
   fsdp_print_units prints them. fsdp_set_optimizer and fsdp_set_param_group change the settings
   between steps, globally and per parameter group: a run changed at step CHANGE_AT ends with the
   bits of a reference that changes at the same step, at 1, 2 and 3 ranks, also while the update
   runs behind (optimizer state offloaded); settings that would change the state's shape, invalid
   ones and calls during an iteration are refused, with the messages fsdp_init gives.

   The model is tests/test_mlp.h's: the root holds `scale`, layers.0 .. layers.2 are Linear units
   (FSDP_WRAP_TYPES {"Linear"}). The training here is no network: each step, every rank adds the
   same made-up gradient to every parameter, a small multiple of 2^-10 (so that the ranks' average
   is that gradient exactly), and the reference is PyTorch's AdamW written out per element; a run
   and its reference must agree bit for bit. Single-rank tests run in this process (tearDown
   releases what they made).

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_optimizer_settings.c tests/unity/unity.c -o /tmp/tos -lpthread -lm */
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

#define SEED 36u

static char message[2048];
static const char *const linear_types[] = {"Linear", NULL};

/* ---------------------------------------------------------------------------------------------
   fixtures
   --------------------------------------------------------------------------------------------- */
static fsdp_comm *comm1;
static fsdp_ctx *ctx;
static mlp net;

/* What the context logged at info level and above, one message per line. */
static char logged[8192];
static void keep_log(void *user, fsdp_log_level level, const char *line) {
    (void)user;
    (void)level;
    append_text(logged, sizeof logged, line);
    append_text(logged, sizeof logged, "\n");
}

void setUp(void) {}

void tearDown(void) {
    release_one_rank(&ctx, &net.model, &comm1);
    memset(&net, 0, sizeof net);
}

static fsdp_desc desc_for(fsdp_comm *comm, const fsdp_optimizer_desc *opt) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = FSDP_FULL_SHARD;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = linear_types;
    d.seed = SEED;
    d.optimizer = *opt;
    d.logger.fn = keep_log;
    d.logger.max_level = FSDP_LOG_INFO;
    return d;
}

/* A one-rank context over `net` with these optimizer settings, logging into `logged`. */
static void start_one_rank(const fsdp_optimizer_desc *opt) {
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&net));
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm1, "test-optimizer-settings"));
    d = desc_for(comm1, opt);
    logged[0] = '\0';
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
}

/* One iteration whose backward adds nothing: every gradient stays zero. */
static void step_with_zero_gradients(fsdp_ctx *c, const mlp *m) {
    int l;
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(c, 0));
    for (l = 0; l < 3; l++) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(c, m->layer[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(c, m->layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(c, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(c, 0));
    for (l = 2; l >= 0; l--) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(c, m->layer[l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(c, m->layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(c, 0));
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_step(c, 0, NULL), fsdp_last_error(c));
    TEST_ASSERT_EQUAL_INT(0, fsdp_zero_grad(c));
}

/* The initial values of every parameter (fsdp.h's init rules), concatenated. */
static void initial_values(const mlp *m, float *out) {
    int p, i;
    for (p = 0; p < NPARAMS; p++)
        for (i = 0; i < param_numel[p]; i++) out[param_offset[p] + i] = fsdp_init_value(m->model, m->param[p], i, SEED);
}

/* ---------------------------------------------------------------------------------------------
   AdamW's weight decay: the default, and none
   --------------------------------------------------------------------------------------------- */
#define DECAY_STEPS 3

/* AdamW with lr 0.1 and this weight decay field, DECAY_STEPS steps of zero gradients (Adam's
   moments stay zero, so only the decay can move a weight): the values after, into got. */
static void adamw_zero_gradient_run(float weight_decay, int weight_decay_set, float *got, float *initial) {
    fsdp_optimizer_desc opt;
    int s;
    memset(&opt, 0, sizeof opt);
    opt.kind = FSDP_ADAMW;
    opt.lr = 0.1f;
    opt.weight_decay = weight_decay;
    opt.weight_decay_set = weight_decay_set;
    start_one_rank(&opt);
    initial_values(&net, initial);
    for (s = 0; s < DECAY_STEPS; s++) step_with_zero_gradients(ctx, &net);
    TEST_ASSERT_EQUAL_INT(0, gather_all(ctx, &net, got));
}

static void test_adamw_with_no_weight_decay_leaves_weights_with_zero_gradient_bitwise_unchanged(void) {
    float got[NELEM], initial[NELEM];
    adamw_zero_gradient_run(FSDP_NO_WEIGHT_DECAY, 0, got, initial);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(initial, got, sizeof got, "a weight with zero gradient moved");
}

/* Kept for code written before FSDP_NO_WEIGHT_DECAY. */
static void test_adamw_with_weight_decay_set_and_zero_leaves_weights_with_zero_gradient_bitwise_unchanged(void) {
    float got[NELEM], initial[NELEM];
    adamw_zero_gradient_run(0.0f, 1, got, initial);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(initial, got, sizeof got, "a weight with zero gradient moved");
}

/* PyTorch's default stays: a weight decay left at zero is 0.01, p *= 1 - lr * 0.01 per step. */
static void test_adamw_with_weight_decay_left_at_zero_decays_by_the_default_0_01(void) {
    float got[NELEM], initial[NELEM];
    int e, s;
    adamw_zero_gradient_run(0.0f, 0, got, initial);
    for (e = 0; e < NELEM; e++)
        for (s = 0; s < DECAY_STEPS; s++) initial[e] *= 1.0f - 0.1f * 0.01f;
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(initial, got, sizeof got, "not decayed by (1 - lr 0.01) per step");
}

static void test_init_logs_adamws_default_weight_decay_and_how_to_have_none(void) {
    fsdp_optimizer_desc opt;
    memset(&opt, 0, sizeof opt);
    opt.kind = FSDP_ADAMW;
    start_one_rank(&opt);
    assert_says(logged, "fsdp_init: optimizer AdamW: lr 0.001, betas (0.9, 0.999), eps 1e-08, weight_decay 0.01 "
                        "(AdamW's default: set .weight_decay = FSDP_NO_WEIGHT_DECAY for none), state f32");
}

static void test_init_logs_no_weight_decay_when_asked_for_none(void) {
    fsdp_optimizer_desc opt;
    memset(&opt, 0, sizeof opt);
    opt.kind = FSDP_ADAMW;
    opt.lr = 6e-4f;
    opt.weight_decay = FSDP_NO_WEIGHT_DECAY;
    start_one_rank(&opt);
    assert_says(logged, "fsdp_init: optimizer AdamW: lr 0.0006, betas (0.9, 0.999), eps 1e-08, "
                        "weight_decay 0 (FSDP_NO_WEIGHT_DECAY), state f32");
}

static void test_init_logs_sgd_settings_as_given(void) {
    fsdp_optimizer_desc opt;
    memset(&opt, 0, sizeof opt);
    opt.kind = FSDP_SGD;
    opt.lr = 0.05f;
    opt.momentum = 0.9f;
    opt.weight_decay = 0.01f;
    start_one_rank(&opt);
    assert_says(logged, "fsdp_init: optimizer SGD: lr 0.05, momentum 0.9, dampening 0, weight_decay 0.01, state f32");
}

static char printed[4096];
static void keep_line(void *user, const char *line) {
    (void)user;
    append_text(printed, sizeof printed, line);
    append_text(printed, sizeof printed, "\n");
}

/* ---------------------------------------------------------------------------------------------
   settings changed between steps: the bits of a reference changed at the same step
   --------------------------------------------------------------------------------------------- */
#define STEPS 5
#define CHANGE_AT 2 /* the settings change before this step (0-based) */
#define MAX_WORLD 3
#define LAUNCH_TIMEOUT_MS 20000

/* Before: AdamW lr 0.01, weight decay 0.05, PyTorch's betas and eps; the biases of layers.0 and
   layers.1 in group 0 (no decay, lr x 2), matrices in group 1 (decay 0.1), `scale` and
   layers.2.bias in none (the latter in a unit updated parameter by parameter). After: lr 0.02,
   betas (0.8, 0.99), eps 1e-6, weight decay 0.2 (fsdp_set_optimizer); group 0 decays 0.3 with
   lr x 0.5 (fsdp_set_param_group). */
static const fsdp_param_group groups_before[2] = {{"layers.[01].bias", 0, 0, 0.0f, 2.0f}, {NULL, 2, 2, 0.1f, 0.0f}};
static const fsdp_param_group group0_after = {"layers.[01].bias", 0, 0, 0.3f, 0.5f};
static fsdp_optimizer_desc optimizer_before(void) {
    fsdp_optimizer_desc o;
    memset(&o, 0, sizeof o);
    o.kind = FSDP_ADAMW;
    o.lr = 0.01f;
    o.weight_decay = 0.05f;
    return o;
}
static fsdp_optimizer_desc optimizer_after(void) {
    fsdp_optimizer_desc o = optimizer_before();
    o.lr = 0.02f;
    o.beta1 = 0.8f;
    o.beta2 = 0.99f;
    o.eps = 1e-6f;
    o.weight_decay = 0.2f;
    return o;
}

enum { CHANGE_NONE, CHANGE_OPTIMIZER, CHANGE_GROUP, CHANGE_BOTH_BEHIND, CHANGES };
static const char *const change_names[CHANGES] = {"no change", "fsdp_set_optimizer", "fsdp_set_param_group",
                                                  "both, the update offloaded (running behind)"};

/* Step `step`'s gradient of element i of parameter p: a multiple of 2^-10 of at most 5 bits, so
   that P copies sum (and average) exactly. */
static float gradient(int step, int p, int i) { return (float)((step * 7 + p * 13 + i * 5) % 41 - 20) / 1024.0f; }

typedef struct run_result {
    int rc;
    char error[600];
    float values[NELEM];
} run_result;

static run_result *results; /* MAP_SHARED [CHANGES][MAX_WORLD + 1][MAX_WORLD]: per change, world, rank */
static run_result *result_of(int change, int world, int rank) {
    return &results[(change * (MAX_WORLD + 1) + world) * MAX_WORLD + rank];
}
static char offload_dir[256];

static void add_gradients(fsdp_ctx *c, const mlp *m, int step, int lo, int hi) {
    int p, i;
    for (p = lo; p <= hi; p++) {
        float *g = fsdp_grad(c, m->param[p]);
        for (i = 0; g && i < param_numel[p]; i++) g[i] += gradient(step, p, i);
    }
}

/* One training step: hooks of every unit, the made-up gradients added in each unit's backward. */
static int train_step(fsdp_ctx *c, const mlp *m, int step) {
    int l, rc = fsdp_pre_forward(c, 0);
    for (l = 0; l < 3 && !rc; l++)
        if ((rc = fsdp_pre_forward(c, m->layer[l])) == 0) rc = fsdp_post_forward(c, m->layer[l]);
    if (!rc) rc = fsdp_post_forward(c, 0);
    if (!rc) rc = fsdp_pre_backward(c, 0);
    for (l = 2; l >= 0 && !rc; l--) {
        if ((rc = fsdp_pre_backward(c, m->layer[l])) != 0) break;
        add_gradients(c, m, step, P_W0 + 2 * l, P_B0 + 2 * l);
        rc = fsdp_post_backward(c, m->layer[l]);
    }
    if (!rc) add_gradients(c, m, step, P_SCALE, P_SCALE);
    if (!rc) rc = fsdp_post_backward(c, 0);
    if (!rc) rc = fsdp_step(c, 0, NULL);
    if (!rc) rc = fsdp_zero_grad(c);
    return rc;
}

static int change_rank(fsdp_comm *comm, void *arg) {
    int change = *(const int *)arg, step;
    run_result *r = result_of(change, fsdp_comm_size(comm), fsdp_comm_rank(comm));
    fsdp_optimizer_desc before = optimizer_before(), after = optimizer_after();
    fsdp_ctx *c = NULL;
    fsdp_desc d;
    mlp m;
    if (mlp_build(&m) != 0) return 2;
    d = desc_for(comm, &before);
    d.logger.fn = NULL; /* the communicator's */
    d.param_groups = groups_before;
    d.num_param_groups = 2;
    if (change == CHANGE_BOTH_BEHIND) {
        d.offload.optimizer = 1;
        d.offload.dir = offload_dir;
        d.offload.allow_tmpfs = 1;
    }
    if ((r->rc = fsdp_init(&c, m.model, &d)) != 0) {
        snprintf(r->error, sizeof r->error, "fsdp_init: %s", fsdp_last_error(NULL));
        return 3;
    }
    for (step = 0; step < STEPS && !r->rc; step++) {
        if (step == CHANGE_AT && (change == CHANGE_OPTIMIZER || change == CHANGE_BOTH_BEHIND))
            r->rc = fsdp_set_optimizer(c, &after);
        if (!r->rc && step == CHANGE_AT && (change == CHANGE_GROUP || change == CHANGE_BOTH_BEHIND))
            r->rc = fsdp_set_param_group(c, 0, &group0_after);
        if (!r->rc) r->rc = train_step(c, &m, step);
    }
    if (!r->rc) r->rc = gather_all(c, &m, r->values);
    if (r->rc) snprintf(r->error, sizeof r->error, "step %d: %s", step - 1, fsdp_last_error(c));
    fsdp_destroy(c);
    fsdp_model_destroy(m.model);
    return r->rc ? 4 : 0;
}

/* Every change at every world size, once (the tests below read the results). */
static int ran;
static void ensure_runs(void) {
    int change, world;
    if (ran) return;
    ran = 1;
    for (change = 0; change < CHANGES; change++)
        for (world = 1; world <= MAX_WORLD; world++) {
            fsdp_launch_status st;
            if (launch_ranks(world, FSDP_BACKEND_SHM, LAUNCH_TIMEOUT_MS, change_rank, &change, &st) != FSDP_SUCCESS &&
                !result_of(change, world, 0)->rc) {
                result_of(change, world, 0)->rc = -1;
                snprintf(result_of(change, world, 0)->error, sizeof result_of(change, world, 0)->error, "launch: %s",
                         st.message);
            }
        }
}

/* PyTorch's AdamW on every element, each parameter with its group's settings, the settings of
   `change` from step CHANGE_AT; the values after STEPS steps into out. */
static void reference_run(int change, float *out) {
    static float m1[NELEM], m2[NELEM];
    mlp model;
    int p, i, step;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&model));
    initial_values(&model, out);
    fsdp_model_destroy(model.model);
    memset(m1, 0, sizeof m1);
    memset(m2, 0, sizeof m2);
    for (step = 0; step < STEPS; step++) {
        int changed = step >= CHANGE_AT;
        fsdp_optimizer_desc o = changed && (change == CHANGE_OPTIMIZER || change == CHANGE_BOTH_BEHIND) ? optimizer_after()
                                                                                                        : optimizer_before();
        fsdp_param_group bias_group = changed && (change == CHANGE_GROUP || change == CHANGE_BOTH_BEHIND) ? group0_after
                                                                                                          : groups_before[0];
        double t = (double)(step + 1);
        float beta1 = o.beta1 ? o.beta1 : 0.9f, beta2 = o.beta2 ? o.beta2 : 0.999f, eps = o.eps ? o.eps : 1e-8f;
        float bc1 = (float)(1.0 - pow((double)beta1, t)), bc2 = (float)(1.0 - pow((double)beta2, t)), bc2_sqrt = sqrtf(bc2);
        for (p = 0; p < NPARAMS; p++) {
            int bias = p == P_B0 || p == P_B1, matrix = p == P_W0 || p == P_W1 || p == P_W2;
            float wd = bias ? bias_group.weight_decay : matrix ? groups_before[1].weight_decay : o.weight_decay;
            float lr = bias ? o.lr * bias_group.lr_scale : o.lr, step_size = lr / bc1;
            for (i = 0; i < param_numel[p]; i++) {
                int e = param_offset[p] + i;
                float g = gradient(step, p, i);
                out[e] *= 1.0f - lr * wd;
                m1[e] = beta1 * m1[e] + (1.0f - beta1) * g;
                m2[e] = beta2 * m2[e] + (1.0f - beta2) * g * g;
                out[e] -= step_size * m1[e] / (sqrtf(m2[e]) / bc2_sqrt + eps);
            }
        }
    }
}

static void assert_runs_match_the_reference(int change) {
    float want[NELEM];
    int world, rank, e, index;
    ensure_runs();
    reference_run(change, want);
    for (world = 1; world <= MAX_WORLD; world++)
        for (rank = 0; rank < world; rank++) {
            const run_result *r = result_of(change, world, rank);
            snprintf(message, sizeof message, "%s, P=%d, rank %d: ", change_names[change], world, rank);
            append_text(message, sizeof message, r->error);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, r->rc, message);
            for (e = 0; e < NELEM && memcmp(&want[e], &r->values[e], sizeof(float)) == 0; e++) {}
            if (e < NELEM) {
                const char *name = param_of_element(e, &index);
                snprintf(message, sizeof message, "%s, P=%d, rank %d: %s[%d] is %.9g, the reference's %.9g",
                         change_names[change], world, rank, name, index, (double)r->values[e], (double)want[e]);
                TEST_FAIL_MESSAGE(message);
            }
        }
}

/* (the reference itself, where nothing changes) */
static void test_training_without_a_change_gives_the_bits_of_the_reference_at_1_2_3_ranks(void) {
    assert_runs_match_the_reference(CHANGE_NONE);
}
static void test_set_optimizer_between_steps_gives_the_bits_of_a_reference_changed_at_that_step_at_1_2_3_ranks(void) {
    assert_runs_match_the_reference(CHANGE_OPTIMIZER);
}
static void test_set_param_group_between_steps_gives_the_bits_of_a_reference_changed_at_that_step_at_1_2_3_ranks(void) {
    assert_runs_match_the_reference(CHANGE_GROUP);
}
static void test_set_optimizer_and_group_while_an_offloaded_update_runs_behind_give_the_reference_bits(void) {
    assert_runs_match_the_reference(CHANGE_BOTH_BEHIND);
}

/* ---------------------------------------------------------------------------------------------
   what fsdp_set_optimizer and fsdp_set_param_group refuse
   --------------------------------------------------------------------------------------------- */
static void start_adamw_with_groups(void) {
    fsdp_optimizer_desc opt = optimizer_before();
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&net));
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm1, "test-optimizer-settings"));
    d = desc_for(comm1, &opt);
    d.param_groups = groups_before;
    d.num_param_groups = 2;
    logged[0] = '\0';
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
}

static void test_set_optimizer_of_another_kind_is_refused_the_state_cannot_change_shape(void) {
    fsdp_optimizer_desc adam = optimizer_before();
    start_adamw_with_groups();
    adam.kind = FSDP_ADAM;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_optimizer(ctx, &adam));
    assert_says(fsdp_last_error(ctx), "fsdp_set_optimizer(Adam: lr 0.01");
    assert_says(fsdp_last_error(ctx), "its kind differs from fsdp_init's: the optimizer state cannot change shape mid-run");
}

static void test_set_optimizer_with_another_state_dtype_is_refused(void) {
    fsdp_optimizer_desc bf16 = optimizer_before();
    start_adamw_with_groups();
    bf16.state_dtype = FSDP_BF16;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_optimizer(ctx, &bf16));
    assert_says(fsdp_last_error(ctx), "its state_dtype differs from fsdp_init's");
}

static void test_set_optimizer_giving_sgd_momentum_where_init_had_none_is_refused(void) {
    fsdp_optimizer_desc sgd;
    memset(&sgd, 0, sizeof sgd);
    sgd.kind = FSDP_SGD;
    start_one_rank(&sgd);
    sgd.momentum = 0.9f;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_optimizer(ctx, &sgd));
    assert_says(fsdp_last_error(ctx), "it keeps another number of state buffers than fsdp_init's");
    sgd.momentum = 0.0f; /* the same shape: accepted */
    sgd.lr = 0.5f;
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_set_optimizer(ctx, &sgd), fsdp_last_error(ctx));
}

/* The checks are fsdp_init's: the same settings fail there with the same words. */
static void test_set_optimizer_with_invalid_betas_is_refused_with_fsdp_inits_message(void) {
    fsdp_optimizer_desc bad = optimizer_before();
    fsdp_model *model;
    fsdp_ctx *other = NULL;
    fsdp_desc d;
    char init_error[512];
    bad.beta1 = 1.5f;
    start_adamw_with_groups();
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_optimizer(ctx, &bad));
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_create(&model, "Empty"));
    d = desc_for(comm1, &bad);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_init(&other, model, &d));
    fsdp_model_destroy(model);
    copy_text(init_error, sizeof init_error, strstr(fsdp_last_error(NULL), "optimizer adamw"));
    TEST_ASSERT_EQUAL_STRING("optimizer adamw: betas must be in [0, 1)", init_error);
    assert_says(fsdp_last_error(ctx), "fsdp_set_optimizer: optimizer adamw: betas must be in [0, 1)");
}

static void test_set_optimizer_during_an_iteration_returns_state_error_and_changes_nothing(void) {
    fsdp_optimizer_desc after = optimizer_after();
    start_adamw_with_groups();
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_set_optimizer(ctx, &after));
    assert_says(fsdp_last_error(ctx), "fsdp_set_optimizer: call it between iterations");
    printed[0] = '\0';
    fsdp_print_units(ctx, keep_line, NULL);
    assert_says(printed, "optimizer AdamW: lr 0.01, betas (0.9, 0.999), eps 1e-08, weight_decay 0.05, state f32");
}

/* Zero fields take their defaults exactly as at fsdp_init: here every one. */
static void test_set_optimizer_zero_fields_take_the_defaults_as_fsdp_init_does(void) {
    fsdp_optimizer_desc adamw;
    start_adamw_with_groups();
    memset(&adamw, 0, sizeof adamw);
    adamw.kind = FSDP_ADAMW;
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_set_optimizer(ctx, &adamw), fsdp_last_error(ctx));
    printed[0] = '\0';
    fsdp_print_units(ctx, keep_line, NULL);
    assert_says(printed, "optimizer AdamW: lr 0.001, betas (0.9, 0.999), eps 1e-08, weight_decay 0.01 (AdamW's default: "
                         "set .weight_decay = FSDP_NO_WEIGHT_DECAY for none), state f32");
    assert_says(logged, "fsdp_set_optimizer: optimizer AdamW: lr 0.001");
}

static void test_set_param_group_with_another_pattern_is_refused_naming_both(void) {
    fsdp_param_group other = group0_after;
    start_adamw_with_groups();
    other.pattern = "*.weight";
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_param_group(ctx, 0, &other));
    assert_says(fsdp_last_error(ctx), "fsdp_set_param_group(ctx, 0): pattern *.weight, ndim 0..0 differ from fsdp_init's "
                                      "layers.[01].bias, ndim 0..0: a group's parameters cannot change");
    other = groups_before[1];
    other.max_ndim = 3;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_param_group(ctx, 1, &other));
    assert_says(fsdp_last_error(ctx), "pattern NULL, ndim 2..3 differ from fsdp_init's NULL, ndim 2..2");
}

static void test_set_param_group_that_does_not_exist_is_refused_naming_the_count(void) {
    start_adamw_with_groups();
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_param_group(ctx, 2, &group0_after));
    assert_says(fsdp_last_error(ctx), "fsdp_set_param_group(ctx, 2, g): no such group (fsdp_init had 2)");
}

static void test_set_param_group_with_negative_weight_decay_is_refused_with_fsdp_inits_message(void) {
    fsdp_param_group bad = group0_after;
    start_adamw_with_groups();
    bad.weight_decay = -0.1f;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_param_group(ctx, 0, &bad));
    assert_says(fsdp_last_error(ctx), "fsdp_set_param_group: param_groups[0]: weight_decay and lr_scale must be finite and >= 0");
}

static void test_set_param_group_during_an_iteration_returns_state_error(void) {
    start_adamw_with_groups();
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_set_param_group(ctx, 0, &group0_after));
    assert_says(fsdp_last_error(ctx), "fsdp_set_param_group: call it between iterations");
}

static void test_print_units_prints_each_param_group_with_its_current_settings(void) {
    start_adamw_with_groups();
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_set_param_group(ctx, 0, &group0_after), fsdp_last_error(ctx));
    printed[0] = '\0';
    fsdp_print_units(ctx, keep_line, NULL);
    assert_says(printed, "\nparam_groups[0] 'layers.[01].bias', ndim >= 0: weight_decay 0.3, lr x 0.5 (2 parameters)\n");
    assert_says(printed, "\nparam_groups[1] '*', ndim 2..2: weight_decay 0.1, lr x 1 (3 parameters)\n");
}

static void test_print_units_prints_the_resolved_optimizer_settings(void) {
    fsdp_optimizer_desc opt;
    memset(&opt, 0, sizeof opt);
    opt.kind = FSDP_ADAMW;
    opt.beta2 = 0.95f;
    start_one_rank(&opt);
    printed[0] = '\0';
    fsdp_print_units(ctx, keep_line, NULL);
    assert_says(printed, "\noptimizer AdamW: lr 0.001, betas (0.9, 0.95), eps 1e-08, weight_decay 0.01 (AdamW's default: "
                         "set .weight_decay = FSDP_NO_WEIGHT_DECAY for none), state f32\n");
}

int main(void) {
    int rc;
    results = (run_result *)map_shared(sizeof(run_result) * CHANGES * (MAX_WORLD + 1) * MAX_WORLD);
    if (make_temp_dir(offload_dir, sizeof offload_dir, "test-optimizer-settings") != 0) {
        perror("mkdtemp");
        return 1;
    }
    UNITY_BEGIN();
    RUN_TEST(test_adamw_with_no_weight_decay_leaves_weights_with_zero_gradient_bitwise_unchanged);
    RUN_TEST(test_adamw_with_weight_decay_set_and_zero_leaves_weights_with_zero_gradient_bitwise_unchanged);
    RUN_TEST(test_adamw_with_weight_decay_left_at_zero_decays_by_the_default_0_01);
    RUN_TEST(test_init_logs_adamws_default_weight_decay_and_how_to_have_none);
    RUN_TEST(test_init_logs_no_weight_decay_when_asked_for_none);
    RUN_TEST(test_init_logs_sgd_settings_as_given);
    RUN_TEST(test_print_units_prints_the_resolved_optimizer_settings);
    RUN_TEST(test_training_without_a_change_gives_the_bits_of_the_reference_at_1_2_3_ranks);
    RUN_TEST(test_set_optimizer_between_steps_gives_the_bits_of_a_reference_changed_at_that_step_at_1_2_3_ranks);
    RUN_TEST(test_set_param_group_between_steps_gives_the_bits_of_a_reference_changed_at_that_step_at_1_2_3_ranks);
    RUN_TEST(test_set_optimizer_and_group_while_an_offloaded_update_runs_behind_give_the_reference_bits);
    RUN_TEST(test_set_optimizer_of_another_kind_is_refused_the_state_cannot_change_shape);
    RUN_TEST(test_set_optimizer_with_another_state_dtype_is_refused);
    RUN_TEST(test_set_optimizer_giving_sgd_momentum_where_init_had_none_is_refused);
    RUN_TEST(test_set_optimizer_with_invalid_betas_is_refused_with_fsdp_inits_message);
    RUN_TEST(test_set_optimizer_during_an_iteration_returns_state_error_and_changes_nothing);
    RUN_TEST(test_set_optimizer_zero_fields_take_the_defaults_as_fsdp_init_does);
    RUN_TEST(test_set_param_group_with_another_pattern_is_refused_naming_both);
    RUN_TEST(test_set_param_group_that_does_not_exist_is_refused_naming_the_count);
    RUN_TEST(test_set_param_group_with_negative_weight_decay_is_refused_with_fsdp_inits_message);
    RUN_TEST(test_set_param_group_during_an_iteration_returns_state_error);
    RUN_TEST(test_print_units_prints_each_param_group_with_its_current_settings);
    rc = UNITY_END();
    remove_tree(offload_dir);
    return rc;
}
