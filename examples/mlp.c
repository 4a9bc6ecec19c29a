/* mlp: trains a multi-layer perceptron with fsdp.h; each Linear layer is an FSDP unit.

   Build and run:  make demo            (4 local ranks, FULL_SHARD, synthetic data)
                   build/mlp --help
                   build/mlp --nproc 2 --csv data.csv --strategy SHARD_GRAD_OP
                   torchrun-style: RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... build/mlp
                   build/mlp --nproc 2 --steps 50 --save mlp.safetensors --save-every 10
                   build/mlp --nproc 4 --steps 100 --resume mlp.safetensors   (any rank count)
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
    const char *save_init, *save, *resume; // checkpoint files (safetensors), NULL: none
    int save_every;                   // 0: --save only after the last step
    fsdp_strategy strategy;
    fsdp_dtype param_dtype;
    fsdp_optimizer_kind optimizer;
    float lr, weight_decay, momentum, clip;
    int weight_decay_set;
    unsigned long long seed;
    dataset data;
} options;

static const char *optimizer_names[] = {"", "SGD", "Adam", "AdamW"};

static double median(double *v, int n) { // sorts v
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

static double mib(double bytes) { return bytes / 1048576.0; }

/* ----------------------------------------------------------------------------------------- */
/* checkpoints: one safetensors file (fsdp_save_full), parameters as layers.<i>.weight etc.,
   with --save also the optimizer state. Besides fsdp's own metadata ("step" counts optimizer
   updates, which leave out steps skipped for a non-finite gradient) the file's __metadata__
   holds what --resume needs to continue the run exactly:
       mlp.step       training steps done (loss lines and --steps count these)
       mlp.rows_seen  data rows consumed: the next global batch starts at row rows_seen mod rows
       mlp.data_rows  rows in the data it was trained on (a different count only warns)
   and "epoch" is rows_seen / data rows, the passes over the data completed. */

/* Collective: between iterations only (fsdp_save_full gathers unit by unit). Writes to a
   temporary name and renames, so an interrupted save leaves the previous file. */
static int save_checkpoint(fsdp_ctx *ctx, const options *o, const char *path, int with_optimizer, long long step,
                           long long rows_seen, int rank) {
    char text[3][32];
    fsdp_kv kv[3];
    fsdp_save_options so;
    double t = fsdp_now();
    snprintf(text[0], sizeof text[0], "%lld", step);
    snprintf(text[1], sizeof text[1], "%lld", rows_seen);
    snprintf(text[2], sizeof text[2], "%d", o->data.rows);
    kv[0].key = "mlp.step", kv[0].value = text[0];
    kv[1].key = "mlp.rows_seen", kv[1].value = text[1];
    kv[2].key = "mlp.data_rows", kv[2].value = text[2];
    memset(&so, 0, sizeof so);
    so.with_optimizer = with_optimizer;
    so.epoch = rows_seen / o->data.rows;
    so.metadata = kv;
    so.num_metadata = 3;
    if (fsdp_save_full(ctx, path, &so)) { // every rank gets the same error: rank 0 says it
        if (rank == 0) fprintf(stderr, "mlp: saving %s failed: %s\n", path, fsdp_last_error(ctx));
        return -1;
    }
    if (rank == 0)
        printf("saved %s (step %lld, %s) in %.0f ms\n", path, step,
               with_optimizer ? "parameters and optimizer state" : "parameters only", 1e3 * (fsdp_now() - t));
    return 0;
}

/* A non-negative integer from the metadata: 1 (in *value), 0 if absent, -1 if malformed. */
static int meta_int(const fsdp_st_file *f, const char *key, long long *value) {
    const char *text = fsdp_st_metadata(f, key);
    char *end;
    if (!text) return 0;
    errno = 0;
    *value = strtoll(text, &end, 10);
    return *text && !*end && !errno && *value >= 0 ? 1 : -1;
}

/* "32 -> 256 -> 8", the widths of an mlp: from a checkpoint's layers.<i>.weight (out, in) shapes
   (f not NULL), or from the model m. "" if f has no layers.0.weight. */
