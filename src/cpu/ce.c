/* src/cpu/ce.c: exact cross-entropy, log-probabilities and gradients on the
 * CPU. The contract is include/xent.h; the error analysis is
 * docs/numerics.md ("CPU kernel"). In short: every quantity is formed in
 * double from the exactly converted inputs, the loss of a confident row is
 * computed as softplus(lse_{j!=t} - z'_t) and its target gradient as
 * expm1(-nll), so nothing cancels, and each output is rounded once, at the
 * store. All outputs are faithfully rounded (within 1 ulp), for every finite
 * input up to the largest finite value of its format: rows whose |z'|
 * exceeds 2^11 form every difference relative to the row's max
 * (docs/numerics.md, "Huge logits").
 *
 * Per row (one thread owns a row; rows never interact, so results are
 * bitwise independent of T, the row's position and the thread count):
 *   pass 1  max of the raw logits over the non-target columns  (+ NaN/inf)
 *   pass 2  S = sum_{j!=t} exp(z'_j - M), SX = sum e (z'_j - M), sum z'_j
 *   combine d = (M - z'_t) + log S; nll = softplus(d); lse = z'_t + nll
 *   pass 3  gradient (when asked), one read and one store per element
 * A vocabulary shard runs passes 1-2 on its columns; xent_ce_combine merges
 * the shards' partials; the unsharded call is the case S = 1.
 *
 * The hot loops (passes 1-3 without a softcap, and the stores) go through a
 * table of functions per instruction set (src/cpu/ce_kern.h), chosen once
 * from cpuid and forceable with xent_cpu_set_isa(); all give the same bits. */
#include "cpu/ce_kern.h"

#include <stdatomic.h>
#include <stdlib.h>

#define BLOCK XENT__BLOCK /* columns converted at a time                    */
#define ROW_BLOCK 16      /* rows per unit of work (and of the loss sum)      */
/* Rows whose shift M or target z'_t exceed this in magnitude use the forms
 * of docs/numerics.md "Huge logits"; below it the historical forms (whose
 * bits the golden test records) are within the bound. */
#define BIG 2048.0

typedef xent__sums8 sums8;
#define exp_kernel xent__exp_kernel

/* ------------------------------------------------------------------------ */
/* Instruction-set dispatch                                                  */
/* ------------------------------------------------------------------------ */

static const xent__cpu_kern *kern_of(xent_isa isa) {
    switch (isa) {
    case XENT_ISA_BASELINE: return &xent__kern_base;
#ifdef XENT__HAVE_X86_PATHS
    case XENT_ISA_AVX2: return &xent__kern_avx2;
    case XENT_ISA_AVX512: return &xent__kern_avx512;
#endif
    default: return NULL;
    }
}

int xent_cpu_isa_supported(xent_isa isa) {
    switch (isa) {
    case XENT_ISA_AUTO:
    case XENT_ISA_BASELINE: return 1;
#ifdef XENT__HAVE_X86_PATHS
    case XENT_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
    case XENT_ISA_AVX512:
        __builtin_cpu_init();
        return xent_cpu_isa_supported(XENT_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw");
#endif
    default: return 0;
    }
}

const char *xent_isa_name(xent_isa isa) {
    switch (isa) {
    case XENT_ISA_AUTO: return "auto";
    case XENT_ISA_BASELINE: return "baseline";
    case XENT_ISA_AVX2: return "avx2";
    case XENT_ISA_AVX512: return "avx512";
    default: return "invalid";
    }
}

static xent_isa best_isa(void) {
#ifdef XENT_NO_SIMD /* the sanitizer build: the generic loops by default */
    return XENT_ISA_BASELINE;
#endif
    if (xent_cpu_isa_supported(XENT_ISA_AVX512)) return XENT_ISA_AVX512;
    if (xent_cpu_isa_supported(XENT_ISA_AVX2)) return XENT_ISA_AVX2;
    return XENT_ISA_BASELINE;
}

/* 0: not chosen yet; else the xent_isa in use */
static _Atomic int g_isa;

xent_isa xent_cpu_isa(void) {
    int v = atomic_load_explicit(&g_isa, memory_order_acquire);
    if (v == 0) {
        int want = (int)best_isa(), zero = 0;
        atomic_compare_exchange_strong(&g_isa, &zero, want);
        v = atomic_load(&g_isa);
    }
    return (xent_isa)v;
}

xent_status xent_cpu_set_isa(xent_isa isa) {
    if (isa == XENT_ISA_AUTO) isa = best_isa();
    if (!kern_of(isa))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "CPU path %s (%d) is not built for this architecture",
                              xent_isa_name(isa), (int)isa);
    if (!xent_cpu_isa_supported(isa))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "this CPU lacks the instructions of the %s path",
                              xent_isa_name(isa));
    atomic_store(&g_isa, (int)isa);
    return XENT_OK;
}

const xent__cpu_kern *xent__cpu_kern_get(void) { return kern_of(xent_cpu_isa()); }

/* ------------------------------------------------------------------------ */
/* The logit transform z' = cap(z) / tau, and its derivative                 */
/* ------------------------------------------------------------------------ */

typedef struct {
    int has_cap;
    double cap, inv_cap, inv_tau;
} xform;

static xform xform_make(const xent_ce_opts *o) {
    xform x;
    x.has_cap = o->softcap > 0;
    x.cap = o->softcap;
    x.inv_cap = x.has_cap ? 1.0 / o->softcap : 0;
    x.inv_tau = 1.0 / o->temperature;
    return x;
}

/* tanh(y) and sech^2(y) from one exp: with e = exp(-2|y|),
 * tanh|y| = (1 - e) / (1 + e), sech^2 y = 4e / (1 + e)^2. The absolute
 * error of tanh is below 2^-51, which is what matters downstream: z'
 * enters only through exp(z' - lse). */
static inline double xform_apply(const xform *x, double z, int has_cap) {
    if (!has_cap) return z * x->inv_tau;
    double y = z * x->inv_cap;
    double e = xent__exp(-2.0 * fabs(y));
    double t = (1.0 - e) / (1.0 + e);
    return copysign(t, y) * x->cap * x->inv_tau;
}

