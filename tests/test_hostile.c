/* test_hostile.c - specification of how fsdp.h stands up to hostile peers and unlucky
   machines: strangers and impostors at the socket rendezvous, peers that trickle bytes or
   never greet, hosts that drop connections on the floor, shared-memory segments someone else
   created, peer-written text without a terminator, launchers in host programs that ignore
   SIGCHLD, and sizes that overflow.

   Ranks are forked by this file (or by fsdp_launch_ex); the parent often plays the attacker
   itself, speaking the socket protocol through the library's private functions (this file
   includes the implementation). Children record what happened in a MAP_SHARED region and exit;
   the parent asserts. Every wait is bounded.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_hostile.c \
              tests/unity/unity.c -o /tmp/test_hostile -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* fsdp.h's private test hook: the user holding a connection's far end. A child that sets
   uid_unasked plays a system whose socket table cannot be asked (no sock_diag). */
static int uid_unasked;
#define FSDP__SOCK_PEER_UID(fd) (uid_unasked ? FSDP__UID_UNASKED : fsdp__sock_peer_uid(fd))
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <fcntl.h>
#include <sys/resource.h>

#define MAX_RANKS 4
#define MESSAGE_BYTES 600
#define SECRET "hostile-test-secret-7d1e"
#define JOB "hostile-job-token-93ac"

typedef struct rank_report {
    int done;
    int rc;              /* fsdp_comm_init, then the op under test */
    int elapsed_ms;      /* of that call */
    int kdf_ms;          /* with measure_kdf: this process's stretch of the secret just before it (the part
                            of elapsed_ms that is CPU work, which a loaded or sanitized machine slows) */
    int op_rc;
    int op_elapsed_ms;
    int destroy_ms;
    int fds_before, fds_after;
    float result;
    char message[MESSAGE_BYTES];
    char log[MESSAGE_BYTES];
} rank_report;

static rank_report *shared; /* MAX_RANKS reports, MAP_SHARED before any fork */

/* ---------------------------------------------------------------------------------------------
   helpers
   --------------------------------------------------------------------------------------------- */
/* 1 if the bytes hold the text anywhere (binary-safe). */
static int bytes_contain(const unsigned char *bytes, size_t n, const char *text) {
    size_t k = strlen(text), i;
    for (i = 0; i + k <= n; i++)
        if (memcmp(bytes + i, text, k) == 0) return 1;
    return 0;
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    return a;
}

/* A TCP connection to 127.0.0.1:port, retried for up to limit_ms (rank 0 may not listen yet). */
static int connect_retry(int port, int limit_ms) {
    struct sockaddr_in a = loopback(port);
    double start = now_ms();
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        if (fd >= 0) close(fd);
        if (now_ms() - start > limit_ms) return -1;
        sleep_ms(10);
    }
}

static int open_fd_count(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static char captured[MESSAGE_BYTES];
static void capture_log(void *user, fsdp_log_level level, const char *message) {
    size_t used = strlen(captured);
    (void)user;
    (void)level;
    snprintf(captured + used, sizeof captured - used, "%s%s", used ? " | " : "", message);
}

/* One socket rank, as a test describes it. */
typedef struct rank_plan {
    int rank, world, port, timeout_ms;
    const char *secret, *job, *master_addr;
    size_t count;          /* all_reduce of count floats after init (0: none) */
    int gather_count;      /* instead: one all_gather of this many floats per rank */
    const char *store_key; /* set: master_port is a TCPStore where rank 0 publishes its address */
    int as_uid;            /* > 0: the rank runs as this user (the parent must be root) */
} rank_plan;

static fsdp_comm_desc socket_desc(const rank_plan *plan) {
    fsdp_comm_desc d;
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_SOCKET;
    d.rank = plan->rank;
    d.world_size = plan->world;
    d.master_addr = plan->master_addr ? plan->master_addr : "127.0.0.1";
    d.master_port = plan->port;
    d.timeout_ms = plan->timeout_ms;
    d.secret = plan->secret;
    d.job = plan->job;
    d.store_key = plan->store_key;
    d.logger.fn = capture_log;
    d.logger.max_level = FSDP_LOG_WARN;
    return d;
}

static void job_key(unsigned char key[32], const char *secret, const char *job);

/* Set by a test that bounds how long a rank's init waits: each rank it spawns then times a stretch
   of the secret first (kdf_ms), and the test bounds elapsed_ms - kdf_ms, the waiting, which is
   what a bug would lengthen; the stretch itself (35 ms on an idle machine, 0.5 s under ASan on a
   loaded one) is not. */
static int measure_kdf;

/* elapsed_ms less the stretch of the secret it holds (with measure_kdf). */
static int waited_ms(const rank_report *r) { return r->elapsed_ms - r->kdf_ms; }

/* Child: joins, runs the op of the plan, records everything in shared[rank]. */
static int run_socket_rank(void *arg) {
    const rank_plan *plan = (const rank_plan *)arg;
    rank_report *r = &shared[plan->rank];
    fsdp_comm_desc d = socket_desc(plan);
    fsdp_comm *comm = NULL;
    double start;
    captured[0] = 0;
    if (plan->as_uid > 0 && (setgid((gid_t)plan->as_uid) != 0 || setuid((uid_t)plan->as_uid) != 0)) return 3;
    if (measure_kdf && plan->secret) {
        unsigned char key[32];
        start = now_ms();
        job_key(key, plan->secret, plan->job);
        r->kdf_ms = (int)(now_ms() - start);
    }
    start = now_ms();
    r->rc = fsdp_comm_init(&comm, &d);
    r->elapsed_ms = (int)(now_ms() - start);
    copy_text(r->message, sizeof r->message, fsdp_comm_last_error(comm));
    if (r->rc == FSDP_SUCCESS && (plan->count || plan->gather_count)) {
        size_t n = plan->count ? plan->count : (size_t)plan->gather_count * (size_t)plan->world;
        float *buf = (float *)calloc(n, sizeof(float));
        size_t i;
        for (i = 0; i < n; i++) buf[i] = 1.0f;
        start = now_ms();
        r->op_rc = plan->count ? fsdp_all_reduce(comm, buf, buf, n, FSDP_F32, FSDP_SUM)
                               : fsdp_all_gather(comm, buf, buf, (size_t)plan->gather_count, FSDP_F32);
        r->op_elapsed_ms = (int)(now_ms() - start);
        r->result = buf[0];
        copy_text(r->message, sizeof r->message, fsdp_comm_last_error(comm));
        free(buf);
    }
    start = now_ms();
    fsdp_comm_destroy(comm);
    r->destroy_ms = (int)(now_ms() - start);
    copy_text(r->log, sizeof r->log, captured);
    r->done = 1;
    return 0;
}

static void reset_reports(void) { memset(shared, 0, sizeof *shared * MAX_RANKS); }

/* Forks fn0(arg0) and fn1(arg1) (each killed by SIGALRM after alarm_s if not 0), waits for the
   second then the first, at most limit_ms each, and asserts that both exited with status 0. */
static void run_pair(int (*fn0)(void *), void *arg0, int (*fn1)(void *), void *arg1, unsigned alarm_s, int limit_ms) {
    pid_t p0 = spawn(fn0, arg0, alarm_s), p1 = spawn(fn1, arg1, alarm_s);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, limit_ms));
    TEST_ASSERT_EQUAL_INT(0, reap(p0, limit_ms));
}

/* Ends a helper child (a relay, a store) that serves until it is told to stop. */
static void stop_child(pid_t pid) {
    kill(pid, SIGKILL);
    reap(pid, 2000);
}

/* What the parent needs to speak to rank 0 as rank `rank` of `world` (it knows the secret). */
static void job_key(unsigned char key[32], const char *secret, const char *job) {
    fsdp__comm_key(key, secret ? secret : "", secret ? strlen(secret) : 0, "fsdp.h job key", job, FSDP__KDF_ROUNDS);
}

/* ---------------------------------------------------------------------------------------------
   socket rendezvous: strangers and impostors
   --------------------------------------------------------------------------------------------- */
/* An impostor speaks first-class protocol but cannot produce the mac; it must be refused with
   nothing in the reply but "authentication failed" (neither token nor secret), and the rank it
   claimed stays free for the real rank. */
static void impostor_attempt(int port, const unsigned char key[32], unsigned char *seen, size_t *seen_len,
                             fsdp__sock_reply *reply) {
    fsdp__sock_challenge ch;
    fsdp__sock_hello h;
    int fd = connect_retry(port, 3000);
    size_t got;
    TEST_ASSERT_TRUE_MESSAGE(fd >= 0, "could not reach rank 0");
    got = read_some(fd, &ch, sizeof ch, 2000, NULL);
    TEST_ASSERT_EQUAL_size_t(sizeof ch, got);
    TEST_ASSERT_EQUAL_HEX32(FSDP__SOCK_MAGIC, ch.magic);
    memcpy(seen, &ch, sizeof ch);
    memset(&h, 0, sizeof h);
    h.magic = FSDP__SOCK_MAGIC;
    h.version = FSDP__SOCK_VERSION;
    h.rank = 1;
    h.world = 2;
    fsdp__random_bytes(h.nonce, sizeof h.nonce);
    fsdp__sock_mac(h.mac, key, "fsdp.h hello", ch.nonce, 32, &h, offsetof(fsdp__sock_hello, mac), NULL, 0);
    TEST_ASSERT_EQUAL_INT((int)sizeof h, (int)send(fd, &h, sizeof h, MSG_NOSIGNAL));
    got = read_some(fd, seen + sizeof ch, 4096, 2000, NULL); /* until rank 0 closes */
    *seen_len = sizeof ch + got;
    TEST_ASSERT_EQUAL_size_t(sizeof *reply, got);
    memcpy(reply, seen + sizeof ch, sizeof *reply);
    close(fd);
}

static void test_impostor_without_the_secret_is_refused_and_learns_neither_token_nor_secret(void) {
    rank_plan r0 = {0, 2, 0, 8000, SECRET, JOB, NULL, 4, 0, NULL, 0}, r1;
    unsigned char guessed_key[32], seen[8192];
    size_t seen_len = 0;
    fsdp__sock_reply reply;
    pid_t p0, p1;
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    reset_reports();
    p0 = spawn(run_socket_rank, &r0, 0);
    /* a guesser who knows the job token (it was sent in clear before) but not the secret */
    job_key(guessed_key, NULL, JOB);
    impostor_attempt(r0.port, guessed_key, seen, &seen_len, &reply);
    TEST_ASSERT_NOT_EQUAL(0, reply.status);
    TEST_ASSERT_TRUE_MESSAGE(contains(reply.reason, "authentication failed"), reply.reason);
    TEST_ASSERT_FALSE_MESSAGE(bytes_contain(seen, seen_len, JOB), "a reply carried the job token");
    TEST_ASSERT_FALSE_MESSAGE(bytes_contain(seen, seen_len, SECRET), "a reply carried the secret");
    /* one who guesses a secret too */
    job_key(guessed_key, "guess", JOB);
    impostor_attempt(r0.port, guessed_key, seen, &seen_len, &reply);
    TEST_ASSERT_TRUE_MESSAGE(contains(reply.reason, "authentication failed"), reply.reason);
    TEST_ASSERT_FALSE(bytes_contain(seen, seen_len, JOB));
    TEST_ASSERT_FALSE(bytes_contain(seen, seen_len, SECRET));
    /* the real rank 1 still gets its rank, and the job works */
    p1 = spawn(run_socket_rank, &r1, 0);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 15000));
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 15000));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, shared[0].op_rc);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[0].result);
    TEST_ASSERT_FALSE_MESSAGE(contains(shared[0].log, JOB), shared[0].log);
}

