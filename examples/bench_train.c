/* bench_train: what fsdp.h costs and gains when training the MLP of mlp_model.h or the GPT of
   gpt_model.h on this machine.

   Speed (the default): one after another, each in fresh processes (so peak memory is per
   configuration), one BLAS thread per rank:
     plain     the same forward/backward kernels on plain arrays with the same optimizer update;
               no fsdp runtime at all (no context, hooks or communicator)
     FSDP P=1  FULL_SHARD on one rank
     plain xN  N plain loops side by side, each on its B/N of the batch, with no communication at
               all (N separate models): the most N ranks can get from this machine, the ceiling
               for the P = N rows (cores that slow down when both are busy, shared caches)
     FSDP P=N  FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD (shard groups of N/2 ranks)
   For each: samples/s (MLP) or tokens/s (GPT) and ms/step (median over the steps after warmup),
   the time the compute thread spends inside the fsdp calls (hooks, fsdp_step with its sharded
   optimizer update, fsdp_zero_grad: exposed communication plus the update), peak RSS and
   fsdp's peak bytes.

   Memory (--memory): FULL_SHARD and NO_SHARD at P = 1, 2, 4, a few steps each; rank 0's peak
   RSS and fsdp_memory_stats against fsdp_memory_estimate for the same model, desc and world size.
   Then, for the GPT, activation checkpointing (gpt --recompute: none, every block, every 2nd
   block): activation bytes and step time against none; and for either model, the model frozen
   and run forward only (a distillation teacher): persistent bytes per parameter.

   Offload (--offload DIR): FULL_SHARD on --nproc ranks with nothing, the optimizer state (f32,
   then bf16), and everything on disk under DIR: ms/step against none, the bytes every rank read
   and wrote per step, the disk's bandwidth through fsdp.h's own I/O path (fsdp_offload_bandwidth),
   the compute-only step (the same training with nothing offloaded) and the roofline ratio
   step / max(compute-only, bytes / bandwidth); peak RSS and disk bytes per rank.

   Tracing (--trace DIR): FULL_SHARD on --nproc ranks with tracing off and on (FSDP_TRACE's files
   under DIR), interleaved over --rounds: ms/step of each, their ratio, and the trace's bytes per step.

   Checkpoints (--ckpt DIR): FULL_SHARD on --nproc ranks without saves, with a sharded save (with
   the optimizer state) every --save-every steps, and with an asynchronous one
   (fsdp_save_sharded_async) as often, interleaved over --rounds: the mean step time (the saves
   included) against none, and the time a rank is blocked per save. One more save at the last
   warmup step, untimed: a first save allocates what later ones reuse (the snapshot buffer).

   Build and run: make bench && build/bench_train [--model gpt] [--memory | --offload DIR | --trace DIR | --ckpt DIR] */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "mlp_model.h"

/* gpt_model.h was written for gpt.c: three of its functions have the names of mlp_model.h's, and
   its learning-rate schedule has no use here (a constant rate keeps the plain loop's update equal
   to fsdp_step's). */
#define data_batch text_batch
#define softmax_crossentropy_forward gpt_softmax_crossentropy_forward
#define softmax_crossentropy_backward gpt_softmax_crossentropy_backward
#if defined(__GNUC__) || defined(__clang__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "gpt_model.h"
#if defined(__GNUC__) || defined(__clang__)
#  pragma GCC diagnostic pop
#endif
#undef data_batch
#undef softmax_crossentropy_forward
#undef softmax_crossentropy_backward

#define MAX_RANKS 16

typedef enum { MODEL_MLP, MODEL_GPT } model_kind;

typedef struct {
    model_kind model;
    int memory;                       // --memory: the memory table instead of the speed table
    const char *offload_dir;          // --offload DIR: the offload table
    const char *trace_dir;            // --trace DIR: the tracing table
    const char *ckpt_dir;             // --ckpt DIR: the checkpoint table
    int save_every;                   // --save-every N (the checkpoint table)
    int layers, batch, steps, warmup, nproc;
    int hidden, features, classes;    // MLP
    const char *csv;
    dataset data;
    int channels, heads, seq_len;     // GPT
    const char *text_path;
    unsigned char *text;
    size_t text_size;
    char text_name[1300];
    fsdp_optimizer_desc optimizer;
    int torch, rounds;                // --torch: PyTorch rows and bf16/f16 rows; --rounds
    const char *torch_python;
    const char *torch_coretype;       // --torch-coretype: also PyTorch rows with this OPENBLAS_CORETYPE
    char torch_script[1200];          // tests/torch_gpt.py of this source tree
} options;

typedef struct {
    const char *name;
    int plain, nprocs, shard_group;
    fsdp_strategy strategy;
    fsdp_dtype param_dtype;           // 0: f32
    int torch;                        // a PyTorch row (tests/torch_gpt.py bench): eager, or DDP over gloo
    const char *coretype;             // PyTorch rows: OPENBLAS_CORETYPE for its BLAS (NULL: OpenBLAS's own choice)
    int recompute;                    // GPT: activation checkpointing of every k-th block (0: off)
    int frozen;                       // every parameter frozen, forward only (a distillation teacher)
    fsdp_offload_desc offload;        // the offload table: what is on disk (dir: options.offload_dir)
    fsdp_dtype state_dtype;           // the optimizer state's dtype (0: f32)
    int trace;                        // the tracing table: FSDP traces written under options.trace_dir
    int save;                         // the checkpoint table: 1 fsdp_save_sharded, 2 fsdp_save_sharded_async
    fsdp_wire param_wire;             // the speed table's int8 row: quantized parameter gathers (0: param_dtype)
    fsdp_wire grad_wire;              // its grad-wire rows: quantized gradients between hosts (0: reduce_dtype)
    int error_feedback;
} config;
// a config's last fields: nothing offloaded, f32 state, no trace or saves, param_dtype gathers and reductions
#define IN_RAM {0, 0, 0, NULL, 0, 0}, FSDP_F32, 0, 0, FSDP_WIRE_DEFAULT, FSDP_WIRE_DEFAULT, 0

typedef struct {       // what a rank reports, through shared memory
    int done;
    double ms, wait_ms, update_ms, rss, state, loss;
    double persistent, peak_unsharded, est_persistent, est_peak_unsharded, activations; // bytes
    double read_bytes, written_bytes, disk_bytes;  // the offload: per timed step, and the file's size
    double mean_ms, save_ms;                       // mean step (saves included); median blocked time per save
    char torch_version[32];  // PyTorch rows
} rank_result;

typedef struct {
    const options *o;
    const config *cfg;
    rank_result *out; // [MAX_RANKS], MAP_SHARED
} job;

/* ----------------------------------------------------------------------------------------- */
/* the model under test: everything below goes through these, whichever model it is */

typedef struct {
    const options *o;
    int B;             // local batch (samples or sequences)
    mlp mlp_net;
    mlp_acts mlp_act;
    gpt gpt_net;
    gpt_acts gpt_act;
} bench_model;

static const char *model_unit_type(const options *o) { return o->model == MODEL_GPT ? "Block" : "Linear"; }

/* Items a global batch trains on: samples (MLP) or tokens (GPT). */
static double items_per_step(const options *o) { return (double)o->batch * (o->model == MODEL_GPT ? o->seq_len : 1); }

/* The description only (names, shapes, init rules): enough for the header line and the estimate. */
static int model_build(bench_model *bm, const options *o) {
    memset(bm, 0, sizeof *bm);
    bm->o = o;
    if (o->model == MODEL_GPT) {
        gpt_config c = {256, o->seq_len, o->layers, o->heads, o->channels};
        return gpt_build(&bm->gpt_net, c);
    }
    return mlp_build(&bm->mlp_net, o->data.features, o->hidden, o->layers, o->data.classes);
}

/* recompute: the GPT's activation checkpointing (every k-th block; 0: off); with_grads 0: forward only. */
static int model_acts_alloc(bench_model *bm, int B, int recompute, int with_grads) {
    bm->B = B;
    if (bm->o->model == MODEL_GPT)
        return gpt_acts_alloc_ex(&bm->gpt_act, &bm->gpt_net.config, B, bm->o->seq_len, recompute, with_grads);
    return mlp_acts_alloc(&bm->mlp_act, &bm->mlp_net, B);
}

static fsdp_model *model_desc(const bench_model *bm) {
    return bm->o->model == MODEL_GPT ? bm->gpt_net.model : bm->mlp_net.model;
}
static size_t model_num_params(const bench_model *bm) {
    return bm->o->model == MODEL_GPT ? bm->gpt_net.num_params : bm->mlp_net.num_params;
}
static double *model_hook_seconds(bench_model *bm) {
    return bm->o->model == MODEL_GPT ? &bm->gpt_net.hook_seconds : &bm->mlp_net.hook_seconds;
}
static size_t model_activation_bytes(const bench_model *bm) {
    if (bm->o->model == MODEL_GPT) return sizeof(float) * bm->gpt_act.num_floats;
    return sizeof(float) * (2 * bm->mlp_act.grad_floats + (size_t)bm->B * (size_t)bm->o->data.classes);
}

