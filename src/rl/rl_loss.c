/* src/rl/rl_loss.c: policy losses (PPO, CISPO, GSPO, REINFORCE) with the
 * gradient w.r.t. the new log-probs, truncated importance sampling, KL
 * estimators and loss aggregation. Formulas: include/xent/rl.h and
 * docs/rl.md. Every per-token quantity is computed in double from the float
 * inputs and rounded once at the store; sums are in double, in token order,
 * so results do not depend on anything but the inputs. exp is xent__exp
 * (relative error below 2^-50 in double, far below the float store). */
#include "rl/rl_internal.h"

void xent_rl_loss_opts_init(xent_rl_loss_opts *o) {
    o->loss = XENT_RL_LOSS_PPO;
    o->eps_low = 0.2;
    o->eps_high = 0.2;
    o->dual_clip = 0.0;
    o->log_ratio_clamp = 20.0;
    o->agg = XENT_RL_AGG_TOKEN_SUM;
    o->token_norm = 0.0;
    o->seq_norm = 0.0;
    o->tis = XENT_RL_TIS_OFF;
    o->tis_mode = XENT_RL_TIS_TRUNCATE;
    o->tis_cap = 2.0;
    o->kl = XENT_RL_KL_NONE;
    o->kl_coef = 0.0;
    o->zero_run_limit = 32;
}

/* ---- option and input checks --------------------------------------------- */

static xent_status bad(const char *field, double v, const char *rule) {
    return xent_set_error(XENT_ERR_VALUE, "opts->%s = %g: %s", field, v, rule);
}

/* Options used by the diagnostics too (clip bounds, clamp, zero runs). */
static xent_status check_common_opts(const xent_rl_loss_opts *o) {
    if (!(o->eps_low >= 0.0) || isinf(o->eps_low))
        return bad("eps_low", o->eps_low, "must be finite and >= 0");
    if (!(o->eps_high >= 0.0))
        return bad("eps_high", o->eps_high, "must be >= 0 (+inf: no upper clip)");
    if (!(o->log_ratio_clamp > 0.0) || !(o->log_ratio_clamp <= 80.0))
        return bad("log_ratio_clamp", o->log_ratio_clamp,
                   "must be in (0, 80] (e^80 is still a finite float)");
    if (o->zero_run_limit < 0)
        return bad("zero_run_limit", (double)o->zero_run_limit, "must be >= 0");
    return XENT_OK;
}

static xent_status check_norms(const xent_rl_loss_opts *o) {
    int need_tok = o->agg != XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN;
    int need_seq = o->agg != XENT_RL_AGG_TOKEN_SUM;
    if (need_tok && (!(o->token_norm > 0.0) || isinf(o->token_norm)))
        return bad("token_norm", o->token_norm, "must be set (finite, > 0) to the "
                   "global count of loss tokens for this aggregation");
    if (need_seq && (!(o->seq_norm > 0.0) || isinf(o->seq_norm)))
        return bad("seq_norm", o->seq_norm, "must be set (finite, > 0) to the "
                   "global count of sequences for this aggregation");
    return XENT_OK;
}

static xent_status check_loss_opts(const xent_rl_loss_opts *o) {
    xent_status s;
    if ((unsigned)o->loss > XENT_RL_LOSS_REINFORCE)
        return bad("loss", (double)o->loss, "not an xent_rl_loss");
    if ((s = check_common_opts(o))) return s;
    if (o->dual_clip != 0.0 && (!(o->dual_clip > 1.0) || isinf(o->dual_clip)))
        return bad("dual_clip", o->dual_clip, "must be 0 (off) or finite and > 1");
    if ((unsigned)o->agg > XENT_RL_AGG_SEQ_MEAN_TOKEN_SUM)
        return bad("agg", (double)o->agg, "not an xent_rl_agg");
    if ((s = check_norms(o))) return s;
    if ((unsigned)o->tis > XENT_RL_TIS_GEOMETRIC)
        return bad("tis", (double)o->tis, "not an xent_rl_tis_level");
    if ((unsigned)o->tis_mode > XENT_RL_TIS_MASK)
        return bad("tis_mode", (double)o->tis_mode, "not an xent_rl_tis_mode");
    if (!(o->tis_cap > 0.0) || isinf(o->tis_cap))
        return bad("tis_cap", o->tis_cap, "must be finite and > 0");
    if ((unsigned)o->kl > XENT_RL_KL_K3)
        return bad("kl", (double)o->kl, "not an xent_rl_kl");
    if (!isfinite(o->kl_coef)) return bad("kl_coef", o->kl_coef, "must be finite");
    return XENT_OK;
}