static inline double xform_slope(const xform *x, double z, int has_cap) {
    if (!has_cap) return x->inv_tau;
    double e = xent__exp(-2.0 * fabs(z * x->inv_cap));
    double q = 1.0 + e;
    return 4.0 * e / (q * q) * x->inv_tau;
}

/* ------------------------------------------------------------------------ */
/* Row loads and gradient stores                                             */
/* ------------------------------------------------------------------------ */

/* buf[i] = row[j0 + i] as fp32 (exact), i in [0, n). */
static void load_block(const void *row, xent_dtype dt, int64_t j0, int64_t n,
                       float *buf /* [n] */) {
    if (dt == XENT_F32) {
        memcpy(buf, (const float *)row + j0, (size_t)n * sizeof(float));
    } else if (dt == XENT_BF16) {
        const uint16_t *h = (const uint16_t *)row + j0;
        for (int64_t i = 0; i < n; i++) buf[i] = xent__bf16_f32(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)row + j0;
        for (int64_t i = 0; i < n; i++) buf[i] = xent__f16_f32(h[i]);
    }
}

/* double -> float rounded to odd: the float result of rounding to nearest,
 * moved one step toward zero if that rounding went away from zero, and with
 * its last bit set when inexact. Rounding this to a narrower format (bf16,
 * fp16: at least two bits fewer) to nearest gives the correctly rounded
 * narrow value of g: no double rounding. */
/* ------------------------------------------------------------------------ */
/* Passes 1 and 2 over one row (or one shard of it)                          */
/* ------------------------------------------------------------------------ */

typedef struct {
    double g;     /* row scale: upstream gradient (0: write zeros)          */
    double a;     /* 1 + 2 k lse                                            */
    double b;     /* eps / vocab_total                                      */
    double lse;
    double tgrad; /* dL/dz'_t / g: expm1(-nll) + 2k lse p_t + eps(1 - 1/V)  */
    double M;     /* the shift of pass 2: z'(max of the non-target columns)  */
    double s;     /* exp(M - lse): p_j = exp(z'_j - M) s                     */
} grad_row_params;

/* Pass 2 with a softcap on buf[a, b) (generic code only): lane sums of
 * e = exp(z' - M) over the columns below the max, the count of columns at
 * the max (e = 1 exactly), e (z' - M) and z'. Keeping the max's 1 apart
 * gives S - 1 without cancellation, and so log S = log1p(S - 1) to full
 * relative accuracy when S is close to 1. Eight lanes, always combined in
 * the same order (the lanes of ce_kern.h's sum_range). */
static void sum_range_cap(const float *buf, int64_t a, int64_t b, const xform *x,
                          double M, sums8 *acc, double *eo) {
    int64_t i = a;
    for (; i + 8 <= b; i += 8) {
        for (int k = 0; k < 8; k++) {
            double zp = xform_apply(x, (double)buf[i + k], 1);
            double d = zp - M;
            double e = exp_kernel(d);
            if (eo) eo[i + k] = e;
            int top = d == 0;
            acc->s[k] += top ? 0.0 : e;
            acc->n[k] += top;
            acc->sx[k] += e * d;
            acc->z[k] += zp;
        }
    }
    for (int k = 0; i < b; i++, k++) {
        double zp = xform_apply(x, (double)buf[i], 1);
        double d = zp - M;
        double e = exp_kernel(d);
        if (eo) eo[i] = e;
        int top = d == 0;
        acc->s[k] += top ? 0.0 : e;
        acc->n[k] += top;
        acc->sx[k] += e * d;
        acc->z[k] += zp;
    }
}

/* Asks for columns [j0, j0 + n) of the next row while this one is computed
 * (its pass 1 then reads from cache, not memory; no effect on any value). */
static inline void prefetch_block(const void *pf, int64_t j0, int64_t n, size_t esz) {
    const char *p = (const char *)pf + (size_t)j0 * esz;
    for (size_t o = 0; o < (size_t)n * esz; o += 64) __builtin_prefetch(p + o, 0, 2);
}

/* Pass 2 over the whole row, in blocks of BLOCK columns (the lanes restart
 * at each block and around the target). */
static void sum_row(const xent__cpu_kern *K, const void *row, xent_dtype dt, int64_t V,
                    int64_t tl, const xform *x, const xent__shift *sh, int need, sums8 *acc,
                    double *ebuf /* [V] or NULL */, float *ebuf_f /* [V] or NULL */,
                    const void *pf /* the next row, to prefetch, or NULL */) {
    float buf[BLOCK];
    size_t esz = xent_dtype_size(dt);
    for (int64_t j0 = 0; j0 < V; j0 += BLOCK) {
        int64_t n = V - j0 < BLOCK ? V - j0 : BLOCK;
        int64_t t = tl - j0;
        double *eo = ebuf ? ebuf + j0 : NULL;
        if (pf) prefetch_block(pf, j0, n, esz);
        if (!x->has_cap) {
            const void *src = (const char *)row + (size_t)j0 * esz;
            float *ef = ebuf_f ? ebuf_f + j0 : NULL;
            if (t >= 0 && t < n) {
                K->sum_range(src, dt, 0, t, sh, need, acc, eo, ef);
                K->sum_range(src, dt, t + 1, n, sh, need, acc, eo, ef);
            } else {
                K->sum_range(src, dt, 0, n, sh, need, acc, eo, ef);
            }
            continue;
        }
        load_block(row, dt, j0, n, buf);
        if (t >= 0 && t < n) {
            sum_range_cap(buf, 0, t, x, sh->M, acc, eo);
            sum_range_cap(buf, t + 1, n, x, sh->M, acc, eo);
        } else {
            sum_range_cap(buf, 0, n, x, sh->M, acc, eo);
        }
    }
}

