/* test_hook_contract.c - specification of the hooks' contract as a user meets it (issue 36: a
   port of llm.c's train_gpt2.c): the root unit keeps its parameters from its forward to its
   backward under every strategy, and fsdp_unit_info and fsdp_print_units say which unit is the
   root and which units post_forward reshards. Misuse is loud: fsdp_param, fsdp_param_raw and
   fsdp_grad called where their unit has nothing to give return NULL with a message naming the
   parameter, its unit, the unit's state and the hook to call; a hook called out of order returns
   FSDP_ERR_STATE; either is logged as a warning once per context, and with FSDP_DEBUG >= 1 the
   process aborts at the call with the message. The port's mistakes get messages that name their
   fix: the root's hooks left out, a forward-only pass (validation, sampling) not ended by
   fsdp_finish_backward before the next forward.

   The model is tests/test_mlp.h's: the root holds `scale`, layers.0 .. layers.2 are Linear units
   (FSDP_WRAP_TYPES {"Linear"}). Single-rank tests run in this process on a communicator of one
   rank (tearDown releases it); the two-rank tests fork ranks with fsdp_launch_ex, which write
   what they saw into a MAP_SHARED board, and only the parent asserts.

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_hook_contract.c tests/unity/unity.c -o /tmp/thc -lpthread -lm */
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

#include <sys/resource.h>

#define LAUNCH_TIMEOUT_MS 20000 /* bound on any wait for another rank; only reached on a hang */

static char message[2048];
static const char *const linear_types[] = {"Linear", NULL};

/* ---------------------------------------------------------------------------------------------
   fixtures: the model on a one-rank communicator
   --------------------------------------------------------------------------------------------- */
static fsdp_comm *comm1;
static fsdp_ctx *ctx;
static mlp net;

void setUp(void) {}

void tearDown(void) {
    release_one_rank(&ctx, &net.model, &comm1);
    memset(&net, 0, sizeof net);
    unmap_board();
}

static fsdp_desc desc_for(fsdp_comm *comm, fsdp_strategy strategy) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = strategy;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = linear_types;
    return d;
}

/* What the context logged (a logger of the test's): its warnings, one per line. */
static char warnings[4096];
static int num_warnings;
static void keep_warning(void *user, fsdp_log_level level, const char *line) {
    (void)user;
    if (level != FSDP_LOG_WARN) return;
    num_warnings++;
    append_text(warnings, sizeof warnings, line);
    append_text(warnings, sizeof warnings, "\n");
}

/* A one-rank context over `net` with the given strategy for every unit and optimizer, logging its
   warnings into `warnings`. */
static void start_one_rank_with(fsdp_strategy strategy, fsdp_optimizer_kind optimizer) {
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&net));
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm1, "test-hook-contract"));
    d = desc_for(comm1, strategy);
    d.optimizer.kind = optimizer;
    d.logger.fn = keep_warning;
    warnings[0] = '\0';
    num_warnings = 0;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
}

static void start_one_rank(fsdp_strategy strategy) { start_one_rank_with(strategy, FSDP_OPTIMIZER_DEFAULT); }

/* Forward of the root and of layers.0 .. layers.2 (each opened and closed). */
static void forward_pass(fsdp_ctx *c, const mlp *m) {
    int l;
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(c, 0));
    for (l = 0; l < 3; l++) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(c, m->layer[l]));
        TEST_ASSERT_NOT_NULL(fsdp_param(c, m->param[P_W0 + 2 * l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(c, m->layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_forward(c, 0));
}

static void backward_pass(fsdp_ctx *c, const mlp *m) {
    int l;
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(c, 0));
    for (l = 2; l >= 0; l--) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(c, m->layer[l]));
        TEST_ASSERT_NOT_NULL(fsdp_grad(c, m->param[P_W0 + 2 * l]));
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(c, m->layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(c, 0));
}

/* ---------------------------------------------------------------------------------------------
   the root unit, and which units reshard after forward
   --------------------------------------------------------------------------------------------- */
/* fsdp_unit_info of every unit under one strategy: is_root and reshard_after_forward as
   expected (reshard: what every unit but the root should say). */
