/* src/cuda/ce_row.h: what every row kernel shares (ce_stream.cu's streaming
 * kernel, ce_onchip.cu's on-chip kernel): the row's label, the transform
 * z' = cap(z) / tau in double, the finish of a row from its partial
 * statistics (the CPU's combine formulas), the per-row outputs, and the
 * gradient's constants. */
#ifndef XENT_CUDA_CE_ROW_H
#define XENT_CUDA_CE_ROW_H

#include "ce_device.h"
#include "ce_kernels.h"

#include <math.h>

#define XC_LOG2E 1.4426950408889634
#define XC_LN2 0.6931471805599453   /* ln 2, double */
#define XC_LN2F 0.6931471805599453f /* ln 2 rounded to float */

/* The label check's gate (xc_params.gated): the label pass found a bad row,
 * so this kernel writes nothing; the host reports the error. Uniform over
 * the grid (one value, final before the kernel starts). */
__device__ __forceinline__ bool xc_gate(const xc_params &k) {
    return k.gated && k.rec->neg_first_bad != 0;
}

/* ------------------------------------------------------------------ */
/* Per-row context                                                     */
/* ------------------------------------------------------------------ */

struct xc_row {
    int64_t r;
    int counted; /* the row has a target (label != ignore_index)          */
    int bad;     /* label outside [0, vocab_total) (unchecked calls)      */
    int64_t tl;  /* target's local column, or -1 when not in this shard  */
};

/* Row r's label as loaded (0 without labels): xc_row_from's argument, so
 * that a caller can load it a row ahead and test it a row later. */
__device__ __forceinline__ int64_t xc_label_raw(const xc_params &k, int64_t r) {
    if (!k.labels) return 0;
    return k.labels64 ? ((const int64_t *)k.labels)[r] : (int64_t)((const int32_t *)k.labels)[r];
}

__device__ __forceinline__ xc_row xc_row_from(const xc_params &k, int64_t r, int64_t t) {
    xc_row w;
    w.r = r;
    w.counted = 0;
    w.bad = 0;
    w.tl = -1;
    if (k.labels) {
        if (t != k.ignore_index) {
            w.counted = 1;
            w.bad = t < 0 || t >= k.vocab_total;
            int64_t l = t - k.vocab_start;
            if (!w.bad && l >= 0 && l < k.V) w.tl = l;
        }
    }
    return w;
}

__device__ __forceinline__ xc_row xc_row_info(const xc_params &k, int64_t r) {
    return xc_row_from(k, r, xc_label_raw(k, r));
}

/* z' = cap(z) / tau, in double, with the CPU's formulas (src/cpu/ce.c):
 * tanh from one exp, e = exp(-2|y|): tanh|y| = (1 - e) / (1 + e). */
__device__ __forceinline__ double xc_tr(const xc_params &k, double z) {
    if (!(k.softcap > 0)) return z * k.inv_tau;
    double y = z * k.inv_cap;
    double e = xc_dexp(-2.0 * fabs(y));
    double t = (1.0 - e) / (1.0 + e);
    return copysign(t, y) * k.softcap * k.inv_tau;
}

/* d z' / d z = sech^2(z / cap) / tau = 4e / (1 + e)^2 / tau. */
__device__ __forceinline__ double xc_chain(const xc_params &k, double z) {
    if (!(k.softcap > 0)) return k.inv_tau;
    double e = xc_dexp(-2.0 * fabs(z * k.inv_cap));
    double q = 1.0 + e;
    return 4.0 * e / (q * q) * k.inv_tau;
}

__device__ __forceinline__ double xc_softplus(double d) {
    return d > 0 ? d + log1p(exp(-d)) : log1p(exp(d));
}

/* ------------------------------------------------------------------ */
/* Finishing a row from its partial statistics (shards or one block)   */
/* ------------------------------------------------------------------ */

struct xc_out {
    double lse, nll, entropy, loss;
    int counted, nonfinite;
    /* a huge row (|M| or |z'_t| above XC_BIG, no softcap): its raw max and
     * L = lse - M formed without cancellation, for the gradient's
     * p_j = exp((z_j - m) / tau - L); hm is NaN for the other rows */
    double hm, L;
};

