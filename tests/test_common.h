/* test_common.h - the helpers the test programs share, written once: time and text, a host name
   of a process's own (UTS namespaces), forked children and shared memory, launches, temporary
   directories and files, what a checkpoint directory holds (ckpt_dir_exact, ckpt_file_exact:
   also for campaigns), the fuzz corpora, reference dtype conversions independent of fsdp.h, and
   the dense layers of the test models.

   A test file includes it after fsdp.h (which sets the feature macros for the system headers)
   and unity.h; it brings the C and POSIX headers below, so a test file includes only the others
   it needs. Every helper is static and marked unused, so a file that uses only some of them
   compiles warning-free with -Wall -Wextra -Wpedantic -Werror. Helpers that assert are meant for
   the parent (they may run in a forked child only where the comment says so); the others also
   run in children, which never assert. */
#ifndef TEST_COMMON_H
#define TEST_COMMON_H

#include "unity.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__GNUC__) || defined(__clang__)
#define TEST_UNUSED __attribute__((unused))
#else
#define TEST_UNUSED
#endif

/* ---------------------------------------------------------------------------------------------
   time and text
   --------------------------------------------------------------------------------------------- */
/* Milliseconds on the monotonic clock. */
static TEST_UNUSED double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1000.0 + (double)t.tv_nsec / 1e6;
}

static TEST_UNUSED void sleep_ms(int ms) {
    struct timespec delay;
    delay.tv_sec = ms / 1000;
    delay.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&delay, NULL);
}

/* Appends src to the string in dst, truncating to size; snprintf("%s") would trip
   -Wformat-truncation on messages the library bounds at 512 bytes. */
static TEST_UNUSED void append_text(char *dst, size_t size, const char *src) {
    size_t used = strlen(dst);
    while (*src && used + 1 < size) dst[used++] = *src++;
    dst[used] = '\0';
}

/* src (or "(null)") into dst, truncated to size. */
static TEST_UNUSED void copy_text(char *dst, size_t size, const char *src) {
    dst[0] = '\0';
    append_text(dst, size, src ? src : "(null)");
}

static TEST_UNUSED int contains(const char *haystack, const char *needle) { return strstr(haystack, needle) != NULL; }

/* Asserts that text (a message, a log) contains part; the failure shows both. */
static TEST_UNUSED void assert_says(const char *text, const char *part) {
    static char failure[4096];
    copy_text(failure, sizeof failure, "expected '");
    append_text(failure, sizeof failure, part);
    append_text(failure, sizeof failure, "' in: \"");
    append_text(failure, sizeof failure, text ? text : "(null)");
    append_text(failure, sizeof failure, "\"");
    TEST_ASSERT_NOT_NULL_MESSAGE(text, failure);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(text, part), failure);
}

static TEST_UNUSED int bytes_all_equal(const unsigned char *bytes, size_t n, unsigned char value) {
    size_t i;
    for (i = 0; i < n; i++)
        if (bytes[i] != value) return 0;
    return 1;
}

/* Many checks summed up as one verdict: how many ran, how many failed, the first failure. */
typedef struct verdict {
    int checked, failed;
    char first_failure[900];
} verdict;

static TEST_UNUSED void record(verdict *v, int ok, const char *what) {
    v->checked++;
    if (ok) return;
    if (v->failed++ == 0) snprintf(v->first_failure, sizeof v->first_failure, "%s", what);
}

/* ---------------------------------------------------------------------------------------------
   a host name of this process's own (UTS namespaces: for tests of several hosts on one machine;
   needs _GNU_SOURCE, which fsdp.h defines when it comes first with FSDP_IMPLEMENTATION)
   --------------------------------------------------------------------------------------------- */
#ifdef _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>

static TEST_UNUSED int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC), ok;
    if (fd < 0) return -1;
    ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
    close(fd);
    return ok ? 0 : -1;
}

/* Without root: a user namespace of its own, mapping this user to itself, gives the rights to
   make the UTS namespace (and nothing on the machine). */
static TEST_UNUSED int enter_user_namespace(void) {
    char map[64];
    unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWUTS) != 0) return -1;
    snprintf(map, sizeof map, "%u %u 1\n", uid, uid);
    if (write_text("/proc/self/uid_map", map) != 0) return -1;
    if (write_text("/proc/self/setgroups", "deny") != 0) return -1;
    snprintf(map, sizeof map, "%u %u 1\n", gid, gid);
    return write_text("/proc/self/gid_map", map);
}

/* 0 once this process alone is called `name`; -1 with errno. */
static TEST_UNUSED int claim_host(const char *name) {
    if (unshare(CLONE_NEWUTS) != 0 && (errno != EPERM || enter_user_namespace() != 0)) return -1;
    return sethostname(name, strlen(name));
}
#endif

/* ---------------------------------------------------------------------------------------------
   shared memory, forked children and launches
   --------------------------------------------------------------------------------------------- */
/* A zero-filled MAP_SHARED region that forked children write and the parent reads; for main,
   before any test: exits if it cannot be mapped. */
