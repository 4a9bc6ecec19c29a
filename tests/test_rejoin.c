/* test_rejoin.c - specification of >>recovery's rejoin: a socket job of 4 (or 5) fake hosts (UTS
   namespaces) of 2 ranks, HYBRID_SHARD with recovery on, loses a host (its ranks SIGKILLed in the
   backward of a step); the survivors train on; the host is started again (two fresh processes in
   the same fake host) whose ranks call fsdp_init with recovery.rejoin over a world of their own,
   find the job at the survivors' listeners, are admitted at a step boundary, and receive their
   counterparts' state. Specified: the joined ranks' master shards, optimizer state (AdamW's two
   moments), step and blob equal their counterparts' bit for bit; training goes on with four
   replicas and ends bitwise equal to a reference that averages over 4, then 3, then 4 replicas
   again; the rendezvous's host (rank 0's) killed and rejoined likewise; a joiner with another
   secret is refused and the survivors end as if none came; a hello that answers another
   connection's challenge (one seen on the network, sent again) is refused at once and the
   survivors end as if none came; the state moves from the sending replica to the joiner alone
   (the other survivors receive none of it, and the sender sends it once); a corrupted transfer
   fails the joiner naming the checksum and the piece, and the survivors drop it again and go on;
   fsdp_recovery_timeline_get and the traces show each phase of the loss and of the rejoin, with
   the bytes moved; the sending host killed while the state moves (5 hosts) fails the joiner, and
   the other three replicas recover at once and train on, bitwise equal to the reference; the
   joiners killed while they receive, the survivors recover and train on, likewise.

   Ignored, saying why, where no UTS namespace can be made. Only the parent asserts.

   Build: make build/test_rejoin */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
/* The transfer's test hooks (>>recovery): a piece received, counted, and corrupted where the
   board says so; a piece about to be sent, its host killed where the board says so. Pieces of
   64 KiB, so that a shard of the big model travels in several. */
static void rejoin_received(void *data, size_t bytes, int behind);
static void rejoin_sending(int behind);
#define FSDP__REJOIN_RECEIVED(ctx, data, bytes, behind) rejoin_received((data), (bytes), (behind))
#define FSDP__REJOIN_SENDING(ctx, data, bytes, behind) rejoin_sending(behind)
#define FSDP__JOIN_PIECE ((size_t)64 << 10)
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <poll.h>

#define MAX_HOSTS 5
#define JOINER (2 * MAX_HOSTS)   /* the board's slot of the first joiner */
#define RANKS (JOINER + 2)       /* the world's ranks, then the two joiners */
#define STEPS 6                  /* at least; the parent says where to stop once the joiners are done */
#define LOSS_STEP 2
#define AFTER_JOIN 4             /* steps every rank takes after the joiners are done */
#define NUMEL 32                 /* the weight of Linear(4 -> 8) */
#define BIG_IN 1024              /* the state test's Linear(1024 -> 1024): 4 MiB of f32 per replica */
#define BIG_OUT 1024
#define LR 0.25f
#define DETECT_MS 3000
#define TIMEOUT_MS 20000
#define NO_HOST_NAME 77          /* a rank's exit status when it cannot have a host name of its own */
#define SECRET "test-rejoin-secret"

typedef struct shard_state {
    uint64_t master, m1, m2; /* FNV-1a of each whole shard */
    int64_t step;
    int numel;
    char blob[32];
    fsdp_recovery_timeline times;
} shard_state;

typedef struct rejoin_board {
    char job[40];
    int port, join_port, base, lost, adam, corrupt, wrong_secret; /* ports: the world's, the joiners' own, listeners */
    int replay;                  /* no joiner: the parent sends rank 0 a hello for another connection's challenge */
    char replayed[200];          /* what the replay saw ("refused": the rendezvous closed it) */
    int big;                     /* the model's weight is BIG_OUT x BIG_IN (else 8 x 4) */
    int hosts;                   /* of 2 ranks each */
    int killed_in_transfer;      /* this host's ranks die as they send the joiners' state (-1: none) */
    int joiners_killed;          /* the joiners die as they receive the state */
    int in_part;                 /* where those kills and the corruption strike: 0 the first part of the state
                                    (what a step needs), 1 the optimizer state moving behind training */
    volatile int counted[RANKS]; /* a joiner counted in joiners_done */
    int hold_behind;             /* the sender moves no optimizer state before its joiner's fsdp_init returned */
    char trace_dir[128];         /* every rank traces there ("": none) */
    volatile int joiners_done, stop_at, progress[RANKS];
    float init[NUMEL];
    float final[RANKS][NUMEL];   /* (big: the first NUMEL elements, and the hash of all) */
    uint64_t final_hash[RANKS];
    int shard_right[RANKS];      /* shard_pointers_right at the end */
    int rc[RANKS], steps[RANKS], finished[RANKS], epoch[RANKS], replicas[RANKS], joined_at[RANKS];
    int shrunk_at[RANKS];        /* the step of a report with fewer replicas though its step was applied */
    uint64_t received[RANKS];    /* the transfer's bytes a rank received (the hook's count) */
    uint64_t admit_sent_net[RANKS]; /* the admitting step's report: bytes sent to other hosts */
    uint64_t host_sent[RANKS][2];   /* a step's bytes sent inside the host (report) with every replica training:
                                       the last before the loss, the last after the admitting step */
    shard_state at_join[RANKS]; /* a survivor's after the step that admitted; a joiner's after fsdp_init */
    shard_state after_join[RANKS]; /* everyone's after the first step with the joiners (the optimizer state
                                      moved behind it) */
    uint64_t received_at_init[RANKS]; /* a joiner's bytes received when its fsdp_init returned */
    uint64_t next_sent_net[RANKS];  /* the report of the step after the admitting one: bytes sent to other hosts */
    double killed_ms, join_started_ms, joined_ms[RANKS], admit_ms[RANKS], step_ms[RANKS];
    double slowest_ms[RANKS];    /* the slowest step after the recovery's (none dropped, no admission) */
    char message[RANKS][400];
} rejoin_board;

