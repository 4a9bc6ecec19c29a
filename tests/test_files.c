/* test_files.c - specification of checkpoint files against hostile names and bytes (issue 9, the
   file side; tests/test_hostile.c has the network side):
   - writes: every writer (fsdp_st_writer, fsdp_save_full, fsdp_save_sharded,
     fsdp_write_file_atomic) creates a fresh temporary file exclusively, mode 0600 while it is
     being written, and gives the final file 0666 less the umask; a symlink at the final path is
     replaced (its target untouched) and one planted under the old predictable temporary name
     "<path>.tmp.<pid>" is never followed; two writers of one path in one process both succeed.
   - stale temporary files are removed only when they are this host's and their writer is dead.
   - readers: a FIFO fails at once instead of blocking, a directory or a device is refused,
     symbolic links inside a checkpoint directory (index.json, shard files) are refused, a
     user's own symlink to a file works, and no message shows a file's first bytes.
   - JSON: parsing a ~10 MB safetensors header or index.json of any shape peaks at no more than
     4x the input in allocations (measured with a counting allocator: this file defines
     FSDP_MALLOC / FSDP_REALLOC / FSDP_FREE).
   - names and metadata from files are shown through fsdp_printable (control bytes and escape
     sequences as \xNN) in every message, while callbacks get them raw; index.json's file
     entries must be plain names (1..255 of A-Z a-z 0-9 . _ -), any other is refused.
   - sizes: a shape whose element count or byte size does not fit 63 bits is refused by the
     reader (never wrapped to match data_offsets) and by the writer (no file is made).
   - a write whose rename is done but whose directory cannot be synced succeeds, warning.
   - fsdp_save_sharded writes only into a directory of this user that others cannot write in,
     reached through no symbolic link of another user (also when named "link/" or "link/."), and
     only into the directory it checked: a link on the path repointed after the check (the hook
     FSDP__DIR_OPENED does it) changes nothing, for saves, asynchronous saves and traces.
   - a second job saving into a directory while a save is in flight there fails at once.
   - traces are made afresh, never opened where they lie: a FIFO planted under a trace's name
     blocks nothing, another user's file there receives nothing.
   - fsdp_load_full fails on every rank, naming it, when a rank opened another file.
   - a rank out of memory in fsdp_save_full (the allocator below fails on request) makes every
     rank fail at once, naming it, rather than wait for it until the communicator's timeout.
   - the index.json fuzz target's corpus (tests/corpus/index and its crashers/ folder) is
     replayed through fsdp_index_parse; run from the repository root or set INDEX_CORPUS_DIR.

   Tests that need another process (a FIFO open that may block, a file size limit, two ranks)
   fork; children report through a MAP_SHARED board and their exit status, every wait is
   bounded, and only the parent asserts. Every test works in its own directory under /tmp
   (mkdtemp in setUp, removed in tearDown); the one that needs a sparse file of 2^62 bytes
   falls back to one under /dev/shm (tmpfs), also removed. Run as root (as CI does), tests of
   other users' files chown them to uid 65534 and fork a child that becomes it; as another
   user those that need root are ignored.

   Build: gcc -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -I. -Itests/unity \
              tests/test_files.c tests/unity/unity.c -o /tmp/tfiles -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
   the counting allocator: every allocation of fsdp.h, with its size in a header before it
   --------------------------------------------------------------------------------------------- */
#define ALLOC_HEADER 16 /* keeps the alignment malloc gives */
static size_t alloc_current, alloc_peak;
static int alloc_fails; /* atomic: 1 makes every allocation fail (a process out of memory) */

static void allocation_changed(size_t added, size_t removed) {
    size_t now = __atomic_add_fetch(&alloc_current, added, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&alloc_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&alloc_peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    __atomic_sub_fetch(&alloc_current, removed, __ATOMIC_RELAXED);
}

static void *counting_malloc(size_t size) {
    unsigned char *block;
    if (__atomic_load_n(&alloc_fails, __ATOMIC_RELAXED)) return NULL;
    block = (unsigned char *)malloc(size + ALLOC_HEADER);
    if (!block) return NULL;
    memcpy(block, &size, sizeof size);
    allocation_changed(size, 0);
    return block + ALLOC_HEADER;
}

/* The old and the new block both count until the call returns, as realloc may hold both. */
static void *counting_realloc(void *ptr, size_t size) {
    unsigned char *block;
    size_t old;
    if (!ptr) return counting_malloc(size);
    if (__atomic_load_n(&alloc_fails, __ATOMIC_RELAXED)) return NULL;
    block = (unsigned char *)ptr - ALLOC_HEADER;
    memcpy(&old, block, sizeof old);
    allocation_changed(size, 0);
    block = (unsigned char *)realloc(block, size + ALLOC_HEADER);
    if (!block) {
        allocation_changed(0, size);
        return NULL;
    }
    memcpy(block, &size, sizeof size);
    allocation_changed(0, old);
    return block + ALLOC_HEADER;
}

static void counting_free(void *ptr) {
    unsigned char *block;
    size_t size;
    if (!ptr) return;
    block = (unsigned char *)ptr - ALLOC_HEADER;
    memcpy(&size, block, sizeof size);
    allocation_changed(0, size);
    free(block);
}

#define FSDP_MALLOC(size) counting_malloc(size)
#define FSDP_REALLOC(ptr, size) counting_realloc(ptr, size)
#define FSDP_FREE(ptr) counting_free(ptr)
/* fsdp.h's private test hook: what happens once a save or a trace has checked its directory
   (here, when armed, a symbolic link on the path is repointed, as whoever can write its parent
   could do at that moment). */
static void directory_checked(const char *path);
#define FSDP__DIR_OPENED(path) directory_checked(path)
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>

#define CHILD_TIMEOUT_MS 20000   /* bound on a forked child; only reached on a hang */
#define FIFO_DEADLINE_MS 100     /* a reader given a FIFO fails within this */
#define JSON_INPUT_BYTES (10u << 20)
#define JSON_MAX_RATIO 4.0       /* peak allocation of a parse, in units of the input's size */

#ifndef INDEX_CORPUS_DIR
#define INDEX_CORPUS_DIR NULL /* derived from __FILE__: tests/corpus/index */
#endif

static char tmpdir[128];        /* this test's directory */
static char big_dir[128];       /* one under /dev/shm, for a sparse file ext4 cannot hold (removed in tearDown) */
static char message[4096];      /* assertion messages */
static mode_t saved_umask;

/* single-rank objects of in-process tests; tearDown releases whatever a test left */
static fsdp_comm *comm1, *comm2;
static fsdp_ctx *ctx1, *ctx2;       /* ctx2: a second job in this process */
static char repoint_link[256], repoint_to[256]; /* armed (link set): directory_checked repoints it, once */
static fsdp_model *model1, *model2;
static fsdp_logger ctx_logger;  /* what ctx_open gives a context (default: silent) */
static const char *ctx_trace_dir; /* and where it traces (default: nowhere) */
static char *text;              /* a document being built (plain malloc: not counted) */
static size_t text_len, text_cap;

void setUp(void) {
    saved_umask = umask(022);
    umask(saved_umask);
    make_test_dir(tmpdir, sizeof tmpdir, "fsdp-test-files");
}

void tearDown(void) {
    umask(saved_umask);
    memset(&ctx_logger, 0, sizeof ctx_logger);
    ctx_trace_dir = NULL;
    repoint_link[0] = 0;
    release_one_rank(&ctx1, &model1, &comm1);
    release_one_rank(&ctx2, &model2, &comm2);
    free(text);
    text = NULL;
    text_len = text_cap = 0;
    unmap_board(); /* the MAP_SHARED region of a forked test (map_board) */
    if (tmpdir[0]) remove_tree(tmpdir);
    tmpdir[0] = 0;
    if (big_dir[0]) remove_tree(big_dir);
    big_dir[0] = 0;
}

/* Runs fn(arg) in a forked child (which must not assert) and waits for it at most timeout_ms,
   killing it then. Returns 1 if it exited by itself (its status in *status), 0 if killed. */
static int run_child(int (*fn)(void *), void *arg, int timeout_ms, int *status) {
    pid_t pid = spawn(fn, arg, (unsigned)(timeout_ms / 1000 + 2)); /* a child that outlives the wait dies */
    TEST_ASSERT_TRUE_MESSAGE(pid > 0, "fork");
    return wait_child(pid, timeout_ms, status);
}

static void assert_child_ok(int finished, int status, const char *what) {
    snprintf(message, sizeof message, "%s: the child %s", what,
             !finished ? "did not finish in time (killed)"
             : WIFSIGNALED(status) ? "was killed by a signal" : "exited with a failure");
    TEST_ASSERT_TRUE_MESSAGE(finished && WIFEXITED(status) && WEXITSTATUS(status) == 0, message);
}

/* A process that is surely gone: a child that exited and was reaped. */
static pid_t dead_pid(void) {
    int status;
    pid_t pid;
    fflush(NULL);
    pid = fork();
    if (pid == 0) _exit(0);
    TEST_ASSERT_TRUE(pid > 0);
    TEST_ASSERT_EQUAL_INT(pid, waitpid(pid, &status, 0));
    return pid;
}

/* ---------------------------------------------------------------------------------------------
   files and directories
   --------------------------------------------------------------------------------------------- */
static void path_in(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", tmpdir, name); }

/* The file's bytes (at most size - 1) as a string; its length. */
static size_t read_bytes(const char *path, char *out, size_t size) {
    FILE *f = fopen(path, "rb");
    size_t n;
    snprintf(message, sizeof message, "cannot read %s: %s", path, strerror(errno));
    TEST_ASSERT_NOT_NULL_MESSAGE(f, message);
    n = fread(out, 1, size - 1, f);
    out[n] = 0;
    fclose(f);
    return n;
}

static void copy_file(const char *from, const char *to) {
    static char bytes[1 << 20];
    FILE *f = fopen(from, "rb");
    size_t n;
    TEST_ASSERT_NOT_NULL(f);
    n = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    TEST_ASSERT_TRUE(n < sizeof bytes);
    write_file(to, bytes, n);
}

/* The name of the first entry of dir that starts with prefix and ends with suffix ("" if none). */
static void find_entry(const char *dir, const char *prefix, const char *suffix, char *out, size_t size) {
    DIR *d = opendir(dir);
    struct dirent *e;
    out[0] = 0;
    TEST_ASSERT_NOT_NULL(d);
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name), s = strlen(suffix);
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && n >= s && strcmp(e->d_name + n - s, suffix) == 0) {
            snprintf(out, size, "%s", e->d_name);
            break;
        }
    }
    closedir(d);
}

/* A regular file under that very name (not a symlink to one). */
static int is_regular_file(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static mode_t mode_of(const char *path) {
    struct stat st;
    snprintf(message, sizeof message, "lstat(%s): %s", path, strerror(errno));
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, lstat(path, &st), message);
    return st.st_mode;
}

/* ---------------------------------------------------------------------------------------------
   a small model and a single-rank context in this process
   --------------------------------------------------------------------------------------------- */
#define IN 3
#define OUT 4
static const char *const model_names[2] = {"lin.weight", "lin.bias"};
static const int64_t model_numel[2] = {OUT * IN, OUT};

/* lin (Linear 3 -> 4): weight [4,3], bias [4]. No test assertions: children call it too. */
static int model_build(fsdp_model **out) {
    fsdp_init_rule uniform = {FSDP_INIT_UNIFORM, -0.5f, 0.5f, NULL, NULL};
    int64_t s_weight[2] = {OUT, IN}, s_bias[1] = {OUT};
    int rc, lin;
    if ((rc = fsdp_model_create(out, "Net")) != 0) return rc;
    if ((lin = fsdp_model_module(*out, 0, "lin", "Linear")) < 0) return lin;
    if ((rc = fsdp_model_param(*out, lin, "weight", 2, s_weight, uniform)) < 0) return rc;
    if ((rc = fsdp_model_param(*out, lin, "bias", 1, s_bias, uniform)) < 0) return rc;
    return 0;
}

static int ctx_open(fsdp_comm *comm, fsdp_model **model, fsdp_ctx **ctx) {
    fsdp_desc d;
    int rc;
    if ((rc = model_build(model)) != 0) return rc;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.logger = ctx_logger;
    d.trace_dir = ctx_trace_dir;
    d.seed = 5;
    d.optimizer.kind = FSDP_SGD;
    d.optimizer.lr = 0.1f;
    return fsdp_init(ctx, *model, &d);
}

static void start_one_rank(void) {
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, open_one_rank_comm(&comm1, "test-files"), fsdp_comm_last_error(NULL));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, ctx_open(comm1, &model1, &ctx1), fsdp_last_error(NULL));
}

/* The model's tensors (values base + index), plus extra F32 [1] tensors named extra[], as a
   safetensors file written by fsdp_st_writer with the metadata meta[num_meta]. No test
   assertions. */
static int write_model_file_with_metadata(const char *path, float base, const char *const *extra, int num_extra,
                                          const fsdp_kv *meta, int num_meta, char *err, size_t err_size) {
    fsdp_st_spec specs[8];
    fsdp_st_writer *w = NULL;
    int i, rc;
    int64_t k;
    memset(specs, 0, sizeof specs);
    for (i = 0; i < 2 + num_extra && i < 8; i++) {
        specs[i].name = i < 2 ? model_names[i] : extra[i - 2];
        specs[i].dtype = FSDP_F32;
        specs[i].ndim = i == 0 ? 2 : 1;
        specs[i].shape[0] = i == 0 ? OUT : i == 1 ? OUT : 1;
        specs[i].shape[1] = i == 0 ? IN : 0;
    }
    if ((rc = fsdp_st_writer_open(&w, path, specs, 2 + num_extra, meta, num_meta, err, err_size)) != 0) return rc;
    for (i = 0; i < 2 + num_extra; i++)
        for (k = 0; k < (i < 2 ? model_numel[i] : 1); k++) {
            float v = base + (float)k;
            if ((rc = fsdp_st_writer_write_f32(w, &v, 1)) != 0) {
                fsdp_st_writer_abort(w);
                return rc;
            }
        }
    return fsdp_st_writer_close(w, err, err_size);
}

/* The same without metadata. No test assertions. */
static int write_model_file(const char *path, float base, const char *const *extra, int num_extra, char *err,
                            size_t err_size) {
    return write_model_file_with_metadata(path, base, extra, num_extra, NULL, 0, err, err_size);
}

static void write_model_file_ok(const char *path, float base) {
    char err[1024] = "";
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, write_model_file(path, base, NULL, 0, err, sizeof err), err);
}

/* The file at path is a model file whose first value is base. */
static void assert_model_file(const char *path, float base) {
    fsdp_st_file *f = NULL;
    char err[1024] = "";
    float v = -1.0f;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_open(&f, path, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_read(f, fsdp_st_find(f, "lin.weight"), 0, 1, &v, err, sizeof err));
    fsdp_st_close(f);
    TEST_ASSERT_EQUAL_FLOAT(base, v);
}

/* ---------------------------------------------------------------------------------------------
   writes: temporary files 0600 while written, final files 0666 less the umask
   --------------------------------------------------------------------------------------------- */
enum { WRITER_ST, WRITER_SAVE_FULL, WRITER_SAVE_SHARDED, WRITER_ATOMIC, NUM_WRITERS };
static const char *const writer_names[NUM_WRITERS] = {"fsdp_st_writer", "fsdp_save_full", "fsdp_save_sharded",
                                                      "fsdp_write_file_atomic"};

