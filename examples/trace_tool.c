/* trace_tool: where the time of an fsdp.h training run went, read from the traces it writes.

       trace_tool summary DIR|FILE [--top N]
       trace_tool svg DIR|FILE OUT.svg [--steps A-B] [--width PX] [--title TEXT]
       trace_tool merge DIR OUT.json
       trace_tool check DIR|FILE

   With FSDP_TRACE=DIR (or fsdp_desc.trace_dir) every rank writes DIR/trace-rankNNNNN.json:
   Chrome trace-event JSON with one complete event per fsdp.h call, wait and collective, all on
   rank 0's clock (format "fsdp.h-trace", version 1). This tool reads such a DIR, or one file
   (also one that merge wrote):
     summary  per step and rank where the time went, the slowest rank of each step, and which
              rank arrives last at collectives (the straggler the others wait for)
     svg      a timeline picture of a few steps, plain SVG 1.1 that GitHub shows inline
     merge    every rank in one file for Perfetto (ui.perfetto.dev) or chrome://tracing
     check    the files against the format: "ok: R ranks, E events, S steps" or the first problem
   A file cut off at the end (its rank died) is read up to its last complete event, with a
   warning. Anything else malformed is refused, naming the file and the byte offset: the reader
   treats the files as hostile (bounded nesting and lengths, strict JSON and UTF-8). Outputs are
   written to a temporary name, fsynced and renamed, so an interrupted run leaves what was there.

   Build: cc -std=c99 -O2 examples/trace_tool.c -o build/trace_tool -lm
   It needs only libc and libm, not fsdp.h: tests/test_trace_tool.c includes this file with
   TRACE_TOOL_NO_MAIN defined and calls the tt_ functions (loader, analyses, commands) itself.

   Reading the summary. Per step and rank, in milliseconds:
     step          the "iteration" event: from the end of the previous fsdp_step to the end of this one
     compute       step minus in fsdp: the caller's own work (forward, backward, loading data)
     in fsdp       time the compute thread spent inside fsdp.h (hooks, fsdp_step, checkpoints,
                   waits), each moment counted once however deeply the events nest
     exposed comm  the part of in fsdp spent waiting for a collective: communication that
                   prefetching did not hide behind compute
     other wait    the part spent waiting for the optimizer's step thread or offload I/O
   "slowest rank per step": the rank whose step took longest, and how far behind the fastest.
   "top stragglers": a collective is matched across ranks by (group, seq); the rank that started
   it last arrived last. Per rank: at how many collectives it was last, and how long the first
   arrival had waited for it, in total and on average. "largest arrival spreads": the N
   collectives whose last arrival came longest after the first. Arrival times of two ranks are
   only as good as their clock alignment: a spread below the bound (the two largest clock_error_us
   of the collective's ranks, summed) is marked '~' and says nothing about who was late. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700 /* fsync, fileno, fdopen, O_NONBLOCK (an includer defines it before its own headers) */
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every function is static; the ones a test calls are marked unused so that an includer that
   calls only some of them compiles warning-free. */
#if defined(__GNUC__) || defined(__clang__)
#define TT_API static __attribute__((unused))
#else
#define TT_API static
#endif

#define TT_MAX_DEPTH 32              /* JSON nesting; the format needs 5 (a merged file's units) */
#define TT_MAX_STRING 65536          /* bytes of one decoded JSON string */
#define TT_MAX_NUMBER 64             /* characters of one JSON number */
#define TT_MAX_WORLD (1 << 20)       /* ranks */
#define TT_MAX_EXACT 9007199254740992.0 /* 2^53: larger integers are not exact as doubles */
#define TT_TIDS 6                    /* 0 compute, 1 comm, 2 step, 3 io, 4 checkpoint, 5 wire */

/* ---------------------------------------------------------------------------------------------
   the loaded trace
   --------------------------------------------------------------------------------------------- */
enum { /* tt_event.present: which optional fields the event had */
    TT_HAS_PID = 1 << 0,
    TT_HAS_TID = 1 << 1,
    TT_HAS_TS = 1 << 2,
    TT_HAS_DUR = 1 << 3,
    TT_HAS_BYTES = 1 << 4,
    TT_HAS_SEQ = 1 << 5,
    TT_HAS_STEP = 1 << 6,
    TT_HAS_ISSUED = 1 << 7
};

/* One trace event. Strings are interned (equal text, equal pointer) and "" when absent; numbers
   are valid where `present` says so. Times in microseconds on rank 0's clock. */
typedef struct tt_event {
    const char *ph, *name, *cat;              /* "X" complete, "M" metadata */
    const char *unit, *op, *group, *wait_for; /* args.unit, args.op, args.group, args.for */
    int pid, tid;
    int rank;                                 /* its file's rank (merged file: its pid); -1 none */
    int file;                                 /* index in tt_trace.files */
    double ts, dur, issued;                   /* issued: args.issued_us */
    long long bytes, seq, step;               /* args.bytes, args.seq, args.step */
    int skipped;                              /* args.skipped */
    unsigned present;                         /* TT_HAS_* */
    size_t offset, length;                    /* its JSON text in the file, copied as is by merge */
} tt_event;

/* One rank, from its file's otherData (or an entry of a merged file's otherData.ranks). */
typedef struct tt_rank {
    int rank, world;
    char host[256];
    double clock_offset_us, clock_error_us;
    int truncated;        /* its file ended early (the rank died): later events are missing */
    int dropped_partial;  /* ... in the middle of an event, which was left out */
    size_t events;        /* events read from its file */
    int file;
    size_t other_offset, other_length; /* its otherData's JSON text in the file */
} tt_rank;

typedef struct tt_file {
    char *path;
    char *text;           /* the whole file, NUL-terminated */
    size_t size;
    int merged;           /* written by merge: holds several ranks */
} tt_file;

typedef struct tt_strings { /* the interned strings: an open-addressing set over stable blocks */
    const char **slots;
    size_t nslots, count;
    char **blocks;
    size_t nblocks, blocks_cap, block_used, block_size;
} tt_strings;

typedef struct tt_trace {
    tt_event *ev;
    size_t n, ev_cap;
    tt_rank *ranks;       /* sorted by rank */
    int nranks;
    size_t ranks_cap;
    tt_file *files;
    int nfiles;
    size_t files_cap;
    int world;            /* the largest world any rank names */
    char source[1024];    /* the DIR or FILE loaded */
    tt_strings strings;
    unsigned char *rank_seen; /* TT_MAX_WORLD bits while loading */
} tt_trace;

/* ---------------------------------------------------------------------------------------------
   utilities
   --------------------------------------------------------------------------------------------- */
static void tt_out_of_memory(void) {
    fputs("trace_tool: out of memory\n", stderr);
    exit(1);
}

/* items grown (doubling) to hold at least `need` of item_size bytes; exits when memory is out. */
static void *tt_grow(void *items, size_t *cap, size_t need, size_t item_size) {
    size_t c = *cap ? *cap : 16;
    if (need <= *cap) return items;
    while (c < need) {
        if (c > SIZE_MAX / 4 / item_size) tt_out_of_memory();
        c *= 2;
    }
    items = realloc(items, c * item_size);
    if (!items) tt_out_of_memory();
    *cap = c;
    return items;
}

/* qsort, for arrays that may be empty (and NULL, which qsort must not be given). */
static void tt_sort(void *items, size_t count, size_t size, int (*compare)(const void *, const void *)) {
    if (count > 1) qsort(items, count, size, compare);
}

static char *tt_strdup(const char *text) {
    size_t n = strlen(text) + 1;
    char *copy = (char *)malloc(n);
    if (!copy) tt_out_of_memory();
    memcpy(copy, text, n);
    return copy;
}

