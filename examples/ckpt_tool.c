/* ckpt_tool: look into fsdp.h checkpoints and convert between full and sharded ones.

       ckpt_tool inspect FILE.safetensors | DIR
       ckpt_tool consolidate DIR OUT.safetensors [--dtype f32|bf16|f16] [--params-only]
       ckpt_tool shard FILE.safetensors DIR --nranks N

   A full checkpoint is one safetensors file (fsdp_save_full); a sharded one is a directory of
   per-rank safetensors files and an index.json that maps each tensor's element ranges
   ("pieces") to files (fsdp_save_sharded). Both carry a CRC32C per tensor, which every command
   checks before it trusts the data. Outputs are written like fsdp.h writes them: to a temporary
   name, fsynced, renamed, so an interrupted run leaves what was there before.

   Build: cc -std=c99 -O2 -I. examples/ckpt_tool.c -o build/ckpt_tool -lpthread -lm

   index.json is read through fsdp.h's fsdp_index_* API, which checks it whole on opening. */
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_ELEMENTS 65536 /* elements copied at a time: the tool's memory does not grow with the model */

static void die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "ckpt_tool: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die("out of memory");
    return p;
}

/* Text from a checkpoint (tensor names, metadata, file names), made safe to print: control
   characters and escape sequences show as \xNN (fsdp_printable). Each call uses the next of a
   few buffers, so one printf may show several. */
static const char *shown(const char *text) {
    static char buffers[6][600];
    static int next;
    char *b = buffers[next++ % 6];
    return fsdp_printable(b, sizeof buffers[0], text);
}

static const char *dtype_text(fsdp_dtype dtype) {
    return dtype == FSDP_F32 ? "F32" : dtype == FSDP_BF16 ? "BF16" : dtype == FSDP_F16 ? "F16" : "?";
}

static fsdp_dtype dtype_from_text(const char *text) {
    if (strcmp(text, "F32") == 0 || strcmp(text, "f32") == 0) return FSDP_F32;
    if (strcmp(text, "BF16") == 0 || strcmp(text, "bf16") == 0) return FSDP_BF16;
    if (strcmp(text, "F16") == 0 || strcmp(text, "f16") == 0) return FSDP_F16;
    return FSDP_DTYPE_DEFAULT;
}

static void format_shape(char *out, size_t size, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, size, "[");
    int k;
    for (k = 0; k < ndim && n < size; k++) n += (size_t)snprintf(out + n, size - n, k ? ", %lld" : "%lld", (long long)shape[k]);
    if (n < size) snprintf(out + n, size - n, "]");
}

