/* xent.h: exact token log-probabilities and cross-entropy losses.
 *
 * One public header, C11 and C++ compatible. Conventions used everywhere:
 *   - every function returns an xent_status; XENT_OK is 0;
 *   - on failure xent_last_error() holds a message that names the field and
 *     the index (e.g. "labels[17] = 200000 is outside [0, 151936)"), and no
 *     output has been written;
 *   - all memory is owned by the caller; sizes and indices are int64_t;
 *   - matrices are row-major with an explicit row stride `ld` in elements
 *     (0 means "dense": ld = number of columns).
 *
 * Sub-headers (included below) hold the parts built on this core:
 *   xent/io.h      .safetensors / .npy tensors in and out
 *   xent/rl.h      RL loss math (advantages, PPO/CISPO/GSPO, TIS, KL)
 *   xent/cuda.h    the same kernels on CUDA (when built with nvcc)
 */
#ifndef XENT_H
#define XENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XENT_VERSION_MAJOR 0
#define XENT_VERSION_MINOR 1
#define XENT_VERSION_PATCH 0
#define XENT_VERSION "0.1.0"

/* XENT_API marks the library's exported functions: libxent.so is built
 * with hidden visibility and exports these alone. */
#if defined(__GNUC__) || defined(__clang__)
#define XENT_API __attribute__((visibility("default")))
#define XENT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define XENT_API
#define XENT_PRINTF(f, a)
#endif

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                   */
/* ------------------------------------------------------------------------ */

typedef enum xent_status {
    XENT_OK = 0,
    XENT_ERR_NULL,        /* a required pointer is NULL                      */
    XENT_ERR_SHAPE,       /* a size is negative, zero where it must not be,
                             or sizes disagree                               */
    XENT_ERR_LABEL,       /* a label is outside [0, V) and not ignore_index  */
    XENT_ERR_DTYPE,       /* a dtype is not supported for this argument      */
    XENT_ERR_VALUE,       /* an option or input value is out of its range    */
    XENT_ERR_ALLOC,       /* memory could not be allocated                   */
    XENT_ERR_IO,          /* a file could not be opened, read or written     */
    XENT_ERR_FORMAT,      /* a file is truncated, malformed or hostile       */
    XENT_ERR_NOT_FOUND,   /* a named tensor / key does not exist             */
    XENT_ERR_CUDA,        /* a CUDA call failed (message carries CUDA's)     */
    XENT_ERR_UNSUPPORTED, /* feature not built in (e.g. no CUDA)             */
    XENT_ERR_INTERNAL,    /* a bug: please report it                         */
    XENT_STATUS_COUNT
} xent_status;

/* A fixed, static description of a status ("label out of range", ...). */
XENT_API const char *xent_strerror(xent_status s);

/* The detailed message of the last failed call on this thread ("" if none).
 * Valid until the next failing xent call on the same thread. */
XENT_API const char *xent_last_error(void);

/* Library version string, e.g. "0.1.0 (cpu, cuda)". */
XENT_API const char *xent_version(void);

/* Records a formatted message as this thread's xent_last_error() and
 * returns s. For code built on libxent (the xent tools, bindings), so that
 * one channel carries every message a caller sees. */
XENT_API xent_status xent_set_error(xent_status s, const char *fmt, ...) XENT_PRINTF(2, 3);

/* ------------------------------------------------------------------------ */
/* Threads                                                                   */
/* ------------------------------------------------------------------------ */

/* The process default for calls whose `threads` is 0: n > 0 sets it (at
 * most 256), n <= 0 restores "all cores" (the CPUs this process may run on:
 * its affinity mask, capped by a cgroup v2 CPU quota). Calls run on a pool
 * of threads started once and kept (a nested or concurrent call that finds
 * the pool busy starts its own threads). Returns the old setting
 * (0 for "all cores"). The library reads no environment variable: a
 * program that wants one (the CLI reads XENT_NUM_THREADS) passes it here. */