/* Rows whose shift M or target z'_t exceeds this in magnitude take the
 * huge-row forms (the CPU's BIG, docs/numerics.md "Huge logits"). */
#define XC_BIG 2048.0

/* A row's partial statistics combined (xc_finish's first half): the
 * largest transformed max M; the sums rescaled to it, in rank order: top
 * (S - 1 of the first part at M), rest (f (S_q + 1) of the others), SX and
 * Z; the target's logit and its owners; the non-finite flag. */
struct xc_comb {
    double M, Mraw, target, top, rest, SX, Z; /* Mraw: the raw max giving M */
    int owners, have_top, nonfinite;
};

/* One part's sums rescaled to the row's max: off = M_part - M (<= 0, in
 * transformed units), val = f (S_part + 1) and sx = f (SX_part + off
 * (S_part + 1)), f = exp(off). xc_finish's step for each part, and the
 * group kernel's finisher's for each slice (ce_group.cu), so that the two
 * give the same bits. */
struct xc_scaled {
    double off, val, sx;
};
__device__ __forceinline__ xc_scaled xc_part_scaled(double off, double sum, double sumx) {
    xc_scaled q;
    q.off = off;
    const double f = off == 0 ? 1.0 : exp(off);
    q.val = f * (sum + 1.0);
    q.sx = f * (sumx + off * (sum + 1.0));
    return q;
}
/* A part with a finite max into c, in rank order: the first part at the
 * max gives top (its S - 1, exact), every other one rest. */
__device__ __forceinline__ void xc_comb_add(xc_comb &c, bool at_max, double sum, double val,
                                            double sx) {
    if (at_max && !c.have_top) { c.top = sum; c.have_top = 1; }
    else c.rest += val;
    c.SX += sx;
}

/* The row's outputs from its combined statistics c (xc_finish's second
 * half). The same formulas as the CPU's combine (src/cpu/ce.c), in
 * double. */
static __device__ xc_out xc_finish_comb(const xc_params &k, const xc_row &w, xc_comb c) {
    xc_out o;
    o.lse = o.nll = o.entropy = o.loss = 0;
    o.hm = NAN;
    o.L = 0;
    o.counted = w.counted;
    o.nonfinite = w.bad || c.nonfinite;
    /* a target claimed by no shard or by two (unchecked combine): NaN row */
    if (!w.bad && c.owners != (w.counted ? 1 : 0)) o.nonfinite = 1;
    if (o.nonfinite) {
        o.lse = o.entropy = NAN;
        o.nll = o.loss = w.counted ? NAN : 0.0;
        return o;
    }
    const double M = c.M;
    const double Sm1 = c.have_top ? c.top + c.rest : -1.0, Ssum = Sm1 + 1.0;
    /* huge rows without a softcap: M - z'_t from the raw values (one
     * rounding, relative), as the CPU's combine */
    const bool rel = !(k.softcap > 0) && M != -INFINITY && !(fabs(M) <= XC_BIG);
    double L;
    if (w.counted && c.owners) {
        double zt = xc_tr(k, c.target);
        double logS = Ssum > 0 ? log1p(Sm1) : -INFINITY;
        double dm = rel ? (c.Mraw - c.target) * k.inv_tau : M - zt;
        double d = dm + logS; /* lse over j != t, minus z'_t */
        o.nll = xc_softplus(d);
        o.lse = zt + o.nll;
        const bool big = !(k.softcap > 0) && M != -INFINITY &&
                         (!(fabs(M) <= XC_BIG) || !(fabs(zt) <= XC_BIG));
        if (big) {
            /* lse = z'_t + nll cancels when z'_t << M: M + L then */
            L = logS + xc_softplus(-d);
            if (d > 0) o.lse = M + L;
            o.hm = c.Mraw;
            o.L = L;
        }
        if (k.entropy) { /* only when asked: three more transcendentals */
            L = logS + xc_softplus(-d);
            double nontarget_h = Ssum > 0 ? exp(-L) * (L * Ssum - c.SX) : 0.0;
            o.entropy = nontarget_h + exp(-o.nll) * o.nll;
        }
        o.loss = (1.0 - k.eps) * o.nll + k.eps * (o.lse - c.Z / (double)k.vocab_total) +
                 k.z_loss * o.lse * o.lse;
    } else {
        L = log1p(Sm1);
        o.lse = M + L;
        o.nll = 0;
        o.entropy = L - c.SX / Ssum;
        o.loss = 0;
    }
    return o;
}