/* Opens DIR/index.json; on failure prints why (with a hint when there is no index) and returns NULL. */
static fsdp_index *index_open(const char *dir) {
    fsdp_index *ix = NULL;
    char err[8192] = "";
    int rc = fsdp_index_open(&ix, dir, err, sizeof err);
    if (rc == 0) return ix;
    if (!err[0]) snprintf(err, sizeof err, "%s: cannot open index.json (%s)", dir, fsdp_result_description(rc));
    if (rc == FSDP_ERR_IO)
        fprintf(stderr, "ckpt_tool: %s (is %s a sharded checkpoint written by fsdp_save_sharded or 'ckpt_tool shard'?)\n", err, dir);
    else
        fprintf(stderr, "ckpt_tool: %s\n", err);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
   source files: a safetensors file plus raw access to its data (for bit-exact copies)
   --------------------------------------------------------------------------------------------- */
typedef struct source {
    fsdp_st_file *st;
    unsigned char *verified; /* per tensor: checksum checked */
} source;

/* A file named by the user (path), or the file-th shard file of the checkpoint in dir (ix). */
static int source_open(source *s, const char *path, const fsdp_index *ix, const char *dir, int file, char *err,
                       size_t err_size) {
    int rc;
    memset(s, 0, sizeof *s);
    rc = ix ? fsdp_index_open_file(ix, dir, file, &s->st, err, err_size) : fsdp_st_open(&s->st, path, err, err_size);
    if (rc == 0) s->verified = (unsigned char *)xcalloc((size_t)fsdp_st_num_tensors(s->st) + 1, 1);
    return rc;
}

static void source_close(source *s) {
    fsdp_st_close(s->st);
    free(s->verified);
    memset(s, 0, sizeof *s);
}

/* The tensor's checksum, checked once. A file without checksums is accepted. */
static int source_verify(source *s, int tensor, char *err, size_t err_size) {
    int rc;
    if (s->verified[tensor]) return 0;
    rc = fsdp_st_verify(s->st, tensor, err, err_size);
    if (rc == FSDP_ERR_UNSUPPORTED) rc = 0;
    if (rc == 0) s->verified[tensor] = 1;
    return rc;
}

/* Appends elements [first, first + count) of a source tensor to the writer in `dtype`: raw
   bytes when the dtype is the tensor's own, else through f32. */
static int copy_elements(source *s, int tensor, int64_t first, int64_t count, fsdp_st_writer *w, fsdp_dtype dtype,
                         char *err, size_t err_size) {
    static float values[CHUNK_ELEMENTS];
    const fsdp_st_tensor *t = fsdp_st_tensor_at(s->st, tensor);
    size_t esize = fsdp_dtype_size(t->dtype);
    int rc;
    while (count > 0) {
        int64_t n = count < CHUNK_ELEMENTS ? count : CHUNK_ELEMENTS;
        if (dtype == t->dtype) {
            if ((rc = fsdp_st_read_raw(s->st, tensor, first, n, values, err, err_size)) != 0) return rc;
            rc = fsdp_st_writer_write(w, values, (size_t)n * esize);
        } else {
            if ((rc = fsdp_st_read(s->st, tensor, first, n, values, err, err_size)) != 0) return rc;
            rc = fsdp_st_writer_write_f32(w, values, (size_t)n);
        }
        if (rc) {
            snprintf(err, err_size, "writing tensor '%s' failed (%s)", shown(t->name), fsdp_result_description(rc));
            return rc;
        }
        first += n;
        count -= n;
    }
    return 0;
}

/* Optimizer state that fsdp.h saves next to a parameter: "<param>.<state>", <state> one of the
   shipped optimizers' state names (fsdp_optimizer_of: exp_avg, exp_avg_sq, momentum_buffer). */
static int is_optimizer_state(const char *name, const fsdp_index *ix) {
    const char *dot = strrchr(name, '.');
    char base[4096];
    int kind, k;
    if (!dot || (size_t)(dot - name) >= sizeof base) return 0;
    for (kind = FSDP_SGD; kind <= FSDP_ADAMW; kind++) {
        const fsdp_optimizer *o = fsdp_optimizer_of((fsdp_optimizer_kind)kind);
        for (k = 0; k < FSDP_OPTIMIZER_MAX_STATE && o->state_names[k]; k++)
            if (strcmp(dot + 1, o->state_names[k]) == 0) {
                memcpy(base, name, (size_t)(dot - name));
                base[dot - name] = 0;
                return fsdp_index_find(ix, base) >= 0;
            }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   inspect
   --------------------------------------------------------------------------------------------- */
static const char inspect_help[] =
    "usage: ckpt_tool inspect FILE.safetensors | DIR\n"
    "  Lists a checkpoint and checks it.\n"
    "  FILE: its metadata and tensors (name, dtype, shape, bytes), each tensor's CRC32C checked: OK, BAD,\n"
    "        or 'none' when the file stores no checksum for it.\n"
    "  DIR:  a sharded checkpoint: index.json (each tensor's pieces and the files holding them), then every\n"
    "        shard file checked the same way, and that each piece is where the index says.\n"
    "  Exit status: 0 all good, 1 something is corrupt or missing, 2 the checkpoint cannot be read.\n";

/* Prints a file's tensors and checks them; returns the number of problems. The file is path,
   or the file-th shard file of the checkpoint in dir (ix), at path. */
static int inspect_file(const char *path, const fsdp_index *ix, const char *dir, int file, int show_metadata,
                        const char *indent) {
    source s;
    char err[8192], shape[256];
    int i, bad = 0, none = 0, checksums = 0, rc;
    uint64_t data_bytes = 0;
    if ((rc = source_open(&s, path, ix, dir, file, err, sizeof err)) != 0) {
        printf("%sBAD  %s\n", indent, err);
        source_close(&s);
        return 1;
    }
    for (i = 0; i < fsdp_st_num_tensors(s.st); i++) data_bytes += fsdp_st_tensor_at(s.st, i)->end - fsdp_st_tensor_at(s.st, i)->begin;
    printf("%s%s: %d tensors, %llu bytes of data (header %llu bytes)\n", indent, shown(path), fsdp_st_num_tensors(s.st),
           (unsigned long long)data_bytes, (unsigned long long)fsdp_st_header_size(s.st));
    for (i = 0; i < fsdp_st_num_metadata(s.st); i++) {
        fsdp_kv kv = fsdp_st_metadata_at(s.st, i);
        if (strncmp(kv.key, "crc32c.", 7) == 0) checksums++;
        else if (show_metadata) printf("%s  metadata %-20s = %s\n", indent, shown(kv.key), shown(kv.value));
    }
    if (show_metadata) printf("%s  metadata crc32c.*             : %d checksums\n", indent, checksums);
    printf("%s  %-40s %-5s %-16s %12s  crc32c\n", indent, "tensor", "dtype", "shape", "bytes");
    for (i = 0; i < fsdp_st_num_tensors(s.st); i++) {
        const fsdp_st_tensor *t = fsdp_st_tensor_at(s.st, i);
        const char *verdict = "OK";
        rc = fsdp_st_verify(s.st, i, err, sizeof err);
        if (rc == FSDP_ERR_UNSUPPORTED) { verdict = "none"; none++; }
        else if (rc != 0) { verdict = "BAD"; bad++; }
        format_shape(shape, sizeof shape, t->ndim, t->shape);
        printf("%s  %-40s %-5s %-16s %12llu  %s\n", indent, shown(t->name), dtype_text(t->dtype), shape,
               (unsigned long long)(t->end - t->begin), verdict);
        if (rc != 0 && rc != FSDP_ERR_UNSUPPORTED) printf("%s      %s\n", indent, err);
    }
    printf("%s  checksums: %d OK, %d BAD, %d without a checksum\n", indent, fsdp_st_num_tensors(s.st) - bad - none, bad, none);
    source_close(&s);
    return bad;
}

static int inspect_dir(const char *dir) {
    fsdp_index *ix = index_open(dir);
    char err[8192], shape[256], path[4096];
    int i, k, problems = 0, *referenced, num_files, num_tensors;
    int64_t world_size, step, epoch;
    struct stat st;
    if (!ix) return 2;
    num_files = fsdp_index_num_files(ix);
    num_tensors = fsdp_index_num_tensors(ix);
    world_size = fsdp_index_world_size(ix);
    step = fsdp_index_step(ix);
    epoch = fsdp_index_epoch(ix);
    printf("%s: sharded checkpoint, world size %lld, step %s%lld, epoch %s%lld, %d tensors in %d files\n", dir,
           (long long)(world_size < 0 ? 0 : world_size), step < 0 ? "(none) " : "", (long long)(step < 0 ? 0 : step),
           epoch < 0 ? "(none) " : "", (long long)(epoch < 0 ? 0 : epoch), num_tensors, num_files);
    for (i = 0; i < fsdp_index_num_metadata(ix); i++) {
        fsdp_kv kv = fsdp_index_metadata_at(ix, i);
        printf("  metadata %-20s = %s\n", shown(kv.key), shown(kv.value));
    }
    printf("  %-40s %-5s %-16s  pieces [begin, end) file\n", "tensor", "dtype", "shape");
    referenced = (int *)xcalloc((size_t)num_files, sizeof *referenced);
    for (i = 0; i < num_tensors; i++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        format_shape(shape, sizeof shape, t->ndim, t->shape);
        printf("  %-40s %-5s %-16s ", shown(t->name), dtype_text(t->dtype), shape);
        for (k = 0; k < t->num_pieces; k++) {
            printf(" [%lld, %lld) %s", (long long)t->pieces[k].begin, (long long)t->pieces[k].end,
                   shown(fsdp_index_file(ix, t->pieces[k].file)));
            referenced[t->pieces[k].file] = 1;
        }
        printf("\n");
    }
    printf("shard files:\n");
    for (i = 0; i < num_files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, fsdp_index_file(ix, i));
        if (stat(path, &st) != 0) {
            if (referenced[i]) {
                printf("  BAD  %s: %s, but index.json places pieces in it\n", shown(path), strerror(errno));
                problems++;
            } else {
                printf("  --   %s: not written (its rank held no pieces)\n", shown(path));
            }
            continue;
        }
        problems += inspect_file(path, ix, dir, i, 0, "  ");
    }
    /* each piece is in its file, with the piece's length */
    for (i = 0; i < num_tensors; i++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        for (k = 0; k < t->num_pieces; k++) {
            const fsdp_index_piece *pc = &t->pieces[k];
            fsdp_st_file *f = NULL;
            int found;
            snprintf(path, sizeof path, "%s/%s", dir, fsdp_index_file(ix, pc->file));
            if (fsdp_index_open_file(ix, dir, pc->file, &f, err, sizeof err) != 0) continue; /* reported above */
            found = fsdp_st_find(f, t->name);
            if (found < 0 || fsdp_st_tensor_at(f, found)->numel != pc->end - pc->begin) {
                printf("  BAD  %s does not hold '%s' [%lld, %lld) as index.json says\n", shown(path), shown(t->name), (long long)pc->begin,
                       (long long)pc->end);
                problems++;
            }
            fsdp_st_close(f);
        }
    }
    printf("%s: %s\n", dir, problems ? "PROBLEMS FOUND (see BAD above)" : "all shard files and checksums OK");
    free(referenced);
    fsdp_index_close(ix);
    return problems ? 1 : 0;
}

static int cmd_inspect(int argc, char **argv) {
    struct stat st;
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) { fputs(inspect_help, stdout); return 0; }
    if (argc != 2) { fputs(inspect_help, stderr); return 2; }
    if (stat(argv[1], &st) != 0) die("%s: %s (give a .safetensors file or a sharded checkpoint directory)", argv[1], strerror(errno));
    if (S_ISDIR(st.st_mode)) return inspect_dir(argv[1]);
    {
        source s;
        char err[8192];
        if (source_open(&s, argv[1], NULL, NULL, 0, err, sizeof err) != 0) {
            fprintf(stderr, "ckpt_tool: %s\n", err);
            source_close(&s);
            return 2;
        }
        source_close(&s);
    }
    return inspect_file(argv[1], NULL, NULL, 0, 1, "") ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------
   consolidate: sharded -> one full file
   --------------------------------------------------------------------------------------------- */
static const char consolidate_help[] =
    "usage: ckpt_tool consolidate DIR OUT.safetensors [--dtype f32|bf16|f16] [--params-only]\n"
    "  Joins a sharded checkpoint into one full safetensors file, as fsdp_save_full would write it\n"
    "  (fsdp_load_full and Python's safetensors read it). Every piece's checksum is checked first.\n"
    "  Memory stays small whatever the model: data is streamed in chunks.\n"
    "  --dtype T       store the parameters as T (optimizer state stays f32, as fsdp.h saves it);\n"
    "                  default: the dtype each tensor has in the index\n"
    "  --params-only   leave out optimizer state (<param>.exp_avg, .exp_avg_sq, .momentum_buffer)\n";

static int cmd_consolidate(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    fsdp_dtype want = FSDP_DTYPE_DEFAULT;
    int params_only = 0, i, k, num_specs = 0, num_meta = 0, rc = 0, num_files, num_tensors;
    fsdp_index *ix;
    source *files;
    fsdp_st_spec *specs;
    int *chosen;
    fsdp_kv *meta;
    fsdp_st_writer *w = NULL;
    char err[8192];
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { fputs(consolidate_help, stdout); return 0; }
        if (strcmp(argv[i], "--params-only") == 0) params_only = 1;
        else if (strcmp(argv[i], "--dtype") == 0) {
            if (i + 1 >= argc || !(want = dtype_from_text(argv[++i])))
                die("--dtype takes f32, bf16 or f16 (got '%s')", i < argc ? argv[i] : "nothing");
        } else if (argv[i][0] == '-') die("unknown option '%s' (see ckpt_tool consolidate --help)", argv[i]);
        else if (!dir) dir = argv[i];
        else if (!out) out = argv[i];
        else die("too many arguments (see ckpt_tool consolidate --help)");
    }
    if (!dir || !out) { fputs(consolidate_help, stderr); return 2; }
    if (!(ix = index_open(dir))) return 2;
    num_files = fsdp_index_num_files(ix);
    num_tensors = fsdp_index_num_tensors(ix);

    /* the output's tensors, in index order */
    specs = (fsdp_st_spec *)xcalloc((size_t)num_tensors, sizeof *specs);
    chosen = (int *)xcalloc((size_t)num_tensors, sizeof *chosen);
    for (i = 0; i < num_tensors; i++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        int state = is_optimizer_state(t->name, ix);
        if (params_only && state) continue;
        chosen[num_specs] = i;
        specs[num_specs].name = t->name;
        specs[num_specs].dtype = want && !state ? want : t->dtype;
        specs[num_specs].ndim = t->ndim;
        memcpy(specs[num_specs].shape, t->shape, sizeof t->shape);
        num_specs++;
    }
    /* metadata: the index's, marked as a full checkpoint */
    meta = (fsdp_kv *)xcalloc((size_t)fsdp_index_num_metadata(ix) + 1, sizeof *meta);
    for (i = 0; i < fsdp_index_num_metadata(ix); i++) {
        fsdp_kv kv = fsdp_index_metadata_at(ix, i);
        if (strcmp(kv.key, "format") == 0 || strncmp(kv.key, "crc32c.", 7) == 0 || strcmp(kv.key, "fsdp.kind") == 0) continue;
        meta[num_meta++] = kv;
    }
    meta[num_meta].key = "fsdp.kind";
    meta[num_meta++].value = "full";

    /* check every piece before writing anything */
    files = (source *)xcalloc((size_t)num_files, sizeof *files);
    for (k = 0; k < num_specs && !rc; k++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, chosen[k]);
        for (i = 0; i < t->num_pieces && !rc; i++) {
            source *s = &files[t->pieces[i].file];
            int tensor;
            if (!s->st && (rc = source_open(s, NULL, ix, dir, t->pieces[i].file, err, sizeof err)) != 0) break;
            tensor = fsdp_st_find(s->st, t->name);
            if (tensor < 0 || fsdp_st_tensor_at(s->st, tensor)->numel != t->pieces[i].end - t->pieces[i].begin) {
                snprintf(err, sizeof err, "%s/%s does not hold '%s' [%lld, %lld) as index.json says", dir,
                         shown(fsdp_index_file(ix, t->pieces[i].file)), shown(t->name), (long long)t->pieces[i].begin,
                         (long long)t->pieces[i].end);
                rc = FSDP_ERR_CORRUPT;
            } else {
                rc = source_verify(s, tensor, err, sizeof err);
            }
        }
    }
    if (!rc) rc = fsdp_st_writer_open(&w, out, specs, num_specs, meta, num_meta, err, sizeof err);
    for (k = 0; k < num_specs && !rc; k++) {
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, chosen[k]);
        for (i = 0; i < t->num_pieces && !rc; i++) {
            source *s = &files[t->pieces[i].file];
            rc = copy_elements(s, fsdp_st_find(s->st, t->name), 0, t->pieces[i].end - t->pieces[i].begin, w, specs[k].dtype,
                               err, sizeof err);
        }
    }
    if (w && !rc) rc = fsdp_st_writer_close(w, err, sizeof err);
    else if (w) fsdp_st_writer_abort(w);
    for (i = 0; i < num_files; i++) source_close(&files[i]);
    free(files);
    free(meta);
    free(chosen);
    free(specs);
    if (rc) {
        fprintf(stderr, "ckpt_tool: %s\nckpt_tool: nothing was written to %s\n", err, out);
        fsdp_index_close(ix);
        return 1;
    }
    printf("%s: %d tensors from %s (%d files)%s\n", out, num_specs, dir, num_files, params_only ? ", parameters only" : "");
    fsdp_index_close(ix);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   shard: one full file -> a sharded checkpoint that fsdp_load_sharded loads
   --------------------------------------------------------------------------------------------- */
