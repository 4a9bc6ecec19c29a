/* test_checkpoint.c - specification of checkpoints: full (one safetensors file) and sharded (a
   directory of per-rank files and index.json) checkpoints reload bitwise at any world size,
   strategy and wrap policy; training resumed from a checkpoint continues exactly as if it had
   never stopped; a rank killed in the middle of a save leaves the previous checkpoint intact;
   every kind of malformed or corrupted file is rejected with FSDP_ERR_CORRUPT and a message
   saying what is wrong; strict and non-strict loads report every missing, unexpected and
   mis-shaped tensor; fsdp_st_writer produces byte for byte the file the safetensors format
   prescribes, which Python's json and struct modules read back.

   The model (units of 5, 42 and 24 elements, 71 as one unit: shards are padded at P = 2, 3, 4):
       x0 = x * scale                      scale (5)          owned by the root unit
       h  = relu(layers.0(x0))             Linear 5 -> 7      weight 7x5, bias 7
       y  = layers.1(h)                    Linear 7 -> 3      weight 3x7, bias 3
       loss = mean over rows of 0.5 * |y - target|^2, B = 12 rows split evenly over P ranks
   saved with FSDP_WRAP_TYPES {"Linear"} (three units) and loaded with that, FSDP_WRAP_NONE
   (one unit) or FSDP_WRAP_SIZE with min_params 30 (layers.0 alone is a unit).

   Multi-rank tests fork ranks with fsdp_launch_ex. The ranks write what they gathered and what
   went wrong into a MAP_SHARED region the parent mapped before the launch; only the parent
   asserts. Every test works in its own directory under /tmp (mkdtemp in setUp, removed in
   tearDown).

   The fuzz target's corpus (tests/corpus/safetensors and every crasher the fuzzer found, in its
   crashers/ folder) is replayed by test_fuzz_corpus_and_crashers_parse_without_crashing; run
   from the repository root or set the environment variable CORPUS_DIR.

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_checkpoint.c tests/unity/unity.c -o /tmp/tck -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <pthread.h>

#define MAX_WORLD 4
#define NUM_STRATEGIES 4       /* FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD */
#define LAUNCH_TIMEOUT_MS 20000 /* bound on any wait for another rank; only reached on a hang */

/* Training resumed at another world size adds its gradients in another order: the result may
   differ in rounding, at most 1e-5 relative to max(|value|, REL_FLOOR) (elements passing near
   zero are measured against the scale of the smallest parameters, as in test_runtime.c). */
#define RESUME_TOLERANCE 1e-5
#define REL_FLOOR 1e-2

#ifndef CORPUS_DIR
#define CORPUS_DIR NULL /* derived from __FILE__: tests/corpus/safetensors */
#endif

static char tmpdir[128];        /* this test's directory */
static char message[4096];      /* assertion messages */

/* Single-rank objects of in-process tests; tearDown releases whatever a test left. */
static fsdp_comm *comm1;
static fsdp_ctx *ctx1;
static fsdp_model *model1;
static unsigned char *file_bytes; /* a file read into memory */
static size_t file_size;

static void free_snapshots(void);

void setUp(void) {
    make_test_dir(tmpdir, sizeof tmpdir, "fsdp-test-checkpoint");
}

void tearDown(void) {
    release_one_rank(&ctx1, &model1, &comm1);
    free(file_bytes);
    file_bytes = NULL;
    file_size = 0;
    free_snapshots();
    unmap_board(); /* the MAP_SHARED region of a multi-rank test (map_board) */
    if (tmpdir[0]) remove_tree(tmpdir);
    tmpdir[0] = 0;
}

/* ---------------------------------------------------------------------------------------------
   what a rank reports: the first failure of a launch
   --------------------------------------------------------------------------------------------- */
typedef struct rank_error {
    int claimed;
    char text[512];
} rank_error;

/* Records "rank R: what: RESULT: detail" if nothing was recorded yet; returns the exit status. */
static int rank_fail(rank_error *e, fsdp_comm *comm, const char *what, int rc, const char *detail) {
    if (__sync_bool_compare_and_swap(&e->claimed, 0, 1))
        snprintf(e->text, sizeof e->text, "rank %d: %.120s: %.40s: %.300s", comm ? fsdp_comm_rank(comm) : -1, what,
                 fsdp_result_name(rc), detail ? detail : "");
    return 1;
}

static int launch(int nprocs, fsdp_rank_fn fn, void *arg, fsdp_launch_status *status) {
    return launch_ranks(nprocs, FSDP_BACKEND_SHM, LAUNCH_TIMEOUT_MS, fn, arg, status);
}

static void assert_launch_ok(int rc, const fsdp_launch_status *status, const rank_error *e, const char *what) {
    static char text[1024];
    snprintf(text, sizeof text, "%.200s: %s | %s", what, status->message, e->text);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, text);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, e->claimed, text);
}

/* ---------------------------------------------------------------------------------------------
   the model, its training step and its configurations
   --------------------------------------------------------------------------------------------- */
#define D 5  /* inputs */
#define H 7  /* hidden */
#define C 3  /* outputs */
#define B 12 /* rows; divisible by every world size 1..4 */
#define NUM_PARAMS 5
#define MODEL_NUMEL (D + H * D + H + C * H + C) /* 71 */

enum { P_SCALE, P_W0, P_B0, P_W1, P_B1 };
static const int64_t param_offset[NUM_PARAMS] = {0, D, D + H * D, D + H * D + H, D + H * D + H + C * H};
static const int64_t param_numel[NUM_PARAMS] = {D, H * D, H, C * H, C};
static const char *const param_names[NUM_PARAMS] = {"scale", "layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                    "layers.1.bias"};

typedef struct mlp {
    fsdp_model *model;
    int layers;   /* "layers", a ModuleList: not a unit under TYPES {"Linear"} */
    int layer[2]; /* "layers.0", "layers.1" */
    int param[NUM_PARAMS];
} mlp;

static int mlp_build(mlp *m) {
    memset(m, 0, sizeof *m);
    return relu_mlp_build(&m->model, D, H, C, &m->layers, m->layer, m->param);
}

/* The values fsdp_init gives the model for a seed, in param_offset order. */
static void mlp_initial_values(uint64_t seed, float *out) {
    mlp m;
    int p;
    int64_t i;
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    for (p = 0; p < NUM_PARAMS; p++)
        for (i = 0; i < param_numel[p]; i++) out[param_offset[p] + i] = fsdp_init_value(m.model, m.param[p], i, seed);
    fsdp_model_destroy(m.model);
}

enum { WRAP_LINEAR, WRAP_ROOT_ONLY, WRAP_SIZE, NUM_WRAPS };
static const char *const wrap_names[NUM_WRAPS] = {"TYPES{Linear}", "NONE", "SIZE(30)"};
static const char *const strategy_names[NUM_STRATEGIES + 1] = {"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                                               "HYBRID_SHARD"};
static const char *const linear_types[] = {"Linear", NULL};

enum { OPT_ADAMW, OPT_SGD_MOMENTUM, NUM_OPTS };
static const char *const opt_names[NUM_OPTS] = {"AdamW", "SGD(momentum 0.9)"};

/* HYBRID_SHARD uses shard groups of 2 at even world sizes (replicated across groups) and the
   default (one group of every rank) at odd ones. */
static fsdp_desc mlp_desc(fsdp_comm *comm, fsdp_strategy strategy, int wrap, int opt, uint64_t seed) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = strategy;
    d.seed = seed;
    if (strategy == FSDP_HYBRID_SHARD && fsdp_comm_size(comm) % 2 == 0) d.shard_group_size = 2;
    if (wrap == WRAP_LINEAR) {
        d.wrap.kind = FSDP_WRAP_TYPES;
        d.wrap.types = linear_types;
    } else if (wrap == WRAP_SIZE) {
        d.wrap.kind = FSDP_WRAP_SIZE;
        d.wrap.min_params = 30;
    } else {
        d.wrap.kind = FSDP_WRAP_NONE;
    }
    if (opt == OPT_ADAMW) {
        d.optimizer.kind = FSDP_ADAMW;
        d.optimizer.lr = 0.01f;
    } else {
        d.optimizer.kind = FSDP_SGD;
        d.optimizer.lr = 0.1f;
        d.optimizer.momentum = 0.9f;
    }
    return d;
}

/* One training iteration of the model (relu_mlp_train_step) on this rank's rows, then fsdp_step.
   `step` selects the batch. */
static int train_step(fsdp_ctx *ctx, const mlp *m, fsdp_comm *comm, int step, const char **where) {
    const relu_mlp sizes = {D, H, C, B, m->layer, m->param};
    return relu_mlp_train_step(ctx, &sizes, comm, step, where);
}

/* Every parameter's full value, gathered, in param_offset order. Collective. */
static int gather_all(fsdp_ctx *ctx, const mlp *m, float *out) {
    int p, rc;
    for (p = 0; p < NUM_PARAMS; p++)
        if ((rc = fsdp_gather_param(ctx, m->param[p], out + param_offset[p])) != 0) return rc;
    return 0;
}

/* Where values first differ, as text for a failure message. */
static const char *first_difference(const float *expected, const float *actual, int64_t n) {
    static char text[256];
    int64_t i;
    int p;
    for (i = 0; i < n && memcmp(&expected[i], &actual[i], sizeof(float)) == 0; i++) {}
    if (i == n) return "identical";
    for (p = NUM_PARAMS - 1; p > 0 && param_offset[p] > i; p--) {}
    snprintf(text, sizeof text, "%s[%lld]: expected %.9g, got %.9g", n == MODEL_NUMEL ? param_names[p] : "element",
             (long long)(n == MODEL_NUMEL ? i - param_offset[p] : i), expected[i], actual[i]);
    return text;
}

/* ---------------------------------------------------------------------------------------------
   single-rank context in this process
   --------------------------------------------------------------------------------------------- */
static mlp net1;

static void start_one_rank(fsdp_strategy strategy, uint64_t seed) {
    fsdp_desc d;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, open_one_rank_comm(&comm1, "test-checkpoint"), "fsdp_comm_init (one rank)");
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&net1));
    model1 = net1.model;
    d = mlp_desc(comm1, strategy, WRAP_LINEAR, OPT_ADAMW, seed);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx1, model1, &d), fsdp_last_error(NULL));
}

/* A fresh context on the same communicator and model (what a restarted program would have). */
static void restart_one_rank(fsdp_strategy strategy, uint64_t seed) {
    fsdp_desc d = mlp_desc(comm1, strategy, WRAP_LINEAR, OPT_ADAMW, seed);
    fsdp_destroy(ctx1);
    ctx1 = NULL;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx1, model1, &d), fsdp_last_error(NULL));
}

static void gather_one_rank(float *out) {
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, gather_all(ctx1, &net1, out), fsdp_last_error(ctx1));
}

static void train_one_rank(int steps) {
    const char *where = "";
    int s, rc;
    for (s = 0; s < steps; s++) {
        rc = train_step(ctx1, &net1, comm1, s, &where);
        snprintf(message, sizeof message, "%s: %s", where, fsdp_last_error(ctx1));
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   files
   --------------------------------------------------------------------------------------------- */
/* The file's bytes into file_bytes and file_size. */
static void read_file(const char *path) {
    free(file_bytes);
    file_bytes = NULL;
    file_bytes = read_whole_file(path, &file_size);
}
static uint64_t header_length(const unsigned char *bytes) {
    uint64_t n = 0;
    int i;
    for (i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    return n;
}

static void put_header_length(unsigned char *bytes, uint64_t n) {
    int i;
    for (i = 0; i < 8; i++) bytes[i] = (unsigned char)(n >> (8 * i));
}

/* A safetensors image made by hand: the 8-byte little-endian header length (header_len, which
   need not be the text's), the header text, then the data. */
static unsigned char hand_image[1 << 16];
static size_t hand_size;

static void build_image(uint64_t header_len, const char *header, const void *data, size_t data_len) {
    size_t text = strlen(header);
    TEST_ASSERT_TRUE(8 + text + data_len <= sizeof hand_image);
    put_header_length(hand_image, header_len);
    memcpy(hand_image + 8, header, text);
    if (data_len) memcpy(hand_image + 8 + text, data, data_len);
    hand_size = 8 + text + data_len;
}

/* The same with the header's real length and `data_len` bytes 0, 1, 2, ... of data. */
static void build_hand_file(const char *header, size_t data_len) {
    unsigned char data[256] = {0};
    size_t i;
    TEST_ASSERT_TRUE(data_len <= sizeof data);
    for (i = 0; i < data_len; i++) data[i] = (unsigned char)i;
    build_image(strlen(header), header, data, data_len);
}

/* The bytes are rejected from memory (fsdp_st_parse) and as a file (fsdp_st_open) with
   FSDP_ERR_CORRUPT, no file object, and a message containing `words` (the file's also naming
   the path). */
static void assert_corrupt(const unsigned char *bytes, size_t size, const char *words) {
    fsdp_st_file *f = NULL;
    char err[1024] = "", path[256];
    int rc = fsdp_st_parse(&f, bytes, size, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_st_parse returned %s with \"%s\"; expected FSDP_ERR_CORRUPT and \"%s\"",
             fsdp_result_name(rc), err, words);
    if (rc == FSDP_SUCCESS) fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
    TEST_ASSERT_NULL_MESSAGE(f, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, words), message);

    snprintf(path, sizeof path, "%s/hostile.safetensors", tmpdir);
    write_file(path, bytes, size);
    err[0] = 0;
    f = NULL;
    rc = fsdp_st_open(&f, path, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_st_open returned %s with \"%s\"; expected FSDP_ERR_CORRUPT and \"%s\"",
             fsdp_result_name(rc), err, words);
    if (rc == FSDP_SUCCESS) fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
    TEST_ASSERT_NULL_MESSAGE(f, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, words), message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, path), message);
}