XENT_API int xent_set_num_threads(int n);
/* Threads a call asking for `requested` gets: requested > 0, else the
 * process default; clamped to [1, 256]. */
XENT_API int xent_num_threads(int requested);
/* Runs fn(ctx, begin, end) over [0, n) split into `threads` contiguous
 * chunks (fewer when n is small) and returns when all are done. fn must
 * not depend on how the range was split. Runs on the calling thread alone
 * when a thread cannot be started. */
typedef void (*xent_range_fn)(void *ctx, int64_t begin, int64_t end);
XENT_API void xent_parallel_for(int64_t n, int threads, xent_range_fn fn, void *ctx);

/* ------------------------------------------------------------------------ */
/* CPU instruction-set paths                                                 */
/* ------------------------------------------------------------------------ */
/* The CPU kernels are built once for the baseline of the architecture
 * (x86-64: SSE2; aarch64: armv8-a with NEON) and, on x86-64, also for
 * AVX2 + FMA and for AVX-512; the best path the CPU supports is chosen at
 * the first call. Every path computes the same bits (docs/numerics.md,
 * "Bitwise reproducibility"). Forcing a path is for benchmarks and tests. */
typedef enum xent_isa {
    XENT_ISA_AUTO = 0,     /* the best path this CPU supports               */
    XENT_ISA_BASELINE = 1, /* portable C at the build's -march              */
    XENT_ISA_AVX2 = 2,     /* x86-64 with AVX2, FMA, F16C, BMI2             */
    XENT_ISA_AVX512 = 3    /* x86-64 with AVX-512 F, DQ, VL, BW             */
} xent_isa;
/* Selects the path of later CPU calls (process-wide). XENT_ERR_UNSUPPORTED
 * when the path is not built for this architecture or the CPU lacks it
 * (the path in use is then unchanged); XENT_ISA_AUTO restores the best. */
XENT_API xent_status xent_cpu_set_isa(xent_isa isa);
/* The path in use (never XENT_ISA_AUTO). */
XENT_API xent_isa xent_cpu_isa(void);
/* 1 when xent_cpu_set_isa(isa) would succeed on this machine. */
XENT_API int xent_cpu_isa_supported(xent_isa isa);
/* "auto", "baseline", "avx2", "avx512" ("invalid" otherwise). */
XENT_API const char *xent_isa_name(xent_isa isa);

/* ------------------------------------------------------------------------ */
/* Data types                                                                */
/* ------------------------------------------------------------------------ */

typedef enum xent_dtype {
    XENT_F32 = 0,
    XENT_BF16 = 1,
    XENT_F16 = 2,
    XENT_F64 = 3,
    XENT_I32 = 4,
    XENT_I64 = 5,
    XENT_U8 = 6,
    XENT_DTYPE_COUNT
} xent_dtype;

XENT_API size_t xent_dtype_size(xent_dtype t);         /* 0 for an invalid dtype     */
XENT_API const char *xent_dtype_name(xent_dtype t);    /* "f32", "bf16", ...         */
/* Parses "f32"/"float32"/"fp32", "bf16"/"bfloat16", "f16"/"fp16"/"float16",
 * "f64", "i32", "i64", "u8"; returns XENT_ERR_VALUE for anything else. */
XENT_API xent_status xent_dtype_parse(const char *s, xent_dtype *out);

/* Conversions, round-to-nearest-even, NaN stays NaN (quiet), -0 stays -0. */
XENT_API float xent_bf16_to_f32(uint16_t h);
XENT_API uint16_t xent_f32_to_bf16(float f);
XENT_API float xent_f16_to_f32(uint16_t h);
XENT_API uint16_t xent_f32_to_f16(float f);
/* Direct, correctly rounded double -> bf16 / f16 / f32 bit patterns. */
XENT_API uint16_t xent_f64_to_bf16(double d);
XENT_API uint16_t xent_f64_to_f16(double d);

/* ------------------------------------------------------------------------ */
/* Cross-entropy: options                                                    */
/* ------------------------------------------------------------------------ */