static void assert_units_say(fsdp_strategy strategy, int reshard) {
    int u;
    start_one_rank(strategy);
    TEST_ASSERT_EQUAL_INT(4, fsdp_num_units(ctx));
    for (u = 0; u < 4; u++) {
        fsdp_unit_info info;
        memset(&info, 0x5a, sizeof info);
        TEST_ASSERT_EQUAL_INT(0, fsdp_unit_info_get(ctx, u, &info));
        snprintf(message, sizeof message, "%s, unit %d ('%s')", fsdp_strategy_name(strategy), u, info.name);
        TEST_ASSERT_EQUAL_INT_MESSAGE(u == 0, info.is_root, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(u == 0 ? 0 : reshard, info.reshard_after_forward, message);
    }
}

static void test_unit_info_under_full_shard_every_unit_but_the_root_reshards_after_forward(void) {
    assert_units_say(FSDP_FULL_SHARD, 1);
}
static void test_unit_info_under_hybrid_shard_every_unit_but_the_root_reshards_after_forward(void) {
    assert_units_say(FSDP_HYBRID_SHARD, 1);
}
static void test_unit_info_under_shard_grad_op_no_unit_reshards_after_forward(void) {
    assert_units_say(FSDP_SHARD_GRAD_OP, 0);
}
static void test_unit_info_under_no_shard_no_unit_reshards_after_forward(void) { assert_units_say(FSDP_NO_SHARD, 0); }

static char printed[4096];
static void keep_line(void *user, const char *line) {
    (void)user;
    append_text(printed, sizeof printed, line);
    append_text(printed, sizeof printed, "\n");
}

/* The line of unit u in `printed` (it starts with the unit's number), copied into out. */
static void unit_line(int u, char *out, size_t size) {
    char head[16];
    const char *at = printed;
    snprintf(head, sizeof head, "%d ", u);
    out[0] = '\0';
    while (at && *at) {
        const char *end = strchr(at, '\n');
        if (strncmp(at, head, strlen(head)) == 0) {
            snprintf(out, size, "%.*s", (int)(end ? end - at : (long)strlen(at)), at);
            return;
        }
        at = end ? end + 1 : NULL;
    }
}

static void test_print_units_shows_the_root_kept_after_forward_and_the_other_units_resharded(void) {
    char line[512];
    int u;
    start_one_rank(FSDP_FULL_SHARD);
    printed[0] = '\0';
    fsdp_print_units(ctx, keep_line, NULL);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(printed, "after forward"), printed);
    unit_line(0, line, sizeof line);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(line, "kept (root)"), printed);
    for (u = 1; u < 4; u++) {
        unit_line(u, line, sizeof line);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(line, "resharded"), printed);
    }
}

static void test_print_units_under_shard_grad_op_shows_every_unit_kept(void) {
    char line[512];
    int u;
    start_one_rank(FSDP_SHARD_GRAD_OP);
    printed[0] = '\0';
    fsdp_print_units(ctx, keep_line, NULL);
    for (u = 1; u < 4; u++) {
        unit_line(u, line, sizeof line);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(line, "kept"), printed);
        TEST_ASSERT_NULL_MESSAGE(strstr(line, "resharded"), printed);
    }
}

/* Two ranks under FULL_SHARD (where resharding really frees the gathered copy): after
   fsdp_post_forward(ctx, 0) the root's parameter is still readable, with the values it had in
   forward, until its post_backward. */
typedef struct root_report {
    int rc;
    int readable_after_post_forward, same_values, readable_in_backward;
    char error[600];
} root_report;