static rejoin_board *board;
static int corrupting; /* this process is a joiner whose transfer the board corrupts */
static int joining;    /* this process is a joiner */
static int my_host = -1; /* a rank of the world: its host */
static int my_slot = -1; /* its board slot (a joiner's too) */

/* A joiner done with fsdp_init (or killed in it): counted once in joiners_done. */
static void joiner_done(int slot) {
    if (__sync_bool_compare_and_swap(&board->counted[slot], 0, 1)) __sync_fetch_and_add(&board->joiners_done, 1);
}

static void rejoin_received(void *data, size_t bytes, int behind) {
    if (my_slot >= 0) __sync_fetch_and_add(&board->received[my_slot], (uint64_t)bytes);
    if (joining && board->joiners_killed && behind == board->in_part) {
        joiner_done(my_slot);
        raise(SIGKILL);
    }
    if (corrupting && bytes && behind == board->in_part) {
        ((unsigned char *)data)[bytes - 1] ^= 1;
        corrupting = 0; /* (one byte of one shard) */
    }
}

static void rejoin_sending(int behind) {
    double until = now_ms() + TIMEOUT_MS;
    if (!joining && my_host >= 0 && my_host == board->killed_in_transfer && behind == board->in_part) raise(SIGKILL);
    while (behind && board->hold_behind && !board->counted[JOINER + my_slot % 2] && now_ms() < until) sleep_ms(1);
}

/* The gradient the data of rank r gives element i at step t: small integers, so every sum is exact. */
static float grad_of(int t, int r, int i) { return (float)((t * 7 + r * 5 + i * 3) % 11) - 5.0f; }

static uint64_t fnv(const void *data, size_t bytes) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static int numel_of(void) { return board->big ? BIG_IN * BIG_OUT : NUMEL; }

static fsdp_model *net(int *weight) {
    fsdp_init_rule rule;
    fsdp_model *m = NULL;
    int64_t shape[2] = {8, 4};
    if (board->big) shape[0] = BIG_OUT, shape[1] = BIG_IN;
    memset(&rule, 0, sizeof rule);
    rule.kind = FSDP_INIT_NORMAL;
    rule.b = 0.5f;
    fsdp_model_create(&m, "Net");
    *weight = fsdp_model_param(m, fsdp_model_module(m, 0, "fc", "Linear"), "weight", 2, shape, rule);
    return m;
}

/* Every rank's peers list: the listeners of each replica's first rank, in replica order. */
static void peers_of(char *out, size_t size) {
    int h;
    out[0] = 0;
    for (h = 0; h < board->hosts; h++) {
        char one[32];
        snprintf(one, sizeof one, "%s127.0.0.1:%d", h ? "," : "", board->base + 2 * h);
        append_text(out, size, one);
    }
}

static fsdp_desc desc_of(fsdp_comm *comm, int rejoin, const char *peers) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = FSDP_HYBRID_SHARD;
    d.shard_group_size = 2;
    d.optimizer.lr = LR;
    if (board->adam) d.optimizer.kind = FSDP_ADAMW, d.optimizer.weight_decay = 0;
    d.recovery.enabled = 1;
    d.recovery.detect_ms = DETECT_MS;
    d.recovery.port = board->base;
    d.recovery.rejoin = rejoin;
    d.recovery.peers = peers;
    if (board->trace_dir[0]) d.trace_dir = board->trace_dir;
    if (getenv("REJOIN_DEBUG")) d.logger.fn = fsdp_log_stderr;
    return d;
}

static int enter_host(int host, char *message, size_t size) {
    char name[32];
    snprintf(name, sizeof name, "fsdp-rejoin-host-%d", host);
    if (claim_host(name) == 0) return 0;
    snprintf(message, size, "cannot give a rank a host name of its own (a UTS namespace: as root, or in a user "
             "namespace): %s", strerror(errno));
    return NO_HOST_NAME;
}

static int join_world(fsdp_comm **comm, int rank, int world, int port, const char *secret) {
    fsdp_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.backend = FSDP_BACKEND_SOCKET;
    cd.rank = rank;
    cd.world_size = world;
    cd.master_addr = "127.0.0.1";
    cd.master_port = port;
    cd.timeout_ms = TIMEOUT_MS;
    cd.secret = secret;
    cd.job = board->job;
    return fsdp_comm_init(comm, &cd);
}

/* This rank's shard state (the test includes the implementation: it reads the unit directly);
   moments: read the optimizer state too (not a joiner's after fsdp_init: its thread still writes it). */
static void snapshot(fsdp_ctx *ctx, shard_state *s, int moments) {
    const fsdp__unit *u = &ctx->units[0];
    size_t bytes = sizeof(float) * (size_t)u->shard;
    s->numel = (int)u->shard;
    s->master = fnv(u->master, bytes);
    if (moments && ctx->num_state >= 2) s->m1 = fnv(u->opt[0].ram, bytes), s->m2 = fnv(u->opt[1].ram, bytes);
    fsdp_recovery_state(ctx, &s->step, s->blob, sizeof s->blob, NULL);
    fsdp_recovery_timeline_get(ctx, &s->times);
}

/* One iteration at step t on the data of rank `data` (the lost host's ranks die in its backward
   at LOSS_STEP); fsdp_step after the hooks whatever they returned. */
static int iteration(fsdp_ctx *ctx, int w, int64_t t, int data, fsdp_step_report *rep) {
    float *g;
    int i;
    if (fsdp_pre_forward(ctx, 0) == 0 && fsdp_post_forward(ctx, 0) == 0 && fsdp_pre_backward(ctx, 0) == 0 &&
        (g = fsdp_grad(ctx, w)) != NULL) {
        for (i = 0; i < numel_of(); i++) g[i] += grad_of((int)t, data, i);
        if (!joining && data / 2 == board->lost && t == LOSS_STEP) {
            board->killed_ms = now_ms();
            raise(SIGKILL);
        }
        fsdp_post_backward(ctx, 0);
    }
    return fsdp_step(ctx, 0, rep);
}