/* fsdp_st_writer: the temporary file is in the directory from open to close. */
static void test_st_writer_temporary_file_is_mode_0600_while_written(void) {
    fsdp_st_spec spec;
    fsdp_st_writer *w = NULL;
    char path[256], name[256], tmp[512], err[1024] = "";
    float values[4] = {1, 2, 3, 4};
    mode_t mode;
    umask(022);
    path_in(path, sizeof path, "model.safetensors");
    memset(&spec, 0, sizeof spec);
    spec.name = "w";
    spec.dtype = FSDP_F32;
    spec.ndim = 1;
    spec.shape[0] = 4;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, &spec, 1, NULL, 0, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, values, 2));
    find_entry(tmpdir, "model.safetensors.tmp.", "", name, sizeof name);
    if (!name[0]) fsdp_st_writer_abort(w);
    TEST_ASSERT_TRUE_MESSAGE(name[0] != 0, "no temporary file beside model.safetensors while the writer is open");
    snprintf(tmp, sizeof tmp, "%s/%s", tmpdir, name);
    mode = mode_of(tmp);
    if ((mode & 07777) != 0600 || !S_ISREG(mode)) fsdp_st_writer_abort(w);
    snprintf(message, sizeof message, "%s while written: mode %04o", name, (unsigned)(mode & 07777));
    TEST_ASSERT_EQUAL_HEX32_MESSAGE(0600, mode & 07777, message);
    TEST_ASSERT_TRUE_MESSAGE(S_ISREG(mode), message);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_writer_write_f32(w, values + 2, 2));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(w, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(0, count_entries(tmpdir, ".tmp."));
}

/* The other writers give no moment between creating and renaming: a file size limit stops
   them in the middle of a write, and the SIGXFSZ handler looks at the directory then. */
#define SIZE_LIMIT 256
typedef struct watch_board {
    char dir[256];
    int writer;
    int signals;       /* SIGXFSZ deliveries */
    int temporaries;   /* temporary files seen at those moments */
    unsigned modes[8]; /* their modes */
    char names[8][128];
    int rc;
    char error[1024];
    int stage;         /* what the child reached, for the message */
} watch_board;

static watch_board *watch;

static void look_at_temporaries(int sig) {
    DIR *d = opendir(watch->dir);
    struct dirent *e;
    char path[512];
    struct stat st;
    (void)sig;
    watch->signals++;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.") && watch->temporaries < 8) {
            snprintf(path, sizeof path, "%s/%s", watch->dir, e->d_name);
            if (lstat(path, &st) != 0) continue;
            watch->modes[watch->temporaries] = (unsigned)(st.st_mode & 07777);
            snprintf(watch->names[watch->temporaries], sizeof watch->names[0], "%.120s", e->d_name);
            watch->temporaries++;
        }
    if (d) closedir(d);
}

static int write_beyond_the_limit(void *arg) {
    watch_board *b = (watch_board *)arg;
    static unsigned char data[64 * 1024];
    fsdp_comm *comm = NULL;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    struct rlimit limit;
    char path[512];
    int rc = 0;
    watch = b;
    umask(022);
    signal(SIGXFSZ, look_at_temporaries);
    if (b->writer == WRITER_SAVE_FULL || b->writer == WRITER_SAVE_SHARDED) {
        if ((rc = open_one_rank_comm(&comm, "test-files")) != 0 || (rc = ctx_open(comm, &model, &ctx)) != 0) {
            snprintf(b->error, sizeof b->error, "setup: %s", fsdp_result_name(rc));
            return 1;
        }
    }
    b->stage = 1;
    limit.rlim_cur = limit.rlim_max = SIZE_LIMIT;
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
    b->stage = 2;
    if (b->writer == WRITER_SAVE_SHARDED) snprintf(path, sizeof path, "%s", b->dir); /* the directory */
    else snprintf(path, sizeof path, "%s/out.bin", b->dir);
    switch (b->writer) {
        case WRITER_ST: rc = write_model_file(path, 1.0f, NULL, 0, b->error, sizeof b->error); break;
        case WRITER_SAVE_FULL: rc = fsdp_save_full(ctx, path, NULL); break;
        case WRITER_SAVE_SHARDED: rc = fsdp_save_sharded(ctx, path, NULL); break;
        default: rc = fsdp_write_file_atomic(path, data, sizeof data, b->error, sizeof b->error); break;
    }
    b->stage = 3;
    b->rc = rc;
    if (ctx && rc) snprintf(b->error, sizeof b->error, "%s", fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    fsdp_comm_destroy(comm);
    return 0;
}

static void assert_temporary_is_0600_while_written(int writer) {
    watch_board *b = (watch_board *)map_board(sizeof(watch_board));
    int status, finished, i;
    char where[300];
    snprintf(b->dir, sizeof b->dir, "%s", tmpdir);
    b->writer = writer;
    if (writer == WRITER_SAVE_SHARDED) {
        snprintf(b->dir, sizeof b->dir, "%s/ckpt", tmpdir);
        TEST_ASSERT_EQUAL_INT(0, mkdir(b->dir, 0700));
    }
    finished = run_child(write_beyond_the_limit, b, CHILD_TIMEOUT_MS, &status);
    snprintf(where, sizeof where, "%s (stage %d, %.200s)", writer_names[writer], b->stage, b->error);
    assert_child_ok(finished, status, where);
    snprintf(message, sizeof message, "%s: a write beyond the file size limit succeeded", writer_names[writer]);
    TEST_ASSERT_TRUE_MESSAGE(b->rc != FSDP_SUCCESS, message);
    snprintf(message, sizeof message, "%s: no temporary file in the directory while it was written (%d SIGXFSZ)",
             writer_names[writer], b->signals);
    TEST_ASSERT_TRUE_MESSAGE(b->temporaries > 0, message);
    for (i = 0; i < b->temporaries; i++) {
        snprintf(message, sizeof message, "%s: %s while written: mode %04o", writer_names[writer], b->names[i], b->modes[i]);
        TEST_ASSERT_EQUAL_HEX32_MESSAGE(0600, b->modes[i], message);
    }
    snprintf(message, sizeof message, "%s left a temporary file after failing", writer_names[writer]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, count_entries(b->dir, ".tmp."), message);
}

static void test_save_full_temporary_file_is_mode_0600_while_written(void) {
    assert_temporary_is_0600_while_written(WRITER_SAVE_FULL);
}

static void test_save_sharded_temporary_file_is_mode_0600_while_written(void) {
    assert_temporary_is_0600_while_written(WRITER_SAVE_SHARDED);
}

static void test_write_file_atomic_temporary_file_is_mode_0600_while_written(void) {
    assert_temporary_is_0600_while_written(WRITER_ATOMIC);
}

/* Writes with the given writer under mask; the final files' mode must be 0666 & ~mask. */
static void assert_final_mode(int writer, mode_t mask) {
    char path[256], file[512], name[256], err[1024] = "";
    static const char data[] = "{\"hello\": 1}\n";
    mode_t want = 0666 & ~mask, mode;
    umask(mask);
    switch (writer) {
        case WRITER_ST: path_in(path, sizeof path, "st.safetensors"); write_model_file_ok(path, 1.0f); break;
        case WRITER_SAVE_FULL:
            path_in(path, sizeof path, "full.safetensors");
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_full(ctx1, path, NULL), fsdp_last_error(ctx1));
            break;
        case WRITER_SAVE_SHARDED:
            path_in(path, sizeof path, "sharded");
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx1, path, NULL), fsdp_last_error(ctx1));
            break;
        default:
            path_in(path, sizeof path, "plain.json");
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_write_file_atomic(path, data, sizeof data - 1, err, sizeof err), err);
            break;
    }
    umask(saved_umask);
    if (writer == WRITER_SAVE_SHARDED) {
        snprintf(file, sizeof file, "%s/index.json", path);
        mode = mode_of(file) & 07777;
        snprintf(message, sizeof message, "index.json under umask %03o: mode %04o, expected %04o", (unsigned)mask,
                 (unsigned)mode, (unsigned)want);
        TEST_ASSERT_EQUAL_HEX32_MESSAGE(want, mode, message);
        find_entry(path, "shard-", ".safetensors", name, sizeof name);
        TEST_ASSERT_TRUE_MESSAGE(name[0] != 0, "no shard file");
        snprintf(file, sizeof file, "%s/%s", path, name);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    mode = mode_of(file) & 07777;
    snprintf(message, sizeof message, "%s under umask %03o: %s has mode %04o, expected %04o", writer_names[writer],
             (unsigned)mask, file, (unsigned)mode, (unsigned)want);
    TEST_ASSERT_EQUAL_HEX32_MESSAGE(want, mode, message);
}

/* 022 and 077 give what the old fixed 0644 gave too; 002 tells them apart (0664). */
static void assert_final_modes(int writer) {
    static const mode_t masks[3] = {022, 077, 002};
    int i;
    if (writer == WRITER_SAVE_FULL || writer == WRITER_SAVE_SHARDED) start_one_rank();
    for (i = 0; i < 3; i++) assert_final_mode(writer, masks[i]);
}

static void test_st_writer_final_file_is_0666_less_the_umask(void) { assert_final_modes(WRITER_ST); }
static void test_save_full_final_file_is_0666_less_the_umask(void) { assert_final_modes(WRITER_SAVE_FULL); }
static void test_save_sharded_shard_files_and_index_are_0666_less_the_umask(void) { assert_final_modes(WRITER_SAVE_SHARDED); }
static void test_write_file_atomic_final_file_is_0666_less_the_umask(void) { assert_final_modes(WRITER_ATOMIC); }

/* ---------------------------------------------------------------------------------------------
   writes: symlinks at the final path and at the old temporary name; exclusive creation
   --------------------------------------------------------------------------------------------- */
static const char precious[] = "precious bytes that no checkpoint writer may touch\n";

static void make_victim(char *victim, size_t size) {
    path_in(victim, size, "victim.txt");
    write_file(victim, precious, sizeof precious - 1);
}

static void assert_victim_untouched(const char *victim, const char *what) {
    char now[256];
    size_t n = read_bytes(victim, now, sizeof now);
    snprintf(message, sizeof message, "%s wrote through a symlink: the target now holds %zu bytes", what, n);
    TEST_ASSERT_EQUAL_size_t_MESSAGE(sizeof precious - 1, n, message);
    TEST_ASSERT_EQUAL_STRING_MESSAGE(precious, now, message);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(victim), message);
}

/* The writer for a symlink test: writes path (a file; for WRITER_SAVE_SHARDED a directory). */
static void write_with(int writer, const char *path) {
    char err[1024] = "";
    static const char data[] = "new content\n";
    switch (writer) {
        case WRITER_ST: write_model_file_ok(path, 7.0f); break;
        case WRITER_SAVE_FULL: TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_full(ctx1, path, NULL), fsdp_last_error(ctx1)); break;
        case WRITER_SAVE_SHARDED:
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx1, path, NULL), fsdp_last_error(ctx1));
            break;
        default: TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_write_file_atomic(path, data, sizeof data - 1, err, sizeof err), err);
    }
}

/* A symlink at the final path is replaced by the new file (rename), its target left alone. */
static void assert_symlink_at_final_path_replaced(int writer) {
    char victim[256], path[256];
    make_victim(victim, sizeof victim);
    path_in(path, sizeof path, "latest.out");
    TEST_ASSERT_EQUAL_INT(0, symlink(victim, path));
    write_with(writer, path);
    assert_victim_untouched(victim, writer_names[writer]);
    snprintf(message, sizeof message, "%s: %s is not a regular file after the write", writer_names[writer], path);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(path), message);
    TEST_ASSERT_EQUAL_INT(0, count_entries(tmpdir, ".tmp."));
}

static void test_st_writer_replaces_a_symlink_at_the_final_path_leaving_its_target_untouched(void) {
    assert_symlink_at_final_path_replaced(WRITER_ST);
}

static void test_save_full_replaces_a_symlink_at_the_final_path_leaving_its_target_untouched(void) {
    start_one_rank();
    assert_symlink_at_final_path_replaced(WRITER_SAVE_FULL);
}

static void test_write_file_atomic_replaces_a_symlink_at_the_final_path_leaving_its_target_untouched(void) {
    assert_symlink_at_final_path_replaced(WRITER_ATOMIC);
}

/* A symlink planted under the name the writers used to use ("<path>.tmp.<pid>") is not followed. */
static void assert_planted_old_temporary_not_followed(int writer) {
    char victim[256], path[256], planted[600], written[512];
    make_victim(victim, sizeof victim);
    path_in(path, sizeof path, writer == WRITER_SAVE_SHARDED ? "sharded" : "model.out");
    if (writer == WRITER_SAVE_SHARDED) {
        TEST_ASSERT_EQUAL_INT(0, mkdir(path, 0700));
        snprintf(written, sizeof written, "%s/index.json", path);
    } else {
        snprintf(written, sizeof written, "%s", path);
    }
    snprintf(planted, sizeof planted, "%s.tmp.%d", written, (int)getpid());
    TEST_ASSERT_EQUAL_INT(0, symlink(victim, planted));
    write_with(writer, path);
    assert_victim_untouched(victim, writer_names[writer]);
    snprintf(message, sizeof message, "%s: %s is not a regular file after the write", writer_names[writer], written);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(written), message);
}

static void test_st_writer_does_not_follow_a_symlink_planted_at_the_old_temporary_name(void) {
    assert_planted_old_temporary_not_followed(WRITER_ST);
}

static void test_save_full_does_not_follow_a_symlink_planted_at_the_old_temporary_name(void) {
    start_one_rank();
    assert_planted_old_temporary_not_followed(WRITER_SAVE_FULL);
}

static void test_save_sharded_index_does_not_follow_a_symlink_planted_at_the_old_temporary_name(void) {
    start_one_rank();
    assert_planted_old_temporary_not_followed(WRITER_SAVE_SHARDED);
}

static void test_write_file_atomic_does_not_follow_a_symlink_planted_at_the_old_temporary_name(void) {
    assert_planted_old_temporary_not_followed(WRITER_ATOMIC);
}

/* O_EXCL with a fresh name per writer: two writers of one path in one process each have their
   own temporary file; both succeed, the last rename wins, nothing is left behind. */
static void test_two_st_writers_of_one_path_in_one_process_both_succeed_and_the_last_close_wins(void) {
    fsdp_st_spec spec;
    fsdp_st_writer *first = NULL, *second = NULL;
    char path[256], err[1024] = "";
    float a[2] = {1.0f, 1.0f}, b[2] = {2.0f, 2.0f}, got[2] = {0, 0};
    fsdp_st_file *f = NULL;
    int rc;
    path_in(path, sizeof path, "model.safetensors");
    memset(&spec, 0, sizeof spec);
    spec.name = "w";
    spec.dtype = FSDP_F32;
    spec.ndim = 1;
    spec.shape[0] = 2;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&first, path, &spec, 1, NULL, 0, err, sizeof err), err);
    rc = fsdp_st_writer_open(&second, path, &spec, 1, NULL, 0, err, sizeof err);
    if (rc) fsdp_st_writer_abort(first);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, err);
    TEST_ASSERT_EQUAL_INT(2, count_entries(tmpdir, ".tmp."));
    fsdp_st_writer_write_f32(first, a, 2);
    fsdp_st_writer_write_f32(second, b, 2);
    rc = fsdp_st_writer_close(first, err, sizeof err);
    if (rc) fsdp_st_writer_abort(second);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_close(second, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(0, count_entries(tmpdir, ".tmp."));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_open(&f, path, err, sizeof err), err);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_read(f, 0, 0, 2, got, err, sizeof err));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_st_verify(f, 0, err, sizeof err));
    fsdp_st_close(f);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, got[0]);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, got[1]);
}

