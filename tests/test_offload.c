/* test_offload.c - optimizer state, gradients and parameters on local disk (fsdp_desc.offload)
   and optimizer state in bf16 (optimizer.state_dtype): training gives the bits it gives in RAM,
   for every strategy at P = 1, 2, 4, with units larger than the streaming chunks, through
   gradient accumulation, clipping twice, a skipped step and parameters set by hand; the file is
   unlinked and its bytes stay out of the page cache; a directory in RAM, a missing directory and
   a disk too small are refused at init; a short read mid-training (in the step, or before a
   gather) fails naming the file, offset and bytes, and the other ranks name the rank;
   checkpoints are the bytes of checkpoints from RAM, and load into offloaded state at another
   world size; the estimator counts RAM and disk apart and AUTO offloads (the optimizer state,
   then the gradients, then the parameters) when nothing fits in RAM; a directory of another user
   that every user can write in gives that user no way to the file (so it needs no ownership
   check, unlike checkpoint and trace directories).

   The model: a root holding a small vector and three "Block" units of a 5003-element weight and
   a 7-element bias (prime sizes: no unit divides by P), gradients made up per rank and step (the
   optimizer is what is tested, not a network). The offload directory is a fresh one beside the
   test program (the build directory), on disk where the build is.
   Build: make test (or make build/test_offload). */
#define _GNU_SOURCE
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"

#include "unity.h"
#include "test_common.h"

#include <grp.h>
#include <sys/mount.h>
#include <sys/statfs.h>

#define BLOCKS 3
#define WEIGHT 5003
#define BIAS 7
#define ROOT 3
#define NELEM (ROOT + BLOCKS * (WEIGHT + BIAS))
#define STEPS 4
#define MAX_WORLD 4
#define TIMEOUT_MS 20000
#define BIG_WEIGHT 200003 /* the AUTO levels' model: BIG_BLOCKS blocks of these */
#define BIG_BLOCKS 12
#define SMALL_RAM ((size_t)128 << 10) /* 128 KiB: chunks of 2048 or 4096 elements, so a block spans several */

static char offload_dir[512]; /* made by main, beside the test program */

void setUp(void) {}
void tearDown(void) {}

/* ---------------------------------------------------------------------------------------------
   the model and its made-up training
   --------------------------------------------------------------------------------------------- */
typedef struct net {
    fsdp_model *model;
    int block[BIG_BLOCKS], weight[BIG_BLOCKS], bias[BIG_BLOCKS], scale;
    int weight_numel, blocks;
} net;

/* The model with `blocks` blocks of weights of weight_numel elements (gather_net gathers the
   standard one: BLOCKS of WEIGHT). */
static int net_build_sized(net *n, int weight_numel, int blocks) {
    fsdp_init_rule normal = {FSDP_INIT_NORMAL, 0.0f, 0.2f, NULL, NULL}, ones = {FSDP_INIT_ONES, 0, 0, NULL, NULL};
    int64_t ws[1] = {weight_numel}, bs[1] = {BIAS}, rs[1] = {ROOT};
    char name[16];
    int b;
    memset(n, 0, sizeof *n);
    n->weight_numel = weight_numel;
    n->blocks = blocks;
    if (fsdp_model_create(&n->model, "Net") || (n->scale = fsdp_model_param(n->model, 0, "scale", 1, rs, ones)) < 0) return -1;
    for (b = 0; b < blocks; b++) {
        snprintf(name, sizeof name, "%d", b);
        if ((n->block[b] = fsdp_model_module(n->model, 0, name, "Block")) < 0 ||
            (n->weight[b] = fsdp_model_param(n->model, n->block[b], "weight", 1, ws, normal)) < 0 ||
            (n->bias[b] = fsdp_model_param(n->model, n->block[b], "bias", 1, bs, normal)) < 0)
            return -1;
    }
    return 0;
}
static int net_build(net *n) { return net_build_sized(n, WEIGHT, BLOCKS); }

/* A gradient element of parameter p on rank r at step s: made up, different per rank. */
static float made_up_grad(int p, int i, int rank, int step) {
    return sinf(0.013f * (float)i + 0.7f * (float)p + 0.31f * (float)step) * (1.0f + 0.25f * (float)rank);
}

/* The made-up gradient plus a weight-decay-like term of the gathered weight, so that a gather
   that read stale weights changes the training. */
static void add_grad(fsdp_ctx *ctx, int param, int numel, int rank, int step) {
    float *g = fsdp_grad(ctx, param);
    const float *w = fsdp_param(ctx, param);
    int i;
    for (i = 0; g && w && i < numel; i++) g[i] += made_up_grad(param, i, rank, step) + 0.5f * w[i];
}

static int poison_rank = -1; /* this rank's pass makes a gradient NaN (a step every rank skips) */

/* A forward and backward: every hook in order, the gradients added in backward (to what earlier
   passes left: accumulation). */
static int pass(fsdp_ctx *ctx, const net *n, int rank, int step) {
    int b, rc;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0) return rc;
    for (b = 0; b < n->blocks; b++)
        if ((rc = fsdp_pre_forward(ctx, n->block[b])) != 0 || (rc = fsdp_post_forward(ctx, n->block[b])) != 0) return rc;
    if ((rc = fsdp_post_forward(ctx, 0)) != 0 || (rc = fsdp_pre_backward(ctx, 0)) != 0) return rc;
    for (b = n->blocks - 1; b >= 0; b--) {
        if ((rc = fsdp_pre_backward(ctx, n->block[b])) != 0) return rc;
        add_grad(ctx, n->weight[b], n->weight_numel, rank, step);
        add_grad(ctx, n->bias[b], BIAS, rank, step);
        if ((rc = fsdp_post_backward(ctx, n->block[b])) != 0) return rc;
    }
    add_grad(ctx, n->scale, ROOT, rank, step);
    if (rank == poison_rank) fsdp_grad(ctx, n->scale)[1] = NAN;
    return fsdp_post_backward(ctx, 0);
}

/* One iteration: a pass, the step (clipping to norm 1), gradients zeroed. */
static int iterate(fsdp_ctx *ctx, const net *n, int rank, int step, fsdp_step_report *report) {
    int rc;
    if ((rc = pass(ctx, n, rank, step)) != 0 || (rc = fsdp_step(ctx, 1.0f, report)) != 0) return rc;
    return fsdp_zero_grad(ctx);
}

/* Every parameter, gathered, in build order (scale, then each block's weight and bias). */
static int gather_net(fsdp_ctx *ctx, const net *n, float *out) {
    int b, rc;
    if ((rc = fsdp_gather_param(ctx, n->scale, out)) != 0) return rc;
    for (b = 0, out += ROOT; b < BLOCKS; b++, out += WEIGHT + BIAS)
        if ((rc = fsdp_gather_param(ctx, n->weight[b], out)) != 0 || (rc = fsdp_gather_param(ctx, n->bias[b], out + WEIGHT)) != 0)
            return rc;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   configurations: each trains in RAM and with its state on disk (and in bf16, both ways)
   --------------------------------------------------------------------------------------------- */
enum { OFF_OPT = 1, OFF_GRAD = 2, OFF_PARAM = 4, OFF_ALL = 7 }; /* what is on disk */

typedef struct run_config {
    fsdp_strategy strategy;
    fsdp_optimizer_kind optimizer;
    fsdp_dtype state_dtype;
    int offload; /* OFF_* */
    int overlap_step; /* fsdp_desc.overlap_step (everything in RAM) */
} run_config;

#define MAX_CONFIGS 64
static run_config configs[MAX_CONFIGS];
static int num_configs;

/* Every strategy, optimizer and state dtype with nothing, the optimizer state, and everything on
   disk; and AdamW with f32 state with only the gradients, and only the parameters. */
static void build_configs(void) {
    static const fsdp_strategy strategies[4] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_HYBRID_SHARD};
    static const fsdp_optimizer_kind optimizers[2] = {FSDP_ADAMW, FSDP_SGD};
    static const int offloads[5] = {0, OFF_OPT, OFF_ALL, OFF_GRAD, OFF_PARAM};
    int s, o, d, off;
    for (s = 0; s < 4; s++)
        for (o = 0; o < 2; o++)
            for (d = 0; d < 2; d++)
                for (off = 0; off < 5; off++) {
                    run_config *c = &configs[num_configs];
                    if (off >= 3 && (o || d)) continue;
                    c->strategy = strategies[s];
                    c->optimizer = optimizers[o];
                    c->state_dtype = d ? FSDP_BF16 : FSDP_F32;
                    c->offload = offloads[off];
                    num_configs++;
                }
}

static const char *offload_name(int offload) { /* "the parameters and gradients" ... */
    fsdp_offload_desc d;
    memset(&d, 0, sizeof d);
    d.optimizer = (offload & OFF_OPT) != 0;
    d.grads = (offload & OFF_GRAD) != 0;
    d.params = (offload & OFF_PARAM) != 0;
    return fsdp_offload_describe(&d);
}

static void describe(char *out, size_t size, const run_config *c, int world) {
    snprintf(out, size, "P=%d %s %s, %s state, %s on disk%s", world, fsdp_strategy_name(c->strategy),
             c->optimizer == FSDP_SGD ? "SGD(momentum 0.9)" : "AdamW", fsdp_dtype_name(c->state_dtype),
             offload_name(c->offload), c->overlap_step ? ", overlap_step" : "");
}

