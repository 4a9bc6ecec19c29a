/* test_loss_plot.c - specification of examples/loss_plot.c, which draws training runs' losses
   side by side (the quality comparison of quantized communication, issue 37).

   The tool is included whole (it needs only libc and libm); each test writes the logs it reads
   into its own directory under /tmp (mkdtemp in setUp, removed in tearDown). The standard log
   has steps 1..100 with loss = 10 - step / 10 (so every moving average is known exactly). */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#define LOSS_PLOT_NO_MAIN
#include "../examples/loss_plot.c"
#include "unity.h"

#include <ftw.h>
#include <sys/types.h>

static char dir[256];
static char path[512];

static int remove_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

void setUp(void) {
    snprintf(dir, sizeof dir, "/tmp/test_loss_plot.XXXXXX");
    TEST_ASSERT_NOT_NULL(mkdtemp(dir));
}
void tearDown(void) { nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* Writes text to dir/name; its path (in the static path buffer). */
static const char *write_file(const char *name, const char *text) {
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "w");
    TEST_ASSERT_NOT_NULL(f);
    fputs(text, f);
    TEST_ASSERT_EQUAL_INT(0, fclose(f));
    return path;
}

/* The standard log, as gpt writes it (other keys around step and loss). */
static const char *write_linear_log(const char *name, double offset) {
    static char text[20000];
    size_t n = 0;
    int s;
    for (s = 1; s <= 100; s++)
        n += (size_t)snprintf(text + n, sizeof text - n, "{\"step\":%d,\"loss\":%.6f,\"lr\":0.001,\"ms\":1.5}\n", s,
                              10.0 - s / 10.0 + offset);
    return write_file(name, text);
}

static int read_log(lp_run *run, const char *text, char *err) {
    memset(run, 0, sizeof *run);
    return lp_read(run, write_file("log.jsonl", text), err, 512);
}

void test_read_gpt_log_gives_every_step(void) {
    lp_run run;
    char err[512];
    memset(&run, 0, sizeof run);
    TEST_ASSERT_EQUAL_INT(0, lp_read(&run, write_linear_log("a.jsonl", 0), err, sizeof err));
    TEST_ASSERT_EQUAL_INT(100, run.steps);
    TEST_ASSERT_FLOAT_WITHIN(1e-6f, 9.9f, (float)run.loss[0]);
    TEST_ASSERT_FLOAT_WITHIN(1e-6f, 0.0f, (float)run.loss[99]);
    free(run.loss);
}

void test_read_skipped_step_refused_naming_line(void) {
    lp_run run;
    char err[512];
    TEST_ASSERT_EQUAL_INT(-1, read_log(&run, "{\"step\":1,\"loss\":2}\n{\"step\":3,\"loss\":2}\n", err));
    TEST_ASSERT_NOT_NULL(strstr(err, "log.jsonl:2: step 3 where 2 was expected"));
    free(run.loss);
}

void test_read_nonfinite_loss_refused(void) {
    lp_run run;
    char err[512];
    TEST_ASSERT_EQUAL_INT(-1, read_log(&run, "{\"step\":1,\"loss\":nan}\n", err));
    TEST_ASSERT_NOT_NULL(strstr(err, "log.jsonl:1: not a loss log line"));
    free(run.loss);
}

void test_read_missing_loss_refused(void) {
    lp_run run;
    char err[512];
    TEST_ASSERT_EQUAL_INT(-1, read_log(&run, "{\"step\":1,\"lossy\":2}\n", err));
    TEST_ASSERT_NOT_NULL(strstr(err, "not a loss log line"));
    free(run.loss);
}

void test_read_empty_log_refused(void) {
    lp_run run;
    char err[512];
    TEST_ASSERT_EQUAL_INT(-1, read_log(&run, "\n", err));
    TEST_ASSERT_NOT_NULL(strstr(err, "no steps"));
    free(run.loss);
}

void test_read_overlong_line_refused(void) {
    static char text[LP_MAX_LINE + 100];
    lp_run run;
    char err[512];
    memset(text, ' ', sizeof text - 2);
    text[0] = '{';
    text[sizeof text - 2] = '\n';
    text[sizeof text - 1] = 0;
    TEST_ASSERT_EQUAL_INT(-1, read_log(&run, text, err));
    TEST_ASSERT_NOT_NULL(strstr(err, "line longer than"));
    free(run.loss);
}

void test_read_missing_file_names_it(void) {
    lp_run run;
    char err[512];
    memset(&run, 0, sizeof run);
    TEST_ASSERT_EQUAL_INT(-1, lp_read(&run, "/nonexistent/log.jsonl", err, sizeof err));
    TEST_ASSERT_NOT_NULL(strstr(err, "/nonexistent/log.jsonl: No such file"));
}

void test_smooth_averages_the_window_ending_at_step(void) {
    lp_run run;
    char err[512];
    memset(&run, 0, sizeof run);
    TEST_ASSERT_EQUAL_INT(0, lp_read(&run, write_linear_log("a.jsonl", 0), err, sizeof err));
    TEST_ASSERT_FLOAT_WITHIN(1e-5f, 9.9f, (float)lp_smooth(&run, 1, 10));        /* only step 1 */
    TEST_ASSERT_FLOAT_WITHIN(1e-5f, 5.45f, (float)lp_smooth(&run, 50, 10));      /* steps 41..50 */
    TEST_ASSERT_FLOAT_WITHIN(1e-5f, 5.0f, (float)lp_smooth(&run, 50, 1));        /* raw */
    free(run.loss);
}

