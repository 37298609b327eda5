/* xent/cuda.h: the cross-entropy kernels on CUDA: the CPU's API, options and
 * error rules, with the accuracy stated below (measured against the CPU).
 * Included by xent.h; do not include directly. The functions exist in every
 * build; without CUDA they return XENT_ERR_UNSUPPORTED.
 *
 * Pointers: every array argument (logits, labels, grad_rows, stats, parts,
 * partial, grad and every field of xent_ce_output: loss, nll, logprob, lse,
 * entropy, stats, n_counted, n_nonfinite) is DEVICE memory. The structs
 * themselves (xent_ce_input, xent_ce_opts, xent_ce_output) are host memory.
 * `stream` is a cudaStream_t (NULL: the legacy default stream).
 *
 * Synchronization: with label checking on (the default), each call first
 * runs a small validation kernel and copies a 16-byte record back to the
 * host, which waits for it once (for that kernel, not for the row kernels
 * queued behind it); every kernel that writes an output reads the record
 * first and writes nothing when it reports a bad row, so on XENT_ERR_LABEL
 * nothing has been written. With checking off
 * (xent_cuda_set_label_check(0)) the call is fully asynchronous; a bad label
 * then gives a NaN row (loss, outputs and gradient row) and is counted in
 * n_nonfinite, and nothing is read out of bounds.
 *
 * Scratch: each call takes stream-ordered scratch on `stream` (freed on
 * `stream` before it returns): 16 bytes, plus 576 when a reduced loss or a
 * count is asked for (whatever T), plus 16 a row when a call without a
 * gradient, entropy or label smoothing leaves each row's statistics for a
 * second kernel to finish. It comes from a memory
 * pool the library creates on each device at first use, which keeps up to
 * 64 MiB of freed scratch between calls; under CUDA graph capture (and on
 * a non-default stream before CUDA 12.8), from cudaMallocAsync.
 *
 * Exactness (docs/cuda.md): the fast bf16/f16 path sums in fp32 lanes and
 * uses the hardware exp2, so it does not carry the CPU's 1-ulp guarantee:
 * forward outputs are within 4 ulp of the CPU xent_ce (the MUFU exp2's
 * error when one term dominates a row's sum; 2 ulp in almost every row
 * measured on an H200; 2 ulp on every row in exact mode,
 * xent_cuda_set_exact below), bf16/f16 gradients within 1 ulp of the
 * CPU (label smoothing: the CPU's absolute bound), fp32 gradients are
 * computed in double like the CPU. Every per-row result is bitwise identical
 * whatever T and the row's position, and with or without a gradient (a
 * call that asks for entropy or label smoothing sums another way: its nll
 * agrees with one that does not within the bound above, not bitwise); a
 * reduced loss is the exact sum of the
 * rows' losses rounded once (integer atomics on a long accumulator), so it
 * does not depend on the order of the rows (no floating-point atomics).
 *
 * Differences from the CPU entry points: V must be below 2^33. Bad input
 * is found by one small pass before the rows are touched, as on the CPU:
 * a label outside [0, vocab_total) (XENT_ERR_LABEL), a non-finite
 * grad_rows value, a combine whose shards do not claim each counted row's
 * target exactly once (XENT_ERR_VALUE); the same error as the CPU reports
 * when several are bad. With
 * xent_cuda_set_label_check(0) nothing is checked on the host: a bad label
 * or a bad combine makes the row's outputs NaN (counted in n_nonfinite), a
 * non-finite grad_rows value makes the row's gradient NaN. */
#ifndef XENT_CUDA_H
#define XENT_CUDA_H
#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable by this build (0 without CUDA or GPU). */
XENT_API int xent_cuda_device_count(void);

/* Label checking for the calls made on this thread (default 1). Returns the
 * previous setting. */
XENT_API int xent_cuda_set_label_check(int on);

/* Exact mode for the calls made on this thread (default 0). Returns the
 * previous setting. On, bf16/f16 logits take the precise path's pass 1, as
 * fp32 logits always do: each term in double with the CPU's exp, sums in
 * double, each output rounded once, so every forward output is within 2
 * ulp of the CPU's on every row; a bf16/f16 gradient keeps the fast form
 * (within 1 ulp either way). It costs time (docs/cuda.md, bench/RESULTS.md).
 * Off, the fast path's bound applies (above). The fused LM head's calls
 * (below) ignore it. */
XENT_API int xent_cuda_set_exact(int on);

