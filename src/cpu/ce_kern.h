/* src/cpu/ce_kern.h: the hot loops of the CPU kernel (src/cpu/ce.c) behind a
 * table of function pointers, one table per instruction set, chosen once at
 * load time from cpuid (xent_cpu_isa(), include/xent.h) and forceable
 * through xent_cpu_set_isa().
 *
 *   baseline  src/cpu/ce_isa_base.c    the generic C loops (ce_kern_generic.h)
 *                                      at the build's -march (x86-64: SSE2;
 *                                      aarch64: armv8-a, NEON)
 *   avx2      src/cpu/ce_isa_avx2.c    the same C text compiled for
 *                                      AVX2 + FMA + F16C (target pragma)
 *   avx512    src/cpu/ce_isa_avx512.c  hand-written AVX-512 loops doing, lane
 *                                      for lane, the operations of the C text
 *
 * Every table computes the same bits: the same fma (written out; the build
 * has -ffp-contract=off), the same roundings, the same eight accumulation
 * lanes in the same order. tests/test_cpu_isa.c checks each path against
 * the long-double oracle and against the others bitwise. */
#ifndef XENT_CE_KERN_H
#define XENT_CE_KERN_H

#include "core/xent_internal.h"

#define XENT__BLOCK 1024 /* columns per call of sum_range / exp_block      */

/* Eight fixed lanes of the pass-2 sums (lane k: elements a + k, a + 8 + k,
 * ... of one call; a tail restarts at lane 0). */
typedef struct { double s[8], sx[8], z[8], n[8]; } xent__sums8;

/* The argument of exp for column j (no softcap):
 *   rel == 0:  d = z_j * inv_tau - M           (M = m * inv_tau)
 *   rel == 1:  d = ((double)z_j - m) * inv_tau (rows whose |M| > 2^11)
 * The first is the historical form (its bits are recorded by the golden
 * test); the second keeps d exact up to two roundings relative to d itself
 * when z_j and m are huge (docs/numerics.md, "Huge logits"). The pass-2
 * sum `z` accumulates z_j * inv_tau (rel == 0) or d (rel == 1). */
typedef struct {
    double inv_tau, M, m;
    int rel;
} xent__shift;

/* Which pass-2 sums a call needs besides S and the count (the others are
 * left untouched): SX for the entropy, the z sum for label smoothing and the
 * shard statistics. Skipping a sum changes no other output's bits. */
#define XENT__NEED_SX 1
#define XENT__NEED_Z 2

typedef struct xent__cpu_kern {
    const char *name;
    /* Pass 1 on src[a, b): *m = max(*m, raw max), *bad += (z - z) summed
     * (NaN on a NaN or infinite element). */
    void (*max_range)(const void *src, xent_dtype dt, int64_t a, int64_t b,
                      float *m, float *bad);
    /* Pass 2 on src[a, b), b - a <= XENT__BLOCK: adds to acc's lanes
     * e = exp(d) (d != 0), the count of d == 0, and, as `need` asks, e d and
     * z (see above); eo[i] = e (eof[i] = (float)e) for i in [a, b) when eo
     * (eof) is not NULL; at most one of them is. */
    void (*sum_range)(const void *src, xent_dtype dt, int64_t a, int64_t b,
                      const xent__shift *sh, int need, xent__sums8 *acc, double *eo,
                      float *eof);
    /* e[i] = exp(d_i) for i in [0, n), n <= XENT__BLOCK */
    void (*exp_block)(const void *src, xent_dtype dt, int64_t n,
                      const xent__shift *sh, double *e);
    /* o[i] = gc (a (e[i] s) - b) rounded once to gt (as `store`), i in
     * [0, n); the product by a is skipped when a == 1 and the subtraction
     * when b == 0 (both exact there, so the bits do not depend on it). */
    void (*grad_store)(const double *e, int64_t n, double gc, double s,
                       double a, double b, void *o, xent_dtype gt, int nt);
    /* o[i] = (float)(e[i] * c) (one fp32 product) rounded to nearest even
     * to gt (bf16 or fp16), i in [0, n): the fp32 gradient path of
     * docs/numerics.md ("The fp32 gradient path"). For both: nt != 0 asks
     * for streaming (non-temporal) stores where a table has them (a
     * gradient far larger than the caches; the values are the same). */
    void (*grad_f32)(const float *e, int64_t n, float c, void *o, xent_dtype gt, int nt);
    /* o[i] = v[i] rounded once to gt (bf16/fp16 through fp32 rounded to
     * odd), i in [0, n) */
    void (*store)(void *o, xent_dtype gt, const double *v, int64_t n);
} xent__cpu_kern;

extern const xent__cpu_kern xent__kern_base;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define XENT__HAVE_X86_PATHS 1
extern const xent__cpu_kern xent__kern_avx2;
extern const xent__cpu_kern xent__kern_avx512;
#endif

/* The table calls use now (src/cpu/ce.c). */
const xent__cpu_kern *xent__cpu_kern_get(void);

