/* bench_comm.c - collective bandwidth of fsdp.h, measured the way nccl-tests measures it.

   Build (make bench, make bench-mpi) and run from the repository root:
       gcc -std=c99 -O2 -I. examples/bench_comm.c -o build/bench_comm -lpthread -lm
       build/bench_comm --nproc 4                              # shm, every op, 1 KiB .. 256 MiB
       build/bench_comm --nproc 2 --op all_gather --sizes 64M --single-copy 0   # shm, staged
       build/bench_comm --backend socket --nproc 2 --op all_reduce --sizes 1M,64M --csv
       mpicc -DFSDP_WITH_MPI -std=c99 -O2 -I. examples/bench_comm.c -o build/bench_comm_mpi -lm
       mpirun -np 4 build/bench_comm_mpi --backend mpi              # through fsdp.h's MPI bridge
       mpirun -np 4 build/bench_comm_mpi --backend mpi --mpi-native # MPI's own collectives

   S is the full, unsharded buffer: all_gather's output, reduce_scatter's input, all_reduce's
   and broadcast's buffer (broadcast from rank 0), all_to_all's send buffer (P pieces of S/P).
   Each iteration is timed alone after a barrier; it lasts as long as its slowest rank, and a row
   reports the median iteration.
       algbw = S / t        busbw = algbw * (P-1)/P     all_gather, reduce_scatter, all_to_all,
                                                        reduce_scatter_wire
                                    algbw * 2(P-1)/P    all_reduce
                                    algbw               broadcast
   reduce_scatter_wire (only when asked for: --op reduce_scatter_wire) is fsdp_reduce_scatter_wire
   over --hosts H groups of P/H consecutive ranks standing in for hosts (comms split by color):
   f32 inside a group, --wire int8|int4 between groups, S its f32 input as reduce_scatter's. On
   one machine the groups share memory, so the row shows what quantizing costs, not what it
   saves on a link; its check allows the wire's rounding error.
   busbw compares across ops and rank counts: it is what the busiest link carried per second.
   The first call at each size is checked against known values, so a fast but wrong backend
   cannot post a number: a wrong result exits 1. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FSDP_WITH_MPI
#include <mpi.h>
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "example_common.h"

#define MAX_SIZES 64

typedef struct options {
    fsdp_backend_kind backend;
    int nprocs;                 /* 0: not given */
    unsigned ops;               /* bit k: all_ops[k] */
    size_t sizes[MAX_SIZES];    /* bytes of S */
    int nsizes;
    fsdp_dtype dtype;
    int iters;                  /* 0: chosen per size */
    int warmup;
    int csv, inplace, mpi_native, registered, from_env;
    int single_copy;            /* --single-copy: -1 not given, 0 staged, 1 single copy, 2 auto */
    int hosts;                  /* reduce_scatter_wire: groups standing in for hosts */
    fsdp_wire wire;             /* reduce_scatter_wire: between the groups */
} options;

typedef struct bench {
    const options *opt;
    fsdp_comm *comm;            /* NULL with --mpi-native */
    int rank, nranks;
    fsdp_comm *host, *cross;    /* reduce_scatter_wire: this rank's group, and its peers of the other groups */
} bench;

/* fsdp_reduce_scatter_wire, in the op column (no fsdp_coll_kind of its own: built from others) */
#define OP_REDUCE_SCATTER_WIRE ((fsdp_coll_kind)100)
#define NUM_OPS 6
#define CLASSIC_OPS 5           /* --op all: the collectives, not reduce_scatter_wire */
static const fsdp_coll_kind all_ops[NUM_OPS] = {
    FSDP_COLL_ALL_GATHER, FSDP_COLL_REDUCE_SCATTER, FSDP_COLL_ALL_REDUCE, FSDP_COLL_BROADCAST,
    FSDP_COLL_ALL_TO_ALL, OP_REDUCE_SCATTER_WIRE
};

