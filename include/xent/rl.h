/* xent/rl.h: RL loss math. Included by xent.h; do not include directly.
 *
 * Group advantages, batch normalisation of advantages, policy losses (PPO,
 * CISPO, GSPO, REINFORCE) with the gradient w.r.t. the new log-probs,
 * truncated importance sampling (TIS), KL estimators, diagnostics and input
 * checks. Every convention is a field; xent_rl_*_opts_init() fill the
 * documented defaults. docs/rl.md gives the formulas and maps the options of
 * common trainers onto these fields.
 *
 * Shared conventions:
 *   - values are float (fp32) arrays; every sum is accumulated in double and
 *     every output is rounded once at the store;
 *   - sequences are given as offsets [nseq + 1] (int64): sequence i holds the
 *     tokens [offsets[i], offsets[i + 1]); offsets[0] = 0, non-decreasing,
 *     offsets[nseq] = T; empty sequences are allowed;
 *   - a mask is a uint8 array of 0 / 1 (any other byte is an error); NULL
 *     means every token counts. Masked-out tokens (mask 0) are never read for
 *     their values: they may hold NaN or garbage; their loss and gradient are
 *     written as +0;
 *   - log-probs of counted tokens must not be NaN or > 0; the new log-probs
 *     must be finite; old / sampler / reference log-probs may be -inf (the
 *     log-ratio clamp makes the result finite). A run of `zero_run_limit` or
 *     more counted tokens whose log-prob is exactly 0 is rejected as a
 *     zero-filled dump;
 *   - on failure the call returns a status, xent_last_error() names the
 *     field and the index, and no output has been written. */
#ifndef XENT_RL_H
#define XENT_RL_H
#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Group advantages                                                          */
/* ------------------------------------------------------------------------ */

/* Spread of the rewards of one group used to scale its advantages. */
typedef enum xent_rl_std {
    XENT_RL_STD_POPULATION = 0, /* sqrt(sum (r - mean)^2 / n)               */
    XENT_RL_STD_SAMPLE = 1,     /* sqrt(sum (r - mean)^2 / (n - 1))         */
    XENT_RL_STD_NONE = 2        /* no scaling (divide by 1, eps unused)     */
} xent_rl_std;

/* A_i = (r_i - mean_g) / (std_g + eps)      (subtract_mean = 1)
 * A_i =  r_i          / (std_g + eps)      (subtract_mean = 0)
 * with std_g = 1 and eps = 0 for XENT_RL_STD_NONE.
 * A group whose rewards are all equal (== in float, so -0 equals +0;
 * including a group of one) is a zero-variance group: its advantages are
 * exactly +0 when subtract_mean = 1, and r_i unscaled when subtract_mean = 0
 * (never r / eps). A sample std of a group of one is not computed (no 0/0). */
typedef struct xent_rl_adv_opts {
    xent_rl_std std;   /* default XENT_RL_STD_POPULATION                    */
    double eps;        /* default 1e-6; finite and >= 0                     */
    int subtract_mean; /* default 1; 0 or 1                                 */
} xent_rl_adv_opts;

XENT_API void xent_rl_adv_opts_init(xent_rl_adv_opts *o);

/* Groups of a flat reward array [n]: give exactly one of
 *   offsets [ngroups + 1]: group g holds [offsets[g], offsets[g + 1]);
 *                          offsets[0] = 0, non-decreasing, offsets[ngroups]
 *                          = n (empty groups allowed), or
 *   ids [n]: group id of each reward, in [0, ngroups) and non-decreasing
 *            (members of a group are contiguous). */
typedef struct xent_rl_groups {
    int64_t n;              /* rewards                                      */
    int64_t ngroups;        /* groups (>= 0)                                */
    const int64_t *offsets; /* [ngroups + 1] or NULL                        */
    const int64_t *ids;     /* [n] or NULL                                  */
} xent_rl_groups;

