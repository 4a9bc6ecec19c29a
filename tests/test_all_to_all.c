/* test_all_to_all.c - specification of fsdp_all_to_all: at 1..8 ranks over shared memory (buffers
   staged, read by a single copy, or in fsdp_comm_alloc memory), over sockets and over a user
   backend that lacks the op (the library emulates it), every rank's recv holds, at r * count,
   exactly the bytes rank r put for it at rank * count of its send, for f32, bf16 and f16 and
   counts 0, 1, odd and a few MiB; and it fails as every op does: a count that differs across ranks
   is a mismatch, overlapping buffers are refused without harm to the comm, and a rank that dies
   or never calls makes the others fail within their timeout, naming it.
   The hierarchical world's all_to_all is in test_hierarchical.c, the MPI bridge's in test_mpi.c.

   Ranks are forked by fsdp_launch_ex; each checks what it received against the definition
   (every rank can compute every rank's send bytes) and writes a report into a MAP_SHARED region
   mapped before the launch. Only the parent asserts.

   Build: make build/test_all_to_all (or gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity
          tests/test_all_to_all.c tests/unity/unity.c -o /tmp/test_all_to_all -lpthread -lm) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <stdarg.h>

#define MAX_WORLD 8
#define TIMEOUT_MS 20000      /* bound on any wait in the exact-result runs: reached only by a hang */
#define FAIL_TIMEOUT_MS 2000  /* the communicators' bound in the failure runs */
#define MARGIN_MS 1500        /* allowed on top of a timeout before a wait counts as a hang */
#define GUARD_BYTES 64
#define GUARD_FILL 0xA5
#define DOOMED_RANK 2
#define FAIL_WORLD 3

/* How the ranks of a run get their communicator and buffers. */
enum { SHM, SHM_SINGLE_COPY, SHM_SHARED, SOCKET, USER, WAYS };
static const char *const way_names[WAYS] = {"shm (staged)", "shm (single copy where the ranks can)",
                                            "shm (send in fsdp_comm_alloc memory)", "socket",
                                            "user backend without all_to_all (emulated)"};

typedef struct exchange_case {
    size_t count; /* per piece */
    fsdp_dtype dtype;
} exchange_case;

static const exchange_case cases[] = {
    {0, FSDP_F32},      {1, FSDP_F32},      {1, FSDP_BF16},      {1, FSDP_F16},
    {7, FSDP_F32},      {7, FSDP_BF16},     {1001, FSDP_F16},    {1001, FSDP_F32},
    {65537, FSDP_BF16}, /* 128 KiB a piece: the single-copy range at small worlds */
    {196613, FSDP_F32}, /* 768 KiB a piece: several rounds of staging, 6 MiB sent at 8 ranks */
    {262147, FSDP_F16},
};
#define CASES (int)(sizeof cases / sizeof cases[0])

typedef struct rank_report {
    int done, rc, cases, wrong;
    int elapsed_ms;          /* failure runs: how long the op under test took */
    int later_rc;            /* failure runs: a valid op after it */
    char message[480];
} rank_report;

static rank_report *reports; /* [MAX_WORLD], MAP_SHARED before any fork */

/* Byte i of the piece rank `from` sends rank `to` in case k. */
static unsigned char piece_byte(int k, int from, int to, size_t i) {
    return (unsigned char)mix32((uint32_t)k * 0x9E3779B9u ^ (uint32_t)from * 0x85EBCA6Bu ^ (uint32_t)to * 0xC2B2AE35u ^
                                (uint32_t)i * 0x27D4EB2Fu ^ (uint32_t)(i >> 32));
}

