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
 * host, which synchronizes `stream` once; the outputs are written only after
 * that, so on XENT_ERR_LABEL nothing has been written. With checking off
 * (xent_cuda_set_label_check(0)) the call is fully asynchronous; a bad label
 * then gives a NaN row (loss, outputs and gradient row) and is counted in
 * n_nonfinite, and nothing is read out of bounds.
 *
 * Exactness (docs/cuda.md): the fast bf16/f16 path sums in fp32 lanes and
 * uses the hardware exp2, so it does not carry the CPU's 1-ulp guarantee:
 * forward outputs are within 2 ulp of the CPU xent_ce (measured on an H200;
 * within 3 ulp of the exact value), bf16/f16 gradients within 1 ulp of the
 * CPU (label smoothing: the CPU's absolute bound), fp32 gradients are
 * computed in double like the CPU. Every per-row result is bitwise identical
 * whatever T and the row's position; reductions run in a fixed order (no
 * floating-point atomics).
 *
 * Differences from the CPU entry points: opts may be NULL (the defaults);
 * grad_rows is not checked for NaN (a NaN there gives a NaN gradient row);
 * xent_cuda_ce_combine does not check that exactly one shard owns each
 * counted row's target (the CPU does); V must be below 2^33. */
#ifndef XENT_CUDA_H
#define XENT_CUDA_H
#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable by this build (0 without CUDA or GPU). */
int xent_cuda_device_count(void);

/* Label checking for the calls made on this thread (default 1). Returns the
 * previous setting. */
int xent_cuda_set_label_check(int on);

/* As xent_ce: forward, and the gradient when out->grad is set. */
xent_status xent_cuda_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                         xent_ce_output *out, void *stream);

/* As xent_logprobs: logprob [T] and entropy [T] (either may be NULL). */
xent_status xent_cuda_logprobs(const xent_ce_input *in,
                               const xent_ce_opts *opts, float *logprob,
                               float *entropy, void *stream);

/* As xent_ce_backward: the gradient from the logits and saved stats [T]. */
xent_status xent_cuda_ce_backward(const xent_ce_input *in,
                                  const xent_ce_opts *opts,
                                  const xent_ce_stats *stats, void *grad,
                                  xent_dtype grad_dtype, int64_t ld_grad,
                                  void *stream);

/* As xent_ce_shard_stats: partial [T] per-row statistics of one shard. */
xent_status xent_cuda_ce_shard_stats(const xent_ce_input *in,
                                     const xent_ce_opts *opts,
                                     xent_ce_partial *partial, void *stream);

/* As xent_ce_combine: parts [S][T] (shard-major) -> forward outputs. */
xent_status xent_cuda_ce_combine(const xent_ce_partial *parts, int S,
                                 const xent_ce_input *in,
                                 const xent_ce_opts *opts,
                                 xent_ce_output *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* XENT_CUDA_H */
