/* test_async_save.c - specification of asynchronous sharded saves (fsdp_save_sharded_async,
   fsdp_save_wait): the call snapshots this rank's shards and returns, a thread writes the shard
   file, and the checkpoint is committed (index.json by rank 0, then the files of earlier saves
   removed) at the first fsdp_step, fsdp_save_wait, save or fsdp_destroy after every rank's file
   is complete. The files are byte for byte fsdp_save_sharded's but for the per-save name
   (shard-XXXXXXXX-RRRRR.safetensors); they hold the values of the call, whatever the training
   did since; at most one save is in flight; a save that fails in the background, or a job
   killed before the commit, leaves the directory's previous checkpoint.

   The model (units of 8, 216 and 100 elements, 324 as one unit):
       x0 = x * scale                      scale (8)          owned by the root unit
       h  = relu(layers.0(x0))             Linear 8 -> 24     weight 24x8, bias 24
       y  = layers.1(h)                    Linear 24 -> 4     weight 4x24, bias 4
       loss = mean over rows of 0.5 * |y - target|^2, B = 12 rows split evenly over P ranks
   trained with AdamW (saved with its state) and wrapped with FSDP_WRAP_TYPES {"Linear"}.

   Multi-rank tests fork ranks with fsdp_launch_ex over shared memory. The ranks write what they
   saw into a MAP_SHARED board the parent mapped before the launch; only the parent asserts.
   Every test works in its own directory under /tmp (mkdtemp in setUp, removed in tearDown).

   To show that the file holds the values of the call and not of a later moment, a rank holds
   its writer thread back while it trains (the writer gate below): fsdp.h's allocator
   (FSDP_MALLOC, a documented configuration macro) is this file's, and while the gate is armed an
   allocation by a thread that did not exist when it was armed (the writer) waits until the rank
   releases the gate. The writer allocates before it writes anything, so it writes after the
   release; a test whose writer never allocated says so and fails rather than pass without
   showing anything.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_async_save.c tests/unity/unity.c -o /tmp/tas -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>

static void *gated_malloc(size_t size);
static void *gated_realloc(void *ptr, size_t size);
#define FSDP_MALLOC(size) gated_malloc(size)
#define FSDP_REALLOC(ptr, size) gated_realloc(ptr, size)
#define FSDP_FREE(ptr) free(ptr)
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <ctype.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#define MAX_WORLD 4
#define LAUNCH_TIMEOUT_MS 10000  /* bound on any wait for another rank; only reached on a hang */
#define KILL_TIMEOUT_MS 3000     /* the same for the job one of whose ranks is killed */
#define RANK_ALARM_S 30          /* a rank that outlives this dies of SIGALRM: a hang fails the test */
#define GATE_LIMIT_MS 10000      /* the writer gate lets go by itself after this */
#define HOLD_STEPS 3             /* steps trained while a writer is held */
#define COMMIT_STEP_LIMIT 500    /* steps (2 ms apart) within which a written save must be committed */
#define FSIZE_LIMIT 512          /* bytes: RLIMIT_FSIZE of the rank whose save must fail */
#define INDEX_BYTES 8192         /* room for an index.json read by a rank */
#define TRAIN_SEED 42u
#define OTHER_SEED 43u           /* the killed job's values, never to be seen in the directory */
#define LOAD_SEED 77u            /* a loading context's own initialisation, overwritten by the load */

static char tmpdir[128];        /* this test's directory */
static char message[4096];      /* assertion messages */
static unsigned char *file_bytes[2];

void setUp(void) {
    make_test_dir(tmpdir, sizeof tmpdir, "fsdp-test-async-save");
}

void tearDown(void) {
    free(file_bytes[0]);
    free(file_bytes[1]);
    file_bytes[0] = file_bytes[1] = NULL;
    unmap_board();
    if (tmpdir[0]) remove_tree(tmpdir);
    tmpdir[0] = 0;
}

/* ---------------------------------------------------------------------------------------------
   the writer gate (see the top comment); armed and released by a rank's compute thread, once per
   process
   --------------------------------------------------------------------------------------------- */
static pid_t gate_known[256];   /* the threads of this process when the gate was armed */
static int gate_num_known;
static int gate_watching;       /* atomic: gate_known is set */
static int gate_armed;          /* atomic: new threads wait */
static double gate_until;       /* ms: when an armed gate lets go by itself */
static int gate_passed;         /* atomic: a new thread allocated since the gate was armed */

static pid_t thread_id(void) { return (pid_t)syscall(SYS_gettid); }

static int gate_knows(pid_t tid) {
    int i;
    for (i = 0; i < gate_num_known; i++)
        if (gate_known[i] == tid) return 1;
    return 0;
}

/* A new thread waits while the gate is armed (GATE_LIMIT_MS at most from the arming); one that
   comes after the release goes on at once: either way it allocates after the release. */
static void gate_wait(void) {
    if (!__atomic_load_n(&gate_watching, __ATOMIC_ACQUIRE) || gate_knows(thread_id())) return;
    __atomic_store_n(&gate_passed, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&gate_armed, __ATOMIC_ACQUIRE) && now_ms() < gate_until) sleep_ms(1);
}

static void *gated_malloc(size_t size) {
    gate_wait();
    return malloc(size);
}

static void *gated_realloc(void *ptr, size_t size) {
    gate_wait();
    return realloc(ptr, size);
}

/* Arms the gate for every thread but those running now (/proc/self/task). 0, or -1. */
static int gate_arm(void) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    if (!d) return -1;
    gate_num_known = 0;
    while ((e = readdir(d)) != NULL && gate_num_known < 256)
        if (e->d_name[0] != '.') gate_known[gate_num_known++] = (pid_t)atoi(e->d_name);
    closedir(d);
    gate_until = now_ms() + GATE_LIMIT_MS;
    __atomic_store_n(&gate_armed, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&gate_watching, 1, __ATOMIC_RELEASE);
    return 0;
}

static void gate_release(void) { __atomic_store_n(&gate_armed, 0, __ATOMIC_RELEASE); }

/* 1 if a thread born after gate_arm has allocated (once the save is waited for: its writer). */
static int gate_was_passed(void) { return __atomic_load_n(&gate_passed, __ATOMIC_ACQUIRE); }

/* ---------------------------------------------------------------------------------------------
   the model and its training step
   --------------------------------------------------------------------------------------------- */
