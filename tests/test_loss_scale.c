/* test_loss_scale.c - specification of dynamic loss scaling (issue 28, item 4), PyTorch's
   GradScaler rules: the training loop multiplies its loss's gradient by fsdp_loss_scale(ctx);
   fsdp_step divides the scale out before clipping; a non-finite gradient skips the step and
   multiplies the scale by backoff_factor (0.5); growth_interval (2000) finite steps in a row
   multiply it by growth_factor (2); the scale starts at init_scale (65536) and travels in
   checkpoints saved with optimizer state.

   The model: one module, one parameter w of N elements, SGD (lr LR, no momentum). Each
   iteration's "loss" is sum(c * w), so every element's gradient is c: what a step does is known
   exactly. Two ranks (fsdp_launch over shared memory) so that gradients really are reduced, in
   f16 where the test says so (reduce_dtype), where a gradient of 1e-8 flushes to zero and one of
   1e5 overflows. Ranks write what they saw into a MAP_SHARED board; only the parent asserts.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_loss_scale.c \
              tests/unity/unity.c -o /tmp/test_loss_scale -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <float.h>

#define N 64
#define LR 1000.0f
#define MAX_STEPS 40

typedef struct run_plan {
    fsdp_dtype dtype;     /* param_dtype and reduce_dtype */
    int scaling;          /* desc.loss_scale.enabled */
    int growth_interval;  /* 0: the default */
    float c;              /* every element's gradient */
    float max_norm;       /* fsdp_step's clipping (0: none) */
    int steps;
    const char *save_dir; /* after the steps: fsdp_save_sharded with optimizer state here */
    const char *load_dir; /* before the steps: fsdp_load_sharded with optimizer state from here */
} run_plan;

typedef struct rank_result {
    int done, rc;
    char error[400];
    float w[N];                    /* the full parameter after the steps */
    int skipped[MAX_STEPS];
    float scale_used[MAX_STEPS];   /* report.loss_scale */
    float scale_after[MAX_STEPS];  /* fsdp_loss_scale after the step */
    double grad_norm[MAX_STEPS];
    float scale_loaded;            /* fsdp_loss_scale right after the load */
} rank_result;

static rank_result *board; /* 2 results, MAP_SHARED */
static char tmpdir[128];