static TEST_UNUSED void *map_shared(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

/* The MAP_SHARED region of one test (the board): mapped zeroed by map_board, which asserts,
   and unmapped by unmap_board in tearDown. */
static TEST_UNUSED void *board_memory;
static TEST_UNUSED size_t board_bytes;

static TEST_UNUSED void *map_board(size_t bytes) {
    board_memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TEST_ASSERT_TRUE_MESSAGE(board_memory != MAP_FAILED, "mmap of the shared board");
    board_bytes = bytes;
    memset(board_memory, 0, bytes);
    return board_memory;
}

static TEST_UNUSED void unmap_board(void) {
    if (board_memory && board_memory != MAP_FAILED) munmap(board_memory, board_bytes);
    board_memory = NULL;
}

/* Forks a child that runs fn(arg) and exits with its return value; alarm_s > 0: the child dies
   of SIGALRM after that many seconds (should it outlive the parent's wait). */
static TEST_UNUSED pid_t spawn(int (*fn)(void *), void *arg, unsigned alarm_s) {
    pid_t pid;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        if (alarm_s) alarm(alarm_s);
        _exit(fn(arg));
    }
    return pid;
}

/* Waits up to limit_ms for the child, killing it then. Returns 1 if it ended by itself (its
   wait status in *status), 0 if it had to be killed. */
static TEST_UNUSED int wait_child(pid_t pid, int limit_ms, int *status) {
    double until = now_ms() + limit_ms;
    *status = 0;
    while (waitpid(pid, status, WNOHANG) == 0) {
        if (now_ms() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            return 0;
        }
        sleep_ms(2);
    }
    return 1;
}

