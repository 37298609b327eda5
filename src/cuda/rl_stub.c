/* src/cuda/rl_stub.c: the xent_cuda_rl_* entry points of a build without
 * CUDA (compiled only when nvcc is absent, see mk/cuda.mk). */
#include "core/xent_internal.h"

static xent_status rl_unsupported(const char *fn) {
    return xent_set_error(XENT_ERR_UNSUPPORTED,
                      "%s: this build has no CUDA support (nvcc was not found)", fn);
}

xent_status xent_cuda_rl_group_advantages(const float *rewards,
                                          const xent_rl_groups *groups,
                                          const xent_rl_adv_opts *opts,
                                          float *adv, double *group_mean,
                                          double *group_std,
                                          xent_rl_adv_stats *stats,
                                          void *stream) {
    (void)rewards; (void)groups; (void)opts; (void)adv; (void)group_mean;
    (void)group_std; (void)stats; (void)stream;
    return rl_unsupported("xent_cuda_rl_group_advantages");
}

xent_status xent_cuda_rl_batch_normalize(const float *adv_in, int64_t n,
                                         const uint8_t *mask,
                                         const xent_rl_batch_opts *opts,
                                         float *adv_out,
                                         xent_rl_batch_stats *stats,
                                         void *stream) {
    (void)adv_in; (void)n; (void)mask; (void)opts; (void)adv_out; (void)stats;
    (void)stream;
    return rl_unsupported("xent_cuda_rl_batch_normalize");
}

xent_status xent_cuda_rl_policy_loss(const xent_rl_input *in,
                                     const xent_rl_loss_opts *opts,
                                     float *token_loss, float *grad,
                                     xent_rl_loss_stats *stats, void *stream) {
    (void)in; (void)opts; (void)token_loss; (void)grad; (void)stats; (void)stream;
    return rl_unsupported("xent_cuda_rl_policy_loss");
}

xent_status xent_cuda_rl_kl_estimate(xent_rl_kl kind, const float *lp_new,
                                     const float *lp_ref, int64_t T,
                                     const uint8_t *mask,
                                     double log_ratio_clamp, float *kl,
                                     float *dkl, int64_t *n_clamped,
                                     void *stream) {
    (void)kind; (void)lp_new; (void)lp_ref; (void)T; (void)mask;
    (void)log_ratio_clamp; (void)kl; (void)dkl; (void)n_clamped; (void)stream;
    return rl_unsupported("xent_cuda_rl_kl_estimate");
}

xent_status xent_cuda_rl_diagnostics(const xent_rl_input *in,
                                     const xent_rl_loss_opts *opts,
                                     xent_rl_diag *out, void *stream) {
    (void)in; (void)opts; (void)out; (void)stream;
    return rl_unsupported("xent_cuda_rl_diagnostics");
}

xent_status xent_cuda_rl_check_logprobs(const char *name, const float *lp,
                                        int64_t T, const int64_t *offsets,
                                        int64_t nseq, const uint8_t *mask,
                                        int allow_neg_inf,
                                        int64_t zero_run_limit,
                                        xent_rl_lp_report *report,
                                        void *stream) {
    (void)name; (void)lp; (void)T; (void)offsets; (void)nseq; (void)mask;
    (void)allow_neg_inf; (void)zero_run_limit; (void)report; (void)stream;
    return rl_unsupported("xent_cuda_rl_check_logprobs");
}