#define D 8  /* inputs */
#define H 24 /* hidden */
#define C 4  /* outputs */
#define B 12 /* rows; divisible by every world size 1..4 */
#define NUM_PARAMS 5
#define MODEL_NUMEL (D + H * D + H + C * H + C) /* 324 */

enum { P_SCALE, P_W0, P_B0, P_W1, P_B1 };
static const int64_t param_offset[NUM_PARAMS] = {0, D, D + H * D, D + H * D + H, D + H * D + H + C * H};
static const char *const param_names[NUM_PARAMS] = {"scale", "layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                    "layers.1.bias"};
static const char *const linear_types[] = {"Linear", NULL};

typedef struct mlp {
    fsdp_model *model;
    int layer[2]; /* "layers.0", "layers.1" */
    int param[NUM_PARAMS];
} mlp;

static int mlp_build(mlp *m) {
    int layers;
    memset(m, 0, sizeof *m);
    return relu_mlp_build(&m->model, D, H, C, &layers, m->layer, m->param);
}

/* One training iteration of the model (relu_mlp_train_step) on this rank's rows, then fsdp_step.
   `step` selects the batch. */
static int train_step(fsdp_ctx *ctx, const mlp *m, fsdp_comm *comm, int step, const char **where) {
    const relu_mlp sizes = {D, H, C, B, m->layer, m->param};
    return relu_mlp_train_step(ctx, &sizes, comm, step, where);
}

/* ---------------------------------------------------------------------------------------------
   the board, and what a rank does (no assertions in a rank: it reports on the board)
   --------------------------------------------------------------------------------------------- */
typedef struct rank_error {
    int claimed;
    char text[512];
} rank_error;

typedef struct board {
    rank_error error;                  /* the first failure of any rank */
    char dir[2][256];                  /* the scenario's checkpoint directories */
    float before[MODEL_NUMEL];         /* rank 0: the values of the directory's previous checkpoint */
    float at_call[2][MODEL_NUMEL];     /* rank 0: the values when each save was called */
    float later[MODEL_NUMEL];          /* rank 0: the values the training had reached later */
    float loaded[2][MODEL_NUMEL];      /* rank 0: what a fresh context loaded strictly from dir[k] */
    int64_t loaded_epoch[2];           /* rank 0: the load report's epoch */
    int writer_gated[MAX_WORLD];       /* this rank's writer went through the writer gate */
    int wait_rc[MAX_WORLD];            /* fsdp_save_wait's result */
    int wait_again_rc[MAX_WORLD];      /* ... and a second call's right after (the result is said once) */
    int steps_ok[MAX_WORLD];           /* fsdp_step calls that succeeded after the save */
    int failure_logged_at[MAX_WORLD];  /* the step after which the failure was logged (0: never) */
    int errors_logged[MAX_WORLD];      /* error messages about the asynchronous save */
    /* rank 0's view of dir[0] around an asynchronous save over an earlier one */
    char index_before[INDEX_BYTES];    /* index.json of the earlier save */
    int index_kept_at_return;          /* index.json unchanged when the call returned */
    int own_file_written;              /* rank 0's new shard file was in place before the held steps */
    int index_kept_while_held[HOLD_STEPS];
    int old_files_kept_while_held[HOLD_STEPS];
    int steps_to_commit;               /* fsdp_step calls until index.json changed (-1: never) */
    /* the job one of whose ranks is killed */
    int survivor_step_rc;              /* the first failing fsdp_step's result on rank 0 */
    int survivor_destroyed;            /* rank 0 returned from fsdp_destroy */
} board;

/* Records "rank R: what: RESULT: detail" if nothing was recorded yet; returns the exit status. */
static int rank_fail(board *b, fsdp_comm *comm, const char *what, int rc, const char *detail) {
    if (__sync_bool_compare_and_swap(&b->error.claimed, 0, 1))
        snprintf(b->error.text, sizeof b->error.text, "rank %d: %.120s: %.40s: %.300s", comm ? fsdp_comm_rank(comm) : -1,
                 what, fsdp_result_name(rc), detail ? detail : "");
    return 1;
}

/* Counts the error messages about asynchronous saves of the rank whose counter user is. */
static void count_async_errors(void *user, fsdp_log_level level, const char *text) {
    if (level == FSDP_LOG_ERROR && strstr(text, "asynchronous save")) (*(int *)user)++;
}

/* One rank's model and context. */
typedef struct rank_run {
    fsdp_comm *comm;
    board *b;
    mlp m;
    fsdp_ctx *ctx;
    int rank, next_step;
} rank_run;

/* The model and a context of strategy (HYBRID_SHARD: shard groups of 1 at P = 2, of 2 at P = 4)
   with AdamW, its error messages about asynchronous saves counted on the board. 0, or the exit
   status after recording the failure; run_end releases what was made either way. */
static int run_start(rank_run *r, fsdp_comm *comm, board *b, fsdp_strategy strategy, uint64_t seed) {
    fsdp_desc d;
    int rc;
    memset(r, 0, sizeof *r);
    r->comm = comm;
    r->b = b;
    r->rank = fsdp_comm_rank(comm);
    alarm(RANK_ALARM_S);
    if ((rc = mlp_build(&r->m)) != 0) return rank_fail(b, comm, "mlp_build", rc, "");
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = strategy;
    d.seed = seed;
    if (strategy == FSDP_HYBRID_SHARD && fsdp_comm_size(comm) % 2 == 0)
        d.shard_group_size = fsdp_comm_size(comm) == 2 ? 1 : 2;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = linear_types;
    d.optimizer.kind = FSDP_ADAMW;
    d.optimizer.lr = 0.01f;
    d.logger.fn = count_async_errors;
    d.logger.user = &b->errors_logged[r->rank];
    if ((rc = fsdp_init(&r->ctx, r->m.model, &d)) != 0) return rank_fail(b, comm, "fsdp_init", rc, fsdp_last_error(NULL));
    return 0;
}

static void run_end(rank_run *r) {
    fsdp_destroy(r->ctx);
    r->ctx = NULL;
    fsdp_model_destroy(r->m.model);
    r->m.model = NULL;
}

/* Records the failure of what with the context's message; returns the exit status. */
static int run_fail(rank_run *r, const char *what, int rc) {
    return rank_fail(r->b, r->comm, what, rc, r->ctx ? fsdp_last_error(r->ctx) : fsdp_last_error(NULL));
}

static int train(rank_run *r, int steps) {
    const char *where = "";
    int s, rc;
    for (s = 0; s < steps; s++)
        if ((rc = train_step(r->ctx, &r->m, r->comm, r->next_step++, &where)) != 0) return run_fail(r, where, rc);
    return 0;
}

/* Every parameter's full value, gathered (collective), into out on rank 0. */
static int gather_values(rank_run *r, float *out) {
    float values[MODEL_NUMEL];
    int p, rc;
    for (p = 0; p < NUM_PARAMS; p++)
        if ((rc = fsdp_gather_param(r->ctx, r->m.param[p], values + param_offset[p])) != 0) return run_fail(r, "gather", rc);
    if (r->rank == 0) memcpy(out, values, sizeof values);
    return 0;
}

static const fsdp_kv user_metadata[1] = {{"run", "async-spec"}};

static fsdp_save_options save_options(fsdp_dtype dtype, int64_t epoch) {
    fsdp_save_options so;
    memset(&so, 0, sizeof so);
    so.with_optimizer = 1;
    so.dtype = dtype;
    so.epoch = epoch;
    so.metadata = user_metadata;
    so.num_metadata = 1;
    return so;
}

static int save_async(rank_run *r, const char *dir) {
    fsdp_save_options so = save_options(FSDP_F32, 0);
    int rc = fsdp_save_sharded_async(r->ctx, dir, &so);
    return rc ? run_fail(r, "fsdp_save_sharded_async", rc) : 0;
}

static int save_sync(rank_run *r, const char *dir) {
    fsdp_save_options so = save_options(FSDP_F32, 0);
    int rc = fsdp_save_sharded(r->ctx, dir, &so);
    return rc ? run_fail(r, "fsdp_save_sharded", rc) : 0;
}

static int save_wait(rank_run *r) {
    int rc = fsdp_save_wait(r->ctx);
    return rc ? run_fail(r, "fsdp_save_wait", rc) : 0;
}

/* A fresh context (other initial values) loads dir strictly with the optimizer state; rank 0
   reports the values and the epoch. Collective. */
static int load_fresh(fsdp_comm *comm, board *b, const char *dir, float *out, int64_t *epoch) {
    fsdp_load_options lo;
    fsdp_load_report report;
    rank_run r;
    int rc, status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, LOAD_SEED)) != 0) {
        run_end(&r);
        return status;
    }
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    lo.with_optimizer = 1;
    if ((rc = fsdp_load_sharded(r.ctx, dir, &lo, &report)) != 0) status = run_fail(&r, "fsdp_load_sharded", rc);
    else status = gather_values(&r, out);
    if (!status && epoch && r.rank == 0) *epoch = report.epoch;
    run_end(&r);
    return status;
}

