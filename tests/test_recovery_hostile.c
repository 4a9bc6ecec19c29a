/* test_recovery_hostile.c - specification of >>recovery's listeners and messages against hostile
   or buggy input: what a client on the network (a stranger, a joiner that gave up, a rendezvous
   that is not the one) or a rank of the job with wrong numbers can make the recovery and rejoin
   paths do. Specified: a live survivor whose recovery listener a stranger flooded (its accept
   queue full: SYNs dropped) is not taken for gone, while a port that refuses is; a verdict MACed
   by the world's key but naming a replica out of the job's range, twice the same replica, or
   carrying a reason that does not end is not taken; a joiner whose hello was heard but whose
   connection closed since is not admitted with the others; a joiner whose peers list begins at
   a survivor's listener that never answers (any survivor but the rendezvous) still finds the
   rendezvous further on.

   Each test drives the private functions over loopback in this one process (a thread plays the
   peer where one must answer), on a context made by hand with only the fields they read: no
   forked world, no namespaces. The file includes the implementation.

   Build: make build/test_recovery_hostile */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>

#define GROUP 2     /* ranks per replica */
#define REPLICAS 3  /* of the job at fsdp_init */
#define FLOOD 200   /* connections a stranger opens: far past a listener's queue of 64 */

/* ---------------------------------------------------------------------------------------------
   a context made by hand: a rank of a job of REPLICAS replicas of GROUP ranks, recovery on
   --------------------------------------------------------------------------------------------- */
typedef struct fake_rank {
    fsdp_ctx *ctx;
    fsdp_comm *comm;
} fake_rank;

static fake_rank me;

/* Rank `rank` of the job "hostile-job" (world key: bytes 1..32), its replicas all training but
   `missing` (-1: none), its recovery listener open on loopback (rec->addr[rank] says where). */
static void fake_rank_open(int rank, int missing) {
    fsdp__recovery *rec;
    struct sockaddr_in at;
    socklen_t len = sizeof at;
    int k, n = 0;
    memset(&me, 0, sizeof me);
    me.ctx = (fsdp_ctx *)calloc(1, sizeof *me.ctx);
    me.comm = (fsdp_comm *)calloc(1, sizeof *me.comm);
    TEST_ASSERT_NOT_NULL(me.ctx);
    TEST_ASSERT_NOT_NULL(me.comm);
    copy_text(me.comm->job, sizeof me.comm->job, "hostile-job");
    for (k = 0; k < 32; k++) me.comm->key[k] = (unsigned char)(k + 1);
    me.comm->timeout_ms = 4000;
    me.ctx->comm = me.comm;
    me.ctx->rank = rank;
    me.ctx->desc.shard_group_size = GROUP;
    me.ctx->desc.recovery.enabled = 1;
    me.ctx->desc.recovery.detect_ms = 1000;
    rec = me.ctx->recovery = fsdp__recovery_new(me.comm, REPLICAS * GROUP, GROUP);
    TEST_ASSERT_NOT_NULL(rec);
    rec->first_rank = rank, rec->replica = rank / GROUP;
    for (k = 0; k < REPLICAS; k++)
        if (k != missing) rec->now.replicas[n++] = k;
    rec->now.count = n;
    memset(&at, 0, sizeof at);
    at.sin_family = AF_INET, at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TEST_ASSERT_TRUE((rec->listen_fd = fsdp__sock_listen(&at, 64)) >= 0);
    TEST_ASSERT_EQUAL_INT(0, getsockname(rec->listen_fd, (struct sockaddr *)&rec->addr[rank], &len));
}

static void fake_rank_close(void) {
    fsdp__recovery_close(me.ctx);
    free(me.comm);
    free(me.ctx);
    memset(&me, 0, sizeof me);
}

/* A listener on loopback (its address into *at), as a survivor's recovery listener is. */
static int loopback_listener(struct sockaddr_in *at) {
    socklen_t len = sizeof *at;
    int fd;
    memset(at, 0, sizeof *at);
    at->sin_family = AF_INET, at->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = fsdp__sock_listen(at, 64);
    TEST_ASSERT_TRUE(fd >= 0);
    TEST_ASSERT_EQUAL_INT(0, getsockname(fd, (struct sockaddr *)at, &len));
    return fd;
}

