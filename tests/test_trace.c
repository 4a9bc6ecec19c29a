/* test_trace.c - specification of fsdp.h's traces (issue 28, item 1): with fsdp_desc.trace_dir (or
   FSDP_TRACE) every rank writes DIR/trace-rankNNNNN.json, Chrome trace-event JSON, with an event for
   every hook of every unit, every collective (op, bytes, unit, group, a sequence number that is the
   same on every rank of the group), the compute thread's waits and what for, the optimizer step,
   each iteration, offload I/O and the phases of checkpoint saves and loads; clocks aligned to
   rank 0 with an error bound. Off, nothing is written; a rank that cannot write its trace warns and
   trains on.

   The model: a root unit (parameter "a") and two "Block" units l0, l1 (parameter "w" each), N
   elements apiece. An iteration runs the hooks nested (root around l0 and l1, backward in reverse)
   and adds a constant into every gradient, so what each step does is known; the traces are read
   back with examples/trace_tool.c (included whole), whose check also validates the format.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_trace.c \
              tests/unity/unity.c -o /tmp/test_trace -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"
#define TRACE_TOOL_NO_MAIN
#include "../examples/trace_tool.c"

#include <sys/resource.h>

#define N 300
#define ITERATIONS 3
#define MAX_RANKS 4

typedef struct run_plan {
    fsdp_backend_kind backend;
    fsdp_strategy strategy;
    int shard_group_size;
    int trace_ranks;          /* ranks r < trace_ranks trace (the others have no trace_dir) */
    int offload;              /* optimizer state and parameters on disk */
    int checkpoints;          /* after the iterations: sync save, async save + wait, load */
    long fsize_limit;         /* > 0: RLIMIT_FSIZE of each rank (its trace cannot grow past it) */
    int user_span;            /* fsdp_trace_span("data loading", ...) each iteration */
} run_plan;

typedef struct rank_result {
    int done, init_rc, rc, tracing;
    char error[400];
    char warning[400];        /* the first warning logged */
    float a[N];               /* this rank's view of parameter a after the run (gathered) */
} rank_result;

static rank_result *board; /* MAX_RANKS results, MAP_SHARED */
static char tmpdir[128], trace_dir[200], ckpt_dir[200];
static const run_plan *plan;

void setUp(void) {
    board = (rank_result *)map_shared(sizeof(rank_result) * MAX_RANKS);
    make_test_dir(tmpdir, sizeof tmpdir, "fsdp-test-trace");
    snprintf(trace_dir, sizeof trace_dir, "%s/trace", tmpdir);
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", tmpdir);
}

void tearDown(void) {
    munmap(board, sizeof(rank_result) * MAX_RANKS);
    remove_tree(tmpdir);
}

static void log_warning(void *user, fsdp_log_level level, const char *message) {
    rank_result *r = (rank_result *)user;
    if (level == FSDP_LOG_WARN && !r->warning[0]) copy_text(r->warning, sizeof r->warning, message);
}

enum { M_ROOT, M_L0, M_L1 };

static int build_model(fsdp_model **out) {
    fsdp_init_rule init = {FSDP_INIT_UNIFORM, -1.0f, 1.0f, NULL, NULL};
    int64_t shape[1] = {N};
    fsdp_model *m;
    int rc, l0, l1;
    if ((rc = fsdp_model_create(&m, "Net")) != FSDP_SUCCESS) return rc;
    *out = m;
    if (fsdp_model_param(m, 0, "a", 1, shape, init) < 0) return FSDP_ERR_INVALID_ARG;
    if ((l0 = fsdp_model_module(m, 0, "l0", "Block")) < 0 || (l1 = fsdp_model_module(m, 0, "l1", "Block")) < 0)
        return FSDP_ERR_INVALID_ARG;
    if (fsdp_model_param(m, l0, "w", 1, shape, init) < 0 || fsdp_model_param(m, l1, "w", 1, shape, init) < 0)
        return FSDP_ERR_INVALID_ARG;
    return FSDP_SUCCESS;
}