typedef enum xent_reduction {
    XENT_REDUCE_NONE = 0, /* loss is [T]: one value per row                  */
    XENT_REDUCE_SUM = 1,  /* loss is one value: sum over counted rows        */
    XENT_REDUCE_MEAN = 2  /* one value: sum / normalizer                     */
} xent_reduction;

/* The transformed logit of column j is  z'_j = cap(z_j) / temperature  with
 * cap(z) = softcap * tanh(z / softcap) when softcap > 0, else z.
 * Per counted row (label t != ignore_index), with lse = log sum_j exp(z'_j):
 *   nll  = lse - z'_t                     (computed without cancellation)
 *   loss = (1 - eps) * nll + eps * (lse - mean_j z'_j) + z_loss * lse^2
 * where eps = label_smoothing. Ignored rows have loss 0 and gradient 0 and are
 * not counted. Reduction MEAN divides the sum by `normalizer` when it is > 0
 * (pass the global count of target tokens across micro-batches and ranks),
 * else by the number of counted rows of this call; a mean over 0 rows is 0. */
typedef struct xent_ce_opts {
    int64_t ignore_index;     /* default -100                                */
    xent_reduction reduction; /* default XENT_REDUCE_MEAN                    */
    double normalizer;        /* default 0 (= count of counted rows)         */
    double temperature;       /* default 1; must be finite and > 0           */
    double softcap;           /* default 0 (off); >= 0                       */
    double z_loss;            /* default 0; coefficient k >= 0 of k * lse^2  */
    double label_smoothing;   /* default 0; in [0, 1]                        */
    double grad_scale;        /* default 1: dL_outer / d(loss) (upstream g)  */
    int64_t vocab_start;      /* default 0: global index of column 0         */
    int64_t vocab_total;      /* default 0 (= V): size of the whole vocabulary;
                                 vocab_start + V <= vocab_total. Labels are
                                 global indices in [0, vocab_total).          */
    int threads;              /* default 0: xent_set_num_threads's, else all cores */
} xent_ce_opts;

/* Fills *o with the defaults above. Every entry point that takes a
 * `const xent_ce_opts *opts` (CPU and CUDA) also accepts NULL: the same
 * defaults. */
XENT_API void xent_ce_opts_init(xent_ce_opts *o);

/* ------------------------------------------------------------------------ */
/* Cross-entropy: inputs and outputs                                         */
/* ------------------------------------------------------------------------ */

typedef struct xent_ce_input {
    const void *logits;     /* [T, ld], the first V columns are used         */
    xent_dtype dtype;       /* XENT_F32, XENT_BF16 or XENT_F16 (XENT_F64:
                               xent_ce_f64 only)                             */
    int64_t T;              /* rows (tokens); 0 is a valid no-op             */
    int64_t V;              /* columns in this call (a shard's width)        */
    int64_t ld;             /* row stride in elements; 0 = V                 */
    const void *labels;     /* [T] global target ids, or NULL: no targets
                               (lse and entropy only; every row ignored)     */
    xent_dtype label_dtype; /* XENT_I32 or XENT_I64                          */
    const float *grad_rows; /* [T] per-row upstream gradient for reduction
                               NONE (multiplied by grad_scale); NULL = 1     */
} xent_ce_input;

/* Saved per-row statistics: all a backward needs besides the logits. */
typedef struct xent_ce_stats {
    double lse; /* log sum_j exp(z'_j) over the whole vocabulary             */
    double nll; /* lse - z'_t to full relative accuracy (0 for ignored rows) */
} xent_ce_stats;

