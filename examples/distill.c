/* distill: knowledge distillation with fsdp.h. A teacher GPT, trained by build/gpt and loaded
   from a full safetensors file, is frozen and runs forward only; a smaller student GPT (the same
   gpt_model.h code) learns from the text and from the teacher's softened predictions:

       loss = alpha * CE(student, next byte) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))

   (Hinton et al. 2015; T^2 keeps the soft term's gradient on the hard term's scale as the
   temperature T changes). Both models are sharded FULL_SHARD over the same ranks: two fsdp
   contexts on one communicator, used one after the other (the teacher's forward, ended by
   fsdp_finish_backward; then the student's forward, backward and step), so their collectives
   never interleave. The teacher is frozen (fsdp_model_set_trainable): no gradient, no optimizer
   state, no gradient communication; each rank holds 4 bytes per teacher parameter / P, and the
   teacher's backward hooks are never called.

   Build and run:  make build/distill
                   build/gpt --nproc 2 --data input.txt --layers 4 --channels 128 --ckpt teacher_ckpt
                   build/ckpt_tool consolidate teacher_ckpt teacher.safetensors --params-only
                   build/distill --nproc 2 --data input.txt --teacher teacher.safetensors
                   build/distill --nproc 2 --data input.txt --alpha 1      (the same student without a teacher)
                   build/distill --help */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt_model.h"

#define VAL_BATCHES 16 // global batches of held-out sequences scored at the end (fewer if the text is short)

typedef struct {
    int nproc;                        // 0: ranks from the environment
    fsdp_backend_kind backend;
    const char *data_path, *teacher_path, *save_path;
    int teacher_heads;                // when the teacher's file does not say (no gpt.heads metadata)
    int layers, heads, channels, seq_len, batch, steps, warmup, print_every;
    float alpha, temperature, lr, min_lr, weight_decay, clip;
    int min_lr_set;
    fsdp_strategy strategy;           // the student's
    unsigned long long seed;
    unsigned char *text;              // train: [0, train_size), held out: the rest
    size_t size, train_size;
} options;

static double mib(double bytes) { return bytes / 1048576.0; }

/* ----------------------------------------------------------------------------------------- */
/* the loss */

/* The distillation loss over N positions (V logits each) and its gradient with respect to the
   student's logits, for the mean over the positions:
       dlogits = (alpha (p - onehot(target)) + (1 - alpha) T (p_T - q_T)) / N
   with p = softmax(z) (student_probs, from gpt_forward), p_T = softmax(z / T) and
   q_T = softmax(t / T) (z the student's logits, t the teacher's). *ce and *kl get the means of
   the cross-entropy (student_losses, from gpt_forward) and of the KL term (without T^2).
   teacher_logits may be NULL when alpha is 1. scratch: 2V floats. */
static void distill_loss_backward(float *dlogits, double *ce, double *kl, const float *student_logits,
                                  const float *student_probs, const float *student_losses, const float *teacher_logits,
                                  const int *targets, size_t N, int V, float alpha, float temperature, float *scratch) {
    float *log_p = scratch, *log_q = scratch + V, inv_t = 1.0f / temperature, scale = 1.0f / (float)N;
    double ce_sum = 0, kl_sum = 0;
    for (size_t n = 0; n < N; n++) {
        const float *z = student_logits + n * V, *p = student_probs + n * V;
        float *dz = dlogits + n * V;
        ce_sum += student_losses[n];
        for (int v = 0; v < V; v++) dz[v] = alpha * p[v] * scale;
        dz[targets[n]] -= alpha * scale;
        if (alpha < 1.0f) {
            const float *t = teacher_logits + n * V;
            const float *logits[2] = {z, t};
            float *logs[2] = {log_p, log_q};
            double kl_n = 0;
            for (int k = 0; k < 2; k++) { // log softmax(x / T), stable
                float maxval = logits[k][0], sum = 0, log_sum;
                for (int v = 1; v < V; v++) maxval = logits[k][v] > maxval ? logits[k][v] : maxval;
                for (int v = 0; v < V; v++) logs[k][v] = (logits[k][v] - maxval) * inv_t, sum += expf(logs[k][v]);
                log_sum = logf(sum);
                for (int v = 0; v < V; v++) logs[k][v] -= log_sum;
            }
            for (int v = 0; v < V; v++) {
                float q = expf(log_q[v]);
                kl_n += (double)q * (double)(log_q[v] - log_p[v]);
                dz[v] += (1.0f - alpha) * temperature * (expf(log_p[v]) - q) * scale;
            }
            kl_sum += kl_n;
        }
    }
    *ce = ce_sum / (double)N;
    *kl = kl_sum / (double)N;
}

