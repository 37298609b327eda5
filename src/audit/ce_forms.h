/* src/audit/ce_forms.h: faithful CPU emulations of the common cross-entropy
 * forms that lose precision (for `xent sweep` and the audit's `ce` policy).
 * Each works on one row of fp32 logits (already in the storage dtype the
 * emulated kernel reads) and writes the NLL and, if grad != NULL, dL/dz for
 * a unit upstream gradient, both as fp32. */
#ifndef XENT_CPU_CE_FORMS_H
#define XENT_CPU_CE_FORMS_H

#include <stdint.h>

#include "xent.h"

typedef enum xent_ce_form {
    XENT_CE_EXACT = 0,       /* xent's exact kernel                          */
    XENT_CE_FP32_NAIVE,      /* fp32: nll = lse - z_t, grad_t = p_t - 1      */
    XENT_CE_BF16_LSE,        /* logsumexp stored in bf16, then z_t - lse     */
    XENT_CE_BF16_PROBS,      /* softmax stored in bf16 before p - 1          */
    XENT_CE_F16_PROBS,       /* softmax stored in fp16 before p - 1          */
    XENT_CE_BF16_LOGSOFTMAX, /* bf16 log_softmax with bf16 accumulation      */
    XENT_CE_FORM_COUNT
} xent_ce_form;

const char *xent__ce_form_name(xent_ce_form f); /* "exact", "fp32", ...    */
int xent__ce_form_parse(const char *s, xent_ce_form *out); /* 0 on success */

/* z: [V] logits of one row; t: target in [0, V). */
void xent__ce_form_row(xent_ce_form form, const float *z, int64_t V, int64_t t,
                       float *nll, float *grad /* [V] or NULL */);

/* ---- The dead-zone sweep (xent sweep, tests/test_sweep.c) ---------------
 * A sweep row has V logits; the target t holds z_t = round(base) and the
 * V - 1 others hold round(base - margin - L + n_j), where n_j = scale * N(0,1)
 * (seeded) and L = log sum_{j!=t} exp(n_j), so that before rounding
 * lse_{j!=t} = base - margin exactly: the target margin is
 * m = z_t - lse_{j!=t}, and p_t = 1 / (1 + exp(-m)). round() is the input
 * dtype's round-to-nearest-even (F32, BF16 or F16). */
typedef struct xent__sweep_gen {
    int64_t V, t;          /* vocabulary, target column                     */
    xent_dtype dtype;      /* input rounding of the logits                  */
    double *noise;         /* [V] scale * N(0,1); noise[t] is 0, unused     */
    long double noise_lse; /* log sum_{j!=t} exp(noise_j)                   */
} xent__sweep_gen;

/* 0 on success, -1 when out of memory. t = -1 picks a seeded column. */
int xent__sweep_gen_init(xent__sweep_gen *g, int64_t V, int64_t t,
                         xent_dtype dtype, double scale, uint64_t seed);
void xent__sweep_gen_free(xent__sweep_gen *g);
void xent__sweep_row(const xent__sweep_gen *g, double base, double margin,
                     float *z /* [V] */);

/* Long-double oracle on the given (already rounded) row. */
typedef struct xent__ce_oracle {
    long double margin; /* z_t - lse_{j!=t}                                 */
    long double nll;    /* softplus(-margin) = -log p_t                     */
    long double grad_t; /* p_t - 1 = -1 / (1 + exp(margin))                 */
    long double lse;    /* log sum_j exp(z_j)                               */
} xent__ce_oracle;
void xent__ce_oracle_row(const float *z, int64_t V, int64_t t,
                         xent__ce_oracle *o);

/* Which output a threshold is about. */
enum { XENT__OUT_NLL = 0, XENT__OUT_GRAD = 1 };

/* The smallest nominal margin in [lo, hi] (to `tol`) at which `form`
 * returns exactly 0 for `which` on sweep rows at `base`, by bisection.
 * Returns 1 and sets *margin (nominal) and *actual (the rounded row's
 * oracle margin) when the form is nonzero at lo and zero at hi; 0 when it
 * is never zero on the bracket (or already zero at lo: *margin = lo);
 * -1 when out of memory. */
int xent__ce_form_threshold(const xent__sweep_gen *g, xent_ce_form form,
                            int which, double base, double lo, double hi,
                            double tol, double *margin, double *actual);

/* The margin above which `form` is predicted to return exactly 0 for
 * `which` when the target logit is z_t (the rounding argument is in
 * src/audit/ce_forms.c); INFINITY when it never is. */
double xent__ce_form_predicted(xent_ce_form form, int which, float z_t);

#endif
