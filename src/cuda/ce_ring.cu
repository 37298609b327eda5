/* src/cuda/ce_ring.cu: the ring kernel, rows of 16-bit logits read from
 * memory once (bf16/f16 logits, 16-bit gradient or none, rows 16-byte
 * aligned, no entropy or label smoothing, a row within shared memory plus
 * XR_RT chunks a consumer: V up to 138240). Opt-in (XENT_CUDA_RING=1):
 * slower than the streaming kernel (bench/RESULTS.md, 2026-12-02).
 *
 * One block a multiprocessor (a persistent grid), rows r = blockIdx.x,
 * blockIdx.x + gridDim.x, ...; XR_NC consumer threads and one producer
 * warp. A row's chunks of 8 columns (16 bytes) are held on chip between
 * its two passes:
 *   - the first ns * XR_SEG bytes in shared memory, as ns segments that
 *     the producer fills with the copy engine (cp.async.bulk), each
 *     completing on its `full` mbarrier;
 *   - the rest in the consumers' registers (at most XR_RT chunks each);
 *   - the partial last chunk (V % 8 columns), element by element.
 * Chunk c belongs to consumer c % XR_NC (a segment holds XR_NC chunks, one
 * a consumer), visited in ascending order.
 *
 * While a row is summed, the producer prefetches the block's next row into
 * L2 (cp.async.bulk.prefetch.L2); each segment, once every consumer warp
 * has released it (its `empty` mbarrier), is refilled with the next row's
 * bytes from L2. So memory reads the next row while the consumers sum this
 * one and write its gradient.
 *
 * Per row: a max over the non-target columns (packed pairs, NaN ignored as
 * by fmaxf), the block's max M, then the sums against M with the streaming
 * kernel's terms (ce_terms.h: fp32 lanes flushed to double every 4 chunks,
 * columns equal to M counted apart, product errors carried), the block's
 * sums in a fixed order, the finish in double on one thread (xc_finish)
 * and the gradient (xc_fast_grad8). No rebase: M is known before any term.
 * The arithmetic of a row depends on the row alone (not on T, its position
 * or the block's other rows), and is the same with or without a gradient,
 * so forward-only outputs equal those of the call with a gradient, bit for
 * bit. */
#include "ce_terms.h"

#include <cuda_runtime.h>
#include <stdlib.h>

#define XR_NC 480               /* consumer threads (16 warps in all: 128 registers) */
#define XR_THREADS (XR_NC + 32) /* and the producer warp                   */
#define XR_SEG (XR_NC * 16)     /* bytes a segment: one chunk a consumer   */
#define XR_MAX_SEG 28           /* mbarriers kept (shared memory decides)  */
#define XR_RT 8                 /* chunks a consumer holds in registers    */
#define XR_BAR 1                /* named barrier of the consumers          */
#ifndef XR_RB
#define XR_RB 1 /* 1: the chunks past shared memory held in registers; 0: read again */
#endif
#define XR_G 4                  /* chunks loaded together (a round)         */

struct xr_shared {
    uint64_t full[XR_MAX_SEG], empty[XR_MAX_SEG];
    float fmax[XC_MAX_WARPS];
    double sum[2 * XC_MAX_WARPS];
    float zt;
    xc_gconst gc;
};

/* ------------------------------------------------------------------ */
/* mbarriers and the copy engine                                       */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t xr_saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void xr_bar_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(xr_saddr(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void xr_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(xr_saddr(b)) : "memory");
}
__device__ __forceinline__ void xr_wait(uint64_t *b, uint32_t parity) {
    const uint32_t a = xr_saddr(b);
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(a), "r"(parity) : "memory");
    }
}
/* `bytes` (a multiple of 16) from global src to shared dst, completing on
 * barrier b, which is told to expect them; L2 evict-first (read once). */