static const char *op_name(fsdp_coll_kind kind)
{
    return kind == OP_REDUCE_SCATTER_WIRE ? "reduce_scatter_wire" : fsdp_coll_name(kind);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: bench_comm [options]\n"
        "  --backend shm|socket|mpi  collective backend (default shm)\n"
        "  --nproc P                 ranks to fork for shm and socket (default 2); with mpi the\n"
        "                            ranks come from mpirun (-np), and P, if given, must match\n"
        "  --op all_gather|reduce_scatter|all_reduce|broadcast|all_to_all|reduce_scatter_wire|all\n"
        "                            (default all: the first five; broadcast is from rank 0)\n"
        "  --hosts H                 reduce_scatter_wire: H groups of P/H ranks stand in for hosts\n"
        "                            (default 2)\n"
        "  --wire int8|int4          reduce_scatter_wire: the format between groups (default int8)\n"
        "  --sizes 1K,64K,1M,...     full buffer sizes, K/M/G = 1024^1/2/3\n"
        "                            (default 1K,4K,16K,...,256M)\n"
        "  --dtype f32|bf16|f16      element type (default f32)\n"
        "  --iters N                 timed iterations per size\n"
        "                            (default min(200, max(5, 2 GiB / size)))\n"
        "  --warmup N                untimed iterations per size (default 3)\n"
        "  --inplace                 in-place buffers instead of separate send and receive\n"
        "                            (all_to_all has no in-place form: it runs out of place)\n"
        "  --registered              buffers from fsdp_comm_alloc, which shm peers read directly\n"
        "                            (zero-copy); the backend column then says e.g. shm-registered\n"
        "  --single-copy 0|1|auto    shm with malloc buffers: 1 = peers read each other's buffers\n"
        "                            directly (process_vm_readv, one copy; the run fails if the\n"
        "                            system forbids it), 0 = staged through the shared segment\n"
        "                            (two copies), auto = single copy where the ranks can.\n"
        "                            Default: as FSDP_SHM_SINGLE_COPY says (unset: single\n"
        "                            copy for all_gather blocks of 64..512 KiB and broadcasts of\n"
        "                            256..512 KiB where the ranks can, else staged).\n"
        "                            Ops under 64 KiB always stage. The backend column: shm\n"
        "                            (malloc, default), shm-1copy, shm-staged, shm-auto,\n"
        "                            shm-registered (fsdp_comm_alloc)\n"
        "  --csv                     backend,P,op,bytes,median_us,algbw_GBps,busbw_GBps lines\n"
        "  --from-env                ranks from the environment, as a job launched by torchrun,\n"
        "                            srun or by hand across hosts (RANK, WORLD_SIZE, MASTER_ADDR,\n"
        "                            MASTER_PORT, FSDP_BACKEND, ...; see README, Many machines)\n"
        "  --mpi-native              with --backend mpi: time MPI_Allgather, MPI_Reduce_scatter_block,\n"
        "                            MPI_Allreduce (MPI_FLOAT, sum), MPI_Bcast and MPI_Alltoall\n"
        "                            directly, not fsdp.h's bridge\n"
        "  --help                    this text\n");
}

/* Rank given by an MPI launcher, so that only one process of `mpirun` complains about flags. */
static int launcher_rank(void)
{
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMI_RANK");
    return r ? atoi(r) : 0;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (end == s) return 0;
    if (*end == 'K' || *end == 'k') shift = 10;
    else if (*end == 'M' || *end == 'm') shift = 20;
    else if (*end == 'G' || *end == 'g') shift = 30;
    if (shift) end++;
    if (*end || v == 0 || v > (SIZE_MAX >> shift)) return 0;
    *out = (size_t)v << shift;
    return 1;
}

static int parse_int(const char *s, int min, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < min || v > INT_MAX) return 0;
    *out = (int)v;
    return 1;
}