/* ---------------------------------------------------------------------------------------------
   writes: a directory that cannot be synced after the rename
   --------------------------------------------------------------------------------------------- */
#define NOBODY 65534 /* the user a root test becomes (whom mode bits bind) */

static int running_as_root(void) { return geteuid() == 0; }

typedef struct unsynced_board {
    char dir[256], path[512], log[512];
    int writer;       /* WRITER_ST or WRITER_ATOMIC */
    int become;       /* uid and gid to switch to first (as root); 0: stay */
    int stage;        /* what the child reached */
    int dir_readable; /* the directory could be opened for reading after all: nothing tested */
    int rc;
    char error[1024];
} unsynced_board;

/* The child: stderr to b->log, FSDP_DEBUG unset (the library's default logger: warnings to
   stderr), becomes b->become, then writes b->path ("new", or a model file of base 2.0). */
static int write_where_the_directory_cannot_be_synced(void *arg) {
    unsynced_board *b = (unsynced_board *)arg;
    int fd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, 2) < 0) return 2;
    if (fd != 2) close(fd);
    unsetenv("FSDP_DEBUG");
    b->stage = 1;
    if (b->become && (setgroups(0, NULL) != 0 || setgid((gid_t)b->become) != 0 || setuid((uid_t)b->become) != 0)) return 3;
    b->stage = 2;
    fd = open(b->dir, O_RDONLY | O_CLOEXEC); /* what the sync of the directory does */
    b->dir_readable = fd >= 0;
    if (fd >= 0) close(fd);
    if (b->writer == WRITER_ATOMIC) b->rc = fsdp_write_file_atomic(b->path, "new", 3, b->error, sizeof b->error);
    else b->rc = write_model_file(b->path, 2.0f, NULL, 0, b->error, sizeof b->error);
    b->stage = 3;
    return 0;
}

/* In a directory of mode 0300 (write and search, no read: its open for the fsync fails with
   EACCES) where the file already exists, the writer replaces it: the result is success, the
   file is the new one, and stderr has a warning that the directory could not be synced. As
   root (whom modes do not bind) the directory is NOBODY's and the child becomes NOBODY. */
static void assert_write_succeeds_where_the_directory_cannot_be_synced(int writer) {
    unsynced_board *b = (unsynced_board *)map_board(sizeof(unsynced_board));
    char content[64], log[2048], where[1400];
    int status, finished, root = running_as_root();
    b->writer = writer;
    path_in(b->dir, sizeof b->dir, "unsyncable");
    snprintf(b->path, sizeof b->path, "%s/%s", b->dir, writer == WRITER_ATOMIC ? "state.json" : "model.safetensors");
    path_in(b->log, sizeof b->log, "stderr.txt");
    TEST_ASSERT_EQUAL_INT(0, mkdir(b->dir, 0700));
    if (writer == WRITER_ATOMIC) write_file(b->path, "old", 3);
    else write_model_file_ok(b->path, 1.0f);
    if (root) {
        b->become = NOBODY;
        TEST_ASSERT_EQUAL_INT(0, chown(b->dir, NOBODY, NOBODY));
        TEST_ASSERT_EQUAL_INT(0, chmod(tmpdir, 0711)); /* NOBODY may pass through */
    }
    TEST_ASSERT_EQUAL_INT(0, chmod(b->dir, 0300));
    finished = run_child(write_where_the_directory_cannot_be_synced, b, CHILD_TIMEOUT_MS, &status);
    chmod(b->dir, 0700); /* before any assertion: tearDown must be able to remove it */
    chmod(tmpdir, 0700);
    snprintf(where, sizeof where, "%s in a directory of mode 0300%s (stage %d, %s \"%.1000s\")", writer_names[writer],
             root ? " of uid 65534, as uid 65534" : "", b->stage, fsdp_result_name(b->rc), b->error);
    assert_child_ok(finished, status, where);
    if (b->dir_readable) TEST_IGNORE_MESSAGE("this process can read a directory of mode 0300 (a capability?): nothing to test");
    read_bytes(b->log, log, sizeof log);
    snprintf(message, sizeof message, "%s; stderr: \"%.2000s\"", where, log);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(log, "could not be synced"), message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(log, strrchr(b->path, '/') + 1), message);
    if (writer == WRITER_ATOMIC) {
        read_bytes(b->path, content, sizeof content);
        TEST_ASSERT_EQUAL_STRING_MESSAGE("new", content, message);
    } else {
        assert_model_file(b->path, 2.0f);
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, count_entries(b->dir, ".tmp."), message);
}

static void test_write_file_atomic_succeeds_warning_where_the_directory_cannot_be_synced(void) {
    assert_write_succeeds_where_the_directory_cannot_be_synced(WRITER_ATOMIC);
}

static void test_st_writer_close_succeeds_warning_where_the_directory_cannot_be_synced(void) {
    assert_write_succeeds_where_the_directory_cannot_be_synced(WRITER_ST);
}

/* ---------------------------------------------------------------------------------------------
   writes: fsdp_save_sharded only into a directory of this user
   --------------------------------------------------------------------------------------------- */
/* fsdp_save_sharded(ctx1, dir) must fail with FSDP_ERR_INVALID_ARG, its error saying why
   (because), and write nothing into target (the directory dir is or leads to). */
static void assert_save_sharded_refuses(const char *dir, const char *target, const char *because) {
    int rc = fsdp_save_sharded(ctx1, dir, NULL), left = count_entries(target, NULL);
    snprintf(message, sizeof message, "fsdp_save_sharded(%s): %s \"%s\"; %d entries in %s", dir, fsdp_result_name(rc),
             fsdp_last_error(ctx1), left, target);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), because), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, left, message);
}

/* Mode 0777: other users could plant files or links where shards go. */
static void test_save_sharded_refuses_a_directory_every_user_can_write_in(void) {
    char dir[256];
    start_one_rank();
    path_in(dir, sizeof dir, "shared");
    TEST_ASSERT_EQUAL_INT(0, mkdir(dir, 0700));
    TEST_ASSERT_EQUAL_INT(0, chmod(dir, 0777));
    assert_save_sharded_refuses(dir, dir, "every user can write in");
}

/* Our directory "ours" and another user's (uid 65534) symbolic link "theirs" to it, their paths
   in target and link. Root only (only root can give a link away). */
static void plant_their_link_to_our_directory(char *target, char *link, size_t size) {
    if (!running_as_root()) TEST_IGNORE_MESSAGE("needs root (lchown of a link to another user)");
    path_in(target, size, "ours");
    path_in(link, size, "theirs");
    TEST_ASSERT_EQUAL_INT(0, mkdir(target, 0755));
    TEST_ASSERT_EQUAL_INT(0, symlink(target, link));
    TEST_ASSERT_EQUAL_INT(0, lchown(link, NOBODY, NOBODY));
}

/* Another user's link to our directory, named link + suffix ("/" or "/." make lstat follow
   it): refused, the directory left empty. */
static void assert_save_sharded_refuses_another_users_link_named(const char *suffix) {
    char target[256], link[256], named[300];
    plant_their_link_to_our_directory(target, link, sizeof target);
    start_one_rank();
    snprintf(named, sizeof named, "%s%s", link, suffix);
    assert_save_sharded_refuses(named, target, "symbolic link of uid 65534");
}

static void test_save_sharded_refuses_a_symbolic_link_of_another_user(void) {
    assert_save_sharded_refuses_another_users_link_named("");
}

/* A directory of another user (uid 65534, mode 0755) that root could write in all the same:
   refused. Root only. */
static void test_save_sharded_refuses_a_directory_of_another_user(void) {
    char dir[256];
    if (!running_as_root()) TEST_IGNORE_MESSAGE("needs root (chown of a directory to another user)");
    start_one_rank();
    path_in(dir, sizeof dir, "theirs");
    TEST_ASSERT_EQUAL_INT(0, mkdir(dir, 0755));
    TEST_ASSERT_EQUAL_INT(0, chmod(dir, 0755));
    TEST_ASSERT_EQUAL_INT(0, chown(dir, NOBODY, NOBODY));
    assert_save_sharded_refuses(dir, dir, "directory of uid 65534");
}

/* Our own symbolic link to our own directory of mode 0755 is fine: the save goes through it. */
static void test_save_sharded_through_our_own_symlink_to_our_own_directory_works(void) {
    char target[256], link[256], index[512];
    fsdp_save_options so;
    start_one_rank();
    path_in(target, sizeof target, "step-100");
    path_in(link, sizeof link, "latest");
    TEST_ASSERT_EQUAL_INT(0, mkdir(target, 0755));
    TEST_ASSERT_EQUAL_INT(0, chmod(target, 0755));
    TEST_ASSERT_EQUAL_INT(0, symlink(target, link));
    memset(&so, 0, sizeof so);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx1, link, &so), fsdp_last_error(ctx1));
    snprintf(index, sizeof index, "%s/index.json", target);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(index), "no index.json in the directory the link points to");
}

static void test_save_sharded_refuses_another_users_link_named_with_a_trailing_slash(void) {
    assert_save_sharded_refuses_another_users_link_named("/");
}

static void test_save_sharded_refuses_another_users_link_named_with_a_trailing_slash_dot(void) {
    assert_save_sharded_refuses_another_users_link_named("/./");
}

/* The hook: repoints the armed link to repoint_to once the save or trace has checked it. */
static void directory_checked(const char *path) {
    char fresh[300];
    if (!repoint_link[0] || strcmp(path, repoint_link) != 0) return;
    snprintf(fresh, sizeof fresh, "%s.new", repoint_link);
    if (symlink(repoint_to, fresh) == 0 && rename(fresh, repoint_link) == 0) repoint_link[0] = 0;
}

/* Our link "latest" to our directory "checked" and our directory "other", their paths in link,
   checked and other (256 bytes each); the hook armed to repoint the link to "other". */
static void arm_a_link_to_repoint(char *link, char *checked, char *other) {
    path_in(checked, 256, "checked");
    path_in(other, 256, "other");
    path_in(link, 256, "latest");
    TEST_ASSERT_EQUAL_INT(0, mkdir(checked, 0755));
    TEST_ASSERT_EQUAL_INT(0, mkdir(other, 0755));
    TEST_ASSERT_EQUAL_INT(0, symlink(checked, link));
    snprintf(repoint_link, sizeof repoint_link, "%s", link);
    snprintf(repoint_to, sizeof repoint_to, "%s", other);
}

/* Our link "latest" to the directory "checked", repointed to "other" right after the save has
   checked it (a racing process can do it there, the hook does it every time): every file of the
   save lands in "checked", and "other" keeps what it had (a shard of an earlier save, which the
   removal of old shards would take). */
static void assert_save_writes_where_it_checked_though_the_link_is_repointed(int async) {
    char checked[256], other[256], link[256], index[512], old_shard[512];
    int rc;
    start_one_rank();
    arm_a_link_to_repoint(link, checked, other);
    snprintf(old_shard, sizeof old_shard, "%s/shard-00000000-00000.safetensors", other);
    write_file(old_shard, "earlier", 7);
    rc = async ? fsdp_save_sharded_async(ctx1, link, NULL) : fsdp_save_sharded(ctx1, link, NULL);
    if (!rc && async) rc = fsdp_save_wait(ctx1);
    snprintf(message, sizeof message, "%s(%s): %s \"%s\"; %d entries in %s", async ? "fsdp_save_sharded_async" :
             "fsdp_save_sharded", link, fsdp_result_name(rc), fsdp_last_error(ctx1), count_entries(other, NULL), other);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    TEST_ASSERT_EQUAL_STRING_MESSAGE("", repoint_link, "the hook did not repoint the link");
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, count_entries(other, NULL), message);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(old_shard), message);
    snprintf(index, sizeof index, "%s/index.json", checked);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(index), "no index.json in the directory that was checked");
}

static void test_save_sharded_through_a_link_repointed_after_the_check_writes_where_it_checked(void) {
    assert_save_writes_where_it_checked_though_the_link_is_repointed(0);
}

static void test_save_sharded_async_through_a_link_repointed_after_the_check_writes_where_it_checked(void) {
    assert_save_writes_where_it_checked_though_the_link_is_repointed(1);
}

/* Two jobs saving into one directory at once: the second fails at once, saying why, and the
   first commits a whole checkpoint (before, the second's removal of old shards took the first's
   file, whose index then named a missing file, or its temporary file, failing it). */
static void test_save_sharded_while_another_job_saves_into_the_same_directory_fails_saying_so(void) {
    char dir[256];
    int rc;
    start_one_rank();
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, open_one_rank_comm(&comm2, "test-files-2"), fsdp_comm_last_error(NULL));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, ctx_open(comm2, &model2, &ctx2), fsdp_last_error(NULL));
    path_in(dir, sizeof dir, "shared-ckpt");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded_async(ctx1, dir, NULL), fsdp_last_error(ctx1));
    rc = fsdp_save_sharded(ctx2, dir, NULL); /* while the first job's save is in flight */
    snprintf(message, sizeof message, "the second job's fsdp_save_sharded(%s): %s \"%s\"", dir, fsdp_result_name(rc),
             fsdp_last_error(ctx2));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(fsdp_last_error(ctx2), "another job is saving"), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_wait(ctx1), fsdp_last_error(ctx1));
    TEST_ASSERT_TRUE_MESSAGE(ckpt_dir_exact(dir, message, sizeof message), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx2, dir, NULL), fsdp_last_error(ctx2)); /* once it ended */
}

/* ---------------------------------------------------------------------------------------------
   traces: made afresh in a directory of this user
   --------------------------------------------------------------------------------------------- */
/* A child's fsdp_init with a trace in b->dir, and fsdp_destroy. */
typedef struct trace_board {
    char dir[256];
    int stage, rc;
    char error[1024];
} trace_board;

static int init_tracing(void *arg) {
    trace_board *b = (trace_board *)arg;
    fsdp_comm *comm = NULL;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    ctx_trace_dir = b->dir;
    b->stage = 1;
    if (open_one_rank_comm(&comm, "test-files-trace") != 0) return 2;
    b->rc = ctx_open(comm, &model, &ctx);
    copy_text(b->error, sizeof b->error, fsdp_last_error(ctx));
    b->stage = 2;
    release_one_rank(&ctx, &model, &comm);
    b->stage = 3;
    return 0;
}

/* A FIFO planted under the trace's name in a directory the group may write in: fsdp_init
   neither blocks on it (an open for writing would wait for a reader for ever) nor fails; the
   trace is a fresh regular file in its place. */
static void test_trace_where_a_fifo_is_planted_under_its_name_neither_blocks_nor_fails(void) {
    trace_board *b = (trace_board *)map_board(sizeof(trace_board));
    char fifo[512], where[1400];
    int status, finished;
    path_in(b->dir, sizeof b->dir, "trace");
    TEST_ASSERT_EQUAL_INT(0, mkdir(b->dir, 0770));
    TEST_ASSERT_EQUAL_INT(0, chmod(b->dir, 0770));
    snprintf(fifo, sizeof fifo, "%s/trace-rank00000.json", b->dir);
    TEST_ASSERT_EQUAL_INT(0, mkfifo(fifo, 0666));
    finished = run_child(init_tracing, b, 10000, &status);
    snprintf(where, sizeof where, "fsdp_init tracing into %s where a FIFO is planted (stage %d, %s \"%.1000s\")", b->dir,
             b->stage, fsdp_result_name(b->rc), b->error);
    assert_child_ok(finished, status, where);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, b->rc, where);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(fifo), where);
}

