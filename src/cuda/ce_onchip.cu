/* src/cuda/ce_onchip.cu: the on-chip row kernel. bf16/f16 logits on the
 * fast path (no softcap; gradient bf16/f16 or none), forward (with or
 * without the gradient) and shard statistics, for V up to 16384 by default
 * (one block holds the row; a plan of 2 to 8 blocks a row takes V up to
 * 32768: xent_cuda_set_plan); larger V takes the streaming kernel of
 * ce_stream.cu. The choice and the launch plan are src/cuda/select.cu's.
 *
 * Each row is read from memory once. The row is cut into C slices of whole
 * 8-column chunks (slice q: chunks [q P, (q + 1) P), P = ceil(ceil(V / 8) /
 * C)), one per block of a thread-block cluster (C = 1 by default; 2, 4 or 8
 * when the plan asks); each block copies its slice into shared
 * memory and every later pass reads it there:
 *   pass 0  max over the non-target columns, with packed bf16/f16 max and
 *           min that keep NaN (so they also find NaN and +-inf);
 *   pass 1  the sums against the row's max M, now known (no rebase): terms
 *           equal to M counted apart (each is exactly 1), the others
 *           2^((z - M) c2) with the product's rounding error carried;
 *   pass 2  the gradient, rounded once.
 * With C > 1 the blocks exchange their max (after pass 0) and their sums
 * (after pass 1) through distributed shared memory; every block reads the C
 * values in rank order, so all of them finish the row identically. Thread
 * t owns the chunks t, t + NT, ... of its block's slice from the copy to
 * the gradient and refills a chunk's slot with the next row's chunk as soon
 * as it has used it: the next row's copy overlaps the rest of this row.
 *
 * A row's arithmetic depends on V (through C and NT) and on the row alone:
 * not on T, on the row's position or on its alignment (unaligned rows are
 * copied element by element into the same chunks). docs/cuda.md has the
 * error analysis.
 */
#include "ce_row.h"

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;


/* What a block tells the others after pass 0 (16 bytes) and after pass 1
 * (32 bytes). */
struct xq_msg0 {
    float max;  /* max over the block's non-target columns (-inf: none) */
    float zt;   /* raw target logit, when the block holds the target    */
    int flags;  /* 1: holds the target, 2: saw a NaN/inf logit          */
    int pad;
};
struct xq_msg1 {
    double v[4]; /* top count, rest, SX, ZS */
};

struct xq_shared {
    float fmax[XC_MAX_WARPS];
    double sum[4 * XC_MAX_WARPS];
    /* messages from block b of the cluster, double-buffered by row parity;
     * each buffer completes an mbarrier phase when all C have arrived */
    xq_msg0 rx0[2][8];
    xq_msg1 rx1[2][8];
    uint64_t bar0[2], bar1[2];
    float zt;           /* the target's owner thread -> thread 0        */
    xc_gconst gc;
};

/* ------------------------------------------------------------------ */
/* Messages between the blocks of a cluster: st.async into the         */
/* receiver's shared memory, completing bytes on its mbarrier. No      */
/* cluster-wide barrier (whose release is a GPU-wide memory fence that */
/* would wait for this thread's copies and stores in flight).          */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t xq_saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* Address of the same shared variable in block `rank` of the cluster. */
__device__ __forceinline__ uint32_t xq_remote(uint32_t a, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ void xq_bar_init(uint64_t *b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(xq_saddr(b)) : "memory");
}
/* This block expects `bytes` on barrier b in its current phase. */
__device__ __forceinline__ void xq_bar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;"
                 :: "r"(xq_saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void xq_bar_wait(uint64_t *b, uint32_t parity) {
    const uint32_t a = xq_saddr(b);
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(a), "r"(parity) : "memory");
    }
}
/* 16 bytes to shared address `dst` of block `rank`, completing on that
 * block's barrier `bar` (the same variable as ours). */
__device__ __forceinline__ void xq_send16(uint32_t dst, uint32_t bar, int rank, uint4 v) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], "
                 "{%1, %2, %3, %4}, [%5];"
                 :: "r"(xq_remote(dst, rank)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w),
                    "r"(xq_remote(bar, rank))
                 : "memory");
}

/* ------------------------------------------------------------------ */
/* Copies into shared memory                                           */
/* ------------------------------------------------------------------ */