/* The bytes of a small file, 0-terminated, into buf (of size); its length, or -1. Ranks only. */
static long read_small_file(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "rb");
    size_t n;
    buf[0] = 0;
    if (!f) return -1;
    n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = 0;
    return (long)n;
}

/* dir/index.json is still the one whose text is in before. */
static int index_is(const char *dir, const char *before) {
    char path[512], now[INDEX_BYTES];
    snprintf(path, sizeof path, "%s/index.json", dir);
    return read_small_file(path, now, sizeof now) >= 0 && strcmp(now, before) == 0;
}

/* rank's shard file of a save other than the one whose index.json is text is in dir under its
   final name. */
static int new_shard_file_exists(const char *dir, const char *text, int rank) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char suffix[32];
    int found = 0;
    snprintf(suffix, sizeof suffix, "-%05d.safetensors", rank);
    while (d && !found && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        found = strncmp(e->d_name, "shard-", 6) == 0 && n > strlen(suffix) &&
                strcmp(e->d_name + n - strlen(suffix), suffix) == 0 && !strstr(text, e->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* Every file index.json (text) names is in dir. */
static int named_files_exist(const char *dir, const char *text) {
    fsdp_index *ix = NULL;
    char err[256], path[512];
    int i, ok;
    if (fsdp_index_parse(&ix, text, strlen(text), err, sizeof err) != 0) return 0;
    ok = fsdp_index_num_files(ix) > 0;
    for (i = 0; ok && i < fsdp_index_num_files(ix); i++) {
        const char *name = fsdp_index_file(ix, i);
        snprintf(path, sizeof path, "%s/%s", dir, name ? name : "(none)");
        ok = access(path, F_OK) == 0;
    }
    fsdp_index_close(ix);
    return ok;
}

static int launch(int nprocs, fsdp_rank_fn fn, board *b, fsdp_launch_status *status) {
    return launch_ranks(nprocs, FSDP_BACKEND_SHM, LAUNCH_TIMEOUT_MS, fn, b, status);
}

static void assert_launch_ok(int rc, const fsdp_launch_status *status, const board *b, const char *what) {
    static char text[1024];
    snprintf(text, sizeof text, "%.200s: %s | %s", what, status->message, b->error.text);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, b->error.claimed, text);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, text);
}

/* Where values first differ, as text for a failure message. */
static const char *first_difference(const float *expected, const float *actual) {
    static char text[256];
    int64_t i;
    int p;
    for (i = 0; i < MODEL_NUMEL && memcmp(&expected[i], &actual[i], sizeof(float)) == 0; i++) {}
    if (i == MODEL_NUMEL) return "identical";
    for (p = NUM_PARAMS - 1; p > 0 && param_offset[p] > i; p--) {}
    snprintf(text, sizeof text, "%s[%lld]: expected %.9g, got %.9g", param_names[p], (long long)(i - param_offset[p]),
             expected[i], actual[i]);
    return text;
}

static void assert_values(const float *expected, const float *actual, const char *what) {
    snprintf(message, sizeof message, "%s: %s", what, first_difference(expected, actual));
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(expected, actual, sizeof(float) * MODEL_NUMEL, message);
}

static void assert_values_differ(const float *a, const float *b, const char *what) {
    TEST_ASSERT_TRUE_MESSAGE(memcmp(a, b, sizeof(float) * MODEL_NUMEL) != 0, what);
}

/* ---------------------------------------------------------------------------------------------
   files: a checkpoint directory seen from the parent
   --------------------------------------------------------------------------------------------- */
#define MAX_ENTRIES 16