/* Another user's file planted under the trace's name (uid 65534, mode 0666, in our directory
   that the group may write in): the trace does not go into it; it keeps its bytes, and the
   trace is a file of ours in its place. Root only. */
static void test_trace_where_another_users_file_is_planted_under_its_name_leaves_that_file_untouched(void) {
    char dir[256], planted[512], kept[512], bytes[64];
    struct stat st;
    if (!running_as_root()) TEST_IGNORE_MESSAGE("needs root (chown of a file to another user)");
    path_in(dir, sizeof dir, "trace");
    path_in(kept, sizeof kept, "their-file");
    TEST_ASSERT_EQUAL_INT(0, mkdir(dir, 0770));
    TEST_ASSERT_EQUAL_INT(0, chmod(dir, 0770));
    snprintf(planted, sizeof planted, "%s/trace-rank00000.json", dir);
    write_file(planted, "theirs", 6);
    TEST_ASSERT_EQUAL_INT(0, link(planted, kept)); /* their file, whatever becomes of the name */
    TEST_ASSERT_EQUAL_INT(0, chmod(planted, 0666));
    TEST_ASSERT_EQUAL_INT(0, chown(planted, NOBODY, NOBODY));
    ctx_trace_dir = dir;
    start_one_rank();
    release_one_rank(&ctx1, &model1, &comm1); /* (the trace's end is written) */
    read_bytes(kept, bytes, sizeof bytes);
    TEST_ASSERT_EQUAL_STRING_MESSAGE("theirs", bytes, "the trace went into the other user's file");
    TEST_ASSERT_EQUAL_INT(0, lstat(planted, &st));
    TEST_ASSERT_TRUE(S_ISREG(st.st_mode));
    TEST_ASSERT_EQUAL_INT(geteuid(), st.st_uid);
}

/* Another user's link to our directory, named with a trailing "/": no trace is opened. */
static void test_trace_refuses_another_users_link_named_with_a_trailing_slash(void) {
    char target[256], link[256], named[300];
    int rc;
    plant_their_link_to_our_directory(target, link, sizeof target);
    snprintf(named, sizeof named, "%s/", link);
    ctx_trace_dir = named;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, open_one_rank_comm(&comm1, "test-files"), fsdp_comm_last_error(NULL));
    rc = ctx_open(comm1, &model1, &ctx1);
    snprintf(message, sizeof message, "fsdp_init tracing into %s: %s \"%s\"", named, fsdp_result_name(rc), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(fsdp_last_error(ctx1), "symbolic link of uid 65534"), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, count_entries(target, NULL), message);
}

/* Our link to the trace directory, repointed right after the check: the trace is in the
   directory that was checked. */
static void test_trace_through_a_link_repointed_after_the_check_is_written_where_it_checked(void) {
    char checked[256], other[256], link[256], trace[512];
    arm_a_link_to_repoint(link, checked, other);
    ctx_trace_dir = link;
    start_one_rank();
    TEST_ASSERT_EQUAL_STRING_MESSAGE("", repoint_link, "the hook did not repoint the link");
    snprintf(trace, sizeof trace, "%s/trace-rank00000.json", checked);
    TEST_ASSERT_TRUE_MESSAGE(is_regular_file(trace), "no trace in the directory that was checked");
    TEST_ASSERT_EQUAL_INT(0, count_entries(other, NULL));
}

/* ---------------------------------------------------------------------------------------------
   stale temporary files
   --------------------------------------------------------------------------------------------- */
static void stale_name(char *out, size_t size, const char *path, uint32_t host, long pid) {
    snprintf(out, size, "%s.tmp.%08x-%ld-0123456789abcdef", path, (unsigned)host, pid);
}

/* Plants a temporary file, saves path with fsdp_write_file_atomic, and says whether it is still there. */
static int temporary_survives_a_save(uint32_t host, long pid) {
    char path[256], stale[512], err[1024] = "";
    struct stat st;
    path_in(path, sizeof path, "state.json");
    stale_name(stale, sizeof stale, path, host, pid);
    write_file(stale, "half written", 12);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_write_file_atomic(path, "{}", 2, err, sizeof err), err);
    return lstat(stale, &st) == 0;
}

static void test_save_removes_a_stale_temporary_file_of_this_host_whose_writer_is_dead(void) {
    TEST_ASSERT_FALSE_MESSAGE(temporary_survives_a_save(fsdp__host_id(), (long)dead_pid()),
                              "a temporary file of this host with a dead pid was left behind");
}

/* On a shared file system, another host's pid means nothing here: its file may be live. */
static void test_save_keeps_a_temporary_file_of_another_host(void) {
    TEST_ASSERT_TRUE_MESSAGE(temporary_survives_a_save(fsdp__host_id() ^ 0x5a5a5a5au, (long)dead_pid()),
                             "another host's temporary file was removed");
}

static void test_save_keeps_a_temporary_file_of_this_host_whose_writer_is_alive(void) {
    pid_t writer;
    int status, survived;
    fflush(NULL);
    writer = fork();
    if (writer == 0) {
        alarm(30);
        pause();
        _exit(0);
    }
    TEST_ASSERT_TRUE(writer > 0);
    survived = temporary_survives_a_save(fsdp__host_id(), (long)writer);
    kill(writer, SIGKILL);
    waitpid(writer, &status, 0);
    TEST_ASSERT_TRUE_MESSAGE(survived, "a live writer's temporary file was removed");
}

/* ---------------------------------------------------------------------------------------------
   readers: FIFOs, directories, devices, symlinks, and the bytes of what they point at
   --------------------------------------------------------------------------------------------- */
typedef struct open_board {
    char path[256];
    int which;      /* 0: fsdp_st_open(path); 1: fsdp_index_open(path) */
    int rc;
    int64_t elapsed_ms;
    char error[1024];
} open_board;

static int open_in_child(void *arg) {
    open_board *b = (open_board *)arg;
    double start = now_ms();
    if (b->which == 0) {
        fsdp_st_file *f = NULL;
        b->rc = fsdp_st_open(&f, b->path, b->error, sizeof b->error);
        fsdp_st_close(f);
    } else {
        fsdp_index *ix = NULL;
        b->rc = fsdp_index_open(&ix, b->path, b->error, sizeof b->error);
        fsdp_index_close(ix);
    }
    b->elapsed_ms = (int64_t)(now_ms() - start);
    return 0;
}

/* Opens a FIFO in a child bounded at 2 s: it must fail, within FIFO_DEADLINE_MS. */
static void assert_fifo_refused_at_once(int which, const char *dir_or_file, const char *fifo) {
    open_board *b = (open_board *)map_board(sizeof(open_board));
    int status, finished;
    TEST_ASSERT_EQUAL_INT(0, mkfifo(fifo, 0600));
    snprintf(b->path, sizeof b->path, "%s", dir_or_file);
    b->which = which;
    finished = run_child(open_in_child, b, 2000, &status);
    TEST_ASSERT_TRUE_MESSAGE(finished, "the open of a FIFO was still blocked after 2 s (the child was killed)");
    assert_child_ok(finished, status, "open of a FIFO");
    snprintf(message, sizeof message, "rc %s after %lld ms: \"%s\"", fsdp_result_name(b->rc), (long long)b->elapsed_ms, b->error);
    TEST_ASSERT_TRUE_MESSAGE(b->rc != FSDP_SUCCESS, message);
    TEST_ASSERT_TRUE_MESSAGE(b->elapsed_ms < FIFO_DEADLINE_MS, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->error, fifo), message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->error, "not a regular file"), message);
}

static void test_st_open_of_a_fifo_fails_within_100_ms(void) {
    char fifo[256];
    path_in(fifo, sizeof fifo, "model.safetensors");
    assert_fifo_refused_at_once(0, fifo, fifo);
}

static void test_index_open_where_index_json_is_a_fifo_fails_within_100_ms(void) {
    char fifo[256];
    path_in(fifo, sizeof fifo, "index.json");
    assert_fifo_refused_at_once(1, tmpdir, fifo);
}

static void assert_st_open_refuses_non_regular(const char *path) {
    fsdp_st_file *f = NULL;
    char err[1024] = "";
    int rc = fsdp_st_open(&f, path, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_st_open(%s): %s \"%s\"", path, fsdp_result_name(rc), err);
    if (rc == FSDP_SUCCESS) fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_IO, rc, message);
    TEST_ASSERT_NULL_MESSAGE(f, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, path), message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "not a regular file"), message);
}

static void test_st_open_of_a_directory_is_refused_as_not_a_regular_file(void) { assert_st_open_refuses_non_regular(tmpdir); }

static void test_st_open_of_a_device_is_refused_as_not_a_regular_file(void) { assert_st_open_refuses_non_regular("/dev/null"); }

/* A sharded checkpoint of the one-rank context in tmpdir/<name>; its shard file's path. */
static void save_sharded_checkpoint(const char *name, char *dir, size_t dir_size, char *shard, size_t shard_size) {
    char file[256];
    path_in(dir, dir_size, name);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_save_sharded(ctx1, dir, NULL), fsdp_last_error(ctx1));
    find_entry(dir, "shard-", ".safetensors", file, sizeof file);
    TEST_ASSERT_TRUE_MESSAGE(file[0] != 0, "no shard file in the sharded checkpoint");
    snprintf(shard, shard_size, "%s/%s", dir, file);
}

/* index.json replaced by a symlink to a valid copy elsewhere: refused, naming the link. */
static void test_index_open_where_index_json_is_a_symlink_fails_naming_the_link(void) {
    char dir[256], shard[512], index[512], elsewhere[256], err[1024] = "";
    fsdp_index *ix = NULL;
    int rc;
    start_one_rank();
    save_sharded_checkpoint("ckpt", dir, sizeof dir, shard, sizeof shard);
    snprintf(index, sizeof index, "%s/index.json", dir);
    path_in(elsewhere, sizeof elsewhere, "elsewhere.json");
    TEST_ASSERT_EQUAL_INT(0, rename(index, elsewhere));
    TEST_ASSERT_EQUAL_INT(0, symlink(elsewhere, index));
    rc = fsdp_index_open(&ix, dir, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_index_open: %s \"%s\"", fsdp_result_name(rc), err);
    if (rc == FSDP_SUCCESS) fsdp_index_close(ix);
    TEST_ASSERT_TRUE_MESSAGE(rc != FSDP_SUCCESS, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, index), message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "symbolic link"), message);
}

/* A shard file replaced by a symlink to a byte-identical copy: the load must refuse it. */
static void make_shard_a_symlink(char *dir, size_t dir_size) {
    char shard[512], copy[256];
    save_sharded_checkpoint("ckpt", dir, dir_size, shard, sizeof shard);
    path_in(copy, sizeof copy, "copy.safetensors");
    copy_file(shard, copy);
    TEST_ASSERT_EQUAL_INT(0, unlink(shard));
    TEST_ASSERT_EQUAL_INT(0, symlink(copy, shard));
}

static void test_load_sharded_where_a_shard_file_is_a_symlink_fails_naming_a_symbolic_link(void) {
    char dir[256];
    int rc;
    start_one_rank();
    make_shard_a_symlink(dir, sizeof dir);
    rc = fsdp_load_sharded(ctx1, dir, NULL, NULL);
    snprintf(message, sizeof message, "fsdp_load_sharded: %s \"%s\"", fsdp_result_name(rc), fsdp_last_error(ctx1));
    TEST_ASSERT_TRUE_MESSAGE(rc != FSDP_SUCCESS, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), "symbolic link"), message);
}

static void test_index_open_file_of_a_shard_that_is_a_symlink_fails_naming_a_symbolic_link(void) {
    char dir[256], err[1024] = "";
    fsdp_index *ix = NULL;
    fsdp_st_file *f = NULL;
    int rc;
    start_one_rank();
    make_shard_a_symlink(dir, sizeof dir);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_index_open(&ix, dir, err, sizeof err), err);
    rc = fsdp_index_open_file(ix, dir, 0, &f, err, sizeof err);
    fsdp_index_close(ix);
    snprintf(message, sizeof message, "fsdp_index_open_file: %s \"%s\"", fsdp_result_name(rc), err);
    if (rc == FSDP_SUCCESS) fsdp_st_close(f);
    TEST_ASSERT_TRUE_MESSAGE(rc != FSDP_SUCCESS, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "symbolic link"), message);
}

/* Documented: a symlink the user made (latest.safetensors -> step-100.safetensors) opens. */
static void test_st_open_of_a_users_symlink_to_a_checkpoint_works(void) {
    char target[256], link[256];
    path_in(target, sizeof target, "step-100.safetensors");
    path_in(link, sizeof link, "latest.safetensors");
    write_model_file_ok(target, 3.0f);
    TEST_ASSERT_EQUAL_INT(0, symlink(target, link));
    assert_model_file(link, 3.0f);
}

/* A link to a file that is not a checkpoint (a password file, say): the error must not show
   its first 8 bytes, neither as text nor as the header length they make. */
static const char secret_bytes[] = "SECRET!!and the rest of the password file\n";

static void assert_message_hides_the_secret(const char *err) {
    uint64_t value = 0;
    char decimal[32], hex[32], hex_upper[32];
    int i;
    for (i = 7; i >= 0; i--) value = (value << 8) | (unsigned char)secret_bytes[i];
    snprintf(decimal, sizeof decimal, "%llu", (unsigned long long)value);
    snprintf(hex, sizeof hex, "%llx", (unsigned long long)value);
    snprintf(hex_upper, sizeof hex_upper, "%llX", (unsigned long long)value);
    snprintf(message, sizeof message, "the message shows the file's first bytes: \"%s\"", err);
    TEST_ASSERT_NULL_MESSAGE(strstr(err, "SECRET"), message);
    TEST_ASSERT_NULL_MESSAGE(strstr(err, decimal), message);
    TEST_ASSERT_NULL_MESSAGE(strstr(err, hex), message);
    TEST_ASSERT_NULL_MESSAGE(strstr(err, hex_upper), message);
}

static void test_st_open_of_a_symlink_to_a_non_checkpoint_does_not_show_its_first_bytes(void) {
    char secret[256], link[256], err[1024] = "";
    fsdp_st_file *f = NULL;
    int rc;
    path_in(secret, sizeof secret, "secret.txt");
    path_in(link, sizeof link, "model.safetensors");
    write_file(secret, secret_bytes, sizeof secret_bytes - 1);
    TEST_ASSERT_EQUAL_INT(0, symlink(secret, link));
    rc = fsdp_st_open(&f, link, err, sizeof err);
    if (rc == FSDP_SUCCESS) fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, err);
    assert_message_hides_the_secret(err);
}

static void test_load_sharded_of_a_shard_symlinked_to_a_non_checkpoint_does_not_show_its_first_bytes(void) {
    char dir[256], shard[512], secret[256];
    start_one_rank();
    save_sharded_checkpoint("ckpt", dir, sizeof dir, shard, sizeof shard);
    path_in(secret, sizeof secret, "secret.txt");
    write_file(secret, secret_bytes, sizeof secret_bytes - 1);
    TEST_ASSERT_EQUAL_INT(0, unlink(shard));
    TEST_ASSERT_EQUAL_INT(0, symlink(secret, shard));
    TEST_ASSERT_TRUE(fsdp_load_sharded(ctx1, dir, NULL, NULL) != FSDP_SUCCESS);
    assert_message_hides_the_secret(fsdp_last_error(ctx1));
}

