/* src/cpu/ce_f64.c: cross-entropy of float64 logits with float64 outputs,
 * each faithfully rounded (within 1 ulp of double). The contract is
 * xent_ce_f64 in include/xent.h; the error analysis is docs/numerics.md,
 * section "The float64 path".
 *
 * Same structure as the fp32-input kernel (src/cpu/ce.c): pass 1 takes the
 * max m of the non-target logits, pass 2 sums e_j = exp(x_j) with
 * x_j = (z_j - m) / tau <= 0 (the columns at the max counted apart, so that
 * S - 1 carries full relative accuracy), the combine forms
 * d = (m - z_t)/tau + log S and nll = softplus(d) (no cancellation), and the
 * gradient is p_j = e_j exp(-L) with L = lse - m/tau >= 0. What changes is
 * the precision: the arithmetic is long double (x87 80-bit on x86-64,
 * u = 2^-64; IEEE quad on aarch64), and every quantity whose *absolute*
 * error becomes a relative error downstream (x_j, d, L, nll, all arguments
 * of exp) is carried as an unevaluated pair hi + lo formed with error-free
 * transformations (TwoSum, Dekker's TwoProduct), so that logits of any
 * magnitude and exponents down to -745 (the double range of the outputs)
 * keep the accuracy. The per-element exp is our own (exp_pr below, a
 * proven 3.2u bound); sums are compensated (Sum2). libm's log1pl and
 * expm1l are called a few times per row.
 *
 * -inf logits are exact zeros of probability (exp(-inf) = 0): a target at
 * -inf gives nll = +inf and gradient -1 there. A row with a NaN or +inf
 * logit, or with every logit -inf, is non-finite (NaN outputs, counted in
 * n_nonfinite), as in the fp32 API. */
#include "core/xent_internal.h"

#include <float.h>
#include <stdlib.h>

#if LDBL_MANT_DIG >= 64 && LDBL_MAX_EXP >= 16384
#define F64_PATH 1
#else
#define F64_PATH 0 /* long double == double (or IBM double-double): refused */
#endif

typedef long double ld;

#define ROW_BLOCK 16

#if F64_PATH

/* ------------------------------------------------------------------------ */
/* Error-free transformations in long double                                 */
/* ------------------------------------------------------------------------ */

typedef struct { ld hi, lo; } pr; /* the value hi + lo, |lo| <= ~u |hi|    */

/* s + e = a + b exactly (Knuth's TwoSum; no overflow in our ranges) */
static inline pr two_sum(ld a, ld b) {
    ld s = a + b;
    ld bb = s - a;
    pr r = {s, (a - (s - bb)) + (b - bb)};
    return r;
}

/* Veltkamp's split constant 2^ceil(p/2) + 1 */
#if LDBL_MANT_DIG == 64
#define SPLIT 0x1.00000001p32L
#else
#define SPLIT ((ld)(1ULL << ((LDBL_MANT_DIG + 1) / 2)) + 1.0L)
#endif

static inline void split(ld a, ld *hi, ld *lo) {
    ld t = SPLIT * a;
    *hi = t - (t - a);
    *lo = a - *hi;
}

/* p + e = a * b exactly (Dekker's TwoProduct) */
static inline pr two_prod(ld a, ld b) {
    ld p = a * b, ah, al, bh, bl;
    split(a, &ah, &al);
    split(b, &bh, &bl);
    pr r = {p, ((ah * bh - p) + ah * bl + al * bh) + al * bl};
    return r;
}

static inline pr pr_add(pr a, pr b) {
    pr s = two_sum(a.hi, b.hi);
    s.lo += a.lo + b.lo;
    return two_sum(s.hi, s.lo);
}

static inline pr pr_neg(pr a) {
    pr r = {-a.hi, -a.lo};
    return r;
}

static inline ld pr_val(pr a) { return a.hi + a.lo; }

/* 1/tau as a pair: it.hi = RN(1/tau), it.lo its remainder (relative error
 * of the pair below u^2) */
static pr inv_pair(double tau) {
    pr it;
    it.hi = 1.0L / (ld)tau;
    pr p = two_prod((ld)tau, it.hi);
    it.lo = ((1.0L - p.hi) - p.lo) / (ld)tau; /* 1 - p.hi is exact */
    return it;
}

