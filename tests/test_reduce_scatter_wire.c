/* test_reduce_scatter_wire.c - specification of fsdp_reduce_scatter_wire (>>qcomm), the
   reduce-scatter whose trip between hosts is quantized: at the layouts H hosts x L ranks 1x4,
   2x2, 4x1 and 2x3 (shm comms split by color stand in for hosts: host = split(r / L), cross =
   split(r % L)), with int8 and int4, blocks of 8 and 128, SUM and AVG, with and without error
   feedback over three calls, every rank's result (and residual) equals BITWISE a plain
   single-process reference that follows the documented order of operations: each host's f32
   partials summed in local rank order, the residual added, encoded with fsdp_wire_encode, the
   residual updated, decoded and folded in host order. A second run gives the same bits, and a
   NaN in one rank's gradient makes exactly its block's elements NaN.

   Ranks are forked by fsdp_launch_ex (shm); they write their results into a MAP_SHARED region;
   the parent computes the reference and compares. Only the parent asserts.

   Build: make build/test_reduce_scatter_wire */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#define MAX_WORLD 6
#define MAX_HOSTS 4
#define STEPS 3
#define MAX_COUNT 1000
#define TIMEOUT_MS 20000

/* One configuration every rank runs STEPS times. */
typedef struct qconfig {
    fsdp_wire wire;
    size_t block;
    int residual;
    fsdp_reduce_op op;
    size_t count;
} qconfig;

static const qconfig configs[] = {
    {FSDP_WIRE_INT8, 128, 0, FSDP_SUM, 1000}, {FSDP_WIRE_INT8, 128, 1, FSDP_AVG, 1000},
    {FSDP_WIRE_INT8, 8, 1, FSDP_SUM, 1000},   {FSDP_WIRE_INT8, 8, 0, FSDP_AVG, 13},
    {FSDP_WIRE_INT4, 128, 0, FSDP_AVG, 1000}, {FSDP_WIRE_INT4, 128, 1, FSDP_SUM, 1000},
    {FSDP_WIRE_INT4, 8, 1, FSDP_AVG, 13},     {FSDP_WIRE_INT4, 8, 0, FSDP_SUM, 1},
    {FSDP_WIRE_INT8, 0, 1, FSDP_SUM, 0},
};
#define CONFIGS (int)(sizeof configs / sizeof configs[0])

/* What a rank reports: per config and step its recv and residual. */
typedef struct rank_out {
    int done, rc;
    char message[300];
    float recv[CONFIGS][STEPS][MAX_COUNT];
    float residual[CONFIGS][STEPS][MAX_HOSTS * MAX_COUNT];
} rank_out;

static rank_out *outs; /* [MAX_WORLD], MAP_SHARED before any fork */

typedef struct layout {
    int hosts, local;
    int nan_rank;      /* -1: none; else this rank's gradient has a NaN (configs 0 and 1, step 1, element 5) */
} layout;

/* Element i of rank r's gradient (all P shards) in config k, step t: values of many magnitudes
   (so blocks quantize differently), some exact zeros. */
static float grad_value(int k, int t, int r, size_t i) {
    uint32_t h = mix32((uint32_t)k * 0x9E3779B9u ^ (uint32_t)t * 0x85EBCA6Bu ^ (uint32_t)r * 0xC2B2AE35u ^ (uint32_t)i);
    float unit = (float)(h & 0xFFFFu) / 32768.0f - 1.0f;
    if ((h >> 16) % 17 == 0) return 0.0f;
    return unit * ldexpf(1.0f, (int)((h >> 20) % 12) - 6);
}

static void fill_grad(float *g, const layout *lay, int k, int t, int r) {
    size_t i, n = configs[k].count * (size_t)(lay->hosts * lay->local);
    for (i = 0; i < n; i++) g[i] = grad_value(k, t, r, i);
    if (r == lay->nan_rank && k <= 1 && t == 1) g[5] = NAN;
}

/* ---------------------------------------------------------------------------------------------
   a rank
   --------------------------------------------------------------------------------------------- */
