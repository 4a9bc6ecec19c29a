/* test_single_copy.c - specification of the shm backend's single copy (issue 14): for ordinary
   (malloc) buffers of ops of 64 KiB and more, peers read each other's buffers directly with
   process_vm_readv instead of staging them through the segment. Both ways, and the socket
   backend, must give the same bits as a serial reference that reduces in rank order,
   ((x0 + x1) + x2) + x3, in fp32, rounding once to the dtype.

   How it runs: one fsdp_launch_ex per (path, world size), P = 2, 3, 4, for three paths: shm with
   single copy forced on (fsdp_launch_desc.shm_single_copy = 1), shm with it forced off (-1), and
   the socket backend over loopback. Every launch runs the same cases: every collective
   (all_gather; reduce_scatter and all_reduce with SUM, AVG and MAX; broadcast from the first and
   the last rank) in f32, bf16 and f16, on
     - separate buffers, with a count under 64 KiB (always staged), odd counts (65537, 300001)
       and 3.5 MiB (several 1 MiB slot rounds);
     - in place, as fsdp_coll defines it for each op (broadcast is always in place);
     - odd offsets: every buffer starts 1..3 elements past malloc's (never 64-byte aligned);
     - mixed: fsdp_comm_alloc buffers on even ranks and malloc ones on odd ranks, in the same op.
   Each rank checks its output element by element against the reference (computed here from the
   inputs' formula, independently of the library), checks that its send buffer and the guard
   bytes around every buffer are intact, and writes what it found, with a digest of its output,
   into a MAP_SHARED region. The parent asserts: every case matches the reference on every path,
   and the digests agree between single copy and staged, and between single copy and socket.
   Children never assert.

   The setting: 0 (the default) follows FSDP_SHM_SINGLE_COPY ("0": staged; "1": required;
   "auto": where the ranks can; unset: where the ranks can, for all_gather and broadcast
   blocks of 64 KiB and broadcasts of 256 KiB, up to 512 KiB), 1 requires single copy, 2 uses it where the ranks can, -1 never. The fallback: ranks forked here create their communicators themselves
   (fsdp_comm_init with a shared job token and secret) after the last rank installed a seccomp
   filter that makes process_vm_readv fail with EPERM. With shm_single_copy = 2 the job must
   still work, staged, with the same bits, and say so once; with 1, init must fail on every rank
   saying that single copy was required and, on the barred rank, why.

   Which path a communicator took is read from the shm backend's own flag (white box: this file
   includes the implementation), so that forcing a path cannot silently do nothing.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_single_copy.c \
              tests/unity/unity.c -o /tmp/test_single_copy -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <stddef.h>
#include <sys/uio.h>

#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#define HAVE_SECCOMP_BAR 1
#if defined(__x86_64__)
#define BAR_AUDIT_ARCH AUDIT_ARCH_X86_64
#else
#define BAR_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif
#else
#define HAVE_SECCOMP_BAR 0
#endif

#define MAX_WORLD 4
#define WORLDS 3                      /* P = 2, 3, 4 */
#define MAX_CASES 160
#define SMALL_COUNT ((size_t)3001)    /* all_gather at P = 4 in f32: 48 KiB, under FSDP__SHM_DIRECT_MIN */
#define ODD_COUNT ((size_t)65537)
#define ODD_COUNT_LARGER ((size_t)300001)
#define BIG_BYTES ((size_t)7 << 19)   /* 3.5 MiB: several 1 MiB slot rounds */
#define GUARD_BYTES 64
#define GUARD_FILL 0xA5
#define GARBAGE_FILL 0x5C
#define LAUNCH_TIMEOUT_MS 30000       /* bound on any single wait; only reached if something hangs */
#define CHILD_LIMIT_MS 120000
#define SECRET "single-copy-test-secret-41c7"
#define NO_RESULT (-1000)             /* a case the child could not even start (malloc failed) */
#define TEXT_BYTES 600

/* ---------------------------------------------------------------------------------------------
   paths, layouts, cases
   --------------------------------------------------------------------------------------------- */
enum path { SINGLE_COPY = 0, STAGED = 1, SOCKET = 2, PATHS = 3 };
static const char *const path_names[PATHS] = {"shm, single copy forced on", "shm, single copy forced off (staged)",
                                              "socket"};

enum layout {
    SEPARATE,            /* send and recv from malloc, as malloc gives them */
    IN_PLACE,            /* one buffer, in place as fsdp_coll defines it */
    ODD_OFFSET,          /* separate buffers, each 1..3 elements past malloc's pointer */
    IN_PLACE_ODD_OFFSET, /* in place, the buffer 1..3 elements past malloc's pointer */
    MIXED,               /* separate buffers, from fsdp_comm_alloc on even ranks, malloc on odd ones */
    MIXED_IN_PLACE
};

/* What a test function asserts about: a group of layouts. */
enum family { FAM_SEPARATE, FAM_IN_PLACE, FAM_ODD_OFFSET, FAM_MIXED, FAMILIES };
static const char *const family_names[FAMILIES] = {"separate buffers", "in-place calls", "buffers at odd offsets",
                                                   "fsdp_comm_alloc buffers on even ranks, malloc on odd ranks"};

static int family_of(int layout) {
    switch (layout) {
    case SEPARATE: return FAM_SEPARATE;
    case IN_PLACE: case IN_PLACE_ODD_OFFSET: return FAM_IN_PLACE;
    case ODD_OFFSET: return FAM_ODD_OFFSET;
    default: return FAM_MIXED;
    }
}

static int layout_in_place(int layout) {
    return layout == IN_PLACE || layout == IN_PLACE_ODD_OFFSET || layout == MIXED_IN_PLACE;
}
static int layout_offset(int layout) { return layout == ODD_OFFSET || layout == IN_PLACE_ODD_OFFSET; }
static int layout_mixed(int layout) { return layout == MIXED || layout == MIXED_IN_PLACE; }

typedef struct test_case {
    fsdp_coll_kind kind;
    fsdp_dtype dtype;
    fsdp_reduce_op op;
    int root;
    size_t count;        /* as passed to the call */
    int layout;
    uint32_t salt;       /* input values depend on (salt, rank, element) */
} test_case;

/* What one rank reports about one case. */
typedef struct case_report {
    int done;
    int rc;
    int guards_intact;   /* nothing written before or after any of its buffers */
    int send_intact;     /* the send buffer is unchanged (separate buffers) */
    int shared_as_asked; /* mixed layouts: fsdp_comm_is_shared agrees with the rank's parity */
    long long first_bad; /* first output element that differs from the reference, or -1 */
    long long bad_elements;
    uint32_t expected_bits, actual_bits;
    uint64_t digest;     /* of the output bytes */
    char error[240];
} case_report;

/* What one rank reports about its communicator. */
typedef struct rank_report {
    int started;
    int single_copy;     /* the backend's flag (white box) */
} rank_report;

typedef struct launch_result {
    int ran;
    int rc;
    char message[256];
    rank_report ranks[MAX_WORLD];
} launch_result;

/* The parent fills these before it forks; children inherit them. */
static test_case cases[WORLDS][MAX_CASES];
static size_t ncases[WORLDS];