/* (a - b) * it as a pair: a - b exactly (TwoSum), times 1/tau to relative
 * 4u^2 (exact when tau == 1). a, b finite doubles. */
static inline pr diff_scaled(double a, double b, pr it, int unit_tau) {
    pr x = two_sum((ld)a, -(ld)b);
    if (unit_tau) return x;
    pr p = two_prod(x.hi, it.hi);
    p.lo += x.hi * it.lo + x.lo * it.hi;
    return two_sum(p.hi, p.lo);
}

static inline pr scaled(double a, pr it, int unit_tau) {
    pr x = {(ld)a, 0.0L};
    if (unit_tau) return x;
    pr p = two_prod(x.hi, it.hi);
    p.lo += x.hi * it.lo;
    return two_sum(p.hi, p.lo);
}

/* ------------------------------------------------------------------------ */
/* exp of a pair, relative error <= 3.2u (docs/numerics.md)                   */
/* ------------------------------------------------------------------------ */

/* 2^(j/32), j in [0, 32), to 113 bits (correctly rounded to long double by
 * the compiler) */
static const ld EXP2_TAB[32] = {
    0x1.0000000000000000000000000000p0L, 0x1.059b0d31585743ae7c548eb68ca4p0L,
    0x1.0b5586cf9890f6298b92b71842aap0L, 0x1.11301d0125b50a4ebbf1aed9318dp0L,
    0x1.172b83c7d517adcdf7c8c50eb14ap0L, 0x1.1d4873168b9aa7805b8028990f08p0L,
    0x1.2387a6e75623866c1fadb1c15cb6p0L, 0x1.29e9df51fdee12c25d15f5a24aa4p0L,
    0x1.306fe0a31b7152de8d5a46305c86p0L, 0x1.371a7373aa9caa7145502f454798p0L,
    0x1.3dea64c12342235b41223e13d774p0L, 0x1.44e086061892d03136f409df01a0p0L,
    0x1.4bfdad5362a271d4397afec42e21p0L, 0x1.5342b569d4f81df0a83c49d86a64p0L,
    0x1.5ab07dd48542958c93015191eb34p0L, 0x1.6247eb03a5584b1f0fa06fd2da43p0L,
    0x1.6a09e667f3bcc908b2fb1366ea95p0L, 0x1.71f75e8ec5f73dd2370f2ef0acd7p0L,
    0x1.7a11473eb0186d7d51023f6cda1fp0L, 0x1.82589994cce128acf88afab34a01p0L,
    0x1.8ace5422aa0db5ba7c55a192c9bbp0L, 0x1.93737b0cdc5e4f4501c3f2540a23p0L,
    0x1.9c49182a3f0901c7c46b071f2be6p0L, 0x1.a5503b23e255c8b424491caf87bdp0L,
    0x1.ae89f995ad3ad5e8734d1773205ap0L, 0x1.b7f76f2fb5e46eaa7b081ab53c53p0L,
    0x1.c199bdd85529c2220cb12a091ba6p0L, 0x1.cb720dcef90691503cbd1e949db7p0L,
    0x1.d5818dcfba48725da05aeb66e0ddp0L, 0x1.dfc97337b9b5eb968cac39ed291bp0L,
    0x1.ea4afa2a490d9858f73a18f5db30p0L, 0x1.f50765b6e4540674f84b762862bbp0L,
};
/* ln2/32 = C1 + C2: C1 has 44 significant bits, so k*C1 is exact for
 * |k| < 2^20; C2 is the rest rounded to long double. */
#define EXP_C1 0x1.62e42fefa3ap-6L
#define EXP_C2 (-0x1.0ca86c3898cff81a12a17e1979b3p-54L)
#define EXP_INV 0x1.71547652b82fe1777d0ffda0d23ap5L /* 32/ln2 */
/* rounds a value below 2^(p-2) to an integer (round to nearest) */
#define EXP_SHIFTER (0x1.8p0L * (ld)(1ULL << 63) * (ld)(1ULL << (LDBL_MANT_DIG - 64)))

static inline ld pow2_small(int m) { /* 2^m for m in [-1022, 1023] */
    union { double d; uint64_t u; } v;
    v.u = (uint64_t)(m + 1023) << 52;
    return (ld)v.d;
}

