/* test_comm_stats.c - specification of fsdp_comm_stats_get and the bytes of fsdp_step_report:
   what each rank sent, to its own host and to other hosts, counted where the bytes leave.

   Every collective's count is asserted exactly, by the formula its algorithm gives (B: the bytes
   of a rank's block, or of the buffer of all_reduce and broadcast; P ranks):
       shm (once per op, however many peers read):  all_gather B, reduce_scatter (P - 1) B,
                                                    all_reduce B, broadcast B on the root only
       sockets (once per peer the bytes go to):     all_gather and reduce_scatter (P - 1) B,
                                                    broadcast (P - 1) B on the root only,
                                                    all_reduce (P - 1) B up to one 256 KiB
                                                    segment, above it the slices of the others
                                                    (B - mine) then mine to every peer ((P - 1) mine)
   with sizes on both sides of every threshold an algorithm has. Loopback sockets between ranks of
   one host count as host bytes; ranks given host names of their own (UTS namespaces, as in
   test_hierarchical.c) make worlds over several hosts, whose socket bytes to other hosts count as
   net bytes and shared memory as host bytes.

   Ranks are forked; each writes the counters' differences around every op into a MAP_SHARED
   board; only the parent asserts.

   Build: make build/test_comm_stats */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"
#include "test_mlp.h"

#define MAX_RANKS 4
#define MAX_CASES 16
#define TIMEOUT_MS 30000
#define NO_HOST_NAME 77 /* a rank's exit status when it cannot have a host name of its own */
#define SOCK_SEGMENT ((size_t)256 * 1024)

/* One collective of the matrix: kind, elements (per rank for all_gather and reduce_scatter),
   dtype, broadcast's root (-1: the last rank). */
typedef struct op_case {
    fsdp_coll_kind kind;
    size_t count;
    fsdp_dtype dtype;
    int root;
} op_case;

static const op_case matrix[] = {
    {FSDP_COLL_ALL_GATHER, 1000, FSDP_F32, 0},
    {FSDP_COLL_ALL_GATHER, 999, FSDP_BF16, 0},
    {FSDP_COLL_ALL_GATHER, 300001, FSDP_F32, 0},     /* several shm rounds (512 KiB pieces) */
    {FSDP_COLL_ALL_GATHER, 2097153, FSDP_F32, 0},    /* 8 MiB: past a socket's 4 MiB send buffer (a rest sent later) */
    {FSDP_COLL_REDUCE_SCATTER, 1000, FSDP_F32, 0},
    {FSDP_COLL_REDUCE_SCATTER, 100003, FSDP_F32, 0}, /* several rounds of slot pieces */
    {FSDP_COLL_ALL_REDUCE, 1000, FSDP_F32, 0},       /* shm: one round; sockets: one phase */
    {FSDP_COLL_ALL_REDUCE, 20000, FSDP_F32, 0},      /* shm: two rounds a window (P > 2); sockets: one phase */
    {FSDP_COLL_ALL_REDUCE, 100003, FSDP_F32, 0},     /* both: reduce then gather, uneven shares */
    {FSDP_COLL_ALL_REDUCE, 140001, FSDP_BF16, 0},    /* 16-bit, just past the socket segment */
    {FSDP_COLL_BROADCAST, 1000, FSDP_F32, 0},
    {FSDP_COLL_BROADCAST, 300001, FSDP_F32, -1},
    {FSDP_COLL_BARRIER, 0, FSDP_F32, 0},
    {FSDP_COLL_ALL_TO_ALL, 1000, FSDP_F32, 0},      /* count: each block, one to every rank */
    {FSDP_COLL_ALL_TO_ALL, 300001, FSDP_F32, 0},
};
#define MATRIX_CASES (int)(sizeof matrix / sizeof matrix[0])

/* What a rank measured around one op (or a whole run): the counters' differences. */
typedef struct counted {
    int rc;
    uint64_t host, net, ops;
} counted;