/* MAP_SHARED, mapped once before any fork. */
typedef struct shared_area {
    launch_result launches[PATHS][WORLDS];
    case_report reports[PATHS][WORLDS][MAX_CASES][MAX_WORLD];
} shared_area;
static shared_area *area;

/* ---------------------------------------------------------------------------------------------
   reference values (independent of fsdp.h)
   --------------------------------------------------------------------------------------------- */
/* The bits a value has in the dtype (f32: 32 bits; bf16, f16: the low 16). */
static uint32_t encode(fsdp_dtype dtype, float value) {
    if (dtype == FSDP_F32) return bits_of(value);
    return dtype == FSDP_BF16 ? reference_bf16(value) : reference_f16(value);
}

static float decode(fsdp_dtype dtype, uint32_t bits) {
    if (dtype == FSDP_F32) return float_of(bits);
    return dtype == FSDP_BF16 ? float_of(bits << 16) : f16_decode_table[bits & 0xFFFFu];
}

static uint32_t load_bits(const unsigned char *buffer, fsdp_dtype dtype, size_t index) {
    if (dtype == FSDP_F32) return ((const uint32_t *)(const void *)buffer)[index];
    return ((const uint16_t *)(const void *)buffer)[index];
}

static void store_bits(unsigned char *buffer, fsdp_dtype dtype, size_t index, uint32_t bits) {
    if (dtype == FSDP_F32) ((uint32_t *)(void *)buffer)[index] = bits;
    else ((uint16_t *)(void *)buffer)[index] = (uint16_t)bits;
}

/* Rank `rank`'s input is element i -> a hash of (salt, rank, i) scaled into [-2, 2), never tiny
   (so that a MAX never compares +0 with -0), as the dtype holds it. */
static uint32_t input_stream(uint32_t salt, int rank) {
    return mix32(salt * 0x9E3779B9u + (uint32_t)rank * 0x85EBCA6Bu + 0x165667B1u);
}

static uint32_t input_bits(fsdp_dtype dtype, uint32_t stream, size_t i) {
    uint32_t h = mix32((uint32_t)i ^ stream);
    float value = (float)((double)h * (4.0 / 4294967296.0) - 2.0);
    if (fabsf(value) < 1.0f / 1024.0f) value = 0.75f;
    return encode(dtype, value);
}

static float input_value(fsdp_dtype dtype, uint32_t stream, size_t i) {
    return decode(dtype, input_bits(dtype, stream, i));
}

static void fill_input(unsigned char *buffer, fsdp_dtype dtype, uint32_t salt, int rank, size_t elems) {
    uint32_t stream = input_stream(salt, rank);
    size_t i;
    for (i = 0; i < elems; i++) store_bits(buffer, dtype, i, input_bits(dtype, stream, i));
}

/* Element i of rank `rank`'s output, as the reference says it must be. streams[q] is rank q's. */
static uint32_t expected_bits(const test_case *tc, int world, int rank, const uint32_t *streams, size_t i) {
    size_t at = i;
    float acc;
    int q;
    switch (tc->kind) {
    case FSDP_COLL_ALL_GATHER:
        return input_bits(tc->dtype, streams[i / tc->count], i % tc->count);
    case FSDP_COLL_BROADCAST:
        return input_bits(tc->dtype, streams[tc->root], i);
    case FSDP_COLL_REDUCE_SCATTER:
        at = (size_t)rank * tc->count + i;
        /* fall through */
    default:
        acc = input_value(tc->dtype, streams[0], at);
        for (q = 1; q < world; q++) {
            float x = input_value(tc->dtype, streams[q], at);
            acc = tc->op == FSDP_MAX ? (x > acc ? x : acc) : acc + x;
        }
        if (tc->op == FSDP_AVG) acc = acc / (float)world;
        return encode(tc->dtype, acc);
    }
}

static uint64_t digest_of(const unsigned char *bytes, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, bytes + i, 8);
        h = (h ^ word) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ bytes[i]) * 0x100000001B3ull;
    return h ^ (uint64_t)n;
}

/* ---------------------------------------------------------------------------------------------
   the cases
   --------------------------------------------------------------------------------------------- */
static const char *layout_name(int layout) {
    static const char *const names[] = {"separate buffers", "in place", "separate buffers at odd offsets",
                                        "in place at an odd offset", "mixed fsdp_comm_alloc/malloc buffers",
                                        "mixed fsdp_comm_alloc/malloc buffers in place"};
    return names[layout];
}

static void describe_case(char *out, size_t size, const test_case *tc, int world, const char *path) {
    char detail[32] = "";
    if (tc->kind == FSDP_COLL_REDUCE_SCATTER || tc->kind == FSDP_COLL_ALL_REDUCE)
        snprintf(detail, sizeof detail, " %s", op_name(tc->op));
    else if (tc->kind == FSDP_COLL_BROADCAST)
        snprintf(detail, sizeof detail, " root %d", tc->root);
    snprintf(out, size, "[%s%sP=%d] %s %s%s count %lu, %s", path, *path ? " " : "", world, kind_name(tc->kind),
             dtype_label(tc->dtype), detail, (unsigned long)tc->count, layout_name(tc->layout));
}

/* The ops of the matrix: every collective, every reduction, both ends as broadcast root. */
typedef struct op_spec {
    fsdp_coll_kind kind;
    fsdp_reduce_op op;
    int last_root;
    int in_place_big;    /* also in place at the big count: in place, peers read the buffer this
                            rank writes (one reduction per kind is enough: the op only folds) */
} op_spec;
#define OPS 9
static const op_spec all_ops[OPS] = {
    {FSDP_COLL_ALL_GATHER, FSDP_SUM, 0, 1},     {FSDP_COLL_REDUCE_SCATTER, FSDP_SUM, 0, 1},
    {FSDP_COLL_REDUCE_SCATTER, FSDP_AVG, 0, 0}, {FSDP_COLL_REDUCE_SCATTER, FSDP_MAX, 0, 0},
    {FSDP_COLL_ALL_REDUCE, FSDP_SUM, 0, 1},     {FSDP_COLL_ALL_REDUCE, FSDP_AVG, 0, 0},
    {FSDP_COLL_ALL_REDUCE, FSDP_MAX, 0, 0},     {FSDP_COLL_BROADCAST, FSDP_SUM, 0, 0},
    {FSDP_COLL_BROADCAST, FSDP_SUM, 1, 0}};

/* A count whose largest per-rank buffer is about BIG_BYTES (all_gather and broadcast: each
   rank's block; reduce_scatter: the send buffer), odd, so that every op runs several slot
   rounds and ends on a partial one. */
static size_t big_count(fsdp_coll_kind kind, fsdp_dtype dtype, int world) {
    size_t elems = BIG_BYTES / element_size(dtype);
    if (kind == FSDP_COLL_REDUCE_SCATTER) elems /= (size_t)world;
    return elems | 1u;
}

