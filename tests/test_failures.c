/* test_failures.c - specification of how fsdp.h fails: ranks that disagree, ranks that never
   come, die, exit with an error or belong to another job, user aborts, and environment errors.
   Every failure must be reported (with a message naming what was at fault), bounded in time
   (timeouts of 1-3 s here; each wait is checked against timeout + margin), and must leave nothing
   behind in /dev/shm.

   Ranks are forked, either by fsdp_launch_ex or by this file (to call fsdp_comm_init directly).
   Children only record what happened in a MAP_SHARED region and exit; the parent asserts.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -I. -Itests/unity tests/test_failures.c \
              tests/unity/unity.c -o /tmp/test_failures -lpthread -lm */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FSDP_TEST_IMPLEMENTATION_LINKED /* make links fsdp.h's implementation, compiled once */
#define FSDP_IMPLEMENTATION
#endif
#include "fsdp.h"
#include "unity.h"
#include "test_common.h"

#include <ctype.h>
#include <pthread.h>

#define MAX_RANKS 4
#define TIMEOUT_MS 2000          /* the communicators' bound on any wait in these tests */
#define SHORT_TIMEOUT_MS 1000
#define MARGIN_MS 1000           /* allowed on top of a timeout before we call it a hang */
#define FAST_MS 500              /* "fails fast": well below any timeout used here */
#define KILL_AFTER_MS 40         /* how long the doomed rank computes before it is killed */
#define LOOP_LIMIT_MS 10000      /* ranks that loop until something fails give up after this */
#define BIG_COUNT (1u << 20)     /* elements of the all_reduce the ranks loop over */
#define MESSAGE_BYTES 600

/* What one rank recorded. */
typedef struct rank_report {
    int done;
    int rc;                      /* the call under test */
    int elapsed_ms;              /* how long that call took */
    int later_rc;                /* a later op on the same communicator */
    int later_elapsed_ms;
    int status;                  /* fsdp_comm_status after everything */
    int iterations;              /* successful ops before the failure */
    int out_was_null;            /* fsdp_comm_init left *out NULL */
    int backend;                 /* fsdp_comm_backend, fsdp_comm_rank, fsdp_comm_size */
    int rank;
    int world;
    float sum;
    char message[MESSAGE_BYTES];       /* last_error, or what init logged */
    char later_message[MESSAGE_BYTES]; /* last_error after the later op */
} rank_report;

typedef struct shared_reports {
    rank_report rank[MAX_RANKS];
} shared_reports;

static shared_reports *shared; /* MAP_SHARED, mapped once in main before any fork */

/* ---------------------------------------------------------------------------------------------
   helpers
   --------------------------------------------------------------------------------------------- */