static void desc_for(fsdp_desc *d, const run_config *c, fsdp_comm *comm) {
    static const char *const blocks[] = {"Block", NULL};
    memset(d, 0, sizeof *d);
    d->comm = comm;
    d->strategy = c->strategy;
    d->wrap.kind = FSDP_WRAP_TYPES;
    d->wrap.types = blocks;
    d->shard_group_size = comm && fsdp_comm_size(comm) == 4 ? 2 : 0;
    d->seed = 11;
    d->optimizer.kind = c->optimizer;
    d->optimizer.lr = c->optimizer == FSDP_SGD ? 0.05f : 0.01f;
    d->optimizer.momentum = c->optimizer == FSDP_SGD ? 0.9f : 0.0f;
    d->optimizer.state_dtype = c->state_dtype;
    d->offload.optimizer = (c->offload & OFF_OPT) != 0;
    d->offload.grads = (c->offload & OFF_GRAD) != 0;
    d->offload.params = (c->offload & OFF_PARAM) != 0;
    d->offload.dir = offload_dir;
    d->offload.ram_bytes = SMALL_RAM;
    d->overlap_step = c->overlap_step;
}

/* The model built and a context on it for configuration c: 0, or the failure with why in error
   (nothing left to free). */
static int open_config(fsdp_comm *comm, const run_config *c, net *n, fsdp_ctx **ctx, char *error, size_t size) {
    fsdp_desc d;
    int rc;
    *ctx = NULL;
    if (net_build(n) != 0) {
        fsdp_model_destroy(n->model);
        snprintf(error, size, "building the model failed");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    desc_for(&d, c, comm);
    if ((rc = fsdp_init(ctx, n->model, &d)) != 0) {
        snprintf(error, size, "fsdp_init: %.280s", fsdp_last_error(NULL));
        fsdp_model_destroy(n->model);
    }
    return rc;
}

typedef struct rank_result {
    int done;
    char error[300];
    float after[STEPS][NELEM];
    fsdp_memory_stats stats;
} rank_result;

typedef struct shared_results {
    int launch_rc[MAX_WORLD + 1], socket_rc[MAX_WORLD + 1];
    char launch_message[MAX_WORLD + 1][256], socket_message[MAX_WORLD + 1][256];
    rank_result result[MAX_WORLD + 1][MAX_CONFIGS][MAX_WORLD];
    rank_result socket[MAX_WORLD + 1][MAX_CONFIGS][MAX_WORLD]; /* on sockets: the configurations with all on disk */
} shared_results;
static shared_results *shared;

static void train_config(fsdp_comm *comm, const run_config *c, rank_result *r) {
    int rank = fsdp_comm_rank(comm), step, rc;
    fsdp_ctx *ctx = NULL;
    net n;
    memset(r, 0, sizeof *r);
    if (open_config(comm, c, &n, &ctx, r->error, sizeof r->error) != 0) return;
    for (step = 0; step < STEPS; step++) {
        if ((rc = iterate(ctx, &n, rank, step, NULL)) != 0 || (rc = gather_net(ctx, &n, r->after[step])) != 0) {
            snprintf(r->error, sizeof r->error, "step %d: %.280s", step, fsdp_last_error(ctx));
            break;
        }
    }
    fsdp_memory_stats_get(ctx, &r->stats);
    r->done = step == STEPS;
    fsdp_destroy(ctx);
    fsdp_model_destroy(n.model);
}

static int matrix_rank(fsdp_comm *comm, void *arg) { /* arg: NULL on shm; on sockets, everything on disk only */
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm), i;
    for (i = 0; i < num_configs; i++)
        if (!arg) train_config(comm, &configs[i], &shared->result[world][i][rank]);
        else if (configs[i].offload == OFF_ALL) train_config(comm, &configs[i], &shared->socket[world][i][rank]);
    return 0;
}

static void ensure_matrix(void) {
    static int launched;
    int world;
    if (launched) return;
    launched = 1;
    for (world = 1; world <= MAX_WORLD; world++) {
        fsdp_launch_status status;
        if (world == 3) continue;
        shared->launch_rc[world] = launch_ranks(world, FSDP_BACKEND_SHM, TIMEOUT_MS, matrix_rank, NULL, &status);
        snprintf(shared->launch_message[world], sizeof shared->launch_message[world], "%s", status.message);
        if (world == 1) continue;
        shared->socket_rc[world] = launch_ranks(world, FSDP_BACKEND_SOCKET, TIMEOUT_MS, matrix_rank, &status, &status);
        snprintf(shared->socket_message[world], sizeof shared->socket_message[world], "%s", status.message);
    }
}

static char message[1024];

