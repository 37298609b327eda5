/* src/cuda/ce_stream.cu: cross-entropy kernels on CUDA.
 *
 * One thread block per row (rows loop by gridDim.x); the block size is a
 * function of V (ce_api.cu). A row is cut in chunks of 8 columns; chunk c
 * belongs to thread c % blockDim.x, and each thread visits its chunks in
 * ascending order, so the arithmetic of a row depends only on the row and
 * the block size, never on T, on the row's position or on the row's
 * alignment (unaligned rows load the same 16 bytes of each chunk in other
 * ways: element by element, in naturally aligned pieces, or from the two
 * aligned blocks it straddles; XC_AL_* below). Pass 2's columns do not
 * depend on each other: when the row and its gradient row start at the
 * same offset in their 16-byte blocks, pass 2 cuts its chunks from the
 * row's first aligned column (xc_pass2_vec's head).
 *
 * Pass 1 (one read of the row) keeps, per thread, a running raw maximum m
 * over non-target columns (warp-uniform: taken over the warp each round of
 * 4 chunks per lane, so the rare rescale never diverges), the count of
 * columns equal to m (terms exactly 1, kept apart so that S - 1 has full
 * relative accuracy) and the sums S - 1 = sum exp(z'_j - m') over the
 * others, SX = sum exp(z'_j - m') (z'_j - m') and ZS = sum z'_j, rescaled in
 * double when m grows. The block combines them exactly as xent_ce_combine
 * combines shards (max, then each part scaled by exp(m'_t - M') in double).
 * The row's statistics are finished in double by one thread (xc_finish: the
 * CPU's combine formulas; forward only, by a second kernel, one thread a
 * row, from the statistics left in scratch: xc_launch_rows), and pass 2 (a
 * second read, in reverse order, from shared memory for each thread's
 * first 8 chunks, else from L2 or memory) writes the gradient.
 *
 * Two arithmetic paths (docs/cuda.md has the error analysis):
 *  - fast: no softcap, gradient bf16/f16 or none; bf16/f16 logits, or fp32
 *    logits when p->fast_f32 (the fused LM head). Terms
 *    are 2^((z - m) log2e / tau) with the MUFU exp2 and the product's
 *    rounding error (and, for fp32 logits, the TwoSum error of z - m)
 *    carried to first order, summed in 4 fp32 lanes per thread and
 *    flushed to double at the end of each round and at each new maximum;
 *    the gradient is +-2^((z - R) log2e / tau - b) with the row's scale
 *    folded into b (xc_fast_grad8), then rounded once to bf16/f16; the
 *    target's gradient is formed in double.
 *  - precise: everything else (softcap, fp32 gradient, fp32 logits of the
 *    xent_cuda_* calls): per
 *    element in double with the CPU's exp and tanh forms, rounded once.
 */
#include "ce_pass1.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

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
    if (tk >= 0) xc_take_target(a, z, tk);
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

/* 2^(j/64), j = 0..63, for xc_dexp_term: filled by each row kernel on the
 * precise path from xc_dexp (relative error about 2^-53). */
__shared__ double xc_etab[64];

/* exp(x) of a pass-1 term on the precise path (x < 0, -inf or NaN).
 * n = rint(x 64/ln2) = 64 k + j (0 <= j < 64) by the 1.5 2^52 shift, r =
 * x - n ln2/64 with ln2/64 in two parts and fma (|r| <= ln2/128 + 2^-60),
 * exp(r) by its Taylor polynomial of degree 4 (truncation |r|^5/120
 * e^|r| < 2^-44.5), then 2^(j/64) exp(r) 2^k1 2^k2 (k1 = floor(k/2), so
 * both scales are normal and the one rounding into the subnormals is the
 * last). Relative error below 2^-44 (the truncation, and a few 2^-53 for
 * the table, Horner's and the product's roundings), against xc_dexp's
 * 2^-52, in 11 FP64 operations against 26. The sums it feeds are in double
 * and each output is rounded once to fp32 (2^-24), so the outputs still
 * agree with the CPU's to the last bit but at a rounding boundary. */
__device__ __forceinline__ double xc_dexp_term(double x) {
    const double c = 0x1.71547652b82fep+6;     /* 64 / ln 2 */
    const double l_hi = 0x1.62e42fefa39efp-7;  /* ln 2 / 64, high part */
    const double l_lo = 0x1.abc9e3b39803fp-62; /* the rest */
    const double shift = 0x1.8p52;
    const double xc = x < -745.2 ? -745.2 : x; /* (-inf: exp is 0, below) */
    const double t = fma(xc, c, shift);
    const double n = t - shift; /* exact */
    double r = fma(-n, l_hi, xc);
    r = fma(-n, l_lo, r);
    const double p = fma(fma(fma(fma(1.0 / 24, r, 1.0 / 6), r, 0.5), r, 1.0), r, 1.0);
    const int ni = __double2loint(t); /* n (|n| < 2^17) */
    const int kk = ni >> 6, k1 = kk >> 1, k2 = kk - k1;
    const double s1 = __hiloint2double((k1 + 1023) << 20, 0);
    const double s2 = __hiloint2double((k2 + 1023) << 20, 0);
    const double y = xc_etab[ni & 63] * p * s1 * s2;
    return x < -745.2 ? 0.0 : (x != x ? x : y);
}

/* Sums of one chunk on the precise path (all in double; each term by
 * xc_dexp_term). */
__device__ __forceinline__ void xc_precise_sum(const xc_params &k, xc_acc &a,
                                               const float z[8], int nv, int tk) {
    if (tk >= 0) xc_take_target(a, z, tk);
#pragma unroll 2
    for (int i = 0; i < 8; i++) {
        if (i >= nv) continue;
        a.nf = fmaf(z[i], 0.f, a.nf);
        double zp = xc_tr(k, (double)z[i]);
        if (k.extra) a.ZS += zp;
        if (i == tk || a.m == -INFINITY) continue;
        double x = zp - a.mp;
        if (x == 0) { a.ntop += 1.f; continue; }
        double e = xc_dexp_term(x);
        a.D += e;
        if (k.extra) a.DX += e * x;
    }
}

template <bool PRECISE, bool EXTRA, bool WIDE>
__device__ __forceinline__ void xc_sum(const xc_params &k, xc_acc &a, const float z[8],
                                       int nv, int tk, float cm, float c2, float c2lo) {
    if (PRECISE) xc_precise_sum(k, a, z, nv, tk);
    else xc_fast_sum<EXTRA, WIDE>(a, z, nv, tk, nv < 8 || tk >= 0 || cm == a.m, c2, c2lo);
}

/* Chunk c (8 columns) of a row of fp32 values into 16-byte words: two
 * vector loads when the row is 16-byte aligned, else element by element
 * (rows of 16-bit values: xc_load_round). */
