/* link_sample: how a host's link spends its time, sampled from inside the host (its network
   namespace), for examples/bench_wire_bed.sh --link-sample (issue 37: where the step waits).

       link_sample IFACE RATE [--interval-ms N] [--max-seconds S]

   Every N ms (default 5; 1..1000) it reads what IFACE has transmitted
   (/sys/class/net/IFACE/statistics/tx_bytes) and counts the interval as one of
     busy     IFACE sent at least half of RATE (bits per second) over the interval
     idle     it sent less than a fifth, and at the interval's end this namespace's TCP sockets
              held no byte unacknowledged or unsent (the tx_queue column of /proc/net/tcp,
              summed): the programs had nothing to send
     waiting  it sent less than a fifth while the sockets held bytes: data out and not yet
              acknowledged, or held back by TCP
   (between a fifth and a half: in none of the three, only in the total), until SIGTERM or SIGINT
   or S seconds (default 3600), and then prints one line:
       link_sample: IFACE busy B% idle I% waiting W% of T s (K intervals)
   Exit status 0, 2 for bad usage or a file it cannot read (named on stderr).
   /proc/net/tcp is read only after a quiet interval: each read walks the kernel's table of every
   socket, and at 5 ms on 4 hosts reading it every time took a tenth of a 2-core machine.

   The files are the kernel's, read as untrusted all the same: a line of /proc/net/tcp that does not
   parse, or a table larger than 4 MiB, makes that interval count as neither idle nor waiting.
   tests/test_link_sample.c includes this file with LINK_SAMPLE_NO_MAIN and calls ls_tcp_queued,
   ls_share and ls_count. Build: cc -std=c99 -O2 examples/link_sample.c -o build/link_sample */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LS_TABLE_MAX ((size_t)4 << 20)

typedef struct ls_counts {
    long long busy, idle, waiting, total;
} ls_counts;

/* The bytes held by the sockets of a /proc/net/tcp table (text, its header line first): the sum
   of the tx_queue column. -1 if a line does not parse. */
static long long ls_tcp_queued(const char *table) {
    const char *line = strchr(table, '\n');
    long long sum = 0;
    while (line && line[1]) {
        unsigned long tx, rx;
        char st[8];
        line++;
        if (sscanf(line, "%*s %*s %*s %7s %lx:%lx", st, &tx, &rx) != 3) return -1;
        if ((double)tx > 1e12) return -1; /* (a socket holds at most its buffer) */
        sum += (long long)tx;
        line = strchr(line, '\n');
    }
    return sum;
}

/* The share of rate (bits/s) that sent bytes over seconds are: below LS_QUIET, the caller asks
   the sockets (ls_count's queued). */
#define LS_QUIET 0.2
static double ls_share(long long sent, double seconds, double rate) {
    return seconds > 0 && rate > 0 ? (double)sent * 8 / (rate * seconds) : 0;
}

/* Counts one interval of the share `share` (ls_share); queued, the sockets' bytes at its end
   when the share is below LS_QUIET (-1: unknown). */
static void ls_count(ls_counts *c, double share, long long queued) {
    c->total++;
    if (share >= 0.5) c->busy++;
    else if (share < LS_QUIET && queued >= 0) {
        if (queued == 0) c->idle++;
        else c->waiting++;
    }
}

#ifndef LINK_SAMPLE_NO_MAIN
static volatile sig_atomic_t ls_stop;
static void ls_on_signal(int sig) { (void)sig, ls_stop = 1; }