/* Diagnostics of xent_rl_group_advantages. */
typedef struct xent_rl_adv_stats {
    int64_t n_groups;     /* groups with at least one member                */
    int64_t n_zero_var;   /* groups whose rewards are all equal (incl. 1)   */
    int64_t n_singleton;  /* groups of exactly one reward                   */
    int64_t n_empty;      /* groups with no member                          */
} xent_rl_adv_stats;

/* rewards [n] -> adv [n] (adv may equal rewards). group_mean and group_std
 * [ngroups] (double, may be NULL) receive each group's mean and the std of
 * opts->std (0 for zero-variance groups, empty groups and for STD_NONE).
 * stats may be NULL. NaN or infinite rewards are XENT_ERR_VALUE. */
XENT_API xent_status xent_rl_group_advantages(const float *rewards,
                                     const xent_rl_groups *groups,
                                     const xent_rl_adv_opts *opts,
                                     float *adv, double *group_mean,
                                     double *group_std,
                                     xent_rl_adv_stats *stats);

/* ------------------------------------------------------------------------ */
/* Batch (pack) normalisation of advantages                                  */
/* ------------------------------------------------------------------------ */

typedef enum xent_rl_batch_norm {
    XENT_RL_BATCH_MEAN_ABS = 0, /* A / (mean |A| + eps)                     */
    XENT_RL_BATCH_STD = 1       /* (A [- mean A]) / (std A + eps)           */
} xent_rl_batch_norm;

/* The statistics run over the counted entries (mask 1). When the scale
 * (mean |A|, or the std) is exactly 0 the entries are not divided: an
 * all-zero batch stays exactly 0 (never 0/0) and `degenerate` is set to 1.
 * Entries with mask 0 are copied unchanged. */
typedef struct xent_rl_batch_opts {
    xent_rl_batch_norm kind; /* default XENT_RL_BATCH_MEAN_ABS              */
    xent_rl_std std;         /* for BATCH_STD: POPULATION or SAMPLE;
                                default XENT_RL_STD_POPULATION              */
    int subtract_mean;       /* for BATCH_STD: 0 or 1; default 0            */
    double eps;              /* default 0; finite and >= 0                  */
} xent_rl_batch_opts;

XENT_API void xent_rl_batch_opts_init(xent_rl_batch_opts *o);

typedef struct xent_rl_batch_stats {
    int64_t n_counted; /* entries with mask 1                               */
    double mean;       /* mean of the counted entries                       */
    double scale;      /* mean |A| or the std (before eps)                  */
    int degenerate;    /* 1: scale was 0 (or nothing counted): not divided  */
} xent_rl_batch_stats;

/* adv_in [n] -> adv_out [n] (may alias). mask [n] or NULL. */
XENT_API xent_status xent_rl_batch_normalize(const float *adv_in, int64_t n,
                                    const uint8_t *mask,
                                    const xent_rl_batch_opts *opts,
                                    float *adv_out,
                                    xent_rl_batch_stats *stats);

/* ------------------------------------------------------------------------ */
/* Policy losses                                                             */
/* ------------------------------------------------------------------------ */

/* Per counted token t of sequence i, with lr = clamp(lp_new - lp_old,
 * -log_ratio_clamp, +log_ratio_clamp) and r = exp(lr), c(r) = clip(r,
 * 1 - eps_low, 1 + eps_high), sg() = no gradient, w = the TIS weight (1 when
 * TIS is off):
 *   PPO       l = w * max(-A r, -A c(r))         (dual clip: for A < 0,
 *                                                 l = min(l, -A w dual_clip))
 *   CISPO     l = -w * sg(c(r)) * A * lp_new
 *   GSPO      l as PPO with r replaced by
 *             r_i,t = exp(clamp(sg(m_i) + lp_new_t - sg(lp_new_t)))
 *             where m_i = mean over the counted tokens of sequence i of
 *             (lp_new - lp_old): its value is the sequence ratio s_i and its
 *             gradient flows through token t only. With
 *             XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN this is exactly the gradient of
 *             the sequence-level GSPO objective.
 *   REINFORCE l = -w * A * lp_new                 (lp_old not used)
 * A clamped log-ratio has zero derivative: such tokens keep a finite loss
 * and get gradient 0 (from the ratio term); they are counted. */