/* Records the first thing that went wrong (printf-style). */
static void note(rank_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(rank_report *r, const char *fmt, ...) {
    va_list ap;
    if (r->message[0]) return;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------
   a user backend over an inner communicator, without all_to_all
   --------------------------------------------------------------------------------------------- */
static int fwd_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    return fsdp_all_gather((fsdp_comm *)impl, c->send, c->recv, c->count, c->dtype);
}
static int fwd_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    return fsdp_reduce_scatter((fsdp_comm *)impl, c->send, c->recv, c->count, c->dtype, c->op);
}
static int fwd_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    return fsdp_all_reduce((fsdp_comm *)impl, c->send, c->recv, c->count, c->dtype, c->op);
}
static int fwd_broadcast(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    return fsdp_broadcast((fsdp_comm *)impl, c->recv, c->count, c->dtype, c->root);
}
static int fwd_barrier(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    (void)comm;
    (void)c;
    return fsdp_barrier((fsdp_comm *)impl);
}
static const fsdp_backend forwarding_backend = {.name = "forwarding",
                                                .all_gather = fwd_all_gather,
                                                .reduce_scatter = fwd_reduce_scatter,
                                                .all_reduce = fwd_all_reduce,
                                                .broadcast = fwd_broadcast,
                                                .barrier = fwd_barrier,
                                                .check_fingerprints = 1};

/* ---------------------------------------------------------------------------------------------
   the exact-result runs
   --------------------------------------------------------------------------------------------- */
/* Runs case k on comm: 1 if anything differs from the definition (said in r->message). */
static int run_case(fsdp_comm *comm, int way, int k, rank_report *r) {
    const exchange_case *ec = &cases[k];
    int me = fsdp_comm_rank(comm), P = fsdp_comm_size(comm), p, wrong = 0, first = !r->message[0];
    size_t bytes = ec->count * fsdp_dtype_size(ec->dtype), total = bytes * (size_t)P, i;
    unsigned char *send = NULL, *recv = (unsigned char *)malloc(total + GUARD_BYTES);
    void *held = NULL;
    if (way == SHM_SHARED && fsdp_comm_alloc(comm, total + 1, &held) == FSDP_SUCCESS) send = (unsigned char *)held;
    else if (way != SHM_SHARED) send = (unsigned char *)malloc(total + 1);
    if (!send || !recv) {
        note(r, "out of memory (%zu bytes, case %d)", total, k);
        free(recv);
        if (way != SHM_SHARED) free(send);
        return 1;
    }
    for (p = 0; p < P; p++)
        for (i = 0; i < bytes; i++) send[(size_t)p * bytes + i] = piece_byte(k, me, p, i);
    memset(recv, GUARD_FILL, total + GUARD_BYTES);
    if ((r->rc = fsdp_all_to_all(comm, send, recv, ec->count, ec->dtype)) != FSDP_SUCCESS) {
        note(r, "all_to_all failed: %.400s", fsdp_comm_last_error(comm));
        wrong = 1;
    }
    for (p = 0; !wrong && p < P; p++) {
        for (i = 0; i < bytes && recv[(size_t)p * bytes + i] == piece_byte(k, p, me, i); i++) {}
        if (i < bytes) {
            note(r, "recv: the piece from rank %d differs from byte %zu on", p, i);
            wrong = 1;
        }
        for (i = 0; i < bytes && send[(size_t)p * bytes + i] == piece_byte(k, me, p, i); i++) {}
        if (i < bytes) {
            note(r, "send: the piece for rank %d changed from byte %zu on", p, i);
            wrong = 1;
        }
    }
    if (!wrong && !bytes_all_equal(recv + total, GUARD_BYTES, GUARD_FILL)) {
        note(r, "bytes written past recv's %zu bytes", total);
        wrong = 1;
    }
    if (wrong && first && r->message[0]) {
        char where[64];
        snprintf(where, sizeof where, " (rank %d, count %zu, %s)", me, ec->count, fsdp_dtype_name(ec->dtype));
        append_text(r->message, sizeof r->message, where);
    }
    free(recv);
    if (way == SHM_SHARED) fsdp_comm_free(comm, held);
    else free(send);
    return wrong;
}

/* The way's communicator over the launched one (the user backend wraps it), or NULL. */
static fsdp_comm *way_comm(fsdp_comm *launched, int way, rank_report *r) {
    fsdp_comm_desc d;
    fsdp_comm *user = NULL;
    if (way != USER) return launched;
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_USER;
    d.rank = fsdp_comm_rank(launched);
    d.world_size = fsdp_comm_size(launched);
    d.timeout_ms = TIMEOUT_MS;
    d.user_backend = &forwarding_backend;
    d.user_impl = launched;
    if ((r->rc = fsdp_comm_init(&user, &d)) != FSDP_SUCCESS)
        note(r, "fsdp_comm_init of the user backend: %.400s", fsdp_comm_last_error(NULL));
    return user;
}

