/* test_optimizer_settings.c - specification of the optimizer's settings as a user meets them
   (issue 36: a port of llm.c, whose AdamW has no weight decay, silently got PyTorch's 0.01):
   FSDP_NO_WEIGHT_DECAY means exactly no decay where a zero field takes AdamW's default;
   fsdp_init logs the settings it resolved and where the weight decay came from, and
   fsdp_print_units prints them.

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
#define FSDP_IMPLEMENTATION
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

static void assert_says(const char *text, const char *part) {
    copy_text(message, sizeof message, "expected '");
    append_text(message, sizeof message, part);
    append_text(message, sizeof message, "' in: \"");
    append_text(message, sizeof message, text ? text : "(null)");
    append_text(message, sizeof message, "\"");
    TEST_ASSERT_NOT_NULL_MESSAGE(text, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(text, part), message);
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
    UNITY_BEGIN();
    RUN_TEST(test_adamw_with_no_weight_decay_leaves_weights_with_zero_gradient_bitwise_unchanged);
    RUN_TEST(test_adamw_with_weight_decay_set_and_zero_leaves_weights_with_zero_gradient_bitwise_unchanged);
    RUN_TEST(test_adamw_with_weight_decay_left_at_zero_decays_by_the_default_0_01);
    RUN_TEST(test_init_logs_adamws_default_weight_decay_and_how_to_have_none);
    RUN_TEST(test_init_logs_no_weight_decay_when_asked_for_none);
    RUN_TEST(test_init_logs_sgd_settings_as_given);
    RUN_TEST(test_print_units_prints_the_resolved_optimizer_settings);
    return UNITY_END();
}