/* Waits up to limit_ms for a child, killing it after that. Returns its exit status or -1. */
static TEST_UNUSED int reap(pid_t pid, int limit_ms) {
    int status;
    if (!wait_child(pid, limit_ms, &status)) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* fsdp_launch_ex of nprocs ranks on backend, every wait of their communicators bounded by
   timeout_ms; stdout and stderr are flushed first so that no child repeats buffered output. */
static TEST_UNUSED int launch_ranks(int nprocs, fsdp_backend_kind backend, int timeout_ms, fsdp_rank_fn fn, void *arg,
                                    fsdp_launch_status *status) {
    fsdp_launch_desc d;
    memset(&d, 0, sizeof d);
    d.nprocs = nprocs;
    d.backend = backend;
    d.timeout_ms = timeout_ms;
    fflush(stdout);
    fflush(stderr);
    return fsdp_launch_ex(&d, fn, arg, status);
}

/* Launches fn on shm ranks for every world size from 1 to max_world, one after the other, for a
   program whose tests read what the ranks of every size left: rc[w] gets world w's
   fsdp_launch_ex result and message + w * message_size its status message ("" on success).
   Returns the seconds it all took. */
static TEST_UNUSED double launch_every_world(int max_world, int timeout_ms, fsdp_rank_fn fn, int *rc, char *message,
                                             size_t message_size) {
    double start = fsdp_now();
    int world;
    for (world = 1; world <= max_world; world++) {
        fsdp_launch_status status;
        rc[world] = launch_ranks(world, FSDP_BACKEND_SHM, timeout_ms, fn, NULL, &status);
        copy_text(message + (size_t)world * message_size, message_size, rc[world] == FSDP_SUCCESS ? "" : status.message);
    }
    return fsdp_now() - start;
}

/* A step of a forked rank's work, in a function that returns a result code and records where it
   failed (ranks report; only the parent asserts): a non-zero code from call is returned, after
   `where` (a const char * lvalue) gets name. The function declares int rc. */
#define RETURN_IF_FAILED(call, where, name) \
    do {                                    \
        if ((rc = (call)) != 0) {           \
            (where) = (name);               \
            return rc;                      \
        }                                   \
    } while (0)
/* The same for a call that returned the pointer ptr: NULL sets where to name and returns
   FSDP_ERR_STATE. */
#define RETURN_IF_NULL(ptr, where, name) \
    do {                                 \
        if (!(ptr)) {                    \
            (where) = (name);            \
            return FSDP_ERR_STATE;       \
        }                                \
    } while (0)

/* A communicator of one rank in this process, its job named after the test and the process. */
static TEST_UNUSED int open_one_rank_comm(fsdp_comm **comm, const char *name) {
    fsdp_comm_desc cd;
    char job[64];
    memset(&cd, 0, sizeof cd);
    snprintf(job, sizeof job, "%.40s-%d", name, (int)getpid());
    cd.world_size = 1;
    cd.job = job;
    cd.timeout_ms = 5000;
    return fsdp_comm_init(comm, &cd);
}

/* What a one-rank test left in this process, released (each may be NULL) and set to NULL: for
   tearDown. */
static TEST_UNUSED void release_one_rank(fsdp_ctx **ctx, fsdp_model **model, fsdp_comm **comm) {
    fsdp_destroy(*ctx);
    *ctx = NULL;
    fsdp_model_destroy(*model);
    *model = NULL;
    fsdp_comm_destroy(*comm);
    *comm = NULL;
}

/* Reads what arrives on fd within limit_ms, up to cap bytes or until the peer closes (then
   *closed is set, where closed is not NULL); returns the byte count. */
static TEST_UNUSED size_t read_some(int fd, void *buf, size_t cap, int limit_ms, int *closed) {
    size_t got = 0;
    double start = now_ms();
    if (closed) *closed = 0;
    while (got < cap && now_ms() - start < limit_ms) {
        struct pollfd p;
        ssize_t n;
        p.fd = fd;
        p.events = POLLIN;
        p.revents = 0;
        if (poll(&p, 1, 50) <= 0) continue;
        if ((n = recv(fd, (char *)buf + got, cap - got, 0)) <= 0) {
            if (closed) *closed = 1;
            break;
        }
        got += (size_t)n;
    }
    return got;
}

/* A free TCP port on the loopback interface: bind port 0 and read what the kernel chose. */
static TEST_UNUSED int pick_free_port(void) {
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    int port = 0, fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 && getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}

/* ---------------------------------------------------------------------------------------------
   temporary directories and files
   --------------------------------------------------------------------------------------------- */
/* A fresh directory /tmp/<name>-XXXXXX (mkdtemp), its path in dir: 0, or -1 with errno set. */
static TEST_UNUSED int make_temp_dir(char *dir, size_t size, const char *name) {
    snprintf(dir, size, "/tmp/%s-XXXXXX", name);
    return mkdtemp(dir) ? 0 : -1;
}

/* setUp's directory for one test (make_temp_dir); fails the test if it cannot be made. */
static TEST_UNUSED void make_test_dir(char *dir, size_t size, const char *name) {
    static char message[300];
    if (make_temp_dir(dir, size, name) != 0) {
        snprintf(message, sizeof message, "mkdtemp(%.200s): %s", dir, strerror(errno));
        TEST_FAIL_MESSAGE(message);
    }
}

static TEST_UNUSED int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes path and everything below it (symbolic links themselves, never what they point to). */
static TEST_UNUSED int remove_tree(const char *path) { return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static TEST_UNUSED void write_file(const char *path, const void *bytes, size_t size) {
    static char message[1200];
    FILE *f = fopen(path, "wb");
    snprintf(message, sizeof message, "cannot write %.1000s: %s", path, strerror(errno));
    TEST_ASSERT_NOT_NULL_MESSAGE(f, message);
    TEST_ASSERT_EQUAL_size_t(size, fwrite(bytes, 1, size, f));
    TEST_ASSERT_EQUAL_INT(0, fclose(f));
}

/* The whole file in malloc'd memory (a 0 byte after it, not counted in *size). */
static TEST_UNUSED unsigned char *read_whole_file(const char *path, size_t *size) {
    static char message[1200];
    FILE *f = fopen(path, "rb");
    unsigned char *bytes;
    long n;
    snprintf(message, sizeof message, "cannot read %.1000s: %s", path, strerror(errno));
    TEST_ASSERT_NOT_NULL_MESSAGE(f, message);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    bytes = (unsigned char *)malloc((size_t)n + 1);
    if (!bytes) fclose(f);
    TEST_ASSERT_NOT_NULL(bytes);
    *size = (size_t)n;
    bytes[*size] = 0;
    TEST_ASSERT_EQUAL_size_t(*size, fread(bytes, 1, *size, f));
    fclose(f);
    return bytes;
}

/* Number of entries of dir (but . and ..) whose names contain part (NULL: all); -1 if dir
   cannot be read. */
static TEST_UNUSED int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && (!part || strstr(e->d_name, part))) n++;
    closedir(d);
    return n;
}

/* What a path is, for the messages below: "missing", "not a regular file" or "" (one). */
static TEST_UNUSED const char *regular_file_problem(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? "missing" : strerror(errno);
    return S_ISREG(st.st_mode) ? "" : "not a regular file";
}

/* Whether the sharded checkpoint directory dir holds exactly what its index names: index.json
   (which opens), every file it names as a regular file, and nothing else (no file of another
   save, no temporary file). 1 if so; else 0 with the first problem in why. No assertions
   (children may call it; so may a campaign after each save). */
static TEST_UNUSED int ckpt_dir_exact(const char *dir, char *why, size_t n) {
    fsdp_index *ix = NULL;
    char err[512], path[1200];
    struct dirent *e;
    DIR *d = NULL;
    int i, named, ok = 1;
    if (fsdp_index_open(&ix, dir, err, sizeof err) != 0) {
        snprintf(why, n, "%s", err);
        return 0;
    }
    for (i = 0; ok && i < fsdp_index_num_files(ix); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, fsdp_index_file(ix, i));
        if (*regular_file_problem(path)) {
            snprintf(why, n, "index.json names %.500s, which is %s", path, regular_file_problem(path));
            ok = 0;
        }
    }
    if (ok && !(d = opendir(dir))) {
        snprintf(why, n, "cannot list %.500s: %s", dir, strerror(errno));
        ok = 0;
    }
    while (ok && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || strcmp(e->d_name, "index.json") == 0) continue;
        for (named = 0, i = 0; !named && i < fsdp_index_num_files(ix); i++) named = strcmp(e->d_name, fsdp_index_file(ix, i)) == 0;
        if (!named) {
            snprintf(why, n, "%.500s holds %.255s, which index.json does not name", dir, e->d_name);
            ok = 0;
        }
    }
    if (d) closedir(d);
    fsdp_index_close(ix);
    return ok;
}