/* parts: S partials of this row, `stride` apart, combined in rank order. */
static __device__ xc_out xc_finish(const xc_params &k, const xc_row &w,
                            const xent_ce_partial *parts, int S,
                            int64_t stride) {
    xc_comb c;
    c.M = c.Mraw = -INFINITY;
    c.target = c.top = c.rest = c.SX = c.Z = 0;
    c.owners = c.have_top = c.nonfinite = 0;
    for (int s = 0; s < S; s++) {
        const xent_ce_partial *p = parts + (int64_t)s * stride;
        if (p->flags & 2) c.nonfinite = 1;
        if (p->flags & 1) { c.target = p->target; c.owners++; }
        if (p->max != -INFINITY) {
            double mk = xc_tr(k, p->max);
            if (mk > c.M || (mk == c.M && p->max > c.Mraw)) { c.M = mk; c.Mraw = p->max; }
        }
    }
    /* huge rows without a softcap: the parts' offsets from the raw maxima */
    const bool rel = !(k.softcap > 0) && c.M != -INFINITY && !(fabs(c.M) <= XC_BIG);
    if (!c.nonfinite && !w.bad)
        for (int s = 0; s < S; s++) {
            const xent_ce_partial *p = parts + (int64_t)s * stride;
            c.Z += p->zsum;
            if (p->max == -INFINITY) continue;
            const double off = rel ? (p->max - c.Mraw) * k.inv_tau : xc_tr(k, p->max) - c.M;
            const xc_scaled q = xc_part_scaled(off, p->sum, p->sumx);
            xc_comb_add(c, q.off == 0, p->sum, q.val, q.sx);
        }
    return xc_finish_comb(k, w, c);
}

/* A block's row statistics to 16 bytes and back (xc_rowstat: exact for
 * every field a row without entropy or smoothing reads). */
__device__ __forceinline__ xc_rowstat xc_rowstat_of(const xent_ce_partial &p) {
    xc_rowstat s;
    s.sum = p.sum;
    s.max = (p.flags & 2) ? NAN : (float)p.max;
    s.target = (p.flags & 1) ? (float)p.target : NAN;
    return s;
}
__device__ __forceinline__ xent_ce_partial xc_partial_of(const xc_rowstat &s) {
    xent_ce_partial p;
    const bool nf = isnan(s.max), own = !isnan(s.target);
    p.max = nf ? -INFINITY : (double)s.max;
    p.sum = s.sum;
    p.sumx = 0;
    p.zsum = 0;
    p.target = own ? (double)s.target : 0.0;
    p.flags = (own ? 1 : 0) | (nf ? 2 : 0);
    return p;
}

/* v (a double) added exactly to the accumulator's digits: v = m 2^e with
 * an integer m < 2^53, so m << s (s = (e + XC_LA_BIAS) mod 32) spans at
 * most three digits; a negative v adds their two's complements. NaN and
 * infinities only raise flags. */
__device__ __forceinline__ void xc_acc_add(xc_long_acc *a, double v) {
    if (v == 0) return;
    if (v != v) { atomicOr(&a->nan, 1u); return; }
    if (isinf(v)) { atomicOr(v > 0 ? &a->inf_pos : &a->inf_neg, 1u); return; }
    const unsigned long long b = (unsigned long long)__double_as_longlong(v);
    const int ex = (int)((b >> 52) & 0x7ff);
    unsigned long long m = b & ((1ull << 52) - 1);
    int e = -1074; /* subnormal */
    if (ex) { m |= 1ull << 52; e = ex - 1075; }
    const int p = e + XC_LA_BIAS; /* >= 14 */
    const int i = p >> 5, s = p & 31;
    const unsigned long long lo = m << s, hi = s ? m >> (64 - s) : 0; /* hi < 2^20 */
    const unsigned long long c[3] = {lo & 0xFFFFFFFFull, lo >> 32, hi};
    const bool neg = (b >> 63) != 0;
#pragma unroll
    for (int j = 0; j < 3; j++)
        if (c[j]) atomicAdd(&a->digit[i + j], neg ? 0ull - c[j] : c[j]);
}