static const char shard_help[] =
    "usage: ckpt_tool shard FILE.safetensors DIR --nranks N\n"
    "  Splits a full checkpoint into a sharded one for N ranks, FULL_SHARD style: every tensor is cut into\n"
    "  N contiguous pieces of ceil(numel / N) elements (the last ones shorter or empty), rank r's pieces\n"
    "  in DIR/shard-<id>-<r>.safetensors, and DIR/index.json saying where each piece is. fsdp_load_sharded\n"
    "  loads it at any world size. The input's checksums are checked first; data is copied bit for bit.\n"
    "  An older checkpoint in DIR is replaced only once the new one is complete.\n";

/* Appends s to b as a JSON string. */
static void json_put_string(FILE *b, const char *s) {
    fputc('"', b);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(b, "\\%c", c);
        else if (c < 0x20) fprintf(b, "\\u%04x", c);
        else fputc(c, b);
    }
    fputc('"', b);
}

/* One run of ckpt_tool shard: the input, and what its shard files and index.json share. */
typedef struct {
    const char *in, *dir;
    long nranks;
    source s;                 /* the input */
    int count;                /* its tensors */
    fsdp_kv *meta;            /* every shard file's metadata */
    int num_meta;
    char world_text[32];      /* meta's world_size */
    uint32_t id;              /* names this checkpoint's files */
    int *file_of, num_files;  /* rank r's place in index.json's files, or -1 */
    char err[8192];
} shard_job;

