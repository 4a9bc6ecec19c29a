/* test_trace_tool.c - specification of examples/trace_tool.c, the reader of fsdp.h's trace files
   (format "fsdp.h-trace" version 1: per-rank Chrome trace-event JSON, DIR/trace-rankNNNNN.json).

   Every test writes the traces it reads into its own directory under /tmp (mkdtemp in setUp,
   removed in tearDown). The standard trace (write_two_rank_trace) has 2 ranks and 2 steps whose
   every number is known:
     step 1, both ranks: iteration [1000, 21000) us; pre_forward hook [1000, 3000) holding a wait
       for comm [1500, 2500); post_backward hook [15000, 16000); a wait for step [17000, 17500);
       the optimizer step [19000, 21000). So: step 20 ms, in fsdp 5.5, compute 14.5, exposed
       comm 1.0, other wait 0.5. Collectives on tid 1: all_gather seq 1 starts at 1100 on rank 0
       and 3 ms later on rank 1; reduce_scatter seq 2 starts at 15200 on rank 1 and 1 ms later
       on rank 0.
     step 2: rank 0 [21000, 41000), rank 1 [21000, 43000) (its optimizer step ends 2 ms later);
       all_gather seq 3 runs on rank 0's compute thread inside its wait at 21600, on rank 1's comm
       thread 2 ms later; reduce_scatter seq 4 starts at 35200 on both.
     rank 1's clock_error_us is 50, rank 0's 0: seq 4's spread of 0 is below the bound.
   Each rank's file has 4 metadata events and 15 complete ones.

   The tool is included whole (it has no fsdp.h dependency); its command lines run through
   tt_run, the function main calls, with the output captured in temporary files.

   Build: gcc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -Iexamples -Itests/unity \
              tests/test_trace_tool.c tests/unity/unity.c -o /tmp/test_trace_tool -lm
   (the include below names the tool by its path from this file, so the Makefile's rule for
   tests/test_*.c, which passes -I. and not -Iexamples, builds it as well) */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#define TRACE_TOOL_NO_MAIN
#include "../examples/trace_tool.c"
#include "unity.h"

#include <ftw.h>
#include <sys/types.h>

#define EVENTS_PER_RANK 19 /* 4 metadata + 15 complete */

static char dir[256];

/* ---------------------------------------------------------------------------------------------
   the test directory
   --------------------------------------------------------------------------------------------- */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void setUp(void) {
    snprintf(dir, sizeof dir, "/tmp/fsdp-test-trace-tool-XXXXXX");
    TEST_ASSERT_NOT_NULL_MESSAGE(mkdtemp(dir), "mkdtemp under /tmp");
}

void tearDown(void) {
    if (dir[0]) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    dir[0] = 0;
}

static void path_in_dir(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", dir, name); }

/* ---------------------------------------------------------------------------------------------
   writing traces as fsdp.h does: a header, one event per line, the closing line
   --------------------------------------------------------------------------------------------- */
typedef struct rank_file {
    FILE *f;
    char path[400];
    int rank, events;
    long last_event_at; /* offset of the last event's separator */
} rank_file;

static void open_rank_as(rank_file *rf, const char *file_name, int rank, int world, double error_us, const char *format) {
    memset(rf, 0, sizeof *rf);
    rf->rank = rank;
    path_in_dir(rf->path, sizeof rf->path, file_name);
    rf->f = fopen(rf->path, "w");
    TEST_ASSERT_NOT_NULL(rf->f);
    fprintf(rf->f,
            "{\"otherData\":{\"format\":\"%s\",\"version\":1,\"rank\":%d,\"world\":%d,\"host\":\"node%d\","
            "\"clock\":\"CLOCK_MONOTONIC, microseconds since rank 0's fsdp_init, aligned to rank 0\","
            "\"clock_offset_us\":%.3f,\"clock_error_us\":%.3f,\"units\":[\"(root)\",\"h.0\"]},\n\"traceEvents\":[\n",
            format, rank, world, rank, rank ? -12.5 : 0.0, error_us);
}

static void add_line(rank_file *rf, const char *line) {
    rf->last_event_at = ftell(rf->f);
    fprintf(rf->f, "%s%s", rf->events++ ? ",\n" : "", line);
}

static void add_metadata(rank_file *rf) {
    char line[300];
    snprintf(line, sizeof line, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}}",
             rf->rank, rf->rank);
    add_line(rf, line);
    snprintf(line, sizeof line, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
             rf->rank, rf->rank);
    add_line(rf, line);
    snprintf(line, sizeof line, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":\"compute\"}}", rf->rank);
    add_line(rf, line);
    snprintf(line, sizeof line, "{\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"comm\"}}", rf->rank);
    add_line(rf, line);
}

static void open_rank(rank_file *rf, int rank, int world, double error_us) {
    char name[64];
    snprintf(name, sizeof name, "trace-rank%05d.json", rank);
    open_rank_as(rf, name, rank, world, error_us, "fsdp.h-trace");
    add_metadata(rf);
}

/* A complete event of this rank; args is the inside of its args object. */
static void add_event(rank_file *rf, int tid, const char *cat, const char *name, double ts, double dur, const char *args) {
    char line[600];
    snprintf(line, sizeof line, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"args\":{%s}}",
             rf->rank, tid, cat, name, ts, dur, args);
    add_line(rf, line);
}

static void add_comm(rank_file *rf, int tid, const char *op, long long seq, double ts, double dur) {
    char name[64], args[200];
    snprintf(name, sizeof name, "%s h.0", op);
    snprintf(args, sizeof args, "\"op\":\"%s\",\"bytes\":4096,\"unit\":\"h.0\",\"group\":\"world\",\"seq\":%lld,\"issued_us\":%.3f",
             op, seq, ts - 50);
    add_event(rf, tid, "comm", name, ts, dur, args);
}

static void close_rank(rank_file *rf) {
    fputs("\n],\"displayTimeUnit\":\"ms\"}\n", rf->f);
    TEST_ASSERT_EQUAL_INT(0, fclose(rf->f));
}

/* The file left as a rank that dies while writing its last event leaves it: cut in its middle. */
static void close_rank_cut_in_last_event(rank_file *rf) {
    long end;
    fflush(rf->f);
    end = ftell(rf->f);
    TEST_ASSERT_EQUAL_INT(0, fclose(rf->f));
    TEST_ASSERT_EQUAL_INT(0, truncate(rf->path, rf->last_event_at + (end - rf->last_event_at) / 2));
}