/* The no-fsdp baseline: every parameter and its gradient in one plain buffer each. */
static int model_plain_init(bench_model *bm, float **params, float **grads) {
    int rc = bm->o->model == MODEL_GPT ? gpt_plain_init(&bm->gpt_net, 0) : mlp_plain_init(&bm->mlp_net, 0);
    *params = bm->o->model == MODEL_GPT ? bm->gpt_net.plain : bm->mlp_net.plain;
    *grads = bm->o->model == MODEL_GPT ? bm->gpt_net.dplain : bm->mlp_net.dplain;
    return rc;
}

static void model_attach(bench_model *bm, fsdp_ctx *ctx, int rank) {
    bm->gpt_net.ctx = bm->mlp_net.ctx = ctx;
    bm->gpt_net.rank = bm->mlp_net.rank = rank;
}

/* This rank's part [lo, hi) of global batch `step`. */
static void model_batch(bench_model *bm, long long step, int lo, int hi) {
    const options *o = bm->o;
    if (o->model == MODEL_GPT)
        text_batch(o->text, o->text_size, step, o->batch, o->seq_len, lo, hi, bm->gpt_act.inputs, bm->gpt_act.targets);
    else
        data_batch(&o->data, step, o->batch, lo, hi, bm->mlp_act.x[0], bm->mlp_act.targets);
}

static int model_forward(bench_model *bm, float *loss) {
    if (bm->o->model == MODEL_GPT) return gpt_forward(&bm->gpt_net, &bm->gpt_act, bm->B, bm->o->seq_len, 1, loss);
    return mlp_forward(&bm->mlp_net, &bm->mlp_act, loss);
}

static int model_forward_backward(bench_model *bm, float *loss) {
    if (bm->o->model == MODEL_GPT)
        return gpt_forward(&bm->gpt_net, &bm->gpt_act, bm->B, bm->o->seq_len, 1, loss) ||
               gpt_backward(&bm->gpt_net, &bm->gpt_act, bm->B, bm->o->seq_len) ? -1 : 0;
    return mlp_forward(&bm->mlp_net, &bm->mlp_act, loss) || mlp_backward(&bm->mlp_net, &bm->mlp_act) ? -1 : 0;
}

static void model_free(bench_model *bm) {
    if (bm->o && bm->o->model == MODEL_GPT) {
        gpt_acts_free(&bm->gpt_act);
        gpt_free(&bm->gpt_net);
    } else if (bm->o) {
        mlp_acts_free(&bm->mlp_act);
        mlp_free(&bm->mlp_net);
    }
}

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

static double mib(double bytes) { return bytes / 1048576.0; }

/* One rank of one configuration: its model, its context or plain buffers, and its step times. */
typedef struct {
    const job *j;
    const options *o;
    const config *cfg;
    fsdp_comm *comm;
    int rank, P, B, total;            // B: local batch; total: warmup and timed steps
    double *ms, *wait_ms, *update_ms, *save_ms; // per step ([total] each); save_ms per timed save
    int saves;
    char save_dir[1200];              // the checkpoint table's saves
    float loss, *params, *grads;      // params, grads: the plain loop's
    size_t num_params;
    plain_optimizer opt;
    fsdp_memory_stats est;            // fsdp_memory_estimate's
    fsdp_ctx *ctx;                    // NULL: the plain loop
    bench_model bm;
    fsdp_offload_stats io0;           // at the first timed step
} rank_run;

/* The plain loop: every parameter, its gradient and the optimizer state in plain buffers. */
static int rank_setup_plain(rank_run *rr) {
    const options *o = rr->o;
    int buffers = o->optimizer.kind == FSDP_SGD ? (o->optimizer.momentum != 0.0f) : 2;
    rr->opt.o = o->optimizer;
    rr->opt.a = example_floats(rr->num_params, 1);
    rr->opt.b = example_floats(rr->num_params, 1);
    if (model_plain_init(&rr->bm, &rr->params, &rr->grads) || !rr->opt.a || !rr->opt.b) {
        fprintf(stderr, "plain: out of memory\n");
        return -1;
    }
    rr->j->out[rr->rank].state = (double)rr->num_params * sizeof(float) * (2.0 + buffers); // params, grads, optimizer
    return 0;
}

/* The model sharded as cfg says (and its memory estimated). */
static int rank_setup_fsdp(rank_run *rr) {
    const options *o = rr->o;
    const config *cfg = rr->cfg;
    const char *wrap_types[] = {model_unit_type(o), NULL};
    fsdp_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.comm = rr->comm;
    desc.strategy = cfg->strategy;
    desc.wrap.kind = FSDP_WRAP_TYPES;
    desc.wrap.types = wrap_types;
    desc.forward_prefetch = 1;
    desc.shard_group_size = cfg->shard_group;
    desc.param_dtype = cfg->param_dtype;
    desc.param_wire = cfg->param_wire;
    desc.grad_wire = cfg->grad_wire;
    desc.error_feedback = cfg->error_feedback;
    desc.fp32_compute_view = cfg->param_dtype != FSDP_DTYPE_DEFAULT && cfg->param_dtype != FSDP_F32; // f32 kernels
    desc.optimizer = o->optimizer;
    desc.optimizer.state_dtype = cfg->state_dtype;
    desc.offload = cfg->offload;
    desc.offload.dir = o->offload_dir;
    desc.trace_dir = cfg->trace ? o->trace_dir : NULL;
    if (cfg->frozen) fsdp_model_set_trainable(model_desc(&rr->bm), 0, 0); // no gradients, no optimizer state
    if (fsdp_memory_estimate(model_desc(&rr->bm), &desc, rr->P, &rr->est) ||
        fsdp_init(&rr->ctx, model_desc(&rr->bm), &desc)) {
        fprintf(stderr, "%s rank %d: %s\n", cfg->name, rr->rank, fsdp_last_error(NULL));
        return -1;
    }
    model_attach(&rr->bm, rr->ctx, rr->rank);
    return 0;
}

/* The checkpoint table: a save at the first timed step and every save_every steps from there, so
   that each save's writing behind the training lies inside the timed steps (and one at the last
   warmup step: the first save allocates what later ones reuse, e.g. the snapshot buffer of
   asynchronous saves, a cost a long run pays once). */
static int rank_save(rank_run *rr, int s) {
    const options *o = rr->o;
    fsdp_save_options so;
    double ts;
    if (!(s == o->warmup - 1 || (s >= o->warmup && (s - o->warmup) % o->save_every == 0))) return 0;
    ts = fsdp_now();
    memset(&so, 0, sizeof so);
    so.with_optimizer = 1;
    if ((rr->cfg->save == 2 ? fsdp_save_sharded_async : fsdp_save_sharded)(rr->ctx, rr->save_dir, &so)) {
        fprintf(stderr, "%s rank %d: saving to %s: %s\n", rr->cfg->name, rr->rank, rr->save_dir, fsdp_last_error(rr->ctx));
        return -1;
    }
    if (s >= o->warmup) rr->save_ms[rr->saves++] = 1e3 * (fsdp_now() - ts);
    return 0;
}

/* Step s (warmup or timed): forward (and backward), the update, the table's save; timed. */
static int rank_step(rank_run *rr, int s) {
    const options *o = rr->o;
    const config *cfg = rr->cfg;
    double t0, t1, t2;
    if (s == o->warmup && rr->ctx) fsdp_offload_stats_get(rr->ctx, &rr->io0);
    // N plain loops (no communication at all) start their timed steps together, so that they run
    // side by side: what the machine itself allows N ranks on B/N each
    if (cfg->plain && rr->P > 1 && s == o->warmup && fsdp_barrier(rr->comm)) {
        fprintf(stderr, "%s rank %d: %s\n", cfg->name, rr->rank, fsdp_last_error(NULL));
        return -1;
    }
    model_batch(&rr->bm, s, rr->rank * rr->B, (rr->rank + 1) * rr->B);
    t0 = fsdp_now(), *model_hook_seconds(&rr->bm) = 0;
    if (cfg->plain) memset(rr->grads, 0, sizeof(float) * rr->num_params); // zero_grad
    if (cfg->frozen ? model_forward(&rr->bm, &rr->loss) : model_forward_backward(&rr->bm, &rr->loss)) return -1;
    t1 = fsdp_now();
    if (cfg->plain) plain_update(&rr->opt, rr->params, rr->grads, rr->num_params);
    else if (cfg->frozen ? fsdp_finish_backward(rr->ctx) : fsdp_step(rr->ctx, 0, NULL) || fsdp_zero_grad(rr->ctx)) {
        fprintf(stderr, "%s rank %d: %s\n", cfg->name, rr->rank, fsdp_last_error(rr->ctx));
        return -1;
    }
    if (cfg->save && rank_save(rr, s)) return -1;
    t2 = fsdp_now();
    rr->ms[s] = 1e3 * (t2 - t0);
    rr->wait_ms[s] = 1e3 * (*model_hook_seconds(&rr->bm) + t2 - t1);
    rr->update_ms[s] = 1e3 * (t2 - t1);
    return 0;
}