/* Shapes, offsets and mask of an input. */
static xent_status check_layout(const xent_rl_input *in) {
    if (in->T < 0) return xent_set_error(XENT_ERR_SHAPE, "in->T = %lld < 0", (long long)in->T);
    if (in->nseq < 0)
        return xent_set_error(XENT_ERR_SHAPE, "in->nseq = %lld < 0", (long long)in->nseq);
    xent_status s = xent__rl_check_offsets("in->offsets", in->offsets, in->nseq, in->T);
    return s ? s : xent__rl_check_mask("in->mask", in->mask, in->T);
}

static xent_status check_lp(const xent_rl_input *in, const char *name,
                            const float *lp, int allow_neg_inf, int64_t zrl) {
    if (!lp) return XENT_OK;
    return xent_rl_check_logprobs(name, lp, in->T, in->offsets, in->nseq,
                                  in->mask, allow_neg_inf, zrl, NULL);
}

/* All log-prob arrays that are given (lp_new is required). */
static xent_status check_all_lp(const xent_rl_input *in, int64_t zrl) {
    xent_status s;
    if (!in->lp_new) return xent_set_error(XENT_ERR_NULL, "in->lp_new is NULL");
    if ((s = check_lp(in, "in->lp_new", in->lp_new, 0, zrl)) ||
        (s = check_lp(in, "in->lp_old", in->lp_old, 1, zrl)) ||
        (s = check_lp(in, "in->lp_sampler", in->lp_sampler, 1, zrl)) ||
        (s = check_lp(in, "in->lp_ref", in->lp_ref, 1, zrl)))
        return s;
    return XENT_OK;
}

/* Advantages used by counted tokens must be finite. */
static xent_status check_adv(const xent_rl_input *in) {
    if (!in->advantages) return xent_set_error(XENT_ERR_NULL, "in->advantages is NULL");
    int per_tok = in->adv_layout == XENT_RL_ADV_PER_TOKEN;
    if (!per_tok && in->adv_layout != XENT_RL_ADV_PER_SEQUENCE)
        return xent_set_error(XENT_ERR_VALUE, "in->adv_layout = %d: set "
                          "XENT_RL_ADV_PER_SEQUENCE or XENT_RL_ADV_PER_TOKEN",
                          (int)in->adv_layout);
    for (int64_t i = 0; i < in->nseq; i++)
        for (int64_t t = in->offsets[i]; t < in->offsets[i + 1]; t++) {
            if (!xent__rl_counted(in->mask, t)) continue;
            int64_t k = per_tok ? t : i;
            if (!isfinite(in->advantages[k]))
                return xent_set_error(XENT_ERR_VALUE, "in->advantages[%lld] = %g is "
                                  "not finite", (long long)k,
                                  (double)in->advantages[k]);
        }
    return XENT_OK;
}

static xent_status check_needs(const xent_rl_input *in, const xent_rl_loss_opts *o) {
    if (o->loss != XENT_RL_LOSS_REINFORCE && !in->lp_old)
        return xent_set_error(XENT_ERR_NULL, "in->lp_old is NULL: %s needs the old "
                          "log-probs", o->loss == XENT_RL_LOSS_PPO ? "PPO"
                          : o->loss == XENT_RL_LOSS_CISPO ? "CISPO" : "GSPO");
    if (o->tis != XENT_RL_TIS_OFF && !in->lp_sampler)
        return xent_set_error(XENT_ERR_VALUE, "opts->tis = %d but in->lp_sampler is "
                          "NULL: truncated importance sampling needs the sampler's "
                          "log-probs (no fall-back to the policy ratio)", (int)o->tis);
    if (o->kl != XENT_RL_KL_NONE && !in->lp_ref)
        return xent_set_error(XENT_ERR_NULL, "opts->kl = %d but in->lp_ref is NULL",
                          (int)o->kl);
    return XENT_OK;
}

/* ---- per-token terms ------------------------------------------------------- */

/* Clip state of one token. */
enum { CLIP_NONE = 0, CLIP_LOW = 1, CLIP_HIGH = 2, CLIP_DUAL = 3 };