/* One rank of the standard trace (see the top of this file), in the order events end. */
static void write_standard_rank(rank_file *rf, int rank) {
    double step2_end = rank ? 43000 : 41000;
    add_event(rf, 0, "wait", "wait all_gather h.0", 1500, 1000, "\"for\":\"comm\",\"unit\":\"h.0\"");
    add_comm(rf, 1, "all_gather", 1, rank ? 4100 : 1100, 300);
    add_event(rf, 0, "hook", "pre_forward h.0", 1000, 2000, "\"unit\":\"h.0\"");
    add_comm(rf, 1, "reduce_scatter", 2, rank ? 15200 : 16200, 300);
    add_event(rf, 0, "hook", "post_backward h.0", 15000, 1000, "\"unit\":\"h.0\"");
    add_event(rf, 0, "wait", "wait step", 17000, 500, "\"for\":\"step\"");
    add_event(rf, 0, "step", "optimizer step", 19000, 2000, "\"step\":1");
    add_event(rf, 0, "iteration", "step 1", 1000, 20000, "\"step\":1");
    if (rank == 0) add_comm(rf, 0, "all_gather", 3, 21600, 800);
    else add_comm(rf, 1, "all_gather", 3, 23600, 800);
    add_event(rf, 0, "wait", "wait all_gather h.0", 21500, 1000, "\"for\":\"comm\",\"unit\":\"h.0\"");
    add_event(rf, 0, "hook", "pre_forward h.0", 21000, 2000, "\"unit\":\"h.0\"");
    add_comm(rf, 1, "reduce_scatter", 4, 35200, 300);
    add_event(rf, 0, "hook", "post_backward h.0", 35000, 1000, "\"unit\":\"h.0\"");
    add_event(rf, 0, "step", "optimizer step", step2_end - 2000, 2000, "\"step\":2");
    add_event(rf, 0, "iteration", "step 2", 21000, step2_end - 21000, "\"step\":2");
}

/* The standard trace in dir; rank 1's file cut in its last event when cut_rank1 is set. */
static void write_two_rank_trace(int cut_rank1) {
    rank_file rf;
    int rank;
    for (rank = 0; rank < 2; rank++) {
        open_rank(&rf, rank, 2, rank ? 50.0 : 0.0);
        write_standard_rank(&rf, rank);
        if (rank == 1 && cut_rank1) close_rank_cut_in_last_event(&rf);
        else close_rank(&rf);
    }
}

/* A rank file of world 1 whose traceEvents hold the metadata, then `event` (a line of JSON). */
static void write_rank0_with(const char *event) {
    rank_file rf;
    open_rank(&rf, 0, 1, 0);
    add_line(&rf, event);
    close_rank(&rf);
}

/* A long trace: `steps` steps of 1 ms per rank, each with 8 hooks holding a wait for comm,
   8 collectives and the optimizer step (26 complete events). */
static size_t write_long_trace(int ranks, int steps) {
    rank_file rf;
    int rank, s, k;
    size_t events = 0;
    for (rank = 0; rank < ranks; rank++) {
        open_rank(&rf, rank, ranks, 0);
        for (s = 0; s < steps; s++) {
            double t0 = 1000.0 * (s + 1);
            char args[40];
            for (k = 0; k < 8; k++) {
                add_event(&rf, 0, "hook", "pre_forward h.0", t0 + 100 * k, 60, "\"unit\":\"h.0\"");
                add_event(&rf, 0, "wait", "wait all_gather h.0", t0 + 100 * k + 20, 20, "\"for\":\"comm\"");
                add_comm(&rf, 1, k % 2 ? "reduce_scatter" : "all_gather", (long long)s * 8 + k, t0 + 100 * k + 10, 50);
            }
            snprintf(args, sizeof args, "\"step\":%d", s + 1);
            add_event(&rf, 0, "step", "optimizer step", t0 + 900, 50, args);
            add_event(&rf, 0, "iteration", "step", t0, 1000, args);
            events += 26;
        }
        close_rank(&rf);
    }
    return events;
}

static void write_text(const char *name, const char *text) {
    char path[400];
    FILE *f;
    path_in_dir(path, sizeof path, name);
    f = fopen(path, "w");
    TEST_ASSERT_NOT_NULL(f);
    fputs(text, f);
    TEST_ASSERT_EQUAL_INT(0, fclose(f));
}

/* ---------------------------------------------------------------------------------------------
   running the tool
   --------------------------------------------------------------------------------------------- */
typedef struct tool_run {
    int status;
    char out[200000], err[20000];
} tool_run;

static tool_run run; /* the last run_tool's */

static void read_back(FILE *f, char *text, size_t size) {
    size_t n;
    rewind(f);
    n = fread(text, 1, size - 1, f);
    text[n] = 0;
    fclose(f);
}

/* tt_run("trace_tool", args..., NULL), its output and messages in run. */
static int run_tool(const char *first, ...) {
    static char words[16][400];
    char *argv[17];
    int argc = 1;
    const char *arg;
    va_list ap;
    FILE *out = tmpfile(), *errs = tmpfile();
    TEST_ASSERT_TRUE(out && errs);
    snprintf(words[0], sizeof words[0], "trace_tool");
    argv[0] = words[0];
    va_start(ap, first);
    for (arg = first; arg && argc < 16; arg = va_arg(ap, const char *)) {
        snprintf(words[argc], sizeof words[0], "%s", arg);
        argv[argc] = words[argc];
        argc++;
    }
    va_end(ap);
    argv[argc] = NULL;
    run.status = tt_run(argc, argv, out, errs);
    read_back(out, run.out, sizeof run.out);
    read_back(errs, run.err, sizeof run.err);
    return run.status;
}

static void load_ok(const char *path, tt_trace *t) {
    static char err[1200];
    int rc = tt_load(path, t, err, sizeof err);
    TEST_ASSERT_EQUAL_INT_MESSAGE(0, rc, err);
}

/* tt_load of the file `name` in dir fails; its message in err. */
static void assert_load_fails(const char *name, char *err, size_t err_size) {
    char path[400];
    tt_trace t;
    path_in_dir(path, sizeof path, name);
    TEST_ASSERT_EQUAL_INT(-1, tt_load(path, &t, err, err_size));
    TEST_ASSERT_EQUAL_INT(0, t.n); /* nothing left loaded */
}

