/* src/audit/ce_forms.c: CPU emulations of the common cross-entropy forms, the
 * long-double oracle and the dead-zone threshold search behind `xent sweep`.
 *
 * Model of the reductions: every emulated kernel sums exp(z_j - max) in fp32
 * lanes; we model that sum as the correctly rounded fp32 value of the exact
 * sum of the fp32 terms (accumulated here in double, then rounded once), so
 * a sum that contains the target's 1 is fl(1 + s) with s the non-target mass.
 * This is the model under which the thresholds of docs/numerics.md section 5 hold.
 * Real tree reductions can lose a little more of s (when the target's partial
 * meets the other partials one half at a time, each below half an ulp of 1,
 * the fp32 threshold moves from 24 ln 2 down to about 23 ln 2). Every other
 * operation (expf, logf, the subtractions, each store to bf16 / fp16) is
 * performed exactly as the emulated kernel performs it, in the same order. */
#include "audit/ce_forms.h"

#include "core/xent_math.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_names[XENT_CE_FORM_COUNT] = {
    [XENT_CE_EXACT] = "exact",
    [XENT_CE_FP32_NAIVE] = "fp32",
    [XENT_CE_BF16_LSE] = "bf16_lse",
    [XENT_CE_BF16_PROBS] = "bf16_probs",
    [XENT_CE_F16_PROBS] = "f16_probs",
    [XENT_CE_BF16_LOGSOFTMAX] = "bf16_logsoftmax",
};

const char *xent__ce_form_name(xent_ce_form f) {
    return (f >= 0 && f < XENT_CE_FORM_COUNT) ? k_names[f] : "?";
}

int xent__ce_form_parse(const char *s, xent_ce_form *out) {
    for (int f = 0; f < XENT_CE_FORM_COUNT; f++)
        if (s && !strcmp(s, k_names[f])) { *out = (xent_ce_form)f; return 0; }
    return -1;
}

/* ---- rounding helpers -------------------------------------------------- */

/* x rounded to bf16 (RNE), kept as a float; NaN stays NaN. */
static inline float rbf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return x;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u; /* overflow -> inf */
    memcpy(&x, &u, 4);
    return x;
}
static inline float rf16(float x) { return xent_f16_to_f32(xent_f32_to_f16(x)); }

/* ---- fp32 building blocks ---------------------------------------------- */

static float row_max(const float *z /* [V] */, int64_t V) {
    float m = -INFINITY;
    int nan = 0;
    for (int64_t j = 0; j < V; j++) {
        nan |= z[j] != z[j];
        m = z[j] > m ? z[j] : m;
    }
    return nan ? NAN : m;
}

/* fl32(sum_j expf(z_j - shift)): fp32 terms, one rounding of their sum. */
static float sum_exp_f32(const float *z /* [V] */, int64_t V, float shift) {
    double acc = 0.0;
    for (int64_t j = 0; j < V; j++) acc += (double)expf(z[j] - shift);
    return (float)acc;
}

/* fp32 lse = max + logf(sum expf(z - max)); the forms' common forward. */
static float lse_f32(const float *z /* [V] */, int64_t V) {
    float mx = row_max(z, V);
    if (isinf(mx)) return mx;
    float s = sum_exp_f32(z, V, mx);
    return mx + logf(s);
}

/* grad_j = expf(z_j - lse), grad_t = grad_t - 1; `store` rounds p_j to
 * the probability storage dtype (F32: none). */
static void grad_from_lse(const float *z, int64_t V, int64_t t, float lse,
                          xent_dtype store, float *grad /* [V] */) {
    for (int64_t j = 0; j < V; j++) {
        float p = expf(z[j] - lse);
        grad[j] = store == XENT_BF16 ? rbf16(p) : (store == XENT_F16 ? rf16(p) : p);
    }
    float g = grad[t] - 1.0f;
    grad[t] = store == XENT_BF16 ? rbf16(g) : (store == XENT_F16 ? rf16(g) : g);
}

/* ---- the forms ---------------------------------------------------------- */

/* fp32: nll = lse - z_t, grad_t = p_t - 1 (Liger-style and `.float()`). */
static void form_fp32(const float *z, int64_t V, int64_t t, float *nll, float *grad) {
    float lse = lse_f32(z, V);
    *nll = lse - z[t];
    if (grad) grad_from_lse(z, V, t, lse, XENT_F32, grad);
}

/* lse stored in bf16 (a saved-statistics buffer), then z_t - lse. */
static void form_bf16_lse(const float *z, int64_t V, int64_t t, float *nll, float *grad) {
    float lse = rbf16(lse_f32(z, V));
    *nll = lse - z[t];
    if (grad) grad_from_lse(z, V, t, lse, XENT_F32, grad);
}