typedef struct listing {
    int count;
    char name[MAX_ENTRIES][128]; /* sorted */
} listing;

static int compare_names(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

static void list_dir(const char *dir, listing *l) {
    DIR *d = opendir(dir);
    struct dirent *e;
    snprintf(message, sizeof message, "cannot list %s: %s", dir, strerror(errno));
    TEST_ASSERT_NOT_NULL_MESSAGE(d, message);
    l->count = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (l->count == MAX_ENTRIES) closedir(d);
        TEST_ASSERT_TRUE_MESSAGE(l->count < MAX_ENTRIES, "too many files in a checkpoint directory");
        snprintf(l->name[l->count++], sizeof l->name[0], "%.120s", e->d_name);
    }
    closedir(d);
    qsort(l->name, (size_t)l->count, sizeof l->name[0], compare_names);
}

/* Every "shard-XXXXXXXX-" of text with its 8 hex digits (the save's nonce) replaced by '#'. */
static void mask_nonces(char *text) {
    char *at = text;
    while ((at = strstr(at, "shard-")) != NULL) {
        int i;
        at += 6;
        for (i = 0; i < 8 && isxdigit((unsigned char)at[i]); i++) at[i] = '#';
    }
}

static unsigned char *read_into(int slot, const char *path, size_t *size) {
    free(file_bytes[slot]);
    file_bytes[slot] = NULL;
    file_bytes[slot] = read_whole_file(path, size);
    return file_bytes[slot];
}

/* a and b hold the same files but for the nonce in their names and in index.json, byte for
   byte, and no temporary file. */
static void assert_same_checkpoint_but_for_the_nonce(const char *a, const char *b, const char *what) {
    listing la, lb;
    int i;
    list_dir(a, &la);
    list_dir(b, &lb);
    for (i = 0; i < la.count; i++) mask_nonces(la.name[i]);
    for (i = 0; i < lb.count; i++) mask_nonces(lb.name[i]);
    qsort(la.name, (size_t)la.count, sizeof la.name[0], compare_names);
    qsort(lb.name, (size_t)lb.count, sizeof lb.name[0], compare_names);
    snprintf(message, sizeof message, "%s: %d files asynchronously, %d synchronously", what, la.count, lb.count);
    TEST_ASSERT_EQUAL_INT_MESSAGE(lb.count, la.count, message);
    for (i = 0; i < la.count; i++) {
        snprintf(message, sizeof message, "%s: file %s asynchronously, %s synchronously", what, la.name[i], lb.name[i]);
        TEST_ASSERT_EQUAL_STRING_MESSAGE(lb.name[i], la.name[i], message);
        TEST_ASSERT_NULL_MESSAGE(strstr(la.name[i], ".tmp"), message);
    }
    list_dir(a, &la); /* the real names, in the same order as the masked ones: only the nonce differs */
    list_dir(b, &lb);
    for (i = 0; i < la.count; i++) {
        char path[2][512];
        size_t size[2];
        unsigned char *bytes[2];
        snprintf(path[0], sizeof path[0], "%s/%s", a, la.name[i]);
        snprintf(path[1], sizeof path[1], "%s/%s", b, lb.name[i]);
        bytes[0] = read_into(0, path[0], &size[0]);
        bytes[1] = read_into(1, path[1], &size[1]);
        if (strcmp(la.name[i], "index.json") == 0) {
            mask_nonces((char *)bytes[0]);
            mask_nonces((char *)bytes[1]);
        }
        snprintf(message, sizeof message, "%s: %s (asynchronous, %zu bytes) differs from %s (synchronous, %zu bytes)",
                 what, la.name[i], size[0], lb.name[i], size[1]);
        TEST_ASSERT_EQUAL_size_t_MESSAGE(size[1], size[0], message);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(bytes[1], bytes[0], size[0], message);
    }
}

/* dir holds index.json, every file it names and nothing else: a complete checkpoint with no
   file of another save (world: ranks that wrote a shard file). */
static void assert_only_the_committed_files(const char *dir, int world) {
    fsdp_index *ix = NULL;
    char err[512];
    int files;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_index_open(&ix, dir, err, sizeof err), err);
    files = fsdp_index_num_files(ix);
    fsdp_index_close(ix);
    snprintf(message, sizeof message, "%s: index.json names %d files", dir, files);
    TEST_ASSERT_EQUAL_INT_MESSAGE(world, files, message);
    TEST_ASSERT_TRUE_MESSAGE(ckpt_dir_exact(dir, message, sizeof message), message);
}

/* Every file of dir under a final name (no ".tmp.") but index.json is a complete safetensors
   file whose checksums verify. */