static void test_rank_with_another_secret_is_refused_saying_the_secrets_differ(void) {
    rank_plan r0 = {0, 2, 0, 1500, SECRET, JOB, NULL, 0, 0, NULL, 0}, r1;
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    r1.secret = "another-secret";
    reset_reports();
    run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 0, 8000);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_REJECTED, shared[1].rc);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "authentication failed"), shared[1].message);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "FSDP_SECRET"), shared[1].message);
    TEST_ASSERT_FALSE(contains(shared[1].message, SECRET));
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_TIMEOUT, shared[0].rc);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].message, "refused 1 connection"), shared[0].message);
}

/* A hello that is right in every field, its mac made under the job's real key, but for the last
   byte of the mac: the forger of a mac gets no credit for a right prefix, so rank 0 must compare
   all 32 bytes. It is refused as unauthentic (no mac on the reply) and rank 1 stays free. */
static void test_hello_whose_mac_is_wrong_only_in_its_last_byte_is_refused(void) {
    rank_plan r0 = {0, 2, 0, 8000, SECRET, JOB, NULL, 4, 0, NULL, 0}, r1;
    unsigned char key[32], zero[32];
    fsdp__sock_challenge ch;
    fsdp__sock_hello h;
    fsdp__sock_reply reply;
    size_t got_challenge = 0, got_reply = 0;
    int fd;
    pid_t p0, p1;
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    reset_reports();
    job_key(key, SECRET, JOB);
    memset(&reply, 0, sizeof reply);
    p0 = spawn(run_socket_rank, &r0, 20);
    if ((fd = connect_retry(r0.port, 3000)) >= 0) {
        got_challenge = read_some(fd, &ch, sizeof ch, 2000, NULL);
        memset(&h, 0, sizeof h); /* as fsdp__sock_greet fills it for rank 1 of 2 */
        h.magic = FSDP__SOCK_MAGIC;
        h.version = FSDP__SOCK_VERSION;
        h.rank = 1;
        h.world = 2;
        h.dial_ip = htonl(INADDR_LOOPBACK);
        h.dial_port = (uint32_t)r0.port;
        fsdp__random_bytes(h.nonce, sizeof h.nonce);
        fsdp__sock_mac(h.mac, key, "fsdp.h hello", ch.nonce, 32, &h, offsetof(fsdp__sock_hello, mac), NULL, 0);
        h.mac[31] ^= 1;
        if (got_challenge == sizeof ch && send(fd, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h)
            got_reply = read_some(fd, &reply, sizeof reply, 3000, NULL);
        close(fd);
    }
    p1 = spawn(run_socket_rank, &r1, 20); /* the real rank 1, whatever happened to the forgery */
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 15000));
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 15000));
    TEST_ASSERT_TRUE_MESSAGE(fd >= 0, "could not reach rank 0");
    TEST_ASSERT_EQUAL_size_t(sizeof ch, got_challenge);
    TEST_ASSERT_EQUAL_size_t(sizeof reply, got_reply);
    TEST_ASSERT_NOT_EQUAL(0, reply.status);
    TEST_ASSERT_TRUE_MESSAGE(contains(reply.reason, "authentication failed"), reply.reason);
    memset(zero, 0, sizeof zero);
    TEST_ASSERT_EQUAL_MEMORY_MESSAGE(zero, reply.mac, 32, "the reply to an unauthentic hello carries a mac");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].op_rc, shared[0].message);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[0].result);
}

/* 16 silent and 16 garbage-sending connections are open at rank 0 before the honest ranks
   start: they must join in normal time, not after the strangers' budgets run out. */
static void test_idle_and_garbage_connections_do_not_delay_the_rendezvous(void) {
    rank_plan plan[4];
    pid_t pids[4];
    int strangers[32], r, i, slowest = 0;
    unsigned char garbage[100];
    memset(plan, 0, sizeof plan);
    plan[0].port = pick_free_port();
    reset_reports();
    for (r = 0; r < 4; r++) {
        plan[r].rank = r;
        plan[r].world = 4;
        plan[r].port = plan[0].port;
        plan[r].timeout_ms = 20000;
        plan[r].secret = SECRET;
        plan[r].job = JOB;
        plan[r].count = 16;
    }
    measure_kdf = 1;
    pids[0] = spawn(run_socket_rank, &plan[0], 0);
    for (i = 0; i < 256; i++) garbage[i % 100] = (unsigned char)(i * 37 + 11);
    for (i = 0; i < 32; i++) {
        strangers[i] = connect_retry(plan[0].port, 3000);
        TEST_ASSERT_TRUE(strangers[i] >= 0);
        if (i % 2) send(strangers[i], garbage, sizeof garbage, MSG_NOSIGNAL);
    }
    for (r = 1; r < 4; r++) pids[r] = spawn(run_socket_rank, &plan[r], 0);
    for (r = 0; r < 4; r++) TEST_ASSERT_EQUAL_INT(0, reap(pids[r], 25000));
    for (i = 0; i < 32; i++) close(strangers[i]);
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[r].rc, shared[r].message);
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, shared[r].op_rc);
        TEST_ASSERT_EQUAL_FLOAT(4.0f, shared[r].result);
        if (r > 0 && waited_ms(&shared[r]) > slowest) slowest = waited_ms(&shared[r]);
    }
    TEST_ASSERT_TRUE_MESSAGE(slowest < 3000, "the honest ranks waited for the strangers"); /* a stranger's budget: 5 s */
}

/* A local process flooding a port (the next test's): non-blocking connects as fast as it can,
   each left silent, at most 64 open (the oldest closed for the next), until *stop, 30 s or
   100000 attempts. At the lowest CPU priority: the test is about rank 0's accept queue and the
   hellos behind it, which the flood fills whenever the ranks wait; eight flooders at full
   priority on 2 cores under ASan also starved the ranks' own CPU work past their timeout. */
static volatile int *flood_stop;

static int flood_port(void *arg) {
    struct sockaddr_in a = loopback(*(const int *)arg);
    int open_fds[64], at = 0, i;
    long attempts;
    double until = now_ms() + 30000;
    setpriority(PRIO_PROCESS, 0, 19);
    for (i = 0; i < 64; i++) open_fds[i] = -1;
    for (attempts = 0; !*flood_stop && attempts < 100000 && now_ms() < until; attempts++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0 || (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS)) {
            if (fd >= 0) close(fd);
            sleep_ms(1);
            continue;
        }
        if (open_fds[at] >= 0) close(open_fds[at]);
        open_fds[at] = fd;
        at = (at + 1) % 64;
    }
    while (!*flood_stop && now_ms() < until) sleep_ms(5); /* hold the last ones open */
    return 0;
}

/* Issue 35: one local process flooding rank 0's port with silent connections slowed a 4-rank
   rendezvous from 0.11 s to 3.2 s; eight kept the ranks out for a minute and more: rank 0
   drained its accept queue and never read the hellos that came meanwhile, pushing them out for
   newer connections, and the SYNs of ranks that found the queue full waited for the kernel's
   retransmissions (1, 3, 7, 15, 31 s). With eight flooders the ranks join within their timeout. */
static void test_eight_processes_flooding_rank_0_with_connections_do_not_keep_the_ranks_out(void) {
    rank_plan plan[4];
    pid_t pids[4], flooders[8];
    int r, i;
    flood_stop = (volatile int *)map_shared(sizeof *flood_stop);
    memset(plan, 0, sizeof plan);
    plan[0].port = pick_free_port();
    reset_reports();
    for (r = 0; r < 4; r++) {
        plan[r].rank = r;
        plan[r].world = 4;
        plan[r].port = plan[0].port;
        plan[r].timeout_ms = 20000;
        plan[r].secret = SECRET;
        plan[r].job = JOB;
        plan[r].count = 16;
    }
    pids[0] = spawn(run_socket_rank, &plan[0], 40);
    close(connect_retry(plan[0].port, 3000)); /* rank 0 listens */
    for (i = 0; i < 8; i++) flooders[i] = spawn(flood_port, &plan[0].port, 40);
    sleep_ms(300); /* the flood is on */
    for (r = 1; r < 4; r++) pids[r] = spawn(run_socket_rank, &plan[r], 40);
    for (r = 0; r < 4; r++) reap(pids[r], 30000);
    *flood_stop = 1;
    for (i = 0; i < 8; i++) TEST_ASSERT_EQUAL_INT(0, reap(flooders[i], 5000));
    munmap((void *)flood_stop, sizeof *flood_stop);
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[r].rc, shared[r].message);
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, shared[r].op_rc);
        TEST_ASSERT_EQUAL_FLOAT(4.0f, shared[r].result);
    }
}

/* The rendezvous survives running out of descriptors: strangers hold rank 0's last ones and
   more wait behind them, its accept fails with EMFILE, and rank 1 still gets in at once (the
   strangers waiting longest make room), not after their budgets end (5 s each, while rank 1
   waits 5 s for its greeting). */
static int run_rank0_with_few_descriptors(void *arg) {
    struct rlimit lim;
    int open = open_fd_count();
    lim.rlim_cur = lim.rlim_max = (rlim_t)(open + 5); /* listener + challenge sockets for a few */
    setrlimit(RLIMIT_NOFILE, &lim);
    return run_socket_rank(arg);
}

static void test_accept_failing_for_lack_of_descriptors_does_not_end_the_rendezvous(void) {
    rank_plan r0 = {0, 2, 0, 15000, SECRET, JOB, NULL, 4, 0, NULL, 0}, r1;
    int strangers[16], i;
    pid_t p0, p1;
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    reset_reports();
    measure_kdf = 1;
    p0 = spawn(run_rank0_with_few_descriptors, &r0, 0);
    for (i = 0; i < 16; i++) strangers[i] = connect_retry(r0.port, 3000);
    sleep_ms(200);
    p1 = spawn(run_socket_rank, &r1, 0);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 20000));
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 20000));
    for (i = 0; i < 16; i++)
        if (strangers[i] >= 0) close(strangers[i]);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[1].result);
    TEST_ASSERT_TRUE_MESSAGE(waited_ms(&shared[1]) < 3000, "rank 1 waited for the strangers' budgets"); /* 5 s each */
}