/* The loop of board slot me (data: its data's rank) from step `step` until the parent's stop:
   every step's blob its data position; a survivor records the step that admitted the joiners. */
static int train(fsdp_ctx *ctx, int w, int me, int data, int64_t step) {
    int rc, replicas = 0, admitted = me >= JOINER ? (int)step : -1;
    while (!board->stop_at || step < board->stop_at) {
        fsdp_step_report rep;
        char blob[32];
        double t0 = now_ms();
        if ((rc = iteration(ctx, w, step, data, &rep)) != 0) return rc;
        if (replicas && rep.replicas > replicas && !rep.dropped) {
            board->joined_at[me] = (int)rep.step, board->admit_ms[me] = now_ms() - t0;
            board->admit_sent_net[me] = rep.bytes_sent_net;
            snapshot(ctx, &board->at_join[me], 1);
            admitted = (int)rep.step;
        } else if (admitted >= 0 && rep.step == admitted + 1 && !rep.dropped) {
            board->next_sent_net[me] = rep.bytes_sent_net;
            snapshot(ctx, &board->after_join[me], 1);
        }
        if (!rep.dropped && replicas == board->hosts) board->step_ms[me] = now_ms() - t0;
        if (!rep.dropped && rep.replicas == board->hosts && !(replicas && rep.replicas > replicas))
            board->host_sent[me][board->joined_at[me] != 0] = rep.bytes_sent_host;
        if (!rep.dropped && rep.replicas < replicas) board->shrunk_at[me] = (int)rep.step;
        if (!rep.dropped && rep.replicas == replicas && step > LOSS_STEP + 1 && now_ms() - t0 > board->slowest_ms[me])
            board->slowest_ms[me] = now_ms() - t0;
        replicas = rep.replicas;
        board->epoch[me] = (int)rep.epoch, board->replicas[me] = rep.replicas;
        if (rep.dropped && (rc = fsdp_set_lr(ctx, LR / 2)) != 0) return rc; /* (a joiner has it from the transfer) */
        if ((rc = fsdp_zero_grad(ctx)) != 0) return rc;
        step = rep.step;
        snprintf(blob, sizeof blob, "data@%lld", (long long)step);
        fsdp_recovery_set_blob(ctx, blob, strlen(blob) + 1);
        board->progress[me] = (int)step;
        if (step > LOSS_STEP) sleep_ms(20); /* (room for the joiners to come) */
        if (step > 2000) return FSDP_ERR_TIMEOUT;
    }
    return 0;
}

/* Rank me's parameters gathered into the board (their first NUMEL, and the hash of all). */
static int gather(fsdp_ctx *ctx, int w, int me) {
    float *all = (float *)malloc(sizeof(float) * (size_t)numel_of());
    int rc = all ? fsdp_gather_param(ctx, w, all) : FSDP_ERR_OUT_OF_MEMORY;
    if (!rc) memcpy(board->final[me], all, sizeof board->final[me]);
    if (!rc) board->final_hash[me] = fnv(all, sizeof(float) * (size_t)numel_of());
    free(all);
    return rc;
}