/* exp(a.hi + a.lo) for |a.lo| <= 2^-50 max(1, |a.hi|). */
static inline __attribute__((always_inline)) ld exp_pr(pr a) {
    ld x = a.hi;
    if (!(x > -11400.0L)) return x != x ? x : 0.0L; /* below LDBL_TRUE_MIN */
    if (x > 11357.0L) return (ld)INFINITY;
    ld ks = x * EXP_INV + EXP_SHIFTER;
    ld kf = ks - EXP_SHIFTER;                        /* nearest integer k  */
    ld r = (x - kf * EXP_C1) + (a.lo - kf * EXP_C2); /* first part exact */
#if LDBL_MANT_DIG == 64 && defined(__x86_64__)
    /* k from the low bits of ks's 64-bit significand (x87 format): a
     * conversion to integer would reload the control word */
    union { ld v; struct { uint64_t m; uint16_t se; } p; } u;
    u.v = ks;
    long k = (long)(int64_t)(u.p.m - 0xC000000000000000ULL);
#else
    long k = (long)kf;
#endif
    int j = (int)(k & 31);
    long m = (k - j) / 32;
    /* Taylor polynomial of degree 7 on |r| <= ln2/64 + tiny */
    ld q = 0x1.a01a01a01a01a01a01a01a01a01ap-13L;
    q = 0x1.6c16c16c16c16c16c16c16c16c17p-10L + r * q;
    q = 0x1.1111111111111111111111111111p-7L + r * q;
    q = 0x1.5555555555555555555555555555p-5L + r * q;
    q = 0x1.5555555555555555555555555555p-3L + r * q;
    q = 0.5L + r * q;
    q = 1.0L + r * q;
    ld y = EXP2_TAB[j] * (1.0L + r * q);
    if (m >= -2044 && m <= 2046) {
        int m1 = (int)(m / 2), m2 = (int)(m - m1);
        return (y * pow2_small(m1)) * pow2_small(m2);
    }
    return ldexpl(y, (int)m);
}

/* ------------------------------------------------------------------------ */
/* Compensated sums (Sum2 of Ogita, Rump and Oishi)                          */
/* ------------------------------------------------------------------------ */

typedef struct { ld s, c; } csum;

static inline void csum_add(csum *a, ld v) {
    ld t = a->s + v;
    ld z = t - a->s;
    a->c += (a->s - (t - z)) + (v - z);
    a->s = t;
}

/* an infinite or NaN term leaves c NaN: the value is then s itself */
static inline ld csum_val(const csum *a) { return isfinite(a->s) ? a->s + a->c : a->s; }

static inline void csum_merge(csum *a, const csum *b) {
    csum_add(a, b->s);
    if (isfinite(b->s)) csum_add(a, b->c);
}

/* ------------------------------------------------------------------------ */
/* One row                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    const xent_ce_input *in;
    const xent_ce_opts *o;
    const double *grad_rows;   /* f64 upstream gradients, or NULL           */
    const xent_ce_output_f64 *out;
    int64_t ld, ld_grad;
    double total;              /* V                                         */
    pr it;                     /* 1/tau                                     */
    int unit_tau;
    ld eps, kz, g_base;
    int need_sx, need_z;
    /* per row block */
    csum *block_loss;
    int64_t *block_counted, *block_nonfinite;
} job64;

typedef struct {
    int nonfinite;
    ld nll, lse, entropy, loss;
    ld s;     /* exp(-L): p_j = e_j s for j != t                            */
    ld tgrad; /* dL/dz'_t per unit upstream, before the (1 + 2k lse) factor
                 of the non-target entries                                  */
    ld a;     /* 1 + 2 k lse                                                */
} row64;

static int64_t target_of(const job64 *jb, int64_t r) {
    if (!jb->in->labels) return -1;
    int64_t t = xent__label(jb->in->labels, jb->in->label_dtype, r);
    return t == jb->o->ignore_index ? -1 : t;
}

/* Passes 1-2 and the combine of one row; ebuf[V] (or NULL) receives e_j
 * (0 at the target and at -inf columns). */