/* A chunk into *dst with one cp.async (L2 evict-first: read once); `dep`
 * is a value read from *dst before, so the copy cannot be issued before
 * that read has completed. */
__device__ __forceinline__ void xq_cp16(uint4 *dst, const uint16_t *src, uint64_t pol,
                                        uint32_t dep) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                 :: "r"(xq_saddr(dst)), "l"(src), "l"(pol), "r"(dep) : "memory");
}
/* Chunk c of `row` element by element (unaligned rows, the partial last
 * chunk), the columns past V filled with the chunk's first column: a value
 * of the row, which cannot change a max or a min; later passes mask it. */
__device__ __noinline__ void xq_fetch_slow(uint4 *dst, const uint16_t *row, int64_t c,
                                           int64_t V) {
    const int64_t j0 = c * 8;
    uint32_t h[8];
#pragma unroll
    for (int e = 0; e < 8; e++) h[e] = row[j0 + (j0 + e < V ? e : 0)];
    *dst = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16,
                      h[6] | h[7] << 16);
}
/* This thread's chunks of the slice [c0, c0 + nl) of `row` into buf; only
 * the ones cp.async cannot take when fixup (the others were copied while
 * the previous row was used). */
__device__ __forceinline__ void xq_fetch_row(uint4 *buf, const uint16_t *row, int64_t c0,
                                             int nl, int ipart, int64_t V, uint64_t pol,
                                             bool fixup) {
    const bool vec = ((uintptr_t)row & 15) == 0;
    const int NT = blockDim.x;
    if (fixup && vec) {
        if (ipart >= 0 && ipart % NT == (int)threadIdx.x)
            xq_fetch_slow(buf + ipart, row, c0 + ipart, V);
        return;
    }
    const uint16_t *src = row + (c0 + threadIdx.x) * 8;
    for (int i = threadIdx.x; i < nl; i += NT, src += (int64_t)NT * 8) {
        if (vec && i != ipart) xq_cp16(buf + i, src, pol, 0);
        else xq_fetch_slow(buf + i, row, c0 + i, V);
    }
}

__device__ __forceinline__ void xq_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void xq_wait(void) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ------------------------------------------------------------------ */
/* Pass 1 terms                                                        */
/* ------------------------------------------------------------------ */

/* Sums of one thread (fp32, a few dozen terms per lane; docs/cuda.md). */
struct xq_sums {
    float s[4];   /* sum of e = 2^(y), y = fl(x c2), lane j % 4            */
    float c[2];   /* sum of e y_lo (y_lo: what fl(x c2) lost), lane j % 2  */
    float sx[4];  /* EXTRA: sum of e (1 + y_lo ln 2) x                     */
    float ntop;   /* columns equal to M                                    */
    double zs;    /* EXTRA: sum of z                                       */
    double ddx;   /* EXTRA: the careful chunks' sum of e x, in double      */
};

/* One term: column value z (raw), x = z - M exact for bf16/f16. S's
 * lanes are the same with or without EXTRA (so are nll, lse and the
 * log-probability); with EXTRA, SX from the corrected term. */
template <bool EXTRA>
__device__ __forceinline__ void xq_term(xq_sums &a, int e, float x, float c2, float c2lo) {
    float t;
    const float p = xc_term(x, c2, c2lo, t);
    a.s[e & 3] += p;
    a.c[e & 1] = fmaf(p, t, a.c[e & 1]);
    /* p = 0 adds nothing (x may be -inf: two huge logits of either sign) */
    if (EXTRA && p != 0.f) a.sx[e & 3] = fmaf(fmaf(p, t * XC_LN2F, p), x, a.sx[e & 3]);
}

/* The 8 columns of a chunk with none of them special. */
template <class In, bool EXTRA>
__device__ __forceinline__ void xq_sum8(xq_sums &a, const uint4 &v, float m, float c2,
                                        float c2lo) {
    float z[8];
    In::unpack(&v, z);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        if (EXTRA) a.zs += (double)z[e];
        xq_term<EXTRA>(a, e, z[e] - m, c2, c2lo);
    }
}

/* A chunk with the target (column to, else -1), columns past V (nv < 8)
 * or a column equal to M (a few a row): element by element from shared
 * memory, S's term the fast one as in every chunk (lane 0); with EXTRA
 * (entropy, label smoothing) SX's term in double with the CPU's exp
 * (xc_dexp). (Terms in double for S as well held the warp with such a
 * chunk, and the others at the next barrier, 10% on forward-only calls at
 * V = 32000, and would make S depend on whether entropy is asked.) */