static int finish(fsdp_ctx *ctx, fsdp_model *m, fsdp_comm *comm, int me, int w, int rc) {
    if (!rc && (rc = gather(ctx, w, me)) == 0) board->finished[me] = 1;
    if (!rc && !board->big) board->shard_right[me] = shard_pointers_right(ctx, w, board->final[me], NUMEL);
    board->steps[me] = ctx ? (int)ctx->step : -1;
    board->rc[me] = rc;
    if (rc) copy_text(board->message[me], sizeof board->message[me], fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    fsdp_comm_destroy(comm);
    return 0;
}

static int world_rank(void *arg) {
    int me = *(const int *)arg, rc, w;
    fsdp_comm *comm = NULL;
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    my_host = me / 2, my_slot = me;
    if (enter_host(me / 2, board->message[me], sizeof board->message[me])) return NO_HOST_NAME;
    if (join_world(&comm, me, 2 * board->hosts, board->port, SECRET) != 0) {
        copy_text(board->message[me], sizeof board->message[me], fsdp_comm_last_error(NULL));
        return 1;
    }
    m = net(&w);
    d = desc_of(comm, 0, NULL);
    if ((rc = fsdp_init(&ctx, m, &d)) == 0) rc = gather(ctx, w, me);
    if (!rc && me == 0) memcpy(board->init, board->final[0], sizeof board->init);
    if (!rc) rc = train(ctx, w, me, me, 0);
    return finish(ctx, m, comm, me, w, rc);
}

/* A rank of the lost host started again: board slot JOINER + position, its data the lost rank's. */
static int joiner_rank(void *arg) {
    int position = *(const int *)arg, me = JOINER + position, data = 2 * board->lost + position, rc, w;
    fsdp_comm *comm = NULL;
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    char peers[256];
    double t0;
    if (enter_host(board->lost, board->message[me], sizeof board->message[me])) return NO_HOST_NAME;
    corrupting = board->corrupt, joining = 1, my_slot = me;
    if (join_world(&comm, position, 2, board->join_port, board->wrong_secret ? "another-secret" : SECRET) != 0) {
        copy_text(board->message[me], sizeof board->message[me], fsdp_comm_last_error(NULL));
        joiner_done(me);
        return 1;
    }
    m = net(&w);
    peers_of(peers, sizeof peers);
    d = desc_of(comm, 1, peers);
    t0 = now_ms();
    rc = fsdp_init(&ctx, m, &d);
    board->joined_ms[me] = now_ms() - t0;
    board->received_at_init[me] = __atomic_load_n(&board->received[me], __ATOMIC_ACQUIRE);
    if (!rc) snapshot(ctx, &board->at_join[me], 0);
    if (!rc) board->joined_at[me] = (int)board->at_join[me].step;
    joiner_done(me);
    if (rc) {
        board->rc[me] = rc;
        copy_text(board->message[me], sizeof board->message[me], fsdp_last_error(NULL));
        fsdp_model_destroy(m);
        fsdp_comm_destroy(comm);
        return 0;
    }
    return finish(ctx, m, comm, me, w, train(ctx, w, me, data, board->at_join[me].step));
}

/* ---------------------------------------------------------------------------------------------
   the parent: the run, the reference, the assertions
   --------------------------------------------------------------------------------------------- */
/* A block of `n` free loopback ports below the ephemeral range (the listeners at base + rank). */
static int free_port_block(int n) {
    int base, k;
    for (base = 20000 + (int)(getpid() % 400) * 20; base < 32000; base += 20) {
        int fds[2 * MAX_HOSTS], ok = 1;
        for (k = 0; k < n; k++) {
            struct sockaddr_in at;
            memset(&at, 0, sizeof at);
            at.sin_family = AF_INET;
            at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            at.sin_port = htons((uint16_t)(base + k));
            fds[k] = socket(AF_INET, SOCK_STREAM, 0);
            if (ok && bind(fds[k], (struct sockaddr *)&at, sizeof at) != 0) ok = 0;
        }
        for (k = 0; k < n; k++) close(fds[k]);
        if (ok) return base;
    }
    return 0;
}

static void plan(int hosts, int lost, int adam) {
    static int runs;
    memset(board, 0, sizeof *board);
    board->hosts = hosts;
    board->killed_in_transfer = -1;
    board->lost = lost;
    board->adam = adam;
    board->port = pick_free_port();
    board->join_port = pick_free_port();
    board->base = free_port_block(2 * hosts);
    snprintf(board->job, sizeof board->job, "rejoin-%d-%d", (int)getpid(), runs++);
}

/* Whether board slot r is a rank that was killed (the lost host's, or one killed in a transfer). */
static int gone(int r) {
    return r < JOINER ? r / 2 == board->lost || r / 2 == board->killed_in_transfer : board->joiners_killed;
}

/* Once the joiners are done with fsdp_init: every rank told to stop AFTER_JOIN steps past the
   furthest one (the ranks step together, so none is past it yet). */
static void say_stop(void) {
    int r, furthest = 0;
    for (r = 0; r < RANKS; r++)
        if (board->progress[r] > furthest) furthest = board->progress[r];
    board->stop_at = (furthest > STEPS ? furthest : STEPS) + AFTER_JOIN;
}

/* A connection to rank 0's listener and the challenge on it (a connection closed without one,
   while the survivors recover, is made again), within TIMEOUT_MS: its fd, else -1. */
static int dial_rank0(fsdp__join_challenge *c) {
    struct sockaddr_in at;
    double until = now_ms() + TIMEOUT_MS;
    memset(&at, 0, sizeof at);
    at.sin_family = AF_INET, at.sin_addr.s_addr = htonl(INADDR_LOOPBACK), at.sin_port = htons((uint16_t)board->base);
    while (now_ms() < until) {
        int fd = fsdp__sock_connect(&at, fsdp__now_ms() + 10000);
        if (fd >= 0 && read_some(fd, c, sizeof *c, TIMEOUT_MS, NULL) == sizeof *c) return fd;
        if (fd >= 0) close(fd);
        sleep_ms(50);
    }
    return -1;
}

/* An eavesdropper's replay, in the parent, while the survivors train with a replica missing: a
   hello made with the job's join key (as a joiner that holds the secret makes it) for the
   challenge of one connection, sent on another; what happened into board->replayed. */
static void replay_hello(void) {
    unsigned char job_key[32], join_key[32];
    fsdp__join_challenge first, second;
    fsdp__join_hello h;
    char byte;
    int closed, fd = dial_rank0(&first);
    if (fd < 0) {
        snprintf(board->replayed, sizeof board->replayed, "no challenge on the first connection");
        return;
    }
    close(fd);
    fsdp__comm_key(job_key, SECRET, strlen(SECRET), "fsdp.h job key", board->job, FSDP__KDF_ROUNDS);
    fsdp__comm_key(join_key, job_key, sizeof job_key, "fsdp.h rejoin key", board->job, 0);
    memset(&h, 0, sizeof h);
    h.magic = FSDP__JOIN_MAGIC, h.position = 0, h.group = 2;
    memcpy(h.challenge, first.challenge, sizeof h.challenge);
    fsdp__recovery_mac(join_key, &h, offsetof(fsdp__join_hello, mac), h.mac);
    if ((fd = dial_rank0(&second)) < 0)
        snprintf(board->replayed, sizeof board->replayed, "no challenge on the second connection");
    else if (!memcmp(first.challenge, second.challenge, sizeof first.challenge))
        snprintf(board->replayed, sizeof board->replayed, "the same challenge on both connections");
    else if (write(fd, &h, sizeof h) != (ssize_t)sizeof h)
        snprintf(board->replayed, sizeof board->replayed, "the replayed hello could not be sent");
    else
        snprintf(board->replayed, sizeof board->replayed, "%s", read_some(fd, &byte, 1, 3 * DETECT_MS, &closed) ?
                 "answered" : closed ? "refused" : "held (no answer, open)");
    if (fd >= 0) close(fd);
}

/* The world forked; the lost host's ranks reaped when they die; the joiners forked then; the
   stop said once they are done; everyone reaped. Ignores the test where no host name can be had. */
static void run(void) {
    pid_t pids[RANKS];
    int ranks[RANKS], status[RANKS], r;
    double until;
    for (r = 0; r < RANKS; r++) ranks[r] = r < JOINER ? r : r - JOINER, status[r] = 0, pids[r] = 0;
    for (r = 0; r < 2 * board->hosts; r++) pids[r] = spawn(world_rank, &ranks[r], 120);
    for (r = 2 * board->lost; r < 2 * board->lost + 2; r++) status[r] = reap(pids[r], 60000);
    board->join_started_ms = now_ms();
    if (board->replay) replay_hello(), board->joiners_done = 2;
    for (r = JOINER; r < RANKS && !board->replay; r++) pids[r] = spawn(joiner_rank, &ranks[r], 120);
    for (until = now_ms() + 90000; board->joiners_done < 2 && now_ms() < until;) sleep_ms(5);
    say_stop();
    for (r = 0; r < RANKS; r++)
        if (pids[r] && r / 2 != board->lost) status[r] = reap(pids[r], 100000);
    for (r = 0; r < RANKS; r++)
        if (status[r] == NO_HOST_NAME) TEST_IGNORE_MESSAGE(board->message[r]);
    for (r = 0; r < RANKS; r++)
        if (pids[r] && !gone(r)) TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], board->message[r]);
}

