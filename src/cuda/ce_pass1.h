/* src/cuda/ce_pass1.h: pass 1 of the fast path, shared by the streaming
 * kernel (ce_stream.cu) and the group kernel (ce_group.cu): the per-thread
 * accumulators, the terms, the loose form's rounds over a thread's chunks
 * (wherever the chunks come from: a Src type loads them) and a thread's
 * sums rescaled to the row's max for the block's sum. ce_stream.cu's head has the
 * description of the arithmetic; docs/cuda.md the error analysis. */
#ifndef XENT_CUDA_CE_PASS1_H
#define XENT_CUDA_CE_PASS1_H

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
    float mt;     /* loose pass 1: this thread's max over its non-target
                     columns (m is then its reference: xc_loose_ref)     */
    float lim;    /* loose pass 1: m + the rebase threshold              */
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
    a.mt = -INFINITY;
    a.lim = -INFINITY;
}

/* The fast path's fp32 lanes in double: sum e in lane order, then ln 2 sum
 * e y_lo (the one order every caller adds them in, so they agree bitwise). */
__device__ __forceinline__ double xc_lanes_sum(const xc_acc &a) {
    double sd = 0;
#pragma unroll
    for (int i = 0; i < XC_LANES; i++) sd += (double)a.s[i];
    return sd + ((double)a.c[0] + (double)a.c[1]) * XC_LN2;
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
            sd = xc_lanes_sum(a);
#pragma unroll
            for (int i = 0; i < XC_LANES; i++) {
                a.s[i] = 0.f;
                if (EXTRA) { sxd += (double)a.sx[i]; a.sx[i] = 0.f; }
            }
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
    if (x * c2 < -512.f) { ylo = 0.f; return 0.f; } /* as xc_term */
    float bb = x - z;
    float lo = (z - (x - bb)) + (-m - bb);
    float y = x * c2;
    ylo = fmaf(x, c2, -y);
    ylo = fmaf(x, c2lo, ylo);
    ylo = fmaf(lo, c2, ylo);
    return xc_ex2_ftz(y);
}

/* The owner of the target's chunk keeps its raw logit z[tk] (tk >= 0). */
__device__ __forceinline__ void xc_take_target(xc_acc &a, const float z[8], int tk) {
    a.own = 1;
    a.zt = z[0];
#pragma unroll
    for (int i = 1; i < 8; i++)
        if (i == tk) a.zt = z[i];
}

/* Adds a term (e, y_lo) of column i to the lanes: e and e y_lo apart (S =
 * sum e + ln 2 sum e y_lo, one instruction less per term than the
 * corrected term e (1 + y_lo ln 2)), the same with or without EXTRA, so
 * that nll, lse and the log-probability have the same bits whether or not
 * entropy or smoothing is asked; with EXTRA, SX from the corrected term. */
