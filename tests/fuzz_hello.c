/* fuzz_hello.c - libFuzzer target for the socket backend's handshake and header parsing, with
   the fuzz input as what a hostile peer sends. The first byte chooses the target (its low 7
   bits % 3) and whether the harness signs for the peer (bit 0x80: the harness knows the key
   and makes the peer's mac valid, so the fuzzer also reaches what follows authentication):
     0  fsdp__sock_judge_hello: the rest is a hello (zero-padded), judged against a fixed
        challenge and key by a listener admitting ranks 1..3 of 4. Unsigned, it must be refused;
        admitted, it must be authentic and claim a rank, world and session that fit, having
        dialled where the connection arrived (127.0.0.1:29500) or the listener (0.0.0.0:29500).
     1  fsdp__sock_greet, the connector's side, over a socketpair: the rest is the acceptor's
        stream (its 40-byte challenge, then its reply to our hello) sent by a thread that reads
        our hello in between and, signing, macs the reply over both nonces. Unsigned, the
        greeting must fail; any failure must say why in printable text.
     2  fsdp__sock_check_header on a fake two-rank comm (no live connection): the rest is the
        72-byte header peer 1 sent, then what follows it on its stream (an abort frame's
        message). Signing here means the header carries the expected fingerprint. Every error
        must be printable, a message from the peer included.
   Each execution takes well under a millisecond: the peer's stream is closed after the input,
   so nothing waits for bytes that will not come.

   Build and run (make fuzz-hello does this):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz_hello.c \
             -o build/fuzz_hello -lpthread -lm
       mkdir -p build/fuzz-corpus-hello
       ./build/fuzz_hello -max_total_time=120 -dict=tests/fuzz_hello.dict build/fuzz-corpus-hello tests/corpus/hello
   Crashes are written as crash-<sha1>: minimise them and move them to tests/corpus/hello/crashers/.
   tests/corpus/make_hello_corpus.c writes the seeds. */
#define _GNU_SOURCE
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { TARGET_JUDGE, TARGET_GREET, TARGET_HEADER, NUM_TARGETS };
#define SIGN 0x80
#define WORLD 4
#define FIRST_RANK 1

static const unsigned char fuzz_key[32] = "fuzz_hello: the job's fixed key";
static const unsigned char fuzz_session[16] = "session-of-job!";

static void assert_printable(const char *text, size_t size) {
    size_t i;
    for (i = 0; i < size && text[i]; i++)
        if ((unsigned char)text[i] < 0x20 || (unsigned char)text[i] == 0x7f) abort();
    if (i == size) abort(); /* not terminated */
}

/* --- 0: a hello judged by an acceptor ------------------------------------------------------- */
static void judge(const uint8_t *bytes, size_t size, int sign) {
    fsdp__sock_challenge challenge;
    fsdp__sock_hello hello;
    const char *verdict;
    char why[160];
    int authentic = -1;
    struct sockaddr_in arrived, listener; /* where the connection came in, and the listener's address */
    memset(&arrived, 0, sizeof arrived);
    arrived.sin_addr.s_addr = htonl(0x7f000001);
    arrived.sin_port = htons(29500);
    listener = arrived;
    listener.sin_addr.s_addr = 0; /* 0.0.0.0:29500 */
    memset(&challenge, 0, sizeof challenge);
    challenge.magic = FSDP__SOCK_MAGIC;
    challenge.version = FSDP__SOCK_VERSION;
    memset(challenge.nonce, 0x5c, sizeof challenge.nonce);
    memset(&hello, 0, sizeof hello);
    memcpy(&hello, bytes, size < sizeof hello ? size : sizeof hello);
    if (sign)
        fsdp__sock_mac(hello.mac, fuzz_key, "fsdp.h hello", challenge.nonce, 32, &hello, offsetof(fsdp__sock_hello, mac),
                       NULL, 0);
    why[0] = 0;
    verdict = fsdp__sock_judge_hello(&hello, &challenge, fuzz_key, WORLD, FIRST_RANK, fuzz_session, &arrived, &listener,
                                     &authentic, why, sizeof why);
    if (authentic != 0 && authentic != 1) abort();
    if (!sign && authentic) abort(); /* a forged mac */
    if (verdict == NULL) {
        if (!authentic || hello.world != WORLD || hello.rank < FIRST_RANK || hello.rank >= WORLD ||
            memcmp(hello.session, fuzz_session, 16) != 0 || hello.dial_port > 65535 ||
            !((hello.dial_ip == arrived.sin_addr.s_addr && htons((uint16_t)hello.dial_port) == arrived.sin_port) ||
              (hello.dial_ip == listener.sin_addr.s_addr && htons((uint16_t)hello.dial_port) == listener.sin_port)))
            abort();
    } else {
        if (verdict != why || !why[0]) abort();
        assert_printable(why, sizeof why);
    }
}

/* --- 1: the connector greets an acceptor that speaks the fuzz input -------------------------- */
typedef struct acceptor {
    int fd;
    const uint8_t *bytes;
    size_t size;
    int sign;
} acceptor;

static int send_all(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);
        if (got <= 0) return -1;
        done += (size_t)got;
    }
    return 0;
}

