/* make_hello_corpus.c - writes the seed corpus of tests/fuzz_hello.c into the directory given.
   Each seed is the control byte (target = value % 3; 0x80: the harness signs for the peer) and
   what the peer sends: a hello (target 0), an acceptor's challenge and reply (target 1), or a
   collective header and what follows it (target 2); valid ones and one defect each. Run from
   the repository root:
       cc -std=c99 -I. tests/corpus/make_hello_corpus.c -o /tmp/make_hello_corpus -lpthread -lm
       /tmp/make_hello_corpus tests/corpus/hello */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIGN 0x80
enum { TARGET_JUDGE, TARGET_GREET, TARGET_HEADER };

static const char *dir;

static void write_seed(const char *name, int control, const void *a, size_t a_size, const void *b, size_t b_size) {
    char path[512];
    unsigned char byte = (unsigned char)control;
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!(f = fopen(path, "wb")) || fwrite(&byte, 1, 1, f) != 1 || (a_size && fwrite(a, 1, a_size, f) != a_size) ||
        (b_size && fwrite(b, 1, b_size, f) != b_size) || fclose(f) != 0) {
        fprintf(stderr, "make_hello_corpus: cannot write %s\n", path);
        exit(1);
    }
}

/* What fuzz_hello's judge admits when signed: rank 1 of 4 in its session. */
static fsdp__sock_hello good_hello(void) {
    fsdp__sock_hello h;
    memset(&h, 0, sizeof h);
    h.magic = FSDP__SOCK_MAGIC;
    h.version = FSDP__SOCK_VERSION;
    h.rank = 1;
    h.world = 4;
    h.data_ip = 0x0100007fu;
    h.data_port = 29500;
    h.dial_ip = 0x0100007fu; /* it dialled 127.0.0.1:29500, where the connection arrived */
    h.dial_port = 29500;
    memcpy(h.session, "session-of-job!", 16);
    memset(h.nonce, 0x11, sizeof h.nonce);
    return h;
}

static fsdp__sock_challenge good_challenge(void) {
    fsdp__sock_challenge c;
    memset(&c, 0, sizeof c);
    c.magic = FSDP__SOCK_MAGIC;
    c.version = FSDP__SOCK_VERSION;
    memset(c.nonce, 0x22, sizeof c.nonce);
    return c;
}

static fsdp__sock_reply reply_with(uint32_t status, const char *reason) {
    fsdp__sock_reply r;
    memset(&r, 0, sizeof r);
    r.magic = FSDP__SOCK_MAGIC;
    r.status = status;
    if (reason) memcpy(r.reason, reason, strlen(reason) < sizeof r.reason ? strlen(reason) : sizeof r.reason);
    memcpy(r.session, "session-of-job!", 16);
    return r;
}

/* The header fuzz_hello's check_header expects (with its fingerprint when signed). */
static fsdp__sock_header header_with(uint32_t magic, uint32_t phase, uint64_t payload) {
    fsdp__sock_header h;
    fsdp_coll c;
    memset(&h, 0, sizeof h);
    memset(&c, 0, sizeof c);
    c.kind = FSDP_COLL_ALL_REDUCE;
    c.dtype = FSDP_F32;
    c.op = FSDP_SUM;
    c.count = 16;
    c.seq = 7;
    c.tag = 3;
    h.magic = magic;
    h.phase = phase;
    h.fp = fsdp__fingerprint_of(&c);
    h.payload = payload;
    return h;
}