static size_t add_case(test_case *list, size_t n, const op_spec *spec, fsdp_dtype dtype, int world, size_t count,
                       int layout) {
    test_case *tc = &list[n];
    if (n >= MAX_CASES) {
        fprintf(stderr, "test_single_copy: more than MAX_CASES cases\n");
        exit(3);
    }
    if (spec->kind == FSDP_COLL_BROADCAST && layout_in_place(layout)) /* broadcast is always in place */
        layout = layout == MIXED_IN_PLACE ? MIXED : layout == IN_PLACE ? SEPARATE : ODD_OFFSET;
    memset(tc, 0, sizeof *tc);
    tc->kind = spec->kind;
    tc->op = spec->op;
    tc->root = spec->last_root ? world - 1 : 0;
    tc->dtype = dtype;
    tc->count = count;
    tc->layout = layout;
    tc->salt = (uint32_t)(n * 7919u + (uint32_t)world * 104729u + 13u);
    return n + 1;
}

/* Every op in every dtype at a count under 64 KiB, at two odd counts and at a big one (its
   layout rotating over separate, in place at an odd offset, and odd offsets); in place at an odd
   count; in place at the big count for the ops where a peer reads what this rank also writes
   (all_gather, reduce_scatter, all_reduce, SUM); mixed buffers for every op in bf16 (big for those
   three and broadcast, 300001 elements for the others) and in place for the same three in f32.
   The same list on every path. */