static int exact_rank_main(fsdp_comm *launched, void *arg) {
    int way = *(const int *)arg, k;
    rank_report *r = &reports[fsdp_comm_rank(launched)];
    fsdp_comm *comm = way_comm(launched, way, r);
    for (k = 0; comm && k < CASES && r->rc == FSDP_SUCCESS; k++) { /* (a failed op fails the comm) */
        r->cases++;
        r->wrong += run_case(comm, way, k, r);
    }
    if (comm != launched) fsdp_comm_destroy(comm);
    r->done = 1;
    return 0;
}

static int launch_way(int way, int world, int timeout_ms, fsdp_rank_fn fn, void *arg, fsdp_launch_status *status) {
    fsdp_launch_desc d;
    memset(&d, 0, sizeof d);
    d.nprocs = world;
    d.backend = way == SOCKET ? FSDP_BACKEND_SOCKET : FSDP_BACKEND_SHM;
    d.timeout_ms = timeout_ms;
    d.shm_single_copy = way == SHM_SINGLE_COPY ? 2 : way == SHM ? -1 : 0;
    fflush(stdout);
    fflush(stderr);
    return fsdp_launch_ex(&d, fn, arg, status);
}

/* At 1..8 ranks, every case's result equals the definition on every rank. */
static void assert_exact_at_every_world_size(int way) {
    int world, rank;
    char what[800];
    for (world = 1; world <= MAX_WORLD; world++) {
        fsdp_launch_status status;
        int rc;
        memset(reports, 0, sizeof *reports * MAX_WORLD);
        rc = launch_way(way, world, TIMEOUT_MS, exact_rank_main, &way, &status);
        for (rank = 0; rank < world; rank++) {
            const rank_report *r = &reports[rank];
            snprintf(what, sizeof what, "%s, %d ranks, rank %d: %s (launch: %s %s)", way_names[way], world, rank,
                     r->message[0] ? r->message : "no message", fsdp_result_name(rc), status.message);
            TEST_ASSERT_TRUE_MESSAGE(r->done, what);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, r->rc, what);
            TEST_ASSERT_EQUAL_INT_MESSAGE(CASES, r->cases, what);
            TEST_ASSERT_EQUAL_INT_MESSAGE(0, r->wrong, what);
        }
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, what);
    }
}

static void test_all_to_all_over_shm_staged_at_1_to_8_ranks_equals_the_definition_bytewise(void) {
    assert_exact_at_every_world_size(SHM);
}
static void test_all_to_all_over_shm_with_single_copy_at_1_to_8_ranks_equals_the_definition_bytewise(void) {
    assert_exact_at_every_world_size(SHM_SINGLE_COPY);
}
static void test_all_to_all_over_shm_from_fsdp_comm_alloc_memory_at_1_to_8_ranks_equals_the_definition_bytewise(void) {
    assert_exact_at_every_world_size(SHM_SHARED);
}
static void test_all_to_all_over_socket_at_1_to_8_ranks_equals_the_definition_bytewise(void) {
    assert_exact_at_every_world_size(SOCKET);
}
static void test_all_to_all_over_a_user_backend_without_it_is_emulated_and_equals_the_definition_bytewise(void) {
    assert_exact_at_every_world_size(USER);
}

/* ---------------------------------------------------------------------------------------------
   failures
   --------------------------------------------------------------------------------------------- */
enum { MISMATCHED_COUNT, OVERLAPPING, DIES, NEVER_CALLS };

#define FAIL_COUNT 4099

