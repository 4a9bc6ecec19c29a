/* loss_plot: training runs side by side, from the loss logs gpt writes (--log FILE).

       loss_plot OUT.svg LABEL=LOG [LABEL=LOG ...] [--every N] [--window W] [--title TEXT] [--width PX]

   Each LOG is what `gpt --log FILE` wrote: one JSON object per line with at least "step" and
   "loss" (other keys are ignored). The first run is the reference. loss_plot writes
     - OUT.svg: every run's loss against the step, one coloured line each, as a moving average over
       W steps (--window, default 10; 1 draws the raw losses) with the raw losses faint behind it;
       plain SVG 1.1, which GitHub shows inline;
     - to standard output, a Markdown table: the loss every N steps (--every, default 50) and at the
       last step common to all runs, as the moving average over W steps ending there, and each run's
       difference from the reference at the last step in percent.
   The same data and the same seed make every run see the same batches, so the runs' differences
   are the configurations', not the data's; the moving average keeps a single noisy batch from
   deciding a comparison.

   Reading is strict: a line that is not an object with a finite "loss" and a "step" that follows
   the previous one (1, 2, 3, ...) is refused naming the file and the line. Up to 8 runs, 1,000,000
   steps each. The SVG is written to a temporary name and renamed, so a failure leaves what was there.

   Build: cc -std=c99 -O2 examples/loss_plot.c -o build/loss_plot -lm (make build/loss_plot).
   It needs only libc and libm. tests/test_loss_plot.c includes this file with LOSS_PLOT_NO_MAIN
   defined and calls the lp_ functions itself. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LP_MAX_RUNS 8
#define LP_MAX_STEPS 1000000
#define LP_MAX_LINE 4096

typedef struct lp_run {
    char label[64];
    double *loss; /* loss[i]: step i + 1 */
    long steps;
} lp_run;

/* The number after "key": in a JSON object's line; 0 if the key is absent or not a number. */
static int lp_number(const char *line, const char *key, double *out) {
    char pattern[40];
    const char *at;
    char *end;
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    if (!(at = strstr(line, pattern))) return 0;
    at += strlen(pattern);
    while (*at == ' ') at++;
    errno = 0;
    *out = strtod(at, &end);
    return end != at && errno != ERANGE && (*end == ',' || *end == '}' || *end == ' ');
}

/* Reads LOG into run (label given); 0, or -1 with the reason in err. */
static int lp_read(lp_run *run, const char *path, char *err, size_t err_size) {
    char line[LP_MAX_LINE];
    long cap = 0, lineno = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_size, "%.400s: %s", path, strerror(errno));
        return -1;
    }
    run->steps = 0;
    err[0] = 0;
    while (fgets(line, sizeof line, f)) {
        double step, loss;
        size_t n = strlen(line);
        lineno++;
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            snprintf(err, err_size, "%.400s:%ld: line longer than %d bytes", path, lineno, LP_MAX_LINE - 2);
            break;
        }
        if (n <= 1) continue;
        if (line[0] != '{' || !lp_number(line, "step", &step) || !lp_number(line, "loss", &loss) || !isfinite(loss)) {
            snprintf(err, err_size, "%.400s:%ld: not a loss log line (an object with \"step\" and a finite \"loss\")", path,
                     lineno);
            break;
        }
        if (step != (double)(run->steps + 1) || run->steps >= LP_MAX_STEPS) {
            snprintf(err, err_size, "%.400s:%ld: step %.0f where %ld was expected (at most %d steps)", path, lineno, step,
                     run->steps + 1, LP_MAX_STEPS);
            break;
        }
        if (run->steps == cap) {
            double *grown = (double *)realloc(run->loss, sizeof(double) * (size_t)(cap ? 2 * cap : 256));
            if (!grown) {
                snprintf(err, err_size, "%.400s: out of memory", path);
                break;
            }
            run->loss = grown;
            cap = cap ? 2 * cap : 256;
        }
        run->loss[run->steps++] = loss;
    }
    if (!feof(f) && !err[0]) snprintf(err, err_size, "%.400s: read error", path);
    fclose(f);
    if (!err[0] && run->steps == 0) snprintf(err, err_size, "%.400s: no steps", path);
    return err[0] ? -1 : 0;
}

/* The mean of the losses of steps (step - window, step], fewer at the start; step is 1-based. */
static double lp_smooth(const lp_run *run, long step, long window) {
    long i, first = step - window < 0 ? 0 : step - window;
    double sum = 0;
    for (i = first; i < step; i++) sum += run->loss[i];
    return sum / (double)(step - first);
}