static __device__ void xc_emit(const xc_params &k, int64_t r, const xc_out &o) {
    if (k.nll) k.nll[r] = (float)o.nll;
    if (k.logprob) k.logprob[r] = (float)(-o.nll) + 0.0f;
    if (k.lse) k.lse[r] = (float)o.lse;
    if (k.entropy) k.entropy[r] = (float)o.entropy;
    if (k.stats) { k.stats[r].lse = o.lse; k.stats[r].nll = o.nll; }
    if (k.loss_rows) k.loss_rows[r] = (float)o.loss;
    if (k.acc) {
        if (o.counted) {
            atomicAdd(&k.acc->counted, 1ull);
            xc_acc_add(k.acc, o.loss);
        }
        if (o.nonfinite) atomicAdd(&k.acc->nonfinite, 1ull);
    }
}

/* An ignored row whose logits no asked output reads (skip_ignored): loss,
 * nll and log-probability 0, as xc_finish gives them; not counted. */
static __device__ void xc_emit_unread(const xc_params &k, int64_t r) {
    xc_out o;
    o.lse = o.nll = o.entropy = o.loss = 0;
    o.counted = o.nonfinite = 0;
    xc_emit(k, r, o);
}

/* The upstream gradient of row r (before the chain factor). */
__device__ __forceinline__ double xc_row_scale(const xc_params &k, int64_t r) {
    if (k.reduction == XENT_REDUCE_NONE)
        return k.grad_scale * (k.grad_rows ? (double)k.grad_rows[r] : 1.0);
    if (k.reduction == XENT_REDUCE_SUM) return k.grad_scale;
    double n = k.normalizer > 0 ? k.normalizer : (double)k.rec->counted;
    return n > 0 ? k.grad_scale / n : 0.0;
}

/* ------------------------------------------------------------------ */
/* Stores                                                              */
/* ------------------------------------------------------------------ */

/* double -> storage bits, rounded once. */
__device__ __forceinline__ uint32_t xc_bits_of(double v, int dt) {
    if (dt == XENT_BF16) return __bfloat16_as_ushort(__double2bfloat16(v));
    if (dt == XENT_F16) return __half_as_ushort(__double2half(v));
    return __float_as_uint((float)v);
}
__device__ __forceinline__ void xc_store_one(void *row, int64_t j, int dt, uint32_t bits) {
    if (dt == XENT_F32) ((uint32_t *)row)[j] = bits;
    else ((uint16_t *)row)[j] = (uint16_t)bits;
}

/* ------------------------------------------------------------------ */
/* Pass 2: the gradient                                                */
/* ------------------------------------------------------------------ */

#define XC_GM_SHIFT 0
#define XC_GM_WIDE 1
#define XC_GM_SCALED 2
#define XC_GM_FUSED 3

struct xc_gconst {
    int kind;       /* 0 compute, 1 zeros, 2 NaN, 3 zeros but the target    */
    int gm;         /* fast path's form (XC_GM_*)                            */
    float R, c2, b, A, B;  /* fast path: g_j = A 2^((z_j - R) c2 - b) + B   */
    float K;               /* XC_GM_FUSED: R c2 + b, rounded once           */
    double g, lse, A1, E;       /* precise: g * c_j * (A1 p_j - E)          */
    double hm, hL;  /* huge row: raw max and lse - M (xc_out's hm, L), p_j =
                       exp((z_j - hm) / tau - hL); hm NaN: p_j = exp(z'_j - lse) */
    double nll;
    int64_t tl;     /* target column or -1                                  */
    uint32_t tbits; /* target gradient, rounded to the output dtype         */
};