static row64 row_forward(const job64 *jb, const double *z, int64_t V, int64_t t, ld *ebuf) {
    row64 r;
    memset(&r, 0, sizeof r);
    /* pass 1: max of the non-target logits; NaN / +inf anywhere */
    double m = -INFINITY;
    int bad = 0;
    for (int64_t j = 0; j < V; j++) {
        double v = z[j];
        bad |= (v != v) | (v == INFINITY);
        if (j != t && v > m) m = v;
    }
    double zt = t >= 0 ? z[t] : 0.0;
    if (bad || (m == -INFINITY && (t < 0 || zt == -INFINITY))) {
        r.nonfinite = 1;
        r.nll = r.lse = r.entropy = (ld)NAN;
        r.loss = t >= 0 ? (ld)NAN : 0.0L;
        r.s = r.tgrad = r.a = (ld)NAN;
        return r;
    }
    /* pass 2 */
    csum S = {0, 0}, SX = {0, 0}, Z = {0, 0};
    int64_t cnt = 0;
    int zneginf = 0;
    if (m != -INFINITY) {
        for (int64_t j = 0; j < V; j++) {
            double v = z[j];
            if (j == t) { if (ebuf) ebuf[j] = 0; continue; }
            if (v == m) { cnt++; if (ebuf) ebuf[j] = 1.0L; continue; }
            if (v == -INFINITY) { zneginf = 1; if (ebuf) ebuf[j] = 0; continue; }
            pr x = diff_scaled(v, m, jb->it, jb->unit_tau);
            ld e = exp_pr(x);
            if (ebuf) ebuf[j] = e;
            csum_add(&S, e);
            if (jb->need_sx) csum_add(&SX, e * x.hi);
            if (jb->need_z) csum_add(&Z, x.hi);
        }
    } else {
        for (int64_t j = 0; j < V; j++) {
            if (ebuf) ebuf[j] = 0;
            if (j != t) zneginf = 1;
        }
    }
    ld eps = jb->eps, kz = jb->kz, Vt = (ld)jb->total;
    ld Sm1 = m == -INFINITY ? -1.0L : csum_val(&S) + (ld)(cnt - 1);
    ld Ssum = Sm1 + 1.0L;
    ld sx = csum_val(&SX), zs = csum_val(&Z); /* <= 0 */
    pr M = m == -INFINITY ? (pr){0, 0} : scaled(m, jb->it, jb->unit_tau);
    ld logS = m == -INFINITY ? -(ld)INFINITY : log1pl(Sm1);
    if (t < 0) { /* ignored row or no labels: lse and entropy only */
        pr L = {logS, 0};
        r.lse = pr_val(pr_add(M, L));
        /* H = L - SX/S: both terms >= 0 */
        r.entropy = logS + (-sx) / Ssum;
        r.a = 1.0L;
        return r;
    }
    ld em1, pt;
    pr L;
    if (m == -INFINITY) { /* the target holds all the mass */
        r.nll = 0;
        pr zt_ = scaled(zt, jb->it, jb->unit_tau);
        r.lse = pr_val(zt_);
        r.s = 0;
        r.entropy = 0;
        em1 = 0;
        pt = 1;
        ld ls = zneginf ? (ld)INFINITY : 0.0L; /* lse - mean z' */
        r.loss = (eps < 1 ? (1 - eps) * r.nll : 0) + (eps > 0 ? eps * ls : 0) +
                 (kz > 0 ? kz * r.lse * r.lse : 0);
    } else if (zt == -INFINITY) { /* p_t = 0: nll = +inf */
        r.nll = (ld)INFINITY;
        L = (pr){logS, 0};
        r.lse = pr_val(pr_add(M, L));
        r.s = exp_pr(pr_neg(L));
        r.entropy = r.s * (logS * Ssum - sx);
        em1 = -1;
        pt = 0;
        r.loss = (eps < 1 ? (ld)INFINITY : 0) + (eps > 0 ? (ld)INFINITY : 0);
    } else {
        pr dm = diff_scaled(m, zt, jb->it, jb->unit_tau); /* M - z'_t */
        pr d = two_sum(dm.hi, logS);
        d.lo += dm.lo;
        d = two_sum(d.hi, d.lo);
        pr nll;
        ld g = 0; /* log1p(e^-d) when d > 0 */
        if (d.hi > 0) {
            g = log1pl(exp_pr(pr_neg(d)));
            nll = two_sum(d.hi, d.lo + g);
            L = two_sum(logS, g);        /* logS + softplus(-d), both >= 0 */
        } else {
            nll = (pr){log1pl(exp_pr(d)), 0};
            L = pr_add(pr_neg(dm), nll); /* -dm >= 0 here */
        }
        r.nll = pr_val(nll);
        r.lse = pr_val(pr_add(M, L));
        r.s = exp_pr(pr_neg(L));
        pt = exp_pr(pr_neg(nll));
        em1 = r.nll < 1 ? expm1l(-r.nll) : pt - 1.0L;
        /* entropy: e^-L (L S - SX) + p_t nll, all terms >= 0 */
        if (jb->need_sx) r.entropy = r.s * (pr_val(L) * Ssum - sx) + pt * r.nll;
        if (eps > 0) {
            /* lse - mean z' = L + dm/V - Z/V (Z = sum_{j != t} x_j <= 0),
             * each form a sum of non-negative terms */
            ld ls;
            if (zneginf) ls = (ld)INFINITY;
            else if (dm.hi >= 0) ls = (pr_val(L) + pr_val(dm) / Vt) + (-zs) / Vt;
            else if (d.hi <= 0) ls = (-pr_val(dm) * (1.0L - 1.0L / Vt) + r.nll) + (-zs) / Vt;
            else ls = ((logS + pr_val(dm) / Vt) + g) + (-zs) / Vt;
            r.loss = (eps < 1 ? (1 - eps) * r.nll : 0) + eps * ls;
        } else {
            r.loss = r.nll;
        }
        if (kz > 0) r.loss += kz * r.lse * r.lse;
    }
    r.a = kz > 0 ? 1.0L + 2.0L * kz * r.lse : 1.0L;
    /* (p_t - 1) + eps (1 - 1/V) + 2k lse p_t, with p_t - 1 = expm1(-nll) */
    r.tgrad = (eps < 1 ? (1 - eps) * em1 : 0) + (eps > 0 ? eps * (pt - 1.0L / Vt) : 0) +
              (kz > 0 ? 2.0L * kz * r.lse * pt : 0);
    return r;
}

