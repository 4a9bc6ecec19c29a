/* test_hierarchical.c - specification of the hierarchical socket world (>>hier) on one machine:
   ranks that claim different hosts form a world of several hosts, shared memory inside each
   host and sockets between them, and its all_gather gives every rank every rank's block, in
   each of its paths: blocks gathered across 4 or more hosts in rounds (Bruck's algorithm, small
   ops) and copied out, one round to every other host, the pipeline of large ops, and hosts of
   different sizes (a broadcast per block). Its all_to_all gives every rank, at r * count, the
   piece rank r had for it, on hosts of equal and of different sizes.

   For fsdp.h a host is a digest of facts (fsdp__host_facts): the host name among them. Each rank
   here is a forked child that first enters a UTS namespace of its own (as root; elsewhere inside
   a user namespace of its own, where the system allows one) and sets its host name there: ranks
   with the same name are one host. They still share this machine's network and /dev/shm, so no
   test bed is needed (tests/multihost/ runs the same code across namespaced hosts with their own
   addresses, make test-multihost). Where no namespace can be made the tests are ignored, saying
   why. Ranks write what they saw into a MAP_SHARED region; only the parent asserts.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_hierarchical.c \
              tests/unity/unity.c -o /tmp/test_hierarchical -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#define MAX_RANKS 8
#define TIMEOUT_MS 30000
#define NO_HOST_NAME 77 /* a rank's exit status when it cannot have a host name of its own */

typedef struct rank_report {
    int done, rc;
    int hosts, local_rank, local_size, hierarchical;
    int cases, wrong;
    char message[400];
} rank_report;

static rank_report *reports; /* [MAX_RANKS], MAP_SHARED before any fork */

/* What a rank does: its place, and the host each rank of the world claims. */
typedef struct rank_plan {
    int rank, world, port;
    int exchange;             /* 0: the all_gathers, 1: the all_to_alls */
    const int *host_of;
    char job[24];
} rank_plan;

/* The all_gathers every rank runs, each checked against the bytes every rank gave. */
typedef struct gather_case {
    size_t count;
    fsdp_dtype dtype;
    int in_place; /* send is this rank's block of recv */
} gather_case;

static const gather_case gather_cases[] = {
    {1, FSDP_F32, 0},
    {3, FSDP_BF16, 0},
    {1000, FSDP_F32, 0},
    {1000, FSDP_F16, 1},
    {4096, FSDP_F32, 0},     /* 4 hosts gather 64 KiB: the largest done in rounds */
    {4097, FSDP_F32, 1},     /* one round to every other host */
    {20000, FSDP_BF16, 0},
    {(size_t)1 << 18, FSDP_F32, 0}, /* 1 MiB a rank: the pipeline */
};
#define GATHER_CASES (int)(sizeof gather_cases / sizeof gather_cases[0])

/* The all_to_alls every rank runs (count per piece), each checked against the definition. */
static const gather_case exchange_cases[] = {
    {0, FSDP_F32, 0}, {1, FSDP_F32, 0}, {3, FSDP_BF16, 0}, {1001, FSDP_F16, 0}, {(size_t)1 << 17, FSDP_F32, 0},
};
#define EXCHANGE_CASES (int)(sizeof exchange_cases / sizeof exchange_cases[0])

/* The byte i of rank r's block in case k: all_gather copies bytes, whatever the dtype. */
static unsigned char block_byte(int k, int rank, size_t i) {
    return (unsigned char)mix32((uint32_t)k * 0x9E3779B9u ^ (uint32_t)rank * 0x85EBCA6Bu ^ (uint32_t)i);
}

/* ---------------------------------------------------------------------------------------------
   a rank
   --------------------------------------------------------------------------------------------- */
/* Runs gather case k: 0 if every block arrived whole, else 1 with what differed in r->message
   (the first such case's) and the op's result in r->rc. */
