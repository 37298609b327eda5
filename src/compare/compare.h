/* src/compare/compare.h: private API of `xent compare` (do two engines agree
 * on the per-token log-probs of the same tokens?).
 *
 * Pipeline: load (readers.c, json.c) -> check (check.c) -> statistics
 * (stats.c, boot.c) -> table / JSON (report.c) and HTML (html.c); run.c
 * glues them for the CLI and the tests. Metric definitions: docs/compare.md. */
#ifndef XENT_COMPARE_H
#define XENT_COMPARE_H

#include "core/xent_math.h"

#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------------ */
/* Loaded data                                                               */
/* ------------------------------------------------------------------------ */

/* One source file's content. Every pointer is malloc'ed or NULL. */
typedef struct xent__cmp_series {
    double *lp;        /* [n] log-probs (NULL for an id-only source)       */
    int64_t n;         /* number of log-probs                              */
    int64_t *tokens;   /* [ntok] token ids, or NULL                        */
    int64_t ntok;
    int64_t *offsets;  /* [nseq + 1] sequence boundaries, or NULL          */
    int64_t nseq;
    uint8_t *mask;     /* [nmask] 1 = completion token, or NULL            */
    int64_t nmask;
    double *ent;       /* [nent] per-token entropy (JSONL "entropy"), or NULL */
    int64_t nent;
    uint8_t *lmask;    /* [nlmask] per-token 0/1 mask of the JSONL lines
                          ("mask" or xent__cmp_keys.mask), or NULL        */
    int64_t nlmask;
} xent__cmp_series;

void xent__cmp_series_free(xent__cmp_series *s);

/* Formats, chosen from the file name (see docs/compare.md). */
typedef enum { XENT__FMT_TENSOR, XENT__FMT_JSON, XENT__FMT_TEXT } xent__cmp_fmt;
xent__cmp_fmt xent__cmp_format(const char *spec);

/* Reads a whole file into a malloc'ed, NUL-terminated buffer. */
xent_status xent__cmp_slurp(const char *path, char **buf, size_t *len);

/* Log-probs from .npy / .safetensors[:NAME] (float dtypes), .jsonl / .json
 * (objects with "logprobs", optional "tokens", "prompt_len", "entropy" and
 * "mask") or text
 * (one number per line; nan, inf, -inf accepted). */
xent_status xent__cmp_load_logprobs(const char *spec, xent__cmp_series *out);
/* Token ids: an integer tensor, text (one integer per line), JSON Lines
 * ("tokens" of every line) or a JSON document whose top level is an array of
 * arrays of ints or an object with such a "tokens" member. Sets tokens and,
 * for nested arrays, offsets. */
xent_status xent__cmp_load_ids(const char *spec, xent__cmp_series *out);
/* Integers (offsets) or 0/1 values (mask) from a tensor or text file. */
xent_status xent__cmp_load_ints(const char *spec, int64_t **v, int64_t *n);

/* The JSON Lines keys of a log-prob source: lp holds the log-probs (NULL:
 * "logprobs"), mask the per-token 0/1 mask (NULL: "mask"); lp_flag and
 * mask_flag name the flags that set them in messages (or NULL). Keys are
 * matched on their decoded text, at most XENT__CMP_KEY_MAX bytes. */
#define XENT__CMP_KEY_MAX 256
typedef struct xent__cmp_keys {
    const char *lp, *lp_flag, *mask, *mask_flag;
} xent__cmp_keys;
/* xent__cmp_load_logprobs with the keys of a JSON Lines source (keys may
 * be NULL: the defaults; they are not used for other formats). */
xent_status xent__cmp_load_logprobs_keys(const char *spec, const xent__cmp_keys *keys,
                                         xent__cmp_series *out);

/* Parsers on a NUL-terminated buffer (`name` is used in messages). */
xent_status xent__cmp_parse_text(const char *name, const char *buf, size_t len,
                                 double **v, int64_t *n);
xent_status xent__cmp_parse_text_ints(const char *name, const char *buf,
                                      size_t len, int64_t **v, int64_t *n);
/* JSON Lines of per-sequence objects, or one JSON document of token ids.
 * need_lp: "logprobs" is required on every line. */
xent_status xent__cmp_parse_json(const char *name, const char *buf, size_t len,
                                 int need_lp, xent__cmp_series *out);