static size_t build_cases(test_case *list, int world) {
    static const fsdp_dtype dtypes[3] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const int big_layouts[3] = {SEPARATE, IN_PLACE_ODD_OFFSET, ODD_OFFSET};
    size_t n = 0;
    int d, o;
    for (d = 0; d < 3; d++) {
        fsdp_dtype dtype = dtypes[d];
        for (o = 0; o < OPS; o++) {
            const op_spec *spec = &all_ops[o];
            int big_layout = big_layouts[(d + o) % 3];
            n = add_case(list, n, spec, dtype, world, SMALL_COUNT, SEPARATE);
            n = add_case(list, n, spec, dtype, world, ODD_COUNT, SEPARATE);
            n = add_case(list, n, spec, dtype, world, ODD_COUNT_LARGER, ODD_OFFSET);
            if (spec->kind != FSDP_COLL_BROADCAST) n = add_case(list, n, spec, dtype, world, ODD_COUNT, IN_PLACE);
            n = add_case(list, n, spec, dtype, world, big_count(spec->kind, dtype, world), big_layout);
            if (spec->in_place_big && big_layout != IN_PLACE_ODD_OFFSET)
                n = add_case(list, n, spec, dtype, world, big_count(spec->kind, dtype, world), IN_PLACE_ODD_OFFSET);
            if (dtype == FSDP_BF16)
                n = add_case(list, n, spec, dtype, world,
                             spec->in_place_big || spec->last_root ? big_count(spec->kind, dtype, world)
                                                                   : ODD_COUNT_LARGER,
                             MIXED);
            if (dtype == FSDP_F32 && spec->in_place_big)
                n = add_case(list, n, spec, dtype, world, big_count(spec->kind, dtype, world), MIXED_IN_PLACE);
        }
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
   what a rank runs
   --------------------------------------------------------------------------------------------- */
/* White box: whether this communicator's peers read ordinary buffers straight from each other's
   memory (the shm backend's own flag, which its probe sets at init). */
static int single_copy_in_use(const fsdp_comm *comm) {
    return fsdp_comm_backend(comm) == FSDP_BACKEND_SHM && comm->impl != NULL &&
           ((const fsdp__shm *)comm->impl)->single_copy != 0;
}

/* One buffer of a case: [guard][offset][data][guard], the guards and offset GUARD_FILL. In the
   mixed layouts every rank calls fsdp_comm_alloc alike (it is collective), and odd ranks keep
   theirs unused and work in malloc memory. */
typedef struct buffer {
    unsigned char *base, *data;
    size_t total, bytes;
    void *held;
} buffer;

static int buffer_make(buffer *b, fsdp_comm *comm, int layout, int rank, size_t bytes, size_t offset) {
    memset(b, 0, sizeof *b);
    b->total = GUARD_BYTES + offset + bytes + GUARD_BYTES;
    b->bytes = bytes;
    if (layout_mixed(layout)) {
        if (fsdp_comm_alloc(comm, b->total, &b->held) != FSDP_SUCCESS) b->held = NULL;
        b->base = rank % 2 == 0 ? (unsigned char *)b->held : (unsigned char *)malloc(b->total);
    } else {
        b->base = (unsigned char *)malloc(b->total);
    }
    if (!b->base) return -1;
    memset(b->base, GUARD_FILL, b->total);
    b->data = b->base + GUARD_BYTES + offset;
    return 0;
}

static int buffer_guards_intact(const buffer *b) {
    if (!b->base) return 1;
    return bytes_all_equal(b->base, (size_t)(b->data - b->base), GUARD_FILL) &&
           bytes_all_equal(b->data + b->bytes, b->total - (size_t)(b->data - b->base) - b->bytes, GUARD_FILL);
}

static void buffer_free(buffer *b, fsdp_comm *comm) {
    if (b->base && b->base != b->held) free(b->base);
    if (b->held) fsdp_comm_free(comm, b->held);
    memset(b, 0, sizeof *b);
}

/* Compares the output with the reference; fills first_bad and friends. */
static void check_output(const test_case *tc, int world, int rank, const unsigned char *output, size_t elems,
                         case_report *report) {
    uint32_t streams[MAX_WORLD];
    size_t i;
    int q;
    for (q = 0; q < world; q++) streams[q] = input_stream(tc->salt, q);
    report->first_bad = -1;
    for (i = 0; i < elems; i++) {
        uint32_t want = expected_bits(tc, world, rank, streams, i), got = load_bits(output, tc->dtype, i);
        if (want == got) continue;
        if (report->first_bad < 0) {
            report->first_bad = (long long)i;
            report->expected_bits = want;
            report->actual_bits = got;
        }
        report->bad_elements++;
    }
    report->digest = digest_of(output, elems * element_size(tc->dtype));
}

static void run_case(fsdp_comm *comm, const test_case *tc, case_report *report) {
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm);
    int in_place = layout_in_place(tc->layout);
    size_t es = element_size(tc->dtype), count = tc->count;
    size_t send_elems, recv_elems, out_elems;
    size_t send_offset = layout_offset(tc->layout) ? (size_t)(1 + ((uint32_t)rank + tc->salt) % 3u) * es : 0;
    size_t recv_offset = layout_offset(tc->layout) ? (size_t)(1 + ((uint32_t)rank + tc->salt + 1u) % 3u) * es : 0;
    buffer send, recv;
    unsigned char *send_copy = NULL;
    const unsigned char *output = NULL;
    int rc = NO_RESULT, recv_made, send_made;

    memset(report, 0, sizeof *report);
    report->first_bad = -1;
    switch (tc->kind) {
    case FSDP_COLL_ALL_GATHER:
        send_elems = count;
        recv_elems = out_elems = (size_t)world * count;
        break;
    case FSDP_COLL_REDUCE_SCATTER:
        send_elems = (size_t)world * count;
        recv_elems = out_elems = count;
        break;
    case FSDP_COLL_ALL_REDUCE:
        send_elems = recv_elems = out_elems = count;
        break;
    default: /* broadcast: one buffer */
        send_elems = 0;
        recv_elems = out_elems = count;
        break;
    }
    if (in_place) { /* one buffer, big enough for both roles */
        recv_elems = send_elems > recv_elems ? send_elems : recv_elems;
        send_elems = 0;
    }
    /* always both, in this order on every rank: fsdp_comm_alloc is collective */
    recv_made = buffer_make(&recv, comm, tc->layout, rank, recv_elems * es, recv_offset) == 0;
    send_made = buffer_make(&send, comm, tc->layout, rank, send_elems * es, send_offset) == 0;
    if (!recv_made || !send_made || !(send_copy = (unsigned char *)malloc(send_elems * es + 1))) {
        snprintf(report->error, sizeof report->error, "rank %d: out of memory", rank);
        goto finish;
    }
    report->shared_as_asked = 1;
    if (layout_mixed(tc->layout) && fsdp_comm_backend(comm) == FSDP_BACKEND_SHM)
        report->shared_as_asked = fsdp_comm_is_shared(comm, recv.data, recv.bytes) == (rank % 2 == 0);
    memset(recv.data, GARBAGE_FILL, recv.bytes);
    fill_input(send.data, tc->dtype, tc->salt, rank, send_elems);
    memcpy(send_copy, send.data, send_elems * es);

    switch (tc->kind) {
    case FSDP_COLL_ALL_GATHER:
        if (in_place) {
            unsigned char *own = recv.data + (size_t)rank * count * es;
            fill_input(own, tc->dtype, tc->salt, rank, count);
            rc = fsdp_all_gather(comm, own, recv.data, count, tc->dtype);
        } else {
            rc = fsdp_all_gather(comm, send.data, recv.data, count, tc->dtype);
        }
        output = recv.data;
        break;
    case FSDP_COLL_REDUCE_SCATTER:
        if (in_place) {
            unsigned char *own = recv.data + (size_t)rank * count * es;
            fill_input(recv.data, tc->dtype, tc->salt, rank, (size_t)world * count);
            rc = fsdp_reduce_scatter(comm, recv.data, own, count, tc->dtype, tc->op);
            output = own;
        } else {
            rc = fsdp_reduce_scatter(comm, send.data, recv.data, count, tc->dtype, tc->op);
            output = recv.data;
        }
        break;
    case FSDP_COLL_ALL_REDUCE:
        if (in_place) {
            fill_input(recv.data, tc->dtype, tc->salt, rank, count);
            rc = fsdp_all_reduce(comm, recv.data, recv.data, count, tc->dtype, tc->op);
        } else {
            rc = fsdp_all_reduce(comm, send.data, recv.data, count, tc->dtype, tc->op);
        }
        output = recv.data;
        break;
    default: /* the root's buffer is the data; the others start with other values */
        fill_input(recv.data, tc->dtype, rank == tc->root ? tc->salt : tc->salt ^ 0x5EEDu, rank, count);
        rc = fsdp_broadcast(comm, recv.data, count, tc->dtype, tc->root);
        output = recv.data;
        break;
    }
    report->guards_intact = buffer_guards_intact(&recv) && buffer_guards_intact(&send);
    report->send_intact = memcmp(send.data, send_copy, send_elems * es) == 0;
    if (rc == FSDP_SUCCESS) check_output(tc, world, rank, output, out_elems, report);
finish:
    report->rc = rc;
    if (rc != FSDP_SUCCESS && report->error[0] == '\0') {
        snprintf(report->error, sizeof report->error, "rank %d got %s: ", rank, fsdp_result_name(rc));
        append_text(report->error, sizeof report->error, fsdp_comm_last_error(comm));
    }
    report->done = 1;
    buffer_free(&recv, comm);
    buffer_free(&send, comm);
    free(send_copy);
}

typedef struct launch_plan {
    int path, world_index;
} launch_plan;

static int matrix_rank(fsdp_comm *comm, void *arg) {
    const launch_plan *plan = (const launch_plan *)arg;
    int rank = fsdp_comm_rank(comm);
    size_t c;
    launch_result *result = &area->launches[plan->path][plan->world_index];
    result->ranks[rank].single_copy = single_copy_in_use(comm);
    result->ranks[rank].started = 1;
    for (c = 0; c < ncases[plan->world_index]; c++)
        run_case(comm, &cases[plan->world_index][c], &area->reports[plan->path][plan->world_index][c][rank]);
    return 0; /* failures are in the reports */
}

/* ---------------------------------------------------------------------------------------------
   the parent: launching and judging
   --------------------------------------------------------------------------------------------- */
static int world_of(int world_index) { return world_index + 2; }

static void run_path(int path) {
    int w;
    for (w = 0; w < WORLDS; w++) {
        launch_result *result = &area->launches[path][w];
        fsdp_launch_desc desc;
        fsdp_launch_status status;
        launch_plan plan;
        if (result->ran) continue;
        memset(&desc, 0, sizeof desc);
        memset(&status, 0, sizeof status);
        desc.nprocs = world_of(w);
        desc.backend = path == SOCKET ? FSDP_BACKEND_SOCKET : FSDP_BACKEND_SHM;
        desc.shm_single_copy = path == SINGLE_COPY ? 1 : path == STAGED ? -1 : 0;
        desc.timeout_ms = LAUNCH_TIMEOUT_MS;
        plan.path = path;
        plan.world_index = w;
        fflush(NULL);
        result->rc = fsdp_launch_ex(&desc, matrix_rank, &plan, &status);
        snprintf(result->message, sizeof result->message, "%s", status.message);
        result->ran = 1;
    }
}

/* Checks every rank's report of every case of the family on the path. */
static void judge_family(int path, int family, verdict *v) {
    int w, r;
    size_t c;
    char name[200], what[900];
    memset(v, 0, sizeof *v);
    run_path(path);
    for (w = 0; w < WORLDS; w++) {
        const launch_result *result = &area->launches[path][w];
        int world = world_of(w);
        if (result->rc != FSDP_SUCCESS) {
            snprintf(what, sizeof what, "[%s P=%d] fsdp_launch_ex returned %s: %s", path_names[path], world,
                     fsdp_result_name(result->rc), result->message);
            record(v, 0, what);
        }
        for (c = 0; c < ncases[w]; c++) {
            const test_case *tc = &cases[w][c];
            if (family_of(tc->layout) != family) continue;
            describe_case(name, sizeof name, tc, world, path_names[path]);
            for (r = 0; r < world; r++) {
                const case_report *report = &area->reports[path][w][c][r];
                if (!report->done) snprintf(what, sizeof what, "%s: rank %d never reported", name, r);
                else if (report->rc != FSDP_SUCCESS) snprintf(what, sizeof what, "%s: %s", name, report->error);
                else if (!report->guards_intact)
                    snprintf(what, sizeof what, "%s: rank %d: bytes written outside its buffers", name, r);
                else if (!report->send_intact)
                    snprintf(what, sizeof what, "%s: rank %d: the send buffer was modified", name, r);
                else if (!report->shared_as_asked)
                    snprintf(what, sizeof what, "%s: rank %d: fsdp_comm_is_shared says its buffer is %sshared", name,
                             r, r % 2 == 0 ? "not " : "");
                else if (report->first_bad >= 0)
                    snprintf(what, sizeof what,
                             "%s: rank %d: %lld elements differ from the reference, the first at %lld: expected "
                             "0x%08X (%.9g) got 0x%08X (%.9g)",
                             name, r, report->bad_elements, report->first_bad, (unsigned)report->expected_bits,
                             (double)decode(tc->dtype, report->expected_bits), (unsigned)report->actual_bits,
                             (double)decode(tc->dtype, report->actual_bits));
                else what[0] = '\0';
                record(v, what[0] == '\0', what);
            }
        }
    }
}

static void assert_family_matches_reference(int path, int family) {
    verdict v;
    char message[1100];
    judge_family(path, family, &v);
    snprintf(message, sizeof message, "%s over %s: %d of %d rank-case checks failed; first: %s",
             family_names[family], path_names[path], v.failed, v.checked, v.first_failure);
    TEST_ASSERT_TRUE_MESSAGE(v.checked > 0, "no case of this family was checked");
    TEST_ASSERT_TRUE_MESSAGE(v.failed == 0, message);
}

/* Every case's output digests on two paths, rank by rank. */
static void assert_paths_give_identical_bits(int path, int other) {
    int w, r, compared = 0;
    size_t c;
    char name[200], message[1200]; /* the name and two error texts of up to 240 bytes */
    run_path(path);
    run_path(other);
    for (w = 0; w < WORLDS; w++) {
        for (c = 0; c < ncases[w]; c++) {
            describe_case(name, sizeof name, &cases[w][c], world_of(w), "");
            for (r = 0; r < world_of(w); r++) {
                const case_report *a = &area->reports[path][w][c][r], *b = &area->reports[other][w][c][r];
                snprintf(message, sizeof message, "%s: rank %d has no result on %s (%s) or on %s (%s)", name, r,
                         path_names[path], a->done ? a->error : "never reported", path_names[other],
                         b->done ? b->error : "never reported");
                TEST_ASSERT_TRUE_MESSAGE(a->done && b->done && a->rc == FSDP_SUCCESS && b->rc == FSDP_SUCCESS, message);
                snprintf(message, sizeof message, "%s: rank %d's output differs between %s (digest %016llx) and %s "
                         "(digest %016llx)", name, r, path_names[path], (unsigned long long)a->digest,
                         path_names[other], (unsigned long long)b->digest);
                TEST_ASSERT_TRUE_MESSAGE(a->digest == b->digest, message);
                compared++;
            }
        }
    }
    TEST_ASSERT_TRUE_MESSAGE(compared > 0, "nothing was compared");
}

/* ---------------------------------------------------------------------------------------------
   can this machine do cross-memory attach between sibling processes at all?
   --------------------------------------------------------------------------------------------- */
static volatile uint64_t sibling_cookie;

/* Whether one child of this process can read another's memory with process_vm_readv, as the
   launcher's ranks must: checked without the library, so that a machine that forbids it (Yama's
   ptrace_scope, a container's seccomp profile) skips the tests that force single copy on instead
   of failing them, and a library that wrongly refuses it does not. */
static int siblings_can_read_each_other(char *why, size_t size) {
    int ready[2], stop[2], status;
    pid_t holder, reader;
    char byte = 0;
    snprintf(why, size, "%s", "");
    if (pipe(ready) != 0 || pipe(stop) != 0) {
        snprintf(why, size, "pipe: %s", strerror(errno));
        return 0;
    }
    fflush(NULL);
    holder = fork();
    if (holder == 0) {
        sibling_cookie = 0x5EC0DC0FFEEull; /* only in the holder: the reader still has 0 here */
        close(ready[0]);
        close(stop[1]);
        if (write(ready[1], "r", 1) != 1) _exit(1);
        if (read(stop[0], &byte, 1) < 0) _exit(1); /* until the parent closes its end */
        _exit(0);
    }
    close(ready[1]);
    close(stop[0]);
    if (holder < 0 || read(ready[0], &byte, 1) != 1) {
        snprintf(why, size, "fork failed");
        close(ready[0]);
        close(stop[1]);
        return 0;
    }
    reader = fork();
    if (reader == 0) {
#if defined(__linux__)
        uint64_t seen = 0;
        struct iovec local, remote;
        ssize_t n;
        local.iov_base = &seen;
        local.iov_len = sizeof seen;
        remote.iov_base = (void *)&sibling_cookie;
        remote.iov_len = sizeof seen;
        n = process_vm_readv(holder, &local, 1, &remote, 1, 0);
        if (n == (ssize_t)sizeof seen && seen == 0x5EC0DC0FFEEull) _exit(0);
        _exit(n < 0 ? (errno > 0 && errno < 120 ? errno : 125) : 126);
#else
        _exit(127);
#endif
    }
    status = reader < 0 ? -1 : reap(reader, 10000);
    close(stop[1]);
    close(ready[0]);
    reap(holder, 10000);
    if (status == 0) return 1;
    if (status == 127) snprintf(why, size, "process_vm_readv is Linux's");
    else if (status == 126) snprintf(why, size, "process_vm_readv read other bytes");
    else if (status > 0 && status < 120) snprintf(why, size, "process_vm_readv between sibling processes: %s",
                                                  strerror(status));
    else snprintf(why, size, "the probe process failed (status %d)", status);
    return 0;
}

static int cma_checked, cma_works;
static char cma_why[200];

/* Ends the calling test as ignored if this machine cannot do cross-memory attach at all. */
static int require_cross_memory_attach(void) {
    if (!cma_checked) {
        cma_works = siblings_can_read_each_other(cma_why, sizeof cma_why);
        cma_checked = 1;
    }
    return cma_works;
}

#define SKIP_WITHOUT_CROSS_MEMORY_ATTACH()                                                  \
    do {                                                                                    \
        if (!require_cross_memory_attach()) {                                               \
            char skip_message_[300];                                                        \
            snprintf(skip_message_, sizeof skip_message_,                                   \
                     "single copy cannot work on this machine: %s", cma_why);               \
            TEST_IGNORE_MESSAGE(skip_message_);                                             \
        }                                                                                   \
    } while (0)

void setUp(void) {}
void tearDown(void) { unsetenv("FSDP_SHM_SINGLE_COPY"); }

/* ---------------------------------------------------------------------------------------------
   the tests: each path against the reference
   --------------------------------------------------------------------------------------------- */
static void test_forcing_single_copy_on_or_off_selects_that_path_on_every_rank(void) {
    int path, w, r;
    char message[300];
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    for (path = SINGLE_COPY; path <= STAGED; path++) {
        run_path(path);
        for (w = 0; w < WORLDS; w++) {
            const launch_result *result = &area->launches[path][w];
            snprintf(message, sizeof message, "[%s P=%d] %s", path_names[path], world_of(w), result->message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, result->rc, message);
            for (r = 0; r < world_of(w); r++) {
                snprintf(message, sizeof message, "[%s P=%d] rank %d %s", path_names[path], world_of(w), r,
                         result->ranks[r].started ? "took the other path" : "never started");
                TEST_ASSERT_TRUE_MESSAGE(result->ranks[r].started, message);
                TEST_ASSERT_EQUAL_INT_MESSAGE(path == SINGLE_COPY, result->ranks[r].single_copy, message);
            }
        }
    }
}

static void test_single_copy_on_separate_buffers_equals_rank_order_reference_bitwise(void) {
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    assert_family_matches_reference(SINGLE_COPY, FAM_SEPARATE);
}
static void test_single_copy_in_place_equals_rank_order_reference_bitwise(void) {
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    assert_family_matches_reference(SINGLE_COPY, FAM_IN_PLACE);
}
static void test_single_copy_at_odd_offsets_equals_rank_order_reference_bitwise(void) {
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    assert_family_matches_reference(SINGLE_COPY, FAM_ODD_OFFSET);
}
static void test_single_copy_with_alloc_and_malloc_buffers_mixed_equals_rank_order_reference_bitwise(void) {
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    assert_family_matches_reference(SINGLE_COPY, FAM_MIXED);
}

static void test_staged_on_separate_buffers_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(STAGED, FAM_SEPARATE);
}
static void test_staged_in_place_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(STAGED, FAM_IN_PLACE);
}
static void test_staged_at_odd_offsets_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(STAGED, FAM_ODD_OFFSET);
}
static void test_staged_with_alloc_and_malloc_buffers_mixed_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(STAGED, FAM_MIXED);
}