template <class In, bool VEC, bool HINT>
__device__ __forceinline__ void xc_load_chunk(const typename In::raw *row, int64_t c,
                                              uint64_t pol, uint4 b[In::VECS]) {
    const typename In::raw *p = row + c * 8;
    if (VEC) {
#pragma unroll
        for (int v = 0; v < In::VECS; v++)
            b[v] = HINT ? xc_ld16(p + v * (8 / In::VECS), pol) : xc_ld16_once(p + v * (8 / In::VECS));
    } else {
        uint32_t w[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (sizeof(typename In::raw) == 4) w[i] = __float_as_uint(In::one(p + i));
            else w[i] = *(const uint16_t *)(p + i);
        }
        if (In::VECS == 2) {
            b[0] = make_uint4(w[0], w[1], w[2], w[3]);
            b[In::VECS - 1] = make_uint4(w[4], w[5], w[6], w[7]);
        } else {
            b[0] = make_uint4(w[0] | w[1] << 16, w[2] | w[3] << 16, w[4] | w[5] << 16,
                              w[6] | w[7] << 16);
        }
    }
}

/* The chunks c + u NT (u < XC_UNROLL) of a round that exist (all of them
 * when plain) into 16-byte words. 16-bit values: in the row's load form
 * (xc_form_of, the same for the whole row, so the warp takes one branch a
 * round: 0 for an aligned row; ce_device.h), no byte outside the chunk;
 * fp32: xc_load_chunk (VEC: an aligned row). In the build for unaligned
 * rows (XC_AL_PIECES) one pass-1 code serves every row of 16-bit values,
 * aligned or not: with a second code for the unaligned rows, both ran
 * from the instruction cache at once and every unaligned row took longer
 * (H200). */
template <class In, int F, bool HINT>
__device__ __forceinline__ void xc_load_round_f(const typename In::raw *row, int c, int NT,
                                                int nfull, bool plain, uint64_t pol,
                                                uint4 (&b)[XC_UNROLL][In::VECS]) {
#pragma unroll
    for (int u = 0; u < XC_UNROLL; u++) {
        const int cu = c + u * NT;
        if (plain || cu < nfull) b[u][0] = xc_ld16_form<F, HINT>(row + (int64_t)cu * 8, pol);
    }
}
template <class In, bool VEC, bool HINT>
__device__ __forceinline__ void xc_load_round(const typename In::raw *row, int c, int NT,
                                              int nfull, bool plain, int form, uint64_t pol,
                                              uint4 (&b)[XC_UNROLL][In::VECS]) {
    if constexpr (In::VECS == 1 && VEC) {
        if (form == 0) xc_load_round_f<In, 0, HINT>(row, c, NT, nfull, plain, pol, b);
        else if (form == 8) xc_load_round_f<In, 8, HINT>(row, c, NT, nfull, plain, pol, b);
        else if (form == 4) xc_load_round_f<In, 4, HINT>(row, c, NT, nfull, plain, pol, b);
        else if (form == 2) xc_load_round_f<In, 2, HINT>(row, c, NT, nfull, plain, pol, b);
        else xc_load_round_f<In, 6, HINT>(row, c, NT, nfull, plain, pol, b);
    } else {
#pragma unroll
        for (int u = 0; u < XC_UNROLL; u++) {
            const int cu = c + u * NT;
            if (plain || cu < nfull) xc_load_chunk<In, VEC, HINT>(row, cu, pol, b[u]);
        }
    }
}


/* The sums of a round with whole chunks and none holding the target,
 * where this lane holds only its first nu (< XC_UNROLL) chunks: a row's
 * last round. Always the TIES form, which gives the same sums as the
 * other when no column equals the running max (xc_plain_round); the same
 * lanes and order as the careful path of xc_pass1, so the same bits. */
template <class In, bool EXTRA>
__device__ __forceinline__ void xc_part_round(xc_acc &a, const uint4 (&b)[XC_UNROLL][In::VECS],
                                              int nu, float c2, float c2lo) {
#pragma unroll
    for (int u = 0; u < XC_UNROLL; u++) {
        if (u >= nu) break;
        xc_chunk_sums<In, EXTRA, true>(a, b[u], c2, c2lo);
    }
}

/* The chunks of a round (chunk c + u NT in b[u]) whose slot k0 + u is
 * below kcap, into shared memory for pass 2 ([kcap][NT][VECS]). */
template <class In>
__device__ __forceinline__ void xc_stage_round(uint4 *stage, const uint4 (&b)[XC_UNROLL][In::VECS],
                                               int c, int k0, int kcap, int nfull) {
    const int NT = blockDim.x, tid = threadIdx.x;
#pragma unroll
    for (int u = 0; u < XC_UNROLL; u++)
        if (c + u * NT < nfull && k0 + u < kcap)
#pragma unroll
            for (int v = 0; v < In::VECS; v++)
                stage[((k0 + u) * NT + tid) * In::VECS + v] = b[u][v];
}

/* Pass 1 over row `row` for this thread. The loop runs warp by warp: a
 * round loads XC_UNROLL chunks per lane, takes the warp's max over them
 * and rebases (warp-uniformly) before summing, so the rare rebase never
 * diverges within a warp. Chunk c still belongs to thread c % NT and is
 * summed in ascending order. Plain rounds (most of a row) skip the tests
 * per chunk and give the same sums; with a gradient (HINT) so does the
 * row's last round, whole chunks but fewer in some lanes. HINT: keep the
 * row in L2 for pass 2. form, VEC: how the row is loaded (xc_load_round);
 * the first kcap chunks of this thread are kept in shared memory (stage)
 * when VEC. */
