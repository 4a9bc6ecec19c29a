/* The communicator used from threads, as the FSDP runtime's comm thread uses it: ops issued
   from a worker thread, and fsdp_comm_abort from another thread waking an op that waits for
   a rank that never comes. Run under ThreadSanitizer by `make test-tsan`. */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"

#include <pthread.h>
#include <unistd.h>

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
    fsdp_launch_desc d;
    fsdp_launch_status st;
    memset(&d, 0, sizeof d);
    d.nprocs = 2;
    d.backend = backend;
    d.timeout_ms = 20000;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_launch_ex(&d, fn, NULL, &st), st.message);
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

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_threads_ops_from_worker_thread_shm_succeed);
    RUN_TEST(test_threads_ops_from_worker_thread_socket_succeed);
    RUN_TEST(test_threads_abort_wakes_op_waiting_for_absent_rank_shm);
    RUN_TEST(test_threads_abort_wakes_op_waiting_for_absent_rank_socket);
    return UNITY_END();
}
