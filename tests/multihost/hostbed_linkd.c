/* hostbed_linkd: a user-space delay/loss line for tests/multihost/hostbed.sh, used only on kernels
 * built without sch_netem (tc's netem qdisc), where tc cannot add delay or random loss.
 *
 * It creates one tun device (L3, no packet-info header) inside the network namespace of every
 * host of the bed, reads the IPv4 packets a host sends into its tun, and writes each one into the
 * tun of the host that owns the destination address, after the sending host's delay and subject to
 * its loss probability; a host marked "down" neither sends nor receives. hostbed.sh routes the
 * bed's subnet over these tun devices once this daemon runs (rate is still tc tbf, on the tun).
 *
 * usage: hostbed_linkd OWNER_PID CTLDIR TUNNAME NETNS_FILE IPV4 [NETNS_FILE IPV4 ...]
 *   CTLDIR/params  read at start and on SIGHUP:  "gen G" then lines "HOST DELAY_NS LOSS_PPM DOWN"
 *   CTLDIR/ack     written with "G" once generation G is in force ("0" once the tuns exist)
 *   CTLDIR/pid     this process
 * Exits when OWNER_PID is gone, on SIGTERM/SIGINT, or on a fatal error; the tun devices vanish with
 * it. Bounded: at most 64 MiB queued per sending host (more is dropped, as a full netem queue does).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOSTS 64
#define PKT_MAX 65536
#define QUEUE_MAX_BYTES (64L << 20)

struct pkt {
    struct pkt *next;
    uint64_t due;
    int dst, len;
    unsigned char data[];
};

struct host {
    int fd;
    uint32_t ip; /* network order */
    uint64_t delay_ns;
    uint32_t loss; /* drop when a 32-bit random number is below this */
    int down;
    struct pkt *head, *tail;
    uint64_t last_due;
    long queued;
    unsigned long sent, dropped;
};

static struct host hosts[MAX_HOSTS];
static int nhosts;
static const char *ctldir;
static volatile sig_atomic_t reload, stop;
static uint64_t rng;

/* 0 once PID has exited (a zombie counts as exited: its parent may be slow to reap it) */
static int alive(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X' && p[2] != 'x';
}