static int run_gather(fsdp_comm *comm, int k, rank_report *r) {
    const gather_case *gc = &gather_cases[k];
    int me = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), p = 0;
    size_t bytes = gc->count * fsdp_dtype_size(gc->dtype), i = 0;
    unsigned char *recv = (unsigned char *)malloc(bytes * (size_t)world);
    unsigned char *send = gc->in_place || !recv ? NULL : (unsigned char *)malloc(bytes);
    char why[300] = "";
    if (!recv || (!gc->in_place && !send)) {
        snprintf(why, sizeof why, "out of memory");
    } else {
        memset(recv, 0x5C, bytes * (size_t)world);
        if (gc->in_place) send = recv + (size_t)me * bytes;
        for (i = 0; i < bytes; i++) send[i] = block_byte(k, me, i);
        if ((r->rc = fsdp_all_gather(comm, send, recv, gc->count, gc->dtype)) != FSDP_SUCCESS)
            snprintf(why, sizeof why, "%.280s", fsdp_comm_last_error(comm));
        for (p = 0; !why[0] && p < world; p++) {
            for (i = 0; i < bytes && recv[(size_t)p * bytes + i] == block_byte(k, p, i); i++) {}
            if (i < bytes)
                snprintf(why, sizeof why, "rank %d holds a wrong block of rank %d (host %d) from byte %zu on", me, p,
                         fsdp_comm_host_of(comm, p), i);
        }
    }
    if (why[0] && !r->message[0])
        snprintf(r->message, sizeof r->message, "all_gather of %zu x %s%s: %s", gc->count, fsdp_dtype_name(gc->dtype),
                 gc->in_place ? " in place" : "", why);
    if (!gc->in_place) free(send);
    free(recv);
    return why[0] != 0;
}

/* Runs all_to_all case k: 0 if every piece arrived whole, else 1 with what differed in
   r->message (the first such case's) and the op's result in r->rc. */
static int run_exchange(fsdp_comm *comm, int k, rank_report *r) {
    const gather_case *ec = &exchange_cases[k];
    int me = fsdp_comm_rank(comm), world = fsdp_comm_size(comm), p = 0;
    size_t bytes = ec->count * fsdp_dtype_size(ec->dtype), i = 0;
    unsigned char *send = (unsigned char *)malloc(bytes * (size_t)world + 1);
    unsigned char *recv = (unsigned char *)malloc(bytes * (size_t)world + 1);
    char why[300] = "";
    if (!recv || !send) {
        snprintf(why, sizeof why, "out of memory");
    } else {
        memset(recv, 0x5C, bytes * (size_t)world);
        for (p = 0; p < world; p++) /* the piece for rank p: a block of (me, p) */
            for (i = 0; i < bytes; i++) send[(size_t)p * bytes + i] = block_byte(k, me * world + p, i);
        if ((r->rc = fsdp_all_to_all(comm, send, recv, ec->count, ec->dtype)) != FSDP_SUCCESS)
            snprintf(why, sizeof why, "%.280s", fsdp_comm_last_error(comm));
        for (p = 0; !why[0] && p < world; p++) {
            for (i = 0; i < bytes && recv[(size_t)p * bytes + i] == block_byte(k, p * world + me, i); i++) {}
            if (i < bytes)
                snprintf(why, sizeof why, "rank %d holds a wrong piece from rank %d (host %d) from byte %zu on", me, p,
                         fsdp_comm_host_of(comm, p), i);
        }
    }
    if (why[0] && !r->message[0])
        snprintf(r->message, sizeof r->message, "all_to_all of %zu x %s: %s", ec->count, fsdp_dtype_name(ec->dtype), why);
    free(send);
    free(recv);
    return why[0] != 0;
}

static int run_rank(void *arg) {
    const rank_plan *plan = (const rank_plan *)arg;
    rank_report *r = &reports[plan->rank];
    fsdp_comm *comm = NULL;
    char host[32];
    int k;
    snprintf(host, sizeof host, "fsdp-test-host-%d", plan->host_of[plan->rank]);
    r->rc = join_world_on_host(&comm, host, plan->rank, plan->world, plan->port, plan->job, TIMEOUT_MS, r->message,
                               sizeof r->message);
    if (r->rc == 1) return NO_HOST_NAME;
    if (r->rc != FSDP_SUCCESS) return 0;
    r->hosts = fsdp_comm_num_hosts(comm);
    r->local_rank = fsdp_comm_local_rank(comm);
    r->local_size = fsdp_comm_local_size(comm);
    r->hierarchical = comm->transport == &fsdp__hier_transport; /* (private: not a flat world after all) */
    for (k = 0; k < (plan->exchange ? EXCHANGE_CASES : GATHER_CASES) && r->rc == FSDP_SUCCESS; k++) {
        r->cases++; /* (a failed op fails the comm) */
        r->wrong += plan->exchange ? run_exchange(comm, k, r) : run_gather(comm, k, r);
    }
    fsdp_comm_destroy(comm);
    r->done = 1;
    return 0;
}