static void describe_widths(char *out, size_t size, const fsdp_st_file *f, const mlp *m) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; n < size; i++) {
        char name[32];
        int t;
        const fsdp_st_tensor *w;
        if (!f) {
            if (i > m->num_layers) break;
            n += (size_t)snprintf(out + n, size - n, i ? " -> %d" : "%d", m->dims[i]);
            continue;
        }
        snprintf(name, sizeof name, "layers.%d.weight", i);
        if ((t = fsdp_st_find(f, name)) < 0 || (w = fsdp_st_tensor_at(f, t))->ndim != 2) break;
        if (i == 0) n += (size_t)snprintf(out + n, size - n, "%lld", (long long)w->shape[1]);
        if (n < size) n += (size_t)snprintf(out + n, size - n, " -> %lld", (long long)w->shape[0]);
    }
}

/* fsdp_load_full's on_problem: keeps the first problem, for a short message. */
typedef struct { char first[256]; } load_problems;
static void on_load_problem(void *user, const char *kind, const char *name, const char *detail) {
    load_problems *lp = (load_problems *)user;
    char shown[128]; // the name is the file's text, raw: escaped before it is printed
    if (!lp->first[0])
        snprintf(lp->first, sizeof lp->first, "%s %s%s%s%s", kind, fsdp_printable(shown, sizeof shown, name),
                 *detail ? " (" : "", detail, *detail ? ")" : "");
}

/* Rank 0, after fsdp_load_full found the file does not fit the model: says how they differ. */
static void explain_mismatch(const options *o, const mlp *m) {
    fsdp_st_file *f = NULL;
    char err[256], saved[512] = "", ours[512];
    describe_widths(ours, sizeof ours, NULL, m);
    if (fsdp_st_open(&f, o->resume, err, sizeof err) == 0) describe_widths(saved, sizeof saved, f, NULL);
    if (!f) {} // gone meanwhile: fsdp's message above must do
    else if (!*saved) fprintf(stderr, "mlp: %s holds no layers.0.weight: not an mlp checkpoint\n", o->resume);
    else if (strcmp(saved, ours) != 0)
        fprintf(stderr, "mlp: %s holds the model %s; this run builds %s\n", o->resume, saved, ours);
    fprintf(stderr, "(--resume needs a checkpoint of the same --layers, --hidden and data features and classes, and the "
            "same --optimizer; --nproc, --strategy, --param-dtype and --batch may differ)\n");
    fsdp_st_close(f);
}

/* Where a resumed run continues; v[0] is 0 or -1 (error), so rank 0 can broadcast it whole. */
enum { RESUME_OK, RESUME_STEP, RESUME_ROWS_SEEN, RESUME_DATA_ROWS, RESUME_HAS_MLP, RESUME_N };

/* Rank 0, after fsdp_load_full succeeded: reads the run's position from the file's metadata.
   fsdp_step is the "step" fsdp_load_full reported, to notice the file being replaced meanwhile. */
static void read_resume_point(const options *o, long long fsdp_step, long long v[RESUME_N], char *err, size_t err_size) {
    fsdp_st_file *f = NULL;
    long long saved_fsdp_step = -1;
    int has_step, has_rows, has_data_rows;
    memset(v, 0, sizeof(long long) * RESUME_N);
    v[RESUME_OK] = -1;
    if (fsdp_st_open(&f, o->resume, err, err_size)) return;
    has_step = meta_int(f, "mlp.step", &v[RESUME_STEP]);
    has_rows = meta_int(f, "mlp.rows_seen", &v[RESUME_ROWS_SEEN]);
    has_data_rows = meta_int(f, "mlp.data_rows", &v[RESUME_DATA_ROWS]);
    if (meta_int(f, "step", &saved_fsdp_step) <= 0) saved_fsdp_step = -1;
    fsdp_st_close(f);
    if (has_step < 0 || has_rows < 0 || has_data_rows < 0 || has_step != has_rows ||
        has_step != has_data_rows) {
        snprintf(err, err_size, "%s: the metadata mlp.step, mlp.rows_seen and mlp.data_rows are not all non-negative "
                 "integers (the file was not written by mlp, or was edited)", o->resume);
        return;
    }
    if (saved_fsdp_step != fsdp_step) {
        snprintf(err, err_size, "%s changed while it was being loaded (step %lld, now %lld): is another run saving to it?",
                 o->resume, fsdp_step, saved_fsdp_step);
        return;
    }
    if (has_step && saved_fsdp_step > v[RESUME_STEP]) {
        snprintf(err, err_size, "%s: inconsistent metadata: %lld optimizer steps but mlp.step %lld", o->resume,
                 saved_fsdp_step, v[RESUME_STEP]);
        return;
    }
    v[RESUME_HAS_MLP] = has_step;
    if (!has_step) { // saved by another program: fsdp's step, and the data position it implies at this --batch
        v[RESUME_STEP] = saved_fsdp_step > 0 ? saved_fsdp_step : 0;
        v[RESUME_ROWS_SEEN] = v[RESUME_STEP] * o->batch;
    }
    v[RESUME_OK] = 0;
}

