/* gpt: trains a GPT-2 style byte-level language model with fsdp.h; each transformer block is an
   FSDP unit, the root unit holds the embeddings (wte, tied to the LM head, and wpe) and ln_f.

   Build and run:  make demo            (build/gpt --nproc 4: 4 local ranks, FULL_SHARD, on the fsdp.h sources)
                   build/gpt --help
                   build/gpt --nproc 2 --data input.txt --strategy SHARD_GRAD_OP --param-dtype bf16
                   build/gpt --nproc 3 --resume build/gpt_ckpt --steps 800   (any rank count)
                   build/gpt --nproc 4 --save-every 50 --resume auto --max-restarts 3   (elastic)
                   make demo-big        (85 M parameters, 4 ranks, --recompute, --mem-budget 768 MiB per rank)
                   make demo-huge       (2.2 B parameters, 4 ranks, everything offloaded to disk: --offload all)
                   make demo-recover    (--recover: 4 simulated hosts x 2, HYBRID_SHARD, one host killed; root)
                   torchrun-style: RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... build/gpt
   The model and its layers are in gpt_model.h (shared with tests/test_gpt.c). */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt_model.h"

#define VAL_BATCHES 16 // global batches of held-out sequences scored at the end (fewer if the text is short)

typedef struct {
    int nproc;                       // 0: ranks from the environment
    fsdp_backend_kind backend;
    const char *data_path;           // NULL: the fsdp.h sources
    int layers, heads, channels, seq_len, batch, steps, warmup, print_every, save_every, sample, print_units;
    int max_restarts;                // with nproc: fsdp_launch_ex's restarts after a failed rank
    long long fault_at_step;         // GPT_FAULT_AT_STEP (testing): rank 1 kills itself there, first attempt only
    long long fault_in_save;         // GPT_FAULT_IN_SAVE (testing): ... right after that step's save started
    int fault_host;                  // GPT_FAULT_HOST (testing --recover): the host whose ranks GPT_FAULT_AT_STEP
                                     // ends (-1: rank 1)
    int fault_stop;                  // GPT_FAULT_SIGNAL=STOP: they stop (SIGSTOP) rather than die, for a script to act
    long long pause_at_step;         // GPT_PAUSE_AT_STEP (testing --rejoin): the rendezvous stops there
    int recover;                     // --recover: fsdp_desc.recovery on (a lost host's survivors train on)
    int detect_ms, min_replicas;     // --detect-ms, --min-replicas (0: fsdp.h's defaults)
    int recovery_port;               // --recovery-port: rank r listens at it + r for a rejoining host (0: none)
    int rejoin;                      // --rejoin: this rank's host rejoins the running job
    const char *peers;               // --peers (NULL: FSDP_RECOVERY_PEERS)
    int job_world;                   // --rejoin: the job's WORLD_SIZE as it started (the environment's)
    double started;                  // wall-clock seconds at main's start (--rejoin's timeline)
    float lr, min_lr, weight_decay, clip, temperature;
    int min_lr_set;
    int decay_all;                   // --decay-all: weight decay on every parameter, not only the matrices
    int recompute;                   // --recompute K: activation checkpointing of every K-th block (0: off)
    int accum;                       // --accum K: micro-batches per step (gradient accumulation; 1: none)
    int accum_reduce;                // --accum-reduce: reduce every micro-batch's gradients (no fsdp_set_no_sync)
    double mem_budget_mib;           // --mem-budget: refuse to start if a rank's estimate exceeds it (0: none)
    double process_bytes;            // this process's peak RSS before the ranks start (for --mem-budget)
    fsdp_strategy strategy;
    fsdp_dtype param_dtype;
    fsdp_offload_desc offload;       // --offload, --offload-dir, --offload-ram
    fsdp_dtype state_dtype;          // --state-dtype
    fsdp_wire param_wire;            // --param-wire: int8 or int4 gathers (0: param_dtype)
    fsdp_wire grad_wire;             // --grad-wire: int8 or int4 gradients between hosts (0: none)
    int error_feedback;              // --error-feedback
    int overlap_step;                // --overlap-step
    size_t wire_block;               // --wire-block (0: fsdp.h's default, 128)
    fsdp_reshard_mode reshard;       // --reshard-after-forward (0: the strategy's)
    const char *ckpt, *resume, *prompt; // resume "auto": the ckpt directory's checkpoint, if any
    const char *log_path;            // --log: one JSON line per step (rank 0)
    int async_ckpt;                  // --async-ckpt: fsdp_save_sharded_async
    int no_roofline;                 // --no-roofline: no disk measurement at the end of an offloaded run
    unsigned long long seed;
    char ckpt_default[1100];
    unsigned char *text;             // the whole text: train is [0, train_size), validation the rest
    size_t size, train_size;
    char data_name[1300];
} options;

static const char *const reshard_names[] = {"all", "none", "host", NULL}; // FSDP_RESHARD_ALL, NONE, HOST