static void *acceptor_run(void *arg) {
    acceptor *a = (acceptor *)arg;
    size_t challenge_len = a->size < sizeof(fsdp__sock_challenge) ? a->size : sizeof(fsdp__sock_challenge);
    fsdp__sock_hello hello;
    fsdp__sock_reply reply;
    size_t reply_len;
    if (send_all(a->fd, a->bytes, challenge_len) != 0 || a->size <= challenge_len) goto done;
    /* the connector's hello (bounded: it may have given up on the challenge) */
    if (fsdp__sock_io_full(a->fd, &hello, sizeof hello, fsdp__now_ms() + 500, 0) != 0) goto done;
    reply_len = a->size - challenge_len < sizeof reply ? a->size - challenge_len : sizeof reply;
    memset(&reply, 0, sizeof reply);
    memcpy(&reply, a->bytes + challenge_len, reply_len);
    if (a->sign) { /* the mac over our nonce and the challenge's, as a holder of the key makes it */
        fsdp__sock_challenge sent;
        memset(&sent, 0, sizeof sent);
        memcpy(&sent, a->bytes, challenge_len);
        fsdp__sock_mac(reply.mac, fuzz_key, "fsdp.h reply", hello.nonce, 32, sent.nonce, 32, &reply,
                       offsetof(fsdp__sock_reply, mac));
        reply_len = sizeof reply;
    }
    send_all(a->fd, &reply, reply_len);
done:
    shutdown(a->fd, SHUT_WR); /* the end of the input is the end of the stream */
    return NULL;
}

static void greet(const uint8_t *bytes, size_t size, int sign) {
    int fds[2], rc;
    acceptor a;
    pthread_t thread;
    fsdp__sock_hello hello;
    fsdp__sock_reply reply;
    unsigned char nonces[64];
    char err[512];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
    a.fd = fds[1];
    a.bytes = bytes;
    a.size = size;
    a.sign = sign;
    if (pthread_create(&thread, NULL, acceptor_run, &a) != 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    memset(&hello, 0, sizeof hello);
    hello.rank = 2;
    hello.world = WORLD;
    memcpy(hello.session, fuzz_session, 16);
    err[0] = 0;
    rc = fsdp__sock_greet(NULL, fds[0], fuzz_key, &hello, fsdp__now_ms() + 300, &reply, nonces, "rank 0 at fuzz:1", err, sizeof err);
    close(fds[0]); /* an acceptor still waiting for our hello sees the end */
    pthread_join(thread, NULL);
    close(fds[1]);
    if (rc == 0) {
        if (!sign || reply.status != 0 || reply.magic != FSDP__SOCK_MAGIC) abort(); /* welcomed by a forger */
    } else {
        if (!err[0]) abort();
        assert_printable(err, sizeof err);
    }
}

/* --- 2: a collective header from peer 1 ---------------------------------------------------- */
static struct fsdp_comm fake_comm;
static fsdp__sock fake_sock;
static fsdp__sock_peer fake_peers[2];

static void check_header(const uint8_t *bytes, size_t size, int sign) {
    fsdp_coll c;
    fsdp__fingerprint fp;
    fsdp__sock_header *h = &fake_peers[1].in_header;
    size_t head = size < sizeof *h ? size : sizeof *h;
    int fds[2], rc;
    static int initialised;
    if (!initialised) {
        pthread_mutex_init(&fake_comm.error_lock, NULL);
        initialised = 1;
    }
    fake_comm.rank = 0;
    fake_comm.world = 2;
    fake_comm.backend = NULL; /* a failure aborts nothing */
    fake_comm.status = FSDP_SUCCESS;
    fake_comm.abort_called = 0;
    fake_comm.error[0] = 0;
    memset(&c, 0, sizeof c);
    c.kind = FSDP_COLL_ALL_REDUCE;
    c.dtype = FSDP_F32;
    c.op = FSDP_SUM;
    c.count = 16;
    c.seq = 7;
    c.tag = 3;
    fp = fsdp__fingerprint_of(&c);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
    memset(fake_peers, 0, sizeof fake_peers);
    fake_peers[0].fd = -1;
    fake_peers[1].fd = fds[0];
    memcpy(fake_peers[1].addr, "fuzz:1", 7);
    fake_peers[1].in_len = 64;
    fake_peers[1].in_header_done = sizeof *h;
    memcpy(h, bytes, head);
    if (sign) h->fp = fp;
    fake_sock.peers = fake_peers;
    if (size > head) send_all(fds[1], bytes + head, size - head < 4096 ? size - head : 4096);
    shutdown(fds[1], SHUT_WR);
    rc = fsdp__sock_check_header(&fake_comm, &fake_sock, 1, &c, &fp, 1);
    close(fds[0]);
    close(fds[1]);
    if (rc == 0) {
        if (h->magic != FSDP__SOCK_MAGIC || h->phase != 1 || h->payload != 64 || memcmp(&h->fp, &fp, sizeof fp) != 0) abort();
        if (fake_comm.status != FSDP_SUCCESS) abort();
    } else {
        if (fake_comm.status == FSDP_SUCCESS || !fake_comm.error[0]) abort();
        assert_printable(fake_comm.error, sizeof fake_comm.error);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *bytes;
    int target, sign;
    if (size < 1) return 0;
    target = (data[0] & ~SIGN) % NUM_TARGETS;
    sign = (data[0] & SIGN) != 0;
    /* a copy of exactly the rest: ASan then catches a read one byte past it */
    bytes = (uint8_t *)malloc(size - 1 ? size - 1 : 1);
    if (!bytes) return 0;
    if (size > 1) memcpy(bytes, data + 1, size - 1);
    if (target == TARGET_JUDGE) judge(bytes, size - 1, sign);
    else if (target == TARGET_GREET) greet(bytes, size - 1, sign);
    else check_header(bytes, size - 1, sign);
    free(bytes);
    return 0;
}