/* Index of s in the NULL-terminated list names, or -1. */
static int lookup(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

/* Sets *run when the benchmark should run; otherwise returns the exit code (0 after --help,
   2 for a bad command line, with a message and the usage on stderr). */
static int parse_options(int argc, char **argv, options *opt, int *run)
{
    static const char *const backends[] = { "shm", "socket", "mpi", NULL };  /* FSDP_BACKEND_ 1.. */
    static const char *const dtypes[] = { "f32", "bf16", "f16", NULL };      /* FSDP_F32 1.. */
    static const char *const ops[] = { "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all",
                                       "reduce_scatter_wire", "all", NULL };
    static const char *const wires[] = { "int8", "int4", NULL };
    int quiet = launcher_rank() != 0, k;
    memset(opt, 0, sizeof *opt);
    opt->backend = FSDP_BACKEND_SHM;
    opt->ops = (1u << CLASSIC_OPS) - 1;
    opt->hosts = 2;
    opt->wire = FSDP_WIRE_INT8;
    opt->dtype = FSDP_F32;
    opt->single_copy = -1;
    opt->warmup = 3;
    for (size_t s = 1024; s <= ((size_t)256 << 20); s *= 4) opt->sizes[opt->nsizes++] = s;
    *run = 0;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : ""; /* "" fails below */
        int ok = 1, takes_value = 1;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            if (!quiet) usage(stdout);
            return 0;
        } else if (!strcmp(flag, "--csv")) { opt->csv = 1; takes_value = 0; }
        else if (!strcmp(flag, "--inplace")) { opt->inplace = 1; takes_value = 0; }
        else if (!strcmp(flag, "--registered")) { opt->registered = 1; takes_value = 0; }
        else if (!strcmp(flag, "--mpi-native")) { opt->mpi_native = 1; takes_value = 0; }
        else if (!strcmp(flag, "--from-env")) { opt->from_env = 1; takes_value = 0; }
        else if (!strcmp(flag, "--backend")) {
            if ((ok = (k = lookup(val, backends)) >= 0)) opt->backend = (fsdp_backend_kind)(k + 1);
        } else if (!strcmp(flag, "--dtype")) {
            if ((ok = (k = lookup(val, dtypes)) >= 0)) opt->dtype = (fsdp_dtype)(k + 1);
        } else if (!strcmp(flag, "--op")) {
            if ((ok = (k = lookup(val, ops)) >= 0)) opt->ops = k == NUM_OPS ? (1u << CLASSIC_OPS) - 1 : 1u << k;
        } else if (!strcmp(flag, "--wire")) {
            if ((ok = (k = lookup(val, wires)) >= 0)) opt->wire = k == 0 ? FSDP_WIRE_INT8 : FSDP_WIRE_INT4;
        } else if (!strcmp(flag, "--sizes")) {
            char list[1024], *save = NULL;
            opt->nsizes = 0;
            ok = strlen(val) < sizeof list;
            if (ok) strcpy(list, val);
            for (char *t = ok ? strtok_r(list, ",", &save) : NULL; t && ok;
                 t = strtok_r(NULL, ",", &save))
                ok = opt->nsizes < MAX_SIZES && parse_size(t, &opt->sizes[opt->nsizes++]);
            ok = ok && opt->nsizes > 0;
        } else if (!strcmp(flag, "--nproc")) ok = parse_int(val, 1, &opt->nprocs);
        else if (!strcmp(flag, "--iters")) ok = parse_int(val, 1, &opt->iters);
        else if (!strcmp(flag, "--hosts")) ok = parse_int(val, 1, &opt->hosts);
        else if (!strcmp(flag, "--warmup")) ok = parse_int(val, 0, &opt->warmup);
        else if (!strcmp(flag, "--single-copy")) {
            static const char *const modes[] = { "0", "1", "auto", NULL };
            ok = (opt->single_copy = lookup(val, modes)) >= 0;
        }
        else {
            if (!quiet) fprintf(stderr, "bench_comm: unknown flag '%s'\n", flag);
            goto bad;
        }
        if (!ok) {
            if (!quiet) fprintf(stderr, "bench_comm: bad or missing value for %s: '%s'\n", flag, val);
            goto bad;
        }
        i += takes_value;
    }
    if (opt->mpi_native && opt->registered) {
        if (!quiet) fprintf(stderr, "bench_comm: --registered is fsdp.h memory; it does not apply to --mpi-native\n");
        goto bad;
    }
    if (opt->single_copy >= 0 && opt->backend != FSDP_BACKEND_SHM) {
        if (!quiet) fprintf(stderr, "bench_comm: --single-copy chooses how the shm backend moves malloc "
                            "buffers; it does not apply to --backend %s\n", backends[opt->backend - 1]);
        goto bad;
    }
    if ((opt->ops & (1u << 5)) && (opt->dtype != FSDP_F32 || opt->mpi_native)) {
        if (!quiet) fprintf(stderr, "bench_comm: reduce_scatter_wire reduces f32 through fsdp.h: not with --dtype %s "
                            "or --mpi-native\n", fsdp_dtype_name(opt->dtype));
        goto bad;
    }
    if (opt->mpi_native && (opt->backend != FSDP_BACKEND_MPI || opt->dtype != FSDP_F32)) {
        if (!quiet) fprintf(stderr, "bench_comm: --mpi-native needs --backend mpi and --dtype f32\n");
        goto bad;
    }
    *run = 1;
    return 0;