void setUp(void) {
    board = (rank_result *)mmap(NULL, sizeof(rank_result) * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TEST_ASSERT_TRUE(board != MAP_FAILED);
    memset(board, 0, sizeof(rank_result) * 2);
    make_test_dir(tmpdir, sizeof tmpdir, "fsdp-test-loss-scale");
}

void tearDown(void) {
    munmap(board, sizeof(rank_result) * 2);
    if (tmpdir[0]) remove_tree(tmpdir);
    tmpdir[0] = 0;
}

/* Skipped steps are logged; the tests count them through the reports instead. */
static void quiet(void *user, fsdp_log_level level, const char *message) {
    (void)user;
    (void)level;
    (void)message;
}

/* One rank: the plan's iterations, then what it saw on the board. No assertions here. */
static int run_rank(fsdp_comm *comm, void *arg) {
    const run_plan *plan = (const run_plan *)arg;
    rank_result *r = &board[fsdp_comm_rank(comm)];
    fsdp_init_rule one = {FSDP_INIT_CONSTANT, 1.0f, 0, NULL, NULL};
    int64_t shape[1] = {N};
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    int lin, w, s, rc;
    if ((rc = fsdp_model_create(&model, "Net")) != 0) goto out;
    if ((lin = fsdp_model_module(model, 0, "lin", "Linear")) < 0) { rc = lin; goto out; }
    if ((w = fsdp_model_param(model, lin, "weight", 1, shape, one)) < 0) { rc = w; goto out; }
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.param_dtype = d.reduce_dtype = plan->dtype;
    d.optimizer.kind = FSDP_SGD;
    d.optimizer.lr = LR;
    d.loss_scale.enabled = plan->scaling;
    d.loss_scale.growth_interval = plan->growth_interval;
    d.logger.fn = quiet;
    if ((rc = fsdp_init(&ctx, model, &d)) != 0) goto out;
    if (plan->load_dir) {
        fsdp_load_options lo;
        memset(&lo, 0, sizeof lo);
        lo.strict = 1;
        lo.with_optimizer = 1;
        if ((rc = fsdp_load_sharded(ctx, plan->load_dir, &lo, NULL)) != 0) goto out;
        r->scale_loaded = fsdp_loss_scale(ctx);
    }
    for (s = 0; s < plan->steps && s < MAX_STEPS; s++) {
        fsdp_step_report rep;
        float scale = fsdp_loss_scale(ctx);
        int i;
        if ((rc = fsdp_pre_forward(ctx, lin)) != 0 || (rc = fsdp_post_forward(ctx, lin)) != 0 ||
            (rc = fsdp_pre_backward(ctx, lin)) != 0)
            goto out;
        for (i = 0; i < N; i++) fsdp_grad(ctx, w)[i] += plan->c * scale; /* d(scale * loss)/dw */
        if ((rc = fsdp_post_backward(ctx, lin)) != 0 || (rc = fsdp_step(ctx, plan->max_norm, &rep)) != 0) goto out;
        r->skipped[s] = rep.skipped;
        r->scale_used[s] = (float)rep.loss_scale;
        r->grad_norm[s] = rep.grad_norm;
        r->scale_after[s] = fsdp_loss_scale(ctx);
        if ((rc = fsdp_zero_grad(ctx)) != 0) goto out;
    }
    if ((rc = fsdp_gather_param(ctx, w, r->w)) != 0) goto out;
    if (plan->save_dir) {
        fsdp_save_options so;
        memset(&so, 0, sizeof so);
        so.with_optimizer = 1;
        rc = fsdp_save_sharded(ctx, plan->save_dir, &so);
    }
out:
    copy_text(r->error, sizeof r->error, ctx ? fsdp_last_error(ctx) : fsdp_last_error(NULL));
    r->rc = rc;
    r->done = 1;
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return rc ? 1 : 0;
}

/* Runs the plan on 2 ranks; both must finish. */
static void run(const run_plan *plan) {
    fsdp_launch_status status;
    int rc, r;
    memset(board, 0, sizeof(rank_result) * 2);
    rc = launch_ranks(2, FSDP_BACKEND_SHM, 20000, run_rank, (void *)plan, &status);
    for (r = 0; r < 2; r++) {
        TEST_ASSERT_TRUE_MESSAGE(board[r].done, status.message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, board[r].rc, board[r].error);
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
}

/* Gradients of 1e-8 flush to zero in f16 (its smallest step is 6e-8): without scaling the
   weights never move; with it (65536: 6.6e-4 in f16) each step moves them by LR * 1e-8, to f16
   precision, and no step is skipped. */
static void test_f16_gradients_that_flush_to_zero_train_only_with_loss_scaling(void) {
    run_plan plan = {FSDP_F16, 0, 0, 1e-8f, 0, 5, NULL, NULL};
    int i;
    run(&plan);
    for (i = 0; i < N; i++) TEST_ASSERT_EQUAL_FLOAT_MESSAGE(1.0f, board[0].w[i], "moved without scaling");
    plan.scaling = 1;
    run(&plan);
    for (i = 0; i < 5; i++) {
        TEST_ASSERT_EQUAL_INT(0, board[0].skipped[i]);
        TEST_ASSERT_EQUAL_FLOAT(65536.0f, board[0].scale_used[i]);
        TEST_ASSERT_FLOAT_WITHIN(1e-3 * 1e-8 * N, 1e-8 * sqrt((double)N), board[0].grad_norm[i]); /* unscaled */
    }
    for (i = 0; i < N; i++) TEST_ASSERT_FLOAT_WITHIN(5e-3f * 5e-5f, 1.0f - 5 * LR * 1e-8f, board[0].w[i]);
    TEST_ASSERT_EQUAL_MEMORY(board[0].w, board[1].w, sizeof board[0].w);
}

/* Gradients of 1e5 overflow f16 (largest 65504): without scaling every step is skipped, for
   ever; with it each overflow halves the scale (from 65536) until 1e5 x scale fits, 17 skips
   later (scale 0.5), and from then on every step trains. */
static void test_f16_gradients_that_overflow_skip_for_ever_without_scaling_and_train_with_it(void) {
    run_plan plan = {FSDP_F16, 0, 0, 1e5f, 0, 25, NULL, NULL};
    int i;
    float scale = 65536.0f;
    run(&plan);
    for (i = 0; i < 25; i++) TEST_ASSERT_EQUAL_INT_MESSAGE(1, board[0].skipped[i], "an overflowing step was taken");
    TEST_ASSERT_EQUAL_FLOAT(1.0f, board[0].w[0]);
    plan.scaling = 1;
    run(&plan);
    for (i = 0; i < 25; i++) {
        char message[120];
        snprintf(message, sizeof message, "step %d at scale %g", i, (double)scale);
        TEST_ASSERT_EQUAL_FLOAT_MESSAGE(scale, board[0].scale_used[i], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(i < 17, board[0].skipped[i], message);
        if (i < 17) scale *= 0.5f;
        TEST_ASSERT_EQUAL_FLOAT_MESSAGE(scale, board[0].scale_after[i], message);
    }
    TEST_ASSERT_FLOAT_WITHIN(1e-2f * 8 * LR * 1e5f, 1.0f - 8 * LR * 1e5f, board[0].w[0]); /* 8 steps taken */
}

/* growth_interval finite steps in a row double the scale (here 3: 65536 for steps 0-2, then
   131072 ...), as GradScaler.update. */
static void test_the_scale_grows_after_growth_interval_finite_steps(void) {
    run_plan plan = {FSDP_F32, 1, 3, 1e-3f, 0, 7, NULL, NULL};
    int i;
    run(&plan);
    for (i = 0; i < 7; i++) {
        float expected = 65536.0f * (float)(1 << (i / 3));
        TEST_ASSERT_EQUAL_FLOAT(expected, board[0].scale_used[i]);
        TEST_ASSERT_EQUAL_INT(0, board[0].skipped[i]);
    }
    TEST_ASSERT_EQUAL_FLOAT(65536.0f * 4, board[0].scale_after[6]);
}

/* In f32 a power-of-two scale changes nothing: the weights after clipped steps are the same
   bits with and without scaling (the scale divided out before the clip, in one exact product). */
static void test_scaled_and_unscaled_f32_training_give_the_same_bits_with_clipping(void) {
    run_plan plan = {FSDP_F32, 0, 0, 0.37f, 0.5f, 6, NULL, NULL};
    float plain[N];
    int i;
    run(&plan);
    memcpy(plain, board[0].w, sizeof plain);
    plan.scaling = 1;
    run(&plan);
    for (i = 0; i < 6; i++) TEST_ASSERT_FLOAT_WITHIN(1e-6, 0.37 * sqrt((double)N), board[0].grad_norm[i]);
    TEST_ASSERT_EQUAL_MEMORY(plain, board[0].w, sizeof plain);
    TEST_ASSERT_TRUE(plain[0] != 1.0f); /* it trained */
}

/* The scale and the growth count travel in a checkpoint saved with optimizer state: a run that
   grew its scale to 131072 and is one step short of the next growth resumes there, and its next
   step grows it to 262144. */
static void test_the_scale_and_its_growth_count_travel_in_checkpoints(void) {
    char dir[256];
    run_plan plan = {FSDP_F32, 1, 3, 1e-3f, 0, 5, NULL, NULL};
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    plan.save_dir = dir;
    run(&plan); /* steps 0-2 at 65536, 3-4 at 131072: two of three toward the next growth */
    TEST_ASSERT_EQUAL_FLOAT(131072.0f, board[0].scale_after[4]);
    plan.save_dir = NULL;
    plan.load_dir = dir;
    plan.steps = 1;
    run(&plan);
    TEST_ASSERT_EQUAL_FLOAT(131072.0f, board[0].scale_loaded);
    TEST_ASSERT_EQUAL_FLOAT(131072.0f, board[0].scale_used[0]);
    TEST_ASSERT_EQUAL_FLOAT(262144.0f, board[0].scale_after[0]);
}

/* Settings that cannot work are refused by fsdp_init, naming them. */
static void test_invalid_loss_scale_settings_are_refused(void) {
    fsdp_model *model = NULL;
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_init_rule one = {FSDP_INIT_CONSTANT, 1.0f, 0, NULL, NULL};
    int64_t shape[1] = {N};
    fsdp_desc d;
    int lin;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, open_one_rank_comm(&comm, "loss-scale"));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_model_create(&model, "Net"));
    lin = fsdp_model_module(model, 0, "lin", "Linear");
    TEST_ASSERT_TRUE(fsdp_model_param(model, lin, "weight", 1, shape, one) >= 0);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.loss_scale.enabled = 1;
    d.loss_scale.backoff_factor = 2.0f;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_init(&ctx, model, &d));
    TEST_ASSERT_TRUE_MESSAGE(strstr(fsdp_last_error(NULL), "backoff_factor") != NULL, fsdp_last_error(NULL));
    d.loss_scale.backoff_factor = 0;
    d.loss_scale.init_scale = -1.0f;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_init(&ctx, model, &d));
    d.loss_scale.init_scale = 1e-40f; /* subnormal: 1/scale is infinite */
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_init(&ctx, model, &d));
    d.loss_scale.init_scale = 0;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_init(&ctx, model, &d));
    TEST_ASSERT_EQUAL_FLOAT(65536.0f, fsdp_loss_scale(ctx));
    fsdp_destroy(ctx);
    d.loss_scale.enabled = 0;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_init(&ctx, model, &d));
    TEST_ASSERT_EQUAL_FLOAT(1.0f, fsdp_loss_scale(ctx));
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    fsdp_comm_destroy(comm);
}