static void assert_no_partial_file_under_a_final_name(const char *dir) {
    listing l;
    char path[512], err[512] = "";
    int i, k, rc;
    list_dir(dir, &l);
    for (i = 0; i < l.count; i++) {
        fsdp_st_file *f = NULL;
        if (strstr(l.name[i], ".tmp.") || strcmp(l.name[i], "index.json") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, l.name[i]);
        rc = fsdp_st_open(&f, path, err, sizeof err);
        snprintf(message, sizeof message, "%s is under its final name but does not open: %s", path, err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
        for (k = 0; k < fsdp_st_num_tensors(f) && rc == FSDP_SUCCESS; k++) rc = fsdp_st_verify(f, k, err, sizeof err);
        fsdp_st_close(f);
        snprintf(message, sizeof message, "%s is under its final name but does not verify: %s", path, err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   1. the files are fsdp_save_sharded's
   --------------------------------------------------------------------------------------------- */
static const fsdp_strategy every_strategy[4] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_HYBRID_SHARD};
static const char *const strategy_names[5] = {"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
static const fsdp_dtype saved_dtypes[2] = {FSDP_F32, FSDP_BF16};

/* HYBRID_SHARD only where the world has more than one rank (shard groups of 1 at P = 2, of 2
   at P = 4): at P = 1 it is FULL_SHARD. */
static int strategy_count(int world) { return world == 1 ? 3 : 4; }

static void pair_dir(char *out, size_t size, int world, int strategy, int dtype, const char *kind) {
    snprintf(out, size, "%s/p%d-%s-%s-%s", tmpdir, world, strategy_names[every_strategy[strategy]],
             dtype ? "bf16" : "f32", kind);
}

/* For every strategy and saved dtype: a fresh context trains 2 steps, then saves
   asynchronously (and waits) and synchronously, into two directories. */
static int identical_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    int world = fsdp_comm_size(comm), st, dt, rc, status = 0;
    for (st = 0; st < strategy_count(world) && !status; st++)
        for (dt = 0; dt < 2 && !status; dt++) {
            fsdp_save_options so = save_options(saved_dtypes[dt], 0);
            char dir[2][256];
            rank_run r;
            pair_dir(dir[0], sizeof dir[0], world, st, dt, "async");
            pair_dir(dir[1], sizeof dir[1], world, st, dt, "sync");
            if ((status = run_start(&r, comm, b, every_strategy[st], TRAIN_SEED + (uint64_t)st)) == 0 &&
                (status = train(&r, 2)) == 0) {
                if ((rc = fsdp_save_sharded_async(r.ctx, dir[0], &so)) != 0) status = run_fail(&r, dir[0], rc);
                else if ((rc = fsdp_save_wait(r.ctx)) != 0) status = run_fail(&r, "fsdp_save_wait", rc);
                else if ((rc = fsdp_save_sharded(r.ctx, dir[1], &so)) != 0) status = run_fail(&r, dir[1], rc);
            }
            run_end(&r);
        }
    return status;
}

static void test_async_save_at_every_world_size_strategy_and_dtype_writes_the_files_of_a_sync_save(void) {
    static const int worlds[3] = {1, 2, 4};
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    char dir[2][256];
    int w, st, dt, rc;
    for (w = 0; w < 3; w++) {
        memset(b, 0, sizeof *b);
        rc = launch(worlds[w], identical_rank, b, &status);
        snprintf(message, sizeof message, "saves at P=%d", worlds[w]);
        assert_launch_ok(rc, &status, b, message);
        for (st = 0; st < strategy_count(worlds[w]); st++)
            for (dt = 0; dt < 2; dt++) {
                char what[128];
                pair_dir(dir[0], sizeof dir[0], worlds[w], st, dt, "async");
                pair_dir(dir[1], sizeof dir[1], worlds[w], st, dt, "sync");
                snprintf(what, sizeof what, "P=%d %s %s", worlds[w], strategy_names[every_strategy[st]],
                         dt ? "BF16" : "F32");
                TEST_ASSERT_TRUE_MESSAGE(ckpt_dir_exact(dir[0], message, sizeof message), message);
                TEST_ASSERT_TRUE_MESSAGE(ckpt_dir_exact(dir[1], message, sizeof message), message);
                assert_same_checkpoint_but_for_the_nonce(dir[0], dir[1], what);
            }
    }
}

/* The epoch of the save options is the checkpoint's epoch, in index.json (which the load
   reports) as in the shard files' metadata, as fsdp_save_sharded records it. */
static int epoch_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    fsdp_save_options so = save_options(FSDP_F32, 7);
    rank_run r;
    int rc, status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) == 0 && (status = train(&r, 1)) == 0) {
        if ((rc = fsdp_save_sharded_async(r.ctx, b->dir[0], &so)) != 0) status = run_fail(&r, "fsdp_save_sharded_async", rc);
        else if ((rc = fsdp_save_sharded(r.ctx, b->dir[1], &so)) != 0) status = run_fail(&r, "fsdp_save_sharded", rc);
    }
    run_end(&r);
    if (!status) status = load_fresh(comm, b, b->dir[0], b->loaded[0], &b->loaded_epoch[0]);
    if (!status) status = load_fresh(comm, b, b->dir[1], b->loaded[1], &b->loaded_epoch[1]);
    return status;
}

static void test_async_save_with_an_epoch_loads_reporting_that_epoch_as_a_sync_save_does(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    fsdp_index *ix = NULL;
    char err[512];
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/async", tmpdir);
    snprintf(b->dir[1], sizeof b->dir[1], "%s/sync", tmpdir);
    rc = launch(2, epoch_rank, b, &status);
    assert_launch_ok(rc, &status, b, "saves with epoch 7, loads");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(7, b->loaded_epoch[1], "the synchronous save's epoch (the control)");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_index_open(&ix, b->dir[0], err, sizeof err), err);
    rc = (int)fsdp_index_epoch(ix);
    fsdp_index_close(ix);
    TEST_ASSERT_EQUAL_INT_MESSAGE(7, rc, "the asynchronous save's index.json epoch");
    TEST_ASSERT_EQUAL_INT64_MESSAGE(7, b->loaded_epoch[0], "the epoch loading the asynchronous save reports");
}

/* ---------------------------------------------------------------------------------------------
   2. the values of the call
   --------------------------------------------------------------------------------------------- */
/* An asynchronous save to dir with every rank's writer held (the gate) while the rank trains
   `steps` more steps, gathering the values reached into later; then the writer is let go. */
static int save_async_held(rank_run *r, board *b, fsdp_comm *comm, const char *dir, int steps, float *later) {
    int status = gate_arm() != 0 ? rank_fail(b, comm, "gate_arm", FSDP_ERR_SYSTEM, strerror(errno)) : 0;
    if (!status) status = save_async(r, dir);
    if (!status) status = train(r, steps);
    if (!status) status = gather_values(r, later);
    gate_release();
    return status;
}

/* Trains 2 steps, saves asynchronously with every rank's writer held while it trains 3 more
   steps, then waits; a fresh context loads the checkpoint. */
static int snapshot_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    rank_run r;
    int status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) == 0 && (status = train(&r, 2)) == 0 &&
        (status = gather_values(&r, b->at_call[0])) == 0) {
        status = save_async_held(&r, b, comm, b->dir[0], 3, b->later);
        if (!status) status = save_wait(&r);
        b->writer_gated[r.rank] = gate_was_passed();
    }
    run_end(&r);
    if (!status) status = load_fresh(comm, b, b->dir[0], b->loaded[0], NULL);
    return status;
}

static void assert_writer_gated(const board *b, int rank) {
    snprintf(message, sizeof message, "rank %d's writer never went through the writer gate: nothing shows that it "
             "wrote after the training (does it still allocate through FSDP_MALLOC before it writes?)", rank);
    TEST_ASSERT_TRUE_MESSAGE(b->writer_gated[rank], message);
}

static void assert_writers_gated(const board *b, int world) {
    int rank;
    for (rank = 0; rank < world; rank++) assert_writer_gated(b, rank);
}

