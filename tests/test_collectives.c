/* test_collectives.c - specification of fsdp.h's collectives: every op, dtype, world size,
   count and in-place variant gives results BITWISE equal to a serial reference computed here in
   plain C, over both the shared-memory and the socket backend.

   How it runs: one fsdp_launch_ex per (backend, world size). Its ranks run the whole matrix of
   cases and write their outputs (or what failed) into a MAP_SHARED region the parent mapped
   before the launch; the parent then computes the reference, compares bits and keeps a verdict
   per family of ops. Each test function asserts one family's verdict, so a failure names what
   failed. Children never assert.

   The shm matrix runs three times: with buffers from malloc, from fsdp_comm_alloc on every rank
   (peers read them directly: zero-copy), and from fsdp_comm_alloc on even ranks only (direct and
   staged peers mixed in every op). The results must be the same bits.

   The reference reduces in rank order, ((x0 + x1) + x2) + x3, in fp32, then rounds once to the
   dtype (AVG: the fp32 sum divided by the world size, then rounded; MAX: NaN wins). Its
   conversions are written here, independently of the library's.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_collectives.c \
              tests/unity/unity.c -o /tmp/test_collectives -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <sys/mount.h>
#include <sys/resource.h>

#define BIG_COUNT ((size_t)1000003)
#define MAX_WORLD 4
#define MAX_CASES 256
#define GUARD_BYTES 64
#define GUARD_FILL 0xA5
#define GARBAGE_FILL 0x5C
#define MATRIX_TIMEOUT_MS 20000   /* bound on any single wait; only reached if something hangs */
#define SHORT_TIMEOUT_MS 3000
#define NAN_INDEX_ON_FIRST_RANK 2 /* where MAX cases inject a NaN, per count-sized block */
#define NAN_INDEX_ON_LAST_RANK 5
#define CROSS_BACKEND_WORLD 3
#define NO_RESULT (-1000)         /* a case the child could not even start (malloc failed) */

/* A "backend" here is a backend and where the ranks' buffers come from. */
enum { SHM = 0, SOCKET = 1, SHM_SHARED = 2, SHM_MIXED = 3, BACKENDS = 4 };
static const fsdp_backend_kind backend_kinds[BACKENDS] = {FSDP_BACKEND_SHM, FSDP_BACKEND_SOCKET, FSDP_BACKEND_SHM,
                                                          FSDP_BACKEND_SHM};
static const char *const backend_names[BACKENDS] = {"shm", "socket", "shm with fsdp_comm_alloc buffers",
                                                    "shm with fsdp_comm_alloc buffers on even ranks"};

enum family {
    FAM_ALL_GATHER,
    FAM_REDUCE_SCATTER,
    FAM_ALL_REDUCE,
    FAM_BROADCAST,
    FAM_IN_PLACE,
    FAM_BARRIER,
    FAM_NAN_MAX,
    FAM_ZERO_COUNT,
    FAMILIES
};

typedef struct test_case {
    int family;
    fsdp_coll_kind kind;
    fsdp_dtype dtype;
    fsdp_reduce_op op;
    int root;
    size_t count;                  /* as passed to the call */
    int in_place;
    int inject_nan;
    int barrier_ordinal;           /* 1 for the first barrier case, ... */
    uint32_t salt;                 /* input values depend on (salt, rank, element) */
    size_t out_elems;              /* elements of output kept per rank */
    size_t out_offset[MAX_WORLD];  /* byte offset of each rank's output in the outputs area */
} test_case;

/* What one rank reports about one case. */
typedef struct case_report {
    int done;
    int rc;
    int send_intact;               /* the send buffer is unchanged (not in-place cases) */
    int guard_intact;              /* nothing written past the end of the receive buffer */
    long arrivals_seen;            /* barrier: arrivals counted right after the barrier returned */
    int shared_as_asked;           /* fsdp_comm_alloc buffers are shared exactly where they should be */
    char error[240];
} case_report;

#define INVALID_CALLS 14
static const char *const invalid_call_names[INVALID_CALLS] = {
    "all_gather with send NULL",          "all_gather with recv NULL",
    "reduce_scatter with send NULL",      "reduce_scatter with recv NULL",
    "all_reduce with send NULL",          "all_reduce with recv NULL",
    "broadcast with buf NULL",            "broadcast with root -1",
    "broadcast with root == world size",  "all_reduce with dtype 99",
    "all_gather with dtype 99",           "reduce_scatter with dtype 99",
    "broadcast with dtype 99",            "all_reduce with reduce op 99"};

typedef struct invalid_args_report {
    int done;
    int rc[INVALID_CALLS];
    int after_rc;                  /* a valid all_reduce right after the invalid calls */
    float after_sum;
    int after_status;              /* fsdp_comm_status after that */
    char after_error[240];
} invalid_args_report;

/* Everything a launch's ranks need; lives in the parent's memory before the fork, so the children
   inherit it. The region is MAP_SHARED, so what they write there comes back to the parent. */
typedef struct job {
    int world;
    int backend;                   /* index into backend_kinds: also says where buffers come from */
    const test_case *cases;
    size_t ncases;
    int check_invalid_args;
    unsigned char *region;
    size_t region_bytes;
    long *barrier_arrivals;
    invalid_args_report *invalid;  /* [MAX_WORLD] */
    case_report *reports;          /* [ncases][world] */
    unsigned char *outputs;
} job;

/* ---------------------------------------------------------------------------------------------
   reference conversions (independent of fsdp.h)
   --------------------------------------------------------------------------------------------- */
static float load_element(const void *buffer, fsdp_dtype dtype, size_t index) {
    if (dtype == FSDP_F32) return ((const float *)buffer)[index];
    if (dtype == FSDP_BF16) return float_of((uint32_t)((const uint16_t *)buffer)[index] << 16);
    return f16_decode_table[((const uint16_t *)buffer)[index]];
}

static void store_element(void *buffer, fsdp_dtype dtype, size_t index, float value) {
    if (dtype == FSDP_F32) ((float *)buffer)[index] = value;
    else if (dtype == FSDP_BF16) ((uint16_t *)buffer)[index] = reference_bf16(value);
    else ((uint16_t *)buffer)[index] = reference_f16(value);
}

static int element_is_nan(const void *buffer, fsdp_dtype dtype, size_t index) {
    return isnan(load_element(buffer, dtype, index));
}

/* ---------------------------------------------------------------------------------------------
   inputs: a small integer hash scaled into [-2, 2), full f32 precision, never tiny (so that a
   MAX never compares +0 with -0)
   --------------------------------------------------------------------------------------------- */
static void fill_input(void *buffer, fsdp_dtype dtype, uint32_t salt, int rank, int world,
                       size_t elems, size_t count, int inject_nan) {
    uint32_t stream = mix32(salt * 0x9E3779B9u + (uint32_t)rank * 0x85EBCA6Bu + 0x165667B1u);
    size_t i;
    for (i = 0; i < elems; i++) {
        uint32_t h = mix32((uint32_t)i ^ stream);
        float value = (float)((double)h * (4.0 / 4294967296.0) - 2.0);
        if (fabsf(value) < 1.0f / 1024.0f) value = 0.75f;
        if (inject_nan && count > NAN_INDEX_ON_LAST_RANK) {
            if (rank == 0 && i % count == NAN_INDEX_ON_FIRST_RANK) value = NAN;
            if (rank == world - 1 && i % count == NAN_INDEX_ON_LAST_RANK) value = NAN;
        }
        store_element(buffer, dtype, i, value);
    }
}

/* ---------------------------------------------------------------------------------------------
   the matrix of cases
   --------------------------------------------------------------------------------------------- */
static const char *family_name(int family) {
    static const char *const names[FAMILIES] = {"all_gather", "reduce_scatter", "all_reduce",
                                                "broadcast",  "in-place",       "barrier",
                                                "NaN max",    "count zero"};
    return names[family];
}