static const rank_result *result_of(int world, int ci, int rank) {
    const rank_result *r = &shared->result[world][ci][rank];
    char what[200];
    snprintf(message, sizeof message, "launch at P=%d: %s", world, shared->launch_message[world]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared->launch_rc[world], message);
    describe(what, sizeof what, &configs[ci], world);
    snprintf(message, sizeof message, "%s, rank %d did not finish: %s", what, rank, r->error);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

/* The configuration like ci but with its state in RAM. */
static int in_ram_twin(int ci) {
    int b;
    for (b = 0; b < num_configs; b++)
        if (configs[b].strategy == configs[ci].strategy && configs[b].optimizer == configs[ci].optimizer &&
            configs[b].state_dtype == configs[ci].state_dtype && !configs[b].offload)
            return b;
    return -1;
}

/* Every offloaded configuration of this state dtype, every P, every rank and step: the same bits
   as its twin in RAM. */
static void assert_offload_bitwise(fsdp_dtype state_dtype) {
    int ci, world, rank, step, e, runs = 0, want = 0;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        int twin = in_ram_twin(ci);
        if (!configs[ci].offload || configs[ci].state_dtype != state_dtype) continue;
        want += 3;
        for (world = 1; world <= MAX_WORLD; world++) {
            if (world == 3) continue;
            for (rank = 0; rank < world; rank++) {
                const rank_result *r = result_of(world, ci, rank), *ram = result_of(world, twin, rank);
                for (step = 0; step < STEPS; step++)
                    for (e = 0; e < NELEM; e++)
                        if (memcmp(&r->after[step][e], &ram->after[step][e], sizeof(float)) != 0) {
                            char what[200];
                            describe(what, sizeof what, &configs[ci], world);
                            snprintf(message, sizeof message, "%s, rank %d: after step %d element %d = %.9g, in RAM %.9g",
                                     what, rank, step, e, r->after[step][e], ram->after[step][e]);
                            TEST_FAIL_MESSAGE(message);
                        }
            }
            runs++;
        }
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(want, runs, "offloaded runs compared");
    TEST_ASSERT_EQUAL_INT_MESSAGE(state_dtype == FSDP_F32 ? 3 * 24 : 3 * 16, runs, "offloaded runs compared");
}

/* ---------------------------------------------------------------------------------------------
   tests: the same training, wherever the state is
   --------------------------------------------------------------------------------------------- */
static void test_offloaded_f32_state_trains_bitwise_as_in_ram_for_every_strategy_at_P_1_2_4(void) {
    assert_offload_bitwise(FSDP_F32);
}

static void test_offloaded_bf16_state_trains_bitwise_as_bf16_state_in_ram(void) { assert_offload_bitwise(FSDP_BF16); }

/* Everything on disk over sockets (loopback) at P = 2 and 4: the bits of the same training in RAM
   over shared memory. */
static void test_everything_on_disk_over_sockets_trains_bitwise_as_in_ram_over_shm(void) {
    int ci, world, rank, runs = 0;
    ensure_matrix();
    for (world = 2; world <= MAX_WORLD; world += 2) {
        snprintf(message, sizeof message, "sockets at P=%d: %s", world, shared->socket_message[world]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared->socket_rc[world], message);
        for (ci = 0; ci < num_configs; ci++) {
            char what[200];
            if (configs[ci].offload != OFF_ALL) continue;
            describe(what, sizeof what, &configs[ci], world);
            for (rank = 0; rank < world; rank++) {
                const rank_result *r = &shared->socket[world][ci][rank], *ram = result_of(world, in_ram_twin(ci), rank);
                snprintf(message, sizeof message, "%s on sockets, rank %d: %s", what, rank, r->done ? "differs from shm in RAM"
                                                                                                  : r->error);
                TEST_ASSERT_TRUE_MESSAGE(r->done, message);
                TEST_ASSERT_EQUAL_MEMORY_MESSAGE(ram->after, r->after, sizeof r->after, message);
            }
            runs++;
        }
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(2 * 16, runs, "runs on sockets compared");
}

/* bf16 state changes the numbers (a little): it is not silently f32. */
static void test_bf16_state_trains_close_to_but_not_bitwise_as_f32_state(void) {
    int ci, differ = 0;
    double worst = 0;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        int f32, e;
        const rank_result *r, *ref;
        if (configs[ci].state_dtype != FSDP_BF16 || configs[ci].offload) continue;
        for (f32 = 0; !(configs[f32].strategy == configs[ci].strategy && configs[f32].optimizer == configs[ci].optimizer &&
                        configs[f32].state_dtype == FSDP_F32 && !configs[f32].offload);
             f32++) {}
        r = result_of(2, ci, 0);
        ref = result_of(2, f32, 0);
        for (e = 0; e < NELEM; e++) {
            double d = fabs((double)r->after[STEPS - 1][e] - (double)ref->after[STEPS - 1][e]);
            differ += d != 0;
            if (d > worst) worst = d;
        }
    }
    snprintf(message, sizeof message, "bf16 against f32 state after %d steps: %d elements differ, by up to %g", STEPS, differ, worst);
    TEST_ASSERT_TRUE_MESSAGE(differ > 0, message);
    TEST_ASSERT_TRUE_MESSAGE(worst < 0.02, message); /* a few lr-sized steps apart at most */
}

/* The memory statistics: what is on disk is not in RAM; the streaming uses at most ram_bytes. */
static void test_offloaded_state_is_counted_on_disk_and_the_stream_within_ram_bytes(void) {
    int ci;
    ensure_matrix();
    for (ci = 0; ci < num_configs; ci++) {
        const rank_result *r = result_of(2, ci, 0);
        char what[200];
        int off = configs[ci].offload;
        describe(what, sizeof what, &configs[ci], 2);
        snprintf(message, sizeof message, "%s: in RAM params %zu, grads %zu, optimizer %zu bytes; %zu on disk, stream %zu", what,
                 r->stats.param_shard_bytes, r->stats.grad_shard_bytes, r->stats.optimizer_bytes, r->stats.disk_bytes,
                 r->stats.stream_bytes);
        TEST_ASSERT_TRUE_MESSAGE((r->stats.optimizer_bytes == 0) == ((off & OFF_OPT) != 0), message);
        TEST_ASSERT_TRUE_MESSAGE((r->stats.grad_shard_bytes == 0) == ((off & OFF_GRAD) != 0), message);
        TEST_ASSERT_TRUE_MESSAGE((r->stats.param_shard_bytes == 0) == ((off & OFF_PARAM) != 0), message);
        TEST_ASSERT_TRUE_MESSAGE((r->stats.disk_bytes > 0) == (off != 0), message);
        if (off) TEST_ASSERT_TRUE_MESSAGE(r->stats.stream_bytes > 0 && r->stats.stream_bytes <= SMALL_RAM, message);
        TEST_ASSERT_EQUAL_MESSAGE(r->stats.persistent_bytes + r->stats.peak_unsharded_bytes + r->stats.stream_bytes,
                                  r->stats.peak_bytes, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   the file: unlinked, outside the page cache, and what goes wrong with it
   --------------------------------------------------------------------------------------------- */
/* This process's offload file: the descriptor whose target lies in the offload directory (a file
   already unlinked reads "(deleted)"); -1 if none. */
static int find_offload_fd(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int found = -1;
    while (d && (e = readdir(d)) != NULL) {
        char link[64], target[600];
        ssize_t n;
        snprintf(link, sizeof link, "/proc/self/fd/%.20s", e->d_name);
        if ((n = readlink(link, target, sizeof target - 1)) <= 0) continue;
        target[n] = 0;
        if (strncmp(target, offload_dir, strlen(offload_dir)) == 0 && target[strlen(offload_dir)] == '/') found = atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}

typedef struct file_report {
    int done, rc, fd_found, links, entries;
    long long size, disk_bytes;
    long resident, pages;
    char error[300];
    /* the short read */
    int step_rc;
    char step_error[600];
    /* the sharded checkpoint saved before the fault: its files' hash then and after the failure */
    int ckpt_rc;
    uint64_t ckpt_before, ckpt_after;
} file_report;

/* Three cases: rank 1's file cut short with the optimizer state on disk (the short read hits the
   step) and with everything (it hits the read before the first gather); and with everything on
   disk, rank 1's file descriptor swapped for a read-only one of the same file (reads work, the
   first write, a gradient's behind its reduction, fails with EBADF). */
enum { FILE_CASES = 3 };
static const int file_offload[FILE_CASES] = {OFF_OPT, OFF_ALL, OFF_ALL};
static const int file_read_only[FILE_CASES] = {0, 0, 1};
static int file_case;

typedef struct special_results {
    file_report file[FILE_CASES][2];
} special_results;
static special_results *special;

static int init_offloaded(fsdp_comm *comm, net *n, fsdp_ctx **ctx, char *error, size_t size) {
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 0, 0};
    c.offload = file_offload[file_case];
    return open_config(comm, &c, n, ctx, error, size);
}

/* After two steps: the file in /proc/self/fd, unlinked, of the size reserved, none of its pages
   in the page cache (mincore over a mapping of it). */
/* A hash of every file in dir (names and bytes, in any order); 0 if dir cannot be read. */
static uint64_t tree_hash(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    uint64_t total = 0;
    while (d && (e = readdir(d)) != NULL) {
        char path[1200];
        unsigned char *bytes;
        size_t n = 0, i;
        uint64_t h = 1469598103934665603ull;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        for (i = 0; e->d_name[i]; i++) h = (h ^ (unsigned char)e->d_name[i]) * 1099511628211ull;
        if ((bytes = read_whole_file(path, &n)) != NULL)
            for (i = 0; i < n; i++) h = (h ^ bytes[i]) * 1099511628211ull;
        free(bytes);
        total += h;
    }
    if (d) closedir(d);
    return total;
}

static void file_ckpt_dir(char *out, size_t size) { snprintf(out, size, "%s-ckpt-%d", offload_dir, file_case); }

static int file_rank(fsdp_comm *comm, void *arg) {
    file_report *r = &special->file[file_case][fsdp_comm_rank(comm)];
    fsdp_ctx *ctx = NULL;
    fsdp_memory_stats st;
    struct stat sb;
    net n;
    int step;
    (void)arg;
    memset(&st, 0, sizeof st);
    if ((r->rc = init_offloaded(comm, &n, &ctx, r->error, sizeof r->error)) != 0) return 0;
    for (step = 0; step < 2 && !r->rc; step++)
        if ((r->rc = iterate(ctx, &n, fsdp_comm_rank(comm), step, NULL)) != 0)
            snprintf(r->error, sizeof r->error, "step: %.280s", fsdp_last_error(ctx));
    fsdp_memory_stats_get(ctx, &st);
    r->disk_bytes = (long long)st.disk_bytes;
    r->entries = count_entries(offload_dir, "");
    if ((r->fd_found = find_offload_fd()) >= 0 && fstat(r->fd_found, &sb) == 0) {
        size_t bytes = (size_t)sb.st_size, page = (size_t)sysconf(_SC_PAGESIZE), i;
        void *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, r->fd_found, 0);
        unsigned char *vec = (unsigned char *)calloc(bytes / page + 1, 1);
        r->links = (int)sb.st_nlink;
        r->size = (long long)sb.st_size;
        if (map != MAP_FAILED && vec && mincore(map, bytes, vec) == 0) {
            r->pages = (long)((bytes + page - 1) / page);
            for (i = 0; i < (size_t)r->pages; i++) r->resident += vec[i] & 1;
        } else {
            r->pages = -1;
        }
        if (map != MAP_FAILED) munmap(map, bytes);
        free(vec);
    }
    { /* a checkpoint before the fault, which the failure must leave as it is */
        char dir[600];
        fsdp_save_options so;
        memset(&so, 0, sizeof so);
        so.with_optimizer = 1;
        file_ckpt_dir(dir, sizeof dir);
        r->ckpt_rc = fsdp_save_sharded(ctx, dir, &so);
        if (!r->ckpt_rc && fsdp_comm_rank(comm) == 0) r->ckpt_before = tree_hash(dir);
    }
    /* then a fault: rank 1's file is cut short (or made read-only), and the next step reads (writes) it */
    if (fsdp_comm_rank(comm) == 1 && r->fd_found >= 0 && !file_read_only[file_case] && ftruncate(r->fd_found, 0) != 0)
        r->links = -100;
    if (fsdp_comm_rank(comm) == 1 && r->fd_found >= 0 && file_read_only[file_case]) {
        char self[64];
        int ro;
        snprintf(self, sizeof self, "/proc/self/fd/%d", r->fd_found);
        if ((ro = open(self, O_RDONLY)) < 0 || dup2(ro, r->fd_found) < 0) r->links = -200;
        if (ro >= 0) close(ro);
    }
    r->step_rc = iterate(ctx, &n, fsdp_comm_rank(comm), 2, NULL);
    if (!r->step_rc) r->step_rc = iterate(ctx, &n, fsdp_comm_rank(comm), 3, NULL); /* rank 0: its next collective */
    snprintf(r->step_error, sizeof r->step_error, "%.590s", fsdp_last_error(ctx));
    if (fsdp_comm_rank(comm) == 0) {
        char dir[600];
        fsdp_destroy(ctx); /* (everything in the background ended) */
        ctx = NULL;
        file_ckpt_dir(dir, sizeof dir);
        r->ckpt_after = tree_hash(dir);
    }
    r->done = 1;
    fsdp_destroy(ctx);
    fsdp_model_destroy(n.model);
    return 0;
}

static void ensure_file_runs(void) {
    static int launched;
    fsdp_launch_status status;
    int rc;
    if (launched) return;
    launched = 1;
    for (file_case = 0; file_case < FILE_CASES; file_case++) {
        rc = launch_ranks(2, FSDP_BACKEND_SHM, 5000, file_rank, NULL, &status);
        (void)rc; /* rank 1 fails on purpose; what each saw is in special->file */
    }
}

static const file_report *file_of(int fc, int rank) {
    const file_report *r = &special->file[fc][rank];
    ensure_file_runs();
    snprintf(message, sizeof message, "%s on disk: rank %d did not finish (%s)", offload_name(file_offload[fc]), rank, r->error);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    snprintf(message, sizeof message, "%s on disk: rank %d: %s", offload_name(file_offload[fc]), rank, r->error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, r->rc, message);
    return r;
}

static void test_offload_file_is_unlinked_of_the_reserved_size_and_outside_the_page_cache(void) {
    struct statfs fs;
    int rank, fc;
    if (statfs(offload_dir, &fs) == 0 && fs.f_type == 0x01021994)
        TEST_IGNORE_MESSAGE("the build directory is on tmpfs: its pages are RAM whatever fsdp.h does");
    for (fc = 0; fc < FILE_CASES; fc++)
        for (rank = 0; rank < 2; rank++) {
            const file_report *r = file_of(fc, rank);
            snprintf(message, sizeof message, "%s on disk, rank %d: fd %d, %d links, %lld bytes (disk_bytes %lld), %ld of %ld "
                     "pages cached, %d entries in the directory", offload_name(file_offload[fc]), rank, r->fd_found, r->links,
                     r->size, r->disk_bytes, r->resident, r->pages, r->entries);
            TEST_ASSERT_TRUE_MESSAGE(r->fd_found >= 0, message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, r->links, message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, r->entries, message);
            TEST_ASSERT_TRUE_MESSAGE(r->size == r->disk_bytes && r->size > 0, message);
            TEST_ASSERT_TRUE_MESSAGE(r->pages > 0, message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, (int)r->resident, message);
        }
}

/* Rank 1's file cut short: its step (or, parameters on disk, its first gather) fails with
   FSDP_ERR_IO naming the file, the offset and the bytes; read-only, its first write fails so,
   naming the error. Rank 0 fails in its next collective naming rank 1. */
static void test_offload_short_read_fails_the_step_naming_file_offset_and_bytes_and_the_peer_names_the_rank(void) {
    int fc;
    for (fc = 0; fc < FILE_CASES; fc++) {
        const file_report *r0 = file_of(fc, 0), *r1 = file_of(fc, 1);
        snprintf(message, sizeof message, "%s on disk, rank 1: %s (%s)", offload_name(file_offload[fc]),
                 fsdp_result_name(r1->step_rc), r1->step_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_IO, r1->step_rc, message);
        TEST_ASSERT_TRUE_MESSAGE(contains(r1->step_error, file_read_only[fc] ? "writing" : "short read") &&
                                     contains(r1->step_error, file_read_only[fc] ? "Bad file descriptor" : "reading") &&
                                     contains(r1->step_error, "at offset") &&
                                     contains(r1->step_error, " bytes") && contains(r1->step_error, "offload file of rank 1") &&
                                     contains(r1->step_error, offload_dir),
                                 message);
        snprintf(message, sizeof message, "%s on disk, rank 0: %s (%s)", offload_name(file_offload[fc]),
                 fsdp_result_name(r0->step_rc), r0->step_error);
        TEST_ASSERT_NOT_EQUAL_MESSAGE(0, r0->step_rc, message);
        TEST_ASSERT_TRUE_MESSAGE(contains(r0->step_error, "rank 1"), message);
        snprintf(message, sizeof message, "%s on disk: the checkpoint saved before the fault: %s, %s", offload_name(file_offload[fc]),
                 r0->ckpt_rc ? fsdp_result_name(r0->ckpt_rc) : "saved",
                 r0->ckpt_before == r0->ckpt_after ? "untouched" : "changed by the failure");
        TEST_ASSERT_TRUE_MESSAGE(!r0->ckpt_rc && r0->ckpt_before != 0 && r0->ckpt_before == r0->ckpt_after, message);
    }
}

/* ---------------------------------------------------------------------------------------------
   refused at init: a directory in RAM, none, one too small
   --------------------------------------------------------------------------------------------- */
static int init_one_rank(const char *dir, int allow_tmpfs, char *error, size_t size) {
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 1, 0};
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    net n;
    int rc;
    if ((rc = open_one_rank_comm(&comm, "offload")) != 0 || (rc = net_build(&n)) != 0) return rc ? rc : FSDP_ERR_STATE;
    desc_for(&d, &c, comm);
    d.offload.dir = dir;
    d.offload.allow_tmpfs = allow_tmpfs;
    rc = fsdp_init(&ctx, n.model, &d);
    snprintf(error, size, "%s", fsdp_last_error(NULL));
    release_one_rank(&ctx, &n.model, &comm);
    return rc;
}

static void test_offload_dir_in_ram_is_refused_unless_allowed(void) {
    char error[600];
    int rc = init_one_rank("/dev/shm", 0, error, sizeof error);
    snprintf(message, sizeof message, "%s (%s)", fsdp_result_name(rc), error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(error, "/dev/shm") && contains(error, "in RAM"), message);
    rc = init_one_rank("/dev/shm", 1, error, sizeof error);
    snprintf(message, sizeof message, "with allow_tmpfs: %s (%s)", fsdp_result_name(rc), error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
}

static void test_offload_without_a_directory_fails_init_naming_FSDP_OFFLOAD_DIR(void) {
    char error[600];
    int rc;
    unsetenv("FSDP_OFFLOAD_DIR");
    rc = init_one_rank(NULL, 0, error, sizeof error);
    snprintf(message, sizeof message, "%s (%s)", fsdp_result_name(rc), error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(error, "FSDP_OFFLOAD_DIR"), message);
    setenv("FSDP_OFFLOAD_DIR", offload_dir, 1);
    rc = init_one_rank(NULL, 0, error, sizeof error);
    snprintf(message, sizeof message, "with FSDP_OFFLOAD_DIR: %s (%s)", fsdp_result_name(rc), error);
    unsetenv("FSDP_OFFLOAD_DIR");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
}

/* A 64 KiB filesystem (a tmpfs mounted for the test: root only) cannot hold the state. */
static void test_offload_dir_too_small_fails_init_naming_the_bytes_needed_and_free(void) {
    char small[600], error[600];
    int rc;
    snprintf(small, sizeof small, "%s/small", offload_dir);
    if (mkdir(small, 0700) != 0 || mount("fsdp-test", small, "tmpfs", 0, "size=64k") != 0) {
        rmdir(small);
        TEST_IGNORE_MESSAGE("cannot mount a small tmpfs (needs root)");
    }
    rc = init_one_rank(small, 1, error, sizeof error);
    umount(small);
    rmdir(small);
    snprintf(message, sizeof message, "%s (%s)", fsdp_result_name(rc), error);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_NO_SPACE, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(error, "bytes") && contains(error, "free") && contains(error, "need"), message);
}

/* ---------------------------------------------------------------------------------------------
   another user's directory: no ownership check (unlike checkpoints and traces), because the file
   has no name there: O_TMPFILE (or made and unlinked at once), mode 0600, this user's
   --------------------------------------------------------------------------------------------- */
#define NOBODY 65534

typedef struct intruder_report {
    char dir[600], fd_path[64];
    int stage, entries, opened, open_errno;
} intruder_report;

/* The other user: becomes NOBODY, lists the directory and opens the rank's file through /proc
   (the only way to it left). */
static int intrude(void *arg) {
    intruder_report *r = (intruder_report *)arg;
    int fd;
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) return 3;
    r->stage = 1;
    r->entries = count_entries(r->dir, NULL);
    fd = open(r->fd_path, O_RDONLY | O_CLOEXEC);
    r->opened = fd >= 0;
    r->open_errno = errno;
    if (fd >= 0) close(fd);
    r->stage = 2;
    return 0;
}

/* Offloading into a directory of uid 65534 that every user can write in (mode 0777, no sticky
   bit) works, and leaves that user nothing: the directory lists no entry, the file is this
   user's with mode 0600, and its /proc/<pid>/fd link does not open for them. Root only. */
static void test_offload_into_another_users_directory_leaves_them_no_way_to_the_file(void) {
    intruder_report *r = (intruder_report *)map_shared(sizeof(intruder_report));
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 1, 0};
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    struct stat st;
    net n;
    pid_t child;
    int rc, fd, status = -1;
    if (geteuid() != 0) TEST_IGNORE_MESSAGE("needs root (a directory of another user, and becoming that user)");
    snprintf(r->dir, sizeof r->dir, "%s/theirs", offload_dir);
    TEST_ASSERT_EQUAL_INT(0, mkdir(r->dir, 0700));
    TEST_ASSERT_EQUAL_INT(0, chmod(r->dir, 0777));
    TEST_ASSERT_EQUAL_INT(0, chown(r->dir, NOBODY, NOBODY));
    TEST_ASSERT_EQUAL_INT(0, chmod(offload_dir, 0711)); /* NOBODY may pass through */
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm, "offload-theirs"));
    TEST_ASSERT_EQUAL_INT(0, net_build(&n));
    desc_for(&d, &c, comm);
    d.offload.dir = r->dir;
    rc = fsdp_init(&ctx, n.model, &d);
    fd = find_offload_fd();
    snprintf(r->fd_path, sizeof r->fd_path, "/proc/%d/fd/%d", (int)getpid(), fd);
    child = rc == 0 && fd >= 0 ? spawn(intrude, r, 10) : -1;
    if (child > 0) status = reap(child, 10000);
    if (fd >= 0) fstat(fd, &st);
    release_one_rank(&ctx, &n.model, &comm);
    chmod(offload_dir, 0700);
    rmdir(r->dir);
    snprintf(message, sizeof message, "fsdp_init: %s (%s); offload fd %d; the other user's child: status %d, stage %d, %d "
             "entries, %s opened: %d (%s)", fsdp_result_name(rc), fsdp_last_error(NULL), fd, status, r->stage, r->entries,
             r->fd_path, r->opened, strerror(r->open_errno));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(fd >= 0 && status == 0 && r->stage == 2, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, r->entries, message);
    TEST_ASSERT_FALSE_MESSAGE(r->opened, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, (int)st.st_uid, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0600, (int)(st.st_mode & 07777), message);
}

