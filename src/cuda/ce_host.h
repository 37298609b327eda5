/* src/cuda/ce_host.h: host-side helpers of the CUDA cross-entropy
 * (ce_api.cu), shared with the fused LM head (linear_ce.cu). */
#ifndef XENT_CUDA_CE_HOST_H
#define XENT_CUDA_CE_HOST_H

#include "ce_kernels.h"

#include <cuda_runtime.h>


/* cudaMallocAsync from the library's pool on the stream's device (it
 * keeps freed memory across synchronizations: ce_api.cu). */
cudaError_t xc_malloc_async(void **ptr, size_t bytes, cudaStream_t s);
/* xc_malloc_async as a status: on failure XENT_ERR_CUDA naming `what`, the
 * bytes asked for and the CUDA error. */
xent_status xc_alloc(void **ptr, size_t bytes, cudaStream_t s, const char *what);
/* XENT_OK, or XENT_ERR_CUDA with `what` and CUDA's message. */
xent_status xc_cuda(cudaError_t e, const char *what);
/* dtype is F32, BF16 or F16. */
int xc_is_float(xent_dtype t);
/* The CPU's option checks, with `fn` in front of the message. */
xent_status xc_check_opts(const char *fn, const xent_ce_opts *o, int64_t V);
/* Kernel parameters from an input and options (outputs left NULL). */
xc_params xc_make(const xent_ce_input *in, const xent_ce_opts *o);
/* Label pass into rec_d (device, 16 bytes): the count of rows with a
 * target; when checking, synchronizes `s` and reports the first bad row. */
xent_status xc_label_pass(const char *fn, const xc_params *p, xc_label_rec *rec_d,
                          cudaStream_t s);
/* The per-row forward outputs of `out` into p (loss rows for reduction
 * NONE; extra = entropy or label smoothing needs the second sums). */
void xc_set_outputs(xc_params *p, const xent_ce_output *out);
/* Zero the reduced loss (not for reduction NONE) and the counts: T = 0. */
xent_status xc_zero_rows(xent_ce_output *out, const xent_ce_opts *o, cudaStream_t s);

#endif