static double median(double *v, int n) { // sorts v
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

static double mib(double bytes) { return bytes / 1048576.0; }

static uint64_t rng_next(uint64_t *state) { // splitmix64
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ----------------------------------------------------------------------------------------- */
/* the end of training: the held-out loss (gpt_heldout_loss: every rank scores a share through
   the hooks, forward only) and a sample, on rank 0 with a plain copy of the weights (gathered
   with fsdp_gather_param: sampling byte by byte on one rank would keep the others waiting in
   every hook) */

/* Prints one character of text (n bytes left): a printable ASCII byte, newline or tab, or a whole
   valid UTF-8 sequence; anything else as '?', so the terminal never sees control bytes or broken
   sequences. Returns the bytes consumed. */
static int print_byte_or_utf8(const unsigned char *text, int n) {
    int len = text[0] < 0x80 ? 1 : text[0] >= 0xc2 && text[0] <= 0xdf ? 2 : text[0] >= 0xe0 && text[0] <= 0xef ? 3
            : text[0] >= 0xf0 && text[0] <= 0xf4 ? 4 : 0;
    if (len == 1) {
        putchar(text[0] == '\n' || text[0] == '\t' || (text[0] >= 32 && text[0] != 127) ? text[0] : '?');
        return 1;
    }
    for (int k = 1; k < len; k++) // continuation bytes (overlong and surrogate forms are let through)
        if (k >= n || (text[k] & 0xc0) != 0x80) len = 0;
    if (len == 0) { putchar('?'); return 1; }
    fwrite(text, 1, (size_t)len, stdout);
    return len;
}

/* Continues the prompt by n bytes: each from the model's distribution at the last position
   (sharpened by 1/temperature; 0: the most likely byte), the context being the last T bytes. */
static void sample(gpt *m, gpt_acts *acts, const options *o, int n) {
    int T = acts->T, V = m->config.vocab_size, len = (int)strlen(o->prompt);
    unsigned char *text = (unsigned char *)malloc((size_t)len + (size_t)n + 1);
    uint64_t rng = o->seed ^ 0x5eed5eedull;
    double *weights = (double *)malloc(sizeof(double) * (size_t)V);
    if (!text || !weights) { fprintf(stderr, "gpt: out of memory for the sample\n"); free(text); free(weights); return; }
    memcpy(text, o->prompt, (size_t)len);
    for (int i = 0; i < n; i++, len++) {
        int ctx = len < T ? len : T, next = 0;
        const float *probs;
        double total = 0, r;
        for (int t = 0; t < ctx; t++) acts->inputs[t] = text[len - ctx + t];
        gpt_forward(m, acts, 1, ctx, 0, NULL);
        probs = acts->a.probs + (size_t)(ctx - 1) * V;
        for (int v = 0; v < V; v++) {
            weights[v] = o->temperature > 0 ? pow((double)probs[v], 1.0 / o->temperature) : 0;
            total += weights[v];
            if (probs[v] > probs[next]) next = v;
        }
        if (o->temperature > 0 && total > 0) { // inverse CDF; rounding leftovers fall to the last byte
            r = (double)(rng_next(&rng) >> 11) * (1.0 / 9007199254740992.0) * total;
            for (next = 0; next < V - 1 && (r -= weights[next]) >= 0; next++) {}
        }
        text[len] = (unsigned char)next;
    }
    printf("\nsample (%d bytes after the prompt, %s, seed %llu):\n----\n", n,
           o->temperature > 0 ? "sampled" : "greedy", o->seed);
    for (int i = 0; i < len;) i += print_byte_or_utf8(text + i, len - i);
    printf("\n----\n");
    free(text);
    free(weights);
}

/* ----------------------------------------------------------------------------------------- */
/* what each rank runs */

/* What the ranks sent per step (steps 2.., where the first warms up), summed over the ranks:
   across hosts and within them (fsdp_step_report's counts; the loss's all-reduce included). */
static void print_bytes_sent(const double *all, int P, int stride) {
    double net = 0, host = 0, most = 0;
    int most_rank = 0;
    for (int r = 0; r < P; r++) {
        net += all[stride * r + 12], host += all[stride * r + 13];
        if (all[stride * r + 12] > most) most = all[stride * r + 12], most_rank = r;
    }
    printf("bytes sent per step, all %d ranks: %.0f across hosts (most by one rank: %.0f, rank %d), %.0f within hosts\n", P,
           net, most, most_rank, host);
}

/* "actual/estimate: persistent 1.000, peak unsharded 0.687" over the ranks' statistics (stride
   doubles each: persistent, then peak unsharded), as a range when the ranks differ. */
static void print_vs_estimate(const double *all, int P, int stride, double est_persistent, double est_peak_unsharded) {
    const char *names[2] = {"persistent", "peak unsharded"};
    double est[2] = {est_persistent, est_peak_unsharded};
    printf("actual/estimate:");
    for (int k = 0; k < 2; k++) {
        double lo = 0, hi = 0;
        for (int r = 0; r < P; r++) {
            double ratio = est[k] > 0 ? all[stride * r + k] / est[k] : 0;
            if (r == 0 || ratio < lo) lo = ratio;
            if (r == 0 || ratio > hi) hi = ratio;
        }
        if (est[k] <= 0) printf("%s %s -", k ? "," : "", names[k]);
        else if (hi - lo < 5e-4) printf("%s %s %.3f", k ? "," : "", names[k], lo);
        else printf("%s %s %.3f .. %.3f (over the ranks)", k ? "," : "", names[k], lo, hi);
    }
    printf("\n");
}

/* Checkpoints are sharded (one file per rank and index.json, with the AdamW state) in --ckpt DIR.
   index.json is the commit point and the files of an earlier save are removed only after it, so
   DIR always holds the newest complete checkpoint, whatever killed the run. Besides fsdp's own
   "step" (optimizer updates, which leave out steps skipped for a non-finite gradient) the
   metadata holds gpt.step, the training steps done: the data (step s reads fixed places of the
   text) and the learning-rate schedule continue from there. */
static int save_checkpoint(fsdp_ctx *ctx, const options *o, int rank, int P, long long step) {
    char step_text[32], heads_text[16];
    fsdp_kv kv[2];
    fsdp_save_options so;
    double t = fsdp_now();
    snprintf(step_text, sizeof step_text, "%lld", step);
    snprintf(heads_text, sizeof heads_text, "%d", o->heads);
    kv[0].key = "gpt.step", kv[0].value = step_text;
    kv[1].key = "gpt.heads", kv[1].value = heads_text; // the one model flag the shapes do not tell (for distill)
    memset(&so, 0, sizeof so);
    so.with_optimizer = 1;
    so.metadata = kv;
    so.num_metadata = 2;
    if ((o->async_ckpt ? fsdp_save_sharded_async : fsdp_save_sharded)(ctx, o->ckpt, &so)) {
        fprintf(stderr, "rank %d: saving the checkpoint to %s failed: %s\n(choose another directory with --ckpt DIR, or "
                "--ckpt none)\n", rank, o->ckpt, fsdp_last_error(ctx));
        return -1;
    }
    if (step == o->fault_in_save && rank == (P > 1) && example_restart_count() == 0) {
        fprintf(stderr, "rank %d: GPT_FAULT_IN_SAVE=%lld: killing this rank (SIGKILL) while its save is written\n", rank, step);
        raise(SIGKILL);
    }
    if (rank == 0 && o->async_ckpt)
        printf("saving %s (step %lld, with AdamW state) behind the training: blocked %.1f ms\n", o->ckpt, step,
               1e3 * (fsdp_now() - t));
    else if (rank == 0)
        printf("saved %s (step %lld, with AdamW state) in %.0f ms\n", o->ckpt, step, 1e3 * (fsdp_now() - t));
    return 0;
}

/* Where a run starts, decided by rank 0 and broadcast whole (so the ranks cannot disagree). */
enum { RESUME_ACTION, RESUME_STEP, RESUME_FSDP_STEP, RESUME_N };
enum { RESUME_ERROR = -1, RESUME_FROM_SCRATCH = 0, RESUME_LOAD = 1 };

/* Rank 0: reads the checkpoint in dir. With is_auto, a dir without index.json (no save has
   completed yet) means starting from scratch; anything else wrong with it is an error. */
static void find_resume_point(const char *dir, int is_auto, long long v[RESUME_N], char *err, size_t err_size) {
    char path[1200];
    const char *text;
    char *end;
    fsdp_index *index;
    memset(v, 0, sizeof(long long) * RESUME_N);
    v[RESUME_ACTION] = RESUME_ERROR;
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (is_auto && access(path, F_OK) != 0 && errno == ENOENT) {
        v[RESUME_ACTION] = RESUME_FROM_SCRATCH;
        return;
    }
    if (fsdp_index_open(&index, dir, err, err_size)) return;
    v[RESUME_FSDP_STEP] = fsdp_index_step(index);
    if ((text = fsdp_index_metadata(index, "gpt.step")) != NULL) {
        errno = 0;
        v[RESUME_STEP] = strtoll(text, &end, 10);
        if (!*text || *end || errno || v[RESUME_STEP] < 0 || v[RESUME_STEP] < v[RESUME_FSDP_STEP]) {
            snprintf(err, err_size, "the metadata gpt.step is not a step count of at least its %lld optimizer steps "
                     "(the checkpoint was not written by gpt, or was edited)", v[RESUME_FSDP_STEP]);
            fsdp_index_close(index);
            return;
        }
    } else { // saved by another program: continue at fsdp's step
        v[RESUME_STEP] = v[RESUME_FSDP_STEP] > 0 ? v[RESUME_FSDP_STEP] : 0;
    }
    fsdp_index_close(index);
    v[RESUME_ACTION] = RESUME_LOAD;
}

/* Collective: --resume. Returns the step to continue after (0: from scratch), -1 on error;
   *loaded says whether a checkpoint was loaded. */
static long long resume(fsdp_ctx *ctx, fsdp_comm *comm, const options *o, int *loaded) {
    int rank = fsdp_comm_rank(comm), is_auto = strcmp(o->resume, "auto") == 0;
    const char *dir = is_auto ? o->ckpt : o->resume;
    long long v[RESUME_N];
    char err[600] = "";
    fsdp_load_options lo;
    fsdp_load_report report;
    *loaded = 0;
    if (rank == 0) find_resume_point(dir, is_auto, v, err, sizeof err);
    if (fsdp_broadcast(comm, v, sizeof v / 4, FSDP_F32, 0)) { // integers, moved as bytes
        fprintf(stderr, "rank %d: broadcasting where to resume: %s\n", rank, fsdp_comm_last_error(comm));
        return -1;
    }
    if (v[RESUME_ACTION] == RESUME_ERROR) {
        if (rank == 0)
            fprintf(stderr, "gpt: --resume %s: %s\n%s", o->resume, err, is_auto ? "(gpt cannot continue from what the --ckpt "
                    "directory holds: move it away, or choose another --ckpt, to start from scratch)\n" : "");
        return -1;
    }
    if (v[RESUME_ACTION] == RESUME_FROM_SCRATCH) return 0;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1, lo.with_optimizer = 1;
    if (fsdp_load_sharded(ctx, dir, &lo, &report)) {
        fprintf(stderr, "rank %d: --resume %s: %s\n(the checkpoint must come from the same --layers, --heads, "
                "--channels and --seq-len; --nproc and --strategy may differ)\n", rank, dir, fsdp_last_error(ctx));
        return -1;
    }
    if (report.step != v[RESUME_FSDP_STEP]) {
        fprintf(stderr, "rank %d: --resume %s: the checkpoint changed while it was being loaded (step %lld, then %lld): "
                "is another run saving to it?\n", rank, dir, v[RESUME_FSDP_STEP], (long long)report.step);
        return -1;
    }
    *loaded = 1;
    return v[RESUME_STEP];
}

/* ----------------------------------------------------------------------------------------- */
/* --recover: a lost host's survivors train on (HYBRID_SHARD, a replica per host: fsdp.h's >>recovery).
   fsdp_step recovers from the loss and says so in its report; the loop then takes its data by
   fsdp_replicas and its collectives over fsdp_world_comm, and takes a dropped iteration again.
   --rejoin: a lost host's ranks started again come back into the running job (fsdp_init with
   recovery.rejoin) and take, from the step they are admitted at, the data their replica gets. */

static double wall_now(void) { // CLOCK_REALTIME: a script can set these times beside the moment it killed a host
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A time of fsdp_recovery_timeline_get (fsdp_now's monotonic clock) as wall_now seconds; 0 stays 0.
static double wall_of(double t) { return t > 0 ? t + wall_now() - fsdp_now() : 0; }

/* What the loop saw of the last change of membership (wall_now seconds; 0: not seen), beside the
   phases inside fsdp_step that fsdp_recovery_timeline_get gives. */
typedef struct {
    double last_done;       // the last step completed before the change (and its number)
    long long last_step;
    double step_ms;         // that step's time (from the step before it): a step with no change
    double returned;        // fsdp_step returned with the new epoch
    long long epoch;        // the membership training now (fsdp_step_report.epoch)
    int pending;            // the next completed step prints a timeline: 1 of a loss, 2 of a rejoin, 3 of
                            // this rank's own rejoin (--rejoin, the host's first rank)
    int replicas_before, dropped;
    char data[300];         // the blob's text but its step: what fixes each step's data (--rejoin checks it)
} recovery_timeline;

/* The fewest replicas a run can be left with: each loss must leave a strict majority of the last
   membership (so from 3 or more down to 2), and --min-replicas. */
static int fewest_replicas(const options *o, int replicas) {
    int fewest = o->min_replicas > 2 ? o->min_replicas : 2;
    return fewest < replicas ? fewest : replicas;
}

/* --recover: the survivors take the whole global batch, so it must split evenly at every replica
   count the run can be left with: into equal shares per replica, per rank (G a replica's ranks)
   and per --accum micro-batch. *most: the most sequences a rank then takes. 0, or 1 (rank 0 says why).
   P: the world (a --rejoin rank's is its host's: the job's is o->job_world). */
static int check_recover_batch(const options *o, int P, int G, int rank, int *most) {
    int replicas = (o->rejoin ? o->job_world : P) / G, fewest = fewest_replicas(o, replicas);
    *most = o->batch / P;
    if (!o->recover) return 0;
    for (int r = replicas; r >= fewest; r--) {
        if (o->batch % (r * G * o->accum) == 0) continue;
        if (rank == 0)
            fprintf(stderr, "gpt: --recover: --batch %d does not split into %d replicas of %d ranks%s: after a lost host the "
                    "survivors take the whole global batch, so it must divide evenly at %d down to %d replicas; use a "
                    "multiple of every count of ranks%s\n", o->batch, r, G, o->accum > 1 ? " times --accum" : "", replicas,
                    fewest, o->accum > 1 ? " times --accum" : "");
        return 1;
    }
    *most = o->batch / (fewest * G);
    return 0;
}

/* This rank's part of the step's global batch, by the replicas training now (fsdp_replicas): the
   --batch sequences split evenly over the replicas (replica i of R takes i*batch/R ..), each share
   over the replica's ranks. Without a loss this is rank * batch/P as always; after one, the
   survivors take the whole batch, so the losses stay those of the same sequences. Also the world
   (*rank of *P) the context trains over now. */
static void batch_share(fsdp_ctx *ctx, const options *o, int *rank, int *P, int *first, int *B) {
    fsdp_comm *world = fsdp_world_comm(ctx);
    int replicas, index, per_replica;
    fsdp_replicas(ctx, &replicas, &index);
    *rank = fsdp_comm_rank(world), *P = fsdp_comm_size(world);
    per_replica = o->batch / replicas;
    *B = per_replica / (*P / replicas);
    *first = index * per_replica + *rank % (*P / replicas) * *B;
}

/* The step's mean loss over the world (collective; safe once fsdp_step returned: the runtime's comm
   thread is idle): the ranks' losses summed with a weight each, 1 for a rank that took the step, 0
   for a --rejoin rank, which takes part in the reduction of the step it was admitted after. */
static int mean_loss(fsdp_ctx *ctx, float *loss, float weight) {
    float sum[2] = {*loss * weight, weight};
    int rc = fsdp_all_reduce(fsdp_world_comm(ctx), sum, sum, 2, FSDP_F32, FSDP_SUM);
    if (!rc) *loss = sum[0] / sum[1];
    return rc;
}

/* The data position a rejoining rank receives (fsdp_recovery_set_blob): the step whose data the
   next iteration takes, after what fixes every step's data (tl->data), which the joiner checks. */
static void set_data_position(const recovery_timeline *tl, fsdp_ctx *ctx, long long next) {
    char blob[400];
    int n = snprintf(blob, sizeof blob, "%s: next step %lld", tl->data, next);
    fsdp_recovery_set_blob(ctx, blob, (size_t)n + 1);
}

/* A --rejoin rank, once admitted: the data position from its counterpart's blob (the step its
   loop goes on from, in *first_step), checked against this rank's own flags and text. 0, or 1 (said). */
static int rejoin_position(const recovery_timeline *tl, fsdp_ctx *ctx, long long *first_step) {
    char blob[FSDP_RECOVERY_BLOB_MAX + 1] = "";
    const char *at;
    int64_t step = 0;
    size_t n = 0;
    fsdp_recovery_state(ctx, &step, blob, FSDP_RECOVERY_BLOB_MAX, &n);
    at = strstr(blob, ": next step ");
    if (at && (size_t)(at - blob) == strlen(tl->data) && !strncmp(blob, tl->data, strlen(tl->data))) {
        *first_step = atoll(at + strlen(": next step "));
        return 0;
    }
    fprintf(stderr, "gpt: --rejoin: the survivors train with '%.*s' (at fsdp step %lld), this rank was started with "
            "'%s': start it with the job's flags and data\n", (int)(at ? at - blob : (long)strlen(blob)), blob,
            (long long)step, tl->data);
    return 1;
}

static void timeline_line(const char *kind, double since, const char *event, double t, const char *what) {
    if (t > 0) printf("%s: %s at %.3f (+%.0f ms)%s%s\n", kind, event, t, 1e3 * (t - since), *what ? ": " : "", what);
}

/* Rank 0 of the survivors, at the first step completed after a loss: each phase's time, also
   after the last step done before the loss (a script that killed the host relates the
   wall-clock times to its own). */
static void print_loss_timeline(const recovery_timeline *tl, fsdp_ctx *ctx, const options *o, long long step,
                                double done) {
    int replicas, P = fsdp_comm_size(fsdp_world_comm(ctx));
    char what[200];
    fsdp_recovery_timeline ft;
    fsdp_recovery_timeline_get(ctx, &ft);
    fsdp_replicas(ctx, &replicas, NULL);
    printf("recovery: epoch %lld: the timeline on rank 0 of the survivors (unix time, s; + ms after step %lld, the last "
           "done before the loss)\n", tl->epoch, tl->last_step);
    timeline_line("recovery", tl->last_done, "last step done", tl->last_done, "");
    timeline_line("recovery", tl->last_done, "detected", wall_of(ft.loss_seen), "this rank's first op to fail (a hook's "
                  "or fsdp_step's): recovery began");
    timeline_line("recovery", tl->last_done, "stopped", wall_of(ft.stopped), "everything in flight stopped");
    snprintf(what, sizeof what, "epoch %lld: %d of %d replicas go on", (long long)ft.loss_epoch, replicas,
             tl->replicas_before);
    timeline_line("recovery", tl->last_done, "agreed", wall_of(ft.agreed), what);
    snprintf(what, sizeof what, "the survivors' world made: %d ranks", P);
    timeline_line("recovery", tl->last_done, "rebuilt", wall_of(ft.rebuilt), what);
    snprintf(what, sizeof what, "epoch %lld; step %lld %s", tl->epoch, tl->last_step + 1, tl->dropped ?
             "dropped: taken again by the survivors" : "applied by every survivor");
    timeline_line("recovery", tl->last_done, "fsdp_step returned", tl->returned, what);
    snprintf(what, sizeof what, "step %lld; the global batch of %d sequences now %d per replica; completed steps lost: "
             "0%s", step, o->batch, o->batch / replicas, tl->dropped ? " (1 iteration taken again)" : "");
    timeline_line("recovery", tl->last_done, "next step done", done, what);
}

/* When a rejoin's state had all moved (fsdp_recovery_timeline's join_streamed: the optimizer state
   behind training; join_done where none moved so), and the seconds from the world made to then. */
static double state_moved(const fsdp_recovery_timeline *ft, double *seconds) {
    double end = ft->join_streamed > 0 ? ft->join_streamed : ft->join_done;
    *seconds = end - ft->join_world;
    return end;
}

/* Rank 0 of the survivors, at the first step completed after a rejoin (with every replica: caught
   up): the admission's phases, the state's bytes and rate, and the pause it cost the survivors:
   what the admitting step and this one (the optimizer state moved behind it) took beyond the step
   before them (meaningless where a test stopped rank 0 in one, as tests/multihost/test_recover.sh
   does). */
static void print_rejoin_timeline(const recovery_timeline *tl, fsdp_ctx *ctx, const options *o, long long step,
                                  double done) {
    int replicas, P = fsdp_comm_size(fsdp_world_comm(ctx));
    double admit_ms = 1e3 * (tl->returned - tl->last_done), next_ms = 1e3 * (done - tl->returned), state_s, moved;
    char what[300];
    fsdp_recovery_timeline ft;
    fsdp_recovery_timeline_get(ctx, &ft);
    fsdp_replicas(ctx, &replicas, NULL);
    moved = state_moved(&ft, &state_s);
    printf("rejoin: epoch %lld: the timeline on rank 0 of the survivors (unix time, s; + ms after step %lld, the last "
           "done before the admitting one)\n", tl->epoch, tl->last_step);
    timeline_line("rejoin", tl->last_done, "last step done", tl->last_done, "");
    snprintf(what, sizeof what, "step %lld applied; its commit point carried the joiners' request", tl->last_step + 1);
    timeline_line("rejoin", tl->last_done, "admission began", wall_of(ft.join_begin), what);
    snprintf(what, sizeof what, "epoch %lld: %d of %d replicas, %d ranks", (long long)ft.join_epoch, replicas,
             replicas, P);
    timeline_line("rejoin", tl->last_done, "world made", wall_of(ft.join_world), what);
    snprintf(what, sizeof what, "what a step needs: master shards, the units' order, step %lld, the data position",
             (long long)ft.join_step);
    timeline_line("rejoin", tl->last_done, "first part sent", wall_of(ft.join_done), what);
    snprintf(what, sizeof what, "the admitting step took %.0f ms, the step before it %.0f ms", admit_ms, tl->step_ms);
    timeline_line("rejoin", tl->last_done, "fsdp_step returned", tl->returned, what);
    snprintf(what, sizeof what, "%llu bytes (%.2f MiB) in %.1f ms, %.1f MB/s: master shards, then optimizer state %s",
             (unsigned long long)ft.join_bytes, mib((double)ft.join_bytes), 1e3 * state_s,
             state_s > 0 ? (double)ft.join_bytes / state_s / 1e6 : 0.0,
             ft.join_streamed > 0 ? "behind training (the next step ran meanwhile)" : "(none behind training)");
    timeline_line("rejoin", tl->last_done, "state sent", wall_of(moved), what);
    snprintf(what, sizeof what, "step %lld done with all %d replicas (in %.0f ms); the global batch of %d sequences now "
             "%d per replica; the survivors' pause %.0f ms (the admitting step %+.0f, this one %+.0f, against the step "
             "before)", step, replicas, next_ms, o->batch, o->batch / replicas, admit_ms + next_ms - 2 * tl->step_ms,
             admit_ms - tl->step_ms, next_ms - tl->step_ms);
    timeline_line("rejoin", tl->last_done, "caught up", done, what);
}

/* A --rejoin host's first rank, at its first completed step: when it asked, got the state, trained. */
static void print_own_rejoin(fsdp_ctx *ctx, const options *o, long long step, double done) {
    fsdp_recovery_timeline ft;
    double state_s, moved;
    int replicas, index;
    char what[240];
    fsdp_recovery_timeline_get(ctx, &ft);
    fsdp_replicas(ctx, &replicas, &index);
    moved = state_moved(&ft, &state_s);
    printf("rejoin: the timeline of this rejoining host's first rank (unix time, s; + ms after its process started)\n");
    timeline_line("rejoin", o->started, "process started", o->started, "");
    timeline_line("rejoin", o->started, "requested", wall_of(ft.join_begin), "fsdp_init's first hello to the survivors");
    snprintf(what, sizeof what, "rank %d of %d, replica %d of %d", fsdp_comm_rank(fsdp_world_comm(ctx)),
             fsdp_comm_size(fsdp_world_comm(ctx)), index, replicas);
    timeline_line("rejoin", o->started, "world made", wall_of(ft.join_world), what);
    timeline_line("rejoin", o->started, "first part received", wall_of(ft.join_done), "master shards, step, the data "
                  "position: fsdp_init returned");
    snprintf(what, sizeof what, "%llu bytes in %.1f ms, %.1f MB/s, checked (CRC-32C); from step %lld%s",
             (unsigned long long)ft.join_bytes, 1e3 * state_s, state_s > 0 ? (double)ft.join_bytes / state_s / 1e6 : 0.0,
             (long long)ft.join_step, ft.join_streamed > 0 ? "; the optimizer state behind the first step" : "");
    timeline_line("rejoin", o->started, "state received", wall_of(moved), what);
    snprintf(what, sizeof what, "step %lld", step);
    timeline_line("rejoin", o->started, "first step done", done, what);
}

/* --recover, after fsdp_init (and --resume): the timeline's start and the data's description; a
   --rejoin rank takes its data position (*first_step) and, as the survivors do after the step that
   admitted it, the loss's reduction (and that step's save). comm: desc.comm. 0, or 1 (said). */
static int recovery_start(recovery_timeline *tl, fsdp_ctx *ctx, const options *o, fsdp_comm *comm,
                          long long *first_step) {
    fsdp_recovery_timeline ft;
    uint64_t text_hash = 0xcbf29ce484222325ull;
    float no_loss = 0;
    for (size_t i = 0; i < o->train_size; i++) text_hash = (text_hash ^ o->text[i]) * 0x100000001b3ull;
    snprintf(tl->data, sizeof tl->data, "gpt --batch %d --seq-len %d --steps %d --warmup %d --lr %g --min-lr %g, %zu bytes "
             "of text to train on (FNV-1a %016llx)", o->batch, o->seq_len, o->steps, o->warmup, (double)o->lr,
             (double)o->min_lr, o->train_size, (unsigned long long)text_hash);
    fsdp_replicas(ctx, &tl->replicas_before, NULL);
    fsdp_recovery_timeline_get(ctx, &ft);
    tl->epoch = o->rejoin ? ft.join_epoch : 0;
    tl->last_done = wall_now(), tl->last_step = *first_step;
    if (!o->rejoin) return 0;
    if (rejoin_position(tl, ctx, first_step)) return 1;
    tl->last_step = *first_step, tl->pending = fsdp_comm_rank(comm) == 0 ? 3 : 0;
    if (mean_loss(ctx, &no_loss, 0)) {
        fprintf(stderr, "gpt: --rejoin: all_reduce of the admitting step's loss: %s\n",
                fsdp_comm_last_error(fsdp_world_comm(ctx)));
        return 1;
    }
    if (strcmp(o->ckpt, "none") != 0 && o->save_every && *first_step % o->save_every == 0)
        return save_checkpoint(ctx, o, fsdp_comm_rank(fsdp_world_comm(ctx)), fsdp_comm_size(fsdp_world_comm(ctx)),
                               *first_step) != 0;
    return 0;
}

/* After fsdp_step returned 0: whether the membership changed in it (report->epoch moved on: a
   loss, or a rejoin when the replicas grew) and what the loop does: 0 go on; 1 take this iteration
   again (the step was dropped); -1 stop (forward or backward failed without a loss that fsdp_step
   recovered from). Prints the timeline (rank 0) at the first step completed after the change. */
static int after_step(recovery_timeline *tl, fsdp_ctx *ctx, const options *o, const fsdp_step_report *report,
                      long long step, int pass_failed) {
    double now = wall_now();
    if (report->epoch != tl->epoch) { // a change in this fsdp_step
        int rejoined = report->replicas > tl->replicas_before && !report->dropped;
        tl->epoch = report->epoch, tl->returned = now, tl->dropped = report->dropped, tl->pending = rejoined ? 2 : 1;
        return rejoined ? 0 : report->dropped; // (a rejoin: this step was applied, and the next is the first with all)
    }
    if (pass_failed) return -1;
    if (report->dropped) return 1; // (a recovery reports a new epoch: not reached)
    if (tl->pending == 3) print_own_rejoin(ctx, o, step + 1, now);
    else if (tl->pending && fsdp_comm_rank(fsdp_world_comm(ctx)) == 0)
        (tl->pending == 2 ? print_rejoin_timeline : print_loss_timeline)(tl, ctx, o, step + 1, now);
    if (tl->pending) fsdp_replicas(ctx, &tl->replicas_before, NULL);
    tl->pending = 0;
    tl->step_ms = 1e3 * (now - tl->last_done), tl->last_done = now, tl->last_step = step + 1;
    return 0;
}

/* --recover, at the end (collective): whether every replica holds the same master weights, bit for
   bit. Every rank gathers each parameter (fsdp_gather_param: from its own replica's shards) and
   hashes them in order (FNV-1a, 64 bits); rank 0 compares the ranks' hashes and prints the
   model's, which two runs can compare. 0, or -1 if a gather failed. */
static int print_replica_checksums(fsdp_ctx *ctx, const gpt *m, int rank) {
    fsdp_comm *world = fsdp_world_comm(ctx);
    int P = fsdp_comm_size(world), replicas, differ = -1, n = fsdp_model_num_params(m->model), rc = 0;
    uint64_t mine = 0xcbf29ce484222325ull, *all = (uint64_t *)calloc((size_t)P, 8);
    int64_t largest = 1;
    float *full;
    for (int p = 0; p < n; p++)
        if (fsdp_model_param_numel(m->model, p) > largest) largest = fsdp_model_param_numel(m->model, p);
    full = (float *)malloc(sizeof(float) * (size_t)largest);
    for (int p = 0; p < n && all && full && !rc; p++) {
        const unsigned char *bytes = (const unsigned char *)full;
        if ((rc = fsdp_gather_param(ctx, p, full)) != 0) break;
        for (size_t i = 0; i < sizeof(float) * (size_t)fsdp_model_param_numel(m->model, p); i++)
            mine = (mine ^ bytes[i]) * 0x100000001b3ull;
    }
    if (!all || !full || rc || fsdp_all_gather(world, &mine, all, 2, FSDP_F32)) { // (64-bit hashes, moved as bytes)
        fprintf(stderr, "rank %d: the replicas' checksums: %s\n", rank, rc ? fsdp_last_error(ctx) : !all || !full ?
                "out of memory" : fsdp_comm_last_error(world));
        free(all), free(full);
        return -1;
    }
    fsdp_replicas(ctx, &replicas, NULL);
    for (int r = 1; r < P && differ < 0; r++)
        if (all[r] != all[0]) differ = r;
    if (rank == 0 && differ < 0)
        printf("replicas: the %d replicas' master weights are bitwise equal (checksum %016llx)\n", replicas,
               (unsigned long long)all[0]);
    else if (rank == 0)
        printf("replicas: the master weights DIFFER: rank %d's checksum %016llx, rank 0's %016llx\n", differ,
               (unsigned long long)all[differ], (unsigned long long)all[0]);
    free(all), free(full);
    return 0;
}

/* The FSDP configuration of a run at world size P (local_size ranks per host). With comm NULL:
   for fsdp_memory_estimate before the ranks start. */
static void make_desc(const options *o, fsdp_comm *comm, int P, int local_size, fsdp_desc *desc) {
    static const char *const wrap_types[] = {"Block", NULL};
    static const fsdp_param_group decay_matrices_only[1] = {{NULL, 0, 1, 0.0f, 0}}; // GPT-2's: no decay below 2-D
    memset(desc, 0, sizeof *desc);
    desc->comm = comm;
    desc->strategy = o->strategy;
    desc->wrap.kind = FSDP_WRAP_TYPES;
    desc->wrap.types = wrap_types;
    desc->param_dtype = o->param_dtype;
    desc->fp32_compute_view = o->param_dtype != FSDP_F32; // the f32 kernels read fsdp_param
    desc->loss_scale.enabled = o->param_dtype == FSDP_F16;   // f16 gradients need it (GradScaler's defaults)
    desc->forward_prefetch = 1;
    desc->backward_prefetch = FSDP_BACKWARD_PRE;
    // HYBRID_SHARD: a shard group per host (the others shard over all ranks and use no group)
    if (o->strategy == FSDP_HYBRID_SHARD) desc->shard_group_size = local_size;
    if (o->strategy == FSDP_HYBRID_SHARD && local_size == P && P % 2 == 0 && !o->rejoin)
        desc->shard_group_size = P / 2; // one host: two replicas of half the ranks each, so something is replicated
    desc->seed = o->seed;
    desc->optimizer.kind = FSDP_ADAMW;
    desc->optimizer.lr = o->lr;
    desc->optimizer.weight_decay = o->weight_decay;
    desc->optimizer.weight_decay_set = 1;
    desc->optimizer.state_dtype = o->state_dtype;
    desc->offload = o->offload;
    desc->param_wire = o->param_wire;
    desc->grad_wire = o->grad_wire;
    desc->error_feedback = o->error_feedback;
    desc->overlap_step = o->overlap_step;
    desc->wire_block = o->wire_block;
    desc->reshard_after_forward = o->reshard;
    desc->recovery.enabled = o->recover;
    desc->recovery.detect_ms = o->detect_ms;
    desc->recovery.min_replicas = o->min_replicas;
    desc->recovery.port = o->recovery_port;
    desc->recovery.rejoin = o->rejoin;
    desc->recovery.peers = o->peers;
    if (o->recover) desc->logger.fn = fsdp_log_stderr; // (fsdp.h's warnings say what each recovery did)
    if (!o->decay_all) desc->param_groups = decay_matrices_only, desc->num_param_groups = 1;
}

/* --mem-budget: what one rank of P needs, estimated before anything is allocated. */
typedef struct {
    fsdp_memory_stats fsdp;  // fsdp_memory_estimate: parameter, gradient and AdamW shards, gathered units, gradients
    double activations;      // gpt_acts_bytes for this rank's sequences
    double sample_copy;      // the whole model in f32 on every rank, for the sample at the end (--sample > 0)
    double gemm_scratch;     // the matrix kernel's packing buffers (example_gemm.h)
    double process;          // what the process held before the ranks started (libraries, the text)
    double peer_shards;      // shm: the peers' f32 shards this rank's gathers read in place (shared memory: in
                             // every reader's RSS, stored once)
    double total;
} memory_need;

static int estimate_memory(const options *o, int P, memory_need *need) {
    gpt_config config = {256, o->seq_len, o->layers, o->heads, o->channels};
    fsdp_desc desc;
    gpt m;
    int rc;
    memset(need, 0, sizeof *need);
    if (gpt_build(&m, config)) return -1;
    make_desc(o, NULL, P, P, &desc);
    rc = fsdp_memory_estimate(m.model, &desc, P, &need->fsdp);
    need->activations = (double)gpt_acts_bytes(&config, o->batch / P, o->seq_len, o->recompute, 1);
    need->sample_copy = o->sample > 0 ? sizeof(float) * (double)m.num_params : 0;
    need->process = o->process_bytes;
    need->gemm_scratch = (double)gpt_sgemm_scratch_bytes(&config, o->batch / P, o->seq_len);
    if (o->backend == FSDP_BACKEND_SHM && o->param_dtype == FSDP_F32 && o->strategy != FSDP_NO_SHARD && !o->offload.params &&
        !o->param_wire) // (quantized gathers encode the shards: nothing is read in place)
        need->peer_shards = (double)need->fsdp.param_shard_bytes *
                            ((o->strategy == FSDP_HYBRID_SHARD ? desc.shard_group_size : P) - 1);
    need->total = (double)need->fsdp.peak_bytes + need->activations + need->gemm_scratch + need->sample_copy + need->process +
                  need->peer_shards;
    gpt_free(&m);
    return rc ? -1 : 0;
}

static void print_memory_need(FILE *out, const options *o, const memory_need *need) {
    fprintf(out, "%.1f MiB (fsdp.h %.1f MiB: shards %.1f + gathered units and gradients %.1f", mib(need->total),
            mib((double)need->fsdp.peak_bytes), mib((double)need->fsdp.persistent_bytes),
            mib((double)need->fsdp.peak_unsharded_bytes));
    if (need->fsdp.disk_bytes)
        fprintf(out, " + streaming %.1f, with %.1f MiB on disk", mib((double)need->fsdp.stream_bytes),
                mib((double)need->fsdp.disk_bytes));
    fprintf(out, "; activations %.1f MiB%s", mib(need->activations), o->recompute ? " with --recompute" : "");
    if (need->gemm_scratch > 0) fprintf(out, "; the matrix kernel's buffers %.1f MiB", mib(need->gemm_scratch));
    if (need->sample_copy > 0) fprintf(out, "; a copy of the weights for --sample %.1f MiB", mib(need->sample_copy));
    if (need->peer_shards > 0) fprintf(out, "; the peers' shards read in place %.1f MiB", mib(need->peer_shards));
    fprintf(out, "; the process before the ranks started %.1f MiB)", mib(need->process));
}

/* Before any rank allocates: P ranks must each fit in --mem-budget, or the run is refused with
   what it needs and the fewest ranks that would fit. */
static int check_memory_budget(const options *o, int P) {
    memory_need need;
    double budget = o->mem_budget_mib * 1048576.0;
    if (estimate_memory(o, P, &need)) {
        fprintf(stderr, "gpt: --mem-budget: cannot estimate the memory of this model\n");
        return 1;
    }
    if (need.total <= budget) return 0;
    fprintf(stderr, "gpt: --mem-budget %.0f MiB: refusing to start %d rank%s: each needs ", o->mem_budget_mib, P,
            P > 1 ? "s" : "");
    print_memory_need(stderr, o, &need);
    fprintf(stderr, ", %.0f bytes\n", need.total);
    for (int more = P + 1; more <= 256; more++) {
        memory_need fewer;
        if (o->batch % more || estimate_memory(o, more, &fewer) || fewer.total > budget) continue;
        fprintf(stderr, "the fewest ranks that fit (with --batch %d): --nproc %d, %.1f MiB each\n", o->batch, more,
                mib(fewer.total));
        return 1;
    }
    fprintf(stderr, "no rank count up to 256 fits with --batch %d: raise the budget, or lower --batch or --seq-len%s%s\n",
            o->batch, o->recompute ? "" : ", or add --recompute",
            o->offload.optimizer && o->offload.params && o->offload.grads ? "" : ", or offload to disk (--offload all --offload-dir DIR)");
    return 1;
}

/* The offload's cost, rank 0 after training: the bytes every rank moved per step against the disk's
   bandwidth measured through fsdp.h's own I/O path (while the other ranks wait), the compute (time
   outside fsdp calls), and the roofline ratio step / max(compute, bytes / bandwidth): 1 means the
   step is as fast as the slower of the two allows. all: NSTAT statistics per rank (gathered). */
static void print_offload_roofline(const fsdp_desc *desc, const double *all, int P, int nstat) {
    double read = 0, written = 0, wait = 0, write_bps = 0, read_bps = 0, io_s, compute_s = all[11] * 1e-3, step_s = all[4] * 1e-3;
    const char *dir = desc->offload.dir ? desc->offload.dir : getenv("FSDP_OFFLOAD_DIR");
    char err[400], machine[400];
    for (int r = 0; r < P; r++) read += all[nstat * r + 8], written += all[nstat * r + 9], wait += all[nstat * r + 10] / P;
    printf("offload per step (all ranks): %.2f GiB read, %.2f GiB written; waiting on the disk %.0f ms per rank on average\n",
           read / 1073741824.0, written / 1073741824.0, wait);
    if (fsdp_offload_bandwidth(dir, (size_t)2 << 30, P, &write_bps, &read_bps, err, sizeof err)) {
        printf("disk bandwidth: not measured (%s)\n", err);
        return;
    }
    io_s = read / read_bps + written / write_bps;
    example_machine_line(machine, sizeof machine);
    printf("disk %s through fsdp.h's I/O path (2 GiB each way, %d streams): %.2f GB/s write, %.2f GB/s read: the step's\n"
           "bytes take %.1f s there\n", dir, P, write_bps / 1e9, read_bps / 1e9, io_s);
    printf("roofline: step %.1f s / max(compute %.1f s (outside fsdp calls), disk %.1f s) = %.2f\nmachine: %s\n", step_s,
           compute_s, io_s, step_s / (compute_s > io_s ? compute_s : io_s), machine);
}

/* A step's forward and backward over this rank's B sequences of the global batch (from sequence
   first: batch_share), in --accum micro-batches (their gradients reduced on the last only, or with
   --accum-reduce on each); *loss: their mean loss. 0, or -1 (said on stderr). */
static int forward_backward(gpt *m, gpt_acts *acts, const options *o, long long step, int rank, int first, int B,
                            float *loss) {
    int T = o->seq_len, b = B / o->accum;
    for (int k = 0; k < o->accum; k++) { // micro-batch k: this rank's sequences k*b .. (k+1)*b-1
        float part_loss;
        data_batch(o->text, o->train_size, step, o->batch, T, first + k * b, first + (k + 1) * b, acts->inputs,
                   acts->targets);
        if (o->accum > 1 && !o->accum_reduce && fsdp_set_no_sync(m->ctx, k < o->accum - 1)) {
            fprintf(stderr, "rank %d: fsdp_set_no_sync: %s\n", rank, fsdp_last_error(m->ctx));
            return -1;
        }
        if (gpt_forward(m, acts, b, T, 1, &part_loss) || gpt_backward_part(m, acts, b, T, o->accum)) return -1;
        *loss = k ? *loss + part_loss : part_loss;
    }
    if (o->accum > 1) *loss /= (float)o->accum;
    return 0;
}

/* GPT_FAULT_AT_STEP (testing): at the start of step `step` (1-based) of the first attempt, rank 1
   kills itself; with GPT_FAULT_HOST=H every rank of host H (as the job started) does; with
   GPT_FAULT_SIGNAL=STOP they stop (SIGSTOP) instead, so that a script can kill the host or cut its
   link at a known point of the run (tests/multihost). rank and P: as the job started.
   GPT_PAUSE_AT_STEP=S (testing --rejoin): rank 0 of the world training then (the rendezvous of a
   rejoin) stops at the start of step S and again at the start of S+1, so that a script can start
   a host's ranks again at a known point: let go at S once they wait at its listener, its commit
   point of step S challenges them; let go at S+1 once their hellos (the answers) wait there, its
   commit point of S+1 admits them. */
static void inject_fault(const options *o, fsdp_ctx *ctx, fsdp_comm *comm, int rank, int P, long long step) {
    if (o->pause_at_step > 0 && (step == o->pause_at_step || step == o->pause_at_step + 1) && !o->rejoin &&
        fsdp_comm_rank(fsdp_world_comm(ctx)) == 0) {
        fprintf(stderr, "rank 0: GPT_PAUSE_AT_STEP=%lld: stopping this rank (SIGSTOP) at step %lld\n", o->pause_at_step,
                step);
        raise(SIGSTOP);
    }
    if (step != o->fault_at_step || example_restart_count() != 0 || o->rejoin) return;
    if (o->fault_host >= 0 ? fsdp_comm_host_of(comm, rank) != o->fault_host : rank != (P > 1)) return;
    fprintf(stderr, "rank %d: GPT_FAULT_AT_STEP=%lld: %s this rank (%s) at step %lld\n", rank, o->fault_at_step,
            o->fault_stop ? "stopping" : "killing", o->fault_stop ? "SIGSTOP" : "SIGKILL", step);
    raise(o->fault_stop ? SIGSTOP : SIGKILL);
}

/* The statistics each rank contributes at the end (rank_statistics), gathered for rank 0 to print. */
enum { NSTAT = 14 };

/* One rank's training, from fsdp_init to the end: the model and its context, and what the loop
   keeps of its steps for the lines printed as it goes and the statistics at the end. */
typedef struct {
    const options *o;
    fsdp_comm *comm;                  // the launcher's (desc.comm); from report_statistics on the world's
    int start_rank, start_P;          // this rank and the world as the job started (the testing aids' numbering)
    int rank, P, first, B;            // the world training now and this rank's part of the batch (batch_share):
                                      // after a recovery the survivors'
    gpt_config config;
    gpt m;
    gpt_acts acts;
    fsdp_desc desc;
    fsdp_ctx *ctx;
    recovery_timeline timeline;
    long long first_step;             // where the loop starts (0, or the resumed or rejoined step)
    int loaded;                       // --resume loaded a checkpoint
    FILE *log;                        // --log (rank 0)
    float loss;                       // the last step's mean loss over the world
    double *step_ms, *fsdp_ms;        // each timed step's time, and the part in fsdp calls
    int timed;                        // the steps timed (completed) so far
    double interval_ms, interval_fsdp_ms; // summed since the last printed line ...
    int interval_steps;               // ... over these steps
    double sent_net, sent_host;       // bytes this rank sent in steps 2.. across hosts / within its host
    fsdp_offload_stats io_start;      // after the first step (which warms up), for the per-step I/O
} trainer;

/* Builds this rank's model and activations (sized for the largest share it can be left with),
   its fsdp context (resumed with --resume; with --recover the timeline started, and a --rejoin
   rank's data position taken) and its part of the batch. 0, or 1 (said on stderr). */
static int setup_rank(trainer *t) {
    const options *o = t->o;
    int most_B = t->B;
    if (check_recover_batch(o, t->P, fsdp_comm_local_size(t->comm), t->rank, &most_B)) return 1;
    if (!t->step_ms || gpt_build(&t->m, t->config) ||
        gpt_acts_alloc_ex(&t->acts, &t->config, most_B, o->seq_len, o->recompute, 1)) {
        fprintf(stderr, "rank %d: out of memory building the model\n", t->rank);
        return 1;
    }
    t->m.rank = t->rank;
    make_desc(o, t->comm, t->P, fsdp_comm_local_size(t->comm), &t->desc);
    if (fsdp_init(&t->ctx, t->m.model, &t->desc) != FSDP_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", t->rank, fsdp_last_error(NULL));
        return 1;
    }
    t->m.ctx = t->ctx;
    if (o->resume && (t->first_step = resume(t->ctx, t->comm, o, &t->loaded)) < 0) return 1;
    if (o->recover && recovery_start(&t->timeline, t->ctx, o, t->comm, &t->first_step)) return 1;
    batch_share(t->ctx, o, &t->rank, &t->P, &t->first, &t->B); // (a --rejoin rank's world is now the job's)
    return 0;
}

/* Rank 0, before training: the run (ranks, strategy, what crosses the wire), the model, the data
   and the optimizer. */
static void print_run(const trainer *t) {
    const options *o = t->o;
    int P = t->P, groups = t->desc.shard_group_size;
    printf("gpt: %d rank%s (%s), %s", P, P > 1 ? "s" : "", fsdp_backend_name(fsdp_comm_backend(t->comm)),
           fsdp_strategy_name(o->strategy));
    if (o->strategy == FSDP_HYBRID_SHARD)
        printf(" (shard groups of %d ranks, %d replica%s)", groups, P / groups, P / groups > 1 ? "s" : "");
    printf(", %s parameters", fsdp_dtype_name(o->param_dtype));
    if (o->param_wire)
        printf(", %s gathers (blocks of %zu, %zu bytes per 1024 weights)", fsdp_wire_name(o->param_wire),
               o->wire_block ? o->wire_block : 128, fsdp_wire_bytes(o->param_wire, 1024, o->wire_block));
    if (o->grad_wire) printf(", %s gradients between hosts%s", fsdp_wire_name(o->grad_wire),
                             o->error_feedback ? " with error feedback" : "");
    if (o->reshard) printf(", reshard after forward: %s", reshard_names[o->reshard - 1]);
    printf("\n");
    printf("model: %d layer%s, %d head%s, %d channels, context %d bytes, vocabulary 256 (bytes), LM head tied to "
           "wte: %zu parameters (%.1f MiB in f32)\n", o->layers, o->layers > 1 ? "s" : "", o->heads,
           o->heads > 1 ? "s" : "", o->channels, o->seq_len, t->m.num_params, mib(4.0 * (double)t->m.num_params));
    printf("data: %s, %zu bytes (%zu for training, %zu held out); global batch %d x %d bytes (%d sequences per rank)\n",
           o->data_name, o->size, o->train_size, o->size - o->train_size, o->batch, o->seq_len, t->B);
    printf("optimizer: AdamW, lr %g (warmup %d steps, cosine to %g at step %d), weight decay %g %s, clip %g, %s state%s\n",
           (double)o->lr, o->warmup, (double)o->min_lr, o->steps, (double)o->weight_decay,
           o->decay_all ? "on every parameter" : "on the matrices and embeddings only (none on biases and LayerNorm)",
           (double)o->clip, fsdp_dtype_name(o->state_dtype), o->overlap_step ? ", overlapping the next forward" : "");
}

/* Rank 0, before training, with --offload: where the training state lives and what it would
   take of this machine's RAM. */
static void print_offload(const trainer *t) {
    const fsdp_offload_desc *offload = &t->desc.offload;
    double ram, state = 16.0 * (double)t->m.num_params; // f32 weights, gradients and AdamW's two moments
    fsdp_memory_stats st;
    memset(&st, 0, sizeof st); // (as in report_statistics: -O3 cannot see that fsdp_memory_stats_get always fills it)
    fsdp_memory_stats_get(t->ctx, &st);
    ram = example_mem_total();
    printf("offload: %s on disk in %s: %.1f MiB per rank (one unlinked file each, reserved at start), streamed "
           "through %.1f MiB of RAM per rank\n", fsdp_offload_describe(offload),
           offload->dir ? offload->dir : getenv("FSDP_OFFLOAD_DIR"), mib((double)st.disk_bytes),
           mib((double)st.stream_bytes));
    if (ram > 0)
        printf("training state at 16 bytes a parameter: %.1f GiB, %.2fx this machine's RAM (%.1f GiB)\n",
               state / 1073741824.0, state / ram, ram / 1073741824.0);
}

/* Rank 0, before training: the features that change what a rank holds or where it starts
   (offload, recompute, the memory budget, resume, recovery), and the units with --print-units. */
static void print_features(const trainer *t) {
    const options *o = t->o;
    if (t->desc.offload.optimizer || t->desc.offload.params || t->desc.offload.grads) print_offload(t);
    if (o->recompute) {
        printf("activation checkpointing: blocks");
        for (int l = 0; l < o->layers; l++)
            if (t->acts.recomputed[l]) printf(" %d", l);
        printf(" recomputed in backward; activations %.1f MiB per rank instead of %.1f MiB\n",
               mib(sizeof(float) * (double)t->acts.num_floats),
               mib((double)gpt_acts_bytes(&t->config, t->B, o->seq_len, 0, 1)));
    }
    if (o->mem_budget_mib > 0) {
        memory_need need;
        if (estimate_memory(o, t->P, &need) == 0) {
            printf("memory budget %.0f MiB per rank; estimate ", o->mem_budget_mib);
            print_memory_need(stdout, o, &need);
            printf("\n");
        }
    }
    if (o->resume) {
        int restart = example_restart_count();
        char attempt[32] = "";
        if (restart > 0) snprintf(attempt, sizeof attempt, " (restart %d)", restart);
        if (t->loaded)
            printf("resuming from %s at step %lld%s%s\n", strcmp(o->resume, "auto") ? o->resume : o->ckpt,
                   t->first_step, attempt, t->first_step >= o->steps ? ": nothing left to train (raise --steps)" : "");
        else
            printf("no checkpoint in %s yet: starting from scratch%s\n", o->ckpt, attempt);
    }
    if (o->print_units) fsdp_print_units(t->ctx, NULL, NULL);
    if (o->recover)
        printf("recovery: on (a lost host's survivors train on; detection of a silent host within %d ms; at least %d "
               "replicas; %s); the global batch is split over the replicas training at each step\n", o->detect_ms ?
               o->detect_ms : FSDP__RECOVERY_DETECT_MS, fewest_replicas(o, t->P / t->desc.shard_group_size),
               o->recovery_port ? "a lost host may rejoin: rank r listens at --recovery-port + r" : "no rejoin");
}

/* --log: rank 0 opens the file (appended to when resumed); every rank learns whether it could,
   so that all stop together if not. 0, or 1 (said). */
static int open_log(trainer *t) {
    float failed = 0;
    if (!t->o->log_path) return 0;
    if (t->rank == 0 && !(t->log = fopen(t->o->log_path, t->first_step > 0 ? "a" : "w"))) {
        fprintf(stderr, "gpt: --log %s: %s\n", t->o->log_path, strerror(errno));
        failed = 1;
    }
    return fsdp_all_reduce(t->comm, &failed, &failed, 1, FSDP_F32, FSDP_MAX) || failed;
}

/* One iteration: forward and backward over this rank's share of the step's data, then fsdp_step
   (clip, update) and zero_grad, timed (the step and its part in fsdp calls) once applied. 0 the
   step was applied; 1 take this iteration again (--recover: the step was dropped); -1 stop (said). */
static int take_step(trainer *t, long long step, float lr, fsdp_step_report *report) {
    const options *o = t->o;
    double t0, t_step, t1;
    int pass_failed, redo;
    inject_fault(o, t->ctx, t->comm, t->start_rank, t->start_P, step + 1);
    batch_share(t->ctx, o, &t->rank, &t->P, &t->first, &t->B); // (the replicas change only with --recover)
    fsdp_set_lr(t->ctx, lr);
    t0 = fsdp_now(), t->m.hook_seconds = 0;
    pass_failed = forward_backward(&t->m, &t->acts, o, step, t->rank, t->first, t->B, &t->loss) != 0;
    if (pass_failed && !o->recover) return -1;
    if (o->recover) set_data_position(&t->timeline, t->ctx, step + 1); // (for a host that rejoins after this step)
    t_step = fsdp_now();
    if (fsdp_step(t->ctx, o->clip, report) || fsdp_zero_grad(t->ctx)) {
        fprintf(stderr, "rank %d: step %lld: %s\n", t->rank, step + 1, fsdp_last_error(t->ctx));
        return -1;
    }
    if (o->recover && (redo = after_step(&t->timeline, t->ctx, o, report, step, pass_failed)) != 0)
        return redo; // (-1: forward or backward failed, said above, and nothing was lost)
    t1 = fsdp_now();
    t->step_ms[t->timed] = 1e3 * (t1 - t0);
    t->fsdp_ms[t->timed] = 1e3 * (t->m.hook_seconds + t1 - t_step); // hooks, fsdp_step (with the update), zero_grad
    t->interval_ms += t->step_ms[t->timed], t->interval_fsdp_ms += t->fsdp_ms[t->timed], t->interval_steps++;
    t->timed++;
    if (t->timed == 1) fsdp_offload_stats_get(t->ctx, &t->io_start);
    else t->sent_net += (double)report->bytes_sent_net, t->sent_host += (double)report->bytes_sent_host;
    return 0;
}

/* --log: the step's JSON line, flushed: a plotting tool can read the file while the run goes on.
   0, or -1 (said). */
static int log_step(const trainer *t, long long step, float lr, const fsdp_step_report *report) {
    double ms = t->step_ms[t->timed - 1];
    fprintf(t->log, "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.6g,\"grad_norm\":%.9g,\"skipped\":%d,\"loss_scale\":%.6g,"
                    "\"ms\":%.3f,\"in_fsdp_ms\":%.3f,\"tokens_per_s\":%.1f,\"bytes_sent_host\":%llu,\"bytes_sent_net\":%llu,"
                    "\"peak_rss_mib\":%.1f}\n",
            step + 1, (double)t->loss, (double)lr, isfinite(report->grad_norm) ? report->grad_norm : -1.0,
            report->skipped, report->loss_scale, ms, t->fsdp_ms[t->timed - 1], t->o->batch * t->o->seq_len / (ms * 1e-3),
            (unsigned long long)report->bytes_sent_host, (unsigned long long)report->bytes_sent_net,
            example_peak_rss(NULL) / 1048576.0);
    if (fflush(t->log) == 0) return 0;
    fprintf(stderr, "gpt: --log %s: %s\n", t->o->log_path, strerror(errno));
    return -1;
}

/* Rank 0: the step's line (the first, every --print-every and the last), its times averaged
   since the line before. */
static void print_step(trainer *t, long long step, float lr, const fsdp_step_report *report) {
    const options *o = t->o;
    double ms = t->interval_ms / t->interval_steps;
    char scaled[48] = "";
    if (o->param_dtype == FSDP_F16) snprintf(scaled, sizeof scaled, "  scale %g", report->loss_scale);
    printf("step %5lld/%d  loss %.4f  lr %.2e  norm %6.3f%s%s  %6.1f ms/step  %6.0f tok/s  in fsdp %5.1f ms\n",
           step + 1, o->steps, (double)t->loss, (double)lr, report->grad_norm,
           report->skipped ? " (skipped: not finite)" : "", scaled, ms, o->batch * o->seq_len / (ms * 1e-3),
           t->interval_fsdp_ms / t->interval_steps);
    t->interval_ms = t->interval_fsdp_ms = 0, t->interval_steps = 0;
}

/* After a step was applied: the loss's mean over the world, the --log line and the printed line,
   and the checkpoint when one is due. 0, or -1 (said). */
static int finish_step(trainer *t, long long step, float lr, const fsdp_step_report *report) {
    const options *o = t->o;
    if (mean_loss(t->ctx, &t->loss, 1)) { // (the global mean)
        fprintf(stderr, "rank %d: all_reduce of the loss: %s\n", t->rank, fsdp_comm_last_error(fsdp_world_comm(t->ctx)));
        if (!o->recover) return -1;
        t->loss = NAN; // (a host lost meanwhile: the next step's fsdp_step recovers; this step was applied)
    }
    if (t->log && log_step(t, step, lr, report)) return -1;
    if (t->rank == 0 && ((step + 1) % o->print_every == 0 || step == t->first_step || step == o->steps - 1))
        print_step(t, step, lr, report);
    if (strcmp(o->ckpt, "none") != 0 && (step == o->steps - 1 || (o->save_every && (step + 1) % o->save_every == 0)) &&
        save_checkpoint(t->ctx, o, t->rank, t->P, step + 1))
        return -1;
    return 0;
}

/* The training loop, from the first step to --steps; with --async-ckpt the last save committed
   before it returns. 0, or -1 (said). */
static int train_loop(trainer *t) {
    const options *o = t->o;
    for (long long step = t->first_step; step < o->steps; step++) {
        fsdp_step_report report;
        float lr = lr_schedule(step, o->steps, o->warmup, o->lr, o->min_lr);
        int rc = take_step(t, step, lr, &report);
        if (rc < 0) return -1;
        if (rc > 0) { // dropped: the survivors take this iteration's data again
            step--;
            continue;
        }
        if (finish_step(t, step, lr, &report)) return -1;
    }
    if (o->async_ckpt && strcmp(o->ckpt, "none") != 0) { // the last save, committed before the run ends
        double wait_start = fsdp_now();
        if (fsdp_save_wait(t->ctx)) {
            fprintf(stderr, "rank %d: the checkpoint in %s was not saved: %s (it holds the one before)\n", t->rank,
                    o->ckpt, fsdp_last_error(t->ctx));
            return -1;
        }
        if (t->rank == 0) printf("saved %s (waited %.0f ms for the last save)\n", o->ckpt, 1e3 * (fsdp_now() - wait_start));
    }
    return 0;
}

/* This rank's statistics at the end, into mine: memory (persistent, peak unsharded, fsdp peak,
   max RSS, activations, disk), the median step and the median time in fsdp calls, and per timed
   step the offload's bytes read and written, its ms waited on the disk, the ms outside fsdp calls
   (compute) and the bytes sent across hosts and within. *rss_source: example_peak_rss's. */
static void rank_statistics(trainer *t, const fsdp_memory_stats *st, const char **rss_source, double mine[NSTAT]) {
    int skip = t->timed > 1, n = t->timed > 1 ? t->timed - 1 : 1; // the first step warms up
    double *outside;
    fsdp_offload_stats io;
    memset(&io, 0, sizeof io); // (-O3 cannot see that fsdp_offload_stats_get always fills it)
    mine[0] = (double)st->persistent_bytes, mine[1] = (double)st->peak_unsharded_bytes;
    mine[2] = (double)st->peak_bytes, mine[3] = example_peak_rss(rss_source);
    mine[4] = median(t->step_ms + skip, t->timed - skip), mine[5] = median(t->fsdp_ms + skip, t->timed - skip);
    mine[6] = sizeof(float) * (double)t->acts.num_floats;
    mine[7] = (double)st->disk_bytes;
    outside = (double *)malloc(sizeof(double) * (size_t)(t->timed ? t->timed : 1));
    fsdp_offload_stats_get(t->ctx, &io);
    if (t->timed <= 1) memset(&t->io_start, 0, sizeof t->io_start);
    mine[8] = (double)(io.bytes_read - t->io_start.bytes_read) / n;
    mine[9] = (double)(io.bytes_written - t->io_start.bytes_written) / n;
    mine[10] = 1e3 * (io.wait_seconds - t->io_start.wait_seconds) / n;
    for (int k = 0; outside && k < t->timed; k++) outside[k] = t->step_ms[k] - t->fsdp_ms[k];
    mine[11] = outside ? median(outside + skip, t->timed - skip) : 0;
    free(outside);
    mine[12] = t->sent_net / n, mine[13] = t->sent_host / n;
}

/* --mem-budget, rank 0 at the end: the ranks' peak RSS against the estimate the run was let in by. */
static void print_rss_vs_budget(const options *o, const double *all, int P) {
    memory_need need;
    double lo = all[3], hi = all[3];
    for (int r = 1; r < P; r++) {
        double rss = all[NSTAT * r + 3];
        lo = rss < lo ? rss : lo, hi = rss > hi ? rss : hi;
    }
    if (estimate_memory(o, P, &need) == 0)
        printf("memory budget %.0f MiB per rank: peak RSS %.1f .. %.1f MiB over the ranks, estimate %.1f MiB "
               "(max RSS / estimate %.3f)\n", o->mem_budget_mib, mib(lo), mib(hi), mib(need.total), hi / need.total);
}

/* Rank 0 at the end: every rank's memory and time (all: NSTAT statistics per rank) beside
   fsdp_memory_estimate's prediction (est), the final loss and speed, the offload's roofline and
   the bytes sent. */
static void print_statistics(const trainer *t, const fsdp_memory_stats *st, const fsdp_memory_stats *est,
                             const char *rss_source, const double *all) {
    const options *o = t->o;
    int P = t->P;
    printf("\nrank  persistent  peak unsharded  fsdp peak  activations   max RSS        disk   ms/step  in fsdp calls "
           "(ms/step)\n");
    for (int r = 0; r < P; r++) {
        const double *s = all + NSTAT * r;
        printf("%4d  %6.2f MiB  %10.2f MiB  %5.2f MiB  %7.2f MiB  %5.1f MiB  %6.1f MiB  %7.1f  %6.1f\n", r, mib(s[0]),
               mib(s[1]), mib(s[2]), mib(s[6]), mib(s[3]), mib(s[7]), s[4], s[5]);
    }
    printf(" est  %6.2f MiB  %10.2f MiB  %5.2f MiB  %24s%6.1f MiB  (fsdp_memory_estimate for this model, desc and "
           "%d rank%s)\n", mib((double)est->persistent_bytes), mib((double)est->peak_unsharded_bytes),
           mib((double)est->peak_bytes), "", mib((double)est->disk_bytes), P, P > 1 ? "s" : "");
    print_vs_estimate(all, P, NSTAT, (double)est->persistent_bytes, (double)est->peak_unsharded_bytes);
    printf("max RSS: each rank's own peak resident memory (%s%s)\n", rss_source,
           strcmp(rss_source, "VmHWM") == 0 ? " from /proc/self/status" : ": no /proc here; it may include a launcher's");
    if (o->mem_budget_mib > 0) print_rss_vs_budget(o, all, P);
    if (t->timed)
        printf("final loss %.4f; %.0f tokens/s (median step %.1f ms on rank 0)\n", (double)t->loss,
               o->batch * o->seq_len / (all[4] * 1e-3), all[4]);
    if (st->disk_bytes && t->timed && !o->no_roofline) print_offload_roofline(&t->desc, all, P, NSTAT);
    if (P > 1 && t->timed > 1) print_bytes_sent(all, P, NSTAT);
}

/* At the end (collective, over the world training now: after a recovery the survivors'): with
   --recover whether the replicas agree, then every rank's statistics gathered for rank 0 to print.
   0, or -1 (said). */
static int report_statistics(trainer *t) {
    fsdp_memory_stats st, est;
    const char *rss_source = "";
    double mine[NSTAT], *all;
    t->comm = fsdp_world_comm(t->ctx);
    t->rank = fsdp_comm_rank(t->comm), t->P = fsdp_comm_size(t->comm);
    if (t->o->recover && print_replica_checksums(t->ctx, &t->m, t->rank)) return -1;
    all = (double *)calloc((size_t)t->P * NSTAT, sizeof(double));
    memset(&st, 0, sizeof st); // fsdp_memory_stats_get fills it; -O3 cannot see that it always does
    fsdp_memory_stats_get(t->ctx, &st);
    if (fsdp_memory_estimate(t->m.model, &t->desc, t->P, &est)) memset(&est, 0, sizeof est); // fsdp_init took this desc
    rank_statistics(t, &st, &rss_source, mine);
    if (!all || fsdp_all_gather(t->comm, mine, all, sizeof mine / 4, FSDP_F32)) { // doubles, moved as bytes
        fprintf(stderr, "rank %d: gathering the statistics failed: %s\n", t->rank, fsdp_comm_last_error(t->comm));
        free(all);
        return -1;
    }
    if (t->rank == 0) print_statistics(t, &st, &est, rss_source, all);
    free(all);
    return 0;
}

/* The end of training: the held-out loss (every rank scores a share, through the hooks) and
   rank 0's sample, on a plain copy of the weights. 0, or -1 (said). */
static int heldout_and_sample(trainer *t) {
    const options *o = t->o;
    if (o->size - o->train_size >= (size_t)o->seq_len + 2) {
        size_t val_size = o->size - o->train_size;
        int sequences = gpt_heldout_sequences(val_size, o->seq_len, VAL_BATCHES * o->batch); // the same at every P
        double val;
        if (gpt_heldout_loss(&t->m, &t->acts, t->comm, o->text + o->train_size, val_size, sequences, &val)) return -1;
        if (t->rank == 0)
            printf("held-out loss %.4f (%d sequences x %d bytes not trained on)\n", val, sequences, o->seq_len);
    }
    if (o->sample > 0) { // every rank gets a copy: fsdp_gather_param is collective
        if (gpt_plain_gather(&t->m)) {
            fprintf(stderr, "rank %d: gathering the weights for the sample failed: %s\n", t->rank,
                    fsdp_last_error(t->ctx));
            return -1;
        }
        if (t->rank == 0) {
            t->m.ctx = NULL; // the plain copy from here on
            sample(&t->m, &t->acts, o, o->sample);
        }
    }
    return 0;
}

/* What each rank runs (example_run): set up, train, report. 0, or 1 (said on stderr). */
static int train(fsdp_comm *comm, void *arg) {
    const options *o = (const options *)arg;
    gpt_config config = {256, o->seq_len, o->layers, o->heads, o->channels};
    trainer t;
    int rc = 1;
    memset(&t, 0, sizeof t);
    t.o = o, t.comm = comm;
    t.rank = t.start_rank = fsdp_comm_rank(comm), t.P = t.start_P = fsdp_comm_size(comm);
    t.B = o->batch / t.P, t.first = t.rank * t.B;
    t.config = config;
    t.step_ms = (double *)calloc(2 * (size_t)o->steps, sizeof(double)), t.fsdp_ms = t.step_ms + o->steps;
    openblas_set_num_threads(1);
    if (setup_rank(&t) == 0) {
        if (t.rank == 0) {
            print_run(&t);
            print_features(&t);
        }
        rc = open_log(&t) || train_loop(&t) || report_statistics(&t) || heldout_and_sample(&t);
    }
    if (t.log && fclose(t.log) != 0 && rc == 0) {
        fprintf(stderr, "gpt: --log %s: %s\n", o->log_path, strerror(errno));
        rc = 1;
    }
    fsdp_destroy(t.ctx);
    gpt_acts_free(&t.acts);
    gpt_free(&t.m);
    free(t.step_ms);
    return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* data */

/* Appends a file to o->text. */
static int append_file(options *o, const char *path, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    long n;
    unsigned char *grown;
    if (!f) { snprintf(err, err_size, "cannot open '%s': %s", path, strerror(errno)); return -1; }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, err_size, "'%s' is not a regular file", path);
        fclose(f);
        return -1;
    }
    if (!(grown = (unsigned char *)realloc(o->text, o->size + (size_t)n + 1))) {
        snprintf(err, err_size, "'%s': out of memory", path);
        fclose(f);
        return -1;
    }
    o->text = grown;
    if (fread(o->text + o->size, 1, (size_t)n, f) != (size_t)n) {
        snprintf(err, err_size, "'%s': read error", path);
        fclose(f);
        return -1;
    }
    o->size += (size_t)n;
    fclose(f);
    return 0;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The project's own sources: dir/fsdp.h, then the .c files of dir/examples in name order. */
static int load_sources(options *o, const char *dir, char *err, size_t err_size) {
    char path[1400], *names[256];
    int n = 0, rc = 0;
    DIR *d;
    struct dirent *e;
    snprintf(path, sizeof path, "%s/fsdp.h", dir);
    if (append_file(o, path, err, err_size)) return -1;
    snprintf(path, sizeof path, "%s/examples", dir);
    if ((d = opendir(path)) != NULL) {
        while ((e = readdir(d)) != NULL && n < 256) {
            size_t len = strlen(e->d_name);
            if (len > 2 && strcmp(e->d_name + len - 2, ".c") == 0 && (names[n] = strdup(e->d_name)) != NULL) n++;
        }
        closedir(d);
    }
    qsort(names, (size_t)n, sizeof names[0], compare_names);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/examples/%s", dir, names[i]);
        if (!rc) rc = append_file(o, path, err, err_size);
        free(names[i]);
    }
    snprintf(o->data_name, sizeof o->data_name, "%s%sfsdp.h + examples/*.c (%d files)", strcmp(dir, ".") ? dir : "",
             strcmp(dir, ".") ? "/" : "", n + 1);
    return rc;
}

/* Where the executable is ("build" for build/gpt), for the default data and checkpoint paths. */
static void executable_dir(char *out, size_t size, const char *argv0) {
    char path[1024];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    char *slash;
    if (n > 0) path[n] = 0;
    else snprintf(path, sizeof path, "%s", argv0);
    slash = strrchr(path, '/');
    if (slash) *slash = 0;
    else snprintf(path, sizeof path, ".");
    snprintf(out, size, "%s", path);
}

static int load_data(options *o, const char *exe_dir) {
    char err[1600];
    if (o->data_path) {
        snprintf(o->data_name, sizeof o->data_name, "%s", o->data_path);
        if (append_file(o, o->data_path, err, sizeof err)) { fprintf(stderr, "gpt: --data: %s\n", err); return -1; }
    } else {
        char dir[1100], probe[1200];
        int found = 0;
        for (int i = 0; i < 3 && !found; i++) { // ., the executable's parent (build/..), the executable's directory
            snprintf(dir, sizeof dir, "%.1000s%s", i ? exe_dir : ".", i == 1 ? "/.." : "");
            snprintf(probe, sizeof probe, "%s/fsdp.h", dir);
            found = access(probe, R_OK) == 0;
        }
        if (!found) {
            fprintf(stderr, "gpt: no --data given, and the default text (fsdp.h and examples/*.c of the fsdp.h source "
                    "tree) is neither in the current directory nor next to the executable (%s/..).\n"
                    "Pass any text file: build/gpt --data FILE (e.g. --data README.md), or run from the fsdp.h "
                    "directory.\n", exe_dir);
            return -1;
        }
        if (load_sources(o, dir, err, sizeof err)) { fprintf(stderr, "gpt: %s\n", err); return -1; }
    }
    o->train_size = o->size - o->size / 10; // the last 10% is held out
    if (o->size - o->train_size < (size_t)o->seq_len + 2) o->train_size = o->size; // too short to hold any out
    if (o->train_size < (size_t)o->seq_len + 2) {
        fprintf(stderr, "gpt: %s has %zu bytes, too few for sequences of %d bytes; use a longer text or a smaller "
                "--seq-len\n", o->data_name, o->size, o->seq_len);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* flags */

/* --help, first part: what gpt does, then the ranks, the data, the model and the training. */
static void usage_training(FILE *out) {
    fprintf(out,
        "usage: gpt [options]\n"
        "Trains a GPT-2 style language model over bytes (vocabulary 256) with fsdp.h: token and position\n"
        "embeddings, pre-LayerNorm blocks (causal self-attention, GELU MLP), final LayerNorm, LM head tied to\n"
        "the token embedding. Each block h.<i> is an FSDP unit; the root unit holds wte, wpe and ln_f. Names\n"
        "as the Hugging Face GPT-2 state dict (h.0.attn.c_attn.weight, ...), matrices as nn.Linear (out, in).\n"
        "At the end rank 0 prints every rank's memory (and fsdp_memory_estimate's prediction of it; max RSS\n"
        "is the rank's own peak resident set, VmHWM from /proc/self/status, not ru_maxrss, which would count\n"
        "a launcher such as torchrun that exec'd it), the loss on the held-out text and a sample.\n"
        "\n"
        "ranks\n"
        "  --nproc N            fork N local ranks (default: read the job from the environment: torchrun's\n"
        "                       RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT, SLURM or mpirun,\n"
        "                       backend from FSDP_BACKEND; with no such variables, 1 rank)\n"
        "  --backend B          with --nproc: shm (shared memory, default) or socket (TCP on loopback)\n"
        "data\n"
        "  --data FILE          any text file (default: fsdp.h and examples/*.c, found in the current\n"
        "                       directory or next to the executable). The last 10%% is held out. Step s\n"
        "                       reads B windows of T+1 bytes at fixed, spread-out places of the rest;\n"
        "                       rank r takes sequences r*B/P .. (r+1)*B/P - 1 of them\n"
        "model\n"
        "  --layers N           transformer blocks (default 4)\n"
        "  --heads N            attention heads, dividing --channels (default 4)\n"
        "  --channels N         embedding width C (default 128)\n"
        "  --seq-len N          context length T in bytes (default 64)\n"
        "  --seed N             seed of the initial weights and of the sampler (default 0)\n"
        "training (AdamW on every parameter; the loss is the mean over the global batch)\n"
        "  --batch N            global batch in sequences, divisible by the number of ranks (default 16)\n"
        "  --steps N            optimizer steps (default 500)\n"
        "  --lr X               peak learning rate (default 0.003)\n"
        "  --warmup N           steps of linear warmup (default 30)\n"
        "  --min-lr X           the cosine decay's end at the last step (default lr / 10)\n"
        "  --weight-decay X     AdamW's decoupled weight decay (default 0.01), as GPT-2 recipes (nanoGPT,\n"
        "                       llm.c) apply it: to the 2-D parameters (the Linear weights, wte, wpe) only,\n"
        "                       not to biases and LayerNorm weights (an fsdp_param_group with decay 0 for\n"
        "                       parameters of at most 1 dimension)\n"
        "  --decay-all          apply it to every parameter instead\n"
        "  --clip X             clip the global gradient norm to X; 0: off (default 1)\n"
        "  --accum K            gradient accumulation: each rank's sequences in K micro-batches, whose\n"
        "                       gradients are reduced once, on the last (fsdp_set_no_sync) (default 1)\n"
        "  --accum-reduce       with --accum: reduce every micro-batch's gradients into the shards instead\n"
        "                       of holding them back to the last (gradient accumulation without no_sync)\n");
}

/* --help: what a rank holds (--recompute, --mem-budget) and how fsdp.h shards and moves it. */
static void usage_memory_and_fsdp(FILE *out) {
    fprintf(out,
        "memory\n"
        "  --recompute [K]      activation checkpointing: forward keeps only the input of every K-th block\n"
        "                       (blocks 0, K, 2K, ...; default K = 1: every block) and backward runs that\n"
        "                       block's forward again before its backward, on the weights gathered for it\n"
        "                       (no extra all-gather). Activations shrink to one block's plus the blocks'\n"
        "                       inputs; training is bitwise the same, about a third more compute\n"
        "  --mem-budget MIB     refuse to start unless each rank fits in MIB mebibytes by the estimate:\n"
        "                       fsdp_memory_estimate (shards, gathered units, gradients) + the activations\n"
        "                       + the matrix kernel's packing buffers + a copy of the weights for --sample\n"
        "                       + what the process holds at start\n"
        "                       (+ on shm, the peers' f32 shards that gathers read in place: shared memory,\n"
        "                       stored once but counted in every reader's RSS); says what is needed and the\n"
        "                       fewest ranks that fit. At the end: every rank's peak RSS against it\n");
    fprintf(out,
        "fsdp\n"
        EXAMPLE_STRATEGY_HELP
        "                       HYBRID_SHARD: sharded within each host, replicated across hosts; all ranks\n"
        "                       on one host and an even count: two replicas of half the ranks\n"
        "  --param-dtype D      f32 (default), bf16 or f16: what is gathered and reduced; master weights\n"
        "                       stay f32 (AdamW state too, unless --state-dtype), the kernels read an f32 view;\n"
        "                       f16 turns on dynamic loss scaling (GradScaler's rules; the scale is printed)\n"
        "  --param-wire W       int8 or int4: gathers move each rank's f32 master shard quantized (one f32\n"
        "                       scale per block, ZeRO++'s qwZ), decoded into --param-dtype for compute;\n"
        "                       masters, AdamW state and checkpoints stay f32 (default: --param-dtype)\n"
        "  --grad-wire none|int8|int4\n"
        "                       gradients cross hosts quantized (ZeRO++'s qgZ): summed in f32 inside each\n"
        "                       host, each host's partial sent as int8 or int4 with a scale per block;\n"
        "                       FULL_SHARD and SHARD_GRAD_OP on hosts of equal rank counts; HYBRID_SHARD:\n"
        "                       each replica's partial, then the sum, quantized between the hosts' replicas\n"
        "                       (on one host nothing crosses a link and it does nothing) (default: none)\n"
        "  --error-feedback     with --grad-wire: each rank keeps its quantization error and adds it to the\n"
        "                       next step's gradients (saved in the sharded checkpoints)\n"
        "  --wire-block K       elements per block of --param-wire and --grad-wire: a multiple of 8 up to\n"
        "                       4096 (default 128)\n"
        "  --reshard-after-forward all|none|host\n"
        "                       after a block's forward: free its gathered weights (all), keep them (none),\n"
        "                       or keep them sharded over this host's ranks so that backward's gather stays\n"
        "                       inside the host (host: ZeRO++'s hpZ; on one host it acts as all) (default:\n"
        "                       the strategy's: FULL_SHARD and HYBRID_SHARD all, the others none)\n"
        "  --overlap-step       the optimizer step runs on a thread of its own behind the next forward, each\n"
        "                       block's gather waiting for its update only (as with --offload); same bits\n"
        "  --print-units        print the FSDP units (rank 0)\n"
        EXAMPLE_OFFLOAD_HELP
        "  --no-roofline        with --offload: no roofline at the end (it measures the disk: 2 GiB each way)\n");
}

/* --help: checkpoints, resuming, and restarts after a failed rank. */
static void usage_checkpoints(FILE *out) {
    fprintf(out,
        "checkpoints (sharded: one safetensors file per rank + index.json, with AdamW state)\n"
        "  --ckpt DIR           where to save (default: gpt_ckpt next to the executable, e.g. build/gpt_ckpt);\n"
        "                       'none': never save. Saved after the last step\n"
        "  --save-every N       also every N steps (default 0: only after the last step)\n"
        "  --async-ckpt         save behind the training (fsdp_save_sharded_async): each save blocks only\n"
        "                       while this rank's shards are copied; the checkpoint is committed once\n"
        "                       every rank's file is written (--resume auto finds the newest committed)\n"
        "  --resume DIR|auto    load DIR (strict, with AdamW state) and continue from its step up to --steps;\n"
        "                       any --nproc and --strategy; the model flags must match. auto: the --ckpt\n"
        "                       directory's checkpoint (saves are atomic: it is the newest complete one),\n"
        "                       or from scratch if none has been saved yet. The data and the learning\n"
        "                       rate continue at the saved step: with the same --nproc and flags the\n"
        "                       result is bitwise that of a run never stopped\n"
        "elastic runs\n"
        "  --max-restarts N     with --nproc: when a rank fails, stop the others and start every rank again,\n"
        "                       up to N times (default 0); with --resume auto and --save-every each attempt\n"
        "                       continues from the last save. Under torchrun use its --max_restarts.\n"
        "                       Testing aid: GPT_FAULT_AT_STEP=S in the environment makes rank 1 (rank 0\n"
        "                       if it is alone) kill itself with SIGKILL at step S of the first attempt;\n"
        "                       GPT_FAULT_IN_SAVE=S: right after the save at step S has started (with\n"
        "                       --async-ckpt, while it is written behind)\n");
}

/* --help: in-job recovery from a lost host (--recover) and a host's rejoin (--rejoin). */
static void usage_recovery(FILE *out) {
    fprintf(out,
        "in-job recovery (ranks on several hosts, --strategy HYBRID_SHARD: one replica per host)\n"
        "  --recover            when a host is lost (its ranks die, or it goes silent) the others train on\n"
        "                       without a restart (fsdp_desc.recovery): the step in flight is dropped and\n"
        "                       taken again with the same data, or applied everywhere; the survivors then\n"
        "                       split the whole global batch (--batch must divide evenly at every replica\n"
        "                       count down to 2 or --min-replicas), so the losses stay those of the same\n"
        "                       sequences. A partition leaving no strict majority of the hosts stops with\n"
        "                       an error naming it. Rank 0 of the survivors prints the recovery's timeline\n"
        "                       (unix times, and ms after the last step done before the loss) at the next\n"
        "                       completed step. Not with --nproc (one host)\n"
        "  --detect-ms MS       with --recover: a silent host (powered off, cut off) is taken for lost\n"
        "                       after about MS ms (default 5000); a killed one at once\n"
        "  --min-replicas N     with --recover: stop rather than train on with fewer than N replicas\n"
        "                       (default 1; a strict majority of the last membership is needed anyway)\n"
        "                       Testing aid: GPT_FAULT_HOST=H makes GPT_FAULT_AT_STEP act on every rank of\n"
        "                       host H (as numbered at start), and GPT_FAULT_SIGNAL=STOP stops them (SIGSTOP)\n"
        "                       instead, for a script to kill the host or cut its link at a known step\n"
        "  --recovery-port P    with --recover, the same on every rank: rank r listens at P + r, where a\n"
        "                       lost host's ranks started again find the job (default: none; no rejoin)\n");
    fprintf(out,
        "  --rejoin             with --recover and --recovery-port: this rank is one of a lost host's ranks\n"
        "                       started again, with the environment the job first gave it (RANK WORLD_SIZE\n"
        "                       LOCAL_RANK LOCAL_WORLD_SIZE, FSDP_SECRET or FSDP_SECRET_FILE, and FSDP_JOB\n"
        "                       or the MASTER_PORT it was named after: under torchrun or SLURM set FSDP_JOB)\n"
        "                       and the job's flags and data (checked against the survivors': the default\n"
        "                       text is read from the sources, so edits since the job began are refused).\n"
        "                       It makes the world of its host's ranks (over\n"
        "                       127.0.0.1 at port P + WORLD_SIZE + RANK - LOCAL_RANK), finds the job at\n"
        "                       --peers, is admitted at the second step boundary after it connects (the\n"
        "                       survivors' next step challenges it, the one after hears its answer; fsdp_init\n"
        "                       with recovery.rejoin: it receives its counterpart's master shards, AdamW state\n"
        "                       and step) and trains on from the data position the survivors sent with it,\n"
        "                       on its replica's share. The survivors' rank 0 prints the admission's\n"
        "                       timeline (state sent: bytes, ms, MB/s; the survivors' pause; caught up),\n"
        "                       the host's first rank its own (requested, state received, first step)\n"
        "  --peers LIST         with --rejoin: \"addr:port,...\", the listeners of each host's first rank in\n"
        "                       host order (host h's at P + h * LOCAL_WORLD_SIZE) (default: the\n"
        "                       environment's FSDP_RECOVERY_PEERS)\n"
        "                       Testing aid: GPT_PAUSE_AT_STEP=S stops (SIGSTOP) rank 0 of the world\n"
        "                       training at the start of steps S and S+1, for a script to start a host\n"
        "                       again and let it in at a known point (SIGCONT at S once it connected:\n"
        "                       challenged at S's end; at S+1 once it answered: admitted after S+1)\n");
}

/* --help, last part: what is printed and written as the run goes, and the sample. */
static void usage_output(FILE *out) {
    fprintf(out,
        "output\n"
        "  --print-every N      rank 0 prints every N steps: the step's loss (mean over all ranks), the\n"
        "                       learning rate, the gradient norm, and averaged since the last line: ms/step,\n"
        "                       tokens/s and the time spent in fsdp calls (hooks, fsdp_step, zero_grad:\n"
        "                       communication not hidden behind compute, plus the update) (default 25)\n"
        "  --log FILE           rank 0 writes a JSON line per step, flushed: step, loss, lr, grad_norm (-1\n"
        "                       when not finite), skipped, loss_scale, ms, in_fsdp_ms, tokens_per_s,\n"
        "                       bytes_sent_host and bytes_sent_net (what rank 0 sent in the step within its\n"
        "                       host and to other hosts), peak_rss_mib (appended when resuming)\n"
        "  --sample N           bytes to generate at the end (rank 0, on gathered weights) (default 300)\n"
        "  --prompt TEXT        what the sample continues (default a newline)\n"
        "  --temperature X      sampling temperature; 0: greedy (default 0.8)\n"
        "  --help               this text\n");
}

/* --help: in parts, one per group of options (C99 promises only 4095 bytes per string literal). */
static void usage(FILE *out) {
    usage_training(out);
    usage_memory_and_fsdp(out);
    usage_checkpoints(out);
    usage_recovery(out);
    usage_output(out);
}

/* --recover and its settings: what recovery survives is a host, so the ranks must be on hosts of
   their own under HYBRID_SHARD (fsdp_init checks the rest: a socket world, a replica per host). */
static void check_recover_flags(const options *o) {
    if (!o->recover && (o->detect_ms || o->min_replicas || o->recovery_port || o->rejoin || o->peers))
        die_usage("--detect-ms, --min-replicas, --recovery-port, --rejoin and --peers are settings of --recover");
    if (!o->recover) return;
    if (o->rejoin && !o->recovery_port)
        die_usage("--rejoin needs --recovery-port: the job's ranks listen there for a host that rejoins (give every "
                  "rank the same)");
    if (o->peers && !o->rejoin) die_usage("--peers says where a --rejoin rank finds the job: only with --rejoin");
    if (o->rejoin && (o->resume || o->log_path))
        die_usage("--rejoin takes its state from the survivors: no --resume (and no --log: rank 0's is the job's)");
    if (o->strategy != FSDP_HYBRID_SHARD)
        die_usage("--recover needs --strategy HYBRID_SHARD: a host's loss is survived because every other host holds a "
                  "whole copy of the training state (%s shards one copy over every rank)", fsdp_strategy_name(o->strategy));
    if (o->nproc)
        die_usage("--recover survives the loss of a host, and --nproc forks every rank on this one: start the ranks on "
                  "several hosts (torchrun --nnodes N, mpirun, or RANK WORLD_SIZE MASTER_ADDR MASTER_PORT per host) over "
                  "sockets, as many on each host");
}

/* The testing aids' environment (GPT_FAULT_*: --help says what each does). */
static void parse_faults(options *o) {
    const char *fault;
    o->fault_host = -1;
    if ((fault = getenv("GPT_FAULT_HOST")) != NULL && *fault) o->fault_host = (int)arg_int("GPT_FAULT_HOST", fault, 0, 4096);
    if ((fault = getenv("GPT_FAULT_SIGNAL")) != NULL && *fault) {
        static const char *const signals[] = {"KILL", "STOP", NULL};
        o->fault_stop = arg_choice("GPT_FAULT_SIGNAL", fault, signals, 0) == 1;
    }
    if ((fault = getenv("GPT_FAULT_AT_STEP")) != NULL && *fault)
        o->fault_at_step = arg_int("GPT_FAULT_AT_STEP", fault, 1, 100000000);
    if ((fault = getenv("GPT_FAULT_IN_SAVE")) != NULL && *fault)
        o->fault_in_save = arg_int("GPT_FAULT_IN_SAVE", fault, 1, 100000000);
    if ((fault = getenv("GPT_PAUSE_AT_STEP")) != NULL && *fault)
        o->pause_at_step = arg_int("GPT_PAUSE_AT_STEP", fault, 1, 100000000);
}

static void parse(options *o, int argc, char **argv, const char *exe_dir) {
    static const char *const backends[] = {"shm", "socket", NULL};
    static const char *const dtypes[] = {"f32", "bf16", "f16", NULL}, *const state_dtypes[] = {"f32", "bf16", NULL};
    static const char *const wires[] = {"int8", "int4", NULL};
    static const char *const grad_wires[] = {"int8", "int4", "none", NULL}; // FSDP_WIRE_INT8 + index; none: DEFAULT
    memset(o, 0, sizeof *o);
    o->backend = FSDP_BACKEND_SHM, o->layers = 4, o->heads = 4, o->channels = 128, o->seq_len = 64;
    o->batch = 16, o->steps = 500, o->warmup = 30, o->print_every = 25, o->sample = 300, o->accum = 1;
    o->lr = 3e-3f, o->weight_decay = 0.01f, o->clip = 1.0f, o->temperature = 0.8f, o->prompt = "\n";
    o->strategy = FSDP_FULL_SHARD, o->param_dtype = FSDP_F32, o->state_dtype = FSDP_F32;
    snprintf(o->ckpt_default, sizeof o->ckpt_default, "%s/gpt_ckpt", exe_dir);
    o->ckpt = o->ckpt_default;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(f, "--print-units")) { o->print_units = 1; continue; }
        if (!strcmp(f, "--decay-all")) { o->decay_all = 1; continue; }
        if (!strcmp(f, "--async-ckpt")) { o->async_ckpt = 1; continue; }
        if (!strcmp(f, "--error-feedback")) { o->error_feedback = 1; continue; }
        if (!strcmp(f, "--overlap-step")) { o->overlap_step = 1; continue; }
        if (!strcmp(f, "--accum-reduce")) { o->accum_reduce = 1; continue; }
        if (!strcmp(f, "--no-roofline")) { o->no_roofline = 1; continue; }
        if (!strcmp(f, "--recover")) { o->recover = 1; continue; }
        if (!strcmp(f, "--rejoin")) { o->rejoin = 1; continue; }
        if (!strcmp(f, "--recompute")) { // an optional K: every K-th block
            o->recompute = v && *v >= '0' && *v <= '9' ? (int)arg_int(f, argv[++i], 1, GPT_MAX_LAYERS) : 1;
            continue;
        }
        if (strncmp(f, "--", 2) != 0) die_usage("unexpected argument '%s'", f);
        if (!v) die_usage("%s needs a value", f);
        i++;
        if (!strcmp(f, "--nproc")) o->nproc = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--backend")) o->backend = (fsdp_backend_kind)arg_choice(f, v, backends, FSDP_BACKEND_SHM);
        else if (!strcmp(f, "--data")) o->data_path = v;
        else if (!strcmp(f, "--layers")) o->layers = (int)arg_int(f, v, 1, GPT_MAX_LAYERS);
        else if (!strcmp(f, "--heads")) o->heads = (int)arg_int(f, v, 1, 4096);
        else if (!strcmp(f, "--channels")) o->channels = (int)arg_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--seq-len")) o->seq_len = (int)arg_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--seed")) o->seed = (unsigned long long)arg_int(f, v, 0, 0x7fffffffL);
        else if (!strcmp(f, "--batch")) o->batch = (int)arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--steps")) o->steps = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--lr")) o->lr = arg_float(f, v);
        else if (!strcmp(f, "--warmup")) o->warmup = (int)arg_int(f, v, 0, 100000000);
        else if (!strcmp(f, "--min-lr")) o->min_lr = arg_float(f, v), o->min_lr_set = 1;
        else if (!strcmp(f, "--weight-decay")) o->weight_decay = arg_float(f, v);
        else if (!strcmp(f, "--clip")) o->clip = arg_float(f, v);
        else if (!strcmp(f, "--accum")) o->accum = (int)arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--mem-budget")) o->mem_budget_mib = arg_float(f, v);
        else if (!strcmp(f, "--strategy")) o->strategy = arg_strategy(f, v);
        else if (!strcmp(f, "--param-dtype")) o->param_dtype = (fsdp_dtype)arg_choice(f, v, dtypes, FSDP_F32);
        else if (!strcmp(f, "--offload")) arg_offload(f, v, &o->offload);
        else if (!strcmp(f, "--offload-dir")) o->offload.dir = v;
        else if (!strcmp(f, "--offload-ram")) o->offload.ram_bytes = (size_t)arg_int(f, v, 1, 1 << 20) << 20;
        else if (!strcmp(f, "--param-wire")) o->param_wire = (fsdp_wire)arg_choice(f, v, wires, FSDP_WIRE_INT8);
        else if (!strcmp(f, "--grad-wire")) {
            int w = arg_choice(f, v, grad_wires, FSDP_WIRE_INT8);
            o->grad_wire = w > FSDP_WIRE_INT4 ? FSDP_WIRE_DEFAULT : (fsdp_wire)w;
        }
        else if (!strcmp(f, "--wire-block")) o->wire_block = (size_t)arg_int(f, v, 8, 4096);
        else if (!strcmp(f, "--reshard-after-forward"))
            o->reshard = (fsdp_reshard_mode)arg_choice(f, v, reshard_names, FSDP_RESHARD_ALL);
        else if (!strcmp(f, "--state-dtype")) o->state_dtype = (fsdp_dtype)arg_choice(f, v, state_dtypes, FSDP_F32);
        else if (!strcmp(f, "--ckpt")) o->ckpt = v;
        else if (!strcmp(f, "--save-every")) o->save_every = (int)arg_int(f, v, 0, 100000000);
        else if (!strcmp(f, "--resume")) o->resume = v;
        else if (!strcmp(f, "--max-restarts")) o->max_restarts = (int)arg_int(f, v, 0, 1000);
        else if (!strcmp(f, "--detect-ms")) o->detect_ms = (int)arg_int(f, v, 1, 600000);
        else if (!strcmp(f, "--min-replicas")) o->min_replicas = (int)arg_int(f, v, 1, 4096);
        else if (!strcmp(f, "--recovery-port")) o->recovery_port = (int)arg_int(f, v, 1, 65535);
        else if (!strcmp(f, "--peers")) o->peers = v;
        else if (!strcmp(f, "--print-every")) o->print_every = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--sample")) o->sample = (int)arg_int(f, v, 0, 1 << 20);
        else if (!strcmp(f, "--prompt")) o->prompt = v;
        else if (!strcmp(f, "--log")) o->log_path = v;
        else if (!strcmp(f, "--temperature")) o->temperature = arg_float(f, v);
        else die_usage("unknown option '%s'", f);
    }
    if (!(o->lr > 0)) die_usage("--lr must be > 0");
    if (!o->min_lr_set) o->min_lr = o->lr / 10;
    if (o->min_lr > o->lr) die_usage("--min-lr %g is above --lr %g", (double)o->min_lr, (double)o->lr);
    if (o->channels % o->heads) die_usage("--channels %d is not divisible by --heads %d", o->channels, o->heads);
    if (!*o->ckpt) die_usage("--ckpt needs a directory (or 'none')");
    if (o->resume && !strcmp(o->resume, "auto") && !strcmp(o->ckpt, "none"))
        die_usage("--resume auto continues from the --ckpt directory; give one instead of 'none'");
    if ((o->offload.optimizer || o->offload.params || o->offload.grads) && !o->offload.dir &&
        !(getenv("FSDP_OFFLOAD_DIR") && *getenv("FSDP_OFFLOAD_DIR")))
        die_usage("--offload needs a directory on a local disk: --offload-dir DIR (or FSDP_OFFLOAD_DIR)");
    if (o->max_restarts && !o->nproc)
        die_usage("--max-restarts restarts the ranks --nproc forks; under torchrun pass --max_restarts to torchrun");
    check_recover_flags(o);
    parse_faults(o);
}

