/* make_index_corpus.c - writes the index.json fuzz target's seed corpus into the directory given:
   index.json files of real sharded saves (fsdp_save_sharded at 1 and 2 ranks, with optimizer
   state and bf16) and hand-written ones, valid and invalid (one defect each). Run from the
   repository root:
       cc -std=c99 -I. tests/corpus/make_index_corpus.c -o /tmp/make_index_corpus -lpthread -lm
       /tmp/make_index_corpus tests/corpus/index */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "make_index_corpus: %s: %s\n", what, detail);
    exit(1);
}

static void write_text(const char *name, const char *text) {
    char path[512];
    FILE *f;
    size_t n = strlen(text);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!(f = fopen(path, "wb")) || fwrite(text, 1, n, f) != n || fclose(f) != 0) fail(path, "cannot write");
}

typedef struct save_plan {
    char dir[256];
    int optimizer;      /* FSDP_SGD (with momentum) or FSDP_ADAMW */
    fsdp_dtype dtype;
} save_plan;

/* A small model (a Linear unit and a root-owned scale, shards padded at P = 2) saved sharded. */
static int save_model(fsdp_comm *comm, void *arg) {
    static const char *const types[] = {"Linear", NULL};
    const save_plan *plan = (const save_plan *)arg;
    fsdp_init_rule rule = {FSDP_INIT_NORMAL, 0.0f, 1.0f, NULL, NULL};
    int64_t w_shape[2] = {3, 5}, b_shape[1] = {3}, s_shape[1] = {5};
    fsdp_kv meta[2] = {{"note", "seed corpus"}, {"unicode", "caf\xc3\xa9"}};
    fsdp_save_options so;
    fsdp_model *m;
    fsdp_ctx *ctx;
    fsdp_desc d;
    int layer, rc;
    fsdp_model_create(&m, "Tiny");
    fsdp_model_param(m, 0, "scale", 1, s_shape, rule);
    layer = fsdp_model_module(m, 0, "fc", "Linear");
    fsdp_model_param(m, layer, "weight", 2, w_shape, rule);
    fsdp_model_param(m, layer, "bias", 1, b_shape, rule);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = types;
    d.optimizer.kind = (fsdp_optimizer_kind)plan->optimizer;
    d.optimizer.momentum = 0.9f;
    memset(&so, 0, sizeof so);
    so.with_optimizer = 1;
    so.dtype = plan->dtype;
    so.epoch = 2;
    so.metadata = meta;
    so.num_metadata = 2;
    if ((rc = fsdp_init(&ctx, m, &d)) != 0) return 1;
    rc = fsdp_save_sharded(ctx, plan->dir, &so);
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    return rc != 0;
}

static void copy_real_index(const char *name, int ranks, int optimizer, fsdp_dtype dtype) {
    save_plan plan;
    char command[1024];
    snprintf(plan.dir, sizeof plan.dir, "/tmp/make-index-corpus-%d", (int)getpid());
    plan.optimizer = optimizer;
    plan.dtype = dtype;
    if (fsdp_launch(ranks, save_model, &plan) != 0) fail("fsdp_launch", "saving the model failed");
    snprintf(command, sizeof command, "cp %s/index.json %s/%s && rm -rf %s", plan.dir, dir, name, plan.dir);
    if (system(command) != 0) fail("copying index.json", command);
}

#define HEAD "{\"format\":\"fsdp.h-sharded\",\"version\":1,\"world_size\":2,\"step\":4,\"epoch\":1,"
#define FILES2 "\"files\":[\"shard-0.safetensors\",\"shard-1.safetensors\"],"
#define TENSOR(name, shape, pieces) "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"pieces\":" pieces "}"

