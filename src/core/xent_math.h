/* src/core/xent_math.h: the exact scalar pieces shared by the CPU kernels,
 * the CUDA kernels and the tools: element loads and exp in double. Header
 * only; each function compiles for the host (static inline) and, under
 * nvcc, for the device too (XENT_HD), from the same text, so the two sides
 * run the same operations in the same order. Needs no fast-math and no FMA
 * contraction (the CPU is built with -ffp-contract=off, CUDA with
 * -fmad=false); every fma is written out. */
#ifndef XENT_MATH_H
#define XENT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "xent.h"

#ifdef __CUDACC__
#define XENT_HD static __host__ __device__ __forceinline__
#else
#define XENT_HD static inline
#endif

/* Element loads as float (exact for all three formats). */
XENT_HD float xent__bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Branch-free IEEE half -> single (exact, subnormals, inf and NaN kept). */
XENT_HD float xent__f16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7FFFu;
    /* normal/inf/nan: shift exponent+mantissa into place and rebias; the
     * multiply by 2^112 rebiases exponent 15 -> 127 and handles inf/nan since
     * 0x7C00 << 13 becomes exponent 0xF8 -> times 2^112 overflows to inf. */
    uint32_t u = em << 13;
    float f;
    memcpy(&f, &u, 4);
    f *= 0x1.0p112f;
    /* inf/NaN: make the exponent all ones and keep the payload */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (em >= 0x7C00u) bits = 0x7F800000u | (em & 0x3FFu) << 13;
    bits |= sign;
    memcpy(&f, &bits, 4);
    return f;
}

XENT_HD float xent__load(const void *p, xent_dtype t, int64_t i) {
    switch (t) {
    case XENT_F32: return ((const float *)p)[i];
    case XENT_BF16: return xent__bf16_f32(((const uint16_t *)p)[i]);
    case XENT_F16: return xent__f16_f32(((const uint16_t *)p)[i]);
    default: return NAN;
    }
}

/* Reads label i (I32 or I64). */
XENT_HD int64_t xent__label(const void *labels, xent_dtype t, int64_t i) {
    return t == XENT_I32 ? (int64_t)((const int32_t *)labels)[i]
                         : ((const int64_t *)labels)[i];
}

/* exp(x) in double, vectorizable (no branches, no libm): relative error
 * below 2^-50 for x in [-745, 709] (see docs/numerics.md, "exp"); returns
 * 0 below -745.1 and +inf above 709.8; NaN stays NaN. */
XENT_HD double xent__exp(double x) {
    const double log2e = 1.4426950408889634;
    const double ln2_hi = 0x1.62e42fefa39efp-1;     /* ln 2, upper bits   */
    const double ln2_lo = 0x1.abc9e3b39803fp-56;    /* ln 2 - ln2_hi      */
    double xc = x < -745.2 ? -745.2 : (x > 709.9 ? 709.9 : x);
    double n = nearbyint(xc * log2e);
    /* r = x - n ln2 with two fma: |r| <= 0.3466 + tiny, error ~2^-60 */
    double r = fma(-n, ln2_hi, xc);
    r = fma(-n, ln2_lo, r);
    /* Taylor polynomial of degree 12 on |r| <= 0.35: truncation < 2^-55 */
    double p = 1.0 / 479001600.0;
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    /* scale by 2^n in two steps so n down to -1075 reaches subnormals */
    int64_t ni = (int64_t)n;
    int64_t n1 = ni / 2, n2 = ni - n1;
    uint64_t b1 = (uint64_t)(n1 + 1023) << 52, b2 = (uint64_t)(n2 + 1023) << 52;
    double s1, s2;
    memcpy(&s1, &b1, 8);
    memcpy(&s2, &b2, 8);
    double y = p * s1 * s2;
    y = x < -745.2 ? 0.0 : y;
    y = x > 709.8 ? INFINITY : y;
    return x != x ? x : y;
}

#endif