static void describe_case(char *out, size_t size, const test_case *tc, int world, const char *backend) {
    char detail[64] = "";
    if (tc->kind == FSDP_COLL_BARRIER) {
        snprintf(out, size, "[%s P=%d] barrier #%d", backend, world, tc->barrier_ordinal);
        return;
    }
    if (tc->kind == FSDP_COLL_REDUCE_SCATTER || tc->kind == FSDP_COLL_ALL_REDUCE)
        snprintf(detail, sizeof detail, " %s", op_name(tc->op));
    else if (tc->kind == FSDP_COLL_BROADCAST)
        snprintf(detail, sizeof detail, " root %d", tc->root);
    snprintf(out, size, "[%s P=%d] %s %s%s count %lu%s%s", backend, world, kind_name(tc->kind),
             dtype_label(tc->dtype), detail, (unsigned long)tc->count, tc->in_place ? " in place" : "",
             tc->inject_nan ? " with NaN inputs" : "");
}

static size_t add_case(test_case *cases, size_t n, int family, fsdp_coll_kind kind, fsdp_dtype dtype,
                       fsdp_reduce_op op, int root, size_t count, int in_place) {
    test_case *tc = &cases[n];
    memset(tc, 0, sizeof *tc);
    tc->family = family;
    tc->kind = kind;
    tc->dtype = dtype;
    tc->op = op;
    tc->root = root;
    tc->count = count;
    tc->in_place = in_place;
    tc->salt = (uint32_t)(n * 7919u + 13u);
    return n + 1;
}

/* Lays the outputs out one after another, 64-byte aligned; returns the total bytes. */
static size_t layout_outputs(test_case *cases, size_t ncases, int world) {
    size_t offset = 0, c;
    int r;
    for (c = 0; c < ncases; c++) {
        test_case *tc = &cases[c];
        size_t bytes;
        if (tc->kind == FSDP_COLL_ALL_GATHER) tc->out_elems = (size_t)world * tc->count;
        else if (tc->kind == FSDP_COLL_BARRIER) tc->out_elems = 0;
        else tc->out_elems = tc->count;
        bytes = (tc->out_elems * element_size(tc->dtype) + 63) & ~(size_t)63;
        for (r = 0; r < world; r++) {
            tc->out_offset[r] = offset;
            offset += bytes;
        }
    }
    return offset;
}