/* tt_check of dir fails with a message containing `want`. */
static void assert_check_fails_saying(const char *want) {
    static char message[1600];
    TEST_ASSERT_EQUAL_INT(1, run_tool("check", dir, NULL));
    snprintf(message, sizeof message, "stderr: %.1500s", run.err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.err, want), message);
}

static size_t count_of(const char *text, const char *needle) {
    const char *at;
    size_t n = 0;
    for (at = strstr(text, needle); at; at = strstr(at + 1, needle)) n++;
    return n;
}

/* The file's bytes, NUL-terminated (free them). */
static char *read_whole(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    char *bytes;
    long length;
    TEST_ASSERT_NOT_NULL(f);
    TEST_ASSERT_EQUAL_INT(0, fseek(f, 0, SEEK_END));
    length = ftell(f);
    rewind(f);
    bytes = (char *)malloc((size_t)length + 1);
    TEST_ASSERT_NOT_NULL(bytes);
    *size = fread(bytes, 1, (size_t)length, f);
    bytes[*size] = 0;
    fclose(f);
    return bytes;
}

/* 1 if text is well-formed XML as an SVG writer makes it: tags closed in order, one root,
   quoted attributes, only the five predefined entities, no control characters. */
static int well_formed_xml(const char *text, char *why, size_t why_size) {
    char stack[64][32];
    int depth = 0, roots = 0;
    const char *s = text;
    while (*s) {
        if ((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t' && *s != '\r') { snprintf(why, why_size, "control byte at %ld", (long)(s - text)); return 0; }
        if (*s == '&') {
            if (strncmp(s, "&amp;", 5) && strncmp(s, "&lt;", 4) && strncmp(s, "&gt;", 4) && strncmp(s, "&quot;", 6) && strncmp(s, "&apos;", 6)) {
                snprintf(why, why_size, "bad entity at %ld", (long)(s - text));
                return 0;
            }
            s++;
        } else if (*s == '<' && s[1] == '/') {
            size_t n = strcspn(s + 2, ">");
            if (depth == 0 || strlen(stack[depth - 1]) != n || strncmp(stack[depth - 1], s + 2, n) != 0) {
                snprintf(why, why_size, "unmatched end tag at %ld", (long)(s - text));
                return 0;
            }
            depth--;
            s += 2 + n + (s[2 + n] == '>');
        } else if (*s == '<') {
            size_t n = strspn(s + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:");
            if (n == 0 || n >= sizeof stack[0] || depth >= 64) { snprintf(why, why_size, "bad tag at %ld", (long)(s - text)); return 0; }
            if (depth == 0 && roots++) { snprintf(why, why_size, "a second root at %ld", (long)(s - text)); return 0; }
            memcpy(stack[depth], s + 1, n);
            stack[depth][n] = 0;
            s += 1 + n;
            for (;;) { /* attributes */
                s += strspn(s, " \n\t");
                if (s[0] == '/' && s[1] == '>') { s += 2; break; }
                if (s[0] == '>') { s++; depth++; break; }
                n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:");
                if (n == 0 || s[n] != '=' || s[n + 1] != '"') { snprintf(why, why_size, "bad attribute at %ld", (long)(s - text)); return 0; }
                s += n + 2;
                n = strcspn(s, "\"<");
                if (s[n] != '"') { snprintf(why, why_size, "unterminated attribute at %ld", (long)(s - text)); return 0; }
                s += n + 1;
            }
        } else {
            s++;
        }
    }
    if (depth != 0 || roots != 1) { snprintf(why, why_size, "%d tags left open, %d roots", depth, roots); return 0; }
    return 1;
}

/* ---------------------------------------------------------------------------------------------
   loading
   --------------------------------------------------------------------------------------------- */
static void test_load_of_a_two_rank_dir_reads_every_event_and_both_ranks(void) {
    tt_trace t;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    TEST_ASSERT_EQUAL_INT(2, t.nranks);
    TEST_ASSERT_EQUAL_INT(2, t.world);
    TEST_ASSERT_EQUAL_size_t(2 * EVENTS_PER_RANK, t.n);
    TEST_ASSERT_EQUAL_INT(1, t.ranks[1].rank);
    TEST_ASSERT_EQUAL_STRING("node1", t.ranks[1].host);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 50.0f, (float)t.ranks[1].clock_error_us);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, -12.5f, (float)t.ranks[1].clock_offset_us);
    TEST_ASSERT_FALSE(t.ranks[0].truncated || t.ranks[1].truncated);
    tt_free(&t);
}

static void test_load_of_one_rank_file_reads_that_rank_only(void) {
    tt_trace t;
    char path[400];
    write_two_rank_trace(0);
    path_in_dir(path, sizeof path, "trace-rank00001.json");
    load_ok(path, &t);
    TEST_ASSERT_EQUAL_INT(1, t.nranks);
    TEST_ASSERT_EQUAL_INT(1, t.ranks[0].rank);
    TEST_ASSERT_EQUAL_size_t(EVENTS_PER_RANK, t.n);
    TEST_ASSERT_EQUAL_INT(1, t.ev[0].rank);
    tt_free(&t);
}

static void test_load_reads_an_events_fields_and_args(void) {
    tt_trace t;
    const tt_event *e;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    e = &t.ev[5]; /* rank 0's all_gather seq 1 */
    TEST_ASSERT_EQUAL_STRING("X", e->ph);
    TEST_ASSERT_EQUAL_STRING("comm", e->cat);
    TEST_ASSERT_EQUAL_STRING("all_gather h.0", e->name);
    TEST_ASSERT_EQUAL_STRING("all_gather", e->op);
    TEST_ASSERT_EQUAL_STRING("world", e->group);
    TEST_ASSERT_EQUAL_STRING("h.0", e->unit);
    TEST_ASSERT_EQUAL_INT(1, e->tid);
    TEST_ASSERT_EQUAL_INT(1, (int)e->seq);
    TEST_ASSERT_EQUAL_INT(4096, (int)e->bytes);
    TEST_ASSERT_FLOAT_WITHIN(1e-3, 1100.0f, (float)e->ts);
    TEST_ASSERT_FLOAT_WITHIN(1e-3, 1050.0f, (float)e->issued);
    TEST_ASSERT_EQUAL_HEX32(TT_HAS_PID | TT_HAS_TID | TT_HAS_TS | TT_HAS_DUR | TT_HAS_BYTES | TT_HAS_SEQ | TT_HAS_ISSUED, e->present);
    TEST_ASSERT_EQUAL_STRING("comm", t.ev[4].wait_for); /* the wait before it */
    tt_free(&t);
}

static void test_load_of_a_file_cut_in_its_last_event_keeps_the_others_and_warns(void) {
    tt_trace t;
    write_two_rank_trace(1);
    load_ok(dir, &t);
    TEST_ASSERT_EQUAL_size_t(2 * EVENTS_PER_RANK - 1, t.n);
    TEST_ASSERT_TRUE(t.ranks[1].truncated);
    TEST_ASSERT_TRUE(t.ranks[1].dropped_partial);
    TEST_ASSERT_EQUAL_size_t(EVENTS_PER_RANK - 1, t.ranks[1].events);
    TEST_ASSERT_FALSE(t.ranks[0].truncated);
    tt_free(&t);
    TEST_ASSERT_EQUAL_INT(0, run_tool("check", dir, NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.err, "truncated after 18 events"));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "ok: 2 ranks, 29 events, 2 steps"));
}