static void on_hup(int s) { (void)s; reload = 1; }
static void on_term(int s) { (void)s; stop = 1; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint32_t rand32(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

static void die(const char *what) {
    fprintf(stderr, "hostbed_linkd: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void write_ack(const char *gen) {
    char tmp[4096], dst[4096];
    snprintf(tmp, sizeof tmp, "%s/ack.tmp", ctldir);
    snprintf(dst, sizeof dst, "%s/ack", ctldir);
    FILE *f = fopen(tmp, "w");
    if (!f) die("write ack");
    fprintf(f, "%s\n", gen);
    fclose(f);
    if (rename(tmp, dst) != 0) die("rename ack");
}

static void load_params(void) {
    char path[4096], line[256], gen[64] = "";
    snprintf(path, sizeof path, "%s/params", ctldir);
    FILE *f = fopen(path, "r");
    if (!f) return; /* nothing configured yet: no delay, no loss */
    while (fgets(line, sizeof line, f)) {
        int h, down;
        unsigned long long delay, ppm;
        if (sscanf(line, "gen %63s", gen) == 1) continue;
        if (sscanf(line, "%d %llu %llu %d", &h, &delay, &ppm, &down) == 4 && h >= 0 && h < nhosts) {
            hosts[h].delay_ns = delay;
            hosts[h].loss = ppm >= 1000000 ? UINT32_MAX : (uint32_t)(ppm * 4294967296.0 / 1e6);
            hosts[h].down = down;
        }
    }
    fclose(f);
    if (gen[0]) write_ack(gen);
}

static void deliver(int dst, const unsigned char *data, int len) {
    if (write(hosts[dst].fd, data, (size_t)len) < 0) hosts[dst].dropped++; /* the stack dropped it */
}

static void handle(int src, const unsigned char *buf, int len, uint64_t now) {
    struct host *s = &hosts[src];
    if (len < 20 || (buf[0] >> 4) != 4) return; /* IPv4 only (IPv6 is off in the hosts) */
    uint32_t daddr;
    memcpy(&daddr, buf + 16, 4);
    int d;
    for (d = 0; d < nhosts; d++)
        if (hosts[d].ip == daddr) break;
    if (d == nhosts || d == src) return;
    if (s->down || hosts[d].down || (s->loss && rand32() < s->loss)) {
        s->dropped++;
        return;
    }
    s->sent++;
    if (s->delay_ns == 0 && !s->head) {
        deliver(d, buf, len);
        return;
    }
    if (s->queued + len > QUEUE_MAX_BYTES) {
        s->dropped++;
        return;
    }
    struct pkt *p = malloc(sizeof *p + (size_t)len);
    if (!p) {
        s->dropped++;
        return;
    }
    p->next = NULL;
    p->dst = d;
    p->len = len;
    memcpy(p->data, buf, (size_t)len);
    p->due = now + s->delay_ns;
    if (p->due < s->last_due) p->due = s->last_due; /* keep the order when the delay shrinks */
    s->last_due = p->due;
    s->queued += len;
    if (s->tail) s->tail->next = p;
    else s->head = p;
    s->tail = p;
}

int main(int argc, char **argv) {
    if (argc < 6 || (argc - 4) % 2 != 0 || (argc - 4) / 2 > MAX_HOSTS) {
        fprintf(stderr, "usage: hostbed_linkd OWNER_PID CTLDIR TUNNAME NETNS_FILE IPV4 [NETNS_FILE IPV4 ...]\n");
        return 2;
    }
    pid_t owner = (pid_t)atol(argv[1]);
    ctldir = argv[2];
    const char *tunname = argv[3];
    nhosts = (argc - 4) / 2;
    rng = now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;

    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0) die("open /proc/self/ns/net");
    for (int i = 0; i < nhosts; i++) {
        const char *nspath = argv[4 + 2 * i], *ip = argv[5 + 2 * i];
        if (inet_pton(AF_INET, ip, &hosts[i].ip) != 1) {
            fprintf(stderr, "hostbed_linkd: bad IPv4 address %s\n", ip);
            return 2;
        }
        int ns = open(nspath, O_RDONLY | O_CLOEXEC);
        if (ns < 0) die(nspath);
        if (setns(ns, CLONE_NEWNET) != 0) die("setns");
        close(ns);
        int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) die("open /dev/net/tun");
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
        snprintf(ifr.ifr_name, IFNAMSIZ, "%s", tunname);
        if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("TUNSETIFF");
        hosts[i].fd = fd;
    }
    if (setns(self, CLONE_NEWNET) != 0) die("setns back");
    close(self);

    sigset_t block, waitmask;
    sigemptyset(&block);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &waitmask); /* these signals are delivered only inside ppoll */
    sigdelset(&waitmask, SIGHUP);
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGINT);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_hup;
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    load_params();
    char pidpath[4096];
    snprintf(pidpath, sizeof pidpath, "%s/pid", ctldir);
    FILE *pf = fopen(pidpath, "w");
    if (!pf) die("write pid");
    fprintf(pf, "%ld\n", (long)getpid());
    fclose(pf);
    write_ack("0");

    static unsigned char buf[PKT_MAX];
    struct pollfd pfd[MAX_HOSTS];
    for (int i = 0; i < nhosts; i++) pfd[i].fd = hosts[i].fd, pfd[i].events = POLLIN;
    uint64_t next_owner_check = 0;
    while (!stop) {
        uint64_t now = now_ns();
        if (reload) {
            reload = 0;
            load_params();
        }
        if (now >= next_owner_check) {
            if (!alive(owner)) break;
            next_owner_check = now + 200000000u;
        }
        uint64_t wake = next_owner_check;
        for (int i = 0; i < nhosts; i++) {
            struct host *h = &hosts[i];
            while (h->head && h->head->due <= now) {
                struct pkt *p = h->head;
                h->head = p->next;
                if (!h->head) h->tail = NULL;
                h->queued -= p->len;
                deliver(p->dst, p->data, p->len);
                free(p);
            }
            if (h->head && h->head->due < wake) wake = h->head->due;
        }
        struct timespec ts = {0, 0};
        if (wake > now) ts.tv_sec = (time_t)((wake - now) / 1000000000u), ts.tv_nsec = (long)((wake - now) % 1000000000u);
        int r = ppoll(pfd, (nfds_t)nhosts, &ts, &waitmask);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("ppoll");
        }
        if (r == 0) continue;
        now = now_ns();
        for (int i = 0; i < nhosts; i++) {
            if (!(pfd[i].revents & POLLIN)) continue;
            for (int k = 0; k < 64; k++) { /* bounded batch, so one busy host cannot starve the others */
                ssize_t n = read(hosts[i].fd, buf, sizeof buf);
                if (n <= 0) break;
                handle(i, buf, (int)n, now);
            }
        }
    }
    for (int i = 0; i < nhosts; i++)
        fprintf(stderr, "hostbed_linkd: host %d: %lu packets passed, %lu dropped\n", i, hosts[i].sent, hosts[i].dropped);
    return 0;
}