template <class In, bool PRECISE, bool EXTRA, bool VEC, bool HINT>
__device__ __forceinline__ void xc_pass1(const xc_params &k, xc_acc &a,
                                         const typename In::raw *row, int64_t tl,
                                         uint4 *stage, int kcap, int form) {
    /* chunk indices fit in int: V < 2^33 (checked on the host) */
    const int nfull = (int)(k.V >> 3), NT = blockDim.x, tid = threadIdx.x, lane = tid & 31;
    const int tc = tl >= 0 ? (int)(tl >> 3) : -1, to = (int)(tl & 7); /* target chunk */
    /* the first slot of the round in which this warp holds the target
     * chunk (thread tc % NT, slot tc / NT), or -1: found once a row */
    const int tk0 = tc >= 0 && (tc % NT) >> 5 == tid >> 5 ? tc / NT / XC_UNROLL * XC_UNROLL : -1;
    const double c2d = XC_LOG2E * k.inv_tau;
    const float c2 = (float)c2d, c2lo = (float)(c2d - (double)c2);
    const uint64_t pol = xc_policy_last();
    int k0 = 0; /* this round's first slot (chunk index c = tid + slot NT) */
    for (int c0 = tid - lane; c0 < nfull; c0 += XC_UNROLL * NT, k0 += XC_UNROLL) {
        /* A plain round (warp-uniform): every lane's chunks are whole and
         * none holds the target */
        const bool full = c0 + (XC_UNROLL - 1) * NT + 31 < nfull;
        const bool plain = !PRECISE && full && k0 != tk0;
        uint4 b[XC_UNROLL][In::VECS];
        xc_load_round<In, VEC, HINT>(row, c0 + lane, NT, nfull, plain, form, pol, b);
        /* keep the first kcap chunks of this thread on chip for pass 2 */
        if (VEC && k0 < kcap) xc_stage_round<In>(stage, b, c0 + lane, k0, kcap, nfull);
        if (plain) {
            /* the max over the lane's 4 chunks, then the warp's; after the
             * rebase, when no lane's max equals the running max, no column
             * of the round is at the max. The terms are those of the loop
             * below, in the same lanes and order (+-inf maxima: below) */
            const float lm = xc_round_max<In, XC_UNROLL>(b);
            const float wm = xc_warp_max(lm);
            if (wm > a.m) xc_rebase<PRECISE, EXTRA>(k, a, wm);
            if (isfinite(a.m)) {
                if (__any_sync(0xFFFFFFFFu, lm == a.m))
                    xc_plain_round<In, EXTRA, true>(a, b, c2, c2lo);
                else
                    xc_plain_round<In, EXTRA, false>(a, b, c2, c2lo);
                xc_flush_lanes<EXTRA>(k, a);
                continue;
            }
        } else if (HINT && !PRECISE && k0 != tk0) {
            /* with a gradient, the row's last round (whole chunks, none the
             * target; this lane holds its first nu): the careful loop's
             * max, rebase and sums below without its tests per chunk, so
             * the same bits; forward + backward 0.5-1.3% faster in place,
             * forward only (its build has no HINT) 2% slower at V = 32000
             * and no faster elsewhere, though the careful loop took 12% of
             * its instructions at V = 128256 (ncu, H200) */
            const int left = nfull - (c0 + lane);
            const int nu = left <= 0                ? 0
                           : left >= XC_UNROLL * NT ? XC_UNROLL
                                                    : (left + NT - 1) / NT;
            float lm = -INFINITY;
#pragma unroll
            for (int u = 0; u < XC_UNROLL; u++)
                if (u < nu) lm = fmaxf(lm, In::max8(b[u]));
            const float wm = xc_warp_max(lm);
            if (wm > a.m) xc_rebase<PRECISE, EXTRA>(k, a, wm);
            if (isfinite(a.m)) {
                xc_part_round<In, EXTRA>(a, b, nu, c2, c2lo);
                xc_flush_lanes<EXTRA>(k, a);
                continue;
            }
        }
        float cmax[XC_UNROLL], wm = -INFINITY;
#pragma unroll
        for (int u = 0; u < XC_UNROLL; u++) {
            int c = c0 + lane + u * NT;
            cmax[u] = -INFINITY;
            if (c < nfull) {
                if (c == tc) {
                    float z[8];
                    In::unpack(b[u], z);
                    cmax[u] = xc_chunk_max(z, 8, to);
                } else {
                    cmax[u] = In::max8(b[u]);
                }
                wm = fmaxf(wm, cmax[u]);
            }
        }
        wm = xc_warp_max(wm);
        if (wm > a.m) xc_rebase<PRECISE, EXTRA>(k, a, wm);
#pragma unroll
        for (int u = 0; u < XC_UNROLL; u++) {
            int c = c0 + lane + u * NT;
            if (c < nfull) {
                float z[8];
                In::unpack(b[u], z);
                xc_sum<PRECISE, EXTRA, In::WIDE>(k, a, z, 8, c == tc ? to : -1, cmax[u], c2, c2lo);
            }
        }
        if (!PRECISE) xc_flush_lanes<EXTRA>(k, a);
    }
    const int nv = (int)(k.V & 7);
    if (nv && nfull % NT == tid) { /* the partial last chunk */
        float z[8];
        xc_load_tail<In>(row, nfull, nv, z);
        int t = nfull == tc ? to : -1;
        float cm = xc_chunk_max(z, nv, t);
        if (cm > a.m) xc_rebase<PRECISE, EXTRA>(k, a, cm);
        xc_sum<PRECISE, EXTRA, In::WIDE>(k, a, z, nv, t, cm, c2, c2lo);
    }
}

/* The chunks of a row in global memory for xc_loose_rounds, loaded as
 * xc_load_round's (form, VEC, HINT: the same), the first kcap chunks of
 * this thread kept in shared memory (stage) when VEC; the partial chunk
 * element by element. */
template <class In, bool VEC, bool HINT>
struct xc_gsrc {
    const typename In::raw *row;
    uint4 *stage;
    int kcap, form;
    uint64_t pol;
    __device__ __forceinline__ void round(int c, int NT, int nfull, bool plain, int k0,
                                          uint4 (&b)[XC_UNROLL][In::VECS]) {
        xc_load_round<In, VEC, HINT>(row, c, NT, nfull, plain, form, pol, b);
        if (VEC && k0 < kcap) xc_stage_round<In>(stage, b, c, k0, kcap, nfull);
    }
    __device__ __forceinline__ void tail(int nfull, int nv, float z[8]) {
        xc_load_tail<In>(row, nfull, nv, z);
    }
};

/* Pass 1 in the loose form over row `row` for this thread: the loads, the
 * rounds and the chunks kept on chip as xc_pass1's (same arguments). */
template <class In, bool VEC, bool HINT>
__device__ __forceinline__ void xc_pass1_loose(const xc_params &k, xc_acc &a,
                                               const typename In::raw *row, int64_t tl,
                                               uint4 *stage, int kcap, int form) {
    xc_gsrc<In, VEC, HINT> src = {row, stage, kcap, form, xc_policy_last()};
    xc_loose_rounds<In>(k, a, src, (int)(k.V >> 3), (int)(k.V & 7), tl, threadIdx.x,
                        blockDim.x);
}

/* ------------------------------------------------------------------ */
/* Pass 2: the gradient                                                */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t xc_precise_grad1(const xc_params &k,
                                                     const xc_gconst &gc, float z) {
    const double zd = z;
    double p = gc.hm == gc.hm ? xc_dexp((zd - gc.hm) * k.inv_tau - gc.hL)
                              : xc_dexp(xc_tr(k, zd) - gc.lse);
    double ch = xc_chain(k, zd);
    return xc_bits_of(gc.g * ch * (gc.A1 * p - gc.E), k.grad_dtype);
}

#define XC_P2U 4 /* chunks loaded together in the vector pass 2 */
#define XC_P2UU 2 /* the same, unaligned rows (two loads a chunk) */

/* Up to XC_P2U of this thread's chunks, slots slot, slot - 1, ... >= lo:
 * all loads issued, then each chunk's gradient stored. Returns the next
 * slot. U: a row (vin false) or gradient row (vout false) that is not
 * 16-byte aligned, 16-bit logits: XC_P2UU chunks, each loaded from the two
 * aligned blocks it straddles (the row's last whole chunk, nfull - 1,
 * element by element: its second block could leave the row) and stored in
 * aligned pieces. */