__device__ __forceinline__ void xr_copy(void *dst, const void *src, uint32_t bytes,
                                        uint64_t *b, uint64_t pol) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(xr_saddr(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 :: "r"(xr_saddr(dst)), "l"(src), "r"(bytes), "r"(xr_saddr(b)), "l"(pol)
                 : "memory");
}
__device__ __forceinline__ void xr_prefetch(const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void xr_sync(void) {
    asm volatile("bar.sync %0, %1;" :: "n"(XR_BAR), "n"(XR_NC) : "memory");
}
__device__ __forceinline__ uint4 xr_lds16(const uint4 *p) { return *p; }
/* OR of a predicate over the consumers (a barrier) */
__device__ __forceinline__ int xr_or(int v) {
    int r;
    asm volatile("{\n .reg .pred p, q;\n setp.ne.s32 q, %1, 0;\n"
                 " bar.red.or.pred p, %2, %3, q;\n selp.s32 %0, 1, 0, p;\n}"
                 : "=r"(r) : "r"(v), "n"(XR_BAR), "n"(XR_NC) : "memory");
    return r;
}

/* ------------------------------------------------------------------ */
/* The consumers' reductions (fixed shapes: results do not depend on   */
/* timing)                                                             */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ float xr_max(float v, xr_shared &sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh.fmax[warp] = v;
    xr_sync();
    float r = lane < XR_NC / 32 ? sh.fmax[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r = fmaxf(r, __shfl_xor_sync(0xFFFFFFFFu, r, o));
    return r;
}
/* v[0], v[1] summed over the consumers: a butterfly in each warp, then
 * the warps' sums in a butterfly. sh.sum may be reused after the next
 * xr_sync. */
__device__ __forceinline__ void xr_sum2(double v[2], xr_shared &sh) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xFFFFFFFFu, v[i], o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sh.sum[warp] = v[0]; sh.sum[XC_MAX_WARPS + warp] = v[1]; }
    xr_sync();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        double r = lane < XR_NC / 32 ? sh.sum[i * XC_MAX_WARPS + lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xFFFFFFFFu, r, o);
        v[i] = r;
    }
}

/* ------------------------------------------------------------------ */
/* The kernel                                                          */
/* ------------------------------------------------------------------ */

/* Where a row lives: ns segments (the last may be short) hold chunks
 * [0, cs); the consumers' registers [cs, nfull). */
struct xr_plan {
    int nfull, cs, ns, rt;
    int pf; /* prefetch of the next row into L2: 0 none, 1 the registers' part, 2 all */
};

__device__ __forceinline__ uint32_t xr_seg_bytes(const xr_plan &pl, int s) {
    const int n = pl.cs - s * XR_NC;
    return (uint32_t)(n < XR_NC ? n : XR_NC) * 16u;
}

/* The producer: for each row of the block, segment s refilled once the
 * consumers released it for the previous row; then the next row
 * prefetched into L2 (the segments' bytes and the registers'). */
template <class In>
__device__ void xr_produce(const xc_params &k, const xr_plan &pl, uint4 *seg, xr_shared &sh) {
    typedef typename In::raw raw;
    const uint64_t pol = xc_policy_first();
    const int64_t G = gridDim.x;
    uint32_t it = 0;
    for (int64_t r = blockIdx.x; r < k.T; r += G, it++) {
        const raw *row = (const raw *)k.logits + r * k.ld;
        for (int s = 0; s < pl.ns; s++) {
            if (it > 0) xr_wait(&sh.empty[s], (it - 1) & 1);
            xr_copy(seg + (int64_t)s * XR_NC, row + (int64_t)s * XR_NC * 8, xr_seg_bytes(pl, s),
                    &sh.full[s], pol);
        }
        if (r + G < k.T && pl.pf) {
            const char *nx = (const char *)((const raw *)k.logits + (r + G) * k.ld);
            const int64_t bytes = (int64_t)pl.nfull * 16;
            for (int64_t o = pl.pf == 1 ? (int64_t)pl.cs * 16 : 0; o < bytes; o += 65536)
                xr_prefetch(nx + o, (uint32_t)(bytes - o < 65536 ? bytes - o : 65536));
        }
    }
}

/* Max over one chunk's non-target columns (tk: the target's column in
 * the chunk, or -1), packed pairs: folded into m2. */
template <class In>
__device__ __forceinline__ void xr_max_chunk(uint32_t &m2, float &ms, const uint4 &b, int tk) {
    if (tk < 0) {
        m2 = In::maxw(In::maxw(m2, In::maxw(b.x, b.y)), In::maxw(b.z, b.w));
    } else {
        float z[8];
        In::unpack(&b, z);
        ms = fmaxf(ms, xc_chunk_max(z, 8, tk));
    }
}