/* Issue 27, item 1: a socket world holds a descriptor per other rank; a soft RLIMIT_NOFILE below
   that is raised where the hard limit allows, and a hard limit below it fails init at once,
   naming the limit and the number needed (rank 0 alone here: it waits 300 ms for the others
   where the limit is raised, and 5 s where it fails, so that failing at once shows). */
typedef struct fd_limit_plan {
    int extra_soft, extra_hard; /* limits: the descriptors open now plus these */
    int timeout_ms;             /* rank 0's wait for the others */
} fd_limit_plan;

static int init_with_fd_limits(void *arg) {
    const fd_limit_plan *plan = (const fd_limit_plan *)arg;
    rank_report *r = &shared[0];
    rank_plan rp = {0, 200, 0, 0, NULL, JOB, NULL, 0, 0, NULL, 0}; /* no secret: no key to stretch (slow under ASan) */
    fsdp_comm_desc d;
    fsdp_comm *comm = NULL;
    struct rlimit lim;
    int open = open_fd_count();
    double start;
    rp.port = pick_free_port();
    rp.timeout_ms = plan->timeout_ms;
    d = socket_desc(&rp);
    lim.rlim_cur = (rlim_t)(open + plan->extra_soft);
    lim.rlim_max = (rlim_t)(open + plan->extra_hard);
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return 3;
    start = now_ms();
    r->rc = fsdp_comm_init(&comm, &d);
    r->elapsed_ms = (int)(now_ms() - start);
    copy_text(r->message, sizeof r->message, fsdp_comm_last_error(NULL));
    fsdp_comm_destroy(comm);
    getrlimit(RLIMIT_NOFILE, &lim);
    r->fds_before = open;
    r->fds_after = (int)lim.rlim_cur;
    r->done = 1;
    return 0;
}

static void test_descriptor_limit_is_raised_for_a_large_world_or_init_fails_naming_it(void) {
    fd_limit_plan raise = {10, 1000, 300}, hard = {10, 10, 5000};
    pid_t p;
    reset_reports();
    p = spawn(init_with_fd_limits, &raise, 10);
    TEST_ASSERT_EQUAL_INT(0, reap(p, 10000));
    TEST_ASSERT_TRUE(shared[0].done);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, shared[0].rc, shared[0].message); /* nobody else came */
    TEST_ASSERT_TRUE_MESSAGE(shared[0].fds_after >= shared[0].fds_before + 200, "the soft limit was not raised");
    reset_reports();
    p = spawn(init_with_fd_limits, &hard, 10);
    TEST_ASSERT_EQUAL_INT(0, reap(p, 10000));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_SYSTEM, shared[0].rc, shared[0].message);
    TEST_ASSERT_TRUE_MESSAGE(shared[0].elapsed_ms < 2500, "it waited instead of failing at once"); /* waiting: 5 s */
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].message, "RLIMIT_NOFILE") && contains(shared[0].message, "200 ranks needs"),
                             shared[0].message);
}

/* Without a secret, a rank 0 reachable from other hosts says so once, naming the port. */
static void test_rank0_without_a_secret_off_loopback_warns_naming_the_open_port(void) {
    rank_plan r0 = {0, 2, 0, 5000, NULL, JOB, "0.0.0.0", 4, 0, NULL, 0}, r1;
    char port_text[16];
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    r1.master_addr = "127.0.0.1";
    reset_reports();
    run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 0, 10000);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    snprintf(port_text, sizeof port_text, ":%d", r0.port);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].log, "no secret") && contains(shared[0].log, port_text), shared[0].log);
    /* with a secret: no warning */
    r0.port = r1.port = pick_free_port();
    r0.secret = r1.secret = SECRET;
    reset_reports();
    run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 0, 10000);
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, shared[0].rc);
    TEST_ASSERT_FALSE_MESSAGE(contains(shared[0].log, "no secret"), shared[0].log);
}

/* Without a secret, on a system whose socket table cannot be asked, every communicator says once
   that the peers' users go unchecked: a process that runs two jobs one after the other (or
   holds two communicators) hears it for each, not for the first only. */
typedef struct two_jobs {
    rank_plan job[2];
} two_jobs;

/* Child: the rank of job 0, then of job 1; job 0's report moves to shared[2 + rank]. */
static int run_socket_rank_in_two_jobs(void *arg) {
    const two_jobs *t = (const two_jobs *)arg;
    int rank = t->job[0].rank;
    uid_unasked = 1;
    run_socket_rank((void *)&t->job[0]);
    shared[2 + rank] = shared[rank];
    memset(&shared[rank], 0, sizeof shared[rank]);
    run_socket_rank((void *)&t->job[1]);
    return 0;
}

static void test_socket_without_sock_diag_warns_once_per_communicator_not_once_per_process(void) {
    two_jobs t0, t1;
    int r, j, warned[2] = {0, 0};
    rank_plan p = {0, 2, 0, 5000, NULL, JOB, NULL, 4, 0, NULL, 0};
    t0.job[0] = t0.job[1] = p;
    t0.job[0].port = pick_free_port();
    t0.job[1].port = pick_free_port();
    t0.job[1].job = "hostile-job-token-second";
    t1 = t0;
    t1.job[0].rank = t1.job[1].rank = 1;
    reset_reports();
    run_pair(run_socket_rank_in_two_jobs, &t0, run_socket_rank_in_two_jobs, &t1, 0, 20000);
    for (j = 0; j < 2; j++)
        for (r = 0; r < 2; r++) {
            const rank_report *rep = &shared[j == 0 ? 2 + r : r];
            TEST_ASSERT_TRUE_MESSAGE(rep->done, "a rank did not report");
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rep->rc, rep->message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rep->op_rc, rep->message);
            warned[j] += contains(rep->log, "does not say which user holds a connection");
        }
    TEST_ASSERT_TRUE_MESSAGE(warned[0] > 0, shared[2].log);
    TEST_ASSERT_EQUAL_INT_MESSAGE(warned[0], warned[1], "the second job's ranks said less than the first's");
}

/* ---------------------------------------------------------------------------------------------
   issue 26: relays, the store, other local users
   --------------------------------------------------------------------------------------------- */
/* A relay between two ranks: accepts on listen_fd, connects each connection on to `to` and
   copies bytes both ways, unchanged, until either side closes (at most limit_ms). A child. */
typedef struct relay_plan {
    int listen_fd, to_port, limit_ms;
} relay_plan;

static int run_relay(void *arg) {
    const relay_plan *plan = (const relay_plan *)arg;
    struct pollfd p[3];
    int pairs[8][2], n = 0, i, k;
    double until = now_ms() + plan->limit_ms;
    while (now_ms() < until) {
        p[0].fd = plan->listen_fd;
        p[0].events = POLLIN;
        p[0].revents = 0;
        if (poll(p, 1, 0) > 0 && n < 8) {
            pairs[n][0] = accept(plan->listen_fd, NULL, NULL);
            pairs[n][1] = connect_retry(plan->to_port, 2000);
            if (pairs[n][0] >= 0 && pairs[n][1] >= 0) n++;
        }
        for (i = 0; i < n; i++) {
            for (k = 0; k < 2; k++) {
                p[k].fd = pairs[i][k];
                p[k].events = POLLIN;
                p[k].revents = 0;
            }
            if (pairs[i][0] < 0 || poll(p, 2, 5) <= 0) continue;
            for (k = 0; k < 2; k++)
                if (p[k].revents) {
                    char buf[65536];
                    ssize_t got = recv(pairs[i][k], buf, sizeof buf, 0);
                    if (got <= 0 || send(pairs[i][1 - k], buf, (size_t)got, MSG_NOSIGNAL) != got) {
                        close(pairs[i][0]);
                        close(pairs[i][1]);
                        pairs[i][0] = pairs[i][1] = -1;
                        break;
                    }
                }
        }
        sleep_ms(1);
    }
    return 0;
}

static int listen_on_loopback(int *port) {
    struct sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

/* Issue 26, defect 1 (the handshake part): a stranger without the secret gets rank 1 to dial
   it (under torchrun's agent store it wrote its own address there) and relays both ends of
   the handshake unchanged to the real rank 0. Before the fix both sides authenticated and the
   stranger sat in the middle of the job's stream. Now a hello says which address its sender
   dialled, under the mac, and rank 0 refuses one that arrived elsewhere. */
static void test_handshake_relayed_by_a_stranger_is_refused_by_rank_0(void) {
    rank_plan r0 = {0, 2, 0, 3000, SECRET, JOB, NULL, 4, 0, NULL, 0}, r1;
    relay_plan relay;
    pid_t pr;
    r0.port = pick_free_port();
    relay.listen_fd = listen_on_loopback(&relay.to_port);
    TEST_ASSERT_TRUE(relay.listen_fd >= 0);
    r1 = r0;
    r1.rank = 1;
    r1.port = relay.to_port; /* rank 1 dials the relay ... */
    relay.to_port = r0.port; /* ... which dials rank 0 */
    relay.limit_ms = 6000;
    reset_reports();
    pr = spawn(run_relay, &relay, 10);
    close(relay.listen_fd);
    run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 0, 10000);
    stop_child(pr);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_REJECTED, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "relays"), shared[1].message);
    TEST_ASSERT_NOT_EQUAL(FSDP_SUCCESS, shared[0].rc);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].message, "relays"), shared[0].message);
}

/* A TCPStore of torch 1.13's wire format (see >>socket in fsdp.h), as a child: SET, GET,
   CHECK, WAIT and DELETE of a few keys, one thread per client. With plant set it is the
   attacker's: every value SET is replaced, before anyone reads it, by plant followed by what
   came after the first space of the original (so a mac rank 0 attached stays, now attached to
   another address). */
typedef struct store_plan {
    int listen_fd, limit_ms;
    const char *plant;
} store_plan;

static struct {
    pthread_mutex_t lock;
    char keys[8][256], values[8][256];
    int n;
    const char *plant;
} store;

static int store_read(int fd, void *buf, size_t n) { return read_some(fd, buf, n, 15000, NULL) == n ? 0 : -1; }

static int store_string(int fd, char *out, size_t cap) {
    unsigned char len8[8];
    uint64_t len = 0;
    int i;
    if (store_read(fd, len8, 8) != 0) return -1;
    for (i = 7; i >= 0; i--) len = len << 8 | len8[i];
    if (len >= cap || store_read(fd, out, (size_t)len) != 0) return -1;
    out[len] = 0;
    return 0;
}

static int store_find(const char *key) {
    int i;
    for (i = 0; i < store.n; i++)
        if (strcmp(store.keys[i], key) == 0) return i;
    return -1;
}