static void assert_hand_file_corrupt(const char *header, size_t data_len, const char *words) {
    build_hand_file(header, data_len);
    assert_corrupt(hand_image, hand_size, words);
}

/* A good file written by fsdp_st_writer, read into file_bytes:
   "embed.weight" F32 [4,3] = 0, 0.5, 1, ...;  "embed.bias" F32 [3] = -1, -2, -3. */
#define GOOD_WEIGHT_BYTES 48
#define GOOD_DATA_BYTES 60

static void write_good_file(const char *path) {
    fsdp_st_spec specs[2];
    fsdp_st_writer *w = NULL;
    float weight[12], bias[3] = {-1.0f, -2.0f, -3.0f};
    char err[512] = "";
    int i;
    for (i = 0; i < 12; i++) weight[i] = 0.5f * (float)i;
    memset(specs, 0, sizeof specs);
    specs[0].name = "embed.weight";
    specs[0].dtype = FSDP_F32;
    specs[0].ndim = 2;
    specs[0].shape[0] = 4;
    specs[0].shape[1] = 3;
    specs[1].name = "embed.bias";
    specs[1].dtype = FSDP_F32;
    specs[1].ndim = 1;
    specs[1].shape[0] = 3;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, 2, NULL, 0, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, weight, 12));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, bias, 3));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
}

static void load_good_file(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/good.safetensors", tmpdir);
    write_good_file(path);
    read_file(path);
    TEST_ASSERT_EQUAL_size_t(8 + header_length(file_bytes) + GOOD_DATA_BYTES, file_size);
}

/* Replaces text in the good file's header by text of the same length. */
static void patch_header(const char *from, const char *to) {
    size_t n = strlen(from), hlen = (size_t)header_length(file_bytes), i;
    TEST_ASSERT_EQUAL_size_t(n, strlen(to));
    for (i = 8; i + n <= 8 + hlen; i++)
        if (memcmp(file_bytes + i, from, n) == 0) {
            memcpy(file_bytes + i, to, n);
            return;
        }
    snprintf(message, sizeof message, "'%s' is not in the header", from);
    TEST_FAIL_MESSAGE(message);
}

/* ---------------------------------------------------------------------------------------------
   round trips: save at every world size and strategy, load at every other one, with every wrap
   policy; the parameters come back bitwise
   --------------------------------------------------------------------------------------------- */
enum { FORMAT_FULL, FORMAT_SHARDED, NUM_FORMATS };
static const char *const format_names[NUM_FORMATS] = {"full", "sharded"};

#define NUM_SAVES (MAX_WORLD * NUM_STRATEGIES) /* save index = (world - 1) * 4 + (strategy - 1) */
#define LOAD_SEED 7u                           /* a loaded context starts from other values */

typedef struct roundtrip_board {
    char dir[128];
    int format;
    int save_index;   /* of the save launch running */
    int load_world;   /* of the load launch running */
    float saved[NUM_SAVES][MODEL_NUMEL];
    int load_rc[MAX_WORLD][NUM_SAVES][NUM_STRATEGIES][NUM_WRAPS];
    float loaded[MAX_WORLD][NUM_SAVES][NUM_STRATEGIES][NUM_WRAPS][MODEL_NUMEL];
    rank_error error;
} roundtrip_board;

static void checkpoint_path(char *out, size_t size, const char *dir, int format, const char *stem) {
    snprintf(out, size, format == FORMAT_FULL ? "%s/%s.safetensors" : "%s/%s", dir, stem);
}

static int save(fsdp_ctx *ctx, int format, const char *path, int with_optimizer) {
    fsdp_save_options so;
    memset(&so, 0, sizeof so);
    so.with_optimizer = with_optimizer;
    return format == FORMAT_FULL ? fsdp_save_full(ctx, path, &so) : fsdp_save_sharded(ctx, path, &so);
}

static int load(fsdp_ctx *ctx, int format, const char *path, int with_optimizer, fsdp_load_report *report) {
    fsdp_load_options lo;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    lo.with_optimizer = with_optimizer;
    return format == FORMAT_FULL ? fsdp_load_full(ctx, path, &lo, report) : fsdp_load_sharded(ctx, path, &lo, report);
}

/* Trains one step (so the optimizer state is not zero), saves with the optimizer state and
   reports the parameters it saved. */
static int roundtrip_save_rank(fsdp_comm *comm, void *arg) {
    roundtrip_board *b = (roundtrip_board *)arg;
    int strategy = b->save_index % NUM_STRATEGIES + 1, rc, status = 0;
    float values[MODEL_NUMEL];
    const char *where = "";
    char path[256], stem[32];
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    mlp m;
    if ((rc = mlp_build(&m)) != 0) return rank_fail(&b->error, comm, "mlp_build", rc, "");
    d = mlp_desc(comm, (fsdp_strategy)strategy, WRAP_LINEAR, OPT_ADAMW, 1000u + (uint64_t)b->save_index);
    snprintf(stem, sizeof stem, "save-%02d", b->save_index);
    checkpoint_path(path, sizeof path, b->dir, b->format, stem);
    if ((rc = fsdp_init(&ctx, m.model, &d)) != 0) status = rank_fail(&b->error, comm, "fsdp_init", rc, fsdp_last_error(NULL));
    else if ((rc = train_step(ctx, &m, comm, 0, &where)) != 0) status = rank_fail(&b->error, comm, where, rc, fsdp_last_error(ctx));
    else if ((rc = save(ctx, b->format, path, 1)) != 0) status = rank_fail(&b->error, comm, "save", rc, fsdp_last_error(ctx));
    else if ((rc = gather_all(ctx, &m, values)) != 0) status = rank_fail(&b->error, comm, "gather", rc, fsdp_last_error(ctx));
    else if (fsdp_comm_rank(comm) == 0) memcpy(b->saved[b->save_index], values, sizeof values);
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    return status;
}

/* Loads every saved checkpoint with every strategy and wrap policy (a fresh context each time,
   started from other values) and reports what it gathered. */
static int roundtrip_load_rank(fsdp_comm *comm, void *arg) {
    roundtrip_board *b = (roundtrip_board *)arg;
    int w = b->load_world - 1, s, st, wrap, rc, status = 0;
    float values[MODEL_NUMEL];
    char path[256], stem[32], what[128];
    for (s = 0; s < NUM_SAVES && !status; s++)
        for (st = 0; st < NUM_STRATEGIES && !status; st++)
            for (wrap = 0; wrap < NUM_WRAPS && !status; wrap++) {
                fsdp_ctx *ctx = NULL;
                fsdp_desc d;
                mlp m;
                if ((rc = mlp_build(&m)) != 0) return rank_fail(&b->error, comm, "mlp_build", rc, "");
                d = mlp_desc(comm, (fsdp_strategy)(st + 1), wrap, OPT_ADAMW, LOAD_SEED);
                snprintf(stem, sizeof stem, "save-%02d", s);
                checkpoint_path(path, sizeof path, b->dir, b->format, stem);
                snprintf(what, sizeof what, "load %s at P=%d %s wrap %s", stem, b->load_world, strategy_names[st + 1],
                         wrap_names[wrap]);
                if ((rc = fsdp_init(&ctx, m.model, &d)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(NULL));
                else {
                    rc = load(ctx, b->format, path, 1, NULL);
                    if (fsdp_comm_rank(comm) == 0) b->load_rc[w][s][st][wrap] = rc;
                    if (rc != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                    else if ((rc = gather_all(ctx, &m, values)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                    else if (fsdp_comm_rank(comm) == 0) memcpy(b->loaded[w][s][st][wrap], values, sizeof values);
                }
                fsdp_destroy(ctx);
                fsdp_model_destroy(m.model);
            }
    return status;
}

static void assert_round_trips(int format) {
    roundtrip_board *b = (roundtrip_board *)map_board(sizeof(roundtrip_board));
    fsdp_launch_status status;
    float load_seed_values[MODEL_NUMEL];
    int world, s, st, wrap, rc;
    snprintf(b->dir, sizeof b->dir, "%s", tmpdir);
    b->format = format;
    for (s = 0; s < NUM_SAVES; s++) {
        char path[256], stem[32], why[1024] = "";
        b->save_index = s;
        rc = launch(s / NUM_STRATEGIES + 1, roundtrip_save_rank, b, &status);
        snprintf(message, sizeof message, "save %s at P=%d %s", format_names[format], s / NUM_STRATEGIES + 1,
                 strategy_names[s % NUM_STRATEGIES + 1]);
        assert_launch_ok(rc, &status, &b->error, message);
        snprintf(stem, sizeof stem, "save-%02d", s);
        checkpoint_path(path, sizeof path, b->dir, format, stem);
        rc = format == FORMAT_FULL ? ckpt_file_exact(path, why, sizeof why) : ckpt_dir_exact(path, why, sizeof why);
        snprintf(message + strlen(message), sizeof message - strlen(message), ": %s", why);
        TEST_ASSERT_TRUE_MESSAGE(rc, message); /* what the save left is exactly the checkpoint */
    }
    /* the control: a load that did nothing would leave these */
    mlp_initial_values(LOAD_SEED, load_seed_values);
    for (s = 0; s < NUM_SAVES; s++) TEST_ASSERT_TRUE(memcmp(b->saved[s], load_seed_values, sizeof load_seed_values) != 0);
    for (world = 1; world <= MAX_WORLD; world++) {
        b->load_world = world;
        rc = launch(world, roundtrip_load_rank, b, &status);
        snprintf(message, sizeof message, "loads at P=%d", world);
        assert_launch_ok(rc, &status, &b->error, message);
    }
    for (world = 1; world <= MAX_WORLD; world++)
        for (s = 0; s < NUM_SAVES; s++)
            for (st = 0; st < NUM_STRATEGIES; st++)
                for (wrap = 0; wrap < NUM_WRAPS; wrap++) {
                    const float *got = b->loaded[world - 1][s][st][wrap];
                    snprintf(message, sizeof message, "%s checkpoint saved at P=%d %s (wrap TYPES{Linear}), loaded at P=%d %s wrap %s: %s",
                             format_names[format], s / NUM_STRATEGIES + 1, strategy_names[s % NUM_STRATEGIES + 1], world,
                             strategy_names[st + 1], wrap_names[wrap], first_difference(b->saved[s], got, MODEL_NUMEL));
                    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->load_rc[world - 1][s][st][wrap], message);
                    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(b->saved[s], got, sizeof(float) * MODEL_NUMEL, message);
                }
}

static void test_full_checkpoint_reloads_bitwise_at_every_world_size_strategy_and_wrap_policy(void) {
    assert_round_trips(FORMAT_FULL);
}

static void test_sharded_checkpoint_reloads_bitwise_at_every_world_size_strategy_and_wrap_policy(void) {
    assert_round_trips(FORMAT_SHARDED);
}

/* Parameters saved as BF16 come back as the BF16 roundings of the saved values. */
static void test_checkpoint_saved_as_bf16_reloads_parameters_rounded_to_bf16(void) {
    float saved[MODEL_NUMEL], rounded[MODEL_NUMEL], got[MODEL_NUMEL];
    char path[2][256];
    fsdp_save_options so;
    fsdp_load_options lo;
    fsdp_st_file *f = NULL;
    char err[512];
    int i, format;
    start_one_rank(FSDP_FULL_SHARD, 3);
    train_one_rank(1);
    gather_one_rank(saved);
    for (i = 0; i < MODEL_NUMEL; i++) rounded[i] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(saved[i]));
    TEST_ASSERT_TRUE(memcmp(saved, rounded, sizeof saved) != 0); /* else the test shows nothing */
    memset(&so, 0, sizeof so);
    so.dtype = FSDP_BF16;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    checkpoint_path(path[0], sizeof path[0], tmpdir, FORMAT_FULL, "bf16");
    checkpoint_path(path[1], sizeof path[1], tmpdir, FORMAT_SHARDED, "bf16");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_full(ctx1, path[0], &so), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx1, path[1], &so), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_open(&f, path[0], err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_BF16, fsdp_st_tensor_at(f, fsdp_st_find(f, "layers.0.weight"))->dtype);
    fsdp_st_close(f);
    for (format = 0; format < NUM_FORMATS; format++) {
        restart_one_rank(FSDP_FULL_SHARD, LOAD_SEED);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS,
                                      format == FORMAT_FULL ? fsdp_load_full(ctx1, path[0], &lo, NULL)
                                                            : fsdp_load_sharded(ctx1, path[1], &lo, NULL),
                                      fsdp_last_error(ctx1));
        gather_one_rank(got);
        snprintf(message, sizeof message, "%s: %s", format_names[format], first_difference(rounded, got, MODEL_NUMEL));
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(rounded, got, sizeof got, message);
    }
}