static void test_socket_on_separate_buffers_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_SEPARATE);
}
static void test_socket_in_place_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_IN_PLACE);
}
static void test_socket_at_odd_offsets_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_ODD_OFFSET);
}
static void test_socket_with_alloc_and_malloc_buffers_mixed_equals_rank_order_reference_bitwise(void) {
    assert_family_matches_reference(SOCKET, FAM_MIXED);
}

/* ---------------------------------------------------------------------------------------------
   the tests: the paths against each other
   --------------------------------------------------------------------------------------------- */
static void test_single_copy_and_staged_give_identical_bits_for_every_case(void) {
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    assert_paths_give_identical_bits(SINGLE_COPY, STAGED);
}
static void test_single_copy_and_socket_give_identical_bits_for_every_case(void) {
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    assert_paths_give_identical_bits(SINGLE_COPY, SOCKET);
}

/* ---------------------------------------------------------------------------------------------
   the tests: the default and the environment
   --------------------------------------------------------------------------------------------- */
static int report_path_rank(fsdp_comm *comm, void *arg) {
    launch_result *shared = (launch_result *)arg;
    int r = fsdp_comm_rank(comm);
    if (r < 0 || r >= (int)(sizeof shared->ranks / sizeof shared->ranks[0])) return 1;
    shared->ranks[r].single_copy = single_copy_in_use(comm);
    shared->ranks[r].started = 1;
    return 0;
}