/* exp(x) for x <= 709 as the kernel needs it: every argument is z' - M or
 * z' - lse, at most a rounding error above 0. x = (16 m + j) ln2/16 + r with
 * |r| <= ln2/32: exp(x) = (2^m 2^(j/16)) p(r), p the degree-5 Taylor
 * polynomial. Relative error below 2^-41 (docs/numerics.md, "exp"); results
 * below e^-708 (~3e-308) are returned as 0: they are far below what a float
 * output or a sum >= 1 can hold. NaN propagates; -inf gives 0. Branch-free,
 * so that the loops using it vectorise; the AVX-512 exp8 does the same
 * operations.
 *
 * 2^m 2^(j/16) is formed exactly with integer operations: kd = x 16/ln2 +
 * 1.5 2^52 carries k = 16 m + j in its low bits, so (bits(kd) << 48) is
 * (m << 52) + (j << 48) modulo 2^64, and xent__exp_tabb[j] holds the bits of
 * 2^(j/16) (correctly rounded) minus (j << 48): their integer sum is the
 * double 2^m 2^(j/16), exact for m >= -1022 (x >= -708). */
static const uint64_t xent__exp_tabb[16] = {
    0x3ff0000000000000ull, 0x3fefb5586cf9890full, 0x3fef72b83c7d517bull, 0x3fef387a6e756238ull,
    0x3fef06fe0a31b715ull, 0x3feedea64c123422ull, 0x3feebfdad5362a27ull, 0x3feeab07dd485429ull,
    0x3feea09e667f3bcdull, 0x3feea11473eb0187ull, 0x3feeace5422aa0dbull, 0x3feec49182a3f090ull,
    0x3feee89f995ad3adull, 0x3fef199bdd85529cull, 0x3fef5818dcfba487ull, 0x3fefa4afa2a490daull};

static inline double xent__exp_kernel(double x) {
    const double inv = 0x1.71547652b82fep+4;    /* 16 / ln 2           */
    const double c_hi = 0x1.62e42fefa39efp-5;   /* ln 2 / 16, rounded  */
    const double shift = 0x1.8p52; /* adding it rounds to an integer */
    double xc = x < -708.0 ? -708.0 : x;
    double kd = fma(xc, inv, shift);
    uint64_t ki;
    memcpy(&ki, &kd, 8);
    kd -= shift; /* k = nearest integer to 16 x / ln 2, -16343 <= k <= 16 */
    /* |r| <= ln2/32 = 0.02166; ln2/16 - c_hi < 2^-58 and |k| < 2^14, so
     * dropping the remainder's product costs below 2^-44 (relative, in e) */
    double r = fma(-kd, c_hi, xc);
    /* truncation < 0.02166^6 / 6! < 2^-42 */
    double p = 1.0 / 120.0;
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    uint64_t tb = xent__exp_tabb[ki & 15] + (ki << 48); /* 2^m 2^(j/16) */
    double t;
    memcpy(&t, &tb, 8);
    double y = p * t;
    return x < -708.0 ? 0.0 : y;
}

/* double -> float rounded to odd: the float result of rounding to nearest,
 * moved one step toward zero if that rounding went away from zero, and with
 * its last bit set when inexact. Rounding this to a narrower format (bf16,
 * fp16: at least two bits fewer) to nearest gives the correctly rounded
 * narrow value of g: no double rounding. */
static inline uint32_t xent__f32_bits_round_odd(double g) {
    float f = (float)g;
    uint32_t u;
    memcpy(&u, &f, 4);
    double back = (double)f;
    uint32_t inexact = back != g;
    uint32_t away = inexact & (fabs(back) > fabs(g));
    u -= away;
    u |= inexact;
    return u;
}

/* NaN needs no special case: its quiet bit survives (it is inexact, so the
 * last bit is set and the rounding add cannot clear the mantissa). */
static inline uint16_t xent__store_bf16(double g) {
    uint32_t u = xent__f32_bits_round_odd(g);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__aarch64__))
/* The compiler's _Float16 conversion rounds to nearest even (hardware
 * vcvtps2ph on x86 with F16C/AVX512-FP16, libgcc's soft conversion without;
 * fcvt on aarch64), NaN and subnormals included. */
static inline uint16_t xent__store_f16(double g) {
    uint32_t u = xent__f32_bits_round_odd(g);
    float f;
    memcpy(&f, &u, 4);
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
#else
static inline uint16_t xent__store_f16(double g) {
    if (g != g) return 0x7E00u;
    uint32_t u = xent__f32_bits_round_odd(g);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7FFFFFFFu;
    if (u >= 0x477FF000u) return sign | 0x7C00u; /* >= 65520: inf */
    if (u < 0x38800000u) {                       /* below 2^-14: subnormal */
        float a, half = 0.5f;
        memcpy(&a, &u, 4);
        float s = a + half; /* rounds a to a multiple of 2^-24, RNE */
        uint32_t su, hu;
        memcpy(&su, &s, 4);
        memcpy(&hu, &half, 4);
        return sign | (uint16_t)(su - hu);
    }
    u += 0xC8000FFFu + ((u >> 13) & 1u); /* rebias 127 -> 15, round */
    return sign | (uint16_t)(u >> 13);
}
#endif

#endif