/* The flags; -1 to go on, else the exit status (after --help: 0). */
static int shard_parse(shard_job *job, int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { fputs(shard_help, stdout); return 0; }
        if (strcmp(argv[i], "--nranks") == 0) {
            char *end = NULL;
            if (i + 1 >= argc || (job->nranks = strtol(argv[++i], &end, 10)) < 1 || job->nranks > 65536 || *end)
                die("--nranks takes a number of ranks from 1 to 65536 (got '%s')", i < argc ? argv[i] : "nothing");
        } else if (argv[i][0] == '-') die("unknown option '%s' (see ckpt_tool shard --help)", argv[i]);
        else if (!job->in) job->in = argv[i];
        else if (!job->dir) job->dir = argv[i];
        else die("too many arguments (see ckpt_tool shard --help)");
    }
    if (!job->in || !job->dir) { fputs(shard_help, stderr); return 2; }
    if (!job->nranks) die("say how many ranks to shard for: --nranks N (see ckpt_tool shard --help)");
    return -1;
}

/* Metadata of every shard file: the input's, marked as a shard of an N-rank checkpoint. */
static void shard_metadata(shard_job *job) {
    int i;
    job->meta = (fsdp_kv *)xcalloc((size_t)fsdp_st_num_metadata(job->s.st) + 2, sizeof *job->meta);
    job->num_meta = 0;
    for (i = 0; i < fsdp_st_num_metadata(job->s.st); i++) {
        fsdp_kv kv = fsdp_st_metadata_at(job->s.st, i);
        if (strcmp(kv.key, "format") == 0 || strncmp(kv.key, "crc32c.", 7) == 0 || strcmp(kv.key, "fsdp.kind") == 0 ||
            strcmp(kv.key, "world_size") == 0)
            continue;
        job->meta[job->num_meta++] = kv;
    }
    snprintf(job->world_text, sizeof job->world_text, "%ld", job->nranks);
    job->meta[job->num_meta].key = "world_size";
    job->meta[job->num_meta++].value = job->world_text;
    job->meta[job->num_meta].key = "fsdp.kind";
    job->meta[job->num_meta++].value = "shard";
}