/* ---------------------------------------------------------------------------------------------
   JSON: peak allocation of a parse against the input's size
   --------------------------------------------------------------------------------------------- */
static void text_add(const char *s) {
    size_t n = strlen(s);
    if (text_len + n + 1 > text_cap) {
        size_t cap = text_cap ? text_cap * 2 : (1u << 20);
        char *grown;
        while (cap < text_len + n + 1) cap *= 2;
        grown = (char *)realloc(text, cap);
        TEST_ASSERT_NOT_NULL(grown);
        text = grown;
        text_cap = cap;
    }
    memcpy(text + text_len, s, n + 1);
    text_len += n;
}

static void text_reset(void) {
    text_len = 0;
    if (text) text[0] = 0;
}

/* Appends repeat(i) for i = 0, 1, ... while the text is shorter than JSON_INPUT_BYTES. */
static void text_repeat(void (*repeat)(int i)) {
    int i;
    for (i = 0; text_len < JSON_INPUT_BYTES; i++) repeat(i);
}

typedef struct parse_cost {
    int rc;
    double ratio;      /* peak allocated bytes during the parse / input bytes */
    char error[256];
} parse_cost;

static parse_cost measure_st_parse(void) {
    parse_cost cost;
    unsigned char *image = (unsigned char *)malloc(text_len + 8);
    fsdp_st_file *f = NULL;
    size_t base, i;
    TEST_ASSERT_NOT_NULL(image);
    for (i = 0; i < 8; i++) image[i] = (unsigned char)((uint64_t)text_len >> (8 * i));
    memcpy(image + 8, text, text_len);
    cost.error[0] = 0;
    base = __atomic_load_n(&alloc_current, __ATOMIC_RELAXED);
    __atomic_store_n(&alloc_peak, base, __ATOMIC_RELAXED);
    cost.rc = fsdp_st_parse(&f, image, text_len + 8, cost.error, sizeof cost.error);
    cost.ratio = (double)(__atomic_load_n(&alloc_peak, __ATOMIC_RELAXED) - base) / (double)(text_len + 8);
    fsdp_st_close(f);
    free(image);
    return cost;
}

static parse_cost measure_index_parse(void) {
    parse_cost cost;
    fsdp_index *ix = NULL;
    size_t base;
    cost.error[0] = 0;
    base = __atomic_load_n(&alloc_current, __ATOMIC_RELAXED);
    __atomic_store_n(&alloc_peak, base, __ATOMIC_RELAXED);
    cost.rc = fsdp_index_parse(&ix, text, text_len, cost.error, sizeof cost.error);
    cost.ratio = (double)(__atomic_load_n(&alloc_peak, __ATOMIC_RELAXED) - base) / (double)text_len;
    fsdp_index_close(ix);
    return cost;
}

/* Reports the ratio (TEST_MESSAGE, for the notes) and checks it against JSON_MAX_RATIO. */
static void assert_parse_bounded(const char *what, parse_cost cost, int must_succeed) {
    snprintf(message, sizeof message, "%s: %.2f MB, peak allocation %.3fx the input, %s%s%s", what,
             (double)text_len / 1e6, cost.ratio, fsdp_result_name(cost.rc), cost.error[0] ? ": " : "", cost.error);
    TEST_MESSAGE(message);
    if (must_succeed) TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, cost.rc, message);
    TEST_ASSERT_TRUE_MESSAGE(cost.ratio <= JSON_MAX_RATIO, message);
}

static void tiny_metadata_entry(int i) {
    char entry[32];
    snprintf(entry, sizeof entry, ",\"%x\":\"\"", i);
    text_add(entry);
}
static void anonymous_metadata_entry(int i) { (void)i; text_add(",\"\":\"\""); }
static void tiny_tensor_entry(int i) {
    char entry[96];
    snprintf(entry, sizeof entry, "%s\"%x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", i ? "," : "", i);
    text_add(entry);
}
static void zero_entry(int i) { text_add(i ? ",0" : "0"); }
static void non_object_tensor_entry(int i) { text_add(i ? ",\"a\":0" : "\"a\":0"); }
static void non_string_metadata(int i) { text_add(i ? ",\"\":0" : "\"\":0"); }
static void empty_object_tensor_entry(int i) { text_add(i ? ",\"a\":{}" : "\"a\":{}"); }

/* The brief's shape: one real tensor with a huge ignored key, then metadata with thousands of
   tiny entries. */
static void test_st_parse_of_a_10mb_header_with_a_huge_ignored_key_peaks_under_4x_the_input(void) {
    text_reset();
    text_add("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":[");
    text_repeat(zero_entry);
    text_add("]},\"__metadata__\":{\"format\":\"pt\"");
    { int i; for (i = 0; i < 5000; i++) tiny_metadata_entry(i); }
    text_add("}}");
    assert_parse_bounded("safetensors, one tensor with a huge ignored key and 5000 metadata entries", measure_st_parse(), 1);
}

static void test_st_parse_of_a_10mb_header_of_tiny_metadata_entries_peaks_under_4x_the_input(void) {
    text_reset();
    text_add("{\"__metadata__\":{\"format\":\"pt\"");
    text_repeat(anonymous_metadata_entry);
    text_add("}}");
    assert_parse_bounded("safetensors, metadata of tiny entries (\"\":\"\")", measure_st_parse(), 1);
}

static void test_st_parse_of_a_10mb_header_of_tiny_tensors_peaks_under_4x_the_input(void) {
    text_reset();
    text_add("{");
    text_repeat(tiny_tensor_entry);
    text_add("}");
    assert_parse_bounded("safetensors, tiny empty tensors", measure_st_parse(), 1);
}

/* Entries that the parser rejects once it looks at them still must not be counted into tables
   before then: "a":0 is 6 bytes, a table entry ~120. */
static void test_st_parse_of_a_10mb_header_of_tensor_entries_that_are_not_objects_peaks_under_4x_the_input(void) {
    text_reset();
    text_add("{");
    text_repeat(non_object_tensor_entry);
    text_add("}");
    assert_parse_bounded("safetensors, tensor entries that are not objects (\"a\":0)", measure_st_parse(), 0);
}

static void test_st_parse_of_a_10mb_header_of_empty_tensor_objects_peaks_under_4x_the_input(void) {
    text_reset();
    text_add("{");
    text_repeat(empty_object_tensor_entry);
    text_add("}");
    assert_parse_bounded("safetensors, empty tensor objects (\"a\":{})", measure_st_parse(), 0);
}

static void test_st_parse_of_a_10mb_header_of_metadata_that_are_not_strings_peaks_under_4x_the_input(void) {
    text_reset();
    text_add("{\"__metadata__\":{");
    text_repeat(non_string_metadata);
    text_add("}}");
    assert_parse_bounded("safetensors, metadata values that are not strings (\"\":0)", measure_st_parse(), 0);
}

#define INDEX_HEAD "{\"format\":\"fsdp.h-sharded\",\"version\":1,\"world_size\":1,\"step\":0,\"epoch\":0,"

static int pieces_written;
static void covering_piece(int i) {
    char piece[48];
    snprintf(piece, sizeof piece, "%s[0,%d,%d]", i ? "," : "", i, i + 1);
    text_add(piece);
    pieces_written = i + 1;
}
static void shortest_piece(int i) { text_add(i ? ",[0,0,1]" : "[0,0,1]"); }
static void tiny_index_tensor(int i) {
    char entry[96];
    snprintf(entry, sizeof entry, "%s\"%x\":{\"dtype\":\"F32\",\"shape\":[1],\"pieces\":[[0,0,1]]}", i ? "," : "", i);
    text_add(entry);
}
static void anonymous_index_metadata(int i) { text_add(i ? ",\"\":\"\"" : "\"\":\"\""); }

/* [0,0,1],[0,1,2],...: a valid index of one tensor in a million pieces. */
static void test_index_parse_of_a_10mb_index_of_tiny_pieces_peaks_under_4x_the_input(void) {
    char shape[16];
    text_reset();
    text_add(INDEX_HEAD "\"metadata\":{},\"files\":[\"shard-0.safetensors\"],\"tensors\":{\"t\":{\"dtype\":\"F32\",\"shape\":[");
    {   /* the shape must be the number of pieces: build the pieces first, then patch it in */
        size_t head = text_len;
        text_add("          ],\"pieces\":[");
        text_repeat(covering_piece);
        snprintf(shape, sizeof shape, "%10d", pieces_written);
        memcpy(text + head, shape, 10);
    }
    text_add("]}}}");
    assert_parse_bounded("index.json, one tensor in pieces [0,k,k+1]", measure_index_parse(), 1);
}

/* The shortest well-formed piece, 8 bytes for a 24-byte table entry: the worst case of a
   well-typed index (rejected after parsing: the pieces overlap). */
static void test_index_parse_of_a_10mb_index_of_the_shortest_pieces_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"pieces\":[");
    text_repeat(shortest_piece);
    text_add("]}}}");
    assert_parse_bounded("index.json, pieces [0,0,1] repeated", measure_index_parse(), 0);
}

static void test_index_parse_of_a_10mb_index_of_tiny_tensors_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{");
    text_repeat(tiny_index_tensor);
    text_add("}}");
    assert_parse_bounded("index.json, tiny tensors of one piece", measure_index_parse(), 1);
}

static void test_index_parse_of_a_10mb_index_of_tiny_metadata_entries_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{},\"metadata\":{");
    text_repeat(anonymous_index_metadata);
    text_add("}}");
    assert_parse_bounded("index.json, metadata of tiny entries (\"\":\"\")", measure_index_parse(), 1);
}

/* Elements of the wrong type, rejected once looked at, must not be counted into tables first. */
static void test_index_parse_of_a_10mb_index_of_pieces_that_are_not_arrays_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"pieces\":[");
    text_repeat(zero_entry);
    text_add("]}}}");
    assert_parse_bounded("index.json, pieces that are not arrays (0,0,0,...)", measure_index_parse(), 0);
}

static void test_index_parse_of_a_10mb_index_of_tensor_entries_that_are_not_objects_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{");
    text_repeat(non_object_tensor_entry);
    text_add("}}");
    assert_parse_bounded("index.json, tensor entries that are not objects (\"a\":0)", measure_index_parse(), 0);
}

static void test_index_parse_of_a_10mb_index_of_metadata_that_are_not_strings_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{},\"metadata\":{");
    text_repeat(non_string_metadata);
    text_add("}}");
    assert_parse_bounded("index.json, metadata values that are not strings (\"\":0)", measure_index_parse(), 0);
}

static void test_index_parse_of_a_10mb_index_of_file_entries_that_are_not_strings_peaks_under_4x_the_input(void) {
    text_reset();
    text_add(INDEX_HEAD "\"tensors\":{},\"files\":[");
    text_repeat(zero_entry);
    text_add("]}");
    assert_parse_bounded("index.json, file entries that are not strings (0,0,0,...)", measure_index_parse(), 0);
}

/* The control: real files parse, and cost little. */
static void test_st_parse_and_index_parse_of_a_real_checkpoint_succeed(void) {
    char dir[256], shard[512], index[512];
    static char bytes[1 << 16];
    size_t n;
    parse_cost cost;
    start_one_rank();
    save_sharded_checkpoint("ckpt", dir, sizeof dir, shard, sizeof shard);
    snprintf(index, sizeof index, "%s/index.json", dir);
    text_reset();
    n = read_bytes(index, bytes, sizeof bytes);
    TEST_ASSERT_TRUE(n > 0 && n < sizeof bytes - 1);
    text_add(bytes);
    cost = measure_index_parse();
    snprintf(message, sizeof message, "index.json of a real save: %s %s, %.2fx", fsdp_result_name(cost.rc), cost.error, cost.ratio);
    TEST_MESSAGE(message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, cost.rc, message);
    {
        fsdp_st_file *f = NULL;
        FILE *in = fopen(shard, "rb");
        char err[1024] = "";
        TEST_ASSERT_NOT_NULL(in);
        n = fread(bytes, 1, sizeof bytes, in);
        fclose(in);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_parse(&f, bytes, n, err, sizeof err), err);
        TEST_ASSERT_EQUAL_INT(2, fsdp_st_num_tensors(f));
        fsdp_st_close(f);
    }
}

/* ---------------------------------------------------------------------------------------------
   printable output
   --------------------------------------------------------------------------------------------- */
#define CANARY 0xA5

/* fsdp_printable into a buffer of `size` inside a larger one; the bytes after it must stay. */
static const char *printable(size_t size, const char *src) {
    static unsigned char area[512];
    size_t i;
    const char *r;
    TEST_ASSERT_TRUE(size + 64 <= sizeof area);
    memset(area, CANARY, sizeof area);
    r = fsdp_printable((char *)area, size, src);
    TEST_ASSERT_EQUAL_PTR(area, r);
    for (i = size; i < sizeof area; i++) {
        snprintf(message, sizeof message, "fsdp_printable(size %zu) wrote byte %zu", size, i);
        TEST_ASSERT_EQUAL_HEX8_MESSAGE(CANARY, area[i], message);
    }
    return (const char *)area;
}

static void test_printable_ascii_passes_unchanged(void) {
    TEST_ASSERT_EQUAL_STRING("layers.0.weight [7,5] ~!@#$%^&*()_+{}|:<>?", printable(128, "layers.0.weight [7,5] ~!@#$%^&*()_+{}|:<>?"));
    TEST_ASSERT_EQUAL_STRING("", printable(128, ""));
    TEST_ASSERT_EQUAL_STRING("", printable(128, NULL));
}

static void test_printable_well_formed_utf8_passes_unchanged(void) {
    TEST_ASSERT_EQUAL_STRING("caf\xc3\xa9", printable(128, "caf\xc3\xa9"));                  /* café */
    TEST_ASSERT_EQUAL_STRING("\xe5\x90\x8d\xe5\x89\x8d", printable(128, "\xe5\x90\x8d\xe5\x89\x8d")); /* 3 bytes each */
    TEST_ASSERT_EQUAL_STRING("\xf0\x9f\x98\x80", printable(128, "\xf0\x9f\x98\x80"));        /* U+1F600, 4 bytes */
    TEST_ASSERT_EQUAL_STRING("\xc2\xa0", printable(128, "\xc2\xa0"));                        /* U+00A0: first after C1 */
}

static void test_printable_escape_bell_and_other_ascii_controls_become_hex(void) {
    TEST_ASSERT_EQUAL_STRING("\\x1b]0;owned\\x07", printable(128, "\x1b]0;owned\x07"));
    TEST_ASSERT_EQUAL_STRING("\\x1b[2J\\x0d\\x0a\\x09\\x7f", printable(128, "\x1b[2J\r\n\t\x7f"));
}

static void test_printable_c1_controls_encoded_as_c2_80_to_9f_become_hex(void) {
    TEST_ASSERT_EQUAL_STRING("\\xc2\\x80", printable(128, "\xc2\x80"));
    TEST_ASSERT_EQUAL_STRING("\\xc2\\x9b2J", printable(128, "\xc2\x9b" "2J")); /* CSI: ESC [ in one character */
    TEST_ASSERT_EQUAL_STRING("\\xc2\\x9d0;x\\xc2\\x9c", printable(128, "\xc2\x9d" "0;x\xc2\x9c")); /* OSC ... ST */
    TEST_ASSERT_EQUAL_STRING("\\xc2\\x9f", printable(128, "\xc2\x9f"));
}