static void test_load_of_a_file_without_its_closing_line_keeps_every_event(void) {
    rank_file rf;
    tt_trace t;
    open_rank(&rf, 0, 1, 0);
    add_event(&rf, 0, "hook", "pre_forward h.0", 10, 5, "\"unit\":\"h.0\"");
    TEST_ASSERT_EQUAL_INT(0, fclose(rf.f));
    load_ok(dir, &t);
    TEST_ASSERT_EQUAL_size_t(5, t.n);
    TEST_ASSERT_TRUE(t.ranks[0].truncated);
    TEST_ASSERT_FALSE(t.ranks[0].dropped_partial);
    tt_free(&t);
}

static void test_load_decodes_unicode_escapes_and_surrogate_pairs(void) {
    tt_trace t;
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"pre_forward \\u00e9\\ud83d\\ude00\\n\",\"ts\":1,\"dur\":1}");
    load_ok(dir, &t);
    TEST_ASSERT_EQUAL_STRING("pre_forward \xc3\xa9\xf0\x9f\x98\x80\n", t.ev[4].name);
    tt_free(&t);
}

static void test_load_of_an_unterminated_string_in_otherData_fails_naming_file_and_byte(void) {
    char err[1200];
    write_text("trace-rank00000.json", "{\"otherData\":{\"format\":\"fsdp.h-tr");
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "trace-rank00000.json: byte 33: the file ends inside a string"), err);
}

static void test_load_of_an_unterminated_string_in_a_middle_event_fails(void) {
    char err[1200];
    rank_file rf;
    open_rank(&rf, 0, 1, 0);
    add_line(&rf, "{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"pre_forward h.0}");
    add_event(&rf, 0, "hook", "post_forward h.0", 10, 5, "");
    close_rank(&rf);
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "a raw control character (0x0a) in a string"), err);
}

static void test_load_of_10000_nested_arrays_fails_at_the_depth_bound(void) {
    static char event[30000];
    char err[1200];
    int k, n = 0;
    n += snprintf(event + n, sizeof event - n, "{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"x\",\"ts\":1,\"dur\":1,\"args\":{\"deep\":");
    for (k = 0; k < 10000; k++) event[n++] = '[';
    for (k = 0; k < 10000; k++) event[n++] = ']';
    snprintf(event + n, sizeof event - n, "}}");
    write_rank0_with(event);
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "nested deeper than 32 levels"), err);
}

static void test_load_of_a_number_beyond_double_fails(void) {
    char err[1200];
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"x\",\"ts\":1e999,\"dur\":1}");
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "a number out of range"), err);
}

static void test_load_of_a_400_digit_number_fails(void) {
    static char event[1000];
    char err[1200];
    int n = snprintf(event, sizeof event, "{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"x\",\"ts\":");
    memset(event + n, '7', 400);
    snprintf(event + n + 400, sizeof event - n - 400, ",\"dur\":1}");
    write_rank0_with(event);
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "a number longer than 64 characters"), err);
}

static void test_load_of_a_raw_control_character_in_a_string_fails(void) {
    char err[1200];
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"pre\x1b[2J\",\"ts\":1,\"dur\":1}");
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "a raw control character (0x1b) in a string"), err);
}

static void test_load_of_a_lone_surrogate_escape_fails(void) {
    char err[1200];
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"\\ud800x\",\"ts\":1,\"dur\":1}");
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "without its low half"), err);
}

static void test_load_of_a_wrong_typed_field_fails_naming_it(void) {
    char err[1200];
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"comm\",\"name\":\"x\",\"ts\":1,\"dur\":1,\"args\":{\"seq\":\"7\"}}");
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "traceEvents[4]: 'args.seq' is not an integer"), err);
}

static void test_load_of_data_after_the_trace_object_fails(void) {
    char err[1200];
    write_text("trace-rank00000.json",
               "{\"otherData\":{\"format\":\"fsdp.h-trace\",\"version\":1,\"rank\":0,\"world\":1},\"traceEvents\":[]} x");
    assert_load_fails("trace-rank00000.json", err, sizeof err);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "more data after the end"), err);
}

static void test_load_of_two_files_of_one_rank_fails(void) {
    rank_file rf;
    char err[1200];
    tt_trace t;
    open_rank(&rf, 0, 2, 0);
    close_rank(&rf);
    open_rank_as(&rf, "trace-rank00001.json", 0, 2, 0, "fsdp.h-trace");
    close_rank(&rf);
    TEST_ASSERT_EQUAL_INT(-1, tt_load(dir, &t, err, sizeof err));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "rank 0 again"), err);
}

static void test_load_of_a_fifo_fails_at_once(void) {
    char path[400], err[1200];
    tt_trace t;
    path_in_dir(path, sizeof path, "trace-rank00000.json");
    TEST_ASSERT_EQUAL_INT(0, mkfifo(path, 0600));
    TEST_ASSERT_EQUAL_INT(-1, tt_load(dir, &t, err, sizeof err));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "not a regular file"), err);
}

