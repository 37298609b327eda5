/* src/cuda/ce_device.h: device helpers for the cross-entropy kernels:
 * element loads, cache-hinted 16-byte memory ops, exp in double, the
 * transform z' = cap(z) / tau and block reductions in a fixed order. */
#ifndef XENT_CUDA_CE_DEVICE_H
#define XENT_CUDA_CE_DEVICE_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "core/xent_math.h"

#define XC_MAX_WARPS 32

/* ------------------------------------------------------------------ */
/* Element formats: 8 elements (one chunk) per call                    */
/* ------------------------------------------------------------------ */

/* Max of packed pairs (T2: __nv_bfloat162 or __half2) with NaN ignored,
 * on the pairs' bits. */
template <class T2>
__device__ __forceinline__ uint32_t xc_max2(uint32_t a, uint32_t b) {
    T2 r = __hmax2(*reinterpret_cast<const T2 *>(&a), *reinterpret_cast<const T2 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}
/* Max of a chunk's 8 elements (16-bit pairs T2), NaN ignored as by fmaxf. */
template <class T2>
__device__ __forceinline__ float xc_max8(const uint4 *v) {
    const uint32_t w = xc_max2<T2>(xc_max2<T2>(v[0].x, v[0].y), xc_max2<T2>(v[0].z, v[0].w));
    const T2 m = *reinterpret_cast<const T2 *>(&w);
    return fmaxf(__low2float(m), __high2float(m));
}
/* Max and min of packed pairs that keep NaN, on the pairs' bits. */
template <class T2>
__device__ __forceinline__ uint32_t xc_pmax2(uint32_t a, uint32_t b) {
    T2 r = __hmax2_nan(*reinterpret_cast<const T2 *>(&a), *reinterpret_cast<const T2 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}
template <class T2>
__device__ __forceinline__ uint32_t xc_pmin2(uint32_t a, uint32_t b) {
    T2 r = __hmin2_nan(*reinterpret_cast<const T2 *>(&a), *reinterpret_cast<const T2 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}

struct xc_bf16 {
    typedef uint16_t raw;
    static __device__ __forceinline__ float one(const raw *p) {
        return __uint_as_float((uint32_t)*p << 16);
    }
    static __device__ __forceinline__ void unpack(const uint4 *v, float z[8]) {
        const uint32_t w[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            z[2 * i] = __uint_as_float(w[i] << 16);
            z[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
    /* max of the 8 elements (NaN ignored, as fmaxf), on packed pairs */
    static __device__ __forceinline__ float max8(const uint4 *v) {
        return xc_max8<__nv_bfloat162>(v);
    }
    /* max of packed pairs with NaN ignored (as max8) */
    static __device__ __forceinline__ uint32_t maxw(uint32_t a, uint32_t b) {
        return xc_max2<__nv_bfloat162>(a, b);
    }
    enum { VECS = 1 }; /* 16-byte vectors per chunk of 8 */
    static const bool WIDE = false; /* z - m is exact in fp32 */
    /* packed pairs (the on-chip kernel): max and min that keep NaN, the
     * two halves as floats, the pair of finite extremes */
    static __device__ __forceinline__ uint32_t pmax(uint32_t a, uint32_t b) {
        return xc_pmax2<__nv_bfloat162>(a, b);
    }
    static __device__ __forceinline__ uint32_t pmin(uint32_t a, uint32_t b) {
        return xc_pmin2<__nv_bfloat162>(a, b);
    }
    static __device__ __forceinline__ float lo(uint32_t a) { return __uint_as_float(a << 16); }
    static __device__ __forceinline__ float hi(uint32_t a) {
        return __uint_as_float(a & 0xFFFF0000u);
    }
    static const uint32_t LOWEST2 = 0xFF7FFF7Fu, HIGHEST2 = 0x7F7F7F7Fu;
};

struct xc_f16 {
    typedef uint16_t raw;
    static __device__ __forceinline__ float one(const raw *p) {
        return __half2float(__ushort_as_half(*p));
    }
    static __device__ __forceinline__ void unpack(const uint4 *v, float z[8]) {
        const uint32_t w[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
            float2 f = __half22float2(h);
            z[2 * i] = f.x;
            z[2 * i + 1] = f.y;
        }
    }
    static __device__ __forceinline__ float max8(const uint4 *v) { return xc_max8<__half2>(v); }
    static __device__ __forceinline__ uint32_t maxw(uint32_t a, uint32_t b) {
        return xc_max2<__half2>(a, b);
    }
    enum { VECS = 1 };
    static const bool WIDE = false; /* z - m is exact in fp32 */
    static __device__ __forceinline__ uint32_t pmax(uint32_t a, uint32_t b) {
        return xc_pmax2<__half2>(a, b);
    }
    static __device__ __forceinline__ uint32_t pmin(uint32_t a, uint32_t b) {
        return xc_pmin2<__half2>(a, b);
    }
    static __device__ __forceinline__ float lo(uint32_t a) {
        return __half2float(__ushort_as_half((unsigned short)(a & 0xFFFFu)));
    }
    static __device__ __forceinline__ float hi(uint32_t a) {
        return __half2float(__ushort_as_half((unsigned short)(a >> 16)));
    }
    static const uint32_t LOWEST2 = 0xFBFFFBFFu, HIGHEST2 = 0x7BFF7BFFu;
};

struct xc_f32 {
    typedef float raw;
    static __device__ __forceinline__ float one(const raw *p) { return *p; }
    static __device__ __forceinline__ void unpack(const uint4 *v, float z[8]) {
        z[0] = __uint_as_float(v[0].x); z[1] = __uint_as_float(v[0].y);
        z[2] = __uint_as_float(v[0].z); z[3] = __uint_as_float(v[0].w);
        z[4] = __uint_as_float(v[1].x); z[5] = __uint_as_float(v[1].y);
        z[6] = __uint_as_float(v[1].z); z[7] = __uint_as_float(v[1].w);
    }
    static __device__ __forceinline__ float max8(const uint4 *v) {
        float z[8];
        unpack(v, z);
        return fmaxf(fmaxf(fmaxf(z[0], z[1]), fmaxf(z[2], z[3])),
                     fmaxf(fmaxf(z[4], z[5]), fmaxf(z[6], z[7])));
    }
    enum { VECS = 2 };
    static const bool WIDE = true; /* z - m may round: TwoSum */
};

/* Max of U chunks (NaN ignored, as max8 of each, then fmaxf): for 16-bit
 * formats on the packed pairs, the two halves converted once. */
template <class In, int U>
__device__ __forceinline__ float xc_round_max(const uint4 (&b)[U][In::VECS]) {
    if constexpr (In::VECS == 1) {
        uint32_t m = In::maxw(In::maxw(b[0][0].x, b[0][0].y), In::maxw(b[0][0].z, b[0][0].w));
#pragma unroll
        for (int u = 1; u < U; u++)
            m = In::maxw(m, In::maxw(In::maxw(b[u][0].x, b[u][0].y),
                                     In::maxw(b[u][0].z, b[u][0].w)));
        return fmaxf(In::lo(m), In::hi(m));
    } else {
        float m = In::max8(b[0]);
#pragma unroll
        for (int u = 1; u < U; u++) m = fmaxf(m, In::max8(b[u]));
        return m;
    }
}

/* ------------------------------------------------------------------ */
/* 16-byte loads and stores with an L2 eviction policy                  */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ uint64_t xc_policy_last(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t xc_policy_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint4 xc_ld16(const void *ptr, uint64_t pol) {
    uint4 v;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr), "l"(pol));
    return v;
}
/* 16 bytes read once, by a call that writes no gradient: no L1
 * allocation, no L2 hint (read-only for the kernel's lifetime). */
__device__ __forceinline__ uint4 xc_ld16_once(const void *ptr) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
}
__device__ __forceinline__ void xc_st16(void *ptr, uint4 v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
                 :: "l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol)
                 : "memory");
}

/* ------------------------------------------------------------------ */
/* Rows of 16-bit values that are not 16-byte aligned: a chunk of 8    */
/* columns at a 2-byte-aligned address p (o = p mod 16, the same for   */
/* every chunk of the row) is loaded (pass 1 without a gradient) and   */
/* stored in naturally aligned pieces, no byte outside [p, p + 16).    */
/* The same 16 bytes as element by element, so the same chunk and the  */
/* same sums.                                                          */
/* ------------------------------------------------------------------ */

/* One naturally aligned piece at a: 2, 4 or 8 bytes. HINT: with the L2
 * policy pol; else read-only (a call that writes nothing). Both allocate
 * in L1: the lanes of a warp read each 128-byte line in 3 or 4 pieces. */
template <bool HINT>
__device__ __forceinline__ uint32_t xc_ldp2(uintptr_t a, uint64_t pol) {
    unsigned short v;
    if (HINT) asm volatile("ld.global.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(a), "l"(pol));
    else asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(a));
    return v;
}
template <bool HINT>
__device__ __forceinline__ uint32_t xc_ldp4(uintptr_t a, uint64_t pol) {
    uint32_t v;
    if (HINT) asm volatile("ld.global.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(a), "l"(pol));
    else asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(a));
    return v;
}
template <bool HINT>
__device__ __forceinline__ uint2 xc_ldp8(uintptr_t a, uint64_t pol) {
    uint2 v;
    if (HINT)
        asm volatile("ld.global.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;"
                     : "=r"(v.x), "=r"(v.y) : "l"(a), "l"(pol));
    else asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(a));
    return v;
}

/* The load form of a row whose chunks start at o = p mod 16 (even):
 * 0 (o = 0): one 16-byte load; 8 (o = 8): 8 + 8 bytes; 4 (o = 4, 12):
 * 4 + 8 + 4; 2 (o = 2, 10): 2 + 4 + 8 + 2; 6 (o = 6, 14): 2 + 8 + 4 + 2. */
__device__ __forceinline__ int xc_form_of(uintptr_t p) {
    const int o = (int)(p & 15);
    return o & 2 ? (o & 4 ? 6 : 2) : (o & 4 ? 4 : (o & 8));
}

/* The 16 bytes at p in form F (xc_form_of(p) == F), as one 16-byte word. */
template <int F, bool HINT>
__device__ __forceinline__ uint4 xc_ld16_form(const void *p, uint64_t pol) {
    const uintptr_t a = (uintptr_t)p;
    if constexpr (F == 0) {
        return HINT ? xc_ld16(p, pol) : xc_ld16_once(p);
    } else if constexpr (F == 8) {
        const uint2 x = xc_ldp8<HINT>(a, pol), y = xc_ldp8<HINT>(a + 8, pol);
        return make_uint4(x.x, x.y, y.x, y.y);
    } else if constexpr (F == 4) {
        const uint32_t x = xc_ldp4<HINT>(a, pol), z = xc_ldp4<HINT>(a + 12, pol);
        const uint2 y = xc_ldp8<HINT>(a + 4, pol);
        return make_uint4(x, y.x, y.y, z);
    } else {
        /* columns 0 and 7 alone, 1-6 in words x, y, z from p + 2 */
        const uint32_t e0 = xc_ldp2<HINT>(a, pol), e7 = xc_ldp2<HINT>(a + 14, pol);
        uint32_t x, y, z;
        if constexpr (F == 2) {
            x = xc_ldp4<HINT>(a + 2, pol);
            const uint2 v = xc_ldp8<HINT>(a + 6, pol);
            y = v.x;
            z = v.y;
        } else {
            const uint2 v = xc_ldp8<HINT>(a + 2, pol);
            x = v.x;
            y = v.y;
            z = xc_ldp4<HINT>(a + 10, pol);
        }
        return make_uint4(e0 | x << 16, __funnelshift_r(x, y, 16), __funnelshift_r(y, z, 16),
                          z >> 16 | e7 << 16);
    }
}

/* Pass 2 (a gradient) loads unaligned chunks another way: from the two
 * aligned 16-byte blocks each straddles. */

/* Bytes [o, o + 16) of the 32 bytes lo, hi (o even). */
__device__ __forceinline__ uint4 xc_funnel16(const uint4 &lo, const uint4 &hi, uint32_t o) {
    uint32_t w0 = lo.x, w1 = lo.y, w2 = lo.z, w3 = lo.w, w4 = hi.x, w5 = hi.y, w6 = hi.z,
             w7 = hi.w;
    if (o & 8) { w0 = w2; w1 = w3; w2 = w4; w3 = w5; w4 = w6; w5 = w7; }
    if (o & 4) { w0 = w1; w1 = w2; w2 = w3; w3 = w4; w4 = w5; }
    if (o & 2) {
        w0 = __funnelshift_r(w0, w1, 16);
        w1 = __funnelshift_r(w1, w2, 16);
        w2 = __funnelshift_r(w2, w3, 16);
        w3 = __funnelshift_r(w3, w4, 16);
    }
    return make_uint4(w0, w1, w2, w3);
}

/* The 16 bytes at p (o != 0). Both blocks are read, so the caller keeps
 * the last chunk of its memory off this path: the second block may
 * reach up to 14 bytes past the chunk. */
__device__ __forceinline__ uint4 xc_ld16_u(const void *p, uint64_t pol) {
    const uintptr_t a = (uintptr_t)p;
    const uint4 *q = (const uint4 *)(a & ~(uintptr_t)15);
    return xc_funnel16(xc_ld16(q, pol), xc_ld16(q + 1, pol), (uint32_t)(a & 15));
}

__device__ __forceinline__ void xc_st32(uintptr_t a, uint32_t x) { *(uint32_t *)a = x; }
__device__ __forceinline__ void xc_st64(uintptr_t a, uint32_t x, uint32_t y) {
    *(uint2 *)a = make_uint2(x, y);
}
/* Words x, y, z at a 4-byte-aligned address a: an 8-byte store where a
 * is 8-byte aligned. */
__device__ __forceinline__ void xc_st_words3(uintptr_t a, uint32_t x, uint32_t y, uint32_t z) {
    if (a & 4) { xc_st32(a, x); xc_st64(a + 4, y, z); }
    else { xc_st64(a, x, y); xc_st32(a + 8, z); }
}
/* The 16 bytes v at p (o != 0): 2 to 4 stores, no byte outside them. */
__device__ __forceinline__ void xc_st16_u(void *p, uint4 v) {
    const uintptr_t a = (uintptr_t)p;
    if (a & 2) {
        *(uint16_t *)a = (uint16_t)v.x;
        xc_st_words3(a + 2, __funnelshift_r(v.x, v.y, 16), __funnelshift_r(v.y, v.z, 16),
                     __funnelshift_r(v.z, v.w, 16));
        *(uint16_t *)(a + 14) = (uint16_t)(v.w >> 16);
    } else if (a & 4) {
        xc_st32(a, v.x);
        xc_st64(a + 4, v.y, v.z);
        xc_st32(a + 12, v.w);
    } else {
        xc_st64(a, v.x, v.y);
        xc_st64(a + 8, v.z, v.w);
    }
}

/* 2^x, MUFU approximation (relative error about 2 ulp of fp32), subnormal
 * results kept (no flush to zero). */
__device__ __forceinline__ float xc_ex2(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 2^x, MUFU approximation, subnormal results flushed to zero (for sums
 * whose total is >= 1, where such terms do not count). */
__device__ __forceinline__ float xc_ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* One term on the fast path (both kernels): e = 2^(x c2) and y_lo, the
 * rounding error of the product x * c2 (and of c2 itself); the term is
 * e (1 + y_lo ln 2) to first order, so the only error left is the MUFU
 * exp2's (relative, below 2^-22.5: docs/cuda.md). A logit of -inf gives
 * y_lo = NaN (and so a NaN sum). */
__device__ __forceinline__ float xc_term(float x, float c2, float c2lo, float &ylo) {
    float y = x * c2;
    /* 2^y is 0 below 2^-126 (ftz): return it with ylo = 0 when y < -512,
     * so that x = -inf or an x c2 that overflows (|z| near 3.4e38) gives a
     * 0 term, not 0 * inf = NaN in the sums (the same bits otherwise: the
     * term and e ylo were 0 already); NaN fails the test and propagates */
    if (y < -512.f) { ylo = 0.f; return 0.f; }
    ylo = fmaf(x, c2, -y);
    ylo = fmaf(x, c2lo, ylo);
    return xc_ex2_ftz(y);
}

/* exp in double: xent__exp of src/core/xent_math.h, the CPU's own
 * function compiled for the device (relative error below 2^-50). */
__device__ __forceinline__ double xc_dexp(double x) { return xent__exp(x); }

/* ------------------------------------------------------------------ */
/* Block reductions: fixed shapes, so results do not depend on timing.  */
/* Every thread of the block must call them; all get the result.        */
/* ------------------------------------------------------------------ */

/* The max over the warp's 32 lanes (butterfly: every lane gets it). */
__device__ __forceinline__ float xc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

__device__ __forceinline__ float xc_block_max(float v, float *sh /* [32] */) {
    v = xc_warp_max(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* sh may still be read by a previous reduction */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return xc_warp_max(lane < nw ? sh[lane] : -INFINITY);
}

/* Sums the first N (<= 4) of four doubles over the block; the association
 * is a fixed butterfly in each warp, then the warps' sums in a fixed
 * butterfly. */
template <int N>
__device__ __forceinline__ void xc_block_sum(double v[4], double *sh /* [4*32] */) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xFFFFFFFFu, v[i], o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        for (int i = 0; i < N; i++) sh[i * XC_MAX_WARPS + warp] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) {
        double r = lane < nw ? sh[i * XC_MAX_WARPS + lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xFFFFFFFFu, r, o);
        v[i] = r;
    }
}

/* The row's four sums {top count, rest, SX, ZS} over the block; without
 * EXTRA (no entropy, no smoothing) SX and ZS are not needed: zero. */
template <bool EXTRA>
__device__ __forceinline__ void xc_block_row_sums(double v[4], double *sh) {
    if (EXTRA) {
        xc_block_sum<4>(v, sh);
    } else {
        xc_block_sum<2>(v, sh);
        v[2] = v[3] = 0;
    }
}

#endif