/* ---------------------------------------------------------------------------------------------
   checkpoints whose GradScaler state or step cannot be resumed from (issue 35, finding 4): a
   loss_scale of 1e-40 (subnormal: 1/scale is infinite, the weights went to -inf), of 1e-50 (0
   as a float: every step skipped for ever), a step or growth count of 2^63 - 1 (the next
   increment overflowed). Each is ignored with a warning naming it; the context keeps its own.
   --------------------------------------------------------------------------------------------- */
#define RESUME_STEPS 3

/* What one rank did after a load: the report, the warnings, then RESUME_STEPS steps of
   gradient 1e-3 (loss scaling on, growth_interval 3). */
typedef struct resumed {
    int rc;
    fsdp_load_report report;
    float scale_loaded;
    int skipped[RESUME_STEPS];
    int64_t step[RESUME_STEPS];
    float scale_after[RESUME_STEPS];
    float w[N];
    char warnings[1200];
} resumed;

static resumed *current; /* the run collect_warnings writes to */

static void collect_warnings(void *user, fsdp_log_level level, const char *message) {
    (void)user;
    if (current && level <= FSDP_LOG_WARN) {
        append_text(current->warnings, sizeof current->warnings, message);
        append_text(current->warnings, sizeof current->warnings, " | ");
    }
}