/* Whether the full checkpoint path stands alone: a regular file, and no temporary file of a
   save of it ("<path>.tmp.*") beside it. 1 if so; else 0 with why. No assertions. */
static TEST_UNUSED int ckpt_file_exact(const char *path, char *why, size_t n) {
    char dir[1024], prefix[1100];
    const char *slash = strrchr(path, '/');
    if (*regular_file_problem(path)) {
        snprintf(why, n, "%.500s is %s", path, regular_file_problem(path));
        return 0;
    }
    if (!slash || slash == path) snprintf(dir, sizeof dir, "%s", slash ? "/" : ".");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    snprintf(prefix, sizeof prefix, "%s.tmp.", slash ? slash + 1 : path);
    if (count_entries(dir, prefix) != 0) {
        snprintf(why, n, "%.400s holds a temporary file %.300s*", dir, prefix);
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------------
   the fuzz targets' corpora (tests/corpus/<name> and its crashers/ folder)
   --------------------------------------------------------------------------------------------- */
/* The folder of corpus `name` plus sub: the environment variable env_var if set, else fixed (a
   -D at build time) if not NULL, else tests/corpus/<name> found from this file's path. */
static TEST_UNUSED void corpus_dir(char *out, size_t size, const char *env_var, const char *fixed, const char *name,
                                   const char *sub) {
    const char *env = getenv(env_var);
    const char *file = __FILE__, *slash = strrchr(file, '/');
    if (env && *env) snprintf(out, size, "%s%s", env, sub);
    else if (fixed) snprintf(out, size, "%s%s", fixed, sub);
    else if (slash) snprintf(out, size, "%.*s/corpus/%s%s", (int)(slash - file), file, name, sub);
    else snprintf(out, size, "corpus/%s%s", name, sub);
}

/* Runs parse on every regular file of dir, each in a child of its own (so that a crash names the
   file, bounded by alarm at 20 s), and asserts that each exits with status 0; codes says what
   other statuses mean (4: the child could not read the file). Counts the files in *files;
   returns -1 if dir cannot be opened. */
static TEST_UNUSED int replay_corpus_dir(const char *dir, int (*parse)(const unsigned char *bytes, size_t size),
                                         const char *codes, int *files) {
    static char message[1400];
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1024];
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        pid_t pid;
        int status;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        fflush(NULL);
        pid = fork();
        if (pid == 0) {
            unsigned char *bytes = (unsigned char *)malloc((size_t)st.st_size + 1);
            FILE *f = fopen(path, "rb");
            size_t n;
            alarm(20);
            closedir(d); /* the child's copy: nothing of the parent's stays allocated in it */
            if (!bytes || !f) _exit(4);
            n = fread(bytes, 1, (size_t)st.st_size, f);
            fclose(f);
            status = parse(bytes, n);
            free(bytes);
            _exit(status);
        }
        TEST_ASSERT_TRUE(pid > 0);
        TEST_ASSERT_EQUAL_INT(pid, waitpid(pid, &status, 0));
        if (WIFSIGNALED(status))
            snprintf(message, sizeof message, "%s: the parser crashed (signal %d)", path, WTERMSIG(status));
        else
            snprintf(message, sizeof message, "%s: exit status %d (%.200s)", path, WEXITSTATUS(status), codes);
        TEST_ASSERT_TRUE_MESSAGE(WIFEXITED(status) && WEXITSTATUS(status) == 0, message);
        (*files)++;
    }
    closedir(d);
    return 0;
}

/* The whole test of a fuzz target's corpus: every seed of corpus `name` (corpus_dir) and every
   crasher in its crashers/ folder (absent when the fuzzer found nothing) through parse
   (replay_corpus_dir); ignored, saying where it looked, when there is no corpus. */
static TEST_UNUSED void assert_corpus_replays(const char *env_var, const char *fixed, const char *name,
                                              int (*parse)(const unsigned char *bytes, size_t size), const char *codes) {
    static char message[700];
    char seeds[512], crashers[512];
    int files = 0;
    corpus_dir(seeds, sizeof seeds, env_var, fixed, name, "");
    corpus_dir(crashers, sizeof crashers, env_var, fixed, name, "/crashers");
    if (replay_corpus_dir(seeds, parse, codes, &files) != 0) {
        snprintf(message, sizeof message, "no corpus at %s (run from the repository root or set %s)", seeds, env_var);
        TEST_IGNORE_MESSAGE(message);
    }
    replay_corpus_dir(crashers, parse, codes, &files);
    TEST_ASSERT_GREATER_THAN(0, files);
}