/* A second save into the same directory replaces the first one's files. */
static void test_sharded_save_over_an_older_one_leaves_only_the_new_files(void) {
    char dir[256];
    int files_after_first;
    start_one_rank(FSDP_FULL_SHARD, 3);
    checkpoint_path(dir, sizeof dir, tmpdir, FORMAT_SHARDED, "again");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_SHARDED, dir, 1), fsdp_last_error(ctx1));
    files_after_first = count_entries(dir, NULL);
    train_one_rank(1);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_SHARDED, dir, 1), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT(2, files_after_first); /* index.json and one shard file */
    TEST_ASSERT_EQUAL_INT(files_after_first, count_entries(dir, NULL));
    TEST_ASSERT_EQUAL_INT(0, count_entries(dir, ".tmp"));
}

/* index.json as fsdp.h wrote it before it listed only the files written: a name for every
   rank, here rank 1's (as of NO_SHARD at P = 2) without a file. It still loads, bitwise. */
static void test_sharded_checkpoint_whose_index_names_a_file_never_written_loads(void) {
    float saved[MODEL_NUMEL], got[MODEL_NUMEL];
    char dir[256], path[300], *files, *text;
    size_t size;
    start_one_rank(FSDP_FULL_SHARD, 3);
    train_one_rank(1);
    gather_one_rank(saved);
    checkpoint_path(dir, sizeof dir, tmpdir, FORMAT_SHARDED, "older");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_SHARDED, dir, 1), fsdp_last_error(ctx1));
    snprintf(path, sizeof path, "%s/index.json", dir);
    read_file(path);
    files = strstr((char *)file_bytes, "-00000.safetensors\"]");
    TEST_ASSERT_NOT_NULL_MESSAGE(files, (char *)file_bytes);
    text = (char *)malloc(file_size + 64);
    TEST_ASSERT_NOT_NULL(text);
    size = (size_t)(files - (char *)file_bytes);
    memcpy(text, file_bytes, size); /* ..."shard-XXXXXXXX */
    size += (size_t)sprintf(text + size, "-00000.safetensors\",\"%.14s-00001.safetensors", files - 14);
    memcpy(text + size, files + 18, file_size - (size_t)(files + 18 - (char *)file_bytes));
    size += file_size - (size_t)(files + 18 - (char *)file_bytes);
    write_file(path, text, size);
    free(text);
    restart_one_rank(FSDP_FULL_SHARD, LOAD_SEED);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, load(ctx1, FORMAT_SHARDED, dir, 1, NULL), fsdp_last_error(ctx1));
    gather_one_rank(got);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(saved, got, sizeof got, first_difference(saved, got, MODEL_NUMEL));
}

/* ---------------------------------------------------------------------------------------------
   exact resume: n steps without a break equal k steps, save, a new program loading them, and
   n - k more steps
   --------------------------------------------------------------------------------------------- */
#define RESUME_STEPS 4    /* n */
#define RESUME_AT 2       /* k */
#define TRAIN_SEED 42u
#define RESTART_SEED 77u  /* the restarted program's own initialisation, overwritten by the load */

enum { RESUME_SAME_WORLD, RESUME_OTHER_WORLD };

typedef struct resume_board {
    char dir[128];
    int save_world, load_world;   /* of the launch running */
    int mode;                     /* RESUME_SAME_WORLD: same strategy and wrap policy; OTHER: others */
    int with_optimizer;           /* what the restarted program loads */
    float uninterrupted[MAX_WORLD][NUM_STRATEGIES][NUM_OPTS][MODEL_NUMEL];
    float resumed[MAX_WORLD][MAX_WORLD][NUM_STRATEGIES][NUM_OPTS][NUM_FORMATS][MODEL_NUMEL]; /* [load][save]... */
    int resumed_done[MAX_WORLD][MAX_WORLD][NUM_STRATEGIES][NUM_OPTS][NUM_FORMATS];
    int64_t resumed_step[MAX_WORLD][MAX_WORLD][NUM_STRATEGIES][NUM_OPTS][NUM_FORMATS];
    rank_error error;
} resume_board;

static void resume_stem(char *out, size_t size, int world, int strategy, int opt) {
    snprintf(out, size, "resume-p%d-s%d-o%d", world, strategy, opt);
}

/* For every strategy and optimizer: trains RESUME_STEPS steps and reports the parameters; then,
   in a fresh context, trains RESUME_AT steps and saves full and sharded checkpoints with the
   optimizer state. */