static size_t build_matrix(test_case *cases, int world) {
    static const fsdp_dtype dtypes[3] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const size_t counts[3] = {1, 7, BIG_COUNT};
    static const fsdp_reduce_op ops[3] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
    static const fsdp_coll_kind zero_kinds[4] = {FSDP_COLL_ALL_GATHER, FSDP_COLL_REDUCE_SCATTER,
                                                  FSDP_COLL_ALL_REDUCE, FSDP_COLL_BROADCAST};
    size_t n = 0;
    int d, c, o, k, barriers = 0;
    for (d = 0; d < 3; d++) {
        fsdp_dtype dtype = dtypes[d];
        for (c = 0; c < 3; c++) {
            size_t count = counts[c];
            n = add_case(cases, n, FAM_ALL_GATHER, FSDP_COLL_ALL_GATHER, dtype, FSDP_SUM, 0, count, 0);
            for (o = 0; o < 3; o++)
                n = add_case(cases, n, FAM_REDUCE_SCATTER, FSDP_COLL_REDUCE_SCATTER, dtype, ops[o], 0, count, 0);
            for (o = 0; o < 3; o++)
                n = add_case(cases, n, FAM_ALL_REDUCE, FSDP_COLL_ALL_REDUCE, dtype, ops[o], 0, count, 0);
            n = add_case(cases, n, FAM_BROADCAST, FSDP_COLL_BROADCAST, dtype, FSDP_SUM, 0, count, 0);
            n = add_case(cases, n, FAM_BROADCAST, FSDP_COLL_BROADCAST, dtype, FSDP_SUM, world - 1, count, 0);
            n = add_case(cases, n, FAM_IN_PLACE, FSDP_COLL_ALL_GATHER, dtype, FSDP_SUM, 0, count, 1);
            for (o = 0; o < 3; o++) {
                if (count == BIG_COUNT && ops[o] != FSDP_SUM) continue; /* keep the run short */
                n = add_case(cases, n, FAM_IN_PLACE, FSDP_COLL_REDUCE_SCATTER, dtype, ops[o], 0, count, 1);
                n = add_case(cases, n, FAM_IN_PLACE, FSDP_COLL_ALL_REDUCE, dtype, ops[o], 0, count, 1);
            }
        }
        n = add_case(cases, n, FAM_BARRIER, FSDP_COLL_BARRIER, dtype, FSDP_SUM, 0, 0, 0);
        cases[n - 1].barrier_ordinal = ++barriers;
        n = add_case(cases, n, FAM_NAN_MAX, FSDP_COLL_REDUCE_SCATTER, dtype, FSDP_MAX, 0, 7, 0);
        cases[n - 1].inject_nan = 1;
        n = add_case(cases, n, FAM_NAN_MAX, FSDP_COLL_ALL_REDUCE, dtype, FSDP_MAX, 0, 7, 0);
        cases[n - 1].inject_nan = 1;
        n = add_case(cases, n, FAM_NAN_MAX, FSDP_COLL_ALL_REDUCE, dtype, FSDP_MAX, 0, 7, 1);
        cases[n - 1].inject_nan = 1;
        for (k = 0; k < 4; k++)
            n = add_case(cases, n, FAM_ZERO_COUNT, zero_kinds[k], dtype, FSDP_SUM, 0, 0, 0);
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
   what the ranks run
   --------------------------------------------------------------------------------------------- */
static void run_barrier_case(fsdp_comm *comm, const job *j, const test_case *tc, case_report *report) {
    int rank = fsdp_comm_rank(comm);
    /* one rank arrives late; a barrier that lets the others through early shows as a low count */
    if (rank == tc->barrier_ordinal % j->world) sleep_ms(30);
    __atomic_add_fetch(j->barrier_arrivals, 1, __ATOMIC_SEQ_CST);
    report->rc = fsdp_barrier(comm);
    report->arrivals_seen = __atomic_load_n(j->barrier_arrivals, __ATOMIC_SEQ_CST);
}

/* Whether this rank's case buffers come from fsdp_comm_alloc (which every rank must call alike). */
static int uses_comm_memory(const job *j, int rank) {
    return j->backend == SHM_SHARED || (j->backend == SHM_MIXED && rank % 2 == 0);
}

/* A case buffer: malloc, or fsdp_comm_alloc. In the shared modes every rank calls
   fsdp_comm_alloc (and later fsdp_comm_free) alike, as the API asks; odd ranks of the mixed mode
   hold theirs unused (*held) and work in malloc memory. */
static unsigned char *case_alloc(fsdp_comm *comm, const job *j, size_t bytes, void **held) {
    *held = NULL;
    if (j->backend != SHM_SHARED && j->backend != SHM_MIXED) return malloc(bytes);
    if (fsdp_comm_alloc(comm, bytes, held) != FSDP_SUCCESS) return NULL;
    return uses_comm_memory(j, fsdp_comm_rank(comm)) ? (unsigned char *)*held : malloc(bytes);
}

static void case_free(fsdp_comm *comm, unsigned char *ptr, void *held) {
    if (ptr != held) free(ptr);
    fsdp_comm_free(comm, held);
}

static void run_case(fsdp_comm *comm, const job *j, size_t index) {
    const test_case *tc = &j->cases[index];
    int world = j->world, rank = fsdp_comm_rank(comm);
    case_report *report = &j->reports[index * (size_t)world + (size_t)rank];
    size_t es = element_size(tc->dtype), count = tc->count;
    size_t send_elems = 0, buffer_elems = 0;
    unsigned char *send = NULL, *send_copy = NULL, *buffer = NULL;
    void *held_buffer = NULL, *held_send = NULL;
    const unsigned char *output = NULL;
    int rc;

    report->send_intact = 1;
    report->guard_intact = 1;
    report->shared_as_asked = 1;
    if (tc->kind == FSDP_COLL_BARRIER) {
        run_barrier_case(comm, j, tc, report);
        goto finish;
    }
    switch (tc->kind) {
    case FSDP_COLL_ALL_GATHER:
        send_elems = tc->in_place ? 0 : count;
        buffer_elems = (size_t)world * count;
        break;
    case FSDP_COLL_REDUCE_SCATTER:
        send_elems = tc->in_place ? 0 : (size_t)world * count;
        buffer_elems = tc->in_place ? (size_t)world * count : count;
        break;
    default: /* all_reduce, broadcast */
        send_elems = (tc->in_place || tc->kind == FSDP_COLL_BROADCAST) ? 0 : count;
        buffer_elems = count;
        break;
    }
    buffer = case_alloc(comm, j, buffer_elems * es + GUARD_BYTES, &held_buffer);
    send = case_alloc(comm, j, send_elems * es + es, &held_send);
    send_copy = malloc(send_elems * es + es);
    if (buffer && send)
        report->shared_as_asked = fsdp_comm_is_shared(comm, buffer, buffer_elems * es + GUARD_BYTES) ==
                                  (uses_comm_memory(j, rank) && world > 1);
    if (!buffer || !send || !send_copy) {
        report->rc = NO_RESULT;
        snprintf(report->error, sizeof report->error, "rank %d: malloc failed", rank);
        goto finish;
    }
    memset(buffer, GARBAGE_FILL, buffer_elems * es);
    memset(buffer + buffer_elems * es, GUARD_FILL, GUARD_BYTES);
    fill_input(send, tc->dtype, tc->salt, rank, world, send_elems, count, tc->inject_nan);
    memcpy(send_copy, send, send_elems * es);

    switch (tc->kind) {
    case FSDP_COLL_ALL_GATHER:
        if (tc->in_place) {
            unsigned char *own = buffer + (size_t)rank * count * es;
            fill_input(own, tc->dtype, tc->salt, rank, world, count, count, tc->inject_nan);
            rc = fsdp_all_gather(comm, own, buffer, count, tc->dtype);
        } else {
            rc = fsdp_all_gather(comm, send, buffer, count, tc->dtype);
        }
        output = buffer;
        break;
    case FSDP_COLL_REDUCE_SCATTER:
        if (tc->in_place) {
            unsigned char *own = buffer + (size_t)rank * count * es;
            fill_input(buffer, tc->dtype, tc->salt, rank, world, buffer_elems, count, tc->inject_nan);
            rc = fsdp_reduce_scatter(comm, buffer, own, count, tc->dtype, tc->op);
            output = own;
        } else {
            rc = fsdp_reduce_scatter(comm, send, buffer, count, tc->dtype, tc->op);
            output = buffer;
        }
        break;
    case FSDP_COLL_ALL_REDUCE:
        if (tc->in_place) {
            fill_input(buffer, tc->dtype, tc->salt, rank, world, count, count, tc->inject_nan);
            rc = fsdp_all_reduce(comm, buffer, buffer, count, tc->dtype, tc->op);
        } else {
            rc = fsdp_all_reduce(comm, send, buffer, count, tc->dtype, tc->op);
        }
        output = buffer;
        break;
    default: /* broadcast: the root's buffer is the data; the others start with other values */
        if (rank == tc->root)
            fill_input(buffer, tc->dtype, tc->salt, rank, world, count, count, 0);
        else
            fill_input(buffer, tc->dtype, tc->salt ^ 0x5EEDu, rank, world, count, count, 0);
        rc = fsdp_broadcast(comm, buffer, count, tc->dtype, tc->root);
        output = buffer;
        break;
    }
    report->rc = rc;
    report->guard_intact = bytes_all_equal(buffer + buffer_elems * es, GUARD_BYTES, GUARD_FILL);
    report->send_intact = memcmp(send, send_copy, send_elems * es) == 0;
    memcpy(j->outputs + tc->out_offset[rank], output, tc->out_elems * es);
finish:
    if (report->rc != FSDP_SUCCESS && report->error[0] == '\0') {
        snprintf(report->error, sizeof report->error, "rank %d got %s: ", rank, fsdp_result_name(report->rc));
        append_text(report->error, sizeof report->error, fsdp_comm_last_error(comm));
    }
    report->done = 1;
    case_free(comm, buffer, held_buffer);
    case_free(comm, send, held_send);
    free(send_copy);
}

static void run_invalid_args(fsdp_comm *comm, const job *j) {
    int rank = fsdp_comm_rank(comm), world = j->world;
    invalid_args_report *report = &j->invalid[rank];
    float send[4 * MAX_WORLD] = {0}, recv[4 * MAX_WORLD] = {0};
    float own = (float)(rank + 1);
    report->rc[0] = fsdp_all_gather(comm, NULL, recv, 4, FSDP_F32);
    report->rc[1] = fsdp_all_gather(comm, send, NULL, 4, FSDP_F32);
    report->rc[2] = fsdp_reduce_scatter(comm, NULL, recv, 4, FSDP_F32, FSDP_SUM);
    report->rc[3] = fsdp_reduce_scatter(comm, send, NULL, 4, FSDP_F32, FSDP_SUM);
    report->rc[4] = fsdp_all_reduce(comm, NULL, recv, 4, FSDP_F32, FSDP_SUM);
    report->rc[5] = fsdp_all_reduce(comm, send, NULL, 4, FSDP_F32, FSDP_SUM);
    report->rc[6] = fsdp_broadcast(comm, NULL, 4, FSDP_F32, 0);
    report->rc[7] = fsdp_broadcast(comm, recv, 4, FSDP_F32, -1);
    report->rc[8] = fsdp_broadcast(comm, recv, 4, FSDP_F32, world);
    report->rc[9] = fsdp_all_reduce(comm, send, recv, 4, (fsdp_dtype)99, FSDP_SUM);
    report->rc[10] = fsdp_all_gather(comm, send, recv, 4, (fsdp_dtype)99);
    report->rc[11] = fsdp_reduce_scatter(comm, send, recv, 4, (fsdp_dtype)99, FSDP_SUM);
    report->rc[12] = fsdp_broadcast(comm, recv, 4, (fsdp_dtype)99, 0);
    report->rc[13] = fsdp_all_reduce(comm, send, recv, 4, FSDP_F32, (fsdp_reduce_op)99);
    report->after_rc = fsdp_all_reduce(comm, &own, &report->after_sum, 1, FSDP_F32, FSDP_SUM);
    report->after_status = fsdp_comm_status(comm);
    append_text(report->after_error, sizeof report->after_error, fsdp_comm_last_error(comm));
    report->done = 1;
}

static int rank_main(fsdp_comm *comm, void *arg) {
    const job *j = arg;
    size_t c;
    if (fsdp_comm_size(comm) != j->world) return 2; /* shows as a failed launch */
    if (j->check_invalid_args) run_invalid_args(comm, j);
    for (c = 0; c < j->ncases; c++) run_case(comm, j, c);
    return 0; /* failures are in the reports: every case gets reported */
}

/* ---------------------------------------------------------------------------------------------
   launching a job
   --------------------------------------------------------------------------------------------- */
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Maps the shared region for cases[] at this world size and runs one launch. */
static int run_job(job *j, int backend, int world, test_case *cases, size_t ncases, int timeout_ms,
                   int check_invalid_args, fsdp_launch_status *status) {
    size_t outputs_bytes = layout_outputs(cases, ncases, world);
    size_t header = align64(sizeof(long)) + align64(sizeof(invalid_args_report) * MAX_WORLD) +
                    align64(sizeof(case_report) * ncases * (size_t)world);
    memset(j, 0, sizeof *j);
    memset(status, 0, sizeof *status);
    j->world = world;
    j->backend = backend;
    j->cases = cases;
    j->ncases = ncases;
    j->check_invalid_args = check_invalid_args;
    j->region_bytes = header + outputs_bytes + 64;
    j->region = mmap(NULL, j->region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j->region == MAP_FAILED) {
        j->region = NULL;
        snprintf(status->message, sizeof status->message, "mmap of %lu bytes failed",
                 (unsigned long)j->region_bytes);
        return NO_RESULT;
    }
    j->barrier_arrivals = (long *)j->region;
    j->invalid = (invalid_args_report *)(j->region + align64(sizeof(long)));
    j->reports = (case_report *)((unsigned char *)j->invalid +
                                 align64(sizeof(invalid_args_report) * MAX_WORLD));
    j->outputs = j->region + header;
    return launch_ranks(world, backend_kinds[backend], timeout_ms, rank_main, j, status);
}

static void release_job(job *j) {
    if (j->region) munmap(j->region, j->region_bytes);
    j->region = NULL;
}

/* ---------------------------------------------------------------------------------------------
   the serial reference and the comparison
   --------------------------------------------------------------------------------------------- */
/* Fills expected with what every rank must hold (for reduce_scatter, the whole reduced vector:
   rank r's part starts at r*count). */
static void compute_reference(unsigned char *expected, const test_case *tc, int world) {
    size_t es = element_size(tc->dtype), count = tc->count;
    size_t i;
    int r;
    if (tc->kind == FSDP_COLL_ALL_GATHER) {
        for (r = 0; r < world; r++)
            fill_input(expected + (size_t)r * count * es, tc->dtype, tc->salt, r, world, count, count,
                       tc->inject_nan);
    } else if (tc->kind == FSDP_COLL_BROADCAST) {
        fill_input(expected, tc->dtype, tc->salt, tc->root, world, count, count, 0);
    } else if (tc->kind == FSDP_COLL_REDUCE_SCATTER || tc->kind == FSDP_COLL_ALL_REDUCE) {
        size_t n = tc->kind == FSDP_COLL_REDUCE_SCATTER ? (size_t)world * count : count;
        float *sum = malloc(n * sizeof *sum + sizeof *sum);
        unsigned char *input = malloc(n * es + es);
        if (!sum || !input) {
            fprintf(stderr, "test_collectives: out of memory in the reference\n");
            exit(3);
        }
        for (r = 0; r < world; r++) {
            fill_input(input, tc->dtype, tc->salt, r, world, n, count, tc->inject_nan);
            for (i = 0; i < n; i++) {
                float x = load_element(input, tc->dtype, i);
                if (r == 0) sum[i] = x;
                else if (tc->op == FSDP_MAX) sum[i] = isnan(sum[i]) ? sum[i] : isnan(x) ? x : (x > sum[i] ? x : sum[i]);
                else sum[i] = sum[i] + x;
            }
        }
        for (i = 0; i < n; i++) {
            float value = tc->op == FSDP_AVG ? sum[i] / (float)world : sum[i];
            store_element(expected, tc->dtype, i, value);
        }
        free(sum);
        free(input);
    }
}

static void format_element(char *out, size_t size, const void *buffer, fsdp_dtype dtype, size_t index) {
    if (dtype == FSDP_F32)
        snprintf(out, size, "0x%08X (%.9g)", (unsigned)bits_of(((const float *)buffer)[index]),
                 (double)((const float *)buffer)[index]);
    else
        snprintf(out, size, "0x%04X (%.6g)", ((const uint16_t *)buffer)[index],
                 (double)load_element(buffer, dtype, index));
}

/* Returns the index of the first element that differs, or (size_t)-1. With NaN inputs a NaN is
   expected as any NaN; otherwise bits must match. */
static size_t first_difference(const unsigned char *expected, const unsigned char *actual, const test_case *tc,
                               size_t elems) {
    size_t es = element_size(tc->dtype), i;
    if (!tc->inject_nan && memcmp(expected, actual, elems * es) == 0) return (size_t)-1;
    for (i = 0; i < elems; i++) {
        if (tc->inject_nan && element_is_nan(expected, tc->dtype, i)) {
            if (!element_is_nan(actual, tc->dtype, i)) return i;
        } else if (memcmp(expected + i * es, actual + i * es, es) != 0) {
            return i;
        }
    }
    return (size_t)-1;
}

static verdict verdicts[BACKENDS][FAMILIES];
static int matrix_ran[BACKENDS];
static unsigned char *cross_backend_outputs[BACKENDS][2]; /* bf16 big reduce_scatter, all_reduce */
static size_t cross_backend_bytes[BACKENDS][2];

/* Checks one case on every rank against the reference; records the verdict of its family. */
static void verify_case(const job *j, size_t index, const char *backend, verdict *v) {
    const test_case *tc = &j->cases[index];
    int world = j->world, r;
    size_t es = element_size(tc->dtype);
    char name[160], what[700];
    unsigned char *expected = NULL;
    describe_case(name, sizeof name, tc, world, backend);
    if (tc->out_elems > 0) {
        size_t reference_elems = tc->kind == FSDP_COLL_REDUCE_SCATTER ? (size_t)world * tc->count : tc->out_elems;
        expected = malloc(reference_elems * es + 1);
        if (!expected) {
            fprintf(stderr, "test_collectives: out of memory\n");
            exit(3);
        }
        compute_reference(expected, tc, world);
    }
    for (r = 0; r < world; r++) {
        const case_report *report = &j->reports[index * (size_t)world + (size_t)r];
        const unsigned char *actual = j->outputs + tc->out_offset[r];
        const unsigned char *want = expected;
        size_t diff;
        if (!report->done) {
            snprintf(what, sizeof what, "%s: rank %d never reported this case", name, r);
            record(v, 0, what);
            continue;
        }
        if (report->rc != FSDP_SUCCESS) {
            snprintf(what, sizeof what, "%s: %s", name, report->error);
            record(v, 0, what);
            continue;
        }
        if (!report->guard_intact) {
            snprintf(what, sizeof what, "%s: rank %d: bytes written past the end of recv", name, r);
            record(v, 0, what);
            continue;
        }
        if (!report->shared_as_asked) {
            snprintf(what, sizeof what, "%s: rank %d: fsdp_comm_is_shared says its buffer is %sshared", name, r,
                     uses_comm_memory(j, r) && world > 1 ? "not " : "");
            record(v, 0, what);
            continue;
        }
        if (!report->send_intact) {
            snprintf(what, sizeof what, "%s: rank %d: the send buffer was modified", name, r);
            record(v, 0, what);
            continue;
        }
        if (tc->kind == FSDP_COLL_BARRIER) {
            long needed = (long)world * tc->barrier_ordinal;
            snprintf(what, sizeof what, "%s: rank %d left the barrier after %ld arrivals, before all %ld", name,
                     r, report->arrivals_seen, needed);
            record(v, report->arrivals_seen >= needed, what);
            continue;
        }
        if (tc->kind == FSDP_COLL_REDUCE_SCATTER) want = expected + (size_t)r * tc->count * es;
        diff = tc->out_elems ? first_difference(want, actual, tc, tc->out_elems) : (size_t)-1;
        if (diff != (size_t)-1) {
            char want_text[48], got_text[48];
            format_element(want_text, sizeof want_text, want, tc->dtype, diff);
            format_element(got_text, sizeof got_text, actual, tc->dtype, diff);
            snprintf(what, sizeof what, "%s: rank %d element %lu: expected %s got %s", name, r,
                     (unsigned long)diff, want_text, got_text);
            record(v, 0, what);
            continue;
        }
        record(v, 1, name);
    }
    free(expected);
}

/* Keeps the outputs of the big bf16 reduce_scatter and all_reduce (SUM, not in place) to compare
   the two backends directly. */
static void keep_cross_backend_outputs(const job *j, int backend) {
    size_t c;
    for (c = 0; c < j->ncases; c++) {
        const test_case *tc = &j->cases[c];
        int slot, r;
        size_t per_rank;
        if (tc->dtype != FSDP_BF16 || tc->count != BIG_COUNT || tc->op != FSDP_SUM || tc->in_place) continue;
        if (tc->kind == FSDP_COLL_REDUCE_SCATTER) slot = 0;
        else if (tc->kind == FSDP_COLL_ALL_REDUCE) slot = 1;
        else continue;
        per_rank = tc->out_elems * element_size(tc->dtype);
        free(cross_backend_outputs[backend][slot]);
        cross_backend_outputs[backend][slot] = malloc(per_rank * (size_t)j->world);
        if (!cross_backend_outputs[backend][slot]) continue;
        for (r = 0; r < j->world; r++)
            memcpy(cross_backend_outputs[backend][slot] + (size_t)r * per_rank, j->outputs + tc->out_offset[r],
                   per_rank);
        cross_backend_bytes[backend][slot] = per_rank * (size_t)j->world;
    }
}

static void run_matrix(int backend) {
    static test_case cases[MAX_CASES];
    int world, f;
    if (matrix_ran[backend]) return;
    matrix_ran[backend] = 1;
    /* with one rank there are no peers to share with: the plain shm run covers it */
    for (world = backend == SHM_SHARED || backend == SHM_MIXED ? 2 : 1; world <= MAX_WORLD; world++) {
        job j;
        fsdp_launch_status status;
        size_t ncases = build_matrix(cases, world), c;
        int rc = run_job(&j, backend, world, cases, ncases, MATRIX_TIMEOUT_MS, 0, &status);
        if (rc != FSDP_SUCCESS) {
            char what[400];
            snprintf(what, sizeof what, "[%s P=%d] fsdp_launch_ex returned %s: %s", backend_names[backend], world,
                     rc == NO_RESULT ? "nothing" : fsdp_result_name(rc), status.message);
            for (f = 0; f < FAMILIES; f++) record(&verdicts[backend][f], 0, what);
        }
        if (j.region) {
            for (c = 0; c < ncases; c++) verify_case(&j, c, backend_names[backend], &verdicts[backend][cases[c].family]);
            if (world == CROSS_BACKEND_WORLD) keep_cross_backend_outputs(&j, backend);
        }
        release_job(&j);
    }
}

static void assert_family_matches_reference(int backend, int family) {
    verdict *v;
    char message[1100];
    run_matrix(backend);
    v = &verdicts[backend][family];
    snprintf(message, sizeof message, "%s over %s: %d of %d rank-case checks failed; first: %s",
             family_name(family), backend_names[backend], v->failed, v->checked, v->first_failure);
    TEST_ASSERT_TRUE_MESSAGE(v->checked > 0, "no case of this family was checked");
    TEST_ASSERT_TRUE_MESSAGE(v->failed == 0, message);
}

static void assert_every_family_matches_reference(int backend) {
    int family;
    for (family = 0; family < FAMILIES; family++) assert_family_matches_reference(backend, family);
}

void setUp(void) {}
void tearDown(void) {}

/* ---------------------------------------------------------------------------------------------
   the tests: the matrix, one family and backend per test
   --------------------------------------------------------------------------------------------- */
static void test_all_gather_over_shm_equals_serial_reference_bitwise(void) {
    assert_family_matches_reference(SHM, FAM_ALL_GATHER);
}
static void test_reduce_scatter_sum_avg_max_over_shm_equals_serial_reference_bitwise(void) {
    assert_family_matches_reference(SHM, FAM_REDUCE_SCATTER);
}
static void test_all_reduce_sum_avg_max_over_shm_equals_serial_reference_bitwise(void) {
    assert_family_matches_reference(SHM, FAM_ALL_REDUCE);
}
static void test_broadcast_over_shm_from_first_and_last_root_copies_root_buffer_to_every_rank(void) {
    assert_family_matches_reference(SHM, FAM_BROADCAST);
}
static void test_in_place_collectives_over_shm_equal_serial_reference_bitwise(void) {
    assert_family_matches_reference(SHM, FAM_IN_PLACE);
}
static void test_barrier_over_shm_with_a_late_rank_returns_only_after_every_rank_arrived(void) {
    assert_family_matches_reference(SHM, FAM_BARRIER);
}
static void test_max_reduction_over_shm_with_nan_input_gives_nan(void) {
    assert_family_matches_reference(SHM, FAM_NAN_MAX);
}
static void test_collectives_over_shm_with_count_zero_succeed_and_write_nothing(void) {
    assert_family_matches_reference(SHM, FAM_ZERO_COUNT);
}

static void test_all_gather_over_socket_equals_serial_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_ALL_GATHER);
}
static void test_reduce_scatter_sum_avg_max_over_socket_equals_serial_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_REDUCE_SCATTER);
}
static void test_all_reduce_sum_avg_max_over_socket_equals_serial_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_ALL_REDUCE);
}
static void test_broadcast_over_socket_from_first_and_last_root_copies_root_buffer_to_every_rank(void) {
    assert_family_matches_reference(SOCKET, FAM_BROADCAST);
}
static void test_in_place_collectives_over_socket_equal_serial_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_IN_PLACE);
}
static void test_barrier_over_socket_with_a_late_rank_returns_only_after_every_rank_arrived(void) {
    assert_family_matches_reference(SOCKET, FAM_BARRIER);
}
static void test_max_reduction_over_socket_with_nan_input_gives_nan(void) {
    assert_family_matches_reference(SOCKET, FAM_NAN_MAX);
}
static void test_collectives_over_socket_with_count_zero_succeed_and_write_nothing(void) {
    assert_family_matches_reference(SOCKET, FAM_ZERO_COUNT);
}

