/* bench_wire.c - the wire formats' kernels (fsdp.h's >>wire): how fast each encodes and decodes,
   at each kernel level this CPU has, for each block size K, beside memcpy of the same bytes;
   and what each (format, K) costs in bytes and in error. The numbers behind the default K.

   Build and run from the repository root:
       make build/bench_wire
       nice -n 10 build/bench_wire                          # 8 Mi elements, K = 32 .. 512
       build/bench_wire --count 65536 --blocks 64,256 --passes 21   # a cache-resident run

   Speed: GB/s of f32 values, encode reading count * 4 bytes, decode writing them (as f32, and as
   bf16 where the step's compute dtype is bf16); each the median of --passes timed passes over
   the whole buffer. memcpy is timed on the same count * 4 bytes in the same way. Passes are timed
   by the CPU time of the thread (CLOCK_THREAD_CPUTIME_ID): on a machine shared with other work
   the time the thread waits for a core does not count (the memory traffic of the others still
   does); --wall times them on the monotonic clock instead.
   Error: relative RMS of decode(encode(x)) - x, on normal data (a gradient's bulk) and on normal
   data with one element in 1000 a hundred times larger (the outliers that make a block's scale).
   The kernel levels are forced through fsdp.h's private switch, the one its tests use. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define FSDP_IMPLEMENTATION
#include "fsdp.h"
#include "example_common.h"

#define MAX_BLOCKS 16

typedef struct options {
    size_t count;
    size_t blocks[MAX_BLOCKS];
    int nblocks;
    int passes;
    int wall;
} options;

static const char *const level_names[3] = {"scalar", "avx2", "avx512"};

static void usage(void) {
    printf("usage: bench_wire [--count N] [--blocks K,K,...] [--passes P] [--wall]\n"
           "  --count N      elements per run (default 8388608: 32 MiB of f32, beyond the caches)\n"
           "  --blocks LIST  block sizes K, multiples of 8 up to 4096 (default 32,64,128,256,512)\n"
           "  --passes P     timed passes per figure, the median reported (default 7)\n"
           "  --wall         time on the monotonic clock, not the thread's CPU time\n");
}

static void parse(int argc, char **argv, options *o) {
    static const size_t default_blocks[] = {32, 64, 128, 256, 512};
    int i;
    o->count = (size_t)8 << 20;
    o->passes = 7;
    o->wall = 0;
    o->nblocks = 5;
    memcpy(o->blocks, default_blocks, sizeof default_blocks);
    for (i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(); exit(0); }
        if (!strcmp(argv[i], "--wall")) { o->wall = 1; continue; }
        if (!value) die_usage("%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--count")) o->count = (size_t)arg_int("--count", value, 1, 1L << 30);
        else if (!strcmp(argv[i], "--passes")) o->passes = (int)arg_int("--passes", value, 1, 1000);
        else if (!strcmp(argv[i], "--blocks")) {
            char word[32];
            const char *at = value;
            o->nblocks = 0;
            while (*at) {
                size_t n = strcspn(at, ",");
                if (n == 0 || n >= sizeof word || o->nblocks == MAX_BLOCKS) die_usage("--blocks: '%s' is not a list of up to %d sizes", value, MAX_BLOCKS);
                memcpy(word, at, n);
                word[n] = 0;
                o->blocks[o->nblocks] = (size_t)arg_int("--blocks", word, 8, 4096);
                if (o->blocks[o->nblocks++] % 8) die_usage("--blocks: %s is not a multiple of 8", word);
                at += n + (at[n] == ',');
            }
        } else die_usage("unknown option '%s'", argv[i]);
        i++;
    }
}

/* Normal values from a counter (Box-Muller on two hashed uniforms), every 1000th times 100 if asked. */
static void fill_normal(float *x, size_t n, uint32_t seed, int outliers) {
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t a = (uint32_t)(i * 2654435761u) ^ seed, b = (uint32_t)(i * 2246822519u) ^ ~seed;
        double u1, u2;
        a ^= a >> 16, a *= 0x7feb352du, a ^= a >> 15, a *= 0x846ca68bu, a ^= a >> 16;
        b ^= b >> 16, b *= 0x7feb352du, b ^= b >> 15, b *= 0x846ca68bu, b ^= b >> 16;
        u1 = ((double)a + 1.0) / 4294967297.0, u2 = (double)b / 4294967296.0;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)) * 1e-3f;
        if (outliers && i % 1000 == 999) x[i] *= 100.0f;
    }
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef enum job { ENCODE, DECODE_F32, DECODE_BF16, COPY } job;