static int root_kept_rank(fsdp_comm *comm, void *arg) {
    root_report *r = (root_report *)board_memory + fsdp_comm_rank(comm);
    fsdp_ctx *c = NULL;
    mlp m;
    fsdp_desc d;
    float in_forward[IN];
    const float *p;
    int l;
    (void)arg;
    if (mlp_build(&m) != 0) return 2;
    d = desc_for(comm, FSDP_FULL_SHARD);
    if ((r->rc = fsdp_init(&c, m.model, &d)) != 0) {
        snprintf(r->error, sizeof r->error, "fsdp_init: %s", fsdp_last_error(NULL));
        return 3;
    }
    r->rc = fsdp_pre_forward(c, 0);
    if (!r->rc && (p = fsdp_param(c, m.param[P_SCALE])) != NULL) memcpy(in_forward, p, sizeof in_forward);
    for (l = 0; l < 3 && !r->rc; l++)
        if ((r->rc = fsdp_pre_forward(c, m.layer[l])) == 0) r->rc = fsdp_post_forward(c, m.layer[l]);
    if (!r->rc) r->rc = fsdp_post_forward(c, 0);
    p = r->rc ? NULL : fsdp_param(c, m.param[P_SCALE]);
    r->readable_after_post_forward = p != NULL;
    r->same_values = p && memcmp(p, in_forward, sizeof in_forward) == 0;
    if (!r->rc) r->rc = fsdp_pre_backward(c, 0);
    for (l = 2; l >= 0 && !r->rc; l--)
        if ((r->rc = fsdp_pre_backward(c, m.layer[l])) == 0) r->rc = fsdp_post_backward(c, m.layer[l]);
    r->readable_in_backward = !r->rc && fsdp_param(c, m.param[P_SCALE]) != NULL;
    if (!r->rc) r->rc = fsdp_post_backward(c, 0);
    if (!r->rc) r->rc = fsdp_step(c, 0, NULL);
    if (r->rc) copy_text(r->error, sizeof r->error, fsdp_last_error(c));
    fsdp_destroy(c);
    fsdp_model_destroy(m.model);
    return r->rc ? 4 : 0;
}

static void test_root_unit_keeps_its_parameters_from_post_forward_to_post_backward_at_2_ranks(void) {
    fsdp_launch_status st;
    root_report *reports = (root_report *)map_board(2 * sizeof(root_report));
    int rc = launch_ranks(2, FSDP_BACKEND_SHM, LAUNCH_TIMEOUT_MS, root_kept_rank, NULL, &st), r;
    snprintf(message, sizeof message, "%s | rank 0: %s | rank 1: %s", st.message, reports[0].error, reports[1].error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    for (r = 0; r < 2; r++) {
        TEST_ASSERT_TRUE_MESSAGE(reports[r].readable_after_post_forward, "fsdp_param(scale) after post_forward(root)");
        TEST_ASSERT_TRUE_MESSAGE(reports[r].same_values, "the root's values after its post_forward");
        TEST_ASSERT_TRUE_MESSAGE(reports[r].readable_in_backward, "fsdp_param(scale) in backward");
    }
}

/* ---------------------------------------------------------------------------------------------
   misuse: accessors outside their unit's hooks
   --------------------------------------------------------------------------------------------- */
static void test_param_before_its_units_pre_forward_returns_null_naming_parameter_unit_state_and_hook(void) {
    char hook[64];
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_NULL(fsdp_param(ctx, net.param[P_W1]));
    snprintf(hook, sizeof hook, "call fsdp_pre_forward(ctx, %d) first", net.layer[1]);
    assert_says(fsdp_last_error(ctx), "fsdp_param(ctx, 3 'layers.1.weight')");
    assert_says(fsdp_last_error(ctx), "unit 2 'layers.1'");
    assert_says(fsdp_last_error(ctx), "is sharded (not gathered)");
    assert_says(fsdp_last_error(ctx), hook);
}

/* The port's mistake: the root's hooks left out, the layers' hooks called; the embeddings (here
   `scale`) belong to the root, which nobody gathered. */
static void test_param_of_the_root_with_its_hooks_left_out_names_fsdp_pre_forward_of_module_0(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[0]));
    TEST_ASSERT_NOT_NULL(fsdp_param(ctx, net.param[P_W0]));
    TEST_ASSERT_NULL(fsdp_param(ctx, net.param[P_SCALE]));
    assert_says(fsdp_last_error(ctx), "fsdp_param(ctx, 0 'scale'): unit 0 (root) is sharded (not gathered)");
    assert_says(fsdp_last_error(ctx), "call fsdp_pre_forward(ctx, 0) first");
    assert_says(fsdp_last_error(ctx), "the root unit's hooks wrap the whole forward and the whole backward");
}