/* Large ops read fsdp_comm_alloc memory straight from the peer; the rest stage as usual. */
static void test_every_collective_over_shm_with_fsdp_comm_alloc_buffers_equals_serial_reference_bitwise(void) {
    assert_every_family_matches_reference(SHM_SHARED);
}
static void test_every_collective_over_shm_with_shared_buffers_on_even_ranks_only_equals_reference_bitwise(void) {
    assert_every_family_matches_reference(SHM_MIXED);
}

/* ---------------------------------------------------------------------------------------------
   the tests: across backends and runs
   --------------------------------------------------------------------------------------------- */
static void test_big_bf16_reduce_scatter_and_all_reduce_are_bitwise_identical_over_shm_and_socket(void) {
    static const char *const slot_names[2] = {"reduce_scatter", "all_reduce"};
    int slot;
    char message[160];
    run_matrix(SHM);
    run_matrix(SOCKET);
    for (slot = 0; slot < 2; slot++) {
        snprintf(message, sizeof message, "bf16 %s SUM of %lu elements per rank at P=%d", slot_names[slot],
                 (unsigned long)BIG_COUNT, CROSS_BACKEND_WORLD);
        TEST_ASSERT_NOT_NULL_MESSAGE(cross_backend_outputs[SHM][slot], message);
        TEST_ASSERT_NOT_NULL_MESSAGE(cross_backend_outputs[SOCKET][slot], message);
        TEST_ASSERT_EQUAL_INT_MESSAGE((int)cross_backend_bytes[SHM][slot], (int)cross_backend_bytes[SOCKET][slot],
                                      message);
        TEST_ASSERT_TRUE_MESSAGE(memcmp(cross_backend_outputs[SHM][slot], cross_backend_outputs[SOCKET][slot],
                                        cross_backend_bytes[SHM][slot]) == 0,
                                 message);
    }
}