template <bool EXTRA>
__device__ __forceinline__ void xc_add_term(xc_acc &a, int i, float e, float ylo, float x) {
    a.s[i % XC_LANES] += e;
    a.c[i & 1] = fmaf(e, ylo, a.c[i & 1]);
    /* e = 0 adds nothing (x may be -inf: two huge logits of either sign) */
    if (EXTRA && e != 0.f)
        a.sx[i % XC_LANES] = fmaf(fmaf(e, ylo * XC_LN2F, e), x, a.sx[i % XC_LANES]);
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

/* The sums of one whole chunk, not the target's, against a finite running
 * max (TIES: some column may equal it). */
template <class In, bool EXTRA, bool TIES>
__device__ __forceinline__ void xc_chunk_sums(xc_acc &a, const uint4 *v, float c2, float c2lo) {
    float z[8];
    In::unpack(v, z);
    if (EXTRA)
#pragma unroll
        for (int i = 0; i < 8; i++) a.ZS += (double)z[i];
    xc_fast_sum8<EXTRA, In::WIDE, TIES>(a, z, c2, c2lo);
}

/* The sums of a plain round: XC_UNROLL whole chunks, none holding the
 * target. */
template <class In, bool EXTRA, bool TIES>
__device__ __forceinline__ void xc_plain_round(xc_acc &a, const uint4 (&b)[XC_UNROLL][In::VECS],
                                               float c2, float c2lo) {
#pragma unroll
    for (int u = 0; u < XC_UNROLL; u++) xc_chunk_sums<In, EXTRA, TIES>(a, b[u], c2, c2lo);
}

/* The row's partial last chunk (columns 8 nfull + [0, nv)), element by
 * element; zeros past the row. */
template <class In>
__device__ __forceinline__ void xc_load_tail(const typename In::raw *row, int nfull, int nv,
                                             float z[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) z[i] = i < nv ? In::one(row + (int64_t)nfull * 8 + i) : 0.f;
}

/* ------------------------------------------------------------------ */
/* Pass 1 without entropy or smoothing: the loose form                 */
/* ------------------------------------------------------------------ */

/* A call that asks for no entropy and no label smoothing (the fast path's
 * usual case: forward + backward, log-probabilities, shard statistics)
 * needs S = sum_j exp(z'_j - M') to full relative accuracy, not S - 1:
 * nll = softplus(d), d = (M' - z'_t) + log S, has d nll / d S * S / nll =
 * sigmoid(d) / softplus(d) <= 1, so nll's relative error is at most S's
 * (docs/cuda.md). Then no column need be counted apart and the reference
 * against which a thread forms its terms need not be the running max, nor
 * the same in every lane: each thread sums 2^((z - r) c2) against its own
 * reference r, the max of its first columns, and moves r (a rebase, in
 * double, as xc_rebase) only when a column exceeds it by more than
 * XC_LOOSE_LOG2 / c2 (terms below 2^40: the fp32 lanes cannot overflow)
 * or, below 0, comes near 0 (xc_loose_ref). So a round has no warp max,
 * no vote and no ties, and on most rows a thread's first round is its
 * only rebase. The
 * thread's true max over its non-target columns (mt) is kept beside it
 * (the row's statistics report the max). The block then rescales each
 * thread's sum from r to the row's max M in double, as before. */
#define XC_LOOSE_LOG2 40.0

/* The thread's reference after a round whose max over this thread's
 * non-target columns is lm (any: the round held such a column; -inf or
 * NaN then means every one of them was -inf or NaN: a non-finite row,
 * flagged, since no finite reference exists yet to make the sums NaN).
 * thr = XC_LOOSE_LOG2 / c2, cut = thr 2^-12 (raw units). The reference r
 * is chosen so that x = z - r is exact in fp32 for every bf16/f16 z whose
 * term can exceed 1 (z in (r, lim]), as the running max guaranteed for
 * the terms near it: z - r needs at most 24 bits when z and r are within
 * 2^13 of each other in magnitude (f16's 11-bit significands; bf16's 8
 * allow 2^16). r = 0 when |lm| < cut (then x = z); for r >= cut, z <= r
 * + thr is within 1 + 2^12 of r; for r <= -cut the limit is at most -cut
 * (a column above it moves r), so |z| >= cut and |r| / |z| <= max(2, 2
 * thr / cut) = 2^13. Terms below 1 may still round x (as before: by at
 * most 2^-24 |x| on a term e^x, so 0.37 2^-24 of the reference's term).
 * fp32 logits carry the error of x exactly (TwoSum) in any case.
 * WU: the reference is the warp's (every lane calls this together): moved
 * when any lane's lm passes the warp's limit, to the warp's max of lm by
 * the same rules, which concern r alone. */
template <bool WU>
__device__ __forceinline__ void xc_loose_ref(const xc_params &k, xc_acc &a, float lm, float thr,
                                             bool any) {
    if (any && !(lm > -INFINITY)) a.nf = NAN;
    a.mt = fmaxf(a.mt, lm);
    const bool up = WU ? __any_sync(0xFFFFFFFFu, lm > a.lim) : lm > a.lim;
    if (up) {
        const float cut = thr * 0x1p-12f;
        const float l = WU ? xc_warp_max(lm) : lm;
        const float r = fabsf(l) < cut ? 0.f : l;
        xc_rebase<false, false>(k, a, r);
        a.lim = r < 0.f ? fminf(r + thr, -cut) : r + thr;
    }
}

/* The terms of one chunk's columns [0, nv) but tk (the target: its raw
 * logit kept by the owner), against the reference a.m. */
template <bool WIDE>
__device__ __forceinline__ void xc_loose_chunk(xc_acc &a, const float z[8], int nv, int tk,
                                               float c2, float c2lo) {
    if (tk >= 0) xc_take_target(a, z, tk);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= nv || i == tk) continue;
        float x = z[i] - a.m, ylo;
        float e = WIDE ? xc_term_wide(z[i], a.m, x, c2, c2lo, ylo) : xc_term(x, c2, c2lo, ylo);
        xc_add_term<false>(a, i, e, ylo, x);
    }
}

