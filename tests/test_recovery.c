/* test_recovery.c - specification of >>recovery: the agreement rule that decides, from the views
   of the ranks that survived a lost replica, the next membership (its epoch, its replicas),
   whether a partition must stop (naming it) and the step every survivor ends at (the step in
   flight applied everywhere or nowhere); fsdp_desc.recovery's checks at fsdp_init; fsdp_replicas
   and the step report's replica fields; what recovery builds on in the comms: a replica lost
   between hosts shows in the replica communicator's op (a reset at once as FSDP_ERR_PEER_LOST
   naming the rank, silence at the op's timeout), the comms report the lost peer, the links to
   other hosts carry keepalive (a stopped process is still found at the op timeout only, and a
   straggler whose window stays closed is waited for), while the shared-memory shard communicator of a surviving host stays healthy;
   the survivors' runtime (quiesce, catch up, reset, adopt) driven by hand through a simulated
   loss on one host and a real one over three; and recovery through the public API: a socket job
   of 3 or 4 fake hosts of 2 ranks, a host's ranks SIGKILLed at a step (the rendezvous's host
   too), the survivors reaching the last step bitwise equal to a reference that averages over
   them from the loss on; half the hosts lost stops the survivors naming the partition; recovery
   off ends them naming the lost rank.

   The agreement is a pure function, tested directly (the file includes the implementation). The
   multi-rank tests run in forked worlds: shared memory on one host, and sockets over hosts made
   with UTS namespaces (as tests/test_hierarchical.c does; ignored, saying why, where no
   namespace can be made). Only the parent asserts.

   Build: make build/test_recovery */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#define MAX_RANKS 8
#define MAX_REPLICAS 8
#define TIMEOUT_MS 20000
#define NO_HOST_NAME 77 /* a rank's exit status when it cannot have a host name of its own */

/* ---------------------------------------------------------------------------------------------
   the agreement: views of survivors, and what they decide
   --------------------------------------------------------------------------------------------- */
typedef struct agreement {
    int last_ids[MAX_REPLICAS], next_ids[MAX_REPLICAS];
    fsdp__membership last, next;
    unsigned char reach[MAX_RANKS][MAX_REPLICAS];
    fsdp__recovery_view views[MAX_RANKS];
    int num_views, rc;
    int64_t target;     /* the step every survivor is to end at */
    char why[FSDP__ERRMSG];
} agreement;

static agreement ag;

/* Epoch `epoch` holding `count` replicas 0..count-1 (of `count` at fsdp_init); no views yet. */
static void last_membership(int64_t epoch, int count) {
    int i;
    memset(&ag, 0, sizeof ag);
    for (i = 0; i < count; i++) ag.last_ids[i] = i;
    ag.last.epoch = epoch;
    ag.last.count = ag.last.total = count;
    ag.last.replicas = ag.last_ids;
    ag.next.replicas = ag.next_ids;
}

/* A surviving rank's view: it reaches the replicas whose bit is set in reach_mask. */
static fsdp__recovery_view *add_view(int rank, int replica, unsigned reach_mask) {
    fsdp__recovery_view *v = &ag.views[ag.num_views];
    int r;
    for (r = 0; r < MAX_REPLICAS; r++) ag.reach[ag.num_views][r] = (unsigned char)((reach_mask >> r) & 1u);
    v->epoch = ag.last.epoch;
    v->rank = rank;
    v->replica = replica;
    v->reach = ag.reach[ag.num_views++];
    return v;
}

/* Views from both ranks of each replica in `replicas` (replica r: ranks 2r, 2r + 1), each
   reaching exactly those replicas. */
static void add_replicas(const int *replicas, int n) {
    unsigned mask = 0;
    int i;
    for (i = 0; i < n; i++) mask |= 1u << replicas[i];
    for (i = 0; i < n; i++) {
        add_view(2 * replicas[i], replicas[i], mask);
        add_view(2 * replicas[i] + 1, replicas[i], mask);
    }
}

static void decide(int min_replicas) {
    ag.rc = fsdp__recovery_decide(&ag.last, 2, min_replicas, ag.views, ag.num_views, &ag.next, &ag.target, ag.why,
                                  sizeof ag.why);
}

static void assert_next(int64_t epoch, const int *replicas, int n) {
    int i;
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, ag.rc, ag.why);
    TEST_ASSERT_EQUAL_INT_MESSAGE((int)epoch, (int)ag.next.epoch, ag.why);
    TEST_ASSERT_EQUAL_INT_MESSAGE(n, ag.next.count, ag.why);
    for (i = 0; i < n; i++) TEST_ASSERT_EQUAL_INT_MESSAGE(replicas[i], ag.next.replicas[i], ag.why);
}

static void test_decide_one_of_four_replicas_lost_keeps_three_in_the_next_epoch(void) {
    static const int alive[3] = {0, 2, 3};
    last_membership(0, 4);
    add_replicas(alive, 3);
    decide(1);
    assert_next(1, alive, 3);
    TEST_ASSERT_EQUAL_INT(0, (int)ag.target);
}

static void test_decide_rendezvous_replica_lost_is_survived_like_any_other(void) {
    static const int alive[3] = {1, 2, 3};
    last_membership(4, 4);
    add_replicas(alive, 3);
    decide(1);
    assert_next(5, alive, 3);
}

static void test_decide_two_two_partition_stops_both_halves_naming_them(void) {
    static const int left[2] = {0, 1}, right[2] = {2, 3};
    last_membership(0, 4);
    add_replicas(left, 2);
    decide(1);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_PEER_LOST, ag.rc);
    assert_says(ag.why, "replicas {0, 1}");
    assert_says(ag.why, "epoch 0's {0, 1, 2, 3}");
    assert_says(ag.why, "not a strict majority (3 of 4 needed)");
    last_membership(0, 4);
    add_replicas(right, 2);
    decide(1);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_PEER_LOST, ag.rc);
    assert_says(ag.why, "replicas {2, 3}");
}

static void test_decide_below_min_replicas_stops_naming_the_minimum(void) {
    static const int alive[3] = {0, 1, 2};
    last_membership(2, 4);
    add_replicas(alive, 3);
    decide(4);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_PEER_LOST, ag.rc);
    assert_says(ag.why, "fewer than recovery.min_replicas 4");
}

static void test_decide_replica_missing_a_rank_is_dropped_with_its_host(void) {
    static const int alive[3] = {0, 1, 3}, kept[2] = {0, 1};
    last_membership(0, 3);
    ag.last.count = 3;
    ag.last_ids[2] = 3; /* (replica ids need not be consecutive: 2 was lost earlier) */
    ag.last.total = 4;
    add_replicas(alive, 3);
    ag.num_views--; /* rank 7, of replica 3, never reported */
    decide(1);
    assert_next(1, kept, 2);
}

static void test_decide_views_of_an_older_epoch_are_not_counted(void) {
    static const int alive[3] = {0, 1, 2}, kept[2] = {0, 1};
    last_membership(3, 3);
    add_replicas(alive, 3);
    ag.views[4].epoch = 2; /* a straggler of replica 2 still in epoch 2 */
    decide(1);
    assert_next(4, kept, 2);
}

static void test_decide_link_broken_one_way_drops_the_later_replica_only(void) {
    static const int kept[2] = {0, 1};
    last_membership(0, 3);
    add_view(0, 0, 0x7);
    add_view(1, 0, 0x7);
    add_view(2, 1, 0x7);
    add_view(3, 1, 0x7);
    add_view(4, 2, 0x6); /* replica 2 no longer reaches replica 0; 0 still thinks it reaches 2 */
    add_view(5, 2, 0x7);
    decide(1);
    assert_next(1, kept, 2);
}

static void test_decide_nothing_lost_keeps_the_epoch(void) {
    static const int all[3] = {0, 1, 2};
    last_membership(7, 3);
    add_replicas(all, 3);
    decide(1);
    assert_next(7, all, 3);
}

/* Every view at step 5 with its reductions done (or not, per mask bit i for view i). */
static void views_at_step_5(unsigned reduced_mask) {
    int i;
    for (i = 0; i < ag.num_views; i++) {
        ag.views[i].step = 5;
        ag.views[i].reductions_done = (int)((reduced_mask >> i) & 1u);
    }
}

static void test_decide_a_survivor_past_the_commit_point_brings_every_survivor_to_its_step(void) {
    static const int alive[3] = {0, 1, 3};
    last_membership(0, 4);
    add_replicas(alive, 3);
    views_at_step_5(0x3f);
    ag.views[3].step = 6; /* rank 3 applied step 6 before it saw the loss */
    decide(1);
    assert_next(1, alive, 3);
    TEST_ASSERT_EQUAL_INT(6, (int)ag.target);
}

static void test_decide_no_survivor_past_the_commit_point_drops_the_step_everywhere(void) {
    static const int alive[3] = {0, 1, 3};
    last_membership(0, 4);
    add_replicas(alive, 3);
    views_at_step_5(0x3f & ~0x4u); /* rank 2 did not even finish its reductions */
    decide(1);
    assert_next(1, alive, 3);
    TEST_ASSERT_EQUAL_INT(5, (int)ag.target);
}

static void test_decide_a_step_applied_while_a_survivor_lacks_its_gradient_is_refused_naming_both_ranks(void) {
    static const int alive[3] = {0, 1, 3};
    last_membership(0, 4);
    add_replicas(alive, 3);
    views_at_step_5(0x3f & ~0x10u);
    ag.views[0].step = 6;
    decide(1);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_PROTOCOL, ag.rc);
    assert_says(ag.why, "rank 0 applied step 6 but rank 6 (replica 3) is at step 5 without its reduced gradient");
}

static void test_decide_a_survivor_two_steps_behind_is_refused(void) {
    static const int alive[3] = {0, 1, 3};
    last_membership(0, 4);
    add_replicas(alive, 3);
    views_at_step_5(0x3f);
    ag.views[1].step = 7;
    decide(1);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_PROTOCOL, ag.rc);
    assert_says(ag.why, "rank 1 applied step 7 but rank 0 (replica 0) is at step 5:");
}

static void test_decide_same_views_in_any_order_decide_the_same(void) {
    static const int alive[3] = {1, 2, 3};
    fsdp__recovery_view reversed[MAX_RANKS];
    int i, first[MAX_REPLICAS], n;
    last_membership(0, 4);
    add_replicas(alive, 3);
    add_view(0, 0, 0x1); /* half of replica 0 */
    views_at_step_5(0x7f);
    ag.views[2].step = 6;
    decide(1);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, ag.rc, ag.why);
    n = ag.next.count;
    memcpy(first, ag.next_ids, sizeof first);
    for (i = 0; i < ag.num_views; i++) reversed[i] = ag.views[ag.num_views - 1 - i];
    memcpy(ag.views, reversed, sizeof reversed);
    decide(1);
    assert_next(1, first, n);
    TEST_ASSERT_EQUAL_INT(6, (int)ag.target);
}

/* ---------------------------------------------------------------------------------------------
   fsdp_init's checks and the replica queries, in forked worlds
   --------------------------------------------------------------------------------------------- */
typedef struct rank_report {
    int done, rc, count, index, report_replicas, report_dropped;
    int64_t report_epoch;
    char message[600];
} rank_report;