static double lanes_total(const double *v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* Pass 1 over the row: max of the raw non-target logits, the NaN/inf flag
 * (any column, the target included) and the target's raw value. */
static void row_max(const xent__cpu_kern *K, const void *row, xent_dtype dt, int64_t V,
                    int64_t tl, float *m_out, float *bad_out, double *target_out) {
    float m = -INFINITY, bad = 0.0f;
    double target = 0;
    if (tl >= 0) {
        float v = xent__load(row, dt, tl);
        target = v;
        bad += v - v;
    }
    if (tl < 0) {
        K->max_range(row, dt, 0, V, &m, &bad);
    } else {
        K->max_range(row, dt, 0, tl, &m, &bad);
        K->max_range(row, dt, tl + 1, V, &m, &bad);
    }
    /* the sign of a zero max depends on the order of the comparisons:
     * make it +0 on every path */
    *m_out = m == 0.0f ? 0.0f : m;
    *bad_out = bad;
    *target_out = target;
}

/* The shift M of pass 2 for a raw max m (0 when there is no column). */
static inline double shift_of(const xform *x, float m) {
    return m == -INFINITY ? 0.0 : xform_apply(x, m, x->has_cap);
}

/* The per-element argument of exp for a row whose raw max is m: relative
 * to m when the row is huge (|M| > BIG) and has no softcap. */
static inline xent__shift shift_make(const xform *x, float m) {
    xent__shift sh;
    sh.inv_tau = x->inv_tau;
    sh.M = shift_of(x, m);
    sh.m = m;
    sh.rel = !x->has_cap && m != -INFINITY && !(fabs(sh.M) <= BIG);
    return sh;
}

/* Passes 1 and 2: the row's partial statistics. ebuf [V] (or NULL)
 * receives exp(z'_j - M) of every non-target column (0 at the target) when
 * the row is finite, for the gradient pass to reuse. *zrel (if not NULL)
 * receives sum_{j != t} (z'_j - M) formed without cancellation when the row
 * is huge (sh.rel), else NaN; the public zsum is the raw sum of z'. */
static void row_partial(const xent__cpu_kern *K, const void *row, xent_dtype dt, int64_t V,
                        int64_t tl, const xform *x, int need, xent_ce_partial *p, double *ebuf,
                        float *ebuf_f, double *zrel, const void *pf) {
    float m, bad;
    double target;
    row_max(K, row, dt, V, tl, &m, &bad, &target);
    xent__shift sh = shift_make(x, m);
    sums8 acc;
    memset(&acc, 0, sizeof acc);
    double zt = 0;
    if (ebuf && tl >= 0) ebuf[tl] = 0;
    if (ebuf_f && tl >= 0) ebuf_f[tl] = 0;
    if (m != -INFINITY && bad == 0.0f) sum_row(K, row, dt, V, tl, x, &sh, need, &acc, ebuf, ebuf_f, pf);
    if (tl >= 0) zt = xform_apply(x, target, x->has_cap);
    p->max = m;
    /* S - 1: at least one column sits at the max when it is finite */
    p->sum = m == -INFINITY ? 0.0 : lanes_total(acc.s) + (lanes_total(acc.n) - 1.0);
    p->sumx = lanes_total(acc.sx);
    double zl = lanes_total(acc.z);
    if (!sh.rel) {
        p->zsum = zl + zt;
        if (zrel) *zrel = NAN;
    } else {
        /* the public field is the raw sum: add the shift back */
        double cols = bad == 0.0f ? (double)(V - (tl >= 0)) : 0.0;
        p->zsum = (zl + cols * sh.M) + zt;
        if (zrel) *zrel = zl;
    }
    p->target = target;
    p->flags = (tl >= 0 ? 1 : 0) | (bad != 0.0f ? 2 : 0);
}

/* ------------------------------------------------------------------------ */
/* Combine: partials of S shards -> the row's outputs                        */
/* ------------------------------------------------------------------------ */

typedef struct {
    double lse, nll, entropy, loss;
    double L;  /* lse - M >= 0, formed from non-negative terms              */
    int big;   /* huge row: the gradient's scale is exp(-L), not exp(M-lse) */
    int nonfinite;
} row_result;

static inline double softplus(double d) {
    return d > 0 ? d + log1p(exp(-d)) : log1p(exp(d));
}

/* Whether a counted row (shift M, target z'_t) or an ignored row (zt
 * unused) takes the huge-row forms. The backward from saved statistics
 * decides with the same test. */
static inline int row_is_big(double M, int counted_owner, double zt) {
    if (M == -INFINITY) return 0;
    return !(fabs(M) <= BIG) || (counted_owner && !(fabs(zt) <= BIG));
}

/* parts[k * stride] for k in [0, S): the same row in each shard. zrel: the
 * unsharded call's relative sum (row_partial), NaN or ignored otherwise. */
static row_result combine_row(const xent_ce_partial *parts, int S,
                              int64_t stride, int counted, const xform *x,
                              double vocab_total, double eps, double kz, double zrel) {
    row_result r;
    memset(&r, 0, sizeof r);
    double M = -INFINITY, Mraw = -INFINITY, target = 0;
    int owners = 0;
    for (int k = 0; k < S; k++) {
        const xent_ce_partial *p = &parts[k * stride];
        if (p->flags & 2) r.nonfinite = 1;
        if (p->flags & 1) { target = p->target; owners++; }
        if (p->max != -INFINITY) {
            double mk = xform_apply(x, p->max, x->has_cap);
            if (mk > M || (mk == M && p->max > Mraw)) { M = mk; Mraw = p->max; }
        }
    }
    if (r.nonfinite) { /* an ignored row still contributes no loss */
        r.lse = r.entropy = r.L = NAN;
        r.nll = r.loss = counted ? NAN : 0.0;
        return r;
    }
    /* huge rows without a softcap: differences of z' from the raw values */
    int rel = !x->has_cap && M != -INFINITY && !(fabs(M) <= BIG);
    /* Sm1 = S - 1, S = sum_{j != t} exp(z'_j - M): the shard(s) at M bring
     * their own S_k - 1, the others w_k S_k, all terms >= 0. */
    double top = 0, rest = 0, SX = 0, Z = 0;
    int have_top = 0;
    for (int k = 0; k < S; k++) {
        const xent_ce_partial *p = &parts[k * stride];
        Z += p->zsum;
        if (p->max == -INFINITY) continue;
        double off = rel ? (p->max - Mraw) * x->inv_tau
                         : xform_apply(x, p->max, x->has_cap) - M; /* <= 0 */
        double w = exp(off);
        if (off == 0 && !have_top) { top = p->sum; have_top = 1; }
        else rest += w * (p->sum + 1.0);
        SX += w * (p->sumx + off * (p->sum + 1.0));
    }
    double Sm1 = have_top ? top + rest : -1.0;
    double Ssum = Sm1 + 1.0;
    /* L = lse - M >= 0 is formed from non-negative terms, so the entropy
     * sum_{j != t} p_j (lse - z'_j) = e^-L (L S - SX) (both terms >= 0, SX
     * <= 0) keeps its relative accuracy even when it is tiny. */
    double L;
    if (counted && owners) {
        double zt = xform_apply(x, target, x->has_cap);
        double logS = Ssum > 0 ? log1p(Sm1) : -INFINITY;
        double dm = rel ? (Mraw - target) * x->inv_tau : M - zt;
        double d = dm + logS; /* lse_{j!=t} - z'_t */
        r.nll = softplus(d);
        L = logS + softplus(-d);
        r.big = row_is_big(M, 1, zt);
        /* lse = z'_t + nll = M + L: the first cancels when z'_t << M */
        r.lse = (!r.big || d <= 0) ? zt + r.nll : M + L;
        double nontarget_h = Ssum > 0 ? exp(-L) * (L * Ssum - SX) : 0.0;
        r.entropy = nontarget_h + exp(-r.nll) * r.nll;
        /* lse - mean z' = (sum_j (lse - z'_j)) / V; in a huge row, from
         * L = lse - M, z'_t - M = -dm and the relative sum zrel */
        double lz = (r.big && zrel == zrel) ? (L + dm / vocab_total) - zrel / vocab_total
                                            : r.lse - Z / vocab_total;
        r.loss = (1.0 - eps) * r.nll + eps * lz + kz * r.lse * r.lse;
    } else {
        L = log1p(Sm1);
        r.lse = M + L;
        r.nll = 0;
        r.entropy = L - SX / Ssum;
        r.loss = 0;
        r.big = row_is_big(M, 0, 0);
    }
    r.L = L;
    return r;
}

/* ------------------------------------------------------------------------ */
/* Pass 3: the gradient of one row (or shard)                                */
/* ------------------------------------------------------------------------ */

/* The scale c of the fp32 gradient path (docs/numerics.md, "The fp32
 * gradient path"), or 0 when the row takes the fp64 path: the path needs a
 * narrow gradient (bf16/fp16), no softcap (c_j constant), no label
 * smoothing (nothing cancels) and 2^-126 <= |c| <= 1 with
 * c = g/tau ((1 + 2k lse) s), so that fp32 products stay normal or lose
 * at most 2^-150 absolutely. */
static float grad_f32_scale(const xform *x, const grad_row_params *gp, xent_dtype gt) {
    if (gt == XENT_F32 || x->has_cap || gp->b != 0.0) return 0.0f;
    double c = (gp->g * x->inv_tau) * (gp->a * gp->s);
    return fabs(c) >= 0x1p-126 && fabs(c) <= 1.0 ? (float)c : 0.0f;
}

/* Whether the forward should keep pass 2's exponentials as floats (the
 * fp32 gradient path) rather than doubles. */
static int grad_keeps_f32(const xform *x, double eps, xent_dtype gt) {
    return gt != XENT_F32 && !x->has_cap && eps == 0.0;
}

static void grad_row(const xent__cpu_kern *K, const void *row, xent_dtype dt, int64_t V,
                     int64_t tl, const xform *x, const grad_row_params *gp,
                     const xent__shift *sh, const double *ebuf, const float *ebuf_f,
                     void *grow, xent_dtype gt, const void *pf /* next row or NULL */,
                     int nt /* streaming stores (kernel tables) */) {
    float buf[BLOCK], efb[BLOCK];
    double val[BLOCK], eblk[BLOCK];
    size_t esz = xent_dtype_size(dt), gsz = xent_dtype_size(gt);
    float c32 = gp->g == 0 ? 0.0f : grad_f32_scale(x, gp, gt);
    for (int64_t j0 = 0; j0 < V; j0 += BLOCK) {
        int64_t n = V - j0 < BLOCK ? V - j0 : BLOCK;
        int64_t t = tl - j0;
        void *gout = (char *)grow + (size_t)j0 * gsz;
        if (pf) prefetch_block(pf, j0, n, esz);
        if (gp->g == 0) {
            memset(val, 0, (size_t)n * sizeof(double));
            K->store(gout, gt, val, n);
            continue;
        }
        /* e_j = exp(z'_j - M): from pass 2's buffer, or computed the same
         * way (backward from saved statistics); p_j = e_j s. */
        const void *src = (const char *)row + (size_t)j0 * esz;
        if (x->has_cap) {
            const double *e = ebuf ? ebuf + j0 : eblk;
            load_block(row, dt, j0, n, buf);
            if (!ebuf)
                for (int64_t i = 0; i < n; i++)
                    eblk[i] = exp_kernel(xform_apply(x, buf[i], 1) - gp->M);
            for (int64_t i = 0; i < n; i++) {
                double c = xform_slope(x, buf[i], 1);
                val[i] = gp->g * c * (gp->a * (e[i] * gp->s) - gp->b);
            }
            if (t >= 0 && t < n)
                val[t] = gp->g * xform_slope(x, xent__load(row, dt, tl), 1) * gp->tgrad;
            K->store(gout, gt, val, n);
            continue;
        }
        if (c32 != 0.0f) {
            const float *ef = ebuf_f ? ebuf_f + j0 : efb;
            if (!ebuf_f) {
                K->exp_block(src, dt, n, sh, eblk);
                for (int64_t i = 0; i < n; i++) efb[i] = (float)eblk[i];
            }
            K->grad_f32(ef, n, c32, gout, gt, nt);
        } else {
            const double *e = ebuf ? ebuf + j0 : eblk;
            if (!ebuf) K->exp_block(src, dt, n, sh, eblk);
            K->grad_store(e, n, gp->g * x->inv_tau, gp->s, gp->a, gp->b, gout, gt, nt);
        }
        if (t >= 0 && t < n) {
            double vt = gp->g * x->inv_tau * gp->tgrad;
            K->store((char *)gout + (size_t)t * gsz, gt, &vt, 1);
        }
    }
}

/* s = exp(M - lse) (normal rows) or exp(-L) (huge rows: M - lse would lose
 * everything to the rounding of lse) */
static grad_row_params grad_params(const xent_ce_stats *st, int counted,
                                   double g, double kz, double eps,
                                   double vocab_total, double M, double s) {
    grad_row_params gp;
    gp.M = M;
    gp.s = s;
    gp.g = counted ? g : 0.0;
    gp.lse = st->lse;
    gp.a = 1.0 + 2.0 * kz * st->lse;
    gp.b = eps / vocab_total;
    double pt = exp(-st->nll);
    /* (p_t - 1) + eps (1 - 1/V) written as (1 - eps)(p_t - 1) + eps (p_t - 1/V):
     * the first term is <= 0 and exact to relative u64, the second cancels
     * only within eps max(p_t, 1/V) u64 (docs/numerics.md) */
    gp.tgrad = (1.0 - eps) * expm1(-st->nll) + eps * (pt - 1.0 / vocab_total) +
               2.0 * kz * st->lse * pt;
    return gp;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

void xent_ce_opts_init(xent_ce_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->ignore_index = -100;
    o->reduction = XENT_REDUCE_MEAN;
    o->normalizer = 0;
    o->temperature = 1;
    o->softcap = 0;
    o->z_loss = 0;
    o->label_smoothing = 0;
    o->grad_scale = 1;
    o->vocab_start = 0;
    o->vocab_total = 0;
    o->threads = 0;
}

static int is_float_dtype(xent_dtype t) {
    return t == XENT_F32 || t == XENT_BF16 || t == XENT_F16;
}

xent_status xent__ce_check_opts(const xent_ce_opts *o, int64_t V) {
    if (!(isfinite(o->temperature) && o->temperature > 0))
        return xent_set_error(XENT_ERR_VALUE, "opts.temperature = %g must be finite and > 0", o->temperature);
    if (!(isfinite(o->softcap) && o->softcap >= 0))
        return xent_set_error(XENT_ERR_VALUE, "opts.softcap = %g must be finite and >= 0 (0 = off)", o->softcap);
    if (!(isfinite(o->z_loss) && o->z_loss >= 0))
        return xent_set_error(XENT_ERR_VALUE, "opts.z_loss = %g must be finite and >= 0", o->z_loss);
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1))
        return xent_set_error(XENT_ERR_VALUE, "opts.label_smoothing = %g must be in [0, 1]", o->label_smoothing);
    if (!(isfinite(o->normalizer) && o->normalizer >= 0))
        return xent_set_error(XENT_ERR_VALUE, "opts.normalizer = %g must be finite and >= 0 (0 = row count)", o->normalizer);
    if (!isfinite(o->grad_scale))
        return xent_set_error(XENT_ERR_VALUE, "opts.grad_scale = %g must be finite", o->grad_scale);
    if ((unsigned)o->reduction > XENT_REDUCE_MEAN)
        return xent_set_error(XENT_ERR_VALUE, "opts.reduction = %d is not one of NONE (0), SUM (1), MEAN (2)", (int)o->reduction);
    if (o->threads < 0)
        return xent_set_error(XENT_ERR_VALUE, "opts.threads = %d must be >= 0 (0 = all cores)", o->threads);
    if (o->vocab_start < 0)
        return xent_set_error(XENT_ERR_VALUE, "opts.vocab_start = %lld must be >= 0", (long long)o->vocab_start);
    if (o->vocab_total < 0)
        return xent_set_error(XENT_ERR_VALUE, "opts.vocab_total = %lld must be >= 0 (0 = V)", (long long)o->vocab_total);
    int64_t total = o->vocab_total ? o->vocab_total : V;
    if (o->vocab_start > total - V)
        return xent_set_error(XENT_ERR_SHAPE,
                          "shard [vocab_start = %lld, + V = %lld) exceeds opts.vocab_total = %lld",
                          (long long)o->vocab_start, (long long)V, (long long)total);
    return XENT_OK;
}