/* A stranger's flood: n connections begun to at and left there (never a byte), into fds. */
static void flood(const struct sockaddr_in *at, int *fds, int n) {
    int i;
    for (i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fds[i] >= 0) (void)connect(fds[i], (const struct sockaddr *)at, sizeof *at);
    }
    sleep_ms(200); /* (the handshakes done: the queue full) */
}

static void close_all(int *fds, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* ---------------------------------------------------------------------------------------------
   fsdp__recovery_gone: a survivor's listener asked after a reset from it
   --------------------------------------------------------------------------------------------- */
static void test_recovery_gone_of_a_live_listener_a_stranger_flooded_is_false(void) {
    struct sockaddr_in at;
    int fds[FLOOD], listener = loopback_listener(&at), probe;
    flood(&at, fds, FLOOD);
    probe = fsdp__sock_dial(&at, fsdp__now_ms() + 300, 1);
    if (probe >= 0) close(probe);
    TEST_ASSERT_TRUE_MESSAGE(probe < 0, "the flood did not fill the listener's queue: the test proves nothing here");
    TEST_ASSERT_FALSE(fsdp__recovery_gone(&at, fsdp__now_ms() + 300));
    close_all(fds, FLOOD);
    close(listener);
}

static void test_recovery_gone_of_a_port_that_refuses_is_true(void) {
    struct sockaddr_in at;
    close(loopback_listener(&at));
    TEST_ASSERT_TRUE(fsdp__recovery_gone(&at, fsdp__now_ms() + 2000));
}

/* ---------------------------------------------------------------------------------------------
   fsdp__recovery_ask: a verdict MACed by the world's key, with wrong numbers
   --------------------------------------------------------------------------------------------- */
typedef struct fake_leader {
    int listen_fd;
    int training;                   /* 1: its first connection is taken for a joiner's (challenged, closed) */
    fsdp__recovery_verdict verdict; /* what it answers (MACed by the thread with the world's key) */
} fake_leader;

/* The rendezvous played: one survivor's view read, the verdict sent. */
static void *fake_leader_answer(void *arg) {
    fake_leader *l = (fake_leader *)arg;
    fsdp__recovery_msg view;
    struct pollfd pfd = {l->listen_fd, POLLIN, 0};
    int fd = poll(&pfd, 1, 8000) == 1 ? accept(l->listen_fd, NULL, NULL) : -1;
    if (fd >= 0 && l->training) { /* (as rank 0 before its commit point: challenged, then closed as it recovers) */
        fsdp__join_challenge c;
        memset(&c, 0, sizeof c);
        c.magic = FSDP__JOIN_MAGIC;
        fsdp__sock_io_full(fd, &c, sizeof c, fsdp__now_ms() + 3000, 1);
        sleep_ms(100);
        close(fd);
        fd = poll(&pfd, 1, 8000) == 1 ? accept(l->listen_fd, NULL, NULL) : -1;
    }
    if (fd < 0) return NULL;
    fsdp__recovery_mac(me.comm->key, &l->verdict, offsetof(fsdp__recovery_verdict, mac), l->verdict.mac);
    if (fsdp__sock_io_full(fd, &view, sizeof view, fsdp__now_ms() + 3000, 0) == 0)
        fsdp__sock_io_full(fd, &l->verdict, sizeof l->verdict, fsdp__now_ms() + 3000, 1);
    close(fd);
    return NULL;
}

/* A verdict to go on with replicas 0 and 1 at a port: one a survivor takes. */
static void good_verdict(fsdp__recovery_verdict *v) {
    memset(v, 0, sizeof *v);
    v->magic = FSDP__RECOVERY_MAGIC;
    v->epoch = 1, v->count = 2, v->port = 40000;
    v->replicas[0] = 0, v->replicas[1] = 1;
    copy_text(v->why, sizeof v->why, "recovery: epoch 1: replicas {0, 1} of {0, 1, 2}");
}

/* Rank 2 (replica 1) asks a played rendezvous (rank 0) that answers *verdict: fsdp__recovery_ask's
   result (0: taken). */
static int ask_with(const fsdp__recovery_verdict *verdict, int training) {
    fake_leader leader;
    fsdp__recovery_msg mine;
    fsdp__recovery_verdict got;
    pthread_t thread;
    int rc;
    fake_rank_open(2, 2);
    leader.listen_fd = loopback_listener(&me.ctx->recovery->addr[0]);
    leader.verdict = *verdict;
    leader.training = training;
    TEST_ASSERT_EQUAL_INT(0, pthread_create(&thread, NULL, fake_leader_answer, &leader));
    fsdp__recovery_view_of(me.ctx, &mine);
    rc = fsdp__recovery_ask(me.ctx, 0, 0, &mine, &got);
    pthread_join(thread, NULL);
    close(leader.listen_fd);
    fake_rank_close();
    return rc;
}

static void test_recovery_ask_takes_a_verdict_within_the_job(void) {
    fsdp__recovery_verdict v;
    good_verdict(&v);
    TEST_ASSERT_EQUAL_INT(0, ask_with(&v, 0));
}

/* A survivor that saw the loss first asks rank 0 while it still trains: rank 0 reads its listener
   before its commit point and takes the survivor for a joiner (a challenge, then the connection
   closed as it recovers). Taken for lost there, the survivor asked the next replica instead and
   the survivors split into minorities. */
static void test_recovery_ask_of_a_rendezvous_still_training_asks_again_and_takes_its_verdict(void) {
    fsdp__recovery_verdict v;
    good_verdict(&v);
    TEST_ASSERT_EQUAL_INT(0, ask_with(&v, 1));
}

static void test_recovery_ask_with_a_verdict_naming_a_replica_past_the_job_refuses_it(void) {
    fsdp__recovery_verdict v;
    good_verdict(&v);
    v.replicas[1] = 1000; /* (it would index the survivor's reach and listeners' addresses) */
    TEST_ASSERT_EQUAL_INT(-1, ask_with(&v, 0));
}

static void test_recovery_ask_with_a_verdict_naming_a_replica_twice_refuses_it(void) {
    fsdp__recovery_verdict v;
    good_verdict(&v);
    v.replicas[1] = 0;
    TEST_ASSERT_EQUAL_INT(-1, ask_with(&v, 0));
}

static void test_recovery_ask_with_a_verdict_whose_reason_does_not_end_refuses_it(void) {
    fsdp__recovery_verdict v;
    good_verdict(&v);
    memset(v.why, 'x', sizeof v.why); /* (printed with %s when the partition stops) */
    TEST_ASSERT_EQUAL_INT(-1, ask_with(&v, 0));
}

/* ---------------------------------------------------------------------------------------------
   fsdp__rejoin_ready: the rendezvous hears joiners
   --------------------------------------------------------------------------------------------- */
/* A joiner at position p played: connected to the rendezvous's listener, challenged by it
   (fsdp__rejoin_ready run until then), its hello sent MACed with the job's join key. Its fd. */
static int joiner_says_hello(int position) {
    fsdp__recovery *rec = me.ctx->recovery;
    fsdp__join_challenge c;
    fsdp__join_hello h;
    int fd = fsdp__sock_connect(&rec->addr[0], fsdp__now_ms() + 2000), tries;
    TEST_ASSERT_TRUE(fd >= 0);
    for (tries = 0; tries < 100; tries++) {
        struct pollfd pfd = {fd, POLLIN, 0};
        fsdp__rejoin_ready(me.ctx);
        if (poll(&pfd, 1, 10) > 0) break;
    }
    TEST_ASSERT_EQUAL_INT(0, fsdp__sock_io_full(fd, &c, sizeof c, fsdp__now_ms() + 1000, 0));
    memset(&h, 0, sizeof h);
    h.magic = FSDP__JOIN_MAGIC, h.position = position, h.group = GROUP;
    memcpy(h.challenge, c.challenge, sizeof h.challenge);
    fsdp__recovery_mac(rec->join_key, &h, offsetof(fsdp__join_hello, mac), h.mac);
    TEST_ASSERT_EQUAL_INT(0, fsdp__sock_io_full(fd, &h, sizeof h, fsdp__now_ms() + 1000, 1));
    sleep_ms(20);
    return fd;
}

static void test_rejoin_ready_with_a_hello_for_every_position_admits(void) {
    int first, second;
    fake_rank_open(0, 2);
    first = joiner_says_hello(0);
    second = joiner_says_hello(1);
    TEST_ASSERT_EQUAL_INT(1, fsdp__rejoin_ready(me.ctx));
    close(first);
    close(second);
    fake_rank_close();
}

/* A joiner heard, then gone (it gave up waiting for the other position, or died): admitting it
   with the other would hold the survivors 2 detect_ms + 5 s making a world it never comes to. */
static void test_rejoin_ready_with_a_joiner_gone_since_its_hello_does_not_admit(void) {
    int first, second;
    fake_rank_open(0, 2);
    first = joiner_says_hello(0);
    close(first);
    second = joiner_says_hello(1);
    TEST_ASSERT_EQUAL_INT(0, fsdp__rejoin_ready(me.ctx));
    TEST_ASSERT_EQUAL_INT(-1, me.ctx->recovery->join_fds[0]);
    close(second);
    fake_rank_close();
}

/* A stranger that queues connections faster than the rendezvous hears (FSDP__JOIN_PENDING of them
   a step): the connections it accepts at the next commit point give way at the oldest held, which
   is the joiner's, unless the hellos come so far are heard first. */
static void test_rejoin_ready_with_a_flood_after_a_hello_keeps_the_joiner(void) {
    struct pollfd pfd;
    int fds[FSDP__JOIN_PENDING + 4], joiner, second;
    fake_rank_open(0, 2);
    joiner = joiner_says_hello(0);
    flood(&me.ctx->recovery->addr[0], fds, FSDP__JOIN_PENDING + 4);
    fsdp__rejoin_ready(me.ctx);
    TEST_ASSERT_TRUE(me.ctx->recovery->join_fds[0] >= 0);
    pfd.fd = joiner, pfd.events = POLLIN, pfd.revents = 0;
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, poll(&pfd, 1, 0), "the joiner's connection was closed");
    close_all(fds, FSDP__JOIN_PENDING + 4);
    second = joiner_says_hello(1);
    TEST_ASSERT_EQUAL_INT(1, fsdp__rejoin_ready(me.ctx));
    close(joiner);
    close(second);
    fake_rank_close();
}

