/* mlp_model.h - the model shared by examples/mlp.c and examples/bench_train.c.

   A multi-layer perceptron, Linear -> ReLU -> ... -> Linear -> softmax cross-entropy, written
   llm.c style: one function per layer and direction, outputs first, gradients named d* and
   accumulated with +=, shapes in comments. Names and layouts are PyTorch's:

       MLP                      root
       layers      ModuleList
       layers.<i>  Linear       layers.<i>.weight (out, in), layers.<i>.bias (out)

   The same forward and backward run on FSDP-managed weights (mlp.ctx set: the hooks gather and
   reshard around each Linear) or on plain arrays (mlp.ctx NULL: the no-FSDP baseline).
   Data: a CSV file (features, then an integer class label) or synthetic Gaussian blobs.

   Include after fsdp.h (with FSDP_IMPLEMENTATION) and <cblas.h>. Everything here is static. */
#ifndef MLP_MODEL_H
#define MLP_MODEL_H

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_common.h"
#include "example_gemm.h" /* example_sgemm: an AVX-512 kernel or OpenBLAS (see there which) */

#if defined(__GNUC__) || defined(__clang__)
#  define MLP_UNUSED __attribute__((unused)) /* for what only one of the two programs calls */
#else
#  define MLP_UNUSED
#endif

#define MLP_MAX_LAYERS 64
#define MLP_MAX_CLASSES 65536

/* ----------------------------------------------------------------------------------------- */
/* data */

typedef struct {
    int rows, features, classes;
    float *x; // (rows, features)
    int *y;   // (rows) class index in [0, classes)
} dataset;

static uint64_t rng_next(uint64_t *state) { // splitmix64
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *state) { return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0); }
static float rng_normal(uint64_t *state) { // Box-Muller
    double u = rng_uniform(state), v = rng_uniform(state);
    return (float)(sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v));
}

static void data_free(dataset *d) {
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof *d);
}

/* rows points around one centre per class: centre ~ N(0, (3/sqrt(features))^2) per feature,
   point = centre + N(0, 1). Centres sit about 4 standard deviations apart whatever the number of
   features, so the classes overlap a little. Fixed seed: every run sees the same data. */
static int data_blobs(dataset *d, int rows, int features, int classes, uint64_t seed) {
    uint64_t state = seed;
    float *centres = (float *)malloc(sizeof(float) * (size_t)classes * (size_t)features);
    float spread = 3.0f / sqrtf((float)features);
    d->rows = rows, d->features = features, d->classes = classes;
    d->x = (float *)malloc(sizeof(float) * (size_t)rows * (size_t)features);
    d->y = (int *)malloc(sizeof(int) * (size_t)rows);
    if (!centres || !d->x || !d->y) { free(centres); data_free(d); return -1; }
    for (size_t i = 0; i < (size_t)classes * (size_t)features; i++) centres[i] = spread * rng_normal(&state);
    for (int r = 0; r < rows; r++) {
        int c = (int)(rng_next(&state) % (uint64_t)classes);
        d->y[r] = c;
        for (int f = 0; f < features; f++)
            d->x[(size_t)r * features + f] = centres[(size_t)c * features + f] + rng_normal(&state);
    }
    free(centres);
    return 0;
}

/* One CSV field, whitespace trimmed: 1 if it is a finite number (in *value), 0 if not. */
static int csv_number(const char *begin, const char *end, double *value) {
    char buf[128], *stop;
    while (begin < end && isspace((unsigned char)*begin)) begin++;
    while (end > begin && isspace((unsigned char)end[-1])) end--;
    if (begin == end || end - begin >= (long)sizeof buf) return 0;
    memcpy(buf, begin, (size_t)(end - begin));
    buf[end - begin] = 0;
    errno = 0;
    *value = strtod(buf, &stop);
    return *stop == 0 && errno == 0 && isfinite(*value);
}

/* Splits a line at commas: fields[k] .. fields[k+1]-1 is field k. Returns the number of fields. */
static int csv_split(char *line, char **fields, int max_fields) {
    int n = 0;
    fields[n++] = line;
    for (char *p = line; *p; p++)
        if (*p == ',') {
            if (n < max_fields) fields[n] = p + 1;
            n++;
        }
    return n;
}