/* One iteration: forward root(l0, l1), backward root(l1, l0), each gradient += 0.01. */
static int iterate(fsdp_ctx *ctx) {
    static const int forward[2] = {M_L0, M_L1}, backward[2] = {M_L1, M_L0};
    int k, rc, i;
    if ((rc = fsdp_pre_forward(ctx, M_ROOT)) != 0) return rc;
    for (k = 0; k < 2; k++)
        if ((rc = fsdp_pre_forward(ctx, forward[k])) != 0 || (rc = fsdp_post_forward(ctx, forward[k])) != 0) return rc;
    if ((rc = fsdp_post_forward(ctx, M_ROOT)) != 0 || (rc = fsdp_pre_backward(ctx, M_ROOT)) != 0) return rc;
    for (k = 0; k < 2; k++) {
        float *g;
        if ((rc = fsdp_pre_backward(ctx, backward[k])) != 0) return rc;
        if (!(g = fsdp_grad(ctx, backward[k]))) return FSDP_ERR_STATE; /* parameters: a 0, l0.w 1, l1.w 2 */
        for (i = 0; i < N; i++) g[i] += 0.01f;
        if ((rc = fsdp_post_backward(ctx, backward[k])) != 0) return rc;
    }
    if (!(fsdp_grad(ctx, 0))) return FSDP_ERR_STATE;
    for (i = 0; i < N; i++) fsdp_grad(ctx, 0)[i] += 0.01f;
    if ((rc = fsdp_post_backward(ctx, M_ROOT)) != 0) return rc;
    if ((rc = fsdp_step(ctx, 0, NULL)) != 0) return rc;
    return fsdp_zero_grad(ctx);
}

static int checkpoints(fsdp_ctx *ctx) {
    fsdp_save_options so;
    fsdp_load_options lo;
    int rc;
    memset(&so, 0, sizeof so);
    memset(&lo, 0, sizeof lo);
    so.with_optimizer = lo.with_optimizer = lo.strict = 1;
    if ((rc = fsdp_save_sharded(ctx, ckpt_dir, &so)) != 0 || (rc = fsdp_save_sharded_async(ctx, ckpt_dir, &so)) != 0 ||
        (rc = fsdp_save_wait(ctx)) != 0)
        return rc;
    return fsdp_load_sharded(ctx, ckpt_dir, &lo, NULL);
}

static int run_rank(fsdp_comm *comm, void *arg) {
    int rank = fsdp_comm_rank(comm), it, rc;
    rank_result *r = &board[rank];
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    const char *types[] = {"Block", NULL};
    (void)arg;
    if (plan->fsize_limit > 0) {
        struct rlimit lim;
        lim.rlim_cur = lim.rlim_max = (rlim_t)plan->fsize_limit;
        signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead */
        setrlimit(RLIMIT_FSIZE, &lim);
    }
    if ((rc = build_model(&model)) != 0) return 1;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = plan->strategy;
    d.shard_group_size = plan->shard_group_size;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = types;
    d.optimizer.kind = FSDP_ADAMW;
    d.forward_prefetch = 1;
    d.trace_dir = rank < plan->trace_ranks ? trace_dir : NULL;
    d.logger.fn = log_warning;
    d.logger.user = r;
    d.logger.max_level = FSDP_LOG_WARN;
    if (plan->offload) {
        d.offload.optimizer = d.offload.params = 1;
        d.offload.dir = tmpdir;
        d.offload.allow_tmpfs = 1;
    }
    r->init_rc = fsdp_init(&ctx, model, &d);
    if (r->init_rc) {
        copy_text(r->error, sizeof r->error, fsdp_last_error(NULL));
        r->done = 1;
        fsdp_model_destroy(model);
        return 0;
    }
    r->tracing = fsdp_tracing(ctx);
    for (it = 0, rc = 0; !rc && it < ITERATIONS; it++) {
        if (plan->user_span) {
            double t = fsdp_now();
            sleep_ms(1);
            fsdp_trace_span(ctx, "data loading", t, fsdp_now());
        }
        rc = iterate(ctx);
    }
    if (!rc && plan->checkpoints) rc = checkpoints(ctx);
    if (!rc) rc = fsdp_gather_param(ctx, 0, r->a);
    r->rc = rc;
    if (rc) copy_text(r->error, sizeof r->error, fsdp_last_error(ctx));
    r->done = 1;
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return 0;
}