typedef enum xent_rl_loss {
    XENT_RL_LOSS_PPO = 0,
    XENT_RL_LOSS_CISPO = 1,
    XENT_RL_LOSS_GSPO = 2,
    XENT_RL_LOSS_REINFORCE = 3
} xent_rl_loss;

/* How the per-token losses l_t become one number (the loss of this call):
 *   TOKEN_SUM:           sum_t l_t / token_norm
 *       token_norm = the global number of counted tokens of the whole step
 *       (all micro-batches and ranks), so summing the calls' losses gives
 *       the step's token mean;
 *   SEQ_MEAN_TOKEN_MEAN: sum_i (sum_{t in i} l_t / n_i) / seq_norm
 *       n_i = counted tokens of sequence i (sequences with n_i = 0 add 0),
 *       seq_norm = the global number of sequences of the step;
 *   SEQ_MEAN_TOKEN_SUM:  sum_i sum_{t in i} l_t / (seq_norm * token_norm)
 *       (a constant per-sequence length, e.g. the maximum response length).
 * The norms are explicit: there is no default from the local counts. */
typedef enum xent_rl_agg {
    XENT_RL_AGG_TOKEN_SUM = 0,
    XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN = 1,
    XENT_RL_AGG_SEQ_MEAN_TOKEN_SUM = 2
} xent_rl_agg;

/* Truncated importance sampling between the trainer (lp_old, or sg(lp_new)
 * when lp_old is NULL) and the sampler (lp_sampler):
 *   TOKEN:     log w_t = clamp(d_t),  d_t = lp_trn_t - lp_smp_t
 *   SEQUENCE:  log w_i = clamp(sum over counted t of clamp(d_t))
 *   GEOMETRIC: log w_i = clamp(mean over counted t of clamp(d_t))
 * then TRUNCATE: w = min(w, tis_cap); MASK: w = w if w <= tis_cap, else 0
 * (the token or the whole sequence drops out; counted in n_tis_masked).
 * The weight is a constant (no gradient). Asking for TIS with lp_sampler =
 * NULL is XENT_ERR_VALUE: there is no fall-back to the policy ratio. */
typedef enum xent_rl_tis_level {
    XENT_RL_TIS_OFF = 0,
    XENT_RL_TIS_TOKEN = 1,
    XENT_RL_TIS_SEQUENCE = 2,
    XENT_RL_TIS_GEOMETRIC = 3
} xent_rl_tis_level;

typedef enum xent_rl_tis_mode {
    XENT_RL_TIS_TRUNCATE = 0,
    XENT_RL_TIS_MASK = 1
} xent_rl_tis_mode;

/* KL estimators between the policy (lp_new) and a reference (lp_ref), with
 * d = clamp(lp_ref - lp_new):
 *   K1: -d               K2: d^2 / 2             K3: exp(d) - d - 1
 * (K3 is the non-negative, low-variance estimator of KL(new || ref) on
 * tokens sampled from new.) */
typedef enum xent_rl_kl {
    XENT_RL_KL_NONE = 0,
    XENT_RL_KL_K1 = 1,
    XENT_RL_KL_K2 = 2,
    XENT_RL_KL_K3 = 3
} xent_rl_kl;