/* Every pointer may be NULL (that output is not computed or written). */
typedef struct xent_ce_output {
    float *loss;           /* NONE: [T] per-row loss; SUM/MEAN: one float    */
    float *nll;            /* [T] -log p_t (0 on ignored rows)               */
    float *logprob;        /* [T]  log p_t (0 on ignored rows)               */
    float *lse;            /* [T] log-sum-exp of the transformed row         */
    float *entropy;        /* [T] H = -sum_j p_j log p_j (all rows)          */
    xent_ce_stats *stats;  /* [T] for xent_ce_backward                       */
    void *grad;            /* [T, ld_grad] dL/dz, or NULL (forward only).
                              May equal in->logits: the gradient overwrites
                              the logits (grad_dtype and ld must match).     */
    xent_dtype grad_dtype; /* XENT_F32, XENT_BF16 or XENT_F16                */
    int64_t ld_grad;       /* 0 = V                                          */
    /* Diagnostics, written on success (ignored if the pointer is NULL):     */
    int64_t *n_counted;    /* rows with a target (not ignore_index)          */
    int64_t *n_nonfinite;  /* rows with a NaN or infinite logit: their
                              lse, entropy and (when counted) nll, logprob,
                              loss and gradient row are NaN; an ignored row
                              keeps loss 0 and a zero gradient, and a row
                              whose upstream gradient is 0 a zero gradient  */
} xent_ce_output;

/* Forward, and the gradient when out->grad is set, in one call, over whole
 * rows (opts->vocab_start must be 0 and vocab_total 0 or V; shards go
 * through xent_ce_shard_stats / xent_ce_combine / xent_ce_backward).
 * Every output row depends only on that row (bitwise, whatever T, the row's
 * position and the number of threads). */
XENT_API xent_status xent_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                    xent_ce_output *out);

/* Forward only: per-token log-probabilities (and entropy when non-NULL).
 * Never touches a [T, V] buffer other than reading the logits. */
XENT_API xent_status xent_logprobs(const xent_ce_input *in, const xent_ce_opts *opts,
                          float *logprob /* [T] */, float *entropy /* [T] */);

/* Backward from the logits and the saved statistics only.
 * grad may equal in->logits (in place). Reduction MEAN uses the same
 * normaliser rule as the forward (opts->normalizer, else the row count). */
XENT_API xent_status xent_ce_backward(const xent_ce_input *in, const xent_ce_opts *opts,
                             const xent_ce_stats *stats /* [T] */,
                             void *grad, xent_dtype grad_dtype,
                             int64_t ld_grad);

/* ------------------------------------------------------------------------ */
/* Vocabulary shards                                                         */
/* ------------------------------------------------------------------------ */
/* Each shard holds columns [vocab_start, vocab_start + V) of the vocabulary
 * (set opts->vocab_start and opts->vocab_total). The flow for S shards:
 *   1. each shard: xent_ce_shard_stats(...) -> partial[T]
 *   2. the caller gathers the S partial arrays (all-gather, shard-major)
 *   3. xent_ce_combine(...) -> loss / nll / logprob / lse / entropy / stats
 *   4. each shard: xent_ce_backward(..., stats, ...) on its own columns.
 * Forward outputs and gradients match the unsharded call (docs/numerics.md).
 * An unsharded xent_ce runs exactly these steps with S = 1. */
typedef struct xent_ce_partial {
    double max;    /* largest raw logit among non-target columns (-inf none) */
    double sum;    /* S - 1, where S = sum over non-target columns of
                      exp(z'_j - cap(max)/tau): the columns at the max (each
                      exactly 1) are counted apart so that S - 1 carries full
                      relative accuracy; 0 when there is no column          */
    double sumx;   /* sum over non-target columns of that term times
                      (z'_j - cap(max)/tau)  (for the entropy)               */
    double zsum;   /* sum over all columns of z'_j (for label smoothing)     */
    double target; /* raw logit of the target if this shard owns it, else 0  */
    int64_t flags; /* bit 0: owns the target; bit 1: non-finite logit seen   */
} xent_ce_partial;

XENT_API xent_status xent_ce_shard_stats(const xent_ce_input *in,
                                const xent_ce_opts *opts,
                                xent_ce_partial *partial /* [T] */);

