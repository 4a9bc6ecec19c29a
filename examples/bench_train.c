/* bench_train: what fsdp.h costs and gains when training the MLP of mlp_model.h on this machine.

   One after another, each in fresh processes (so peak memory is per configuration), one BLAS
   thread per rank:
     plain     the same forward/backward kernels on plain arrays with the same optimizer update;
               no fsdp runtime at all (no context, hooks or communicator)
     FSDP P=1  FULL_SHARD on one rank
     FSDP P=N  FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD (shard groups of N/2 ranks)
   For each: samples/s and ms/step (median over the steps after warmup), the time the compute
   thread spends inside the fsdp calls (hooks, fsdp_step with its sharded optimizer update,
   fsdp_zero_grad: exposed communication plus the update), peak RSS and fsdp's peak bytes.

   Build and run: make bench && build/bench_train [--hidden 1024 --layers 6 --batch 512] */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "mlp_model.h"

#define MAX_RANKS 16

typedef struct {
    int hidden, layers, batch, steps, warmup, nproc, features, classes;
    fsdp_optimizer_desc optimizer;
    const char *csv;
    dataset data;
} options;

typedef struct {
    const char *name;
    int plain, nprocs, shard_group;
    fsdp_strategy strategy;
} config;

typedef struct {       // what a rank reports, through shared memory
    int done;
    double ms, wait_ms, update_ms, rss, state, loss;
} rank_result;

typedef struct {
    const options *o;
    const config *cfg;
    rank_result *out; // [MAX_RANKS], MAP_SHARED
} job;

/* ----------------------------------------------------------------------------------------- */
/* the plain loop's optimizer: fsdp.h's update rules (PyTorch's), line for line */

typedef struct {
    fsdp_optimizer_desc o;
    float *a, *b; // exp_avg or momentum_buffer, exp_avg_sq
    long long step;
} plain_optimizer;

static void plain_update(plain_optimizer *opt, float *p, const float *g, size_t n) {
    const fsdp_optimizer_desc *o = &opt->o;
    float lr = o->lr, wd = o->weight_decay;
    if (o->kind == FSDP_SGD) {
        for (size_t i = 0; i < n; i++) {
            float d = g[i] + wd * p[i];
            if (o->momentum != 0.0f) {
                opt->a[i] = opt->step == 0 ? d : o->momentum * opt->a[i] + (1.0f - o->dampening) * d;
                d = o->nesterov ? d + o->momentum * opt->a[i] : opt->a[i];
            }
            p[i] -= lr * d;
        }
    } else {
        double t = (double)(opt->step + 1);
        float bc1 = (float)(1.0 - pow((double)o->beta1, t)), bc2 = (float)(1.0 - pow((double)o->beta2, t));
        float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
        for (size_t i = 0; i < n; i++) {
            float d = g[i];
            if (o->kind == FSDP_ADAMW) p[i] *= 1.0f - lr * wd;
            else d += wd * p[i];
            opt->a[i] = o->beta1 * opt->a[i] + (1.0f - o->beta1) * d;
            opt->b[i] = o->beta2 * opt->b[i] + (1.0f - o->beta2) * d * d;
            p[i] -= step_size * opt->a[i] / (sqrtf(opt->b[i]) / bc2_sqrt + o->eps);
        }
    }
    opt->step++;
}

/* ----------------------------------------------------------------------------------------- */

/* CPU seconds the whole machine spent busy, and elapsed CPU seconds (all CPUs), from /proc/stat.
   Against our own children's CPU time this tells whether something else ran during the benchmark. */
static int machine_cpu(double *busy, double *total) {
    unsigned long long v[8];
    FILE *f = fopen("/proc/stat", "r");
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) : 0;
    double tick = (double)sysconf(_SC_CLK_TCK);
    if (f) fclose(f);
    if (n != 8) return -1;
    *total = 0;
    for (int i = 0; i < 8; i++) *total += (double)v[i] / tick;
    *busy = *total - (double)(v[3] + v[4]) / tick; // minus idle and iowait
    return 0;
}