static void *store_client(void *arg) {
    int fd = (int)(intptr_t)arg;
    for (;;) {
        unsigned char type, count8[8], reply[8];
        char key[256], value[256];
        int i, at;
        if (store_read(fd, &type, 1) != 0) break;
        if (type == 0x00) { /* SET key value */
            if (store_string(fd, key, sizeof key) != 0 || store_string(fd, value, sizeof value) != 0) break;
            pthread_mutex_lock(&store.lock);
            if ((at = store_find(key)) < 0 && store.n < 8) at = store.n++;
            if (at >= 0) {
                const char *rest = strchr(value, ' ');
                copy_text(store.keys[at], sizeof store.keys[at], key);
                if (store.plant) snprintf(store.values[at], sizeof store.values[at], "%s%s", store.plant, rest ? rest : "");
                else copy_text(store.values[at], sizeof store.values[at], value);
            }
            pthread_mutex_unlock(&store.lock);
        } else if (type == 0x04 || type == 0x05) { /* CHECK / WAIT count keys */
            uint64_t count = 0;
            int all = 1;
            if (store_read(fd, count8, 8) != 0) break;
            for (i = 7; i >= 0; i--) count = count << 8 | count8[i];
            if (count > 4) break;
            for (i = 0; i < (int)count; i++) {
                if (store_string(fd, key, sizeof key) != 0) goto out;
                for (;;) {
                    pthread_mutex_lock(&store.lock);
                    at = store_find(key);
                    pthread_mutex_unlock(&store.lock);
                    if (at >= 0 || type == 0x04) break;
                    sleep_ms(5);
                }
                if (at < 0) all = 0;
            }
            reply[0] = all ? 0 : 1;
            if (send(fd, reply, 1, MSG_NOSIGNAL) != 1) break;
        } else if (type == 0x02) { /* GET key */
            uint64_t len;
            if (store_string(fd, key, sizeof key) != 0) break;
            pthread_mutex_lock(&store.lock);
            at = store_find(key);
            copy_text(value, sizeof value, at >= 0 ? store.values[at] : "");
            pthread_mutex_unlock(&store.lock);
            len = strlen(value);
            for (i = 0; i < 8; i++) reply[i] = (unsigned char)(len >> (8 * i));
            if (send(fd, reply, 8, MSG_NOSIGNAL) != 8 || send(fd, value, (size_t)len, MSG_NOSIGNAL) != (ssize_t)len) break;
        } else if (type == 0x08) { /* DELETE key */
            if (store_string(fd, key, sizeof key) != 0) break;
            memset(reply, 0, sizeof reply);
            if (send(fd, reply, 8, MSG_NOSIGNAL) != 8) break;
        } else {
            break;
        }
    }
out:
    close(fd);
    return NULL;
}

static int run_store(void *arg) {
    const store_plan *plan = (const store_plan *)arg;
    double until = now_ms() + plan->limit_ms;
    pthread_mutex_init(&store.lock, NULL);
    store.plant = plan->plant;
    while (now_ms() < until) {
        struct pollfd p;
        p.fd = plan->listen_fd;
        p.events = POLLIN;
        p.revents = 0;
        if (poll(&p, 1, 50) > 0) {
            pthread_t t;
            int fd = accept(plan->listen_fd, NULL, NULL);
            if (fd >= 0 && pthread_create(&t, NULL, store_client, (void *)(intptr_t)fd) == 0) pthread_detach(t);
        }
    }
    return 0;
}

/* Issue 26, defect 1 (the store part): under torchrun's agent store rank 0 publishes where it
   listens, and the store has no authentication. A stranger who replaces the entry with its own
   address made rank 1 dial it. The entry now carries a mac under the job's key: rank 1 refuses
   the planted address (it keeps rank 0's mac, which does not fit), naming the key. The same
   store without the attacker works. */
static void test_address_planted_in_torchruns_store_is_refused(void) {
    rank_plan r0 = {0, 2, 0, 4000, SECRET, JOB, NULL, 4, 0, "/fsdp.h/rank0/hostile/0", 0}, r1;
    store_plan sp;
    char plant[64];
    int attempt;
    for (attempt = 0; attempt < 2; attempt++) {
        pid_t ps;
        sp.listen_fd = listen_on_loopback(&r0.port);
        TEST_ASSERT_TRUE(sp.listen_fd >= 0);
        sp.limit_ms = 40000; /* (stopped by the test; a bound for a test that fails on the way) */
        snprintf(plant, sizeof plant, "127.0.0.1:%d", pick_free_port()); /* where nothing listens */
        sp.plant = attempt == 0 ? plant : NULL;
        r0.timeout_ms = attempt == 0 ? 4000 : 20000; /* (with the plant rank 0 waits it out: nobody comes) */
        r1 = r0;
        r1.rank = 1;
        reset_reports();
        ps = spawn(run_store, &sp, 45);
        close(sp.listen_fd);
        run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 0, 30000);
        stop_child(ps);
        if (attempt == 0) {
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_REJECTED, shared[1].rc, shared[1].message);
            TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "is not rank 0's") &&
                                     contains(shared[1].message, r0.store_key), shared[1].message);
            TEST_ASSERT_NOT_EQUAL(FSDP_SUCCESS, shared[0].rc);
        } else {
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
            TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[1].result);
        }
    }
}

/* A hello as rank 1 of 2 of a job without a secret (whose key anyone can compute) that answers
   rank 0's challenge ch at 127.0.0.1:port: valid in every field. */
static void valid_hello_as_rank_1(fsdp__sock_hello *h, const fsdp__sock_challenge *ch, const char *job, int port) {
    unsigned char key[32];
    job_key(key, NULL, job);
    memset(h, 0, sizeof *h);
    h->magic = FSDP__SOCK_MAGIC;
    h->version = FSDP__SOCK_VERSION;
    h->rank = 1;
    h->world = 2;
    h->dial_ip = htonl(INADDR_LOOPBACK);
    h->dial_port = (uint32_t)port;
    fsdp__random_bytes(h->nonce, sizeof h->nonce);
    fsdp__sock_mac(h->mac, key, "fsdp.h hello", ch->nonce, 32, h, offsetof(fsdp__sock_hello, mac), NULL, 0);
}

/* The attacker of the next test: a process of uid 65534 that speaks the protocol as rank 1
   of a job without a secret and reports rank 0's reply. */
static int run_other_user_as_rank_1(void *arg) {
    const rank_plan *plan = (const rank_plan *)arg;
    rank_report *r = &shared[1];
    fsdp__sock_challenge ch;
    fsdp__sock_hello h;
    fsdp__sock_reply reply;
    int fd;
    if (setgid(65534) != 0 || setuid(65534) != 0) return 3;
    if ((fd = connect_retry(plan->port, 3000)) < 0) return 4;
    if (read_some(fd, &ch, sizeof ch, 3000, NULL) != sizeof ch) return 5;
    valid_hello_as_rank_1(&h, &ch, plan->job, plan->port);
    if (send(fd, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h) return 6;
    memset(&reply, 0, sizeof reply);
    read_some(fd, &reply, sizeof reply, 3000, NULL);
    r->rc = (int)reply.status;
    fsdp__printable_n(r->message, sizeof r->message, reply.reason, sizeof reply.reason);
    r->done = 1;
    close(fd);
    return 0;
}

/* Issue 26, defect 2: with no secret the key derives from the job token only, and a job on
   loopback printed nothing: another user of the host joined a root job as rank 1 and read its
   gradients. Now, without a secret, a peer on this host must be a process of the same user
   (the kernel's socket table says whose a connection is), both ways: rank 0 refuses another
   user's hello (naming the uid), and a rank refuses a rank 0 that another user runs. */
static void test_process_of_another_user_cannot_join_a_job_without_a_secret(void) {
    rank_plan r0 = {0, 2, 0, 3000, NULL, JOB, NULL, 4, 0, NULL, 0}, r1;
    pid_t p0, p1;
    if (geteuid() != 0) TEST_IGNORE_MESSAGE("needs root (to run a process as another user)");
    r0.port = pick_free_port();
    reset_reports();
    p0 = spawn(run_socket_rank, &r0, 0);
    p1 = spawn(run_other_user_as_rank_1, &r0, 10);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 10000));
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 10000));
    TEST_ASSERT_TRUE(shared[1].done);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_REJECTED, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "uid 65534"), shared[1].message);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_TIMEOUT, shared[0].rc);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].message, "uid 65534"), shared[0].message);
    /* the other way round: another user's process holds the port as "rank 0" */
    r0.port = pick_free_port();
    r0.as_uid = 65534;
    r1 = r0;
    r1.rank = 1;
    r1.as_uid = 0;
    reset_reports();
    run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 10, 10000);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_REJECTED, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "rank 0 at") && contains(shared[1].message, "uid 65534"),
                             shared[1].message);
    /* a job of one user without a secret still works */
    r0.as_uid = r1.as_uid = 0;
    r0.port = r1.port = pick_free_port();
    reset_reports();
    run_pair(run_socket_rank, &r0, run_socket_rank, &r1, 10, 10000);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[1].result);
}

/* The attacker of the next test: a process (of uid 65534 where the test runs as root) that
   reads rank 0's challenge, says so in shared[2].done, waits for shared[3].done (the parent
   has stopped rank 0 by then), then sends a valid hello as rank 1 and resets the connection
   at once (SO_LINGER 0): rank 0, resumed, finds the hello and the reset together. */
static int run_rank_1_that_resets_after_its_hello(void *arg) {
    const rank_plan *plan = (const rank_plan *)arg;
    struct linger reset = {1, 0};
    fsdp__sock_challenge ch;
    fsdp__sock_hello h;
    double until;
    int fd;
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) return 3;
    if ((fd = connect_retry(plan->port, 3000)) < 0) return 4;
    if (read_some(fd, &ch, sizeof ch, 3000, NULL) != sizeof ch) return 5;
    valid_hello_as_rank_1(&h, &ch, plan->job, plan->port);
    shared[2].done = 1;
    for (until = now_ms() + 5000; !shared[3].done && now_ms() < until;) sleep_ms(1);
    if (send(fd, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h) return 6;
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(fd);
    return 0;
}

/* Issue 35, finding 2: without a secret, a stranger's valid hello followed by an immediate reset
   left the kernel nothing to say whose the connection was (getpeername fails), and rank 0
   admitted it as rank 1 with a warning; the real rank 1 was then refused as already joined. A
   connection whose owner cannot be named is refused now, and the honest ranks form the world. */