static void test_load_of_a_dir_without_trace_files_fails_saying_so(void) {
    char err[1200];
    tt_trace t;
    write_text("merged.json", "{}");
    TEST_ASSERT_EQUAL_INT(-1, tt_load(dir, &t, err, sizeof err));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(err, "no trace-rank*.json files"), err);
}

/* ---------------------------------------------------------------------------------------------
   summary
   --------------------------------------------------------------------------------------------- */
static const tt_step_stat *find_step(const tt_summary *s, long long step, int rank) {
    size_t i;
    for (i = 0; i < s->nsteps; i++)
        if (s->steps[i].step == step && s->steps[i].rank == rank) return &s->steps[i];
    TEST_FAIL_MESSAGE("no such step and rank in the summary");
    return NULL;
}

static void test_summary_splits_each_step_into_compute_fsdp_and_waits_as_constructed(void) {
    tt_trace t;
    tt_summary s;
    const tt_step_stat *st;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    tt_summarize(&t, &s);
    TEST_ASSERT_EQUAL_size_t(4, s.nsteps);
    st = find_step(&s, 1, 0);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 20.0f, (float)st->step_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 5.5f, (float)st->in_fsdp_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 14.5f, (float)st->compute_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 1.0f, (float)st->exposed_comm_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 0.5f, (float)st->other_wait_ms);
    st = find_step(&s, 2, 1);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 22.0f, (float)st->step_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 5.0f, (float)st->in_fsdp_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 17.0f, (float)st->compute_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 1.0f, (float)st->exposed_comm_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 0.0f, (float)st->other_wait_ms);
    tt_summary_free(&s);
    tt_free(&t);
}

static void test_summary_names_the_slowest_rank_of_each_step(void) {
    tt_trace t;
    tt_summary s;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    tt_summarize(&t, &s);
    TEST_ASSERT_EQUAL_size_t(2, s.nslowest);
    TEST_ASSERT_EQUAL_INT(2, (int)s.slowest[1].step);
    TEST_ASSERT_EQUAL_INT(1, s.slowest[1].slowest_rank);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 22.0f, (float)s.slowest[1].slowest_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 20.0f, (float)s.slowest[1].fastest_ms);
    tt_summary_free(&s);
    tt_free(&t);
}

static void test_summary_names_rank_1_arriving_3_ms_late_as_the_largest_spread(void) {
    tt_trace t;
    tt_summary s;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    tt_summarize(&t, &s);
    TEST_ASSERT_EQUAL_size_t(4, s.ncollectives);
    TEST_ASSERT_EQUAL_INT(1, (int)s.collectives[0].seq);
    TEST_ASSERT_EQUAL_STRING("all_gather", s.collectives[0].op);
    TEST_ASSERT_EQUAL_STRING("world", s.collectives[0].group);
    TEST_ASSERT_EQUAL_INT(2, s.collectives[0].ranks);
    TEST_ASSERT_EQUAL_INT(0, s.collectives[0].first_rank);
    TEST_ASSERT_EQUAL_INT(1, s.collectives[0].last_rank);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 3.0f, (float)s.collectives[0].spread_ms);
    TEST_ASSERT_EQUAL_INT(3, (int)s.collectives[1].seq); /* matched although rank 0 ran it on tid 0 */
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 2.0f, (float)s.collectives[1].spread_ms);
    tt_summary_free(&s);
    tt_free(&t);
}

static void test_summary_ranks_stragglers_by_how_often_they_arrived_last(void) {
    tt_trace t;
    tt_summary s;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    tt_summarize(&t, &s);
    TEST_ASSERT_EQUAL_size_t(2, s.nstragglers);
    TEST_ASSERT_EQUAL_INT(1, s.stragglers[0].rank);
    TEST_ASSERT_EQUAL_INT(2, s.stragglers[0].times_last);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 5.0f, (float)s.stragglers[0].total_late_ms);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 2.5f, (float)s.stragglers[0].mean_late_ms);
    TEST_ASSERT_EQUAL_INT(0, s.stragglers[1].rank);
    TEST_ASSERT_EQUAL_INT(1, s.stragglers[1].times_last);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 1.0f, (float)s.stragglers[1].total_late_ms);
    tt_summary_free(&s);
    tt_free(&t);
}

static void test_summary_warns_of_a_spread_below_the_clock_error_bound(void) {
    tt_trace t;
    tt_summary s;
    write_two_rank_trace(0);
    load_ok(dir, &t);
    tt_summarize(&t, &s);
    TEST_ASSERT_EQUAL_size_t(1, s.below_clock_error); /* seq 4: 0 us apart, clocks known to 50 us */
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 50.0f, (float)s.collectives[3].clock_error_us);
    tt_summary_free(&s);
    tt_free(&t);
    TEST_ASSERT_EQUAL_INT(0, run_tool("summary", dir, NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.out, "warning: 1 of 4 collectives have an arrival spread below"), run.out);
}

static void test_summary_shows_terminal_escapes_from_a_trace_as_question_marks(void) {
    rank_file rf;
    open_rank(&rf, 0, 1, 0);
    add_line(&rf, "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"cat\":\"comm\",\"name\":\"all_gather\",\"ts\":1,\"dur\":1,"
                  "\"args\":{\"op\":\"all_gather\",\"bytes\":8,\"unit\":\"\\u001b]0;owned\\u0007\",\"group\":\"world\",\"seq\":0}}");
    close_rank(&rf);
    TEST_ASSERT_EQUAL_INT(0, run_tool("summary", dir, NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.out, "?]0;owned?"), run.out);
    TEST_ASSERT_NULL(strchr(run.out, 0x1b));
    TEST_ASSERT_NULL(strchr(run.out, 0x07));
}

static void test_summary_command_prints_every_table_with_top_n_spreads(void) {
    write_two_rank_trace(0);
    TEST_ASSERT_EQUAL_INT(0, run_tool("summary", dir, "--top", "2", NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "clocks (each rank's aligned to rank 0's):"));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "per step and rank (ms):"));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "slowest rank per step:"));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "top stragglers"));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.out, "largest arrival spreads (top 2):"), run.out);
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.out, "  all_gather  h.0   world         1          1       3.000\n"), run.out);
    TEST_ASSERT_NOT_NULL(strstr(run.out, "  all_gather  h.0   world         3          1       2.000\n"));
    TEST_ASSERT_NULL(strstr(run.out, "reduce_scatter")); /* seq 2, the third largest */
    TEST_ASSERT_EQUAL_STRING("", run.err);
}