/* Rank r's piece [*lo, *hi) of tensor t, FULL_SHARD style (empty if *hi <= *lo). */
static void shard_piece(const shard_job *job, const fsdp_st_tensor *t, int r, int64_t *lo, int64_t *hi) {
    int64_t chunk = (t->numel + job->nranks - 1) / job->nranks;
    *lo = r * chunk, *hi = *lo + chunk < t->numel ? *lo + chunk : t->numel;
}

/* Rank r's file, with its piece of every tensor (specs: room for them all); none if every piece
   is empty, as fsdp_save_sharded does (nor a name in index.json). */
static int shard_write_rank(shard_job *job, int r, fsdp_st_spec *specs) {
    fsdp_st_writer *w = NULL;
    char file_name[64], path[4096];
    int i, n = 0, rc;
    int64_t lo, hi;
    for (i = 0; i < job->count; i++) { /* rank r's piece of each tensor */
        const fsdp_st_tensor *t = fsdp_st_tensor_at(job->s.st, i);
        shard_piece(job, t, r, &lo, &hi);
        if (hi <= lo) continue;
        specs[n].name = t->name;
        specs[n].dtype = t->dtype;
        specs[n].ndim = 1;
        specs[n].shape[0] = hi - lo;
        n++;
    }
    if (n == 0) return 0;
    job->file_of[r] = job->num_files++;
    snprintf(file_name, sizeof file_name, "shard-%08x-%05d.safetensors", (unsigned)job->id, r);
    snprintf(path, sizeof path, "%s/%s", job->dir, file_name);
    if ((rc = fsdp_st_writer_open(&w, path, specs, n, job->meta, job->num_meta, job->err, sizeof job->err)) != 0)
        return rc;
    for (i = 0; i < job->count && !rc; i++) {
        const fsdp_st_tensor *t = fsdp_st_tensor_at(job->s.st, i);
        shard_piece(job, t, r, &lo, &hi);
        if (hi > lo) rc = copy_elements(&job->s, i, lo, hi - lo, w, t->dtype, job->err, sizeof job->err);
    }
    if (!rc) rc = fsdp_st_writer_close(w, job->err, sizeof job->err);
    else fsdp_st_writer_abort(w);
    return rc;
}