typedef struct xent_rl_loss_opts {
    xent_rl_loss loss;          /* default XENT_RL_LOSS_PPO                 */
    double eps_low;             /* default 0.2; clip below at 1 - eps_low;
                                   >= 0 (>= 1: no lower clip)               */
    double eps_high;            /* default 0.2; clip above at 1 + eps_high;
                                   >= 0, may be +inf (no upper clip)         */
    double dual_clip;           /* default 0 (off); else > 1 (PPO, GSPO)    */
    double log_ratio_clamp;     /* default 20; in (0, 80]                    */
    xent_rl_agg agg;            /* default XENT_RL_AGG_TOKEN_SUM            */
    double token_norm;          /* default 0 = unset: must be set (> 0) for
                                   TOKEN_SUM and SEQ_MEAN_TOKEN_SUM          */
    double seq_norm;            /* default 0 = unset: must be set (> 0) for
                                   the SEQ_MEAN_* aggregations               */
    xent_rl_tis_level tis;      /* default XENT_RL_TIS_OFF                  */
    xent_rl_tis_mode tis_mode;  /* default XENT_RL_TIS_TRUNCATE             */
    double tis_cap;             /* default 2; > 0                           */
    xent_rl_kl kl;              /* default XENT_RL_KL_NONE                  */
    double kl_coef;             /* default 0; l_t += kl_coef * k(t)         */
    int64_t zero_run_limit;     /* default 32; a run of this many counted
                                   tokens of one sequence with log-prob
                                   exactly 0 is a zero-filled dump
                                   (XENT_ERR_VALUE); 0 disables the check    */
} xent_rl_loss_opts;

/* Fills *o with the defaults above, which `xent rl` and `xent compare` share:
 * the clip range [1 - 0.2, 1 + 0.2] is PPO's symmetric epsilon (Schulman et
 * al. 2017; DAPO's clip-higher is eps_high = 0.28, its own setting); the
 * log-ratio clamp 20 before exp is verl's and OpenRLHF's; a run of 32 exact
 * zeros is a zero-filled dump, where an isolated exact 0 is a genuine
 * log-prob that rounded to 0 (bf16 pipelines give many). */
XENT_API void xent_rl_loss_opts_init(xent_rl_loss_opts *o);

/* Layout of the advantages. 0 is deliberately not a valid value. */
typedef enum xent_rl_adv_layout {
    XENT_RL_ADV_PER_SEQUENCE = 1, /* advantages [nseq]                      */
    XENT_RL_ADV_PER_TOKEN = 2     /* advantages [T]                         */
} xent_rl_adv_layout;

typedef struct xent_rl_input {
    int64_t T;                  /* tokens                                   */
    int64_t nseq;               /* sequences (>= 1 when T > 0)              */
    const int64_t *offsets;     /* [nseq + 1]                               */
    const float *lp_new;        /* [T] current policy log-probs (gradient)  */
    const float *lp_old;        /* [T] log-probs the ratio is taken against;
                                   required by PPO, CISPO, GSPO             */
    const float *lp_sampler;    /* [T] sampler log-probs; required by TIS   */
    const float *lp_ref;        /* [T] reference log-probs; required by KL  */
    const float *advantages;    /* [nseq] or [T], see adv_layout           */
    xent_rl_adv_layout adv_layout;
    const uint8_t *mask;        /* [T] 0/1 or NULL (all counted)            */
} xent_rl_input;

/* Counts of one call (all written on success). */
typedef struct xent_rl_loss_stats {
    double loss;             /* the aggregated loss of this call             */
    int64_t n_tokens;        /* counted tokens                               */
    int64_t n_seqs;          /* sequences with at least one counted token    */
    int64_t n_clamped;       /* counted tokens whose policy log-ratio hit the
                                clamp (GSPO: tokens of clamped sequences)    */
    int64_t n_clip_low;      /* tokens where the lower clip is active (the
                                clipped branch is taken or, CISPO, r < lo)   */
    int64_t n_clip_high;     /* same for the upper clip                      */
    int64_t n_dual_clip;     /* tokens where the dual clip is active         */
    int64_t n_tis_clamped;   /* tokens whose TIS log-weight hit the clamp    */
    int64_t n_tis_truncated; /* tokens whose weight was cut to tis_cap       */
    int64_t n_tis_masked;    /* tokens dropped by TIS_MASK                   */
    int64_t n_kl_clamped;    /* tokens whose KL log-ratio hit the clamp      */
    double kl_mean;          /* mean KL estimate over counted tokens (0 off) */
} xent_rl_loss_stats;

