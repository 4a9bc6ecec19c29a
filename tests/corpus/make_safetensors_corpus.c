/* make_safetensors_corpus.c - writes the fuzz target's seed corpus into the directory given:
   valid files from fsdp_st_writer and fsdp_save_full / fsdp_save_sharded, and invalid ones
   written by hand (one defect each). Run from the repository root:
       cc -std=c99 -I. tests/corpus/make_safetensors_corpus.c -o /tmp/make_corpus -lpthread -lm
       /tmp/make_corpus tests/corpus/safetensors */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "make_corpus: %s: %s\n", what, detail);
    exit(1);
}

static void write_raw(const char *name, const void *bytes, size_t size) {
    char path[512];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!(f = fopen(path, "wb")) || fwrite(bytes, 1, size, f) != size || fclose(f) != 0) fail(path, "cannot write");
}

/* 8-byte little-endian length (of the text unless given), header text, data bytes 0, 1, 2, ... */
static void write_hand(const char *name, uint64_t length, const char *header, size_t data_len) {
    unsigned char buf[4096];
    size_t n = strlen(header), i;
    if (length == 0) length = n;
    for (i = 0; i < 8; i++) buf[i] = (unsigned char)(length >> (8 * i));
    memcpy(buf + 8, header, n);
    for (i = 0; i < data_len; i++) buf[8 + n + i] = (unsigned char)(i * 37);
    write_raw(name, buf, 8 + n + data_len);
}

static void write_with_writer(const char *name, const fsdp_st_spec *specs, int count, const float *values, size_t n,
                              const fsdp_kv *meta, int num_meta) {
    char path[512], err[512];
    fsdp_st_writer *w;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (fsdp_st_writer_open(&w, path, specs, count, meta, num_meta, err, sizeof err) != 0) fail(path, err);
    if (n && fsdp_st_writer_write_f32(w, values, n) != 0) fail(path, "write");
    if (fsdp_st_writer_close(w, err, sizeof err) != 0) fail(path, err);
}

static int save_tiny_model(fsdp_comm *comm, void *arg) {
    static const char *const types[] = {"Linear", NULL};
    fsdp_init_rule rule = {FSDP_INIT_NORMAL, 0.0f, 1.0f, NULL, NULL};
    int64_t w_shape[2] = {3, 2}, b_shape[1] = {3};
    fsdp_save_options so;
    fsdp_model *m;
    fsdp_ctx *ctx;
    fsdp_desc d;
    char path[512];
    int layer, rc;
    fsdp_model_create(&m, "Tiny");
    layer = fsdp_model_module(m, 0, "fc", "Linear");
    fsdp_model_param(m, layer, "weight", 2, w_shape, rule);
    fsdp_model_param(m, layer, "bias", 1, b_shape, rule);
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.wrap.kind = FSDP_WRAP_TYPES;
    d.wrap.types = types;
    d.optimizer.kind = FSDP_ADAMW;
    memset(&so, 0, sizeof so);
    so.with_optimizer = 1;
    so.epoch = 3;
    if ((rc = fsdp_init(&ctx, m, &d)) != 0) return 1;
    snprintf(path, sizeof path, "%s/full-checkpoint.safetensors", dir);
    rc = fsdp_save_full(ctx, path, &so);
    if (!rc) rc = fsdp_save_sharded(ctx, (const char *)arg, &so); /* the same directory on every rank */
    fsdp_destroy(ctx);
    fsdp_model_destroy(m);
    return rc != 0;
}

int main(int argc, char **argv) {
    fsdp_st_spec specs[5];
    fsdp_kv meta[2] = {{"note", "hi"}, {"unicode", "caf\xc3\xa9 \xe2\x9c\x93"}};
    float values[16] = {1, 2, -0.5f, 1.5f, -2, 0.25f, 3, 3.5f, 0, 1, 2, 3, 4, 5, 6, 7};
    char command[1024], sharded[256];
    int i;
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    memset(specs, 0, sizeof specs);
    /* valid */
    specs[0].name = "a"; specs[0].dtype = FSDP_F32; specs[0].ndim = 1; specs[0].shape[0] = 2;
    specs[1].name = "b"; specs[1].dtype = FSDP_BF16; specs[1].ndim = 1; specs[1].shape[0] = 1;
    write_with_writer("valid-f32-bf16.safetensors", specs, 2, values, 3, meta, 2);
    specs[0].shape[0] = 3;
    specs[1].shape[0] = 2;
    specs[2].name = "h"; specs[2].dtype = FSDP_F16; specs[2].ndim = 1; specs[2].shape[0] = 2;
    specs[3].name = "s"; specs[3].dtype = FSDP_F32; specs[3].ndim = 0;
    specs[4].name = "m.weight"; specs[4].dtype = FSDP_F32; specs[4].ndim = 2; specs[4].shape[0] = 2; specs[4].shape[1] = 3;
    write_with_writer("valid-mixed.safetensors", specs, 5, values, 14, NULL, 0);
    write_with_writer("valid-no-tensors.safetensors", specs, 0, values, 0, NULL, 0);
    specs[0].shape[0] = 0;
    write_with_writer("valid-empty-tensor.safetensors", specs, 1, values, 0, NULL, 0);
    write_hand("valid-by-hand.safetensors", 0,
               "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
               "\"__metadata__\":{\"k\":\"\\u00e9\\ud83d\\ude00\\n\"}}  ", 8);
    snprintf(sharded, sizeof sharded, "/tmp/make-corpus-sharded-%d", (int)getpid());
    if (fsdp_launch(2, save_tiny_model, sharded) != 0) fail("fsdp_launch", "saving the tiny model failed");
    snprintf(command, sizeof command, "cp %s/shard-*-00001.safetensors %s/shard-file.safetensors && rm -rf %s", sharded, dir,
             sharded);
    if (system(command) != 0) fail("copying a shard file", command);
    /* invalid, one defect each */
    write_hand("bad-short.safetensors", 0, "", 0);
    write_raw("bad-length-only.safetensors", "\x10\0\0\0\0\0\0\0", 8);
    write_hand("bad-huge-length.safetensors", (uint64_t)1 << 63, "{}", 0);
    write_hand("bad-truncated-data.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 7);
    write_hand("bad-overlap.safetensors", 0,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
    write_hand("bad-dtype.safetensors", 0, "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    write_hand("bad-shape.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    write_hand("bad-duplicate.safetensors", 0,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    write_hand("bad-metadata.safetensors", 0, "{\"__metadata__\":{\"step\":5}}", 0);
    write_hand("bad-json-comma.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,],\"data_offsets\":[0,4]},}", 4);
    write_hand("bad-json-surrogate.safetensors", 0, "{\"\\ud800\":{}}", 0);
    {
        char deep[200];
        for (i = 0; i < 70; i++) deep[i] = '[';
        deep[0] = '{';
        memcpy(deep + 1, "\"a\":", 4);
        for (i = 70; i < 140; i++) deep[i] = ']';
        deep[140] = 0;
        write_hand("bad-json-deep.safetensors", 0, deep, 0);
    }
    write_hand("bad-checksum.safetensors", 0,
               "{\"__metadata__\":{\"crc32c.a\":\"00000000\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    return 0;
}