static int resume_save_rank(fsdp_comm *comm, void *arg) {
    resume_board *b = (resume_board *)arg;
    int st, opt, run, s, rc, status = 0, steps;
    float values[MODEL_NUMEL];
    char path[256], stem[64], what[160];
    const char *where = "";
    for (st = 1; st <= NUM_STRATEGIES && !status; st++)
        for (opt = 0; opt < NUM_OPTS && !status; opt++)
            for (run = 0; run < 2 && !status; run++) { /* 0: without a break, 1: up to the save */
                fsdp_ctx *ctx = NULL;
                fsdp_desc d = mlp_desc(comm, (fsdp_strategy)st, WRAP_LINEAR, opt, TRAIN_SEED);
                mlp m;
                if ((rc = mlp_build(&m)) != 0) return rank_fail(&b->error, comm, "mlp_build", rc, "");
                snprintf(what, sizeof what, "P=%d %s %s %s", b->save_world, strategy_names[st], opt_names[opt],
                         run ? "training up to the save" : "training without a break");
                steps = run ? RESUME_AT : RESUME_STEPS;
                if ((rc = fsdp_init(&ctx, m.model, &d)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(NULL));
                for (s = 0; s < steps && !status; s++)
                    if ((rc = train_step(ctx, &m, comm, s, &where)) != 0) status = rank_fail(&b->error, comm, where, rc, fsdp_last_error(ctx));
                if (!status && run == 0) {
                    if ((rc = gather_all(ctx, &m, values)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                    else if (fsdp_comm_rank(comm) == 0) memcpy(b->uninterrupted[b->save_world - 1][st - 1][opt], values, sizeof values);
                }
                if (!status && run == 1) {
                    resume_stem(stem, sizeof stem, b->save_world, st, opt);
                    checkpoint_path(path, sizeof path, b->dir, FORMAT_FULL, stem);
                    if ((rc = save(ctx, FORMAT_FULL, path, 1)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                    checkpoint_path(path, sizeof path, b->dir, FORMAT_SHARDED, stem);
                    if (!status && (rc = save(ctx, FORMAT_SHARDED, path, 1)) != 0)
                        status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                }
                fsdp_destroy(ctx);
                fsdp_model_destroy(m.model);
            }
    return status;
}

/* A restarted program: fresh context (other seed; in OTHER mode another strategy and wrap
   policy), load, RESUME_STEPS - RESUME_AT more steps, report. */
static int resume_load_rank(fsdp_comm *comm, void *arg) {
    resume_board *b = (resume_board *)arg;
    int lw = b->load_world - 1, sw, st, opt, format, s, rc, status = 0;
    float values[MODEL_NUMEL];
    char path[256], stem[64], what[200];
    const char *where = "";
    for (sw = 0; sw < MAX_WORLD && !status; sw++) {
        if ((b->mode == RESUME_SAME_WORLD) != (sw == lw)) continue;
        for (st = 1; st <= NUM_STRATEGIES && !status; st++)
            for (opt = 0; opt < NUM_OPTS && !status; opt++)
                for (format = 0; format < NUM_FORMATS && !status; format++) {
                    int strategy = b->mode == RESUME_SAME_WORLD ? st : st % NUM_STRATEGIES + 1;
                    int wrap = b->mode == RESUME_SAME_WORLD ? WRAP_LINEAR : st % NUM_WRAPS;
                    fsdp_ctx *ctx = NULL;
                    fsdp_desc d = mlp_desc(comm, (fsdp_strategy)strategy, wrap, opt, RESTART_SEED);
                    fsdp_load_report report;
                    mlp m;
                    if ((rc = mlp_build(&m)) != 0) return rank_fail(&b->error, comm, "mlp_build", rc, "");
                    resume_stem(stem, sizeof stem, sw + 1, st, opt);
                    checkpoint_path(path, sizeof path, b->dir, format, stem);
                    snprintf(what, sizeof what, "resume %s %s at P=%d %s", format_names[format], stem, b->load_world,
                             strategy_names[strategy]);
                    if ((rc = fsdp_init(&ctx, m.model, &d)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(NULL));
                    else if ((rc = load(ctx, format, path, b->with_optimizer, &report)) != 0)
                        status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                    for (s = RESUME_AT; s < RESUME_STEPS && !status; s++)
                        if ((rc = train_step(ctx, &m, comm, s, &where)) != 0) status = rank_fail(&b->error, comm, where, rc, fsdp_last_error(ctx));
                    if (!status && (rc = gather_all(ctx, &m, values)) != 0) status = rank_fail(&b->error, comm, what, rc, fsdp_last_error(ctx));
                    if (!status && fsdp_comm_rank(comm) == 0) {
                        memcpy(b->resumed[lw][sw][st - 1][opt][format], values, sizeof values);
                        b->resumed_step[lw][sw][st - 1][opt][format] = report.step;
                        b->resumed_done[lw][sw][st - 1][opt][format] = 1;
                    }
                    fsdp_destroy(ctx);
                    fsdp_model_destroy(m.model);
                }
    }
    return status;
}

static resume_board *run_resume(int mode, int with_optimizer, int only_world) {
    resume_board *b = (resume_board *)map_board(sizeof(resume_board));
    fsdp_launch_status status;
    int world, rc;
    snprintf(b->dir, sizeof b->dir, "%s", tmpdir);
    b->mode = mode;
    b->with_optimizer = with_optimizer;
    for (world = 1; world <= MAX_WORLD; world++) {
        if (only_world && world != only_world) continue;
        b->save_world = world;
        rc = launch(world, resume_save_rank, b, &status);
        snprintf(message, sizeof message, "training and saving at P=%d", world);
        assert_launch_ok(rc, &status, &b->error, message);
    }
    for (world = 1; world <= MAX_WORLD; world++) {
        if (only_world && world != only_world) continue;
        b->load_world = world;
        rc = launch(world, resume_load_rank, b, &status);
        snprintf(message, sizeof message, "resuming at P=%d", world);
        assert_launch_ok(rc, &status, &b->error, message);
    }
    return b;
}

static void test_resume_at_the_same_world_size_and_strategy_is_bitwise_exact(void) {
    resume_board *b = run_resume(RESUME_SAME_WORLD, 1, 0);
    int world, st, opt, format;
    for (world = 0; world < MAX_WORLD; world++)
        for (st = 0; st < NUM_STRATEGIES; st++)
            for (opt = 0; opt < NUM_OPTS; opt++)
                for (format = 0; format < NUM_FORMATS; format++) {
                    const float *want = b->uninterrupted[world][st][opt], *got = b->resumed[world][world][st][opt][format];
                    snprintf(message, sizeof message, "P=%d %s %s, resumed from the %s checkpoint after step %d: %s", world + 1,
                             strategy_names[st + 1], opt_names[opt], format_names[format], RESUME_AT,
                             first_difference(want, got, MODEL_NUMEL));
                    TEST_ASSERT_EQUAL_INT_MESSAGE(1, b->resumed_done[world][world][st][opt][format], message);
                    TEST_ASSERT_EQUAL_INT64_MESSAGE(RESUME_AT, b->resumed_step[world][world][st][opt][format], message);
                    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, got, sizeof(float) * MODEL_NUMEL, message);
                }
}

static void test_resume_at_another_world_size_strategy_and_wrap_policy_matches_within_float_rounding(void) {
    resume_board *b = run_resume(RESUME_OTHER_WORLD, 1, 0);
    int lw, sw, st, opt, format, i;
    for (lw = 0; lw < MAX_WORLD; lw++)
        for (sw = 0; sw < MAX_WORLD; sw++) {
            if (sw == lw) continue;
            for (st = 0; st < NUM_STRATEGIES; st++)
                for (opt = 0; opt < NUM_OPTS; opt++)
                    for (format = 0; format < NUM_FORMATS; format++) {
                        const float *want = b->uninterrupted[sw][st][opt], *got = b->resumed[lw][sw][st][opt][format];
                        double worst = 0.0;
                        int worst_at = 0;
                        for (i = 0; i < MODEL_NUMEL; i++) {
                            double rel = rel_error(got[i], want[i], REL_FLOOR);
                            if (!(rel <= worst)) { worst = rel; worst_at = i; }
                        }
                        snprintf(message, sizeof message, "saved at P=%d %s %s after step %d, resumed from the %s checkpoint at "
                                 "P=%d %s wrap %s: relative error %.3g at element %d (%.9g vs %.9g)", sw + 1,
                                 strategy_names[st + 1], opt_names[opt], RESUME_AT, format_names[format], lw + 1,
                                 strategy_names[(st + 1) % NUM_STRATEGIES + 1], wrap_names[(st + 1) % NUM_WRAPS], worst,
                                 worst_at, got[worst_at], want[worst_at]);
                        TEST_ASSERT_EQUAL_INT_MESSAGE(1, b->resumed_done[lw][sw][st][opt][format], message);
                        TEST_ASSERT_TRUE_MESSAGE(worst <= RESUME_TOLERANCE, message);
                    }
        }
}

/* The control: without the optimizer state (moments, momentum, step count) the resumed run
   differs, so the tests above do check that the state was saved and restored. */
static void test_resume_without_the_optimizer_state_differs_from_training_without_a_break(void) {
    resume_board *b = run_resume(RESUME_SAME_WORLD, 0, 2);
    int st, opt, format;
    for (st = 0; st < NUM_STRATEGIES; st++)
        for (opt = 0; opt < NUM_OPTS; opt++)
            for (format = 0; format < NUM_FORMATS; format++) {
                snprintf(message, sizeof message, "P=2 %s %s %s", strategy_names[st + 1], opt_names[opt], format_names[format]);
                TEST_ASSERT_EQUAL_INT_MESSAGE(1, b->resumed_done[1][1][st][opt][format], message);
                TEST_ASSERT_TRUE_MESSAGE(memcmp(b->uninterrupted[1][st][opt], b->resumed[1][1][st][opt][format],
                                                sizeof(float) * MODEL_NUMEL) != 0, message);
            }
}

/* ---------------------------------------------------------------------------------------------
   a rank killed in the middle of a save leaves the previous checkpoint
   --------------------------------------------------------------------------------------------- */
/* Big enough that writing takes a while (two 1024x1024 Linear layers: 8 MiB of parameters,
   24 MiB with AdamW's state). */
#define BIG_DIM 1024
#define KILL_WORLD 2
#define KILL_ATTEMPTS 3
#define GOOD_SEED 11u
#define NEW_SEED 22u

enum { KILL_NOBODY, KILL_WRITING_FULL_FILE, KILL_WRITING_SHARD_FILE, KILL_BEFORE_INDEX_COMMIT };
enum { BIG_SAVE, BIG_CHECK };

typedef struct kill_board {
    char path[256];      /* the full file or the sharded directory */
    int format;
    int action;          /* BIG_SAVE or BIG_CHECK (load and compare with the initial values) */
    uint64_t seed;
    int kill_rank, kill_when;
    int fired;           /* the watcher killed its rank */
    int too_late;        /* KILL_BEFORE_INDEX_COMMIT: index.json was already replaced */
    int64_t checked, mismatches;
    rank_error error;
} kill_board;

static int big_build(fsdp_model **out, int *params) {
    fsdp_init_rule normal = {FSDP_INIT_NORMAL, 0.0f, 0.02f, NULL, NULL};
    int64_t weight[2] = {BIG_DIM, BIG_DIM}, bias[1] = {BIG_DIM};
    int layers, l, rc;
    if ((rc = fsdp_model_create(out, "Big")) != 0) return rc;
    if ((layers = fsdp_model_module(*out, 0, "layers", "ModuleList")) < 0) return layers;
    for (l = 0; l < 2; l++) {
        int mod = fsdp_model_module(*out, layers, l ? "1" : "0", "Linear");
        if (mod < 0) return mod;
        if ((params[2 * l] = fsdp_model_param(*out, mod, "weight", 2, weight, normal)) < 0) return params[2 * l];
        if ((params[2 * l + 1] = fsdp_model_param(*out, mod, "bias", 1, bias, normal)) < 0) return params[2 * l + 1];
    }
    return 0;
}

/* The thread that kills its own rank (SIGKILL: no cleanup of any kind) at the chosen moment. */
typedef struct watcher {
    kill_board *board;
    volatile int stop;
    int world;
    char own_mark[32];           /* "-<pid>-": in this process's temporary file names, after ".tmp.<host>" */
    char full_dir[320];          /* where the full file is written, and its name's start while temporary */
    char full_prefix[300];
    char old[16][128];           /* the directory's entries before the save */
    int num_old;
    struct stat index_before;
} watcher;

static int name_is_old(const watcher *w, const char *name) {
    int i;
    for (i = 0; i < w->num_old; i++)
        if (strcmp(w->old[i], name) == 0) return 1;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* name is one of this process's temporary files: "<final>.tmp.<host>-<pid>-<random>". */
static int is_own_tmp(const watcher *w, const char *name) {
    const char *tmp = strstr(name, ".tmp.");
    return tmp && strstr(tmp, w->own_mark) != NULL;
}

/* A temporary file of this process for the full checkpoint exists and has bytes in it. */
static int full_tmp_has_bytes(const watcher *w) {
    DIR *d = opendir(w->full_dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)) != NULL) {
        char path[700];
        struct stat st;
        if (strncmp(e->d_name, w->full_prefix, strlen(w->full_prefix)) != 0 || !is_own_tmp(w, e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", w->full_dir, e->d_name);
        found = stat(path, &st) == 0 && st.st_size > 0;
    }
    if (d) closedir(d);
    return found;
}

static int moment_has_come(watcher *w) {
    kill_board *b = w->board;
    struct stat st;
    DIR *d;
    struct dirent *e;
    int hit = 0, new_shards = 0;
    if (b->kill_when == KILL_WRITING_FULL_FILE) return full_tmp_has_bytes(w);
    if (!(d = opendir(b->path))) return 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "shard-", 6) != 0) continue;
        if (b->kill_when == KILL_WRITING_SHARD_FILE && is_own_tmp(w, e->d_name)) hit = 1;
        if (b->kill_when == KILL_BEFORE_INDEX_COMMIT && !strstr(e->d_name, ".tmp.") && !name_is_old(w, e->d_name)) new_shards++;
    }
    closedir(d);
    if (b->kill_when == KILL_BEFORE_INDEX_COMMIT && new_shards == w->world) { /* every new shard file is in place */
        char index[300];
        snprintf(index, sizeof index, "%s/index.json", b->path);
        if (stat(index, &st) != 0 || st.st_ino != w->index_before.st_ino) b->too_late = 1;
        hit = 1;
    }
    return hit;
}

static void *watch_and_kill(void *arg) {
    watcher *w = (watcher *)arg;
    double deadline = fsdp_now() + 20.0;
    while (!w->stop && fsdp_now() < deadline)
        if (moment_has_come(w)) {
            w->board->fired = 1;
            kill(getpid(), SIGKILL);
        }
    return NULL;
}

static void watcher_prepare(watcher *w, kill_board *b, int world) {
    DIR *d;
    struct dirent *e;
    char index[300];
    memset(w, 0, sizeof *w);
    w->board = b;
    w->world = world;
    snprintf(w->own_mark, sizeof w->own_mark, "-%d-", (int)getpid());
    {
        const char *slash = strrchr(b->path, '/');
        snprintf(w->full_dir, sizeof w->full_dir, "%.*s", slash ? (int)(slash - b->path) : 1, slash ? b->path : ".");
        snprintf(w->full_prefix, sizeof w->full_prefix, "%s.tmp.", slash ? slash + 1 : b->path);
    }
    if ((d = opendir(b->path)) != NULL) {
        while ((e = readdir(d)) != NULL && w->num_old < 16) snprintf(w->old[w->num_old++], sizeof w->old[0], "%.120s", e->d_name);
        closedir(d);
    }
    snprintf(index, sizeof index, "%s/index.json", b->path);
    stat(index, &w->index_before);
}

static int big_rank(fsdp_comm *comm, void *arg) {
    kill_board *b = (kill_board *)arg;
    int params[4], rc, status = 0, rank = fsdp_comm_rank(comm), p;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    watcher w;
    pthread_t thread;
    int watching = 0;
    if ((rc = big_build(&model, params)) != 0) return rank_fail(&b->error, comm, "big_build", rc, "");
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.seed = b->action == BIG_SAVE ? b->seed : 999u;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = linear_types;
    d.optimizer.kind = FSDP_ADAMW;
    if ((rc = fsdp_init(&ctx, model, &d)) != 0) {
        fsdp_model_destroy(model);
        return rank_fail(&b->error, comm, "fsdp_init", rc, fsdp_last_error(NULL));
    }
    if (b->action == BIG_SAVE) {
        if (b->kill_when != KILL_NOBODY && rank == b->kill_rank) {
            watcher_prepare(&w, b, fsdp_comm_size(comm));
            watching = pthread_create(&thread, NULL, watch_and_kill, &w) == 0;
            if (!watching) status = rank_fail(&b->error, comm, "pthread_create", FSDP_ERR_SYSTEM, strerror(errno));
        }
        if (!status && (rc = save(ctx, b->format, b->path, 1)) != 0) status = rank_fail(&b->error, comm, "save", rc, fsdp_last_error(ctx));
        if (watching) {
            w.stop = 1;
            pthread_join(thread, NULL);
        }
    } else {
        float *values = (float *)malloc(sizeof(float) * BIG_DIM * BIG_DIM);
        if (!values) status = rank_fail(&b->error, comm, "malloc", FSDP_ERR_OUT_OF_MEMORY, "");
        else if ((rc = load(ctx, b->format, b->path, 1, NULL)) != 0) status = rank_fail(&b->error, comm, "load", rc, fsdp_last_error(ctx));
        for (p = 0; p < 4 && !status; p++) {
            int64_t i, n = fsdp_model_param_numel(model, params[p]);
            if ((rc = fsdp_gather_param(ctx, params[p], values)) != 0) status = rank_fail(&b->error, comm, "gather", rc, fsdp_last_error(ctx));
            for (i = 0; !status && rank == 0 && i < n; i++) {
                float want = fsdp_init_value(model, params[p], i, b->seed);
                b->mismatches += memcmp(&want, &values[i], sizeof want) != 0;
                b->checked++;
            }
        }
        free(values);
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return status;
}

/* The directory's files and their bytes, to compare before and after. */
typedef struct snapshot {
    int count;
    char name[16][128];
    unsigned char *bytes[16];
    size_t size[16];
} snapshot;

static snapshot before_kill;

static void snapshot_free(snapshot *s) {
    int i;
    for (i = 0; i < s->count; i++) free(s->bytes[i]);
    memset(s, 0, sizeof *s);
}

static void snapshot_take(snapshot *s, const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512];
    snapshot_free(s);
    TEST_ASSERT_NOT_NULL(d);
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        TEST_ASSERT_TRUE(s->count < 16);
        snprintf(s->name[s->count], sizeof s->name[0], "%.120s", e->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        read_file(path);
        s->bytes[s->count] = file_bytes;
        s->size[s->count] = file_size;
        file_bytes = NULL;
        s->count++;
    }
    closedir(d);
}

/* 1 if every file of the snapshot still holds its bytes (no assertion). */
static int snapshot_same(const snapshot *s, const char *dir) {
    char path[512];
    int i, same = 1;
    for (i = 0; i < s->count && same; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, s->name[i]);
        read_file(path);
        same = file_bytes && file_size == s->size[i] && (!file_size || memcmp(file_bytes, s->bytes[i], file_size) == 0);
    }
    return same;
}

static void assert_snapshot_unchanged(const snapshot *s, const char *dir) {
    char path[512];
    int i;
    for (i = 0; i < s->count; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, s->name[i]);
        read_file(path);
        snprintf(message, sizeof message, "%s changed (%zu bytes before, %zu after)", path, s->size[i], file_size);
        TEST_ASSERT_EQUAL_size_t_MESSAGE(s->size[i], file_size, message);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(s->bytes[i], file_bytes, file_size, message);
    }
}

/* Every file under a final name (no ".tmp.") in dir is a complete safetensors file whose
   checksums verify, or index.json. */
static void assert_no_partial_file_under_a_final_name(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512], err[1024];
    TEST_ASSERT_NOT_NULL(d);
    while ((e = readdir(d)) != NULL) {
        fsdp_st_file *f = NULL;
        int i, rc;
        if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp.") || strcmp(e->d_name, "index.json") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc = fsdp_st_open(&f, path, err, sizeof err);
        snprintf(message, sizeof message, "%s is visible under its final name but does not open: %s", path, err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
        for (i = 0; i < fsdp_st_num_tensors(f); i++) {
            rc = fsdp_st_verify(f, i, err, sizeof err);
            snprintf(message, sizeof message, "%s is visible under its final name but does not verify: %s", path, err);
            if (rc != FSDP_SUCCESS) fsdp_st_close(f);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
        }
        fsdp_st_close(f);
    }
    closedir(d);
}

static void big_launch(kill_board *b, int world, int action, uint64_t seed, int kill_when, int kill_rank,
                       int *rc, fsdp_launch_status *status) {
    b->action = action;
    b->seed = seed;
    b->kill_when = kill_when;
    b->kill_rank = kill_rank;
    b->fired = b->too_late = 0;
    b->checked = b->mismatches = 0;
    memset(&b->error, 0, sizeof b->error);
    *rc = launch(world, big_rank, b, status);
}

static void assert_kill_mid_save_leaves_previous_checkpoint(int format, int kill_when, int kill_rank) {
    kill_board *b = (kill_board *)map_board(sizeof(kill_board));
    fsdp_launch_status status;
    const char *dir;
    int rc, attempt;
    b->format = format;
    checkpoint_path(b->path, sizeof b->path, tmpdir, format, "ckpt");
    dir = format == FORMAT_FULL ? tmpdir : b->path;
    for (attempt = 0; attempt < KILL_ATTEMPTS; attempt++) {
        big_launch(b, KILL_WORLD, BIG_SAVE, GOOD_SEED, KILL_NOBODY, -1, &rc, &status);
        assert_launch_ok(rc, &status, &b->error, "the good save");
        snapshot_take(&before_kill, dir);
        big_launch(b, KILL_WORLD, BIG_SAVE, NEW_SEED, kill_when, kill_rank, &rc, &status);
        if (b->fired && !b->too_late && snapshot_same(&before_kill, dir)) break;
        /* the watcher missed its moment (the save was too quick), or its thread was descheduled
           between its last look and the kill while the save went on and committed (a loaded
           machine, under ASan: CI saw index.json replaced so once): try again. A save that
           overwrites the previous checkpoint every time still fails below. */
    }
    snprintf(message, sizeof message, "the watcher never caught the save in time in %d attempts (launch: %s | %s)",
             KILL_ATTEMPTS, status.message, b->error.text);
    TEST_ASSERT_TRUE_MESSAGE(b->fired && !b->too_late, message);
    snprintf(message, sizeof message, "expected rank %d killed by SIGKILL: %s", kill_rank, status.message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_RANK_FAILED, rc, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(kill_rank, status.failed_rank, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(SIGKILL, status.signal, message);

    assert_snapshot_unchanged(&before_kill, dir);
    assert_no_partial_file_under_a_final_name(dir);
    /* and it loads, at another world size, strictly, with the good save's values */
    big_launch(b, KILL_WORLD + 1, BIG_CHECK, GOOD_SEED, KILL_NOBODY, -1, &rc, &status);
    assert_launch_ok(rc, &status, &b->error, "loading the previous checkpoint after the killed save");
    TEST_ASSERT_EQUAL_INT64((int64_t)2 * (BIG_DIM * BIG_DIM + BIG_DIM), b->checked);
    TEST_ASSERT_EQUAL_INT64_MESSAGE(0, b->mismatches, "elements that differ from the previous checkpoint's values");
}

static void test_kill_while_writing_a_full_checkpoint_leaves_the_previous_file(void) {
    assert_kill_mid_save_leaves_previous_checkpoint(FORMAT_FULL, KILL_WRITING_FULL_FILE, 0);
}

static void test_kill_while_writing_a_shard_file_leaves_the_previous_sharded_checkpoint(void) {
    assert_kill_mid_save_leaves_previous_checkpoint(FORMAT_SHARDED, KILL_WRITING_SHARD_FILE, 1);
}

static void test_kill_after_the_shard_files_before_index_commit_leaves_the_previous_sharded_checkpoint(void) {
    assert_kill_mid_save_leaves_previous_checkpoint(FORMAT_SHARDED, KILL_BEFORE_INDEX_COMMIT, 0);
}

/* ---------------------------------------------------------------------------------------------
   malformed and corrupted files: FSDP_ERR_CORRUPT with a message saying what is wrong
   --------------------------------------------------------------------------------------------- */
/* Hand-written headers. T(name, dtype, shape, begin, end) is one tensor entry. */
#define T(name, dtype, shape, begin, end) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #begin "," #end "]}"

static void test_parse_hand_built_valid_file_succeeds(void) { /* the control for the hand-built cases */
    fsdp_st_file *f = NULL;
    char err[512] = "";
    float a[2];
    build_hand_file("{\"__metadata__\":{\"format\":\"pt\"}," T("a", "F32", "[2]", 0, 8) "," T("b", "BF16", "[1,1]", 8, 10) "}", 10);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_parse(&f, hand_image, hand_size, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(2, fsdp_st_num_tensors(f));
    TEST_ASSERT_EQUAL_STRING("pt", fsdp_st_metadata(f, "format"));
    TEST_ASSERT_EQUAL_INT(0, fsdp_st_read(f, 0, 0, 2, a, err, sizeof err));
    TEST_ASSERT_EQUAL_MEMORY(hand_image + hand_size - 10, a, 8);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_UNSUPPORTED, fsdp_st_verify(f, 0, err, sizeof err)); /* no checksum stored */
    fsdp_st_close(f);
}

static void test_parse_file_truncated_inside_the_8_byte_length_is_corrupt(void) {
    size_t cut;
    load_good_file();
    for (cut = 0; cut < 8; cut += 3) assert_corrupt(file_bytes, cut, "shorter than the 8-byte header length");
    assert_corrupt(file_bytes, 7, "shorter than the 8-byte header length");
}

static void test_parse_file_truncated_inside_the_header_is_corrupt(void) {
    size_t hlen;
    load_good_file();
    hlen = (size_t)header_length(file_bytes);
    assert_corrupt(file_bytes, 8, "header length");
    assert_corrupt(file_bytes, 9, "header length");
    assert_corrupt(file_bytes, 8 + hlen / 2, "header length");
    assert_corrupt(file_bytes, 8 + hlen - 1, "header length");
}

static void test_parse_file_truncated_inside_the_data_is_corrupt(void) {
    size_t start;
    load_good_file();
    start = 8 + (size_t)header_length(file_bytes);
    assert_corrupt(file_bytes, start, "run past the data");
    assert_corrupt(file_bytes, start + 1, "run past the data");
    assert_corrupt(file_bytes, start + GOOD_WEIGHT_BYTES / 2, "run past the data");
    assert_corrupt(file_bytes, file_size - 1, "run past the data");
}

/* The length is the file's first 8 bytes: the message says it does not fit, never what it is
   (the "file" might be a symlink to something secret). */
static void test_parse_huge_header_length_is_corrupt(void) {
    load_good_file();
    put_header_length(file_bytes, (uint64_t)1 << 63);
    assert_corrupt(file_bytes, file_size, "header length in the first 8 bytes does not fit");
    TEST_ASSERT_NULL_MESSAGE(strstr(message, "9223372036854775808"), message);
    put_header_length(file_bytes, UINT64_MAX);
    assert_corrupt(file_bytes, file_size, "header length in the first 8 bytes does not fit");
    TEST_ASSERT_NULL_MESSAGE(strstr(message, "18446744073709551615"), message);
    build_image((uint64_t)1 << 63, "{}", NULL, 0);
    assert_corrupt(hand_image, hand_size, "does not fit");
}

static void test_parse_header_length_larger_than_the_file_is_corrupt(void) {
    load_good_file();
    put_header_length(file_bytes, file_size - 8 + 1);
    assert_corrupt(file_bytes, file_size, "does not fit");
    build_image(100, "{}", NULL, 0);
    assert_corrupt(hand_image, hand_size, "does not fit a file of 10 bytes");
    TEST_ASSERT_NULL_MESSAGE(strstr(message, "length 100"), message);
}

static void test_parse_header_length_too_small_for_an_object_is_corrupt(void) {
    build_image(0, "{}", NULL, 0);
    assert_corrupt(hand_image, hand_size, "header length in the first 8 bytes does not fit");
    build_image(1, "{}", NULL, 0);
    assert_corrupt(hand_image, hand_size, "header length in the first 8 bytes does not fit");
}

static void test_parse_offsets_past_the_end_of_the_data_are_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "F32", "[4]", 0, 16) "}", 8, "tensor 'a': data_offsets [0, 16] run past the data (8 bytes)");
    load_good_file();
    patch_header("[48,60]", "[48,99]");
    assert_corrupt(file_bytes, file_size, "tensor 'embed.bias': data_offsets [48, 99] run past the data (60 bytes)");
}

