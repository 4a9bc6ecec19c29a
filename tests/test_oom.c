/* test_oom.c - specification: a rank that cannot allocate the memory of a collective fails every
   rank at once, naming itself and what it could not allocate, instead of leaving the others
   waiting for it in the collective until their timeout (fsdp__agree_alloc). One test per path:
   - fsdp_init with a trace directory: the trace's state, and the buffer of its clock alignment;
   - the check of the units' order across ranks at the end of the first iteration;
   - fsdp_clip_grad_norm's gather of the ranks' sums of squares: it allocates nothing (its buffer
     is made by fsdp_init), so the allocator failing cannot stall it;
   - fsdp_load_full's check that every rank opened the same file;
   - fsdp_gather_param's gathered unit and fsdp_set_param_full's broadcast value;
   - fsdp_comm_split's sub-communicator (its final agreement, fsdp__split_agree: the peers
     return at once with an error naming the rank, not a communicator it lacks).

   The allocator below (FSDP_MALLOC) fails one allocation of a given size when armed, in the rank
   that armed it. Two ranks are forked (fsdp_launch_ex, shm, a communicator timeout of
   OOM_TIMEOUT_MS); the one out of memory stays alive after its call returns until the other's
   returned too (as a process that goes on would), so that a peer left waiting in the collective
   reaches its timeout rather than seeing the rank gone. Ranks report through a MAP_SHARED board;
   only the parent asserts.

   Build: make build/test_oom (or gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity
          tests/test_oom.c tests/unity/unity.c -lpthread -lm) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
   the allocator: armed, the next allocation of exactly fail_bytes bytes fails (once)
   --------------------------------------------------------------------------------------------- */
static size_t fail_bytes; /* atomic: 0 when disarmed */