/* Every rank's file, under a fresh id, so an older checkpoint in DIR stays whole until
   index.json is replaced. */
static int shard_write_files(shard_job *job) {
    fsdp_st_spec *specs;
    int r, rc = 0;
    job->id = (uint32_t)time(NULL) * 2654435761u ^ (uint32_t)getpid() * 40503u ^ (uint32_t)clock();
    specs = (fsdp_st_spec *)xcalloc((size_t)job->count, sizeof *specs);
    job->file_of = (int *)xcalloc((size_t)job->nranks, sizeof *job->file_of);
    for (r = 0; r < job->nranks; r++) job->file_of[r] = -1;
    for (r = 0; r < job->nranks && !rc; r++) rc = shard_write_rank(job, r, specs);
    free(specs);
    return rc;
}

/* index.json's "tensors": each tensor's dtype, shape and pieces. */
static void shard_index_tensors(const shard_job *job, FILE *index) {
    int i, k, r;
    for (i = 0; i < job->count; i++) {
        const fsdp_st_tensor *t = fsdp_st_tensor_at(job->s.st, i);
        int first = 1;
        if (i) fputc(',', index);
        json_put_string(index, t->name);
        fprintf(index, ":{\"dtype\":\"%s\",\"shape\":[", dtype_text(t->dtype));
        for (k = 0; k < t->ndim; k++) fprintf(index, k ? ",%lld" : "%lld", (long long)t->shape[k]);
        fprintf(index, "],\"pieces\":[");
        for (r = 0; r < job->nranks; r++) {
            int64_t lo, hi;
            shard_piece(job, t, r, &lo, &hi);
            if (hi <= lo) continue;
            fprintf(index, "%s[%d,%lld,%lld]", first ? "" : ",", job->file_of[r], (long long)lo, (long long)hi);
            first = 0;
        }
        fprintf(index, "]}");
    }
}