/* The rank's result: median times, memory, the offload's bytes per timed step, the loss. */
static void rank_report(rank_run *rr) {
    const options *o = rr->o;
    rank_result *r = &rr->j->out[rr->rank];
    r->mean_ms = 0;
    for (int s = o->warmup; s < rr->total; s++) r->mean_ms += rr->ms[s] / o->steps;
    r->save_ms = median(rr->save_ms, rr->saves);
    r->ms = median(rr->ms + o->warmup, o->steps);
    r->wait_ms = median(rr->wait_ms + o->warmup, o->steps);
    r->update_ms = median(rr->update_ms + o->warmup, o->steps);
    r->rss = example_peak_rss(NULL); // this rank's own peak (VmHWM)
    r->activations = (double)model_activation_bytes(&rr->bm);
    if (rr->ctx) {
        fsdp_memory_stats st;
        fsdp_offload_stats io1;
        memset(&st, 0, sizeof st), memset(&io1, 0, sizeof io1); // st: so no compiler thinks it may stay unset
        fsdp_offload_stats_get(rr->ctx, &io1);
        r->read_bytes = (double)(io1.bytes_read - rr->io0.bytes_read) / o->steps;
        r->written_bytes = (double)(io1.bytes_written - rr->io0.bytes_written) / o->steps;
        fsdp_memory_stats_get(rr->ctx, &st);
        r->disk_bytes = (double)st.disk_bytes;
        r->state = (double)st.peak_bytes;
        r->persistent = (double)st.persistent_bytes, r->peak_unsharded = (double)st.peak_unsharded_bytes;
        r->est_persistent = (double)rr->est.persistent_bytes, r->est_peak_unsharded = (double)rr->est.peak_unsharded_bytes;
    }
    r->loss = rr->loss;
    r->done = 1;
}

/* One rank of one configuration. */
static int run_rank(fsdp_comm *comm, void *arg) {
    rank_run rr;
    int rc = 1;
    memset(&rr, 0, sizeof rr);
    rr.j = (const job *)arg, rr.o = rr.j->o, rr.cfg = rr.j->cfg, rr.comm = comm;
    rr.rank = fsdp_comm_rank(comm), rr.P = rr.cfg->nprocs, rr.B = rr.o->batch / rr.P;
    rr.total = rr.o->warmup + rr.o->steps;
    rr.ms = (double *)calloc(4 * (size_t)rr.total, sizeof(double));
    rr.wait_ms = rr.ms + rr.total, rr.update_ms = rr.ms + 2 * rr.total, rr.save_ms = rr.ms + 3 * rr.total;
    snprintf(rr.save_dir, sizeof rr.save_dir, "%s/%s", rr.o->ckpt_dir ? rr.o->ckpt_dir : ".",
             rr.cfg->save == 2 ? "async" : "sync");
    openblas_set_num_threads(1);
    // forward only (frozen): no gradients, and one block's activations at a time are enough
    if (!rr.ms || model_build(&rr.bm, rr.o) ||
        model_acts_alloc(&rr.bm, rr.B, rr.cfg->frozen ? 1 : rr.cfg->recompute, !rr.cfg->frozen)) {
        fprintf(stderr, "%s rank %d: out of memory\n", rr.cfg->name, rr.rank);
        goto done;
    }
    rr.num_params = model_num_params(&rr.bm);
    model_attach(&rr.bm, NULL, rr.rank);
    if (rr.cfg->plain ? rank_setup_plain(&rr) : rank_setup_fsdp(&rr)) goto done;
    for (int s = 0; s < rr.total; s++)
        if (rank_step(&rr, s)) goto done;
    // the global mean loss of the last step; the comm thread is idle after fsdp_step (N plain loops
    // trained N separate models: the table shows no loss for them)
    if (rr.ctx && fsdp_all_reduce(comm, &rr.loss, &rr.loss, 1, FSDP_F32, FSDP_AVG)) goto done;
    if (rr.ctx && rr.cfg->save && fsdp_save_wait(rr.ctx)) { // (untimed: the last save started save_every steps ago)
        fprintf(stderr, "%s rank %d: the last save: %s\n", rr.cfg->name, rr.rank, fsdp_last_error(rr.ctx));
        goto done;
    }
    rank_report(&rr);
    rc = 0;
done:
    fsdp_destroy(rr.ctx);
    model_free(&rr.bm);
    free(rr.opt.a);
    free(rr.opt.b);
    free(rr.ms);
    return rc;
}

/* A PyTorch row: tests/torch_gpt.py bench with the same model, batch, steps and text, in one
   process or cfg->nprocs under DDP (gloo); its one "torch-bench:" line fills rank 0's result. */
static int run_torch(const options *o, const config *cfg, rank_result *r) {
    char cmd[4096], line[1024], version[64] = "";
    double rate = 0, ms = 0, loss = 0, rss = 0;
    int found = 0, status;
    FILE *p;
    snprintf(cmd, sizeof cmd, "%s%s%sOPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 '%s' '%s' bench --layers %d --channels %d "
             "--heads %d --seq-len %d --batch %d --steps %d --warmup %d --nproc %d --data '%s' </dev/null 2>&1",
             cfg->coretype ? "OPENBLAS_CORETYPE='" : "", cfg->coretype ? cfg->coretype : "", cfg->coretype ? "' " : "",
             o->torch_python,
             o->torch_script, o->layers, o->channels, o->heads, o->seq_len, o->batch, o->steps, o->warmup, cfg->nprocs,
             o->text_name);
    if (!(p = popen(cmd, "r"))) { fprintf(stderr, "bench_train: cannot run %s\n", cmd); return -1; }
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "torch-bench: P=%*d %*s tokens/s %lf ms/step %lf loss %lf peak_rss_mib %lf torch %63s", &rate, &ms,
                   &loss, &rss, version) == 5)
            found = 1;
        else if (!found) fputs(line, stderr); // whatever went wrong
    }
    status = pclose(p);
    if (!found || status != 0) {
        fprintf(stderr, "bench_train: %s P=%d failed (exit status %d): %s\n", cfg->name, cfg->nprocs, status, cmd);
        return -1;
    }
    r->ms = ms, r->loss = loss, r->rss = rss * 1048576.0, r->done = 1;
    snprintf(r->torch_version, sizeof r->torch_version, "%.*s", (int)sizeof r->torch_version - 1, version);
    return 0;
}