template <class In, int OUT, int GM, bool ON_CHIP, bool U>
__device__ __forceinline__ int xc_p2_batch(const xc_gconst &gc, const typename In::raw *row,
                                           uint16_t *grow, const uint4 *stage, int slot,
                                           int lo, uint64_t pol, int nfull, bool vin,
                                           bool vout) {
    constexpr int NB = U ? XC_P2UU : XC_P2U;
    const int NT = blockDim.x, tid = threadIdx.x;
    const int n = slot - lo + 1 < NB ? slot - lo + 1 : NB;
    uint4 b[NB][In::VECS];
#pragma unroll
    for (int u = 0; u < NB; u++) {
        if (u >= n) break;
        const int sl = slot - u, c = tid + sl * NT;
        if (ON_CHIP) {
#pragma unroll
            for (int v = 0; v < In::VECS; v++) b[u][v] = stage[(sl * NT + tid) * In::VECS + v];
        } else if (!U || vin) {
#pragma unroll
            for (int v = 0; v < In::VECS; v++)
                b[u][v] = xc_ld16(row + (int64_t)c * 8 + v * (8 / In::VECS), pol);
        } else if (c < nfull - 1) {
            b[u][0] = xc_ld16_u(row + (int64_t)c * 8, pol);
        } else {
            xc_load_chunk<In, false, true>(row, c, pol, b[u]);
        }
    }
#pragma unroll
    for (int u = 0; u < NB; u++) {
        if (u >= n) break;
        float z[8];
        In::unpack(b[u], z);
        const uint4 g = xc_fast_grad8<OUT, GM>(gc, z);
        uint16_t *q = grow + (int64_t)(tid + (slot - u) * NT) * 8;
        if (!U || vout) xc_st16(q, g, pol);
        else xc_st16_u(q, g);
    }
    return slot - n;
}

/* Columns [0, n) (n <= 8) of a row's gradient, element by element. */
template <class In, int OUT, int GM>
__device__ __forceinline__ void xc_p2_elems(const xc_gconst &gc, const typename In::raw *row,
                                            uint16_t *grow, int n) {
    float z[8];
#pragma unroll
    for (int i = 0; i < 8; i++) z[i] = i < n ? In::one(row + i) : 0.f;
    const uint4 w = xc_fast_grad8<OUT, GM>(gc, z);
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    for (int i = 0; i < n; i++) grow[i] = (uint16_t)(ws[i >> 1] >> (16 * (i & 1)));
}

/* Pass 2 on the fast path (16-bit gradient): this thread's whole chunks
 * in reverse order (the most recently read first: likeliest still in L2;
 * then the ones kept in shared memory), XC_P2U loads issued before any is
 * used (U, a row or gradient row not 16-byte aligned: XC_P2UU, nothing
 * from shared memory); the partial last chunk first, element by element;
 * the target's column written over by its owner at the end.
 * head (U false): the row and the gradient row start at the same offset
 * in their 16-byte blocks, and their first head columns (thread NT - 1,
 * element by element) reach the next block: the rest is cut into chunks
 * from there, so that every chunk is 16-byte aligned. Pass 2's columns do
 * not depend on each other, so any cut gives the same bits; pass 1 keeps
 * the row's own chunks (its sums' order). */
template <class In, int OUT, int GM, bool U>
__device__ __forceinline__ void xc_pass2_vec(int64_t V, const xc_gconst &gc,
                                             const typename In::raw *row, uint16_t *grow,
                                             const uint4 *stage, int kcap, bool vin,
                                             bool vout, int head) {
    const int NT = blockDim.x, tid = threadIdx.x;
    int64_t tl = gc.tl;
    if (!U && head) {
        if (tid == NT - 1) {
            xc_p2_elems<In, OUT, GM>(gc, row, grow, head);
            if (tl >= 0 && tl < head) grow[tl] = (uint16_t)gc.tbits;
        }
        row += head;
        grow += head;
        V -= head;
        tl = tl >= head ? tl - head : -1;
    }
    const int nfull = (int)(V >> 3);
    const uint64_t pol = xc_policy_first();
    const int nv = (int)(V & 7);
    if (nv && nfull % NT == tid)
        xc_p2_elems<In, OUT, GM>(gc, row + (int64_t)nfull * 8, grow + (int64_t)nfull * 8, nv);
    int slot = tid < nfull ? (nfull - 1 - tid) / NT : -1; /* this thread's last chunk */
    if constexpr (U) { /* unaligned: nothing kept on chip is used */
        while (slot >= 0)
            slot = xc_p2_batch<In, OUT, GM, false, true>(gc, row, grow, stage, slot, 0, pol,
                                                         nfull, vin, vout);
    } else {
        while (slot >= kcap) /* from global memory (mostly L2) */
            slot = xc_p2_batch<In, OUT, GM, false, false>(gc, row, grow, stage, slot, kcap, pol,
                                                          nfull, vin, vout);
        while (slot >= 0) /* the chunks kept in shared memory */
            slot = xc_p2_batch<In, OUT, GM, true, false>(gc, row, grow, stage, slot, 0, pol,
                                                         nfull, vin, vout);
    }
    if (tl >= 0 && (tl >> 3) % NT == tid) grow[tl] = (uint16_t)gc.tbits;
}

/* xc_pass2_vec in the row's gradient form (vin, vout: the row and the
 * gradient row 16-byte aligned; both when !U; head: xc_pass2_vec) */
template <class In, int OUT, bool U>
__device__ __forceinline__ void xc_pass2_form(int64_t V, const xc_gconst &gc,
                                              const typename In::raw *row, uint16_t *g16,
                                              const uint4 *stage, int kcap, bool vin,
                                              bool vout, int head) {
#define XC_P2V(GM) xc_pass2_vec<In, OUT, GM, U>(V, gc, row, g16, stage, kcap, vin, vout, head)
    if (gc.gm == XC_GM_FUSED) XC_P2V(XC_GM_FUSED);
    else if (gc.gm == XC_GM_SHIFT) XC_P2V(XC_GM_SHIFT);
    else if (gc.gm == XC_GM_WIDE) XC_P2V(XC_GM_WIDE);
    else XC_P2V(XC_GM_SCALED);
#undef XC_P2V
}

/* Pass 2 of a constant row (kind != 0, as xc_gconst.kind: 1 zeros, 2 NaN,
 * 3 zeros but the target's column tl, which gets tbits), this thread's
 * chunks: whole chunks of a 16-byte-aligned gradient row in 16-byte stores
 * (a warp's stores cover whole sectors), the rest and the target's chunk
 * (fp32) element by element. No logit is read. The stored bits are those
 * of the element-by-element stores. */