/* The loose rounds' constants, a function of the call alone. */
struct xc_lconst {
    float c2, c2lo, thr; /* log2(e) / tau as float and its error; XC_LOOSE_LOG2 / c2 */
};
__device__ __forceinline__ xc_lconst xc_loose_const(const xc_params &k) {
    const double c2d = XC_LOG2E * k.inv_tau;
    xc_lconst c;
    c.c2 = (float)c2d;
    c.c2lo = (float)(c2d - (double)c.c2);
    c.thr = (float)(XC_LOOSE_LOG2 / c2d);
    return c;
}

/* Pass 1 in the loose form for thread tid of NT, over nfull whole chunks
 * (chunk c is the thread c % NT's, visited in ascending order) and, when nv
 * > 0, a partial last chunk of nv columns (chunk nfull); tl: the target's
 * column among them, or -1. A plain round takes its max on packed pairs,
 * moves the reference if needed and sums its 32 terms with no test; the
 * other rounds (the target's, the last) go chunk by chunk. src loads the
 * chunks: src.round(c, NT, nfull, plain, k0, b) the chunks c + u NT (u <
 * XC_UNROLL) that exist (all of them when plain) into b, this thread's
 * slots k0.. ; src.tail(nfull, nv, z) the partial chunk's columns. WU:
 * every lane of a warp keeps the same reference (xc_loose_ref<true>), so
 * that the warp's sums add in double without a rescale a thread (the group
 * kernel); else each thread its own. */
template <class In, bool WU, class Src>
__device__ __forceinline__ void xc_loose_rounds(const xc_params &k, xc_acc &a, Src &src,
                                                int nfull, int nv, int64_t tl, int tid, int NT,
                                                const xc_lconst &lc) {
    const int lane = tid & 31;
    const int tc = tl >= 0 ? (int)(tl >> 3) : -1, to = (int)(tl & 7);
    const int tk0 = tc >= 0 && (tc % NT) >> 5 == tid >> 5 ? tc / NT / XC_UNROLL * XC_UNROLL : -1;
    const float c2 = lc.c2, c2lo = lc.c2lo, thr = lc.thr;
    int k0 = 0;
    for (int c0 = tid - lane; c0 < nfull; c0 += XC_UNROLL * NT, k0 += XC_UNROLL) {
        const bool full = c0 + (XC_UNROLL - 1) * NT + 31 < nfull;
        const bool plain = full && k0 != tk0;
        uint4 b[XC_UNROLL][In::VECS];
        src.round(c0 + lane, NT, nfull, plain, k0, b);
        if (plain) {
            xc_loose_ref<WU>(k, a, xc_round_max<In, XC_UNROLL>(b), thr, true);
            xc_plain_round<In, false, false>(a, b, c2, c2lo);
        } else {
            float lm = -INFINITY;
            bool any = false;
#pragma unroll
            for (int u = 0; u < XC_UNROLL; u++) {
                const int c = c0 + lane + u * NT;
                if (c >= nfull) continue;
                any = true;
                if (c == tc) {
                    float z[8];
                    In::unpack(b[u], z);
                    lm = fmaxf(lm, xc_chunk_max(z, 8, to));
                } else {
                    lm = fmaxf(lm, In::max8(b[u]));
                }
            }
            xc_loose_ref<WU>(k, a, lm, thr, any);
#pragma unroll
            for (int u = 0; u < XC_UNROLL; u++) {
                const int c = c0 + lane + u * NT;
                if (c >= nfull) continue;
                if (c == tc) {
                    float z[8];
                    In::unpack(b[u], z);
                    xc_loose_chunk<In::WIDE>(a, z, 8, to, c2, c2lo);
                } else {
                    xc_chunk_sums<In, false, false>(a, b[u], c2, c2lo);
                }
            }
        }
        xc_flush_lanes<false>(k, a);
    }
    /* the partial last chunk (WU: its warp takes the reference's step
     * together) */
    if (nv && (WU ? (nfull % NT) >> 5 == tid >> 5 : nfull % NT == tid)) {
        const bool me = nfull % NT == tid;
        float z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (me) src.tail(nfull, nv, z);
        const int t = nfull == tc ? to : -1;
        xc_loose_ref<WU>(k, a, me ? xc_chunk_max(z, nv, t) : -INFINITY, thr,
                         me && nv > (t >= 0 ? 1 : 0));
        if (me) xc_loose_chunk<In::WIDE>(a, z, nv, t, c2, c2lo);
    }
}