template <class In, bool EXTRA>
__device__ __forceinline__ void xq_sum8_careful(xq_sums &a, const uint4 *chunk, float m,
                                                double c1, int nv, int to, float c2,
                                                float c2lo) {
    const typename In::raw *p = (const typename In::raw *)chunk;
#pragma unroll 1
    for (int e = 0; e < nv; e++) {
        const float z = In::one(p + e);
        if (EXTRA) a.zs += (double)z;
        if (e == to) continue;
        if (z == m) { a.ntop += 1.f; continue; }
        xq_term<false>(a, 0, z - m, c2, c2lo); /* lane 0: no indexed registers */
        if (EXTRA) {
            const double x = (double)z - (double)m; /* exact: z - m as before, or
                                                       past FLT_MAX (huge rows) */
            a.ddx = fma(xc_dexp(x * c1), x, a.ddx);
        }
    }
}

extern __shared__ uint4 xq_slice[]; /* [P] this block's chunks of the row */

/* ------------------------------------------------------------------ */
/* Pass 1                                                              */
/* ------------------------------------------------------------------ */

struct xq_p1_args {
    float M, c2, c2lo;     /* the row's max; log2(e) / tau, hi and lo       */
    double inv_tau;
    int nl, ipart, nvpart; /* chunks, the partial one (or -1), its columns */
    int tcl, to;           /* the target's chunk (or -1) and column in it  */
    bool careful;          /* this warp holds a chunk that needs care      */
    const uint16_t *nsrc;  /* the next row's chunk tid                     */
    uint64_t pol;
};

/* This thread's chunks of the slice: the sums against M (LIVE: M is a
 * column's value; else only ZS, for EXTRA); with REFILL each slot gets the
 * next row's chunk once read. LIVE and REFILL are row-uniform, so the loop
 * tests only whether a chunk needs care (warp-uniform, a few a row). */
template <class In, bool EXTRA, bool LIVE, bool REFILL>
__device__ __forceinline__ void xq_pass1(xq_sums &a, const xq_p1_args &p) {
    const int NT = blockDim.x;
    const uint16_t *nsrc = p.nsrc;
#pragma unroll 2
    for (int i = threadIdx.x; i < p.nl; i += NT, nsrc += (int64_t)NT * 8) {
        const uint4 v = xq_slice[i];
        if (LIVE) {
            if (p.careful && (i == p.tcl || i == p.ipart || In::max8(&v) == p.M))
                xq_sum8_careful<In, EXTRA>(a, xq_slice + i, p.M, p.inv_tau,
                                           i == p.ipart ? p.nvpart : 8, i == p.tcl ? p.to : -1,
                                           p.c2, p.c2lo);
            else
                xq_sum8<In, EXTRA>(a, v, p.M, p.c2, p.c2lo);
        } else if (EXTRA) { /* no non-target column: ZS only */
            const typename In::raw *q = (const typename In::raw *)(xq_slice + i);
            const int nv = i == p.ipart ? p.nvpart : 8;
            for (int e = 0; e < nv; e++) a.zs += (double)In::one(q + e);
        }
        if (REFILL && i != p.ipart) xq_cp16(xq_slice + i, nsrc, p.pol, v.x ^ v.w);
    }
}

/* ------------------------------------------------------------------ */
/* Pass 2                                                              */
/* ------------------------------------------------------------------ */

#define XQ_GM_CONST (-1) /* every column the same bits (gc.kind != 0) */

struct xq_pass2_args {
    uint16_t *grow;        /* the slice's gradient, column 0 of chunk 0    */
    const uint16_t *nsrc;  /* the next row's chunk tid                     */
    uint64_t pol;
    int nl, ipart, nvpart; /* chunks, the partial one (or -1), its columns */
    bool vout;             /* grow 16-byte aligned                         */
    bool refill;           /* copy the next row into each slot after use   */
};