/* l = max(-A r, -A clip(r, lo, hi)), then for A < 0 and dual > 0
 * l = min(l, -A dual). Returns l; *dl_dr = dl/dr; *clip = which clip won. */
static double ppo_term(double A, double r, double lo, double hi, double dual,
                       double *dl_dr, int *clip) {
    double c = r < lo ? lo : (r > hi ? hi : r);
    double un = -A * r, cl = -A * c;
    double l = un, d = -A;
    *clip = CLIP_NONE;
    if (cl > un) {
        l = cl;
        d = 0.0; /* c sits on a bound: no dependence on r */
        *clip = r < lo ? CLIP_LOW : CLIP_HIGH;
    }
    if (dual > 0.0 && A < 0.0 && l > -A * dual) {
        l = -A * dual;
        d = 0.0;
        *clip = CLIP_DUAL;
    }
    *dl_dr = d;
    return l;
}

/* KL estimate k and dk/d(lp_new) with d = clamp(lp_ref - lp_new). */
static double kl_term(xent_rl_kl kind, double lp, double ref, double C,
                      double *dk, int *hit) {
    double d = xent__rl_clamp(xent__rl_logdiff(ref, lp), C, hit);
    double live = *hit ? 0.0 : 1.0; /* a clamped d does not move with lp */
    switch (kind) {
    case XENT_RL_KL_K1: *dk = live; return -d;
    case XENT_RL_KL_K2: *dk = -d * live; return 0.5 * d * d;
    case XENT_RL_KL_K3: {
        double e = xent__exp(d);
        *dk = (1.0 - e) * live;
        return xent__rl_k3(d);
    }
    default: *dk = 0.0; return 0.0;
    }
}

/* ---- the loop ---------------------------------------------------------------- */

typedef struct loss_ctx {
    const xent_rl_input *in;
    const xent_rl_loss_opts *o;
    double lo, hi, C;
    const float *lp_trn;   /* trainer side of the TIS ratio                 */
    float *token_loss, *grad;
    xent_rl_loss_stats st;
    double kl_sum;
} loss_ctx;

/* Counted tokens of sequence i. */
static int64_t seq_count(const xent_rl_input *in, int64_t i) {
    int64_t n = 0;
    for (int64_t t = in->offsets[i]; t < in->offsets[i + 1]; t++)
        n += xent__rl_counted(in->mask, t);
    return n;
}

/* Applies TRUNCATE / MASK to a TIS weight covering `ntok` tokens. */
static double tis_cut(loss_ctx *c, double w, int64_t ntok) {
    if (!(w > c->o->tis_cap)) return w;
    if (c->o->tis_mode == XENT_RL_TIS_MASK) {
        c->st.n_tis_masked += ntok;
        return 0.0;
    }
    c->st.n_tis_truncated += ntok;
    return c->o->tis_cap;
}

/* Token TIS log-weight, clamped (counts the clamp in *hit). */
static double tis_logw(const loss_ctx *c, int64_t t, int *hit) {
    double d = xent__rl_logdiff(c->lp_trn[t], c->in->lp_sampler[t]);
    return xent__rl_clamp(d, c->C, hit);
}

/* Sequence-level TIS weight (SEQUENCE: sum, GEOMETRIC: mean of the clamped
 * token log-weights, clamped again). */
static double tis_seq_weight(loss_ctx *c, int64_t i, int64_t n) {
    double s = 0.0;
    int any = 0, hit;
    for (int64_t t = c->in->offsets[i]; t < c->in->offsets[i + 1]; t++) {
        if (!xent__rl_counted(c->in->mask, t)) continue;
        s += tis_logw(c, t, &hit);
        any |= hit;
    }
    if (c->o->tis == XENT_RL_TIS_GEOMETRIC) s /= (double)n;
    s = xent__rl_clamp(s, c->C, &hit);
    if (any || hit) c->st.n_tis_clamped += n;
    return tis_cut(c, xent__exp(s), n);
}

/* GSPO's clamped mean log-ratio of sequence i; *hit when clamped. */
static double gspo_log_ratio(const loss_ctx *c, int64_t i, int64_t n, int *hit) {
    double s = 0.0;
    for (int64_t t = c->in->offsets[i]; t < c->in->offsets[i + 1]; t++)
        if (xent__rl_counted(c->in->mask, t))
            s += xent__rl_logdiff(c->in->lp_new[t], c->in->lp_old[t]);
    return xent__rl_clamp(s / (double)n, c->C, hit);
}