typedef struct board {
    counted op[MAX_CASES][MAX_RANKS];
    counted total[MAX_RANKS];      /* the whole run, from init to before destroy */
    counted child[MAX_RANKS];      /* splits: the child's own difference */
    counted report[MAX_RANKS][2];  /* runtime: the step reports' bytes (ops unused) */
    counted around[MAX_RANKS][2];  /* runtime: the comm's difference over each step */
    int status[MAX_RANKS];         /* runtime: the step's result */
    char message[MAX_RANKS][400];
} board;

static board *shared; /* MAP_SHARED before any fork */
static char trace_dir[128]; /* a test's trace directory, removed by tearDown */

/* How a run's ranks take their buffers: malloc, or fsdp_comm_alloc (shm: offered in place). */
typedef struct run_plan {
    int shared_buffers;
} run_plan;

/* ---------------------------------------------------------------------------------------------
   the children
   --------------------------------------------------------------------------------------------- */
static counted stats_now(const fsdp_comm *comm) {
    fsdp_comm_stats s;
    counted c;
    memset(&c, 0, sizeof c);
    c.rc = fsdp_comm_stats_get(comm, &s);
    c.host = s.bytes_sent_host;
    c.net = s.bytes_sent_net;
    c.ops = s.ops;
    return c;
}

static counted stats_since(const fsdp_comm *comm, counted before) {
    counted c = stats_now(comm);
    c.host -= before.host;
    c.net -= before.net;
    c.ops -= before.ops;
    return c;
}

static int case_root(const op_case *oc, int world) { return oc->root < 0 ? world - 1 : oc->root; }

/* Runs matrix case k on comm with buffers of recv_bytes (send: send_bytes) from buf. */
static int run_case(fsdp_comm *comm, int k, char *send, char *recv) {
    const op_case *oc = &matrix[k];
    int world = fsdp_comm_size(comm);
    switch (oc->kind) {
        case FSDP_COLL_ALL_GATHER: return fsdp_all_gather(comm, send, recv, oc->count, oc->dtype);
        case FSDP_COLL_REDUCE_SCATTER: return fsdp_reduce_scatter(comm, send, recv, oc->count, oc->dtype, FSDP_SUM);
        case FSDP_COLL_ALL_REDUCE: return fsdp_all_reduce(comm, send, recv, oc->count, oc->dtype, FSDP_SUM);
        case FSDP_COLL_BROADCAST: return fsdp_broadcast(comm, recv, oc->count, oc->dtype, case_root(oc, world));
        case FSDP_COLL_ALL_TO_ALL: return fsdp_all_to_all(comm, send, recv, oc->count, oc->dtype);
        default: return fsdp_barrier(comm);
    }
}

/* Buffers big enough for every case: from fsdp_comm_alloc where the plan says so. */
static int matrix_buffers(fsdp_comm *comm, int shared_buffers, char **send, char **recv, size_t *bytes) {
    size_t most = 0;
    int k;
    for (k = 0; k < MATRIX_CASES; k++) {
        size_t b = matrix[k].count * fsdp_dtype_size(matrix[k].dtype) * (size_t)fsdp_comm_size(comm);
        if (b > most) most = b;
    }
    *bytes = most;
    if (shared_buffers)
        return fsdp_comm_alloc(comm, most, (void **)send) || fsdp_comm_alloc(comm, most, (void **)recv) ? -1 : 0;
    *send = (char *)calloc(1, most);
    *recv = (char *)calloc(1, most);
    return *send && *recv ? 0 : -1;
}

/* Every matrix case, each op's counted bytes on the board; then the whole run's. */
static int run_matrix(fsdp_comm *comm, int shared_buffers, counted since_init) {
    int me = fsdp_comm_rank(comm), k;
    char *send = NULL, *recv = NULL;
    size_t bytes;
    if (matrix_buffers(comm, shared_buffers, &send, &recv, &bytes) != 0) return 2;
    memset(send, 0x3c, bytes); /* finite values of every dtype */
    for (k = 0; k < MATRIX_CASES; k++) {
        counted before = stats_now(comm);
        int rc = run_case(comm, k, send, recv);
        shared->op[k][me] = stats_since(comm, before);
        shared->op[k][me].rc = rc;
        if (rc) break;
    }
    shared->total[me] = stats_since(comm, since_init);
    if (!shared_buffers) {
        free(send);
        free(recv);
    }
    return 0;
}