/* The board slot of the first rank of the world that was not killed. */
static int first_survivor(void) {
    int r = 0;
    while (gone(r)) r++;
    return r;
}

/* Whether host h's replica trains at step t (the joiners: from joined_at, -1 never); a host
   killed in the transfer trains up to the step that admitted the joiners (the survivors lose it
   in that step, or in the next, dropped). */
static int trains(int h, int t, int joined_at) {
    int s = first_survivor();
    if (h == board->killed_in_transfer) return t < (board->shrunk_at[s] ? board->shrunk_at[s] : board->joined_at[s]);
    return h != board->lost || t < LOSS_STEP || (joined_at >= 0 && t >= joined_at);
}

/* SGD on the average over the replicas training at each step (each replica's the mean of its two
   ranks), to step `steps`: 4, then 3 from the loss, then 4 from joined_at; the learning rate
   halved from the loss on (the survivors set it after the dropped step). */
static void reference(float *weight, int joined_at, int steps) {
    int t, i, h;
    memcpy(weight, board->init, sizeof board->init);
    for (t = 0; t < steps; t++) {
        int replicas = 0;
        for (h = 0; h < board->hosts; h++) replicas += trains(h, t, joined_at);
        for (i = 0; i < NUMEL; i++) {
            float sum = 0;
            int folded = 0;
            for (h = 0; h < board->hosts; h++) {
                float partial = (grad_of(t, 2 * h, i) + grad_of(t, 2 * h + 1, i)) / 2.0f;
                if (trains(h, t, joined_at)) sum = folded++ == 0 ? partial : sum + partial;
            }
            weight[i] -= (t < LOSS_STEP ? LR : LR / 2) * (sum / (float)replicas + 0.0f * weight[i]);
        }
    }
}

static void what_of(char *what, size_t size, int r) {
    snprintf(what, size, "rank %d: rc %d, %d steps, epoch %d, %d replicas, joined at %d: %s", r, board->rc[r],
             board->steps[r], board->epoch[r], board->replicas[r], board->joined_at[r], board->message[r]);
}

/* Every rank but the lost host's (and the joiners where joined) reached the stop with the
   reference's bits, in `epoch` with `replicas` replicas. */
