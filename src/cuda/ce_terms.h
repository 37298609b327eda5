/* src/cuda/ce_terms.h: pass 1's per-thread accumulators and terms on the
 * fast path, shared by the streaming kernel (ce.cu) and the ring kernel
 * (ce_ring.cu): a running raw max, the columns at it counted apart (terms
 * exactly 1, so that S - 1 keeps full relative accuracy), fp32 lanes
 * flushed into double, and each term's product error carried to first
 * order (docs/cuda.md). */
#ifndef XENT_CUDA_CE_TERMS_H
#define XENT_CUDA_CE_TERMS_H

#include "ce_row.h"

#define XC_UNROLL 4
#define XC_LANES 4 /* fp32 accumulators per thread (fast path) */

/* ------------------------------------------------------------------ */
/* Pass 1 accumulators                                                 */
/* ------------------------------------------------------------------ */

struct xc_acc {
    float m;      /* running raw max over this thread's non-target columns */
    double mp;    /* xc_tr(m)                                             */
    float ntop;   /* columns equal to the max (each term exactly 1)       */
    double D, DX; /* flushed sums of the other terms, relative to m (DX in
                     raw units on the fast path, transformed on precise)  */
    double ZS;    /* sum of z (raw on the fast path, z' on the precise)  */
    float s[XC_LANES], sx[XC_LANES]; /* fast path: fp32 lanes since the
                                        last flush (column j in lane j % 4) */
    float c[2];   /* fast path without EXTRA: sum of e y_lo (lane j % 2)  */
    float nf;     /* NaN once a non-finite logit was seen (the fast path
                     sees most of them as NaN sums instead: xc_fast_sum) */
    float zt;     /* raw target logit (owner thread)                     */
    int own;
};

__device__ __forceinline__ void xc_acc_init(xc_acc &a) {
    a.m = -INFINITY;
    a.mp = -INFINITY;
    a.ntop = 0.f;
    a.D = a.DX = a.ZS = 0;
#pragma unroll
    for (int i = 0; i < XC_LANES; i++) a.s[i] = a.sx[i] = 0.f;
    a.c[0] = a.c[1] = 0.f;
    a.nf = 0.f;
    a.zt = 0.f;
    a.own = 0;
}

/* A new running maximum cm > a.m (warp-uniform in the main loop). The fp32
 * lanes and the columns at the old max (terms exactly 1) join the doubles,
 * rescaled by exp(m' - cm') in double. */
template <bool PRECISE, bool EXTRA>
__device__ __forceinline__ void xc_rebase(const xc_params &k, xc_acc &a, float cm) {
    const double mp = xc_tr(k, (double)cm);
    if (a.m != -INFINITY) {
        double sd = 0, sxd = 0;
        if (!PRECISE) {
#pragma unroll
            for (int i = 0; i < XC_LANES; i++) {
                sd += (double)a.s[i];
                a.s[i] = 0.f;
                if (EXTRA) { sxd += (double)a.sx[i]; a.sx[i] = 0.f; }
            }
            sd += ((double)a.c[0] + (double)a.c[1]) * XC_LN2;
            a.c[0] = a.c[1] = 0.f;
            sxd *= k.inv_tau; /* raw -> transformed units */
        }
        double St = a.D + sd + (double)a.ntop, DXt = a.DX + sxd;
        double delta = a.mp - mp; /* < 0 */
        double f = exp(delta);
        a.D = f * St;
        a.DX = f * (DXt + delta * St);
    }
    a.m = cm;
    a.mp = mp;
    a.ntop = 0.f;
}

/* The fp32 lanes into the doubles, at the end of each round (so a lane
 * never holds more than XC_UNROLL * 8 / XC_LANES = 8 terms, whatever the
 * block size; the e y_lo lanes, a first-order correction, stay). */
template <bool EXTRA>
__device__ __forceinline__ void xc_flush_lanes(const xc_params &k, xc_acc &a) {
    a.D += (double)((a.s[0] + a.s[1]) + (a.s[2] + a.s[3]));
    if (EXTRA) a.DX += (double)((a.sx[0] + a.sx[1]) + (a.sx[2] + a.sx[3])) * k.inv_tau;
#pragma unroll
    for (int i = 0; i < XC_LANES; i++) a.s[i] = a.sx[i] = 0.f;
}