/* One rank's run: the model, its context and what the loop keeps of its steps. */
typedef struct {
    const options *o;
    fsdp_comm *comm;
    int rank, P, B;                   // B: rows per rank
    fsdp_ctx *ctx;
    fsdp_desc desc;
    mlp m;
    mlp_acts acts;
    double *step_ms, *wait_ms;        // per step run by this process
    long long first_step, step, rows_seen, saved_step; // rows_seen: the data position
    int timed;                        // steps run by this process
    float loss;
} trainer;

/* Builds the model and its activations and shards it (fsdp_init). */
static int setup_rank(trainer *t) {
    const options *o = t->o;
    const char *wrap_types[] = {"Linear", NULL};
    fsdp_desc *desc = &t->desc;
    openblas_set_num_threads(o->blas_threads);
    if (!t->step_ms || mlp_build(&t->m, o->data.features, o->hidden, o->layers, o->data.classes) ||
        mlp_acts_alloc(&t->acts, &t->m, t->B)) {
        fprintf(stderr, "rank %d: out of memory building the model\n", t->rank);
        return -1;
    }
    t->m.rank = t->rank;
    memset(desc, 0, sizeof *desc);
    desc->comm = t->comm;
    desc->strategy = o->strategy;
    desc->wrap.kind = FSDP_WRAP_TYPES;
    desc->wrap.types = wrap_types;
    desc->param_dtype = o->param_dtype;
    desc->fp32_compute_view = o->param_dtype != FSDP_F32; // the f32 kernels read fsdp_param
    desc->forward_prefetch = o->prefetch;
    desc->backward_prefetch = o->prefetch ? FSDP_BACKWARD_PRE : FSDP_BACKWARD_PREFETCH_NONE;
    if (o->strategy == FSDP_HYBRID_SHARD) { // on one host: two replicas of half the ranks, so something is replicated
        int local = fsdp_comm_local_size(t->comm), P = t->P;
        desc->shard_group_size = o->shard_group ? o->shard_group : local == P && P % 2 == 0 ? P / 2 : local;
    }
    desc->seed = o->seed;
    desc->optimizer.kind = o->optimizer;
    desc->optimizer.lr = o->lr;
    desc->optimizer.momentum = o->momentum;
    desc->optimizer.weight_decay = o->weight_decay;
    desc->optimizer.weight_decay_set = o->weight_decay_set;
    if (fsdp_init(&t->ctx, t->m.model, desc) != FSDP_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", t->rank, fsdp_last_error(NULL));
        return -1;
    }
    t->m.ctx = t->ctx;
    return 0;
}

/* Rank 0: the ranks, the model, the data and the optimizer. */
static void print_run(const trainer *t) {
    const options *o = t->o;
    const mlp *m = &t->m;
    int P = t->P, groups = P / (t->desc.shard_group_size ? t->desc.shard_group_size : 1);
    printf("mlp: %d rank%s (%s), %s", P, P > 1 ? "s" : "", fsdp_backend_name(fsdp_comm_backend(t->comm)),
           fsdp_strategy_name(o->strategy));
    if (o->strategy == FSDP_HYBRID_SHARD)
        printf(" (%d shard group%s of %d rank%s)", groups, groups > 1 ? "s" : "", t->desc.shard_group_size,
               t->desc.shard_group_size > 1 ? "s" : "");
    printf(", %s parameters, prefetch %s\n", fsdp_dtype_name(o->param_dtype), o->prefetch ? "on" : "off");
    printf("model: %d", m->dims[0]);
    for (int i = 1; i <= m->num_layers; i++) printf(" -> %d", m->dims[i]);
    printf(" (%d Linear layers, %zu parameters)\n", m->num_layers, m->num_params);
    printf("data: %s, %d rows, %d features, %d classes; global batch %d (%d per rank)\n",
           o->csv ? o->csv : "synthetic blobs", o->data.rows, o->data.features, o->data.classes, o->batch, t->B);
    printf("optimizer: %s, lr %g, weight decay %g, momentum %g, clip %g\n", optimizer_names[o->optimizer],
           (double)o->lr, (double)(o->weight_decay_set ? o->weight_decay : o->optimizer == FSDP_ADAMW ? 0.01f : 0.0f),
           (double)o->momentum, (double)o->clip);
    if (o->print_units) fsdp_print_units(t->ctx, NULL, NULL);
}