/* Runs the configurations one after another, each in fresh processes; results[c * MAX_RANKS + rank]. */
static int run_configs(const options *o, const config *configs, int num_configs, rank_result *results) {
    for (int c = 0; c < num_configs; c++) {
        fsdp_launch_desc ld;
        fsdp_launch_status status;
        job j = {o, &configs[c], results + (size_t)c * MAX_RANKS};
        if (isatty(2)) fprintf(stderr, "running %-22s P=%d ...\r", configs[c].name, configs[c].nprocs);
        if (configs[c].torch) {
            if (run_torch(o, &configs[c], j.out)) return -1;
            continue;
        }
        memset(&ld, 0, sizeof ld);
        ld.nprocs = configs[c].nprocs;
        if (fsdp_launch_ex(&ld, run_rank, &j, &status)) {
            fprintf(stderr, "bench_train: %s P=%d: %s\n", configs[c].name, configs[c].nprocs, status.message);
            return -1;
        }
    }
    if (isatty(2)) fprintf(stderr, "%60s\r", "");
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* the two tables */

static void print_header(const options *o, int argc, char **argv) {
    static const char *optimizer_names[] = {"", "SGD", "Adam", "AdamW"};
    bench_model bm;
    if (model_build(&bm, o)) { fprintf(stderr, "bench_train: out of memory\n"); exit(1); }
    if (o->model == MODEL_GPT)
        printf("bench_train: GPT %d layers, %d heads, %d channels, context %d, vocabulary 256 (%.2f M parameters), "
               "global batch %d x %d tokens, text %s (%zu bytes), ", o->layers, o->heads, o->channels, o->seq_len,
               model_num_params(&bm) / 1e6, o->batch, o->seq_len, o->text_name, o->text_size);
    else
        printf("bench_train: MLP %d -> %d x %d -> %d (%d Linear layers, %.2f M parameters), global batch %d, ",
               o->data.features, o->layers - 1, o->hidden, o->data.classes, o->layers, model_num_params(&bm) / 1e6, o->batch);
    printf("%s, %d %s after %d warmup, 1 BLAS thread per rank, shm\n", optimizer_names[o->optimizer.kind], o->steps,
           o->memory ? "steps" : "timed steps", o->warmup);
    model_free(&bm);
    printf("command:");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    printf("\n\n");
    fflush(stdout);
}

/* The rate of config c (items per second of the slowest rank) in each round, and its median. */
static double config_rate(const options *o, const config *cfg, const rank_result *results, int num_configs, int c,
                          int round) {
    const rank_result *r = results + ((size_t)round * num_configs + c) * MAX_RANKS;
    double ms = r[0].ms;
    for (int k = 1; k < (cfg->torch ? 1 : cfg->nprocs); k++) ms = r[k].ms > ms ? r[k].ms : ms;
    return items_per_step(o) / (ms * 1e-3);
}

/* The speed table: its configurations, their results over the rounds, and the rates it compares. */
typedef struct {
    const options *o;
    int N, R;                         // --nproc, --rounds
    char names[10][32];
    config configs[20];
    int num_configs;
    rank_result *results;             // [R][num_configs][MAX_RANKS], MAP_SHARED
    double rate[20];                  // each configuration's median rate over the rounds
    double plain_rate, p1_rate, torch1_rate, torchN_rate, core1_rate, coreN_rate;
    double full_n_rate, plain_update_ms, plain_n_rate;
} speed_run;

/* The configurations, in this order: PyTorch first at each world size, then fsdp.h's runs to
   compare with it. */
static void speed_configs(speed_run *sr) {
    const options *o = sr->o;
    int N = sr->N;
    char (*names)[32] = sr->names;
    config *configs = sr->configs;
    snprintf(names[0], sizeof names[0], "FSDP %s", fsdp_strategy_name(FSDP_FULL_SHARD));
    snprintf(names[1], sizeof names[1], "FSDP %s", fsdp_strategy_name(FSDP_SHARD_GRAD_OP));
    snprintf(names[2], sizeof names[2], "FSDP %s", fsdp_strategy_name(FSDP_NO_SHARD));
    snprintf(names[3], sizeof names[3], "FSDP %s %dx%d", fsdp_strategy_name(FSDP_HYBRID_SHARD), N / (N / 2), N / 2);
    snprintf(names[4], sizeof names[4], "PyTorch eager %.8s", o->torch_coretype ? o->torch_coretype : "");
    snprintf(names[5], sizeof names[5], "PyTorch DDP %.10s", o->torch_coretype ? o->torch_coretype : "");
    snprintf(names[6], sizeof names[6], "plain x%d, no comm", N);
    snprintf(names[7], sizeof names[7], "FSDP %s int8", fsdp_strategy_name(FSDP_FULL_SHARD));
    snprintf(names[8], sizeof names[8], "FSDP %s +g8", fsdp_strategy_name(FSDP_FULL_SHARD));
    snprintf(names[9], sizeof names[9], "FSDP %s +g4ef", fsdp_strategy_name(FSDP_FULL_SHARD));
    config torch1 = {"PyTorch eager", 0, 1, 0, FSDP_FULL_SHARD, FSDP_F32, 1, NULL, 0, 0, IN_RAM};
    config torchN = {"PyTorch DDP (gloo)", 0, N, 0, FSDP_FULL_SHARD, FSDP_F32, 1, NULL, 0, 0, IN_RAM};
    config plain = {"plain loop (no fsdp)", 1, 1, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM};
    config plainN = {names[6], 1, N, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM}; // the machine's ceiling at P = N
    config full1 = {names[0], 0, 1, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM};
    config multi[4] = {{names[0], 0, N, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM},
                       {names[1], 0, N, 0, FSDP_SHARD_GRAD_OP, FSDP_F32, 0, NULL, 0, 0, IN_RAM},
                       {names[2], 0, N, 0, FSDP_NO_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM},
                       {names[3], 0, N, N / 2, FSDP_HYBRID_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM}};
    int n = 0;
    if (o->torch) configs[n++] = torch1;
    if (o->torch && o->torch_coretype) {
        config c = torch1;
        c.name = names[4], c.coretype = o->torch_coretype;
        configs[n++] = c;
    }
    configs[n++] = plain;
    configs[n++] = full1;
    if (o->torch) {
        config bf16 = full1, f16 = full1;
        bf16.param_dtype = FSDP_BF16, f16.param_dtype = FSDP_F16;
        configs[n++] = bf16;
        configs[n++] = f16;
        configs[n++] = torchN;
        if (o->torch_coretype) {
            config c = torchN;
            c.name = names[5], c.coretype = o->torch_coretype;
            configs[n++] = c;
        }
    }
    if (N > 1) configs[n++] = plainN;
    for (int k = 0; k < 4; k++) configs[n++] = multi[k];
    if (N > 1) { // bf16 gathers, and int8 ones decoded into bf16 (fsdp_desc.param_wire)
        config bf16 = multi[0], f16 = multi[0], int8 = multi[0];
        bf16.param_dtype = FSDP_BF16, f16.param_dtype = FSDP_F16;
        int8.param_dtype = FSDP_BF16, int8.param_wire = FSDP_WIRE_INT8, int8.name = names[7];
        configs[n++] = bf16;
        if (o->torch) configs[n++] = f16;
        configs[n++] = int8;
        config g8 = int8, g4 = int8; // + quantized gradients (fsdp_desc.grad_wire): one host here, see the help
        g8.grad_wire = FSDP_WIRE_INT8, g8.name = names[8];
        g4.grad_wire = FSDP_WIRE_INT4, g4.error_feedback = 1, g4.name = names[9];
        configs[n++] = g8;
        configs[n++] = g4;
    }
    sr->num_configs = n;
}

/* Each configuration's median rate over the rounds, and the rates the table compares with. */
static void speed_rates(speed_run *sr) {
    const config *configs = sr->configs;
    for (int c = 0; c < sr->num_configs; c++) {
        double per_round[64];
        for (int round = 0; round < sr->R; round++)
            per_round[round] = config_rate(sr->o, &configs[c], sr->results, sr->num_configs, c, round);
        sr->rate[c] = median(per_round, sr->R);
        if (configs[c].plain && configs[c].nprocs == 1)
            sr->plain_rate = sr->rate[c], sr->plain_update_ms = sr->results[(size_t)c * MAX_RANKS].update_ms;
        if (configs[c].plain && configs[c].nprocs > 1) sr->plain_n_rate = sr->rate[c];
        if (!configs[c].plain && !configs[c].torch && configs[c].nprocs == 1 && configs[c].param_dtype == FSDP_F32 &&
            !sr->p1_rate)
            sr->p1_rate = sr->rate[c];
        if (configs[c].torch && !configs[c].coretype) *(configs[c].nprocs == 1 ? &sr->torch1_rate : &sr->torchN_rate) = sr->rate[c];
        if (configs[c].torch && configs[c].coretype) *(configs[c].nprocs == 1 ? &sr->core1_rate : &sr->coreN_rate) = sr->rate[c];
        if (!configs[c].torch && !configs[c].plain && configs[c].nprocs == sr->N && configs[c].strategy == FSDP_FULL_SHARD &&
            configs[c].param_dtype == FSDP_F32 && !sr->full_n_rate)
            sr->full_n_rate = sr->rate[c];
    }
}

/* Configuration c's row: the figures of the round whose rate is the median, of its slowest and
   largest rank. */
static void speed_print_row(const speed_run *sr, int c) {
    const options *o = sr->o;
    const config *cfg = &sr->configs[c];
    double rate = sr->rate[c];
    int round = 0; // the round whose rate is the median: its other figures go with it
    for (int k = 0; k < sr->R; k++)
        if (config_rate(o, cfg, sr->results, sr->num_configs, c, k) == rate) round = k;
    const rank_result *r = sr->results + ((size_t)round * sr->num_configs + c) * MAX_RANKS;
    rank_result worst = r[0];
    for (int k = 1; k < (cfg->torch ? 1 : cfg->nprocs); k++) { // the slowest and largest rank
        if (r[k].ms > worst.ms) worst.ms = r[k].ms;
        if (r[k].wait_ms > worst.wait_ms) worst.wait_ms = r[k].wait_ms;
        if (r[k].rss > worst.rss) worst.rss = r[k].rss;
        if (r[k].state > worst.state) worst.state = r[k].state;
    }
    char wait[16], state[24], vs_p1[16], vs_torch[16], loss[16];
    double torch_rate = cfg->nprocs == 1 ? sr->torch1_rate : sr->torchN_rate;
    double p1 = cfg->plain ? sr->plain_rate : !cfg->torch ? sr->p1_rate : cfg->coretype ? sr->core1_rate : sr->torch1_rate;
    snprintf(wait, sizeof wait, cfg->plain || cfg->torch ? "-" : "%.1f", worst.wait_ms);
    snprintf(vs_p1, sizeof vs_p1, (cfg->plain && cfg->nprocs == 1) || p1 <= 0 ? "-" : "%.2fx", rate / p1);
    snprintf(loss, sizeof loss, cfg->plain && cfg->nprocs > 1 ? "-" : "%.4f", worst.loss); // N separate models
    snprintf(vs_torch, sizeof vs_torch, cfg->torch || torch_rate <= 0 ? "-" : "%.2fx", rate / torch_rate);
    snprintf(state, sizeof state, cfg->torch ? "-" : "%.1f MiB%s", mib(worst.state), cfg->plain ? "*" : "");
    printf("%-22s %2d %4s %10.0f %8.1f %10s %7.2fx %7s %8s %8.1f MiB %13s %8s\n", cfg->name, cfg->nprocs,
           cfg->param_dtype == FSDP_BF16 ? "bf16" : cfg->param_dtype == FSDP_F16 ? "f16" : "f32", rate,
           items_per_step(o) / rate * 1e3, wait, rate / sr->plain_rate, vs_p1, o->torch ? vs_torch : "",
           mib(worst.rss), state, loss);
}

/* What the columns mean, and the ratios against the machine's ceiling and PyTorch. */
static void speed_print_notes(const speed_run *sr) {
    const options *o = sr->o;
    int N = sr->N, R = sr->R;
    printf("\nms/step: median over the timed steps, slowest rank%s. in fsdp ms: time inside the hooks,\n"
           "fsdp_step and fsdp_zero_grad (waiting for gathers and reductions, plus the optimizer update on this rank's\n"
           "shard; the plain loop's full update takes %.1f ms/step). max RSS: each process's own peak (VmHWM).\n"
           "*plain: parameters + gradients + optimizer state, no fsdp. The matrix products here: %s.\n",
           R > 1 ? " (the median of the rounds)" : "", sr->plain_update_ms,
           example_sgemm_name());
    if (sr->plain_n_rate > 0 && sr->plain_rate > 0 && sr->p1_rate > 0 && sr->full_n_rate > 0)
        printf("plain x%d, no comm: %d plain loops side by side, each on its %d of the batch's %d %s, with no\n"
               "communication (separate models): the most %d ranks get from this machine, %.2fx one plain loop.\n"
               "FSDP %s at P = %d: %.2fx of P = 1, %.0f%% of that ceiling's rate.\n",
               N, N, o->batch / N, o->batch, o->model == MODEL_GPT ? "sequences" : "samples", N,
               sr->plain_n_rate / sr->plain_rate, fsdp_strategy_name(FSDP_FULL_SHARD), N, sr->full_n_rate / sr->p1_rate,
               100.0 * sr->full_n_rate / sr->plain_n_rate);
    if (o->torch)
        printf("vs torch: against PyTorch %s (%s; eager at P = 1, DistributedDataParallel over gloo at P = %d;\n"
               "one intra-op thread per process; same model, batch, AdamW, text) at the same world size.\n",
               sr->results[0].torch_version, o->torch_python, N);
    if (o->torch && o->torch_coretype && sr->core1_rate > 0 && sr->coreN_rate > 0)
        printf("PyTorch %s: the same with OPENBLAS_CORETYPE=%s (its BLAS's kernels chosen by hand instead of by\n"
               "OpenBLAS's CPU detection); fsdp.h against it: P = 1 (FSDP FULL_SHARD) %.2fx, P = %d (FULL_SHARD) %.2fx.\n",
               o->torch_coretype, o->torch_coretype, sr->p1_rate / sr->core1_rate, N, sr->full_n_rate / sr->coreN_rate);
    if (R > 1) {
        printf("rounds: %d; tokens/s per round (min .. max):", R);
        for (int c = 0; c < sr->num_configs; c++) {
            double lo = 1e300, hi = 0;
            for (int k = 0; k < R; k++) {
                double x = config_rate(o, &sr->configs[c], sr->results, sr->num_configs, c, k);
                lo = x < lo ? x : lo, hi = x > hi ? x : hi;
            }
            printf("%s %.0f..%.0f", c ? "," : "", lo, hi);
        }
        printf("\n");
    }
}

static int speed_table(const options *o) {
    speed_run run, *sr = &run;
    memset(sr, 0, sizeof *sr);
    sr->o = o, sr->N = o->nproc, sr->R = o->rounds;
    speed_configs(sr);
    size_t bytes = sizeof(rank_result) * MAX_RANKS * (size_t)sr->num_configs * (size_t)sr->R;
    sr->results = (rank_result *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sr->results == MAP_FAILED) { perror("bench_train: mmap"); return 1; }
    memset(sr->results, 0, bytes);

    double busy0 = 0, total0 = 0, busy1 = 0, total1 = 0, ours = children_cpu();
    int have_cpu = machine_cpu(&busy0, &total0) == 0;
    for (int round = 0; round < sr->R; round++) // each round runs every configuration once, in the order above
        if (run_configs(o, sr->configs, sr->num_configs, sr->results + (size_t)round * sr->num_configs * MAX_RANKS))
            return 1;
    ours = children_cpu() - ours;
    have_cpu = have_cpu && machine_cpu(&busy1, &total1) == 0;

    printf("%-22s %2s %4s %10s %8s %10s %8s %7s %8s %12s %13s %8s\n", "config", "P", "dtype",
           o->model == MODEL_GPT ? "tokens/s" : "samples/s", "ms/step", "in fsdp ms", "vs plain", "vs P=1",
           o->torch ? "vs torch" : "", "max RSS/rank", "fsdp peak/rk", "loss");
    speed_rates(sr);
    for (int c = 0; c < sr->num_configs; c++) speed_print_row(sr, c);
    speed_print_notes(sr);
    if (have_cpu && total1 > total0) {
        double others = (busy1 - busy0 - ours) / (total1 - total0);
        printf("other processes used %.0f%% of the machine's CPU time during the runs%s\n", others > 0 ? 100 * others : 0.0,
               others > 0.05 ? ": timings are disturbed; rerun on an idle machine" : "");
    }
    munmap(sr->results, bytes);
    return 0;
}

static int memory_table(const options *o) {
    enum { NUM_P = 3 };
    static const int world_sizes[NUM_P] = {1, 2, 4};
    enum { NUM_RECOMPUTE = 5 };
    static const fsdp_strategy strategies[2] = {FSDP_FULL_SHARD, FSDP_NO_SHARD};
    // activation checkpointing (GPT): none, every block, every 2nd block at P = 1; none, every block at P = 2
    static const int recompute_every[NUM_RECOMPUTE] = {0, 1, 2, 0, 1}, recompute_p[NUM_RECOMPUTE] = {1, 1, 1, 2, 2};
    static const char *const recompute_names[3] = {"none", "every block", "every 2nd"};
    config configs[2 * NUM_P + NUM_RECOMPUTE + NUM_P];
    int num_configs = 2 * NUM_P, first_recompute, first_frozen;
    bench_model bm;
    size_t num_params;
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < NUM_P; k++) {
            config c = {fsdp_strategy_name(strategies[s]), 0, world_sizes[k], 0, strategies[s], FSDP_F32, 0, NULL, 0, 0, IN_RAM};
            configs[s * NUM_P + k] = c;
        }
    first_recompute = num_configs;
    for (int k = 0; o->model == MODEL_GPT && k < NUM_RECOMPUTE; k++) {
        config c = {recompute_names[recompute_every[k]], 0, recompute_p[k], 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL,
                    recompute_every[k], 0, IN_RAM};
        configs[num_configs++] = c;
    }
    first_frozen = num_configs;
    for (int k = 0; k < NUM_P; k++) { // the whole model frozen, forward only: a distillation teacher
        config c = {"frozen", 0, world_sizes[k], 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 1, IN_RAM};
        configs[num_configs++] = c;
    }
    if (model_build(&bm, o)) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }
    num_params = model_num_params(&bm);
    model_free(&bm);
    rank_result *results = (rank_result *)mmap(NULL, sizeof(rank_result) * MAX_RANKS * (size_t)num_configs,
                                               PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED) { perror("bench_train: mmap"); return 1; }
    memset(results, 0, sizeof(rank_result) * MAX_RANKS * (size_t)num_configs);
    if (run_configs(o, configs, num_configs, results)) return 1;

    printf("%-10s %2s %9s %11s | %10s %10s %7s | %10s %10s %7s | %9s\n", "strategy", "P", "max RSS", "activations",
           "persistent", "estimate", "act/est", "peak unsh.", "estimate", "act/est", "pers.xP/P1");
    for (int c = 0; c < 2 * NUM_P; c++) {
        const rank_result *r = &results[(size_t)c * MAX_RANKS]; // rank 0
        const rank_result *p1 = &results[(size_t)(c - c % NUM_P) * MAX_RANKS];
        char ratio_peak[16];
        snprintf(ratio_peak, sizeof ratio_peak, r->est_peak_unsharded > 0 ? "%.3f" : "-",
                 r->peak_unsharded / r->est_peak_unsharded);
        printf("%-10s %2d %5.1f MiB %7.1f MiB | %6.2f MiB %6.2f MiB %7.3f | %6.2f MiB %6.2f MiB %7s | %9.3f\n",
               configs[c].name, configs[c].nprocs, mib(r->rss), mib(r->activations), mib(r->persistent),
               mib(r->est_persistent), r->persistent / r->est_persistent, mib(r->peak_unsharded),
               mib(r->est_peak_unsharded), ratio_peak, r->persistent * configs[c].nprocs / p1->persistent);
    }
    printf("\nRank 0 of each run. max RSS: its own peak, VmHWM (model, activations, fsdp, libraries); activations:\n"
           "the model's activation and activation-gradient buffers for this rank's part of the global batch.\n"
           "persistent: fp32 parameter, gradient and optimizer shards; peak unsh.: peak of gathered parameters\n"
           "and unsharded gradients (fsdp_memory_stats_get), each against fsdp_memory_estimate for the same model,\n"
           "desc and world size. pers.xP/P1: persistent x P / persistent at P = 1 (1.0: perfect 1/P sharding).\n");

    if (first_frozen > first_recompute) {
        printf("\nactivation checkpointing (gpt --recompute), FULL_SHARD, %d blocks, rank 0:\n", o->layers);
        printf("%-12s %2s %11s %8s %9s %8s %9s %10s\n", "recompute", "P", "activations", "vs none", "ms/step", "vs none",
               "max RSS", "loss");
        for (int c = first_recompute; c < first_frozen; c++) {
            const rank_result *r = &results[(size_t)c * MAX_RANKS], *none = r;
            for (int k = first_recompute; k < first_frozen; k++)
                if (configs[k].recompute == 0 && configs[k].nprocs == configs[c].nprocs) none = &results[(size_t)k * MAX_RANKS];
            printf("%-12s %2d %7.1f MiB %8.3f %9.1f %8.3f %5.1f MiB %10.6f\n", configs[c].name, configs[c].nprocs,
                   mib(r->activations), r->activations / none->activations, r->ms, r->ms / none->ms, mib(r->rss), r->loss);
        }
        printf("activations: the buffers gpt_acts_alloc_ex allocates (every block's inputs, one block's internals per\n"
               "block not recomputed, plus one scratch block for the recomputed ones; logits and gradients); ms/step:\n"
               "median of the %d steps; loss: the last step's, the same to the bit with and without recomputation.\n",
               o->steps);
    }
    printf("\nfrozen parameters (every parameter frozen, forward only + fsdp_finish_backward: a distillation\n"
           "teacher), FULL_SHARD, rank 0:\n");
    printf("%-10s %2s %10s %10s %7s %10s %12s %9s\n", "config", "P", "persistent", "estimate", "act/est", "B/param",
           "B/param x P", "max RSS");
    for (int c = first_frozen; c < num_configs; c++) {
        const rank_result *r = &results[(size_t)c * MAX_RANKS];
        printf("%-10s %2d %6.2f MiB %6.2f MiB %7.3f %10.3f %12.3f %5.1f MiB\n", configs[c].name, configs[c].nprocs,
               mib(r->persistent), mib(r->est_persistent), r->persistent / r->est_persistent,
               r->persistent / (double)num_params, r->persistent * configs[c].nprocs / (double)num_params, mib(r->rss));
    }
    printf("persistent: the parameter shards alone (no gradient, no optimizer state): 4 bytes per parameter / P, against\n"
           "16 for a trained parameter under AdamW (the FULL_SHARD rows above); %zu parameters.\n", num_params);
    munmap(results, sizeof(rank_result) * MAX_RANKS * (size_t)num_configs);
    return 0;
}