static void test_printable_broken_utf8_becomes_hex(void) {
    TEST_ASSERT_EQUAL_STRING("\\x80a", printable(128, "\x80" "a"));            /* lone continuation */
    TEST_ASSERT_EQUAL_STRING("a\\xc3", printable(128, "a\xc3"));                /* cut at the end */
    TEST_ASSERT_EQUAL_STRING("\\xe2\\x82x", printable(128, "\xe2\x82" "x"));    /* cut in the middle */
    TEST_ASSERT_EQUAL_STRING("\\xff\\xfe", printable(128, "\xff\xfe"));         /* never in UTF-8 */
    TEST_ASSERT_EQUAL_STRING("\\xf5\\x80\\x80\\x80", printable(128, "\xf5\x80\x80\x80")); /* beyond U+10FFFF */
    TEST_ASSERT_EQUAL_STRING("\\xf4\\x90\\x80\\x80", printable(128, "\xf4\x90\x80\x80")); /* U+110000 */
    TEST_ASSERT_EQUAL_STRING("\\xed\\xa0\\x80", printable(128, "\xed\xa0\x80")); /* a surrogate */
}

/* Issue 26 (review): characters that change how the text around them shows are escaped like
   controls: bidirectional marks, embeddings, overrides and isolates reorder what follows (a
   name "a<RLO>gpj.exe" reads "aexe.jpg"), line and paragraph separators start a fake line in
   some viewers, and a byte order mark hides. Neighbours that are ordinary letters pass. */
static void test_printable_bidi_controls_and_line_separators_become_hex(void) {
    TEST_ASSERT_EQUAL_STRING("a\\xe2\\x80\\xaegpj.exe", printable(64, "a\xe2\x80\xaegpj.exe"));      /* U+202E */
    TEST_ASSERT_EQUAL_STRING("x\\xe2\\x80\\xa8y", printable(64, "x\xe2\x80\xa8y"));                   /* U+2028 */
    TEST_ASSERT_EQUAL_STRING("\\xe2\\x80\\xa9", printable(64, "\xe2\x80\xa9"));                        /* U+2029 */
    TEST_ASSERT_EQUAL_STRING("\\xe2\\x80\\x8e\\xe2\\x80\\x8f", printable(64, "\xe2\x80\x8e\xe2\x80\x8f")); /* LRM, RLM */
    TEST_ASSERT_EQUAL_STRING("\\xe2\\x81\\xa6\\xe2\\x81\\xa9", printable(64, "\xe2\x81\xa6\xe2\x81\xa9")); /* LRI, PDI */
    TEST_ASSERT_EQUAL_STRING("\\xd8\\x9c", printable(64, "\xd8\x9c"));                                   /* U+061C */
    TEST_ASSERT_EQUAL_STRING("\\xef\\xbb\\xbf", printable(64, "\xef\xbb\xbf"));                        /* U+FEFF */
    /* neighbours pass: U+2027, U+202F, U+2065 (unassigned but not a control), U+FEFE, U+061B */
    TEST_ASSERT_EQUAL_STRING("\xe2\x80\xa7\xe2\x80\xaf\xe2\x81\xa5\xef\xbb\xbe\xd8\x9b",
                             printable(64, "\xe2\x80\xa7\xe2\x80\xaf\xe2\x81\xa5\xef\xbb\xbe\xd8\x9b"));
}

static void test_printable_overlong_encodings_become_hex(void) {
    TEST_ASSERT_EQUAL_STRING("\\xc0\\xaf", printable(128, "\xc0\xaf"));             /* '/' in 2 bytes */
    TEST_ASSERT_EQUAL_STRING("\\xc1\\x9b", printable(128, "\xc1\x9b"));             /* ESC [ in 2 bytes */
    TEST_ASSERT_EQUAL_STRING("\\xe0\\x80\\x9b", printable(128, "\xe0\x80\x9b"));     /* ESC in 3 bytes */
    TEST_ASSERT_EQUAL_STRING("\\xf0\\x80\\x80\\x9b", printable(128, "\xf0\x80\x80\x9b")); /* ESC in 4 bytes */
}

static void test_printable_truncation_ends_with_dots_at_a_character_boundary(void) {
    TEST_ASSERT_EQUAL_STRING("abcdefghij", printable(11, "abcdefghij")); /* fits exactly: no dots */
    TEST_ASSERT_EQUAL_STRING("abcd...", printable(8, "abcdefghij"));
    TEST_ASSERT_EQUAL_STRING("\xc3\xa9\xc3\xa9...", printable(8, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9")); /* never half an é */
    TEST_ASSERT_EQUAL_STRING("\xc3\xa9...", printable(7, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"));
    TEST_ASSERT_EQUAL_STRING("\\x1b...", printable(8, "\x1b\x1b\x1b"));   /* never half an escape */
    TEST_ASSERT_EQUAL_STRING("...", printable(7, "\x1b\x1b\x1b"));
    TEST_ASSERT_EQUAL_STRING("...", printable(4, "abcdef"));
}

static void test_printable_sizes_0_to_3_never_overflow(void) {
    unsigned char before;
    const char *r = printable(0, "abcdef"); /* size 0: nothing written (the canary checks) */
    before = (unsigned char)r[0];
    TEST_ASSERT_EQUAL_HEX8(CANARY, before);
    TEST_ASSERT_EQUAL_STRING("", printable(1, "abcdef"));
    TEST_ASSERT_EQUAL_STRING("a", printable(2, "abcdef"));
    TEST_ASSERT_EQUAL_STRING("ab", printable(3, "abcdef"));
    TEST_ASSERT_EQUAL_STRING("", printable(2, "\xc3\xa9"));   /* é needs 3 with its NUL */
    TEST_ASSERT_EQUAL_STRING("\xc3\xa9", printable(3, "\xc3\xa9"));
    TEST_ASSERT_EQUAL_STRING("", printable(3, "\x1b"));       /* \x1b needs 5 */
    TEST_ASSERT_EQUAL_STRING("", printable(1, ""));
}

/* A checkpoint with an extra tensor named with a terminal escape sequence (JSON "\u001b" in the
   header), loaded strictly: the error names it escaped, on_problem gets it raw. */
static const char evil_name[] = "evil\x1b]0;owned\x07";
static const char evil_shown[] = "evil\\x1b]0;owned\\x07";

typedef struct problem_calls {
    int calls;
    char name[128];
    char kind[32];
} problem_calls;

static void record_problem(void *user, const char *kind, const char *name, const char *detail) {
    problem_calls *p = (problem_calls *)user;
    (void)detail;
    if (p->calls++ == 0) {
        snprintf(p->kind, sizeof p->kind, "%s", kind);
        snprintf(p->name, sizeof p->name, "%s", name);
    }
}

static void assert_no_control_bytes(const char *text, const char *what) {
    const char *c;
    for (c = text; *c; c++) {
        snprintf(message, sizeof message, "%s holds the control byte 0x%02x at %d: \"%s\"", what, (unsigned char)*c,
                 (int)(c - text), text);
        TEST_ASSERT_TRUE_MESSAGE((unsigned char)*c >= 0x20 && (unsigned char)*c != 0x7f, message);
    }
}

static void test_load_full_of_an_unexpected_tensor_named_with_an_escape_sequence_shows_it_escaped(void) {
    const char *extra[1] = {evil_name};
    char path[256], err[1024] = "";
    fsdp_load_options lo;
    problem_calls calls;
    int rc;
    start_one_rank();
    path_in(path, sizeof path, "evil.safetensors");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, write_model_file(path, 1.0f, extra, 1, err, sizeof err), err);
    memset(&lo, 0, sizeof lo);
    memset(&calls, 0, sizeof calls);
    lo.strict = 1;
    lo.on_problem = record_problem;
    lo.user = &calls;
    rc = fsdp_load_full(ctx1, path, &lo, NULL);
    snprintf(message, sizeof message, "%s: \"%s\"", fsdp_result_name(rc), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INCOMPATIBLE, rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), evil_shown), message);
    assert_no_control_bytes(fsdp_last_error(ctx1), "the load's error");
    TEST_ASSERT_EQUAL_INT(1, calls.calls);
    TEST_ASSERT_EQUAL_STRING("unexpected", calls.kind);
    TEST_ASSERT_EQUAL_STRING_MESSAGE(evil_name, calls.name, "on_problem must get the name as the file has it");
}

/* Non-strict, the load succeeds and warns listing what it did not load: escaped too. */
static char captured_log[4096];

static void capture_log(void *user, fsdp_log_level level, const char *text) {
    size_t used = strlen(captured_log);
    (void)user;
    (void)level;
    snprintf(captured_log + used, sizeof captured_log - used, "%s\n", text);
}

/* The one-rank context, its warnings going to captured_log. */
static void start_one_rank_capturing_warnings(void) {
    captured_log[0] = 0;
    ctx_logger.fn = capture_log;
    ctx_logger.max_level = FSDP_LOG_WARN;
    start_one_rank();
}

/* A non-strict load that warned about something the file named with evil_name's escapes: it
   succeeded, and the warning shows the name escaped, no ESC or BEL. */
static void assert_load_warned_escaped(int rc) {
    snprintf(message, sizeof message, "%s: \"%.1000s\"; log: \"%.2000s\"", fsdp_result_name(rc), fsdp_last_error(ctx1), captured_log);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(captured_log, evil_shown), message);
    TEST_ASSERT_NULL_MESSAGE(strchr(captured_log, '\x1b'), message);
    TEST_ASSERT_NULL_MESSAGE(strchr(captured_log, '\x07'), message);
}

static void test_load_full_warning_about_an_unexpected_tensor_named_with_an_escape_sequence_shows_it_escaped(void) {
    const char *extra[1] = {evil_name};
    char path[256], err[1024] = "";
    fsdp_load_options lo;
    start_one_rank_capturing_warnings();
    path_in(path, sizeof path, "evil.safetensors");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, write_model_file(path, 1.0f, extra, 1, err, sizeof err), err);
    memset(&lo, 0, sizeof lo);
    assert_load_warned_escaped(fsdp_load_full(ctx1, path, &lo, NULL));
}

/* A header error about a tensor so named (here: an unknown dtype) shows the name escaped. */
static void test_parse_error_about_a_tensor_named_with_an_escape_sequence_shows_it_escaped(void) {
    static const char header[] = "{\"evil\\u001b]0;owned\\u0007\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    unsigned char image[256];
    fsdp_st_file *f = NULL;
    char err[1024] = "";
    size_t i, n = sizeof header - 1;
    int rc;
    for (i = 0; i < 8; i++) image[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(image + 8, header, n);
    image[8 + n] = 0;
    rc = fsdp_st_parse(&f, image, 8 + n + 1, err, sizeof err);
    if (rc == FSDP_SUCCESS) fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, evil_shown), err);
    assert_no_control_bytes(err, "the parse error");
}

/* fsdp_st_verify names the tensor whose checksum fails: escaped too (ckpt_tool inspect prints
   this message for every BAD tensor). */
static void test_verify_error_about_a_tensor_named_with_an_escape_sequence_shows_it_escaped(void) {
    static const char header[] =
        "{\"__metadata__\":{\"crc32c.evil\\u001b]0;owned\\u0007\":\"00000000\"},"
        "\"evil\\u001b]0;owned\\u0007\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    unsigned char image[512];
    fsdp_st_file *f = NULL;
    char err[1024] = "";
    size_t i, n = sizeof header - 1;
    int rc;
    for (i = 0; i < 8; i++) image[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(image + 8, header, n);
    memcpy(image + 8 + n, "\x01\x02\x03\x04", 4);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_parse(&f, image, 8 + n + 4, err, sizeof err), err);
    rc = fsdp_st_verify(f, 0, err, sizeof err);
    fsdp_st_close(f);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, evil_shown), err);
    assert_no_control_bytes(err, "the checksum error");
}

/* index.json names its shard files; one with an escape sequence in its name is not a plain
   file name: fsdp_index_open refuses the index, and its error shows no control byte. */
static void test_index_open_refuses_a_file_named_with_an_escape_sequence_printably(void) {
    static const char index[] = INDEX_HEAD "\"files\":[\"shard\\u001b]0;owned\\u0007.safetensors\"],"
                                           "\"tensors\":{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"pieces\":[[0,0,1]]}}}";
    char path[256], err[1024] = "";
    fsdp_index *ix = NULL;
    int rc;
    path_in(path, sizeof path, "index.json");
    write_file(path, index, sizeof index - 1);
    rc = fsdp_index_open(&ix, tmpdir, err, sizeof err);
    snprintf(message, sizeof message, "fsdp_index_open: %s \"%s\"", fsdp_result_name(rc), err);
    if (rc == FSDP_SUCCESS) fsdp_index_close(ix);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "file entry 0 is not a plain file name"), message);
    assert_no_control_bytes(err, "the index's error");
}

/* fsdp_index_open of an index in tmpdir whose only file entry is json_name (as JSON text, so
   "\\u001b" is ESC); the index is closed again. Its result, the error in err. */
static int open_index_naming(const char *json_name, char *err, size_t err_size) {
    char path[256], document[1024];
    fsdp_index *ix = NULL;
    int rc;
    snprintf(document, sizeof document,
             INDEX_HEAD "\"files\":[\"%s\"],\"tensors\":{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"pieces\":[[0,0,1]]}}}",
             json_name);
    path_in(path, sizeof path, "index.json");
    write_file(path, document, strlen(document));
    err[0] = 0;
    rc = fsdp_index_open(&ix, tmpdir, err, err_size);
    fsdp_index_close(ix);
    return rc;
}

/* A file entry is 1..255 characters of A-Z a-z 0-9 . _ - (but "." and ".."): a space, a slash,
   a parent directory, a backslash, non-ASCII UTF-8 (raw or as a JSON escape) and 256
   characters are refused; 255 characters, every allowed character, and the names
   fsdp_save_sharded writes are accepted. */