static rank_report *reports; /* [MAX_RANKS], MAP_SHARED before any fork */

/* What every rank of a world tries. */
typedef struct world_plan {
    fsdp_strategy strategy;
    int shard_group_size;
    int recovery;
    int train;             /* recovery off: one step, and the report's fields */
    int bf16_state;        /* AdamW with its state in bf16 (its update streams) */
    int overlap_step;      /* fsdp_desc.overlap_step (the update streams behind the next forward) */
    /* sockets over hosts (0: shm on this host) */
    int hosts, port, rank, world;
    char job[32];
} world_plan;

/* A model of one linear layer under the plan's strategy; 0 or fsdp_init's result (its message
   in r). */
static int init_context(fsdp_comm *comm, const world_plan *plan, rank_report *r) {
    fsdp_init_rule rule;
    int64_t shape[2] = {8, 4};
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    fsdp_step_report rep;
    int fc, w;
    memset(&rule, 0, sizeof rule);
    rule.kind = FSDP_INIT_NORMAL;
    rule.b = 0.02f;
    fsdp_model_create(&m, "Net");
    fc = fsdp_model_module(m, 0, "fc", "Linear");
    w = fsdp_model_param(m, fc, "weight", 2, shape, rule);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = plan->strategy;
    d.shard_group_size = plan->shard_group_size;
    d.recovery.enabled = plan->recovery;
    if (plan->bf16_state) d.optimizer.kind = FSDP_ADAMW, d.optimizer.state_dtype = FSDP_BF16;
    d.overlap_step = plan->overlap_step;
    r->rc = fsdp_init(&ctx, m, &d);
    if (r->rc) copy_text(r->message, sizeof r->message, fsdp_last_error(NULL));
    if (!r->rc) fsdp_replicas(ctx, &r->count, &r->index);
    if (!r->rc && plan->train) {
        float *g;
        fsdp_pre_forward(ctx, 0);
        fsdp_post_forward(ctx, 0);
        fsdp_pre_backward(ctx, 0);
        if ((g = fsdp_grad(ctx, w)) != NULL) g[0] += 1.0f;
        fsdp_post_backward(ctx, 0);
        memset(&rep, 0xff, sizeof rep);
        if ((r->rc = fsdp_step(ctx, 0, &rep)) != 0) copy_text(r->message, sizeof r->message, fsdp_last_error(ctx));
        r->report_replicas = rep.replicas;
        r->report_epoch = rep.epoch;
        r->report_dropped = rep.dropped;
    }
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    return r->rc;
}

static int shm_rank(fsdp_comm *comm, void *arg) {
    rank_report *r = &reports[fsdp_comm_rank(comm)];
    init_context(comm, (const world_plan *)arg, r);
    r->done = 1;
    return 0;
}

/* This process alone on host `host` (a UTS namespace): 0, or NO_HOST_NAME with why in message. */
static int enter_host(int host, char *message, size_t size) {
    char name[32];
    snprintf(name, sizeof name, "fsdp-recovery-host-%d", host);
    if (claim_host(name) == 0) return 0;
    snprintf(message, size, "cannot give a rank a host name of its own (a UTS namespace: as root, or in a user "
             "namespace): %s", strerror(errno));
    return NO_HOST_NAME;
}

/* Joins a socket world of the tests' secret at 127.0.0.1:port (inherit: a listener rank 0 takes,
   or NULL); fsdp_comm_init's result. A rebuild passes the world it replaces as parent: its key
   comes from that world's key, as a split's does (no new PBKDF2 stretch of the secret), and only
   ranks of that world can join. */
static int join_socket_world(fsdp_comm **comm, int rank, int world, int port, const char *job, int timeout_ms,
                             const fsdp_comm *parent, fsdp__inherit *inherit) {
    fsdp_comm_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.backend = FSDP_BACKEND_SOCKET;
    cd.rank = rank;
    cd.world_size = world;
    cd.master_addr = "127.0.0.1";
    cd.master_port = port;
    cd.timeout_ms = timeout_ms;
    cd.secret = "test-recovery-secret";
    cd.job = job;
    return fsdp__comm_create(comm, &cd, parent, inherit);
}

/* A listener on loopback for a rebuild's rendezvous, opened while the world is healthy (as a
   leader of recovery would at fsdp_init): its fd, its port in *port; -1 on failure. */
static int open_leader_listener(volatile int *port) {
    struct sockaddr_in at;
    socklen_t len = sizeof at;
    int fd;
    memset(&at, 0, sizeof at);
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((fd = fsdp__sock_listen(&at, 16)) < 0) return -1;
    if (getsockname(fd, (struct sockaddr *)&at, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(at.sin_port);
    return fd;
}

/* A rank of a socket world whose rank r claims host r / (world / hosts). */
static int host_rank(void *arg) {
    const world_plan *plan = (const world_plan *)arg;
    rank_report *r = &reports[plan->rank];
    fsdp_comm *comm = NULL;
    if (enter_host(plan->rank / (plan->world / plan->hosts), r->message, sizeof r->message)) return NO_HOST_NAME;
    r->rc = join_socket_world(&comm, plan->rank, plan->world, plan->port, plan->job, TIMEOUT_MS, NULL, NULL);
    if (r->rc != FSDP_SUCCESS) {
        snprintf(r->message, sizeof r->message, "fsdp_comm_init: %.300s", fsdp_comm_last_error(NULL));
        return 0;
    }
    init_context(comm, plan, r);
    fsdp_comm_destroy(comm);
    r->done = 1;
    return 0;
}

/* Runs the plan on `world` ranks: over plan->hosts hosts (sockets), or shm on this host (hosts
   0). Ignores the test where no host name can be had. */
static void run_world(world_plan *plan, int world) {
    world_plan plans[MAX_RANKS];
    pid_t pids[MAX_RANKS];
    int status[MAX_RANKS], r, no_host_name = -1;
    fsdp_launch_status ls;
    memset(reports, 0, sizeof *reports * MAX_RANKS);
    if (!plan->hosts) {
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, launch_ranks(world, FSDP_BACKEND_SHM, TIMEOUT_MS, shm_rank, plan, &ls));
        return;
    }
    plan->port = pick_free_port();
    plan->world = world;
    snprintf(plan->job, sizeof plan->job, "recovery-%d", (int)getpid());
    for (r = 0; r < world; r++) {
        plans[r] = *plan;
        plans[r].rank = r;
        pids[r] = spawn(host_rank, &plans[r], 60);
    }
    for (r = 0; r < world; r++)
        if ((status[r] = reap(pids[r], 60000)) == NO_HOST_NAME) no_host_name = r;
    if (no_host_name >= 0) TEST_IGNORE_MESSAGE(reports[no_host_name].message);
    for (r = 0; r < world; r++) TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], reports[r].message);
}

static world_plan plan_of(fsdp_strategy strategy, int shard_group_size, int recovery, int hosts) {
    world_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.strategy = strategy;
    plan.shard_group_size = shard_group_size;
    plan.recovery = recovery;
    plan.hosts = hosts;
    return plan;
}

static void assert_every_rank_refused(int world, int rc, const char *says) {
    int r;
    for (r = 0; r < world; r++) {
        TEST_ASSERT_TRUE_MESSAGE(reports[r].done, reports[r].message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(rc, reports[r].rc, reports[r].message);
        assert_says(reports[r].message, says);
    }
}

static void test_recovery_with_full_shard_is_refused_naming_the_unit_and_strategy(void) {
    world_plan plan = plan_of(FSDP_FULL_SHARD, 0, 1, 0);
    run_world(&plan, 2);
    assert_every_rank_refused(2, FSDP_ERR_INVALID_ARG, "recovery needs HYBRID_SHARD");
    assert_says(reports[0].message, "unit '(root)' is FULL_SHARD");
}

static void test_recovery_with_every_replica_on_one_host_is_refused_naming_it(void) {
    world_plan plan = plan_of(FSDP_HYBRID_SHARD, 2, 1, 0);
    run_world(&plan, 4);
    assert_every_rank_refused(4, FSDP_ERR_INVALID_ARG, "the 4 ranks are on one host");
}

static void test_recovery_with_two_replicas_sharing_a_host_is_refused_naming_them(void) {
    world_plan plan = plan_of(FSDP_HYBRID_SHARD, 1, 1, 2);
    run_world(&plan, 4);
    assert_every_rank_refused(4, FSDP_ERR_INVALID_ARG, "replicas 0 and 1 share host 0");
}

static void test_recovery_over_hosts_of_their_own_is_accepted_and_trains_in_epoch_0(void) {
    world_plan plan = plan_of(FSDP_HYBRID_SHARD, 2, 1, 2);
    int r;
    plan.train = 1;
    run_world(&plan, 4);
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[r].rc, reports[r].message);
        TEST_ASSERT_EQUAL_INT(2, reports[r].report_replicas);
        TEST_ASSERT_EQUAL_INT(0, (int)reports[r].report_epoch);
        TEST_ASSERT_EQUAL_INT(0, reports[r].report_dropped);
    }
}

static void test_recovery_with_an_update_that_streams_is_refused_naming_it(void) {
    world_plan plan = plan_of(FSDP_HYBRID_SHARD, 2, 1, 2);
    int overlap;
    for (overlap = 0; overlap <= 1; overlap++) { /* bf16 state; f32 state behind the next forward */
        plan.bf16_state = !overlap;
        plan.overlap_step = overlap;
        run_world(&plan, 4);
        assert_every_rank_refused(4, FSDP_ERR_UNSUPPORTED, "recovery cannot continue an update that streams (offload, "
                                  "bf16 state, overlap_step) on a new world yet");
    }
}

static void test_replicas_of_hybrid_over_hosts_are_the_shard_groups_in_query_and_report(void) {
    world_plan plan = plan_of(FSDP_HYBRID_SHARD, 0, 0, 2);
    int r;
    plan.train = 1;
    run_world(&plan, 4);
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[r].rc, reports[r].message);
        TEST_ASSERT_EQUAL_INT(2, reports[r].count);
        TEST_ASSERT_EQUAL_INT(r / 2, reports[r].index);
        TEST_ASSERT_EQUAL_INT(2, reports[r].report_replicas);
        TEST_ASSERT_EQUAL_INT(0, (int)reports[r].report_epoch);
        TEST_ASSERT_EQUAL_INT(0, reports[r].report_dropped);
    }
}

static void test_replicas_of_full_shard_are_one_and_of_no_shard_every_rank(void) {
    world_plan plan = plan_of(FSDP_FULL_SHARD, 0, 0, 0);
    int r;
    run_world(&plan, 3);
    for (r = 0; r < 3; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[r].rc, reports[r].message);
        TEST_ASSERT_EQUAL_INT(1, reports[r].count);
        TEST_ASSERT_EQUAL_INT(0, reports[r].index);
    }
    plan.strategy = FSDP_NO_SHARD;
    run_world(&plan, 3);
    for (r = 0; r < 3; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, reports[r].rc, reports[r].message);
        TEST_ASSERT_EQUAL_INT(3, reports[r].count);
        TEST_ASSERT_EQUAL_INT(r, reports[r].index);
    }
}