/* Runs lp_main on argv; its standard output in out. */
static int run_main(int argc, const char **argv, char *out, size_t out_size) {
    int saved = dup(1), rc;
    size_t n;
    FILE *f;
    snprintf(path, sizeof path, "%s/stdout", dir);
    fflush(stdout);
    f = fopen(path, "w+");
    TEST_ASSERT_NOT_NULL(f);
    dup2(fileno(f), 1);
    rc = lp_main(argc, (char **)argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(f);
    n = fread(out, 1, out_size - 1, f);
    out[n] = 0;
    fclose(f);
    return rc;
}

void test_table_gives_loss_every_n_and_difference_to_reference(void) {
    char a[600], b[600], svg[600], out[4096];
    const char *argv[8];
    snprintf(a, sizeof a, "ref=%s", write_linear_log("a.jsonl", 0));
    snprintf(b, sizeof b, "plus=%s", write_linear_log("b.jsonl", 0.1));
    snprintf(svg, sizeof svg, "%s/loss.svg", dir);
    argv[0] = "loss_plot", argv[1] = svg, argv[2] = a, argv[3] = b, argv[4] = "--every", argv[5] = "40";
    TEST_ASSERT_EQUAL_INT(0, run_main(6, argv, out, sizeof out));
    /* step 40: mean of 6.9 .. 6.0 = 6.45; step 100 (the last): mean of 0.9 .. 0.0 = 0.45 */
    TEST_ASSERT_NOT_NULL(strstr(out, "| step | ref | plus |"));
    TEST_ASSERT_NOT_NULL(strstr(out, "| 40 | 6.4500 | 6.5500 |"));
    TEST_ASSERT_NOT_NULL(strstr(out, "| 80 | 2.4500 | 2.5500 |"));
    TEST_ASSERT_NOT_NULL(strstr(out, "| 100 | 0.4500 | 0.5500 |"));
    TEST_ASSERT_NOT_NULL(strstr(out, "| vs ref at 100 | +0.00% | +22.22% |"));
}

void test_svg_has_a_line_per_run_and_escaped_labels(void) {
    char a[600], b[600], svg[600], out[4096], text[200000];
    const char *argv[8];
    size_t n;
    FILE *f;
    const char *at;
    int lines = 0;
    snprintf(a, sizeof a, "f32<1>=%s", write_linear_log("a.jsonl", 0));
    snprintf(b, sizeof b, "int8&int8=%s", write_linear_log("b.jsonl", 0.1));
    snprintf(svg, sizeof svg, "%s/loss.svg", dir);
    argv[0] = "loss_plot", argv[1] = svg, argv[2] = a, argv[3] = b;
    TEST_ASSERT_EQUAL_INT(0, run_main(4, argv, out, sizeof out));
    f = fopen(svg, "r");
    TEST_ASSERT_NOT_NULL(f);
    n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    TEST_ASSERT_EQUAL_INT(0, strncmp(text, "<?xml", 5));
    TEST_ASSERT_NOT_NULL(strstr(text, "</svg>\n"));
    TEST_ASSERT_NOT_NULL(strstr(text, ">f32&lt;1&gt;</text>"));
    TEST_ASSERT_NOT_NULL(strstr(text, ">int8&amp;int8</text>"));
    for (at = text; (at = strstr(at, "<polyline")) != NULL; at++) lines++;
    TEST_ASSERT_EQUAL_INT(4, lines); /* per run: the raw losses and the moving average */
}

void test_bad_log_fails_and_leaves_no_svg(void) {
    char a[600], svg[600], out[4096];
    const char *argv[4];
    struct stat st;
    snprintf(a, sizeof a, "bad=%s", write_file("bad.jsonl", "not json\n"));
    snprintf(svg, sizeof svg, "%s/loss.svg", dir);
    argv[0] = "loss_plot", argv[1] = svg, argv[2] = a;
    TEST_ASSERT_EQUAL_INT(1, run_main(3, argv, out, sizeof out));
    TEST_ASSERT_TRUE(stat(svg, &st) != 0);
}

void test_bad_option_value_refused(void) {
    char out[4096];
    const char *argv[4] = {"loss_plot", "x.svg", "--every", "0"};
    TEST_ASSERT_EQUAL_INT(2, run_main(4, argv, out, sizeof out));
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_read_gpt_log_gives_every_step);
    RUN_TEST(test_read_skipped_step_refused_naming_line);
    RUN_TEST(test_read_nonfinite_loss_refused);
    RUN_TEST(test_read_missing_loss_refused);
    RUN_TEST(test_read_empty_log_refused);
    RUN_TEST(test_read_overlong_line_refused);
    RUN_TEST(test_read_missing_file_names_it);
    RUN_TEST(test_smooth_averages_the_window_ending_at_step);
    RUN_TEST(test_table_gives_loss_every_n_and_difference_to_reference);
    RUN_TEST(test_svg_has_a_line_per_run_and_escaped_labels);
    RUN_TEST(test_bad_log_fails_and_leaves_no_svg);
    RUN_TEST(test_bad_option_value_refused);
    return UNITY_END();
}