static int matrix_rank(fsdp_comm *comm, void *arg) {
    const run_plan *plan = (const run_plan *)arg;
    counted zero;
    memset(&zero, 0, sizeof zero);
    return run_matrix(comm, plan->shared_buffers, zero);
}

/* ---------------------------------------------------------------------------------------------
   the expected counts
   --------------------------------------------------------------------------------------------- */
/* Bytes rank r sends to its peers on shm in case k of a world of P. */
static uint64_t shm_bytes(const op_case *oc, int P, int r) {
    uint64_t B = (uint64_t)oc->count * fsdp_dtype_size(oc->dtype);
    switch (oc->kind) {
        case FSDP_COLL_ALL_GATHER: return B;
        case FSDP_COLL_REDUCE_SCATTER:
        case FSDP_COLL_ALL_TO_ALL: return (uint64_t)(P - 1) * B;
        case FSDP_COLL_ALL_REDUCE: return B;
        case FSDP_COLL_BROADCAST: return r == case_root(oc, P) ? B : 0;
        default: return 0;
    }
}

/* Bytes rank r writes to its sockets in case k of a flat socket world of P. */
static uint64_t socket_bytes(const op_case *oc, int P, int r) {
    size_t esize = fsdp_dtype_size(oc->dtype), n = oc->count, share = (n + (size_t)P - 1) / (size_t)P;
    size_t my_at = (size_t)r * share < n ? (size_t)r * share : n, my_len = n - my_at < share ? n - my_at : share;
    uint64_t B = (uint64_t)n * esize, mine = (uint64_t)my_len * esize;
    switch (oc->kind) {
        case FSDP_COLL_ALL_GATHER:
        case FSDP_COLL_REDUCE_SCATTER:
        case FSDP_COLL_ALL_TO_ALL: return (uint64_t)(P - 1) * B;
        case FSDP_COLL_ALL_REDUCE: return B <= SOCK_SEGMENT ? (uint64_t)(P - 1) * B : (B - mine) + (uint64_t)(P - 1) * mine;
        case FSDP_COLL_BROADCAST: return r == case_root(oc, P) ? (uint64_t)(P - 1) * B : 0;
        default: return 0;
    }
}

/* Asserts that every rank of a world of P counted, for every case, one op and the bytes
   expect(case, P, rank) as host bytes (host = 1) or net bytes. */