__device__ __forceinline__ void xc_pass2_const(int64_t V, int kind, int64_t tl, uint32_t tbits,
                                               void *grow, int dt, uint64_t pol) {
    const int nfull = (int)(V >> 3), nchunk = (int)((V + 7) >> 3);
    const int NT = blockDim.x, tid = threadIdx.x;
    const int tc = kind == 3 && tl >= 0 ? (int)(tl >> 3) : -1;
    const uint32_t bits = xc_const_bits(kind, dt);
    const bool vec = ((uintptr_t)grow & 15) == 0;
    const uint32_t w1 = dt == XENT_F32 ? bits : (bits | bits << 16);
    for (int c = tid; c < nchunk; c += NT) {
        const int64_t j0 = (int64_t)c * 8;
        if (vec && c < nfull && (dt != XENT_F32 || c != tc)) {
            uint4 w = make_uint4(w1, w1, w1, w1);
            if (dt == XENT_F32) {
                xc_st16((uint32_t *)grow + j0, w, pol);
                xc_st16((uint32_t *)grow + j0 + 4, w, pol);
            } else {
                if (c == tc) xc_patch16(w, (int)(tl & 7), tbits);
                xc_st16((uint16_t *)grow + j0, w, pol);
            }
            continue;
        }
        const int nv = c < nfull ? 8 : (int)(V & 7);
        for (int i = 0; i < nv; i++)
            xc_store_one(grow, j0 + i, dt, j0 + i == tl && c == tc ? tbits : bits);
    }
}

/* Pass 2 for this thread, chunks in reverse order (the most recently read
 * ones first: they are likeliest still in L2). AL: the host found every
 * row and gradient row 16-byte aligned. */