static size_t build_determinism_cases(test_case *cases) {
    size_t n = 0;
    n = add_case(cases, n, FAM_REDUCE_SCATTER, FSDP_COLL_REDUCE_SCATTER, FSDP_BF16, FSDP_SUM, 0, BIG_COUNT, 0);
    n = add_case(cases, n, FAM_ALL_REDUCE, FSDP_COLL_ALL_REDUCE, FSDP_F32, FSDP_SUM, 0, BIG_COUNT, 0);
    n = add_case(cases, n, FAM_ALL_REDUCE, FSDP_COLL_ALL_REDUCE, FSDP_F16, FSDP_AVG, 0, BIG_COUNT, 0);
    return n;
}

static void assert_two_runs_give_identical_bits(int backend, int world) {
    test_case cases[4];
    size_t ncases = build_determinism_cases(cases), c;
    job first, second;
    fsdp_launch_status status_first, status_second;
    int rc_first = run_job(&first, backend, world, cases, ncases, MATRIX_TIMEOUT_MS, 0, &status_first);
    int rc_second = run_job(&second, backend, world, cases, ncases, MATRIX_TIMEOUT_MS, 0, &status_second);
    int reported = 1, ranks_ok = 1, identical = 0;
    size_t outputs_bytes = layout_outputs(cases, ncases, world);
    if (first.region && second.region) {
        for (c = 0; c < ncases * (size_t)world; c++) {
            reported &= first.reports[c].done && second.reports[c].done;
            ranks_ok &= first.reports[c].rc == FSDP_SUCCESS && second.reports[c].rc == FSDP_SUCCESS;
        }
        identical = memcmp(first.outputs, second.outputs, outputs_bytes) == 0;
    }
    release_job(&first);
    release_job(&second);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc_first, status_first.message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc_second, status_second.message);
    TEST_ASSERT_TRUE_MESSAGE(reported, "a rank did not report every case");
    TEST_ASSERT_TRUE_MESSAGE(ranks_ok, "a collective failed");
    TEST_ASSERT_TRUE_MESSAGE(identical, "the second run's outputs differ from the first's");
}

static void test_repeated_runs_over_shm_give_identical_bits(void) { assert_two_runs_give_identical_bits(SHM, 4); }
static void test_repeated_runs_over_socket_give_identical_bits(void) {
    assert_two_runs_give_identical_bits(SOCKET, 3);
}

/* ---------------------------------------------------------------------------------------------
   the tests: whether waits spin (fsdp_comm_spins, FSDP_SPIN)
   --------------------------------------------------------------------------------------------- */