/* Rank 0, after a resume: where the run continues, and what differs from the saved run. */
static void print_resume_point(const trainer *t, const long long v[RESUME_N]) {
    const options *o = t->o;
    int rows = o->data.rows;
    printf("resumed from %s at step %lld (epoch %lld, next row %lld)%s\n", o->resume, t->first_step,
           t->rows_seen / rows, t->rows_seen % rows,
           t->first_step >= o->steps ? ": nothing left to train (raise --steps)" : "");
    if (!v[RESUME_HAS_MLP])
        printf("note: %s has no mlp metadata: continuing at fsdp's step %lld, data position step x --batch\n",
               o->resume, t->first_step);
    else if (v[RESUME_DATA_ROWS] != rows)
        printf("note: %s was trained on %lld data rows, this run has %d: its data position is taken modulo %d\n",
               o->resume, v[RESUME_DATA_ROWS], rows, rows);
}

/* --resume: loads the parameters and optimizer state, and agrees on where the run continues.
   Collective, before the first iteration. */
static int resume(trainer *t) {
    const options *o = t->o;
    int rank = t->rank, lrc;
    fsdp_load_options lo;
    fsdp_load_report lr;
    load_problems lp;
    long long v[RESUME_N];
    char err[512] = "";
    memset(&lo, 0, sizeof lo);
    lo.strict = 1, lo.with_optimizer = 1;
    lo.on_problem = on_load_problem, lo.user = &lp;
    lp.first[0] = 0;
    if ((lrc = fsdp_load_full(t->ctx, o->resume, &lo, &lr)) != 0) { // agreed: every rank has the message
        if (rank == 0 && lp.first[0]) // fsdp's message lists every problem; the first says enough
            fprintf(stderr, "mlp: --resume %s does not fit this model: %d tensors mis-shaped, %d missing, %d "
                    "unexpected; the first: %s\n", o->resume, lr.mismatched, lr.missing, lr.unexpected, lp.first);
        else if (rank == 0)
            fprintf(stderr, "mlp: --resume %s: %s\n", o->resume, fsdp_last_error(t->ctx));
        if (rank == 0 && lrc == FSDP_ERR_INCOMPATIBLE) explain_mismatch(o, &t->m);
        return -1;
    }
    if (rank == 0) read_resume_point(o, lr.step, v, err, sizeof err);
    if (fsdp_broadcast(t->comm, v, sizeof v / 4, FSDP_F32, 0)) { // integers, moved as bytes
        fprintf(stderr, "rank %d: broadcasting the resume point: %s\n", rank, fsdp_comm_last_error(t->comm));
        return -1;
    }
    if (v[RESUME_OK]) {
        if (rank == 0) fprintf(stderr, "mlp: --resume %s\n", err);
        return -1;
    }
    t->first_step = v[RESUME_STEP], t->rows_seen = v[RESUME_ROWS_SEEN];
    if (rank == 0) print_resume_point(t, v);
    return 0;
}

/* One training step: forward, backward, fsdp_step, the global mean loss; timed. */
static int take_step(trainer *t) {
    const options *o = t->o;
    fsdp_step_report report;
    double t0, wait0, now;
    long long step = t->step;
    int rank = t->rank;
    // global batch: rows rows_seen .. rows_seen + batch - 1 (mod rows); this rank takes part `rank` of it
    data_batch(&o->data, t->rows_seen, 1, rank * t->B, (rank + 1) * t->B, t->acts.x[0], t->acts.targets);
    t0 = fsdp_now(), t->m.hook_seconds = 0;
    if (mlp_forward(&t->m, &t->acts, &t->loss) || mlp_backward(&t->m, &t->acts)) return -1;
    wait0 = fsdp_now();
    if (fsdp_step(t->ctx, o->clip, &report) || fsdp_zero_grad(t->ctx)) {
        fprintf(stderr, "rank %d: step %lld: %s\n", rank, step + 1, fsdp_last_error(t->ctx));
        return -1;
    }
    now = fsdp_now();
    t->rows_seen += o->batch;
    t->step_ms[t->timed] = 1e3 * (now - t0);
    t->wait_ms[t->timed] = 1e3 * (t->m.hook_seconds + now - wait0); // hooks, fsdp_step (with the update), zero_grad
    t->timed++;
    // the global mean loss; safe here: fsdp_step returned, so the comm thread is idle
    if (fsdp_all_reduce(t->comm, &t->loss, &t->loss, 1, FSDP_F32, FSDP_AVG)) {
        fprintf(stderr, "rank %d: all_reduce of the loss: %s\n", rank, fsdp_comm_last_error(t->comm));
        return -1;
    }
    if (rank == 0 && (step % o->print_every == 0 || step == t->first_step || step == o->steps - 1))
        printf("step %4lld/%d  loss %.4f  grad norm %7.4f%s  %6.1f ms\n", step + 1, o->steps, (double)t->loss,
               report.grad_norm, report.skipped ? " (skipped: not finite)" : "", t->step_ms[t->timed - 1]);
    return 0;
}