static int64_t vocab_total_of(const xent_ce_opts *o, int64_t V) {
    return o->vocab_total ? o->vocab_total : V;
}

static xent_status check_labels(const xent_ce_input *in, const xent_ce_opts *o,
                                int64_t total) {
    if (!in->labels) return XENT_OK;
    for (int64_t r = 0; r < in->T; r++) {
        int64_t t = xent__label(in->labels, in->label_dtype, r);
        if (t == o->ignore_index) continue;
        if (t < 0 || t >= total)
            return xent_set_error(XENT_ERR_LABEL,
                              "labels[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                              (long long)r, (long long)t, (long long)total, (long long)o->ignore_index);
    }
    return XENT_OK;
}

/* opts, or the defaults in *d when opts is NULL (every entry point). */
static const xent_ce_opts *opts_or_default(const xent_ce_opts *opts, xent_ce_opts *d) {
    if (opts) return opts;
    xent_ce_opts_init(d);
    return d;
}

/* Checks `in` and `opts` (not NULL: opts_or_default has run). */
static xent_status check_input(const xent_ce_input *in, const xent_ce_opts *o) {
    if (!in) return xent_set_error(XENT_ERR_NULL, "input is NULL");
    if (in->T < 0) return xent_set_error(XENT_ERR_SHAPE, "T = %lld must be >= 0", (long long)in->T);
    if (in->V <= 0) return xent_set_error(XENT_ERR_SHAPE, "V = %lld must be >= 1", (long long)in->V);
    if (in->ld != 0 && in->ld < in->V)
        return xent_set_error(XENT_ERR_SHAPE, "ld = %lld is smaller than V = %lld", (long long)in->ld, (long long)in->V);
    if (!is_float_dtype(in->dtype))
        return xent_set_error(XENT_ERR_DTYPE, "logits dtype %s is not supported (f32, bf16, f16)%s", xent_dtype_name(in->dtype),
                              in->dtype == XENT_F64 ? "; f64 logits go through xent_ce_f64" : "");
    if (in->T > 0 && !in->logits) return xent_set_error(XENT_ERR_NULL, "logits is NULL with T = %lld", (long long)in->T);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent_set_error(XENT_ERR_DTYPE, "labels dtype %s is not supported (i32, i64)", xent_dtype_name(in->label_dtype));
    if (in->grad_rows)
        for (int64_t r = 0; r < in->T; r++)
            if (!isfinite(in->grad_rows[r]))
                return xent_set_error(XENT_ERR_VALUE, "grad_rows[%lld] = %g is not finite", (long long)r, (double)in->grad_rows[r]);
    xent_status s = xent__ce_check_opts(o, in->V);
    if (s) return s;
    return check_labels(in, o, vocab_total_of(o, in->V));
}

static xent_status check_grad(const xent_ce_input *in, const void *grad,
                              xent_dtype gt, int64_t ld_grad) {
    if (!grad) return XENT_OK;
    if (!is_float_dtype(gt))
        return xent_set_error(XENT_ERR_DTYPE, "grad dtype %s is not supported (f32, bf16, f16)", xent_dtype_name(gt));
    if (ld_grad != 0 && ld_grad < in->V)
        return xent_set_error(XENT_ERR_SHAPE, "ld_grad = %lld is smaller than V = %lld", (long long)ld_grad, (long long)in->V);
    if (grad == in->logits) {
        int64_t ldl = in->ld ? in->ld : in->V, ldg = ld_grad ? ld_grad : in->V;
        if (gt != in->dtype || ldl != ldg)
            return xent_set_error(XENT_ERR_SHAPE,
                              "in-place gradient needs grad_dtype == logits dtype (%s vs %s) and equal row strides (%lld vs %lld)",
                              xent_dtype_name(gt), xent_dtype_name(in->dtype), (long long)ldg, (long long)ldl);
    }
    return XENT_OK;
}

/* ------------------------------------------------------------------------ */
/* The row loop                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
    const xent_ce_input *in;
    const xent_ce_opts *o;
    const xent__cpu_kern *kern; /* the instruction-set path of this call   */
    xform x;
    int64_t ld, ld_grad, total;
    double eps, kz, g_base; /* g_base: row scale for SUM/MEAN               */
    /* what to do */
    const xent_ce_stats *stats_in; /* backward only: saved stats             */
    const xent_ce_output *out;     /* forward outputs (may be NULL)          */
    void *grad;
    xent_dtype grad_dtype;
    xent_ce_partial *partial_out;  /* shard stats only                       */
    /* per row block: [nblocks] */
    double *block_loss;
    int64_t *block_counted, *block_nonfinite;
} job;