static void run(const run_plan *p, int nprocs) {
    fsdp_launch_status status;
    plan = p;
    memset(board, 0, sizeof(rank_result) * MAX_RANKS);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, launch_ranks(nprocs, p->backend, 20000, run_rank, NULL, &status), status.message);
}

static void assert_ranks_trained(int nprocs) {
    int r;
    char message[600];
    for (r = 0; r < nprocs; r++) {
        snprintf(message, sizeof message, "rank %d: init %d, rc %d: %s", r, board[r].init_rc, board[r].rc, board[r].error);
        TEST_ASSERT_TRUE_MESSAGE(board[r].done && board[r].init_rc == 0 && board[r].rc == 0, message);
    }
}

static void load_traces(tt_trace *t) {
    char err[600];
    tt_check_result res;
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, tt_load(trace_dir, t, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, tt_check(t, &res, err, sizeof err), err);
}

/* Events of rank r named name (exactly) in category cat (NULL: any) on thread tid (-1: any). */
static int count_events(const tt_trace *t, int r, const char *cat, const char *name, int tid) {
    size_t i;
    int n = 0;
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        if (e->rank != r || strcmp(e->ph, "X") != 0) continue;
        if ((!cat || (e->cat && strcmp(e->cat, cat) == 0)) && (!name || (e->name && strcmp(e->name, name) == 0)) &&
            (tid < 0 || e->tid == tid))
            n++;
    }
    return n;
}

static const char *const hook_names[4] = {"pre_forward", "post_forward", "pre_backward", "post_backward"};
static const char *const unit_names[3] = {"(root)", "l0", "l1"};

/* Every collective (group, seq) of the traces is on every rank of its group, as the same op of the
   same unit; groups: how many ranks each group of the kind has. */
static void assert_collectives_match(const tt_trace *t, int nprocs, int group_size) {
    size_t i, j;
    int matched = 0;
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        int same = 0;
        char message[300];
        if (strcmp(e->ph, "X") != 0 || !e->cat || strcmp(e->cat, "comm") != 0) continue;
        TEST_ASSERT_NOT_NULL(e->group);
        TEST_ASSERT_TRUE(e->seq >= 1 && e->bytes > 0 && e->issued <= e->ts + 0.001);
        for (j = 0; j < t->n; j++) {
            const tt_event *o = &t->ev[j];
            if (strcmp(o->ph, "X") != 0 || !o->cat || strcmp(o->cat, "comm") != 0 || !o->group) continue;
            if (o->seq != e->seq || strcmp(o->group, e->group) != 0) continue;
            same++;
            snprintf(message, sizeof message, "%s seq %lld: rank %d has %s %s, rank %d %s %s", e->group, e->seq, e->rank,
                     e->op, e->unit ? e->unit : "-", o->rank, o->op, o->unit ? o->unit : "-");
            TEST_ASSERT_EQUAL_STRING_MESSAGE(e->op, o->op, message);
            TEST_ASSERT_TRUE_MESSAGE((!e->unit && !o->unit) || (e->unit && o->unit && !strcmp(e->unit, o->unit)), message);
            TEST_ASSERT_EQUAL_INT64_MESSAGE(e->bytes, o->bytes, message);
        }
        snprintf(message, sizeof message, "%s seq %lld (%s) is on %d ranks", e->group, e->seq, e->op, same);
        TEST_ASSERT_EQUAL_INT_MESSAGE(strcmp(e->group, "world") == 0 ? nprocs : group_size, same, message);
        matched++;
    }
    TEST_ASSERT_TRUE(matched > 0);
}