/* The steps from first_step to --steps, with the --save-every checkpoints and the last --save. */
static int train_loop(trainer *t) {
    const options *o = t->o;
    for (t->step = t->first_step; t->step < o->steps; t->step++) {
        if (take_step(t)) return -1;
        // between iterations (fsdp_step returned), like the all_reduce of the loss
        if (o->save_every && (t->step + 1) % o->save_every == 0) {
            if (save_checkpoint(t->ctx, o, o->save, 1, t->step + 1, t->rows_seen, t->rank)) return -1;
            t->saved_step = t->step + 1;
        }
    }
    // step: the steps done (--steps, or the resumed step if that is further); not saved twice
    if (o->save && t->saved_step != t->step && save_checkpoint(t->ctx, o, o->save, 1, t->step, t->rows_seen, t->rank))
        return -1;
    return 0;
}

/* Rank 0: every rank's memory and time (all: 6 per rank), and the final loss and throughput. */
static void print_statistics(const trainer *t, const double *all) {
    printf("\nrank  persistent  peak unsharded  fsdp peak   max RSS   ms/step  in fsdp calls (ms/step)\n");
    for (int r = 0; r < t->P; r++) {
        const double *s = all + 6 * r;
        printf("%4d  %6.2f MiB  %10.2f MiB  %5.2f MiB  %5.1f MiB  %7.1f  %6.1f\n", r, mib(s[0]),
               mib(s[1]), mib(s[2]), mib(s[3]), s[4], s[5]);
    }
    if (t->timed)
        printf("final loss %.4f; %.0f samples/s (median step %.1f ms on rank 0)\n", (double)t->loss,
               t->o->batch / (all[4] * 1e-3), all[4]);
    else
        printf("no steps run\n");
}

/* Every rank's memory and time, gathered and printed by rank 0. Collective. */
static int report_statistics(trainer *t) {
    fsdp_memory_stats st;
    int timed = t->timed;
    double mine[6], *all = (double *)calloc((size_t)t->P * 6, sizeof(double));
    memset(&st, 0, sizeof st); // set by fsdp_memory_stats_get; zeroed so no compiler thinks it may not be
    fsdp_memory_stats_get(t->ctx, &st);
    mine[0] = (double)st.persistent_bytes, mine[1] = (double)st.peak_unsharded_bytes;
    mine[2] = (double)st.peak_bytes, mine[3] = example_peak_rss(NULL); // the rank's own peak (VmHWM)
    mine[4] = median(t->step_ms + (timed > 1), timed - (timed > 1)); // the first step warms up
    mine[5] = median(t->wait_ms + (timed > 1), timed - (timed > 1));
    if (!all || fsdp_all_gather(t->comm, mine, all, sizeof mine / 4, FSDP_F32)) { // doubles, moved as bytes
        fprintf(stderr, "rank %d: gathering the statistics failed: %s\n", t->rank, fsdp_comm_last_error(t->comm));
        free(all);
        return -1;
    }
    if (t->rank == 0) print_statistics(t, all);
    free(all);
    return 0;
}

