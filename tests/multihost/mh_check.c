/* mh_check.c - one rank of a multi-host check, started by tests/multihost/test_multihost.sh in
   the test bed's hosts with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

   It joins from the environment and checks, against a reference it computes itself:
     - topology: fsdp_comm_num_hosts / local rank and size match the layout given in MH_LAYOUT
       ("2,2": ranks 0-1 on the first host, 2-3 on the second);
     - every collective, every dtype and reduce op, at sizes from 1 element to 4 MiB: all_gather
       and broadcast exact; reductions bitwise equal to the documented order (inside a host in
       rank order, then the hosts' partials in host order, 16-bit partials rounded between the
       two levels; flat rank order when every rank has a host to itself or all share one);
     - the same on fsdp_comm_alloc buffers (f32, bf16), which a host's ranks read directly;
     - fsdp_comm_split: a group of one host's ranks runs on shm, one rank per host on sockets.
   Prints "mh_check: rank R: N checks, F failed" and one line per failure; exits 1 on failure.
   MH_OPS_ONLY=1 skips the splits; MH_MAX_COUNT caps the sizes (slow links); MH_LOOP_MS keeps
   all_reducing that long (a link may be cut meanwhile) and reports how the first failure looked;
   with MH_LOOP_OP=all_gather it all-gathers instead (256 KiB per rank), and MH_LAG_RANK=r makes
   rank r join every op MH_LAG_MS (default 300) late; MH_SET_TIMEOUT=r:ms gives rank r that
   timeout with fsdp_comm_set_timeout.
   Built with mpicc -DFSDP_WITH_MPI it runs under mpirun on the MPI bridge, which folds in the
   same order as the sockets for the same layout. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int checks, failures, rank_id;

static void check(int ok, const char *fmt, ...) {
    va_list ap;
    checks++;
    if (ok) return;
    failures++;
    if (failures > 20) return;
    fprintf(stderr, "mh_check: rank %d: FAIL: ", rank_id);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* A value per (rank, element) whose sums are not exact in f32: order shows in the bits. */
static float value(int rank, size_t i, int salt) {
    uint64_t x = (uint64_t)rank * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull ^ (uint64_t)salt * 0x94d049bb133111ebull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0) * (1.0f + (float)(rank % 3));
}

static void put(void *buf, fsdp_dtype dtype, size_t i, float v) {
    if (dtype == FSDP_F32) ((float *)buf)[i] = v;
    else if (dtype == FSDP_BF16) ((uint16_t *)buf)[i] = fsdp_f32_to_bf16(v);
    else ((uint16_t *)buf)[i] = fsdp_f32_to_f16(v);
}

static float get(const void *buf, fsdp_dtype dtype, size_t i) {
    if (dtype == FSDP_F32) return ((const float *)buf)[i];
    if (dtype == FSDP_BF16) return fsdp_bf16_to_f32(((const uint16_t *)buf)[i]);
    return fsdp_f16_to_f32(((const uint16_t *)buf)[i]);
}

static float round_to(fsdp_dtype dtype, float v) {
    if (dtype == FSDP_BF16) return fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
    if (dtype == FSDP_F16) return fsdp_f16_to_f32(fsdp_f32_to_f16(v));
    return v;
}

static float combine(float acc, float x, fsdp_reduce_op op) {
    if (op != FSDP_MAX) return acc + x;
    if (acc != acc) return acc;
    if (x != x) return x;
    return acc > x ? acc : x;
}

#define MH_MAX_WORLD 4096 /* the ranks this checker follows */

typedef struct layout {
    int world, hosts, two_level;
    int host_of[MH_MAX_WORLD];
} layout;

/* The documented result of reducing element i (inputs as stored in dtype) over all ranks. */
static float reference(const layout *lay, fsdp_dtype dtype, fsdp_reduce_op op, size_t i, int salt) {
    float total = 0.0f;
    int r, h, first = 1;
    if (!lay->two_level) {
        for (r = 0; r < lay->world; r++) {
            float x = round_to(dtype, value(r, i, salt));
            total = first ? x : combine(total, x, op);
            first = 0;
        }
    } else {
        for (h = 0; h < lay->hosts; h++) {
            float partial = 0.0f;
            int first_in_host = 1;
            for (r = 0; r < lay->world; r++) {
                float x;
                if (lay->host_of[r] != h) continue;
                x = round_to(dtype, value(r, i, salt));
                partial = first_in_host ? x : combine(partial, x, op);
                first_in_host = 0;
            }
            partial = round_to(dtype, partial); /* partials travel in the dtype */
            total = first ? partial : combine(total, partial, op);
            first = 0;
        }
    }
    if (op == FSDP_AVG) total /= (float)lay->world;
    return round_to(dtype, total);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b); }