/* Reads numeric features with an integer class label in the last column, as they are (no
   scaling). A first line with a non-numeric field is a header. Blank lines are skipped.
   Returns 0, or -1 with a message naming the file, line and column in err. */
static int data_csv(dataset *d, const char *path, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    char *line = NULL;
    size_t line_cap = 0, rows_cap = 0;
    char **fields = NULL;
    int lineno = 0, first_line = 0, cols = 0, max_label = -1, rc = -1;
    ssize_t len;
    memset(d, 0, sizeof *d);
    if (!f) { snprintf(err, err_size, "cannot open '%s': %s", path, strerror(errno)); return -1; }
    while ((len = getline(&line, &line_cap, f)) >= 0) {
        int n, k;
        lineno++;
        while (len > 0 && isspace((unsigned char)line[len - 1])) line[--len] = 0;
        if (len == 0) continue;
        if (cols == 0) { // the first line fixes the number of columns and may be a header
            double v;
            char *probe = line;
            cols = 1;
            for (char *p = line; *p; p++) cols += *p == ',';
            if (cols < 2) {
                snprintf(err, err_size, "%s:%d: one column; need numeric features, then the class label in the last "
                         "column, separated by commas", path, lineno);
                goto done;
            }
            fields = (char **)malloc(sizeof(char *) * (size_t)(cols + 1));
            if (!fields) { snprintf(err, err_size, "%s: out of memory", path); goto done; }
            first_line = lineno;
            n = csv_split(probe, fields, cols + 1);
            fields[n] = line + len + 1;
            for (k = 0; k < n && csv_number(fields[k], fields[k + 1] - 1, &v); k++) {}
            if (k < n) continue; // a header: skip it
        }
        n = csv_split(line, fields, cols + 1);
        if (n != cols) {
            snprintf(err, err_size, "%s:%d: %d columns, but line %d has %d (every line needs the same features, "
                     "then the label)", path, lineno, n, first_line, cols);
            goto done;
        }
        fields[n] = line + len + 1;
        if ((size_t)d->rows == rows_cap) {
            rows_cap = rows_cap ? 2 * rows_cap : 1024;
            float *x = (float *)realloc(d->x, sizeof(float) * rows_cap * (size_t)(cols - 1));
            int *y = (int *)realloc(d->y, sizeof(int) * rows_cap);
            if (x) d->x = x;
            if (y) d->y = y;
            if (!x || !y) { snprintf(err, err_size, "%s:%d: out of memory", path, lineno); goto done; }
        }
        for (k = 0; k < n; k++) {
            double v;
            if (!csv_number(fields[k], fields[k + 1] - 1, &v)) {
                int w = (int)(fields[k + 1] - 1 - fields[k]), blank = (int)strspn(fields[k], " \t") >= w;
                if (blank) snprintf(err, err_size, "%s:%d: column %d is empty", path, lineno, k + 1);
                else snprintf(err, err_size, "%s:%d: column %d: '%.*s' is not a number", path, lineno, k + 1,
                              w > 40 ? 40 : w, fields[k]);
                goto done;
            }
            if (k < n - 1) { d->x[(size_t)d->rows * (cols - 1) + k] = (float)v; continue; }
            if (v < 0 || v != floor(v) || v >= MLP_MAX_CLASSES) {
                snprintf(err, err_size, "%s:%d: column %d (the label): %g is not a class index (an integer in "
                         "[0, %d))", path, lineno, k + 1, v, MLP_MAX_CLASSES);
                goto done;
            }
            d->y[d->rows] = (int)v;
            if ((int)v > max_label) max_label = (int)v;
        }
        d->rows++;
    }
    if (ferror(f)) { snprintf(err, err_size, "%s: read error: %s", path, strerror(errno)); goto done; }
    if (d->rows == 0) { snprintf(err, err_size, "%s: no data rows", path); goto done; }
    d->features = cols - 1;
    d->classes = max_label + 1;
    rc = 0;
done:
    if (rc) data_free(d);
    free(fields);
    free(line);
    fclose(f);
    return rc;
}

