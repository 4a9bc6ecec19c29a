/* fuzz_safetensors.c - libFuzzer target for fsdp.h's safetensors reader: fsdp_st_parse on the
   input, and on success every tensor read (in pieces, whole, and out of range) and verified.
   Whatever the input, nothing may crash, leak or touch memory outside the input; a rejected
   input must come with FSDP_ERR_CORRUPT and a message.

   Build and run (clang with compiler-rt; on Debian libclang-rt-14-dev if -fsanitize=fuzzer is
   missing):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz_safetensors.c \
             -o build/fuzz_safetensors -lpthread -lm
       mkdir -p build/fuzz-corpus
       ./build/fuzz_safetensors -max_total_time=120 -max_len=65536 build/fuzz-corpus tests/corpus/safetensors
   Crashes are written as crash-<sha1> in the current directory: move them to
   tests/corpus/safetensors/crashers/, where test_checkpoint replays them. */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ELEMENTS_READ (1 << 16) /* per tensor: inputs are small, but a shape may claim more */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fsdp_st_file *f = NULL;
    char err[512];
    float chunk[257];
    int i, rc;
    /* a copy of exactly `size` bytes: ASan then catches a read one byte past the input */
    uint8_t *bytes = (uint8_t *)malloc(size ? size : 1);
    if (!bytes) return 0;
    if (size) memcpy(bytes, data, size);
    err[0] = 0;
    rc = fsdp_st_parse(&f, bytes, size, err, sizeof err);
    if (rc != FSDP_SUCCESS) {
        if (f != NULL || rc != FSDP_ERR_CORRUPT || err[0] == 0) abort(); /* a clean error says what */
        free(bytes);
        return 0;
    }
    for (i = 0; i < fsdp_st_num_tensors(f); i++) {
        const fsdp_st_tensor *t = fsdp_st_tensor_at(f, i);
        int64_t at, limit;
        if (!t || !t->name || t->numel < 0 || t->end < t->begin || fsdp_st_find(f, t->name) < 0) abort();
        limit = t->numel < MAX_ELEMENTS_READ ? t->numel : MAX_ELEMENTS_READ;
        for (at = 0; at < limit; at += 257) { /* odd-sized pieces */
            int64_t n = limit - at < 257 ? limit - at : 257;
            if (fsdp_st_read(f, i, at, n, chunk, err, sizeof err) != FSDP_SUCCESS) abort(); /* offsets were checked */
        }
        /* out of range: refused, not read */
        if (fsdp_st_read(f, i, t->numel, 1, chunk, err, sizeof err) == FSDP_SUCCESS) abort();
        if (fsdp_st_read(f, i, -1, 1, chunk, err, sizeof err) == FSDP_SUCCESS) abort();
        if (fsdp_st_read(f, i, 0, t->numel + 1, chunk, err, sizeof err) == FSDP_SUCCESS) abort();
        fsdp_st_verify(f, i, err, sizeof err);
    }
    for (i = 0; i < fsdp_st_num_metadata(f); i++) {
        fsdp_kv kv = fsdp_st_metadata_at(f, i);
        if (!kv.key || !kv.value || fsdp_st_metadata(f, kv.key) == NULL) abort();
    }
    if (fsdp_st_tensor_at(f, fsdp_st_num_tensors(f)) != NULL) abort();
    fsdp_st_close(f);
    free(bytes);
    return 0;
}