/* The sums of one whole chunk against the row's max a.m: chunk by chunk
 * (careful) for the target's chunk or a row whose max is not finite; else
 * the plain terms, counting columns equal to a.m apart when ties (a
 * warp-uniform flag: some lane's max is the row's). */
template <class In>
__device__ __forceinline__ void xr_sum_chunk(xc_acc &a, const uint4 &b, int tk, bool fin,
                                             bool ties, float c2, float c2lo) {
    float z[8];
    In::unpack(&b, z);
    if (tk >= 0 || !fin) xc_fast_sum<false, false>(a, z, 8, tk, true, c2, c2lo);
    else if (ties) xc_fast_sum8<false, false, true>(a, z, c2, c2lo);
    else xc_fast_sum8<false, false, false>(a, z, c2, c2lo);
}

/* Pass 2 over this consumer's chunks in form GM: the segments first (each
 * released to the producer once the warp is done with it), then the
 * registers. */
template <class In, int OUT, int GM>
__device__ __forceinline__ void xr_grad(const xc_gconst &gc, const xr_plan &pl,
                                        const uint4 *seg, const uint4 (&rb)[XR_RT],
                                        uint16_t *grow, xr_shared &sh, uint64_t pol) {
    const int tid = threadIdx.x, lane = tid & 31;
    const uint4 cst = make_uint4(0, 0, 0, 0);
    const uint32_t cb = gc.kind == 2 ? (xc_const_bits(2, OUT) * 0x10001u) : 0u;
    const uint4 cw = gc.kind == 2 ? make_uint4(cb, cb, cb, cb) : cst;
    for (int s0 = 0; s0 < pl.ns; s0 += XR_G) {
        uint4 b[XR_G];
#pragma unroll
        for (int u = 0; u < XR_G; u++) {
            const int c = tid + (s0 + u) * XR_NC;
            if (s0 + u < pl.ns && c < pl.cs && gc.kind == 0) b[u] = xr_lds16(seg + c);
        }
#pragma unroll
        for (int u = 0; u < XR_G; u++) {
            const int c = tid + (s0 + u) * XR_NC;
            if (s0 + u < pl.ns && c < pl.cs) {
                uint4 g = cw;
                if (gc.kind == 0) {
                    float z[8];
                    In::unpack(&b[u], z);
                    g = xc_fast_grad8<OUT, GM>(gc, z);
                }
                xc_st16(grow + (int64_t)c * 8, g, pol);
            }
        }
        __syncwarp();
        if (lane == 0)
            for (int u = 0; u < XR_G && s0 + u < pl.ns; u++) xr_arrive(&sh.empty[s0 + u]);
    }
    /* the chunks held in registers */
#pragma unroll
    for (int j = 0; j < XR_RT; j++) {
        const int c = pl.cs + tid + j * XR_NC;
        if (j < pl.rt && c < pl.nfull) {
            uint4 g = cw;
            if (gc.kind == 0) {
                float z[8];
                In::unpack(&rb[j], z);
                g = xc_fast_grad8<OUT, GM>(gc, z);
            }
            xc_st16(grow + (int64_t)c * 8, g, pol);
        }
    }
}

/* The row's outputs and (grad) its gradient's constants, on one thread:
 * out of line, so that the registers live across it stay in the hot loops */
static __device__ __forceinline__ void xr_finish_row(const xc_params &k, const xc_row &w,
                                                  const xent_ce_partial &p, bool grad,
                                                  xc_gconst &gc) {
    const xc_out o = xc_finish(k, w, &p, 1, 0);
    xc_emit(k, w.r, o);
    if (grad) xc_grad_consts(k, w, o.lse, o.nll, o.nonfinite, (float)p.target, true, gc);
}