/* ---------------------------------------------------------------------------------------------
   merge
   --------------------------------------------------------------------------------------------- */
static void test_merge_output_loads_back_with_the_same_events(void) {
    tt_trace before, after;
    char out[400];
    size_t i;
    write_two_rank_trace(0);
    path_in_dir(out, sizeof out, "merged.json");
    TEST_ASSERT_EQUAL_INT(0, run_tool("merge", dir, out, NULL));
    load_ok(dir, &before);
    load_ok(out, &after);
    TEST_ASSERT_EQUAL_size_t(before.n, after.n);
    for (i = 0; i < before.n; i++) {
        TEST_ASSERT_EQUAL_STRING(before.ev[i].name, after.ev[i].name);
        TEST_ASSERT_EQUAL_STRING(before.ev[i].ph, after.ev[i].ph);
        TEST_ASSERT_EQUAL_INT(before.ev[i].rank, after.ev[i].rank);
        TEST_ASSERT_EQUAL_INT(before.ev[i].tid, after.ev[i].tid);
        TEST_ASSERT_TRUE(before.ev[i].ts == after.ev[i].ts && before.ev[i].dur == after.ev[i].dur);
        TEST_ASSERT_EQUAL_INT((int)before.ev[i].seq, (int)after.ev[i].seq);
    }
    tt_free(&before);
    tt_free(&after);
}

static void test_merge_output_keeps_each_ranks_otherdata_and_passes_check(void) {
    tt_trace t;
    char out[400];
    size_t size;
    char *text;
    write_two_rank_trace(1);
    path_in_dir(out, sizeof out, "merged.json");
    TEST_ASSERT_EQUAL_INT(0, run_tool("merge", dir, out, NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "merged.json: 2 ranks, 37 events"));
    text = read_whole(out, &size);
    TEST_ASSERT_EQUAL_INT(0, strncmp(text, "{\"otherData\":{\"format\":\"fsdp.h-trace\",\"version\":1,\"merged\":1", 60));
    TEST_ASSERT_NOT_NULL(strstr(text, "],\"displayTimeUnit\":\"ms\"}\n"));
    free(text);
    load_ok(out, &t);
    TEST_ASSERT_EQUAL_INT(2, t.nranks);
    TEST_ASSERT_EQUAL_STRING("node1", t.ranks[1].host);
    TEST_ASSERT_FLOAT_WITHIN(1e-6, 50.0f, (float)t.ranks[1].clock_error_us);
    TEST_ASSERT_TRUE(t.ranks[1].truncated); /* travels in otherData.truncated_ranks */
    TEST_ASSERT_FALSE(t.ranks[0].truncated);
    tt_free(&t);
    TEST_ASSERT_EQUAL_INT(0, run_tool("check", out, NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "ok: 2 ranks, 29 events, 2 steps"));
}

static void test_merge_leaves_no_temporary_file_behind(void) {
    char out[400];
    DIR *d;
    struct dirent *e;
    int others = 0;
    write_two_rank_trace(0);
    path_in_dir(out, sizeof out, "merged.json");
    TEST_ASSERT_EQUAL_INT(0, run_tool("merge", dir, out, NULL));
    d = opendir(dir);
    TEST_ASSERT_NOT_NULL(d);
    while ((e = readdir(d)) != NULL) others += strstr(e->d_name, ".tmp") != NULL;
    closedir(d);
    TEST_ASSERT_EQUAL_INT(0, others);
}

static void test_merge_replaces_a_symlink_planted_at_its_temporary_name_without_following_it(void) {
    char out[400], temp[500], victim[400];
    struct stat st;
    write_two_rank_trace(0);
    path_in_dir(out, sizeof out, "merged.json");
    path_in_dir(victim, sizeof victim, "victim");
    write_text("victim", "untouched");
    snprintf(temp, sizeof temp, "%s.tmp-%ld", out, (long)getpid()); /* the name tt_run will use */
    TEST_ASSERT_EQUAL_INT(0, symlink(victim, temp));
    TEST_ASSERT_EQUAL_INT(0, run_tool("merge", dir, out, NULL));
    TEST_ASSERT_EQUAL_INT(0, stat(victim, &st));
    TEST_ASSERT_EQUAL_INT(9, (int)st.st_size);
    TEST_ASSERT_EQUAL_INT(0, lstat(out, &st));
    TEST_ASSERT_TRUE(S_ISREG(st.st_mode));
}

/* ---------------------------------------------------------------------------------------------
   svg
   --------------------------------------------------------------------------------------------- */
static void test_svg_is_well_formed_with_a_legend_and_one_band_per_rank(void) {
    char out[400], why[200];
    size_t size;
    char *text;
    write_two_rank_trace(0);
    path_in_dir(out, sizeof out, "trace.svg");
    TEST_ASSERT_EQUAL_INT(0, run_tool("svg", dir, out, NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.out, "steps 1-2 of 2 ranks"), run.out); /* the default */
    text = read_whole(out, &size);
    TEST_ASSERT_EQUAL_INT(0, strncmp(text, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\"", 53));
    TEST_ASSERT_TRUE_MESSAGE(well_formed_xml(text, why, sizeof why), why);
    TEST_ASSERT_EQUAL_size_t(1, count_of(text, "<g id=\"legend\">"));
    TEST_ASSERT_EQUAL_size_t(2, count_of(text, "<g id=\"rank-"));
    TEST_ASSERT_EQUAL_size_t(2, count_of(text, "\">step ")); /* the labels, not the tooltips */
    TEST_ASSERT_NOT_NULL(strstr(text, "<title>wait all_gather h.0: 1.000 ms</title>"));
    TEST_ASSERT_NOT_NULL(strstr(text, "fill=\"#e53935\"")); /* waits for comm are red */
    TEST_ASSERT_NULL(strstr(text, "<script"));
    TEST_ASSERT_LESS_OR_EQUAL(60, count_of(text, "<rect"));
    free(text);
}