/* Per-token loss l_t [T] and gradient d(loss)/d(lp_new_t) [T] of the
 * aggregated loss; each pointer may be NULL. stats may be NULL. */
XENT_API xent_status xent_rl_policy_loss(const xent_rl_input *in,
                                const xent_rl_loss_opts *opts,
                                float *token_loss, float *grad,
                                xent_rl_loss_stats *stats);

/* Per-token KL estimate k [T] and its derivative dk/d(lp_new) [T] (either
 * may be NULL), over counted tokens (mask [T] or NULL); +0 elsewhere.
 * lp_new must be finite and <= 0, lp_ref <= 0 (-inf allowed), neither NaN
 * (no zero-run check here). n_clamped (may be NULL) receives the tokens
 * whose log-ratio was clamped. */
XENT_API xent_status xent_rl_kl_estimate(xent_rl_kl kind, const float *lp_new,
                                const float *lp_ref, int64_t T,
                                const uint8_t *mask, double log_ratio_clamp,
                                float *kl, float *dkl, int64_t *n_clamped);

/* e^d - 1 - d in double without cancellation, the K3 estimator's term for a
 * log-ratio d (the estimate is k3(lp_ref - lp_new)): a 16-term series for
 * |d| < 1/2 (the term left out is below 2^-60 of the sum), else
 * expm1(d) - d (condition number below 5); within 4 ulp of the exact value
 * (docs/rl.md). For callers that keep log-ratios in double, where
 * xent_rl_kl_estimate's float outputs would round them. */
XENT_API double xent_rl_k3(double d);

/* ------------------------------------------------------------------------ */
/* Diagnostics                                                               */
/* ------------------------------------------------------------------------ */

/* Over counted tokens. Policy ratio r = exp(clamp(lp_new - lp_old)) (needs
 * lp_old); importance weight w = exp(clamp(lp_trn - lp_sampler)) with lp_trn
 * = lp_old, else lp_new (needs lp_sampler; the w fields are 0 without it).
 * Uses opts->eps_low/eps_high, log_ratio_clamp and zero_run_limit only. */
typedef struct xent_rl_diag {
    int64_t n_tokens;
    double clip_frac_low;   /* fraction with r < 1 - eps_low                */
    double clip_frac_high;  /* fraction with r > 1 + eps_high               */
    double ratio_min, ratio_mean, ratio_max;
    double ratio_frac_out;  /* fraction with r < 1/8 or r > 8              */
    int64_t n_ratio_clamped;
    int has_weights;        /* 1 when lp_sampler was given                  */
    double ess_frac;        /* (sum w)^2 / (n sum w^2), in (0, 1]           */
    double chi2;            /* mean (w - 1)^2: estimate of chi^2(trn||smp)  */
    double mismatch_kl_k1;  /* mean (lp_sampler - lp_trn): KL(smp || trn)   */
    double mismatch_kl_k3;  /* mean (w - 1 - log w): the same, k3 form      */
    double weight_max;
    int64_t n_weight_clamped;
} xent_rl_diag;

/* in->lp_new is required; lp_old, lp_sampler optional (their fields are 0
 * when absent); advantages are not used. */
XENT_API xent_status xent_rl_diagnostics(const xent_rl_input *in,
                                const xent_rl_loss_opts *opts,
                                xent_rl_diag *out);

/* ------------------------------------------------------------------------ */
/* Input checks                                                              */
/* ------------------------------------------------------------------------ */

/* What xent_rl_check_logprobs found over counted tokens. first_* are token
 * indices (-1 when none). */
typedef struct xent_rl_lp_report {
    int64_t n_checked;
    int64_t n_nan, first_nan;
    int64_t n_positive, first_positive;   /* > 0                            */
    int64_t n_neg_inf, first_neg_inf;     /* -inf (allowed or not)          */
    int64_t n_zero_runs, first_zero_run;  /* runs >= zero_run_limit         */
    int64_t longest_zero_run;             /* longest run of exact zeros     */
} xent_rl_lp_report;