/* ---------------------------------------------------------------------------------------------
   the step behind the next forward: iterations back to back, the learning rate changed at once
   --------------------------------------------------------------------------------------------- */
enum { BEHIND_KINDS = 6, BEHIND_CONFIGS = 4 * BEHIND_KINDS };
typedef struct behind_report {
    int done;
    char error[300];
    float after[NELEM];
} behind_report;
static behind_report *behind; /* [MAX_WORLD + 1][BEHIND_CONFIGS][MAX_WORLD] */

/* Configuration k: every strategy with nothing, the optimizer state, and everything on disk, and
   with everything in RAM but the update behind all the same (overlap_step); then bf16 state in
   RAM, in place and behind (overlap_step). */
static run_config behind_config(int k) {
    static const fsdp_strategy strategies[4] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_HYBRID_SHARD};
    static const int offloads[BEHIND_KINDS] = {0, OFF_OPT, OFF_ALL, 0, 0, 0};
    int kind = k % BEHIND_KINDS;
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 0, 0};
    c.strategy = strategies[k / BEHIND_KINDS];
    c.offload = offloads[kind];
    c.overlap_step = kind == 3 || kind == 5;
    if (kind >= 4) c.state_dtype = FSDP_BF16;
    return c;
}
/* The configuration k's bits must equal: its strategy's in RAM of the same state dtype. */
static int behind_twin(int k) { return k % BEHIND_KINDS >= 4 ? k - k % BEHIND_KINDS + 4 : k - k % BEHIND_KINDS; }