static int64_t target_of(const job *jb, int64_t r) {
    if (!jb->in->labels) return -1;
    int64_t t = xent__label(jb->in->labels, jb->in->label_dtype, r);
    return t == jb->o->ignore_index ? -1 : t;
}

static double row_scale(const job *jb, int64_t r) {
    if (jb->o->reduction != XENT_REDUCE_NONE) return jb->g_base;
    double g = jb->o->grad_scale;
    return jb->in->grad_rows ? g * (double)jb->in->grad_rows[r] : g;
}

static void write_row_outputs(const xent_ce_output *out, int64_t r,
                              const row_result *rr, int counted) {
    if (out->nll) out->nll[r] = (float)rr->nll;
    if (out->logprob) out->logprob[r] = (float)(-rr->nll) + 0.0f;
    if (out->lse) out->lse[r] = (float)rr->lse;
    if (out->entropy) out->entropy[r] = (float)rr->entropy;
    if (out->stats) {
        out->stats[r].lse = rr->lse;
        out->stats[r].nll = counted ? rr->nll : 0;
    }
}

static void run_rows(void *ctx, int64_t b0, int64_t b1) {
    job *jb = ctx;
    const xent_ce_input *in = jb->in;
    const xent__cpu_kern *K = jb->kern;
    size_t esz = xent_dtype_size(in->dtype), gsz = xent_dtype_size(jb->grad_dtype);
    int64_t v0 = jb->o->vocab_start;
    /* an unsharded backward can recompute a huge row's statistics */
    int whole = v0 == 0 && jb->total == in->V;
    /* [V] pass 2's exponentials, reused by the gradient pass; without it
     * (allocation failed) the gradient recomputes the same values */
    double *ebuf = NULL;
    float *ebuf_f = NULL;
    if (jb->grad && grad_keeps_f32(&jb->x, jb->eps, jb->grad_dtype))
        ebuf_f = malloc((size_t)in->V * sizeof(float));
    else if (jb->grad)
        ebuf = malloc((size_t)in->V * sizeof(double));
    /* the pass-2 sums the outputs need besides S */
    int need = (jb->out && jb->out->entropy ? XENT__NEED_SX : 0) | (jb->eps > 0 ? XENT__NEED_Z : 0);
    int64_t rend = b1 * ROW_BLOCK < in->T ? b1 * ROW_BLOCK : in->T; /* this call's rows end */
    /* a gradient of more than 64 MiB goes past the caches: streaming stores
     * save the read of each line before its write */
    int nt = (double)in->T * (double)in->V * (double)gsz > 64.0 * 1048576.0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * ROW_BLOCK, r1 = r0 + ROW_BLOCK < in->T ? r0 + ROW_BLOCK : in->T;
        double loss = 0;
        int64_t counted = 0, nonfinite = 0;
        for (int64_t r = r0; r < r1; r++) {
            const char *row = (const char *)in->logits + (size_t)r * (size_t)jb->ld * esz;
            /* the row this thread takes next: prefetched during the last
             * pass over this one (pass 3 with a gradient, else pass 2) */
            const char *next = r + 1 < rend ? row + (size_t)jb->ld * esz : NULL;
            int64_t t = target_of(jb, r);
            int64_t tl = (t >= v0 && t < v0 + in->V) ? t - v0 : -1;
            int is_counted = t >= 0;
            if (jb->partial_out) { /* shard statistics only */
                row_partial(K, row, in->dtype, in->V, tl, &jb->x, XENT__NEED_SX | XENT__NEED_Z,
                            &jb->partial_out[r], NULL, NULL, NULL, NULL);
                nonfinite += (jb->partial_out[r].flags & 2) != 0;
                counted += is_counted;
                continue;
            }
            xent_ce_stats st;
            float m = -INFINITY;
            const double *e = NULL;
            const float *ef = NULL;
            double s = 0;
            if (jb->stats_in) { /* backward from saved statistics */
                st = jb->stats_in[r];
                if (jb->grad && row_scale(jb, r) != 0 && is_counted) {
                    float bad;
                    double zt;
                    row_max(K, row, in->dtype, in->V, tl, &m, &bad, &zt);
                    double M = shift_of(&jb->x, m);
                    int big = row_is_big(M, tl >= 0, xform_apply(&jb->x, zt, jb->x.has_cap)) ||
                              (M != -INFINITY && !(fabs(st.lse) <= BIG));
                    if (big && whole && bad == 0.0f) {
                        /* lse - M is lost to the rounding of lse: recompute
                         * the row's statistics as the forward does */
                        xent_ce_partial p;
                        double zr;
                        row_partial(K, row, in->dtype, in->V, tl, &jb->x, 0, &p, ebuf, ebuf_f, &zr, NULL);
                        row_result rr = combine_row(&p, 1, 1, is_counted, &jb->x,
                                                    (double)jb->total, jb->eps, jb->kz, zr);
                        e = ebuf;
                        ef = ebuf_f;
                        st.lse = rr.lse;
                        st.nll = rr.nll;
                        s = rr.big ? exp(-rr.L) : exp(M - st.lse);
                    } else {
                        s = exp(M - st.lse);
                    }
                }
            } else {
                xent_ce_partial p;
                double zr;
                row_partial(K, row, in->dtype, in->V, tl, &jb->x, need, &p, ebuf, ebuf_f, &zr,
                            jb->grad ? NULL : next);
                m = (float)p.max;
                e = (p.flags & 2) ? NULL : ebuf;
                ef = (p.flags & 2) ? NULL : ebuf_f;
                row_result rr = combine_row(&p, 1, 1, is_counted, &jb->x,
                                            (double)jb->total, jb->eps, jb->kz, zr);
                write_row_outputs(jb->out, r, &rr, is_counted);
                if (jb->out->loss && jb->o->reduction == XENT_REDUCE_NONE)
                    jb->out->loss[r] = (float)rr.loss;
                loss += rr.loss;
                nonfinite += rr.nonfinite;
                st.lse = rr.lse;
                st.nll = rr.nll;
                s = rr.big ? exp(-rr.L) : exp(shift_of(&jb->x, m) - rr.lse);
            }
            counted += is_counted;
            if (jb->grad) {
                xent__shift sh = shift_make(&jb->x, m);
                grad_row_params gp = grad_params(&st, is_counted, row_scale(jb, r), jb->kz,
                                                 jb->eps, (double)jb->total, sh.M, s);
                char *grow = (char *)jb->grad + (size_t)r * (size_t)jb->ld_grad * gsz;
                grad_row(K, row, in->dtype, in->V, tl, &jb->x, &gp, &sh, e, ef, grow, jb->grad_dtype, next,
                         nt);
            }
        }
        jb->block_loss[b] = loss;
        jb->block_counted[b] = counted;
        jb->block_nonfinite[b] = nonfinite;
    }
    free(ebuf);
    free(ebuf_f);
}

