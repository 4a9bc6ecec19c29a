/* mlp: trains a multi-layer perceptron with fsdp.h; each Linear layer is an FSDP unit.

   Build and run:  make demo            (4 local ranks, FULL_SHARD, synthetic data)
                   build/mlp --help
                   build/mlp --nproc 2 --csv data.csv --strategy grad_op
                   torchrun-style: RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... build/mlp
   The model, the layers and the data loading are in mlp_model.h (shared with bench_train.c). */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "mlp_model.h"

typedef struct {
    int nproc;                        // 0: ranks from the environment
    fsdp_backend_kind backend;
    const char *csv;
    int samples, features, classes;   // synthetic data
    int hidden, layers, batch, steps, print_every, blas_threads, shard_group, prefetch, print_units;
    fsdp_strategy strategy;
    fsdp_dtype param_dtype;
    fsdp_optimizer_kind optimizer;
    float lr, weight_decay, momentum, clip;
    int weight_decay_set;
    unsigned long long seed;
    dataset data;
} options;

static const char *strategy_names[] = {"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
static const char *optimizer_names[] = {"", "SGD", "Adam", "AdamW"};

static double median(double *v, int n) { // sorts v
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

static double mib(double bytes) { return bytes / 1048576.0; }

/* What each rank runs: build the model, shard it, train, report. */
static int train(fsdp_comm *comm, void *arg) {
    const options *o = (const options *)arg;
    const dataset *data = &o->data;
    int rank = fsdp_comm_rank(comm), P = fsdp_comm_size(comm), B = o->batch / P, rc = 1;
    const char *wrap_types[] = {"Linear", NULL};
    double *step_ms = (double *)calloc(2 * (size_t)o->steps, sizeof(double)), *wait_ms = step_ms + o->steps;
    float loss = 0;
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    mlp m;
    mlp_acts acts;
    memset(&m, 0, sizeof m);
    memset(&acts, 0, sizeof acts);

    openblas_set_num_threads(o->blas_threads);
    if (!step_ms || mlp_build(&m, data->features, o->hidden, o->layers, data->classes) ||
        mlp_acts_alloc(&acts, &m, B)) {
        fprintf(stderr, "rank %d: out of memory building the model\n", rank);
        goto done;
    }
    m.rank = rank;
    memset(&desc, 0, sizeof desc);
    desc.comm = comm;
    desc.strategy = o->strategy;
    desc.wrap.kind = FSDP_WRAP_TYPES;
    desc.wrap.types = wrap_types;
    desc.param_dtype = o->param_dtype;
    desc.fp32_compute_view = o->param_dtype != FSDP_F32; // the f32 kernels read fsdp_param
    desc.forward_prefetch = o->prefetch;
    desc.backward_prefetch = o->prefetch ? FSDP_BACKWARD_PRE : FSDP_BACKWARD_PREFETCH_NONE;
    if (o->strategy == FSDP_HYBRID_SHARD) { // on one host: two replicas of half the ranks, so something is replicated
        int local = fsdp_comm_local_size(comm);
        desc.shard_group_size = o->shard_group ? o->shard_group : local == P && P % 2 == 0 ? P / 2 : local;
    }
    desc.seed = o->seed;
    desc.optimizer.kind = o->optimizer;
    desc.optimizer.lr = o->lr;
    desc.optimizer.momentum = o->momentum;
    desc.optimizer.weight_decay = o->weight_decay;
    desc.optimizer.weight_decay_set = o->weight_decay_set;
    if (fsdp_init(&ctx, m.model, &desc) != FSDP_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", rank, fsdp_last_error(NULL));
        goto done;
    }
    m.ctx = ctx;
    if (rank == 0) {
        printf("mlp: %d rank%s (%s), %s", P, P > 1 ? "s" : "", fsdp_backend_name(fsdp_comm_backend(comm)),
               strategy_names[o->strategy]);
        if (o->strategy == FSDP_HYBRID_SHARD)
            printf(" (%d shard group%s of %d rank%s)", P / desc.shard_group_size, P / desc.shard_group_size > 1 ? "s" : "",
                   desc.shard_group_size, desc.shard_group_size > 1 ? "s" : "");
        printf(", %s parameters, prefetch %s\n", fsdp_dtype_name(o->param_dtype), o->prefetch ? "on" : "off");
        printf("model: %d", m.dims[0]);
        for (int i = 1; i <= m.num_layers; i++) printf(" -> %d", m.dims[i]);
        printf(" (%d Linear layers, %zu parameters)\n", m.num_layers, m.num_params);
        printf("data: %s, %d rows, %d features, %d classes; global batch %d (%d per rank)\n",
               o->csv ? o->csv : "synthetic blobs", data->rows, data->features, data->classes, o->batch, B);
        printf("optimizer: %s, lr %g, weight decay %g, momentum %g, clip %g\n", optimizer_names[o->optimizer],
               (double)o->lr, (double)(o->weight_decay_set ? o->weight_decay : o->optimizer == FSDP_ADAMW ? 0.01f : 0.0f),
               (double)o->momentum, (double)o->clip);
        if (o->print_units) fsdp_print_units(ctx, NULL, NULL);
    }

    for (int step = 0; step < o->steps; step++) {
        fsdp_step_report report;
        double t0, wait0, t;
        data_batch(data, step, o->batch, rank * B, (rank + 1) * B, acts.x[0], acts.targets);
        t0 = fsdp_now(), m.hook_seconds = 0;
        if (mlp_forward(&m, &acts, &loss) || mlp_backward(&m, &acts)) goto done;
        wait0 = fsdp_now();
        if (fsdp_step(ctx, o->clip, &report) || fsdp_zero_grad(ctx)) {
            fprintf(stderr, "rank %d: step %d: %s\n", rank, step + 1, fsdp_last_error(ctx));
            goto done;
        }
        t = fsdp_now();
        step_ms[step] = 1e3 * (t - t0);
        wait_ms[step] = 1e3 * (m.hook_seconds + t - wait0); // hooks, fsdp_step (with the update), zero_grad
        // the global mean loss; safe here: fsdp_step returned, so the comm thread is idle
        if (fsdp_all_reduce(comm, &loss, &loss, 1, FSDP_F32, FSDP_AVG)) {
            fprintf(stderr, "rank %d: all_reduce of the loss: %s\n", rank, fsdp_comm_last_error(comm));
            goto done;
        }
        if (rank == 0 && (step % o->print_every == 0 || step == o->steps - 1))
            printf("step %4d/%d  loss %.4f  grad norm %7.4f%s  %6.1f ms\n", step + 1, o->steps, (double)loss,
                   report.grad_norm, report.skipped ? " (skipped: not finite)" : "", step_ms[step]);
    }

    { // every rank's memory and time, printed by rank 0
        fsdp_memory_stats st;
        struct rusage ru;
        double mine[6], *all = (double *)calloc((size_t)P * 6, sizeof(double));
        fsdp_memory_stats_get(ctx, &st);
        getrusage(RUSAGE_SELF, &ru);
        mine[0] = (double)st.persistent_bytes, mine[1] = (double)st.peak_unsharded_bytes;
        mine[2] = (double)st.peak_bytes, mine[3] = 1024.0 * (double)ru.ru_maxrss;
        mine[4] = median(step_ms + (o->steps > 1), o->steps - (o->steps > 1)); // the first step warms up
        mine[5] = median(wait_ms + (o->steps > 1), o->steps - (o->steps > 1));
        if (!all || fsdp_all_gather(comm, mine, all, sizeof mine / 4, FSDP_F32)) { // doubles, moved as bytes
            fprintf(stderr, "rank %d: gathering the statistics failed: %s\n", rank, fsdp_comm_last_error(comm));
            free(all);
            goto done;
        }
        if (rank == 0) {
            printf("\nrank  persistent  peak unsharded  fsdp peak   max RSS   ms/step  in fsdp calls (ms/step)\n");
            for (int r = 0; r < P; r++) {
                double *s = all + 6 * r;
                printf("%4d  %6.2f MiB  %10.2f MiB  %5.2f MiB  %5.1f MiB  %7.1f  %6.1f\n", r, mib(s[0]),
                       mib(s[1]), mib(s[2]), mib(s[3]), s[4], s[5]);
            }
            printf("final loss %.4f; %.0f samples/s (median step %.1f ms on rank 0)\n", (double)loss,
                   o->batch / (all[4] * 1e-3), all[4]);
        }
        free(all);
    }
    rc = 0;
done:
    fsdp_destroy(ctx);
    mlp_acts_free(&acts);
    mlp_free(&m);
    free(step_ms);
    return rc;
}

static void usage(FILE *out) {
    fprintf(out,
        "usage: mlp [options]\n"
        "Trains a multi-layer perceptron (Linear, ReLU, ..., Linear; mean softmax cross-entropy over the\n"
        "global batch) with fsdp.h. Each Linear layer is an FSDP unit; names as PyTorch: layers.<i>.weight.\n"
        "\n"
        "ranks\n"
        "  --nproc N            fork N local ranks (default: read the job from the environment: torchrun's\n"
        "                       RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT, SLURM or mpirun,\n"
        "                       backend from FSDP_BACKEND; with no such variables, 1 rank)\n"
        "  --backend B          with --nproc: shm (shared memory, default) or socket (TCP on loopback)\n"
        "data (batches in file order, wrapping around; rank r takes part r of each global batch)\n"
        "  --csv FILE           numeric features, integer class label (0, 1, ...) in the last column,\n"
        "                       optional header line; used as is (no scaling)\n"
        "  --samples N          synthetic Gaussian blobs, fixed seed: rows (default 4096)\n"
        "  --features N         ... features (default 32)\n"
        "  --classes N          ... classes (default 8)\n"
        "model\n"
        "  --hidden N           width of the hidden layers (default 256)\n"
        "  --layers N           number of Linear layers, 1..%d (default 4)\n"
        "  --seed N             seed of the initial weights (default 0)\n"
        "training\n"
        "  --batch N            global batch, divisible by the number of ranks (default 256)\n"
        "  --steps N            optimizer steps (default 100)\n"
        "  --optimizer O        sgd, adam or adamw (default adamw)\n"
        "  --lr X               learning rate (default 0.1 for sgd, 0.001 for adam and adamw)\n"
        "  --weight-decay X     default as PyTorch: 0.01 for adamw, 0 otherwise\n"
        "  --momentum X         sgd momentum (default 0)\n"
        "  --clip X             clip the global gradient norm to X (default 0: off)\n"
        "fsdp\n"
        "  --strategy S         full (FULL_SHARD, default), grad_op (SHARD_GRAD_OP), no_shard (NO_SHARD),\n"
        "                       hybrid (HYBRID_SHARD)\n"
        "  --shard-group N      hybrid: ranks per shard group (default: half the ranks when all are on one\n"
        "                       host, else the ranks per host)\n"
        "  --param-dtype D      f32 (default), bf16 or f16: what is gathered and reduced; master weights\n"
        "                       and the optimizer stay f32, the kernels read an f32 view\n"
        "  --prefetch on|off    gather the next unit during this one's compute (default on)\n"
        "  --print-units        print the FSDP units (rank 0)\n"
        "other\n"
        "  --blas-threads N     OpenBLAS threads per rank (default 1)\n"
        "  --print-every N      rank 0 prints the loss every N steps (default 1)\n"
        "  --help               this text\n", MLP_MAX_LAYERS);
}

static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mlp: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(build/mlp --help lists the options)\n");
    va_end(ap);
    exit(2);
}

static long arg_int(const char *flag, const char *text, long lo, long hi) {
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < lo || v > hi) die_usage("%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, text);
    return v;
}

static float arg_float(const char *flag, const char *text) {
    char *end;
    double v = strtod(text, &end);
    if (!*text || *end || !(v >= 0) || !isfinite(v)) die_usage("%s needs a number >= 0, got '%s'", flag, text);
    return (float)v;
}

static int arg_choice(const char *flag, const char *text, const char *const *names, int first) {
    char list[128] = "";
    for (int i = 0; names[i]; i++) {
        if (strcmp(text, names[i]) == 0) return first + i;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    }
    die_usage("%s: unknown value '%s' (choose one of %s)", flag, text, list);
    return 0;
}

static void parse(options *o, int argc, char **argv) {
    static const char *const backends[] = {"shm", "socket", NULL}, *const strategies[] = {"full", "grad_op", "no_shard", "hybrid", NULL};
    static const char *const dtypes[] = {"f32", "bf16", "f16", NULL}, *const optimizers[] = {"sgd", "adam", "adamw", NULL};
    static const char *const onoff[] = {"off", "on", NULL};
    int lr_set = 0;
    memset(o, 0, sizeof *o);
    o->backend = FSDP_BACKEND_SHM, o->samples = 4096, o->features = 32, o->classes = 8, o->hidden = 256, o->layers = 4;
    o->batch = 256, o->steps = 100, o->print_every = 1, o->blas_threads = 1, o->prefetch = 1;
    o->strategy = FSDP_FULL_SHARD, o->param_dtype = FSDP_F32, o->optimizer = FSDP_ADAMW;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(f, "--print-units")) { o->print_units = 1; continue; }
        if (strncmp(f, "--", 2) != 0) die_usage("unexpected argument '%s'", f);
        if (!v) die_usage("%s needs a value", f);
        i++;
        if (!strcmp(f, "--nproc")) o->nproc = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--backend")) o->backend = (fsdp_backend_kind)arg_choice(f, v, backends, FSDP_BACKEND_SHM);
        else if (!strcmp(f, "--csv")) o->csv = v;
        else if (!strcmp(f, "--samples")) o->samples = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--features")) o->features = (int)arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--classes")) o->classes = (int)arg_int(f, v, 1, MLP_MAX_CLASSES);
        else if (!strcmp(f, "--hidden")) o->hidden = (int)arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--layers")) o->layers = (int)arg_int(f, v, 1, MLP_MAX_LAYERS);
        else if (!strcmp(f, "--seed")) o->seed = (unsigned long long)arg_int(f, v, 0, 0x7fffffffL);
        else if (!strcmp(f, "--batch")) o->batch = (int)arg_int(f, v, 1, 1 << 24);
        else if (!strcmp(f, "--steps")) o->steps = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--optimizer")) o->optimizer = (fsdp_optimizer_kind)arg_choice(f, v, optimizers, FSDP_SGD);
        else if (!strcmp(f, "--lr")) o->lr = arg_float(f, v), lr_set = 1;
        else if (!strcmp(f, "--weight-decay")) o->weight_decay = arg_float(f, v), o->weight_decay_set = 1;
        else if (!strcmp(f, "--momentum")) o->momentum = arg_float(f, v);
        else if (!strcmp(f, "--clip")) o->clip = arg_float(f, v);
        else if (!strcmp(f, "--strategy")) o->strategy = (fsdp_strategy)arg_choice(f, v, strategies, FSDP_FULL_SHARD);
        else if (!strcmp(f, "--shard-group")) o->shard_group = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--param-dtype")) o->param_dtype = (fsdp_dtype)arg_choice(f, v, dtypes, FSDP_F32);
        else if (!strcmp(f, "--prefetch")) o->prefetch = arg_choice(f, v, onoff, 0);
        else if (!strcmp(f, "--blas-threads")) o->blas_threads = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--print-every")) o->print_every = (int)arg_int(f, v, 1, 100000000);
        else die_usage("unknown option '%s'", f);
    }
    if (!lr_set) o->lr = o->optimizer == FSDP_SGD ? 0.1f : 1e-3f;
    if (!(o->lr > 0)) die_usage("--lr must be > 0");
    if (o->momentum >= 1) die_usage("--momentum must be below 1");
}