typedef struct spin_report {
    int done, rc, world_spins, split_spins, split_size;
} spin_report;

static int spin_rank_main(fsdp_comm *comm, void *arg) {
    spin_report *rep = (spin_report *)arg + fsdp_comm_rank(comm);
    fsdp_comm *half = NULL;
    int r = fsdp_comm_rank(comm);
    rep->world_spins = fsdp_comm_spins(comm);
    rep->rc = fsdp_comm_split(comm, r < 2 ? 0 : 1, r, &half); /* ranks 0-1, and rank 2 alone */
    if (rep->rc == FSDP_SUCCESS) {
        rep->split_spins = fsdp_comm_spins(half);
        rep->split_size = fsdp_comm_size(half);
    }
    fsdp_comm_destroy(half);
    rep->done = 1;
    return rep->rc;
}

/* nprocs (2 or 3) shm ranks split into ranks 0-1 and rank 2 alone under FSDP_SPIN=value (NULL:
   unset); expect for the world and the split of 2 (the split of 1 has nothing to wait for:
   never). */
static void assert_spins_of(int nprocs, const char *value, int expected) {
    spin_report *reps = (spin_report *)mmap(NULL, sizeof(spin_report) * 3, PROT_READ | PROT_WRITE,
                                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    fsdp_launch_status status;
    char message[sizeof status.message + 100];
    int r, rc;
    TEST_ASSERT_TRUE(reps != MAP_FAILED);
    memset(reps, 0, sizeof(spin_report) * 3);
    if (value) setenv("FSDP_SPIN", value, 1);
    else unsetenv("FSDP_SPIN");
    rc = launch_ranks(nprocs, FSDP_BACKEND_SHM, SHORT_TIMEOUT_MS, spin_rank_main, reps, &status);
    unsetenv("FSDP_SPIN");
    for (r = 0; r < nprocs; r++) {
        snprintf(message, sizeof message, "FSDP_SPIN=%s, rank %d: launch %s (%s), split %s", value ? value : "(unset)", r,
                 fsdp_result_name(rc), status.message, fsdp_result_name(reps[r].rc));
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, message);
        TEST_ASSERT_TRUE_MESSAGE(reps[r].done && reps[r].rc == FSDP_SUCCESS, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(expected, reps[r].world_spins, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(r < 2 ? 2 : 1, reps[r].split_size, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(r < 2 ? expected : 0, reps[r].split_spins, message);
    }
    munmap(reps, sizeof(spin_report) * 3);
}

static void assert_spins(const char *value, int expected) { assert_spins_of(3, value, expected); }

/* The CPUs this process may run on (its affinity mask). */
static int usable_cpus(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* A split's ranks share the cores with the rest of the job: its waits spin only if the whole
   job's ranks on the host have a core each (3 here), not its own 2; FSDP_SPIN forces either. */
static void test_waits_spin_only_when_the_whole_job_has_a_core_per_rank_or_as_fsdp_spin_says(void) {
    assert_spins(NULL, usable_cpus() >= 3);
    assert_spins("0", 0);
    assert_spins("1", 1);
}

/* Issue 29: the decision counts the CPUs the ranks may run on, not those online: two ranks
   pinned to one CPU (taskset -c 0: each spin would keep the other off it) do not spin, though
   the machine has more; FSDP_SPIN=1 still forces it; with the whole mask back they spin when it
   has a CPU per rank. */
static void test_waits_do_not_spin_when_the_ranks_may_run_on_one_cpu_only(void) {
    cpu_set_t saved, one;
    int cpu;
    TEST_ASSERT_EQUAL_INT(0, sched_getaffinity(0, sizeof saved, &saved));
    for (cpu = 0; cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &saved); cpu++) {}
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    TEST_ASSERT_EQUAL_INT(0, sched_setaffinity(0, sizeof one, &one)); /* the ranks inherit it */
    assert_spins_of(2, NULL, 0);
    assert_spins_of(2, "1", 1);
    TEST_ASSERT_EQUAL_INT(0, sched_setaffinity(0, sizeof saved, &saved));
    assert_spins_of(2, NULL, usable_cpus() >= 2);
}

/* ---------------------------------------------------------------------------------------------
   the tests: invalid arguments
   --------------------------------------------------------------------------------------------- */
static void assert_invalid_args_rejected_and_comm_usable(int backend, int world) {
    test_case no_cases[1];
    job j;
    fsdp_launch_status status;
    invalid_args_report reports[MAX_WORLD];
    int rc = run_job(&j, backend, world, no_cases, 0, SHORT_TIMEOUT_MS, 1, &status);
    int r, call;
    char message[400];
    memset(reports, 0, sizeof reports);
    if (j.region) memcpy(reports, j.invalid, sizeof reports);
    release_job(&j);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    for (r = 0; r < world; r++) {
        snprintf(message, sizeof message, "rank %d did not report", r);
        TEST_ASSERT_TRUE_MESSAGE(reports[r].done, message);
        for (call = 0; call < INVALID_CALLS; call++) {
            snprintf(message, sizeof message, "[%s P=%d] rank %d: %s returned %s", backend_names[backend], world, r,
                     invalid_call_names[call], fsdp_result_name(reports[r].rc[call]));
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, reports[r].rc[call], message);
        }
        snprintf(message, sizeof message, "[%s P=%d] rank %d: the valid all_reduce after the invalid calls: %s",
                 backend_names[backend], world, r, reports[r].after_error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[r].after_rc, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[r].after_status, message);
        TEST_ASSERT_TRUE_MESSAGE(reports[r].after_sum == (float)(world * (world + 1) / 2), message);
    }
}

static void test_invalid_arguments_over_shm_return_invalid_arg_and_keep_comm_usable(void) {
    assert_invalid_args_rejected_and_comm_usable(SHM, 3);
}

static void test_invalid_arguments_over_socket_return_invalid_arg_and_keep_comm_usable(void) {
    assert_invalid_args_rejected_and_comm_usable(SOCKET, 2);
}

static void test_collectives_on_null_comm_return_invalid_arg(void) {
    float send[4] = {1, 2, 3, 4}, recv[4] = {0};
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_all_gather(NULL, send, recv, 1, FSDP_F32));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_reduce_scatter(NULL, send, recv, 1, FSDP_F32, FSDP_SUM));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_all_reduce(NULL, send, recv, 1, FSDP_F32, FSDP_SUM));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_broadcast(NULL, recv, 1, FSDP_F32, 0));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_barrier(NULL));
}

/* ---------------------------------------------------------------------------------------------
   the tests: fsdp_comm_alloc memory
   --------------------------------------------------------------------------------------------- */
#define ALLOC_BYTES ((size_t)3 << 20) /* 3 MiB: large enough for the direct path */

typedef struct alloc_report {
    int done;
    int rc_alloc, rc_ops, rc_mismatch;
    int zeroed, aligned, shared, leftovers;
    int results_ok;
    char error[300];
} alloc_report;

typedef struct alloc_job {
    int scenario;                  /* ALLOC_LIFECYCLE, ALLOC_EARLY_FREE, ALLOC_NO_SHM_SPACE */
    alloc_report reports[MAX_WORLD];
} alloc_job;

enum { ALLOC_LIFECYCLE, ALLOC_EARLY_FREE, ALLOC_NO_SHM_SPACE };

/* Files this process or its parent's other children left in /dev/shm ("fsdp-<pid>-m<n>"). */
static int count_region_files_once(void) {
    DIR *dir = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;
    if (!dir) return 0;
    while ((e = readdir(dir)) != NULL)
        if (strncmp(e->d_name, "fsdp-", 5) == 0 && strstr(e->d_name, "-m") != NULL) n++;
    closedir(dir);
    return n;
}

/* Region files left in /dev/shm. Another process of this machine sharing memory at this moment
   has its own for a few milliseconds (they are unlinked once mapped), so the count must stay
   above 0 for 300 ms to count: leftovers of this job would. */
static int count_region_files(void) {
    int n = 0, tries;
    for (tries = 0; tries < 30 && (n = count_region_files_once()) > 0; tries++) sleep_ms(10);
    return n;
}

/* Every rank all-gathers and all-reduces 3 MiB from fsdp_comm_alloc memory (its own values:
   rank + 1 in every float) and checks the sums and the gathered blocks. */