/* The same with the keys of the log-probs and of the mask (NULL: the
 * defaults). */
xent_status xent__cmp_parse_json_keys(const char *name, const char *buf, size_t len,
                                      int need_lp, const xent__cmp_keys *keys,
                                      xent__cmp_series *out);

/* ------------------------------------------------------------------------ */
/* Options and results                                                       */
/* ------------------------------------------------------------------------ */

typedef struct xent__cmp_opts {
    double eps;          /* 0.2: PPO clip, low side and log space         */
    double eps_high;     /* 0.28: PPO clip, high side (ratio space)       */
    double clamp;        /* 20: sequence log-weight clamp to warn about   */
    int64_t zero_run;    /* 8: runs of exact zeros this long are bad      */
    int exclude_bad;     /* 0: refuse on bad values; 1: leave them out    */
    uint64_t seed;       /* 0: bootstrap seed                             */
    int64_t bootstrap;   /* 1000: resamples (0 = no intervals)            */
    int64_t top;         /* 10: worst tokens listed                       */
    int threads;         /* 0: XENT_NUM_THREADS, else all cores           */
    /* RL-trainer metrics (metrics.c; docs/compare.md, "RL-trainer metrics") */
    double tis_cap;      /* 2: TIS truncation w > C (verl, libxent tis_cap) */
    double mis_cap;      /* 3: MIS masking w > C (TRL's cap)               */
    double icepop_lo;    /* 0.5: ICEPOP keeps w in [lo, hi] (OpenRLHF)     */
    double icepop_hi;    /* 5                                              */
} xent__cmp_opts;

void xent__cmp_opts_default(xent__cmp_opts *o);
/* XENT_ERR_VALUE with a message naming the flag when an option is out of
 * its range (eps in (0, 1), eps_high > 0, clamp > 0, zero_run >= 1, ...). */
xent_status xent__cmp_check_opts(const xent__cmp_opts *o);

/* Counts of bad log-probs in one input, among the selected tokens. */
typedef struct xent__cmp_bad {
    int64_t positive, nan, inf, zero_run;   /* counts                      */
    int64_t first_positive, first_nan, first_inf, first_zero_run; /* -1   */
} xent__cmp_bad;

typedef struct { double lo, hi; } xent__cmp_ci;

typedef struct xent__cmp_tok {
    int64_t pos;       /* flat position                                    */
    int64_t seq, idx;  /* sequence and index inside it (-1 if unknown)     */
    int64_t token;     /* token id, -1 if unknown                          */
    double a, b, r;    /* values (r NaN without a reference)               */
} xent__cmp_tok;

typedef struct xent__cmp_seq {
    int64_t seq, n;    /* sequence, its used (completion) tokens            */
    double mean, sum;  /* mean and sum of delta over them                   */
} xent__cmp_seq;

/* RL-trainer metrics of one group of tokens (all used tokens, or one
 * bucket), with lw = clamp(A - B, +-clamp) the log importance weight
 * log(pi_A / pi_B) (A = the trainer, B = the sampler) and w = exp(lw). */
typedef struct xent__cmp_rlm {
    int64_t n;                     /* tokens                               */
    double mean, rms, mean_abs;    /* of delta = A - B (unclamped)         */
    double k1, k2, k3;             /* means of -lw, lw^2/2, e^lw - 1 - lw  */
    double chi2;                   /* mean(w^2) - 1 = mean(expm1(2 lw))    */
    double ess;                    /* (sum w)^2 / (n sum w^2)              */
    double tis, mis, icepop;       /* fractions: w > tis_cap, w > mis_cap,
                                      w outside [icepop_lo, icepop_hi]     */
} xent__cmp_rlm;

#define XENT__CMP_NPOS 4           /* completion index 0-63, 64-255,
                                      256-1023, 1024+                      */
#define XENT__CMP_NENT 4           /* entropy (nats) < 0.01, < 0.1, < 1, >= 1 */
#define XENT__CMP_NFREQ 3          /* rare, mid, common (terciles)         */
extern const int64_t xent__cmp_pos_edges[XENT__CMP_NPOS - 1];
extern const double xent__cmp_ent_edges[XENT__CMP_NENT - 1];