/* parts: [S][T] (shard-major). labels/label_dtype/T as in the shards' input
 * (grad_rows is not used). Writes the forward outputs of `out` (loss, nll,
 * logprob, lse, entropy, stats, n_counted, n_nonfinite; grad is ignored). */
XENT_API xent_status xent_ce_combine(const xent_ce_partial *parts, int S,
                            const xent_ce_input *in, const xent_ce_opts *opts,
                            xent_ce_output *out);

/* ------------------------------------------------------------------------ */
/* Cross-entropy on float64 logits                                           */
/* ------------------------------------------------------------------------ */
/* The outputs of xent_ce_f64 (float64 logits), in double. Every pointer
 * may be NULL (that output is not computed or written). */
typedef struct xent_ce_output_f64 {
    double *loss;          /* NONE: [T] per-row loss; SUM/MEAN: one double   */
    double *nll;           /* [T] -log p_t (0 on ignored rows)               */
    double *logprob;       /* [T]  log p_t (0 on ignored rows)               */
    double *lse;           /* [T] log-sum-exp of the transformed row         */
    double *entropy;       /* [T] H = -sum_j p_j log p_j (all rows)          */
    xent_ce_stats *stats;  /* [T] {lse, nll} (informational: the gradient of
                              f64 logits is recomputed from the logits, see
                              xent_ce_f64)                                   */
    double *grad;          /* [T, ld_grad] dL/dz, or NULL (forward only);
                              may equal in->logits (in place, equal strides) */
    int64_t ld_grad;       /* 0 = V                                          */
    int64_t *n_counted;    /* rows with a target (not ignore_index)          */
    int64_t *n_nonfinite;  /* rows with a NaN or +inf logit, or whose logits
                              are all -inf: their lse, entropy and (when
                              counted) nll, logprob, loss and gradient row
                              are NaN                                        */
} xent_ce_output_f64;

/* Cross-entropy of float64 logits (in->dtype == XENT_F64, whole rows), the
 * definitions of xent_ce_opts, with every double output faithfully rounded
 * (within 1 ulp of double: docs/numerics.md, "The float64 path"): nll,
 * logprob, loss, entropy, and the gradient (label smoothing: an absolute
 * bound). Differences from the f32/bf16/f16 entry points:
 *   - a -inf logit is a probability of exactly 0 (exp(-inf) = 0): a target
 *     at -inf gives nll = +inf (and, without label smoothing, a gradient
 *     of -g there); only NaN, +inf and all -inf rows are non-finite;
 *   - there is no backward from saved statistics: a backward is this call
 *     with out->grad set (and the other outputs NULL), with the upstream
 *     gradient in opts->grad_scale, or per row (reduction NONE) in
 *     grad_rows ([T] doubles; NULL: in->grad_rows, floats, or 1);
 *   - opts->softcap and vocabulary shards (vocab_start != 0) are refused
 *     (XENT_ERR_UNSUPPORTED / XENT_ERR_VALUE).
 * CPU only (the CUDA entry points refuse f64 logits with XENT_ERR_DTYPE).
 * Computes in long double with error-free transformations
 * (x86-64: 80-bit; aarch64: IEEE quad, correct but slower); a build whose
 * long double has fewer than 64 bits of mantissa returns
 * XENT_ERR_UNSUPPORTED. */
XENT_API xent_status xent_ce_f64(const xent_ce_input *in, const xent_ce_opts *opts,
                                 const double *grad_rows, xent_ce_output_f64 *out);

/* ------------------------------------------------------------------------ */
/* ABI introspection (for bindings that mirror the structs, e.g. ctypes)     */
/* ------------------------------------------------------------------------ */
/* sizeof of a public struct named like "xent_ce_opts", or offsetof of one of
 * its fields named like "xent_ce_opts.threads"; (size_t)-1 if unknown. */
XENT_API size_t xent_abi_sizeof(const char *name);

#ifdef __cplusplus
}
#endif

#include "xent/io.h"
#include "xent/rl.h"
#include "xent/cuda.h"
#include "xent/sampler.h"

#endif /* XENT_H */