int main(int argc, char **argv) {
    char deep[256];
    int i;
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    /* real saves */
    copy_real_index("valid-save-p1-sgd.json", 1, FSDP_SGD, FSDP_F32);
    copy_real_index("valid-save-p2-adamw-bf16.json", 2, FSDP_ADAMW, FSDP_BF16);
    /* valid, by hand */
    write_text("valid-minimal.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[],\"tensors\":{}}");
    write_text("valid-two-files.json", HEAD "\"metadata\":{\"k\":\"v\"}," FILES2 "\"tensors\":{"
               TENSOR("a.weight", "[2,3]", "[[1,3,6],[0,0,3]]") "," TENSOR("a.bias", "[2]", "[[0,0,2]]") "}}");
    write_text("valid-escapes.json", HEAD FILES2 "\"metadata\":{\"\\u00e9\\ud83d\\ude00\":\"\\n\\t\\\"\\\\\\/\"},"
               "\"tensors\":{" TENSOR("n\\u00e4me", "[1]", "[[1,0,1]]") "," TENSOR("esc\\u001b[2J", "[]", "[[0,0,1]]") "}}");
    write_text("valid-empty-tensor.json", HEAD FILES2 "\"tensors\":{" TENSOR("empty", "[0]", "[]") ","
               TENSOR("scalar", "[]", "[[0,0,1]]") "," "\"bf\":{\"dtype\":\"BF16\",\"shape\":[4],\"pieces\":[[1,0,4]],\"extra\":[1,{}]}}}");
    write_text("valid-unknown-keys.json", "  {\"future\":{\"a\":[1,2,{\"b\":null}]},\"format\":\"fsdp.h-sharded\",\"world_size\":1e3,"
               "\"step\":-1,\"files\":[\"f\"],\"tensors\":{" TENSOR("t", "[1,1,1,1,1,1,1,1]", "[[0,0,1]]") "},\"x\":true}\n");
    /* invalid, one defect each */
    write_text("bad-empty.json", "");
    write_text("bad-not-object.json", "[\"fsdp.h-sharded\"]");
    write_text("bad-format.json", "{\"format\":\"safetensors\",\"files\":[],\"tensors\":{}}");
    write_text("bad-no-files.json", "{\"format\":\"fsdp.h-sharded\",\"tensors\":{}}");
    write_text("bad-files-not-list.json", "{\"format\":\"fsdp.h-sharded\",\"files\":{},\"tensors\":{}}");
    write_text("bad-file-dotdot.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"..\"],\"tensors\":{}}");
    write_text("bad-file-slash.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"../../etc/passwd\"],\"tensors\":{}}");
    write_text("bad-file-empty.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"\"],\"tensors\":{}}");
    write_text("bad-file-number.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[0],\"tensors\":{}}");
    write_text("bad-files-twice.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"a\"],\"files\":[\"b\"],\"tensors\":{}}");
    write_text("bad-tensors-twice.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[],\"tensors\":{},\"tensors\":{}}");
    write_text("bad-duplicate-tensor.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,0,1]]") "," TENSOR("a", "[1]", "[[1,0,1]]") "}}");
    write_text("bad-piece-gap.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[4]", "[[0,0,1],[1,2,4]]") "}}");
    write_text("bad-piece-overlap.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[4]", "[[0,0,3],[1,2,4]]") "}}");
    write_text("bad-piece-short.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[4]", "[[0,0,3]]") "}}");
    write_text("bad-piece-file.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[2,0,1]]") "}}");
    write_text("bad-piece-negative.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[-1,0,1]]") "}}");
    write_text("bad-piece-empty.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,0,0],[0,0,1]]") "}}");
    write_text("bad-piece-two-numbers.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,1]]") "}}");
    write_text("bad-piece-four-numbers.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,0,1,2]]") "}}");
    write_text("bad-piece-not-array.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[0,0,1]") "}}");
    write_text("bad-piece-float.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,0,1.0]]") "}}");
    write_text("bad-piece-huge.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,-9223372036854775808,9223372036854775807]]") "}}");
    write_text("bad-pieces-twice.json", HEAD FILES2 "\"tensors\":{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"pieces\":[[0,0,1]],\"pieces\":[[0,0,1]]}}}");
    write_text("bad-no-pieces.json", HEAD FILES2 "\"tensors\":{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}}");
    write_text("bad-tensor-not-object.json", HEAD FILES2 "\"tensors\":{\"a\":[0,0,1]}}");
    write_text("bad-dtype.json", HEAD FILES2 "\"tensors\":{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"pieces\":[[0,0,1]]}}}");
    write_text("bad-no-shape.json", HEAD FILES2 "\"tensors\":{\"a\":{\"dtype\":\"F32\",\"pieces\":[[0,0,1]]}}}");
    write_text("bad-shape-9-dims.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1,1,1,1,1,1,1,1,1]", "[[0,0,1]]") "}}");
    write_text("bad-shape-huge.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1099511627777]", "[[0,0,1]]") "}}");
    write_text("bad-shape-product.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1048576,1048576,2]", "[[0,0,1]]") "}}");
    write_text("bad-shape-negative.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[-1]", "[]") "}}");
    write_text("bad-metadata-number.json", HEAD FILES2 "\"metadata\":{\"step\":5},\"tensors\":{}}");
    write_text("bad-metadata-list.json", HEAD FILES2 "\"metadata\":[\"a\"],\"tensors\":{}}");
    write_text("bad-truncated.json", HEAD FILES2 "\"tensors\":{" TENSOR("a", "[1]", "[[0,0,1]]"));
    write_text("bad-trailing.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[],\"tensors\":{}} {}");
    write_text("bad-comma.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"a\",],\"tensors\":{}}");
    write_text("bad-lone-surrogate.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"\\ud800\"],\"tensors\":{}}");
    write_text("bad-nul-escape.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"a\\u0000b\"],\"tensors\":{}}");
    write_text("bad-control-char.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[\"a\x01\"],\"tensors\":{}}");
    write_text("bad-literal.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[],\"tensors\":{},\"x\":nul}");
    write_text("bad-number.json", "{\"format\":\"fsdp.h-sharded\",\"files\":[],\"tensors\":{},\"step\":01}");
    for (i = 0; i < 70; i++) deep[i] = '[';
    for (i = 70; i < 140; i++) deep[i] = ']';
    deep[140] = 0;
    {
        char text[400];
        snprintf(text, sizeof text, "{\"format\":\"fsdp.h-sharded\",\"files\":[],\"tensors\":{},\"x\":%s}", deep);
        write_text("bad-deep.json", text);
    }
    return 0;
}
