/* test_rendezvous.c - specification of the socket rendezvous under load (issue 27): an acceptor
   runs at most FSDP__SOCK_PENDING_MAX handshakes at once and drops the oldest to make room (so
   that strangers cannot hold its door); an honest rank whose handshake was dropped dials again
   after a random, growing pause until its deadline, so a job of many ranks forms however many
   arrive at once.

   Built with FSDP__SOCK_PENDING_MAX 2 (fsdp.h's private limit, lowered here): with 16 ranks
   dialling rank 0 together, and each rank admitting the ones above it, handshakes are dropped
   in every run, which the ranks' logs show; every rank still joins and an all_reduce over the
   world gives the exact sum.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_rendezvous.c \
              tests/unity/unity.c -o /tmp/test_rendezvous -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP__SOCK_PENDING_MAX 2
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#define RANKS 16

typedef struct rank_result {
    int done, rc;
    float sum;
    int redials;       /* "dropped the handshake" lines this rank logged */
    char error[300];
} rank_result;

static rank_result *board;

void setUp(void) { board = (rank_result *)map_shared(sizeof(rank_result) * RANKS); }
void tearDown(void) { munmap(board, sizeof(rank_result) * RANKS); }

static void count_redials(void *user, fsdp_log_level level, const char *message) {
    int *redials = (int *)user;
    (void)level;
    if (strstr(message, "dropped the handshake")) __atomic_fetch_add(redials, 1, __ATOMIC_RELAXED);
}

/* Each rank joins a socket world of its own making (the launcher's comm is only a way to run it):
   rank 0 listens at a port the parent picked, the others dial it. */
static int port;

static int join_and_sum(fsdp_comm *launched, void *arg) {
    int rank = fsdp_comm_rank(launched), rc;
    rank_result *r = &board[rank];
    fsdp_comm_desc d;
    fsdp_comm *comm = NULL;
    char addr[64];
    float one = (float)(rank + 1);
    (void)arg;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_SOCKET;
    d.rank = rank;
    d.world_size = RANKS;
    d.master_addr = "127.0.0.1";
    d.master_port = port;
    d.job = "test-rendezvous";
    d.timeout_ms = 60000;
    d.logger.fn = count_redials;
    d.logger.user = &r->redials;
    d.logger.max_level = FSDP_LOG_INFO;
    rc = fsdp_comm_init(&comm, &d);
    if (!rc) rc = fsdp_all_reduce(comm, &one, &r->sum, 1, FSDP_F32, FSDP_SUM);
    r->rc = rc;
    if (rc) copy_text(r->error, sizeof r->error, comm ? fsdp_comm_last_error(comm) : fsdp_last_error(NULL));
    r->done = 1;
    fsdp_comm_destroy(comm);
    return 0;
}

void test_many_ranks_whose_handshakes_a_busy_acceptor_drops_dial_again_and_join(void) {
    fsdp_launch_status status;
    int r, redials = 0;
    char message[400];
    port = pick_free_port();
    memset(board, 0, sizeof(rank_result) * RANKS);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, launch_ranks(RANKS, FSDP_BACKEND_SHM, 90000, join_and_sum, NULL, &status),
                                  status.message);
    for (r = 0; r < RANKS; r++) {
        snprintf(message, sizeof message, "rank %d: rc %d: %s", r, board[r].rc, board[r].error);
        TEST_ASSERT_TRUE_MESSAGE(board[r].done && board[r].rc == 0, message);
        TEST_ASSERT_EQUAL_FLOAT(RANKS * (RANKS + 1) / 2, board[r].sum);
        redials += board[r].redials;
    }
    TEST_ASSERT_TRUE_MESSAGE(redials > 0, "no handshake was dropped: the test did not exercise dialling again");
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_many_ranks_whose_handshakes_a_busy_acceptor_drops_dial_again_and_join);
    return UNITY_END();
}