/* One scenario on FAIL_WORLD ranks; then a valid all_to_all on the same comm (later_rc). */
static int failing_rank_main(fsdp_comm *comm, void *arg) {
    int scenario = *(const int *)arg, me = fsdp_comm_rank(comm), P = fsdp_comm_size(comm);
    rank_report *r = &reports[me];
    size_t n = (size_t)FAIL_COUNT * (size_t)P;
    float *send = (float *)calloc(2 * n + 2, sizeof *send), *recv = (float *)calloc(n + 2, sizeof *recv);
    double start;
    if (!send || !recv) return 3;
    if (me == DOOMED_RANK && scenario == DIES) raise(SIGKILL);
    if (me == DOOMED_RANK && scenario == NEVER_CALLS) {
        sleep_ms(FAIL_TIMEOUT_MS + MARGIN_MS + 500);
        r->done = 1;
        free(send);
        free(recv);
        return 0;
    }
    start = now_ms();
    if (scenario == MISMATCHED_COUNT)
        r->rc = fsdp_all_to_all(comm, send, recv, me == 1 ? FAIL_COUNT + 1 : FAIL_COUNT, FSDP_F32);
    else if (scenario == OVERLAPPING) /* recv starts inside send, and send inside recv */
        r->rc = fsdp_all_to_all(comm, send, send + n - 1, FAIL_COUNT, FSDP_F32) == FSDP_ERR_INVALID_ARG &&
                        fsdp_all_to_all(comm, send + 1, send, FAIL_COUNT, FSDP_F32) == FSDP_ERR_INVALID_ARG
                    ? FSDP_ERR_INVALID_ARG
                    : FSDP_SUCCESS;
    else
        r->rc = fsdp_all_to_all(comm, send, recv, FAIL_COUNT, FSDP_F32);
    r->elapsed_ms = (int)(now_ms() - start);
    copy_text(r->message, sizeof r->message, fsdp_comm_last_error(comm));
    r->later_rc = scenario == OVERLAPPING ? fsdp_all_to_all(comm, send, recv, FAIL_COUNT, FSDP_F32) : FSDP_SUCCESS;
    r->done = 1;
    free(send);
    free(recv);
    return 0;
}

static void run_failure(int scenario, fsdp_backend_kind backend) {
    fsdp_launch_status status;
    memset(reports, 0, sizeof *reports * MAX_WORLD);
    launch_way(backend == FSDP_BACKEND_SOCKET ? SOCKET : SHM, FAIL_WORLD, FAIL_TIMEOUT_MS, failing_rank_main, &scenario,
               &status);
}

static void describe(char *what, size_t size, fsdp_backend_kind backend, int rank) {
    const rank_report *r = &reports[rank];
    snprintf(what, size, "[%s] rank %d: %s after %d ms: '%s'", fsdp_backend_name(backend), rank, fsdp_result_name(r->rc),
             r->elapsed_ms, r->message);
}

/* Every rank fails (MISMATCH, or ABORTED where it learnt of it from a peer), at least one with
   MISMATCH, and the message shows both counts. */
static void assert_mismatched_count_fails(fsdp_backend_kind backend) {
    int rank, mismatches = 0;
    char what[700];
    run_failure(MISMATCHED_COUNT, backend);
    for (rank = 0; rank < FAIL_WORLD; rank++) {
        const rank_report *r = &reports[rank];
        describe(what, sizeof what, backend, rank);
        TEST_ASSERT_TRUE_MESSAGE(r->done, what);
        TEST_ASSERT_TRUE_MESSAGE(r->rc == FSDP_ERR_MISMATCH || r->rc == FSDP_ERR_ABORTED, what);
        TEST_ASSERT_LESS_THAN_MESSAGE(FAIL_TIMEOUT_MS + MARGIN_MS, r->elapsed_ms, what);
        assert_says(r->message, "all_to_all(count=4099");
        assert_says(r->message, "all_to_all(count=4100");
        mismatches += r->rc == FSDP_ERR_MISMATCH;
    }
    TEST_ASSERT_TRUE_MESSAGE(mismatches > 0, "no rank reported FSDP_ERR_MISMATCH");
}

static void test_all_to_all_over_shm_with_a_count_differing_on_one_rank_fails_every_rank_with_mismatch(void) {
    assert_mismatched_count_fails(FSDP_BACKEND_SHM);
}
static void test_all_to_all_over_socket_with_a_count_differing_on_one_rank_fails_every_rank_with_mismatch(void) {
    assert_mismatched_count_fails(FSDP_BACKEND_SOCKET);
}

static void test_all_to_all_with_overlapping_send_and_recv_is_refused_and_the_comm_stays_usable(void) {
    int rank;
    char what[700];
    run_failure(OVERLAPPING, FSDP_BACKEND_SHM);
    for (rank = 0; rank < FAIL_WORLD; rank++) {
        describe(what, sizeof what, FSDP_BACKEND_SHM, rank);
        TEST_ASSERT_TRUE_MESSAGE(reports[rank].done, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, reports[rank].rc, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[rank].later_rc, what);
    }
}