template <class In, int OUT, bool PRECISE, bool AL>
__device__ __forceinline__ void xc_pass2(const xc_params &k, const xc_gconst &gc,
                                         const typename In::raw *row, void *grow,
                                         const uint4 *stage, int kcap) {
    const int nfull = (int)(k.V >> 3), nchunk = (int)((k.V + 7) >> 3);
    const int NT = blockDim.x, tid = threadIdx.x;
    const int tc = gc.tl >= 0 ? (int)(gc.tl >> 3) : -1, to = (int)(gc.tl & 7);
    const int dt = k.grad_dtype;
    const uint64_t pol = xc_policy_first();
    if (gc.kind != 0) { /* the same bits in every column (ignored rows: zeros) */
        xc_pass2_const(k.V, gc.kind, gc.tl, gc.tbits, grow, dt, pol);
        return;
    }
    const bool vin = AL || ((uintptr_t)row & 15) == 0;
    const bool vout = (AL || ((uintptr_t)grow & 15) == 0) && !PRECISE;
    if (!PRECISE && OUT != 0 && vin && vout) {
        xc_pass2_form<In, OUT, false>(k.V, gc, row, (uint16_t *)grow, stage, kcap, true, true,
                                      0);
        return;
    }
    if constexpr (In::VECS == 1 && !AL) {
        if (!PRECISE && OUT != 0) {
            /* the row and the gradient row at the same offset o (odd V, in
             * place or not): the aligned code from column (16 - o) / 2 on */
            const int o = (int)((uintptr_t)row & 15);
            if (o == (int)((uintptr_t)grow & 15)) {
                const int h = (16 - o) >> 1;
                xc_pass2_form<In, OUT, false>(k.V, gc, row, (uint16_t *)grow, stage, 0, true,
                                              true, k.V < h ? (int)k.V : h);
                return;
            }
            xc_pass2_form<In, OUT, true>(k.V, gc, row, (uint16_t *)grow, stage, 0, vin, vout, 0);
            return;
        }
    }
    /* everything else: the precise path, unaligned fp32 rows */
    if (tid >= nchunk) return;
    int slot = (nchunk - 1 - tid) / NT; /* this thread's last chunk */
    for (int c = tid + slot * NT; c >= 0; c -= NT, slot--) {
        const int nv = c < nfull ? 8 : (int)(k.V & 7);
        const int64_t j0 = (int64_t)c * 8;
        float z[8];
        if (vin && nv == 8) {
            uint4 b[In::VECS];
            if (slot < kcap) {
#pragma unroll
                for (int v = 0; v < In::VECS; v++) b[v] = stage[(slot * NT + tid) * In::VECS + v];
            } else {
#pragma unroll
                for (int v = 0; v < In::VECS; v++)
                    b[v] = xc_ld16(row + j0 + v * (8 / In::VECS), pol);
            }
            In::unpack(b, z);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) z[i] = i < nv ? In::one(row + j0 + i) : 0.f;
        }
        const int tk = c == tc ? to : -1;
        if (!PRECISE && OUT != 0) {
            uint4 w = xc_fast_grad8_any<OUT>(gc, z);
            if (tk >= 0) xc_patch16(w, tk, gc.tbits);
            if (vout && nv == 8) {
                xc_st16((uint16_t *)grow + j0, w, pol);
            } else {
                const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
                for (int i = 0; i < nv; i++)
                    ((uint16_t *)grow)[j0 + i] = (uint16_t)(ws[i >> 1] >> (16 * (i & 1)));
            }
        } else if (PRECISE) {
            for (int i = 0; i < nv; i++) {
                uint32_t bits = i == tk ? gc.tbits : xc_precise_grad1(k, gc, z[i]);
                xc_store_one(grow, j0 + i, dt, bits);
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* The row kernel                                                      */
/* ------------------------------------------------------------------ */

struct xc_shared {
    float fmax[XC_MAX_WARPS];
    double sum[4 * XC_MAX_WARPS];
    float zt;
    xc_gconst gc;
};

/* The row kernel's builds by the rows' alignment (the same sums and bits
 * in each: only the loads and stores differ). XC_AL_ALIGNED: every row and
 * gradient row is 16-byte aligned (checked on the host), so the kernel
 * leaves out the paths for unaligned rows. XC_AL_ANY: aligned rows in
 * 16-byte loads, the others element by element (with a 16-bit gradient
 * on the fast path, every row: xc_one_code). XC_AL_PIECES (16-bit
 * logits, no gradient, some row not aligned): every row in its load form
 * (xc_load_round) by one pass-1 code, 22-25% faster than XC_AL_ANY on
 * such rows, 4-10% slower on aligned ones (H200). */
#define XC_AL_ANY 0
#define XC_AL_ALIGNED 1
#define XC_AL_PIECES 2

/* The build in which every row, aligned or not, runs pass 1 element by
 * element and keeps nothing in shared memory (ONE in xc_row_kernel). */
template <class In, int OUT, bool PRECISE, int AL>
__host__ __device__ constexpr bool xc_one_code() {
    return AL == XC_AL_ANY && OUT != 0 && !PRECISE && In::VECS == 1;
}

/* One row a block (the file's head). PRECISE with OUT != 0 (exact mode,
 * 16-bit logits and gradient): pass 1 on the precise path, pass 2 in the
 * fast form (its gradient is a faithful rounding either way; docs/cuda.md).
 * AL: XC_AL_*, above. */
template <class In, int OUT, bool PRECISE, bool EXTRA, int AL>
__global__ void __launch_bounds__(1024) xc_row_kernel(const xc_params k) {
    constexpr bool P2 = PRECISE && OUT == 0; /* pass 2 on the precise path */
    __shared__ xc_shared sh;
    extern __shared__ uint4 xc_stage[]; /* [kcap][NT][VECS] staged chunks */
    typedef typename In::raw raw;
    if (xc_gate(k)) return;
    if constexpr (PRECISE) {
        for (int i = threadIdx.x; i < 64; i += blockDim.x)
            xc_etab[i] = xc_dexp((double)i * (XC_LN2 / 64));
        __syncthreads();
    }
    for (int64_t r = blockIdx.x; r < k.T; r += gridDim.x) {
        const xc_row w = xc_row_info(k, r);
        const raw *row = (const raw *)k.logits + r * k.ld;
        void *grow = k.grad ? (char *)k.grad + r * k.ld_grad * (k.grad_dtype == XENT_F32 ? 4 : 2)
                            : nullptr;
        if (k.skip_ignored && !w.counted && (k.mode == XC_MODE_FWD || k.mode == XC_MODE_STAT)) {
            /* an ignored row whose logits no asked output reads: loss, nll
             * and log-probability 0 (as xc_finish gives them), a zero
             * gradient; the row is not read (block-uniform branch) */
            if (threadIdx.x == 0) {
                if (k.mode == XC_MODE_STAT) {
                    xc_rowstat z; /* finishes to the same zeros */
                    z.sum = 0;
                    z.max = 0.f;
                    z.target = NAN;
                    k.rowstat[r] = z;
                } else {
                    xc_emit_unread(k, r);
                }
            }
            if (grow) xc_pass2_const(k.V, 1, -1, 0, grow, k.grad_dtype, xc_policy_first());
            continue;
        }
        /* backward from saved stats: a huge row (|lse| above XC_BIG; then
         * |M| or |z'_t| is too, or within log V of it) recomputes its
         * passes 1-2 and the combine below, as the CPU does: {lse, nll}
         * cannot give L = lse - M without cancellation (docs/numerics.md,
         * "Huge logits", 4). Block-uniform: every thread reads lse. */
        const bool bwd = k.mode == XC_MODE_BWD;
        if (bwd && !(fabs(k.in_stats[r].lse) > XC_BIG)) {
            if (threadIdx.x == 0) {
                double lse = k.in_stats[r].lse, nll = k.in_stats[r].nll;
                int nf = w.bad || lse != lse || nll != nll;
                float zt = w.tl >= 0 ? In::one(row + w.tl) : 0.f;
                xc_grad_consts(k, w, lse, nll, nf, zt, !P2, sh.gc);
            }
            __syncthreads();
            const xc_gconst gc = sh.gc;
            xc_pass2<In, OUT, P2, AL == XC_AL_ALIGNED>(k, gc, row, grow, xc_stage, 0);
            __syncthreads();
            continue;
        }
        /* pass 1's loads keep the row in L2 for pass 2 (evict_last) when
         * there is one: a gradient (fast path: OUT != 0) */
        const bool HINT = PRECISE || OUT != 0;
        xc_acc a;
        xc_acc_init(a);
        /* chunks per thread kept in shared memory (aligned rows only: for
         * unaligned rows of 16-bit values it measured 3-5% slower on
         * an H200). ONE: a fast-path call
         * with a 16-bit gradient and some row not aligned (odd V) loads
         * its aligned rows element by element too, nothing kept: one
         * pass-1 code and one pass-2 code for every row, which the
         * instruction cache holds (15% faster at 32768 x 50257 into a
         * buffer, 8% in place, H200) */
        constexpr bool ONE = xc_one_code<In, OUT, PRECISE, AL>();
        const bool vrow = AL == XC_AL_ALIGNED || (!ONE && ((uintptr_t)row & 15) == 0);
        const int kcap = vrow ? (int)(k.stage_bytes / (16 * In::VECS * (int64_t)blockDim.x)) : 0;
        constexpr bool X = EXTRA || PRECISE;
        /* without entropy and smoothing: pass 1 in the loose form */
        constexpr bool LOOSE = !X;
        if constexpr (LOOSE) {
            if constexpr (AL == XC_AL_PIECES && In::VECS == 1)
                xc_pass1_loose<In, true, HINT>(k, a, row, w.tl, xc_stage, kcap,
                                               xc_form_of((uintptr_t)row));
            else if (vrow)
                xc_pass1_loose<In, true, HINT>(k, a, row, w.tl, xc_stage, kcap, 0);
            else
                xc_pass1_loose<In, false, HINT>(k, a, row, w.tl, xc_stage, 0, 0);
        } else if constexpr (AL == XC_AL_PIECES && In::VECS == 1)
            xc_pass1<In, PRECISE, X, true, HINT>(k, a, row, w.tl, xc_stage, kcap,
                                                 xc_form_of((uintptr_t)row));
        else if (vrow)
            xc_pass1<In, PRECISE, X, true, HINT>(k, a, row, w.tl, xc_stage, kcap, 0);
        else
            xc_pass1<In, PRECISE, X, false, HINT>(k, a, row, w.tl, xc_stage, 0, 0);
        if (a.own) sh.zt = a.zt; /* at most one owner; read after barriers */
        /* combine the threads: max, then sums rebased on the max; the
         * columns at the row's max are counted apart (S - 1 exact; in the
         * loose form none is, and a thread's sums are against its
         * reference a.m, not its max a.mt) */
        const float M = xc_block_max(LOOSE ? a.mt : a.m, sh.fmax);
        double v[4]; /* top count, rest, SX, ZS */
        xc_acc_at_max<PRECISE>(k, a, M, v);
        xc_block_row_sums<EXTRA>(v, sh.sum);
        const int nf = __syncthreads_or(xc_acc_nonfinite(a, v)) || M == INFINITY;
        const int own = __syncthreads_or(a.own);
        if (threadIdx.x == 0) {
            const xent_ce_partial p = xc_part_of(M, v, own, sh.zt, nf);
            if (k.mode == XC_MODE_PART) {
                k.partial[r] = p;
            } else if (k.mode == XC_MODE_STAT) {
                k.rowstat[r] = xc_rowstat_of(p);
            } else {
                xc_out o = xc_finish(k, w, &p, 1, 0);
                if (!bwd) xc_emit(k, r, o);
                if (k.grad)
                    xc_grad_consts(k, w, o.lse, o.nll, o.nonfinite, sh.zt, !P2, sh.gc, true, NAN,
                                   o.hm, o.L);
            }
        }
        if ((k.mode == XC_MODE_FWD || bwd) && k.grad) {
            __syncthreads();
            const xc_gconst gc = sh.gc;
            xc_pass2<In, OUT, P2, AL == XC_AL_ALIGNED>(k, gc, row, grow, xc_stage, kcap);
        }
        __syncthreads();
    }
}

/* ------------------------------------------------------------------ */
/* Labels, combine and reductions                                      */
/* ------------------------------------------------------------------ */

/* Counts the rows with a target and finds the error the CPU would report:
 * key prio << 60 | (T - r) << 2 | kind, kind 2 a non-finite grad_rows value
 * (prio 3: the CPU checks every grad_rows value first), 3 a label outside
 * [0, vocab_total) (prio 2), 1 (combine) a row whose target is not claimed
 * by exactly one shard, none for an ignored row (prio 1: checked last);
 * the max key is the first bad row of the first kind checked (T < 2^58:
 * a row holds at least 2 bytes). */
__device__ __forceinline__ unsigned long long xc_bad_key(const xc_params &k, int64_t r,
                                                         unsigned kind) {
    const unsigned long long prio = kind == 2 ? 3 : (kind == 3 ? 2 : 1);
    return prio << 60 | (unsigned long long)(k.T - r) << 2 | kind;
}
__global__ void xc_label_kernel(const xc_params k, xc_label_rec *rec) {
    __shared__ unsigned long long sc[XC_MAX_WARPS], sb[XC_MAX_WARPS];
    unsigned long long cnt = 0, bad = 0;
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < k.T;
         r += (int64_t)gridDim.x * blockDim.x) {
        xc_row w = xc_row_info(k, r);
        cnt += (unsigned long long)w.counted;
        if (k.parts && !w.bad) {
            int owners = 0;
            for (int s = 0; s < k.nshards; s++) owners += k.parts[(int64_t)s * k.T + r].flags & 1;
            if (owners != (w.counted ? 1 : 0)) bad = max(bad, xc_bad_key(k, r, 1));
        }
        if (k.grad_rows && !isfinite(k.grad_rows[r])) bad = max(bad, xc_bad_key(k, r, 2));
        if (w.bad) bad = max(bad, xc_bad_key(k, r, 3));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        cnt += __shfl_xor_sync(0xFFFFFFFFu, cnt, o);
        bad = max(bad, __shfl_xor_sync(0xFFFFFFFFu, bad, o));
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sc[warp] = cnt; sb[warp] = bad; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)(blockDim.x >> 5); i++) { cnt += sc[i]; bad = max(bad, sb[i]); }
        /* integer atomics: the result does not depend on their order */
        if (cnt) atomicAdd(&rec->counted, cnt);
        if (bad) atomicMax(&rec->neg_first_bad, bad);
    }
}