static int64_t count_targets(const xent_ce_input *in, const xent_ce_opts *o) {
    if (!in->labels) return 0;
    int64_t n = 0;
    for (int64_t r = 0; r < in->T; r++)
        n += xent__label(in->labels, in->label_dtype, r) != o->ignore_index;
    return n;
}

static double mean_divisor(const xent_ce_opts *o, int64_t counted) {
    return o->normalizer > 0 ? o->normalizer : (double)counted;
}

/* Sets up a job, runs the rows, sums the blocks in order. */
static xent_status run_job(job *jb, double *loss_sum, int64_t *counted,
                           int64_t *nonfinite) {
    const xent_ce_input *in = jb->in;
    int64_t nblocks = (in->T + ROW_BLOCK - 1) / ROW_BLOCK;
    size_t nb = nblocks > 0 ? (size_t)nblocks : 1;
    char *mem = malloc(nb * (sizeof(double) + 2 * sizeof(int64_t)));
    if (!mem) return xent_set_error(XENT_ERR_ALLOC, "cannot allocate %zu bytes of row-block scratch", nb * 24);
    jb->block_loss = (double *)mem;
    jb->block_counted = (int64_t *)(mem + nb * sizeof(double));
    jb->block_nonfinite = jb->block_counted + nb;
    jb->x = xform_make(jb->o);
    jb->kern = xent__cpu_kern_get();
    jb->ld = in->ld ? in->ld : in->V;
    jb->total = vocab_total_of(jb->o, in->V);
    jb->eps = jb->o->label_smoothing;
    jb->kz = jb->o->z_loss;
    /* rows per thread: at least ~1M elements each to pay for the thread */
    int threads = xent_num_threads(jb->o->threads);
    int64_t work = in->T * in->V / (1 << 20);
    if (work < threads) threads = work < 1 ? 1 : (int)work;
    xent_parallel_for(nblocks, threads, run_rows, jb);
    double s = 0;
    int64_t c = 0, nf = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        s += jb->block_loss[b];
        c += jb->block_counted[b];
        nf += jb->block_nonfinite[b];
    }
    free(mem);
    *loss_sum = s;
    *counted = c;
    *nonfinite = nf;
    return XENT_OK;
}