/* One rank in this process: w (N ones), SGD at LR, loss scaling with growth_interval 3; saves a
   sharded checkpoint to save_dir (with optimizer state) if given; loads load_path (a full
   file, or a sharded directory) if given, then steps, the first with gradient first_grad. */
static void resume_one_rank(const char *save_dir, const char *load_path, int sharded, float first_grad, resumed *out) {
    fsdp_init_rule one = {FSDP_INIT_CONSTANT, 1.0f, 0, NULL, NULL};
    int64_t shape[1] = {N};
    fsdp_comm *comm = NULL;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_load_options lo;
    fsdp_desc d;
    int lin, w, s;
    memset(out, 0, sizeof *out);
    current = out;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, open_one_rank_comm(&comm, "loss-scale-resume"));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_model_create(&model, "Net"));
    lin = fsdp_model_module(model, 0, "lin", "Linear");
    TEST_ASSERT_TRUE((w = fsdp_model_param(model, lin, "weight", 1, shape, one)) >= 0);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.optimizer.kind = FSDP_SGD;
    d.optimizer.lr = LR;
    d.loss_scale.enabled = 1;
    d.loss_scale.growth_interval = 3;
    d.logger.fn = collect_warnings;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_init(&ctx, model, &d));
    if (save_dir) {
        fsdp_save_options so;
        memset(&so, 0, sizeof so);
        so.with_optimizer = 1;
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx, save_dir, &so), fsdp_last_error(ctx));
    }
    memset(&lo, 0, sizeof lo);
    lo.with_optimizer = 1;
    if (load_path)
        out->rc = sharded ? fsdp_load_sharded(ctx, load_path, &lo, &out->report)
                          : fsdp_load_full(ctx, load_path, &lo, &out->report);
    out->scale_loaded = fsdp_loss_scale(ctx);
    for (s = 0; !out->rc && s < RESUME_STEPS; s++) {
        fsdp_step_report rep;
        float scale = fsdp_loss_scale(ctx);
        int i;
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_pre_forward(ctx, lin));
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_post_forward(ctx, lin));
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_pre_backward(ctx, lin));
        for (i = 0; i < N; i++) fsdp_grad(ctx, w)[i] += (s == 0 ? first_grad : 1e-3f) * scale;
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_post_backward(ctx, lin));
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_step(ctx, 0, &rep));
        out->skipped[s] = rep.skipped;
        out->step[s] = rep.step;
        out->scale_after[s] = fsdp_loss_scale(ctx);
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_zero_grad(ctx));
    }
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_gather_param(ctx, w, out->w));
    current = NULL;
    release_one_rank(&ctx, &model, &comm);
}