__global__ void xc_combine_kernel(const xc_params k) {
    if (xc_gate(k)) return;
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < k.T;
         r += (int64_t)gridDim.x * blockDim.x) {
        xc_row w = xc_row_info(k, r);
        xc_out o = xc_finish(k, w, k.parts + r, k.nshards, k.T);
        xc_emit(k, r, o);
    }
}

/* Forward only: finishes each row from its 16-byte statistics (STAT mode
 * of the row kernels) with xc_finish, as the row kernel would have. */
__global__ void xc_stat_kernel(const xc_params k) {
    if (xc_gate(k)) return;
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < k.T;
         r += (int64_t)gridDim.x * blockDim.x) {
        const xc_rowstat rs = k.rowstat[r];
        const xent_ce_partial p = xc_partial_of(rs);
        const xc_row w = xc_row_info(k, r);
        const xc_out o = xc_finish(k, w, &p, 1, 0);
        xc_emit(k, r, o);
    }
}

/* The accumulator's exact sum, rounded to double once (round to nearest,
 * ties to even): the digits' carries are propagated into 32-bit digits u
 * and a sign; the top three nonzero digits, shifted so that their leading
 * one is bit 95, give 64 bits whose lowest one is ORed with every bit below
 * them (a sticky bit, far below the double's rounding position), and that
 * 64-bit integer is converted with one rounding and scaled by a power of
 * two (exact but for results below 2^-1022, far below any loss). */
__device__ double xc_acc_value(const xc_long_acc *a) {
    if (a->nan || (a->inf_pos && a->inf_neg)) return NAN;
    if (a->inf_pos) return INFINITY;
    if (a->inf_neg) return -INFINITY;
    uint32_t u[XC_LA_DIGITS];
    long long carry = 0; /* |carry| < 2^32: each counter is below 2^63 in size */
    for (int i = 0; i < XC_LA_DIGITS; i++) {
        const long long d = (long long)a->digit[i];
        const long long lo = (long long)(d & 0xFFFFFFFFll) + (carry & 0xFFFFFFFFll);
        /* d + carry = (d >> 32) 2^32 + (d & M) + carry, carry = (carry >> 32) 2^32 + (carry & M) */
        u[i] = (uint32_t)lo;
        carry = (d >> 32) + (carry >> 32) + (lo >> 32);
    }
    /* carry is now 0 (a sum >= 0) or -1 (below 0: u holds its two's complement) */
    const bool neg = carry < 0;
    if (neg) {
        unsigned long long c = 1;
        for (int i = 0; i < XC_LA_DIGITS; i++) {
            c += (unsigned long long)(uint32_t)~u[i];
            u[i] = (uint32_t)c;
            c >>= 32;
        }
    }
    int h = XC_LA_DIGITS - 1;
    while (h >= 0 && u[h] == 0) h--;
    if (h < 0) return 0.0;
    const uint32_t d1 = h >= 1 ? u[h - 1] : 0, d2 = h >= 2 ? u[h - 2] : 0;
    bool sticky = false;
    for (int i = 0; i < h - 2; i++) sticky |= u[i] != 0;
    const int lz = __clz(u[h]);
    /* W = u[h] d1 d2 (96 bits) << lz: its top 64 bits, and the 32 below */
    const unsigned long long w = ((unsigned long long)u[h] << 32 | d1) << lz |
                                 (lz ? (unsigned long long)d2 >> (32 - lz) : 0);
    const uint32_t below = lz ? d2 << lz : d2;
    const unsigned long long top = w | (sticky || below ? 1ull : 0ull);
    const double v = scalbn(__ull2double_rn(top), 32 * (h - 1) - XC_LA_BIAS - lz);
    return neg ? -v : v;
}

/* The reductions: the accumulator's sum (rounded once), divided for MEAN,
 * and the counts. One thread. */
__global__ void xc_reduce_kernel(const xc_params k, float *loss, int64_t *n_counted,
                                 int64_t *n_nonfinite) {
    const xc_long_acc *a = k.acc;
    if (loss) {
        double l = xc_acc_value(a);
        if (k.reduction == XENT_REDUCE_MEAN) {
            const double nrm = k.normalizer > 0 ? k.normalizer : (double)a->counted;
            l = nrm > 0 ? l / nrm : 0.0;
        }
        *loss = (float)l;
    }
    if (n_counted) *n_counted = (int64_t)a->counted;
    if (n_nonfinite) *n_nonfinite = (int64_t)a->nonfinite;
}

/* ------------------------------------------------------------------ */
/* Launchers                                                           */
/* ------------------------------------------------------------------ */

static int xc_grid(int64_t n) { return (int)(n < (1 << 24) ? n : (1 << 24)); }
/* Blocks of 128 threads, one thread a row (the combine and the finish). */
static int xc_row_grid(int64_t T) { return T > 128 ? xc_grid((T + 127) / 128) : 1; }

/* Every row of the logits and of the gradient (when written) 16-byte
 * aligned: base and leading dimension. */