/* --offload DIR: FULL_SHARD on --nproc ranks with more and more on disk, against the same training in
   RAM, and the roofline step / max(compute-only, bytes / bandwidth). */
static int offload_table(const options *o) {
    enum { NUM = 5 };
    static const char *const names[NUM] = {"nothing", "optimizer", "optimizer bf16", "all", "all, bf16 state"};
    config configs[NUM];
    double write_bps = 0, read_bps = 0;
    char err[600], machine[400];
    for (int k = 0; k < NUM; k++) {
        config c = {names[k], 0, o->nproc, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM};
        c.offload.optimizer = k > 0;
        c.offload.params = c.offload.grads = k >= 3;
        c.state_dtype = k == 2 || k == 4 ? FSDP_BF16 : FSDP_F32;
        configs[k] = c;
    }
    rank_result *results = (rank_result *)mmap(NULL, sizeof(rank_result) * MAX_RANKS * NUM, PROT_READ | PROT_WRITE,
                                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED) { perror("bench_train: mmap"); return 1; }
    memset(results, 0, sizeof(rank_result) * MAX_RANKS * NUM);
    if (run_configs(o, configs, NUM, results)) return 1;
    if (fsdp_offload_bandwidth(o->offload_dir, (size_t)2 << 30, o->nproc, &write_bps, &read_bps, err, sizeof err)) {
        fprintf(stderr, "bench_train: measuring the disk under %s: %s\n", o->offload_dir, err);
        return 1;
    }
    example_machine_line(machine, sizeof machine);
    double compute = results[0].ms; // nothing offloaded: the compute-only step (slowest rank below)
    for (int k = 1; k < o->nproc; k++) compute = results[k].ms > compute ? results[k].ms : compute;
    printf("%-16s %2s %9s %8s %10s %10s %9s %9s %11s %11s %9s\n", "on disk", "P", "ms/step", "vs none", "read/step",
           "write/step", "disk ms", "roofline", "max RSS/rk", "disk/rank", "loss");
    for (int c = 0; c < NUM; c++) {
        const rank_result *r = &results[(size_t)c * MAX_RANKS];
        rank_result worst = r[0];
        double read = 0, written = 0, disk_ms, bound;
        for (int k = 0; k < o->nproc; k++) {
            if (r[k].ms > worst.ms) worst.ms = r[k].ms;
            if (r[k].rss > worst.rss) worst.rss = r[k].rss;
            read += r[k].read_bytes, written += r[k].written_bytes;
        }
        disk_ms = 1e3 * (read / read_bps + written / write_bps);
        bound = compute > disk_ms ? compute : disk_ms;
        printf("%-16s %2d %9.1f %7.2fx %6.0f MiB %6.0f MiB %9.1f %8.2fx %7.1f MiB %7.1f MiB %9.4f\n", configs[c].name,
               configs[c].nprocs, worst.ms, worst.ms / compute, mib(read), mib(written), disk_ms, worst.ms / bound,
               mib(worst.rss), mib(r[0].disk_bytes), worst.loss);
    }
    printf("\nFULL_SHARD, %d ranks, %d timed steps after %d. on disk: the optimizer state (f32 or bf16), or everything\n"
           "(parameters, gradients, optimizer state) under %s. read/write per step: every rank's bytes together;\n"
           "disk ms: those at the disk's bandwidth through fsdp.h's own I/O path, measured after the runs (2 GiB each\n"
           "way, one stream per rank: %.2f GB/s write, %.2f GB/s read). roofline: ms/step / max(compute-only, disk\n"
           "ms), compute-only being the 'nothing' row (%.1f ms); 1.00x: as fast as the slower of compute and disk\n"
           "allows. loss: the last step's (f32 state: the same bits wherever it lives, tests/test_offload.c).\n"
           "machine: %s\n",
           o->nproc, o->steps, o->warmup, o->offload_dir, write_bps / 1e9, read_bps / 1e9, compute, machine);
    munmap(results, sizeof(rank_result) * MAX_RANKS * NUM);
    return 0;
}