/* ------------------------------------------------------------------------------------------- */

static void assert_full_trace(int nprocs, fsdp_backend_kind backend) {
    run_plan p;
    tt_trace t;
    int r, h, u, s;
    char name[64], message[200];
    memset(&p, 0, sizeof p);
    p.backend = backend;
    p.trace_ranks = nprocs;
    p.checkpoints = 1;
    p.user_span = 1;
    run(&p, nprocs);
    assert_ranks_trained(nprocs);
    load_traces(&t);
    TEST_ASSERT_EQUAL_INT(nprocs, t.nranks);
    for (r = 0; r < nprocs; r++) {
        TEST_ASSERT_TRUE(board[r].tracing);
        TEST_ASSERT_TRUE(t.ranks[r].clock_error_us >= 0);
        if (r == 0) TEST_ASSERT_EQUAL_FLOAT(0, t.ranks[0].clock_offset_us);
        for (h = 0; h < 4; h++)
            for (u = 0; u < 3; u++) {
                snprintf(name, sizeof name, "%s %s", hook_names[h], unit_names[u]);
                snprintf(message, sizeof message, "rank %d: events '%s'", r, name);
                TEST_ASSERT_EQUAL_INT_MESSAGE(ITERATIONS, count_events(&t, r, "hook", name, 0), message);
            }
        for (s = 1; s <= ITERATIONS; s++) {
            snprintf(name, sizeof name, "step %d", s);
            TEST_ASSERT_EQUAL_INT_MESSAGE(1, count_events(&t, r, "iteration", name, 0), name);
        }
        TEST_ASSERT_EQUAL_INT(ITERATIONS, count_events(&t, r, "step", "optimizer step", 0));
        TEST_ASSERT_EQUAL_INT(ITERATIONS, count_events(&t, r, "user", "data loading", 0));
        for (u = 1; u < 3; u++) { /* the Block units: gathered twice per iteration, reduced once */
            snprintf(name, sizeof name, "reduce_scatter %s", unit_names[u]);
            TEST_ASSERT_EQUAL_INT_MESSAGE(nprocs > 1 ? ITERATIONS : 0, count_events(&t, r, "comm", name, -1), name);
            snprintf(name, sizeof name, "all_gather %s", unit_names[u]);
            TEST_ASSERT_EQUAL_INT_MESSAGE(nprocs > 1 ? 2 * ITERATIONS : 0, count_events(&t, r, "comm", name, -1), name);
        }
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "save_sharded", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "save_sharded: write", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "save_sharded: commit", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "async save: snapshot", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "async save: write", 4));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "async save: commit", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "load_sharded", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "load_sharded: check", 0));
        TEST_ASSERT_EQUAL_INT(1, count_events(&t, r, "checkpoint", "load_sharded: read", 0));
        if (nprocs > 1) TEST_ASSERT_TRUE(count_events(&t, r, "wait", NULL, 0) > 0);
    }
    if (nprocs > 1) assert_collectives_match(&t, nprocs, nprocs);
    tt_free(&t);
}

void test_trace_on_one_rank_has_every_hook_step_and_checkpoint_phase(void) { assert_full_trace(1, FSDP_BACKEND_SHM); }

void test_trace_on_three_ranks_has_every_event_and_collectives_match_across_ranks(void) {
    assert_full_trace(3, FSDP_BACKEND_SHM);
}

void test_trace_over_sockets_aligns_clocks_and_matches_collectives(void) { assert_full_trace(2, FSDP_BACKEND_SOCKET); }