/* One rank as many: a unit resharded by its post_forward has no weights to give until its
   pre_backward (before, one rank computed on the master and kept giving them). */
static void test_param_after_post_forward_under_full_shard_returns_null_naming_fsdp_pre_backward(void) {
    char hook[64];
    start_one_rank(FSDP_FULL_SHARD);
    forward_pass(ctx, &net);
    TEST_ASSERT_NOT_NULL(fsdp_param(ctx, net.param[P_SCALE])); /* the root keeps its parameters */
    TEST_ASSERT_NULL(fsdp_param(ctx, net.param[P_B2]));
    snprintf(hook, sizeof hook, "in backward, call fsdp_pre_backward(ctx, %d) first", net.layer[2]);
    assert_says(fsdp_last_error(ctx), "fsdp_param(ctx, 6 'layers.2.bias'): unit 3 'layers.2' is sharded");
    assert_says(fsdp_last_error(ctx), "its fsdp_post_forward resharded it (FULL_SHARD)");
    assert_says(fsdp_last_error(ctx), hook);
}

static void test_param_raw_outside_its_units_hooks_returns_null_naming_the_hook(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_NULL(fsdp_param_raw(ctx, net.param[P_SCALE]));
    assert_says(fsdp_last_error(ctx), "fsdp_param_raw(ctx, 0 'scale'): unit 0 (root) is sharded");
    assert_says(fsdp_last_error(ctx), "fsdp_pre_forward(ctx, 0)");
}

static void test_grad_in_forward_returns_null_naming_fsdp_pre_backward(void) {
    char hooks[128];
    start_one_rank(FSDP_SHARD_GRAD_OP);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_forward(ctx, net.layer[0]));
    TEST_ASSERT_NULL(fsdp_grad(ctx, net.param[P_W0]));
    snprintf(hooks, sizeof hooks, "gradients exist from fsdp_pre_backward(ctx, %d) to fsdp_post_backward(ctx, %d)",
             net.layer[0], net.layer[0]);
    assert_says(fsdp_last_error(ctx), "fsdp_grad(ctx, 1 'layers.0.weight'): unit 1 'layers.0' is in its forward");
    assert_says(fsdp_last_error(ctx), hooks);
}

/* Documented: a frozen parameter has no gradient; asking is no misuse. */
static void test_grad_of_a_frozen_parameter_returns_null_without_message_or_warning(void) {
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&net));
    TEST_ASSERT_EQUAL_INT(0, fsdp_model_param_set_trainable(net.model, net.param[P_B0], 0));
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm1, "test-hook-contract"));
    d = desc_for(comm1, FSDP_FULL_SHARD);
    d.logger.fn = keep_warning;
    num_warnings = 0;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
    forward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(ctx, 0));
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(ctx, net.layer[0]));
    TEST_ASSERT_NULL(fsdp_grad(ctx, net.param[P_B0]));
    TEST_ASSERT_EQUAL_STRING("", fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT(0, num_warnings);
}

static void test_param_of_a_parameter_that_does_not_exist_names_its_index_and_the_count(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_NULL(fsdp_param(ctx, 99));
    assert_says(fsdp_last_error(ctx), "fsdp_param(ctx, 99): no such parameter (the model has 7)");
    TEST_ASSERT_NULL(fsdp_grad(ctx, -1));
    assert_says(fsdp_last_error(ctx), "fsdp_grad(ctx, -1): no such parameter");
}

/* The other calls that took a bad argument in silence now say what was wrong. */
static void test_set_lr_of_a_negative_value_returns_invalid_arg_naming_it(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_lr(ctx, -0.5f));
    assert_says(fsdp_last_error(ctx), "fsdp_set_lr: lr -0.5 must be >= 0 and finite");
}

static void test_set_param_of_a_parameter_that_does_not_exist_returns_invalid_arg_naming_it(void) {
    float values[8] = {0};
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_param_shard(ctx, 42, values));
    assert_says(fsdp_last_error(ctx), "fsdp_set_param_shard(ctx, 42, slice): no such parameter");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_set_param_full(ctx, net.param[P_SCALE], NULL));
    assert_says(fsdp_last_error(ctx), "rank 0 must pass the full value");
}