static double children_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static double median(double *v, int n) { // sorts v
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

/* One rank of one configuration. */
static int run_rank(fsdp_comm *comm, void *arg) {
    const job *j = (const job *)arg;
    const options *o = j->o;
    const config *cfg = j->cfg;
    int rank = fsdp_comm_rank(comm), P = cfg->nprocs, B = o->batch / P, total = o->warmup + o->steps, rc = 1;
    const char *wrap_types[] = {"Linear", NULL};
    double *ms = (double *)calloc(3 * (size_t)total, sizeof(double)), *wait_ms = ms + total, *update_ms = ms + 2 * total;
    float loss = 0;
    plain_optimizer opt;
    fsdp_ctx *ctx = NULL;
    mlp m;
    mlp_acts acts;
    memset(&opt, 0, sizeof opt);
    memset(&m, 0, sizeof m);
    memset(&acts, 0, sizeof acts);
    openblas_set_num_threads(1);
    if (!ms || mlp_build(&m, o->data.features, o->hidden, o->layers, o->data.classes) || mlp_acts_alloc(&acts, &m, B)) {
        fprintf(stderr, "%s rank %d: out of memory\n", cfg->name, rank);
        goto done;
    }
    m.rank = rank;
    if (cfg->plain) {
        int buffers = o->optimizer.kind == FSDP_SGD ? (o->optimizer.momentum != 0.0f) : 2;
        opt.o = o->optimizer;
        opt.a = (float *)calloc(m.num_params, sizeof(float));
        opt.b = (float *)calloc(m.num_params, sizeof(float));
        if (mlp_plain_init(&m, 0) || !opt.a || !opt.b) { fprintf(stderr, "plain: out of memory\n"); goto done; }
        j->out[0].state = (double)m.num_params * sizeof(float) * (2.0 + buffers); // params, grads, optimizer
    } else {
        fsdp_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.comm = comm;
        desc.strategy = cfg->strategy;
        desc.wrap.kind = FSDP_WRAP_TYPES;
        desc.wrap.types = wrap_types;
        desc.forward_prefetch = 1;
        desc.shard_group_size = cfg->shard_group;
        desc.optimizer = o->optimizer;
        if (fsdp_init(&ctx, m.model, &desc)) { fprintf(stderr, "%s rank %d: %s\n", cfg->name, rank, fsdp_last_error(NULL)); goto done; }
        m.ctx = ctx;
    }

    for (int s = 0; s < total; s++) {
        double t0, t1, t2;
        data_batch(&o->data, s, o->batch, rank * B, (rank + 1) * B, acts.x[0], acts.targets);
        t0 = fsdp_now(), m.hook_seconds = 0;
        if (cfg->plain) memset(m.dplain, 0, sizeof(float) * m.num_params); // zero_grad
        if (mlp_forward(&m, &acts, &loss) || mlp_backward(&m, &acts)) goto done;
        t1 = fsdp_now();
        if (cfg->plain) plain_update(&opt, m.plain, m.dplain, m.num_params);
        else if (fsdp_step(ctx, 0, NULL) || fsdp_zero_grad(ctx)) {
            fprintf(stderr, "%s rank %d: %s\n", cfg->name, rank, fsdp_last_error(ctx));
            goto done;
        }
        t2 = fsdp_now();
        ms[s] = 1e3 * (t2 - t0);
        wait_ms[s] = 1e3 * (m.hook_seconds + t2 - t1);
        update_ms[s] = 1e3 * (t2 - t1);
    }
    // the global mean loss of the last step; the comm thread is idle after fsdp_step
    if (ctx && fsdp_all_reduce(comm, &loss, &loss, 1, FSDP_F32, FSDP_AVG)) goto done;
    {
        rank_result *r = &j->out[rank];
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        r->ms = median(ms + o->warmup, o->steps);
        r->wait_ms = median(wait_ms + o->warmup, o->steps);
        r->update_ms = median(update_ms + o->warmup, o->steps);
        r->rss = 1024.0 * (double)ru.ru_maxrss;
        if (ctx) {
            fsdp_memory_stats st;
            fsdp_memory_stats_get(ctx, &st);
            r->state = (double)st.peak_bytes;
        }
        r->loss = loss;
        r->done = 1;
    }
    rc = 0;
done:
    fsdp_destroy(ctx);
    mlp_acts_free(&acts);
    mlp_free(&m);
    free(opt.a);
    free(opt.b);
    free(ms);
    return rc;
}

/* ----------------------------------------------------------------------------------------- */

static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench_train: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(build/bench_train --help lists the options)\n");
    va_end(ap);
    exit(2);
}

static int arg_int(const char *flag, const char *text, int lo, int hi) {
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < lo || v > hi) die_usage("%s needs an integer in [%d, %d], got '%s'", flag, lo, hi, text);
    return (int)v;
}