static void test_index_open_accepts_only_plain_file_names_of_1_to_255_safe_characters(void) {
    static const char *const refused[] = {"", ".", "..", "shard 0.safetensors", "sub/shard.safetensors",
                                          "../shard.safetensors", "/etc/passwd", "shard\\\\0.safetensors",
                                          "caf\xc3\xa9.safetensors", "caf\\u00e9.safetensors", "shard~.safetensors"};
    char long_name[300], dir[256], shard[512], err[1024];
    fsdp_index *ix = NULL;
    size_t i;
    int rc;
    for (i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        rc = open_index_naming(refused[i], err, sizeof err);
        snprintf(message, sizeof message, "file entry \"%s\": %s \"%s\"", refused[i], fsdp_result_name(rc), err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "not a plain file name"), message);
    }
    memset(long_name, 'a', 256);
    long_name[256] = 0;
    rc = open_index_naming(long_name, err, sizeof err);
    snprintf(message, sizeof message, "a file entry of 256 characters: %s \"%s\"", fsdp_result_name(rc), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
    long_name[255] = 0;
    rc = open_index_naming(long_name, err, sizeof err);
    snprintf(message, sizeof message, "a file entry of 255 characters: %s \"%s\"", fsdp_result_name(rc), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    rc = open_index_naming("ABCXYZabcxyz0189._-.safetensors", err, sizeof err);
    snprintf(message, sizeof message, "a file entry of every allowed kind of character: %s \"%s\"", fsdp_result_name(rc), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    start_one_rank();
    save_sharded_checkpoint("ckpt", dir, sizeof dir, shard, sizeof shard);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_index_open(&ix, dir, err, sizeof err), err);
    fsdp_index_close(ix);
}

/* The pieces of a tensor in index.json cover its elements in order, each exactly once: pieces
   end to end are accepted; pieces that overlap (element 2 twice), leave a gap, stop short or run
   past the tensor are refused, naming it. */
static void test_index_parse_accepts_only_pieces_that_cover_each_element_exactly_once(void) {
    static const struct {
        const char *pieces;
        int accepted;
    } cases[] = {{"[0,0,3],[0,3,4]", 1}, {"[0,0,3],[0,2,4]", 0}, {"[0,0,2],[0,3,4]", 0}, {"[0,0,3]", 0},
                 {"[0,0,3],[0,3,5]", 0}};
    char document[512], err[512];
    fsdp_index *ix;
    size_t i;
    int rc;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(document, sizeof document,
                 INDEX_HEAD "\"files\":[\"a\"],\"tensors\":{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"pieces\":[%s]}}}",
                 cases[i].pieces);
        ix = NULL;
        err[0] = 0;
        rc = fsdp_index_parse(&ix, document, strlen(document), err, sizeof err);
        fsdp_index_close(ix);
        snprintf(message, sizeof message, "pieces %s of 4 elements: %s \"%s\"", cases[i].pieces, fsdp_result_name(rc), err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(cases[i].accepted ? FSDP_SUCCESS : FSDP_ERR_CORRUPT, rc, message);
        if (!cases[i].accepted) TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "the pieces of 't'"), message);
    }
}

/* A real sharded checkpoint whose index.json names a byte-identical copy of its shard under a
   name with an escape sequence ("shard\x1b]0;owned\x07.safetensors", a real file): the load
   fails on the name alone, and its error shows no control byte. */
static void test_load_sharded_of_an_index_naming_a_shard_file_with_an_escape_sequence_fails_printably(void) {
    char dir[256], shard[512], evil[600], index[512], rewritten[1 << 14];
    static char bytes[1 << 14];
    const char *name, *at;
    size_t n;
    int rc;
    start_one_rank();
    save_sharded_checkpoint("ckpt", dir, sizeof dir, shard, sizeof shard);
    snprintf(evil, sizeof evil, "%s/shard\x1b]0;owned\x07.safetensors", dir);
    copy_file(shard, evil);
    snprintf(index, sizeof index, "%s/index.json", dir);
    n = read_bytes(index, bytes, sizeof bytes);
    TEST_ASSERT_TRUE(n > 0 && n < sizeof bytes - 1);
    name = strrchr(shard, '/') + 1;
    at = strstr(bytes, name);
    TEST_ASSERT_NOT_NULL_MESSAGE(at, "index.json does not name the shard file");
    snprintf(rewritten, sizeof rewritten, "%.*sshard\\u001b]0;owned\\u0007.safetensors%s", (int)(at - bytes), bytes,
             at + strlen(name));
    write_file(index, rewritten, strlen(rewritten));
    rc = fsdp_load_sharded(ctx1, dir, NULL, NULL);
    snprintf(message, sizeof message, "fsdp_load_sharded: %s \"%s\"", fsdp_result_name(rc), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), "not a plain file name"), message);
    assert_no_control_bytes(fsdp_last_error(ctx1), "the load's error");
}

/* A checkpoint whose "optimizer" metadata holds an escape sequence, loaded strictly with the
   optimizer state into a context of another optimizer (SGD): the incompatibility error shows
   the value escaped. */
static const fsdp_kv evil_optimizer = {"optimizer", evil_name};

static void test_load_full_with_optimizer_of_a_file_whose_optimizer_has_an_escape_sequence_fails_showing_it_escaped(void) {
    char path[256], err[1024] = "";
    fsdp_load_options lo;
    int rc;
    start_one_rank();
    path_in(path, sizeof path, "evil.safetensors");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS,
                                  write_model_file_with_metadata(path, 1.0f, NULL, 0, &evil_optimizer, 1, err, sizeof err), err);
    memset(&lo, 0, sizeof lo);
    lo.with_optimizer = 1;
    lo.strict = 1;
    rc = fsdp_load_full(ctx1, path, &lo, NULL);
    snprintf(message, sizeof message, "%s: \"%s\"", fsdp_result_name(rc), fsdp_last_error(ctx1));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INCOMPATIBLE, rc, message);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(fsdp_last_error(ctx1), evil_shown), message);
    assert_no_control_bytes(fsdp_last_error(ctx1), "the load's error");
}

/* Non-strict, the load succeeds without the optimizer state and warns: the value escaped. */
static void test_load_full_warning_about_an_optimizer_named_with_an_escape_sequence_shows_it_escaped(void) {
    char path[256], err[1024] = "";
    fsdp_load_options lo;
    start_one_rank_capturing_warnings();
    path_in(path, sizeof path, "evil.safetensors");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS,
                                  write_model_file_with_metadata(path, 1.0f, NULL, 0, &evil_optimizer, 1, err, sizeof err), err);
    memset(&lo, 0, sizeof lo);
    lo.with_optimizer = 1;
    assert_load_warned_escaped(fsdp_load_full(ctx1, path, &lo, NULL));
}

/* ---------------------------------------------------------------------------------------------
   sizes: shapes whose element count or byte size does not fit 63 bits
   --------------------------------------------------------------------------------------------- */
/* A header of tensor "w" (dtype, shape, data_offsets [0,0]) and "x" (F32 [2] at [0,8]). */
static void huge_tensor_header(char *out, size_t size, const char *dtype, const char *shape) {
    snprintf(out, size, "{\"w\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[0,0]},"
                        "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", dtype, shape);
}

/* fsdp_st_parse of the 8-byte length, header and 8 data bytes; the file is closed again. */
static int parse_with_8_data_bytes(const char *header, char *err, size_t err_size) {
    unsigned char image[512];
    fsdp_st_file *f = NULL;
    size_t i, n = strlen(header);
    int rc;
    TEST_ASSERT_TRUE(8 + n + 8 <= sizeof image);
    for (i = 0; i < 8; i++) image[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(image + 8, header, n);
    memset(image + 8 + n, 0, 8);
    err[0] = 0;
    rc = fsdp_st_parse(&f, image, 8 + n + 8, err, err_size);
    fsdp_st_close(f);
    return rc;
}

/* Element counts of 2^62 and more: as bytes they are 2^64 or more, which a 64-bit product
   wraps (2^62 F32 elements make 0 bytes, as data_offsets [0,0] say). */
static const char *const huge_f32_shapes[] = {"4611686018427387904", "4611686018427387904,4", "2147483648,2147483648,4",
                                              "1152921504606846976,4"};

/* A tensor whose shape holds 2^62 or more elements (F32) or 2^63 - 1 (F16) where data_offsets
   span 0 bytes: the parse fails (FSDP_ERR_CORRUPT) naming it; with shape [0] the same header
   parses (the control). (With 8 data bytes the bound of the element count by the data's size
   refuses these before any product: the wrap itself needs a file of 2^62 bytes, below.) */
static void test_st_parse_refuses_a_shape_whose_byte_size_overflows_64_bits(void) {
    char header[400], err[1024];
    size_t i;
    int rc;
    huge_tensor_header(header, sizeof header, "F32", "0");
    rc = parse_with_8_data_bytes(header, err, sizeof err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, err);
    for (i = 0; i <= sizeof huge_f32_shapes / sizeof huge_f32_shapes[0]; i++) { /* the last: F16 [2^63 - 1] */
        int f16 = i == sizeof huge_f32_shapes / sizeof huge_f32_shapes[0];
        const char *dtype = f16 ? "F16" : "F32", *shape = f16 ? "9223372036854775807" : huge_f32_shapes[i];
        huge_tensor_header(header, sizeof header, dtype, shape);
        rc = parse_with_8_data_bytes(header, err, sizeof err);
        snprintf(message, sizeof message, "%s [%s] at data_offsets [0,0]: %s \"%s\"", dtype, shape, fsdp_result_name(rc), err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "'w'"), message);
    }
}

/* Writes the 8-byte length and header to path, then makes the file 8 + header + data_bytes
   long (sparse). 0, or the errno of the failure. */
static int write_sparse_file(const char *path, const char *header, uint64_t data_bytes) {
    unsigned char len8[8];
    size_t i, n = strlen(header);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), err = 0;
    if (fd < 0) return errno;
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)n >> (8 * i));
    if (write(fd, len8, 8) != 8 || write(fd, header, n) != (ssize_t)n || ftruncate(fd, (off_t)(8 + n + data_bytes)) != 0)
        err = errno ? errno : EIO;
    close(fd);
    return err;
}

#define FOUR_EIB ((uint64_t)1 << 62)

/* In a file of 2^62 + 8 data bytes (sparse: on tmpfs, say), 2^62 F32 elements fit the data
   size, and their 2^64 bytes wrap to the 0 that data_offsets [0,0] span: fsdp_st_open refuses
   the tensor (FSDP_ERR_CORRUPT, naming it) instead of taking 2^62 elements from 0 bytes; with
   shape [0] the same file opens (the control). Ignored where no file system here takes such a
   file (tmpdir first, then /dev/shm). */
static void test_st_open_of_a_sparse_4_eib_file_refuses_a_shape_whose_byte_size_wraps_to_its_data_offsets(void) {
    char header[400], path[256], err[1024];
    fsdp_st_file *f = NULL;
    size_t i;
    int rc, e;
    if (sizeof(off_t) < 8) TEST_IGNORE_MESSAGE("off_t of 32 bits: no file of 2^62 bytes");
    huge_tensor_header(header, sizeof header, "F32", "0");
    path_in(path, sizeof path, "big.safetensors");
    if (write_sparse_file(path, header, FOUR_EIB + 8) != 0) {
        unlink(path);
        snprintf(big_dir, sizeof big_dir, "/dev/shm/fsdp-test-files-XXXXXX");
        if (!mkdtemp(big_dir)) {
            big_dir[0] = 0;
            TEST_IGNORE_MESSAGE("no file system here takes a sparse file of 2^62 bytes (tried the test directory and /dev/shm)");
        }
        snprintf(path, sizeof path, "%s/big.safetensors", big_dir);
        if ((e = write_sparse_file(path, header, FOUR_EIB + 8)) != 0) {
            snprintf(message, sizeof message, "no file system here takes a sparse file of 2^62 bytes (/dev/shm: %s)", strerror(e));
            TEST_IGNORE_MESSAGE(message);
        }
    }
    rc = fsdp_st_open(&f, path, err, sizeof err);
    fsdp_st_close(f);
    f = NULL;
    snprintf(message, sizeof message, "the control, F32 [0] in %s: %s \"%s\"", path, fsdp_result_name(rc), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    for (i = 0; i < sizeof huge_f32_shapes / sizeof huge_f32_shapes[0]; i++) {
        huge_tensor_header(header, sizeof header, "F32", huge_f32_shapes[i]);
        TEST_ASSERT_EQUAL_INT(0, write_sparse_file(path, header, FOUR_EIB + 8));
        err[0] = 0;
        rc = fsdp_st_open(&f, path, err, sizeof err);
        fsdp_st_close(f);
        f = NULL;
        snprintf(message, sizeof message, "F32 [%s] at data_offsets [0,0] in 2^62 + 8 data bytes: %s \"%s\"",
                 huge_f32_shapes[i], fsdp_result_name(rc), err);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_CORRUPT, rc, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "'w'"), message);
    }
}

/* fsdp_st_writer_open of specs[num] into tmpdir: it must fail with FSDP_ERR_INVALID_ARG,
   naming the tensor `named`, and leave no file in the directory (not even a temporary). */
static void assert_writer_refuses(const fsdp_st_spec *specs, int num, const char *named, const char *what) {
    fsdp_st_writer *w = NULL;
    char path[256], err[1024] = "", quoted[64];
    int rc, left;
    path_in(path, sizeof path, "huge.safetensors");
    rc = fsdp_st_writer_open(&w, path, specs, num, NULL, 0, err, sizeof err);
    left = count_entries(tmpdir, NULL); /* before an abort could remove what the open made */
    if (rc == FSDP_SUCCESS) fsdp_st_writer_abort(w);
    snprintf(message, sizeof message, "%s: %s \"%s\"", what, fsdp_result_name(rc), err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    snprintf(quoted, sizeof quoted, "'%s'", named);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, quoted), message);
    snprintf(message, sizeof message, "%s: %d files left in the test directory", what, left);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, left, message);
}

static void set_spec(fsdp_st_spec *spec, const char *name, fsdp_dtype dtype, int ndim, int64_t d0, int64_t d1) {
    memset(spec, 0, sizeof *spec);
    spec->name = name;
    spec->dtype = dtype;
    spec->ndim = ndim;
    spec->shape[0] = d0;
    spec->shape[1] = d1;
}

/* F32 [2^62, 4]: 2^64 elements, 0 in a 64-bit product. */
static void test_st_writer_open_refuses_a_shape_whose_size_overflows_leaving_no_file(void) {
    fsdp_st_spec spec;
    set_spec(&spec, "huge", FSDP_F32, 2, INT64_C(4611686018427387904), 4);
    assert_writer_refuses(&spec, 1, "huge", "F32 [2^62, 4]");
    set_spec(&spec, "huge", FSDP_BF16, 1, INT64_MAX, 0);
    assert_writer_refuses(&spec, 1, "huge", "BF16 [2^63 - 1]");
}

/* A negative dimension is no shape (it used to count as 0). */
static void test_st_writer_open_refuses_a_negative_dimension_leaving_no_file(void) {
    fsdp_st_spec spec;
    set_spec(&spec, "negative", FSDP_F32, 1, -1, 0);
    assert_writer_refuses(&spec, 1, "negative", "F32 [-1]");
    set_spec(&spec, "negative", FSDP_F32, 2, 2, -1);
    assert_writer_refuses(&spec, 1, "negative", "F32 [2, -1]");
}

/* Two tensors of 2^63 - 4 bytes each (F32 [2^61 - 1]): each fits alone (the control opens and
   is aborted), their offsets do not: the second is refused. */
static void test_st_writer_open_refuses_tensors_whose_sizes_sum_past_int64_max_leaving_no_file(void) {
    fsdp_st_spec specs[2];
    fsdp_st_writer *w = NULL;
    char path[256], err[1024] = "";
    set_spec(&specs[0], "first", FSDP_F32, 1, INT64_C(2305843009213693951), 0);
    set_spec(&specs[1], "second", FSDP_F32, 1, INT64_C(2305843009213693951), 0);
    path_in(path, sizeof path, "alone.safetensors");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_st_writer_open(&w, path, specs, 1, NULL, 0, err, sizeof err), err);
    fsdp_st_writer_abort(w);
    TEST_ASSERT_EQUAL_INT(0, count_entries(tmpdir, NULL));
    assert_writer_refuses(specs, 2, "second", "two F32 [2^61 - 1]");
}

/* ---------------------------------------------------------------------------------------------
   fsdp_load_full: every rank must have opened the same file
   --------------------------------------------------------------------------------------------- */
typedef struct same_file_board {
    char path[2][256];
    int rc[2];
    char error[2][1024];
    int setup_failed;
} same_file_board;