static void test_unit_info_of_a_unit_that_does_not_exist_returns_invalid_arg_naming_it_and_the_range(void) {
    fsdp_unit_info info;
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_unit_info_get(ctx, 4, &info));
    assert_says(fsdp_last_error(ctx), "fsdp_unit_info_get(ctx, 4, info): no such unit (the context has 4 units: 0..3)");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_unit_info_get(ctx, -1, &info));
    assert_says(fsdp_last_error(ctx), "fsdp_unit_info_get(ctx, -1, info): no such unit");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_unit_info_get(ctx, 0, NULL));
    assert_says(fsdp_last_error(ctx), "fsdp_unit_info_get(ctx, 0, NULL): info is NULL");
}

static void test_param_info_of_a_parameter_that_does_not_exist_returns_invalid_arg_naming_it_and_the_range(void) {
    fsdp_param_info info;
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_param_info_get(ctx, 42, &info));
    assert_says(fsdp_last_error(ctx),
                "fsdp_param_info_get(ctx, 42, info): no such parameter (the model has 7 parameters: 0..6)");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_param_info_get(ctx, 1, NULL));
    assert_says(fsdp_last_error(ctx), "fsdp_param_info_get(ctx, 1, NULL): info is NULL");
}

/* Every misuse replaces the context's error; only the first is logged, as a warning. */
static void test_misuse_is_logged_as_a_warning_once_per_context(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_NULL(fsdp_param(ctx, net.param[P_W1]));
    TEST_ASSERT_NULL(fsdp_grad(ctx, net.param[P_W2]));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_post_backward(ctx, net.layer[2]));
    TEST_ASSERT_NULL(fsdp_param(ctx, net.param[P_B1]));
    assert_says(fsdp_last_error(ctx), "fsdp_param(ctx, 4 'layers.1.bias')");
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, num_warnings, warnings);
    assert_says(warnings, "fsdp_param(ctx, 3 'layers.1.weight'): unit 2 'layers.1' is sharded (not gathered)");
    assert_says(warnings, "FSDP_DEBUG=1");
}

static void test_hook_out_of_order_is_logged_as_a_warning(void) {
    start_one_rank(FSDP_FULL_SHARD);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_post_forward(ctx, net.layer[1]));
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, num_warnings, warnings);
    assert_says(warnings, "post_forward of module 'layers.1'");
}

/* The port's mistake: a forward-only pass (validation, sampling) after a training step, not
   ended by fsdp_finish_backward, then the next training step's forward, written without
   checking results: the hook refuses, and the weights it should have gathered are missing. Both
   messages name the fix. */
static void test_forward_only_pass_without_finish_backward_then_forward_names_fsdp_finish_backward(void) {
    start_one_rank(FSDP_FULL_SHARD);
    forward_pass(ctx, &net);
    backward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(0, fsdp_step(ctx, 0, NULL));
    forward_pass(ctx, &net); /* validation: no backward, no fsdp_finish_backward */
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_pre_forward(ctx, 0));
    assert_says(fsdp_last_error(ctx), "fsdp_finish_backward(ctx) before the next forward");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_pre_forward(ctx, net.layer[0])); /* (unchecked) */
    TEST_ASSERT_NULL(fsdp_param(ctx, net.param[P_W0]));
    assert_says(fsdp_last_error(ctx), "fsdp_param(ctx, 1 'layers.0.weight'): unit 1 'layers.0' is sharded");
    assert_says(fsdp_last_error(ctx), "the last hook call failed: pre_forward of unit 'layers.0'");
    assert_says(fsdp_last_error(ctx), "end a forward-only pass (validation, sampling) with fsdp_finish_backward(ctx)");
}

/* The same mistake, done right: fsdp_finish_backward ends the pass and training goes on. */
static void test_forward_only_pass_ended_by_finish_backward_then_training_step_succeeds(void) {
    start_one_rank(FSDP_FULL_SHARD);
    forward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(0, fsdp_finish_backward(ctx));
    forward_pass(ctx, &net);
    backward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_step(ctx, 0, NULL), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT(0, num_warnings);
}