/* Launches 3 shm ranks with desc.shm_single_copy = setting and FSDP_SHM_SINGLE_COPY = env
   (NULL: unset); returns how many ranks use single copy, or -1 if the launch failed. */
static int ranks_using_single_copy(int setting, const char *env, char *message, size_t size) {
    launch_result *shared = (launch_result *)mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    fsdp_launch_desc desc;
    fsdp_launch_status status;
    int rc, r, n = 0;
    if (shared == MAP_FAILED) return -1;
    memset(shared, 0, sizeof *shared);
    memset(&desc, 0, sizeof desc);
    desc.nprocs = 3;
    desc.timeout_ms = LAUNCH_TIMEOUT_MS;
    desc.shm_single_copy = setting;
    if (env) setenv("FSDP_SHM_SINGLE_COPY", env, 1);
    else unsetenv("FSDP_SHM_SINGLE_COPY");
    fflush(NULL);
    rc = fsdp_launch_ex(&desc, report_path_rank, shared, &status);
    unsetenv("FSDP_SHM_SINGLE_COPY");
    snprintf(message, size, "shm_single_copy = %d, FSDP_SHM_SINGLE_COPY=%s: %s", setting, env ? env : "(unset)",
             status.message);
    for (r = 0; r < 3; r++) {
        if (!shared->ranks[r].started) rc = FSDP_ERR_RANK_FAILED;
        n += shared->ranks[r].single_copy;
    }
    munmap(shared, sizeof *shared);
    return rc == FSDP_SUCCESS ? n : -1;
}

/* Issue 29: by default (setting 0, FSDP_SHM_SINGLE_COPY unset) the ranks probe and, where they
   can read each other, all_gather and broadcast whose offered block (a rank's part, 64 KiB or
   more in an op of 128 KiB or more; the root's buffer, from 256 KiB) is under 512 KiB read in
   place (steady, where staging costs 2-8x more when
   handing cache lines between cores is slow), while reductions, an all_reduce's gather half,
   smaller and larger blocks stage; asked for (1, auto), single copy serves every op that only
   copies, at every size from 64 KiB. */
static void test_default_reads_in_place_only_all_gather_and_broadcast_blocks_of_64_up_to_512_kib(void) {
    char message[400], buf[16] = "";
    fsdp_comm comm;
    fsdp__shm s;
    memset(&comm, 0, sizeof comm);
    memset(&s, 0, sizeof s);
    s.single_copy = 1; /* the probe passed */
    s.single_copy_asked = 0;
    TEST_ASSERT_NOT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)64 << 10, (size_t)128 << 10, FSDP__READ_COPY).base);
    TEST_ASSERT_NOT_NULL(fsdp__shm_offer_of(&comm, &s, buf, ((size_t)512 << 10) - 1, (size_t)2 << 20, FSDP__READ_COPY).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)512 << 10, (size_t)1 << 20, FSDP__READ_COPY).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, ((size_t)64 << 10) - 1, (size_t)128 << 10, FSDP__READ_COPY).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)32 << 10, (size_t)64 << 10, FSDP__READ_COPY).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)64 << 10, (size_t)64 << 10, FSDP__READ_COPY).base); /* op */
    TEST_ASSERT_NOT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)256 << 10, (size_t)256 << 10, FSDP__READ_COPY_ROOT).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)128 << 10, (size_t)128 << 10, FSDP__READ_COPY_ROOT).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)512 << 10, (size_t)512 << 10, FSDP__READ_COPY_ROOT).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)256 << 10, (size_t)1 << 20, FSDP__READ_COPY_REDUCED).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)256 << 10, (size_t)1 << 20, FSDP__READ_REDUCE).base);
    s.single_copy_asked = 1;
    TEST_ASSERT_NOT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)32 << 10, (size_t)64 << 10, FSDP__READ_COPY).base);
    TEST_ASSERT_NOT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)32 << 20, (size_t)64 << 20, FSDP__READ_COPY).base);
    TEST_ASSERT_NOT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)32 << 20, (size_t)64 << 20, FSDP__READ_COPY_REDUCED).base);
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)256 << 10, (size_t)1 << 20, FSDP__READ_REDUCE).base);
    s.single_copy = 0; /* the probe failed */
    TEST_ASSERT_NULL(fsdp__shm_offer_of(&comm, &s, buf, (size_t)256 << 10, (size_t)1 << 20, FSDP__READ_COPY).base);
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    TEST_ASSERT_EQUAL_INT_MESSAGE(3, ranks_using_single_copy(0, NULL, message, sizeof message), message);
}