/* The kernels of a call. By default they are chosen from the shape and the
 * options by one rule (src/cuda/select.cu; docs/cuda.md, "Kernel
 * selection"): on the fast path, 16-bit logits with V <= 16384 take the
 * on-chip kernel (one block holds a row); everything else takes the
 * streaming kernel, whose block size is a function of V alone; the fused LM
 * head makes 512 logits rows a chunk when it makes gradients. A non-zero
 * field forces a choice for the calls made on this thread, for tests and
 * benchmarks: every choice keeps the bounds above, and per-row results stay
 * bitwise the same across T, row positions and entry points under one plan;
 * two plans may differ in the last bits (another summation order). */
typedef struct xent_cuda_plan {
    int32_t kernel;         /* 0: chosen; 1: the streaming kernel; 2: the
                               on-chip kernel where it applies (fast path,
                               16-bit logits, the row fits its slices)      */
    int32_t block;          /* streaming kernel: threads a block, 32..1024,
                               a multiple of 32; 0: chosen                  */
    int32_t stage_bytes;    /* streaming kernel with a gradient: shared
                               memory a block keeps of its row between the
                               passes, 1..204800; -1: none; 0: chosen      */
    int32_t onchip_blocks;  /* on-chip kernel: blocks a row (a cluster):
                               1, 2, 4 or 8; 0: chosen (1)                  */
    int32_t onchip_threads; /* on-chip kernel: threads a block, 32..256, a
                               multiple of 32; 0: chosen                    */
    int32_t onchip_groups;  /* on-chip kernel: at most this many clusters in
                               flight (each then does more rows); 0: all
                               that fit                                     */
    int64_t linear_rows;    /* fused LM head: logits rows a chunk when it
                               makes gradients, 1..2^20; 0: chosen         */
} xent_cuda_plan;

/* Fills *p with the default plan (every field 0: chosen). */
XENT_API void xent_cuda_plan_init(xent_cuda_plan *p);
/* Sets the plan of the calls made on this thread (NULL: the default) and
 * returns the previous one in *old (may be NULL). XENT_ERR_VALUE naming the
 * field when a value is outside its range (nothing changed then). */
XENT_API xent_status xent_cuda_set_plan(const xent_cuda_plan *p, xent_cuda_plan *old);

/* As xent_ce: forward, and the gradient when out->grad is set. */
XENT_API xent_status xent_cuda_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                         xent_ce_output *out, void *stream);

/* As xent_logprobs: logprob [T] and entropy [T] (either may be NULL). */
XENT_API xent_status xent_cuda_logprobs(const xent_ce_input *in,
                               const xent_ce_opts *opts, float *logprob,
                               float *entropy, void *stream);

/* As xent_ce_backward: the gradient from the logits and saved stats [T]. */
XENT_API xent_status xent_cuda_ce_backward(const xent_ce_input *in,
                                  const xent_ce_opts *opts,
                                  const xent_ce_stats *stats, void *grad,
                                  xent_dtype grad_dtype, int64_t ld_grad,
                                  void *stream);

/* As xent_ce_shard_stats: partial [T] per-row statistics of one shard. */
XENT_API xent_status xent_cuda_ce_shard_stats(const xent_ce_input *in,
                                     const xent_ce_opts *opts,
                                     xent_ce_partial *partial, void *stream);

/* As xent_ce_combine: parts [S][T] (shard-major) -> forward outputs. */
XENT_API xent_status xent_cuda_ce_combine(const xent_ce_partial *parts, int S,
                                 const xent_ce_input *in,
                                 const xent_ce_opts *opts,
                                 xent_ce_output *out, void *stream);

/* ------------------------------------------------------------------------ */
/* The LM head fused with the cross-entropy (docs/linear_ce.md)             */
/* ------------------------------------------------------------------------ */
/* logits = hidden @ weight^T (+ bias), computed by cuBLAS with fp32
 * accumulation in chunks of rows, kept in fp32 and consumed by the exact
 * loss above; no [T, V] buffer exists. The logit gradient of a chunk is
 * rounded once to the GEMM input dtype (dlogits) and the gradients of
 * hidden and weight are products with fp32 accumulation: dhidden of a
 * chunk in one product over the whole vocabulary (rounded once to its
 * dtype); dweight summed over the chunks in fp32 (in the caller's buffer
 * when it is fp32, else in the workspace) and rounded once at the end.
 *
 * Per-row results do not depend on the other rows' values, but the GEMM
 * algorithm cuBLAS picks may depend on the chunk's row count, so the bits
 * of a row's logits can depend on T and the chunk size (not on the run:
 * repeated calls with the same shapes give the same bits). */
