/* src/audit/audit.h: `xent audit`, where precision is lost layer by layer.
 *
 * Parts (each in its own file):
 *   metrics.c      error metrics of one tensor against the fp32 reference
 *   variants.c     precision variants: defaults, "name:key=value,..." specs
 *                  and config files, the reference check
 *   result.c       result arrays, per-variant summaries
 *   tables.c       console tables (cells shared with the HTML page)
 *   result.c       also the verdict (budgets, where the error enters)
 *   audit_json.c   --json;  audit_html.c  --html (inline SVG)
 *   audit_run.c    drives the model engine: reference + one run per variant
 * Definitions of every metric: docs/audit.md. */
#ifndef XENT_AUDIT_H
#define XENT_AUDIT_H

#include "xent.h"
#include "model/model.h"
#include "model/precision.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------------ */
/* Metrics (docs/audit.md, "Metrics")                                        */
/* ------------------------------------------------------------------------ */

/* d = test - ref over n elements, everything in double:
 *   rms_abs  = RMS(d)           ref_scale = RMS(ref)
 *   rms_rel  = rms_abs / sqrt(ref_scale^2 + 1e-8)
 *   max_abs  = max |d|          bias = mean(d)
 *   corr     = cov / (sd_test sd_ref)      slope = cov / var_ref
 *   residual = sqrt(max(var_test - cov^2 / var_ref, 0))
 * (population moments). When test == ref element for element: every error
 * is exactly 0 and corr = slope = 1. A zero variance makes corr / slope NaN
 * (residual then is sd_test). n_nonfinite counts elements where either side
 * is NaN or infinite; they make every metric NaN. */
typedef struct xent_audit_metrics {
    int64_t n;
    double rms_abs, ref_scale, rms_rel, max_abs, bias, corr, slope, residual;
    int64_t n_nonfinite;
} xent_audit_metrics;

void xent__audit_metrics(const float *test /* [n] */, const float *ref /* [n] */,
                         int64_t n, xent_audit_metrics *m);

/* The same with the blocks split over `threads` threads (the result does
 * not depend on the thread count). XENT_ERR_ALLOC: metrics NaN. */
xent_status xent__audit_metrics_mt(const float *test, const float *ref,
                                   int64_t n, int threads,
                                   xent_audit_metrics *m);

/* The denominator of every relative figure: sqrt(ref_scale^2 + 1e-8). */
double xent__audit_rel_denom(const xent_audit_metrics *m);

/* Neumaier-compensated running sum. */
typedef struct { double s, c; } xent__ksum;
static inline void xent__ksum_add(xent__ksum *k, double x) {
    double t = k->s + x;
    if (fabs(k->s) >= fabs(x)) k->c += (k->s - t) + x;
    else k->c += (x - t) + k->s;
    k->s = t;
}
static inline double xent__ksum_get(const xent__ksum *k) { return k->s + k->c; }

/* Median of n doubles (NaN ignored; NaN when none); does not modify x. */
double xent__audit_median(const double *x, int n);

/* ------------------------------------------------------------------------ */
/* Variants (docs/audit.md, "Variants")                                      */
/* ------------------------------------------------------------------------ */

#define XENT_AUDIT_NAME_MAX 48
#define XENT_AUDIT_MAX_VARIANTS 32

typedef struct xent_audit_variant {
    char name[XENT_AUDIT_NAME_MAX];
    xent_precision p;
} xent_audit_variant;

typedef struct xent_audit_variants {
    xent_audit_variant v[XENT_AUDIT_MAX_VARIANTS];
    int n;
} xent_audit_variants;

/* fp32 (reference), bf16, bf16_fp32head, fp16, fp16_fp32head. */
void xent__audit_default_variants(xent_audit_variants *out);

/* One variant from "NAME" (a default's name: that default), "NAME:k=v,k=v"
 * or "NAME k=v k=v" (config-file form). Overrides start from the all-fp32
 * policy. Keys: compute residual norm attn_softmax lm_head logits grad_accum
 * (fp32|bf16|fp16), ce (exact|fp32|bf16_lse|bf16_probs|f16_probs|
 * bf16_logsoftmax), micro_batches (>= 1), loss_scale (auto or a number > 0),
 * and `all` (sets compute residual norm attn_softmax lm_head logits).
 * A bad key or value: XENT_ERR_VALUE with a message listing what is
 * accepted. */