/* Runs configs --rounds times, interleaved (round r runs every config once); results[(r * num + c) *
   MAX_RANKS + rank]. The caller unmaps them. */
static rank_result *run_rounds(const options *o, const config *configs, int num) {
    size_t bytes = sizeof(rank_result) * MAX_RANKS * (size_t)num * (size_t)o->rounds;
    rank_result *results = (rank_result *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED) { perror("bench_train: mmap"); return NULL; }
    memset(results, 0, bytes);
    for (int round = 0; round < o->rounds; round++)
        if (run_configs(o, configs, num, results + (size_t)round * num * MAX_RANKS)) {
            munmap(results, bytes);
            return NULL;
        }
    return results;
}

/* A value of config c's slowest rank, per round (field: offsetof into rank_result), its median over rounds. */
static double slowest_median(const options *o, const rank_result *results, int num, int c, size_t field) {
    double v[64];
    for (int round = 0; round < o->rounds; round++) {
        const rank_result *r = results + ((size_t)round * num + c) * MAX_RANKS;
        v[round] = 0;
        for (int k = 0; k < o->nproc; k++) {
            double x = *(const double *)((const char *)&r[k] + field);
            if (x > v[round]) v[round] = x;
        }
    }
    return median(v, o->rounds);
}

static double dir_bytes(const char *dir) {
    char path[1400];
    double total = 0;
    struct stat st;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) total += (double)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* --trace DIR: the same training with tracing off and on. */
static int trace_table(const options *o) {
    config configs[2] = {{"tracing off", 0, o->nproc, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM},
                         {"tracing on", 0, o->nproc, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM}};
    char machine[400];
    configs[1].trace = 1;
    rank_result *results = run_rounds(o, configs, 2);
    if (!results) return 1;
    double off = slowest_median(o, results, 2, 0, offsetof(rank_result, ms));
    double on = slowest_median(o, results, 2, 1, offsetof(rank_result, ms));
    double bytes = dir_bytes(o->trace_dir);
    example_machine_line(machine, sizeof machine);
    printf("%-12s %2s %9s %9s %12s\n", "", "P", "ms/step", "vs off", "trace/step");
    printf("%-12s %2d %9.2f %8.3fx %12s\n", configs[0].name, o->nproc, off, 1.0, "");
    printf("%-12s %2d %9.2f %8.3fx %8.1f KiB\n", configs[1].name, o->nproc, on, on / off,
           bytes / (o->warmup + o->steps) / 1024.0);
    printf("\nFULL_SHARD, %d ranks, %d timed steps after %d, %d round(s) interleaved: ms/step is the slowest rank's\n"
           "median step, the median over rounds. trace/step: the files under %s (every rank) per step.\nmachine: %s\n",
           o->nproc, o->steps, o->warmup, o->rounds, o->trace_dir, machine);
    munmap(results, sizeof(rank_result) * MAX_RANKS * 2 * (size_t)o->rounds);
    return 0;
}