/* index.json, in the layout fsdp_save_sharded writes: the commit point. */
static int shard_write_index(shard_job *job) {
    char *index_text = NULL, path[4096];
    size_t index_size = 0;
    const char *step = fsdp_st_metadata(job->s.st, "step"), *epoch = fsdp_st_metadata(job->s.st, "epoch");
    FILE *index = open_memstream(&index_text, &index_size);
    int i, r, rc = 0;
    if (!index) { snprintf(job->err, sizeof job->err, "out of memory for index.json"); return FSDP_ERR_OUT_OF_MEMORY; }
    fprintf(index, "{\"format\":\"fsdp.h-sharded\",\"version\":1,\"world_size\":%ld,", job->nranks);
    if (step && strspn(step, "0123456789") == strlen(step) && *step) fprintf(index, "\"step\":%s,", step);
    if (epoch && strspn(epoch, "0123456789") == strlen(epoch) && *epoch) fprintf(index, "\"epoch\":%s,", epoch);
    fprintf(index, "\"metadata\":{");
    for (i = 0; i < job->num_meta; i++) {
        if (i) fputc(',', index);
        json_put_string(index, job->meta[i].key);
        fputc(':', index);
        json_put_string(index, job->meta[i].value);
    }
    fprintf(index, "},\"files\":[");
    for (i = 0, r = 0; r < job->nranks; r++)
        if (job->file_of[r] >= 0) fprintf(index, "%s\"shard-%08x-%05d.safetensors\"", i++ ? "," : "", (unsigned)job->id, r);
    fprintf(index, "],\"tensors\":{");
    shard_index_tensors(job, index);
    fprintf(index, "}}\n");
    if (fclose(index) != 0) { snprintf(job->err, sizeof job->err, "out of memory for index.json"); rc = FSDP_ERR_OUT_OF_MEMORY; }
    snprintf(path, sizeof path, "%s/index.json", job->dir);
    if (!rc) rc = fsdp_write_file_atomic(path, index_text, index_size, job->err, sizeof job->err);
    free(index_text);
    return rc;
}