static ld row_scale(const job64 *jb, int64_t r) {
    if (jb->o->reduction != XENT_REDUCE_NONE) return jb->g_base;
    ld g = (ld)jb->o->grad_scale;
    if (jb->grad_rows) return g * (ld)jb->grad_rows[r];
    if (jb->in->grad_rows) return g * (ld)jb->in->grad_rows[r];
    return g;
}

static void grad_row64(const job64 *jb, const double *z, int64_t V, int64_t t,
                       const row64 *rr, const ld *ebuf, ld g, double *gout) {
    if (g == 0 || t < 0) {
        for (int64_t j = 0; j < V; j++) gout[j] = 0.0;
        return;
    }
    if (rr->nonfinite) {
        for (int64_t j = 0; j < V; j++) gout[j] = NAN;
        return;
    }
    ld G = g * jb->it.hi; /* g / tau */
    ld as = rr->a * rr->s;
    ld b = jb->eps / (ld)jb->total;
    double m = -INFINITY; /* recompute e_j when there is no buffer */
    if (!ebuf)
        for (int64_t j = 0; j < V; j++)
            if (j != t && z[j] > m) m = z[j];
    ld gt = G * rr->tgrad;
    for (int64_t j = 0; j < V; j++) {
        if (j == t) continue;
        ld e;
        if (ebuf) {
            e = ebuf[j];
        } else {
            double v = z[j];
            e = v == -INFINITY ? 0.0L : v == m ? 1.0L : exp_pr(diff_scaled(v, m, jb->it, jb->unit_tau));
        }
        /* b == 0: G (a p_j), p_j = e_j s; else G (a p_j - eps/V) */
        gout[j] = (double)(b == 0 ? G * (e * as) : G * (e * as - b));
    }
    gout[t] = (double)gt;
}