static void tt_error(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    if (!err || !err_size) return;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

/* Text from a trace (names, hosts, paths), safe to print on a terminal: control characters
   (C0, DEL, C1) show as '?', so no escape sequence from a file reaches it. Each call uses the
   next of a few buffers, so that one printf may show several (the tool is single-threaded). */
static const char *tt_shown(const char *text) {
    static char buffers[8][512];
    static int next;
    char *out = buffers[next++ % 8];
    const unsigned char *s = (const unsigned char *)text;
    size_t n = 0;
    for (; *s && n + 1 < sizeof buffers[0]; s++) {
        if (*s < 0x20 || *s == 0x7f) out[n++] = '?';
        else if (*s == 0xc2 && s[1] >= 0x80 && s[1] <= 0x9f) { out[n++] = '?'; s++; }
        else out[n++] = (char)*s;
    }
    if (*s) { /* cut short: drop a character cut in the middle (and maybe the one before) */
        while (n > 0 && ((unsigned char)out[n - 1] & 0xc0) == 0x80) n--;
        if (n > 0 && (unsigned char)out[n - 1] >= 0xc0) n--;
    }
    out[n] = 0;
    return out;
}

static const char tt_empty[] = "";

/* FNV-1a */
static size_t tt_hash(const char *text, size_t len) {
    unsigned long long h = 14695981039346656037ull;
    size_t i;
    for (i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    return (size_t)h;
}

static void tt_strings_rehash(tt_strings *s) {
    size_t nslots = s->nslots ? s->nslots * 2 : 1024, i, k;
    const char **slots = (const char **)calloc(nslots, sizeof *slots);
    if (!slots) tt_out_of_memory();
    for (i = 0; i < s->nslots; i++) {
        if (!s->slots[i]) continue;
        k = tt_hash(s->slots[i], strlen(s->slots[i])) & (nslots - 1);
        while (slots[k]) k = (k + 1) & (nslots - 1);
        slots[k] = s->slots[i];
    }
    free((void *)s->slots);
    s->slots = slots;
    s->nslots = nslots;
}

/* The one stored copy of text[0, len) (which holds no NUL byte). */
static const char *tt_intern(tt_strings *s, const char *text, size_t len) {
    size_t k;
    char *copy;
    if (len == 0) return tt_empty;
    if ((s->count + 1) * 2 > s->nslots) tt_strings_rehash(s);
    k = tt_hash(text, len) & (s->nslots - 1);
    for (; s->slots[k]; k = (k + 1) & (s->nslots - 1))
        if (strncmp(s->slots[k], text, len) == 0 && s->slots[k][len] == 0) return s->slots[k];
    if (!s->nblocks || s->block_used + len + 1 > s->block_size) { /* a new block: old pointers stay valid */
        s->block_size = len + 1 > 65536 ? len + 1 : 65536;
        s->blocks = (char **)tt_grow(s->blocks, &s->blocks_cap, s->nblocks + 1, sizeof *s->blocks);
        if (!(s->blocks[s->nblocks++] = (char *)malloc(s->block_size))) tt_out_of_memory();
        s->block_used = 0;
    }
    copy = s->blocks[s->nblocks - 1] + s->block_used;
    memcpy(copy, text, len);
    copy[len] = 0;
    s->block_used += len + 1;
    s->slots[k] = copy;
    s->count++;
    return copy;
}

static void tt_strings_free(tt_strings *s) {
    size_t i;
    for (i = 0; i < s->nblocks; i++) free(s->blocks[i]);
    free(s->blocks);
    free((void *)s->slots);
    memset(s, 0, sizeof *s);
}

/* The whole of a regular file, NUL-terminated. A FIFO or device is refused at once rather
   than read (or waited on). */
static int tt_read_file(const char *path, char **text, size_t *size, char *err, size_t err_size) {
    struct stat st;
    size_t done = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    *text = NULL;
    *size = 0;
    if (fd < 0) {
        tt_error(err, err_size, "%s: %s", tt_shown(path), strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (unsigned long long)st.st_size >= SIZE_MAX / 2) {
        tt_error(err, err_size, "%s: not a regular file of a readable size", tt_shown(path));
        close(fd);
        return -1;
    }
    if (!(*text = (char *)malloc((size_t)st.st_size + 1))) tt_out_of_memory();
    while (done < (size_t)st.st_size) {
        ssize_t got = read(fd, *text + done, (size_t)st.st_size - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break; /* shrank while read: parse what is there */
        done += (size_t)got;
    }
    close(fd);
    (*text)[done] = 0;
    *size = done;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   JSON: a strict reader into a small tree (one event at a time, so memory stays bounded)
   --------------------------------------------------------------------------------------------- */
enum { TT_JNULL, TT_JFALSE, TT_JTRUE, TT_JNUMBER, TT_JSTRING, TT_JARRAY, TT_JOBJECT };

/* A value. Children are linked by index (the node array grows while a value is read). */
typedef struct tt_jnode {
    int kind;
    int child, next;      /* first child, next sibling: indices, -1 none */
    size_t key;           /* an object member's name: offset in the pool */
    size_t str, str_len;  /* a string: offset in the pool, bytes */
    double number;
    size_t begin, end;    /* its bytes in the file */
} tt_jnode;

typedef struct tt_jdoc {
    tt_jnode *nodes;
    size_t n, cap;
    char *pool;           /* decoded strings and member names, each NUL-terminated */
    size_t pool_n, pool_cap;
} tt_jdoc;

typedef struct tt_parser {
    const char *file;
    const unsigned char *text;
    size_t size, pos;
    int depth;
    int ran_out;          /* the error is the file ending early, as a rank that died leaves it */
    char *err;
    size_t err_size;
} tt_parser;

static void tt_jdoc_free(tt_jdoc *d) {
    free(d->nodes);
    free(d->pool);
    memset(d, 0, sizeof *d);
}

static int tt_fail_at(tt_parser *p, size_t at, const char *fmt, ...) {
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    tt_error(p->err, p->err_size, "%s: byte %lu: %s", tt_shown(p->file), (unsigned long)at, what);
    return -1;
}

static int tt_ran_out(tt_parser *p, const char *inside) {
    p->ran_out = 1;
    return tt_fail_at(p, p->size, "the file ends inside %s", inside);
}

static int tt_is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static void tt_skip_space(tt_parser *p) {
    while (p->pos < p->size) {
        unsigned char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int tt_new_node(tt_parser *p, tt_jdoc *d, int kind, size_t begin) {
    tt_jnode *node;
    if (d->n >= INT_MAX) return tt_fail_at(p, begin, "too many values");
    d->nodes = (tt_jnode *)tt_grow(d->nodes, &d->cap, d->n + 1, sizeof *d->nodes);
    node = &d->nodes[d->n];
    memset(node, 0, sizeof *node);
    node->kind = kind;
    node->child = node->next = -1;
    node->begin = begin;
    node->end = begin;
    return (int)d->n++;
}

static void tt_put_utf8(tt_jdoc *d, unsigned code) {
    char *out = d->pool + d->pool_n;
    if (code < 0x80) { out[0] = (char)code; d->pool_n += 1; }
    else if (code < 0x800) { out[0] = (char)(0xc0 | code >> 6); out[1] = (char)(0x80 | (code & 0x3f)); d->pool_n += 2; }
    else if (code < 0x10000) {
        out[0] = (char)(0xe0 | code >> 12);
        out[1] = (char)(0x80 | ((code >> 6) & 0x3f));
        out[2] = (char)(0x80 | (code & 0x3f));
        d->pool_n += 3;
    } else {
        out[0] = (char)(0xf0 | code >> 18);
        out[1] = (char)(0x80 | ((code >> 12) & 0x3f));
        out[2] = (char)(0x80 | ((code >> 6) & 0x3f));
        out[3] = (char)(0x80 | (code & 0x3f));
        d->pool_n += 4;
    }
}

/* The four hex digits after the 'u' at `at`. */
static int tt_hex4(tt_parser *p, size_t at, unsigned *code) {
    size_t k;
    *code = 0;
    for (k = 1; k <= 4; k++) {
        unsigned char h;
        if (at + k >= p->size) return tt_ran_out(p, "a string");
        h = p->text[at + k];
        *code <<= 4;
        if (tt_is_digit(h)) *code |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f') *code |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') *code |= (unsigned)(h - 'A' + 10);
        else return tt_fail_at(p, at + k, "\\u needs four hex digits");
    }
    return 0;
}

/* A \u escape at p->pos (the backslash), surrogate pairs joined. */
static int tt_parse_unicode_escape(tt_parser *p, tt_jdoc *d) {
    size_t at = p->pos;
    unsigned code, low;
    if (tt_hex4(p, at + 1, &code) != 0) return -1;
    p->pos = at + 6;
    if (code >= 0xdc00 && code <= 0xdfff) return tt_fail_at(p, at, "a lone low surrogate \\u%04X", code);
    if (code >= 0xd800 && code <= 0xdbff) {
        if (p->pos >= p->size) return tt_ran_out(p, "a string");
        if (p->text[p->pos] != '\\') return tt_fail_at(p, at, "a high surrogate \\u%04X without its low half", code);
        if (p->pos + 1 >= p->size) return tt_ran_out(p, "a string");
        if (p->text[p->pos + 1] != 'u') return tt_fail_at(p, at, "a high surrogate \\u%04X without its low half", code);
        if (tt_hex4(p, p->pos + 1, &low) != 0) return -1;
        if (low < 0xdc00 || low > 0xdfff) return tt_fail_at(p, at, "a high surrogate \\u%04X without its low half", code);
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        p->pos += 6;
    }
    if (code == 0) return tt_fail_at(p, at, "\\u0000 in a string (not supported)");
    tt_put_utf8(d, code);
    return 0;
}

static int tt_parse_escape(tt_parser *p, tt_jdoc *d) {
    size_t at = p->pos;
    char plain;
    if (at + 1 >= p->size) return tt_ran_out(p, "a string");
    switch (p->text[at + 1]) {
    case '"': plain = '"'; break;
    case '\\': plain = '\\'; break;
    case '/': plain = '/'; break;
    case 'b': plain = '\b'; break;
    case 'f': plain = '\f'; break;
    case 'n': plain = '\n'; break;
    case 'r': plain = '\r'; break;
    case 't': plain = '\t'; break;
    case 'u': return tt_parse_unicode_escape(p, d);
    default: return tt_fail_at(p, at, "an invalid escape in a string");
    }
    d->pool[d->pool_n++] = plain;
    p->pos = at + 2;
    return 0;
}

/* One UTF-8 character of 2 to 4 bytes at p->pos, checked (no overlong form, no surrogate, at
   most U+10FFFF) and copied. */
static int tt_copy_utf8(tt_parser *p, tt_jdoc *d) {
    const unsigned char *s = p->text + p->pos;
    size_t left = p->size - p->pos, n, k;
    unsigned code, least;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) { n = 2; code = s[0] & 0x1fu; least = 0x80; }
    else if (s[0] >= 0xe0 && s[0] <= 0xef) { n = 3; code = s[0] & 0x0fu; least = 0x800; }
    else if (s[0] >= 0xf0 && s[0] <= 0xf4) { n = 4; code = s[0] & 0x07u; least = 0x10000; }
    else return tt_fail_at(p, p->pos, "invalid UTF-8 (byte 0x%02x) in a string", s[0]);
    for (k = 1; k < n; k++) {
        if (k >= left) return tt_ran_out(p, "a string");
        if ((s[k] & 0xc0) != 0x80) return tt_fail_at(p, p->pos, "invalid UTF-8 in a string");
        code = code << 6 | (s[k] & 0x3fu);
    }
    if (code < least || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
        return tt_fail_at(p, p->pos, "invalid UTF-8 in a string");
    memcpy(d->pool + d->pool_n, s, n);
    d->pool_n += n;
    p->pos += n;
    return 0;
}

/* The string at p->pos (its opening quote), decoded into the pool: *offset, *length. */
static int tt_parse_string(tt_parser *p, tt_jdoc *d, size_t *offset, size_t *length) {
    size_t begin = p->pos;
    *offset = d->pool_n;
    p->pos++;
    for (;;) {
        unsigned char c;
        if (p->pos >= p->size) return tt_ran_out(p, "a string");
        if (d->pool_n - *offset > TT_MAX_STRING) return tt_fail_at(p, begin, "a string longer than %d bytes", TT_MAX_STRING);
        d->pool = (char *)tt_grow(d->pool, &d->pool_cap, d->pool_n + 5, 1); /* a character, or the NUL */
        c = p->text[p->pos];
        if (c == '"') break;
        if (c < 0x20) return tt_fail_at(p, p->pos, "a raw control character (0x%02x) in a string", c);
        if (c == '\\') {
            if (tt_parse_escape(p, d) != 0) return -1;
        } else if (c < 0x80) {
            d->pool[d->pool_n++] = (char)c;
            p->pos++;
        } else if (tt_copy_utf8(p, d) != 0) {
            return -1;
        }
    }
    p->pos++;
    *length = d->pool_n - *offset;
    d->pool[d->pool_n++] = 0;
    return 0;
}

/* Skips the digits at *i; 0 if there was none. */
static int tt_skip_digits(tt_parser *p, size_t *i) {
    size_t from = *i;
    while (*i < p->size && tt_is_digit(p->text[*i])) (*i)++;
    return *i > from;
}

static int tt_parse_number(tt_parser *p, tt_jdoc *d) {
    size_t begin = p->pos, i = p->pos;
    char digits[TT_MAX_NUMBER + 1];
    double value;
    int node;
    if (p->text[i] == '-') i++;
    if (i >= p->size) return tt_ran_out(p, "a number");
    if (p->text[i] == '0') i++;
    else if (!tt_skip_digits(p, &i)) return tt_fail_at(p, i, "a number needs a digit here");
    if (i < p->size && p->text[i] == '.') {
        i++;
        if (i >= p->size) return tt_ran_out(p, "a number");
        if (!tt_skip_digits(p, &i)) return tt_fail_at(p, i, "a number needs a digit after '.'");
    }
    if (i < p->size && (p->text[i] == 'e' || p->text[i] == 'E')) {
        i++;
        if (i < p->size && (p->text[i] == '+' || p->text[i] == '-')) i++;
        if (i >= p->size) return tt_ran_out(p, "a number");
        if (!tt_skip_digits(p, &i)) return tt_fail_at(p, i, "a number needs a digit in its exponent");
    }
    if (i - begin > TT_MAX_NUMBER) return tt_fail_at(p, begin, "a number longer than %d characters", TT_MAX_NUMBER);
    memcpy(digits, p->text + begin, i - begin);
    digits[i - begin] = 0;
    value = strtod(digits, NULL);
    if (!isfinite(value)) return tt_fail_at(p, begin, "a number out of range (%.40s)", digits);
    p->pos = i;
    if ((node = tt_new_node(p, d, TT_JNUMBER, begin)) < 0) return -1;
    d->nodes[node].number = value;
    d->nodes[node].end = i;
    return node;
}

static int tt_parse_literal(tt_parser *p, tt_jdoc *d, const char *word, int kind) {
    size_t n = strlen(word), k, begin = p->pos;
    int node;
    for (k = 0; k < n; k++) {
        if (begin + k >= p->size) return tt_ran_out(p, "a literal");
        if (p->text[begin + k] != (unsigned char)word[k]) return tt_fail_at(p, begin, "unexpected characters (not '%s')", word);
    }
    p->pos += n;
    if ((node = tt_new_node(p, d, kind, begin)) < 0) return -1;
    d->nodes[node].end = p->pos;
    return node;
}

static int tt_parse_value(tt_parser *p, tt_jdoc *d);

/* An object or an array at p->pos; its members linked as children, in order. */
static int tt_parse_container(tt_parser *p, tt_jdoc *d, int is_object) {
    size_t begin = p->pos;
    char close = is_object ? '}' : ']';
    const char *inside = is_object ? "an object" : "an array";
    int node, last = -1;
    if (++p->depth > TT_MAX_DEPTH) return tt_fail_at(p, begin, "values nested deeper than %d levels", TT_MAX_DEPTH);
    if ((node = tt_new_node(p, d, is_object ? TT_JOBJECT : TT_JARRAY, begin)) < 0) return -1;
    p->pos++;
    tt_skip_space(p);
    if (p->pos < p->size && p->text[p->pos] == close) p->pos++;
    else
        for (;;) {
            size_t key = 0, key_len;
            int child;
            tt_skip_space(p);
            if (is_object) {
                if (p->pos >= p->size) return tt_ran_out(p, inside);
                if (p->text[p->pos] != '"') return tt_fail_at(p, p->pos, "expected a member name in quotes");
                if (tt_parse_string(p, d, &key, &key_len) != 0) return -1;
                tt_skip_space(p);
                if (p->pos >= p->size) return tt_ran_out(p, inside);
                if (p->text[p->pos] != ':') return tt_fail_at(p, p->pos, "expected ':' after a member name");
                p->pos++;
            }
            if ((child = tt_parse_value(p, d)) < 0) return -1;
            d->nodes[child].key = key;
            if (last < 0) d->nodes[node].child = child;
            else d->nodes[last].next = child;
            last = child;
            tt_skip_space(p);
            if (p->pos >= p->size) return tt_ran_out(p, inside);
            if (p->text[p->pos] == ',') { p->pos++; continue; }
            if (p->text[p->pos] == close) { p->pos++; break; }
            return tt_fail_at(p, p->pos, "expected ',' or '%c' in %s", close, inside);
        }
    p->depth--;
    d->nodes[node].end = p->pos;
    return node;
}

/* The value at p->pos (after white space): its node, or -1 with the error in p->err. */
static int tt_parse_value(tt_parser *p, tt_jdoc *d) {
    unsigned char c;
    tt_skip_space(p);
    if (p->pos >= p->size) return tt_ran_out(p, "a value");
    c = p->text[p->pos];
    if (c == '{' || c == '[') return tt_parse_container(p, d, c == '{');
    if (c == '-' || tt_is_digit(c)) return tt_parse_number(p, d);
    if (c == 't') return tt_parse_literal(p, d, "true", TT_JTRUE);
    if (c == 'f') return tt_parse_literal(p, d, "false", TT_JFALSE);
    if (c == 'n') return tt_parse_literal(p, d, "null", TT_JNULL);
    if (c == '"') {
        size_t begin = p->pos, offset, length;
        int node;
        if (tt_parse_string(p, d, &offset, &length) != 0) return -1;
        if ((node = tt_new_node(p, d, TT_JSTRING, begin)) < 0) return -1;
        d->nodes[node].str = offset;
        d->nodes[node].str_len = length;
        d->nodes[node].end = p->pos;
        return node;
    }
    if (c >= 0x21 && c < 0x7f) return tt_fail_at(p, p->pos, "unexpected character '%c'", c);
    return tt_fail_at(p, p->pos, "unexpected byte 0x%02x", c);
}

static const char *tt_jkey(const tt_jdoc *d, int node) { return d->pool + d->nodes[node].key; }
static const char *tt_jstr(const tt_jdoc *d, int node) { return d->pool + d->nodes[node].str; }

static int tt_jmember(const tt_jdoc *d, int object, const char *name) {
    int m;
    for (m = d->nodes[object].child; m >= 0; m = d->nodes[m].next)
        if (strcmp(tt_jkey(d, m), name) == 0) return m;
    return -1;
}

/* 1 if node is a number holding an integer in [least, most], in *value. */
static int tt_jinteger(const tt_jdoc *d, int node, double least, double most, long long *value) {
    double v;
    if (node < 0 || d->nodes[node].kind != TT_JNUMBER) return 0;
    v = d->nodes[node].number;
    if (v != floor(v) || v < least || v > most) return 0;
    *value = (long long)v;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
   events: the fields this tool reads, as a table
   --------------------------------------------------------------------------------------------- */
enum { TT_FIELD_STRING, TT_FIELD_NUMBER, TT_FIELD_INT, TT_FIELD_LONG };

typedef struct tt_field {
    const char *key;
    int kind;
    size_t offset;        /* in tt_event */
    unsigned has;         /* the TT_HAS_ bit it sets */
} tt_field;

static const tt_field tt_event_fields[] = {
    {"ph", TT_FIELD_STRING, offsetof(tt_event, ph), 0},
    {"name", TT_FIELD_STRING, offsetof(tt_event, name), 0},
    {"cat", TT_FIELD_STRING, offsetof(tt_event, cat), 0},
    {"pid", TT_FIELD_INT, offsetof(tt_event, pid), TT_HAS_PID},
    {"tid", TT_FIELD_INT, offsetof(tt_event, tid), TT_HAS_TID},
    {"ts", TT_FIELD_NUMBER, offsetof(tt_event, ts), TT_HAS_TS},
    {"dur", TT_FIELD_NUMBER, offsetof(tt_event, dur), TT_HAS_DUR},
};

static const tt_field tt_args_fields[] = {
    {"unit", TT_FIELD_STRING, offsetof(tt_event, unit), 0},
    {"op", TT_FIELD_STRING, offsetof(tt_event, op), 0},
    {"group", TT_FIELD_STRING, offsetof(tt_event, group), 0},
    {"for", TT_FIELD_STRING, offsetof(tt_event, wait_for), 0},
    {"bytes", TT_FIELD_LONG, offsetof(tt_event, bytes), TT_HAS_BYTES},
    {"seq", TT_FIELD_LONG, offsetof(tt_event, seq), TT_HAS_SEQ},
    {"step", TT_FIELD_LONG, offsetof(tt_event, step), TT_HAS_STEP},
    {"skipped", TT_FIELD_INT, offsetof(tt_event, skipped), 0},
    {"issued_us", TT_FIELD_NUMBER, offsetof(tt_event, issued), TT_HAS_ISSUED},
};

/* The members of `object` that the table names, into ev (by offset). Other members are
   ignored; a named one twice or of the wrong type is an error. */
static int tt_read_fields(tt_strings *strings, const tt_jdoc *d, int object, const tt_field *fields, size_t nfields,
                          const char *prefix, tt_event *ev, char *why, size_t why_size) {
    unsigned seen = 0;
    int m;
    for (m = d->nodes[object].child; m >= 0; m = d->nodes[m].next) {
        const char *key = tt_jkey(d, m);
        char *slot;
        long long value;
        size_t f;
        for (f = 0; f < nfields && strcmp(fields[f].key, key) != 0; f++) continue;
        if (f == nfields) continue;
        if (seen & 1u << f) { tt_error(why, why_size, "'%s%s' appears twice", prefix, key); return -1; }
        seen |= 1u << f;
        slot = (char *)ev + fields[f].offset;
        switch (fields[f].kind) {
        case TT_FIELD_STRING:
            if (d->nodes[m].kind != TT_JSTRING) { tt_error(why, why_size, "'%s%s' is not a string", prefix, key); return -1; }
            *(const char **)(void *)slot = tt_intern(strings, tt_jstr(d, m), d->nodes[m].str_len);
            break;
        case TT_FIELD_NUMBER:
            if (d->nodes[m].kind != TT_JNUMBER) { tt_error(why, why_size, "'%s%s' is not a number", prefix, key); return -1; }
            *(double *)(void *)slot = d->nodes[m].number;
            break;
        case TT_FIELD_INT:
            if (!tt_jinteger(d, m, INT_MIN, INT_MAX, &value)) { tt_error(why, why_size, "'%s%s' is not an integer of int range", prefix, key); return -1; }
            *(int *)(void *)slot = (int)value;
            break;
        default:
            if (!tt_jinteger(d, m, -TT_MAX_EXACT, TT_MAX_EXACT, &value)) { tt_error(why, why_size, "'%s%s' is not an integer below 2^53", prefix, key); return -1; }
            *(long long *)(void *)slot = value;
            break;
        }
        ev->present |= fields[f].has;
    }
    return 0;
}

/* The event object `node` of file `file`, appended to t->ev. */
static int tt_add_event(tt_trace *t, const tt_jdoc *d, int node, int file, char *why, size_t why_size) {
    tt_event *ev;
    int args;
    t->ev = (tt_event *)tt_grow(t->ev, &t->ev_cap, t->n + 1, sizeof *t->ev);
    ev = &t->ev[t->n];
    memset(ev, 0, sizeof *ev);
    ev->ph = ev->name = ev->cat = ev->unit = ev->op = ev->group = ev->wait_for = tt_empty;
    ev->rank = -1;
    ev->file = file;
    ev->offset = d->nodes[node].begin;
    ev->length = d->nodes[node].end - d->nodes[node].begin;
    if (tt_read_fields(&t->strings, d, node, tt_event_fields, sizeof tt_event_fields / sizeof tt_event_fields[0], "",
                       ev, why, why_size) != 0)
        return -1;
    if ((args = tt_jmember(d, node, "args")) >= 0) {
        if (d->nodes[args].kind != TT_JOBJECT) { tt_error(why, why_size, "'args' is not an object"); return -1; }
        if (tt_read_fields(&t->strings, d, args, tt_args_fields, sizeof tt_args_fields / sizeof tt_args_fields[0], "args.",
                           ev, why, why_size) != 0)
            return -1;
    }
    t->n++;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   loading: files, their otherData (the ranks) and their traceEvents
   --------------------------------------------------------------------------------------------- */
/* The traceEvents array at p->pos, each event added as it is read. Returns 0 at its ']', -1 on
   an error; p->ran_out says the file ended inside it, *partial that an event was cut. */
static int tt_parse_events(tt_trace *t, tt_parser *p, int file, size_t *kept, int *partial) {
    tt_jdoc d;
    char why[400];
    int rc = 0;
    memset(&d, 0, sizeof d);
    tt_skip_space(p);
    if (p->pos >= p->size) return tt_ran_out(p, "traceEvents");
    if (p->text[p->pos] != '[') return tt_fail_at(p, p->pos, "traceEvents is not an array");
    p->pos++;
    tt_skip_space(p);
    if (p->pos < p->size && p->text[p->pos] == ']') { p->pos++; return 0; }
    p->depth++;
    for (;;) {
        size_t begin;
        int node;
        tt_skip_space(p);
        begin = p->pos;
        d.n = d.pool_n = 0;
        if ((node = tt_parse_value(p, &d)) < 0) { *partial = begin < p->size; rc = -1; break; }
        if (d.nodes[node].kind != TT_JOBJECT) { rc = tt_fail_at(p, begin, "traceEvents[%lu] is not an object", (unsigned long)*kept); break; }
        if (tt_add_event(t, &d, node, file, why, sizeof why) != 0) { rc = tt_fail_at(p, begin, "traceEvents[%lu]: %s", (unsigned long)*kept, why); break; }
        (*kept)++;
        tt_skip_space(p);
        if (p->pos >= p->size) { rc = tt_ran_out(p, "traceEvents"); break; }
        if (p->text[p->pos] == ',') { p->pos++; continue; }
        if (p->text[p->pos] == ']') { p->pos++; p->depth--; break; }
        rc = tt_fail_at(p, p->pos, "expected ',' or ']' after traceEvents[%lu]", (unsigned long)*kept - 1);
        break;
    }
    tt_jdoc_free(&d);
    return rc;
}

typedef struct tt_file_reading { /* what one file's top level held */
    tt_jdoc other;        /* otherData */
    int other_node;       /* -1: none */
    int have_events;
    int truncated, partial;
    size_t kept;          /* events read */
} tt_file_reading;

/* The file's top-level object: otherData kept as a tree, traceEvents added to t, any other
   member skipped. The file ending anywhere after traceEvents began is a truncation (a rank
   that died), not an error. */
static int tt_parse_top(tt_trace *t, tt_parser *p, int file, tt_file_reading *r) {
    tt_jdoc scratch;
    int rc = 0, members = 0;
    memset(&scratch, 0, sizeof scratch);
    tt_skip_space(p);
    if (p->pos >= p->size) return tt_fail_at(p, 0, "the file is empty");
    if (p->text[p->pos] != '{') return tt_fail_at(p, p->pos, "expected '{' (a trace file is one JSON object)");
    p->pos++;
    p->depth = 1;
    for (;;) {
        size_t key, key_len;
        char name[32];
        tt_skip_space(p);
        if (p->pos >= p->size) { rc = tt_ran_out(p, "the top-level object"); break; }
        if (members == 0 && p->text[p->pos] == '}') { p->pos++; break; }
        if (p->text[p->pos] != '"') { rc = tt_fail_at(p, p->pos, "expected a member name in quotes"); break; }
        scratch.n = scratch.pool_n = 0;
        if ((rc = tt_parse_string(p, &scratch, &key, &key_len)) != 0) break;
        snprintf(name, sizeof name, "%.31s", scratch.pool + key);
        tt_skip_space(p);
        if (p->pos >= p->size) { rc = tt_ran_out(p, "the top-level object"); break; }
        if (p->text[p->pos] != ':') { rc = tt_fail_at(p, p->pos, "expected ':' after a member name"); break; }
        p->pos++;
        if (strcmp(name, "traceEvents") == 0) {
            if (r->have_events) { rc = tt_fail_at(p, p->pos, "a second traceEvents"); break; }
            r->have_events = 1;
            if ((rc = tt_parse_events(t, p, file, &r->kept, &r->partial)) != 0) break;
        } else if (strcmp(name, "otherData") == 0) {
            if (r->other_node >= 0) { rc = tt_fail_at(p, p->pos, "a second otherData"); break; }
            if ((r->other_node = tt_parse_value(p, &r->other)) < 0) { rc = -1; break; }
        } else {
            scratch.n = scratch.pool_n = 0;
            if (tt_parse_value(p, &scratch) < 0) { rc = -1; break; }
        }
        members++;
        tt_skip_space(p);
        if (p->pos >= p->size) { rc = tt_ran_out(p, "the top-level object"); break; }
        if (p->text[p->pos] == ',') { p->pos++; continue; }
        if (p->text[p->pos] == '}') { p->pos++; break; }
        rc = tt_fail_at(p, p->pos, "expected ',' or '}' in the top-level object");
        break;
    }
    tt_jdoc_free(&scratch);
    if (rc != 0 && p->ran_out && r->have_events) {
        r->truncated = 1;
        return 0;
    }
    if (rc != 0) return rc;
    tt_skip_space(p);
    if (p->pos < p->size) return tt_fail_at(p, p->pos, "more data after the end of the trace object");
    return 0;
}

/* Fields of an otherData object (a file's, or an entry of a merged file's "ranks") into r. */
static int tt_rank_from_json(const tt_jdoc *d, int node, int merged_top, tt_rank *r, char *why, size_t why_size) {
    int format = tt_jmember(d, node, "format"), field;
    long long value;
    if (d->nodes[node].kind != TT_JOBJECT) { tt_error(why, why_size, "it is not an object"); return -1; }
    if (format < 0 || d->nodes[format].kind != TT_JSTRING || strcmp(tt_jstr(d, format), "fsdp.h-trace") != 0) {
        tt_error(why, why_size, "format is '%s', not 'fsdp.h-trace' (not a trace fsdp.h wrote)",
                 format >= 0 && d->nodes[format].kind == TT_JSTRING ? tt_shown(tt_jstr(d, format)) : "(none)");
        return -1;
    }
    if (!tt_jinteger(d, tt_jmember(d, node, "version"), 1, 1, &value)) { tt_error(why, why_size, "version is not 1 (this tool reads version 1)"); return -1; }
    if (!tt_jinteger(d, tt_jmember(d, node, "world"), 1, TT_MAX_WORLD, &value)) { tt_error(why, why_size, "world is not a number of ranks from 1 to %d", TT_MAX_WORLD); return -1; }
    r->world = (int)value;
    if (merged_top) return 0;
    if (!tt_jinteger(d, tt_jmember(d, node, "rank"), 0, r->world - 1, &value)) { tt_error(why, why_size, "rank is not a rank of world %d", r->world); return -1; }
    r->rank = (int)value;
    snprintf(r->host, sizeof r->host, "?");
    if ((field = tt_jmember(d, node, "host")) >= 0 && d->nodes[field].kind == TT_JSTRING)
        snprintf(r->host, sizeof r->host, "%s", tt_jstr(d, field));
    if ((field = tt_jmember(d, node, "clock_offset_us")) >= 0 && d->nodes[field].kind == TT_JNUMBER)
        r->clock_offset_us = d->nodes[field].number;
    if ((field = tt_jmember(d, node, "clock_error_us")) >= 0 && d->nodes[field].kind == TT_JNUMBER)
        r->clock_error_us = d->nodes[field].number;
    r->other_offset = d->nodes[node].begin;
    r->other_length = d->nodes[node].end - d->nodes[node].begin;
    return 0;
}

static int tt_add_rank(tt_trace *t, const tt_rank *r, const char *where, char *err, size_t err_size) {
    int i;
    if (t->rank_seen[r->rank / 8] & 1u << (r->rank % 8)) {
        for (i = 0; i < t->nranks - 1 && t->ranks[i].rank != r->rank; i++) continue;
        tt_error(err, err_size, "%s: rank %d again (also in %s)", where, r->rank, tt_shown(t->files[t->ranks[i].file].path));
        return -1;
    }
    t->rank_seen[r->rank / 8] |= (unsigned char)(1u << (r->rank % 8));
    t->ranks = (tt_rank *)tt_grow(t->ranks, &t->ranks_cap, (size_t)t->nranks + 1, sizeof *t->ranks);
    t->ranks[t->nranks++] = *r;
    if (r->world > t->world) t->world = r->world;
    return 0;
}

/* The ranks a merged file's otherData lists ("ranks": each rank's own otherData). */
static int tt_add_merged_ranks(tt_trace *t, const tt_jdoc *d, int other, int file, const tt_file_reading *reading,
                               char *err, size_t err_size) {
    char path[512], why[400], where[600];
    int list = tt_jmember(d, other, "ranks"), truncated = tt_jmember(d, other, "truncated_ranks"), m, k = 0, rc = 0;
    unsigned char *cut = (unsigned char *)calloc(TT_MAX_WORLD / 8, 1); /* the ranks truncated_ranks lists */
    long long rank;
    tt_rank r;
    if (!cut) tt_out_of_memory();
    snprintf(path, sizeof path, "%s", tt_shown(t->files[file].path));
    if (d->nodes[list].kind != TT_JARRAY) { tt_error(err, err_size, "%s: otherData.ranks is not an array", path); rc = -1; }
    for (m = truncated >= 0 && d->nodes[truncated].kind == TT_JARRAY ? d->nodes[truncated].child : -1; m >= 0; m = d->nodes[m].next)
        if (tt_jinteger(d, m, 0, TT_MAX_WORLD - 1, &rank)) cut[rank / 8] |= (unsigned char)(1u << (rank % 8));
    t->files[file].merged = 1;
    for (m = rc ? -1 : d->nodes[list].child; m >= 0 && rc == 0; m = d->nodes[m].next, k++) {
        memset(&r, 0, sizeof r);
        r.file = file;
        snprintf(where, sizeof where, "%s: otherData.ranks[%d]", path, k);
        if (tt_rank_from_json(d, m, 0, &r, why, sizeof why) != 0) {
            tt_error(err, err_size, "%s: %s", where, why);
            rc = -1;
            break;
        }
        r.truncated = (cut[r.rank / 8] >> (r.rank % 8) & 1) | reading->truncated; /* or the merged file itself was cut */
        rc = tt_add_rank(t, &r, where, err, err_size);
    }
    free(cut);
    return rc;
}

/* Which rank each of the file's events (first .. t->n) belongs to. */
static void tt_assign_event_ranks(tt_trace *t, size_t first, int file, int file_rank) {
    size_t i;
    for (i = first; i < t->n; i++) {
        tt_event *e = &t->ev[i];
        if (!t->files[file].merged) e->rank = file_rank;
        else if ((e->present & TT_HAS_PID) && e->pid >= 0 && e->pid < TT_MAX_WORLD &&
                 (t->rank_seen[e->pid / 8] & 1u << (e->pid % 8)))
            e->rank = e->pid;
    }
}

static int tt_load_file(tt_trace *t, const char *path, char *err, size_t err_size) {
    tt_file_reading reading;
    tt_parser p;
    tt_file *f;
    size_t first_event = t->n;
    int file = t->nfiles, rc = 0, file_rank = -1;
    char why[400];
    t->files = (tt_file *)tt_grow(t->files, &t->files_cap, (size_t)t->nfiles + 1, sizeof *t->files);
    f = &t->files[t->nfiles];
    memset(f, 0, sizeof *f);
    if (tt_read_file(path, &f->text, &f->size, err, err_size) != 0) return -1;
    f->path = tt_strdup(path);
    t->nfiles++;
    memset(&reading, 0, sizeof reading);
    reading.other_node = -1;
    memset(&p, 0, sizeof p);
    p.file = path;
    p.text = (const unsigned char *)f->text;
    p.size = f->size;
    p.err = err;
    p.err_size = err_size;
    rc = tt_parse_top(t, &p, file, &reading);
    if (rc == 0 && reading.other_node < 0) {
        tt_error(err, err_size, "%s: no otherData before the file ends (not a trace fsdp.h wrote)", tt_shown(path));
        rc = -1;
    } else if (rc == 0 && !reading.have_events) {
        tt_error(err, err_size, "%s: no traceEvents", tt_shown(path));
        rc = -1;
    } else if (rc == 0 && tt_jmember(&reading.other, reading.other_node, "ranks") >= 0) {
        tt_rank top;
        memset(&top, 0, sizeof top);
        if (tt_rank_from_json(&reading.other, reading.other_node, 1, &top, why, sizeof why) != 0) {
            tt_error(err, err_size, "%s: otherData: %s", tt_shown(path), why);
            rc = -1;
        } else {
            rc = tt_add_merged_ranks(t, &reading.other, reading.other_node, file, &reading, err, err_size);
        }
    } else if (rc == 0) {
        tt_rank r;
        memset(&r, 0, sizeof r);
        r.file = file;
        r.truncated = reading.truncated;
        r.dropped_partial = reading.partial;
        r.events = reading.kept;
        if (tt_rank_from_json(&reading.other, reading.other_node, 0, &r, why, sizeof why) != 0) {
            tt_error(err, err_size, "%s: otherData: %s", tt_shown(path), why);
            rc = -1;
        } else {
            rc = tt_add_rank(t, &r, tt_shown(path), err, err_size);
            file_rank = r.rank;
        }
    }
    if (rc == 0) tt_assign_event_ranks(t, first_event, file, file_rank);
    tt_jdoc_free(&reading.other);
    return rc;
}

static int tt_compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* 1 if name is trace-rank<digits>.json: what fsdp.h writes (not merge's output or temp files). */
static int tt_is_rank_file_name(const char *name) {
    size_t n = strlen(name), digits = strspn(name + (n > 10 ? 10 : n), "0123456789");
    return n > 15 && strncmp(name, "trace-rank", 10) == 0 && digits > 0 && strcmp(name + 10 + digits, ".json") == 0;
}

/* Every DIR/trace-rank*.json, in name order. */
static int tt_load_dir(tt_trace *t, const char *dir, char *err, size_t err_size) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL, path[4096];
    size_t n = 0, cap = 0, i;
    int rc = 0;
    if (!d) {
        tt_error(err, err_size, "%s: %s", tt_shown(dir), strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (!tt_is_rank_file_name(e->d_name)) continue;
        names = (char **)tt_grow(names, &cap, n + 1, sizeof *names);
        names[n++] = tt_strdup(e->d_name);
    }
    closedir(d);
    if (n == 0) {
        tt_error(err, err_size, "%s: no trace-rank*.json files (is it the directory FSDP_TRACE named?)", tt_shown(dir));
        rc = -1;
    }
    tt_sort(names, n, sizeof *names, tt_compare_names);
    for (i = 0; i < n && rc == 0; i++) {
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= sizeof path) {
            tt_error(err, err_size, "%s: path too long", tt_shown(dir));
            rc = -1;
        } else {
            rc = tt_load_file(t, path, err, err_size);
        }
    }
    for (i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

static int tt_compare_ranks(const void *a, const void *b) {
    const tt_rank *x = (const tt_rank *)a, *y = (const tt_rank *)b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Frees what t holds and zeroes it. */
TT_API void tt_free(tt_trace *t) {
    int i;
    if (!t) return;
    for (i = 0; i < t->nfiles; i++) {
        free(t->files[i].path);
        free(t->files[i].text);
    }
    free(t->files);
    free(t->ev);
    free(t->ranks);
    free(t->rank_seen);
    tt_strings_free(&t->strings);
    memset(t, 0, sizeof *t);
}

/* Loads a trace: path is a directory of trace-rank*.json files (what FSDP_TRACE named) or one
   file (a rank's, or one merge wrote). Returns 0, or -1 with the first problem in err (the
   file and byte offset) and *out empty. A file cut off at the end is not an error: its rank
   says truncated (tt_print_warnings tells the user). */
TT_API int tt_load(const char *path, tt_trace *out, char *err, size_t err_size) {
    struct stat st;
    int rc;
    memset(out, 0, sizeof *out);
    if (err && err_size) err[0] = 0;
    snprintf(out->source, sizeof out->source, "%s", path);
    if (!(out->rank_seen = (unsigned char *)calloc(TT_MAX_WORLD / 8, 1))) tt_out_of_memory();
    if (stat(path, &st) != 0) {
        tt_error(err, err_size, "%s: %s", tt_shown(path), strerror(errno));
        rc = -1;
    } else {
        rc = S_ISDIR(st.st_mode) ? tt_load_dir(out, path, err, err_size) : tt_load_file(out, path, err, err_size);
    }
    free(out->rank_seen);
    out->rank_seen = NULL;
    if (rc != 0) {
        tt_free(out);
        return -1;
    }
    tt_sort(out->ranks, (size_t)out->nranks, sizeof *out->ranks, tt_compare_ranks);
    return 0;
}

/* The index in t->ranks of rank, or -1. */
static int tt_rank_index(const tt_trace *t, int rank) {
    int lo = 0, hi = t->nranks - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (t->ranks[mid].rank == rank) return mid;
        if (t->ranks[mid].rank < rank) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* One line per rank whose file was cut off (its rank died while writing). */
TT_API void tt_print_warnings(FILE *errs, const tt_trace *t) {
    int i;
    for (i = 0; i < t->nranks; i++) {
        const tt_rank *r = &t->ranks[i];
        if (!r->truncated) continue;
        if (t->files[r->file].merged)
            fprintf(errs, "trace_tool: warning: %s: rank %d's trace was truncated (the rank stopped writing)\n",
                    tt_shown(t->files[r->file].path), r->rank);
        else
            fprintf(errs, "trace_tool: warning: %s: truncated after %lu events (rank %d stopped writing; %s)\n",
                    tt_shown(t->files[r->file].path), (unsigned long)r->events, r->rank,
                    r->dropped_partial ? "its incomplete last event was left out" : "no event was cut");
    }
}

static int tt_is_x(const tt_event *e) { return e->ph[0] == 'X' && e->ph[1] == 0; }
static int tt_cat_is(const tt_event *e, const char *cat) { return strcmp(e->cat, cat) == 0; }

/* "FILE: byte N: event 'NAME'", for messages about an event. */
static const char *tt_event_place(const tt_trace *t, const tt_event *e) {
    static char place[800];
    snprintf(place, sizeof place, "%s: byte %lu: event '%s'", tt_shown(t->files[e->file].path), (unsigned long)e->offset,
             tt_shown(e->name));
    return place;
}

/* ---------------------------------------------------------------------------------------------
   check: the trace against the format
   --------------------------------------------------------------------------------------------- */
typedef struct tt_check_result {
    int ranks;
    size_t events;        /* complete ("X") events */
    size_t steps;         /* distinct args.step of "iteration" events */
} tt_check_result;

static int tt_check_ranks(const tt_trace *t, char *err, size_t err_size) {
    int i, world = t->nranks ? t->ranks[0].world : 0;
    for (i = 0; i < t->nranks; i++) {
        const tt_rank *r = &t->ranks[i];
        if (r->world != world) {
            tt_error(err, err_size, "%s: rank %d says world %d, rank %d says %d", tt_shown(t->files[r->file].path), r->rank,
                     r->world, t->ranks[0].rank, world);
            return -1;
        }
        if (!(r->clock_error_us >= 0)) {
            tt_error(err, err_size, "%s: rank %d: clock_error_us %g is negative", tt_shown(t->files[r->file].path), r->rank,
                     r->clock_error_us);
            return -1;
        }
    }
    for (i = 0; i < world; i++)
        if (i >= t->nranks || t->ranks[i].rank != i) { /* sorted, distinct, below world */
            tt_error(err, err_size, "%s: rank %d of world %d is missing (no trace-rank%05d.json)", tt_shown(t->source), i,
                     world, i);
            return -1;
        }
    return 0;
}

static const char *const tt_ops[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};

/* What is wrong with one event, or NULL. */
static const char *tt_event_problem(const tt_trace *t, const tt_event *e, char *why, size_t why_size) {
    size_t k;
    int metadata = e->ph[0] == 'M' && e->ph[1] == 0;
    if (!tt_is_x(e) && !metadata) { tt_error(why, why_size, "ph '%s' (fsdp.h writes only X and M)", tt_shown(e->ph)); return why; }
    if (!(e->present & TT_HAS_PID)) return "no pid";
    if (e->rank < 0 || e->pid != e->rank) {
        if (t->files[e->file].merged) tt_error(why, why_size, "pid %d is none of the file's ranks", e->pid);
        else tt_error(why, why_size, "pid %d in rank %d's file", e->pid, e->rank);
        return why;
    }
    if (!(e->present & TT_HAS_TID) || e->tid < 0 || e->tid >= TT_TIDS) { tt_error(why, why_size, "tid %d is not 0..%d", e->tid, TT_TIDS - 1); return why; }
    if (metadata) return e->name[0] ? NULL : "a metadata event without a name";
    if (!e->name[0]) return "no name";
    if (!e->cat[0]) return "no cat";
    if (!(e->present & TT_HAS_TS) || e->ts < 0) { tt_error(why, why_size, "ts %g is missing or negative", e->ts); return why; }
    if (!(e->present & TT_HAS_DUR) || e->dur < 0) { tt_error(why, why_size, "dur %g is missing or negative", e->dur); return why; }
    if (tt_cat_is(e, "iteration") && (!(e->present & TT_HAS_STEP) || e->step < 1)) return "an iteration without args.step (1 or more)";
    if (!tt_cat_is(e, "comm")) return NULL;
    for (k = 0; k < sizeof tt_ops / sizeof tt_ops[0] && strcmp(e->op, tt_ops[k]) != 0; k++) continue;
    if (k == sizeof tt_ops / sizeof tt_ops[0]) { tt_error(why, why_size, "a comm event with args.op '%s'", tt_shown(e->op)); return why; }
    if (!(e->present & TT_HAS_BYTES) || e->bytes < 0) return "a comm event without args.bytes";
    if (!e->group[0]) return "a comm event without args.group";
    if (!(e->present & TT_HAS_SEQ) || e->seq < 0) return "a comm event without args.seq";
    return NULL;
}

typedef struct tt_key { /* a sort key: one event's place in an ordering */
    const char *group;
    long long seq;
    int rank, lane;
    double ts, end;
    size_t event;
} tt_key;

static int tt_compare_time(const void *a, const void *b) { /* rank, lane, start, longest first */
    const tt_key *x = (const tt_key *)a, *y = (const tt_key *)b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->lane != y->lane) return x->lane < y->lane ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    if (x->end != y->end) return x->end > y->end ? -1 : 1;
    return (x->event > y->event) - (x->event < y->event);
}

/* Events of one thread nest or are disjoint (a wait inside a hook). Rounding to 3 decimals
   can move an end by up to 0.002 us, so that much overlap is allowed. */
static int tt_check_nesting(const tt_trace *t, char *err, size_t err_size) {
    tt_key *keys = (tt_key *)malloc((t->n ? t->n : 1) * sizeof *keys);
    size_t n = 0, i, depth = 0, stack_cap = 0, *stack = NULL;
    int rc = 0;
    if (!keys) tt_out_of_memory();
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        if (!tt_is_x(e)) continue;
        keys[n].rank = e->rank;
        keys[n].lane = e->tid;
        keys[n].ts = e->ts;
        keys[n].end = e->ts + e->dur;
        keys[n++].event = i;
    }
    tt_sort(keys, n, sizeof *keys, tt_compare_time);
    for (i = 0; i < n && rc == 0; i++) {
        if (i > 0 && (keys[i].rank != keys[i - 1].rank || keys[i].lane != keys[i - 1].lane)) depth = 0;
        while (depth > 0 && keys[stack[depth - 1]].end <= keys[i].ts + 0.002) depth--;
        if (depth > 0 && keys[i].end > keys[stack[depth - 1]].end + 0.002) {
            const tt_event *outer = &t->ev[keys[stack[depth - 1]].event];
            tt_error(err, err_size, "%s (tid %d, %.3f + %.3f us) overlaps '%s' (%.3f + %.3f us) without nesting in it",
                     tt_event_place(t, &t->ev[keys[i].event]), t->ev[keys[i].event].tid, keys[i].ts, keys[i].end - keys[i].ts,
                     tt_shown(outer->name), outer->ts, outer->dur);
            rc = -1;
        }
        stack = (size_t *)tt_grow(stack, &stack_cap, depth + 1, sizeof *stack);
        stack[depth++] = i;
    }
    free(stack);
    free(keys);
    return rc;
}

static int tt_compare_long(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Checks the trace against the format: every rank 0..world-1 present once, with one world;
   events with the fields the format promises; nesting per thread. Returns 0 with the counts
   in *res, or -1 with the first problem in err. (tt_load has checked the JSON and otherData.) */
TT_API int tt_check(const tt_trace *t, tt_check_result *res, char *err, size_t err_size) {
    long long *steps = (long long *)malloc((t->n ? t->n : 1) * sizeof *steps);
    size_t i, nsteps = 0;
    char why[300];
    memset(res, 0, sizeof *res);
    if (!steps) tt_out_of_memory();
    if (tt_check_ranks(t, err, err_size) != 0) { free(steps); return -1; }
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        const char *problem = tt_event_problem(t, e, why, sizeof why);
        if (problem) {
            tt_error(err, err_size, "%s: %s", tt_event_place(t, e), problem);
            free(steps);
            return -1;
        }
        if (!tt_is_x(e)) continue;
        res->events++;
        if (tt_cat_is(e, "iteration")) steps[nsteps++] = e->step;
    }
    if (tt_check_nesting(t, err, err_size) != 0) { free(steps); return -1; }
    tt_sort(steps, nsteps, sizeof *steps, tt_compare_long);
    for (i = 0; i < nsteps; i++) res->steps += i == 0 || steps[i] != steps[i - 1];
    res->ranks = t->nranks;
    free(steps);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   summary: per step and rank where the time went; stragglers at collectives
   --------------------------------------------------------------------------------------------- */
typedef struct tt_step_stat { /* one rank's one step; times in ms */
    long long step;
    int rank, skipped;
    double start_us, step_ms, compute_ms, in_fsdp_ms, exposed_comm_ms, other_wait_ms;
} tt_step_stat;

typedef struct tt_step_slowest {
    long long step;
    int ranks, slowest_rank, fastest_rank;
    double slowest_ms, fastest_ms;
} tt_step_slowest;

typedef struct tt_collective { /* one (group, seq) across the ranks that ran it */
    const char *op, *unit, *group;
    long long seq, bytes;
    int ranks, first_rank, last_rank;
    double first_us, spread_ms;   /* last arrival (start) minus first */
    double clock_error_us;        /* the two largest clock_error_us of its ranks, summed: the bound
                                     on the error of any difference between two arrivals */
} tt_collective;

typedef struct tt_straggler {
    int rank, times_last;         /* collectives (spread > 0) it arrived last at */
    double total_late_ms, mean_late_ms;
} tt_straggler;

typedef struct tt_summary {
    tt_step_stat *steps;          /* by step, then rank */
    size_t nsteps;
    tt_step_slowest *slowest;     /* by step */
    size_t nslowest;
    tt_collective *collectives;   /* largest spread first */
    size_t ncollectives;
    tt_straggler *stragglers;     /* most often last first, then most total lateness */
    size_t nstragglers;
    size_t below_clock_error;     /* collectives of 2+ ranks whose spread is below their clock error */
} tt_summary;

typedef struct tt_span { /* one iteration while its rank's events are swept */
    double start, end;
    size_t stat;
    double fsdp_until, comm_until, other_until;
    double fsdp_us, comm_us, other_us;
} tt_span;

/* Adds the part of [from, to) after *until (a union of intervals seen in start order). */
static double tt_cover(double *until, double from, double to) {
    if (to <= *until) return 0;
    if (from < *until) from = *until;
    *until = to;
    return to - from;
}

/* One tid-0 event clipped to the iterations it overlaps (spans sorted by start). In a valid
   trace that is one (events nest in their iteration); at most 4 are looked at, so that a
   malformed trace of long events cannot make the sweep quadratic. */
static void tt_sweep_event(const tt_event *e, tt_span *spans, size_t nspans) {
    size_t lo = 0, hi = nspans, k, last;
    double end = e->ts + e->dur;
    int waits = tt_cat_is(e, "wait"), for_comm = strcmp(e->wait_for, "comm") == 0;
    while (lo < hi) { /* the first span starting after ts */
        size_t mid = lo + (hi - lo) / 2;
        if (spans[mid].start <= e->ts) lo = mid + 1;
        else hi = mid;
    }
    k = lo > 0 ? lo - 1 : 0;
    for (last = k + 4; k < nspans && k < last && spans[k].start < end; k++) {
        double from = e->ts > spans[k].start ? e->ts : spans[k].start, to = end < spans[k].end ? end : spans[k].end;
        if (to <= from) continue;
        spans[k].fsdp_us += tt_cover(&spans[k].fsdp_until, from, to);
        if (waits && for_comm) spans[k].comm_us += tt_cover(&spans[k].comm_until, from, to);
        else if (waits) spans[k].other_us += tt_cover(&spans[k].other_until, from, to);
    }
}

static int tt_compare_step_stats(const void *a, const void *b) {
    const tt_step_stat *x = (const tt_step_stat *)a, *y = (const tt_step_stat *)b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->start_us > y->start_us) - (x->start_us < y->start_us);
}

/* One rank's iterations (keys[lo, hi): its tid-0 events in time order) into s->steps. */
static void tt_rank_steps(const tt_trace *t, const tt_key *keys, size_t lo, size_t hi, tt_summary *s, size_t *steps_cap) {
    tt_span *spans = NULL;
    size_t nspans = 0, spans_cap = 0, i;
    for (i = lo; i < hi; i++) {
        const tt_event *e = &t->ev[keys[i].event];
        tt_step_stat *st;
        if (!tt_cat_is(e, "iteration")) continue;
        spans = (tt_span *)tt_grow(spans, &spans_cap, nspans + 1, sizeof *spans);
        memset(&spans[nspans], 0, sizeof *spans);
        spans[nspans].start = spans[nspans].fsdp_until = spans[nspans].comm_until = spans[nspans].other_until = e->ts;
        spans[nspans].end = e->ts + e->dur;
        spans[nspans++].stat = s->nsteps;
        s->steps = (tt_step_stat *)tt_grow(s->steps, steps_cap, s->nsteps + 1, sizeof *s->steps);
        st = &s->steps[s->nsteps++];
        memset(st, 0, sizeof *st);
        st->step = e->step;
        st->rank = e->rank;
        st->skipped = e->skipped;
        st->start_us = e->ts;
        st->step_ms = e->dur / 1000;
    }
    for (i = lo; i < hi && nspans; i++)
        if (!tt_cat_is(&t->ev[keys[i].event], "iteration")) tt_sweep_event(&t->ev[keys[i].event], spans, nspans);
    for (i = 0; i < nspans; i++) {
        tt_step_stat *st = &s->steps[spans[i].stat];
        st->in_fsdp_ms = spans[i].fsdp_us / 1000;
        st->compute_ms = st->step_ms - st->in_fsdp_ms;
        st->exposed_comm_ms = spans[i].comm_us / 1000;
        st->other_wait_ms = spans[i].other_us / 1000;
    }
    free(spans);
}

static void tt_summarize_steps(const tt_trace *t, tt_summary *s) {
    tt_key *keys = (tt_key *)malloc((t->n ? t->n : 1) * sizeof *keys);
    size_t n = 0, i, lo, steps_cap = 0, slowest_cap = 0;
    if (!keys) tt_out_of_memory();
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        if (!tt_is_x(e) || e->tid != 0 || e->rank < 0 || (e->present & (TT_HAS_TS | TT_HAS_DUR)) != (TT_HAS_TS | TT_HAS_DUR)) continue;
        memset(&keys[n], 0, sizeof *keys);
        keys[n].rank = e->rank;
        keys[n].ts = e->ts;
        keys[n].end = e->ts + e->dur;
        keys[n++].event = i;
    }
    tt_sort(keys, n, sizeof *keys, tt_compare_time);
    for (lo = 0; lo < n; lo = i) {
        for (i = lo; i < n && keys[i].rank == keys[lo].rank; i++) continue;
        tt_rank_steps(t, keys, lo, i, s, &steps_cap);
    }
    free(keys);
    tt_sort(s->steps, s->nsteps, sizeof *s->steps, tt_compare_step_stats);
    for (lo = 0; lo < s->nsteps; lo = i) {
        tt_step_slowest *w;
        s->slowest = (tt_step_slowest *)tt_grow(s->slowest, &slowest_cap, s->nslowest + 1, sizeof *s->slowest);
        w = &s->slowest[s->nslowest++];
        w->step = s->steps[lo].step;
        w->ranks = 0;
        w->slowest_rank = w->fastest_rank = s->steps[lo].rank;
        w->slowest_ms = w->fastest_ms = s->steps[lo].step_ms;
        for (i = lo; i < s->nsteps && s->steps[i].step == s->steps[lo].step; i++) {
            w->ranks++;
            if (s->steps[i].step_ms > w->slowest_ms) { w->slowest_ms = s->steps[i].step_ms; w->slowest_rank = s->steps[i].rank; }
            if (s->steps[i].step_ms < w->fastest_ms) { w->fastest_ms = s->steps[i].step_ms; w->fastest_rank = s->steps[i].rank; }
        }
    }
}

static int tt_compare_collective_keys(const void *a, const void *b) { /* group, seq, rank, start */
    const tt_key *x = (const tt_key *)a, *y = (const tt_key *)b;
    int c = x->group == y->group ? 0 : strcmp(x->group, y->group);
    if (c) return c;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->ts > y->ts) - (x->ts < y->ts);
}

static int tt_compare_spread(const void *a, const void *b) {
    const tt_collective *x = (const tt_collective *)a, *y = (const tt_collective *)b;
    int c;
    if (x->spread_ms != y->spread_ms) return x->spread_ms > y->spread_ms ? -1 : 1;
    if ((c = strcmp(x->group, y->group)) != 0) return c;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* keys[lo, hi): one collective's events, by rank; a rank's second event for it is ignored. */
static void tt_collective_from(const tt_trace *t, const tt_key *keys, size_t lo, size_t hi, tt_collective *c) {
    const tt_event *e = &t->ev[keys[lo].event];
    double last_us, largest = 0, second = 0;
    size_t i;
    memset(c, 0, sizeof *c);
    c->op = e->op;
    c->unit = e->unit;
    c->group = e->group;
    c->seq = e->seq;
    c->bytes = e->bytes;
    c->first_rank = c->last_rank = keys[lo].rank;
    c->first_us = last_us = keys[lo].ts;
    for (i = lo; i < hi; i++) {
        int index;
        double error;
        if (i > lo && keys[i].rank == keys[i - 1].rank) continue;
        c->ranks++;
        if (keys[i].ts < c->first_us) { c->first_us = keys[i].ts; c->first_rank = keys[i].rank; }
        if (keys[i].ts > last_us) { last_us = keys[i].ts; c->last_rank = keys[i].rank; }
        index = tt_rank_index(t, keys[i].rank);
        error = index >= 0 ? t->ranks[index].clock_error_us : 0;
        if (error > largest) { second = largest; largest = error; }
        else if (error > second) second = error;
    }
    c->spread_ms = (last_us - c->first_us) / 1000;
    c->clock_error_us = c->ranks > 1 ? largest + second : 0;
}

static int tt_compare_stragglers(const void *a, const void *b) {
    const tt_straggler *x = (const tt_straggler *)a, *y = (const tt_straggler *)b;
    if (x->times_last != y->times_last) return x->times_last > y->times_last ? -1 : 1;
    if (x->total_late_ms != y->total_late_ms) return x->total_late_ms > y->total_late_ms ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Per rank: the collectives it arrived last at (a spread above 0 among 2+ ranks). */
static void tt_summarize_stragglers(const tt_trace *t, tt_summary *s) {
    tt_straggler *by_rank = (tt_straggler *)calloc((size_t)t->nranks + 1, sizeof *by_rank);
    size_t i;
    int r;
    if (!by_rank) tt_out_of_memory();
    for (i = 0; i < s->ncollectives; i++) {
        const tt_collective *c = &s->collectives[i];
        int index = tt_rank_index(t, c->last_rank);
        if (c->ranks < 2) continue;
        if (c->spread_ms * 1000 < c->clock_error_us) s->below_clock_error++;
        if (c->spread_ms <= 0 || index < 0) continue;
        by_rank[index].times_last++;
        by_rank[index].total_late_ms += c->spread_ms;
    }
    s->stragglers = (tt_straggler *)calloc((size_t)t->nranks + 1, sizeof *s->stragglers);
    if (!s->stragglers) tt_out_of_memory();
    for (r = 0; r < t->nranks; r++) {
        if (!by_rank[r].times_last) continue;
        by_rank[r].rank = t->ranks[r].rank;
        by_rank[r].mean_late_ms = by_rank[r].total_late_ms / by_rank[r].times_last;
        s->stragglers[s->nstragglers++] = by_rank[r];
    }
    tt_sort(s->stragglers, s->nstragglers, sizeof *s->stragglers, tt_compare_stragglers);
    free(by_rank);
}

static void tt_summarize_collectives(const tt_trace *t, tt_summary *s) {
    tt_key *keys = (tt_key *)malloc((t->n ? t->n : 1) * sizeof *keys);
    size_t n = 0, i, lo, cap = 0;
    if (!keys) tt_out_of_memory();
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        if (!tt_is_x(e) || !tt_cat_is(e, "comm") || e->rank < 0 || !e->group[0] || !(e->present & TT_HAS_SEQ)) continue;
        memset(&keys[n], 0, sizeof *keys);
        keys[n].group = e->group;
        keys[n].seq = e->seq;
        keys[n].rank = e->rank;
        keys[n].ts = e->ts;
        keys[n++].event = i;
    }
    tt_sort(keys, n, sizeof *keys, tt_compare_collective_keys); /* each collective's events together */
    for (lo = 0; lo < n; lo = i) {
        for (i = lo; i < n && keys[i].group == keys[lo].group && keys[i].seq == keys[lo].seq; i++) continue;
        s->collectives = (tt_collective *)tt_grow(s->collectives, &cap, s->ncollectives + 1, sizeof *s->collectives);
        tt_collective_from(t, keys, lo, i, &s->collectives[s->ncollectives++]);
    }
    free(keys);
    tt_sort(s->collectives, s->ncollectives, sizeof *s->collectives, tt_compare_spread);
    tt_summarize_stragglers(t, s);
}

/* The numbers behind `trace_tool summary`. Free with tt_summary_free. */
TT_API void tt_summarize(const tt_trace *t, tt_summary *out) {
    memset(out, 0, sizeof *out);
    tt_summarize_steps(t, out);
    tt_summarize_collectives(t, out);
}

TT_API void tt_summary_free(tt_summary *s) {
    free(s->steps);
    free(s->slowest);
    free(s->collectives);
    free(s->stragglers);
    memset(s, 0, sizeof *s);
}

static void tt_print_clocks(FILE *out, const tt_trace *t) {
    int i, host_width = 4;
    for (i = 0; i < t->nranks; i++) {
        int n = (int)strlen(tt_shown(t->ranks[i].host));
        if (n > host_width) host_width = n < 40 ? n : 40;
    }
    fprintf(out, "clocks (each rank's aligned to rank 0's):\n  %5s  %-*s  %12s  %10s\n", "rank", host_width, "host",
            "offset us", "error us");
    for (i = 0; i < t->nranks; i++) {
        const tt_rank *r = &t->ranks[i];
        fprintf(out, "  %5d  %-*.*s  %12.1f  %10.1f%s\n", r->rank, host_width, host_width, tt_shown(r->host),
                r->clock_offset_us, r->clock_error_us, r->truncated ? "  (trace truncated)" : "");
    }
}

static void tt_print_steps(FILE *out, const tt_summary *s) {
    size_t i;
    if (!s->nsteps) {
        fprintf(out, "\nno iteration events: no step ran while tracing\n");
        return;
    }
    fprintf(out, "\nper step and rank (ms):\n  %6s  %5s  %10s  %10s  %10s  %12s  %10s\n", "step", "rank", "step", "compute",
            "in fsdp", "exposed comm", "other wait");
    for (i = 0; i < s->nsteps; i++) {
        const tt_step_stat *st = &s->steps[i];
        fprintf(out, "  %6lld  %5d  %10.3f  %10.3f  %10.3f  %12.3f  %10.3f%s\n", st->step, st->rank, st->step_ms,
                st->compute_ms, st->in_fsdp_ms, st->exposed_comm_ms, st->other_wait_ms, st->skipped ? "  (skipped)" : "");
    }
    fprintf(out, "\nslowest rank per step:\n  %6s  %7s  %10s  %10s  %12s\n", "step", "slowest", "step ms", "fastest ms",
            "behind ms");
    for (i = 0; i < s->nslowest; i++) {
        const tt_step_slowest *w = &s->slowest[i];
        fprintf(out, "  %6lld  %7d  %10.3f  %10.3f  %12.3f\n", w->step, w->slowest_rank, w->slowest_ms, w->fastest_ms,
                w->slowest_ms - w->fastest_ms);
    }
}

static int tt_text_width(const char *text, int least) {
    int n = (int)strlen(tt_shown(text));
    return n > 40 ? 40 : n > least ? n : least;
}

static void tt_print_collectives(FILE *out, const tt_summary *s, size_t top) {
    size_t i, shown = s->ncollectives < top ? s->ncollectives : top;
    int op_width = 2, unit_width = 4, group_width = 5;
    if (!s->ncollectives) {
        fprintf(out, "\nno collectives with args.group and args.seq: nothing to match across ranks\n");
        return;
    }
    fprintf(out, "\ntop stragglers (last to arrive at a collective; %lu collectives matched by group and seq):\n",
            (unsigned long)s->ncollectives);
    fprintf(out, "  %5s  %10s  %14s  %13s\n", "rank", "last at", "total late ms", "mean late ms");
    for (i = 0; i < s->nstragglers; i++)
        fprintf(out, "  %5d  %10d  %14.3f  %13.3f\n", s->stragglers[i].rank, s->stragglers[i].times_last,
                s->stragglers[i].total_late_ms, s->stragglers[i].mean_late_ms);
    if (!s->nstragglers) fprintf(out, "  (none: every collective started at the same time on all its ranks)\n");
    for (i = 0; i < shown; i++) {
        op_width = tt_text_width(s->collectives[i].op, op_width);
        unit_width = tt_text_width(s->collectives[i].unit, unit_width);
        group_width = tt_text_width(s->collectives[i].group, group_width);
    }
    fprintf(out, "\nlargest arrival spreads (top %lu):\n  %-*s  %-*s  %-*s  %8s  %9s  %10s\n", (unsigned long)shown, op_width,
            "op", unit_width, "unit", group_width, "group", "seq", "last rank", "spread ms");
    for (i = 0; i < shown; i++) {
        const tt_collective *c = &s->collectives[i];
        fprintf(out, "  %-*.*s  %-*.*s  %-*.*s  %8lld  %9d  %10.3f%s\n", op_width, op_width, tt_shown(c->op), unit_width,
                unit_width, c->unit[0] ? tt_shown(c->unit) : "-", group_width, group_width, tt_shown(c->group), c->seq,
                c->last_rank, c->spread_ms, c->spread_ms * 1000 < c->clock_error_us ? " ~" : "");
    }
    if (s->below_clock_error)
        fprintf(out, "warning: %lu of %lu collectives have an arrival spread below their ranks' clock error bound "
                     "(marked ~): who was last there is within the clock alignment's error\n",
                (unsigned long)s->below_clock_error, (unsigned long)s->ncollectives);
}

/* The report `trace_tool summary` prints: clocks, steps, slowest ranks, stragglers and the
   `top` largest arrival spreads. */
TT_API void tt_print_summary(FILE *out, const tt_trace *t, const tt_summary *s, size_t top) {
    fprintf(out, "%s: %d ranks (world %d), %lu events\n", tt_shown(t->source), t->nranks, t->world, (unsigned long)t->n);
    tt_print_clocks(out, t);
    tt_print_steps(out, s);
    tt_print_collectives(out, s, top);
}

/* ---------------------------------------------------------------------------------------------
   svg: a timeline of a few steps, one band per rank
   --------------------------------------------------------------------------------------------- */
/* How each kind of event is drawn: the first row whose category (and, for waits, args.for; for
   collectives, args.op) matches. Rows with a label make the legend. */
typedef struct tt_style {
    const char *cat, *detail;     /* detail NULL: any */
    const char *colour, *label;
} tt_style;

static const tt_style tt_styles[] = {
    {"iteration", NULL, "#4caf50", "compute (no fsdp.h call)"},
    {"hook", NULL, "#9e9e9e", "hook"},
    {"wait", "comm", "#e53935", "wait for comm"},
    {"wait", NULL, "#fb8c00", "other wait (step, io)"},
    {"step", NULL, "#8e24aa", "optimizer step"},
    {"comm", "all_gather", "#1e88e5", "all_gather, broadcast"},
    {"comm", "broadcast", "#1e88e5", NULL},
    {"comm", NULL, "#00897b", "reduce_scatter, all_reduce"},
    {"checkpoint", NULL, "#795548", "checkpoint"},
    {"io", NULL, "#607d8b", "offload io"},
    {NULL, NULL, "#212121", "other"},
};

static const tt_style *tt_style_of(const tt_event *e) {
    const tt_style *s = tt_styles;
    for (; s->cat; s++) {
        const char *detail = tt_cat_is(e, "wait") ? e->wait_for : e->op;
        if (strcmp(s->cat, e->cat) == 0 && (!s->detail || strcmp(s->detail, detail) == 0)) return s;
    }
    return s;
}

typedef struct tt_svg_options {
    long long first_step, last_step; /* 0, 0: the last two steps every rank completed */
    int width;                       /* pixels; 0: 1200 */
    const char *title;               /* the heading's text; NULL: the trace's path */
} tt_svg_options;

typedef struct tt_svg_result {
    long long first_step, last_step; /* the steps drawn (0 when the trace has none) */
    double t0_us, t1_us;             /* the time drawn */
    size_t rects;                    /* every <rect> written */
} tt_svg_result;

typedef struct tt_step_extent { /* one step across the ranks */
    long long step;
    int ranks;
    double start, end, rank0_start;
} tt_step_extent;

static int tt_compare_extent_keys(const void *a, const void *b) {
    const tt_key *x = (const tt_key *)a, *y = (const tt_key *)b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Every step's extent across ranks, in step order. */
static tt_step_extent *tt_step_extents(const tt_trace *t, size_t *count) {
    tt_key *keys = (tt_key *)malloc((t->n ? t->n : 1) * sizeof *keys);
    tt_step_extent *steps = NULL;
    size_t n = 0, i, cap = 0;
    if (!keys) tt_out_of_memory();
    *count = 0;
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        if (!tt_is_x(e) || !tt_cat_is(e, "iteration") || e->tid != 0 || e->rank < 0 || !(e->present & TT_HAS_STEP)) continue;
        memset(&keys[n], 0, sizeof *keys);
        keys[n].seq = e->step;
        keys[n].rank = e->rank;
        keys[n].ts = e->ts;
        keys[n++].end = e->ts + e->dur;
    }
    tt_sort(keys, n, sizeof *keys, tt_compare_extent_keys);
    for (i = 0; i < n; i++) {
        tt_step_extent *x;
        if (i == 0 || keys[i].seq != keys[i - 1].seq) {
            steps = (tt_step_extent *)tt_grow(steps, &cap, *count + 1, sizeof *steps);
            x = &steps[(*count)++];
            x->step = keys[i].seq;
            x->ranks = 0;
            x->start = x->rank0_start = keys[i].ts;
            x->end = keys[i].end;
        }
        x = &steps[*count - 1];
        if (i == 0 || keys[i].seq != keys[i - 1].seq || keys[i].rank != keys[i - 1].rank) x->ranks++;
        if (keys[i].ts < x->start) x->start = keys[i].ts;
        if (keys[i].end > x->end) x->end = keys[i].end;
        if (keys[i].rank == t->ranks[0].rank) x->rank0_start = keys[i].ts;
    }
    free(keys);
    return steps;
}

/* The time to draw: the chosen steps (default: the last two that every rank completed), or
   every event's when there is no step. */
static int tt_svg_view(const tt_trace *t, const tt_svg_options *opt, const tt_step_extent *steps, size_t nsteps,
                       tt_svg_result *res, char *err, size_t err_size) {
    size_t i, complete = 0, found = 0;
    res->first_step = opt->first_step;
    res->last_step = opt->last_step;
    if (!opt->first_step && nsteps) { /* the last two complete steps, else the last two */
        for (i = nsteps; i-- > 0 && complete < 2;)
            if (steps[i].ranks == t->nranks) {
                res->first_step = steps[i].step;
                if (complete++ == 0) res->last_step = steps[i].step;
            }
        if (!complete) {
            res->first_step = steps[nsteps > 1 ? nsteps - 2 : 0].step;
            res->last_step = steps[nsteps - 1].step;
        }
    }
    res->t0_us = HUGE_VAL;
    res->t1_us = -HUGE_VAL;
    for (i = 0; i < nsteps; i++) {
        if (steps[i].step < res->first_step || steps[i].step > res->last_step) continue;
        found++;
        if (steps[i].start < res->t0_us) res->t0_us = steps[i].start;
        if (steps[i].end > res->t1_us) res->t1_us = steps[i].end;
    }
    if (!found && opt->first_step) {
        if (nsteps)
            tt_error(err, err_size, "no step %lld-%lld in the trace (it has steps %lld-%lld)", opt->first_step, opt->last_step,
                     steps[0].step, steps[nsteps - 1].step);
        else
            tt_error(err, err_size, "no step %lld-%lld in the trace (it has no iteration events)", opt->first_step, opt->last_step);
        return -1;
    }
    if (!found) { /* no steps at all: everything */
        res->first_step = res->last_step = 0;
        for (i = 0; i < t->n; i++) {
            const tt_event *e = &t->ev[i];
            if (!tt_is_x(e) || e->rank < 0) continue;
            if (e->ts < res->t0_us) res->t0_us = e->ts;
            if (e->ts + e->dur > res->t1_us) res->t1_us = e->ts + e->dur;
        }
        if (res->t0_us > res->t1_us) { tt_error(err, err_size, "%s: no complete events to draw", tt_shown(t->source)); return -1; }
    }
    if (res->t1_us <= res->t0_us) res->t1_us = res->t0_us + 1;
    return 0;
}

/* XML text: markup characters as entities; characters XML 1.0 forbids (C0 controls, U+FFFE,
   U+FFFF) as '?'. */
static void tt_xml_text(FILE *f, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if (*s < 0x20 && *s != '\t' && *s != '\n') fputc('?', f);
        else if (s[0] == 0xef && s[1] == 0xbf && (s[2] == 0xbe || s[2] == 0xbf)) { fputc('?', f); s += 2; }
        else fputc(*s, f);
    }
}

enum { TT_LANES = 3, TT_LAYERS = 4 };
#define TT_MIN_PX 0.5 /* narrower rects are merged with their neighbours: the file stays small */

typedef struct tt_svg { /* the picture being written */
    FILE *f;
    double t0, t1, left, px_per_us;
    size_t rects;
} tt_svg;

typedef struct tt_cluster { /* neighbouring narrow rects of one lane and layer, drawn as one */
    int count;
    double x0, x1, busy_us, y, h;
    const tt_event *longest;
} tt_cluster;

static double tt_svg_x(const tt_svg *g, double us) {
    if (us < g->t0) us = g->t0;
    if (us > g->t1) us = g->t1;
    return g->left + (us - g->t0) * g->px_per_us;
}

static void tt_svg_title_of(FILE *f, const tt_event *e) {
    char line[200];
    if (tt_cat_is(e, "iteration")) {
        snprintf(line, sizeof line, "step %lld on rank %d: %.3f ms%s", e->step, e->rank, e->dur / 1000,
                 e->skipped ? " (skipped)" : "");
        tt_xml_text(f, line);
        return;
    }
    tt_xml_text(f, e->name);
    snprintf(line, sizeof line, ": %.3f ms", e->dur / 1000);
    tt_xml_text(f, line);
    if (tt_cat_is(e, "comm")) {
        snprintf(line, sizeof line, ", %lld bytes, seq %lld of group ", e->bytes, e->seq);
        tt_xml_text(f, line);
        tt_xml_text(f, e->group);
    }
}

static void tt_svg_flush(tt_svg *g, tt_cluster *c) {
    char line[120];
    double width = c->x1 - c->x0, busy;
    if (!c->count) return;
    if (width < TT_MIN_PX) width = TT_MIN_PX; /* short events stay visible */
    /* a cluster is as opaque as its events fill it: short waits merged into a pixel do not
       paint it solid */
    busy = c->count > 1 ? c->busy_us * g->px_per_us / width : 1;
    busy = busy < 0.2 ? 0.2 : busy;
    fprintf(g->f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"", c->x0, c->y, width, c->h,
            tt_style_of(c->longest)->colour);
    if (busy < 0.995) fprintf(g->f, " fill-opacity=\"%.2f\"", busy);
    fputs("><title>", g->f);
    if (c->count == 1) {
        tt_svg_title_of(g->f, c->longest);
    } else {
        snprintf(line, sizeof line, "%d events, %.3f ms in all; the longest: ", c->count, c->busy_us / 1000);
        tt_xml_text(g->f, line);
        tt_svg_title_of(g->f, c->longest);
    }
    fputs("</title></rect>\n", g->f);
    g->rects++;
    c->count = 0;
}

/* Adds an event to the layer's cluster: an event 0.5 px or wider is drawn alone, narrower ones
   are merged with their neighbours until the cluster is 0.5 px wide, so a layer holds at most
   two rects per pixel however many events it has. */
static void tt_svg_add(tt_svg *g, tt_cluster *c, const tt_event *e) {
    double x0 = tt_svg_x(g, e->ts), x1 = tt_svg_x(g, e->ts + e->dur);
    if (x1 - x0 >= TT_MIN_PX || (c->count && x0 - c->x1 >= TT_MIN_PX)) tt_svg_flush(g, c);
    if (!c->count) {
        c->x0 = x0;
        c->x1 = x1;
        c->busy_us = 0;
        c->longest = e;
    }
    c->count++;
    if (x1 > c->x1) c->x1 = x1;
    c->busy_us += e->dur;
    if (e->dur > c->longest->dur) c->longest = e;
    if (c->x1 - c->x0 >= TT_MIN_PX) tt_svg_flush(g, c);
}

/* keys[lo, hi): one lane's events of one rank in time order, drawn in layers by nesting depth
   (outer first, so an inner event covers its part of the outer one). */
static void tt_svg_lane(tt_svg *g, const tt_trace *t, const tt_key *keys, size_t lo, size_t hi, double y, double h) {
    int *depth = (int *)malloc((hi - lo + 1) * sizeof *depth);
    size_t *stack = NULL, open = 0, stack_cap = 0, i;
    int layer;
    if (!depth) tt_out_of_memory();
    for (i = lo; i < hi; i++) {
        while (open > 0 && keys[stack[open - 1]].end <= keys[i].ts) open--;
        depth[i - lo] = open < TT_LAYERS ? (int)open : TT_LAYERS - 1;
        stack = (size_t *)tt_grow(stack, &stack_cap, open + 1, sizeof *stack);
        stack[open++] = i;
    }
    for (layer = 0; layer < TT_LAYERS; layer++) {
        tt_cluster c;
        memset(&c, 0, sizeof c);
        c.y = h >= 10 ? y + layer : y; /* inner events a little inset, where the lane is tall enough */
        c.h = h >= 10 ? h - 2 * layer : h;
        for (i = lo; i < hi; i++)
            if (depth[i - lo] == layer) tt_svg_add(g, &c, &t->ev[keys[i].event]);
        tt_svg_flush(g, &c);
    }
    free(stack);
    free(depth);
}

/* The lane an event is drawn in: 0 the compute thread, 1 collectives (the comm thread's and
   those the compute thread ran), 2 the step, io, checkpoint and wire threads (a strip under lane 1). */
static int tt_lane_of(const tt_event *e) {
    if (e->tid == 0) return tt_cat_is(e, "comm") ? 1 : 0;
    if (e->tid == 1) return 1;
    return e->tid >= 2 && e->tid < TT_TIDS ? 2 : -1;
}

enum { TT_SVG_TOP = 46, TT_SVG_BAND = 44, TT_SVG_LEFT = 96, TT_SVG_RIGHT = 30 };

static void tt_svg_bands(tt_svg *g, const tt_trace *t) {
    static const double lane_y[TT_LANES] = {0, 17, 30}, lane_h[TT_LANES] = {15, 12, 5};
    tt_key *keys = (tt_key *)malloc((t->n ? t->n : 1) * sizeof *keys);
    size_t n = 0, i, k = 0;
    int r;
    if (!keys) tt_out_of_memory();
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        int lane = tt_lane_of(e);
        if (!tt_is_x(e) || e->rank < 0 || lane < 0 || e->ts >= g->t1 || e->ts + e->dur <= g->t0) continue;
        memset(&keys[n], 0, sizeof *keys);
        keys[n].rank = e->rank;
        keys[n].lane = lane;
        keys[n].ts = e->ts;
        keys[n].end = e->ts + e->dur;
        keys[n++].event = i;
    }
    tt_sort(keys, n, sizeof *keys, tt_compare_time);
    for (r = 0; r < t->nranks; r++) {
        double y = TT_SVG_TOP + r * TT_SVG_BAND;
        fprintf(g->f, "<g id=\"rank-%d\">\n<text x=\"6\" y=\"%.0f\" font-weight=\"bold\">rank %d</text>\n", t->ranks[r].rank,
                y + 12, t->ranks[r].rank);
        fprintf(g->f, "<text x=\"6\" y=\"%.0f\" font-size=\"9\" fill=\"#616161\">comm, bg</text>\n", y + 27);
        while (k < n && keys[k].rank < t->ranks[r].rank) k++;
        while (k < n && keys[k].rank == t->ranks[r].rank) {
            size_t lo = k;
            int lane = keys[k].lane;
            while (k < n && keys[k].rank == t->ranks[r].rank && keys[k].lane == lane) k++;
            tt_svg_lane(g, t, keys, lo, k, y + lane_y[lane], lane_h[lane]);
        }
        fputs("</g>\n", g->f);
    }
    free(keys);
}

/* A tick every 1, 2 or 5 times a power of ten ms, about eight across; labelled in ms since
   rank 0's fsdp_init. */
static void tt_svg_axis(tt_svg *g, double bottom, double right) {
    double raw = (g->t1 - g->t0) / 1000 / 8, power = pow(10, floor(log10(raw))), step, first;
    int decimals, k;
    step = raw <= power ? power : raw <= 2 * power ? 2 * power : raw <= 5 * power ? 5 * power : 10 * power;
    decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    first = ceil(g->t0 / 1000 / step) * step;
    fprintf(g->f, "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#424242\" stroke-width=\"1\"/>\n", g->left, bottom,
            right, bottom);
    for (k = 0; k < 100 && (first + k * step) * 1000 <= g->t1 + 1e-9; k++) { /* bounded: rounding at huge times */
        double ms = first + k * step, x = tt_svg_x(g, ms * 1000);
        fprintf(g->f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#e0e0e0\" stroke-width=\"0.5\"/>\n", x,
                TT_SVG_TOP - 4, x, bottom);
        fprintf(g->f, "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#424242\" stroke-width=\"1\"/>\n", x, bottom,
                x, bottom + 4);
        fprintf(g->f, "<text x=\"%.2f\" y=\"%.0f\" text-anchor=\"middle\">%.*f ms</text>\n", x, bottom + 16, decimals, ms);
    }
}

/* A line and a label at the start of each step drawn; of every stride-th step when they would
   be closer than 60 px. */
static void tt_svg_step_lines(tt_svg *g, const tt_step_extent *steps, size_t nsteps, const tt_svg_result *res, double bottom) {
    size_t i, drawn = 0, stride;
    for (i = 0; i < nsteps; i++) drawn += steps[i].step >= res->first_step && steps[i].step <= res->last_step;
    stride = drawn ? (size_t)ceil(60 / ((g->t1 - g->t0) * g->px_per_us / (double)drawn)) : 1;
    drawn = 0;
    for (i = 0; i < nsteps; i++) {
        double x;
        if (steps[i].step < res->first_step || steps[i].step > res->last_step || drawn++ % (stride ? stride : 1)) continue;
        x = tt_svg_x(g, steps[i].rank0_start);
        fprintf(g->f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#212121\" stroke-width=\"0.6\"/>\n", x,
                TT_SVG_TOP - 16, x, bottom);
        if (x + 60 < g->left + (g->t1 - g->t0) * g->px_per_us + TT_SVG_RIGHT) /* no label cut at the right edge */
            fprintf(g->f, "<text x=\"%.2f\" y=\"%d\">step %lld</text>\n", x + 3, TT_SVG_TOP - 7, steps[i].step);
    }
}

/* The legend's rows of swatches; returns its height. */
static double tt_svg_legend(tt_svg *g, double y, int width, int draw) {
    const tt_style *s;
    double x = TT_SVG_LEFT, row = 0;
    if (draw) fputs("<g id=\"legend\">\n", g->f);
    for (s = tt_styles; s->cat; s++) {
        double w;
        if (!s->label) continue;
        w = 18 + 6.2 * (double)strlen(s->label) + 14;
        if (x + w > width && x > TT_SVG_LEFT) { x = TT_SVG_LEFT; row += 16; }
        if (draw) {
            fprintf(g->f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"10\" fill=\"%s\"/>\n", x, y + row, s->colour);
            fprintf(g->f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 16, y + row + 9, s->label);
            g->rects++;
        }
        x += w;
    }
    if (draw) fputs("</g>\n", g->f);
    return row + 16;
}

/* Writes the timeline picture of `t` to f (see `trace_tool svg --help`). Returns 0, or -1 with
   err (no such steps, nothing to draw). */
TT_API int tt_write_svg(FILE *f, const tt_trace *t, const tt_svg_options *opt, tt_svg_result *res, char *err, size_t err_size) {
    tt_svg_options o = *opt;
    size_t nsteps;
    tt_step_extent *steps;
    tt_svg g;
    double bottom, legend_h;
    int height;
    memset(res, 0, sizeof *res);
    if (!o.width) o.width = 1200;
    if (!t->nranks) { tt_error(err, err_size, "%s: no ranks", tt_shown(t->source)); return -1; }
    steps = tt_step_extents(t, &nsteps);
    if (tt_svg_view(t, &o, steps, nsteps, res, err, err_size) != 0) { free(steps); return -1; }
    memset(&g, 0, sizeof g);
    g.f = f;
    g.t0 = res->t0_us;
    g.t1 = res->t1_us;
    g.left = TT_SVG_LEFT;
    g.px_per_us = (o.width - TT_SVG_LEFT - TT_SVG_RIGHT) / (g.t1 - g.t0);
    bottom = TT_SVG_TOP + t->nranks * TT_SVG_BAND;
    legend_h = tt_svg_legend(&g, 0, o.width, 0);
    height = (int)(bottom + 30 + legend_h + 8);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n<title>fsdp.h trace</title>\n",
            o.width, height, o.width, height);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", o.width, height);
    g.rects++;
    fprintf(f, "<text x=\"6\" y=\"14\" font-weight=\"bold\">");
    tt_xml_text(f, o.title ? o.title : tt_shown(t->source));
    if (res->first_step) fprintf(f, ": steps %lld-%lld, %d ranks</text>\n", res->first_step, res->last_step, t->nranks);
    else fprintf(f, ": %d ranks</text>\n", t->nranks);
    tt_svg_axis(&g, bottom, o.width - TT_SVG_RIGHT);
    tt_svg_bands(&g, t);
    tt_svg_step_lines(&g, steps, nsteps, res, bottom);
    tt_svg_legend(&g, bottom + 26, o.width, 1);
    fputs("</svg>\n", f);
    res->rects = g.rects;
    free(steps);
    return ferror(f) ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------------
   merge: every rank in one Chrome trace
   --------------------------------------------------------------------------------------------- */
/* Writes one trace of every rank: each event's JSON as its file had it, by rank (pid = rank),
   and otherData {"format","version","merged","world","truncated_ranks","ranks":[each rank's
   otherData]}, the keys in the order Perfetto's reader needs (otherData, traceEvents, then
   displayTimeUnit: it stops at a key it does not know). An event whose pid is not its file's
   rank cannot be placed and is left out, counted in *left_out. */
TT_API int tt_write_merged(FILE *f, const tt_trace *t, size_t *written, size_t *left_out) {
    size_t *order = (size_t *)malloc((t->n ? t->n : 1) * sizeof *order), *start, i;
    int r, first = 1;
    if (!order || !(start = (size_t *)calloc((size_t)t->nranks + 2, sizeof *start))) tt_out_of_memory();
    *written = *left_out = 0;
    for (i = 0; i < t->n; i++) { /* counting sort by rank: each rank's events stay in file order */
        const tt_event *e = &t->ev[i];
        int index = e->rank >= 0 && (e->present & TT_HAS_PID) && e->pid == e->rank ? tt_rank_index(t, e->rank) : -1;
        if (index < 0) (*left_out)++;
        else start[index + 2]++;
    }
    for (r = 0; r < t->nranks; r++) start[r + 2] += start[r + 1];
    for (i = 0; i < t->n; i++) {
        const tt_event *e = &t->ev[i];
        int index = e->rank >= 0 && (e->present & TT_HAS_PID) && e->pid == e->rank ? tt_rank_index(t, e->rank) : -1;
        if (index >= 0) order[start[index + 1]++] = i;
    }
    fprintf(f, "{\"otherData\":{\"format\":\"fsdp.h-trace\",\"version\":1,\"merged\":1,\"world\":%d,\"truncated_ranks\":[",
            t->world);
    for (r = 0; r < t->nranks; r++)
        if (t->ranks[r].truncated) { fprintf(f, "%s%d", first ? "" : ",", t->ranks[r].rank); first = 0; }
    fputs("],\"ranks\":[", f);
    for (r = 0; r < t->nranks; r++) {
        const tt_rank *k = &t->ranks[r];
        fputs(r ? ",\n" : "\n", f);
        fwrite(t->files[k->file].text + k->other_offset, 1, k->other_length, f);
    }
    fputs("]},\n\"traceEvents\":[\n", f);
    for (i = 0; i < t->n - *left_out; i++) {
        const tt_event *e = &t->ev[order[i]];
        fwrite(t->files[e->file].text + e->offset, 1, e->length, f);
        fputs(i + 1 < t->n - *left_out ? ",\n" : "\n", f);
    }
    fputs("],\"displayTimeUnit\":\"ms\"}\n", f);
    *written = t->n - *left_out;
    free(order);
    free(start);
    return ferror(f) ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------------
   output files: written to a temporary name, fsynced, renamed
   --------------------------------------------------------------------------------------------- */
typedef struct tt_output {
    FILE *f;
    char path[4096], temp[4200];
} tt_output;

/* The temporary file is created exclusively: a file or symbolic link planted under its name is
   removed (the link itself, never its target) rather than written through. */
static int tt_output_open(tt_output *o, const char *path, char *err, size_t err_size) {
    int fd;
    memset(o, 0, sizeof *o);
    if (strlen(path) >= sizeof o->path) { tt_error(err, err_size, "%s: path too long", tt_shown(path)); return -1; }
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->temp, sizeof o->temp, "%s.tmp-%ld", path, (long)getpid());
    fd = open(o->temp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd < 0 && errno == EEXIST && unlink(o->temp) == 0) fd = open(o->temp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
        tt_error(err, err_size, "cannot create %s: %s", tt_shown(o->temp), strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return 0;
}

static void tt_output_abort(tt_output *o) {
    if (o->f) fclose(o->f);
    unlink(o->temp);
    o->f = NULL;
}

/* The temporary file synced and renamed over path; its directory synced, so the new name
   survives a crash too. */
static int tt_output_commit(tt_output *o, char *err, size_t err_size) {
    char dir[4096];
    const char *slash = strrchr(o->path, '/');
    int fd, failed = ferror(o->f) || fflush(o->f) != 0 || fsync(fileno(o->f)) != 0;
    failed |= fclose(o->f) != 0;
    o->f = NULL;
    if (failed || rename(o->temp, o->path) != 0) {
        tt_error(err, err_size, "writing %s failed: %s", tt_shown(o->path), strerror(errno));
        unlink(o->temp);
        return -1;
    }
    if (slash) snprintf(dir, sizeof dir, "%.*s", slash == o->path ? 1 : (int)(slash - o->path), o->path);
    else snprintf(dir, sizeof dir, ".");
    if ((fd = open(dir, O_RDONLY)) >= 0) {
        fsync(fd);
        close(fd);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   commands
   --------------------------------------------------------------------------------------------- */
static const char tt_main_help[] =
    "usage: trace_tool COMMAND ...   (trace_tool COMMAND --help for each)\n"
    "  summary DIR|FILE [--top N]                        where each step's time went; stragglers\n"
    "  svg DIR|FILE OUT.svg [--steps A-B] [--width PX] [--title TEXT]   a timeline picture of a few steps\n"
    "  merge DIR OUT.json                                every rank in one file for Perfetto\n"
    "  check DIR|FILE                                    the files against the trace format\n"
    "DIR is the directory FSDP_TRACE named (trace-rank*.json); FILE one of its files or a merged one.\n";

static const char tt_summary_help[] =
    "usage: trace_tool summary DIR|FILE [--top N]\n"
    "  Per step and rank: step, compute, in fsdp, exposed comm and other wait (ms); the slowest rank\n"
    "  of each step; per rank, how often it arrived last at a collective and how late (top stragglers);\n"
    "  the N collectives (default 5) with the largest spread between first and last arrival; each\n"
    "  rank's clock error bound. The columns are explained at the top of examples/trace_tool.c.\n"
    "  --top N   how many collectives the spread table lists (0..1000000)\n";

static const char tt_svg_help[] =
    "usage: trace_tool svg DIR|FILE OUT.svg [--steps A-B] [--width PX] [--title TEXT]\n"
    "  A timeline picture (SVG 1.1: GitHub shows it in a README or an issue): time across, one band\n"
    "  per rank with the compute thread on top and collectives below (a thin strip under them: the\n"
    "  optimizer's step thread, offload I/O, async checkpoint writes). Green: compute outside fsdp.h;\n"
    "  grey hooks; red waits for comm, orange other waits; purple the optimizer step; blue all_gather;\n"
    "  teal reduce_scatter and all_reduce; brown checkpoints. Hover a rect for its name and duration.\n"
    "  --steps A-B   the steps to draw (or one: --steps A); default the last two every rank completed\n"
    "  --width PX    the picture's width (200..20000, default 1200)\n"
    "  --title TEXT  the heading (default the trace's path), followed by the steps and ranks drawn\n";

static const char tt_merge_help[] =
    "usage: trace_tool merge DIR OUT.json\n"
    "  One Chrome trace of every rank (pid = rank, metadata events kept, each rank's otherData in\n"
    "  otherData.ranks), for ui.perfetto.dev or chrome://tracing. The other commands read it too.\n";

static const char tt_check_help[] =
    "usage: trace_tool check DIR|FILE\n"
    "  Checks trace files against the format fsdp.h writes: the JSON, otherData (format fsdp.h-trace,\n"
    "  version 1), every rank of the world present once, each event's fields (ts and dur numbers >= 0,\n"
    "  pid the file's rank, tid 0..5, name and cat; collectives with op, bytes, group and seq), and\n"
    "  that the events of each thread nest. Prints 'ok: R ranks, E events, S steps' and exits 0, or\n"
    "  prints the first problem and exits 1. A file cut off at the end (its rank died) is a warning.\n";

static int tt_usage(FILE *errs, const char *command, const char *fmt, ...) {
    va_list ap;
    fprintf(errs, "trace_tool: ");
    va_start(ap, fmt);
    vfprintf(errs, fmt, ap);
    va_end(ap);
    fprintf(errs, " (see trace_tool %s --help)\n", command);
    return 2;
}

static int tt_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

/* A whole number in [least, most]. */
static int tt_parse_count(const char *text, long least, long most, long *value) {
    char *end = NULL;
    errno = 0;
    *value = strtol(text, &end, 10);
    return errno == 0 && end != text && *end == 0 && *value >= least && *value <= most;
}

/* The trace at path, with its warnings printed; 0, or 1 with the reason printed. */
static int tt_load_reporting(const char *path, tt_trace *t, FILE *errs) {
    char err[1200];
    tt_check_result res;
    if (tt_load(path, t, err, sizeof err) != 0) {
        fprintf(errs, "trace_tool: %s\n", err);
        return 1;
    }
    tt_print_warnings(errs, t);
    if (tt_check(t, &res, err, sizeof err) != 0) fprintf(errs, "trace_tool: warning: %s (see trace_tool check)\n", err);
    return 0;
}

/* A command's `positional` arguments into args and its options' values (values[k]: the value of
   option names[k], a NULL-terminated list); 0, or 2 with the usage error printed. */
static int tt_parse_args(int argc, char **argv, FILE *errs, int positional, const char **args, const char *const *names,
                         const char **values) {
    int i, got = 0, k;
    for (i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) {
            for (k = 0; names[k] && strcmp(names[k], argv[i]) != 0; k++) continue;
            if (!names[k]) return tt_usage(errs, argv[0], "unknown option '%s'", tt_shown(argv[i]));
            if (i + 1 >= argc) return tt_usage(errs, argv[0], "%s needs a value", names[k]);
            values[k] = argv[++i];
        } else if (got < positional) {
            args[got++] = argv[i];
        } else {
            return tt_usage(errs, argv[0], "too many arguments");
        }
    }
    if (got < positional) return tt_usage(errs, argv[0], "missing %s", got == 0 ? "the trace (DIR or FILE)" : "the output file");
    return 0;
}

static int tt_wants_help(int argc, char **argv, FILE *out, const char *help) {
    int i;
    for (i = 1; i < argc; i++)
        if (tt_is_help(argv[i])) { fputs(help, out); return 1; }
    return 0;
}

static int tt_cmd_summary(int argc, char **argv, FILE *out, FILE *errs) {
    static const char *const names[] = {"--top", NULL};
    const char *args[1], *values[1] = {NULL};
    long top = 5;
    tt_trace t;
    tt_summary s;
    int rc;
    if (tt_wants_help(argc, argv, out, tt_summary_help)) return 0;
    if ((rc = tt_parse_args(argc, argv, errs, 1, args, names, values)) != 0) return rc;
    if (values[0] && !tt_parse_count(values[0], 0, 1000000, &top))
        return tt_usage(errs, "summary", "--top takes a number from 0 to 1000000 (got '%s')", tt_shown(values[0]));
    if (tt_load_reporting(args[0], &t, errs) != 0) return 1;
    tt_summarize(&t, &s);
    tt_print_summary(out, &t, &s, (size_t)top);
    tt_summary_free(&s);
    tt_free(&t);
    return 0;
}

/* "A-B" or "A": steps from 1. */
static int tt_parse_steps(const char *text, long long *first, long long *last) {
    char *end = NULL;
    errno = 0;
    *first = strtoll(text, &end, 10);
    if (errno || end == text || *first < 1) return 0;
    if (*end == 0) { *last = *first; return 1; }
    if (*end != '-') return 0;
    text = end + 1;
    *last = strtoll(text, &end, 10);
    return !errno && end != text && *end == 0 && *last >= *first;
}

static int tt_cmd_svg(int argc, char **argv, FILE *out, FILE *errs) {
    static const char *const names[] = {"--steps", "--width", "--title", NULL};
    const char *args[2], *values[3] = {NULL, NULL, NULL};
    tt_svg_options opt;
    tt_svg_result res;
    tt_output o;
    tt_trace t;
    long width = 1200;
    char err[1200] = "";
    int rc;
    if (tt_wants_help(argc, argv, out, tt_svg_help)) return 0;
    if ((rc = tt_parse_args(argc, argv, errs, 2, args, names, values)) != 0) return rc;
    memset(&opt, 0, sizeof opt);
    if (values[0] && !tt_parse_steps(values[0], &opt.first_step, &opt.last_step))
        return tt_usage(errs, "svg", "--steps takes A-B or A, steps from 1 (got '%s')", tt_shown(values[0]));
    if (values[1] && !tt_parse_count(values[1], 200, 20000, &width))
        return tt_usage(errs, "svg", "--width takes pixels from 200 to 20000 (got '%s')", tt_shown(values[1]));
    opt.width = (int)width;
    opt.title = values[2];
    if (tt_load_reporting(args[0], &t, errs) != 0) return 1;
    rc = tt_output_open(&o, args[1], err, sizeof err);
    if (rc == 0 && tt_write_svg(o.f, &t, &opt, &res, err, sizeof err) != 0) {
        if (!err[0]) snprintf(err, sizeof err, "writing %s failed", tt_shown(args[1]));
        tt_output_abort(&o);
        rc = -1;
    }
    if (rc == 0) rc = tt_output_commit(&o, err, sizeof err);
    if (rc == 0 && res.first_step)
        fprintf(out, "%s: steps %lld-%lld of %d ranks, %.3f ms, %lu rects\n", tt_shown(args[1]), res.first_step, res.last_step,
                t.nranks, (res.t1_us - res.t0_us) / 1000, (unsigned long)res.rects);
    else if (rc == 0)
        fprintf(out, "%s: %d ranks, %.3f ms (no steps in the trace), %lu rects\n", tt_shown(args[1]), t.nranks,
                (res.t1_us - res.t0_us) / 1000, (unsigned long)res.rects);
    else
        fprintf(errs, "trace_tool: %s\n", err);
    tt_free(&t);
    return rc == 0 ? 0 : 1;
}

static int tt_cmd_merge(int argc, char **argv, FILE *out, FILE *errs) {
    static const char *const names[] = {NULL};
    const char *args[2];
    tt_output o;
    tt_trace t;
    size_t written = 0, left_out = 0;
    char err[1200] = "";
    int rc;
    if (tt_wants_help(argc, argv, out, tt_merge_help)) return 0;
    if ((rc = tt_parse_args(argc, argv, errs, 2, args, names, NULL)) != 0) return rc;
    if (tt_load_reporting(args[0], &t, errs) != 0) return 1;
    rc = tt_output_open(&o, args[1], err, sizeof err);
    if (rc == 0 && tt_write_merged(o.f, &t, &written, &left_out) != 0) {
        snprintf(err, sizeof err, "writing %s failed", tt_shown(args[1]));
        tt_output_abort(&o);
        rc = -1;
    }
    if (rc == 0) rc = tt_output_commit(&o, err, sizeof err);
    if (rc == 0) {
        if (left_out)
            fprintf(errs, "trace_tool: warning: %lu events whose pid is not their file's rank were left out\n",
                    (unsigned long)left_out);
        fprintf(out, "%s: %d ranks, %lu events\n", tt_shown(args[1]), t.nranks, (unsigned long)written);
    } else {
        fprintf(errs, "trace_tool: %s\n", err);
    }
    tt_free(&t);
    return rc == 0 ? 0 : 1;
}

static int tt_cmd_check(int argc, char **argv, FILE *out, FILE *errs) {
    static const char *const names[] = {NULL};
    const char *args[1];
    tt_check_result res;
    tt_trace t;
    char err[1200];
    int rc;
    if (tt_wants_help(argc, argv, out, tt_check_help)) return 0;
    if ((rc = tt_parse_args(argc, argv, errs, 1, args, names, NULL)) != 0) return rc;
    if (tt_load(args[0], &t, err, sizeof err) != 0) {
        fprintf(errs, "trace_tool: %s\n", err);
        return 1;
    }
    tt_print_warnings(errs, &t);
    if ((rc = tt_check(&t, &res, err, sizeof err)) == 0)
        fprintf(out, "ok: %d ranks, %lu events, %lu steps\n", res.ranks, (unsigned long)res.events, (unsigned long)res.steps);
    else
        fprintf(errs, "trace_tool: %s\n", err);
    tt_free(&t);
    return rc == 0 ? 0 : 1;
}

/* The whole command line, as main runs it, with the output and messages going to out and errs.
   Returns the exit status: 0 done, 1 bad input or a failed write, 2 a usage error. */
TT_API int tt_run(int argc, char **argv, FILE *out, FILE *errs) {
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv, FILE *out, FILE *errs);
    } commands[] = {{"summary", tt_cmd_summary}, {"svg", tt_cmd_svg}, {"merge", tt_cmd_merge}, {"check", tt_cmd_check}};
    size_t k;
    if (argc < 2) {
        fputs(tt_main_help, errs);
        return 2;
    }
    if (tt_is_help(argv[1]) || strcmp(argv[1], "help") == 0) {
        fputs(tt_main_help, out);
        return 0;
    }
    for (k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (strcmp(argv[1], commands[k].name) == 0) return commands[k].run(argc - 1, argv + 1, out, errs);
    fprintf(errs, "trace_tool: unknown command '%s'\n%s", tt_shown(argv[1]), tt_main_help);
    return 2;
}

#ifndef TRACE_TOOL_NO_MAIN
int main(int argc, char **argv) { return tt_run(argc, argv, stdout, stderr); }
#endif
