/* example_common.h - what the example programs (gpt, mlp, bench_train) share: command-line
   checks (--strategy's names among them), a timed hook call, the launcher (with its restarts),
   the peak-memory probe and aligned float buffers. Each program sets example_program to its name
   before parsing. Include after fsdp.h. */
#ifndef EXAMPLE_COMMON_H
#define EXAMPLE_COMMON_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#if defined(__GNUC__) || defined(__clang__)
#  define EXAMPLE_HELPER static __attribute__((unused)) /* not every program needs every helper */
#else
#  define EXAMPLE_HELPER static
#endif

static const char *example_program = "example";

/* Prints "<program>: <message>" and where the options are listed, then exits with status 2. */
EXAMPLE_HELPER void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", example_program);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(build/%s --help lists the options)\n", example_program);
    va_end(ap);
    exit(2);
}

EXAMPLE_HELPER long arg_int(const char *flag, const char *text, long lo, long hi) {
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < lo || v > hi) die_usage("%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, text);
    return v;
}

EXAMPLE_HELPER float arg_float(const char *flag, const char *text) {
    char *end;
    double v = strtod(text, &end);
    if (!*text || *end || !(v >= 0) || !isfinite(v)) die_usage("%s needs a number >= 0, got '%s'", flag, text);
    return (float)v;
}

/* The index + first of text in the NULL-terminated names, or a usage error listing them. */
EXAMPLE_HELPER int arg_choice(const char *flag, const char *text, const char *const *names, int first) {
    char list[128] = "";
    for (int i = 0; names[i]; i++) {
        if (strcmp(text, names[i]) == 0) return first + i;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    }
    die_usage("%s: unknown value '%s' (choose one of %s)", flag, text, list);
    return 0;
}

/* --strategy: every name fsdp_strategy_from_name takes, in any case (PyTorch's FULL_SHARD ...,
   Hugging Face's full_shard ... and 1..4, the short full, grad_op, no_shard, hybrid), or a usage
   error listing them. EXAMPLE_STRATEGY_HELP is the option's --help entry. */
#define EXAMPLE_STRATEGY_HELP \
    "  --strategy S         FULL_SHARD (default), SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD, in any case\n" \
    "                       (full_shard, Shard_Grad_Op, ...), Hugging Face's 1..4, or the short full,\n" \
    "                       grad_op, no_shard, hybrid\n"
EXAMPLE_HELPER fsdp_strategy arg_strategy(const char *flag, const char *text) {
    fsdp_strategy strategy = fsdp_strategy_from_name(text);
    if (strategy == FSDP_STRATEGY_DEFAULT)
        die_usage("%s: unknown strategy '%s' (choose one of %s, %s, %s, %s in any case, Hugging Face's 1..4, or the "
                  "short full, grad_op, no_shard, hybrid)", flag, text, fsdp_strategy_name(FSDP_FULL_SHARD),
                  fsdp_strategy_name(FSDP_SHARD_GRAD_OP), fsdp_strategy_name(FSDP_NO_SHARD),
                  fsdp_strategy_name(FSDP_HYBRID_SHARD));
    return strategy;
}

/* --offload WHAT: none, optimizer, params, grads or all, or a comma list of them
   ("optimizer,grads"), into d's flags; a usage error otherwise. EXAMPLE_OFFLOAD_HELP is the
   --offload, --offload-dir, --offload-ram and --state-dtype entries of --help. */
#define EXAMPLE_OFFLOAD_HELP \
    "  --offload WHAT       keep on local disk, streamed in execution order (fsdp_desc.offload): none\n" \
    "                       (default), optimizer (AdamW state), params (f32 master weights: read before\n" \
    "                       each all-gather, written by the step), grads (gradient shards: written by\n" \
    "                       each reduce-scatter, read by the step), all; or a comma list\n" \
    "  --offload-dir DIR    where (a directory on a local disk, not tmpfs; default FSDP_OFFLOAD_DIR).\n" \
    "                       Each rank keeps one unlinked file there, reserved in full at start\n" \
    "  --offload-ram MIB    RAM the streaming may use per rank (default 64)\n" \
    "  --state-dtype D      f32 (default, PyTorch's AdamW bit for bit) or bf16: AdamW state rounded to\n" \
    "                       bf16 (nearest, ties to even) after each f32 update: half the bytes\n"