/* ---------------------------------------------------------------------------------------------
   fsdp__rejoin_find: the joiner looks for the rendezvous among its peers
   --------------------------------------------------------------------------------------------- */
typedef struct fake_rendezvous {
    int listen_fd;
    unsigned char join_key[32];
} fake_rendezvous;

/* The rendezvous played: a connection challenged, its hello read, an admit (replica 2 of 3
   appended to {0, 1}) MACed with the join key and echoing the hello's nonce. */
static void *fake_rendezvous_admit(void *arg) {
    fake_rendezvous *r = (fake_rendezvous *)arg;
    fsdp__join_challenge c;
    fsdp__join_hello h;
    fsdp__join_admit a;
    struct pollfd pfd = {r->listen_fd, POLLIN, 0};
    int fd = poll(&pfd, 1, 8000) == 1 ? accept(r->listen_fd, NULL, NULL) : -1; /* (a joiner that never comes) */
    if (fd < 0) return NULL;
    memset(&c, 0, sizeof c);
    c.magic = FSDP__JOIN_MAGIC;
    memset(c.challenge, 7, sizeof c.challenge);
    memset(&a, 0, sizeof a);
    a.magic = FSDP__JOIN_MAGIC, a.replica = 2, a.count = 3, a.total = 3, a.port = 40000, a.rebuilds = 2;
    a.epoch = 2, a.step = 5, a.replicas[0] = 0, a.replicas[1] = 1, a.replicas[2] = 2;
    if (fsdp__sock_io_full(fd, &c, sizeof c, fsdp__now_ms() + 3000, 1) == 0 &&
        fsdp__sock_io_full(fd, &h, sizeof h, fsdp__now_ms() + 3000, 0) == 0) {
        memcpy(a.nonce, h.nonce, sizeof a.nonce);
        fsdp__recovery_mac(r->join_key, &a, offsetof(fsdp__join_admit, mac), a.mac);
        fsdp__sock_io_full(fd, &a, sizeof a, fsdp__now_ms() + 3000, 1);
    }
    close(fd);
    return NULL;
}