/* ---------------------------------------------------------------------------------------------
   fsdp_step needs a backward since the last step (torch.optim skips parameters whose grad is
   None): AdamW, whose weight decay would move the weights even with zero gradients
   --------------------------------------------------------------------------------------------- */
/* A training iteration's forward and backward, every gradient element += 0.01. */
static void train_pass(fsdp_ctx *c, const mlp *m) {
    int l, p, i;
    forward_pass(c, m);
    TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(c, 0));
    for (l = 2; l >= 0; l--) {
        TEST_ASSERT_EQUAL_INT(0, fsdp_pre_backward(c, m->layer[l]));
        for (p = P_W0 + 2 * l; p <= P_B0 + 2 * l; p++) {
            float *g = fsdp_grad(c, m->param[p]);
            TEST_ASSERT_NOT_NULL(g);
            for (i = 0; i < param_numel[p]; i++) g[i] += 0.01f;
        }
        TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(c, m->layer[l]));
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp_post_backward(c, 0));
}

/* Every parameter's full value, concatenated (NELEM floats). */
static void read_weights(float *out) {
    int p;
    for (p = 0; p < NPARAMS; p++)
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_gather_param(ctx, net.param[p], out + param_offset[p]), fsdp_last_error(ctx));
}

static void test_step_after_a_forward_only_pass_returns_state_error_naming_fsdp_step(void) {
    start_one_rank_with(FSDP_FULL_SHARD, FSDP_ADAMW);
    forward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_step(ctx, 0, NULL));
    assert_says(fsdp_last_error(ctx), "fsdp_step: no backward ran since the last fsdp_step");
    assert_says(fsdp_last_error(ctx), "nothing applied");
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, num_warnings, warnings); /* a misuse, warned as the hooks' are */
    assert_says(warnings, "fsdp_step: no backward ran");
}

/* Since init and since a step: the weights keep their bits, and Adam's step count does not move. */
static void test_step_after_a_forward_only_pass_leaves_weights_bit_identical_and_the_step_count(void) {
    float before[NELEM], after[NELEM];
    fsdp_step_report report;
    start_one_rank_with(FSDP_FULL_SHARD, FSDP_ADAMW);
    read_weights(before);
    forward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_step(ctx, 0, &report));
    read_weights(after);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(before, after, sizeof before, "weights after init, a forward-only pass and a step");
    train_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_step(ctx, 0, &report), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT64(1, report.step);
    read_weights(before);
    forward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_step(ctx, 0, &report));
    read_weights(after);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(before, after, sizeof before, "weights after a step, a forward-only pass and a step");
    train_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_step(ctx, 0, &report), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT64(2, report.step);
}

/* fsdp_zero_grad is torch's zero_grad(set_to_none=True): a step after it has nothing to apply. */
static void test_step_after_zero_grad_without_a_new_backward_returns_state_error_and_changes_nothing(void) {
    float before[NELEM], after[NELEM];
    start_one_rank_with(FSDP_FULL_SHARD, FSDP_ADAMW);
    train_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_finish_backward(ctx), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_zero_grad(ctx), fsdp_last_error(ctx));
    read_weights(before);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_STATE, fsdp_step(ctx, 0, NULL));
    read_weights(after);
    TEST_ASSERT_EQUAL_MEMORY(before, after, sizeof before);
}

/* Gradient accumulation: micro-steps under no_sync, an evaluation pass among them, then the step. */
static void test_step_after_no_sync_micro_steps_and_an_evaluation_pass_applies_the_update(void) {
    float before[NELEM], after[NELEM];
    fsdp_step_report report;
    start_one_rank_with(FSDP_FULL_SHARD, FSDP_ADAMW);
    read_weights(before);
    TEST_ASSERT_EQUAL_INT(0, fsdp_set_no_sync(ctx, 1));
    train_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT(0, fsdp_set_no_sync(ctx, 0));
    train_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_finish_backward(ctx), fsdp_last_error(ctx));
    forward_pass(ctx, &net);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_finish_backward(ctx), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_step(ctx, 0, &report), fsdp_last_error(ctx));
    TEST_ASSERT_EQUAL_INT64(1, report.step);
    read_weights(after);
    TEST_ASSERT_TRUE_MESSAGE(memcmp(before, after, sizeof before) != 0, "the step changed no weight");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, num_warnings, warnings);
}