static void *failing_malloc(size_t size) {
    size_t armed = __atomic_load_n(&fail_bytes, __ATOMIC_RELAXED);
    if (armed && size == armed && __atomic_compare_exchange_n(&fail_bytes, &armed, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return NULL;
    return malloc(size);
}

#define FSDP_MALLOC(size) failing_malloc(size)
#define FSDP_REALLOC(ptr, size) realloc(ptr, size)
#define FSDP_FREE(ptr) free(ptr)
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#define RANKS 2
#define OOM_RANK 1             /* the rank whose allocation fails */
#define OOM_TIMEOUT_MS 8000    /* the communicators' bound on any wait: a rank left waiting reaches it */
#define OOM_BOUND_MS 4000      /* every rank has returned within this (an agreement takes milliseconds) */
#define OUT 3                  /* the model: lin.weight [OUT, IN], lin.bias [OUT] */
#define IN 5

typedef struct oom_board {
    const struct oom_case *the_case; /* what the ranks of case_rank do */
    char dir[256];                 /* this test's directory (traces, checkpoints) */
    int done[RANKS], rc[RANKS];
    size_t armed_left[RANKS];      /* the armed size still armed when the call returned: nothing took it */
    double elapsed_ms[RANKS];
    char error[RANKS][1024];
    int setup_failed;
    char setup_error[1024];
} oom_board;

static char message[4096];

static int model_build(fsdp_model **out, int *weight) {
    fsdp_init_rule uniform = {FSDP_INIT_UNIFORM, -0.5f, 0.5f, NULL, NULL};
    int64_t s_weight[2] = {OUT, IN}, s_bias[1] = {OUT};
    int rc, lin;
    if ((rc = fsdp_model_create(out, "Net")) != 0) return rc;
    if ((lin = fsdp_model_module(*out, 0, "lin", "Linear")) < 0) return lin;
    if ((*weight = fsdp_model_param(*out, lin, "weight", 2, s_weight, uniform)) < 0) return *weight;
    if ((rc = fsdp_model_param(*out, lin, "bias", 1, s_bias, uniform)) < 0) return rc;
    return 0;
}

static int ctx_open(fsdp_comm *comm, fsdp_model *model, const char *trace_dir, fsdp_ctx **ctx) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.trace_dir = trace_dir;
    d.seed = 5;
    d.optimizer.kind = FSDP_SGD;
    d.optimizer.lr = 0.1f;
    return fsdp_init(ctx, model, &d);
}

static void setup_failed(oom_board *b, const char *where, int rc, const fsdp_ctx *ctx) {
    b->setup_failed = 1;
    snprintf(b->setup_error, sizeof b->setup_error, "%s: %s %s", where, fsdp_result_name(rc), fsdp_last_error(ctx));
}

/* Arms the allocator on OOM_RANK and notes when the call under test starts. */
static double arm(fsdp_comm *comm, size_t bytes) {
    if (fsdp_comm_rank(comm) == OOM_RANK) __atomic_store_n(&fail_bytes, bytes, __ATOMIC_RELAXED);
    return now_ms();
}

/* Records what the call under test returned and its message, then waits until
   every rank has (bounded: a rank that never returns is the parent's to report). */
static void report(oom_board *b, fsdp_comm *comm, int rc, double start, const char *error) {
    int rank = fsdp_comm_rank(comm), r, all_done = 0;
    double deadline = now_ms() + 3 * OOM_TIMEOUT_MS;
    b->armed_left[rank] = __atomic_exchange_n(&fail_bytes, 0, __ATOMIC_RELAXED);
    b->elapsed_ms[rank] = now_ms() - start;
    b->rc[rank] = rc;
    snprintf(b->error[rank], sizeof b->error[rank], "%s", error);
    __atomic_store_n(&b->done[rank], 1, __ATOMIC_RELEASE);
    while (!all_done && now_ms() < deadline) {
        for (all_done = 1, r = 0; r < RANKS; r++) all_done &= __atomic_load_n(&b->done[r], __ATOMIC_ACQUIRE);
        if (!all_done) sleep_ms(5);
    }
}

/* ---------------------------------------------------------------------------------------------
   the cases: what is set up, which allocation fails, the call under test
   --------------------------------------------------------------------------------------------- */
typedef struct oom_case {
    int traced;                                  /* the call under test is fsdp_init with a trace directory */
    int (*prepare)(fsdp_ctx *ctx, const char *dir); /* before the allocator is armed (NULL: nothing) */
    size_t (*bytes)(fsdp_ctx *ctx, int weight);  /* the size of the allocation that fails */
    int (*call)(fsdp_ctx *ctx, int weight, const char *dir);
} oom_case;

static int this_rank; /* (set by case_rank in each forked rank) */

static void checkpoint_path(char *path, size_t size, const char *dir) { snprintf(path, size, "%s/model.safetensors", dir); }

/* A forward pass without backward (an evaluation), as far as its last hook (lin: module 1). */
static int forward_pass(fsdp_ctx *ctx, const char *dir) {
    int rc;
    (void)dir;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0 || (rc = fsdp_pre_forward(ctx, 1)) != 0 || (rc = fsdp_post_forward(ctx, 1)) != 0 ||
        (rc = fsdp_post_forward(ctx, 0)) != 0)
        return rc;
    return 0;
}

static int save_checkpoint(fsdp_ctx *ctx, const char *dir) {
    char path[300];
    checkpoint_path(path, sizeof path, dir);
    return fsdp_save_full(ctx, path, NULL);
}

static size_t trace_state_bytes(fsdp_ctx *ctx, int weight) { (void)ctx; (void)weight; return sizeof(fsdp__trace); }
static size_t trace_alignment_bytes(fsdp_ctx *ctx, int weight) { /* each rank's times and probes */
    (void)ctx; (void)weight;
    return (2 * FSDP__TRACE_ROUNDS * sizeof(double) + 2 * sizeof(float)) * RANKS;
}
static size_t order_bytes(fsdp_ctx *ctx, int weight) { (void)ctx; (void)weight; return 2 * sizeof(uint64_t) * RANKS; }
static size_t norm_bytes(fsdp_ctx *ctx, int weight) { (void)ctx; (void)weight; return 4 * sizeof(double) * RANKS; }
static size_t file_identity_bytes(fsdp_ctx *ctx, int weight) { (void)ctx; (void)weight; return 32 * RANKS; }
static size_t unit_bytes(fsdp_ctx *ctx, int weight) { /* the weight's unit, gathered */
    fsdp_param_info param = {0};
    fsdp_unit_info info;
    if (fsdp_param_info_get(ctx, weight, &param) != 0 || fsdp_unit_info_get(ctx, param.unit, &info) != 0) return 0;
    return sizeof(float) * (size_t)info.padded_numel;
}
static size_t weight_bytes(fsdp_ctx *ctx, int weight) { (void)ctx; (void)weight; return sizeof(float) * OUT * IN; }