typedef struct xent_linear_input {
    const void *hidden;     /* [T, H] row-major                               */
    const void *weight;     /* [V, H] row-major: vocabulary rows vocab_start ..
                               vocab_start + V - 1 (opts)                     */
    const void *bias;       /* [V] or NULL                                    */
    xent_dtype dtype;       /* of hidden, weight and bias: F32, BF16 or F16;
                               F32 products are true fp32 (no TF32)           */
    int64_t T, H, V;        /* T >= 0; 0 < H, V < 2^31                        */
    const void *labels;     /* [T] global target ids, or NULL                 */
    xent_dtype label_dtype; /* XENT_I32 or XENT_I64                           */
    const float *grad_rows; /* [T] upstream per-row gradient for reduction
                               NONE (times opts.grad_scale); NULL = 1         */
} xent_linear_input;

/* Gradient buffers (device), each optional (NULL: not computed). */
typedef struct xent_linear_grads {
    void *hidden;            /* [T, H] dL/dhidden                             */
    xent_dtype hidden_dtype; /* in.dtype or F32 (the product writes it)      */
    void *weight;            /* [V, H] dL/dweight                             */
    xent_dtype weight_dtype;
    void *bias;              /* [V] dL/dbias                                  */
    xent_dtype bias_dtype;
    int accumulate;          /* 0: overwrite; 1: add the gradients to what the
                                buffers hold (one rounding to their dtype)   */
} xent_linear_grads;

/* Workspace bytes for a call with these shapes and gradients (grads NULL:
 * forward only) and groups of chunk_rows rows (0: the default, about
 * 768 MiB of chunk buffers). With gradients a group's dlogits [rows, V] are
 * kept for the gradient products and its logits are made 512 rows at a
 * time (fp32 [512, V]); forward only, the logits fp32 [rows, V]. Besides:
 * 1 KiB (the label record and the reductions' accumulator, 256-aligned),
 * an fp32 accumulator [V, H] when the weight gradient is
 * not fp32, and [V] doubles for a bias gradient. A call uses the largest
 * group its workspace holds. Returns 0 when `in` is NULL or its T, H or V
 * is out of range (the call itself then names the problem). */
XENT_API size_t xent_cuda_linear_workspace(const xent_linear_input *in,
                                  const xent_linear_grads *grads,
                                  int64_t chunk_rows);

/* Forward over whole rows (opts.vocab_start 0) with every xent_ce option and
 * output of `out` (out->grad must be NULL: there is no logit buffer), and
 * the gradients in `grads` when it is non-NULL. workspace: device memory
 * of workspace_bytes, or NULL to let the call allocate the default size
 * (cudaMallocAsync on `stream`). Labels are checked first (one
 * synchronization); on any error nothing has been written. */
XENT_API xent_status xent_cuda_linear_ce(const xent_linear_input *in,
                                const xent_ce_opts *opts, xent_ce_output *out,
                                const xent_linear_grads *grads,
                                void *workspace, size_t workspace_bytes,
                                void *stream);

/* Forward only: per-token logprob [T] and entropy [T] (either may be NULL). */
XENT_API xent_status xent_cuda_linear_logprobs(const xent_linear_input *in,
                                      const xent_ce_opts *opts, float *logprob,
                                      float *entropy, void *workspace,
                                      size_t workspace_bytes, void *stream);

/* Vocabulary shards of the weight: each shard (rows vocab_start .. of the
 * whole vocabulary vocab_total, opts) writes partial [T]; the shards'
 * partials go through xent_cuda_ce_combine (which gives the loss and the
 * stats [T]); then each shard calls xent_cuda_linear_backward with the
 * stats. Its hidden gradient is the shard's part: sum it over the shards. */
XENT_API xent_status xent_cuda_linear_shard_stats(const xent_linear_input *in,
                                         const xent_ce_opts *opts,
                                         xent_ce_partial *partial,
                                         void *workspace,
                                         size_t workspace_bytes, void *stream);

/* The gradients from saved stats [T] (recomputes the logits: one more
 * product than xent_cuda_linear_ce). Reduction MEAN divides by the number
 * of rows with a target (or opts.normalizer), counted over all rows. */
XENT_API xent_status xent_cuda_linear_backward(const xent_linear_input *in,
                                      const xent_ce_opts *opts,
                                      const xent_ce_stats *stats,
                                      const xent_linear_grads *grads,
                                      void *workspace, size_t workspace_bytes,
                                      void *stream);

#ifdef __cplusplus
}
#endif
#endif /* XENT_CUDA_H */