/* ------------------------------------------------------------------------ */
/* Public entry points                                                       */
/* ------------------------------------------------------------------------ */

static void write_reduced(const xent_ce_opts *o, float *loss, double sum,
                          int64_t counted) {
    if (!loss || o->reduction == XENT_REDUCE_NONE) return;
    if (o->reduction == XENT_REDUCE_SUM) {
        *loss = (float)sum;
    } else {
        double n = mean_divisor(o, counted);
        *loss = n > 0 ? (float)(sum / n) : 0.0f;
    }
}

static double base_scale(const xent_ce_opts *o, int64_t counted) {
    if (o->reduction == XENT_REDUCE_MEAN) {
        double n = mean_divisor(o, counted);
        return n > 0 ? o->grad_scale / n : 0.0;
    }
    return o->grad_scale;
}

xent_status xent_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                    xent_ce_output *out) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    if (!out) return xent_set_error(XENT_ERR_NULL, "output is NULL");
    xent_status s = check_input(in, opts);
    if (s) return s;
    if (opts->vocab_start != 0 || (opts->vocab_total != 0 && opts->vocab_total != in->V))
        return xent_set_error(XENT_ERR_VALUE,
                          "xent_ce needs whole rows (opts.vocab_start = %lld, opts.vocab_total = %lld, V = %lld); "
                          "for a vocabulary shard use xent_ce_shard_stats, xent_ce_combine and xent_ce_backward",
                          (long long)opts->vocab_start, (long long)opts->vocab_total, (long long)in->V);
    s = check_grad(in, out->grad, out->grad_dtype, out->ld_grad);
    if (s) return s;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.out = out;
    jb.grad = out->grad;
    jb.grad_dtype = out->grad ? out->grad_dtype : XENT_F32;
    jb.ld_grad = out->ld_grad ? out->ld_grad : in->V;
    jb.g_base = base_scale(opts, count_targets(in, opts));
    double sum;
    int64_t counted, nonfinite;
    s = run_job(&jb, &sum, &counted, &nonfinite);
    if (s) return s;
    write_reduced(opts, out->loss, sum, counted);
    if (out->n_counted) *out->n_counted = counted;
    if (out->n_nonfinite) *out->n_nonfinite = nonfinite;
    return XENT_OK;
}

