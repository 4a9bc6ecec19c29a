/* fsdp.h - v0.1.0 - MIT license - Fully Sharded Data Parallel training for C and C++

   Do this:
       #define FSDP_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.

       // i.e. it should look like this:
       #include ...
       #define FSDP_IMPLEMENTATION
       #include "fsdp.h"

   Build and link, e.g.:
       cc -std=c99 -O2 train.c -o train -lpthread -lm             (add -lrt on glibc before 2.17)
       mpicc -std=c99 -O2 -DFSDP_WITH_MPI train.c -o train -lpthread -lm   (the MPI bridge)

   The implementation needs POSIX 2008 plus the common extensions (_DEFAULT_SOURCE). It defines
   _GNU_SOURCE itself when fsdp.h comes before every system header. If your file includes
   system headers first and compiles in strict ISO mode (-std=c99, -std=c11), put
   #define _GNU_SOURCE at the very top of that file or pass -D_GNU_SOURCE; a compile-time check
   says so if you forget. With the compilers' default GNU modes either order works.

   WHAT IT IS
       PyTorch-FSDP semantics for hand-written C training code: parameters, gradients and optimizer
       state are sharded across ranks (processes on one machine or many), gathered just before
       use and reduced and resharded right after. You describe the model (modules, parameters,
       init rules), a wrap policy cuts it into units, and you call four hooks at module
       boundaries; a comm thread gathers and reduces behind your compute; fsdp_step updates each
       rank's shard. Checkpoints are safetensors files. Underneath: dtypes, a pluggable
       collective interface with shared-memory, TCP-socket and MPI implementations,
       environment-driven initialisation (torchrun, SLURM, Open MPI) and a local launcher.

   QUICK EXAMPLE (examples/mlp.c and examples/gpt.c are complete programs)
       static int train(fsdp_comm *comm, void *arg) {
           fsdp_model *m; fsdp_ctx *ctx; fsdp_desc d; memset(&d, 0, sizeof d);
           fsdp_init_rule init = {.kind = FSDP_INIT_NORMAL, .a = 0.0f, .b = 0.02f};
           int64_t shape[2] = {512, 256};
           fsdp_model_create(&m, "Net");
           int fc = fsdp_model_module(m, 0, "fc", "Linear");
           int w = fsdp_model_param(m, fc, "weight", 2, shape, init);
           (void)arg;
           d.comm = comm;                                    // FULL_SHARD, SGD by default
           if (fsdp_init(&ctx, m, &d)) { fprintf(stderr, "%s\n", fsdp_last_error(NULL)); return 1; }
           for (int step = 0; step < 100; step++) {
               fsdp_pre_forward(ctx, fc);
               const float *weight = fsdp_param(ctx, w);     // your forward reads it
               fsdp_post_forward(ctx, fc);
               fsdp_pre_backward(ctx, fc);
               float *dweight = fsdp_grad(ctx, w);           // your backward adds into it
               dweight[0] += weight[0];
               fsdp_post_backward(ctx, fc);
               fsdp_step(ctx, 1.0f, NULL);  // clip to norm 1, update this rank's shard
               fsdp_zero_grad(ctx);
           }
           fsdp_save_full(ctx, "net.safetensors", NULL);
           fsdp_destroy(ctx); fsdp_model_destroy(m);
           return 0;
       }
       int main(void) { return fsdp_launch(4, train, NULL) == FSDP_SUCCESS ? 0 : 1; }

   TABLE OF CONTENTS (grep for the marker: the declarations, then the implementation)
       >>config        version, linkage, allocator, result codes, logging
       >>utilities     time, sleeping, strings for display, small parsers
       >>chaos         perturbation for the tests (FSDP_CHAOS): random delays, yields, short socket pieces
       >>dtypes        f32 / bf16 / f16 conversions, rank-order reductions
       >>wire          wire formats: f32, bf16, f16, int8 and int4 with block scales; kernels
       >>auth          SHA-256, HMAC, PBKDF2 (the job's key), wiping, random bytes, the secret file
       >>collectives   fsdp_comm, its ops and the backend contract; spins, shared memory, topology
       >>shm           shared-memory backend (processes on one host)
       >>socket        TCP backend (processes on one or many hosts): rendezvous, handshake, phases
       >>hier          a socket world over hosts: shared memory inside, sockets between
       >>mpi           MPI bridge (compiled with FSDP_WITH_MPI)
       >>backends      the table of backends; fsdp_comm_init, fsdp_comm_split
       >>qcomm         collectives built from the others: the quantized two-level reduce-scatter
       >>env           fsdp_comm_init_from_env: torchrun, SLURM, Open MPI conventions
       >>model         modules, parameters, counter-based initialisation
       >>wrap          wrap policies: which modules become units
       >>optimizer     the optimizer table: SGD, Adam, AdamW, yours
       >>offload       the tier below RAM: files on local disk, an I/O thread
       >>recovery      surviving a lost replica (HYBRID_SHARD): membership epochs, the agreement
       >>runtime       fsdp_ctx: flat parameters, hooks, comm thread, strategies, the step
       >>memory        memory statistics and the estimator
       >>json          JSON parsing and writing
       >>trace         per-rank Chrome trace files: events, their buffer, clock alignment
       >>safetensors   safetensors files: checksums, reading, writing, atomic replacement
       >>checkpoint    full and sharded checkpoints, index.json
       >>launcher      fsdp_launch: fork N local ranks joined by shared memory

   CONFIGURATION (define before including fsdp.h)
       FSDP_IMPLEMENTATION  in one file: compile the implementation there
       FSDP_STATIC          every function static (a private copy per file that defines
                            FSDP_IMPLEMENTATION)
       FSDP_API             the linkage of the public functions (default extern; static with
                            FSDP_STATIC)
       FSDP_MALLOC(size) FSDP_REALLOC(ptr, size) FSDP_FREE(ptr)
                            the allocator: define all three or none (default malloc, realloc, free)
       FSDP_ASSERT(cond)    checks of internal invariants (default assert)
       FSDP_ABORT_ON_MISUSE abort, printing the message on stderr, at every misuse of a context
                            (fsdp_param or fsdp_grad outside their unit's hooks, hooks out of
                            order), as FSDP_DEBUG >= 1 does at run time; without it misuse
                            returns NULL or FSDP_ERR_STATE and logs one warning per context
       FSDP_WITH_MPI        build the MPI bridge (needs <mpi.h>: compile with mpicc)
       FSDP_CHAOS           compile in the perturbation of >>chaos, for tests only (make test-chaos):
                            random delays, yields, reorderings and short socket pieces where timing
                            could leak into results, turned on by FSDP_CHAOS_SEED

   ENVIRONMENT (read by fsdp_comm_init_from_env, fsdp_launch and the backends)
       FSDP_BACKEND          shm | socket | mpi; default: mpi under an MPI launcher (when built
                             with it), shm when every rank is on this host, else socket
       FSDP_TIMEOUT_MS       bound on every wait for another rank (default 600000 = 10 minutes)
       FSDP_JOB              job token: ranks with different tokens refuse to talk to each other
                             (default: the launcher's job id, else port-<MASTER_PORT>)
       FSDP_SECRET_FILE      a file holding the job's shared secret (mode 0600 or stricter; the
                             same secret on every rank): every connection proves knowledge of it
                             (HMAC-SHA256 challenge-response under a PBKDF2-stretched key); never
                             sent. Without one, only this user's processes on this host may join
                             (other hosts: a warning)
       FSDP_SECRET           the secret itself, instead of FSDP_SECRET_FILE (read once, then
                             wiped and removed from the environment: later children do not get it)
       FSDP_DEBUG            unset: warnings to stderr; 0: silent; 1: also errors; 2: also info;
                             3: also debug (for objects made from the environment or by fsdp_launch).
                             From 1, also: every context (read at fsdp_init) aborts the process at
                             a misuse, printing its message on stderr: fsdp_param, fsdp_param_raw
                             or fsdp_grad outside their unit's hooks, a hook out of order
                             (FSDP_ABORT_ON_MISUSE does it at compile time)
       FSDP_SPIN             0: waits never spin; 1: they spin 50 us before yielding; unset: they
                             spin while every rank of the job on this host can have a core of
                             those its affinity mask allows (shm: never on a peer last seen on
                             the waiter's own CPU)
       FSDP_SHM_SINGLE_COPY  1: peers read large buffers straight from each other's memory
                             (process_vm_readv), init fails if they cannot; auto: where they can;
                             0: staged through the segment; unset: where they can, for all_gather
                             blocks of 64 KiB and broadcasts of 256 KiB, up to 512 KiB
                             (fsdp_comm_desc.shm_single_copy)
       FSDP_HIERARCHICAL     0: a socket world over hosts stays flat (every byte over sockets)
       FSDP_HIER_STEP_MIB    pipeline step of large ops over hosts in MiB, 0..1024 (default 2;
                             0: one step per op); the ranks take the smallest any asks for
       FSDP_RESTART_COUNT    set by fsdp_launch for its ranks: the attempt, 0 first (max_restarts)
       FSDP_OFFLOAD_DIR      where offloaded state goes when fsdp_desc.offload.dir is NULL (a
                             directory on a local disk; every rank keeps one unlinked file there)
       FSDP_TRACE            a directory: every rank writes its Chrome trace there when
                             fsdp_desc.trace_dir is NULL (>>trace); set it on every rank or none
       FSDP_CHAOS_SEED       builds with FSDP_CHAOS only: N > 0 perturbs this process's timing, N
                             choosing how (>>chaos); unset or 0: no perturbation
       RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT      (torchrun)
       TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_USE_AGENT_STORE (torchrun: the
                             job token, and rank 0's address in the agent's store)
       SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_JOB_ID SLURM_STEP_ID       (SLURM)
       OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
       OMPI_COMM_WORLD_LOCAL_SIZE                                               (Open MPI)
       PMI_RANK PMI_SIZE                                                        (MPICH, PMI)

   LICENSE
       See the end of the file.
*/

/* ============================================================================================
   >>config
   ============================================================================================ */
#ifndef FSDP_H_INCLUDE
#define FSDP_H_INCLUDE

/* The implementation needs POSIX plus the common extensions (MAP_ANONYMOUS, syscall). This
   only takes effect when fsdp.h comes before any system header; see the top comment. */
#if defined(FSDP_IMPLEMENTATION) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#  define _GNU_SOURCE
#endif

#include <stddef.h>
#include <stdint.h>

#define FSDP_VERSION_MAJOR 0
#define FSDP_VERSION_MINOR 1
#define FSDP_VERSION_PATCH 0
#define FSDP_VERSION_STRING "0.1.0"

#ifndef FSDP_API
#  if defined(FSDP_STATIC) && (defined(__GNUC__) || defined(__clang__))
#    define FSDP_API static __attribute__((unused)) /* private copy per file; unused is fine */
#  elif defined(FSDP_STATIC)
#    define FSDP_API static
#  else
#    define FSDP_API extern
#  endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes. 0 is success; errors are negative and grouped by area. Every function that can
   fail returns one of these; fsdp_result_description() gives the sentence, and the object the
   call was made on (fsdp_comm_last_error) holds the specific message naming what was at fault. */
#define FSDP_RESULT_LIST(X) \
    X(FSDP_SUCCESS,           0, "success") \
    X(FSDP_ERR_INVALID_ARG,  -1, "invalid argument") \
    X(FSDP_ERR_OUT_OF_MEMORY,-2, "out of memory") \
    X(FSDP_ERR_STATE,        -3, "call made in the wrong state or order") \
    X(FSDP_ERR_UNSUPPORTED,  -4, "not supported by this build or backend") \
    X(FSDP_ERR_IO,           -5, "input/output error") \
    X(FSDP_ERR_CORRUPT,      -6, "corrupt or malformed data") \
    X(FSDP_ERR_SYSTEM,       -7, "operating system call failed") \
    X(FSDP_ERR_ENV,          -8, "missing or malformed environment variable") \
    X(FSDP_ERR_INCOMPATIBLE, -9, "checkpoint does not match the model") \
    X(FSDP_ERR_TIMEOUT,     -20, "timed out waiting for another rank") \
    X(FSDP_ERR_MISMATCH,    -21, "ranks called different collectives") \
    X(FSDP_ERR_PEER_LOST,   -22, "another rank died or closed its connection") \
    X(FSDP_ERR_ABORTED,     -23, "communicator aborted after an earlier failure") \
    X(FSDP_ERR_REJECTED,    -24, "peer rejected: wrong job, protocol version or world size") \
    X(FSDP_ERR_NO_SPACE,    -25, "not enough shared memory") \
    X(FSDP_ERR_PROTOCOL,    -26, "malformed message from a peer") \
    X(FSDP_ERR_RANK_FAILED, -27, "a launched rank crashed or exited with an error")

typedef enum fsdp_result {
#define FSDP__RESULT_ENUM(name, value, text) name = value,
    FSDP_RESULT_LIST(FSDP__RESULT_ENUM)
#undef FSDP__RESULT_ENUM
    FSDP_RESULT_FORCE_INT = 0x7fffffff
} fsdp_result;

/* The sentence for a result code ("timed out waiting for another rank"); never NULL. */
FSDP_API const char *fsdp_result_description(int result);
/* The enum name for a result code ("FSDP_ERR_TIMEOUT"); never NULL. */
FSDP_API const char *fsdp_result_name(int result);
/* "0.1.0" */
FSDP_API const char *fsdp_version_string(void);

/* Logging. The library is silent unless you give it a logger; the objects made by
   fsdp_comm_init_from_env and fsdp_launch log warnings to stderr unless FSDP_DEBUG says
   otherwise (see ENVIRONMENT at the top). */
typedef enum fsdp_log_level {
    FSDP_LOG_DEFAULT = 0, /* in a threshold: FSDP_LOG_WARN */
    FSDP_LOG_ERROR = 1,
    FSDP_LOG_WARN = 2,
    FSDP_LOG_INFO = 3,
    FSDP_LOG_DEBUG = 4
} fsdp_log_level;

typedef void (*fsdp_log_fn)(void *user, fsdp_log_level level, const char *message);

typedef struct fsdp_logger {
    fsdp_log_fn fn;          /* NULL: silent */
    void *user;
    fsdp_log_level max_level; /* messages above this level are dropped; 0 means FSDP_LOG_WARN */
} fsdp_logger;

/* A ready-made logger function: "fsdp: error: <message>" lines on stderr. */
FSDP_API void fsdp_log_stderr(void *user, fsdp_log_level level, const char *message);

/* ============================================================================================
   >>utilities
   ============================================================================================ */
/* Monotonic time in seconds. */
FSDP_API double fsdp_now(void);
/* Copies src into dst (size bytes, always terminated) for display: printable ASCII and
   well-formed UTF-8 pass, every other byte (control characters and so terminal escape
   sequences, broken UTF-8) shows as \xNN; what does not fit ends in "...". For names and
   metadata read from files before printing them. Returns dst. */
FSDP_API const char *fsdp_printable(char *dst, size_t size, const char *src);

/* ============================================================================================
   >>dtypes
   ============================================================================================ */
typedef enum fsdp_dtype {
    FSDP_DTYPE_DEFAULT = 0, /* where a default makes sense: FSDP_F32 */
    FSDP_F32 = 1,
    FSDP_BF16 = 2,
    FSDP_F16 = 3
} fsdp_dtype;

FSDP_API size_t fsdp_dtype_size(fsdp_dtype dtype);      /* 4, 2, 2; 0 for an invalid dtype */
FSDP_API const char *fsdp_dtype_name(fsdp_dtype dtype); /* "f32", "bf16", "f16", "invalid" */

/* Conversions. To the 16-bit types: round to nearest, ties to even; overflow gives infinity;
   NaN stays NaN (quiet, sign kept); f16 subnormals are produced and read exactly. */
FSDP_API uint16_t fsdp_f32_to_bf16(float value);
FSDP_API float fsdp_bf16_to_f32(uint16_t value);
FSDP_API uint16_t fsdp_f32_to_f16(float value);
FSDP_API float fsdp_f16_to_f32(uint16_t value);
/* Converts count elements; dst and src may be the same buffer only when the dtypes match. */
FSDP_API void fsdp_convert(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_dtype src_dtype,
                           size_t count);

/* ============================================================================================
   >>wire
   ============================================================================================ */
/* What a copy of f32 values looks like on a link: its dtype, or codes of 8 or 4 bits with one
   f32 scale per block of K elements (symmetric block quantization, as DeepSpeed ZeRO++'s
   quantized weights and gradients). Only copies travel so: masters, optimizer state and
   checkpoints stay f32. The layout and the arithmetic, exact to the bit, are documented where
   the implementation's >>wire section begins. The float wires share their fsdp_dtype's value. */
typedef enum fsdp_wire {
    FSDP_WIRE_DEFAULT = 0, /* where a dtype is known (what a unit gathers or reduces): that dtype */
    FSDP_WIRE_F32 = 1,
    FSDP_WIRE_BF16 = 2,
    FSDP_WIRE_F16 = 3,
    FSDP_WIRE_INT8 = 4,    /* codes in [-127, 127]: 1 byte per element + 4 per block */
    FSDP_WIRE_INT4 = 5     /* codes in [-7, 7]: half a byte per element + 4 per block */
} fsdp_wire;

/* "default", "f32", "bf16", "f16", "int8", "int4"; "invalid" for any other value. */
FSDP_API const char *fsdp_wire_name(fsdp_wire wire);
/* The bytes count elements take on the wire with blocks of block elements (0: the default, 128;
   else a multiple of 8 in [8, 4096]; the float wires ignore it): 4 * ceil(count / block) +
   ceil(count * bits / 8) for int8 and int4, a function of count and block alone. 0 for an invalid
   wire or block (FSDP_WIRE_DEFAULT names no format by itself) or a count beyond SIZE_MAX / 8. */
FSDP_API size_t fsdp_wire_bytes(fsdp_wire wire, size_t count, size_t block);
/* Encodes count f32 values from src into dst (fsdp_wire_bytes(wire, count, block) bytes).
   first_nonfinite (may be NULL) receives the index of the first NaN or infinity for int8 and
   int4, whose block then decodes to NaN (a step can skip it as a non-finite gradient), and count
   if there is none or the wire is a float one (f32, bf16 and f16 carry such values as they are).
   Returns FSDP_SUCCESS, or FSDP_ERR_INVALID_ARG for an invalid wire or block or a NULL buffer
   (with count > 0). Thread-safe; the buffers must not overlap. */
FSDP_API int fsdp_wire_encode(void *dst, fsdp_wire wire, size_t block, const float *src, size_t count,
                              size_t *first_nonfinite);
/* Decodes count elements encoded as fsdp_wire_encode(.., wire, block, ..) into dst as dst_dtype
   (f32, or rounded to nearest even to bf16 or f16). Returns FSDP_SUCCESS, or FSDP_ERR_INVALID_ARG
   (invalid wire, block or dtype, a NULL buffer with count > 0). Thread-safe; no overlap. */
FSDP_API int fsdp_wire_decode(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_wire wire, size_t block,
                              size_t count);

/* ============================================================================================
   >>collectives
   ============================================================================================ */
typedef struct fsdp_comm fsdp_comm;

typedef enum fsdp_reduce_op {
    FSDP_REDUCE_DEFAULT = 0, /* FSDP_SUM */
    FSDP_SUM = 1,
    FSDP_AVG = 2,            /* sum, then divided by the number of ranks, in fp32 */
    FSDP_MAX = 3             /* NaN wins, as in torch.max */
} fsdp_reduce_op;

typedef enum fsdp_coll_kind {
    FSDP_COLL_NONE = 0,
    FSDP_COLL_ALL_GATHER = 1,
    FSDP_COLL_REDUCE_SCATTER = 2,
    FSDP_COLL_ALL_REDUCE = 3,
    FSDP_COLL_BROADCAST = 4,
    FSDP_COLL_BARRIER = 5,
    FSDP_COLL_ALL_TO_ALL = 6
} fsdp_coll_kind;

typedef enum fsdp_backend_kind {
    FSDP_BACKEND_DEFAULT = 0, /* fsdp_comm_init: shm; fsdp_comm_init_from_env: see there */
    FSDP_BACKEND_SHM = 1,
    FSDP_BACKEND_SOCKET = 2,
    FSDP_BACKEND_MPI = 3,
    FSDP_BACKEND_USER = 4     /* desc.user_backend */
} fsdp_backend_kind;

FSDP_API const char *fsdp_backend_name(fsdp_backend_kind kind); /* "shm", "socket", ... */
FSDP_API const char *fsdp_coll_name(fsdp_coll_kind kind);       /* "all_gather", ... */

/* One collective call, as the backend receives it. Counts are in elements.
     all_gather:      send holds count elements; recv holds world*count, rank r's at r*count.
                      In place when send == recv + rank*count.
     reduce_scatter:  send holds world*count; recv gets count (this rank's slice, rank*count).
                      In place when recv == send + rank*count.
     all_reduce:      send and recv hold count; in place when send == recv.
     broadcast:       recv holds count on every rank; root's is sent, send is unused.
     barrier:         no data.
     all_to_all:      send holds world*count, the piece for rank r at r*count; recv gets
                      world*count, rank r's piece for this rank at r*count. Not in place (send
                      and recv must not overlap).
   The fingerprint (seq, kind, count, dtype, op, root) must agree across ranks. */
typedef struct fsdp_coll {
    fsdp_coll_kind kind;
    fsdp_dtype dtype;
    fsdp_reduce_op op;
    int root;
    size_t count;
    const void *send;
    void *recv;
    uint64_t seq;       /* 1 for the first collective of a communicator, then +1 per call */
    uint32_t tag;       /* caller's label, part of the fingerprint (the FSDP runtime: the unit) */
    int timeout_ms;     /* bound on any single wait for another rank */
} fsdp_coll;

/* A sub-communicator being made from a user backend's comm (fsdp_comm_split): who is in it.
   Ranks of one color form it, numbered by (key, parent rank), as MPI_Comm_split and
   ncclCommSplit number them. */
typedef struct fsdp_split_info {
    int color, key;          /* as given to fsdp_comm_split */
    int rank, world_size;    /* this rank in the new comm, and its size */
    const int *parent_ranks; /* [world_size]: the parent rank of each new rank */
} fsdp_split_info;

/* The backend contract. Fill this table to plug in another engine (NCCL, Gloo, your own).
   Every function receives the communicator (for fsdp_comm_rank/size and fsdp_comm_fail) and the
   impl pointer you passed in fsdp_comm_desc.user_impl.
     - Every rank calls the same ops in the same order (the library checks this; see
       check_fingerprints below). An op returns FSDP_SUCCESS or the result of
       fsdp_comm_fail(comm, code, "message naming the peer"), which also poisons the comm.
     - Reductions must add contributions in rank order, ((x0 + x1) + x2) + ..., accumulating
       bf16/f16 in fp32 and rounding once, if results are to be bitwise equal to the shipped
       backends. fsdp_reduce_ranks() does exactly this for you.
     - No op may wait longer than c->timeout_ms for another rank without failing.
     - abort is called at most once, possibly from another thread, when the comm is poisoned: it
       must make pending and later ops on every rank fail quickly (close connections, set a
       shared flag). destroy releases everything; it is called once, after all ops returned.
   check_fingerprints: if nonzero, the library all-gathers each op's fingerprint with your
   all_gather (as bytes) before the op and fails with FSDP_ERR_MISMATCH on disagreement. Set it
   unless your engine checks fingerprints itself.
   all_to_all (optional, the last field): NULL makes the library emulate it with your
   all_gather, exactly (bytes are only copied) but at a price: in world - 1 rounds, round k
   gathering every rank's piece for the rank k places after it (count elements from every rank,
   of which a rank keeps one), so every rank receives world - 1 times the bytes an all-to-all
   brings and waits world - 1 times, through a scratch of world * count elements. Fill it in
   where those bytes matter (NCCL: grouped ncclSend/ncclRecv; MPI: MPI_Alltoall).
   split (optional): makes the impl of a sub-communicator (fsdp_comm_split, and so HYBRID_SHARD's
   shard and replica groups). Collective: every rank of the parent calls it once, after the
   library agreed on the members; store the new impl in *child_impl. The new comm uses this same
   table, and destroy releases the child's impl when the child is destroyed. NULL: such comms
   cannot be split (fsdp_comm_split fails with FSDP_ERR_UNSUPPORTED).
   Initialise tables by field name (C99 designated initialisers), so that fields added later
   stay zero. */
typedef struct fsdp_backend {
    const char *name;
    int (*all_gather)(fsdp_comm *comm, void *impl, const fsdp_coll *c);
    int (*reduce_scatter)(fsdp_comm *comm, void *impl, const fsdp_coll *c);
    int (*all_reduce)(fsdp_comm *comm, void *impl, const fsdp_coll *c);
    int (*broadcast)(fsdp_comm *comm, void *impl, const fsdp_coll *c);
    int (*barrier)(fsdp_comm *comm, void *impl, const fsdp_coll *c);
    void (*abort)(fsdp_comm *comm, void *impl);
    void (*destroy)(fsdp_comm *comm, void *impl);
    int check_fingerprints;
    int (*split)(fsdp_comm *parent, void *impl, const fsdp_split_info *info, void **child_impl);
    int (*all_to_all)(fsdp_comm *comm, void *impl, const fsdp_coll *c);
} fsdp_backend;

/* Zero-initialise and set what you need; 0 / NULL fields take the defaults named here. */
typedef struct fsdp_comm_desc {
    fsdp_backend_kind backend;  /* default FSDP_BACKEND_SHM */
    int rank;                   /* this process's rank, 0 <= rank < world_size */
    int world_size;             /* number of ranks, >= 1 */
    int local_rank;             /* user backends: rank among the processes on this host; the */
    int local_world_size;       /*   shipped backends learn both from facts (fsdp_comm_local_size) */
    const char *job;            /* job token; ranks of different jobs refuse each other; default "fsdp" */
    const char *secret;         /* shared secret, the same on every rank (FSDP_SECRET_FILE). Every
                                   socket connection proves knowledge of it by HMAC-SHA256
                                   challenge-response under a PBKDF2-stretched key (it never
                                   crosses the wire). NULL: none; then a peer on this host must be
                                   a process of this user, and anyone on another host who reaches
                                   the ports can join (rank 0 warns when it listens off loopback) */
    int timeout_ms;             /* bound on every wait; 0: FSDP_TIMEOUT_MS or 600000 */
    fsdp_logger logger;         /* default silent */
    /* socket backend */
    const char *master_addr;    /* rank 0's address (name or IP); default "127.0.0.1" */
    int master_port;            /* rank 0's listening port; required for socket */
    const char *store_key;      /* set: master_addr:master_port is torch's TCPStore (torchrun's agent
                                   store, which holds MASTER_PORT); rank 0 listens on a port of its
                                   own and publishes "ip:port" there under this key, and the other
                                   ranks read it (fsdp_comm_init_from_env sets it under torchrun) */
    /* shm backend */
    size_t shm_slot_bytes;      /* staging bytes per rank and slot; default 1 MiB */
    int shm_single_copy;        /* peers read large ordinary buffers straight from each other's
                                   memory (process_vm_readv: one copy by the reader instead of the
                                   owner's and the reader's, pipelined): 0 as FSDP_SHM_SINGLE_COPY
                                   says ("0": never; "auto": where the ranks can; "1": required;
                                   unset: where the ranks can, for all_gather and broadcast
                                   (a rank's block from 64 KiB, the root's buffer from 256 KiB,
                                   up to 512 KiB), where staging is at the mercy of slow
                                   cache-line hand-over), 1 required (init fails if the ranks
                                   cannot), 2 where they can, -1 never (BENCHMARKS.md, section 2) */
    /* FSDP_BACKEND_USER */
    const fsdp_backend *user_backend;
    void *user_impl;
} fsdp_comm_desc;

/* Creates a communicator. Collective: every rank of the job calls it with the same world_size
   and job, and it returns when all of them have joined (or fails after timeout_ms, naming the
   ranks that did not come). *out is NULL on failure; if init fails early, the message went
   to the logger. */
FSDP_API int fsdp_comm_init(fsdp_comm **out, const fsdp_comm_desc *desc);

/* Reads rank, world size, backend and addresses from the environment (see ENVIRONMENT at the
   top; FSDP_BACKEND selects, otherwise mpi under an MPI launcher when built with FSDP_WITH_MPI,
   shm when every rank is on this host (LOCAL_WORLD_SIZE == WORLD_SIZE), else socket).
   Fields set in defaults (may be NULL) take precedence over nothing but fill what the
   environment leaves unset (timeout, logger, slot size). A missing or malformed variable
   returns FSDP_ERR_ENV and the message (to the logger and to errbuf, if given) names it. */
FSDP_API int fsdp_comm_init_from_env(fsdp_comm **out, const fsdp_comm_desc *defaults,
                                     char *errbuf, size_t errbuf_size);

/* Releases the communicator. Not collective; safe after a failure. */
FSDP_API void fsdp_comm_destroy(fsdp_comm *comm);

FSDP_API int fsdp_comm_rank(const fsdp_comm *comm);
FSDP_API int fsdp_comm_size(const fsdp_comm *comm);
/* This rank's index among the comm's ranks on its host, and how many those are. A host is what
   can share memory: same host name, boot, /dev/shm and network namespace (learned at init;
   LOCAL_WORLD_SIZE is not trusted). User backends report what their description said. */
FSDP_API int fsdp_comm_local_rank(const fsdp_comm *comm);
FSDP_API int fsdp_comm_local_size(const fsdp_comm *comm);
/* How many hosts the comm's ranks are on, and which of them (0..) rank `rank` is on: hosts
   are numbered in the order of their lowest rank. -1 where unknown (user backends). */
FSDP_API int fsdp_comm_num_hosts(const fsdp_comm *comm);
FSDP_API int fsdp_comm_host_of(const fsdp_comm *comm, int rank);
/* 1 if reductions fold each host's ranks first (in rank order) and then the hosts (in host
   order), as on ranks over several hosts, several on some, numbered host by host (socket:
   shared memory inside hosts; mpi: the same order); 0 if they fold all ranks in rank order. */
FSDP_API int fsdp_comm_hierarchical(const fsdp_comm *comm);
FSDP_API fsdp_backend_kind fsdp_comm_backend(const fsdp_comm *comm);
/* What carries the ops: "shm", "socket", "socket+shm" (a socket world over several hosts:
   shared memory inside each host, sockets between them), "mpi", or a user backend's name. */
FSDP_API const char *fsdp_comm_transport(const fsdp_comm *comm);
/* 1 if the comm's waits spin briefly before they yield and sleep: when every rank of the job on
   this host (of the comm it was split from too) can have a core of those the process may run
   on (sched_getaffinity), or FSDP_SPIN=1; never with FSDP_SPIN=0. 0 for comms with nothing to
   wait for (one rank), MPI and user backends. Even so a shm wait does not spin on a peer that
   last published from the CPU the waiter runs on. */
FSDP_API int fsdp_comm_spins(const fsdp_comm *comm);
FSDP_API void fsdp_comm_set_timeout(fsdp_comm *comm, int timeout_ms); /* <= 0: default */
FSDP_API int fsdp_comm_timeout(const fsdp_comm *comm);

/* The collectives. Parameters as in fsdp_coll above; counts are per rank except for
   all_reduce and broadcast. Return Value: FSDP_SUCCESS, or an error after which the comm is
   poisoned: this and every later op on every rank fails fast (FSDP_ERR_ABORTED) and
   fsdp_comm_last_error() says what happened first, naming the rank or peer.
   Thread Safety: one thread at a time per communicator (fsdp_comm_abort excepted). */
FSDP_API int fsdp_all_gather(fsdp_comm *comm, const void *send, void *recv, size_t count,
                             fsdp_dtype dtype);
FSDP_API int fsdp_reduce_scatter(fsdp_comm *comm, const void *send, void *recv, size_t count,
                                 fsdp_dtype dtype, fsdp_reduce_op op);
FSDP_API int fsdp_all_reduce(fsdp_comm *comm, const void *send, void *recv, size_t count,
                             fsdp_dtype dtype, fsdp_reduce_op op);
FSDP_API int fsdp_broadcast(fsdp_comm *comm, void *buf, size_t count, fsdp_dtype dtype, int root);
FSDP_API int fsdp_barrier(fsdp_comm *comm);
/* Every rank sends count elements to every rank: send holds world * count elements, the piece
   for rank r at r * count; recv receives world * count, rank r's piece for this rank at
   r * count (this rank's own piece copied). Bytes are copied, never converted. Not in place:
   send and recv must not overlap (FSDP_ERR_INVALID_ARG). count must agree across ranks
   (FSDP_ERR_MISMATCH otherwise, as for every op). */
FSDP_API int fsdp_all_to_all(fsdp_comm *comm, const void *send, void *recv, size_t count, fsdp_dtype dtype);

/* Poisons the communicator from any thread: pending and later ops on every rank fail. */
FSDP_API void fsdp_comm_abort(fsdp_comm *comm, const char *why);
/* The first failure's message ("" while healthy). Valid until the comm is destroyed.
   With NULL: why the last fsdp_comm_init, fsdp_comm_init_from_env or fsdp_comm_split on this
   thread failed. */
FSDP_API const char *fsdp_comm_last_error(const fsdp_comm *comm);
/* The first failure's code (FSDP_SUCCESS while healthy). */
FSDP_API int fsdp_comm_status(const fsdp_comm *comm);

/* What this rank sent through a communicator and every comm made from it (fsdp_comm_split's,
   HYBRID_SHARD's groups, a hierarchical world's shared-memory part) since it was made, counted
   where the bytes leave: the ops' payload, the ops fsdp.h runs on the comm for itself included
   (learning the hosts, agreeing on a split); not the frames' headers on sockets, nor the
   connection handshakes of init. For the same calls, sizes and layout, the same numbers on every
   run. A byte is counted once each time it is handed over:
     bytes_sent_net:  written to a socket whose peer is on another host (fsdp_comm_host_of).
     bytes_sent_host: written to a socket whose peer is on this host, or put where the peers on
                      shared memory read it (copied into this rank's staging slots, or offered in
                      place from fsdp_comm_alloc memory or from this process, which the peers
                      read): once per op, however many peers read it. On shm with P ranks and B
                      bytes (all_gather's send, reduce_scatter's recv, all_reduce's and
                      broadcast's buffer, a block of all_to_all): all_gather B, reduce_scatter
                      and all_to_all (P - 1) B, all_reduce B, broadcast B on the root and 0
                      elsewhere, barrier 0.
     ops:             collectives called on the comm and on the comms split from it (not the
                      inner ops of a hierarchical world).
   MPI and user backends count ops, not bytes (what their engine moves is its own).
   Thread Safety: any thread, any time (the counters are atomic). */
typedef struct fsdp_comm_stats {
    uint64_t bytes_sent_host;
    uint64_t bytes_sent_net;
    uint64_t ops;
} fsdp_comm_stats;

/* Fills *out (zeroed first). Return Value: FSDP_SUCCESS; FSDP_ERR_INVALID_ARG for NULL. */
FSDP_API int fsdp_comm_stats_get(const fsdp_comm *comm, fsdp_comm_stats *out);

/* For backends: records the first failure (code and printf-style message), poisons the comm,
   calls the backend's abort once, logs, and returns code. Later calls keep the first message. */
FSDP_API int fsdp_comm_fail(fsdp_comm *comm, int code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* For backends: reduces nsrc inputs (each count elements of dtype) into dst in the library's
   canonical order: ((src[0] + src[1]) + src[2]) + ..., fp32 accumulation, one rounding.
   dst may alias src[0]. For FSDP_AVG pass the divisor (the world size) in avg_divisor. */
FSDP_API void fsdp_reduce_ranks(void *dst, const void *const *srcs, int nsrc, size_t count,
                                fsdp_dtype dtype, fsdp_reduce_op op, int avg_divisor);

/* Splits a communicator: ranks that pass the same color form a new communicator, ordered by
   key (then by parent rank). Collective over the parent. The new comm uses the parent's
   backend, set up through the parent (shm segments, socket rendezvous, MPI_Comm_split, a user
   backend's split), except that members who all share one host talk through shared memory
   whatever the parent's transport (socket and mpi parents). FSDP_ERR_UNSUPPORTED for a user
   backend without split. */
FSDP_API int fsdp_comm_split(fsdp_comm *parent, int color, int key, fsdp_comm **out);

/* Memory that peers on the shm backend read straight from this process (zero-copy): when the
   send buffer of all_gather, reduce_scatter or all_reduce, the recv buffer of all_reduce, or
   the root's buffer of broadcast lies in it, peers copy from it directly instead of through
   the staging slots (the op then also waits, before returning, until every peer is done
   reading it). Such buffers and ordinary ones mix freely, per rank and per op.
   Collective: every rank of the comm calls it, in the same order relative to its other
   fsdp_comm_alloc calls and ops; bytes may differ by rank. The memory is zeroed, 64-byte
   aligned, and lives until fsdp_comm_free or fsdp_comm_destroy. On a socket world spanning
   hosts (transport socket+shm) it is shared among the ranks of each host, which read it
   directly in the shared-memory half of every op; on other backends it is ordinary memory.
   If the ranks cannot share it (say /dev/shm is too small), each rank gets ordinary memory,
   a warning goes to the logger, and collectives on it stay correct, staged.
   Returns FSDP_SUCCESS; FSDP_ERR_INVALID_ARG; FSDP_ERR_OUT_OF_MEMORY; or, if the comm failed,
   its error (see fsdp_comm_last_error). */
FSDP_API int fsdp_comm_alloc(fsdp_comm *comm, size_t bytes, void **out);
/* Releases memory from fsdp_comm_alloc together with this rank's view of the peers' blocks of
   the same allocation. Like fsdp_comm_alloc, every rank frees it (the ranks do not talk): a
   peer that still offers its block in an op after this rank freed it makes that op fail with
   FSDP_ERR_MISMATCH. No op using the memory may be in flight on this rank. NULL is ignored. */
FSDP_API void fsdp_comm_free(fsdp_comm *comm, void *ptr);
/* 1 if [ptr, ptr + bytes) lies in fsdp_comm_alloc memory that peers read directly, else 0. */
FSDP_API int fsdp_comm_is_shared(const fsdp_comm *comm, const void *ptr, size_t bytes);

/* ============================================================================================
   >>qcomm
   ============================================================================================ */
/* A reduce-scatter of f32 gradients whose trip between hosts is quantized (DeepSpeed ZeRO++'s
   qgZ): full precision inside a host, the wire's format between hosts.
   The world is H hosts of L ranks; world rank r = h L + l holds, in send, P = H L shards of count
   floats, shard s at s * count; recv gets count floats, the reduction of shard r. host is this
   rank's host comm (L ranks, this rank's rank in it l; NULL: L = 1) and cross the comm of the
   ranks of local index l on every host, in host order (H ranks, this rank's rank h; NULL:
   H = 1): fsdp_comm_split(world, r / L, r, &host) and fsdp_comm_split(world, r % L, r, &cross)
   make them from a world numbered host by host.
   What happens, in this order, every addition and division one f32 operation (so that a plain
   reference reproduces it bit for bit):
     1. y_g, for each host g = 0..H-1: the fsdp_reduce_scatter over host (FSDP_SUM, f32) of the
        L shards g L .. g L + L - 1, i.e. the sum over this host's ranks, in local rank order,
        of their shard g L + l.
     H = 1: recv = y_0 (FSDP_AVG: that reduce-scatter with FSDP_AVG), which is exactly
        fsdp_reduce_scatter over host; nothing is quantized and residual is untouched.
     2. (residual) z_g = y_g + residual[g count ..] element by element; else z_g = y_g.
     3. c_g = fsdp_wire_encode(z_g, wire, block); (residual) residual[g count + i] =
        z_g[i] - fsdp_wire_decode(c_g)[i], or 0 where that decodes to NaN (a non-finite block).
     4. fsdp_all_to_all over cross: c_g goes to host g's rank of local index l, which holds
        shard g L + l (each piece padded to a multiple of 4 bytes and moved as f32 words).
     5. recv[i] = ((d_0[i] + d_1[i]) + d_2[i]) + ... over the hosts in host order, d_g the
        decode to f32 of what host g sent; FSDP_AVG then divides by P (fsdp_reduce_ranks).
   So the bits depend on H and L (quantization happens per host partial) and on the wire and
   block, never on timing or the backend. A NaN or infinity in a block of some z_g makes that
   block decode to NaN on its receiver, so recv carries NaN there and a step that checks for
   non-finite gradients skips (the residual of that block restarts at 0).
   Parameters: wire FSDP_WIRE_INT8 or FSDP_WIRE_INT4 (the float wires work too: f32 is the exact
   two-level reduction); block as fsdp_wire_bytes (0: 128); op FSDP_SUM or FSDP_AVG (0: SUM);
   residual NULL (no error feedback) or H * count floats of this rank's, zero at the start,
   kept between calls. recv must not overlap residual; it may lie in send.
   Memory: the call allocates H count floats and twice H fsdp_wire_bytes(wire, count, block).
   Return Value: FSDP_SUCCESS; FSDP_ERR_INVALID_ARG (logged on host's or cross's logger, naming
   the argument); FSDP_ERR_OUT_OF_MEMORY; or the failed op's error (then that comm is poisoned
   as by any op, see fsdp_comm_last_error). Collective over host and cross: every rank of the
   world calls it with the same count, wire, block, op and residual-or-not. */
FSDP_API int fsdp_reduce_scatter_wire(fsdp_comm *host, fsdp_comm *cross, const float *send, float *recv, size_t count,
                                      fsdp_reduce_op op, fsdp_wire wire, size_t block, float *residual);

/* ============================================================================================
   >>model
   A model is a tree of modules (dotted names, type names) holding parameters. The root is
   module 0. Names follow PyTorch state dicts: "layers.0.weight".
   ============================================================================================ */
typedef struct fsdp_model fsdp_model;

typedef enum fsdp_init_kind {
    FSDP_INIT_ZEROS = 0,
    FSDP_INIT_ONES = 1,
    FSDP_INIT_CONSTANT = 2, /* a */
    FSDP_INIT_NORMAL = 3,   /* mean a, standard deviation b */
    FSDP_INIT_UNIFORM = 4,  /* [a, b) */
    FSDP_INIT_CALLBACK = 5  /* fn(user, full parameter name, flat element index, seed) */
} fsdp_init_kind;

typedef float (*fsdp_init_fn)(void *user, const char *param_name, int64_t index, uint64_t seed);

/* How a parameter's elements are initialised. Every element is computed on its own from a
   counter-based generator keyed by (seed, parameter name, element index), so each rank fills
   only its shard and the model is bitwise the same for every world size and strategy. */
typedef struct fsdp_init_rule {
    fsdp_init_kind kind;
    float a, b;
    fsdp_init_fn fn;
    void *user;
} fsdp_init_rule;

#define FSDP_MAX_DIMS 8

/* Creates a model whose root module has the given type name (e.g. "GPT"). */
FSDP_API int fsdp_model_create(fsdp_model **out, const char *root_type);
FSDP_API void fsdp_model_destroy(fsdp_model *model);
/* Adds a module under parent (0 = root); returns its id (> 0) or a negative fsdp_result.
   name is the local name ("0", "attn"); its full name is the dotted path. */
FSDP_API int fsdp_model_module(fsdp_model *model, int parent, const char *name, const char *type);
/* Adds a parameter to a module; returns its id (>= 0) or a negative fsdp_result. Shapes are
   row-major; any sizes (no divisibility rules). */
FSDP_API int fsdp_model_param(fsdp_model *model, int module, const char *name, int ndim, const int64_t *shape,
                              fsdp_init_rule init);
FSDP_API int fsdp_model_num_modules(const fsdp_model *model);
FSDP_API int fsdp_model_num_params(const fsdp_model *model);
FSDP_API const char *fsdp_model_module_name(const fsdp_model *model, int module); /* "" for the root */
FSDP_API const char *fsdp_model_param_name(const fsdp_model *model, int param);   /* "layers.0.weight" */
FSDP_API int64_t fsdp_model_param_numel(const fsdp_model *model, int param);
FSDP_API int fsdp_model_param_shape(const fsdp_model *model, int param, int64_t *shape /* [FSDP_MAX_DIMS] */);
FSDP_API int fsdp_model_find_param(const fsdp_model *model, const char *full_name); /* id or -1 */
/* Marks a module as a unit for FSDP_WRAP_MANUAL (and for any policy: always a unit). */
FSDP_API int fsdp_model_wrap(fsdp_model *model, int module);
/* Frozen parameters (PyTorch's requires_grad_(False)), before fsdp_init: trainable 0 freezes
   every parameter of the module and its submodules (1 unfreezes them); the _param form one
   parameter. A frozen parameter has no gradient (fsdp_grad returns NULL), no optimizer state and
   is never updated. A unit whose parameters are all frozen also has no gradient shard and no
   gradient communication, and its backward hooks may be skipped (when no input gradient is
   needed through it, e.g. a teacher model or a frozen embedding); wrap frozen modules as units
   of their own to get those savings (a unit that mixes both keeps a gradient shard for all).
   A context run forward only (a frozen teacher) ends each pass with fsdp_finish_backward. */
FSDP_API int fsdp_model_set_trainable(fsdp_model *model, int module, int trainable);
FSDP_API int fsdp_model_param_set_trainable(fsdp_model *model, int param, int trainable);
FSDP_API int fsdp_model_param_trainable(const fsdp_model *model, int param); /* 1, 0, or -1: no such param */
/* The value element `index` of a parameter gets from its init rule and the seed. */
FSDP_API float fsdp_init_value(const fsdp_model *model, int param, int64_t index, uint64_t seed);

/* ============================================================================================
   >>wrap
   ============================================================================================ */
typedef enum fsdp_wrap_kind {
    FSDP_WRAP_DEFAULT = 0,   /* FSDP_WRAP_NONE */
    FSDP_WRAP_NONE = 1,      /* only the root is a unit (plus modules marked by fsdp_model_wrap) */
    FSDP_WRAP_SIZE = 2,      /* a module whose parameters not already in a child unit >= min_params */
    FSDP_WRAP_TYPES = 3,     /* every module whose type name is in types */
    FSDP_WRAP_PREDICATE = 4, /* predicate(user, model, module, params not in a child unit) != 0 */
    FSDP_WRAP_MANUAL = 5     /* the modules marked by fsdp_model_wrap */
} fsdp_wrap_kind;

typedef struct fsdp_wrap_policy {
    fsdp_wrap_kind kind;
    int64_t min_params;
    const char *const *types; /* NULL-terminated */
    int (*predicate)(void *user, const fsdp_model *model, int module, int64_t unwrapped_params);
    void *user;
} fsdp_wrap_policy;

/* ============================================================================================
   >>optimizer
   The sharded optimizer updates this rank's f32 shard only. An optimizer is a row
   (fsdp_optimizer): its name, its state tensors, defaults, checks and the update of a range of
   the shard. The shipped rows follow PyTorch's update rules and defaults (torch.optim.SGD / Adam /
   AdamW) bit for bit, with t = steps taken + 1:
     SGD:   g = grad + weight_decay * p; if momentum: buf = g on the first step, else
            buf = momentum * buf + (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf;
            p -= lr * g.  Defaults: momentum 0, dampening 0, weight_decay 0, nesterov off.
            State: momentum_buffer (only with momentum).
     Adam:  g = grad + weight_decay * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
            p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
            Defaults: betas 0.9, 0.999, eps 1e-8, weight_decay 0. State: exp_avg, exp_avg_sq.
     AdamW: p *= 1 - lr * weight_decay, then Adam without the weight-decay term.
            Defaults as Adam but weight_decay 0.01 (PyTorch's): a weight_decay left at 0 is
            0.01. For none (llm.c's AdamW, for one), say so: .weight_decay =
            FSDP_NO_WEIGHT_DECAY. fsdp_init logs the settings it resolved at info level, saying
            where the weight decay came from, and fsdp_print_units prints them.
   An optimizer of your own is a row you fill (fsdp_optimizer_desc.custom), as a backend is.
   ============================================================================================ */
typedef enum fsdp_optimizer_kind {
    FSDP_OPTIMIZER_DEFAULT = 0, /* FSDP_SGD, or .custom when set */
    FSDP_SGD = 1,
    FSDP_ADAM = 2,
    FSDP_ADAMW = 3,
    FSDP_OPTIMIZER_CUSTOM = 4   /* fsdp_optimizer_desc.custom */
} fsdp_optimizer_kind;

#define FSDP_OPTIMIZER_MAX_STATE 4

typedef struct fsdp_optimizer fsdp_optimizer;

/* Exactly no weight decay, for fsdp_optimizer_desc.weight_decay, where a field left at 0 takes
   the optimizer's default (AdamW's: 0.01). It is a negative zero: recognised by its bits (also
   under -ffast-math), and in any arithmetic (a row that does not know it) the same as 0.
   fsdp_init resolves it to weight_decay 0 with weight_decay_set 1. */
#define FSDP_NO_WEIGHT_DECAY (-0.0f)

/* Hyper-parameters. A zero field takes the optimizer's default; to ask for exactly zero where the
   default is not zero (AdamW's weight decay), set .weight_decay = FSDP_NO_WEIGHT_DECAY (or, as
   before it existed, weight_decay_set = 1). Fields an optimizer does not use are ignored. */
typedef struct fsdp_optimizer_desc {
    fsdp_optimizer_kind kind;
    float lr;              /* default 1e-3 (every optimizer; a row's defaults may change it) */
    float momentum, dampening;
    int nesterov;
    float beta1, beta2, eps;
    float weight_decay;    /* 0: the optimizer's default (AdamW 0.01, others 0); FSDP_NO_WEIGHT_DECAY: none */
    int weight_decay_set;  /* 1: weight_decay as given, even 0 (FSDP_NO_WEIGHT_DECAY says it in the field) */
    const fsdp_optimizer *custom; /* an optimizer of your own (kind FSDP_OPTIMIZER_CUSTOM or 0) */
    fsdp_dtype state_dtype;       /* the state's storage: FSDP_F32 (default: PyTorch's bits) or
                                     FSDP_BF16 (half the bytes, in RAM and on disk: each step widens
                                     the state to f32, updates in f32 and rounds the new state to
                                     the nearest bf16, ties to even) */
} fsdp_optimizer_desc;

/* One update of count elements of a shard: what a row's update receives. */
typedef struct fsdp_optimizer_step {
    float *param;                            /* the f32 master values, updated in place */
    const float *grad;                       /* their gradients (averaged over ranks, clipped) */
    float *state[FSDP_OPTIMIZER_MAX_STATE];  /* the row's state for the same elements, in
                                                state_names order; zero before the first step */
    size_t count;
    float lr, weight_decay;                  /* these elements' (parameter groups applied) */
    int64_t step;                            /* steps taken before this one: 0 on the first */
    const fsdp_optimizer_desc *desc;         /* the other hyper-parameters, defaults filled in */
} fsdp_optimizer_step;

/* An optimizer. Only update is required. Its state is f32, one value per parameter element per
   state name, sharded like the parameters and saved in checkpoints as "<param>.<state name>".
   The update must depend only on the element's own values (it is called on ranges of shards, of
   any length), and give the same bits for the same inputs, for checkpoints and world sizes to
   agree bit for bit. */
struct fsdp_optimizer {
    const char *name;                                 /* "adamw": the checkpoints' "optimizer" */
    const char *state_names[FSDP_OPTIMIZER_MAX_STATE]; /* NULL-terminated */
    int (*num_state)(const fsdp_optimizer_desc *desc); /* how many of the names the settings
                                                          keep (NULL: all); SGD: 1 with momentum */
    void (*defaults)(fsdp_optimizer_desc *desc);      /* fills the zero fields it has defaults for */
    const char *(*check)(const fsdp_optimizer_desc *desc); /* NULL, or why the settings are invalid */
    void (*update)(const fsdp_optimizer_step *step);
};

/* The shipped optimizers' rows (FSDP_SGD, FSDP_ADAM, FSDP_ADAMW; the default kind is FSDP_SGD);
   NULL for any other kind. Tools use them for the state names. */
FSDP_API const fsdp_optimizer *fsdp_optimizer_of(fsdp_optimizer_kind kind);

/* A parameter group (torch.optim's param_groups): the parameters it matches are updated with its
   weight decay and lr x lr_scale (fsdp_set_lr sets the base lr of every group). A parameter
   belongs to the first group that matches it, or to none (the optimizer's settings). A group
   matches a parameter whose full name fits pattern (a shell glob as fnmatch: "*.bias", "ln_*";
   NULL: any name) and whose number of dimensions is in [min_ndim, max_ndim] (max_ndim 0: no
   upper bound). GPT-2's recipe, decay only matrices: {NULL, 0, 1, 0.0f, 0}.
   A group sets the two settings recipes vary per parameter (GPT-2's decay of matrices only,
   layer-wise lr decay); betas, eps and momentum are the optimizer's for every parameter, unlike
   torch's groups, which may set any: no recipe here needs them, and a field added later (0: the
   optimizer's) could, without changing this struct's meaning. fsdp_set_param_group changes a
   group's settings between steps. */
typedef struct fsdp_param_group {
    const char *pattern;
    int min_ndim, max_ndim;
    float weight_decay;      /* as given: 0 is no decay */
    float lr_scale;          /* 0 is 1 (to keep a parameter fixed, freeze it) */
} fsdp_param_group;

/* ============================================================================================
   >>offload
   The tier below RAM: state a rank keeps on its local disk (an SSD or NVMe), streamed to and from
   RAM in the order it is used, as DeepSpeed's ZeRO-Infinity keeps it on NVMe. Each rank keeps one
   file in the directory, unlinked from the start (it never outlives the process) and reserved in
   full at init (a full disk is an error then, not mid-training); its bytes bypass the page cache
   (O_DIRECT, or written back and dropped where the filesystem has no O_DIRECT), so they really
   leave RAM. An I/O thread reads ahead and writes behind while the step computes.
   ============================================================================================ */
typedef struct fsdp_offload_desc {
    int optimizer;          /* optimizer state on disk (DeepSpeed's offload_optimizer) */
    int params;             /* f32 master shards on disk (PyTorch's CPUOffload(offload_params), DeepSpeed's
                               offload_param): read before each gather and by the step, written by it;
                               fsdp_param_info.shard is then NULL */
    int grads;              /* gradient shards on disk: written by each reduction, read by the step;
                               fsdp_param_info.grad_shard is then NULL */
    const char *dir;        /* a directory on a local disk; NULL: FSDP_OFFLOAD_DIR */
    size_t ram_bytes;       /* the most RAM the streaming may use per rank (at least three chunks
                               of 2048 elements of each state buffer); 0: 64 MiB */
    int allow_tmpfs;        /* accept a directory in RAM (tmpfs, ramfs), which saves no memory:
                               for tests; refused otherwise */
} fsdp_offload_desc;
/* What o offloads, in words: "the parameters, gradients and optimizer state", "nothing", ... */
FSDP_API const char *fsdp_offload_describe(const fsdp_offload_desc *o);

/* The disk under dir as the offload sees it: `streams` files (as many as the ranks sharing the
   disk, 1..64) of bytes / streams each, written, then read, at once, each through an I/O thread
   with the O_DIRECT and request size (8 MiB, three in flight) of the streaming; the bytes per
   second of all streams together, each way (the write timed the second time: a first write of
   reserved blocks costs more, as in training's first step). The files are unlinked from the start. For
   benchmarks and roofline figures. 0, or FSDP_ERR_* with why in err. */
FSDP_API int fsdp_offload_bandwidth(const char *dir, size_t bytes, int streams, double *write_bytes_per_s,
                                    double *read_bytes_per_s, char *err, size_t err_size);

/* ============================================================================================
   >>recovery
   Surviving the loss of a replica (a host's shard group under HYBRID_SHARD) inside the job,
   without a restart (issue 38). For a socket world whose replicas each have hosts of their own:
   when a rank dies (its connections reset) or its host vanishes (noticed by the kernel within
   about detect_ms), fsdp_step on every survivor stops what was in flight, the survivors agree on
   who goes on (a strict majority of the last membership, and at least min_replicas; otherwise
   every survivor's fsdp_step fails naming the partition), the step in flight is applied by all
   of them or by none, and they go on in a new world: fsdp_step returns 0 with report->dropped
   and report->epoch saying so, and fsdp_replicas gives the new count and this rank's index.
   A hook whose op fails so returns its error; call fsdp_step next (it recovers) and take the
   next iteration's data by the steps its report says were taken. A stopped or slow process is
   not lost (its kernel still answers): the op timeout finds it, and recovery then drops it.
   After a recovery the context runs on a world of its own: desc.comm stays failed (destroy it
   after fsdp_destroy, as always). Not yet: a host rejoining; offload or bf16 optimizer state
   (their update streams on a thread recovery does not stop yet) and reshard_after_forward HOST
   are refused with recovery. Recovery off (the default) changes nothing.
   ============================================================================================ */
typedef struct fsdp_recovery_desc {
    int enabled;            /* 1: survive a lost replica (HYBRID_SHARD whose replicas span hosts) */
    int min_replicas;       /* the fewest replicas to go on with; 0: 1. A strict majority of the
                               last membership is needed whatever this says */
    int detect_ms;          /* how long a silent replica may go unnoticed (a host powered off:
                               keepalive and TCP_USER_TIMEOUT on the links between hosts), and
                               how long the rendezvous waits for the survivors' views; 0: 5000.
                               A reset is noticed at once */
} fsdp_recovery_desc;

/* ============================================================================================
   >>runtime
   ============================================================================================ */
typedef struct fsdp_ctx fsdp_ctx;

typedef enum fsdp_strategy {
    FSDP_STRATEGY_DEFAULT = 0, /* FSDP_FULL_SHARD */
    FSDP_FULL_SHARD = 1,       /* ZeRO-3: parameters, gradients, optimizer state sharded */
    FSDP_SHARD_GRAD_OP = 2,    /* ZeRO-2: parameters stay gathered from forward to backward */
    FSDP_NO_SHARD = 3,         /* DDP: everything replicated, gradients all-reduced */
    FSDP_HYBRID_SHARD = 4,     /* FULL_SHARD inside a shard group, replicated across groups */
    FSDP_STRATEGY_AUTO = 5     /* fsdp_desc.strategy only: the least sharded that fits memory_budget */
} fsdp_strategy;

/* "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" (PyTorch's ShardingStrategy names);
   "invalid" for anything else. */
FSDP_API const char *fsdp_strategy_name(fsdp_strategy strategy);
/* A strategy from the names users type, case-insensitive: PyTorch's (FULL_SHARD,
   SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD), Hugging Face's (full_shard, shard_grad_op, no_shard,
   hybrid_shard; also 1..4 as its fsdp_sharding_strategy), and the short full, grad_op, hybrid.
   FSDP_STRATEGY_DEFAULT (0) if none matches. */
FSDP_API fsdp_strategy fsdp_strategy_from_name(const char *name);

typedef enum fsdp_backward_prefetch {
    FSDP_BACKWARD_PREFETCH_DEFAULT = 0, /* FSDP_BACKWARD_PRE */
    FSDP_BACKWARD_PRE = 1,              /* gather the next unit when this one's backward starts */
    FSDP_BACKWARD_POST = 2,             /* ... when this one's backward ends */
    FSDP_BACKWARD_PREFETCH_NONE = 3
} fsdp_backward_prefetch;

/* Dynamic loss scaling for f16 (PyTorch's GradScaler and ShardedGradScaler, same names and
   defaults): the training loop multiplies the gradient of its loss by fsdp_loss_scale(ctx)
   before backward, so that small gradients survive f16; fsdp_step divides the scale out of the
   gradients before clipping (fsdp_clip_grad_norm, if called first, does it), and then, as
   GradScaler.update: a non-finite gradient skips the step and multiplies the scale by
   backoff_factor; growth_interval steps in a row without one multiply it by growth_factor.
   Checkpoints with optimizer state carry the scale and the count (metadata "loss_scale",
   "loss_scale_growth_tracker"). */
typedef struct fsdp_loss_scale_desc {
    int enabled;                        /* 1: on; 0: off (fsdp_loss_scale is 1) */
    float init_scale;                   /* 0: 65536 (2^16) */
    float growth_factor;                /* 0: 2 */
    float backoff_factor;               /* 0: 0.5 */
    int growth_interval;                /* 0: 2000 */
} fsdp_loss_scale_desc;

/* What fsdp_post_forward does with a unit's gathered parameters (PyTorch FSDP2's
   reshard_after_forward; ZeRO++'s hpZ for HOST). Global (fsdp_desc.reshard_after_forward) or per
   unit (fsdp_model_set_reshard_after_forward). The root unit is never resharded (see
   fsdp_pre_forward): a mode given for it is ignored. */
typedef enum fsdp_reshard_mode {
    FSDP_RESHARD_DEFAULT = 0, /* the strategy's: FULL_SHARD and HYBRID_SHARD reshard, the others keep; never the root */
    FSDP_RESHARD_ALL = 1,     /* FSDP2's reshard_after_forward=True: free the gathered copy */
    FSDP_RESHARD_NONE = 2,    /* False: keep it gathered until post_backward */
    FSDP_RESHARD_HOST = 3     /* FSDP2's int (the host's rank count), ZeRO++'s hpZ: keep the unit sharded over this
                                 host's ranks (ceil(padded / L) elements per rank, in param_dtype, L the host's
                                 ranks) so that backward's gather stays inside the host. Where the unit's shard
                                 group lies inside one host (one host; HYBRID_SHARD's default group) or for
                                 NO_SHARD it means nothing: ALL, with an info log naming the unit */
} fsdp_reshard_mode;

typedef struct fsdp_desc {
    fsdp_comm *comm;                    /* required; the context does not own it */
    fsdp_strategy strategy;             /* for every unit without its own (fsdp_model_set_strategy) */
    fsdp_wrap_policy wrap;
    fsdp_dtype param_dtype;             /* what is gathered and what compute reads; default f32 */
    fsdp_dtype reduce_dtype;            /* what gradients are reduced in; default param_dtype */
    int fp32_compute_view;              /* with bf16/f16 params: also give f32 views of the weights */
    int forward_prefetch;               /* gather the next unit during this one's forward */
    fsdp_backward_prefetch backward_prefetch;
    int limit_all_gathers;              /* at most this many gathers in flight; default 2 */
    int shard_group_size;               /* HYBRID_SHARD: ranks per shard group; default local size. Must
                                           divide the world where a unit is HYBRID_SHARD; unused otherwise */
    uint64_t seed;                      /* for the init rules */
    fsdp_optimizer_desc optimizer;
    const fsdp_param_group *param_groups; /* per-parameter weight decay and lr (copied at init) */
    int num_param_groups;
    size_t memory_budget;               /* FSDP_STRATEGY_AUTO: bytes per rank for fsdp.h's state (the
                                           estimator's peak_bytes; leave room for activations, and on
                                           shm for the peers' f32 shards that gathers read in place:
                                           mapped, they count in each reader's RSS though stored once) */
    fsdp_offload_desc offload;          /* state kept on local disk (default: everything in RAM) */
    fsdp_logger logger;                 /* default: the comm's */
    fsdp_loss_scale_desc loss_scale;    /* dynamic loss scaling (for f16; default off) */
    const char *trace_dir;              /* write a trace per rank here (>>trace); NULL: FSDP_TRACE, else off */
    fsdp_recovery_desc recovery;        /* in-job recovery from a lost replica (>>recovery; default off) */
    fsdp_reshard_mode reshard_after_forward; /* for every unit without its own (FSDP_RESHARD_DEFAULT: the strategy's) */
    fsdp_wire param_wire;               /* what parameter gathers move (>>wire), for every unit without its own:
                                           DEFAULT: param_dtype; INT8, INT4: each rank encodes its f32 master
                                           shard, the gather moves the codes and every rank decodes them into
                                           param_dtype (ZeRO++'s qwZ). Shards are then padded to whole blocks,
                                           so the gathered weights are the same bits at every world size. A
                                           float wire other than param_dtype's is refused (param_dtype says it) */
    fsdp_wire grad_wire;                /* what gradient reductions move between hosts, for every unit without its
                                           own: DEFAULT: reduce_dtype; INT8, INT4: ZeRO++'s qgZ, the unit's
                                           reduce-scatter is fsdp_reduce_scatter_wire (f32 inside each host,
                                           the host partials quantized between hosts; >>qcomm), reduce_dtype
                                           unused for it. Needs hosts of equal rank counts, numbered host by
                                           host (else FSDP_ERR_UNSUPPORTED); HYBRID_SHARD refused (its
                                           all-reduce over replicas is not quantized); where the reduction
                                           never crosses a host (one host, NO_SHARD) ignored with an info log.
                                           A float wire other than reduce_dtype's is refused */
    size_t wire_block;                  /* elements per block of INT8/INT4 (fsdp_wire_bytes' rules); 0: 128 */
    int error_feedback;                 /* 1: units reducing over an INT8/INT4 grad_wire keep, per rank, the
                                           quantization error of their host partials (hosts x shard floats, in
                                           grad_shard_bytes) and add it to the next reduction's; sharded
                                           checkpoints save it ("__grad_residual__.<unit>", >>checkpoint) */
} fsdp_desc;

/* Builds units from the wrap policy, allocates this rank's shards and initialises them.
   Collective over desc->comm. */
FSDP_API int fsdp_init(fsdp_ctx **out, fsdp_model *model, const fsdp_desc *desc);
/* Releases the context (not the comm or the model). Collectives still queued (a destroy in
   the middle of an iteration) are run first, so every rank must destroy at the same point;
   after a failure they are dropped. */
FSDP_API void fsdp_destroy(fsdp_ctx *ctx);
/* The last error's message, naming the unit, parameter or rank at fault. */
FSDP_API const char *fsdp_last_error(const fsdp_ctx *ctx);

/* Per-unit strategy, before fsdp_init: the unit rooted at module uses this strategy. */
FSDP_API int fsdp_model_set_strategy(fsdp_model *model, int module, fsdp_strategy strategy);
/* Per-unit reshard after forward, before fsdp_init: the unit rooted at module does what mode says
   (fsdp_reshard_mode; FSDP_RESHARD_DEFAULT: fsdp_desc.reshard_after_forward's). */
FSDP_API int fsdp_model_set_reshard_after_forward(fsdp_model *model, int module, fsdp_reshard_mode mode);
/* Per-unit wire formats, before fsdp_init: what the unit rooted at module gathers its parameters
   in and reduces its gradients in (FSDP_WIRE_DEFAULT: fsdp_desc's param_wire and grad_wire, with
   the same rules). */
FSDP_API int fsdp_model_set_wire(fsdp_model *model, int module, fsdp_wire param_wire, fsdp_wire grad_wire);

/* Hooks, called by the training code at module boundaries. A module that is not a unit acts on
   the unit that owns it (reference counted, so calling hooks on every module is fine).
   Out-of-order calls return FSDP_ERR_STATE naming the unit and both states, a misuse as
   fsdp_param's NULL is (one warning per context; FSDP_DEBUG >= 1 aborts there).
   fsdp_pre_forward gathers the unit's parameters; fsdp_post_forward reshards them (frees the
   gathered copy) where the unit's strategy says so: FULL_SHARD and HYBRID_SHARD units but the
   root (fsdp_reshard_mode changes that per unit or for all); fsdp_pre_backward gathers them
   again if they were; fsdp_post_backward reduces the gradients and reshards. The root unit (unit 0, rooted at module 0: every parameter no other
   unit took, e.g. the embeddings, the last norm, a tied head) is never resharded after its
   forward, under any strategy, as in PyTorch FSDP: its backward follows at once. So call
   fsdp_pre_forward(ctx, 0) before the whole forward and fsdp_post_forward(ctx, 0) after it,
   fsdp_pre_backward(ctx, 0) before the whole backward and fsdp_post_backward(ctx, 0) after it;
   its parameters stay readable from the first to the last. fsdp_unit_info says which units
   reshard after forward (reshard_after_forward) and which is the root (is_root). */
FSDP_API int fsdp_pre_forward(fsdp_ctx *ctx, int module);
/* Ends the module's forward: reshards its unit when fsdp_unit_info.reshard_after_forward is 1
   (FULL_SHARD, HYBRID_SHARD, or as its fsdp_reshard_mode says; never the root, which keeps its
   parameters for the backward). FSDP_RESHARD_HOST first keeps this rank's slice of the host's
   share (a copy, freed when the backward's gather is done). */
FSDP_API int fsdp_post_forward(fsdp_ctx *ctx, int module);
FSDP_API int fsdp_pre_backward(fsdp_ctx *ctx, int module);
FSDP_API int fsdp_post_backward(fsdp_ctx *ctx, int module);

/* Weights of a parameter while its unit is gathered: from its unit's fsdp_pre_forward to its
   fsdp_post_forward, and from its fsdp_pre_backward to its fsdp_post_backward; in between only
   where the unit is not resharded after forward (fsdp_unit_info.reshard_after_forward 0: the
   root, SHARD_GRAD_OP, NO_SHARD). The pointer is valid until the unit is resharded.
   fsdp_param returns f32 values (param_dtype f32, or fp32_compute_view); fsdp_param_raw the
   gathered param_dtype buffer.
   Return Value: the parameter's first element, or NULL when the unit has no weights to give:
   outside those hooks, a param that does not exist, fsdp_param with bf16/f16 params and no
   fp32_compute_view. NULL is a misuse: fsdp_last_error(ctx) names the parameter, its unit, the
   unit's state and the hook to call ("fsdp_param(ctx, 3 'fc.weight'): unit 0 (root) is sharded
   (not gathered): call fsdp_pre_forward(ctx, 0) first ..."), the first misuse of a context is
   logged as a warning, and with FSDP_DEBUG >= 1 (or FSDP_ABORT_ON_MISUSE) the process aborts
   there with that message instead of returning NULL. */
FSDP_API float *fsdp_param(fsdp_ctx *ctx, int param);
FSDP_API void *fsdp_param_raw(fsdp_ctx *ctx, int param);
/* The f32 gradient of a parameter to accumulate into (+=), from its unit's fsdp_pre_backward to
   its fsdp_post_backward; zeroed at the first pre_backward of an iteration (no_sync micro-steps
   keep accumulating).
   Return Value: the gradient's first element; NULL for a frozen parameter (it has none: no
   message), and NULL outside those hooks or for a param that does not exist, a misuse reported
   as fsdp_param's is (message, one warning, abort with FSDP_DEBUG >= 1). */
FSDP_API float *fsdp_grad(fsdp_ctx *ctx, int param);

/* Gradient accumulation without communication: while on, post_backward keeps the unsharded
   gradients and adds the next micro-step's to them; the first backward after turning it off
   reduces the sum. */
FSDP_API int fsdp_set_no_sync(fsdp_ctx *ctx, int on);

typedef struct fsdp_step_report {
    double grad_norm;   /* global L2 norm before clipping (same value on every rank), unscaled */
    int skipped;        /* 1: a gradient was not finite; nothing was updated */
    int64_t step;       /* optimizer steps taken so far */
    double loss_scale;  /* the scale this step's gradients carried (1 without loss scaling) */
    int replicas;       /* replicas training after this step (fsdp_replicas) */
    int64_t epoch;      /* the membership's number: 0 until a replica is lost (>>recovery) */
    int dropped;        /* 1: a replica was lost and this step was applied nowhere (>>recovery) */
    uint64_t bytes_sent_host, bytes_sent_net; /* what this rank sent through desc.comm and the comms
                                   made from it (the program's own ops on them too) since the last
                                   fsdp_step (or fsdp_init) returned, this one included (after a
                                   recovery: since the survivors' comm was made): to its own host,
                                   to other hosts (as fsdp_comm_stats counts them) */
} fsdp_step_report;

/* Waits for outstanding reduce-scatters, clips to max_norm (<= 0: no clipping), applies the
   optimizer to this rank's shards and ends the iteration. Collective. With offload (>>offload)
   the update streams on a thread of its own and fsdp_step returns once it has begun: the next
   forward overlaps it, each unit's hooks waiting for that unit's new values; fsdp calls that
   read the shards wait for all of it, and so does fsdp_synchronize.
   A step needs gradients: with no backward since fsdp_init, the last fsdp_step or fsdp_zero_grad
   (only forward-only passes, e.g. an evaluation), where torch.optim would skip every parameter
   (its grad None), fsdp_step ends the iteration as fsdp_finish_backward does, applies nothing
   (the weights, the optimizer state and the step count stay as they were) and returns
   FSDP_ERR_STATE naming fsdp_step: a misuse, reported as the hooks' are (one warning per
   context; FSDP_DEBUG >= 1 aborts there). Micro-steps (fsdp_set_no_sync) then a step are fine:
   any backward since the last step counts.
   With recovery (>>recovery), a lost replica found here or by a hook since the last step is
   survived here: 0, report->dropped 1 where this iteration was applied nowhere (take it again
   with the data of report->step), report->epoch the new membership's; FSDP_ERR_PEER_LOST naming
   the partition where the survivors may not go on. */
FSDP_API int fsdp_step(fsdp_ctx *ctx, float max_norm, fsdp_step_report *report);
/* How many replicas of the training state the ranks hold, and which of them this rank belongs
   to (0..count-1): a replica is a group of consecutive ranks that together hold one whole copy,
   the largest shard group of any unit (HYBRID_SHARD: a shard group; FULL_SHARD, SHARD_GRAD_OP:
   every rank, count 1; NO_SHARD: each rank, count = world size). Every rank trains on data of its
   own: its place among them is index * (world size / count) + its rank inside the replica. With
   recovery (>>recovery) the count and the index change when a replica is lost, so a loop that
   splits its data asks again after every fsdp_step whose report says so.
   Return Value: FSDP_SUCCESS; FSDP_ERR_INVALID_ARG for a NULL ctx (count and index, when given,
   are set to 0 first). */
FSDP_API int fsdp_replicas(const fsdp_ctx *ctx, int *count, int *index);
/* Waits for everything running for ctx in the background (the comm thread's collectives, an
   update behind): before reading fsdp_param_info's shards directly, or timing. */
FSDP_API int fsdp_synchronize(fsdp_ctx *ctx);
/* Waits for outstanding reductions and ends the iteration without an update: after a
   micro-step, or after a forward-only pass (validation, sampling), which must end with it: the
   next forward's fsdp_pre_forward refuses (FSDP_ERR_STATE) otherwise. Collective. */
FSDP_API int fsdp_finish_backward(fsdp_ctx *ctx);
FSDP_API int fsdp_zero_grad(fsdp_ctx *ctx);
/* The learning rate of the next steps (every parameter group's base lr), >= 0. Local: every
   rank must set the same. */
FSDP_API int fsdp_set_lr(fsdp_ctx *ctx, float lr);
/* Changes the optimizer's hyper-parameters between steps, as assigning to torch.optim's
   param_groups does. opt is read as fsdp_desc.optimizer is by fsdp_init: a zero field takes its
   default (AdamW's weight decay 0.01: FSDP_NO_WEIGHT_DECAY for none), and the same checks apply.
   kind, custom and state_dtype must be fsdp_init's, and the settings must keep as many state
   buffers (SGD keeps one with momentum, none without): the optimizer state cannot change shape
   mid-run. Every setting is replaced, the lr set by fsdp_set_lr too; parameters of a parameter
   group keep the group's weight decay and lr_scale (fsdp_set_param_group changes those). The next
   fsdp_step uses them.
   When: between steps (after fsdp_init, fsdp_step or fsdp_finish_backward, before the next
   forward); an update still running in the background (offload) is waited for first.
   Local: no communication, but every rank must pass the same values (as for fsdp_set_lr: ranks
   holding replicas, or other shards of the same parameters, would otherwise update them
   differently).
   Return Value: 0; FSDP_ERR_INVALID_ARG naming the setting at fault, FSDP_ERR_STATE during an
   iteration (nothing changed in either case). */
FSDP_API int fsdp_set_optimizer(fsdp_ctx *ctx, const fsdp_optimizer_desc *opt);
/* Changes parameter group `group` (its index in fsdp_desc.param_groups) between steps: its
   weight_decay and lr_scale, checked as fsdp_init checks them. g's pattern, min_ndim and max_ndim
   must be the group's at fsdp_init (which parameters a group holds cannot change). When, and
   local: as fsdp_set_optimizer.
   Return Value: 0; FSDP_ERR_INVALID_ARG naming the group and what is wrong, FSDP_ERR_STATE during
   an iteration (nothing changed in either case). */
FSDP_API int fsdp_set_param_group(fsdp_ctx *ctx, int group, const fsdp_param_group *g);
/* The global gradient norm (waits for reductions; collective), as fsdp_step would clip it.
   With loss scaling it first divides the scale out of the gradients (as GradScaler.unscale_):
   call it between the last backward and fsdp_step. */
FSDP_API int fsdp_clip_grad_norm(fsdp_ctx *ctx, float max_norm, double *norm);
/* The scale the training loop multiplies its loss's gradient by (fsdp_desc.loss_scale); 1 when
   loss scaling is off. */
FSDP_API float fsdp_loss_scale(const fsdp_ctx *ctx);

/* Units, for inspection and for checkpoints. */
typedef struct fsdp_unit_info {
    int module;              /* module the unit is rooted at */
    const char *name;        /* its full name ("" for the root) */
    fsdp_strategy strategy;
    int num_params;
    int64_t numel;           /* parameters' elements, without alignment and padding */
    int64_t flat_numel;      /* with alignment gaps */
    int64_t padded_numel;    /* flat_numel rounded up to a multiple of the shard group size (times the
                                wire block with an INT8 or INT4 param_wire: shards of whole blocks) */
    int64_t shard_numel;     /* elements this rank holds */
    int64_t shard_offset;    /* where this rank's shard starts in the flat parameter */
    int is_root;             /* 1 for the root unit (unit 0, module 0), which owns every parameter
                                no other unit took */
    int reshard_after_forward; /* 1: fsdp_post_forward reshards the unit (frees its gathered
                                parameters) and fsdp_pre_backward gathers them again (FULL_SHARD,
                                HYBRID_SHARD); 0: they stay gathered until its post_backward (the
                                root, SHARD_GRAD_OP, NO_SHARD) */
    fsdp_reshard_mode reshard_mode; /* as resolved: ALL, NONE or HOST (HOST: reshard_after_forward is 1, and
                                the unit is kept sharded over this rank's host until its backward's gather) */
    fsdp_wire param_wire;    /* what its gathers move, as resolved: param_dtype's wire, INT8 or INT4 */
    int64_t host_shard_numel; /* HOST: the elements of the secondary shard this rank keeps; else 0 */
} fsdp_unit_info;

typedef struct fsdp_param_info {
    int unit;
    int64_t flat_offset;     /* where the parameter starts in its unit's flat parameter */
    int64_t numel;
    int64_t shard_begin;     /* this rank holds elements [shard_begin, shard_end) of the */
    int64_t shard_end;       /*   parameter (flattened); empty when begin == end */
    float *shard;            /* those elements in the fp32 master shard (NULL: offload.params) */
    float *grad_shard;       /* and in the gradient shard, after the reduction (NULL: frozen,
                                or offload.grads) */
} fsdp_param_info;

FSDP_API int fsdp_num_units(const fsdp_ctx *ctx);
/* Return Value: 0; FSDP_ERR_INVALID_ARG for an index out of range or a NULL info, with a message
   (fsdp_last_error) naming the index and the valid range. */
FSDP_API int fsdp_unit_info_get(const fsdp_ctx *ctx, int unit, fsdp_unit_info *info);
FSDP_API int fsdp_param_info_get(const fsdp_ctx *ctx, int param, fsdp_param_info *info);
/* Prints the units (name, strategy, whether post_forward reshards them, parameters, padding,
   bytes per rank), then the optimizer's settings as resolved (defaults filled, and where the
   weight decay came from), through fn, or stdout if NULL. */
FSDP_API void fsdp_print_units(const fsdp_ctx *ctx, void (*fn)(void *user, const char *line), void *user);

/* Copies a parameter's full value (gathered) into out (numel floats) on every rank. Collective. */
FSDP_API int fsdp_gather_param(fsdp_ctx *ctx, int param, float *out);
/* Sets a parameter from its full value given on rank 0 (others pass NULL), like PyTorch's
   sync_module_states. Collective. */
FSDP_API int fsdp_set_param_full(fsdp_ctx *ctx, int param, const float *full_on_rank0);
/* Sets this rank's slice of a parameter (fsdp_param_info: shard_begin..shard_end). Local. */
FSDP_API int fsdp_set_param_shard(fsdp_ctx *ctx, int param, const float *slice);

/* ============================================================================================
   >>trace
   Where a step's time goes. With fsdp_desc.trace_dir (or FSDP_TRACE=DIR) every rank writes
   DIR/trace-rankNNNNN.json, Chrome's trace-event format (open it in Perfetto or
   chrome://tracing; examples/trace_tool.c merges, summarises and draws them): pid is the rank,
   tid the thread (0 compute, 1 comm, 2 step, 3 io, 4 checkpoint). Events: every hook of every
   unit ("pre_forward h.3"), every collective fsdp.h runs (op, bytes, unit, group, a sequence
   number that matches it across the group's ranks, when it was queued), every wait of the
   compute thread and what for, the optimizer step, offload reads and writes, checkpoint phases,
   and each iteration ("step N", from the end of one fsdp_step to the end of the next, with the
   bytes the rank sent in it, as fsdp_step_report counts them). Times
   are microseconds on rank 0's clock: at init the ranks measure each one's offset to rank 0
   (a few all-gathers) and write it with its error bound in the file's otherData. Events wait in
   memory and are written at fsdp_step once there are 2048, and at fsdp_destroy (a rank that
   dies leaves its file without its last lines); a failed write logs a warning and stops the
   trace, never the training. Off, tracing costs a test per hook. Every rank traces or none
   (the clock alignment is collective; init fails otherwise). Files are JSON in UTF-8 whatever
   the names and paths hold: a byte that is not part of a well-formed UTF-8 character is
   written as U+FFFD (the replacement character), and names are cut between characters.
   ============================================================================================ */
/* Adds an event of the caller's own (data loading, a layer's forward...) on the calling
   thread's row (the compute row for threads not fsdp.h's): begin and end are fsdp_now()
   readings; the name is copied (63 bytes at most, cut between UTF-8 characters). Nothing when
   not tracing. Thread-safe. */
FSDP_API void fsdp_trace_span(fsdp_ctx *ctx, const char *name, double begin, double end);
/* 1 if ctx writes a trace. */
FSDP_API int fsdp_tracing(const fsdp_ctx *ctx);

/* ============================================================================================
   >>memory
   ============================================================================================ */
/* Bytes per rank. RAM: everything but disk_bytes. */
typedef struct fsdp_memory_stats {
    size_t param_shard_bytes;    /* fp32 master shards in RAM */
    size_t grad_shard_bytes;     /* gradient shards in RAM */
    size_t optimizer_bytes;      /* optimizer state shards in RAM */
    size_t persistent_bytes;     /* the three above */
    size_t unsharded_bytes;      /* gathered parameters and unsharded gradients live now */
    size_t peak_unsharded_bytes; /* their peak since init or the last reset */
    size_t peak_bytes;           /* persistent + peak unsharded + stream: the RAM fsdp.h needs */
    size_t disk_bytes;           /* state offloaded to disk (the offload file's size) */
    size_t stream_bytes;         /* RAM the streaming of offloaded state uses at most */
} fsdp_memory_stats;

FSDP_API int fsdp_memory_stats_get(const fsdp_ctx *ctx, fsdp_memory_stats *stats);
FSDP_API void fsdp_memory_reset_peak(fsdp_ctx *ctx);
/* What the offload file moved since fsdp_init (zeros without offload; >>offload). */
typedef struct fsdp_offload_stats {
    uint64_t bytes_read, bytes_written;
    double io_seconds;      /* the I/O thread's time in reads and writes */
    double wait_seconds;    /* the other threads' time waiting for it: I/O that compute did not hide */
} fsdp_offload_stats;
FSDP_API int fsdp_offload_stats_get(const fsdp_ctx *ctx, fsdp_offload_stats *stats);
/* Predicts the stats above for a model, config and world size before anything is allocated:
   persistent bytes exactly; peak_unsharded_bytes as an upper bound of what the scheduler keeps
   alive (without no_sync). HYBRID_SHARD's default group is the comm's ranks per host when
   desc->comm has world_size ranks, else world_size (one host). */
FSDP_API int fsdp_memory_estimate(const fsdp_model *model, const fsdp_desc *desc, int world_size,
                                  fsdp_memory_stats *estimate);
/* The least sharded strategy whose estimated per-rank peak_bytes fit budget_bytes, trying
   NO_SHARD, then HYBRID_SHARD (when desc->comm spans several hosts), SHARD_GRAD_OP and
   FULL_SHARD (the seeds' "pick the strategy from model size and memory"). FSDP_ERR_OUT_OF_MEMORY
   if none fits. why (optional) says what was chosen and why, or what the leanest needs:
   "SHARD_GRAD_OP: needs 41.2 MiB per rank of the 64.0 MiB budget (NO_SHARD needs 99.4 MiB)".
   fsdp_init does this for desc->strategy FSDP_STRATEGY_AUTO with desc->memory_budget. */
FSDP_API int fsdp_strategy_for_budget(const fsdp_model *model, const fsdp_desc *desc, int world_size, size_t budget_bytes,
                                      fsdp_strategy *chosen, char *why, size_t why_size);
/* As fsdp_strategy_for_budget, then, where no strategy fits in RAM, FULL_SHARD with ever more
   on disk (>>offload; when desc->offload.dir or FSDP_OFFLOAD_DIR names a directory): the
   optimizer state, then the gradients too, then the parameters too; the least offload that
   fits. *chosen is desc with the strategy and offload that fit; why says which and why.
   fsdp_init does this for FSDP_STRATEGY_AUTO. */
FSDP_API int fsdp_fit_budget(const fsdp_model *model, const fsdp_desc *desc, int world_size, size_t budget_bytes,
                             fsdp_desc *chosen, char *why, size_t why_size);

/* ============================================================================================
   >>checkpoint
   Full checkpoints are one safetensors file (8-byte little-endian header length, a JSON
   header: per tensor its dtype "F32"/"BF16"/"F16", shape and data_offsets, and a
   "__metadata__" map of strings; then the raw little-endian data), tensors named by their
   dotted parameter names, so Python's safetensors and PyTorch load it directly. Sharded
   checkpoints are a directory: one safetensors file per rank holding its slices, and
   index.json mapping each tensor's element ranges to files. Every tensor's CRC32C is stored
   in the metadata ("crc32c.<tensor>") and verified on load; every write goes to a temporary
   name, is fsynced and renamed, so a process killed mid-save leaves the previous checkpoint.
   Metadata a load restores or reports that is malformed or out of range (a step or epoch not
   in [0, 2^53), a loss_scale that is not a finite normal float > 0, a
   loss_scale_growth_tracker not in [0, growth_interval)) is ignored with a warning, as if
   absent, as another optimizer's state is without strict: the context keeps its own value and
   the tensors load.
   Error feedback (fsdp_desc.error_feedback) residuals go into sharded checkpoints only: tensor
   "__grad_residual__.<unit>" (F32, world x hosts x shard; rank r's hosts x shard floats in its
   own file), loaded back at the same world size and shard, else (or absent) the residual
   restarts at zero with an info message. Full checkpoints drop them (a full load leaves the
   residual as it was).
   ============================================================================================ */
typedef struct fsdp_kv {
    const char *key;
    const char *value;
} fsdp_kv;

typedef struct fsdp_save_options {
    int with_optimizer;      /* also <name>.exp_avg, <name>.exp_avg_sq or <name>.momentum_buffer */
    fsdp_dtype dtype;        /* parameters stored as F32 (default), BF16 or F16 */
    int64_t epoch;           /* stored as metadata "epoch" */
    const fsdp_kv *metadata; /* user key/values for __metadata__ */
    int num_metadata;
} fsdp_save_options;

typedef struct fsdp_load_options {
    int strict;              /* any missing, unexpected or mis-shaped tensor fails the load */
    int with_optimizer;      /* also restore optimizer state and step when the file has them */
    /* called once per problem: kind "missing" | "unexpected" | "shape"; detail says more.
       name is the file's text as it is (any bytes): pass it through fsdp_printable to show it */
    void (*on_problem)(void *user, const char *kind, const char *name, const char *detail);
    void *user;
} fsdp_load_options;

typedef struct fsdp_load_report {
    int loaded, missing, unexpected, mismatched;
    int64_t step, epoch;     /* from the metadata, -1 if absent (or out of range: >>checkpoint) */
} fsdp_load_report;

/* Gathers unit by unit (memory bounded by one unit) and writes one file from rank 0.
   Collective; between iterations. */
FSDP_API int fsdp_save_full(fsdp_ctx *ctx, const char *path, const fsdp_save_options *opt);
/* Loads a full file into any world size, strategy and wrap policy; each rank reads only its
   slices. Strict: reports every problem (on_problem and the error message) and loads nothing.
   Collective; between iterations. */
FSDP_API int fsdp_load_full(fsdp_ctx *ctx, const char *path, const fsdp_load_options *opt, fsdp_load_report *report);
/* Every rank writes its own slices; rank 0 then commits index.json. dir (made if missing)
   must be a directory of this user that not every user can write in, reached through no
   symbolic link of another user; each rank opens it once and makes every file relative to that
   (a link on the path repointed during the save changes nothing). Afterwards it holds
   index.json and exactly the files it names: those of earlier saves are removed, and so are
   this one's if it fails. Another job saving into dir meanwhile fails (FSDP_ERR_INVALID_ARG).
   Collective. */
FSDP_API int fsdp_save_sharded(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt);
/* fsdp_save_sharded that returns once this rank's shards are copied to a snapshot in RAM (the
   bytes its shard file holds, kept for the next save): a thread writes the file behind the
   training, and the checkpoint is committed (index.json written last, by rank 0) at the first
   fsdp_step, fsdp_save_wait, save or fsdp_destroy after every rank's file is complete, in
   order with the training's collectives (a small all-reduce per fsdp_step while a save is in
   flight). At most one save is in flight: the next call waits for it. A process killed at any
   moment leaves dir's previous checkpoint whole and loadable; a save that fails (a full disk)
   is logged, the directory keeps its previous checkpoint, training goes on, and fsdp_save_wait
   returns the failure. The files are byte for byte those fsdp_save_sharded writes. Collective. */
FSDP_API int fsdp_save_sharded_async(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt);
/* Waits until the asynchronous save in flight, if any, is written and committed. Returns the
   result of the last asynchronous save that finished, once (a later call returns 0 until another
   finishes); 0 when there was none. Collective. */
FSDP_API int fsdp_save_wait(fsdp_ctx *ctx);
/* Loads a sharded checkpoint at any world size, strategy and wrap policy. Collective. */
FSDP_API int fsdp_load_sharded(fsdp_ctx *ctx, const char *dir, const fsdp_load_options *opt, fsdp_load_report *report);

typedef struct fsdp_st_file fsdp_st_file; /* a safetensors file open for reading (below) */

/* Reading a sharded checkpoint's index.json without a context (tools). Opening checks it
   whole: every tensor's pieces cover [0, numel) exactly once and name listed files. */
typedef struct fsdp_index_piece {
    int file;              /* index into the file list */
    int64_t begin, end;    /* elements [begin, end) of the flattened tensor */
} fsdp_index_piece;

typedef struct fsdp_index_tensor {
    const char *name;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
    int num_pieces;
    const fsdp_index_piece *pieces; /* sorted by begin */
} fsdp_index_tensor;

typedef struct fsdp_index fsdp_index;

FSDP_API int fsdp_index_open(fsdp_index **out, const char *dir, char *err, size_t err_size);
/* Parses index.json's bytes held in memory (tools, the fuzz target); checks as fsdp_index_open. */
FSDP_API int fsdp_index_parse(fsdp_index **out, const void *bytes, size_t size, char *err, size_t err_size);
FSDP_API void fsdp_index_close(fsdp_index *index);
FSDP_API int fsdp_index_num_files(const fsdp_index *index);
FSDP_API const char *fsdp_index_file(const fsdp_index *index, int file);
/* Opens the file-th shard file of the checkpoint in dir as a safetensors file, as
   fsdp_load_sharded does: a regular file under that plain name, never a symbolic link. */
FSDP_API int fsdp_index_open_file(const fsdp_index *index, const char *dir, int file, fsdp_st_file **out, char *err,
                                  size_t err_size);
FSDP_API int fsdp_index_num_tensors(const fsdp_index *index);
FSDP_API const fsdp_index_tensor *fsdp_index_tensor_at(const fsdp_index *index, int i);
FSDP_API int fsdp_index_find(const fsdp_index *index, const char *name); /* index or -1 */
FSDP_API int fsdp_index_num_metadata(const fsdp_index *index);
FSDP_API fsdp_kv fsdp_index_metadata_at(const fsdp_index *index, int i);
FSDP_API const char *fsdp_index_metadata(const fsdp_index *index, const char *key); /* NULL if absent */
/* The saved world size, step and epoch; -1 where the index has none. */
FSDP_API int64_t fsdp_index_world_size(const fsdp_index *index);
FSDP_API int64_t fsdp_index_step(const fsdp_index *index);
FSDP_API int64_t fsdp_index_epoch(const fsdp_index *index);

/* Writes a whole file so that path holds either its old content or all of data, never a part:
   a temporary file beside it (created exclusively, mode 0600, refusing symlinks), fsync,
   rename, fsync of the directory; the final file gets 0666 less the umask. Returns
   FSDP_SUCCESS, FSDP_ERR_INVALID_ARG or FSDP_ERR_IO with the reason in err. */
FSDP_API int fsdp_write_file_atomic(const char *path, const void *data, size_t size, char *err, size_t err_size);

/* CRC-32C (Castagnoli), as used for the checksums: crc = fsdp_crc32c(0, data, n). */
FSDP_API uint32_t fsdp_crc32c(uint32_t crc, const void *data, size_t size);

/* Safetensors files without a context (tools, tests, fuzzing). Parsing checks everything:
   header length against the file, JSON syntax, dtypes, shapes against byte counts, offsets in
   range and not overlapping; any problem is FSDP_ERR_CORRUPT with a message in err. */
typedef struct fsdp_st_tensor {
    const char *name;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;     /* byte offsets within the data section */
} fsdp_st_tensor;


/* Opens a safetensors file. The path may be a symbolic link you made (latest.safetensors);
   it must lead to a regular file (a FIFO or device is refused, never waited on). Files that a
   sharded checkpoint names are opened with fsdp_index_open_file, which refuses links. */
FSDP_API int fsdp_st_open(fsdp_st_file **out, const char *path, char *err, size_t err_size);
/* Parses a whole file held in memory (the fuzz target's entry). */
FSDP_API int fsdp_st_parse(fsdp_st_file **out, const void *bytes, size_t size, char *err, size_t err_size);
FSDP_API void fsdp_st_close(fsdp_st_file *file);
FSDP_API int fsdp_st_num_tensors(const fsdp_st_file *file);
FSDP_API const fsdp_st_tensor *fsdp_st_tensor_at(const fsdp_st_file *file, int index);
FSDP_API int fsdp_st_find(const fsdp_st_file *file, const char *name); /* index or -1 */
FSDP_API int fsdp_st_num_metadata(const fsdp_st_file *file);
FSDP_API fsdp_kv fsdp_st_metadata_at(const fsdp_st_file *file, int index);
FSDP_API const char *fsdp_st_metadata(const fsdp_st_file *file, const char *key); /* NULL if absent */
/* Reads count elements from element first of a tensor (flattened), converted to f32. */
FSDP_API int fsdp_st_read(fsdp_st_file *file, int tensor, int64_t first, int64_t count, float *out, char *err,
                          size_t err_size);
/* As fsdp_st_read, in the tensor's own dtype: count * fsdp_dtype_size(dtype) bytes to out. */
FSDP_API int fsdp_st_read_raw(fsdp_st_file *file, int tensor, int64_t first, int64_t count, void *out, char *err,
                              size_t err_size);
/* Checks the tensor's stored crc32c (FSDP_ERR_CORRUPT on mismatch, FSDP_ERR_UNSUPPORTED if
   the file has none for it). */
FSDP_API int fsdp_st_verify(fsdp_st_file *file, int tensor, char *err, size_t err_size);
/* Bytes of the JSON header (after the 8-byte length, padding included). */
FSDP_API uint64_t fsdp_st_header_size(const fsdp_st_file *file);

/* Writing: declare every tensor up front, then stream their data in that order. Nothing is
   visible at path until fsdp_st_writer_close succeeds (temporary file, fsync, rename). */
typedef struct fsdp_st_spec {
    const char *name;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
} fsdp_st_spec;

typedef struct fsdp_st_writer fsdp_st_writer;

FSDP_API int fsdp_st_writer_open(fsdp_st_writer **out, const char *path, const fsdp_st_spec *tensors, int num_tensors,
                                 const fsdp_kv *metadata, int num_metadata, char *err, size_t err_size);
/* Appends the next bytes (in the declared dtype) of the tensors, in order. */
FSDP_API int fsdp_st_writer_write(fsdp_st_writer *writer, const void *data, size_t bytes);
/* Appends f32 values, converting them to the current tensor's dtype. */
FSDP_API int fsdp_st_writer_write_f32(fsdp_st_writer *writer, const float *values, size_t count);
FSDP_API int fsdp_st_writer_close(fsdp_st_writer *writer, char *err, size_t err_size);
FSDP_API void fsdp_st_writer_abort(fsdp_st_writer *writer);

/* ============================================================================================
   >>launcher
   ============================================================================================ */
/* What a rank runs. Its return value becomes the process's exit status (0 = success). */
typedef int (*fsdp_rank_fn)(fsdp_comm *comm, void *arg);

typedef struct fsdp_launch_desc {
    int nprocs;                 /* ranks to fork, >= 1 */
    fsdp_backend_kind backend;  /* FSDP_BACKEND_SHM (default) or FSDP_BACKEND_SOCKET (loopback) */
    int timeout_ms;             /* for the ranks' communicators; 0: FSDP_TIMEOUT_MS or default */
    size_t shm_slot_bytes;      /* 0: default */
    int shm_single_copy;        /* as fsdp_comm_desc.shm_single_copy */
    int max_restarts;           /* when a rank fails, stop the others and start all ranks again, up
                                   to this many times (torchrun's --max_restarts); the ranks see
                                   FSDP_RESTART_COUNT=<attempt> (0 first), e.g. to resume from the
                                   newest checkpoint */
    fsdp_logger logger;         /* for the ranks' communicators; default: as FSDP_DEBUG says */
} fsdp_launch_desc;

typedef struct fsdp_launch_status {
    int failed_rank;      /* first rank that failed, or -1 */
    int exit_code;        /* its exit status if it exited, else -1 */
    int signal;           /* the signal that killed it, else 0 */
    char message[256];    /* "rank 2 was killed by signal 9 (Killed)"; "" on success */
    int restarts;         /* restarts done (max_restarts): the status is the last attempt's */
} fsdp_launch_status;

/* Forks nprocs ranks joined by a shared-memory communicator, runs fn(comm, arg) in each and waits
   for all of them. If a rank crashes or returns non-zero, the other ranks' pending and later
   collectives fail at once and the ranks still running are stopped after a grace period.
   Returns FSDP_SUCCESS, or FSDP_ERR_RANK_FAILED and prints to stderr which rank failed and how.
   Call it from a single-threaded process (it forks). fn runs in the child; its memory writes
   are not visible to the caller. */
FSDP_API int fsdp_launch(int nprocs, fsdp_rank_fn fn, void *arg);
/* As fsdp_launch, with options and a status report instead of the message on stderr. */
FSDP_API int fsdp_launch_ex(const fsdp_launch_desc *desc, fsdp_rank_fn fn, void *arg,
                            fsdp_launch_status *status);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_H_INCLUDE */

/* ============================================================================================
   Implementation
   ============================================================================================ */
#ifdef FSDP_IMPLEMENTATION
#ifndef FSDP__IMPLEMENTED
#define FSDP__IMPLEMENTED

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#  include <linux/futex.h>
#  include <linux/inet_diag.h>
#  include <linux/netlink.h>
#  include <linux/sock_diag.h>
#  include <sys/vfs.h>
#endif
#if defined(__linux__) && !defined(O_TMPFILE)
#  define O_TMPFILE (020000000 | O_DIRECTORY)
#endif
#if defined(__linux__) && !defined(O_DIRECT) /* declared only under _GNU_SOURCE; the value is the architecture's */
#  if defined(__x86_64__) || defined(__i386__)
#    define O_DIRECT 040000
#  elif defined(__aarch64__) || defined(__arm__)
#    define O_DIRECT 0200000
#  endif
#endif
#if defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__))
#  include <emmintrin.h>
#  define FSDP__HAVE_STREAM 1
#else
#  define FSDP__HAVE_STREAM 0
#endif
#if FSDP__HAVE_STREAM && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#  include <immintrin.h> /* AVX2 streaming copies, chosen at run time */
#  define FSDP__HAVE_STREAM_AVX2 1
#else
#  define FSDP__HAVE_STREAM_AVX2 0
#endif
#ifdef FSDP_WITH_MPI
#  include <mpi.h>
#endif

#if defined(__GLIBC__) && (!defined(__USE_MISC) || !defined(__USE_XOPEN2K8))
#  error "fsdp.h: a system header came before fsdp.h in strict ISO C mode; put #define _GNU_SOURCE at the very top of this file (or compile with -D_GNU_SOURCE)"
#else /* the implementation: skipped after that error, which then is the only diagnostic */

/* ============================================================================================
   >>config
   Allocator, private macros, result codes, logging.
   ============================================================================================ */
#if defined(FSDP_MALLOC) && defined(FSDP_FREE) && defined(FSDP_REALLOC)
/* user allocator */
#elif !defined(FSDP_MALLOC) && !defined(FSDP_FREE) && !defined(FSDP_REALLOC)
#  define FSDP_MALLOC(size) malloc(size)
#  define FSDP_REALLOC(ptr, size) realloc(ptr, size)
#  define FSDP_FREE(ptr) free(ptr)
#else
#  error "fsdp.h: define all of FSDP_MALLOC, FSDP_REALLOC and FSDP_FREE, or none of them"
#endif

#ifndef FSDP_ASSERT
#  include <assert.h>
#  define FSDP_ASSERT(cond) assert(cond)
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define FSDP__PRIVATE static __attribute__((unused))
#  define FSDP__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define FSDP__PRIVATE static
#  define FSDP__PRINTF(a, b)
#endif

#ifdef __cplusplus
#  define FSDP__CAST(type, expr) (static_cast<type>(expr))
#else
#  define FSDP__CAST(type, expr) ((type)(expr))
#endif

/* snprintf that may truncate on purpose (messages are bounded); one place to say so. */
FSDP__PRIVATE int fsdp__fmt(char *buf, size_t size, const char *fmt, ...) FSDP__PRINTF(3, 4);
FSDP__PRIVATE int fsdp__fmt(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return n < 0 ? 0 : (size_t)n >= size ? (int)(size ? size - 1 : 0) : n;
}

#define FSDP__DEFAULT_TIMEOUT_MS 600000
#define FSDP__ERRMSG 512

/* Atomics through the GCC/Clang builtins: they work the same in C99, C11 and C++, on plain
   integers that live in shared memory. */
#define fsdp__load(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define fsdp__store(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define fsdp__fetch_add(p, v) __atomic_fetch_add((p), (v), __ATOMIC_ACQ_REL)

FSDP_API const char *fsdp_result_name(int result) {
    switch (result) {
#define FSDP__RESULT_NAME(name, value, text) case value: return #name;
        FSDP_RESULT_LIST(FSDP__RESULT_NAME)
#undef FSDP__RESULT_NAME
        default: return "FSDP_ERR_UNKNOWN";
    }
}

FSDP_API const char *fsdp_result_description(int result) {
    switch (result) {
#define FSDP__RESULT_TEXT(name, value, text) case value: return text;
        FSDP_RESULT_LIST(FSDP__RESULT_TEXT)
#undef FSDP__RESULT_TEXT
        default: return "unknown result code";
    }
}

FSDP_API const char *fsdp_version_string(void) { return FSDP_VERSION_STRING; }

FSDP_API void fsdp_log_stderr(void *user, fsdp_log_level level, const char *message) {
    static const char *names[] = {"", "error", "warning", "info", "debug"};
    (void)user;
    fprintf(stderr, "fsdp: %s: %s\n", names[level >= 1 && level <= 4 ? level : 0], message);
}

FSDP__PRIVATE void fsdp__vlog(const fsdp_logger *logger, fsdp_log_level level, const char *fmt,
                              va_list ap) {
    char message[FSDP__ERRMSG];
    fsdp_log_level max_level = logger->max_level ? logger->max_level : FSDP_LOG_WARN;
    if (!logger->fn || level > max_level) return;
    vsnprintf(message, sizeof message, fmt, ap);
    logger->fn(logger->user, level, message);
}

FSDP__PRIVATE void fsdp__log(const fsdp_logger *logger, fsdp_log_level level, const char *fmt, ...)
    FSDP__PRINTF(3, 4);
FSDP__PRIVATE void fsdp__log(const fsdp_logger *logger, fsdp_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fsdp__vlog(logger, level, fmt, ap);
    va_end(ap);
}

/* The default logger of objects made from the environment: warnings only (errors are
   returned to the caller, who reports them), so fallbacks and security problems are seen. */
static void fsdp__log_warnings(void *user, fsdp_log_level level, const char *message) {
    if (level == FSDP_LOG_WARN) fsdp_log_stderr(user, level, message);
}

/* How objects the library configures from the environment log: an explicit logger always
   wins; else FSDP_DEBUG (unset: warnings; 0: silent; 1..3: errors and warnings, info, debug). */
FSDP__PRIVATE fsdp_logger fsdp__env_logger(fsdp_logger given) {
    const char *debug = getenv("FSDP_DEBUG");
    if (given.fn) return given;
    if (!debug || !*debug) {
        given.fn = fsdp__log_warnings;
        given.max_level = FSDP_LOG_WARN;
        return given;
    }
    if (strcmp(debug, "0") == 0) return given;
    given.fn = fsdp_log_stderr;
    given.max_level = FSDP__CAST(fsdp_log_level, FSDP_LOG_WARN + (atoi(debug) > 1 ? atoi(debug) - 1 : 0));
    if (given.max_level > FSDP_LOG_DEBUG) given.max_level = FSDP_LOG_DEBUG;
    return given;
}

/* ============================================================================================
   >>utilities
   Time, sleeping, strings for display, small parsers.
   ============================================================================================ */
FSDP_API double fsdp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

FSDP__PRIVATE int64_t fsdp__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

FSDP__PRIVATE void fsdp__sleep_us(long us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

FSDP__PRIVATE void *fsdp__calloc(size_t size) {
    void *p = FSDP_MALLOC(size ? size : 1);
    if (p) memset(p, 0, size ? size : 1);
    return p;
}

/* Tells a worker thread to stop (*stop set under its lock, its condition broadcast) and joins it. */
FSDP__PRIVATE void fsdp__thread_stop(pthread_t thread, pthread_mutex_t *lock, pthread_cond_t *cond, int *stop) {
    pthread_mutex_lock(lock);
    *stop = 1;
    pthread_cond_broadcast(cond);
    pthread_mutex_unlock(lock);
    pthread_join(thread, NULL);
}

FSDP__PRIVATE void fsdp__copy_string(char *dst, size_t dst_size, const char *src) {
    size_t n = 0;
    if (!dst_size) return;
    while (src && src[n] && n + 1 < dst_size) n++;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* Length (2 to 4) of the well-formed UTF-8 sequence of a character beyond ASCII at p (at most
   n bytes available): no stray or missing continuation byte, no overlong form, no surrogate,
   nothing past U+10FFFF; 0 otherwise. */
static size_t fsdp__utf8_sequence(const unsigned char *p, size_t n) {
    size_t len = p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : p[0] >= 0xe0 && p[0] <= 0xef ? 3 : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : 0;
    size_t k;
    if (!len || len > n) return 0;
    for (k = 1; k < len; k++)
        if ((p[k] & 0xc0) != 0x80) return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) || (p[0] == 0xf0 && p[1] < 0x90) ||
        (p[0] == 0xf4 && p[1] > 0x8f))
        return 0;
    return len;
}

/* fsdp__utf8_sequence's length if the character is not one that changes how the text around it
   shows: a C1 control (U+0080..U+009F, which terminals may obey), a bidirectional mark,
   embedding, override or isolate (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069: they
   reorder what follows), a line or paragraph separator (U+2028, U+2029: a fake new line in
   some viewers) or U+FEFF; 0 otherwise. */
static size_t fsdp__utf8_length(const unsigned char *p, size_t n) {
    size_t len = fsdp__utf8_sequence(p, n);
    if (!len || (p[0] == 0xc2 && p[1] < 0xa0) ||                                    /* C1 */
        (p[0] == 0xd8 && p[1] == 0x9c) ||                                           /* U+061C */
        (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0x8e || p[2] == 0x8f || (p[2] >= 0xa8 && p[2] <= 0xae))) ||
        (p[0] == 0xe2 && p[1] == 0x81 && p[2] >= 0xa6 && p[2] <= 0xa9) ||               /* U+2066..U+2069 */
        (p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf))                                  /* U+FEFF */
        return 0;
    return len;
}

/* fsdp_printable on at most src_size bytes of src (stopping at a NUL): for text from outside
   (a peer, a file) that need not be terminated. */
FSDP__PRIVATE const char *fsdp__printable_n(char *dst, size_t size, const char *src, size_t src_size) {
    const unsigned char *p = (const unsigned char *)src;
    size_t used = 0, i = 0, room_for_dots = 0; /* room_for_dots: where "..." would still fit */
    if (!dst || !size) return dst;
    while (src && i < src_size && p[i]) {
        size_t len = p[i] >= 0x20 && p[i] < 0x7f ? 1 : fsdp__utf8_length(p + i, src_size - i);
        size_t need = len ? len : 4;
        if (used + need + 1 > size) { /* does not fit: cut at a whole character, then "..." */
            if (size >= 4) {
                memcpy(dst + room_for_dots, "...", 3);
                used = room_for_dots + 3;
            }
            break;
        }
        if (len) memcpy(dst + used, p + i, len);
        else fsdp__fmt(dst + used, 5, "\\x%02x", (unsigned)p[i]);
        used += need;
        i += len ? len : 1;
        if (used + 4 <= size) room_for_dots = used;
    }
    dst[used] = 0;
    return dst;
}

FSDP_API const char *fsdp_printable(char *dst, size_t size, const char *src) {
    return fsdp__printable_n(dst, size, src, src ? strlen(src) : 0);
}

/* fsdp__copy_string that cuts src between characters: a well-formed UTF-8 character is copied
   whole or not at all (any other byte counts as one character). */
FSDP__PRIVATE void fsdp__copy_utf8(char *dst, size_t size, const char *src) {
    const unsigned char *p = (const unsigned char *)src;
    size_t n = strlen(src), used = 0;
    if (!size) return;
    while (used < n) {
        size_t len = p[used] < 0x80 ? 1 : fsdp__utf8_sequence(p + used, n - used);
        if (used + (len ? len : 1) + 1 > size) break;
        used += len ? len : 1;
    }
    memcpy(dst, src, used);
    dst[used] = 0;
}

FSDP__PRIVATE void fsdp__hex(char *out, const unsigned char *bytes, size_t n) {
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = 0;
}

/* Parses a whole decimal integer in [lo, hi]; 0 on success. */
FSDP__PRIVATE int fsdp__parse_int(const char *text, long lo, long hi, long *out) {
    char *end = NULL;
    long value;
    if (!text || !*text) return -1;
    errno = 0;
    value = strtol(text, &end, 10);
    if (errno || !end || *end || value < lo || value > hi) return -1;
    *out = value;
    return 0;
}

/* Reads the first set variable of a list as an int in [lo, hi]. 1 found, 0 unset, -1 malformed. */
FSDP__PRIVATE int fsdp__env_int(const char *const *names, long lo, long hi, long *out, char *err, size_t err_size) {
    int i;
    for (i = 0; names[i]; i++) {
        const char *text = getenv(names[i]);
        if (!text) continue;
        if (fsdp__parse_int(text, lo, hi, out) != 0) {
            fsdp__fmt(err, err_size, "environment variable %s='%s' is not an integer in [%ld, %ld]", names[i], text, lo, hi);
            return -1;
        }
        return 1;
    }
    return 0;
}

/* ============================================================================================
   >>chaos
   Perturbation for the tests, compiled in only with FSDP_CHAOS: seeded random delays, yields,
   reorderings and short socket pieces wherever timing could leak into results (every wait on
   another rank or thread, shm rounds and the pieces read in them, socket transfers, the loops
   of the comm, step, I/O, network and checkpoint-writer threads, the order offload requests run
   in). Every result must stay what an unperturbed run gives, bit for bit (make test-chaos,
   examples/chaos.sh). FSDP_CHAOS_SEED=N (N > 0; read once per process) turns it on: N picks
   the profile (how often and how long each kind of place is perturbed, how short socket pieces
   get) and, with the rank, seeds a stream of decisions per thread; the interleaving that comes
   out still varies from run to run. Without FSDP_CHAOS every call site compiles to nothing:
   FSDP__CHAOS(kind) and FSDP__CHAOS_RANK(rank) are ((void)0), FSDP__CHAOS_COIN(kind) and
   FSDP__CHAOS_PICK(n) are 0, FSDP__CHAOS_CUT(len) is len, FSDP__CHAOS_CUT_IOV(iov, n) is ((void)0).
   ============================================================================================ */
/* The kinds of places (each with its own rate and longest delay in a profile) */
enum {
    FSDP__CHAOS_WAIT,   /* before and after a wait for another rank or thread */
    FSDP__CHAOS_ROUND,  /* shm: a round's start, publication and end */
    FSDP__CHAOS_PIECE,  /* shm: each peer's data read in a round; the order peers are waited for */
    FSDP__CHAOS_SOCKET, /* socket: each call that sends or receives (and where a transfer stops early) */
    FSDP__CHAOS_THREAD, /* the comm, step, network and checkpoint-writer threads: each task they take */
    FSDP__CHAOS_IO,     /* the offload I/O thread: each request, and running queued ones out of order */
    FSDP__CHAOS_KINDS
};

#ifdef FSDP_CHAOS
typedef struct fsdp__chaos_profile {
    long seed;                          /* 0: off */
    uint32_t every[FSDP__CHAOS_KINDS];  /* a place of the kind acts once in `every` visits (0: never) */
    uint32_t max_us[FSDP__CHAOS_KINDS]; /* ... sleeping up to this long, or yielding, or spinning */
    uint32_t cut_every, cut_max;        /* a socket send or receive is cut short once in cut_every (fsdp__chaos_cut) */
} fsdp__chaos_profile;

/* Process-wide, test builds only: the profile (written once, under fsdp__chaos_once), the rank
   of the process's first communicator and the streams handed out; each thread's stream is
   thread-local. */
static fsdp__chaos_profile fsdp__chaos;
static pthread_once_t fsdp__chaos_once = PTHREAD_ONCE_INIT;
static int fsdp__chaos_rank = -1;
static uint64_t fsdp__chaos_streams;
static __thread uint64_t fsdp__chaos_state;

static uint64_t fsdp__mix64(uint64_t x); /* >>model */

static void fsdp__chaos_init(void) {
    static const uint32_t every[] = {0, 1, 3, 8, 32, 128}, max_us[] = {10, 100, 1000}, cut_max[] = {1, 7, 64, 4096};
    const char *text = getenv("FSDP_CHAOS_SEED");
    uint64_t h;
    int k;
    if (!text || !*text) return;
    if (fsdp__parse_int(text, 0, 0x7fffffffL, &fsdp__chaos.seed) != 0) {
        fprintf(stderr, "fsdp.h: FSDP_CHAOS_SEED='%s' is not an integer in [0, 2147483647]: no perturbation\n", text);
        fsdp__chaos.seed = 0;
        return;
    }
    h = fsdp__mix64((uint64_t)fsdp__chaos.seed);
    for (k = 0; k < FSDP__CHAOS_KINDS; k++, h = fsdp__mix64(h + 0x9e3779b97f4a7c15ull)) {
        fsdp__chaos.every[k] = every[h % 6];
        fsdp__chaos.max_us[k] = max_us[(h >> 16) % 3];
    }
    fsdp__chaos.cut_every = every[1 + h % 5];
    fsdp__chaos.cut_max = cut_max[(h >> 16) % 4];
}

/* The next decision of this thread's stream; 0 when the process is not perturbed. */
static uint64_t fsdp__chaos_next(void) {
    pthread_once(&fsdp__chaos_once, fsdp__chaos_init);
    if (!fsdp__chaos.seed) return 0;
    if (!fsdp__chaos_state)
        fsdp__chaos_state = fsdp__mix64((uint64_t)fsdp__chaos.seed ^ fsdp__mix64((uint64_t)(fsdp__chaos_rank + 2)) ^
                                        fsdp__mix64(__atomic_add_fetch(&fsdp__chaos_streams, 1, __ATOMIC_RELAXED) << 32)) | 1;
    fsdp__chaos_state += 0x9e3779b97f4a7c15ull;
    return fsdp__mix64(fsdp__chaos_state) | 1; /* (never 0) */
}

/* 1 once in four times the kind's rate: a decision that changes a path, not only its timing. */
FSDP__PRIVATE int fsdp__chaos_coin(int kind) {
    uint64_t r = fsdp__chaos_next();
    return r && fsdp__chaos.every[kind] && (r >> 8) % (4 * fsdp__chaos.every[kind]) == 0;
}

/* At a place of the kind, now and then: yield the core, keep it busy for a while (a slow
   thread that holds its core), or sleep. */
FSDP__PRIVATE void fsdp__chaos_point(int kind) {
    uint64_t r = fsdp__chaos_next();
    long us;
    if (!r || !fsdp__chaos.every[kind] || (r >> 8) % fsdp__chaos.every[kind]) return;
    us = (long)((r >> 32) % (fsdp__chaos.max_us[kind] + 1));
    if ((r & 6) == 0) {
        sched_yield();
    } else if ((r & 6) == 2) {
        double until = fsdp_now() + (double)(us < 50 ? us : 50) * 1e-6;
        while (fsdp_now() < until) {}
    } else {
        fsdp__sleep_us(us);
    }
}

/* A length of 1..len for a socket transfer: len, or now and then a short piece, of up to cut_max
   bytes or a sixteenth of len (a large transfer in a few dozen pieces, not in bytes). */
FSDP__PRIVATE size_t fsdp__chaos_cut(size_t len) {
    uint64_t r = fsdp__chaos_next();
    size_t cut, most = len / 16 > fsdp__chaos.cut_max ? len / 16 : fsdp__chaos.cut_max;
    if (!r || len <= 1 || (r >> 8) % fsdp__chaos.cut_every) return len;
    cut = 1 + (size_t)((r >> 32) % most);
    return cut < len ? cut : len;
}

/* iov[0..n) cut now and then to a short piece of their total (fsdp__chaos_cut). */
FSDP__PRIVATE void fsdp__chaos_cut_iov(struct iovec *iov, int n) {
    size_t total = 0, piece;
    int i;
    for (i = 0; i < n; i++) total += iov[i].iov_len;
    piece = fsdp__chaos_cut(total);
    for (i = 0; i < n; i++) {
        if (iov[i].iov_len > piece) iov[i].iov_len = piece;
        piece -= iov[i].iov_len;
    }
}

/* One of 0..n-1 (n >= 1), at random. */
FSDP__PRIVATE int fsdp__chaos_pick(int n) {
    uint64_t r = fsdp__chaos_next();
    return n > 1 && r ? (int)((r >> 16) % (uint64_t)n) : 0;
}

/* The rank that seeds the streams: the first communicator's of the process. */
FSDP__PRIVATE void fsdp__chaos_set_rank(int rank) {
    if (fsdp__chaos_rank < 0) fsdp__chaos_rank = rank;
}

#  define FSDP__CHAOS(kind) fsdp__chaos_point(kind)
#  define FSDP__CHAOS_COIN(kind) fsdp__chaos_coin(kind)
#  define FSDP__CHAOS_CUT(len) fsdp__chaos_cut(len)
#  define FSDP__CHAOS_CUT_IOV(iov, n) fsdp__chaos_cut_iov((iov), (n))
#  define FSDP__CHAOS_PICK(n) fsdp__chaos_pick(n)
#  define FSDP__CHAOS_RANK(rank) fsdp__chaos_set_rank(rank)
#else
#  define FSDP__CHAOS(kind) ((void)0)
#  define FSDP__CHAOS_COIN(kind) 0
#  define FSDP__CHAOS_CUT(len) (len)
#  define FSDP__CHAOS_CUT_IOV(iov, n) ((void)0)
#  define FSDP__CHAOS_PICK(n) 0
#  define FSDP__CHAOS_RANK(rank) ((void)0)
#endif

/* ============================================================================================
   >>dtypes
   f32 / bf16 / f16 conversions and the rank-order reductions every backend uses.
   ============================================================================================ */
FSDP_API size_t fsdp_dtype_size(fsdp_dtype dtype) {
    switch (dtype) {
        case FSDP_F32: return 4;
        case FSDP_BF16: case FSDP_F16: return 2;
        default: return 0;
    }
}

FSDP_API const char *fsdp_dtype_name(fsdp_dtype dtype) {
    switch (dtype) {
        case FSDP_F32: return "f32";
        case FSDP_BF16: return "bf16";
        case FSDP_F16: return "f16";
        default: return "invalid";
    }
}

static inline uint32_t fsdp__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fsdp__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t fsdp__to_bf16(float value) {
    uint32_t bits = fsdp__f32_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float fsdp__from_bf16(uint16_t value) { return fsdp__bits_f32((uint32_t)value << 16); }

static inline uint16_t fsdp__to_f16(float value) {
    uint32_t bits = fsdp__f32_bits(value);
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) /* Inf stays Inf; NaN becomes a quiet NaN with its top payload */
        return (uint16_t)(sign | 0x7c00u |
                          (magnitude > 0x7f800000u ? 0x0200u | ((magnitude >> 13) & 0x3ffu) : 0u));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
    if (magnitude < 0x38800000u) {
        /* Below 2^-14: adding 0.5 puts the value's 2^-24 units in the low mantissa bits and lets
           the FPU round to nearest even; the result is the f16 subnormal (or 0x0400). */
        float shifted = fsdp__bits_f32(magnitude) + 0.5f;
        return (uint16_t)(sign | (fsdp__f32_bits(shifted) - 0x3f000000u));
    }
    magnitude += 0xc8000fffu + ((magnitude >> 13) & 1u); /* rebias 127 -> 15 and round */
    return (uint16_t)(sign | (magnitude >> 13));
}

static inline float fsdp__from_f16(uint16_t value) {
    uint32_t sign = (uint32_t)(value & 0x8000u) << 16;
    uint32_t exponent = (value >> 10) & 0x1fu;
    uint32_t mantissa = value & 0x3ffu;
    if (exponent == 0) {
        float magnitude = (float)mantissa * 5.9604644775390625e-8f; /* exact: mantissa * 2^-24 */
        return fsdp__bits_f32(fsdp__f32_bits(magnitude) | sign);
    }
    if (exponent == 31) return fsdp__bits_f32(sign | 0x7f800000u | (mantissa << 13));
    return fsdp__bits_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

FSDP_API uint16_t fsdp_f32_to_bf16(float value) { return fsdp__to_bf16(value); }
FSDP_API float fsdp_bf16_to_f32(uint16_t value) { return fsdp__from_bf16(value); }
FSDP_API uint16_t fsdp_f32_to_f16(float value) { return fsdp__to_f16(value); }
FSDP_API float fsdp_f16_to_f32(uint16_t value) { return fsdp__from_f16(value); }

/* acc (+) x: the one combining rule of every reduction (MAX: the earliest rank's NaN wins). */
static inline float fsdp__combine(float acc, float x, fsdp_reduce_op op) {
    if (op != FSDP_MAX) return acc + x;
    if (acc != acc) return acc;
    if (x != x) return x;
    return acc > x ? acc : x;
}

#if FSDP__HAVE_STREAM
/* SSE2 (every x86-64): 4 lanes of bf16 -> f32 is a 16-bit shift, done by interleaving zeros. */
static inline __m128 fsdp__bf16x4_to_ps(const uint16_t *x) {
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)x)));
}

/* Round-to-nearest-even of 4 floats to bf16 bits (NaN kept quiet), in the low 16 bits of
   each 32-bit lane, sign-extended so _mm_packs_epi32 keeps the bit pattern. */
static inline __m128i fsdp__ps_to_bf16x4(__m128 v) {
    const __m128i bits = _mm_castps_si128(v);
    __m128i lsb = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
    __m128i rounded = _mm_add_epi32(_mm_add_epi32(bits, _mm_set1_epi32(0x7fff)), lsb);
    __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(bits, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
    __m128i quiet = _mm_or_si128(bits, _mm_set1_epi32(0x00400000));
    __m128i out = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(_mm_slli_epi32(_mm_srli_epi32(out, 16), 16), 16);
}

/* f16 -> f32 on 4 lanes, exactly fsdp__from_f16: the exponent is rebased by adding 112 (another 112
   for Inf/NaN); a subnormal m * 2^-24 is (2^-14 with mantissa m) - 2^-14, exact. */
static inline __m128 fsdp__f16x4_to_ps(const uint16_t *x) {
    const __m128i h = _mm_unpacklo_epi16(_mm_loadl_epi64((const __m128i *)x), _mm_setzero_si128());
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
    const __m128i body = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13);
    const __m128i exponent = _mm_and_si128(body, _mm_set1_epi32(0x0f800000));
    const __m128i special = _mm_cmpeq_epi32(exponent, _mm_set1_epi32(0x0f800000));
    const __m128i tiny = _mm_cmpeq_epi32(exponent, _mm_setzero_si128());
    const __m128i rebias = _mm_set1_epi32(112 << 23), magic = _mm_set1_epi32(113 << 23);
    __m128i normal = _mm_add_epi32(_mm_add_epi32(body, rebias), _mm_and_si128(special, rebias));
    __m128 subnormal = _mm_sub_ps(_mm_castsi128_ps(_mm_add_epi32(body, magic)), _mm_castsi128_ps(magic));
    __m128i out = _mm_or_si128(_mm_and_si128(tiny, _mm_castps_si128(subnormal)), _mm_andnot_si128(tiny, normal));
    return _mm_castsi128_ps(_mm_or_si128(out, sign));
}

/* f32 -> f16 bits on 4 lanes, exactly fsdp__to_f16 (the same integer steps; the subnormal lanes
   round in the same float addition), sign-extended from 16 bits for _mm_packs_epi32. */
static inline __m128i fsdp__ps_to_f16x4(__m128 v) {
    const __m128i bits = _mm_castps_si128(v);
    const __m128i sign = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(0x8000));
    const __m128i magnitude = _mm_and_si128(bits, _mm_set1_epi32(0x7fffffff));
    const __m128i tiny = _mm_cmplt_epi32(magnitude, _mm_set1_epi32(0x38800000));
    const __m128i huge = _mm_cmpgt_epi32(magnitude, _mm_set1_epi32(0x477fefff)); /* >= 65520: Inf or NaN */
    const __m128i nan = _mm_cmpgt_epi32(magnitude, _mm_set1_epi32(0x7f800000));
    const __m128i lsb = _mm_and_si128(_mm_srli_epi32(magnitude, 13), _mm_set1_epi32(1));
    __m128i normal = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(magnitude, _mm_set1_epi32((int)0xc8000fffu)), lsb), 13);
    /* only the tiny lanes go through the float addition (the others add 0.5 to +0) */
    __m128 shifted = _mm_add_ps(_mm_castsi128_ps(_mm_and_si128(tiny, magnitude)), _mm_set1_ps(0.5f));
    __m128i subnormal = _mm_sub_epi32(_mm_castps_si128(shifted), _mm_set1_epi32(0x3f000000));
    __m128i payload = _mm_or_si128(_mm_set1_epi32(0x0200), _mm_and_si128(_mm_srli_epi32(magnitude, 13), _mm_set1_epi32(0x3ff)));
    __m128i infinite = _mm_or_si128(_mm_set1_epi32(0x7c00), _mm_and_si128(nan, payload));
    __m128i out = _mm_or_si128(_mm_and_si128(tiny, subnormal), _mm_andnot_si128(tiny, normal));
    out = _mm_or_si128(_mm_and_si128(huge, infinite), _mm_andnot_si128(huge, out));
    out = _mm_or_si128(out, sign);
    return _mm_srai_epi32(_mm_slli_epi32(out, 16), 16);
}

/* fsdp__combine on 4 lanes: maxps(acc, x) is "acc > x ? acc : x", and x when either is NaN;
   an acc NaN is then put back. */
static inline __m128 fsdp__combine_ps(__m128 acc, __m128 x, fsdp_reduce_op op) {
    __m128 acc_nan;
    if (op != FSDP_MAX) return _mm_add_ps(acc, x);
    acc_nan = _mm_cmpunord_ps(acc, acc);
    return _mm_or_ps(_mm_and_ps(acc_nan, acc), _mm_andnot_ps(acc_nan, _mm_max_ps(acc, x)));
}

/* 4 bf16 or f16 values widened to f32, and 4 floats rounded to bf16 or f16 (for _mm_packs_epi32) */
static inline __m128 fsdp__half4_to_ps(const uint16_t *x, fsdp_dtype dtype) {
    return dtype == FSDP_BF16 ? fsdp__bf16x4_to_ps(x) : fsdp__f16x4_to_ps(x);
}

static inline __m128i fsdp__ps_to_half4(__m128 v, fsdp_dtype dtype) {
    return dtype == FSDP_BF16 ? fsdp__ps_to_bf16x4(v) : fsdp__ps_to_f16x4(v);
}
#endif

/* one bf16 or f16 value widened to f32, and one float rounded to bf16 or f16 */
static inline float fsdp__from_half(uint16_t value, fsdp_dtype dtype) {
    return dtype == FSDP_BF16 ? fsdp__from_bf16(value) : fsdp__from_f16(value);
}

static inline uint16_t fsdp__to_half(float value, fsdp_dtype dtype) {
    return dtype == FSDP_BF16 ? fsdp__to_bf16(value) : fsdp__to_f16(value);
}

/* fsdp__accumulate of bf16 or f16 values; called with a constant dtype, so that each copy of the
   loop is specialised to one conversion */
static inline void fsdp__accumulate_half(float *acc, const uint16_t *x, fsdp_dtype dtype, size_t n, fsdp_reduce_op op,
                                         int first) {
    size_t i = 0;
#if FSDP__HAVE_STREAM
    if (first) for (; i + 4 <= n; i += 4) _mm_storeu_ps(acc + i, fsdp__half4_to_ps(x + i, dtype));
    else for (; i + 4 <= n; i += 4) _mm_storeu_ps(acc + i, fsdp__combine_ps(_mm_loadu_ps(acc + i), fsdp__half4_to_ps(x + i, dtype), op));
#endif
    for (; i < n; i++) acc[i] = first ? fsdp__from_half(x[i], dtype) : fsdp__combine(acc[i], fsdp__from_half(x[i], dtype), op);
}

/* acc = x0 (+) x1 of bf16 or f16 values, widened: the first two sources of a fold in one pass
   (constant dtype, as fsdp__accumulate_half) */
static inline void fsdp__fold_two_half(float *acc, const uint16_t *x0, const uint16_t *x1, fsdp_dtype dtype, size_t n,
                                       fsdp_reduce_op op) {
    size_t i = 0;
#if FSDP__HAVE_STREAM
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(acc + i, fsdp__combine_ps(fsdp__half4_to_ps(x0 + i, dtype), fsdp__half4_to_ps(x1 + i, dtype), op));
#endif
    for (; i < n; i++) acc[i] = fsdp__combine(fsdp__from_half(x0[i], dtype), fsdp__from_half(x1[i], dtype), op);
}

/* acc = x (first) or acc = acc (+) x, widening x to f32: one source of a rank-order fold. */
FSDP__PRIVATE void fsdp__accumulate(float *acc, const void *src, fsdp_dtype dtype, size_t n, fsdp_reduce_op op, int first) {
    size_t i = 0;
    if (dtype == FSDP_F32) {
        const float *x = (const float *)src;
        if (first) { if ((const void *)acc != src) memmove(acc, x, n * sizeof(float)); return; }
#if FSDP__HAVE_STREAM
        for (; i + 4 <= n; i += 4) _mm_storeu_ps(acc + i, fsdp__combine_ps(_mm_loadu_ps(acc + i), _mm_loadu_ps(x + i), op));
#endif
        for (; i < n; i++) acc[i] = fsdp__combine(acc[i], x[i], op);
    } else if (dtype == FSDP_BF16) {
        fsdp__accumulate_half(acc, (const uint16_t *)src, FSDP_BF16, n, op, first);
    } else {
        fsdp__accumulate_half(acc, (const uint16_t *)src, FSDP_F16, n, op, first);
    }
}

/* acc = x0 (+) x1, widened to f32: the first two sources of a rank-order fold in one pass. */
FSDP__PRIVATE void fsdp__fold_two(float *acc, const void *src0, const void *src1, fsdp_dtype dtype, size_t n,
                                  fsdp_reduce_op op) {
    size_t i = 0;
    if (dtype == FSDP_F32) {
        const float *x0 = (const float *)src0, *x1 = (const float *)src1;
#if FSDP__HAVE_STREAM
        for (; i + 4 <= n; i += 4) _mm_storeu_ps(acc + i, fsdp__combine_ps(_mm_loadu_ps(x0 + i), _mm_loadu_ps(x1 + i), op));
#endif
        for (; i < n; i++) acc[i] = fsdp__combine(x0[i], x1[i], op);
    } else if (dtype == FSDP_BF16) {
        fsdp__fold_two_half(acc, (const uint16_t *)src0, (const uint16_t *)src1, FSDP_BF16, n, op);
    } else {
        fsdp__fold_two_half(acc, (const uint16_t *)src0, (const uint16_t *)src1, FSDP_F16, n, op);
    }
}

FSDP__PRIVATE void fsdp__to_f32(float *dst, const void *src, fsdp_dtype dtype, size_t count) {
    if (dtype == FSDP_F32) { if ((const void *)dst != src) memmove(dst, src, count * 4); return; }
    fsdp__accumulate(dst, src, dtype, count, FSDP_SUM, 1);
}

/* fsdp__from_f32 to bf16 or f16, called with a constant dtype (see fsdp__accumulate_half) */
static inline void fsdp__from_f32_half(uint16_t *d, fsdp_dtype dtype, const float *src, size_t count) {
    size_t i = 0;
#if FSDP__HAVE_STREAM
    for (; i + 8 <= count; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm_packs_epi32(fsdp__ps_to_half4(_mm_loadu_ps(src + i), dtype),
                                                             fsdp__ps_to_half4(_mm_loadu_ps(src + i + 4), dtype)));
#endif
    for (; i < count; i++) d[i] = fsdp__to_half(src[i], dtype);
}

FSDP__PRIVATE void fsdp__from_f32(void *dst, fsdp_dtype dtype, const float *src, size_t count) {
    if (dtype == FSDP_F32) { if (dst != (const void *)src) memmove(dst, src, count * 4); return; }
    if (dtype == FSDP_BF16) fsdp__from_f32_half((uint16_t *)dst, FSDP_BF16, src, count);
    else fsdp__from_f32_half((uint16_t *)dst, FSDP_F16, src, count);
}

FSDP_API void fsdp_convert(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_dtype src_dtype,
                           size_t count) {
    float block[1024];
    size_t done = 0;
    if (!dst || !src || !fsdp_dtype_size(dst_dtype) || !fsdp_dtype_size(src_dtype)) return;
    if (dst_dtype == src_dtype) { if (dst != src) memmove(dst, src, count * fsdp_dtype_size(src_dtype)); return; }
    if (dst_dtype == FSDP_F32) { fsdp__to_f32((float *)dst, src, src_dtype, count); return; }
    if (src_dtype == FSDP_F32) { fsdp__from_f32(dst, dst_dtype, (const float *)src, count); return; }
    while (done < count) { /* bf16 <-> f16 through fp32, in blocks */
        size_t n = count - done < 1024 ? count - done : 1024;
        fsdp__to_f32(block, (const char *)src + done * 2, src_dtype, n);
        fsdp__from_f32((char *)dst + done * 2, dst_dtype, block, n);
        done += n;
    }
}

/* Reductions. One canonical order for every backend: acc = x0; acc = acc (+) x1; ... in fp32,
   then (AVG) acc / divisor, then one rounding to the dtype. */

FSDP__PRIVATE void fsdp__reduce_block_f32(float *acc, const void *const *srcs, int nsrc, size_t offset,
                                          size_t n, fsdp_dtype dtype, fsdp_reduce_op op, int fuse) {
    size_t esize = fsdp_dtype_size(dtype);
    int s = 0;
    if (fuse && nsrc >= 2) { /* acc = x0 (+) x1 in one pass, not a copy and a pass over acc */
        fsdp__fold_two(acc, (const char *)srcs[0] + offset * esize, (const char *)srcs[1] + offset * esize, dtype, n, op);
        s = 2;
    }
    for (; s < nsrc; s++) fsdp__accumulate(acc, (const char *)srcs[s] + offset * esize, dtype, n, op, s == 0);
}

/* fsdp_reduce_ranks. fuse 0: the first rank's values are copied to dst before the second's are
   added, for a dst whose cache lines peers still hold (they read it after every op): the copy
   takes such lines over faster than the fused pass's stores do; elsewhere the fused pass wins. */
FSDP__PRIVATE void fsdp__reduce_ranks(void *dst, const void *const *srcs, int nsrc, size_t count,
                                      fsdp_dtype dtype, fsdp_reduce_op op, int avg_divisor, int fuse) {
    float block[2048];
    size_t done = 0, esize = fsdp_dtype_size(dtype);
    if (!dst || !srcs || nsrc < 1 || !esize) return;
    if (op == FSDP_REDUCE_DEFAULT) op = FSDP_SUM;
    int s, in_place = dtype == FSDP_F32;
    for (s = 1; s < nsrc; s++) /* dst may alias srcs[0] only when accumulating in place */
        if (srcs[s] == dst) in_place = 0;
    while (done < count) {
        size_t i, n = count - done < 2048 ? count - done : 2048;
        float *acc = in_place ? (float *)dst + done : block;
        fsdp__reduce_block_f32(acc, srcs, nsrc, done, n, dtype, op, fuse);
        if (op == FSDP_AVG && (avg_divisor > 0 ? avg_divisor : nsrc) != 1) { /* x / 1 == x: skip the pass */
            float divisor = (float)(avg_divisor > 0 ? avg_divisor : nsrc);
            for (i = 0; i < n; i++) acc[i] /= divisor;
        }
        if (!in_place) fsdp__from_f32((char *)dst + done * esize, dtype, acc, n);
        done += n;
    }
}

FSDP_API void fsdp_reduce_ranks(void *dst, const void *const *srcs, int nsrc, size_t count,
                                fsdp_dtype dtype, fsdp_reduce_op op, int avg_divisor) {
    fsdp__reduce_ranks(dst, srcs, nsrc, count, dtype, op, avg_divisor, 1);
}

/* ============================================================================================
   >>wire
   Wire formats: what a copy of f32 values looks like on a link. A format is a row
   (fsdp__wire_row): its name, the bytes n elements take, encode (f32 -> bytes), decode (bytes ->
   f32, bf16 or f16) and whether encode reports non-finite inputs. f32, bf16 and f16 travel as
   their dtype (converted as fsdp_convert converts: NaN and infinity travel as they are). int8 and
   int4 are symmetric block quantization: one f32 scale per block of K elements, K a multiple of 8
   in [8, 4096] (default FSDP__WIRE_BLOCK).

   Layout of a run of n elements: ceil(n / K) blocks, block b holding elements [b K, min(n, b K + K)),
   each written as its scale (4 bytes: an f32 in the machine's byte order, as f32 payloads travel)
   then its codes. int8: one byte per element, two's complement. int4: one nibble per element,
   4-bit two's complement (code & 15), element 2j of the block in the low nibble of the block's
   byte j and element 2j + 1 in its high nibble; a last block of odd length leaves its last high
   nibble 0. So a run takes 4 ceil(n / K) + ceil(n bits / 8) bytes, a function of n and K alone,
   and whole blocks decode alone (a pipeline may encode, send and decode some blocks at a time).

   Arithmetic of a block x_0 .. x_{L-1}, with Q = 127 (int8) or 7 (int4). Every step is one f32
   operation rounded to nearest, ties to even, in this order (the default floating-point
   environment: no flush-to-zero; no two operations fused into an FMA):
     a = max |x_i|                exact (the kernels compare bit patterns with the sign bit clear)
     if some x_i is NaN or infinite:  scale = NaN (bits 0x7fc00000), every code 0, and encode
                                  reports the run's first such index; the block decodes to NaN
                                  (so a sum it enters is NaN: a step that ignored the report
                                  still skips, as for any non-finite gradient)
     else if a = 0:               scale = 0, every code 0
     else:  scale = a / Q, and if Q * scale > a, scale = the next f32 toward 0 (no decoded value
                                  exceeds a: 127 * (FLT_MAX / 127) would round to infinity)
            t = 2^64 if a < 2^-64, else 1  (x_i t and a t are exact; they lift a tiny or subnormal
                                  block so that Q / (a t) cannot overflow)
            m = Q / (a t)
            code_i = rint((x_i t) m), to the nearest integer, ties to even, clamped to [-Q, Q]
                                  (the clamp never acts: |(x_i t) m| <= Q (1 + 2^-24)^2 < Q + 1/2)
   Decode: x'_i = (f32)code_i * scale, then rounded to the destination dtype as fsdp_convert
   rounds. The round trip keeps |x_i - x'_i| <= scale (1/2 + 2^-14) + 2^-142 (the last term for
   subnormal scales).

   Kernels: a scalar reference and, on x86-64 with gcc or clang, AVX2 and AVX-512 (F and BW) ones
   chosen at run time. They do the operations above in the same order (the vector ones round with
   cvtps2dq, nearest even as rint), so they equal the scalar kernel bit for bit; tests/test_wire.c
   checks every level the CPU has, and the documentation against a reference of its own.
   ============================================================================================ */
#define FSDP__WIRE_BLOCK 128      /* K when the caller says 0 (BENCHMARKS.md section 9: error, bytes, speed) */
#define FSDP__WIRE_BLOCK_MAX 4096
#define FSDP__WIRE_ISAS 3         /* kernel levels: 0 scalar, 1 AVX2, 2 AVX-512 */
#define FSDP__WIRE_NAN 0x7fc00000u
#define FSDP__WIRE_INF 0x7f800000u
#define FSDP__WIRE_TINY 0x1f800000u /* 2^-64: below it a block is lifted by t = 2^64 */

/* A block's scale and the factors its codes are computed with (the arithmetic above). */
typedef struct fsdp__wire_scale {
    float scale, t, m;
    int32_t levels;
} fsdp__wire_scale;

typedef uint32_t (*fsdp__wire_amax_fn)(const float *x, size_t n); /* max |x| as bits */
typedef void (*fsdp__wire_quantize_fn)(unsigned char *codes, const float *x, size_t n, const fsdp__wire_scale *s);
typedef void (*fsdp__wire_dequantize_fn)(float *dst, const unsigned char *codes, size_t n, float scale);

typedef struct fsdp__wire_row fsdp__wire_row;
struct fsdp__wire_row {
    const char *name;
    fsdp_dtype dtype;      /* the float rows: the dtype that travels; 0 for the quantized rows */
    int bits;              /* per element, block scales aside */
    int levels;            /* Q: codes in [-Q, Q] with one f32 scale per block; 0: no blocks */
    int reports_nonfinite; /* encode finds NaN and infinity (the float rows carry them as they are) */
    /* returns the index of the first non-finite element, or n (always n without reports_nonfinite) */
    size_t (*encode)(const fsdp__wire_row *row, void *dst, const float *src, size_t n, size_t block);
    void (*decode)(const fsdp__wire_row *row, void *dst, fsdp_dtype dtype, const void *src, size_t n, size_t block);
    fsdp__wire_quantize_fn quantize[FSDP__WIRE_ISAS];     /* the quantized rows' kernels, by level */
    fsdp__wire_dequantize_fn dequantize[FSDP__WIRE_ISAS];
};

/* Only for 0 < a finite (a as bits). */
FSDP__PRIVATE fsdp__wire_scale fsdp__wire_block_scale(uint32_t amax_bits, int32_t levels) {
    fsdp__wire_scale s;
    float a = fsdp__bits_f32(amax_bits), q = (float)levels;
    s.levels = levels;
    s.scale = a / q;
    if (q * s.scale > a) s.scale = fsdp__bits_f32(fsdp__f32_bits(s.scale) - 1u);
    s.t = amax_bits < FSDP__WIRE_TINY ? 18446744073709551616.0f : 1.0f;
    s.m = q / (a * s.t);
    return s;
}

static inline int32_t fsdp__wire_code(float x, const fsdp__wire_scale *s) {
    int32_t code = (int32_t)rintf((x * s->t) * s->m);
    return code < -s->levels ? -s->levels : code > s->levels ? s->levels : code;
}

static inline int32_t fsdp__wire_nibble_value(unsigned nibble) { return (int32_t)(nibble ^ 8u) - 8; }

FSDP__PRIVATE size_t fsdp__wire_first_nonfinite(const float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if ((fsdp__f32_bits(x[i]) & 0x7fffffffu) >= FSDP__WIRE_INF) return i;
    return n;
}

/* --- the scalar reference kernels (also the vector kernels' tails) -------------------------- */
static uint32_t fsdp__wire_amax_scalar(const float *x, size_t n) {
    uint32_t amax = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t magnitude = fsdp__f32_bits(x[i]) & 0x7fffffffu;
        if (magnitude > amax) amax = magnitude;
    }
    return amax;
}

static void fsdp__wire_quantize8_scalar(unsigned char *codes, const float *x, size_t n, const fsdp__wire_scale *s) {
    size_t i;
    for (i = 0; i < n; i++) codes[i] = (unsigned char)((uint32_t)fsdp__wire_code(x[i], s) & 0xffu);
}

static void fsdp__wire_quantize4_scalar(unsigned char *codes, const float *x, size_t n, const fsdp__wire_scale *s) {
    size_t i;
    for (i = 0; i + 1 < n; i += 2)
        codes[i / 2] = (unsigned char)(((uint32_t)fsdp__wire_code(x[i], s) & 15u) |
                                       ((uint32_t)fsdp__wire_code(x[i + 1], s) & 15u) << 4);
    if (n & 1) codes[n / 2] = (unsigned char)((uint32_t)fsdp__wire_code(x[n - 1], s) & 15u);
}

static void fsdp__wire_dequantize8_scalar(float *dst, const unsigned char *codes, size_t n, float scale) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = (float)((int32_t)codes[i] - (int32_t)((codes[i] & 0x80u) << 1)) * scale;
}

static void fsdp__wire_dequantize4_scalar(float *dst, const unsigned char *codes, size_t n, float scale) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = (float)fsdp__wire_nibble_value((codes[i / 2] >> (4 * (i & 1))) & 15u) * scale;
}

#if FSDP__HAVE_STREAM_AVX2
#  define FSDP__WIRE_X86 1
/* --- AVX2 kernels ---------------------------------------------------------------------------- */
__attribute__((target("avx2"))) static inline uint32_t fsdp__wire_max_lanes_avx2(__m256i a) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

/* magnitudes as bits are non-negative int32s, so a signed max is the max of |x| */
__attribute__((target("avx2"))) static uint32_t fsdp__wire_amax_avx2(const float *x, size_t n) {
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    uint32_t head, tail;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_max_epi32(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), magnitude));
        a1 = _mm256_max_epi32(a1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 8)), magnitude));
    }
    head = fsdp__wire_max_lanes_avx2(_mm256_max_epi32(a0, a1));
    tail = fsdp__wire_amax_scalar(x + i, n - i);
    return head > tail ? head : tail;
}

/* a block's fsdp__wire_scale in every lane (loaded once: the code stores may alias it) */
typedef struct fsdp__wire_lanes_avx2 {
    __m256 t, m;
    __m256i lo, hi;
} fsdp__wire_lanes_avx2;

__attribute__((target("avx2"))) static inline fsdp__wire_lanes_avx2 fsdp__wire_lanes_of_avx2(const fsdp__wire_scale *s) {
    fsdp__wire_lanes_avx2 l;
    l.t = _mm256_set1_ps(s->t);
    l.m = _mm256_set1_ps(s->m);
    l.lo = _mm256_set1_epi32(-s->levels);
    l.hi = _mm256_set1_epi32(s->levels);
    return l;
}

/* 8 codes: fsdp__wire_code on 8 lanes */
__attribute__((target("avx2"))) static inline __m256i fsdp__wire_codes8_avx2(const float *x, const fsdp__wire_lanes_avx2 *l) {
    __m256i code = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x), l->t), l->m));
    return _mm256_min_epi32(_mm256_max_epi32(code, l->lo), l->hi);
}

/* 32 codes as bytes in element order (the packs interleave 128-bit lanes; the permute undoes it) */
__attribute__((target("avx2"))) static inline __m256i fsdp__wire_codes32_avx2(const float *x, const fsdp__wire_lanes_avx2 *l) {
    __m256i p01 = _mm256_packs_epi32(fsdp__wire_codes8_avx2(x, l), fsdp__wire_codes8_avx2(x + 8, l));
    __m256i p23 = _mm256_packs_epi32(fsdp__wire_codes8_avx2(x + 16, l), fsdp__wire_codes8_avx2(x + 24, l));
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 byte codes -> 16 bytes of nibbles, element 2j in the low nibble */
__attribute__((target("avx2"))) static inline __m128i fsdp__wire_nibbles_avx2(__m256i codes) {
    __m256i pairs = _mm256_and_si256(codes, _mm256_set1_epi16(0x0f0f));
    __m256i joined = _mm256_and_si256(_mm256_or_si256(pairs, _mm256_srli_epi16(pairs, 4)), _mm256_set1_epi16(0x00ff));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi16(joined, joined), 0x08));
}

/* 16 bytes of nibbles -> 32 byte codes: elements 0..15 in *lo, 16..31 in *hi */
__attribute__((target("avx2"))) static inline void fsdp__wire_unnibble_avx2(__m128i nibbles, __m128i *lo, __m128i *hi) {
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128i low = _mm_and_si128(nibbles, mask), high = _mm_and_si128(_mm_srli_epi16(nibbles, 4), mask);
    *lo = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(low, high), eight), eight);
    *hi = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(low, high), eight), eight);
}

/* 8 byte codes (the low half of codes) times scale, stored as f32 */
__attribute__((target("avx2"))) static inline void fsdp__wire_scaled8_avx2(float *dst, __m128i codes, __m256 scale) {
    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), scale));
}

__attribute__((target("avx2"))) static void fsdp__wire_quantize8_avx2(unsigned char *codes, const float *x, size_t n,
                                                                     const fsdp__wire_scale *s) {
    const fsdp__wire_lanes_avx2 lanes = fsdp__wire_lanes_of_avx2(s);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) _mm256_storeu_si256((__m256i *)(codes + i), fsdp__wire_codes32_avx2(x + i, &lanes));
    fsdp__wire_quantize8_scalar(codes + i, x + i, n - i, s);
}

__attribute__((target("avx2"))) static void fsdp__wire_quantize4_avx2(unsigned char *codes, const float *x, size_t n,
                                                                     const fsdp__wire_scale *s) {
    const fsdp__wire_lanes_avx2 lanes = fsdp__wire_lanes_of_avx2(s);
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm_storeu_si128((__m128i *)(codes + i / 2), fsdp__wire_nibbles_avx2(fsdp__wire_codes32_avx2(x + i, &lanes)));
    fsdp__wire_quantize4_scalar(codes + i / 2, x + i, n - i, s);
}

__attribute__((target("avx2"))) static void fsdp__wire_dequantize8_avx2(float *dst, const unsigned char *codes, size_t n, float scale) {
    const __m256 s = _mm256_set1_ps(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i c = _mm_loadu_si128((const __m128i *)(codes + i));
        fsdp__wire_scaled8_avx2(dst + i, c, s);
        fsdp__wire_scaled8_avx2(dst + i + 8, _mm_srli_si128(c, 8), s);
    }
    fsdp__wire_dequantize8_scalar(dst + i, codes + i, n - i, scale);
}

__attribute__((target("avx2"))) static void fsdp__wire_dequantize4_avx2(float *dst, const unsigned char *codes, size_t n, float scale) {
    const __m256 s = _mm256_set1_ps(scale);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m128i lo, hi;
        fsdp__wire_unnibble_avx2(_mm_loadu_si128((const __m128i *)(codes + i / 2)), &lo, &hi);
        fsdp__wire_scaled8_avx2(dst + i, lo, s);
        fsdp__wire_scaled8_avx2(dst + i + 8, _mm_srli_si128(lo, 8), s);
        fsdp__wire_scaled8_avx2(dst + i + 16, hi, s);
        fsdp__wire_scaled8_avx2(dst + i + 24, _mm_srli_si128(hi, 8), s);
    }
    fsdp__wire_dequantize4_scalar(dst + i, codes + i / 2, n - i, scale);
}

/* --- AVX-512 kernels (F and BW; 16 lanes, the same steps) ----------------------------------- */
#  define FSDP__WIRE_AVX512 __attribute__((target("avx512f,avx512bw")))
#  if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
/* g++ before 13 warns that its own AVX-512 intrinsics read an uninitialised variable (their
   "undefined" source operand, __m512 __Y = __Y); they do not */
#    pragma GCC diagnostic push
#    pragma GCC diagnostic ignored "-Wuninitialized"
#    pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#  endif
FSDP__WIRE_AVX512 static uint32_t fsdp__wire_amax_avx512(const float *x, size_t n) {
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    uint32_t head, tail;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_max_epi32(a0, _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), magnitude));
        a1 = _mm512_max_epi32(a1, _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i + 16)), magnitude));
    }
    a0 = _mm512_max_epi32(a0, a1);
    head = fsdp__wire_max_lanes_avx2(_mm256_max_epi32(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1)));
    tail = fsdp__wire_amax_scalar(x + i, n - i);
    return head > tail ? head : tail;
}

typedef struct fsdp__wire_lanes_avx512 {
    __m512 t, m;
    __m512i lo, hi;
} fsdp__wire_lanes_avx512;

FSDP__WIRE_AVX512 static inline fsdp__wire_lanes_avx512 fsdp__wire_lanes_of_avx512(const fsdp__wire_scale *s) {
    fsdp__wire_lanes_avx512 l;
    l.t = _mm512_set1_ps(s->t);
    l.m = _mm512_set1_ps(s->m);
    l.lo = _mm512_set1_epi32(-s->levels);
    l.hi = _mm512_set1_epi32(s->levels);
    return l;
}

/* 16 codes as bytes in element order */
FSDP__WIRE_AVX512 static inline __m128i fsdp__wire_codes16_avx512(const float *x, const fsdp__wire_lanes_avx512 *l) {
    __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x), l->t), l->m));
    return _mm512_cvtsepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(code, l->lo), l->hi));
}

FSDP__WIRE_AVX512 static inline void fsdp__wire_scaled16_avx512(float *dst, __m128i codes, __m512 scale) {
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), scale));
}

FSDP__WIRE_AVX512 static void fsdp__wire_quantize8_avx512(unsigned char *codes, const float *x, size_t n,
                                                          const fsdp__wire_scale *s) {
    const fsdp__wire_lanes_avx512 lanes = fsdp__wire_lanes_of_avx512(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm_storeu_si128((__m128i *)(codes + i), fsdp__wire_codes16_avx512(x + i, &lanes));
    fsdp__wire_quantize8_scalar(codes + i, x + i, n - i, s);
}

FSDP__WIRE_AVX512 static void fsdp__wire_quantize4_avx512(unsigned char *codes, const float *x, size_t n,
                                                          const fsdp__wire_scale *s) {
    const fsdp__wire_lanes_avx512 lanes = fsdp__wire_lanes_of_avx512(s);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(fsdp__wire_codes16_avx512(x + i, &lanes)),
                                               fsdp__wire_codes16_avx512(x + i + 16, &lanes), 1);
        _mm_storeu_si128((__m128i *)(codes + i / 2), fsdp__wire_nibbles_avx2(both));
    }
    fsdp__wire_quantize4_scalar(codes + i / 2, x + i, n - i, s);
}

FSDP__WIRE_AVX512 static void fsdp__wire_dequantize8_avx512(float *dst, const unsigned char *codes, size_t n, float scale) {
    const __m512 s = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) fsdp__wire_scaled16_avx512(dst + i, _mm_loadu_si128((const __m128i *)(codes + i)), s);
    fsdp__wire_dequantize8_scalar(dst + i, codes + i, n - i, scale);
}

FSDP__WIRE_AVX512 static void fsdp__wire_dequantize4_avx512(float *dst, const unsigned char *codes, size_t n, float scale) {
    const __m512 s = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m128i lo, hi;
        fsdp__wire_unnibble_avx2(_mm_loadu_si128((const __m128i *)(codes + i / 2)), &lo, &hi);
        fsdp__wire_scaled16_avx512(dst + i, lo, s);
        fsdp__wire_scaled16_avx512(dst + i + 16, hi, s);
    }
    fsdp__wire_dequantize4_scalar(dst + i, codes + i / 2, n - i, scale);
}
#  if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#    pragma GCC diagnostic pop
#  endif
#  define FSDP__WIRE_LEVELS(kernel) {kernel##_scalar, kernel##_avx2, kernel##_avx512}
#else
#  define FSDP__WIRE_X86 0
#  define FSDP__WIRE_LEVELS(kernel) {kernel##_scalar, NULL, NULL}
#endif

/* The kernel level in use: -1 not asked yet (racing first callers store the same answer), 0
   scalar, 1 AVX2, 2 AVX-512. The tests set each level the CPU has (fsdp__wire_isa_supported) to
   cover every kernel. */
static int fsdp__wire_isa = -1;

FSDP__PRIVATE int fsdp__wire_isa_supported(void) {
#if FSDP__WIRE_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return 2;
    if (__builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

static int fsdp__wire_isa_level(void) {
    int level = __atomic_load_n(&fsdp__wire_isa, __ATOMIC_RELAXED);
    if (level < 0) {
        level = fsdp__wire_isa_supported();
        __atomic_store_n(&fsdp__wire_isa, level, __ATOMIC_RELAXED);
    }
    return level;
}

static const fsdp__wire_amax_fn fsdp__wire_amax[FSDP__WIRE_ISAS] = FSDP__WIRE_LEVELS(fsdp__wire_amax);

/* --- the rows --------------------------------------------------------------------------------- */
FSDP__PRIVATE size_t fsdp__wire_bytes(const fsdp__wire_row *row, size_t n, size_t block) {
    if (!row->levels) return n * (size_t)(row->bits / 8);
    return 4 * ((n + block - 1) / block) + (n * (size_t)row->bits + 7) / 8;
}

static size_t fsdp__wire_float_encode(const fsdp__wire_row *row, void *dst, const float *src, size_t n, size_t block) {
    (void)block;
    fsdp__from_f32(dst, row->dtype, src, n);
    return n;
}

static void fsdp__wire_float_decode(const fsdp__wire_row *row, void *dst, fsdp_dtype dtype, const void *src, size_t n,
                                    size_t block) {
    (void)block;
    fsdp_convert(dst, dtype, src, row->dtype, n);
}

static size_t fsdp__wire_quant_encode(const fsdp__wire_row *row, void *dst, const float *src, size_t n, size_t block) {
    const int level = fsdp__wire_isa_level();
    const fsdp__wire_amax_fn amax_of = fsdp__wire_amax[level];
    const fsdp__wire_quantize_fn quantize = row->quantize[level];
    unsigned char *out = (unsigned char *)dst;
    size_t start, first = n;
    for (start = 0; start < n; start += block) {
        size_t len = n - start < block ? n - start : block, code_bytes = (len * (size_t)row->bits + 7) / 8;
        uint32_t amax = amax_of(src + start, len);
        float scale = 0.0f;
        if (amax >= FSDP__WIRE_INF) {
            scale = fsdp__bits_f32(FSDP__WIRE_NAN);
            if (first == n) first = start + fsdp__wire_first_nonfinite(src + start, len);
            memset(out + 4, 0, code_bytes);
        } else if (amax == 0) {
            memset(out + 4, 0, code_bytes);
        } else {
            fsdp__wire_scale s = fsdp__wire_block_scale(amax, row->levels);
            scale = s.scale;
            quantize(out + 4, src + start, len, &s);
        }
        memcpy(out, &scale, 4);
        out += 4 + code_bytes;
    }
    return first;
}

/* n elements of whole blocks to f32 */
static void fsdp__wire_dequantize_run(const fsdp__wire_row *row, float *dst, const unsigned char *src, size_t n,
                                      size_t block) {
    const fsdp__wire_dequantize_fn dequantize = row->dequantize[fsdp__wire_isa_level()];
    size_t start;
    for (start = 0; start < n; start += block) {
        size_t len = n - start < block ? n - start : block;
        float scale;
        memcpy(&scale, src, 4);
        dequantize(dst + start, src + 4, len, scale);
        src += 4 + (len * (size_t)row->bits + 7) / 8;
    }
}

/* to f32 directly; to bf16 and f16 through f32 some whole blocks at a time */
static void fsdp__wire_quant_decode(const fsdp__wire_row *row, void *dst, fsdp_dtype dtype, const void *src, size_t n,
                                    size_t block) {
    float chunk[FSDP__WIRE_BLOCK_MAX];
    const size_t per = FSDP__WIRE_BLOCK_MAX / block * block;
    const unsigned char *in = (const unsigned char *)src;
    size_t done;
    if (dtype == FSDP_F32) { fsdp__wire_dequantize_run(row, (float *)dst, in, n, block); return; }
    for (done = 0; done < n; done += per) {
        size_t take = n - done < per ? n - done : per;
        fsdp__wire_dequantize_run(row, chunk, in + fsdp__wire_bytes(row, done, block), take, block);
        fsdp__from_f32((char *)dst + done * fsdp_dtype_size(dtype), dtype, chunk, take);
    }
}

static const fsdp__wire_row fsdp__wire_rows[] = {
    {"f32", FSDP_F32, 32, 0, 0, fsdp__wire_float_encode, fsdp__wire_float_decode, {NULL, NULL, NULL}, {NULL, NULL, NULL}},
    {"bf16", FSDP_BF16, 16, 0, 0, fsdp__wire_float_encode, fsdp__wire_float_decode, {NULL, NULL, NULL}, {NULL, NULL, NULL}},
    {"f16", FSDP_F16, 16, 0, 0, fsdp__wire_float_encode, fsdp__wire_float_decode, {NULL, NULL, NULL}, {NULL, NULL, NULL}},
    {"int8", FSDP_DTYPE_DEFAULT, 8, 127, 1, fsdp__wire_quant_encode, fsdp__wire_quant_decode,
     FSDP__WIRE_LEVELS(fsdp__wire_quantize8), FSDP__WIRE_LEVELS(fsdp__wire_dequantize8)},
    {"int4", FSDP_DTYPE_DEFAULT, 4, 7, 1, fsdp__wire_quant_encode, fsdp__wire_quant_decode,
     FSDP__WIRE_LEVELS(fsdp__wire_quantize4), FSDP__WIRE_LEVELS(fsdp__wire_dequantize4)}};

/* The row of a wire; NULL for FSDP_WIRE_DEFAULT (resolve it to the dtype's wire first) and invalid values. */
FSDP__PRIVATE const fsdp__wire_row *fsdp__wire_row_of(fsdp_wire wire) {
    return wire >= FSDP_WIRE_F32 && wire <= FSDP_WIRE_INT4 ? &fsdp__wire_rows[wire - FSDP_WIRE_F32] : NULL;
}

/* The block size a caller's block means (0: the default); 0 if it is invalid. */
FSDP__PRIVATE size_t fsdp__wire_block(size_t block) {
    if (block == 0) return FSDP__WIRE_BLOCK;
    return block % 8 == 0 && block <= FSDP__WIRE_BLOCK_MAX ? block : 0;
}

FSDP_API const char *fsdp_wire_name(fsdp_wire wire) {
    const fsdp__wire_row *row = fsdp__wire_row_of(wire);
    return row ? row->name : wire == FSDP_WIRE_DEFAULT ? "default" : "invalid";
}

FSDP_API size_t fsdp_wire_bytes(fsdp_wire wire, size_t count, size_t block) {
    const fsdp__wire_row *row = fsdp__wire_row_of(wire);
    block = fsdp__wire_block(block);
    return row && (block || !row->levels) && count <= (size_t)-1 / 8 ? fsdp__wire_bytes(row, count, block) : 0;
}

FSDP_API int fsdp_wire_encode(void *dst, fsdp_wire wire, size_t block, const float *src, size_t count,
                              size_t *first_nonfinite) {
    const fsdp__wire_row *row = fsdp__wire_row_of(wire);
    size_t first;
    if (first_nonfinite) *first_nonfinite = count;
    block = fsdp__wire_block(block);
    if (!row || (!block && row->levels) || (count && (!dst || !src))) return FSDP_ERR_INVALID_ARG;
    first = row->encode(row, dst, src, count, block);
    if (first_nonfinite) *first_nonfinite = first;
    return FSDP_SUCCESS;
}

FSDP_API int fsdp_wire_decode(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_wire wire, size_t block,
                              size_t count) {
    const fsdp__wire_row *row = fsdp__wire_row_of(wire);
    block = fsdp__wire_block(block);
    if (!row || (!block && row->levels) || !fsdp_dtype_size(dst_dtype) || (count && (!dst || !src)))
        return FSDP_ERR_INVALID_ARG;
    row->decode(row, dst, dst_dtype, src, count, block);
    return FSDP_SUCCESS;
}

/* ============================================================================================
   >>auth
   What proves that a peer belongs to the job: SHA-256 and HMAC-SHA256, the job's key and
   what derives from it, constant-time comparison, wiping, random bytes, the secret file.
   The socket handshake that uses them is in >>socket (fsdp__sock_greet, fsdp__sock_admit).
   ============================================================================================ */
/* --- SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for authenticating connections ---- */
typedef struct fsdp__sha256 {
    uint32_t state[8];
    uint64_t bytes;
    unsigned char block[64];
    size_t used;
} fsdp__sha256;

static const uint32_t fsdp__sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

static uint32_t fsdp__ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

FSDP__PRIVATE void fsdp__sha256_block(fsdp__sha256 *h, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = fsdp__ror32(w[i - 15], 7) ^ fsdp__ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = fsdp__ror32(w[i - 2], 17) ^ fsdp__ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h->state[0]; b = h->state[1]; c = h->state[2]; d = h->state[3];
    e = h->state[4]; f = h->state[5]; g = h->state[6]; k = h->state[7];
    for (i = 0; i < 64; i++) {
        t1 = k + (fsdp__ror32(e, 6) ^ fsdp__ror32(e, 11) ^ fsdp__ror32(e, 25)) + ((e & f) ^ (~e & g)) + fsdp__sha256_k[i] + w[i];
        t2 = (fsdp__ror32(a, 2) ^ fsdp__ror32(a, 13) ^ fsdp__ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h->state[0] += a; h->state[1] += b; h->state[2] += c; h->state[3] += d;
    h->state[4] += e; h->state[5] += f; h->state[6] += g; h->state[7] += k;
}

FSDP__PRIVATE void fsdp__sha256_init(fsdp__sha256 *h) {
    static const uint32_t iv[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(h->state, iv, sizeof iv);
    h->bytes = 0;
    h->used = 0;
}

FSDP__PRIVATE void fsdp__sha256_update(fsdp__sha256 *h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    h->bytes += n;
    while (n > 0) {
        size_t take = 64 - h->used < n ? 64 - h->used : n;
        memcpy(h->block + h->used, p, take);
        h->used += take;
        p += take;
        n -= take;
        if (h->used == 64) {
            fsdp__sha256_block(h, h->block);
            h->used = 0;
        }
    }
}

FSDP__PRIVATE void fsdp__sha256_final(fsdp__sha256 *h, unsigned char out[32]) {
    uint64_t bits = h->bytes * 8;
    int i;
    h->block[h->used++] = 0x80; /* used < 64 between updates */
    if (h->used > 56) {
        memset(h->block + h->used, 0, 64 - h->used);
        fsdp__sha256_block(h, h->block);
        h->used = 0;
    }
    memset(h->block + h->used, 0, 56 - h->used);
    for (i = 0; i < 8; i++) h->block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    fsdp__sha256_block(h, h->block);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(h->state[i] >> 24);
        out[4 * i + 1] = (unsigned char)(h->state[i] >> 16);
        out[4 * i + 2] = (unsigned char)(h->state[i] >> 8);
        out[4 * i + 3] = (unsigned char)h->state[i];
    }
}

/* Overwrites a secret's bytes in a way the compiler may not drop. */
FSDP__PRIVATE void fsdp__wipe(void *p, size_t n) {
    volatile unsigned char *v = (volatile unsigned char *)p;
    while (n--) *v++ = 0;
}

/* HMAC-SHA256 (RFC 2104) in two halves: the hash states keyed with key ^ ipad (inner) and
   key ^ opad (outer), made once per key; then a message's mac from the inner state fed with it. */
FSDP__PRIVATE void fsdp__hmac_keyed(fsdp__sha256 *inner, fsdp__sha256 *outer, const void *key, size_t key_size) {
    unsigned char block[64];
    int i;
    memset(block, 0, sizeof block);
    if (key_size > 64) { /* long keys are hashed first */
        fsdp__sha256_init(inner);
        fsdp__sha256_update(inner, key, key_size);
        fsdp__sha256_final(inner, block);
    } else if (key_size) {
        memcpy(block, key, key_size);
    }
    for (i = 0; i < 64; i++) block[i] ^= 0x36;
    fsdp__sha256_init(inner);
    fsdp__sha256_update(inner, block, 64);
    for (i = 0; i < 64; i++) block[i] ^= 0x36 ^ 0x5c;
    fsdp__sha256_init(outer);
    fsdp__sha256_update(outer, block, 64);
    fsdp__wipe(block, sizeof block);
}

FSDP__PRIVATE void fsdp__hmac_finish(fsdp__sha256 *fed, const fsdp__sha256 *outer, unsigned char out[32]) {
    unsigned char inner[32];
    fsdp__sha256 h = *outer;
    fsdp__sha256_final(fed, inner);
    fsdp__sha256_update(&h, inner, 32);
    fsdp__sha256_final(&h, out); /* (no wiping here: PBKDF2 calls this per round; callers wipe keys) */
}

/* HMAC-SHA256 over the concatenation of n parts (data[i], size[i]). */
FSDP__PRIVATE void fsdp__hmac_sha256(unsigned char out[32], const void *key, size_t key_size, int n,
                                     const void *const *data, const size_t *size) {
    fsdp__sha256 inner, outer;
    int i;
    fsdp__hmac_keyed(&inner, &outer, key, key_size);
    for (i = 0; i < n; i++) fsdp__sha256_update(&inner, data[i], size[i]);
    fsdp__hmac_finish(&inner, &outer, out);
    fsdp__wipe(&inner, sizeof inner);
    fsdp__wipe(&outer, sizeof outer);
}

/* PBKDF2-HMAC-SHA256 (RFC 8018), one 32-byte block: rounds HMACs of 32 bytes under one keying. */
FSDP__PRIVATE void fsdp__pbkdf2_sha256(unsigned char out[32], const void *secret, size_t secret_size, const void *salt,
                                      size_t salt_size, unsigned rounds) {
    static const unsigned char block_index[4] = {0, 0, 0, 1};
    unsigned char u[32];
    fsdp__sha256 inner, outer, h;
    unsigned r;
    int i;
    fsdp__hmac_keyed(&inner, &outer, secret, secret_size);
    h = inner; /* U1 = HMAC(secret, salt | INT(1)) */
    fsdp__sha256_update(&h, salt, salt_size);
    fsdp__sha256_update(&h, block_index, 4);
    fsdp__hmac_finish(&h, &outer, u);
    memcpy(out, u, 32);
    for (r = 1; r < rounds; r++) { /* U(r+1) = HMAC(secret, U(r)); out ^= it */
        h = inner;
        fsdp__sha256_update(&h, u, 32);
        fsdp__hmac_finish(&h, &outer, u);
        for (i = 0; i < 32; i++) out[i] ^= u[i];
    }
    fsdp__wipe(u, sizeof u);
    fsdp__wipe(&inner, sizeof inner);
    fsdp__wipe(&outer, sizeof outer);
    fsdp__wipe(&h, sizeof h);
}

/* Rounds of PBKDF2 that stretch a job's secret (about 35 ms once per process on a 2020s
   x86 core): a guess at the secret, checked against anything it derives (a captured
   handshake), costs as much. */
#define FSDP__KDF_ROUNDS 60000u

/* A key for job from secret, so that jobs that share a secret still have different keys and
   nothing about the secret can be learned from the key: PBKDF2-HMAC-SHA256(secret, salt =
   label | NUL | job, rounds) where rounds > 0 and a secret is given (a job's secret:
   FSDP__KDF_ROUNDS), else HMAC-SHA256(secret, label | NUL | job) (a sub-communicator's key
   from its parent's, already stretched; or no secret, a key anyone can compute, the job token
   only keeping jobs apart). */
FSDP__PRIVATE void fsdp__comm_key(unsigned char key[32], const void *secret, size_t secret_size, const char *label,
                                  const char *job, unsigned rounds) {
    unsigned char salt[300];
    size_t label_size = strlen(label) + 1, job_size = strlen(job);
    const void *parts[2];
    size_t sizes[2];
    if (rounds && secret_size && label_size + job_size <= sizeof salt) {
        memcpy(salt, label, label_size);
        memcpy(salt + label_size, job, job_size);
        fsdp__pbkdf2_sha256(key, secret, secret_size, salt, label_size + job_size, rounds);
        return;
    }
    parts[0] = label;
    sizes[0] = label_size;
    parts[1] = job;
    sizes[1] = job_size;
    fsdp__hmac_sha256(key, secret, secret_size, 2, parts, sizes);
}

/* 1 if the n bytes agree; the time taken does not depend on where they differ. */
FSDP__PRIVATE int fsdp__equal_ct(const void *a, const void *b, size_t n) {
    const volatile unsigned char *x = (const volatile unsigned char *)a, *y = (const volatile unsigned char *)b;
    unsigned char diff = 0;
    size_t i;
    for (i = 0; i < n; i++) diff |= (unsigned char)(x[i] ^ y[i]);
    return diff == 0;
}

/* Fills out with bytes from the kernel's random generator; 0 on success. */
FSDP__PRIVATE int fsdp__random_bytes(void *out, size_t n) {
    unsigned char *p = (unsigned char *)out;
    size_t done = 0;
    int fd;
#if defined(__linux__) && defined(SYS_getrandom)
    while (done < n) {
        long got = syscall(SYS_getrandom, p + done, n - done, 0);
        if (got > 0) done += (size_t)got;
        else if (got < 0 && errno != EINTR) break;
    }
    if (done == n) return 0;
#endif
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    while (done < n) {
        ssize_t got = read(fd, p + done, n - done);
        if (got > 0) done += (size_t)got;
        else if (got == 0 || errno != EINTR) break;
    }
    close(fd);
    return done == n ? 0 : -1;
}

/* Reads the job's secret from FSDP_SECRET_FILE's file: a regular file (no FIFO or device to
   hang on) that only its owner, this user, can read, holding 1..size-1 bytes; one trailing
   newline is dropped. 0, or -1 with the reason in err (which never shows the file's bytes). */
FSDP__PRIVATE int fsdp__read_secret_file(const char *path, char *secret, size_t size, char *err, size_t err_size) {
    struct stat st;
    ssize_t got = 0;
    size_t n = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fsdp__fmt(err, err_size, "environment variable FSDP_SECRET_FILE=%.200s: cannot open it: %s", path, strerror(errno));
        return -1;
    }
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        fsdp__fmt(err, err_size, "environment variable FSDP_SECRET_FILE=%.200s: %s", path,
                  !S_ISREG(st.st_mode) ? "not a regular file"
                  : st.st_uid != geteuid() ? "owned by another user"
                                           : "group or others may read it (chmod 600 it)");
        close(fd);
        return -1;
    }
    while (n < size && (got = read(fd, secret + n, size - n)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (n > 0 && secret[n - 1] == '\n') n--;
    if (got < 0 || n == 0 || n >= size) {
        fsdp__fmt(err, err_size, "environment variable FSDP_SECRET_FILE=%.200s: %s", path,
                  got < 0 ? "read failed" : n == 0 ? "the file is empty" : "the secret is longer than 1024 bytes");
        fsdp__wipe(secret, size);
        return -1;
    }
    secret[n] = 0;
    if (memchr(secret, 0, n)) {
        fsdp__fmt(err, err_size, "environment variable FSDP_SECRET_FILE=%.200s: the secret holds a NUL byte", path);
        fsdp__wipe(secret, size);
        return -1;
    }
    return 0;
}

/* ============================================================================================
   >>collectives
   The communicator every backend shares: its state and failure, the checked dispatch of an
   op to the backend, the spin policy of waits, copies, fsdp_comm_alloc memory and the
   topology (which ranks share a host).
   ============================================================================================ */
/* What every rank must agree on for one op; compared byte for byte across ranks. */
typedef struct fsdp__fingerprint {
    uint64_t seq;
    uint64_t count;
    int32_t kind;
    int32_t dtype;
    int32_t op;
    int32_t root;
    uint32_t tag;
    uint32_t pad;
} fsdp__fingerprint;

static size_t fsdp__align(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Memory from fsdp_comm_alloc. Shared (peer_base != NULL): this rank's block is a mapped
   /dev/shm file and peer_base[p] maps rank p's block read-only (peer_base[rank] == base).
   Otherwise base is an aligned block inside raw, from FSDP_MALLOC. */
typedef struct fsdp__region {
    char *base;
    size_t bytes;
    void *raw;
    uint32_t id;           /* the comm's allocation count when made: the same on every rank */
    char **peer_base;
    size_t *peer_bytes;
    struct fsdp__region *next;
} fsdp__region;

/* Init failures have no communicator to hold their message: it is kept per thread and
   returned by fsdp_comm_last_error(NULL). */
static __thread char fsdp__init_error[FSDP__ERRMSG];

typedef struct fsdp__transport fsdp__transport;

/* A comm's counters (fsdp_comm_stats), added to atomically by the threads that send. A comm made
   from another (a split, a hierarchical world's host part) adds into its parent's too; the
   parent's tally lives until the last comm that adds into it is destroyed, in any order. */
typedef struct fsdp__tally {
    uint64_t sent[2];         /* bytes: [0] to ranks of this host, [1] to other hosts */
    uint64_t ops;
    int refs;                 /* its comm and the tallies adding into it (atomic) */
    int inner;                /* its comm carries a part of the parent's ops: not counted as ops there */
    struct fsdp__tally *up;   /* the parent comm's, or NULL */
} fsdp__tally;

struct fsdp_comm {
    int rank, world, local_rank, local_world;
    int crowd;              /* ranks of the job on this host: of this comm, or of the one it was split from */
    int num_hosts, host;    /* hosts of the comm's ranks and this rank's (numbered by their lowest rank) */
    int two_level;          /* reductions fold inside hosts, then across hosts (fsdp_comm_hierarchical) */
    int *host_of;           /* host of every rank; NULL where unknown (user backends) */
    fsdp_backend_kind kind;
    const fsdp__transport *transport; /* what carries the ops: its row (below) */
    const fsdp_backend *backend;      /* its ops: &transport->ops, or a user backend's table */
    void *impl;
    int timeout_ms;
    uint64_t seq;
    fsdp_logger logger;
    int status;       /* first failure, FSDP_SUCCESS while healthy (atomic) */
    int adopted;      /* the first failure was another rank's (see fsdp__comm_adopt) */
    int64_t failed_ms;/* when it happened (fsdp__now_ms) */
    int abort_called; /* backend abort issued (atomic) */
    pthread_mutex_t error_lock;
    char error[FSDP__ERRMSG];
    char job[64];
    unsigned char key[32];  /* fsdp__comm_key of the secret and job: what connections prove */
    int has_secret;
    int unasked_warned;     /* socket, no secret: said once that the peers' users cannot be checked (atomic) */
    int lost_peer;          /* 1 + the first peer an op saw close its connection or go silent (0: none; atomic):
                               which peers a survivor still reaches (>>recovery) */
    fsdp__region *regions;  /* from fsdp_comm_alloc */
    uint32_t allocations;   /* fsdp_comm_alloc calls so far */
    fsdp__tally *tally;     /* what it sent (fsdp_comm_stats_get) */
};

/* What a backend's create is handed besides the description: what the launcher's parent
   process prepared before it forked (fsdp_launch: a segment mapped for every rank (shm), a
   listener on loopback (socket; rank 0's) and its port), or what a split made. A create takes
   ownership of listen_fd (and sets it to -1) if it uses it. */
typedef struct fsdp__inherit {
    void *mapping;
    size_t map_bytes;
    int listen_fd;
    int port;
    void *engine_comm;      /* a split's engine communicator the new comm takes over (MPI: an MPI_Comm *) */
} fsdp__inherit;

/* A split the members agreed on (fsdp_comm_split), for the parent's transport to carry out. */
typedef struct fsdp__split {
    fsdp_split_info info;   /* color, key, this rank's new rank and the new world, parent ranks */
    int leader;             /* the parent rank that becomes rank 0 */
    fsdp_comm_desc desc;    /* the new comm: backend (the parent's, or shm for one host), rank, world, job */
} fsdp__split;

/* Everything the library knows about a transport, one row per transport, defined at the end of
   its own section; >>backends lists the rows that fsdp_comm_init can make. Hooks may be NULL. */
struct fsdp__transport {
    fsdp_backend ops;           /* name, ops, abort, destroy (a user backend's comm: its own table) */
    fsdp_backend_kind kind;     /* fsdp_comm_backend() of its comms */
    const char *name;           /* fsdp_backend_name(kind); FSDP_BACKEND=name where FSDP__CAP_ENV */
    unsigned caps;              /* FSDP__CAP_* */
    int max_world;              /* the most ranks it serves (0: no limit) */
    /* Joins comm's peers (rank, world, key, timeout, logger are set): sets comm->backend and
       comm->impl, and learns the topology (fsdp__comm_topology). */
    int (*create)(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__inherit *inherit);
    /* Makes sp->desc's comm from the parent (collective over the parent: every rank calls it). */
    int (*split)(fsdp_comm *parent, fsdp__split *sp, fsdp_comm **out);
    /* Where the comm's waits keep how many seconds they spin before they yield (NULL: none). */
    double *(*spin)(const fsdp_comm *comm);
    /* The comm of this rank's host inside a comm over hosts: it shares fsdp_comm_alloc memory
       and the timeout. NULL: none. */
    fsdp_comm *(*host_part)(const fsdp_comm *comm);
    /* Makes fsdp_comm_alloc memory readable by the peers (collective; NULL: ordinary memory). */
    int (*share)(fsdp_comm *comm, fsdp__region *region);
    /* fsdp_comm_init_from_env: 1 if this transport is the default for this environment (the
       first row, in table order, that says so wins), and what it needs from the environment. */
    int (*env_claims)(const fsdp_comm_desc *desc);
    int (*env_read)(fsdp_comm_desc *desc, char *scratch, size_t scratch_size, char *err, size_t err_size);
    /* fsdp_launch: the parent's preparation before fork (NULL: not launchable), and how a
       rank's failure reaches the others through it. */
    int (*launch_prepare)(fsdp__inherit *inherit, const fsdp_launch_desc *desc, char *err, size_t err_size);
    void (*launch_abort)(fsdp__inherit *inherit, int nprocs, const char *why);
};

#define FSDP__CAP_ENV 1u       /* FSDP_BACKEND=<name> selects it */
#define FSDP__CAP_DEADLINE 2u  /* every op ends by its timeout: a waiting thread may run an op itself */
#define FSDP__CAP_OWN_RANKS 4u /* learns rank and world size itself (MPI): the description's are checks */
#define FSDP__MAX_WORLD 256    /* the shipped backends' limit (their folds take per-rank arrays of this size) */

FSDP__PRIVATE const fsdp__transport *fsdp__transport_of(fsdp_backend_kind kind);

FSDP_API const char *fsdp_backend_name(fsdp_backend_kind kind) {
    const fsdp__transport *t = fsdp__transport_of(kind);
    return t ? t->name : "default";
}

FSDP_API const char *fsdp_coll_name(fsdp_coll_kind kind) {
    switch (kind) {
        case FSDP_COLL_ALL_GATHER: return "all_gather";
        case FSDP_COLL_REDUCE_SCATTER: return "reduce_scatter";
        case FSDP_COLL_ALL_REDUCE: return "all_reduce";
        case FSDP_COLL_BROADCAST: return "broadcast";
        case FSDP_COLL_BARRIER: return "barrier";
        case FSDP_COLL_ALL_TO_ALL: return "all_to_all";
        default: return "unknown collective";
    }
}

FSDP__PRIVATE const char *fsdp__reduce_name(int op) {
    switch (op) {
        case FSDP_SUM: return "sum";
        case FSDP_AVG: return "avg";
        case FSDP_MAX: return "max";
        default: return "?";
    }
}

FSDP__PRIVATE fsdp__fingerprint fsdp__fingerprint_of(const fsdp_coll *c) {
    fsdp__fingerprint fp;
    memset(&fp, 0, sizeof fp);
    fp.seq = c->seq;
    fp.count = c->count;
    fp.kind = c->kind;
    fp.dtype = c->dtype;
    fp.op = c->kind == FSDP_COLL_REDUCE_SCATTER || c->kind == FSDP_COLL_ALL_REDUCE ? c->op : 0;
    fp.root = c->kind == FSDP_COLL_BROADCAST ? c->root : 0;
    fp.tag = c->tag;
    return fp;
}

/* "op #12 all_reduce(count=1000, bf16, sum)", with " tag 3" when tagged */
FSDP__PRIVATE const char *fsdp__describe(char *buf, size_t size, const fsdp__fingerprint *fp) {
    const char *name = fsdp_coll_name(FSDP__CAST(fsdp_coll_kind, fp->kind));
    size_t n;
    if (fp->kind == FSDP_COLL_BARRIER)
        fsdp__fmt(buf, size, "op #%llu barrier", (unsigned long long)fp->seq);
    else if (fp->kind == FSDP_COLL_BROADCAST)
        fsdp__fmt(buf, size, "op #%llu broadcast(count=%llu, %s, root=%d)", (unsigned long long)fp->seq,
                 (unsigned long long)fp->count, fsdp_dtype_name(FSDP__CAST(fsdp_dtype, fp->dtype)), fp->root);
    else if (fp->op)
        fsdp__fmt(buf, size, "op #%llu %s(count=%llu, %s, %s)", (unsigned long long)fp->seq, name,
                 (unsigned long long)fp->count, fsdp_dtype_name(FSDP__CAST(fsdp_dtype, fp->dtype)),
                 fsdp__reduce_name(fp->op));
    else
        fsdp__fmt(buf, size, "op #%llu %s(count=%llu, %s)", (unsigned long long)fp->seq, name,
                 (unsigned long long)fp->count, fsdp_dtype_name(FSDP__CAST(fsdp_dtype, fp->dtype)));
    n = strlen(buf);
    if (fp->tag && n < size) fsdp__fmt(buf + n, size - n, " tag %u", (unsigned)fp->tag);
    return buf;
}

/* Fails with FSDP_ERR_MISMATCH naming both sides if the fingerprints differ; 0 if they agree. */
FSDP__PRIVATE int fsdp__check_fingerprint(fsdp_comm *comm, const fsdp__fingerprint *mine,
                                          const fsdp__fingerprint *theirs, int peer) {
    char a[160], b[160];
    if (memcmp(mine, theirs, sizeof *mine) == 0) return 0;
    return fsdp_comm_fail(comm, FSDP_ERR_MISMATCH,
                          "collective mismatch: rank %d called %s but rank %d called %s",
                          comm->rank, fsdp__describe(a, sizeof a, mine), peer,
                          fsdp__describe(b, sizeof b, theirs));
}

/* fsdp_comm_fail; adopted: the failure is another rank's, learned from it (the launcher
   blames the rank whose failure was its own). */
FSDP__PRIVATE int fsdp__comm_vfail(fsdp_comm *comm, int code, int adopted, const char *fmt, va_list ap) {
    int first = 0;
    if (!comm) return code;
    pthread_mutex_lock(&comm->error_lock);
    if (fsdp__load(&comm->status) == FSDP_SUCCESS) {
        vsnprintf(comm->error, sizeof comm->error, fmt, ap);
        comm->failed_ms = fsdp__now_ms();
        comm->adopted = adopted;
        fsdp__store(&comm->status, code);
        first = 1;
    }
    pthread_mutex_unlock(&comm->error_lock);
    if (first) {
        fsdp__log(&comm->logger, FSDP_LOG_ERROR, "rank %d: %s", comm->rank, comm->error);
        if (__atomic_exchange_n(&comm->abort_called, 1, __ATOMIC_ACQ_REL) == 0 && comm->backend &&
            comm->backend->abort)
            comm->backend->abort(comm, comm->impl);
    }
    return code;
}

FSDP_API int fsdp_comm_fail(fsdp_comm *comm, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    code = fsdp__comm_vfail(comm, code, 0, fmt, ap);
    va_end(ap);
    return code;
}

/* Fails the comm with a failure that another rank had first (its abort, its death). */
FSDP__PRIVATE int fsdp__comm_adopt(fsdp_comm *comm, int code, const char *fmt, ...) FSDP__PRINTF(3, 4);
FSDP__PRIVATE int fsdp__comm_adopt(fsdp_comm *comm, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    code = fsdp__comm_vfail(comm, code, 1, fmt, ap);
    va_end(ap);
    return code;
}

FSDP_API void fsdp_comm_abort(fsdp_comm *comm, const char *why) {
    if (comm) fsdp_comm_fail(comm, FSDP_ERR_ABORTED, "aborted by the user on rank %d: %s", comm->rank,
                             why ? why : "(no reason given)");
}

FSDP_API const char *fsdp_comm_last_error(const fsdp_comm *comm) { return comm ? comm->error : fsdp__init_error; }
FSDP_API int fsdp_comm_status(const fsdp_comm *comm) {
    return comm ? fsdp__load(&comm->status) : FSDP_ERR_INVALID_ARG;
}

/* Counts bytes this rank handed over to peer (a rank of comm; -1: its peers on shared memory,
   which are on its host), in comm's tally and its parents'. */
static void fsdp__count_sent(const fsdp_comm *comm, int peer, size_t bytes) {
    int net = peer >= 0 && comm->host_of && comm->host_of[peer] != comm->host;
    fsdp__tally *t;
    for (t = comm->tally; t; t = t->up) __atomic_fetch_add(&t->sent[net], (uint64_t)bytes, __ATOMIC_RELAXED);
}

/* Counts an op called on comm, in its tally and its parents' up to a transport's inner comm. */
static void fsdp__count_op(const fsdp_comm *comm) {
    fsdp__tally *t;
    for (t = comm->tally; t; t = t->inner ? NULL : t->up) __atomic_fetch_add(&t->ops, 1, __ATOMIC_RELAXED);
}

/* A tally that adds into up's (may be NULL), or NULL without memory. */
FSDP__PRIVATE fsdp__tally *fsdp__tally_new(fsdp__tally *up) {
    fsdp__tally *t = (fsdp__tally *)fsdp__calloc(sizeof *t);
    if (!t) return NULL;
    t->refs = 1;
    t->up = up;
    if (up) __atomic_fetch_add(&up->refs, 1, __ATOMIC_RELAXED);
    return t;
}

/* Drops a comm's reference to its tally, and each tally's to its parent's once unused. */
FSDP__PRIVATE void fsdp__tally_release(fsdp__tally *t) {
    while (t && __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        fsdp__tally *up = t->up;
        FSDP_FREE(t);
        t = up;
    }
}

FSDP_API int fsdp_comm_stats_get(const fsdp_comm *comm, fsdp_comm_stats *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!comm || !out) return FSDP_ERR_INVALID_ARG;
    if (!comm->tally) return FSDP_SUCCESS;
    out->bytes_sent_host = __atomic_load_n(&comm->tally->sent[0], __ATOMIC_RELAXED);
    out->bytes_sent_net = __atomic_load_n(&comm->tally->sent[1], __ATOMIC_RELAXED);
    out->ops = __atomic_load_n(&comm->tally->ops, __ATOMIC_RELAXED);
    return FSDP_SUCCESS;
}

FSDP_API int fsdp_comm_rank(const fsdp_comm *comm) { return comm ? comm->rank : -1; }
FSDP_API int fsdp_comm_size(const fsdp_comm *comm) { return comm ? comm->world : 0; }
FSDP_API int fsdp_comm_local_rank(const fsdp_comm *comm) { return comm ? comm->local_rank : -1; }
FSDP_API int fsdp_comm_local_size(const fsdp_comm *comm) { return comm ? comm->local_world : 0; }
FSDP_API int fsdp_comm_num_hosts(const fsdp_comm *comm) { return comm && comm->host_of ? comm->num_hosts : -1; }
FSDP_API int fsdp_comm_hierarchical(const fsdp_comm *comm) { return comm ? comm->two_level : 0; }
FSDP_API int fsdp_comm_host_of(const fsdp_comm *comm, int rank) {
    return comm && comm->host_of && rank >= 0 && rank < comm->world ? comm->host_of[rank] : -1;
}
FSDP_API fsdp_backend_kind fsdp_comm_backend(const fsdp_comm *comm) {
    return comm ? comm->kind : FSDP_BACKEND_DEFAULT;
}
FSDP_API int fsdp_comm_timeout(const fsdp_comm *comm) { return comm ? comm->timeout_ms : 0; }
FSDP_API const char *fsdp_comm_transport(const fsdp_comm *comm) {
    return comm && comm->backend && comm->backend->name ? comm->backend->name : "none";
}

FSDP__PRIVATE int fsdp__default_timeout(void) {
    long value;
    const char *text = getenv("FSDP_TIMEOUT_MS");
    if (text && fsdp__parse_int(text, 1, 0x7fffffffL, &value) == 0) return (int)value;
    return FSDP__DEFAULT_TIMEOUT_MS;
}

/* The comm of this rank's host inside a comm over hosts, or NULL. */
static fsdp_comm *fsdp__host_part(const fsdp_comm *comm) {
    return comm && comm->transport && comm->transport->host_part ? comm->transport->host_part(comm) : NULL;
}

FSDP_API void fsdp_comm_set_timeout(fsdp_comm *comm, int timeout_ms) {
    fsdp_comm *host = fsdp__host_part(comm); /* waits as long */
    if (!comm) return;
    comm->timeout_ms = timeout_ms > 0 ? timeout_ms : fsdp__default_timeout();
    if (host) host->timeout_ms = comm->timeout_ms;
}

/* 1 if every op of the comm ends by its timeout, so a waiting thread may run one itself. */
FSDP__PRIVATE int fsdp__comm_keeps_deadline(const fsdp_comm *comm) {
    return comm && comm->transport && (comm->transport->caps & FSDP__CAP_DEADLINE);
}

/* 1 if an all_to_all's buffers overlap: its pieces move in no order a caller could rely on. */
static int fsdp__all_to_all_overlaps(const fsdp_comm *comm, const fsdp_coll *c, size_t esize) {
    uintptr_t send = (uintptr_t)c->send, recv = (uintptr_t)c->recv, bytes = c->count * esize * (size_t)comm->world;
    return c->kind == FSDP_COLL_ALL_TO_ALL && bytes && send < recv + bytes && recv < send + bytes;
}

/* all_to_all on a user backend without one (see fsdp_backend): world - 1 rounds of its
   all_gather; in round k every rank offers its piece for rank (rank + k) mod world and keeps
   the one from rank (rank - k) mod world. */
FSDP__PRIVATE int fsdp__all_to_all_by_gathers(fsdp_comm *comm, const fsdp_coll *c) {
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    int P = comm->world, me = comm->rank, k, rc = 0;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv, *all;
    fsdp_coll gather = *c;
    if (!bytes) return 0; /* (the fingerprints agreed: every rank moves nothing) */
    memcpy(recv + (size_t)me * bytes, send + (size_t)me * bytes, bytes);
    if (!(all = (char *)FSDP_MALLOC(bytes * (size_t)P)))
        return fsdp_comm_fail(comm, FSDP_ERR_OUT_OF_MEMORY, "all_to_all: no memory for %zu bytes of scratch",
                              bytes * (size_t)P);
    gather.kind = FSDP_COLL_ALL_GATHER;
    gather.recv = all;
    for (k = 1; k < P && rc == FSDP_SUCCESS; k++) {
        int from = (me - k + P) % P;
        gather.send = send + (size_t)((me + k) % P) * bytes;
        rc = comm->backend->all_gather(comm, comm->impl, &gather);
        if (rc == FSDP_SUCCESS) memcpy(recv + (size_t)from * bytes, all + (size_t)from * bytes, bytes);
    }
    FSDP_FREE(all);
    return rc;
}

/* Checks arguments (an invalid call does not poison the comm), stamps the op and runs it. */
FSDP__PRIVATE int fsdp__collective(fsdp_comm *comm, fsdp_coll *c) {
    const fsdp_backend *be;
    size_t esize;
    int rc, status;
    if (!comm) return FSDP_ERR_INVALID_ARG;
    esize = fsdp_dtype_size(c->dtype);
    if (c->kind != FSDP_COLL_BARRIER) {
        if (!esize) {
            fsdp__log(&comm->logger, FSDP_LOG_ERROR, "%s: invalid dtype %d", fsdp_coll_name(c->kind), (int)c->dtype);
            return FSDP_ERR_INVALID_ARG;
        }
        if (c->count && (!c->recv || (!c->send && c->kind != FSDP_COLL_BROADCAST))) {
            fsdp__log(&comm->logger, FSDP_LOG_ERROR, "%s: NULL buffer with count %zu", fsdp_coll_name(c->kind), c->count);
            return FSDP_ERR_INVALID_ARG;
        }
        if (c->count > (SIZE_MAX / 2) / esize / (size_t)comm->world) {
            fsdp__log(&comm->logger, FSDP_LOG_ERROR, "%s: count %zu is too large", fsdp_coll_name(c->kind), c->count);
            return FSDP_ERR_INVALID_ARG;
        }
        if (fsdp__all_to_all_overlaps(comm, c, esize)) {
            fsdp__log(&comm->logger, FSDP_LOG_ERROR, "all_to_all: send and recv overlap (it is never in place)");
            return FSDP_ERR_INVALID_ARG;
        }
    }
    if (c->op == FSDP_REDUCE_DEFAULT) c->op = FSDP_SUM;
    if (c->op != FSDP_SUM && c->op != FSDP_AVG && c->op != FSDP_MAX) {
        fsdp__log(&comm->logger, FSDP_LOG_ERROR, "%s: invalid reduce op %d", fsdp_coll_name(c->kind), (int)c->op);
        return FSDP_ERR_INVALID_ARG;
    }
    if (c->kind == FSDP_COLL_BROADCAST && (c->root < 0 || c->root >= comm->world)) {
        fsdp__log(&comm->logger, FSDP_LOG_ERROR, "broadcast: root %d is not a rank (world size %d)", c->root, comm->world);
        return FSDP_ERR_INVALID_ARG;
    }
    status = fsdp__load(&comm->status);
    if (status != FSDP_SUCCESS) return FSDP_ERR_ABORTED;
    c->seq = ++comm->seq;
    fsdp__count_op(comm);
    c->timeout_ms = comm->timeout_ms;
    be = comm->backend;
    if (comm->world == 1) { /* no peers: the same arithmetic as every backend, locally */
        const void *srcs[1];
        srcs[0] = c->send;
        if (c->count && c->kind == FSDP_COLL_ALL_GATHER && c->send != c->recv)
            memmove(c->recv, c->send, c->count * esize);
        else if (c->count && (c->kind == FSDP_COLL_REDUCE_SCATTER || c->kind == FSDP_COLL_ALL_REDUCE))
            fsdp_reduce_ranks(c->recv, srcs, 1, c->count, c->dtype, c->op, 1);
        else if (c->count && c->kind == FSDP_COLL_ALL_TO_ALL)
            memcpy(c->recv, c->send, c->count * esize);
        return FSDP_SUCCESS;
    }
    if (be->check_fingerprints) {
        fsdp__fingerprint mine = fsdp__fingerprint_of(c), *all;
        fsdp_coll gather;
        int peer;
        all = (fsdp__fingerprint *)FSDP_MALLOC(sizeof *all * (size_t)comm->world);
        if (!all) return fsdp_comm_fail(comm, FSDP_ERR_OUT_OF_MEMORY, "no memory for fingerprints");
        memset(&gather, 0, sizeof gather);
        gather.kind = FSDP_COLL_ALL_GATHER;
        gather.dtype = FSDP_F32;
        gather.count = sizeof mine / 4;
        gather.send = &mine;
        gather.recv = all;
        gather.seq = c->seq;
        gather.timeout_ms = c->timeout_ms;
        rc = be->all_gather(comm, comm->impl, &gather);
        for (peer = 0; rc == FSDP_SUCCESS && peer < comm->world; peer++)
            if (fsdp__check_fingerprint(comm, &mine, &all[peer], peer)) rc = FSDP_ERR_MISMATCH;
        FSDP_FREE(all);
        if (rc != FSDP_SUCCESS) goto failed;
    }
    switch (c->kind) {
        case FSDP_COLL_ALL_GATHER: rc = be->all_gather(comm, comm->impl, c); break;
        case FSDP_COLL_REDUCE_SCATTER: rc = be->reduce_scatter(comm, comm->impl, c); break;
        case FSDP_COLL_ALL_REDUCE: rc = be->all_reduce(comm, comm->impl, c); break;
        case FSDP_COLL_BROADCAST: rc = be->broadcast(comm, comm->impl, c); break;
        case FSDP_COLL_ALL_TO_ALL:
            rc = be->all_to_all ? be->all_to_all(comm, comm->impl, c) : fsdp__all_to_all_by_gathers(comm, c);
            break;
        default: rc = be->barrier(comm, comm->impl, c); break;
    }
    if (rc == FSDP_SUCCESS) return FSDP_SUCCESS;
failed:
    if (fsdp__load(&comm->status) == FSDP_SUCCESS)
        fsdp_comm_fail(comm, rc, "%s failed on rank %d: %s", fsdp_coll_name(c->kind), comm->rank,
                       fsdp_result_description(rc));
    return fsdp__load(&comm->status);
}

FSDP__PRIVATE fsdp_coll fsdp__coll(fsdp_coll_kind kind, const void *send, void *recv, size_t count,
                                   fsdp_dtype dtype, fsdp_reduce_op op, int root) {
    fsdp_coll c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.send = send;
    c.recv = recv;
    c.count = count;
    c.dtype = dtype == FSDP_DTYPE_DEFAULT ? FSDP_F32 : dtype;
    c.op = op;
    c.root = root;
    return c;
}

/* The runtime's entry: a collective labelled with a tag that must agree across ranks. */
FSDP__PRIVATE int fsdp__collective_tagged(fsdp_comm *comm, fsdp_coll_kind kind, const void *send, void *recv,
                                          size_t count, fsdp_dtype dtype, fsdp_reduce_op op, uint32_t tag) {
    fsdp_coll c = fsdp__coll(kind, send, recv, count, dtype, op, 0);
    c.tag = tag;
    return fsdp__collective(comm, &c);
}

FSDP_API int fsdp_all_gather(fsdp_comm *comm, const void *send, void *recv, size_t count, fsdp_dtype dtype) {
    fsdp_coll c = fsdp__coll(FSDP_COLL_ALL_GATHER, send, recv, count, dtype, FSDP_SUM, 0);
    return fsdp__collective(comm, &c);
}
FSDP_API int fsdp_reduce_scatter(fsdp_comm *comm, const void *send, void *recv, size_t count,
                                 fsdp_dtype dtype, fsdp_reduce_op op) {
    fsdp_coll c = fsdp__coll(FSDP_COLL_REDUCE_SCATTER, send, recv, count, dtype, op, 0);
    return fsdp__collective(comm, &c);
}
FSDP_API int fsdp_all_reduce(fsdp_comm *comm, const void *send, void *recv, size_t count,
                             fsdp_dtype dtype, fsdp_reduce_op op) {
    fsdp_coll c = fsdp__coll(FSDP_COLL_ALL_REDUCE, send, recv, count, dtype, op, 0);
    return fsdp__collective(comm, &c);
}
FSDP_API int fsdp_broadcast(fsdp_comm *comm, void *buf, size_t count, fsdp_dtype dtype, int root) {
    fsdp_coll c = fsdp__coll(FSDP_COLL_BROADCAST, buf, buf, count, dtype, FSDP_SUM, root);
    return fsdp__collective(comm, &c);
}
FSDP_API int fsdp_barrier(fsdp_comm *comm) {
    fsdp_coll c = fsdp__coll(FSDP_COLL_BARRIER, NULL, NULL, 0, FSDP_F32, FSDP_SUM, 0);
    return fsdp__collective(comm, &c);
}
FSDP_API int fsdp_all_to_all(fsdp_comm *comm, const void *send, void *recv, size_t count, fsdp_dtype dtype) {
    fsdp_coll c = fsdp__coll(FSDP_COLL_ALL_TO_ALL, send, recv, count, dtype, FSDP_SUM, 0);
    return fsdp__collective(comm, &c);
}

/* A communicator from its description; a sub-communicator's key derives from its parent's. */
/* A world's job token and the key derived from it and the secret (a sub-communicator's come
   from its parent's instead: fsdp__comm_new). */
FSDP__PRIVATE void fsdp__comm_set_job(fsdp_comm *comm, const fsdp_comm_desc *desc, const char *job) {
    fsdp__copy_string(comm->job, sizeof comm->job, job);
    comm->has_secret = desc->secret && *desc->secret;
    fsdp__comm_key(comm->key, comm->has_secret ? desc->secret : "", comm->has_secret ? strlen(desc->secret) : 0,
                   "fsdp.h job key", comm->job, FSDP__KDF_ROUNDS);
}

FSDP__PRIVATE fsdp_comm *fsdp__comm_new(const fsdp_comm_desc *desc, const fsdp_comm *parent) {
    fsdp_comm *comm = (fsdp_comm *)fsdp__calloc(sizeof *comm);
    if (!comm) return NULL;
    comm->rank = desc->rank;
    comm->world = desc->world_size;
    comm->local_rank = desc->local_world_size ? desc->local_rank : desc->rank;
    comm->local_world = desc->local_world_size ? desc->local_world_size : desc->world_size;
    comm->kind = desc->backend == FSDP_BACKEND_DEFAULT ? FSDP_BACKEND_SHM : desc->backend;
    comm->timeout_ms = desc->timeout_ms > 0 ? desc->timeout_ms : fsdp__default_timeout();
    comm->logger = desc->logger;
    comm->status = FSDP_SUCCESS;
    FSDP__CHAOS_RANK(comm->rank);
    pthread_mutex_init(&comm->error_lock, NULL);
    if (!(comm->tally = fsdp__tally_new(parent ? parent->tally : NULL))) {
        pthread_mutex_destroy(&comm->error_lock);
        FSDP_FREE(comm);
        return NULL;
    }
    if (parent) {
        fsdp__copy_string(comm->job, sizeof comm->job, desc->job && *desc->job ? desc->job : "fsdp");
        comm->crowd = parent->crowd;
        fsdp__comm_key(comm->key, parent->key, sizeof parent->key, "fsdp.h sub-communicator key", comm->job, 0);
        comm->has_secret = parent->has_secret;
    } else {
        fsdp__comm_set_job(comm, desc, desc->job && *desc->job ? desc->job : "fsdp");
    }
    return comm;
}

FSDP__PRIVATE void fsdp__region_release(fsdp__region *r, int world) {
    int p;
    if (r->peer_base) {
        for (p = 0; p < world; p++)
            if (r->peer_base[p]) munmap(r->peer_base[p], fsdp__align(r->peer_bytes[p], 4096));
        FSDP_FREE(r->peer_base);
        FSDP_FREE(r->peer_bytes);
    } else if (r->raw) {
        FSDP_FREE(r->raw);
    } else if (r->base) {
        munmap(r->base, fsdp__align(r->bytes, 4096));
    }
    FSDP_FREE(r);
}

FSDP_API void fsdp_comm_destroy(fsdp_comm *comm) {
    if (!comm) return;
    FSDP_FREE(comm->host_of);
    while (comm->regions) {
        fsdp__region *r = comm->regions;
        comm->regions = r->next;
        fsdp__region_release(r, comm->world);
    }
    if (comm->backend && comm->backend->destroy) comm->backend->destroy(comm, comm->impl);
    pthread_mutex_destroy(&comm->error_lock);
    fsdp__wipe(comm->key, sizeof comm->key);
    fsdp__tally_release(comm->tally);
    FSDP_FREE(comm);
}


FSDP__PRIVATE int fsdp__init_fail(const fsdp_logger *logger, int code, const char *fmt, ...) FSDP__PRINTF(3, 4);
FSDP__PRIVATE int fsdp__init_fail(const fsdp_logger *logger, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fsdp__init_error, sizeof fsdp__init_error, fmt, ap);
    va_end(ap);
    fsdp__log(logger, FSDP_LOG_ERROR, "%s", fsdp__init_error);
    return code;
}

/* The CPUs this process may run on (its affinity mask: taskset, cgroup cpusets), else the
   online ones. */
FSDP__PRIVATE int fsdp__usable_cpus(void) {
    long n;
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The CPU this thread runs on now, or -1 where that cannot be told. */
FSDP__PRIVATE int fsdp__current_cpu(void) {
#if defined(__linux__) && defined(CPU_COUNT)
    return sched_getcpu();
#else
    return -1;
#endif
}

/* How long waits spin before they yield and sleep, with this many ranks of the job on the host:
   50 us while each can have a core of those the process may run on, else not at all. FSDP_SPIN=0
   never spins, =1 always does, for what the process cannot see (CPU quotas, other jobs on the
   same cores). (The shm backend also skips the spin on a peer that last ran on this CPU.) */
FSDP__PRIVATE double fsdp__spin_seconds(int ranks) {
    const char *env = getenv("FSDP_SPIN");
    if (env && strcmp(env, "0") == 0) return 0;
    if (env && strcmp(env, "1") == 0) return 50e-6;
    return ranks <= fsdp__usable_cpus() ? 50e-6 : 0;
}

/* Where the comm's waits keep how long they spin, or NULL (one rank, or a transport that
   never spins). */
static double *fsdp__spin_of(const fsdp_comm *comm) {
    return comm && comm->impl && comm->transport && comm->transport->spin ? comm->transport->spin(comm) : NULL;
}

/* Once a comm is made, its waits spin by the whole job's ranks on this host, not only its own:
   a split's few ranks share the cores with the rest of the job. */
FSDP__PRIVATE void fsdp__comm_spin_if_room(fsdp_comm *comm) {
    double *spin = fsdp__spin_of(comm);
    if (spin) *spin = fsdp__spin_seconds(comm->crowd);
}

FSDP_API int fsdp_comm_spins(const fsdp_comm *comm) {
    const double *spin = fsdp__spin_of(comm);
    return spin && *spin > 0;
}

FSDP__PRIVATE void fsdp__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Outputs of large collectives are written with non-temporal stores: they would only evict
   the cache on their way to memory, and skipping the read-for-ownership makes the copy faster
   on a memory-bound host. Smaller outputs stay in cache for the consumer. */
#define FSDP__STREAM_MIN_BYTES ((size_t)8 << 20)

#if FSDP__HAVE_STREAM_AVX2
/* 64-byte blocks with 32-byte non-temporal stores (faster than 16-byte ones on large buffers);
   d is 32-byte aligned. */
__attribute__((target("avx2"))) static void fsdp__stream_blocks_avx2(char *d, const char *s, size_t blocks) {
    size_t i;
    for (i = 0; i < blocks; i++, d += 64, s += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
    }
}

/* -1: not asked yet (racing first callers store the same answer); 0: SSE2; 1: AVX2. The tests
   set 0 to cover the SSE2 kernel on machines with AVX2. */
static int fsdp__stream_avx2 = -1;

static int fsdp__have_avx2(void) {
    int v = __atomic_load_n(&fsdp__stream_avx2, __ATOMIC_RELAXED);
    if (v < 0) {
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&fsdp__stream_avx2, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

FSDP__PRIVATE void fsdp__copy_out(void *dst, const void *src, size_t n, int stream) {
#if FSDP__HAVE_STREAM
    if (stream && n >= 256) {
        char *d = (char *)dst;
        const char *s = (const char *)src;
        size_t head, i, blocks;
#if FSDP__HAVE_STREAM_AVX2
        if (fsdp__have_avx2()) {
            head = (32 - ((uintptr_t)d & 31)) & 31;
            memcpy(d, s, head);
            blocks = (n - head) / 64;
            fsdp__stream_blocks_avx2(d + head, s + head, blocks);
            memcpy(d + head + blocks * 64, s + head + blocks * 64, (n - head) % 64);
            return;
        }
#endif
        head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        blocks = n / 64;
        for (i = 0; i < blocks; i++, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        memcpy(d, s, n % 64);
        return;
    }
#else
    (void)stream;
#endif
    memcpy(dst, src, n);
}

/* Orders non-temporal stores before anything that tells another thread the data is there. */
static inline void fsdp__stream_fence(void) {
#if FSDP__HAVE_STREAM
    _mm_sfence();
#endif
}

/* The comm's documented reduction of its ranks' inputs (srcs in rank order), for backends that
   fold after moving the data (the MPI bridge): rank order, or with the two-level order each
   host's ranks in rank order, the partial rounded to the dtype (as a hierarchical op sends it),
   then the hosts in host order. scratch: num_hosts * count elements of dtype. */
FSDP__PRIVATE void fsdp__reduce_layout(const fsdp_comm *comm, void *dst, const void *const *srcs, size_t count,
                                       fsdp_dtype dtype, fsdp_reduce_op op, char *scratch) {
    const void *mine[FSDP__MAX_WORLD], *partials[FSDP__MAX_WORLD];
    size_t bytes = count * fsdp_dtype_size(dtype);
    int h, r, n;
    if (!comm->two_level) {
        fsdp_reduce_ranks(dst, srcs, comm->world, count, dtype, op, comm->world);
        return;
    }
    for (h = 0; h < comm->num_hosts; h++) {
        for (r = 0, n = 0; r < comm->world; r++)
            if (comm->host_of[r] == h) mine[n++] = srcs[r];
        fsdp_reduce_ranks(scratch + (size_t)h * bytes, mine, n, count, dtype, op == FSDP_MAX ? FSDP_MAX : FSDP_SUM, 1);
        partials[h] = scratch + (size_t)h * bytes;
    }
    fsdp_reduce_ranks(dst, partials, comm->num_hosts, count, dtype, op, comm->world);
}

/* What makes ranks "one host" for fsdp.h: they can share memory through the same /dev/shm.
   Learned from facts, not from LOCAL_WORLD_SIZE: a digest of the host name, the boot id, the
   device and inode of the /dev/shm this process sees, and its network namespace, so ranks in
   different network or mount namespaces (containers, test hosts) count as different hosts. */
FSDP__PRIVATE void fsdp__host_facts(unsigned char out[32]) {
    char name[256] = "", boot[64] = "", net[64] = "";
    struct stat st;
    unsigned long long dev = 0, ino = 0;
    fsdp__sha256 h;
    ssize_t got;
    int fd;
    gethostname(name, sizeof name - 1);
    if ((fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC)) >= 0) {
        if ((got = read(fd, boot, sizeof boot - 1)) > 0) boot[got] = 0;
        close(fd);
    }
    if ((got = readlink("/proc/self/ns/net", net, sizeof net - 1)) > 0) net[got] = 0;
    if (stat("/dev/shm", &st) == 0) {
        dev = (unsigned long long)st.st_dev;
        ino = (unsigned long long)st.st_ino;
    }
    fsdp__sha256_init(&h);
    fsdp__sha256_update(&h, "fsdp.h host", 12);
    fsdp__sha256_update(&h, name, strlen(name) + 1);
    fsdp__sha256_update(&h, boot, strlen(boot) + 1);
    fsdp__sha256_update(&h, net, strlen(net) + 1);
    fsdp__sha256_update(&h, &dev, sizeof dev);
    fsdp__sha256_update(&h, &ino, sizeof ino);
    fsdp__sha256_final(&h, out);
}

/* Numbers the hosts of `world` ranks from their host digests (facts[16 * r], the first 16 bytes
   of fsdp__host_facts) in order of their lowest rank: host_of[r]. The number of hosts, or -1
   without memory. Linear in the ranks: the digests go through a hash table. */
FSDP__PRIVATE int fsdp__host_numbers(const unsigned char *facts, int world, int *host_of) {
    size_t cap = 16, i;
    int *holder, r, hosts = 0; /* holder[i]: the lowest rank of the digest in slot i, or -1 */
    while (cap < 2 * (size_t)world) cap <<= 1;
    if (!(holder = (int *)FSDP_MALLOC(sizeof *holder * cap))) return -1;
    for (i = 0; i < cap; i++) holder[i] = -1;
    for (r = 0; r < world; r++) {
        const unsigned char *digest = facts + 16 * (size_t)r;
        uint64_t bits;
        memcpy(&bits, digest, sizeof bits); /* a digest's bytes are already uniform */
        for (i = (size_t)bits & (cap - 1); holder[i] >= 0 && memcmp(facts + 16 * (size_t)holder[i], digest, 16) != 0;
             i = (i + 1) & (cap - 1)) {
        }
        if (holder[i] < 0) holder[i] = r, host_of[r] = hosts++;
        else host_of[r] = host_of[holder[i]];
    }
    FSDP_FREE(holder);
    return hosts;
}

/* 1 if this process asks for a flat world (FSDP_HIERARCHICAL=0). */
static int fsdp__flat_wish(void) {
    const char *env = getenv("FSDP_HIERARCHICAL");
    return env && strcmp(env, "0") == 0;
}

/* 1 if the ranks are numbered host by host (host_of never goes back to an earlier host). */
static int fsdp__host_by_host(const fsdp_comm *comm) {
    int r;
    for (r = 1; r < comm->world; r++)
        if (comm->host_of[r] != comm->host_of[r - 1] && comm->host_of[r] != comm->host_of[r - 1] + 1) return 0;
    return 1;
}

/* Sets host, local_rank, local_world and two_level from host_of and num_hosts; flat: some rank
   asked for a flat world. */
FSDP__PRIVATE void fsdp__comm_place(fsdp_comm *comm, int flat) {
    int r;
    comm->host = comm->host_of[comm->rank];
    comm->local_rank = comm->local_world = 0;
    for (r = 0; r < comm->world; r++)
        if (comm->host_of[r] == comm->host) comm->local_rank += r < comm->rank, comm->local_world++;
    /* the two-level order needs several hosts, several ranks on some, ranks numbered host by host */
    comm->two_level = comm->num_hosts > 1 && comm->num_hosts < comm->world && !flat && fsdp__host_by_host(comm);
}

/* Sets host_of, num_hosts, host, local_rank and local_world. With everyone = 1 (one shm
   segment) the ranks are one host by construction; else they all-gather their host facts
   (collective: the comm's first op). */
FSDP__PRIVATE int fsdp__comm_topology(fsdp_comm *comm, int everyone) {
    unsigned char *all = NULL, mine[32];
    int rc = 0;
    if (!(comm->host_of = (int *)fsdp__calloc(sizeof(int) * (size_t)comm->world))) return FSDP_ERR_OUT_OF_MEMORY;
    comm->num_hosts = 1;
    if (!everyone && comm->world > 1) {
        if (!(all = (unsigned char *)FSDP_MALLOC(16 * (size_t)comm->world))) return FSDP_ERR_OUT_OF_MEMORY;
        fsdp__host_facts(mine);
        rc = fsdp__collective_tagged(comm, FSDP_COLL_ALL_GATHER, mine, all, 4, FSDP_F32, FSDP_SUM, 0x70b0u);
        if (!rc && (comm->num_hosts = fsdp__host_numbers(all, comm->world, comm->host_of)) < 0) rc = FSDP_ERR_OUT_OF_MEMORY;
        FSDP_FREE(all);
        if (rc) return rc;
    }
    fsdp__comm_place(comm, fsdp__flat_wish());
    return 0;
}

/* fsdp__comm_topology for a comm being made: a failure is the init's, and says so. */
FSDP__PRIVATE int fsdp__comm_learn_topology(fsdp_comm *comm, int everyone) {
    int rc = fsdp__comm_topology(comm, everyone);
    if (rc)
        fsdp__init_fail(&comm->logger, rc, "fsdp_comm_init: rank %d could not learn which ranks share its host: %s",
                        comm->rank, rc == FSDP_ERR_OUT_OF_MEMORY ? "out of memory" : comm->error);
    return rc;
}

/* Creates a communicator (>>backends); the backends' splits make theirs with it too. */
FSDP__PRIVATE int fsdp__comm_create(fsdp_comm **out, const fsdp_comm_desc *desc, const fsdp_comm *parent,
                                    fsdp__inherit *inherit);

/* The shared fsdp_comm_alloc region holding [ptr, ptr + bytes), or NULL. */
FSDP__PRIVATE const fsdp__region *fsdp__shared_region(const fsdp_comm *comm, const void *ptr, size_t bytes) {
    const fsdp__region *r;
    const char *at = (const char *)ptr;
    if (!ptr) return NULL;
    for (r = comm->regions; r; r = r->next)
        if (r->peer_base && at >= r->base && bytes <= r->bytes && (size_t)(at - r->base) <= r->bytes - bytes) return r;
    return NULL;
}

FSDP_API int fsdp_comm_alloc(fsdp_comm *comm, size_t bytes, void **out) {
    fsdp__region *r;
    fsdp_comm *host;
    int rc = 0;
    if (out) *out = NULL;
    if (!comm || !out) return FSDP_ERR_INVALID_ARG;
    if (bytes > SIZE_MAX / 2) {
        fsdp__log(&comm->logger, FSDP_LOG_ERROR, "fsdp_comm_alloc: %zu bytes is too large", bytes);
        return FSDP_ERR_INVALID_ARG;
    }
    if (fsdp__load(&comm->status) != FSDP_SUCCESS) return FSDP_ERR_ABORTED;
    if ((host = fsdp__host_part(comm)) != NULL) /* shared with the ranks of this host, which read it */
        return fsdp_comm_alloc(host, bytes, out);
    if (!(r = (fsdp__region *)fsdp__calloc(sizeof *r))) return FSDP_ERR_OUT_OF_MEMORY;
    r->bytes = bytes ? bytes : 1;
    r->id = comm->allocations++;
    if (comm->transport->share && comm->world > 1 && (rc = comm->transport->share(comm, r)) != 0) {
        FSDP_FREE(r);
        return rc;
    }
    if (!r->base) { /* ordinary memory, 64-byte aligned */
        if (!(r->raw = FSDP_MALLOC(r->bytes + 64))) {
            FSDP_FREE(r);
            return FSDP_ERR_OUT_OF_MEMORY;
        }
        r->base = (char *)r->raw + (64 - (uintptr_t)r->raw % 64);
        memset(r->base, 0, r->bytes);
    }
    r->next = comm->regions;
    comm->regions = r;
    *out = r->base;
    return FSDP_SUCCESS;
}

FSDP_API void fsdp_comm_free(fsdp_comm *comm, void *ptr) {
    fsdp__region **at;
    fsdp_comm *host = fsdp__host_part(comm);
    if (!comm || !ptr) return;
    if (host) {
        fsdp_comm_free(host, ptr);
        return;
    }
    for (at = &comm->regions; *at; at = &(*at)->next)
        if ((*at)->base == (char *)ptr) {
            fsdp__region *r = *at;
            *at = r->next;
            fsdp__region_release(r, comm->world);
            return;
        }
    fsdp__log(&comm->logger, FSDP_LOG_ERROR, "fsdp_comm_free: %p is not memory from fsdp_comm_alloc on this comm", ptr);
}

FSDP_API int fsdp_comm_is_shared(const fsdp_comm *comm, const void *ptr, size_t bytes) {
    fsdp_comm *host = fsdp__host_part(comm);
    if (host) return fsdp_comm_is_shared(host, ptr, bytes);
    return comm && fsdp__shared_region(comm, ptr, bytes) != NULL;
}

/* ============================================================================================
   >>shm
   Ranks on one host share one segment: a header, a control block per rank and, per rank,
   FSDP__SHM_SLOTS staging slots. Every op is a sequence of rounds; round g uses slot g % SLOTS.
   In a round each rank writes its data into its slot, stamps the slot with the op's fingerprint
   and publishes arrive = g + 1; it then waits for every peer's arrive, checks their
   fingerprints, reads what it needs from their slots and publishes depart = g + 1. A slot is
   rewritten only after every peer departed from the round that last used it, so rounds
   pipeline SLOTS deep. Waits spin briefly (not at all when ranks outnumber cores), then sleep
   on a futex with a timeout, checking the abort flag and the peer's liveness between sleeps.
   ============================================================================================ */
#define FSDP__SHM_MAGIC 0x314d485350445346ull /* "FSDPSHM1" */
#define FSDP__SHM_VERSION 5u
#define FSDP__SHM_SLOTS 4
#define FSDP__SHM_SMALL_ALL_REDUCE (32u * 1024u)
/* ... and up to this much with two ranks, where reducing everything on both costs less than a
   second round */
#define FSDP__SHM_SMALL_ALL_REDUCE_2 (256u * 1024u)
#define FSDP__SHM_DIRECT_MIN ((size_t)64 * 1024) /* smaller ops stage even from shared memory */
#define FSDP__SHM_SINGLE_MIN ((size_t)64 * 1024)  /* by default single copy serves all_gather and */
#define FSDP__SHM_SINGLE_MAX ((size_t)512 * 1024) /* broadcast whose blocks are in [MIN, MAX) (fsdp__shm_offer_of) */
#define FSDP__SHM_IN_SLOT 0xffffffffu
/* Rounds of all_gather and broadcast in which a rank stages move at most this much per rank:
   a staged piece is read by the peers while it is still in its writer's cache (a 1 MiB L2 is
   common). When no rank stages (buffers in shared regions or read by single copy) rounds use
   the whole slot: fewer rounds to agree on. */
#define FSDP__SHM_STAGE_PIECE ((size_t)512 * 1024)
#define FSDP__SHM_IN_PROCESS 0xfffffffeu

/* Where a rank's data for a round is: in its slot (region FSDP__SHM_IN_SLOT); at offset in its
   block of fsdp_comm_alloc region `region`, which peers map; or (FSDP__SHM_IN_PROCESS) at
   address `offset` in its own memory, `length` bytes, which peers read with process_vm_readv. */
typedef struct fsdp__shm_src {
    uint32_t region;
    uint32_t pad;
    uint64_t offset;
    uint64_t length;
} fsdp__shm_src;

/* A line a rank writes about itself for the ranks of its host: in a hierarchical comm, whom its
   wait on the network is for (read by a local peer that times out waiting for it). seq is odd
   while the text changes; readers copy it and keep the copy only if seq was even and unchanged. */
typedef struct fsdp__shm_note {
    uint32_t seq;
    char text[92];
} fsdp__shm_note;

typedef struct fsdp__shm_rank {
    uint32_t arrive;            /* futex word: rounds whose data this rank has published */
    uint32_t arrive_waiters;
    char pad0[56];
    uint32_t depart;            /* futex word: rounds this rank has finished reading */
    uint32_t depart_waiters;
    char pad1[56];
    int32_t pid;
    uint32_t attached;
    uint32_t left;              /* destroyed its communicator */
    uint32_t single_copy;       /* 1: it can read every peer's memory (process_vm_readv), 2: cannot */
    uint64_t probe_addr;        /* where in its memory peers find probe_cookie, to test that */
    uint64_t probe_cookie;
    int32_t cpu;                /* the CPU it ran on when it last published (-1: unknown); a peer
                                   about to wait on it does not spin if it runs there itself */
    uint32_t pad2;
    fsdp__shm_note waiting_for; /* hierarchical comms: the remote rank its network wait is on */
    fsdp__fingerprint slot_fp[FSDP__SHM_SLOTS];
    fsdp__shm_src slot_src[FSDP__SHM_SLOTS];
    char pad3[64 - (40 + sizeof(fsdp__shm_note) + FSDP__SHM_SLOTS * (sizeof(fsdp__fingerprint) + sizeof(fsdp__shm_src))) % 64];
} fsdp__shm_rank;

typedef struct fsdp__shm_header {
    uint64_t magic;
    uint32_t version;
    uint32_t world;
    uint64_t slot_bytes;
    uint64_t total_bytes;
    uint32_t attached;          /* ranks that mapped the segment */
    uint32_t abort_flag;        /* set once the first failer's rank, code and message are written */
    uint32_t abort_claim;       /* taken by the first failer */
    uint32_t pad0;
    int32_t abort_rank;
    int32_t abort_code;
    int32_t creator_pid;
    int32_t pad;
    char name[64];
    char abort_message[FSDP__ERRMSG];
} fsdp__shm_header;

typedef struct fsdp__shm {
    fsdp__shm_header *header;
    fsdp__shm_rank *ranks;
    char *data;
    size_t map_bytes;
    size_t slot_bytes;
    int owns_mapping;           /* 0 when the launcher mapped it before fork */
    double spin_seconds;        /* how long to spin before yielding; fsdp__spin_seconds */
    int check_pids;             /* peers' pids are visible from here */
    uint32_t round;             /* rounds completed by this rank */
    int64_t op_deadline;        /* the running op fails at this time (fsdp__now_ms) */
    size_t stride;              /* set by >>hier for one op: rank p's block of an all_gather's recv
                                   or a reduce_scatter's send starts p * stride bytes in (0: the
                                   block size, the documented layout) */
    int single_copy;            /* peers read ordinary buffers with process_vm_readv (the probe passed) */
    int single_copy_asked;      /* 1: asked for (1 or auto): every op that copies, every size; 0: the
                                   default, all_gather and broadcast blocks of FSDP__SHM_SINGLE_MIN..MAX */
    int single_copy_wanted;     /* fsdp_comm_desc.shm_single_copy: 0 as the environment says, 1 required,
                                   2 where the ranks can, -1 never */
    uint64_t cookie;            /* what peers must read at &cookie in the probe */
    char name[64];
} fsdp__shm;

FSDP__PRIVATE size_t fsdp__shm_layout(int world, size_t slot_bytes, size_t *ranks_offset, size_t *data_offset) {
    size_t ranks_at = fsdp__align(sizeof(fsdp__shm_header), 4096);
    size_t data_at = fsdp__align(ranks_at + sizeof(fsdp__shm_rank) * (size_t)world, 4096);
    if (ranks_offset) *ranks_offset = ranks_at;
    if (data_offset) *data_offset = data_at;
    return data_at + (size_t)world * FSDP__SHM_SLOTS * slot_bytes;
}

FSDP__PRIVATE void fsdp__shm_header_init(void *base, int world, size_t slot_bytes, size_t total, const char *name) {
    fsdp__shm_header *h = (fsdp__shm_header *)base;
    h->version = FSDP__SHM_VERSION;
    h->world = (uint32_t)world;
    h->slot_bytes = slot_bytes;
    h->total_bytes = total;
    h->creator_pid = (int32_t)getpid();
    fsdp__copy_string(h->name, sizeof h->name, name);
    fsdp__store(&h->magic, FSDP__SHM_MAGIC); /* last: readers wait for it */
}

static inline fsdp__shm_rank *fsdp__shm_peer(fsdp__shm *s, int r) { return &s->ranks[r]; }
static inline char *fsdp__shm_slot(fsdp__shm *s, int r, uint32_t round) {
    return s->data + ((size_t)r * FSDP__SHM_SLOTS + round % FSDP__SHM_SLOTS) * s->slot_bytes;
}

static long fsdp__futex(uint32_t *word, int op, uint32_t value, const struct timespec *timeout) {
#if defined(__linux__)
    return syscall(SYS_futex, word, op, value, timeout, NULL, 0);
#else
    (void)word; (void)op; (void)value;
    if (timeout) nanosleep(timeout, NULL);
    return 0;
#endif
}

static void fsdp__wake(uint32_t *word, uint32_t *waiters) {
    if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) != 0) fsdp__futex(word, FUTEX_WAKE, 0x7fffffff, NULL);
}

static void fsdp__publish(uint32_t *word, uint32_t *waiters, uint32_t value) {
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
    fsdp__wake(word, waiters);
}

/* 1 if the process is gone or a zombie. */
FSDP__PRIVATE int fsdp__pid_dead(int pid) {
    char path[64], buf[256];
    const char *close_paren;
    FILE *f;
    size_t n;
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    fsdp__fmt(path, sizeof path, "/proc/%d/stat", pid);
    f = fopen(path, "r");
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

/* The first failer's message, copied out of the segment: bounded (a peer need not have
   terminated it) and printable. */
static void fsdp__shm_abort_message(const fsdp__shm_header *h, char *out, size_t size) {
    char raw[sizeof h->abort_message];
    memcpy(raw, h->abort_message, sizeof raw);
    fsdp__printable_n(out, size, raw, sizeof raw);
}

/* Writes text (cut to fit) into a note of this rank's; only its owner writes it. Byte by byte
   with release stores (and the reader's acquire loads), which order it as a seqlock without
   fences (the thread sanitizer does not take fences). */
static void fsdp__shm_note_set(fsdp__shm_note *n, const char *text) {
    char buf[sizeof n->text];
    uint32_t seq = __atomic_load_n(&n->seq, __ATOMIC_RELAXED);
    size_t i;
    memset(buf, 0, sizeof buf);
    fsdp__copy_string(buf, sizeof buf, text);
    __atomic_store_n(&n->seq, seq + 1, __ATOMIC_RELAXED);
    for (i = 0; i < sizeof buf; i++) __atomic_store_n(&n->text[i], buf[i], __ATOMIC_RELEASE);
    __atomic_store_n(&n->seq, seq + 2, __ATOMIC_RELEASE);
}

/* A peer's note, copied out bounded and printable; 0 if it is empty or was being rewritten. */
static int fsdp__shm_note_get(const fsdp__shm_note *n, char *out, size_t size) {
    char raw[sizeof n->text];
    uint32_t before = __atomic_load_n(&n->seq, __ATOMIC_ACQUIRE), after;
    size_t i;
    for (i = 0; i < sizeof raw; i++) raw[i] = __atomic_load_n(&n->text[i], __ATOMIC_ACQUIRE);
    after = __atomic_load_n(&n->seq, __ATOMIC_RELAXED);
    if (before != after || (before & 1u)) raw[0] = 0;
    fsdp__printable_n(out, size, raw, sizeof raw);
    return out[0] != 0;
}

/* Fails the comm because the shared abort flag is set; adopts the first failer's code. */
FSDP__PRIVATE int fsdp__shm_adopt_abort(fsdp_comm *comm, fsdp__shm *s) {
    const fsdp__shm_header *h = s->header;
    int32_t rank = __atomic_load_n(&h->abort_rank, __ATOMIC_RELAXED);
    int code = __atomic_load_n(&h->abort_code, __ATOMIC_RELAXED) == FSDP_ERR_MISMATCH ? FSDP_ERR_MISMATCH : FSDP_ERR_ABORTED;
    char message[FSDP__ERRMSG];
    fsdp__shm_abort_message(h, message, sizeof message);
    if (rank < 0) return fsdp__comm_adopt(comm, FSDP_ERR_PEER_LOST, "%s", message);
    return fsdp__comm_adopt(comm, code, "rank %d failed first: %s", (int)rank, message);
}

/* Waits until the peer's counter reaches target: its arrive counter (depart 0), or its depart
   counter, before reusing a slot (1) or before returning from an op whose memory it read (2). */
FSDP__PRIVATE int fsdp__shm_wait(fsdp_comm *comm, fsdp__shm *s, int peer, int depart, uint32_t target,
                                 const fsdp_coll *c) {
    fsdp__shm_rank *r = fsdp__shm_peer(s, peer);
    uint32_t *word = depart ? &r->depart : &r->arrive;
    uint32_t *waiters = depart ? &r->depart_waiters : &r->arrive_waiters;
    int64_t start, deadline = s->op_deadline;
    double until, spin;
    int i, here;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    /* Spin briefly (the peer is usually microseconds away) unless it last ran on this CPU
       (spinning would keep it off), then yield the core for a while (with more ranks than cores
       the peer may need ours), then sleep on the futex. */
    spin = s->spin_seconds;
    if (spin > 0 && (here = fsdp__current_cpu()) >= 0 && __atomic_load_n(&r->cpu, __ATOMIC_RELAXED) == here) spin = 0;
    until = fsdp_now() + spin;
    do {
        for (i = 0; i < 64; i++) {
            if ((int32_t)(fsdp__load(word) - target) >= 0) return 0;
            fsdp__cpu_relax();
        }
    } while (spin > 0 && fsdp_now() < until);
    until = fsdp_now() + 200e-6;
    do {
        if ((int32_t)(fsdp__load(word) - target) >= 0) return 0;
        sched_yield();
    } while (fsdp_now() < until);
    start = fsdp__now_ms();
    for (;;) {
        uint32_t seen = fsdp__load(word);
        int64_t now;
        if ((int32_t)(seen - target) >= 0) return 0;
        if (fsdp__load(&s->header->abort_flag)) return fsdp__shm_adopt_abort(comm, s);
        if (fsdp__load(&comm->status) != FSDP_SUCCESS) return fsdp__load(&comm->status);
        now = fsdp__now_ms();
        if (fsdp__load(&r->left))
            return fsdp__comm_adopt(comm, FSDP_ERR_PEER_LOST,
                                  "rank %d destroyed its communicator while rank %d waited for it in %s",
                                  peer, comm->rank, fsdp_coll_name(c->kind));
        if (s->check_pids && now - start >= 20 && fsdp__pid_dead(r->pid))
            return fsdp__comm_adopt(comm, FSDP_ERR_PEER_LOST,
                                  "rank %d (pid %d) died while rank %d waited for it in %s (op #%llu)",
                                  peer, (int)r->pid, comm->rank, fsdp_coll_name(c->kind),
                                  (unsigned long long)c->seq);
        if (now >= deadline) { /* a peer waiting on another host says whom for */
            char why[sizeof r->waiting_for.text + 8];
            int noted = fsdp__shm_note_get(&r->waiting_for, why, sizeof why);
            return fsdp_comm_fail(comm, FSDP_ERR_TIMEOUT,
                                  "rank %d waited %d ms for rank %d (pid %d) in %s (op #%llu); rank %d is "
                                  "alive but did not %s%s%s",
                                  comm->rank, c->timeout_ms, peer, (int)r->pid, fsdp_coll_name(c->kind),
                                  (unsigned long long)c->seq, peer,
                                  depart == 0 ? "join this collective"
                                  : depart == 1 ? "read the data this rank staged earlier"
                                                : "finish reading this rank's memory",
                                  noted ? ": it is waiting for " : "", noted ? why : "");
        }
        {
            int64_t left_ms = deadline - now;
            struct timespec ts;
            long slice = left_ms < 20 ? (long)left_ms : 20;
            ts.tv_sec = 0;
            ts.tv_nsec = slice * 1000000L;
            __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == seen && !fsdp__load(&s->header->abort_flag))
                fsdp__futex(word, FUTEX_WAIT, seen, &ts);
            __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
        }
    }
}

/* Starts round s->round: waits until every peer has left the round that last used this slot,
   so the caller may write its slot. */
FSDP__PRIVATE int fsdp__shm_round_begin(fsdp_comm *comm, fsdp__shm *s, const fsdp_coll *c) {
    int p, rc;
    uint32_t g = s->round;
    FSDP__CHAOS(FSDP__CHAOS_ROUND);
    if (g < FSDP__SHM_SLOTS) return 0;
    for (p = 0; p < comm->world; p++) {
        if (p == comm->rank) continue;
        if ((rc = fsdp__shm_wait(comm, s, p, 1, g - FSDP__SHM_SLOTS + 1, c)) != 0) return rc;
    }
    return 0;
}

/* How this rank offers a buffer of an op to its peers: staged in its slots (neither set), from
   fsdp_comm_alloc memory the peers map (region), or straight from its own memory, which peers
   read with process_vm_readv (base, length). In the last two cases there is nothing to stage,
   and the op waits at its end until peers are done reading (fsdp__shm_settle). */
typedef struct fsdp__shm_offer {
    const fsdp__region *region;
    const char *base;
    size_t length;
} fsdp__shm_offer;

/* How readers use what a rank offers (fsdp__shm_offer_of). */
enum {
    FSDP__READ_REDUCE,       /* reduce_scatter, all_reduce's first half: peers fold it */
    FSDP__READ_COPY,         /* all_gather: every peer copies every rank's block */
    FSDP__READ_COPY_ROOT,    /* broadcast: every peer copies the root's buffer */
    FSDP__READ_COPY_REDUCED, /* all_reduce's gather half: the reduced piece a peer just wrote */
    FSDP__READ_COPY_PIECES   /* all_to_all: every peer copies its piece, bytes / world of the buffer */
};

/* The best offer of [buf, buf + bytes) for an op moving op_bytes: mapped memory, else (where
   the readers only copy the data) a single copy where the ranks can, else staging (always for
   small ops: the end-of-op wait for readers and the system calls cost more than staging
   saves). Data that readers reduce is not offered for a single copy: the kernel would have to
   copy it into the reader's memory first, the staging copy moved to the reader. By default
   (single copy not asked for) only all_gather, all_to_all and broadcast read in place, where the
   offered block (a rank's part in an op of 128 KiB or more; an all_to_all's piece for one rank;
   the root's buffer from 256 KiB, below which staging is cheaper) is less than 512 KiB: staged,
   such pieces go from the writer's cache to the reader's, which costs 2-8x more than
   process_vm_readv in the windows where moving cache lines between cores is slow
   (BENCHMARKS.md section 2). Smaller blocks stage (cheaper), and so do blocks of 512 KiB and
   more (glibc's memcpy stores those past the writer's cache, so staging is fast again, and the
   kernel's page pinning costs more than the second copy), and an all_reduce's gather half
   (FSDP__READ_COPY_REDUCED: the reduced piece a peer just wrote). */
static fsdp__shm_offer fsdp__shm_offer_of(const fsdp_comm *comm, const fsdp__shm *s, const void *buf, size_t bytes,
                                          size_t op_bytes, int readers) {
    fsdp__shm_offer o;
    memset(&o, 0, sizeof o);
    if (op_bytes < FSDP__SHM_DIRECT_MIN || !buf) return o;
    if ((o.region = fsdp__shared_region(comm, buf, bytes)) != NULL) return o;
    if (s->single_copy && readers != FSDP__READ_REDUCE &&
        (s->single_copy_asked ||
         (readers == FSDP__READ_COPY && bytes >= FSDP__SHM_SINGLE_MIN && bytes < FSDP__SHM_SINGLE_MAX &&
          op_bytes >= 2 * FSDP__SHM_SINGLE_MIN) ||
         (readers == FSDP__READ_COPY_PIECES && bytes / (size_t)comm->world >= FSDP__SHM_SINGLE_MIN &&
          bytes / (size_t)comm->world < FSDP__SHM_SINGLE_MAX) ||
         (readers == FSDP__READ_COPY_ROOT && bytes >= 4 * FSDP__SHM_SINGLE_MIN && bytes < FSDP__SHM_SINGLE_MAX))) {
        o.base = (const char *)buf;
        o.length = bytes;
    }
    return o;
}

static int fsdp__shm_offered(const fsdp__shm_offer *o) { return o->region || o->base; }

/* Publishes this rank's slot for the round and waits for every peer's, checking fingerprints.
   With an offer, this rank's data for the round is not in its slot but at `at` in the offered
   buffer, where peers read it directly. */
FSDP__PRIVATE int fsdp__shm_round_exchange(fsdp_comm *comm, fsdp__shm *s, const fsdp_coll *c,
                                           const fsdp__fingerprint *fp, const fsdp__shm_offer *offer,
                                           const void *at) {
    uint32_t g = s->round;
    int p, rc, i, first = FSDP__CHAOS_PICK(comm->world); /* (peers waited for from rank `first` on) */
    fsdp__shm_rank *me = fsdp__shm_peer(s, comm->rank);
    fsdp__shm_src *src = &me->slot_src[g % FSDP__SHM_SLOTS];
    me->slot_fp[g % FSDP__SHM_SLOTS] = *fp;
    src->region = FSDP__SHM_IN_SLOT;
    src->offset = src->length = 0;
    if (offer && offer->region) {
        src->region = offer->region->id;
        src->offset = (uint64_t)((const char *)at - offer->region->base);
    } else if (offer && offer->base) {
        src->region = FSDP__SHM_IN_PROCESS;
        src->offset = (uint64_t)(uintptr_t)at;
        src->length = (uint64_t)(offer->base + offer->length - (const char *)at);
    }
    __atomic_store_n(&me->cpu, (int32_t)fsdp__current_cpu(), __ATOMIC_RELAXED);
    FSDP__CHAOS(FSDP__CHAOS_ROUND);
    fsdp__publish(&me->arrive, &me->arrive_waiters, g + 1);
    for (i = 0; i < comm->world; i++) {
        fsdp__fingerprint theirs;
        p = first + i < comm->world ? first + i : first + i - comm->world; /* (i without FSDP_CHAOS) */
        if (p == comm->rank) continue;
        if ((rc = fsdp__shm_wait(comm, s, p, 0, g + 1, c)) != 0) return rc;
        FSDP__CHAOS(FSDP__CHAOS_PIECE);
        memcpy(&theirs, &fsdp__shm_peer(s, p)->slot_fp[g % FSDP__SHM_SLOTS], sizeof theirs); /* compared and shown as read */
        if (fsdp__check_fingerprint(comm, fp, &theirs, p)) return FSDP_ERR_MISMATCH;
    }
    return 0;
}

FSDP__PRIVATE void fsdp__shm_round_end(fsdp__shm *s, int rank) {
    fsdp__shm_rank *me = fsdp__shm_peer(s, rank);
    FSDP__CHAOS(FSDP__CHAOS_ROUND);
    s->round++;
    fsdp__publish(&me->depart, &me->depart_waiters, s->round);
}

/* Bytes per rank of a round of all_gather or broadcast in which someone stages: the first
   round always, later ones as fsdp__shm_later_rounds decides. */
static size_t fsdp__shm_stage_piece(const fsdp__shm *s) {
    return s->slot_bytes < FSDP__SHM_STAGE_PIECE ? s->slot_bytes : FSDP__SHM_STAGE_PIECE;
}

/* 1 if some rank (root < 0), or the root, staged its data for the current round in its slot:
   what every rank published for the round, so the same answer on all of them. */
static int fsdp__shm_someone_staged(fsdp__shm *s, int world, int root) {
    int p;
    for (p = 0; p < world; p++)
        if ((root < 0 || p == root) &&
            fsdp__shm_peer(s, p)->slot_src[s->round % FSDP__SHM_SLOTS].region == FSDP__SHM_IN_SLOT)
            return 1;
    return 0;
}

/* The length of every later round of an all_gather (root < 0) or broadcast, decided after the
   exchange of its first round from what every rank, or the root, published for it: the same on
   all ranks. */
static size_t fsdp__shm_later_rounds(fsdp__shm *s, int world, int root) {
    return fsdp__shm_someone_staged(s, world, root) ? fsdp__shm_stage_piece(s) : s->slot_bytes;
}

/* process_vm_readv by its system call number: the libc wrapper is declared only under
   _GNU_SOURCE, which a program that includes <stdio.h> before fsdp.h in a -std=gnu mode lacks. */
static ssize_t fsdp__vm_read(pid_t pid, struct iovec *local, struct iovec *remote) {
#if defined(__linux__) && defined(SYS_process_vm_readv)
    return (ssize_t)syscall(SYS_process_vm_readv, (long)pid, local, 1UL, remote, 1UL, 0UL);
#else
    (void)pid; (void)local; (void)remote;
    errno = ENOSYS;
    return -1;
#endif
}

/* Reads len bytes at address + rel of peer p's memory into dst (process_vm_readv), after
   checking them against the length it published (the address and length come from its rank
   block in the segment, which only this user's processes could write). A failed read is an
   error naming the peer, never a crash. */
FSDP__PRIVATE int fsdp__shm_read_peer(fsdp_comm *comm, fsdp__shm *s, int p, uint64_t address, uint64_t length, size_t rel,
                                      size_t len, char *dst) {
#if defined(__linux__)
    size_t done = 0;
    pid_t pid = (pid_t)__atomic_load_n(&fsdp__shm_peer(s, p)->pid, __ATOMIC_RELAXED);
    if (!s->single_copy || rel > length || len > length - rel)
        return fsdp_comm_fail(comm, FSDP_ERR_MISMATCH, "rank %d offered %llu bytes of its memory, but rank %d needs "
                              "bytes %zu..%zu%s", p, (unsigned long long)length, comm->rank, rel, rel + len,
                              s->single_copy ? "" : " (and cannot read peers' memory)");
    while (done < len) {
        struct iovec local, remote;
        ssize_t n;
        local.iov_base = dst + done;
        local.iov_len = len - done;
        remote.iov_base = (void *)(uintptr_t)(address + rel + done);
        remote.iov_len = len - done;
        n = fsdp__vm_read(pid, &local, &remote);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return fsdp_comm_fail(comm, n < 0 && errno == ESRCH ? FSDP_ERR_PEER_LOST : FSDP_ERR_SYSTEM,
                                  "rank %d could not read %zu bytes of rank %d's memory (pid %d): %s", comm->rank,
                                  len - done, p, (int)pid, n < 0 ? strerror(errno) : "nothing read");
        done += (size_t)n;
    }
    return 0;
#else
    (void)s; (void)address; (void)length; (void)rel; (void)len; (void)dst;
    return fsdp_comm_fail(comm, FSDP_ERR_UNSUPPORTED, "rank %d offered its memory, which only Linux can read", p);
#endif
}

/* Where to read peer p's data for the current round: `rel` bytes past the place it published
   in shared memory (`len` bytes are checked to lie in its block), or, if it staged its data,
   `staged` (in its slot). Data offered in a peer's own memory is only ever copied
   (fsdp__shm_peer_copy), never read here: a peer that offers it for reducing breaks the protocol. */
FSDP__PRIVATE int fsdp__shm_peer_data(fsdp_comm *comm, fsdp__shm *s, int p, size_t rel, size_t len, const char *staged,
                                      const char **out) {
    const fsdp__shm_src *src = &fsdp__shm_peer(s, p)->slot_src[s->round % FSDP__SHM_SLOTS];
    const fsdp__region *r;
    /* one load of each: the checks below hold for the values used, whatever the peer writes */
    uint32_t id = __atomic_load_n(&src->region, __ATOMIC_RELAXED);
    uint64_t offset = __atomic_load_n(&src->offset, __ATOMIC_RELAXED);
    FSDP__CHAOS(FSDP__CHAOS_PIECE);
    if (id == FSDP__SHM_IN_SLOT) {
        *out = staged;
        return 0;
    }
    for (r = comm->regions; r; r = r->next)
        if (r->id == id) break;
    if (!r || !r->peer_base || offset > r->peer_bytes[p] || rel > r->peer_bytes[p] - offset ||
        len > r->peer_bytes[p] - offset - rel)
        return fsdp_comm_fail(comm, FSDP_ERR_MISMATCH,
                              "rank %d offered bytes %llu..%llu of its shared allocation #%u, which rank %d %s "
                              "(fsdp_comm_alloc/fsdp_comm_free not called alike on every rank?)",
                              p, (unsigned long long)(offset + rel), (unsigned long long)(offset + rel + len),
                              (unsigned)id, comm->rank, !r || !r->peer_base ? "does not share with it" : "sees as smaller");
    *out = r->peer_base[p] + offset + rel;
    return 0;
}

/* Copies len bytes of peer p's data for the current round, rel bytes past where it put them,
   to dst: out of its slot or of mapped memory (non-temporal stores if stream), or straight from
   its memory by the kernel (a single copy). */
FSDP__PRIVATE int fsdp__shm_peer_copy(fsdp_comm *comm, fsdp__shm *s, int p, size_t rel, size_t len, const char *staged,
                                      char *dst, int stream) {
    const fsdp__shm_src *src = &fsdp__shm_peer(s, p)->slot_src[s->round % FSDP__SHM_SLOTS];
    const char *from;
    FSDP__CHAOS(FSDP__CHAOS_PIECE);
    if (__atomic_load_n(&src->region, __ATOMIC_RELAXED) == FSDP__SHM_IN_PROCESS)
        return fsdp__shm_read_peer(comm, s, p, __atomic_load_n(&src->offset, __ATOMIC_RELAXED),
                                   __atomic_load_n(&src->length, __ATOMIC_RELAXED), rel, len, dst);
    int rc = fsdp__shm_peer_data(comm, s, p, rel, len, staged, &from);
    if (!rc) fsdp__copy_out(dst, from, len, stream);
    return rc;
}

/* After an op in which this rank let peers read its memory: returns when every peer has left
   the op's last round, so the caller may change that memory again. */
FSDP__PRIVATE int fsdp__shm_settle(fsdp_comm *comm, fsdp__shm *s, const fsdp_coll *c) {
    int p, rc;
    for (p = 0; p < comm->world; p++)
        if (p != comm->rank && (rc = fsdp__shm_wait(comm, s, p, 2, s->round, c)) != 0) return rc;
    return 0;
}

/* Starts an op: every wait in it ends by the op's deadline, a total bound. */
static fsdp__shm *fsdp__shm_op(void *impl, const fsdp_coll *c) {
    fsdp__shm *s = (fsdp__shm *)impl;
    s->op_deadline = fsdp__now_ms() + c->timeout_ms;
    return s;
}

#define FSDP__SHM_TRY(expr) do { int rc_ = (expr); if (rc_) return rc_; } while (0)

FSDP__PRIVATE int fsdp__shm_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__shm *s = fsdp__shm_op(impl, c);
    fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    size_t bytes = c->count * fsdp_dtype_size(c->dtype), off = 0, stride = s->stride ? s->stride : bytes;
    int P = comm->world, me = comm->rank, p, stream = bytes * (size_t)P >= FSDP__STREAM_MIN_BYTES;
    char *recv = (char *)c->recv;
    const char *send = (const char *)c->send;
    fsdp__shm_offer offer = fsdp__shm_offer_of(comm, s, send, bytes, bytes * (size_t)P, FSDP__READ_COPY);
    size_t round_bytes = fsdp__shm_stage_piece(s);
    do {
        size_t len = bytes - off < round_bytes ? bytes - off : round_bytes;
        const char *mine = send + off;
        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        if (!fsdp__shm_offered(&offer)) { /* own piece then comes from the slot just written: it is in cache */
            char *slot = fsdp__shm_slot(s, me, s->round);
            memcpy(slot, send + off, len);
            mine = slot;
        }
        if (recv + (size_t)me * stride + off != send + off) /* needs nobody: before the wait for the peers */
            fsdp__copy_out(recv + (size_t)me * stride + off, mine, len, stream);
        fsdp__count_sent(comm, -1, len); /* staged or offered, published by the exchange */
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, &offer, send + off));
        if (off == 0) round_bytes = fsdp__shm_later_rounds(s, P, -1);
        for (p = 0; p < P; p++) {
            char *dst = recv + (size_t)p * stride + off;
            if (p == me) continue;
            FSDP__SHM_TRY(fsdp__shm_peer_copy(comm, s, p, 0, len, fsdp__shm_slot(s, p, s->round), dst, stream));
        }
        fsdp__shm_round_end(s, me);
        off += len;
    } while (off < bytes);
    fsdp__stream_fence();
    return fsdp__shm_offered(&offer) ? fsdp__shm_settle(comm, s, c) : 0;
}

/* A round of a reduce_scatter or all_to_all: unless the data is offered in place, stages for every
   peer p its len bytes at from + p * stride in this rank's slot (at p * piece); counts them sent. */
static void fsdp__shm_stage_for_peers(fsdp_comm *comm, fsdp__shm *s, const fsdp__shm_offer *offer, const char *from,
                                      size_t stride, size_t len, size_t piece) {
    char *slot = fsdp__shm_slot(s, comm->rank, s->round);
    int p;
    for (p = 0; p < comm->world && !fsdp__shm_offered(offer); p++)
        if (p != comm->rank) memcpy(slot + (size_t)p * piece, from + (size_t)p * stride, len);
    fsdp__count_sent(comm, -1, (size_t)(comm->world - 1) * len);
}

/* Bytes of one rank's piece per round when a slot is divided among all ranks. */
static size_t fsdp__shm_piece(const fsdp__shm *s, int world) { return s->slot_bytes / (size_t)world / 64 * 64; }

FSDP__PRIVATE int fsdp__shm_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__shm *s = fsdp__shm_op(impl, c);
    fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    size_t esize = fsdp_dtype_size(c->dtype), bytes = c->count * esize, piece = fsdp__shm_piece(s, comm->world), off = 0;
    size_t stride = s->stride ? s->stride : bytes;
    int P = comm->world, me = comm->rank, p;
    const char *send = (const char *)c->send;
    const void *srcs[FSDP__MAX_WORLD];
    fsdp__shm_offer offer = fsdp__shm_offer_of(comm, s, send, (size_t)(P - 1) * stride + bytes, bytes * (size_t)P,
                                               FSDP__READ_REDUCE);
    do {
        size_t len = bytes - off < piece ? bytes - off : piece;
        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        fsdp__shm_stage_for_peers(comm, s, &offer, send + off, stride, len, piece);
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, &offer, send + off));
        for (p = 0; p < P; p++) {
            const char *src = send + (size_t)me * stride + off;
            if (p != me) /* a peer's send + me * stride + off, or the piece it staged for me */
                FSDP__SHM_TRY(fsdp__shm_peer_data(comm, s, p, (size_t)me * stride, len,
                                                  fsdp__shm_slot(s, p, s->round) + (size_t)me * piece,
                                                  &src));
            srcs[p] = src;
        }
        fsdp_reduce_ranks((char *)c->recv + off, srcs, P, len / esize, c->dtype, c->op, P);
        fsdp__shm_round_end(s, me);
        off += len;
    } while (off < bytes);
    return fsdp__shm_offered(&offer) ? fsdp__shm_settle(comm, s, c) : 0;
}

FSDP__PRIVATE int fsdp__shm_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__shm *s = fsdp__shm_op(impl, c);
    fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    size_t esize = fsdp_dtype_size(c->dtype), count = c->count;
    size_t piece_elems = fsdp__shm_piece(s, comm->world) / esize, window = piece_elems * (size_t)comm->world, start = 0;
    int P = comm->world, me = comm->rank, p, stream = count * esize >= FSDP__STREAM_MIN_BYTES;
    const char *send = (const char *)c->send, *src;
    char *recv = (char *)c->recv;
    const void *srcs[FSDP__MAX_WORLD];
    /* peers may read my send in the reducing rounds and my recv in the gathering rounds */
    fsdp__shm_offer offer_send = fsdp__shm_offer_of(comm, s, send, count * esize, count * esize, FSDP__READ_REDUCE);
    fsdp__shm_offer offer_recv = fsdp__shm_offer_of(comm, s, recv, count * esize, count * esize, FSDP__READ_COPY_REDUCED);
    if (count * esize <= (P == 2 ? FSDP__SHM_SMALL_ALL_REDUCE_2 : FSDP__SHM_SMALL_ALL_REDUCE) &&
        count * esize <= s->slot_bytes) {
        /* one round: everyone reduces the whole (small) buffer, in the same order */
        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        memcpy(fsdp__shm_slot(s, me, s->round), send, count * esize);
        fsdp__count_sent(comm, -1, count * esize);
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, NULL, NULL));
        for (p = 0; p < P; p++) srcs[p] = p == me ? (const void *)send : fsdp__shm_slot(s, p, s->round);
        fsdp_reduce_ranks(recv, srcs, P, count, c->dtype, c->op, P);
        fsdp__shm_round_end(s, me);
        return 0;
    }
    do { /* two rounds per window: reduce my piece of it, then gather everyone's pieces */
        size_t n = count - start < window ? count - start : window;
        size_t mine_at = start + (size_t)me * piece_elems, mine_n;
        char *slot;
        mine_n = mine_at >= start + n ? 0 : (start + n - mine_at < piece_elems ? start + n - mine_at : piece_elems);
        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        slot = fsdp__shm_slot(s, me, s->round);
        for (p = 0; p < P && !fsdp__shm_offered(&offer_send); p++) {
            size_t at = start + (size_t)p * piece_elems, m;
            if (p == me || at >= start + n) continue;
            m = start + n - at < piece_elems ? start + n - at : piece_elems;
            memcpy(slot + (size_t)p * piece_elems * esize, send + at * esize, m * esize);
        }
        fsdp__count_sent(comm, -1, (n - mine_n) * esize); /* the peers' pieces of the window */
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, &offer_send, send + start * esize));
        for (p = 0; p < P && mine_n; p++) {
            src = send + mine_at * esize;
            if (p != me)
                FSDP__SHM_TRY(fsdp__shm_peer_data(comm, s, p, (size_t)me * piece_elems * esize, mine_n * esize,
                                                  fsdp__shm_slot(s, p, s->round) + (size_t)me * piece_elems * esize,
                                                  &src));
            srcs[p] = src;
        }
        if (mine_n) /* peers read this recv piece in the next round where it is offered */
            fsdp__reduce_ranks(recv + mine_at * esize, srcs, P, mine_n, c->dtype, c->op, P, !fsdp__shm_offered(&offer_recv));
        fsdp__shm_round_end(s, me);

        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        slot = fsdp__shm_slot(s, me, s->round);
        if (!fsdp__shm_offered(&offer_recv))
            memcpy(slot + (size_t)me * piece_elems * esize, recv + mine_at * esize, mine_n * esize);
        fsdp__count_sent(comm, -1, mine_n * esize);
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, &offer_recv, recv + start * esize));
        for (p = 0; p < P; p++) {
            size_t at = start + (size_t)p * piece_elems, m;
            if (p == me || at >= start + n) continue;
            m = start + n - at < piece_elems ? start + n - at : piece_elems;
            FSDP__SHM_TRY(fsdp__shm_peer_copy(comm, s, p, (size_t)p * piece_elems * esize, m * esize,
                                              fsdp__shm_slot(s, p, s->round) + (size_t)p * piece_elems * esize,
                                              recv + at * esize, stream));
        }
        fsdp__shm_round_end(s, me);
        start += n;
    } while (start < count);
    fsdp__stream_fence();
    return fsdp__shm_offered(&offer_send) || fsdp__shm_offered(&offer_recv) ? fsdp__shm_settle(comm, s, c) : 0;
}

FSDP__PRIVATE int fsdp__shm_broadcast(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__shm *s = fsdp__shm_op(impl, c);
    fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    size_t bytes = c->count * fsdp_dtype_size(c->dtype), off = 0, round_bytes = fsdp__shm_stage_piece(s);
    char *buf = (char *)c->recv;
    int root = comm->rank == c->root;
    fsdp__shm_offer offer;
    if (root) offer = fsdp__shm_offer_of(comm, s, buf, bytes, bytes, FSDP__READ_COPY_ROOT);
    else memset(&offer, 0, sizeof offer);
    do {
        size_t len = bytes - off < round_bytes ? bytes - off : round_bytes;
        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        if (root && !fsdp__shm_offered(&offer)) memcpy(fsdp__shm_slot(s, comm->rank, s->round), buf + off, len);
        if (root) fsdp__count_sent(comm, -1, len);
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, &offer, buf + off));
        if (off == 0) round_bytes = fsdp__shm_later_rounds(s, comm->world, c->root);
        if (!root)
            FSDP__SHM_TRY(fsdp__shm_peer_copy(comm, s, c->root, 0, len, fsdp__shm_slot(s, c->root, s->round), buf + off,
                                              bytes >= FSDP__STREAM_MIN_BYTES));
        fsdp__shm_round_end(s, comm->rank);
        off += len;
    } while (off < bytes);
    fsdp__stream_fence();
    return fsdp__shm_offered(&offer) ? fsdp__shm_settle(comm, s, c) : 0;
}

FSDP__PRIVATE int fsdp__shm_barrier(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__shm *s = fsdp__shm_op(impl, c);
    fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
    FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, NULL, NULL));
    fsdp__shm_round_end(s, comm->rank);
    return 0;
}

/* In each round a rank stages, in its slot divided among the ranks as reduce_scatter's, the
   next piece of its block for every peer (none where it offers its send buffer: peers then read
   their block there), and copies the piece each peer has for it to its place: the two copies
   of all_gather's staged path, one where the buffer is offered. Where no rank stages, the
   rounds after the first take the rest at once (no slot bounds them). */
FSDP__PRIVATE int fsdp__shm_all_to_all(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__shm *s = fsdp__shm_op(impl, c);
    fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    size_t bytes = c->count * fsdp_dtype_size(c->dtype), piece = fsdp__shm_piece(s, comm->world), off = 0;
    int P = comm->world, me = comm->rank, p, stream = bytes * (size_t)P >= FSDP__STREAM_MIN_BYTES;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv;
    fsdp__shm_offer offer = fsdp__shm_offer_of(comm, s, send, bytes * (size_t)P, bytes * (size_t)P,
                                               FSDP__READ_COPY_PIECES);
    if (bytes) fsdp__copy_out(recv + (size_t)me * bytes, send + (size_t)me * bytes, bytes, stream); /* needs nobody */
    do {
        size_t len = bytes - off < piece ? bytes - off : piece;
        FSDP__SHM_TRY(fsdp__shm_round_begin(comm, s, c));
        fsdp__shm_stage_for_peers(comm, s, &offer, send + off, bytes, len, piece);
        FSDP__SHM_TRY(fsdp__shm_round_exchange(comm, s, c, &fp, &offer, send + off));
        if (off == 0 && !fsdp__shm_someone_staged(s, P, -1)) piece = bytes; /* no slot limits the rest */
        for (p = 0; p < P; p++) /* a peer's send + me * bytes + off, or the piece it staged for me */
            if (p != me)
                FSDP__SHM_TRY(fsdp__shm_peer_copy(comm, s, p, (size_t)me * bytes, len,
                                                  fsdp__shm_slot(s, p, s->round) + (size_t)me * piece,
                                                  recv + (size_t)p * bytes + off, stream));
        fsdp__shm_round_end(s, me);
        off += len;
    } while (off < bytes);
    fsdp__stream_fence();
    return fsdp__shm_offered(&offer) ? fsdp__shm_settle(comm, s, c) : 0;
}

/* Poisons the segment for everyone: the first failer's message and rank, then a wake-up of
   every futex word so sleeping ranks see it at once. */
FSDP__PRIVATE void fsdp__shm_signal_abort(fsdp__shm_header *h, fsdp__shm_rank *ranks, int world, int rank, int code,
                                          const char *message) {
    int p;
    if (__atomic_exchange_n(&h->abort_claim, 1u, __ATOMIC_ACQ_REL) == 0) { /* first failer writes */
        h->abort_rank = rank;
        h->abort_code = code;
        fsdp__copy_string(h->abort_message, sizeof h->abort_message, message);
        __atomic_store_n(&h->abort_flag, 1u, __ATOMIC_SEQ_CST);
    }
    for (p = 0; p < world; p++) { /* our world size: the segment's copy is a peer's to scribble on */
        fsdp__futex(&ranks[p].arrive, FUTEX_WAKE, 0x7fffffff, NULL);
        fsdp__futex(&ranks[p].depart, FUTEX_WAKE, 0x7fffffff, NULL);
    }
}

FSDP__PRIVATE void fsdp__shm_abort(fsdp_comm *comm, void *impl) {
    fsdp__shm *s = (fsdp__shm *)impl;
    if (!s || !s->header) return;
    fsdp__shm_signal_abort(s->header, s->ranks, comm->world, comm->rank, fsdp__load(&comm->status), comm->error);
}

FSDP__PRIVATE void fsdp__shm_destroy(fsdp_comm *comm, void *impl) {
    fsdp__shm *s = (fsdp__shm *)impl;
    if (!s) return;
    if (s->ranks) {
        fsdp__shm_rank *me = fsdp__shm_peer(s, comm->rank);
        fsdp__store(&me->left, 1u);
        fsdp__futex(&me->arrive, FUTEX_WAKE, 0x7fffffff, NULL);
        fsdp__futex(&me->depart, FUTEX_WAKE, 0x7fffffff, NULL);
    }
    if (s->header && s->owns_mapping) munmap((void *)s->header, s->map_bytes);
    FSDP_FREE(s);
}

/* Why a shared-memory file opened by name is not one this user's job made (NULL if it may be):
   it must be a regular file of this user with mode 0600, as every rank creates them. */
FSDP__PRIVATE const char *fsdp__shm_foreign(int fd, char *why, size_t size) {
    struct stat st;
    if (fstat(fd, &st) != 0) return fsdp__fmt(why, size, "fstat failed: %s", strerror(errno)), why;
    if (!S_ISREG(st.st_mode)) return fsdp__fmt(why, size, "not a regular file"), why;
    if (st.st_uid != geteuid() || (st.st_mode & 07777) != 0600)
        return fsdp__fmt(why, size, "owned by uid %u with mode %04o, not by this user (uid %u) with mode 0600",
                         (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)geteuid()), why;
    return NULL;
}

/* The name of a rank's fsdp_comm_alloc file: its creator's pid and 64 random bits. */
static void fsdp__shm_share_name(char *out, size_t size, int32_t pid, uint32_t tag0, uint32_t tag1) {
    fsdp__fmt(out, size, "/fsdp-m%ld-%08x%08x", (long)pid, (unsigned)tag0, (unsigned)tag1);
}

/* Removes this user's fsdp_comm_alloc files whose creator is gone: a rank killed between making
   its file and the peers' mapping it (a job cut off by a timeout, say) leaves it in /dev/shm,
   where nothing else would ever remove it. Only regular files of this user named
   "fsdp-m<pid>-..." whose pid no longer exists (ESRCH: a live process of another user keeps
   its file); /dev/shm is sticky, so nobody else can swap such a file meanwhile. */
FSDP__PRIVATE void fsdp__shm_reap(void) {
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[320], *end;
        struct stat st;
        long pid;
        if (strncmp(e->d_name, "fsdp-m", 6) != 0 || strlen(e->d_name) > 64) continue;
        pid = strtol(e->d_name + 6, &end, 10);
        if (end == e->d_name + 6 || *end != '-' || pid <= 0 || pid > INT32_MAX || kill((pid_t)pid, 0) == 0 ||
            errno != ESRCH)
            continue;
        fsdp__fmt(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) shm_unlink(path + 8);
    }
    if (d) closedir(d);
}

/* Makes r (r->bytes, zeroed) memory that every rank of the comm maps. Collective. Each rank
   puts its block in a /dev/shm file of its own ("/fsdp-m<pid>-<16 random hex digits>", O_EXCL,
   0600; a peer maps only a file of this user with that mode; files of dead creators are
   reaped first: fsdp__shm_reap), the ranks
   all-gather who succeeded and where, map each other's files read-only, all-gather whether
   that worked, and unlink their files: from then on nothing is left behind. If any rank could
   not take part, none shares: r->base is this rank's block (or NULL if it has none) and the
   caller falls back to ordinary memory. Returns an error only when the comm failed. */
FSDP__PRIVATE int fsdp__shm_share(fsdp_comm *comm, fsdp__region *r) {
    int32_t mine[6], *all = NULL;
    char name[64];
    size_t map = fsdp__align(r->bytes, 4096);
    int P = comm->world, me = comm->rank, p, fd = -1, rc, shared;
    uint32_t tag[2] = {0, 0};
    void *base = MAP_FAILED;
    fsdp__shm_reap();
    if (fsdp__random_bytes(tag, sizeof tag) == 0) {
        fsdp__shm_share_name(name, sizeof name, (int32_t)getpid(), tag[0], tag[1]);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) fchmod(fd, 0600);
    } else {
        fsdp__fmt(name, sizeof name, "(no random name)");
        errno = EAGAIN;
    }
    if (fd < 0) {
        fsdp__log(&comm->logger, FSDP_LOG_WARN, "rank %d: cannot create /dev/shm%s (%s): fsdp_comm_alloc memory stays private",
                  me, name, strerror(errno));
    } else {
        if (ftruncate(fd, (off_t)map) != 0 || (errno = posix_fallocate(fd, 0, (off_t)map)) != 0)
            fsdp__log(&comm->logger, FSDP_LOG_WARN,
                      "rank %d: cannot reserve %.1f MiB in /dev/shm (%s): fsdp_comm_alloc memory stays private", me,
                      (double)map / 1048576.0, strerror(errno));
        else if ((base = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
            fsdp__log(&comm->logger, FSDP_LOG_WARN, "rank %d: cannot map /dev/shm%s (%s)", me, name, strerror(errno));
        close(fd);
        if (base == MAP_FAILED) shm_unlink(name);
    }
    mine[0] = base != MAP_FAILED;
    mine[1] = (int32_t)tag[0];
    mine[2] = (int32_t)tag[1];
    mine[3] = (int32_t)(uint32_t)((uint64_t)r->bytes & 0xffffffffu);
    mine[4] = (int32_t)(uint32_t)((uint64_t)r->bytes >> 32);
    mine[5] = (int32_t)getpid();
    all = (int32_t *)FSDP_MALLOC(sizeof *all * 6 * (size_t)P);
    r->peer_base = (char **)fsdp__calloc(sizeof(char *) * (size_t)P);
    r->peer_bytes = (size_t *)fsdp__calloc(sizeof(size_t) * (size_t)P);
    shared = all && r->peer_base && r->peer_bytes; /* without them, a count of 0 fails the gather */
    if (!shared) mine[0] = 0;
    /* integers travel as f32 bit patterns: an all-gather only copies */
    rc = fsdp__collective_tagged(comm, FSDP_COLL_ALL_GATHER, mine, all ? all : mine, all ? 6 : 0, FSDP_F32,
                                 FSDP_SUM, 0xa11c0u);
    for (p = 0; rc == 0 && shared && p < P; p++) shared &= all[6 * p] == 1;
    for (p = 0; rc == 0 && shared && p < P; p++) {
        char peer_name[64], why[160];
        const char *foreign = NULL;
        struct stat st;
        r->peer_bytes[p] = (size_t)((uint64_t)(uint32_t)all[6 * p + 3] | (uint64_t)(uint32_t)all[6 * p + 4] << 32);
        if (p == me) continue;
        fsdp__shm_share_name(peer_name, sizeof peer_name, all[6 * p + 5], (uint32_t)all[6 * p + 1], (uint32_t)all[6 * p + 2]);
        fd = shm_open(peer_name, O_RDONLY | O_NOFOLLOW, 0);
        if (fd >= 0 && !(foreign = fsdp__shm_foreign(fd, why, sizeof why)) && fstat(fd, &st) == 0 &&
            (size_t)st.st_size >= r->peer_bytes[p] && r->peer_bytes[p] <= SIZE_MAX / 2) {
            void *at = mmap(NULL, fsdp__align(r->peer_bytes[p], 4096), PROT_READ, MAP_SHARED, fd, 0);
            if (at != MAP_FAILED) r->peer_base[p] = (char *)at;
        }
        if (!r->peer_base[p]) {
            fsdp__log(&comm->logger, FSDP_LOG_WARN, "rank %d: cannot map rank %d's /dev/shm%s (%s)", me, p, peer_name,
                      fd < 0 ? strerror(errno) : foreign ? foreign : "too small or unmappable");
            shared = 0;
        }
        if (fd >= 0) close(fd);
    }
    if (rc == 0) { /* did everyone map everyone? */
        mine[0] = shared;
        rc = fsdp__collective_tagged(comm, FSDP_COLL_ALL_GATHER, mine, all ? all : mine, all ? 6 : 0, FSDP_F32,
                                     FSDP_SUM, 0xa11c1u);
        for (p = 0; rc == 0 && shared && p < P; p++) shared &= all[6 * p] == 1;
    }
    if (base != MAP_FAILED) shm_unlink(name);
    if (rc != 0 || !shared) {
        for (p = 0; r->peer_base && p < P; p++)
            if (p != me && r->peer_base[p]) munmap(r->peer_base[p], fsdp__align(r->peer_bytes[p], 4096));
        FSDP_FREE(r->peer_base);
        FSDP_FREE(r->peer_bytes);
        r->peer_base = NULL;
        r->peer_bytes = NULL;
        if (rc == 0 && me == 0)
            fsdp__log(&comm->logger, FSDP_LOG_WARN, "fsdp_comm_alloc: not every rank could share its memory; "
                      "collectives on it are staged");
    }
    if (rc != 0 && base != MAP_FAILED) {
        munmap(base, map);
        base = MAP_FAILED;
    }
    r->base = base != MAP_FAILED ? (char *)base : NULL;
    if (r->peer_base) r->peer_base[me] = r->base;
    FSDP_FREE(all);
    return rc;
}

/* Free space in /dev/shm in MiB (capped to what an int32 holds); 0 if it cannot be told. */
FSDP__PRIVATE int32_t fsdp__shm_free_mib(void) {
    struct statvfs fs;
    double mib;
    if (statvfs("/dev/shm", &fs) != 0) return 0;
    mib = (double)fs.f_bavail * (double)fs.f_frsize / 1048576.0;
    return mib > 2147483647.0 ? INT32_MAX : (int32_t)mib;
}

/* Segment name for a comm: "/fsdp-<job>-<24 hex digits of SHA-256(the user's uid, the whole
   job token)>", the job shortened to 20 characters of [A-Za-z0-9._-] (others replaced). Every
   rank computes the same name; it says nothing about the secret (a name in /dev/shm that
   derived from it would let any local user test guesses offline). Another user can predict it
   and create it first: rank 0 then fails naming that user (a denial of service, nothing more:
   the segment is mode 0600 and the joining ranks refuse one they did not make). */
FSDP__PRIVATE void fsdp__shm_name(char *out, size_t size, const fsdp_comm *comm) {
    unsigned char digest[32];
    char hex[65], facts[80];
    size_t i, n;
    fsdp__sha256 h;
    fsdp__fmt(facts, sizeof facts, "fsdp.h segment|uid %lu|job ", (unsigned long)geteuid());
    fsdp__sha256_init(&h);
    fsdp__sha256_update(&h, facts, strlen(facts));
    fsdp__sha256_update(&h, comm->job, strlen(comm->job));
    fsdp__sha256_final(&h, digest);
    fsdp__hex(hex, digest, 12);
    fsdp__fmt(out, size, "/fsdp-%.20s", comm->job);
    n = strlen(out);
    for (i = 1; i < n; i++) {
        char ch = out[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            out[i] = '_';
    }
    fsdp__fmt(out + n, size - n, "-%s", hex);
}

/* Single copy (ordinary buffers read by peers with process_vm_readv) is used when every rank
   can read every peer's memory: each reads the cookie each peer put in its own memory and
   compares it with the copy the peer published, says whether all matched, and waits for the
   others' verdicts. Asked for (shm_single_copy 1 or 2, FSDP_SHM_SINGLE_COPY=1 or auto) it
   serves every op that copies; by default (nothing asked, 3 here) the ops fsdp__shm_offer_of
   says; never with -1 or FSDP_SHM_SINGLE_COPY=0. It is not weakened to make it work (no
   PR_SET_PTRACER, no change of the dumpable flag): where Yama, seccomp, a container or another
   pid namespace forbids it, ranks stage through the segment, and say so once at info level
   (auto, default), or init fails (1: required). */
FSDP__PRIVATE int fsdp__shm_probe_single_copy(fsdp_comm *comm, fsdp__shm *s, int64_t deadline) {
    fsdp__shm_rank *me = fsdp__shm_peer(s, comm->rank);
    const char *env = getenv("FSDP_SHM_SINGLE_COPY");
    int wanted = s->single_copy_wanted             ? s->single_copy_wanted
                 : env && strcmp(env, "1") == 0    ? 1
                 : env && strcmp(env, "auto") == 0 ? 2
                 : env && strcmp(env, "0") == 0    ? -1
                                                   : 3;
    int p, ok = wanted > 0, all = 1;
    char why[160] = "";
#if defined(__linux__)
    for (p = 0; p < comm->world && ok; p++) {
        const fsdp__shm_rank *r = fsdp__shm_peer(s, p);
        uint64_t seen = 0, expected = __atomic_load_n(&r->probe_cookie, __ATOMIC_RELAXED);
        struct iovec local, remote;
        if (p == comm->rank) continue;
        local.iov_base = &seen;
        local.iov_len = sizeof seen;
        remote.iov_base = (void *)(uintptr_t)__atomic_load_n(&r->probe_addr, __ATOMIC_RELAXED);
        remote.iov_len = sizeof seen;
        ssize_t n = fsdp__vm_read((pid_t)r->pid, &local, &remote);
        if (n != (ssize_t)sizeof seen || seen != expected) {
            fsdp__fmt(why, sizeof why, "rank %d cannot read rank %d's memory (process_vm_readv: %s)", comm->rank, p,
                      n == (ssize_t)sizeof seen ? "other bytes than it published" : strerror(errno));
            ok = 0;
        }
    }
#else
    ok = 0;
    fsdp__fmt(why, sizeof why, "process_vm_readv is Linux's");
#endif
    if (wanted < 0) fsdp__fmt(why, sizeof why, "turned off");
    fsdp__store(&me->single_copy, ok ? 1u : 2u);
    for (p = 0; p < comm->world; p++) {
        uint32_t v;
        while ((v = fsdp__load(&s->ranks[p].single_copy)) == 0) {
            if (fsdp__load(&s->header->abort_flag) || fsdp__now_ms() >= deadline)
                return fsdp__init_fail(&comm->logger, FSDP_ERR_TIMEOUT, "shm %s: rank %d did not finish joining in time",
                                       s->name, p);
            fsdp__sleep_us(200);
        }
        if (v != 1 && all && !*why) fsdp__fmt(why, sizeof why, "rank %d cannot read its peers' memory", p);
        all &= v == 1;
    }
    s->single_copy = all;
    s->single_copy_asked = wanted == 1 || wanted == 2;
    if (!all && wanted == 1)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_UNSUPPORTED, "shm %s: single copy was required but %s", s->name,
                               *why ? why : "a peer cannot read the others' memory");
    if (!all && wanted >= 2 && comm->rank == 0)
        fsdp__log(&comm->logger, FSDP_LOG_INFO, "shm: ordinary buffers are staged (two copies), as %s",
                  *why ? why : "a peer cannot read the others' memory");
    return 0;
}

/* Attaches this rank to a mapped segment and waits until every rank has. */
FSDP__PRIVATE int fsdp__shm_join(fsdp_comm *comm, fsdp__shm *s, int unlink_when_full) {
    fsdp__shm_header *h = s->header;
    fsdp__shm_rank *me;
    int64_t deadline = fsdp__now_ms() + comm->timeout_ms;
    int p;
    size_t ranks_at, data_at;
    fsdp__shm_layout(comm->world, s->slot_bytes, &ranks_at, &data_at);
    s->ranks = (fsdp__shm_rank *)((char *)h + ranks_at);
    s->data = (char *)h + data_at;
    me = fsdp__shm_peer(s, comm->rank);
    if (fsdp__load(&me->attached))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_INVALID_ARG,
                               "shm %s: rank %d joined twice (two processes were given the same rank)",
                               s->name, comm->rank);
    me->pid = (int32_t)getpid();
    if (fsdp__random_bytes(&s->cookie, sizeof s->cookie) != 0) s->cookie = (uint64_t)fsdp__now_ms() ^ (uint64_t)getpid();
    me->probe_addr = (uint64_t)(uintptr_t)&s->cookie;
    me->probe_cookie = s->cookie;
    me->cpu = -1;
    me->single_copy = 0;
    fsdp__store(&me->attached, 1u);
    if (fsdp__fetch_add(&h->attached, 1u) + 1u == (uint32_t)comm->world && unlink_when_full)
        shm_unlink(s->name); /* everyone has it mapped: nothing can be left behind from now on */
    while (fsdp__load(&h->attached) < (uint32_t)comm->world) {
        if (fsdp__load(&h->abort_flag)) {
            char message[FSDP__ERRMSG];
            fsdp__shm_abort_message(h, message, sizeof message);
            return fsdp__init_fail(&comm->logger, FSDP_ERR_ABORTED, "shm %s: rank %d gave up: %s", s->name,
                                   (int)__atomic_load_n(&h->abort_rank, __ATOMIC_RELAXED), message);
        }
        if (fsdp__now_ms() >= deadline) {
            char missing[256] = "";
            size_t used = 0;
            for (p = 0; p < comm->world && used + 12 < sizeof missing; p++)
                if (!fsdp__load(&s->ranks[p].attached))
                    used += (size_t)fsdp__fmt(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", p);
            if (unlink_when_full) shm_unlink(s->name);
            fsdp__init_fail(&comm->logger, FSDP_ERR_TIMEOUT,
                            "shm %s: only %u of %d ranks joined within %d ms; missing rank(s): %s", s->name,
                            (unsigned)fsdp__load(&h->attached), comm->world, comm->timeout_ms, missing);
            fsdp__shm_signal_abort(h, s->ranks, comm->world, comm->rank, FSDP_ERR_TIMEOUT, fsdp__init_error);
            return FSDP_ERR_TIMEOUT;
        }
        fsdp__sleep_us(1000);
    }
    s->spin_seconds = fsdp__spin_seconds(comm->world);
    s->check_pids = 1;
    for (p = 0; p < comm->world; p++) /* pids from another pid namespace would look dead */
        if (kill(s->ranks[p].pid, 0) != 0 && errno == ESRCH) s->check_pids = 0;
    return fsdp__shm_probe_single_copy(comm, s, deadline);
}

#define FSDP__SHM_SLOT_MAX ((size_t)1 << 30) /* larger staging slots gain nothing */

FSDP__PRIVATE size_t fsdp__shm_slot_bytes(size_t requested) { /* requested <= FSDP__SHM_SLOT_MAX */
    size_t slot = requested ? requested : (size_t)1 << 20;
    if (slot < 4096) slot = 4096;
    return fsdp__align(slot, 4096);
}

/* A communicator on a segment that the launcher mapped before fork (nothing in /dev/shm). */
FSDP__PRIVATE int fsdp__shm_init_mapped(fsdp_comm *comm, void *mapping, size_t map_bytes, size_t slot_bytes,
                                        int single_copy) {
    fsdp__shm *s = (fsdp__shm *)fsdp__calloc(sizeof *s);
    int rc;
    if (!s) return FSDP_ERR_OUT_OF_MEMORY;
    s->header = (fsdp__shm_header *)mapping;
    s->map_bytes = map_bytes;
    s->slot_bytes = slot_bytes;
    s->single_copy_wanted = single_copy;
    fsdp__copy_string(s->name, sizeof s->name, "(launcher)");
    if ((rc = fsdp__shm_join(comm, s, 0)) != 0) FSDP_FREE(s);
    else comm->impl = s;
    return rc;
}

/* Rank 0 makes the segment: a new name (O_EXCL), mode 0600, every byte reserved now so that a
   full /dev/shm is an error here and not a crash later. The descriptor, or -1. */
FSDP__PRIVATE int fsdp__shm_make_segment(fsdp_comm *comm, const fsdp__shm *s, int *rc) {
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int err = errno;
        char path[96], why[160] = "";
        struct stat st;
        fsdp__fmt(path, sizeof path, "/dev/shm%s", s->name);
        if (err == EEXIST && lstat(path, &st) == 0 && st.st_uid != geteuid())
            fsdp__fmt(why, sizeof why, " (uid %u created it first: use another FSDP_JOB)", (unsigned)st.st_uid);
        else if (err == EEXIST)
            fsdp__fmt(why, sizeof why, " (another job of this user with this job token is running, or one crashed "
                      "during init: use another FSDP_JOB, or remove the file)");
        *rc = fsdp__init_fail(&comm->logger, err == EEXIST ? FSDP_ERR_STATE : FSDP_ERR_SYSTEM,
                              "shm: cannot create %s: %s%s", path, strerror(err), why);
        return -1;
    }
    fchmod(fd, 0600); /* whatever the umask: peers accept nothing else */
    if (ftruncate(fd, (off_t)s->map_bytes) != 0 || (errno = posix_fallocate(fd, 0, (off_t)s->map_bytes)) != 0) {
        int err = errno;
        *rc = fsdp__init_fail(&comm->logger, err == ENOSPC ? FSDP_ERR_NO_SPACE : FSDP_ERR_SYSTEM,
                              "shm: cannot reserve %.1f MiB in /dev/shm for %d ranks: %s (free space in "
                              "/dev/shm, or lower shm_slot_bytes)",
                              (double)s->map_bytes / 1048576.0, comm->world, strerror(err));
        shm_unlink(s->name);
        close(fd);
        return -1;
    }
    return fd;
}

/* The other ranks wait for rank 0's segment to appear at its full size, and refuse one this
   user's job did not make. The descriptor, or -1. */
FSDP__PRIVATE int fsdp__shm_open_segment(fsdp_comm *comm, const fsdp__shm *s, int64_t deadline, int *rc) {
    for (;;) {
        int fd = shm_open(s->name, O_RDWR | O_NOFOLLOW, 0600);
        if (fd >= 0) {
            struct stat st;
            char why[160];
            if (fsdp__shm_foreign(fd, why, sizeof why)) {
                *rc = fsdp__init_fail(&comm->logger, FSDP_ERR_REJECTED,
                                      "shm: rank %d refuses /dev/shm%s: %s (this job's rank 0 did not make it)",
                                      comm->rank, s->name, why);
                close(fd);
                return -1;
            }
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= s->map_bytes) return fd;
            close(fd);
        } else if (errno != ENOENT) {
            *rc = fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "shm: cannot open /dev/shm%s: %s", s->name,
                                  strerror(errno));
            return -1;
        }
        if (fsdp__now_ms() >= deadline) {
            *rc = fsdp__init_fail(&comm->logger, FSDP_ERR_TIMEOUT,
                                  "shm: rank %d waited %d ms for rank 0 to create /dev/shm%s; is rank 0 "
                                  "running with the same job token and world size %d?",
                                  comm->rank, comm->timeout_ms, s->name, comm->world);
            return -1;
        }
        fsdp__sleep_us(2000);
    }
}

/* The other ranks wait for rank 0 to write the header, and check that it set up what they expect. */
FSDP__PRIVATE int fsdp__shm_check_header(fsdp_comm *comm, const fsdp__shm *s, int64_t deadline) {
    while (fsdp__load(&s->header->magic) != FSDP__SHM_MAGIC) {
        if (fsdp__now_ms() >= deadline)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_TIMEOUT, "shm: %s was never initialised by rank 0", s->name);
        fsdp__sleep_us(1000);
    }
    if (s->header->version != FSDP__SHM_VERSION || s->header->world != (uint32_t)comm->world ||
        s->header->slot_bytes != s->slot_bytes)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_REJECTED,
                               "shm %s: rank 0 set up world size %u, slot %llu bytes, version %u; rank %d "
                               "expected world size %d, slot %zu bytes, version %u",
                               s->name, s->header->world, (unsigned long long)s->header->slot_bytes,
                               s->header->version, comm->rank, comm->world, s->slot_bytes, FSDP__SHM_VERSION);
    return 0;
}

/* A communicator on a segment in /dev/shm named after the job's key: rank 0 makes it, the
   others open it, all map it and join. */
FSDP__PRIVATE int fsdp__shm_init(fsdp_comm *comm, const fsdp_comm_desc *desc) {
    fsdp__shm *s = (fsdp__shm *)fsdp__calloc(sizeof *s);
    int64_t deadline = fsdp__now_ms() + comm->timeout_ms;
    int fd, rc = 0;
    void *base;
    if (!s) return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "shm: out of memory");
    fsdp__shm_name(s->name, sizeof s->name, comm);
    s->slot_bytes = fsdp__shm_slot_bytes(desc->shm_slot_bytes);
    s->single_copy_wanted = desc->shm_single_copy;
    s->map_bytes = fsdp__shm_layout(comm->world, s->slot_bytes, NULL, NULL);
    s->owns_mapping = 1;
    fd = comm->rank == 0 ? fsdp__shm_make_segment(comm, s, &rc) : fsdp__shm_open_segment(comm, s, deadline, &rc);
    if (fd < 0) {
        FSDP_FREE(s);
        return rc;
    }
    base = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        rc = fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "shm: cannot map %s: %s", s->name, strerror(errno));
        if (comm->rank == 0) shm_unlink(s->name);
        FSDP_FREE(s);
        return rc;
    }
    s->header = (fsdp__shm_header *)base;
    if (comm->rank == 0) fsdp__shm_header_init(base, comm->world, s->slot_bytes, s->map_bytes, s->name);
    else rc = fsdp__shm_check_header(comm, s, deadline);
    if (!rc) rc = fsdp__shm_join(comm, s, 1);
    if (rc) {
        munmap(base, s->map_bytes);
        FSDP_FREE(s);
        return rc;
    }
    comm->impl = s;
    return 0;
}

/* 1 if /dev/shm, with free_mib MiB free, has room for twice the segment of world ranks with the
   slots that slot_request asks for (what a host's or a split's shm comm needs). */
FSDP__PRIVATE int fsdp__shm_fits(int world, size_t slot_request, int32_t free_mib) {
    return (double)free_mib * 1048576.0 >= 2.0 * (double)fsdp__shm_layout(world, fsdp__shm_slot_bytes(slot_request), NULL, NULL);
}

/* --- the shm row ---------------------------------------------------------------------------- */
/* Reductions divide a slot among the ranks in pieces of whole cache lines: a slot too small to
   give every rank one line could never make progress. Returns 0, or -1 with why in err. */
FSDP__PRIVATE int fsdp__shm_slot_fits(size_t slot, int world, char *err, size_t err_size) {
    size_t least = fsdp__align((size_t)64 * (size_t)world, 4096);
    if (slot / (size_t)world / 64 * 64 >= 64) return 0;
    fsdp__fmt(err, err_size, "shm: a staging slot of %zu bytes cannot be divided among %d ranks (a reduction gives "
              "each 64 bytes of it at least): set shm_slot_bytes to %zu or more, or leave it 0 (1 MiB)", slot, world, least);
    return -1;
}

FSDP__PRIVATE int fsdp__shm_create(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__inherit *inherit) {
    char err[FSDP__ERRMSG];
    int rc = 0;
    if (comm->world > 1) {
        if (fsdp__shm_slot_fits(fsdp__shm_slot_bytes(desc->shm_slot_bytes), comm->world, err, sizeof err))
            return fsdp__init_fail(&comm->logger, FSDP_ERR_INVALID_ARG, "%s", err);
        rc = inherit && inherit->mapping
                 ? fsdp__shm_init_mapped(comm, inherit->mapping, inherit->map_bytes,
                                         fsdp__shm_slot_bytes(desc->shm_slot_bytes), desc->shm_single_copy)
                 : fsdp__shm_init(comm, desc);
    }
    return rc ? rc : fsdp__comm_learn_topology(comm, 1); /* one segment: one host */
}

/* A split of a shm comm is a shm comm with the parent's slots. */
FSDP__PRIVATE int fsdp__shm_split(fsdp_comm *parent, fsdp__split *sp, fsdp_comm **out) {
    if (parent->impl) sp->desc.shm_slot_bytes = ((fsdp__shm *)parent->impl)->slot_bytes;
    return fsdp__comm_create(out, &sp->desc, parent, NULL);
}

static double *fsdp__shm_spin(const fsdp_comm *comm) { return &((fsdp__shm *)comm->impl)->spin_seconds; }

/* The environment's default when every rank is on this host (LOCAL_WORLD_SIZE == WORLD_SIZE). */
static int fsdp__shm_env_claims(const fsdp_comm_desc *desc) {
    return desc->world_size > 0 && desc->local_world_size == desc->world_size ? 2 : 0;
}

static int fsdp__shm_env_read(fsdp_comm_desc *desc, char *scratch, size_t scratch_size, char *err, size_t err_size) {
    (void)scratch; (void)scratch_size;
    if (desc->job && *desc->job) return 0;
    fsdp__fmt(err, err_size, "environment variable FSDP_JOB is not set (the shm backend names its segment after it; "
              "MASTER_PORT, TORCHELASTIC_RUN_ID or SLURM_JOB_ID would also do)");
    return FSDP_ERR_ENV;
}

/* fsdp_launch maps the segment before fork (anonymous: nothing in /dev/shm); the children
   inherit it. */
FSDP__PRIVATE int fsdp__shm_launch_prepare(fsdp__inherit *inherit, const fsdp_launch_desc *desc, char *err, size_t err_size) {
    size_t slot = fsdp__shm_slot_bytes(desc->shm_slot_bytes);
    void *mapping;
    if (desc->nprocs <= 1) return 0;
    if (fsdp__shm_slot_fits(slot, desc->nprocs, err, err_size)) return FSDP_ERR_INVALID_ARG;
    inherit->map_bytes = fsdp__shm_layout(desc->nprocs, slot, NULL, NULL);
    mapping = mmap(NULL, inherit->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (mapping == MAP_FAILED) {
        fsdp__fmt(err, err_size, "fsdp_launch: cannot map %.1f MiB of shared memory: %s",
                  (double)inherit->map_bytes / 1048576.0, strerror(errno));
        return errno == ENOMEM ? FSDP_ERR_NO_SPACE : FSDP_ERR_SYSTEM;
    }
    fsdp__shm_header_init(mapping, desc->nprocs, slot, inherit->map_bytes, "(launcher)");
    inherit->mapping = mapping;
    return 0;
}

/* A launched rank failed: the others learn it at once through the segment. */
static void fsdp__shm_launch_abort(fsdp__inherit *inherit, int nprocs, const char *why) {
    char *base = (char *)inherit->mapping;
    if (!base) return;
    fsdp__shm_signal_abort((fsdp__shm_header *)base, (fsdp__shm_rank *)(base + fsdp__align(sizeof(fsdp__shm_header), 4096)),
                           nprocs, -1, FSDP_ERR_PEER_LOST, why);
}

static const fsdp__transport fsdp__shm_transport = {
    {"shm", fsdp__shm_all_gather, fsdp__shm_reduce_scatter, fsdp__shm_all_reduce, fsdp__shm_broadcast,
     fsdp__shm_barrier, fsdp__shm_abort, fsdp__shm_destroy, 0, NULL, fsdp__shm_all_to_all},
    FSDP_BACKEND_SHM, "shm", FSDP__CAP_ENV | FSDP__CAP_DEADLINE, FSDP__MAX_WORLD,
    fsdp__shm_create, fsdp__shm_split, fsdp__shm_spin, NULL, fsdp__shm_share,
    fsdp__shm_env_claims, fsdp__shm_env_read, fsdp__shm_launch_prepare, fsdp__shm_launch_abort};

/* ============================================================================================
   >>socket
   TCP, IPv4. Rank 0 listens at MASTER_ADDR:MASTER_PORT. Every other rank connects to it
   (non-blocking connects with backoff, bounded by the deadline) and opens its own data
   listener. Every connection, to rank 0 and between ranks, starts with a challenge-response
   handshake that proves both ends know the job's key (derived from the shared secret and the
   job token; see fsdp__comm_key):
       acceptor  -> challenge {magic, version, nonce_a}
       connector -> hello {magic, version, rank, world, data address, the address it dialled,
                           flags, host digest (both to rank 0 only), session, nonce_c,
                           HMAC(key, "hello" | nonce_a | the fields before the mac)}
       acceptor  -> reply {status, reason, session, HMAC(key, "reply" | nonce_c | nonce_a | ...)}
   The secret never crosses the wire, fresh nonces from both sides make every exchange
   unrepeatable, and a connection that fails the check learns nothing but "authentication
   failed" (no token, no secret, no detail). The acceptor admits a hello only if the address
   it dialled is where the connection arrived (or the listener's own), so a stranger that got
   a rank to dial it (an address planted in torchrun's store, say) cannot relay the exchange to
   the real rank: no NAT or proxy may stand between ranks. The address rank 0 publishes in
   torchrun's store carries a mac under the key too. Without a secret the key is anyone's:
   then a connection from this host is admitted only from a process of this user (the kernel's
   socket table says whose it is, fsdp__sock_peer_uid; one it cannot name an owner for, reset
   or closing, is refused), both ways, and rank 0 warns when it listens where other hosts can
   reach it. Acceptors run every pending handshake at once, each
   with a short budget, so silent or garbage-sending strangers cannot hold the door. Rank 0
   welcomes everyone once all ranks are in, with a random session id (later hellos between
   ranks must carry it) and a table (its own mac follows it): every rank's data address, its
   host's number (ranks whose host digests, fsdp__host_facts, are equal share a host; hosts
   numbered in order of their lowest rank, in time linear in P) and whether some rank asked for
   a flat world. So every rank knows the hosts before any connection between ranks is made.
   Where the world is hierarchical (>>hier: several hosts, several ranks on some, numbered
   host by host), each host makes its shared-memory comm and the ranks agree through rank 0
   that every host could (else the world is flat after all); then rank (g, l) links only to the
   ranks of other hosts its algorithms exchange data with, (h, l mod size[h]) and those that
   send to it (fsdp__hier_links): H - 1 connections a rank with as many ranks on every host.
   In a flat world every rank links to every other. Rank i connects to the ranks of 1..i-1 it
   links to and accepts those of i+1..P-1 (and refuses others), so a linked pair has one
   connection; rendezvous connections to rank 0 that are not links close once the mesh
   stands. Rank 0 holds P - 1 connections during the rendezvous, a rank its links and a
   listener after: the soft RLIMIT_NOFILE raised to that where the hard limit allows
   (fsdp__sock_fd_room). A staging ring for reductions exists per link only: 1 MiB, less
   where links are many (64 MiB in all, at least a 256 KiB segment each).
   An op is one or two phases; in a phase every rank sends every peer one header (magic,
   phase, fingerprint, payload length) and its payload, and receives the same from each, all
   at once through non-blocking sockets and poll, within the op's deadline. Every header is
   checked against the local fingerprint and the expected length before a byte of payload is
   accepted. Reductions go through per-peer staging rings in segments and are folded in rank
   order, so results equal the shm backend's bit for bit. Payloads are neither encrypted nor
   authenticated after the handshake (as with NCCL and Gloo): run jobs on a network you trust
   not to tamper with established TCP streams.
   ============================================================================================ */
#define FSDP__SOCK_MAGIC 0x4b434f53u       /* "SOCK" */
#define FSDP__SOCK_ABORT_MAGIC 0x54524241u /* "ABRT" */
#define FSDP__SOCK_VERSION 4u
#define FSDP__SOCK_SEGMENT ((size_t)256 * 1024)
#define FSDP__SOCK_RING_SEGMENTS 4
#define FSDP__SOCK_RING_BYTES ((size_t)FSDP__SOCK_RING_SEGMENTS * FSDP__SOCK_SEGMENT) /* per link, for reductions */
#ifndef FSDP__SOCK_RINGS_MAX /* (a check lowers it) */
#define FSDP__SOCK_RINGS_MAX ((size_t)64 << 20) /* all links' rings, beyond one segment a link */
#endif
#define FSDP__SOCK_GREETING_MS 5000  /* an acceptor greets at once; silence this long means "not fsdp.h" */
#define FSDP__SOCK_HANDSHAKE_MS 5000 /* a connection's budget to present a complete hello */
#define FSDP__SOCK_SYN_MS 250        /* a fresh connect attempt this often (fsdp__sock_connect) */
#define FSDP__SOCK_TRIES 8           /* ... the latest this many kept waiting */
#ifndef FSDP__SOCK_PENDING_MAX /* (a test lowers it) */
#define FSDP__SOCK_PENDING_MAX 64    /* handshakes an acceptor runs at once */
#endif
#define FSDP__SOCK_FLAT 1u             /* hello.flags, the table's flags: FSDP_HIERARCHICAL=0 */
#define FSDP__SOCK_MAX_WORLD 65536     /* ranks of a socket world (the shm comm of a host: FSDP__MAX_WORLD) */

typedef struct fsdp__sock_challenge {
    uint32_t magic, version;
    unsigned char nonce[32];
} fsdp__sock_challenge;

typedef struct fsdp__sock_hello {
    uint32_t magic, version, rank, world;
    uint32_t data_ip;          /* network byte order */
    uint32_t data_port;
    uint32_t dial_ip;          /* the address the connector dialled (network byte order) */
    uint32_t dial_port;
    uint32_t flags;            /* to rank 0: FSDP__SOCK_FLAT if this rank asks for a flat world */
    unsigned char host[16];    /* to rank 0: the digest of this rank's host (fsdp__host_facts) */
    unsigned char session[16]; /* zero to rank 0; rank 0's session id between ranks */
    unsigned char nonce[32];
    unsigned char mac[32];
} fsdp__sock_hello;

typedef struct fsdp__sock_reply {
    uint32_t magic, status;    /* 0 welcome, else an fsdp_result */
    char reason[152];
    unsigned char session[16]; /* rank 0's welcome: the session id */
    unsigned char mac[32];     /* zero when the hello did not authenticate */
} fsdp__sock_reply;

typedef struct fsdp__sock_header {
    uint32_t magic;         /* FSDP__SOCK_MAGIC, or FSDP__SOCK_ABORT_MAGIC with a message as payload */
    uint32_t phase;
    fsdp__fingerprint fp;
    uint64_t payload;
    int32_t code;           /* abort frames: the failer's result code */
    uint32_t pad;
} fsdp__sock_header;

typedef struct fsdp__sock_peer {
    int fd;
    char addr[64];
    /* per phase */
    fsdp__sock_header out_header, in_header;
    size_t out_header_done, in_header_done;
    const char *out_data;
    size_t out_len, out_done;
    char *in_direct;        /* payload lands here directly (NULL: into the ring) */
    char *ring;             /* its ring_bytes of the comm's rings: staging for reductions (links only) */
    size_t in_len, in_done;
    int active;             /* takes part in the phase (fsdp__sock_plan) */
    int at_boundary;        /* our outgoing stream is between messages */
} fsdp__sock_peer;

typedef struct fsdp__sock {
    fsdp__sock_peer *peers;
    char *ring;             /* a ring of ring_bytes for each connected peer, for reductions */
    size_t ring_bytes;      /* RING_BYTES, or less (whole segments) where links are many */
    const void **srcs;      /* world entries: a fold's sources */
    int *act, nact;         /* the peers planned active (a phase touches only these: not O(world)) */
    struct pollfd *pfds;
    int *pfd_peer;
    double spin_seconds;    /* busy-poll before sleeping in poll; fsdp__spin_seconds */
    int64_t op_deadline;    /* the running op fails at this time (fsdp__now_ms) */
    fsdp__shm_note *wait_note; /* hierarchical: this rank's note in its host's segment (or NULL) */
    int noted;              /* 1 + the peer wait_note names now; 0: none */
    unsigned char session[16];
    struct sockaddr_in local; /* this rank's address as its peers reach it (for fsdp_comm_split) */
} fsdp__sock;

/* The socket comm whose op this thread is running: only that thread may write abort frames
   (another thread's write could interleave with the op's). */
static __thread fsdp__sock *fsdp__sock_running;

FSDP__PRIVATE void fsdp__sock_tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

FSDP__PRIVATE int fsdp__sock_nonblock(int fd, int on) {
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0) return -1;
    return fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

/* Reads or writes exactly len bytes before the deadline (a total bound, however slowly the
   bytes come). 0 ok, -1 closed/error (errno), -2 timeout. */
FSDP__PRIVATE int fsdp__sock_io_full(int fd, void *buf, size_t len, int64_t deadline, int writing) {
    size_t done = 0;
    while (done < len) {
        struct pollfd pfd;
        int64_t left = deadline - fsdp__now_ms();
        ssize_t n;
        if (left <= 0) return -2;
        pfd.fd = fd;
        pfd.events = writing ? POLLOUT : POLLIN;
        pfd.revents = 0;
        n = poll(&pfd, 1, left > 1000 ? 1000 : (int)left);
        if (n < 0 && errno != EINTR) return -1;
        if (n <= 0) continue;
        n = writing ? send(fd, (const char *)buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(fd, (char *)buf + done, len - done, MSG_DONTWAIT);
        if (n == 0 && !writing) { errno = ECONNRESET; return -1; }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

FSDP__PRIVATE void fsdp__sock_addr_string(char *out, size_t size, const struct sockaddr_in *sa) {
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
    fsdp__fmt(out, size, "%s:%d", ip, (int)ntohs(sa->sin_port));
}

#define FSDP__UID_ELSEWHERE (-1) /* fsdp__sock_peer_uid: the other end is not on this host */
#define FSDP__UID_UNASKED (-2)   /* ... this system has no socket table to ask */
#define FSDP__UID_UNKNOWN (-3)   /* ... the table has no owner for it */

/* The uid of the process on this host that holds the other end of connected TCP socket fd, as
   the kernel's socket table tells it (sock_diag, as `ss` asks it): >= 0; FSDP__UID_ELSEWHERE
   when the other end is not in this host's table (another host, or another network namespace);
   FSDP__UID_UNASKED when the table cannot be asked (not Linux, or sock_diag refused);
   FSDP__UID_UNKNOWN when no process can be named: the connection was reset (no far end),
   the far end is not established (closing sockets and time-wait entries report uid 0, root's),
   no process holds it (inode 0: orphaned, or still in a listener's accept queue), or it is
   gone from a table that must hold it (a loopback or own address). */
FSDP__PRIVATE long fsdp__sock_peer_uid(int fd) {
#if defined(__linux__)
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 req;
    } q;
    union {
        struct nlmsghdr nh;
        char bytes[1024];
    } a;
    struct sockaddr_in mine, theirs;
    struct sockaddr_nl kernel;
    struct timeval limit;
    socklen_t len = sizeof mine;
    long uid = FSDP__UID_UNASKED;
    ssize_t got;
    int nl;
    if (getsockname(fd, (struct sockaddr *)&mine, &len) != 0 || mine.sin_family != AF_INET) return FSDP__UID_UNASKED;
    len = sizeof theirs;
    if (getpeername(fd, (struct sockaddr *)&theirs, &len) != 0) return FSDP__UID_UNKNOWN; /* reset */
    if ((nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) < 0) return FSDP__UID_UNASKED;
    limit.tv_sec = 2; /* the kernel answers at once; bounded all the same */
    limit.tv_usec = 0;
    setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    memset(&q, 0, sizeof q);
    q.nh.nlmsg_len = sizeof q;
    q.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    q.nh.nlmsg_flags = NLM_F_REQUEST;
    q.nh.nlmsg_seq = 1;
    q.req.sdiag_family = AF_INET;
    q.req.sdiag_protocol = IPPROTO_TCP;
    q.req.idiag_states = ~0u;
    q.req.id.idiag_sport = theirs.sin_port; /* the other end's socket: its source is their side */
    q.req.id.idiag_dport = mine.sin_port;
    q.req.id.idiag_src[0] = theirs.sin_addr.s_addr;
    q.req.id.idiag_dst[0] = mine.sin_addr.s_addr;
    q.req.id.idiag_cookie[0] = q.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    memset(&kernel, 0, sizeof kernel);
    kernel.nl_family = AF_NETLINK;
    if (sendto(nl, &q, sizeof q, 0, (struct sockaddr *)&kernel, sizeof kernel) == (ssize_t)sizeof q &&
        (got = recv(nl, &a, sizeof a, 0)) >= (ssize_t)sizeof a.nh && a.nh.nlmsg_len <= (size_t)got) {
        if (a.nh.nlmsg_type == NLMSG_ERROR && a.nh.nlmsg_len >= NLMSG_LENGTH(sizeof(struct nlmsgerr))) {
            int here = theirs.sin_addr.s_addr == mine.sin_addr.s_addr || (ntohl(theirs.sin_addr.s_addr) >> 24) == 127;
            uid = ((const struct nlmsgerr *)NLMSG_DATA(&a.nh))->error != -ENOENT ? FSDP__UID_UNASKED
                  : here                                                          ? FSDP__UID_UNKNOWN
                                                                                  : FSDP__UID_ELSEWHERE;
        } else if (a.nh.nlmsg_type == SOCK_DIAG_BY_FAMILY &&
                   a.nh.nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
            const struct inet_diag_msg *m = (const struct inet_diag_msg *)NLMSG_DATA(&a.nh);
            int owned = m->idiag_state == 1 /* TCP_ESTABLISHED */ && m->idiag_inode != 0;
            uid = owned ? (long)m->idiag_uid : FSDP__UID_UNKNOWN;
        }
    }
    close(nl);
    return uid;
#else
    (void)fd;
    return FSDP__UID_UNASKED;
#endif
}

/* Name resolution in a helper thread, so a stalled resolver cannot outlast the deadline. The
   job is shared by the caller and the thread; whoever lets go last frees it. */
typedef struct fsdp__resolve_job {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    int refs, done, ok;
    struct in_addr ip;
    char host[256];
} fsdp__resolve_job;

FSDP__PRIVATE void fsdp__resolve_release(fsdp__resolve_job *job) {
    int last;
    pthread_mutex_lock(&job->lock);
    last = --job->refs == 0;
    pthread_mutex_unlock(&job->lock);
    if (!last) return;
    pthread_mutex_destroy(&job->lock);
    pthread_cond_destroy(&job->done_cond);
    FSDP_FREE(job);
}

static void *fsdp__resolve_thread(void *arg) {
    fsdp__resolve_job *job = (fsdp__resolve_job *)arg;
    struct addrinfo hints, *res = NULL;
    int ok;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    ok = getaddrinfo(job->host, NULL, &hints, &res) == 0 && res;
    pthread_mutex_lock(&job->lock);
    if (ok) job->ip = ((const struct sockaddr_in *)(const void *)res->ai_addr)->sin_addr;
    job->ok = ok;
    job->done = 1;
    pthread_cond_signal(&job->done_cond);
    pthread_mutex_unlock(&job->lock);
    if (res) freeaddrinfo(res);
    fsdp__resolve_release(job);
    return NULL;
}

/* host (a dotted IPv4 address or a name) and port to an address. 0 ok, -1 unknown, -2 the
   resolver did not answer before the deadline. */
FSDP__PRIVATE int fsdp__sock_resolve(const char *host, int port, struct sockaddr_in *out, int64_t deadline) {
    fsdp__resolve_job *job;
    pthread_t thread;
    pthread_attr_t attr;
    int rc = -1, started;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &out->sin_addr) == 1) return 0;
    if (strlen(host) >= sizeof job->host || !(job = (fsdp__resolve_job *)fsdp__calloc(sizeof *job))) return -1;
    pthread_mutex_init(&job->lock, NULL);
    pthread_cond_init(&job->done_cond, NULL);
    fsdp__copy_string(job->host, sizeof job->host, host);
    job->refs = 2;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&thread, &attr, fsdp__resolve_thread, job) == 0;
    pthread_attr_destroy(&attr);
    if (!started) { /* no thread to spare: resolve here */
        job->refs = 2;
        fsdp__resolve_thread(job);
    }
    pthread_mutex_lock(&job->lock);
    while (!job->done) {
        int64_t left = deadline - fsdp__now_ms();
        struct timespec ts;
        if (left <= 0) break;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (left > 1000) left = 1000;
        ts.tv_sec += (time_t)(left / 1000);
        ts.tv_nsec += (long)(left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&job->done_cond, &job->lock, &ts);
    }
    if (job->done && job->ok) { out->sin_addr = job->ip; rc = 0; }
    else if (!job->done) rc = -2;
    pthread_mutex_unlock(&job->lock);
    fsdp__resolve_release(job);
    return rc;
}

FSDP__PRIVATE int fsdp__sock_listen(const struct sockaddr_in *addr, int backlog) {
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)addr, sizeof *addr) != 0 || listen(fd, backlog) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* Connects before the deadline. Attempts are non-blocking and overlap: a fresh one every
   FSDP__SOCK_SYN_MS while the earlier ones still wait (the FSDP__SOCK_TRIES latest), and the
   first that connects wins. A listener whose accept queue is full drops SYNs, and the kernel's
   retransmissions back off (1, 3, 7, 15, 31 s): with a single attempt, a rank kept out by a
   flood of connections at rank 0 waited a minute where fresh SYNs get in within seconds, while
   the attempts kept waiting still let a slow round trip (up to 2 s) connect. An attempt that
   fails (nobody listens yet) is followed by the next after a pause that grows to 256 ms.
   -1 with errno (ETIMEDOUT at the deadline) on failure. */
FSDP__PRIVATE int fsdp__sock_connect(const struct sockaddr_in *addr, int64_t deadline) {
    struct pollfd tries[FSDP__SOCK_TRIES]; /* oldest first */
    int64_t next = fsdp__now_ms(), pause_ms = 2;
    int n = 0, i, err = 0, no_socket = 0, winner = -1;
    while (winner < 0) {
        int64_t now = fsdp__now_ms(), wake;
        if (now >= deadline) break;
        if (now >= next) { /* a fresh attempt; the oldest gives way */
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (fd < 0) { no_socket = errno; break; }
            if (n == FSDP__SOCK_TRIES) { close(tries[0].fd); memmove(tries, tries + 1, sizeof *tries * (size_t)--n); }
            next = now + FSDP__SOCK_SYN_MS;
            if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0) { winner = fd; break; }
            if (errno == EINPROGRESS || errno == EINTR) {
                tries[n].fd = fd;
                tries[n].events = POLLOUT;
                tries[n++].revents = 0;
            } else {
                err = errno;
                close(fd);
                next = now + pause_ms;
                if (pause_ms < 256) pause_ms *= 2;
            }
        }
        wake = (next < deadline ? next : deadline) - now;
        if (n == 0) { fsdp__sleep_us((wake > 0 ? wake : 0) * 1000); continue; }
        if (poll(tries, (nfds_t)n, wake > 1000 ? 1000 : (int)(wake > 0 ? wake : 0)) <= 0) continue;
        for (i = n - 1; i >= 0 && winner < 0; i--) {
            int e = 0;
            socklen_t len = sizeof e;
            if (!tries[i].revents) continue;
            if (getsockopt(tries[i].fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
            if (e == EINPROGRESS || e == EALREADY) { tries[i].revents = 0; continue; }
            if (e == 0) { winner = tries[i].fd; tries[i] = tries[--n]; continue; }
            err = e;
            close(tries[i].fd);
            memmove(tries + i, tries + i + 1, sizeof *tries * (size_t)(--n - i));
        }
    }
    err = no_socket ? no_socket : n > 0 || !err ? ETIMEDOUT : err; /* an attempt left unanswered: timed out */
    for (i = 0; i < n; i++) close(tries[i].fd);
    if (winner >= 0) fsdp__sock_tune(winner);
    else errno = err;
    return winner;
}

/* HMAC(key, label | a | b | c) with the label's NUL as separator; NULL parts are skipped. */
FSDP__PRIVATE void fsdp__sock_mac(unsigned char out[32], const unsigned char key[32], const char *label, const void *a,
                                  size_t a_size, const void *b, size_t b_size, const void *c, size_t c_size) {
    const void *parts[4];
    size_t sizes[4];
    int n = 0;
    parts[n] = label; sizes[n++] = strlen(label) + 1;
    if (a) { parts[n] = a; sizes[n++] = a_size; }
    if (b) { parts[n] = b; sizes[n++] = b_size; }
    if (c) { parts[n] = c; sizes[n++] = c_size; }
    fsdp__hmac_sha256(out, key, 32, n, parts, sizes);
}

/* Why a complete hello is refused, or NULL to admit it. Checks, in this order: the framing,
   the mac (constant time; *authentic says whether it verified, and an unauthentic hello is
   refused with a fixed sentence that tells its sender nothing), then what the authenticated
   sender claims: world size, a rank in [first, world), the session. */
FSDP__PRIVATE const char *fsdp__sock_judge_hello(const fsdp__sock_hello *h, const fsdp__sock_challenge *challenge,
                                                 const unsigned char key[32], int world, int first,
                                                 const unsigned char session[16], const struct sockaddr_in *arrived,
                                                 const struct sockaddr_in *listener, int *authentic, char *why,
                                                 size_t size) {
    unsigned char mac[32];
    struct sockaddr_in dialled;
    *authentic = 0;
    if (h->magic != FSDP__SOCK_MAGIC || h->version != FSDP__SOCK_VERSION)
        return fsdp__fmt(why, size, "not an fsdp.h protocol %u hello", FSDP__SOCK_VERSION), why;
    fsdp__sock_mac(mac, key, "fsdp.h hello", challenge->nonce, 32, h, offsetof(fsdp__sock_hello, mac), NULL, 0);
    if (!fsdp__equal_ct(mac, h->mac, 32))
        return fsdp__fmt(why, size, "authentication failed"), why;
    *authentic = 1;
    if (h->world != (uint32_t)world)
        return fsdp__fmt(why, size, "world size differs: the peer has %u, this rank has %d", h->world, world), why;
    if (h->rank < (uint32_t)first || h->rank >= (uint32_t)world)
        return fsdp__fmt(why, size, "rank %u cannot connect here (this listener admits ranks %d..%d)", h->rank, first,
                         world - 1), why;
    if (memcmp(h->session, session, 16) != 0)
        return fsdp__fmt(why, size, "rank %u belongs to another session of this job (a stale process of an earlier "
                         "run?)", h->rank), why;
    memset(&dialled, 0, sizeof dialled);
    dialled.sin_addr.s_addr = h->dial_ip;
    dialled.sin_port = htons((uint16_t)h->dial_port);
    if (h->dial_port > 65535 ||
        ((h->dial_ip != arrived->sin_addr.s_addr || dialled.sin_port != arrived->sin_port) &&
         (h->dial_ip != listener->sin_addr.s_addr || dialled.sin_port != listener->sin_port))) {
        char at[32], here[32];
        fsdp__sock_addr_string(at, sizeof at, &dialled);
        fsdp__sock_addr_string(here, sizeof here, arrived);
        return fsdp__fmt(why, size, "rank %u dialled %s but its connection arrived at %s: something relays between "
                         "the ranks (no NAT or proxy may stand between them)", h->rank, at, here), why;
    }
    return NULL;
}

#ifndef FSDP__SOCK_PEER_UID
#define FSDP__SOCK_PEER_UID(fd) fsdp__sock_peer_uid(fd) /* tests: a system whose socket table cannot be asked */
#endif

/* Without a secret the job's key is anyone's, so a peer on this host must be a process of this
   user: 0 (a secret is set; the peer is this user's or another host's; or the system has no
   table to ask: then a warning, once per comm), or why not in why: FSDP_ERR_REJECTED (the peer is
   another user's) or FSDP_ERR_PEER_LOST (no process can be named for it: reset, closing, not
   yet accepted; such a connection is refused too, else a stranger that resets at once would
   pass as anyone). */
FSDP__PRIVATE int fsdp__sock_foreign_user(fsdp_comm *comm, int fd, char *why, size_t size) {
    long uid;
    if (comm->has_secret) return 0;
    uid = FSDP__SOCK_PEER_UID(fd);
    if (uid >= 0 && (unsigned long)uid != (unsigned long)geteuid())
        return fsdp__fmt(why, size, "is a process of uid %ld, not of this user (uid %lu): without a secret only this "
                         "user's processes may join (give every rank the same FSDP_SECRET_FILE)", uid,
                         (unsigned long)geteuid()), FSDP_ERR_REJECTED;
    if (uid == FSDP__UID_UNKNOWN)
        return fsdp__fmt(why, size, "cannot be told to be a process of this user (the connection was reset or is "
                         "closing, and without a secret only this user's processes may join)"), FSDP_ERR_PEER_LOST;
    if (uid == FSDP__UID_UNASKED && !__atomic_exchange_n(&comm->unasked_warned, 1, __ATOMIC_RELAXED)) /* once per comm */
        fsdp__log(&comm->logger, FSDP_LOG_WARN, "socket: no secret is set and this system does not say which user "
                  "holds a connection (sock_diag): other users of this host could join the job; give every rank the "
                  "same FSDP_SECRET_FILE");
    return 0;
}

/* The acceptor's verdict on a hello; authenticated (mac'd) only when the hello was. */
FSDP__PRIVATE void fsdp__sock_make_reply(fsdp__sock_reply *reply, const unsigned char key[32], const fsdp__sock_hello *h,
                                         const fsdp__sock_challenge *challenge, uint32_t status, const char *reason,
                                         const unsigned char session[16], int authentic) {
    memset(reply, 0, sizeof *reply);
    reply->magic = FSDP__SOCK_MAGIC;
    reply->status = status;
    fsdp__copy_string(reply->reason, sizeof reply->reason, reason);
    if (session) memcpy(reply->session, session, 16);
    if (authentic)
        fsdp__sock_mac(reply->mac, key, "fsdp.h reply", h->nonce, 32, challenge->nonce, 32, reply,
                       offsetof(fsdp__sock_reply, mac));
}

FSDP__PRIVATE void fsdp__sock_free(fsdp__sock *s, int world) {
    int p;
    if (!s) return;
    if (s->peers)
        for (p = 0; p < world; p++)
            if (s->peers[p].fd >= 0) close(s->peers[p].fd);
    FSDP_FREE(s->peers);
    FSDP_FREE(s->ring);
    FSDP_FREE((void *)s->srcs);
    FSDP_FREE(s->act);
    FSDP_FREE(s->pfds);
    FSDP_FREE(s->pfd_peer);
    FSDP_FREE(s);
}

/* The rendezvous of a socket world: where rank 0 listens, the store it may be published in,
   and what rank 0 collects for everyone in `table` (3 * P + 1 words, the welcome's table):
   each rank's data listener (ips in network byte order, ports), its host number
   (hosts: numbered in order of their lowest rank) and the flags (FSDP__SOCK_FLAT if any rank
   asked for a flat world). Rank 0 alone: each rank's host digest (facts[16 * rank]) and the
   nonces of its handshake with rank 0 (nonces[64 * rank]: hello's, challenge's), which bind
   the table to that handshake. */
typedef struct fsdp__sock_rdv {
    struct sockaddr_in master;
    const char *store_key;      /* NULL: no store (MASTER_ADDR:MASTER_PORT is rank 0's listener) */
    char store_at[240];         /* "host:port" of the master address, for messages */
    int store_fd, listen_fd;
    uint32_t *table, *ips, *ports, *hosts, *flags;
    unsigned char *facts, *nonces;
} fsdp__sock_rdv;

/* A connection an acceptor has not admitted yet. */
typedef struct fsdp__sock_pending {
    int fd;
    int64_t deadline;
    size_t got;             /* bytes of the hello received */
    fsdp__sock_challenge challenge;
    fsdp__sock_hello hello;
    char addr[64];
} fsdp__sock_pending;

/* An acceptor at work (fsdp__sock_admit): its listener, the ranks it waits for, the
   connections that have not finished their hello, and what it refused. */
typedef struct fsdp__sock_door {
    fsdp_comm *comm;
    fsdp__sock *s;
    int listen_fd, first;
    int64_t deadline;
    fsdp__sock_rdv *rdv;        /* rank 0's rendezvous, or NULL */
    const unsigned char *expect; /* expect[p]: rank p is to connect here (NULL: every rank from first on) */
    const char *where;
    const unsigned char *session;
    fsdp__sock_pending pending[FSDP__SOCK_PENDING_MAX];
    int npending, missing, refused, accept_trouble;
    char last_refusal[200];
} fsdp__sock_door;

/* Drops pending connection i, saying why (why NULL: already said in last_refusal). */
static void fsdp__sock_door_drop(fsdp__sock_door *d, int i, const char *why) {
    if (why) fsdp__fmt(d->last_refusal, sizeof d->last_refusal, "%s %s", d->pending[i].addr, why);
    d->refused++;
    close(d->pending[i].fd);
    d->pending[i] = d->pending[--d->npending];
}

/* The pending connection waiting longest: an honest rank answers its challenge at once, so it
   is the likeliest stranger. */
static int fsdp__sock_door_oldest(const fsdp__sock_door *d) {
    int i, oldest = 0;
    for (i = 1; i < d->npending; i++)
        if (d->pending[i].deadline < d->pending[oldest].deadline) oldest = i;
    return oldest;
}

/* The deadline passed: the error names the missing ranks and the last refusal. */
FSDP__PRIVATE int fsdp__sock_door_timeout(fsdp__sock_door *d) {
    char list[160] = "", refusals[280] = "";
    size_t used = 0;
    int p;
    for (p = d->first; p < d->comm->world && used + 12 < sizeof list; p++)
        if (d->s->peers[p].fd < 0 && (!d->expect || d->expect[p]))
            used += (size_t)fsdp__fmt(list + used, sizeof list - used, "%s%d", used ? ", " : "", p);
    if (d->refused)
        fsdp__fmt(refusals, sizeof refusals, "; refused %d connection(s), the last: %s", d->refused, d->last_refusal);
    return fsdp__init_fail(&d->comm->logger, FSDP_ERR_TIMEOUT, "socket: rank %d waited %d ms at %s; missing rank(s): %s%s",
                           d->comm->rank, d->comm->timeout_ms, d->where, list, refusals);
}

/* A complete hello on pending connection pd: judged, answered, and the rank admitted (1) or
   the connection refused with why (0). */
FSDP__PRIVATE int fsdp__sock_door_judge(fsdp__sock_door *d, fsdp__sock_pending *pd, int64_t now, const char **problem,
                                        char *why, size_t why_size) {
    fsdp_comm *comm = d->comm;
    fsdp__sock_reply reply;
    struct sockaddr_in arrived, listener;
    socklen_t len = sizeof arrived;
    int authentic = 0, r;
    memset(&arrived, 0, sizeof arrived);
    memset(&listener, 0, sizeof listener);
    getsockname(pd->fd, (struct sockaddr *)&arrived, &len);
    len = sizeof listener;
    getsockname(d->listen_fd, (struct sockaddr *)&listener, &len);
    *problem = fsdp__sock_judge_hello(&pd->hello, &pd->challenge, comm->key, comm->world, d->first, d->session,
                                      &arrived, &listener, &authentic, why, why_size);
    if (!*problem && fsdp__sock_foreign_user(comm, pd->fd, why, why_size)) *problem = why;
    r = (int)pd->hello.rank;
    if (!*problem && d->expect && !d->expect[r])
        *problem = (fsdp__fmt(why, why_size, "rank %d has no data to exchange with rank %d (the hierarchical "
                              "layout connects other ranks)", r, comm->rank), why);
    if (!*problem && d->s->peers[r].fd >= 0) *problem = (fsdp__fmt(why, why_size, "rank %d has already joined", r), why);
    if (!*problem && !d->rdv) { /* welcome now, proving this side knows the key too */
        fsdp__sock_make_reply(&reply, comm->key, &pd->hello, &pd->challenge, 0, "welcome", NULL, 1);
        if (fsdp__sock_io_full(pd->fd, &reply, sizeof reply, now + FSDP__SOCK_HANDSHAKE_MS, 1) != 0)
            *problem = "went away before it was welcomed";
    } else if (*problem) { /* tell an authenticated peer why; anyone else only that it failed */
        fsdp__sock_make_reply(&reply, comm->key, &pd->hello, &pd->challenge, FSDP_ERR_REJECTED, *problem, NULL, authentic);
        fsdp__sock_io_full(pd->fd, &reply, sizeof reply, now + 1000, 1);
    }
    if (*problem) return 0;
    d->s->peers[r].fd = pd->fd;
    fsdp__copy_string(d->s->peers[r].addr, sizeof d->s->peers[r].addr, pd->addr);
    if (d->rdv) {
        d->rdv->ips[r] = pd->hello.data_ip;
        d->rdv->ports[r] = pd->hello.data_port;
        *d->rdv->flags |= pd->hello.flags & FSDP__SOCK_FLAT;
        memcpy(d->rdv->facts + 16 * (size_t)r, pd->hello.host, 16);
        memcpy(d->rdv->nonces + 64 * (size_t)r, pd->hello.nonce, 32);
        memcpy(d->rdv->nonces + 64 * (size_t)r + 32, pd->challenge.nonce, 32);
    }
    d->missing--;
    return 1;
}

/* Reads what the pending connections that poll reported sent; admits complete hellos. */
FSDP__PRIVATE void fsdp__sock_door_read(fsdp__sock_door *d, const struct pollfd *pfds, int64_t now) {
    int i;
    for (i = d->npending - 1; i >= 0; i--) {
        fsdp__sock_pending *pd = &d->pending[i];
        const char *problem = NULL;
        char why[160];
        ssize_t got;
        if (!pfds[i + 1].revents) continue;
        got = recv(pd->fd, (char *)&pd->hello + pd->got, sizeof pd->hello - pd->got, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (got <= 0) {
            problem = "closed the connection before finishing its hello";
        } else if ((pd->got += (size_t)got) >= 8 &&
                   (pd->hello.magic != FSDP__SOCK_MAGIC || pd->hello.version != FSDP__SOCK_VERSION)) {
            problem = "does not speak fsdp.h's protocol (or another version of it)";
        } else if (pd->got == sizeof pd->hello) {
            if (fsdp__sock_door_judge(d, pd, now, &problem, why, sizeof why)) {
                d->pending[i] = d->pending[--d->npending]; /* admitted: its descriptor is the peer's now */
                continue;
            }
        } else {
            continue; /* more of the hello to come */
        }
        fsdp__sock_door_drop(d, i, problem);
        fsdp__log(&d->comm->logger, FSDP_LOG_WARN, "socket: rank %d refused a connection at %s: %s", d->comm->rank,
                  d->where, d->last_refusal);
    }
}

/* Accepts new connections, each challenged at once, at most half the door's places a call:
   under a flood the accept queue never empties, and a loop that drained it never went back to
   read the hellos that had arrived while newer connections pushed theirs out (the oldest make
   room). Now a hello that arrives within a round is read before its connection can be pushed
   out. 0, or a system failure of the listener. */
FSDP__PRIVATE int fsdp__sock_door_accept(fsdp__sock_door *d) {
    fsdp_comm *comm = d->comm;
    int accepted;
    for (accepted = 0; accepted < (FSDP__SOCK_PENDING_MAX + 1) / 2; accepted++) {
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        fsdp__sock_pending *pd;
        int fd = accept(d->listen_fd, (struct sockaddr *)&from, &len);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK || errno == EFAULT || errno == EOPNOTSUPP)
                return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "socket: accept failed at %s: %s", d->where,
                                       strerror(errno));
            /* a connection that vanished, or the process or system out of descriptors or buffers
               for a moment: none of it ends the rendezvous */
            if (!d->accept_trouble++)
                fsdp__log(&comm->logger, FSDP_LOG_WARN, "socket: rank %d: accept at %s: %s (retrying)", comm->rank,
                          d->where, strerror(errno));
            if ((errno == EMFILE || errno == ENFILE) && d->npending > 0) {
                /* strangers hold the descriptors: drop the one waiting longest so the queue moves */
                int oldest = fsdp__sock_door_oldest(d);
                fsdp__fmt(d->last_refusal, sizeof d->last_refusal, "%s was dropped: rank %d ran out of descriptors",
                          d->pending[oldest].addr, comm->rank);
                fsdp__sock_door_drop(d, oldest, NULL);
                continue;
            }
            if (errno != ECONNABORTED && errno != EINTR && errno != EPROTO) fsdp__sleep_us(10000);
            return 0;
        }
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        fsdp__sock_nonblock(fd, 1);
        fsdp__sock_tune(fd);
        if (d->npending == FSDP__SOCK_PENDING_MAX) { /* make room: the oldest are the likeliest strangers */
            int oldest = fsdp__sock_door_oldest(d);
            fsdp__fmt(d->last_refusal, sizeof d->last_refusal, "%s was dropped: %d other connections were waiting",
                      d->pending[oldest].addr, FSDP__SOCK_PENDING_MAX);
            fsdp__sock_door_drop(d, oldest, NULL);
        }
        pd = &d->pending[d->npending];
        memset(pd, 0, sizeof *pd);
        pd->fd = fd;
        pd->deadline = fsdp__now_ms() + FSDP__SOCK_HANDSHAKE_MS;
        if (pd->deadline > d->deadline) pd->deadline = d->deadline;
        fsdp__sock_addr_string(pd->addr, sizeof pd->addr, &from);
        pd->challenge.magic = FSDP__SOCK_MAGIC;
        pd->challenge.version = FSDP__SOCK_VERSION;
        if (fsdp__random_bytes(pd->challenge.nonce, sizeof pd->challenge.nonce) != 0) {
            close(fd);
            return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "socket: no random bytes for a challenge: %s",
                                   strerror(errno));
        }
        /* a fresh connection's send buffer always takes these 40 bytes */
        if (send(fd, &pd->challenge, sizeof pd->challenge, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof pd->challenge) {
            close(fd);
            continue;
        }
        d->npending++;
    }
    return 0; /* more may wait: poll says so */
}

/* Admits ranks first..P-1 (those expect names, NULL: all; those without a connection yet) on
   listen_fd until each has one or the deadline passes. With rdv (rank 0 at the master address):
   hellos carry no session, what each rank says of itself goes to rdv (its data address, host
   digest and flags; its nonces of the handshake), and the caller welcomes everyone at the end;
   otherwise hellos must carry s->session and each rank is welcomed at once. where names the
   listener in messages.
   Acceptors run every pending handshake at once, each with a short budget, so silent or
   garbage-sending strangers cannot hold the door. */
FSDP__PRIVATE int fsdp__sock_admit(fsdp_comm *comm, fsdp__sock *s, int listen_fd, int first, int64_t deadline,
                                   fsdp__sock_rdv *rdv, const unsigned char *expect, const char *where) {
    static const unsigned char no_session[16] = {0};
    fsdp__sock_door *d = (fsdp__sock_door *)fsdp__calloc(sizeof *d);
    struct pollfd pfds[FSDP__SOCK_PENDING_MAX + 1];
    int p, i, rc = 0;
    if (!d) return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "socket: out of memory");
    d->comm = comm;
    d->s = s;
    d->listen_fd = listen_fd;
    d->first = first;
    d->deadline = deadline;
    d->rdv = rdv;
    d->expect = expect;
    d->where = where;
    d->session = rdv ? no_session : s->session;
    for (p = first; p < comm->world; p++) d->missing += s->peers[p].fd < 0 && (!expect || expect[p]);
    fsdp__sock_nonblock(listen_fd, 1);
    while (d->missing > 0 && !rc) {
        int64_t now = fsdp__now_ms(), wake = deadline;
        int ready;
        if (now >= deadline) {
            rc = fsdp__sock_door_timeout(d);
            break;
        }
        for (i = d->npending - 1; i >= 0; i--) { /* strangers that ran out of time */
            if (now < d->pending[i].deadline) {
                if (d->pending[i].deadline < wake) wake = d->pending[i].deadline;
                continue;
            }
            fsdp__fmt(d->last_refusal, sizeof d->last_refusal, "%s sent no complete hello within %d ms", d->pending[i].addr,
                      FSDP__SOCK_HANDSHAKE_MS);
            fsdp__log(&comm->logger, FSDP_LOG_WARN, "socket: rank %d dropped %s", comm->rank, d->last_refusal);
            fsdp__sock_door_drop(d, i, NULL);
        }
        pfds[0].fd = listen_fd;
        pfds[0].events = POLLIN;
        pfds[0].revents = 0;
        for (i = 0; i < d->npending; i++) {
            pfds[i + 1].fd = d->pending[i].fd;
            pfds[i + 1].events = POLLIN;
            pfds[i + 1].revents = 0;
        }
        ready = poll(pfds, (nfds_t)(d->npending + 1), wake - now > 1000 ? 1000 : (int)(wake - now));
        if (ready < 0 && errno != EINTR)
            rc = fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "socket: poll failed at %s: %s", where, strerror(errno));
        if (ready <= 0) continue;
        fsdp__sock_door_read(d, pfds, now);
        if (pfds[0].revents & POLLIN) rc = fsdp__sock_door_accept(d);
    }
    for (i = 0; i < d->npending; i++) close(d->pending[i].fd);
    FSDP_FREE(d);
    return rc;
}

/* The connector's side of the handshake on fd, connected to `who` (e.g. "rank 0 at
   10.0.0.1:29500"): reads the challenge (an acceptor sends it at once: silence or other bytes
   mean the port is not an fsdp.h rank's), sends hello (rank, world, data address, session
   filled in by the caller), then reads the verdict and checks that it comes from a holder of
   the key. With comm, the acceptor must be this user's where comm has no secret
   (fsdp__sock_foreign_user), asked once it has greeted: before, its end may still sit in its
   accept queue, which no process holds yet. nonces receives the hello's and the challenge's
   nonces. Returns 0 or a result code with the message in err. */
FSDP__PRIVATE int fsdp__sock_greet(fsdp_comm *comm, int fd, const unsigned char key[32], fsdp__sock_hello *hello,
                                   int64_t deadline, fsdp__sock_reply *reply, unsigned char nonces[64], const char *who,
                                   char *err, size_t err_size) {
    fsdp__sock_challenge challenge;
    struct sockaddr_in dialled;
    socklen_t len = sizeof dialled;
    unsigned char mac[32];
    int64_t greet_by = fsdp__now_ms() + FSDP__SOCK_GREETING_MS;
    char why[200];
    int io;
    memset(&challenge, 0, sizeof challenge);
    io = fsdp__sock_io_full(fd, &challenge, 8, greet_by < deadline ? greet_by : deadline, 0);
    if (io != 0) {
        fsdp__fmt(err, err_size, "%s %s", who,
                  io == -2 ? "accepted the connection but sent no fsdp.h greeting in time: is another service "
                             "(e.g. torchrun's TCPStore) listening on that port?"
                           : "closed the connection before greeting: is it an fsdp.h rank?");
        return io == -2 ? FSDP_ERR_TIMEOUT : FSDP_ERR_PROTOCOL;
    }
    if (challenge.magic != FSDP__SOCK_MAGIC) {
        fsdp__fmt(err, err_size, "%s is not an fsdp.h rank (it sent something other than fsdp.h's greeting): is "
                  "another service listening on that port?", who);
        return FSDP_ERR_PROTOCOL;
    }
    if (challenge.version != FSDP__SOCK_VERSION) {
        fsdp__fmt(err, err_size, "%s speaks fsdp.h socket protocol %u, this rank speaks %u: use the same fsdp.h on "
                  "every rank", who, challenge.version, FSDP__SOCK_VERSION);
        return FSDP_ERR_REJECTED;
    }
    if (comm && (io = fsdp__sock_foreign_user(comm, fd, why, sizeof why)) != 0)
        return fsdp__fmt(err, err_size, "%s %s", who, why), io;
    if (fsdp__sock_io_full(fd, challenge.nonce, sizeof challenge.nonce, deadline, 0) != 0 ||
        fsdp__random_bytes(hello->nonce, sizeof hello->nonce) != 0) {
        fsdp__fmt(err, err_size, "%s: the handshake broke off", who);
        return FSDP_ERR_PEER_LOST;
    }
    hello->magic = FSDP__SOCK_MAGIC;
    hello->version = FSDP__SOCK_VERSION;
    if (getpeername(fd, (struct sockaddr *)&dialled, &len) != 0) {
        fsdp__fmt(err, err_size, "%s: the connection broke: %s", who, strerror(errno));
        return FSDP_ERR_PEER_LOST;
    }
    hello->dial_ip = dialled.sin_addr.s_addr; /* binds the hello to this connection's far end */
    hello->dial_port = ntohs(dialled.sin_port);
    fsdp__sock_mac(hello->mac, key, "fsdp.h hello", challenge.nonce, 32, hello, offsetof(fsdp__sock_hello, mac), NULL, 0);
    memset(reply, 0, sizeof *reply);
    io = fsdp__sock_io_full(fd, hello, sizeof *hello, deadline, 1);
    if (io == 0) io = fsdp__sock_io_full(fd, reply, sizeof *reply, deadline, 0);
    if (io != 0) {
        fsdp__fmt(err, err_size, "%s did not answer the hello %s", who,
                  io == -2 ? "before the deadline" : "(it closed the connection)");
        return io == -2 ? FSDP_ERR_TIMEOUT : FSDP_ERR_PEER_LOST;
    }
    memcpy(nonces, hello->nonce, 32);
    memcpy(nonces + 32, challenge.nonce, 32);
    fsdp__sock_mac(mac, key, "fsdp.h reply", hello->nonce, 32, challenge.nonce, 32, reply, offsetof(fsdp__sock_reply, mac));
    if (reply->magic != FSDP__SOCK_MAGIC || !fsdp__equal_ct(mac, reply->mac, 32)) {
        if (reply->magic == FSDP__SOCK_MAGIC && reply->status != 0)
            fsdp__fmt(err, err_size, "%s refused this rank: authentication failed (the ranks were not given the same "
                      "FSDP_SECRET and job token)", who);
        else
            fsdp__fmt(err, err_size, "%s could not prove that it knows this job's secret: it is not a rank of this job",
                      who);
        return FSDP_ERR_REJECTED;
    }
    if (reply->status != 0) {
        char reason[sizeof reply->reason];
        fsdp__printable_n(reason, sizeof reason, reply->reason, sizeof reply->reason);
        fsdp__fmt(err, err_size, "%s refused this rank: %s", who, reason);
        return FSDP_ERR_REJECTED;
    }
    return 0;
}

/* A rank greets the peer `who` it dialled at addr on *fd (fsdp__sock_greet: without a secret the
   peer must be this user's). An acceptor busy with more handshakes than it runs at once drops
   the oldest (FSDP__SOCK_PENDING_MAX): a connection closed before the verdict is dialled again
   (*fd replaced) after a random pause that grows, until the deadline, so honest ranks are never
   lost for being many. 0, or the code with the message given to fsdp__init_fail. */
FSDP__PRIVATE int fsdp__sock_greet_peer(fsdp_comm *comm, int *fd, const struct sockaddr_in *addr, const char *who,
                                        fsdp__sock_hello *hello, int64_t deadline, fsdp__sock_reply *reply,
                                        unsigned char nonces[64]) {
    char err[FSDP__ERRMSG];
    int rc, attempt;
    for (attempt = 1;; attempt++) {
        uint32_t jitter = 0;
        int pause_ms;
        if ((rc = fsdp__sock_greet(comm, *fd, comm->key, hello, deadline, reply, nonces, who, err, sizeof err)) == 0)
            return 0;
        fsdp__random_bytes(&jitter, sizeof jitter);
        pause_ms = (attempt < 6 ? 25 << attempt : 1000) / 2;
        pause_ms += (int)(jitter % (uint32_t)pause_ms);
        if (rc != FSDP_ERR_PEER_LOST || fsdp__now_ms() + pause_ms >= deadline) break;
        fsdp__log(&comm->logger, FSDP_LOG_INFO, "socket: rank %d: %s dropped the handshake (attempt %d; busy with "
                  "others?): dialling again in %d ms", comm->rank, who, attempt, pause_ms);
        close(*fd);
        fsdp__sleep_us((int64_t)pause_ms * 1000);
        if ((*fd = fsdp__sock_connect(addr, deadline)) < 0) {
            fsdp__fmt(err, sizeof err, "%s dropped the handshake %d time(s), then could not be reached: %s", who, attempt,
                      strerror(errno));
            break;
        }
    }
    return fsdp__init_fail(&comm->logger, rc, "socket: rank %d: %s", comm->rank, err);
}

/* --- torch's TCPStore (torchrun's agent store), client side -------------------------------
   Under torchrun's static rendezvous the agent's store holds MASTER_PORT, so rank 0 cannot
   listen there: it listens on a port of its own and publishes "ip:port" in the store, where the
   other ranks wait for it. The wire format of torch 1.13 (checked against the real server): a
   request is a type byte and its arguments, a string (key or value) a u64 little-endian length
   and its bytes; SET 0x00 key value (no reply); GET 0x02 key -> string; CHECK 0x04 count keys
   -> 0x00 all there / 0x01 not; WAIT 0x05 count keys -> 0x00 once all exist (the server never
   gives up: the client bounds it, then must drop the connection); DELETE 0x08 key -> i64. There
   is no greeting, and any bad request makes the server close the connection. */
#define FSDP__STORE_SET 0x00
#define FSDP__STORE_GET 0x02
#define FSDP__STORE_CHECK 0x04
#define FSDP__STORE_WAIT 0x05
#define FSDP__STORE_DELETE 0x08

/* Sends type, then (counted) a count of one, then key as a string, then value (if given). */
FSDP__PRIVATE int fsdp__store_request(int fd, int type, int counted, const char *key, const void *value,
                                      size_t value_size, int64_t deadline) {
    unsigned char head[17], length[8];
    size_t n = 0, key_size = strlen(key);
    int i;
    head[n++] = (unsigned char)type;
    for (i = 0; counted && i < 8; i++) head[n++] = (unsigned char)(i == 0);
    for (i = 0; i < 8; i++) head[n++] = (unsigned char)((uint64_t)key_size >> (8 * i));
    for (i = 0; i < 8; i++) length[i] = (unsigned char)((uint64_t)value_size >> (8 * i));
    if (fsdp__sock_io_full(fd, head, n, deadline, 1) != 0 || fsdp__sock_io_full(fd, (void *)(uintptr_t)key, key_size, deadline, 1) != 0)
        return -1;
    if (value && (fsdp__sock_io_full(fd, length, 8, deadline, 1) != 0 ||
                  fsdp__sock_io_full(fd, (void *)(uintptr_t)value, value_size, deadline, 1) != 0))
        return -1;
    return 0;
}

/* Connects to the store at addr and checks that it is one: a CHECK of no keys, which a store
   answers with 0x00 at once (anything else within 5 s means another service). fd, or -1
   with the reason in err. */
FSDP__PRIVATE int fsdp__store_connect(const struct sockaddr_in *addr, int64_t deadline, const char *where, char *err,
                                      size_t err_size) {
    unsigned char probe[9], reply = 0xff;
    int64_t answer_by = fsdp__now_ms() + FSDP__SOCK_GREETING_MS;
    int fd = fsdp__sock_connect(addr, deadline), io;
    if (fd < 0) {
        fsdp__fmt(err, err_size, "cannot reach torchrun's store at %s: %s", where, strerror(errno));
        return -1;
    }
    memset(probe, 0, sizeof probe);
    probe[0] = FSDP__STORE_CHECK;
    io = fsdp__sock_io_full(fd, probe, sizeof probe, deadline, 1);
    if (io == 0) io = fsdp__sock_io_full(fd, &reply, 1, answer_by < deadline ? answer_by : deadline, 0);
    if (io != 0 || reply != 0) {
        fsdp__fmt(err, err_size, "%s is not torchrun's TCPStore (torch 1.13 protocol): %s", where,
                  io == -2 ? "it did not answer a CHECK" : io != 0 ? "it closed the connection on a CHECK"
                  : reply == (FSDP__SOCK_MAGIC & 0xff) ? "an fsdp.h rank listens there" : "it answered a CHECK wrongly");
        close(fd);
        return -1;
    }
    return fd;
}

/* Publishes key = value and confirms it arrived (SET has no reply; a CHECK after it does). */
FSDP__PRIVATE int fsdp__store_set(int fd, const char *key, const char *value, int64_t deadline) {
    unsigned char reply = 0xff;
    if (fsdp__store_request(fd, FSDP__STORE_SET, 0, key, value, strlen(value), deadline) != 0 ||
        fsdp__store_request(fd, FSDP__STORE_CHECK, 1, key, NULL, 0, deadline) != 0 ||
        fsdp__sock_io_full(fd, &reply, 1, deadline, 0) != 0)
        return -1;
    return reply == 0 ? 0 : -1;
}

/* Waits until the key exists (bounded by the deadline) and reads its value, at most cap - 1
   bytes (a longer one is refused: the store's word is not trusted), NUL-terminated. 0, -1
   error, -2 the key did not appear in time. After an error the connection must be closed. */
FSDP__PRIVATE int fsdp__store_get(int fd, const char *key, char *out, size_t cap, int64_t deadline) {
    unsigned char reply = 0xff, length[8];
    uint64_t size = 0;
    int io, i;
    if (fsdp__store_request(fd, FSDP__STORE_WAIT, 1, key, NULL, 0, deadline) != 0) return -1;
    if ((io = fsdp__sock_io_full(fd, &reply, 1, deadline, 0)) != 0) return io;
    if (reply != 0 || fsdp__store_request(fd, FSDP__STORE_GET, 0, key, NULL, 0, deadline) != 0 ||
        fsdp__sock_io_full(fd, length, 8, deadline, 0) != 0)
        return -1;
    for (i = 7; i >= 0; i--) size = size << 8 | length[i];
    if (size >= cap || fsdp__sock_io_full(fd, out, (size_t)size, deadline, 0) != 0) return -1;
    out[size] = 0;
    return 0;
}

FSDP__PRIVATE void fsdp__store_delete(int fd, const char *key, int64_t deadline) {
    unsigned char count[8];
    if (fsdp__store_request(fd, FSDP__STORE_DELETE, 0, key, NULL, 0, deadline) == 0)
        fsdp__sock_io_full(fd, count, sizeof count, deadline, 0);
}

/* 1 if the address is on this host's loopback network. */
static int fsdp__is_loopback(const struct sockaddr_in *a) { return (ntohl(a->sin_addr.s_addr) >> 24) == 127; }

/* The digest of the rendezvous table (3 * P + 1 words): each rank's mac of the table covers it
   (hashing the table once, not once per rank: rank 0's welcome stays linear in P). */
FSDP__PRIVATE void fsdp__sock_table_digest(unsigned char out[32], const uint32_t *table, int world) {
    fsdp__sha256 h;
    fsdp__sha256_init(&h);
    fsdp__sha256_update(&h, table, sizeof *table * (3 * (size_t)world + 1));
    fsdp__sha256_final(&h, out);
}

/* What rank 0 publishes in torchrun's store, which anyone who reaches it may write: "ip:port
   mac=<hex of HMAC(key, "fsdp.h store" | store key | NUL | "ip:port")>". */
FSDP__PRIVATE void fsdp__sock_store_value(char *out, size_t size, const unsigned char key[32], const char *store_key,
                                          const struct sockaddr_in *at) {
    unsigned char mac[32];
    char address[32], hex[65];
    fsdp__sock_addr_string(address, sizeof address, at);
    fsdp__sock_mac(mac, key, "fsdp.h store", store_key, strlen(store_key) + 1, address, strlen(address), NULL, 0);
    fsdp__hex(hex, mac, 32);
    fsdp__fmt(out, size, "%s mac=%s", address, hex);
}

/* Rank 0 listens (at the master address, or beside the store, publishing where), then admits
   every other rank. */
FSDP__PRIVATE int fsdp__sock_rank0_admit(fsdp_comm *comm, fsdp__sock *s, fsdp__sock_rdv *rdv, int64_t deadline) {
    struct sockaddr_in at = rdv->master;
    socklen_t len = sizeof at;
    char err[FSDP__ERRMSG], where[96];
    int rc;
    if (rdv->store_key) { /* the port is the store's: listen beside it and say where in the store */
        if ((rdv->store_fd = fsdp__store_connect(&rdv->master, deadline, rdv->store_at, err, sizeof err)) < 0)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_PROTOCOL, "socket: rank 0: %s", err);
        getsockname(rdv->store_fd, (struct sockaddr *)&at, &len);
        at.sin_port = 0;
    }
    if (rdv->listen_fd < 0) rdv->listen_fd = fsdp__sock_listen(&at, comm->world + 8);
    len = sizeof at;
    if (rdv->listen_fd < 0 || getsockname(rdv->listen_fd, (struct sockaddr *)&at, &len) != 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM,
                               "socket: rank 0 cannot listen on %s: %s (MASTER_ADDR must be an address of "
                               "rank 0's host and MASTER_PORT free)", rdv->store_at, strerror(errno));
    if (rdv->store_key) {
        char value[128];
        fsdp__sock_store_value(value, sizeof value, comm->key, rdv->store_key, &at);
        if (fsdp__store_set(rdv->store_fd, rdv->store_key, value, deadline) != 0)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_PROTOCOL,
                                   "socket: rank 0 could not publish its address in torchrun's store at %s", rdv->store_at);
    }
    if (!comm->has_secret && !fsdp__is_loopback(&at)) {
        char open_port[64];
        fsdp__sock_addr_string(open_port, sizeof open_port, &at);
        fsdp__log(&comm->logger, FSDP_LOG_WARN,
                  "socket: no secret is set (FSDP_SECRET or FSDP_SECRET_FILE): anyone who can reach %s or "
                  "the ranks' data ports can join this job or feed it data; give every rank the same secret",
                  open_port);
    }
    if (fsdp__random_bytes(s->session, sizeof s->session) != 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "socket: no random bytes: %s", strerror(errno));
    s->local = at;
    s->local.sin_port = 0;
    fsdp__sock_addr_string(rdv->store_at, sizeof rdv->store_at, &at);
    fsdp__fmt(where, sizeof where, "%s %s", rdv->store_key ? "its listener" : "the master address", rdv->store_at);
    rc = fsdp__sock_admit(comm, s, rdv->listen_fd, 1, deadline, rdv, NULL, where);
    if (rc && rdv->store_key)
        fsdp__fmt(fsdp__init_error + strlen(fsdp__init_error), sizeof fsdp__init_error - strlen(fsdp__init_error),
                  " (published in torchrun's store as '%s')", rdv->store_key);
    return rc;
}

/* Rank 0, once everyone is in (its own host digest and flags in rdv too): numbers the hosts and
   welcomes each rank with the session and the table (see fsdp__sock_rdv), mac'd under the nonces
   of that rank's handshake. */
FSDP__PRIVATE int fsdp__sock_rank0_welcome(fsdp_comm *comm, fsdp__sock *s, fsdp__sock_rdv *rdv, int64_t deadline) {
    size_t table = sizeof *rdv->table * (3 * (size_t)comm->world + 1);
    unsigned char mac[32], digest[32];
    int p, hosts;
    if ((hosts = fsdp__host_numbers(rdv->facts, comm->world, (int *)rdv->hosts)) < 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "socket: out of memory");
    fsdp__sock_table_digest(digest, rdv->table, comm->world);
    for (p = 1; p < comm->world; p++) {
        fsdp__sock_challenge challenge;
        fsdp__sock_hello theirs;
        fsdp__sock_reply reply;
        memcpy(theirs.nonce, rdv->nonces + 64 * (size_t)p, 32);
        memcpy(challenge.nonce, rdv->nonces + 64 * (size_t)p + 32, 32);
        fsdp__sock_make_reply(&reply, comm->key, &theirs, &challenge, 0, "welcome", s->session, 1);
        fsdp__sock_mac(mac, comm->key, "fsdp.h table", rdv->nonces + 64 * (size_t)p, 64, digest, sizeof digest, NULL, 0);
        if (fsdp__sock_io_full(s->peers[p].fd, &reply, sizeof reply, deadline, 1) != 0 ||
            fsdp__sock_io_full(s->peers[p].fd, rdv->table, table, deadline, 1) != 0 ||
            fsdp__sock_io_full(s->peers[p].fd, mac, sizeof mac, deadline, 1) != 0)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_PEER_LOST, "socket: rank %d (%s) went away during the rendezvous",
                                   p, s->peers[p].addr);
    }
    if (rdv->store_fd >= 0) fsdp__store_delete(rdv->store_fd, rdv->store_key, fsdp__now_ms() + 1000); /* it served its turn */
    return 0;
}

/* Under torchrun's agent store, the other ranks read rank 0's address from the store. */
FSDP__PRIVATE int fsdp__sock_store_lookup(fsdp_comm *comm, fsdp__sock_rdv *rdv, int64_t deadline) {
    char value[128], expected[128], err[FSDP__ERRMSG], *colon = NULL, *space = NULL;
    long port;
    int got;
    if ((rdv->store_fd = fsdp__store_connect(&rdv->master, deadline, rdv->store_at, err, sizeof err)) < 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_PROTOCOL, "socket: rank %d: %s", comm->rank, err);
    got = fsdp__store_get(rdv->store_fd, rdv->store_key, value, sizeof value, deadline);
    if (got == 0 && (space = strchr(value, ' ')) != NULL) *space = 0; /* "ip:port mac=..." */
    if (got != 0 || !space || !(colon = strrchr(value, ':')) || (*colon = 0, fsdp__parse_int(colon + 1, 1, 65535, &port)) != 0 ||
        inet_pton(AF_INET, value, &rdv->master.sin_addr) != 1)
        return fsdp__init_fail(&comm->logger, got == -2 ? FSDP_ERR_TIMEOUT : FSDP_ERR_PROTOCOL,
                               "socket: rank %d %s key '%.200s' in torchrun's store at %s%s", comm->rank,
                               got == -2 ? "waited in vain for" : "could not read a valid address from", rdv->store_key,
                               rdv->store_at, got == -2 ? " (is rank 0 running? torchrun restarts a node only when "
                               "its own workers fail)" : "");
    rdv->master.sin_port = htons((uint16_t)port);
    fsdp__sock_store_value(expected, sizeof expected, comm->key, rdv->store_key, &rdv->master);
    *colon = ':';
    *space = ' ';
    if (strlen(value) != strlen(expected) || !fsdp__equal_ct(value, expected, strlen(expected)))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_REJECTED,
                               "socket: rank %d: the address under key '%.200s' in torchrun's store at %s is not rank "
                               "0's: it fails the check under this job's key (someone without the secret wrote it, or "
                               "the ranks were given different secrets)", comm->rank, rdv->store_key, rdv->store_at);
    close(rdv->store_fd);
    rdv->store_fd = -1;
    return 0;
}

/* Another rank joins through rank 0: connects, opens its own data listener, greets rank 0 with
   its address, and receives the session and the table of every rank's address (checked). */
FSDP__PRIVATE int fsdp__sock_greet_rank0(fsdp_comm *comm, fsdp__sock *s, fsdp__sock_rdv *rdv, fsdp__sock_hello *hello,
                                         unsigned char nonces[64], int64_t deadline) {
    size_t table = sizeof *rdv->table * (3 * (size_t)comm->world + 1);
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    unsigned char mac[32], their_mac[32], digest[32];
    char who[96];
    fsdp__sock_reply reply;
    int fd = fsdp__sock_connect(&rdv->master, deadline), rc;
    fsdp__sock_addr_string(s->peers[0].addr, sizeof s->peers[0].addr, &rdv->master);
    if (fd < 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_TIMEOUT,
                               "socket: rank %d could not reach rank 0 at %s within %d ms: %s (is rank 0 "
                               "running? are MASTER_ADDR and MASTER_PORT right?)",
                               comm->rank, s->peers[0].addr, comm->timeout_ms, strerror(errno));
    s->peers[0].fd = fd;
    getsockname(fd, (struct sockaddr *)&local, &len);
    local.sin_port = 0;
    s->local = local;
    rdv->listen_fd = fsdp__sock_listen(&local, comm->world + 8);
    len = sizeof local;
    if (rdv->listen_fd < 0 || getsockname(rdv->listen_fd, (struct sockaddr *)&local, &len) != 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "socket: rank %d cannot open a data listener: %s",
                               comm->rank, strerror(errno));
    hello->data_ip = local.sin_addr.s_addr;
    hello->data_port = ntohs(local.sin_port);
    fsdp__fmt(who, sizeof who, "rank 0 at %s", s->peers[0].addr);
    rc = fsdp__sock_greet_peer(comm, &s->peers[0].fd, &rdv->master, who, hello, deadline, &reply, nonces);
    fd = s->peers[0].fd;
    if (rc) return rc;
    if (fsdp__sock_io_full(fd, rdv->table, table, deadline, 0) != 0 ||
        fsdp__sock_io_full(fd, their_mac, sizeof their_mac, deadline, 0) != 0)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_PEER_LOST, "socket: rank 0 went away during the rendezvous");
    fsdp__sock_table_digest(digest, rdv->table, comm->world);
    fsdp__sock_mac(mac, comm->key, "fsdp.h table", nonces, 64, digest, sizeof digest, NULL, 0);
    if (!fsdp__equal_ct(mac, their_mac, 32))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_PROTOCOL,
                               "socket: rank %d: the address table from rank 0 at %s failed its check", comm->rank,
                               s->peers[0].addr);
    memcpy(s->session, reply.session, sizeof s->session);
    memcpy(hello->session, s->session, sizeof hello->session);
    return 0;
}

/* Sets the places of the ranks (host_of, num_hosts, two_level: fsdp__comm_place) from the
   table of the rendezvous, whose host numbers must be in order of lowest rank. */
FSDP__PRIVATE int fsdp__sock_learn_places(fsdp_comm *comm, const fsdp__sock_rdv *rdv) {
    int r;
    if (!(comm->host_of = (int *)fsdp__calloc(sizeof(int) * (size_t)comm->world)))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "socket: out of memory");
    comm->num_hosts = 0;
    for (r = 0; r < comm->world; r++) {
        if (rdv->hosts[r] > (uint32_t)comm->num_hosts)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_PROTOCOL, "socket: rank %d: rank 0's table numbers rank %d's "
                                   "host %u, out of order", comm->rank, r, rdv->hosts[r]);
        comm->host_of[r] = (int)rdv->hosts[r];
        if (comm->host_of[r] == comm->num_hosts) comm->num_hosts++;
    }
    fsdp__comm_place(comm, (*rdv->flags & FSDP__SOCK_FLAT) != 0);
    return 0;
}

/* Every rank tells rank 0 over its rendezvous connection whether it made its host's shm comm
   (verdict[0]: 1 or 0) and the pipeline step it asks for (verdict[1], fsdp__hier_step_wish);
   rank 0 answers every rank with the verdict: 1 if all made theirs, the smallest step. Before
   the mesh, whose shape depends on it. */
FSDP__PRIVATE int fsdp__sock_star_agree(fsdp_comm *comm, fsdp__sock *s, int32_t verdict[2], int64_t deadline) {
    int32_t theirs[2];
    int p;
    if (comm->rank != 0) {
        if (fsdp__sock_io_full(s->peers[0].fd, verdict, 2 * sizeof *verdict, deadline, 1) == 0 &&
            fsdp__sock_io_full(s->peers[0].fd, verdict, 2 * sizeof *verdict, deadline, 0) == 0)
            return 0;
        return fsdp__init_fail(&comm->logger, FSDP_ERR_PEER_LOST, "socket: rank %d: rank 0 (%s) went away while the "
                               "ranks agreed on their hosts' shared memory", comm->rank, s->peers[0].addr);
    }
    for (p = 1; p < comm->world; p++) {
        if (fsdp__sock_io_full(s->peers[p].fd, theirs, sizeof theirs, deadline, 0) != 0)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_PEER_LOST, "socket: rank %d (%s) went away while the ranks "
                                   "agreed on their hosts' shared memory", p, s->peers[p].addr);
        verdict[0] &= theirs[0] == 1;
        if (theirs[1] > 0 && theirs[1] < verdict[1]) verdict[1] = theirs[1];
    }
    for (p = 1; p < comm->world; p++)
        if (fsdp__sock_io_full(s->peers[p].fd, verdict, 2 * sizeof *verdict, deadline, 1) != 0)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_PEER_LOST, "socket: rank %d (%s) went away while the ranks "
                                   "agreed on their hosts' shared memory", p, s->peers[p].addr);
    return 0;
}

/* The mesh: rank i connects to the ranks 1..i-1 it is linked with (with the session) and admits
   those of i+1..P-1 (linked[p]: every rank in a flat world, fsdp__hier_links in a hierarchical
   one); the rendezvous connection is the link to rank 0. */
FSDP__PRIVATE int fsdp__sock_mesh(fsdp_comm *comm, fsdp__sock *s, fsdp__sock_rdv *rdv, fsdp__sock_hello *hello,
                                  const unsigned char *linked, int64_t deadline) {
    unsigned char nonces[64];
    char who[96], where[96], here[64];
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    fsdp__sock_reply reply;
    int p, rc;
    for (p = 1; p < comm->rank; p++) { /* connect down */
        struct sockaddr_in peer;
        if (!linked[p]) continue;
        memset(&peer, 0, sizeof peer);
        peer.sin_family = AF_INET;
        peer.sin_addr.s_addr = rdv->ips[p];
        peer.sin_port = htons((uint16_t)rdv->ports[p]);
        fsdp__sock_addr_string(s->peers[p].addr, sizeof s->peers[p].addr, &peer);
        s->peers[p].fd = fsdp__sock_connect(&peer, deadline);
        if (s->peers[p].fd < 0)
            return fsdp__init_fail(&comm->logger, FSDP_ERR_TIMEOUT, "socket: rank %d could not connect to rank %d at %s: %s",
                                   comm->rank, p, s->peers[p].addr, strerror(errno));
        fsdp__fmt(who, sizeof who, "rank %d at %s", p, s->peers[p].addr);
        if ((rc = fsdp__sock_greet_peer(comm, &s->peers[p].fd, &peer, who, hello, deadline, &reply, nonces)) != 0) return rc;
    }
    getsockname(rdv->listen_fd, (struct sockaddr *)&local, &len);
    fsdp__sock_addr_string(here, sizeof here, &local);
    fsdp__fmt(where, sizeof where, "its data listener %s", here);
    return fsdp__sock_admit(comm, s, rdv->listen_fd, comm->rank + 1, deadline, NULL, linked, where);
}

/* A rank of a socket world holds `connections` connections and a listener beside what the
   process has open: the soft RLIMIT_NOFILE is raised to that where the hard limit allows (a
   shell's default of 1024 ends a flat world of a thousand ranks), else why not in err: -1. */
FSDP__PRIVATE int fsdp__sock_fd_room(int rank, int world, int connections, char *err, size_t err_size) {
    struct rlimit lim;
    DIR *dir = opendir("/proc/self/fd");
    struct dirent *e;
    long open_now = -1; /* the directory's own descriptor is listed too */
    rlim_t needed;
    if (!dir || getrlimit(RLIMIT_NOFILE, &lim) != 0) { /* cannot tell: connections will say */
        if (dir) closedir(dir);
        return 0;
    }
    while ((e = readdir(dir)) != NULL) open_now += e->d_name[0] != '.';
    closedir(dir);
    needed = (rlim_t)open_now + (rlim_t)connections + 3;
    if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= needed) return 0;
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < needed) {
        fsdp__fmt(err, err_size, "socket: rank %d of a world of %d ranks needs %llu file descriptors here (%ld open, %d "
                  "connections, a listener), but RLIMIT_NOFILE's hard limit is %llu: raise it (ulimit -Hn, limits.conf, "
                  "systemd's LimitNOFILE)", rank, world, (unsigned long long)needed, open_now, connections,
                  (unsigned long long)lim.rlim_max);
        return -1;
    }
    lim.rlim_cur = needed;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
        fsdp__fmt(err, err_size, "socket: rank %d of a world of %d ranks needs %llu file descriptors here and "
                  "RLIMIT_NOFILE could not be raised to that: %s", rank, world, (unsigned long long)needed,
                  strerror(errno));
        return -1;
    }
    return 0;
}

FSDP__PRIVATE void fsdp__hier_links(const fsdp_comm *comm, unsigned char *linked); /* >>hier */
FSDP__PRIVATE fsdp_comm *fsdp__hier_host_comm(fsdp_comm *comm, const fsdp_comm_desc *desc);
FSDP__PRIVATE int32_t fsdp__hier_step_wish(fsdp_comm *comm);

/* The shape of a socket world once connected: its host's shm comm and the agreed pipeline step
   where it is hierarchical (for fsdp__hier_setup). */
typedef struct fsdp__sock_shape {
    fsdp_comm *host;
    int32_t step_wish;
} fsdp__sock_shape;

/* Which peers a rank connects to. Ranks learn the world's hosts at the rendezvous; where the
   world is hierarchical, every host makes its shm comm and the ranks agree (through rank 0) that
   all could: then a rank links only to the ranks the hierarchical algorithms use (its
   counterparts on the other hosts), else to every rank. The rendezvous connections that are not
   links are closed once the mesh stands. */
FSDP__PRIVATE int fsdp__sock_shape_world(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__sock *s,
                                         unsigned char *linked, fsdp__sock_shape *shape, int64_t deadline) {
    int32_t verdict[2];
    int rc;
    memset(linked, 1, (size_t)comm->world);
    linked[comm->rank] = 0;
    if (!comm->two_level) return 0;
    shape->host = fsdp__hier_host_comm(comm, desc);
    if (!shape->host)
        fsdp__log(&comm->logger, FSDP_LOG_WARN, "socket: rank %d cannot share memory with the ranks of its host (%s): "
                  "every byte goes over sockets", comm->rank, fsdp__init_error);
    verdict[0] = shape->host != NULL;
    verdict[1] = fsdp__hier_step_wish(comm);
    if ((rc = fsdp__sock_star_agree(comm, s, verdict, deadline)) != 0) return rc;
    shape->step_wish = verdict[1];
    if (!verdict[0]) {
        fsdp_comm_destroy(shape->host);
        shape->host = NULL;
        comm->two_level = 0; /* flat after all: rank order */
        return 0;
    }
    fsdp__hier_links(comm, linked); /* (never this rank: another host's) */
    return 0;
}

/* fsdp__sock_init's phases. The buffers: the socket state of P peers, the rendezvous table
   (rank 0 also the others' host facts and nonces) and which ranks this one links to. */
FSDP__PRIVATE int fsdp__sock_alloc(fsdp_comm *comm, fsdp__sock **out, fsdp__sock_rdv *rdv, unsigned char **linked) {
    fsdp__sock *s = (fsdp__sock *)fsdp__calloc(sizeof *s);
    int P = comm->world, p;
    *out = s;
    if (!s) return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "socket: out of memory");
    s->peers = (fsdp__sock_peer *)fsdp__calloc(sizeof *s->peers * (size_t)P);
    s->pfds = (struct pollfd *)fsdp__calloc(sizeof *s->pfds * (size_t)P);
    s->srcs = (const void **)fsdp__calloc(sizeof *s->srcs * (size_t)P);
    s->act = (int *)fsdp__calloc(sizeof *s->act * (size_t)P);
    s->pfd_peer = (int *)fsdp__calloc(sizeof *s->pfd_peer * (size_t)P);
    for (p = 0; s->peers && p < P; p++) s->peers[p].fd = -1;
    rdv->table = (uint32_t *)fsdp__calloc(sizeof *rdv->table * (3 * (size_t)P + 1));
    *linked = (unsigned char *)fsdp__calloc((size_t)P);
    if (comm->rank == 0) {
        rdv->facts = (unsigned char *)fsdp__calloc(16 * (size_t)P);
        rdv->nonces = (unsigned char *)fsdp__calloc(64 * (size_t)P);
    }
    if (!s->peers || !s->pfds || !s->srcs || !s->act || !s->pfd_peer || !rdv->table || !*linked ||
        (comm->rank == 0 && (!rdv->facts || !rdv->nonces)))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "socket: out of memory");
    rdv->ips = rdv->table;
    rdv->ports = rdv->table + P;
    rdv->hosts = rdv->table + 2 * (size_t)P;
    rdv->flags = rdv->table + 3 * (size_t)P;
    return 0;
}

/* Where the others find rank 0 (desc's master address and port, resolved within the deadline),
   after the checks that need no network: rank 0's room for a descriptor per rank, the port, the
   store key. */
FSDP__PRIVATE int fsdp__sock_find_master(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__sock_rdv *rdv,
                                         int64_t deadline) {
    const char *host = desc->master_addr && *desc->master_addr ? desc->master_addr : "127.0.0.1";
    char err[FSDP__ERRMSG];
    int resolved;
    if (comm->rank == 0 && fsdp__sock_fd_room(0, comm->world, comm->world, err, sizeof err) != 0) /* all join through it */
        return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "%s", err);
    if (rdv->listen_fd < 0 && (desc->master_port <= 0 || desc->master_port > 65535))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_INVALID_ARG, "socket: master_port %d is not a TCP port",
                               desc->master_port);
    if (rdv->store_key && strlen(rdv->store_key) > 200)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_INVALID_ARG, "socket: store_key is longer than 200 characters");
    if ((resolved = fsdp__sock_resolve(host, desc->master_port, &rdv->master, deadline)) != 0)
        return fsdp__init_fail(&comm->logger, resolved == -2 ? FSDP_ERR_TIMEOUT : FSDP_ERR_INVALID_ARG,
                               "socket: cannot resolve master address '%.200s'%s", host,
                               resolved == -2 ? ": the resolver did not answer in time" : "");
    fsdp__fmt(rdv->store_at, sizeof rdv->store_at, "%.200s:%d", host, desc->master_port);
    return 0;
}

/* The rendezvous: rank 0 admits every other rank and welcomes them with the table; the others
   find rank 0 (through the store, if any) and greet it. hello: this rank's, as the mesh repeats
   it to its peers (without the host facts and wishes, which are for rank 0 only). */
FSDP__PRIVATE int fsdp__sock_rendezvous(fsdp_comm *comm, fsdp__sock *s, fsdp__sock_rdv *rdv, fsdp__sock_hello *hello,
                                        int64_t deadline) {
    unsigned char facts[32], mine[64];
    int rc = 0;
    memset(hello, 0, sizeof *hello);
    hello->rank = (uint32_t)comm->rank;
    hello->world = (uint32_t)comm->world;
    hello->flags = fsdp__flat_wish() ? FSDP__SOCK_FLAT : 0u;
    fsdp__host_facts(facts);
    memcpy(hello->host, facts, sizeof hello->host);
    if (comm->rank == 0) { /* what the others' hellos tell it, rank 0 knows of itself */
        memcpy(rdv->facts, hello->host, sizeof hello->host);
        *rdv->flags = hello->flags;
        if ((rc = fsdp__sock_rank0_admit(comm, s, rdv, deadline)) == 0) rc = fsdp__sock_rank0_welcome(comm, s, rdv, deadline);
        return rc;
    }
    if (rdv->store_key) rc = fsdp__sock_store_lookup(comm, rdv, deadline);
    if (!rc) rc = fsdp__sock_greet_rank0(comm, s, rdv, hello, mine, deadline);
    memset(hello->host, 0, sizeof hello->host); /* (said to rank 0 only) */
    hello->flags = 0;
    return rc;
}

/* Once the mesh stands: rendezvous connections that are no links close, every link turns
   non-blocking and gets a ring of the receive buffer, sized so that all rings together stay
   within FSDP__SOCK_RINGS_MAX. */
FSDP__PRIVATE int fsdp__sock_rings(fsdp_comm *comm, fsdp__sock *s, const unsigned char *linked) {
    int P = comm->world, p, links = 0;
    for (p = 0; p < P; p++) {
        if (p == comm->rank || s->peers[p].fd < 0) continue;
        if (!linked[p]) {
            close(s->peers[p].fd);
            s->peers[p].fd = -1;
            continue;
        }
        fsdp__sock_nonblock(s->peers[p].fd, 1);
        s->peers[p].at_boundary = 1;
        links++;
    }
    s->ring_bytes = FSDP__SOCK_RINGS_MAX / (size_t)(links ? links : 1) / FSDP__SOCK_SEGMENT * FSDP__SOCK_SEGMENT;
    if (s->ring_bytes > FSDP__SOCK_RING_BYTES) s->ring_bytes = FSDP__SOCK_RING_BYTES;
    if (s->ring_bytes < FSDP__SOCK_SEGMENT) s->ring_bytes = FSDP__SOCK_SEGMENT;
    if (!(s->ring = (char *)FSDP_MALLOC((size_t)(links ? links : 1) * s->ring_bytes)))
        return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "socket: out of memory");
    for (p = 0, links = 0; p < P; p++)
        if (s->peers[p].fd >= 0) s->peers[p].ring = s->ring + (size_t)links++ * s->ring_bytes;
    return 0;
}

/* Connects a socket world (see the top of this section) and says its shape. Takes ownership of
   listen_fd (a listener rank 0 inherited from fsdp_launch, or -1). */
FSDP__PRIVATE int fsdp__sock_init(fsdp_comm *comm, const fsdp_comm_desc *desc, int listen_fd, fsdp__sock_shape *shape) {
    fsdp__sock *s = NULL;
    int64_t deadline = fsdp__now_ms() + comm->timeout_ms;
    int P = comm->world, p, rc, links = 0;
    unsigned char *linked = NULL;
    char err[FSDP__ERRMSG];
    fsdp__sock_rdv rdv;
    fsdp__sock_hello hello;
    memset(&rdv, 0, sizeof rdv);
    rdv.store_fd = -1;
    rdv.listen_fd = listen_fd;
    rdv.store_key = desc->store_key && *desc->store_key ? desc->store_key : NULL;
    if ((rc = fsdp__sock_alloc(comm, &s, &rdv, &linked)) == 0) rc = fsdp__sock_find_master(comm, desc, &rdv, deadline);
    if (!rc) rc = fsdp__sock_rendezvous(comm, s, &rdv, &hello, deadline);
    if (!rc) rc = fsdp__sock_learn_places(comm, &rdv);
    if (!rc) rc = fsdp__sock_shape_world(comm, desc, s, linked, shape, deadline);
    for (p = 1; !rc && p < P; p++) links += linked[p];
    if (!rc && comm->rank != 0 && fsdp__sock_fd_room(comm->rank, P, links + 1, err, sizeof err) != 0)
        rc = fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "%s", err);
    if (!rc && comm->rank != 0) rc = fsdp__sock_mesh(comm, s, &rdv, &hello, linked, deadline);
    if (!rc) rc = fsdp__sock_rings(comm, s, linked);
    if (!rc) {
        s->spin_seconds = fsdp__spin_seconds(comm->local_world);
        comm->impl = s;
    }
    if (rdv.listen_fd >= 0) close(rdv.listen_fd);
    if (rdv.store_fd >= 0) close(rdv.store_fd);
    FSDP_FREE(rdv.table);
    FSDP_FREE(rdv.facts);
    FSDP_FREE(rdv.nonces);
    FSDP_FREE(linked);
    if (rc) {
        fsdp_comm_destroy(shape->host);
        shape->host = NULL;
        fsdp__sock_free(s, P);
    }
    return rc;
}

/* Sends what the abort message can: an abort frame to every peer whose stream is between
   messages (only from the thread that runs ops), then shuts every connection so peers blocked
   on us wake with an error at once. */
FSDP__PRIVATE void fsdp__sock_abort(fsdp_comm *comm, void *impl) {
    fsdp__sock *s = (fsdp__sock *)impl;
    int p, may_write;
    if (!s) return;
    may_write = fsdp__sock_running == s;
    for (p = 0; p < comm->world; p++) {
        fsdp__sock_peer *peer = &s->peers[p];
        if (p == comm->rank || peer->fd < 0) continue;
        if (may_write && peer->at_boundary) {
            fsdp__sock_header h;
            size_t len = strlen(comm->error);
            memset(&h, 0, sizeof h);
            h.magic = FSDP__SOCK_ABORT_MAGIC;
            h.payload = len;
            h.code = fsdp__load(&comm->status);
            if (fsdp__sock_io_full(peer->fd, &h, sizeof h, fsdp__now_ms() + 200, 1) == 0)
                fsdp__sock_io_full(peer->fd, comm->error, len, fsdp__now_ms() + 200, 1);
        }
        shutdown(peer->fd, SHUT_RDWR);
    }
}

FSDP__PRIVATE void fsdp__sock_destroy(fsdp_comm *comm, void *impl) { fsdp__sock_free((fsdp__sock *)impl, comm->world); }

/* A header arrived from peer p: check it before accepting any payload. */
FSDP__PRIVATE int fsdp__sock_check_header(fsdp_comm *comm, fsdp__sock *s, int p, const fsdp_coll *c,
                                          const fsdp__fingerprint *fp, uint32_t phase) {
    fsdp__sock_peer *peer = &s->peers[p];
    fsdp__sock_header *h = &peer->in_header;
    if (h->magic == FSDP__SOCK_ABORT_MAGIC) {
        char raw[FSDP__ERRMSG], message[FSDP__ERRMSG];
        size_t len = h->payload < sizeof raw - 1 ? (size_t)h->payload : sizeof raw - 1;
        if (fsdp__sock_io_full(peer->fd, raw, len, fsdp__now_ms() + 1000, 0) != 0)
            fsdp__copy_string(message, sizeof message, "(message lost)");
        else
            fsdp__printable_n(message, sizeof message, raw, len);
        return fsdp__comm_adopt(comm, h->code == FSDP_ERR_MISMATCH ? FSDP_ERR_MISMATCH : FSDP_ERR_ABORTED,
                                "rank %d (%s) failed first: %s", p, peer->addr, message);
    }
    if (h->magic != FSDP__SOCK_MAGIC)
        return fsdp_comm_fail(comm, FSDP_ERR_PROTOCOL, "rank %d (%s) sent a malformed header during %s (magic 0x%08x)",
                              p, peer->addr, fsdp_coll_name(c->kind), (unsigned)h->magic);
    if (fsdp__check_fingerprint(comm, fp, &h->fp, p)) return FSDP_ERR_MISMATCH;
    if (h->phase != phase || h->payload != peer->in_len)
        return fsdp_comm_fail(comm, FSDP_ERR_PROTOCOL,
                              "rank %d (%s) announced %llu bytes in phase %u of %s; rank %d expected %zu bytes in phase %u",
                              p, peer->addr, (unsigned long long)h->payload, (unsigned)h->phase,
                              fsdp_coll_name(c->kind), comm->rank, peer->in_len, (unsigned)phase);
    return 0;
}

/* Peer p's connection broke. If it said why first (an abort frame waiting in our receive
   buffer), adopt its reason; otherwise report the lost peer. */
FSDP__PRIVATE int fsdp__sock_lost(fsdp_comm *comm, fsdp__sock *s, int p, const fsdp_coll *c, const fsdp__fingerprint *fp,
                                  uint32_t phase, int err) {
    fsdp__sock_peer *peer = &s->peers[p];
    if (peer->in_header_done < sizeof peer->in_header || peer->in_done == peer->in_len) {
        if (peer->in_header_done == sizeof peer->in_header) peer->in_header_done = 0; /* next message */
        while (peer->in_header_done < sizeof peer->in_header) {
            ssize_t got = recv(peer->fd, (char *)&peer->in_header + peer->in_header_done,
                               sizeof peer->in_header - peer->in_header_done, MSG_DONTWAIT);
            if (got <= 0) break;
            peer->in_header_done += (size_t)got;
        }
        if (peer->in_header_done == sizeof peer->in_header && peer->in_header.magic == FSDP__SOCK_ABORT_MAGIC)
            return fsdp__sock_check_header(comm, s, p, c, fp, phase);
    }
    if (!fsdp__load(&comm->lost_peer)) fsdp__store(&comm->lost_peer, p + 1);
    return fsdp__comm_adopt(comm, FSDP_ERR_PEER_LOST, "rank %d (%s) closed its connection during %s (op #%llu)%s%s", p,
                          peer->addr, fsdp_coll_name(c->kind), (unsigned long long)c->seq, err ? ": " : "",
                          err ? strerror(err) : "");
}

typedef struct fsdp__sock_reduction {
    char *dst;             /* NULL: no reduction in this phase */
    const char *own;       /* this rank's contribution */
    size_t bytes;
    const int *order;      /* the ranks whose contributions are folded, in fold order (this rank's
                              own among them); NULL: every rank in rank order */
    int count;             /* entries of order */
    fsdp_reduce_op op;     /* with order: how to fold, and (FSDP_AVG) the divisor */
    int divisor;
} fsdp__sock_reduction;

/* Says in the rank's note (hierarchical comms) which peer its network wait is for; p < 0: none. */
FSDP__PRIVATE void fsdp__sock_note(fsdp__sock *s, int p) {
    char text[sizeof s->wait_note->text];
    if (!s->wait_note || s->noted == p + 1) return;
    if (p >= 0) fsdp__fmt(text, sizeof text, "rank %d of the world at %s, on another host", p, s->peers[p].addr);
    else text[0] = 0;
    fsdp__shm_note_set(s->wait_note, text);
    s->noted = p + 1;
}

FSDP__PRIVATE int fsdp__sock_phase_io(fsdp_comm *comm, fsdp__sock *s, const fsdp_coll *c, uint32_t phase,
                                      const fsdp__sock_reduction *red);

/* Runs one phase: the caller has set every peer's out_data/out_len and in_direct/in_len. */
FSDP__PRIVATE int fsdp__sock_phase(fsdp_comm *comm, fsdp__sock *s, const fsdp_coll *c, uint32_t phase,
                                   const fsdp__sock_reduction *red) {
    int rc = fsdp__sock_phase_io(comm, s, c, phase, red);
    fsdp__sock_note(s, -1);
    return rc;
}

/* Folds every segment of the phase's reduction that all peers have delivered; *reduced counts
   the bytes folded. 1 while some are still to come. */
FSDP__PRIVATE int fsdp__sock_fold(fsdp_comm *comm, fsdp__sock *s, const fsdp_coll *c, const fsdp__sock_reduction *red,
                                  size_t *reduced) {
    const void **srcs = s->srcs;
    size_t esize = fsdp_dtype_size(c->dtype);
    int n = red->order ? red->count : comm->world, k, p;
    for (;;) {
        size_t len = red->bytes - *reduced < FSDP__SOCK_SEGMENT ? red->bytes - *reduced : FSDP__SOCK_SEGMENT;
        int all = len > 0;
        for (k = 0; k < n && all; k++) {
            p = red->order ? red->order[k] : k;
            if (p != comm->rank && s->peers[p].in_done < *reduced + len) all = 0;
        }
        if (!all) break;
        for (k = 0; k < n; k++) {
            p = red->order ? red->order[k] : k;
            srcs[k] = p == comm->rank ? (const void *)(red->own + *reduced)
                                      : (const void *)(s->peers[p].ring + *reduced % s->ring_bytes);
        }
        fsdp_reduce_ranks(red->dst + *reduced, srcs, n, len / esize, c->dtype, red->order ? red->op : c->op,
                          red->order ? red->divisor : comm->world);
        *reduced += len;
    }
    return *reduced < red->bytes;
}

/* Sets s->pfds to the peers that have something to send or receive (receive: while the ring has
   room, reduced bytes being folded). *n: their number; *pending: the phase is not done. Fails
   once the op's deadline passed with a peer still owing (a total bound: a peer trickling bytes
   cannot stretch it). */
FSDP__PRIVATE int fsdp__sock_poll_set(fsdp_comm *comm, fsdp__sock *s, const fsdp_coll *c, size_t reduced, int *n,
                                      int *pending) {
    int64_t now = fsdp__now_ms();
    int i, p;
    *n = 0;
    for (i = 0; i < s->nact; i++) {
        fsdp__sock_peer *peer = &s->peers[p = s->act[i]];
        short events = 0;
        if (peer->fd < 0) /* the hierarchical layout links other ranks (fsdp__hier_links): a bug of fsdp.h */
            return fsdp_comm_fail(comm, FSDP_ERR_STATE, "rank %d has no connection to rank %d for %s (op #%llu)",
                                  comm->rank, p, fsdp_coll_name(c->kind), (unsigned long long)c->seq);
        if (peer->out_header_done < sizeof peer->out_header || peer->out_done < peer->out_len) events |= POLLOUT;
        if (peer->in_header_done < sizeof peer->in_header ||
            (peer->in_done < peer->in_len && (peer->in_direct || peer->in_done < reduced + s->ring_bytes)))
            events |= POLLIN;
        if (peer->in_done < peer->in_len || peer->in_header_done < sizeof peer->in_header) *pending = 1;
        if (events & POLLOUT) *pending = 1;
        if (!events) continue;
        if (now >= s->op_deadline) {
            if (!fsdp__load(&comm->lost_peer)) fsdp__store(&comm->lost_peer, p + 1);
            return fsdp_comm_fail(comm, FSDP_ERR_TIMEOUT,
                                  "rank %d waited %d ms for rank %d (%s) in %s (op #%llu): it has not %s (%zu of "
                                  "%zu bytes)",
                                  comm->rank, c->timeout_ms, p, peer->addr, fsdp_coll_name(c->kind),
                                  (unsigned long long)c->seq, (events & POLLIN) ? "sent all its data" : "read all of ours",
                                  (events & POLLIN) ? peer->in_done : peer->out_done,
                                  (events & POLLIN) ? peer->in_len : peer->out_len);
        }
        s->pfds[*n].fd = peer->fd;
        s->pfds[*n].events = events;
        s->pfds[*n].revents = 0;
        s->pfd_peer[(*n)++] = p;
    }
    return 0;
}

/* Waits for any of the n sockets: spins while peers usually answer within microseconds, then
   yields the core for a while (with more ranks than cores the rank we wait for may need it),
   then sleeps in poll, to the op's deadline at most; a peer of this host waiting for us
   meanwhile learns whom we wait for. poll's result. */
FSDP__PRIVATE int fsdp__sock_wait(fsdp__sock *s, int n) {
    int ready;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    ready = poll(s->pfds, (nfds_t)n, 0);
    if (ready == 0 && s->spin_seconds > 0) {
        double until = fsdp_now() + s->spin_seconds;
        while (ready == 0 && fsdp_now() < until) ready = poll(s->pfds, (nfds_t)n, 0);
    }
    if (ready == 0) {
        double until = fsdp_now() + 200e-6;
        while (ready == 0 && fsdp_now() < until) {
            sched_yield();
            ready = poll(s->pfds, (nfds_t)n, 0);
        }
    }
    if (ready == 0) {
        int64_t left = s->op_deadline - fsdp__now_ms();
        int i, waited = s->pfd_peer[0];
        for (i = n - 1; i >= 0; i--)
            if (s->pfds[i].events & POLLIN) waited = s->pfd_peer[i];
        fsdp__sock_note(s, waited);
        ready = poll(s->pfds, (nfds_t)n, left <= 0 ? 0 : left < 100 ? (int)left : 100);
    }
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    return ready;
}

/* Sends what peer p can take now: header and payload in one go, then the rest. (Under
   FSDP_CHAOS in pieces of any length, stopping now and then before the peer's data is gone.) */
FSDP__PRIVATE int fsdp__sock_send_some(fsdp_comm *comm, fsdp__sock *s, int p, const fsdp_coll *c,
                                       const fsdp__fingerprint *fp, uint32_t phase) {
    fsdp__sock_peer *peer = &s->peers[p];
    FSDP__CHAOS(FSDP__CHAOS_SOCKET);
    for (;;) {
        ssize_t got;
        if (peer->out_header_done < sizeof peer->out_header) {
            struct iovec iov[2];
            struct msghdr msg;
            size_t head_left = sizeof peer->out_header - peer->out_header_done;
            memset(&msg, 0, sizeof msg);
            iov[0].iov_base = (char *)&peer->out_header + peer->out_header_done;
            iov[0].iov_len = head_left;
            iov[1].iov_base = (void *)(uintptr_t)peer->out_data;
            iov[1].iov_len = peer->out_len;
            msg.msg_iov = iov;
            msg.msg_iovlen = peer->out_len ? 2 : 1;
            FSDP__CHAOS_CUT_IOV(iov, (int)msg.msg_iovlen);
            peer->at_boundary = 0;
            got = sendmsg(peer->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (got > 0) {
                size_t sent = (size_t)got;
                peer->out_header_done += sent < head_left ? sent : head_left;
                if (sent > head_left) {
                    peer->out_done += sent - head_left;
                    fsdp__count_sent(comm, p, sent - head_left);
                }
            }
        } else if (peer->out_done < peer->out_len) {
            got = send(peer->fd, peer->out_data + peer->out_done, FSDP__CHAOS_CUT(peer->out_len - peer->out_done),
                       MSG_NOSIGNAL | MSG_DONTWAIT);
            if (got > 0) {
                peer->out_done += (size_t)got;
                fsdp__count_sent(comm, p, (size_t)got);
            }
        } else {
            peer->at_boundary = 1;
            return 0;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        if (got <= 0) return fsdp__sock_lost(comm, s, p, c, fp, phase, errno);
        if (FSDP__CHAOS_COIN(FSDP__CHAOS_SOCKET)) return 0; /* (poll says when to go on) */
    }
}

/* Receives what peer p has sent: the header (checked before any payload is taken), then the
   payload, into place or into its ring while the ring has room (reduced bytes folded). */
FSDP__PRIVATE int fsdp__sock_recv_some(fsdp_comm *comm, fsdp__sock *s, int p, const fsdp_coll *c,
                                       const fsdp__fingerprint *fp, uint32_t phase, size_t reduced) {
    fsdp__sock_peer *peer = &s->peers[p];
    FSDP__CHAOS(FSDP__CHAOS_SOCKET);
    for (;;) {
        ssize_t got;
        if (peer->in_header_done < sizeof peer->in_header) {
            got = recv(peer->fd, (char *)&peer->in_header + peer->in_header_done,
                       FSDP__CHAOS_CUT(sizeof peer->in_header - peer->in_header_done), MSG_DONTWAIT);
            if (got > 0) {
                peer->in_header_done += (size_t)got;
                if (peer->in_header_done == sizeof peer->in_header) {
                    int rc = fsdp__sock_check_header(comm, s, p, c, fp, phase);
                    if (rc) return rc;
                }
            }
        } else if (peer->in_done < peer->in_len) {
            char *dst;
            size_t room;
            if (peer->in_direct) {
                dst = peer->in_direct + peer->in_done;
                room = peer->in_len - peer->in_done;
            } else {
                size_t at = peer->in_done % s->ring_bytes;
                if (peer->in_done >= reduced + s->ring_bytes) return 0; /* ring full: fold first */
                dst = peer->ring + at;
                room = s->ring_bytes - at;
                if (room > reduced + s->ring_bytes - peer->in_done) room = reduced + s->ring_bytes - peer->in_done;
                if (room > peer->in_len - peer->in_done) room = peer->in_len - peer->in_done;
            }
            got = recv(peer->fd, dst, FSDP__CHAOS_CUT(room), MSG_DONTWAIT);
            if (got > 0) peer->in_done += (size_t)got;
        } else {
            return 0;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        if (got <= 0) return fsdp__sock_lost(comm, s, p, c, fp, phase, got < 0 ? errno : 0);
        if (FSDP__CHAOS_COIN(FSDP__CHAOS_SOCKET)) return 0; /* (poll says when to go on) */
    }
}

/* 1 if the phase's reduction writes bytes this rank also sends in it: an all_reduce in place
   small enough for one phase sends its whole buffer and folds into it. Folded while a send of it
   is still under way (a full socket buffer, many peers, a slow one), the rest of that send would
   carry the partial sum instead of this rank's contribution: such a fold waits for the sends (it
   carries at most a segment, which the rings hold whole meanwhile). */
FSDP__PRIVATE int fsdp__sock_fold_overwrites(const fsdp__sock *s, const fsdp__sock_reduction *red) {
    int i;
    for (i = 0; i < s->nact; i++) {
        const fsdp__sock_peer *peer = &s->peers[s->act[i]];
        if (peer->out_len && red->dst < peer->out_data + peer->out_len && peer->out_data < red->dst + red->bytes) return 1;
    }
    return 0;
}

/* 1 once every header and payload of the phase has left this rank. */
FSDP__PRIVATE int fsdp__sock_all_sent(const fsdp__sock *s) {
    int i;
    for (i = 0; i < s->nact; i++) {
        const fsdp__sock_peer *peer = &s->peers[s->act[i]];
        if (peer->out_header_done < sizeof peer->out_header || peer->out_done < peer->out_len) return 0;
    }
    return 1;
}

/* Runs one phase's transfers: every active peer gets one header and its payload, and sends the
   same; received pieces of a reduction are folded as they arrive (or, where the fold overwrites
   what is sent, once it is sent). */
FSDP__PRIVATE int fsdp__sock_phase_io(fsdp_comm *comm, fsdp__sock *s, const fsdp_coll *c, uint32_t phase,
                                      const fsdp__sock_reduction *red) {
    const fsdp__fingerprint fp = fsdp__fingerprint_of(c);
    size_t reduced = 0;
    int p, i, rc, hold = red && red->dst && fsdp__sock_fold_overwrites(s, red);
    for (i = 0; i < s->nact; i++) {
        fsdp__sock_peer *peer = &s->peers[s->act[i]];
        memset(&peer->out_header, 0, sizeof peer->out_header);
        peer->out_header.magic = FSDP__SOCK_MAGIC;
        peer->out_header.phase = phase;
        peer->out_header.fp = fp;
        peer->out_header.payload = peer->out_len;
        peer->out_header_done = peer->out_done = peer->in_header_done = peer->in_done = 0;
    }
    for (;;) {
        int n = 0, pending = 0, ready;
        if (fsdp__load(&comm->status) != FSDP_SUCCESS) return fsdp__load(&comm->status);
        if (red && red->dst) pending = hold && !fsdp__sock_all_sent(s) ? 1 : fsdp__sock_fold(comm, s, c, red, &reduced);
        if ((rc = fsdp__sock_poll_set(comm, s, c, reduced, &n, &pending)) != 0) return rc;
        if (!pending) return 0;
        if (n == 0) continue; /* only folding left */
        ready = fsdp__sock_wait(s, n);
        if (ready < 0 && errno != EINTR) return fsdp_comm_fail(comm, FSDP_ERR_SYSTEM, "poll failed: %s", strerror(errno));
        if (ready <= 0) continue;
        for (i = 0; i < n; i++) {
            short rev = s->pfds[i].revents;
            p = s->pfd_peer[i];
            if ((rev & POLLOUT) && (rc = fsdp__sock_send_some(comm, s, p, c, &fp, phase)) != 0) return rc;
            if ((rev & (POLLIN | POLLHUP | POLLERR)) && (rc = fsdp__sock_recv_some(comm, s, p, c, &fp, phase, reduced)) != 0)
                return rc;
        }
    }
}

/* Sets peer p's send and receive for the next phase, and makes p take part in it (p is not
   this rank). Peers stay planned for the next phases until fsdp__sock_plan_none. */
static void fsdp__sock_plan(fsdp__sock *s, int p, const void *out, size_t out_len, void *in_direct, size_t in_len) {
    s->peers[p].out_data = (const char *)out;
    s->peers[p].out_len = out_len;
    s->peers[p].in_direct = (char *)in_direct;
    s->peers[p].in_len = in_len;
    if (!s->peers[p].active) s->act[s->nact++] = p;
    s->peers[p].active = 1;
}

/* Starts planning a phase between some of the ranks only: none takes part until planned. */
static void fsdp__sock_plan_none(fsdp__sock *s) {
    int i;
    for (i = 0; i < s->nact; i++) s->peers[s->act[i]].active = 0;
    s->nact = 0;
}

/* Starts an op: it must end by the communicator's timeout from now, however many phases. */
FSDP__PRIVATE int fsdp__sock_begin(fsdp__sock *s, const fsdp_coll *c) {
    fsdp__sock_running = s;
    s->op_deadline = fsdp__now_ms() + c->timeout_ms;
    return 0;
}

FSDP__PRIVATE int fsdp__sock_end(fsdp__sock *s, int rc) {
    (void)s;
    fsdp__sock_running = NULL;
    return rc;
}

FSDP__PRIVATE int fsdp__sock_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__sock *s = (fsdp__sock *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    char *recv = (char *)c->recv;
    int p;
    fsdp__sock_begin(s, c);
    for (p = 0; p < comm->world; p++)
        if (p != comm->rank) fsdp__sock_plan(s, p, c->send, bytes, recv + (size_t)p * bytes, bytes);
    if (recv + (size_t)comm->rank * bytes != (const char *)c->send) { /* the own block; the rest come in */
        fsdp__copy_out(recv + (size_t)comm->rank * bytes, c->send, bytes, bytes * (size_t)comm->world >= FSDP__STREAM_MIN_BYTES);
        fsdp__stream_fence();
    }
    return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 0, NULL));
}

FSDP__PRIVATE int fsdp__sock_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__sock *s = (fsdp__sock *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    const char *send = (const char *)c->send;
    fsdp__sock_reduction red;
    int p;
    memset(&red, 0, sizeof red);
    fsdp__sock_begin(s, c);
    for (p = 0; p < comm->world; p++)
        if (p != comm->rank) fsdp__sock_plan(s, p, send + (size_t)p * bytes, bytes, NULL, bytes);
    red.dst = (char *)c->recv;
    red.own = send + (size_t)comm->rank * bytes;
    red.bytes = bytes;
    return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 0, &red));
}

FSDP__PRIVATE int fsdp__sock_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__sock *s = (fsdp__sock *)impl;
    size_t esize = fsdp_dtype_size(c->dtype), n = c->count, share = (n + (size_t)comm->world - 1) / (size_t)comm->world;
    size_t my_at = (size_t)comm->rank * share < n ? (size_t)comm->rank * share : n;
    size_t my_len = n - my_at < share ? n - my_at : share;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv;
    fsdp__sock_reduction red;
    int p, rc;
    memset(&red, 0, sizeof red);
    fsdp__sock_begin(s, c);
    if (n * esize <= FSDP__SOCK_SEGMENT) { /* small: one phase, everyone folds the whole buffer */
        for (p = 0; p < comm->world; p++)
            if (p != comm->rank) fsdp__sock_plan(s, p, send, n * esize, NULL, n * esize);
        red.dst = recv;
        red.own = send;
        red.bytes = n * esize;
        return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 0, &red));
    }
    for (p = 0; p < comm->world; p++) { /* phase 0: everyone's slice to its owner, folded there */
        size_t at = (size_t)p * share < n ? (size_t)p * share : n, len = n - at < share ? n - at : share;
        if (p != comm->rank) fsdp__sock_plan(s, p, send + at * esize, len * esize, NULL, my_len * esize);
    }
    red.dst = recv + my_at * esize;
    red.own = send + my_at * esize;
    red.bytes = my_len * esize;
    rc = fsdp__sock_phase(comm, s, c, 0, &red);
    if (rc) return fsdp__sock_end(s, rc);
    for (p = 0; p < comm->world; p++) { /* phase 1: every folded slice to everyone */
        size_t at = (size_t)p * share < n ? (size_t)p * share : n, len = n - at < share ? n - at : share;
        if (p != comm->rank) fsdp__sock_plan(s, p, recv + my_at * esize, my_len * esize, recv + at * esize, len * esize);
    }
    return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 1, NULL));
}

FSDP__PRIVATE int fsdp__sock_broadcast(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__sock *s = (fsdp__sock *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    int p, root = c->root, me = comm->rank;
    fsdp__sock_begin(s, c);
    for (p = 0; p < comm->world; p++)
        if (p != me)
            fsdp__sock_plan(s, p, c->recv, me == root ? bytes : 0, p == root ? c->recv : NULL, p == root ? bytes : 0);
    return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 0, NULL));
}

FSDP__PRIVATE int fsdp__sock_barrier(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__sock *s = (fsdp__sock *)impl;
    int p;
    fsdp__sock_begin(s, c);
    for (p = 0; p < comm->world; p++)
        if (p != comm->rank) fsdp__sock_plan(s, p, NULL, 0, NULL, 0);
    return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 0, NULL));
}

/* Every peer's piece straight to it and every peer's piece for this rank straight into place, in
   one phase: a flat world links every pair of ranks. */
FSDP__PRIVATE int fsdp__sock_all_to_all(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__sock *s = (fsdp__sock *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv;
    int p, me = comm->rank;
    fsdp__sock_begin(s, c);
    for (p = 0; p < comm->world; p++)
        if (p != me) fsdp__sock_plan(s, p, send + (size_t)p * bytes, bytes, recv + (size_t)p * bytes, bytes);
    if (bytes)
        fsdp__copy_out(recv + (size_t)me * bytes, send + (size_t)me * bytes, bytes, bytes * (size_t)comm->world >= FSDP__STREAM_MIN_BYTES);
    fsdp__stream_fence();
    return fsdp__sock_end(s, fsdp__sock_phase(comm, s, c, 0, NULL));
}

/* --- the socket row ------------------------------------------------------------------------ */
FSDP__PRIVATE int fsdp__hier_setup(fsdp_comm *comm, fsdp_comm *host, int32_t step_wish); /* >>hier */

/* A socket world, made hierarchical where its ranks share hosts (>>hier). */
FSDP__PRIVATE int fsdp__sock_create(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__inherit *inherit) {
    fsdp__sock_shape shape;
    int rc = 0, listen_fd = -1;
    if (inherit) {
        listen_fd = inherit->listen_fd;
        inherit->listen_fd = -1;
    }
    memset(&shape, 0, sizeof shape);
    if (comm->world == 1) {
        if (listen_fd >= 0) close(listen_fd);
        return fsdp__comm_learn_topology(comm, 0);
    }
    if ((rc = fsdp__sock_init(comm, desc, listen_fd, &shape)) == 0 && (rc = fsdp__hier_setup(comm, shape.host, shape.step_wish)) != 0)
        fsdp__init_fail(&comm->logger, rc, "fsdp_comm_init: rank %d could not set up shared memory with its host: %s",
                        comm->rank, rc == FSDP_ERR_OUT_OF_MEMORY ? "out of memory" : comm->error);
    return rc;
}

/* A split of a socket world (net: its connections): the new group's rank 0 listens where its
   peers already reach it, and every rank of the parent learns where (collective over the
   parent, whether its own group is made of sockets or not). */
FSDP__PRIVATE int fsdp__sock_split_over(fsdp_comm *parent, const fsdp__sock *net, fsdp__split *sp, fsdp_comm **out) {
    int32_t mine[4] = {0, 0, 0, 0}, *all;
    char host[INET_ADDRSTRLEN] = "127.0.0.1";
    fsdp__inherit inherit;
    struct in_addr ip;
    int rc;
    memset(&inherit, 0, sizeof inherit);
    inherit.listen_fd = -1;
    if (!net) return fsdp__comm_create(out, &sp->desc, parent, NULL); /* a world of one */
    if (!(all = (int32_t *)FSDP_MALLOC(sizeof *all * 4 * (size_t)parent->world))) return FSDP_ERR_OUT_OF_MEMORY;
    if (sp->desc.backend == FSDP_BACKEND_SOCKET && sp->info.rank == 0 && sp->info.world_size > 1) {
        struct sockaddr_in at = net->local;
        socklen_t len = sizeof at;
        at.sin_port = 0;
        inherit.listen_fd = fsdp__sock_listen(&at, sp->info.world_size + 8);
        if (inherit.listen_fd < 0 || getsockname(inherit.listen_fd, (struct sockaddr *)&at, &len) != 0) {
            rc = fsdp_comm_fail(parent, FSDP_ERR_SYSTEM, "fsdp_comm_split: rank %d cannot listen: %s", parent->rank,
                                strerror(errno));
            if (inherit.listen_fd >= 0) close(inherit.listen_fd);
            FSDP_FREE(all);
            return rc;
        }
        memcpy(&mine[2], &at.sin_addr.s_addr, 4);
        mine[3] = ntohs(at.sin_port);
    }
    /* integers travel as f32 bit patterns: an all-gather only copies */
    rc = fsdp__collective_tagged(parent, FSDP_COLL_ALL_GATHER, mine, all, 4, FSDP_F32, FSDP_SUM, 0x5b118u);
    if (!rc) {
        memcpy(&ip.s_addr, &all[4 * sp->leader + 2], 4);
        inet_ntop(AF_INET, &ip, host, sizeof host);
        sp->desc.master_addr = host;
        sp->desc.master_port = all[4 * sp->leader + 3];
        rc = fsdp__comm_create(out, &sp->desc, parent, &inherit);
    }
    if (inherit.listen_fd >= 0) close(inherit.listen_fd);
    FSDP_FREE(all);
    return rc;
}

FSDP__PRIVATE int fsdp__sock_split(fsdp_comm *parent, fsdp__split *sp, fsdp_comm **out) {
    return fsdp__sock_split_over(parent, (const fsdp__sock *)parent->impl, sp, out);
}

static double *fsdp__sock_spin(const fsdp_comm *comm) { return &((fsdp__sock *)comm->impl)->spin_seconds; }

/* The environment's default when nothing else claims it: ranks over several hosts. */
static int fsdp__sock_env_claims(const fsdp_comm_desc *desc) {
    (void)desc;
    return 1;
}

/* MASTER_ADDR and MASTER_PORT (torchrun's), and under torchrun's static rendezvous the key in its
   agent's store (which holds MASTER_PORT) where rank 0 publishes where it listens. */
FSDP__PRIVATE int fsdp__sock_env_read(fsdp_comm_desc *desc, char *scratch, size_t scratch_size, char *err, size_t err_size) {
    const char *text = getenv("MASTER_ADDR"), *run_id = getenv("TORCHELASTIC_RUN_ID");
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    if (!text || !*text) text = desc->master_addr;
    if (!text || !*text) {
        fsdp__fmt(err, err_size, "environment variable MASTER_ADDR is not set (the address of rank 0's host)");
        return FSDP_ERR_ENV;
    }
    desc->master_addr = text;
    if ((text = getenv("TORCHELASTIC_USE_AGENT_STORE")) && strcmp(text, "True") == 0 && !desc->store_key) {
        fsdp__fmt(scratch, scratch_size, "/fsdp.h/rank0/%.40s/%.12s", run_id && *run_id ? run_id : "none",
                  restart && *restart ? restart : "0");
        desc->store_key = scratch;
    }
    if (!desc->master_port) {
        fsdp__fmt(err, err_size, "environment variable MASTER_PORT is not set (a free TCP port on rank 0's host)");
        return FSDP_ERR_ENV;
    }
    return 0;
}

/* fsdp_launch opens rank 0's listener on loopback before fork: the port is known to all. */
FSDP__PRIVATE int fsdp__sock_launch_prepare(fsdp__inherit *inherit, const fsdp_launch_desc *desc, char *err, size_t err_size) {
    struct sockaddr_in any;
    socklen_t len = sizeof any;
    if (desc->nprocs <= 1) return 0;
    memset(&any, 0, sizeof any);
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    inherit->listen_fd = fsdp__sock_listen(&any, desc->nprocs + 8);
    if (inherit->listen_fd < 0 || getsockname(inherit->listen_fd, (struct sockaddr *)&any, &len) != 0) {
        fsdp__fmt(err, err_size, "fsdp_launch: cannot listen on loopback: %s", strerror(errno));
        return FSDP_ERR_SYSTEM;
    }
    inherit->port = ntohs(any.sin_port);
    return 0;
}

static const fsdp__transport fsdp__sock_transport = {
    {"socket", fsdp__sock_all_gather, fsdp__sock_reduce_scatter, fsdp__sock_all_reduce, fsdp__sock_broadcast,
     fsdp__sock_barrier, fsdp__sock_abort, fsdp__sock_destroy, 0, NULL, fsdp__sock_all_to_all},
    FSDP_BACKEND_SOCKET, "socket", FSDP__CAP_ENV | FSDP__CAP_DEADLINE, FSDP__SOCK_MAX_WORLD,
    fsdp__sock_create, fsdp__sock_split, fsdp__sock_spin, NULL, NULL,
    fsdp__sock_env_claims, fsdp__sock_env_read, fsdp__sock_launch_prepare, NULL};

/* ============================================================================================
   >>hier
   A socket world whose ranks sit on several hosts, several to a host, numbered host by host:
   inside a host the ranks talk through shared memory (one shm comm per host), between hosts
   through the world's connections, and only what another host needs crosses a link, once.
   Host h holds ranks first[h] .. first[h] + size[h] - 1; rank (h, l) is its l-th.
     all_gather:     each rank sends its block to one rank of every other host, (g, l mod
                     size[g]) (as many ranks on every host, H >= 4 and H blocks up to 64 KiB:
                     among the ranks (h, l) in ceil(log2 H) rounds, Bruck's algorithm); then
                     every host shares what arrived: an in-place all_gather of a host's blocks
                     where the two hosts have as many ranks, else a broadcast per block, and an
                     all_gather of its own blocks.
     reduce_scatter: each host reduces, in shared memory, the blocks of every host (the partial
                     of block (g, k) lands on local rank k mod size) and sends each partial to
                     its block's rank, which folds the hosts' partials in host order.
     all_reduce:     (as many ranks on every host, large buffers) reduce-scatter inside the host,
                     reduce-scatter then all-gather among the ranks of one local index across the
                     hosts, all-gather inside the host; (else) all_reduce inside each host, the
                     hosts' first ranks all-gather the hosts' partials (H >= 4 and H partials up
                     to 64 KiB: in ceil(log2 H) rounds, Bruck's algorithm; else in one round, to
                     every host at once) and fold them, broadcast in the host.
     broadcast:      the root (g, l) sends to (h, l mod size[h]) of every other host h, which
                     broadcasts in its host.
     barrier:        inside the hosts, among their first ranks in ceil(log2 H) rounds (the
                     dissemination barrier), inside the hosts.
     all_to_all:     inside the host an all_to_all gives local rank l its host's pieces for l
                     and for every rank (h, k) of another host with k mod L = l; l sends each
                     such rank the L pieces as one message and gets from (h, l mod size[h])
                     host h's size[h] pieces for it, in place.
   Reduction order: inside a host in rank order, then the hosts' partials in host order,
   ((host 0) + (host 1)) + ..., 16-bit partials rounded to their dtype between the two levels.
   A layout gives the same bits on every run; a single host keeps the flat rank order.
   ============================================================================================ */
#define FSDP__HIER_SMALL ((size_t)64 * 1024) /* all_reduces up to this size take the short path */

/* A chunk for the net thread: bytes [at, at + len) of every block (all_reduce: of this rank's
   piece) of op c. */
typedef struct fsdp__hier_job {
    const fsdp_coll *c;
    size_t at, len;
} fsdp__hier_job;

typedef struct fsdp__hier {
    fsdp__sock *net;          /* the world's connections to every rank */
    fsdp_comm *local;         /* this host's ranks, over shared memory */
    int hosts, host;
    int *first, *size;        /* per host: its lowest rank, its number of ranks */
    int uniform;              /* every host has as many ranks */
    int *order;               /* scratch: fold orders */
    char *scratch;
    size_t scratch_bytes;
    /* the net thread (pipelined ops, see fsdp__hier_pipeline) */
    fsdp_comm *world;
    pthread_t thread;
    int thread_started, stop, busy, job_rc;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    fsdp__hier_job job;
    size_t piece;             /* all_reduce: elements of each local rank's piece */
    size_t step_bytes;        /* per pipeline step, the same on every rank; 0: one step per op */
} fsdp__hier;

/* The world fails because its host's shm comm did, with that comm's message. */
FSDP__PRIVATE int fsdp__hier_local_failed(fsdp_comm *comm, fsdp__hier *x) {
    const char *why = fsdp_comm_last_error(x->local);
    int code = fsdp_comm_status(x->local) ? fsdp_comm_status(x->local) : FSDP_ERR_ABORTED;
    int first = x->first[x->host], last = first + x->size[x->host] - 1;
    char where[96];
    fsdp__fmt(where, sizeof where, "on host %d (local ranks 0-%d are world ranks %d-%d)", x->host, last - first, first,
              last);
    return x->local->adopted ? fsdp__comm_adopt(comm, code, "%s: %s", where, why)
                             : fsdp_comm_fail(comm, code, "%s: %s", where, why);
}

/* A collective among this host's ranks, tagged like the world op it serves. */
#define FSDP__HIER_LOCAL(kind, send, recv, count, op)                                                            \
    do {                                                                                                         \
        if (fsdp__collective_tagged(x->local, (kind), (send), (recv), (count), c->dtype, (op), c->tag) != 0)     \
            return fsdp__sock_end(x->net, fsdp__hier_local_failed(comm, x));                                     \
    } while (0)
#define FSDP__HIER_NET(phase, red)                                                                               \
    do {                                                                                                         \
        int rc_ = fsdp__sock_phase(comm, x->net, c, (phase), (red));                                            \
        if (rc_) return fsdp__sock_end(x->net, rc_);                                                             \
    } while (0)

FSDP__PRIVATE int fsdp__hier_scratch(fsdp_comm *comm, fsdp__hier *x, size_t bytes) {
    if (bytes <= x->scratch_bytes) return 0;
    FSDP_FREE(x->scratch);
    x->scratch = (char *)FSDP_MALLOC(bytes);
    x->scratch_bytes = x->scratch ? bytes : 0;
    return x->scratch ? 0 : fsdp_comm_fail(comm, FSDP_ERR_OUT_OF_MEMORY, "no memory for %zu bytes of scratch", bytes);
}

/* How the two levels reduce: partials inside a host are plain sums (or maxima); AVG divides
   once, by the world size, when the hosts' partials are folded. */
static fsdp_reduce_op fsdp__hier_local_op(fsdp_reduce_op op) { return op == FSDP_MAX ? FSDP_MAX : FSDP_SUM; }

/* --- pipelining: the network half of a large op runs on the comm's net thread chunk by
   chunk, while the calling thread does the shared-memory half of the neighbouring chunks
   (both halves would otherwise wait for each other: a link is slower than memory). -------- */
#define FSDP__HIER_CHUNK ((size_t)2 << 20) /* bytes of a block (or piece) per pipeline step */
#define FSDP__HIER_STEP_MAX_MIB 1024        /* the largest FSDP_HIER_STEP_MIB */

/* Bytes per pipeline step of an op spanning `span` bytes per block (or piece), a multiple of
   esize: FSDP_HIER_STEP_MIB (default 2; 0: the whole op in one step), agreed at setup. Small
   steps hide the shared-memory half behind the network where the link is the bottleneck. Where
   TCP itself is CPU-bound on cores the ranks share, the overlapped halves only slow each other
   and one step is faster (BENCHMARKS.md, many hosts). */
static size_t fsdp__hier_step(const fsdp__hier *x, size_t span, size_t esize) {
    size_t step = x->step_bytes ? x->step_bytes / esize * esize : span;
    return step ? step : esize;
}

/* A strided collective among this host's ranks: rank p's block (all_gather's recv,
   reduce_scatter's send) starts p * stride bytes from the base. */
FSDP__PRIVATE int fsdp__hier_local_strided(fsdp_comm *comm, fsdp__hier *x, const fsdp_coll *c, fsdp_coll_kind kind,
                                           const void *send, void *recv, size_t count, size_t stride,
                                           fsdp_reduce_op op) {
    fsdp__shm *s = x->local->world > 1 ? (fsdp__shm *)x->local->impl : NULL;
    int rc;
    if (s) s->stride = stride;
    rc = fsdp__collective_tagged(x->local, kind, send, recv, count, c->dtype, op, c->tag);
    if (s) s->stride = 0;
    return rc ? fsdp__hier_local_failed(comm, x) : 0;
}

/* Share h of n elements split H ways, as bytes [*at, *at + *len). */
static void fsdp__share(size_t n, int H, int h, size_t esize, size_t *at, size_t *len) {
    size_t share = (n + (size_t)H - 1) / (size_t)H, first = (size_t)h * share < n ? (size_t)h * share : n;
    *at = first * esize;
    *len = (n - first < share ? n - first : share) * esize;
}

/* The network part of one chunk (on the net thread), for as many ranks on every host. */
FSDP__PRIVATE int fsdp__hier_run_job(fsdp_comm *comm, fsdp__hier *x, const fsdp__hier_job *job) {
    const fsdp_coll *c = job->c;
    size_t esize = fsdp_dtype_size(c->dtype), bytes = c->count * esize;
    int l = comm->local_rank, g = x->host, H = x->hosts, h, rc;
    fsdp__sock_reduction red;
    fsdp__sock_running = x->net; /* this thread writes to the sockets now */
    fsdp__sock_plan_none(x->net);
    memset(&red, 0, sizeof red);
    red.order = x->order;
    red.count = H;
    red.op = c->op;
    red.divisor = comm->world;
    for (h = 0; h < H; h++) x->order[h] = h == g ? comm->rank : x->first[h] + l;
    if (c->kind == FSDP_COLL_ALL_GATHER) { /* my block's chunk to (h, l); (h, l)'s chunk lands in place */
        char *recv = (char *)c->recv;
        for (h = 0; h < H; h++)
            if (h != g)
                fsdp__sock_plan(x->net, x->first[h] + l, (const char *)c->send + job->at, job->len,
                                recv + (size_t)(x->first[h] + l) * bytes + job->at, job->len);
        rc = fsdp__sock_phase(comm, x->net, c, 0, NULL);
    } else if (c->kind == FSDP_COLL_REDUCE_SCATTER) { /* partials out, my block's in, folded */
        for (h = 0; h < H; h++)
            if (h != g) fsdp__sock_plan(x->net, x->first[h] + l, x->scratch + (size_t)h * bytes + job->at, job->len, NULL, job->len);
        red.dst = (char *)c->recv + job->at;
        red.own = x->scratch + (size_t)g * bytes + job->at;
        red.bytes = job->len;
        rc = fsdp__sock_phase(comm, x->net, c, 0, &red);
    } else { /* all_reduce: reduce-scatter the chunk of my piece among (h, l), then all-gather it */
        char *chunk = (char *)c->recv + (size_t)l * x->piece * esize + job->at;
        size_t n = job->len / esize, my_at, my_len, at, len;
        fsdp__share(n, H, g, esize, &my_at, &my_len);
        for (h = 0; h < H; h++)
            if (h != g) {
                fsdp__share(n, H, h, esize, &at, &len);
                fsdp__sock_plan(x->net, x->first[h] + l, chunk + at, len, NULL, my_len);
            }
        red.dst = chunk + my_at;
        red.own = chunk + my_at;
        red.bytes = my_len;
        rc = fsdp__sock_phase(comm, x->net, c, 0, &red);
        if (!rc) {
            fsdp__sock_plan_none(x->net);
            for (h = 0; h < H; h++)
                if (h != g) {
                    fsdp__share(n, H, h, esize, &at, &len);
                    fsdp__sock_plan(x->net, x->first[h] + l, chunk + my_at, my_len, chunk + at, len);
                }
            rc = fsdp__sock_phase(comm, x->net, c, 1, NULL);
        }
    }
    fsdp__sock_running = NULL;
    return rc;
}

static void *fsdp__hier_thread(void *arg) {
    fsdp__hier *x = (fsdp__hier *)arg;
    pthread_mutex_lock(&x->lock);
    for (;;) {
        fsdp__hier_job job;
        int rc;
        while (!x->busy && !x->stop) pthread_cond_wait(&x->cond, &x->lock);
        if (x->stop) break;
        job = x->job;
        pthread_mutex_unlock(&x->lock);
        FSDP__CHAOS(FSDP__CHAOS_THREAD);
        rc = fsdp__hier_run_job(x->world, x, &job);
        FSDP__CHAOS(FSDP__CHAOS_THREAD);
        pthread_mutex_lock(&x->lock);
        x->job_rc = rc;
        x->busy = 0;
        pthread_cond_broadcast(&x->cond);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

/* Waits until the net thread is idle; the result of its last job. (Its phases end by the
   op's deadline, or at once when the comm fails.) */
FSDP__PRIVATE int fsdp__hier_wait(fsdp__hier *x) {
    int rc;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    pthread_mutex_lock(&x->lock);
    while (x->busy) pthread_cond_wait(&x->cond, &x->lock);
    rc = x->job_rc;
    pthread_mutex_unlock(&x->lock);
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    return rc;
}

/* Hands the net thread a chunk once its last one is done; that one's result. */
FSDP__PRIVATE int fsdp__hier_post(fsdp__hier *x, const fsdp_coll *c, size_t at, size_t len) {
    int rc;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    pthread_mutex_lock(&x->lock);
    while (x->busy) pthread_cond_wait(&x->cond, &x->lock);
    rc = x->job_rc;
    if (!rc) {
        x->job.c = c;
        x->job.at = at;
        x->job.len = len;
        x->busy = 1;
        pthread_cond_broadcast(&x->cond);
    }
    pthread_mutex_unlock(&x->lock);
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    return rc;
}

/* Runs a large op of a layout with as many ranks on every host as a pipeline over chunks of
   `span` bytes (of a block, or of this rank's piece): for chunk k the calling thread does the
   shared-memory work before the network (pre) and after it (post) while the net thread moves
   chunk k - 1 or k + 1. */
FSDP__PRIVATE int fsdp__hier_pipeline(fsdp_comm *comm, fsdp__hier *x, const fsdp_coll *c, size_t span) {
    size_t esize = fsdp_dtype_size(c->dtype), bytes = c->count * esize, chunk = fsdp__hier_step(x, span, esize);
    size_t chunks = (span + chunk - 1) / chunk, k, piece = x->piece * esize;
    int l = comm->local_rank, g = x->host, h, rc = 0, net_rc;
    char *recv = (char *)c->recv;
    const char *send = (const char *)c->send;
    x->net->op_deadline = fsdp__now_ms() + c->timeout_ms;
    x->job_rc = 0;
    for (k = 0; k <= chunks && !rc; k++) {
        size_t at = k * chunk, len = k < chunks ? (span - at < chunk ? span - at : chunk) : 0;
        size_t prev_at = at - chunk, prev_len = chunk;
        if (k < chunks) { /* the shared-memory work the network needs, then the network */
            if (c->kind == FSDP_COLL_REDUCE_SCATTER)
                for (h = 0; h < x->hosts && !rc; h++) /* every host's blocks: their partials over this host */
                    rc = fsdp__hier_local_strided(comm, x, c, FSDP_COLL_REDUCE_SCATTER, send + (size_t)x->first[h] * bytes + at,
                                                  x->scratch + (size_t)h * bytes + at, len / esize, bytes,
                                                  fsdp__hier_local_op(c->op));
            else if (c->kind == FSDP_COLL_ALL_REDUCE) /* this rank's piece of the chunk, over this host */
                rc = fsdp__hier_local_strided(comm, x, c, FSDP_COLL_REDUCE_SCATTER, send + at, recv + (size_t)l * piece + at,
                                              len / esize, piece, fsdp__hier_local_op(c->op));
            if (rc || (rc = fsdp__hier_post(x, c, at, len)) != 0) break;
        }
        if (k == 0 && c->kind == FSDP_COLL_ALL_GATHER) /* this host's blocks (mine too), meanwhile */
            rc = fsdp__hier_local_strided(comm, x, c, FSDP_COLL_ALL_GATHER, send, recv + (size_t)x->first[g] * bytes,
                                          c->count, 0, FSDP_SUM);
        if (k == 0 || rc) continue;
        if (k == chunks) { /* the last chunk's network part must be done */
            if ((rc = fsdp__hier_wait(x)) != 0) break;
            prev_len = span - prev_at;
        }
        /* the work after the network for the chunk before */
        if (c->kind == FSDP_COLL_ALL_GATHER) {
            for (h = 0; h < x->hosts && !rc; h++)
                if (h != g)
                    rc = fsdp__hier_local_strided(comm, x, c, FSDP_COLL_ALL_GATHER,
                                                  recv + (size_t)(x->first[h] + l) * bytes + prev_at,
                                                  recv + (size_t)x->first[h] * bytes + prev_at, prev_len / esize, bytes, FSDP_SUM);
        } else if (c->kind == FSDP_COLL_ALL_REDUCE) {
            rc = fsdp__hier_local_strided(comm, x, c, FSDP_COLL_ALL_GATHER, recv + (size_t)l * piece + prev_at,
                                          recv + prev_at, prev_len / esize, piece, FSDP_SUM);
        }
    }
    net_rc = fsdp__hier_wait(x); /* never leave the net thread on the caller's buffers */
    if (!rc) rc = net_rc;
    return rc ? fsdp__load(&comm->status) ? fsdp__load(&comm->status) : rc : 0;
}

/* Cross-host ops of a few bytes take ceil(log2 H) rounds instead of one round of H - 1
   messages per rank where that is fewer (H >= 4) and the bytes a rank gathers are at most
   FSDP__HIER_SMALL: deterministic for a layout and size, and the same bits either way. */
static int fsdp__hier_log_rounds(const fsdp__hier *x, size_t gathered) {
    return x->hosts >= 4 && gathered <= FSDP__HIER_SMALL;
}

/* Among the ranks of local index l of every host (this rank is one; every host has one): each
   one's `bytes` (this rank's at mine) to every one, into all (x->hosts slots; slot j: the bytes
   of host (host + j) mod H). In ceil(log2 H) rounds (Bruck's all-gather): in round k, at
   distance d = 2^k, a rank sends the min(d, H - d) slots it holds to its counterpart d hosts
   back and receives as many from the one d hosts on. */
FSDP__PRIVATE int fsdp__hier_bruck(fsdp_comm *comm, fsdp__hier *x, const fsdp_coll *c, int l, const char *mine, char *all,
                                   size_t bytes) {
    int H = x->hosts, g = x->host, d, round = 0, rc;
    memmove(all, mine, bytes);
    for (d = 1; d < H; d *= 2, round++) {
        size_t n = (size_t)(d < H - d ? d : H - d);
        int to = x->first[(g - d + H) % H] + l, from = x->first[(g + d) % H] + l;
        fsdp__sock_plan_none(x->net);
        fsdp__sock_plan(x->net, to, all, n * bytes, NULL, 0);
        if (!x->net->peers[from].active) fsdp__sock_plan(x->net, from, NULL, 0, NULL, 0);
        x->net->peers[from].in_direct = all + (size_t)d * bytes;
        x->net->peers[from].in_len = n * bytes;
        if ((rc = fsdp__sock_phase(comm, x->net, c, 4 + (uint32_t)round, NULL)) != 0) return rc;
    }
    return 0;
}

/* The network part of a hierarchical all_gather (the own block is in place): the blocks of the
   other hosts' ranks (h, k) with k mod L = l land in recv, in ceil(log2 H) rounds among the
   ranks (h, l) where fsdp__hier_log_rounds says so (as many ranks on every host), else in one
   round: this rank's block to (h, l mod size[h]) of every other host h. */
FSDP__PRIVATE int fsdp__hier_gather_net(fsdp_comm *comm, fsdp__hier *x, const fsdp_coll *c, char *recv, size_t bytes) {
    int me = comm->rank, l = comm->local_rank, g = x->host, L = x->size[g], H = x->hosts, h, k, rc;
    if (x->uniform && fsdp__hier_log_rounds(x, bytes * (size_t)H)) {
        if (fsdp__hier_scratch(comm, x, bytes * (size_t)H) != 0) return fsdp__load(&comm->status);
        if ((rc = fsdp__hier_bruck(comm, x, c, l, recv + (size_t)me * bytes, x->scratch, bytes)) != 0) return rc;
        for (k = 1; k < H; k++) memcpy(recv + (size_t)(x->first[(g + k) % H] + l) * bytes, x->scratch + (size_t)k * bytes, bytes);
        return 0;
    }
    fsdp__sock_plan_none(x->net);
    for (h = 0; h < H; h++) {
        if (h == g) continue;
        fsdp__sock_plan(x->net, x->first[h] + l % x->size[h], recv + (size_t)me * bytes, bytes, NULL, 0);
        for (k = l; k < x->size[h]; k += L) { /* the blocks of host h that land here */
            fsdp__sock_peer *peer = &x->net->peers[x->first[h] + k];
            if (!peer->active) fsdp__sock_plan(x->net, x->first[h] + k, NULL, 0, NULL, 0);
            peer->in_direct = recv + (size_t)(x->first[h] + k) * bytes;
            peer->in_len = bytes;
        }
    }
    return fsdp__sock_phase(comm, x->net, c, 0, NULL);
}

FSDP__PRIVATE int fsdp__hier_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__hier *x = (fsdp__hier *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    char *recv = (char *)c->recv;
    int me = comm->rank, l = comm->local_rank, g = x->host, L = x->size[g], h, k, rc;
    if (x->uniform && x->thread_started && bytes >= FSDP__HIER_CHUNK / 2) return fsdp__hier_pipeline(comm, x, c, bytes);
    fsdp__sock_begin(x->net, c);
    if (recv + (size_t)me * bytes != (const char *)c->send) memmove(recv + (size_t)me * bytes, c->send, bytes);
    if ((rc = fsdp__hier_gather_net(comm, x, c, recv, bytes)) != 0) return fsdp__sock_end(x->net, rc);
    for (h = 0; h < x->hosts && L > 1; h++) { /* every host shares what it holds */
        if (h == g || x->size[h] == L)
            FSDP__HIER_LOCAL(FSDP_COLL_ALL_GATHER, recv + (size_t)(x->first[h] + l) * bytes, recv + (size_t)x->first[h] * bytes,
                             c->count, FSDP_SUM);
        else
            for (k = 0; k < x->size[h]; k++) {
                fsdp_coll b = fsdp__coll(FSDP_COLL_BROADCAST, NULL, recv + (size_t)(x->first[h] + k) * bytes, c->count,
                                         c->dtype, FSDP_SUM, k % L);
                b.tag = c->tag;
                if (fsdp__collective(x->local, &b) != 0) return fsdp__sock_end(x->net, fsdp__hier_local_failed(comm, x));
            }
    }
    return fsdp__sock_end(x->net, 0);
}

FSDP__PRIVATE int fsdp__hier_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__hier *x = (fsdp__hier *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype), held = 0, slot, own = 0;
    const char *send = (const char *)c->send;
    int l = comm->local_rank, g = x->host, L = x->size[g], h, k;
    fsdp__sock_reduction red;
    for (h = 0; h < x->hosts; h++) held += (size_t)((x->size[h] - l + L - 1) / L); /* the partials this rank makes */
    /* (hosts of another size: one more slot, for the partials other ranks of this host keep) */
    if (fsdp__hier_scratch(comm, x, (held + !x->uniform) * bytes) != 0) return fsdp__load(&comm->status);
    if (x->uniform && x->thread_started && bytes >= FSDP__HIER_CHUNK / 2) /* slot h: host h's partial */
        return fsdp__hier_pipeline(comm, x, c, bytes);
    fsdp__sock_begin(x->net, c);
    /* inside the host: the partial of block (h, k) lands on local rank k mod L */
    for (h = 0, slot = 0; h < x->hosts; h++) {
        if (x->size[h] == L) {
            FSDP__HIER_LOCAL(FSDP_COLL_REDUCE_SCATTER, send + (size_t)x->first[h] * bytes, x->scratch + slot * bytes,
                             c->count, fsdp__hier_local_op(c->op));
            if (h == g) own = slot;
            slot++;
            continue;
        }
        for (k = 0; k < x->size[h]; k++) {
            char *to = x->scratch + (k % L == l ? slot++ : held) * bytes;
            FSDP__HIER_LOCAL(FSDP_COLL_ALL_REDUCE, send + (size_t)(x->first[h] + k) * bytes, to, c->count,
                             fsdp__hier_local_op(c->op));
        }
    }
    /* between hosts: each partial to its block's rank; this rank's block folded in host order */
    fsdp__sock_plan_none(x->net);
    for (h = 0, slot = 0; h < x->hosts; h++) {
        int from = x->first[h] + l % x->size[h];
        for (k = l; k < x->size[h]; k += L, slot++)
            if (h != g) fsdp__sock_plan(x->net, x->first[h] + k, x->scratch + slot * bytes, bytes, NULL, 0);
        x->order[h] = h == g ? comm->rank : from;
        if (h == g) continue;
        if (!x->net->peers[from].active) fsdp__sock_plan(x->net, from, NULL, 0, NULL, 0);
        x->net->peers[from].in_direct = NULL; /* into the ring, folded as it comes */
        x->net->peers[from].in_len = bytes;
    }
    memset(&red, 0, sizeof red);
    red.dst = (char *)c->recv;
    red.own = x->scratch + own * bytes;
    red.bytes = bytes;
    red.order = x->order;
    red.count = x->hosts;
    red.op = c->op;
    red.divisor = comm->world;
    FSDP__HIER_NET(0, &red);
    return fsdp__sock_end(x->net, 0);
}

/* all_reduce of count elements at recv (from send) by the short path: all_reduce inside the
   host into scratch, the hosts' partials to every host's first rank, which folds them into
   recv in host order, broadcast inside the host. The partials travel in log2(H) rounds
   (fsdp__hier_bruck) where fsdp__hier_log_rounds says so, else in one round to every host. */
FSDP__PRIVATE int fsdp__hier_all_reduce_short(fsdp_comm *comm, fsdp__hier *x, const fsdp_coll *c, const char *send,
                                              char *recv, size_t count) {
    size_t bytes = count * fsdp_dtype_size(c->dtype);
    int log_rounds = fsdp__hier_log_rounds(x, bytes * (size_t)x->hosts), h;
    fsdp__sock_reduction red;
    fsdp_coll b;
    if (!count) return 0;
    if (fsdp__hier_scratch(comm, x, bytes * (log_rounds ? (size_t)x->hosts + 1 : 1)) != 0) return fsdp__load(&comm->status);
    FSDP__HIER_LOCAL(FSDP_COLL_ALL_REDUCE, send, x->scratch, count, fsdp__hier_local_op(c->op));
    if (comm->local_rank == 0 && log_rounds) {
        const void **srcs = x->net->srcs;
        char *all = x->scratch + bytes;
        int rc = fsdp__hier_bruck(comm, x, c, 0, x->scratch, all, bytes);
        if (rc) return fsdp__sock_end(x->net, rc);
        for (h = 0; h < x->hosts; h++) srcs[h] = all + (size_t)((h - x->host + x->hosts) % x->hosts) * bytes;
        fsdp_reduce_ranks(recv, srcs, x->hosts, count, c->dtype, c->op, comm->world);
    } else if (comm->local_rank == 0) {
        fsdp__sock_plan_none(x->net);
        for (h = 0; h < x->hosts; h++) {
            x->order[h] = x->first[h];
            if (h != x->host) fsdp__sock_plan(x->net, x->first[h], x->scratch, bytes, NULL, bytes);
        }
        memset(&red, 0, sizeof red);
        red.dst = recv;
        red.own = x->scratch;
        red.bytes = bytes;
        red.order = x->order;
        red.count = x->hosts;
        red.op = c->op;
        red.divisor = comm->world;
        FSDP__HIER_NET(2, &red);
    }
    b = fsdp__coll(FSDP_COLL_BROADCAST, NULL, recv, count, c->dtype, FSDP_SUM, 0);
    b.tag = c->tag;
    if (fsdp__collective(x->local, &b) != 0) return fsdp__sock_end(x->net, fsdp__hier_local_failed(comm, x));
    return 0;
}

FSDP__PRIVATE int fsdp__hier_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__hier *x = (fsdp__hier *)impl;
    size_t esize = fsdp_dtype_size(c->dtype), n = c->count, q, share, at, len;
    int l = comm->local_rank, g = x->host, L = x->size[g], H = x->hosts, h, rc;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv, *mine;
    fsdp__sock_reduction red;
    q = x->uniform && n * esize >= FSDP__HIER_SMALL ? n / (size_t)L : 0; /* elements per local rank; the rest short */
    if (q && x->thread_started && q * esize >= FSDP__HIER_CHUNK / 2) {
        x->piece = q;
        if ((rc = fsdp__hier_pipeline(comm, x, c, q * esize)) != 0) return rc;
        fsdp__sock_begin(x->net, c);
        rc = fsdp__hier_all_reduce_short(comm, x, c, send + (size_t)L * q * esize, recv + (size_t)L * q * esize,
                                         n - (size_t)L * q);
        return fsdp__sock_end(x->net, rc);
    }
    fsdp__sock_begin(x->net, c);
    if (q) {
        /* inside the host: local rank l gets its host's partial of piece l, [l*q, (l+1)*q) */
        mine = recv + (size_t)l * q * esize;
        FSDP__HIER_LOCAL(FSDP_COLL_REDUCE_SCATTER, send, mine, q, fsdp__hier_local_op(c->op));
        /* across hosts, among the ranks (h, l): reduce-scatter of piece l into H shares, folded
           in host order, then all-gather of the shares */
        share = (q + (size_t)H - 1) / (size_t)H;
        fsdp__sock_plan_none(x->net);
        for (h = 0; h < H; h++) {
            at = (size_t)h * share < q ? (size_t)h * share : q;
            len = q - at < share ? q - at : share;
            x->order[h] = x->first[h] + l;
            if (h != g) fsdp__sock_plan(x->net, x->first[h] + l, mine + at * esize, len * esize, NULL, 0);
        }
        at = (size_t)g * share < q ? (size_t)g * share : q;
        len = q - at < share ? q - at : share;
        for (h = 0; h < H; h++)
            if (h != g) x->net->peers[x->first[h] + l].in_len = len * esize;
        memset(&red, 0, sizeof red);
        red.dst = mine + at * esize;
        red.own = mine + at * esize;
        red.bytes = len * esize;
        red.order = x->order;
        red.count = H;
        red.op = c->op;
        red.divisor = comm->world;
        FSDP__HIER_NET(0, &red);
        fsdp__sock_plan_none(x->net);
        for (h = 0; h < H; h++) {
            size_t their_at = (size_t)h * share < q ? (size_t)h * share : q, their_len = q - their_at < share ? q - their_at : share;
            if (h != g)
                fsdp__sock_plan(x->net, x->first[h] + l, mine + at * esize, len * esize, mine + their_at * esize,
                                their_len * esize);
        }
        FSDP__HIER_NET(1, NULL);
        /* inside the host: everyone gets every piece */
        FSDP__HIER_LOCAL(FSDP_COLL_ALL_GATHER, mine, recv, q, FSDP_SUM);
    }
    rc = fsdp__hier_all_reduce_short(comm, x, c, send + (size_t)L * q * esize, recv + (size_t)L * q * esize,
                                     n - (size_t)L * q);
    return fsdp__sock_end(x->net, rc);
}

FSDP__PRIVATE int fsdp__hier_broadcast(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__hier *x = (fsdp__hier *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    int root = c->root, root_host = comm->host_of[root], lr = root - x->first[root_host], h;
    int here = x->host == root_host ? lr : lr % x->size[x->host]; /* the local rank that holds the data first */
    fsdp_coll b;
    fsdp__sock_begin(x->net, c);
    if (comm->local_rank == here) {
        fsdp__sock_plan_none(x->net);
        if (comm->rank == root) {
            for (h = 0; h < x->hosts; h++)
                if (h != root_host) fsdp__sock_plan(x->net, x->first[h] + lr % x->size[h], c->recv, bytes, NULL, 0);
        } else {
            fsdp__sock_plan(x->net, root, NULL, 0, c->recv, bytes);
        }
        FSDP__HIER_NET(0, NULL);
    }
    b = fsdp__coll(FSDP_COLL_BROADCAST, NULL, c->recv, c->count, c->dtype, FSDP_SUM, here);
    b.tag = c->tag;
    if (fsdp__collective(x->local, &b) != 0) return fsdp__sock_end(x->net, fsdp__hier_local_failed(comm, x));
    return fsdp__sock_end(x->net, 0);
}

/* A barrier: inside the host, among the hosts' first ranks in ceil(log2 H) rounds (the
   dissemination barrier: in round k each tells the first rank 2^k hosts on and hears from the
   one 2^k hosts back), inside the host. */
FSDP__PRIVATE int fsdp__hier_barrier(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__hier *x = (fsdp__hier *)impl;
    int H = x->hosts, g = x->host, d, round = 0;
    fsdp__sock_begin(x->net, c);
    FSDP__HIER_LOCAL(FSDP_COLL_BARRIER, NULL, NULL, 0, FSDP_SUM);
    for (d = 1; comm->local_rank == 0 && d < H; d *= 2, round++) {
        int to = x->first[(g + d) % H], from = x->first[(g - d + H) % H];
        fsdp__sock_plan_none(x->net);
        fsdp__sock_plan(x->net, to, NULL, 0, NULL, 0);
        if (!x->net->peers[from].active) fsdp__sock_plan(x->net, from, NULL, 0, NULL, 0);
        FSDP__HIER_NET(4 + (uint32_t)round, NULL);
    }
    FSDP__HIER_LOCAL(FSDP_COLL_BARRIER, NULL, NULL, 0, FSDP_SUM);
    return fsdp__sock_end(x->net, 0);
}

/* The j-th rank to which local rank lr of this host (of L ranks) hands pieces in an all_to_all:
   j = 0 its own rank, then host by host the ranks (h, k) of the other hosts with k mod L = lr;
   -1 past the end of its list. */
static int fsdp__hier_a2a_dest(const fsdp__hier *x, int lr, size_t j) {
    int L = x->size[x->host], h, n;
    if (j == 0) return x->first[x->host] + lr;
    for (h = 0; h < x->hosts; h++) {
        if (h == x->host) continue;
        n = lr < x->size[h] ? (x->size[h] - lr + L - 1) / L : 0;
        if (j <= (size_t)n) return x->first[h] + lr + (int)(j - 1) * L;
        j -= (size_t)n;
    }
    return -1;
}

/* The network half of an all_to_all: this rank (g, l) sends each rank of fsdp__hier_a2a_dest's
   list past its own its host's L pieces for it (bundle j - 1 of `bundles`, L pieces of `bytes`
   in local rank order), and receives from (h, l mod size[h]) of every other host h the size[h]
   pieces host h has for it, straight into their place in recv. Only linked pairs talk
   (fsdp__hier_links: k mod L = l one way, l mod size[h] = k the other). */
FSDP__PRIVATE int fsdp__hier_a2a_net(fsdp_comm *comm, fsdp__hier *x, const fsdp_coll *c, const char *bundles, size_t slots,
                                     size_t bytes) {
    int g = x->host, L = x->size[g], l = comm->local_rank, h, from;
    size_t j;
    char *recv = (char *)c->recv;
    fsdp__sock_plan_none(x->net);
    for (j = 1; j < slots; j++) {
        int to = fsdp__hier_a2a_dest(x, l, j);
        if (to >= 0) fsdp__sock_plan(x->net, to, bundles + (j - 1) * (size_t)L * bytes, (size_t)L * bytes, NULL, 0);
    }
    for (h = 0; h < x->hosts; h++) {
        if (h == g) continue;
        from = x->first[h] + l % x->size[h];
        if (!x->net->peers[from].active) fsdp__sock_plan(x->net, from, NULL, 0, NULL, 0);
        x->net->peers[from].in_direct = recv + (size_t)x->first[h] * bytes;
        x->net->peers[from].in_len = (size_t)x->size[h] * bytes;
    }
    return fsdp__sock_phase(comm, x->net, c, 0, NULL);
}

/* all_to_all: every local rank packs, for each local rank lr, its pieces for lr's list
   (fsdp__hier_a2a_dest; slots per list, the longest list's length, shorter ones padded); an
   all_to_all inside the host hands each rank its column, whose first slot holds this host's
   pieces for it; the others become one message per rank of another host (fsdp__hier_a2a_net). */
FSDP__PRIVATE int fsdp__hier_all_to_all(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__hier *x = (fsdp__hier *)impl;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype), slots = 1, j;
    int g = x->host, L = x->size[g], h, lr, to, rc;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv, *pack, *got;
    for (h = 0; h < x->hosts; h++)
        if (h != g) slots += (size_t)((x->size[h] + L - 1) / L);
    if (fsdp__hier_scratch(comm, x, 2 * (size_t)L * slots * bytes + 1) != 0) return fsdp__load(&comm->status);
    pack = x->scratch;
    got = pack + (size_t)L * slots * bytes;
    fsdp__sock_begin(x->net, c);
    for (lr = 0; lr < L; lr++)
        for (j = 0; j < slots && (to = fsdp__hier_a2a_dest(x, lr, j)) >= 0; j++)
            memcpy(pack + ((size_t)lr * slots + j) * bytes, send + (size_t)to * bytes, bytes);
    FSDP__HIER_LOCAL(FSDP_COLL_ALL_TO_ALL, pack, got, slots * c->count, FSDP_SUM);
    for (lr = 0; lr < L; lr++) { /* got[lr][j]: local rank lr's piece for my j-th rank */
        memcpy(recv + (size_t)(x->first[g] + lr) * bytes, got + (size_t)lr * slots * bytes, bytes);
        for (j = 1; j < slots; j++) /* bundle j - 1, in pack (read by now) */
            memcpy(pack + ((j - 1) * (size_t)L + (size_t)lr) * bytes, got + ((size_t)lr * slots + j) * bytes, bytes);
    }
    rc = fsdp__hier_a2a_net(comm, x, c, pack, slots, bytes);
    return fsdp__sock_end(x->net, rc);
}

/* The world failed: its sockets shut (peers learn at once), and this host's ranks too. */
FSDP__PRIVATE void fsdp__hier_abort(fsdp_comm *comm, void *impl) {
    fsdp__hier *x = (fsdp__hier *)impl;
    if (!x) return;
    fsdp__sock_abort(comm, x->net);
    if (x->local) fsdp__comm_adopt(x->local, FSDP_ERR_ABORTED, "%s", comm->error);
}

FSDP__PRIVATE void fsdp__hier_free(fsdp__hier *x, int world) {
    if (!x) return;
    if (x->thread_started) fsdp__thread_stop(x->thread, &x->lock, &x->cond, &x->stop);
    pthread_mutex_destroy(&x->lock);
    pthread_cond_destroy(&x->cond);
    if (x->net) x->net->wait_note = NULL; /* it was in x->local's segment */
    fsdp_comm_destroy(x->local);
    fsdp__sock_free(x->net, world);
    FSDP_FREE(x->first);
    FSDP_FREE(x->size);
    FSDP_FREE(x->order);
    FSDP_FREE(x->scratch);
    FSDP_FREE(x);
}

FSDP__PRIVATE void fsdp__hier_destroy(fsdp_comm *comm, void *impl) { fsdp__hier_free((fsdp__hier *)impl, comm->world); }

/* --- the hierarchical row: a socket comm over hosts (made by fsdp__hier_setup) ------------- */
FSDP__PRIVATE int fsdp__hier_split(fsdp_comm *parent, fsdp__split *sp, fsdp_comm **out) {
    return fsdp__sock_split_over(parent, ((const fsdp__hier *)parent->impl)->net, sp, out);
}

static double *fsdp__hier_spin(const fsdp_comm *comm) { return &((fsdp__hier *)comm->impl)->net->spin_seconds; }

static fsdp_comm *fsdp__hier_host_part(const fsdp_comm *comm) {
    return comm->impl ? ((const fsdp__hier *)comm->impl)->local : NULL;
}

static const fsdp__transport fsdp__hier_transport = {
    {"socket+shm", fsdp__hier_all_gather, fsdp__hier_reduce_scatter, fsdp__hier_all_reduce, fsdp__hier_broadcast,
     fsdp__hier_barrier, fsdp__hier_abort, fsdp__hier_destroy, 0, NULL, fsdp__hier_all_to_all},
    FSDP_BACKEND_SOCKET, "socket", FSDP__CAP_DEADLINE, FSDP__SOCK_MAX_WORLD,
    NULL, fsdp__hier_split, fsdp__hier_spin, fsdp__hier_host_part, NULL, NULL, NULL, NULL, NULL};

/* The connections of a comm made of sockets (a socket world, or a hierarchical one's links), or
   NULL. */
static fsdp__sock *fsdp__comm_sock(const fsdp_comm *comm) {
    if (comm->transport == &fsdp__sock_transport) return (fsdp__sock *)comm->impl;
    return comm->transport == &fsdp__hier_transport && comm->impl ? ((fsdp__hier *)comm->impl)->net : NULL;
}

/* This rank's address as its peers reach it (port 0), for a listener of its own: 0, or -1 for a
   comm not made of sockets. */
FSDP__PRIVATE int fsdp__comm_local_addr(const fsdp_comm *comm, struct sockaddr_in *addr) {
    const fsdp__sock *s = fsdp__comm_sock(comm);
    if (!s) return -1;
    *addr = s->local;
    addr->sin_port = 0;
    return 0;
}

/* Lets the kernel find a peer host that vanished (powered off, cut off: nothing is sent, no
   reset comes) within about detect_ms, where an op would wait out its timeout: keepalive probes
   on every connection of comm (a socket world, or a hierarchical one's links) to another host,
   and TCP_USER_TIMEOUT, which bounds both the probes and data left unacknowledged. A broken link
   then fails the op as a reset does (FSDP_ERR_PEER_LOST, "Connection timed out"). The kernel of
   a live host answers for its processes, so a stopped or slow process is not taken for lost:
   only the op timeout finds it (>>recovery). Other transports: nothing to do. 0, or -1 with
   errno where the kernel refused an option. */
FSDP__PRIVATE int fsdp__comm_watch(fsdp_comm *comm, int detect_ms) {
    fsdp__sock *s = fsdp__comm_sock(comm);
    int p, one = 1, idle_s = detect_ms / 2000 > 0 ? detect_ms / 2000 : 1, interval_s = 1, probes;
    unsigned int user_timeout = (unsigned int)detect_ms;
    probes = detect_ms / 1000 > 0 ? detect_ms / 1000 : 1;
    for (p = 0; s && p < comm->world; p++) {
        int fd = s->peers[p].fd;
        if (p == comm->rank || fd < 0 || !comm->host_of || comm->host_of[p] == comm->host) continue;
        if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout) != 0)
            return -1;
    }
    return 0;
}

/* This host's shm comm for a hierarchical world (NULL where it cannot be made: the caller says
   why). A host of one rank has a comm of one, without a segment. */
FSDP__PRIVATE fsdp_comm *fsdp__hier_host_comm(fsdp_comm *comm, const fsdp_comm_desc *desc) {
    fsdp_comm_desc ld;
    fsdp_comm *local = NULL;
    char job[64];
    memset(&ld, 0, sizeof ld);
    ld.backend = FSDP_BACKEND_SHM;
    ld.rank = comm->local_rank;
    ld.world_size = comm->local_world;
    ld.timeout_ms = comm->timeout_ms;
    ld.logger = comm->logger;
    ld.shm_slot_bytes = desc->shm_slot_bytes;
    ld.shm_single_copy = desc->shm_single_copy;
    fsdp__fmt(job, sizeof job, "%.16s.host%d", comm->job, comm->host);
    ld.job = job;
    if (comm->local_world > 1 && !fsdp__shm_fits(comm->local_world, desc->shm_slot_bytes, fsdp__shm_free_mib())) {
        fsdp__copy_string(fsdp__init_error, sizeof fsdp__init_error, "too little free space in /dev/shm");
        return NULL;
    }
    if (fsdp__comm_create(&local, &ld, comm, NULL) != 0) return NULL;
    local->tally->inner = 1; /* its ops are parts of the world's */
    return local;
}

/* The pipeline step this rank asks for (FSDP_HIER_STEP_MIB, in MiB) as a wish the ranks agree
   on by taking the smallest: 0 (one step per op) is the largest, INT32_MAX. */
FSDP__PRIVATE int32_t fsdp__hier_step_wish(fsdp_comm *comm) {
    const long default_mib = (long)(FSDP__HIER_CHUNK >> 20);
    const char *const step_vars[] = {"FSDP_HIER_STEP_MIB", NULL};
    long step_mib = default_mib;
    char err[160];
    if (fsdp__env_int(step_vars, 0, FSDP__HIER_STEP_MAX_MIB, &step_mib, err, sizeof err) < 0) {
        fsdp__log(&comm->logger, FSDP_LOG_WARN, "socket: rank %d: %s; pipeline steps of %ld MiB", comm->rank, err,
                  default_mib);
        step_mib = default_mib;
    }
    return step_mib ? (int32_t)step_mib : INT32_MAX;
}

/* The ranks of other hosts this rank exchanges data with in the hierarchical algorithms:
   linked[p] = 1 for rank (h, k) of host h (of S ranks), this rank being (g, l) of a host of L,
   where k = l mod S or l = k mod L (as many ranks on every host: k = l); 0 for every other
   rank, this host's too. */
FSDP__PRIVATE void fsdp__hier_links(const fsdp_comm *comm, unsigned char *linked) {
    int p, first = 0, S = 0, L = comm->local_world, l = comm->local_rank;
    for (p = 0; p < comm->world; p++) {
        int h = comm->host_of[p], k;
        if (p == 0 || h != comm->host_of[p - 1]) /* a host's first rank (numbered host by host): its size */
            for (first = p, S = 0; first + S < comm->world && comm->host_of[first + S] == h; S++) {
            }
        k = p - first;
        linked[p] = h != comm->host && (k == l % S || l == k % L);
    }
}

/* Makes a socket world hierarchical where fsdp__sock_init found it so (host: this host's shm
   comm, step_wish: the agreed fsdp__hier_step_wish), else it stays flat (ranks not numbered
   host by host, a host without shared memory, FSDP_HIERARCHICAL=0). Takes ownership of host. */
FSDP__PRIVATE int fsdp__hier_setup(fsdp_comm *comm, fsdp_comm *host, int32_t step_wish) {
    fsdp__hier *x;
    fsdp_comm *local = host;
    int r;
    if (!comm->two_level || !local) {
        fsdp_comm_destroy(local);
        if (comm->rank == 0 && comm->num_hosts > 1 && comm->num_hosts < comm->world && !fsdp__host_by_host(comm))
            fsdp__log(&comm->logger, FSDP_LOG_INFO, "socket: the ranks are not numbered host by host: every byte "
                      "goes over sockets, also between ranks of one host");
        return 0;
    }
    if (!(x = (fsdp__hier *)fsdp__calloc(sizeof *x))) {
        fsdp_comm_destroy(local);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->cond, NULL);
    x->local = local;
    x->net = (fsdp__sock *)comm->impl;
    x->hosts = comm->num_hosts;
    x->host = comm->host;
    x->first = (int *)fsdp__calloc(sizeof(int) * (size_t)x->hosts);
    x->size = (int *)fsdp__calloc(sizeof(int) * (size_t)x->hosts);
    x->order = (int *)fsdp__calloc(sizeof(int) * (size_t)x->hosts);
    if (!x->first || !x->size || !x->order) {
        x->net = NULL;
        fsdp__hier_free(x, comm->world);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    for (r = comm->world - 1; r >= 0; r--) {
        x->first[comm->host_of[r]] = r;
        x->size[comm->host_of[r]]++;
    }
    x->uniform = 1;
    x->step_bytes = step_wish >= 1 && step_wish <= FSDP__HIER_STEP_MAX_MIB ? (size_t)step_wish << 20 : 0;
    for (r = 1; r < x->hosts; r++) x->uniform &= x->size[r] == x->size[0];
    x->world = comm;
    if (local->world > 1) /* (a host of one rank has no segment) */
        x->net->wait_note = &fsdp__shm_peer((fsdp__shm *)local->impl, local->rank)->waiting_for;
    x->thread_started = pthread_create(&x->thread, NULL, fsdp__hier_thread, x) == 0; /* else: not pipelined */
    comm->impl = x;
    comm->transport = &fsdp__hier_transport;
    comm->backend = &fsdp__hier_transport.ops;
    return 0;
}

/* ============================================================================================
   >>mpi
   The bridge to an existing cluster engine (Open MPI, MPICH; launched by mpirun or srun).
   Ops are issued non-blocking and polled, so the timeout holds; reductions are done as an
   all-to-all of the pieces followed by the library's rank-order fold, so results are bitwise
   equal to the other backends'. MPI must already be initialised, or fsdp_comm_init calls
   MPI_Init_thread itself (and MPI_Finalize at destroy).
   ============================================================================================ */
#ifdef FSDP_WITH_MPI
typedef struct fsdp__mpi {
    MPI_Comm comm;
    int finalize;
    char *scratch;
    size_t scratch_bytes;
} fsdp__mpi;

FSDP__PRIVATE int fsdp__mpi_wait(fsdp_comm *comm, MPI_Request *req, const fsdp_coll *c) {
    int64_t deadline = fsdp__now_ms() + c->timeout_ms;
    int done = 0, spins = 0;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    for (;;) {
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return fsdp_comm_fail(comm, FSDP_ERR_PEER_LOST, "MPI reported an error in %s (op #%llu)",
                                  fsdp_coll_name(c->kind), (unsigned long long)c->seq);
        if (done) {
            FSDP__CHAOS(FSDP__CHAOS_WAIT);
            return 0;
        }
        if (fsdp__load(&comm->status) != FSDP_SUCCESS) return fsdp__load(&comm->status);
        if (++spins > 1000) {
            if (fsdp__now_ms() >= deadline)
                return fsdp_comm_fail(comm, FSDP_ERR_TIMEOUT,
                                      "rank %d waited %d ms in MPI %s (op #%llu); another rank did not join",
                                      comm->rank, c->timeout_ms, fsdp_coll_name(c->kind), (unsigned long long)c->seq);
            sched_yield();
        }
    }
}

FSDP__PRIVATE int fsdp__mpi_scratch(fsdp_comm *comm, fsdp__mpi *m, size_t bytes) {
    if (bytes <= m->scratch_bytes) return 0;
    FSDP_FREE(m->scratch);
    m->scratch = (char *)FSDP_MALLOC(bytes);
    m->scratch_bytes = m->scratch ? bytes : 0;
    return m->scratch ? 0 : fsdp_comm_fail(comm, FSDP_ERR_OUT_OF_MEMORY, "MPI bridge: no memory for %zu bytes", bytes);
}

FSDP__PRIVATE int fsdp__mpi_all_gather(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    MPI_Request req;
    int bytes = (int)(c->count * fsdp_dtype_size(c->dtype));
    if (c->count * fsdp_dtype_size(c->dtype) > 0x7fffffff)
        return fsdp_comm_fail(comm, FSDP_ERR_UNSUPPORTED, "MPI bridge: pieces above 2 GiB are not supported");
    MPI_Iallgather((const char *)c->recv + (size_t)comm->rank * (size_t)bytes == c->send ? MPI_IN_PLACE : c->send,
                   bytes, MPI_BYTE, c->recv, bytes, MPI_BYTE, m->comm, &req);
    return fsdp__mpi_wait(comm, &req, c);
}

/* Each rank's piece for owner p goes to p; the owner folds the pieces in rank order. */
FSDP__PRIVATE int fsdp__mpi_reduce_scatter(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    MPI_Request req;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    const void *srcs[FSDP__MAX_WORLD];
    int p, rc;
    if (bytes > 0x7fffffff) return fsdp_comm_fail(comm, FSDP_ERR_UNSUPPORTED, "MPI bridge: pieces above 2 GiB are not supported");
    if ((rc = fsdp__mpi_scratch(comm, m, bytes * (size_t)(comm->world + comm->num_hosts))) != 0) return rc;
    MPI_Ialltoall(c->send, (int)bytes, MPI_BYTE, m->scratch, (int)bytes, MPI_BYTE, m->comm, &req);
    if ((rc = fsdp__mpi_wait(comm, &req, c)) != 0) return rc;
    for (p = 0; p < comm->world; p++) srcs[p] = m->scratch + (size_t)p * bytes;
    fsdp__reduce_layout(comm, c->recv, srcs, c->count, c->dtype, c->op, m->scratch + (size_t)comm->world * bytes);
    return 0;
}

FSDP__PRIVATE int fsdp__mpi_all_reduce(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    MPI_Request req;
    size_t esize = fsdp_dtype_size(c->dtype), share = (c->count + (size_t)comm->world - 1) / (size_t)comm->world;
    size_t padded = share * (size_t)comm->world * esize, piece = share * esize;
    const void *srcs[FSDP__MAX_WORLD];
    char *in, *mine;
    int p, rc;
    if (piece > 0x7fffffff) return fsdp_comm_fail(comm, FSDP_ERR_UNSUPPORTED, "MPI bridge: pieces above 2 GiB are not supported");
    if ((rc = fsdp__mpi_scratch(comm, m, padded * 2 + piece * (size_t)(1 + comm->num_hosts))) != 0) return rc;
    in = m->scratch + padded + piece;
    memset(in, 0, padded);
    memcpy(in, c->send, c->count * esize); /* padded to P equal pieces */
    MPI_Ialltoall(in, (int)piece, MPI_BYTE, m->scratch, (int)piece, MPI_BYTE, m->comm, &req);
    if ((rc = fsdp__mpi_wait(comm, &req, c)) != 0) return rc;
    mine = m->scratch + padded;
    for (p = 0; p < comm->world; p++) srcs[p] = m->scratch + (size_t)p * piece;
    fsdp__reduce_layout(comm, mine, srcs, share, c->dtype, c->op, m->scratch + padded * 2 + piece);
    MPI_Iallgather(mine, (int)piece, MPI_BYTE, in, (int)piece, MPI_BYTE, m->comm, &req);
    if ((rc = fsdp__mpi_wait(comm, &req, c)) != 0) return rc;
    memcpy(c->recv, in, c->count * esize);
    return 0;
}

FSDP__PRIVATE int fsdp__mpi_broadcast(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    MPI_Request req;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    if (bytes > 0x7fffffff) return fsdp_comm_fail(comm, FSDP_ERR_UNSUPPORTED, "MPI bridge: broadcasts above 2 GiB are not supported");
    MPI_Ibcast(c->recv, (int)bytes, MPI_BYTE, c->root, m->comm, &req);
    return fsdp__mpi_wait(comm, &req, c);
}

FSDP__PRIVATE int fsdp__mpi_barrier(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    MPI_Request req;
    MPI_Ibarrier(m->comm, &req);
    return fsdp__mpi_wait(comm, &req, c);
}

FSDP__PRIVATE int fsdp__mpi_all_to_all(fsdp_comm *comm, void *impl, const fsdp_coll *c) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    MPI_Request req;
    size_t bytes = c->count * fsdp_dtype_size(c->dtype);
    if (bytes > 0x7fffffff) return fsdp_comm_fail(comm, FSDP_ERR_UNSUPPORTED, "MPI bridge: pieces above 2 GiB are not supported");
    MPI_Ialltoall(c->send, (int)bytes, MPI_BYTE, c->recv, (int)bytes, MPI_BYTE, m->comm, &req);
    return fsdp__mpi_wait(comm, &req, c);
}

FSDP__PRIVATE void fsdp__mpi_abort(fsdp_comm *comm, void *impl) {
    /* MPI offers no way to fail one collective on every rank but to abort the job, which
       would kill the ranks before they can report. Local ops fail from now on; peers blocked
       in an op with us fail by their timeout. */
    (void)comm; (void)impl;
}

FSDP__PRIVATE void fsdp__mpi_destroy(fsdp_comm *comm, void *impl) {
    fsdp__mpi *m = (fsdp__mpi *)impl;
    (void)comm;
    if (!m) return;
    MPI_Comm_free(&m->comm);
    if (m->finalize) MPI_Finalize();
    FSDP_FREE(m->scratch);
    FSDP_FREE(m);
}

/* base: the MPI communicator to duplicate (MPI_COMM_NULL: MPI_COMM_WORLD, initialising MPI
   if nobody has). */
FSDP__PRIVATE int fsdp__mpi_init(fsdp_comm *comm, MPI_Comm base) {
    fsdp__mpi *m = (fsdp__mpi *)fsdp__calloc(sizeof *m);
    int initialized = 0, provided = 0, rank = 0, size = 0;
    if (!m) return fsdp__init_fail(&comm->logger, FSDP_ERR_OUT_OF_MEMORY, "mpi: out of memory");
    MPI_Initialized(&initialized);
    if (!initialized) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            FSDP_FREE(m);
            return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "mpi: MPI_Init_thread failed");
        }
        m->finalize = 1;
    }
    if (base == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    else m->comm = base;
    MPI_Comm_rank(m->comm, &rank);
    MPI_Comm_size(m->comm, &size);
    if (size > FSDP__MAX_WORLD || (comm->world && (comm->world != size || comm->rank != rank))) {
        fsdp__init_fail(&comm->logger, FSDP_ERR_INVALID_ARG,
                        "mpi: MPI says rank %d of %d, the description says rank %d of %d (at most 256 ranks)",
                        rank, size, comm->rank, comm->world);
        MPI_Comm_free(&m->comm);
        if (m->finalize) MPI_Finalize();
        FSDP_FREE(m);
        return FSDP_ERR_INVALID_ARG;
    }
    comm->rank = rank;
    comm->world = size;
    comm->impl = m;
    return 0;
}

/* --- the mpi row ---------------------------------------------------------------------------- */
/* MPI_COMM_WORLD's duplicate, or the communicator a split made (inherit->engine_comm). */
/* A world made without a job token (mpirun sets none of the variables fsdp__env_job reads) gets
   one drawn by rank 0: every MPI job of a user would otherwise name its shared-memory
   sub-communicators (HYBRID_SHARD's shard groups) alike, and two such jobs on one host would
   meet in one segment (seen in the chaos campaign: one job's rank failed to form its groups, the
   others waited for it until their timeout). */
FSDP__PRIVATE int fsdp__mpi_job(fsdp_comm *comm, const fsdp_comm_desc *desc) {
    char job[48];
    unsigned char draw[8];
    if (desc->job && *desc->job) return 0;
    memset(job, 0, sizeof job);
    if (comm->rank == 0) {
        uint64_t fallback = (uint64_t)fsdp__now_ms() * 1000003u ^ (uint64_t)getpid();
        if (fsdp__random_bytes(draw, sizeof draw) != 0) memcpy(draw, &fallback, sizeof draw);
        memcpy(job, "mpi-", 4);
        fsdp__hex(job + 4, draw, sizeof draw);
    }
    if (MPI_Bcast(job, (int)sizeof job, MPI_CHAR, 0, ((fsdp__mpi *)comm->impl)->comm) != MPI_SUCCESS)
        return fsdp__init_fail(&comm->logger, FSDP_ERR_SYSTEM, "mpi: MPI_Bcast of the job token failed");
    job[sizeof job - 1] = 0;
    fsdp__comm_set_job(comm, desc, job);
    return 0;
}

FSDP__PRIVATE int fsdp__mpi_create(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__inherit *inherit) {
    int rc = fsdp__mpi_init(comm, inherit && inherit->engine_comm ? *(MPI_Comm *)inherit->engine_comm : MPI_COMM_NULL);
    if (!rc) rc = fsdp__mpi_job(comm, desc);
    return rc ? rc : fsdp__comm_learn_topology(comm, 0);
}

/* MPI_Comm_split (collective over the parent even where the group is made of shared memory). */
FSDP__PRIVATE int fsdp__mpi_split(fsdp_comm *parent, fsdp__split *sp, fsdp_comm **out) {
    MPI_Comm split;
    fsdp__inherit inherit;
    if (MPI_Comm_split(((fsdp__mpi *)parent->impl)->comm, sp->info.color, sp->info.key, &split) != MPI_SUCCESS)
        return fsdp_comm_fail(parent, FSDP_ERR_SYSTEM, "fsdp_comm_split: MPI_Comm_split failed");
    if (sp->desc.backend != FSDP_BACKEND_MPI) {
        MPI_Comm_free(&split);
        return fsdp__comm_create(out, &sp->desc, parent, NULL);
    }
    memset(&inherit, 0, sizeof inherit);
    inherit.listen_fd = -1;
    inherit.engine_comm = &split;
    return fsdp__comm_create(out, &sp->desc, parent, &inherit);
}

/* The environment's default under an MPI launcher (Open MPI's or PMI's variables). */
static int fsdp__mpi_env_claims(const fsdp_comm_desc *desc) {
    (void)desc;
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") ? 3 : 0;
}

static const fsdp__transport fsdp__mpi_transport = {
    {"mpi", fsdp__mpi_all_gather, fsdp__mpi_reduce_scatter, fsdp__mpi_all_reduce, fsdp__mpi_broadcast,
     fsdp__mpi_barrier, fsdp__mpi_abort, fsdp__mpi_destroy, 1, NULL, fsdp__mpi_all_to_all},
    FSDP_BACKEND_MPI, "mpi", FSDP__CAP_ENV | FSDP__CAP_OWN_RANKS, FSDP__MAX_WORLD,
    fsdp__mpi_create, fsdp__mpi_split, NULL, NULL, NULL, fsdp__mpi_env_claims, NULL, NULL, NULL};
#else
FSDP__PRIVATE int fsdp__mpi_create(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__inherit *inherit) {
    (void)desc; (void)inherit;
    return fsdp__init_fail(&comm->logger, FSDP_ERR_UNSUPPORTED, "the mpi backend needs fsdp.h compiled with "
                           "FSDP_WITH_MPI (and mpicc)");
}

/* Without the bridge the row only names the backend and says why it cannot be made. */
static const fsdp__transport fsdp__mpi_transport = {
    {"mpi", NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, NULL, NULL},
    FSDP_BACKEND_MPI, "mpi", FSDP__CAP_ENV | FSDP__CAP_OWN_RANKS, FSDP__MAX_WORLD,
    fsdp__mpi_create, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif /* FSDP_WITH_MPI */

/* ============================================================================================
   >>backends
   The shipped backends in one table, and making communicators: fsdp_comm_init,
   fsdp_comm_split.
   ============================================================================================ */
/* --- the user row: a comm over the caller's fsdp_backend table (fsdp_comm_desc.user_backend) -- */
FSDP__PRIVATE int fsdp__user_create(fsdp_comm *comm, const fsdp_comm_desc *desc, fsdp__inherit *inherit) {
    const fsdp_backend *b = desc->user_backend;
    (void)inherit;
    if (!b || !b->all_gather || !b->reduce_scatter || !b->all_reduce || !b->broadcast || !b->barrier)
        return fsdp__init_fail(&desc->logger, FSDP_ERR_INVALID_ARG, "fsdp_comm_init: user_backend is missing or lacks an op");
    comm->backend = b;
    comm->impl = desc->user_impl;
    return 0;
}

/* The table's split makes the child's impl; the child is a comm over the same table. */
FSDP__PRIVATE int fsdp__user_split(fsdp_comm *parent, fsdp__split *sp, fsdp_comm **out) {
    const fsdp_backend *b = parent->backend;
    fsdp_comm_desc desc = sp->desc;
    void *child = NULL;
    int rc;
    if (!b->split)
        return fsdp_comm_fail(parent, FSDP_ERR_UNSUPPORTED, "fsdp_comm_split: the user backend '%s' has no split",
                              b->name ? b->name : "(unnamed)");
    if ((rc = b->split(parent, parent->impl, &sp->info, &child)) != 0) {
        fsdp__log(&parent->logger, FSDP_LOG_ERROR, "fsdp_comm_split: the user backend '%s' could not split: %s",
                  b->name ? b->name : "(unnamed)", fsdp_result_description(rc));
        return rc;
    }
    desc.user_backend = b;
    desc.user_impl = child;
    if ((rc = fsdp__comm_create(out, &desc, parent, NULL)) != 0 && b->destroy) b->destroy(parent, child);
    return rc;
}

static const fsdp__transport fsdp__user_transport = {
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL},
    FSDP_BACKEND_USER, "user", 0, 0,
    fsdp__user_create, fsdp__user_split, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

/* --- the table ------------------------------------------------------------------------------ */
/* Every kind of communicator fsdp_comm_init makes. A shipped backend is one row here, one
   enum value (fsdp_backend_kind) and its own section. */
static const fsdp__transport *const fsdp__transports[] = {&fsdp__shm_transport, &fsdp__sock_transport,
                                                          &fsdp__mpi_transport, &fsdp__user_transport};
#define FSDP__NUM_TRANSPORTS ((int)(sizeof fsdp__transports / sizeof fsdp__transports[0]))

FSDP__PRIVATE const fsdp__transport *fsdp__transport_of(fsdp_backend_kind kind) {
    int i;
    for (i = 0; i < FSDP__NUM_TRANSPORTS; i++)
        if (fsdp__transports[i]->kind == kind) return fsdp__transports[i];
    return NULL;
}

/* Checks a description before anything is made; 0 or the init's failure. */
FSDP__PRIVATE int fsdp__comm_check_desc(const fsdp_comm_desc *desc, const fsdp__transport *t) {
    if (!t)
        return fsdp__init_fail(&desc->logger, FSDP_ERR_INVALID_ARG, "fsdp_comm_init: unknown backend %d", (int)desc->backend);
    if (!(t->caps & FSDP__CAP_OWN_RANKS) && (desc->world_size < 1 || desc->rank < 0 || desc->rank >= desc->world_size))
        return fsdp__init_fail(&desc->logger, FSDP_ERR_INVALID_ARG, "fsdp_comm_init: rank %d is not in a world of size %d",
                               desc->rank, desc->world_size);
    if (t->max_world && desc->world_size > t->max_world)
        return fsdp__init_fail(&desc->logger, FSDP_ERR_UNSUPPORTED, "fsdp_comm_init: world size %d is above the %s "
                               "backend's limit of %d", desc->world_size, t->name, t->max_world);
    if (desc->shm_slot_bytes > FSDP__SHM_SLOT_MAX)
        return fsdp__init_fail(&desc->logger, FSDP_ERR_INVALID_ARG, "fsdp_comm_init: shm_slot_bytes %zu is above the "
                               "limit of %zu (1 GiB)", desc->shm_slot_bytes, FSDP__SHM_SLOT_MAX);
    if (desc->job && strlen(desc->job) >= 48)
        return fsdp__init_fail(&desc->logger, FSDP_ERR_INVALID_ARG, "fsdp_comm_init: the job token is %zu characters "
                               "long; at most 47", strlen(desc->job));
    return 0;
}

/* Creates a communicator. parent: the communicator a split came from (its key), or NULL.
   inherit (may be NULL): what the launcher or a split prepared; its listen_fd is closed here
   unless the transport took it. */
FSDP__PRIVATE int fsdp__comm_create(fsdp_comm **out, const fsdp_comm_desc *desc, const fsdp_comm *parent,
                                    fsdp__inherit *inherit) {
    const fsdp__transport *t;
    fsdp_comm *comm = NULL;
    int rc;
    fsdp__init_error[0] = 0;
    if (out) *out = NULL;
    if (!out || !desc) rc = FSDP_ERR_INVALID_ARG;
    else if ((rc = fsdp__comm_check_desc(desc, t = fsdp__transport_of(desc->backend == FSDP_BACKEND_DEFAULT
                                                                          ? FSDP_BACKEND_SHM : desc->backend))) == 0 &&
             !(comm = fsdp__comm_new(desc, parent)))
        rc = fsdp__init_fail(&desc->logger, FSDP_ERR_OUT_OF_MEMORY, "fsdp_comm_init: out of memory");
    if (!rc) {
        comm->transport = t;
        comm->backend = &t->ops;
        rc = t->create(comm, desc, inherit);
    }
    if (inherit && inherit->listen_fd >= 0) { /* nobody else will close it */
        close(inherit->listen_fd);
        inherit->listen_fd = -1;
    }
    if (rc) {
        if (comm && comm->backend && comm->backend->destroy) comm->backend->destroy(comm, comm->impl);
        if (comm) comm->backend = NULL;
        fsdp_comm_destroy(comm);
        return rc;
    }
    if (comm->local_world > comm->crowd) comm->crowd = comm->local_world;
    fsdp__comm_spin_if_room(comm);
    fsdp__log(&comm->logger, FSDP_LOG_INFO, "rank %d of %d joined on %s (job '%s')", comm->rank, comm->world,
              fsdp_backend_name(comm->kind), comm->job);
    *out = comm;
    return FSDP_SUCCESS;
}

FSDP_API int fsdp_comm_init(fsdp_comm **out, const fsdp_comm_desc *desc) {
    return fsdp__comm_create(out, desc, NULL, NULL);
}

/* The members of the split of this rank's color, from every parent rank's (color, key) in all:
   sp->info's rank, size and parent ranks (by key, then parent rank), and the leader. *one_host:
   every member on this rank's host (hosts known). */
FSDP__PRIVATE int fsdp__split_members(const fsdp_comm *parent, const int32_t *all, fsdp__split *sp, int *members,
                                      int *one_host) {
    int r, k, n = 0;
    *one_host = parent->host_of != NULL;
    for (r = 0; r < parent->world; r++) { /* members of my color in parent rank order, then sorted by key */
        if (all[4 * r] != sp->info.color) continue;
        for (k = n++; k > 0 && all[4 * members[k - 1] + 1] > all[4 * r + 1]; k--) members[k] = members[k - 1];
        members[k] = r;
        if (parent->host_of && parent->host_of[r] != parent->host) *one_host = 0;
    }
    for (k = 0; k < n; k++)
        if (members[k] == parent->rank) sp->info.rank = k;
    sp->info.world_size = n;
    sp->info.parent_ranks = members;
    sp->leader = members[0];
    return n;
}

/* Whether every rank made its part of a split (rc: this rank's result; all: room for 4 int32 per
   parent rank). A rank that failed (a segment it could not make or open) would otherwise leave
   the others, whose part is made, waiting in their next op on the parent until its timeout: a
   split that failed anywhere fails everywhere, naming the first rank (its own log says why), and
   the sub-communicators made are destroyed. A failed parent skips this: its ops fail anyway. */
FSDP__PRIVATE int fsdp__split_agree(fsdp_comm *parent, int rc, int32_t *all, fsdp_comm **out) {
    int32_t mine[4] = {0, 0, 0, 0};
    int r, agreed;
    if (fsdp_comm_status(parent) != FSDP_SUCCESS) return rc ? rc : fsdp_comm_status(parent);
    mine[0] = rc;
    agreed = fsdp__collective_tagged(parent, FSDP_COLL_ALL_GATHER, mine, all, 4, FSDP_F32, FSDP_SUM, 0x5b118u);
    for (r = 0; !agreed && !rc && r < parent->world; r++)
        if (all[4 * r] != 0)
            rc = fsdp__init_fail(&parent->logger, all[4 * r], "fsdp_comm_split: rank %d could not make its part of the "
                                 "sub-communicator (%s; its log says why)", r, fsdp_result_name(all[4 * r]));
    if (!rc) rc = agreed;
    if (rc && *out) {
        fsdp_comm_destroy(*out);
        *out = NULL;
    }
    return rc;
}

FSDP_API int fsdp_comm_split(fsdp_comm *parent, int color, int key, fsdp_comm **out) {
    int32_t mine[4], *all = NULL, free_mib = INT32_MAX;
    int *members = NULL, r, rc, one_host;
    char job[64];
    fsdp__split sp;
    if (out) *out = NULL;
    if (!parent || !out) return FSDP_ERR_INVALID_ARG;
    if (!parent->transport->split)
        return fsdp_comm_fail(parent, FSDP_ERR_UNSUPPORTED, "fsdp_comm_split: %s communicators cannot be split",
                              fsdp_comm_transport(parent));
    all = (int32_t *)FSDP_MALLOC(sizeof *all * 4 * (size_t)parent->world);
    members = (int *)FSDP_MALLOC(sizeof *members * (size_t)parent->world);
    if (!all || !members) {
        FSDP_FREE(all);
        FSDP_FREE(members);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    mine[0] = color;
    mine[1] = key;
    mine[2] = fsdp__shm_free_mib();
    mine[3] = 0;
    /* integers travel as f32 bit patterns: an all-gather only copies */
    rc = fsdp__collective_tagged(parent, FSDP_COLL_ALL_GATHER, mine, all, 4, FSDP_F32, FSDP_SUM, 0x5b117u);
    if (rc) goto done;
    memset(&sp, 0, sizeof sp);
    sp.info.color = color;
    sp.info.key = key;
    fsdp__split_members(parent, all, &sp, members, &one_host);
    for (r = 0; r < sp.info.world_size; r++)
        if (all[4 * members[r] + 2] < free_mib) free_mib = all[4 * members[r] + 2];
    sp.desc.backend = parent->kind;
    /* members that share a host talk through shared memory, whatever the parent's transport
       (HYBRID_SHARD's shard groups), if /dev/shm has room for their segment everywhere */
    if (one_host && sp.info.world_size > 1 && fsdp__shm_fits(sp.info.world_size, 0, free_mib))
        sp.desc.backend = FSDP_BACKEND_SHM;
    sp.desc.rank = sp.info.rank;
    sp.desc.world_size = sp.info.world_size;
    sp.desc.timeout_ms = parent->timeout_ms;
    sp.desc.logger = parent->logger;
    /* unique per split and short whatever the parent's token (at most 12 + 1 + 8 + 1 + 16 + 1 + 8 = 47
       characters): its start, a checksum of all of it (shm segments are named after the token) */
    fsdp__fmt(job, sizeof job, "%.12s-%08x.%llx.%x", parent->job, (unsigned)fsdp_crc32c(0, parent->job, strlen(parent->job)),
              (unsigned long long)parent->seq, (unsigned)color);
    sp.desc.job = job;
    rc = parent->transport->split(parent, &sp, out);
    if (rc && fsdp__init_error[0]) fsdp__log(&parent->logger, FSDP_LOG_ERROR, "fsdp_comm_split: %s", fsdp__init_error);
    rc = fsdp__split_agree(parent, rc, all, out);
done:
    FSDP_FREE(all);
    FSDP_FREE(members);
    return rc;
}

/* ============================================================================================
   >>qcomm
   Collectives built from the public ones, for any backend: the quantized reduce-scatter
   (fsdp_reduce_scatter_wire, whose declaration documents its arithmetic).
   The runtime uses it for a unit whose grad_wire is INT8 or INT4 (fsdp__run_reduce_wire): over
   the context's host comm and its cross-host comm (the ranks of one local index, made once by
   fsdp_init), FSDP_AVG, in place in the unit's f32 gradient, with the unit's residual under
   error feedback. What that changes in the gradient bits: they depend on the layout H hosts x L
   ranks (each host's partial of L ranks is what gets quantized, and the hosts' partials are
   folded in host order), on the wire and the block, not on the backend or the timing; one host
   (H = 1) or grad_wire off is the plain reduce-scatter's bits exactly. So the same world of P
   ranks on 1 x 4, 2 x 2 or 4 x 1 hosts trains to different bits, each bitwise run to run.
   ============================================================================================ */
/* The scratch of one fsdp_reduce_scatter_wire: the host partials (later the decoded receipts),
   the encoded pieces out and in (slot bytes each, a multiple of 4), the fold's sources. */
typedef struct fsdp__qrs {
    float *partials;
    unsigned char *out, *in;
    const void **srcs;
    size_t slot;
    void *raw;
} fsdp__qrs;

/* Checks fsdp_reduce_scatter_wire's arguments: 0, or FSDP_ERR_INVALID_ARG logged on a comm's logger. */
FSDP__PRIVATE int fsdp__qrs_check(fsdp_comm *host, fsdp_comm *cross, const float *send, const float *recv, size_t count,
                                  fsdp_reduce_op op, fsdp_wire wire, size_t block, const float *residual) {
    fsdp_comm *logged = host ? host : cross;
    int H = cross ? cross->world : 1, L = host ? host->world : 1;
    const char *bad = NULL;
    if (!host && !cross) return FSDP_ERR_INVALID_ARG;
    if (count && (!send || !recv)) bad = "send or recv is NULL";
    else if (op != FSDP_REDUCE_DEFAULT && op != FSDP_SUM && op != FSDP_AVG) bad = "op must be FSDP_SUM or FSDP_AVG";
    else if (wire == FSDP_WIRE_DEFAULT || fsdp_wire_bytes(wire, 1, block) == 0) bad = "invalid wire or block";
    else if (count > SIZE_MAX / 8 / (size_t)H / (size_t)L) bad = "count is too large";
    else if (residual && recv && count && (uintptr_t)residual < (uintptr_t)(recv + count) &&
             (uintptr_t)recv < (uintptr_t)(residual + (size_t)H * count))
        bad = "recv overlaps residual";
    if (!bad) return 0;
    fsdp__log(&logged->logger, FSDP_LOG_ERROR, "fsdp_reduce_scatter_wire(count=%zu, wire=%s, block=%zu): %s", count,
              fsdp_wire_name(wire), block, bad);
    return FSDP_ERR_INVALID_ARG;
}

FSDP__PRIVATE int fsdp__qrs_alloc(fsdp__qrs *q, fsdp_comm *comm, int H, size_t count, fsdp_wire wire, size_t block) {
    size_t floats = (size_t)H * count * sizeof(float), pointers = fsdp__align(sizeof(void *) * (size_t)H, 64);
    q->slot = fsdp__align(fsdp_wire_bytes(wire, count, block), 4);
    q->raw = FSDP_MALLOC(pointers + fsdp__align(floats, 64) + 2 * (size_t)H * q->slot + 64);
    if (!q->raw)
        return fsdp_comm_fail(comm, FSDP_ERR_OUT_OF_MEMORY, "fsdp_reduce_scatter_wire: no memory for %zu bytes of scratch",
                              pointers + floats + 2 * (size_t)H * q->slot);
    q->srcs = (const void **)q->raw;
    q->partials = (float *)((char *)q->raw + pointers);
    q->out = (unsigned char *)q->partials + fsdp__align(floats, 64);
    q->in = q->out + (size_t)H * q->slot;
    return 0;
}

/* What a caller inside fsdp.h learns from one fsdp__qrs_run (the runtime's reduction traces its
   phases and names a non-finite gradient): phase(user, "quantize" / "dequantize", t0) at the end
   of each of those phases, which began at t0; nonfinite, the index in the host partials (g count
   + i) of the first NaN or infinity encoded, or SIZE_MAX. */
typedef struct fsdp__qrs_watch {
    void (*phase)(void *user, const char *name, double t0);
    void *user;
    size_t nonfinite;
} fsdp__qrs_watch;

/* Steps 2 and 3: host g's partial (plus its residual) into slot g, the residual updated; recv
   serves as the decode's scratch (send is no longer read). */
FSDP__PRIVATE void fsdp__qrs_encode(const fsdp__qrs *q, int H, size_t count, fsdp_wire wire, size_t block,
                                    float *residual, float *scratch, fsdp__qrs_watch *watch) {
    size_t i, first;
    int g;
    for (g = 0; g < H; g++) {
        float *z = q->partials + (size_t)g * count, *res = residual ? residual + (size_t)g * count : NULL;
        unsigned char *codes = q->out + (size_t)g * q->slot;
        if (res)
            for (i = 0; i < count; i++) z[i] = z[i] + res[i];
        fsdp_wire_encode(codes, wire, block, z, count, &first);
        if (watch && first < count && watch->nonfinite == SIZE_MAX) watch->nonfinite = (size_t)g * count + first;
        if (!res) continue;
        fsdp_wire_decode(scratch, FSDP_F32, codes, wire, block, count);
        for (i = 0; i < count; i++) res[i] = scratch[i] != scratch[i] ? 0.0f : z[i] - scratch[i];
    }
}

/* fsdp_reduce_scatter_wire, watched (watch may be NULL; it costs a clock reading per phase). */
FSDP__PRIVATE int fsdp__qrs_run(fsdp_comm *host, fsdp_comm *cross, const float *send, float *recv, size_t count,
                                fsdp_reduce_op op, fsdp_wire wire, size_t block, float *residual, fsdp__qrs_watch *watch) {
    int H = cross ? cross->world : 1, L = host ? host->world : 1, rc, g;
    fsdp_comm *any = cross ? cross : host;
    double t0;
    fsdp__qrs q;
    memset(&q, 0, sizeof q);
    if (watch) watch->nonfinite = SIZE_MAX;
    if ((rc = fsdp__qrs_check(host, cross, send, recv, count, op, wire, block, residual)) != 0) return rc;
    if (op == FSDP_REDUCE_DEFAULT) op = FSDP_SUM;
    if (H == 1) /* one host: nothing crosses a link, nothing is quantized */
        return host ? fsdp_reduce_scatter(host, send, recv, count, FSDP_F32, op)
                    : fsdp_reduce_scatter(cross, send, recv, count, FSDP_F32, op);
    if ((rc = fsdp__qrs_alloc(&q, any, H, count, wire, block)) != 0) return rc;
    for (g = 0; g < H && rc == FSDP_SUCCESS; g++) /* 1: host g's shards, summed over this host */
        rc = host ? fsdp_reduce_scatter(host, send + (size_t)g * (size_t)L * count, q.partials + (size_t)g * count, count,
                                        FSDP_F32, FSDP_SUM)
                  : (memcpy(q.partials + (size_t)g * count, send + (size_t)g * count, count * sizeof(float)), 0);
    if (rc == FSDP_SUCCESS) {
        t0 = watch && watch->phase ? fsdp_now() : 0;
        fsdp__qrs_encode(&q, H, count, wire, block, residual, recv, watch);
        if (t0 != 0) watch->phase(watch->user, "quantize", t0);
        rc = fsdp_all_to_all(cross, q.out, q.in, q.slot / 4, FSDP_F32);
    } else { /* the other hosts' ranks would wait for this one in the all_to_all: tell them now */
        fsdp_comm_fail(cross, rc, "fsdp_reduce_scatter_wire: the host comm of rank %d (local rank %d) failed: %s",
                       cross->rank, host->rank, fsdp_comm_last_error(host));
    }
    t0 = rc == FSDP_SUCCESS && watch && watch->phase ? fsdp_now() : 0;
    for (g = 0; g < H && rc == FSDP_SUCCESS; g++) { /* 5: the hosts' partials of my shard, folded in host order */
        fsdp_wire_decode(q.partials + (size_t)g * count, FSDP_F32, q.in + (size_t)g * q.slot, wire, block, count);
        q.srcs[g] = q.partials + (size_t)g * count;
    }
    if (rc == FSDP_SUCCESS && count) fsdp_reduce_ranks(recv, q.srcs, H, count, FSDP_F32, op, H * L);
    if (t0 != 0) watch->phase(watch->user, "dequantize", t0);
    FSDP_FREE(q.raw);
    return rc;
}

FSDP_API int fsdp_reduce_scatter_wire(fsdp_comm *host, fsdp_comm *cross, const float *send, float *recv, size_t count,
                                      fsdp_reduce_op op, fsdp_wire wire, size_t block, float *residual) {
    return fsdp__qrs_run(host, cross, send, recv, count, op, wire, block, residual, NULL);
}

/* ============================================================================================
   >>env
   fsdp_comm_init_from_env: torchrun, SLURM, Open MPI and MPICH conventions.
   ============================================================================================ */
/* The launchers' integers (torchrun's, SLURM's, Open MPI's, PMI's names, first set wins). */
typedef struct fsdp__env_ints {
    long rank, world, local_rank, local_world, port, timeout;
    int have_rank, have_world;
} fsdp__env_ints;

FSDP__PRIVATE int fsdp__env_read_ints(fsdp__env_ints *v, char *err, size_t err_size) {
    static const char *const rank_vars[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", NULL};
    static const char *const world_vars[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    static const char *const local_rank_vars[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    static const char *const local_world_vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
    static const char *const port_vars[] = {"MASTER_PORT", NULL};
    static const char *const timeout_vars[] = {"FSDP_TIMEOUT_MS", NULL};
    memset(v, 0, sizeof *v);
    if ((v->have_rank = fsdp__env_int(rank_vars, 0, 1 << 20, &v->rank, err, err_size)) < 0 ||
        (v->have_world = fsdp__env_int(world_vars, 1, 1 << 20, &v->world, err, err_size)) < 0 ||
        fsdp__env_int(local_rank_vars, 0, 1 << 20, &v->local_rank, err, err_size) < 0 ||
        fsdp__env_int(local_world_vars, 1, 1 << 20, &v->local_world, err, err_size) < 0 ||
        fsdp__env_int(port_vars, 1, 65535, &v->port, err, err_size) < 0 ||
        fsdp__env_int(timeout_vars, 1, 0x7fffffffL, &v->timeout, err, err_size) < 0)
        return FSDP_ERR_ENV;
    return 0;
}

/* The backend: FSDP_BACKEND names a row of the table; else the description's; else the row that
   claims this environment most (an MPI launcher: mpi, when built with it; every rank on this
   host: shm; else socket). */
FSDP__PRIVATE int fsdp__env_backend(fsdp_comm_desc *desc, const fsdp__env_ints *v, char *err, size_t err_size) {
    const char *name = getenv("FSDP_BACKEND");
    int i, best = 0;
    if (name && *name) {
        size_t used = 0;
        char names[64] = "";
        for (i = 0; i < FSDP__NUM_TRANSPORTS; i++) {
            const fsdp__transport *t = fsdp__transports[i];
            if (!(t->caps & FSDP__CAP_ENV)) continue;
            if (strcmp(name, t->name) == 0) {
                desc->backend = t->kind;
                return 0;
            }
            used += (size_t)fsdp__fmt(names + used, sizeof names - used, "%s%s", used ? ", " : "", t->name);
        }
        fsdp__fmt(err, err_size, "environment variable FSDP_BACKEND='%s' is not one of %s", name, names);
        return FSDP_ERR_ENV;
    }
    if (desc->backend != FSDP_BACKEND_DEFAULT) return 0;
    for (i = 0; i < FSDP__NUM_TRANSPORTS; i++) {
        fsdp_comm_desc seen = *desc;
        int claim;
        seen.world_size = v->have_world ? (int)v->world : 0;
        seen.local_world_size = (int)v->local_world;
        claim = fsdp__transports[i]->env_claims ? fsdp__transports[i]->env_claims(&seen) : 0;
        if (claim > best) {
            best = claim;
            desc->backend = fsdp__transports[i]->kind;
        }
    }
    return 0;
}

/* The job token: explicit, else the launcher's job id (torchrun's also names the attempt: ranks
   left over from an attempt that failed cannot join the next), else the rendezvous port; ""
   when the environment names none. */
FSDP__PRIVATE void fsdp__env_job(const fsdp_comm_desc *desc, long port, char *job, size_t size) {
    const char *text, *run_id = getenv("TORCHELASTIC_RUN_ID"), *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    job[0] = 0;
    if ((text = getenv("FSDP_JOB")) && *text) fsdp__copy_string(job, size, text);
    else if (desc->job && *desc->job) fsdp__copy_string(job, size, desc->job);
    else if (run_id && *run_id) /* static rendezvous: the same MASTER_PORT every attempt, so the attempt
                                     tells them apart; c10d picks a new port every round, and a node whose
                                     own workers did not fail keeps its old restart count */
        fsdp__fmt(job, size, "te-%.20s-%ld.%.8s", run_id, port,
                  (text = getenv("TORCHELASTIC_USE_AGENT_STORE")) && strcmp(text, "True") == 0
                      ? (restart && *restart ? restart : "0") : "c10d");
    else if ((text = getenv("SLURM_JOB_ID")) && *text)
        fsdp__fmt(job, size, "slurm-%.20s-%.10s", text, getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
    else if (port) fsdp__fmt(job, size, "port-%ld", port);
}

FSDP_API int fsdp_comm_init_from_env(fsdp_comm **out, const fsdp_comm_desc *defaults, char *errbuf,
                                     size_t errbuf_size) {
    fsdp_comm_desc desc;
    fsdp__env_ints v;
    const fsdp__transport *t;
    char err[FSDP__ERRMSG] = "", job[64], secret[1025], scratch[128];
    const char *text;
    int rc;
    if (out) *out = NULL;
    if (!out) return FSDP_ERR_INVALID_ARG;
    memset(&desc, 0, sizeof desc);
    if (defaults) desc = *defaults;
    desc.logger = fsdp__env_logger(desc.logger);
    if ((rc = fsdp__env_read_ints(&v, err, sizeof err)) != 0 || (rc = fsdp__env_backend(&desc, &v, err, sizeof err)) != 0)
        goto fail;
    t = fsdp__transport_of(desc.backend);
    if (t && !(t->caps & FSDP__CAP_OWN_RANKS)) {
        rc = FSDP_ERR_ENV;
        if (!v.have_rank || !v.have_world) {
            fsdp__fmt(err, sizeof err, "environment variable %s is not set (set RANK and WORLD_SIZE as torchrun does, or "
                      "run under SLURM or mpirun)", !v.have_rank ? "RANK" : "WORLD_SIZE");
            goto fail;
        }
        if (v.rank >= v.world) {
            fsdp__fmt(err, sizeof err, "environment variable RANK=%ld is not below WORLD_SIZE=%ld", v.rank, v.world);
            goto fail;
        }
        desc.rank = (int)v.rank;
        desc.world_size = (int)v.world;
    }
    desc.local_rank = (int)v.local_rank;
    desc.local_world_size = (int)v.local_world;
    if (v.timeout) desc.timeout_ms = (int)v.timeout;
    if (v.port) desc.master_port = (int)v.port;
    fsdp__env_job(&desc, v.port, job, sizeof job);
    desc.job = *job ? job : NULL;
    if (t && t->env_read && (rc = t->env_read(&desc, scratch, sizeof scratch, err, sizeof err)) != 0) goto fail;
    if (!desc.job && !(t && t->kind == FSDP_BACKEND_MPI)) desc.job = "fsdp"; /* (an MPI world draws one: fsdp__mpi_job) */
    if ((text = getenv("FSDP_SECRET")) && *text) { /* taken out of the environment: children do not inherit it */
        size_t n = strlen(text);
        if (n >= sizeof secret) {
            fsdp__fmt(err, sizeof err, "environment variable FSDP_SECRET is %zu bytes long; at most %zu",
                      n, sizeof secret - 1);
            rc = FSDP_ERR_ENV;
            goto fail;
        }
        memcpy(secret, text, n + 1);
        fsdp__wipe((char *)(uintptr_t)text, n); /* the bytes too (they are what /proc/<pid>/environ shows) */
        unsetenv("FSDP_SECRET");
        desc.secret = secret;
    } else if ((text = getenv("FSDP_SECRET_FILE")) && *text) {
        if (fsdp__read_secret_file(text, secret, sizeof secret, err, sizeof err) != 0) {
            rc = FSDP_ERR_ENV;
            goto fail;
        }
        desc.secret = secret;
    }
    rc = fsdp__comm_create(out, &desc, NULL, NULL);
    fsdp__wipe(secret, sizeof secret);
    if (rc && errbuf && errbuf_size) fsdp__copy_string(errbuf, errbuf_size, fsdp__init_error);
    return rc;
fail:
    fsdp__init_fail(&desc.logger, rc, "%s", err);
    if (errbuf && errbuf_size) fsdp__copy_string(errbuf, errbuf_size, err);
    return rc;
}

/* ============================================================================================
   >>model
   ============================================================================================ */
typedef struct fsdp__module {
    char *name;            /* full dotted name; "" for the root */
    char *type;
    int parent;
    int marked;            /* fsdp_model_wrap */
    fsdp_strategy strategy; /* fsdp_model_set_strategy; 0 = the context's default */
    fsdp_reshard_mode reshard; /* fsdp_model_set_reshard_after_forward; 0 = the context's default */
    fsdp_wire param_wire, grad_wire; /* fsdp_model_set_wire; 0 = the context's default */
} fsdp__module;

typedef struct fsdp__param {
    char *name;
    int module;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
    fsdp_init_rule init;
    uint64_t key;          /* hash of the name: the generator's stream */
    int frozen;            /* fsdp_model_set_trainable(..., 0) */
} fsdp__param;

struct fsdp_model {
    fsdp__module *modules;
    int num_modules, cap_modules;
    fsdp__param *params;
    int num_params, cap_params;
};

FSDP__PRIVATE char *fsdp__strdup(const char *text) {
    size_t n = strlen(text);
    char *copy = (char *)FSDP_MALLOC(n + 1);
    if (copy) memcpy(copy, text, n + 1);
    return copy;
}

static uint64_t fsdp__mix64(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

FSDP__PRIVATE uint64_t fsdp__hash_string(const char *text) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *text; text++) h = (h ^ (unsigned char)*text) * 0x100000001b3ull;
    return fsdp__mix64(h);
}

/* Uniform in [0, 1) with 24 random bits, a pure function of (seed, key, index, lane). */
static double fsdp__uniform(uint64_t seed, uint64_t key, int64_t index, int lane) {
    uint64_t h = fsdp__mix64(seed ^ fsdp__mix64(key ^ fsdp__mix64((uint64_t)index * 2u + (uint64_t)lane + 0x9e3779b97f4a7c15ull)));
    return (double)(h >> 40) * (1.0 / 16777216.0);
}

FSDP_API int fsdp_model_create(fsdp_model **out, const char *root_type) {
    fsdp_model *m;
    if (!out) return FSDP_ERR_INVALID_ARG;
    *out = NULL;
    m = (fsdp_model *)fsdp__calloc(sizeof *m);
    if (!m) return FSDP_ERR_OUT_OF_MEMORY;
    m->cap_modules = 16;
    m->modules = (fsdp__module *)fsdp__calloc(sizeof *m->modules * (size_t)m->cap_modules);
    if (!m->modules) { FSDP_FREE(m); return FSDP_ERR_OUT_OF_MEMORY; }
    m->modules[0].name = fsdp__strdup("");
    m->modules[0].type = fsdp__strdup(root_type && *root_type ? root_type : "Model");
    m->modules[0].parent = -1;
    m->num_modules = 1;
    if (!m->modules[0].name || !m->modules[0].type) { fsdp_model_destroy(m); return FSDP_ERR_OUT_OF_MEMORY; }
    *out = m;
    return FSDP_SUCCESS;
}

FSDP_API void fsdp_model_destroy(fsdp_model *m) {
    int i;
    if (!m) return;
    for (i = 0; i < m->num_modules; i++) { FSDP_FREE(m->modules[i].name); FSDP_FREE(m->modules[i].type); }
    for (i = 0; i < m->num_params; i++) FSDP_FREE(m->params[i].name);
    FSDP_FREE(m->modules);
    FSDP_FREE(m->params);
    FSDP_FREE(m);
}

/* "a.b" + "." + "c", or just "c" under the root. */
FSDP__PRIVATE char *fsdp__join_name(const char *prefix, const char *name) {
    size_t a = strlen(prefix), b = strlen(name);
    char *full = (char *)FSDP_MALLOC(a + b + 2);
    if (!full) return NULL;
    if (a) { memcpy(full, prefix, a); full[a] = '.'; memcpy(full + a + 1, name, b + 1); }
    else memcpy(full, name, b + 1);
    return full;
}

FSDP__PRIVATE int fsdp__valid_local_name(const char *name) {
    const char *c;
    if (!name || !*name) return 0;
    for (c = name; *c; c++)
        if (*c == '.' || *c == '"' || *c == '\\' || (unsigned char)*c < 0x20) return 0;
    return 1;
}

FSDP_API int fsdp_model_module(fsdp_model *m, int parent, const char *name, const char *type) {
    fsdp__module *mod;
    int i;
    char *full;
    if (!m || parent < 0 || parent >= m->num_modules || !fsdp__valid_local_name(name)) return FSDP_ERR_INVALID_ARG;
    full = fsdp__join_name(m->modules[parent].name, name);
    if (!full) return FSDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < m->num_modules; i++)
        if (strcmp(m->modules[i].name, full) == 0) { FSDP_FREE(full); return FSDP_ERR_INVALID_ARG; } /* duplicate */
    if (m->num_modules == m->cap_modules) {
        fsdp__module *grown = (fsdp__module *)FSDP_REALLOC(m->modules, sizeof *grown * (size_t)m->cap_modules * 2);
        if (!grown) { FSDP_FREE(full); return FSDP_ERR_OUT_OF_MEMORY; }
        m->modules = grown;
        m->cap_modules *= 2;
    }
    mod = &m->modules[m->num_modules];
    memset(mod, 0, sizeof *mod);
    mod->name = full;
    mod->type = fsdp__strdup(type && *type ? type : "Module");
    mod->parent = parent;
    if (!mod->type) { FSDP_FREE(full); return FSDP_ERR_OUT_OF_MEMORY; }
    return m->num_modules++;
}

FSDP_API int fsdp_model_param(fsdp_model *m, int module, const char *name, int ndim, const int64_t *shape,
                              fsdp_init_rule init) {
    fsdp__param *p;
    int i;
    int64_t numel = 1;
    char *full;
    if (!m || module < 0 || module >= m->num_modules || !fsdp__valid_local_name(name) || ndim < 0 ||
        ndim > FSDP_MAX_DIMS || (ndim && !shape) || (init.kind == FSDP_INIT_CALLBACK && !init.fn) ||
        (int)init.kind < 0 || init.kind > FSDP_INIT_CALLBACK)
        return FSDP_ERR_INVALID_ARG;
    for (i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || numel > ((int64_t)1 << 40) / shape[i]) return FSDP_ERR_INVALID_ARG;
        numel *= shape[i];
    }
    full = fsdp__join_name(m->modules[module].name, name);
    if (!full) return FSDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < m->num_params; i++)
        if (strcmp(m->params[i].name, full) == 0) { FSDP_FREE(full); return FSDP_ERR_INVALID_ARG; }
    if (m->num_params == m->cap_params) {
        int cap = m->cap_params ? m->cap_params * 2 : 16;
        fsdp__param *grown = (fsdp__param *)FSDP_REALLOC(m->params, sizeof *grown * (size_t)cap);
        if (!grown) { FSDP_FREE(full); return FSDP_ERR_OUT_OF_MEMORY; }
        m->params = grown;
        m->cap_params = cap;
    }
    p = &m->params[m->num_params];
    memset(p, 0, sizeof *p);
    p->name = full;
    p->module = module;
    p->ndim = ndim;
    for (i = 0; i < ndim; i++) p->shape[i] = shape[i];
    p->numel = numel;
    p->init = init;
    p->key = fsdp__hash_string(full);
    return m->num_params++;
}

FSDP_API int fsdp_model_num_modules(const fsdp_model *m) { return m ? m->num_modules : 0; }
FSDP_API int fsdp_model_num_params(const fsdp_model *m) { return m ? m->num_params : 0; }
FSDP_API const char *fsdp_model_module_name(const fsdp_model *m, int module) {
    return m && module >= 0 && module < m->num_modules ? m->modules[module].name : NULL;
}
FSDP_API const char *fsdp_model_param_name(const fsdp_model *m, int param) {
    return m && param >= 0 && param < m->num_params ? m->params[param].name : NULL;
}
FSDP_API int64_t fsdp_model_param_numel(const fsdp_model *m, int param) {
    return m && param >= 0 && param < m->num_params ? m->params[param].numel : -1;
}
FSDP_API int fsdp_model_param_shape(const fsdp_model *m, int param, int64_t *shape) {
    int i;
    if (!m || param < 0 || param >= m->num_params) return -1;
    for (i = 0; shape && i < m->params[param].ndim; i++) shape[i] = m->params[param].shape[i];
    return m->params[param].ndim;
}
FSDP_API int fsdp_model_find_param(const fsdp_model *m, const char *full_name) {
    int i;
    for (i = 0; m && full_name && i < m->num_params; i++)
        if (strcmp(m->params[i].name, full_name) == 0) return i;
    return -1;
}
FSDP_API int fsdp_model_wrap(fsdp_model *m, int module) {
    if (!m || module < 0 || module >= m->num_modules) return FSDP_ERR_INVALID_ARG;
    m->modules[module].marked = 1;
    return FSDP_SUCCESS;
}
FSDP_API int fsdp_model_param_set_trainable(fsdp_model *m, int param, int trainable) {
    if (!m || param < 0 || param >= m->num_params) return FSDP_ERR_INVALID_ARG;
    m->params[param].frozen = !trainable;
    return FSDP_SUCCESS;
}
FSDP_API int fsdp_model_set_trainable(fsdp_model *m, int module, int trainable) {
    int p, mod;
    if (!m || module < 0 || module >= m->num_modules) return FSDP_ERR_INVALID_ARG;
    for (p = 0; p < m->num_params; p++) { /* parents come before their children: walk up */
        for (mod = m->params[p].module; mod >= 0 && mod != module; mod = m->modules[mod].parent) {}
        if (mod == module) m->params[p].frozen = !trainable;
    }
    return FSDP_SUCCESS;
}
FSDP_API int fsdp_model_param_trainable(const fsdp_model *m, int param) {
    return m && param >= 0 && param < m->num_params ? !m->params[param].frozen : -1;
}
FSDP_API int fsdp_model_set_strategy(fsdp_model *m, int module, fsdp_strategy strategy) {
    if (!m || module < 0 || module >= m->num_modules || (int)strategy < 0 || strategy > FSDP_HYBRID_SHARD)
        return FSDP_ERR_INVALID_ARG;
    m->modules[module].strategy = strategy;
    return FSDP_SUCCESS;
}
FSDP_API int fsdp_model_set_reshard_after_forward(fsdp_model *m, int module, fsdp_reshard_mode mode) {
    if (!m || module < 0 || module >= m->num_modules || (int)mode < 0 || mode > FSDP_RESHARD_HOST)
        return FSDP_ERR_INVALID_ARG;
    m->modules[module].reshard = mode;
    return FSDP_SUCCESS;
}
FSDP_API int fsdp_model_set_wire(fsdp_model *m, int module, fsdp_wire param_wire, fsdp_wire grad_wire) {
    if (!m || module < 0 || module >= m->num_modules || (int)param_wire < 0 || param_wire > FSDP_WIRE_INT4 ||
        (int)grad_wire < 0 || grad_wire > FSDP_WIRE_INT4)
        return FSDP_ERR_INVALID_ARG;
    m->modules[module].param_wire = param_wire;
    m->modules[module].grad_wire = grad_wire;
    return FSDP_SUCCESS;
}

FSDP_API float fsdp_init_value(const fsdp_model *m, int param, int64_t index, uint64_t seed) {
    const fsdp__param *p;
    if (!m || param < 0 || param >= m->num_params) return 0.0f;
    p = &m->params[param];
    switch (p->init.kind) {
        case FSDP_INIT_ONES: return 1.0f;
        case FSDP_INIT_CONSTANT: return p->init.a;
        case FSDP_INIT_UNIFORM:
            return (float)(p->init.a + (p->init.b - p->init.a) * fsdp__uniform(seed, p->key, index, 0));
        case FSDP_INIT_NORMAL: { /* Box-Muller on two independent uniforms */
            double u1 = 1.0 - fsdp__uniform(seed, p->key, index, 0), u2 = fsdp__uniform(seed, p->key, index, 1);
            return (float)(p->init.a + p->init.b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        }
        case FSDP_INIT_CALLBACK: return p->init.fn(p->init.user, p->name, index, seed);
        default: return 0.0f;
    }
}

/* ============================================================================================
   >>wrap
   Units are found bottom-up: a module's "unwrapped" parameters are its own plus those of
   children that did not become units; the policy looks at that count (PyTorch's semantics).
   The root is always a unit and owns whatever no child unit took.
   ============================================================================================ */
typedef struct fsdp__plan_unit {
    int module;
    fsdp_strategy strategy;
    int num_params, num_frozen;
    int frozen;            /* it has parameters and all are frozen: no gradient, no optimizer state */
    int64_t numel, flat_numel, padded, shard;
    int group_size;
    fsdp_reshard_mode reshard; /* resolved: ALL, NONE or HOST */
    int host_ignored;      /* HOST was asked where it means nothing (ALL instead; fsdp_init says so) */
    fsdp_wire param_wire;  /* resolved: param_dtype's wire, INT8 or INT4 */
    size_t wire_block;     /* INT8/INT4: elements per block (shards are whole blocks) */
    fsdp_wire grad_wire;   /* resolved: INT8 or INT4 where the reduction crosses hosts quantized, else DEFAULT */
    int grad_hosts;        /* with grad_wire: the hosts H the reduction spans (the world is H x L ranks) */
    int grad_ignored;      /* INT8/INT4 was asked where the reduction never crosses a host (fsdp_init says so) */
    int64_t residual;      /* error feedback: floats of this rank's residual (H x shard), else 0 */
} fsdp__plan_unit;

typedef struct fsdp__plan {
    int num_units;
    fsdp__plan_unit *units;
    int *unit_of_module;   /* the unit a module's hooks act on */
    int *unit_of_param;
    int64_t *param_offset; /* in its unit's flat parameter */
} fsdp__plan;

#define FSDP__ALIGN_ELEMS 4 /* 16 bytes of f32: every parameter starts aligned */

FSDP__PRIVATE void fsdp__plan_free(fsdp__plan *plan) {
    FSDP_FREE(plan->units);
    FSDP_FREE(plan->unit_of_module);
    FSDP_FREE(plan->unit_of_param);
    FSDP_FREE(plan->param_offset);
    memset(plan, 0, sizeof *plan);
}

FSDP__PRIVATE int fsdp__type_listed(const char *const *types, const char *type) {
    for (; types && *types; types++)
        if (strcmp(*types, type) == 0) return 1;
    return 0;
}

/* The shard group a strategy divides a unit over. */
static int fsdp__group_size(fsdp_strategy strategy, int world, int hybrid_group) {
    if (strategy == FSDP_NO_SHARD) return 1;
    if (strategy == FSDP_HYBRID_SHARD) return hybrid_group;
    return world;
}

/* Whether some shard group of group_size consecutive ranks of comm (world ranks) spans several
   hosts: then backward's gather of a unit kept on its host (FSDP_RESHARD_HOST) saves links. The
   same answer on every rank. 0 without a comm of world ranks (one host assumed). */
static int fsdp__group_spans_hosts(const fsdp_comm *comm, int world, int group_size) {
    int r;
    if (!comm || fsdp_comm_size(comm) != world || fsdp_comm_num_hosts(comm) <= 1 || group_size <= 1) return 0;
    for (r = 0; r < world; r++)
        if (r % group_size != 0 && fsdp_comm_host_of(comm, r) != fsdp_comm_host_of(comm, r - 1)) return 1;
    return 0;
}

/* H if comm's world of `world` ranks is H hosts of L ranks each numbered host by host (rank r on
   the host of rank r - r % L), as fsdp_reduce_scatter_wire needs; 0 otherwise. The same answer on
   every rank. */
static int fsdp__hosts_in_blocks(const fsdp_comm *comm, int world) {
    int H = fsdp_comm_num_hosts(comm), L, r;
    if (H < 1 || world % H != 0) return 0;
    L = world / H;
    for (r = 1; r < world; r++)
        if ((fsdp_comm_host_of(comm, r) == fsdp_comm_host_of(comm, r - 1)) != (r % L != 0)) return 0;
    return H;
}

/* A unit's gradient wire gw (its module's or the description's) resolved into pu (after its
   shard is known): INT8/INT4 where its reduce-scatter crosses hosts, ignored where it never does,
   refused where it cannot be done. 0, or why in err. */
FSDP__PRIVATE int fsdp__plan_grad_wire(const fsdp_desc *desc, int world, fsdp__plan_unit *pu, const char *name,
                                       fsdp_wire gw, char *err, size_t err_size) {
    int H;
    if (gw == FSDP_WIRE_DEFAULT) return 0;
    if (gw != FSDP_WIRE_INT8 && gw != FSDP_WIRE_INT4) {
        if ((int)gw == (int)desc->reduce_dtype) return 0;
        fsdp__fmt(err, err_size, "unit '%s': grad_wire %s differs from reduce_dtype %s: a float reduction moves "
                  "reduce_dtype (set reduce_dtype, or grad_wire int8 or int4)", name, fsdp_wire_name(gw),
                  fsdp_dtype_name(desc->reduce_dtype));
        return FSDP_ERR_INVALID_ARG;
    }
    if (pu->strategy == FSDP_HYBRID_SHARD) {
        fsdp__fmt(err, err_size, "unit '%s': grad_wire %s with HYBRID_SHARD: not supported (its all-reduce over the "
                  "replicas would cross hosts unquantized): use FULL_SHARD or SHARD_GRAD_OP for it", name,
                  fsdp_wire_name(gw));
        return FSDP_ERR_UNSUPPORTED;
    }
    if (!fsdp__group_spans_hosts(desc->comm, world, pu->group_size)) {
        pu->grad_ignored = 1;
        return 0;
    }
    if ((H = fsdp__hosts_in_blocks(desc->comm, world)) == 0) {
        fsdp__fmt(err, err_size, "unit '%s': grad_wire %s needs every host to hold the same number of ranks, numbered "
                  "host by host (this world: %d ranks on %d hosts)", name, fsdp_wire_name(gw), world,
                  fsdp_comm_num_hosts(desc->comm));
        return FSDP_ERR_UNSUPPORTED;
    }
    pu->grad_wire = gw;
    pu->grad_hosts = H;
    pu->residual = desc->error_feedback && !pu->frozen ? (int64_t)H * pu->shard : 0;
    return 0;
}

/* Each unit's reshard mode and parameter wire, from its module's settings or the description's
   (validated there), and its padding: a quantized unit's shards are whole blocks, so that blocks
   begin at the same flat offsets at every world size. */
FSDP__PRIVATE int fsdp__plan_unit_modes(const fsdp_model *m, const fsdp_desc *desc, int world, fsdp__plan *plan,
                                        char *err, size_t err_size) {
    int u, rc;
    for (u = 0; u < plan->num_units; u++) {
        fsdp__plan_unit *pu = &plan->units[u];
        const fsdp__module *md = &m->modules[pu->module];
        const char *name = *md->name ? md->name : "(root)";
        fsdp_reshard_mode asked = md->reshard ? md->reshard : desc->reshard_after_forward;
        fsdp_wire pw = md->param_wire ? md->param_wire : desc->param_wire, gw = md->grad_wire ? md->grad_wire : desc->grad_wire;
        int64_t g = pu->group_size, granule = g;
        if (pw >= FSDP_WIRE_F32 && pw <= FSDP_WIRE_F16 && (int)pw != (int)desc->param_dtype) {
            fsdp__fmt(err, err_size, "unit '%s': param_wire %s differs from param_dtype %s: a float gather moves "
                      "param_dtype (set param_dtype, or param_wire int8 or int4)", name, fsdp_wire_name(pw),
                      fsdp_dtype_name(desc->param_dtype));
            return FSDP_ERR_INVALID_ARG;
        }
        pu->param_wire = pw == FSDP_WIRE_INT8 || pw == FSDP_WIRE_INT4 ? pw : (fsdp_wire)desc->param_dtype;
        if (pu->param_wire == FSDP_WIRE_INT8 || pu->param_wire == FSDP_WIRE_INT4) {
            pu->wire_block = fsdp__wire_block(desc->wire_block);
            granule = g * (int64_t)pu->wire_block;
        }
        pu->padded = (pu->flat_numel + granule - 1) / granule * granule;
        pu->shard = pu->padded / g;
        if ((rc = fsdp__plan_grad_wire(desc, world, pu, name, gw, err, err_size)) != 0) return rc;
        if (u == 0) pu->reshard = FSDP_RESHARD_NONE; /* the root: its backward follows at once */
        else if (asked == FSDP_RESHARD_DEFAULT)
            pu->reshard = pu->strategy == FSDP_FULL_SHARD || pu->strategy == FSDP_HYBRID_SHARD ? FSDP_RESHARD_ALL
                                                                                                  : FSDP_RESHARD_NONE;
        else pu->reshard = asked;
        if (pu->reshard == FSDP_RESHARD_HOST && !fsdp__group_spans_hosts(desc->comm, world, pu->group_size)) {
            pu->reshard = FSDP_RESHARD_ALL;
            pu->host_ignored = 1;
        }
    }
    return 0;
}

/* The shard group size matters to HYBRID_SHARD units only (the others shard over the world, or
   not at all): it must divide the world where one is, whether desc.strategy or
   fsdp_model_set_strategy made it so. */
static int fsdp__plan_check_hybrid(const fsdp_model *m, const fsdp__plan *plan, int world, int hybrid_group, char *err,
                                   size_t err_size) {
    int u;
    if (hybrid_group <= world && world % hybrid_group == 0) return 0;
    for (u = 0; u < plan->num_units; u++)
        if (plan->units[u].strategy == FSDP_HYBRID_SHARD) {
            int mod = plan->units[u].module;
            fsdp__fmt(err, err_size, "shard_group_size %d must divide the world size %d: unit %d '%s' is HYBRID_SHARD (%s)",
                      hybrid_group, world, u, *m->modules[mod].name ? m->modules[mod].name : "(root)",
                      m->modules[mod].strategy ? "fsdp_model_set_strategy" : "desc.strategy");
            return FSDP_ERR_INVALID_ARG;
        }
    return 0;
}

FSDP__PRIVATE int fsdp__plan_build(const fsdp_model *m, const fsdp_desc *desc, int world, int hybrid_group,
                                   fsdp__plan *plan, char *err, size_t err_size) {
    int64_t *unwrapped = NULL;
    int *is_unit = NULL, mod, p, u;
    fsdp_strategy fallback = desc->strategy ? desc->strategy : FSDP_FULL_SHARD;
    fsdp_wrap_kind kind = desc->wrap.kind ? desc->wrap.kind : FSDP_WRAP_NONE;
    memset(plan, 0, sizeof *plan);
    if ((int)kind < 0 || kind > FSDP_WRAP_MANUAL || (kind == FSDP_WRAP_TYPES && !desc->wrap.types) ||
        (kind == FSDP_WRAP_PREDICATE && !desc->wrap.predicate) || (kind == FSDP_WRAP_SIZE && desc->wrap.min_params <= 0)) {
        fsdp__fmt(err, err_size, "wrap policy %d is incomplete (SIZE needs min_params > 0, TYPES a NULL-terminated "
                  "list, PREDICATE a function)", (int)kind);
        return FSDP_ERR_INVALID_ARG;
    }
    if ((int)fallback < 0 || fallback > FSDP_HYBRID_SHARD) {
        fsdp__fmt(err, err_size, "strategy %d is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD", (int)fallback);
        return FSDP_ERR_INVALID_ARG;
    }
    unwrapped = (int64_t *)fsdp__calloc(sizeof *unwrapped * (size_t)m->num_modules);
    is_unit = (int *)fsdp__calloc(sizeof *is_unit * (size_t)m->num_modules);
    plan->unit_of_module = (int *)fsdp__calloc(sizeof(int) * (size_t)m->num_modules);
    plan->unit_of_param = (int *)fsdp__calloc(sizeof(int) * (size_t)(m->num_params + 1));
    plan->param_offset = (int64_t *)fsdp__calloc(sizeof(int64_t) * (size_t)(m->num_params + 1));
    plan->units = (fsdp__plan_unit *)fsdp__calloc(sizeof *plan->units * (size_t)m->num_modules);
    if (!unwrapped || !is_unit || !plan->unit_of_module || !plan->unit_of_param || !plan->param_offset || !plan->units) {
        FSDP_FREE(unwrapped);
        FSDP_FREE(is_unit);
        fsdp__plan_free(plan);
        fsdp__fmt(err, err_size, "out of memory");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    for (p = 0; p < m->num_params; p++) unwrapped[m->params[p].module] += m->params[p].numel;
    for (mod = m->num_modules - 1; mod >= 0; mod--) { /* children have larger ids than parents */
        const fsdp__module *md = &m->modules[mod];
        int wrap = mod == 0 || md->marked;
        if (!wrap && kind == FSDP_WRAP_SIZE) wrap = unwrapped[mod] >= desc->wrap.min_params;
        if (!wrap && kind == FSDP_WRAP_TYPES) wrap = fsdp__type_listed(desc->wrap.types, md->type);
        if (!wrap && kind == FSDP_WRAP_PREDICATE)
            wrap = desc->wrap.predicate(desc->wrap.user, m, mod, unwrapped[mod]) != 0;
        is_unit[mod] = wrap;
        if (!wrap && md->parent >= 0) unwrapped[md->parent] += unwrapped[mod];
    }
    for (mod = 0; mod < m->num_modules; mod++) { /* units in declaration order */
        if (is_unit[mod]) {
            fsdp__plan_unit *pu = &plan->units[plan->num_units];
            pu->module = mod;
            pu->strategy = m->modules[mod].strategy ? m->modules[mod].strategy : fallback;
            pu->group_size = fsdp__group_size(pu->strategy, world, hybrid_group);
            plan->unit_of_module[mod] = plan->num_units++;
        } else {
            plan->unit_of_module[mod] = plan->unit_of_module[m->modules[mod].parent];
        }
    }
    for (p = 0; p < m->num_params; p++) { /* flat layout, parameters in declaration order */
        fsdp__plan_unit *pu;
        u = plan->unit_of_module[m->params[p].module];
        pu = &plan->units[u];
        plan->unit_of_param[p] = u;
        pu->flat_numel = (pu->flat_numel + FSDP__ALIGN_ELEMS - 1) / FSDP__ALIGN_ELEMS * FSDP__ALIGN_ELEMS;
        plan->param_offset[p] = pu->flat_numel;
        pu->flat_numel += m->params[p].numel;
        pu->numel += m->params[p].numel;
        pu->num_params++;
        pu->num_frozen += m->params[p].frozen != 0;
    }
    for (u = 0; u < plan->num_units; u++) {
        fsdp__plan_unit *pu = &plan->units[u];
        pu->frozen = pu->num_params > 0 && pu->num_frozen == pu->num_params; /* (padding: fsdp__plan_unit_modes) */
    }
    FSDP_FREE(unwrapped);
    FSDP_FREE(is_unit);
    if (fsdp__plan_check_hybrid(m, plan, world, hybrid_group, err, err_size) != 0) {
        fsdp__plan_free(plan);
        return FSDP_ERR_INVALID_ARG;
    }
    if ((u = fsdp__plan_unit_modes(m, desc, world, plan, err, err_size)) != 0) fsdp__plan_free(plan);
    return u;
}

/* ============================================================================================
   >>optimizer
   The shipped optimizers, one row each (see the declarations). The step that calls a row's
   update on every unit's shard, clipping and skipping non-finite steps, is fsdp_step (>>runtime).
   ============================================================================================ */
static int fsdp__sgd_num_state(const fsdp_optimizer_desc *d) { return d->momentum != 0.0f; }

static const char *fsdp__sgd_check(const fsdp_optimizer_desc *d) {
    if (!(d->momentum >= 0 && d->momentum < 1)) return "momentum must be in [0, 1)";
    if (!(d->dampening >= 0 && d->dampening <= 1)) return "dampening must be in [0, 1]";
    if (d->nesterov && (d->momentum <= 0 || d->dampening != 0)) return "nesterov needs momentum > 0 and dampening 0";
    return NULL;
}

static void fsdp__sgd_update(const fsdp_optimizer_step *s) {
    const fsdp_optimizer_desc *o = s->desc;
    float *p = s->param, *buf = s->state[0];
    const float *g = s->grad;
    size_t i;
    for (i = 0; i < s->count; i++) {
        float d = g[i] + s->weight_decay * p[i];
        if (o->momentum != 0.0f) {
            buf[i] = s->step == 0 ? d : o->momentum * buf[i] + (1.0f - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * buf[i] : buf[i];
        }
        p[i] -= s->lr * d;
    }
}

static void fsdp__adam_defaults(fsdp_optimizer_desc *d) {
    if (d->beta1 == 0.0f) d->beta1 = 0.9f;
    if (d->beta2 == 0.0f) d->beta2 = 0.999f;
    if (d->eps == 0.0f) d->eps = 1e-8f;
}

static void fsdp__adamw_defaults(fsdp_optimizer_desc *d) {
    fsdp__adam_defaults(d);
    if (d->weight_decay == 0.0f && !d->weight_decay_set) d->weight_decay = 0.01f;
}

static const char *fsdp__adam_check(const fsdp_optimizer_desc *d) {
    if (!(d->beta1 >= 0 && d->beta1 < 1) || !(d->beta2 >= 0 && d->beta2 < 1)) return "betas must be in [0, 1)";
    if (!(d->eps >= 0)) return "eps must be >= 0";
    return NULL;
}

/* Adam's update; decoupled: AdamW's weight decay (on the parameter, not in the gradient). */
static void fsdp__adam_fold(const fsdp_optimizer_step *s, int decoupled) {
    const fsdp_optimizer_desc *o = s->desc;
    double t = (double)(s->step + 1);
    float bc1 = (float)(1.0 - pow((double)o->beta1, t)), bc2 = (float)(1.0 - pow((double)o->beta2, t));
    float step_size = s->lr / bc1, bc2_sqrt = sqrtf(bc2);
    float *p = s->param, *m = s->state[0], *v = s->state[1];
    const float *g = s->grad;
    size_t i;
    for (i = 0; i < s->count; i++) {
        float d = g[i];
        if (decoupled) p[i] *= 1.0f - s->lr * s->weight_decay;
        else d += s->weight_decay * p[i];
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * d;
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * d * d;
        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + o->eps);
    }
}

static void fsdp__adam_update(const fsdp_optimizer_step *s) { fsdp__adam_fold(s, 0); }
static void fsdp__adamw_update(const fsdp_optimizer_step *s) { fsdp__adam_fold(s, 1); }

static const fsdp_optimizer fsdp__optimizers[3] = {
    {"sgd", {"momentum_buffer", NULL}, fsdp__sgd_num_state, NULL, fsdp__sgd_check, fsdp__sgd_update},
    {"adam", {"exp_avg", "exp_avg_sq", NULL}, NULL, fsdp__adam_defaults, fsdp__adam_check, fsdp__adam_update},
    {"adamw", {"exp_avg", "exp_avg_sq", NULL}, NULL, fsdp__adamw_defaults, fsdp__adam_check, fsdp__adamw_update}};

FSDP_API const fsdp_optimizer *fsdp_optimizer_of(fsdp_optimizer_kind kind) {
    if (kind == FSDP_OPTIMIZER_DEFAULT) kind = FSDP_SGD;
    return kind >= FSDP_SGD && kind <= FSDP_ADAMW ? &fsdp__optimizers[kind - FSDP_SGD] : NULL;
}

/* The row a (resolved) description selects. */
static const fsdp_optimizer *fsdp__optimizer_row(const fsdp_optimizer_desc *o) {
    return o->kind == FSDP_OPTIMIZER_CUSTOM ? o->custom : fsdp_optimizer_of(o->kind);
}

FSDP__PRIVATE const char *fsdp__optimizer_name(const fsdp_optimizer *row) {
    return row->name && *row->name ? row->name : "custom";
}

/* How many state buffers the settings keep per parameter element. */
FSDP__PRIVATE int fsdp__optimizer_num_state(const fsdp_optimizer_desc *o) {
    const fsdp_optimizer *row = fsdp__optimizer_row(o);
    int n = 0;
    if (!row) return 0;
    if (row->num_state) return row->num_state(o);
    while (n < FSDP_OPTIMIZER_MAX_STATE && row->state_names[n]) n++;
    return n;
}

/* FSDP_NO_WEIGHT_DECAY: a zero with the sign bit, by its bits (-ffast-math lets signbit() and
   comparisons ignore the sign of a zero). */
static int fsdp__is_no_weight_decay(float weight_decay) {
    uint32_t bits;
    memcpy(&bits, &weight_decay, sizeof bits);
    return bits == 0x80000000u;
}

/* Picks the row (kind 0: SGD, or custom when set) and fills the defaults. */
FSDP__PRIVATE void fsdp__optimizer_defaults(fsdp_optimizer_desc *o) {
    const fsdp_optimizer *row;
    if (fsdp__is_no_weight_decay(o->weight_decay)) { /* before the row's defaults, which then keep it */
        o->weight_decay = 0.0f;
        o->weight_decay_set = 1;
    }
    if (o->kind == FSDP_OPTIMIZER_DEFAULT) o->kind = o->custom ? FSDP_OPTIMIZER_CUSTOM : FSDP_SGD;
    if (o->lr == 0.0f) o->lr = 1e-3f;
    if (o->state_dtype == FSDP_DTYPE_DEFAULT) o->state_dtype = FSDP_F32;
    if ((row = fsdp__optimizer_row(o)) != NULL && row->defaults) row->defaults(o);
}

/* Checks settings with their defaults filled: 0, or FSDP_ERR_INVALID_ARG with why in err. */
FSDP__PRIVATE int fsdp__optimizer_check(const fsdp_optimizer_desc *o, char *err, size_t err_size) {
    const fsdp_optimizer *row = fsdp__optimizer_row(o);
    const char *why = NULL;
    char name[40];
    int n, i;
    if ((int)o->kind < FSDP_SGD || o->kind > FSDP_OPTIMIZER_CUSTOM) {
        fsdp__fmt(err, err_size, "optimizer %d is not SGD, ADAM, ADAMW or CUSTOM", (int)o->kind);
        return FSDP_ERR_INVALID_ARG;
    }
    if (!row || !row->update) {
        fsdp__fmt(err, err_size, "optimizer CUSTOM needs optimizer.custom with an update function");
        return FSDP_ERR_INVALID_ARG;
    }
    n = fsdp__optimizer_num_state(o);
    if (o->state_dtype != FSDP_F32 && o->state_dtype != FSDP_BF16) why = "state_dtype must be FSDP_F32 or FSDP_BF16";
    else if (!(o->lr > 0) || !isfinite(o->lr)) why = "lr must be > 0 and finite";
    else if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay)) why = "weight_decay must be >= 0 and finite";
    else if (n < 0 || n > FSDP_OPTIMIZER_MAX_STATE) why = "it keeps more state buffers than FSDP_OPTIMIZER_MAX_STATE";
    else if (row->check) why = row->check(o);
    for (i = 0; !why && i < n; i++)
        if (!row->state_names[i] || !*row->state_names[i] || strchr(row->state_names[i], '.'))
            why = "every state it keeps needs a name, without '.' (checkpoints store <param>.<name>)";
    if (!why) return 0;
    fsdp__fmt(err, err_size, "optimizer %s: %s", fsdp_printable(name, sizeof name, fsdp__optimizer_name(row)), why);
    return FSDP_ERR_INVALID_ARG;
}

/* The settings o resolved from given (fsdp__optimizer_defaults), in words for the log and
   fsdp_print_units, saying where the weight decay came from: "AdamW: lr 0.001, betas (0.9,
   0.999), eps 1e-08, weight_decay 0.01 (AdamW's default: set .weight_decay =
   FSDP_NO_WEIGHT_DECAY for none), state f32". */
FSDP__PRIVATE void fsdp__optimizer_describe(const fsdp_optimizer_desc *given, const fsdp_optimizer_desc *o, char *out,
                                            size_t size) {
    static const char *const titles[3] = {"SGD", "Adam", "AdamW"};
    const fsdp_optimizer *row = fsdp__optimizer_row(o);
    char title[40], hyper[160], decay[160];
    if (o->kind >= FSDP_SGD && o->kind <= FSDP_ADAMW) fsdp__copy_string(title, sizeof title, titles[o->kind - FSDP_SGD]);
    else fsdp_printable(title, sizeof title, row ? fsdp__optimizer_name(row) : "custom");
    if (o->kind == FSDP_SGD && o->momentum != 0.0f)
        fsdp__fmt(hyper, sizeof hyper, ", momentum %g, dampening %g%s", (double)o->momentum, (double)o->dampening,
                  o->nesterov ? ", nesterov" : "");
    else if (o->kind == FSDP_SGD)
        fsdp__fmt(hyper, sizeof hyper, ", no momentum");
    else if (o->kind == FSDP_ADAM || o->kind == FSDP_ADAMW)
        fsdp__fmt(hyper, sizeof hyper, ", betas (%g, %g), eps %g", (double)o->beta1, (double)o->beta2, (double)o->eps);
    else /* a row of the user's: the fields it may read */
        fsdp__fmt(hyper, sizeof hyper, ", momentum %g, dampening %g, nesterov %d, betas (%g, %g), eps %g", (double)o->momentum,
                  (double)o->dampening, o->nesterov, (double)o->beta1, (double)o->beta2, (double)o->eps);
    if (fsdp__is_no_weight_decay(given->weight_decay))
        fsdp__fmt(decay, sizeof decay, "weight_decay 0 (FSDP_NO_WEIGHT_DECAY)");
    else if (given->weight_decay == 0.0f && o->weight_decay != 0.0f)
        fsdp__fmt(decay, sizeof decay, "weight_decay %g (%s's default: set .weight_decay = FSDP_NO_WEIGHT_DECAY for none)",
                  (double)o->weight_decay, title);
    else if (given->weight_decay == 0.0f && given->weight_decay_set)
        fsdp__fmt(decay, sizeof decay, "weight_decay 0 (weight_decay_set)");
    else
        fsdp__fmt(decay, sizeof decay, "weight_decay %g", (double)o->weight_decay);
    fsdp__fmt(out, size, "%s: lr %g%s, %s, state %s", title, (double)o->lr, hyper, decay, fsdp_dtype_name(o->state_dtype));
}

/* Which state buffer a checkpoint tensor's suffix ("exp_avg") names: its index among the k the
   context keeps; FSDP__STATE_NOT_KEPT for the state of another optimizer or of settings that keep
   less (skipped on load, as PyTorch skips unknown state); -1 if no optimizer has such state. */
#define FSDP__STATE_NOT_KEPT (-2)
FSDP__PRIVATE int fsdp__optimizer_state_index(const fsdp_optimizer *row, int kept, const char *suffix) {
    int k, r;
    for (k = 0; k < FSDP_OPTIMIZER_MAX_STATE && row->state_names[k]; k++)
        if (strcmp(row->state_names[k], suffix) == 0) return k < kept ? k : FSDP__STATE_NOT_KEPT;
    for (r = 0; r < 3; r++)
        for (k = 0; k < FSDP_OPTIMIZER_MAX_STATE && fsdp__optimizers[r].state_names[k]; k++)
            if (strcmp(fsdp__optimizers[r].state_names[k], suffix) == 0) return FSDP__STATE_NOT_KEPT;
    return -1;
}

/* ============================================================================================
   >>offload
   One file per rank, written and read in whole aligned blocks by an I/O thread that runs the
   requests in the order they were made; callers wait for a ticket. Every failure names the file,
   the offset and the bytes, and stays: later requests fail with it.
   ============================================================================================ */
/* The recorder of >>trace (whose section follows >>json), for the sections between. */
enum { FSDP__TID_COMPUTE, FSDP__TID_COMM, FSDP__TID_STEP, FSDP__TID_IO, FSDP__TID_CKPT, FSDP__TRACE_TIDS };
typedef struct fsdp__trace_event {
    double t0, t1, issued;       /* fsdp_now(); issued: when a collective's task was queued */
    const char *cat, *name;      /* static strings (name NULL: text is the name, a user's span) */
    const char *wait_for;        /* a wait's cause, or NULL */
    int tid, unit, group, group_index; /* unit, group: -1 none (group: 0 world, 1 shard, 2 replica) */
    int64_t bytes, seq, step;    /* -1: none */
    int skipped;
    uint64_t sent_host, sent_net; /* iterations: what the rank sent in it (fsdp_step_report) */
    char text[64];               /* a user's span name, a checkpoint's path */
} fsdp__trace_event;
typedef struct fsdp__trace fsdp__trace;
/* The trace row of the calling thread: each of fsdp.h's threads sets it when it starts; other
   threads are the compute thread's (thread-local: the one piece of state outside the objects). */
static __thread int fsdp__trace_thread;
FSDP__PRIVATE void fsdp__trace_io(fsdp__trace *tr, int write, size_t bytes, double t0, double t1);

#define FSDP__IO_ALIGN ((size_t)4096)             /* O_DIRECT's unit for offsets, lengths, buffers */
#define FSDP__OFFLOAD_RAM_DEFAULT ((size_t)64 << 20)
#define FSDP__IO_QUEUE 64

typedef struct fsdp__io_req {
    int write;
    int64_t offset;
    size_t bytes;
    void *buf;
} fsdp__io_req;

typedef struct fsdp__offload {
    int fd;
    int direct;             /* O_DIRECT; else every block is written back and dropped from the page cache */
    int rank;
    char where[300];        /* "the offload file of rank 3 in /scratch", for messages */
    int64_t size;           /* bytes reserved */
    pthread_t thread;
    int thread_started, stop;
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    fsdp__io_req queue[FSDP__IO_QUEUE];
    int head, len;
    uint64_t issued, completed;
    int error;              /* the first failure (FSDP_ERR_IO, FSDP_ERR_NO_SPACE) and its message */
    char message[FSDP__ERRMSG];
    uint64_t bytes_read, bytes_written;
    double io_seconds, wait_seconds;
    fsdp__trace *trace;     /* the context's, or NULL */
} fsdp__offload;

/* Memory aligned for O_DIRECT, from FSDP_MALLOC (a user's allocator sees every byte): the block
   from malloc is kept just before the aligned start. Freed with fsdp__aligned_free only. */
static void *fsdp__aligned_alloc(size_t bytes) {
    size_t size = fsdp__align(bytes ? bytes : 1, FSDP__IO_ALIGN);
    char *raw, *aligned;
    if (size > SIZE_MAX - FSDP__IO_ALIGN - sizeof(void *) || !(raw = (char *)FSDP_MALLOC(size + FSDP__IO_ALIGN + sizeof(void *))))
        return NULL;
    aligned = raw + sizeof(void *) + (FSDP__IO_ALIGN - (uintptr_t)(raw + sizeof(void *)) % FSDP__IO_ALIGN) % FSDP__IO_ALIGN;
    memcpy(aligned - sizeof(void *), &raw, sizeof raw);
    return aligned;
}

static void fsdp__aligned_free(void *aligned) {
    void *raw;
    if (!aligned) return;
    memcpy(&raw, (char *)aligned - sizeof(void *), sizeof raw);
    FSDP_FREE(raw);
}

/* Runs one request; 0, or the failure with its message set. */
FSDP__PRIVATE int fsdp__io_run(fsdp__offload *o, const fsdp__io_req *r, char *message, size_t size) {
    size_t done = 0;
    while (done < r->bytes) {
        ssize_t n = r->write ? pwrite(o->fd, (const char *)r->buf + done, r->bytes - done, (off_t)(r->offset + (int64_t)done))
                             : pread(o->fd, (char *)r->buf + done, r->bytes - done, (off_t)(r->offset + (int64_t)done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = n < 0 ? errno : 0;
            fsdp__fmt(message, size, "offload: %s %zu bytes at offset %lld of %s failed: %s", r->write ? "writing" : "reading",
                      r->bytes, (long long)r->offset, o->where,
                      n == 0 ? "short read (the file ends early)" : strerror(err));
            return err == ENOSPC || err == EDQUOT ? FSDP_ERR_NO_SPACE : FSDP_ERR_IO;
        }
        done += (size_t)n;
    }
#if defined(__linux__)
    if (!o->direct) { /* the bytes leave RAM all the same: written back, then dropped */
#  if defined(SYS_sync_file_range) /* by number: the wrapper is declared only under _GNU_SOURCE (as process_vm_readv) */
        if (r->write) syscall(SYS_sync_file_range, o->fd, (off_t)r->offset, (off_t)r->bytes, 1 | 2 | 4); /* wait, write, wait */
#  else
        if (r->write) fdatasync(o->fd);
#  endif
        posix_fadvise(o->fd, (off_t)r->offset, (off_t)r->bytes, POSIX_FADV_DONTNEED);
    }
#endif
    return 0;
}

/* Runs a request taken off the queue (the lock not held), unless an earlier one failed; its time
   added to *seconds. 0, or the failure with its message set. */
FSDP__PRIVATE int fsdp__io_serve(fsdp__offload *o, const fsdp__io_req *r, char *message, size_t size, double *seconds) {
    int rc = 0;
    double t, began;
    FSDP__CHAOS(FSDP__CHAOS_IO);
    t = began = fsdp_now();
    if (!__atomic_load_n(&o->error, __ATOMIC_ACQUIRE)) rc = fsdp__io_run(o, r, message, size);
    t = fsdp_now() - t;
    if (o->trace) fsdp__trace_io(o->trace, r->write, r->bytes, began, began + t);
    *seconds += t;
    return rc;
}

#ifdef FSDP_CHAOS
/* (>>chaos) Requests a and b must run in the order they were made: the same bytes of the file
   with a write among them, or the same memory with a read (which writes memory) among them. */
static int fsdp__io_conflict(const fsdp__io_req *a, const fsdp__io_req *b) {
    const char *am = (const char *)a->buf, *bm = (const char *)b->buf;
    int file = a->offset < b->offset + (int64_t)b->bytes && b->offset < a->offset + (int64_t)a->bytes;
    int memory = am < bm + b->bytes && bm < am + a->bytes;
    return (file && (a->write || b->write)) || (memory && (!a->write || !b->write));
}

/* Now and then every queued request, in a random order that keeps each after any earlier one it
   conflicts with (a disk with several requests in flight completes them in any order); else
   the oldest. They stay queued, and are counted complete together once all ran. */
FSDP__PRIVATE int fsdp__io_chaos_take(fsdp__offload *o, fsdp__io_req *batch) {
    fsdp__io_req left[FSDP__IO_QUEUE];
    int n = FSDP__CHAOS_COIN(FSDP__CHAOS_IO) ? o->len : 1, remaining = n, i, k;
    for (i = 0; i < n; i++) left[i] = o->queue[(o->head + i) % FSDP__IO_QUEUE];
    for (k = 0; k < n; k++) {
        int ready[FSDP__IO_QUEUE], nready = 0, j, pick;
        for (i = 0; i < remaining; i++) {
            for (j = 0; j < i && !fsdp__io_conflict(&left[j], &left[i]); j++) {}
            if (j == i) ready[nready++] = i;
        }
        pick = ready[FSDP__CHAOS_PICK(nready)];
        batch[k] = left[pick];
        for (i = pick; i + 1 < remaining; i++) left[i] = left[i + 1];
        remaining--;
    }
    return n;
}
#  define FSDP__IO_BATCH FSDP__IO_QUEUE
#  define FSDP__IO_TAKE(o, batch) fsdp__io_chaos_take((o), (batch))
#else
#  define FSDP__IO_BATCH 1 /* requests taken off the queue at once */
#  define FSDP__IO_TAKE(o, batch) ((batch)[0] = (o)->queue[(o)->head], 1)
#endif

static void *fsdp__io_thread(void *arg) {
    fsdp__offload *o = (fsdp__offload *)arg;
    fsdp__trace_thread = FSDP__TID_IO;
    pthread_mutex_lock(&o->lock);
    for (;;) {
        fsdp__io_req batch[FSDP__IO_BATCH];
        char message[FSDP__ERRMSG];
        double seconds = 0;
        int n, i, k, rc = 0;
        while (!o->len && !o->stop) pthread_cond_wait(&o->work, &o->lock);
        if (!o->len) break;
        n = FSDP__IO_TAKE(o, batch);
        pthread_mutex_unlock(&o->lock);
        for (i = 0; i < n && !rc; i++) rc = fsdp__io_serve(o, &batch[i], message, sizeof message, &seconds);
        FSDP__CHAOS(FSDP__CHAOS_IO);
        pthread_mutex_lock(&o->lock);
        o->io_seconds += seconds;
        if (rc && !o->error) {
            fsdp__copy_string(o->message, sizeof o->message, message);
            __atomic_store_n(&o->error, rc, __ATOMIC_RELEASE);
        }
        for (k = 0; k < i - (rc != 0); k++) { /* the requests that ran (a failure ends the batch) */
            if (batch[k].write) o->bytes_written += batch[k].bytes;
            else o->bytes_read += batch[k].bytes;
        }
        o->head = (o->head + n) % FSDP__IO_QUEUE;
        o->len -= n;
        o->completed += (uint64_t)n;
        pthread_cond_broadcast(&o->done);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

/* Queues a read or write of whole aligned blocks (offset, bytes and buf aligned to
   FSDP__IO_ALIGN); its ticket for fsdp__io_wait. */
FSDP__PRIVATE uint64_t fsdp__io_submit(fsdp__offload *o, int write, int64_t offset, void *buf, size_t bytes) {
    uint64_t ticket;
    FSDP_ASSERT(offset % (int64_t)FSDP__IO_ALIGN == 0 && bytes % FSDP__IO_ALIGN == 0 && (uintptr_t)buf % FSDP__IO_ALIGN == 0);
    pthread_mutex_lock(&o->lock);
    while (o->len == FSDP__IO_QUEUE) pthread_cond_wait(&o->done, &o->lock);
    o->queue[(o->head + o->len) % FSDP__IO_QUEUE].write = write;
    o->queue[(o->head + o->len) % FSDP__IO_QUEUE].offset = offset;
    o->queue[(o->head + o->len) % FSDP__IO_QUEUE].bytes = bytes;
    o->queue[(o->head + o->len) % FSDP__IO_QUEUE].buf = buf;
    o->len++;
    ticket = ++o->issued;
    pthread_cond_signal(&o->work);
    pthread_mutex_unlock(&o->lock);
    return ticket;
}

/* Waits until the request with this ticket (0: every one) is done; 0, or the first failure,
   whose message is in o->message. */
FSDP__PRIVATE int fsdp__io_wait(fsdp__offload *o, uint64_t ticket) {
    int rc;
    double t = 0;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    pthread_mutex_lock(&o->lock);
    if (!ticket) ticket = o->issued;
    if (o->completed < ticket) t = fsdp_now();
    while (o->completed < ticket) pthread_cond_wait(&o->done, &o->lock);
    if (t > 0) o->wait_seconds += fsdp_now() - t;
    rc = o->error;
    pthread_mutex_unlock(&o->lock);
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    return rc;
}

/* Bytes [at, at + n) of the file, at any alignment, to or from mem (through an aligned bounce
   buffer of the blocks around them; a write reads those blocks first). */
FSDP__PRIVATE int fsdp__io_bytes(fsdp__offload *o, int write, int64_t at, void *mem, size_t n) {
    int64_t first = at / (int64_t)FSDP__IO_ALIGN * (int64_t)FSDP__IO_ALIGN;
    size_t span = fsdp__align((size_t)(at - first) + n, FSDP__IO_ALIGN);
    char *bounce = (char *)fsdp__aligned_alloc(span);
    int rc;
    if (!bounce) return FSDP_ERR_OUT_OF_MEMORY;
    rc = fsdp__io_wait(o, fsdp__io_submit(o, 0, first, bounce, span));
    if (!rc && write) {
        memcpy(bounce + (at - first), mem, n);
        rc = fsdp__io_wait(o, fsdp__io_submit(o, 1, first, bounce, span));
    } else if (!rc) {
        memcpy(mem, bounce + (at - first), n);
    }
    fsdp__aligned_free(bounce);
    return rc;
}

/* Whether dir can hold offloaded state: a directory on a disk (tmpfs and ramfs are RAM: refused
   unless allowed) with room for need bytes times the ranks of this host, which share it. 0, or
   FSDP_ERR_INVALID_ARG / FSDP_ERR_NO_SPACE with why. */
FSDP__PRIVATE int fsdp__offload_check_dir(const char *dir, int allow_tmpfs, size_t need, int local_ranks, char *why,
                                          size_t size) {
    struct statvfs vfs;
    double free_bytes, wanted = (double)need * (double)(local_ranks > 0 ? local_ranks : 1);
    char shown[200];
    fsdp_printable(shown, sizeof shown, dir);
#if defined(__linux__)
    {
        struct statfs fs;
        if (statfs(dir, &fs) != 0)
            return fsdp__fmt(why, size, "offload directory %s: %s", shown, strerror(errno)), FSDP_ERR_INVALID_ARG;
        if (!allow_tmpfs && (fs.f_type == 0x01021994 /* TMPFS_MAGIC */ || fs.f_type == (long)0x858458f6 /* RAMFS_MAGIC */))
            return fsdp__fmt(why, size, "offload directory %s is in RAM (tmpfs): offloading there frees no memory; "
                             "use a directory on a local disk (offload.allow_tmpfs = 1 forces it)", shown), FSDP_ERR_INVALID_ARG;
    }
#endif
    if (statvfs(dir, &vfs) != 0)
        return fsdp__fmt(why, size, "offload directory %s: %s", shown, strerror(errno)), FSDP_ERR_INVALID_ARG;
    free_bytes = (double)vfs.f_bavail * (double)vfs.f_frsize;
    if (free_bytes < wanted)
        return fsdp__fmt(why, size, "offload directory %s has %.0f bytes (%.1f GiB) free; the %d rank(s) of this host need "
                         "%.0f bytes (%.1f GiB)", shown, free_bytes, free_bytes / 1073741824.0, local_ranks > 0 ? local_ranks : 1,
                         wanted, wanted / 1073741824.0), FSDP_ERR_NO_SPACE;
    return 0;
}

/* An unlinked file in dir (O_TMPFILE, else made and unlinked at once), O_DIRECT where the
   filesystem takes it; -1 with errno. */
static int fsdp__offload_file(const char *dir, int *direct) {
    int fd = -1;
    *direct = 0;
#if defined(__linux__)
#  if defined(O_DIRECT)
    fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | O_DIRECT, 0600);
    *direct = fd >= 0;
#  endif
    if (fd < 0) fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
    if (fd < 0) {
        char path[512];
        fsdp__fmt(path, sizeof path, "%s/.fsdp-offload-XXXXXX", dir);
        if ((fd = mkstemp(path)) >= 0) {
            unlink(path);
            fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
        *direct = 0;
    }
    return fd;
}

/* Opens rank's offload file in dir with bytes reserved (posix_fallocate: a full disk is an
   error now), and starts its I/O thread. 0, or the failure with why in err. */
FSDP__PRIVATE int fsdp__offload_open(fsdp__offload *o, const char *dir, int allow_tmpfs, int64_t bytes, int rank,
                                     int local_ranks, const fsdp_logger *logger, char *err, size_t err_size) {
    char shown[200];
    int rc;
    memset(o, 0, sizeof o[0]);
    o->fd = -1;
    o->rank = rank;
    o->size = bytes;
    fsdp__fmt(o->where, sizeof o->where, "the offload file of rank %d in %s", rank, fsdp_printable(shown, sizeof shown, dir));
    if ((rc = fsdp__offload_check_dir(dir, allow_tmpfs, (size_t)bytes, local_ranks, err, err_size)) != 0) return rc;
    if ((o->fd = fsdp__offload_file(dir, &o->direct)) < 0) {
        fsdp__fmt(err, err_size, "offload: cannot create a file in %s: %s", shown, strerror(errno));
        return FSDP_ERR_IO;
    }
    if (bytes > 0 && (rc = posix_fallocate(o->fd, 0, (off_t)bytes)) != 0) {
        fsdp__fmt(err, err_size, "offload: cannot reserve %lld bytes for %s: %s", (long long)bytes, o->where, strerror(rc));
        close(o->fd);
        o->fd = -1;
        return rc == ENOSPC || rc == EDQUOT ? FSDP_ERR_NO_SPACE : FSDP_ERR_IO;
    }
    if (!o->direct)
        fsdp__log(logger, FSDP_LOG_WARN, "offload: %s takes no O_DIRECT: every block is written back and dropped from the "
                  "page cache instead", o->where);
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->work, NULL);
    pthread_cond_init(&o->done, NULL);
    if (pthread_create(&o->thread, NULL, fsdp__io_thread, o) != 0) {
        fsdp__fmt(err, err_size, "offload: cannot start the I/O thread");
        return FSDP_ERR_SYSTEM;
    }
    o->thread_started = 1;
    return 0;
}

/* Waits for every request, stops the thread, closes (and so frees) the file. */
FSDP__PRIVATE void fsdp__offload_close(fsdp__offload *o) {
    if (!o) return;
    if (o->thread_started) {
        fsdp__thread_stop(o->thread, &o->lock, &o->work, &o->stop);
        pthread_mutex_destroy(&o->lock);
        pthread_cond_destroy(&o->work);
        pthread_cond_destroy(&o->done);
    }
    if (o->fd >= 0) close(o->fd);
    o->fd = -1;
    o->thread_started = 0;
}

FSDP_API int fsdp_offload_bandwidth(const char *dir, size_t bytes, int streams, double *write_bps, double *read_bps,
                                    char *err, size_t err_size) {
    enum { REQUEST = 8 << 20, IN_FLIGHT = 3, MAX_STREAMS = 64 };
    fsdp__offload *o;
    fsdp_logger quiet;
    char *buf = NULL, mine[FSDP__ERRMSG];
    size_t each;
    int rc = 0, pass, k, s, opened = 0;
    if (!err) { err = mine; err_size = sizeof mine; }
    *err = 0;
    if (!dir || !write_bps || !read_bps || streams < 1 || streams > MAX_STREAMS)
        return fsdp__fmt(err, err_size, "fsdp_offload_bandwidth: bad arguments (streams 1..%d)", MAX_STREAMS), FSDP_ERR_INVALID_ARG;
    each = fsdp__align(bytes / (size_t)streams < (size_t)REQUEST ? (size_t)REQUEST : bytes / (size_t)streams, (size_t)REQUEST);
    memset(&quiet, 0, sizeof quiet); /* silent: the caller reports */
    o = (fsdp__offload *)fsdp__calloc(sizeof *o * (size_t)streams);
    buf = (char *)fsdp__aligned_alloc((size_t)REQUEST * IN_FLIGHT * (size_t)streams);
    if (!o || !buf) rc = FSDP_ERR_OUT_OF_MEMORY;
    for (k = 0; buf && k < REQUEST * IN_FLIGHT * streams; k++) buf[k] = (char)(k * 131 + 7); /* not zeros: nothing to compress */
    for (s = 0; !rc && s < streams; s++, opened++)
        rc = fsdp__offload_open(&o[s], dir, 1, (int64_t)each, s, streams, &quiet, err, err_size);
    for (pass = 2; pass >= 0 && !rc; pass--) { /* write (untimed: the reserved blocks are written once first, as
                                                   training's first step does), write, read; IN_FLIGHT per stream */
        int write = pass > 0;
        uint64_t ticket[MAX_STREAMS][IN_FLIGHT];
        size_t at;
        double t = fsdp_now();
        memset(ticket, 0, sizeof ticket);
        for (at = 0, k = 0; at < each && !rc; at += REQUEST, k = (k + 1) % IN_FLIGHT)
            for (s = 0; s < streams && !rc; s++) {
                if (ticket[s][k] && (rc = fsdp__io_wait(&o[s], ticket[s][k])) != 0) break;
                ticket[s][k] = fsdp__io_submit(&o[s], write, (int64_t)at, buf + ((size_t)s * IN_FLIGHT + (size_t)k) * REQUEST,
                                               REQUEST);
            }
        for (s = 0; s < streams && !rc; s++) rc = fsdp__io_wait(&o[s], 0);
        t = fsdp_now() - t;
        *(write ? write_bps : read_bps) = t > 0 ? (double)each * streams / t : 0;
        for (s = 0; rc && s < streams; s++)
            if (o[s].error) fsdp__fmt(err, err_size, "%s", o[s].message);
    }
    for (s = 0; s < opened; s++) fsdp__offload_close(&o[s]);
    FSDP_FREE(o);
    fsdp__aligned_free(buf);
    return rc;
}

/* ============================================================================================
   >>recovery
   Surviving the loss of a replica inside the job. The failure domain is the replica: a shard
   group of HYBRID_SHARD whose ranks no other replica shares a host with, so a lost host takes
   one replica and the shard groups (shared memory) of the other hosts stay whole. Recovery sits
   above the comms: they only report loss (a reset at once, silence after detect_ms, an error)
   and can be made anew over a set of peers; the runtime only asks for the current replicas.

   What exists: fsdp_desc.recovery and its checks at fsdp_init; fsdp_replicas, the report's
   fields; the agreement rule below (fsdp__recovery_decide); the comms' report of the first peer
   an op saw lost (fsdp_comm.lost_peer: the views' reach) and fsdp__comm_watch (keepalive and
   TCP_USER_TIMEOUT of detect_ms on the links to other hosts, so a vanished host fails an op as a
   reset does; a stopped process's kernel still answers, so only the op timeout finds it: a
   process that stops is a straggler to the kernel, and detecting it sooner would take a
   heartbeat from the process, which would also take a slow one for lost); and in >>runtime:
   fsdp__recovery_open (at fsdp_init: a recovery listener per rank, every rank's address
   gathered while the world is healthy, the links watched), fsdp__recover (fsdp_step's, on a
   loss it or a hook saw): fsdp__recovery_quiesce (every comm of the context aborted, so that
   every survivor fails fast and enters recovery, also those whose own ops were fine: a rank of
   another column of a host would otherwise wait out the op timeout in its next shard op; then
   the comm thread drained), fsdp__recovery_agree (the views sent to the rendezvous, the first
   rank of the lowest replica this survivor still reaches, itself perhaps; one it cannot reach
   is taken for lost and the next tried; the rendezvous collects views for up to detect_ms,
   decides and answers each), fsdp__recovery_catch_up (a survivor one step behind applies the
   step from its reduced gradient with the clipping of the norm those ahead used, which their
   views carry), fsdp__recovery_reset (the iteration undone: the step applied nowhere),
   fsdp__recovery_rebuild (a new world made with the old one as parent: its key from the old
   world's key and the rebuild's name, so only ranks of that world can join, without a
   PBKDF2 stretch of the secret, which took 0.2-1 s on a busy 2-core machine against a few ms
   for the rest; split into shard and replica comms) and fsdp__recovery_adopt (the groups taken
   over; master shards moved into the new shard comm's shared memory). tests/test_recovery.c
   drives a forked socket job of 3 or 4 fake hosts (UTS namespaces) of 2 ranks through the
   public API: a host's ranks SIGKILLed at a step (the rendezvous's host too) and the survivors
   reach the last step bitwise equal to a reference that averages over the survivors from the
   loss on; half the hosts lost stops both survivors naming the partition. What is decided:
     membership   a numbered epoch: the replicas (as fsdp_init numbered them) that train. The
                  next one is agreed by the survivors of the last, from one view per surviving
                  rank (its epoch, its replica, which replicas it still reaches, how far it got
                  with the step in flight); the rendezvous decides from them and tells each
                  (the rule is a pure function of the views: any survivor would decide the
                  same). Views of an older epoch are stragglers: not counted.
     who stays    a replica whose every rank sent a view, admitted in replica order if each of
                  its ranks reaches every replica admitted before it and theirs reach it (a
                  link broken one way drops the later replica, never both: the lowest replicas
                  of a group that still talks stay). The new membership must hold a strict
                  majority of the last (so two halves of a partition never both go on: 2|2
                  stops both) and at least min_replicas; otherwise every rank of the partition
                  stops, naming it. A rank whose replica is not in it leaves too, its shard
                  group being incomplete or cut off.
     the step     one rule that leaves every survivor's bits equal: every survivor ends at the
                  newest step any of them applied. A step is applied only past its commit
                  point, a collective over every training rank after the last reduction and
                  before the update (today the gradient norm's all_gather over the world comm).
                  A survivor past it goes on, and learns of the loss only in a later op; one
                  that failed inside it is a step behind. But some rank passing the commit
                  proves every rank joined it, so had finished its reductions (the fold is the
                  same everywhere): the one behind holds the same reduced gradient and applies
                  the step from it (with the clipping factor of the norm those ahead computed:
                  their views must carry it). If none passed, every survivor drops the step
                  (gradients zeroed, the step count unchanged) and the report says dropped. A
                  commit over the replica comm alone would not do: two columns of a host could
                  then decide differently and leave shards a step apart.
   The views and the verdict are MACed with the key of the world being left (an older epoch's
   straggler is not heard). A survivor that cannot reach the rendezvous (a link broken between
   survivors only) tries the next replica's first rank, at worst itself: a second rendezvous may
   then decide, but only over the replicas whose every rank reached it, a set disjoint from the
   first's, so at most one of them holds a strict majority and goes on.
   To be built: offload and bf16 optimizer state with recovery (the step thread quiesced too);
   reshard_after_forward HOST (its host comm rebuilt); a second loss while recovering is survived
   only as a failure of the recovery (the rendezvous's collection misses the newly lost ranks and
   the new world's creation fails: every survivor's fsdp_step fails naming it); traces of the
   recovery's phases; and rejoin (a host started again, or a spare, receiving its counterpart's
   state at a step boundary).
   ============================================================================================ */
#define FSDP__RECOVERY_DETECT_MS 5000 /* default detect_ms: the issue's bound for a silent host */

/* What one surviving rank tells the others after a loss: the agreement's input. */
typedef struct fsdp__recovery_view {
    int64_t epoch;              /* the last membership it agreed to */
    int rank;                   /* its rank at fsdp_init (for messages) */
    int replica;                /* its replica, numbered as at fsdp_init */
    int64_t step;               /* optimizer steps it has applied (fsdp_step_report.step) */
    int reductions_done;        /* it holds the whole reduced gradient of the step after those */
    const unsigned char *reach; /* [membership total]: 1 for each replica it still reaches */
} fsdp__recovery_view;

/* A membership: the replicas that train, ascending, numbered as at fsdp_init. */
typedef struct fsdp__membership {
    int64_t epoch;              /* 0 at fsdp_init, +1 per change */
    int count;
    int total;                  /* replicas at fsdp_init: the capacity of replicas[] and of reach[] */
    int *replicas;              /* [count] */
} fsdp__membership;

/* A survivor's view on the wire, to the rendezvous (its reach inline), MACed with the key of the
   world it leaves, so only ranks of that world and epoch are heard. */
#define FSDP__RECOVERY_MAGIC 0x66727663u
typedef struct fsdp__recovery_msg {
    uint32_t magic;
    int32_t rank, replica, reductions_done;
    int64_t epoch, step;
    double norm;                          /* the global norm (scaled) of the last step it applied */
    unsigned char reach[FSDP__MAX_WORLD]; /* per replica (as at fsdp_init): 1 if it still reaches it */
    unsigned char mac[32];
} fsdp__recovery_msg;

/* The rendezvous's answer to every survivor that sent a view (MACed as the views). */
typedef struct fsdp__recovery_verdict {
    uint32_t magic;
    int32_t rc;                           /* 0: go on; else this partition stops (why) */
    int64_t epoch, target_step;
    double norm;                          /* the target step's norm, for a survivor one behind */
    int32_t count, port;                  /* the next membership's size; the new world's port at the rendezvous */
    int replicas[FSDP__MAX_WORLD];       /* (the same build on every rank: a plain int) */
    char why[FSDP__ERRMSG];
    unsigned char mac[32];
} fsdp__recovery_verdict;

/* A context's recovery (fsdp_desc.recovery on): who it is as at fsdp_init, where every rank's
   recovery listener is, the membership it trains in. */
typedef struct fsdp__recovery {
    fsdp__membership now;
    int first_rank, replica, group, world0; /* its rank and replica at fsdp_init; ranks per replica; ranks then */
    int listen_fd;                        /* its recovery listener (any survivor may be the rendezvous) */
    struct sockaddr_in *addr;             /* [world0]: every rank's listener, gathered while healthy */
    char job[48];                         /* the first world's job: the new worlds' names derive from it */
    fsdp_comm *world;                     /* the world recovery made (the context owns it), or NULL */
    int rebuilds;                         /* worlds made so far: each one's name (an epoch may be kept) */
} fsdp__recovery;

/* "{0, 2, 3}" into buf (ending in "...}" where it does not fit). */
FSDP__PRIVATE const char *fsdp__replica_set_text(char *buf, size_t size, const int *replicas, int count) {
    size_t used;
    int i;
    fsdp__fmt(buf, size, "{");
    for (i = 0; i < count && (used = strlen(buf)) + 16 < size; i++)
        fsdp__fmt(buf + used, size - used, "%s%d", i ? ", " : "", replicas[i]);
    used = strlen(buf);
    fsdp__fmt(buf + used, size - used, i < count ? "...}" : "}");
    return buf;
}

FSDP__PRIVATE int fsdp__membership_has(const fsdp__membership *m, int replica) {
    int i;
    for (i = 0; i < m->count; i++)
        if (m->replicas[i] == replica) return 1;
    return 0;
}

/* A view that counts: of the last epoch, from a replica of the last membership. */
static int fsdp__view_current(const fsdp__membership *last, const fsdp__recovery_view *v) {
    return v->epoch == last->epoch && v->replica >= 0 && v->replica < last->total &&
           fsdp__membership_has(last, v->replica);
}

/* Whether every current view of replica a reaches replica b. */
FSDP__PRIVATE int fsdp__replica_reaches(const fsdp__membership *last, const fsdp__recovery_view *views, int n, int a,
                                        int b) {
    int i;
    for (i = 0; i < n; i++)
        if (fsdp__view_current(last, &views[i]) && views[i].replica == a && !views[i].reach[b]) return 0;
    return 1;
}

/* The replicas that stay: every rank of theirs sent a view, and they reach each other both ways,
   admitted in replica order. Into next->replicas (count set; the epoch is the caller's). */
FSDP__PRIVATE void fsdp__recovery_survivors(const fsdp__membership *last, int ranks_per_replica,
                                            const fsdp__recovery_view *views, int n, fsdp__membership *next) {
    int i, j, k, heard;
    next->count = 0;
    for (i = 0; i < last->count; i++) {
        int r = last->replicas[i], ok = 1;
        for (j = 0, heard = 0; j < n; j++) heard += fsdp__view_current(last, &views[j]) && views[j].replica == r;
        if (heard != ranks_per_replica) continue;
        for (k = 0; k < next->count && ok; k++)
            ok = fsdp__replica_reaches(last, views, n, r, next->replicas[k]) &&
                 fsdp__replica_reaches(last, views, n, next->replicas[k], r);
        if (ok) next->replicas[next->count++] = r;
    }
}

/* The step rule (see the banner): *target the newest step a survivor applied; a survivor one
   step behind must hold the reduced gradient to catch up, one further behind cannot be. */
FSDP__PRIVATE int fsdp__recovery_step_rule(const fsdp__membership *last, const fsdp__membership *next,
                                           const fsdp__recovery_view *views, int n, int64_t *target, char *why,
                                           size_t why_size) {
    int i, ahead = -1;
    for (i = 0; i < n; i++)
        if (fsdp__view_current(last, &views[i]) && fsdp__membership_has(next, views[i].replica) &&
            (ahead < 0 || views[i].step > views[ahead].step))
            ahead = i;
    *target = ahead < 0 ? 0 : views[ahead].step;
    for (i = 0; i < n && ahead >= 0; i++) {
        const fsdp__recovery_view *v = &views[i];
        if (!fsdp__view_current(last, v) || !fsdp__membership_has(next, v->replica) || v->step == *target) continue;
        if (v->step == *target - 1 && v->reductions_done) continue;
        fsdp__fmt(why, why_size, "recovery: rank %d applied step %lld but rank %d (replica %d) is at step %lld%s: the "
                  "commit point cannot have been passed", views[ahead].rank, (long long)*target, v->rank, v->replica,
                  (long long)v->step, v->step == *target - 1 ? " without its reduced gradient" : "");
        return FSDP_ERR_PROTOCOL;
    }
    return 0;
}

/* The agreement: from the last membership and the survivors' views (the same on every survivor),
   the next membership (next->replicas: room for last->total) and the step every survivor is to
   end at (*target_step: one behind it applies the step in flight, at it drops the iteration in
   flight). 0 to go on (next->epoch = last->epoch + 1, or unchanged when no replica was lost: the
   failure was not a loss); FSDP_ERR_PEER_LOST when this partition must stop (not a strict
   majority of the last membership, or fewer than min_replicas), why naming it; FSDP_ERR_PROTOCOL
   for views that contradict each other. The caller leaves if its own replica is not in next. */
FSDP__PRIVATE int fsdp__recovery_decide(const fsdp__membership *last, int ranks_per_replica, int min_replicas,
                                        const fsdp__recovery_view *views, int n, fsdp__membership *next,
                                        int64_t *target_step, char *why, size_t why_size) {
    char kept[160], was[160];
    *target_step = 0;
    why[0] = 0;
    next->total = last->total;
    next->epoch = last->epoch;
    fsdp__recovery_survivors(last, ranks_per_replica, views, n, next);
    fsdp__replica_set_text(kept, sizeof kept, next->replicas, next->count);
    fsdp__replica_set_text(was, sizeof was, last->replicas, last->count);
    if (2 * next->count <= last->count) {
        fsdp__fmt(why, why_size, "recovery: replicas %s are all that remain together of epoch %lld's %s: not a strict "
                  "majority (%d of %d needed), so this partition stops (the others may still train)", kept,
                  (long long)last->epoch, was, last->count / 2 + 1, last->count);
        return FSDP_ERR_PEER_LOST;
    }
    if (next->count < min_replicas) {
        fsdp__fmt(why, why_size, "recovery: replicas %s remain of epoch %lld's %s: fewer than recovery.min_replicas %d",
                  kept, (long long)last->epoch, was, min_replicas);
        return FSDP_ERR_PEER_LOST;
    }
    if (next->count < last->count) next->epoch = last->epoch + 1;
    fsdp__fmt(why, why_size, "recovery: epoch %lld: replicas %s of %s", (long long)next->epoch, kept, was);
    return fsdp__recovery_step_rule(last, next, views, n, target_step, why, why_size);
}

/* Whether an op's failure is one recovery answers: a peer lost or silent, or another rank's
   abort (a survivor that stopped everything to recover). */
FSDP__PRIVATE int fsdp__recovery_loss(int rc) {
    return rc == FSDP_ERR_PEER_LOST || rc == FSDP_ERR_ABORTED || rc == FSDP_ERR_TIMEOUT;
}

/* HMAC-SHA256 with key of the first `bytes` of a message (all but its mac). */
FSDP__PRIVATE void fsdp__recovery_mac(const unsigned char key[32], const void *msg, size_t bytes, unsigned char out[32]) {
    fsdp__sha256 inner, outer;
    fsdp__hmac_keyed(&inner, &outer, key, 32);
    fsdp__sha256_update(&inner, msg, bytes);
    fsdp__hmac_finish(&inner, &outer, out);
}

/* fsdp_init's checks of desc->recovery, with the plan made: 0 when it is off; else why it
   cannot be had (every unit HYBRID_SHARD, two replicas or more, none sharing a host with
   another, a socket world). What the context adds is checked by fsdp__recovery_open. */
FSDP__PRIVATE int fsdp__recovery_check(const fsdp_recovery_desc *rd, const fsdp_model *model, const fsdp__plan *plan,
                                       const fsdp_comm *comm, int hybrid_group, char *err, size_t err_size) {
    int world = fsdp_comm_size(comm), replicas = world / hybrid_group, ui, r, *replica_of_host;
    int hosts = fsdp_comm_num_hosts(comm);
    if (!rd->enabled) return 0;
    if (rd->min_replicas < 0 || rd->detect_ms < 0)
        return fsdp__fmt(err, err_size, "recovery: min_replicas %d and detect_ms %d must be >= 0 (0: the default)",
                         rd->min_replicas, rd->detect_ms), FSDP_ERR_INVALID_ARG;
    for (ui = 0; ui < plan->num_units; ui++)
        if (plan->units[ui].strategy != FSDP_HYBRID_SHARD)
            return fsdp__fmt(err, err_size, "recovery needs HYBRID_SHARD (a replica per host, each a whole copy of "
                             "the state): unit '%s' is %s", *model->modules[plan->units[ui].module].name
                             ? model->modules[plan->units[ui].module].name : "(root)",
                             fsdp_strategy_name(plan->units[ui].strategy)), FSDP_ERR_INVALID_ARG;
    if (replicas < 2 || replicas < rd->min_replicas)
        return fsdp__fmt(err, err_size, "recovery: %d replica(s) of %d ranks (shard_group_size %d): at least 2 and "
                         "recovery.min_replicas %d are needed", replicas, world, hybrid_group, rd->min_replicas),
               FSDP_ERR_INVALID_ARG;
    if (hosts < 2)
        return fsdp__fmt(err, err_size, "recovery: the %d ranks are on %s: the replicas must be on hosts of their own "
                         "(a host's loss is what recovery survives)", world, hosts == 1 ? "one host" : "unknown hosts"),
               FSDP_ERR_INVALID_ARG;
    if (!(replica_of_host = (int *)FSDP_MALLOC(sizeof(int) * (size_t)hosts))) return FSDP_ERR_OUT_OF_MEMORY;
    for (r = 0; r < hosts; r++) replica_of_host[r] = -1;
    for (r = 0; r < world; r++) {
        int h = fsdp_comm_host_of(comm, r), other = h >= 0 && h < hosts ? replica_of_host[h] : -2;
        if (other == -1) replica_of_host[h] = r / hybrid_group;
        if (other == -1 || other == r / hybrid_group) continue;
        FSDP_FREE(replica_of_host);
        if (other == -2)
            return fsdp__fmt(err, err_size, "recovery: the host of rank %d is unknown", r), FSDP_ERR_INVALID_ARG;
        return fsdp__fmt(err, err_size, "recovery: replicas %d and %d share host %d (rank %d is on it): one host's "
                         "loss would take both; give each replica hosts of its own (shard_group_size: the ranks per "
                         "host)",
                         other, r / hybrid_group, h, r), FSDP_ERR_INVALID_ARG;
    }
    FSDP_FREE(replica_of_host);
    if (fsdp_comm_backend(comm) != FSDP_BACKEND_SOCKET)
        return fsdp__fmt(err, err_size, "recovery needs a socket world (fsdp_comm_init with FSDP_BACKEND_SOCKET): the "
                         "survivors rendezvous over TCP; this one is %s", fsdp_backend_name(fsdp_comm_backend(comm))),
               FSDP_ERR_UNSUPPORTED;
    return 0;
}

/* ============================================================================================
   >>runtime
   The compute thread calls the hooks; one comm thread runs every collective of the context in
   the order they were issued (every rank issues the same sequence), so gathers of the next unit
   overlap this unit's compute and reductions overlap the rest of backward. Tasks finish in
   order: "task n done" is "completed >= n". The root unit (unit 0) is never resharded after its
   forward (reshard_after_forward 0): its backward follows at once.
   ============================================================================================ */
enum { FSDP__SHARDED = 0, FSDP__GATHERING, FSDP__UNSHARDED, FSDP__IN_FORWARD, FSDP__IN_BACKWARD };
enum { FSDP__TASK_GATHER = 1, FSDP__TASK_REDUCE, FSDP__TASK_COLL };
#define FSDP__IO_BUFS 16 /* at most: limit_all_gathers + 3 */

static const char *fsdp__state_name(int state) {
    static const char *names[] = {"SHARDED", "GATHERING", "UNSHARDED", "FORWARD", "BACKWARD"};
    return state >= 0 && state <= 4 ? names[state] : "?";
}

/* Where one of a unit's persistent shards lives: in RAM, or in the rank's offload file (its
   master and gradient: f32; its optimizer state: ctx->state_dtype); read and written through
   fsdp__home_io, or directly where it is f32 in RAM. */
typedef struct fsdp__home {
    void *ram;              /* the shard in RAM; NULL when on disk */
    int64_t offset;         /* on disk: its first byte in the offload file (aligned); -1 in RAM */
} fsdp__home;

typedef struct fsdp__unit {
    int module;
    fsdp_strategy strategy;
    int num_params;
    int first_param;        /* index into ctx->unit_params */
    int64_t numel, flat_numel, padded, shard;
    int group_size, group_rank;
    fsdp_comm *shard_comm;  /* gathers and reduce-scatters (NULL: group of one) */
    fsdp_comm *replica_comm; /* HYBRID: across shard groups; NO_SHARD: everyone */
    float *master;          /* fp32 shard [shard]; inside ctx->master_mem when master_shared; NULL on disk */
    int master_shared;
    float *grad;            /* gradient shard [shard]; NULL on disk */
    int64_t master_off, grad_off; /* on disk: their first bytes in the offload file; -1 in RAM */
    int grad_zero;          /* the gradient on disk is zero (fsdp_zero_grad: nothing written) */
    double grad_sumsq;      /* its sum of squares, made when it was written (fsdp__sumsq) */
    float grad_scale;       /* a clipping factor the gradient on disk still owes (1: none) */
    int step_done;          /* the step running in the background has updated this unit (1 when none runs) */
    int zero_pending;       /* fsdp_zero_grad came before that: the step thread zeroes the gradient after */
    int upd_grad_zero;      /* grad_zero and grad_scale as the step being applied sees them */
    float upd_grad_scale;
    fsdp__home opt[FSDP_OPTIMIZER_MAX_STATE]; /* the optimizer's state shards (ctx->num_state of them) */
    void *unsharded;        /* [padded] param_dtype, while gathered */
    float *view32;          /* fp32 compute view, while gathered */
    float *grad_full;       /* [padded] f32, from pre_backward to the end of its reduction */
    int grad_full_pending;  /* no_sync: grad_full holds accumulated micro-steps */
    int state, refcount;
    uint64_t gather_task;
    int forward_done, backward_started, backward_done;
    int reshard_after_forward;
    int frozen;             /* every parameter frozen: no grad, optimizer state, gradient reductions */
    int uniform_update;     /* every parameter trainable with the optimizer's lr and weight decay */
    int recompute;          /* open forward hooks of a recomputation inside its own backward */
    int recomputing;        /* gathered again (state FORWARD) to recompute inside a later unit's backward */
    fsdp_reshard_mode reshard_mode; /* resolved (fsdp__plan_unit_modes): ALL, NONE or HOST */
    fsdp_wire param_wire;   /* what gathers move: param_dtype's wire, or INT8/INT4 (encoded from the master) */
    size_t wire_block;
    void *host_shard;       /* HOST: [host_numel] param_dtype, this rank's slice of the host's share, kept from
                               post_forward until the backward's gather (which frees it) */
    int64_t host_numel;     /* HOST: ceil(padded / ranks on this host) */
    fsdp_wire grad_wire;    /* INT8/INT4: reduced by fsdp_reduce_scatter_wire over host_comm and cross_comm */
    float *residual;        /* error feedback: [grad_hosts * shard] this rank's quantization error, or NULL */
    int64_t residual_numel;
} fsdp__unit;

typedef struct fsdp__task {
    int kind, unit;
    uint64_t id;
    void *scratch;          /* REDUCE: reduce-dtype staging, freed by the comm thread */
    size_t scratch_bytes;
    float *grad_full;       /* REDUCE: the unsharded gradient, freed by the comm thread */
    size_t grad_bytes;
    int read_buf;           /* GATHER of a master on disk: the io_buf its read went to (-1: none yet) */
    void *host_src;         /* GATHER over the host (FSDP_RESHARD_HOST): the unit's host shard, freed by the comm thread */
    uint64_t read_ticket;
    fsdp_comm *comm;        /* COLL: one collective */
    fsdp_coll_kind coll;
    const void *send;
    void *recv;
    size_t count;
    int root;
    double issued;          /* when it was queued (tracing only) */
} fsdp__task;

typedef struct fsdp__pool_entry { void *ptr; size_t bytes; } fsdp__pool_entry;
#define FSDP__POOL_MAX 8

struct fsdp_ctx {
    fsdp_model *model;
    fsdp_desc desc;
    fsdp_comm *comm, *hybrid_shard_comm, *hybrid_replica_comm;
    fsdp_comm *host_comm;   /* this rank's host, for FSDP_RESHARD_HOST's gathers (may be hybrid_shard_comm) and
                               quantized reductions */
    fsdp_comm *cross_comm;  /* grad_wire INT8/INT4: the ranks of this rank's local index, one per host */
    void *master_mem[2];    /* fsdp_comm_alloc blocks holding the f32 shards gathered over comm, hybrid_shard_comm */
    fsdp__plan plan;
    fsdp__unit *units;
    int num_units;
    int *unit_params;
    int *param_by_name;     /* parameter ids sorted by name */
    int64_t *param_at;      /* where each parameter's slice starts in its unit's shard */
    fsdp_param_info *params;
    float *param_decay, *param_lr_scale; /* per parameter: its group's or the optimizer's (fsdp__param_rates) */
    fsdp_param_group *groups;          /* desc.param_groups, copied (patterns too) */
    int num_groups;
    int *param_group;                  /* per parameter: the group it belongs to, or -1 */
    int rank, world;
    fsdp_dtype param_dtype, reduce_dtype;
    fsdp_optimizer_desc opt;           /* resolved: defaults filled */
    fsdp_optimizer_desc opt_given;     /* as the caller gave it (where each setting came from) */
    const fsdp_optimizer *optimizer;   /* its row */
    int num_state;                     /* state buffers per trainable unit */
    int64_t step;
    fsdp_comm_stats sent_before;       /* comm's counters when the last fsdp_step (or fsdp_init) returned */
    int no_sync;
    float loss_scale;                  /* fsdp_desc.loss_scale: the current scale (1: off) */
    int64_t scale_growth_tracker;      /* steps in a row with finite gradients */
    int grads_unscaled;                /* the scale was divided out of this iteration's gradients */
    int grads_since_step;              /* a backward ran since fsdp_init, the last fsdp_step or fsdp_zero_grad */
    int reductions_done;               /* fsdp_step holds every reduced gradient of the step after `step` */
    double commit_norm;                /* the global norm (scaled) the last clipping used (>>recovery) */
    double *norm_sums;                 /* fsdp__global_norm's all_gather: 4 doubles a rank of fsdp_init's world
                                          (made there, so a step allocates nothing before its collective;
                                          a recovery's world is smaller) */
    int norm_ranks;                    /* the ranks norm_sums has room for */
    fsdp__recovery *recovery;          /* NULL: recovery off */
    int loss_rc;                       /* with recovery: a hook's op failed so (a loss): fsdp_step recovers */
    /* iteration */
    int phase;              /* 0 idle, 1 forward, 2 backward */
    int *fwd_order, fwd_len, *bwd_order, bwd_len;
    int fwd_known, bwd_known; /* each order is learned from the first iteration that runs it (an evaluation
                                 pass first teaches the forward order only) */
    uint64_t older_reduce, newer_reduce; /* the last two gradient reductions issued */
    /* comm thread */
    pthread_t thread;
    int thread_started, stop;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    fsdp__task *queue;
    int queue_cap, queue_head, queue_len;
    uint64_t issued, completed;
    int running;            /* a task is being run (by the comm thread, or by a waiter helping) */
    int worker_error;
    /* memory */
    size_t persistent_bytes, param_bytes, grad_bytes, opt_bytes, live_bytes, peak_live_bytes;
    fsdp__pool_entry pool[FSDP__POOL_MAX];
    int pool_len;
    /* optimizer state: its dtype, and the offload file and streaming buffers when it is on disk
       or bf16 (see fsdp__step_streamed) */
    fsdp_dtype state_dtype;
    fsdp__offload *offload;
    int64_t offload_size;            /* bytes of the offload file (0: none) */
    /* the update being applied: the optimizer's settings and step count when fsdp_step began it
       (fsdp_set_lr may change ctx->opt meanwhile); with offload it runs on the step thread,
       behind the next forward (see fsdp__step_launch) */
    fsdp_optimizer_desc upd_opt;
    int64_t upd_step;
    pthread_t step_thread;
    int step_thread_started, step_pending, step_stop, step_rc;
    pthread_mutex_t step_lock;
    pthread_cond_t step_cond;
    char step_error[FSDP__ERRMSG];
    void *stream_raw, *stream_f32;   /* FSDP__STREAM_SLOTS slots of stream_chunk elements per shard */
    /* parameters or gradients on disk: buffers of a unit's whole shard region, aligned for O_DIRECT,
       where gathers read (ahead, from fsdp__issue_gather) and reductions add (writing behind) */
    float *io_buf[FSDP__IO_BUFS];
    uint64_t io_buf_ticket[FSDP__IO_BUFS]; /* the write still running from it (0: none) */
    int io_buf_busy[FSDP__IO_BUFS], num_io_bufs;
    size_t io_buf_bytes;
    size_t stream_raw_stride, stream_f32_stride;
    int64_t stream_chunk;            /* 0: the step updates every shard in place (all f32 in RAM) */
    size_t stream_bytes;
    fsdp_logger logger;
    int abort_on_misuse;             /* FSDP_ABORT_ON_MISUSE, or FSDP_DEBUG >= 1 at fsdp_init: see fsdp__misused */
    int misuse_warned;               /* the one warning of a misuse was logged */
    int hook_failed;                 /* the last hook call returned an error (its message in error) */
    fsdp__trace *trace;              /* NULL: not tracing */
    struct fsdp__async_save *async_save; /* >>checkpoint: fsdp_save_sharded_async's state */
    char error[FSDP__ERRMSG];
};

/* The trace section's functions the runtime calls (defined there, after >>json) */
FSDP__PRIVATE double fsdp__trace_begin(fsdp_ctx *ctx);
FSDP__PRIVATE void fsdp__trace_hook(fsdp_ctx *ctx, const char *hook, int module, double t0);
FSDP__PRIVATE void fsdp__trace_end(fsdp_ctx *ctx, const char *cat, const char *name, int unit, double t0);
FSDP__PRIVATE void fsdp__trace_wait(fsdp_ctx *ctx, const char *name, const char *wait_for, int unit, double t0);
FSDP__PRIVATE void fsdp__trace_update(fsdp_ctx *ctx, int64_t step, double t0);
FSDP__PRIVATE void fsdp__trace_ckpt(fsdp_ctx *ctx, const char *phase, const char *path, double t0);
FSDP__PRIVATE void fsdp__trace_iteration(fsdp_ctx *ctx, const fsdp_step_report *report);
FSDP__PRIVATE void fsdp__trace_spill(fsdp_ctx *ctx);
FSDP__PRIVATE int fsdp__trace_open(fsdp_ctx *ctx);
FSDP__PRIVATE void fsdp__trace_close(fsdp_ctx *ctx);
FSDP__PRIVATE int fsdp__task_coll(fsdp_ctx *ctx, const fsdp__task *t, fsdp_comm *comm, fsdp_coll_kind kind,
                                  const void *send, void *recv, size_t count, fsdp_dtype dtype, fsdp_reduce_op op,
                                  uint32_t tag);
/* ... and the checkpoint section's */
FSDP__PRIVATE int fsdp__quiesce(fsdp_ctx *ctx, const char *what);
FSDP__PRIVATE int fsdp__agree_alloc(fsdp_ctx *ctx, const void *block, size_t bytes, const char *what);
FSDP__PRIVATE int fsdp__async_poll(fsdp_ctx *ctx, int wait);
FSDP__PRIVATE void fsdp__async_end(fsdp_ctx *ctx);

FSDP__PRIVATE void fsdp__set_error(fsdp_ctx *ctx, const char *message) {
    pthread_mutex_lock(&ctx->lock); /* the comm thread writes its failures here too */
    fsdp__copy_string(ctx->error, sizeof ctx->error, message);
    pthread_mutex_unlock(&ctx->lock);
}

FSDP__PRIVATE int fsdp__fail(fsdp_ctx *ctx, int code, const char *fmt, ...) FSDP__PRINTF(3, 4);
FSDP__PRIVATE int fsdp__fail(fsdp_ctx *ctx, int code, const char *fmt, ...) {
    va_list ap;
    char message[FSDP__ERRMSG];
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    fsdp__set_error(ctx, message);
    fsdp__log(&ctx->logger, FSDP_LOG_ERROR, "rank %d: %s", ctx->rank, message);
    return code;
}

/* Whether misuse aborts (fsdp__misused): decided once, at fsdp_init. */
static int fsdp__misuse_aborts(void) {
#ifdef FSDP_ABORT_ON_MISUSE
    return 1;
#else
    const char *debug = getenv("FSDP_DEBUG");
    return debug && atoi(debug) >= 1;
#endif
}

/* A call made in the wrong state, whose failure code that does not check results never sees:
   fsdp_param and fsdp_grad return NULL (the next access crashes, far from the cause), a hook
   returns FSDP_ERR_STATE. Its message, already in ctx->error, is logged as a warning once per
   context (every later one only replaces ctx->error: a loop would repeat it thousands of times),
   or, with FSDP_ABORT_ON_MISUSE or FSDP_DEBUG >= 1, printed on stderr before the process aborts
   at the faulty call, where a debugger or core file shows it. */
FSDP__PRIVATE void fsdp__misused(fsdp_ctx *ctx) {
    char message[FSDP__ERRMSG];
    pthread_mutex_lock(&ctx->lock);
    fsdp__copy_string(message, sizeof message, ctx->error);
    pthread_mutex_unlock(&ctx->lock);
    if (ctx->abort_on_misuse) {
        fprintf(stderr, "fsdp: rank %d: aborting on misuse (FSDP_DEBUG >= 1 or FSDP_ABORT_ON_MISUSE): %s\n", ctx->rank,
                message);
        fflush(stderr);
        abort();
    }
    if (ctx->misuse_warned) return;
    ctx->misuse_warned = 1;
    fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: %s (warned once per context: FSDP_DEBUG=1 aborts at the call)",
              ctx->rank, message);
}

FSDP_API const char *fsdp_last_error(const fsdp_ctx *ctx) { return ctx ? ctx->error : fsdp__init_error; }

FSDP_API const char *fsdp_strategy_name(fsdp_strategy strategy) {
    switch (strategy) {
        case FSDP_FULL_SHARD: return "FULL_SHARD";
        case FSDP_SHARD_GRAD_OP: return "SHARD_GRAD_OP";
        case FSDP_NO_SHARD: return "NO_SHARD";
        case FSDP_HYBRID_SHARD: return "HYBRID_SHARD";
        default: return "invalid";
    }
}

FSDP_API fsdp_strategy fsdp_strategy_from_name(const char *name) {
    static const struct { const char *name; fsdp_strategy strategy; } names[] = {
        {"full_shard", FSDP_FULL_SHARD}, {"full", FSDP_FULL_SHARD}, {"1", FSDP_FULL_SHARD},
        {"shard_grad_op", FSDP_SHARD_GRAD_OP}, {"grad_op", FSDP_SHARD_GRAD_OP}, {"2", FSDP_SHARD_GRAD_OP},
        {"no_shard", FSDP_NO_SHARD}, {"3", FSDP_NO_SHARD},
        {"hybrid_shard", FSDP_HYBRID_SHARD}, {"hybrid", FSDP_HYBRID_SHARD}, {"4", FSDP_HYBRID_SHARD}};
    char lower[32];
    size_t i, n;
    if (!name || (n = strlen(name)) >= sizeof lower) return FSDP_STRATEGY_DEFAULT;
    for (i = 0; i <= n; i++) lower[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i]);
    for (i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(lower, names[i].name) == 0) return names[i].strategy;
    return FSDP_STRATEGY_DEFAULT;
}

static const char *fsdp__unit_name(const fsdp_ctx *ctx, int u) {
    const char *name = ctx->model->modules[ctx->units[u].module].name;
    return *name ? name : "(root)";
}

/* Transient buffers come from a small pool of exact sizes: units of a model repeat their
   sizes, and returning megabytes to the system each time would fault them in again. */
FSDP__PRIVATE void *fsdp__buf_get(fsdp_ctx *ctx, size_t bytes, int zero) {
    void *ptr = NULL;
    int i;
    pthread_mutex_lock(&ctx->lock);
    for (i = 0; i < ctx->pool_len; i++)
        if (ctx->pool[i].bytes == bytes) {
            ptr = ctx->pool[i].ptr;
            ctx->pool[i] = ctx->pool[--ctx->pool_len];
            break;
        }
    if (ptr || (ptr = FSDP_MALLOC(bytes ? bytes : 1)) != NULL) {
        ctx->live_bytes += bytes;
        if (ctx->live_bytes > ctx->peak_live_bytes) ctx->peak_live_bytes = ctx->live_bytes;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (ptr && zero) memset(ptr, 0, bytes);
    return ptr;
}

FSDP__PRIVATE void fsdp__buf_put(fsdp_ctx *ctx, void *ptr, size_t bytes) {
    if (!ptr) return;
    pthread_mutex_lock(&ctx->lock);
    ctx->live_bytes -= bytes;
    if (ctx->pool_len < FSDP__POOL_MAX) {
        ctx->pool[ctx->pool_len].ptr = ptr;
        ctx->pool[ctx->pool_len++].bytes = bytes;
        ptr = NULL;
    }
    pthread_mutex_unlock(&ctx->lock);
    FSDP_FREE(ptr);
}

/* The gathered buffer: padded elements, or under FSDP_RESHARD_HOST what the host's gather
   receives (its L slices of ceil(padded / L), a few more when L does not divide padded). */
static size_t fsdp__unsharded_bytes(const fsdp_ctx *ctx, const fsdp__unit *u) {
    int64_t n = u->padded, host = u->host_numel * (int64_t)fsdp_comm_size(ctx->host_comm);
    return (size_t)(u->reshard_mode == FSDP_RESHARD_HOST && host > n ? host : n) * fsdp_dtype_size(ctx->param_dtype);
}

/* Gathers move codes (INT8/INT4 of the f32 master, fsdp_desc.param_wire), not param_dtype. */
static int fsdp__gathers_quantized(const fsdp__unit *u) {
    return u->param_wire == FSDP_WIRE_INT8 || u->param_wire == FSDP_WIRE_INT4;
}

/* A NO_SHARD unit in f32 computes straight on its master copy: nothing to gather (unless its
   weights are quantized: then it computes on their decoded copy, as at any world size). */
static int fsdp__aliases_master(const fsdp_ctx *ctx, const fsdp__unit *u) {
    return u->group_size == 1 && ctx->param_dtype == FSDP_F32 && u->master && !fsdp__gathers_quantized(u);
}

/* A unit whose gradient has nobody to be reduced with (one rank) and no dtype to pass through
   (f32 reduce) accumulates its backward straight into its gradient shard, which then is the
   whole gradient: no unsharded buffer to zero, no add afterwards. fsdp_grad's contract holds:
   the shard is zero after fsdp_zero_grad, and += adds to what earlier backwards left, as the
   separate buffer plus the add did. Not under no_sync, which keeps the shard untouched until
   the micro-steps' sum is reduced. */
static int fsdp__grad_in_place(const fsdp_ctx *ctx, const fsdp__unit *u) {
    return ctx->world == 1 && ctx->reduce_dtype == FSDP_F32 && !ctx->no_sync && u->padded > 0 && u->grad;
}

/* --- a unit's shards where they live (RAM, or the offload file) --------------------------------- */
enum { FSDP__VEC_MASTER = 0, FSDP__VEC_GRAD = 1, FSDP__VEC_STATE = 2 /* + k: the optimizer's state k */ };

/* Unit u's shard `which`: where it is, and its dtype. */
static fsdp__home fsdp__vec_home(const fsdp_ctx *ctx, const fsdp__unit *u, int which, fsdp_dtype *dtype) {
    fsdp__home h;
    *dtype = which >= FSDP__VEC_STATE ? ctx->state_dtype : FSDP_F32;
    if (which >= FSDP__VEC_STATE) return u->opt[which - FSDP__VEC_STATE];
    h.ram = which == FSDP__VEC_MASTER ? u->master : u->grad;
    h.offset = which == FSDP__VEC_MASTER ? u->master_off : u->grad_off;
    return h;
}

/* The optimizer state shard as f32 in RAM, to use in place; NULL if it is bf16 or on disk. */
static float *fsdp__home_f32(const fsdp_ctx *ctx, const fsdp__home *h) {
    return ctx->state_dtype == FSDP_F32 ? (float *)h->ram : NULL;
}

/* Elements [first, first + count) of unit u's shard `which` to (write) or from f32 values at mem,
   converting from and to its dtype. A gradient on disk still zero (grad_zero) reads as zeros. */
FSDP__PRIVATE int fsdp__vec_io(fsdp_ctx *ctx, const fsdp__unit *u, int which, int write, int64_t first, int64_t count,
                               float *mem) {
    fsdp_dtype dtype;
    fsdp__home h = fsdp__vec_home(ctx, u, which, &dtype);
    size_t esize = fsdp_dtype_size(dtype), n = (size_t)count * esize;
    void *raw;
    int rc;
    if (count <= 0) return 0;
    if (h.ram) {
        char *at = (char *)h.ram + (size_t)first * esize;
        if (write) fsdp__from_f32(at, dtype, mem, (size_t)count);
        else fsdp__to_f32(mem, at, dtype, (size_t)count);
        return 0;
    }
    if (!write && which == FSDP__VEC_GRAD && u->grad_zero) {
        memset(mem, 0, sizeof(float) * (size_t)count);
        return 0;
    }
    if (dtype == FSDP_F32) return fsdp__io_bytes(ctx->offload, write, h.offset + (int64_t)((size_t)first * esize), mem, n);
    if (!(raw = FSDP_MALLOC(n))) return FSDP_ERR_OUT_OF_MEMORY;
    if (write) fsdp__from_f32(raw, dtype, mem, (size_t)count);
    rc = fsdp__io_bytes(ctx->offload, write, h.offset + (int64_t)((size_t)first * esize), raw, n);
    if (!rc && !write) fsdp__to_f32(mem, raw, dtype, (size_t)count);
    FSDP_FREE(raw);
    return rc;
}

/* An I/O failure of the offload file fails the context and its comm (the other ranks learn it
   from their next collective, naming this rank); the state is then half updated. */
FSDP__PRIVATE int fsdp__offload_failed(fsdp_ctx *ctx, int rc) {
    const char *why = rc == FSDP_ERR_OUT_OF_MEMORY ? "out of memory" : ctx->offload->message;
    fsdp_comm_fail(ctx->comm, rc, "rank %d: %s", ctx->rank, why);
    return fsdp__fail(ctx, rc, "%s", why);
}

/* (the step in the background, defined with fsdp_step) */
FSDP__PRIVATE int fsdp__step_wait_unit(fsdp_ctx *ctx, fsdp__unit *u, int compute_thread);
FSDP__PRIVATE void fsdp__unit_updated(fsdp_ctx *ctx, fsdp__unit *u);

/* The shard buffers: taken (a free one, its last write done first; -1 unless more than reserve
   are free) and given back (with the ticket of a write still running from it, or 0). Any thread.
   Reads ahead leave two for the comm thread, so that it always finds one. */
FSDP__PRIVATE int fsdp__io_buf_take(fsdp_ctx *ctx, int reserve) {
    int b, found = -1, free_bufs = 0;
    uint64_t pending = 0;
    pthread_mutex_lock(&ctx->lock);
    for (b = 0; b < ctx->num_io_bufs; b++)
        if (!ctx->io_buf_busy[b] && free_bufs++ == 0) found = b;
    if (free_bufs <= reserve) found = -1;
    if (found >= 0) {
        ctx->io_buf_busy[found] = 1;
        pending = ctx->io_buf_ticket[found];
        ctx->io_buf_ticket[found] = 0;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (pending) fsdp__io_wait(ctx->offload, pending); /* (a failed write fails whoever waits next) */
    return found;
}
FSDP__PRIVATE void fsdp__io_buf_give(fsdp_ctx *ctx, int b, uint64_t pending) {
    if (b < 0) return;
    pthread_mutex_lock(&ctx->lock);
    ctx->io_buf_busy[b] = 0;
    ctx->io_buf_ticket[b] = pending;
    pthread_mutex_unlock(&ctx->lock);
}

/* Queues the transfer of unit u's whole master or gradient shard (which) between the file and
   io_buf b, straight (the region is whole aligned blocks: no bounce buffer, and a write need not
   read first); its ticket. A write zeroes the region's padding first. */
FSDP__PRIVATE uint64_t fsdp__shard_submit(fsdp_ctx *ctx, const fsdp__unit *u, int which, int write, int b) {
    size_t bytes = sizeof(float) * (size_t)u->shard, region = fsdp__align(bytes ? bytes : 1, FSDP__IO_ALIGN);
    int64_t offset = which == FSDP__VEC_MASTER ? u->master_off : u->grad_off;
    FSDP_ASSERT(offset >= 0 && region <= ctx->io_buf_bytes && b >= 0);
    if (write) memset((char *)ctx->io_buf[b] + bytes, 0, region - bytes);
    return fsdp__io_submit(ctx->offload, write, offset, ctx->io_buf[b], region);
}

/* Takes a shard buffer and reads unit u's shard (which) into it (a gradient still zero: zeros);
   the buffer, or -1 on failure (the context failed, the peers told; *rc says why). */
FSDP__PRIVATE int fsdp__shard_read(fsdp_ctx *ctx, const fsdp__unit *u, int which, int *rc) {
    int b = fsdp__io_buf_take(ctx, 0);
    *rc = 0;
    if (b < 0) { /* every buffer busy: cannot happen (the reads ahead leave two) */
        *rc = fsdp__fail(ctx, FSDP_ERR_STATE, "offload: no free shard buffer (%d)", ctx->num_io_bufs);
        return -1;
    }
    if (which == FSDP__VEC_GRAD && u->grad_zero) memset(ctx->io_buf[b], 0, sizeof(float) * (size_t)u->shard);
    else if ((*rc = fsdp__io_wait(ctx->offload, fsdp__shard_submit(ctx, u, which, 0, b))) != 0) {
        fsdp__io_buf_give(ctx, b, 0);
        *rc = fsdp__offload_failed(ctx, *rc);
        return -1;
    }
    return b;
}

/* Sum of squares in double, with independent partial sums (a single chain of dependent adds
   would run at the adder's latency, several times slower than memory). */
FSDP__PRIVATE double fsdp__sumsq(const float *x, size_t n) {
    size_t i = 0;
    double total = 0;
#if FSDP__HAVE_STREAM
    __m128d a0 = _mm_setzero_pd(), a1 = _mm_setzero_pd(), a2 = _mm_setzero_pd(), a3 = _mm_setzero_pd();
    double lanes[2];
    for (; i + 8 <= n; i += 8) {
        __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
        __m128d d0 = _mm_cvtps_pd(v0), d1 = _mm_cvtps_pd(_mm_movehl_ps(v0, v0));
        __m128d d2 = _mm_cvtps_pd(v1), d3 = _mm_cvtps_pd(_mm_movehl_ps(v1, v1));
        a0 = _mm_add_pd(a0, _mm_mul_pd(d0, d0));
        a1 = _mm_add_pd(a1, _mm_mul_pd(d1, d1));
        a2 = _mm_add_pd(a2, _mm_mul_pd(d2, d2));
        a3 = _mm_add_pd(a3, _mm_mul_pd(d3, d3));
    }
    _mm_storeu_pd(lanes, _mm_add_pd(_mm_add_pd(a0, a1), _mm_add_pd(a2, a3)));
    total = lanes[0] + lanes[1];
#endif
    for (; i < n; i++) total += (double)x[i] * (double)x[i];
    return total;
}

/* --- comm thread ------------------------------------------------------------------------ */
/* A quantized gather (param_wire INT8/INT4): this rank's f32 shard encoded (whole blocks: the
   shard is a multiple of the block), padded to whole 4-byte words and gathered as words, so that
   no backend needs a byte dtype; then every rank's piece decoded into the unit's buffer in
   param_dtype. Every rank decodes the same bytes: the weights are the same everywhere. */
FSDP__PRIVATE int fsdp__run_gather_wire(fsdp_ctx *ctx, fsdp__unit *u, fsdp__task *t, const float *master, uint32_t tag) {
    size_t esize = fsdp_dtype_size(ctx->param_dtype), S = (size_t)u->shard;
    size_t words = (fsdp_wire_bytes(u->param_wire, S, u->wire_block) + 3) / 4, all = words * 4 * (size_t)u->group_size;
    uint32_t *buf = (uint32_t *)fsdp__buf_get(ctx, all, 0), *mine;
    double t0 = ctx->trace ? fsdp_now() : 0;
    int p, rc = 0;
    if (!buf) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no memory for its %s gather (%zu bytes)",
                                fsdp__unit_name(ctx, (int)(u - ctx->units)), fsdp_wire_name(u->param_wire), all);
    mine = buf + (size_t)u->group_rank * words;
    mine[words - 1] = 0; /* the last word's padding bytes travel too: the same on every run */
    fsdp_wire_encode(mine, u->param_wire, u->wire_block, master, S, NULL); /* (a NaN block decodes to NaN) */
    fsdp__trace_end(ctx, "wire", "quantize", (int)(u - ctx->units), t0);
    if (u->shard_comm)
        rc = fsdp__task_coll(ctx, t, u->shard_comm, FSDP_COLL_ALL_GATHER, mine, buf, words, FSDP_F32, FSDP_SUM, tag);
    t0 = ctx->trace ? fsdp_now() : 0;
    for (p = 0; !rc && p < u->group_size; p++)
        fsdp_wire_decode((char *)u->unsharded + (size_t)p * S * esize, ctx->param_dtype, buf + (size_t)p * words,
                         u->param_wire, u->wire_block, S);
    if (!rc) fsdp__trace_end(ctx, "wire", "dequantize", (int)(u - ctx->units), t0);
    fsdp__buf_put(ctx, buf, all);
    return rc;
}

/* Backward's gather of a unit kept on its host after forward (FSDP_RESHARD_HOST): the host's
   ranks put their slices together, nothing crosses hosts, and the values are forward's (the
   decoded ones of a quantized gather too). */
FSDP__PRIVATE int fsdp__run_host_gather(fsdp_ctx *ctx, fsdp__unit *u, fsdp__task *t, uint32_t tag) {
    int rc = fsdp__task_coll(ctx, t, ctx->host_comm, FSDP_COLL_ALL_GATHER, t->host_src, u->unsharded,
                             (size_t)u->host_numel, ctx->param_dtype, FSDP_SUM, tag);
    if (!rc && u->view32) fsdp__to_f32(u->view32, u->unsharded, ctx->param_dtype, (size_t)u->padded);
    return rc;
}

FSDP__PRIVATE int fsdp__run_gather(fsdp_ctx *ctx, fsdp__unit *u, fsdp__task *t, uint32_t tag) {
    size_t esize = fsdp_dtype_size(ctx->param_dtype);
    char *slot = (char *)u->unsharded + (size_t)u->group_rank * (size_t)u->shard * esize;
    const float *master = u->master;
    int rc;
    if (t->host_src) return fsdp__run_host_gather(ctx, u, t, tag);
    rc = fsdp__step_wait_unit(ctx, u, 0); /* (peers read a shared master once this rank has joined) */
    if (rc) return rc;
    if (u->master_shared) /* f32: straight from the shard, which peers may read directly */
        return fsdp__task_coll(ctx, t, u->shard_comm, FSDP_COLL_ALL_GATHER, u->master, u->unsharded, (size_t)u->shard,
                               FSDP_F32, FSDP_SUM, tag);
    if (!master) { /* on disk: read ahead by fsdp__issue_gather, or now */
        double t0 = ctx->trace ? fsdp_now() : 0;
        if (t->read_buf >= 0 && (rc = fsdp__io_wait(ctx->offload, t->read_ticket)) != 0) return fsdp__offload_failed(ctx, rc);
        fsdp__trace_wait(ctx, "wait io", "io", (int)(u - ctx->units), t0);
        if (t->read_buf < 0 && (t->read_buf = fsdp__shard_read(ctx, u, FSDP__VEC_MASTER, &rc)) < 0) return rc;
        master = ctx->io_buf[t->read_buf];
    }
    if (fsdp__gathers_quantized(u)) rc = fsdp__run_gather_wire(ctx, u, t, master, tag);
    else fsdp__from_f32(slot, ctx->param_dtype, master, (size_t)u->shard);
    if (t->read_buf >= 0) {
        fsdp__io_buf_give(ctx, t->read_buf, 0);
        t->read_buf = -1;
    }
    if (u->shard_comm && !fsdp__gathers_quantized(u))
        rc = fsdp__task_coll(ctx, t, u->shard_comm, FSDP_COLL_ALL_GATHER, slot, u->unsharded, (size_t)u->shard,
                             ctx->param_dtype, FSDP_SUM, tag);
    if (!rc && u->view32) fsdp__to_f32(u->view32, u->unsharded, ctx->param_dtype, (size_t)u->padded);
    return rc;
}

/* The trace's spans of a quantized reduction's phases (fsdp__qrs_watch.phase). */
typedef struct fsdp__reduce_watch {
    fsdp_ctx *ctx;
    int unit;
} fsdp__reduce_watch;
static void fsdp__reduce_phase(void *user, const char *name, double t0) {
    const fsdp__reduce_watch *w = (const fsdp__reduce_watch *)user;
    fsdp__trace_end(w->ctx, "wire", name, w->unit, t0);
}

/* A unit's reduce-scatter over its grad_wire (INT8/INT4): fsdp_reduce_scatter_wire over the host
   and cross-host comms, in place (this rank's slice of grad_full receives the average), with the
   unit's residual under error feedback. A non-finite gradient is named here (on the rank that
   encoded it); its block decodes to NaN, so the step skips. */
FSDP__PRIVATE int fsdp__run_reduce_wire(fsdp_ctx *ctx, fsdp__unit *u, fsdp__task *t) {
    fsdp__reduce_watch w;
    fsdp__qrs_watch watch;
    size_t S = (size_t)u->shard;
    double t0 = ctx->trace ? fsdp_now() : 0;
    int rc;
    w.ctx = ctx;
    w.unit = (int)(u - ctx->units);
    watch.phase = ctx->trace ? fsdp__reduce_phase : NULL;
    watch.user = &w;
    rc = fsdp__qrs_run(ctx->host_comm, ctx->cross_comm, t->grad_full, t->grad_full + (size_t)u->group_rank * S, S,
                       FSDP_AVG, u->grad_wire, fsdp__wire_block(ctx->desc.wire_block), u->residual, &watch);
    if (!rc && watch.nonfinite != SIZE_MAX)
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: unit '%s': grad_wire %s: a non-finite gradient (element %zu of "
                  "the partial of host %zu): its block goes as NaN and the step skips", ctx->rank,
                  fsdp__unit_name(ctx, w.unit), fsdp_wire_name(u->grad_wire), watch.nonfinite % S,
                  watch.nonfinite / S);
    fsdp__trace_end(ctx, "wire", "reduce_scatter_wire", w.unit, t0);
    return rc;
}

FSDP__PRIVATE int fsdp__run_reduce(fsdp_ctx *ctx, fsdp__unit *u, fsdp__task *t, uint32_t tag) {
    fsdp_dtype rd = u->grad_wire ? FSDP_F32 : ctx->reduce_dtype; /* (a quantized reduction sums f32 in its host) */
    float *grad;
    size_t esize = fsdp_dtype_size(rd), i, S = (size_t)u->shard;
    char *data = rd == FSDP_F32 ? (char *)t->grad_full : (char *)t->scratch;
    char *mine = data + (size_t)u->group_rank * S * esize;
    int rc = 0, b = -1;
    if (rd != FSDP_F32) fsdp__from_f32(data, rd, t->grad_full, (size_t)u->padded);
    if (u->grad_wire) rc = fsdp__run_reduce_wire(ctx, u, t);
    else if (u->shard_comm) /* in place: this rank's slice of the buffer receives the average */
        rc = fsdp__task_coll(ctx, t, u->shard_comm, FSDP_COLL_REDUCE_SCATTER, data, mine, S, rd, FSDP_AVG, tag);
    if (!rc && u->replica_comm)
        rc = fsdp__task_coll(ctx, t, u->replica_comm, FSDP_COLL_ALL_REDUCE, mine, mine, S, rd, FSDP_AVG, tag);
    if (rc) return rc;
    if (!(grad = u->grad)) { /* on disk: added to in a shard buffer, written back behind (with its sum of squares) */
        if ((b = fsdp__shard_read(ctx, u, FSDP__VEC_GRAD, &rc)) < 0) return rc;
        grad = ctx->io_buf[b];
        for (i = 0; u->grad_scale != 1.0f && !u->grad_zero && i < S; i++) grad[i] *= u->grad_scale; /* as in RAM */
    }
    if (rd != FSDP_F32) { /* widen block by block and add */
        float block[1024];
        size_t done, j;
        for (done = 0; done < S; done += j) {
            j = S - done < 1024 ? S - done : 1024;
            fsdp__to_f32(block, mine + done * esize, rd, j);
            for (i = 0; i < j; i++) grad[done + i] += block[i];
        }
    } else {
        const float *avg = (const float *)mine;
        for (i = 0; i < S; i++) grad[i] += avg[i];
    }
    if (b >= 0) {
        u->grad_sumsq = fsdp__sumsq(grad, S);
        u->grad_zero = 0;
        u->grad_scale = 1.0f;
        fsdp__io_buf_give(ctx, b, fsdp__shard_submit(ctx, u, FSDP__VEC_GRAD, 1, b)); /* the step's reads queue after it */
    }
    return 0;
}

/* The communicator whose failure ended a task (a HYBRID reduction uses two). */
static fsdp_comm *fsdp__failed_comm(fsdp_ctx *ctx, const fsdp__task *t) {
    const fsdp__unit *u;
    if (t->kind == FSDP__TASK_COLL) return t->comm;
    u = &ctx->units[t->unit];
    if (t->host_src && fsdp_comm_status(ctx->host_comm) != FSDP_SUCCESS) return ctx->host_comm;
    if (u->shard_comm && fsdp_comm_status(u->shard_comm) != FSDP_SUCCESS) return u->shard_comm;
    if (u->replica_comm && fsdp_comm_status(u->replica_comm) != FSDP_SUCCESS) return u->replica_comm;
    if (u->grad_wire && fsdp_comm_status(ctx->host_comm) != FSDP_SUCCESS) return ctx->host_comm;
    if (u->grad_wire && fsdp_comm_status(ctx->cross_comm) != FSDP_SUCCESS) return ctx->cross_comm;
    return u->shard_comm ? u->shard_comm : ctx->comm;
}

/* Takes the next task off the queue to run it; the caller holds ctx->lock. */
static fsdp__task fsdp__take_task(fsdp_ctx *ctx) {
    fsdp__task t = ctx->queue[ctx->queue_head];
    ctx->queue_head = (ctx->queue_head + 1) % ctx->queue_cap;
    ctx->queue_len--;
    ctx->running = 1;
    return t;
}

/* Runs a task taken off the queue (ctx->lock not held) and marks it done. Tasks run one at a
   time in queue order, so completion is a count. After a failure the rest of the queue is only
   drained. */
FSDP__PRIVATE void fsdp__run_task(fsdp_ctx *ctx, fsdp__task *t) {
    int rc;
    pthread_mutex_lock(&ctx->lock);
    rc = ctx->worker_error;
    pthread_mutex_unlock(&ctx->lock);
    if (!rc) {
        fsdp__unit *u = t->unit >= 0 ? &ctx->units[t->unit] : NULL;
        if (t->kind == FSDP__TASK_GATHER) rc = fsdp__run_gather(ctx, u, t, (uint32_t)(t->unit * 4 + 1));
        else if (t->kind == FSDP__TASK_REDUCE) rc = fsdp__run_reduce(ctx, u, t, (uint32_t)(t->unit * 4 + 2));
        else rc = fsdp__task_coll(ctx, t, t->comm, t->coll, t->send, t->recv, t->count, FSDP_F32, FSDP_SUM, 3);
    }
    if (t->kind == FSDP__TASK_REDUCE) {
        fsdp__buf_put(ctx, t->grad_full, t->grad_bytes);
        fsdp__buf_put(ctx, t->scratch, t->scratch_bytes);
    }
    if (t->kind == FSDP__TASK_GATHER && t->host_src) /* the host shard served its gather */
        fsdp__buf_put(ctx, t->host_src, (size_t)ctx->units[t->unit].host_numel * fsdp_dtype_size(ctx->param_dtype));
    if (t->kind == FSDP__TASK_GATHER && t->read_buf >= 0) { /* read ahead but not used (a failure): done with it */
        fsdp__io_wait(ctx->offload, t->read_ticket);
        fsdp__io_buf_give(ctx, t->read_buf, 0);
    }
    fsdp__stream_fence();
    pthread_mutex_lock(&ctx->lock);
    if (rc && !ctx->worker_error) {
        ctx->worker_error = rc;
        fsdp__fmt(ctx->error, sizeof ctx->error, "%s of unit '%s' failed: %s",
                  t->kind == FSDP__TASK_GATHER ? "all-gather" : t->kind == FSDP__TASK_REDUCE ? "gradient reduction"
                                                                                          : "collective",
                  t->unit >= 0 ? fsdp__unit_name(ctx, t->unit) : "-",
                  fsdp_comm_last_error(fsdp__failed_comm(ctx, t)));
    }
    ctx->completed = t->id;
    ctx->running = 0;
    pthread_cond_broadcast(&ctx->done);
    if (ctx->queue_len) pthread_cond_signal(&ctx->wake);
    pthread_mutex_unlock(&ctx->lock);
}

static void *fsdp__worker(void *arg) {
    fsdp_ctx *ctx = (fsdp_ctx *)arg;
    fsdp__trace_thread = FSDP__TID_COMM;
    for (;;) {
        fsdp__task t;
        pthread_mutex_lock(&ctx->lock);
        while ((ctx->queue_len == 0 || ctx->running) && !ctx->stop) pthread_cond_wait(&ctx->wake, &ctx->lock);
        if (ctx->stop && (ctx->queue_len == 0 || ctx->running)) { pthread_mutex_unlock(&ctx->lock); break; }
        t = fsdp__take_task(ctx);
        pthread_mutex_unlock(&ctx->lock);
        FSDP__CHAOS(FSDP__CHAOS_THREAD);
        fsdp__run_task(ctx, &t);
    }
    return NULL;
}

/* Queues a task for the comm thread; wake 0 leaves the thread asleep, for a task the caller
   is about to wait for and so runs itself (fsdp__wait_task). */
FSDP__PRIVATE uint64_t fsdp__enqueue(fsdp_ctx *ctx, const fsdp__task *task, int wake) {
    uint64_t id;
    pthread_mutex_lock(&ctx->lock);
    FSDP_ASSERT(ctx->queue_len < ctx->queue_cap); /* at most a few tasks per unit are ever queued */
    if (ctx->queue_len == ctx->queue_cap) { /* (with assertions off: the caller reports it) */
        pthread_mutex_unlock(&ctx->lock);
        return 0;
    }
    id = ++ctx->issued;
    ctx->queue[(ctx->queue_head + ctx->queue_len) % ctx->queue_cap] = *task;
    ctx->queue[(ctx->queue_head + ctx->queue_len) % ctx->queue_cap].id = id;
    if (ctx->trace) ctx->queue[(ctx->queue_head + ctx->queue_len) % ctx->queue_cap].issued = fsdp_now();
    ctx->queue_len++;
    if (wake) pthread_cond_signal(&ctx->wake);
    pthread_mutex_unlock(&ctx->lock);
    FSDP__CHAOS(FSDP__CHAOS_THREAD);
    return id;
}

/* Whether a waiting thread may run queued tasks itself: only where every op ends by its deadline
   (the shm and socket transports). An op of another backend (MPI, a user's) may not, and then
   the waiter must stay free to give up and abort it (below). */
static int fsdp__can_help(const fsdp_ctx *ctx) {
    const fsdp_comm *comms[5];
    int i;
    comms[0] = ctx->comm;
    comms[1] = ctx->hybrid_shard_comm;
    comms[2] = ctx->hybrid_replica_comm;
    comms[3] = ctx->host_comm;
    comms[4] = ctx->cross_comm;
    for (i = 0; i < 5; i++)
        if (comms[i] && !fsdp__comm_keeps_deadline(comms[i])) return 0;
    return 1;
}

/* Waits for task id (0: everything issued). Each op of the comm thread ends by its
   communicator's timeout, so this wait does too. Should it not (a user backend that ignores
   its timeout), the wait gives up (after 4 timeouts per task ahead, a task being at most two
   collectives and their fingerprint exchanges, plus 2 s) by aborting every communicator of
   the context, which makes the running op fail, and still returns only once the comm thread
   has finished that op: it never leaves the thread writing into buffers the caller may free. */
FSDP__PRIVATE int fsdp__wait_task_for(fsdp_ctx *ctx, uint64_t id, const char *what, int unit) {
    int rc, gave_up = 0;
    double limit, t0 = 0;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    pthread_mutex_lock(&ctx->lock);
    if (id == 0) id = ctx->issued;
    if (ctx->trace && ctx->completed < id && !ctx->worker_error) t0 = fsdp_now();
    limit = fsdp_now() + (double)(id > ctx->completed ? id - ctx->completed : 1) * 4.0 *
                             fsdp_comm_timeout(ctx->comm) / 1000.0 + 2.0;
    while (ctx->completed < id && !ctx->worker_error) {
        struct timespec ts;
        if (FSDP__CHAOS_COIN(FSDP__CHAOS_THREAD)) {
            pthread_cond_signal(&ctx->wake); /* (>>chaos: the comm thread runs the tasks, not this waiter) */
        } else if (!ctx->running && ctx->queue_len > 0 && fsdp__can_help(ctx)) {
            /* the comm thread has not got to it (on a busy machine it waits for a core): rather
               than sleep, run the tasks up to this one here, in order */
            fsdp__task t = fsdp__take_task(ctx);
            pthread_mutex_unlock(&ctx->lock);
            fsdp__run_task(ctx, &t);
            pthread_mutex_lock(&ctx->lock);
            continue;
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&ctx->done, &ctx->lock, &ts);
        if (!gave_up && fsdp_now() > limit && ctx->completed < id) {
            fsdp_comm *comms[5];
            int i;
            gave_up = 1;
            comms[0] = ctx->comm;
            comms[1] = ctx->hybrid_shard_comm;
            comms[2] = ctx->hybrid_replica_comm;
            comms[3] = ctx->host_comm != ctx->hybrid_shard_comm ? ctx->host_comm : NULL;
            comms[4] = ctx->cross_comm;
            pthread_mutex_unlock(&ctx->lock);
            for (i = 0; i < 5; i++)
                if (comms[i])
                    fsdp_comm_fail(comms[i], FSDP_ERR_TIMEOUT, "rank %d: the comm thread did not finish task %llu "
                                   "in time (its backend did not keep the %d ms timeout); the communicator was "
                                   "aborted", ctx->rank, (unsigned long long)id, fsdp_comm_timeout(ctx->comm));
            pthread_mutex_lock(&ctx->lock);
        }
    }
    rc = ctx->worker_error;
    pthread_mutex_unlock(&ctx->lock);
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    fsdp__trace_wait(ctx, what, "comm", unit, t0);
    if (rc && ctx->step_thread_started) { /* a collective failed because the step behind did: its cause */
        pthread_mutex_lock(&ctx->step_lock);
        if (ctx->step_rc) rc = ctx->step_rc;
        pthread_mutex_unlock(&ctx->step_lock);
    }
    return rc;
}
FSDP__PRIVATE int fsdp__wait_task(fsdp_ctx *ctx, uint64_t id) { return fsdp__wait_task_for(ctx, id, "wait collective", -1); }

/* Runs one f32 collective on the comm thread, in order with the gathers and reductions. */
FSDP__PRIVATE int fsdp__worker_coll(fsdp_ctx *ctx, fsdp_comm *comm, fsdp_coll_kind kind, const void *send, void *recv,
                                    size_t count, int root) {
    fsdp__task t;
    uint64_t id;
    memset(&t, 0, sizeof t);
    t.kind = FSDP__TASK_COLL;
    t.unit = -1;
    t.comm = comm;
    t.coll = kind;
    t.send = send;
    t.recv = recv;
    t.count = count;
    t.root = root;
    /* a synchronous op: where the waiter may run tasks itself it does, rather than hand this one
       to the comm thread and sleep until it is done (two thread switches, and on a VM a vCPU
       that idled comes back slow) */
    id = fsdp__enqueue(ctx, &t, !fsdp__can_help(ctx));
    return id ? fsdp__wait_task(ctx, id) : fsdp__fail(ctx, FSDP_ERR_STATE, "comm queue full");
}

static int fsdp__check_worker(fsdp_ctx *ctx) {
    int rc;
    pthread_mutex_lock(&ctx->lock);
    rc = ctx->worker_error;
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

/* --- gathering and resharding (compute thread) ------------------------------------------- */
FSDP__PRIVATE int fsdp__issue_gather(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    fsdp__task t;
    if (u->state != FSDP__SHARDED) return 0;
    if (fsdp__aliases_master(ctx, u) || u->padded == 0) { /* nothing to gather */
        u->unsharded = u->master;
        u->state = FSDP__UNSHARDED;
        return 0;
    }
    u->unsharded = fsdp__buf_get(ctx, fsdp__unsharded_bytes(ctx, u), 0);
    if (!u->unsharded) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no memory to gather %lld elements",
                                         fsdp__unit_name(ctx, ui), (long long)u->padded);
    if (ctx->desc.fp32_compute_view && ctx->param_dtype != FSDP_F32) {
        u->view32 = (float *)fsdp__buf_get(ctx, (size_t)u->padded * sizeof(float), 0);
        if (!u->view32) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no memory for the f32 view",
                                          fsdp__unit_name(ctx, ui));
    }
    memset(&t, 0, sizeof t);
    t.kind = FSDP__TASK_GATHER;
    t.unit = ui;
    t.read_buf = -1;
    t.host_src = u->host_shard; /* kept after forward (FSDP_RESHARD_HOST): gathered inside the host, then freed */
    u->host_shard = NULL;
    if (!t.host_src && !u->master && ctx->offload && __atomic_load_n(&u->step_done, __ATOMIC_ACQUIRE) &&
        (t.read_buf = fsdp__io_buf_take(ctx, 2)) >= 0) /* on disk and updated: its read starts now */
        t.read_ticket = fsdp__shard_submit(ctx, u, FSDP__VEC_MASTER, 0, t.read_buf);
    u->gather_task = fsdp__enqueue(ctx, &t, 1);
    u->state = FSDP__GATHERING;
    return 0;
}

FSDP__PRIVATE void fsdp__reshard(fsdp_ctx *ctx, fsdp__unit *u) {
    if (u->unsharded && u->unsharded != (void *)u->master) fsdp__buf_put(ctx, u->unsharded, fsdp__unsharded_bytes(ctx, u));
    fsdp__buf_put(ctx, u->view32, u->view32 ? (size_t)u->padded * sizeof(float) : 0);
    u->unsharded = NULL;
    u->view32 = NULL;
    u->state = FSDP__SHARDED;
}

/* Frees a host shard no backward gathered (a forward-only pass, a frozen unit without backward). */
FSDP__PRIVATE void fsdp__drop_host_shard(fsdp_ctx *ctx, fsdp__unit *u) {
    fsdp__buf_put(ctx, u->host_shard, (size_t)u->host_numel * fsdp_dtype_size(ctx->param_dtype));
    u->host_shard = NULL;
}

/* The end of a unit's forward (or of its recomputation before its backward): as its reshard mode
   says. FSDP_RESHARD_HOST first keeps this rank's slice of its host's share: rank l of the L on
   the host keeps elements [l S, l S + S) of the gathered buffer (S = host_numel = ceil(padded / L);
   zeros past padded), whatever the other hosts' sizes. */
FSDP__PRIVATE int fsdp__reshard_after_forward(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    if (u->reshard_mode == FSDP_RESHARD_NONE) {
        u->state = FSDP__UNSHARDED;
        return 0;
    }
    if (u->reshard_mode == FSDP_RESHARD_HOST && u->padded > 0 && !u->host_shard) {
        size_t esize = fsdp_dtype_size(ctx->param_dtype), bytes = (size_t)u->host_numel * esize;
        int64_t first = (int64_t)fsdp_comm_rank(ctx->host_comm) * u->host_numel;
        int64_t n = u->padded - first < u->host_numel ? u->padded - first : u->host_numel;
        if (n < 0) n = 0;
        if (!(u->host_shard = fsdp__buf_get(ctx, bytes, 0)))
            return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no memory for its host shard (%zu bytes)",
                              fsdp__unit_name(ctx, ui), bytes);
        memcpy(u->host_shard, (char *)u->unsharded + (size_t)first * esize, (size_t)n * esize);
        memset((char *)u->host_shard + (size_t)n * esize, 0, bytes - (size_t)n * esize);
    }
    fsdp__reshard(ctx, u);
    return 0;
}

static int fsdp__gathering_count(const fsdp_ctx *ctx) {
    int i, n = 0;
    for (i = 0; i < ctx->num_units; i++) n += ctx->units[i].state == FSDP__GATHERING;
    return n;
}

/* Gathers the unit after ui in an order ("prefetch"), within the in-flight limit. */
FSDP__PRIVATE int fsdp__prefetch_after(fsdp_ctx *ctx, const int *order, int len, int ui) {
    int i;
    if (!(order == ctx->fwd_order ? ctx->fwd_known : ctx->bwd_known)) return 0;
    for (i = 0; i + 1 < len; i++)
        if (order[i] == ui) {
            int next = order[i + 1];
            if (ctx->units[next].state == FSDP__SHARDED && !ctx->units[next].backward_done &&
                fsdp__gathering_count(ctx) < ctx->desc.limit_all_gathers)
                return fsdp__issue_gather(ctx, next);
            return 0;
        }
    return 0;
}

FSDP__PRIVATE int fsdp__wait_gathered(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    int rc;
    if (u->state == FSDP__GATHERING) {
        if ((rc = fsdp__wait_task_for(ctx, u->gather_task, "wait all_gather", ui)) != 0) return rc;
        u->state = FSDP__UNSHARDED;
    }
    return 0;
}

/* Compares the recorded forward and backward orders across ranks at the end of each iteration
   until both are known (the first iteration, and with evaluation passes first the first one
   with a backward), then marks them known. */
FSDP__PRIVATE int fsdp__verify_order(fsdp_ctx *ctx) {
    uint64_t mine[2] = {0xcbf29ce484222325ull, 0xcbf29ce484222325ull}, *all;
    int i, r, rc;
    if (ctx->phase == 0 || (ctx->fwd_known && (ctx->bwd_known || ctx->phase != 2))) return 0;
    for (i = 0; i < ctx->fwd_len; i++) mine[0] = (mine[0] ^ (uint64_t)ctx->fwd_order[i]) * 0x100000001b3ull;
    for (i = 0; i < ctx->bwd_len; i++) mine[1] = (mine[1] ^ (uint64_t)ctx->bwd_order[i]) * 0x100000001b3ull;
    all = (uint64_t *)FSDP_MALLOC(sizeof mine * (size_t)ctx->world);
    if ((rc = fsdp__agree_alloc(ctx, all, sizeof mine * (size_t)ctx->world, "checking the units' order across ranks")) != 0) {
        FSDP_FREE(all);
        return rc;
    }
    rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_GATHER, mine, all, sizeof mine / 4, 0);
    for (r = 0; !rc && r < ctx->world; r++)
        if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
            rc = fsdp__fail(ctx, FSDP_ERR_MISMATCH,
                            "ranks ran the units in different orders: rank %d's %s order differs from rank %d's "
                            "(every rank must call the hooks of the same units in the same order)",
                            ctx->rank, all[2 * r] != mine[0] ? "forward" : "backward", r);
    FSDP_FREE(all);
    if (!rc) ctx->fwd_known = 1;
    if (!rc && ctx->phase == 2) ctx->bwd_known = 1;
    return rc;
}

/* Ends the iteration: a unit whose backward started must have finished it. Units that ran
   forward only (evaluation) are resharded. */
FSDP__PRIVATE int fsdp__end_iteration(fsdp_ctx *ctx) {
    int i, rc;
    for (i = 0; i < ctx->num_units; i++) {
        fsdp__unit *u = &ctx->units[i];
        if (u->state == FSDP__IN_FORWARD || (u->backward_started && !u->backward_done))
            return fsdp__fail(ctx, FSDP_ERR_STATE, "unit '%s' is still in %s (state %s)", fsdp__unit_name(ctx, i),
                              u->state == FSDP__IN_FORWARD ? "forward" : "backward", fsdp__state_name(u->state));
    }
    if (ctx->phase == 2)
        for (i = 0; i < ctx->num_units; i++)
            if (ctx->units[i].forward_done && !ctx->units[i].backward_done && !ctx->units[i].frozen)
                return fsdp__fail(ctx, FSDP_ERR_STATE, "unit '%s' ran forward but not backward in this iteration",
                                  fsdp__unit_name(ctx, i));
    for (i = 0; i < ctx->num_units; i++) { /* forward-only units that stayed gathered */
        fsdp__unit *u = &ctx->units[i];
        if (u->state == FSDP__GATHERING && (rc = fsdp__wait_gathered(ctx, i)) != 0) return rc;
        if (u->state == FSDP__UNSHARDED && !fsdp__aliases_master(ctx, u)) fsdp__reshard(ctx, u);
        else if (u->state == FSDP__UNSHARDED) u->state = FSDP__SHARDED;
        fsdp__drop_host_shard(ctx, u);
    }
    if ((rc = fsdp__verify_order(ctx)) != 0) return rc;
    if (ctx->phase == 2) ctx->grads_since_step = 1;
    for (i = 0; i < ctx->num_units; i++) {
        fsdp__unit *u = &ctx->units[i];
        u->forward_done = u->backward_started = u->backward_done = 0;
    }
    ctx->phase = 0;
    return 0;
}

/* --- hooks --------------------------------------------------------------------------------- */
static int fsdp__hook_unit(fsdp_ctx *ctx, int module, int *ui) {
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (module < 0 || module >= ctx->model->num_modules)
        return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "module %d does not exist (the model has %d)", module,
                          ctx->model->num_modules);
    *ui = ctx->plan.unit_of_module[module];
    return fsdp__check_worker(ctx);
}

FSDP__PRIVATE int fsdp__unit_pre_forward(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    int rc, i;
    if ((rc = fsdp__step_wait_unit(ctx, u, 1)) != 0) return rc; /* the update of the step behind */
    if (ctx->phase == 2) { /* the first forward after a backward starts a new iteration */
        if ((rc = fsdp__end_iteration(ctx)) != 0) return rc;
    }
    if (u->state == FSDP__IN_FORWARD || u->state == FSDP__IN_BACKWARD || u->forward_done)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "pre_forward of unit '%s' in state %s%s", fsdp__unit_name(ctx, ui),
                          fsdp__state_name(u->state), u->forward_done ? " (its forward already ran in this iteration: end a "
                                             "forward-only pass (validation, sampling) with fsdp_finish_backward(ctx) before "
                                             "the next forward)" : "");
    ctx->phase = 1;
    if (!ctx->fwd_known) {
        for (i = 0; i < ctx->fwd_len && ctx->fwd_order[i] != ui; i++) {}
        if (i == ctx->fwd_len) ctx->fwd_order[ctx->fwd_len++] = ui;
    }
    if ((rc = fsdp__issue_gather(ctx, ui)) != 0) return rc;
    if (ctx->desc.forward_prefetch && (rc = fsdp__prefetch_after(ctx, ctx->fwd_order, ctx->fwd_len, ui)) != 0) return rc;
    if ((rc = fsdp__wait_gathered(ctx, ui)) != 0) return rc;
    u->state = FSDP__IN_FORWARD;
    return 0;
}

FSDP__PRIVATE int fsdp__unit_post_forward(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    u->forward_done = 1;
    /* (a unit that computes on its master frees nothing, but is resharded all the same: its
       weights are then unreadable outside its hooks on one rank as on many) */
    return fsdp__reshard_after_forward(ctx, ui);
}

FSDP__PRIVATE int fsdp__unit_pre_backward(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    int rc;
    if ((rc = fsdp__step_wait_unit(ctx, u, 1)) != 0) return rc;
    if (!u->forward_done || u->backward_started || u->state == FSDP__IN_FORWARD)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "pre_backward of unit '%s' in state %s (%s)", fsdp__unit_name(ctx, ui),
                          fsdp__state_name(u->state),
                          u->state == FSDP__IN_FORWARD ? "its forward has not ended"
                          : !u->forward_done          ? "its forward did not run this iteration"
                                                      : "its backward already ran this iteration");
    ctx->phase = 2;
    u->backward_started = 1;
    if (!ctx->bwd_known) ctx->bwd_order[ctx->bwd_len++] = ui;
    if ((rc = fsdp__issue_gather(ctx, ui)) != 0) return rc;
    if (ctx->desc.backward_prefetch == FSDP_BACKWARD_PRE &&
        (rc = fsdp__prefetch_after(ctx, ctx->bwd_order, ctx->bwd_len, ui)) != 0)
        return rc;
    if (!u->grad_full && !u->frozen) {
        if (fsdp__grad_in_place(ctx, u)) {
            u->grad_full = u->grad; /* nothing to reduce: the backward accumulates straight into the gradient */
        } else {
            /* at most one earlier unit's gradient still being reduced: bounds gradient memory to two */
            if (ctx->older_reduce && (rc = fsdp__wait_task_for(ctx, ctx->older_reduce, "wait reduce_scatter", -1)) != 0)
                return rc;
            u->grad_full = (float *)fsdp__buf_get(ctx, (size_t)u->padded * sizeof(float), 1);
            if (!u->grad_full) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no memory for gradients",
                                                 fsdp__unit_name(ctx, ui));
        }
    }
    if ((rc = fsdp__wait_gathered(ctx, ui)) != 0) return rc;
    u->state = FSDP__IN_BACKWARD;
    return 0;
}

FSDP__PRIVATE int fsdp__unit_post_backward(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    int rc;
    if (u->recompute)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "post_backward of unit '%s' while %d forward hook(s) of its recomputation "
                          "are still open (call post_forward for each)", fsdp__unit_name(ctx, ui), u->recompute);
    u->backward_done = 1;
    if (u->frozen) {
        /* no gradient to reduce */
    } else if (ctx->no_sync) {
        u->grad_full_pending = 1; /* keep accumulating locally */
    } else if (u->grad_full == u->grad) { /* accumulated in place: done */
        u->grad_full = NULL;
        u->grad_full_pending = 0;
    } else if (u->padded == 0) {
        fsdp__buf_put(ctx, u->grad_full, 0);
        u->grad_full = NULL;
    } else {
        fsdp__task t;
        memset(&t, 0, sizeof t);
        t.kind = FSDP__TASK_REDUCE;
        t.unit = ui;
        t.grad_full = u->grad_full;
        t.grad_bytes = (size_t)u->padded * sizeof(float);
        if (ctx->reduce_dtype != FSDP_F32 && !u->grad_wire) {
            t.scratch_bytes = (size_t)u->padded * fsdp_dtype_size(ctx->reduce_dtype);
            t.scratch = fsdp__buf_get(ctx, t.scratch_bytes, 0);
            if (!t.scratch) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "unit '%s': no memory to reduce gradients",
                                              fsdp__unit_name(ctx, ui));
        }
        u->grad_full = NULL; /* the comm thread owns it now */
        u->grad_full_pending = 0;
        ctx->older_reduce = ctx->newer_reduce;
        ctx->newer_reduce = fsdp__enqueue(ctx, &t, 1);
        if (!ctx->newer_reduce) return fsdp__fail(ctx, FSDP_ERR_STATE, "comm queue full");
    }
    if (!fsdp__aliases_master(ctx, u)) fsdp__reshard(ctx, u);
    else u->state = FSDP__SHARDED;
    if (ctx->desc.backward_prefetch == FSDP_BACKWARD_POST &&
        (rc = fsdp__prefetch_after(ctx, ctx->bwd_order, ctx->bwd_len, ui)) != 0)
        return rc;
    return 0;
}

/* Activation checkpointing: during backward, a forward hook of a unit whose forward ran and
   whose backward has not ended is a recomputation. Inside the unit's own backward it is
   gathered already (nothing to do); before it (a checkpointed region spanning several units)
   it is gathered again for the recomputation and resharded after, as in forward. Nothing is
   recorded in the unit order. */
FSDP__PRIVATE int fsdp__recompute_pre_forward(fsdp_ctx *ctx, int ui) {
    fsdp__unit *u = &ctx->units[ui];
    int rc;
    if (u->state == FSDP__IN_BACKWARD) {
        u->recompute++;
        return 0;
    }
    if (u->refcount == 0) {
        if ((rc = fsdp__issue_gather(ctx, ui)) != 0 || (rc = fsdp__wait_gathered(ctx, ui)) != 0) return rc;
        u->state = FSDP__IN_FORWARD;
        u->recomputing = 1;
    }
    u->refcount++;
    return 0;
}

/* A frozen unit may skip its backward, so a later forward of it can also begin the next
   iteration: it is a recomputation only while some unit's backward is open (inside a
   checkpointed region's backward), not between backward passes (no_sync micro-steps). */
static int fsdp__recomputes(const fsdp_ctx *ctx, const fsdp__unit *u) {
    int i, open = 0;
    if (ctx->phase != 2 || !u->forward_done || u->backward_done) return 0;
    if (!u->frozen || u->state == FSDP__IN_BACKWARD) return 1;
    for (i = 0; i < ctx->num_units && !open; i++) open = ctx->units[i].state == FSDP__IN_BACKWARD;
    return open;
}

FSDP__PRIVATE int fsdp__hook_pre_forward(fsdp_ctx *ctx, int module) {
    int ui = -1, rc = fsdp__hook_unit(ctx, module, &ui);
    if (rc) return rc;
    if (fsdp__recomputes(ctx, &ctx->units[ui])) return fsdp__recompute_pre_forward(ctx, ui);
    if (ctx->units[ui].refcount == 0 && (rc = fsdp__unit_pre_forward(ctx, ui)) != 0) return rc;
    if (ctx->units[ui].state != FSDP__IN_FORWARD)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "pre_forward of module '%s' whose unit '%s' is in state %s",
                          ctx->model->modules[module].name, fsdp__unit_name(ctx, ui), fsdp__state_name(ctx->units[ui].state));
    ctx->units[ui].refcount++;
    return 0;
}

FSDP__PRIVATE int fsdp__hook_post_forward(fsdp_ctx *ctx, int module) {
    int ui = -1, rc = fsdp__hook_unit(ctx, module, &ui);
    fsdp__unit *u;
    if (rc) return rc;
    u = &ctx->units[ui];
    if (u->state == FSDP__IN_BACKWARD && u->recompute > 0) { /* end of a recomputation in its own backward */
        u->recompute--;
        return 0;
    }
    if (u->recomputing && u->state == FSDP__IN_FORWARD && u->refcount > 0) {
        if (--u->refcount > 0) return 0;
        u->recomputing = 0;
        return fsdp__reshard_after_forward(ctx, ui);
    }
    if (ctx->units[ui].state != FSDP__IN_FORWARD || ctx->units[ui].refcount <= 0)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "post_forward of module '%s' but its unit '%s' is in state %s, not FORWARD",
                          *ctx->model->modules[module].name ? ctx->model->modules[module].name : "(root)",
                          fsdp__unit_name(ctx, ui), fsdp__state_name(ctx->units[ui].state));
    if (--ctx->units[ui].refcount == 0) return fsdp__unit_post_forward(ctx, ui);
    return 0;
}

FSDP__PRIVATE int fsdp__hook_pre_backward(fsdp_ctx *ctx, int module) {
    int ui = -1, rc = fsdp__hook_unit(ctx, module, &ui);
    if (rc) return rc;
    if (ctx->units[ui].refcount == 0 && (rc = fsdp__unit_pre_backward(ctx, ui)) != 0) return rc;
    if (ctx->units[ui].state != FSDP__IN_BACKWARD)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "pre_backward of module '%s' whose unit '%s' is in state %s",
                          ctx->model->modules[module].name, fsdp__unit_name(ctx, ui), fsdp__state_name(ctx->units[ui].state));
    ctx->units[ui].refcount++;
    return 0;
}

FSDP__PRIVATE int fsdp__hook_post_backward(fsdp_ctx *ctx, int module) {
    int ui = -1, rc = fsdp__hook_unit(ctx, module, &ui);
    if (rc) return rc;
    if (ctx->units[ui].state != FSDP__IN_BACKWARD || ctx->units[ui].refcount <= 0)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "post_backward of module '%s' but its unit '%s' is in state %s, not BACKWARD",
                          *ctx->model->modules[module].name ? ctx->model->modules[module].name : "(root)",
                          fsdp__unit_name(ctx, ui), fsdp__state_name(ctx->units[ui].state));
    if (ctx->units[ui].refcount == 1 && ctx->units[ui].recompute) /* refused before anything changes: close it, retry */
        return fsdp__unit_post_backward(ctx, ui);
    if (--ctx->units[ui].refcount == 0) return fsdp__unit_post_backward(ctx, ui);
    return 0;
}

/* The hooks as called: traced around. */
FSDP__PRIVATE int fsdp__traced_hook(fsdp_ctx *ctx, int module, int (*hook)(fsdp_ctx *, int), const char *name) {
    double t0 = fsdp__trace_begin(ctx);
    int rc = hook(ctx, module);
    fsdp__trace_hook(ctx, name, module, t0);
    if (ctx && ctx->trace) fsdp__trace_spill(ctx);
    if (ctx) ctx->hook_failed = rc != 0;
    if (ctx && ctx->recovery && !ctx->loss_rc && fsdp__recovery_loss(rc)) ctx->loss_rc = rc;
    if (ctx && rc == FSDP_ERR_STATE) fsdp__misused(ctx); /* out of order */
    return rc;
}
FSDP_API int fsdp_pre_forward(fsdp_ctx *ctx, int module) {
    return fsdp__traced_hook(ctx, module, fsdp__hook_pre_forward, "pre_forward");
}
FSDP_API int fsdp_post_forward(fsdp_ctx *ctx, int module) {
    return fsdp__traced_hook(ctx, module, fsdp__hook_post_forward, "post_forward");
}
FSDP_API int fsdp_pre_backward(fsdp_ctx *ctx, int module) {
    return fsdp__traced_hook(ctx, module, fsdp__hook_pre_backward, "pre_backward");
}
FSDP_API int fsdp_post_backward(fsdp_ctx *ctx, int module) {
    return fsdp__traced_hook(ctx, module, fsdp__hook_post_backward, "post_backward");
}

/* --- parameter access ---------------------------------------------------------------------- */
static fsdp__unit *fsdp__param_unit(fsdp_ctx *ctx, int param) {
    if (!ctx || param < 0 || param >= ctx->model->num_params) return NULL;
    return &ctx->units[ctx->plan.unit_of_param[param]];
}

/* Where parameter p's slice starts in its unit's shard (an empty slice: still inside it). */
static int64_t fsdp__param_at(const fsdp_ctx *ctx, int p) { return ctx->param_at[p]; }

/* What a parameter accessor (fsdp_param, fsdp_param_raw: weights; fsdp_grad: gradients) called
   where its unit has none to give tells the caller: the parameter, its unit and the unit's
   state, and the hook to call (fsdp__misused). NULL, for the accessor to return. */
FSDP__PRIVATE void *fsdp__access_misused(fsdp_ctx *ctx, const char *fn, int param, int grad) {
    char message[FSDP__ERRMSG], unit[160], fix[FSDP__ERRMSG];
    const fsdp__unit *u;
    int ui, module;
    if (param < 0 || param >= ctx->model->num_params) {
        fsdp__fmt(message, sizeof message, "%s(ctx, %d): no such parameter (the model has %d)", fn, param,
                  ctx->model->num_params);
        fsdp__set_error(ctx, message);
        fsdp__misused(ctx);
        return NULL;
    }
    ui = ctx->plan.unit_of_param[param];
    u = &ctx->units[ui];
    module = u->module;
    if (ui == 0) fsdp__fmt(unit, sizeof unit, "unit 0 (root)");
    else fsdp__fmt(unit, sizeof unit, "unit %d '%s'", ui, fsdp__unit_name(ctx, ui));
    if (ctx->hook_failed) { /* code that does not check the hooks' results: the cause is that failure */
        pthread_mutex_lock(&ctx->lock);
        fsdp__fmt(fix, sizeof fix, "the last hook call failed: %s", ctx->error);
        pthread_mutex_unlock(&ctx->lock);
    } else if (grad)
        fsdp__fmt(fix, sizeof fix, "gradients exist from fsdp_pre_backward(ctx, %d) to fsdp_post_backward(ctx, %d)", module,
                  module);
    else if (u->state == FSDP__IN_FORWARD || u->state == FSDP__IN_BACKWARD || u->state == FSDP__UNSHARDED)
        fsdp__fmt(fix, sizeof fix, "param_dtype is %s: f32 weights need fsdp_desc.fp32_compute_view = 1 (or read "
                  "them with fsdp_param_raw)", fsdp_dtype_name(ctx->param_dtype));
    else if (u->forward_done && !u->backward_started)
        fsdp__fmt(fix, sizeof fix, "its fsdp_post_forward resharded it (%s): in backward, call fsdp_pre_backward(ctx, "
                  "%d) first", fsdp_strategy_name(u->strategy), module);
    else if (u->backward_done)
        fsdp__fmt(fix, sizeof fix, "its fsdp_post_backward resharded it: read weights between its hooks");
    else
        fsdp__fmt(fix, sizeof fix, "call fsdp_pre_forward(ctx, %d) first (fsdp_pre_backward(ctx, %d) in backward)%s",
                  module, module, ui == 0 ? "; the root unit's hooks wrap the whole forward and the whole backward" : "");
    fsdp__fmt(message, sizeof message, "%s(ctx, %d '%s'): %s is %s: %s", fn, param, ctx->model->params[param].name, unit,
              u->state == FSDP__SHARDED     ? "sharded (not gathered)"
              : u->state == FSDP__GATHERING ? "being gathered (its hook has not run)"
              : u->state == FSDP__IN_FORWARD ? "in its forward"
              : u->state == FSDP__IN_BACKWARD ? "in its backward"
                                               : "gathered, between its forward and its backward",
              fix);
    fsdp__set_error(ctx, message);
    fsdp__misused(ctx);
    return NULL;
}

static int fsdp__weights_readable(const fsdp__unit *u) {
    return u->state == FSDP__IN_FORWARD || u->state == FSDP__IN_BACKWARD || u->state == FSDP__UNSHARDED;
}

FSDP_API float *fsdp_param(fsdp_ctx *ctx, int param) {
    fsdp__unit *u = fsdp__param_unit(ctx, param);
    if (!ctx) return NULL;
    if (!u || !fsdp__weights_readable(u) || (ctx->param_dtype != FSDP_F32 && !u->view32))
        return (float *)fsdp__access_misused(ctx, "fsdp_param", param, 0);
    if (ctx->param_dtype == FSDP_F32) return (float *)u->unsharded + ctx->plan.param_offset[param];
    return u->view32 + ctx->plan.param_offset[param];
}

FSDP_API void *fsdp_param_raw(fsdp_ctx *ctx, int param) {
    fsdp__unit *u = fsdp__param_unit(ctx, param);
    if (!ctx) return NULL;
    if (!u || !fsdp__weights_readable(u)) return fsdp__access_misused(ctx, "fsdp_param_raw", param, 0);
    return (char *)u->unsharded + (size_t)ctx->plan.param_offset[param] * fsdp_dtype_size(ctx->param_dtype);
}

FSDP_API float *fsdp_grad(fsdp_ctx *ctx, int param) {
    fsdp__unit *u = fsdp__param_unit(ctx, param);
    if (!ctx) return NULL;
    if (u && ctx->model->params[param].frozen) return NULL; /* no gradient, ever (documented) */
    if (!u || u->state != FSDP__IN_BACKWARD || !u->grad_full) return (float *)fsdp__access_misused(ctx, "fsdp_grad", param, 1);
    return u->grad_full + ctx->plan.param_offset[param];
}

FSDP_API int fsdp_set_no_sync(fsdp_ctx *ctx, int on) {
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    ctx->no_sync = on != 0;
    return 0;
}

/* --- optimizer ----------------------------------------------------------------------------- */

/* A gradient on disk that owes a clipping factor, scaled and written back (with its sum of
   squares), so that what follows sees the very floats a gradient in RAM would hold. */
FSDP__PRIVATE int fsdp__grad_settle(fsdp_ctx *ctx, fsdp__unit *u) {
    size_t S = (size_t)u->shard, i;
    int rc, b;
    float *grad;
    if (u->grad || u->grad_zero || u->grad_scale == 1.0f) return 0;
    if ((b = fsdp__shard_read(ctx, u, FSDP__VEC_GRAD, &rc)) < 0) return rc;
    grad = ctx->io_buf[b];
    for (i = 0; i < S; i++) grad[i] *= u->grad_scale;
    u->grad_sumsq = fsdp__sumsq(grad, S);
    u->grad_scale = 1.0f;
    fsdp__io_buf_give(ctx, b, fsdp__shard_submit(ctx, u, FSDP__VEC_GRAD, 1, b));
    return 0;
}

/* Sums of squares of this rank's gradient shards, split so replicas are counted once:
   [0] units sharded over everyone, [1] HYBRID units (counted in replica group 0),
   [2] NO_SHARD units (counted on rank 0). A gradient on disk gives the sum made when it was
   written. */
FSDP__PRIVATE int fsdp__local_sumsq(fsdp_ctx *ctx, double out[3]) {
    int ui, rc;
    out[0] = out[1] = out[2] = 0;
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        double *sum = &out[u->strategy == FSDP_HYBRID_SHARD ? 1 : u->group_size == 1 ? 2 : 0];
        if (u->grad) *sum += fsdp__sumsq(u->grad, (size_t)u->shard);
        else if (u->frozen || u->grad_zero) continue;
        else if ((rc = fsdp__grad_settle(ctx, u)) != 0) return rc;
        else *sum += u->grad_sumsq;
    }
    return 0;
}

/* The gradients' global L2 norm, the same bits on every rank: the ranks' sums of squares
   all-gathered over the world (the commit point of >>recovery) and added in rank order, into
   norm_sums made at fsdp_init, so that no rank can fail to allocate before the collective. */
FSDP__PRIVATE int fsdp__global_norm(fsdp_ctx *ctx, double *norm) {
    double mine[4], *all = ctx->norm_sums, total = 0;
    int r, rc, hybrid = ctx->desc.shard_group_size;
    if ((rc = fsdp__local_sumsq(ctx, mine)) != 0) return rc;
    mine[3] = 0;
    if (ctx->world > ctx->norm_ranks) /* a world only shrinks (recovery): a bug if it grew */
        return fsdp__fail(ctx, FSDP_ERR_STATE, "the gradient norm: the world has %d ranks, fsdp_init's had %d", ctx->world,
                          ctx->norm_ranks);
    rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_GATHER, mine, all, sizeof mine / 4, 0);
    if (!rc) { /* the same sum, in the same order, on every rank */
        for (r = 0; r < ctx->world; r++) total += all[4 * r];
        for (r = 0; r < hybrid && r < ctx->world; r++) total += all[4 * r + 1];
        total += all[2];
        *norm = sqrt(total);
    }
    return rc;
}

/* The f32 values of a span of a unit's shard for the optimizer: vec[FSDP__VEC_MASTER], [GRAD]
   and [STATE + k] point at the span's first element. */
typedef struct fsdp__span {
    float *vec[2 + FSDP_OPTIMIZER_MAX_STATE];
} fsdp__span;

/* Updates the count elements of a span (vec at its first) with learning rate lr and weight
   decay wd. */
FSDP__PRIVATE void fsdp__optimizer_range(fsdp_ctx *ctx, float *const *vec, int64_t count, float lr, float wd) {
    fsdp_optimizer_step step;
    int k;
    memset(&step, 0, sizeof step);
    step.param = vec[FSDP__VEC_MASTER];
    step.grad = vec[FSDP__VEC_GRAD];
    for (k = 0; k < ctx->num_state; k++) step.state[k] = vec[FSDP__VEC_STATE + k];
    step.count = (size_t)count;
    step.lr = lr;
    step.weight_decay = wd;
    step.step = ctx->upd_step;
    step.desc = &ctx->upd_opt;
    ctx->optimizer->update(&step);
}

/* One optimizer step on elements [a, b) of a unit's shard (span: f32 values from element a): in
   one sweep where every parameter takes the optimizer's settings, else parameter by parameter
   with its group's (frozen ones skipped). */
FSDP__PRIVATE void fsdp__optimizer_update(fsdp_ctx *ctx, fsdp__unit *u, int64_t a, int64_t b, const fsdp__span *span) {
    float *at[2 + FSDP_OPTIMIZER_MAX_STATE];
    int k, j;
    if (u->uniform_update) {
        fsdp__optimizer_range(ctx, span->vec, b - a, ctx->upd_opt.lr, ctx->upd_opt.weight_decay);
        return;
    }
    for (k = 0; k < u->num_params; k++) {
        int p = ctx->unit_params[u->first_param + k];
        const fsdp_param_info *info = &ctx->params[p];
        int64_t lo = fsdp__param_at(ctx, p), hi = lo + (info->shard_end - info->shard_begin);
        if (ctx->model->params[p].frozen || hi <= a || lo >= b) continue;
        if (lo < a) lo = a;
        if (hi > b) hi = b;
        for (j = 0; j < FSDP__VEC_STATE + ctx->num_state; j++) at[j] = span->vec[j] + (lo - a);
        fsdp__optimizer_range(ctx, at, hi - lo, ctx->upd_opt.lr * ctx->param_lr_scale[p], ctx->param_decay[p]);
    }
}


/* Zeroes what the flat layout does not use (alignment gaps, tail padding) in elements [a, b) of
   a unit's shard (values: element a). */
FSDP__PRIVATE void fsdp__zero_padding(fsdp_ctx *ctx, fsdp__unit *u, int64_t a, int64_t b, float *values) {
    int64_t begin = (int64_t)u->group_rank * u->shard, lo = begin + a, hi = begin + b, at = begin;
    int k;
    for (k = 0; k <= u->num_params; k++) { /* the gap before each parameter, then the tail */
        int p = k < u->num_params ? ctx->unit_params[u->first_param + k] : -1;
        int64_t off = p >= 0 ? ctx->plan.param_offset[p] : begin + u->shard, stop = p >= 0 ? off + ctx->model->params[p].numel : off;
        int64_t z0 = at > lo ? at : lo, z1 = off < hi ? off : hi;
        if (z1 > z0) memset(values + (z0 - lo), 0, sizeof(float) * (size_t)(z1 - z0));
        if (stop > at) at = stop;
    }
}

/* The streamed step: every trainable unit's shards (those on disk or in bf16) in chunks of
   stream_chunk elements through FSDP__STREAM_SLOTS slots: while chunk i is updated, the I/O
   thread reads chunk i + 1 ahead and writes chunk i - 1 behind. bf16 state is widened to f32 for
   the update and rounded back; gradients on disk are scaled by the clipping they still owe. */
#define FSDP__STREAM_SLOTS 3
#define FSDP__NUM_VECS (FSDP__VEC_STATE + FSDP_OPTIMIZER_MAX_STATE)

typedef struct fsdp__chunk {
    int unit;
    int64_t first, count;
} fsdp__chunk;

/* The chunk after c (c->unit < 0: the first); 0 when there is none (then and from then on). */
static int fsdp__next_chunk(const fsdp_ctx *ctx, fsdp__chunk *c) {
    if (c->unit >= ctx->num_units) return 0;
    if (c->unit >= 0 && c->first + c->count < ctx->units[c->unit].shard) {
        c->first += c->count;
    } else {
        do c->unit++;
        while (c->unit < ctx->num_units && (ctx->units[c->unit].frozen || ctx->units[c->unit].shard == 0));
        if (c->unit >= ctx->num_units) return 0;
        c->first = 0;
    }
    c->count = ctx->units[c->unit].shard - c->first < ctx->stream_chunk ? ctx->units[c->unit].shard - c->first
                                                                         : ctx->stream_chunk;
    return 1;
}

/* Which shards a streamed chunk moves (v < FSDP__VEC_STATE + num_state): whether they are on
   disk (raw blocks in the slot) and whether they are bf16 (widened into the slot's f32 part). */
static int fsdp__vec_on_disk(const fsdp_ctx *ctx, int v) {
    const fsdp_offload_desc *od = &ctx->desc.offload;
    return v == FSDP__VEC_MASTER ? od->params : v == FSDP__VEC_GRAD ? od->grads : od->optimizer;
}
static fsdp_dtype fsdp__vec_dtype(const fsdp_ctx *ctx, int v) { return v >= FSDP__VEC_STATE ? ctx->state_dtype : FSDP_F32; }

/* Bytes per element that a slot holds for shard v: raw (on disk), f32 (bf16). */
static size_t fsdp__slot_raw_bytes(const fsdp_ctx *ctx, int v) {
    return fsdp__vec_on_disk(ctx, v) ? fsdp_dtype_size(fsdp__vec_dtype(ctx, v)) : 0;
}
static size_t fsdp__slot_f32_bytes(const fsdp_ctx *ctx, int v) { return fsdp__vec_dtype(ctx, v) == FSDP_F32 ? 0 : 4; }

/* Slot s's buffer of shard v: its raw blocks, and its f32 values (a bf16 shard). */
static char *fsdp__slot_raw(const fsdp_ctx *ctx, int s, int v) {
    size_t at = 0;
    int w;
    for (w = 0; w < v; w++) at += fsdp__align((size_t)ctx->stream_chunk * fsdp__slot_raw_bytes(ctx, w), FSDP__IO_ALIGN);
    return (char *)ctx->stream_raw + (size_t)s * ctx->stream_raw_stride + at;
}
static float *fsdp__slot_f32(const fsdp_ctx *ctx, int s, int v) {
    size_t at = 0;
    int w;
    for (w = 0; w < v; w++) at += (size_t)ctx->stream_chunk * fsdp__slot_f32_bytes(ctx, w);
    return (float *)(void *)((char *)ctx->stream_f32 + (size_t)s * ctx->stream_f32_stride + at);
}

/* Queues the transfer of chunk c's shards on disk between the file and slot s (a gradient still
   zero is not read); the last ticket, 0 if none. */
static uint64_t fsdp__chunk_io(fsdp_ctx *ctx, const fsdp__chunk *c, int s, int write) {
    const fsdp__unit *u = &ctx->units[c->unit];
    uint64_t ticket = 0;
    int v;
    for (v = 0; v < FSDP__VEC_STATE + ctx->num_state; v++) {
        fsdp_dtype dtype;
        fsdp__home h = fsdp__vec_home(ctx, u, v, &dtype);
        size_t esize = fsdp_dtype_size(dtype);
        if (!fsdp__vec_on_disk(ctx, v) || (v == FSDP__VEC_GRAD && (write || u->upd_grad_zero))) continue; /* grads: read only */
        ticket = fsdp__io_submit(ctx->offload, write, h.offset + (int64_t)((size_t)c->first * esize), fsdp__slot_raw(ctx, s, v),
                                 fsdp__align((size_t)c->count * esize, FSDP__IO_ALIGN));
    }
    return ticket;
}

/* Updates chunk c, whose shards on disk are in slot s: the f32 values of every shard, the update,
   the padding of a master on disk zeroed, bf16 state rounded back. */
static void fsdp__chunk_update(fsdp_ctx *ctx, const fsdp__chunk *c, int s) {
    fsdp__unit *u = &ctx->units[c->unit];
    fsdp__span span;
    size_t n = (size_t)c->count;
    int v;
    for (v = 0; v < FSDP__VEC_STATE + ctx->num_state; v++) {
        fsdp_dtype dtype;
        fsdp__home h = fsdp__vec_home(ctx, u, v, &dtype);
        char *raw = fsdp__vec_on_disk(ctx, v) ? fsdp__slot_raw(ctx, s, v) : (char *)h.ram + (size_t)c->first * fsdp_dtype_size(dtype);
        span.vec[v] = dtype == FSDP_F32 ? (float *)(void *)raw : fsdp__slot_f32(ctx, s, v);
        if (dtype != FSDP_F32) fsdp__to_f32(span.vec[v], raw, dtype, n);
    }
    if (fsdp__vec_on_disk(ctx, FSDP__VEC_GRAD)) {
        size_t i;
        if (u->upd_grad_zero) memset(span.vec[FSDP__VEC_GRAD], 0, sizeof(float) * n);
        else if (u->upd_grad_scale != 1.0f)
            for (i = 0; i < n; i++) span.vec[FSDP__VEC_GRAD][i] *= u->upd_grad_scale;
    }
    fsdp__optimizer_update(ctx, u, c->first, c->first + c->count, &span);
    fsdp__zero_padding(ctx, u, c->first, c->first + c->count, span.vec[FSDP__VEC_MASTER]);
    for (v = FSDP__VEC_STATE; v < FSDP__VEC_STATE + ctx->num_state && ctx->state_dtype != FSDP_F32; v++)
        fsdp__from_f32(fsdp__vec_on_disk(ctx, v) ? (void *)fsdp__slot_raw(ctx, s, v)
                                                 : (void *)((char *)u->opt[v - FSDP__VEC_STATE].ram +
                                                            (size_t)c->first * fsdp_dtype_size(ctx->state_dtype)),
                       ctx->state_dtype, span.vec[v], n);
}

FSDP__PRIVATE int fsdp__step_streamed(fsdp_ctx *ctx) {
    fsdp__chunk chunk[FSDP__STREAM_SLOTS], c;
    uint64_t read_done[FSDP__STREAM_SLOTS] = {0}, write_done[FSDP__STREAM_SLOTS] = {0};
    int more[FSDP__STREAM_SLOTS] = {0}, i, rc = 0, disk = ctx->offload != NULL;
    c.unit = -1;
    c.first = c.count = 0;
    for (i = 0; i < FSDP__STREAM_SLOTS - 1; i++) /* read ahead the first chunks */
        if ((more[i] = fsdp__next_chunk(ctx, &c)) != 0) {
            chunk[i] = c;
            if (disk) read_done[i] = fsdp__chunk_io(ctx, &chunk[i], i, 0);
        }
    for (i = 0; more[i % FSDP__STREAM_SLOTS] && !rc; i++) {
        int s = i % FSDP__STREAM_SLOTS, ahead = (i + FSDP__STREAM_SLOTS - 1) % FSDP__STREAM_SLOTS;
        if (disk && read_done[s] && (rc = fsdp__io_wait(ctx->offload, read_done[s])) != 0) break;
        FSDP__CHAOS(FSDP__CHAOS_THREAD);
        fsdp__chunk_update(ctx, &chunk[s], s);
        if (disk) write_done[s] = fsdp__chunk_io(ctx, &chunk[s], s, 1);
        if (chunk[s].first + chunk[s].count == ctx->units[chunk[s].unit].shard) /* its last chunk: written (or queued) */
            fsdp__unit_updated(ctx, &ctx->units[chunk[s].unit]);
        /* the slot the next read-ahead fills held chunk i - 1: its write must be done */
        if (disk && write_done[ahead] && (rc = fsdp__io_wait(ctx->offload, write_done[ahead])) != 0) break;
        write_done[ahead] = 0;
        if ((more[ahead] = fsdp__next_chunk(ctx, &c)) != 0) {
            chunk[ahead] = c;
            read_done[ahead] = disk ? fsdp__chunk_io(ctx, &chunk[ahead], ahead, 0) : 0;
        }
    }
    if (disk && !rc) rc = fsdp__io_wait(ctx->offload, 0);
    if (disk && rc) fsdp__io_wait(ctx->offload, 0); /* never leave the I/O thread on the slots */
    return rc;
}

/* --- the step in the background -----------------------------------------------------------
   With offload, fsdp_step hands the update to the step thread and returns: the next forward
   overlaps it. Unit by unit, in the order the step streams them (the order of the units, which
   is the forward's), step_done says the unit's shards hold the new values (its writes queued
   on the I/O thread, which runs requests in order: a later read sees them). A gather, a unit's
   hooks and fsdp_zero_grad wait for their unit only; whatever reads the shards otherwise
   (fsdp_step, clipping, checkpoints, fsdp_gather_param, fsdp_set_param_*, fsdp_synchronize)
   waits for the whole step. A failure fails the comm at once (its peers learn it in their next
   collective) and every later wait. */

/* A unit's update is complete: a deferred fsdp_zero_grad applies now. Either thread. */
FSDP__PRIVATE void fsdp__zero_unit_grad(fsdp__unit *u) {
    if (u->grad) memset(u->grad, 0, sizeof(float) * (size_t)u->shard);
    u->grad_zero = 1; /* on disk: nothing to write */
    u->grad_sumsq = 0;
    u->grad_scale = 1.0f;
}
FSDP__PRIVATE void fsdp__unit_updated(fsdp_ctx *ctx, fsdp__unit *u) {
    if (!ctx->step_thread_started) return;
    FSDP__CHAOS(FSDP__CHAOS_THREAD);
    pthread_mutex_lock(&ctx->step_lock);
    if (u->zero_pending) fsdp__zero_unit_grad(u);
    u->zero_pending = 0;
    __atomic_store_n(&u->step_done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&ctx->step_cond);
    pthread_mutex_unlock(&ctx->step_lock);
}

static void *fsdp__step_main(void *arg) {
    fsdp_ctx *ctx = (fsdp_ctx *)arg;
    fsdp__trace_thread = FSDP__TID_STEP;
    pthread_mutex_lock(&ctx->step_lock);
    for (;;) {
        int rc, ui;
        double t0;
        while (!ctx->step_pending && !ctx->step_stop) pthread_cond_wait(&ctx->step_cond, &ctx->step_lock);
        if (!ctx->step_pending) break;
        pthread_mutex_unlock(&ctx->step_lock);
        FSDP__CHAOS(FSDP__CHAOS_THREAD);
        t0 = ctx->trace ? fsdp_now() : 0;
        rc = fsdp__step_streamed(ctx);
        fsdp__trace_update(ctx, ctx->upd_step + 1, t0);
        pthread_mutex_lock(&ctx->step_lock);
        if (rc && !ctx->step_rc) {
            ctx->step_rc = rc; /* first: a collective that fails for it then reports this cause */
            fsdp__copy_string(ctx->step_error, sizeof ctx->step_error, ctx->offload->message);
            pthread_mutex_unlock(&ctx->step_lock);
            fsdp_comm_fail(ctx->comm, rc, "rank %d: %s", ctx->rank, ctx->step_error); /* peers must not wait on it */
            pthread_mutex_lock(&ctx->step_lock);
        }
        for (ui = 0; ui < ctx->num_units; ui++) { /* (after a failure: released, to fail) */
            if (ctx->units[ui].zero_pending) fsdp__zero_unit_grad(&ctx->units[ui]);
            ctx->units[ui].zero_pending = 0;
            __atomic_store_n(&ctx->units[ui].step_done, 1, __ATOMIC_RELEASE);
        }
        ctx->step_pending = 0;
        pthread_cond_broadcast(&ctx->step_cond);
    }
    pthread_mutex_unlock(&ctx->step_lock);
    return NULL;
}

/* The step's failure, reported on the calling (compute) thread. */
FSDP__PRIVATE int fsdp__step_failed(fsdp_ctx *ctx, int rc) {
    return fsdp__fail(ctx, rc, "the optimizer step in the background failed: %s", ctx->step_error);
}

/* Waits until unit u holds the step's new values (comm thread: rc only; compute thread: fails the
   context). */
FSDP__PRIVATE int fsdp__step_wait_unit(fsdp_ctx *ctx, fsdp__unit *u, int compute_thread) {
    int rc;
    double t0;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    if (!ctx->step_thread_started || __atomic_load_n(&u->step_done, __ATOMIC_ACQUIRE)) return 0;
    t0 = ctx->trace ? fsdp_now() : 0;
    pthread_mutex_lock(&ctx->step_lock);
    while (!u->step_done) pthread_cond_wait(&ctx->step_cond, &ctx->step_lock);
    rc = ctx->step_rc;
    pthread_mutex_unlock(&ctx->step_lock);
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    fsdp__trace_wait(ctx, "wait step", "step", (int)(u - ctx->units), t0);
    return rc && compute_thread ? fsdp__step_failed(ctx, rc) : rc;
}

/* Waits for the whole step (compute thread). */
FSDP__PRIVATE int fsdp__step_drain(fsdp_ctx *ctx) {
    int rc;
    double t0 = 0;
    if (!ctx->step_thread_started) return 0;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    pthread_mutex_lock(&ctx->step_lock);
    if (ctx->step_pending && ctx->trace) t0 = fsdp_now();
    while (ctx->step_pending) pthread_cond_wait(&ctx->step_cond, &ctx->step_lock);
    rc = ctx->step_rc;
    pthread_mutex_unlock(&ctx->step_lock);
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    fsdp__trace_wait(ctx, "wait step", "step", -1, t0);
    return rc ? fsdp__step_failed(ctx, rc) : 0;
}

/* Applies the update: on the step thread where there is one (the units it streams marked not yet
   updated), else here. The gradients' flags and the optimizer's settings as they are now. */
FSDP__PRIVATE int fsdp__step_launch(fsdp_ctx *ctx) {
    int ui, rc;
    ctx->upd_opt = ctx->opt;
    ctx->upd_step = ctx->step;
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        u->upd_grad_zero = u->grad_zero;
        u->upd_grad_scale = u->grad_scale;
    }
    if (!ctx->step_thread_started) {
        double t0;
        if (!ctx->stream_chunk) return 0; /* in place, by fsdp_step */
        t0 = fsdp__trace_begin(ctx);
        rc = fsdp__step_streamed(ctx);
        fsdp__trace_update(ctx, ctx->step + 1, t0);
        return rc ? fsdp__offload_failed(ctx, rc) : 0;
    }
    pthread_mutex_lock(&ctx->step_lock);
    for (ui = 0; ui < ctx->num_units; ui++)
        if (!ctx->units[ui].frozen && ctx->units[ui].shard > 0) ctx->units[ui].step_done = 0;
    ctx->step_pending = 1;
    pthread_cond_broadcast(&ctx->step_cond);
    pthread_mutex_unlock(&ctx->step_lock);
    return 0;
}


FSDP__PRIVATE int fsdp__finish(fsdp_ctx *ctx) {
    int rc;
    if (ctx->no_sync)
        for (rc = 0; rc < ctx->num_units; rc++)
            if (ctx->units[rc].grad_full_pending)
                return fsdp__fail(ctx, FSDP_ERR_STATE, "unit '%s' holds no_sync gradients that were never reduced: turn "
                                  "no_sync off before the last micro-step's backward", fsdp__unit_name(ctx, rc));
    if ((rc = fsdp__wait_task(ctx, 0)) != 0 || (rc = fsdp__step_drain(ctx)) != 0) return rc;
    return fsdp__end_iteration(ctx);
}

FSDP_API int fsdp_finish_backward(fsdp_ctx *ctx) {
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    return fsdp__finish(ctx);
}

/* The clipping (and unscaling) of this rank's reduced gradients by the global norm `total` of
   the gradients as they are (scaled): fsdp_clip_grad_norm's, and a survivor's that catches up
   with the norm the ranks past the commit point computed (>>recovery). */
FSDP__PRIVATE void fsdp__clip_by(fsdp_ctx *ctx, double total, float max_norm, double *norm) {
    int ui, unscale;
    float coef = 1.0f;
    ctx->commit_norm = total;
    unscale = ctx->desc.loss_scale.enabled && !ctx->grads_unscaled;
    if (unscale) total /= ctx->loss_scale; /* the norm of the unscaled gradients */
    if (norm) *norm = total;
    if (!isfinite(total)) return; /* fsdp_step skips: the gradients are not used */
    if (max_norm > 0) { /* torch.nn.utils.clip_grad_norm_ */
        coef = (float)(max_norm / (total + 1e-6));
        if (coef > 1.0f) coef = 1.0f;
    }
    if (unscale) { /* GradScaler.unscale_ then the clip, in one pass: a power-of-two scale makes the
                      product exact, so the bits are those of the two multiplications */
        coef *= 1.0f / ctx->loss_scale;
        ctx->grads_unscaled = 1;
    }
    if (max_norm > 0 || unscale) {
        for (ui = 0; ui < ctx->num_units; ui++) {
            fsdp__unit *u = &ctx->units[ui];
            int64_t i;
            for (i = 0; u->grad && i < u->shard; i++) u->grad[i] *= coef;
            if (!u->grad && !u->grad_zero) u->grad_scale = coef; /* on disk: owed (fsdp__global_norm settled any earlier) */
        }
    }
}

FSDP_API int fsdp_clip_grad_norm(fsdp_ctx *ctx, float max_norm, double *norm) {
    int rc;
    double total = 0, t0;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__wait_task(ctx, 0)) != 0 || (rc = fsdp__step_drain(ctx)) != 0) return rc;
    t0 = fsdp__trace_begin(ctx);
    rc = fsdp__global_norm(ctx, &total);
    fsdp__trace_end(ctx, "step", "clip_grad_norm", -1, t0);
    if (rc) return rc;
    fsdp__clip_by(ctx, total, max_norm, norm);
    return 0;
}

/* A loss scale fsdp.h works with: a finite normal float > 0, so that 1 / scale (the unscaling
   factor, a float) is finite too; a subnormal scale made it infinite, and the weights -inf. */
FSDP__PRIVATE int fsdp__loss_scale_ok(double scale) { return scale > 0 && isnormal((float)scale); }

/* GradScaler.update after a step: a non-finite gradient backs the scale off and restarts the
   count; growth_interval finite steps in a row grow it. The same on every rank (the norm is). */
FSDP__PRIVATE void fsdp__loss_scale_update(fsdp_ctx *ctx, int finite) {
    const fsdp_loss_scale_desc *ls = &ctx->desc.loss_scale;
    ctx->grads_unscaled = 0;
    if (!ls->enabled) return;
    if (!finite) {
        float backed_off = ctx->loss_scale * ls->backoff_factor;
        if (fsdp__loss_scale_ok(backed_off)) ctx->loss_scale = backed_off; /* never subnormal, nor 0 */
        ctx->scale_growth_tracker = 0;
    } else if (++ctx->scale_growth_tracker >= ls->growth_interval) {
        float grown = ctx->loss_scale * ls->growth_factor;
        if (isfinite(grown)) ctx->loss_scale = grown; /* as torch: never to infinity */
        ctx->scale_growth_tracker = 0;
    }
}

/* The update from this rank's gradients, reduced and clipped: a step taken. */
FSDP__PRIVATE int fsdp__step_apply(fsdp_ctx *ctx, fsdp_step_report *report) {
    int rc, ui;
    double t0;
    if ((rc = fsdp__step_launch(ctx)) != 0) return rc;
    t0 = ctx->stream_chunk ? 0 : fsdp__trace_begin(ctx);
    for (ui = 0; ui < ctx->num_units && !ctx->stream_chunk; ui++) { /* in place (streamed: done above or behind) */
        fsdp__unit *u = &ctx->units[ui];
        fsdp__span span;
        int k;
        if (u->frozen) continue;
        span.vec[FSDP__VEC_MASTER] = u->master;
        span.vec[FSDP__VEC_GRAD] = u->grad;
        for (k = 0; k < ctx->num_state; k++) span.vec[FSDP__VEC_STATE + k] = fsdp__home_f32(ctx, &u->opt[k]);
        fsdp__optimizer_update(ctx, u, 0, u->shard, &span);
        fsdp__zero_padding(ctx, u, 0, u->shard, u->master);
    }
    fsdp__trace_update(ctx, ctx->step + 1, t0);
    ctx->step++;
    ctx->reductions_done = 0;
    fsdp__loss_scale_update(ctx, 1);
    if (report) report->step = ctx->step;
    return 0;
}

FSDP__PRIVATE int fsdp__step(fsdp_ctx *ctx, float max_norm, fsdp_step_report *report) {
    int rc;
    double norm = 0;
    if ((rc = fsdp__finish(ctx)) != 0) return rc;
    if (!ctx->grads_since_step) { /* as torch.optim, which skips parameters whose grad is None */
        rc = fsdp__fail(ctx, FSDP_ERR_STATE, "fsdp_step: no backward ran since the last fsdp_step (or fsdp_zero_grad, "
                        "or fsdp_init): nothing applied (end a forward-only pass with fsdp_finish_backward)");
        fsdp__misused(ctx);
        return rc;
    }
    ctx->grads_since_step = 0;
    ctx->reductions_done = 1; /* (the commit point's input: >>recovery) */
    if (report) report->loss_scale = ctx->loss_scale;
    if ((rc = fsdp_clip_grad_norm(ctx, max_norm, &norm)) != 0) return rc;
    if (report) report->grad_norm = norm;
    if (!isfinite(norm)) { /* every rank sees the same norm, so every rank skips */
        if (ctx->desc.loss_scale.enabled) /* expected now and then: the scale finds its level */
            fsdp__log(&ctx->logger, FSDP_LOG_INFO, "rank %d: gradient norm is %f at loss scale %g: step %lld skipped, "
                      "scale %g from now", ctx->rank, norm, (double)ctx->loss_scale, (long long)ctx->step,
                      (double)(ctx->loss_scale * ctx->desc.loss_scale.backoff_factor));
        else
            fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: gradient norm is %f: step %lld skipped", ctx->rank, norm,
                      (long long)ctx->step);
        fsdp__loss_scale_update(ctx, 0);
        ctx->reductions_done = 0;
        if (report) { report->skipped = 1; report->step = ctx->step; }
        return 0;
    }
    return fsdp__step_apply(ctx, report);
}

/* The report's bytes: the comm's counters since the last step. */
FSDP__PRIVATE void fsdp__step_sent(fsdp_ctx *ctx, fsdp_step_report *report) {
    fsdp_comm_stats now;
    fsdp_comm_stats_get(ctx->comm, &now);
    report->bytes_sent_host = now.bytes_sent_host - ctx->sent_before.bytes_sent_host;
    report->bytes_sent_net = now.bytes_sent_net - ctx->sent_before.bytes_sent_net;
    ctx->sent_before = now;
}

FSDP__PRIVATE int fsdp__recover(fsdp_ctx *ctx, float max_norm, fsdp_step_report *report, int rc); /* (>>recovery) */

FSDP_API int fsdp_step(fsdp_ctx *ctx, float max_norm, fsdp_step_report *report) {
    fsdp_step_report mine;
    int rc;
    if (!report) report = &mine; /* (the iteration's trace event reads it) */
    memset(report, 0, sizeof *report);
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    rc = ctx->loss_rc ? ctx->loss_rc : fsdp__step(ctx, max_norm, report);
    if (rc && ctx->recovery) rc = fsdp__recover(ctx, max_norm, report, rc);
    if (ctx->recovery) report->epoch = ctx->recovery->now.epoch;
    fsdp_replicas(ctx, &report->replicas, NULL);
    if (!rc) fsdp__step_sent(ctx, report);
    if (!rc && ctx->async_save) rc = fsdp__async_poll(ctx, 0); /* commits a save whose files are all written */
    if (!rc && ctx->trace) fsdp__trace_iteration(ctx, report);
    return rc;
}

FSDP_API float fsdp_loss_scale(const fsdp_ctx *ctx) { return ctx ? ctx->loss_scale : 1.0f; }

FSDP_API int fsdp_zero_grad(fsdp_ctx *ctx) {
    int ui, rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__wait_task(ctx, 0)) != 0) return rc;
    ctx->grads_unscaled = 0;
    ctx->grads_since_step = 0; /* (torch's zero_grad sets them to None: a step then changes nothing) */
    if (ctx->step_thread_started) pthread_mutex_lock(&ctx->step_lock);
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        if (ctx->step_thread_started && !u->step_done) u->zero_pending = 1; /* the step still reads it: zeroed after */
        else fsdp__zero_unit_grad(u);
        if (u->grad_full_pending && u->grad_full) memset(u->grad_full, 0, sizeof(float) * (size_t)u->padded);
    }
    if (ctx->step_thread_started) pthread_mutex_unlock(&ctx->step_lock);
    return 0;
}

/* --- after a lost replica (>>recovery): the survivors' runtime -------------------------------- */
/* Stops everything in flight on this rank: every communicator of the context aborted (so that
   its ops here and, through them, on every other rank fail at once, and every survivor enters
   the agreement, also those whose own ops were fine), then the comm thread left to drain every
   task issued (each fails fast), within the bound fsdp__wait_task_for keeps. 0, or
   FSDP_ERR_TIMEOUT if a task did not end (a backend that ignores its timeout). */
FSDP__PRIVATE int fsdp__recovery_quiesce(fsdp_ctx *ctx, const char *why) {
    fsdp_comm *comms[4];
    double limit;
    int c, drained;
    comms[0] = ctx->comm;
    comms[1] = ctx->hybrid_shard_comm;
    comms[2] = ctx->hybrid_replica_comm;
    comms[3] = ctx->host_comm != ctx->hybrid_shard_comm ? ctx->host_comm : NULL;
    for (c = 0; c < 4; c++)
        if (comms[c]) fsdp_comm_fail(comms[c], FSDP_ERR_ABORTED, "rank %d: %s", ctx->rank, why);
    pthread_mutex_lock(&ctx->lock);
    limit = fsdp_now() + (double)(ctx->issued - ctx->completed + 1) * 4.0 * fsdp_comm_timeout(ctx->comm) / 1000.0 + 2.0;
    while ((ctx->completed < ctx->issued || ctx->running) && fsdp_now() < limit) {
        struct timespec ts;
        if (!ctx->running && ctx->queue_len > 0) pthread_cond_signal(&ctx->wake);
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&ctx->done, &ctx->lock, &ts);
    }
    drained = ctx->completed == ctx->issued && !ctx->running;
    pthread_mutex_unlock(&ctx->lock);
    return drained ? 0 : fsdp__fail(ctx, FSDP_ERR_TIMEOUT, "recovery: the comm thread did not drain its tasks");
}

/* After fsdp__recovery_quiesce, on a survivor one step behind (it failed inside the commit
   point, holding the step's reduced gradient, while another survivor passed it): the step those
   ahead applied, applied here from the same gradient (the fold is the same everywhere) with the
   clipping of their global norm `total` (scaled, as fsdp__global_norm gave it them) and this
   rank's max_norm (fsdp_step's, the same on every rank), so that its bits equal theirs. Before
   fsdp__recovery_reset. */
FSDP__PRIVATE int fsdp__recovery_catch_up(fsdp_ctx *ctx, double total, float max_norm) {
    double norm = 0;
    if (!ctx->reductions_done || ctx->stream_chunk)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "recovery: rank %d cannot apply step %lld after the others: %s", ctx->rank,
                          (long long)ctx->step + 1, ctx->stream_chunk ? "its update streams (offload or bf16 state)"
                                                                        : "it does not hold the step's reduced gradient");
    fsdp__clip_by(ctx, total, max_norm, &norm);
    if (!isfinite(norm)) /* (those ahead then skipped it: they are not ahead) */
        return fsdp__fail(ctx, FSDP_ERR_PROTOCOL, "recovery: rank %d is to apply step %lld of norm %f", ctx->rank,
                          (long long)ctx->step + 1, norm);
    return fsdp__step_apply(ctx, NULL);
}

/* After fsdp__recovery_quiesce: the iteration in flight undone on this rank, as if it had not
   begun (the step-in-flight rule's "applied nowhere"): every unit sharded, its buffers returned,
   gradients zero, the failure forgotten. The step count and the optimizer state are untouched. */
FSDP__PRIVATE void fsdp__recovery_reset(fsdp_ctx *ctx) {
    int ui;
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        fsdp__reshard(ctx, u);
        fsdp__drop_host_shard(ctx, u);
        if (u->grad_full && u->grad_full != u->grad)
            fsdp__buf_put(ctx, u->grad_full, (size_t)u->padded * sizeof(float));
        u->grad_full = NULL;
        u->grad_full_pending = u->refcount = u->recompute = u->recomputing = 0;
        u->forward_done = u->backward_started = u->backward_done = 0;
        u->gather_task = 0;
        fsdp__zero_unit_grad(u);
    }
    if (!ctx->fwd_known) ctx->fwd_len = 0; /* (recorded again by the next iteration) */
    if (!ctx->bwd_known) ctx->bwd_len = 0;
    ctx->phase = 0;
    ctx->older_reduce = ctx->newer_reduce = 0;
    ctx->grads_unscaled = ctx->hook_failed = ctx->reductions_done = 0;
    pthread_mutex_lock(&ctx->lock);
    ctx->worker_error = 0;
    ctx->error[0] = 0;
    pthread_mutex_unlock(&ctx->lock);
}

/* Continues on the survivors' communicators: world (the caller keeps it, as desc.comm), and the
   shard comm of this rank's group and the replica comm across the groups (NULL: one replica
   left), which the context takes over, destroying its old ones. Master shards the old shard comm
   shared are moved into memory of the new one (fsdp_comm_alloc: collective over shard). Every
   unit must be HYBRID_SHARD with shard groups of the size they had (the recovery checks). On
   failure nothing changed: the caller still owns shard and replica. */
FSDP__PRIVATE int fsdp__recovery_adopt(fsdp_ctx *ctx, fsdp_comm *world, fsdp_comm *shard, fsdp_comm *replica) {
    size_t total = 0, at = 0;
    void *mem = NULL;
    int ui, rc;
    if (fsdp_comm_size(shard) != ctx->desc.shard_group_size || ctx->master_mem[0] || ctx->step_thread_started)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "recovery: cannot adopt a shard comm of %d ranks (the groups have %d)",
                          fsdp_comm_size(shard), ctx->desc.shard_group_size);
    if (ctx->host_comm) /* (its host communicator spans the old world) */
        return fsdp__fail(ctx, FSDP_ERR_UNSUPPORTED, "recovery: units kept on their host after forward "
                          "(reshard_after_forward HOST) cannot continue on a new world");
    for (ui = 0; ui < ctx->num_units; ui++)
        if (ctx->units[ui].master_shared) total += fsdp__align((size_t)ctx->units[ui].shard, 16);
    if (total && (rc = fsdp_comm_alloc(shard, total * sizeof(float), &mem)) != 0)
        return fsdp__fail(ctx, rc, "recovery: no memory for the master shards: %s", fsdp_comm_last_error(shard));
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        if (u->master_shared) {
            memcpy((float *)mem + at, u->master, sizeof(float) * (size_t)u->shard);
            u->master = (float *)mem + at;
            at += fsdp__align((size_t)u->shard, 16);
        }
        u->shard_comm = fsdp_comm_size(world) > 1 ? shard : world;
        u->replica_comm = replica;
    }
    fsdp_comm_free(ctx->hybrid_shard_comm, ctx->master_mem[1]);
    fsdp_comm_destroy(ctx->hybrid_shard_comm);
    fsdp_comm_destroy(ctx->hybrid_replica_comm);
    ctx->master_mem[1] = mem;
    ctx->hybrid_shard_comm = shard;
    ctx->hybrid_replica_comm = replica;
    ctx->comm = world;
    memset(&ctx->sent_before, 0, sizeof ctx->sent_before); /* the step report counts on world from its start */
    ctx->rank = fsdp_comm_rank(world);
    ctx->world = fsdp_comm_size(world);
    return 0;
}

FSDP__PRIVATE int fsdp__init_fail_ctx(fsdp_ctx *ctx, int code, const char *fmt, ...) FSDP__PRINTF(3, 4);

/* At fsdp_init with recovery (collective over the world, healthy): a recovery listener on this
   rank's address, every rank's gathered (a rank that could not open one says so in the gather,
   so every rank fails alike, naming it), and the links to other hosts watched (detect_ms). */
FSDP__PRIVATE int fsdp__recovery_open(fsdp_ctx *ctx) {
    fsdp__recovery *rec;
    struct sockaddr_in at;
    socklen_t len = sizeof at;
    int32_t mine[2] = {0, 0}, *all;
    int r, rc, G = ctx->desc.shard_group_size, missing = -1;
    if (!ctx->desc.recovery.enabled) return 0;
    if (ctx->host_comm || ctx->stream_chunk)
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_UNSUPPORTED, "fsdp_init: recovery cannot continue %s on a new world "
                                   "yet: turn recovery off or that off", ctx->host_comm ? "units kept on their host after "
                                   "forward (reshard_after_forward HOST)" : "an update that streams (offload, bf16 state)");
    if (!(rec = (fsdp__recovery *)fsdp__calloc(sizeof *rec)) ||
        !(rec->addr = (struct sockaddr_in *)fsdp__calloc(sizeof *rec->addr * (size_t)ctx->world)) ||
        !(rec->now.replicas = (int *)fsdp__calloc(sizeof(int) * (size_t)(ctx->world / G))) ||
        !(all = (int32_t *)FSDP_MALLOC(sizeof mine * (size_t)ctx->world))) {
        if (rec) FSDP_FREE(rec->addr);
        FSDP_FREE(rec);
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: out of memory");
    }
    ctx->recovery = rec;
    rec->listen_fd = -1;
    rec->first_rank = ctx->rank, rec->replica = ctx->rank / G, rec->group = G, rec->world0 = ctx->world;
    rec->now.count = rec->now.total = ctx->world / G;
    for (r = 0; r < rec->now.count; r++) rec->now.replicas[r] = r;
    fsdp__copy_string(rec->job, sizeof rec->job, ctx->comm->job);
    if (fsdp__comm_local_addr(ctx->comm, &at) == 0 && (rec->listen_fd = fsdp__sock_listen(&at, 64)) >= 0 &&
        getsockname(rec->listen_fd, (struct sockaddr *)&at, &len) == 0)
        mine[0] = (int32_t)at.sin_addr.s_addr, mine[1] = ntohs(at.sin_port);
    rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_GATHER, mine, all, 2, 0);
    for (r = 0; !rc && r < ctx->world; r++) {
        rec->addr[r].sin_family = AF_INET;
        rec->addr[r].sin_addr.s_addr = (uint32_t)all[2 * r];
        rec->addr[r].sin_port = htons((uint16_t)all[2 * r + 1]);
        if (!all[2 * r + 1] && missing < 0) missing = r;
    }
    FSDP_FREE(all);
    if (!rc && (fsdp__comm_watch(ctx->comm, ctx->desc.recovery.detect_ms) != 0 ||
                (ctx->hybrid_replica_comm && fsdp__comm_watch(ctx->hybrid_replica_comm, ctx->desc.recovery.detect_ms))))
        rc = FSDP_ERR_SYSTEM;
    if (!rc && missing >= 0)
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_SYSTEM, "fsdp_init: recovery: rank %d could not open its recovery "
                                   "listener", missing);
    if (rc)
        return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: recovery: rank %d: %s", ctx->rank,
                                   rc == FSDP_ERR_SYSTEM ? strerror(errno) : fsdp_comm_last_error(ctx->comm));
    return 0;
}

/* fsdp_destroy's, after the context's communicators: the listener, and the world recovery made. */
FSDP__PRIVATE void fsdp__recovery_close(fsdp_ctx *ctx) {
    fsdp__recovery *rec = ctx->recovery;
    if (!rec) return;
    if (rec->listen_fd >= 0) close(rec->listen_fd);
    fsdp_comm_destroy(rec->world);
    FSDP_FREE(rec->addr);
    FSDP_FREE(rec->now.replicas);
    FSDP_FREE(rec);
    ctx->recovery = NULL;
}

/* This survivor's view (after fsdp__recovery_quiesce): where it is, and which replicas it still
   reaches as its comms saw them (the peer an op saw lost: its replica is not reached). */
FSDP__PRIVATE void fsdp__recovery_view_of(fsdp_ctx *ctx, fsdp__recovery_msg *m) {
    fsdp__recovery *rec = ctx->recovery;
    int k, lost;
    memset(m, 0, sizeof *m);
    m->magic = FSDP__RECOVERY_MAGIC;
    m->rank = rec->first_rank, m->replica = rec->replica, m->reductions_done = ctx->reductions_done;
    m->epoch = rec->now.epoch, m->step = ctx->step, m->norm = ctx->commit_norm;
    for (k = 0; k < rec->now.count; k++) m->reach[rec->now.replicas[k]] = 1;
    if ((lost = fsdp__load(&ctx->comm->lost_peer)) > 0 && (lost - 1) / rec->group < rec->now.count)
        m->reach[rec->now.replicas[(lost - 1) / rec->group]] = 0;
    if (ctx->hybrid_replica_comm && (lost = fsdp__load(&ctx->hybrid_replica_comm->lost_peer)) > 0 &&
        lost - 1 < rec->now.count)
        m->reach[rec->now.replicas[lost - 1]] = 0;
    m->reach[rec->replica] = 1;
    fsdp__recovery_mac(ctx->comm->key, m, offsetof(fsdp__recovery_msg, mac), m->mac);
}

/* A view read from fd before the deadline, of this epoch's world (its MAC): 1, else 0. */
FSDP__PRIVATE int fsdp__recovery_read_view(fsdp_ctx *ctx, int fd, fsdp__recovery_msg *m, int64_t deadline) {
    unsigned char mac[32];
    if (fsdp__sock_io_full(fd, m, sizeof *m, deadline, 0) != 0 || m->magic != FSDP__RECOVERY_MAGIC) return 0;
    fsdp__recovery_mac(ctx->comm->key, m, offsetof(fsdp__recovery_msg, mac), mac);
    return fsdp__equal_ct(mac, m->mac, 32) && m->rank >= 0 && m->rank < ctx->recovery->world0 &&
           m->replica == m->rank / ctx->recovery->group;
}

/* The rendezvous collects: views for up to detect_ms, or until every rank of the replicas it
   reaches sent one (msgs[0] is its own); their connections in fds. The number of views. */
FSDP__PRIVATE int fsdp__recovery_collect(fsdp_ctx *ctx, fsdp__recovery_msg *msgs, int *fds) {
    fsdp__recovery *rec = ctx->recovery;
    int64_t deadline = fsdp__now_ms() + ctx->desc.recovery.detect_ms;
    int n = 1, expected = 0, k, i;
    for (k = 0; k < rec->now.count; k++) expected += msgs[0].reach[rec->now.replicas[k]] ? rec->group : 0;
    while (n < expected && fsdp__now_ms() < deadline) {
        struct pollfd pfd;
        int64_t left = deadline - fsdp__now_ms();
        int fd, dup = 0;
        pfd.fd = rec->listen_fd, pfd.events = POLLIN, pfd.revents = 0;
        if (poll(&pfd, 1, left > 100 ? 100 : (int)(left > 0 ? left : 0)) <= 0) continue;
        if ((fd = accept(rec->listen_fd, NULL, NULL)) < 0) continue;
        if (!fsdp__recovery_read_view(ctx, fd, &msgs[n], deadline + 1000)) { /* (a view comes at once) */
            close(fd);
            continue;
        }
        for (i = 0; i < n; i++) dup |= msgs[i].rank == msgs[n].rank;
        if (dup) close(fd);
        else fds[n++] = fd;
    }
    return n;
}

/* The rendezvous: views collected, the agreement (fsdp__recovery_decide), and the verdict sent
   to every survivor heard (a new world's listener opened for them when they go on: *world_fd). */
FSDP__PRIVATE void fsdp__recovery_lead(fsdp_ctx *ctx, const fsdp__recovery_msg *mine, fsdp__recovery_verdict *v,
                                       int *world_fd) {
    fsdp__recovery *rec = ctx->recovery;
    fsdp__recovery_msg *msgs = (fsdp__recovery_msg *)fsdp__calloc(sizeof *msgs * (size_t)rec->world0);
    fsdp__recovery_view *views = (fsdp__recovery_view *)fsdp__calloc(sizeof *views * (size_t)rec->world0);
    int *fds = (int *)fsdp__calloc(sizeof(int) * (size_t)rec->world0), n = 0, i, ahead = 0;
    fsdp__membership next;
    int64_t target = 0;
    memset(v, 0, sizeof *v);
    memset(&next, 0, sizeof next);
    v->magic = FSDP__RECOVERY_MAGIC;
    next.replicas = v->replicas;
    if (!msgs || !views || !fds) v->rc = FSDP_ERR_OUT_OF_MEMORY;
    else msgs[0] = *mine, n = fsdp__recovery_collect(ctx, msgs, fds);
    for (i = 0; i < n; i++) {
        views[i].epoch = msgs[i].epoch, views[i].rank = msgs[i].rank, views[i].replica = msgs[i].replica;
        views[i].step = msgs[i].step, views[i].reductions_done = msgs[i].reductions_done, views[i].reach = msgs[i].reach;
        if (msgs[i].step > msgs[ahead].step) ahead = i;
    }
    if (!v->rc)
        v->rc = fsdp__recovery_decide(&rec->now, rec->group, ctx->desc.recovery.min_replicas, views, n, &next, &target,
                                      v->why, sizeof v->why);
    v->epoch = next.epoch, v->target_step = target, v->count = next.count, v->norm = n ? msgs[ahead].norm : 0;
    if (!v->rc) {
        struct sockaddr_in at = rec->addr[rec->first_rank];
        socklen_t len = sizeof at;
        at.sin_port = 0;
        if ((*world_fd = fsdp__sock_listen(&at, 64)) < 0 || getsockname(*world_fd, (struct sockaddr *)&at, &len) != 0)
            v->rc = FSDP_ERR_SYSTEM, fsdp__fmt(v->why, sizeof v->why, "recovery: the rendezvous (rank %d) could not "
                                               "listen for the new world: %s", rec->first_rank, strerror(errno));
        v->port = ntohs(at.sin_port);
    }
    fsdp__recovery_mac(ctx->comm->key, v, offsetof(fsdp__recovery_verdict, mac), v->mac);
    for (i = 1; i < n; i++) { /* (a survivor that went meanwhile: its replica is then missed in the new world) */
        fsdp__sock_io_full(fds[i], v, sizeof *v, fsdp__now_ms() + ctx->desc.recovery.detect_ms, 1);
        close(fds[i]);
    }
    FSDP_FREE(msgs);
    FSDP_FREE(views);
    FSDP_FREE(fds);
}

/* A survivor asks the rendezvous `leader` (a rank as at fsdp_init): its view sent, the verdict
   read and checked. 0, or -1 where the leader could not be reached or did not answer. The wait
   covers the leader's own search (a rendezvous below it that vanished: detect_ms) and its
   collection (detect_ms). */
FSDP__PRIVATE int fsdp__recovery_ask(fsdp_ctx *ctx, int leader, const fsdp__recovery_msg *mine,
                                     fsdp__recovery_verdict *v) {
    int detect = ctx->desc.recovery.detect_ms, fd, ok;
    unsigned char mac[32];
    if ((fd = fsdp__sock_connect(&ctx->recovery->addr[leader], fsdp__now_ms() + detect)) < 0) return -1;
    ok = fsdp__sock_io_full(fd, (void *)(uintptr_t)mine, sizeof *mine, fsdp__now_ms() + detect, 1) == 0 &&
         fsdp__sock_io_full(fd, v, sizeof *v, fsdp__now_ms() + 3 * (int64_t)detect + 2000, 0) == 0 &&
         v->magic == FSDP__RECOVERY_MAGIC;
    close(fd);
    if (ok) fsdp__recovery_mac(ctx->comm->key, v, offsetof(fsdp__recovery_verdict, mac), mac);
    return ok && fsdp__equal_ct(mac, v->mac, 32) && v->count >= 0 && v->count <= ctx->recovery->now.total ? 0 : -1;
}

/* The agreement from this survivor's side: the rendezvous is the first rank of the lowest
   replica it believes alive, itself included (so nothing is special about rank 0); one that
   cannot be reached is believed lost and the next is tried. *leader: the rendezvous's rank as at
   fsdp_init; *world_fd: the new world's listener where this rank is it. */
FSDP__PRIVATE int fsdp__recovery_agree(fsdp_ctx *ctx, fsdp__recovery_verdict *v, int *leader, int *world_fd) {
    fsdp__recovery *rec = ctx->recovery;
    fsdp__recovery_msg mine;
    char tried[INET_ADDRSTRLEN + 32] = "none";
    int k;
    fsdp__recovery_view_of(ctx, &mine);
    for (k = 0; k < rec->now.count; k++) {
        int r = rec->now.replicas[k];
        if (!mine.reach[r]) continue;
        *leader = r * rec->group;
        if (*leader == rec->first_rank) {
            fsdp__recovery_lead(ctx, &mine, v, world_fd);
            return 0;
        }
        if (fsdp__recovery_ask(ctx, *leader, &mine, v) == 0) return 0;
        fsdp__sock_addr_string(tried, sizeof tried, &rec->addr[*leader]);
        fsdp__fmt(tried + strlen(tried), sizeof tried - strlen(tried), " (rank %d)", *leader);
        mine.reach[r] = 0;
        fsdp__recovery_mac(ctx->comm->key, &mine, offsetof(fsdp__recovery_msg, mac), mine.mac);
    }
    return fsdp__fail(ctx, FSDP_ERR_PEER_LOST, "recovery: rank %d reached no rendezvous of epoch %lld (the last it "
                      "tried: %s)", rec->first_rank, (long long)rec->now.epoch, tried);
}

/* The new world of the verdict's replicas (its key from the old world's and the rebuild's name,
   its rendezvous at the leader's listener), split into shard and replica comms, adopted. */
FSDP__PRIVATE int fsdp__recovery_rebuild(fsdp_ctx *ctx, const fsdp__recovery_verdict *v, int leader, int world_fd,
                                         int new_rank) {
    fsdp__recovery *rec = ctx->recovery;
    fsdp__inherit inherit;
    fsdp_comm_desc cd;
    fsdp_comm *world = NULL, *shard = NULL, *replica = NULL, *old = rec->world;
    char job[64], host[INET_ADDRSTRLEN];
    int rc, G = rec->group;
    memset(&inherit, 0, sizeof inherit);
    inherit.listen_fd = world_fd;
    memset(&cd, 0, sizeof cd);
    fsdp__fmt(job, sizeof job, "%s.rebuild%d", rec->job, ++rec->rebuilds); /* (the same count on every survivor) */
    inet_ntop(AF_INET, &rec->addr[leader].sin_addr, host, sizeof host);
    cd.backend = FSDP_BACKEND_SOCKET, cd.rank = new_rank, cd.world_size = v->count * G, cd.job = job;
    cd.master_addr = host, cd.master_port = v->port, cd.timeout_ms = fsdp_comm_timeout(ctx->comm);
    cd.logger = ctx->comm->logger;
    if ((rc = fsdp__comm_create(&world, &cd, ctx->comm, &inherit)) != 0 ||
        (rc = fsdp_comm_split(world, new_rank / G, new_rank, &shard)) != 0 ||
        (rc = fsdp_comm_split(world, new_rank % G, new_rank, &replica)) != 0 ||
        (rc = fsdp__recovery_adopt(ctx, world, shard, replica)) != 0) {
        if (inherit.listen_fd >= 0) close(inherit.listen_fd);
        fsdp_comm_destroy(replica);
        fsdp_comm_destroy(shard);
        fsdp_comm_destroy(world);
        return fsdp__fail(ctx, rc, "recovery: rank %d could not join epoch %lld's world at %s:%d: %s", rec->first_rank,
                          (long long)v->epoch, host, v->port, fsdp__init_error);
    }
    rec->world = world;
    fsdp_comm_destroy(old); /* (the context no longer uses it) */
    if (fsdp__comm_watch(world, ctx->desc.recovery.detect_ms) != 0 ||
        fsdp__comm_watch(replica, ctx->desc.recovery.detect_ms) != 0)
        return fsdp__fail(ctx, FSDP_ERR_SYSTEM, "recovery: keepalive on the new world: %s", strerror(errno));
    return 0;
}

/* fsdp_step's answer to a loss (rc) with recovery on: everything in flight stopped, the
   agreement, the step in flight applied here if the others did (one behind) or nowhere, the new
   world adopted; the report says the epoch and whether the step was dropped. A partition that
   must stop, or a rank whose replica is not in the new membership, fails naming why. */
FSDP__PRIVATE int fsdp__recover(fsdp_ctx *ctx, float max_norm, fsdp_step_report *report, int rc) {
    fsdp__recovery *rec = ctx->recovery;
    fsdp__recovery_verdict *v;
    int leader = -1, world_fd = -1, new_rank = -1, k;
    int64_t before = ctx->step;
    if (!rec || !fsdp__recovery_loss(rc)) return rc;
    fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: recovery: epoch %lld at step %lld: %s", rec->first_rank,
              (long long)rec->now.epoch, (long long)ctx->step, ctx->error);
    if ((rc = fsdp__recovery_quiesce(ctx, "a replica was lost: recovering")) != 0) return rc;
    if (!(v = (fsdp__recovery_verdict *)fsdp__calloc(sizeof *v))) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory");
    if ((rc = fsdp__recovery_agree(ctx, v, &leader, &world_fd)) == 0 && v->rc)
        rc = fsdp__fail(ctx, v->rc, "%s", v->why);
    for (k = 0; !rc && k < v->count; k++)
        if (v->replicas[k] == rec->replica) new_rank = k * rec->group + rec->first_rank % rec->group;
    if (!rc && new_rank < 0)
        rc = fsdp__fail(ctx, FSDP_ERR_PEER_LOST, "recovery: rank %d leaves: its replica %d is not in %s", rec->first_rank,
                        rec->replica, v->why);
    if (!rc && v->target_step == ctx->step + 1) rc = fsdp__recovery_catch_up(ctx, v->norm, max_norm);
    else if (!rc && v->target_step != ctx->step)
        rc = fsdp__fail(ctx, FSDP_ERR_PROTOCOL, "recovery: rank %d is at step %lld, the survivors at %lld",
                        rec->first_rank, (long long)ctx->step, (long long)v->target_step);
    if (!rc) fsdp__recovery_reset(ctx);
    if (!rc && (rc = fsdp__recovery_rebuild(ctx, v, leader, world_fd, new_rank)) == 0) {
        rec->now.epoch = v->epoch, rec->now.count = v->count;
        memcpy(rec->now.replicas, v->replicas, sizeof(int) * (size_t)v->count);
        ctx->loss_rc = 0;
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: %s: rank %d of %d from step %lld", rec->first_rank, v->why,
                  ctx->rank, ctx->world, (long long)ctx->step);
    } else if (world_fd >= 0 && rc) {
        close(world_fd);
    }
    report->dropped = ctx->step == before;
    report->step = ctx->step;
    FSDP_FREE(v);
    return rc;
}

FSDP_API int fsdp_replicas(const fsdp_ctx *ctx, int *count, int *index) {
    int ui, replica_size = 1;
    if (count) *count = 0;
    if (index) *index = 0;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    for (ui = 0; ui < ctx->num_units; ui++) /* a replica: the largest group a unit is sharded over */
        if (ctx->units[ui].group_size > replica_size) replica_size = ctx->units[ui].group_size;
    if (count) *count = ctx->world / replica_size;
    if (index) *index = ctx->rank / replica_size;
    return FSDP_SUCCESS;
}

FSDP_API int fsdp_synchronize(fsdp_ctx *ctx) {
    int rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__wait_task(ctx, 0)) != 0) return rc;
    return fsdp__step_drain(ctx);
}

FSDP_API int fsdp_set_lr(fsdp_ctx *ctx, float lr) {
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!(lr >= 0) || !isfinite(lr)) return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_lr: lr %g must be >= 0 and finite", (double)lr);
    ctx->opt.lr = lr;
    return 0;
}

/* (defined with fsdp_init's phases, below) */
FSDP__PRIVATE int fsdp__param_group_check(const fsdp_param_group *g, int i, char *err, size_t err_size);
FSDP__PRIVATE void fsdp__param_rates(fsdp_ctx *ctx);

/* Why settings o (resolved) cannot replace the context's: they would keep the optimizer state in
   another shape. NULL if they can. */
static const char *fsdp__optimizer_reshapes(const fsdp_ctx *ctx, const fsdp_optimizer_desc *o) {
    if (o->kind != ctx->opt.kind) return "its kind differs from fsdp_init's";
    if (o->custom != ctx->opt.custom) return "its custom row differs from fsdp_init's";
    if (o->state_dtype != ctx->opt.state_dtype) return "its state_dtype differs from fsdp_init's";
    if (fsdp__optimizer_num_state(o) != ctx->num_state)
        return "it keeps another number of state buffers than fsdp_init's (SGD: momentum 0 keeps none, any other one)";
    return NULL;
}

FSDP_API int fsdp_set_optimizer(fsdp_ctx *ctx, const fsdp_optimizer_desc *opt) {
    fsdp_optimizer_desc o;
    char err[FSDP__ERRMSG], settings[FSDP__ERRMSG];
    const char *why;
    int rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!opt) return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_optimizer: opt is NULL");
    o = *opt;
    fsdp__optimizer_defaults(&o);
    if ((rc = fsdp__optimizer_check(&o, err, sizeof err)) != 0) return fsdp__fail(ctx, rc, "fsdp_set_optimizer: %s", err);
    if ((why = fsdp__optimizer_reshapes(ctx, &o)) != NULL) {
        fsdp__optimizer_describe(opt, &o, settings, sizeof settings);
        return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_optimizer(%s): %s: the optimizer state cannot change shape "
                          "mid-run", settings, why);
    }
    if ((rc = fsdp__quiesce(ctx, "fsdp_set_optimizer")) != 0) return rc; /* (the step behind reads the rates) */
    ctx->opt = o;
    ctx->opt_given = *opt;
    fsdp__param_rates(ctx);
    fsdp__optimizer_describe(&ctx->opt_given, &ctx->opt, settings, sizeof settings);
    fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_set_optimizer: optimizer %s (from step %lld)", settings,
              (long long)ctx->step + 1);
    return 0;
}

FSDP_API int fsdp_set_param_group(fsdp_ctx *ctx, int group, const fsdp_param_group *g) {
    fsdp_param_group *kept;
    char err[FSDP__ERRMSG], given[64], had[64];
    int rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!g || group < 0 || group >= ctx->num_groups)
        return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_param_group(ctx, %d, %s): %s (fsdp_init had %d)", group,
                          g ? "g" : "NULL", g ? "no such group" : "g is NULL", ctx->num_groups);
    kept = &ctx->groups[group];
    if (!(g->pattern ? kept->pattern && strcmp(g->pattern, kept->pattern) == 0 : !kept->pattern) ||
        g->min_ndim != kept->min_ndim || g->max_ndim != kept->max_ndim)
        return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_param_group(ctx, %d): pattern %s, ndim %d..%d differ from "
                          "fsdp_init's %s, ndim %d..%d: a group's parameters cannot change (pass the same pattern and bounds)",
                          group, g->pattern ? fsdp_printable(given, sizeof given, g->pattern) : "NULL", g->min_ndim,
                          g->max_ndim, kept->pattern ? fsdp_printable(had, sizeof had, kept->pattern) : "NULL",
                          kept->min_ndim, kept->max_ndim);
    if ((rc = fsdp__param_group_check(g, group, err, sizeof err)) != 0)
        return fsdp__fail(ctx, rc, "fsdp_set_param_group: %s", err);
    if ((rc = fsdp__quiesce(ctx, "fsdp_set_param_group")) != 0) return rc;
    kept->weight_decay = g->weight_decay;
    kept->lr_scale = g->lr_scale;
    fsdp__param_rates(ctx);
    return 0;
}

/* --- creation ------------------------------------------------------------------------------ */
/* The fp32 shards. With f32 parameters a unit is gathered straight from its shard, so the
   shards of each shard group live in one fsdp_comm_alloc block of that group's comm: on the
   shm backend peers then read them directly, without staging copies. Collective (one
   fsdp_comm_alloc per shard comm, in the same order on every rank). */
FSDP__PRIVATE int fsdp__alloc_masters(fsdp_ctx *ctx) {
    fsdp_comm *comms[2];
    int c, ui, rc;
    comms[0] = ctx->comm;
    comms[1] = ctx->hybrid_shard_comm;
    if (ctx->desc.offload.params) return 0; /* on disk (fsdp__init_layout) */
    for (c = 0; c < 2 && ctx->param_dtype == FSDP_F32; c++) {
        size_t total = 0, at = 0;
        for (ui = 0; ui < ctx->num_units; ui++)
            if (comms[c] && ctx->units[ui].shard_comm == comms[c] && ctx->units[ui].group_size > 1 &&
                !fsdp__gathers_quantized(&ctx->units[ui])) /* (those gather codes, encoded from the shard) */
                total += fsdp__align((size_t)ctx->units[ui].shard, 16);
        if (!total) continue;
        if ((rc = fsdp_comm_alloc(comms[c], total * sizeof(float), &ctx->master_mem[c])) != 0) return rc;
        for (ui = 0; ui < ctx->num_units; ui++) {
            fsdp__unit *u = &ctx->units[ui];
            if (u->shard_comm != comms[c] || u->group_size <= 1 || fsdp__gathers_quantized(u)) continue;
            u->master = (float *)ctx->master_mem[c] + at;
            u->master_shared = 1;
            at += fsdp__align((size_t)u->shard, 16);
        }
    }
    for (ui = 0; ui < ctx->num_units; ui++)
        if (!ctx->units[ui].master &&
            !(ctx->units[ui].master = (float *)fsdp__calloc(sizeof(float) * (size_t)ctx->units[ui].shard)))
            return FSDP_ERR_OUT_OF_MEMORY;
    return 0;
}

/* Fills defaults and checks a description; *hybrid_group gets the shard group size. */
static __thread const fsdp_model *fsdp__sorting_model; /* qsort has no context argument (per thread) */
static int fsdp__cmp_param_name(const void *a, const void *b) {
    return strcmp(fsdp__sorting_model->params[*(const int *)a].name, fsdp__sorting_model->params[*(const int *)b].name);
}

/* A parameter by full name in log time (checkpoints look up every tensor). */
FSDP__PRIVATE int fsdp__ctx_find_param(const fsdp_ctx *ctx, const char *name) {
    int lo = 0, hi = ctx->model->num_params - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(ctx->model->params[ctx->param_by_name[mid]].name, name);
        if (c == 0) return ctx->param_by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

/* Whether anything is offloaded. */
static int fsdp__offloads(const fsdp_offload_desc *o) { return o->optimizer || o->params || o->grads; }

FSDP_API const char *fsdp_offload_describe(const fsdp_offload_desc *o) {
    static const char *const what[8] = {"nothing", "the optimizer state", "the gradients", "the optimizer state and gradients",
                                        "the parameters", "the parameters and optimizer state", "the parameters and gradients",
                                        "the parameters, gradients and optimizer state"};
    return o ? what[(o->optimizer ? 1 : 0) | (o->grads ? 2 : 0) | (o->params ? 4 : 0)] : "nothing";
}

/* Fills the description's zero fields with their defaults (the optimizer's too). */
FSDP__PRIVATE void fsdp__desc_defaults(fsdp_desc *d, int world, int local_world) {
    if (d->param_dtype == FSDP_DTYPE_DEFAULT) d->param_dtype = FSDP_F32;
    if (d->reduce_dtype == FSDP_DTYPE_DEFAULT) d->reduce_dtype = d->param_dtype;
    if (d->limit_all_gathers <= 0) d->limit_all_gathers = 2;
    if (d->backward_prefetch == FSDP_BACKWARD_PREFETCH_DEFAULT) d->backward_prefetch = FSDP_BACKWARD_PRE;
    if (d->shard_group_size <= 0) d->shard_group_size = local_world > 0 ? local_world : world;
    if (fsdp__offloads(&d->offload) && (!d->offload.dir || !*d->offload.dir)) d->offload.dir = getenv("FSDP_OFFLOAD_DIR");
    if (!d->offload.ram_bytes) d->offload.ram_bytes = FSDP__OFFLOAD_RAM_DEFAULT;
    if (!d->trace_dir || !*d->trace_dir) d->trace_dir = getenv("FSDP_TRACE");
    if (d->loss_scale.init_scale == 0) d->loss_scale.init_scale = 65536.0f;
    if (d->loss_scale.growth_factor == 0) d->loss_scale.growth_factor = 2.0f;
    if (d->loss_scale.backoff_factor == 0) d->loss_scale.backoff_factor = 0.5f;
    if (d->loss_scale.growth_interval == 0) d->loss_scale.growth_interval = 2000;
    if (d->recovery.min_replicas == 0) d->recovery.min_replicas = 1;
    if (d->recovery.detect_ms == 0) d->recovery.detect_ms = FSDP__RECOVERY_DETECT_MS;
    fsdp__optimizer_defaults(&d->optimizer);
}

/* Checks parameter group i (fsdp_init, fsdp_set_param_group): 0, or FSDP_ERR_INVALID_ARG with
   why in err. */
FSDP__PRIVATE int fsdp__param_group_check(const fsdp_param_group *g, int i, char *err, size_t err_size) {
    if (!(g->weight_decay >= 0) || !isfinite(g->weight_decay) || !(g->lr_scale >= 0) || !isfinite(g->lr_scale) ||
        g->min_ndim < 0 || g->max_ndim < 0 || (g->max_ndim && g->min_ndim > g->max_ndim)) {
        fsdp__fmt(err, err_size, "param_groups[%d]: weight_decay and lr_scale must be finite and >= 0, and "
                  "0 <= min_ndim <= max_ndim (max_ndim 0: no bound)", i);
        return FSDP_ERR_INVALID_ARG;
    }
    return 0;
}

/* The description's reshard mode and wires (issue 37): 0, or why in err. */
FSDP__PRIVATE int fsdp__desc_wire_check(const fsdp_desc *d, char *err, size_t err_size) {
    if ((int)d->reshard_after_forward < 0 || d->reshard_after_forward > FSDP_RESHARD_HOST) {
        fsdp__fmt(err, err_size, "reshard_after_forward %d is not DEFAULT, ALL, NONE or HOST", (int)d->reshard_after_forward);
        return FSDP_ERR_INVALID_ARG;
    }
    if ((int)d->param_wire < 0 || d->param_wire > FSDP_WIRE_INT4 || (int)d->grad_wire < 0 || d->grad_wire > FSDP_WIRE_INT4) {
        fsdp__fmt(err, err_size, "param_wire %d / grad_wire %d: use an fsdp_wire", (int)d->param_wire, (int)d->grad_wire);
        return FSDP_ERR_INVALID_ARG;
    }
    if (!fsdp__wire_block(d->wire_block)) {
        fsdp__fmt(err, err_size, "wire_block %zu: must be 0 (128) or a multiple of 8 in [8, %d]", d->wire_block,
                  FSDP__WIRE_BLOCK_MAX);
        return FSDP_ERR_INVALID_ARG;
    }
    if (d->param_wire >= FSDP_WIRE_F32 && d->param_wire <= FSDP_WIRE_F16 && (int)d->param_wire != (int)d->param_dtype) {
        fsdp__fmt(err, err_size, "param_wire %s differs from param_dtype %s: a float gather moves param_dtype (set "
                  "param_dtype, or param_wire int8 or int4)", fsdp_wire_name(d->param_wire), fsdp_dtype_name(d->param_dtype));
        return FSDP_ERR_INVALID_ARG;
    }
    return 0;
}

/* Checks a description with its defaults filled: 0, or FSDP_ERR_INVALID_ARG with why in err. */
FSDP__PRIVATE int fsdp__desc_validate(const fsdp_desc *d, char *err, size_t err_size) {
    const fsdp_loss_scale_desc *ls = &d->loss_scale;
    int i, rc;
    if (ls->enabled && !(fsdp__loss_scale_ok(ls->init_scale) && ls->growth_factor > 1 &&
                         isfinite(ls->growth_factor) && ls->backoff_factor > 0 && ls->backoff_factor < 1 &&
                         ls->growth_interval > 0)) {
        fsdp__fmt(err, err_size, "loss_scale: init_scale %g must be a normal float > 0, growth_factor %g > 1, "
                  "backoff_factor %g in (0, 1) and growth_interval %d > 0", (double)ls->init_scale,
                  (double)ls->growth_factor, (double)ls->backoff_factor, ls->growth_interval);
        return FSDP_ERR_INVALID_ARG;
    }
    if (!fsdp_dtype_size(d->param_dtype) || !fsdp_dtype_size(d->reduce_dtype)) {
        fsdp__fmt(err, err_size, "param_dtype %d / reduce_dtype %d: use FSDP_F32, FSDP_BF16 or FSDP_F16",
                  (int)d->param_dtype, (int)d->reduce_dtype);
        return FSDP_ERR_INVALID_ARG;
    }
    if ((int)d->backward_prefetch < 0 || d->backward_prefetch > FSDP_BACKWARD_PREFETCH_NONE) {
        fsdp__fmt(err, err_size, "backward_prefetch %d is not PRE, POST or NONE", (int)d->backward_prefetch);
        return FSDP_ERR_INVALID_ARG;
    }
    if ((i = fsdp__optimizer_check(&d->optimizer, err, err_size)) != 0) return i;
    if ((rc = fsdp__desc_wire_check(d, err, err_size)) != 0) return rc;
    if (fsdp__offloads(&d->offload) && (!d->offload.dir || !*d->offload.dir)) {
        fsdp__fmt(err, err_size, "offload (%s) needs a directory on a local disk: offload.dir or FSDP_OFFLOAD_DIR",
                  fsdp_offload_describe(&d->offload));
        return FSDP_ERR_INVALID_ARG;
    }
    if (d->num_param_groups < 0 || (d->num_param_groups > 0 && !d->param_groups)) {
        fsdp__fmt(err, err_size, "num_param_groups %d without param_groups", d->num_param_groups);
        return FSDP_ERR_INVALID_ARG;
    }
    for (i = 0; i < d->num_param_groups; i++)
        if ((rc = fsdp__param_group_check(&d->param_groups[i], i, err, err_size)) != 0) return rc;
    return 0;
}

/* The defaults, then the checks; *hybrid_group gets the shard group size. */
FSDP__PRIVATE int fsdp__desc_resolve(fsdp_desc *d, int world, int local_world, int *hybrid_group, char *err,
                                     size_t err_size) {
    fsdp__desc_defaults(d, world, local_world);
    *hybrid_group = d->shard_group_size;
    return fsdp__desc_validate(d, err, err_size);
}

/* Each parameter's weight decay and lr multiple, from its group or the optimizer's settings, and
   which units can be updated in one sweep: after fsdp_init and every change of the settings. */
FSDP__PRIVATE void fsdp__param_rates(fsdp_ctx *ctx) {
    const fsdp_model *m = ctx->model;
    int p, ui;
    for (p = 0; p < m->num_params; p++) {
        const fsdp_param_group *pg = ctx->param_group[p] >= 0 ? &ctx->groups[ctx->param_group[p]] : NULL;
        ctx->param_decay[p] = pg ? pg->weight_decay : ctx->opt.weight_decay;
        ctx->param_lr_scale[p] = pg && pg->lr_scale > 0 ? pg->lr_scale : 1.0f;
    }
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        int k;
        u->uniform_update = 1;
        for (k = 0; k < u->num_params; k++) {
            p = ctx->unit_params[u->first_param + k];
            if (m->params[p].frozen || ctx->param_decay[p] != ctx->opt.weight_decay || ctx->param_lr_scale[p] != 1.0f)
                u->uniform_update = 0;
        }
    }
}

/* The groups, copied (the caller's may go), and the first that matches each parameter. */
FSDP__PRIVATE int fsdp__apply_param_groups(fsdp_ctx *ctx) {
    const fsdp_model *m = ctx->model;
    int p, g;
    ctx->param_decay = (float *)fsdp__calloc(sizeof(float) * (size_t)(m->num_params + 1));
    ctx->param_lr_scale = (float *)fsdp__calloc(sizeof(float) * (size_t)(m->num_params + 1));
    ctx->param_group = (int *)fsdp__calloc(sizeof(int) * (size_t)(m->num_params + 1));
    ctx->groups = (fsdp_param_group *)fsdp__calloc(sizeof *ctx->groups * (size_t)(ctx->desc.num_param_groups + 1));
    if (!ctx->param_decay || !ctx->param_lr_scale || !ctx->param_group || !ctx->groups) return FSDP_ERR_OUT_OF_MEMORY;
    for (g = 0; g < ctx->desc.num_param_groups; g++, ctx->num_groups++) {
        ctx->groups[g] = ctx->desc.param_groups[g];
        if (ctx->groups[g].pattern && !(ctx->groups[g].pattern = fsdp__strdup(ctx->groups[g].pattern)))
            return FSDP_ERR_OUT_OF_MEMORY;
    }
    for (p = 0; p < m->num_params; p++) {
        ctx->param_group[p] = -1;
        for (g = 0; g < ctx->num_groups && ctx->param_group[p] < 0; g++) {
            const fsdp_param_group *pg = &ctx->groups[g];
            if (m->params[p].ndim < pg->min_ndim || (pg->max_ndim && m->params[p].ndim > pg->max_ndim)) continue;
            if (pg->pattern && fnmatch(pg->pattern, m->params[p].name, 0) != 0) continue;
            ctx->param_group[p] = g;
        }
    }
    fsdp__param_rates(ctx);
    ctx->desc.param_groups = NULL;
    ctx->desc.num_param_groups = 0;
    return 0;
}

/* fsdp_init's phases below fail with the message in fsdp__init_error (and to the logger). */
FSDP__PRIVATE int fsdp__init_fail_ctx(fsdp_ctx *ctx, int code, const char *fmt, ...) FSDP__PRINTF(3, 4);
FSDP__PRIVATE int fsdp__init_fail_ctx(fsdp_ctx *ctx, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fsdp__init_error, sizeof fsdp__init_error, fmt, ap);
    va_end(ap);
    fsdp__log(&ctx->logger, FSDP_LOG_ERROR, "%s", fsdp__init_error);
    return code;
}

/* The description with every default filled (FSDP_STRATEGY_AUTO: the strategy the budget
   allows), and the plan: which parameters form which unit, where each lies in its flat
   parameter. */
FSDP__PRIVATE int fsdp__init_resolve(fsdp_ctx *ctx, int *hybrid_group) {
    char err[FSDP__ERRMSG] = "", settings[FSDP__ERRMSG];
    int rc;
    if (ctx->desc.strategy == FSDP_STRATEGY_AUTO) {
        fsdp_desc chosen;
        char why[FSDP__ERRMSG - 64];
        rc = ctx->desc.memory_budget ? fsdp_fit_budget(ctx->model, &ctx->desc, ctx->world, ctx->desc.memory_budget, &chosen,
                                                       why, sizeof why)
                                     : (fsdp__copy_string(why, sizeof why, "FSDP_STRATEGY_AUTO needs desc.memory_budget "
                                                          "(bytes per rank)"), FSDP_ERR_INVALID_ARG);
        if (rc) return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: %s", why);
        ctx->desc.strategy = chosen.strategy;
        ctx->desc.offload = chosen.offload;
        fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_init: strategy AUTO chose %s", why);
    }
    rc = fsdp__desc_resolve(&ctx->desc, ctx->world, fsdp_comm_local_size(ctx->comm), hybrid_group, err, sizeof err);
    if (!rc) rc = fsdp__plan_build(ctx->model, &ctx->desc, ctx->world, *hybrid_group, &ctx->plan, err, sizeof err);
    if (!rc)
        rc = fsdp__recovery_check(&ctx->desc.recovery, ctx->model, &ctx->plan, ctx->comm, *hybrid_group, err,
                                  sizeof err);
    if (rc) return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: %s", err);
    ctx->param_dtype = ctx->desc.param_dtype;
    ctx->reduce_dtype = ctx->desc.reduce_dtype;
    ctx->loss_scale = ctx->desc.loss_scale.enabled ? ctx->desc.loss_scale.init_scale : 1.0f;
    ctx->opt = ctx->desc.optimizer;
    ctx->optimizer = fsdp__optimizer_row(&ctx->opt);
    ctx->num_state = fsdp__optimizer_num_state(&ctx->opt);
    ctx->state_dtype = ctx->opt.state_dtype;
    ctx->num_units = ctx->plan.num_units;
    fsdp__optimizer_describe(&ctx->opt_given, &ctx->opt, settings, sizeof settings);
    fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_init: optimizer %s", settings);
    return 0;
}

/* HYBRID_SHARD's groups: shard groups of consecutive ranks, replicas across them. Collective. */
FSDP__PRIVATE int fsdp__init_groups(fsdp_ctx *ctx, int hybrid_group) {
    int ui, rc, any_hybrid = 0;
    for (ui = 0; ui < ctx->num_units; ui++) any_hybrid |= ctx->plan.units[ui].strategy == FSDP_HYBRID_SHARD;
    if (!any_hybrid || ctx->world == 1) return 0;
    rc = fsdp_comm_split(ctx->comm, ctx->rank / hybrid_group, ctx->rank, &ctx->hybrid_shard_comm);
    if (!rc) rc = fsdp_comm_split(ctx->comm, ctx->rank % hybrid_group, ctx->rank, &ctx->hybrid_replica_comm);
    if (rc)
        return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: cannot form HYBRID_SHARD groups: %s",
                                   *fsdp_comm_last_error(ctx->comm) ? fsdp_comm_last_error(ctx->comm) : fsdp__init_error);
    return 0;
}

/* Quantized reductions' cross-host communicator (the ranks of this rank's local index, in host
   order), once per context, if some unit reduces over an INT8/INT4 grad_wire; and the units whose
   grad_wire means nothing, named. After fsdp__init_host. Collective. */
FSDP__PRIVATE int fsdp__init_cross(fsdp_ctx *ctx) {
    int ui, rc, any = 0;
    for (ui = 0; ui < ctx->num_units; ui++) {
        const fsdp__plan_unit *pu = &ctx->plan.units[ui];
        any |= pu->grad_wire != FSDP_WIRE_DEFAULT;
        if (pu->grad_ignored && ctx->rank == 0)
            fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_init: unit '%s': grad_wire ignored (%s): reduced in "
                      "reduce_dtype", *ctx->model->modules[pu->module].name ? ctx->model->modules[pu->module].name
                                                                             : "(root)", pu->strategy == FSDP_NO_SHARD ? "NO_SHARD all-reduces "
                      "the whole unit" : "its reduction lies inside one host");
    }
    if (ctx->desc.error_feedback && !any && ctx->rank == 0)
        fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_init: error_feedback ignored: no unit reduces its gradients "
                  "quantized (grad_wire int8 or int4 across hosts)");
    if (!any) return 0;
    rc = fsdp_comm_split(ctx->comm, ctx->rank % fsdp_comm_size(ctx->host_comm), ctx->rank, &ctx->cross_comm);
    if (rc)
        return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: cannot form the cross-host communicator of grad_wire: %s",
                                   fsdp_comm_last_error(ctx->comm));
    return 0;
}

/* The host communicator, for FSDP_RESHARD_HOST and quantized reductions: this rank's host
   (HYBRID_SHARD's shard comm where that is exactly the host, else a split by host), once per
   context, if some unit keeps its parameters on the host after forward or reduces over an
   INT8/INT4 grad_wire; and the units for which HOST means nothing, named. Collective. */
FSDP__PRIVATE int fsdp__init_host(fsdp_ctx *ctx, int hybrid_group) {
    int ui, r, rc, any_host = 0, host_is_group = ctx->hybrid_shard_comm != NULL;
    for (ui = 0; ui < ctx->num_units; ui++) {
        const fsdp__plan_unit *pu = &ctx->plan.units[ui];
        any_host |= pu->reshard == FSDP_RESHARD_HOST || pu->grad_wire != FSDP_WIRE_DEFAULT;
        if (pu->host_ignored && ctx->rank == 0)
            fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_init: unit '%s': reshard_after_forward HOST ignored (%s): "
                      "resharded as ALL", *ctx->model->modules[pu->module].name ? ctx->model->modules[pu->module].name
                                                                                : "(root)",
                      pu->strategy == FSDP_NO_SHARD ? "NO_SHARD holds the whole unit"
                                                    : "its shard group lies inside one host");
    }
    if (!any_host) return 0;
    for (r = 1; host_is_group && r < ctx->world; r++) /* the same answer on every rank */
        host_is_group = (fsdp_comm_host_of(ctx->comm, r) == fsdp_comm_host_of(ctx->comm, r - 1)) == (r % hybrid_group != 0);
    if (host_is_group) {
        ctx->host_comm = ctx->hybrid_shard_comm;
        return 0;
    }
    rc = fsdp_comm_split(ctx->comm, fsdp_comm_host_of(ctx->comm, ctx->rank), ctx->rank, &ctx->host_comm);
    if (rc)
        return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: cannot form the host communicator of reshard_after_forward "
                                   "HOST: %s", fsdp_comm_last_error(ctx->comm));
    return 0;
}

/* The units from the plan: their parameters, communicators, gradient and optimizer state shards. */
FSDP__PRIVATE int fsdp__init_units(fsdp_ctx *ctx, int hybrid_group) {
    const fsdp_model *model = ctx->model;
    int ui, p, k, j;
    ctx->units = (fsdp__unit *)fsdp__calloc(sizeof *ctx->units * (size_t)ctx->num_units);
    ctx->unit_params = (int *)fsdp__calloc(sizeof(int) * (size_t)(model->num_params + 1));
    ctx->fwd_order = (int *)fsdp__calloc(sizeof(int) * (size_t)ctx->num_units);
    ctx->bwd_order = (int *)fsdp__calloc(sizeof(int) * (size_t)ctx->num_units);
    ctx->queue_cap = 4 * ctx->num_units + 16;
    ctx->queue = (fsdp__task *)fsdp__calloc(sizeof *ctx->queue * (size_t)ctx->queue_cap);
    ctx->norm_ranks = ctx->world;
    ctx->norm_sums = (double *)fsdp__calloc(4 * sizeof(double) * (size_t)ctx->world);
    if (!ctx->units || !ctx->unit_params || !ctx->fwd_order || !ctx->bwd_order || !ctx->queue || !ctx->norm_sums)
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: out of memory");
    for (ui = 0, k = 0; ui < ctx->num_units; ui++) { /* each unit's parameters, in order */
        fsdp__unit *u = &ctx->units[ui];
        const fsdp__plan_unit *pu = &ctx->plan.units[ui];
        int nbuf = pu->frozen ? 0 : ctx->num_state; /* frozen: parameters only (no optimizer state) */
        u->module = pu->module;
        u->strategy = pu->strategy;
        u->numel = pu->numel;
        u->flat_numel = pu->flat_numel;
        u->padded = pu->padded;
        u->shard = pu->shard;
        u->group_size = pu->group_size;
        u->first_param = k;
        for (p = 0; p < model->num_params; p++)
            if (ctx->plan.unit_of_param[p] == ui) ctx->unit_params[k++] = p;
        u->num_params = k - u->first_param;
        if (u->strategy == FSDP_HYBRID_SHARD) {
            u->group_rank = ctx->rank % hybrid_group;
            u->shard_comm = ctx->world > 1 ? ctx->hybrid_shard_comm : ctx->comm;
            u->replica_comm = ctx->world > hybrid_group ? ctx->hybrid_replica_comm : NULL;
        } else if (u->strategy == FSDP_NO_SHARD) {
            u->group_rank = 0;
            u->shard_comm = NULL;
            u->replica_comm = ctx->world > 1 ? ctx->comm : NULL;
        } else {
            u->group_rank = ctx->rank;
            u->shard_comm = ctx->comm;
        }
        /* the root (unit 0) keeps its parameters from forward to backward, as PyTorch's root
           FSDP module does: its backward starts right after its forward ends (the plan says NONE) */
        u->reshard_mode = pu->reshard; /* (fsdp__plan_unit_modes) */
        u->reshard_after_forward = pu->reshard != FSDP_RESHARD_NONE;
        u->param_wire = pu->param_wire;
        u->wire_block = pu->wire_block;
        if (pu->reshard == FSDP_RESHARD_HOST) {
            int64_t L = fsdp_comm_size(ctx->host_comm);
            u->host_numel = (u->padded + L - 1) / L;
        }
        u->frozen = pu->frozen;
        u->grad_wire = pu->grad_wire;
        if ((u->residual_numel = pu->residual) > 0 &&
            !(u->residual = (float *)fsdp__calloc(sizeof(float) * (size_t)pu->residual)))
            return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: no memory for unit '%s''s error "
                                       "feedback residual (%lld floats)", fsdp__unit_name(ctx, ui), (long long)pu->residual);
        ctx->grad_bytes += sizeof(float) * (size_t)u->residual_numel;
        u->master_off = u->grad_off = -1;
        u->grad_zero = 1;
        u->grad_scale = 1.0f;
        u->step_done = 1;
        if (!u->frozen && !ctx->desc.offload.grads) u->grad = (float *)fsdp__calloc(sizeof(float) * (size_t)u->shard);
        for (j = 0; j < nbuf; j++) u->opt[j].offset = -1;
        if (!u->frozen && !ctx->desc.offload.grads && !u->grad)
            return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: no memory for unit '%s' (%lld elements "
                                       "per rank)", fsdp__unit_name(ctx, ui), (long long)u->shard);
        ctx->param_bytes += ctx->desc.offload.params ? 0 : sizeof(float) * (size_t)u->shard;
        ctx->grad_bytes += u->grad ? sizeof(float) * (size_t)u->shard : 0;
    }
    return 0;
}

/* Elements per chunk of the streamed step and the bytes of its slots: as many as ram_bytes
   holds, no more than the largest shard needs, in multiples of 2048 elements (whole 4 KiB blocks
   in f32 and bf16), at least 2048. per_element: the slots' bytes per element of a chunk. */
static int64_t fsdp__stream_chunk(size_t per_element, size_t ram_bytes, int64_t largest_shard, size_t *bytes) {
    int64_t chunk = per_element ? (int64_t)(ram_bytes / per_element) / 2048 * 2048 : 0;
    int64_t needed = (largest_shard + 2047) / 2048 * 2048;
    if (chunk > needed) chunk = needed;
    if (chunk < 2048) chunk = 2048;
    *bytes = (size_t)chunk * per_element;
    return chunk;
}

/* Shard buffers for parameters or gradients on disk: one per gather that can be in flight
   (limit_all_gathers + 1) plus two for reductions (one adding while the other's write runs). */
static int fsdp__io_bufs(const fsdp_offload_desc *od, int limit_all_gathers) {
    int n = (od->params ? (limit_all_gathers > 0 ? limit_all_gathers : 2) + 1 : 0) + (od->grads || od->params ? 2 : 0);
    return n < FSDP__IO_BUFS ? n : FSDP__IO_BUFS;
}

/* The slots' bytes per chunk element: for each shard a step moves, its raw bytes when on disk and
   its f32 widening when bf16, three slots of them. 0: nothing needs streaming (all f32 in RAM). */
static size_t fsdp__stream_per_element(const fsdp_offload_desc *od, fsdp_dtype state_dtype, int num_state) {
    size_t state_bytes = (od->optimizer ? fsdp_dtype_size(state_dtype) : 0) + (state_dtype == FSDP_F32 ? 0 : 4);
    return (size_t)FSDP__STREAM_SLOTS * ((od->params ? 4 : 0) + (od->grads ? 4 : 0) + (size_t)num_state * state_bytes);
}

/* The next region of bytes in the offload file, whole blocks: its offset; *at moves past it. */
static int64_t fsdp__file_region(int64_t *at, size_t bytes) {
    int64_t start = *at;
    *at += (int64_t)fsdp__align(bytes ? bytes : 1, FSDP__IO_ALIGN);
    return start;
}

/* Where the shards that the description offloads lie in the rank's offload file (regions of
   whole blocks, in unit order: master, gradient, optimizer state), and the RAM homes of the
   optimizer state that is not offloaded. The file's size. */
FSDP__PRIVATE int fsdp__init_layout(fsdp_ctx *ctx, int64_t *largest) {
    const fsdp_offload_desc *od = &ctx->desc.offload;
    size_t esize = fsdp_dtype_size(ctx->state_dtype);
    int64_t at = 0;
    int ui, k;
    *largest = 0;
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        size_t bytes = (size_t)u->shard * esize;
        if (!u->frozen && u->shard > *largest) *largest = u->shard;
        if (od->params) u->master_off = fsdp__file_region(&at, (size_t)u->shard * sizeof(float));
        if (od->grads && !u->frozen) u->grad_off = fsdp__file_region(&at, (size_t)u->shard * sizeof(float));
        for (k = 0; !u->frozen && k < ctx->num_state; k++) {
            if (od->optimizer) {
                u->opt[k].offset = fsdp__file_region(&at, bytes);
            } else if (!(u->opt[k].ram = fsdp__calloc(bytes))) {
                return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: no memory for the optimizer state of "
                                           "unit '%s' (%zu bytes)", fsdp__unit_name(ctx, ui), bytes);
            } else {
                ctx->opt_bytes += bytes;
            }
        }
    }
    ctx->offload_size = at;
    return 0;
}

/* The shards' homes (fsdp__init_layout), the offload file reserved, and the streaming slots
   where the step needs them. */
FSDP__PRIVATE int fsdp__init_state(fsdp_ctx *ctx) {
    const fsdp_offload_desc *od = &ctx->desc.offload;
    int64_t largest;
    size_t per_element = fsdp__stream_per_element(od, ctx->state_dtype, ctx->num_state), raw = 0, f32 = 0;
    int rc, v;
    char err[FSDP__ERRMSG];
    if ((rc = fsdp__init_layout(ctx, &largest)) != 0) return rc;
    ctx->persistent_bytes = ctx->param_bytes + ctx->grad_bytes + ctx->opt_bytes;
    if (ctx->offload_size > 0) {
        if (!(ctx->offload = (fsdp__offload *)fsdp__calloc(sizeof *ctx->offload)))
            return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: out of memory");
        if ((rc = fsdp__offload_open(ctx->offload, od->dir, od->allow_tmpfs, ctx->offload_size, ctx->rank,
                                     fsdp_comm_local_size(ctx->comm), &ctx->logger, err, sizeof err)) != 0) {
            FSDP_FREE(ctx->offload);
            ctx->offload = NULL;
            return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: %s", err);
        }
    }
    if (od->params || od->grads) { /* counted with the unsharded buffers, which they resemble */
        int ui, b;
        for (ui = 0; ui < ctx->num_units; ui++)
            if (fsdp__align(sizeof(float) * (size_t)(ctx->units[ui].shard ? ctx->units[ui].shard : 1), FSDP__IO_ALIGN) >
                ctx->io_buf_bytes)
                ctx->io_buf_bytes = fsdp__align(sizeof(float) * (size_t)(ctx->units[ui].shard ? ctx->units[ui].shard : 1),
                                                FSDP__IO_ALIGN);
        ctx->num_io_bufs = fsdp__io_bufs(od, ctx->desc.limit_all_gathers);
        for (b = 0; b < ctx->num_io_bufs; b++)
            if (!(ctx->io_buf[b] = (float *)fsdp__aligned_alloc(ctx->io_buf_bytes)))
                return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: no memory for the offload's shard "
                                           "buffers (%d of %zu bytes)", ctx->num_io_bufs, ctx->io_buf_bytes);
        ctx->live_bytes += (size_t)ctx->num_io_bufs * ctx->io_buf_bytes;
        if (ctx->live_bytes > ctx->peak_live_bytes) ctx->peak_live_bytes = ctx->live_bytes;
    }
    if (!per_element || !largest) return 0; /* the step updates every shard in place */
    ctx->stream_chunk = fsdp__stream_chunk(per_element, od->ram_bytes, largest, &ctx->stream_bytes);
    if (ctx->stream_bytes > od->ram_bytes)
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_INVALID_ARG, "fsdp_init: offload.ram_bytes %zu cannot hold the streaming's "
                                   "smallest chunks (%zu bytes)", od->ram_bytes, ctx->stream_bytes);
    for (v = 0; v < FSDP__VEC_STATE + ctx->num_state; v++) {
        raw += fsdp__align((size_t)ctx->stream_chunk * fsdp__slot_raw_bytes(ctx, v), FSDP__IO_ALIGN);
        f32 += (size_t)ctx->stream_chunk * fsdp__slot_f32_bytes(ctx, v);
    }
    ctx->stream_raw_stride = raw;
    ctx->stream_f32_stride = f32;
    if ((raw && !(ctx->stream_raw = fsdp__aligned_alloc(FSDP__STREAM_SLOTS * raw))) ||
        (f32 && !(ctx->stream_f32 = FSDP_MALLOC(FSDP__STREAM_SLOTS * f32))))
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: no memory for the streaming buffers (%zu bytes)",
                                   ctx->stream_bytes);
    return 0;
}

/* Masters on disk get their initial values there, a unit's shard at a time (zero padding). */
FSDP__PRIVATE int fsdp__init_offloaded_params(fsdp_ctx *ctx) {
    int ui, k, rc = 0;
    for (ui = 0; ui < ctx->num_units && !rc; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        float *shard;
        if (u->master || !u->shard) continue;
        if (!(shard = (float *)fsdp__calloc(sizeof(float) * (size_t)u->shard)))
            return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: out of memory");
        for (k = 0; k < u->num_params; k++) {
            int p = ctx->unit_params[u->first_param + k];
            const fsdp_param_info *info = &ctx->params[p];
            int64_t i;
            for (i = info->shard_begin; i < info->shard_end; i++)
                shard[ctx->param_at[p] + i - info->shard_begin] = fsdp_init_value(ctx->model, p, i, ctx->desc.seed);
        }
        if ((rc = fsdp__vec_io(ctx, u, FSDP__VEC_MASTER, 1, 0, u->shard, shard)) != 0)
            fsdp__init_fail_ctx(ctx, rc, "fsdp_init: %s", rc == FSDP_ERR_OUT_OF_MEMORY ? "out of memory" : ctx->offload->message);
        FSDP_FREE(shard);
    }
    return rc;
}

/* Each parameter's slice on this rank (fsdp_param_info), initialised from its rule (or on disk),
   and the index of parameters by name. */
FSDP__PRIVATE int fsdp__init_params(fsdp_ctx *ctx) {
    fsdp_model *model = ctx->model;
    int p;
    ctx->param_by_name = (int *)fsdp__calloc(sizeof(int) * (size_t)(model->num_params + 1));
    ctx->params = (fsdp_param_info *)fsdp__calloc(sizeof *ctx->params * (size_t)(model->num_params + 1));
    ctx->param_at = (int64_t *)fsdp__calloc(sizeof(int64_t) * (size_t)(model->num_params + 1));
    if (!ctx->param_by_name || !ctx->params || !ctx->param_at)
        return fsdp__init_fail_ctx(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_init: out of memory");
    for (p = 0; p < model->num_params; p++) ctx->param_by_name[p] = p;
    fsdp__sorting_model = model;
    qsort(ctx->param_by_name, (size_t)model->num_params, sizeof(int), fsdp__cmp_param_name);
    fsdp__sorting_model = NULL;
    for (p = 0; p < model->num_params; p++) {
        fsdp_param_info *info = &ctx->params[p];
        fsdp__unit *u = &ctx->units[ctx->plan.unit_of_param[p]];
        int64_t off = ctx->plan.param_offset[p], begin = (int64_t)u->group_rank * u->shard, end = begin + u->shard, i, at;
        int64_t lo = off > begin ? off : begin, hi = off + model->params[p].numel < end ? off + model->params[p].numel : end;
        info->unit = ctx->plan.unit_of_param[p];
        info->flat_offset = off;
        info->numel = model->params[p].numel;
        if (hi < lo) hi = lo = off;
        info->shard_begin = lo - off;
        info->shard_end = hi - off;
        at = lo - begin < 0 ? 0 : lo - begin > u->shard ? u->shard : lo - begin; /* empty: still in the shard */
        ctx->param_at[p] = at;
        info->shard = u->master ? u->master + at : NULL;
        info->grad_shard = u->grad && !model->params[p].frozen ? u->grad + at : NULL;
        for (i = info->shard_begin; u->master && i < info->shard_end; i++)
            info->shard[i - info->shard_begin] = fsdp_init_value(model, p, i, ctx->desc.seed);
    }
    return fsdp__init_offloaded_params(ctx);
}

FSDP_API int fsdp_init(fsdp_ctx **out, fsdp_model *model, const fsdp_desc *desc) {
    fsdp_ctx *ctx;
    int rc, hybrid_group = 1;
    if (out) *out = NULL;
    if (!out || !model || !desc || !desc->comm) {
        fsdp__copy_string(fsdp__init_error, sizeof fsdp__init_error, "fsdp_init: out, model, desc and desc->comm are required");
        return FSDP_ERR_INVALID_ARG;
    }
    ctx = (fsdp_ctx *)fsdp__calloc(sizeof *ctx);
    if (!ctx) return FSDP_ERR_OUT_OF_MEMORY;
    ctx->model = model;
    ctx->desc = *desc;
    ctx->opt_given = desc->optimizer;
    ctx->comm = desc->comm;
    ctx->rank = fsdp_comm_rank(desc->comm);
    ctx->world = fsdp_comm_size(desc->comm);
    ctx->logger = desc->logger.fn ? desc->logger : desc->comm->logger;
    ctx->abort_on_misuse = fsdp__misuse_aborts();
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_cond_init(&ctx->wake, NULL);
    pthread_cond_init(&ctx->done, NULL);
    if ((rc = fsdp__init_resolve(ctx, &hybrid_group)) == 0 && (rc = fsdp__init_groups(ctx, hybrid_group)) == 0 &&
        (rc = fsdp__init_host(ctx, hybrid_group)) == 0 && (rc = fsdp__init_cross(ctx)) == 0 &&
        (rc = fsdp__init_units(ctx, hybrid_group)) == 0 && (rc = fsdp__init_state(ctx)) == 0) {
        if ((rc = fsdp__alloc_masters(ctx)) != 0)
            fsdp__init_fail_ctx(ctx, rc, "fsdp_init: no memory for the parameter shards: %s",
                                rc == FSDP_ERR_OUT_OF_MEMORY ? "out of memory" : fsdp_comm_last_error(ctx->comm));
        else if ((rc = fsdp__init_params(ctx)) == 0 && (rc = fsdp__apply_param_groups(ctx)) != 0)
            fsdp__init_fail_ctx(ctx, rc, "fsdp_init: out of memory");
    }
    if (!rc && pthread_create(&ctx->thread, NULL, fsdp__worker, ctx) != 0)
        rc = fsdp__init_fail_ctx(ctx, FSDP_ERR_SYSTEM, "fsdp_init: cannot start the comm thread");
    if (!rc) ctx->thread_started = 1;
    if (!rc && (rc = fsdp__trace_open(ctx)) == 0 && ctx->offload) ctx->offload->trace = ctx->trace;
    if (!rc) rc = fsdp__recovery_open(ctx);
    if (!rc && ctx->offload && ctx->stream_chunk) { /* the step runs behind the next forward */
        pthread_mutex_init(&ctx->step_lock, NULL);
        pthread_cond_init(&ctx->step_cond, NULL);
        if (pthread_create(&ctx->step_thread, NULL, fsdp__step_main, ctx) != 0)
            rc = fsdp__init_fail_ctx(ctx, FSDP_ERR_SYSTEM, "fsdp_init: cannot start the step thread");
        else ctx->step_thread_started = 1;
    }
    if (rc) {
        fsdp_destroy(ctx);
        return rc;
    }
    fsdp_comm_stats_get(ctx->comm, &ctx->sent_before);
    *out = ctx;
    return FSDP_SUCCESS;
}

FSDP_API void fsdp_destroy(fsdp_ctx *ctx) {
    int ui, k;
    if (!ctx) return;
    fsdp__async_end(ctx);
    if (ctx->step_thread_started) { /* the step behind finishes first */
        fsdp__thread_stop(ctx->step_thread, &ctx->step_lock, &ctx->step_cond, &ctx->step_stop);
        pthread_mutex_destroy(&ctx->step_lock);
        pthread_cond_destroy(&ctx->step_cond);
        ctx->step_thread_started = 0;
    }
    if (ctx->thread_started) /* the comm thread finishes what is queued: every rank queued the same */
        fsdp__thread_stop(ctx->thread, &ctx->lock, &ctx->wake, &ctx->stop);
    fsdp__offload_close(ctx->offload); /* (its I/O thread records into the trace) */
    fsdp__trace_close(ctx);
    for (ui = 0; ctx->units && ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        fsdp__reshard(ctx, u);
        fsdp__drop_host_shard(ctx, u);
        if (u->grad_full != u->grad) fsdp__buf_put(ctx, u->grad_full, (size_t)u->padded * sizeof(float));
        if (!u->master_shared) FSDP_FREE(u->master);
        FSDP_FREE(u->grad);
        FSDP_FREE(u->residual);
        for (k = 0; k < FSDP_OPTIMIZER_MAX_STATE; k++) FSDP_FREE(u->opt[k].ram);
    }
    for (ui = 0; ui < ctx->pool_len; ui++) FSDP_FREE(ctx->pool[ui].ptr);
    FSDP_FREE(ctx->offload);
    fsdp__aligned_free(ctx->stream_raw);
    for (ui = 0; ui < ctx->num_io_bufs; ui++) fsdp__aligned_free(ctx->io_buf[ui]);
    FSDP_FREE(ctx->stream_f32);
    fsdp_comm_free(ctx->comm, ctx->master_mem[0]);
    fsdp_comm_free(ctx->hybrid_shard_comm, ctx->master_mem[1]);
    if (ctx->host_comm != ctx->hybrid_shard_comm) fsdp_comm_destroy(ctx->host_comm);
    fsdp_comm_destroy(ctx->cross_comm);
    fsdp_comm_destroy(ctx->hybrid_shard_comm);
    fsdp_comm_destroy(ctx->hybrid_replica_comm);
    fsdp__recovery_close(ctx); /* (the world it made, after the comms split from it) */
    fsdp__plan_free(&ctx->plan);
    FSDP_FREE(ctx->units);
    FSDP_FREE(ctx->unit_params);
    FSDP_FREE(ctx->param_by_name);
    FSDP_FREE(ctx->param_at);
    FSDP_FREE(ctx->params);
    FSDP_FREE(ctx->param_decay);
    FSDP_FREE(ctx->param_lr_scale);
    FSDP_FREE(ctx->param_group);
    for (ui = 0; ui < ctx->num_groups; ui++) FSDP_FREE((void *)(uintptr_t)ctx->groups[ui].pattern); /* (copies of ours) */
    FSDP_FREE(ctx->groups);
    FSDP_FREE(ctx->fwd_order);
    FSDP_FREE(ctx->bwd_order);
    FSDP_FREE(ctx->queue);
    FSDP_FREE(ctx->norm_sums);
    pthread_mutex_destroy(&ctx->lock);
    pthread_cond_destroy(&ctx->wake);
    pthread_cond_destroy(&ctx->done);
    FSDP_FREE(ctx);
}

/* --- inspection ---------------------------------------------------------------------------- */
FSDP_API int fsdp_num_units(const fsdp_ctx *ctx) { return ctx ? ctx->num_units : 0; }

FSDP_API int fsdp_unit_info_get(const fsdp_ctx *ctx, int unit, fsdp_unit_info *info) {
    const fsdp__unit *u;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!info || unit < 0 || unit >= ctx->num_units) /* (the error message is no part of what const protects) */
        return fsdp__fail((fsdp_ctx *)ctx, FSDP_ERR_INVALID_ARG, "fsdp_unit_info_get(ctx, %d, %s): %s (the context has %d "
                          "units: 0..%d)", unit, info ? "info" : "NULL", info ? "no such unit" : "info is NULL",
                          ctx->num_units, ctx->num_units - 1);
    u = &ctx->units[unit];
    info->module = u->module;
    info->name = ctx->model->modules[u->module].name;
    info->strategy = u->strategy;
    info->num_params = u->num_params;
    info->numel = u->numel;
    info->flat_numel = u->flat_numel;
    info->padded_numel = u->padded;
    info->shard_numel = u->shard;
    info->shard_offset = (int64_t)u->group_rank * u->shard;
    info->is_root = unit == 0;
    info->reshard_after_forward = u->reshard_after_forward;
    info->reshard_mode = u->reshard_mode;
    info->param_wire = u->param_wire;
    info->host_shard_numel = u->reshard_mode == FSDP_RESHARD_HOST ? u->host_numel : 0;
    return 0;
}

FSDP_API int fsdp_param_info_get(const fsdp_ctx *ctx, int param, fsdp_param_info *info) {
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!info || param < 0 || param >= ctx->model->num_params)
        return fsdp__fail((fsdp_ctx *)ctx, FSDP_ERR_INVALID_ARG, "fsdp_param_info_get(ctx, %d, %s): %s (the model has %d "
                          "parameters: 0..%d)", param, info ? "info" : "NULL", info ? "no such parameter" : "info is NULL",
                          ctx->model->num_params, ctx->model->num_params - 1);
    *info = ctx->params[param];
    return 0;
}

FSDP_API void fsdp_print_units(const fsdp_ctx *ctx, void (*fn)(void *user, const char *line), void *user) {
    char line[320], settings[300];
    int ui;
    size_t master, per_param;
    if (!ctx) return;
    master = ctx->desc.offload.params ? 0 : 4; /* bytes per element in RAM (frozen units: the master only) */
    per_param = master + (ctx->desc.offload.grads ? 0 : 4) +
                (ctx->desc.offload.optimizer ? 0 : fsdp_dtype_size(ctx->state_dtype) * (size_t)ctx->num_state);
    fsdp__fmt(line, sizeof line, "%-4s %-24s %-14s %-13s %-5s %7s %12s %9s %12s %14s", "unit", "module", "strategy",
              "after forward", "wire", "params", "elements", "padding", "shard", "bytes/rank");
    if (fn) fn(user, line); else printf("%s\n", line);
    for (ui = 0; ui < ctx->num_units; ui++) {
        const fsdp__unit *u = &ctx->units[ui];
        fsdp__fmt(line, sizeof line, "%-4d %-24.24s %-14s %-13s %-5s %7d %12lld %9lld %12lld %14zu", ui,
                  fsdp__unit_name(ctx, ui), fsdp_strategy_name(u->strategy),
                  u->reshard_mode == FSDP_RESHARD_HOST ? "to host" : u->reshard_after_forward ? "resharded"
                  : ui == 0 ? "kept (root)" : "kept", fsdp_wire_name(u->param_wire),
                  u->num_params, (long long)u->numel,
                  (long long)(u->padded - u->numel), (long long)u->shard, (size_t)u->shard * (u->frozen ? master : per_param));
        if (fn) fn(user, line); else printf("%s\n", line);
    }
    fsdp__optimizer_describe(&ctx->opt_given, &ctx->opt, settings, sizeof settings);
    fsdp__fmt(line, sizeof line, "optimizer %s", settings);
    if (fn) fn(user, line); else printf("%s\n", line);
    for (ui = 0; ui < ctx->num_groups; ui++) {
        const fsdp_param_group *g = &ctx->groups[ui];
        int p, members = 0;
        for (p = 0; p < ctx->model->num_params; p++) members += ctx->param_group[p] == ui;
        char ndim[40];
        fsdp_printable(settings, 80, g->pattern ? g->pattern : "*");
        if (g->max_ndim) fsdp__fmt(ndim, sizeof ndim, "ndim %d..%d", g->min_ndim, g->max_ndim);
        else fsdp__fmt(ndim, sizeof ndim, "ndim >= %d", g->min_ndim);
        fsdp__fmt(line, sizeof line, "param_groups[%d] '%s', %s: weight_decay %g, lr x %g (%d parameters)", ui, settings,
                  ndim, (double)g->weight_decay, (double)(g->lr_scale > 0 ? g->lr_scale : 1.0f), members);
        if (fn) fn(user, line); else printf("%s\n", line);
    }
}

/* --- full values ----------------------------------------------------------------------------- */
FSDP_API int fsdp_gather_param(fsdp_ctx *ctx, int param, float *out) {
    fsdp__unit *u = fsdp__param_unit(ctx, param);
    float *flat;
    int rc;
    if (!u || !out) return ctx ? fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_gather_param: bad parameter %d", param)
                               : FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__step_drain(ctx)) != 0) return rc;
    if (!u->shard_comm || u->group_size == 1) { /* replicated, or a group of one: the shard is the whole unit */
        if (u->master)
            memcpy(out, u->master + ctx->plan.param_offset[param], sizeof(float) * (size_t)ctx->model->params[param].numel);
        else if ((rc = fsdp__vec_io(ctx, u, FSDP__VEC_MASTER, 0, ctx->plan.param_offset[param],
                                    ctx->model->params[param].numel, out)) != 0)
            return fsdp__offload_failed(ctx, rc);
        return 0;
    }
    flat = (float *)fsdp__buf_get(ctx, sizeof(float) * (size_t)u->padded, 0);
    if ((rc = fsdp__agree_alloc(ctx, flat, sizeof(float) * (size_t)u->padded, "fsdp_gather_param: the gathered unit")) != 0) {
        fsdp__buf_put(ctx, flat, sizeof(float) * (size_t)u->padded);
        return rc;
    }
    if (!u->master) { /* on disk: read into this rank's part of the gathered buffer, gathered in place */
        float *mine = flat + (size_t)u->group_rank * (size_t)u->shard;
        if ((rc = fsdp__vec_io(ctx, u, FSDP__VEC_MASTER, 0, 0, u->shard, mine)) != 0) {
            fsdp__offload_failed(ctx, rc); /* (fails the comm too: the peers' gather fails, naming this rank) */
            fsdp__buf_put(ctx, flat, sizeof(float) * (size_t)u->padded);
            return rc;
        }
    }
    rc = fsdp__worker_coll(ctx, u->shard_comm, FSDP_COLL_ALL_GATHER,
                           u->master ? u->master : flat + (size_t)u->group_rank * (size_t)u->shard, flat, (size_t)u->shard, 0);
    if (!rc) memcpy(out, flat + ctx->plan.param_offset[param], sizeof(float) * (size_t)ctx->model->params[param].numel);
    fsdp__buf_put(ctx, flat, sizeof(float) * (size_t)u->padded);
    return rc;
}

static int fsdp__check_settable(fsdp_ctx *ctx, fsdp__unit *u, int param) {
    int rc;
    if ((rc = fsdp__step_drain(ctx)) != 0) return rc;
    if (ctx->phase != 0 || u->state != FSDP__SHARDED)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "parameter '%s' can only be set between iterations (its unit is %s)",
                          ctx->model->params[param].name, fsdp__state_name(u->state));
    return 0;
}

/* This rank's slice of a parameter set to slice (in its shard in RAM or on disk). */
FSDP__PRIVATE int fsdp__write_slice(fsdp_ctx *ctx, fsdp__unit *u, int param, const float *slice) {
    const fsdp_param_info *info = &ctx->params[param];
    int64_t count = info->shard_end - info->shard_begin;
    int rc;
    if (info->shard) {
        memcpy(info->shard, slice, sizeof(float) * (size_t)count);
        return 0;
    }
    rc = fsdp__vec_io(ctx, u, FSDP__VEC_MASTER, 1, fsdp__param_at(ctx, param), count, (float *)(uintptr_t)slice); /* (only read) */
    return rc ? fsdp__offload_failed(ctx, rc) : 0;
}

FSDP_API int fsdp_set_param_shard(fsdp_ctx *ctx, int param, const float *slice) {
    fsdp__unit *u = fsdp__param_unit(ctx, param);
    int rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!u || !slice)
        return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_param_shard(ctx, %d, %s): %s", param, slice ? "slice" : "NULL",
                          u ? "the slice is NULL" : "no such parameter");
    if ((rc = fsdp__check_settable(ctx, u, param)) != 0) return rc;
    return fsdp__write_slice(ctx, u, param, slice);
}

FSDP_API int fsdp_set_param_full(fsdp_ctx *ctx, int param, const float *full) {
    fsdp__unit *u = fsdp__param_unit(ctx, param);
    const fsdp_param_info *info;
    float *buf;
    size_t n;
    int rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!u || (ctx->rank == 0 && !full))
        return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_set_param_full(ctx, %d, ...): %s", param,
                          u ? "rank 0 must pass the full value (NULL)" : "no such parameter");
    if ((rc = fsdp__check_settable(ctx, u, param)) != 0) return rc;
    n = (size_t)ctx->model->params[param].numel;
    buf = (float *)fsdp__buf_get(ctx, sizeof(float) * n, 0);
    if ((rc = fsdp__agree_alloc(ctx, buf, sizeof(float) * n, "fsdp_set_param_full: the broadcast value")) != 0) {
        fsdp__buf_put(ctx, buf, sizeof(float) * n);
        return rc;
    }
    if (ctx->rank == 0) memcpy(buf, full, sizeof(float) * n);
    rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_BROADCAST, NULL, buf, n, 0);
    info = &ctx->params[param];
    if (!rc) rc = fsdp__write_slice(ctx, u, param, buf + info->shard_begin);
    fsdp__buf_put(ctx, buf, sizeof(float) * n);
    return rc;
}

/* ============================================================================================
   >>memory
   What fsdp.h holds per rank, measured (fsdp_memory_stats_get) and predicted before anything
   is allocated (fsdp_memory_estimate, fsdp_strategy_for_budget, FSDP_STRATEGY_AUTO).
   ============================================================================================ */
FSDP_API int fsdp_offload_stats_get(const fsdp_ctx *ctx, fsdp_offload_stats *st) {
    fsdp__offload *o;
    if (!ctx || !st) return FSDP_ERR_INVALID_ARG;
    memset(st, 0, sizeof *st);
    if (!(o = ctx->offload)) return 0;
    pthread_mutex_lock(&o->lock);
    st->bytes_read = o->bytes_read;
    st->bytes_written = o->bytes_written;
    st->io_seconds = o->io_seconds;
    st->wait_seconds = o->wait_seconds;
    pthread_mutex_unlock(&o->lock);
    return 0;
}

FSDP_API int fsdp_memory_stats_get(const fsdp_ctx *ctx, fsdp_memory_stats *st) {
    if (!ctx || !st) return FSDP_ERR_INVALID_ARG;
    memset(st, 0, sizeof *st);
    pthread_mutex_lock((pthread_mutex_t *)&ctx->lock);
    st->param_shard_bytes = ctx->param_bytes;
    st->grad_shard_bytes = ctx->grad_bytes;
    st->optimizer_bytes = ctx->opt_bytes;
    st->persistent_bytes = ctx->persistent_bytes;
    st->unsharded_bytes = ctx->live_bytes;
    st->peak_unsharded_bytes = ctx->peak_live_bytes;
    st->disk_bytes = ctx->offload ? (size_t)ctx->offload->size : 0;
    st->stream_bytes = ctx->stream_bytes;
    pthread_mutex_unlock((pthread_mutex_t *)&ctx->lock);
    st->peak_bytes = st->persistent_bytes + st->peak_unsharded_bytes + st->stream_bytes;
    return 0;
}

FSDP_API void fsdp_memory_reset_peak(fsdp_ctx *ctx) {
    if (!ctx) return;
    pthread_mutex_lock(&ctx->lock);
    ctx->peak_live_bytes = ctx->live_bytes;
    pthread_mutex_unlock(&ctx->lock);
}

/* Persistent bytes exactly. The unsharded peak is the bound the scheduler keeps (without
   no_sync, which holds every unit's gradient): every unit that stays gathered after forward
   (the root, SHARD_GRAD_OP, NO_SHARD in 16-bit), plus for the resharding units the one in use
   and limit_all_gathers prefetched, plus the root's f32 gradient (its backward encloses all
   others) and two more (one being written, one being reduced) with their reduce-dtype
   staging. Units nested in other units than the root hold their gradient the same way. */
/* A unit's bytes beyond its padded gathered buffer (issue 37): *kept, the host shard held from
   forward to backward (FSDP_RESHARD_HOST: ceil(padded / L), largest on the smallest host);
   *gathered, its gathered buffer (the host gather's L slices may pass padded); *wire, a quantized
   gather's buffer of every rank's codes or a quantized reduction's scratch, whichever is larger
   (the comm thread holds one at a time). Hosts from d->comm (one host without a comm of world
   ranks). */
static void fsdp__estimate_unit_extra(const fsdp__plan_unit *pu, const fsdp_desc *d, int world, size_t *kept,
                                      size_t *gathered, size_t *wire) {
    size_t esize = fsdp_dtype_size(d->param_dtype);
    int h, r, hosts = pu->reshard == FSDP_RESHARD_HOST ? fsdp_comm_num_hosts(d->comm) : 0;
    *kept = 0;
    *gathered = (size_t)pu->padded * esize;
    *wire = pu->wire_block ? (fsdp_wire_bytes(pu->param_wire, (size_t)pu->shard, pu->wire_block) + 3) / 4 * 4 *
                                 (size_t)pu->group_size : 0;
    if (pu->grad_wire) { /* fsdp_reduce_scatter_wire's: H partials, the codes out and in */
        size_t H = (size_t)pu->grad_hosts, slot = fsdp__align(fsdp_wire_bytes(pu->grad_wire, (size_t)pu->shard,
                                                                               fsdp__wire_block(d->wire_block)), 4);
        if (H * ((size_t)pu->shard * sizeof(float) + 2 * slot) > *wire) *wire = H * ((size_t)pu->shard * 4 + 2 * slot);
    }
    for (h = 0; h < hosts; h++) {
        int64_t L = 0, slice;
        for (r = 0; r < world; r++) L += fsdp_comm_host_of(d->comm, r) == h;
        if (!L) continue;
        slice = (pu->padded + L - 1) / L;
        if ((size_t)slice * esize > *kept) *kept = (size_t)slice * esize;
        if ((size_t)(slice * L) * esize > *gathered) *gathered = (size_t)(slice * L) * esize;
    }
}

FSDP__PRIVATE int fsdp__memory_estimate(const fsdp_model *model, const fsdp_desc *desc, int world_size,
                                        fsdp_memory_stats *est, char *err, size_t err_size) {
    fsdp_desc d;
    fsdp__plan plan;
    int rc, ui, hybrid_group = 1, nbuf;
    size_t sbytes, shard_buf = 0;
    int64_t largest_state = 0;
    size_t kept = 0, largest_resharded = 0, resharded_total = 0, largest_grad = 0, root_grad = 0, gathered;
    size_t host_kept, unit_gathered, wire, largest_wire = 0;
    if (!model || !desc || !est || world_size < 1) return FSDP_ERR_INVALID_ARG;
    memset(est, 0, sizeof *est);
    d = *desc;
    if (d.strategy == FSDP_STRATEGY_AUTO && (!d.memory_budget || fsdp_fit_budget(model, desc, world_size, d.memory_budget,
                                                                                 &d, NULL, 0) != 0))
        d.strategy = FSDP_FULL_SHARD; /* nothing fits: the leanest */
    rc = fsdp__desc_resolve(&d, world_size,
                            desc->comm && fsdp_comm_size(desc->comm) == world_size ? fsdp_comm_local_size(desc->comm)
                                                                                  : world_size,
                            &hybrid_group, err, err_size);
    if (!rc) rc = fsdp__plan_build(model, &d, world_size, hybrid_group, &plan, err, err_size);
    if (rc) return rc;
    nbuf = fsdp__optimizer_num_state(&d.optimizer);
    sbytes = fsdp_dtype_size(d.optimizer.state_dtype);
    for (ui = 0; ui < plan.num_units; ui++) {
        const fsdp__plan_unit *pu = &plan.units[ui];
        size_t pbytes, gbytes = (size_t)pu->padded * sizeof(float);
        int reshards = pu->reshard != FSDP_RESHARD_NONE;
        fsdp__estimate_unit_extra(pu, &d, world_size, &host_kept, &unit_gathered, &wire);
        pbytes = unit_gathered;
        kept += host_kept;
        if (wire > largest_wire) largest_wire = wire;
        if (pu->group_size == 1 && d.param_dtype == FSDP_F32 && !d.offload.params && !wire) pbytes = 0; /* computes on the master */
        if (d.fp32_compute_view && d.param_dtype != FSDP_F32) pbytes += (size_t)pu->padded * sizeof(float);
        if (d.reduce_dtype != FSDP_F32) gbytes += (size_t)pu->padded * fsdp_dtype_size(d.reduce_dtype);
        else if (world_size == 1 && !d.offload.grads) gbytes = 0; /* accumulates in its gradient shard (fsdp__grad_in_place) */
        est->param_shard_bytes += sizeof(float) * (size_t)pu->shard;
        if (pu->frozen) gbytes = 0; /* no gradient, no optimizer state */
        else est->grad_shard_bytes += sizeof(float) * (size_t)(pu->shard + pu->residual); /* (error feedback's) */
        if (!pu->frozen && pu->shard > largest_state) largest_state = pu->shard;
        if ((d.offload.params || d.offload.grads) && /* gathers read and reductions add in one shard's buffer */
            fsdp__align(sizeof(float) * (size_t)(pu->shard ? pu->shard : 1), FSDP__IO_ALIGN) > shard_buf)
            shard_buf = fsdp__align(sizeof(float) * (size_t)(pu->shard ? pu->shard : 1), FSDP__IO_ALIGN);
        if (d.offload.params) { /* on disk */
            est->param_shard_bytes -= sizeof(float) * (size_t)pu->shard;
            est->disk_bytes += fsdp__align(sizeof(float) * (size_t)(pu->shard ? pu->shard : 1), FSDP__IO_ALIGN);
        }
        if (d.offload.grads && !pu->frozen) { /* on disk */
            est->grad_shard_bytes -= sizeof(float) * (size_t)pu->shard;
            est->disk_bytes += fsdp__align(sizeof(float) * (size_t)(pu->shard ? pu->shard : 1), FSDP__IO_ALIGN);
        }
        if (!pu->frozen && d.offload.optimizer)
            est->disk_bytes += fsdp__align(sbytes * (size_t)(pu->shard ? pu->shard : 1), FSDP__IO_ALIGN) * (size_t)nbuf;
        else if (!pu->frozen) est->optimizer_bytes += sbytes * (size_t)pu->shard * (size_t)nbuf;
        if (!reshards) kept += pbytes;
        else {
            resharded_total += pbytes;
            if (pbytes > largest_resharded) largest_resharded = pbytes;
        }
        if (ui == 0) root_grad = pu->numel ? gbytes : 0;
        else if (gbytes > largest_grad) largest_grad = gbytes;
    }
    est->persistent_bytes = est->param_shard_bytes + est->grad_shard_bytes + est->optimizer_bytes;
    /* the resharding units gathered at once: at most limit_all_gathers + 1, and never more than all of them */
    gathered = (size_t)(d.limit_all_gathers + 1) * largest_resharded;
    if (gathered > resharded_total) gathered = resharded_total;
    est->peak_unsharded_bytes = kept + gathered + root_grad + 2 * largest_grad + largest_wire;
    if (largest_state && fsdp__stream_per_element(&d.offload, d.optimizer.state_dtype, nbuf))
        fsdp__stream_chunk(fsdp__stream_per_element(&d.offload, d.optimizer.state_dtype, nbuf), d.offload.ram_bytes,
                           largest_state, &est->stream_bytes);
    est->peak_unsharded_bytes += shard_buf * (size_t)fsdp__io_bufs(&d.offload, d.limit_all_gathers);
    est->peak_bytes = est->persistent_bytes + est->peak_unsharded_bytes + est->stream_bytes;
    fsdp__plan_free(&plan);
    return 0;
}

FSDP_API int fsdp_memory_estimate(const fsdp_model *model, const fsdp_desc *desc, int world_size,
                                  fsdp_memory_stats *est) {
    char err[FSDP__ERRMSG];
    return fsdp__memory_estimate(model, desc, world_size, est, err, sizeof err);
}

/* Tries the strategies in order, least sharded first, then (offload_after) FULL_SHARD with ever
   more on disk: the optimizer state, then the gradients too, then the parameters too; *chosen
   gets the first whose estimated peak fits budget. */
FSDP__PRIVATE int fsdp__fit(const fsdp_model *model, const fsdp_desc *desc, int world_size, size_t budget, int offload_after,
                            fsdp_desc *chosen, char *why, size_t why_size) {
    fsdp_desc d = *desc, tries[8];
    fsdp_memory_stats est;
    size_t first_need = 0, leanest = 0;
    int n = 0, i, rc, ram_tries;
    char mine[200];
    if (!why) { why = mine; why_size = sizeof mine; }
    *why = 0;
    if (!model || !desc || !chosen || world_size < 1) return FSDP_ERR_INVALID_ARG;
    d.strategy = FSDP_NO_SHARD;
    tries[n++] = d;
    if (desc->comm && fsdp_comm_size(desc->comm) == world_size && fsdp_comm_num_hosts(desc->comm) > 1)
        (d.strategy = FSDP_HYBRID_SHARD, tries[n++] = d);
    d.strategy = FSDP_SHARD_GRAD_OP;
    tries[n++] = d;
    d.strategy = FSDP_FULL_SHARD;
    tries[n++] = d;
    ram_tries = n;
    if (offload_after && ((desc->offload.dir && *desc->offload.dir) || getenv("FSDP_OFFLOAD_DIR"))) {
        if (!d.offload.optimizer) (d.offload.optimizer = 1, tries[n++] = d);
        if (!d.offload.grads) (d.offload.grads = 1, tries[n++] = d);
        if (!d.offload.params) (d.offload.params = 1, tries[n++] = d);
    }
    for (i = 0; i < n; i++) {
        if ((rc = fsdp__memory_estimate(model, &tries[i], world_size, &est, why, why_size)) != 0) return rc; /* says why */
        if (i == 0) first_need = est.peak_bytes;
        if (i == ram_tries - 1) leanest = est.peak_bytes;
        if (est.peak_bytes > budget) continue;
        *chosen = tries[i];
        if (i == 0)
            fsdp__fmt(why, why_size, "%s: needs %.1f MiB per rank of the %.1f MiB budget", fsdp_strategy_name(tries[i].strategy),
                      est.peak_bytes / 1048576.0, budget / 1048576.0);
        else if (i >= ram_tries)
            fsdp__fmt(why, why_size, "FULL_SHARD with %s offloaded (%.1f MiB per rank on disk): needs %.1f MiB of RAM per "
                      "rank of the %.1f MiB budget (with less on disk FULL_SHARD needs %.1f MiB)",
                      fsdp_offload_describe(&tries[i].offload), est.disk_bytes / 1048576.0, est.peak_bytes / 1048576.0,
                      budget / 1048576.0, leanest / 1048576.0);
        else
            fsdp__fmt(why, why_size, "%s: needs %.1f MiB per rank of the %.1f MiB budget (%s needs %.1f MiB)",
                      fsdp_strategy_name(tries[i].strategy), est.peak_bytes / 1048576.0, budget / 1048576.0,
                      fsdp_strategy_name(tries[0].strategy), first_need / 1048576.0);
        return 0;
    }
    {
        char also[160] = "";
        if (n > ram_tries)
            fsdp__fmt(also, sizeof also, "; with %s on disk it needs %zu bytes (%.1f MiB) of RAM",
                      fsdp_offload_describe(&tries[n - 1].offload), est.peak_bytes, est.peak_bytes / 1048576.0);
        fsdp__fmt(why, why_size, "no strategy fits %zu bytes (%.1f MiB) per rank at world size %d: FULL_SHARD, the leanest, "
                  "needs %zu bytes (%.1f MiB) for parameters, gradients, optimizer state and gathered units%s (use more "
                  "ranks, a 16-bit param_dtype, %sor a larger budget)", budget, budget / 1048576.0, world_size, leanest,
                  leanest / 1048576.0, also, n == ram_tries && !(desc->offload.optimizer && desc->offload.grads &&
                  desc->offload.params) ? "offload to a local disk (fsdp_desc.offload with offload.dir or FSDP_OFFLOAD_DIR), "
                                        : "smaller units (a finer wrap policy), ");
    }
    return FSDP_ERR_OUT_OF_MEMORY;
}

FSDP_API int fsdp_strategy_for_budget(const fsdp_model *model, const fsdp_desc *desc, int world_size, size_t budget,
                                      fsdp_strategy *chosen, char *why, size_t why_size) {
    fsdp_desc fit;
    int rc = chosen ? fsdp__fit(model, desc, world_size, budget, 0, &fit, why, why_size) : FSDP_ERR_INVALID_ARG;
    if (!rc) *chosen = fit.strategy;
    return rc;
}

FSDP_API int fsdp_fit_budget(const fsdp_model *model, const fsdp_desc *desc, int world_size, size_t budget,
                             fsdp_desc *chosen, char *why, size_t why_size) {
    return fsdp__fit(model, desc, world_size, budget, 1, chosen, why, why_size);
}

/* ============================================================================================
   >>json
   A pull parser (safetensors headers, index.json) and a string builder that writes JSON.
   ============================================================================================ */
/* --- JSON: a pull parser for safetensors headers and index.json. A caller walks the text
   three times: the syntax (fsdp__json_skip), then the form of what it holds, counting only
   entries that can be valid (nothing is written), then it fills tables of exactly the counted
   sizes, strings decoded in place in the text (escapes only shrink). Parsing thus holds the
   text and the final tables, under 4x the input whatever it is (a tree of generic values
   costs ~30x on "[0,0,0,...]"). Depth is limited; anything malformed is an error. -------- */
#define FSDP__JSON_MAX_DEPTH 64

typedef struct fsdp__json {
    char *at, *end;   /* the text: writable, as the fill walk decodes strings in place */
    int fill;         /* 0: check and count; 1: also decode strings */
    int depth;
    char *err;
    size_t err_size;
    int failed;
} fsdp__json;

static int fsdp__json_fail(fsdp__json *j, const char *what) {
    if (!j->failed) fsdp__fmt(j->err, j->err_size, "bad JSON: %s", what);
    j->failed = 1;
    return -1;
}

static void fsdp__json_space(fsdp__json *j) {
    while (j->at < j->end && (*j->at == ' ' || *j->at == '\t' || *j->at == '\n' || *j->at == '\r')) j->at++;
}

/* Consumes c (after white space) if it is next; 1 if it was. */
static int fsdp__json_eat(fsdp__json *j, char c) {
    fsdp__json_space(j);
    if (j->at < j->end && *j->at == c) {
        j->at++;
        return 1;
    }
    return 0;
}

static int fsdp__jhex(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Reads 4 hex digits of a \u escape. */
static int fsdp__json_u4(fsdp__json *j, uint32_t *cp) {
    int k;
    *cp = 0;
    for (k = 0; k < 4; k++) {
        int h = j->at < j->end ? fsdp__jhex(*j->at++) : -1;
        if (h < 0) return fsdp__json_fail(j, "bad \\u escape");
        *cp = *cp * 16 + (uint32_t)h;
    }
    return 0;
}

/* A string. Fill walk: decoded in place and NUL-terminated, *out points at it. Count walk:
   *out is NULL, and probe (if given) receives the decoded text when it fits, else "". */
FSDP__PRIVATE int fsdp__json_string(fsdp__json *j, char **out, char *probe, size_t probe_size) {
    char *start, *w = NULL, *w_end = NULL;
    int over = 0;
    if (out) *out = NULL;
    if (!fsdp__json_eat(j, '"')) return fsdp__json_fail(j, "expected a string");
    start = j->at;
    if (j->fill) { w = start; w_end = j->end; }
    else if (probe && probe_size) { w = probe; w_end = probe + probe_size - 1; }
#define FSDP__JSON_EMIT(b) do { if (w) { if (w < w_end) *w++ = (char)(b); else over = 1; } } while (0)
    for (;;) {
        unsigned char c;
        uint32_t cp;
        if (j->at >= j->end) return fsdp__json_fail(j, "unterminated string");
        c = (unsigned char)*j->at++;
        if (c == '"') break;
        if (c < 0x20) return fsdp__json_fail(j, "control character in a string");
        if (c != '\\') { FSDP__JSON_EMIT(c); continue; }
        if (j->at >= j->end) return fsdp__json_fail(j, "unterminated string");
        switch (c = (unsigned char)*j->at++) {
            case '"': case '\\': case '/': FSDP__JSON_EMIT(c); continue;
            case 'b': FSDP__JSON_EMIT('\b'); continue;
            case 'f': FSDP__JSON_EMIT('\f'); continue;
            case 'n': FSDP__JSON_EMIT('\n'); continue;
            case 'r': FSDP__JSON_EMIT('\r'); continue;
            case 't': FSDP__JSON_EMIT('\t'); continue;
            case 'u': break;
            default: return fsdp__json_fail(j, "unknown escape");
        }
        if (fsdp__json_u4(j, &cp)) return -1;
        if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
            uint32_t lo;
            if (j->end - j->at < 6 || j->at[0] != '\\' || j->at[1] != 'u') return fsdp__json_fail(j, "lone surrogate");
            j->at += 2;
            if (fsdp__json_u4(j, &lo)) return -1;
            if (lo < 0xdc00 || lo > 0xdfff) return fsdp__json_fail(j, "bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
            return fsdp__json_fail(j, "lone surrogate");
        }
        if (cp == 0) return fsdp__json_fail(j, "\\u0000 in a string");
        if (cp < 0x80) {
            FSDP__JSON_EMIT(cp);
        } else if (cp < 0x800) {
            FSDP__JSON_EMIT(0xc0 | (cp >> 6)); FSDP__JSON_EMIT(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            FSDP__JSON_EMIT(0xe0 | (cp >> 12)); FSDP__JSON_EMIT(0x80 | ((cp >> 6) & 0x3f)); FSDP__JSON_EMIT(0x80 | (cp & 0x3f));
        } else {
            FSDP__JSON_EMIT(0xf0 | (cp >> 18)); FSDP__JSON_EMIT(0x80 | ((cp >> 12) & 0x3f));
            FSDP__JSON_EMIT(0x80 | ((cp >> 6) & 0x3f)); FSDP__JSON_EMIT(0x80 | (cp & 0x3f));
        }
    }
#undef FSDP__JSON_EMIT
    if (w) *w = 0; /* in place, w is at most the closing quote */
    if (probe && probe_size && !j->fill && over) probe[0] = 0;
    if (out && j->fill) *out = start;
    return 0;
}

/* A number; *is_int and *value say whether it is an integer that fits int64 and which. */
FSDP__PRIVATE int fsdp__json_number(fsdp__json *j, int *is_int, int64_t *value) {
    uint64_t mag = 0;
    int digits = 0, neg = 0, overflow = 0;
    fsdp__json_space(j);
    *is_int = 0;
    *value = 0;
    if (j->at < j->end && *j->at == '-') { neg = 1; j->at++; }
    if (j->at < j->end && *j->at == '0') { j->at++; digits = 1; }
    else while (j->at < j->end && *j->at >= '0' && *j->at <= '9') {
        uint64_t d = (uint64_t)(*j->at++ - '0');
        if (mag > (UINT64_C(0x7fffffffffffffff) - d) / 10) overflow = 1;
        else mag = mag * 10 + d;
        digits++;
    }
    if (!digits) return fsdp__json_fail(j, neg ? "bad number" : "expected a value");
    *is_int = !overflow;
    if (j->at < j->end && *j->at == '.') {
        *is_int = 0;
        j->at++;
        if (j->at >= j->end || *j->at < '0' || *j->at > '9') return fsdp__json_fail(j, "bad number");
        while (j->at < j->end && *j->at >= '0' && *j->at <= '9') j->at++;
    }
    if (j->at < j->end && (*j->at == 'e' || *j->at == 'E')) {
        *is_int = 0;
        j->at++;
        if (j->at < j->end && (*j->at == '+' || *j->at == '-')) j->at++;
        if (j->at >= j->end || *j->at < '0' || *j->at > '9') return fsdp__json_fail(j, "bad number");
        while (j->at < j->end && *j->at >= '0' && *j->at <= '9') j->at++;
    }
    *value = neg ? -(int64_t)mag : (int64_t)mag;
    return 0;
}

/* An integer in [lo, hi]; what names it in the error. */
FSDP__PRIVATE int fsdp__json_int(fsdp__json *j, int64_t lo, int64_t hi, int64_t *out, const char *what) {
    int is_int;
    if (fsdp__json_number(j, &is_int, out)) return -1;
    if (!is_int || *out < lo || *out > hi) return fsdp__json_fail(j, what);
    return 0;
}

/* Opens an object or array ('{' or '['). */
FSDP__PRIVATE int fsdp__json_open(fsdp__json *j, char open, const char *what) {
    if (!fsdp__json_eat(j, open)) return fsdp__json_fail(j, what);
    if (++j->depth > FSDP__JSON_MAX_DEPTH) return fsdp__json_fail(j, "nested too deeply");
    return 0;
}

/* 1 if another element of the open object or array follows (the comma before it consumed;
   *seen counts elements), 0 when close was consumed, -1 on error. */
FSDP__PRIVATE int fsdp__json_more(fsdp__json *j, char close, int *seen) {
    if (fsdp__json_eat(j, close)) {
        j->depth--;
        return 0;
    }
    if (*seen && !fsdp__json_eat(j, ',')) return fsdp__json_fail(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    ++*seen;
    return 1;
}

/* An object's key and its ':'; probe as in fsdp__json_string. */
FSDP__PRIVATE int fsdp__json_key(fsdp__json *j, char **key, char *probe, size_t probe_size) {
    if (fsdp__json_string(j, key, probe, probe_size)) return -1;
    if (!fsdp__json_eat(j, ':')) return fsdp__json_fail(j, "expected ':'");
    return 0;
}

/* Checks and passes over any value. */
FSDP__PRIVATE int fsdp__json_skip(fsdp__json *j) {
    int seen = 0, r, is_int;
    int64_t value;
    fsdp__json_space(j);
    if (j->at >= j->end) return fsdp__json_fail(j, "unexpected end");
    switch (*j->at) {
        case '"': return fsdp__json_string(j, NULL, NULL, 0);
        case '{':
            if (fsdp__json_open(j, '{', "expected '{'")) return -1;
            while ((r = fsdp__json_more(j, '}', &seen)) > 0)
                if (fsdp__json_key(j, NULL, NULL, 0) || fsdp__json_skip(j)) return -1;
            return r;
        case '[':
            if (fsdp__json_open(j, '[', "expected '['")) return -1;
            while ((r = fsdp__json_more(j, ']', &seen)) > 0)
                if (fsdp__json_skip(j)) return -1;
            return r;
        case 't': if (j->end - j->at >= 4 && memcmp(j->at, "true", 4) == 0) { j->at += 4; return 0; } break;
        case 'f': if (j->end - j->at >= 5 && memcmp(j->at, "false", 5) == 0) { j->at += 5; return 0; } break;
        case 'n': if (j->end - j->at >= 4 && memcmp(j->at, "null", 4) == 0) { j->at += 4; return 0; } break;
        default: return fsdp__json_number(j, &is_int, &value);
    }
    return fsdp__json_fail(j, "bad literal");
}

/* After the document: only white space (and NUL padding). */
FSDP__PRIVATE int fsdp__json_finish(fsdp__json *j) {
    fsdp__json_space(j);
    while (j->at < j->end && *j->at == 0) j->at++;
    return j->at == j->end ? 0 : fsdp__json_fail(j, "trailing characters after the document");
}

static void fsdp__json_start(fsdp__json *j, char *text, size_t size, int fill, char *err, size_t err_size) {
    j->at = text;
    j->end = text + size;
    j->fill = fill;
    j->depth = 0;
    j->err = err;
    j->err_size = err_size;
    j->failed = 0;
}

/* A string value; the fill walk stores it in *out (count walk: untouched). */
static int fsdp__json_string_into(fsdp__json *j, const char **out) {
    char *s;
    if (fsdp__json_string(j, &s, NULL, 0)) return -1;
    if (j->fill) *out = s;
    return 0;
}

/* Appends JSON text to a growing buffer. */
typedef struct fsdp__sbuf { char *data; size_t len, cap; int failed; } fsdp__sbuf;

FSDP__PRIVATE void fsdp__sbuf_add(fsdp__sbuf *b, const char *text, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 1024);
        char *grown;
        while (cap < b->len + n + 1) cap *= 2;
        grown = (char *)FSDP_REALLOC(b->data, cap);
        if (!grown) { b->failed = 1; return; }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, text, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void fsdp__sbuf_str(fsdp__sbuf *b, const char *text) { fsdp__sbuf_add(b, text, strlen(text)); }

FSDP__PRIVATE void fsdp__sbuf_printf(fsdp__sbuf *b, const char *fmt, ...) FSDP__PRINTF(2, 3);
FSDP__PRIVATE void fsdp__sbuf_printf(fsdp__sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) fsdp__sbuf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Appends s escaped for the inside of a JSON string. A byte that is not part of a well-formed
   UTF-8 character (fsdp__utf8_sequence) becomes U+FFFD, written \ufffd, where valid_utf8 is set
   (traces: text every JSON reader takes); else it passes as it is (checkpoints' names and
   metadata, which fsdp.h reads back byte for byte). */
FSDP__PRIVATE void fsdp__sbuf_jescape_as(fsdp__sbuf *b, const char *s, int valid_utf8) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), i = 0;
    while (i < n) {
        unsigned char c = p[i];
        size_t len = c < 0x80 ? 1 : fsdp__utf8_sequence(p + i, n - i);
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; fsdp__sbuf_add(b, e, 2); }
        else if (c < 0x20) fsdp__sbuf_printf(b, "\\u%04x", c);
        else if (len) fsdp__sbuf_add(b, s + i, len);
        else if (valid_utf8) fsdp__sbuf_add(b, "\\ufffd", 6);
        else fsdp__sbuf_add(b, s + i, 1);
        i += len ? len : 1;
    }
}

FSDP__PRIVATE void fsdp__sbuf_jescape(fsdp__sbuf *b, const char *s) { fsdp__sbuf_jescape_as(b, s, 0); }

FSDP__PRIVATE void fsdp__sbuf_jstring_as(fsdp__sbuf *b, const char *s, int valid_utf8) {
    fsdp__sbuf_add(b, "\"", 1);
    fsdp__sbuf_jescape_as(b, s, valid_utf8);
    fsdp__sbuf_add(b, "\"", 1);
}

FSDP__PRIVATE void fsdp__sbuf_jstring(fsdp__sbuf *b, const char *s) { fsdp__sbuf_jstring_as(b, s, 0); }

/* ============================================================================================
   >>trace
   Per-rank Chrome trace-event files (see the declarations). Threads record events into one
   buffer under a lock (a struct copy; a few per unit and step); the compute thread formats and
   writes them at fsdp_step once there are many, and at fsdp_destroy. Clock alignment: in each of
   FSDP__TRACE_ROUNDS all-gathers every rank notes its clock on entry (e) and exit (x). No rank
   leaves one before every rank entered it, so with d = this rank's clock minus rank 0's,
   e_0 + d < x_r and e_r - d < x_0: d lies in (e_r - x_0, x_r - e_0) in every round. The
   tightest window gives the offset (its middle) and the error bound (half its width); time 0
   is rank 0's entry into the first round.
   ============================================================================================ */
#define FSDP__TRACE_ROUNDS 8
#define FSDP__TRACE_FLUSH 2048   /* events buffered before fsdp_step writes them out */
FSDP__PRIVATE int fsdp__agree(fsdp_ctx *ctx, int rc);                            /* >>checkpoint */
FSDP__PRIVATE int fsdp__no_memory(fsdp_ctx *ctx, size_t bytes, const char *what); /* >>checkpoint */
FSDP__PRIVATE int fsdp__dir_open(const char *dir, char *why, size_t size);         /* >>checkpoint */
FSDP__PRIVATE int fsdp__tmp_create(int dir, const char *path, char *tmp, size_t tmp_size); /* >>safetensors */
FSDP__PRIVATE const char *fsdp__at_name(int dir, const char *path);              /* >>safetensors */
FSDP__PRIVATE mode_t fsdp__umask(void);                                          /* >>safetensors */

struct fsdp__trace {
    pthread_mutex_t lock;
    fsdp__trace_event *events;
    size_t len, cap;
    unsigned long long dropped;   /* events lost to a failed allocation */
    FILE *file;
    char path[1100];
    double zero;                  /* this rank's clock at the trace's time 0 */
    double offset, error;         /* seconds: this rank's clock minus rank 0's, and its bound */
    uint64_t seq[3];              /* collectives run per kind of group (world, shard, replica) */
    double iteration_start;       /* 0: the next hook starts the iteration */
    int64_t iterations;
    int failed;                   /* a write failed: recording stopped */
};

static const char *const fsdp__trace_threads[FSDP__TRACE_TIDS] = {"compute", "comm", "step", "io", "checkpoint"};
static const char *const fsdp__trace_groups[3] = {"world", "shard", "replica"};

FSDP__PRIVATE fsdp__trace_event fsdp__trace_ev(const char *cat, const char *name, int tid, double t0, double t1) {
    fsdp__trace_event e;
    memset(&e, 0, sizeof e);
    e.cat = cat;
    e.name = name;
    e.tid = tid;
    e.t0 = t0;
    e.t1 = t1;
    e.unit = e.group = -1;
    e.bytes = e.seq = e.step = -1;
    return e;
}

/* Any thread. */
FSDP__PRIVATE void fsdp__trace_add(fsdp__trace *tr, const fsdp__trace_event *e) {
    if (!tr) return;
    pthread_mutex_lock(&tr->lock);
    if (tr->len == tr->cap && !tr->failed) {
        size_t cap = tr->cap ? tr->cap * 2 : FSDP__TRACE_FLUSH * 2;
        fsdp__trace_event *grown = (fsdp__trace_event *)FSDP_REALLOC(tr->events, cap * sizeof *grown);
        if (grown) {
            tr->events = grown;
            tr->cap = cap;
        }
    }
    if (tr->len < tr->cap && !tr->failed) tr->events[tr->len++] = *e;
    else if (!tr->failed) tr->dropped++;
    pthread_mutex_unlock(&tr->lock);
}

FSDP__PRIVATE void fsdp__trace_io(fsdp__trace *tr, int write, size_t bytes, double t0, double t1) {
    fsdp__trace_event e = fsdp__trace_ev("io", write ? "write" : "read", fsdp__trace_thread, t0, t1);
    e.bytes = (int64_t)bytes;
    fsdp__trace_add(tr, &e);
}


/* The start of a hook or an API call: its time when tracing, else 0. The first hook after a
   step starts the next iteration. Compute thread. */
FSDP__PRIVATE double fsdp__trace_begin(fsdp_ctx *ctx) {
    double now;
    if (!ctx || !ctx->trace) return 0;
    now = fsdp_now();
    if (ctx->trace->iteration_start == 0) ctx->trace->iteration_start = now;
    return now;
}

/* An event from t0 (fsdp__trace_begin) to now on the calling thread; unit -1: none. */
FSDP__PRIVATE void fsdp__trace_end(fsdp_ctx *ctx, const char *cat, const char *name, int unit, double t0) {
    fsdp__trace_event e;
    if (!ctx || !ctx->trace || t0 == 0) return;
    e = fsdp__trace_ev(cat, name, fsdp__trace_thread, t0, fsdp_now());
    e.unit = unit;
    fsdp__trace_add(ctx->trace, &e);
}

FSDP__PRIVATE void fsdp__trace_hook(fsdp_ctx *ctx, const char *hook, int module, double t0) {
    if (ctx && ctx->trace && module >= 0 && module < ctx->model->num_modules)
        fsdp__trace_end(ctx, "hook", hook, ctx->plan.unit_of_module[module], t0);
}

/* A wait of the calling thread that began at t0, if it really waited (t0 != 0). */
FSDP__PRIVATE void fsdp__trace_wait(fsdp_ctx *ctx, const char *name, const char *wait_for, int unit, double t0) {
    fsdp__trace_event e;
    if (!ctx || !ctx->trace || t0 == 0) return;
    e = fsdp__trace_ev("wait", name, fsdp__trace_thread, t0, fsdp_now());
    e.unit = unit;
    e.wait_for = wait_for;
    fsdp__trace_add(ctx->trace, &e);
}

/* A checkpoint phase, with its path (cut to fit). */
FSDP__PRIVATE void fsdp__trace_ckpt(fsdp_ctx *ctx, const char *phase, const char *path, double t0) {
    fsdp__trace_event e;
    if (!ctx || !ctx->trace || t0 == 0) return;
    e = fsdp__trace_ev("checkpoint", phase, fsdp__trace_thread, t0, fsdp_now());
    if (path) fsdp__copy_utf8(e.text, sizeof e.text, path);
    fsdp__trace_add(ctx->trace, &e);
}

/* The optimizer's update of step `step` (the step count it produces), from t0 to now. */
FSDP__PRIVATE void fsdp__trace_update(fsdp_ctx *ctx, int64_t step, double t0) {
    fsdp__trace_event e;
    if (!ctx || !ctx->trace || t0 == 0) return;
    e = fsdp__trace_ev("step", "optimizer step", fsdp__trace_thread, t0, fsdp_now());
    e.step = step;
    fsdp__trace_add(ctx->trace, &e);
}

/* Which kind of group comm is (0 the world, 1 a HYBRID shard group, 2 a replica group), and
   its index among the groups of that kind. */
FSDP__PRIVATE int fsdp__trace_group(const fsdp_ctx *ctx, const fsdp_comm *comm, int *index) {
    int shard_size = ctx->hybrid_shard_comm ? fsdp_comm_size(ctx->hybrid_shard_comm) : 1;
    *index = 0;
    if (comm && comm == ctx->hybrid_shard_comm) return *index = ctx->rank / shard_size, 1;
    if (comm && comm == ctx->hybrid_replica_comm) return *index = ctx->rank % shard_size, 2;
    return 0;
}

/* Runs one collective of task t (the comm thread, or a waiter helping) and records it. */
FSDP__PRIVATE int fsdp__task_coll(fsdp_ctx *ctx, const fsdp__task *t, fsdp_comm *comm, fsdp_coll_kind kind,
                                  const void *send, void *recv, size_t count, fsdp_dtype dtype, fsdp_reduce_op op,
                                  uint32_t tag) {
    fsdp__trace_event e;
    int rc, g, index;
    double t0 = ctx->trace ? fsdp_now() : 0;
    if (kind == FSDP_COLL_BROADCAST) rc = fsdp_broadcast(comm, recv, count, dtype, t->root);
    else rc = fsdp__collective_tagged(comm, kind, send, recv, count, dtype, op, tag);
    if (!ctx->trace) return rc;
    e = fsdp__trace_ev("comm", fsdp_coll_name(kind), fsdp__trace_thread, t0, fsdp_now());
    g = fsdp__trace_group(ctx, comm, &index);
    e.unit = t->unit;
    e.group = g;
    e.group_index = index;
    e.seq = (int64_t)++ctx->trace->seq[g]; /* tasks run one at a time, in queue order (fsdp__run_task) */
    e.issued = t->issued;
    e.bytes = (int64_t)(count * fsdp_dtype_size(dtype) *
                        (kind == FSDP_COLL_ALL_GATHER || kind == FSDP_COLL_REDUCE_SCATTER ? (size_t)fsdp_comm_size(comm) : 1));
    fsdp__trace_add(ctx->trace, &e);
    return rc;
}

/* One event as JSON: ",\n{...}" (the file's first event has no comma before it). */
FSDP__PRIVATE void fsdp__trace_format(const fsdp_ctx *ctx, const fsdp__trace_event *e, fsdp__sbuf *b) {
    const fsdp__trace *tr = ctx->trace;
    const char *unit = e->unit >= 0 && e->unit < ctx->num_units ? fsdp__unit_name(ctx, e->unit) : NULL;
    int n = 0;
    fsdp__sbuf_printf(b, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"", ctx->rank, e->tid, e->cat);
    if (strcmp(e->cat, "iteration") == 0) fsdp__sbuf_printf(b, "step %lld", (long long)e->step);
    else fsdp__sbuf_jescape_as(b, e->name ? e->name : e->text, 1);
    if (unit) {
        fsdp__sbuf_str(b, " ");
        fsdp__sbuf_jescape_as(b, unit, 1);
    }
    fsdp__sbuf_printf(b, "\",\"ts\":%.3f,\"dur\":%.3f,\"args\":{", (e->t0 - tr->zero) * 1e6, (e->t1 - e->t0) * 1e6);
#define FSDP__TRACE_ARG (n++ ? "," : "")
    if (unit) {
        fsdp__sbuf_printf(b, "%s\"unit\":", FSDP__TRACE_ARG);
        fsdp__sbuf_jstring_as(b, unit, 1);
    }
    if (e->group >= 0) {
        fsdp__sbuf_printf(b, "%s\"op\":\"%s\",\"group\":\"%s", FSDP__TRACE_ARG, e->name, fsdp__trace_groups[e->group]);
        if (e->group) fsdp__sbuf_printf(b, "%d", e->group_index);
        fsdp__sbuf_printf(b, "\",\"seq\":%lld,\"issued_us\":%.3f", (long long)e->seq,
                          ((e->issued > 0 ? e->issued : e->t0) - tr->zero) * 1e6);
    }
    if (e->bytes >= 0) fsdp__sbuf_printf(b, "%s\"bytes\":%lld", FSDP__TRACE_ARG, (long long)e->bytes);
    if (e->step >= 0) fsdp__sbuf_printf(b, "%s\"step\":%lld", FSDP__TRACE_ARG, (long long)e->step);
    if (e->skipped) fsdp__sbuf_printf(b, "%s\"skipped\":1", FSDP__TRACE_ARG);
    if (strcmp(e->cat, "iteration") == 0)
        fsdp__sbuf_printf(b, "%s\"bytes_sent_host\":%llu,\"bytes_sent_net\":%llu", FSDP__TRACE_ARG,
                          (unsigned long long)e->sent_host, (unsigned long long)e->sent_net);
    if (e->wait_for) fsdp__sbuf_printf(b, "%s\"for\":\"%s\"", FSDP__TRACE_ARG, e->wait_for);
    if (e->text[0] && e->name) {
        fsdp__sbuf_printf(b, "%s\"path\":", FSDP__TRACE_ARG);
        fsdp__sbuf_jstring_as(b, e->text, 1);
    }
#undef FSDP__TRACE_ARG
    fsdp__sbuf_str(b, "}}");
}

/* Writes b to the trace file; a failure stops the trace with a warning (never the training). */
FSDP__PRIVATE void fsdp__trace_write(fsdp_ctx *ctx, fsdp__sbuf *b) {
    fsdp__trace *tr = ctx->trace;
    int failed = b->failed || (b->len && fwrite(b->data, 1, b->len, tr->file) != b->len) || fflush(tr->file) != 0;
    b->len = 0;
    b->failed = 0;
    if (!failed) return;
    fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: writing the trace %s failed (%s): tracing stops, training goes on",
              ctx->rank, tr->path, strerror(errno ? errno : EIO));
    pthread_mutex_lock(&tr->lock);
    tr->failed = 1;
    tr->len = 0;
    pthread_mutex_unlock(&tr->lock);
}

/* Writes the buffered events out (compute thread). The buffer is taken whole under the lock and
   formatted outside it, so recording threads never wait on the file. */
FSDP__PRIVATE void fsdp__trace_flush(fsdp_ctx *ctx) {
    fsdp__trace *tr = ctx->trace;
    fsdp__trace_event *events;
    size_t len, cap, i;
    fsdp__sbuf b;
    if (!tr || tr->failed) return;
    pthread_mutex_lock(&tr->lock);
    events = tr->events;
    len = tr->len;
    cap = tr->cap;
    tr->events = NULL;
    tr->len = tr->cap = 0;
    pthread_mutex_unlock(&tr->lock);
    memset(&b, 0, sizeof b);
    for (i = 0; i < len; i++) {
        fsdp__trace_format(ctx, &events[i], &b);
        if (b.len > ((size_t)1 << 20) || i + 1 == len) fsdp__trace_write(ctx, &b);
    }
    FSDP_FREE(b.data);
    pthread_mutex_lock(&tr->lock); /* the array back for reuse, unless a thread made a new one meanwhile */
    if (!tr->events) {
        tr->events = events;
        tr->cap = cap;
        tr->len = 0;
        events = NULL;
    }
    pthread_mutex_unlock(&tr->lock);
    FSDP_FREE(events);
}

/* Writes the buffered events out (compute thread) once at least `at_least` have gathered, as an
   event of its own; the time it ended (now if nothing was written). */
FSDP__PRIVATE double fsdp__trace_write_out(fsdp_ctx *ctx, size_t at_least) {
    fsdp__trace *tr = ctx->trace;
    fsdp__trace_event e;
    size_t len;
    double t0 = fsdp_now();
    pthread_mutex_lock(&tr->lock);
    len = tr->len;
    pthread_mutex_unlock(&tr->lock);
    if (len < at_least) return t0;
    fsdp__trace_flush(ctx);
    e = fsdp__trace_ev("trace", "trace write", FSDP__TID_COMPUTE, t0, fsdp_now());
    fsdp__trace_add(tr, &e);
    return e.t1;
}

/* The end of an iteration (fsdp_step): its span, and the buffered events written out when many
   (that write outside any iteration). Compute thread. */
FSDP__PRIVATE void fsdp__trace_iteration(fsdp_ctx *ctx, const fsdp_step_report *report) {
    fsdp__trace *tr = ctx->trace;
    fsdp__trace_event e;
    double now;
    if (!tr) return;
    now = fsdp_now();
    e = fsdp__trace_ev("iteration", "step", FSDP__TID_COMPUTE, tr->iteration_start ? tr->iteration_start : now, now);
    e.step = ++tr->iterations;
    e.skipped = report->skipped;
    e.sent_host = report->bytes_sent_host;
    e.sent_net = report->bytes_sent_net;
    fsdp__trace_add(tr, &e);
    tr->iteration_start = fsdp__trace_write_out(ctx, FSDP__TRACE_FLUSH);
}

/* From a hook, when far more than fsdp_step would have left have gathered: a loop without
   fsdp_step (evaluation, fsdp_finish_backward) must not grow the buffer forever. */
FSDP__PRIVATE void fsdp__trace_spill(fsdp_ctx *ctx) { fsdp__trace_write_out(ctx, 8 * FSDP__TRACE_FLUSH); }

/* The file's head: otherData (the clock alignment, the units), then the names of the rank and
   its threads. */
FSDP__PRIVATE void fsdp__trace_head(fsdp_ctx *ctx, fsdp__sbuf *b) {
    fsdp__trace *tr = ctx->trace;
    char host[256] = "";
    int i;
    gethostname(host, sizeof host - 1);
    fsdp__sbuf_printf(b, "{\"otherData\":{\"format\":\"fsdp.h-trace\",\"version\":1,\"rank\":%d,\"world\":%d,\"host\":",
                      ctx->rank, ctx->world);
    fsdp__sbuf_jstring_as(b, host, 1);
    fsdp__sbuf_printf(b, ",\"clock\":\"CLOCK_MONOTONIC, microseconds since rank 0's fsdp_init, aligned to rank 0\","
                      "\"clock_offset_us\":%.3f,\"clock_error_us\":%.3f,\"units\":[", tr->offset * 1e6, tr->error * 1e6);
    for (i = 0; i < ctx->num_units; i++) {
        fsdp__sbuf_str(b, i ? "," : "");
        fsdp__sbuf_jstring_as(b, fsdp__unit_name(ctx, i), 1);
    }
    fsdp__sbuf_printf(b, "]},\n\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\","
                      "\"args\":{\"name\":\"rank %d\"}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\","
                      "\"args\":{\"sort_index\":%d}}", ctx->rank, ctx->rank, ctx->rank, ctx->rank);
    for (i = 0; i < FSDP__TRACE_TIDS; i++)
        fsdp__sbuf_printf(b, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}",
                          ctx->rank, i, fsdp__trace_threads[i]);
}

/* This rank's clock against rank 0's (the section's comment). Collective. */
FSDP__PRIVATE int fsdp__trace_align(fsdp_ctx *ctx, fsdp__trace *tr) {
    double mine[2 * FSDP__TRACE_ROUNDS], *all, lo = -1e300, hi = 1e300;
    float probe[2] = {0, 0}, *probes;
    size_t bytes = (sizeof mine + sizeof probe) * (size_t)ctx->world;
    int k, rc;
    all = (double *)FSDP_MALLOC(bytes); /* the ranks' times, then their probes */
    if ((rc = fsdp__agree_alloc(ctx, all, bytes, "fsdp_init: the trace's clock alignment")) != 0) {
        FSDP_FREE(all);
        return rc;
    }
    probes = (float *)(all + 2 * FSDP__TRACE_ROUNDS * (size_t)ctx->world);
    for (k = 0; !rc && k < FSDP__TRACE_ROUNDS; k++) {
        mine[k] = fsdp_now();
        rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_GATHER, probe, probes, 2, 0);
        mine[FSDP__TRACE_ROUNDS + k] = fsdp_now();
    }
    if (!rc) rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_GATHER, mine, all, 2 * FSDP__TRACE_ROUNDS * 2, 0); /* doubles as pairs of f32 */
    for (k = 0; !rc && k < FSDP__TRACE_ROUNDS; k++) { /* rank 0's entries and exits are all[0..2R) */
        if (mine[k] - all[FSDP__TRACE_ROUNDS + k] > lo) lo = mine[k] - all[FSDP__TRACE_ROUNDS + k];
        if (mine[FSDP__TRACE_ROUNDS + k] - all[k] < hi) hi = mine[FSDP__TRACE_ROUNDS + k] - all[k];
    }
    if (!rc && ctx->rank != 0) {
        tr->offset = (lo + hi) / 2;
        tr->error = (hi - lo) / 2;
    }
    if (!rc) tr->zero = all[0] + tr->offset;
    FSDP_FREE(all);
    return rc;
}

/* This rank's trace file, made afresh (exclusively, as a temporary file renamed into place at
   once, relative to the checked directory): whatever was planted under its name (a FIFO that
   would block the open, another user's file that would receive the trace, a link) is replaced,
   never opened. The descriptor, or -1 with errno. */
FSDP__PRIVATE int fsdp__trace_create(int dir, const char *path) {
    char tmp[1200];
    int fd = fsdp__tmp_create(dir, path, tmp, sizeof tmp), err;
    if (fd < 0) return -1;
    if (fchmod(fd, 0644 & ~fsdp__umask()) == 0 && renameat(dir, fsdp__at_name(dir, tmp), dir, fsdp__at_name(dir, path)) == 0)
        return fd;
    err = errno;
    close(fd);
    unlinkat(dir, fsdp__at_name(dir, tmp), 0);
    errno = err;
    return -1;
}

/* Opens this rank's trace file when desc.trace_dir names a directory (made if missing; it must
   be this user's, as for checkpoints), then aligns the clocks; events are recorded from then on.
   Collective when tracing. */
FSDP__PRIVATE int fsdp__trace_open(fsdp_ctx *ctx) {
    const char *dir = ctx->desc.trace_dir;
    char why[256];
    fsdp__sbuf b;
    fsdp__trace *tr;
    int fd = -1, dir_fd = -1, local = 0, rc;
    if (!dir || !*dir) return 0;
    if ((tr = (fsdp__trace *)fsdp__calloc(sizeof *tr)) != NULL) {
        pthread_mutex_init(&tr->lock, NULL);
        ctx->trace = tr; /* (closed by fsdp_destroy on failure) */
        fsdp__fmt(tr->path, sizeof tr->path, "%s/trace-rank%05d.json", dir, ctx->rank);
    }
    if (!tr) local = fsdp__no_memory(ctx, sizeof *tr, "fsdp_init: the trace's state"); /* (told the others below) */
    else if (strlen(dir) > 1000) local = fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "the trace directory's name is too long");
    else if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        local = fsdp__fail(ctx, FSDP_ERR_IO, "cannot make the trace directory %s: %s", dir, strerror(errno));
    else if ((dir_fd = fsdp__dir_open(dir, why, sizeof why)) < 0)
        local = fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "trace directory %s: %s", dir, why);
    else if ((fd = fsdp__trace_create(dir_fd, tr->path)) < 0 || !(tr->file = fdopen(fd, "w")))
        local = fsdp__fail(ctx, FSDP_ERR_IO, "cannot write the trace %s: %s", tr->path, strerror(errno));
    if (fd >= 0 && !tr->file) close(fd);
    if (dir_fd >= 0) close(dir_fd);
    ctx->trace = NULL; /* the set-up's own collectives are not events */
    /* every rank traces or none: a rank without a trace directory fails its next collective on
       the fingerprint of this one (the message below says why on the ranks that trace) */
    rc = fsdp__agree(ctx, local);
    if (!rc) rc = fsdp__trace_align(ctx, tr);
    ctx->trace = tr;
    if (rc) {
        if (tr) tr->failed = 1; /* nothing more written */
        return fsdp__init_fail_ctx(ctx, rc, "fsdp_init: starting the trace (FSDP_TRACE or fsdp_desc.trace_dir, which must "
                                   "be set on every rank or on none) failed: %s", ctx->error);
    }
    memset(&b, 0, sizeof b);
    fsdp__trace_head(ctx, &b);
    fsdp__trace_write(ctx, &b);
    FSDP_FREE(b.data);
    return 0;
}

/* Writes what is left and the file's end (fsdp_destroy, after the threads stopped). */
FSDP__PRIVATE void fsdp__trace_close(fsdp_ctx *ctx) {
    fsdp__trace *tr = ctx->trace;
    if (!tr) return;
    if (tr->file) {
        fsdp__trace_flush(ctx);
        if (!tr->failed && (fputs("\n],\"displayTimeUnit\":\"ms\"}\n", tr->file) < 0 || fflush(tr->file) != 0))
            fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: writing the end of the trace %s failed: %s", ctx->rank, tr->path,
                      strerror(errno));
        if (tr->dropped)
            fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: the trace %s lacks %llu events (no memory to keep them)",
                      ctx->rank, tr->path, tr->dropped);
        fclose(tr->file);
    }
    FSDP_FREE(tr->events);
    pthread_mutex_destroy(&tr->lock);
    FSDP_FREE(tr);
    ctx->trace = NULL;
}

FSDP_API void fsdp_trace_span(fsdp_ctx *ctx, const char *name, double begin, double end) {
    fsdp__trace_event e;
    if (!ctx || !ctx->trace || !name || !(end >= begin) || begin <= 0) return;
    e = fsdp__trace_ev("user", NULL, fsdp__trace_thread, begin, end);
    if (e.tid == FSDP__TID_COMPUTE && ctx->trace->iteration_start == 0) ctx->trace->iteration_start = begin;
    fsdp__copy_utf8(e.text, sizeof e.text, name);
    fsdp__trace_add(ctx->trace, &e);
}

FSDP_API int fsdp_tracing(const fsdp_ctx *ctx) { return ctx && ctx->trace; }

/* ============================================================================================
   >>safetensors
   Safetensors files: CRC-32C, reading and checking, writing, atomic file replacement.
   ============================================================================================ */
static const uint32_t fsdp__crc32c_table[256] = {
    0x00000000u, 0xf26b8303u, 0xe13b70f7u, 0x1350f3f4u, 0xc79a971fu, 0x35f1141cu, 0x26a1e7e8u, 0xd4ca64ebu,
    0x8ad958cfu, 0x78b2dbccu, 0x6be22838u, 0x9989ab3bu, 0x4d43cfd0u, 0xbf284cd3u, 0xac78bf27u, 0x5e133c24u,
    0x105ec76fu, 0xe235446cu, 0xf165b798u, 0x030e349bu, 0xd7c45070u, 0x25afd373u, 0x36ff2087u, 0xc494a384u,
    0x9a879fa0u, 0x68ec1ca3u, 0x7bbcef57u, 0x89d76c54u, 0x5d1d08bfu, 0xaf768bbcu, 0xbc267848u, 0x4e4dfb4bu,
    0x20bd8edeu, 0xd2d60dddu, 0xc186fe29u, 0x33ed7d2au, 0xe72719c1u, 0x154c9ac2u, 0x061c6936u, 0xf477ea35u,
    0xaa64d611u, 0x580f5512u, 0x4b5fa6e6u, 0xb93425e5u, 0x6dfe410eu, 0x9f95c20du, 0x8cc531f9u, 0x7eaeb2fau,
    0x30e349b1u, 0xc288cab2u, 0xd1d83946u, 0x23b3ba45u, 0xf779deaeu, 0x05125dadu, 0x1642ae59u, 0xe4292d5au,
    0xba3a117eu, 0x4851927du, 0x5b016189u, 0xa96ae28au, 0x7da08661u, 0x8fcb0562u, 0x9c9bf696u, 0x6ef07595u,
    0x417b1dbcu, 0xb3109ebfu, 0xa0406d4bu, 0x522bee48u, 0x86e18aa3u, 0x748a09a0u, 0x67dafa54u, 0x95b17957u,
    0xcba24573u, 0x39c9c670u, 0x2a993584u, 0xd8f2b687u, 0x0c38d26cu, 0xfe53516fu, 0xed03a29bu, 0x1f682198u,
    0x5125dad3u, 0xa34e59d0u, 0xb01eaa24u, 0x42752927u, 0x96bf4dccu, 0x64d4cecfu, 0x77843d3bu, 0x85efbe38u,
    0xdbfc821cu, 0x2997011fu, 0x3ac7f2ebu, 0xc8ac71e8u, 0x1c661503u, 0xee0d9600u, 0xfd5d65f4u, 0x0f36e6f7u,
    0x61c69362u, 0x93ad1061u, 0x80fde395u, 0x72966096u, 0xa65c047du, 0x5437877eu, 0x4767748au, 0xb50cf789u,
    0xeb1fcbadu, 0x197448aeu, 0x0a24bb5au, 0xf84f3859u, 0x2c855cb2u, 0xdeeedfb1u, 0xcdbe2c45u, 0x3fd5af46u,
    0x7198540du, 0x83f3d70eu, 0x90a324fau, 0x62c8a7f9u, 0xb602c312u, 0x44694011u, 0x5739b3e5u, 0xa55230e6u,
    0xfb410cc2u, 0x092a8fc1u, 0x1a7a7c35u, 0xe811ff36u, 0x3cdb9bddu, 0xceb018deu, 0xdde0eb2au, 0x2f8b6829u,
    0x82f63b78u, 0x709db87bu, 0x63cd4b8fu, 0x91a6c88cu, 0x456cac67u, 0xb7072f64u, 0xa457dc90u, 0x563c5f93u,
    0x082f63b7u, 0xfa44e0b4u, 0xe9141340u, 0x1b7f9043u, 0xcfb5f4a8u, 0x3dde77abu, 0x2e8e845fu, 0xdce5075cu,
    0x92a8fc17u, 0x60c37f14u, 0x73938ce0u, 0x81f80fe3u, 0x55326b08u, 0xa759e80bu, 0xb4091bffu, 0x466298fcu,
    0x1871a4d8u, 0xea1a27dbu, 0xf94ad42fu, 0x0b21572cu, 0xdfeb33c7u, 0x2d80b0c4u, 0x3ed04330u, 0xccbbc033u,
    0xa24bb5a6u, 0x502036a5u, 0x4370c551u, 0xb11b4652u, 0x65d122b9u, 0x97baa1bau, 0x84ea524eu, 0x7681d14du,
    0x2892ed69u, 0xdaf96e6au, 0xc9a99d9eu, 0x3bc21e9du, 0xef087a76u, 0x1d63f975u, 0x0e330a81u, 0xfc588982u,
    0xb21572c9u, 0x407ef1cau, 0x532e023eu, 0xa145813du, 0x758fe5d6u, 0x87e466d5u, 0x94b49521u, 0x66df1622u,
    0x38cc2a06u, 0xcaa7a905u, 0xd9f75af1u, 0x2b9cd9f2u, 0xff56bd19u, 0x0d3d3e1au, 0x1e6dcdeeu, 0xec064eedu,
    0xc38d26c4u, 0x31e6a5c7u, 0x22b65633u, 0xd0ddd530u, 0x0417b1dbu, 0xf67c32d8u, 0xe52cc12cu, 0x1747422fu,
    0x49547e0bu, 0xbb3ffd08u, 0xa86f0efcu, 0x5a048dffu, 0x8ecee914u, 0x7ca56a17u, 0x6ff599e3u, 0x9d9e1ae0u,
    0xd3d3e1abu, 0x21b862a8u, 0x32e8915cu, 0xc083125fu, 0x144976b4u, 0xe622f5b7u, 0xf5720643u, 0x07198540u,
    0x590ab964u, 0xab613a67u, 0xb831c993u, 0x4a5a4a90u, 0x9e902e7bu, 0x6cfbad78u, 0x7fab5e8cu, 0x8dc0dd8fu,
    0xe330a81au, 0x115b2b19u, 0x020bd8edu, 0xf0605beeu, 0x24aa3f05u, 0xd6c1bc06u, 0xc5914ff2u, 0x37faccf1u,
    0x69e9f0d5u, 0x9b8273d6u, 0x88d28022u, 0x7ab90321u, 0xae7367cau, 0x5c18e4c9u, 0x4f48173du, 0xbd23943eu,
    0xf36e6f75u, 0x0105ec76u, 0x12551f82u, 0xe03e9c81u, 0x34f4f86au, 0xc69f7b69u, 0xd5cf889du, 0x27a40b9eu,
    0x79b737bau, 0x8bdcb4b9u, 0x988c474du, 0x6ae7c44eu, 0xbe2da0a5u, 0x4c4623a6u, 0x5f16d052u, 0xad7d5351u,
};

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#  include <nmmintrin.h>
#  define FSDP__CRC_HW 1
__attribute__((target("sse4.2"))) static uint32_t fsdp__crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) { c = _mm_crc32_u8((uint32_t)c, *p++); n--; }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#else
#  define FSDP__CRC_HW 0
#endif

FSDP_API uint32_t fsdp_crc32c(uint32_t crc, const void *data, size_t size) {
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
#if FSDP__CRC_HW
    if (__builtin_cpu_supports("sse4.2")) return ~fsdp__crc32c_hw(crc, p, size);
#endif
    while (size--) crc = fsdp__crc32c_table[(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

/* --- safetensors files ---------------------------------------------------------------------- */
#define FSDP__ST_MAX_HEADER ((uint64_t)100 << 20) /* the reference implementation's limit */
#define FSDP__INDEX_MAX_BYTES ((uint64_t)256 << 20)

struct fsdp_st_file {
    int fd;                      /* -1: in memory */
    const unsigned char *mem;
    uint64_t file_size, data_offset, data_size;
    int num_tensors, num_meta;
    fsdp_st_tensor *tensors;
    int *by_name;                /* tensor indices sorted by name: lookups in log time */
    uint32_t *crc;               /* each tensor's stored checksum, resolved once */
    unsigned char *has_crc, *crc_bad;
    const char **meta_keys, **meta_values;
    char *header;                /* the JSON text, strings decoded in place: names point into it */
    uint32_t header_crc;         /* of the header as read, for comparing what ranks opened */
    int64_t mtime_sec, mtime_nsec;
    char path[256];              /* printable, for messages */
};

static const char *fsdp__st_dtype_name(fsdp_dtype d) {
    return d == FSDP_F32 ? "F32" : d == FSDP_BF16 ? "BF16" : d == FSDP_F16 ? "F16" : "?";
}

FSDP_API void fsdp_st_close(fsdp_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    FSDP_FREE(f->header);
    FSDP_FREE(f->tensors);
    FSDP_FREE(f->by_name);
    FSDP_FREE(f->crc);
    FSDP_FREE(f->has_crc);
    FSDP_FREE(f->crc_bad);
    FSDP_FREE((void *)f->meta_keys);
    FSDP_FREE((void *)f->meta_values);
    FSDP_FREE(f);
}

static int fsdp__st_cmp_begin(const void *a, const void *b) {
    const fsdp_st_tensor *x = *(const fsdp_st_tensor *const *)a, *y = *(const fsdp_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static __thread const fsdp_st_file *fsdp__st_sorting; /* qsort has no context argument (per thread) */
static const char *fsdp__st_sorting_names(int i) { return fsdp__st_sorting->tensors[i].name; }

static int fsdp__st_cmp_name(const void *a, const void *b) {
    return strcmp(fsdp__st_sorting_names(*(const int *)a), fsdp__st_sorting_names(*(const int *)b));
}

FSDP_API int fsdp_st_find(const fsdp_st_file *f, const char *name) {
    int lo = 0, hi;
    if (!f || !name || !f->by_name) return -1;
    hi = f->num_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->tensors[f->by_name[mid]].name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

/* Sorts the names (duplicates are corrupt) and resolves each tensor's checksum from the
   metadata, so nothing later scans the header linearly. */
FSDP__PRIVATE int fsdp__st_index(fsdp_st_file *f, char *err, size_t err_size) {
    int i, n = f->num_tensors;
    char shown[80];
    f->by_name = (int *)FSDP_MALLOC(sizeof(int) * (size_t)(n + 1));
    f->crc = (uint32_t *)fsdp__calloc(sizeof(uint32_t) * (size_t)(n + 1));
    f->has_crc = (unsigned char *)fsdp__calloc((size_t)n + 1);
    f->crc_bad = (unsigned char *)fsdp__calloc((size_t)n + 1);
    if (!f->by_name || !f->crc || !f->has_crc || !f->crc_bad) return FSDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < n; i++) f->by_name[i] = i;
    fsdp__st_sorting = f;
    qsort(f->by_name, (size_t)n, sizeof(int), fsdp__st_cmp_name);
    fsdp__st_sorting = NULL;
    for (i = 1; i < n; i++)
        if (strcmp(f->tensors[f->by_name[i]].name, f->tensors[f->by_name[i - 1]].name) == 0)
            return fsdp__fmt(err, err_size, "tensor '%s' appears twice",
                             fsdp_printable(shown, sizeof shown, f->tensors[f->by_name[i]].name)), FSDP_ERR_CORRUPT;
    for (i = 0; i < f->num_meta; i++) {
        int t;
        char *end = NULL;
        unsigned long value;
        if (strncmp(f->meta_keys[i], "crc32c.", 7) != 0 || (t = fsdp_st_find(f, f->meta_keys[i] + 7)) < 0) continue;
        errno = 0;
        value = strtoul(f->meta_values[i], &end, 16);
        f->has_crc[t] = 1;
        f->crc_bad[t] = errno || !end || *end || strlen(f->meta_values[i]) != 8;
        f->crc[t] = (uint32_t)value;
    }
    return 0;
}

/* A JSON key as a walk sees it: decoded (fill walk), or the probe (count walk: "" when longer). */
#define FSDP__JSON_KEY(j, key, probe) ((j)->fill ? (key) : (probe))

/* One tensor's entry {"dtype": .., "shape": [..], "data_offsets": [begin, end]} (other keys are
   ignored). Both walks check its form, so that only entries that can be valid are counted;
   the fill walk (t set, its name too) also checks it against the data section. shown: the
   name, printable. */
FSDP__PRIVATE int fsdp__st_tensor_entry(fsdp_st_file *f, fsdp__json *j, fsdp_st_tensor *t, const char *shown, char *err,
                                        size_t err_size) {
    char probe[16], *key, *dtype = NULL;
    int seen = 0, r, have_dtype = 0, have_shape = 0, have_offsets = 0, ndim = 0;
    int64_t begin = 0, end = 0, shape[FSDP_MAX_DIMS];
    uint64_t numel = 1;
    fsdp__json_space(j);
    if (j->at >= j->end || *j->at != '{')
        return fsdp__fmt(err, err_size, "entry '%s' is not an object", shown), FSDP_ERR_CORRUPT;
    if (fsdp__json_open(j, '{', "expected '{'")) return FSDP_ERR_CORRUPT;
    while ((r = fsdp__json_more(j, '}', &seen)) > 0) {
        int k = 0, rk;
        const char *name;
        if (fsdp__json_key(j, &key, probe, sizeof probe)) return FSDP_ERR_CORRUPT;
        name = FSDP__JSON_KEY(j, key, probe);
        fsdp__json_space(j);
        if (strcmp(name, "dtype") == 0) {
            if (j->at >= j->end || *j->at != '"' || fsdp__json_string(j, &dtype, NULL, 0))
                return fsdp__fmt(err, err_size, "tensor '%s': dtype is not a string", shown), FSDP_ERR_CORRUPT;
            have_dtype = 1;
        } else if (strcmp(name, "shape") == 0) {
            if (j->at >= j->end || *j->at != '[' || fsdp__json_open(j, '[', "expected '['"))
                return fsdp__fmt(err, err_size, "tensor '%s': shape is not an array", shown), FSDP_ERR_CORRUPT;
            while ((rk = fsdp__json_more(j, ']', &k)) > 0) {
                int64_t d;
                if (fsdp__json_int(j, 0, INT64_MAX, &d, "a shape entry is not a non-negative integer"))
                    return fsdp__fmt(err, err_size, "tensor '%s': shape entry %d is not a non-negative integer", shown,
                                     k - 1), FSDP_ERR_CORRUPT;
                if (k <= FSDP_MAX_DIMS) shape[k - 1] = d;
            }
            if (rk < 0) return FSDP_ERR_CORRUPT;
            if (k > FSDP_MAX_DIMS)
                return fsdp__fmt(err, err_size, "tensor '%s' has %d dimensions (at most %d)", shown, k, FSDP_MAX_DIMS),
                       FSDP_ERR_CORRUPT;
            ndim = k;
            have_shape = 1;
        } else if (strcmp(name, "data_offsets") == 0) {
            int64_t v[2] = {0, 0};
            if (j->at >= j->end || *j->at != '[' || fsdp__json_open(j, '[', "expected '['")) rk = -1;
            else while ((rk = fsdp__json_more(j, ']', &k)) > 0 && k <= 2)
                if (fsdp__json_int(j, 0, INT64_MAX, &v[k - 1], "an offset is not a non-negative integer")) break;
            if (rk != 0 || k != 2 || v[1] < v[0])
                return fsdp__fmt(err, err_size, "tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end",
                                 shown), FSDP_ERR_CORRUPT;
            begin = v[0];
            end = v[1];
            have_offsets = 1;
        } else if (fsdp__json_skip(j)) {
            return FSDP_ERR_CORRUPT;
        }
    }
    if (r < 0) return FSDP_ERR_CORRUPT;
    if (!have_dtype || !have_shape || !have_offsets)
        return fsdp__fmt(err, err_size, "tensor '%s' lacks dtype, shape or data_offsets", shown), FSDP_ERR_CORRUPT;
    if (!t) return 0;
    if (strcmp(dtype, "F32") == 0) t->dtype = FSDP_F32;
    else if (strcmp(dtype, "BF16") == 0) t->dtype = FSDP_BF16;
    else if (strcmp(dtype, "F16") == 0) t->dtype = FSDP_F16;
    else {
        char kind[24];
        return fsdp__fmt(err, err_size, "tensor '%s' has unknown dtype '%s' (F32, BF16 and F16 are supported)", shown,
                         fsdp_printable(kind, sizeof kind, dtype)), FSDP_ERR_CORRUPT;
    }
    t->ndim = ndim;
    for (r = 0; r < ndim; r++) {
        uint64_t d = (uint64_t)shape[r];
        t->shape[r] = shape[r];
        if (d && numel > f->data_size / d) numel = f->data_size + 1; /* too big for the file */
        else numel *= d;
    }
    t->begin = (uint64_t)begin;
    t->end = (uint64_t)end;
    if (t->end > f->data_size)
        return fsdp__fmt(err, err_size, "tensor '%s': data_offsets [%llu, %llu] run past the data (%llu bytes)", shown,
                         (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)f->data_size),
               FSDP_ERR_CORRUPT;
    if (numel > f->data_size) /* the count was capped: no product below can wrap */
        return fsdp__fmt(err, err_size, "tensor '%s': shape holds more elements than the file has bytes", shown),
               FSDP_ERR_CORRUPT;
    if (numel > (t->end - t->begin) / fsdp_dtype_size(t->dtype) || numel * fsdp_dtype_size(t->dtype) != t->end - t->begin)
        return fsdp__fmt(err, err_size, "tensor '%s': shape holds %llu elements of %s but data_offsets span %llu bytes",
                         shown, (unsigned long long)numel, dtype, (unsigned long long)(t->end - t->begin)),
               FSDP_ERR_CORRUPT;
    t->numel = (int64_t)numel;
    return 0;
}

/* One walk over a safetensors header (see fsdp__json): the count walk checks the syntax and the
   form of every entry and sets num_tensors and num_meta; the fill walk fills the tables
   allocated from them and checks what the entries mean. */
FSDP__PRIVATE int fsdp__st_walk(fsdp_st_file *f, fsdp__json *j, char *err, size_t err_size) {
    int seen = 0, r, metadata_seen = 0, nt = 0, nm = 0, rc;
    fsdp__json_space(j);
    if (j->at >= j->end || *j->at != '{') return fsdp__fmt(err, err_size, "header is not a JSON object"), FSDP_ERR_CORRUPT;
    if (fsdp__json_open(j, '{', "expected '{'")) return FSDP_ERR_CORRUPT;
    while ((r = fsdp__json_more(j, '}', &seen)) > 0) {
        char probe[80], shown[80], *name;
        if (fsdp__json_key(j, &name, probe, sizeof probe)) return FSDP_ERR_CORRUPT;
        fsdp_printable(shown, sizeof shown, FSDP__JSON_KEY(j, name, probe));
        if (strcmp(FSDP__JSON_KEY(j, name, probe), "__metadata__") == 0) {
            int mseen = 0, mr;
            fsdp__json_space(j);
            if (j->at >= j->end || *j->at != '{')
                return fsdp__fmt(err, err_size, "__metadata__ is not a map of strings"), FSDP_ERR_CORRUPT;
            if (metadata_seen++)
                return fsdp__fmt(err, err_size, "__metadata__ is not a map of strings: it appears twice"), FSDP_ERR_CORRUPT;
            if (fsdp__json_open(j, '{', "expected '{'")) return FSDP_ERR_CORRUPT;
            while ((mr = fsdp__json_more(j, '}', &mseen)) > 0) {
                char *key, *value;
                if (fsdp__json_key(j, &key, probe, sizeof probe)) return FSDP_ERR_CORRUPT;
                fsdp__json_space(j);
                if (j->at >= j->end || *j->at != '"')
                    return fsdp__fmt(err, err_size, "__metadata__ value of '%s' is not a string",
                                     fsdp_printable(shown, sizeof shown, FSDP__JSON_KEY(j, key, probe))), FSDP_ERR_CORRUPT;
                if (fsdp__json_string(j, &value, NULL, 0)) return FSDP_ERR_CORRUPT;
                if (j->fill) {
                    f->meta_keys[nm] = key;
                    f->meta_values[nm] = value;
                }
                nm++;
            }
            if (mr < 0) return FSDP_ERR_CORRUPT;
            continue;
        }
        if (j->fill) f->tensors[nt].name = name;
        if ((rc = fsdp__st_tensor_entry(f, j, j->fill ? &f->tensors[nt] : NULL, shown, err, err_size)) != 0) return rc;
        nt++;
    }
    if (r < 0 || fsdp__json_finish(j)) return FSDP_ERR_CORRUPT;
    f->num_tensors = nt;
    f->num_meta = nm;
    return 0;
}

/* Checks that non-empty tensors do not overlap in the data, then indexes the names. */
FSDP__PRIVATE int fsdp__st_load_header(fsdp_st_file *f, char *err, size_t err_size) {
    const fsdp_st_tensor **sorted;
    int i, k, n = f->num_tensors;
    sorted = (const fsdp_st_tensor **)FSDP_MALLOC(sizeof *sorted * (size_t)(n + 1));
    if (!sorted) return FSDP_ERR_OUT_OF_MEMORY;
    for (i = 0; i < n; i++) sorted[i] = &f->tensors[i];
    qsort(sorted, (size_t)n, sizeof *sorted, fsdp__st_cmp_begin);
    for (i = 0, k = -1; i < n; i++) { /* k: the non-empty tensor reaching furthest so far */
        if (sorted[i]->end == sorted[i]->begin) continue;
        if (k >= 0 && sorted[i]->begin < sorted[k]->end) {
            char a[80], b[80];
            fsdp__fmt(err, err_size, "tensors '%s' and '%s' overlap in the data", fsdp_printable(a, sizeof a, sorted[k]->name),
                      fsdp_printable(b, sizeof b, sorted[i]->name));
            FSDP_FREE(sorted);
            return FSDP_ERR_CORRUPT;
        }
        if (k < 0 || sorted[i]->end > sorted[k]->end) k = i;
    }
    FSDP_FREE(sorted);
    return fsdp__st_index(f, err, err_size);
}

/* Reads exactly n bytes at offset, however the file system splits them (NFS, FUSE);
   0, or -1 (errno; EIO for a file that ended early). */
FSDP__PRIVATE int fsdp__pread_full(int fd, void *dst, size_t n, uint64_t offset) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, (char *)dst + done, n - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = EIO;
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

/* Reads and checks the 8-byte length and the header; data is the rest. */
FSDP__PRIVATE int fsdp__st_init(fsdp_st_file *f, const unsigned char *head8, char *err, size_t err_size) {
    uint64_t n = 0;
    fsdp__json j;
    int i, rc;
    for (i = 7; i >= 0; i--) n = (n << 8) | head8[i];
    if (f->file_size < 8 || n < 2 || n > f->file_size - 8 || n > FSDP__ST_MAX_HEADER) /* (the value is the file's bytes: not shown) */
        return fsdp__fmt(err, err_size, "the header length in the first 8 bytes does not fit a file of %llu bytes "
                         "(at most 100 MiB of header)", (unsigned long long)f->file_size), FSDP_ERR_CORRUPT;
    f->data_offset = 8 + n;
    f->data_size = f->file_size - f->data_offset;
    f->header = (char *)FSDP_MALLOC((size_t)n + 1);
    if (!f->header) return FSDP_ERR_OUT_OF_MEMORY;
    if (f->mem) memcpy(f->header, f->mem + 8, (size_t)n);
    else if (fsdp__pread_full(f->fd, f->header, (size_t)n, 8) != 0)
        return fsdp__fmt(err, err_size, "cannot read the header: %s", strerror(errno)), FSDP_ERR_IO;
    f->header[n] = 0;
    f->header_crc = fsdp_crc32c(0, f->header, (size_t)n);
    if (f->header[0] != '{') return fsdp__fmt(err, err_size, "header does not start with '{'"), FSDP_ERR_CORRUPT;
    while (n > 0 && f->header[n - 1] == ' ') n--; /* alignment padding */
    fsdp__json_start(&j, f->header, (size_t)n, 0, err, err_size); /* the syntax, before what it says */
    if (fsdp__json_skip(&j) || fsdp__json_finish(&j)) return FSDP_ERR_CORRUPT;
    fsdp__json_start(&j, f->header, (size_t)n, 0, err, err_size);
    if ((rc = fsdp__st_walk(f, &j, err, err_size)) != 0) return rc;
    f->tensors = (fsdp_st_tensor *)fsdp__calloc(sizeof *f->tensors * (size_t)(f->num_tensors + 1));
    f->meta_keys = (const char **)fsdp__calloc(sizeof(char *) * (size_t)(f->num_meta + 1));
    f->meta_values = (const char **)fsdp__calloc(sizeof(char *) * (size_t)(f->num_meta + 1));
    if (!f->tensors || !f->meta_keys || !f->meta_values) return FSDP_ERR_OUT_OF_MEMORY;
    fsdp__json_start(&j, f->header, (size_t)n, 1, err, err_size);
    if ((rc = fsdp__st_walk(f, &j, err, err_size)) != 0) return rc;
    return fsdp__st_load_header(f, err, err_size);
}

FSDP_API int fsdp_st_parse(fsdp_st_file **out, const void *bytes, size_t size, char *err, size_t err_size) {
    fsdp_st_file *f;
    int rc;
    char scratch[8];
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (out) *out = NULL;
    if (!out || (!bytes && size)) return FSDP_ERR_INVALID_ARG;
    f = (fsdp_st_file *)fsdp__calloc(sizeof *f);
    if (!f) return FSDP_ERR_OUT_OF_MEMORY;
    f->fd = -1;
    f->mem = (const unsigned char *)bytes;
    f->file_size = size;
    fsdp__copy_string(f->path, sizeof f->path, "(memory)");
    if (size < 8) { fsdp__fmt(err, err_size, "file of %zu bytes is shorter than the 8-byte header length", size); rc = FSDP_ERR_CORRUPT; }
    else rc = fsdp__st_init(f, f->mem, err, err_size);
    if (rc) { fsdp_st_close(f); return rc; }
    *out = f;
    return 0;
}

/* fsdp_st_open; nofollow: refuse a symbolic link as the last component (for files a
   checkpoint directory names, which must be the checkpoint's own). */
FSDP__PRIVATE int fsdp__st_open_file(fsdp_st_file **out, const char *path, int nofollow, char *err, size_t err_size) {
    fsdp_st_file *f;
    struct stat st;
    unsigned char head8[8];
    int rc;
    char scratch[8];
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (out) *out = NULL;
    if (!out || !path) return FSDP_ERR_INVALID_ARG;
    f = (fsdp_st_file *)fsdp__calloc(sizeof *f);
    if (!f) return FSDP_ERR_OUT_OF_MEMORY;
    fsdp_printable(f->path, sizeof f->path, path); /* for messages */
    /* O_NONBLOCK: a FIFO or device under the name must not block the open */
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
    if (f->fd < 0 || fstat(f->fd, &st) != 0) {
        fsdp__fmt(err, err_size, "%s: %s", f->path, nofollow && errno == ELOOP ? "a symbolic link (refused)" : strerror(errno));
        fsdp_st_close(f);
        return FSDP_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        fsdp__fmt(err, err_size, "%s is not a regular file", f->path);
        fsdp_st_close(f);
        return FSDP_ERR_IO;
    }
    f->file_size = (uint64_t)st.st_size;
    f->mtime_sec = (int64_t)st.st_mtim.tv_sec;
    f->mtime_nsec = (int64_t)st.st_mtim.tv_nsec;
    if (f->file_size < 8 || fsdp__pread_full(f->fd, head8, 8, 0) != 0) {
        fsdp__fmt(err, err_size, "%s: file of %llu bytes is shorter than the 8-byte header length", f->path,
                  (unsigned long long)f->file_size);
        fsdp_st_close(f);
        return FSDP_ERR_CORRUPT;
    }
    rc = fsdp__st_init(f, head8, err, err_size);
    if (rc) {
        char inner[FSDP__ERRMSG];
        fsdp__copy_string(inner, sizeof inner, err);
        fsdp__fmt(err, err_size, "%s: %s", f->path, inner);
        fsdp_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

FSDP_API int fsdp_st_open(fsdp_st_file **out, const char *path, char *err, size_t err_size) {
    return fsdp__st_open_file(out, path, 0, err, err_size);
}

FSDP_API int fsdp_st_num_tensors(const fsdp_st_file *f) { return f ? f->num_tensors : 0; }
FSDP_API const fsdp_st_tensor *fsdp_st_tensor_at(const fsdp_st_file *f, int i) {
    return f && i >= 0 && i < f->num_tensors ? &f->tensors[i] : NULL;
}
FSDP_API int fsdp_st_num_metadata(const fsdp_st_file *f) { return f ? f->num_meta : 0; }
FSDP_API fsdp_kv fsdp_st_metadata_at(const fsdp_st_file *f, int i) {
    fsdp_kv kv;
    kv.key = f && i >= 0 && i < f->num_meta ? f->meta_keys[i] : NULL;
    kv.value = kv.key ? f->meta_values[i] : NULL;
    return kv;
}
FSDP_API const char *fsdp_st_metadata(const fsdp_st_file *f, const char *key) {
    int i;
    for (i = 0; f && key && i < f->num_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* Reads bytes of the data section. */
FSDP__PRIVATE int fsdp__st_pread(fsdp_st_file *f, void *dst, size_t n, uint64_t at) {
    size_t done = 0;
    if (at + n > f->data_size) return -1;
    if (f->mem) { memcpy(dst, f->mem + f->data_offset + at, n); return 0; }
    while (done < n) {
        ssize_t got = pread(f->fd, (char *)dst + done, n - done, (off_t)(f->data_offset + at + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        done += (size_t)got;
    }
    return 0;
}

/* Reads elements [first, first + count) of a tensor: as f32 into out_f32, or raw (the stored
   dtype) into out_raw. */
FSDP__PRIVATE int fsdp__st_read_elements(fsdp_st_file *f, int tensor, int64_t first, int64_t count, float *out_f32,
                                         void *out_raw, char *err, size_t err_size) {
    const fsdp_st_tensor *t = fsdp_st_tensor_at(f, tensor);
    unsigned char block[65536];
    size_t esize;
    int64_t done = 0;
    char scratch[8], shown[80];
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (!t || first < 0 || count < 0 || first > t->numel || count > t->numel - first || (count && !out_f32 && !out_raw))
        return fsdp__fmt(err, err_size, "read of elements [%lld, %lld) outside the tensor", (long long)first,
                         (long long)(first + count)), FSDP_ERR_INVALID_ARG;
    esize = fsdp_dtype_size(t->dtype);
    while (done < count) {
        int64_t n = count - done < (int64_t)(sizeof block / esize) ? count - done : (int64_t)(sizeof block / esize);
        unsigned char *dst = out_raw ? (unsigned char *)out_raw + (size_t)done * esize : block;
        if (fsdp__st_pread(f, dst, (size_t)n * esize, t->begin + (uint64_t)(first + done) * esize) != 0)
            return fsdp__fmt(err, err_size, "%s: cannot read tensor '%s' (file truncated?)", f->path,
                             fsdp_printable(shown, sizeof shown, t->name)), FSDP_ERR_CORRUPT;
        if (!out_raw) fsdp__to_f32(out_f32 + done, block, t->dtype, (size_t)n);
        done += n;
    }
    return 0;
}

FSDP_API int fsdp_st_read(fsdp_st_file *f, int tensor, int64_t first, int64_t count, float *out, char *err,
                          size_t err_size) {
    if (!out && count) return FSDP_ERR_INVALID_ARG;
    return fsdp__st_read_elements(f, tensor, first, count, out, NULL, err, err_size);
}

FSDP_API int fsdp_st_read_raw(fsdp_st_file *f, int tensor, int64_t first, int64_t count, void *out, char *err,
                              size_t err_size) {
    if (!out && count) return FSDP_ERR_INVALID_ARG;
    return fsdp__st_read_elements(f, tensor, first, count, NULL, out, err, err_size);
}

FSDP_API uint64_t fsdp_st_header_size(const fsdp_st_file *f) { return f ? f->data_offset - 8 : 0; }

FSDP__PRIVATE int fsdp__st_crc(fsdp_st_file *f, const fsdp_st_tensor *t, uint32_t *crc) {
    unsigned char block[65536];
    uint64_t at = t->begin;
    *crc = 0;
    while (at < t->end) {
        size_t n = t->end - at < sizeof block ? (size_t)(t->end - at) : sizeof block;
        if (fsdp__st_pread(f, block, n, at) != 0) return -1;
        *crc = fsdp_crc32c(*crc, block, n);
        at += n;
    }
    return 0;
}

FSDP_API int fsdp_st_verify(fsdp_st_file *f, int tensor, char *err, size_t err_size) {
    const fsdp_st_tensor *t = fsdp_st_tensor_at(f, tensor);
    char scratch[8], shown[80];
    uint32_t got;
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (!t) return FSDP_ERR_INVALID_ARG;
    fsdp_printable(shown, sizeof shown, t->name);
    if (!f->has_crc[tensor]) return fsdp__fmt(err, err_size, "%s: tensor '%s' has no checksum", f->path, shown), FSDP_ERR_UNSUPPORTED;
    if (f->crc_bad[tensor]) return fsdp__fmt(err, err_size, "%s: checksum of '%s' is malformed", f->path, shown), FSDP_ERR_CORRUPT;
    if (fsdp__st_crc(f, t, &got) != 0)
        return fsdp__fmt(err, err_size, "%s: cannot read tensor '%s' (file truncated?)", f->path, shown), FSDP_ERR_CORRUPT;
    if (got != f->crc[tensor])
        return fsdp__fmt(err, err_size, "%s: tensor '%s' is corrupt (crc32c %08x, expected %08x)", f->path, shown,
                         (unsigned)got, (unsigned)f->crc[tensor]), FSDP_ERR_CORRUPT;
    return 0;
}

/* --- writing ------------------------------------------------------------------------------------ */
/* A writer streams the file through an aligned block with O_DIRECT where the filesystem allows:
   on a VM's disk the page cache's copy and writeback cost a core several times what the device
   takes (BENCHMARKS.md, section 7), and the bytes of a checkpoint are not read back soon. The
   last partial block and the checksums patched into the header go through the page cache. */
#define FSDP__ST_BLOCK ((size_t)4 << 20)

struct fsdp_st_writer {
    int fd;
    int dir;                  /* the directory the file is made in (its descriptor, not owned), or AT_FDCWD */
    char path[512], tmp[600];
    unsigned char *block;     /* O_DIRECT: bytes not yet written (block_len of FSDP__ST_BLOCK); NULL: plain writes */
    size_t block_len;
    uint64_t flushed;         /* bytes of the file written from blocks */
    int num_tensors, current, failed;
    uint64_t *bytes;          /* per tensor */
    uint64_t written;         /* of the current tensor */
    uint32_t *crcs;
    size_t *crc_at;           /* where each tensor's 8 hex digits sit in the file */
    fsdp_dtype *dtypes;
    char error[FSDP__ERRMSG];
};

/* Writes all of a buffer or fails. */
FSDP__PRIVATE int fsdp__write_all(int fd, const void *data, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = write(fd, (const char *)data + done, n - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        done += (size_t)got;
    }
    return 0;
}

/* The directory part of a path ("." or "/" where that is all there is); returns the base name. */
FSDP__PRIVATE const char *fsdp__split_path(const char *path, char *dir, size_t size) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (!slash) fsdp__copy_string(dir, size, ".");
    else if (n == 0) fsdp__copy_string(dir, size, "/");
    else {
        if (n >= size) n = size - 1;
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    return slash ? slash + 1 : path;
}

/* Files are made in a directory given as a descriptor, dir, so that a path that another user
   can repoint (a symbolic link on the way) is resolved once, when the directory is opened and
   checked; dir AT_FDCWD takes path as it is. path is the whole path, for messages; the name the
   *at calls get is its last component, or path itself under AT_FDCWD. */
FSDP__PRIVATE const char *fsdp__at_name(int dir, const char *path) {
    const char *slash = strrchr(path, '/');
    return dir == AT_FDCWD || !slash ? path : slash + 1;
}

/* The directory holding path, opened for reading (to list or fsync it): -1 with errno. */
FSDP__PRIVATE int fsdp__open_parent(int dir, const char *path) {
    char parent[600];
    if (dir != AT_FDCWD) return openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    fsdp__split_path(path, parent, sizeof parent);
    return open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* fsync the directory holding path, so a rename into it survives a crash. */
FSDP__PRIVATE int fsdp__fsync_dir(int dir, const char *path) {
    int fd = fsdp__open_parent(dir, path), rc;
    if (fd < 0) return -1;
    rc = fsync(fd);
    close(fd);
    return rc;
}

/* This host as temporary file names tell it: a checksum of the host name, the boot id and the
   pid namespace, so that on a shared file system a writer's pid is only judged where it means
   something. */
FSDP__PRIVATE uint32_t fsdp__host_id(void) {
    char facts[600];
    size_t n = 0;
    ssize_t got;
    int fd;
    memset(facts, 0, sizeof facts);
    if (gethostname(facts, 256) == 0) n = strlen(facts);
    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if ((got = read(fd, facts + n, 64)) > 0) n += (size_t)got;
        close(fd);
    }
    if ((got = readlink("/proc/self/ns/pid", facts + n, 64)) > 0) n += (size_t)got;
    return fsdp_crc32c(0, facts, n);
}

/* The process's umask, read without changing it (umask() would, for every thread). */
FSDP__PRIVATE mode_t fsdp__umask(void) {
    char line[128];
    mode_t mask = 022;
    FILE *f = fopen("/proc/self/status", "re");
    long value;
    if (!f) return mask;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Umask:", 6) == 0) {
            char *end = NULL;
            value = strtol(line + 6, &end, 8);
            if (end && end != line + 6 && value >= 0 && value <= 0777) mask = (mode_t)value;
            break;
        }
    fclose(f);
    return mask;
}

/* Removes "<path>.tmp.<host>-<pid>-<random>" files of killed writers: of this host, with a pid
   that is gone. Another host's file, or a live writer's, is left alone. */
FSDP__PRIVATE void fsdp__remove_stale_tmp(int dir, const char *path) {
    char parent[600], prefix[300], host[16];
    size_t plen;
    int fd;
    DIR *d;
    struct dirent *e;
    fsdp__fmt(prefix, sizeof prefix, "%s.tmp.", fsdp__split_path(path, parent, sizeof parent));
    fsdp__fmt(host, sizeof host, "%08x-", (unsigned)fsdp__host_id());
    plen = strlen(prefix);
    if ((fd = fsdp__open_parent(dir, path)) < 0) return;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        const char *rest = e->d_name + plen, *dash;
        char pid_text[16];
        long pid;
        if (strncmp(e->d_name, prefix, plen) != 0 || strncmp(rest, host, 9) != 0) continue;
        rest += 9;
        if (!(dash = strchr(rest, '-')) || dash - rest >= (long)sizeof pid_text) continue;
        memcpy(pid_text, rest, (size_t)(dash - rest));
        pid_text[dash - rest] = 0;
        if (fsdp__parse_int(pid_text, 1, 0x7fffffffL, &pid) != 0) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its writer may still be running */
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

/* Creates a fresh temporary file beside path (in dir: fsdp__at_name):
   "<path>.tmp.<host>-<pid>-<16 random hex>", O_EXCL | O_NOFOLLOW and mode 0600, so nothing can
   be planted under the name beforehand (a symlink to redirect the write) and nobody reads it
   before it is complete. Stale ones of killed writers on this host go first. The fd, or -1
   with errno. */
FSDP__PRIVATE int fsdp__tmp_create(int dir, const char *path, char *tmp, size_t tmp_size) {
    unsigned char random[8];
    char hex[17];
    fsdp__remove_stale_tmp(dir, path);
    if (fsdp__random_bytes(random, sizeof random) != 0) return -1;
    fsdp__hex(hex, random, sizeof random);
    if ((size_t)fsdp__fmt(tmp, tmp_size, "%s.tmp.%08x-%d-%s", path, (unsigned)fsdp__host_id(), (int)getpid(), hex) + 1 >=
        tmp_size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return openat(dir, fsdp__at_name(dir, tmp), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* Makes a complete temporary file final and closes fd: the mode a plain create would have
   given (0666 less the umask), fsync, rename over path, fsync of the directory. On failure
   before the rename the temporary file is removed and path is untouched: -1 with errno. Once
   the rename has happened the new file is in place, so the result is 0 even when the
   directory cannot be synced (then a warning, through the environment's logger as the
   callers have none: FSDP_DEBUG, says that the rename may not survive a crash). */
FSDP__PRIVATE int fsdp__tmp_commit(int fd, int dir, const char *tmp, const char *path) {
    int err = 0;
    if (fchmod(fd, 0666 & ~fsdp__umask()) != 0 || fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && renameat(dir, fsdp__at_name(dir, tmp), dir, fsdp__at_name(dir, path)) != 0) err = errno;
    if (err) {
        unlinkat(dir, fsdp__at_name(dir, tmp), 0);
        errno = err;
        return -1;
    }
    if (fsdp__fsync_dir(dir, path) != 0) {
        fsdp_logger none, logger;
        char shown[300];
        err = errno;
        memset(&none, 0, sizeof none);
        logger = fsdp__env_logger(none);
        fsdp__log(&logger, FSDP_LOG_WARN, "%s is written, but its directory could not be synced (%s): the new file may "
                  "not survive a crash of the machine", fsdp_printable(shown, sizeof shown, path), strerror(err));
    }
    return 0;
}

/* fsdp_write_file_atomic of path in dir (see fsdp__at_name). */
FSDP__PRIVATE int fsdp__write_file_at(int dir, const char *path, const void *data, size_t size, char *err, size_t err_size) {
    char tmp[1100];
    int fd;
    if ((fd = fsdp__tmp_create(dir, path, tmp, sizeof tmp)) < 0)
        return fsdp__fmt(err, err_size, "%s: cannot create a temporary file beside it: %s", path, strerror(errno)), FSDP_ERR_IO;
    if (fsdp__write_all(fd, data, size) != 0) {
        fsdp__fmt(err, err_size, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlinkat(dir, fsdp__at_name(dir, tmp), 0);
        return FSDP_ERR_IO;
    }
    if (fsdp__tmp_commit(fd, dir, tmp, path) != 0) return fsdp__fmt(err, err_size, "%s: %s", path, strerror(errno)), FSDP_ERR_IO;
    return 0;
}

FSDP_API int fsdp_write_file_atomic(const char *path, const void *data, size_t size, char *err, size_t err_size) {
    char scratch[8];
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (!path || (!data && size)) return fsdp__fmt(err, err_size, "fsdp_write_file_atomic: bad arguments"), FSDP_ERR_INVALID_ARG;
    return fsdp__write_file_at(AT_FDCWD, path, data, size, err, err_size);
}

/* O_DIRECT on the writer's file and its block, where both can be had (else plain writes). */
FSDP__PRIVATE void fsdp__st_writer_direct(fsdp_st_writer *w) {
#if defined(__linux__) && defined(O_DIRECT)
    int flags = w->fd >= 0 ? fcntl(w->fd, F_GETFL) : -1;
    if (flags < 0 || !(w->block = (unsigned char *)fsdp__aligned_alloc(FSDP__ST_BLOCK))) return;
    if (fcntl(w->fd, F_SETFL, flags | O_DIRECT) != 0) {
        fsdp__aligned_free(w->block);
        w->block = NULL;
    }
#else
    (void)w;
#endif
}

/* Writes the block at its place in the file (O_DIRECT: whole aligned blocks only). */
FSDP__PRIVATE int fsdp__st_flush_block(fsdp_st_writer *w) {
    size_t done = 0;
    while (done < w->block_len) {
        ssize_t n = pwrite(w->fd, w->block + done, w->block_len - done, (off_t)(w->flushed + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    w->flushed += w->block_len;
    w->block_len = 0;
    return 0;
}

/* Appends n bytes to the file: through the block with O_DIRECT, else written at once. */
FSDP__PRIVATE int fsdp__st_put(fsdp_st_writer *w, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    if (!w->block) return fsdp__write_all(w->fd, data, n);
    while (n > 0) {
        size_t take = FSDP__ST_BLOCK - w->block_len < n ? FSDP__ST_BLOCK - w->block_len : n;
        memcpy(w->block + w->block_len, p, take);
        w->block_len += take;
        p += take;
        n -= take;
        if (w->block_len == FSDP__ST_BLOCK && fsdp__st_flush_block(w) != 0) return -1;
    }
    return 0;
}

/* The last, partial block through the page cache (O_DIRECT off), so that the file ends where
   its bytes do. */
FSDP__PRIVATE int fsdp__st_finish_direct(fsdp_st_writer *w) {
#if defined(__linux__) && defined(O_DIRECT)
    int flags;
    if (!w->block) return 0;
    if ((flags = fcntl(w->fd, F_GETFL)) < 0 || fcntl(w->fd, F_SETFL, flags & ~O_DIRECT) != 0) return -1;
    if (fsdp__st_flush_block(w) != 0) return -1;
    fsdp__aligned_free(w->block);
    w->block = NULL;
#else
    (void)w;
#endif
    return 0;
}

FSDP_API void fsdp_st_writer_abort(fsdp_st_writer *w) {
    if (!w) return;
    if (w->fd >= 0) { close(w->fd); unlinkat(w->dir, fsdp__at_name(w->dir, w->tmp), 0); }
    fsdp__aligned_free(w->block);
    FSDP_FREE(w->bytes);
    FSDP_FREE(w->crcs);
    FSDP_FREE(w->crc_at);
    FSDP_FREE(w->dtypes);
    FSDP_FREE(w);
}

/* fsdp_st_writer_open of path in dir (see fsdp__at_name; dir stays open until the writer ends). */
FSDP__PRIVATE int fsdp__st_writer_open_at(fsdp_st_writer **out, int dir, const char *path, const fsdp_st_spec *specs, int num,
                                          const fsdp_kv *meta, int num_meta, char *err, size_t err_size) {
    fsdp_st_writer *w;
    fsdp__sbuf h;
    uint64_t offset = 0;
    int i, k;
    unsigned char len8[8];
    char scratch[8];
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (out) *out = NULL;
    if (!out || !path || num < 0 || (num && !specs) || num_meta < 0 || (num_meta && !meta) || strlen(path) >= 500)
        return fsdp__fmt(err, err_size, "fsdp_st_writer_open: bad arguments"), FSDP_ERR_INVALID_ARG;
    w = (fsdp_st_writer *)fsdp__calloc(sizeof *w);
    if (!w) return FSDP_ERR_OUT_OF_MEMORY;
    w->fd = -1;
    w->dir = dir;
    w->num_tensors = num;
    w->bytes = (uint64_t *)fsdp__calloc(sizeof(uint64_t) * (size_t)(num + 1));
    w->crcs = (uint32_t *)fsdp__calloc(sizeof(uint32_t) * (size_t)(num + 1));
    w->crc_at = (size_t *)fsdp__calloc(sizeof(size_t) * (size_t)(num + 1));
    w->dtypes = (fsdp_dtype *)fsdp__calloc(sizeof(fsdp_dtype) * (size_t)(num + 1));
    memset(&h, 0, sizeof h);
    if (!w->bytes || !w->crcs || !w->crc_at || !w->dtypes) { fsdp_st_writer_abort(w); return FSDP_ERR_OUT_OF_MEMORY; }
    for (i = 0; i < num_meta; i++)
        if (!meta[i].key || !meta[i].value || strncmp(meta[i].key, "crc32c.", 7) == 0 || strcmp(meta[i].key, "format") == 0) {
            char shown[80];
            fsdp__fmt(err, err_size, "metadata key '%s' is missing or reserved",
                      meta[i].key ? fsdp_printable(shown, sizeof shown, meta[i].key) : "(null)");
            fsdp_st_writer_abort(w);
            return FSDP_ERR_INVALID_ARG;
        }
    fsdp__sbuf_str(&h, "{\"__metadata__\":{\"format\":\"pt\"");
    for (i = 0; i < num_meta; i++) {
        fsdp__sbuf_str(&h, ",");
        fsdp__sbuf_jstring(&h, meta[i].key);
        fsdp__sbuf_str(&h, ":");
        fsdp__sbuf_jstring(&h, meta[i].value);
    }
    for (i = 0; i < num; i++) { /* checksums are patched in at close: fixed width placeholders */
        fsdp__sbuf_str(&h, ",\"crc32c.");
        fsdp__sbuf_jescape(&h, specs[i].name ? specs[i].name : "");
        fsdp__sbuf_str(&h, "\":\"");
        w->crc_at[i] = 8 + h.len;
        fsdp__sbuf_str(&h, "00000000\"");
    }
    fsdp__sbuf_str(&h, "}");
    for (i = 0; i < num; i++) {
        uint64_t numel = 1;
        const fsdp_st_spec *s = &specs[i];
        if (!s->name || !*s->name || !fsdp_dtype_size(s->dtype) || s->ndim < 0 || s->ndim > FSDP_MAX_DIMS) {
            fsdp__fmt(err, err_size, "tensor %d: needs a name, a dtype and 0..%d dimensions", i, FSDP_MAX_DIMS);
            FSDP_FREE(h.data);
            fsdp_st_writer_abort(w);
            return FSDP_ERR_INVALID_ARG;
        }
        for (k = 0; k < s->ndim; k++) { /* sizes a reader can take: every count and offset below 2^63 */
            uint64_t d = (uint64_t)s->shape[k];
            if (s->shape[k] < 0 || (d && numel > (uint64_t)INT64_MAX / d)) break;
            numel *= d;
        }
        if (k < s->ndim || numel > (uint64_t)INT64_MAX / fsdp_dtype_size(s->dtype) ||
            numel * fsdp_dtype_size(s->dtype) > (uint64_t)INT64_MAX - offset) {
            char shown[80];
            fsdp__fmt(err, err_size, "tensor '%s': its shape is negative or too large for a file",
                      fsdp_printable(shown, sizeof shown, s->name));
            FSDP_FREE(h.data);
            fsdp_st_writer_abort(w);
            return FSDP_ERR_INVALID_ARG;
        }
        w->dtypes[i] = s->dtype;
        w->bytes[i] = numel * fsdp_dtype_size(s->dtype);
        fsdp__sbuf_str(&h, ",");
        fsdp__sbuf_jstring(&h, s->name);
        fsdp__sbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", fsdp__st_dtype_name(s->dtype));
        for (k = 0; k < s->ndim; k++) fsdp__sbuf_printf(&h, k ? ",%lld" : "%lld", (long long)s->shape[k]);
        fsdp__sbuf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                          (unsigned long long)(offset + w->bytes[i]));
        offset += w->bytes[i];
    }
    fsdp__sbuf_str(&h, "}");
    while (!h.failed && (h.len % 8) != 0) fsdp__sbuf_str(&h, " "); /* data starts 8-aligned */
    if (h.failed) { FSDP_FREE(h.data); fsdp_st_writer_abort(w); return FSDP_ERR_OUT_OF_MEMORY; }
    fsdp__copy_string(w->path, sizeof w->path, path);
    w->fd = fsdp__tmp_create(dir, path, w->tmp, sizeof w->tmp);
    fsdp__st_writer_direct(w);
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    if (w->fd < 0 || fsdp__st_put(w, len8, 8) != 0 || fsdp__st_put(w, h.data, h.len) != 0) {
        fsdp__fmt(err, err_size, "%s: %s", w->fd < 0 ? w->tmp : path, strerror(errno));
        FSDP_FREE(h.data);
        fsdp_st_writer_abort(w);
        return FSDP_ERR_IO;
    }
    FSDP_FREE(h.data);
    while (w->current < num && w->bytes[w->current] == 0) w->current++;
    *out = w;
    return 0;
}

FSDP_API int fsdp_st_writer_open(fsdp_st_writer **out, const char *path, const fsdp_st_spec *specs, int num,
                                 const fsdp_kv *meta, int num_meta, char *err, size_t err_size) {
    return fsdp__st_writer_open_at(out, AT_FDCWD, path, specs, num, meta, num_meta, err, err_size);
}

FSDP_API int fsdp_st_writer_write(fsdp_st_writer *w, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    if (!w) return FSDP_ERR_INVALID_ARG;
    if (w->failed) return FSDP_ERR_IO;
    while (n > 0) {
        size_t take;
        if (w->current >= w->num_tensors) {
            fsdp__fmt(w->error, sizeof w->error, "%s: more data than the declared tensors hold", w->path);
            w->failed = 1;
            return FSDP_ERR_INVALID_ARG;
        }
        take = w->bytes[w->current] - w->written < n ? (size_t)(w->bytes[w->current] - w->written) : n;
        if (fsdp__st_put(w, p, take) != 0) {
            fsdp__fmt(w->error, sizeof w->error, "%s: %s", w->tmp, strerror(errno));
            w->failed = 1;
            return FSDP_ERR_IO;
        }
        w->crcs[w->current] = fsdp_crc32c(w->crcs[w->current], p, take);
        w->written += take;
        p += take;
        n -= take;
        if (w->written == w->bytes[w->current]) {
            w->written = 0;
            do w->current++; while (w->current < w->num_tensors && w->bytes[w->current] == 0);
        }
    }
    return 0;
}

FSDP_API int fsdp_st_writer_write_f32(fsdp_st_writer *w, const float *values, size_t count) {
    uint16_t block[4096];
    if (!w) return FSDP_ERR_INVALID_ARG;
    while (count > 0) {
        fsdp_dtype dt = w->current < w->num_tensors ? w->dtypes[w->current] : FSDP_F32;
        size_t left = w->current < w->num_tensors ? (size_t)((w->bytes[w->current] - w->written) / fsdp_dtype_size(dt)) : count;
        size_t n = count < left ? count : left;
        int rc;
        if (dt == FSDP_F32) rc = fsdp_st_writer_write(w, values, n * 4);
        else {
            if (n > 4096) n = 4096;
            fsdp__from_f32(block, dt, values, n);
            rc = fsdp_st_writer_write(w, block, n * 2);
        }
        if (rc) return rc;
        values += n;
        count -= n;
    }
    return 0;
}

FSDP_API int fsdp_st_writer_close(fsdp_st_writer *w, char *err, size_t err_size) {
    int i, rc = 0;
    char scratch[8];
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (!w) return FSDP_ERR_INVALID_ARG;
    if (w->failed) { fsdp__copy_string(err, err_size, w->error); rc = FSDP_ERR_IO; }
    else if (w->current < w->num_tensors) {
        fsdp__fmt(err, err_size, "%s: tensor %d of %d was not written completely", w->path, w->current, w->num_tensors);
        rc = FSDP_ERR_INVALID_ARG;
    }
    if (!rc && fsdp__st_finish_direct(w) != 0) {
        fsdp__fmt(err, err_size, "%s: %s", w->tmp, strerror(errno));
        rc = FSDP_ERR_IO;
    }
    for (i = 0; !rc && i < w->num_tensors; i++) {
        char hex[9];
        fsdp__fmt(hex, sizeof hex, "%08x", (unsigned)w->crcs[i]);
        if (pwrite(w->fd, hex, 8, (off_t)w->crc_at[i]) != 8) {
            fsdp__fmt(err, err_size, "%s: %s", w->tmp, strerror(errno));
            rc = FSDP_ERR_IO;
        }
    }
    if (!rc) {
        int fd = w->fd;
        w->fd = -1; /* closed by the commit, whatever happens */
        if (fsdp__tmp_commit(fd, w->dir, w->tmp, w->path) != 0) {
            fsdp__fmt(err, err_size, "%s: %s", w->path, strerror(errno));
            rc = FSDP_ERR_IO;
        }
    }
    fsdp_st_writer_abort(w); /* frees; the temporary file is gone or renamed */
    return rc;
}

/* ============================================================================================
   >>checkpoint
   ============================================================================================ */
/* --- checkpoints of a context --------------------------------------------------------------- */
/* This rank's failure to allocate bytes for what, its message naming both (for an agreement). */
FSDP__PRIVATE int fsdp__no_memory(fsdp_ctx *ctx, size_t bytes, const char *what) {
    return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory (no %zu bytes)", what, bytes);
}

/* Every rank learns the first failing rank's code and message, so a collective save or load
   fails everywhere with the same reason. Nothing here allocates: a rank out of memory takes part
   as any other (one that returned instead would leave the others waiting for it until their
   timeout). A sum says whether a rank failed; if one did, halving the range of ranks finds the
   first (log2(world) sums more), and it broadcasts its report. */
FSDP__PRIVATE int fsdp__agree(fsdp_ctx *ctx, int rc) {
    typedef struct { int32_t rc; char message[252]; } report;
    report first;
    float failed = rc != 0, any = 0;
    int lo = 0, hi = ctx->world, r;
    if ((r = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_REDUCE, &failed, &any, 1, 0)) != 0) return r;
    if (any == 0) return 0;
    while (hi - lo > 1) { /* the first failing rank is in [lo, hi) */
        int mid = lo + (hi - lo) / 2;
        float below = rc != 0 && ctx->rank < mid, count = 0;
        if ((r = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_REDUCE, &below, &count, 1, 0)) != 0) return r;
        if (count > 0) hi = mid;
        else lo = mid;
    }
    memset(&first, 0, sizeof first);
    if (ctx->rank == lo) {
        first.rc = rc;
        pthread_mutex_lock(&ctx->lock);
        fsdp__copy_string(first.message, sizeof first.message, ctx->error);
        pthread_mutex_unlock(&ctx->lock);
    }
    if ((r = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_BROADCAST, &first, &first, sizeof first / 4, lo)) != 0) return r;
    if (lo != ctx->rank) { /* a peer's text: read bounded and escaped */
        char shown[sizeof first.message];
        fsdp__fail(ctx, first.rc, "rank %d: %s", lo, fsdp__printable_n(shown, sizeof shown, first.message,
                                                                       sizeof first.message));
    }
    return first.rc;
}

/* Whether every rank got the memory of the collective that follows (block: this rank's, NULL if
   it got none; bytes and what name it in the message): a rank without it would return before the
   collective and leave the others waiting in it until their timeout, so all fail at once, naming
   it (fsdp__agree: one small all_reduce when none failed). The caller frees its block on failure. */
FSDP__PRIVATE int fsdp__agree_alloc(fsdp_ctx *ctx, const void *block, size_t bytes, const char *what) {
    return fsdp__agree(ctx, block ? 0 : fsdp__no_memory(ctx, bytes, what));
}

/* Saving and loading happen between iterations, with every reduction finished. */
FSDP__PRIVATE int fsdp__quiesce(fsdp_ctx *ctx, const char *what) {
    int ui, rc;
    if (ctx->phase != 0)
        return fsdp__fail(ctx, FSDP_ERR_STATE, "%s: call it between iterations (after fsdp_step or fsdp_finish_backward)", what);
    if ((rc = fsdp__wait_task(ctx, 0)) != 0 || (rc = fsdp__step_drain(ctx)) != 0) return rc;
    for (ui = 0; ui < ctx->num_units; ui++)
        if (ctx->units[ui].grad_full_pending)
            return fsdp__fail(ctx, FSDP_ERR_STATE, "%s: unit '%s' holds unreduced no_sync gradients", what, fsdp__unit_name(ctx, ui));
    return 0;
}

/* The optimizer state tensors of the context: "<param>.<state_names[k]>" for k < num_state (the
   row's own names: nothing is allocated, nothing can fail). */
static const char *const *fsdp__opt_suffixes(const fsdp_ctx *ctx, int *count) {
    *count = ctx->num_state;
    return ctx->optimizer->state_names;
}

static const char *fsdp__opt_name(const fsdp_ctx *ctx) { return fsdp__optimizer_name(ctx->optimizer); }

/* What a checkpoint stores of a unit, j-th (0 the f32 master shard, k + 1 the optimizer's state
   k), elements [first, first + count) of its shard as f32: a pointer into the shard where it is
   f32 in RAM, else the values read into *tmp (which the caller frees). NULL on failure (*rc). */
FSDP__PRIVATE const float *fsdp__unit_values(fsdp_ctx *ctx, const fsdp__unit *u, int j, int64_t first, int64_t count,
                                             float **tmp, int *rc) {
    const float *ram = j ? fsdp__home_f32(ctx, &u->opt[j - 1]) : u->master;
    *tmp = NULL;
    *rc = 0;
    if (ram) return ram + first;
    if (!(*tmp = (float *)FSDP_MALLOC(sizeof(float) * (size_t)(count ? count : 1)))) *rc = FSDP_ERR_OUT_OF_MEMORY;
    else if ((*rc = fsdp__vec_io(ctx, u, j ? FSDP__VEC_STATE + j - 1 : FSDP__VEC_MASTER, 0, first, count, *tmp)) != 0)
        FSDP_FREE(*tmp);
    if (!*rc) return *tmp;
    fsdp__offload_failed(ctx, *rc);
    return NULL;
}

/* A checkpoint tensor's name: the parameter's, or "<param>.<state name>"; allocated (NULL:
   out of memory). */
FSDP__PRIVATE char *fsdp__tensor_name(const char *param, const char *state) {
    size_t n = strlen(param) + (state ? strlen(state) + 1 : 0) + 1;
    char *name = (char *)FSDP_MALLOC(n);
    if (name) fsdp__fmt(name, n, state ? "%s.%s" : "%s", param, state);
    return name;
}

/* Whether to restore optimizer state: asked for, and saved by the same optimizer (strict: a
   different one is an error; otherwise the state is skipped with a warning). */
FSDP__PRIVATE int fsdp__opt_compatible(fsdp_ctx *ctx, const fsdp_load_options *opt, const char *saved, const char *what,
                                       int *load_opt) {
    char shown[80];
    *load_opt = opt && opt->with_optimizer;
    if (!*load_opt || !saved || strcmp(saved, fsdp__opt_name(ctx)) == 0) return 0;
    *load_opt = 0;
    fsdp_printable(shown, sizeof shown, saved); /* the checkpoint's word: escaped */
    if (opt->strict)
        return fsdp__fail(ctx, FSDP_ERR_INCOMPATIBLE, "%s: the checkpoint holds %s state but the context uses %s", what, shown,
                          fsdp__opt_name(ctx));
    fsdp__log(&ctx->logger, FSDP_LOG_WARN, "%s: the checkpoint holds %s state, the context uses %s: optimizer state not loaded",
              what, shown, fsdp__opt_name(ctx));
    return 0;
}

/* Metadata every checkpoint carries, plus the user's. */
FSDP__PRIVATE fsdp_kv *fsdp__ckpt_metadata(fsdp_ctx *ctx, const fsdp_save_options *opt, const char *kind, char store[8][64],
                                           int *count) {
    fsdp_kv *kv = (fsdp_kv *)fsdp__calloc(sizeof *kv * (size_t)(10 + (opt ? opt->num_metadata : 0)));
    int n = 0, i;
    if (!kv) return NULL;
    fsdp__fmt(store[0], 64, "%lld", (long long)ctx->step);
    fsdp__fmt(store[1], 64, "%lld", (long long)(opt ? opt->epoch : 0));
    fsdp__fmt(store[2], 64, "%d", ctx->world);
    fsdp__copy_string(store[3], 64, fsdp_strategy_name(ctx->desc.strategy ? ctx->desc.strategy : FSDP_FULL_SHARD));
    fsdp__copy_string(store[4], 64, fsdp__opt_name(ctx));
    fsdp__copy_string(store[5], 64, kind);
    kv[n].key = "step"; kv[n++].value = store[0];
    kv[n].key = "epoch"; kv[n++].value = store[1];
    kv[n].key = "world_size"; kv[n++].value = store[2];
    kv[n].key = "strategy"; kv[n++].value = store[3];
    kv[n].key = "optimizer"; kv[n++].value = store[4];
    kv[n].key = "fsdp.kind"; kv[n++].value = store[5];
    kv[n].key = "fsdp.version"; kv[n++].value = FSDP_VERSION_STRING;
    if (ctx->desc.loss_scale.enabled && opt && opt->with_optimizer) { /* GradScaler's state_dict */
        fsdp__fmt(store[6], 64, "%.9g", (double)ctx->loss_scale);
        fsdp__fmt(store[7], 64, "%lld", (long long)ctx->scale_growth_tracker);
        kv[n].key = "loss_scale"; kv[n++].value = store[6];
        kv[n].key = "loss_scale_growth_tracker"; kv[n++].value = store[7];
    }
    for (i = 0; opt && i < opt->num_metadata; i++) kv[n++] = opt->metadata[i];
    *count = n;
    return kv;
}

/* Gathers a unit's fp32 state (master, or an optimizer buffer) into flat [padded]. */
FSDP__PRIVATE int fsdp__gather_flat(fsdp_ctx *ctx, fsdp__unit *u, const float *shard, float *flat) {
    if (!u->shard_comm) { memcpy(flat, shard, sizeof(float) * (size_t)u->padded); return 0; }
    return fsdp__worker_coll(ctx, u->shard_comm, FSDP_COLL_ALL_GATHER, shard, flat, (size_t)u->shard, 0);
}

FSDP__PRIVATE int fsdp__save_full(fsdp_ctx *ctx, const char *path, const fsdp_save_options *opt) {
    const char *const *suffix = NULL;
    int nopt = 0, ntensors = 0, ui, k, j, rc, nmeta = 0, local = 0;
    fsdp_st_spec *specs = NULL;
    fsdp_st_writer *w = NULL;
    fsdp_kv *meta = NULL;
    char store[8][64], err[FSDP__ERRMSG] = "";
    float *flat[1 + FSDP_OPTIMIZER_MAX_STATE] = {NULL};
    size_t flat_bytes = 0;
    fsdp_dtype dtype;
    if (!ctx || !path) return FSDP_ERR_INVALID_ARG;
    dtype = opt && opt->dtype ? opt->dtype : FSDP_F32;
    if (!fsdp_dtype_size(dtype)) return fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "fsdp_save_full: bad dtype %d", (int)dtype);
    if ((rc = fsdp__quiesce(ctx, "fsdp_save_full")) != 0) return rc;
    if (opt && opt->with_optimizer) suffix = fsdp__opt_suffixes(ctx, &nopt);
    specs = (fsdp_st_spec *)fsdp__calloc(sizeof *specs * (size_t)(ctx->model->num_params * (1 + nopt) + 1));
    meta = fsdp__ckpt_metadata(ctx, opt, "full", store, &nmeta);
    if (!specs || !meta) { /* the others wait in the agreement below: this rank's failure goes there too */
        rc = fsdp__agree(ctx, fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_save_full: out of memory"));
        goto done;
    }
    for (ui = 0; ui < ctx->num_units; ui++) { /* file order = gather order: unit by unit */
        fsdp__unit *u = &ctx->units[ui];
        if ((size_t)u->padded * sizeof(float) > flat_bytes) flat_bytes = (size_t)u->padded * sizeof(float);
        for (k = 0; k < u->num_params; k++) {
            const fsdp__param *p = &ctx->model->params[ctx->unit_params[u->first_param + k]];
            for (j = 0; j <= (p->frozen ? 0 : nopt); j++) {
                fsdp_st_spec *s = &specs[ntensors++];
                s->name = fsdp__tensor_name(p->name, j ? suffix[j - 1] : NULL);
                s->dtype = j ? FSDP_F32 : dtype;
                s->ndim = p->ndim;
                memcpy(s->shape, p->shape, sizeof s->shape);
                if (!s->name) local = fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_save_full: out of memory");
            }
        }
    }
    if (!local && ctx->rank == 0 && fsdp_st_writer_open(&w, path, specs, ntensors, meta, nmeta, err, sizeof err) != 0)
        local = fsdp__fail(ctx, FSDP_ERR_IO, "fsdp_save_full: %s", err);
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    for (j = 0; j <= nopt; j++)
        if (!(flat[j] = (float *)fsdp__buf_get(ctx, flat_bytes, 0))) local = FSDP_ERR_OUT_OF_MEMORY;
    if ((rc = fsdp__agree(ctx, local ? fsdp__fail(ctx, local, "fsdp_save_full: out of memory") : 0)) != 0) goto done;
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        for (j = 0; j <= (u->frozen ? 0 : nopt); j++) { /* (offloaded state: one unit's shard in RAM at a time) */
            float *tmp;
            const float *values = fsdp__unit_values(ctx, u, j, 0, u->shard, &tmp, &rc);
            if (values) rc = fsdp__gather_flat(ctx, u, values, flat[j]);
            FSDP_FREE(tmp);
            if (rc) goto done;
        }
        for (k = 0; w && !local && k < u->num_params; k++) { /* rank 0 writes; the others only gather */
            int p = ctx->unit_params[u->first_param + k];
            for (j = 0; j <= (ctx->model->params[p].frozen ? 0 : nopt) && !local; j++)
                if (fsdp_st_writer_write_f32(w, flat[j] + ctx->plan.param_offset[p], (size_t)ctx->model->params[p].numel))
                    local = FSDP_ERR_IO;
        }
    }
    if (w) {
        if (fsdp_st_writer_close(w, err, sizeof err) != 0) local = fsdp__fail(ctx, FSDP_ERR_IO, "fsdp_save_full: %s", err);
        w = NULL;
    }
    rc = fsdp__agree(ctx, local);
done:
    if (w) fsdp_st_writer_abort(w);
    for (j = 0; j <= nopt; j++) fsdp__buf_put(ctx, flat[j], flat[j] ? flat_bytes : 0);
    for (k = 0; specs && k < ntensors; k++) FSDP_FREE((char *)specs[k].name);
    FSDP_FREE(specs);
    FSDP_FREE(meta);
    return rc;
}

FSDP_API int fsdp_save_full(fsdp_ctx *ctx, const char *path, const fsdp_save_options *opt) {
    double t0 = fsdp__trace_begin(ctx);
    int rc = fsdp__save_full(ctx, path, opt);
    fsdp__trace_ckpt(ctx, "save_full", path, t0);
    return rc;
}

/* Which checkpoint tensor feeds which state: a parameter or one of its optimizer buffers. */
/* 1: a parameter (*buffer -1); 2: optimizer state "<param>.<state name>" (*buffer: the state's
   index, or FSDP__STATE_NOT_KEPT); 0: neither. */
static int fsdp__match_name(const fsdp_ctx *ctx, const char *name, int *param, int *buffer) {
    const char *dot;
    char *base;
    *buffer = -1;
    if ((*param = fsdp__ctx_find_param(ctx, name)) >= 0) return 1;
    if (!(dot = strrchr(name, '.'))) return 0;
    if ((*buffer = fsdp__optimizer_state_index(ctx->optimizer, ctx->num_state, dot + 1)) == -1) return 0;
    if (!(base = (char *)FSDP_MALLOC((size_t)(dot - name) + 1))) return 0;
    memcpy(base, name, (size_t)(dot - name));
    base[dot - name] = 0;
    *param = fsdp__ctx_find_param(ctx, base);
    FSDP_FREE(base);
    return *param >= 0 ? 2 : 0;
}

/* Shape check for a tensor against parameter p; 0 if it fits. */
FSDP__PRIVATE int fsdp__shape_differs(const fsdp_ctx *ctx, int p, int ndim, const int64_t *shape, char *detail, size_t size) {
    const fsdp__param *mp = &ctx->model->params[p];
    int k, differs = ndim != mp->ndim;
    size_t n;
    for (k = 0; !differs && k < ndim; k++) differs = shape[k] != mp->shape[k];
    if (!differs) return 0;
    n = (size_t)fsdp__fmt(detail, size, "checkpoint [");
    for (k = 0; k < ndim && n < size; k++) n += (size_t)fsdp__fmt(detail + n, size - n, k ? ",%lld" : "%lld", (long long)shape[k]);
    if (n < size) n += (size_t)fsdp__fmt(detail + n, size - n, "], model [");
    for (k = 0; k < mp->ndim && n < size; k++) n += (size_t)fsdp__fmt(detail + n, size - n, k ? ",%lld" : "%lld", (long long)mp->shape[k]);
    if (n < size) fsdp__fmt(detail + n, size - n, "]");
    return 1;
}

typedef struct fsdp__problems {
    const fsdp_load_options *opt;
    fsdp_load_report *report;
    char summary[FSDP__ERRMSG];
    size_t used;
} fsdp__problems;

FSDP__PRIVATE void fsdp__problem(fsdp__problems *pr, const char *kind, const char *name, const char *detail) {
    if (strcmp(kind, "missing") == 0) pr->report->missing++;
    else if (strcmp(kind, "unexpected") == 0) pr->report->unexpected++;
    else pr->report->mismatched++;
    if (pr->opt && pr->opt->on_problem) pr->opt->on_problem(pr->opt->user, kind, name, detail);
    if (pr->used + 8 < sizeof pr->summary) { /* names may come from a file: shown printable */
        char shown_name[120], shown_detail[200];
        pr->used += (size_t)fsdp__fmt(pr->summary + pr->used, sizeof pr->summary - pr->used, "%s%s %s%s%s%s",
                                      pr->used ? "; " : "", kind, fsdp_printable(shown_name, sizeof shown_name, name),
                                      *detail ? " (" : "", fsdp_printable(shown_detail, sizeof shown_detail, detail),
                                      *detail ? ")" : "");
    }
}

/* Loads one parameter's (or optimizer buffer's) local slice from a reader callback. */
typedef int (*fsdp__slice_reader)(void *src, int64_t first, int64_t count, float *out, char *err, size_t err_size);

FSDP__PRIVATE int fsdp__load_slice(fsdp_ctx *ctx, int p, int buffer, fsdp__slice_reader read, void *src, char *err,
                                   size_t err_size) {
    const fsdp_param_info *info = &ctx->params[p];
    fsdp__unit *u = &ctx->units[info->unit];
    int64_t count = info->shard_end - info->shard_begin, at = fsdp__param_at(ctx, p);
    float *tmp, *ram = buffer < 0 ? u->master : fsdp__home_f32(ctx, &u->opt[buffer]);
    int rc;
    if (buffer == FSDP__STATE_NOT_KEPT || (buffer >= 0 && u->frozen)) return 0; /* (a frozen unit keeps no state) */
    if (ram) return read(src, info->shard_begin, count, ram + at, err, err_size); /* in place */
    if (!(tmp = (float *)FSDP_MALLOC(sizeof(float) * (size_t)(count ? count : 1)))) return FSDP_ERR_OUT_OF_MEMORY;
    rc = read(src, info->shard_begin, count, tmp, err, err_size);
    if (!rc && (rc = fsdp__vec_io(ctx, u, buffer < 0 ? FSDP__VEC_MASTER : FSDP__VEC_STATE + buffer, 1, at, count, tmp)) != 0)
        fsdp__fmt(err, err_size, "%s", rc == FSDP_ERR_OUT_OF_MEMORY ? "out of memory" : ctx->offload->message);
    FSDP_FREE(tmp);
    return rc;
}

typedef struct fsdp__st_src { fsdp_st_file *file; int tensor; } fsdp__st_src;
static int fsdp__read_st(void *src, int64_t first, int64_t count, float *out, char *err, size_t err_size) {
    fsdp__st_src *s = (fsdp__st_src *)src;
    return fsdp_st_read(s->file, s->tensor, first, count, out, err, err_size);
}

#define FSDP__COUNT_LIMIT ((int64_t)1 << 53) /* a step or epoch: exact in a double, far from overflow */

/* A count a checkpoint holds (step, epoch, loss_scale_growth_tracker: key), as metadata text or
   (text NULL) as index.json's number: the count if it lies in [0, limit), else -1; absent
   (NULL, or the index's -1) quietly, out of range or not a number with a warning (what the
   load does then: >>checkpoint). */
FSDP__PRIVATE int64_t fsdp__meta_count(fsdp_ctx *ctx, const char *what, const char *key, const char *text,
                                       int64_t number, int64_t limit) {
    char shown[80];
    if (text) {
        char *end = NULL;
        long long value;
        errno = 0;
        value = strtoll(text, &end, 10);
        number = errno || !*text || !end || *end ? -1 : (int64_t)value;
        if (number >= 0 && number < limit) return number;
        fsdp_printable(shown, sizeof shown, text);
    } else {
        if (number == -1 || (number >= 0 && number < limit)) return number;
        fsdp__fmt(shown, sizeof shown, "%lld", (long long)number);
    }
    fsdp__log(&ctx->logger, FSDP_LOG_WARN, "%s: the checkpoint's %s '%s' is not a count in [0, %lld): ignored, as if "
              "absent", what, key, shown, (long long)limit);
    return -1;
}

/* A checkpoint's GradScaler state, where loss scaling is on and the checkpoint has it: the scale
   if fsdp_desc.loss_scale would take it (fsdp__loss_scale_ok), the count if in
   [0, growth_interval) (0 if absent); either out of range is ignored with a warning. */
FSDP__PRIVATE void fsdp__loss_scale_restore(fsdp_ctx *ctx, const char *what, const char *scale, const char *tracker) {
    char *end = NULL, shown[80];
    double value;
    int64_t count;
    if (!ctx->desc.loss_scale.enabled || !scale) return;
    errno = 0;
    value = strtod(scale, &end);
    if (errno || !end || *end || !fsdp__loss_scale_ok(value)) {
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "%s: the checkpoint's loss_scale '%s' is not a finite normal float > 0: "
                  "ignored, the scale stays %g", what, fsdp_printable(shown, sizeof shown, scale),
                  (double)ctx->loss_scale);
        return;
    }
    ctx->loss_scale = (float)value;
    count = fsdp__meta_count(ctx, what, "loss_scale_growth_tracker", tracker ? tracker : "0", -1,
                             ctx->desc.loss_scale.growth_interval);
    if (count >= 0) ctx->scale_growth_tracker = count;
}

/* The ranks verify the checksums of a full file in turns, so each must have opened the very
   file the others did (not one replaced in between, nor another host's copy): same size,
   modification time and header, or the load fails naming the rank. Collective. */
FSDP__PRIVATE int fsdp__same_file(fsdp_ctx *ctx, const fsdp_st_file *f, const char *path) {
    typedef struct { uint64_t size; int64_t sec, nsec; uint32_t header_crc, pad; } identity;
    identity mine, *all;
    int r, rc;
    memset(&mine, 0, sizeof mine);
    mine.size = f->file_size;
    mine.sec = f->mtime_sec;
    mine.nsec = f->mtime_nsec;
    mine.header_crc = f->header_crc;
    all = (identity *)FSDP_MALLOC(sizeof mine * (size_t)ctx->world);
    if ((rc = fsdp__agree_alloc(ctx, all, sizeof mine * (size_t)ctx->world, "fsdp_load_full: the ranks' file identities")) != 0) {
        FSDP_FREE(all);
        return rc;
    }
    rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_GATHER, &mine, all, sizeof mine / 4, 0);
    for (r = 0; !rc && r < ctx->world; r++)
        if (memcmp(&all[r], &all[0], sizeof mine) != 0)
            rc = fsdp__fail(ctx, FSDP_ERR_IO, "fsdp_load_full: rank %d opened another file at %s than rank 0 (size, time "
                            "or header differ): was it replaced during the load, or do the hosts see different copies?",
                            r, path);
    FSDP_FREE(all);
    return rc;
}

FSDP__PRIVATE int fsdp__load_full(fsdp_ctx *ctx, const char *path, const fsdp_load_options *opt, fsdp_load_report *report) {
    fsdp_load_report local_report;
    fsdp__problems pr;
    fsdp_st_file *f = NULL;
    char err[FSDP__ERRMSG] = "", detail[200];
    int rc, local = 0, i, p, buffer, *seen = NULL, load_opt = 0;
    if (!report) report = &local_report;
    memset(report, 0, sizeof *report);
    report->step = report->epoch = -1;
    if (!ctx || !path) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__quiesce(ctx, "fsdp_load_full")) != 0) return rc;
    memset(&pr, 0, sizeof pr);
    pr.opt = opt;
    pr.report = report;
    if ((rc = fsdp_st_open(&f, path, err, sizeof err)) != 0) local = fsdp__fail(ctx, rc, "fsdp_load_full: %s", err);
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    seen = (int *)fsdp__calloc(sizeof(int) * (size_t)(ctx->model->num_params + 1));
    if (!seen) { rc = fsdp__agree(ctx, fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory")); goto done; }
    for (i = 0; i < fsdp_st_num_tensors(f); i++) { /* what the file has */
        const fsdp_st_tensor *t = fsdp_st_tensor_at(f, i);
        int kind = fsdp__match_name(ctx, t->name, &p, &buffer);
        if (!kind) { fsdp__problem(&pr, "unexpected", t->name, ""); continue; }
        if (kind == 1) seen[p] = 1; /* present, even if mis-shaped (reported as such, not as missing) */
        if (fsdp__shape_differs(ctx, p, t->ndim, t->shape, detail, sizeof detail)) fsdp__problem(&pr, "shape", t->name, detail);
    }
    for (p = 0; p < ctx->model->num_params; p++) /* what the model needs */
        if (!seen[p]) fsdp__problem(&pr, "missing", ctx->model->params[p].name, "");
    if (opt && opt->strict && (report->missing || report->unexpected || report->mismatched))
        local = fsdp__fail(ctx, FSDP_ERR_INCOMPATIBLE, "fsdp_load_full: %s does not match the model (%d missing, %d unexpected, "
                           "%d mis-shaped): %s", path, report->missing, report->unexpected, report->mismatched, pr.summary);
    if (!local) local = fsdp__opt_compatible(ctx, opt, fsdp_st_metadata(f, "optimizer"), "fsdp_load_full", &load_opt);
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    if ((rc = fsdp__same_file(ctx, f, path)) != 0) goto done;
    for (i = ctx->rank; !local && i < fsdp_st_num_tensors(f); i += ctx->world) /* the checksums, shared out */
        if ((rc = fsdp_st_verify(f, i, err, sizeof err)) != 0 && rc != FSDP_ERR_UNSUPPORTED)
            local = fsdp__fail(ctx, rc, "fsdp_load_full: %s", err);
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    for (i = 0; !local && i < fsdp_st_num_tensors(f); i++) { /* every rank reads only its slices */
        const fsdp_st_tensor *t = fsdp_st_tensor_at(f, i);
        fsdp__st_src src;
        int kind = fsdp__match_name(ctx, t->name, &p, &buffer);
        if (!kind || fsdp__shape_differs(ctx, p, t->ndim, t->shape, detail, sizeof detail)) continue;
        if (kind == 2 && !load_opt) continue;
        src.file = f;
        src.tensor = i;
        if ((rc = fsdp__load_slice(ctx, p, buffer, fsdp__read_st, &src, err, sizeof err)) != 0)
            local = fsdp__fail(ctx, rc, "fsdp_load_full: %s", err);
        else if (kind == 1) report->loaded++;
    }
    report->step = fsdp__meta_count(ctx, "fsdp_load_full", "step", fsdp_st_metadata(f, "step"), -1, FSDP__COUNT_LIMIT);
    report->epoch = fsdp__meta_count(ctx, "fsdp_load_full", "epoch", fsdp_st_metadata(f, "epoch"), -1, FSDP__COUNT_LIMIT);
    if (!local && load_opt && report->step >= 0) ctx->step = report->step;
    if (!local && load_opt)
        fsdp__loss_scale_restore(ctx, "fsdp_load_full", fsdp_st_metadata(f, "loss_scale"),
                                 fsdp_st_metadata(f, "loss_scale_growth_tracker"));
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    if (report->missing || report->unexpected || report->mismatched)
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "fsdp_load_full: loaded %d tensors; not loaded: %s", report->loaded, pr.summary);
done:
    FSDP_FREE(seen);
    fsdp_st_close(f);
    return rc;
}

FSDP_API int fsdp_load_full(fsdp_ctx *ctx, const char *path, const fsdp_load_options *opt, fsdp_load_report *report) {
    double t0 = fsdp__trace_begin(ctx);
    int rc = fsdp__load_full(ctx, path, opt, report);
    fsdp__trace_ckpt(ctx, "load_full", path, t0);
    return rc;
}

/* --- sharded checkpoints -------------------------------------------------------------------- */
/* The ranks whose shards are written: one copy of each slice (replicas write nothing). */
static int fsdp__writes_shard(const fsdp_ctx *ctx, const fsdp__unit *u) {
    if (u->strategy == FSDP_NO_SHARD) return ctx->rank == 0;
    if (u->strategy == FSDP_HYBRID_SHARD) return ctx->rank < u->group_size;
    return 1;
}

FSDP__PRIVATE void fsdp__shard_file_name(char *out, size_t size, uint32_t nonce, int rank) {
    fsdp__fmt(out, size, "shard-%08x-%05d.safetensors", (unsigned)nonce, rank);
}

/* What a sharded save writes: the tensors' dtype, the optimizer state names (nopt of them, none
   without with_optimizer), the metadata, and the name of this save's files. */
typedef struct fsdp__sharded_save {
    const fsdp_save_options *opt;
    fsdp_dtype dtype;
    const char *const *suffix;
    int nopt, nmeta;
    fsdp_kv *meta;
    uint32_t nonce;
    const char *dir;
    int dir_fd;            /* dir opened and checked (fsdp__dir_open); -1 when not */
} fsdp__sharded_save;

/* Calls fn for each tensor of this rank's shard file, in the file's order: the slice of every
   parameter it holds a copy of (j = 0; replicas hold none), then that slice's optimizer state
   j = 1..nopt (none for frozen parameters); after a unit's parameters its error feedback residual
   (p = -1), where it keeps one. Stops at the first nonzero result, its return. */
typedef int (*fsdp__piece_fn)(fsdp_ctx *ctx, const fsdp__unit *u, int p, int j, void *user);
FSDP__PRIVATE int fsdp__each_piece(fsdp_ctx *ctx, int nopt, fsdp__piece_fn fn, void *user) {
    int ui, k, j, rc;
    for (ui = 0; ui < ctx->num_units; ui++) {
        const fsdp__unit *u = &ctx->units[ui];
        if (!fsdp__writes_shard(ctx, u)) continue;
        for (k = 0; k < u->num_params; k++) {
            int p = ctx->unit_params[u->first_param + k];
            if (ctx->params[p].shard_end == ctx->params[p].shard_begin) continue;
            for (j = 0; j <= (ctx->model->params[p].frozen ? 0 : nopt); j++)
                if ((rc = fn(ctx, u, p, j, user)) != 0) return rc;
        }
        if (u->residual && (rc = fn(ctx, u, -1, 0, user)) != 0) return rc;
    }
    return 0;
}

static int64_t fsdp__piece_len(const fsdp_ctx *ctx, int p) { return ctx->params[p].shard_end - ctx->params[p].shard_begin; }
/* A piece's elements: a parameter's slice, or (p < 0) unit u's residual. */
static int64_t fsdp__piece_count(const fsdp_ctx *ctx, const fsdp__unit *u, int p) {
    return p < 0 ? u->residual_numel : fsdp__piece_len(ctx, p);
}

#define FSDP__RESIDUAL_PREFIX "__grad_residual__."
/* The checkpoint tensor of unit ui's error feedback residual: "__grad_residual__.<unit>"
   (malloc'd; NULL when out of memory). */
FSDP__PRIVATE char *fsdp__residual_name(const fsdp_ctx *ctx, int ui) {
    const char *unit = fsdp__unit_name(ctx, ui);
    char *name = (char *)FSDP_MALLOC(sizeof FSDP__RESIDUAL_PREFIX + strlen(unit));
    if (name) fsdp__fmt(name, sizeof FSDP__RESIDUAL_PREFIX + strlen(unit), "%s%s", FSDP__RESIDUAL_PREFIX, unit);
    return name;
}

typedef struct fsdp__shard_writing {
    const fsdp__sharded_save *sv;
    fsdp_st_spec *specs;
    int n;
    fsdp_st_writer *w;
    const float *staged;   /* the values in file order (an asynchronous save's snapshot), or NULL */
    int64_t at;            /* elements of staged written */
    char *err;
    size_t err_size;
} fsdp__shard_writing;

FSDP__PRIVATE int fsdp__piece_spec(fsdp_ctx *ctx, const fsdp__unit *u, int p, int j, void *user) {
    fsdp__shard_writing *sw = (fsdp__shard_writing *)user;
    fsdp_st_spec *spec = &sw->specs[sw->n];
    spec->name = p < 0 ? fsdp__residual_name(ctx, (int)(u - ctx->units))
                       : fsdp__tensor_name(ctx->model->params[p].name, j ? sw->sv->suffix[j - 1] : NULL);
    if (!spec->name) return fsdp__fmt(sw->err, sw->err_size, "out of memory"), FSDP_ERR_OUT_OF_MEMORY;
    sw->n++;
    spec->dtype = j || p < 0 ? FSDP_F32 : sw->sv->dtype;
    spec->ndim = 1;
    spec->shape[0] = fsdp__piece_count(ctx, u, p);
    return 0;
}

FSDP__PRIVATE int fsdp__piece_write(fsdp_ctx *ctx, const fsdp__unit *u, int p, int j, void *user) {
    fsdp__shard_writing *sw = (fsdp__shard_writing *)user;
    int64_t len = fsdp__piece_count(ctx, u, p);
    float *tmp = NULL;
    int rc = 0;
    const float *values = sw->staged ? sw->staged + sw->at
                          : p < 0    ? u->residual
                                     : fsdp__unit_values(ctx, u, j, fsdp__param_at(ctx, p), len, &tmp, &rc);
    sw->at += len;
    if (values && fsdp_st_writer_write_f32(sw->w, values, (size_t)len)) rc = FSDP_ERR_IO; /* (close says why) */
    if (rc && !values) fsdp__copy_string(sw->err, sw->err_size, ctx->offload ? ctx->offload->message : "out of memory");
    FSDP_FREE(tmp);
    return rc;
}

/* This rank's shard file: its pieces (fsdp__each_piece), each a 1-D tensor, from staged when
   not NULL (in file order), else from the context's state. Local: the compute thread, or an
   asynchronous save's writer. 0, or the failure with why in err. */
FSDP__PRIVATE int fsdp__write_shard_file(fsdp_ctx *ctx, const fsdp__sharded_save *sv, const float *staged, char *err,
                                         size_t err_size) {
    fsdp__shard_writing sw;
    char path[1024], file[64];
    int rc, k;
    memset(&sw, 0, sizeof sw);
    sw.sv = sv;
    sw.staged = staged;
    sw.err = err;
    sw.err_size = err_size;
    *err = 0;
    sw.specs = (fsdp_st_spec *)fsdp__calloc(sizeof *sw.specs *
                                            (size_t)(ctx->model->num_params * (1 + sv->nopt) + ctx->num_units + 1));
    if (!sw.specs) return fsdp__fmt(err, err_size, "out of memory"), FSDP_ERR_OUT_OF_MEMORY;
    rc = fsdp__each_piece(ctx, sv->nopt, fsdp__piece_spec, &sw);
    fsdp__shard_file_name(file, sizeof file, sv->nonce, ctx->rank);
    fsdp__fmt(path, sizeof path, "%s/%s", sv->dir, file);
    if (!rc && sw.n > 0 &&
        (rc = fsdp__st_writer_open_at(&sw.w, sv->dir_fd, path, sw.specs, sw.n, sv->meta, sv->nmeta, err, err_size)) != 0)
        rc = FSDP_ERR_IO;
    if (sw.w && !rc) rc = fsdp__each_piece(ctx, sv->nopt, fsdp__piece_write, &sw);
    if (sw.w && (!rc || !*err)) { /* closed (renamed into place) when whole; a failed write's reason from it */
        int closed = fsdp_st_writer_close(sw.w, err, err_size);
        if (!rc) rc = closed;
    } else if (sw.w) {
        fsdp_st_writer_abort(sw.w);
    }
    for (k = 0; k < sw.n; k++) FSDP_FREE((char *)sw.specs[k].name);
    FSDP_FREE(sw.specs);
    return rc;
}

/* Group rank g's piece of parameter p (of unit u) as elements [*lo, *hi) of the parameter: the
   part of [g*S, (g+1)*S) of the flat parameter that is p's. 0 if it holds none of p. The
   writers are group ranks 0..writers-1 (NO_SHARD: rank 0; the others: the first shard group),
   which are the job's ranks of the same numbers. */
FSDP__PRIVATE int fsdp__index_piece(const fsdp_ctx *ctx, const fsdp__unit *u, int p, int g, int64_t *lo, int64_t *hi) {
    int64_t off = ctx->plan.param_offset[p], end = off + ctx->model->params[p].numel;
    *lo = (int64_t)g * u->shard;
    *hi = *lo + u->shard;
    if (*lo < off) *lo = off;
    if (*hi > end) *hi = end;
    *lo -= off;
    *hi -= off;
    return *hi > *lo;
}

static int fsdp__index_writers(const fsdp__unit *u) { return u->strategy == FSDP_NO_SHARD ? 1 : u->group_size; }

/* The ranks that write a shard file, as index.json lists them: those holding a piece of some
   parameter (a NO_SHARD rank above 0, a HYBRID_SHARD replica or a rank of padding only writes
   none, so it is not listed). file[r]: rank r's place in the list, or -1; returns the count. */
FSDP__PRIVATE int fsdp__index_files(const fsdp_ctx *ctx, int *file) {
    int p, g, n = 0;
    int64_t lo, hi;
    for (g = 0; g < ctx->world; g++) file[g] = -1;
    for (p = 0; p < ctx->num_units; p++) /* error feedback: every rank keeps a residual of that unit */
        for (g = 0; ctx->units[p].residual && g < ctx->world; g++) file[g] = 0;
    for (p = 0; p < ctx->model->num_params; p++) {
        const fsdp__unit *u = &ctx->units[ctx->plan.unit_of_param[p]];
        for (g = 0; g < fsdp__index_writers(u); g++)
            if (fsdp__index_piece(ctx, u, p, g, &lo, &hi)) file[g] = 0;
    }
    for (g = 0; g < ctx->world; g++)
        if (file[g] == 0) file[g] = n++;
    return n;
}

/* index.json's entries of the error feedback residuals (after the parameters' and their state's):
   per unit that keeps one, "__grad_residual__.<unit>" of world x (hosts x shard) floats, rank r's
   in its own file at [r R, r R + R). Every rank's residual depends on the layout, so a load takes
   it only at the same world size and shard (fsdp__load_residuals). */
FSDP__PRIVATE void fsdp__index_residuals(fsdp_ctx *ctx, const int *file_of, fsdp__sbuf *b) {
    int ui, r;
    for (ui = 0; ui < ctx->num_units && !b->failed; ui++) {
        const fsdp__unit *u = &ctx->units[ui];
        char *name = u->residual ? fsdp__residual_name(ctx, ui) : NULL;
        if (!u->residual) continue;
        if (!name) {
            b->failed = 1;
            return;
        }
        fsdp__sbuf_str(b, ctx->model->num_params ? "," : "");
        fsdp__sbuf_jstring(b, name);
        FSDP_FREE(name);
        fsdp__sbuf_printf(b, ":{\"dtype\":\"F32\",\"shape\":[%lld],\"pieces\":[",
                          (long long)u->residual_numel * ctx->world);
        for (r = 0; r < ctx->world; r++)
            fsdp__sbuf_printf(b, "%s[%d,%lld,%lld]", r ? "," : "", file_of[r], (long long)u->residual_numel * r,
                              (long long)u->residual_numel * (r + 1));
        fsdp__sbuf_str(b, "]}");
    }
}

/* index.json's text: the metadata, the files, and per tensor its dtype, shape and which element
   ranges lie in which file (fsdp__index_piece, in the file of fsdp__index_files). */
FSDP__PRIVATE void fsdp__index_text(fsdp_ctx *ctx, const fsdp__sharded_save *sv, fsdp__sbuf *b) {
    char file[64];
    int k, r, p, j, n = 0, *file_of = (int *)FSDP_MALLOC(sizeof(int) * (size_t)ctx->world);
    if (!file_of) {
        b->failed = 1;
        return;
    }
    fsdp__index_files(ctx, file_of);
    fsdp__sbuf_printf(b, "{\"format\":\"fsdp.h-sharded\",\"version\":1,\"world_size\":%d,\"step\":%lld,\"epoch\":%lld,",
                      ctx->world, (long long)ctx->step, (long long)(sv->opt ? sv->opt->epoch : 0));
    fsdp__sbuf_str(b, "\"metadata\":{");
    for (k = 0; k < sv->nmeta; k++) {
        fsdp__sbuf_str(b, k ? "," : "");
        fsdp__sbuf_jstring(b, sv->meta[k].key);
        fsdp__sbuf_str(b, ":");
        fsdp__sbuf_jstring(b, sv->meta[k].value);
    }
    fsdp__sbuf_str(b, "},\"files\":[");
    for (r = 0; r < ctx->world; r++) {
        if (file_of[r] < 0) continue;
        fsdp__shard_file_name(file, sizeof file, sv->nonce, r);
        fsdp__sbuf_printf(b, "%s\"%s\"", n++ ? "," : "", file);
    }
    fsdp__sbuf_str(b, "],\"tensors\":{");
    for (p = 0; p < ctx->model->num_params && !b->failed; p++) {
        const fsdp__param *mp = &ctx->model->params[p];
        const fsdp__unit *u = &ctx->units[ctx->plan.unit_of_param[p]];
        for (j = 0; j <= (mp->frozen ? 0 : sv->nopt); j++) {
            char *name = fsdp__tensor_name(mp->name, j ? sv->suffix[j - 1] : NULL);
            int g, first = 1;
            int64_t lo, hi;
            if (!name) {
                b->failed = 1;
                break;
            }
            fsdp__sbuf_str(b, p || j ? "," : "");
            fsdp__sbuf_jstring(b, name);
            FSDP_FREE(name);
            fsdp__sbuf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", fsdp__st_dtype_name(j ? FSDP_F32 : sv->dtype));
            for (k = 0; k < mp->ndim; k++) fsdp__sbuf_printf(b, k ? ",%lld" : "%lld", (long long)mp->shape[k]);
            fsdp__sbuf_str(b, "],\"pieces\":[");
            for (g = 0; g < fsdp__index_writers(u); g++) {
                if (!fsdp__index_piece(ctx, u, p, g, &lo, &hi)) continue;
                fsdp__sbuf_printf(b, "%s[%d,%lld,%lld]", first ? "" : ",", file_of[g], (long long)lo, (long long)hi);
                first = 0;
            }
            fsdp__sbuf_str(b, "]}");
        }
    }
    fsdp__index_residuals(ctx, file_of, b);
    fsdp__sbuf_str(b, "}}\n");
    FSDP_FREE(file_of);
}

/* Files of earlier saves in dir (a descriptor), no longer referenced once this save's index is
   in place. */
FSDP__PRIVATE void fsdp__remove_old_shards(int dir, uint32_t nonce) {
    char prefix[32];
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    if (fd >= 0 && !d) close(fd);
    fsdp__fmt(prefix, sizeof prefix, "shard-%08x-", (unsigned)nonce);
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "shard-", 6) == 0 && strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    if (d) closedir(d);
}

#ifndef FSDP__DIR_OPENED
#define FSDP__DIR_OPENED(path) ((void)0) /* tests: what happens once a directory is checked (a link repointed) */
#endif

/* A checkpoint or trace directory opened, once, for every later create, rename and unlink in it
   (relative to the descriptor: repointing a link on the path afterwards changes nothing), if it
   is this user's to write in: a directory owned by this user, reached through no symbolic link
   of another user (its last component, trailing "/" and "/." aside, which would follow the link
   before it is seen: the path above is the caller's), that not every user can write in (they
   could plant files or links where shards go and where old shards are removed; a
   group-writable directory is the group's choice). The descriptor, or -1 with why. */
FSDP__PRIVATE int fsdp__dir_open(const char *dir, char *why, size_t size) {
    char path[1024];
    size_t n = strlen(dir);
    struct stat link, st;
    int fd;
    if (n >= sizeof path) return fsdp__fmt(why, size, "the name is too long"), -1;
    memcpy(path, dir, n + 1);
    while (n > 1 && (path[n - 1] == '/' || (path[n - 1] == '.' && path[n - 2] == '/'))) path[--n] = 0;
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP) && lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) {
        if (link.st_uid != geteuid())
            return fsdp__fmt(why, size, "a symbolic link of uid %u, not of this user (uid %u)", (unsigned)link.st_uid,
                             (unsigned)geteuid()), -1;
        fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* this user's own link */
    }
    if (fd < 0) return fsdp__fmt(why, size, "%s", errno == ENOTDIR ? "not a directory" : strerror(errno)), -1;
    if (fstat(fd, &st) != 0) fsdp__fmt(why, size, "%s", strerror(errno));
    else if (st.st_uid != geteuid())
        fsdp__fmt(why, size, "a directory of uid %u, not of this user (uid %u)", (unsigned)st.st_uid, (unsigned)geteuid());
    else if (st.st_mode & S_IWOTH)
        fsdp__fmt(why, size, "a directory every user can write in (mode %04o): other users could plant files there",
                  (unsigned)(st.st_mode & 07777));
    else {
        FSDP__DIR_OPENED(path);
        return fd;
    }
    close(fd);
    return -1;
}

/* The end of a sharded save, whatever its result: the directory closed. */
FSDP__PRIVATE void fsdp__sharded_end(fsdp__sharded_save *sv) {
    if (sv->dir_fd >= 0) close(sv->dir_fd);
    sv->dir_fd = -1;
}

/* The start of a sharded save: the directory made (rank 0), opened and checked (every rank: on
   its host it may be another), a fresh name for this save's files, the same on every rank. On
   failure nothing is left open. Rank 0 holds a lock on the directory until the save ends: two
   jobs saving into one directory at once removed each other's files (a save failed, "No such
   file", and its other ranks' files stayed), so the second fails at once saying why (where the
   file system has no locks, none is taken). Collective. */
FSDP__PRIVATE int fsdp__sharded_begin(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt, const char *what,
                                      fsdp__sharded_save *sv) {
    uint32_t nonce[2] = {0, 0};
    char err[FSDP__ERRMSG];
    int rc, local = 0;
    memset(sv, 0, sizeof *sv);
    sv->opt = opt;
    sv->dir = dir;
    sv->dir_fd = -1;
    sv->dtype = opt && opt->dtype ? opt->dtype : FSDP_F32;
    if (opt && opt->with_optimizer) sv->suffix = fsdp__opt_suffixes(ctx, &sv->nopt);
    if (ctx->rank == 0) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) local = fsdp__fail(ctx, FSDP_ERR_IO, "%s: %s: %s", what, dir, strerror(errno));
        nonce[0] = (uint32_t)fsdp__mix64((uint64_t)getpid() ^ (uint64_t)(fsdp_now() * 1e9) ^ (uint64_t)ctx->step);
    }
    if ((rc = fsdp__agree(ctx, local)) != 0) return rc;
    if ((sv->dir_fd = fsdp__dir_open(dir, err, sizeof err)) < 0)
        local = fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "%s: %s: %s", what, dir, err);
    else if (ctx->rank == 0 && flock(sv->dir_fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
        local = fsdp__fail(ctx, FSDP_ERR_INVALID_ARG, "%s: %s: another job is saving a checkpoint into it right now (two "
                           "jobs in one directory replace and remove each other's checkpoints): give each its own", what, dir);
    if ((rc = fsdp__agree(ctx, local)) == 0) rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_BROADCAST, NULL, nonce, 2, 0);
    if (rc) fsdp__sharded_end(sv);
    sv->nonce = nonce[0];
    return rc;
}

/* This rank's file of a save that is not committed and never will be (no index names its
   fresh name), so that the directory holds what its index names: removed. */
FSDP__PRIVATE void fsdp__remove_own_shard(fsdp_ctx *ctx, const fsdp__sharded_save *sv) {
    char file[64];
    fsdp__shard_file_name(file, sizeof file, sv->nonce, ctx->rank);
    if (sv->dir_fd >= 0) unlinkat(sv->dir_fd, file, 0);
}

/* The end of a sharded save, once every rank's file is written or failed (local: this rank's
   result, its message in ctx->error): rank 0 writes index (its text) as index.json, the commit
   point, then removes the files of earlier saves. A failure every rank agreed on (the
   collectives whole: rank 0 saw it too, so wrote no index) removes the save's files; after a
   failure of the collectives themselves rank 0 may have committed, so they stay (the next save
   removes them if not). Collective. */
FSDP__PRIVATE int fsdp__sharded_commit(fsdp_ctx *ctx, const fsdp__sharded_save *sv, const fsdp__sbuf *index, int local,
                                       const char *what) {
    char path[1024], err[FSDP__ERRMSG];
    int rc;
    if ((rc = fsdp__agree(ctx, local)) == 0 && ctx->rank == 0) {
        fsdp__fmt(path, sizeof path, "%s/index.json", sv->dir);
        if (index->failed || !index->data) local = fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
        else if ((local = fsdp__write_file_at(sv->dir_fd, path, index->data, index->len, err, sizeof err)) != 0)
            fsdp__fail(ctx, local, "%s: cannot write the index: %s", what, err);
    }
    if (!rc) rc = fsdp__agree(ctx, local);
    if (!rc && ctx->rank == 0) fsdp__remove_old_shards(sv->dir_fd, sv->nonce);
    else if (rc && fsdp__check_worker(ctx) == 0 && fsdp_comm_status(ctx->comm) == FSDP_SUCCESS) fsdp__remove_own_shard(ctx, sv);
    return rc;
}

FSDP__PRIVATE int fsdp__async_poll(fsdp_ctx *ctx, int wait);

FSDP__PRIVATE int fsdp__save_sharded(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt) {
    fsdp__sharded_save sv;
    fsdp__sbuf index;
    char store[8][64], err[FSDP__ERRMSG];
    int rc, local = 0;
    double t0;
    if (!ctx || !dir || strlen(dir) > 900) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__async_poll(ctx, 1)) != 0) return rc; /* an asynchronous save in flight ends first */
    if ((rc = fsdp__quiesce(ctx, "fsdp_save_sharded")) != 0) return rc;
    if ((rc = fsdp__sharded_begin(ctx, dir, opt, "fsdp_save_sharded", &sv)) != 0) return rc;
    memset(&index, 0, sizeof index);
    if (!(sv.meta = fsdp__ckpt_metadata(ctx, opt, "shard", store, &sv.nmeta)))
        local = fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_save_sharded: out of memory");
    if (!local && ctx->rank == 0) fsdp__index_text(ctx, &sv, &index);
    t0 = fsdp__trace_begin(ctx);
    if (!local && (local = fsdp__write_shard_file(ctx, &sv, NULL, err, sizeof err)) != 0)
        fsdp__fail(ctx, local, "fsdp_save_sharded: %s", err);
    fsdp__trace_ckpt(ctx, "save_sharded: write", NULL, t0);
    t0 = fsdp__trace_begin(ctx);
    rc = fsdp__sharded_commit(ctx, &sv, &index, local, "fsdp_save_sharded");
    fsdp__trace_ckpt(ctx, "save_sharded: commit", NULL, t0);
    fsdp__sharded_end(&sv);
    FSDP_FREE(sv.meta);
    FSDP_FREE(index.data);
    return rc;
}

FSDP_API int fsdp_save_sharded(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt) {
    double t0 = fsdp__trace_begin(ctx);
    int rc = fsdp__save_sharded(ctx, dir, opt);
    fsdp__trace_ckpt(ctx, "save_sharded", dir, t0);
    return rc;
}

/* --- asynchronous sharded saves -------------------------------------------------------------- */
/* A save in flight: the snapshot of this rank's pieces (in file order) that its writer thread
   writes, and what the commit needs. At most one per context; the snapshot buffer is kept for
   the next. */
struct fsdp__async_save {
    fsdp__sharded_save sv;       /* sv.dir and sv.meta point into dir and meta below */
    char dir[1024];
    char store[8][64];           /* the metadata's values of fsdp__ckpt_metadata */
    fsdp_kv *meta;               /* the user's keys and values copied into meta_text */
    char *meta_text;
    fsdp__sbuf index;            /* rank 0: index.json as of the snapshot */
    float *staged;
    size_t staged_cap;           /* elements */
    pthread_t thread;
    int in_flight, thread_started;
    int done, rc;                /* the writer's end, under ctx->lock */
    char error[FSDP__ERRMSG];
    int result;                  /* the last finished save's result (fsdp_save_wait) */
};

typedef struct fsdp__staging { float *dst; int64_t at; } fsdp__staging;

/* Copies a piece into the snapshot (dst NULL: only counts its elements). */
FSDP__PRIVATE int fsdp__piece_stage(fsdp_ctx *ctx, const fsdp__unit *u, int p, int j, void *user) {
    fsdp__staging *st = (fsdp__staging *)user;
    int64_t len = fsdp__piece_count(ctx, u, p);
    float *tmp = NULL;
    int rc = 0;
    const float *values;
    if (st->dst) {
        if (!(values = p < 0 ? u->residual : fsdp__unit_values(ctx, u, j, fsdp__param_at(ctx, p), len, &tmp, &rc)))
            return rc;
        memcpy(st->dst + st->at, values, sizeof(float) * (size_t)len);
        FSDP_FREE(tmp);
    }
    st->at += len;
    return 0;
}

/* The metadata with every string copied into one block (the caller's may be freed once the save
   returns); NULL when out of memory. */
FSDP__PRIVATE fsdp_kv *fsdp__kv_copy(const fsdp_kv *kv, int n, char **text) {
    size_t bytes = 0, at = 0, len;
    fsdp_kv *copy;
    int i, k;
    for (i = 0; i < n; i++) bytes += strlen(kv[i].key) + strlen(kv[i].value) + 2;
    copy = (fsdp_kv *)FSDP_MALLOC(sizeof *copy * (size_t)(n + 1));
    *text = (char *)FSDP_MALLOC(bytes + 1);
    if (!copy || !*text) {
        FSDP_FREE(copy);
        FSDP_FREE(*text);
        *text = NULL;
        return NULL;
    }
    for (i = 0; i < n; i++)
        for (k = 0; k < 2; k++) {
            const char *src = k ? kv[i].value : kv[i].key;
            len = strlen(src) + 1;
            memcpy(*text + at, src, len);
            if (k) copy[i].value = *text + at;
            else copy[i].key = *text + at;
            at += len;
        }
    return copy;
}

/* Writes the snapshot into this rank's shard file and says it is done (the writer thread's work). */
FSDP__PRIVATE void fsdp__async_write(fsdp_ctx *ctx) {
    struct fsdp__async_save *as = ctx->async_save;
    char err[FSDP__ERRMSG];
    double t0 = fsdp_now();
    int rc = fsdp__write_shard_file(ctx, &as->sv, as->staged, err, sizeof err);
    fsdp__trace_ckpt(ctx, "async save: write", as->dir, t0);
    FSDP__CHAOS(FSDP__CHAOS_THREAD);
    pthread_mutex_lock(&ctx->lock);
    as->rc = rc;
    fsdp__copy_string(as->error, sizeof as->error, err);
    as->done = 1;
    pthread_mutex_unlock(&ctx->lock);
}

static void *fsdp__async_writer(void *arg) {
#if defined(__linux__) && defined(SYS_gettid)
    /* behind the training: on a host whose cores the ranks keep busy the writer takes a small
       share (nice 10: a tenth of a rank's) instead of an equal one, which would slow one rank
       and so every rank waiting for it in the next collective */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
#endif
    fsdp__trace_thread = FSDP__TID_CKPT;
    FSDP__CHAOS(FSDP__CHAOS_THREAD);
    fsdp__async_write((fsdp_ctx *)arg);
    return NULL;
}

/* The snapshot, the index and the metadata of an asynchronous save (after fsdp__sharded_begin):
   0, or the failure (ctx->error says why). Local. */
FSDP__PRIVATE int fsdp__async_snapshot(fsdp_ctx *ctx, struct fsdp__async_save *as, const fsdp_save_options *opt) {
    fsdp__staging st;
    fsdp_kv *meta;
    int rc;
    FSDP_FREE(as->meta);
    FSDP_FREE(as->meta_text);
    as->meta = NULL;
    as->meta_text = NULL;
    if ((meta = fsdp__ckpt_metadata(ctx, opt, "shard", as->store, &as->sv.nmeta)) != NULL)
        as->meta = fsdp__kv_copy(meta, as->sv.nmeta, &as->meta_text);
    FSDP_FREE(meta);
    as->sv.meta = as->meta;
    as->sv.opt = opt; /* (the index reads its epoch now; the caller's options are not kept) */
    as->index.len = 0;
    as->index.failed = 0;
    if (as->meta && ctx->rank == 0) fsdp__index_text(ctx, &as->sv, &as->index);
    as->sv.opt = NULL;
    if (!as->meta || as->index.failed) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_save_sharded_async: out of memory");
    memset(&st, 0, sizeof st);
    fsdp__each_piece(ctx, as->sv.nopt, fsdp__piece_stage, &st);
    if ((size_t)st.at > as->staged_cap) {
        FSDP_FREE(as->staged);
        as->staged_cap = 0;
        if (!(as->staged = (float *)FSDP_MALLOC(sizeof(float) * (size_t)st.at)))
            return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_save_sharded_async: no memory for the snapshot of this rank's "
                              "shards (%lld bytes); fsdp_save_sharded needs none", (long long)st.at * 4);
        as->staged_cap = (size_t)st.at;
    }
    st.dst = as->staged;
    st.at = 0;
    if ((rc = fsdp__each_piece(ctx, as->sv.nopt, fsdp__piece_stage, &st)) != 0) return rc; /* (unit_values failed it) */
    return 0;
}

FSDP__PRIVATE int fsdp__save_sharded_async(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt) {
    struct fsdp__async_save *as;
    fsdp__sharded_save sv;
    int rc, local;
    double t0;
    if (!ctx || !dir || strlen(dir) > 900) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__async_poll(ctx, 1)) != 0) return rc; /* at most one in flight */
    if ((rc = fsdp__quiesce(ctx, "fsdp_save_sharded_async")) != 0) return rc;
    if (!ctx->async_save && !(ctx->async_save = (struct fsdp__async_save *)fsdp__calloc(sizeof *ctx->async_save)))
        return fsdp__agree(ctx, fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_save_sharded_async: out of memory"));
    as = ctx->async_save;
    as->sv.dir_fd = -1; /* (no save in flight: nothing open) */
    if ((rc = fsdp__sharded_begin(ctx, dir, opt, "fsdp_save_sharded_async", &sv)) != 0) return rc;
    as->sv = sv;
    fsdp__copy_string(as->dir, sizeof as->dir, dir);
    as->sv.dir = as->dir;
    t0 = fsdp__trace_begin(ctx);
    local = fsdp__async_snapshot(ctx, as, opt);
    fsdp__trace_ckpt(ctx, "async save: copy", NULL, t0);
    if ((rc = fsdp__agree(ctx, local)) != 0) { /* every rank has its snapshot, or none goes on */
        fsdp__sharded_end(&as->sv);
        return rc;
    }
    as->done = as->rc = 0;
    as->error[0] = 0;
    as->in_flight = 1;
    if (pthread_create(&as->thread, NULL, fsdp__async_writer, ctx) == 0) {
        as->thread_started = 1;
    } else { /* no thread: written here (the save is then synchronous, and still committed later) */
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: no thread for the asynchronous save: written now", ctx->rank);
        fsdp__async_write(ctx);
    }
    return 0;
}

FSDP_API int fsdp_save_sharded_async(fsdp_ctx *ctx, const char *dir, const fsdp_save_options *opt) {
    double t0 = fsdp__trace_begin(ctx);
    int rc = fsdp__save_sharded_async(ctx, dir, opt);
    fsdp__trace_ckpt(ctx, "async save: snapshot", dir, t0);
    return rc;
}

/* Commits the save in flight once every rank's writer has finished (wait: after waiting for
   this rank's). Collective, compute thread. A failed save is logged and kept for fsdp_save_wait
   (the directory keeps the previous checkpoint); only a failure of the collectives themselves
   is returned. */
FSDP__PRIVATE int fsdp__async_poll(fsdp_ctx *ctx, int wait) {
    struct fsdp__async_save *as = ctx->async_save;
    float flags[2], sums[2];
    double t0;
    int rc, local;
    if (!as || !as->in_flight) return 0;
    FSDP__CHAOS(FSDP__CHAOS_WAIT);
    pthread_mutex_lock(&ctx->lock);
    t0 = wait && !as->done ? fsdp__trace_begin(ctx) : 0;
    pthread_mutex_unlock(&ctx->lock);
    if (wait && as->thread_started) {
        pthread_join(as->thread, NULL);
        as->thread_started = 0;
    }
    fsdp__trace_wait(ctx, "wait checkpoint", "checkpoint", -1, t0);
    pthread_mutex_lock(&ctx->lock);
    flags[0] = as->done ? 0.0f : 1.0f;
    flags[1] = as->rc ? 1.0f : 0.0f;
    pthread_mutex_unlock(&ctx->lock);
    if ((rc = fsdp__worker_coll(ctx, ctx->comm, FSDP_COLL_ALL_REDUCE, flags, sums, 2, 0)) != 0) return rc;
    if (sums[0] > 0) return 0; /* a rank's file is still being written */
    if (as->thread_started) {
        pthread_join(as->thread, NULL);
        as->thread_started = 0;
    }
    t0 = fsdp__trace_begin(ctx);
    local = as->rc ? fsdp__fail(ctx, as->rc, "fsdp_save_sharded_async: %s", as->error) : 0;
    rc = fsdp__sharded_commit(ctx, &as->sv, &as->index, local, "fsdp_save_sharded_async");
    fsdp__trace_ckpt(ctx, "async save: commit", as->dir, t0);
    fsdp__sharded_end(&as->sv);
    as->in_flight = 0;
    as->result = rc;
    if (!rc) return 0;
    if (fsdp__check_worker(ctx) != 0 || fsdp_comm_status(ctx->comm) != FSDP_SUCCESS) return rc;
    fsdp__log(&ctx->logger, FSDP_LOG_ERROR, "rank %d: the asynchronous save to %s failed (%s): the directory keeps its "
              "previous checkpoint", ctx->rank, as->dir, ctx->error);
    return 0;
}

FSDP_API int fsdp_save_wait(fsdp_ctx *ctx) {
    int rc;
    if (!ctx) return FSDP_ERR_INVALID_ARG;
    if (!ctx->async_save) return 0;
    if ((rc = fsdp__async_poll(ctx, 1)) != 0) return rc;
    rc = ctx->async_save->result; /* said once */
    ctx->async_save->result = 0;
    return rc;
}

/* fsdp_destroy: the save in flight committed while the job is whole; otherwise only its
   writer waited for (the directory keeps the previous checkpoint). */
FSDP__PRIVATE void fsdp__async_end(fsdp_ctx *ctx) {
    struct fsdp__async_save *as = ctx->async_save;
    if (!as) return;
    if (as->in_flight && ctx->thread_started && fsdp__check_worker(ctx) == 0 && fsdp_comm_status(ctx->comm) == FSDP_SUCCESS)
        fsdp__async_poll(ctx, 1);
    if (as->thread_started) pthread_join(as->thread, NULL);
    if (as->in_flight) { /* (this rank never reached the commit, so neither did rank 0: no index names the file) */
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "rank %d: the asynchronous save to %s was not committed (the job failed): "
                  "the directory keeps its previous checkpoint", ctx->rank, as->dir);
        fsdp__remove_own_shard(ctx, &as->sv);
        fsdp__sharded_end(&as->sv);
    }
    FSDP_FREE(as->staged);
    FSDP_FREE(as->meta);
    FSDP_FREE(as->meta_text);
    FSDP_FREE(as->index.data);
    FSDP_FREE(as);
    ctx->async_save = NULL;
}

/* --- index.json ------------------------------------------------------------------------------ */
struct fsdp_index {
    char *text;                   /* index.json, strings decoded in place: names point into it */
    int num_files, num_tensors, num_meta, num_pieces;
    const char **files;
    fsdp_index_tensor *tensors;
    fsdp_index_piece *pieces;     /* all tensors' pieces, one array */
    const char **meta_keys, **meta_values;
    int *by_name;
    int64_t world_size, step, epoch;
    int has_format, has_files, has_tensors;
};


static __thread const fsdp_index *fsdp__sorting_index; /* qsort has no context argument (per thread) */
static int fsdp__cmp_index_name(const void *a, const void *b) {
    return strcmp(fsdp__sorting_index->tensors[*(const int *)a].name, fsdp__sorting_index->tensors[*(const int *)b].name);
}

FSDP_API void fsdp_index_close(fsdp_index *ix) {
    if (!ix) return;
    FSDP_FREE(ix->text);
    FSDP_FREE((void *)ix->files);
    FSDP_FREE(ix->tensors);
    FSDP_FREE(ix->pieces);
    FSDP_FREE((void *)ix->meta_keys);
    FSDP_FREE((void *)ix->meta_values);
    FSDP_FREE(ix->by_name);
    FSDP_FREE(ix);
}

/* One tensor's entry {"dtype": .., "shape": [..], "pieces": [[file, begin, end], ..]} (other
   keys are ignored), its pieces in order: each begins where the last ended, the first at 0.
   Both walks check its form, so that only pieces that can be valid are counted (*num_pieces
   grows by them); the fill walk (t set, its name too) fills t and its pieces at ix->pieces +
   *num_pieces. Files and the tensor's size are checked afterwards. shown: the name, printable. */
FSDP__PRIVATE int fsdp__index_tensor_entry(fsdp_index *ix, fsdp__json *j, fsdp_index_tensor *t, int *num_pieces,
                                           const char *shown, const char *path, char *err, size_t err_size) {
    char probe[16], *key;
    const char *dtype = NULL;
    int seen = 0, r, have_shape = 0, have_pieces = 0, k;
    fsdp__json_space(j);
    if (j->at >= j->end || *j->at != '{')
        return fsdp__fmt(err, err_size, "%s: entry '%s' is not an object", path, shown), FSDP_ERR_CORRUPT;
    if (fsdp__json_open(j, '{', "expected '{'")) return FSDP_ERR_CORRUPT;
    while ((r = fsdp__json_more(j, '}', &seen)) > 0) {
        int n = 0, rk;
        const char *name;
        if (fsdp__json_key(j, &key, probe, sizeof probe)) return FSDP_ERR_CORRUPT;
        name = FSDP__JSON_KEY(j, key, probe);
        fsdp__json_space(j);
        if (strcmp(name, "dtype") == 0 && j->at < j->end && *j->at == '"') {
            if (fsdp__json_string_into(j, &dtype)) return FSDP_ERR_CORRUPT;
        } else if (strcmp(name, "shape") == 0) {
            if (fsdp__json_open(j, '[', "a shape is not an array")) return FSDP_ERR_CORRUPT;
            while ((rk = fsdp__json_more(j, ']', &n)) > 0) {
                int64_t d;
                if (n > FSDP_MAX_DIMS || fsdp__json_int(j, 0, (int64_t)1 << 40, &d, "a shape entry is out of range"))
                    return fsdp__fmt(err, err_size, "%s: bad shape for '%s'", path, shown), FSDP_ERR_CORRUPT;
                if (t) t->shape[n - 1] = d;
            }
            if (rk < 0) return FSDP_ERR_CORRUPT;
            if (t) t->ndim = n;
            have_shape = 1;
        } else if (strcmp(name, "pieces") == 0) {
            int64_t next = 0; /* where the next piece must begin */
            if (have_pieces++) return fsdp__fmt(err, err_size, "%s: '%s' has pieces twice", path, shown), FSDP_ERR_CORRUPT;
            if (j->at >= j->end || *j->at != '[' || fsdp__json_open(j, '[', "expected '['"))
                return fsdp__fmt(err, err_size, "%s: the pieces of '%s' are not a list", path, shown), FSDP_ERR_CORRUPT;
            while ((rk = fsdp__json_more(j, ']', &n)) > 0) {
                int64_t v[3] = {0, 0, 0};
                int m = 0, rm;
                fsdp__json_space(j);
                if (j->at >= j->end || *j->at != '[' || fsdp__json_open(j, '[', "a piece is not an array")) rm = -1;
                else while ((rm = fsdp__json_more(j, ']', &m)) > 0 && m <= 3)
                    if (fsdp__json_int(j, m == 1 ? 0 : INT64_MIN, m == 1 ? 1 << 30 : INT64_MAX, &v[m - 1],
                                       "a piece entry is not an integer"))
                        break;
                if (rm != 0 || m != 3)
                    return fsdp__fmt(err, err_size, "%s: piece %d of '%s' is not [file, begin, end]", path, n - 1, shown),
                           FSDP_ERR_CORRUPT;
                if (v[1] != next || v[2] <= v[1])
                    return fsdp__fmt(err, err_size, "%s: the pieces of '%s' do not cover its elements in order, each "
                                     "once (piece %d is [%lld, %lld), the next element is %lld)", path, shown, n - 1,
                                     (long long)v[1], (long long)v[2], (long long)next), FSDP_ERR_CORRUPT;
                next = v[2];
                if (t) {
                    ix->pieces[*num_pieces + n - 1].file = (int)v[0];
                    ix->pieces[*num_pieces + n - 1].begin = v[1];
                    ix->pieces[*num_pieces + n - 1].end = v[2];
                }
            }
            if (rk < 0) return FSDP_ERR_CORRUPT;
            if (t) {
                t->pieces = ix->pieces + *num_pieces;
                t->num_pieces = n;
            }
            *num_pieces += n;
        } else if (fsdp__json_skip(j)) {
            return FSDP_ERR_CORRUPT;
        }
    }
    if (r < 0) return FSDP_ERR_CORRUPT;
    if (!have_pieces) return fsdp__fmt(err, err_size, "%s: entry '%s' lacks pieces", path, shown), FSDP_ERR_CORRUPT;
    if (!have_shape) return fsdp__fmt(err, err_size, "%s: '%s' lacks a shape", path, shown), FSDP_ERR_CORRUPT;
    if (!t) return 0;
    t->dtype = !dtype ? FSDP_DTYPE_DEFAULT : strcmp(dtype, "F32") == 0 ? FSDP_F32 : strcmp(dtype, "BF16") == 0 ? FSDP_BF16
               : strcmp(dtype, "F16") == 0 ? FSDP_F16 : FSDP_DTYPE_DEFAULT;
    if (!t->dtype) return fsdp__fmt(err, err_size, "%s: '%s' has no known dtype", path, shown), FSDP_ERR_CORRUPT;
    t->numel = 1;
    for (k = 0; k < t->ndim; k++) {
        int64_t d = t->shape[k];
        if (d && t->numel > ((int64_t)1 << 40) / d)
            return fsdp__fmt(err, err_size, "%s: bad shape for '%s'", path, shown), FSDP_ERR_CORRUPT;
        t->numel *= d;
    }
    return 0;
}

/* Enters the value of a counted container if it is one (returns 1), else passes over it
   (returns 0); -1 on a syntax error. The count walk counts any such container's elements;
   the fill walk refuses what is not one, naming what. */
FSDP__PRIVATE int fsdp__index_container(fsdp__json *j, char open, const char *path, const char *what, char *err,
                                        size_t err_size) {
    fsdp__json_space(j);
    if (j->at < j->end && *j->at == open) return fsdp__json_open(j, open, "expected a container") ? -1 : 1;
    if (j->fill) return fsdp__fmt(err, err_size, "%s: %s", path, what), -1;
    return fsdp__json_skip(j) ? -1 : 0;
}

/* One walk over index.json (see fsdp__json): the count walk checks the syntax and counts files,
   metadata, tensors and pieces; the fill walk fills the tables allocated from the counts and
   checks what the entries mean. */
FSDP__PRIVATE int fsdp__index_walk(fsdp_index *ix, fsdp__json *j, const char *path, char *err, size_t err_size) {
    int seen = 0, r, nf = 0, nm = 0, nt = 0, np = 0, rc;
    fsdp__json_space(j);
    if (j->at >= j->end || *j->at != '{') return fsdp__fmt(err, err_size, "%s is not an fsdp.h sharded index", path), FSDP_ERR_CORRUPT;
    if (fsdp__json_open(j, '{', "expected '{'")) return FSDP_ERR_CORRUPT;
    while ((r = fsdp__json_more(j, '}', &seen)) > 0) {
        char probe[16], *key;
        int n = 0, rn, in;
        if (fsdp__json_key(j, &key, probe, sizeof probe)) return FSDP_ERR_CORRUPT;
        if (j->fill) fsdp__copy_string(probe, sizeof probe, strlen(key) < sizeof probe ? key : "");
        fsdp__json_space(j);
        if (strcmp(probe, "format") == 0 && j->fill && j->at < j->end && *j->at == '"') {
            const char *format = NULL;
            if (fsdp__json_string_into(j, &format)) return FSDP_ERR_CORRUPT;
            ix->has_format = strcmp(format, "fsdp.h-sharded") == 0;
        } else if (j->fill && (strcmp(probe, "world_size") == 0 || strcmp(probe, "step") == 0 ||
                               strcmp(probe, "epoch") == 0)) {
            int is_int = 0;
            int64_t v = -1;
            if (j->at < j->end && (*j->at == '-' || (*j->at >= '0' && *j->at <= '9'))) {
                if (fsdp__json_number(j, &is_int, &v)) return FSDP_ERR_CORRUPT;
            } else if (fsdp__json_skip(j)) {
                return FSDP_ERR_CORRUPT;
            }
            *(probe[0] == 'w' ? &ix->world_size : probe[0] == 's' ? &ix->step : &ix->epoch) = is_int ? v : -1;
        } else if (strcmp(probe, "metadata") == 0) {
            if ((in = fsdp__index_container(j, '{', path, "metadata is not a map of strings", err, err_size)) < 0)
                return FSDP_ERR_CORRUPT;
            while (in && (rn = fsdp__json_more(j, '}', &n)) != 0) {
                char *mkey, *value, shown[80], mprobe[80];
                if (rn < 0 || fsdp__json_key(j, &mkey, mprobe, sizeof mprobe)) return FSDP_ERR_CORRUPT;
                fsdp__json_space(j);
                if (j->at >= j->end || *j->at != '"')
                    return fsdp__fmt(err, err_size, "%s: metadata '%s' is not a string", path,
                                     fsdp_printable(shown, sizeof shown, FSDP__JSON_KEY(j, mkey, mprobe))), FSDP_ERR_CORRUPT;
                if (fsdp__json_string(j, &value, NULL, 0)) return FSDP_ERR_CORRUPT;
                if (j->fill) {
                    ix->meta_keys[nm] = mkey;
                    ix->meta_values[nm] = value;
                }
                nm++;
            }
        } else if (strcmp(probe, "files") == 0) {
            if ((in = fsdp__index_container(j, '[', path, "files is not a list of file names", err, err_size)) < 0)
                return FSDP_ERR_CORRUPT;
            if (in && j->fill && ix->has_files++) return fsdp__fmt(err, err_size, "%s: files appears twice", path), FSDP_ERR_CORRUPT;
            while (in && (rn = fsdp__json_more(j, ']', &n)) != 0) {
                const char *file = NULL;
                if (rn < 0) return FSDP_ERR_CORRUPT;
                fsdp__json_space(j);
                if (j->at + 1 >= j->end || *j->at != '"' || j->at[1] == '"' || fsdp__json_string_into(j, &file))
                    return fsdp__fmt(err, err_size, "%s: file entry %d is not a plain file name", path, n - 1), FSDP_ERR_CORRUPT;
                if (j->fill) ix->files[nf] = file;
                nf++;
            }
        } else if (strcmp(probe, "tensors") == 0) {
            if ((in = fsdp__index_container(j, '{', path, "tensors is not a map", err, err_size)) < 0)
                return FSDP_ERR_CORRUPT;
            if (in && j->fill && ix->has_tensors++) return fsdp__fmt(err, err_size, "%s: tensors appears twice", path), FSDP_ERR_CORRUPT;
            while (in && (rn = fsdp__json_more(j, '}', &n)) != 0) {
                char *name, tprobe[80], shown[80];
                if (rn < 0 || fsdp__json_key(j, &name, tprobe, sizeof tprobe)) return FSDP_ERR_CORRUPT;
                fsdp_printable(shown, sizeof shown, FSDP__JSON_KEY(j, name, tprobe));
                if (j->fill) ix->tensors[nt].name = name;
                if ((rc = fsdp__index_tensor_entry(ix, j, j->fill ? &ix->tensors[nt] : NULL, &np, shown, path, err,
                                                   err_size)) != 0)
                    return rc;
                nt++;
            }
        } else if (fsdp__json_skip(j)) {
            return FSDP_ERR_CORRUPT;
        }
    }
    if (r < 0 || fsdp__json_finish(j)) return FSDP_ERR_CORRUPT;
    ix->num_files = nf;
    ix->num_meta = nm;
    ix->num_tensors = nt;
    ix->num_pieces = np;
    return 0;
}

/* Parses index.json's text (taken over by ix) and checks it whole: every tensor's pieces cover
   [0, numel) exactly once and name listed files, which are plain names in the directory. */
FSDP__PRIVATE int fsdp__index_build(fsdp_index *ix, size_t size, const char *path, char *err, size_t err_size) {
    fsdp__json j;
    int i, k, rc;
    char shown[80];
    fsdp__json_start(&j, ix->text, size, 0, err, err_size); /* the syntax, before what it says */
    if (fsdp__json_skip(&j) || fsdp__json_finish(&j)) {
        char inner[FSDP__ERRMSG];
        fsdp__copy_string(inner, sizeof inner, err);
        return fsdp__fmt(err, err_size, "%s: %s", path, inner), FSDP_ERR_CORRUPT;
    }
    fsdp__json_start(&j, ix->text, size, 0, err, err_size);
    if ((rc = fsdp__index_walk(ix, &j, path, err, err_size)) != 0) return rc;
    ix->files = (const char **)fsdp__calloc(sizeof(char *) * (size_t)(ix->num_files + 1));
    ix->meta_keys = (const char **)fsdp__calloc(sizeof(char *) * (size_t)(ix->num_meta + 1));
    ix->meta_values = (const char **)fsdp__calloc(sizeof(char *) * (size_t)(ix->num_meta + 1));
    ix->tensors = (fsdp_index_tensor *)fsdp__calloc(sizeof *ix->tensors * (size_t)(ix->num_tensors + 1));
    ix->pieces = (fsdp_index_piece *)fsdp__calloc(sizeof *ix->pieces * (size_t)(ix->num_pieces + 1));
    ix->by_name = (int *)fsdp__calloc(sizeof(int) * (size_t)(ix->num_tensors + 1));
    if (!ix->files || !ix->meta_keys || !ix->meta_values || !ix->tensors || !ix->pieces || !ix->by_name)
        return FSDP_ERR_OUT_OF_MEMORY;
    ix->world_size = ix->step = ix->epoch = -1;
    fsdp__json_start(&j, ix->text, size, 1, err, err_size);
    if ((rc = fsdp__index_walk(ix, &j, path, err, err_size)) != 0) return rc;
    if (!ix->has_format || !ix->has_files || !ix->has_tensors)
        return fsdp__fmt(err, err_size, "%s is not an fsdp.h sharded index", path), FSDP_ERR_CORRUPT;
    for (i = 0; i < ix->num_files; i++) {
        const char *file = ix->files[i];
        size_t n = strspn(file, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-");
        if (!*file || file[n] || n > 255 || strcmp(file, "..") == 0 || strcmp(file, ".") == 0)
            return fsdp__fmt(err, err_size, "%s: file entry %d is not a plain file name (1..255 of A-Z a-z 0-9 . _ -)",
                             path, i), FSDP_ERR_CORRUPT;
    }
    for (i = 0; i < ix->num_tensors; i++) {
        fsdp_index_tensor *t = &ix->tensors[i];
        fsdp_index_piece *pc = (fsdp_index_piece *)(uintptr_t)t->pieces;
        int64_t at = 0;
        for (k = 0; k < t->num_pieces; k++)
            if (pc[k].file >= ix->num_files)
                return fsdp__fmt(err, err_size, "%s: piece %d of '%s' names file %d of %d", path, k,
                                 fsdp_printable(shown, sizeof shown, t->name), pc[k].file, ix->num_files), FSDP_ERR_CORRUPT;
        at = t->num_pieces ? pc[t->num_pieces - 1].end : 0; /* the walk saw them follow each other from 0 */
        if (at != t->numel)
            return fsdp__fmt(err, err_size, "%s: the pieces of '%s' do not cover its %lld elements exactly once", path,
                             fsdp_printable(shown, sizeof shown, t->name), (long long)t->numel), FSDP_ERR_CORRUPT;
        ix->by_name[i] = i;
    }
    fsdp__sorting_index = ix;
    qsort(ix->by_name, (size_t)ix->num_tensors, sizeof(int), fsdp__cmp_index_name);
    fsdp__sorting_index = NULL;
    for (i = 1; i < ix->num_tensors; i++)
        if (strcmp(ix->tensors[ix->by_name[i]].name, ix->tensors[ix->by_name[i - 1]].name) == 0)
            return fsdp__fmt(err, err_size, "%s: tensor '%s' appears twice", path,
                             fsdp_printable(shown, sizeof shown, ix->tensors[ix->by_name[i]].name)), FSDP_ERR_CORRUPT;
    return 0;
}

FSDP_API int fsdp_index_parse(fsdp_index **out, const void *bytes, size_t size, char *err, size_t err_size) {
    fsdp_index *ix;
    char scratch[8];
    int rc;
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (out) *out = NULL;
    if (!out || (!bytes && size)) return FSDP_ERR_INVALID_ARG;
    if (size > FSDP__INDEX_MAX_BYTES)
        return fsdp__fmt(err, err_size, "an index of %zu bytes is above the limit of 256 MiB", size), FSDP_ERR_CORRUPT;
    if (!(ix = (fsdp_index *)fsdp__calloc(sizeof *ix)) || !(ix->text = (char *)FSDP_MALLOC(size + 1))) {
        fsdp_index_close(ix);
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    if (size) memcpy(ix->text, bytes, size);
    ix->text[size] = 0;
    rc = fsdp__index_build(ix, size, "index.json", err, err_size);
    if (rc) { fsdp_index_close(ix); return rc; }
    *out = ix;
    return 0;
}

FSDP_API int fsdp_index_open(fsdp_index **out, const char *dir, char *err, size_t err_size) {
    fsdp_index *ix;
    char path[1024], shown[300], scratch[8];
    struct stat st;
    int fd, rc = 0;
    if (!err) { err = scratch; err_size = sizeof scratch; }
    if (out) *out = NULL;
    if (!out || !dir || strlen(dir) > 900) return FSDP_ERR_INVALID_ARG;
    if (!(ix = (fsdp_index *)fsdp__calloc(sizeof *ix))) return FSDP_ERR_OUT_OF_MEMORY;
    fsdp__fmt(path, sizeof path, "%s/index.json", dir);
    fsdp_printable(shown, sizeof shown, path); /* for messages */
    /* a symlink, FIFO or device under the checkpoint's name is refused, not followed or waited on */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 || fstat(fd, &st) != 0)
        rc = (fsdp__fmt(err, err_size, "%s: %s", shown, errno == ELOOP ? "a symbolic link (refused)" : strerror(errno)), FSDP_ERR_IO);
    else if (!S_ISREG(st.st_mode))
        rc = (fsdp__fmt(err, err_size, "%s is not a regular file", shown), FSDP_ERR_IO);
    else if (st.st_size <= 0 || (uint64_t)st.st_size > FSDP__INDEX_MAX_BYTES)
        rc = (fsdp__fmt(err, err_size, "%s has an implausible size (%lld bytes)", shown, (long long)st.st_size), FSDP_ERR_CORRUPT);
    else if (!(ix->text = (char *)FSDP_MALLOC((size_t)st.st_size + 1)))
        rc = FSDP_ERR_OUT_OF_MEMORY;
    else if (fsdp__pread_full(fd, ix->text, (size_t)st.st_size, 0) != 0)
        rc = (fsdp__fmt(err, err_size, "cannot read %s: %s", shown, strerror(errno)), FSDP_ERR_IO);
    else {
        ix->text[st.st_size] = 0;
        rc = fsdp__index_build(ix, (size_t)st.st_size, shown, err, err_size);
    }
    if (fd >= 0) close(fd);
    if (rc) { fsdp_index_close(ix); return rc; }
    *out = ix;
    return 0;
}

FSDP_API int fsdp_index_num_files(const fsdp_index *ix) { return ix ? ix->num_files : 0; }

FSDP_API int fsdp_index_open_file(const fsdp_index *ix, const char *dir, int file, fsdp_st_file **out, char *err,
                                  size_t err_size) {
    char path[1200];
    if (out) *out = NULL;
    if (!ix || !dir || !out || file < 0 || file >= ix->num_files || strlen(dir) > 900) return FSDP_ERR_INVALID_ARG;
    fsdp__fmt(path, sizeof path, "%s/%s", dir, ix->files[file]); /* a plain name: checked when the index was read */
    return fsdp__st_open_file(out, path, 1, err, err_size);
}
FSDP_API const char *fsdp_index_file(const fsdp_index *ix, int i) { return ix && i >= 0 && i < ix->num_files ? ix->files[i] : NULL; }
FSDP_API int fsdp_index_num_tensors(const fsdp_index *ix) { return ix ? ix->num_tensors : 0; }
FSDP_API const fsdp_index_tensor *fsdp_index_tensor_at(const fsdp_index *ix, int i) {
    return ix && i >= 0 && i < ix->num_tensors ? &ix->tensors[i] : NULL;
}
FSDP_API int fsdp_index_find(const fsdp_index *ix, const char *name) {
    int lo = 0, hi = ix ? ix->num_tensors - 1 : -1;
    while (name && lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(ix->tensors[ix->by_name[mid]].name, name);
        if (c == 0) return ix->by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}
FSDP_API int fsdp_index_num_metadata(const fsdp_index *ix) { return ix ? ix->num_meta : 0; }
FSDP_API fsdp_kv fsdp_index_metadata_at(const fsdp_index *ix, int i) {
    fsdp_kv kv;
    kv.key = ix && i >= 0 && i < ix->num_meta ? ix->meta_keys[i] : NULL;
    kv.value = kv.key ? ix->meta_values[i] : NULL;
    return kv;
}
FSDP_API const char *fsdp_index_metadata(const fsdp_index *ix, const char *key) {
    int i;
    for (i = 0; ix && key && i < ix->num_meta; i++) /* the last one wins, as for duplicate keys in JSON */
        if (strcmp(ix->meta_keys[ix->num_meta - 1 - i], key) == 0) return ix->meta_values[ix->num_meta - 1 - i];
    return NULL;
}
FSDP_API int64_t fsdp_index_world_size(const fsdp_index *ix) { return ix ? ix->world_size : -1; }
FSDP_API int64_t fsdp_index_step(const fsdp_index *ix) { return ix ? ix->step : -1; }
FSDP_API int64_t fsdp_index_epoch(const fsdp_index *ix) { return ix ? ix->epoch : -1; }

/* Reads elements of one tensor from the shard files its pieces name, verifying each piece. */
typedef struct fsdp__sharded_src {
    const char *dir;
    const fsdp_index *index;
    const fsdp_index_tensor *tensor;
    fsdp_st_file **open_files;
} fsdp__sharded_src;

FSDP__PRIVATE int fsdp__read_sharded(void *src, int64_t first, int64_t count, float *out, char *err, size_t err_size) {
    fsdp__sharded_src *s = (fsdp__sharded_src *)src;
    int i, rc;
    for (i = 0; i < s->tensor->num_pieces && count > 0; i++) {
        const fsdp_index_piece *pc = &s->tensor->pieces[i];
        int64_t lo = first > pc->begin ? first : pc->begin, hi = first + count < pc->end ? first + count : pc->end;
        const char *file = fsdp_index_file(s->index, pc->file);
        int t;
        if (hi <= lo) continue;
        if (!s->open_files[pc->file] &&
            (rc = fsdp_index_open_file(s->index, s->dir, pc->file, &s->open_files[pc->file], err, err_size)) != 0)
            return rc;
        t = fsdp_st_find(s->open_files[pc->file], s->tensor->name);
        if (t < 0 || fsdp_st_tensor_at(s->open_files[pc->file], t)->numel != pc->end - pc->begin) {
            char shown[80], dir[200], name[80];
            return fsdp__fmt(err, err_size, "%s/%s does not hold '%s' [%lld, %lld) as index.json says",
                             fsdp_printable(dir, sizeof dir, s->dir), fsdp_printable(name, sizeof name, file),
                             fsdp_printable(shown, sizeof shown, s->tensor->name), (long long)pc->begin, (long long)pc->end),
                   FSDP_ERR_CORRUPT;
        }
        if ((rc = fsdp_st_verify(s->open_files[pc->file], t, err, err_size)) != 0) return rc;
        if ((rc = fsdp_st_read(s->open_files[pc->file], t, lo - pc->begin, hi - lo, out + (lo - first), err, err_size)) != 0)
            return rc;
    }
    return 0;
}

/* Each error feedback residual this context keeps, from the checkpoint's "__grad_residual__.<unit>"
   (this rank's [rank R, rank R + R)); where it has none of this size (saved without error
   feedback, or at another world size or shard) the residual restarts at zero, and rank 0 says
   so. 0, or the read's failure (logged). */
FSDP__PRIVATE int fsdp__load_residuals(fsdp_ctx *ctx, fsdp__sharded_src *src, const char *dir) {
    char err[FSDP__ERRMSG];
    int ui, i, rc;
    for (ui = 0; ui < ctx->num_units; ui++) {
        fsdp__unit *u = &ctx->units[ui];
        char *name = u->residual ? fsdp__residual_name(ctx, ui) : NULL;
        const fsdp_index_tensor *t;
        if (!u->residual) continue;
        if (!name) return fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "fsdp_load_sharded: out of memory");
        i = fsdp_index_find(src->index, name);
        FSDP_FREE(name);
        t = i >= 0 ? fsdp_index_tensor_at(src->index, i) : NULL;
        if (!t || t->dtype != FSDP_F32 || t->numel != u->residual_numel * ctx->world) {
            memset(u->residual, 0, sizeof(float) * (size_t)u->residual_numel);
            if (ctx->rank == 0)
                fsdp__log(&ctx->logger, FSDP_LOG_INFO, "fsdp_load_sharded: unit '%s': no error feedback residual in %s "
                          "%s: it restarts at zero", fsdp__unit_name(ctx, ui), dir,
                          t ? "of this layout (saved at another world size or shard)" : "(saved without error feedback)");
            continue;
        }
        src->tensor = t;
        if ((rc = fsdp__read_sharded(src, u->residual_numel * ctx->rank, u->residual_numel, u->residual, err,
                                     sizeof err)) != 0)
            return fsdp__fail(ctx, rc, "fsdp_load_sharded: unit '%s''s residual: %s", fsdp__unit_name(ctx, ui), err);
    }
    return 0;
}

FSDP__PRIVATE int fsdp__load_sharded(fsdp_ctx *ctx, const char *dir, const fsdp_load_options *opt, fsdp_load_report *report) {
    fsdp_load_report local_report;
    fsdp__problems pr;
    fsdp__sharded_src src;
    fsdp_index *ix = NULL;
    char err[FSDP__ERRMSG] = "", detail[200];
    int rc, local = 0, i, p, buffer, *seen = NULL, load_opt = 0;
    double t0 = fsdp__trace_begin(ctx);
    if (!report) report = &local_report;
    memset(report, 0, sizeof *report);
    report->step = report->epoch = -1;
    memset(&src, 0, sizeof src);
    if (!ctx || !dir) return FSDP_ERR_INVALID_ARG;
    if ((rc = fsdp__quiesce(ctx, "fsdp_load_sharded")) != 0) return rc;
    memset(&pr, 0, sizeof pr);
    pr.opt = opt;
    pr.report = report;
    if ((rc = fsdp_index_open(&ix, dir, err, sizeof err)) != 0) local = fsdp__fail(ctx, rc, "fsdp_load_sharded: %s", err);
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    seen = (int *)fsdp__calloc(sizeof(int) * (size_t)(ctx->model->num_params + 1));
    src.open_files = (fsdp_st_file **)fsdp__calloc(sizeof(fsdp_st_file *) * (size_t)(fsdp_index_num_files(ix) + 1));
    if (!seen || !src.open_files) { rc = fsdp__agree(ctx, fsdp__fail(ctx, FSDP_ERR_OUT_OF_MEMORY, "out of memory")); goto done; }
    src.dir = dir;
    src.index = ix;
    for (i = 0; i < fsdp_index_num_tensors(ix); i++) { /* check names and shapes before loading anything */
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        int kind = fsdp__match_name(ctx, t->name, &p, &buffer);
        if (!kind && strncmp(t->name, FSDP__RESIDUAL_PREFIX, sizeof FSDP__RESIDUAL_PREFIX - 1) == 0) continue; /* below */
        if (!kind) { fsdp__problem(&pr, "unexpected", t->name, ""); continue; }
        if (kind == 1) seen[p] = 1; /* present, even if mis-shaped (reported as such, not as missing) */
        if (fsdp__shape_differs(ctx, p, t->ndim, t->shape, detail, sizeof detail)) fsdp__problem(&pr, "shape", t->name, detail);
    }
    for (p = 0; p < ctx->model->num_params; p++)
        if (!seen[p]) fsdp__problem(&pr, "missing", ctx->model->params[p].name, "");
    if (opt && opt->strict && (report->missing || report->unexpected || report->mismatched))
        local = fsdp__fail(ctx, FSDP_ERR_INCOMPATIBLE, "fsdp_load_sharded: %s does not match the model (%d missing, %d "
                           "unexpected, %d mis-shaped): %s", dir, report->missing, report->unexpected, report->mismatched, pr.summary);
    if (!local) local = fsdp__opt_compatible(ctx, opt, fsdp_index_metadata(ix, "optimizer"), "fsdp_load_sharded", &load_opt);
    if ((rc = fsdp__agree(ctx, local)) != 0) goto done;
    fsdp__trace_ckpt(ctx, "load_sharded: check", NULL, t0);
    t0 = fsdp__trace_begin(ctx);
    for (i = 0; !local && i < fsdp_index_num_tensors(ix); i++) { /* each rank reads the pieces its slices overlap */
        const fsdp_index_tensor *t = fsdp_index_tensor_at(ix, i);
        int kind = fsdp__match_name(ctx, t->name, &p, &buffer);
        if (!kind || fsdp__shape_differs(ctx, p, t->ndim, t->shape, detail, sizeof detail)) continue;
        if (kind == 2 && !load_opt) continue;
        src.tensor = t;
        if ((rc = fsdp__load_slice(ctx, p, buffer, fsdp__read_sharded, &src, err, sizeof err)) != 0)
            local = fsdp__fail(ctx, rc, "fsdp_load_sharded: %s", err);
        else if (kind == 1) report->loaded++;
    }
    if (!local) local = fsdp__load_residuals(ctx, &src, dir);
    report->step = fsdp__meta_count(ctx, "fsdp_load_sharded", "step", NULL, fsdp_index_step(ix), FSDP__COUNT_LIMIT);
    report->epoch = fsdp__meta_count(ctx, "fsdp_load_sharded", "epoch", NULL, fsdp_index_epoch(ix), FSDP__COUNT_LIMIT);
    if (!local && load_opt && report->step >= 0) ctx->step = report->step;
    if (!local && load_opt)
        fsdp__loss_scale_restore(ctx, "fsdp_load_sharded", fsdp_index_metadata(ix, "loss_scale"),
                                 fsdp_index_metadata(ix, "loss_scale_growth_tracker"));
    fsdp__trace_ckpt(ctx, "load_sharded: read", NULL, t0);
    rc = fsdp__agree(ctx, local);
    if (!rc && (report->missing || report->unexpected || report->mismatched))
        fsdp__log(&ctx->logger, FSDP_LOG_WARN, "fsdp_load_sharded: loaded %d tensors; not loaded: %s", report->loaded, pr.summary);
done:
    for (i = 0; src.open_files && i < fsdp_index_num_files(ix); i++) fsdp_st_close(src.open_files[i]);
    FSDP_FREE(src.open_files);
    FSDP_FREE(seen);
    fsdp_index_close(ix);
    return rc;
}

FSDP_API int fsdp_load_sharded(fsdp_ctx *ctx, const char *dir, const fsdp_load_options *opt, fsdp_load_report *report) {
    double t0 = fsdp__trace_begin(ctx);
    int rc = fsdp__load_sharded(ctx, dir, opt, report);
    fsdp__trace_ckpt(ctx, "load_sharded", dir, t0);
    return rc;
}

/* ============================================================================================
   >>launcher
   The parent maps the shm segment (anonymous, shared) before forking, so nothing ever appears
   in /dev/shm; children inherit it. The parent reaps children as they end: the first one that
   crashes or fails poisons the segment with a message naming it, so the others fail at once.
   Each child has a small report board in another shared mapping for its last error.
   ============================================================================================ */
#if defined(__linux__)
#  include <sys/prctl.h>
#endif

typedef struct fsdp__launch_board {
    int32_t started;
    int32_t original;     /* its failure was its own, not learned from another rank */
    int64_t failed_ms;    /* when it failed (fsdp__now_ms: one clock for all processes); 0: did not */
    char error[240];
} fsdp__launch_board;

/* What the parent saw of a rank's end. */
typedef struct fsdp__launch_outcome {
    int ended, status, lost, stopped; /* lost: another waiter reaped it; stopped: we signalled it */
    int64_t reaped_ms;
} fsdp__launch_outcome;

FSDP__PRIVATE void fsdp__describe_exit(char *out, size_t size, int rank, int status, const char *error) {
    if (WIFSIGNALED(status))
        fsdp__fmt(out, size, "rank %d was killed by signal %d (%s)", rank, WTERMSIG(status), strsignal(WTERMSIG(status)));
    else if (*error)
        fsdp__fmt(out, size, "rank %d exited with status %d: %s", rank, WEXITSTATUS(status), error);
    else
        fsdp__fmt(out, size, "rank %d exited with status %d", rank, WEXITSTATUS(status));
}

/* One attempt's state in the parent: the children, their report boards, what the transport
   prepared for them before fork. */
typedef struct fsdp__launch {
    fsdp_launch_desc d;
    const fsdp__transport *t;
    fsdp__inherit inherit;
    fsdp__launch_board *board;
    size_t board_bytes;
    pid_t *pids;
    fsdp__launch_outcome *outcome;
    pid_t launcher;
    char job[48], secret[65];
} fsdp__launch;

FSDP__PRIVATE void fsdp__launch_child(const fsdp__launch *l, int rank, fsdp_rank_fn fn, void *arg) {
    const fsdp_launch_desc *d = &l->d;
    fsdp__launch_board *board = l->board;
    fsdp__inherit inherit = l->inherit;
    fsdp_comm_desc cd;
    fsdp_comm *comm = NULL;
    int rc;
#if defined(__linux__)
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the launcher */
#endif
    if (getppid() != l->launcher) _exit(101); /* it died before the line above took effect */
    if (rank != 0 && inherit.listen_fd >= 0) { /* a listener is rank 0's */
        close(inherit.listen_fd);
        inherit.listen_fd = -1;
    }
    memset(&cd, 0, sizeof cd);
    cd.backend = d->backend;
    cd.rank = rank;
    cd.world_size = d->nprocs;
    cd.local_rank = rank;
    cd.local_world_size = d->nprocs;
    cd.job = l->job;
    cd.secret = l->secret;
    cd.timeout_ms = d->timeout_ms;
    cd.logger = fsdp__env_logger(d->logger);
    cd.master_addr = "127.0.0.1";
    cd.master_port = inherit.port;
    cd.shm_slot_bytes = d->shm_slot_bytes;
    cd.shm_single_copy = d->shm_single_copy;
    rc = fsdp__comm_create(&comm, &cd, NULL, &inherit);
    if (rc != FSDP_SUCCESS) {
        fsdp__copy_string(board[rank].error, sizeof board[rank].error, fsdp__init_error);
        board[rank].original = 1;
        board[rank].failed_ms = fsdp__now_ms();
        fflush(NULL);
        _exit(100);
    }
    board[rank].started = 1;
    rc = fn(comm, arg);
    if (rc != 0) {
        int comm_failed = fsdp_comm_status(comm) != FSDP_SUCCESS;
        if (comm_failed) fsdp__copy_string(board[rank].error, sizeof board[rank].error, fsdp_comm_last_error(comm));
        board[rank].original = !comm_failed || !comm->adopted;
        board[rank].failed_ms = comm_failed ? comm->failed_ms : fsdp__now_ms();
    }
    fsdp_comm_destroy(comm);
    fflush(NULL);
    _exit(rc == 0 ? 0 : (rc > 0 && rc < 100 ? rc : 1));
}

/* Checks the description and prepares what the ranks share: a job token and a fresh secret that
   only these processes know, the report boards, and what the transport needs before fork. */
FSDP__PRIVATE int fsdp__launch_prepare(fsdp__launch *l, const fsdp_launch_desc *desc, fsdp_launch_status *status) {
    unsigned char random[32];
    int rc;
    if (!desc || desc->nprocs < 1 || desc->nprocs > FSDP__MAX_WORLD || desc->shm_slot_bytes > FSDP__SHM_SLOT_MAX) {
        fsdp__fmt(status->message, sizeof status->message,
                  "fsdp_launch: nprocs must be 1..%d, fn non-NULL and shm_slot_bytes at most 1 GiB", FSDP__MAX_WORLD);
        return FSDP_ERR_INVALID_ARG;
    }
    l->d = *desc;
    if (l->d.backend == FSDP_BACKEND_DEFAULT) l->d.backend = FSDP_BACKEND_SHM;
    l->t = fsdp__transport_of(l->d.backend);
    if (!l->t || !l->t->launch_prepare) {
        fsdp__fmt(status->message, sizeof status->message, "fsdp_launch: the %s backend cannot be launched (shm or socket can)",
                  fsdp_backend_name(l->d.backend));
        return FSDP_ERR_INVALID_ARG;
    }
    if (l->d.timeout_ms <= 0) l->d.timeout_ms = fsdp__default_timeout();
    l->launcher = getpid();
    fsdp__fmt(l->job, sizeof l->job, "launch-%d-%lld", (int)getpid(), (long long)(fsdp_now() * 1e6));
    if (fsdp__random_bytes(random, sizeof random) != 0) {
        fsdp__fmt(status->message, sizeof status->message, "fsdp_launch: no random bytes for the job's secret");
        return FSDP_ERR_SYSTEM;
    }
    fsdp__hex(l->secret, random, sizeof random);
    fsdp__wipe(random, sizeof random);
    l->board_bytes = fsdp__align(sizeof *l->board * (size_t)l->d.nprocs, 4096);
    l->board = (fsdp__launch_board *)mmap(NULL, l->board_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (l->board == MAP_FAILED) l->board = NULL;
    l->pids = (pid_t *)fsdp__calloc(sizeof *l->pids * (size_t)l->d.nprocs);
    l->outcome = (fsdp__launch_outcome *)fsdp__calloc(sizeof *l->outcome * (size_t)l->d.nprocs);
    if (!l->board || !l->pids || !l->outcome) {
        fsdp__fmt(status->message, sizeof status->message, "fsdp_launch: out of memory");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    if ((rc = l->t->launch_prepare(&l->inherit, &l->d, status->message, sizeof status->message)) != 0) return rc;
    return 0;
}

/* Forks the ranks (each sees FSDP_RESTART_COUNT=attempt). Returns how many run; a failed fork
   is said in status and *failed set. */
FSDP__PRIVATE int fsdp__launch_fork(fsdp__launch *l, fsdp_rank_fn fn, void *arg, int attempt, fsdp_launch_status *status,
                                    int *failed) {
    int rank, running = 0;
    fflush(NULL);
    for (rank = 0; rank < l->d.nprocs; rank++) {
        pid_t pid = fork();
        if (pid == 0) { /* the child never returns */
            char restarts[16];
            fsdp__fmt(restarts, sizeof restarts, "%d", attempt);
            setenv("FSDP_RESTART_COUNT", restarts, 1);
            fsdp__launch_child(l, rank, fn, arg);
        }
        if (pid < 0) {
            fsdp__fmt(status->message, sizeof status->message, "fsdp_launch: fork of rank %d failed: %s", rank, strerror(errno));
            *failed = 1;
            break;
        }
        l->pids[rank] = pid;
        running++;
    }
    if (l->inherit.listen_fd >= 0) { /* the children have it */
        close(l->inherit.listen_fd);
        l->inherit.listen_fd = -1;
    }
    return running;
}

/* Reaps the children as they end. The first failure stops the others: at once through the
   transport (launch_abort), by signal after a grace period. Returns 1 if a rank failed. */
FSDP__PRIVATE int fsdp__launch_reap(fsdp__launch *l, int running, int failed) {
    int64_t kill_at = failed ? fsdp__now_ms() : 0;
    long backoff_us = 1000;
    int rank;
    while (running > 0) { /* wait for our own pids only, polling with a backoff of up to 20 ms */
        int progressed = 0;
        int64_t now = fsdp__now_ms();
        for (rank = 0; rank < l->d.nprocs; rank++) {
            int wstatus = 0;
            pid_t got;
            if (l->pids[rank] <= 0) continue;
            got = waitpid(l->pids[rank], &wstatus, WNOHANG);
            if (got == 0 || (got < 0 && errno == EINTR)) continue;
            if (got < 0) { /* someone else took its status: it cannot be called a success */
                l->outcome[rank].lost = 1;
                wstatus = 0x7f00; /* reads as "exited with status 127" */
            }
            l->pids[rank] = 0;
            running--;
            progressed = 1;
            l->outcome[rank].status = wstatus;
            l->outcome[rank].reaped_ms = now;
            l->outcome[rank].ended = 1;
            if (!l->outcome[rank].lost && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) continue;
            if (!failed) {
                char why[160];
                failed = 1;
                kill_at = now + (l->d.timeout_ms < 10000 ? l->d.timeout_ms : 10000) + 1000;
                fsdp__describe_exit(why, sizeof why, rank, wstatus, "");
                if (l->t->launch_abort) l->t->launch_abort(&l->inherit, l->d.nprocs, why);
            }
        }
        if (failed && now >= kill_at)
            for (rank = 0; rank < l->d.nprocs; rank++)
                if (l->pids[rank] > 0) {
                    kill(l->pids[rank], now >= kill_at + 2000 ? SIGKILL : SIGTERM);
                    l->outcome[rank].stopped = 1;
                }
        if (progressed) {
            backoff_us = 1000;
        } else if (running > 0) {
            fsdp__sleep_us(backoff_us);
            if (backoff_us < 20000) backoff_us *= 2;
        }
    }
    return failed;
}

/* Blames the rank whose failure came first and was its own: a crash we did not cause (by the
   time it was reaped), else an error of its own (by when it happened: reaping order says
   nothing, as several ranks may have ended before we looked), else the earliest. */
FSDP__PRIVATE void fsdp__launch_blame(const fsdp__launch *l, fsdp_launch_status *status) {
    int best = -1, best_class = 4, rank;
    int64_t best_ms = 0;
    const fsdp__launch_outcome *o;
    char error[sizeof l->board->error + 1];
    for (rank = 0; rank < l->d.nprocs; rank++) {
        int cls;
        int64_t ms;
        o = &l->outcome[rank];
        if (!o->ended || (!o->lost && WIFEXITED(o->status) && WEXITSTATUS(o->status) == 0)) continue;
        if (WIFSIGNALED(o->status) && !o->stopped) { cls = 0; ms = o->reaped_ms; }
        else if (WIFSIGNALED(o->status)) { cls = 3; ms = o->reaped_ms; }
        else {
            cls = l->board[rank].failed_ms && !l->board[rank].original ? 2 : 1;
            ms = l->board[rank].failed_ms ? l->board[rank].failed_ms : o->reaped_ms;
        }
        if (cls < best_class || (cls == best_class && ms < best_ms)) { best = rank; best_class = cls; best_ms = ms; }
    }
    if (best < 0 || status->message[0]) return; /* (a failed fork has said what happened) */
    o = &l->outcome[best];
    fsdp__printable_n(error, sizeof error, l->board[best].error, sizeof l->board->error); /* another process's text */
    error[sizeof l->board->error] = 0;
    status->failed_rank = best;
    status->exit_code = WIFEXITED(o->status) ? WEXITSTATUS(o->status) : -1;
    status->signal = WIFSIGNALED(o->status) ? WTERMSIG(o->status) : 0;
    if (o->lost)
        fsdp__fmt(status->message, sizeof status->message, "rank %d ended, but its exit status was taken by "
                  "another wait in this process (a SIGCHLD handler or thread calling waitpid)", best);
    else
        fsdp__describe_exit(status->message, sizeof status->message, best, o->status, error);
}

/* One attempt of fsdp_launch_ex: its ranks see FSDP_RESTART_COUNT=attempt. */
FSDP__PRIVATE int fsdp__launch_once(const fsdp_launch_desc *desc, fsdp_rank_fn fn, void *arg, fsdp_launch_status *status,
                                    int attempt) {
    fsdp__launch l;
    fsdp_launch_status local;
    struct sigaction default_chld, old_chld;
    int have_old_chld, running, failed = 0, rc;
    if (!status) status = &local;
    memset(status, 0, sizeof *status);
    status->failed_rank = -1;
    status->exit_code = -1;
    memset(&l, 0, sizeof l);
    l.inherit.listen_fd = -1;
    rc = fn ? fsdp__launch_prepare(&l, desc, status) : FSDP_ERR_INVALID_ARG;
    if (!fn) fsdp__fmt(status->message, sizeof status->message, "fsdp_launch: fn must not be NULL");
    if (!rc) {
        /* Our children's exits must reach us: not reaped by the kernel (SIGCHLD ignored) nor by a
           handler of the host program that waits for any child. Restored before returning. */
        memset(&default_chld, 0, sizeof default_chld);
        default_chld.sa_handler = SIG_DFL;
        sigemptyset(&default_chld.sa_mask);
        have_old_chld = sigaction(SIGCHLD, &default_chld, &old_chld) == 0;
        running = fsdp__launch_fork(&l, fn, arg, attempt, status, &failed);
        if (failed) rc = FSDP_ERR_SYSTEM;
        if (fsdp__launch_reap(&l, running, failed) && !rc) rc = FSDP_ERR_RANK_FAILED;
        if (have_old_chld) sigaction(SIGCHLD, &old_chld, NULL);
        fsdp__launch_blame(&l, status);
    }
    if (l.inherit.listen_fd >= 0) close(l.inherit.listen_fd);
    if (l.inherit.mapping) munmap(l.inherit.mapping, l.inherit.map_bytes);
    if (l.board) munmap(l.board, l.board_bytes);
    FSDP_FREE(l.pids);
    FSDP_FREE(l.outcome);
    fsdp__wipe(l.secret, sizeof l.secret);
    return rc;
}

FSDP_API int fsdp_launch_ex(const fsdp_launch_desc *desc, fsdp_rank_fn fn, void *arg, fsdp_launch_status *status) {
    fsdp_launch_status local;
    int attempt = 0, rc;
    if (!status) status = &local;
    for (;;) {
        rc = fsdp__launch_once(desc, fn, arg, status, attempt);
        status->restarts = attempt;
        if (rc != FSDP_ERR_RANK_FAILED || !desc || attempt >= desc->max_restarts) return rc;
        {
            fsdp_logger logger = fsdp__env_logger(desc->logger);
            fsdp__log(&logger, FSDP_LOG_WARN, "fsdp_launch: %s; restarting every rank (restart %d of %d)",
                      status->message, attempt + 1, desc->max_restarts);
        }
        attempt++;
    }
}

FSDP_API int fsdp_launch(int nprocs, fsdp_rank_fn fn, void *arg) {
    fsdp_launch_desc desc;
    fsdp_launch_status status;
    int rc;
    memset(&desc, 0, sizeof desc);
    desc.nprocs = nprocs;
    rc = fsdp_launch_ex(&desc, fn, arg, &status);
    if (rc != FSDP_SUCCESS) fprintf(stderr, "fsdp_launch: %s\n", status.message[0] ? status.message : fsdp_result_description(rc));
    return rc;
}

#endif /* the feature macros' check */
#endif /* FSDP__IMPLEMENTED */
#endif /* FSDP_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the fsdp.h authors

Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