typedef struct xent__cmp_rl {
    xent__cmp_rlm tok;             /* token level, every used token        */
    double ppl_a, ppl_b;           /* exp(mean over tokens of -lp)         */
    double w_min, w_mean, w_max;   /* token weights                        */
    double ess_trunc;              /* ESS of w clamped into [1/C, C],
                                      C = tis_cap (verl's logged ESS)      */
    int64_t n_clamped;             /* tokens with |delta| > clamp          */
    /* sequence level (with boundaries; nseq = sequences with tokens):
     * S_q = clamp(sum of lw over the sequence), G_q = clamp(mean of lw) */
    int64_t nseq;
    double ppl_seq_a, ppl_seq_b;   /* mean over sequences of exp(-mean lp) */
    double log_ppl_diff;           /* mean over sequences of (mean lp_B -
                                      mean lp_A) (verl)                   */
    double chi2_seq;               /* mean expm1(2 S_q)                    */
    double ess_seq;                /* of exp(S_q)                          */
    double tis_seq, mis_seq, mis_geo; /* fractions of sequences: exp(S_q) >
                                      tis_cap, > mis_cap, exp(G_q) > mis_cap */
    /* breakdowns */
    xent__cmp_rlm pos[XENT__CMP_NPOS];
    int has_entropy;
    xent__cmp_rlm ent[XENT__CMP_NENT];
    int64_t n_ent_missing;         /* used tokens whose entropy is not finite */
    int has_freq;
    xent__cmp_rlm freq[XENT__CMP_NFREQ];
    int64_t freq_cut[2];           /* rare: count <= cut[0]; common: > cut[1] */
    int64_t n_ids;                 /* distinct token ids among used tokens */
} xent__cmp_rl;

#define XENT__CMP_NQ 4
extern const double xent__cmp_qlevels[XENT__CMP_NQ]; /* .5 .9 .99 .999    */

typedef struct xent__cmp_result {
    /* sizes */
    int64_t n;            /* tokens in the dumps                          */
    int64_t n_selected;   /* completion tokens (mask), all without a mask */
    int64_t n_used;       /* selected minus excluded bad tokens           */
    int64_t n_excluded;
    int has_ref, has_ref_b, has_tokens, has_seq, has_mask;
    xent__cmp_bad bad[4]; /* A, B, R, R_B                                 */
    /* token statistics of delta = A - B */
    double mean, rms, sum, max_abs;
    xent__cmp_tok max_tok;
    double q[XENT__CMP_NQ];          /* quantiles of |delta|              */
    double clip_ratio, clip_log;     /* fractions                         */
    int64_t n_clip_ratio, n_clip_log;
    /* bootstrap */
    int64_t boot_n, boot_units, boot_block;
    int boot_by_seq;
    xent__cmp_ci ci_mean, ci_rms, ci_clip_ratio, ci_clip_log;
    /* per sequence */
    int64_t nseq, nseq_used;         /* sequences, those with tokens      */
    double seq_mean, seq_std, seq_rms, seq_max;  /* of per-seq mean delta */
    int64_t seq_max_idx;
    double seq_sum_min, seq_sum_max; /* of per-seq sum delta              */
    int64_t seq_sum_min_idx, seq_sum_max_idx;
    int64_t n_clamp_warn;
    int64_t *clamp_idx;              /* [n_clamp_list] sequences warned   */
    double *clamp_sum;               /* [n_clamp_list] their sum delta    */
    int64_t n_clamp_list;
    xent__cmp_seq *topseq;           /* [ntopseq] by |mean delta|, worst first */
    int64_t ntopseq;
    /* reference */
    double rms_ea, rms_eb, mean_ea, mean_eb, sd_ea, sd_eb;
    double rho, rho0, cross;         /* centred, uncentred; -2 E[eA eB]   */
    /* delta = floor + (e_A - e_B), floor = R - R_B (0 without --ref-b) */
    double floor_mean, floor_rms;
    double rms_eab;                  /* RMS(e_A - e_B)                    */
    double floor_cross;              /* 2 E[floor (e_A - e_B)]            */
    /* RL-trainer metrics */
    xent__cmp_rl rl;
    /* worst tokens */
    xent__cmp_tok *top;              /* [ntop]                            */
    int64_t ntop;
    /* inputs kept for the plots (not owned) */
    const double *a, *b, *r;
    const uint8_t *use;              /* [n] 1 = token used                */
} xent__cmp_result;