static void run_rows64(void *ctx, int64_t b0, int64_t b1) {
    job64 *jb = ctx;
    const xent_ce_input *in = jb->in;
    const xent_ce_output_f64 *out = jb->out;
    int64_t V = in->V;
    ld *ebuf = out->grad ? malloc((size_t)V * sizeof(ld)) : NULL;
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * ROW_BLOCK, r1 = r0 + ROW_BLOCK < in->T ? r0 + ROW_BLOCK : in->T;
        csum loss = {0, 0};
        int64_t counted = 0, nonfinite = 0;
        for (int64_t r = r0; r < r1; r++) {
            const double *z = (const double *)in->logits + (size_t)r * (size_t)jb->ld;
            int64_t t = target_of(jb, r);
            row64 rr = row_forward(jb, z, V, t, ebuf);
            if (out->nll) out->nll[r] = (double)rr.nll;
            if (out->logprob) out->logprob[r] = -(double)rr.nll + 0.0;
            if (out->lse) out->lse[r] = (double)rr.lse;
            if (out->entropy) out->entropy[r] = (double)rr.entropy;
            if (out->stats) {
                out->stats[r].lse = (double)rr.lse;
                out->stats[r].nll = t >= 0 ? (double)rr.nll : 0.0;
            }
            if (out->loss && jb->o->reduction == XENT_REDUCE_NONE) out->loss[r] = (double)rr.loss;
            csum_add(&loss, rr.loss);
            counted += t >= 0;
            nonfinite += rr.nonfinite;
            if (out->grad) {
                double *gout = out->grad + (size_t)r * (size_t)jb->ld_grad;
                grad_row64(jb, z, V, t, &rr, ebuf, row_scale(jb, r), gout);
            }
        }
        jb->block_loss[b] = loss;
        jb->block_counted[b] = counted;
        jb->block_nonfinite[b] = nonfinite;
    }
    free(ebuf);
}

#endif /* F64_PATH */