/* softmax stored in bf16 / fp16 before p - 1; nll as the fp32 form. */
static void form_probs(const float *z, int64_t V, int64_t t, xent_dtype store,
                       float *nll, float *grad) {
    float lse = lse_f32(z, V);
    *nll = lse - z[t];
    if (grad) grad_from_lse(z, V, t, lse, store, grad);
}

/* log_softmax on bf16 input as the CPU vectorised kernel runs it: the
 * arithmetic is fp32, every stored intermediate is bf16: the max, the sum of
 * exp (accumulated in fp32 lanes, stored in a bf16 buffer), the log of the
 * stored sum, and out = (z - max) - logsum. This reproduces the 5.55-nat
 * threshold of docs/numerics.md section 5 (bf16(1 + s) = 1 once
 * s <= 2^-8). Rounding the running sum to bf16 after every add instead
 * would stall the sum far earlier (measured on a sweep row,
 * V = 128256: the sum is 1 from m = 2.5 sequentially, from m = 4 over 32
 * lanes, and 3.4 instead of 55.6 at m = -4), which matches no threshold.
 * Backward of nll_loss o log_softmax:
 * g_j = bf16(go_j - expf(out_j) * sum(go)) with go = -onehot(t). */
static void form_bf16_logsoftmax(const float *zin, int64_t V, int64_t t,
                                 float *nll, float *grad) {
    float *z = calloc((size_t)V, sizeof *z); /* [V] bf16 input */
    if (!z) { *nll = NAN; if (grad) for (int64_t j = 0; j < V; j++) grad[j] = NAN; return; }
    for (int64_t j = 0; j < V; j++) z[j] = rbf16(zin[j]);
    float mx = row_max(z, V);
    float sum = rbf16(sum_exp_f32(z, V, mx));
    float logsum = rbf16(logf(sum));
    float out_t = rbf16((z[t] - mx) - logsum);
    *nll = -out_t;
    if (grad) {
        for (int64_t j = 0; j < V; j++) {
            float out = rbf16((z[j] - mx) - logsum);
            float go = j == t ? -1.0f : 0.0f;
            grad[j] = rbf16(go - expf(out) * -1.0f);
        }
    }
    free(z);
}

/* xent's kernel on the single row: F32 in, F32 grad, reduction NONE. */
static void form_exact(const float *z, int64_t V, int64_t t, float *nll, float *grad) {
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    o.reduction = XENT_REDUCE_NONE;
    o.threads = 1;
    int64_t label = t;
    xent_ce_input in = {z, XENT_F32, 1, V, 0, &label, XENT_I64, NULL};
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    float n = NAN;
    out.nll = &n;
    out.grad = grad;
    out.grad_dtype = XENT_F32;
    if (xent_ce(&in, &o, &out) != XENT_OK) {
        n = NAN;
        if (grad) for (int64_t j = 0; j < V; j++) grad[j] = NAN;
    }
    *nll = n;
}

void xent__ce_form_row(xent_ce_form form, const float *z, int64_t V, int64_t t,
                       float *nll, float *grad) {
    switch (form) {
    case XENT_CE_EXACT: form_exact(z, V, t, nll, grad); return;
    case XENT_CE_FP32_NAIVE: form_fp32(z, V, t, nll, grad); return;
    case XENT_CE_BF16_LSE: form_bf16_lse(z, V, t, nll, grad); return;
    case XENT_CE_BF16_PROBS: form_probs(z, V, t, XENT_BF16, nll, grad); return;
    case XENT_CE_F16_PROBS: form_probs(z, V, t, XENT_F16, nll, grad); return;
    case XENT_CE_BF16_LOGSOFTMAX: form_bf16_logsoftmax(z, V, t, nll, grad); return;
    default:
        *nll = NAN;
        if (grad) for (int64_t j = 0; j < V; j++) grad[j] = NAN;
    }
}

/* ---- sweep rows --------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t r = (*x += 0x9E3779B97F4A7C15ull);
    r = (r ^ (r >> 30)) * 0xBF58476D1CE4E5B9ull;
    r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
    return r ^ (r >> 31);
}

/* uniform in (0, 1), 53 bits */
static double unit_open(uint64_t *x) {
    return ((double)(splitmix64(x) >> 11) + 0.5) * 0x1.0p-53;
}