/* STEPS iterations with nothing in between that waits for the update (fsdp_set_lr right after
   fsdp_step, then fsdp_zero_grad, then the next forward), gathered at the end only. */
static int behind_rank(fsdp_comm *comm, void *arg) {
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm), k, step, rc = 0;
    (void)arg;
    for (k = 0; k < BEHIND_CONFIGS; k++) {
        behind_report *r = &behind[(world * BEHIND_CONFIGS + k) * MAX_WORLD + rank];
        run_config c = behind_config(k);
        fsdp_ctx *ctx = NULL;
        net n;
        if ((rc = open_config(comm, &c, &n, &ctx, r->error, sizeof r->error)) != 0) continue;
        for (step = 0; step < STEPS && !rc; step++) {
            rc = pass(ctx, &n, rank, step);
            if (!rc) rc = fsdp_step(ctx, 1.0f, NULL);
            if (!rc) rc = fsdp_set_lr(ctx, 0.01f / (float)(step + 2)); /* the running update keeps its own */
            if (!rc) rc = fsdp_zero_grad(ctx);
        }
        if (!rc) rc = gather_net(ctx, &n, r->after);
        if (rc) snprintf(r->error, sizeof r->error, "%.280s", fsdp_last_error(ctx));
        r->done = !rc;
        fsdp_destroy(ctx);
        fsdp_model_destroy(n.model);
    }
    return 0;
}

/* fn on `world` ranks over shared memory; the test fails if the launch did. */
static void launch_shm_checked(int world, fsdp_rank_fn fn) {
    fsdp_launch_status status;
    int rc = launch_ranks(world, FSDP_BACKEND_SHM, TIMEOUT_MS, fn, NULL, &status);
    snprintf(message, sizeof message, "P=%d: %s", world, status.message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
}

static void test_the_update_behind_the_next_forward_gives_the_bits_of_one_in_ram(void) {
    int world, k, rank;
    for (world = 2; world <= MAX_WORLD; world += 2) {
        launch_shm_checked(world, behind_rank);
        for (k = 0; k < BEHIND_CONFIGS; k++)
            for (rank = 0; rank < world; rank++) {
                const behind_report *r = &behind[(world * BEHIND_CONFIGS + k) * MAX_WORLD + rank];
                const behind_report *ram = &behind[(world * BEHIND_CONFIGS + behind_twin(k)) * MAX_WORLD + rank];
                run_config c = behind_config(k);
                char what[200];
                describe(what, sizeof what, &c, world);
                snprintf(message, sizeof message, "%s, rank %d: %s", what, rank, r->done ? "differs from in RAM" : r->error);
                TEST_ASSERT_TRUE_MESSAGE(r->done && ram->done, message);
                TEST_ASSERT_EQUAL_MEMORY_MESSAGE(ram->after, r->after, sizeof r->after, message);
            }
    }
}

/* Where the update ran, from rank 0's trace: the thread ("tid") of its "optimizer step" events,
   -1 if it has none, -2 if they ran on two threads. */
static int overlap_with_trace(fsdp_comm *comm, void *arg) {
    int rank = fsdp_comm_rank(comm), step, rc;
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 0, 0};
    fsdp_desc d;
    fsdp_ctx *ctx = NULL;
    net n;
    c.overlap_step = *(const int *)arg;
    if (net_build(&n) != 0) return 1;
    desc_for(&d, &c, comm);
    d.trace_dir = offload_dir;
    rc = fsdp_init(&ctx, n.model, &d);
    for (step = 0; step < 2 && !rc; step++) rc = iterate(ctx, &n, rank, step, NULL);
    fsdp_destroy(ctx); /* (writes the trace) */
    fsdp_model_destroy(n.model);
    return rc ? 1 : 0;
}
static int update_thread(int overlap_step) {
    char path[700], line[4096];
    fsdp_launch_status status;
    int rc, tid = -1;
    FILE *f;
    snprintf(path, sizeof path, "%s/trace-rank00000.json", offload_dir);
    rc = launch_ranks(2, FSDP_BACKEND_SHM, TIMEOUT_MS, overlap_with_trace, &overlap_step, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    TEST_ASSERT_NOT_NULL_MESSAGE(f = fopen(path, "r"), path);
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "\"tid\":");
        int t;
        if (!strstr(line, "\"name\":\"optimizer step\"") || !at) continue;
        t = atoi(at + 6);
        tid = tid == -1 || tid == t ? t : -2;
    }
    fclose(f);
    remove(path);
    snprintf(path, sizeof path, "%s/trace-rank00001.json", offload_dir);
    remove(path);
    return tid;
}

/* overlap_step: with everything in RAM, the update runs on the step thread (the trace's tid 2),
   as with offload; without it, on the calling thread (tid 0). (Its bits: the test before.) */
static void test_overlap_step_runs_the_update_on_the_step_thread(void) {
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, update_thread(0), "without overlap_step: the compute thread");
    TEST_ASSERT_EQUAL_INT_MESSAGE(2, update_thread(1), "with overlap_step: the step thread");
}

/* A slow optimizer of our own (SGD, 10 ms a call: one call per unit), so that a forward that did
   not wait for its unit's update would read the old weights. */
static void slow_sgd_update(const fsdp_optimizer_step *s) {
    struct timespec nap = {0, 10 * 1000 * 1000};
    size_t i;
    nanosleep(&nap, NULL);
    for (i = 0; i < s->count; i++) s->param[i] -= s->lr * s->grad[i];
}
static const fsdp_optimizer slow_sgd = {"slow_sgd", {NULL}, NULL, NULL, NULL, slow_sgd_update};

typedef struct waits_report {
    int done;
    char error[300];
    float after[2][2][NELEM]; /* FULL_SHARD with forward prefetch, NO_SHARD; without overlap_step, with it */
} waits_report;
static waits_report *waits; /* [MAX_WORLD + 1][MAX_WORLD] */

/* A pass whose gradients come from the weights as forward saw them (each block's, copied between
   its forward hooks): a forward that read a block before its update changes them. */
static int forward_seen_pass(fsdp_ctx *ctx, const net *n, int rank, int step) {
    static float seen[BLOCKS][WEIGHT];
    int b, i, rc;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0) return rc;
    for (b = 0; b < n->blocks; b++) {
        const float *w;
        if ((rc = fsdp_pre_forward(ctx, n->block[b])) != 0) return rc;
        if ((w = fsdp_param(ctx, n->weight[b])) != NULL) memcpy(seen[b], w, sizeof seen[b]);
        if ((rc = fsdp_post_forward(ctx, n->block[b])) != 0) return rc;
    }
    if ((rc = fsdp_post_forward(ctx, 0)) != 0 || (rc = fsdp_pre_backward(ctx, 0)) != 0) return rc;
    for (b = n->blocks - 1; b >= 0; b--) {
        float *g;
        if ((rc = fsdp_pre_backward(ctx, n->block[b])) != 0) return rc;
        for (i = 0, g = fsdp_grad(ctx, n->weight[b]); g && i < WEIGHT; i++)
            g[i] += made_up_grad(n->weight[b], i, rank, step) + 0.5f * seen[b][i];
        if ((rc = fsdp_post_backward(ctx, n->block[b])) != 0) return rc;
    }
    return fsdp_post_backward(ctx, 0);
}

/* FULL_SHARD with forward prefetch (the comm thread gathers a unit before the compute thread
   reaches it: the gather's own wait matters) and NO_SHARD (units compute on their masters: the
   hook's wait matters), each without overlap_step and with it. */
static int waits_rank(fsdp_comm *comm, void *arg) {
    static const fsdp_strategy strategies[2] = {FSDP_FULL_SHARD, FSDP_NO_SHARD};
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm), k, step, rc = 0;
    waits_report *r = &waits[world * MAX_WORLD + rank];
    (void)arg;
    for (k = 0; k < 4 && !rc; k++) {
        run_config c = {FSDP_FULL_SHARD, FSDP_SGD, FSDP_F32, 0, 0};
        fsdp_desc d;
        fsdp_ctx *ctx = NULL;
        net n;
        if (net_build(&n) != 0) return 1;
        c.strategy = strategies[k / 2];
        desc_for(&d, &c, comm);
        d.forward_prefetch = 1;
        d.optimizer.kind = FSDP_OPTIMIZER_CUSTOM;
        d.optimizer.custom = &slow_sgd;
        d.optimizer.momentum = 0;
        d.overlap_step = k % 2;
        rc = fsdp_init(&ctx, n.model, &d);
        for (step = 0; step < STEPS && !rc; step++) {
            rc = forward_seen_pass(ctx, &n, rank, step);
            if (!rc) rc = fsdp_step(ctx, 1.0f, NULL);
            if (!rc) rc = fsdp_zero_grad(ctx);
        }
        if (!rc) rc = gather_net(ctx, &n, r->after[k / 2][k % 2]);
        if (rc) snprintf(r->error, sizeof r->error, "%s, overlap_step %d: %.250s", fsdp_strategy_name(c.strategy), k % 2,
                         fsdp_last_error(ctx));
        fsdp_destroy(ctx);
        fsdp_model_destroy(n.model);
    }
    r->done = !rc;
    return rc ? 1 : 0;
}

/* overlap_step with an update slower than the forward: every block's gather (FULL_SHARD) or
   forward (NO_SHARD) waits for that block's update, so the training is the bits of the one in
   place, at P = 2 and 4. */