xent_status xent__audit_variant_parse(const char *spec, xent_audit_variant *out);

/* Appends a variant; refuses a duplicate name or a full list. */
xent_status xent__audit_variants_add(xent_audit_variants *list,
                                     const xent_audit_variant *v);

/* Reads a config file: one variant per line "NAME key=value ...", blank
 * lines and lines starting with '#' skipped. Appends to *list. */
xent_status xent__audit_variants_file(const char *path,
                                      xent_audit_variants *list);

/* 1 when p is the all-fp32 reference policy (every dtype fp32, exact CE,
 * one micro-batch, loss scale 1 or auto). */
int xent__audit_is_reference(const xent_precision *p);

/* Index of the first reference variant; XENT_ERR_VALUE (message says how to
 * add one) when the list has none or is empty. */
xent_status xent__audit_find_reference(const xent_audit_variants *list,
                                       int *ref);

/* "compute=bf16 residual=bf16 ..." (every key) into buf. */
void xent__audit_policy_str(const xent_precision *p, char *buf, size_t n);

/* Name used in specs for a dtype: "fp32", "bf16", "fp16". */
const char *xent__audit_dtype_name(xent_dtype t);
/* Name of a loss form in specs: "exact", "fp32", "bf16_lse", ... */
const char *xent__audit_ce_name(xent_ce_form f);

/* ------------------------------------------------------------------------ */
/* Results and reports (docs/audit.md, "Report")                             */
/* ------------------------------------------------------------------------ */

/* What a recorded tensor is; decides the table it is summarised in. */
typedef enum xent_audit_role {
    XA_FW_LAYER = 0,  /* a layer's forward output (layer = index)            */
    XA_LOGITS,        /* the logits                                          */
    XA_BW_LAYER,      /* gradient at a layer's input (layer = index)         */
    XA_DLOGITS,       /* gradient of the loss w.r.t. the logits              */
    XA_G_LM_HEAD,     /* parameter gradients, by kind                        */
    XA_G_LINEAR,
    XA_G_NORM,
    XA_G_BIAS,
    XA_G_EMBED,
    XA_G_OTHER,
    XA_LOGPROB,       /* chosen-token log-probabilities                      */
    XA_OTHER,         /* anything else the engine records                    */
    XA_ROLE_COUNT
} xent_audit_role;

typedef struct xent_audit_entry {
    char name[96];
    xent_audit_role role;
    int layer; /* -1 when not a layer tensor */
} xent_audit_entry;

typedef struct xent_audit_result {
    /* settings */
    char model[512];
    char input[512];       /* text file, or "random" */
    uint64_t seed;
    int64_t seq_len, batch;
    int n_layers;
    int tied_head;         /* LM head shares the embeddings' gradient */
    int random_weights;    /* 1: the model's weights are random (--init
                              random): every report says so              */
    int threads;
    int gemm_device;       /* the variants' products: 0 CPU, 1 GPU, 2 the
                              whole pass resident on the GPU                */
    double total_seconds;  /* whole audit, wall time */
    /* tokens actually run: [batch][seq_len] ids; targets = tokens shifted */
    int32_t *tokens;       /* [batch * seq_len] */
    int64_t n_tokens;      /* batch * seq_len */
    int64_t n_targets;     /* batch * (seq_len - 1) */
    /* variants */
    xent_audit_variants variants;
    int ref;
    /* tensors and their metrics */
    int n_entries;
    xent_audit_entry *entries;   /* [n_entries] */
    xent_audit_metrics *m;       /* [n_variants][n_entries] */
    float *logprob;              /* [n_variants][n_targets] chosen log p */
    int64_t *dead_logprob;       /* [n_variants] */
    int64_t *dead_grad;          /* [n_variants] */
    int64_t *dead_any;           /* [n_variants]: either (a token counts once) */
    double *loss_scale;          /* [n_variants] scale used (1 = none) */
    double *seconds;             /* [n_variants] wall time of the run */
    double *loss;                /* [n_variants] the scalar loss */
    /* text of each token (the model's tokenizer, xent_detokenize of the one
     * id): token i is token_text + token_text_off[i], NUL-terminated, raw
     * bytes (a byte-level token may hold part of a UTF-8 character). NULL
     * both when the model has no tokenizer. */
    char *token_text;            /* NULL or the texts, each NUL-terminated */
    int64_t *token_text_off;     /* NULL or [n_tokens] offsets into it      */
} xent_audit_result;