static void assert_matrix(int P, const char *what, uint64_t (*expect)(const op_case *, int, int), int host) {
    char message[300];
    int k, r;
    for (k = 0; k < MATRIX_CASES; k++)
        for (r = 0; r < P; r++) {
            const counted *c = &shared->op[k][r];
            uint64_t want = expect(&matrix[k], P, r);
            snprintf(message, sizeof message, "%s, P = %d, rank %d: %s of %zu x %s", what, P, r,
                     fsdp_coll_name(matrix[k].kind), matrix[k].count, fsdp_dtype_name(matrix[k].dtype));
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, c->rc, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(host ? want : 0, c->host, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(host ? 0 : want, c->net, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(1, c->ops, message);
        }
}

static void launch_matrix(int P, fsdp_backend_kind backend, int shared_buffers) {
    fsdp_launch_status status;
    run_plan plan;
    int rc;
    memset(shared, 0, sizeof *shared);
    plan.shared_buffers = shared_buffers;
    rc = launch_ranks(P, backend, TIMEOUT_MS, matrix_rank, &plan, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
}

/* ---------------------------------------------------------------------------------------------
   tests: one host
   --------------------------------------------------------------------------------------------- */
static void test_comm_stats_shm_counts_each_collective_once_per_op_by_its_formula(void) {
    int P;
    for (P = 2; P <= 4; P++) {
        launch_matrix(P, FSDP_BACKEND_SHM, 0);
        assert_matrix(P, "shm", shm_bytes, 1);
    }
}

static void test_comm_stats_shm_counts_buffers_offered_in_place_as_staged_ones(void) {
    int P;
    for (P = 2; P <= 4; P += 2) {
        launch_matrix(P, FSDP_BACKEND_SHM, 1);
        assert_matrix(P, "shm, fsdp_comm_alloc buffers", shm_bytes, 1);
    }
}

static void test_comm_stats_loopback_sockets_count_every_peer_as_host_bytes(void) {
    int P;
    for (P = 2; P <= 4; P++) {
        launch_matrix(P, FSDP_BACKEND_SOCKET, 0);
        assert_matrix(P, "socket", socket_bytes, 1);
    }
}

/* The same run twice: the same totals, init's own traffic included. */
static void test_comm_stats_two_identical_runs_count_the_same(void) {
    counted first[MAX_RANKS];
    int backend, r;
    static const fsdp_backend_kind kinds[2] = {FSDP_BACKEND_SHM, FSDP_BACKEND_SOCKET};
    for (backend = 0; backend < 2; backend++) {
        launch_matrix(3, kinds[backend], 0);
        memcpy(first, shared->total, sizeof first);
        launch_matrix(3, kinds[backend], 0);
        for (r = 0; r < 3; r++) {
            TEST_ASSERT_TRUE_MESSAGE(first[r].host > 0, fsdp_backend_name(kinds[backend]));
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(first[r].host, shared->total[r].host, fsdp_backend_name(kinds[backend]));
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(first[r].net, shared->total[r].net, fsdp_backend_name(kinds[backend]));
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(first[r].ops, shared->total[r].ops, fsdp_backend_name(kinds[backend]));
        }
    }
}

/* A split's op counts in the split and, the same, in its parent; so does an op of a split of the
   split after the split in the middle was destroyed (op[1]). */
static int split_rank(fsdp_comm *comm, void *arg) {
    int me = fsdp_comm_rank(comm), rc;
    float send[1000], recv[2 * 1000];
    fsdp_comm *child = NULL, *grandchild = NULL;
    counted parent_before, child_before;
    (void)arg;
    memset(send, 0, sizeof send);
    if (fsdp_comm_split(comm, me % 2, me, &child) != 0) return 1;
    parent_before = stats_now(comm);
    child_before = stats_now(child);
    rc = fsdp_all_gather(child, send, recv, 1000, FSDP_F32);
    shared->child[me] = stats_since(child, child_before);
    shared->op[0][me] = stats_since(comm, parent_before);
    shared->op[0][me].rc = rc;
    if (rc || fsdp_comm_split(child, 0, me, &grandchild) != 0) return 1;
    fsdp_comm_destroy(child);
    parent_before = stats_now(comm);
    rc = fsdp_all_gather(grandchild, send, recv, 1000, FSDP_F32);
    shared->op[1][me] = stats_since(comm, parent_before);
    shared->op[1][me].rc = rc;
    fsdp_comm_destroy(grandchild);
    return rc ? 1 : 0;
}

static void test_comm_stats_split_adds_its_bytes_and_ops_into_its_parent(void) {
    static const fsdp_backend_kind kinds[2] = {FSDP_BACKEND_SHM, FSDP_BACKEND_SOCKET};
    int backend, r;
    for (backend = 0; backend < 2; backend++) {
        const char *name = fsdp_backend_name(kinds[backend]);
        fsdp_launch_status status;
        int rc;
        memset(shared, 0, sizeof *shared);
        rc = launch_ranks(4, kinds[backend], TIMEOUT_MS, split_rank, NULL, &status);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
        for (r = 0; r < 4; r++) {
            /* two ranks a group, on one host: shared memory whatever the parent's transport */
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(4000, shared->child[r].host, name);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(1, shared->child[r].ops, name);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(4000, shared->op[0][r].host, name);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(0, shared->op[0][r].net, name);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(1, shared->op[0][r].ops, name);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared->op[1][r].rc, name);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(4000, shared->op[1][r].host, name);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(1, shared->op[1][r].ops, name);
        }
    }
}

/* A world of one sends nothing, and counts its ops. */
static void test_comm_stats_world_of_one_counts_ops_and_no_bytes(void) {
    fsdp_comm *comm = NULL;
    fsdp_comm_stats s;
    float x[4] = {1, 2, 3, 4}, y[4];
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, open_one_rank_comm(&comm, "comm-stats-one"));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_all_reduce(comm, x, y, 4, FSDP_F32, FSDP_SUM));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_all_gather(comm, x, y, 4, FSDP_F32));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_comm_stats_get(comm, &s));
    TEST_ASSERT_EQUAL_UINT64(0, s.bytes_sent_host);
    TEST_ASSERT_EQUAL_UINT64(0, s.bytes_sent_net);
    TEST_ASSERT_EQUAL_UINT64(2, s.ops);
    fsdp_comm_destroy(comm);
}