static double ls_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The whole of a file into *buf (grown as needed up to LS_TABLE_MAX): its length, or -1. */
static long ls_read_all(const char *path, char **buf, size_t *cap) {
    int fd = open(path, O_RDONLY);
    size_t n = 0;
    if (fd < 0) return -1;
    for (;;) {
        ssize_t k;
        if (n + 1 >= *cap) {
            char *grown = *cap * 2 <= LS_TABLE_MAX ? (char *)realloc(*buf, *cap * 2) : NULL;
            if (!grown) { close(fd); return -1; }
            *buf = grown, *cap *= 2;
        }
        k = read(fd, *buf + n, *cap - 1 - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    (*buf)[n] = 0;
    return (long)n;
}

/* IFACE's transmitted bytes, or -1. */
static long long ls_tx_bytes(const char *path) {
    char text[64];
    int fd = open(path, O_RDONLY);
    ssize_t k = fd < 0 ? -1 : pread(fd, text, sizeof text - 1, 0);
    if (fd >= 0) close(fd);
    if (k <= 0) return -1;
    text[k] = 0;
    return strtoll(text, NULL, 10);
}

static long long ls_queued_now(char **buf, size_t *cap) {
    return ls_read_all("/proc/net/tcp", buf, cap) < 0 ? -1 : ls_tcp_queued(*buf);
}

static int ls_usage(const char *why) {
    fprintf(stderr, "link_sample: %s\nusage: link_sample IFACE RATE_BITS_PER_S [--interval-ms N] [--max-seconds S]\n", why);
    return 2;
}

int main(int argc, char **argv) {
    char path[256], *buf = (char *)malloc(65536), *end;
    size_t cap = 65536;
    double rate, t0, t, start, max_s = 3600;
    long interval_ms = 5;
    long long sent0, sent;
    ls_counts c = {0, 0, 0, 0};
    struct timespec nap;
    struct sigaction sa;
    int i;
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: link_sample IFACE RATE_BITS_PER_S [--interval-ms N] [--max-seconds S]\n"
               "(examples/link_sample.c's top comment says what it counts)\n");
        free(buf);
        return 0;
    }
    if (argc < 3 || !buf) return ls_usage("IFACE and RATE are needed");
    if (strlen(argv[1]) > 64 || strchr(argv[1], '/') || argv[1][0] == '.') return ls_usage("bad IFACE");
    rate = strtod(argv[2], &end);
    if (*end || !(rate > 0)) return ls_usage("RATE must be bits per second, > 0");
    for (i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--interval-ms")) interval_ms = strtol(argv[i + 1], &end, 10);
        else if (!strcmp(argv[i], "--max-seconds")) max_s = strtod(argv[i + 1], &end);
        else return ls_usage("unknown option");
        if (*end) return ls_usage("an option's value is not a number");
    }
    if (i != argc || interval_ms < 1 || interval_ms > 1000 || !(max_s > 0)) return ls_usage("bad options");
    snprintf(path, sizeof path, "/sys/class/net/%s/statistics/tx_bytes", argv[1]);
    if ((sent0 = ls_tx_bytes(path)) < 0) { fprintf(stderr, "link_sample: cannot read %s\n", path); return 2; }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ls_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    nap.tv_sec = interval_ms / 1000, nap.tv_nsec = interval_ms % 1000 * 1000000L;
    start = t0 = ls_now();
    while (!ls_stop && t0 - start < max_s) {
        double share;
        nanosleep(&nap, NULL);
        t = ls_now(), sent = ls_tx_bytes(path);
        if (sent >= sent0) {
            share = ls_share(sent - sent0, t - t0, rate);
            ls_count(&c, share, share < LS_QUIET ? ls_queued_now(&buf, &cap) : -1);
        }
        t0 = t, sent0 = sent >= 0 ? sent : sent0;
    }
    printf("link_sample: %s busy %.0f%% idle %.0f%% waiting %.0f%% of %.1f s (%lld intervals)\n", argv[1],
           c.total ? 100.0 * (double)c.busy / (double)c.total : 0, c.total ? 100.0 * (double)c.idle / (double)c.total : 0,
           c.total ? 100.0 * (double)c.waiting / (double)c.total : 0, t0 - start, c.total);
    free(buf);
    return 0;
}
#endif