static void test_overlap_step_each_gather_waits_for_its_units_update(void) {
    int world, rank, k;
    for (world = 2; world <= MAX_WORLD; world += 2) {
        launch_shm_checked(world, waits_rank);
        for (rank = 0; rank < world; rank++)
            for (k = 0; k < 2; k++) {
                const waits_report *r = &waits[world * MAX_WORLD + rank];
                snprintf(message, sizeof message, "P=%d %s rank %d: %s", world, k ? "NO_SHARD" : "FULL_SHARD", rank,
                         r->done ? "differs from in place" : r->error);
                TEST_ASSERT_TRUE_MESSAGE(r->done, message);
                TEST_ASSERT_EQUAL_MEMORY_MESSAGE(r->after[k][0], r->after[k][1], sizeof r->after[k][0], message);
            }
    }
}

/* ---------------------------------------------------------------------------------------------
   gradients and parameters on disk: accumulation, clipping twice, a skipped step, set by hand
   --------------------------------------------------------------------------------------------- */
enum { ACCUM_CASES = 3, ACCUM_WORLDS = 3 };
static const int accum_offload[ACCUM_CASES] = {0, OFF_GRAD, OFF_ALL};
static const int accum_world[ACCUM_WORLDS] = {1, 2, 4};
static const fsdp_strategy accum_strategy[ACCUM_WORLDS] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_HYBRID_SHARD};
static int accum_case, accum_wi;

typedef struct accum_report {
    int done, skipped[STEPS], shard_null, grad_shard_null;
    char error[300];
    double norm[STEPS][3]; /* clip_grad_norm twice, then the step's */
    float after[STEPS][NELEM];
} accum_report;
static accum_report *accum; /* [ACCUM_CASES][ACCUM_WORLDS][MAX_WORLD] */

/* The parameters set by hand first: scale in full from rank 0, block 1's weight slice by slice.
   Then each step: two passes (accumulating), clip_grad_norm to 0.5 and again to 0.3, a third
   pass onto the clipped gradients, the step clipping to 0.8; at step 2 rank 0's third pass makes
   a gradient NaN, so every rank skips the step. */
static int accum_rank(fsdp_comm *comm, void *arg) {
    int rank = fsdp_comm_rank(comm), step, rc, i;
    accum_report *r = &accum[(accum_case * ACCUM_WORLDS + accum_wi) * MAX_WORLD + rank];
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 0, 0};
    float full[WEIGHT];
    fsdp_param_info info;
    fsdp_step_report report;
    fsdp_ctx *ctx = NULL;
    net n;
    (void)arg;
    memset(&info, 0, sizeof info);
    c.strategy = accum_strategy[accum_wi];
    c.offload = accum_offload[accum_case];
    if (open_config(comm, &c, &n, &ctx, r->error, sizeof r->error) != 0) return 1;
    for (i = 0; i < WEIGHT; i++) full[i] = 0.001f * (float)(i % 97) - 0.04f;
    rc = fsdp_set_param_full(ctx, n.scale, rank == 0 ? full : NULL);
    if (!rc) rc = fsdp_param_info_get(ctx, n.weight[1], &info);
    if (!rc) rc = fsdp_set_param_shard(ctx, n.weight[1], full + info.shard_begin);
    r->shard_null = info.shard == NULL;
    r->grad_shard_null = info.grad_shard == NULL;
    for (step = 0; step < STEPS && !rc; step++) {
        rc = pass(ctx, &n, rank, step);
        if (!rc) rc = pass(ctx, &n, rank, step + 10);
        if (!rc) rc = fsdp_clip_grad_norm(ctx, 0.5f, &r->norm[step][0]);
        if (!rc) rc = fsdp_clip_grad_norm(ctx, 0.3f, &r->norm[step][1]);
        poison_rank = step == 2 ? 0 : -1;
        if (!rc) rc = pass(ctx, &n, rank, step + 20);
        poison_rank = -1;
        if (!rc) rc = fsdp_step(ctx, 0.8f, &report);
        r->norm[step][2] = report.grad_norm;
        r->skipped[step] = report.skipped;
        if (!rc) rc = fsdp_zero_grad(ctx);
        if (!rc) rc = gather_net(ctx, &n, r->after[step]);
    }
    if (rc) snprintf(r->error, sizeof r->error, "step %d: %.280s", step, fsdp_last_error(ctx));
    r->done = !rc;
    fsdp_destroy(ctx);
    fsdp_model_destroy(n.model);
    return rc ? 1 : 0;
}

static const accum_report *accum_of(int ac, int wi, int rank) {
    static int launched;
    const accum_report *r = &accum[(ac * ACCUM_WORLDS + wi) * MAX_WORLD + rank];
    fsdp_launch_status status;
    if (!launched) {
        launched = 1;
        for (accum_case = 0; accum_case < ACCUM_CASES; accum_case++)
            for (accum_wi = 0; accum_wi < ACCUM_WORLDS; accum_wi++)
                launch_ranks(accum_world[accum_wi], FSDP_BACKEND_SHM, TIMEOUT_MS, accum_rank, NULL, &status);
    }
    snprintf(message, sizeof message, "P=%d %s, %s on disk, rank %d: %s", accum_world[wi], fsdp_strategy_name(accum_strategy[wi]),
             offload_name(accum_offload[ac]), rank, r->error);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

static void test_gradients_on_disk_accumulate_clip_twice_and_skip_a_step_bitwise_as_in_ram(void) {
    int ac, wi, rank, step, e;
    for (wi = 0; wi < ACCUM_WORLDS; wi++)
        for (rank = 0; rank < accum_world[wi]; rank++) {
            const accum_report *ram = accum_of(0, wi, rank);
            TEST_ASSERT_TRUE_MESSAGE(ram->skipped[2] && !ram->skipped[1] && !ram->skipped[3], "step 2 (only) is skipped");
            TEST_ASSERT_TRUE_MESSAGE(ram->norm[0][1] < ram->norm[0][0] && ram->norm[0][0] > 0.5, "the first clip clips");
            for (ac = 1; ac < ACCUM_CASES; ac++) {
                const accum_report *r = accum_of(ac, wi, rank);
                for (step = 0; step < STEPS; step++) {
                    snprintf(message, sizeof message, "P=%d %s, %s on disk, rank %d, step %d: norms %.17g %.17g %.17g, in RAM "
                             "%.17g %.17g %.17g", accum_world[wi], fsdp_strategy_name(accum_strategy[wi]),
                             offload_name(accum_offload[ac]), rank, step, r->norm[step][0], r->norm[step][1],
                             r->norm[step][2], ram->norm[step][0], ram->norm[step][1], ram->norm[step][2]);
                    TEST_ASSERT_TRUE_MESSAGE(r->skipped[step] == ram->skipped[step], message);
                    if (!ram->skipped[step]) TEST_ASSERT_EQUAL_MEMORY_MESSAGE(ram->norm[step], r->norm[step], sizeof r->norm[step], message);
                    for (e = 0; e < NELEM; e++)
                        if (memcmp(&r->after[step][e], &ram->after[step][e], sizeof(float)) != 0) {
                            snprintf(message + strlen(message), sizeof message - strlen(message),
                                     ": element %d = %.9g, in RAM %.9g", e, r->after[step][e], ram->after[step][e]);
                            TEST_FAIL_MESSAGE(message);
                        }
                }
            }
        }
}

/* fsdp_param_info: the slices of what is on disk are NULL (and the values set by hand through
   fsdp_set_param_full and fsdp_set_param_shard are in the bitwise runs above). */
static void test_param_info_slices_are_null_for_what_is_on_disk(void) {
    int ac, wi;
    for (ac = 0; ac < ACCUM_CASES; ac++)
        for (wi = 0; wi < ACCUM_WORLDS; wi++) {
            const accum_report *r = accum_of(ac, wi, 0);
            snprintf(message, sizeof message, "%s on disk: shard %s, grad_shard %s", offload_name(accum_offload[ac]),
                     r->shard_null ? "NULL" : "set", r->grad_shard_null ? "NULL" : "set");
            TEST_ASSERT_TRUE_MESSAGE(r->shard_null == ((accum_offload[ac] & OFF_PARAM) != 0), message);
            TEST_ASSERT_TRUE_MESSAGE(r->grad_shard_null == ((accum_offload[ac] & OFF_GRAD) != 0), message);
        }
}

/* ---------------------------------------------------------------------------------------------
   checkpoints of offloaded state, and bf16 state's rounding
   --------------------------------------------------------------------------------------------- */
typedef struct ckpt_report {
    int done;
    char error[300];
    float after[NELEM];     /* the load runs: after one more step */
    float exp_avg[NELEM];   /* the rounding runs: state after one step, read from the saved file */
    float params[NELEM];
} ckpt_report;
enum { SAVE_RAM, SAVE_DISK, LOAD_RAM_FROM_DISK, LOAD_DISK_FROM_RAM, ROUND_F32, ROUND_BF16, CKPT_RUNS };
static ckpt_report *ckpt; /* [CKPT_RUNS][MAX_WORLD] */
static int ckpt_run;

static void ckpt_paths(int from_disk, char *full, char *sharded, size_t size) {
    snprintf(full, size, "%s/%s.safetensors", offload_dir, from_disk ? "disk" : "ram");
    snprintf(sharded, size, "%s/%s-sharded", offload_dir, from_disk ? "disk" : "ram");
}

/* SAVE_*: two steps at P = 2, saved full and sharded with the optimizer state. LOAD_*: at P = 4
   the other kind's sharded checkpoint loaded, one more step. ROUND_*: one AdamW step at P = 1,
   saved full (the state as f32 values). */
static int ckpt_rank(fsdp_comm *comm, void *arg) {
    int run = ckpt_run, rank = fsdp_comm_rank(comm), step, rc = 0;
    ckpt_report *r = &ckpt[run * MAX_WORLD + rank];
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, run == ROUND_BF16 ? FSDP_BF16 : FSDP_F32,
                    run == SAVE_DISK || run == LOAD_DISK_FROM_RAM ? OFF_ALL : 0, 0};
    char full[600], sharded[600];
    fsdp_save_options so;
    fsdp_load_options lo;
    fsdp_ctx *ctx = NULL;
    net n;
    (void)arg;
    memset(&so, 0, sizeof so);
    memset(&lo, 0, sizeof lo);
    so.with_optimizer = lo.with_optimizer = lo.strict = 1;
    if (open_config(comm, &c, &n, &ctx, r->error, sizeof r->error) != 0) return 1;
    if (run == SAVE_RAM || run == SAVE_DISK || run >= ROUND_F32) {
        for (step = 0; step < (run >= ROUND_F32 ? 1 : 2) && !rc; step++) rc = iterate(ctx, &n, rank, step, NULL);
        ckpt_paths(run == SAVE_DISK, full, sharded, sizeof full);
        if (run >= ROUND_F32) snprintf(full, sizeof full, "%s/round-%d.safetensors", offload_dir, run);
        if (!rc) rc = fsdp_save_full(ctx, full, &so);
        if (!rc && run < ROUND_F32) rc = fsdp_save_sharded(ctx, sharded, &so);
        if (!rc && run >= ROUND_F32) rc = gather_net(ctx, &n, r->params);
    } else {
        ckpt_paths(run == LOAD_RAM_FROM_DISK, full, sharded, sizeof full);
        rc = fsdp_load_sharded(ctx, sharded, &lo, NULL);
        if (!rc) rc = iterate(ctx, &n, rank, 2, NULL);
        if (!rc) rc = gather_net(ctx, &n, r->after);
    }
    if (rc) snprintf(r->error, sizeof r->error, "%.280s", fsdp_last_error(ctx));
    r->done = !rc;
    fsdp_destroy(ctx);
    fsdp_model_destroy(n.model);
    return rc ? 1 : 0;
}

