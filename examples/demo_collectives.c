/* demo_collectives: N local ranks joined by shared memory do what FSDP does with every unit:
   all-gather the shards of a parameter, reduce-scatter a gradient, all-reduce a norm.
   Build and run: make demo  (or: build/demo_collectives --nproc 4 --backend socket) */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARD 4 /* elements of the parameter each rank owns */

static int rank_main(fsdp_comm *comm, void *arg) {
    int P = fsdp_comm_size(comm), me = fsdp_comm_rank(comm), i;
    float shard[SHARD], *full = (float *)malloc(sizeof(float) * SHARD * (size_t)P);
    float *grad = (float *)malloc(sizeof(float) * SHARD * (size_t)P), grad_shard[SHARD], sq = 0, probe = 1;
    double t;
    (void)arg;
    for (i = 0; i < SHARD; i++) shard[i] = (float)(me * SHARD + i); /* rank r owns elements 4r..4r+3 */
    if (fsdp_all_gather(comm, shard, full, SHARD, FSDP_F32) != FSDP_SUCCESS) goto fail;
    for (i = 0; i < SHARD * P; i++) grad[i] = full[i] * (float)(me + 1); /* a "gradient" per rank */
    if (fsdp_reduce_scatter(comm, grad, grad_shard, SHARD, FSDP_F32, FSDP_AVG) != FSDP_SUCCESS) goto fail;
    for (i = 0; i < SHARD; i++) sq += grad_shard[i] * grad_shard[i];
    if (fsdp_all_reduce(comm, &sq, &sq, 1, FSDP_F32, FSDP_SUM) != FSDP_SUCCESS) goto fail;
    t = fsdp_now();
    for (i = 0; i < 1000; i++)
        if (fsdp_all_reduce(comm, &probe, &probe, 1, FSDP_F32, FSDP_MAX) != FSDP_SUCCESS) goto fail;
    t = (fsdp_now() - t) / 1000;
    for (i = 0; i < P; i++) { /* print in rank order */
        if (i == me) {
            printf("rank %d/%d  shard [%g %g %g %g]  gathered %d values  grad shard [%g %g %g %g]  |grad|^2 %g  "
                   "small all_reduce %.1f us\n",
                   me, P, shard[0], shard[1], shard[2], shard[3], SHARD * P, grad_shard[0], grad_shard[1],
                   grad_shard[2], grad_shard[3], sq, t * 1e6);
            fflush(stdout);
        }
        if (fsdp_barrier(comm) != FSDP_SUCCESS) goto fail;
    }
    free(full);
    free(grad);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", me, fsdp_comm_last_error(comm));
    return 1;
}

static void usage(FILE *out) {
    fprintf(out, "usage: demo_collectives [--nproc N] [--backend shm|socket]\n"
                 "  Forks N local ranks (default 4) joined by shared memory (or TCP on loopback) and\n"
                 "  runs the collectives FSDP uses: all-gather, reduce-scatter, all-reduce.\n");
}

int main(int argc, char **argv) {
    fsdp_launch_desc desc;
    fsdp_launch_status status;
    int i;
    memset(&desc, 0, sizeof desc);
    desc.nprocs = 4;
    desc.backend = FSDP_BACKEND_SHM;
    desc.timeout_ms = 30000;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { usage(stdout); return 0; }
        if (strcmp(argv[i], "--nproc") == 0 && i + 1 < argc) desc.nprocs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            const char *b = argv[++i];
            if (strcmp(b, "shm") == 0) desc.backend = FSDP_BACKEND_SHM;
            else if (strcmp(b, "socket") == 0) desc.backend = FSDP_BACKEND_SOCKET;
            else { fprintf(stderr, "demo_collectives: unknown backend '%s'\n", b); usage(stderr); return 2; }
        } else { fprintf(stderr, "demo_collectives: unknown argument '%s'\n", argv[i]); usage(stderr); return 2; }
    }
    if (desc.nprocs < 1 || desc.nprocs > 64) { fprintf(stderr, "demo_collectives: --nproc must be 1..64\n"); return 2; }
    if (fsdp_launch_ex(&desc, rank_main, NULL, &status) != FSDP_SUCCESS) {
        fprintf(stderr, "demo_collectives: %s\n", status.message);
        return 1;
    }
    return 0;
}