/* Allocates the arrays for nv variants, ne entries, nt targets, nk tokens
 * (zeroed; metrics NaN). */
xent_status xent__audit_result_alloc(xent_audit_result *r, int nv, int ne,
                                     int64_t nt, int64_t nk);
void xent__audit_result_free(xent_audit_result *r);

/* Fills r->token_text / token_text_off from r->tokens with tk (NULL tk:
 * leaves them NULL). */
xent_status xent__audit_result_token_text(xent_audit_result *r,
                                          const xent_tokenizer *tk);
/* Text of token i (0 <= i < n_tokens), NULL when there is none. */
const char *xent__audit_token_text(const xent_audit_result *r, int64_t i);
/* Bytes of the valid UTF-8 character at s (1-4), 0 when s does not start
 * one (a stray continuation byte, an overlong or cut sequence, a surrogate)
 * or *s is NUL. */
int xent__audit_utf8_len(const char *s);

/* Dead zone: targets whose variant value is exactly 0 while the reference
 * value is not. */
int64_t xent__audit_dead_count(const float *test, const float *ref, int64_t n);

/* Summary row of one variant (relative %, NaN when the table has no such
 * tensor). */
typedef struct xent_audit_summary {
    double fw[5];   /* first | mid median | mid max | logits | last */
    double bw[5];   /* first | logits | mid median | mid max | last */
    double grad[8]; /* lm head | linear med | linear max | norm med | norm max
                       | bias med | bias max | embeddings */
    /* chosen logprobs: RMS rel | bias rel | residual rel | corr | slope |
     * max abs | scale */
    double lp[7];
} xent_audit_summary;

void xent__audit_summarize(const xent_audit_result *r, int variant,
                           xent_audit_summary *s);

/* The verdict (docs/audit.md, "Verdict"): three figures per variant and
 * the tightest budget that holds all three.
 *   logits_pct  relative RMS error of the logits, %
 *   logprob     RMS error of the chosen-token log-probs, nats
 *   grad_pct    median relative RMS error of the linear layers' weight
 *               gradients, % (NaN when the model has none: not judged)
 * budget: index into xent__audit_budgets (0 tightest), or
 * XENT_AUDIT_N_BUDGETS when none holds (or a figure is not finite). */
#define XENT_AUDIT_N_BUDGETS 3
typedef struct xent_audit_budget {
    const char *name;     /* "tight", "training", "loose"  */
    const char *use;      /* what it is good for, one phrase */
    double logits_pct, logprob, grad_pct;
} xent_audit_budget;
extern const xent_audit_budget xent__audit_budgets[XENT_AUDIT_N_BUDGETS];

typedef struct xent_audit_verdict {
    double logits_pct, logprob, grad_pct;
    int budget;
    /* where the error enters: the first tensor along the forward chain
     * (embeddings, layer outputs, final norm, logits) whose relative error
     * exceeds half that of the chain's last tensor (the logits), and the
     * same along the backward chain (dL/dlogits, gradients at the layer
     * inputs from the last layer down, the embeddings' output gradient);
     * -1 when the chain's last error is 0 or not finite */
    int fw_entry, bw_entry;
    double fw_final_pct, bw_final_pct; /* the chains' last errors, % */
} xent_audit_verdict;

void xent__audit_verdict(const xent_audit_result *r, int variant,
                         xent_audit_verdict *v);
/* Index of the tensor where the error enters (see fw_entry); final: the
 * chain's last relative error (fraction, not %). */
int xent__audit_error_entry(const xent_audit_result *r, int variant,
                            int backward, double *final);

/* Prints v with `decimals` digits after the point chosen so the value keeps
 * two significant figures: the number of decimals for a column is the
 * largest any of its n values needs (capped at 12). */
int xent__audit_decimals_for(double v);
int xent__audit_column_decimals(const double *v, int n);

/* A text table (cells shared by the console and the HTML report). */
#define XA_MAX_ROWS XENT_AUDIT_MAX_VARIANTS
#define XA_MAX_COLS 12
#define XA_CELL 200
typedef enum { XA_SIG2 = 0, XA_DEV1, XA_INT } xa_mode;
typedef struct xa_table {
    char title[160];
    char note[200];
    int ncol, nrows;
    char hdr[XA_MAX_COLS][32];
    char left[XA_MAX_COLS]; /* 1: left-aligned text column (column 0 always) */
    char cell[XA_MAX_ROWS][XA_MAX_COLS][XA_CELL];
} xa_table;
void xa_table_init(xa_table *t, const char *title, int ncol,
                   const char *const *hdr, int nrows);