/* A full checkpoint of w = 1 at path as a save with optimizer state at step 4, scale 131072,
   two finite steps toward the next growth writes it, but for key, which holds value. */
static void write_checkpoint_with(const char *path, const char *key, const char *value) {
    fsdp_kv meta[3] = {{"step", "4"}, {"loss_scale", "131072"}, {"loss_scale_growth_tracker", "2"}};
    fsdp_st_spec spec;
    fsdp_st_writer *writer = NULL;
    float ones[N];
    char err[300];
    int i;
    for (i = 0; i < 3; i++)
        if (strcmp(meta[i].key, key) == 0) meta[i].value = value;
    for (i = 0; i < N; i++) ones[i] = 1.0f;
    memset(&spec, 0, sizeof spec);
    spec.name = "lin.weight";
    spec.dtype = FSDP_F32;
    spec.ndim = 1;
    spec.shape[0] = N;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_open(&writer, path, &spec, 1, meta, 3, err, sizeof err));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(writer, ones, N));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(writer, err, sizeof err), err);
}

/* Loads a full checkpoint whose key holds value, then steps (the first with gradient
   first_grad); asserts that the load worked. */
static void resume_from(const char *key, const char *value, float first_grad, resumed *out) {
    char path[256];
    snprintf(path, sizeof path, "%s/tampered.safetensors", tmpdir);
    write_checkpoint_with(path, key, value);
    resume_one_rank(NULL, path, 0, first_grad, out);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, out->rc, out->warnings);
}

/* The load warned naming key and its value. */
static void assert_warned(const resumed *out, const char *key, const char *value) {
    char message[1500];
    snprintf(message, sizeof message, "%s '%s': %s", key, value, out->warnings);
    TEST_ASSERT_TRUE_MESSAGE(contains(out->warnings, key) && contains(out->warnings, value), message);
}