/* ---------------------------------------------------------------------------------------------
   misuse under FSDP_DEBUG: the process aborts at the call, printing the message
   --------------------------------------------------------------------------------------------- */
typedef struct misuse_child {
    const char *debug; /* FSDP_DEBUG's value in the child */
    int hook;          /* 1: the misuse is a hook out of order; 2: fsdp_step after a forward-only pass;
                          0: fsdp_param outside the hooks */
    char log[256];     /* its stderr goes there */
} misuse_child;

/* The child: FSDP_DEBUG set, stderr to a file, no core file; one misuse. Returns 0 if the process
   went on (no abort), 1..3 if its set-up failed. */
static int misuse_in_child(void *arg) {
    misuse_child *mc = (misuse_child *)arg;
    struct rlimit no_core = {0, 0};
    fsdp_comm *comm = NULL;
    fsdp_ctx *c = NULL;
    fsdp_desc d;
    mlp m;
    FILE *err = freopen(mc->log, "w", stderr);
    if (!err) return 1;
    setrlimit(RLIMIT_CORE, &no_core);
    setenv("FSDP_DEBUG", mc->debug, 1);
    if (mlp_build(&m) != 0 || open_one_rank_comm(&comm, "test-hook-contract-abort") != 0) return 2;
    d = desc_for(comm, FSDP_FULL_SHARD);
    if (fsdp_init(&c, m.model, &d) != 0) return 3;
    if (mc->hook == 2) { /* (no checks: the test reads what the child printed) */
        fsdp_pre_forward(c, 0);
        fsdp_post_forward(c, 0);
        fsdp_step(c, 0, NULL);
    } else if (mc->hook) fsdp_post_forward(c, m.layer[1]);
    else fsdp_param(c, m.param[P_W1]);
    fsdp_destroy(c);
    fsdp_comm_destroy(comm);
    fsdp_model_destroy(m.model);
    return 0;
}

/* Runs misuse_in_child; the child's wait status and what it printed. */
static int run_misuse_child(misuse_child *mc, char *printed_out, size_t size) {
    int status = 0;
    unsigned char *bytes;
    size_t n;
    char dir[256];
    make_test_dir(dir, sizeof dir, "test-hook-contract");
    snprintf(mc->log, sizeof mc->log, "%.200s/stderr", dir);
    TEST_ASSERT_TRUE_MESSAGE(wait_child(spawn(misuse_in_child, mc, 20), 20000, &status), "the child hung");
    bytes = read_whole_file(mc->log, &n);
    copy_text(printed_out, size, (const char *)bytes);
    free(bytes);
    remove_tree(dir);
    return status;
}

/* A child misusing under FSDP_DEBUG=debug (a hook, or fsdp_param): aborted (SIGABRT) printing
   `says`, or (says NULL) went on and exited 0. */
static void assert_misuse_child(const char *debug, int hook, const char *says) {
    misuse_child mc;
    char out[2048];
    int status;
    memset(&mc, 0, sizeof mc);
    mc.debug = debug;
    mc.hook = hook;
    status = run_misuse_child(&mc, out, sizeof out);
    snprintf(message, sizeof message, "FSDP_DEBUG=%s: wait status 0x%x, stderr: ", debug, (unsigned)status);
    append_text(message, sizeof message, out);
    if (!says) {
        TEST_ASSERT_TRUE_MESSAGE(WIFEXITED(status) && WEXITSTATUS(status) == 0, message);
        return;
    }
    TEST_ASSERT_TRUE_MESSAGE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, message);
    assert_says(out, says);
}