int xent__sweep_gen_init(xent__sweep_gen *g, int64_t V, int64_t t,
                         xent_dtype dtype, double scale, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->noise = malloc((size_t)(V > 0 ? V : 1) * sizeof *g->noise);
    if (!g->noise) return -1;
    uint64_t st = seed ^ 0x5EEDC0DE12345678ull;
    g->V = V;
    g->t = t >= 0 && t < V ? t : (int64_t)(splitmix64(&st) % (uint64_t)V);
    g->dtype = dtype;
    /* Box-Muller, both outputs used */
    for (int64_t j = 0; j < V; j += 2) {
        double r = sqrt(-2.0 * log(unit_open(&st))), a = 2.0 * M_PI * unit_open(&st);
        g->noise[j] = scale * r * cos(a);
        if (j + 1 < V) g->noise[j + 1] = scale * r * sin(a);
    }
    g->noise[g->t] = 0.0;
    long double mx = -INFINITY, s = 0.0L;
    for (int64_t j = 0; j < V; j++)
        if (j != g->t && g->noise[j] > mx) mx = g->noise[j];
    for (int64_t j = 0; j < V; j++)
        if (j != g->t) s += expl((long double)g->noise[j] - mx);
    g->noise_lse = V > 1 ? mx + logl(s) : -INFINITY;
    return 0;
}

void xent__sweep_gen_free(xent__sweep_gen *g) {
    free(g->noise);
    g->noise = NULL;
}

/* d rounded to float with round-to-odd: rounding that to a format with at
 * least 2 bits fewer (bf16) to nearest gives d correctly rounded. */
