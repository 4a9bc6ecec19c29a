/* gpt: trains a GPT-2 style byte-level language model with fsdp.h; each transformer block is an
   FSDP unit, the root unit holds the embeddings (wte, tied to the LM head, and wpe) and ln_f.

   Build and run:  make demo            (build/gpt --nproc 4: 4 local ranks, FULL_SHARD, on the fsdp.h sources)
                   build/gpt --help
                   build/gpt --nproc 2 --data input.txt --strategy grad_op --param-dtype bf16
                   build/gpt --nproc 3 --resume build/gpt_ckpt --steps 800   (any rank count)
                   torchrun-style: RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... build/gpt
   The model and its layers are in gpt_model.h (shared with tests/test_gpt.c). */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt_model.h"

#define VAL_BATCHES 16 // batches of the held-out text scored at the end

typedef struct {
    int nproc;                       // 0: ranks from the environment
    fsdp_backend_kind backend;
    const char *data_path;           // NULL: the fsdp.h sources
    int layers, heads, channels, seq_len, batch, steps, warmup, print_every, save_every, sample, print_units;
    float lr, min_lr, weight_decay, clip, temperature;
    int min_lr_set;
    fsdp_strategy strategy;
    fsdp_dtype param_dtype;
    const char *ckpt, *resume, *prompt;
    unsigned long long seed;
    char ckpt_default[1100];
    unsigned char *text;             // the whole text: train is [0, train_size), validation the rest
    size_t size, train_size;
    char data_name[1300];
} options;