/* A loss scale that is not a finite normal float > 0 is ignored: the scale stays init_scale,
   the steps train (w moves by LR * 1e-3 = 1 each) and none is skipped. */
static void test_checkpoint_loss_scale_that_is_not_a_normal_float_is_ignored_with_a_warning(void) {
    static const char *bad[] = {"1e-40", "1e-50", "0", "-2", "inf", "nan", "3.5e38", "big"};
    resumed out;
    size_t b;
    int i, s;
    for (b = 0; b < sizeof bad / sizeof *bad; b++) {
        resume_from("loss_scale", bad[b], 1e-3f, &out);
        for (s = 0; s < RESUME_STEPS; s++) TEST_ASSERT_EQUAL_INT_MESSAGE(0, out.skipped[s], bad[b]);
        for (i = 0; i < N; i++) TEST_ASSERT_FLOAT_WITHIN_MESSAGE(1e-3f, 1.0f - RESUME_STEPS, out.w[i], bad[b]);
        TEST_ASSERT_EQUAL_FLOAT_MESSAGE(65536.0f, out.scale_loaded, bad[b]);
        assert_warned(&out, "loss_scale", bad[b]);
    }
}

/* A growth count not in [0, growth_interval) is ignored (the count stays 0): the restored scale
   131072 grows after 3 finite steps, not at the first, and no count overflows (UBSan). */
static void test_checkpoint_growth_count_out_of_range_is_ignored_with_a_warning(void) {
    static const char *bad[] = {"9223372036854775807", "3", "-1", "1.5"};
    resumed out;
    size_t b;
    for (b = 0; b < sizeof bad / sizeof *bad; b++) {
        resume_from("loss_scale_growth_tracker", bad[b], 1e-3f, &out);
        TEST_ASSERT_EQUAL_FLOAT_MESSAGE(131072.0f, out.scale_loaded, bad[b]);
        TEST_ASSERT_EQUAL_FLOAT_MESSAGE(131072.0f, out.scale_after[1], bad[b]);
        TEST_ASSERT_EQUAL_FLOAT_MESSAGE(262144.0f, out.scale_after[2], bad[b]);
        assert_warned(&out, "loss_scale_growth_tracker", bad[b]);
    }
}

/* A step not in [0, 2^53) is reported as absent (-1) and ignored: the context counts on from its
   own step 0, and no count overflows (UBSan). */
static void test_checkpoint_step_out_of_range_is_ignored_with_a_warning(void) {
    static const char *bad[] = {"9223372036854775807", "9007199254740992", "-5", "1.5"};
    resumed out;
    size_t b;
    for (b = 0; b < sizeof bad / sizeof *bad; b++) {
        resume_from("step", bad[b], 1e-3f, &out);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(1, out.step[0], bad[b]);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(RESUME_STEPS, out.step[RESUME_STEPS - 1], bad[b]);
        TEST_ASSERT_EQUAL_INT64_MESSAGE(-1, out.report.step, bad[b]);
        assert_warned(&out, "step", bad[b]);
    }
}

/* The values as a save writes them resume as saved, without a warning: step 4 on, the scale
   131072 grows at the first step (the third in a row). */
static void test_checkpoint_with_values_in_range_resumes_its_step_scale_and_count(void) {
    resumed out;
    resume_from("step", "4", 1e-3f, &out);
    TEST_ASSERT_EQUAL_STRING("", out.warnings);
    TEST_ASSERT_EQUAL_INT64(4, out.report.step);
    TEST_ASSERT_EQUAL_INT64(5, out.step[0]);
    TEST_ASSERT_EQUAL_FLOAT(131072.0f, out.scale_loaded);
    TEST_ASSERT_EQUAL_FLOAT(262144.0f, out.scale_after[0]);
}

/* index.json of a sharded checkpoint is checked alike: a step of 2^63 - 1 and a scale of 1e-40
   are ignored with warnings. */