static void ensure_ckpt_runs(void) {
    static int launched;
    static const int worlds[CKPT_RUNS] = {2, 2, 4, 4, 1, 1};
    fsdp_launch_status status;
    if (launched) return;
    launched = 1;
    for (ckpt_run = 0; ckpt_run < CKPT_RUNS; ckpt_run++) launch_ranks(worlds[ckpt_run], FSDP_BACKEND_SHM, TIMEOUT_MS, ckpt_rank, NULL, &status);
}

static const ckpt_report *ckpt_of(int run, int rank) {
    const ckpt_report *r = &ckpt[run * MAX_WORLD + rank];
    ensure_ckpt_runs();
    snprintf(message, sizeof message, "run %d rank %d: %s", run, rank, r->error);
    TEST_ASSERT_TRUE_MESSAGE(r->done, message);
    return r;
}

/* The full file saved from offloaded state is the file saved from RAM, byte for byte. */
static void test_full_checkpoint_of_offloaded_state_is_the_bytes_of_one_from_ram(void) {
    char ram_full[600], disk_full[600], sharded[600];
    unsigned char *a, *b;
    size_t na = 0, nb = 0;
    ckpt_of(SAVE_RAM, 0);
    ckpt_of(SAVE_DISK, 0);
    ckpt_paths(0, ram_full, sharded, sizeof ram_full);
    ckpt_paths(1, disk_full, sharded, sizeof disk_full);
    a = read_whole_file(ram_full, &na);
    b = read_whole_file(disk_full, &nb);
    TEST_ASSERT_NOT_NULL(a);
    TEST_ASSERT_NOT_NULL(b);
    TEST_ASSERT_EQUAL_MESSAGE(na, nb, "file sizes");
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(a, b, na, "full checkpoints from RAM and from disk");
    free(a);
    free(b);
}

/* Sharded checkpoints from either, loaded at P = 4 into the other kind, continue alike. */
static void test_sharded_checkpoints_load_into_offloaded_state_at_another_world_size_and_continue_alike(void) {
    int rank;
    for (rank = 0; rank < 4; rank++) {
        const ckpt_report *a = ckpt_of(LOAD_RAM_FROM_DISK, rank), *b = ckpt_of(LOAD_DISK_FROM_RAM, rank);
        snprintf(message, sizeof message, "rank %d: a step after loading, state in RAM from disk's save, on disk from RAM's", rank);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(a->after, b->after, sizeof a->after, message);
    }
}

/* bf16 state: the update runs in f32 on the widened state (so one step from zero state gives the
   f32 parameters), and the new state is the f32 result rounded to the nearest bf16, ties to even. */
static void test_bf16_state_is_the_f32_update_rounded_to_nearest_even(void) {
    char path[2][600], name[64];
    int run, b, i, checked = 0;
    float *state[2];
    const ckpt_report *f = ckpt_of(ROUND_F32, 0), *h = ckpt_of(ROUND_BF16, 0);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(f->params, h->params, sizeof f->params, "parameters after the first step");
    for (run = 0; run < 2; run++) snprintf(path[run], sizeof path[run], "%s/round-%d.safetensors", offload_dir, ROUND_F32 + run);
    state[0] = (float *)calloc(WEIGHT, sizeof(float));
    state[1] = (float *)calloc(WEIGHT, sizeof(float));
    for (b = 0; b < BLOCKS; b++) {
        for (run = 0; run < 2; run++) {
            fsdp_st_file *file = NULL;
            char err[300];
            int rc = fsdp_st_open(&file, path[run], err, sizeof err);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, err);
            snprintf(name, sizeof name, "%d.weight.exp_avg_sq", b);
            rc = fsdp_st_read(file, fsdp_st_find(file, name), 0, WEIGHT, state[run], err, sizeof err);
            fsdp_st_close(file);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, err);
        }
        for (i = 0; i < WEIGHT; i++) {
            float want = fsdp_bf16_to_f32(reference_bf16(state[0][i]));
            if (memcmp(&want, &state[1][i], sizeof want) != 0) {
                snprintf(message, sizeof message, "%d.weight.exp_avg_sq[%d]: f32 state %.9g, bf16 state %.9g, nearest bf16 %.9g",
                         b, i, state[0][i], state[1][i], want);
                TEST_FAIL_MESSAGE(message);
            }
            checked += state[0][i] != want; /* rounding happened */
        }
    }
    free(state[0]);
    free(state[1]);
    TEST_ASSERT_TRUE_MESSAGE(checked > 1000, "most f32 states are not bf16 values, so the rounding was exercised");
}

/* ---------------------------------------------------------------------------------------------
   the estimator and AUTO
   --------------------------------------------------------------------------------------------- */
static void test_estimate_of_offloaded_state_counts_disk_and_stream_apart_and_matches_init(void) {
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 1, 0};
    fsdp_memory_stats est, st, ram;
    memset(&st, 0, sizeof st);
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    net n;
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm, "estimate"));
    TEST_ASSERT_EQUAL_INT(0, net_build(&n));
    desc_for(&d, &c, comm);
    TEST_ASSERT_EQUAL_INT(0, fsdp_memory_estimate(n.model, &d, 1, &est));
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp_init(&ctx, n.model, &d), fsdp_last_error(NULL));
    fsdp_memory_stats_get(ctx, &st);
    d.offload.optimizer = 0;
    TEST_ASSERT_EQUAL_INT(0, fsdp_memory_estimate(n.model, &d, 1, &ram));
    release_one_rank(&ctx, &n.model, &comm);
    snprintf(message, sizeof message, "estimate: RAM persistent %zu, disk %zu, stream %zu; init: %zu, %zu, %zu; all in RAM: "
             "optimizer %zu", est.persistent_bytes, est.disk_bytes, est.stream_bytes, st.persistent_bytes, st.disk_bytes,
             st.stream_bytes, ram.optimizer_bytes);
    TEST_ASSERT_EQUAL_MESSAGE(st.persistent_bytes, est.persistent_bytes, message);
    TEST_ASSERT_EQUAL_MESSAGE(st.disk_bytes, est.disk_bytes, message);
    TEST_ASSERT_EQUAL_MESSAGE(st.stream_bytes, est.stream_bytes, message);
    TEST_ASSERT_EQUAL_MESSAGE(0, est.optimizer_bytes, message);
    TEST_ASSERT_TRUE_MESSAGE(est.disk_bytes >= ram.optimizer_bytes, message);
    TEST_ASSERT_EQUAL_MESSAGE(ram.persistent_bytes - ram.optimizer_bytes, est.persistent_bytes, message);
}

/* A budget between what FULL_SHARD needs with its optimizer state in RAM and on disk: the
   strategies alone do not fit, fsdp_fit_budget offloads and says so, and fsdp_init's AUTO trains
   with the state on disk. */
static void test_auto_offloads_the_optimizer_state_when_no_strategy_fits_in_ram(void) {
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 0, 0};
    fsdp_memory_stats in_ram, on_disk, st;
    memset(&st, 0, sizeof st);
    fsdp_strategy strategy;
    fsdp_comm *comm = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d, fit;
    char why[400];
    size_t budget;
    net n;
    int rc;
    TEST_ASSERT_EQUAL_INT(0, open_one_rank_comm(&comm, "auto"));
    TEST_ASSERT_EQUAL_INT(0, net_build(&n));
    desc_for(&d, &c, comm);
    TEST_ASSERT_EQUAL_INT(0, fsdp_memory_estimate(n.model, &d, 1, &in_ram));
    d.offload.optimizer = 1;
    TEST_ASSERT_EQUAL_INT(0, fsdp_memory_estimate(n.model, &d, 1, &on_disk));
    d.offload.optimizer = 0;
    budget = (in_ram.peak_bytes + on_disk.peak_bytes) / 2;
    rc = fsdp_strategy_for_budget(n.model, &d, 1, budget, &strategy, why, sizeof why);
    snprintf(message, sizeof message, "strategies alone: %s (%s)", fsdp_result_name(rc), why);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_OUT_OF_MEMORY, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(why, "offload to a local disk"), message);
    rc = fsdp_fit_budget(n.model, &d, 1, budget, &fit, why, sizeof why);
    snprintf(message, sizeof message, "fit: %s (%s)", fsdp_result_name(rc), why);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(fit.offload.optimizer && fit.strategy == FSDP_FULL_SHARD, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(why, "offloaded"), message);
    d.strategy = FSDP_STRATEGY_AUTO;
    d.memory_budget = budget;
    rc = fsdp_init(&ctx, n.model, &d);
    snprintf(message, sizeof message, "AUTO: %s (%s)", fsdp_result_name(rc), fsdp_last_error(NULL));
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, message);
    fsdp_memory_stats_get(ctx, &st);
    release_one_rank(&ctx, &n.model, &comm);
    TEST_ASSERT_TRUE_MESSAGE(st.disk_bytes > 0 && st.optimizer_bytes == 0 && st.peak_bytes <= budget, message);
}