int main(int argc, char **argv) {
    fsdp__sock_hello h;
    fsdp__sock_challenge c;
    fsdp__sock_reply r;
    fsdp__sock_header hd;
    unsigned char stream[1024];
    static const char hostile[] = "rank 0 says: \x1b]0;owned\x07\x1b[2J\xc2\x9b" "31m and more";
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    /* 0: hellos */
    h = good_hello();
    write_seed("judge-signed-admitted", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    write_seed("judge-unsigned", TARGET_JUDGE, &h, sizeof h, NULL, 0);
    h.world = 5;
    write_seed("judge-signed-other-world", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    h = good_hello();
    h.rank = 0;
    write_seed("judge-signed-rank-0", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    h.rank = 0xffffffffu;
    write_seed("judge-signed-rank-huge", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    h = good_hello();
    h.session[3] ^= 1;
    write_seed("judge-signed-other-session", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    h = good_hello();
    h.dial_port = 29501; /* dialled elsewhere: a relay */
    write_seed("judge-signed-relayed", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    h = good_hello();
    h.magic = 0x20544547u; /* "GET " */
    write_seed("judge-http", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    h = good_hello();
    h.version = 1;
    write_seed("judge-version-1", TARGET_JUDGE | SIGN, &h, sizeof h, NULL, 0);
    write_seed("judge-short", TARGET_JUDGE, &h, 10, NULL, 0);
    /* 1: an acceptor's challenge, then its reply */
    c = good_challenge();
    r = reply_with(0, NULL);
    write_seed("greet-signed-welcome", TARGET_GREET | SIGN, &c, sizeof c, &r, sizeof r);
    write_seed("greet-unsigned-welcome", TARGET_GREET, &c, sizeof c, &r, sizeof r);
    r = reply_with(FSDP_ERR_REJECTED, hostile);
    write_seed("greet-signed-refusal-with-escapes", TARGET_GREET | SIGN, &c, sizeof c, &r, sizeof r);
    write_seed("greet-unsigned-refusal", TARGET_GREET, &c, sizeof c, &r, sizeof r);
    memset(r.reason, 'x', sizeof r.reason); /* no NUL in the reason */
    write_seed("greet-signed-refusal-unterminated", TARGET_GREET | SIGN, &c, sizeof c, &r, sizeof r);
    write_seed("greet-reply-cut", TARGET_GREET | SIGN, &c, sizeof c, &r, 20);
    write_seed("greet-challenge-only", TARGET_GREET, &c, sizeof c, NULL, 0);
    write_seed("greet-challenge-cut", TARGET_GREET, &c, 12, NULL, 0);
    c.version = 1;
    write_seed("greet-version-1", TARGET_GREET, &c, sizeof c, NULL, 0);
    memcpy(stream, "HTTP/1.1 400 Bad Request\r\n\r\n", 28);
    write_seed("greet-http", TARGET_GREET, stream, 28, NULL, 0);
    write_seed("greet-silent-close", TARGET_GREET, NULL, 0, NULL, 0);
    /* 2: collective headers */
    hd = header_with(FSDP__SOCK_MAGIC, 1, 64);
    write_seed("header-good", TARGET_HEADER, &hd, sizeof hd, NULL, 0);
    write_seed("header-good-signed", TARGET_HEADER | SIGN, &hd, sizeof hd, NULL, 0);
    hd.phase = 2;
    write_seed("header-wrong-phase", TARGET_HEADER | SIGN, &hd, sizeof hd, NULL, 0);
    hd = header_with(FSDP__SOCK_MAGIC, 1, (uint64_t)1 << 62);
    write_seed("header-huge-payload", TARGET_HEADER | SIGN, &hd, sizeof hd, NULL, 0);
    hd = header_with(FSDP__SOCK_MAGIC, 1, 64);
    hd.fp.kind = 77;
    hd.fp.dtype = -3;
    hd.fp.op = 1000;
    hd.fp.tag = 9;
    write_seed("header-other-collective", TARGET_HEADER, &hd, sizeof hd, NULL, 0);
    hd = header_with(0xdeadbeefu, 1, 64);
    write_seed("header-bad-magic", TARGET_HEADER, &hd, sizeof hd, NULL, 0);
    hd = header_with(FSDP__SOCK_ABORT_MAGIC, 0, sizeof hostile - 1);
    hd.code = FSDP_ERR_MISMATCH;
    write_seed("header-abort-with-escapes", TARGET_HEADER, &hd, sizeof hd, hostile, sizeof hostile - 1);
    hd.payload = 100000;
    hd.code = -1000;
    memset(stream, 0x1b, sizeof stream);
    write_seed("header-abort-long-message", TARGET_HEADER, &hd, sizeof hd, stream, sizeof stream);
    hd.payload = 40;
    write_seed("header-abort-message-cut", TARGET_HEADER, &hd, sizeof hd, hostile, 10);
    write_seed("header-cut", TARGET_HEADER, &hd, 30, NULL, 0);
    return 0;
}