/* Checks one log-prob array [T] against offsets [nseq + 1] (zero runs do not
 * cross sequence boundaries; offsets may be NULL: one sequence) and mask [T]
 * (or NULL). Returns XENT_ERR_VALUE when anything is wrong (NaN, > 0, -inf
 * with allow_neg_inf = 0, a zero run), with a message naming `name`, the
 * counts and the first index. report (may be NULL) is always written: the
 * scan's counts, or empty counts (first_* = -1) when the arguments, offsets
 * or mask were rejected before the scan. */
XENT_API xent_status xent_rl_check_logprobs(const char *name, const float *lp,
                                   int64_t T, const int64_t *offsets,
                                   int64_t nseq, const uint8_t *mask,
                                   int allow_neg_inf, int64_t zero_run_limit,
                                   xent_rl_lp_report *report);

/* ------------------------------------------------------------------------ */
/* CUDA: the same functions on device memory (src/cuda/rl.cu)                */
/* ------------------------------------------------------------------------ */

/* xent_cuda_rl_* take the same arguments as the CPU calls above, plus a
 * cudaStream_t `stream` (NULL: the legacy default stream). Every array
 * (rewards, offsets, ids, masks, log-probs, advantages and every output
 * array) is DEVICE memory; the structs (groups, opts, in), `name` and the
 * result structs (stats, out, report, *n_clamped) are HOST memory. Options are checked on
 * the host, array contents by a check kernel whose small record is copied
 * back before any output is written: on failure the status and the message
 * (field and index) are those of the CPU call and no output was touched.
 * Each call therefore synchronizes `stream`. Results equal the CPU's
 * bitwise (same double arithmetic, sums in the same order) except where
 * K3 = expm1(d) - d for |d| >= 1/2 is involved (CUDA's expm1 vs the C
 * library's): within 1 ulp; docs/rl.md, "CUDA", lists each function.
 * Without CUDA in the build they return XENT_ERR_UNSUPPORTED. */
XENT_API xent_status xent_cuda_rl_group_advantages(const float *rewards,
                                          const xent_rl_groups *groups,
                                          const xent_rl_adv_opts *opts,
                                          float *adv, double *group_mean,
                                          double *group_std,
                                          xent_rl_adv_stats *stats,
                                          void *stream);

XENT_API xent_status xent_cuda_rl_batch_normalize(const float *adv_in, int64_t n,
                                         const uint8_t *mask,
                                         const xent_rl_batch_opts *opts,
                                         float *adv_out,
                                         xent_rl_batch_stats *stats,
                                         void *stream);

XENT_API xent_status xent_cuda_rl_policy_loss(const xent_rl_input *in,
                                     const xent_rl_loss_opts *opts,
                                     float *token_loss, float *grad,
                                     xent_rl_loss_stats *stats, void *stream);

XENT_API xent_status xent_cuda_rl_kl_estimate(xent_rl_kl kind, const float *lp_new,
                                     const float *lp_ref, int64_t T,
                                     const uint8_t *mask,
                                     double log_ratio_clamp, float *kl,
                                     float *dkl, int64_t *n_clamped,
                                     void *stream);

XENT_API xent_status xent_cuda_rl_diagnostics(const xent_rl_input *in,
                                     const xent_rl_loss_opts *opts,
                                     xent_rl_diag *out, void *stream);

XENT_API xent_status xent_cuda_rl_check_logprobs(const char *name, const float *lp,
                                        int64_t T, const int64_t *offsets,
                                        int64_t nseq, const uint8_t *mask,
                                        int allow_neg_inf,
                                        int64_t zero_run_limit,
                                        xent_rl_lp_report *report,
                                        void *stream);

#ifdef __cplusplus
}
#endif
#endif /* XENT_RL_H */