/* After a lower replica rejoined, the rendezvous (world rank 0) is not the first listener of the
   peers list: that one is a survivor's, open and never answering. */
static void test_rejoin_find_with_a_silent_survivor_first_in_the_list_reaches_the_rendezvous(void) {
    fake_rendezvous rendezvous;
    struct sockaddr_in silent, at, found;
    fsdp__join_admit a;
    pthread_t thread;
    char peers[64];
    int silent_fd = loopback_listener(&silent), rc;
    unsigned char key[32];
    fake_rank_open(0, -1); /* (the joiner's context: its host's world) */
    rendezvous.listen_fd = loopback_listener(&at);
    fsdp__comm_key(key, me.comm->key, sizeof me.comm->key, "fsdp.h rejoin key", me.comm->job, 0);
    memcpy(rendezvous.join_key, key, sizeof key);
    snprintf(peers, sizeof peers, "127.0.0.1:%d,127.0.0.1:%d", ntohs(silent.sin_port), ntohs(at.sin_port));
    me.ctx->desc.recovery.peers = peers;
    TEST_ASSERT_EQUAL_INT(0, pthread_create(&thread, NULL, fake_rendezvous_admit, &rendezvous));
    rc = fsdp__rejoin_find(me.ctx, key, &a, &found);
    pthread_join(thread, NULL);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, fsdp__init_error);
    TEST_ASSERT_EQUAL_INT(2, a.replica);
    TEST_ASSERT_EQUAL_INT(ntohs(at.sin_port), ntohs(found.sin_port));
    close(rendezvous.listen_fd);
    close(silent_fd);
    fake_rank_close();
}