static void test_hello_followed_by_a_reset_is_refused_and_the_honest_rank_joins(void) {
    rank_plan r0 = {0, 2, 0, 10000, NULL, JOB, NULL, 4, 0, NULL, 0}, r1;
    pid_t p0, attacker, p1;
    double until;
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    reset_reports();
    p0 = spawn(run_socket_rank, &r0, 20);
    attacker = spawn(run_rank_1_that_resets_after_its_hello, &r0, 10);
    for (until = now_ms() + 5000; !shared[2].done && now_ms() < until;) sleep_ms(1);
    TEST_ASSERT_TRUE_MESSAGE(shared[2].done, "the attacker got no challenge");
    kill(p0, SIGSTOP);
    shared[3].done = 1;
    TEST_ASSERT_EQUAL_INT(0, reap(attacker, 5000));
    sleep_ms(50); /* the reset is in */
    kill(p0, SIGCONT);
    p1 = spawn(run_socket_rank, &r1, 20);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 15000));
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 15000));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[0].result);
    TEST_ASSERT_EQUAL_FLOAT(2.0f, shared[1].result);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].log, "cannot be told to be a process of this user"), shared[0].log);
}

/* Issue 26, defect 9: FSDP_SECRET stayed in the environment after init, so every process the
   program started later inherited it. fsdp_comm_init_from_env now takes it out (bytes wiped,
   variable removed); the job still gets the secret (a second rank that is given it joins). */
static int init_from_env_and_report(void *arg) {
    rank_report *r = &shared[0];
    fsdp_comm *comm = NULL;
    char err[512] = "";
    (void)arg;
    setenv("FSDP_SECRET", "env-secret-3141", 1);
    setenv("FSDP_BACKEND", "shm", 1);
    setenv("FSDP_JOB", "env-secret-job", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("RANK", "0", 1);
    unsetenv("FSDP_SECRET_FILE");
    r->rc = fsdp_comm_init_from_env(&comm, NULL, err, sizeof err);
    copy_text(r->message, sizeof r->message, err);
    r->result = getenv("FSDP_SECRET") ? 1.0f : 0.0f;
    r->op_rc = system("test -z \"$FSDP_SECRET\"") == 0 ? 0 : 1; /* what a child sees */
    fsdp_comm_destroy(comm);
    r->done = 1;
    return 0;
}

static void test_secret_from_the_environment_is_not_passed_on_to_child_processes(void) {
    pid_t p;
    reset_reports();
    p = spawn(init_from_env_and_report, NULL, 10);
    TEST_ASSERT_EQUAL_INT(0, reap(p, 10000));
    TEST_ASSERT_TRUE(shared[0].done);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_FLOAT_MESSAGE(0.0f, shared[0].result, "FSDP_SECRET is still in the environment");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, shared[0].op_rc, "a child process saw FSDP_SECRET");
}

/* The parent plays rank 0 (it knows the secret) for a real rank 1 of 2 and welcomes it with a
   table whose mac is right but which numbers rank 1's host 5 (hosts are numbered in order of
   their lowest rank: 0 or 1 only), then with a right table whose mac is wrong: rank 1 must refuse
   both, saying why, instead of indexing by what rank 0 said. */
static void welcome_rank1_with(uint32_t host_of_1, int break_mac, rank_plan *r1) {
    struct sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    unsigned char key[32], nonces[64], digest[32], mac[32], session[16];
    uint32_t table[3 * 2 + 1];
    fsdp__sock_challenge challenge;
    fsdp__sock_hello hello;
    fsdp__sock_reply reply;
    int listener = socket(AF_INET, SOCK_STREAM, 0), fd;
    pid_t p1;
    TEST_ASSERT_EQUAL_INT(0, bind(listener, (struct sockaddr *)&a, sizeof a));
    TEST_ASSERT_EQUAL_INT(0, listen(listener, 8));
    getsockname(listener, (struct sockaddr *)&a, &len);
    r1->port = ntohs(a.sin_port);
    job_key(key, SECRET, JOB);
    reset_reports();
    p1 = spawn(run_socket_rank, r1, 20);
    fd = accept(listener, NULL, NULL);
    TEST_ASSERT_TRUE(fd >= 0);
    memset(&challenge, 0, sizeof challenge);
    challenge.magic = FSDP__SOCK_MAGIC;
    challenge.version = FSDP__SOCK_VERSION;
    memset(challenge.nonce, 7, sizeof challenge.nonce);
    TEST_ASSERT_EQUAL_INT((int)sizeof challenge, (int)send(fd, &challenge, sizeof challenge, MSG_NOSIGNAL));
    TEST_ASSERT_EQUAL_size_t(sizeof hello, read_some(fd, &hello, sizeof hello, 5000, NULL));
    memset(session, 9, sizeof session);
    fsdp__sock_make_reply(&reply, key, &hello, &challenge, 0, "welcome", session, 1);
    table[0] = table[1] = htonl(INADDR_LOOPBACK); /* ips */
    table[2] = table[3] = 1;                      /* ports */
    table[4] = 0;                                 /* hosts */
    table[5] = host_of_1;
    table[6] = 0;                                 /* flags */
    memcpy(nonces, hello.nonce, 32);
    memcpy(nonces + 32, challenge.nonce, 32);
    fsdp__sock_table_digest(digest, table, 2);
    fsdp__sock_mac(mac, key, "fsdp.h table", nonces, 64, digest, sizeof digest, NULL, 0);
    mac[0] ^= (unsigned char)break_mac;
    TEST_ASSERT_EQUAL_INT((int)sizeof reply, (int)send(fd, &reply, sizeof reply, MSG_NOSIGNAL));
    TEST_ASSERT_EQUAL_INT((int)sizeof table, (int)send(fd, table, sizeof table, MSG_NOSIGNAL));
    TEST_ASSERT_EQUAL_INT((int)sizeof mac, (int)send(fd, mac, sizeof mac, MSG_NOSIGNAL));
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 15000));
    close(fd);
    close(listener);
    TEST_ASSERT_TRUE(shared[1].done);
}

static void test_rendezvous_table_with_hosts_out_of_order_or_a_bad_mac_is_refused(void) {
    rank_plan r1 = {1, 2, 0, 10000, SECRET, JOB, NULL, 0, 0, NULL, 0};
    welcome_rank1_with(5, 0, &r1);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PROTOCOL, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "host 5, out of order"), shared[1].message);
    welcome_rank1_with(1, 1, &r1);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PROTOCOL, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "address table from rank 0") &&
                                 contains(shared[1].message, "failed its check"), shared[1].message);
}

/* ---------------------------------------------------------------------------------------------
   deadlines
   --------------------------------------------------------------------------------------------- */
/* The parent joins as rank 1 (it knows the secret), then sends its all_gather data one byte
   per 50 ms: the op on rank 0 must fail at its 1.5 s deadline (the old per-byte timer never
   fired), and fsdp_comm_destroy must return at once. */
static void test_peer_trickling_bytes_fails_the_op_within_its_total_deadline(void) {
    rank_plan r0 = {0, 2, 0, 1500, SECRET, JOB, NULL, 0, 1 << 16, NULL, 0};
    unsigned char key[32], mine[64], table_mac[32];
    fsdp__sock_hello hello;
    fsdp__sock_reply reply;
    fsdp__sock_header header;
    fsdp_coll c;
    uint32_t table[3 * 2 + 1]; /* rank 0's table: ips, ports, hosts, flags */
    char err[512];
    double start;
    int fd, i;
    pid_t p0;
    r0.port = pick_free_port();
    reset_reports();
    p0 = spawn(run_socket_rank, &r0, 0);
    job_key(key, SECRET, JOB);
    fd = connect_retry(r0.port, 3000);
    TEST_ASSERT_TRUE(fd >= 0);
    memset(&hello, 0, sizeof hello);
    hello.rank = 1;
    hello.world = 2;
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, fsdp__sock_greet(NULL, fd, key, &hello, fsdp__now_ms() + 5000, &reply, mine, "rank 0", err,
                                                      sizeof err), err);
    TEST_ASSERT_EQUAL_size_t(sizeof table + sizeof table_mac,
                             read_some(fd, table, sizeof table, 2000, NULL) +
                                 read_some(fd, table_mac, sizeof table_mac, 2000, NULL));
    memset(&c, 0, sizeof c);
    c.kind = FSDP_COLL_ALL_GATHER;
    c.dtype = FSDP_F32;
    c.count = (size_t)r0.gather_count;
    c.seq = 1; /* (the hosts were learned in the rendezvous: the first op is the test's) */
    memset(&header, 0, sizeof header);
    header.magic = FSDP__SOCK_MAGIC;
    header.fp = fsdp__fingerprint_of(&c);
    header.payload = c.count * 4;
    TEST_ASSERT_EQUAL_INT((int)sizeof header, (int)send(fd, &header, sizeof header, MSG_NOSIGNAL));
    start = now_ms();
    for (i = 0; i < 200 && now_ms() - start < 6000; i++) { /* stops when rank 0 hangs up */
        unsigned char byte = 1;
        if (send(fd, &byte, 1, MSG_NOSIGNAL) != 1) break;
        sleep_ms(50);
    }
    close(fd);
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 10000));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, shared[0].op_rc, shared[0].message);
    /* (a deadline per byte would hold the op until the trickle ends, at 6 s) */
    TEST_ASSERT_TRUE(shared[0].op_elapsed_ms >= 1400 && shared[0].op_elapsed_ms < 4000);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].message, "rank 1"), shared[0].message);
    TEST_ASSERT_TRUE(shared[0].destroy_ms < 1000);
}

