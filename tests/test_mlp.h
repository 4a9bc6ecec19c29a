/* test_mlp.h - the model test_runtime.c and test_training_features.c train, written once (every
   parameter size is prime to 6, so none divides by P = 2, 3 or 4, and neither does any unit's
   flat size: 5, 43, 91, 61):
       x0 = x * scale                      scale (5)           owned by the root unit
       h1 = tanh(layers.0(x0))             Linear 5 -> 7       weight 7x5, bias 7
       h2 = tanh(layers.1(h1))             Linear 7 -> 11      weight 11x7, bias 11
       y  = layers.2(h2)                   Linear 11 -> 5      weight 5x11, bias 5
       loss = mean over rows of 0.5 * |y - target|^2
   wrapped with FSDP_WRAP_TYPES {"Linear"}: four units, the root holding only `scale`.

   Its parameters, concatenated in this order (NELEM floats), are how the tests store, compare and
   name values. Included after test_common.h. */
#ifndef TEST_MLP_H
#define TEST_MLP_H

#include "test_common.h"

#define IN 5
#define H1 7
#define H2 11
#define OUT 5

enum { P_SCALE, P_W0, P_B0, P_W1, P_B1, P_W2, P_B2, NPARAMS };
static TEST_UNUSED const char *const param_names[NPARAMS] = {
    "scale", "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "layers.2.weight", "layers.2.bias"};
static TEST_UNUSED const int param_numel[NPARAMS] = {IN, H1 * IN, H1, H2 * H1, H2, OUT * H2, OUT};
#define NELEM (IN + H1 * IN + H1 + H2 * H1 + H2 + OUT * H2 + OUT) /* 195: all parameters, concatenated */
static TEST_UNUSED const int param_offset[NPARAMS] = {                /* in that concatenation */
    0, IN, IN + H1 * IN, IN + H1 * IN + H1, IN + H1 * IN + H1 + H2 * H1, IN + H1 * IN + H1 + H2 * H1 + H2,
    IN + H1 * IN + H1 + H2 * H1 + H2 + OUT * H2};

typedef struct mlp {
    fsdp_model *model;
    int param[NPARAMS];
    int layers;   /* module id of the ModuleList "layers" */
    int layer[3]; /* module ids of layers.0 .. layers.2 */
} mlp;

/* Builds the model: FSDP_SUCCESS, or the code of the call that failed. */
static TEST_UNUSED int mlp_build(mlp *m) {
    fsdp_init_rule scale_init = {FSDP_INIT_UNIFORM, 0.5f, 1.5f, NULL, NULL};
    fsdp_init_rule weight_init = {FSDP_INIT_NORMAL, 0.0f, 0.5f, NULL, NULL};
    fsdp_init_rule bias_init = {FSDP_INIT_UNIFORM, -0.1f, 0.1f, NULL, NULL};
    int64_t shape_scale[1] = {IN}, shape_w[3][2] = {{H1, IN}, {H2, H1}, {OUT, H2}}, shape_b[3][1] = {{H1}, {H2}, {OUT}};
    static const char *const layer_names[3] = {"0", "1", "2"};
    int l, rc;
    memset(m, 0, sizeof *m);
    if ((rc = fsdp_model_create(&m->model, "MLP")) != FSDP_SUCCESS) return rc;
    if ((m->param[P_SCALE] = fsdp_model_param(m->model, 0, "scale", 1, shape_scale, scale_init)) < 0) return m->param[P_SCALE];
    if ((m->layers = fsdp_model_module(m->model, 0, "layers", "ModuleList")) < 0) return m->layers;
    for (l = 0; l < 3; l++) {
        if ((m->layer[l] = fsdp_model_module(m->model, m->layers, layer_names[l], "Linear")) < 0) return m->layer[l];
        if ((m->param[P_W0 + 2 * l] = fsdp_model_param(m->model, m->layer[l], "weight", 2, shape_w[l], weight_init)) < 0)
            return m->param[P_W0 + 2 * l];
        if ((m->param[P_B0 + 2 * l] = fsdp_model_param(m->model, m->layer[l], "bias", 1, shape_b[l], bias_init)) < 0)
            return m->param[P_B0 + 2 * l];
    }
    return FSDP_SUCCESS;
}

/* Rows lo..hi-1 of step `step`'s batch: a pure function, so every rank builds its own rows. */
static TEST_UNUSED void load_batch(int step, int lo, int hi, float *x, float *target) {
    int i, k;
    for (i = lo; i < hi; i++) {
        for (k = 0; k < IN; k++) x[(i - lo) * IN + k] = sinf(1.3f * (float)i + 0.9f * (float)k + 0.37f * (float)step);
        for (k = 0; k < OUT; k++)
            target[(i - lo) * OUT + k] = 0.5f * cosf(0.7f * (float)i + 1.1f * (float)k - 0.23f * (float)step);
    }
}

/* Every parameter, gathered in full, into out (NELEM floats). */
static TEST_UNUSED int gather_all(fsdp_ctx *ctx, const mlp *m, float *out) {
    int p, rc;
    for (p = 0; p < NPARAMS; p++)
        if ((rc = fsdp_gather_param(ctx, m->param[p], out + param_offset[p])) != 0) return rc;
    return 0;
}

/* The name of the parameter element e of the concatenation belongs to; its index there. */
static TEST_UNUSED const char *param_of_element(int e, int *index) {
    int p;
    for (p = NPARAMS - 1; p > 0 && e < param_offset[p]; p--) {}
    *index = e - param_offset[p];
    return param_names[p];
}

#endif /* TEST_MLP_H */