/* Global batch number `step` is rows step*B .. step*B + B - 1 of the file, wrapping around; this
   rank takes rows [lo, hi) of it. x (hi - lo, features), y (hi - lo). */
static void data_batch(const dataset *d, long long step, int B, int lo, int hi, float *x, int *y) {
    for (int b = lo; b < hi; b++) {
        size_t row = (size_t)((step * B + b) % d->rows);
        memcpy(x + (size_t)(b - lo) * d->features, d->x + row * d->features, sizeof(float) * (size_t)d->features);
        y[b - lo] = d->y[row];
    }
}

/* ----------------------------------------------------------------------------------------- */
/* layers */

// out (B,OC) = inp (B,C) @ weight^T + bias; weight is (OC,C), bias (OC), as nn.Linear
static void linear_forward(float *out, const float *inp, const float *weight, const float *bias, int B, int C, int OC) {
    example_sgemm_bias(0, 1, B, OC, C, inp, C, weight, C, bias, out, OC);
}

// dinp (B,C) += dout (B,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp; dbias (OC) += sum over B of dout
// dinp may be NULL (the first layer's input needs no gradient)
static void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int B, int C, int OC) {
    if (dinp) example_sgemm(0, 0, B, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    example_sgemm(1, 0, OC, C, B, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)b * OC + o];
}