static void usage(FILE *out) {
    fprintf(out,
        "usage: bench_train [options]\n"
        "Trains the MLP of mlp.c (synthetic data unless --csv) in several configurations, one after\n"
        "another, one BLAS thread per rank, and prints a table: a plain loop without fsdp.h's runtime,\n"
        "FSDP on 1 rank, and FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD on N local ranks (shm).\n"
        "\n"
        "  --hidden N       hidden width (default 1024)\n"
        "  --layers N       Linear layers (default 6)\n"
        "  --batch N        global batch, divisible by --nproc (default 512)\n"
        "  --steps N        timed steps per configuration (default 10), after --warmup N (default 2)\n"
        "  --optimizer O    sgd, adam or adamw (default adamw; lr 0.01 for sgd, else 0.001)\n"
        "  --csv FILE       data as for mlp (features, then an integer label); default synthetic blobs\n"
        "  --features N     synthetic data: features (default 256)\n"
        "  --classes N      synthetic data: classes (default 16)\n"
        "  --nproc N        ranks of the multi-rank rows (default 2)\n"
        "  --help           this text\n");
}

static void parse(options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->hidden = 1024, o->layers = 6, o->batch = 512, o->steps = 10, o->warmup = 2, o->nproc = 2;
    o->features = 256, o->classes = 16;
    o->optimizer.kind = FSDP_ADAMW;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (strncmp(f, "--", 2) != 0) die_usage("unexpected argument '%s'", f);
        if (!v) die_usage("%s needs a value", f);
        i++;
        if (!strcmp(f, "--hidden")) o->hidden = arg_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--layers")) o->layers = arg_int(f, v, 1, MLP_MAX_LAYERS);
        else if (!strcmp(f, "--batch")) o->batch = arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--steps")) o->steps = arg_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--warmup")) o->warmup = arg_int(f, v, 0, 1000000);
        else if (!strcmp(f, "--nproc")) o->nproc = arg_int(f, v, 2, MAX_RANKS);
        else if (!strcmp(f, "--features")) o->features = arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--classes")) o->classes = arg_int(f, v, 1, MLP_MAX_CLASSES);
        else if (!strcmp(f, "--csv")) o->csv = v;
        else if (!strcmp(f, "--optimizer")) {
            if (!strcmp(v, "sgd")) o->optimizer.kind = FSDP_SGD;
            else if (!strcmp(v, "adam")) o->optimizer.kind = FSDP_ADAM;
            else if (!strcmp(v, "adamw")) o->optimizer.kind = FSDP_ADAMW;
            else die_usage("--optimizer: unknown value '%s' (choose one of sgd, adam, adamw)", v);
        } else die_usage("unknown option '%s'", f);
    }
    if (o->batch % o->nproc) die_usage("--batch %d is not divisible by --nproc %d", o->batch, o->nproc);
    // every field explicit, so the plain loop and fsdp_step apply exactly the same update
    fsdp_optimizer_desc *opt = &o->optimizer;
    opt->lr = opt->kind == FSDP_SGD ? 0.01f : 1e-3f;
    if (opt->kind != FSDP_SGD) opt->beta1 = 0.9f, opt->beta2 = 0.999f, opt->eps = 1e-8f;
    opt->weight_decay = opt->kind == FSDP_ADAMW ? 0.01f : 0.0f, opt->weight_decay_set = 1;
}