static void count_clip(loss_ctx *c, int clip) {
    c->st.n_clip_low += clip == CLIP_LOW;
    c->st.n_clip_high += clip == CLIP_HIGH;
    c->st.n_dual_clip += clip == CLIP_DUAL;
}

/* Loss l (returned) and dl/d(lp_new) of one counted token before the TIS
 * weight. lr_seq / seq_hit: GSPO's sequence log-ratio. */
static double policy_term(loss_ctx *c, int64_t t, double A, double lr_seq,
                          int seq_hit, double *dl) {
    const xent_rl_loss_opts *o = c->o;
    double lp = c->in->lp_new[t];
    if (o->loss == XENT_RL_LOSS_REINFORCE) {
        *dl = -A;
        return -A * lp;
    }
    int hit = seq_hit, clip;
    double lr = o->loss == XENT_RL_LOSS_GSPO
                    ? lr_seq
                    : xent__rl_clamp(xent__rl_logdiff(lp, c->in->lp_old[t]), c->C, &hit);
    double r = xent__exp(lr);
    c->st.n_clamped += hit;
    if (o->loss == XENT_RL_LOSS_CISPO) {
        double w = r < c->lo ? c->lo : (r > c->hi ? c->hi : r);
        count_clip(c, r < c->lo ? CLIP_LOW : (r > c->hi ? CLIP_HIGH : CLIP_NONE));
        *dl = -w * A;
        return -w * A * lp;
    }
    double dl_dr, l = ppo_term(A, r, c->lo, c->hi, o->dual_clip, &dl_dr, &clip);
    count_clip(c, clip);
    *dl = hit ? 0.0 : dl_dr * r;
    return l;
}

/* One counted token: writes its outputs, returns its loss l_t. */
static double one_token(loss_ctx *c, int64_t i, int64_t t, double w_seq,
                        double lr_seq, int seq_hit, double scale) {
    const xent_rl_input *in = c->in;
    const xent_rl_loss_opts *o = c->o;
    double A = in->advantages[in->adv_layout == XENT_RL_ADV_PER_TOKEN ? t : i];
    double w = w_seq;
    if (o->tis == XENT_RL_TIS_TOKEN) {
        int hit;
        w = xent__exp(tis_logw(c, t, &hit));
        c->st.n_tis_clamped += hit;
        w = tis_cut(c, w, 1);
    }
    double dl, l = policy_term(c, t, A, lr_seq, seq_hit, &dl);
    l *= w;
    dl *= w;
    if (o->kl != XENT_RL_KL_NONE) {
        int hit;
        double dk, k = kl_term(o->kl, in->lp_new[t], in->lp_ref[t], c->C, &dk, &hit);
        c->st.n_kl_clamped += hit;
        c->kl_sum += k;
        l += o->kl_coef * k;
        dl += o->kl_coef * dk;
    }
    if (c->token_loss) c->token_loss[t] = (float)l;
    if (c->grad) c->grad[t] = (float)(dl * scale);
    return l;
}

/* Per-token gradient factor of sequence i with n counted tokens. */
static double agg_scale(const xent_rl_loss_opts *o, int64_t n) {
    switch (o->agg) {
    case XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN: return 1.0 / ((double)n * o->seq_norm);
    case XENT_RL_AGG_SEQ_MEAN_TOKEN_SUM: return 1.0 / (o->seq_norm * o->token_norm);
    default: return 1.0 / o->token_norm;
    }
}

/* Sequence i; returns its contribution to the aggregated loss. */
static double one_seq(loss_ctx *c, int64_t i) {
    const xent_rl_input *in = c->in;
    int64_t b = in->offsets[i], e = in->offsets[i + 1], n = seq_count(in, i);
    for (int64_t t = b; t < e; t++) {
        if (xent__rl_counted(in->mask, t)) continue;
        if (c->token_loss) c->token_loss[t] = 0.0f;
        if (c->grad) c->grad[t] = 0.0f;
    }
    if (n == 0) return 0.0;
    c->st.n_seqs++;
    c->st.n_tokens += n;
    double w_seq = 1.0, lr_seq = 0.0, sum = 0.0, scale = agg_scale(c->o, n);
    int seq_hit = 0;
    if (c->o->tis == XENT_RL_TIS_SEQUENCE || c->o->tis == XENT_RL_TIS_GEOMETRIC)
        w_seq = tis_seq_weight(c, i, n);
    if (c->o->loss == XENT_RL_LOSS_GSPO) lr_seq = gspo_log_ratio(c, i, n, &seq_hit);
    for (int64_t t = b; t < e; t++)
        if (xent__rl_counted(in->mask, t))
            sum += one_token(c, i, t, w_seq, lr_seq, seq_hit, scale);
    return c->o->agg == XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN ? sum / (double)n : sum;
}