static void test_svg_escapes_markup_in_names(void) {
    char out[400], why[200];
    size_t size;
    char *text;
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"<script>alert(1)</script> & \\\"q\\\"\","
                     "\"ts\":1,\"dur\":5}");
    path_in_dir(out, sizeof out, "trace.svg");
    TEST_ASSERT_EQUAL_INT(0, run_tool("svg", dir, out, NULL));
    text = read_whole(out, &size);
    TEST_ASSERT_TRUE_MESSAGE(well_formed_xml(text, why, sizeof why), why);
    TEST_ASSERT_NULL(strstr(text, "<script"));
    TEST_ASSERT_NOT_NULL(strstr(text, "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot;: 0.005 ms"));
    free(text);
}

static void test_svg_steps_option_draws_only_those_steps(void) {
    tt_trace t;
    tt_svg_options opt;
    tt_svg_result res;
    char err[400];
    FILE *f = tmpfile();
    write_two_rank_trace(0);
    load_ok(dir, &t);
    memset(&opt, 0, sizeof opt);
    opt.first_step = opt.last_step = 1;
    TEST_ASSERT_EQUAL_INT(0, tt_write_svg(f, &t, &opt, &res, err, sizeof err));
    TEST_ASSERT_FLOAT_WITHIN(1e-3, 1000.0f, (float)res.t0_us);
    TEST_ASSERT_FLOAT_WITHIN(1e-3, 21000.0f, (float)res.t1_us);
    fclose(f);
    tt_free(&t);
}

static void test_svg_of_steps_not_in_the_trace_fails_naming_those_it_has(void) {
    char out[400];
    write_two_rank_trace(0);
    path_in_dir(out, sizeof out, "trace.svg");
    TEST_ASSERT_EQUAL_INT(1, run_tool("svg", dir, out, "--steps", "5-9", NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.err, "no step 5-9 in the trace (it has steps 1-2)"), run.err);
    TEST_ASSERT_EQUAL_INT(-1, access(out, F_OK));
}

static void test_svg_of_1000_steps_merges_narrow_rects_to_two_per_pixel_and_layer(void) {
    tt_trace t;
    tt_svg_options opt;
    tt_svg_result res;
    char err[400];
    FILE *f = tmpfile();
    size_t events = write_long_trace(2, 1000), plot_px = 800 - TT_SVG_LEFT - TT_SVG_RIGHT;
    load_ok(dir, &t);
    memset(&opt, 0, sizeof opt);
    opt.first_step = 1;
    opt.last_step = 1000;
    opt.width = 800;
    TEST_ASSERT_EQUAL_INT(0, tt_write_svg(f, &t, &opt, &res, err, sizeof err));
    /* 2 ranks x 4 layers in use (iterations, hooks, waits; collectives), 2 rects per px each */
    TEST_ASSERT_LESS_OR_EQUAL(2 * 4 * (2 * plot_px + 2) + 20, res.rects);
    TEST_ASSERT_LESS_THAN(events / 4, res.rects);
    fclose(f);
    tt_free(&t);
}

static void test_svg_of_a_long_trace_by_default_is_small(void) {
    char out[400];
    struct stat st;
    write_long_trace(2, 1000);
    path_in_dir(out, sizeof out, "trace.svg");
    TEST_ASSERT_EQUAL_INT(0, run_tool("svg", dir, out, NULL));
    TEST_ASSERT_NOT_NULL_MESSAGE(strstr(run.out, "steps 999-1000 of 2 ranks"), run.out);
    TEST_ASSERT_EQUAL_INT(0, stat(out, &st));
    TEST_ASSERT_LESS_THAN(64 * 1024, (long)st.st_size);
}

/* ---------------------------------------------------------------------------------------------
   check
   --------------------------------------------------------------------------------------------- */
static void test_check_of_a_complete_trace_says_ok_with_the_counts(void) {
    write_two_rank_trace(0);
    TEST_ASSERT_EQUAL_INT(0, run_tool("check", dir, NULL));
    TEST_ASSERT_EQUAL_STRING("ok: 2 ranks, 30 events, 2 steps\n", run.out);
    TEST_ASSERT_EQUAL_STRING("", run.err);
}

static void test_check_of_a_trace_missing_a_rank_fails(void) {
    rank_file rf;
    int rank;
    for (rank = 0; rank < 3; rank += 2) { /* world 3 without rank 1 */
        open_rank(&rf, rank, 3, 0);
        close_rank(&rf);
    }
    assert_check_fails_saying("rank 1 of world 3 is missing");
}

static void test_check_of_a_pid_that_is_not_the_files_rank_fails(void) {
    rank_file rf;
    open_rank(&rf, 0, 2, 0);
    close_rank(&rf);
    open_rank(&rf, 1, 2, 0);
    add_line(&rf, "{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"pre_forward h.0\",\"ts\":1,\"dur\":1}");
    close_rank(&rf);
    assert_check_fails_saying("event 'pre_forward h.0': pid 0 in rank 1's file");
}

static void test_check_of_a_negative_dur_fails(void) {
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"cat\":\"hook\",\"name\":\"pre_forward h.0\",\"ts\":1,\"dur\":-1}");
    assert_check_fails_saying("dur -1 is missing or negative");
}

static void test_check_of_an_unknown_tid_fails(void) {
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":7,\"cat\":\"hook\",\"name\":\"pre_forward h.0\",\"ts\":1,\"dur\":1}");
    assert_check_fails_saying("tid 7 is not 0..5");
}

static void test_check_of_a_comm_event_without_seq_fails(void) {
    write_rank0_with("{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"cat\":\"comm\",\"name\":\"all_gather\",\"ts\":1,\"dur\":1,"
                     "\"args\":{\"op\":\"all_gather\",\"bytes\":8,\"group\":\"world\"}}");
    assert_check_fails_saying("a comm event without args.seq");
}

static void test_check_of_events_that_overlap_without_nesting_fails(void) {
    rank_file rf;
    open_rank(&rf, 0, 1, 0);
    add_event(&rf, 0, "hook", "pre_forward h.0", 10, 10, "");
    add_event(&rf, 0, "wait", "wait step", 15, 10, "\"for\":\"step\"");
    close_rank(&rf);
    assert_check_fails_saying("overlaps 'pre_forward h.0'");
}

static void test_check_of_a_wrong_format_name_fails(void) {
    rank_file rf;
    open_rank_as(&rf, "trace-rank00000.json", 0, 1, 0, "chrome-trace");
    close_rank(&rf);
    assert_check_fails_saying("otherData: format is 'chrome-trace', not 'fsdp.h-trace'");
}