static int rank_main(fsdp_comm *world, void *arg) {
    const layout *lay = (const layout *)arg;
    int r = fsdp_comm_rank(world), L = lay->local, H = lay->hosts, P = H * L, k, t;
    rank_out *o = &outs[r];
    fsdp_comm *host = NULL, *cross = NULL;
    float *grad = (float *)malloc(sizeof(float) * (size_t)P * MAX_COUNT), *residual = NULL;
    if (!grad) return 3;
    if ((o->rc = fsdp_comm_split(world, r / L, r, &host)) != 0 || (o->rc = fsdp_comm_split(world, r % L, r, &cross)) != 0) {
        snprintf(o->message, sizeof o->message, "fsdp_comm_split: %.250s", fsdp_comm_last_error(world));
        return 0;
    }
    for (k = 0; k < CONFIGS && o->rc == FSDP_SUCCESS; k++) {
        const qconfig *q = &configs[k];
        residual = q->residual ? (float *)calloc((size_t)H * MAX_COUNT + 1, sizeof(float)) : NULL;
        for (t = 0; t < STEPS && o->rc == FSDP_SUCCESS; t++) {
            fill_grad(grad, lay, k, t, r);
            o->rc = fsdp_reduce_scatter_wire(host, cross, grad, o->recv[k][t], q->count, q->op, q->wire, q->block, residual);
            if (o->rc != FSDP_SUCCESS)
                snprintf(o->message, sizeof o->message, "config %d step %d: %s; host: %.120s; cross: %.120s", k, t,
                         fsdp_result_name(o->rc), fsdp_comm_last_error(host), fsdp_comm_last_error(cross));
            if (residual) memcpy(o->residual[k][t], residual, sizeof(float) * (size_t)H * q->count);
        }
        free(residual);
    }
    fsdp_comm_destroy(cross);
    fsdp_comm_destroy(host);
    free(grad);
    o->done = 1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   the reference
   --------------------------------------------------------------------------------------------- */
/* The documented steps for every rank at once: recv[r], and the residuals carried in res[r]. */
static void reference_step(const layout *lay, int k, int t, float (*recv)[MAX_COUNT], float (*res)[MAX_HOSTS * MAX_COUNT]) {
    const qconfig *q = &configs[k];
    int H = lay->hosts, L = lay->local, P = H * L, r, g, l2;
    size_t n = q->count, i, slot = fsdp_wire_bytes(q->wire, n, q->block) + 4;
    float *grads = (float *)malloc(sizeof(float) * (size_t)P * (size_t)P * MAX_COUNT);
    float *z = (float *)malloc(sizeof(float) * MAX_COUNT + 4), *decoded = (float *)malloc(sizeof(float) * MAX_COUNT + 4);
    unsigned char *codes = (unsigned char *)malloc(slot * (size_t)P * (size_t)H); /* [rank][host g] */
    TEST_ASSERT_TRUE(grads && z && decoded && codes);
    for (r = 0; r < P; r++) fill_grad(grads + (size_t)r * (size_t)P * MAX_COUNT, lay, k, t, r);
    for (r = 0; r < P; r++) {
        int h = r / L, l = r % L;
        for (g = 0; g < H; g++) { /* y_g: host h's sum of shard g L + l, in local rank order */
            for (i = 0; i < n; i++) {
                float acc = 0.0f;
                for (l2 = 0; l2 < L; l2++) {
                    float x = grads[(size_t)(h * L + l2) * (size_t)P * MAX_COUNT + (size_t)(g * L + l) * n + i];
                    acc = l2 == 0 ? x : acc + x;
                }
                z[i] = acc;
            }
            if (H == 1) {
                for (i = 0; i < n; i++) recv[r][i] = q->op == FSDP_AVG ? z[i] / (float)P : z[i];
                continue;
            }
            if (q->residual)
                for (i = 0; i < n; i++) z[i] = z[i] + res[r][(size_t)g * n + i];
            fsdp_wire_encode(codes + ((size_t)r * (size_t)H + (size_t)g) * slot, q->wire, q->block, z, n, NULL);
            if (!q->residual) continue;
            fsdp_wire_decode(decoded, FSDP_F32, codes + ((size_t)r * (size_t)H + (size_t)g) * slot, q->wire, q->block, n);
            for (i = 0; i < n; i++) res[r][(size_t)g * n + i] = isnan(decoded[i]) ? 0.0f : z[i] - decoded[i];
        }
    }
    for (r = 0; r < P && H > 1; r++) { /* d_g: what rank (g, l) encoded for host h, folded in host order */
        int h = r / L, l = r % L;
        for (g = 0; g < H; g++) {
            fsdp_wire_decode(decoded, FSDP_F32, codes + ((size_t)(g * L + l) * (size_t)H + (size_t)h) * slot, q->wire,
                             q->block, n);
            for (i = 0; i < n; i++) recv[r][i] = g == 0 ? decoded[i] : recv[r][i] + decoded[i];
        }
        if (q->op == FSDP_AVG)
            for (i = 0; i < n; i++) recv[r][i] = recv[r][i] / (float)P;
    }
    free(grads);
    free(z);
    free(decoded);
    free(codes);
}

/* ---------------------------------------------------------------------------------------------
   runs and assertions
   --------------------------------------------------------------------------------------------- */
static rank_out *first_run; /* a copy of the last run's outputs, for the run-to-run test */

static void run_layout(const layout *lay) {
    fsdp_launch_desc d;
    fsdp_launch_status status;
    int rc, P = lay->hosts * lay->local, r;
    char what[600];
    memset(outs, 0, sizeof *outs * MAX_WORLD);
    memset(&d, 0, sizeof d);
    d.nprocs = P;
    d.timeout_ms = TIMEOUT_MS;
    fflush(stdout);
    fflush(stderr);
    rc = fsdp_launch_ex(&d, rank_main, (void *)lay, &status);
    for (r = 0; r < P; r++) {
        snprintf(what, sizeof what, "%dx%d, rank %d: %s (launch: %s %s)", lay->hosts, lay->local, r,
                 outs[r].message[0] ? outs[r].message : "no message", fsdp_result_name(rc), status.message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, outs[r].rc, what);
        TEST_ASSERT_TRUE_MESSAGE(outs[r].done, what);
    }
}

/* Every rank's recv and residual, every config and step, equal the reference's bits. */
static void assert_layout_matches_reference(int hosts, int local, int nan_rank) {
    static float ref_recv[MAX_WORLD][MAX_COUNT], ref_res[MAX_WORLD][MAX_HOSTS * MAX_COUNT];
    layout lay = {hosts, local, nan_rank};
    int P = hosts * local, k, t, r;
    size_t i;
    char what[300];
    run_layout(&lay);
    for (k = 0; k < CONFIGS; k++) {
        const qconfig *q = &configs[k];
        memset(ref_res, 0, sizeof ref_res);
        for (t = 0; t < STEPS; t++) {
            reference_step(&lay, k, t, ref_recv, ref_res);
            for (r = 0; r < P; r++) {
                for (i = 0; i < q->count && bits_of(outs[r].recv[k][t][i]) == bits_of(ref_recv[r][i]); i++) {}
                snprintf(what, sizeof what, "%dx%d %s block %zu %s%s count %zu, step %d, rank %d: recv[%zu] is %.9g, the "
                         "reference %.9g", hosts, local, fsdp_wire_name(q->wire), q->block, op_name(q->op),
                         q->residual ? " with residual" : "", q->count, t, r, i, i < q->count ? outs[r].recv[k][t][i] : 0.0,
                         i < q->count ? ref_recv[r][i] : 0.0);
                TEST_ASSERT_EQUAL_size_t_MESSAGE(q->count, i, what);
                for (i = 0; q->residual && hosts > 1 && i < (size_t)hosts * q->count &&
                            bits_of(outs[r].residual[k][t][i]) == bits_of(ref_res[r][i]); i++) {}
                snprintf(what, sizeof what, "%dx%d %s block %zu count %zu, step %d, rank %d: residual[%zu] differs",
                         hosts, local, fsdp_wire_name(q->wire), q->block, q->count, t, r, i);
                if (q->residual && hosts > 1) TEST_ASSERT_EQUAL_size_t_MESSAGE((size_t)hosts * q->count, i, what);
            }
        }
    }
}

static void test_reduce_scatter_wire_on_1_host_of_4_equals_the_plain_reduce_scatter_bitwise(void) {
    assert_layout_matches_reference(1, 4, -1);
}
static void test_reduce_scatter_wire_on_2_hosts_of_2_equals_the_reference_bitwise(void) {
    assert_layout_matches_reference(2, 2, -1);
}
static void test_reduce_scatter_wire_on_4_hosts_of_1_equals_the_reference_bitwise(void) {
    assert_layout_matches_reference(4, 1, -1);
}
static void test_reduce_scatter_wire_on_2_hosts_of_3_equals_the_reference_bitwise(void) {
    assert_layout_matches_reference(2, 3, -1);
}

static void test_reduce_scatter_wire_run_twice_gives_identical_bits(void) {
    layout lay = {2, 3, -1};
    run_layout(&lay);
    memcpy(first_run, outs, sizeof *outs * MAX_WORLD);
    run_layout(&lay);
    TEST_ASSERT_TRUE_MESSAGE(memcmp(first_run, outs, sizeof *outs * MAX_WORLD) == 0, "two runs of 2x3 differ");
}

/* A NaN in rank 1's gradient (shard 0, element 5) reaches rank 0's result as NaN in exactly
   the elements of its block (128 elements), and nowhere else; with error feedback the block's
   residual restarts at 0, so the next step is finite again; all as the reference says. */
static void test_reduce_scatter_wire_with_a_nan_gives_nan_in_exactly_its_block(void) {
    size_t i;
    int r, k;
    assert_layout_matches_reference(2, 2, 1);
    for (k = 0; k <= 1; k++)
        for (i = 0; i < configs[k].count; i++) {
            char what[120];
            snprintf(what, sizeof what, "config %d, rank 0, element %zu: %g, then %g", k, i, outs[0].recv[k][1][i],
                     outs[0].recv[k][2][i]);
            TEST_ASSERT_TRUE_MESSAGE(isnan(outs[0].recv[k][1][i]) == (i < 128), what);
            TEST_ASSERT_FALSE_MESSAGE(isnan(outs[0].recv[k][2][i]), what);
            for (r = 1; r < 4; r++) TEST_ASSERT_FALSE(isnan(outs[r].recv[k][1][i]));
        }
}

static void test_reduce_scatter_wire_with_an_invalid_wire_or_op_is_refused(void) {
    fsdp_comm *comm = NULL;
    float send[4] = {1, 2, 3, 4}, recv[4];
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, open_one_rank_comm(&comm, "qrs-invalid"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_reduce_scatter_wire(comm, comm, send, recv, 4, FSDP_SUM,
                                                                        FSDP_WIRE_DEFAULT, 0, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_reduce_scatter_wire(comm, comm, send, recv, 4, FSDP_SUM,
                                                                        FSDP_WIRE_INT8, 12, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_reduce_scatter_wire(comm, comm, send, recv, 4, FSDP_MAX,
                                                                        FSDP_WIRE_INT8, 0, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_reduce_scatter_wire(NULL, NULL, send, recv, 4, FSDP_SUM,
                                                                        FSDP_WIRE_INT8, 0, NULL));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_reduce_scatter_wire(comm, comm, send, recv, 4, FSDP_SUM,
                                                                FSDP_WIRE_INT8, 0, NULL));
    TEST_ASSERT_EQUAL_FLOAT(4.0f, recv[3]);
    fsdp_comm_destroy(comm);
}

void setUp(void) {}
void tearDown(void) {}

int main(void) {
    outs = (rank_out *)map_shared(sizeof *outs * MAX_WORLD);
    first_run = (rank_out *)malloc(sizeof *outs * MAX_WORLD);
    if (!first_run) return 1;
    UNITY_BEGIN();
    RUN_TEST(test_reduce_scatter_wire_with_an_invalid_wire_or_op_is_refused);
    RUN_TEST(test_reduce_scatter_wire_on_1_host_of_4_equals_the_plain_reduce_scatter_bitwise);
    RUN_TEST(test_reduce_scatter_wire_on_2_hosts_of_2_equals_the_reference_bitwise);
    RUN_TEST(test_reduce_scatter_wire_on_4_hosts_of_1_equals_the_reference_bitwise);
    RUN_TEST(test_reduce_scatter_wire_on_2_hosts_of_3_equals_the_reference_bitwise);
    RUN_TEST(test_reduce_scatter_wire_run_twice_gives_identical_bits);
    RUN_TEST(test_reduce_scatter_wire_with_a_nan_gives_nan_in_exactly_its_block);
    free(first_run);
    return UNITY_END();
}