static int gather_and_reduce_check(fsdp_comm *comm, float *send, float *recv, size_t n) {
    int rank = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), rc, r;
    size_t i;
    for (i = 0; i < n; i++) send[i] = (float)(rank + 1);
    if ((rc = fsdp_all_reduce(comm, send, recv, n, FSDP_F32, FSDP_SUM)) != 0) return rc;
    for (i = 0; i < n; i++)
        if (recv[i] != (float)(world * (world + 1) / 2)) return -1;
    if ((rc = fsdp_all_gather(comm, send, recv, n / (size_t)world, FSDP_F32)) != 0) return rc;
    for (r = 0; r < world; r++)
        for (i = 0; i < n / (size_t)world; i++)
            if (recv[(size_t)r * (n / (size_t)world) + i] != (float)(r + 1)) return -1;
    return 0;
}

static int alloc_rank_main(fsdp_comm *comm, void *arg) {
    alloc_job *j = arg;
    int rank = fsdp_comm_rank(comm);
    alloc_report *report = &j->reports[rank];
    size_t n = ALLOC_BYTES / sizeof(float), i;
    void *a = NULL, *b = NULL;
    if (j->scenario == ALLOC_NO_SHM_SPACE && rank == 1) {
        /* /dev/shm refuses this rank's file: as if the tmpfs were too small */
        struct rlimit small = {4096, 4096};
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &small);
    }
    report->rc_alloc = fsdp_comm_alloc(comm, ALLOC_BYTES, &a);
    if (report->rc_alloc == 0) report->rc_alloc = fsdp_comm_alloc(comm, ALLOC_BYTES, &b);
    if (report->rc_alloc == 0) {
        const unsigned char *bytes = a;
        report->zeroed = 1;
        for (i = 0; i < ALLOC_BYTES; i++) report->zeroed &= bytes[i] == 0;
        report->aligned = (uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0;
        report->shared = fsdp_comm_is_shared(comm, a, ALLOC_BYTES) + fsdp_comm_is_shared(comm, b, ALLOC_BYTES);
        report->rc_ops = fsdp_barrier(comm); /* every rank is past its allocations */
        report->leftovers = count_region_files();
        if (report->rc_ops == 0) {
            report->rc_ops = gather_and_reduce_check(comm, a, b, n);
            report->results_ok = report->rc_ops == 0;
        }
    }
    if (j->scenario == ALLOC_LIFECYCLE) { /* free, allocate again, and leave it to fsdp_comm_destroy */
        fsdp_comm_free(comm, a);
        a = NULL;
        if (report->rc_ops == 0 && (report->rc_ops = fsdp_comm_alloc(comm, ALLOC_BYTES, &a)) == 0)
            report->rc_ops = gather_and_reduce_check(comm, a, b, n);
        report->results_ok &= report->rc_ops == 0;
    }
    if (j->scenario == ALLOC_EARLY_FREE) { /* rank 1 frees its block of a; rank 0 then offers its own */
        float *recv = malloc(ALLOC_BYTES);
        if (rank == 1) fsdp_comm_free(comm, a);
        report->rc_mismatch = recv ? fsdp_all_gather(comm, rank == 1 ? b : a, recv, n / 2, FSDP_F32) : -3;
        if (fsdp_all_gather(comm, b, b, 1, FSDP_F32) != FSDP_ERR_ABORTED) report->rc_mismatch = -2; /* stays failed */
        free(recv);
    }
    if (fsdp_comm_status(comm) != 0)
        append_text(report->error, sizeof report->error, fsdp_comm_last_error(comm));
    report->done = 1;
    return 0;
}

static alloc_job *run_alloc_job(int scenario, fsdp_backend_kind backend, int world, fsdp_launch_status *status,
                                int *rc) {
    alloc_job *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TEST_ASSERT_TRUE(j != MAP_FAILED);
    memset(j, 0, sizeof *j);
    j->scenario = scenario;
    *rc = launch_ranks(world, backend, SHORT_TIMEOUT_MS, alloc_rank_main, j, status);
    return j;
}

static void test_fsdp_comm_alloc_gives_zeroed_aligned_shared_memory_and_leaves_nothing_in_dev_shm(void) {
    int world, r, rc;
    char message[500];
    for (world = 1; world <= 3; world++) {
        fsdp_launch_status status;
        alloc_job *j = run_alloc_job(ALLOC_LIFECYCLE, FSDP_BACKEND_SHM, world, &status, &rc);
        for (r = 0; r < world; r++) {
            const alloc_report *a = &j->reports[r];
            snprintf(message, sizeof message, "P=%d rank %d: alloc %s, ops %d, zeroed %d, aligned %d, shared %d, "
                     "files left %d: %s", world, r, fsdp_result_name(a->rc_alloc), a->rc_ops, a->zeroed, a->aligned,
                     a->shared, a->leftovers, a->error);
            TEST_ASSERT_TRUE_MESSAGE(a->done, message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, a->rc_alloc, message);
            TEST_ASSERT_TRUE_MESSAGE(a->zeroed && a->aligned && a->results_ok, message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(world > 1 ? 2 : 0, a->shared, message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, a->leftovers, message);
        }
        munmap(j, sizeof *j);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, count_region_files(), "region files left in /dev/shm after the jobs");
}

/* Makes /dev/shm/NAME (mode 0600, this user's) as a rank killed mid-share leaves it: 0, or -1. */
static int plant_region_file(const char *name) {
    char path[128];
    int fd;
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

static int shm_file_exists(const char *name) {
    char path[128];
    struct stat st;
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    return lstat(path, &st) == 0;
}

/* The reap's case, in a child process (its exit status: 0 as it should be, 1 the dead creator's
   file was left, 2 the live one's removed, 3 the job failed, 4 no file could be planted), with a
   /dev/shm of its own where it can have one (a private mount namespace, as root): every fsdp.h
   process of this user on the machine reaps too, and one sharing at the same time removed the
   planted file in place of the share under test (the test passed without the reap). */
static int reap_case(void) {
    char dead_name[64], live_name[64], path[128];
    fsdp_launch_status status;
    alloc_job *j;
    int rc, outcome;
    pid_t child;
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777"); /* (else the machine's /dev/shm) */
    if ((child = fork()) == 0) _exit(0);
    if (child < 0 || waitpid(child, NULL, 0) != child) return 4;
    snprintf(dead_name, sizeof dead_name, "fsdp-m%ld-00000000deadbeef", (long)child);
    snprintf(live_name, sizeof live_name, "fsdp-m%ld-00000000cafef00d", (long)getpid());
    if (plant_region_file(dead_name) != 0 || plant_region_file(live_name) != 0) return 4;
    j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j == MAP_FAILED) return 3;
    memset(j, 0, sizeof *j);
    j->scenario = ALLOC_LIFECYCLE;
    rc = launch_ranks(2, FSDP_BACKEND_SHM, SHORT_TIMEOUT_MS, alloc_rank_main, j, &status);
    munmap(j, sizeof *j);
    outcome = shm_file_exists(dead_name) ? 1 : !shm_file_exists(live_name) ? 2 : rc != FSDP_SUCCESS ? 3 : 0;
    snprintf(path, sizeof path, "/dev/shm/%s", live_name);
    unlink(path);
    return outcome;
}

/* A rank killed between making its fsdp_comm_alloc file and the peers' mapping it (a job cut
   off by a timeout) leaves the file; the next share on the host removes it once its creator is
   gone, and leaves a live creator's alone (seen: four 8 MB files after 256-rank runs were killed). */
static void test_fsdp_comm_alloc_removes_files_of_dead_creators_and_keeps_live_ones(void) {
    static const char *const outcomes[] = {"", "a dead creator's file was left in /dev/shm",
                                           "a live creator's file was removed", "the job failed",
                                           "no file could be planted in /dev/shm"};
    int status = -1, ended;
    pid_t child;
    fflush(NULL);
    if ((child = fork()) == 0) _exit(reap_case());
    TEST_ASSERT_TRUE(child > 0);
    ended = wait_child(child, 4 * SHORT_TIMEOUT_MS, &status);
    TEST_ASSERT_TRUE_MESSAGE(ended && WIFEXITED(status), "the case did not end by itself");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, WEXITSTATUS(status), outcomes[WEXITSTATUS(status) <= 4 ? WEXITSTATUS(status) : 4]);
}