int main(int argc, char **argv) {
    static const char *optimizer_names[] = {"", "SGD", "Adam", "AdamW"};
    options o;
    char err[512], names[4][32];
    parse(&o, argc, argv);
    int N = o.nproc;
    config configs[] = {
        {"plain loop (no fsdp)", 1, 1, 0, FSDP_FULL_SHARD},
        {"FSDP FULL_SHARD", 0, 1, 0, FSDP_FULL_SHARD},
        {names[0], 0, N, 0, FSDP_FULL_SHARD},
        {names[1], 0, N, 0, FSDP_SHARD_GRAD_OP},
        {names[2], 0, N, 0, FSDP_NO_SHARD},
        {names[3], 0, N, N / 2, FSDP_HYBRID_SHARD},
    };
    int num_configs = (int)(sizeof configs / sizeof configs[0]);
    snprintf(names[0], sizeof names[0], "FSDP FULL_SHARD");
    snprintf(names[1], sizeof names[1], "FSDP SHARD_GRAD_OP");
    snprintf(names[2], sizeof names[2], "FSDP NO_SHARD");
    snprintf(names[3], sizeof names[3], "FSDP HYBRID %dx%d", N / (N / 2), N / 2);
    rank_result *results = (rank_result *)mmap(NULL, sizeof(rank_result) * MAX_RANKS * (size_t)num_configs,
                                               PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED) { perror("bench_train: mmap"); return 1; }
    memset(results, 0, sizeof(rank_result) * MAX_RANKS * (size_t)num_configs);
    openblas_set_num_threads(1);
    if (o.csv ? data_csv(&o.data, o.csv, err, sizeof err)
              : data_blobs(&o.data, 8 * o.batch, o.features, o.classes, 1234)) {
        fprintf(stderr, "bench_train: %s\n", o.csv ? err : "out of memory for the synthetic data");
        return 1;
    }
    {
        mlp m;
        if (mlp_build(&m, o.data.features, o.hidden, o.layers, o.data.classes)) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }
        printf("bench_train: MLP %d -> %d x %d -> %d (%d Linear layers, %.2f M parameters), global batch %d, %s, "
               "%d timed steps after %d warmup, 1 BLAS thread per rank, shm\n", o.data.features, o.layers - 1, o.hidden,
               o.data.classes, o.layers, m.num_params / 1e6, o.batch, optimizer_names[o.optimizer.kind], o.steps, o.warmup);
        mlp_free(&m);
    }
    printf("command:");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    printf("\n\n");
    fflush(stdout);

    double busy0 = 0, total0 = 0, busy1 = 0, total1 = 0, ours = children_cpu();
    int have_cpu = machine_cpu(&busy0, &total0) == 0;
    for (int c = 0; c < num_configs; c++) {
        fsdp_launch_desc ld;
        fsdp_launch_status status;
        job j = {&o, &configs[c], results + (size_t)c * MAX_RANKS};
        memset(&ld, 0, sizeof ld);
        ld.nprocs = configs[c].nprocs;
        if (isatty(2)) fprintf(stderr, "running %-22s P=%d ...\r", configs[c].name, configs[c].nprocs);
        if (fsdp_launch_ex(&ld, run_rank, &j, &status)) {
            fprintf(stderr, "bench_train: %s P=%d: %s\n", configs[c].name, configs[c].nprocs, status.message);
            return 1;
        }
    }
    if (isatty(2)) fprintf(stderr, "%60s\r", "");
    ours = children_cpu() - ours;
    have_cpu = have_cpu && machine_cpu(&busy1, &total1) == 0;

    printf("%-22s %2s %10s %8s %10s %8s %7s %12s %13s %8s\n", "config", "P", "samples/s", "ms/step", "in fsdp ms",
           "vs plain", "vs P=1", "max RSS/rank", "fsdp peak/rk", "loss");
    double plain_rate = 0, p1_rate = 0;
    for (int c = 0; c < num_configs; c++) {
        rank_result worst = results[(size_t)c * MAX_RANKS];
        for (int r = 1; r < configs[c].nprocs; r++) { // the slowest and largest rank
            const rank_result *x = &results[(size_t)c * MAX_RANKS + r];
            if (x->ms > worst.ms) worst.ms = x->ms;
            if (x->wait_ms > worst.wait_ms) worst.wait_ms = x->wait_ms;
            if (x->rss > worst.rss) worst.rss = x->rss;
            if (x->state > worst.state) worst.state = x->state;
        }
        double rate = o.batch / (worst.ms * 1e-3);
        if (c == 0) plain_rate = rate;
        if (c == 1) p1_rate = rate;
        char wait[16], state[24], vs_p1[16];
        snprintf(wait, sizeof wait, configs[c].plain ? "-" : "%.1f", worst.wait_ms);
        snprintf(vs_p1, sizeof vs_p1, c == 0 ? "-" : "%.2fx", rate / p1_rate);
        snprintf(state, sizeof state, "%.1f MiB%s", worst.state / 1048576.0, configs[c].plain ? "*" : "");
        printf("%-22s %2d %10.0f %8.1f %10s %7.2fx %7s %8.1f MiB %13s %8.4f\n", configs[c].name, configs[c].nprocs, rate,
               worst.ms, wait, rate / plain_rate, vs_p1, worst.rss / 1048576.0, state, worst.loss);
    }
    printf("\nms/step: median over the timed steps, slowest rank; in fsdp ms: time inside the hooks, fsdp_step and fsdp_zero_grad\n"
           "(waiting for gathers and reductions, plus the optimizer update on this rank's shard; the plain loop's\n"
           "full update takes %.1f ms/step). *plain: parameters + gradients + optimizer state, no fsdp.\n",
           results[0].update_ms);
    if (have_cpu && total1 > total0) {
        double others = (busy1 - busy0 - ours) / (total1 - total0);
        printf("other processes used %.0f%% of the machine's CPU time during the runs%s\n", others > 0 ? 100 * others : 0.0,
               others > 0.05 ? ": timings are disturbed; rerun on an idle machine" : "");
    }
    data_free(&o.data);
    return 0;
}