static int check_batch(const void *arg, int P) {
    const options *o = (const options *)arg;
    if (o->batch % (P * o->accum) == 0) return o->mem_budget_mib > 0 ? check_memory_budget(o, P) : 0;
    if (o->accum > 1)
        fprintf(stderr, "gpt: --batch %d is not divisible by the %d ranks times --accum %d: each rank takes an equal part "
                "of the global batch, in %d equal micro-batches; use a multiple of %d\n", o->batch, P, o->accum, o->accum,
                P * o->accum);
    else
        fprintf(stderr, "gpt: --batch %d is not divisible by the %d ranks: each rank takes an equal part of the global "
                "batch; use a multiple of %d (e.g. --batch %d)\n", o->batch, P, P, (o->batch / P + 1) * P);
    return 1;
}

/* --rejoin: the environment the job first gave this rank, rewritten to describe the world of its
   host's ranks alone (fsdp_comm_init_from_env then makes it, with the job's secret and token):
   rank LOCAL_RANK of LOCAL_WORLD_SIZE over sockets on 127.0.0.1, at a port of this host's own. */
static void rejoin_environment(options *o) {
    static const char *const needed[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL};
    char text[64];
    long v[4];
    for (int k = 0; needed[k]; k++) {
        const char *value = getenv(needed[k]);
        if (!value || !*value)
            die_usage("--rejoin: %s is not set: start the rank with the environment the job first gave it (RANK "
                      "WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE, as torchrun sets them)", needed[k]);
        v[k] = arg_int(needed[k], value, 0, 65535);
    }
    if (!(getenv("FSDP_JOB") && *getenv("FSDP_JOB"))) { // the token the job's ranks took (fsdp.h's >>env)
        if (getenv("TORCHELASTIC_RUN_ID") || getenv("SLURM_JOB_ID") || !getenv("MASTER_PORT"))
            die_usage("--rejoin: set FSDP_JOB to the job's token (the same on every rank from the start): the "
                      "survivors' token is not known here");
        snprintf(text, sizeof text, "port-%s", getenv("MASTER_PORT"));
        setenv("FSDP_JOB", text, 1);
    }
    o->job_world = (int)v[1];
    if (o->recovery_port + v[1] + v[0] - v[2] > 65535) die_usage("--recovery-port %d: too high for %ld ranks", o->recovery_port, v[1]);
    snprintf(text, sizeof text, "%ld", o->recovery_port + v[1] + v[0] - v[2]);
    setenv("MASTER_PORT", text, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("RANK", getenv("LOCAL_RANK"), 1);
    setenv("WORLD_SIZE", getenv("LOCAL_WORLD_SIZE"), 1);
    setenv("FSDP_BACKEND", "socket", 1);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE"); // (the host's world is its own: no agent store)
}

int main(int argc, char **argv) {
    example_program = "gpt";
    static options o; // large path buffers: not on the stack
    char exe_dir[1024];
    int rc;
    executable_dir(exe_dir, sizeof exe_dir, argv[0]);
    parse(&o, argc, argv, exe_dir);
    o.started = wall_now();
    if (o.rejoin) rejoin_environment(&o);
    setvbuf(stdout, NULL, _IOLBF, 0); // ranks share stdout: whole lines
    openblas_set_num_threads(1);      // before forking: no idle BLAS threads in the parent
    if (load_data(&o, exe_dir)) return 1;
    o.process_bytes = example_peak_rss(NULL); // the libraries and the text, which every rank inherits
    rc = example_run(o.nproc, o.backend, o.max_restarts, check_batch, train, &o);
    free(o.text);
    return rc ? 1 : 0;
}