template <class In, class Src>
__device__ __forceinline__ void xc_loose_rounds(const xc_params &k, xc_acc &a, Src &src,
                                                int nfull, int nv, int64_t tl, int tid,
                                                int NT) {
    xc_loose_rounds<In, false>(k, a, src, nfull, nv, tl, tid, NT, xc_loose_const(k));
}

/* A thread's sums rescaled to the block's max M (raw; LOOSE: the max over
 * the threads' a.mt, else over their a.m) into {top count, rest, SX, ZS}
 * for the block's sum: the columns at M are counted apart (S - 1 exact; in
 * the loose form none is, and a thread's sums are against its reference
 * a.m, not its max). */
template <bool PRECISE>
__device__ __forceinline__ void xc_acc_at_max(const xc_params &k, xc_acc &a, float M,
                                              double v[4]) {
    const double mt = a.mp, Mp = M == -INFINITY ? -INFINITY : xc_tr(k, (double)M);
    if (!PRECISE) {
        double sxd = 0;
#pragma unroll
        for (int i = 0; i < XC_LANES; i++) sxd += (double)a.sx[i];
        a.D += xc_lanes_sum(a);
        a.DX += sxd * k.inv_tau; /* raw -> transformed units */
        a.ZS = a.ZS * k.inv_tau;
    }
    v[0] = v[1] = v[2] = 0;
    v[3] = a.ZS;
    if (a.m != -INFINITY) {
        const double off = mt - Mp, St = a.D + (double)a.ntop;
        const double f = exp(off);
        if (off == 0) { v[0] = a.ntop; v[1] = a.D; }
        else v[1] = f * St;
        v[2] = f * (a.DX + off * St);
    }
}

/* This thread saw a non-finite logit: a NaN flag (precise path, a column
 * of -inf alone), a NaN sum (fast path), or the target (v: xc_acc_at_max's,
 * after the block's sum). The row's flag also takes an infinite max. */
__device__ __forceinline__ bool xc_acc_nonfinite(const xc_acc &a, const double v[4]) {
    return a.nf != a.nf || v[1] != v[1] || (a.own && !isfinite(a.zt));
}

/* The block's statistics of the row (or of its slice): max M, the block's
 * sums v, the target's raw logit zt when some thread owns it, the flags. */
__device__ __forceinline__ xent_ce_partial xc_part_of(float M, const double v[4], int own,
                                                      float zt, int nf) {
    xent_ce_partial p;
    p.max = (double)M;
    p.sum = M == -INFINITY ? 0.0 : (v[0] - 1.0) + v[1];
    p.sumx = v[2];
    p.zsum = v[3];
    p.target = own ? (double)zt : 0.0;
    p.flags = (own ? 1 : 0) | (nf ? 2 : 0);
    return p;
}

#endif