template <class In, int OUT>
__global__ void __launch_bounds__(XR_THREADS, 1) xr_row_kernel(const xc_params k, xr_plan pl) {
    __shared__ xr_shared sh;
    extern __shared__ uint4 xr_seg[]; /* [ns][XR_NC] chunks */
    typedef typename In::raw raw;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < pl.ns; s++) {
            xr_bar_init(&sh.full[s], 1);
            xr_bar_init(&sh.empty[s], XR_NC / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid >= XR_NC) {
        if (tid == XR_NC) xr_produce<In>(k, pl, xr_seg, sh);
        return;
    }
    const uint64_t pfirst = xc_policy_first(), plast = xc_policy_last();
    const double c2d = XC_LOG2E * k.inv_tau;
    const float c2 = (float)c2d, c2lo = (float)(c2d - (double)c2);
    const int nv = (int)(k.V & 7);
    const int own_part = nv && pl.nfull % XR_NC == tid; /* the partial chunk */
    uint32_t it = 0;
    for (int64_t r = blockIdx.x; r < k.T; r += gridDim.x, it++) {
        const xc_row w = xc_row_info(k, r);
        const raw *row = (const raw *)k.logits + r * k.ld;
        const int tc = w.tl >= 0 ? (int)(w.tl >> 3) : -1, to = (int)(w.tl & 7);
        /* the chunks held in registers, loaded first (from L2: prefetched) */
        uint4 rb[XR_RB ? XR_RT : 1];
        if constexpr (XR_RB) {
#pragma unroll
            for (int j = 0; j < XR_RT; j++) {
                const int c = pl.cs + tid + j * XR_NC;
                if (j < pl.rt && c < pl.nfull) rb[j] = xc_ld16(row + (int64_t)c * 8, pfirst);
            }
        }
        float zp[8]; /* the partial chunk, columns past V at -inf */
        if (own_part) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                zp[i] = i < nv ? In::one(row + (int64_t)pl.nfull * 8 + i) : -INFINITY;
        }
        /* the max over non-target columns */
        uint32_t m2 = In::maxw(0xFFFFFFFFu, 0xFFFFFFFFu); /* NaN pairs: ignored */
        float ms = -INFINITY;
        for (int s0 = 0; s0 < pl.ns; s0 += XR_G) {
            uint4 b[XR_G];
#pragma unroll
            for (int u = 0; u < XR_G; u++) {
                const int c = tid + (s0 + u) * XR_NC;
                if (s0 + u < pl.ns) xr_wait(&sh.full[s0 + u], it & 1);
                if (s0 + u < pl.ns && c < pl.cs) b[u] = xr_lds16(xr_seg + c);
            }
#pragma unroll
            for (int u = 0; u < XR_G; u++) {
                const int c = tid + (s0 + u) * XR_NC;
                if (s0 + u < pl.ns && c < pl.cs) xr_max_chunk<In>(m2, ms, b[u], c == tc ? to : -1);
            }
        }
        if constexpr (XR_RB) {
#pragma unroll
            for (int j = 0; j < XR_RT; j++) {
                const int c = pl.cs + tid + j * XR_NC;
                if (j < pl.rt && c < pl.nfull) xr_max_chunk<In>(m2, ms, rb[j], c == tc ? to : -1);
            }
        } else {
            for (int j0 = 0; j0 < pl.rt; j0 += XR_G) {
                uint4 b[XR_G];
#pragma unroll
                for (int u = 0; u < XR_G; u++) {
                    const int c = pl.cs + tid + (j0 + u) * XR_NC;
                    if (j0 + u < pl.rt && c < pl.nfull) b[u] = xc_ld16(row + (int64_t)c * 8, plast);
                }
#pragma unroll
                for (int u = 0; u < XR_G; u++) {
                    const int c = pl.cs + tid + (j0 + u) * XR_NC;
                    if (j0 + u < pl.rt && c < pl.nfull) xr_max_chunk<In>(m2, ms, b[u], c == tc ? to : -1);
                }
            }
        }
        if (own_part) ms = fmaxf(ms, xc_chunk_max(zp, nv, pl.nfull == tc ? to : -1));
        const float tmax = fmaxf(ms, fmaxf(In::lo(m2), In::hi(m2)));
        const float M = xr_max(tmax, sh);
        /* the sums against M: careful chunks when a column may equal M (a
         * consumer whose max is M) or M is not finite */
        xc_acc a;
        xc_acc_init(a);
        if (M != -INFINITY) { a.m = M; a.mp = xc_tr(k, (double)M); }
        const bool fin = isfinite(M), ties = __any_sync(0xFFFFFFFFu, tmax == M);
        for (int s0 = 0; s0 < pl.ns; s0 += XR_G) {
            uint4 b[XR_G];
#pragma unroll
            for (int u = 0; u < XR_G; u++) {
                const int c = tid + (s0 + u) * XR_NC;
                if (s0 + u < pl.ns && c < pl.cs) b[u] = xr_lds16(xr_seg + c);
            }
#pragma unroll
            for (int u = 0; u < XR_G; u++) {
                const int c = tid + (s0 + u) * XR_NC;
                if (s0 + u < pl.ns && c < pl.cs)
                    xr_sum_chunk<In>(a, b[u], c == tc ? to : -1, fin, ties, c2, c2lo);
            }
            xc_flush_lanes<false>(k, a);
            if (OUT == 0) { /* no gradient: the segments are free now */
                __syncwarp();
                if ((tid & 31) == 0)
                    for (int u = 0; u < XR_G && s0 + u < pl.ns; u++) xr_arrive(&sh.empty[s0 + u]);
            }
        }
        if constexpr (XR_RB) {
#pragma unroll
            for (int j0 = 0; j0 < XR_RT; j0 += XR_G) {
                if (j0 >= pl.rt) break;
#pragma unroll
                for (int j = j0; j < j0 + XR_G; j++) {
                    const int c = pl.cs + tid + j * XR_NC;
                    if (j < pl.rt && c < pl.nfull)
                        xr_sum_chunk<In>(a, rb[j], c == tc ? to : -1, fin, ties, c2, c2lo);
                }
                xc_flush_lanes<false>(k, a);
            }
        } else {
            for (int j0 = 0; j0 < pl.rt; j0 += XR_G) {
                uint4 b[XR_G];
#pragma unroll
                for (int u = 0; u < XR_G; u++) {
                    const int c = pl.cs + tid + (j0 + u) * XR_NC;
                    if (j0 + u < pl.rt && c < pl.nfull) b[u] = xc_ld16(row + (int64_t)c * 8, plast);
                }
#pragma unroll
                for (int u = 0; u < XR_G; u++) {
                    const int c = pl.cs + tid + (j0 + u) * XR_NC;
                    if (j0 + u < pl.rt && c < pl.nfull)
                        xr_sum_chunk<In>(a, b[u], c == tc ? to : -1, fin, ties, c2, c2lo);
                }
                xc_flush_lanes<false>(k, a);
            }
        }
        if (own_part) {
            float z[8];
#pragma unroll
            for (int i = 0; i < 8; i++) z[i] = i < nv ? zp[i] : 0.f;
            xc_fast_sum<false, false>(a, z, nv, pl.nfull == tc ? to : -1, true, c2, c2lo);
        }
        if (a.own) sh.zt = a.zt;
        double v[2] = {a.ntop, a.D};
        {
            double sd = 0;
#pragma unroll
            for (int i = 0; i < XC_LANES; i++) sd += (double)a.s[i];
            sd += ((double)a.c[0] + (double)a.c[1]) * XC_LN2;
            v[1] += sd;
        }
        xr_sum2(v, sh);
        /* non-finite logits: a NaN flag (a column of -inf alone), a NaN
         * sum, an infinite max, the target */
        const int nf = xr_or(a.nf != a.nf || (a.own && !isfinite(a.zt))) || v[1] != v[1] ||
                       M == INFINITY;
        const int own = xr_or(a.own);
        if (tid == 0) {
            xent_ce_partial p;
            p.max = (double)M;
            p.sum = M == -INFINITY ? 0.0 : (v[0] - 1.0) + v[1];
            p.sumx = 0;
            p.zsum = 0;
            p.target = own ? (double)sh.zt : 0.0;
            p.flags = (own ? 1 : 0) | (nf ? 2 : 0);
            if (k.mode == XC_MODE_STAT) k.rowstat[r] = xc_rowstat_of(p);
            else xr_finish_row(k, w, p, OUT != 0, sh.gc);
        }
        if constexpr (OUT != 0) {
            xr_sync();
            const xc_gconst gc = sh.gc;
            uint16_t *grow = (uint16_t *)k.grad + r * k.ld_grad;
#define XR_GRAD(GM) xr_grad<In, OUT, GM>(gc, pl, xr_seg, rb, grow, sh, pfirst)
            if (gc.gm == XC_GM_FUSED) XR_GRAD(XC_GM_FUSED);
            else if (gc.gm == XC_GM_SHIFT) XR_GRAD(XC_GM_SHIFT);
            else if (gc.gm == XC_GM_WIDE) XR_GRAD(XC_GM_WIDE);
            else XR_GRAD(XC_GM_SCALED);
#undef XR_GRAD
            if (own_part) {
                float z[8];
#pragma unroll
                for (int i = 0; i < 8; i++) z[i] = i < nv ? zp[i] : 0.f;
                const uint32_t cb = gc.kind == 2 ? xc_const_bits(2, OUT) : 0u;
                const uint4 g = gc.kind == 0 ? xc_fast_grad8_any<OUT>(gc, z)
                                             : make_uint4(cb | cb << 16, cb | cb << 16,
                                                          cb | cb << 16, cb | cb << 16);
                const uint32_t ws[4] = {g.x, g.y, g.z, g.w};
                const int64_t j0 = (int64_t)pl.nfull * 8;
                for (int i = 0; i < nv; i++) grow[j0 + i] = (uint16_t)(ws[i >> 1] >> (16 * (i & 1)));
            }
            if ((gc.kind == 0 || gc.kind == 3) && gc.tl >= 0 && (gc.tl >> 3) % XR_NC == tid)
                grow[gc.tl] = (uint16_t)gc.tbits;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Launcher                                                            */
/* ------------------------------------------------------------------ */

/* XENT_CUDA_RING=1: whenever it applies; else never. */
template <class In>
static int xr_out(const xc_params *p, const xr_plan &pl, int grid, int smem, cudaStream_t s) {
    const int out = p->grad && p->mode == XC_MODE_FWD ? p->grad_dtype : 0;
#define XR_GO(O)                                                                           \
    do {                                                                                   \
        cudaError_t e = cudaFuncSetAttribute(xr_row_kernel<In, O>,                         \
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                             smem);                                        \
        if (e != cudaSuccess) return (int)e;                                               \
        xr_row_kernel<In, O><<<grid, XR_THREADS, smem, s>>>(*p, pl);                       \
    } while (0)
    if (out == XENT_BF16) XR_GO(XENT_BF16);
    else if (out == XENT_F16) XR_GO(XENT_F16);
    else XR_GO(0);
#undef XR_GO
    return (int)cudaGetLastError();
}

int xr_launch_rows(const xc_params *p, void *stream) {
    const char *env = getenv("XENT_CUDA_RING");
    if (!env || atoi(env) != 1) return -1;
    if (p->mode != XC_MODE_FWD && p->mode != XC_MODE_STAT) return -1;
    if (p->in_dtype != XENT_BF16 && p->in_dtype != XENT_F16) return -1;
    if (p->softcap != 0 || p->extra || p->T < 1) return -1;
    const int grad = p->grad && p->mode == XC_MODE_FWD;
    if (grad && p->grad_dtype != XENT_BF16 && p->grad_dtype != XENT_F16) return -1;
    /* every row (and gradient row) 16-byte aligned */
    if (((uintptr_t)p->logits & 15) || (p->ld * 2) % 16) return -1;
    if (grad && (((uintptr_t)p->grad & 15) || (p->ld_grad * 2) % 16)) return -1;
    int dev = 0, nsm = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return -1;
    if (cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess)
        return -1;
    int nseg = (optin - (int)sizeof(xr_shared) - 1024) / XR_SEG;
    if (nseg > XR_MAX_SEG) nseg = XR_MAX_SEG;
    if (nseg < 1 || (p->V >> 3) < 1) return -1;
    xr_plan pl;
    pl.nfull = (int)(p->V >> 3);
    pl.cs = pl.nfull < nseg * XR_NC ? pl.nfull : nseg * XR_NC;
    pl.ns = (pl.cs + XR_NC - 1) / XR_NC;
    pl.rt = (pl.nfull - pl.cs + XR_NC - 1) / XR_NC;
    if (XR_RB && pl.rt > XR_RT) return -1;
    const char *pf = getenv("XENT_CUDA_RING_PF");
    pl.pf = pf ? atoi(pf) : 2;
    const int grid = p->T < nsm ? (int)p->T : nsm;
    const int smem = pl.ns * XR_SEG;
    cudaStream_t s = (cudaStream_t)stream;
    if (p->in_dtype == XENT_BF16) return xr_out<xc_bf16>(p, pl, grid, smem, s);
    return xr_out<xc_f16>(p, pl, grid, smem, s);
}