/* Every op at every size and dtype (registered: f32 and bf16 only), on buffers from malloc or
   (registered) from fsdp_comm_alloc, which the ranks of a host read directly from each other. */
static void check_ops(fsdp_comm *comm, const layout *lay, int registered) {
    static const size_t counts[] = {1, 7, 1000, 16411, 100003, 1 << 20};
    size_t max_count = getenv("MH_MAX_COUNT") ? (size_t)atol(getenv("MH_MAX_COUNT")) : (size_t)1 << 20;
    static const fsdp_dtype dtypes[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const fsdp_reduce_op ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
    int P = lay->world, me = fsdp_comm_rank(comm), salt = registered ? 1000 : 0, ci, di, oi, r;
    const char *kind = registered ? ", registered" : "";
    for (ci = 0; ci < (int)(sizeof counts / sizeof counts[0]); ci++)
        for (di = 0; di < (registered ? 2 : 3); di++) {
            size_t n = counts[ci], es = fsdp_dtype_size(dtypes[di]), total = n * es * (size_t)P, i, bad;
            fsdp_dtype dt = dtypes[di];
            char *send = NULL, *recv = NULL;
            if ((dt == FSDP_F16 && n > 100003) || n > max_count) continue; /* keep it short */
            if (registered) {
                void *a = NULL, *b = NULL;
                check(fsdp_comm_alloc(comm, total, &a) == 0 && fsdp_comm_alloc(comm, total, &b) == 0,
                      "fsdp_comm_alloc(%zu): %s", total, fsdp_comm_last_error(comm));
                if (!a || !b) { fsdp_comm_free(comm, a); fsdp_comm_free(comm, b); return; }
                /* on a two-level world a host's ranks share it; flat sockets: ordinary memory */
                check(fsdp_comm_is_shared(comm, a, total) ==
                          (!strcmp(fsdp_comm_transport(comm), "socket+shm") && fsdp_comm_local_size(comm) > 1),
                      "fsdp_comm_is_shared says %d", fsdp_comm_is_shared(comm, a, total));
                send = (char *)a;
                recv = (char *)b;
            } else {
                send = (char *)malloc(total);
                recv = (char *)malloc(total);
                if (!send || !recv) { free(send); free(recv); check(0, "out of memory"); return; }
            }
            /* all_gather */
            salt++;
            for (i = 0; i < n; i++) put(send, dt, i, value(me, i, salt));
            check(fsdp_all_gather(comm, send, recv, n, dt) == 0, "all_gather(%zu, %s): %s", n, fsdp_dtype_name(dt),
                  fsdp_comm_last_error(comm));
            for (bad = 0, r = 0; r < P; r++)
                for (i = 0; i < n; i++) bad += !same_bits(get(recv, dt, (size_t)r * n + i), round_to(dt, value(r, i, salt)));
            check(bad == 0, "all_gather(%zu, %s%s): %zu elements differ", n, fsdp_dtype_name(dt), kind, bad);
            salt++; /* in place: this rank's block of recv is its input */
            for (i = 0; i < n; i++) put(recv + (size_t)me * n * es, dt, i, value(me, i, salt));
            check(fsdp_all_gather(comm, recv + (size_t)me * n * es, recv, n, dt) == 0, "all_gather in place(%zu, %s): %s", n,
                  fsdp_dtype_name(dt), fsdp_comm_last_error(comm));
            for (bad = 0, r = 0; r < P; r++)
                for (i = 0; i < n; i++) bad += !same_bits(get(recv, dt, (size_t)r * n + i), round_to(dt, value(r, i, salt)));
            check(bad == 0, "all_gather in place(%zu, %s%s): %zu elements differ", n, fsdp_dtype_name(dt), kind, bad);
            /* broadcast from every root (small sizes) or two roots */
            for (r = 0; r < P; r += n > 1000 ? P - 1 : 1) {
                salt++;
                for (i = 0; i < n; i++) put(recv, dt, i, me == r ? value(r, i, salt) : 0.0f);
                check(fsdp_broadcast(comm, recv, n, dt, r) == 0, "broadcast(%zu, root %d): %s", n, r, fsdp_comm_last_error(comm));
                for (bad = 0, i = 0; i < n; i++) bad += !same_bits(get(recv, dt, i), round_to(dt, value(r, i, salt)));
                check(bad == 0, "broadcast(%zu, %s%s, root %d): %zu elements differ", n, fsdp_dtype_name(dt), kind, r, bad);
                if (P == 1) break;
            }
            for (oi = 0; oi < 3; oi++) {
                fsdp_reduce_op op = ops[oi];
                /* reduce_scatter: block b of every rank's send is element block b */
                salt++;
                for (r = 0; r < P; r++)
                    for (i = 0; i < n; i++) put(send, dt, (size_t)r * n + i, value(me, (size_t)r * n + i, salt));
                check(fsdp_reduce_scatter(comm, send, recv, n, dt, op) == 0, "reduce_scatter(%zu): %s", n,
                      fsdp_comm_last_error(comm));
                for (bad = 0, i = 0; i < n; i++)
                    bad += !same_bits(get(recv, dt, i), reference(lay, dt, op, (size_t)me * n + i, salt));
                check(bad == 0, "reduce_scatter(%zu, %s%s, op %d): %zu elements differ from the documented order", n,
                      fsdp_dtype_name(dt), kind, (int)op, bad);
                /* all_reduce, out of place and in place */
                salt++;
                for (i = 0; i < n; i++) put(send, dt, i, value(me, i, salt));
                check(fsdp_all_reduce(comm, send, recv, n, dt, op) == 0, "all_reduce(%zu): %s", n, fsdp_comm_last_error(comm));
                for (bad = 0, i = 0; i < n; i++) bad += !same_bits(get(recv, dt, i), reference(lay, dt, op, i, salt));
                check(bad == 0, "all_reduce(%zu, %s%s, op %d): %zu elements differ from the documented order", n,
                      fsdp_dtype_name(dt), kind, (int)op, bad);
                check(fsdp_all_reduce(comm, send, send, n, dt, op) == 0, "all_reduce in place(%zu)", n);
                for (bad = 0, i = 0; i < n; i++) bad += !same_bits(get(send, dt, i), reference(lay, dt, op, i, salt));
                check(bad == 0, "all_reduce in place(%zu, %s%s, op %d): %zu elements differ", n, fsdp_dtype_name(dt), kind, (int)op, bad);
            }
            if (registered) {
                fsdp_comm_free(comm, send);
                fsdp_comm_free(comm, recv);
            } else {
                free(send);
                free(recv);
            }
        }
    check(fsdp_barrier(comm) == 0, "barrier: %s", fsdp_comm_last_error(comm));
}

static void check_splits(fsdp_comm *comm) {
    fsdp_comm *host_group = NULL, *replicas = NULL;
    int me = fsdp_comm_rank(comm), host = fsdp_comm_host_of(comm, me), local = fsdp_comm_local_rank(comm);
    float x = 1.0f, y = 1.0f;
    check(fsdp_comm_split(comm, host, me, &host_group) == 0, "split by host: %s", fsdp_comm_last_error(comm));
    check(fsdp_comm_split(comm, local, me, &replicas) == 0, "split by local rank: %s", fsdp_comm_last_error(comm));
    if (!host_group || !replicas) return;
    if (fsdp_comm_size(host_group) > 1)
        check(fsdp_comm_backend(host_group) == FSDP_BACKEND_SHM, "a group of one host's ranks runs on %s, not shm",
              fsdp_backend_name(fsdp_comm_backend(host_group)));
    check(fsdp_all_reduce(host_group, &x, &x, 1, FSDP_F32, FSDP_SUM) == 0 && x == (float)fsdp_comm_local_size(comm),
          "all_reduce on the host group gave %g", x);
    check(fsdp_all_reduce(replicas, &y, &y, 1, FSDP_F32, FSDP_SUM) == 0 && y == (float)fsdp_comm_size(replicas),
          "all_reduce on the replica group gave %g", y);
    fsdp_comm_destroy(host_group);
    fsdp_comm_destroy(replicas);
}

/* The wall clock (the same in every host of the bed: one machine), for when the job formed. */
static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The sockets this process holds. */
static int count_sockets(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], target[64];
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        ssize_t len;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        if ((len = readlink(path, target, sizeof target - 1)) > 0) {
            target[len] = 0;
            n += strncmp(target, "socket:", 7) == 0;
        }
    }
    if (d) closedir(d);
    return n;
}