/* The target's gradient (stored bits): g c_t ((1 - eps) (p_t - 1) + eps (p_t
 * - 1/V) + 2 z lse p_t), p_t - 1 = expm1(-nll) without cancellation. */
__device__ __forceinline__ uint32_t xc_target_bits(const xc_params &k, double g, float zt_raw,
                                                   double lse, double nll) {
    double ct = xc_chain(k, (double)zt_raw);
    double pt = exp(-nll);
    double v = g * ct * ((1.0 - k.eps) * expm1(-nll)
                         + k.eps * (pt - 1.0 / (double)k.vocab_total)
                         + 2.0 * k.z_loss * lse * pt);
    return xc_bits_of(v, k.grad_dtype);
}

/* with_target = false: gc.tbits is left 0 (the caller forms it with
 * xc_target_bits from gc.g, gc.lse and gc.nll). g_known: the row's upstream
 * gradient (0 for an ignored row) when the caller has loaded it ahead; NaN:
 * loaded here. */
static __device__ void xc_grad_consts(const xc_params &k, const xc_row &w, double lse,
                               double nll, int nonfinite, float zt_raw,
                               bool fast, xc_gconst &gc, bool with_target = true,
                               double g_known = NAN, double hm = NAN, double hL = 0.0) {
    gc.tl = w.tl;
    gc.hm = hm;
    gc.hL = hL;
    gc.gm = XC_GM_WIDE;
    gc.R = gc.c2 = gc.b = gc.A = gc.B = gc.K = 0.f;
    gc.g = g_known == g_known ? g_known : (w.counted ? xc_row_scale(k, w.r) : 0.0);
    /* ignored rows and a zero upstream gradient: zeros (as the CPU) */
    gc.kind = gc.g == 0 ? 1 : (nonfinite ? 2 : 0);
    gc.lse = lse;
    gc.nll = nll;
    gc.A1 = 1.0 + 2.0 * k.z_loss * lse;
    gc.E = k.eps / (double)k.vocab_total;
    gc.tbits = 0;
    if (gc.kind != 0) return;
    if (w.tl >= 0 && with_target) gc.tbits = xc_target_bits(k, gc.g, zt_raw, lse, nll);
    if (fast) {
        /* p_j = 2^((z_j - R) c2 - b0) with R = lse * tau rounded to fp32:
         * z_j - R is exact for z_j in [R/2, 2R] (the columns that matter). */
        float R = (float)(lse * k.temperature);
        double b0 = (lse - (double)R * k.inv_tau) * XC_LOG2E;
        if (hm == hm) { /* huge row: R = the raw max (exact), b0 from L: no
                           absolute error of the size of |lse| */
            R = (float)hm;
            b0 = hL * XC_LOG2E;
        }
        double A = gc.g * k.inv_tau * gc.A1;
        gc.R = R;
        gc.c2 = (float)(XC_LOG2E / k.temperature);
        if (k.eps == 0) { /* fold |A| into the exponent: no underflow before
                             the final rounding */
            const double L = A == 0 ? 0.0 : log2(fabs(A));
            gc.A = A < 0 ? -1.f : 1.f;
            gc.B = 0.f;
            gc.b = (float)(b0 - L);
            if (A == 0) gc.kind = 3; /* the target still has its value */
            if (A != 0 && L <= 110) {
                /* XC_GM_SHIFT: the exponent raised by s, so that every
                 * value down to bf16's least subnormal (2^-133) is a
                 * normal fp32 2^(y + s) for the flushing exp2, then scaled
                 * back exactly by 2^-s; the largest, 2^(L + s) with a
                 * margin, stays below 2^126 */
                const int s = L <= 54 ? 64 : (int)floor(118 - L);
                gc.gm = XC_GM_SHIFT;
                gc.b = (float)(b0 - L - s);
                gc.A = ldexpf(A < 0 ? -1.f : 1.f, -s);
                /* XC_GM_FUSED: y = z c2 - K in one fma (z c2 exact inside
                 * it), K = R c2 + b rounded once: an absolute error of
                 * 2^-24 |K| <= 2^-16 in y for |K| <= 256 (the usual rows),
                 * relative 2^-16.5 in g, far below bf16's and f16's
                 * half-ulps; larger |K| keeps the exact z - R */
                const double K = (double)gc.R * (double)gc.c2 + (double)gc.b;
                if (fabs(K) <= 256) {
                    gc.gm = XC_GM_FUSED;
                    gc.K = (float)K;
                }
            } else if (A < 0) {
                gc.gm = XC_GM_SCALED;
            }
        } else {
            gc.gm = XC_GM_SCALED;
            gc.b = (float)b0;
            gc.A = (float)A;
            gc.B = (float)(-gc.g * k.inv_tau * gc.E);
        }
    }
}

