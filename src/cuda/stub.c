/* src/cuda/stub.c: the xent_cuda_* entry points of a build without CUDA
 * (compiled only when nvcc is absent, see mk/cuda.mk). */
#include "core/xent_internal.h"

static xent_status xc_unsupported(const char *fn) {
    return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: this build has no CUDA support (nvcc was not found)", fn);
}

int xent_cuda_device_count(void) { return 0; }


int xent_cuda_set_label_check(int on) {
    (void)on;
    return 1;
}

int xent_cuda_set_exact(int on) {
    (void)on;
    return 0;
}

xent_status xent_cuda_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                         xent_ce_output *out, void *stream) {
    (void)in; (void)opts; (void)out; (void)stream;
    return xc_unsupported("xent_cuda_ce");
}

xent_status xent_cuda_logprobs(const xent_ce_input *in, const xent_ce_opts *opts,
                               float *logprob, float *entropy, void *stream) {
    (void)in; (void)opts; (void)logprob; (void)entropy; (void)stream;
    return xc_unsupported("xent_cuda_logprobs");
}

xent_status xent_cuda_ce_backward(const xent_ce_input *in, const xent_ce_opts *opts,
                                  const xent_ce_stats *stats, void *grad,
                                  xent_dtype grad_dtype, int64_t ld_grad, void *stream) {
    (void)in; (void)opts; (void)stats; (void)grad; (void)grad_dtype; (void)ld_grad;
    (void)stream;
    return xc_unsupported("xent_cuda_ce_backward");
}

xent_status xent_cuda_ce_shard_stats(const xent_ce_input *in, const xent_ce_opts *opts,
                                     xent_ce_partial *partial, void *stream) {
    (void)in; (void)opts; (void)partial; (void)stream;
    return xc_unsupported("xent_cuda_ce_shard_stats");
}

xent_status xent_cuda_ce_combine(const xent_ce_partial *parts, int S,
                                 const xent_ce_input *in, const xent_ce_opts *opts,
                                 xent_ce_output *out, void *stream) {
    (void)parts; (void)S; (void)in; (void)opts; (void)out; (void)stream;
    return xc_unsupported("xent_cuda_ce_combine");
}

size_t xent_cuda_linear_workspace(const xent_linear_input *in,
                                  const xent_linear_grads *grads, int64_t chunk_rows) {
    (void)in; (void)grads; (void)chunk_rows;
    return 0;
}

xent_status xent_cuda_linear_ce(const xent_linear_input *in, const xent_ce_opts *opts,
                                xent_ce_output *out, const xent_linear_grads *grads,
                                void *workspace, size_t workspace_bytes, void *stream) {
    (void)in; (void)opts; (void)out; (void)grads; (void)workspace; (void)workspace_bytes;
    (void)stream;
    return xc_unsupported("xent_cuda_linear_ce");
}

xent_status xent_cuda_linear_logprobs(const xent_linear_input *in, const xent_ce_opts *opts,
                                      float *logprob, float *entropy, void *workspace,
                                      size_t workspace_bytes, void *stream) {
    (void)in; (void)opts; (void)logprob; (void)entropy; (void)workspace;
    (void)workspace_bytes; (void)stream;
    return xc_unsupported("xent_cuda_linear_logprobs");
}

xent_status xent_cuda_linear_shard_stats(const xent_linear_input *in, const xent_ce_opts *opts,
                                         xent_ce_partial *partial, void *workspace,
                                         size_t workspace_bytes, void *stream) {
    (void)in; (void)opts; (void)partial; (void)workspace; (void)workspace_bytes; (void)stream;
    return xc_unsupported("xent_cuda_linear_shard_stats");
}

xent_status xent_cuda_linear_backward(const xent_linear_input *in, const xent_ce_opts *opts,
                                      const xent_ce_stats *stats, const xent_linear_grads *grads,
                                      void *workspace, size_t workspace_bytes, void *stream) {
    (void)in; (void)opts; (void)stats; (void)grads; (void)workspace; (void)workspace_bytes;
    (void)stream;
    return xc_unsupported("xent_cuda_linear_backward");
}


xent_status xent_cuda_sampler_logprobs(const xent_ce_input *in, const xent_sampler_opts *opts,
                                       xent_sampler_output *out, void *stream) {
    (void)in; (void)opts; (void)out; (void)stream;
    return xc_unsupported("xent_cuda_sampler_logprobs");
}