static void test_async_save_while_training_goes_on_holds_the_values_of_the_call(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/ckpt", tmpdir);
    rc = launch(2, snapshot_rank, b, &status);
    assert_launch_ok(rc, &status, b, "save while training, load");
    assert_writers_gated(b, 2);
    assert_values_differ(b->at_call[0], b->later, "the 3 steps after the call changed nothing (the control)");
    assert_values(b->at_call[0], b->loaded[0], "loaded from the asynchronous save vs the values at its call");
}

/* ---------------------------------------------------------------------------------------------
   3. the commit point
   --------------------------------------------------------------------------------------------- */
/* A synchronous save, a step, then an asynchronous save into the same directory with rank 1's
   writer held for HOLD_STEPS steps (rank 0 first waits for its own file to be written, and
   lets 5 ms pass after each, so that only rank 1's is missing); then steps until index.json
   changes. Rank 0 watches the directory. Every rank decides from index.json when it changed: the commit runs inside
   fsdp_step on every rank and rank 0 writes index.json between two of its collectives, so
   after a given step every rank reads the same index. */
static int commit_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    const char *dir = b->dir[0];
    char path[512], index[INDEX_BYTES];
    rank_run r;
    int status, s;
    snprintf(path, sizeof path, "%s/index.json", dir);
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) != 0 || (status = save_sync(&r, dir)) != 0 ||
        (status = train(&r, 1)) != 0)
        goto out;
    if (read_small_file(path, index, sizeof index) < 0) {
        status = rank_fail(b, comm, "reading the first index.json", FSDP_ERR_IO, strerror(errno));
        goto out;
    }
    if (r.rank == 0) memcpy(b->index_before, index, sizeof index);
    if (r.rank == 1 && gate_arm() != 0) status = rank_fail(b, comm, "gate_arm", FSDP_ERR_SYSTEM, strerror(errno));
    if (status || (status = save_async(&r, dir)) != 0) goto out;
    if (r.rank == 0) {
        double until = now_ms() + GATE_LIMIT_MS / 2;
        b->index_kept_at_return = index_is(dir, index);
        while (!(b->own_file_written = new_shard_file_exists(dir, index, 0)) && now_ms() < until) sleep_ms(1);
    }
    for (s = 0; s < HOLD_STEPS && !status; s++) {
        sleep_ms(5);
        status = train(&r, 1);
        if (r.rank == 0) {
            b->index_kept_while_held[s] = index_is(dir, index);
            b->old_files_kept_while_held[s] = named_files_exist(dir, index);
        }
    }
    if (r.rank == 1) gate_release();
    b->steps_to_commit = -1;
    for (s = 1; s <= COMMIT_STEP_LIMIT && !status; s++) {
        status = train(&r, 1);
        if (!index_is(dir, index)) {
            b->steps_to_commit = s;
            break;
        }
        sleep_ms(2);
    }
    if (!status) status = save_wait(&r);
    if (r.rank == 1) b->writer_gated[1] = gate_was_passed();
out:
    gate_release();
    run_end(&r);
    return status;
}

static board *run_commit(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/ckpt", tmpdir);
    rc = launch(2, commit_rank, b, &status);
    assert_launch_ok(rc, &status, b, "sync save, async save, steps");
    assert_writer_gated(b, 1);
    return b;
}

static void test_async_save_before_every_rank_has_written_leaves_the_previous_index_in_place(void) {
    board *b = run_commit();
    int s;
    TEST_ASSERT_TRUE_MESSAGE(b->index_kept_at_return, "index.json changed before fsdp_save_sharded_async returned");
    TEST_ASSERT_TRUE_MESSAGE(b->own_file_written, "rank 0's shard file never appeared: the test shows nothing");
    for (s = 0; s < HOLD_STEPS; s++) {
        snprintf(message, sizeof message, "step %d while rank 1 was still writing", s + 1);
        TEST_ASSERT_TRUE_MESSAGE(b->index_kept_while_held[s], message);
        TEST_ASSERT_TRUE_MESSAGE(b->old_files_kept_while_held[s], message);
    }
}

static void test_async_save_once_every_rank_has_written_is_committed_by_fsdp_step_removing_the_old_files(void) {
    board *b = run_commit();
    snprintf(message, sizeof message, "index.json still the previous save's after %d steps", COMMIT_STEP_LIMIT);
    TEST_ASSERT_TRUE_MESSAGE(b->steps_to_commit > 0, message);
    /* the new index names files of another save, which are there, and the old ones are gone */
    TEST_ASSERT_TRUE_MESSAGE(!index_is(b->dir[0], b->index_before), "index.json is the previous save's");
    assert_only_the_committed_files(b->dir[0], 2);
}

/* ---------------------------------------------------------------------------------------------
   4. at most one save in flight
   --------------------------------------------------------------------------------------------- */
/* An asynchronous save to dir 0 whose writers are held while the ranks train 2 steps, then at
   once one to dir 1 (the first is still in flight), a step, fsdp_save_wait; then both load. */
static int two_saves_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    rank_run r;
    int status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) == 0 && (status = train(&r, 2)) == 0 &&
        (status = gather_values(&r, b->at_call[0])) == 0) {
        status = save_async_held(&r, b, comm, b->dir[0], 2, b->at_call[1]);
        if (!status) status = save_async(&r, b->dir[1]); /* (waits for the first save's writer) */
        b->writer_gated[r.rank] = gate_was_passed();
        if (!status) status = train(&r, 1);
        if (!status) status = save_wait(&r);
    }
    run_end(&r);
    if (!status) status = load_fresh(comm, b, b->dir[0], b->loaded[0], NULL);
    if (!status) status = load_fresh(comm, b, b->dir[1], b->loaded[1], NULL);
    return status;
}

static void test_two_async_saves_back_to_back_both_complete_with_the_values_of_their_calls(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/first", tmpdir);
    snprintf(b->dir[1], sizeof b->dir[1], "%s/second", tmpdir);
    rc = launch(2, two_saves_rank, b, &status);
    assert_launch_ok(rc, &status, b, "two async saves, strict loads");
    assert_writers_gated(b, 2);
    assert_values_differ(b->at_call[0], b->at_call[1], "the steps between the saves changed nothing (the control)");
    assert_only_the_committed_files(b->dir[0], 2);
    assert_only_the_committed_files(b->dir[1], 2);
    assert_values(b->at_call[0], b->loaded[0], "the first save");
    assert_values(b->at_call[1], b->loaded[1], "the second save");
}