/* Sends one phase of rank 1's part of a 2-rank all_reduce: header and payload (ones). */
static int send_phase(int fd, const fsdp_coll *c, uint32_t phase, size_t bytes) {
    fsdp__sock_header header;
    float *payload = (float *)malloc(bytes);
    size_t i, sent = 0;
    if (!payload) return -1;
    for (i = 0; i < bytes / 4; i++) payload[i] = 1.0f;
    memset(&header, 0, sizeof header);
    header.magic = FSDP__SOCK_MAGIC;
    header.phase = phase;
    header.fp = fsdp__fingerprint_of(c);
    header.payload = bytes;
    if (send(fd, &header, sizeof header, MSG_NOSIGNAL) != (ssize_t)sizeof header) sent = bytes + 1;
    while (sent < bytes) {
        ssize_t n = send(fd, (char *)payload + sent, bytes - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += (size_t)n;
    }
    free(payload);
    return sent == bytes ? 0 : -1;
}

/* The parent joins as rank 1 of a 2-rank all_reduce of 512 KiB, which runs in two phases, and
   answers each phase 1.4 s after the one before: every phase on time for a 2 s bound, the op as
   a whole not. Rank 0's op must fail at its total deadline of 2 s, not count it from the last
   byte that arrived or from the start of the phase (then it would succeed at 2.8 s). */
static void test_peer_answering_each_phase_in_time_fails_the_op_at_its_total_deadline(void) {
    rank_plan r0 = {0, 2, 0, 2000, SECRET, JOB, NULL, (size_t)1 << 17, 0, NULL, 0};
    size_t half = ((size_t)1 << 17) / 2 * sizeof(float);
    unsigned char key[32], mine[64], table_mac[32], sink[65536];
    uint32_t table[3 * 2 + 1];
    fsdp__sock_hello hello;
    fsdp__sock_reply reply;
    fsdp_coll c;
    char err[512];
    double start;
    int fd, greeted = -1, sent = -1;
    pid_t p0;
    r0.port = pick_free_port();
    reset_reports();
    p0 = spawn(run_socket_rank, &r0, 30);
    job_key(key, SECRET, JOB);
    if ((fd = connect_retry(r0.port, 3000)) >= 0) {
        memset(&hello, 0, sizeof hello);
        hello.rank = 1;
        hello.world = 2;
        greeted = fsdp__sock_greet(NULL, fd, key, &hello, fsdp__now_ms() + 5000, &reply, mine, "rank 0", err, sizeof err);
        if (greeted == 0 && read_some(fd, table, sizeof table, 2000, NULL) +
                                    read_some(fd, table_mac, sizeof table_mac, 2000, NULL) !=
                                sizeof table + sizeof table_mac)
            greeted = -1;
    }
    if (greeted == 0) { /* rank 0 starts its op now */
        memset(&c, 0, sizeof c);
        c.kind = FSDP_COLL_ALL_REDUCE;
        c.dtype = FSDP_F32;
        c.op = FSDP_SUM;
        c.count = r0.count;
        c.seq = 1;
        start = now_ms();
        sleep_ms(1400);
        sent = send_phase(fd, &c, 0, half); /* rank 0's half to fold (its own half sits in our buffer) */
        while (now_ms() - start < 2800)
            if (read_some(fd, sink, sizeof sink, 50, NULL) == 0) sleep_ms(10);
        (void)send_phase(fd, &c, 1, half); /* our folded half, too late (rank 0 may have hung up) */
        while (now_ms() - start < 6000 && read_some(fd, sink, sizeof sink, 100, NULL) > 0) /* until rank 0 hangs up */
            continue;
    }
    if (fd >= 0) close(fd);
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 15000));
    TEST_ASSERT_TRUE_MESSAGE(fd >= 0, "could not reach rank 0");
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, greeted, err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, sent, "rank 0 did not take the first phase's data");
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, shared[0].op_rc, shared[0].message);
    snprintf(err, sizeof err, "the op failed after %d ms: %.400s", shared[0].op_elapsed_ms, shared[0].message);
    /* (a deadline per phase would fail it at 3.4 s; one from the last byte would let it succeed at 2.8 s) */
    TEST_ASSERT_TRUE_MESSAGE(shared[0].op_elapsed_ms >= 1900 && shared[0].op_elapsed_ms < 3200, err);
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[0].message, "rank 1") && contains(shared[0].message, "all_reduce"),
                             shared[0].message);
}

/* A master whose accept queue is full drops SYNs: connecting must fail at the deadline, not
   after the kernel's two minutes of retries. */
static void test_connect_to_a_full_accept_queue_fails_within_the_deadline(void) {
    struct sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    rank_plan r1 = {1, 2, 0, 1500, SECRET, JOB, NULL, 0, 0, NULL, 0};
    int listener = socket(AF_INET, SOCK_STREAM, 0), queued[16], n = 0, i;
    pid_t p1;
    TEST_ASSERT_EQUAL_INT(0, bind(listener, (struct sockaddr *)&a, sizeof a));
    TEST_ASSERT_EQUAL_INT(0, listen(listener, 0));
    getsockname(listener, (struct sockaddr *)&a, &len);
    for (i = 0; i < 16; i++) { /* fill the queue: stop at the first connection that cannot complete */
        struct pollfd p;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(fd, (struct sockaddr *)&a, sizeof a);
        p.fd = fd;
        p.events = POLLOUT;
        p.revents = 0;
        queued[n++] = fd;
        if (poll(&p, 1, 200) == 0) break;
    }
    TEST_ASSERT_TRUE_MESSAGE(i < 16, "the accept queue never filled");
    r1.port = ntohs(a.sin_port);
    reset_reports();
    measure_kdf = 1;
    p1 = spawn(run_socket_rank, &r1, 0);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 10000));
    for (i = 0; i < n; i++) close(queued[i]);
    close(listener);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE(waited_ms(&shared[1]) < 1500 + 1000); /* the kernel's retries: minutes */
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "127.0.0.1"), shared[1].message);
}

/* Something else holds MASTER_PORT (a TCPStore, a web server): a rank says so within seconds
   (FSDP__SOCK_GREET_TRIES connections of FSDP__SOCK_GREETING_MS each), naming the address,
   instead of waiting out its ten-minute timeout. */
static void test_service_that_accepts_but_never_greets_fails_within_seconds_naming_it(void) {
    struct sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    rank_plan r1 = {1, 2, 0, 60000, SECRET, JOB, NULL, 0, 0, NULL, 0};
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    char where[32];
    pid_t p1;
    TEST_ASSERT_EQUAL_INT(0, bind(listener, (struct sockaddr *)&a, sizeof a));
    TEST_ASSERT_EQUAL_INT(0, listen(listener, 8)); /* the kernel completes connections; nobody talks */
    getsockname(listener, (struct sockaddr *)&a, &len);
    r1.port = ntohs(a.sin_port);
    reset_reports();
    measure_kdf = 1;
    p1 = spawn(run_socket_rank, &r1, 0);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 25000));
    close(listener);
    snprintf(where, sizeof where, "127.0.0.1:%d", r1.port);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE(waited_ms(&shared[1]) < FSDP__SOCK_GREET_TRIES * FSDP__SOCK_GREETING_MS + 2000); /* the timeout: 60 s */
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, where) && contains(shared[1].message, "greeting"),
                             shared[1].message);
}

static int serve_http_once(void *arg) {
    int listener = *(int *)arg, fd;
    static const char answer[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    fd = accept(listener, NULL, NULL);
    if (fd >= 0) {
        send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL);
        sleep_ms(3000);
        close(fd);
    }
    return 0;
}

static void test_service_that_speaks_another_protocol_fails_at_once_naming_it(void) {
    struct sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    rank_plan r1 = {1, 2, 0, 60000, SECRET, JOB, NULL, 0, 0, NULL, 0};
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    pid_t server, p1;
    TEST_ASSERT_EQUAL_INT(0, bind(listener, (struct sockaddr *)&a, sizeof a));
    TEST_ASSERT_EQUAL_INT(0, listen(listener, 8));
    getsockname(listener, (struct sockaddr *)&a, &len);
    r1.port = ntohs(a.sin_port);
    server = spawn(serve_http_once, &listener, 0);
    reset_reports();
    measure_kdf = 1;
    p1 = spawn(run_socket_rank, &r1, 0);
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 10000));
    reap(server, 5000);
    close(listener);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PROTOCOL, shared[1].rc, shared[1].message);
    TEST_ASSERT_TRUE(waited_ms(&shared[1]) < 1000); /* the greeting's budget: 5 s */
    TEST_ASSERT_TRUE_MESSAGE(contains(shared[1].message, "not an fsdp.h rank"), shared[1].message);
}

/* ---------------------------------------------------------------------------------------------
   the comm thread: a wait that gives up
   --------------------------------------------------------------------------------------------- */
/* A user backend for a world of 2 whose second rank is simulated (it holds what rank 0
   holds). From op number hang_at on, an op ignores its timeout: it keeps writing into its
   output until abort is called, then writes once more 100 ms later and fails. If a wait gave
   up and returned while such an op ran, that last write would land in freed memory (ASan). */
typedef struct stuck_backend {
    int ops, hang_at;
    volatile int aborted;
    double late_write_ms, returned_ms;
} stuck_backend;

static int stuck_hang(stuck_backend *b, void *recv, size_t bytes) {
    while (!b->aborted) {
        if (recv && bytes) memset(recv, 0x5a, bytes);
        sleep_ms(10);
    }
    sleep_ms(100);
    if (recv && bytes) memset(recv, 0x5b, bytes);
    b->late_write_ms = now_ms();
    return FSDP_ERR_ABORTED;
}

static int stuck_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    stuck_backend *b = (stuck_backend *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    (void)comm;
    if (++b->ops >= b->hang_at) return stuck_hang(b, c->recv, bytes * 2);
    memmove((char *)c->recv, c->send, bytes);
    memmove((char *)c->recv + bytes, c->recv, bytes);
    return 0;
}

static int stuck_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c, size_t offset) {
    stuck_backend *b = (stuck_backend *)impl;
    const void *srcs[2];
    (void)comm;
    if (++b->ops >= b->hang_at) return stuck_hang(b, c->recv, c->count * fsdp_dtype_size(c->dtype));
    srcs[0] = srcs[1] = (const char *)c->send + offset;
    fsdp_reduce_ranks(c->recv, srcs, 2, c->count, c->dtype, c->op, 2);
    return 0;
}
static int stuck_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) { return stuck_reduce(comm, impl, c, 0); }
static int stuck_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) { return stuck_reduce(comm, impl, c, 0); }
static int stuck_noop(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    stuck_backend *b = (stuck_backend *)impl;
    (void)comm;
    if (++b->ops >= b->hang_at) return stuck_hang(b, NULL, 0);
    (void)c;
    return 0;
}
static void stuck_abort(fsdp_comm *comm, void *impl) {
    (void)comm;
    ((stuck_backend *)impl)->aborted = 1;
}

static void test_wait_that_gives_up_aborts_and_returns_only_after_the_comm_thread_lets_go(void) {
    static const fsdp_backend table = {"stuck", stuck_all_gather, stuck_reduce_scatter, stuck_all_reduce, stuck_noop,
                                       stuck_noop, stuck_abort, NULL, 0, NULL, NULL};
    stuck_backend b;
    fsdp_comm_desc cd;
    fsdp_comm *comm = NULL;
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    int64_t shape[1] = {1000};
    fsdp_init_rule init = {FSDP_INIT_CONSTANT, 1.0f, 0.0f, NULL, NULL};
    char path[128];
    double start;
    int rc;
    memset(&b, 0, sizeof b);
    b.hang_at = 1 << 30;
    memset(&cd, 0, sizeof cd);
    cd.backend = FSDP_BACKEND_USER;
    cd.world_size = 2;
    cd.timeout_ms = 100;
    cd.user_backend = &table;
    cd.user_impl = &b;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_comm_init(&comm, &cd));
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, fsdp_model_create(&m, "Net"));
    TEST_ASSERT_TRUE(fsdp_model_param(m, 0, "w", 1, shape, init) >= 0);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_init(&ctx, m, &d), fsdp_last_error(NULL));
    b.hang_at = b.ops + 1; /* the save's first collective never ends by itself */
    snprintf(path, sizeof path, "/tmp/fsdp-hostile-%d.safetensors", (int)getpid());
    start = now_ms();
    rc = fsdp_save_full(ctx, path, NULL);
    b.returned_ms = now_ms();
    TEST_ASSERT_NOT_EQUAL(FSDP_SUCCESS, rc);
    TEST_ASSERT_TRUE_MESSAGE(b.returned_ms - start < 6000, "the wait did not give up");
    TEST_ASSERT_TRUE_MESSAGE(b.late_write_ms != 0 && b.late_write_ms <= b.returned_ms,
                             "fsdp_save_full returned while the comm thread still wrote into its buffer");
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_TIMEOUT, fsdp_comm_status(comm));
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    fsdp_comm_destroy(comm);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------------
   shared memory
   --------------------------------------------------------------------------------------------- */