/* Removes the shard files index.json does not reference: this run's (failed: rc != 0) or
   older checkpoints' (rc 0). */
static void shard_remove_unreferenced(const shard_job *job, int rc) {
    char prefix[32], path[4096];
    DIR *d = opendir(job->dir);
    struct dirent *e;
    snprintf(prefix, sizeof prefix, "shard-%08x-", (unsigned)job->id);
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "shard-", 6) == 0 && (strncmp(e->d_name, prefix, strlen(prefix)) == 0) == (rc != 0)) {
            snprintf(path, sizeof path, "%s/%s", job->dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
}

static int cmd_shard(int argc, char **argv) {
    shard_job shard, *job = &shard;
    int i, rc;
    memset(job, 0, sizeof *job);
    if ((rc = shard_parse(job, argc, argv)) >= 0) return rc;
    if (source_open(&job->s, job->in, NULL, NULL, 0, job->err, sizeof job->err) != 0) die("%s", job->err);
    job->count = fsdp_st_num_tensors(job->s.st);
    for (i = 0; i < job->count; i++)
        if (source_verify(&job->s, i, job->err, sizeof job->err) != 0)
            die("%s (the input is damaged; nothing was written)", job->err);
    if (mkdir(job->dir, 0755) != 0 && errno != EEXIST) die("cannot create %s: %s", job->dir, strerror(errno));
    shard_metadata(job);
    rc = shard_write_files(job);
    if (!rc) rc = shard_write_index(job);
    shard_remove_unreferenced(job, rc);
    free(job->meta);
    free(job->file_of);
    if (rc) fprintf(stderr, "ckpt_tool: %s\nckpt_tool: %s was left as it was\n", job->err, job->dir);
    else printf("%s: %d tensors of %s in %ld shards\n", job->dir, job->count, job->in, job->nranks);
    source_close(&job->s);
    return rc ? 1 : 0;
}

/* ---------------------------------------------------------------------------------------------
   main
   --------------------------------------------------------------------------------------------- */
static const char main_help[] =
    "usage: ckpt_tool COMMAND ...   (ckpt_tool COMMAND --help for each)\n"
    "  inspect FILE|DIR                                     list a checkpoint and verify its checksums\n"
    "  consolidate DIR OUT.safetensors [--dtype T] [--params-only]   sharded -> one full file\n"
    "  shard FILE.safetensors DIR --nranks N                full file -> sharded for N ranks\n";

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(main_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "inspect") == 0) return cmd_inspect(argc - 1, argv + 1);
    if (strcmp(argv[1], "consolidate") == 0) return cmd_consolidate(argc - 1, argv + 1);
    if (strcmp(argv[1], "shard") == 0) return cmd_shard(argc - 1, argv + 1);
    fprintf(stderr, "ckpt_tool: unknown command '%s'\n%s", argv[1], main_help);
    return 2;
}