static void test_check_of_bad_json_fails_naming_the_byte(void) {
    write_text("trace-rank00000.json", "{\"otherData\":{\"format\":\"fsdp.h-trace\",\"version\":1,,");
    assert_check_fails_saying("trace-rank00000.json: byte 50: expected a member name in quotes");
}

/* ---------------------------------------------------------------------------------------------
   the command line
   --------------------------------------------------------------------------------------------- */
static void test_cli_without_a_command_prints_usage_and_exits_2(void) {
    TEST_ASSERT_EQUAL_INT(2, run_tool(NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.err, "usage: trace_tool COMMAND"));
}

static void test_cli_help_prints_usage_and_exits_0(void) {
    TEST_ASSERT_EQUAL_INT(0, run_tool("--help", NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "usage: trace_tool COMMAND"));
    TEST_ASSERT_EQUAL_INT(0, run_tool("svg", "--help", NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.out, "usage: trace_tool svg DIR|FILE OUT.svg"));
}

static void test_cli_unknown_command_or_option_exits_2(void) {
    TEST_ASSERT_EQUAL_INT(2, run_tool("stats", dir, NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.err, "unknown command 'stats'"));
    TEST_ASSERT_EQUAL_INT(2, run_tool("summary", dir, "--topp", "3", NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.err, "unknown option '--topp' (see trace_tool summary --help)"));
    TEST_ASSERT_EQUAL_INT(2, run_tool("summary", dir, "--top", "many", NULL));
    TEST_ASSERT_EQUAL_INT(2, run_tool("svg", dir, "out.svg", "--steps", "3-1", NULL));
    TEST_ASSERT_EQUAL_INT(2, run_tool("merge", dir, NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.err, "missing the output file"));
}

static void test_cli_of_a_path_that_does_not_exist_exits_1(void) {
    char path[400];
    path_in_dir(path, sizeof path, "nothing-here");
    TEST_ASSERT_EQUAL_INT(1, run_tool("summary", path, NULL));
    TEST_ASSERT_NOT_NULL(strstr(run.err, "nothing-here: No such file or directory"));
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_load_of_a_two_rank_dir_reads_every_event_and_both_ranks);
    RUN_TEST(test_load_of_one_rank_file_reads_that_rank_only);
    RUN_TEST(test_load_reads_an_events_fields_and_args);
    RUN_TEST(test_load_of_a_file_cut_in_its_last_event_keeps_the_others_and_warns);
    RUN_TEST(test_load_of_a_file_without_its_closing_line_keeps_every_event);
    RUN_TEST(test_load_decodes_unicode_escapes_and_surrogate_pairs);
    RUN_TEST(test_load_of_an_unterminated_string_in_otherData_fails_naming_file_and_byte);
    RUN_TEST(test_load_of_an_unterminated_string_in_a_middle_event_fails);
    RUN_TEST(test_load_of_10000_nested_arrays_fails_at_the_depth_bound);
    RUN_TEST(test_load_of_a_number_beyond_double_fails);
    RUN_TEST(test_load_of_a_400_digit_number_fails);
    RUN_TEST(test_load_of_a_raw_control_character_in_a_string_fails);
    RUN_TEST(test_load_of_a_lone_surrogate_escape_fails);
    RUN_TEST(test_load_of_a_wrong_typed_field_fails_naming_it);
    RUN_TEST(test_load_of_data_after_the_trace_object_fails);
    RUN_TEST(test_load_of_two_files_of_one_rank_fails);
    RUN_TEST(test_load_of_a_fifo_fails_at_once);
    RUN_TEST(test_load_of_a_dir_without_trace_files_fails_saying_so);
    RUN_TEST(test_summary_splits_each_step_into_compute_fsdp_and_waits_as_constructed);
    RUN_TEST(test_summary_names_the_slowest_rank_of_each_step);
    RUN_TEST(test_summary_names_rank_1_arriving_3_ms_late_as_the_largest_spread);
    RUN_TEST(test_summary_ranks_stragglers_by_how_often_they_arrived_last);
    RUN_TEST(test_summary_warns_of_a_spread_below_the_clock_error_bound);
    RUN_TEST(test_summary_shows_terminal_escapes_from_a_trace_as_question_marks);
    RUN_TEST(test_summary_command_prints_every_table_with_top_n_spreads);
    RUN_TEST(test_merge_output_loads_back_with_the_same_events);
    RUN_TEST(test_merge_output_keeps_each_ranks_otherdata_and_passes_check);
    RUN_TEST(test_merge_leaves_no_temporary_file_behind);
    RUN_TEST(test_merge_replaces_a_symlink_planted_at_its_temporary_name_without_following_it);
    RUN_TEST(test_svg_is_well_formed_with_a_legend_and_one_band_per_rank);
    RUN_TEST(test_svg_escapes_markup_in_names);
    RUN_TEST(test_svg_steps_option_draws_only_those_steps);
    RUN_TEST(test_svg_of_steps_not_in_the_trace_fails_naming_those_it_has);
    RUN_TEST(test_svg_of_1000_steps_merges_narrow_rects_to_two_per_pixel_and_layer);
    RUN_TEST(test_svg_of_a_long_trace_by_default_is_small);
    RUN_TEST(test_check_of_a_complete_trace_says_ok_with_the_counts);
    RUN_TEST(test_check_of_a_trace_missing_a_rank_fails);
    RUN_TEST(test_check_of_a_pid_that_is_not_the_files_rank_fails);
    RUN_TEST(test_check_of_a_negative_dur_fails);
    RUN_TEST(test_check_of_an_unknown_tid_fails);
    RUN_TEST(test_check_of_a_comm_event_without_seq_fails);
    RUN_TEST(test_check_of_events_that_overlap_without_nesting_fails);
    RUN_TEST(test_check_of_a_wrong_format_name_fails);
    RUN_TEST(test_check_of_bad_json_fails_naming_the_byte);
    RUN_TEST(test_cli_without_a_command_prints_usage_and_exits_2);
    RUN_TEST(test_cli_help_prints_usage_and_exits_0);
    RUN_TEST(test_cli_unknown_command_or_option_exits_2);
    RUN_TEST(test_cli_of_a_path_that_does_not_exist_exits_1);
    return UNITY_END();
}