static void test_replicas_of_a_null_context_are_zero_and_invalid(void) {
    int count = 5, index = 5;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_INVALID_ARG, fsdp_replicas(NULL, &count, &index));
    TEST_ASSERT_EQUAL_INT(0, count);
    TEST_ASSERT_EQUAL_INT(0, index);
}

/* ---------------------------------------------------------------------------------------------
   how a lost replica shows in the comms today: 2 hosts of 2 ranks, the replica comms between them
   --------------------------------------------------------------------------------------------- */
#define LOSS_COUNT 4096 /* floats per all_reduce of the replica comm */
#define LOSS_OP_TIMEOUT_MS 2000

typedef struct loss_board {
    volatile int ops[MAX_RANKS];   /* replica all_reduces done, per rank */
    volatile double kill_ms;       /* when the parent signalled host 1 (now_ms) */
    volatile double fail_ms[MAX_RANKS];
    volatile int op_rc[MAX_RANKS], shard_rc[MAX_RANKS], done[MAX_RANKS];
    /* with a rebuild: the survivors' new replica comm */
    volatile int rebuild_port[2], rebuild_rc[MAX_RANKS], rebuilt_right[MAX_RANKS];
    volatile double rebuilt_ms[MAX_RANKS], next_op_ms[MAX_RANKS];
    /* the comms' report of the lost peer (1 + its rank in the replica comm: silent, or reset), and with watch_ms
       (fsdp__comm_watch on world and replica) what the kernel was told per link: [0] the replica
       comm's link to the other host, [1] the world's to the other host, [2] the world's to this
       host's other rank (-1: no connection); keepalive on, and the user timeout */
    int watch_ms;
    int count;                     /* floats per replica all_reduce (0: LOSS_COUNT) */
    volatile int lost_peer[MAX_RANKS], reset_peer[MAX_RANKS], keepalive[MAX_RANKS][3], user_timeout[MAX_RANKS][3];
    char message[MAX_RANKS][400];
} loss_board;

static loss_board *loss; /* MAP_SHARED before any fork */

/* What recovery will do after a loss, done by hand with today's calls: the survivors of replica
   column me % 2 (hosts 0 .. hosts - 2: the last host is the one lost) make a new socket comm
   among themselves, its rendezvous at the listener its leader (host 0's rank) opened while the
   world was healthy (listen_fd; the design's step 3), and all_reduce over it; every value is an
   integer, so the sum over the survivors is exact. */
static void loss_rebuild(const fsdp_comm *old_world, int me, int hosts, const char *job, float *buf, int listen_fd) {
    fsdp__inherit inherit;
    fsdp_comm *replica = NULL;
    char token[48];
    float want = 0;
    int h, i, right = 1;
    memset(&inherit, 0, sizeof inherit);
    inherit.listen_fd = listen_fd;
    snprintf(token, sizeof token, "%s-rebuilt-%d", job, me % 2);
    if ((loss->rebuild_rc[me] = join_socket_world(&replica, me / 2, hosts - 1, loss->rebuild_port[me % 2], token,
                                                  LOSS_OP_TIMEOUT_MS, old_world, &inherit)) != 0) {
        copy_text(loss->message[me], sizeof loss->message[me], fsdp_comm_last_error(NULL));
        return;
    }
    loss->rebuilt_ms[me] = now_ms();
    for (i = 0; i < LOSS_COUNT; i++) buf[i] = (float)(me + 1);
    loss->rebuild_rc[me] = fsdp_all_reduce(replica, buf, buf, LOSS_COUNT, FSDP_F32, FSDP_SUM);
    loss->next_op_ms[me] = now_ms();
    for (h = 0; h < hosts - 1; h++) want += (float)(2 * h + me % 2 + 1);
    for (i = 0; i < LOSS_COUNT; i++) right &= buf[i] == want;
    loss->rebuilt_right[me] = right;
    if (loss->rebuild_rc[me]) copy_text(loss->message[me], sizeof loss->message[me], fsdp_comm_last_error(replica));
    fsdp_comm_destroy(replica);
}

/* The socket connection of comm to peer (a socket world's, or a hierarchical one's link): its fd,
   or -1. */
static int link_fd(const fsdp_comm *comm, int peer) {
    const fsdp__sock *s = comm->transport == &fsdp__sock_transport ? (const fsdp__sock *)comm->impl
                          : comm->transport == &fsdp__hier_transport ? ((const fsdp__hier *)comm->impl)->net : NULL;
    return s ? s->peers[peer].fd : -1;
}

/* What the kernel was told about comm's link to peer: keepalive (-1: no link) and the user timeout. */
static void link_watch(const fsdp_comm *comm, int peer, volatile int *keepalive, volatile int *user_timeout) {
    int fd = link_fd(comm, peer), on = 0;
    unsigned int ms = 0;
    socklen_t len = sizeof on;
    *keepalive = -1;
    if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &len) != 0) return;
    len = sizeof ms;
    getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, &len);
    *keepalive = on;
    *user_timeout = (int)ms;
}

/* With loss->watch_ms: the links watched, and what the kernel holds for them recorded. */
static int loss_watch(fsdp_comm *world, fsdp_comm *replica, int me) {
    if (!loss->watch_ms) return 0;
    if (fsdp__comm_watch(world, loss->watch_ms) != 0 || fsdp__comm_watch(replica, loss->watch_ms) != 0) return -1;
    link_watch(replica, 1 - fsdp_comm_rank(replica), &loss->keepalive[me][0], &loss->user_timeout[me][0]);
    link_watch(world, me ^ 2, &loss->keepalive[me][1], &loss->user_timeout[me][1]);
    link_watch(world, me ^ 1, &loss->keepalive[me][2], &loss->user_timeout[me][2]);
    return 0;
}

/* A rank of host rank / 2 (plan->hosts hosts of 2 ranks): replica all_reduces until one fails
   (or 60 s), then one all_reduce on its host's shard comm, and with plan->train (here: rebuild)
   the survivors' new replica comm (the leaders publish their listeners' ports in the board
   before their first op, so before the parent kills anything). */
static int loss_rank(void *arg) {
    const world_plan *plan = (const world_plan *)arg;
    int me = plan->rank, rc = 0, listen_fd = -1;
    fsdp_comm *world = NULL, *shard = NULL, *replica = NULL;
    size_t count = loss->count ? (size_t)loss->count : LOSS_COUNT;
    float *buf = (float *)calloc(count, sizeof(float));
    double until = now_ms() + 60000;
    if (enter_host(me / 2, loss->message[me], sizeof loss->message[me])) return NO_HOST_NAME;
    if (!buf || join_socket_world(&world, me, plan->world, plan->port, plan->job, LOSS_OP_TIMEOUT_MS, NULL, NULL) ||
        fsdp_comm_split(world, me / 2, me, &shard) != 0 ||
        fsdp_comm_split(world, me % 2, me, &replica) != 0) {
        snprintf(loss->message[me], sizeof loss->message[me], "setting up: %.300s", fsdp_comm_last_error(world));
        return 1;
    }
    if (plan->train && me < 2 && (listen_fd = open_leader_listener(&loss->rebuild_port[me])) < 0) return 1;
    if (loss_watch(world, replica, me) != 0) {
        snprintf(loss->message[me], sizeof loss->message[me], "fsdp__comm_watch: %s", strerror(errno));
        return 1;
    }
    while (rc == 0 && now_ms() < until) {
        rc = fsdp_all_reduce(replica, buf, buf, count, FSDP_F32, FSDP_SUM);
        if (!rc) loss->ops[me]++;
    }
    loss->fail_ms[me] = now_ms();
    loss->op_rc[me] = rc;
    loss->lost_peer[me] = fsdp__load(&replica->lost_peer);
    loss->reset_peer[me] = fsdp__load(&replica->reset_peer);
    copy_text(loss->message[me], sizeof loss->message[me], fsdp_comm_last_error(replica));
    loss->shard_rc[me] = fsdp_all_reduce(shard, buf, buf, LOSS_COUNT, FSDP_F32, FSDP_SUM);
    if (plan->train) loss_rebuild(world, me, plan->hosts, plan->job, buf, listen_fd);
    loss->done[me] = 1;
    fsdp_comm_destroy(replica);
    fsdp_comm_destroy(shard);
    fsdp_comm_destroy(world);
    free(buf);
    return 0;
}

/* Starts hosts x 2 ranks, lets the replica comms run, sends sig to the last host's ranks, and
   waits for the survivors (rebuild: they then make a new replica comm). Ignores the test where
   no host name can be had. */
static void run_loss_of(int hosts, int sig, int rebuild, int watch_ms, int count) {
    world_plan plan;
    pid_t pids[MAX_RANKS];
    int r, status[MAX_RANKS], world = 2 * hosts, survivors = world - 2;
    double until;
    memset(loss, 0, sizeof *loss);
    loss->watch_ms = watch_ms;
    loss->count = count;
    memset(&plan, 0, sizeof plan);
    plan.port = pick_free_port();
    plan.world = world;
    plan.hosts = hosts;
    plan.train = rebuild;
    snprintf(plan.job, sizeof plan.job, "loss-%d-%d", (int)getpid(), sig);
    for (r = 0; r < world; r++) {
        world_plan mine = plan;
        mine.rank = r;
        pids[r] = spawn(loss_rank, &mine, 90);
    }
    for (until = now_ms() + 30000; now_ms() < until;) {
        for (r = 0; r < survivors && loss->ops[r] >= 20; r++) {}
        if (r == survivors) break;
        sleep_ms(5);
    }
    loss->kill_ms = now_ms();
    kill(pids[world - 2], sig);
    kill(pids[world - 1], sig);
    for (r = 0; r < survivors; r++) status[r] = reap(pids[r], 30000);
    for (r = survivors; r < world; r++) {
        kill(pids[r], SIGKILL); /* (a stopped rank too) */
        status[r] = reap(pids[r], 5000);
    }
    for (r = 0; r < world; r++)
        if (status[r] == NO_HOST_NAME) TEST_IGNORE_MESSAGE(loss->message[r]);
    for (r = 0; r < survivors; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], loss->message[r]);
        TEST_ASSERT_TRUE_MESSAGE(loss->ops[r] >= 20, loss->message[r]);
        TEST_ASSERT_TRUE_MESSAGE(loss->done[r], loss->message[r]);
    }
}

static void run_loss(int hosts, int sig, int rebuild, int watch_ms) { run_loss_of(hosts, sig, rebuild, watch_ms, 0); }

static void test_replica_lost_by_reset_shows_at_once_as_peer_lost_and_the_shard_comm_stays_healthy(void) {
    int r;
    run_loss(2, SIGKILL, 0, 0);
    for (r = 0; r < 2; r++) {
        char what[600];
        snprintf(what, sizeof what, "rank %d: detected after %.1f ms: %s", r, loss->fail_ms[r] - loss->kill_ms,
                 loss->message[r]);
        printf("%s\n", what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PEER_LOST, loss->op_rc[r], what);
        assert_says(loss->message[r], "rank 1 ("); /* the peer: rank 1 of the replica comm */
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, loss->reset_peer[r], what); /* (1 + rank 1: recovery asks its listener) */
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, loss->lost_peer[r], what); /* (a reset is no proof it cannot be reached) */
        TEST_ASSERT_TRUE_MESSAGE(loss->fail_ms[r] - loss->kill_ms < LOSS_OP_TIMEOUT_MS / 2, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, loss->shard_rc[r], what);
    }
}