/* AUTO at P = 2 with a budget (arg): one step, its memory statistics. */
typedef struct auto_report {
    int rc;
    char error[400];
    fsdp_memory_stats st;
} auto_report;
static auto_report *auto_runs; /* [2] */

static int auto_rank(fsdp_comm *comm, void *arg) {
    auto_report *r = &auto_runs[fsdp_comm_rank(comm)];
    run_config c = {FSDP_STRATEGY_AUTO, FSDP_ADAMW, FSDP_F32, 0, 0};
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    net n;
    if (net_build_sized(&n, BIG_WEIGHT, BIG_BLOCKS) != 0) return 1;
    desc_for(&d, &c, comm);
    d.memory_budget = *(const size_t *)arg;
    if ((r->rc = fsdp_init(&ctx, n.model, &d)) != 0) snprintf(r->error, sizeof r->error, "init: %.380s", fsdp_last_error(NULL));
    else if ((r->rc = iterate(ctx, &n, fsdp_comm_rank(comm), 0, NULL)) != 0)
        snprintf(r->error, sizeof r->error, "step: %.380s", fsdp_last_error(ctx));
    fsdp_memory_stats_get(ctx, &r->st);
    fsdp_destroy(ctx);
    fsdp_model_destroy(n.model);
    return r->rc ? 1 : 0;
}

/* Budgets between the levels at P = 2, for weights large enough that the state outweighs the
   streaming's buffers: with the optimizer state on disk FULL_SHARD does not fit,
   so fsdp_fit_budget puts the gradients there too, then the parameters too (the least offload
   that fits), and says what; below everything on disk it fails saying what that needs. AUTO
   trains at the middle budget. */
static void test_auto_offloads_gradients_then_parameters_when_the_optimizer_state_on_disk_is_not_enough(void) {
    static const int levels[3] = {OFF_OPT, OFF_OPT | OFF_GRAD, OFF_ALL};
    run_config c = {FSDP_FULL_SHARD, FSDP_ADAMW, FSDP_F32, 0, 0};
    fsdp_memory_stats est[3];
    fsdp_launch_status status;
    fsdp_desc d, fit;
    char why[400];
    size_t budget;
    net n;
    int i, rc;
    TEST_ASSERT_EQUAL_INT(0, net_build_sized(&n, BIG_WEIGHT, BIG_BLOCKS));
    for (i = 0; i < 3; i++) {
        c.offload = levels[i];
        desc_for(&d, &c, NULL);
        TEST_ASSERT_EQUAL_INT(0, fsdp_memory_estimate(n.model, &d, 2, &est[i]));
    }
    snprintf(message, sizeof message, "peaks: optimizer state on disk %zu, and gradients %zu, and parameters %zu",
             est[0].peak_bytes, est[1].peak_bytes, est[2].peak_bytes);
    TEST_ASSERT_TRUE_MESSAGE(est[0].peak_bytes > est[1].peak_bytes && est[1].peak_bytes > est[2].peak_bytes, message);
    c.offload = 0;
    desc_for(&d, &c, NULL);
    for (i = 1; i < 3; i++) {
        budget = (est[i - 1].peak_bytes + est[i].peak_bytes) / 2;
        rc = fsdp_fit_budget(n.model, &d, 2, budget, &fit, why, sizeof why);
        snprintf(message, sizeof message, "budget %zu: %s (%s)", budget, fsdp_result_name(rc), why);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, message);
        TEST_ASSERT_TRUE_MESSAGE(fit.strategy == FSDP_FULL_SHARD && fit.offload.optimizer && fit.offload.grads &&
                                     fit.offload.params == (i == 2), message);
        TEST_ASSERT_TRUE_MESSAGE(contains(why, i == 2 ? "the parameters, gradients and optimizer state offloaded"
                                                      : "the optimizer state and gradients offloaded"), message);
    }
    rc = fsdp_fit_budget(n.model, &d, 2, est[2].peak_bytes - 1, &fit, why, sizeof why);
    fsdp_model_destroy(n.model);
    snprintf(message, sizeof message, "below everything on disk: %s (%s)", fsdp_result_name(rc), why);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_OUT_OF_MEMORY, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(why, "with the parameters, gradients and optimizer state on disk it needs"), message);
    budget = (est[0].peak_bytes + est[1].peak_bytes) / 2;
    rc = launch_ranks(2, FSDP_BACKEND_SHM, TIMEOUT_MS, auto_rank, &budget, &status);
    for (i = 0; i < 2; i++) {
        const fsdp_memory_stats *st = &auto_runs[i].st;
        snprintf(message, sizeof message, "AUTO rank %d: %s (%s); grads %zu, optimizer %zu, params %zu bytes in RAM, peak %zu of "
                 "%zu", i, fsdp_result_name(auto_runs[i].rc), auto_runs[i].error, st->grad_shard_bytes, st->optimizer_bytes,
                 st->param_shard_bytes, st->peak_bytes, budget);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, auto_runs[i].rc, message);
        TEST_ASSERT_TRUE_MESSAGE(st->grad_shard_bytes == 0 && st->optimizer_bytes == 0 && st->param_shard_bytes > 0 &&
                                     st->peak_bytes <= budget, message);
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, status.message);
}

int main(void) {
    char exe[400], *slash;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int rc;
    if (n <= 0) return 1;
    exe[n] = 0;
    if ((slash = strrchr(exe, '/')) != NULL) *slash = 0;
    snprintf(offload_dir, sizeof offload_dir, "%s/offload-test-XXXXXX", exe);
    if (!mkdtemp(offload_dir)) {
        fprintf(stderr, "mkdtemp(%s): %s\n", offload_dir, strerror(errno));
        return 1;
    }
    build_configs();
    shared = (shared_results *)map_shared(sizeof *shared);
    special = (special_results *)map_shared(sizeof *special);
    ckpt = (ckpt_report *)map_shared(sizeof *ckpt * CKPT_RUNS * MAX_WORLD);
    auto_runs = (auto_report *)map_shared(sizeof *auto_runs * 2);
    behind = (behind_report *)map_shared(sizeof *behind * (MAX_WORLD + 1) * BEHIND_CONFIGS * MAX_WORLD);
    waits = (waits_report *)map_shared(sizeof *waits * (MAX_WORLD + 1) * MAX_WORLD);
    accum = (accum_report *)map_shared(sizeof *accum * ACCUM_CASES * ACCUM_WORLDS * MAX_WORLD);
    UNITY_BEGIN();
    RUN_TEST(test_offloaded_f32_state_trains_bitwise_as_in_ram_for_every_strategy_at_P_1_2_4);
    RUN_TEST(test_offloaded_bf16_state_trains_bitwise_as_bf16_state_in_ram);
    RUN_TEST(test_everything_on_disk_over_sockets_trains_bitwise_as_in_ram_over_shm);
    RUN_TEST(test_bf16_state_trains_close_to_but_not_bitwise_as_f32_state);
    RUN_TEST(test_offloaded_state_is_counted_on_disk_and_the_stream_within_ram_bytes);
    RUN_TEST(test_offload_file_is_unlinked_of_the_reserved_size_and_outside_the_page_cache);
    RUN_TEST(test_offload_short_read_fails_the_step_naming_file_offset_and_bytes_and_the_peer_names_the_rank);
    RUN_TEST(test_offload_dir_in_ram_is_refused_unless_allowed);
    RUN_TEST(test_offload_without_a_directory_fails_init_naming_FSDP_OFFLOAD_DIR);
    RUN_TEST(test_offload_dir_too_small_fails_init_naming_the_bytes_needed_and_free);
    RUN_TEST(test_offload_into_another_users_directory_leaves_them_no_way_to_the_file);
    RUN_TEST(test_the_update_behind_the_next_forward_gives_the_bits_of_one_in_ram);
    RUN_TEST(test_overlap_step_runs_the_update_on_the_step_thread);
    RUN_TEST(test_overlap_step_each_gather_waits_for_its_units_update);
    RUN_TEST(test_gradients_on_disk_accumulate_clip_twice_and_skip_a_step_bitwise_as_in_ram);
    RUN_TEST(test_param_info_slices_are_null_for_what_is_on_disk);
    RUN_TEST(test_full_checkpoint_of_offloaded_state_is_the_bytes_of_one_from_ram);
    RUN_TEST(test_sharded_checkpoints_load_into_offloaded_state_at_another_world_size_and_continue_alike);
    RUN_TEST(test_bf16_state_is_the_f32_update_rounded_to_nearest_even);
    RUN_TEST(test_estimate_of_offloaded_state_counts_disk_and_stream_apart_and_matches_init);
    RUN_TEST(test_auto_offloads_the_optimizer_state_when_no_strategy_fits_in_ram);
    RUN_TEST(test_auto_offloads_gradients_then_parameters_when_the_optimizer_state_on_disk_is_not_enough);
    rc = UNITY_END();
    remove_tree(offload_dir);
    for (file_case = 0; file_case < FILE_CASES; file_case++) { /* the checkpoints of the fault runs, beside it */
        char dir[600];
        file_ckpt_dir(dir, sizeof dir);
        remove_tree(dir);
    }
    return rc;
}