static void test_setting_2_uses_single_copy_where_the_ranks_can_read_each_other(void) {
    char message[400];
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    TEST_ASSERT_EQUAL_INT_MESSAGE(3, ranks_using_single_copy(2, NULL, message, sizeof message), message);
}

static void test_env_single_copy_0_turns_it_off_and_1_and_auto_on(void) {
    char message[400];
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH();
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, ranks_using_single_copy(0, "0", message, sizeof message), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(3, ranks_using_single_copy(0, "1", message, sizeof message), message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(3, ranks_using_single_copy(0, "auto", message, sizeof message), message);
}

/* The setting wins over the environment. */
static void test_setting_minus_1_keeps_it_off_whatever_the_env_says(void) {
    char message[400];
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, ranks_using_single_copy(-1, "1", message, sizeof message), message);
}

/* ---------------------------------------------------------------------------------------------
   the fallback: a rank that may not call process_vm_readv
   --------------------------------------------------------------------------------------------- */
#define BARRED_WORLD 3
#define FALLBACK_CASES 8

typedef struct barred_report {
    int done;
    int filter_installed;
    int filter_errno;    /* what process_vm_readv on itself failed with, under the filter */
    int init_rc;
    int init_ms;
    int single_copy;
    char message[TEXT_BYTES];
    char log[TEXT_BYTES];
} barred_report;

typedef struct barred_area {
    barred_report ranks[BARRED_WORLD];
    case_report reports[FALLBACK_CASES][BARRED_WORLD];
} barred_area;

static barred_area *barred;
static test_case fallback_cases[FALLBACK_CASES];
static size_t nfallback;

/* Makes process_vm_readv fail with EPERM in this process, and nothing else: what a seccomp
   profile of a container does. No privilege is needed after PR_SET_NO_NEW_PRIVS. */
static int bar_process_vm_readv(void) {
#if HAVE_SECCOMP_BAR
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, BAR_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program;
    program.len = (unsigned short)(sizeof filter / sizeof filter[0]);
    program.filter = filter;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program);
#else
    return -1;
#endif
}

/* errno of process_vm_readv reading this process's own memory, 0 if it worked. */
static int own_read_errno(void) {
#if defined(__linux__)
    uint64_t from = 42, to = 0;
    struct iovec local, remote;
    local.iov_base = &to;
    local.iov_len = sizeof to;
    remote.iov_base = &from;
    remote.iov_len = sizeof from;
    if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)sizeof to && to == 42) return 0;
    return errno ? errno : -1;
#else
    return ENOSYS;
#endif
}

static char *log_target;
static void capture_log(void *user, fsdp_log_level level, const char *message) {
    (void)user;
    (void)level;
    if (!log_target) return;
    if (log_target[0]) append_text(log_target, TEXT_BYTES, " | ");
    append_text(log_target, TEXT_BYTES, message);
}

/* A child: the last rank bars itself from process_vm_readv; then every rank joins over shm with
   its own fsdp_comm_init and, if that worked, runs the fallback cases. */
static int run_barred_rank(int rank, int single_copy, const char *job) {
    barred_report *me = &barred->ranks[rank];
    fsdp_comm_desc d;
    fsdp_comm *comm = NULL;
    double start;
    size_t c;
    if (rank == BARRED_WORLD - 1) {
        me->filter_installed = bar_process_vm_readv() == 0;
        me->filter_errno = own_read_errno();
    }
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_SHM;
    d.rank = rank;
    d.world_size = BARRED_WORLD;
    d.job = job;
    d.secret = SECRET;
    d.timeout_ms = LAUNCH_TIMEOUT_MS;
    d.shm_single_copy = single_copy;
    d.logger.fn = capture_log;
    d.logger.max_level = FSDP_LOG_INFO;
    log_target = me->log;
    start = now_ms();
    me->init_rc = fsdp_comm_init(&comm, &d);
    me->init_ms = (int)(now_ms() - start);
    snprintf(me->message, sizeof me->message, "%s", fsdp_comm_last_error(NULL));
    if (me->init_rc == FSDP_SUCCESS) {
        me->single_copy = single_copy_in_use(comm);
        for (c = 0; c < nfallback; c++) run_case(comm, &fallback_cases[c], &barred->reports[c][rank]);
    }
    fsdp_comm_destroy(comm);
    me->done = 1;
    return 0;
}

/* Forks the ranks of a job whose last rank is barred from process_vm_readv and waits for them.
   Returns 0 if every child exited normally. */
static int run_barred_job(int single_copy) {
    static int jobs;
    pid_t pids[BARRED_WORLD];
    char job[48];
    int r, failed = 0;
    snprintf(job, sizeof job, "single-copy-%d-%d", (int)getpid(), ++jobs);
    memset(barred, 0, sizeof *barred);
    fflush(NULL);
    for (r = 0; r < BARRED_WORLD; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(run_barred_rank(r, single_copy, job));
    }
    for (r = 0; r < BARRED_WORLD; r++)
        if (pids[r] < 0 || reap(pids[r], CHILD_LIMIT_MS) != 0) failed = 1;
    return failed ? -1 : 0;
}

/* Every kind of op, in layouts where the paths could differ; count 0: big (several rounds). */
static size_t build_fallback_cases(test_case *list) {
    static const struct {
        int op;          /* index into all_ops */
        fsdp_dtype dtype;
        size_t count;
        int layout;
    } plan[FALLBACK_CASES] = {
        {0, FSDP_BF16, 0, ODD_OFFSET},          {0, FSDP_F32, 0, IN_PLACE},
        {1, FSDP_F32, 0, SEPARATE},             {3, FSDP_F16, ODD_COUNT_LARGER, IN_PLACE_ODD_OFFSET},
        {4, FSDP_BF16, 0, IN_PLACE_ODD_OFFSET}, {5, FSDP_F16, ODD_COUNT, SEPARATE},
        {8, FSDP_F32, 0, ODD_OFFSET},           {4, FSDP_F32, 0, MIXED}};
    size_t n = 0;
    int i;
    for (i = 0; i < FALLBACK_CASES; i++) {
        const op_spec *spec = &all_ops[plan[i].op];
        size_t count = plan[i].count ? plan[i].count : big_count(spec->kind, plan[i].dtype, BARRED_WORLD);
        n = add_case(list, n, spec, plan[i].dtype, BARRED_WORLD, count, plan[i].layout);
    }
    return n;
}

/* Skips the test where no seccomp filter can be installed; fails it if the filter did not bar
   process_vm_readv (then the test would prove nothing). */
static void assert_the_barred_rank_was_barred(void) {
    char message[200];
    const barred_report *last = &barred->ranks[BARRED_WORLD - 1];
    if (!last->filter_installed) TEST_IGNORE_MESSAGE("cannot install a seccomp filter here (prctl failed)");
    snprintf(message, sizeof message, "under the filter, process_vm_readv on itself gave errno %d, not EPERM",
             last->filter_errno);
    TEST_ASSERT_EQUAL_INT_MESSAGE(EPERM, last->filter_errno, message);
}