static void test_replica_gone_silent_shows_at_the_op_timeout_and_the_shard_comm_stays_healthy(void) {
    int r;
    run_loss(2, SIGSTOP, 0, 0);
    for (r = 0; r < 2; r++) {
        char what[600];
        double took = loss->fail_ms[r] - loss->kill_ms;
        snprintf(what, sizeof what, "rank %d: detected after %.1f ms: %s", r, took, loss->message[r]);
        printf("%s\n", what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, loss->op_rc[r], what);
        TEST_ASSERT_TRUE_MESSAGE(took >= LOSS_OP_TIMEOUT_MS * 0.9 && took < LOSS_OP_TIMEOUT_MS * 3, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, loss->lost_peer[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, loss->shard_rc[r], what);
    }
}

#define LOSS_WATCH_MS 500 /* detect_ms for the watched links: well under the op timeout */

/* (and no TCP_USER_TIMEOUT, which ends a link whose window stays closed: the straggler's test) */
static void test_watched_links_to_other_hosts_carry_keepalive_and_links_inside_a_host_do_not(void) {
    int r;
    run_loss(2, SIGKILL, 0, LOSS_WATCH_MS);
    for (r = 0; r < 2; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, loss->keepalive[r][0], "the replica comm's link to the other host");
        TEST_ASSERT_EQUAL_INT(0, loss->user_timeout[r][0]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, loss->keepalive[r][1], "the world's link to the other host");
        TEST_ASSERT_EQUAL_INT(0, loss->user_timeout[r][1]);
        TEST_ASSERT_TRUE_MESSAGE(loss->keepalive[r][2] <= 0, "the world's link inside this host");
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PEER_LOST, loss->op_rc[r], loss->message[r]);
    }
}

/* A stopped process's kernel still answers keepalive probes and acknowledges data: to the kernel
   it is a straggler, not a vanished host, so the watch does not take it for lost and only the op
   timeout finds it (recovery then treats it as lost: it failed). */
static void test_stopped_peer_on_watched_links_is_found_at_the_op_timeout_not_at_detect_ms(void) {
    int r;
    run_loss(2, SIGSTOP, 0, LOSS_WATCH_MS);
    for (r = 0; r < 2; r++) {
        char what[600];
        double took = loss->fail_ms[r] - loss->kill_ms;
        snprintf(what, sizeof what, "rank %d: detected after %.1f ms: %s", r, took, loss->message[r]);
        printf("%s\n", what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(1, loss->keepalive[r][0], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_TIMEOUT, loss->op_rc[r], what);
        TEST_ASSERT_TRUE_MESSAGE(took >= LOSS_OP_TIMEOUT_MS * 0.9, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, loss->lost_peer[r], what);
    }
}

/* A straggler: rank 1 (another host) joins a 16 MiB all_reduce STRAGGLE_MS late, reading nothing
   meanwhile: rank 0's data fills its buffers, its window closes, and rank 0's kernel probes it,
   answered by rank 1's kernel. With the links watched (detect_ms 500) the op must wait for it
   (timeout 20 s) and succeed: with TCP_USER_TIMEOUT on the link, as before, rank 0's kernel
   ended the connection once the window had stayed closed for 400 ms ("Connection timed out": a
   straggler taken for a vanished host). */
#define STRAGGLE_MS 2500
#define STRAGGLE_COUNT (4 << 20)

static int straggler_rank(void *arg) {
    const world_plan *plan = (const world_plan *)arg;
    int me = plan->rank, i, right = 1;
    fsdp_comm *comm = NULL;
    float *buf = (float *)calloc(STRAGGLE_COUNT, sizeof(float));
    if (enter_host(me, loss->message[me], sizeof loss->message[me])) return NO_HOST_NAME;
    if (!buf || join_socket_world(&comm, me, 2, plan->port, plan->job, TIMEOUT_MS, NULL, NULL) != 0 ||
        fsdp__comm_watch(comm, LOSS_WATCH_MS) != 0) {
        snprintf(loss->message[me], sizeof loss->message[me], "setting up: %.300s", fsdp_comm_last_error(NULL));
        return 1;
    }
    for (i = 0; i < STRAGGLE_COUNT; i++) buf[i] = (float)(me + 1);
    if (me == 1) sleep_ms(STRAGGLE_MS);
    loss->op_rc[me] = fsdp_all_reduce(comm, buf, buf, STRAGGLE_COUNT, FSDP_F32, FSDP_SUM);
    for (i = 0; i < STRAGGLE_COUNT; i++) right &= buf[i] == 3.0f;
    loss->ops[me] = right;
    copy_text(loss->message[me], sizeof loss->message[me], fsdp_comm_last_error(comm));
    fsdp_comm_destroy(comm);
    free(buf);
    return 0;
}

static void test_straggler_whose_window_stays_closed_longer_than_detect_ms_is_waited_for_not_lost(void) {
    world_plan plan;
    pid_t pids[2];
    int r, status[2];
    memset(loss, 0, sizeof *loss);
    memset(&plan, 0, sizeof plan);
    plan.port = pick_free_port();
    snprintf(plan.job, sizeof plan.job, "straggler-%d", (int)getpid());
    for (r = 0; r < 2; r++) {
        world_plan mine = plan;
        mine.rank = r;
        pids[r] = spawn(straggler_rank, &mine, 60);
    }
    for (r = 0; r < 2; r++) status[r] = reap(pids[r], 45000);
    for (r = 0; r < 2; r++)
        if (status[r] == NO_HOST_NAME) TEST_IGNORE_MESSAGE(loss->message[r]);
    for (r = 0; r < 2; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], loss->message[r]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, loss->op_rc[r], loss->message[r]);
        TEST_ASSERT_TRUE_MESSAGE(loss->ops[r], "the sum is not 3 everywhere");
    }
}

static void test_survivors_of_a_lost_host_rebuild_a_replica_comm_that_sums_over_them(void) {
    int r;
    run_loss(3, SIGKILL, 1, 0);
    for (r = 0; r < 4; r++) {
        char what[600];
        snprintf(what, sizeof what, "rank %d: detected after %.1f ms, a new replica comm %.1f ms later, its first "
                 "all_reduce of %d floats %.1f ms after that: %s", r, loss->fail_ms[r] - loss->kill_ms,
                 loss->rebuilt_ms[r] - loss->fail_ms[r], LOSS_COUNT, loss->next_op_ms[r] - loss->rebuilt_ms[r],
                 loss->message[r]);
        printf("%s\n", what);
        /* (PEER_LOST where this rank saw the reset, ABORTED naming it where a peer told it first) */
        TEST_ASSERT_TRUE_MESSAGE(loss->op_rc[r] == FSDP_ERR_PEER_LOST || loss->op_rc[r] == FSDP_ERR_ABORTED, what);
        assert_says(loss->message[r], "rank 2 (");
        assert_says(loss->message[r], "closed its connection");
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, loss->shard_rc[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, loss->rebuild_rc[r], what);
        TEST_ASSERT_TRUE_MESSAGE(loss->rebuilt_right[r], what);
    }
}

/* ---------------------------------------------------------------------------------------------
   the survivors' runtime after a loss, on one host: 3 replicas of 2 ranks (shared memory); the
   loss is simulated (rank 5 aborts its replica comm in the backward of step LOSS_STEP, and its
   replica's ranks leave once everything stopped), its detection being the comms' (above). The
   survivors stop what was in flight (fsdp__recovery_quiesce), undo the iteration
   (fsdp__recovery_reset: the step dropped), make a new world and its groups by hand (the
   rebuild to come) and continue on them (fsdp__recovery_adopt) to the last step.
   --------------------------------------------------------------------------------------------- */
#define SURVIVE_WORLD 6
#define SURVIVE_STEPS 8
#define LOSS_STEP 3
#define SURVIVE_NUMEL 32 /* the weight of Linear(4 -> 8) */
#define SURVIVE_LR 0.25f

typedef struct survive_board {
    char job[40];
    int hosts;             /* 0: shared memory, the loss simulated; 3: hosts of 2 ranks, host 2 killed */
    int no_recovery;       /* 1: a survivor stops at the loss, as every rank does without recovery */
    int lost;              /* the replica lost (its ranks 2 lost, 2 lost + 1) */
    int port;              /* hosts: the world's rendezvous */
    volatile int leader_port[SURVIVE_WORLD]; /* hosts: the listener of each replica's first rank */
    float init[SURVIVE_NUMEL];
    float final[SURVIVE_WORLD][SURVIVE_NUMEL];
    int failed_at[SURVIVE_WORLD], finished[SURVIVE_WORLD], step_count[SURVIVE_WORLD], rc[SURVIVE_WORLD];
    /* each survivor's view after the loss (the rendezvous to come will carry them) */
    volatile int view_ready[SURVIVE_WORLD];
    int64_t view_step[SURVIVE_WORLD];
    double killed_ms[SURVIVE_WORLD], detected_ms[SURVIVE_WORLD], rebuilt_ms[SURVIVE_WORLD], next_step_ms[SURVIVE_WORLD];
    char message[SURVIVE_WORLD][400];
} survive_board;

static survive_board *survive;

/* The gradient rank r's data gives element i at step t: small integers, so every sum is exact. */
static float survive_grad(int t, int r, int i) { return (float)((t * 7 + r * 5 + i * 3) % 11) - 5.0f; }

/* The model of the runtime tests, Linear(4 -> 8) (its weight's id in *weight), and its
   HYBRID_SHARD description over comm: replicas of 2 ranks, SGD at SURVIVE_LR. */
static fsdp_model *survive_model(int *weight) {
    fsdp_init_rule rule;
    fsdp_model *m = NULL;
    int64_t shape[2] = {8, 4};
    memset(&rule, 0, sizeof rule);
    rule.kind = FSDP_INIT_NORMAL;
    rule.b = 0.5f;
    fsdp_model_create(&m, "Net");
    *weight = fsdp_model_param(m, fsdp_model_module(m, 0, "fc", "Linear"), "weight", 2, shape, rule);
    return m;
}

static fsdp_desc survive_desc(fsdp_comm *comm) {
    fsdp_desc d;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.strategy = FSDP_HYBRID_SHARD;
    d.shard_group_size = 2;
    d.optimizer.lr = SURVIVE_LR;
    return d;
}

/* One iteration of rank me (its data index) at step t. At LOSS_STEP replica survive->lost is lost
   in the backward: on hosts its ranks die of SIGKILL (their connections reset); on shared memory
   its second rank aborts its replica comm (the loss simulated). */
static int survive_iteration(fsdp_ctx *ctx, int w, int t, int me) {
    float *g;
    int i, rc;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0 || (rc = fsdp_post_forward(ctx, 0)) != 0 ||
        (rc = fsdp_pre_backward(ctx, 0)) != 0)
        return rc;
    if (!(g = fsdp_grad(ctx, w))) return FSDP_ERR_STATE;
    for (i = 0; i < SURVIVE_NUMEL; i++) g[i] += survive_grad(t, me, i);
    if (t == LOSS_STEP && me / 2 == survive->lost && survive->hosts) {
        survive->killed_ms[me] = now_ms();
        raise(SIGKILL);
    }
    if (t == LOSS_STEP && me == 2 * survive->lost + 1) fsdp_comm_abort(ctx->hybrid_replica_comm, "test: replica lost");
    if ((rc = fsdp_post_backward(ctx, 0)) != 0 || (rc = fsdp_step(ctx, 0, NULL)) != 0) return rc;
    return fsdp_zero_grad(ctx);
}