static void test_parse_offsets_not_begin_then_end_are_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "F32", "[0]", 8, 0) "}", 8, "tensor 'a': data_offsets must be [begin, end]");
    assert_hand_file_corrupt("{" T("a", "F32", "[1]", -4, 0) "}", 8, "tensor 'a': data_offsets must be [begin, end]");
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets must be");
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 8, "data_offsets must be");
}

static void test_parse_overlapping_offsets_are_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12,
                             "tensors 'a' and 'b' overlap");
    assert_hand_file_corrupt("{" T("a", "F32", "[1]", 4, 8) "," T("b", "F32", "[3]", 0, 12) "}", 12, "overlap");
    load_good_file();
    patch_header("[48,60]", "[36,48]");
    assert_corrupt(file_bytes, file_size, "tensors 'embed.weight' and 'embed.bias' overlap in the data");
}

static void test_parse_bad_json_unterminated_string_is_corrupt(void) {
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32}}", 0, "bad JSON: unterminated string");
    assert_hand_file_corrupt("{\"abc", 0, "bad JSON: unterminated string");
    assert_hand_file_corrupt("{\"a\\\"}", 0, "bad JSON: unterminated string"); /* {"a\"} */
}

static void test_parse_bad_json_trailing_comma_is_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "F32", "[2]", 0, 8) ",}", 8, "bad JSON");
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", 8, "bad JSON");
}

static void test_parse_bad_json_missing_colon_is_corrupt(void) {
    assert_hand_file_corrupt("{\"a\" {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "bad JSON: expected ':'");
}

static void test_parse_bad_json_unknown_escape_is_corrupt(void) {
    assert_hand_file_corrupt("{\"a\\q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "bad JSON: unknown escape");
    assert_hand_file_corrupt("{\"a\\u12G4\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "bad JSON: bad \\u escape");
    assert_hand_file_corrupt("{\"a\\u12\":1}", 0, "bad JSON: bad \\u escape");
}

static void test_parse_bad_json_lone_surrogate_is_corrupt(void) {
    assert_hand_file_corrupt("{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "bad JSON: lone surrogate");
    assert_hand_file_corrupt("{\"a\\udc00b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "bad JSON: lone surrogate");
    assert_hand_file_corrupt("{\"a\\ud800\\u0041\":1}", 0, "bad JSON: bad surrogate pair");
}

static void test_parse_bad_json_nested_too_deeply_is_corrupt(void) {
    char header[1024];
    int depth = 200, i, n = 0;
    n += snprintf(header + n, sizeof header - (size_t)n, "{\"__metadata__\":");
    for (i = 0; i < depth; i++) header[n++] = '[';
    for (i = 0; i < depth; i++) header[n++] = ']';
    header[n++] = '}';
    header[n] = 0;
    assert_hand_file_corrupt(header, 0, "bad JSON: nested too deeply");
}

static void test_parse_bad_json_other_syntax_errors_are_corrupt(void) {
    assert_hand_file_corrupt("[1,2]   ", 0, "does not start with '{'");
    assert_hand_file_corrupt("{}x", 0, "bad JSON: trailing characters");
    assert_hand_file_corrupt("{\"a\":tru}", 0, "bad JSON: bad literal");
    assert_hand_file_corrupt("{\"a\":-}", 0, "bad JSON: bad number");
    assert_hand_file_corrupt("{\"a\":1 \"b\":2}", 0, "bad JSON: expected ',' or '}'");
    assert_hand_file_corrupt("{\"a\":\"x\ty\"}", 0, "bad JSON: control character in a string");
    assert_hand_file_corrupt("{\"a\\u0000\":1}", 0, "bad JSON: \\u0000 in a string");
}

static void test_parse_header_that_is_not_a_tensor_table_is_corrupt(void) {
    assert_hand_file_corrupt("{\"a\":5}", 0, "entry 'a' is not an object");
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor 'a' lacks dtype, shape or data_offsets");
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                             "tensor 'a': shape entry 0 is not a non-negative integer");
    assert_hand_file_corrupt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                             "tensor 'a' has 9 dimensions");
}

static void test_parse_unknown_dtype_is_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "I64", "[1]", 0, 8) "}", 8, "tensor 'a' has unknown dtype 'I64'");
    assert_hand_file_corrupt("{" T("a", "F64", "[1]", 0, 8) "}", 8, "tensor 'a' has unknown dtype 'F64'");
    load_good_file();
    patch_header("F32", "I64");
    assert_corrupt(file_bytes, file_size, "unknown dtype 'I64'");
}

static void test_parse_shape_that_does_not_match_its_byte_count_is_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "F32", "[3]", 0, 8) "}", 8,
                             "tensor 'a': shape holds 3 elements of F32 but data_offsets span 8 bytes");
    assert_hand_file_corrupt("{" T("a", "BF16", "[2,2]", 0, 4) "}", 4, "shape holds 4 elements of BF16 but data_offsets span 4 bytes");
    assert_hand_file_corrupt("{" T("a", "F32", "[4611686018427387904,4]", 0, 8) "}", 8, "tensor 'a': shape holds");
    load_good_file();
    patch_header("[4,3]", "[4,2]");
    assert_corrupt(file_bytes, file_size, "tensor 'embed.weight': shape holds 8 elements of F32 but data_offsets span 48 bytes");
}

static void test_parse_duplicate_tensor_names_are_corrupt(void) {
    assert_hand_file_corrupt("{" T("a", "F32", "[1]", 0, 4) "," T("a", "F32", "[1]", 4, 8) "}", 8, "tensor 'a' appears twice");
}