static void test_comm_stats_get_without_comm_or_output_is_invalid_and_zeroes_the_output(void) {
    fsdp_comm_stats s;
    memset(&s, 0xff, sizeof s);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_comm_stats_get(NULL, &s));
    TEST_ASSERT_EQUAL_UINT64(0, s.bytes_sent_host);
    TEST_ASSERT_EQUAL_UINT64(0, s.ops);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_comm_stats_get(NULL, NULL));
}

/* ---------------------------------------------------------------------------------------------
   tests: several hosts on this machine (a host name per rank: UTS namespaces)
   --------------------------------------------------------------------------------------------- */
/* A rank of a socket world whose rank r claims host host_of[r]. */
typedef struct host_plan {
    int rank, world, port, flat;
    const int *host_of;
    char job[24];
} host_plan;

static int host_rank(void *arg) {
    const host_plan *plan = (const host_plan *)arg;
    fsdp_comm *comm = NULL;
    char host[32];
    counted zero;
    int rc;
    snprintf(host, sizeof host, "fsdp-stats-host-%d", plan->host_of[plan->rank]);
    if (plan->flat) setenv("FSDP_HIERARCHICAL", "0", 1);
    rc = join_world_on_host(&comm, host, plan->rank, plan->world, plan->port, plan->job, TIMEOUT_MS,
                            shared->message[plan->rank], sizeof shared->message[0]);
    if (rc == 1) return NO_HOST_NAME;
    if (rc != FSDP_SUCCESS) return 1;
    memset(&zero, 0, sizeof zero);
    shared->status[plan->rank] = fsdp_comm_num_hosts(comm) * 10 + fsdp_comm_hierarchical(comm);
    rc = run_matrix(comm, 0, zero);
    fsdp_comm_destroy(comm);
    return rc;
}

/* Forks a socket world whose rank r claims host host_of[r]; 0, or 1 when the ranks cannot have
   host names of their own (the test is then ignored by the caller). Asserts the world formed
   with those hosts, hierarchical or not as expected. */
static int launch_hosts(int world, const int *host_of, int flat, int hierarchical) {
    host_plan plans[MAX_RANKS];
    pid_t pids[MAX_RANKS];
    int status[MAX_RANKS], r, hosts = host_of[world - 1] + 1, no_host_name = 0;
    char what[400];
    memset(shared, 0, sizeof *shared);
    plans[0].port = pick_free_port();
    for (r = 0; r < world; r++) {
        plans[r].rank = r;
        plans[r].world = world;
        plans[r].port = plans[0].port;
        plans[r].flat = flat;
        plans[r].host_of = host_of;
        snprintf(plans[r].job, sizeof plans[r].job, "stats-%d-%d", (int)getpid(), flat);
        pids[r] = spawn(host_rank, &plans[r], 120);
    }
    for (r = 0; r < world; r++) {
        status[r] = reap(pids[r], 90000);
        no_host_name |= status[r] == NO_HOST_NAME;
    }
    if (no_host_name) return 1;
    for (r = 0; r < world; r++) {
        snprintf(what, sizeof what, "rank %d (host %d): exit status %d, %s", r, host_of[r], status[r],
                 shared->message[r][0] ? shared->message[r] : "no message");
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(hosts * 10 + hierarchical, shared->status[r], what);
    }
    return 0;
}

/* Ranks of their own host each: a flat socket world, every peer on another host. */
static void test_comm_stats_sockets_to_other_hosts_count_as_net_bytes(void) {
    static const int host_of[3] = {0, 1, 2};
    if (launch_hosts(3, host_of, 0, 0)) TEST_IGNORE_MESSAGE(shared->message[0]);
    assert_matrix(3, "socket, a host per rank", socket_bytes, 0);
}

