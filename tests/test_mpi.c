/* The MPI bridge under mpirun: every op and dtype against the serial rank-order reference,
   bit for bit (the same reference the shm and socket backends are held to, so the three
   backends agree with each other bit for bit). Run: mpirun -np 2..4 build/test_mpi */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"

static fsdp_comm *comm;
static int P, me;

void setUp(void) {}
void tearDown(void) {}

/* Deterministic input of rank r, element i: small hash scaled into [-2, 2). */
static float input_value(int r, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 7u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (float)(h % 40000u) / 10000.0f - 2.0f;
}

static void fill(void *buf, fsdp_dtype dt, int r, size_t n, size_t first) {
    size_t i;
    for (i = 0; i < n; i++) {
        float v = input_value(r, first + i);
        fsdp_convert((char *)buf + i * fsdp_dtype_size(dt), dt, &v, FSDP_F32, 1);
    }
}

/* Element i of the reduction of all ranks' inputs, in rank order, rounded once. */
static void reference(void *out, fsdp_dtype dt, fsdp_reduce_op op, size_t first, size_t n) {
    size_t i, es = fsdp_dtype_size(dt);
    int r;
    for (i = 0; i < n; i++) {
        float acc = 0;
        for (r = 0; r < P; r++) {
            unsigned char raw[4];
            float x;
            fill(raw, dt, r, 1, first + i);
            fsdp_convert(&x, FSDP_F32, raw, dt, 1);
            if (r == 0) acc = x;
            else if (op == FSDP_MAX) acc = (acc != acc) ? acc : (x != x) ? x : (acc > x ? acc : x);
            else acc += x;
        }
        if (op == FSDP_AVG) acc /= (float)P;
        fsdp_convert((char *)out + i * es, dt, &acc, FSDP_F32, 1);
    }
}

static const fsdp_dtype dtypes[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
static const size_t counts[] = {1, 7, 100003};

static void test_mpi_all_gather_matches_reference_bitwise(void) {
    size_t d, k;
    for (d = 0; d < 3; d++)
        for (k = 0; k < 3; k++) {
            fsdp_dtype dt = dtypes[d];
            size_t n = counts[k], es = fsdp_dtype_size(dt);
            char *send = (char *)malloc(n * es), *recv = (char *)malloc(n * es * (size_t)P), *want = (char *)malloc(n * es * (size_t)P);
            int r;
            fill(send, dt, me, n, 0);
            for (r = 0; r < P; r++) fill(want + (size_t)r * n * es, dt, r, n, 0);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_all_gather(comm, send, recv, n, dt), fsdp_comm_last_error(comm));
            TEST_ASSERT_EQUAL_MEMORY(want, recv, n * es * (size_t)P);
            free(send); free(recv); free(want);
        }
}

static void test_mpi_reduce_scatter_matches_reference_bitwise(void) {
    static const fsdp_reduce_op ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
    size_t d, k, o;
    for (o = 0; o < 3; o++)
        for (d = 0; d < 3; d++)
            for (k = 0; k < 3; k++) {
                fsdp_dtype dt = dtypes[d];
                size_t n = counts[k], es = fsdp_dtype_size(dt);
                char *send = (char *)malloc(n * es * (size_t)P), *recv = (char *)malloc(n * es), *want = (char *)malloc(n * es);
                fill(send, dt, me, n * (size_t)P, 0);
                reference(want, dt, ops[o], (size_t)me * n, n);
                TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_reduce_scatter(comm, send, recv, n, dt, ops[o]), fsdp_comm_last_error(comm));
                TEST_ASSERT_EQUAL_MEMORY(want, recv, n * es);
                free(send); free(recv); free(want);
            }
}

static void test_mpi_all_reduce_matches_reference_bitwise(void) {
    static const fsdp_reduce_op ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX};
    size_t d, k, o;
    for (o = 0; o < 3; o++)
        for (d = 0; d < 3; d++)
            for (k = 0; k < 3; k++) {
                fsdp_dtype dt = dtypes[d];
                size_t n = counts[k], es = fsdp_dtype_size(dt);
                char *buf = (char *)malloc(n * es), *want = (char *)malloc(n * es);
                fill(buf, dt, me, n, 0);
                reference(want, dt, ops[o], 0, n);
                TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_all_reduce(comm, buf, buf, n, dt, ops[o]), fsdp_comm_last_error(comm));
                TEST_ASSERT_EQUAL_MEMORY(want, buf, n * es);
                free(buf); free(want);
            }
}