/* What each rank runs: build the model, shard it, train, report. */
static int train(fsdp_comm *comm, void *arg) {
    trainer t;
    int rc = 1;
    memset(&t, 0, sizeof t);
    t.o = (const options *)arg;
    t.comm = comm;
    t.rank = fsdp_comm_rank(comm), t.P = fsdp_comm_size(comm), t.B = t.o->batch / t.P;
    t.step_ms = (double *)calloc(2 * (size_t)t.o->steps, sizeof(double));
    t.wait_ms = t.step_ms + t.o->steps;
    t.saved_step = -1;
    if (setup_rank(&t)) goto done;
    if (t.rank == 0) print_run(&t);
    // collectives before the first iteration: the runtime is idle
    if (t.o->save_init && save_checkpoint(t.ctx, t.o, t.o->save_init, 0, 0, 0, t.rank)) goto done;
    if (t.o->resume && resume(&t)) goto done;
    if (train_loop(&t) || report_statistics(&t)) goto done;
    rc = 0;
done:
    fsdp_destroy(t.ctx);
    mlp_acts_free(&t.acts);
    mlp_free(&t.m);
    free(t.step_ms);
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
        EXAMPLE_STRATEGY_HELP
        "  --shard-group N      hybrid: ranks per shard group (default: half the ranks when all are on one\n"
        "                       host, else the ranks per host)\n"
        "  --param-dtype D      f32 (default), bf16 or f16: what is gathered and reduced; master weights\n"
        "                       and the optimizer stay f32, the kernels read an f32 view\n"
        "  --prefetch on|off    gather the next unit during this one's compute (default on)\n"
        "  --print-units        print the FSDP units (rank 0)\n"
        "checkpoints (one safetensors file: tensors layers.<i>.weight etc., metadata with the step and the\n"
        "data position; written to a temporary name and renamed, so an interrupted save leaves the\n"
        "previous file)\n"
        "  --save-init FILE     save the initial parameters (from --seed, before any --resume), parameters\n"
        "                       only, before the first step\n"
        "  --save FILE          save the parameters and the optimizer state at the end\n"
        "  --save-every N       also save to the --save FILE after steps N, 2N, ... (default 0: only at\n"
        "                       the end)\n"
        "  --resume FILE        load FILE (strict: every tensor must match the model; with the optimizer\n"
        "                       state) and continue from its step up to --steps, at the data row where it\n"
        "                       stopped. Any --nproc, --strategy, --param-dtype, --batch; the same\n"
        "                       --layers, --hidden, --optimizer and data features and classes. With the\n"
        "                       same --nproc and the other flags unchanged, k steps + --save + --resume to\n"
        "                       n steps is bitwise the same run as n steps\n"
        "other\n"
        "  --blas-threads N     OpenBLAS threads per rank (default 1)\n"
        "  --print-every N      rank 0 prints the loss every N steps, the last step and (after --resume) the\n"
        "                       first step run (default 1)\n"
        "  --help               this text\n", MLP_MAX_LAYERS);
}

static void parse(options *o, int argc, char **argv) {
    static const char *const backends[] = {"shm", "socket", NULL};
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
        else if (!strcmp(f, "--strategy")) o->strategy = arg_strategy(f, v);
        else if (!strcmp(f, "--shard-group")) o->shard_group = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--param-dtype")) o->param_dtype = (fsdp_dtype)arg_choice(f, v, dtypes, FSDP_F32);
        else if (!strcmp(f, "--prefetch")) o->prefetch = arg_choice(f, v, onoff, 0);
        else if (!strcmp(f, "--blas-threads")) o->blas_threads = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--print-every")) o->print_every = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--save-init")) o->save_init = v;
        else if (!strcmp(f, "--save")) o->save = v;
        else if (!strcmp(f, "--save-every")) o->save_every = (int)arg_int(f, v, 0, 100000000);
        else if (!strcmp(f, "--resume")) o->resume = v;
        else die_usage("unknown option '%s'", f);
    }
    if (o->save_every && !o->save) die_usage("--save-every needs --save FILE (where to save)");
    if (o->save_init && o->save && !strcmp(o->save_init, o->save))
        die_usage("--save-init and --save name the same file '%s': --save would overwrite the initial parameters", o->save);
    if (!lr_set) o->lr = o->optimizer == FSDP_SGD ? 0.1f : 1e-3f;
    if (!(o->lr > 0)) die_usage("--lr must be > 0");
    if (o->momentum >= 1) die_usage("--momentum must be below 1");
}

/* What fsdp_init would reject, said before any rank starts. */
static int check_ranks(const void *arg, int P) {
    const options *o = (const options *)arg;
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
    example_program = "mlp";
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
    rc = example_run(o.nproc, o.backend, 0, check_ranks, train, &o);
    data_free(&o.data);
    return rc ? 1 : 0;
}