void test_trace_of_hybrid_shard_names_shard_and_replica_groups(void) {
    run_plan p;
    tt_trace t;
    size_t i;
    int groups[4] = {0, 0, 0, 0};
    memset(&p, 0, sizeof p);
    p.strategy = FSDP_HYBRID_SHARD;
    p.shard_group_size = 2;
    p.trace_ranks = 4;
    run(&p, 4);
    assert_ranks_trained(4);
    load_traces(&t);
    for (i = 0; i < t.n; i++) { /* shard0 {0,1}, shard1 {2,3}, replica0 {0,2}, replica1 {1,3} */
        const tt_event *e = &t.ev[i];
        if (strcmp(e->ph, "X") != 0 || !e->cat || strcmp(e->cat, "comm") != 0 || strcmp(e->group, "world") == 0) continue;
        if (!strncmp(e->group, "shard", 5)) TEST_ASSERT_EQUAL_INT(e->rank / 2, atoi(e->group + 5));
        else if (!strncmp(e->group, "replica", 7)) TEST_ASSERT_EQUAL_INT(e->rank % 2, atoi(e->group + 7));
        else TEST_FAIL_MESSAGE(e->group);
        groups[(e->group[0] == 'r') * 2 + (e->rank % 2)]++;
    }
    TEST_ASSERT_TRUE(groups[0] > 0 && groups[2] > 0 && groups[3] > 0); /* shard groups; replica all-reduces */
    assert_collectives_match(&t, 4, 2);
    tt_free(&t);
}

void test_trace_with_offload_records_io_and_the_step_thread(void) {
    run_plan p;
    tt_trace t;
    int r;
    memset(&p, 0, sizeof p);
    p.trace_ranks = 2;
    p.offload = 1;
    run(&p, 2);
    assert_ranks_trained(2);
    load_traces(&t);
    for (r = 0; r < 2; r++) {
        TEST_ASSERT_TRUE(count_events(&t, r, "io", "read", 3) > 0);
        TEST_ASSERT_TRUE(count_events(&t, r, "io", "write", 3) > 0);
        TEST_ASSERT_EQUAL_INT(ITERATIONS, count_events(&t, r, "step", "optimizer step", 2));
    }
    tt_free(&t);
}

void test_trace_off_writes_nothing_and_trains_alike(void) {
    run_plan p;
    float traced[N];
    memset(&p, 0, sizeof p);
    p.trace_ranks = 2;
    run(&p, 2);
    assert_ranks_trained(2);
    memcpy(traced, board[0].a, sizeof traced);
    remove_tree(trace_dir);
    p.trace_ranks = 0;
    run(&p, 2);
    assert_ranks_trained(2);
    TEST_ASSERT_FALSE(board[0].tracing);
    TEST_ASSERT_EQUAL_INT(-1, access(trace_dir, F_OK));
    TEST_ASSERT_EQUAL_MEMORY(traced, board[0].a, sizeof traced); /* tracing changes no bit */
}

void test_trace_on_some_ranks_only_fails_init_instead_of_hanging(void) {
    run_plan p;
    double t0 = now_ms();
    memset(&p, 0, sizeof p);
    p.trace_ranks = 1; /* rank 0 only */
    plan = &p;
    memset(board, 0, sizeof(rank_result) * MAX_RANKS);
    {
        fsdp_launch_status status;
        launch_ranks(2, FSDP_BACKEND_SHM, 5000, run_rank, NULL, &status); /* fails: the result is below */
    }
    TEST_ASSERT_TRUE_MESSAGE(board[0].done && board[0].init_rc != 0, board[0].error);
    TEST_ASSERT_TRUE_MESSAGE(contains(board[0].error, "every rank"), board[0].error);
    TEST_ASSERT_TRUE_MESSAGE(!board[1].done || board[1].init_rc != 0 || board[1].rc != 0, "rank 1 should fail too");
    TEST_ASSERT_TRUE(now_ms() - t0 < 15000);
}