static void test_all_to_all_with_overlapping_buffers_on_one_rank_comm_is_refused(void) {
    fsdp_comm *comm = NULL;
    float buf[8];
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, open_one_rank_comm(&comm, "a2a-overlap"));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_all_to_all(comm, buf, buf + 3, 4, FSDP_F32));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_all_to_all(comm, buf, buf + 4, 4, FSDP_F32));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_comm_status(comm));
    fsdp_comm_destroy(comm);
}

/* The survivors of a rank that died or never called fail within their timeout, naming it. */
static void assert_survivors_fail_naming_the_rank(int scenario, fsdp_backend_kind backend) {
    int rank;
    char what[700], name[16];
    run_failure(scenario, backend);
    snprintf(name, sizeof name, "rank %d", DOOMED_RANK);
    for (rank = 0; rank < FAIL_WORLD; rank++) {
        const rank_report *r = &reports[rank];
        if (rank == DOOMED_RANK) continue;
        describe(what, sizeof what, backend, rank);
        TEST_ASSERT_TRUE_MESSAGE(r->done, what);
        TEST_ASSERT_TRUE_MESSAGE(r->rc != FSDP_SUCCESS, what);
        TEST_ASSERT_LESS_THAN_MESSAGE(FAIL_TIMEOUT_MS + MARGIN_MS, r->elapsed_ms, what);
        assert_says(r->message, name);
    }
}

static void test_all_to_all_over_shm_with_a_rank_that_died_fails_the_others_in_time_naming_it(void) {
    assert_survivors_fail_naming_the_rank(DIES, FSDP_BACKEND_SHM);
}
static void test_all_to_all_over_socket_with_a_rank_that_died_fails_the_others_in_time_naming_it(void) {
    assert_survivors_fail_naming_the_rank(DIES, FSDP_BACKEND_SOCKET);
}
static void test_all_to_all_over_shm_with_a_rank_that_never_calls_times_out_the_others_naming_it(void) {
    assert_survivors_fail_naming_the_rank(NEVER_CALLS, FSDP_BACKEND_SHM);
}
static void test_all_to_all_over_socket_with_a_rank_that_never_calls_times_out_the_others_naming_it(void) {
    assert_survivors_fail_naming_the_rank(NEVER_CALLS, FSDP_BACKEND_SOCKET);
}

void setUp(void) {}
void tearDown(void) {}

int main(void) {
    reports = (rank_report *)map_shared(sizeof *reports * MAX_WORLD);
    UNITY_BEGIN();
    RUN_TEST(test_all_to_all_with_overlapping_buffers_on_one_rank_comm_is_refused);
    RUN_TEST(test_all_to_all_over_shm_staged_at_1_to_8_ranks_equals_the_definition_bytewise);
    RUN_TEST(test_all_to_all_over_shm_with_single_copy_at_1_to_8_ranks_equals_the_definition_bytewise);
    RUN_TEST(test_all_to_all_over_shm_from_fsdp_comm_alloc_memory_at_1_to_8_ranks_equals_the_definition_bytewise);
    RUN_TEST(test_all_to_all_over_socket_at_1_to_8_ranks_equals_the_definition_bytewise);
    RUN_TEST(test_all_to_all_over_a_user_backend_without_it_is_emulated_and_equals_the_definition_bytewise);
    RUN_TEST(test_all_to_all_over_shm_with_a_count_differing_on_one_rank_fails_every_rank_with_mismatch);
    RUN_TEST(test_all_to_all_over_socket_with_a_count_differing_on_one_rank_fails_every_rank_with_mismatch);
    RUN_TEST(test_all_to_all_with_overlapping_send_and_recv_is_refused_and_the_comm_stays_usable);
    RUN_TEST(test_all_to_all_over_shm_with_a_rank_that_died_fails_the_others_in_time_naming_it);
    RUN_TEST(test_all_to_all_over_socket_with_a_rank_that_died_fails_the_others_in_time_naming_it);
    RUN_TEST(test_all_to_all_over_shm_with_a_rank_that_never_calls_times_out_the_others_naming_it);
    RUN_TEST(test_all_to_all_over_socket_with_a_rank_that_never_calls_times_out_the_others_naming_it);
    return UNITY_END();
}