/* ---------------------------------------------------------------------------------------------
   5. a save that fails in the background
   --------------------------------------------------------------------------------------------- */
/* A synchronous save (the previous checkpoint); 2 steps; rank 1 limits its files to FSIZE_LIMIT
   bytes (writes beyond fail with EFBIG) and both save asynchronously into the same directory;
   steps until the failure is logged (the commit that found it ran in that fsdp_step, on both
   ranks) and 2 more; fsdp_save_wait; the limit lifted, a fresh context loads the directory. */
static int failing_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    struct rlimit saved_limit, small;
    int limited = 0, s, status;
    rank_run r;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) != 0 || (status = train(&r, 1)) != 0 ||
        (status = save_sync(&r, b->dir[0])) != 0 || (status = gather_values(&r, b->before)) != 0 ||
        (status = train(&r, 2)) != 0 || (status = gather_values(&r, b->at_call[0])) != 0)
        goto out;
    if (r.rank == 1) {
        signal(SIGXFSZ, SIG_IGN);
        getrlimit(RLIMIT_FSIZE, &saved_limit);
        small = saved_limit;
        small.rlim_cur = FSIZE_LIMIT;
        if (setrlimit(RLIMIT_FSIZE, &small) != 0) status = rank_fail(b, comm, "setrlimit", FSDP_ERR_SYSTEM, strerror(errno));
        limited = !status;
    }
    if (status || (status = save_async(&r, b->dir[0])) != 0) goto out;
    for (s = 0; s < COMMIT_STEP_LIMIT && !b->failure_logged_at[r.rank]; s++) {
        if (train(&r, 1) != 0) goto out; /* (recorded) */
        b->steps_ok[r.rank]++;
        if (b->errors_logged[r.rank] > 0) b->failure_logged_at[r.rank] = b->steps_ok[r.rank];
        else sleep_ms(2);
    }
    for (s = 0; s < 2 && b->failure_logged_at[r.rank]; s++) {
        if (train(&r, 1) != 0) goto out;
        b->steps_ok[r.rank]++;
    }
    b->wait_rc[r.rank] = fsdp_save_wait(r.ctx);
    b->wait_again_rc[r.rank] = fsdp_save_wait(r.ctx);
out:
    if (limited) setrlimit(RLIMIT_FSIZE, &saved_limit);
    run_end(&r);
    if (!status) status = load_fresh(comm, b, b->dir[0], b->loaded[0], NULL);
    return status;
}

static board *run_failing(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/ckpt", tmpdir);
    rc = launch(2, failing_rank, b, &status);
    assert_launch_ok(rc, &status, b, "sync save, async save that fails on rank 1, steps, load");
    return b;
}

static void test_async_save_failing_in_the_background_lets_training_go_on_and_save_wait_returns_the_error(void) {
    board *b = run_failing();
    int rank;
    for (rank = 0; rank < 2; rank++) {
        snprintf(message, sizeof message, "rank %d: no error about the asynchronous save logged in %d steps", rank,
                 COMMIT_STEP_LIMIT);
        TEST_ASSERT_GREATER_THAN_MESSAGE(0, b->failure_logged_at[rank], message);
        snprintf(message, sizeof message, "rank %d: steps that succeeded after the one that found the failure (of 2)",
                 rank);
        TEST_ASSERT_EQUAL_INT_MESSAGE(b->failure_logged_at[rank] + 2, b->steps_ok[rank], message);
        snprintf(message, sizeof message, "rank %d: fsdp_save_wait returned %s", rank, fsdp_result_name(b->wait_rc[rank]));
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_IO, b->wait_rc[rank], message);
        snprintf(message, sizeof message, "rank %d: a second fsdp_save_wait returned %s (the failure is said once)", rank,
                 fsdp_result_name(b->wait_again_rc[rank]));
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->wait_again_rc[rank], message);
    }
}

/* ... loadable, and alone: rank 0's complete file of the failed save is gone too. */
static void test_async_save_failing_in_the_background_leaves_the_previous_checkpoint(void) {
    board *b = run_failing();
    assert_values_differ(b->before, b->at_call[0], "the steps between the saves changed nothing (the control)");
    assert_values(b->before, b->loaded[0], "loaded after the failed save vs the previous checkpoint");
    TEST_ASSERT_TRUE_MESSAGE(ckpt_dir_exact(b->dir[0], message, sizeof message), message);
}

/* ---------------------------------------------------------------------------------------------
   6. a rank killed before the commit
   --------------------------------------------------------------------------------------------- */
/* The previous checkpoint: a step, a synchronous save, its values. */
static int previous_save_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    rank_run r;
    int status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) == 0 && (status = train(&r, 1)) == 0 &&
        (status = save_sync(&r, b->dir[0])) == 0)
        status = gather_values(&r, b->before);
    run_end(&r);
    return status;
}

/* Other values, an asynchronous save into the same directory; rank 1 then dies of SIGKILL, rank
   0 trains until a step fails and destroys its context. */
static int killed_save_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    rank_run r;
    int status, s, rc = 0;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, OTHER_SEED)) == 0 && (status = train(&r, 1)) == 0 &&
        (status = gather_values(&r, b->at_call[0])) == 0 && (status = save_async(&r, b->dir[0])) == 0) {
        const char *where = "";
        if (r.rank == 1) raise(SIGKILL);
        for (s = 0; s < 100 && (rc = train_step(r.ctx, &r.m, comm, r.next_step++, &where)) == 0; s++) sleep_ms(10);
        b->survivor_step_rc = rc;
    }
    run_end(&r);
    b->survivor_destroyed = 1;
    return status;
}

static int load_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    return load_fresh(comm, b, b->dir[0], b->loaded[0], NULL);
}