static long lp_common_steps(const lp_run *runs, int n) {
    long steps = runs[0].steps;
    int r;
    for (r = 1; r < n; r++) steps = runs[r].steps < steps ? runs[r].steps : steps;
    return steps;
}

/* The Markdown table of the loss every `every` steps and at the last common step. */
static void lp_table(FILE *out, const lp_run *runs, int n, long every, long window) {
    long last = lp_common_steps(runs, n), s;
    int r;
    fprintf(out, "| step |");
    for (r = 0; r < n; r++) fprintf(out, " %s |", runs[r].label);
    fprintf(out, "\n|---:|");
    for (r = 0; r < n; r++) fprintf(out, "---:|");
    fprintf(out, "\n");
    for (s = every; s <= last + every - 1; s += every) {
        long at = s > last ? last : s;
        fprintf(out, "| %ld |", at);
        for (r = 0; r < n; r++) fprintf(out, " %.4f |", lp_smooth(&runs[r], at, window));
        fprintf(out, "\n");
        if (at == last) break;
    }
    fprintf(out, "| vs %s at %ld |", runs[0].label, last);
    for (r = 0; r < n; r++)
        fprintf(out, " %+.2f%% |", 100.0 * (lp_smooth(&runs[r], last, window) / lp_smooth(&runs[0], last, window) - 1.0));
    fprintf(out, "\n");
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over span. */
static double lp_tick(double span, int ticks) {
    double raw = span / ticks, power = pow(10.0, floor(log10(raw))), f = raw / power;
    return power * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

static void lp_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
}

typedef struct lp_frame { /* the plot area and its scales */
    double x0, y0, w, h, lo, hi;
    long steps;
} lp_frame;

static double lp_x(const lp_frame *g, double step) { return g->x0 + g->w * (step - 1) / (double)(g->steps > 1 ? g->steps - 1 : 1); }
static double lp_y(const lp_frame *g, double loss) { return g->y0 + g->h * (g->hi - loss) / (g->hi - g->lo); }

static void lp_axes(FILE *f, const lp_frame *g) {
    double t, step = lp_tick(g->hi - g->lo, 6), xs = lp_tick((double)g->steps, 8);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", g->x0, g->y0,
            g->w, g->h);
    for (t = ceil(g->lo / step) * step; t <= g->hi + 1e-9; t += step)
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                   "text-anchor=\"end\">%g</text>\n", g->x0, g->x0 + g->w, lp_y(g, t), lp_y(g, t), g->x0 - 6, lp_y(g, t) + 4, t);
    for (t = xs; t <= (double)g->steps + 1e-9; t += xs)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", lp_x(g, t), g->y0 + g->h + 16, t);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", g->x0 + g->w / 2, g->y0 + g->h + 34);
    fprintf(f, "<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 14 %.1f)\">loss</text>\n",
            g->y0 + g->h / 2, g->y0 + g->h / 2);
    fprintf(f, "<clipPath id=\"plot\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n", g->x0,
            g->y0, g->w, g->h);
}

static void lp_line(FILE *f, const lp_frame *g, const lp_run *run, long window, const char *colour, double opacity) {
    long s;
    fprintf(f, "<polyline clip-path=\"url(#plot)\" fill=\"none\" stroke=\"%s\" stroke-opacity=\"%.2f\" stroke-width=\"%.1f\" points=\"", colour,
            opacity, opacity < 1 ? 0.8 : 1.6);
    for (s = 1; s <= g->steps; s++) {
        double v = lp_smooth(run, s, window);
        fprintf(f, "%s%.1f,%.1f", s > 1 ? " " : "", lp_x(g, (double)s), lp_y(g, v));
    }
    fprintf(f, "\"/>\n");
}

/* The picture into f. The vertical range is the smoothed curves' (the raw losses' spikes would
   flatten everything else), with 5% room; the raw lines are clipped to it. */
static void lp_svg(FILE *f, const lp_run *runs, int n, long window, const char *title, int width) {
    static const char *colours[LP_MAX_RUNS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    lp_frame g;
    long s;
    int r, height = width / 2 + 60;
    g.x0 = 60;
    g.y0 = 40;
    g.w = width - 80;
    g.h = height - 100;
    g.steps = lp_common_steps(runs, n);
    g.lo = g.hi = lp_smooth(&runs[0], 1, window);
    for (r = 0; r < n; r++)
        for (s = 1; s <= g.steps; s++) {
            double v = lp_smooth(&runs[r], s, window);
            g.lo = v < g.lo ? v : g.lo;
            g.hi = v > g.hi ? v : g.hi;
        }
    if (g.hi - g.lo < 1e-6) g.hi = g.lo + 1e-6;
    g.lo -= 0.05 * (g.hi - g.lo);
    g.hi += 0.05 * (g.hi - g.lo);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" "
               "width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">", width,
            height, width / 2);
    lp_escape(f, title);
    fprintf(f, "</text>\n");
    lp_axes(f, &g);
    for (r = 0; r < n; r++) {
        if (window > 1) lp_line(f, &g, &runs[r], 1, colours[r], 0.15);
        lp_line(f, &g, &runs[r], window, colours[r], 1.0);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"3\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">",
                g.x0 + g.w - 180, g.y0 + 12 + 16.0 * r, colours[r], g.x0 + g.w - 160, g.y0 + 16 + 16.0 * r);
        lp_escape(f, runs[r].label);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
}

