/* fuzz_index.c - libFuzzer target for fsdp.h's index.json reader: fsdp_index_parse on the input,
   and on success every table walked and checked against what opening promises (file names
   plain, each tensor's pieces sorted, naming listed files and covering [0, numel) exactly once,
   names found again by fsdp_index_find), names shown through fsdp_printable at odd sizes.
   Whatever the input, nothing may crash, leak or touch memory outside the input; a rejected
   input must come with FSDP_ERR_CORRUPT and a message.

   Build and run (make fuzz-index does this; clang with compiler-rt, on Debian
   libclang-rt-14-dev if -fsanitize=fuzzer is missing):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz_index.c \
             -o build/fuzz_index -lpthread -lm
       mkdir -p build/fuzz-corpus-index
       ./build/fuzz_index -max_total_time=120 -dict=tests/fuzz_index.dict build/fuzz-corpus-index tests/corpus/index
   Crashes are written as crash-<sha1>: minimise them (-minimize_crash=1) and move them to
   tests/corpus/index/crashers/, where test_files replays them. */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* fsdp_printable into exactly `size` bytes (ASan sees a write past them); the result must be
   terminated within them and free of control bytes. */
static void show(const char *text, size_t size) {
    char *dst = (char *)malloc(size ? size : 1);
    size_t i;
    if (!dst) return;
    fsdp_printable(dst, size, text);
    for (i = 0; size && dst[i]; i++)
        if (i + 1 >= size || (unsigned char)dst[i] < 0x20 || (unsigned char)dst[i] == 0x7f) abort();
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fsdp_index *ix = NULL;
    char err[512];
    int i, k, rc;
    /* a copy of exactly `size` bytes: ASan then catches a read one byte past the input */
    char *bytes = (char *)malloc(size ? size : 1);
    if (!bytes) return 0;
    if (size) memcpy(bytes, data, size);
    err[0] = 0;
    rc = fsdp_index_parse(&ix, bytes, size, err, sizeof err);
    free(bytes); /* the index keeps its own copy: a use of the input after parsing is caught */
    if (rc != FSDP_SUCCESS) {
        if (ix != NULL || rc != FSDP_ERR_CORRUPT || err[0] == 0) abort(); /* a clean error says what */
        show(err, 64);
        return 0;
    }
    for (i = 0; i < fsdp_index_num_files(ix); i++) {
        const char *file = fsdp_index_file(ix, i);
        if (!file || !*file || strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0) abort();
        show(file, 1 + (size_t)i % 9);
    }
    for (i = 0; i < fsdp_index_num_tensors(ix); i++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        int64_t at = 0, numel = 1;
        if (!t || !t->name || fsdp_index_find(ix, t->name) != i) abort();
        if (t->dtype != FSDP_F32 && t->dtype != FSDP_BF16 && t->dtype != FSDP_F16) abort();
        if (t->ndim < 0 || t->ndim > FSDP_MAX_DIMS || t->num_pieces < 0 || (t->num_pieces && !t->pieces)) abort();
        for (k = 0; k < t->ndim; k++) numel *= t->shape[k];
        if (numel != t->numel) abort();
        for (k = 0; k < t->num_pieces; k++) { /* sorted, contiguous, in listed files */
            const fsdp_index_piece *pc = &t->pieces[k];
            if (pc->begin != at || pc->end <= pc->begin || pc->file < 0 || pc->file >= fsdp_index_num_files(ix)) abort();
            at = pc->end;
        }
        if (at != t->numel) abort();
        show(t->name, 1 + (size_t)i % 13);
    }
    for (i = 0; i < fsdp_index_num_metadata(ix); i++) {
        fsdp_kv kv = fsdp_index_metadata_at(ix, i);
        if (!kv.key || !kv.value || fsdp_index_metadata(ix, kv.key) == NULL) abort();
        show(kv.key, 16);
        show(kv.value, 5);
    }
    if (fsdp_index_tensor_at(ix, fsdp_index_num_tensors(ix)) != NULL || fsdp_index_file(ix, -1) != NULL) abort();
    (void)fsdp_index_world_size(ix);
    (void)fsdp_index_step(ix);
    (void)fsdp_index_epoch(ix);
    fsdp_index_close(ix);
    return 0;
}