static double agg_total(const xent_rl_loss_opts *o, double sum) {
    switch (o->agg) {
    case XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN: return sum / o->seq_norm;
    case XENT_RL_AGG_SEQ_MEAN_TOKEN_SUM: return sum / (o->seq_norm * o->token_norm);
    default: return sum / o->token_norm;
    }
}

static xent_status check_loss_call(const xent_rl_input *in,
                                   const xent_rl_loss_opts *o) {
    xent_status s;
    if ((s = check_loss_opts(o)) || (s = check_layout(in)) ||
        (s = check_needs(in, o)) || (s = check_all_lp(in, o->zero_run_limit)) ||
        (s = check_adv(in)))
        return s;
    return XENT_OK;
}

xent_status xent_rl_policy_loss(const xent_rl_input *in,
                                const xent_rl_loss_opts *opts,
                                float *token_loss, float *grad,
                                xent_rl_loss_stats *stats) {
    if (!in || !opts)
        return xent_set_error(XENT_ERR_NULL, "xent_rl_policy_loss: %s is NULL",
                          !in ? "in" : "opts");
    xent_status s = check_loss_call(in, opts);
    if (s) return s;
    loss_ctx c;
    memset(&c, 0, sizeof c);
    c.in = in;
    c.o = opts;
    c.lo = 1.0 - opts->eps_low;
    c.hi = 1.0 + opts->eps_high;
    c.C = opts->log_ratio_clamp;
    c.lp_trn = in->lp_old ? in->lp_old : in->lp_new;
    c.token_loss = token_loss;
    c.grad = grad;
    double sum = 0.0;
    for (int64_t i = 0; i < in->nseq; i++) sum += one_seq(&c, i);
    c.st.loss = agg_total(opts, sum);
    c.st.kl_mean = c.st.n_tokens ? c.kl_sum / (double)c.st.n_tokens : 0.0;
    if (stats) *stats = c.st;
    return XENT_OK;
}

/* ---- KL alone ---------------------------------------------------------------- */

xent_status xent_rl_kl_estimate(xent_rl_kl kind, const float *lp_new,
                                const float *lp_ref, int64_t T,
                                const uint8_t *mask, double log_ratio_clamp,
                                float *kl, float *dkl, int64_t *n_clamped) {
    if (T < 0) return xent_set_error(XENT_ERR_SHAPE, "T = %lld < 0", (long long)T);
    if ((unsigned)kind > XENT_RL_KL_K3 || kind == XENT_RL_KL_NONE)
        return xent_set_error(XENT_ERR_VALUE, "kind = %d: use XENT_RL_KL_K1, K2 or K3",
                          (int)kind);
    if (!(log_ratio_clamp > 0.0) || !(log_ratio_clamp <= 80.0))
        return xent_set_error(XENT_ERR_VALUE, "log_ratio_clamp = %g must be in (0, 80]",
                          log_ratio_clamp);
    if (T > 0 && (!lp_new || !lp_ref))
        return xent_set_error(XENT_ERR_NULL, "%s is NULL", !lp_new ? "lp_new" : "lp_ref");
    xent_status s;
    if ((s = xent__rl_check_mask("mask", mask, T)) ||
        (s = xent_rl_check_logprobs("lp_new", lp_new, T, NULL, 0, mask, 0, 0, NULL)) ||
        (s = xent_rl_check_logprobs("lp_ref", lp_ref, T, NULL, 0, mask, 1, 0, NULL)))
        return s;
    int64_t nc = 0;
    for (int64_t t = 0; t < T; t++) {
        double k = 0.0, dk = 0.0;
        int hit = 0;
        if (xent__rl_counted(mask, t))
            k = kl_term(kind, lp_new[t], lp_ref[t], log_ratio_clamp, &dk, &hit);
        nc += hit;
        if (kl) kl[t] = (float)k;
        if (dkl) dkl[t] = (float)dk;
    }
    if (n_clamped) *n_clamped = nc;
    return XENT_OK;
}