/* Hosts of two ranks, flat (FSDP_HIERARCHICAL=0): per peer, the host decides. */
static void test_comm_stats_flat_world_over_hosts_counts_each_peer_by_its_host(void) {
    static const int host_of[4] = {0, 0, 1, 1};
    char message[200];
    int k, r;
    if (launch_hosts(4, host_of, 1, 0)) TEST_IGNORE_MESSAGE(shared->message[0]);
    for (k = 0; k < MATRIX_CASES; k++)
        for (r = 0; r < 4; r++) {
            const counted *c = &shared->op[k][r];
            const op_case *oc = &matrix[k];
            uint64_t B = (uint64_t)oc->count * fsdp_dtype_size(oc->dtype), per_peer = socket_bytes(oc, 4, r) / 3;
            snprintf(message, sizeof message, "rank %d: %s of %zu x %s", r, fsdp_coll_name(oc->kind), oc->count,
                     fsdp_dtype_name(oc->dtype));
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, c->rc, message);
            if (oc->kind == FSDP_COLL_ALL_REDUCE && B > SOCK_SEGMENT) { /* the slices differ by peer: the sum holds */
                TEST_ASSERT_EQUAL_UINT64_MESSAGE(socket_bytes(oc, 4, r), c->host + c->net, message);
                TEST_ASSERT_TRUE_MESSAGE(c->host > 0 && c->net > c->host, message);
                continue;
            }
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(per_peer, c->host, message);     /* one peer on this host */
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(2 * per_peer, c->net, message);  /* two on the other */
        }
}

/* Bytes rank r of 2 hosts x 2 ranks (local rank l = r % 2) sends over shared memory (host = 1)
   or to the other host, in case k, by the hierarchical algorithms of >>hier for ops below their
   pipeline and short-path thresholds: all_gather B to (h, l) then an all_gather of each host's
   two blocks inside the host (2 B); reduce_scatter the partials of each host's blocks inside the
   host (B each: 2 B) then one partial across; all_reduce inside the host (B), local rank 0 sends
   the host's partial across and broadcasts the sum inside (B); broadcast from rank 0: across to
   rank 2, then rank 0 and rank 2 inside their hosts. */
static uint64_t hier_bytes(const op_case *oc, int r, int host) {
    uint64_t B = (uint64_t)oc->count * fsdp_dtype_size(oc->dtype);
    int l = r % 2;
    switch (oc->kind) {
        case FSDP_COLL_ALL_GATHER:
        case FSDP_COLL_REDUCE_SCATTER: return host ? 2 * B : B;
        case FSDP_COLL_ALL_REDUCE: return host ? (l == 0 ? 2 * B : B) : (l == 0 ? B : 0);
        case FSDP_COLL_BROADCAST: return host ? (l == 0 ? B : 0) : (r == 0 ? B : 0);
        default: return 0;
    }
}