/* The gradient of 8 columns of chunk v in the row's form (any). */
template <class In, int OUT>
__device__ __forceinline__ uint4 xq_grad_any(const xc_gconst &gc, const uint4 &v) {
    if (gc.kind != 0) {
        const uint32_t cb = xc_const_bits(gc.kind, OUT), cw = cb | cb << 16;
        return make_uint4(cw, cw, cw, cw);
    }
    float z[8];
    In::unpack(&v, z);
    return xc_fast_grad8_any<OUT>(gc, z);
}

/* The main loop of pass 2: this thread's whole chunks of the slice (the
 * partial last one left out), the gradient in form GM (XC_GM_*, or
 * XQ_GM_CONST) stored 16 bytes at a time; with REFILL each slot gets the
 * next row's chunk once read (the copy waits on a value read from it). No
 * test inside the loop but its bound. */
template <class In, int OUT, int GM, bool REFILL>
__device__ __forceinline__ void xq_pass2_vec(const xc_gconst &gc, const xq_pass2_args &a) {
    const int NT = blockDim.x;
    const int nw = a.ipart >= 0 ? a.nl - 1 : a.nl;
    const uint32_t cb = xc_const_bits(gc.kind, OUT), cw = cb | cb << 16;
    const uint16_t *nsrc = a.nsrc;
#pragma unroll 2
    for (int i = threadIdx.x; i < nw; i += NT, nsrc += (int64_t)NT * 8) {
        const uint4 v = xq_slice[i];
        uint4 g;
        if (GM == XQ_GM_CONST) {
            g = make_uint4(cw, cw, cw, cw);
        } else {
            float z[8];
            In::unpack(&v, z);
            g = xc_fast_grad8<OUT, GM>(gc, z);
        }
        xc_st16(a.grow + (int64_t)i * 8, g, a.pol);
        if (REFILL) xq_cp16(xq_slice + i, nsrc, a.pol, v.x ^ g.x);
    }
}

template <class In, int OUT, bool REFILL>
__device__ __forceinline__ void xq_pass2_form(const xc_gconst &gc, const xq_pass2_args &a) {
    if (gc.kind != 0) xq_pass2_vec<In, OUT, XQ_GM_CONST, REFILL>(gc, a);
    else if (gc.gm == XC_GM_FUSED) xq_pass2_vec<In, OUT, XC_GM_FUSED, REFILL>(gc, a);
    else if (gc.gm == XC_GM_SHIFT) xq_pass2_vec<In, OUT, XC_GM_SHIFT, REFILL>(gc, a);
    else if (gc.gm == XC_GM_WIDE) xq_pass2_vec<In, OUT, XC_GM_WIDE, REFILL>(gc, a);
    else xq_pass2_vec<In, OUT, XC_GM_SCALED, REFILL>(gc, a);
}

/* This thread's chunks of the slice: the main loop when the gradient row
 * is 16-byte aligned, then the partial chunk by its owner; an unaligned
 * gradient row chunk by chunk, column by column. The target's column is
 * written over afterwards by its owner (the caller). */
template <class In, int OUT>
__device__ __forceinline__ void xq_pass2(const xc_gconst &gc, const xq_pass2_args &a) {
    const int NT = blockDim.x, tid = threadIdx.x;
    if (a.vout) {
        if (a.refill) xq_pass2_form<In, OUT, true>(gc, a);
        else xq_pass2_form<In, OUT, false>(gc, a);
    }
    const uint16_t *nsrc = a.nsrc;
    for (int i = tid; i < a.nl; i += NT, nsrc += (int64_t)NT * 8) {
        if (a.vout && i != a.ipart) continue;
        const uint4 v = xq_slice[i];
        const uint4 g = xq_grad_any<In, OUT>(gc, v);
        const uint32_t ws[4] = {g.x, g.y, g.z, g.w};
        const int nv = i == a.ipart ? a.nvpart : 8;
        for (int e = 0; e < nv; e++)
            a.grow[(int64_t)i * 8 + e] = (uint16_t)(ws[e >> 1] >> (16 * (e & 1)));
        if (a.refill && i != a.ipart) xq_cp16(xq_slice + i, nsrc, a.pol, v.x ^ g.x);
    }
}

/* ------------------------------------------------------------------ */
/* The kernel                                                          */
/* ------------------------------------------------------------------ */