static inline float f32_round_odd(double d) {
    float f = (float)d;
    if ((double)f == d || f != f || isinf(f)) return f;
    if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

static float round_in(double x, xent_dtype t) {
    if (t == XENT_BF16) return rbf16(f32_round_odd(x));
    if (t == XENT_F16) return xent_f16_to_f32(xent_f64_to_f16(x));
    return (float)x;
}

void xent__sweep_row(const xent__sweep_gen *g, double base, double margin,
                     float *z /* [V] */) {
    double shift = (double)((long double)base - margin - g->noise_lse);
    for (int64_t j = 0; j < g->V; j++) z[j] = round_in(shift + g->noise[j], g->dtype);
    z[g->t] = round_in(base, g->dtype);
}

/* ---- oracle --------------------------------------------------------------- */

static long double softplusl(long double d) {
    return d > 0 ? d + log1pl(expl(-d)) : log1pl(expl(d));
}

void xent__ce_oracle_row(const float *z, int64_t V, int64_t t, xent__ce_oracle *o) {
    long double mx = -INFINITY, s = 0.0L;
    for (int64_t j = 0; j < V; j++)
        if (j != t && z[j] > mx) mx = z[j];
    for (int64_t j = 0; j < V; j++)
        if (j != t) s += expl((long double)z[j] - mx);
    long double lse_nt = V > 1 ? mx + logl(s) : -INFINITY;
    long double zt = z[t];
    o->margin = zt - lse_nt;
    o->nll = softplusl(lse_nt - zt);
    o->lse = zt + o->nll;
    o->grad_t = -1.0L / (1.0L + expl(o->margin));
}

/* ---- thresholds ------------------------------------------------------------ */

/* 1 when the form's `which` output is exactly 0 on this row. */
static int form_is_zero(xent_ce_form form, int which, const float *z, int64_t V,
                        int64_t t, float *grad /* [V] scratch */) {
    float nll;
    xent__ce_form_row(form, z, V, t, &nll, which == XENT__OUT_GRAD ? grad : NULL);
    return which == XENT__OUT_GRAD ? grad[t] == 0.0f : nll == 0.0f;
}

int xent__ce_form_threshold(const xent__sweep_gen *g, xent_ce_form form,
                            int which, double base, double lo, double hi,
                            double tol, double *margin, double *actual) {
    int64_t V = g->V;
    float *z = malloc((size_t)V * sizeof *z);    /* [V] */
    float *gr = malloc((size_t)V * sizeof *gr);  /* [V] */
    int rc = -1;
    if (!z || !gr) goto done;
    xent__sweep_row(g, base, lo, z);
    if (form_is_zero(form, which, z, V, g->t, gr)) { *margin = lo; rc = 0; goto oracle; }
    xent__sweep_row(g, base, hi, z);
    if (!form_is_zero(form, which, z, V, g->t, gr)) { *margin = INFINITY; rc = 0; goto done; }
    while (hi - lo > tol) {
        double mid = 0.5 * (lo + hi);
        xent__sweep_row(g, base, mid, z);
        if (form_is_zero(form, which, z, V, g->t, gr)) hi = mid;
        else lo = mid;
    }
    *margin = hi;
    rc = 1;
oracle:;
    xent__ce_oracle o;
    xent__sweep_row(g, base, *margin, z);
    xent__ce_oracle_row(z, V, g->t, &o);
    *actual = (double)o.margin;
done:
    if (rc == 0 && isinf(*margin)) *actual = INFINITY;
    free(z);
    free(gr);
    return rc;
}

/* ---- predicted thresholds ----------------------------------------------------
 * On a sweep row the target holds the max (m > ~-7), so every form computes
 * max = z_t and a stored sum S = fl(1 + s), s = sum_{j!=t} e^(z_j - z_t) =
 * e^-m, p_t = 1 / (1 + s).
 *  fp32      nll = fl(fl(z_t + logf(S)) - z_t). S = 1 + k 2^-23 with
 *            k = round(s / 2^-23); nll = 0 while k <= K, K the largest k with
 *            fl(z_t + logf(1 + k 2^-23)) = z_t (K = 0 for |z_t| < 2). So 0
 *            once s <= (K + 1/2) 2^-23: for z_t = 0, m >= 24 ln 2 = 16.636.
 *            grad_t = expf(z_t - lse) - 1 is 0 exactly when lse = z_t.
 *  bf16_lse  nll = bf16(lse) - z_t: 0 once the fp32 lse is z_t (above), or
 *            once lse - z_t = log(1 + s) <= h, h = half the bf16 gap above
 *            z_t (z_t a bf16 value): s <= e^h - 1, p_t >= e^-h. For z_t in
 *            [8,16) h = 1/32: p_t >= 0.96923 (m >= 3.4497); [16,32) 0.93941;
 *            [32,64) 0.88250; [64,128) 0.77880. z_t = 0 has no such h.
 *  bf16_probs  bf16(p_t) = 1 once p_t >= 1 - 2^-9 (the midpoint between
 *            1 - 2^-8 and 1; the tie goes to the even 1): m >= ln 511 = 6.2364.
 *  f16_probs   fp16 spacing below 1 is 2^-11: p_t >= 1 - 2^-12, m >= ln 4095
 *            = 8.3178.
 *  bf16_logsoftmax  out_t = bf16((z_t - max) - bf16(logf(bf16(S)))) = 0 once
 *            bf16(1 + s) = 1, s <= 2^-8 (the tie goes to the even 1):
 *            m >= 8 ln 2 = 5.5452; grad_t = bf16(-1 + expf(out_t)) with it.
 *  exact     never. */

/* Half the gap from x to the next larger value of the format (F32/BF16). */
static double half_gap_up(float x, xent_dtype t) {
    if (t == XENT_BF16) {
        uint16_t b = xent_f32_to_bf16(x);
        uint16_t n = x > 0 ? (uint16_t)(b + 1) : (x < 0 ? (uint16_t)(b - 1) : 0x0001u);
        return 0.5 * ((double)xent_bf16_to_f32(n) - (double)x);
    }
    return 0.5 * ((double)nextafterf(x, INFINITY) - (double)x);
}

/* fp32 lse - z_t: the stored sum is 1 + k 2^-23 (k = round(s / 2^-23)), and
 * nll = fl(fl(z_t + logf(1 + k 2^-23)) - z_t) is 0 while k <= K; so nll is
 * 0 once s < (K + 1/2) 2^-23 (ties to even keep k = K at the midpoint). */
static double predicted_fp32(float zt) {
    int64_t K = 0;
    for (int64_t k = 1; k < (1 << 22); k++) {
        float lse = zt + logf(1.0f + (float)k * 0x1.0p-23f);
        if (lse - zt != 0.0f) break;
        K = k;
    }
    return -log(((double)K + 0.5) * 0x1.0p-23);
}

double xent__ce_form_predicted(xent_ce_form form, int which, float zt) {
    switch (form) {
    case XENT_CE_FP32_NAIVE:
        return predicted_fp32(zt);
    case XENT_CE_BF16_PROBS: /* p_t >= 1 - 2^-9 rounds to 1 in bf16 */
        return which == XENT__OUT_GRAD ? log(511.0) : predicted_fp32(zt);
    case XENT_CE_F16_PROBS: /* p_t >= 1 - 2^-12 rounds to 1 in fp16 */
        return which == XENT__OUT_GRAD ? log(4095.0) : predicted_fp32(zt);
    case XENT_CE_BF16_LSE: {
        /* the fp32 lse may already equal z_t (fp32 threshold); else
         * bf16(lse) == z_t once log(1 + s) <= h, h = half the bf16 gap above
         * z_t: s <= e^h - 1, i.e. p_t >= e^-h. z_t must be a bf16 value. */
        double m32 = predicted_fp32(zt); /* the fp32 lse is already z_t */
        if (zt == 0.0f || rbf16(zt) != zt) return m32;
        double m16 = -log(expm1(half_gap_up(zt, XENT_BF16)));
        return m16 < m32 ? m16 : m32;
    }
    case XENT_CE_BF16_LOGSOFTMAX: /* bf16(1 + s) == 1 once s <= 2^-8 */
        return 8.0 * log(2.0);
    default:
        return INFINITY;
    }
}