static void test_fsdp_comm_alloc_over_socket_gives_ordinary_memory_that_collectives_use(void) {
    fsdp_launch_status status;
    int r, rc;
    alloc_job *j = run_alloc_job(ALLOC_LIFECYCLE, FSDP_BACKEND_SOCKET, 2, &status, &rc);
    for (r = 0; r < 2; r++) {
        TEST_ASSERT_TRUE_MESSAGE(j->reports[r].done, j->reports[r].error);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, j->reports[r].shared, "socket memory claims to be shared");
        TEST_ASSERT_TRUE_MESSAGE(j->reports[r].zeroed && j->reports[r].aligned && j->reports[r].results_ok,
                                 j->reports[r].error);
    }
    munmap(j, sizeof *j);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
}

static void test_fsdp_comm_alloc_falls_back_to_private_memory_on_every_rank_when_one_cannot_share(void) {
    fsdp_launch_status status;
    int r, rc;
    char message[400];
    alloc_job *j = run_alloc_job(ALLOC_NO_SHM_SPACE, FSDP_BACKEND_SHM, 3, &status, &rc);
    for (r = 0; r < 3; r++) {
        const alloc_report *a = &j->reports[r];
        snprintf(message, sizeof message, "rank %d: alloc %s, shared %d, ok %d, files left %d: %s", r,
                 fsdp_result_name(a->rc_alloc), a->shared, a->results_ok, a->leftovers, a->error);
        TEST_ASSERT_TRUE_MESSAGE(a->done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, a->rc_alloc, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, a->shared, message);
        TEST_ASSERT_TRUE_MESSAGE(a->zeroed && a->aligned && a->results_ok, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, a->leftovers, message);
    }
    munmap(j, sizeof *j);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
}

static void test_a_peer_offering_memory_this_rank_already_freed_is_a_mismatch_on_every_rank(void) {
    fsdp_launch_status status;
    int r, rc;
    alloc_job *j = run_alloc_job(ALLOC_EARLY_FREE, FSDP_BACKEND_SHM, 2, &status, &rc);
    for (r = 0; r < 2; r++) {
        char message[400];
        snprintf(message, sizeof message, "rank %d got %s: %s", r, fsdp_result_name(j->reports[r].rc_mismatch),
                 j->reports[r].error);
        TEST_ASSERT_TRUE_MESSAGE(j->reports[r].done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_MISMATCH, j->reports[r].rc_mismatch, message);
        TEST_ASSERT_NOT_NULL_MESSAGE(strstr(j->reports[r].error, "rank 0 offered"), message);
    }
    munmap(j, sizeof *j);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
}

/* ---------------------------------------------------------------------------------------------
   the tests: the copy kernels under the collectives
   --------------------------------------------------------------------------------------------- */
/* fsdp__copy_out with non-temporal stores (SSE2, and AVX2 where the CPU has it) writes exactly
   what memcpy writes, for every destination and source alignment and odd lengths, and nothing
   around it. */
static void test_streaming_copies_equal_memcpy_for_every_alignment_and_length(void) {
    static const size_t lengths[] = {256, 257, 319, 1000, 4096 + 13, ((size_t)1 << 20) + 7};
    size_t max = ((size_t)1 << 20) + 7 + 128, li, i;
    unsigned char *src = malloc(max), *dst = malloc(max), *want = malloc(max);
    int kernel, d, a;
    char message[200];
    TEST_ASSERT_NOT_NULL(src);
    TEST_ASSERT_NOT_NULL(dst);
    TEST_ASSERT_NOT_NULL(want);
    for (i = 0; i < max; i++) src[i] = (unsigned char)(mix32((uint32_t)i) >> 5);
    for (kernel = 0; kernel < 2; kernel++) {
#if FSDP__HAVE_STREAM_AVX2
        if (kernel == 1 && !__builtin_cpu_supports("avx2")) continue;
        fsdp__stream_avx2 = kernel;
#else
        if (kernel == 1) continue;
#endif
        for (li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (d = 0; d < 40; d += (lengths[li] > 5000 ? 13 : 1))
                for (a = 0; a < 6; a++) {
                    size_t n = lengths[li];
                    memset(dst, 0xEE, max);
                    memset(want, 0xEE, max);
                    memcpy(want + d, src + a, n);
                    fsdp__copy_out(dst + d, src + a, n, 1);
                    fsdp__stream_fence();
                    snprintf(message, sizeof message, "%s kernel, %lu bytes, destination offset %d, source offset %d",
                             kernel ? "AVX2" : "SSE2", (unsigned long)n, d, a);
                    TEST_ASSERT_TRUE_MESSAGE(memcmp(dst, want, max) == 0, message);
                }
    }
#if FSDP__HAVE_STREAM_AVX2
    fsdp__stream_avx2 = -1;
#endif
    free(src);
    free(dst);
    free(want);
}

int main(void) {
    build_f16_decode_table();
    UNITY_BEGIN();
    RUN_TEST(test_collectives_on_null_comm_return_invalid_arg);
    RUN_TEST(test_streaming_copies_equal_memcpy_for_every_alignment_and_length);
    RUN_TEST(test_invalid_arguments_over_shm_return_invalid_arg_and_keep_comm_usable);
    RUN_TEST(test_invalid_arguments_over_socket_return_invalid_arg_and_keep_comm_usable);

    RUN_TEST(test_all_gather_over_shm_equals_serial_reference_bitwise);
    RUN_TEST(test_reduce_scatter_sum_avg_max_over_shm_equals_serial_reference_bitwise);
    RUN_TEST(test_all_reduce_sum_avg_max_over_shm_equals_serial_reference_bitwise);
    RUN_TEST(test_broadcast_over_shm_from_first_and_last_root_copies_root_buffer_to_every_rank);
    RUN_TEST(test_in_place_collectives_over_shm_equal_serial_reference_bitwise);
    RUN_TEST(test_barrier_over_shm_with_a_late_rank_returns_only_after_every_rank_arrived);
    RUN_TEST(test_max_reduction_over_shm_with_nan_input_gives_nan);
    RUN_TEST(test_collectives_over_shm_with_count_zero_succeed_and_write_nothing);

    RUN_TEST(test_every_collective_over_shm_with_fsdp_comm_alloc_buffers_equals_serial_reference_bitwise);
    RUN_TEST(test_every_collective_over_shm_with_shared_buffers_on_even_ranks_only_equals_reference_bitwise);

    RUN_TEST(test_fsdp_comm_alloc_gives_zeroed_aligned_shared_memory_and_leaves_nothing_in_dev_shm);
    RUN_TEST(test_fsdp_comm_alloc_removes_files_of_dead_creators_and_keeps_live_ones);
    RUN_TEST(test_fsdp_comm_alloc_over_socket_gives_ordinary_memory_that_collectives_use);
    RUN_TEST(test_fsdp_comm_alloc_falls_back_to_private_memory_on_every_rank_when_one_cannot_share);
    RUN_TEST(test_a_peer_offering_memory_this_rank_already_freed_is_a_mismatch_on_every_rank);

    RUN_TEST(test_all_gather_over_socket_equals_serial_reference_bitwise);
    RUN_TEST(test_reduce_scatter_sum_avg_max_over_socket_equals_serial_reference_bitwise);
    RUN_TEST(test_all_reduce_sum_avg_max_over_socket_equals_serial_reference_bitwise);
    RUN_TEST(test_broadcast_over_socket_from_first_and_last_root_copies_root_buffer_to_every_rank);
    RUN_TEST(test_in_place_collectives_over_socket_equal_serial_reference_bitwise);
    RUN_TEST(test_barrier_over_socket_with_a_late_rank_returns_only_after_every_rank_arrived);
    RUN_TEST(test_max_reduction_over_socket_with_nan_input_gives_nan);
    RUN_TEST(test_collectives_over_socket_with_count_zero_succeed_and_write_nothing);

    RUN_TEST(test_big_bf16_reduce_scatter_and_all_reduce_are_bitwise_identical_over_shm_and_socket);
    RUN_TEST(test_repeated_runs_over_shm_give_identical_bits);
    RUN_TEST(test_repeated_runs_over_socket_give_identical_bits);
    RUN_TEST(test_waits_spin_only_when_the_whole_job_has_a_core_per_rank_or_as_fsdp_spin_says);
    RUN_TEST(test_waits_do_not_spin_when_the_ranks_may_run_on_one_cpu_only);
    return UNITY_END();
}