xent_status xent_logprobs(const xent_ce_input *in, const xent_ce_opts *opts,
                          float *logprob, float *entropy) {
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.logprob = logprob;
    out.entropy = entropy;
    return xent_ce(in, opts, &out);
}

xent_status xent_ce_backward(const xent_ce_input *in, const xent_ce_opts *opts,
                             const xent_ce_stats *stats, void *grad,
                             xent_dtype grad_dtype, int64_t ld_grad) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    xent_status s = check_input(in, opts);
    if (s) return s;
    if (in->T > 0 && !stats) return xent_set_error(XENT_ERR_NULL, "stats is NULL with T = %lld", (long long)in->T);
    if (in->T > 0 && !grad) return xent_set_error(XENT_ERR_NULL, "grad is NULL with T = %lld", (long long)in->T);
    s = check_grad(in, grad, grad_dtype, ld_grad);
    if (s) return s;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.stats_in = stats;
    jb.grad = grad;
    jb.grad_dtype = grad_dtype;
    jb.ld_grad = ld_grad ? ld_grad : in->V;
    jb.g_base = base_scale(opts, count_targets(in, opts));
    double sum;
    int64_t counted, nonfinite;
    return run_job(&jb, &sum, &counted, &nonfinite);
}

xent_status xent_ce_shard_stats(const xent_ce_input *in, const xent_ce_opts *opts,
                                xent_ce_partial *partial) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    xent_status s = check_input(in, opts);
    if (s) return s;
    if (in->T > 0 && !partial) return xent_set_error(XENT_ERR_NULL, "partial is NULL with T = %lld", (long long)in->T);
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.partial_out = partial;
    double sum;
    int64_t counted, nonfinite;
    return run_job(&jb, &sum, &counted, &nonfinite);
}

xent_status xent_ce_combine(const xent_ce_partial *parts, int S,
                            const xent_ce_input *in, const xent_ce_opts *opts,
                            xent_ce_output *out) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    if (!in) return xent_set_error(XENT_ERR_NULL, "input is NULL");
    if (!out) return xent_set_error(XENT_ERR_NULL, "output is NULL");
    if (S < 1) return xent_set_error(XENT_ERR_SHAPE, "S = %d shards must be >= 1", S);
    if (in->T < 0) return xent_set_error(XENT_ERR_SHAPE, "T = %lld must be >= 0", (long long)in->T);
    if (in->T > 0 && !parts) return xent_set_error(XENT_ERR_NULL, "parts is NULL with T = %lld", (long long)in->T);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent_set_error(XENT_ERR_DTYPE, "labels dtype %s is not supported (i32, i64)", xent_dtype_name(in->label_dtype));
    int64_t total = opts->vocab_total ? opts->vocab_total : (S == 1 ? in->V : 0);
    if (total <= 0)
        return xent_set_error(XENT_ERR_SHAPE, "opts.vocab_total = %lld: the whole vocabulary size is needed to combine %d shards",
                          (long long)opts->vocab_total, S);
    xent_ce_opts o = *opts;
    o.vocab_start = 0;
    o.vocab_total = total;
    xent_status s = xent__ce_check_opts(&o, total);
    if (s) return s;
    s = check_labels(in, &o, total);
    if (s) return s;
    int64_t T = in->T;
    /* every counted row needs exactly one owner shard */
    for (int64_t r = 0; r < T; r++) {
        int64_t t = in->labels ? xent__label(in->labels, in->label_dtype, r) : o.ignore_index;
        int owners = 0;
        for (int k = 0; k < S; k++) owners += (int)(parts[(int64_t)k * T + r].flags & 1);
        if ((t != o.ignore_index && owners != 1) || (t == o.ignore_index && owners != 0))
            return xent_set_error(XENT_ERR_VALUE,
                              "row %lld (label %lld): %d shards claim the target; expected %d (check each shard's vocab_start)",
                              (long long)r, (long long)t, owners, t != o.ignore_index);
    }
    xform x = xform_make(&o);
    double sum = 0, block = 0;
    int64_t counted = 0, nonfinite = 0;
    for (int64_t r = 0; r < T; r++) {
        int is_counted = in->labels && xent__label(in->labels, in->label_dtype, r) != o.ignore_index;
        row_result rr = combine_row(&parts[r], S, T, is_counted, &x, (double)total,
                                    o.label_smoothing, o.z_loss, NAN);
        write_row_outputs(out, r, &rr, is_counted);
        if (out->loss && o.reduction == XENT_REDUCE_NONE) out->loss[r] = (float)rr.loss;
        block += rr.loss; /* summed per ROW_BLOCK rows, as xent_ce does */
        if ((r + 1) % ROW_BLOCK == 0 || r + 1 == T) { sum += block; block = 0; }
        counted += is_counted;
        nonfinite += rr.nonfinite;
    }
    write_reduced(&o, out->loss, sum, counted);
    if (out->n_counted) *out->n_counted = counted;
    if (out->n_nonfinite) *out->n_nonfinite = nonfinite;
    return XENT_OK;
}