static void test_rank_barred_from_process_vm_readv_makes_the_job_stage_with_identical_bits(void) {
    int r, saying_staged = 0;
    size_t c;
    char message[1200], name[200];
    if (!HAVE_SECCOMP_BAR) TEST_IGNORE_MESSAGE("seccomp filters are set up here for Linux x86_64 and aarch64 only");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, run_barred_job(2), "a rank crashed or hung"); /* where the ranks can */
    assert_the_barred_rank_was_barred();
    for (r = 0; r < BARRED_WORLD; r++) {
        const barred_report *rank = &barred->ranks[r];
        snprintf(message, sizeof message, "rank %d: init returned %s: %s", r, fsdp_result_name(rank->init_rc),
                 rank->message);
        TEST_ASSERT_TRUE_MESSAGE(rank->done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rank->init_rc, message);
        snprintf(message, sizeof message, "rank %d uses single copy although rank %d cannot read its peers", r,
                 BARRED_WORLD - 1);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, rank->single_copy, message);
        saying_staged += contains(rank->log, "staged");
    }
    snprintf(message, sizeof message,
             "%d ranks logged that buffers are staged, not one; logs: [%.300s] [%.300s] [%.300s]", saying_staged,
             barred->ranks[0].log, barred->ranks[1].log, barred->ranks[2].log);
    TEST_ASSERT_EQUAL_INT_MESSAGE(1, saying_staged, message);
    for (c = 0; c < nfallback; c++) {
        const test_case *tc = &fallback_cases[c];
        describe_case(name, sizeof name, tc, BARRED_WORLD, "shm, last rank barred from process_vm_readv");
        for (r = 0; r < BARRED_WORLD; r++) {
            const case_report *report = &barred->reports[c][r];
            snprintf(message, sizeof message, "%s: rank %d: %s", name, r, report->done ? report->error : "no report");
            TEST_ASSERT_TRUE_MESSAGE(report->done && report->rc == FSDP_SUCCESS, message);
            TEST_ASSERT_TRUE_MESSAGE(report->guards_intact && report->send_intact && report->shared_as_asked, message);
            snprintf(message, sizeof message, "%s: rank %d: %lld elements differ from the reference, the first at "
                     "%lld: expected 0x%08X got 0x%08X", name, r, report->bad_elements, report->first_bad,
                     (unsigned)report->expected_bits, (unsigned)report->actual_bits);
            TEST_ASSERT_TRUE_MESSAGE(report->first_bad < 0, message);
        }
    }
}

static void test_rank_barred_from_process_vm_readv_fails_init_when_single_copy_is_required_saying_why(void) {
    int r;
    char message[800];
    const barred_report *last = &barred->ranks[BARRED_WORLD - 1];
    if (!HAVE_SECCOMP_BAR) TEST_IGNORE_MESSAGE("seccomp filters are set up here for Linux x86_64 and aarch64 only");
    SKIP_WITHOUT_CROSS_MEMORY_ATTACH(); /* else every rank fails, barred or not */
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, run_barred_job(1), "a rank crashed or hung");
    assert_the_barred_rank_was_barred();
    for (r = 0; r < BARRED_WORLD; r++) {
        const barred_report *rank = &barred->ranks[r];
        snprintf(message, sizeof message, "rank %d: init returned %s after %d ms: '%s'", r,
                 fsdp_result_name(rank->init_rc), rank->init_ms, rank->message);
        TEST_ASSERT_TRUE_MESSAGE(rank->done, message);
        TEST_ASSERT_NOT_EQUAL_MESSAGE(FSDP_SUCCESS, rank->init_rc, message);
        TEST_ASSERT_TRUE_MESSAGE(contains(rank->message, "single copy") && contains(rank->message, "required"),
                                 message);
        TEST_ASSERT_TRUE_MESSAGE(rank->init_ms < LAUNCH_TIMEOUT_MS / 2, message); /* at once, not by a timeout */
    }
    /* the barred rank names the call and the reason */
    snprintf(message, sizeof message, "rank %d's message does not say that process_vm_readv failed with '%s': '%s'",
             BARRED_WORLD - 1, strerror(EPERM), last->message);
    TEST_ASSERT_TRUE_MESSAGE(contains(last->message, "process_vm_readv") && contains(last->message, strerror(EPERM)),
                             message);
}

int main(void) {
    int w;
    build_f16_decode_table();
    unsetenv("FSDP_SHM_SINGLE_COPY"); /* the tests choose the path themselves */
    for (w = 0; w < WORLDS; w++) ncases[w] = build_cases(cases[w], world_of(w));
    nfallback = build_fallback_cases(fallback_cases);
    area = (shared_area *)mmap(NULL, sizeof *area, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    barred = (barred_area *)mmap(NULL, sizeof *barred, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED || barred == MAP_FAILED) return 1;
    memset(area, 0, sizeof *area);
    signal(SIGPIPE, SIG_IGN);
    UNITY_BEGIN();
    RUN_TEST(test_forcing_single_copy_on_or_off_selects_that_path_on_every_rank);
    RUN_TEST(test_single_copy_on_separate_buffers_equals_rank_order_reference_bitwise);
    RUN_TEST(test_single_copy_in_place_equals_rank_order_reference_bitwise);
    RUN_TEST(test_single_copy_at_odd_offsets_equals_rank_order_reference_bitwise);
    RUN_TEST(test_single_copy_with_alloc_and_malloc_buffers_mixed_equals_rank_order_reference_bitwise);
    RUN_TEST(test_staged_on_separate_buffers_equals_rank_order_reference_bitwise);
    RUN_TEST(test_staged_in_place_equals_rank_order_reference_bitwise);
    RUN_TEST(test_staged_at_odd_offsets_equals_rank_order_reference_bitwise);
    RUN_TEST(test_staged_with_alloc_and_malloc_buffers_mixed_equals_rank_order_reference_bitwise);
    RUN_TEST(test_socket_on_separate_buffers_equals_rank_order_reference_bitwise);
    RUN_TEST(test_socket_in_place_equals_rank_order_reference_bitwise);
    RUN_TEST(test_socket_at_odd_offsets_equals_rank_order_reference_bitwise);
    RUN_TEST(test_socket_with_alloc_and_malloc_buffers_mixed_equals_rank_order_reference_bitwise);
    RUN_TEST(test_single_copy_and_staged_give_identical_bits_for_every_case);
    RUN_TEST(test_single_copy_and_socket_give_identical_bits_for_every_case);
    RUN_TEST(test_default_reads_in_place_only_all_gather_and_broadcast_blocks_of_64_up_to_512_kib);
    RUN_TEST(test_setting_2_uses_single_copy_where_the_ranks_can_read_each_other);
    RUN_TEST(test_env_single_copy_0_turns_it_off_and_1_and_auto_on);
    RUN_TEST(test_setting_minus_1_keeps_it_off_whatever_the_env_says);
    RUN_TEST(test_rank_barred_from_process_vm_readv_makes_the_job_stage_with_identical_bits);
    RUN_TEST(test_rank_barred_from_process_vm_readv_fails_init_when_single_copy_is_required_saying_why);
    return UNITY_END();
}