/* The survivors' new world of 4 (a token of this run, its key from the old world's; on hosts:
   sockets, its rendezvous at the listener the leader, the old rank of the new rank 0, opened
   before training: listen_fd there) and its groups, adopted. */
static int survive_rebuild(fsdp_ctx *ctx, const fsdp_comm *old_world, int rank, int leader, fsdp_comm **world,
                           int listen_fd) {
    fsdp__inherit inherit;
    fsdp_comm_desc cd;
    fsdp_comm *shard = NULL, *replica = NULL;
    char job[48];
    int rc;
    memset(&inherit, 0, sizeof inherit);
    inherit.listen_fd = listen_fd;
    memset(&cd, 0, sizeof cd);
    snprintf(job, sizeof job, "%s-rebuilt", survive->job);
    cd.backend = survive->hosts ? FSDP_BACKEND_SOCKET : FSDP_BACKEND_SHM;
    cd.rank = rank;
    cd.world_size = SURVIVE_WORLD - 2;
    cd.timeout_ms = TIMEOUT_MS;
    cd.job = job;
    cd.master_addr = "127.0.0.1";
    cd.master_port = survive->leader_port[leader];
    if ((rc = fsdp__comm_create(world, &cd, old_world, &inherit)) != 0 ||
        (rc = fsdp_comm_split(*world, rank / 2, rank, &shard)) != 0 ||
        (rc = fsdp_comm_split(*world, rank % 2, rank, &replica)) != 0)
        return rc;
    return fsdp__recovery_adopt(ctx, *world, shard, replica);
}

/* The agreement, with the board standing in for the rendezvous to come: this survivor posts its
   view (its step; it reaches every replica but the lost one, standing in for the comms' report
   of the lost peers), waits up to 5 s for the views of the ranks of the replicas it reaches, and
   decides with fsdp__recovery_decide as every survivor does. *new_rank: its rank among the
   survivors, -1 if it leaves; *leader: the old rank of the new rank 0 (the rendezvous). */
static int survive_agree(fsdp_ctx *ctx, int me, int *new_rank, int *leader, char *why, size_t why_size) {
    unsigned char reach[3] = {1, 1, 1};
    int last_ids[3] = {0, 1, 2}, next_ids[3], r, n = 0, k, heard;
    fsdp__membership last, next;
    fsdp__recovery_view views[SURVIVE_WORLD];
    int64_t target;
    double until = now_ms() + 5000;
    reach[survive->lost] = 0;
    survive->view_step[me] = ctx->step;
    __sync_synchronize();
    survive->view_ready[me] = 1;
    do {
        for (r = 0, heard = 0; r < SURVIVE_WORLD; r++) heard += reach[r / 2] && survive->view_ready[r];
    } while (heard < SURVIVE_WORLD - 2 && now_ms() < until && (sleep_ms(1), 1));
    __sync_synchronize();
    memset(views, 0, sizeof views);
    for (r = 0; r < SURVIVE_WORLD; r++) {
        if (!survive->view_ready[r]) continue;
        views[n].rank = r;
        views[n].replica = r / 2;
        views[n].step = survive->view_step[r];
        views[n++].reach = reach;
    }
    last.epoch = 0;
    last.count = last.total = 3;
    last.replicas = last_ids;
    next.replicas = next_ids;
    if ((r = fsdp__recovery_decide(&last, 2, 1, views, n, &next, &target, why, why_size)) != 0) return r;
    if (target != ctx->step)
        return fsdp__fmt(why, why_size, "a survivor one step behind: not built yet"), FSDP_ERR_STATE;
    for (k = 0, *new_rank = -1; k < next.count; k++)
        if (next.replicas[k] == me / 2) *new_rank = 2 * k + me % 2;
    *leader = 2 * next.replicas[0];
    return 0;
}

/* A rank's training: SURVIVE_STEPS steps, recovering from the loss by hand (replica 2 lost, its
   ranks leaving; the others agree and go on). */
static int survive_rank(fsdp_comm *comm, void *arg) {
    int me = fsdp_comm_rank(comm), t, rc = 0, w, listen_fd = arg ? *(int *)arg : -1, new_rank = -1, leader = -1;
    char why[FSDP__ERRMSG];
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_comm *world = NULL;
    fsdp_desc d;
    m = survive_model(&w);
    d = survive_desc(comm);
    if ((rc = fsdp_init(&ctx, m, &d)) == 0) rc = fsdp_gather_param(ctx, w, survive->final[me]); /* (collective) */
    if (!rc && me == 0) memcpy(survive->init, survive->final[0], sizeof survive->init);
    for (t = 0; !rc && t < SURVIVE_STEPS; t++) {
        if ((rc = survive_iteration(ctx, w, t, me)) == 0) {
            if (t == LOSS_STEP + 1) survive->next_step_ms[me] = now_ms();
            continue;
        }
        survive->detected_ms[me] = now_ms();
        survive->failed_at[me] = t + 1;
        if (survive->no_recovery) break;
        if ((rc = fsdp__recovery_quiesce(ctx, "a replica was lost")) != 0) break;
        if (me / 2 == survive->lost) break; /* its ranks take no part (on hosts they are dead) */
        if ((rc = survive_agree(ctx, me, &new_rank, &leader, why, sizeof why)) != 0 || new_rank < 0) {
            copy_text(survive->message[me], sizeof survive->message[me], why);
            break;
        }
        fsdp__recovery_reset(ctx);
        rc = survive_rebuild(ctx, comm, new_rank, leader, &world, me == leader ? listen_fd : -1);
        if (me == leader) listen_fd = -1; /* (taken over or closed) */
        survive->rebuilt_ms[me] = now_ms();
    }
    if (!rc && me / 2 != survive->lost && (rc = fsdp_gather_param(ctx, w, survive->final[me])) == 0)
        survive->finished[me] = 1;
    survive->step_count[me] = ctx ? (int)ctx->step : -1;
    survive->rc[me] = rc;
    if (rc && !survive->message[me][0])
        copy_text(survive->message[me], sizeof survive->message[me], fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    fsdp_comm_destroy(world);
    fsdp_model_destroy(m);
    if (listen_fd >= 0) close(listen_fd);
    return 0;
}

/* A rank on host me / 2 of a socket world; the first rank of each replica opens a listener for
   a rebuild first (a leader's, ready before any loss). */
static int survive_host_rank(void *arg) {
    int me = *(const int *)arg, listen_fd = -1;
    fsdp_comm *comm = NULL;
    if (enter_host(me / 2, survive->message[me], sizeof survive->message[me])) return NO_HOST_NAME;
    if (me % 2 == 0 && (listen_fd = open_leader_listener(&survive->leader_port[me])) < 0) return 1;
    if (join_socket_world(&comm, me, SURVIVE_WORLD, survive->port, survive->job, TIMEOUT_MS, NULL, NULL) != 0) {
        copy_text(survive->message[me], sizeof survive->message[me], fsdp_comm_last_error(NULL));
        return 1;
    }
    survive_rank(comm, &listen_fd);
    fsdp_comm_destroy(comm);
    return 0;
}

/* What the survivors must hold: SGD on the average over the replicas of each replica's average
   over its two ranks (their data: their ranks at the start), folded in rank order as the
   collectives fold; 3 replicas before the loss, the step of the loss applied nowhere, the 2 others
   after. */
static void survive_reference(float *weight) {
    int t, i, h;
    memcpy(weight, survive->init, sizeof survive->init);
    for (t = 0; t < SURVIVE_STEPS; t++) {
        int replicas = t < LOSS_STEP ? 3 : 2;
        if (t == LOSS_STEP) continue;
        for (i = 0; i < SURVIVE_NUMEL; i++) {
            float avg = 0, grad = 0;
            int folded = 0;
            for (h = 0; h < 3; h++) {
                float partial = (survive_grad(t, 2 * h, i) + survive_grad(t, 2 * h + 1, i)) / 2.0f;
                if (t > LOSS_STEP && h == survive->lost) continue;
                avg = folded++ == 0 ? partial : avg + partial;
            }
            grad += avg / (float)replicas;
            weight[i] -= SURVIVE_LR * (grad + 0.0f * weight[i]);
        }
    }
}

/* Forks the world over 3 hosts of 2 ranks and waits for it (the lost replica's ranks die of
   SIGKILL). Ignores the test where no host name can be had. */
static void run_hosts(void) {
    pid_t pids[SURVIVE_WORLD];
    int ranks[SURVIVE_WORLD], status[SURVIVE_WORLD], r;
    survive->port = pick_free_port();
    for (r = 0; r < SURVIVE_WORLD; r++) {
        ranks[r] = r;
        pids[r] = spawn(survive_host_rank, &ranks[r], 120);
    }
    for (r = 0; r < SURVIVE_WORLD; r++) status[r] = reap(pids[r], 100000);
    for (r = 0; r < SURVIVE_WORLD; r++)
        if (status[r] == NO_HOST_NAME) TEST_IGNORE_MESSAGE(survive->message[r]);
    for (r = 0; r < SURVIVE_WORLD; r++)
        if (r / 2 != survive->lost) TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], survive->message[r]);
}

/* When the first of the lost replica's ranks died. */
static double survive_kill_ms(void) {
    const volatile double *killed = &survive->killed_ms[2 * survive->lost];
    return killed[0] < killed[1] ? killed[0] : killed[1];
}

/* Runs the world once (hosts 0: shared memory, the loss simulated; 3: over hosts, a real kill),
   replica `lost` lost; the survivors' final weights into finals. */
static void run_survival(int hosts, int lost, float finals[SURVIVE_WORLD - 2][SURVIVE_NUMEL]) {
    fsdp_launch_status ls;
    float want[SURVIVE_NUMEL];
    double kill_ms;
    int r, k = 0;
    memset(survive, 0, sizeof *survive);
    survive->hosts = hosts;
    survive->lost = lost;
    snprintf(survive->job, sizeof survive->job, "survive-%d-%d", (int)getpid(), hosts);
    if (hosts) run_hosts();
    else
        TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS,
                              launch_ranks(SURVIVE_WORLD, FSDP_BACKEND_SHM, TIMEOUT_MS, survive_rank, NULL, &ls));
    survive_reference(want);
    kill_ms = survive_kill_ms();
    for (r = 0; r < SURVIVE_WORLD; r++) {
        char what[600];
        snprintf(what, sizeof what, "rank %d: failed at step %d, %d steps taken: %s", r, survive->failed_at[r] - 1,
                 survive->step_count[r], survive->message[r]);
        if (r / 2 == lost && hosts) continue; /* (killed) */
        TEST_ASSERT_EQUAL_INT_MESSAGE(LOSS_STEP + 1, survive->failed_at[r], what);
        if (r / 2 == lost) continue;
        if (hosts)
            printf("rank %d: the loss detected %.1f ms after the kill, the world rebuilt and adopted %.1f ms later, "
                   "the next step done %.1f ms after the kill\n", r, survive->detected_ms[r] - kill_ms,
                   survive->rebuilt_ms[r] - survive->detected_ms[r], survive->next_step_ms[r] - kill_ms);
        TEST_ASSERT_TRUE_MESSAGE(survive->finished[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(SURVIVE_STEPS - 1, survive->step_count[r], what);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, survive->final[r], sizeof want, what);
        memcpy(finals[k++], survive->final[r], sizeof want);
    }
}