static int load_own_file_rank(fsdp_comm *comm, void *arg) {
    same_file_board *b = (same_file_board *)arg;
    int rank = fsdp_comm_rank(comm), rc;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_load_options lo;
    if ((rc = ctx_open(comm, &model, &ctx)) != 0) {
        b->setup_failed = 1;
        snprintf(b->error[rank], sizeof b->error[rank], "setup: %s %s", fsdp_result_name(rc), fsdp_last_error(NULL));
    } else {
        memset(&lo, 0, sizeof lo);
        lo.strict = 1;
        b->rc[rank] = fsdp_load_full(ctx, b->path[rank], &lo, NULL);
        snprintf(b->error[rank], sizeof b->error[rank], "%s", fsdp_last_error(ctx));
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return 0;
}

static void test_load_full_where_rank_1_opens_another_file_fails_on_every_rank_naming_rank_1(void) {
    same_file_board *b = (same_file_board *)map_board(sizeof(same_file_board));
    fsdp_launch_desc d;
    fsdp_launch_status status;
    int rc, rank;
    path_in(b->path[0], sizeof b->path[0], "rank0.safetensors");
    path_in(b->path[1], sizeof b->path[1], "rank1.safetensors");
    write_model_file_ok(b->path[0], 1.0f);
    write_model_file_ok(b->path[1], 2.0f); /* same tensors and shapes, other values */
    memset(&d, 0, sizeof d);
    d.nprocs = 2;
    d.timeout_ms = CHILD_TIMEOUT_MS;
    rc = fsdp_launch_ex(&d, load_own_file_rank, b, &status);
    snprintf(message, sizeof message, "launch: %s %s | %s | %s", fsdp_result_name(rc), status.message, b->error[0], b->error[1]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    TEST_ASSERT_FALSE_MESSAGE(b->setup_failed, message);
    for (rank = 0; rank < 2; rank++) {
        snprintf(message, sizeof message, "rank %d: %s \"%s\"", rank, fsdp_result_name(b->rc[rank]), b->error[rank]);
        TEST_ASSERT_TRUE_MESSAGE(b->rc[rank] != FSDP_SUCCESS, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->error[rank], "rank 1"), message);
    }
}

/* ---------------------------------------------------------------------------------------------
   a rank out of memory in a collective save: every rank fails at once, naming it
   --------------------------------------------------------------------------------------------- */
#define OOM_TIMEOUT_MS 5000 /* the communicators' bound on any wait: a rank left waiting reaches it */

typedef struct oom_board {
    char path[256];
    int rc[2], done[2];
    double elapsed_ms[2];
    char error[2][1024];
    int setup_failed;
} oom_board;

static int save_out_of_memory_rank(fsdp_comm *comm, void *arg) {
    oom_board *b = (oom_board *)arg;
    int rank = fsdp_comm_rank(comm), rc;
    fsdp_model *model = NULL;
    fsdp_ctx *ctx = NULL;
    double start;
    if ((rc = ctx_open(comm, &model, &ctx)) != 0) {
        b->setup_failed = 1;
        snprintf(b->error[rank], sizeof b->error[rank], "setup: %s %s", fsdp_result_name(rc), fsdp_last_error(NULL));
    } else {
        start = now_ms();
        if (rank == 1) __atomic_store_n(&alloc_fails, 1, __ATOMIC_RELAXED);
        b->rc[rank] = fsdp_save_full(ctx, b->path, NULL);
        __atomic_store_n(&alloc_fails, 0, __ATOMIC_RELAXED);
        b->elapsed_ms[rank] = now_ms() - start;
        snprintf(b->error[rank], sizeof b->error[rank], "%s", fsdp_last_error(ctx));
        b->done[rank] = 1;
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(model);
    return 0;
}

static void test_save_full_with_rank_1_out_of_memory_fails_at_once_on_every_rank_naming_rank_1(void) {
    oom_board *b = (oom_board *)map_board(sizeof(oom_board));
    fsdp_launch_desc d;
    fsdp_launch_status status;
    int rc, rank;
    path_in(b->path, sizeof b->path, "oom.safetensors");
    memset(&d, 0, sizeof d);
    d.nprocs = 2;
    d.timeout_ms = OOM_TIMEOUT_MS;
    rc = fsdp_launch_ex(&d, save_out_of_memory_rank, b, &status);
    snprintf(message, sizeof message, "launch: %s %s | %s | %s", fsdp_result_name(rc), status.message, b->error[0], b->error[1]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    TEST_ASSERT_FALSE_MESSAGE(b->setup_failed, message);
    for (rank = 0; rank < 2; rank++) {
        snprintf(message, sizeof message, "rank %d: %s after %.0f ms: \"%s\"", rank, fsdp_result_name(b->rc[rank]),
                 b->elapsed_ms[rank], b->error[rank]);
        TEST_ASSERT_TRUE_MESSAGE(b->done[rank], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_OUT_OF_MEMORY, b->rc[rank], message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->error[rank], "out of memory"), message);
        TEST_ASSERT_TRUE_MESSAGE(b->elapsed_ms[rank] < OOM_TIMEOUT_MS, message);
    }
    snprintf(message, sizeof message, "rank 0 should name rank 1: \"%s\"", b->error[0]);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(b->error[0], "rank 1: "), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(-1, access(b->path, F_OK), "a file was left where the failed save wrote");
}

/* ---------------------------------------------------------------------------------------------
   the index.json fuzz target's corpus and every crasher it found, through fsdp_index_parse, in
   a child process per file so that a crash names the file
   --------------------------------------------------------------------------------------------- */
/* What the fuzz target does with one input: parse, and on success walk everything. */
static int exercise_index_parser(const unsigned char *bytes, size_t size) {
    fsdp_index *ix = NULL;
    char err[512] = "";
    int i, k, rc = fsdp_index_parse(&ix, bytes, size, err, sizeof err);
    if (rc != FSDP_SUCCESS) return (rc == FSDP_ERR_CORRUPT && err[0]) || rc == FSDP_ERR_OUT_OF_MEMORY ? 0 : 2;
    for (i = 0; i < fsdp_index_num_tensors(ix); i++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        if (!t || fsdp_index_find(ix, t->name) != i) return 3;
        for (k = 0; k < t->num_pieces; k++)
            if (t->pieces[k].file < 0 || t->pieces[k].file >= fsdp_index_num_files(ix)) return 3;
    }
    for (i = 0; i < fsdp_index_num_metadata(ix); i++)
        if (!fsdp_index_metadata_at(ix, i).key) return 3;
    fsdp_index_close(ix);
    return 0;
}

static void test_index_fuzz_corpus_and_crashers_parse_without_crashing(void) {
    assert_corpus_replays("INDEX_CORPUS_DIR", INDEX_CORPUS_DIR, "index", exercise_index_parser,
                          "2: an error without a message, 3: a bad table");
}

int main(void) {
    UNITY_BEGIN();
    /* writes */
    RUN_TEST(test_st_writer_temporary_file_is_mode_0600_while_written);
    RUN_TEST(test_save_full_temporary_file_is_mode_0600_while_written);
    RUN_TEST(test_save_sharded_temporary_file_is_mode_0600_while_written);
    RUN_TEST(test_write_file_atomic_temporary_file_is_mode_0600_while_written);
    RUN_TEST(test_st_writer_final_file_is_0666_less_the_umask);
    RUN_TEST(test_save_full_final_file_is_0666_less_the_umask);
    RUN_TEST(test_save_sharded_shard_files_and_index_are_0666_less_the_umask);
    RUN_TEST(test_write_file_atomic_final_file_is_0666_less_the_umask);
    RUN_TEST(test_st_writer_replaces_a_symlink_at_the_final_path_leaving_its_target_untouched);
    RUN_TEST(test_save_full_replaces_a_symlink_at_the_final_path_leaving_its_target_untouched);
    RUN_TEST(test_write_file_atomic_replaces_a_symlink_at_the_final_path_leaving_its_target_untouched);
    RUN_TEST(test_st_writer_does_not_follow_a_symlink_planted_at_the_old_temporary_name);
    RUN_TEST(test_save_full_does_not_follow_a_symlink_planted_at_the_old_temporary_name);
    RUN_TEST(test_save_sharded_index_does_not_follow_a_symlink_planted_at_the_old_temporary_name);
    RUN_TEST(test_write_file_atomic_does_not_follow_a_symlink_planted_at_the_old_temporary_name);
    RUN_TEST(test_two_st_writers_of_one_path_in_one_process_both_succeed_and_the_last_close_wins);
    RUN_TEST(test_write_file_atomic_succeeds_warning_where_the_directory_cannot_be_synced);
    RUN_TEST(test_st_writer_close_succeeds_warning_where_the_directory_cannot_be_synced);
    RUN_TEST(test_save_sharded_refuses_a_directory_every_user_can_write_in);
    RUN_TEST(test_save_sharded_refuses_a_symbolic_link_of_another_user);
    RUN_TEST(test_save_sharded_refuses_a_directory_of_another_user);
    RUN_TEST(test_save_sharded_through_our_own_symlink_to_our_own_directory_works);
    RUN_TEST(test_save_sharded_refuses_another_users_link_named_with_a_trailing_slash);
    RUN_TEST(test_save_sharded_refuses_another_users_link_named_with_a_trailing_slash_dot);
    RUN_TEST(test_save_sharded_through_a_link_repointed_after_the_check_writes_where_it_checked);
    RUN_TEST(test_save_sharded_async_through_a_link_repointed_after_the_check_writes_where_it_checked);
    RUN_TEST(test_save_sharded_while_another_job_saves_into_the_same_directory_fails_saying_so);
    RUN_TEST(test_trace_where_a_fifo_is_planted_under_its_name_neither_blocks_nor_fails);
    RUN_TEST(test_trace_where_another_users_file_is_planted_under_its_name_leaves_that_file_untouched);
    RUN_TEST(test_trace_refuses_another_users_link_named_with_a_trailing_slash);
    RUN_TEST(test_trace_through_a_link_repointed_after_the_check_is_written_where_it_checked);
    /* stale temporary files */
    RUN_TEST(test_save_removes_a_stale_temporary_file_of_this_host_whose_writer_is_dead);
    RUN_TEST(test_save_keeps_a_temporary_file_of_another_host);
    RUN_TEST(test_save_keeps_a_temporary_file_of_this_host_whose_writer_is_alive);
    /* readers */
    RUN_TEST(test_st_open_of_a_fifo_fails_within_100_ms);
    RUN_TEST(test_index_open_where_index_json_is_a_fifo_fails_within_100_ms);
    RUN_TEST(test_st_open_of_a_directory_is_refused_as_not_a_regular_file);
    RUN_TEST(test_st_open_of_a_device_is_refused_as_not_a_regular_file);
    RUN_TEST(test_index_open_where_index_json_is_a_symlink_fails_naming_the_link);
    RUN_TEST(test_load_sharded_where_a_shard_file_is_a_symlink_fails_naming_a_symbolic_link);
    RUN_TEST(test_index_open_file_of_a_shard_that_is_a_symlink_fails_naming_a_symbolic_link);
    RUN_TEST(test_st_open_of_a_users_symlink_to_a_checkpoint_works);
    RUN_TEST(test_st_open_of_a_symlink_to_a_non_checkpoint_does_not_show_its_first_bytes);
    RUN_TEST(test_load_sharded_of_a_shard_symlinked_to_a_non_checkpoint_does_not_show_its_first_bytes);
    /* JSON memory */
    RUN_TEST(test_st_parse_and_index_parse_of_a_real_checkpoint_succeed);
    RUN_TEST(test_st_parse_of_a_10mb_header_with_a_huge_ignored_key_peaks_under_4x_the_input);
    RUN_TEST(test_st_parse_of_a_10mb_header_of_tiny_metadata_entries_peaks_under_4x_the_input);
    RUN_TEST(test_st_parse_of_a_10mb_header_of_tiny_tensors_peaks_under_4x_the_input);
    RUN_TEST(test_st_parse_of_a_10mb_header_of_tensor_entries_that_are_not_objects_peaks_under_4x_the_input);
    RUN_TEST(test_st_parse_of_a_10mb_header_of_empty_tensor_objects_peaks_under_4x_the_input);
    RUN_TEST(test_st_parse_of_a_10mb_header_of_metadata_that_are_not_strings_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_tiny_pieces_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_the_shortest_pieces_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_tiny_tensors_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_tiny_metadata_entries_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_pieces_that_are_not_arrays_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_tensor_entries_that_are_not_objects_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_metadata_that_are_not_strings_peaks_under_4x_the_input);
    RUN_TEST(test_index_parse_of_a_10mb_index_of_file_entries_that_are_not_strings_peaks_under_4x_the_input);
    /* printable output */
    RUN_TEST(test_printable_ascii_passes_unchanged);
    RUN_TEST(test_printable_well_formed_utf8_passes_unchanged);
    RUN_TEST(test_printable_escape_bell_and_other_ascii_controls_become_hex);
    RUN_TEST(test_printable_c1_controls_encoded_as_c2_80_to_9f_become_hex);
    RUN_TEST(test_printable_broken_utf8_becomes_hex);
    RUN_TEST(test_printable_overlong_encodings_become_hex);
    RUN_TEST(test_printable_bidi_controls_and_line_separators_become_hex);
    RUN_TEST(test_printable_truncation_ends_with_dots_at_a_character_boundary);
    RUN_TEST(test_printable_sizes_0_to_3_never_overflow);
    RUN_TEST(test_load_full_of_an_unexpected_tensor_named_with_an_escape_sequence_shows_it_escaped);
    RUN_TEST(test_load_full_warning_about_an_unexpected_tensor_named_with_an_escape_sequence_shows_it_escaped);
    RUN_TEST(test_parse_error_about_a_tensor_named_with_an_escape_sequence_shows_it_escaped);
    RUN_TEST(test_verify_error_about_a_tensor_named_with_an_escape_sequence_shows_it_escaped);
    RUN_TEST(test_index_open_refuses_a_file_named_with_an_escape_sequence_printably);
    RUN_TEST(test_index_open_accepts_only_plain_file_names_of_1_to_255_safe_characters);
    RUN_TEST(test_index_parse_accepts_only_pieces_that_cover_each_element_exactly_once);
    RUN_TEST(test_load_sharded_of_an_index_naming_a_shard_file_with_an_escape_sequence_fails_printably);
    RUN_TEST(test_load_full_with_optimizer_of_a_file_whose_optimizer_has_an_escape_sequence_fails_showing_it_escaped);
    RUN_TEST(test_load_full_warning_about_an_optimizer_named_with_an_escape_sequence_shows_it_escaped);
    /* sizes */
    RUN_TEST(test_st_parse_refuses_a_shape_whose_byte_size_overflows_64_bits);
    RUN_TEST(test_st_open_of_a_sparse_4_eib_file_refuses_a_shape_whose_byte_size_wraps_to_its_data_offsets);
    RUN_TEST(test_st_writer_open_refuses_a_shape_whose_size_overflows_leaving_no_file);
    RUN_TEST(test_st_writer_open_refuses_a_negative_dimension_leaving_no_file);
    RUN_TEST(test_st_writer_open_refuses_tensors_whose_sizes_sum_past_int64_max_leaving_no_file);
    /* ranks that opened different files */
    RUN_TEST(test_load_full_where_rank_1_opens_another_file_fails_on_every_rank_naming_rank_1);
    RUN_TEST(test_save_full_with_rank_1_out_of_memory_fails_at_once_on_every_rank_naming_rank_1);
    /* the fuzz corpus */
    RUN_TEST(test_index_fuzz_corpus_and_crashers_parse_without_crashing);
    return UNITY_END();
}