// out (N) = max(inp, 0)
static void relu_forward(float *out, const float *inp, size_t N) {
    for (size_t i = 0; i < N; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

// dinp (N) += dout where inp > 0
static void relu_backward(float *dinp, const float *inp, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

// probs (B,C) = softmax(logits (B,C)); returns the mean over the B rows of -log probs[b, targets[b]]
static float softmax_crossentropy_forward(float *probs, const float *logits, const int *targets, int B, int C) {
    double loss = 0;
    for (int b = 0; b < B; b++) {
        const float *z = logits + (size_t)b * C;
        float *p = probs + (size_t)b * C, maxz = z[0];
        double sum = 0;
        for (int c = 1; c < C; c++) maxz = z[c] > maxz ? z[c] : maxz;
        for (int c = 0; c < C; c++) sum += p[c] = expf(z[c] - maxz);
        for (int c = 0; c < C; c++) p[c] = (float)(p[c] / sum);
        loss += log(sum) - (double)(z[targets[b]] - maxz);
    }
    return (float)(loss / B);
}

// dlogits (B,C) += (probs - onehot(targets)) / B, the gradient of the mean loss
static void softmax_crossentropy_backward(float *dlogits, const float *probs, const int *targets, int B, int C) {
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            dlogits[(size_t)b * C + c] += (probs[(size_t)b * C + c] - (c == targets[b] ? 1.0f : 0.0f)) / (float)B;
}

/* ----------------------------------------------------------------------------------------- */
/* model */

typedef struct {
    int num_layers;
    int dims[MLP_MAX_LAYERS + 1];    // Linear i maps dims[i] -> dims[i+1]; dims[0] features, dims[L] classes
    fsdp_model *model;               // names, shapes and init rules, for fsdp_init
    int module[MLP_MAX_LAYERS];      // module id of layers.<i>
    int weight[MLP_MAX_LAYERS], bias[MLP_MAX_LAYERS]; // parameter ids
    fsdp_ctx *ctx;                   // FSDP runtime; NULL: the plain arrays below
    float *plain, *dplain;           // plain: every parameter and its gradient, in registration order
    size_t plain_offset[2 * MLP_MAX_LAYERS], num_params;
    int rank;                        // for messages
    double hook_seconds;             // time spent inside the fsdp hooks (waiting for gathers)
} mlp;

/* Describes the model to fsdp.h. Init as PyTorch's nn.Linear: weight and bias uniform in
   +-1/sqrt(in) (kaiming_uniform with a = sqrt(5) gives that bound), computed per element from
   (seed, name, index), so every world size starts from bitwise the same model. */
static int mlp_build(mlp *m, int features, int hidden, int layers, int classes) {
    int list, i;
    memset(m, 0, sizeof *m);
    m->num_layers = layers;
    for (i = 0; i <= layers; i++) m->dims[i] = i == 0 ? features : i == layers ? classes : hidden;
    if (fsdp_model_create(&m->model, "MLP") || (list = fsdp_model_module(m->model, 0, "layers", "ModuleList")) < 0)
        return -1;
    for (i = 0; i < layers; i++) {
        char name[16];
        float bound = 1.0f / sqrtf((float)m->dims[i]);
        fsdp_init_rule rule = {FSDP_INIT_UNIFORM, -bound, bound, NULL, NULL};
        int64_t wshape[2] = {m->dims[i + 1], m->dims[i]}, bshape[1] = {m->dims[i + 1]};
        snprintf(name, sizeof name, "%d", i);
        if ((m->module[i] = fsdp_model_module(m->model, list, name, "Linear")) < 0 ||
            (m->weight[i] = fsdp_model_param(m->model, m->module[i], "weight", 2, wshape, rule)) < 0 ||
            (m->bias[i] = fsdp_model_param(m->model, m->module[i], "bias", 1, bshape, rule)) < 0)
            return -1;
    }
    for (i = 0; i < fsdp_model_num_params(m->model); i++) m->num_params += (size_t)fsdp_model_param_numel(m->model, i);
    return 0;
}

/* The no-FSDP baseline: parameters in one plain buffer, initialised exactly as fsdp_init would. */
MLP_UNUSED static int mlp_plain_init(mlp *m, uint64_t seed) {
    size_t at = 0;
    m->plain = example_floats(m->num_params, 0);
    m->dplain = example_floats(m->num_params, 1);
    if (!m->plain || !m->dplain) return -1;
    for (int p = 0; p < fsdp_model_num_params(m->model); p++) {
        int64_t n = fsdp_model_param_numel(m->model, p);
        m->plain_offset[p] = at;
        for (int64_t i = 0; i < n; i++) m->plain[at + (size_t)i] = fsdp_init_value(m->model, p, i, seed);
        at += (size_t)n;
    }
    return 0;
}

static void mlp_free(mlp *m) {
    fsdp_model_destroy(m->model);
    free(m->plain);
    free(m->dplain);
}

/* Activations of one local batch of B rows. */
typedef struct {
    int B;
    float *x[MLP_MAX_LAYERS];  // x[i] (B, dims[i]): input of Linear i; x[0] is the batch
    float *z[MLP_MAX_LAYERS];  // z[i] (B, dims[i+1]): output of Linear i; z[L-1] are the logits
    float *dx[MLP_MAX_LAYERS], *dz[MLP_MAX_LAYERS]; // their gradients (dx[0] unused)
    float *probs;              // (B, classes)
    int *targets;              // (B)
    float *memory;
    size_t grad_floats;        // dx and dz, zeroed before each backward
} mlp_acts;

static int mlp_acts_alloc(mlp_acts *a, const mlp *m, int B) {
    int L = m->num_layers, C = m->dims[L];
    size_t at = 0;
    memset(a, 0, sizeof *a);
    a->B = B;
    for (int i = 0; i < L; i++) a->grad_floats += (size_t)B * (m->dims[i] + m->dims[i + 1]);
    a->memory = (float *)calloc(2 * a->grad_floats + (size_t)B * C, sizeof(float));
    a->targets = (int *)calloc((size_t)B, sizeof(int));
    if (!a->memory || !a->targets) return -1;
    for (int i = 0; i < L; i++) { // x and z, then probs, then dx and dz together so one memset clears them
        a->x[i] = a->memory + at, at += (size_t)B * m->dims[i];
        a->z[i] = a->memory + at, at += (size_t)B * m->dims[i + 1];
    }
    a->probs = a->memory + at, at += (size_t)B * C;
    for (int i = 0; i < L; i++) {
        a->dx[i] = a->memory + at, at += (size_t)B * m->dims[i];
        a->dz[i] = a->memory + at, at += (size_t)B * m->dims[i + 1];
    }
    return 0;
}

static void mlp_acts_free(mlp_acts *a) {
    free(a->memory);
    free(a->targets);
}

/* Calls an fsdp hook (nothing without a runtime), timing it and naming the module on failure. */
#define MLP_HOOK(m, hook, module) \
    ((m)->ctx ? example_hook((m)->ctx, (m)->model, (m)->rank, &(m)->hook_seconds, hook, #hook, (module), "MLP") : 0)

/* Layer i's weights (and gradients if grads: only during its backward, where fsdp_grad has them):
   gathered by FSDP or the plain arrays. */
typedef struct { float *w, *b, *dw, *db; } linear_params;
static linear_params mlp_layer(mlp *m, int i, int grads) {
    linear_params p;
    if (m->ctx) {
        p.w = fsdp_param(m->ctx, m->weight[i]), p.b = fsdp_param(m->ctx, m->bias[i]);
        p.dw = grads ? fsdp_grad(m->ctx, m->weight[i]) : NULL, p.db = grads ? fsdp_grad(m->ctx, m->bias[i]) : NULL;
    } else {
        p.w = m->plain + m->plain_offset[m->weight[i]], p.b = m->plain + m->plain_offset[m->bias[i]];
        p.dw = m->dplain + m->plain_offset[m->weight[i]], p.db = m->dplain + m->plain_offset[m->bias[i]];
    }
    return p;
}

/* Forward over a.x[0] (B, features) and a.targets; *loss gets the mean loss of these rows. */
static int mlp_forward(mlp *m, mlp_acts *a, float *loss) {
    int L = m->num_layers, B = a->B;
    if (MLP_HOOK(m, fsdp_pre_forward, 0)) return -1;
    for (int i = 0; i < L; i++) {
        if (MLP_HOOK(m, fsdp_pre_forward, m->module[i])) return -1;
        linear_params p = mlp_layer(m, i, 0);
        if (!p.w || !p.b) { fprintf(stderr, "rank %d: layers.%d: weights not gathered\n", m->rank, i); return -1; }
        linear_forward(a->z[i], a->x[i], p.w, p.b, B, m->dims[i], m->dims[i + 1]);
        if (MLP_HOOK(m, fsdp_post_forward, m->module[i])) return -1;
        if (i + 1 < L) relu_forward(a->x[i + 1], a->z[i], (size_t)B * m->dims[i + 1]);
    }
    *loss = softmax_crossentropy_forward(a->probs, a->z[L - 1], a->targets, B, m->dims[L]);
    return MLP_HOOK(m, fsdp_post_forward, 0);
}

/* Backward of the mean loss: accumulates into the gradients (fsdp_grad, or m.dplain). */
static int mlp_backward(mlp *m, mlp_acts *a) {
    int L = m->num_layers, B = a->B;
    memset(a->dx[0], 0, sizeof(float) * a->grad_floats);
    if (MLP_HOOK(m, fsdp_pre_backward, 0)) return -1;
    softmax_crossentropy_backward(a->dz[L - 1], a->probs, a->targets, B, m->dims[L]);
    for (int i = L - 1; i >= 0; i--) {
        if (MLP_HOOK(m, fsdp_pre_backward, m->module[i])) return -1;
        linear_params p = mlp_layer(m, i, 1);
        if (!p.dw || !p.db) { fprintf(stderr, "rank %d: layers.%d: no gradient buffer\n", m->rank, i); return -1; }
        linear_backward(i > 0 ? a->dx[i] : NULL, p.dw, p.db, a->dz[i], a->x[i], p.w, B, m->dims[i], m->dims[i + 1]);
        if (MLP_HOOK(m, fsdp_post_backward, m->module[i])) return -1;
        if (i > 0) relu_backward(a->dz[i - 1], a->z[i - 1], a->dx[i], (size_t)B * m->dims[i]);
    }
    return MLP_HOOK(m, fsdp_post_backward, 0);
}

#endif /* MLP_MODEL_H */