void test_trace_that_cannot_be_written_warns_and_training_goes_on(void) {
    run_plan p;
    float full[N];
    struct stat st;
    char path[300];
    memset(&p, 0, sizeof p);
    p.trace_ranks = 0;
    run(&p, 2);
    assert_ranks_trained(2);
    memcpy(full, board[0].a, sizeof full);
    p.trace_ranks = 2;
    p.fsize_limit = 3000; /* the head fits, the events do not */
    run(&p, 2);
    assert_ranks_trained(2);
    TEST_ASSERT_TRUE_MESSAGE(contains(board[0].warning, "tracing stops, training goes on"), board[0].warning);
    TEST_ASSERT_EQUAL_MEMORY(full, board[0].a, sizeof full);
    snprintf(path, sizeof path, "%s/trace-rank00000.json", trace_dir);
    TEST_ASSERT_EQUAL_INT(0, stat(path, &st));
    TEST_ASSERT_TRUE(st.st_size <= 3000);
}

/* Forward passes only (evaluation: fsdp_finish_backward, never fsdp_step), until the trace must
   have spilled; the file's size is looked at before fsdp_destroy writes what is left. */
static int evaluate_rank(fsdp_comm *comm, void *arg) {
    rank_result *r = &board[0];
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    const char *types[] = {"Block", NULL};
    char path[300];
    struct stat st;
    int it, k, rc = 0;
    (void)arg;
    if (build_model(&model) != 0) return 1;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = types;
    d.trace_dir = trace_dir;
    if ((r->init_rc = fsdp_init(&ctx, model, &d)) != 0) return 1;
    for (it = 0; !rc && it < 4000; it++) { /* 6 hooks an iteration: 24000 events */
        rc = fsdp_pre_forward(ctx, M_ROOT);
        for (k = M_L0; !rc && k <= M_L1; k++) rc = fsdp_pre_forward(ctx, k) || fsdp_post_forward(ctx, k);
        if (!rc) rc = fsdp_post_forward(ctx, M_ROOT) || fsdp_finish_backward(ctx);
    }
    snprintf(path, sizeof path, "%s/trace-rank00000.json", trace_dir);
    r->rc = rc;
    r->tracing = stat(path, &st) == 0 && st.st_size > 1000000; /* (the events so far, written out: over 1 MB) */
    r->done = 1;
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return 0;
}

void test_trace_of_a_loop_without_fsdp_step_is_written_as_it_goes(void) {
    fsdp_launch_status status;
    tt_trace t;
    memset(board, 0, sizeof(rank_result) * MAX_RANKS);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, launch_ranks(1, FSDP_BACKEND_SHM, 20000, evaluate_rank, NULL, &status), status.message);
    TEST_ASSERT_TRUE(board[0].done && board[0].rc == 0);
    TEST_ASSERT_TRUE_MESSAGE(board[0].tracing, "the trace file did not grow before fsdp_destroy");
    load_traces(&t);
    TEST_ASSERT_EQUAL_INT(4000, count_events(&t, 0, "hook", "pre_forward l1", 0));
    TEST_ASSERT_TRUE(count_events(&t, 0, "trace", "trace write", 0) >= 1);
    tt_free(&t);
}

void test_trace_into_a_directory_every_user_can_write_is_refused(void) {
    run_plan p;
    memset(&p, 0, sizeof p);
    p.trace_ranks = 1;
    TEST_ASSERT_EQUAL_INT(0, mkdir(trace_dir, 0777));
    TEST_ASSERT_EQUAL_INT(0, chmod(trace_dir, 0777));
    plan = &p;
    memset(board, 0, sizeof(rank_result) * MAX_RANKS);
    {
        fsdp_launch_status status;
        launch_ranks(1, FSDP_BACKEND_SHM, 5000, run_rank, NULL, &status);
    }
    TEST_ASSERT_TRUE_MESSAGE(board[0].done, "rank 0 did not report");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, board[0].init_rc, board[0].error);
    TEST_ASSERT_TRUE_MESSAGE(contains(board[0].error, "every user can write"), board[0].error);
}

/* Issue 35, finding 5: names and paths went into a trace as they were, so a span name cut at
   byte 63 inside a character, or a checkpoint path or unit name with bytes that are not UTF-8
   (a stray byte, an overlong form, a surrogate, a cut sequence) made the rank's whole trace
   invalid JSON, and trace_tool check refused it. Names are now cut between characters and
   such bytes written as U+FFFD: the trace passes the check, and shows what it can. */
