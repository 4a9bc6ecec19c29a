/* The communicator used from threads, as the FSDP runtime's comm thread uses it: ops issued
   from a worker thread, and fsdp_comm_abort from another thread waking an op that waits for
   a rank that never comes. Run under ThreadSanitizer by `make test-tsan`. */
#ifndef _GNU_SOURCE /* the system headers' declarations that fsdp.h's implementation would ask for */
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <pthread.h>

void setUp(void) {}
void tearDown(void) {}

typedef struct worker_job {
    fsdp_comm *comm;
    int rc;
    double seconds;
} worker_job;

static void *worker_all_reduce(void *arg) {
    worker_job *job = (worker_job *)arg;
    float x[1000];
    int i, k;
    double t = fsdp_now();
    job->rc = FSDP_SUCCESS;
    for (k = 0; k < 50 && job->rc == FSDP_SUCCESS; k++) {
        for (i = 0; i < 1000; i++) x[i] = (float)(fsdp_comm_rank(job->comm) + i);
        job->rc = fsdp_all_reduce(job->comm, x, x, 1000, FSDP_F32, FSDP_SUM);
        for (i = 0; i < 1000 && job->rc == FSDP_SUCCESS; i++)
            if (x[i] != (float)(1 + 2 * i)) job->rc = -1000;
    }
    job->seconds = fsdp_now() - t;
    return NULL;
}

/* Rank body: the ops run on a worker thread while the main thread waits for it. */
static int ops_on_worker(fsdp_comm *comm, void *arg) {
    pthread_t th;
    worker_job job;
    (void)arg;
    job.comm = comm;
    if (pthread_create(&th, NULL, worker_all_reduce, &job) != 0) return 10;
    pthread_join(th, NULL);
    return job.rc == FSDP_SUCCESS ? 0 : 11;
}

static void launch_expect_success(fsdp_backend_kind backend, fsdp_rank_fn fn) {
    fsdp_launch_status st;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, launch_ranks(2, backend, 20000, fn, NULL, &st), st.message);
}

static void test_threads_ops_from_worker_thread_shm_succeed(void) { launch_expect_success(FSDP_BACKEND_SHM, ops_on_worker); }
static void test_threads_ops_from_worker_thread_socket_succeed(void) { launch_expect_success(FSDP_BACKEND_SOCKET, ops_on_worker); }

static void *abort_later(void *arg) {
    usleep(200 * 1000);
    fsdp_comm_abort((fsdp_comm *)arg, "stopped by the test");
    return NULL;
}

/* Only rank 0 enters an op; its other thread aborts; it must return within a second, long
   before the 20 s timeout. */
static int abort_wakes_sleeping_wait(fsdp_comm *comm, void *arg) {
    pthread_t th;
    double t;
    float x = 1;
    int rc;
    (void)arg;
    if (fsdp_comm_rank(comm) != 0) {
        usleep(1500 * 1000);
        return 0;
    }
    if (pthread_create(&th, NULL, abort_later, comm) != 0) return 30;
    t = fsdp_now();
    rc = fsdp_all_reduce(comm, &x, &x, 1, FSDP_F32, FSDP_SUM);
    t = fsdp_now() - t;
    pthread_join(th, NULL);
    if (rc != FSDP_ERR_ABORTED) return 31;
    return t < 1.0 ? 0 : 32;
}

static void test_threads_abort_wakes_op_waiting_for_absent_rank_shm(void) { launch_expect_success(FSDP_BACKEND_SHM, abort_wakes_sleeping_wait); }
static void test_threads_abort_wakes_op_waiting_for_absent_rank_socket(void) { launch_expect_success(FSDP_BACKEND_SOCKET, abort_wakes_sleeping_wait); }

/* The FSDP runtime's comm thread gathers and reduces while the compute thread runs the hooks;
   under ThreadSanitizer this shows the handoff is race-free. Three units, prefetch on, a few
   SGD steps; the result is checked against the same arithmetic done by hand. */
static int runtime_steps(fsdp_comm *comm, void *arg) {
    fsdp_model *m;
    fsdp_ctx *ctx;
    fsdp_desc d;
    fsdp_init_rule ones = {FSDP_INIT_ONES, 0, 0, NULL, NULL};
    const char *types[] = {"Linear", NULL};
    int64_t shape[1] = {13};
    int mods[3], params[3], i, k, s, rc;
    float full[13];
    (void)arg;
    if (fsdp_model_create(&m, "Net")) return 40;
    for (k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "%d", k);
        mods[k] = fsdp_model_module(m, 0, name, "Linear");
        params[k] = fsdp_model_param(m, mods[k], "weight", 1, shape, ones);
    }
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = types;
    d.forward_prefetch = 1;
    d.optimizer.lr = 0.5f;
    if ((rc = fsdp_init(&ctx, m, &d)) != 0) return 41;
    for (s = 0; s < 3; s++) {
        if (fsdp_pre_forward(ctx, 0)) return 42;
        for (k = 0; k < 3; k++) if (fsdp_pre_forward(ctx, mods[k]) || fsdp_post_forward(ctx, mods[k])) return 43;
        if (fsdp_post_forward(ctx, 0) || fsdp_pre_backward(ctx, 0)) return 44;
        for (k = 2; k >= 0; k--) {
            float *g, *w;
            if (fsdp_pre_backward(ctx, mods[k])) return 45;
            g = fsdp_grad(ctx, params[k]);
            w = fsdp_param(ctx, params[k]);
            for (i = 0; i < 13; i++) g[i] += w[i]; /* gradient of 0.5 w^2, the same on every rank */
            if (fsdp_post_backward(ctx, mods[k])) return 46;
        }
        if (fsdp_post_backward(ctx, 0) || fsdp_step(ctx, 0, NULL) || fsdp_zero_grad(ctx)) return 47;
    }
    for (k = 0; k < 3; k++) { /* w <- w - 0.5 w, three times: 1/8 */
        if (fsdp_gather_param(ctx, params[k], full)) return 48;
        for (i = 0; i < 13; i++) if (full[i] != 0.125f) return 49;
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    return 0;
}

static void test_threads_runtime_comm_thread_shm_steps_match_by_hand(void) { launch_expect_success(FSDP_BACKEND_SHM, runtime_steps); }
static void test_threads_runtime_comm_thread_socket_steps_match_by_hand(void) { launch_expect_success(FSDP_BACKEND_SOCKET, runtime_steps); }

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_threads_ops_from_worker_thread_shm_succeed);
    RUN_TEST(test_threads_ops_from_worker_thread_socket_succeed);
    RUN_TEST(test_threads_abort_wakes_op_waiting_for_absent_rank_shm);
    RUN_TEST(test_threads_abort_wakes_op_waiting_for_absent_rank_socket);
    RUN_TEST(test_threads_runtime_comm_thread_shm_steps_match_by_hand);
    RUN_TEST(test_threads_runtime_comm_thread_socket_steps_match_by_hand);
    return UNITY_END();
}