void xa_table_text(xa_table *t, int row, int col, const char *s);
void xa_table_column(xa_table *t, int col, const double *v /* [nrows] */,
                     xa_mode mode);
void xa_table_drop_empty(xa_table *t, int first_col);
void xa_table_print(const xa_table *t, FILE *f);
void xa_build_variants(xa_table *t, const xent_audit_result *r);
void xa_build_fw(xa_table *t, const xent_audit_result *r);
void xa_build_bw(xa_table *t, const xent_audit_result *r);
void xa_build_grad(xa_table *t, const xent_audit_result *r);
void xa_build_lp(xa_table *t, const xent_audit_result *r);
void xa_build_verdict(xa_table *t, const xent_audit_result *r);

void xent__audit_print_tables(const xent_audit_result *r, FILE *f);
xent_status xent__audit_write_json(const xent_audit_result *r, const char *path);
xent_status xent__audit_write_html(const xent_audit_result *r, const char *path);

/* ------------------------------------------------------------------------ */
/* Running the audit (audit_run.c)                                                 */
/* ------------------------------------------------------------------------ */

typedef struct xent_audit_opts {
    const char *text_path; /* NULL: uniform random tokens from `seed`        */
    uint64_t seed;         /* default 0                                      */
    int64_t seq_len;       /* default 512                                    */
    int64_t batch;         /* default 1                                      */
    int threads;           /* default 0: XENT_NUM_THREADS, else all cores    */
    int progress;          /* default 1: a line per variant on stderr        */
    /* default NULL; else the per-variant lines go to log(log_ctx, done,
     * total, line) instead of stderr: line without '\n' (NULL when progress
     * is 0), done of total variants finished (-1: a note, no count); the
     * CLI draws its progress line from it */
    void (*log)(void *log_ctx, int done, int total, const char *line);
    void *log_ctx;
    int gemm_device;       /* default 0; 1: the variants' matrix products on
                              the GPU (cuBLAS, real tensor-core bf16/f16
                              products); 2: each variant's whole forward and
                              backward resident on the GPU (its memory plan
                              printed first); the fp32 reference stays on
                              the CPU                                       */
    /* default NULL; else called as each layer of a run finishes: variant
     * (index in the list), layer in [0, n_layers), backward 0 for the
     * forward pass, 1 for the backward pass (layers from n_layers - 1 down
     * to 0). A run that reuses the previous run's forward reports its backward only. */
    void (*on_layer)(void *ctx, int variant, int layer, int n_layers,
                     int backward);
    void *on_layer_ctx;
} xent_audit_opts;

void xent__audit_opts_init(xent_audit_opts *o);

/* n uniform ids in [0, vocab) from seed (splitmix64, multiply-shift). */
xent_status xent__audit_random_tokens(uint64_t seed, int64_t vocab, int64_t n,
                                      int32_t *out /* [n] */);

/* The tokens to run: random, or the text tokenized with the model's
 * tokenizer. A text shorter than B*S tokens shrinks the batch (whole rows),
 * then the row length; fewer than 2 tokens is refused. *tokens is
 * malloc'ed ([B*S] used). */
xent_status xent__audit_tokens(const xent_model *m, const xent_audit_opts *o,
                               int32_t **tokens, int64_t *B, int64_t *S);

/* Power of two that keeps largest_grad * scale <= 65504 / 8 (clamped to
 * [2^-24, 2^24]; 1 when largest_grad is 0 or not finite). */
double xent__audit_pick_loss_scale(double largest_grad);

/* Reference run, then each variant, on tokens [B, S] (next-token targets).
 * Fills *r (free with xent__audit_result_free). Variants with loss_scale
 * auto that store anything in fp16 get xent__audit_pick_loss_scale of the
 * reference run's largest gradient (the calibration pass), halved and run
 * again while a gradient overflows (at most 8 times); the others 1. */
xent_status xent__audit_run(const xent_model *m, const int32_t *tokens,
                            int64_t B, int64_t S,
                            const xent_audit_variants *vs,
                            const xent_audit_opts *o, xent_audit_result *r);

#endif