EXAMPLE_HELPER void arg_offload(const char *flag, const char *text, fsdp_offload_desc *d) {
    static const char *const names[] = {"none", "optimizer", "params", "grads", "all", NULL};
    char word[32];
    const char *at = text;
    d->optimizer = d->params = d->grads = 0;
    while (*at) {
        size_t n = strcspn(at, ",");
        int k;
        if (n == 0 || n >= sizeof word) die_usage("%s: '%s' is not a comma list of none, optimizer, params, grads, all", flag, text);
        memcpy(word, at, n);
        word[n] = 0;
        k = arg_choice(flag, word, names, 0);
        d->optimizer |= k == 1 || k == 4;
        d->params |= k == 2 || k == 4;
        d->grads |= k == 3 || k == 4;
        at += n + (at[n] == ',');
    }
}

/* The machine's RAM in bytes (MemTotal from /proc/meminfo; 0 where there is none). */
EXAMPLE_HELPER double example_mem_total(void) {
    char line[256];
    unsigned long long kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f) && sscanf(line, "MemTotal: %llu kB", &kib) != 1) {}
    if (f) fclose(f);
    return 1024.0 * (double)kib;
}

/* This process's own peak resident set size in bytes: VmHWM from /proc/self/status, or, where
   there is no /proc, getrusage's ru_maxrss. Not ru_maxrss first: it survives exec, so a rank
   started by torchrun or mpirun would report its launcher's peak (about 230 MiB for torchrun's
   Python) whenever that is larger than its own. *source (if not NULL) gets which one it was. */
EXAMPLE_HELPER double example_peak_rss(const char **source) {
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    struct rusage ru;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1) {
            fclose(f);
            if (source) *source = "VmHWM";
            return 1024.0 * (double)kib;
        }
    }
    if (f) fclose(f);
    if (source) *source = "ru_maxrss";
    return getrusage(RUSAGE_SELF, &ru) == 0 ? 1024.0 * (double)ru.ru_maxrss : 0.0;
}

/* n floats (zeroed if asked) starting on a 64-byte boundary, a cache line and an AVX-512 vector:
   the plain loops' parameters and gradients, which fsdp.h's runtime also keeps aligned (malloc's
   16-byte alignment put every matrix of the plain GPT across cache lines). Free with free(). */
/* "AMD EPYC 9R14 (family 25 model 17; AVX-512), 2 CPUs": the CPU, for a benchmark's banner
   (machines change between runs, so every figure is printed beside the machine). */
EXAMPLE_HELPER void example_cpu_line(char *out, size_t size) {
    char line[8192], name[128] = "unknown CPU"; // (the flags line is long)
    int family = -1, model = -1, avx512 = 0, avx2 = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (!strncmp(line, "model name", 10) && !strcmp(name, "unknown CPU")) {
            snprintf(name, sizeof name, "%s", colon + 2);
            name[strcspn(name, "\n")] = 0;
        } else if (!strncmp(line, "cpu family", 10) && family < 0) {
            family = atoi(colon + 1);
        } else if (!strncmp(line, "model\t", 6) && model < 0) {
            model = atoi(colon + 1);
        } else if (!strncmp(line, "flags", 5)) {
            avx512 |= strstr(colon, " avx512f") != NULL;
            avx2 |= strstr(colon, " avx2") != NULL;
        }
    }
    if (f) fclose(f);
    snprintf(out, size, "%s (family %d model %d; %s), %ld CPUs", name, family, model,
             avx512 ? "AVX-512" : avx2 ? "AVX2, no AVX-512" : "no AVX2", sysconf(_SC_NPROCESSORS_ONLN));
}

/* One core's memcpy bandwidth in GB/s, the best of 5 copies of 64 MiB (about 0.1 s): the peak
   that bounds what shared-memory collectives move. */