static void test_param_outside_the_hooks_under_fsdp_debug_1_aborts_printing_the_message(void) {
    assert_misuse_child("1", 0, "fsdp_param(ctx, 3 'layers.1.weight'): unit 2 'layers.1' is sharded (not gathered)");
}
static void test_hook_out_of_order_under_fsdp_debug_2_aborts_printing_the_message(void) {
    assert_misuse_child("2", 1, "post_forward of module 'layers.1'");
}
static void test_step_after_a_forward_only_pass_under_fsdp_debug_1_aborts_printing_the_message(void) {
    assert_misuse_child("1", 2, "fsdp_step: no backward ran since the last fsdp_step");
}
static void test_param_outside_the_hooks_under_fsdp_debug_0_returns_null_and_goes_on(void) {
    assert_misuse_child("0", 0, NULL);
}

int main(void) {
    unsetenv("FSDP_DEBUG"); /* misuse here is on purpose: only the children of the abort tests set it */
    UNITY_BEGIN();
    RUN_TEST(test_unit_info_under_full_shard_every_unit_but_the_root_reshards_after_forward);
    RUN_TEST(test_unit_info_under_hybrid_shard_every_unit_but_the_root_reshards_after_forward);
    RUN_TEST(test_unit_info_under_shard_grad_op_no_unit_reshards_after_forward);
    RUN_TEST(test_unit_info_under_no_shard_no_unit_reshards_after_forward);
    RUN_TEST(test_print_units_shows_the_root_kept_after_forward_and_the_other_units_resharded);
    RUN_TEST(test_print_units_under_shard_grad_op_shows_every_unit_kept);
    RUN_TEST(test_root_unit_keeps_its_parameters_from_post_forward_to_post_backward_at_2_ranks);
    RUN_TEST(test_param_before_its_units_pre_forward_returns_null_naming_parameter_unit_state_and_hook);
    RUN_TEST(test_param_of_the_root_with_its_hooks_left_out_names_fsdp_pre_forward_of_module_0);
    RUN_TEST(test_param_after_post_forward_under_full_shard_returns_null_naming_fsdp_pre_backward);
    RUN_TEST(test_param_raw_outside_its_units_hooks_returns_null_naming_the_hook);
    RUN_TEST(test_grad_in_forward_returns_null_naming_fsdp_pre_backward);
    RUN_TEST(test_grad_of_a_frozen_parameter_returns_null_without_message_or_warning);
    RUN_TEST(test_param_of_a_parameter_that_does_not_exist_names_its_index_and_the_count);
    RUN_TEST(test_set_lr_of_a_negative_value_returns_invalid_arg_naming_it);
    RUN_TEST(test_set_param_of_a_parameter_that_does_not_exist_returns_invalid_arg_naming_it);
    RUN_TEST(test_unit_info_of_a_unit_that_does_not_exist_returns_invalid_arg_naming_it_and_the_range);
    RUN_TEST(test_param_info_of_a_parameter_that_does_not_exist_returns_invalid_arg_naming_it_and_the_range);
    RUN_TEST(test_misuse_is_logged_as_a_warning_once_per_context);
    RUN_TEST(test_hook_out_of_order_is_logged_as_a_warning);
    RUN_TEST(test_forward_only_pass_without_finish_backward_then_forward_names_fsdp_finish_backward);
    RUN_TEST(test_forward_only_pass_ended_by_finish_backward_then_training_step_succeeds);
    RUN_TEST(test_step_after_a_forward_only_pass_returns_state_error_naming_fsdp_step);
    RUN_TEST(test_step_after_a_forward_only_pass_leaves_weights_bit_identical_and_the_step_count);
    RUN_TEST(test_step_after_zero_grad_without_a_new_backward_returns_state_error_and_changes_nothing);
    RUN_TEST(test_step_after_no_sync_micro_steps_and_an_evaluation_pass_applies_the_update);
    RUN_TEST(test_param_outside_the_hooks_under_fsdp_debug_1_aborts_printing_the_message);
    RUN_TEST(test_hook_out_of_order_under_fsdp_debug_2_aborts_printing_the_message);
    RUN_TEST(test_step_after_a_forward_only_pass_under_fsdp_debug_1_aborts_printing_the_message);
    RUN_TEST(test_param_outside_the_hooks_under_fsdp_debug_0_returns_null_and_goes_on);
    return UNITY_END();
}