/* The name rank 0 of a shm job would create. */
static void segment_name(char *out, size_t size, const char *job, const char *secret) {
    fsdp_comm_desc d;
    fsdp_comm *probe;
    memset(&d, 0, sizeof d);
    d.world_size = 2;
    d.job = job;
    d.secret = secret;
    probe = fsdp__comm_new(&d, NULL);
    fsdp__shm_name(out, size, probe);
    fsdp_comm_destroy(probe);
}

static int shm_rank(int rank, const char *job, fsdp_comm **out, char *message, size_t size) {
    fsdp_comm_desc d;
    int rc;
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_SHM;
    d.rank = rank;
    d.world_size = 2;
    d.job = job;
    d.secret = SECRET;
    d.timeout_ms = 1000;
    rc = fsdp_comm_init(out, &d);
    copy_text(message, size, fsdp_comm_last_error(NULL));
    return rc;
}

static void test_segment_someone_else_made_is_refused_by_the_joining_rank(void) {
    char name[64], job[48], message[MESSAGE_BYTES], path[96];
    fsdp_comm *comm = NULL;
    int fd, rc;
    snprintf(job, sizeof job, "squat-%d", (int)getpid());
    segment_name(name, sizeof name, job, SECRET);
    TEST_ASSERT_TRUE(contains(name, "/fsdp-squat-"));
    TEST_ASSERT_TRUE(strlen(name) > strlen("/fsdp-") + strlen(job) + 20); /* a digest of the uid and job in the name */
    snprintf(path, sizeof path, "/dev/shm%s", name);
    /* a world-writable segment, as a squatter would leave it */
    fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0666);
    TEST_ASSERT_TRUE(fd >= 0);
    fchmod(fd, 0666);
    TEST_ASSERT_EQUAL_INT(0, ftruncate(fd, 64 << 20));
    close(fd);
    rc = shm_rank(1, job, &comm, message, sizeof message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_REJECTED, rc, message);
    TEST_ASSERT_NULL(comm);
    TEST_ASSERT_TRUE_MESSAGE(contains(message, name) && contains(message, "0666"), message);
    /* rank 0 will not take it over either */
    rc = shm_rank(0, job, &comm, message, sizeof message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_STATE, rc, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(message, "FSDP_JOB"), message);
    if (geteuid() == 0) { /* the right mode but another user's */
        TEST_ASSERT_EQUAL_INT(0, chmod(path, 0600));
        TEST_ASSERT_EQUAL_INT(0, chown(path, 65534, 65534));
        rc = shm_rank(1, job, &comm, message, sizeof message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_REJECTED, rc, message);
        TEST_ASSERT_TRUE_MESSAGE(contains(message, "uid 65534"), message);
    }
    unlink(path);
}

/* Issue 26, defect 3: a segment's name (listed in /dev/shm for every local user while ranks
   join) held 96 bits of HMAC(key, ""), so a weak secret could be recovered offline by testing
   guesses against it. Now the name is the same whatever the secret (the job token and the
   user's uid tell jobs apart), and holds no digest of the key. */
static void test_segment_names_say_nothing_about_the_secret(void) {
    char a[64], b[64], c[64], none[64], hex[65];
    unsigned char key[32], mac[32];
    segment_name(a, sizeof a, "same-job", "dragon");
    segment_name(b, sizeof b, "same-job", "secret-two");
    segment_name(none, sizeof none, "same-job", NULL);
    segment_name(c, sizeof c, "other-job", "dragon");
    TEST_ASSERT_EQUAL_STRING(a, b);
    TEST_ASSERT_EQUAL_STRING(a, none);
    TEST_ASSERT_TRUE(strcmp(a, c) != 0);
    job_key(key, "dragon", "same-job");
    fsdp__hmac_sha256(mac, key, sizeof key, 0, NULL, NULL);
    fsdp__hex(hex, mac, 12);
    TEST_ASSERT_FALSE_MESSAGE(contains(a, hex), a);
}

/* Issue 26, item 3: the job's key stretches the secret with PBKDF2-HMAC-SHA256 (RFC 8018),
   so that a guess checked against a captured handshake costs tens of milliseconds. The
   function matches the published vectors for "password"/"salt" (the same as Python's
   hashlib.pbkdf2_hmac gives), and deriving a job's key
   takes FSDP__KDF_ROUNDS rounds, at least 5 ms on any machine this runs on. */
static void test_job_key_is_pbkdf2_of_the_secret_and_costs_milliseconds(void) {
    static const struct { unsigned rounds; const char *hex; } vectors[] = {
        {1, "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b"},
        {2, "ae4d0c95af6b46d32d0adff928f06dd02a303f8ef3c251dfd6e2d85a95474c43"},
        {4096, "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a"},
    };
    unsigned char out[32], key[32], direct[32], salt[64];
    char hex[65];
    size_t i, label = strlen("fsdp.h job key") + 1;
    double start;
    for (i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        fsdp__pbkdf2_sha256(out, "password", 8, "salt", 4, vectors[i].rounds);
        fsdp__hex(hex, out, 32);
        TEST_ASSERT_EQUAL_STRING(vectors[i].hex, hex);
    }
    TEST_ASSERT_TRUE(FSDP__KDF_ROUNDS >= 10000u);
    start = now_ms();
    job_key(key, "dragon", "some-job");
    TEST_ASSERT_TRUE_MESSAGE(now_ms() - start >= 5.0, "deriving a job's key took under 5 ms: not stretched");
    memcpy(salt, "fsdp.h job key", label);
    memcpy(salt + label, "some-job", 8);
    fsdp__pbkdf2_sha256(direct, "dragon", 6, salt, label + 8, FSDP__KDF_ROUNDS);
    TEST_ASSERT_EQUAL_MEMORY(direct, key, 32);
}

/* A peer's abort message without a terminator, full of escape sequences: read bounded, shown
   printable (ASan reports an overread). */
static void test_unterminated_abort_message_from_a_peer_is_read_bounded_and_printable(void) {
    size_t ranks_at, data_at, total = fsdp__shm_layout(2, 4096, &ranks_at, &data_at);
    char *seg = (char *)calloc(1, total);
    fsdp__shm s;
    fsdp_comm_desc d;
    fsdp_comm *comm;
    const char *message;
    size_t i;
    TEST_ASSERT_NOT_NULL(seg);
    memset(&d, 0, sizeof d);
    d.world_size = 2;
    comm = fsdp__comm_new(&d, NULL);
    memset(&s, 0, sizeof s);
    s.header = (fsdp__shm_header *)seg;
    s.ranks = (fsdp__shm_rank *)(seg + ranks_at);
    s.header->abort_rank = 1;
    s.header->abort_code = FSDP_ERR_ABORTED;
    memset(s.header->abort_message, 'A', sizeof s.header->abort_message);
    memcpy(s.header->abort_message, "\x1b]0;owned\x07\x1b[2J", 14);
    s.header->abort_flag = 1;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_ABORTED, fsdp__shm_adopt_abort(comm, &s));
    message = fsdp_comm_last_error(comm);
    TEST_ASSERT_TRUE(strlen(message) < FSDP__ERRMSG);
    for (i = 0; message[i]; i++) TEST_ASSERT_TRUE(message[i] >= 0x20 && message[i] < 0x7f);
    TEST_ASSERT_TRUE(contains(message, "rank 1 failed first"));
    fsdp_comm_destroy(comm);
    free(seg);
}

/* ---------------------------------------------------------------------------------------------
   sizes
   --------------------------------------------------------------------------------------------- */
static void test_huge_shm_slot_bytes_are_refused_at_init(void) {
    static const size_t sizes[3] = {(size_t)-1, (size_t)1 << 62, ((size_t)1 << 30) + 1};
    fsdp_launch_desc ld;
    int i;
    for (i = 0; i < 3; i++) {
        fsdp_comm_desc d;
        fsdp_comm *comm = NULL;
        double start = now_ms();
        memset(&d, 0, sizeof d);
        d.backend = FSDP_BACKEND_SHM;
        d.world_size = 2;
        d.job = "huge-slots";
        d.shm_slot_bytes = sizes[i];
        d.timeout_ms = 2000;
        TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_comm_init(&comm, &d));
        TEST_ASSERT_TRUE(now_ms() - start < 100);
        TEST_ASSERT_TRUE_MESSAGE(contains(fsdp_comm_last_error(NULL), "shm_slot_bytes"), fsdp_comm_last_error(NULL));
    }
    memset(&ld, 0, sizeof ld);
    ld.nprocs = 2;
    ld.shm_slot_bytes = (size_t)1 << 62;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_launch_ex(&ld, NULL, NULL, NULL));
}

/* Issue 26, defect 7: reductions divide a staging slot among the ranks in 64-byte pieces; with
   4 KiB slots and 65 or more ranks a piece was 0 bytes, and reduce_scatter spun until its
   timeout, then blamed an innocent rank. Such a setting is now refused at once, naming
   shm_slot_bytes and the least that works, by fsdp_comm_init and by fsdp_launch before it
   forks; the least that works is accepted. */
/* Each rank reduce-scatters 4 floats per rank of ones; 0 if every element is P. */
static int reduce_scatter_ones(fsdp_comm *comm, void *arg) {
    int P = fsdp_comm_size(comm), i, bad = 0;
    float *in = (float *)malloc(sizeof(float) * 4 * (size_t)P), out[4];
    (void)arg;
    if (!in) return 2;
    for (i = 0; i < 4 * P; i++) in[i] = 1.0f;
    if (fsdp_reduce_scatter(comm, in, out, 4, FSDP_F32, FSDP_SUM) != 0) bad = 1;
    for (i = 0; i < 4; i++)
        if (out[i] != (float)P) bad = 1;
    free(in);
    return bad;
}

static int never_run(fsdp_comm *comm, void *arg) {
    (void)comm;
    (void)arg;
    return 1;
}