/* Writes the SVG to path through a temporary file; 0 or -1 with err. */
static int lp_write_svg(const char *path, const lp_run *runs, int n, long window, const char *title, int width, char *err,
                        size_t err_size) {
    char tmp[4200];
    FILE *f;
    int ok;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (strlen(path) > 4000 || !(f = fopen(tmp, "w"))) {
        snprintf(err, err_size, "%.400s: %s", path, strlen(path) > 4000 ? "path too long" : strerror(errno));
        return -1;
    }
    lp_svg(f, runs, n, window, title, width);
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_size, "%.400s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static const char *lp_usage =
    "usage: loss_plot OUT.svg LABEL=LOG [LABEL=LOG ...] [--every N] [--window W] [--title TEXT] [--width PX]\n"
    "  LOG: what `gpt --log FILE` wrote (one JSON object per step with \"step\" and \"loss\"); the first run is\n"
    "  the reference. Writes OUT.svg (the losses, moving averages over W steps, default 10) and prints a\n"
    "  Markdown table of the loss every N steps (default 50) and each run's difference from the reference.\n";

/* Parses "--name VALUE" as a long in [lo, hi]; 0 or -1. */
static int lp_long_arg(const char *name, const char *value, long lo, long hi, long *out) {
    char *end;
    long v = value ? strtol(value, &end, 10) : 0;
    if (!value || *end || end == value || v < lo || v > hi) {
        fprintf(stderr, "loss_plot: %s needs a number in [%ld, %ld]\n%s", name, lo, hi, lp_usage);
        return -1;
    }
    *out = v;
    return 0;
}

static int lp_main(int argc, char **argv) {
    lp_run runs[LP_MAX_RUNS];
    const char *out = NULL, *title = "training loss";
    long every = 50, window = 10, width = 720;
    char err[512];
    int i, n = 0, rc = 1;
    memset(runs, 0, sizeof runs);
    for (i = 1; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(lp_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--every")) {
            if (lp_long_arg("--every", argv[++i < argc ? i : argc - 1], 1, LP_MAX_STEPS, &every)) return 2;
        } else if (!strcmp(argv[i], "--window")) {
            if (lp_long_arg("--window", argv[++i < argc ? i : argc - 1], 1, 10000, &window)) return 2;
        } else if (!strcmp(argv[i], "--width")) {
            if (lp_long_arg("--width", argv[++i < argc ? i : argc - 1], 300, 4000, &width)) return 2;
        } else if (!strcmp(argv[i], "--title") && i + 1 < argc) {
            title = argv[++i];
        } else if (!out && argv[i][0] != '-') {
            out = argv[i];
        } else if (eq && eq != argv[i] && argv[i][0] != '-' && n < LP_MAX_RUNS) {
            snprintf(runs[n].label, sizeof runs[n].label, "%.*s", (int)(eq - argv[i]), argv[i]);
            if (lp_read(&runs[n++], eq + 1, err, sizeof err) != 0) {
                fprintf(stderr, "loss_plot: %s\n", err);
                goto done;
            }
        } else {
            fprintf(stderr, "loss_plot: unexpected argument '%s'%s\n%s", argv[i],
                    n == LP_MAX_RUNS ? " (at most 8 runs)" : "", lp_usage);
            goto done;
        }
    }
    if (!out || n == 0) {
        fputs(lp_usage, stderr);
        goto done;
    }
    if (lp_write_svg(out, runs, n, window, title, (int)width, err, sizeof err) != 0) {
        fprintf(stderr, "loss_plot: %s\n", err);
        goto done;
    }
    lp_table(stdout, runs, n, every, window);
    rc = 0;
done:
    for (i = 0; i < n; i++) free(runs[i].loss);
    return rc;
}

#ifndef LOSS_PLOT_NO_MAIN
int main(int argc, char **argv) { return lp_main(argc, argv); }
#endif
