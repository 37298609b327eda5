/* src/rl/rl_diag.c: one-call diagnostics of a batch of log-probs: policy
 * ratio spread and clip fractions, and the trainer/sampler mismatch (ESS,
 * chi-square, KL) of the importance weights. Formulas in docs/rl.md. */
#include "rl/rl_internal.h"

/* Running sums over counted tokens. */
typedef struct diag_acc {
    int64_t n, n_low, n_high, n_out, n_rclamp, n_wclamp;
    double r_sum, r_min, r_max;
    double w_sum, w_sq, w_max, chi, k1, k3;
} diag_acc;

static void add_ratio(diag_acc *a, double lr, int hit, double lo, double hi) {
    double r = xent__exp(lr);
    a->n_rclamp += hit;
    a->r_sum += r;
    if (r < a->r_min) a->r_min = r;
    if (r > a->r_max) a->r_max = r;
    a->n_low += r < lo;
    a->n_high += r > hi;
    a->n_out += r < 0.125 || r > 8.0;
}

static void add_weight(diag_acc *a, double lw, int hit) {
    double w = xent__exp(lw);
    a->n_wclamp += hit;
    a->w_sum += w;
    a->w_sq += w * w;
    if (w > a->w_max) a->w_max = w;
    a->chi += (w - 1.0) * (w - 1.0);
    a->k1 += -lw;
    a->k3 += xent__rl_k3(lw);
}

static void finish(const diag_acc *a, int has_old, int has_w, xent_rl_diag *o) {
    double n = (double)a->n;
    memset(o, 0, sizeof *o);
    o->n_tokens = a->n;
    o->has_weights = has_w;
    if (a->n == 0) return;
    if (has_old) {
        o->clip_frac_low = (double)a->n_low / n;
        o->clip_frac_high = (double)a->n_high / n;
        o->ratio_min = a->r_min;
        o->ratio_mean = a->r_sum / n;
        o->ratio_max = a->r_max;
        o->ratio_frac_out = (double)a->n_out / n;
        o->n_ratio_clamped = a->n_rclamp;
    }
    if (has_w) {
        o->ess_frac = a->w_sq > 0.0 ? a->w_sum * a->w_sum / (n * a->w_sq) : 0.0;
        o->chi2 = a->chi / n;
        o->mismatch_kl_k1 = a->k1 / n;
        o->mismatch_kl_k3 = a->k3 / n;
        o->weight_max = a->w_max;
        o->n_weight_clamped = a->n_wclamp;
    }
}

static xent_status check_diag_call(const xent_rl_input *in,
                                   const xent_rl_loss_opts *o) {
    xent_status s;
    if (!(o->eps_low >= 0.0) || isinf(o->eps_low) || !(o->eps_high >= 0.0))
        return xent_set_error(XENT_ERR_VALUE, "opts->eps_low = %g / eps_high = %g "
                          "must be >= 0", o->eps_low, o->eps_high);
    if (!(o->log_ratio_clamp > 0.0) || !(o->log_ratio_clamp <= 80.0))
        return xent_set_error(XENT_ERR_VALUE, "opts->log_ratio_clamp = %g must be "
                          "in (0, 80]", o->log_ratio_clamp);
    if (o->zero_run_limit < 0)
        return xent_set_error(XENT_ERR_VALUE, "opts->zero_run_limit = %lld < 0",
                          (long long)o->zero_run_limit);
    if (in->T < 0 || in->nseq < 0)
        return xent_set_error(XENT_ERR_SHAPE, "in->T = %lld, in->nseq = %lld: must "
                          "be >= 0", (long long)in->T, (long long)in->nseq);
    if ((s = xent__rl_check_offsets("in->offsets", in->offsets, in->nseq, in->T)) ||
        (s = xent__rl_check_mask("in->mask", in->mask, in->T)))
        return s;
    if (!in->lp_new) return xent_set_error(XENT_ERR_NULL, "in->lp_new is NULL");
    const char *names[3] = {"in->lp_new", "in->lp_old", "in->lp_sampler"};
    const float *arrs[3] = {in->lp_new, in->lp_old, in->lp_sampler};
    for (int k = 0; k < 3; k++)
        if (arrs[k] && (s = xent_rl_check_logprobs(names[k], arrs[k], in->T,
                             in->offsets, in->nseq, in->mask, k > 0,
                             o->zero_run_limit, NULL)))
            return s;
    return XENT_OK;
}

xent_status xent_rl_diagnostics(const xent_rl_input *in,
                                const xent_rl_loss_opts *opts,
                                xent_rl_diag *out) {
    if (!in || !opts || !out)
        return xent_set_error(XENT_ERR_NULL, "xent_rl_diagnostics: %s is NULL",
                          !in ? "in" : !opts ? "opts" : "out");
    xent_status s = check_diag_call(in, opts);
    if (s) return s;
    diag_acc a;
    memset(&a, 0, sizeof a);
    a.r_min = INFINITY;
    a.r_max = -INFINITY;
    double lo = 1.0 - opts->eps_low, hi = 1.0 + opts->eps_high, C = opts->log_ratio_clamp;
    const float *trn = in->lp_old ? in->lp_old : in->lp_new;
    for (int64_t t = 0; t < in->T; t++) {
        if (!xent__rl_counted(in->mask, t)) continue;
        int hit;
        a.n++;
        if (in->lp_old) {
            double lr = xent__rl_clamp(xent__rl_logdiff(in->lp_new[t], in->lp_old[t]), C, &hit);
            add_ratio(&a, lr, hit, lo, hi);
        }
        if (in->lp_sampler) {
            double lw = xent__rl_clamp(xent__rl_logdiff(trn[t], in->lp_sampler[t]), C, &hit);
            add_weight(&a, lw, hit);
        }
    }
    finish(&a, in->lp_old != NULL, in->lp_sampler != NULL, out);
    return XENT_OK;
}

double xent_rl_k3(double d) { return xent__rl_k3(d); }