static int end_iteration(fsdp_ctx *ctx, int weight, const char *dir) { (void)weight; (void)dir; return fsdp_finish_backward(ctx); }
static int clip_grad_norm(fsdp_ctx *ctx, int weight, const char *dir) {
    double norm;
    (void)weight; (void)dir;
    return fsdp_clip_grad_norm(ctx, 1.0f, &norm);
}
static int load_checkpoint(fsdp_ctx *ctx, int weight, const char *dir) {
    char path[300];
    (void)weight;
    checkpoint_path(path, sizeof path, dir);
    return fsdp_load_full(ctx, path, NULL, NULL);
}
static int gather_weight(fsdp_ctx *ctx, int weight, const char *dir) {
    float out[OUT * IN];
    (void)dir;
    return fsdp_gather_param(ctx, weight, out);
}
static int set_weight(fsdp_ctx *ctx, int weight, const char *dir) {
    float full[OUT * IN] = {0};
    (void)dir;
    return fsdp_set_param_full(ctx, weight, this_rank == 0 ? full : NULL);
}

static const oom_case trace_state = {1, NULL, trace_state_bytes, NULL};
static const oom_case trace_alignment = {1, NULL, trace_alignment_bytes, NULL};
static const oom_case order_check = {0, forward_pass, order_bytes, end_iteration};
static const oom_case global_norm = {0, NULL, norm_bytes, clip_grad_norm};
static const oom_case file_check = {0, save_checkpoint, file_identity_bytes, load_checkpoint};
static const oom_case gather_param = {0, NULL, unit_bytes, gather_weight};
static const oom_case set_param_full = {0, NULL, weight_bytes, set_weight};