/* ---------------------------------------------------------------------------------------------
   floats and dtypes: reference conversions written from the formats, independent of fsdp.h
   --------------------------------------------------------------------------------------------- */
static TEST_UNUSED uint32_t bits_of(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static TEST_UNUSED float float_of(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* The value of every f16 bit pattern; filled by build_f16_decode_table in main. */
static TEST_UNUSED float f16_decode_table[65536];

static TEST_UNUSED void build_f16_decode_table(void) {
    uint32_t h;
    for (h = 0; h < 65536; h++) {
        int exponent = (int)((h >> 10) & 0x1F), mantissa = (int)(h & 0x3FF);
        float magnitude;
        if (exponent == 0) magnitude = ldexpf((float)mantissa, -24);
        else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
        else magnitude = ldexpf((float)(mantissa + 1024), exponent - 25);
        f16_decode_table[h] = (h & 0x8000u) ? -magnitude : magnitude;
    }
}

/* f32 -> bf16, round to nearest even; a NaN stays a quiet NaN with its sign. */
static TEST_UNUSED uint16_t reference_bf16(float value) {
    uint32_t u = bits_of(value);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* f32 -> f16, round to nearest even, subnormals, overflow to infinity, NaN quiet with its sign. */
static TEST_UNUSED uint16_t reference_f16(float value) {
    uint32_t u = bits_of(value);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7FFFFFFFu;
    if (u > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
    if (u >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);       /* >= 65520: infinity */
    if (u <= 0x33000000u) return sign;                               /* <= 2^-25: zero */
    if (u < 0x38800000u) {                                           /* < 2^-14: subnormal */
        uint32_t exponent = u >> 23, mantissa = (u & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126 - exponent, quotient = mantissa >> shift;
        uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (quotient & 1u))) quotient++;
        return (uint16_t)(sign | quotient);
    }
    u += 0xFFFu + ((u >> 13) & 1u);
    u -= 112u << 23;
    return (uint16_t)(sign | (u >> 13));
}

static TEST_UNUSED size_t element_size(fsdp_dtype dtype) { return dtype == FSDP_F32 ? 4 : 2; }

/* A 32-bit integer hash (the inputs of the collective tests). */
static TEST_UNUSED uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

/* |got - want| relative to max(|want|, floor): an element near zero has no meaningful relative
   error of its own and is measured against floor, the scale of the values compared. NaN if
   either is NaN (so that `!(rel_error(...) <= tolerance)` catches it). */
static TEST_UNUSED double rel_error(double got, double want, double floor) {
    return fabs(got - want) / fmax(fabs(want), floor);
}

static TEST_UNUSED const char *kind_name(fsdp_coll_kind kind) {
    switch (kind) {
    case FSDP_COLL_ALL_GATHER: return "all_gather";
    case FSDP_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case FSDP_COLL_ALL_REDUCE: return "all_reduce";
    case FSDP_COLL_BROADCAST: return "broadcast";
    case FSDP_COLL_BARRIER: return "barrier";
    case FSDP_COLL_ALL_TO_ALL: return "all_to_all";
    default: return "?";
    }
}

static TEST_UNUSED const char *op_name(fsdp_reduce_op op) {
    return op == FSDP_SUM ? "SUM" : op == FSDP_AVG ? "AVG" : op == FSDP_MAX ? "MAX" : "?";
}

static TEST_UNUSED const char *dtype_label(fsdp_dtype dtype) {
    return dtype == FSDP_F32 ? "f32" : dtype == FSDP_BF16 ? "bf16" : "f16";
}

/* ---------------------------------------------------------------------------------------------
   the dense layers of the test models, in plain C (the references compute with these)
   --------------------------------------------------------------------------------------------- */
/* out (n,out_dim) = in (n,in_dim) @ weight^T + bias; weight is (out_dim,in_dim) */
static TEST_UNUSED void linear_forward(float *out, const float *in, const float *weight, const float *bias, int n,
                                       int in_dim, int out_dim) {
    int i, o, k;
    for (i = 0; i < n; i++)
        for (o = 0; o < out_dim; o++) {
            float sum = bias[o];
            for (k = 0; k < in_dim; k++) sum += weight[o * in_dim + k] * in[i * in_dim + k];
            out[i * out_dim + o] = sum;
        }
}

/* din (n,in_dim) += dout @ weight; dweight += dout^T @ in; dbias += column sums of dout */
static TEST_UNUSED void linear_backward(float *din, float *dweight, float *dbias, const float *dout, const float *in,
                                        const float *weight, int n, int in_dim, int out_dim) {
    int i, o, k;
    for (i = 0; i < n; i++)
        for (o = 0; o < out_dim; o++) {
            float d = dout[i * out_dim + o];
            dbias[o] += d;
            for (k = 0; k < in_dim; k++) {
                dweight[o * in_dim + k] += d * in[i * in_dim + k];
                din[i * in_dim + k] += d * weight[o * in_dim + k];
            }
        }
}

/* x0 (n,dim) = x * scale (dim), broadcast over rows */
static TEST_UNUSED void scale_forward(float *x0, const float *x, const float *scale, int n, int dim) {
    int i, k;
    for (i = 0; i < n; i++)
        for (k = 0; k < dim; k++) x0[i * dim + k] = x[i * dim + k] * scale[k];
}

/* dscale (dim) += column sums of dx0 * x */
static TEST_UNUSED void scale_backward(float *dscale, const float *dx0, const float *x, int n, int dim) {
    int i, k;
    for (i = 0; i < n; i++)
        for (k = 0; k < dim; k++) dscale[k] += dx0[i * dim + k] * x[i * dim + k];
}

/* The two-layer model test_checkpoint.c and test_async_save.c train, each at its own sizes:
       x0 = x * scale; h = relu(layers.0(x0)); y = layers.1(h); loss = mean over rows of 0.5 * |y - target|^2
   Its sizes, and the ids fsdp_model gave its two Linear units (layer) and its parameters, in the
   order scale, layers.0.weight, layers.0.bias, layers.1.weight, layers.1.bias (param). */
typedef struct relu_mlp {
    int in, hidden, out, rows; /* rows: the batch of every step, split over the ranks */
    const int *layer, *param;
} relu_mlp;

/* Builds the relu_mlp's model "MLP" at the sizes in, hidden, out: *model, the ids of the
   ModuleList "layers" (*layers) and of its Linear units "0" and "1" (layer), and of the parameters
   (param, in relu_mlp's order). 0, or the code of the call that failed. */
static TEST_UNUSED int relu_mlp_build(fsdp_model **model, int in, int hidden, int out, int *layers, int layer[2],
                                      int param[5]) {
    fsdp_init_rule normal = {FSDP_INIT_NORMAL, 0.0f, 0.5f, NULL, NULL};
    fsdp_init_rule uniform = {FSDP_INIT_UNIFORM, -0.1f, 0.1f, NULL, NULL};
    fsdp_init_rule around_one = {FSDP_INIT_UNIFORM, 0.5f, 1.5f, NULL, NULL};
    int64_t s_scale[1], s_w0[2], s_b0[1], s_w1[2], s_b1[1];
    int rc;
    s_scale[0] = in, s_w0[0] = hidden, s_w0[1] = in, s_b0[0] = hidden, s_w1[0] = out, s_w1[1] = hidden, s_b1[0] = out;
    if ((rc = fsdp_model_create(model, "MLP")) != 0) return rc;
    if ((param[0] = fsdp_model_param(*model, 0, "scale", 1, s_scale, around_one)) < 0) return param[0];
    if ((*layers = fsdp_model_module(*model, 0, "layers", "ModuleList")) < 0) return *layers;
    if ((layer[0] = fsdp_model_module(*model, *layers, "0", "Linear")) < 0) return layer[0];
    if ((layer[1] = fsdp_model_module(*model, *layers, "1", "Linear")) < 0) return layer[1];
    if ((param[1] = fsdp_model_param(*model, layer[0], "weight", 2, s_w0, normal)) < 0) return param[1];
    if ((param[2] = fsdp_model_param(*model, layer[0], "bias", 1, s_b0, uniform)) < 0) return param[2];
    if ((param[3] = fsdp_model_param(*model, layer[1], "weight", 2, s_w1, normal)) < 0) return param[3];
    if ((param[4] = fsdp_model_param(*model, layer[1], "bias", 1, s_b1, uniform)) < 0) return param[4];
    return 0;
}

/* The rows lo..hi-1 of step `step`'s batch: inputs x (hi-lo, in) and targets (hi-lo, out). */
static TEST_UNUSED void relu_mlp_batch(const relu_mlp *m, int step, int lo, int hi, float *x, float *target) {
    int i, j;
    for (i = lo; i < hi; i++) {
        for (j = 0; j < m->in; j++) x[(i - lo) * m->in + j] = sinf((float)i * 1.3f + (float)j + (float)step * 0.1f);
        for (j = 0; j < m->out; j++) target[(i - lo) * m->out + j] = cosf((float)i * 0.7f + (float)j);
    }
}

/* One training iteration of the relu_mlp through the hooks on this rank's rows (the mean over
   them; the ranks' gradients are averaged), then fsdp_step and fsdp_zero_grad. `step` selects the
   batch. In a forked rank: 0, or a call's result code with *where naming the call. */
static TEST_UNUSED int relu_mlp_train_step(fsdp_ctx *ctx, const relu_mlp *m, fsdp_comm *comm, int step,
                                          const char **where) {
    int world = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm);
    int lo = rank * m->rows / world, hi = (rank + 1) * m->rows / world, n = hi - lo, i, rc;
    const int in = m->in, hidden = m->hidden, out = m->out, *layer = m->layer, *param = m->param;
    float x[n * in], x0[n * in], h[n * hidden], y[n * out], target[n * out], dy[n * out], dh[n * hidden], dx0[n * in];
    float *scale, *w, *b, *gw, *gb;
#define RELU_MLP_HOOK(call, name) RETURN_IF_FAILED(call, *where, name)
#define RELU_MLP_NEED(ptr, expr, name)     \
    do {                                   \
        (ptr) = (expr);                    \
        RETURN_IF_NULL(ptr, *where, name); \
    } while (0)
    relu_mlp_batch(m, step, lo, hi, x, target);
    /* forward */
    RELU_MLP_HOOK(fsdp_pre_forward(ctx, 0), "pre_forward(root)");
    RELU_MLP_NEED(scale, fsdp_param(ctx, param[0]), "fsdp_param(scale)");
    scale_forward(x0, x, scale, n, in);
    RELU_MLP_HOOK(fsdp_pre_forward(ctx, layer[0]), "pre_forward(layers.0)");
    RELU_MLP_NEED(w, fsdp_param(ctx, param[1]), "fsdp_param(layers.0.weight)");
    RELU_MLP_NEED(b, fsdp_param(ctx, param[2]), "fsdp_param(layers.0.bias)");
    linear_forward(h, x0, w, b, n, in, hidden);
    for (i = 0; i < n * hidden; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
    RELU_MLP_HOOK(fsdp_post_forward(ctx, layer[0]), "post_forward(layers.0)");
    RELU_MLP_HOOK(fsdp_pre_forward(ctx, layer[1]), "pre_forward(layers.1)");
    RELU_MLP_NEED(w, fsdp_param(ctx, param[3]), "fsdp_param(layers.1.weight)");
    RELU_MLP_NEED(b, fsdp_param(ctx, param[4]), "fsdp_param(layers.1.bias)");
    linear_forward(y, h, w, b, n, hidden, out);
    RELU_MLP_HOOK(fsdp_post_forward(ctx, layer[1]), "post_forward(layers.1)");
    RELU_MLP_HOOK(fsdp_post_forward(ctx, 0), "post_forward(root)");
    /* loss: dy = (y - target) / rows */
    for (i = 0; i < n * out; i++) dy[i] = (y[i] - target[i]) / (float)n;
    /* backward: the root's backward encloses its children's */
    memset(dh, 0, sizeof dh);
    memset(dx0, 0, sizeof dx0);
    RELU_MLP_HOOK(fsdp_pre_backward(ctx, 0), "pre_backward(root)");
    RELU_MLP_HOOK(fsdp_pre_backward(ctx, layer[1]), "pre_backward(layers.1)");
    RELU_MLP_NEED(w, fsdp_param(ctx, param[3]), "fsdp_param(layers.1.weight) in backward");
    RELU_MLP_NEED(gw, fsdp_grad(ctx, param[3]), "fsdp_grad(layers.1.weight)");
    RELU_MLP_NEED(gb, fsdp_grad(ctx, param[4]), "fsdp_grad(layers.1.bias)");
    linear_backward(dh, gw, gb, dy, h, w, n, hidden, out);
    RELU_MLP_HOOK(fsdp_post_backward(ctx, layer[1]), "post_backward(layers.1)");
    for (i = 0; i < n * hidden; i++) dh[i] = h[i] > 0.0f ? dh[i] : 0.0f;
    RELU_MLP_HOOK(fsdp_pre_backward(ctx, layer[0]), "pre_backward(layers.0)");
    RELU_MLP_NEED(w, fsdp_param(ctx, param[1]), "fsdp_param(layers.0.weight) in backward");
    RELU_MLP_NEED(gw, fsdp_grad(ctx, param[1]), "fsdp_grad(layers.0.weight)");
    RELU_MLP_NEED(gb, fsdp_grad(ctx, param[2]), "fsdp_grad(layers.0.bias)");
    linear_backward(dx0, gw, gb, dh, x0, w, n, in, hidden);
    RELU_MLP_HOOK(fsdp_post_backward(ctx, layer[0]), "post_backward(layers.0)");
    RELU_MLP_NEED(gw, fsdp_grad(ctx, param[0]), "fsdp_grad(scale)");
    scale_backward(gw, dx0, x, n, in);
    RELU_MLP_HOOK(fsdp_post_backward(ctx, 0), "post_backward(root)");
    RELU_MLP_HOOK(fsdp_step(ctx, 0.0f, NULL), "fsdp_step");
    RELU_MLP_HOOK(fsdp_zero_grad(ctx), "fsdp_zero_grad");
#undef RELU_MLP_HOOK
#undef RELU_MLP_NEED
    return 0;
}

/* In a forked rank: claims the host name `host`, then joins the socket world of `world` ranks
   whose rendezvous is 127.0.0.1:port as rank `rank`. 0 with *comm; 1 if no host name could be had
   (where no namespace can be made), else fsdp_comm_init's code; why says what failed. */
static TEST_UNUSED int join_world_on_host(fsdp_comm **comm, const char *host, int rank, int world, int port,
                                          const char *job, int timeout_ms, char *why, size_t why_size) {
    fsdp_comm_desc d;
    int rc;
    *comm = NULL;
    if (claim_host(host) != 0) {
        snprintf(why, why_size, "cannot give a rank a host name of its own (a UTS namespace: as root, or in a user "
                 "namespace): %s", strerror(errno));
        return 1;
    }
    memset(&d, 0, sizeof d);
    d.backend = FSDP_BACKEND_SOCKET;
    d.rank = rank;
    d.world_size = world;
    d.master_addr = "127.0.0.1";
    d.master_port = port;
    d.timeout_ms = timeout_ms;
    d.secret = "test-hosts-secret";
    d.job = job;
    if ((rc = fsdp_comm_init(comm, &d)) != FSDP_SUCCESS)
        snprintf(why, why_size, "fsdp_comm_init: %.300s", fsdp_comm_last_error(NULL));
    return rc;
}

/* The rank function of run_on_hosts: comm is NULL when joining failed (join_rc and why say how). */
typedef void (*host_rank_fn)(fsdp_comm *comm, int join_rc, const char *why, int rank, void *arg);

typedef struct host_rank_plan {
    int rank, world, port, timeout_ms;
    char host[48], job[48];
    host_rank_fn fn;
    void *arg;
} host_rank_plan;

#define TEST_NO_HOST_NAME 77 /* a rank's exit status when it cannot have a host name of its own */
#define TEST_MAX_HOST_RANKS 64

static TEST_UNUSED int host_rank_child(void *arg) {
    const host_rank_plan *h = (const host_rank_plan *)arg;
    fsdp_comm *comm = NULL;
    char why[512] = "";
    int rc = join_world_on_host(&comm, h->host, h->rank, h->world, h->port, h->job, h->timeout_ms, why, sizeof why);
    if (rc == 1) return TEST_NO_HOST_NAME;
    h->fn(rc == FSDP_SUCCESS ? comm : NULL, rc, why, h->rank, h->arg);
    fsdp_comm_destroy(comm);
    return 0;
}

/* Forks world ranks over sockets on one machine, rank r on the host "<prefix>-<host_of[r]>" (a
   UTS namespace each), each running fn once joined (or told why not) and reaped within 90 s.
   1 if no host name could be had here (the caller ignores its test), else 0: what each rank did
   is fn's to record where the parent reads it. */
static TEST_UNUSED int run_on_hosts(int world, const int *host_of, const char *prefix, int timeout_ms, host_rank_fn fn,
                                    void *arg) {
    static host_rank_plan plans[TEST_MAX_HOST_RANKS];
    pid_t pids[TEST_MAX_HOST_RANKS];
    int r, no_name = 0, port = pick_free_port();
    if (world > TEST_MAX_HOST_RANKS) return fprintf(stderr, "run_on_hosts: %d ranks, at most %d\n", world, TEST_MAX_HOST_RANKS), 0;
    for (r = 0; r < world; r++) {
        plans[r].rank = r;
        plans[r].world = world;
        plans[r].port = port;
        plans[r].timeout_ms = timeout_ms;
        plans[r].fn = fn;
        plans[r].arg = arg;
        snprintf(plans[r].host, sizeof plans[r].host, "%s-%d", prefix, host_of[r]);
        snprintf(plans[r].job, sizeof plans[r].job, "%s-%d-%d", prefix, (int)getpid(), port);
        pids[r] = spawn(host_rank_child, &plans[r], 120);
    }
    for (r = 0; r < world; r++) no_name |= reap(pids[r], 90000) == TEST_NO_HOST_NAME;
    return no_name;
}

/* Whether fsdp_param_info_get's shard of parameter w holds this rank's slice of full (as
   fsdp_gather_param gave it) and fsdp_set_param_shard writes where fsdp_gather_param then finds
   it (the slice put back after). Collective over the shard group: every rank of it calls it. */
static TEST_UNUSED int shard_pointers_right(fsdp_ctx *ctx, int w, const float *full, int numel) {
    fsdp_param_info info;
    float *after = (float *)malloc(sizeof(float) * (size_t)numel), *slice = NULL;
    int64_t i, n = 0;
    int ok, set_rc = -1, gather_rc;
    ok = after && fsdp_param_info_get(ctx, w, &info) == 0 && info.shard;
    if (ok) n = info.shard_end - info.shard_begin;
    if (ok && (slice = (float *)malloc(sizeof(float) * (size_t)(n + 1))) != NULL) {
        ok = memcmp(info.shard, full + info.shard_begin, sizeof(float) * (size_t)n) == 0;
        for (i = 0; i < n; i++) slice[i] = full[info.shard_begin + i] + 1.0f;
        set_rc = fsdp_set_param_shard(ctx, w, slice);
    }
    gather_rc = after ? fsdp_gather_param(ctx, w, after) : -1; /* (every rank: it is collective) */
    ok = ok && slice && set_rc == 0 && gather_rc == 0 &&
         memcmp(after + info.shard_begin, slice, sizeof(float) * (size_t)n) == 0;
    if (slice && set_rc == 0) fsdp_set_param_shard(ctx, w, full + info.shard_begin);
    free(slice);
    free(after);
    return ok;
}

#endif /* TEST_COMMON_H */