static void test_parse_metadata_that_is_not_a_map_of_strings_is_corrupt(void) {
    assert_hand_file_corrupt("{\"__metadata__\":{\"format\":\"pt\",\"step\":5}}", 0, "__metadata__ value of 'step' is not a string");
    assert_hand_file_corrupt("{\"__metadata__\":{\"tags\":[\"a\"]}}", 0, "__metadata__ value of 'tags' is not a string");
    assert_hand_file_corrupt("{\"__metadata__\":\"pt\"}", 0, "__metadata__ is not a map of strings");
    assert_hand_file_corrupt("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ is not a map of strings");
}

/* A flipped data byte: the file still parses, and the checksum names the tensor. */
static void test_verify_flipped_data_byte_is_corrupt_naming_the_tensor(void) {
    fsdp_st_file *f = NULL;
    char err[1024] = "";
    int a, b;
    load_good_file();
    file_bytes[8 + header_length(file_bytes) + GOOD_WEIGHT_BYTES + 5] ^= 0x10; /* inside embed.bias */
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_parse(&f, file_bytes, file_size, err, sizeof err), err);
    a = fsdp_st_find(f, "embed.weight");
    b = fsdp_st_find(f, "embed.bias");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_verify(f, a, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_CORRUPT, fsdp_st_verify(f, b, err, sizeof err));
    fsdp_st_close(f);
    snprintf(message, sizeof message, "message: \"%s\"", err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "tensor 'embed.bias' is corrupt"), message);
}

static void test_verify_malformed_stored_checksum_is_corrupt(void) {
    fsdp_st_file *f = NULL;
    char err[1024] = "";
    build_hand_file("{\"__metadata__\":{\"crc32c.a\":\"xyz\"}," T("a", "F32", "[1]", 0, 4) "}", 4);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_parse(&f, hand_image, hand_size, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_CORRUPT, fsdp_st_verify(f, 0, err, sizeof err));
    fsdp_st_close(f);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "checksum of 'a' is malformed"), err);
}

/* fsdp_load_full checks every checksum before loading anything. */
static void test_load_full_with_a_flipped_data_byte_is_corrupt_naming_the_tensor_and_loads_nothing(void) {
    float before[MODEL_NUMEL], after[MODEL_NUMEL];
    char path[256];
    fsdp_st_file *f = NULL;
    fsdp_load_options lo;
    const fsdp_st_tensor *t;
    char err[512];
    start_one_rank(FSDP_FULL_SHARD, 3);
    checkpoint_path(path, sizeof path, tmpdir, FORMAT_FULL, "flip");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_FULL, path, 0), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_open(&f, path, err, sizeof err), err);
    t = fsdp_st_tensor_at(f, fsdp_st_find(f, "layers.1.weight"));
    TEST_ASSERT_NOT_NULL(t);
    read_file(path);
    file_bytes[8 + header_length(file_bytes) + t->begin + 3] ^= 0x01;
    fsdp_st_close(f);
    write_file(path, file_bytes, file_size);
    restart_one_rank(FSDP_FULL_SHARD, LOAD_SEED);
    gather_one_rank(before);
    memset(&lo, 0, sizeof lo);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_CORRUPT, fsdp_load_full(ctx1, path, &lo, NULL));
    snprintf(message, sizeof message, "message: \"%s\"", fsdp_last_error(ctx1));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), "'layers.1.weight' is corrupt"), message);
    gather_one_rank(after);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(before, after, sizeof before, "parameters changed by a failed load");
}

static void test_load_sharded_with_a_flipped_data_byte_is_corrupt_naming_the_tensor(void) {
    char dir[256], path[512];
    DIR *d;
    struct dirent *e;
    fsdp_load_options lo;
    start_one_rank(FSDP_FULL_SHARD, 3);
    checkpoint_path(dir, sizeof dir, tmpdir, FORMAT_SHARDED, "flip");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_SHARDED, dir, 0), fsdp_last_error(ctx1));
    d = opendir(dir);
    TEST_ASSERT_NOT_NULL(d);
    path[0] = 0;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "shard-", 6) == 0 && ends_with(e->d_name, ".safetensors"))
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    closedir(d);
    TEST_ASSERT_TRUE_MESSAGE(path[0] != 0, "no shard file in the sharded checkpoint");
    read_file(path);
    TEST_ASSERT_TRUE(file_size > 8);
    file_bytes[file_size - 1] ^= 0x80; /* the last tensor's last byte: layers.1.bias */
    write_file(path, file_bytes, file_size);
    restart_one_rank(FSDP_FULL_SHARD, LOAD_SEED);
    memset(&lo, 0, sizeof lo);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_CORRUPT, fsdp_load_sharded(ctx1, dir, &lo, NULL));
    snprintf(message, sizeof message, "message: \"%s\"", fsdp_last_error(ctx1));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), "'layers.1.bias' is corrupt"), message);
}

/* A checkpoint that is not there is an input/output error naming the path, not a crash. */
static void test_load_of_a_missing_checkpoint_is_an_io_error_naming_the_path(void) {
    char path[256];
    start_one_rank(FSDP_FULL_SHARD, 3);
    checkpoint_path(path, sizeof path, tmpdir, FORMAT_FULL, "absent");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_IO, fsdp_load_full(ctx1, path, NULL, NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), path), fsdp_last_error(ctx1));
    checkpoint_path(path, sizeof path, tmpdir, FORMAT_SHARDED, "absent");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_IO, fsdp_load_sharded(ctx1, path, NULL, NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), path), fsdp_last_error(ctx1));
}

/* ---------------------------------------------------------------------------------------------
   strict and non-strict loads of a checkpoint of a slightly different model
   --------------------------------------------------------------------------------------------- */
/* The other model's tensors. Against mlp: scale and layers.0.bias match; layers.0.weight has
   another shape; layers.1.weight and layers.1.bias are missing; layers.2.weight and head.bias
   are unexpected. */
#define NUM_VARIANT 5
#define NUM_PROBLEMS 5
static const char *const variant_names[NUM_VARIANT] = {"scale", "layers.0.weight", "layers.0.bias", "layers.2.weight",
                                                       "head.bias"};
static const int variant_ndim[NUM_VARIANT] = {1, 2, 1, 2, 1};
static const int64_t variant_shape[NUM_VARIANT][2] = {{D, 0}, {H, D - 1}, {H, 0}, {C, H}, {C, 0}};
static const char *const expected_problems[NUM_PROBLEMS][2] = {
    {"shape", "layers.0.weight"}, {"unexpected", "layers.2.weight"}, {"unexpected", "head.bias"},
    {"missing", "layers.1.weight"}, {"missing", "layers.1.bias"}};

static float variant_value(const char *name, int64_t index) {
    return 100.0f + (float)strlen(name) + 0.25f * (float)index;
}

static float variant_init(void *user, const char *name, int64_t index, uint64_t seed) {
    (void)user;
    (void)seed;
    return variant_value(name, index);
}

/* The other model as a file, written tensor by tensor with fsdp_st_writer. */
static void write_variant_file(const char *path) {
    fsdp_st_spec specs[NUM_VARIANT];
    fsdp_st_writer *w = NULL;
    char err[512] = "";
    int i, k;
    memset(specs, 0, sizeof specs);
    for (i = 0; i < NUM_VARIANT; i++) {
        specs[i].name = variant_names[i];
        specs[i].dtype = FSDP_F32;
        specs[i].ndim = variant_ndim[i];
        for (k = 0; k < variant_ndim[i]; k++) specs[i].shape[k] = variant_shape[i][k];
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, NUM_VARIANT, NULL, 0, err, sizeof err), err);
    for (i = 0; i < NUM_VARIANT; i++) {
        int64_t n = variant_shape[i][0] * (variant_ndim[i] == 2 ? variant_shape[i][1] : 1), j;
        for (j = 0; j < n; j++) {
            float v = variant_value(variant_names[i], j);
            TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, &v, 1));
        }
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
}

typedef struct problem {
    char kind[16], name[64], detail[160];
} problem;

#define MAX_REPORTED 16
typedef struct problem_board {
    char path[256];
    int format, strict;
    int rc[MAX_WORLD];
    fsdp_load_report report[MAX_WORLD];
    int calls[MAX_WORLD];
    problem problems[MAX_REPORTED]; /* rank 0's on_problem calls */
    char load_error[1024];          /* rank 0's fsdp_last_error */
    float before[MODEL_NUMEL], after[MODEL_NUMEL];
    rank_error error;
} problem_board;

typedef struct problem_sink {
    problem_board *board;
    int rank;
} problem_sink;

static void record_problem(void *user, const char *kind, const char *name, const char *detail) {
    problem_sink *sink = (problem_sink *)user;
    problem_board *b = sink->board;
    int n = b->calls[sink->rank]++;
    if (sink->rank == 0 && n < MAX_REPORTED) {
        snprintf(b->problems[n].kind, sizeof b->problems[n].kind, "%s", kind ? kind : "(null)");
        snprintf(b->problems[n].name, sizeof b->problems[n].name, "%s", name ? name : "(null)");
        snprintf(b->problems[n].detail, sizeof b->problems[n].detail, "%s", detail ? detail : "(null)");
    }
}

/* The other model, saved sharded by fsdp_save_sharded. */
static int variant_save_rank(fsdp_comm *comm, void *arg) {
    problem_board *b = (problem_board *)arg;
    fsdp_init_rule rule = {FSDP_INIT_CALLBACK, 0.0f, 0.0f, variant_init, NULL};
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    int layers, l0, l2, head, rc, status = 0;
    if ((rc = fsdp_model_create(&model, "MLP")) != 0) return rank_fail(&b->error, comm, "fsdp_model_create", rc, "");
    layers = fsdp_model_module(model, 0, "layers", "ModuleList");
    l0 = fsdp_model_module(model, layers, "0", "Linear");
    l2 = fsdp_model_module(model, layers, "2", "Linear");
    head = fsdp_model_module(model, 0, "head", "Linear");
    if (fsdp_model_param(model, 0, "scale", 1, variant_shape[0], rule) < 0 ||
        fsdp_model_param(model, l0, "weight", 2, variant_shape[1], rule) < 0 ||
        fsdp_model_param(model, l0, "bias", 1, variant_shape[2], rule) < 0 ||
        fsdp_model_param(model, l2, "weight", 2, variant_shape[3], rule) < 0 ||
        fsdp_model_param(model, head, "bias", 1, variant_shape[4], rule) < 0) {
        fsdp_model_destroy(model);
        return rank_fail(&b->error, comm, "building the other model", FSDP_ERR_INVALID_ARG, "");
    }
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = linear_types;
    if ((rc = fsdp_init(&ctx, model, &d)) != 0) status = rank_fail(&b->error, comm, "fsdp_init", rc, fsdp_last_error(NULL));
    else if ((rc = fsdp_save_sharded(ctx, b->path, NULL)) != 0) status = rank_fail(&b->error, comm, "fsdp_save_sharded", rc, fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return status;
}

static int problem_load_rank(fsdp_comm *comm, void *arg) {
    problem_board *b = (problem_board *)arg;
    int rank = fsdp_comm_rank(comm), rc, status = 0;
    problem_sink sink;
    fsdp_load_options lo;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    float values[MODEL_NUMEL];
    mlp m;
    if ((rc = mlp_build(&m)) != 0) return rank_fail(&b->error, comm, "mlp_build", rc, "");
    d = mlp_desc(comm, FSDP_FULL_SHARD, WRAP_LINEAR, OPT_ADAMW, LOAD_SEED);
    sink.board = b;
    sink.rank = rank;
    memset(&lo, 0, sizeof lo);
    lo.strict = b->strict;
    lo.on_problem = record_problem;
    lo.user = &sink;
    if ((rc = fsdp_init(&ctx, m.model, &d)) != 0) status = rank_fail(&b->error, comm, "fsdp_init", rc, fsdp_last_error(NULL));
    else if ((rc = gather_all(ctx, &m, values)) != 0) status = rank_fail(&b->error, comm, "gather", rc, fsdp_last_error(ctx));
    else {
        if (rank == 0) memcpy(b->before, values, sizeof values);
        b->rc[rank] = b->format == FORMAT_FULL ? fsdp_load_full(ctx, b->path, &lo, &b->report[rank])
                                               : fsdp_load_sharded(ctx, b->path, &lo, &b->report[rank]);
        if (rank == 0) snprintf(b->load_error, sizeof b->load_error, "%s", fsdp_last_error(ctx));
        if ((rc = gather_all(ctx, &m, values)) != 0) status = rank_fail(&b->error, comm, "gather after the load", rc, fsdp_last_error(ctx));
        else if (rank == 0) memcpy(b->after, values, sizeof values);
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    return status;
}

static problem_board *run_problem_load(int format, int strict) {
    problem_board *b = (problem_board *)map_board(sizeof(problem_board));
    fsdp_launch_status status;
    int rc;
    b->format = format;
    b->strict = strict;
    checkpoint_path(b->path, sizeof b->path, tmpdir, format, "other-model");
    if (format == FORMAT_FULL) write_variant_file(b->path);
    else {
        rc = launch(2, variant_save_rank, b, &status);
        assert_launch_ok(rc, &status, &b->error, "saving the other model");
    }
    rc = launch(2, problem_load_rank, b, &status);
    assert_launch_ok(rc, &status, &b->error, "loading the other model's checkpoint");
    return b;
}

/* on_problem was called once for each expected problem (and nothing else) on every rank, and
   the report counts them. */
static void assert_every_problem_reported(const problem_board *b) {
    int i, k, rank;
    for (rank = 0; rank < 2; rank++) {
        snprintf(message, sizeof message, "rank %d: on_problem calls", rank);
        TEST_ASSERT_EQUAL_INT_MESSAGE(NUM_PROBLEMS, b->calls[rank], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, b->report[rank].missing, "report.missing");
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, b->report[rank].unexpected, "report.unexpected");
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, b->report[rank].mismatched, "report.mismatched");
    }
    for (i = 0; i < NUM_PROBLEMS; i++) {
        int found = 0;
        for (k = 0; k < NUM_PROBLEMS; k++)
            found += strcmp(b->problems[k].kind, expected_problems[i][0]) == 0 && strcmp(b->problems[k].name, expected_problems[i][1]) == 0;
        snprintf(message, sizeof message, "on_problem(\"%s\", \"%s\") called %d times; calls: %s %s, %s %s, %s %s, %s %s, %s %s",
                 expected_problems[i][0], expected_problems[i][1], found, b->problems[0].kind, b->problems[0].name,
                 b->problems[1].kind, b->problems[1].name, b->problems[2].kind, b->problems[2].name, b->problems[3].kind,
                 b->problems[3].name, b->problems[4].kind, b->problems[4].name);
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, found, message);
    }
    for (k = 0; k < NUM_PROBLEMS; k++)
        if (strcmp(b->problems[k].kind, "shape") == 0) { /* the detail gives both shapes */
            snprintf(message, sizeof message, "shape detail: \"%s\"", b->problems[k].detail);
            TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->problems[k].detail, "[7,4]"), message);
            TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->problems[k].detail, "[7,5]"), message);
        }
}