void xent__cmp_result_free(xent__cmp_result *r);

/* The data after loading and merging: values and optional side data. */
typedef struct xent__cmp_data {
    const double *a, *b, *r;        /* [n] each; r may be NULL            */
    int64_t n;
    const int64_t *tokens;          /* [n] or NULL                        */
    const int64_t *offsets;         /* [nseq + 1] or NULL                 */
    int64_t nseq;
    const uint8_t *mask;            /* [n] or NULL (all selected)         */
    const double *rb;               /* [n] B's own reference, or NULL (= r) */
    const double *entropy;          /* [n] per-token entropy, or NULL     */
} xent__cmp_data;

/* Counts bad values of one input among the selected tokens and marks them
 * in bad_mask ([n], or NULL). */
void xent__cmp_scan_bad(const double *v, int64_t n, const uint8_t *mask,
                        int64_t zero_run, xent__cmp_bad *out,
                        uint8_t *bad_mask);

/* Quantile with linear interpolation (numpy's default): sorts nothing,
 * partially reorders x[0..n). Levels must be increasing. */
void xent__cmp_quantiles(double *x, int64_t n, const double *levels, int nl,
                         double *out);

/* Checks and statistics. Fails with XENT_ERR_VALUE when bad values are
 * present and opts->exclude_bad is 0 (res->bad holds the counts). */
xent_status xent__cmp_compute(const xent__cmp_data *d,
                              const xent__cmp_opts *opts,
                              xent__cmp_result *res);

/* RL-trainer metrics and their breakdowns (metrics.c) into res->rl, over
 * the used tokens use[n]. */
xent_status xent__cmp_rl_metrics(const xent__cmp_data *d, const uint8_t *use,
                                 const xent__cmp_opts *opts, xent__cmp_result *res);

/* Bootstrap over per-unit sufficient statistics (boot.c). */
typedef struct xent__cmp_unit {
    double n, s, s2, cr, cl; /* tokens, sum d, sum d^2, clipped (ratio/log) */
} xent__cmp_unit;
void xent__cmp_bootstrap(const xent__cmp_unit *u, int64_t nu, int64_t B,
                         uint64_t seed, int threads, xent__cmp_result *res);

/* Outputs. */
void xent__cmp_print_table(FILE *f, const xent__cmp_result *r,
                           const xent__cmp_opts *o, const char *const names[4]);
void xent__cmp_print_bad(FILE *f, const xent__cmp_result *r,
                         const char *const names[4]);
void xent__cmp_write_json(FILE *f, const xent__cmp_result *r,
                          const xent__cmp_opts *o);
void xent__cmp_write_html(FILE *f, const xent__cmp_result *r,
                          const xent__cmp_opts *o, const char *const names[4]);

/* ------------------------------------------------------------------------ */
/* The whole command                                                         */
/* ------------------------------------------------------------------------ */

typedef struct xent__cmp_cfg {
    const char *a, *b, *ref;           /* log-prob sources (ref optional)  */
    const char *ref_b;                 /* B's own reference (optional)     */
    const char *entropy;               /* per-token entropy (optional)     */
    const char *tokens_a, *tokens_b;   /* token-id sources (optional)      */
    const char *offsets, *mask;        /* optional                         */
    const char *json, *html;           /* output files ("-" = stdout)      */
    int quiet;                         /* no table on stdout               */
    int allow_nonfinite;               /* a non-finite statistic is not a
                                          failure                          */
    FILE *err;                         /* messages (NULL: stderr)          */
    xent__cmp_opts opts;
    /* JSON Lines keys (NULL: "logprobs", "logprobs", "mask"): the log-probs
     * of A (--key-a) and of B (--key-b), the per-token mask of every
     * log-prob source (--key-mask) */
    const char *key_a, *key_b, *key_mask;
} xent__cmp_cfg;

/* The name of the first non-finite headline statistic of r (mean, RMS, sum
 * and max |delta|, the two clip fractions), or NULL when all are finite. */
const char *xent__cmp_nonfinite(const xent__cmp_result *r);

/* Loads, checks, computes and writes. Returns 0 on success, 1 on a failed
 * check, an I/O error or (unless allow_nonfinite) a non-finite headline
 * statistic, after the outputs are written (message on stderr). */
int xent__cmp_run(const xent__cmp_cfg *cfg);

#endif