/* What fsdp_init would reject, said before any rank starts. */
static int check_ranks(const options *o, int P) {
    if (o->batch % P) {
        fprintf(stderr, "mlp: --batch %d is not divisible by the %d ranks: each rank takes an equal part of the "
                "global batch; use a multiple of %d (e.g. --batch %d)\n", o->batch, P, P, (o->batch / P + 1) * P);
        return 1;
    }
    if (o->shard_group && (o->shard_group > P || P % o->shard_group)) {
        fprintf(stderr, "mlp: --shard-group %d does not divide the %d ranks into equal shard groups\n", o->shard_group, P);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    char err[512];
    int rc;
    parse(&o, argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0); // ranks share stdout: whole lines
    openblas_set_num_threads(o.blas_threads); // before forking: no idle BLAS threads in the parent
    if (o.csv ? data_csv(&o.data, o.csv, err, sizeof err) : data_blobs(&o.data, o.samples, o.features, o.classes, 1234)) {
        fprintf(stderr, "mlp: %s\n", o.csv ? err : "out of memory for the synthetic data");
        return 1;
    }
    if (o.nproc || !(getenv("RANK") || getenv("SLURM_PROCID") || getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK"))) {
        fsdp_launch_desc ld;
        fsdp_launch_status status;
        memset(&ld, 0, sizeof ld);
        ld.nprocs = o.nproc ? o.nproc : 1;
        ld.backend = o.backend;
        if ((rc = check_ranks(&o, ld.nprocs)) == 0 && (rc = fsdp_launch_ex(&ld, train, &o, &status)) != 0)
            fprintf(stderr, "mlp: %s\n", status.message);
    } else {
        fsdp_comm *comm;
        if ((rc = fsdp_comm_init_from_env(&comm, NULL, err, sizeof err)) != 0)
            fprintf(stderr, "mlp: %s\n(or run local ranks with --nproc N)\n", err);
        else {
            rc = check_ranks(&o, fsdp_comm_size(comm)) || train(comm, &o);
            fsdp_comm_destroy(comm);
        }
    }
    data_free(&o.data);
    return rc ? 1 : 0;
}