static void assert_strict_load_fails_reporting_every_problem(int format) {
    problem_board *b = run_problem_load(format, 1);
    int rank, i;
    for (rank = 0; rank < 2; rank++) {
        snprintf(message, sizeof message, "rank %d: strict load returned %s: %s", rank, fsdp_result_name(b->rc[rank]), b->load_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INCOMPATIBLE, b->rc[rank], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, b->report[rank].loaded, "report.loaded of a strict load that failed");
    }
    assert_every_problem_reported(b);
    for (i = 0; i < NUM_PROBLEMS; i++) { /* the error message names them all too */
        snprintf(message, sizeof message, "the error should name '%s': \"%s\"", expected_problems[i][1], b->load_error);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->load_error, expected_problems[i][1]), message);
    }
    snprintf(message, sizeof message, "a failed strict load changed the parameters: %s", first_difference(b->before, b->after, MODEL_NUMEL));
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(b->before, b->after, sizeof b->before, message);
}

static void assert_non_strict_load_loads_what_matches_and_lists_the_rest(int format) {
    problem_board *b = run_problem_load(format, 0);
    float want[MODEL_NUMEL];
    int rank, p;
    int64_t i;
    for (rank = 0; rank < 2; rank++) {
        snprintf(message, sizeof message, "rank %d: non-strict load returned %s: %s", rank, fsdp_result_name(b->rc[rank]), b->load_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->rc[rank], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, b->report[rank].loaded, "report.loaded: scale and layers.0.bias");
    }
    assert_every_problem_reported(b);
    memcpy(want, b->before, sizeof want);
    for (p = 0; p < NUM_PARAMS; p++)
        if (p == P_SCALE || p == P_B0)
            for (i = 0; i < param_numel[p]; i++) want[param_offset[p] + i] = variant_value(param_names[p], i);
    snprintf(message, sizeof message, "%s", first_difference(want, b->after, MODEL_NUMEL));
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, b->after, sizeof want, message);
}

static void test_strict_full_load_of_another_model_fails_reporting_every_problem_and_loads_nothing(void) {
    assert_strict_load_fails_reporting_every_problem(FORMAT_FULL);
}

static void test_strict_sharded_load_of_another_model_fails_reporting_every_problem_and_loads_nothing(void) {
    assert_strict_load_fails_reporting_every_problem(FORMAT_SHARDED);
}

static void test_non_strict_full_load_of_another_model_loads_what_matches_and_reports_the_rest(void) {
    assert_non_strict_load_loads_what_matches_and_lists_the_rest(FORMAT_FULL);
}

static void test_non_strict_sharded_load_of_another_model_loads_what_matches_and_reports_the_rest(void) {
    assert_non_strict_load_loads_what_matches_and_lists_the_rest(FORMAT_SHARDED);
}

/* ---------------------------------------------------------------------------------------------
   the writer's bytes, and the checksum
   --------------------------------------------------------------------------------------------- */
/* CRC-32C written out from its definition (reflected polynomial 0x82F63B78, initial value and
   final xor 0xFFFFFFFF), one bit at a time: independent of fsdp_crc32c's tables. */
static uint32_t reference_crc32c(const void *data, size_t size) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t crc = 0xFFFFFFFFu;
    int bit;
    while (size--) {
        crc ^= *p++;
        for (bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static void test_crc32c_matches_the_known_test_vectors(void) {
    unsigned char zeros[32], ones[32], up[32], down[32], big[100000];
    size_t i;
    memset(zeros, 0, sizeof zeros);
    memset(ones, 0xff, sizeof ones);
    for (i = 0; i < 32; i++) {
        up[i] = (unsigned char)i;
        down[i] = (unsigned char)(31 - i);
    }
    TEST_ASSERT_EQUAL_HEX32(0xE3069283u, fsdp_crc32c(0, "123456789", 9));
    TEST_ASSERT_EQUAL_HEX32(0x00000000u, fsdp_crc32c(0, "", 0));
    TEST_ASSERT_EQUAL_HEX32(0x8A9136AAu, fsdp_crc32c(0, zeros, 32)); /* RFC 3720, B.4 */
    TEST_ASSERT_EQUAL_HEX32(0x62A8AB43u, fsdp_crc32c(0, ones, 32));
    TEST_ASSERT_EQUAL_HEX32(0x46DD794Eu, fsdp_crc32c(0, up, 32));
    TEST_ASSERT_EQUAL_HEX32(0x113FDB5Cu, fsdp_crc32c(0, down, 32));
    TEST_ASSERT_EQUAL_HEX32(0xE3069283u, fsdp_crc32c(fsdp_crc32c(0, "1234", 4), "56789", 5)); /* incremental */
    for (i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
    TEST_ASSERT_EQUAL_HEX32(reference_crc32c(big, sizeof big), fsdp_crc32c(0, big, sizeof big));
    TEST_ASSERT_EQUAL_HEX32(reference_crc32c(big + 3, 1001), fsdp_crc32c(0, big + 3, 1001)); /* unaligned */
    TEST_ASSERT_EQUAL_HEX32(0xE3069283u, reference_crc32c("123456789", 9));
}

/* "a" F32 [2] = {1, 2} and "b" BF16 [1] = {1.5}, with user metadata note = "hi": the file is
   the 8-byte length, exactly this JSON padded with spaces to a multiple of 8, then the data. */
static void test_writer_output_is_byte_for_byte_the_safetensors_layout(void) {
    static const unsigned char data[10] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0xc0, 0x3f};
    const float a[2] = {1.0f, 2.0f};
    fsdp_st_spec specs[2];
    fsdp_kv meta[1] = {{"note", "hi"}};
    fsdp_st_writer *w = NULL;
    char err[512] = "", path[256], json[512];
    unsigned char expected[1024];
    size_t len, total;
    memset(specs, 0, sizeof specs);
    specs[0].name = "a";
    specs[0].dtype = FSDP_F32;
    specs[0].ndim = 1;
    specs[0].shape[0] = 2;
    specs[1].name = "b";
    specs[1].dtype = FSDP_BF16;
    specs[1].ndim = 1;
    specs[1].shape[0] = 1;
    snprintf(path, sizeof path, "%s/ab.safetensors", tmpdir);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, 2, meta, 1, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(0, count_entries(tmpdir, "ab.safetensors") - count_entries(tmpdir, ".tmp.")); /* not yet visible */
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, a, 2));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write(w, data + 8, 2)); /* raw bf16 bytes */
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(0, count_entries(tmpdir, ".tmp."));

    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"hi\",\"crc32c.a\":\"%08x\",\"crc32c.b\":\"%08x\"},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[8,10]}}",
             (unsigned)reference_crc32c(data, 8), (unsigned)reference_crc32c(data + 8, 2));
    len = strlen(json);
    while (len % 8) json[len++] = ' ';
    json[len] = 0;
    put_header_length(expected, len);
    memcpy(expected + 8, json, len);
    memcpy(expected + 8 + len, data, sizeof data);
    total = 8 + len + sizeof data;

    read_file(path);
    snprintf(message, sizeof message, "expected header %s, file has %.*s", json,
             (int)(file_size > 8 ? (header_length(file_bytes) < 900 ? header_length(file_bytes) : 900) : 0), file_bytes + 8);
    TEST_ASSERT_EQUAL_size_t_MESSAGE(total, file_size, message);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(expected, file_bytes, total, message);
}

/* A tensor name longer than any fixed buffer keeps its own checksum. */
static void test_writer_long_tensor_names_keep_their_checksums(void) {
    char names[2][400], path[256], err[1024] = "";
    fsdp_st_spec specs[2];
    fsdp_st_writer *w = NULL;
    fsdp_st_file *f = NULL;
    float v[4] = {1, 2, 3, 4};
    int i;
    memset(names, 'n', sizeof names);
    names[0][350] = names[1][350] = 0;
    names[1][349] = 'x'; /* differs from the first in its last character only */
    memset(specs, 0, sizeof specs);
    for (i = 0; i < 2; i++) {
        specs[i].name = names[i];
        specs[i].dtype = FSDP_F32;
        specs[i].ndim = 1;
        specs[i].shape[0] = 2;
    }
    snprintf(path, sizeof path, "%s/long-names.safetensors", tmpdir);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, 2, NULL, 0, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, v, 4));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_open(&f, path, err, sizeof err), err);
    for (i = 0; i < 2; i++) {
        int rc = fsdp_st_verify(f, i, err, sizeof err);
        snprintf(message, sizeof message, "tensor %d (350-character name): %s: %.200s", i, fsdp_result_name(rc), err);
        if (rc != FSDP_SUCCESS) fsdp_st_close(f);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    }
    fsdp_st_close(f);
}

/* Opening and verifying a file costs time linear in its tensors: a model with 15,000 parameter
   tensors saved with AdamW state has 45,000. Run in a child with an alarm so a quadratic
   implementation fails in MANY_TENSORS_SECONDS instead of hanging the suite. */
#define MANY_TENSORS 50000
#define MANY_TENSORS_SECONDS 3

static void test_open_and_verify_of_a_file_with_many_tensors_is_not_quadratic(void) {
    static fsdp_st_spec specs[MANY_TENSORS];
    static char names[MANY_TENSORS][32];
    fsdp_st_writer *w = NULL;
    char err[512] = "", path[256];
    float one = 1.0f;
    pid_t pid;
    int i, status;
    double started;
    for (i = 0; i < MANY_TENSORS; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.weight", i);
        memset(&specs[i], 0, sizeof specs[i]);
        specs[i].name = names[i];
        specs[i].dtype = FSDP_F32;
        specs[i].ndim = 1;
        specs[i].shape[0] = 1;
    }
    snprintf(path, sizeof path, "%s/many.safetensors", tmpdir);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, MANY_TENSORS, NULL, 0, err, sizeof err), err);
    for (i = 0; i < MANY_TENSORS; i++) TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, &one, 1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
    started = fsdp_now();
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        fsdp_st_file *f = NULL;
        alarm(MANY_TENSORS_SECONDS);
        if (fsdp_st_open(&f, path, err, sizeof err) != FSDP_SUCCESS || fsdp_st_num_tensors(f) != MANY_TENSORS) _exit(1);
        for (i = 0; i < MANY_TENSORS; i++)
            if (fsdp_st_verify(f, i, err, sizeof err) != FSDP_SUCCESS) _exit(2);
        fsdp_st_close(f);
        _exit(0);
    }
    TEST_ASSERT_TRUE(pid > 0);
    TEST_ASSERT_EQUAL_INT(pid, waitpid(pid, &status, 0));
    snprintf(message, sizeof message, "fsdp_st_open + fsdp_st_verify of every tensor of a %d-tensor file: %s after %.1f s",
             MANY_TENSORS, WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "not done" : "crashed") : "failed",
             fsdp_now() - started);
    TEST_ASSERT_TRUE_MESSAGE(WIFEXITED(status) && WEXITSTATUS(status) == 0, message);
}

/* ---------------------------------------------------------------------------------------------
   Python's json and struct modules read what fsdp.h writes
   --------------------------------------------------------------------------------------------- */