/* Forks a world whose rank r claims host host_of[r] (hosts numbered 0, 1, ... in rank order) and
   asserts that it formed with those hosts, hierarchically, and that every rank got every block
   of the all_gathers (exchange 0) or every piece of the all_to_alls (exchange 1). */
static void assert_exchanges_in_world(int world, const int *host_of, int exchange) {
    rank_plan plans[MAX_RANKS];
    pid_t pids[MAX_RANKS];
    int status[MAX_RANKS], r, hosts = host_of[world - 1] + 1, no_host_name = 0;
    char what[600];
    memset(reports, 0, sizeof *reports * MAX_RANKS);
    plans[0].port = pick_free_port();
    for (r = 0; r < world; r++) {
        plans[r].rank = r;
        plans[r].world = world;
        plans[r].port = plans[0].port;
        plans[r].host_of = host_of;
        plans[r].exchange = exchange;
        /* this run's token: runs at once must not meet in /dev/shm (16 characters name the hosts' segments) */
        snprintf(plans[r].job, sizeof plans[r].job, "hier-%d-%d", (int)getpid(), world);
        pids[r] = spawn(run_rank, &plans[r], 120);
    }
    for (r = 0; r < world; r++) {
        status[r] = reap(pids[r], 90000);
        no_host_name |= status[r] == NO_HOST_NAME;
    }
    if (no_host_name) {
        for (r = 0; r < world && status[r] != NO_HOST_NAME; r++) {}
        TEST_IGNORE_MESSAGE(reports[r].message);
    }
    for (r = 0; r < world; r++) {
        const rank_report *rep = &reports[r];
        int local_size = 0, local_rank = 0, p;
        for (p = 0; p < world; p++)
            if (host_of[p] == host_of[r]) local_size++, local_rank += p < r;
        snprintf(what, sizeof what, "rank %d (host %d): exit status %d, %s", r, host_of[r], status[r],
                 rep->message[0] ? rep->message : "no message");
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rep->rc, what);
        TEST_ASSERT_TRUE_MESSAGE(rep->done, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(hosts, rep->hosts, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(local_size, rep->local_size, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(local_rank, rep->local_rank, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, rep->hierarchical, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(exchange ? EXCHANGE_CASES : GATHER_CASES, rep->cases, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, rep->wrong, what);
    }
}

/* ---------------------------------------------------------------------------------------------
   tests
   --------------------------------------------------------------------------------------------- */
static void test_hierarchical_all_gather_on_4_hosts_of_2_ranks_gives_every_rank_every_block(void) {
    static const int host_of[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    assert_exchanges_in_world(8, host_of, 0);
}

static void test_hierarchical_all_gather_on_hosts_of_2_1_and_3_ranks_gives_every_rank_every_block(void) {
    static const int host_of[6] = {0, 0, 1, 2, 2, 2};
    assert_exchanges_in_world(6, host_of, 0);
}

static void test_hierarchical_all_to_all_on_4_hosts_of_2_ranks_gives_every_rank_its_pieces(void) {
    static const int host_of[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    assert_exchanges_in_world(8, host_of, 1);
}

static void test_hierarchical_all_to_all_on_hosts_of_2_1_and_3_ranks_gives_every_rank_its_pieces(void) {
    static const int host_of[6] = {0, 0, 1, 2, 2, 2};
    assert_exchanges_in_world(6, host_of, 1);
}

static void test_hierarchical_all_to_all_on_hosts_of_3_and_2_ranks_gives_every_rank_its_pieces(void) {
    static const int host_of[5] = {0, 0, 0, 1, 1};
    assert_exchanges_in_world(5, host_of, 1);
}

void setUp(void) {}
void tearDown(void) {}

int main(void) {
    reports = (rank_report *)map_shared(sizeof *reports * MAX_RANKS);
    UNITY_BEGIN();
    RUN_TEST(test_hierarchical_all_gather_on_4_hosts_of_2_ranks_gives_every_rank_every_block);
    RUN_TEST(test_hierarchical_all_gather_on_hosts_of_2_1_and_3_ranks_gives_every_rank_every_block);
    RUN_TEST(test_hierarchical_all_to_all_on_4_hosts_of_2_ranks_gives_every_rank_its_pieces);
    RUN_TEST(test_hierarchical_all_to_all_on_hosts_of_2_1_and_3_ranks_gives_every_rank_its_pieces);
    RUN_TEST(test_hierarchical_all_to_all_on_hosts_of_3_and_2_ranks_gives_every_rank_its_pieces);
    return UNITY_END();
}