static const char *strategy_names[] = {"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};

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
/* the end of training: held-out loss and a sample, on rank 0 with a plain copy of the weights
   (gathered with fsdp_gather_param): fsdp.h's hooks expect a backward after every forward, so
   forward-only passes cannot run through them */

/* Mean loss over VAL_BATCHES batches of the held-out text (B,T windows each); -1 if there is none. */
static double validation_loss(gpt *m, gpt_acts *acts, const options *o) {
    const unsigned char *val = o->text + o->train_size;
    size_t val_size = o->size - o->train_size;
    double sum = 0;
    if (val_size < (size_t)acts->T + 2) return -1;
    for (int i = 0; i < VAL_BATCHES; i++) {
        float loss;
        data_batch(val, val_size, i, acts->B, acts->T, 0, acts->B, acts->inputs, acts->targets);
        gpt_forward(m, acts, acts->B, acts->T, 1, &loss); // plain weights: cannot fail
        sum += loss;
    }
    return sum / VAL_BATCHES;
}

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

static int save_checkpoint(fsdp_ctx *ctx, const options *o, int rank, long long step) {
    fsdp_save_options so;
    double t = fsdp_now();
    memset(&so, 0, sizeof so);
    so.with_optimizer = 1;
    if (fsdp_save_sharded(ctx, o->ckpt, &so)) {
        fprintf(stderr, "rank %d: saving the checkpoint to %s failed: %s\n(choose another directory with --ckpt DIR, or "
                "--ckpt none)\n", rank, o->ckpt, fsdp_last_error(ctx));
        return -1;
    }
    if (rank == 0) printf("saved %s (step %lld, with AdamW state) in %.0f ms\n", o->ckpt, step, 1e3 * (fsdp_now() - t));
    return 0;
}

static int train(fsdp_comm *comm, void *arg) {
    const options *o = (const options *)arg;
    int rank = fsdp_comm_rank(comm), P = fsdp_comm_size(comm), B = o->batch / P, T = o->seq_len, rc = 1;
    const char *wrap_types[] = {"Block", NULL};
    gpt_config config = {256, o->seq_len, o->layers, o->heads, o->channels};
    double *step_ms = (double *)calloc(2 * (size_t)o->steps, sizeof(double)), *fsdp_ms = step_ms + o->steps;
    double interval_ms = 0, interval_fsdp_ms = 0;
    long long first_step = 0, step;
    int timed = 0, interval_steps = 0;
    float loss = 0;
    fsdp_ctx *ctx = NULL;
    fsdp_desc desc;
    gpt m;
    gpt_acts acts;
    memset(&m, 0, sizeof m);
    memset(&acts, 0, sizeof acts);

    openblas_set_num_threads(1);
    if (!step_ms || gpt_build(&m, config) || gpt_acts_alloc(&acts, &config, B, T)) {
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
    desc.forward_prefetch = 1;
    desc.backward_prefetch = FSDP_BACKWARD_PRE;
    desc.shard_group_size = fsdp_comm_local_size(comm);
    if (o->strategy == FSDP_HYBRID_SHARD && fsdp_comm_local_size(comm) == P && P % 2 == 0)
        desc.shard_group_size = P / 2; // one host: two replicas of half the ranks each, so something is replicated
    desc.seed = o->seed;
    desc.optimizer.kind = FSDP_ADAMW;
    desc.optimizer.lr = o->lr;
    desc.optimizer.weight_decay = o->weight_decay;
    desc.optimizer.weight_decay_set = 1;
    if (fsdp_init(&ctx, m.model, &desc) != FSDP_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", rank, fsdp_last_error(NULL));
        goto done;
    }
    m.ctx = ctx;
    if (o->resume) {
        fsdp_load_options lo;
        fsdp_load_report report;
        memset(&lo, 0, sizeof lo);
        lo.strict = 1, lo.with_optimizer = 1;
        if (fsdp_load_sharded(ctx, o->resume, &lo, &report)) {
            fprintf(stderr, "rank %d: --resume %s: %s\n(the checkpoint must come from the same --layers, --heads, "
                    "--channels and --seq-len; --nproc and --strategy may differ)\n", rank, o->resume, fsdp_last_error(ctx));
            goto done;
        }
        first_step = report.step > 0 ? report.step : 0;
    }
    if (rank == 0) {
        printf("gpt: %d rank%s (%s), %s", P, P > 1 ? "s" : "", fsdp_backend_name(fsdp_comm_backend(comm)),
               strategy_names[o->strategy]);
        if (o->strategy == FSDP_HYBRID_SHARD)
            printf(" (shard groups of %d ranks, %d replica%s)", desc.shard_group_size, P / desc.shard_group_size,
                   P / desc.shard_group_size > 1 ? "s" : "");
        printf(", %s parameters\n", fsdp_dtype_name(o->param_dtype));
        printf("model: %d layer%s, %d head%s, %d channels, context %d bytes, vocabulary 256 (bytes), LM head tied to "
               "wte: %zu parameters (%.1f MiB in f32)\n", o->layers, o->layers > 1 ? "s" : "", o->heads,
               o->heads > 1 ? "s" : "", o->channels, T, m.num_params,
               mib(4.0 * (double)m.num_params));
        printf("data: %s, %zu bytes (%zu for training, %zu held out); global batch %d x %d bytes (%d sequences per rank)\n",
               o->data_name, o->size, o->train_size, o->size - o->train_size, o->batch, T, B);
        printf("optimizer: AdamW, lr %g (warmup %d steps, cosine to %g at step %d), weight decay %g, clip %g\n",
               (double)o->lr, o->warmup, (double)o->min_lr, o->steps, (double)o->weight_decay, (double)o->clip);
        if (o->resume) printf("resumed from %s at step %lld%s\n", o->resume, first_step,
                              first_step >= o->steps ? ": nothing left to train (raise --steps)" : "");
        if (o->print_units) fsdp_print_units(ctx, NULL, NULL);
    }

    for (step = first_step; step < o->steps; step++) {
        fsdp_step_report report;
        float lr = lr_schedule(step, o->steps, o->warmup, o->lr, o->min_lr);
        double t0, t_step, t1;
        data_batch(o->text, o->train_size, step, o->batch, T, rank * B, (rank + 1) * B, acts.inputs, acts.targets);
        fsdp_set_lr(ctx, lr);
        t0 = fsdp_now(), m.hook_seconds = 0;
        if (gpt_forward(&m, &acts, B, T, 1, &loss) || gpt_backward(&m, &acts, B, T)) goto done;
        t_step = fsdp_now();
        if (fsdp_step(ctx, o->clip, &report) || fsdp_zero_grad(ctx)) {
            fprintf(stderr, "rank %d: step %lld: %s\n", rank, step + 1, fsdp_last_error(ctx));
            goto done;
        }
        t1 = fsdp_now();
        step_ms[timed] = 1e3 * (t1 - t0);
        fsdp_ms[timed] = 1e3 * (m.hook_seconds + t1 - t_step); // hooks, fsdp_step (with the update), zero_grad
        interval_ms += step_ms[timed], interval_fsdp_ms += fsdp_ms[timed], interval_steps++, timed++;
        // the global mean loss; safe here: fsdp_step returned, so the runtime's comm thread is idle
        if (fsdp_all_reduce(comm, &loss, &loss, 1, FSDP_F32, FSDP_AVG)) {
            fprintf(stderr, "rank %d: all_reduce of the loss: %s\n", rank, fsdp_comm_last_error(comm));
            goto done;
        }
        if (rank == 0 && ((step + 1) % o->print_every == 0 || step == first_step || step == o->steps - 1)) {
            double ms = interval_ms / interval_steps;
            printf("step %5lld/%d  loss %.4f  lr %.2e  norm %6.3f%s  %6.1f ms/step  %6.0f tok/s  in fsdp %5.1f ms\n",
                   step + 1, o->steps, (double)loss, (double)lr, report.grad_norm,
                   report.skipped ? " (skipped: not finite)" : "", ms, o->batch * T / (ms * 1e-3),
                   interval_fsdp_ms / interval_steps);
            interval_ms = interval_fsdp_ms = 0, interval_steps = 0;
        }
        if (strcmp(o->ckpt, "none") != 0 && (step == o->steps - 1 || (o->save_every && (step + 1) % o->save_every == 0)) &&
            save_checkpoint(ctx, o, rank, step + 1))
            goto done;
    }

    { // every rank's memory and time, printed by rank 0, and what fsdp_memory_estimate predicted
        fsdp_memory_stats st, est;
        memset(&st, 0, sizeof st); // fsdp_memory_stats_get fills it; -O3 cannot see that it always does
        const char *rss_source = "";
        double mine[7], *all = (double *)calloc((size_t)P * 7, sizeof(double));
        int skip = timed > 1; // the first step warms up
        fsdp_memory_stats_get(ctx, &st);
        if (fsdp_memory_estimate(m.model, &desc, P, &est)) memset(&est, 0, sizeof est); // fsdp_init took this desc
        mine[0] = (double)st.persistent_bytes, mine[1] = (double)st.peak_unsharded_bytes;
        mine[2] = (double)st.peak_bytes, mine[3] = example_peak_rss(&rss_source);
        mine[4] = median(step_ms + skip, timed - skip), mine[5] = median(fsdp_ms + skip, timed - skip);
        mine[6] = sizeof(float) * (double)acts.num_floats;
        if (!all || fsdp_all_gather(comm, mine, all, sizeof mine / 4, FSDP_F32)) { // doubles, moved as bytes
            fprintf(stderr, "rank %d: gathering the statistics failed: %s\n", rank, fsdp_comm_last_error(comm));
            free(all);
            goto done;
        }
        if (rank == 0) {
            printf("\nrank  persistent  peak unsharded  fsdp peak  activations   max RSS   ms/step  in fsdp calls (ms/step)\n");
            for (int r = 0; r < P; r++) {
                double *s = all + 7 * r;
                printf("%4d  %6.2f MiB  %10.2f MiB  %5.2f MiB  %7.2f MiB  %5.1f MiB  %7.1f  %6.1f\n", r, mib(s[0]),
                       mib(s[1]), mib(s[2]), mib(s[6]), mib(s[3]), s[4], s[5]);
            }
            printf(" est  %6.2f MiB  %10.2f MiB  %5.2f MiB  (fsdp_memory_estimate for this model, desc and %d rank%s)\n",
                   mib((double)est.persistent_bytes), mib((double)est.peak_unsharded_bytes), mib((double)est.peak_bytes),
                   P, P > 1 ? "s" : "");
            print_vs_estimate(all, P, 7, (double)est.persistent_bytes, (double)est.peak_unsharded_bytes);
            printf("max RSS: each rank's own peak resident memory (%s%s)\n", rss_source,
                   strcmp(rss_source, "VmHWM") == 0 ? " from /proc/self/status" : ": no /proc here; it may include a launcher's");
            if (timed)
                printf("final loss %.4f; %.0f tokens/s (median step %.1f ms on rank 0)\n", (double)loss,
                       o->batch * T / (all[4] * 1e-3), all[4]);
        }
        free(all);
    }
    if (o->sample > 0 || o->size - o->train_size >= (size_t)T + 2) { // rank 0 scores and samples on a plain copy
        if (gpt_plain_gather(&m)) {
            fprintf(stderr, "rank %d: gathering the weights for the sample failed: %s\n", rank, fsdp_last_error(ctx));
            goto done;
        }
        if (rank == 0) {
            double val;
            m.ctx = NULL; // the plain copy from here on
            if ((val = validation_loss(&m, &acts, o)) >= 0)
                printf("held-out loss %.4f (%d x %d x %d bytes not trained on)\n", val, VAL_BATCHES, B, T);
            if (o->sample > 0) sample(&m, &acts, o, o->sample);
        }
    }
    rc = 0;
done:
    fsdp_destroy(ctx);
    gpt_acts_free(&acts);
    gpt_free(&m);
    free(step_ms);
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

static void usage(FILE *out) {
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
        "  --weight-decay X     AdamW's decoupled weight decay, applied to every parameter (default 0.01)\n"
        "  --clip X             clip the global gradient norm to X; 0: off (default 1)\n"
        "fsdp\n"
        "  --strategy S         full (FULL_SHARD, default), grad_op (SHARD_GRAD_OP), no_shard (NO_SHARD),\n"
        "                       hybrid (HYBRID_SHARD: sharded within each host, replicated across hosts;\n"
        "                       all ranks on one host and an even count: two replicas of half the ranks)\n"
        "  --param-dtype D      f32 (default), bf16 or f16: what is gathered and reduced; master weights\n"
        "                       and AdamW state stay f32, the kernels read an f32 view\n"
        "  --print-units        print the FSDP units (rank 0)\n"
        "checkpoints (sharded: one safetensors file per rank + index.json, with AdamW state)\n"
        "  --ckpt DIR           where to save (default: gpt_ckpt next to the executable, e.g. build/gpt_ckpt);\n"
        "                       'none': never save. Saved after the last step\n"
        "  --save-every N       also every N steps (default 0: only after the last step)\n"
        "  --resume DIR         load DIR (strict, with AdamW state) and continue from its step up to --steps;\n"
        "                       any --nproc and --strategy; the model flags must match\n"
        "output\n"
        "  --print-every N      rank 0 prints every N steps: the step's loss (mean over all ranks), the\n"
        "                       learning rate, the gradient norm, and averaged since the last line: ms/step,\n"
        "                       tokens/s and the time spent in fsdp calls (hooks, fsdp_step, zero_grad:\n"
        "                       communication not hidden behind compute, plus the update) (default 25)\n"
        "  --sample N           bytes to generate at the end (rank 0, on gathered weights) (default 300)\n"
        "  --prompt TEXT        what the sample continues (default a newline)\n"
        "  --temperature X      sampling temperature; 0: greedy (default 0.8)\n"
        "  --help               this text\n");
}

static void parse(options *o, int argc, char **argv, const char *exe_dir) {
    static const char *const backends[] = {"shm", "socket", NULL}, *const strategies[] = {"full", "grad_op", "no_shard", "hybrid", NULL};
    static const char *const dtypes[] = {"f32", "bf16", "f16", NULL};
    memset(o, 0, sizeof *o);
    o->backend = FSDP_BACKEND_SHM, o->layers = 4, o->heads = 4, o->channels = 128, o->seq_len = 64;
    o->batch = 16, o->steps = 500, o->warmup = 30, o->print_every = 25, o->sample = 300;
    o->lr = 3e-3f, o->weight_decay = 0.01f, o->clip = 1.0f, o->temperature = 0.8f, o->prompt = "\n";
    o->strategy = FSDP_FULL_SHARD, o->param_dtype = FSDP_F32;
    snprintf(o->ckpt_default, sizeof o->ckpt_default, "%s/gpt_ckpt", exe_dir);
    o->ckpt = o->ckpt_default;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        if (!strcmp(f, "--print-units")) { o->print_units = 1; continue; }
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
        else if (!strcmp(f, "--strategy")) o->strategy = (fsdp_strategy)arg_choice(f, v, strategies, FSDP_FULL_SHARD);
        else if (!strcmp(f, "--param-dtype")) o->param_dtype = (fsdp_dtype)arg_choice(f, v, dtypes, FSDP_F32);
        else if (!strcmp(f, "--ckpt")) o->ckpt = v;
        else if (!strcmp(f, "--save-every")) o->save_every = (int)arg_int(f, v, 0, 100000000);
        else if (!strcmp(f, "--resume")) o->resume = v;
        else if (!strcmp(f, "--print-every")) o->print_every = (int)arg_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--sample")) o->sample = (int)arg_int(f, v, 0, 1 << 20);
        else if (!strcmp(f, "--prompt")) o->prompt = v;
        else if (!strcmp(f, "--temperature")) o->temperature = arg_float(f, v);
        else die_usage("unknown option '%s'", f);
    }
    if (!(o->lr > 0)) die_usage("--lr must be > 0");
    if (!o->min_lr_set) o->min_lr = o->lr / 10;
    if (o->min_lr > o->lr) die_usage("--min-lr %g is above --lr %g", (double)o->min_lr, (double)o->lr);
    if (o->channels % o->heads) die_usage("--channels %d is not divisible by --heads %d", o->channels, o->heads);
    if (!*o->ckpt) die_usage("--ckpt needs a directory (or 'none')");
}

static int check_batch(const void *arg, int P) {
    const options *o = (const options *)arg;
    if (o->batch % P == 0) return 0;
    fprintf(stderr, "gpt: --batch %d is not divisible by the %d ranks: each rank takes an equal part of the global "
            "batch; use a multiple of %d (e.g. --batch %d)\n", o->batch, P, P, (o->batch / P + 1) * P);
    return 1;
}

int main(int argc, char **argv) {
    example_program = "gpt";
    static options o; // large path buffers: not on the stack
    char exe_dir[1024];
    int rc;
    executable_dir(exe_dir, sizeof exe_dir, argv[0]);
    parse(&o, argc, argv, exe_dir);
    setvbuf(stdout, NULL, _IOLBF, 0); // ranks share stdout: whole lines
    openblas_set_num_threads(1);      // before forking: no idle BLAS threads in the parent
    if (load_data(&o, exe_dir)) return 1;
    rc = example_run(o.nproc, o.backend, check_batch, train, &o);
    free(o.text);
    return rc ? 1 : 0;
}