template <class In, int OUT, bool EXTRA>
__global__ void __launch_bounds__(XQ_MAX_NT, 3) xq_row_kernel(const xc_params k,
                                                              const int P) {
    __shared__ xq_shared sh;
    if (xc_gate(k)) return; /* every block of every cluster alike */
    cg::cluster_group cl = cg::this_cluster();
    const int C = (int)cl.num_blocks(), q = (int)cl.block_rank();
    const int NT = blockDim.x, tid = threadIdx.x;
    const int64_t ncl = gridDim.x / C, cid = blockIdx.x / C;
    const int64_t nchunk = (k.V + 7) >> 3, c0 = (int64_t)q * P;
    const int nl = (int)(c0 >= nchunk ? 0 : (nchunk - c0 < P ? nchunk - c0 : P));
    /* the slice's partial last chunk (local index), or -1 */
    const int ipart = (k.V & 7) && c0 + nl == nchunk && nl > 0 ? nl - 1 : -1;
    const bool GRAD = OUT != 0;
    const uint64_t pol = xc_policy_first();
    const double c2d = XC_LOG2E * k.inv_tau;
    const float c2 = (float)c2d, c2lo = (float)(c2d - (double)c2);
    const uint16_t *L = (const uint16_t *)k.logits;

    if (tid == 0) {
        for (int i = 0; i < 2; i++) { xq_bar_init(&sh.bar0[i]); xq_bar_init(&sh.bar1[i]); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cl.sync(); /* every block's barriers exist before anyone sends */

    int64_t r = cid;
    uint32_t it = 0; /* rows done by this block: buffer it & 1, phase it >> 1 */
    xc_row wn; /* the next row's label, loaded a row ahead */
    if (r < k.T) {
        xq_fetch_row(xq_slice, L + r * k.ld, c0, nl, ipart, k.V, pol, false);
        xq_commit();
        wn = xc_row_info(k, r);
    }
    for (; r < k.T; r += ncl, it++) {
        const int par = (int)(it & 1);
        const uint32_t ph = (it >> 1) & 1;
        const xc_row w = wn;
        const int64_t rn = r + ncl; /* the next row of this cluster */
        const bool more = rn < k.T;
        if (more) wn = xc_row_info(k, rn);
        const uint16_t *nrow = L + rn * k.ld;
        const bool nvec = ((uintptr_t)nrow & 15) == 0;
        const int tcl = w.tl >= 0 && w.tl / 8 >= c0 && w.tl / 8 < c0 + nl
                            ? (int)(w.tl / 8 - c0) : -1; /* target chunk, local */
        const int to = (int)(w.tl & 7);
        xq_wait();
        /* the next row's chunk i is copied into slot i right after its
         * last use below (cp.async for aligned whole chunks, the rest after
         * the loop) */
        const uint16_t *const nsrc0 = nrow + (c0 + tid) * 8; /* chunk tid of it */

        /* pass 0: max over non-target columns, NaN/inf */
        float mx = -INFINITY;
        int nf = 0;
        {
            uint32_t pmx = In::LOWEST2, pmn = In::HIGHEST2;
#pragma unroll 4
            for (int i = tid; i < nl; i += NT) {
                const uint4 v = xq_slice[i];
                pmx = In::pmax(pmx, In::pmax(In::pmax(v.x, v.y), In::pmax(v.z, v.w)));
                pmn = In::pmin(pmn, In::pmin(In::pmin(v.x, v.y), In::pmin(v.z, v.w)));
            }
            const float a0 = In::lo(pmx), a1 = In::hi(pmx);
            const float b0 = In::lo(pmn), b1 = In::hi(pmn);
            nf = !(isfinite(a0) && isfinite(a1) && isfinite(b0) && isfinite(b1));
            if (tid < nl) mx = fmaxf(a0, a1);
            if (tcl >= 0 && tcl % NT == tid) { /* the target's owner: again without it */
                const typename In::raw *tp = (const typename In::raw *)(xq_slice + tcl);
                sh.zt = In::one(tp + to);
                pmx = In::LOWEST2;
                int ncols = 0;
                for (int i = tid; i < nl; i += NT) {
                    uint4 v = xq_slice[i];
                    const int nv = i == ipart ? (int)(k.V & 7) : 8;
                    ncols += nv;
                    if (i == tcl) { /* the target and the padding (which may copy it) */
                        const uint32_t lw = In::LOWEST2 & 0xFFFFu;
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            if (e == to || e >= nv) xc_patch16(v, e, lw);
                    }
                    pmx = In::pmax(pmx, In::pmax(In::pmax(v.x, v.y), In::pmax(v.z, v.w)));
                }
                mx = ncols > 1 ? fmaxf(In::lo(pmx), In::hi(pmx)) : -INFINITY;
            }
        }
        const float bm = xc_block_max(mx, sh.fmax);
        nf = __syncthreads_or(nf);
        float M, rzt = 0.f;
        int rflags;
        if (C == 1) {
            M = bm;
            rflags = (tcl >= 0 ? 1 : 0) | (nf ? 2 : 0);
            if (tcl >= 0) rzt = sh.zt;
        } else {
            if (tid == 0) {
                xq_bar_expect(&sh.bar0[par], 16u * C);
                const uint4 m = make_uint4(__float_as_uint(bm),
                                           __float_as_uint(tcl >= 0 ? sh.zt : 0.f),
                                           (tcl >= 0 ? 1u : 0u) | (nf ? 2u : 0u), 0u);
                for (int b = 0; b < C; b++)
                    xq_send16(xq_saddr(&sh.rx0[par][q]), xq_saddr(&sh.bar0[par]), b, m);
            }
            xq_bar_wait(&sh.bar0[par], ph); /* the C blocks' maxima are here */
            M = -INFINITY;
            rflags = 0;
            for (int b = 0; b < C; b++) {
                const xq_msg0 o = sh.rx0[par][b];
                M = fmaxf(M, o.max);
                if (o.flags & 1) rzt = o.zt;
                rflags |= o.flags;
            }
        }

        /* pass 1: sums against M (the next row's copy starts here when
         * there is no gradient to write) */
        xq_sums a;
#pragma unroll
        for (int e = 0; e < 4; e++) a.s[e] = a.sx[e] = 0.f;
        a.c[0] = a.c[1] = 0.f;
        a.ntop = 0.f;
        a.zs = a.ddx = 0;
        {
            const bool special = (tcl >= 0 && tcl % NT == tid) ||
                                 (ipart >= 0 && ipart % NT == tid) || (tid < nl && mx == M);
            const bool careful = __any_sync(0xFFFFFFFFu, special); /* warp-uniform */
            const bool live = M != -INFINITY;
            const bool pre = !GRAD && more;
            const xq_p1_args p1 = {M, c2, c2lo, k.inv_tau, nl, ipart, (int)(k.V & 7), tcl, to,
                                   careful, nsrc0, pol};
            if (live) {
                if (pre && nvec) xq_pass1<In, EXTRA, true, true>(a, p1);
                else xq_pass1<In, EXTRA, true, false>(a, p1);
            } else {
                if (pre && nvec) xq_pass1<In, EXTRA, false, true>(a, p1);
                else if (EXTRA) xq_pass1<In, EXTRA, false, false>(a, p1);
            }
            if (pre) {
                xq_fetch_row(xq_slice, nrow, c0, nl, ipart, k.V, pol, true);
                xq_commit();
            }
        }
        double t[4];
        {
            double D = 0, DX = 0;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                D += (double)a.s[e];
                if (EXTRA) DX += (double)a.sx[e];
            }
            D += ((double)a.c[0] + (double)a.c[1]) * XC_LN2;
            DX += a.ddx;
            double v[4] = {(double)a.ntop, D, DX * k.inv_tau, a.zs * k.inv_tau};
            xc_block_row_sums<EXTRA>(v, sh.sum);
            if (tid == 0) {
                if (C == 1) {
                    for (int e = 0; e < 4; e++) t[e] = v[e];
                } else {
                    xq_bar_expect(&sh.bar1[par], 32u * C);
                    uint4 m[2];
                    memcpy(m, v, sizeof m);
                    for (int b = 0; b < C; b++) {
                        const uint32_t dst = xq_saddr(&sh.rx1[par][q]);
                        xq_send16(dst, xq_saddr(&sh.bar1[par]), b, m[0]);
                        xq_send16(dst + 16, xq_saddr(&sh.bar1[par]), b, m[1]);
                    }
                    xq_bar_wait(&sh.bar1[par], ph); /* the C blocks' sums are here */
                    for (int e = 0; e < 4; e++) t[e] = 0;
                    for (int b = 0; b < C; b++)
                        for (int e = 0; e < 4; e++) t[e] += sh.rx1[par][b].v[e];
                }
            }
        }
        if (tid == 0) {
            xent_ce_partial p;
            p.max = (double)M;
            p.sum = M == -INFINITY ? 0.0 : (t[0] - 1.0) + t[1];
            p.sumx = t[2];
            p.zsum = t[3];
            p.target = (rflags & 1) ? (double)rzt : 0.0;
            p.flags = rflags & 3;
            if (k.mode == XC_MODE_PART) {
                if (q == 0) k.partial[r] = p;
            } else if (k.mode == XC_MODE_STAT) {
                if (q == 0) k.rowstat[r] = xc_rowstat_of(p);
            } else {
                const xc_out o = xc_finish(k, w, &p, 1, 0);
                if (q == 0) xc_emit(k, r, o);
                if (GRAD)
                    xc_grad_consts(k, w, o.lse, o.nll, o.nonfinite, rzt, true, sh.gc, false, NAN,
                                   o.hm, o.L);
            }
        }
        if (GRAD) { /* pass 2: the gradient; the next row's copy starts here */
            __syncthreads();
            const xc_gconst gc = sh.gc;
            uint16_t *grow = (uint16_t *)k.grad + r * k.ld_grad + c0 * 8;
            xq_pass2_args a2 = {grow, nsrc0, pol, nl, ipart, (int)(k.V & 7),
                                ((uintptr_t)grow & 15) == 0, more && nvec};
            xq_pass2<In, OUT>(gc, a2);
            /* the target's gradient, by its owner, over what the loop wrote */
            if (tcl >= 0 && tcl % NT == tid && (gc.kind == 0 || gc.kind == 3))
                grow[(int64_t)tcl * 8 + to] =
                    (uint16_t)xc_target_bits(k, gc.g, rzt, gc.lse, gc.nll);
            if (more) {
                xq_fetch_row(xq_slice, nrow, c0, nl, ipart, k.V, pol, true);
                xq_commit();
            }
        }
        /* buffers [par] are written again two rows on, by blocks that have
         * had this block's messages of the next row, which it sends after
         * reading these */
    }
    cl.sync(); /* no block leaves while its messages may be in flight */
}

/* ------------------------------------------------------------------ */
/* Launch                                                              */
/* ------------------------------------------------------------------ */

template <class In, int OUT, bool EXTRA>
static int xq_go(const xc_params *p, const xq_plan_t &pl, cudaStream_t s) {
    void (*kern)(const xc_params, const int) = xq_row_kernel<In, OUT, EXTRA>;
    const size_t smem = (size_t)pl.P * 16;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return (int)e;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)pl.C;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cfg.blockDim = dim3((unsigned)pl.NT);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.gridDim = dim3((unsigned)pl.C);
    int nclusters = 0;
    e = cudaOccupancyMaxActiveClusters(&nclusters, kern, &cfg);
    if (e != cudaSuccess) return (int)e;
    if (nclusters < 1) return (int)cudaErrorInvalidConfiguration;
    if (pl.G && pl.G < nclusters) nclusters = pl.G;
    const int64_t ncl = p->T < nclusters ? p->T : nclusters;
    cfg.gridDim = dim3((unsigned)(ncl * pl.C));
    e = cudaLaunchKernelEx(&cfg, kern, *p, pl.P);
    if (e != cudaSuccess) return (int)e;
    return (int)cudaGetLastError();
}

template <class In>
static int xq_out(const xc_params *p, const xq_plan_t &pl, cudaStream_t s) {
    const int out = (p->grad && p->mode == XC_MODE_FWD) ? p->grad_dtype : 0;
    if (p->extra) {
        if (out == XENT_BF16) return xq_go<In, XENT_BF16, true>(p, pl, s);
        if (out == XENT_F16) return xq_go<In, XENT_F16, true>(p, pl, s);
        return xq_go<In, 0, true>(p, pl, s);
    }
    if (out == XENT_BF16) return xq_go<In, XENT_BF16, false>(p, pl, s);
    if (out == XENT_F16) return xq_go<In, XENT_F16, false>(p, pl, s);
    return xq_go<In, 0, false>(p, pl, s);
}

int xq_launch_rows(const xc_params *p, const xq_plan_t *pl, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (p->in_dtype == XENT_BF16) return xq_out<xc_bf16>(p, *pl, s);
    return xq_out<xc_f16>(p, *pl, s);
}