/* --ckpt DIR: the same training without saves, with sharded saves and with asynchronous ones. */
static int ckpt_table(const options *o) {
    config configs[3] = {{"no saves", 0, o->nproc, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM},
                         {"fsdp_save_sharded", 0, o->nproc, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM},
                         {"..._async", 0, o->nproc, 0, FSDP_FULL_SHARD, FSDP_F32, 0, NULL, 0, 0, IN_RAM}};
    char machine[400], path[1300];
    configs[1].save = 1, configs[2].save = 2;
    for (int k = 0; k < 2; k++) { // the saves' directories
        snprintf(path, sizeof path, "%s/%s", o->ckpt_dir, k ? "async" : "sync");
        if ((mkdir(o->ckpt_dir, 0755) != 0 && errno != EEXIST) || (mkdir(path, 0755) != 0 && errno != EEXIST)) {
            fprintf(stderr, "bench_train: --ckpt: cannot make %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    rank_result *results = run_rounds(o, configs, 3);
    if (!results) return 1;
    double none = slowest_median(o, results, 3, 0, offsetof(rank_result, mean_ms));
    double blocked_sync = slowest_median(o, results, 3, 1, offsetof(rank_result, save_ms));
    snprintf(path, sizeof path, "%s/sync", o->ckpt_dir);
    double bytes = dir_bytes(path);
    example_machine_line(machine, sizeof machine);
    printf("%-18s %2s %13s %9s %15s %9s\n", "saves", "P", "mean ms/step", "vs none", "blocked/save", "vs sync");
    for (int c = 0; c < 3; c++) {
        double mean = slowest_median(o, results, 3, c, offsetof(rank_result, mean_ms));
        double blocked = slowest_median(o, results, 3, c, offsetof(rank_result, save_ms));
        printf("%-18s %2d %13.1f %8.3fx", configs[c].name, o->nproc, mean, mean / none);
        if (c) printf(" %12.1f ms %8.3fx", blocked, blocked / blocked_sync);
        printf("\n");
    }
    printf("\nFULL_SHARD, %d ranks, %d timed steps after %d, a save (with the AdamW state: %.0f MiB in all, every rank's\n"
           "files) at the first timed step and every %d steps from there (and one untimed at the last warmup step:\n"
           "a first save allocates what later ones reuse), into %s; %d round(s) interleaved. mean\n"
           "ms/step: the slowest rank's mean over the timed steps, saves included; blocked/save: the median time a\n"
           "save call took (the slowest rank); each a median over the rounds.\nmachine: %s\n",
           o->nproc, o->steps, o->warmup, mib(bytes), o->save_every, o->ckpt_dir, o->rounds, machine);
    munmap(results, sizeof(rank_result) * MAX_RANKS * 3 * (size_t)o->rounds);
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* the GPT's text: fsdp.h itself unless --data */

static int load_text(options *o, const char *argv0) {
    char exe[1024], dir[1100], path[1200];
    const char *file = o->text_path;
    FILE *f = NULL;
    long n;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) exe[len] = 0;
    else snprintf(exe, sizeof exe, "%s", argv0);
    if (strrchr(exe, '/')) *strrchr(exe, '/') = 0;
    else snprintf(exe, sizeof exe, ".");
    for (int i = 0; !file && i < 3; i++) { // ., the executable's parent (build/..), the executable's directory
        snprintf(dir, sizeof dir, "%s%s", i ? exe : ".", i == 1 ? "/.." : "");
        snprintf(path, sizeof path, "%s/fsdp.h", dir);
        if (access(path, R_OK) == 0) file = path;
    }
    if (!file) {
        fprintf(stderr, "bench_train: --model gpt trains on fsdp.h, which is neither in the current directory nor next "
                "to the executable (%s/..); pass any text file with --data FILE\n", exe);
        return -1;
    }
    snprintf(o->text_name, sizeof o->text_name, "%s", file);
    if (!(f = fopen(file, "rb")) || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(o->text = (unsigned char *)malloc((size_t)n + 1)) || fread(o->text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "bench_train: cannot read '%s': %s\n", file, f ? "read error or out of memory" : strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    fclose(f);
    o->text_size = (size_t)n;
    if (o->text_size < (size_t)o->seq_len + 2) {
        fprintf(stderr, "bench_train: '%s' has %zu bytes, too few for sequences of %d; use a longer text or a smaller "
                "--seq-len\n", file, o->text_size, o->seq_len);
        return -1;
    }
    return 0;
}

/* --torch: tests/torch_gpt.py of this source tree (in ., or next to the executable's directory)
   and an interpreter that can import torch. */
static int find_torch(options *o, const char *argv0) {
    char exe[1024], cmd[1400];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int found = 0;
    if (len > 0) exe[len] = 0;
    else snprintf(exe, sizeof exe, "%s", argv0);
    if (strrchr(exe, '/')) *strrchr(exe, '/') = 0;
    else snprintf(exe, sizeof exe, ".");
    for (int i = 0; !found && i < 3; i++) { // ., the executable's parent (build/..), the executable's directory
        snprintf(o->torch_script, sizeof o->torch_script, "%s%s/tests/torch_gpt.py", i ? exe : ".", i == 1 ? "/.." : "");
        found = access(o->torch_script, R_OK) == 0;
    }
    if (!found) {
        fprintf(stderr, "bench_train: --torch needs tests/torch_gpt.py of the fsdp.h sources: run from the source "
                "directory\n");
        return -1;
    }
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", o->torch_python);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_train: --torch: %s cannot import torch (sudo apt-get install python3-torch, or name "
                "the interpreter that has it with --torch-python)\n", o->torch_python);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* flags */

static void usage(FILE *out) {
    fprintf(out,
        "usage: bench_train [options]\n"
        "Trains the MLP of mlp.c (synthetic data unless --csv) or the GPT of gpt.c (on the text of fsdp.h)\n"
        "in several configurations, one after another, one BLAS thread per rank, and prints a table: a plain\n"
        "loop without fsdp.h's runtime, FSDP on 1 rank, N plain loops side by side on B/N each without any\n"
        "communication (the machine's ceiling for N ranks), and FULL_SHARD, SHARD_GRAD_OP, NO_SHARD,\n"
        "HYBRID_SHARD on N local ranks (shm), then FULL_SHARD with bf16 gathers and with int8 ones decoded into\n"
        "bf16 (fsdp_desc.param_wire, ZeRO++'s qwZ), and those with int8 gradients (+g8) and int4 ones with error\n"
        "feedback (+g4ef) between hosts (fsdp_desc.grad_wire, ZeRO++'s qgZ): on one host, as here, no gradient\n"
        "crosses a link and grad_wire is ignored (the rows show it costs nothing there).\n"
        "With --memory: FULL_SHARD and NO_SHARD at P = 1, 2, 4, a few\n"
        "steps each, rank 0's peak RSS and fsdp's memory statistics against fsdp_memory_estimate; then\n"
        "activation checkpointing (GPT: activation bytes and step time with every block or every 2nd\n"
        "recomputed; at 8+ blocks, --layers 8, the saving shows best) and frozen parameters (forward only:\n"
        "bytes per parameter).\n"
        "\n");
    fprintf(out, /* (two strings: C99 promises literals of 4095 characters, no more) */
        "  --model M        mlp (default) or gpt\n"
        "  --memory         the memory table instead of the speed table\n"
        "  --machine        print only the machine line the tables end with (the CPU and the examples' matrix\n"
        "                   kernel's measured peak on one core; for scripts' banners) and exit\n"
        "  --offload DIR    the offload table instead: FULL_SHARD on --nproc ranks with nothing, the optimizer\n"
        "                   state (f32, bf16) and everything on disk under DIR (a local disk, not tmpfs):\n"
        "                   ms/step, bytes read and written per step, the disk's bandwidth through fsdp.h's\n"
        "                   I/O path, and the roofline ratio step / max(compute-only step, bytes / bandwidth)\n"
        "  --trace DIR      the tracing table instead: FULL_SHARD on --nproc ranks with tracing off and on\n"
        "                   (the traces go to DIR), interleaved over --rounds: ms/step and their ratio\n"
        "  --ckpt DIR       the checkpoint table instead: FULL_SHARD on --nproc ranks without saves, with a\n"
        "                   sharded save every --save-every N steps (default 5) and with an asynchronous one:\n"
        "                   mean ms/step (saves included) and the time blocked per save\n"
        "  --layers N       Linear layers (MLP, default 6) or transformer blocks (GPT, default 4)\n"
        "  --batch N        global batch in samples (MLP, default 2048) or sequences (GPT, default 16);\n"
        "                   divisible by --nproc, and by 4 with --memory\n"
        "  --steps N        timed steps per configuration (default 10; --memory: 3), after --warmup N\n"
        "                   (default 2; --memory: 0)\n"
        "  --optimizer O    sgd, adam or adamw (default adamw; lr 0.01 for sgd, else 0.001)\n"
        "  --nproc N        ranks of the multi-rank rows (default 2)\n"
        "  --rounds N       run every configuration N times, interleaved, and report the median (default 1)\n"
        "MLP\n"
        "  --hidden N       hidden width (default 1024)\n"
        "  --csv FILE       data as for mlp (features, then an integer label); default synthetic blobs\n"
        "  --features N     synthetic data: features (default 256)\n"
        "  --classes N      synthetic data: classes (default 16)\n"
        "GPT (vocabulary 256: bytes; each block an FSDP unit)\n"
        "  --channels N     embedding width C (default 256)\n"
        "  --heads N        attention heads, dividing --channels (default 4)\n"
        "  --seq-len N      context length T in bytes (default 128)\n"
        "  --data FILE      text to train on (default fsdp.h, found in . or next to the executable)\n"
        "  --torch          also train the same GPT in PyTorch (tests/torch_gpt.py: eager in one process, and\n"
        "                   DistributedDataParallel over gloo on --nproc processes, one intra-op thread each)\n"
        "                   and FSDP with bf16 (P = 1) and f16 param_dtype; adds a column of ratios against PyTorch\n"
        "  --torch-python P the interpreter that has torch (default /usr/bin/python3)\n"
        "  --torch-coretype X  with --torch: also PyTorch rows with OPENBLAS_CORETYPE=X for its BLAS (e.g.\n"
        "                   SkylakeX: OpenBLAS's AVX-512 kernels, which its CPU detection may not pick); auto:\n"
        "                   SkylakeX where the CPU has AVX-512 (F, BW, DQ, VL), else no such rows\n"
        "\n"
        "  --help           this text\n");
}

static void parse(options *o, int argc, char **argv) {
    const char *mlp_flag = NULL, *gpt_flag = NULL, *nproc_flag = NULL;
    const int max_layers = MLP_MAX_LAYERS < GPT_MAX_LAYERS ? MLP_MAX_LAYERS : GPT_MAX_LAYERS;
    memset(o, 0, sizeof *o);
    o->nproc = 2, o->features = 256, o->classes = 16, o->hidden = 1024;
    o->channels = 256, o->heads = 4, o->seq_len = 128;
    o->steps = o->warmup = -1; // their defaults depend on --memory
    o->rounds = 1, o->torch_python = "/usr/bin/python3";
    o->optimizer.kind = FSDP_ADAMW;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(f, "--memory")) { o->memory = 1; continue; }
        if (!strcmp(f, "--machine")) {
            char machine[400];
            example_machine_line(machine, sizeof machine);
            printf("machine: %s\n", machine);
            exit(0);
        }
        if (!strcmp(f, "--torch")) { o->torch = 1, gpt_flag = f; continue; }
        if (strncmp(f, "--", 2) != 0) die_usage("unexpected argument '%s'", f);
        if (!v) die_usage("%s needs a value", f);
        i++;
        if (!strcmp(f, "--model")) {
            if (!strcmp(v, "mlp")) o->model = MODEL_MLP;
            else if (!strcmp(v, "gpt")) o->model = MODEL_GPT;
            else die_usage("--model: unknown value '%s' (choose mlp or gpt)", v);
        }
        else if (!strcmp(f, "--layers")) o->layers = arg_int(f, v, 1, max_layers);
        else if (!strcmp(f, "--batch")) o->batch = arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--steps")) o->steps = arg_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--warmup")) o->warmup = arg_int(f, v, 0, 1000000);
        else if (!strcmp(f, "--nproc")) o->nproc = arg_int(f, v, 2, MAX_RANKS), nproc_flag = f;
        else if (!strcmp(f, "--hidden")) o->hidden = arg_int(f, v, 1, 1 << 16), mlp_flag = f;
        else if (!strcmp(f, "--features")) o->features = arg_int(f, v, 1, 1 << 20), mlp_flag = f;
        else if (!strcmp(f, "--classes")) o->classes = arg_int(f, v, 1, MLP_MAX_CLASSES), mlp_flag = f;
        else if (!strcmp(f, "--csv")) o->csv = v, mlp_flag = f;
        else if (!strcmp(f, "--channels")) o->channels = arg_int(f, v, 1, 1 << 16), gpt_flag = f;
        else if (!strcmp(f, "--heads")) o->heads = arg_int(f, v, 1, 1 << 16), gpt_flag = f;
        else if (!strcmp(f, "--seq-len")) o->seq_len = arg_int(f, v, 1, 1 << 16), gpt_flag = f;
        else if (!strcmp(f, "--data")) o->text_path = v, gpt_flag = f;
        else if (!strcmp(f, "--torch-python")) o->torch_python = v, gpt_flag = f;
        else if (!strcmp(f, "--torch-coretype")) o->torch_coretype = v, gpt_flag = f;
        else if (!strcmp(f, "--rounds")) o->rounds = arg_int(f, v, 1, 64);
        else if (!strcmp(f, "--offload")) o->offload_dir = v;
        else if (!strcmp(f, "--trace")) o->trace_dir = v;
        else if (!strcmp(f, "--ckpt")) o->ckpt_dir = v;
        else if (!strcmp(f, "--save-every")) o->save_every = arg_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--optimizer")) {
            if (!strcmp(v, "sgd")) o->optimizer.kind = FSDP_SGD;
            else if (!strcmp(v, "adam")) o->optimizer.kind = FSDP_ADAM;
            else if (!strcmp(v, "adamw")) o->optimizer.kind = FSDP_ADAMW;
            else die_usage("--optimizer: unknown value '%s' (choose one of sgd, adam, adamw)", v);
        } else die_usage("unknown option '%s'", f);
    }
    if (o->model == MODEL_GPT && mlp_flag) die_usage("%s is an MLP option; with --model gpt see the GPT options", mlp_flag);
    if (o->model == MODEL_MLP && gpt_flag) die_usage("%s is a GPT option: add --model gpt", gpt_flag);
    if (o->memory && nproc_flag) die_usage("--memory runs P = 1, 2 and 4; --nproc does not apply");
    if (o->memory && o->torch) die_usage("--torch adds rows to the speed table, not to --memory's");
    if ((o->offload_dir != NULL) + (o->trace_dir != NULL) + (o->ckpt_dir != NULL) + o->memory + o->torch > 1)
        die_usage("--memory, --offload, --trace, --ckpt and --torch each make a table of their own: choose one");
    if (o->save_every && !o->ckpt_dir) die_usage("--save-every belongs to the checkpoint table: add --ckpt DIR");
    if (!o->save_every) o->save_every = 5;
    if (o->torch_coretype && !o->torch) die_usage("--torch-coretype adds PyTorch rows: add --torch");
    if (o->torch_coretype && !strcmp(o->torch_coretype, "auto")) {
        int avx512 = 0;
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
        avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
        o->torch_coretype = avx512 ? "SkylakeX" : NULL;
    }
    if (!o->layers) o->layers = o->model == MODEL_GPT ? 4 : 6;
    if (!o->batch) o->batch = o->model == MODEL_GPT ? 16 : 2048; /* compute-bound: communication is a small part of a step */
    if (o->steps < 0) o->steps = o->memory ? 3 : 10;
    if (o->warmup < 0) o->warmup = o->memory ? 0 : 2;
    if (o->model == MODEL_GPT && o->channels % o->heads)
        die_usage("--channels %d is not divisible by --heads %d", o->channels, o->heads);
    if (o->memory && o->batch % 4) die_usage("--memory runs up to 4 ranks: --batch %d is not divisible by 4", o->batch);
    if (!o->memory && o->batch % o->nproc) die_usage("--batch %d is not divisible by --nproc %d", o->batch, o->nproc);
    // every field explicit, so the plain loop and fsdp_step apply exactly the same update
    fsdp_optimizer_desc *opt = &o->optimizer;
    opt->lr = opt->kind == FSDP_SGD ? 0.01f : 1e-3f;
    if (opt->kind != FSDP_SGD) opt->beta1 = 0.9f, opt->beta2 = 0.999f, opt->eps = 1e-8f;
    opt->weight_decay = opt->kind == FSDP_ADAMW ? 0.01f : 0.0f, opt->weight_decay_set = 1;
}

int main(int argc, char **argv) {
    example_program = "bench_train";
    options o;
    char err[512];
    int rc;
    parse(&o, argc, argv);
    openblas_set_num_threads(1);
    if (o.model == MODEL_GPT) {
        if (load_text(&o, argv[0]) || (o.torch && find_torch(&o, argv[0]))) return 1;
    } else if (o.csv ? data_csv(&o.data, o.csv, err, sizeof err)
                     : data_blobs(&o.data, 8 * o.batch, o.features, o.classes, 1234)) {
        fprintf(stderr, "bench_train: %s\n", o.csv ? err : "out of memory for the synthetic data");
        return 1;
    }
    print_header(&o, argc, argv);
    rc = o.memory ? memory_table(&o) : o.offload_dir ? offload_table(&o) : o.trace_dir ? trace_table(&o)
         : o.ckpt_dir ? ckpt_table(&o) : speed_table(&o);
    data_free(&o.data);
    free(o.text);
    return rc;
}