template <int OUT>
__device__ __forceinline__ uint32_t xc_pack2(float a, float b) {
    if (OUT == XENT_BF16) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint32_t xc_const_bits(int kind, int dt) {
    if (kind == 1 || kind == 3) return 0;
    return dt == XENT_F32 ? 0x7FC00000u : (dt == XENT_BF16 ? 0x7FC0u : 0x7E00u);
}

/* Fast gradient of 8 columns (bf16/f16 output) as 4 packed words, in the
 * row's form GM (gc.gm, one of XC_GM_*):
 *   XC_GM_FUSED   as XC_GM_SHIFT with y = z c2 - K in one fma (|K| <= 256,
 *                 the usual case): 3 instructions per column;
 *   XC_GM_SHIFT   g = 2^y A with the flushing exp2 (y raised by s, A = +-2^-s:
 *                 exact): 4 instructions per column;
 *   XC_GM_WIDE    g = 2^y with the exp2 that keeps subnormals (A = 1);
 *   XC_GM_SCALED  g = fma(2^y, A, B) (label smoothing; a negative scale; a
 *                 scale above 2^110). */
template <int OUT, int GM>
__device__ __forceinline__ uint4 xc_fast_grad8(const xc_gconst &gc, const float z[8]) {
    float g[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float y = GM == XC_GM_FUSED ? fmaf(z[i], gc.c2, -gc.K)
                                          : fmaf(z[i] - gc.R, gc.c2, -gc.b);
        if (GM == XC_GM_SHIFT || GM == XC_GM_FUSED) g[i] = xc_ex2_ftz(y) * gc.A;
        else if (GM == XC_GM_WIDE) g[i] = xc_ex2(y);
        else g[i] = fmaf(xc_ex2(y), gc.A, gc.B);
    }
    uint4 w;
    w.x = xc_pack2<OUT>(g[0], g[1]);
    w.y = xc_pack2<OUT>(g[2], g[3]);
    w.z = xc_pack2<OUT>(g[4], g[5]);
    w.w = xc_pack2<OUT>(g[6], g[7]);
    return w;
}

/* Fast gradient of 8 columns in the row's form gc.gm (for the few chunks
 * of a row that the main loops leave: the slow paths). */
template <int OUT>
__device__ __forceinline__ uint4 xc_fast_grad8_any(const xc_gconst &gc, const float z[8]) {
    if (gc.gm == XC_GM_FUSED) return xc_fast_grad8<OUT, XC_GM_FUSED>(gc, z);
    if (gc.gm == XC_GM_SHIFT) return xc_fast_grad8<OUT, XC_GM_SHIFT>(gc, z);
    if (gc.gm == XC_GM_WIDE) return xc_fast_grad8<OUT, XC_GM_WIDE>(gc, z);
    return xc_fast_grad8<OUT, XC_GM_SCALED>(gc, z);
}

/* Element tk (0..7) of 8 packed 16-bit values set to `bits`; compile-time
 * indices only, so w stays in registers. */
__device__ __forceinline__ void xc_patch16(uint4 &w, int tk, uint32_t bits) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t v = i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
        if (tk == 2 * i) v = (v & 0xFFFF0000u) | bits;
        if (tk == 2 * i + 1) v = (v & 0xFFFFu) | (bits << 16);
        if (i == 0) w.x = v; else if (i == 1) w.y = v;
        else if (i == 2) w.z = v; else w.w = v;
    }
}

#endif
