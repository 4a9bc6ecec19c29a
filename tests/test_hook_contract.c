/* test_hook_contract.c - specification of the hooks' contract as a user meets it (issue 36: a
   port of llm.c's train_gpt2.c): the root unit keeps its parameters from its forward to its
   backward under every strategy, and fsdp_unit_info and fsdp_print_units say which unit is the
   root and which units post_forward reshards.

   The model is tests/test_mlp.h's: the root holds `scale`, layers.0 .. layers.2 are Linear units
   (FSDP_WRAP_TYPES {"Linear"}). Single-rank tests run in this process on a communicator of one
   rank (tearDown releases it); the two-rank tests fork ranks with fsdp_launch_ex, which write
   what they saw into a MAP_SHARED board, and only the parent asserts.

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_hook_contract.c tests/unity/unity.c -o /tmp/thc -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"
#include "test_mlp.h"

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

/* A one-rank context over `net` with the given strategy for every unit. */
static void start_one_rank(fsdp_strategy strategy) {
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&net));
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm1, "test-hook-contract"));
    d = desc_for(comm1, strategy);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, net.model, &d), fsdp_last_error(NULL));
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

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_unit_info_under_full_shard_every_unit_but_the_root_reshards_after_forward);
    RUN_TEST(test_unit_info_under_hybrid_shard_every_unit_but_the_root_reshards_after_forward);
    RUN_TEST(test_unit_info_under_shard_grad_op_no_unit_reshards_after_forward);
    RUN_TEST(test_unit_info_under_no_shard_no_unit_reshards_after_forward);
    RUN_TEST(test_print_units_shows_the_root_kept_after_forward_and_the_other_units_resharded);
    RUN_TEST(test_print_units_under_shard_grad_op_shows_every_unit_kept);
    RUN_TEST(test_root_unit_keeps_its_parameters_from_post_forward_to_post_backward_at_2_ranks);
    return UNITY_END();
}