static void test_rank_killed_before_the_commit_leaves_the_previous_checkpoint_loadable(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    size_t size[2];
    char path[512];
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/ckpt", tmpdir);
    snprintf(path, sizeof path, "%s/index.json", b->dir[0]);
    rc = launch(2, previous_save_rank, b, &status);
    assert_launch_ok(rc, &status, b, "the previous save");
    read_into(0, path, &size[0]);

    rc = launch_ranks(2, FSDP_BACKEND_SHM, KILL_TIMEOUT_MS, killed_save_rank, b, &status);
    snprintf(message, sizeof message, "expected rank 1 killed by SIGKILL: %s | %s", status.message, b->error.text);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_RANK_FAILED, rc, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, status.failed_rank, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(SIGKILL, status.signal, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, b->error.claimed, message);
    TEST_ASSERT_TRUE_MESSAGE(b->survivor_step_rc != FSDP_SUCCESS, "rank 0 trained 100 steps without its peer");
    TEST_ASSERT_TRUE_MESSAGE(b->survivor_destroyed, "rank 0 did not return from fsdp_destroy");

    read_into(1, path, &size[1]);
    TEST_ASSERT_EQUAL_size_t_MESSAGE(size[0], size[1], "index.json changed");
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(file_bytes[0], file_bytes[1], size[0], "index.json changed");
    TEST_ASSERT_TRUE_MESSAGE(named_files_exist(b->dir[0], (const char *)file_bytes[1]), "index.json names a missing file");
    assert_no_partial_file_under_a_final_name(b->dir[0]);
    rc = launch(2, load_rank, b, &status);
    assert_launch_ok(rc, &status, b, "loading after the killed save");
    assert_values_differ(b->before, b->at_call[0], "the killed job had the previous values (the control)");
    assert_values(b->before, b->loaded[0], "loaded after the killed save vs the previous checkpoint");
}

/* ---------------------------------------------------------------------------------------------
   7. fsdp_save_wait without a save; a synchronous save while one is in flight
   --------------------------------------------------------------------------------------------- */
static void test_save_wait_without_any_save_returns_success(void) {
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    mlp m;
    int rc;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, open_one_rank_comm(&comm, "async-save"), "fsdp_comm_init (one rank)");
    TEST_ASSERT_EQUAL_INT(0, mlp_build(&m));
    memset(&d, 0, sizeof d);
    d.comm = comm;
    rc = fsdp_init(&ctx, m.model, &d);
    if (rc == FSDP_SUCCESS) rc = fsdp_save_wait(ctx);
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    fsdp_comm_destroy(comm);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, rc);
}

/* An asynchronous save whose writers are held while the ranks train 2 steps, then at once a
   synchronous save into the same directory, which must first finish the one in flight. */
static int sync_after_async_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    rank_run r;
    int status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) == 0 && (status = train(&r, 1)) == 0 &&
        (status = gather_values(&r, b->at_call[0])) == 0) {
        status = save_async_held(&r, b, comm, b->dir[0], 2, b->at_call[1]);
        if (!status) status = save_sync(&r, b->dir[0]); /* (waits for the asynchronous save's writer) */
        b->writer_gated[r.rank] = gate_was_passed();
        if (!status) b->wait_rc[r.rank] = fsdp_save_wait(r.ctx);
    }
    run_end(&r);
    if (!status) status = load_fresh(comm, b, b->dir[0], b->loaded[0], NULL);
    return status;
}

static void test_sync_save_while_an_async_one_is_in_flight_finishes_it_first_and_ends_in_place(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/ckpt", tmpdir);
    rc = launch(2, sync_after_async_rank, b, &status);
    assert_launch_ok(rc, &status, b, "async save, sync save, load");
    assert_writers_gated(b, 2);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->wait_rc[0], "fsdp_save_wait after both saves (rank 0)");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->wait_rc[1], "fsdp_save_wait after both saves (rank 1)");
    assert_values_differ(b->at_call[0], b->at_call[1], "the steps between the saves changed nothing (the control)");
    assert_only_the_committed_files(b->dir[0], 2);
    assert_values(b->at_call[1], b->loaded[0], "loaded after both saves vs the values of the synchronous one");
}

/* ---------------------------------------------------------------------------------------------
   8. fsdp_destroy with a save in flight
   --------------------------------------------------------------------------------------------- */
/* A step, an asynchronous save, and at once fsdp_destroy; then a fresh context loads it. */
static int destroy_rank(fsdp_comm *comm, void *arg) {
    board *b = (board *)arg;
    rank_run r;
    int status;
    if ((status = run_start(&r, comm, b, FSDP_FULL_SHARD, TRAIN_SEED)) == 0 && (status = train(&r, 1)) == 0 &&
        (status = gather_values(&r, b->at_call[0])) == 0)
        status = save_async(&r, b->dir[0]);
    run_end(&r);
    if (!status) status = load_fresh(comm, b, b->dir[0], b->loaded[0], NULL);
    return status;
}

static void test_destroy_with_an_async_save_in_flight_commits_it(void) {
    board *b = (board *)map_board(sizeof(board));
    fsdp_launch_status status;
    int rc;
    snprintf(b->dir[0], sizeof b->dir[0], "%s/ckpt", tmpdir);
    rc = launch(2, destroy_rank, b, &status);
    assert_launch_ok(rc, &status, b, "async save, fsdp_destroy, load");
    assert_only_the_committed_files(b->dir[0], 2);
    assert_values(b->at_call[0], b->loaded[0], "loaded vs the values at the call");
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_async_save_at_every_world_size_strategy_and_dtype_writes_the_files_of_a_sync_save);
    RUN_TEST(test_async_save_with_an_epoch_loads_reporting_that_epoch_as_a_sync_save_does);
    RUN_TEST(test_async_save_while_training_goes_on_holds_the_values_of_the_call);
    RUN_TEST(test_async_save_before_every_rank_has_written_leaves_the_previous_index_in_place);
    RUN_TEST(test_async_save_once_every_rank_has_written_is_committed_by_fsdp_step_removing_the_old_files);
    RUN_TEST(test_two_async_saves_back_to_back_both_complete_with_the_values_of_their_calls);
    RUN_TEST(test_async_save_failing_in_the_background_lets_training_go_on_and_save_wait_returns_the_error);
    RUN_TEST(test_async_save_failing_in_the_background_leaves_the_previous_checkpoint);
    RUN_TEST(test_rank_killed_before_the_commit_leaves_the_previous_checkpoint_loadable);
    RUN_TEST(test_save_wait_without_any_save_returns_success);
    RUN_TEST(test_sync_save_while_an_async_one_is_in_flight_finishes_it_first_and_ends_in_place);
    RUN_TEST(test_destroy_with_an_async_save_in_flight_commits_it);
    return UNITY_END();
}