static void test_rejoin_find_where_no_peer_listens_fails_at_once_naming_the_list(void) {
    struct sockaddr_in a1, a2;
    fsdp__join_admit a;
    struct sockaddr_in found;
    char peers[64];
    unsigned char key[32];
    double t0;
    int rc;
    close(loopback_listener(&a1));
    close(loopback_listener(&a2));
    fake_rank_open(0, -1);
    memset(key, 3, sizeof key);
    snprintf(peers, sizeof peers, "127.0.0.1:%d,127.0.0.1:%d", ntohs(a1.sin_port), ntohs(a2.sin_port));
    me.ctx->desc.recovery.peers = peers;
    t0 = now_ms();
    rc = fsdp__rejoin_find(me.ctx, key, &a, &found);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_PEER_LOST, rc);
    TEST_ASSERT_TRUE(now_ms() - t0 < 2000);
    assert_says(fsdp__init_error, peers);
    fake_rank_close();
}

void setUp(void) {}
void tearDown(void) {}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_recovery_gone_of_a_live_listener_a_stranger_flooded_is_false);
    RUN_TEST(test_recovery_gone_of_a_port_that_refuses_is_true);
    RUN_TEST(test_recovery_ask_takes_a_verdict_within_the_job);
    RUN_TEST(test_recovery_ask_of_a_rendezvous_still_training_asks_again_and_takes_its_verdict);
    RUN_TEST(test_recovery_ask_with_a_verdict_naming_a_replica_past_the_job_refuses_it);
    RUN_TEST(test_recovery_ask_with_a_verdict_naming_a_replica_twice_refuses_it);
    RUN_TEST(test_recovery_ask_with_a_verdict_whose_reason_does_not_end_refuses_it);
    RUN_TEST(test_rejoin_ready_with_a_hello_for_every_position_admits);
    RUN_TEST(test_rejoin_ready_with_a_joiner_gone_since_its_hello_does_not_admit);
    RUN_TEST(test_rejoin_ready_with_a_flood_after_a_hello_keeps_the_joiner);
    RUN_TEST(test_rejoin_find_with_a_silent_survivor_first_in_the_list_reaches_the_rendezvous);
    RUN_TEST(test_rejoin_find_where_no_peer_listens_fails_at_once_naming_the_list);
    return UNITY_END();
}