static int use_wall_clock;

static double seconds_now(void) {
    struct timespec t;
    if (use_wall_clock) return fsdp_now();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GB/s of count f32 values: the median of passes timed runs of one job (after one untimed). */
static double time_job(job what, fsdp_wire wire, size_t block, unsigned char *enc, float *x, float *out, size_t count,
                       int passes) {
    double seconds[1000];
    int p;
    for (p = -1; p < passes; p++) {
        double t = seconds_now();
        int rc = FSDP_SUCCESS;
        if (what == ENCODE) rc = fsdp_wire_encode(enc, wire, block, x, count, NULL);
        else if (what == DECODE_F32) rc = fsdp_wire_decode(out, FSDP_F32, enc, wire, block, count);
        else if (what == DECODE_BF16) rc = fsdp_wire_decode(out, FSDP_BF16, enc, wire, block, count);
        else memcpy(out, x, count * sizeof(float));
        t = seconds_now() - t;
        if (rc != FSDP_SUCCESS) {
            fprintf(stderr, "bench_wire: %s of %s failed: %s\n", what == ENCODE ? "encode" : "decode", fsdp_wire_name(wire),
                    fsdp_result_description(rc));
            exit(1);
        }
        if (p >= 0) seconds[p] = t;
    }
    qsort(seconds, (size_t)passes, sizeof seconds[0], compare_doubles);
    return (double)count * 4 / seconds[passes / 2] / 1e9;
}

/* Relative RMS error of the round trip. */
static double round_trip_error(fsdp_wire wire, size_t block, unsigned char *enc, const float *x, float *out, size_t count) {
    double diff = 0, norm = 0;
    size_t i;
    if (fsdp_wire_encode(enc, wire, block, x, count, NULL) || fsdp_wire_decode(out, FSDP_F32, enc, wire, block, count)) {
        fprintf(stderr, "bench_wire: %s round trip failed\n", fsdp_wire_name(wire));
        exit(1);
    }
    for (i = 0; i < count; i++) {
        diff += ((double)x[i] - out[i]) * ((double)x[i] - out[i]);
        norm += (double)x[i] * x[i];
    }
    return sqrt(diff / norm);
}

static void print_costs(const options *o, unsigned char *enc, float *normal, float *spiky, float *out) {
    static const fsdp_wire wires[3] = {FSDP_WIRE_BF16, FSDP_WIRE_INT8, FSDP_WIRE_INT4};
    int w, b;
    printf("\n# cost of each format: bytes per element on the wire, relative RMS error of the round trip\n");
    printf("%-5s %5s %10s %14s %16s\n", "wire", "K", "bytes/elem", "error normal", "error outliers");
    for (w = 0; w < 3; w++)
        for (b = 0; b < (wires[w] == FSDP_WIRE_BF16 ? 1 : o->nblocks); b++) {
            size_t block = wires[w] == FSDP_WIRE_BF16 ? 0 : o->blocks[b];
            char k[24] = "-";
            if (block) snprintf(k, sizeof k, "%lu", (unsigned long)block);
            printf("%-5s %5s %10.4f %14.3e %16.3e\n", fsdp_wire_name(wires[w]), k,
                   (double)fsdp_wire_bytes(wires[w], o->count, block) / (double)o->count,
                   round_trip_error(wires[w], block, enc, normal, out, o->count),
                   round_trip_error(wires[w], block, enc, spiky, out, o->count));
        }
}

static void print_speeds(const options *o, unsigned char *enc, float *x, float *out) {
    static const fsdp_wire wires[2] = {FSDP_WIRE_INT8, FSDP_WIRE_INT4};
    int w, b, level, top = fsdp__wire_isa_supported();
    printf("\n# speed: GB/s of f32 values (median of %d passes, %s)\n", o->passes,
           o->wall ? "monotonic clock" : "the thread's CPU time");
    printf("%-5s %5s %-7s %10s %12s %13s\n", "wire", "K", "kernel", "encode", "decode f32", "decode bf16");
    printf("%-5s %5s %-7s %10.2f %12.2f %13s\n", "copy", "-", "memcpy", time_job(COPY, FSDP_WIRE_F32, 0, enc, x, out, o->count, o->passes),
           time_job(COPY, FSDP_WIRE_F32, 0, enc, x, out, o->count, o->passes), "-");
    printf("%-5s %5s %-7s %10.2f %12.2f %13s\n", "bf16", "-", "sse2", time_job(ENCODE, FSDP_WIRE_BF16, 0, enc, x, out, o->count, o->passes),
           time_job(DECODE_F32, FSDP_WIRE_BF16, 0, enc, x, out, o->count, o->passes), "-");
    for (w = 0; w < 2; w++)
        for (b = 0; b < o->nblocks; b++)
            for (level = 0; level <= top; level++) {
                double encode, decode, decode_bf16;
                fsdp__wire_isa = level;
                encode = time_job(ENCODE, wires[w], o->blocks[b], enc, x, out, o->count, o->passes);
                decode = time_job(DECODE_F32, wires[w], o->blocks[b], enc, x, out, o->count, o->passes);
                decode_bf16 = time_job(DECODE_BF16, wires[w], o->blocks[b], enc, x, out, o->count, o->passes);
                printf("%-5s %5lu %-7s %10.2f %12.2f %13.2f\n", fsdp_wire_name(wires[w]), (unsigned long)o->blocks[b],
                       level_names[level], encode, decode, decode_bf16);
                fflush(stdout);
            }
    fsdp__wire_isa = -1;
}

int main(int argc, char **argv) {
    options o;
    char cpu[256];
    float *normal, *spiky, *out;
    unsigned char *enc;
    example_program = "bench_wire";
    parse(argc, argv, &o);
    use_wall_clock = o.wall;
    normal = example_floats(o.count, 0);
    spiky = example_floats(o.count, 0);
    out = example_floats(o.count, 1);
    enc = (unsigned char *)malloc(fsdp_wire_bytes(FSDP_WIRE_F32, o.count, 0));
    if (!normal || !spiky || !out || !enc) {
        fprintf(stderr, "bench_wire: out of memory for %lu elements (try a smaller --count)\n", (unsigned long)o.count);
        return 1;
    }
    memset(enc, 0, fsdp_wire_bytes(FSDP_WIRE_F32, o.count, 0));
    fill_normal(normal, o.count, 1, 0);
    fill_normal(spiky, o.count, 1, 1);
    example_cpu_line(cpu, sizeof cpu);
    printf("# bench_wire: fsdp.h %s, %s; kernels here: %s\n", fsdp_version_string(), cpu,
           level_names[fsdp__wire_isa_supported()]);
    printf("# %lu elements (%.0f MiB of f32); memcpy of one core, 64 MiB: %.2f GB/s\n", (unsigned long)o.count,
           (double)o.count * 4 / 1048576.0, example_memcpy_gbps());
    print_costs(&o, enc, normal, spiky, out);
    print_speeds(&o, enc, normal, out);
    free(normal);
    free(spiky);
    free(out);
    free(enc);
    return 0;
}