static void test_mpi_broadcast_from_last_rank_reaches_everyone(void) {
    size_t n = 100003, es = 2;
    char *buf = (char *)malloc(n * es), *want = (char *)malloc(n * es);
    fill(want, FSDP_BF16, P - 1, n, 0);
    if (me == P - 1) memcpy(buf, want, n * es); else memset(buf, 0, n * es);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_broadcast(comm, buf, n, FSDP_BF16, P - 1), fsdp_comm_last_error(comm));
    TEST_ASSERT_EQUAL_MEMORY(want, buf, n * es);
    free(buf); free(want);
}

/* mpirun sets none of the variables a job token comes from: the world draws one (rank 0's,
   broadcast), so that two jobs of a user on one host never name their shared-memory
   sub-communicators alike (the chaos campaign saw two such jobs meet: one rank failed to form
   its HYBRID_SHARD groups and the others waited for it until their timeout) */
static void test_mpi_world_without_job_token_shares_one_drawn_by_rank0(void) {
    char mine[64], *all = (char *)calloc((size_t)P, sizeof mine);
    int r;
    memset(mine, 0, sizeof mine);
    snprintf(mine, sizeof mine, "%s", comm->job);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_all_gather(comm, mine, all, sizeof mine / 4, FSDP_F32));
    TEST_ASSERT_EQUAL_INT(0, strncmp(mine, "mpi-", 4));
    TEST_ASSERT_EQUAL_INT(20, (int)strlen(mine)); /* "mpi-" and 8 random bytes in hex */
    for (r = 0; r < P; r++) TEST_ASSERT_EQUAL_STRING(mine, all + (size_t)r * sizeof mine);
    free(all);
}

/* Ranks of one host split into groups made of shared memory (as HYBRID_SHARD's shard groups),
   many times in a row; every group reduces exactly. tests/run.sh runs two such jobs at once. */
static void test_mpi_split_into_shm_groups_repeatedly_reduces_exactly(void) {
    int it, r;
    for (it = 0; it < 20; it++) {
        fsdp_comm *sub = NULL;
        float x = (float)(me + 1 + it), y = 0, want = 0;
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_comm_split(comm, me % 2, me, &sub), fsdp_comm_last_error(comm));
        if (fsdp_comm_size(sub) > 1) TEST_ASSERT_EQUAL_INT(FSDP_BACKEND_SHM, fsdp_comm_backend(sub));
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_all_reduce(sub, &x, &y, 1, FSDP_F32, FSDP_SUM));
        for (r = me % 2; r < P; r += 2) want += (float)(r + 1 + it);
        TEST_ASSERT_EQUAL_FLOAT(want, y);
        fsdp_comm_destroy(sub);
    }
}

static void test_mpi_mismatched_collectives_fail_with_mismatch(void) {
    float x[4] = {1, 2, 3, 4}, y[16];
    int rc;
    /* the last test: it poisons the communicator */
    if (me == 0) rc = fsdp_all_reduce(comm, x, y, 4, FSDP_F32, FSDP_SUM);
    else rc = fsdp_all_gather(comm, x, y, 4, FSDP_F32);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_MISMATCH, rc);
    TEST_ASSERT_NOT_NULL(strstr(fsdp_comm_last_error(comm), "mismatch"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_ABORTED, fsdp_barrier(comm));
}

int main(void) {
    fsdp_comm_desc desc;
    char err[512];
    int rc;
    memset(&desc, 0, sizeof desc);
    desc.backend = FSDP_BACKEND_MPI;
    desc.timeout_ms = 20000;
    setenv("FSDP_BACKEND", "mpi", 1);
    rc = fsdp_comm_init_from_env(&comm, &desc, err, sizeof err);
    if (rc != FSDP_SUCCESS) { fprintf(stderr, "fsdp_comm_init_from_env: %s\n", err); return 1; }
    P = fsdp_comm_size(comm);
    me = fsdp_comm_rank(comm);
    if (me != 0) { /* one report: rank 0's; the others must still run every test */
        if (!freopen("/dev/null", "w", stdout)) return 1;
    }
    UNITY_BEGIN();
    RUN_TEST(test_mpi_all_gather_matches_reference_bitwise);
    RUN_TEST(test_mpi_reduce_scatter_matches_reference_bitwise);
    RUN_TEST(test_mpi_all_reduce_matches_reference_bitwise);
    RUN_TEST(test_mpi_broadcast_from_last_rank_reaches_everyone);
    RUN_TEST(test_mpi_world_without_job_token_shares_one_drawn_by_rank0);
    RUN_TEST(test_mpi_split_into_shm_groups_repeatedly_reduces_exactly);
    RUN_TEST(test_mpi_mismatched_collectives_fail_with_mismatch);
    rc = UNITY_END();
    fsdp_comm_destroy(comm);
    return rc;
}