static void test_sharded_checkpoint_with_a_huge_step_and_a_subnormal_scale_is_resumed_from_the_contexts_own(void) {
    char dir[256], path[300];
    const char *edits[2][2] = {{"\"step\":0,", "\"step\":9223372036854775807,"},
                               {"\"loss_scale\":\"65536\"", "\"loss_scale\":\"1e-40\""}};
    unsigned char *text;
    char *edited;
    size_t size;
    resumed out;
    int e;
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    resume_one_rank(dir, NULL, 0, 1e-3f, &out);
    snprintf(path, sizeof path, "%s/index.json", dir);
    text = read_whole_file(path, &size);
    edited = (char *)calloc(size + 64, 1);
    TEST_ASSERT_NOT_NULL(edited);
    memcpy(edited, text, size);
    free(text);
    for (e = 0; e < 2; e++) {
        char *at = strstr(edited, edits[e][0]);
        size_t old_len = strlen(edits[e][0]), new_len = strlen(edits[e][1]);
        TEST_ASSERT_NOT_NULL_MESSAGE(at, edits[e][0]);
        memmove(at + new_len, at + old_len, strlen(at + old_len) + 1);
        memcpy(at, edits[e][1], new_len);
    }
    write_file(path, edited, strlen(edited));
    free(edited);
    resume_one_rank(NULL, dir, 1, 1e-3f, &out);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, out.rc, out.warnings);
    TEST_ASSERT_TRUE_MESSAGE(isfinite(out.w[0]) && out.w[0] < 1.0f, "the weights did not train to finite values");
    TEST_ASSERT_EQUAL_INT64(1, out.step[0]);
    TEST_ASSERT_EQUAL_INT64(-1, out.report.step);
    TEST_ASSERT_EQUAL_FLOAT(65536.0f, out.scale_loaded);
    assert_warned(&out, "step", "9223372036854775807");
    assert_warned(&out, "loss_scale", "1e-40");
}

/* A scale at the smallest normal float does not back off below it (half of it is subnormal:
   1/scale would be infinite): the skipped step keeps it, and the next steps train. */
static void test_the_scale_never_backs_off_below_the_smallest_normal_float(void) {
    resumed out;
    int i;
    resume_from("loss_scale", "1.17549435e-38", INFINITY, &out);
    TEST_ASSERT_EQUAL_FLOAT(FLT_MIN, out.scale_loaded);
    TEST_ASSERT_EQUAL_INT(1, out.skipped[0]);
    TEST_ASSERT_EQUAL_INT(0, out.skipped[1]);
    for (i = 0; i < N; i++) TEST_ASSERT_FLOAT_WITHIN(0.01f, 1.0f - (RESUME_STEPS - 1), out.w[i]);
    TEST_ASSERT_TRUE_MESSAGE(out.scale_after[0] == FLT_MIN, "the scale backed off below the smallest normal float");
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_f16_gradients_that_flush_to_zero_train_only_with_loss_scaling);
    RUN_TEST(test_f16_gradients_that_overflow_skip_for_ever_without_scaling_and_train_with_it);
    RUN_TEST(test_the_scale_grows_after_growth_interval_finite_steps);
    RUN_TEST(test_scaled_and_unscaled_f32_training_give_the_same_bits_with_clipping);
    RUN_TEST(test_the_scale_and_its_growth_count_travel_in_checkpoints);
    RUN_TEST(test_invalid_loss_scale_settings_are_refused);
    RUN_TEST(test_checkpoint_loss_scale_that_is_not_a_normal_float_is_ignored_with_a_warning);
    RUN_TEST(test_checkpoint_growth_count_out_of_range_is_ignored_with_a_warning);
    RUN_TEST(test_checkpoint_step_out_of_range_is_ignored_with_a_warning);
    RUN_TEST(test_checkpoint_with_values_in_range_resumes_its_step_scale_and_count);
    RUN_TEST(test_sharded_checkpoint_with_a_huge_step_and_a_subnormal_scale_is_resumed_from_the_contexts_own);
    RUN_TEST(test_the_scale_never_backs_off_below_the_smallest_normal_float);
    return UNITY_END();
}