bad:
    if (!quiet) usage(stderr);
    return 2;
}

static float get(fsdp_dtype dtype, const void *buf, size_t i)
{
    if (dtype == FSDP_F32) return ((const float *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    return dtype == FSDP_BF16 ? fsdp_bf16_to_f32(h) : fsdp_f16_to_f32(h);
}

static void put(fsdp_dtype dtype, void *buf, size_t i, float v)
{
    if (dtype == FSDP_F32) ((float *)buf)[i] = v;
    else ((uint16_t *)buf)[i] = dtype == FSDP_BF16 ? fsdp_f32_to_bf16(v) : fsdp_f32_to_f16(v);
}

/* Test data, exact in every dtype: all_gather element g of the full buffer (rank-dependent
   because g = rank*count + j), and rank r's contribution to element g of a sum, which every
   rank makes nonzero so that a dropped or doubled rank changes every element. */
static float gather_value(size_t g) { return (float)(g % 251); }
static float sum_value(int rank, size_t g) { return (float)(rank + 1) + (float)(g % 4); }

/* v as it reads after a round trip through the dtype (rounded to nearest even). */
static float round_to(fsdp_dtype dtype, float v)
{
    if (dtype == FSDP_BF16) return fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
    if (dtype == FSDP_F16) return fsdp_f16_to_f32(fsdp_f32_to_f16(v));
    return v;
}

static int is_native(const bench *b) { return b->comm == NULL; }

/* The backend column: the transport, then where the buffers come from and how shm moves them:
   shm (malloc, as FSDP_SHM_SINGLE_COPY says), shm-1copy / shm-staged / shm-auto (--single-copy
   1 / 0 / auto), shm-registered (fsdp_comm_alloc). */
static void backend_label(const bench *b, char *out, size_t size)
{
    static const char *const modes[] = { "-staged", "-1copy", "-auto" };
    const options *opt = b->opt;
    snprintf(out, size, "%s%s%s", is_native(b) ? "mpi-native" : fsdp_comm_transport(b->comm),
             opt->registered ? "-registered" : "", opt->single_copy >= 0 ? modes[opt->single_copy] : "");
}

/* fsdp_launch_desc/fsdp_comm_desc.shm_single_copy for --single-copy (0: as the environment says). */
static int single_copy_setting(const options *opt)
{
    static const int settings[] = { -1, 1, 2 };
    return opt->single_copy >= 0 ? settings[opt->single_copy] : 0;
}

static int barrier(const bench *b)
{
#ifdef FSDP_WITH_MPI
    if (is_native(b)) return MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS;
#endif
    return fsdp_barrier(b->comm);
}

/* The slowest rank's value of each of n floats, on every rank. */
static int max_across_ranks(const bench *b, float *v, size_t n)
{
#ifdef FSDP_WITH_MPI
    if (is_native(b))
        return MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD) != 0;
#endif
    return fsdp_all_reduce(b->comm, v, v, n, FSDP_F32, FSDP_MAX);
}

/* Where an op reads and writes in the two S-byte buffers x and y. In-place layouts are
   fsdp.h's (see fsdp_coll), except MPI's reduce_scatter, which leaves the result at the start.
   Broadcast has one buffer, x (always in place); all_to_all two (never in place). */
static void layout(const bench *b, fsdp_coll_kind kind, char *x, char *y, size_t count,
                   void **send, void **recv)
{
    char *own = x + (size_t)b->rank * count * fsdp_dtype_size(b->opt->dtype);
    int in = b->opt->inplace;
    if (kind == FSDP_COLL_BROADCAST) {
        *send = *recv = x;
    } else if (kind == FSDP_COLL_ALL_GATHER) {
        *recv = y;
        *send = in ? y + (own - x) : x;
    } else if (kind == FSDP_COLL_ALL_TO_ALL) {
        *send = x;
        *recv = y;
    } else {
        *send = x;
        *recv = !in ? y : kind == FSDP_COLL_REDUCE_SCATTER && !is_native(b) ? own : x;
    }
}

static int collective(const bench *b, fsdp_coll_kind kind, void *send, void *recv, size_t count)
{
#ifdef FSDP_WITH_MPI
    if (is_native(b)) {
        const void *s = b->opt->inplace && kind != FSDP_COLL_ALL_TO_ALL ? MPI_IN_PLACE : send;
        int n = (int)count;
        if (count > INT_MAX) {
            fprintf(stderr, "bench_comm: %zu elements per call is more than MPI's int count\n", count);
            return 1;
        }
        if (kind == FSDP_COLL_ALL_GATHER)
            return MPI_Allgather(s, n, MPI_FLOAT, recv, n, MPI_FLOAT, MPI_COMM_WORLD);
        if (kind == FSDP_COLL_REDUCE_SCATTER)
            return MPI_Reduce_scatter_block(s, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (kind == FSDP_COLL_BROADCAST) return MPI_Bcast(recv, n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        if (kind == FSDP_COLL_ALL_TO_ALL) return MPI_Alltoall(s, n, MPI_FLOAT, recv, n, MPI_FLOAT, MPI_COMM_WORLD);
        return MPI_Allreduce(s, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
#endif
    if (kind == FSDP_COLL_ALL_GATHER) return fsdp_all_gather(b->comm, send, recv, count, b->opt->dtype);
    if (kind == FSDP_COLL_REDUCE_SCATTER)
        return fsdp_reduce_scatter(b->comm, send, recv, count, b->opt->dtype, FSDP_SUM);
    if (kind == FSDP_COLL_BROADCAST) return fsdp_broadcast(b->comm, recv, count, b->opt->dtype, 0);
    if (kind == FSDP_COLL_ALL_TO_ALL) return fsdp_all_to_all(b->comm, send, recv, count, b->opt->dtype);
    if (kind == OP_REDUCE_SCATTER_WIRE)
        return fsdp_reduce_scatter_wire(b->host, b->cross, send, recv, count, FSDP_SUM, b->opt->wire, 0, NULL);
    return fsdp_all_reduce(b->comm, send, recv, count, b->opt->dtype, FSDP_SUM);
}

static int comm_error(const bench *b, const char *what, size_t bytes, int rc)
{
    fprintf(stderr, "bench_comm: rank %d: %s of %zu bytes failed (%s): %s\n", b->rank, what,
            bytes, b->comm ? fsdp_result_name(rc) : "MPI error",
            b->comm ? fsdp_comm_last_error(b->comm) : "");
    return 1;
}

/* Fills the inputs, runs the op once and compares with the exact answer. 0 if right. */
static int check_once(const bench *b, fsdp_coll_kind kind, void *send, void *recv, size_t count,
                      size_t bytes)
{
    fsdp_dtype dt = b->opt->dtype;
    size_t P = (size_t)b->nranks, base = (size_t)b->rank * count, nsend, nrecv;
    float exact_sum_base = (float)(P * (P + 1) / 2), bad = 0;
    int a2a = kind == FSDP_COLL_ALL_TO_ALL; /* values g of a P x P x count cube, rank-major */
    int copies = kind == FSDP_COLL_ALL_GATHER || kind == FSDP_COLL_BROADCAST || a2a; /* no arithmetic */
    size_t first = kind == FSDP_COLL_ALL_GATHER ? base : a2a ? base * P : 0; /* where this rank's values start */
    int wire = kind == OP_REDUCE_SCATTER_WIRE; /* reduce_scatter's data, the wire's rounding allowed */
    float tolerance = wire ? (float)(b->opt->hosts * P * (P + 4)) / (b->opt->wire == FSDP_WIRE_INT8 ? 127 : 7) : 0;
    nsend = kind == FSDP_COLL_REDUCE_SCATTER || a2a || wire ? P * count : kind != FSDP_COLL_BROADCAST ? count
                                             : b->rank == 0 ? count : 0;   /* the root's data */
    nrecv = kind == FSDP_COLL_ALL_GATHER || a2a ? P * count : count;
    memset(recv, 0xff, nrecv * fsdp_dtype_size(dt)); /* NaN in every dtype: stale data fails */
    for (size_t i = 0; i < nsend; i++) /* after the memset: in place, send lies inside recv */
        put(dt, send, i, copies ? gather_value(first + i) : sum_value(b->rank, i));
    int rc = collective(b, kind, send, recv, count);
    if (rc != 0) return comm_error(b, op_name(kind), bytes, rc);
    for (size_t i = 0; i < nrecv && !bad; i++) {
        size_t g = kind == FSDP_COLL_REDUCE_SCATTER || wire ? base + i : a2a ? i / count * P * count + base + i % count : i;
        float want = copies ? gather_value(g) : exact_sum_base + (float)P * (float)(g % 4);
        float expect = round_to(dt, want), got = get(dt, recv, i); /* one rounding, per contract */
        if (wire ? !(fabsf(got - expect) <= tolerance) : got != expect) {
            fprintf(stderr, "bench_comm: rank %d: wrong %s result at %zu bytes: element %zu is %g,"
                    " expected %g\n", b->rank, op_name(kind), bytes, g, got, expect);
            bad = 1;
        }
    }
    if (max_across_ranks(b, &bad, 1) != 0) return comm_error(b, "result check", bytes, 1);
    return bad != 0;
}

static int by_value(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Measures one op at S = bytes (rounded down to whole elements per rank) and prints its row. */
static int measure(const bench *b, fsdp_coll_kind kind, char *x, char *y, size_t bytes)
{
    const options *opt = b->opt;
    size_t es = fsdp_dtype_size(opt->dtype), P = (size_t)b->nranks;
    int whole = kind == FSDP_COLL_ALL_REDUCE || kind == FSDP_COLL_BROADCAST; /* count is S, not S/P */
    size_t count = whole ? bytes / es : bytes / (P * es);
    size_t used = whole ? count * es : count * P * es;
    const char *name = op_name(kind);
    void *send, *recv;
    if (count == 0) {
        if (b->rank == 0) fprintf(stderr, "bench_comm: skipping %s at %zu bytes: less than one "
                                  "element per rank\n", name, bytes);
        return 0;
    }
    layout(b, kind, x, y, count, &send, &recv);
    if (check_once(b, kind, send, recv, count, used) != 0) return 1;
    if (opt->inplace) { memset(x, 0, bytes); memset(y, 0, bytes); } /* repeated in-place sums stay finite */

    int iters = opt->iters;
    if (!iters) {
        size_t n = ((size_t)2 << 30) / used;
        iters = n < 5 ? 5 : n > 200 ? 200 : (int)n;
    }
    float *us = malloc((size_t)iters * sizeof *us);
    if (!us) return fprintf(stderr, "bench_comm: out of memory\n"), 1;
    for (int it = -opt->warmup; it < iters; it++) {
        int rc = barrier(b);
        if (rc != 0) { free(us); return comm_error(b, "barrier", used, rc); }
        double t0 = fsdp_now();
        rc = collective(b, kind, send, recv, count);
        double t1 = fsdp_now();
        if (rc != 0) { free(us); return comm_error(b, name, used, rc); }
        if (it >= 0) us[it] = (float)((t1 - t0) * 1e6);
    }
    int rc = max_across_ranks(b, us, (size_t)iters);
    if (rc != 0) { free(us); return comm_error(b, "timing all_reduce", used, rc); }
    qsort(us, (size_t)iters, sizeof *us, by_value);
    double median = iters % 2 ? us[iters / 2] : 0.5 * (us[iters / 2 - 1] + us[iters / 2]);
    free(us);

    if (b->rank == 0) {
        double algbw = (double)used / median / 1e3; /* bytes per microsecond / 1e3 = GB/s */
        double factor = kind == FSDP_COLL_BROADCAST ? 1.0
                        : (double)(P - 1) / (double)P * (kind == FSDP_COLL_ALL_REDUCE ? 2 : 1);
        char backend[48];
        backend_label(b, backend, sizeof backend);
        if (opt->csv) printf("%s,%zu,%s,%zu,%.2f,%.3f,%.3f\n", backend, P, name, used, median,
                             algbw, algbw * factor);
        else printf("%12zu  %-19s  %10.2f  %10.3f  %10.3f\n", used, name, median, algbw,
                    algbw * factor);
        fflush(stdout);
    }
    return 0;
}

/* Synchronises the ranks for at least 100 ms before the first measurement, so the scheduler
   has spread freshly started ranks over the cores (the first size would otherwise pay for it).
   The ranks decide together when to stop, so they run the same number of barriers. */
static int settle(const bench *b)
{
    double start = fsdp_now();
    for (;;) {
        float elapsed;
        for (int i = 0; i < 50; i++)
            if (barrier(b) != 0) return 1;
        elapsed = (float)(fsdp_now() - start);
        if (max_across_ranks(b, &elapsed, 1) != 0) return 1;
        if (elapsed >= 0.1f) return 0;
    }
}

static int run(const bench *b)
{
    const options *opt = b->opt;
    char machine[320] = "";
    if (b->rank == 0 && !opt->csv) { // before the ops: the others wait at the barrier
        char cpu[256];
        example_cpu_line(cpu, sizeof cpu);
        snprintf(machine, sizeof machine, "%s; memcpy %.1f GB/s on one core", cpu, example_memcpy_gbps());
    }
    if (settle(b) != 0) return comm_error(b, "warm-up barrier", 0, 1);
    if (b->rank == 0) {
        if (opt->csv) printf("backend,P,op,bytes,median_us,algbw_GBps,busbw_GBps\n");
        else {
            char backend[48];
            backend_label(b, backend, sizeof backend);
            printf("# bench_comm (fsdp.h %s): backend %s, %d rank%s, dtype %s, %s, buffers from %s%s\n",
                   fsdp_version_string(), backend, b->nranks, b->nranks == 1 ? "" : "s",
                   fsdp_dtype_name(opt->dtype), opt->inplace ? "in-place" : "out-of-place",
                   opt->registered ? "fsdp_comm_alloc" : "malloc",
                   opt->single_copy == 1 ? ", single copy (peers read them directly)"
                   : opt->single_copy == 0 ? ", staged through the shared segment"
                   : opt->single_copy == 2 ? ", single copy where the ranks can" : "");
            printf("# machine: %s\n", machine);
            printf("# median over iterations of the slowest rank's time; %d warmup iterations\n",
                   opt->warmup);
            if (opt->ops & (1u << 5))
                printf("# reduce_scatter_wire: %d groups of %d ranks standing in for hosts, %s between them\n",
                       opt->hosts, b->nranks / opt->hosts, fsdp_wire_name(opt->wire));
            printf("#%11s  %-19s  %10s  %10s  %10s\n", "bytes", "op", "median_us", "algbw GB/s",
                   "busbw GB/s");
        }
        fflush(stdout);
    }
    for (int s = 0; s < opt->nsizes; s++) {
        size_t bytes = opt->sizes[s];
        char *x = NULL, *y = NULL;
        int rc = 0;
        if (opt->registered) {
            void *vx = NULL, *vy = NULL;
            if ((rc = fsdp_comm_alloc(b->comm, bytes, &vx)) == 0) rc = fsdp_comm_alloc(b->comm, bytes, &vy);
            if (rc != 0) return comm_error(b, "fsdp_comm_alloc", bytes, rc);
            x = vx;
            y = vy;
        } else {
            x = malloc(bytes);
            y = malloc(bytes);
        }
        if (!x || !y) {
            fprintf(stderr, "bench_comm: rank %d: cannot allocate 2 x %zu bytes; try smaller --sizes "
                    "or fewer ranks\n", b->rank, bytes);
            rc = 1;
        } else {
            memset(x, 0, bytes); /* fault every page in now, not in the timed loop */
            memset(y, 0, bytes);
            for (int k = 0; k < NUM_OPS && rc == 0; k++)
                if (opt->ops & (1u << k)) rc = measure(b, all_ops[k], x, y, bytes);
        }
        if (opt->registered) {
            fsdp_comm_free(b->comm, x);
            fsdp_comm_free(b->comm, y);
        } else {
            free(x);
            free(y);
        }
        if (rc != 0) return rc;
    }
    return 0;
}

/* run, with the groups reduce_scatter_wire needs split off first when it is asked for: group
   r / (P/H) of consecutive ranks as the host, the ranks of one index across groups as cross. */
static int run_grouped(bench *b)
{
    int L = b->nranks / (b->opt->hosts > 0 ? b->opt->hosts : 1), rc;
    if (!(b->opt->ops & (1u << 5)) || is_native(b)) return run(b);
    if (b->opt->hosts > b->nranks || b->nranks % b->opt->hosts) {
        if (b->rank == 0) fprintf(stderr, "bench_comm: --hosts %d must divide the %d ranks\n", b->opt->hosts,
                                  b->nranks);
        return 2;
    }
    if (fsdp_comm_split(b->comm, b->rank / L, b->rank, &b->host) != 0 ||
        fsdp_comm_split(b->comm, b->rank % L, b->rank, &b->cross) != 0)
        return comm_error(b, "fsdp_comm_split", 0, 1);
    rc = run(b);
    fsdp_comm_destroy(b->cross);
    fsdp_comm_destroy(b->host);
    return rc;
}

static int rank_main(fsdp_comm *comm, void *arg)
{
    bench b = { (const options *)arg, comm, fsdp_comm_rank(comm), fsdp_comm_size(comm), NULL, NULL };
    return run_grouped(&b);
}

static int run_mpi(const options *opt)
{
#ifndef FSDP_WITH_MPI
    (void)opt;
    fprintf(stderr, "bench_comm: --backend mpi needs a build with MPI: run `make bench-mpi` (or\n"
            "    mpicc -DFSDP_WITH_MPI -std=c99 -O2 -I. examples/bench_comm.c -o build/bench_comm_mpi -lm)\n"
            "and start it with: mpirun -np 4 build/bench_comm_mpi --backend mpi\n");
    return 2;
#else
    bench b = { opt, NULL, 0, 0, NULL, NULL };
    int rc, done = 0;
    if (opt->mpi_native) {
        MPI_Init(NULL, NULL);
        MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);
    } else {
        char err[512] = "";
        setenv("FSDP_BACKEND", "mpi", 1);
        rc = fsdp_comm_init_from_env(&b.comm, NULL, err, sizeof err);
        if (rc != FSDP_SUCCESS) {
            fprintf(stderr, "bench_comm: cannot join the MPI job (%s): %s\n", fsdp_result_name(rc), err);
            return 1;
        }
        b.rank = fsdp_comm_rank(b.comm);
        b.nranks = fsdp_comm_size(b.comm);
    }
    if (opt->nprocs && opt->nprocs != b.nranks) {
        if (b.rank == 0) fprintf(stderr, "bench_comm: --nproc %d but mpirun started %d ranks; with "
                                 "--backend mpi set the rank count with mpirun -np\n",
                                 opt->nprocs, b.nranks);
        rc = 2;
    } else {
        rc = run_grouped(&b);
    }
    if (b.comm) fsdp_comm_destroy(b.comm);
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
    return rc;
#endif
}

int main(int argc, char **argv)
{
    example_program = "bench_comm";
    options opt;
    int run_it, rc = parse_options(argc, argv, &opt, &run_it);
    if (!run_it) return rc;
    if (opt.backend == FSDP_BACKEND_MPI) return run_mpi(&opt);
    if (opt.from_env) {
        fsdp_comm *comm = NULL;
        fsdp_comm_desc defaults;
        char err[512];
        memset(&defaults, 0, sizeof defaults);
        defaults.shm_single_copy = single_copy_setting(&opt);
        if (fsdp_comm_init_from_env(&comm, &defaults, err, sizeof err) != 0) {
            fprintf(stderr, "bench_comm: %s\n", err);
            return 1;
        }
        rc = rank_main(comm, &opt);
        fsdp_comm_destroy(comm);
        return rc;
    }

    fsdp_launch_desc desc;
    fsdp_launch_status status;
    memset(&desc, 0, sizeof desc);
    memset(&status, 0, sizeof status);
    desc.nprocs = opt.nprocs ? opt.nprocs : 2;
    desc.backend = opt.backend;
    desc.shm_single_copy = single_copy_setting(&opt);
    rc = fsdp_launch_ex(&desc, rank_main, &opt, &status);
    if (rc != FSDP_SUCCESS) {
        fprintf(stderr, "bench_comm: %s\n", status.message[0] ? status.message
                                                               : fsdp_result_description(rc));
        return 1;
    }
    return 0;
}