int main(void) {
    fsdp_comm *comm = NULL;
    layout lay;
    char err[512];
    const char *spec = getenv("MH_LAYOUT"), *loop = getenv("MH_LOOP_MS");
    int r, h, n, expected_hosts = 0, contiguous = 1;
    double started = fsdp_now(), wall_started = wall_now(), wall_joined;
    if (fsdp_comm_init_from_env(&comm, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "mh_check: init failed: %s\n", err);
        return 2;
    }
    wall_joined = wall_now();
    rank_id = fsdp_comm_rank(comm);
    /* (examples/bench_scale.sh reads this line: when the job formed, and what it holds) */
    printf("mh_check: rank %d: init from %.6f to %.6f (wall clock), %d sockets\n", fsdp_comm_rank(comm), wall_started,
           wall_joined, count_sockets());
    memset(&lay, 0, sizeof lay);
    lay.world = fsdp_comm_size(comm);
    if (lay.world > MH_MAX_WORLD) {
        fprintf(stderr, "mh_check: a world of %d ranks; this checker follows at most %d\n", lay.world, MH_MAX_WORLD);
        return 2;
    }
    lay.hosts = fsdp_comm_num_hosts(comm);
    for (r = 0; r < lay.world && r < MH_MAX_WORLD; r++) lay.host_of[r] = fsdp_comm_host_of(comm, r);
    for (r = 1; r < lay.world; r++) contiguous &= lay.host_of[r] == lay.host_of[r - 1] || lay.host_of[r] == lay.host_of[r - 1] + 1;
    /* the documented order: two levels for several hosts, several ranks on some, numbered host by host */
    lay.two_level = lay.hosts > 1 && lay.hosts < lay.world && contiguous && !(getenv("FSDP_HIERARCHICAL") &&
                                                                             strcmp(getenv("FSDP_HIERARCHICAL"), "0") == 0);
    check(fsdp_comm_hierarchical(comm) == lay.two_level, "fsdp_comm_hierarchical says %d for this layout",
          fsdp_comm_hierarchical(comm));
    if (spec) { /* "2,1,3": the ranks per host the launcher placed */
        const char *at = spec;
        int first = 0;
        for (h = 0; *at; h++) {
            n = atoi(at);
            for (r = first; r < first + n && r < lay.world; r++) check(lay.host_of[r] == h, "rank %d is on host %d, not %d", r, lay.host_of[r], h);
            if (rank_id >= first && rank_id < first + n)
                check(fsdp_comm_local_rank(comm) == rank_id - first && fsdp_comm_local_size(comm) == n,
                      "local rank/size %d/%d, expected %d/%d", fsdp_comm_local_rank(comm), fsdp_comm_local_size(comm),
                      rank_id - first, n);
            first += n;
            expected_hosts++;
            while (*at && *at != ',') at++;
            if (*at == ',') at++;
        }
        check(lay.hosts == expected_hosts, "%d hosts seen, %d expected", lay.hosts, expected_hosts);
    }
    if (loop) { /* fault tests: all_reduce until something fails or the time is up */
        static float buf[1 << 18], *gathered;
        const char *op = getenv("MH_LOOP_OP"), *lag_rank = getenv("MH_LAG_RANK"), *lag_ms = getenv("MH_LAG_MS");
        double until = fsdp_now() + atof(loop) / 1000.0, t0 = 0, lag = 0;
        size_t piece = (size_t)1 << 16;
        int rc = 0, gather = op && strcmp(op, "all_gather") == 0;
        const char *set_timeout = getenv("MH_SET_TIMEOUT");
        if (lag_rank && *lag_rank && atoi(lag_rank) == rank_id) lag = (lag_ms ? atof(lag_ms) : 300.0) / 1000.0;
        if (set_timeout && strchr(set_timeout, ':') && atoi(set_timeout) == rank_id)
            fsdp_comm_set_timeout(comm, atoi(strchr(set_timeout, ':') + 1));
        if (gather && !(gathered = (float *)malloc(piece * (size_t)lay.world * sizeof *gathered))) return 2;
        while (fsdp_now() < until) {
            if (lag > 0) {
                struct timespec ts;
                ts.tv_sec = (time_t)lag;
                ts.tv_nsec = (long)((lag - (double)ts.tv_sec) * 1e9);
                nanosleep(&ts, NULL);
            }
            t0 = fsdp_now();
            rc = gather ? fsdp_all_gather(comm, buf, gathered, piece, FSDP_F32)
                        : fsdp_all_reduce(comm, buf, buf, sizeof buf / sizeof buf[0], FSDP_F32, FSDP_SUM);
            if (rc) break;
        }
        if (gather) free(gathered);
        printf("mh_check: rank %d: loop %s after %.1f s (op took %.1f s): %s\n", rank_id, rc ? "failed" : "done",
               fsdp_now() - started, rc ? fsdp_now() - t0 : 0.0, rc ? fsdp_comm_last_error(comm) : "ok");
        fsdp_comm_destroy(comm);
        return rc ? 3 : 0;
    }
    check_ops(comm, &lay, 0);
    if (!getenv("MH_OPS_ONLY")) check_ops(comm, &lay, 1);
    if (!getenv("MH_OPS_ONLY")) check_splits(comm);
    printf("mh_check: rank %d of %d (host %d, local %d of %d, %s, %s): %d checks, %d failed, %.1f s\n", rank_id,
           lay.world, lay.host_of[rank_id], fsdp_comm_local_rank(comm), fsdp_comm_local_size(comm),
           fsdp_backend_name(fsdp_comm_backend(comm)), lay.two_level ? "two-level order" : "rank order", checks, failures,
           fsdp_now() - started);
    fsdp_comm_destroy(comm);
    return failures ? 1 : 0;
}