static void test_comm_stats_hierarchical_world_counts_sockets_as_net_and_shared_memory_as_host(void) {
    static const int host_of[4] = {0, 0, 1, 1};
    char message[200];
    int k, r, checked = 0;
    if (launch_hosts(4, host_of, 0, 1)) TEST_IGNORE_MESSAGE(shared->message[0]);
    for (k = 0; k < MATRIX_CASES; k++) {
        const op_case *oc = &matrix[k];
        uint64_t B = (uint64_t)oc->count * fsdp_dtype_size(oc->dtype);
        if (B >= 64 * 1024 || (oc->kind == FSDP_COLL_BROADCAST && oc->root != 0) || oc->kind == FSDP_COLL_ALL_TO_ALL)
            continue; /* (other paths) */
        for (r = 0; r < 4; r++) {
            const counted *c = &shared->op[k][r];
            snprintf(message, sizeof message, "rank %d: %s of %zu x %s", r, fsdp_coll_name(oc->kind), oc->count,
                     fsdp_dtype_name(oc->dtype));
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, c->rc, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(hier_bytes(oc, r, 1), c->host, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(hier_bytes(oc, r, 0), c->net, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(1, c->ops, message); /* the inner shm ops are the world op's */
            checked++;
        }
    }
    TEST_ASSERT_EQUAL_INT(4 * 6, checked);
}

/* ---------------------------------------------------------------------------------------------
   tests: the step report
   --------------------------------------------------------------------------------------------- */
/* One iteration of the test MLP: every unit gathered in forward and backward, a gradient on every
   parameter, reduced, and the step. */
static int mlp_iteration(fsdp_ctx *ctx, const mlp *m, fsdp_step_report *report) {
    int l, rc, p, i;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0) return rc;
    for (l = 0; l < 3; l++)
        if ((rc = fsdp_pre_forward(ctx, m->layer[l])) != 0 || (rc = fsdp_post_forward(ctx, m->layer[l])) != 0) return rc;
    if ((rc = fsdp_post_forward(ctx, 0)) != 0 || (rc = fsdp_pre_backward(ctx, 0)) != 0) return rc;
    for (l = 2; l >= 0; l--) {
        if ((rc = fsdp_pre_backward(ctx, m->layer[l])) != 0) return rc;
        for (p = P_W0 + 2 * l; p <= P_B0 + 2 * l; p++) {
            float *g = fsdp_grad(ctx, m->param[p]);
            if (!g) return FSDP_ERR_STATE;
            for (i = 0; i < param_numel[p]; i++) g[i] += 1e-3f * (float)(i % 5);
        }
        if ((rc = fsdp_post_backward(ctx, m->layer[l])) != 0) return rc;
    }
    if ((rc = fsdp_post_backward(ctx, 0)) != 0) return rc;
    return fsdp_step(ctx, 1.0f, report);
}

/* What the context's HYBRID_SHARD groups sent (private fields: the groups are the runtime's). */
static counted groups_now(const fsdp_ctx *ctx) {
    counted sum;
    memset(&sum, 0, sizeof sum);
    if (ctx->hybrid_shard_comm) sum.host += stats_now(ctx->hybrid_shard_comm).host;
    if (ctx->hybrid_replica_comm) sum.host += stats_now(ctx->hybrid_replica_comm).host;
    return sum;
}

/* How the step test's ranks train: the strategy, and where they trace (NULL: nowhere). */
typedef struct step_plan {
    fsdp_strategy strategy;
    const char *trace_dir;
} step_plan;

static int step_rank(fsdp_comm *comm, void *arg) {
    static const char *const linear[] = {"Linear", NULL};
    const step_plan *plan = (const step_plan *)arg;
    int me = fsdp_comm_rank(comm), rc, s;
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    mlp m;
    memset(&desc, 0, sizeof desc);
    desc.comm = comm;
    desc.strategy = plan->strategy;
    desc.trace_dir = plan->trace_dir;
    desc.shard_group_size = 2;
    desc.wrap.kind = FSDP_WRAP_TYPES;
    desc.wrap.types = linear;
    desc.optimizer.kind = FSDP_ADAMW;
    desc.optimizer.lr = 1e-3f;
    if ((rc = mlp_build(&m)) != 0 || (rc = fsdp_init(&ctx, m.model, &desc)) != 0) {
        snprintf(shared->message[me], sizeof shared->message[0], "setup: %.250s", fsdp_last_error(NULL));
        fsdp_model_destroy(m.model);
        return 1;
    }
    for (s = 0, rc = 0; s < 2 && !rc; s++) {
        fsdp_step_report report;
        counted before = stats_now(comm), groups_before = groups_now(ctx), groups;
        rc = mlp_iteration(ctx, &m, &report);
        shared->around[me][s] = stats_since(comm, before);
        groups = groups_now(ctx);
        shared->child[me].host += groups.host - groups_before.host;
        shared->report[me][s].host = report.bytes_sent_host;
        shared->report[me][s].net = report.bytes_sent_net;
        if (rc) snprintf(shared->message[me], sizeof shared->message[0], "step %d: %.250s", s, fsdp_last_error(ctx));
    }
    shared->status[me] = rc;
    fsdp_destroy(ctx);
    fsdp_model_destroy(m.model);
    return rc ? 1 : 0;
}

static void assert_step_reports(fsdp_strategy strategy, const char *trace_dir, const char *name) {
    fsdp_launch_status status;
    step_plan plan;
    char message[400];
    int r, s, rc;
    memset(shared, 0, sizeof *shared);
    plan.strategy = strategy;
    plan.trace_dir = trace_dir;
    rc = launch_ranks(4, FSDP_BACKEND_SHM, TIMEOUT_MS, step_rank, &plan, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    for (r = 0; r < 4; r++)
        for (s = 0; s < 2; s++) {
            snprintf(message, sizeof message, "%s, rank %d, step %d: %s", name, r, s, shared->message[r]);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared->status[r], message);
            TEST_ASSERT_TRUE_MESSAGE(shared->report[r][s].host > 0, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(shared->around[r][s].host, shared->report[r][s].host, message);
            TEST_ASSERT_EQUAL_UINT64_MESSAGE(0, shared->report[r][s].net, message);
        }
}

static void test_step_report_bytes_equal_the_comms_counters_over_the_iteration(void) {
    assert_step_reports(FSDP_FULL_SHARD, NULL, "FULL_SHARD");
}

/* The gathers and reductions run in the groups, split from the comm: their bytes are the
   report's too (most of them: the comm adds its own, the norm's all_reduce). */
static void test_step_report_bytes_include_the_hybrid_groups_split_from_the_comm(void) {
    int r;
    assert_step_reports(FSDP_HYBRID_SHARD, NULL, "HYBRID_SHARD");
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_TRUE(shared->child[r].host > 0);
        TEST_ASSERT_TRUE(shared->report[r][0].host + shared->report[r][1].host >= shared->child[r].host);
    }
}

/* Each rank's trace shows, on each iteration's event, the bytes its step report counted. */
static void test_trace_iteration_events_carry_the_step_reports_bytes(void) {
    char path[200], want[120], message[340];
    unsigned char *text;
    size_t size;
    int r, s;
    make_test_dir(trace_dir, sizeof trace_dir, "comm-stats-trace");
    assert_step_reports(FSDP_FULL_SHARD, trace_dir, "FULL_SHARD, traced");
    for (r = 0; r < 4; r++) {
        snprintf(path, sizeof path, "%s/trace-rank%05d.json", trace_dir, r);
        text = read_whole_file(path, &size);
        TEST_ASSERT_NOT_NULL_MESSAGE(text, path);
        for (s = 0; s < 2; s++) {
            snprintf(want, sizeof want, "\"step\":%d,\"bytes_sent_host\":%llu,\"bytes_sent_net\":0", s + 1,
                     (unsigned long long)shared->report[r][s].host);
            snprintf(message, sizeof message, "%s: %s", path, want);
            TEST_ASSERT_NOT_NULL_MESSAGE(strstr((const char *)text, want), message);
        }
        free(text);
    }
}

void setUp(void) {}
void tearDown(void) {
    if (trace_dir[0]) remove_tree(trace_dir);
    trace_dir[0] = 0;
}

int main(void) {
    shared = (board *)map_shared(sizeof *shared);
    UNITY_BEGIN();
    RUN_TEST(test_comm_stats_shm_counts_each_collective_once_per_op_by_its_formula);
    RUN_TEST(test_comm_stats_shm_counts_buffers_offered_in_place_as_staged_ones);
    RUN_TEST(test_comm_stats_loopback_sockets_count_every_peer_as_host_bytes);
    RUN_TEST(test_comm_stats_two_identical_runs_count_the_same);
    RUN_TEST(test_comm_stats_split_adds_its_bytes_and_ops_into_its_parent);
    RUN_TEST(test_comm_stats_world_of_one_counts_ops_and_no_bytes);
    RUN_TEST(test_comm_stats_get_without_comm_or_output_is_invalid_and_zeroes_the_output);
    RUN_TEST(test_comm_stats_sockets_to_other_hosts_count_as_net_bytes);
    RUN_TEST(test_comm_stats_flat_world_over_hosts_counts_each_peer_by_its_host);
    RUN_TEST(test_comm_stats_hierarchical_world_counts_sockets_as_net_and_shared_memory_as_host);
    RUN_TEST(test_step_report_bytes_equal_the_comms_counters_over_the_iteration);
    RUN_TEST(test_step_report_bytes_include_the_hybrid_groups_split_from_the_comm);
    RUN_TEST(test_trace_iteration_events_carry_the_step_reports_bytes);
    return UNITY_END();
}