/* A rank of a case (the board's): set up, arm, the call under test, report. */
static int case_rank(fsdp_comm *comm, void *arg) {
    oom_board *b = (oom_board *)arg;
    const oom_case *c = b->the_case;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    int weight, rc;
    double start;
    this_rank = fsdp_comm_rank(comm);
    if ((rc = model_build(&model, &weight)) != 0) {
        setup_failed(b, "model", rc, NULL);
    } else if (c->traced) {
        start = arm(comm, c->bytes(NULL, weight));
        rc = ctx_open(comm, model, b->dir, &ctx);
        report(b, comm, rc, start, fsdp_last_error(NULL));
    } else if ((rc = ctx_open(comm, model, NULL, &ctx)) != 0) {
        setup_failed(b, "fsdp_init", rc, NULL);
    } else if (c->prepare && (rc = c->prepare(ctx, b->dir)) != 0) {
        setup_failed(b, "the case's setup", rc, ctx);
    } else {
        start = arm(comm, c->bytes(ctx, weight));
        rc = c->call(ctx, weight, b->dir);
        report(b, comm, rc, start, fsdp_last_error(ctx));
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return 0;
}

static int split_rank(fsdp_comm *comm, void *arg) {
    oom_board *b = (oom_board *)arg;
    fsdp_comm *sub = NULL;
    double start = arm(comm, sizeof(fsdp_comm)); /* the sub-communicator */
    int rc = fsdp_comm_split(comm, fsdp_comm_rank(comm), 0, &sub); /* each rank alone: nothing to join */
    report(b, comm, rc, start, fsdp_comm_last_error(NULL));
    fsdp_comm_destroy(sub);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   the parent: launch the ranks of a case, then check what each returned
   --------------------------------------------------------------------------------------------- */
static oom_board *board;

void setUp(void) {
    board = (oom_board *)map_board(sizeof(oom_board));
    make_test_dir(board->dir, sizeof board->dir, "test-oom");
}

void tearDown(void) {
    if (board && board->dir[0]) remove_tree(board->dir);
    board = NULL;
    unmap_board();
}

/* Runs fn on RANKS ranks; the launch and every rank's setup succeeded (message: what each said). */
static void launch_and_check_setup(fsdp_rank_fn fn) {
    fsdp_launch_status status;
    int rc = launch_ranks(RANKS, FSDP_BACKEND_SHM, OOM_TIMEOUT_MS, fn, board, &status);
    snprintf(message, sizeof message, "launch: %s %s | %s | 0: %s | 1: %s", fsdp_result_name(rc), status.message,
             board->setup_error, board->error[0], board->error[1]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    TEST_ASSERT_FALSE_MESSAGE(board->setup_failed, message);
}

/* Every rank of fn returned FSDP_ERR_OUT_OF_MEMORY within OOM_BOUND_MS, OOM_RANK's message
   saying own, the others' saying peers. */
static void assert_every_rank_failed_at_once(fsdp_rank_fn fn, const char *own, const char *peers) {
    int rank;
    launch_and_check_setup(fn);
    for (rank = 0; rank < RANKS; rank++) {
        snprintf(message, sizeof message, "rank %d: %s after %.0f ms (the timeout: %d ms): \"%s\"", rank,
                 fsdp_result_name(board->rc[rank]), board->elapsed_ms[rank], OOM_TIMEOUT_MS, board->error[rank]);
        TEST_ASSERT_TRUE_MESSAGE(board->done[rank], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_OUT_OF_MEMORY, board->rc[rank], message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(board->error[rank], rank == OOM_RANK ? own : peers), message);
        TEST_ASSERT_TRUE_MESSAGE(board->elapsed_ms[rank] < OOM_BOUND_MS, message);
    }
}

/* The same for a case of a context: OOM_RANK's message says "<what>: out of memory", the
   others' "rank <OOM_RANK>: <what>: out of memory". */
static void assert_case_fails_every_rank_naming_the_rank(const oom_case *c, const char *what) {
    char own[256], peers[300];
    snprintf(own, sizeof own, "%s: out of memory", what);
    snprintf(peers, sizeof peers, "rank %d: %s", OOM_RANK, own);
    board->the_case = c;
    assert_every_rank_failed_at_once(case_rank, own, peers);
}

static void test_trace_start_with_rank_1_out_of_memory_for_its_state_fails_every_rank_at_once_naming_rank_1(void) {
    assert_case_fails_every_rank_naming_the_rank(&trace_state, "fsdp_init: the trace's state");
}

static void test_trace_start_with_rank_1_out_of_memory_for_its_clock_alignment_fails_every_rank_at_once_naming_rank_1(void) {
    assert_case_fails_every_rank_naming_the_rank(&trace_alignment, "fsdp_init: the trace's clock alignment");
}

static void test_order_check_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1(void) {
    assert_case_fails_every_rank_naming_the_rank(&order_check, "checking the units' order across ranks");
}

static void test_clip_grad_norm_with_the_allocator_failing_on_rank_1_allocates_nothing_and_succeeds_everywhere(void) {
    int rank;
    board->the_case = &global_norm;
    launch_and_check_setup(case_rank);
    for (rank = 0; rank < RANKS; rank++) {
        TEST_ASSERT_TRUE_MESSAGE(board->done[rank], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, board->rc[rank], message);
    }
    TEST_ASSERT_EQUAL_size_t_MESSAGE(4 * sizeof(double) * RANKS, board->armed_left[OOM_RANK], message);
}

static void test_load_full_file_check_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1(void) {
    assert_case_fails_every_rank_naming_the_rank(&file_check, "fsdp_load_full: the ranks' file identities");
}

static void test_gather_param_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1(void) {
    assert_case_fails_every_rank_naming_the_rank(&gather_param, "fsdp_gather_param: the gathered unit");
}

static void test_set_param_full_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1(void) {
    assert_case_fails_every_rank_naming_the_rank(&set_param_full, "fsdp_set_param_full: the broadcast value");
}

static void test_comm_split_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1(void) {
    assert_every_rank_failed_at_once(split_rank, "out of memory", "rank 1 could not make its part of the sub-communicator");
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_trace_start_with_rank_1_out_of_memory_for_its_state_fails_every_rank_at_once_naming_rank_1);
    RUN_TEST(test_trace_start_with_rank_1_out_of_memory_for_its_clock_alignment_fails_every_rank_at_once_naming_rank_1);
    RUN_TEST(test_order_check_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1);
    RUN_TEST(test_clip_grad_norm_with_the_allocator_failing_on_rank_1_allocates_nothing_and_succeeds_everywhere);
    RUN_TEST(test_load_full_file_check_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1);
    RUN_TEST(test_gather_param_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1);
    RUN_TEST(test_set_param_full_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1);
    RUN_TEST(test_comm_split_with_rank_1_out_of_memory_fails_every_rank_at_once_naming_rank_1);
    return UNITY_END();
}