EXAMPLE_HELPER double example_memcpy_gbps(void) {
    size_t n = (size_t)64 << 20;
    char *a = (char *)malloc(n), *b = (char *)malloc(n);
    double best = 0;
    if (!a || !b) {
        free(a), free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    for (int rep = 0; rep < 5; rep++) {
        double t = fsdp_now();
        memcpy(b, a, n);
        t = fsdp_now() - t;
        if (t > 0 && (double)n / t > best) best = (double)n / t;
        a[rep] = b[n - 1 - (size_t)rep]; // (keeps the copies)
    }
    free(a), free(b);
    return best / 1e9;
}

EXAMPLE_HELPER float *example_floats(size_t n, int zero) {
    size_t bytes = n ? sizeof(float) * n : 64;
    void *p = NULL;
    if (n > (size_t)-1 / sizeof(float) || posix_memalign(&p, 64, bytes)) return NULL; /* as calloc: no wrap */
    if (zero) memset(p, 0, bytes);
    return (float *)p;
}

/* Calls an fsdp hook, adding the time it took to *seconds and naming the module on failure
   (root_name for module 0). */
typedef int (*example_hook_fn)(fsdp_ctx *ctx, int module);
EXAMPLE_HELPER int example_hook(fsdp_ctx *ctx, const fsdp_model *model, int rank, double *seconds, example_hook_fn hook,
                                const char *hook_name, int module, const char *root_name) {
    double t = fsdp_now();
    int rc = hook(ctx, module);
    *seconds += fsdp_now() - t;
    if (rc) {
        const char *name = fsdp_model_module_name(model, module);
        fprintf(stderr, "rank %d: %s(%s) failed: %s\n", rank, hook_name, name && *name ? name : root_name, fsdp_last_error(ctx));
    }
    return rc;
}

/* Which attempt of an elastic job this process belongs to: 0 for the first, k after the k-th
   restart (fsdp_launch_ex's FSDP_RESTART_COUNT, torchrun's TORCHELASTIC_RESTART_COUNT). */
EXAMPLE_HELPER int example_restart_count(void) {
    const char *text = getenv("FSDP_RESTART_COUNT");
    if (!text || !*text) text = getenv("TORCHELASTIC_RESTART_COUNT");
    return text && *text ? atoi(text) : 0;
}

/* Runs fn as the ranks of a job: nproc local ranks forked by fsdp_launch_ex (backend shm or
   socket; when a rank fails, all are started again up to max_restarts times), or, without
   nproc, this process as one rank of the job the environment describes (torchrun, SLURM,
   mpirun; restarts are then the launcher's), or a single local rank when no launcher variables
   are set. check(arg, world size) runs first, before anything is forked. Returns 0 on success. */
EXAMPLE_HELPER int example_run(int nproc, fsdp_backend_kind backend, int max_restarts,
                               int (*check)(const void *arg, int world), fsdp_rank_fn fn, void *arg) {
    char err[512];
    int rc;
    if (nproc || !(getenv("RANK") || getenv("SLURM_PROCID") || getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK"))) {
        fsdp_launch_desc ld;
        fsdp_launch_status status;
        memset(&ld, 0, sizeof ld);
        ld.nprocs = nproc ? nproc : 1;
        ld.backend = backend;
        ld.max_restarts = max_restarts;
        if ((rc = check(arg, ld.nprocs)) == 0 && (rc = fsdp_launch_ex(&ld, fn, arg, &status)) != 0)
            fprintf(stderr, max_restarts ? "%s: %s (attempt %d of %d: no restarts left)\n" : "%s: %s\n", example_program,
                    status.message, status.restarts + 1, max_restarts + 1);
        else if (rc == 0 && status.restarts)
            printf("%s: finished after %d restart%s\n", example_program, status.restarts, status.restarts > 1 ? "s" : "");
    } else {
        fsdp_comm *comm;
        if ((rc = fsdp_comm_init_from_env(&comm, NULL, err, sizeof err)) != 0)
            fprintf(stderr, "%s: %s\n(or run local ranks with --nproc N)\n", example_program, err);
        else {
            rc = check(arg, fsdp_comm_size(comm)) || fn(comm, arg);
            fsdp_comm_destroy(comm);
        }
    }
    return rc;
}

#endif