/* ----------------------------------------------------------------------------------------- */
/* the teacher */

/* The teacher's shape from its file: blocks (h.<i>.ln_1.weight), channels and context (wte and
   wpe); its heads from the metadata gpt.heads (build/gpt writes it) or --teacher-heads. */
static int read_teacher_config(const options *o, gpt_config *c, char *err, size_t err_size) {
    fsdp_st_file *f;
    const char *heads;
    int wte, wpe;
    memset(c, 0, sizeof *c);
    if (fsdp_st_open(&f, o->teacher_path, err, err_size)) {
        char index[1200];
        snprintf(index, sizeof index, "%s/index.json", o->teacher_path);
        if (access(index, R_OK) == 0) // a sharded checkpoint, as build/gpt saves
            snprintf(err, err_size, "%s is a sharded checkpoint; make one file of it first: build/ckpt_tool "
                     "consolidate %s teacher.safetensors --params-only", o->teacher_path, o->teacher_path);
        return -1;
    }
    wte = fsdp_st_find(f, "wte.weight"), wpe = fsdp_st_find(f, "wpe.weight");
    if (wte < 0 || wpe < 0 || fsdp_st_tensor_at(f, wte)->ndim != 2 || fsdp_st_tensor_at(f, wpe)->ndim != 2) {
        snprintf(err, err_size, "%s has no wte.weight and wpe.weight matrices: not a GPT saved by build/gpt", o->teacher_path);
        fsdp_st_close(f);
        return -1;
    }
    if (fsdp_st_tensor_at(f, wte)->shape[0] < 1 || fsdp_st_tensor_at(f, wte)->shape[0] > INT_MAX ||
        fsdp_st_tensor_at(f, wte)->shape[1] < 1 || fsdp_st_tensor_at(f, wte)->shape[1] > INT_MAX ||
        fsdp_st_tensor_at(f, wpe)->shape[0] < 1 || fsdp_st_tensor_at(f, wpe)->shape[0] > INT_MAX) {
        snprintf(err, err_size, "%s: wte.weight or wpe.weight has a dimension of 0 or above %d", o->teacher_path, INT_MAX);
        fsdp_st_close(f);
        return -1;
    }
    c->vocab_size = (int)fsdp_st_tensor_at(f, wte)->shape[0];
    c->channels = (int)fsdp_st_tensor_at(f, wte)->shape[1];
    c->max_seq_len = (int)fsdp_st_tensor_at(f, wpe)->shape[0];
    for (c->num_layers = 0; c->num_layers < GPT_MAX_LAYERS; c->num_layers++) {
        char name[64];
        snprintf(name, sizeof name, "h.%d.ln_1.weight", c->num_layers);
        if (fsdp_st_find(f, name) < 0) break;
    }
    heads = fsdp_st_metadata(f, "gpt.heads");
    c->num_heads = heads ? atoi(heads) : o->teacher_heads;
    fsdp_st_close(f);
    if (c->vocab_size != 256 || c->num_layers < 1 || c->num_heads < 1 || c->channels % c->num_heads) {
        snprintf(err, err_size, "%s: vocabulary %d (256 expected), %d blocks, %d heads (%s) for %d channels: not a "
                 "byte-level GPT of build/gpt%s", o->teacher_path, c->vocab_size, c->num_layers, c->num_heads,
                 heads ? "metadata gpt.heads" : "--teacher-heads", c->channels, heads ? "" : ", or give --teacher-heads");
        return -1;
    }
    if (o->seq_len > c->max_seq_len) {
        snprintf(err, err_size, "--seq-len %d is longer than the teacher's context (%d positions): use --seq-len %d or "
                 "less", o->seq_len, c->max_seq_len, c->max_seq_len);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* what each rank runs */

static fsdp_desc make_desc(fsdp_comm *comm, fsdp_strategy strategy, const options *o) {
    static const char *const wrap_types[] = {"Block", NULL};
    static const fsdp_param_group decay_matrices_only[1] = {{NULL, 0, 1, 0.0f, 0}}; // GPT-2's recipe
    fsdp_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.comm = comm;
    desc.strategy = strategy;
    desc.wrap.kind = FSDP_WRAP_TYPES;
    desc.wrap.types = wrap_types;
    desc.forward_prefetch = 1;
    desc.seed = o->seed;
    desc.optimizer.kind = FSDP_ADAMW;
    desc.optimizer.lr = o->lr;
    desc.optimizer.weight_decay = o->weight_decay;
    desc.optimizer.weight_decay_set = 1;
    desc.param_groups = decay_matrices_only;
    desc.num_param_groups = 1;
    return desc;
}

/* One rank's run: the two models, their contexts, and the loss means since the last printed line. */
typedef struct {
    const options *o;
    fsdp_comm *comm;
    int rank, P, B, T, use_teacher;   // B: sequences per rank, T: their length
    gpt_config teacher_config;
    fsdp_ctx *student_ctx, *teacher_ctx;
    gpt student, teacher;
    gpt_acts student_acts, teacher_acts;
    float *scratch;
    double interval_ms, first_loss, loss_avg[4]; // loss, ce, kl, teacher ce
    int interval_steps;
} distiller;

/* The teacher: frozen, FULL_SHARD, its weights from the file; activations of one block, no gradients. */
static int setup_teacher(distiller *d) {
    const options *o = d->o;
    int rank = d->rank;
    fsdp_load_options lo;
    fsdp_load_report report;
    fsdp_desc desc;
    char err[600];
    if (read_teacher_config(o, &d->teacher_config, err, sizeof err)) {
        if (rank == 0) fprintf(stderr, "distill: --teacher: %s\n", err);
        return -1;
    }
    if (!d->scratch || gpt_build(&d->teacher, d->teacher_config) || fsdp_model_set_trainable(d->teacher.model, 0, 0) ||
        gpt_acts_alloc_ex(&d->teacher_acts, &d->teacher_config, d->B, d->T, 1, 0)) {
        fprintf(stderr, "rank %d: out of memory building the teacher\n", rank);
        return -1;
    }
    d->teacher.rank = rank;
    desc = make_desc(d->comm, FSDP_FULL_SHARD, o);
    if (fsdp_init(&d->teacher_ctx, d->teacher.model, &desc)) {
        fprintf(stderr, "rank %d: the teacher: %s\n", rank, fsdp_last_error(NULL));
        return -1;
    }
    d->teacher.ctx = d->teacher_ctx;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    if (fsdp_load_full(d->teacher_ctx, o->teacher_path, &lo, &report)) {
        fprintf(stderr, "rank %d: --teacher %s: %s\n", rank, o->teacher_path, fsdp_last_error(d->teacher_ctx));
        return -1;
    }
    return 0;
}

/* The student: trained, as build/gpt trains (AdamW, no decay below 2 dimensions). */
static int setup_student(distiller *d) {
    const options *o = d->o;
    gpt_config student_config = {256, o->seq_len, o->layers, o->heads, o->channels};
    fsdp_desc desc;
    if (!d->scratch || gpt_build(&d->student, student_config) ||
        gpt_acts_alloc(&d->student_acts, &student_config, d->B, d->T)) {
        fprintf(stderr, "rank %d: out of memory building the student\n", d->rank);
        return -1;
    }
    d->student.rank = d->rank;
    desc = make_desc(d->comm, o->strategy, o);
    if (fsdp_init(&d->student_ctx, d->student.model, &desc)) {
        fprintf(stderr, "rank %d: the student: %s\n", d->rank, fsdp_last_error(NULL));
        return -1;
    }
    d->student.ctx = d->student_ctx;
    return 0;
}

/* Rank 0: the ranks, the teacher, the student and the loss. */
static void print_run(const distiller *d) {
    const options *o = d->o;
    const gpt_config *tc = &d->teacher_config;
    int P = d->P, T = d->T;
    printf("distill: %d rank%s (%s), one communicator, two fsdp contexts\n", P, P > 1 ? "s" : "",
           fsdp_backend_name(fsdp_comm_backend(d->comm)));
    if (d->use_teacher)
        printf("teacher: %s: %d block%s, %d heads, %d channels, context %d: %zu parameters, frozen, FULL_SHARD, "
               "forward only\n", o->teacher_path, tc->num_layers, tc->num_layers > 1 ? "s" : "",
               tc->num_heads,
               tc->channels, tc->max_seq_len, d->teacher.num_params);
    else
        printf("teacher: none (alpha 1: cross-entropy only)\n");
    printf("student: %d block%s, %d heads, %d channels, context %d: %zu parameters, %s, AdamW lr %g (warmup %d, "
           "cosine to %g), weight decay %g on the matrices and embeddings, clip %g\n", o->layers, o->layers > 1 ? "s" : "", o->heads,
           o->channels, T, d->student.num_params, fsdp_strategy_name(o->strategy), (double)o->lr, o->warmup,
           (double)o->min_lr, (double)o->weight_decay, (double)o->clip);
    printf("loss: %g * CE + %g * T^2 * KL(teacher_T || student_T), temperature T = %g; data %s, %zu bytes (%zu "
           "held out); global batch %d x %d bytes\n", (double)o->alpha, 1.0 - (double)o->alpha,
           (double)o->temperature, o->data_path, o->size, o->size - o->train_size, o->batch, T);
}

/* The teacher's logits for the student's batch (in student_acts). Forward only: the pass ends
   with fsdp_finish_backward, no backward hooks. */
static int teacher_forward(distiller *d, float *teacher_ce) {
    size_t n = (size_t)d->B * d->T;
    memcpy(d->teacher_acts.inputs, d->student_acts.inputs, sizeof(int) * n);
    memcpy(d->teacher_acts.targets, d->student_acts.targets, sizeof(int) * n);
    if (gpt_forward(&d->teacher, &d->teacher_acts, d->B, d->T, 1, teacher_ce)) return -1;
    if (fsdp_finish_backward(d->teacher_ctx)) {
        fprintf(stderr, "rank %d: the teacher's pass: %s\n", d->rank, fsdp_last_error(d->teacher_ctx));
        return -1;
    }
    return 0;
}

/* Adds this step's losses, averaged over all ranks, to loss_avg (both contexts' comm threads
   are idle here); loss[0] gets the step's distillation loss. */
static int average_losses(distiller *d, double ce, double kl, float teacher_ce, double loss[4]) {
    const options *o = d->o;
    float mine[4] = {(float)(o->alpha * ce + (1.0 - o->alpha) * o->temperature * o->temperature * kl), (float)ce,
                     (float)kl, teacher_ce}, all[4];
    if (fsdp_all_reduce(d->comm, mine, all, 4, FSDP_F32, FSDP_AVG)) {
        fprintf(stderr, "rank %d: all_reduce of the losses: %s\n", d->rank, fsdp_comm_last_error(d->comm));
        return -1;
    }
    for (int k = 0; k < 4; k++) loss[k] = all[k], d->loss_avg[k] += all[k];
    return 0;
}

/* Rank 0 prints the means since the last line; every rank starts a new interval. */
static void print_interval(distiller *d, long long step, float lr, const fsdp_step_report *report) {
    const options *o = d->o;
    int n = d->interval_steps;
    if (d->rank == 0) {
        printf("step %5lld/%d  loss %.4f  (ce %.4f  kl %.4f", step + 1, o->steps, d->loss_avg[0] / n,
               d->loss_avg[1] / n, d->loss_avg[2] / n);
        if (d->use_teacher) printf("  teacher ce %.4f", d->loss_avg[3] / n);
        printf(")  lr %.2e  norm %6.3f%s  %6.1f ms/step\n", (double)lr, report->grad_norm,
               report->skipped ? " (skipped: not finite)" : "", d->interval_ms / n);
    }
    memset(d->loss_avg, 0, sizeof d->loss_avg);
    d->interval_ms = 0, d->interval_steps = 0;
}

/* One training step: the teacher's forward, the student's forward, the distillation loss, the
   student's backward and update; then the losses' means, printed every --print-every steps. */
static int take_step(distiller *d, long long step) {
    const options *o = d->o;
    int B = d->B, T = d->T;
    fsdp_step_report report;
    float lr = lr_schedule(step, o->steps, o->warmup, o->lr, o->min_lr), ce32 = 0, teacher_ce = 0;
    double ce, kl, t0 = fsdp_now(), loss[4];
    gpt_acts *sa = &d->student_acts;
    data_batch(o->text, o->train_size, step, o->batch, T, d->rank * B, (d->rank + 1) * B, sa->inputs, sa->targets);
    if (d->use_teacher && teacher_forward(d, &teacher_ce)) return -1;
    if (fsdp_set_lr(d->student_ctx, lr) || gpt_forward(&d->student, sa, B, T, 1, &ce32)) return -1;
    distill_loss_backward(sa->da.dlogits, &ce, &kl, sa->a.logits, sa->a.probs, sa->a.losses,
                          d->use_teacher ? d->teacher_acts.a.logits : NULL, sa->targets, (size_t)B * T, 256, o->alpha,
                          o->temperature, d->scratch);
    if (gpt_backward_from_dlogits(&d->student, sa, B, T)) return -1;
    if (fsdp_step(d->student_ctx, o->clip, &report) || fsdp_zero_grad(d->student_ctx)) {
        fprintf(stderr, "rank %d: step %lld: %s\n", d->rank, step + 1, fsdp_last_error(d->student_ctx));
        return -1;
    }
    d->interval_ms += 1e3 * (fsdp_now() - t0), d->interval_steps++;
    if (average_losses(d, ce, kl, teacher_ce, loss)) return -1;
    if (step == 0) d->first_loss = loss[0];
    if ((step + 1) % o->print_every == 0 || step == 0 || step == o->steps - 1) print_interval(d, step, lr, &report);
    return 0;
}

/* Every rank's memory, printed by rank 0: the teacher holds only its parameter shards. Collective. */
static int report_memory(distiller *d) {
    fsdp_memory_stats st, te;
    int P = d->P;
    double mine[3], *all = (double *)calloc((size_t)P * 3, sizeof(double));
    memset(&st, 0, sizeof st), memset(&te, 0, sizeof te);
    fsdp_memory_stats_get(d->student_ctx, &st);
    if (d->teacher_ctx) fsdp_memory_stats_get(d->teacher_ctx, &te);
    mine[0] = (double)st.persistent_bytes, mine[1] = (double)te.persistent_bytes, mine[2] = example_peak_rss(NULL);
    if (!all || fsdp_all_gather(d->comm, mine, all, sizeof mine / 4, FSDP_F32)) { // doubles, moved as bytes
        fprintf(stderr, "rank %d: gathering the statistics failed: %s\n", d->rank, fsdp_comm_last_error(d->comm));
        free(all);
        return -1;
    }
    if (d->rank == 0) {
        size_t teacher_params = d->teacher.num_params;
        printf("\nrank  student persistent  teacher persistent (B/param)   max RSS\n");
        for (int r = 0; r < P; r++)
            printf("%4d  %14.2f MiB  %14.2f MiB (%5.3f)  %6.1f MiB\n", r, mib(all[3 * r]), mib(all[3 * r + 1]),
                   teacher_params ? all[3 * r + 1] / (double)teacher_params : 0.0, mib(all[3 * r + 2]));
        printf("(student: f32 parameters, gradients, AdamW state, 16 B/param / P; teacher: parameters only, 4 B/param "
               "/ P = %.3f)\n", 4.0 / P);
    }
    free(all);
    return 0;
}

/* The held-out cross-entropy of the student (and the teacher), every rank scoring a share.
   Collective; nothing if the held-out text is shorter than a sequence. */
static int report_heldout(distiller *d) {
    const options *o = d->o;
    int T = d->T, sequences;
    double student_val, teacher_val = 0;
    const unsigned char *val = o->text + o->train_size;
    size_t val_size = o->size - o->train_size;
    if (val_size < (size_t)T + 2) return 0;
    sequences = gpt_heldout_sequences(val_size, T, VAL_BATCHES * o->batch); // the same at every P
    if (gpt_heldout_loss(&d->student, &d->student_acts, d->comm, val, val_size, sequences, &student_val) ||
        (d->use_teacher &&
         gpt_heldout_loss(&d->teacher, &d->teacher_acts, d->comm, val, val_size, sequences, &teacher_val)))
        return -1;
    if (d->rank == 0) {
        printf("first step loss %.4f; held-out loss (cross-entropy, %d sequences x %d bytes not trained on): student "
               "%.4f", d->first_loss, sequences, T, student_val);
        if (d->use_teacher) printf(", teacher %.4f", teacher_val);
        printf("\n");
    }
    return 0;
}

/* --save: the student's parameters. Collective. */
static int save_student(distiller *d) {
    const options *o = d->o;
    fsdp_save_options so;
    memset(&so, 0, sizeof so);
    if (fsdp_save_full(d->student_ctx, o->save_path, &so)) {
        fprintf(stderr, "rank %d: --save %s: %s\n", d->rank, o->save_path, fsdp_last_error(d->student_ctx));
        return -1;
    }
    if (d->rank == 0) printf("saved the student to %s\n", o->save_path);
    return 0;
}

/* What each rank runs: build and load the teacher, build the student, train it, report, save. */
static int train(fsdp_comm *comm, void *arg) {
    distiller d;
    int rc = 1;
    memset(&d, 0, sizeof d);
    d.o = (const options *)arg;
    d.comm = comm;
    d.rank = fsdp_comm_rank(comm), d.P = fsdp_comm_size(comm), d.B = d.o->batch / d.P, d.T = d.o->seq_len;
    d.use_teacher = d.o->alpha < 1.0f;
    d.scratch = (float *)malloc(sizeof(float) * 2 * 256);
    openblas_set_num_threads(1);
    if ((d.use_teacher && setup_teacher(&d)) || setup_student(&d)) goto done;
    if (d.rank == 0) print_run(&d);
    for (long long step = 0; step < d.o->steps; step++)
        if (take_step(&d, step)) goto done;
    if (report_memory(&d) || report_heldout(&d) || (d.o->save_path && save_student(&d))) goto done;
    rc = 0;
done:
    fsdp_destroy(d.student_ctx);
    fsdp_destroy(d.teacher_ctx);
    gpt_acts_free(&d.student_acts);
    gpt_acts_free(&d.teacher_acts);
    gpt_free(&d.student);
    gpt_free(&d.teacher);
    free(d.scratch);
    return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* data and flags */

/* The text: --data, or fsdp.h (in the current directory or next to the executable's). The last
   10% is held out, as build/gpt holds it out: train the teacher on the same --data. */
static int load_text(options *o) {
    char exe[1024], path[1200];
    const char *file = o->data_path;
    FILE *f = NULL;
    long n;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = 0;
    if (strrchr(exe, '/')) *strrchr(exe, '/') = 0;
    for (int i = 0; !file && i < 2; i++) {
        snprintf(path, sizeof path, "%s%sfsdp.h", i ? exe : "", i ? "/../" : "");
        if (access(path, R_OK) == 0) file = path;
    }
    if (!file) {
        fprintf(stderr, "distill: no --data given and no fsdp.h here or next to the executable: pass the text the "
                "teacher was trained on with --data FILE\n");
        return -1;
    }
    if (!(f = fopen(file, "rb")) || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(o->text = (unsigned char *)malloc((size_t)n + 1)) || fread(o->text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "distill: cannot read '%s': %s\n", file, f ? "read error or out of memory" : strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    fclose(f);
    o->data_path = o->data_path ? o->data_path : "fsdp.h";
    o->size = (size_t)n;
    o->train_size = o->size - o->size / 10;
    if (o->size - o->train_size < (size_t)o->seq_len + 2) o->train_size = o->size; // too short to hold any out
    if (o->train_size < (size_t)o->seq_len + 2) {
        fprintf(stderr, "distill: %s has %zu bytes, too few for sequences of %d\n", file, o->size, o->seq_len);
        return -1;
    }
    return 0;
}

static void usage(FILE *out) {
    fprintf(out,
        "usage: distill --teacher FILE [options]\n"
        "Knowledge distillation with fsdp.h: a frozen teacher GPT (trained by build/gpt, loaded from a full\n"
        "safetensors file) and a smaller student GPT, both sharded FULL_SHARD over the same ranks (two fsdp\n"
        "contexts on one communicator). The teacher runs forward only and holds its parameter shards only\n"
        "(no gradients, no optimizer state: 4 bytes per parameter / P). The student is trained on\n"
        "  alpha * CE(student, next byte) + (1 - alpha) * T^2 * KL(softmax(teacher/T) || softmax(student/T)).\n"
        "At the end: each rank's memory, and the held-out cross-entropy of student and teacher.\n"
        "\n"
        "teacher\n"
        "  --teacher FILE       full safetensors file of a build/gpt model: build/gpt --ckpt DIR ..., then\n"
        "                       build/ckpt_tool consolidate DIR FILE --params-only. Its blocks, channels and\n"
        "                       context come from the tensors' shapes, its heads from the metadata gpt.heads\n"
        "  --teacher-heads N    heads, for a file without gpt.heads (default 4)\n"
        "  --alpha X            weight of the cross-entropy, in [0, 1] (default 0.5); 1: no teacher (the\n"
        "                       baseline: the same student trained on the text alone; --teacher not needed)\n"
        "  --temperature X      T > 0, softens both distributions (default 2)\n"
        "student\n"
        "  --layers N           transformer blocks (default 2)\n"
        "  --heads N            attention heads, dividing --channels (default 4)\n"
        "  --channels N         embedding width (default 64)\n"
        "  --seq-len N          context in bytes, at most the teacher's (default 64)\n"
        "  --seed N             seed of the student's initial weights (default 0)\n"
        "  --strategy S         the student's sharding, as build/gpt's (default FULL_SHARD)\n"
        "training (AdamW; weight decay on the matrices and embeddings only)\n"
        "  --data FILE          the text the teacher was trained on (default fsdp.h); its last 10%% is held\n"
        "                       out, as build/gpt holds it out\n"
        "  --batch N            global batch in sequences, divisible by the ranks (default 16)\n"
        "  --steps N            optimizer steps (default 200)\n"
        "  --lr X               peak learning rate (default 0.003)\n"
        "  --warmup N           steps of linear warmup (default 20)\n"
        "  --min-lr X           the cosine decay's end at the last step (default lr / 10)\n"
        "  --weight-decay X     (default 0.01)\n"
        "  --clip X             clip the global gradient norm; 0: off (default 1)\n"
        "ranks and output\n"
        "  --nproc N            fork N local ranks (default: the job from the environment, as build/gpt:\n"
        "                       torchrun's RANK WORLD_SIZE MASTER_ADDR MASTER_PORT, SLURM, mpirun; else 1)\n"
        "  --backend B          with --nproc: shm (default) or socket\n"
        "  --print-every N      print the mean losses every N steps (default 25)\n"
        "  --save FILE          save the student as a full safetensors file at the end\n"
        "  --help               this text\n");
}

static void parse(options *o, int argc, char **argv) {
    static const char *const backends[] = {"shm", "socket", NULL};
    memset(o, 0, sizeof *o);
    o->backend = FSDP_BACKEND_SHM, o->teacher_heads = 4, o->layers = 2, o->heads = 4, o->channels = 64, o->seq_len = 64;
    o->batch = 16, o->steps = 200, o->warmup = 20, o->print_every = 25;
    o->alpha = 0.5f, o->temperature = 2.0f, o->lr = 3e-3f, o->weight_decay = 0.01f, o->clip = 1.0f;
    o->strategy = FSDP_FULL_SHARD;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (strncmp(f, "--", 2) != 0) die_usage("unexpected argument '%s'", f);
        if (!v) die_usage("%s needs a value", f);
        i++;
        if (!strcmp(f, "--nproc")) o->nproc = (int)arg_int(f, v, 1, 256);
        else if (!strcmp(f, "--backend")) o->backend = (fsdp_backend_kind)arg_choice(f, v, backends, FSDP_BACKEND_SHM);
        else if (!strcmp(f, "--teacher")) o->teacher_path = v;
        else if (!strcmp(f, "--teacher-heads")) o->teacher_heads = (int)arg_int(f, v, 1, 4096);
        else if (!strcmp(f, "--alpha")) o->alpha = arg_float(f, v);
        else if (!strcmp(f, "--temperature")) o->temperature = arg_float(f, v);
        else if (!strcmp(f, "--layers")) o->layers = (int)arg_int(f, v, 1, GPT_MAX_LAYERS);
        else if (!strcmp(f, "--heads")) o->heads = (int)arg_int(f, v, 1, 4096);
        else if (!strcmp(f, "--channels")) o->channels = (int)arg_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--seq-len")) o->seq_len = (int)arg_int(f, v, 1, 1 << 16);
        else if (!strcmp(f, "--seed")) o->seed = (unsigned long long)arg_int(f, v, 0, 0x7fffffffL);
        else if (!strcmp(f, "--strategy")) o->strategy = arg_strategy(f, v);
        else if (!strcmp(f, "--data")) o->data_path = v;
        else if (!strcmp(f, "--batch")) o->batch = (int)arg_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--steps")) o->steps = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--lr")) o->lr = arg_float(f, v);
        else if (!strcmp(f, "--warmup")) o->warmup = (int)arg_int(f, v, 0, 100000000);
        else if (!strcmp(f, "--min-lr")) o->min_lr = arg_float(f, v), o->min_lr_set = 1;
        else if (!strcmp(f, "--weight-decay")) o->weight_decay = arg_float(f, v);
        else if (!strcmp(f, "--clip")) o->clip = arg_float(f, v);
        else if (!strcmp(f, "--print-every")) o->print_every = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--save")) o->save_path = v;
        else die_usage("unknown option '%s'", f);
    }
    if (o->alpha > 1) die_usage("--alpha %g is above 1 (it weighs the cross-entropy: 0 .. 1)", (double)o->alpha);
    if (!(o->temperature > 0)) die_usage("--temperature must be > 0");
    if (o->alpha < 1 && !o->teacher_path)
        die_usage("--teacher FILE is needed (a full safetensors file of a build/gpt model), or --alpha 1 for no teacher");
    if (!(o->lr > 0)) die_usage("--lr must be > 0");
    if (!o->min_lr_set) o->min_lr = o->lr / 10;
    if (o->min_lr > o->lr) die_usage("--min-lr %g is above --lr %g", (double)o->min_lr, (double)o->lr);
    if (o->channels % o->heads) die_usage("--channels %d is not divisible by --heads %d", o->channels, o->heads);
}

static int check_batch(const void *arg, int P) {
    const options *o = (const options *)arg;
    if (o->batch % P == 0) return 0;
    fprintf(stderr, "distill: --batch %d is not divisible by the %d ranks; use a multiple of %d\n", o->batch, P, P);
    return 1;
}

int main(int argc, char **argv) {
    static options o;
    int rc;
    example_program = "distill";
    parse(&o, argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0); // ranks share stdout: whole lines
    openblas_set_num_threads(1);      // before forking: no idle BLAS threads in the parent
    if (load_text(&o)) return 1;
    rc = example_run(o.nproc, o.backend, 0, check_batch, train, &o);
    free(o.text);
    return rc ? 1 : 0;
}