static int xc_all_aligned(const xc_params *p) {
    const int64_t es = p->in_dtype == XENT_F32 ? 4 : 2;
    if (((uintptr_t)p->logits & 15) || (p->ld * es) % 16) return 0;
    if (p->grad && (p->mode == XC_MODE_FWD || p->mode == XC_MODE_BWD)) {
        const int64_t gs = p->grad_dtype == XENT_F32 ? 4 : 2;
        if (((uintptr_t)p->grad & 15) || (p->ld_grad * gs) % 16) return 0;
    }
    return 1;
}

template <class In, int OUT, bool PRECISE, bool EXTRA, int AL>
static int xc_go_al(const xc_params *p, int block, cudaStream_t s) {
    const bool stage = p->grad && p->mode == XC_MODE_FWD && !xc_one_code<In, OUT, PRECISE, AL>();
    const int pad = stage ? xc_stage_bytes(block, In::VECS > 1) : 0;
    if (pad > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(xc_row_kernel<In, OUT, PRECISE, EXTRA, AL>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, pad);
        if (e != cudaSuccess) return (int)e;
    }
    xc_params q = *p;
    q.stage_bytes = (q.grad && q.mode == XC_MODE_FWD) ? pad : 0;
    xc_row_kernel<In, OUT, PRECISE, EXTRA, AL><<<xc_grid(p->T), block, pad, s>>>(q);
    return (int)cudaGetLastError();
}

/* The build of the row kernel for a call (XC_AL_*): the fast path with a
 * gradient in two, for all rows aligned or not (the one for aligned rows
 * leaves out the unaligned pass 2, whose registers cost the aligned path
 * 3% on an H200); without a gradient, XC_AL_ANY when every row is
 * aligned (the aligned-only build ran 5% more instructions there, and
 * XC_AL_PIECES 3-4% more) and XC_AL_PIECES otherwise (16-bit logits); the
 * precise path in XC_AL_ANY alone. */
template <class In, int OUT, bool PRECISE, bool EXTRA>
static int xc_go(const xc_params *p, int block, cudaStream_t s) {
    if constexpr (!PRECISE && OUT != 0)
        if (xc_all_aligned(p)) return xc_go_al<In, OUT, PRECISE, EXTRA, XC_AL_ALIGNED>(p, block, s);
    if constexpr (!PRECISE && OUT == 0 && In::VECS == 1)
        if (!xc_all_aligned(p)) return xc_go_al<In, OUT, PRECISE, EXTRA, XC_AL_PIECES>(p, block, s);
    return xc_go_al<In, OUT, PRECISE, EXTRA, XC_AL_ANY>(p, block, s);
}

template <class In>
static int xc_fast_out(const xc_params *p, int block, cudaStream_t s) {
    const int out = (p->grad && p->mode != XC_MODE_PART) ? p->grad_dtype : -1;
    if (p->extra) {
        if (out == XENT_BF16) return xc_go<In, XENT_BF16, false, true>(p, block, s);
        if (out == XENT_F16) return xc_go<In, XENT_F16, false, true>(p, block, s);
        return xc_go<In, 0, false, true>(p, block, s);
    }
    if (out == XENT_BF16) return xc_go<In, XENT_BF16, false, false>(p, block, s);
    if (out == XENT_F16) return xc_go<In, XENT_F16, false, false>(p, block, s);
    return xc_go<In, 0, false, false>(p, block, s);
}

/* The streaming kernel, by dtype and options. */
static int xc_stream_rows(const xc_params *p, int block, int fast, cudaStream_t s) {
    if (fast && p->in_dtype == XENT_BF16) return xc_fast_out<xc_bf16>(p, block, s);
    if (fast && p->in_dtype == XENT_F16) return xc_fast_out<xc_f16>(p, block, s);
    if (fast) return xc_fast_out<xc_f32>(p, block, s);
    /* exact mode, 16-bit logits and gradient, no softcap: pass 1 precise,
     * pass 2 in the fast form */
    const int g16 = p->grad && (p->mode == XC_MODE_FWD || p->mode == XC_MODE_BWD) &&
                    (p->grad_dtype == XENT_BF16 || p->grad_dtype == XENT_F16);
    if (p->exact && p->softcap == 0 && g16 && p->in_dtype != XENT_F32) {
        const int bf = p->grad_dtype == XENT_BF16;
        if (p->in_dtype == XENT_BF16)
            return bf ? xc_go<xc_bf16, XENT_BF16, true, true>(p, block, s)
                      : xc_go<xc_bf16, XENT_F16, true, true>(p, block, s);
        return bf ? xc_go<xc_f16, XENT_BF16, true, true>(p, block, s)
                  : xc_go<xc_f16, XENT_F16, true, true>(p, block, s);
    }
    if (p->in_dtype == XENT_F32) return xc_go<xc_f32, 0, true, true>(p, block, s);
    if (p->in_dtype == XENT_BF16) return xc_go<xc_bf16, 0, true, true>(p, block, s);
    return xc_go<xc_f16, 0, true, true>(p, block, s);
}

/* The row kernel that xc_choose_rows picks for p. */
static int xc_any_rows(const xc_params *p, cudaStream_t s) {
    const xc_choice c = xc_choose_rows(p);
    if (c.kernel == XC_K_ONCHIP) return xq_launch_rows(p, &c.oc, s);
    return xc_stream_rows(p, c.block, c.fast, s);
}

int xc_launch_rows(const xc_params *p, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (p->mode == XC_MODE_FWD && !p->grad && p->rowstat) {
        /* forward only, with scratch from the caller: the rows' statistics
         * go there (STAT mode: the same kernel, so the same sums) and one
         * thread a row finishes them (xc_finish: the same arithmetic and
         * bits as the finish inside the row kernels), so that no block
         * waits on one thread's finish in double */
        xc_params q = *p;
        q.mode = XC_MODE_STAT;
        const int e = xc_any_rows(&q, s);
        if (e != 0) return e;
        xc_stat_kernel<<<xc_row_grid(p->T), 128, 0, s>>>(*p);
        return (int)cudaGetLastError();
    }
    return xc_any_rows(p, s);
}

int xc_launch_labels(const xc_params *p, xc_label_rec *rec, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemsetAsync(rec, 0, sizeof *rec, s);
    if (e == cudaSuccess && p->acc) e = cudaMemsetAsync(p->acc, 0, sizeof *p->acc, s);
    if (e != cudaSuccess) return (int)e;
    int64_t blocks = (p->T + 255) / 256;
    if (blocks < 1) blocks = 1;
    if (blocks > 1024) blocks = 1024;
    xc_label_kernel<<<(int)blocks, 256, 0, s>>>(*p, rec);
    return (int)cudaGetLastError();
}

int xc_launch_combine(const xc_params *p, void *stream) {
    xc_combine_kernel<<<xc_row_grid(p->T), 128, 0, (cudaStream_t)stream>>>(*p);
    return (int)cudaGetLastError();
}

int xc_launch_reduce(const xc_params *p, float *loss, int64_t *n_counted,
                     int64_t *n_nonfinite, void *stream) {
    xc_reduce_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(*p, loss, n_counted, n_nonfinite);
    return (int)cudaGetLastError();
}