static int contains_nocase(const char *haystack, const char *needle) {
    size_t n = strlen(needle);
    for (; *haystack; haystack++) {
        size_t i = 0;
        while (i < n && haystack[i] && tolower((unsigned char)haystack[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}

static int is_word_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The word appears on its own: "RANK" in "RANK is not set" but not in "LOCAL_RANK". */
static int contains_word(const char *haystack, const char *word) {
    size_t n = strlen(word);
    const char *at = haystack;
    while ((at = strstr(at, word)) != NULL) {
        if ((at == haystack || !is_word_char(at[-1])) && !is_word_char(at[n])) return 1;
        at++;
    }
    return 0;
}

/* The message names rank `rank`: "rank 2", "ranks 0, 2", "rank(s): 2", "rank #2"... */
static int names_rank(const char *message, int rank) {
    const char *at = message;
    while (*at) {
        if (strncmp(at, "rank", 4) == 0 || strncmp(at, "Rank", 4) == 0) {
            const char *p = at + 4;
            int budget = 24;
            while (*p && budget-- > 0 && (isdigit((unsigned char)*p) || strchr("s ():=#[],", *p))) {
                if (isdigit((unsigned char)*p)) {
                    long value = strtol(p, (char **)&p, 10);
                    if (value == rank) return 1;
                    continue;
                }
                p++;
            }
        }
        at++;
    }
    return 0;
}

static int is_one_of(int rc, int a, int b) { return rc == a || rc == b; }

/* Names in /dev/shm. */
#define MAX_SHM_NAMES 512
typedef struct shm_listing {
    int count;
    char names[MAX_SHM_NAMES][128];
} shm_listing;

static void list_dev_shm(shm_listing *listing) {
    DIR *dir = opendir("/dev/shm");
    struct dirent *entry;
    listing->count = 0;
    if (!dir) return;
    while ((entry = readdir(dir)) != NULL && listing->count < MAX_SHM_NAMES)
        copy_text(listing->names[listing->count++], sizeof listing->names[0], entry->d_name);
    closedir(dir);
}

/* Copies into found the first name in after that contains needle and is not in before. */
static int new_shm_entry(const shm_listing *before, const shm_listing *after, const char *needle, char *found,
                         size_t found_size) {
    int i, k;
    for (i = 0; i < after->count; i++) {
        int seen = 0;
        if (!contains(after->names[i], needle)) continue;
        for (k = 0; k < before->count && !seen; k++) seen = strcmp(before->names[k], after->names[i]) == 0;
        if (!seen) {
            copy_text(found, found_size, after->names[i]);
            return 1;
        }
    }
    return 0;
}

/* Keeps whatever the library logs, in the child that made the communicator. */
static char captured_log[MESSAGE_BYTES];

static void capture_log(void *user, fsdp_log_level level, const char *message) {
    (void)user;
    (void)level;
    if (captured_log[0]) append_text(captured_log, sizeof captured_log, " | ");
    append_text(captured_log, sizeof captured_log, message);
}

static fsdp_logger capturing_logger(void) {
    fsdp_logger logger;
    memset(&logger, 0, sizeof logger);
    logger.fn = capture_log;
    logger.max_level = FSDP_LOG_WARN;
    return logger;
}

/* The comm's rank as an index into shared->rank (0 if it is out of range, which the assertions
   then show as a rank that never reported). */
static int rank_index(const fsdp_comm *comm) {
    int rank = fsdp_comm_rank(comm);
    return rank >= 0 && rank < MAX_RANKS ? rank : 0;
}

static void record_comm_error(rank_report *report, fsdp_comm *comm) {
    copy_text(report->message, sizeof report->message, fsdp_comm_last_error(comm));
}

/* ---------------------------------------------------------------------------------------------
   running ranks
   --------------------------------------------------------------------------------------------- */
/* What a scenario left for the assertions: copied out of the shared region once it is over. */
typedef struct scenario {
    int ran;
    int launch_rc;
    fsdp_launch_status status;
    int launch_ms;
    int hung;                    /* children this file forked that had to be killed */
    rank_report rank[MAX_RANKS];
    char new_shm[160];           /* a /dev/shm entry that appeared, "" if none */
} scenario;

static void finish_scenario(scenario *s, const shm_listing *before, const char *needle) {
    shm_listing *after = malloc(sizeof *after);
    memcpy(s->rank, shared->rank, sizeof s->rank);
    s->new_shm[0] = '\0';
    if (after) {
        list_dev_shm(after);
        new_shm_entry(before, after, needle, s->new_shm, sizeof s->new_shm);
        free(after);
    }
    s->ran = 1;
}

static void run_launch(scenario *s, fsdp_backend_kind backend, int nprocs, int timeout_ms, fsdp_rank_fn fn,
                       void *arg) {
    shm_listing *before = malloc(sizeof *before);
    double start;
    memset(s, 0, sizeof *s);
    memset(shared, 0, sizeof *shared);
    if (before) list_dev_shm(before);
    start = now_ms();
    s->launch_rc = launch_ranks(nprocs, backend, timeout_ms, fn, arg, &s->status);
    s->launch_ms = (int)(now_ms() - start);
    if (before) {
        finish_scenario(s, before, "fsdp");
        free(before);
    } else {
        memcpy(s->rank, shared->rank, sizeof s->rank);
        s->ran = 1;
    }
}

typedef void (*child_fn)(int rank, const void *arg);

/* Forks one process per rank running fn, waits for all of them until deadline_ms and kills (and
   counts) those still running then. */
static int fork_ranks(int nranks, child_fn fn, const void *arg, int deadline_ms) {
    pid_t pids[MAX_RANKS];
    int alive[MAX_RANKS];
    int r, remaining = 0, hung = 0;
    double start = now_ms();
    memset(shared, 0, sizeof *shared);
    fflush(stdout);
    fflush(stderr);
    for (r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            fn(r, arg);
            _exit(0);
        }
        alive[r] = pids[r] > 0;
        remaining += alive[r];
    }
    while (remaining > 0) {
        for (r = 0; r < nranks; r++) {
            if (alive[r] && waitpid(pids[r], NULL, WNOHANG) == pids[r]) {
                alive[r] = 0;
                remaining--;
            }
        }
        if (remaining == 0) break;
        if (now_ms() - start > deadline_ms) {
            for (r = 0; r < nranks; r++) {
                if (!alive[r]) continue;
                kill(pids[r], SIGKILL);
                waitpid(pids[r], NULL, 0);
                hung++;
            }
            break;
        }
        sleep_ms(5);
    }
    return hung;
}

/* ---------------------------------------------------------------------------------------------
   mismatched collectives
   --------------------------------------------------------------------------------------------- */
typedef enum mismatch_kind { MISMATCH_OP, MISMATCH_COUNT, MISMATCH_DTYPE } mismatch_kind;

#define MISMATCH_WORLD 3
#define COUNT_ON_MOST_RANKS 12345
#define COUNT_ON_RANK_1 54321

/* Rank 1 disagrees with ranks 0 and 2; then every rank tries one more, valid, all_reduce. */
static int mismatch_rank(fsdp_comm *comm, void *arg) {
    mismatch_kind kind = *(const mismatch_kind *)arg;
    int rank = rank_index(comm);
    rank_report *report = &shared->rank[rank];
    size_t elems = (size_t)COUNT_ON_RANK_1 * MISMATCH_WORLD;
    float *send = calloc(elems, sizeof *send), *recv = calloc(elems, sizeof *recv);
    double start;
    if (!send || !recv) return 3;
    start = now_ms();
    if (kind == MISMATCH_OP) {
        report->rc = rank == 1 ? fsdp_all_reduce(comm, send, recv, 1000, FSDP_F32, FSDP_SUM)
                               : fsdp_all_gather(comm, send, recv, 1000, FSDP_F32);
    } else if (kind == MISMATCH_COUNT) {
        report->rc = fsdp_all_reduce(comm, send, recv, rank == 1 ? COUNT_ON_RANK_1 : COUNT_ON_MOST_RANKS, FSDP_F32,
                                     FSDP_SUM);
    } else {
        report->rc = fsdp_all_reduce(comm, send, recv, 1000, rank == 1 ? FSDP_BF16 : FSDP_F32, FSDP_SUM);
    }
    report->elapsed_ms = (int)(now_ms() - start);
    record_comm_error(report, comm);
    start = now_ms();
    report->later_rc = fsdp_all_reduce(comm, send, recv, 16, FSDP_F32, FSDP_SUM);
    report->later_elapsed_ms = (int)(now_ms() - start);
    copy_text(report->later_message, sizeof report->later_message, fsdp_comm_last_error(comm));
    report->status = fsdp_comm_status(comm);
    report->done = 1;
    free(send);
    free(recv);
    return 0;
}

static scenario mismatch_scenarios[2][3]; /* [shm, socket][op, count, dtype] */

static const scenario *run_mismatch(fsdp_backend_kind backend, mismatch_kind kind) {
    scenario *s = &mismatch_scenarios[backend == FSDP_BACKEND_SOCKET][kind];
    if (!s->ran) run_launch(s, backend, MISMATCH_WORLD, TIMEOUT_MS, mismatch_rank, &kind);
    return s;
}

/* Every rank fails (MISMATCH, or ABORTED if it learnt it from a peer) within the bound, and its
   last_error names a rank and both sides of the disagreement. */
static void assert_mismatch_reported(fsdp_backend_kind backend, mismatch_kind kind, const char *side_a,
                                     const char *side_b) {
    const scenario *s = run_mismatch(backend, kind);
    int r, mismatches = 0;
    char message[900];
    for (r = 0; r < MISMATCH_WORLD; r++) {
        const rank_report *report = &s->rank[r];
        snprintf(message, sizeof message, "[%s] rank %d: %s after %d ms: '%s' (launch: %s)", fsdp_backend_name(backend),
                 r, fsdp_result_name(report->rc), report->elapsed_ms, report->message, s->status.message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_TRUE_MESSAGE(is_one_of(report->rc, FSDP_ERR_MISMATCH, FSDP_ERR_ABORTED), message);
        TEST_ASSERT_LESS_THAN_MESSAGE(TIMEOUT_MS + MARGIN_MS, report->elapsed_ms, message);
        TEST_ASSERT_TRUE_MESSAGE(contains(report->message, "rank"), message);
        TEST_ASSERT_TRUE_MESSAGE(contains(report->message, side_a), message);
        TEST_ASSERT_TRUE_MESSAGE(contains(report->message, side_b), message);
        mismatches += report->rc == FSDP_ERR_MISMATCH;
    }
    TEST_ASSERT_TRUE_MESSAGE(mismatches > 0, "no rank reported FSDP_ERR_MISMATCH");
}

static void test_mismatched_ops_over_shm_fail_every_rank_naming_both_ops(void) {
    assert_mismatch_reported(FSDP_BACKEND_SHM, MISMATCH_OP, "all_reduce", "all_gather");
}
static void test_mismatched_ops_over_socket_fail_every_rank_naming_both_ops(void) {
    assert_mismatch_reported(FSDP_BACKEND_SOCKET, MISMATCH_OP, "all_reduce", "all_gather");
}
static void test_mismatched_counts_over_shm_fail_every_rank_naming_both_counts(void) {
    assert_mismatch_reported(FSDP_BACKEND_SHM, MISMATCH_COUNT, "12345", "54321");
}
static void test_mismatched_counts_over_socket_fail_every_rank_naming_both_counts(void) {
    assert_mismatch_reported(FSDP_BACKEND_SOCKET, MISMATCH_COUNT, "12345", "54321");
}
static void test_mismatched_dtypes_over_shm_fail_every_rank_naming_both_dtypes(void) {
    assert_mismatch_reported(FSDP_BACKEND_SHM, MISMATCH_DTYPE, "f32", "bf16");
}
static void test_mismatched_dtypes_over_socket_fail_every_rank_naming_both_dtypes(void) {
    assert_mismatch_reported(FSDP_BACKEND_SOCKET, MISMATCH_DTYPE, "f32", "bf16");
}

/* After the failure the comm is poisoned: the next op fails at once with ABORTED and the status
   and message are still those of the first failure. */
static void assert_poisoned_after_failure(fsdp_backend_kind backend) {
    const scenario *s = run_mismatch(backend, MISMATCH_OP);
    int r;
    char message[1400];
    for (r = 0; r < MISMATCH_WORLD; r++) {
        const rank_report *report = &s->rank[r];
        snprintf(message, sizeof message, "[%s] rank %d: later op %s after %d ms; first '%s', now '%s'",
                 fsdp_backend_name(backend), r, fsdp_result_name(report->later_rc), report->later_elapsed_ms,
                 report->message, report->later_message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_TRUE_MESSAGE(report->rc != FSDP_SUCCESS, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_ABORTED, report->later_rc, message);
        TEST_ASSERT_LESS_THAN_MESSAGE(FAST_MS, report->later_elapsed_ms, message);
        TEST_ASSERT_EQUAL_STRING_MESSAGE(report->message, report->later_message, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(report->rc, report->status, message);
    }
}

static void test_op_after_a_failure_over_shm_fails_fast_with_aborted_keeping_the_first_message(void) {
    assert_poisoned_after_failure(FSDP_BACKEND_SHM);
}
static void test_op_after_a_failure_over_socket_fails_fast_with_aborted_keeping_the_first_message(void) {
    assert_poisoned_after_failure(FSDP_BACKEND_SOCKET);
}

/* ---------------------------------------------------------------------------------------------
   fsdp_comm_init by hand: a rank that never comes, a peer from another job or world size
   --------------------------------------------------------------------------------------------- */
typedef struct init_plan {
    fsdp_backend_kind backend;
    int port;
    int timeout_ms;
    int world_size[MAX_RANKS];
    const char *job[MAX_RANKS];
} init_plan;

static void init_child(int rank, const void *arg) {
    const init_plan *plan = arg;
    rank_report *report = &shared->rank[rank];
    fsdp_comm_desc desc;
    fsdp_comm *comm = (fsdp_comm *)&desc; /* anything but NULL, to see that init clears it */
    double start;
    memset(&desc, 0, sizeof desc);
    desc.backend = plan->backend;
    desc.rank = rank;
    desc.world_size = plan->world_size[rank];
    desc.job = plan->job[rank];
    desc.timeout_ms = plan->timeout_ms;
    desc.master_addr = "127.0.0.1";
    desc.master_port = plan->port;
    desc.logger = capturing_logger();
    start = now_ms();
    report->rc = fsdp_comm_init(&comm, &desc);
    report->elapsed_ms = (int)(now_ms() - start);
    report->out_was_null = comm == NULL;
    copy_text(report->message, sizeof report->message, captured_log);
    if (report->rc == FSDP_SUCCESS && comm) fsdp_comm_destroy(comm);
    report->done = 1;
}

static scenario missing_rank_scenarios[2];
static char missing_rank_job[64];

/* Ranks 0 and 1 of a world of 3 call fsdp_comm_init; rank 2 never does. */
static const scenario *run_missing_rank(fsdp_backend_kind backend) {
    scenario *s = &missing_rank_scenarios[backend == FSDP_BACKEND_SOCKET];
    if (!s->ran) {
        init_plan plan;
        shm_listing *before = malloc(sizeof *before);
        int r;
        memset(&plan, 0, sizeof plan);
        memset(s, 0, sizeof *s);
        snprintf(missing_rank_job, sizeof missing_rank_job, "fsdp-test-missing-%ld-%d", (long)getpid(),
                 (int)backend);
        plan.backend = backend;
        plan.port = backend == FSDP_BACKEND_SOCKET ? pick_free_port() : 0;
        plan.timeout_ms = SHORT_TIMEOUT_MS;
        for (r = 0; r < MAX_RANKS; r++) {
            plan.world_size[r] = 3;
            plan.job[r] = missing_rank_job;
        }
        if (before) list_dev_shm(before);
        s->hung = fork_ranks(2, init_child, &plan, SHORT_TIMEOUT_MS + 5000);
        if (before) {
            finish_scenario(s, before, missing_rank_job);
            free(before);
        }
        s->ran = 1;
    }
    return s;
}

/* Both ranks fail within the bound with *out NULL. At least one times out itself, after waiting
   (about) the whole timeout; the other may instead learn from it that the job is off. */
static void assert_missing_rank_times_out(fsdp_backend_kind backend) {
    const scenario *s = run_missing_rank(backend);
    int r, timeouts = 0;
    char message[900];
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, s->hung, "a rank was still in fsdp_comm_init 5 s after its timeout");
    for (r = 0; r < 2; r++) {
        const rank_report *report = &s->rank[r];
        snprintf(message, sizeof message, "[%s] rank %d: %s after %d ms (timeout %d ms): '%s'",
                 fsdp_backend_name(backend), r, fsdp_result_name(report->rc), report->elapsed_ms, SHORT_TIMEOUT_MS,
                 report->message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_TRUE_MESSAGE(report->out_was_null, message);
        TEST_ASSERT_TRUE_MESSAGE(report->rc == FSDP_ERR_TIMEOUT || report->rc == FSDP_ERR_PEER_LOST ||
                                     report->rc == FSDP_ERR_ABORTED,
                                 message);
        TEST_ASSERT_LESS_THAN_MESSAGE(SHORT_TIMEOUT_MS + MARGIN_MS, report->elapsed_ms, message);
        if (report->rc == FSDP_ERR_TIMEOUT) {
            TEST_ASSERT_GREATER_OR_EQUAL_MESSAGE(SHORT_TIMEOUT_MS * 9 / 10, report->elapsed_ms, message);
            timeouts++;
        }
    }
    snprintf(message, sizeof message, "[%s] no rank reported FSDP_ERR_TIMEOUT: rank 0 %s, rank 1 %s",
             fsdp_backend_name(backend), fsdp_result_name(s->rank[0].rc), fsdp_result_name(s->rank[1].rc));
    TEST_ASSERT_TRUE_MESSAGE(timeouts > 0, message);
}

/* A rank's message names rank 2 as missing, or says how many of the 3 joined. (Not necessarily
   every rank's: over sockets, rank 1 only knows that rank 0 never answered.) */
static void assert_missing_rank_named(fsdp_backend_kind backend) {
    const scenario *s = run_missing_rank(backend);
    int r, named = 0;
    char message[1400];
    for (r = 0; r < 2; r++) {
        const char *text = s->rank[r].message;
        named |= names_rank(text, 2) || contains(text, "2 of 3") || contains(text, "2/3");
    }
    snprintf(message, sizeof message, "[%s] rank 0 logged '%s'; rank 1 logged '%s'", fsdp_backend_name(backend),
             s->rank[0].message, s->rank[1].message);
    TEST_ASSERT_TRUE_MESSAGE(s->rank[0].done && s->rank[1].done, message);
    TEST_ASSERT_TRUE_MESSAGE(named, message);
}

static void test_shm_init_with_a_rank_that_never_joins_times_out_within_the_bound(void) {
    assert_missing_rank_times_out(FSDP_BACKEND_SHM);
}
static void test_shm_init_with_a_rank_that_never_joins_names_the_missing_rank(void) {
    assert_missing_rank_named(FSDP_BACKEND_SHM);
}
static void test_shm_init_with_a_rank_that_never_joins_leaves_nothing_in_dev_shm(void) {
    const scenario *s = run_missing_rank(FSDP_BACKEND_SHM);
    char message[300];
    snprintf(message, sizeof message, "left behind: /dev/shm/%s (job token %s)", s->new_shm, missing_rank_job);
    TEST_ASSERT_TRUE_MESSAGE(s->rank[0].done, "rank 0 did not report");
    TEST_ASSERT_TRUE_MESSAGE(s->new_shm[0] == '\0', message);
}
static void test_socket_init_with_a_rank_that_never_joins_times_out_within_the_bound(void) {
    assert_missing_rank_times_out(FSDP_BACKEND_SOCKET);
}
static void test_socket_init_with_a_rank_that_never_joins_names_the_missing_rank(void) {
    assert_missing_rank_named(FSDP_BACKEND_SOCKET);
}

/* Two socket ranks that disagree on the job token or on the world size. */
typedef enum peer_problem { WRONG_JOB, WRONG_WORLD_SIZE } peer_problem;
static scenario rejected_peer_scenarios[2];

static const scenario *run_rejected_peer(peer_problem problem) {
    scenario *s = &rejected_peer_scenarios[problem];
    if (!s->ran) {
        init_plan plan;
        memset(&plan, 0, sizeof plan);
        memset(s, 0, sizeof *s);
        plan.backend = FSDP_BACKEND_SOCKET;
        plan.port = pick_free_port();
        plan.timeout_ms = TIMEOUT_MS;
        plan.world_size[0] = 2;
        plan.world_size[1] = problem == WRONG_WORLD_SIZE ? 3 : 2;
        plan.job[0] = "fsdp-test-job";
        plan.job[1] = problem == WRONG_JOB ? "other" : "fsdp-test-job";
        s->hung = fork_ranks(2, init_child, &plan, TIMEOUT_MS + 5000);
        memcpy(s->rank, shared->rank, sizeof s->rank);
        s->ran = 1;
    }
    return s;
}

static void assert_both_ranks_fail_within_bound(peer_problem problem) {
    const scenario *s = run_rejected_peer(problem);
    int r;
    char message[900];
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, s->hung, "a rank was still in fsdp_comm_init 5 s after its timeout");
    for (r = 0; r < 2; r++) {
        const rank_report *report = &s->rank[r];
        snprintf(message, sizeof message, "rank %d: %s after %d ms: '%s'", r, fsdp_result_name(report->rc),
                 report->elapsed_ms, report->message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_TRUE_MESSAGE(report->rc != FSDP_SUCCESS, message);
        TEST_ASSERT_TRUE_MESSAGE(report->out_was_null, message);
        TEST_ASSERT_LESS_THAN_MESSAGE(TIMEOUT_MS + MARGIN_MS, report->elapsed_ms, message);
    }
}

/* At least one side reports FSDP_ERR_REJECTED with a message containing the word. */
static void assert_rejected_naming(peer_problem problem, const char *word) {
    const scenario *s = run_rejected_peer(problem);
    int r, named = 0;
    char message[1400];
    for (r = 0; r < 2; r++)
        named |= s->rank[r].rc == FSDP_ERR_REJECTED && contains_nocase(s->rank[r].message, word);
    snprintf(message, sizeof message, "rank 0: %s '%s'; rank 1: %s '%s'", fsdp_result_name(s->rank[0].rc),
             s->rank[0].message, fsdp_result_name(s->rank[1].rc), s->rank[1].message);
    TEST_ASSERT_TRUE_MESSAGE(named, message);
}

static void test_socket_peers_with_different_job_tokens_both_fail_within_the_bound(void) {
    assert_both_ranks_fail_within_bound(WRONG_JOB);
}
static void test_socket_peer_with_a_different_job_token_is_rejected_naming_the_job(void) {
    assert_rejected_naming(WRONG_JOB, "job");
}
static void test_socket_peers_with_different_world_sizes_both_fail_within_the_bound(void) {
    assert_both_ranks_fail_within_bound(WRONG_WORLD_SIZE);
}
static void test_socket_peer_with_a_different_world_size_is_rejected_naming_the_world_size(void) {
    assert_rejected_naming(WRONG_WORLD_SIZE, "world");
}

/* ---------------------------------------------------------------------------------------------
   a rank killed mid-collective, a rank exiting with an error
   --------------------------------------------------------------------------------------------- */
#define DOOMED_RANK 2
#define KILL_WORLD 3

static void *kill_self_soon(void *arg) {
    (void)arg;
    sleep_ms(KILL_AFTER_MS);
    raise(SIGKILL);
    return NULL;
}

/* Loops big all_reduces until one fails (bounded by LOOP_LIMIT_MS) and records that failure.
   shared: the buffer comes from fsdp_comm_alloc, so peers read it directly (and wait for each
   other's reads before returning). doomed: this rank kills itself soon after the buffer is
   ready (not during fsdp_comm_alloc, which a loaded machine may make last longer). */
static void loop_all_reduce_until_failure(fsdp_comm *comm, rank_report *report, int shared, int doomed) {
    void *mem = NULL;
    float *data = shared ? (fsdp_comm_alloc(comm, BIG_COUNT * sizeof(float), &mem) == 0 ? (float *)mem : NULL)
                         : (float *)calloc(BIG_COUNT, sizeof(float));
    double loop_start = now_ms();
    report->rc = FSDP_SUCCESS;
    if (!data) {
        copy_text(report->message, sizeof report->message, shared ? fsdp_comm_last_error(comm) : "calloc failed");
        report->rc = FSDP_ERR_OUT_OF_MEMORY;
        return;
    }
    if (doomed) {
        pthread_t killer;
        if (pthread_create(&killer, NULL, kill_self_soon, NULL) != 0) raise(SIGKILL);
    }
    while (now_ms() - loop_start < LOOP_LIMIT_MS) {
        double start = now_ms();
        int rc = fsdp_all_reduce(comm, data, data, BIG_COUNT, FSDP_F32, FSDP_SUM);
        if (rc != FSDP_SUCCESS) {
            report->rc = rc;
            report->elapsed_ms = (int)(now_ms() - start);
            record_comm_error(report, comm);
            break;
        }
        report->iterations++;
    }
    if (shared) fsdp_comm_free(comm, data);
    else free(data);
}

static int killed_rank_main(fsdp_comm *comm, void *arg) {
    int rank = rank_index(comm);
    rank_report *report = &shared->rank[rank];
    (void)arg;
    loop_all_reduce_until_failure(comm, report, arg != NULL, rank == DOOMED_RANK);
    report->done = 1;
    return 0; /* the survivors succeed: the launcher must name the killed rank */
}

/* shm, socket, and shm with the buffer in fsdp_comm_alloc memory */
#define SHM_SHARED_MEMORY ((fsdp_backend_kind)100)
static scenario killed_rank_scenarios[3];
static int shared_flag = 1;

static const scenario *run_killed_rank(fsdp_backend_kind backend) {
    int shared = backend == SHM_SHARED_MEMORY;
    scenario *s = &killed_rank_scenarios[shared ? 2 : backend == FSDP_BACKEND_SOCKET];
    if (!s->ran)
        run_launch(s, shared ? FSDP_BACKEND_SHM : backend, KILL_WORLD, TIMEOUT_MS, killed_rank_main,
                   shared ? &shared_flag : NULL);
    return s;
}

static const char *scenario_name(fsdp_backend_kind backend) {
    return backend == SHM_SHARED_MEMORY ? "shm, fsdp_comm_alloc memory" : fsdp_backend_name(backend);
}

static void assert_survivors_fail_within_timeout(fsdp_backend_kind backend) {
    const scenario *s = run_killed_rank(backend);
    int r;
    char message[900];
    for (r = 0; r < KILL_WORLD; r++) {
        const rank_report *report = &s->rank[r];
        if (r == DOOMED_RANK) continue;
        snprintf(message, sizeof message, "[%s] rank %d: %s after %d ms (%d all_reduces before): '%s'",
                 scenario_name(backend), r, fsdp_result_name(report->rc), report->elapsed_ms,
                 report->iterations, report->message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_TRUE_MESSAGE(is_one_of(report->rc, FSDP_ERR_PEER_LOST, FSDP_ERR_ABORTED), message);
        TEST_ASSERT_LESS_THAN_MESSAGE(TIMEOUT_MS + MARGIN_MS, report->elapsed_ms, message);
    }
}

/* "launch returned X after N ms: failed_rank ... 'message'" */
static void describe_launch(char *out, size_t size, const char *prefix, const scenario *s) {
    snprintf(out, size, "%slaunch returned %s after %d ms: failed_rank %d exit_code %d signal %d: '", prefix,
             fsdp_result_name(s->launch_rc), s->launch_ms, s->status.failed_rank, s->status.exit_code, s->status.signal);
    append_text(out, size, s->status.message);
    append_text(out, size, "'");
}

static void assert_launcher_reports_killed_rank(fsdp_backend_kind backend) {
    const scenario *s = run_killed_rank(backend);
    char message[600], prefix[32];
    snprintf(prefix, sizeof prefix, "[%s] ", scenario_name(backend));
    describe_launch(message, sizeof message, prefix, s);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_RANK_FAILED, s->launch_rc, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(DOOMED_RANK, s->status.failed_rank, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(SIGKILL, s->status.signal, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(-1, s->status.exit_code, message);
    TEST_ASSERT_TRUE_MESSAGE(names_rank(s->status.message, DOOMED_RANK), message);
    TEST_ASSERT_LESS_THAN_MESSAGE(KILL_AFTER_MS + TIMEOUT_MS + MARGIN_MS + 2000, s->launch_ms, message);
}

static void assert_killed_rank_leaves_no_shm(fsdp_backend_kind backend) {
    const scenario *s = run_killed_rank(backend);
    char message[300];
    snprintf(message, sizeof message, "[%s] appeared during the test: /dev/shm/%s", scenario_name(backend),
             s->new_shm);
    TEST_ASSERT_TRUE_MESSAGE(s->ran, "the scenario did not run");
    TEST_ASSERT_TRUE_MESSAGE(s->new_shm[0] == '\0', message);
}

static void test_rank_killed_mid_all_reduce_over_shm_makes_survivors_fail_within_timeout(void) {
    assert_survivors_fail_within_timeout(FSDP_BACKEND_SHM);
}
static void test_rank_killed_mid_all_reduce_over_shm_is_reported_by_launcher_with_rank_and_signal(void) {
    assert_launcher_reports_killed_rank(FSDP_BACKEND_SHM);
}
static void test_rank_killed_mid_all_reduce_over_shm_leaves_nothing_in_dev_shm(void) {
    assert_killed_rank_leaves_no_shm(FSDP_BACKEND_SHM);
}
static void test_rank_killed_mid_all_reduce_of_fsdp_comm_alloc_memory_makes_survivors_fail_within_timeout(void) {
    assert_survivors_fail_within_timeout(SHM_SHARED_MEMORY);
}
static void test_rank_killed_mid_all_reduce_of_fsdp_comm_alloc_memory_leaves_nothing_in_dev_shm(void) {
    assert_killed_rank_leaves_no_shm(SHM_SHARED_MEMORY);
}
static void test_rank_killed_mid_all_reduce_over_socket_makes_survivors_fail_within_timeout(void) {
    assert_survivors_fail_within_timeout(FSDP_BACKEND_SOCKET);
}
static void test_rank_killed_mid_all_reduce_over_socket_is_reported_by_launcher_with_rank_and_signal(void) {
    assert_launcher_reports_killed_rank(FSDP_BACKEND_SOCKET);
}
static void test_rank_killed_mid_all_reduce_over_socket_leaves_nothing_in_dev_shm(void) {
    assert_killed_rank_leaves_no_shm(FSDP_BACKEND_SOCKET);
}

#define EXITING_RANK 1
#define EXIT_CODE 3
#define EXIT_TIMEOUT_MS 3000

/* Every rank does a few all_reduces; then rank 1 returns 3 while the others carry on. */
static int exiting_rank_main(fsdp_comm *comm, void *arg) {
    int rank = rank_index(comm), i;
    rank_report *report = &shared->rank[rank];
    float value = 1.0f, sum = 0.0f;
    (void)arg;
    for (i = 0; i < 3; i++)
        if (fsdp_all_reduce(comm, &value, &sum, 1, FSDP_F32, FSDP_SUM) != FSDP_SUCCESS) return 4;
    if (rank == EXITING_RANK) return EXIT_CODE;
    loop_all_reduce_until_failure(comm, report, 0, 0);
    report->done = 1;
    return 0;
}

static scenario exiting_rank_scenarios[2];

static const scenario *run_exiting_rank(fsdp_backend_kind backend) {
    scenario *s = &exiting_rank_scenarios[backend == FSDP_BACKEND_SOCKET];
    if (!s->ran) run_launch(s, backend, 3, EXIT_TIMEOUT_MS, exiting_rank_main, NULL);
    return s;
}

static void assert_launcher_reports_exit_code(fsdp_backend_kind backend) {
    const scenario *s = run_exiting_rank(backend);
    char message[600], prefix[32];
    snprintf(prefix, sizeof prefix, "[%s] ", scenario_name(backend));
    describe_launch(message, sizeof message, prefix, s);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_RANK_FAILED, s->launch_rc, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(EXITING_RANK, s->status.failed_rank, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(EXIT_CODE, s->status.exit_code, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, s->status.signal, message);
    TEST_ASSERT_TRUE_MESSAGE(names_rank(s->status.message, EXITING_RANK), message);
    TEST_ASSERT_TRUE_MESSAGE(contains(s->status.message, "3"), message);
}

/* "Fail fast": the others learn of the exit, they do not sit out their timeout. */
static void assert_others_fail_fast_after_exit(fsdp_backend_kind backend) {
    const scenario *s = run_exiting_rank(backend);
    int r;
    char message[900];
    for (r = 0; r < 3; r++) {
        const rank_report *report = &s->rank[r];
        if (r == EXITING_RANK) continue;
        snprintf(message, sizeof message, "[%s] rank %d: %s after %d ms (timeout %d ms): '%s'",
                 fsdp_backend_name(backend), r, fsdp_result_name(report->rc), report->elapsed_ms, EXIT_TIMEOUT_MS,
                 report->message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_TRUE_MESSAGE(is_one_of(report->rc, FSDP_ERR_PEER_LOST, FSDP_ERR_ABORTED), message);
        TEST_ASSERT_LESS_THAN_MESSAGE(EXIT_TIMEOUT_MS, report->elapsed_ms, message);
    }
}

static void test_rank_exiting_nonzero_over_shm_is_reported_by_launcher_with_rank_and_exit_code(void) {
    assert_launcher_reports_exit_code(FSDP_BACKEND_SHM);
}
static void test_rank_exiting_nonzero_over_shm_makes_other_ranks_fail_fast(void) {
    assert_others_fail_fast_after_exit(FSDP_BACKEND_SHM);
}
static void test_rank_exiting_nonzero_over_socket_is_reported_by_launcher_with_rank_and_exit_code(void) {
    assert_launcher_reports_exit_code(FSDP_BACKEND_SOCKET);
}
static void test_rank_exiting_nonzero_over_socket_makes_other_ranks_fail_fast(void) {
    assert_others_fail_fast_after_exit(FSDP_BACKEND_SOCKET);
}

/* ---------------------------------------------------------------------------------------------
   fsdp_comm_abort
   --------------------------------------------------------------------------------------------- */
#define ABORT_REASON "stopped by the test"
#define ABORT_TIMEOUT_MS 3000

/* Rank 0 aborts, then tries two ops; rank 1 just calls all_reduce. */
static int user_abort_main(fsdp_comm *comm, void *arg) {
    int rank = rank_index(comm);
    rank_report *report = &shared->rank[rank];
    float value = 1.0f, sum = 0.0f;
    double start;
    (void)arg;
    if (rank == 0) {
        fsdp_comm_abort(comm, ABORT_REASON);
        start = now_ms();
        report->rc = fsdp_all_reduce(comm, &value, &sum, 1, FSDP_F32, FSDP_SUM);
        report->elapsed_ms = (int)(now_ms() - start);
        start = now_ms();
        report->later_rc = fsdp_barrier(comm);
        report->later_elapsed_ms = (int)(now_ms() - start);
    } else {
        start = now_ms();
        report->rc = fsdp_all_reduce(comm, &value, &sum, 1, FSDP_F32, FSDP_SUM);
        report->elapsed_ms = (int)(now_ms() - start);
    }
    record_comm_error(report, comm);
    report->status = fsdp_comm_status(comm);
    report->done = 1;
    return 0;
}

static scenario user_abort_scenarios[2];

static const scenario *run_user_abort(fsdp_backend_kind backend) {
    scenario *s = &user_abort_scenarios[backend == FSDP_BACKEND_SOCKET];
    if (!s->ran) run_launch(s, backend, 2, ABORT_TIMEOUT_MS, user_abort_main, NULL);
    return s;
}

static void assert_ops_after_abort_fail(fsdp_backend_kind backend) {
    const scenario *s = run_user_abort(backend);
    const rank_report *report = &s->rank[0];
    char message[900];
    snprintf(message, sizeof message, "[%s] rank 0: all_reduce %s after %d ms, barrier %s after %d ms: '%s'",
             fsdp_backend_name(backend), fsdp_result_name(report->rc), report->elapsed_ms,
             fsdp_result_name(report->later_rc), report->later_elapsed_ms, report->message);
    TEST_ASSERT_TRUE_MESSAGE(report->done, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_ABORTED, report->rc, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_ABORTED, report->later_rc, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_ABORTED, report->status, message);
    TEST_ASSERT_LESS_THAN_MESSAGE(FAST_MS, report->elapsed_ms, message);
    TEST_ASSERT_LESS_THAN_MESSAGE(FAST_MS, report->later_elapsed_ms, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(report->message, ABORT_REASON), message);
}

static void assert_abort_reaches_other_rank(fsdp_backend_kind backend) {
    const scenario *s = run_user_abort(backend);
    const rank_report *report = &s->rank[1];
    char message[900];
    snprintf(message, sizeof message, "[%s] rank 1: %s after %d ms (timeout %d ms): '%s'", fsdp_backend_name(backend),
             fsdp_result_name(report->rc), report->elapsed_ms, ABORT_TIMEOUT_MS, report->message);
    TEST_ASSERT_TRUE_MESSAGE(report->done, message);
    TEST_ASSERT_TRUE_MESSAGE(is_one_of(report->rc, FSDP_ERR_ABORTED, FSDP_ERR_PEER_LOST), message);
    TEST_ASSERT_LESS_THAN_MESSAGE(ABORT_TIMEOUT_MS / 2, report->elapsed_ms, message);
}

static void test_ops_after_user_abort_over_shm_fail_with_aborted_naming_the_reason(void) {
    assert_ops_after_abort_fail(FSDP_BACKEND_SHM);
}
static void test_user_abort_over_shm_makes_the_other_ranks_op_fail_before_its_timeout(void) {
    assert_abort_reaches_other_rank(FSDP_BACKEND_SHM);
}
static void test_ops_after_user_abort_over_socket_fail_with_aborted_naming_the_reason(void) {
    assert_ops_after_abort_fail(FSDP_BACKEND_SOCKET);
}
static void test_user_abort_over_socket_makes_the_other_ranks_op_fail_before_its_timeout(void) {
    assert_abort_reaches_other_rank(FSDP_BACKEND_SOCKET);
}

#define WATCHDOG_AFTER_MS 100
#define LATE_RANK_DELAY_MS 1500
#define WATCHDOG_REASON "abort from a watchdog thread"

static void *abort_soon(void *arg) {
    sleep_ms(WATCHDOG_AFTER_MS);
    fsdp_comm_abort((fsdp_comm *)arg, WATCHDOG_REASON);
    return NULL;
}

/* Rank 0 waits in all_reduce for rank 1, which comes late; a thread of rank 0 aborts meanwhile. */
static int thread_abort_main(fsdp_comm *comm, void *arg) {
    int rank = rank_index(comm);
    rank_report *report = &shared->rank[rank];
    float value = 1.0f, sum = 0.0f;
    double start;
    pthread_t watchdog;
    int have_watchdog = 0;
    (void)arg;
    if (rank == 0) have_watchdog = pthread_create(&watchdog, NULL, abort_soon, comm) == 0;
    else sleep_ms(LATE_RANK_DELAY_MS);
    start = now_ms();
    report->rc = fsdp_all_reduce(comm, &value, &sum, 1, FSDP_F32, FSDP_SUM);
    report->elapsed_ms = (int)(now_ms() - start);
    if (have_watchdog) pthread_join(watchdog, NULL);
    record_comm_error(report, comm);
    report->done = 1;
    return 0;
}

static void test_user_abort_from_another_thread_interrupts_a_pending_op(void) {
    scenario s;
    const rank_report *report = &s.rank[0];
    char message[900];
    run_launch(&s, FSDP_BACKEND_SHM, 2, ABORT_TIMEOUT_MS, thread_abort_main, NULL);
    snprintf(message, sizeof message, "rank 0: %s after %d ms (abort at %d ms, peer at %d ms): '%s'",
             fsdp_result_name(report->rc), report->elapsed_ms, WATCHDOG_AFTER_MS, LATE_RANK_DELAY_MS, report->message);
    TEST_ASSERT_TRUE_MESSAGE(report->done, message);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_ABORTED, report->rc, message);
    TEST_ASSERT_LESS_THAN_MESSAGE(WATCHDOG_AFTER_MS + FAST_MS, report->elapsed_ms, message);
    TEST_ASSERT_TRUE_MESSAGE(contains(report->message, WATCHDOG_REASON), message);
}

/* ---------------------------------------------------------------------------------------------
   fsdp_comm_init_from_env
   --------------------------------------------------------------------------------------------- */
static const char *const launcher_variables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FSDP_BACKEND",
    "FSDP_JOB", "FSDP_TIMEOUT_MS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
    "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "TORCHELASTIC_RUN_ID", NULL};

static void clear_launcher_environment(void) {
    int i;
    for (i = 0; launcher_variables[i]; i++) unsetenv(launcher_variables[i]);
}

static void set_env_int(const char *name, int value) {
    char text[32];
    snprintf(text, sizeof text, "%d", value);
    setenv(name, text, 1);
}

static void env_child(int rank, const void *arg) {
    int port = *(const int *)arg;
    rank_report *report = &shared->rank[rank];
    fsdp_comm_desc defaults;
    fsdp_comm *comm = NULL;
    char errbuf[MESSAGE_BYTES] = "";
    char job[64];
    float value = (float)(rank + 1);
    clear_launcher_environment();
    set_env_int("RANK", rank);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_env_int("MASTER_PORT", port);
    setenv("FSDP_BACKEND", "socket", 1);
    snprintf(job, sizeof job, "fsdp-test-env-%ld", (long)getppid());
    setenv("FSDP_JOB", job, 1);
    memset(&defaults, 0, sizeof defaults);
    defaults.timeout_ms = TIMEOUT_MS;
    report->rc = fsdp_comm_init_from_env(&comm, &defaults, errbuf, sizeof errbuf);
    copy_text(report->message, sizeof report->message, errbuf);
    if (report->rc == FSDP_SUCCESS && comm) {
        report->backend = (int)fsdp_comm_backend(comm);
        report->rank = fsdp_comm_rank(comm);
        report->world = fsdp_comm_size(comm);
        report->later_rc = fsdp_all_reduce(comm, &value, &report->sum, 1, FSDP_F32, FSDP_SUM);
        copy_text(report->later_message, sizeof report->later_message, fsdp_comm_last_error(comm));
        fsdp_comm_destroy(comm);
    }
    report->done = 1;
}

static void test_init_from_env_with_socket_backend_joins_two_ranks(void) {
    int port = pick_free_port(), r;
    int hung = fork_ranks(2, env_child, &port, TIMEOUT_MS + 5000);
    char message[1400];
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, hung, "a rank hung in fsdp_comm_init_from_env");
    for (r = 0; r < 2; r++) {
        const rank_report *report = &shared->rank[r];
        snprintf(message, sizeof message, "rank %d: init %s '%s'; all_reduce %s '%s'", r, fsdp_result_name(report->rc),
                 report->message, fsdp_result_name(report->later_rc), report->later_message);
        TEST_ASSERT_TRUE_MESSAGE(report->done, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, report->rc, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_BACKEND_SOCKET, report->backend, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(r, report->rank, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(2, report->world, message);
        TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, report->later_rc, message);
        TEST_ASSERT_TRUE_MESSAGE(report->sum == 3.0f, message);
    }
}

/* Calls fsdp_comm_init_from_env in this process; the environment is expected to be wrong. */
static void assert_env_error_names(const char *variable) {
    fsdp_comm_desc defaults;
    fsdp_comm *comm = (fsdp_comm *)&defaults; /* anything but NULL, to see that it is cleared */
    char errbuf[MESSAGE_BYTES] = "";
    char message[MESSAGE_BYTES + 100];
    int rc;
    memset(&defaults, 0, sizeof defaults);
    defaults.timeout_ms = SHORT_TIMEOUT_MS; /* bounds the damage if the error is missed */
    rc = fsdp_comm_init_from_env(&comm, &defaults, errbuf, sizeof errbuf);
    snprintf(message, sizeof message, "returned %s, errbuf '%s'", fsdp_result_name(rc), errbuf);
    if (rc == FSDP_SUCCESS && comm) fsdp_comm_destroy(comm);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_ERR_ENV, rc, message);
    TEST_ASSERT_NULL_MESSAGE(comm, message);
    TEST_ASSERT_TRUE_MESSAGE(contains_word(errbuf, variable), message);
}

static void set_valid_socket_environment(void) {
    clear_launcher_environment();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_env_int("MASTER_PORT", pick_free_port());
    setenv("FSDP_BACKEND", "socket", 1);
}

static void test_init_from_env_with_malformed_world_size_returns_env_error_naming_it(void) {
    set_valid_socket_environment();
    setenv("WORLD_SIZE", "two", 1);
    assert_env_error_names("WORLD_SIZE");
}

static void test_init_from_env_without_rank_returns_env_error_naming_it(void) {
    set_valid_socket_environment();
    setenv("WORLD_SIZE", "2", 1);
    unsetenv("RANK");
    assert_env_error_names("RANK");
}

static void test_init_from_env_with_unknown_backend_returns_env_error_naming_it(void) {
    set_valid_socket_environment();
    setenv("FSDP_BACKEND", "bogus", 1);
    assert_env_error_names("FSDP_BACKEND");
}

/* ---------------------------------------------------------------------------------------------
   restarts (fsdp_launch_desc.max_restarts)
   --------------------------------------------------------------------------------------------- */
/* Rank 1 fails in attempts below arg's count; everyone all_reduces its attempt number. */
static int fail_early_attempts(fsdp_comm *comm, void *arg) {
    const char *text = getenv("FSDP_RESTART_COUNT");
    int attempt = text ? atoi(text) : -1, failing = *(const int *)arg;
    float x = (float)attempt;
    if (fsdp_comm_rank(comm) == 1 && attempt < failing) return 7;
    if (fsdp_all_reduce(comm, &x, &x, 1, FSDP_F32, FSDP_SUM) != FSDP_SUCCESS) return 1;
    return x == (float)(attempt * fsdp_comm_size(comm)) ? 0 : 2;
}

static int launch_with_restarts(int max_restarts, int failing, fsdp_launch_status *status) {
    fsdp_launch_desc d;
    memset(&d, 0, sizeof d);
    d.nprocs = 3;
    d.timeout_ms = SHORT_TIMEOUT_MS;
    d.max_restarts = max_restarts;
    d.logger = capturing_logger();
    return fsdp_launch_ex(&d, fail_early_attempts, &failing, status);
}

static void test_launch_with_restarts_starts_every_rank_again_and_succeeds(void) {
    fsdp_launch_status status;
    int rc = launch_with_restarts(2, 2, &status);
    TEST_ASSERT_EQUAL_INT_MESSAGE(FSDP_SUCCESS, rc, status.message);
    TEST_ASSERT_EQUAL_INT(2, status.restarts);
}

static void test_launch_gives_up_after_max_restarts_naming_the_last_failure(void) {
    fsdp_launch_status status;
    int rc = launch_with_restarts(1, 5, &status);
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_RANK_FAILED, rc);
    TEST_ASSERT_EQUAL_INT(1, status.restarts);
    TEST_ASSERT_EQUAL_INT(1, status.failed_rank);
    TEST_ASSERT_EQUAL_INT(7, status.exit_code);
}

static void test_launch_without_restarts_runs_once(void) {
    fsdp_launch_status status;
    TEST_ASSERT_EQUAL_INT(FSDP_ERR_RANK_FAILED, launch_with_restarts(0, 1, &status));
    TEST_ASSERT_EQUAL_INT(0, status.restarts);
}

void setUp(void) {}
void tearDown(void) { clear_launcher_environment(); }

int main(void) {
    shared = (shared_reports *)map_shared(sizeof *shared);
    signal(SIGPIPE, SIG_IGN);
    clear_launcher_environment();
    UNITY_BEGIN();
    RUN_TEST(test_mismatched_ops_over_shm_fail_every_rank_naming_both_ops);
    RUN_TEST(test_mismatched_ops_over_socket_fail_every_rank_naming_both_ops);
    RUN_TEST(test_mismatched_counts_over_shm_fail_every_rank_naming_both_counts);
    RUN_TEST(test_mismatched_counts_over_socket_fail_every_rank_naming_both_counts);
    RUN_TEST(test_mismatched_dtypes_over_shm_fail_every_rank_naming_both_dtypes);
    RUN_TEST(test_mismatched_dtypes_over_socket_fail_every_rank_naming_both_dtypes);
    RUN_TEST(test_op_after_a_failure_over_shm_fails_fast_with_aborted_keeping_the_first_message);
    RUN_TEST(test_op_after_a_failure_over_socket_fails_fast_with_aborted_keeping_the_first_message);

    RUN_TEST(test_shm_init_with_a_rank_that_never_joins_times_out_within_the_bound);
    RUN_TEST(test_shm_init_with_a_rank_that_never_joins_names_the_missing_rank);
    RUN_TEST(test_shm_init_with_a_rank_that_never_joins_leaves_nothing_in_dev_shm);
    RUN_TEST(test_socket_init_with_a_rank_that_never_joins_times_out_within_the_bound);
    RUN_TEST(test_socket_init_with_a_rank_that_never_joins_names_the_missing_rank);

    RUN_TEST(test_rank_killed_mid_all_reduce_over_shm_makes_survivors_fail_within_timeout);
    RUN_TEST(test_rank_killed_mid_all_reduce_over_shm_is_reported_by_launcher_with_rank_and_signal);
    RUN_TEST(test_rank_killed_mid_all_reduce_over_shm_leaves_nothing_in_dev_shm);
    RUN_TEST(test_rank_killed_mid_all_reduce_of_fsdp_comm_alloc_memory_makes_survivors_fail_within_timeout);
    RUN_TEST(test_rank_killed_mid_all_reduce_of_fsdp_comm_alloc_memory_leaves_nothing_in_dev_shm);
    RUN_TEST(test_rank_killed_mid_all_reduce_over_socket_makes_survivors_fail_within_timeout);
    RUN_TEST(test_rank_killed_mid_all_reduce_over_socket_is_reported_by_launcher_with_rank_and_signal);
    RUN_TEST(test_rank_killed_mid_all_reduce_over_socket_leaves_nothing_in_dev_shm);
    RUN_TEST(test_rank_exiting_nonzero_over_shm_is_reported_by_launcher_with_rank_and_exit_code);
    RUN_TEST(test_rank_exiting_nonzero_over_shm_makes_other_ranks_fail_fast);
    RUN_TEST(test_rank_exiting_nonzero_over_socket_is_reported_by_launcher_with_rank_and_exit_code);
    RUN_TEST(test_rank_exiting_nonzero_over_socket_makes_other_ranks_fail_fast);

    RUN_TEST(test_socket_peers_with_different_job_tokens_both_fail_within_the_bound);
    RUN_TEST(test_socket_peer_with_a_different_job_token_is_rejected_naming_the_job);
    RUN_TEST(test_socket_peers_with_different_world_sizes_both_fail_within_the_bound);
    RUN_TEST(test_socket_peer_with_a_different_world_size_is_rejected_naming_the_world_size);

    RUN_TEST(test_ops_after_user_abort_over_shm_fail_with_aborted_naming_the_reason);
    RUN_TEST(test_user_abort_over_shm_makes_the_other_ranks_op_fail_before_its_timeout);
    RUN_TEST(test_ops_after_user_abort_over_socket_fail_with_aborted_naming_the_reason);
    RUN_TEST(test_user_abort_over_socket_makes_the_other_ranks_op_fail_before_its_timeout);
    RUN_TEST(test_user_abort_from_another_thread_interrupts_a_pending_op);

    RUN_TEST(test_init_from_env_with_socket_backend_joins_two_ranks);
    RUN_TEST(test_init_from_env_with_malformed_world_size_returns_env_error_naming_it);
    RUN_TEST(test_init_from_env_without_rank_returns_env_error_naming_it);
    RUN_TEST(test_init_from_env_with_unknown_backend_returns_env_error_naming_it);
    RUN_TEST(test_launch_with_restarts_starts_every_rank_again_and_succeeds);
    RUN_TEST(test_launch_gives_up_after_max_restarts_naming_the_last_failure);
    RUN_TEST(test_launch_without_restarts_runs_once);
    return UNITY_END();
}