static void test_shm_slot_too_small_for_the_ranks_is_refused_at_init(void) {
    fsdp_launch_desc ld;
    fsdp_launch_status status;
    fsdp_comm_desc d;
    fsdp_comm *comm = NULL;
    double start = now_ms();
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_SHM;
    d.world_size = 65;
    d.job = "tiny-slots";
    d.shm_slot_bytes = 4096;
    d.timeout_ms = 3000;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_INVALID_ARG, fsdp_comm_init(&comm, &d), fsdp_comm_last_error(NULL));
    TEST_ASSERT_TRUE(now_ms() - start < 500);
    TEST_ASSERT_TRUE_MESSAGE(contains(fsdp_comm_last_error(NULL), "shm_slot_bytes to 8192"), fsdp_comm_last_error(NULL));
    d.world_size = 129; /* 8 KiB slots: up to 128 ranks */
    d.shm_slot_bytes = 8192;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_comm_init(&comm, &d));
    memset(&ld, 0, sizeof ld);
    memset(&status, 0, sizeof status);
    ld.nprocs = 65;
    ld.shm_slot_bytes = 4096;
    ld.timeout_ms = 3000;
    start = now_ms();
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_launch_ex(&ld, never_run, NULL, &status));
    TEST_ASSERT_TRUE(now_ms() - start < 500);
    TEST_ASSERT_TRUE_MESSAGE(contains(status.message, "shm_slot_bytes"), status.message);
    /* the least that works: 65 ranks in 8 KiB slots reduce (tiny messages; the run is short, but
       65 processes must start and join on 2 cores, under ASan too: 3 s was not always enough) */
    ld.shm_slot_bytes = 8192;
    ld.nprocs = 65;
    ld.timeout_ms = 60000;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, fsdp_launch_ex(&ld, reduce_scatter_ones, NULL, &status), status.message);
}

static void test_last_error_of_null_tells_why_init_failed(void) {
    fsdp_comm_desc d;
    fsdp_comm *comm = NULL;
    memset(&d, 0, sizeof d);
    d.rank = 5;
    d.world_size = 2;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_comm_init(&comm, &d));
    TEST_ASSERT_TRUE_MESSAGE(contains(fsdp_comm_last_error(NULL), "rank 5"), fsdp_comm_last_error(NULL));
}

/* A 47-character job token (the longest allowed) splits, over sockets, without leaking a
   descriptor. */
static int run_split_rank(void *arg) {
    const rank_plan *plan = (const rank_plan *)arg;
    rank_report *r = &shared[plan->rank];
    fsdp_comm_desc d = socket_desc(plan);
    fsdp_comm *comm = NULL, *sub = NULL;
    float x = 1.0f;
    int k;
    r->rc = fsdp_comm_init(&comm, &d);
    if (r->rc == 0) {
        fsdp_barrier(comm);
        r->fds_before = open_fd_count();
        for (k = 0; k < 3 && r->rc == 0; k++) {
            r->rc = fsdp_comm_split(comm, 0, plan->rank, &sub);
            if (r->rc == 0) r->rc = fsdp_all_reduce(sub, &x, &x, 1, FSDP_F32, FSDP_SUM);
            if (r->rc) copy_text(r->message, sizeof r->message, sub ? fsdp_comm_last_error(sub) : fsdp_comm_last_error(NULL));
            fsdp_comm_destroy(sub);
            sub = NULL;
        }
        fsdp_barrier(comm);
        r->fds_after = open_fd_count();
        r->result = x;
    } else {
        copy_text(r->message, sizeof r->message, fsdp_comm_last_error(NULL));
    }
    fsdp_comm_destroy(comm);
    return 0;
}

static void test_split_of_a_job_with_the_longest_token_works_without_leaking_descriptors(void) {
    static const char long_job[] = "a-job-token-of-exactly-forty-seven-characters-x";
    rank_plan r0 = {0, 2, 0, 5000, SECRET, long_job, NULL, 0, 0, NULL, 0}, r1;
    pid_t p0, p1;
    TEST_ASSERT_EQUAL_size_t(47, strlen(long_job));
    r0.port = pick_free_port();
    r1 = r0;
    r1.rank = 1;
    reset_reports();
    p0 = spawn(run_split_rank, &r0, 0);
    p1 = spawn(run_split_rank, &r1, 0);
    TEST_ASSERT_EQUAL_INT(0, reap(p0, 15000));
    TEST_ASSERT_EQUAL_INT(0, reap(p1, 15000));
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[0].rc, shared[0].message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, shared[1].rc, shared[1].message);
    TEST_ASSERT_EQUAL_FLOAT(8.0f, shared[0].result);
    TEST_ASSERT_EQUAL_INT(shared[0].fds_before, shared[0].fds_after);
    TEST_ASSERT_EQUAL_INT(shared[1].fds_before, shared[1].fds_after);
}

/* ---------------------------------------------------------------------------------------------
   the launcher in an unusual host program
   --------------------------------------------------------------------------------------------- */
static int crash_rank1(fsdp_comm *comm, void *arg) {
    float x = 1.0f;
    (void)arg;
    if (fsdp_comm_rank(comm) == 1) kill(getpid(), SIGKILL);
    return fsdp_all_reduce(comm, &x, &x, 1, FSDP_F32, FSDP_SUM) == FSDP_SUCCESS ? 0 : 1;
}

static void test_launcher_reports_a_crash_while_sigchld_is_ignored(void) {
    struct sigaction ignore, before, after;
    fsdp_launch_status status;
    int rc;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGCHLD, &ignore, &before);
    rc = launch_ranks(3, FSDP_BACKEND_SHM, 3000, crash_rank1, NULL, &status);
    sigaction(SIGCHLD, NULL, &after);
    sigaction(SIGCHLD, &before, NULL);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_RANK_FAILED, rc, status.message);
    TEST_ASSERT_EQUAL_INT(1, status.failed_rank);
    TEST_ASSERT_EQUAL_INT(SIGKILL, status.signal);
    TEST_ASSERT_TRUE_MESSAGE(after.sa_handler == SIG_IGN, "the launcher did not restore SIGCHLD's disposition");
}

static int quick_success(fsdp_comm *comm, void *arg) {
    float x = 1.0f;
    (void)arg;
    sleep_ms(300);
    return fsdp_all_reduce(comm, &x, &x, 1, FSDP_F32, FSDP_SUM) == FSDP_SUCCESS ? 0 : 1;
}

static void test_launcher_leaves_the_host_programs_own_children_alone(void) {
    fsdp_launch_status status;
    int wstatus = 0;
    pid_t mine = fork();
    if (mine == 0) {
        sleep_ms(100);
        _exit(42);
    }
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, launch_ranks(2, FSDP_BACKEND_SHM, 5000, quick_success, NULL, &status),
                                  status.message);
    TEST_ASSERT_EQUAL_INT(mine, waitpid(mine, &wstatus, 0));
    TEST_ASSERT_TRUE(WIFEXITED(wstatus));
    TEST_ASSERT_EQUAL_INT(42, WEXITSTATUS(wstatus));
}

/* Rank 2 fails on its own; the others fail because of it, some of them possibly exiting before
   the launcher notices rank 2: the report must still blame rank 2, every time. */
static int rank2_fails_first(fsdp_comm *comm, void *arg) {
    float x[256];
    int i;
    (void)arg;
    memset(x, 0, sizeof x);
    if (fsdp_comm_rank(comm) == 2) return 3;
    for (i = 0; i < 100000; i++)
        if (fsdp_all_reduce(comm, x, x, 256, FSDP_F32, FSDP_SUM) != FSDP_SUCCESS) return 1;
    return 0;
}

static void test_launcher_blames_the_rank_that_failed_first_every_time(void) {
    int run;
    for (run = 0; run < 10; run++) {
        fsdp_launch_status status;
        TEST_ASSERT_EQUAL_INT(FSDP_ERR_RANK_FAILED, launch_ranks(4, FSDP_BACKEND_SHM, 3000, rank2_fails_first, NULL, &status));
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, status.failed_rank, status.message);
        TEST_ASSERT_EQUAL_INT(3, status.exit_code);
    }
}

void setUp(void) { measure_kdf = 0; }
void tearDown(void) {}

int main(void) {
    shared = (rank_report *)map_shared(sizeof *shared * MAX_RANKS);
    signal(SIGPIPE, SIG_IGN);
    UNITY_BEGIN();
    RUN_TEST(test_impostor_without_the_secret_is_refused_and_learns_neither_token_nor_secret);
    RUN_TEST(test_rank_with_another_secret_is_refused_saying_the_secrets_differ);
    RUN_TEST(test_hello_whose_mac_is_wrong_only_in_its_last_byte_is_refused);
    RUN_TEST(test_idle_and_garbage_connections_do_not_delay_the_rendezvous);
    RUN_TEST(test_eight_processes_flooding_rank_0_with_connections_do_not_keep_the_ranks_out);
    RUN_TEST(test_accept_failing_for_lack_of_descriptors_does_not_end_the_rendezvous);
    RUN_TEST(test_rank0_without_a_secret_off_loopback_warns_naming_the_open_port);
    RUN_TEST(test_socket_without_sock_diag_warns_once_per_communicator_not_once_per_process);
    RUN_TEST(test_descriptor_limit_is_raised_for_a_large_world_or_init_fails_naming_it);
    RUN_TEST(test_handshake_relayed_by_a_stranger_is_refused_by_rank_0);
    RUN_TEST(test_address_planted_in_torchruns_store_is_refused);
    RUN_TEST(test_process_of_another_user_cannot_join_a_job_without_a_secret);
    RUN_TEST(test_hello_followed_by_a_reset_is_refused_and_the_honest_rank_joins);
    RUN_TEST(test_secret_from_the_environment_is_not_passed_on_to_child_processes);
    RUN_TEST(test_peer_trickling_bytes_fails_the_op_within_its_total_deadline);
    RUN_TEST(test_peer_answering_each_phase_in_time_fails_the_op_at_its_total_deadline);
    RUN_TEST(test_connect_to_a_full_accept_queue_fails_within_the_deadline);
    RUN_TEST(test_service_that_accepts_but_never_greets_fails_within_seconds_naming_it);
    RUN_TEST(test_service_that_speaks_another_protocol_fails_at_once_naming_it);
    RUN_TEST(test_rendezvous_table_with_hosts_out_of_order_or_a_bad_mac_is_refused);
    RUN_TEST(test_wait_that_gives_up_aborts_and_returns_only_after_the_comm_thread_lets_go);
    RUN_TEST(test_segment_someone_else_made_is_refused_by_the_joining_rank);
    RUN_TEST(test_segment_names_say_nothing_about_the_secret);
    RUN_TEST(test_job_key_is_pbkdf2_of_the_secret_and_costs_milliseconds);
    RUN_TEST(test_unterminated_abort_message_from_a_peer_is_read_bounded_and_printable);
    RUN_TEST(test_huge_shm_slot_bytes_are_refused_at_init);
    RUN_TEST(test_shm_slot_too_small_for_the_ranks_is_refused_at_init);
    RUN_TEST(test_last_error_of_null_tells_why_init_failed);
    RUN_TEST(test_split_of_a_job_with_the_longest_token_works_without_leaking_descriptors);
    RUN_TEST(test_launcher_reports_a_crash_while_sigchld_is_ignored);
    RUN_TEST(test_launcher_leaves_the_host_programs_own_children_alone);
    RUN_TEST(test_launcher_blames_the_rank_that_failed_first_every_time);
    return UNITY_END();
}