void test_trace_of_names_and_paths_that_are_not_utf8_is_valid_json(void) {
    fsdp_init_rule init = {FSDP_INIT_CONSTANT, 1.0f, 0, NULL, NULL};
    int64_t shape[1] = {N};
    const char *types[] = {"Block", NULL};
    char span[71], cut[63], path[300];
    fsdp_comm *comm = NULL;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    unsigned char *text;
    size_t size;
    double t0;
    tt_trace t;
    int block;
    memset(span, 'a', 62); /* 62 bytes, a euro sign across byte 63 (3 bytes), 5 more: 70 */
    memcpy(span + 62, "\xe2\x82\xac", 3);
    memset(span + 65, 'b', 5);
    span[70] = 0;
    memcpy(cut, span, 62);
    cut[62] = 0;
    snprintf(path, sizeof path, "%s/ck\xff-\xc0\xaf-\xed\xa0\x80-\xe2\x82.safetensors", tmpdir);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, open_one_rank_comm(&comm, "trace-utf8"));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_model_create(&model, "Net"));
    TEST_ASSERT_TRUE(fsdp_model_param(model, 0, "a", 1, shape, init) >= 0);
    TEST_ASSERT_TRUE((block = fsdp_model_module(model, 0, "l\xfe", "Block")) >= 0);
    TEST_ASSERT_TRUE(fsdp_model_param(model, block, "w", 1, shape, init) >= 0);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = types;
    d.trace_dir = trace_dir;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, model, &d), fsdp_last_error(NULL));
    t0 = fsdp_now();
    fsdp_trace_span(ctx, span, t0, fsdp_now());
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_pre_forward(ctx, block));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_post_forward(ctx, block));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_finish_backward(ctx));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_full(ctx, path, NULL), fsdp_last_error(ctx));
    release_one_rank(&ctx, &model, &comm);
    load_traces(&t);
    TEST_ASSERT_EQUAL_INT(1, count_events(&t, 0, "user", cut, -1));
    TEST_ASSERT_EQUAL_INT(1, count_events(&t, 0, "checkpoint", "save_full", -1));
    TEST_ASSERT_EQUAL_INT(1, count_events(&t, 0, "hook", "pre_forward l\xef\xbf\xbd", -1)); /* U+FFFD */
    tt_free(&t);
    snprintf(path, sizeof path, "%s/trace-rank00000.json", trace_dir);
    text = read_whole_file(path, &size);
    TEST_ASSERT_TRUE_MESSAGE(strstr((const char *)text, "ck\\ufffd-\\ufffd\\ufffd-\\ufffd\\ufffd\\ufffd-\\ufffd\\ufffd.") != NULL,
                             "the path's bytes are not each written as U+FFFD");
    free(text);
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_trace_on_one_rank_has_every_hook_step_and_checkpoint_phase);
    RUN_TEST(test_trace_on_three_ranks_has_every_event_and_collectives_match_across_ranks);
    RUN_TEST(test_trace_over_sockets_aligns_clocks_and_matches_collectives);
    RUN_TEST(test_trace_of_hybrid_shard_names_shard_and_replica_groups);
    RUN_TEST(test_trace_with_offload_records_io_and_the_step_thread);
    RUN_TEST(test_trace_off_writes_nothing_and_trains_alike);
    RUN_TEST(test_trace_on_some_ranks_only_fails_init_instead_of_hanging);
    RUN_TEST(test_trace_that_cannot_be_written_warns_and_training_goes_on);
    RUN_TEST(test_trace_of_a_loop_without_fsdp_step_is_written_as_it_goes);
    RUN_TEST(test_trace_into_a_directory_every_user_can_write_is_refused);
    RUN_TEST(test_trace_of_names_and_paths_that_are_not_utf8_is_valid_json);
    return UNITY_END();
}