static void assert_everyone_matches(int joined, int epoch, int replicas) {
    float want[NUMEL];
    int r, joined_at = joined ? board->joined_at[0 == 2 * board->lost ? 2 : 0] : -1;
    reference(want, joined_at, board->stop_at);
    for (r = 0; r < RANKS; r++) {
        char what[700];
        if (gone(r) || (r >= 2 * board->hosts && r < JOINER) || (r >= JOINER && !joined)) continue;
        what_of(what, sizeof what, r);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, board->rc[r], what);
        TEST_ASSERT_TRUE_MESSAGE(board->finished[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(board->stop_at, board->steps[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(epoch, board->epoch[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(replicas, board->replicas[r], what);
        if (joined) TEST_ASSERT_EQUAL_INT_MESSAGE(joined_at, board->joined_at[r], what);
        if (board->adam) /* (the reference is SGD's: AdamW's replicas equal each other) */
            TEST_ASSERT_TRUE_MESSAGE(board->final_hash[r] == board->final_hash[first_survivor()], what);
        else
            TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, board->final[r], sizeof want, what);
    }
}

/* The rejoin's cost, as the timelines of a survivor and of a joiner give it. */
static void say_times(int survivor) {
    const fsdp_recovery_timeline *s = &board->at_join[survivor].times, *j = &board->at_join[JOINER].times;
    printf("rejoin of %d-element shards: the survivors' admitting step %.1f ms (a step of 4 replicas: %.1f ms): the "
           "world %.1f ms, the state %.1f ms for %llu bytes; the joiner's fsdp_init %.1f ms (its hello to the state "
           "checked: %.1f ms)\n", board->at_join[survivor].numel, board->admit_ms[survivor], board->step_ms[survivor],
           (s->join_world - s->join_begin) * 1e3, (s->join_done - s->join_world) * 1e3,
           (unsigned long long)s->join_bytes, board->joined_ms[JOINER], (j->join_done - j->join_begin) * 1e3);
}

/* The joiners' state equals their counterparts' (position p of a surviving replica) bit for bit:
   step and blob after fsdp_init against the survivors' after the step that admitted them; master
   shard and both moments after the first step with the joiners, whose update needed every moment
   (they moved behind that step's forward and backward). */
static void assert_joiners_hold_their_counterparts_state(void) {
    int p, survivor_base = board->lost == 0 ? 2 : 0;
    for (p = 0; p < 2; p++) {
        const shard_state *mine = &board->at_join[JOINER + p], *theirs = &board->at_join[survivor_base + p];
        const shard_state *mine_after = &board->after_join[JOINER + p], *theirs_after = &board->after_join[survivor_base + p];
        char what[700];
        what_of(what, sizeof what, JOINER + p);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, board->rc[JOINER + p], what);
        TEST_ASSERT_TRUE_MESSAGE(theirs->numel > 0 && theirs->numel == mine->numel, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE((int)theirs->step, (int)mine->step, what);
        TEST_ASSERT_EQUAL_STRING_MESSAGE(theirs->blob, mine->blob, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE((int)theirs->step, (int)mine->times.join_step, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE((int)theirs->step + 1, (int)theirs_after->step, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE((int)theirs_after->step, (int)mine_after->step, what);
        TEST_ASSERT_TRUE_MESSAGE(theirs_after->master == mine_after->master, what);
        TEST_ASSERT_TRUE_MESSAGE(theirs_after->m1 == mine_after->m1 && theirs_after->m2 == mine_after->m2, what);
        TEST_ASSERT_TRUE_MESSAGE(mine_after->times.join_streamed >= mine->times.join_done, what);
        TEST_ASSERT_TRUE_MESSAGE(mine_after->times.join_bytes == theirs_after->times.join_bytes, what);
    }
    say_times(survivor_base);
}

/* Every rank's final parameters equal each other's, bit for bit. */
static void assert_every_replica_equal(void) {
    int r, first = board->lost == 0 ? 2 : 0;
    for (r = 0; r < RANKS; r++) {
        char what[700];
        if (gone(r) || (r >= 2 * board->hosts && r < JOINER)) continue;
        what_of(what, sizeof what, r);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, board->rc[r], what);
        TEST_ASSERT_TRUE_MESSAGE(board->final_hash[first] == board->final_hash[r], what);
    }
}

/* ... and what a step needs moved in the survivors' pause, the moments behind training: each
   joiner's fsdp_init returned with about a third of the state (the master shard of 3 equal
   buffers), the rest received as the first step with it ran, and the sender's timeline says so. */
static void test_rejoin_after_a_host_killed_joiners_hold_their_counterparts_state_bit_for_bit(void) {
    int p;
    plan(4, 2, 1);
    board->big = 1, board->hold_behind = 1;
    run();
    assert_joiners_hold_their_counterparts_state();
    assert_every_replica_equal();
    for (p = 0; p < 2; p++) {
        const fsdp_recovery_timeline *t = &board->after_join[p].times;
        char what[800];
        snprintf(what, sizeof what, "joiner %d: %llu bytes received by fsdp_init's return, %llu in all; the sender's "
                 "state: %llu bytes, the first part done at %.3f, the rest at %.3f", p,
                 (unsigned long long)board->received_at_init[JOINER + p], (unsigned long long)board->received[JOINER + p],
                 (unsigned long long)t->join_bytes, t->join_done, t->join_streamed);
        TEST_ASSERT_TRUE_MESSAGE(board->received[JOINER + p] > (uint64_t)sizeof(float) * BIG_IN * BIG_OUT / 2 * 3 - 4096, what);
        TEST_ASSERT_TRUE_MESSAGE(board->received_at_init[JOINER + p] < board->received[JOINER + p] * 2 / 5, what);
        TEST_ASSERT_TRUE_MESSAGE(t->join_streamed > t->join_done && t->join_bytes > board->received[JOINER + p], what);
    }
}

/* ... and each rank's step reports count, after the rejoin, the bytes of a step of 4 replicas that
   they counted before the loss: the shard comms kept across the rejoin add into the new world's
   counters (a survivor's step counted its shared-memory bytes no more, once). */
static void test_rejoin_after_a_host_killed_training_ends_bitwise_equal_to_the_reference_of_4_3_then_4(void) {
    int r;
    plan(4, 2, 0);
    run();
    assert_everyone_matches(1, 2, 4);
    say_times(0);
    for (r = 0; r < RANKS; r++) {
        char what[800];
        int before = r < JOINER ? r : 2 * board->lost + r - JOINER; /* (a joiner: its lost counterpart's) */
        if (gone(r) || (r >= 2 * board->hosts && r < JOINER)) continue;
        what_of(what, sizeof what, r);
        snprintf(what + strlen(what), sizeof what - strlen(what), "; bytes sent in the host a step: %llu before the "
                 "loss, %llu after the rejoin", (unsigned long long)board->host_sent[before][0],
                 (unsigned long long)board->host_sent[r][1]);
        TEST_ASSERT_TRUE_MESSAGE(board->host_sent[before][0] > 0, what);
        TEST_ASSERT_EQUAL_UINT64_MESSAGE(board->host_sent[before][0], board->host_sent[r][1], what);
    }
}

/* A rejoin's admission keeps every rank's shard comm and its master shards (a loss moves them
   into the new world's shard comm): fsdp_param_info_get's pointers read and set them on survivors
   and joiners alike. */
static void test_rejoin_after_a_host_killed_param_info_shards_read_and_set_the_parameter_everywhere(void) {
    int r;
    plan(4, 2, 0);
    run();
    for (r = 0; r < RANKS; r++) {
        char what[700];
        if (gone(r) || (r >= 2 * board->hosts && r < JOINER)) continue;
        what_of(what, sizeof what, r);
        TEST_ASSERT_TRUE_MESSAGE(board->shard_right[r], what);
    }
}

static void test_rejoin_of_the_rendezvous_host_ends_bitwise_equal_to_the_reference_of_4_3_then_4(void) {
    plan(4, 0, 0);
    run();
    assert_everyone_matches(1, 2, 4);
}

/* No survivor's step after the recovery's took detect_ms (a rejoin's world the joiner never comes
   to would hold a step 2 detect_ms + 5 s). */
static void assert_no_survivor_stalled(void) {
    char what[700];
    int r;
    for (r = 0; r < 2 * board->hosts; r++) {
        what_of(what, sizeof what, r);
        if (r / 2 != board->lost) TEST_ASSERT_TRUE_MESSAGE(board->slowest_ms[r] < DETECT_MS, what);
    }
}

static void test_rejoin_with_another_secret_is_refused_and_the_survivors_train_on_undisturbed(void) {
    char what[700];
    plan(4, 2, 0);
    board->wrong_secret = 1;
    run();
    what_of(what, sizeof what, JOINER);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PEER_LOST, board->rc[JOINER], what);
    assert_says(board->message[JOINER], "did not admit");
    assert_everyone_matches(0, 1, 3);
    assert_no_survivor_stalled();
}

/* A hello seen on the network and sent again on a connection of its own: it does not answer that
   connection's challenge, so the rendezvous closes it at once (it held it as a joiner, and the
   survivors stalled a step making a world for it, 2 detect_ms + 5 s, at every replay). */
static void test_rejoin_with_a_replayed_hello_is_refused_at_once_and_the_survivors_train_on_undisturbed(void) {
    plan(4, 2, 0);
    board->replay = 1;
    run();
    TEST_ASSERT_EQUAL_STRING("refused", board->replayed);
    assert_everyone_matches(0, 1, 3);
    assert_no_survivor_stalled();
}

static void test_rejoin_with_a_corrupted_transfer_fails_the_joiner_naming_the_checksum_and_the_survivors_go_on(void) {
    char what[700];
    plan(4, 2, 0);
    board->corrupt = 1;
    run();
    what_of(what, sizeof what, JOINER);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PROTOCOL, board->rc[JOINER], what);
    assert_says(board->message[JOINER], "checksum");
    assert_says(board->message[JOINER], "piece 0 of"); /* (the hook flips the first piece's last byte) */
    assert_says(board->message[JOINER], "unit 0's master shard");
    assert_everyone_matches(0, 3, 3);
}

/* The state moves from the sending replica (the lowest survivor: host 0's) to the joiners alone:
   a survivor of another replica receives none of it (a broadcast over the replica comm gave it
   every piece, the bits it holds), and the sender sends it across hosts once, not once a replica. */
static void test_rejoin_state_goes_to_the_joiners_alone_the_other_survivors_receive_none_of_it(void) {
    char what[700];
    int r;
    plan(4, 2, 1);
    board->big = 1;
    run();
    assert_joiners_hold_their_counterparts_state();
    for (r = 2; r < 2 * board->hosts; r++) {
        if (gone(r)) continue;
        what_of(what, sizeof what, r);
        TEST_ASSERT_EQUAL_UINT64_MESSAGE(0, board->received[r], what);
    }
    for (r = 0; r < 2; r++) { /* (the state beyond what host 1's rank r sent in the same two steps) */
        const fsdp_recovery_timeline *t = &board->after_join[r].times;
        uint64_t sent = board->admit_sent_net[r] + board->next_sent_net[r];
        uint64_t other = board->admit_sent_net[2 + r] + board->next_sent_net[2 + r];
        snprintf(what, sizeof what, "sender rank %d: the admitting step and the next sent %llu bytes across hosts "
                 "(host 1's rank %d %llu), the state %llu, the joiner received %llu", r, (unsigned long long)sent, r,
                 (unsigned long long)other, (unsigned long long)t->join_bytes,
                 (unsigned long long)board->received[JOINER + r]);
        TEST_ASSERT_TRUE_MESSAGE(t->join_bytes > (uint64_t)sizeof(float) * BIG_IN * BIG_OUT / 2 * 3, what);
        TEST_ASSERT_TRUE_MESSAGE(sent > other && sent - other > t->join_bytes - t->join_bytes / 10, what);
        TEST_ASSERT_TRUE_MESSAGE(sent - other < t->join_bytes + t->join_bytes / 2, what);
        TEST_ASSERT_TRUE_MESSAGE(board->received[JOINER + r] > 0 && board->received[JOINER + r] <= t->join_bytes, what);
    }
}

/* The sending host (the lowest survivor, the rendezvous's) killed as it sends the part `part` of
   the state (5 hosts): the joiner fails, saying `says` (NULL: anything), and the other three
   replicas train on. AdamW where the part is the optimizer state behind training. */
static void run_with_the_sending_host_killed_in(int part, const char *says) {
    char what[700];
    plan(5, 2, part);
    board->killed_in_transfer = 0, board->in_part = part;
    run();
    what_of(what, sizeof what, JOINER);
    TEST_ASSERT_TRUE_MESSAGE(board->rc[JOINER] != FSDP_SUCCESS, what);
    printf("the joiner, its sender lost %s: %s\n", part ? "behind training" : "in the transfer", board->message[JOINER]);
    if (says) assert_says(board->message[JOINER], says);
    assert_everyone_matches(0, 3, 3);
}

static void test_rejoin_with_the_sending_host_killed_during_the_transfer_fails_the_joiner_and_the_rest_train_on(void) {
    run_with_the_sending_host_killed_in(0, NULL);
}

/* The joiners lost while they receive: the senders lose them inside the admitting fsdp_step and
   recover there (that step stays applied), the other survivors in their next step (dropped). */
static void test_rejoin_with_the_joiners_killed_during_the_transfer_the_survivors_recover_and_train_on(void) {
    plan(4, 2, 0);
    board->joiners_killed = 1;
    run();
    assert_everyone_matches(0, 3, 3);
}

/* The same three failures where the optimizer state moves behind the first step with the joiners:
   that step is the one the survivors drop (the joiners' fsdp_init had returned). A corrupted
   moment fails the joiner at its commit point naming the piece, and it leaves (its comms
   aborted, so the survivors lose it at once). */
static void test_rejoin_with_the_state_behind_training_corrupted_fails_the_joiner_at_its_first_step_and_the_rest_go_on(void) {
    char what[700];
    plan(4, 2, 1);
    board->corrupt = 1, board->in_part = 1;
    run();
    what_of(what, sizeof what, JOINER);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PROTOCOL, board->rc[JOINER], what);
    TEST_ASSERT_TRUE_MESSAGE(board->joined_at[JOINER] > 0, what); /* (fsdp_init returned: the step failed) */
    assert_says(board->message[JOINER], "did not arrive whole");
    assert_says(board->message[JOINER], "unit 0's optimizer state 0");
    assert_everyone_matches(0, 3, 3);
}

static void test_rejoin_with_the_sending_host_killed_behind_training_fails_the_joiner_and_the_rest_train_on(void) {
    run_with_the_sending_host_killed_in(1, "did not arrive whole");
}

static void test_rejoin_with_the_joiners_killed_behind_training_the_survivors_recover_and_train_on(void) {
    plan(4, 2, 1);
    board->joiners_killed = 1, board->in_part = 1;
    run();
    assert_everyone_matches(0, 3, 3);
}

/* The text of the first file in dir whose name holds both parts (malloc'd; NULL: none). */
static char *read_file_named(const char *dir, const char *part, const char *also) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char *text = NULL, path[400];
    size_t size;
    while (d && !text && (e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, part) || !strstr(e->d_name, also)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        text = (char *)read_whole_file(path, &size);
    }
    if (d) closedir(d);
    return text;
}

static void test_rejoin_timeline_and_trace_show_each_phase_on_survivor_and_joiner_with_the_bytes_moved(void) {
    const fsdp_recovery_timeline *s, *j;
    char *survivor_trace, *joiner_trace, what[700];
    plan(4, 2, 1); /* (AdamW: its moments move behind training) */
    make_test_dir(board->trace_dir, sizeof board->trace_dir, "rejoin-trace");
    run();
    s = &board->at_join[0].times, j = &board->at_join[JOINER].times;
    what_of(what, sizeof what, JOINER);
    TEST_ASSERT_TRUE_MESSAGE(s->loss_seen > 0 && s->stopped >= s->loss_seen && s->agreed >= s->stopped &&
                             s->rebuilt >= s->agreed && s->loss_epoch == 1, what);
    TEST_ASSERT_TRUE_MESSAGE(s->join_begin > s->rebuilt && s->join_world >= s->join_begin &&
                             s->join_done >= s->join_world && s->join_epoch == 2, what);
    TEST_ASSERT_TRUE_MESSAGE(j->join_begin > 0 && j->join_world >= j->join_begin && j->join_done >= j->join_world, what);
    TEST_ASSERT_TRUE_MESSAGE(s->join_bytes > sizeof(float) * NUMEL / 2 && s->join_bytes == j->join_bytes, what);
    TEST_ASSERT_EQUAL_INT_MESSAGE(board->joined_at[0], (int)s->join_step, what);
    TEST_ASSERT_EQUAL_INT_MESSAGE(board->joined_at[0], (int)j->join_step, what);
    survivor_trace = read_file_named(board->trace_dir, "trace-rank00000", ".json");
    joiner_trace = read_file_named(board->trace_dir, "trace-rejoin-pid", "rank00000");
    TEST_ASSERT_NOT_NULL_MESSAGE(survivor_trace, board->trace_dir);
    TEST_ASSERT_NOT_NULL_MESSAGE(joiner_trace, board->trace_dir);
    TEST_ASSERT_TRUE(contains(survivor_trace, "\"cat\":\"recovery\",\"name\":\"agree\""));
    TEST_ASSERT_TRUE(contains(survivor_trace, "\"cat\":\"recovery\",\"name\":\"rejoin: state\""));
    TEST_ASSERT_TRUE(contains(joiner_trace, "\"cat\":\"recovery\",\"name\":\"rejoin: state\""));
    TEST_ASSERT_TRUE(contains(survivor_trace, "\"name\":\"rejoin: state behind training\""));
    TEST_ASSERT_TRUE(contains(joiner_trace, "\"name\":\"rejoin: state behind training\""));
    free(survivor_trace);
    free(joiner_trace);
    remove_tree(board->trace_dir);
}

void setUp(void) {}
void tearDown(void) {}

int main(void) {
    board = (rejoin_board *)map_shared(sizeof *board);
    UNITY_BEGIN();
    RUN_TEST(test_rejoin_after_a_host_killed_joiners_hold_their_counterparts_state_bit_for_bit);
    RUN_TEST(test_rejoin_after_a_host_killed_training_ends_bitwise_equal_to_the_reference_of_4_3_then_4);
    RUN_TEST(test_rejoin_after_a_host_killed_param_info_shards_read_and_set_the_parameter_everywhere);
    RUN_TEST(test_rejoin_of_the_rendezvous_host_ends_bitwise_equal_to_the_reference_of_4_3_then_4);
    RUN_TEST(test_rejoin_with_another_secret_is_refused_and_the_survivors_train_on_undisturbed);
    RUN_TEST(test_rejoin_with_a_replayed_hello_is_refused_at_once_and_the_survivors_train_on_undisturbed);
    RUN_TEST(test_rejoin_with_a_corrupted_transfer_fails_the_joiner_naming_the_checksum_and_the_survivors_go_on);
    RUN_TEST(test_rejoin_state_goes_to_the_joiners_alone_the_other_survivors_receive_none_of_it);
    RUN_TEST(test_rejoin_timeline_and_trace_show_each_phase_on_survivor_and_joiner_with_the_bytes_moved);
    RUN_TEST(test_rejoin_with_the_sending_host_killed_during_the_transfer_fails_the_joiner_and_the_rest_train_on);
    RUN_TEST(test_rejoin_with_the_joiners_killed_during_the_transfer_the_survivors_recover_and_train_on);
    RUN_TEST(test_rejoin_with_the_state_behind_training_corrupted_fails_the_joiner_at_its_first_step_and_the_rest_go_on);
    RUN_TEST(test_rejoin_with_the_sending_host_killed_behind_training_fails_the_joiner_and_the_rest_train_on);
    RUN_TEST(test_rejoin_with_the_joiners_killed_behind_training_the_survivors_recover_and_train_on);
    return UNITY_END();
}