/* Max of a chunk's lanes, leaving out lanes past the row end (i >= nv)
 * and the target (i == tk). */
__device__ __forceinline__ float xc_chunk_max(const float z[8], int nv, int tk) {
    float cm = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < nv && i != tk) cm = fmaxf(cm, z[i]);
    return cm;
}

/* fp32 logits: x = fl(z - m) need not be exact; TwoSum gives its rounding
 * error lo (z - m = x + lo exactly, round-to-nearest, no contraction), and
 * the term carries lo c2 to first order as it carries the product's error.
 * (bf16/f16 logits: z - m is exact in fp32 and lo = 0.) */
__device__ __forceinline__ float xc_term_wide(float z, float m, float x, float c2,
                                              float c2lo, float &ylo) {
    float bb = x - z;
    float lo = (z - (x - bb)) + (-m - bb);
    float y = x * c2;
    ylo = fmaf(x, c2, -y);
    ylo = fmaf(x, c2lo, ylo);
    ylo = fmaf(lo, c2, ylo);
    return xc_ex2_ftz(y);
}

/* Adds a term (e, y_lo) of column i to the lanes: without EXTRA, e and e
 * y_lo apart (S = sum e + ln 2 sum e y_lo, one instruction less per term);
 * with EXTRA the corrected term, which SX also needs. */
template <bool EXTRA>
__device__ __forceinline__ void xc_add_term(xc_acc &a, int i, float e, float ylo, float x) {
    if (EXTRA) {
        const float t = fmaf(e, ylo * XC_LN2F, e);
        a.s[i % XC_LANES] += t;
        a.sx[i % XC_LANES] = fmaf(t, x, a.sx[i % XC_LANES]);
    } else {
        a.s[i % XC_LANES] += e;
        a.c[i & 1] = fmaf(e, ylo, a.c[i & 1]);
    }
}

/* The 8 terms of a chunk with no column masked (the fast path's common
 * case), against the running max a.m (finite). TIES: a column may equal
 * a.m; it is counted apart (ntop), as the careful path of xc_fast_sum
 * does, without a branch; else no column equals a.m. */
template <bool EXTRA, bool WIDE, bool TIES>
__device__ __forceinline__ void xc_fast_sum8(xc_acc &a, const float z[8], float c2,
                                             float c2lo) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float x = z[i] - a.m, ylo;
        float e = WIDE ? xc_term_wide(z[i], a.m, x, c2, c2lo, ylo) : xc_term(x, c2, c2lo, ylo);
        if (TIES && z[i] == a.m) a.ntop += 1.f;
        else xc_add_term<EXTRA>(a, i, e, ylo, x);
    }
}

/* Sums of one chunk on the fast path, against the running max a.m >= cm.
 * careful: lanes masked (past the end or the target) or at the max.
 * WIDE: fp32 logits (see xc_term_wide). Non-finite logits are not tested
 * here one by one: NaN and -inf make the sums NaN (y_lo = NaN), +inf is
 * the max (checked once per row), and so is -inf when every column so far
 * is -inf (flagged below); the target is checked by its owner. */
template <bool EXTRA, bool WIDE>
__device__ __forceinline__ void xc_fast_sum(xc_acc &a, const float z[8], int nv, int tk,
                                            bool careful, float c2, float c2lo) {
    if (EXTRA) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (i < nv) a.ZS += (double)z[i];
    }
    if (tk >= 0) {
        a.own = 1;
        a.zt = z[0];
#pragma unroll
        for (int i = 1; i < 8; i++)
            if (i == tk) a.zt = z[i];
    }
    if (a.m == -INFINITY) { /* every non-target column here is -inf */
        if (nv > (tk >= 0 && tk < nv ? 1 : 0)) a.nf = NAN;
        return;
    }
    if (careful) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (i >= nv || i == tk) continue;
            if (z[i] == a.m) { a.ntop += 1.f; continue; }
            float x = z[i] - a.m, ylo;
            float e = WIDE ? xc_term_wide(z[i], a.m, x, c2, c2lo, ylo) : xc_term(x, c2, c2lo, ylo);
            xc_add_term<EXTRA>(a, i, e, ylo, x);
        }
    } else {
        xc_fast_sum8<EXTRA, WIDE, false>(a, z, c2, c2lo);
    }
}

#endif