static const char python_checker[] =
    "import json, struct, sys, os\n"
    "def crc32c(data):\n"
    "    crc = 0xffffffff\n"
    "    for byte in data:\n"
    "        crc ^= byte\n"
    "        for _ in range(8):\n"
    "            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)\n"
    "    return crc ^ 0xffffffff\n"
    "SIZES = {'F32': 4, 'BF16': 2, 'F16': 2}\n"
    "def values(dtype, raw):\n"
    "    if dtype == 'F32': return list(struct.unpack('<%df' % (len(raw) // 4), raw))\n"
    "    if dtype == 'F16': return list(struct.unpack('<%de' % (len(raw) // 2), raw))\n"
    "    halves = struct.unpack('<%dH' % (len(raw) // 2), raw)\n"
    "    return [struct.unpack('<f', struct.pack('<I', h << 16))[0] for h in halves]\n"
    "def check_file(path, show):\n"
    "    raw = open(path, 'rb').read()\n"
    "    (n,) = struct.unpack('<Q', raw[:8])\n"
    "    assert n % 8 == 0, 'header length %d is not a multiple of 8' % n\n"
    "    header = json.loads(raw[8:8 + n].decode('utf-8'))\n"
    "    data = raw[8 + n:]\n"
    "    meta = header.pop('__metadata__', {})\n"
    "    assert meta.get('format') == 'pt', meta\n"
    "    assert all(isinstance(v, str) for v in meta.values())\n"
    "    spans = sorted((t['data_offsets'][0], t['data_offsets'][1], name) for name, t in header.items())\n"
    "    at = 0\n"
    "    for begin, end, name in spans:\n"
    "        assert begin == at, '%s starts at %d, expected %d' % (name, begin, at)\n"
    "        at = end\n"
    "    assert at == len(data), 'data ends at %d, file has %d' % (at, len(data))\n"
    "    for name in sorted(header):\n"
    "        t = header[name]\n"
    "        begin, end = t['data_offsets']\n"
    "        numel = 1\n"
    "        for d in t['shape']: numel *= d\n"
    "        assert numel * SIZES[t['dtype']] == end - begin, name\n"
    "        assert int(meta['crc32c.' + name], 16) == crc32c(data[begin:end]), 'checksum of ' + name\n"
    "        if show: print(name, t['dtype'], json.dumps(t['shape']), ' '.join(repr(v) for v in values(t['dtype'], data[begin:end])))\n"
    "    return header, meta\n"
    "for path in sys.argv[1:]:\n"
    "    if os.path.isdir(path):\n"
    "        index = json.load(open(os.path.join(path, 'index.json')))\n"
    "        assert index['format'] == 'fsdp.h-sharded', index.get('format')\n"
    "        shards = {}\n"
    "        for name, t in index['tensors'].items():\n"
    "            numel = 1\n"
    "            for d in t['shape']: numel *= d\n"
    "            at = 0\n"
    "            for f, begin, end in sorted(t['pieces'], key=lambda p: p[1]):\n"
    "                assert begin == at and end > begin, (name, t['pieces'])\n"
    "                at = end\n"
    "                if f not in shards: shards[f] = check_file(os.path.join(path, index['files'][f]), False)[0]\n"
    "                assert shards[f][name]['shape'] == [end - begin], (name, f)\n"
    "            assert at == numel, (name, at, numel)\n"
    "        print('index', len(index['tensors']), 'tensors in', len(shards), 'files')\n"
    "    else:\n"
    "        header, meta = check_file(path, os.path.basename(path) == 'mixed.safetensors')\n"
    "        print('file', len(header), 'tensors', 'step', meta.get('step', '-'))\n";

static int python_available(void) {
    return system("python3 -c 'import json, struct' >/dev/null 2>&1") == 0;
}

/* Runs the checker on the paths; returns its exit status, its output in `out`. */
static int run_python_checker(const char *paths, char *out, size_t out_size) {
    char script[256], command[1024];
    FILE *p;
    size_t n = 0;
    int status;
    snprintf(script, sizeof script, "%s/check.py", tmpdir);
    write_file(script, python_checker, strlen(python_checker));
    snprintf(command, sizeof command, "python3 %s %s 2>&1", script, paths);
    p = popen(command, "r");
    TEST_ASSERT_NOT_NULL_MESSAGE(p, "popen python3");
    while (n + 1 < out_size && fgets(out + n, (int)(out_size - n), p)) n += strlen(out + n);
    status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_python_json_and_struct_read_the_writer_output(void) {
    const float a[3] = {1.0f, 2.0f, -0.5f}, b[2] = {1.5f, -2.0f}, h[2] = {0.25f, 3.0f}, s = 3.5f, m[6] = {0, 1, 2, 3, 4, 5};
    fsdp_st_spec specs[5];
    fsdp_st_writer *w = NULL;
    char err[512] = "", path[256], out[4096];
    int rc;
    if (!python_available()) TEST_IGNORE_MESSAGE("python3 is not installed");
    memset(specs, 0, sizeof specs);
    specs[0].name = "a";
    specs[0].dtype = FSDP_F32;
    specs[0].ndim = 1;
    specs[0].shape[0] = 3;
    specs[1].name = "b";
    specs[1].dtype = FSDP_BF16;
    specs[1].ndim = 1;
    specs[1].shape[0] = 2;
    specs[2].name = "h";
    specs[2].dtype = FSDP_F16;
    specs[2].ndim = 1;
    specs[2].shape[0] = 2;
    specs[3].name = "s"; /* a scalar: shape [] */
    specs[3].dtype = FSDP_F32;
    specs[3].ndim = 0;
    specs[4].name = "m.weight";
    specs[4].dtype = FSDP_F32;
    specs[4].ndim = 2;
    specs[4].shape[0] = 2;
    specs[4].shape[1] = 3;
    snprintf(path, sizeof path, "%s/mixed.safetensors", tmpdir);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, 5, NULL, 0, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, a, 3));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, b, 2));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, h, 2));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, &s, 1));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, m, 6));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
    rc = run_python_checker(path, out, sizeof out);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, out);
    TEST_ASSERT_EQUAL_STRING("a F32 [3] 1.0 2.0 -0.5\n"
                             "b BF16 [2] 1.5 -2.0\n"
                             "h F16 [2] 0.25 3.0\n"
                             "m.weight F32 [2, 3] 0.0 1.0 2.0 3.0 4.0 5.0\n"
                             "s F32 [] 3.5\n"
                             "file 5 tensors step -\n",
                             out);
}

static void test_python_json_and_struct_read_full_and_sharded_checkpoints(void) {
    char full[256], dir[256], paths[600], out[4096];
    int rc;
    if (!python_available()) TEST_IGNORE_MESSAGE("python3 is not installed");
    start_one_rank(FSDP_FULL_SHARD, 3);
    train_one_rank(2);
    checkpoint_path(full, sizeof full, tmpdir, FORMAT_FULL, "py");
    checkpoint_path(dir, sizeof dir, tmpdir, FORMAT_SHARDED, "py");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_FULL, full, 1), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, save(ctx1, FORMAT_SHARDED, dir, 1), fsdp_last_error(ctx1));
    snprintf(paths, sizeof paths, "%s %s", full, dir);
    rc = run_python_checker(paths, out, sizeof out);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, out);
    /* 5 parameters, each with exp_avg and exp_avg_sq */
    TEST_ASSERT_EQUAL_STRING("file 15 tensors step 2\nindex 15 tensors in 1 files\n", out);
}

/* ---------------------------------------------------------------------------------------------
   the fuzz target's corpus and every crasher it found: parsed, read and verified without a
   crash, in a child process per file so that a crash names the file
   --------------------------------------------------------------------------------------------- */
/* What the fuzz target does with one input: 0, or 2 for an error without a message. */
static int exercise_parser(const unsigned char *bytes, size_t size) {
    fsdp_st_file *f = NULL;
    char err[512];
    float buf[64];
    int i, rc = fsdp_st_parse(&f, bytes, size, err, sizeof err);
    if (rc != FSDP_SUCCESS) return rc == FSDP_ERR_CORRUPT && err[0] ? 0 : 2; /* a clean error says what */
    for (i = 0; i < fsdp_st_num_tensors(f); i++) {
        const fsdp_st_tensor *t = fsdp_st_tensor_at(f, i);
        int64_t at;
        for (at = 0; at < t->numel; at += 64) fsdp_st_read(f, i, at, t->numel - at < 64 ? t->numel - at : 64, buf, err, sizeof err);
        fsdp_st_verify(f, i, err, sizeof err);
    }
    fsdp_st_close(f);
    return 0;
}

static void test_fuzz_corpus_and_crashers_parse_without_crashing(void) {
    assert_corpus_replays("CORPUS_DIR", CORPUS_DIR, "safetensors", exercise_parser, "2: an error without a message");
}
static void free_snapshots(void) { snapshot_free(&before_kill); }

int main(void) {
    UNITY_BEGIN();
    /* the file format */
    RUN_TEST(test_crc32c_matches_the_known_test_vectors);
    RUN_TEST(test_writer_output_is_byte_for_byte_the_safetensors_layout);
    RUN_TEST(test_writer_long_tensor_names_keep_their_checksums);
    RUN_TEST(test_open_and_verify_of_a_file_with_many_tensors_is_not_quadratic);
    RUN_TEST(test_python_json_and_struct_read_the_writer_output);
    RUN_TEST(test_python_json_and_struct_read_full_and_sharded_checkpoints);
    /* hostile and damaged files */
    RUN_TEST(test_parse_hand_built_valid_file_succeeds);
    RUN_TEST(test_parse_file_truncated_inside_the_8_byte_length_is_corrupt);
    RUN_TEST(test_parse_file_truncated_inside_the_header_is_corrupt);
    RUN_TEST(test_parse_file_truncated_inside_the_data_is_corrupt);
    RUN_TEST(test_parse_huge_header_length_is_corrupt);
    RUN_TEST(test_parse_header_length_larger_than_the_file_is_corrupt);
    RUN_TEST(test_parse_header_length_too_small_for_an_object_is_corrupt);
    RUN_TEST(test_parse_offsets_past_the_end_of_the_data_are_corrupt);
    RUN_TEST(test_parse_offsets_not_begin_then_end_are_corrupt);
    RUN_TEST(test_parse_overlapping_offsets_are_corrupt);
    RUN_TEST(test_parse_bad_json_unterminated_string_is_corrupt);
    RUN_TEST(test_parse_bad_json_trailing_comma_is_corrupt);
    RUN_TEST(test_parse_bad_json_missing_colon_is_corrupt);
    RUN_TEST(test_parse_bad_json_unknown_escape_is_corrupt);
    RUN_TEST(test_parse_bad_json_lone_surrogate_is_corrupt);
    RUN_TEST(test_parse_bad_json_nested_too_deeply_is_corrupt);
    RUN_TEST(test_parse_bad_json_other_syntax_errors_are_corrupt);
    RUN_TEST(test_parse_header_that_is_not_a_tensor_table_is_corrupt);
    RUN_TEST(test_parse_unknown_dtype_is_corrupt);
    RUN_TEST(test_parse_shape_that_does_not_match_its_byte_count_is_corrupt);
    RUN_TEST(test_parse_duplicate_tensor_names_are_corrupt);
    RUN_TEST(test_parse_metadata_that_is_not_a_map_of_strings_is_corrupt);
    RUN_TEST(test_verify_flipped_data_byte_is_corrupt_naming_the_tensor);
    RUN_TEST(test_verify_malformed_stored_checksum_is_corrupt);
    RUN_TEST(test_load_full_with_a_flipped_data_byte_is_corrupt_naming_the_tensor_and_loads_nothing);
    RUN_TEST(test_load_sharded_with_a_flipped_data_byte_is_corrupt_naming_the_tensor);
    RUN_TEST(test_load_of_a_missing_checkpoint_is_an_io_error_naming_the_path);
    RUN_TEST(test_fuzz_corpus_and_crashers_parse_without_crashing);
    /* strict and non-strict */
    RUN_TEST(test_strict_full_load_of_another_model_fails_reporting_every_problem_and_loads_nothing);
    RUN_TEST(test_strict_sharded_load_of_another_model_fails_reporting_every_problem_and_loads_nothing);
    RUN_TEST(test_non_strict_full_load_of_another_model_loads_what_matches_and_reports_the_rest);
    RUN_TEST(test_non_strict_sharded_load_of_another_model_loads_what_matches_and_reports_the_rest);
    /* round trips and resume */
    RUN_TEST(test_full_checkpoint_reloads_bitwise_at_every_world_size_strategy_and_wrap_policy);
    RUN_TEST(test_sharded_checkpoint_reloads_bitwise_at_every_world_size_strategy_and_wrap_policy);
    RUN_TEST(test_checkpoint_saved_as_bf16_reloads_parameters_rounded_to_bf16);
    RUN_TEST(test_sharded_save_over_an_older_one_leaves_only_the_new_files);
    RUN_TEST(test_sharded_checkpoint_whose_index_names_a_file_never_written_loads);
    RUN_TEST(test_resume_at_the_same_world_size_and_strategy_is_bitwise_exact);
    RUN_TEST(test_resume_at_another_world_size_strategy_and_wrap_policy_matches_within_float_rounding);
    RUN_TEST(test_resume_without_the_optimizer_state_differs_from_training_without_a_break);
    /* a rank killed in the middle of a save */
    RUN_TEST(test_kill_while_writing_a_full_checkpoint_leaves_the_previous_file);
    RUN_TEST(test_kill_while_writing_a_shard_file_leaves_the_previous_sharded_checkpoint);
    RUN_TEST(test_kill_after_the_shard_files_before_index_commit_leaves_the_previous_sharded_checkpoint);
    return UNITY_END();
}