xent_status xent_ce_f64(const xent_ce_input *in, const xent_ce_opts *opts,
                        const double *grad_rows, xent_ce_output_f64 *out) {
    xent_ce_opts dflt;
    if (!opts) {
        xent_ce_opts_init(&dflt);
        opts = &dflt;
    }
    if (!in) return xent_set_error(XENT_ERR_NULL, "input is NULL");
    if (!out) return xent_set_error(XENT_ERR_NULL, "output is NULL");
    if (in->T < 0) return xent_set_error(XENT_ERR_SHAPE, "T = %lld must be >= 0", (long long)in->T);
    if (in->V <= 0) return xent_set_error(XENT_ERR_SHAPE, "V = %lld must be >= 1", (long long)in->V);
    if (in->ld != 0 && in->ld < in->V)
        return xent_set_error(XENT_ERR_SHAPE, "ld = %lld is smaller than V = %lld", (long long)in->ld, (long long)in->V);
    if (in->dtype != XENT_F64)
        return xent_set_error(XENT_ERR_DTYPE, "xent_ce_f64: logits dtype %s is not supported (f64; f32, bf16, f16 go through xent_ce)",
                              xent_dtype_name(in->dtype));
    if (in->T > 0 && !in->logits) return xent_set_error(XENT_ERR_NULL, "logits is NULL with T = %lld", (long long)in->T);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent_set_error(XENT_ERR_DTYPE, "labels dtype %s is not supported (i32, i64)", xent_dtype_name(in->label_dtype));
    xent_status s = xent__ce_check_opts(opts, in->V);
    if (s) return s;
    if (opts->vocab_start != 0 || (opts->vocab_total != 0 && opts->vocab_total != in->V))
        return xent_set_error(XENT_ERR_VALUE,
                              "xent_ce_f64 needs whole rows (opts.vocab_start = %lld, opts.vocab_total = %lld, V = %lld): "
                              "vocabulary shards of f64 logits are not supported",
                              (long long)opts->vocab_start, (long long)opts->vocab_total, (long long)in->V);
    if (opts->softcap > 0)
        return xent_set_error(XENT_ERR_UNSUPPORTED,
                              "opts.softcap = %g: a softcap is not supported with f64 logits (xent_ce_f64); "
                              "use f32 logits", opts->softcap);
    for (int64_t r = 0; in->labels && r < in->T; r++) {
        int64_t t = xent__label(in->labels, in->label_dtype, r);
        if (t != opts->ignore_index && (t < 0 || t >= in->V))
            return xent_set_error(XENT_ERR_LABEL,
                                  "labels[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                                  (long long)r, (long long)t, (long long)in->V, (long long)opts->ignore_index);
    }
    for (int64_t r = 0; (grad_rows || in->grad_rows) && r < in->T; r++) {
        double g = grad_rows ? grad_rows[r] : (double)in->grad_rows[r];
        if (!isfinite(g))
            return xent_set_error(XENT_ERR_VALUE, "grad_rows[%lld] = %g is not finite", (long long)r, g);
    }
    if (out->grad) {
        if (out->ld_grad != 0 && out->ld_grad < in->V)
            return xent_set_error(XENT_ERR_SHAPE, "ld_grad = %lld is smaller than V = %lld",
                                  (long long)out->ld_grad, (long long)in->V);
        int64_t ldl = in->ld ? in->ld : in->V, ldg = out->ld_grad ? out->ld_grad : in->V;
        if ((const void *)out->grad == in->logits && ldl != ldg)
            return xent_set_error(XENT_ERR_SHAPE, "in-place gradient needs equal row strides (%lld vs %lld)",
                                  (long long)ldg, (long long)ldl);
    }
#if !F64_PATH
    return xent_set_error(XENT_ERR_UNSUPPORTED,
                          "xent_ce_f64 needs a long double of at least 64 bits of mantissa "
                          "(x86-64 or aarch64); this build's has %d", LDBL_MANT_DIG);
#else
    job64 jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.grad_rows = grad_rows;
    jb.out = out;
    jb.ld = in->ld ? in->ld : in->V;
    jb.ld_grad = out->ld_grad ? out->ld_grad : in->V;
    jb.total = (double)in->V;
    jb.unit_tau = opts->temperature == 1.0;
    jb.it = inv_pair(opts->temperature);
    jb.eps = opts->label_smoothing;
    jb.kz = opts->z_loss;
    jb.need_sx = out->entropy != NULL;
    jb.need_z = opts->label_smoothing > 0 && (out->loss != NULL);
    int64_t counted_all = 0;
    for (int64_t r = 0; in->labels && r < in->T; r++)
        counted_all += xent__label(in->labels, in->label_dtype, r) != opts->ignore_index;
    ld n = opts->normalizer > 0 ? (ld)opts->normalizer : (ld)counted_all;
    jb.g_base = opts->reduction == XENT_REDUCE_MEAN ? (n > 0 ? (ld)opts->grad_scale / n : 0.0L)
                                                    : (ld)opts->grad_scale;
    int64_t nblocks = (in->T + ROW_BLOCK - 1) / ROW_BLOCK;
    size_t nb = nblocks > 0 ? (size_t)nblocks : 1;
    char *mem = malloc(nb * (sizeof(csum) + 2 * sizeof(int64_t)));
    if (!mem) return xent_set_error(XENT_ERR_ALLOC, "cannot allocate %zu bytes of row-block scratch", nb * 48);
    jb.block_loss = (csum *)mem;
    jb.block_counted = (int64_t *)(mem + nb * sizeof(csum));
    jb.block_nonfinite = jb.block_counted + nb;
    int threads = xent_num_threads(opts->threads);
    int64_t work = in->T * in->V / (1 << 18);
    if (work < threads) threads = work < 1 ? 1 : (int)work;
    xent_parallel_for(nblocks, threads, run_rows64, &jb);
    /* every block's compensated sum, then the blocks in order */
    csum sum = {0, 0};
    int64_t counted = 0, nonfinite = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        csum_merge(&sum, &jb.block_loss[b]);
        counted += jb.block_counted[b];
        nonfinite += jb.block_nonfinite[b];
    }
    free(mem);
    if (out->loss && opts->reduction != XENT_REDUCE_NONE) {
        ld total = csum_val(&sum);
        if (opts->reduction == XENT_REDUCE_SUM) {
            *out->loss = (double)total;
        } else {
            ld dv = opts->normalizer > 0 ? (ld)opts->normalizer : (ld)counted;
            *out->loss = dv > 0 ? (double)(total / dv) : 0.0;
        }
    }
    if (out->n_counted) *out->n_counted = counted;
    if (out->n_nonfinite) *out->n_nonfinite = nonfinite;
    return XENT_OK;
#endif
}