static void test_survivors_drop_the_step_of_the_loss_and_train_on_bitwise_equal_to_the_reference(void) {
    float finals[SURVIVE_WORLD - 2][SURVIVE_NUMEL];
    run_survival(0, 2, finals);
}

static void test_survivors_of_two_runs_with_the_same_loss_end_bitwise_equal(void) {
    float first[SURVIVE_WORLD - 2][SURVIVE_NUMEL], second[SURVIVE_WORLD - 2][SURVIVE_NUMEL];
    run_survival(0, 2, first);
    run_survival(0, 2, second);
    TEST_ASSERT_EQUAL_MEMORY(first, second, sizeof first);
}

static void test_without_recovery_a_host_killed_at_a_step_ends_every_survivor_naming_the_lost_rank(void) {
    int r;
    memset(survive, 0, sizeof *survive);
    survive->hosts = 3;
    survive->lost = 2;
    survive->no_recovery = 1;
    snprintf(survive->job, sizeof survive->job, "survive-%d-off", (int)getpid());
    run_hosts();
    for (r = 0; r < SURVIVE_WORLD - 2; r++) {
        double took = survive->detected_ms[r] - survive_kill_ms();
        char what[600];
        snprintf(what, sizeof what, "rank %d: failed at step %d after %.1f ms: %s", r, survive->failed_at[r] - 1, took,
                 survive->message[r]);
        TEST_ASSERT_EQUAL_INT_MESSAGE(LOSS_STEP + 1, survive->failed_at[r], what);
        TEST_ASSERT_TRUE_MESSAGE(survive->rc[r] == FSDP_ERR_PEER_LOST || survive->rc[r] == FSDP_ERR_ABORTED, what);
        assert_says(survive->message[r], "closed its connection");
        TEST_ASSERT_TRUE_MESSAGE(took < TIMEOUT_MS / 4, what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(LOSS_STEP, survive->step_count[r], what);
    }
}

static void test_survivors_of_a_host_killed_at_a_step_train_on_bitwise_equal_to_the_reference(void) {
    float first[SURVIVE_WORLD - 2][SURVIVE_NUMEL], second[SURVIVE_WORLD - 2][SURVIVE_NUMEL];
    run_survival(3, 2, first);
    run_survival(3, 2, second);
    TEST_ASSERT_EQUAL_MEMORY(first, second, sizeof first);
}

static void test_survivors_of_the_rendezvous_host_killed_train_on_bitwise_equal_to_the_reference(void) {
    float finals[SURVIVE_WORLD - 2][SURVIVE_NUMEL];
    run_survival(3, 0, finals);
}

/* ---------------------------------------------------------------------------------------------
   recovery through the public API: HOSTS fake hosts (UTS namespaces) of 2 ranks each, a socket
   world, HYBRID_SHARD with a replica per host and fsdp_desc.recovery on. The loop uses only the
   hooks and fsdp_step (data by the steps the report says were taken); the ranks of the hosts in
   lost_mask SIGKILL themselves in the backward of step API_LOSS_STEP. The survivors find the loss
   in fsdp_step (or a hook), agree at a rendezvous, make a new world and go on.
   --------------------------------------------------------------------------------------------- */
#define API_MAX_HOSTS 4
#define API_MAX_WORLD (2 * API_MAX_HOSTS)
#define API_STEPS 8
#define API_LOSS_STEP 3
#define API_DETECT_MS 3000
#define API_STOP_TIMEOUT_MS 4000 /* the op timeout where a host stops */
#define API_LATE_US 300000       /* a survivor that enters the agreement late: this long after the others */

typedef struct api_board {
    char job[40];
    int hosts, lost_mask, recovery, port;  /* lost_mask: bit h for host (replica) h */
    int loss_step[API_MAX_HOSTS];          /* the step host h is lost at (where lost_mask says) */
    int stop, timeout_ms;                  /* stop: the lost ranks stop (SIGSTOP) rather than die; the op timeout */
    float init[SURVIVE_NUMEL];
    float final[API_MAX_WORLD][SURVIVE_NUMEL];
    int rc[API_MAX_WORLD], steps[API_MAX_WORLD], finished[API_MAX_WORLD];
    float world_sum[API_MAX_WORLD];        /* 1 summed over fsdp_world_comm at the end: its ranks */
    int shard_right[API_MAX_WORLD];        /* shard_pointers_right at the end */
    int big;                               /* the weight is API_BIG_OUT x API_BIG_IN (the bits not checked) */
    int kill_after_us[API_MAX_WORLD];      /* > 0: a lost rank dies that long after its loss step's backward began */
    int stranger[API_MAX_WORLD];           /* a survivor that, before the loss, connects to rank 0's recovery
                                              listener and sends nothing (as a stranger, or a joiner come early) */
    int aborted_first[API_MAX_WORLD];      /* a survivor whose replica comm fails (as by another survivor's abort)
                                              before the loss reaches it, and that recovers API_LATE_US late */
    int last_replicas[API_MAX_WORLD];      /* the last step report's replica count */
    int dropped_at[API_MAX_WORLD], epoch[API_MAX_WORLD], replicas[API_MAX_WORLD], index[API_MAX_WORLD];
    double killed_ms, next_step_ms[API_MAX_WORLD];
    char message[API_MAX_WORLD][400];
} api_board;

static api_board *api;

#define API_BIG_IN 2048
#define API_BIG_OUT 2048 /* 16 MiB of f32: a rank's replica all_reduce of 8 MiB takes tens of ms on loopback */
#define API_RACE_RUNS 8  /* kill times 7 ms apart: without the fix about half the runs stopped (9 of 20) */

/* The model of rank me: survive_model's, or (api->big) a Linear(API_BIG_IN -> API_BIG_OUT). */
static fsdp_model *api_model(int *weight) {
    fsdp_init_rule rule;
    fsdp_model *m = NULL;
    int64_t shape[2] = {API_BIG_OUT, API_BIG_IN};
    if (!api->big) return survive_model(weight);
    memset(&rule, 0, sizeof rule);
    rule.kind = FSDP_INIT_NORMAL;
    rule.b = 0.5f;
    fsdp_model_create(&m, "Net");
    *weight = fsdp_model_param(m, fsdp_model_module(m, 0, "fc", "Linear"), "weight", 2, shape, rule);
    return m;
}

/* A lost rank's death while its step's transfers are in flight. */
static void *api_killer(void *arg) {
    usleep((useconds_t)(uintptr_t)arg);
    kill(getpid(), SIGKILL);
    return NULL;
}

static int api_lost(int rank) { return (api->lost_mask >> (rank / 2)) & 1; }

/* Whether host h trains at step t. */
static int api_trains(int h, int t) { return !((api->lost_mask >> h) & 1) || t < api->loss_step[h]; }

/* One iteration's hooks at step t (the lost ranks die in its backward at their loss step). */
static int api_hooks(fsdp_ctx *ctx, int w, int64_t t, int me) {
    float *g;
    int i, rc;
    if ((rc = fsdp_pre_forward(ctx, 0)) != 0 || (rc = fsdp_post_forward(ctx, 0)) != 0 ||
        (rc = fsdp_pre_backward(ctx, 0)) != 0)
        return rc;
    if (!(g = fsdp_grad(ctx, w))) return FSDP_ERR_STATE;
    for (i = 0; i < SURVIVE_NUMEL; i++) g[i] += survive_grad((int)t, me, i);
    if (api_lost(me) && t == api->loss_step[me / 2]) {
        pthread_t killer;
        api->killed_ms = now_ms();
        if (api->kill_after_us[me] <= 0 ||
            pthread_create(&killer, NULL, api_killer, (void *)(uintptr_t)api->kill_after_us[me]) != 0)
            raise(api->stop ? SIGSTOP : SIGKILL);
    }
    if (api->stranger[me] && t == API_LOSS_STEP) { /* (held open to the end: the process's exit closes it) */
        api->stranger[me] = 0;
        if (fsdp__sock_connect(&ctx->recovery->addr[0], fsdp__now_ms() + 5000) < 0) return FSDP_ERR_SYSTEM;
    }
    if (!api->aborted_first[me] || t != API_LOSS_STEP) return fsdp_post_backward(ctx, 0);
    api->aborted_first[me] = 0; /* (once: the step is taken again after the loss) */
    fsdp_comm_fail(ctx->hybrid_replica_comm, FSDP_ERR_ABORTED, "rank %d: another survivor's abort", me);
    rc = fsdp_post_backward(ctx, 0);
    usleep(API_LATE_US);
    return rc;
}

/* The training loop of rank me: API_STEPS steps; fsdp_step after the hooks whatever they
   returned (with recovery it recovers from a loss they saw). */
static int api_train(fsdp_ctx *ctx, int w, int me) {
    int64_t step = 0;
    int rc = 0, after_drop = 0;
    api->dropped_at[me] = -1;
    while (step < API_STEPS) {
        fsdp_step_report rep;
        api_hooks(ctx, w, step, me);
        if ((rc = fsdp_step(ctx, 0, &rep)) != 0) return rc;
        if (rep.dropped) api->dropped_at[me] = (int)step, api->epoch[me] = (int)rep.epoch, api->replicas[me] = rep.replicas;
        if (rep.dropped) fsdp_replicas(ctx, NULL, &api->index[me]);
        api->last_replicas[me] = rep.replicas;
        if (after_drop && !rep.dropped) api->next_step_ms[me] = now_ms(); /* (the first step after the last loss) */
        after_drop = rep.dropped;
        if ((rc = fsdp_zero_grad(ctx)) != 0) return rc;
        step = rep.step;
    }
    return 0;
}

static int api_rank(void *arg) {
    int me = *(const int *)arg, rc, w;
    fsdp_comm *comm = NULL;
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    if (enter_host(me / 2, api->message[me], sizeof api->message[me])) return NO_HOST_NAME;
    if (join_socket_world(&comm, me, 2 * api->hosts, api->port, api->job, api->timeout_ms, NULL, NULL) != 0) {
        copy_text(api->message[me], sizeof api->message[me], fsdp_comm_last_error(NULL));
        return 1;
    }
    m = api_model(&w);
    d = survive_desc(comm);
    d.recovery.enabled = api->recovery;
    d.recovery.detect_ms = API_DETECT_MS;
    if ((rc = fsdp_init(&ctx, m, &d)) == 0 && !api->big) rc = fsdp_gather_param(ctx, w, api->final[me]);
    if (!rc && me == 0) memcpy(api->init, api->final[0], sizeof api->init);
    if (!rc) rc = api_train(ctx, w, me);
    if (!rc && api->big) api->finished[me] = 1;
    else if (!rc && (rc = fsdp_gather_param(ctx, w, api->final[me])) == 0) api->finished[me] = 1;
    if (!rc && !api->big) api->shard_right[me] = shard_pointers_right(ctx, w, api->final[me], SURVIVE_NUMEL);
    if (!rc) { /* the loop's own collectives go over the world the context trains in (0 if that fails) */
        float one = 1;
        if (fsdp_all_reduce(fsdp_world_comm(ctx), &one, &api->world_sum[me], 1, FSDP_F32, FSDP_SUM)) api->world_sum[me] = 0;
    }
    api->steps[me] = ctx ? (int)ctx->step : -1;
    api->rc[me] = rc;
    if (rc) copy_text(api->message[me], sizeof api->message[me], fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    fsdp_comm_destroy(comm);
    return 0;
}

/* SGD on the average over the replicas training at each step of each replica's average over its
   two ranks, folded in rank order as the collectives fold: every replica before the loss, the
   survivors from the step of the loss on (dropped, then taken again by them). */
static void api_reference(float *weight) {
    int t, i, h;
    memcpy(weight, api->init, sizeof api->init);
    for (t = 0; t < API_STEPS; t++) {
        int replicas = 0;
        for (h = 0; h < api->hosts; h++) replicas += api_trains(h, t);
        for (i = 0; i < SURVIVE_NUMEL; i++) {
            float avg = 0;
            int folded = 0;
            for (h = 0; h < api->hosts; h++) {
                float partial = (survive_grad(t, 2 * h, i) + survive_grad(t, 2 * h + 1, i)) / 2.0f;
                if (!api_trains(h, t)) continue;
                avg = folded++ == 0 ? partial : avg + partial;
            }
            weight[i] -= SURVIVE_LR * (avg / (float)replicas + 0.0f * weight[i]);
        }
    }
}

/* The plan of a run: hosts x 2 ranks, the hosts of lost_mask lost at API_LOSS_STEP. */
static void api_plan(int hosts, int lost_mask, int recovery) {
    static int runs;
    int h;
    memset(api, 0, sizeof *api);
    for (h = 0; h < API_MAX_HOSTS; h++) api->loss_step[h] = API_LOSS_STEP;
    api->hosts = hosts;
    api->lost_mask = lost_mask;
    api->recovery = recovery;
    api->timeout_ms = TIMEOUT_MS;
    api->port = pick_free_port();
    snprintf(api->job, sizeof api->job, "api-%d-%d", (int)getpid(), runs++);
}

/* Forks the planned world and waits for the survivors, then ends the lost ranks (killed, or
   stopped). Ignores the test where no host name can be had. */
static void api_fork(void) {
    pid_t pids[API_MAX_WORLD];
    int ranks[API_MAX_WORLD], status[API_MAX_WORLD], r;
    for (r = 0; r < 2 * api->hosts; r++) {
        ranks[r] = r;
        pids[r] = spawn(api_rank, &ranks[r], 120);
    }
    for (r = 0; r < 2 * api->hosts; r++)
        if (!api_lost(r)) status[r] = reap(pids[r], 110000);
    for (r = 0; r < 2 * api->hosts; r++)
        if (api_lost(r)) {
            kill(pids[r], SIGKILL); /* (a stopped rank; one that died of it already: nothing) */
            status[r] = reap(pids[r], 5000);
        }
    for (r = 0; r < 2 * api->hosts; r++)
        if (status[r] == NO_HOST_NAME) TEST_IGNORE_MESSAGE(api->message[r]);
    for (r = 0; r < 2 * api->hosts; r++)
        if (!api_lost(r)) TEST_ASSERT_EQUAL_INT_MESSAGE(0, status[r], api->message[r]);
}

static void run_api(int hosts, int lost_mask, int recovery) {
    api_plan(hosts, lost_mask, recovery);
    api_fork();
}

/* Every survivor reached the last step with the reference's bits, reporting the last loss (at
   step last_loss, epoch `epoch`, `survivors` replicas left). */
static void assert_survivors_match_the_reference(int survivors, int last_loss, int epoch) {
    float want[SURVIVE_NUMEL];
    int r, k = 0;
    api_reference(want);
    for (r = 0; r < 2 * api->hosts; r++) {
        char what[600];
        if (api_lost(r)) continue;
        snprintf(what, sizeof what, "rank %d: %d steps, dropped at %d: %s", r, api->steps[r], api->dropped_at[r],
                 api->message[r]);
        printf("rank %d: the next step done %.1f ms after the kill\n", r, api->next_step_ms[r] - api->killed_ms);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, api->rc[r], what);
        TEST_ASSERT_TRUE_MESSAGE(api->finished[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(API_STEPS, api->steps[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(last_loss, api->dropped_at[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(epoch, api->epoch[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(survivors, api->replicas[r], what);
        TEST_ASSERT_EQUAL_INT_MESSAGE(k++ / 2, api->index[r], what);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(want, api->final[r], sizeof want, what);
    }
}

static void test_recovery_on_one_host_of_four_killed_survivors_train_on_bitwise_equal_to_the_reference(void) {
    run_api(4, 1 << 2, 1);
    assert_survivors_match_the_reference(3, API_LOSS_STEP, 1);
}

/* fsdp_world_comm after a recovery: the survivors' world, where the loop's own collectives (a
   loss's mean) go; desc.comm stays failed. */
static void test_recovery_on_one_host_of_four_killed_world_comm_spans_the_survivors(void) {
    int r;
    run_api(4, 1 << 2, 1);
    for (r = 0; r < 2 * api->hosts; r++)
        if (!api_lost(r)) TEST_ASSERT_EQUAL_FLOAT_MESSAGE(6.0f, api->world_sum[r], api->message[r]);
}

/* The master shards move into the new shard comm's memory: fsdp_param_info_get's pointers follow. */
static void test_recovery_on_one_host_of_four_killed_param_info_shards_read_and_set_the_parameter(void) {
    int r;
    run_api(4, 1 << 2, 1);
    for (r = 0; r < 2 * api->hosts; r++)
        if (!api_lost(r)) TEST_ASSERT_TRUE_MESSAGE(api->shard_right[r], api->message[r]);
}

static void test_recovery_on_the_rendezvous_host_killed_survivors_train_on_bitwise_equal_to_the_reference(void) {
    run_api(3, 1 << 0, 1);
    assert_survivors_match_the_reference(2, API_LOSS_STEP, 1);
}

/* The rendezvous host killed while a survivor of the next one learns of the loss only from
   another survivor's abort: it still believes host 0 alive and asks it first. A dead process's
   listener refuses at once, so it asks host 1 next without waiting, and is among the views that
   host 1 collects (it waited detect_ms on the refusals and came too late: host 1's replica, one
   view short, was dropped, and the survivors stopped as a minority). */
static void test_recovery_on_the_rendezvous_host_killed_a_survivor_that_believes_it_alive_asks_the_next_at_once(void) {
    int r;
    api_plan(3, 1 << 0, 1);
    api->aborted_first[3] = 1;
    api_fork();
    assert_survivors_match_the_reference(2, API_LOSS_STEP, 1);
    for (r = 2; r < 6; r++) {
        char what[100];
        double after_ms = api->next_step_ms[r] - api->killed_ms;
        snprintf(what, sizeof what, "rank %d: the next step %.1f ms after the kill", r, after_ms);
        TEST_ASSERT_TRUE_MESSAGE(after_ms < API_DETECT_MS, what);
    }
}

/* A connection to the rendezvous's listener that sends nothing, waiting there when the loss
   comes: the rendezvous reads every connection as its bytes come (it waited on that one alone
   until its collection ended, heard no other survivor, and every survivor stopped as a minority). */
static void test_recovery_with_a_stranger_at_the_rendezvous_survivors_match_the_reference(void) {
    api_plan(4, 1 << 2, 1);
    api->stranger[1] = 1;
    api_fork();
    assert_survivors_match_the_reference(3, API_LOSS_STEP, 1);
}

/* A host whose ranks stop (SIGSTOP) is alive to the kernel: the survivors' ops find it at the op
   timeout (short here), and recovery then goes on without it. */
static void test_recovery_on_a_host_stopped_survivors_go_on_after_the_op_timeout_bitwise_equal_to_the_reference(void) {
    int r;
    api_plan(3, 1 << 2, 1);
    api->stop = 1;
    api->timeout_ms = API_STOP_TIMEOUT_MS;
    api_fork();
    assert_survivors_match_the_reference(2, API_LOSS_STEP, 1);
    for (r = 0; r < 4; r++) {
        char what[100];
        snprintf(what, sizeof what, "rank %d: the next step %.1f ms after the stop", r, api->next_step_ms[r] - api->killed_ms);
        TEST_ASSERT_TRUE_MESSAGE(api->next_step_ms[r] - api->killed_ms >= API_STOP_TIMEOUT_MS * 0.9, what);
    }
}

/* The API_LOSS_STEP + 2 loss is the second (host 3 was lost at API_LOSS_STEP): run_api with the
   loss steps set first. */
static void test_recovery_on_two_hosts_of_four_lost_at_different_steps_survivors_train_on_in_epoch_2(void) {
    api_plan(4, (1 << 2) | (1 << 3), 1);
    api->loss_step[2] = API_LOSS_STEP + 2;
    api_fork();
    assert_survivors_match_the_reference(2, API_LOSS_STEP + 2, 2);
}

/* A host's ranks die while a large replica all_reduce is in flight: a survivor may see another
   survivor's abort (it stopped everything to recover) as a reset, that abort having arrived
   inside a message; a reset is no proof of a loss, so every survivor still reaches the others
   and the three go on (taken for lost, they split into minorities that each stopped). Several
   kill times, as the race wants. */
static void test_recovery_on_a_host_killed_inside_a_large_all_reduce_every_survivor_goes_on_with_the_other_two(void) {
    int run, r;
    for (run = 0; run < API_RACE_RUNS; run++) {
        api_plan(4, 1 << 2, 1);
        api->big = 1;
        api->kill_after_us[4] = 500 + 7000 * run, api->kill_after_us[5] = 1500 + 7000 * run;
        api_fork();
        for (r = 0; r < 2 * api->hosts; r++) {
            char what[600];
            if (api_lost(r)) continue;
            snprintf(what, sizeof what, "run %d (kills %d, %d us after the backward began), rank %d: %s", run,
                     api->kill_after_us[4], api->kill_after_us[5], r, api->message[r]);
            TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, api->rc[r], what);
            TEST_ASSERT_EQUAL_INT_MESSAGE(API_STEPS, api->steps[r], what);
            TEST_ASSERT_EQUAL_INT_MESSAGE(3, api->last_replicas[r], what);
        }
    }
}

static void test_recovery_on_half_the_hosts_lost_stops_both_survivors_naming_the_partition(void) {
    int r;
    run_api(4, (1 << 2) | (1 << 3), 1);
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_PEER_LOST, api->rc[r], api->message[r]);
        assert_says(api->message[r], "replicas {0, 1} are all that remain together of epoch 0's {0, 1, 2, 3}: not a "
                    "strict majority");
        TEST_ASSERT_EQUAL_INT_MESSAGE(API_LOSS_STEP, api->steps[r], api->message[r]);
    }
}

static void test_recovery_off_a_host_killed_ends_every_survivor_naming_the_lost_rank(void) {
    int r;
    run_api(3, 1 << 2, 0);
    for (r = 0; r < 4; r++) {
        TEST_ASSERT_TRUE_MESSAGE(api->rc[r] == FSDP_ERR_PEER_LOST || api->rc[r] == FSDP_ERR_ABORTED, api->message[r]);
        assert_says(api->message[r], "closed its connection");
        TEST_ASSERT_EQUAL_INT_MESSAGE(API_LOSS_STEP, api->steps[r], api->message[r]);
    }
}

/* ---------------------------------------------------------------------------------------------
   a survivor one step behind: it failed inside the commit point (the global norm's all_gather)
   while the others passed it, so it holds the step's reduced gradient but not the norm; it
   applies the step from the norm those ahead computed (fsdp__recovery_catch_up). On one host,
   2 replicas of 2 ranks, with clipping on (the norm matters): replica 1 stands in for the ranks
   behind at step CATCH_STEP (it joins the all_gather as a rank whose op then failed would have,
   and forgets its result).
   --------------------------------------------------------------------------------------------- */
#define CATCH_WORLD 4
#define CATCH_STEPS 4
#define CATCH_STEP 2
#define CATCH_MAX_NORM 1.0f

typedef struct catch_board {
    volatile double norm;  /* rank 0's commit_norm at CATCH_STEP */
    volatile int posted;
    int refused;           /* 1: the test of a rank without its reduced gradient */
    int rc[CATCH_WORLD];
    float final[CATCH_WORLD][SURVIVE_NUMEL];
    char message[CATCH_WORLD][400];
} catch_board;

static catch_board *catch_up;

/* What fsdp_step does on a rank whose commit point fails: its reductions waited for, then the
   global norm's all_gather joined (here: its result dropped, as a failure would). */
static int fail_inside_commit(fsdp_ctx *ctx) {
    double discarded;
    int rc;
    if ((rc = fsdp__finish(ctx)) != 0) return rc;
    ctx->grads_since_step = 0;
    ctx->reductions_done = !catch_up->refused;
    return fsdp__global_norm(ctx, &discarded);
}

/* Rank me's step at t: the ranks of replica 1 behind at CATCH_STEP, catching up with the norm
   rank 0 posts. */
static int catch_step(fsdp_ctx *ctx, int t, int me) {
    double until = now_ms() + 10000;
    int rc;
    if (t != CATCH_STEP || me < 2) {
        rc = fsdp_step(ctx, CATCH_MAX_NORM, NULL);
        if (!rc && t == CATCH_STEP && me == 0) {
            catch_up->norm = ctx->commit_norm;
            __sync_synchronize();
            catch_up->posted = 1;
        }
        return rc;
    }
    if ((rc = fail_inside_commit(ctx)) != 0) return rc;
    while (!catch_up->posted && now_ms() < until) sleep_ms(1);
    if (!catch_up->posted) return fsdp__fail(ctx, FSDP_ERR_TIMEOUT, "rank 0 posted no norm within 10 s");
    __sync_synchronize();
    if ((rc = fsdp__recovery_catch_up(ctx, catch_up->norm, CATCH_MAX_NORM)) != 0) return rc;
    fsdp__recovery_reset(ctx);
    return 0;
}

static int catch_rank(fsdp_comm *comm, void *arg) {
    int me = fsdp_comm_rank(comm), t, i, rc, w;
    fsdp_model *m = NULL;
    fsdp_ctx *ctx = NULL;
    fsdp_desc d;
    (void)arg;
    m = survive_model(&w);
    d = survive_desc(comm);
    rc = fsdp_init(&ctx, m, &d);
    for (t = 0; !rc && t < CATCH_STEPS; t++) {
        float *g;
        if ((rc = fsdp_pre_forward(ctx, 0)) != 0 || (rc = fsdp_post_forward(ctx, 0)) != 0 ||
            (rc = fsdp_pre_backward(ctx, 0)) != 0)
            break;
        if (!(g = fsdp_grad(ctx, w))) rc = FSDP_ERR_STATE;
        for (i = 0; !rc && i < SURVIVE_NUMEL; i++) g[i] += survive_grad(t, me, i);
        if (rc || (rc = fsdp_post_backward(ctx, 0)) != 0 || (rc = catch_step(ctx, t, me)) != 0 ||
            (rc = fsdp_zero_grad(ctx)) != 0)
            break;
    }
    if (!rc) rc = fsdp_gather_param(ctx, w, catch_up->final[me]);
    catch_up->rc[me] = rc;
    if (rc) copy_text(catch_up->message[me], sizeof catch_up->message[me], fsdp_last_error(ctx));
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    return 0;
}

static void run_catch_up(int refused) {
    fsdp_launch_status ls;
    memset(catch_up, 0, sizeof *catch_up);
    catch_up->refused = refused;
    TEST_ASSERT_EQUAL_INT(FSDP_SUCCESS, launch_ranks(CATCH_WORLD, FSDP_BACKEND_SHM, TIMEOUT_MS, catch_rank, NULL, &ls));
}

static void test_survivor_behind_the_commit_point_applies_the_step_from_the_norm_of_those_ahead_bitwise(void) {
    int r;
    run_catch_up(0);
    for (r = 0; r < CATCH_WORLD; r++) TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, catch_up->rc[r], catch_up->message[r]);
    for (r = 1; r < CATCH_WORLD; r++) {
        char what[64];
        snprintf(what, sizeof what, "rank %d's weight against rank 0's", r);
        TEST_ASSERT_EQUAL_MEMORY_MESSAGE(catch_up->final[0], catch_up->final[r], sizeof catch_up->final[0], what);
    }
}

static void test_survivor_behind_without_its_reduced_gradient_is_refused_naming_it(void) {
    run_catch_up(1);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_STATE, catch_up->rc[2], catch_up->message[2]);
    assert_says(catch_up->message[2], "recovery: rank 2 cannot apply step 3 after the others: it does not hold the "
                "step's reduced gradient");
}

void setUp(void) {}
void tearDown(void) {}

int main(void) {
    reports = (rank_report *)map_shared(sizeof *reports * MAX_RANKS);
    loss = (loss_board *)map_shared(sizeof *loss);
    survive = (survive_board *)map_shared(sizeof *survive);
    catch_up = (catch_board *)map_shared(sizeof *catch_up);
    api = (api_board *)map_shared(sizeof *api);
    UNITY_BEGIN();
    RUN_TEST(test_decide_one_of_four_replicas_lost_keeps_three_in_the_next_epoch);
    RUN_TEST(test_decide_rendezvous_replica_lost_is_survived_like_any_other);
    RUN_TEST(test_decide_two_two_partition_stops_both_halves_naming_them);
    RUN_TEST(test_decide_below_min_replicas_stops_naming_the_minimum);
    RUN_TEST(test_decide_replica_missing_a_rank_is_dropped_with_its_host);
    RUN_TEST(test_decide_views_of_an_older_epoch_are_not_counted);
    RUN_TEST(test_decide_link_broken_one_way_drops_the_later_replica_only);
    RUN_TEST(test_decide_nothing_lost_keeps_the_epoch);
    RUN_TEST(test_decide_a_survivor_past_the_commit_point_brings_every_survivor_to_its_step);
    RUN_TEST(test_decide_no_survivor_past_the_commit_point_drops_the_step_everywhere);
    RUN_TEST(test_decide_a_step_applied_while_a_survivor_lacks_its_gradient_is_refused_naming_both_ranks);
    RUN_TEST(test_decide_a_survivor_two_steps_behind_is_refused);
    RUN_TEST(test_decide_same_views_in_any_order_decide_the_same);
    RUN_TEST(test_recovery_with_full_shard_is_refused_naming_the_unit_and_strategy);
    RUN_TEST(test_recovery_with_every_replica_on_one_host_is_refused_naming_it);
    RUN_TEST(test_recovery_with_two_replicas_sharing_a_host_is_refused_naming_them);
    RUN_TEST(test_recovery_over_hosts_of_their_own_is_accepted_and_trains_in_epoch_0);
    RUN_TEST(test_recovery_with_an_update_that_streams_is_refused_naming_it);
    RUN_TEST(test_replicas_of_hybrid_over_hosts_are_the_shard_groups_in_query_and_report);
    RUN_TEST(test_replicas_of_full_shard_are_one_and_of_no_shard_every_rank);
    RUN_TEST(test_replicas_of_a_null_context_are_zero_and_invalid);
    RUN_TEST(test_replica_lost_by_reset_shows_at_once_as_peer_lost_and_the_shard_comm_stays_healthy);
    RUN_TEST(test_replica_gone_silent_shows_at_the_op_timeout_and_the_shard_comm_stays_healthy);
    RUN_TEST(test_watched_links_to_other_hosts_carry_keepalive_and_links_inside_a_host_do_not);
    RUN_TEST(test_stopped_peer_on_watched_links_is_found_at_the_op_timeout_not_at_detect_ms);
    RUN_TEST(test_straggler_whose_window_stays_closed_longer_than_detect_ms_is_waited_for_not_lost);
    RUN_TEST(test_survivors_of_a_lost_host_rebuild_a_replica_comm_that_sums_over_them);
    RUN_TEST(test_survivors_drop_the_step_of_the_loss_and_train_on_bitwise_equal_to_the_reference);
    RUN_TEST(test_survivors_of_two_runs_with_the_same_loss_end_bitwise_equal);
    RUN_TEST(test_without_recovery_a_host_killed_at_a_step_ends_every_survivor_naming_the_lost_rank);
    RUN_TEST(test_survivors_of_a_host_killed_at_a_step_train_on_bitwise_equal_to_the_reference);
    RUN_TEST(test_survivors_of_the_rendezvous_host_killed_train_on_bitwise_equal_to_the_reference);
    RUN_TEST(test_recovery_on_one_host_of_four_killed_survivors_train_on_bitwise_equal_to_the_reference);
    RUN_TEST(test_recovery_on_one_host_of_four_killed_world_comm_spans_the_survivors);
    RUN_TEST(test_recovery_on_one_host_of_four_killed_param_info_shards_read_and_set_the_parameter);
    RUN_TEST(test_recovery_on_the_rendezvous_host_killed_survivors_train_on_bitwise_equal_to_the_reference);
    RUN_TEST(test_recovery_on_the_rendezvous_host_killed_a_survivor_that_believes_it_alive_asks_the_next_at_once);
    RUN_TEST(test_recovery_with_a_stranger_at_the_rendezvous_survivors_match_the_reference);
    RUN_TEST(test_recovery_on_a_host_stopped_survivors_go_on_after_the_op_timeout_bitwise_equal_to_the_reference);
    RUN_TEST(test_recovery_on_two_hosts_of_four_lost_at_different_steps_survivors_train_on_in_epoch_2);
    RUN_TEST(test_recovery_on_a_host_killed_inside_a_large_all_reduce_every_survivor_goes_on_with_the_other_two);
    RUN_TEST(test_recovery_on_half_the_hosts_lost_stops_both_survivors_naming_the_partition);
    RUN_TEST(test_recovery_off_a_host_killed_ends_every_survivor_naming_the_lost_rank);
    RUN_TEST(test_survivor_behind_the_commit_point_applies_the_step_from_the_norm_of_those_ahead_bitwise);
    RUN_TEST(test_survivor_behind_without_its_reduced_gradient_is_refused_naming_it);
    return UNITY_END();
}
