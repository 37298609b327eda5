/* src/cpu/ce.c: exact cross-entropy, log-probabilities and gradients on the
 * CPU. The contract is include/xent.h; the error analysis is
 * docs/numerics.md ("CPU kernel"). In short: every quantity is formed in
 * double from the exactly converted inputs, the loss of a confident row is
 * computed as softplus(lse_{j!=t} - z'_t) and its target gradient as
 * expm1(-nll), so nothing cancels, and each output is rounded once, at the
 * store. All outputs are faithfully rounded (within 1 ulp).
 *
 * Per row (one thread owns a row; rows never interact, so results are
 * bitwise independent of T, the row's position and the thread count):
 *   pass 1  max of the raw logits over the non-target columns  (+ NaN/inf)
 *   pass 2  S = sum_{j!=t} exp(z'_j - M), SX = sum e (z'_j - M), sum z'_j
 *   combine d = (M - z'_t) + log S; nll = softplus(d); lse = z'_t + nll
 *   pass 3  gradient (when asked), one read and one store per element
 * A vocabulary shard runs passes 1-2 on its columns; xent_ce_combine merges
 * the shards' partials; the unsharded call is the case S = 1. */
#include "xent_internal.h"

#include <stdlib.h>

#define BLOCK 1024      /* columns converted to fp32 at a time (4 KiB)      */
#define ROW_BLOCK 16    /* rows per unit of work (and of the loss sum)      */

/* ------------------------------------------------------------------------ */
/* exp on the kernel's domain                                                */
/* ------------------------------------------------------------------------ */

/* exp(x) for x <= 709 as the kernel needs it: every argument is z' - M or
 * z' - lse, at most a rounding error above 0. x = (16 m + j) ln2/16 + r with
 * |r| <= ln2/32: exp(x) = 2^m 2^(j/16) p(r), p the degree-5 Taylor
 * polynomial. Relative error below 2^-42 (docs/numerics.md, "exp"); results
 * below e^-708 (~3e-308) are returned as 0: they are far below what a float
 * output or a sum >= 1 can hold. NaN propagates. Branch-free, so that the
 * loops using it vectorise; the AVX-512 exp8 does the same operations. */
static const double exp_tab[16] = {
    0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0,
    0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0};

static inline double exp_kernel(double x) {
    const double inv = 0x1.71547652b82fep+4;    /* 16 / ln 2           */
    const double c_hi = 0x1.62e42fefa39efp-5;   /* ln 2 / 16, rounded  */
    const double c_lo = 0x1.abc9e3b39803fp-60;  /* its remainder       */
    const double shift = 0x1.8p52; /* adding it rounds to an integer */
    double xc = x < -708.0 ? -708.0 : x;
    double kd = fma(xc, inv, shift);
    uint64_t ki;
    memcpy(&ki, &kd, 8);
    kd -= shift; /* k = nearest integer to 16 x / ln 2, -16343 <= k <= 16 */
    double r = fma(-kd, c_hi, xc);
    r = fma(-kd, c_lo, r); /* |r| <= ln2/32 = 0.02166 */
    /* truncation < 0.02166^6 / 6! < 2^-42 */
    double p = 1.0 / 120.0;
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    int64_t k = (int64_t)(ki - 0x4338000000000000ull);
    uint64_t sb = (uint64_t)((k >> 4) + 1023) << 52; /* 2^m, m = floor(k/16) */
    double sc;
    memcpy(&sc, &sb, 8);
    double y = p * exp_tab[k & 15] * sc;
    return x < -708.0 ? 0.0 : y;
}

/* ------------------------------------------------------------------------ */
/* The logit transform z' = cap(z) / tau, and its derivative                 */
/* ------------------------------------------------------------------------ */

typedef struct {
    int has_cap;
    double cap, inv_cap, inv_tau;
} xform;

static xform xform_make(const xent_ce_opts *o) {
    xform x;
    x.has_cap = o->softcap > 0;
    x.cap = o->softcap;
    x.inv_cap = x.has_cap ? 1.0 / o->softcap : 0;
    x.inv_tau = 1.0 / o->temperature;
    return x;
}

/* tanh(y) and sech^2(y) from one exp: with e = exp(-2|y|),
 * tanh|y| = (1 - e) / (1 + e), sech^2 y = 4e / (1 + e)^2. The absolute
 * error of tanh is below 2^-51, which is what matters downstream: z'
 * enters only through exp(z' - lse). */
static inline double xform_apply(const xform *x, double z, int has_cap) {
    if (!has_cap) return z * x->inv_tau;
    double y = z * x->inv_cap;
    double e = xent__exp(-2.0 * fabs(y));
    double t = (1.0 - e) / (1.0 + e);
    return copysign(t, y) * x->cap * x->inv_tau;
}

static inline double xform_slope(const xform *x, double z, int has_cap) {
    if (!has_cap) return x->inv_tau;
    double e = xent__exp(-2.0 * fabs(z * x->inv_cap));
    double q = 1.0 + e;
    return 4.0 * e / (q * q) * x->inv_tau;
}

/* ------------------------------------------------------------------------ */
/* Row loads and gradient stores                                             */
/* ------------------------------------------------------------------------ */

/* buf[i] = row[j0 + i] as fp32 (exact), i in [0, n). */
static void load_block(const void *row, xent_dtype dt, int64_t j0, int64_t n,
                       float *buf /* [n] */) {
    if (dt == XENT_F32) {
        memcpy(buf, (const float *)row + j0, (size_t)n * sizeof(float));
    } else if (dt == XENT_BF16) {
        const uint16_t *h = (const uint16_t *)row + j0;
        for (int64_t i = 0; i < n; i++) buf[i] = xent__bf16_f32(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)row + j0;
        for (int64_t i = 0; i < n; i++) buf[i] = xent__f16_f32(h[i]);
    }
}

/* double -> float rounded to odd: the float result of rounding to nearest,
 * moved one step toward zero if that rounding went away from zero, and with
 * its last bit set when inexact. Rounding this to a narrower format (bf16,
 * fp16: at least two bits fewer) to nearest gives the correctly rounded
 * narrow value of g: no double rounding. */
static inline uint32_t f32_bits_round_odd(double g) {
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
static inline uint16_t store_bf16(double g) {
    uint32_t u = f32_bits_round_odd(g);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__aarch64__))
/* The compiler's _Float16 conversion rounds to nearest even (hardware
 * vcvtps2ph on x86 with F16C/AVX512-FP16), NaN and subnormals included. */
static inline uint16_t store_f16(double g) {
    uint32_t u = f32_bits_round_odd(g);
    float f;
    memcpy(&f, &u, 4);
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
#else
static inline uint16_t store_f16(double g) {
    if (g != g) return 0x7E00u;
    uint32_t u = f32_bits_round_odd(g);
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

/* ------------------------------------------------------------------------ */
/* Passes 1 and 2 over one row (or one shard of it)                          */
/* ------------------------------------------------------------------------ */


typedef struct { double s[8], sx[8], z[8], n[8]; } sums8;

typedef struct {
    double g;     /* row scale: upstream gradient (0: write zeros)          */
    double a;     /* 1 + 2 k lse                                            */
    double b;     /* eps / vocab_total                                      */
    double lse;
    double tgrad; /* dL/dz'_t / g: expm1(-nll) + 2k lse p_t + eps(1 - 1/V)  */
    double M;     /* the shift of pass 2: z'(max of the non-target columns)  */
    double s;     /* exp(M - lse): p_j = exp(z'_j - M) s                     */
} grad_row_params;

/* ------------------------------------------------------------------------ */
/* AVX-512 versions of the hot loops                                         */
/* ------------------------------------------------------------------------ */
/* Each does, lane for lane, exactly the operations of the generic code
 * above (same fma, same rounding, same lane assignment of the sums), so the
 * results are bitwise those of the generic build; tests/test_ce.c checks the
 * generic helpers against these on random rows. Only the transform without a
 * softcap is vectorised by hand; the softcap path uses the generic code. */
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && \
    defined(__AVX512BW__) && !defined(XENT_NO_SIMD)
#include <immintrin.h>
#define XENT_SIMD 1

static inline __m512d exp8(__m512d x) {
    const __m512d shift = _mm512_set1_pd(0x1.8p52);
    const __m512d tlo = _mm512_loadu_pd(exp_tab), thi = _mm512_loadu_pd(exp_tab + 8);
    __mmask8 low = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-708.0), _CMP_LT_OQ);
    __m512d xc = _mm512_mask_mov_pd(x, low, _mm512_set1_pd(-708.0));
    __m512d kd = _mm512_fmadd_pd(xc, _mm512_set1_pd(0x1.71547652b82fep+4), shift);
    __m512i k = _mm512_sub_epi64(_mm512_castpd_si512(kd), _mm512_castpd_si512(shift));
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(0x1.62e42fefa39efp-5), xc);
    r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(0x1.abc9e3b39803fp-60), r);
    __m512d p = _mm512_set1_pd(1.0 / 120.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    __m512d t = _mm512_permutex2var_pd(tlo, k, thi); /* exp_tab[k & 15] */
    __m512i sb = _mm512_slli_epi64(_mm512_add_epi64(_mm512_srai_epi64(k, 4),
                                                    _mm512_set1_epi64(1023)), 52);
    __m512d y = _mm512_mul_pd(_mm512_mul_pd(p, t), _mm512_castsi512_pd(sb));
    return _mm512_mask_mov_pd(y, low, _mm512_setzero_pd());
}

static inline __mmask16 tail16(int64_t n) { return (__mmask16)((1u << n) - 1u); }
static inline __mmask8 tail8(int64_t n) { return (__mmask8)((1u << n) - 1u); }

/* 16 elements i.. of a row as fp32 (exact); lanes outside k get `fill` */
static inline __attribute__((always_inline)) __m512
load16f(const void *src, xent_dtype dt, int64_t i, __mmask16 k, float fill) {
    __m512 f = _mm512_set1_ps(fill);
    if (dt == XENT_F32) return _mm512_mask_loadu_ps(f, k, (const float *)src + i);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)src + i);
    __m512 v = dt == XENT_BF16
                   ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                   : _mm512_cvtph_ps(h);
    return _mm512_mask_mov_ps(f, k, v);
}

/* 8 elements i.. as fp64 (exact); lanes outside k are 0 */
static inline __attribute__((always_inline)) __m512d
load8d(const void *src, xent_dtype dt, int64_t i, __mmask8 k) {
    if (dt == XENT_F32) return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, (const float *)src + i));
    __m128i h = _mm_maskz_loadu_epi16(k, (const uint16_t *)src + i);
    __m256 v = dt == XENT_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                   : _mm256_cvtph_ps(h);
    return _mm512_cvtps_pd(v);
}

static void max_range_simd(const void *src, xent_dtype dt, int64_t a, int64_t b,
                           float *m, float *bad) {
    __m512 mm = _mm512_set1_ps(-INFINITY), bb = _mm512_setzero_ps();
    int64_t i = a;
    for (; i + 16 <= b; i += 16) {
        __m512 v = load16f(src, dt, i, (__mmask16)0xFFFF, 0.0f);
        mm = _mm512_max_ps(mm, v);
        bb = _mm512_add_ps(bb, _mm512_sub_ps(v, v));
    }
    if (i < b) {
        __mmask16 k = tail16(b - i);
        __m512 v = load16f(src, dt, i, k, -INFINITY);
        __m512 vz = load16f(src, dt, i, k, 0.0f);
        mm = _mm512_max_ps(mm, v);
        bb = _mm512_add_ps(bb, _mm512_sub_ps(vz, vz));
    }
    float m1 = _mm512_reduce_max_ps(mm), b1 = _mm512_reduce_add_ps(bb);
    *m = m1 > *m ? m1 : *m;
    *bad += b1;
}

/* lanes of sums8 as vectors */
static void sum_range_simd(const void *src, xent_dtype dt, int64_t a, int64_t b,
                           double inv_tau, double M, sums8 *acc, double *eo) {
    __m512d s = _mm512_loadu_pd(acc->s), sx = _mm512_loadu_pd(acc->sx);
    __m512d zs = _mm512_loadu_pd(acc->z), nn = _mm512_loadu_pd(acc->n);
    const __m512d Mv = _mm512_set1_pd(M), it = _mm512_set1_pd(inv_tau);
    const __m512d one = _mm512_set1_pd(1.0), zero = _mm512_setzero_pd();
    int64_t i = a;
    /* two vectors an iteration (independent exps, the same lane order) */
    for (; i + 16 <= b; i += 16) {
        __m512d z0 = load8d(src, dt, i, 0xFF), z1 = load8d(src, dt, i + 8, 0xFF);
        __m512d zp0 = _mm512_mul_pd(z0, it), zp1 = _mm512_mul_pd(z1, it);
        __m512d d0 = _mm512_sub_pd(zp0, Mv), d1 = _mm512_sub_pd(zp1, Mv);
        __m512d e0 = exp8(d0), e1 = exp8(d1);
        if (eo) {
            _mm512_storeu_pd(eo + i, e0);
            _mm512_storeu_pd(eo + i + 8, e1);
        }
        __mmask8 t0 = _mm512_cmp_pd_mask(d0, zero, _CMP_EQ_OQ);
        __mmask8 t1 = _mm512_cmp_pd_mask(d1, zero, _CMP_EQ_OQ);
        s = _mm512_mask_add_pd(s, (__mmask8)~t0, s, e0);
        nn = _mm512_mask_add_pd(nn, t0, nn, one);
        sx = _mm512_add_pd(sx, _mm512_mul_pd(e0, d0));
        zs = _mm512_add_pd(zs, zp0);
        s = _mm512_mask_add_pd(s, (__mmask8)~t1, s, e1);
        nn = _mm512_mask_add_pd(nn, t1, nn, one);
        sx = _mm512_add_pd(sx, _mm512_mul_pd(e1, d1));
        zs = _mm512_add_pd(zs, zp1);
    }
    for (; i < b; i += 8) {
        __mmask8 k = b - i >= 8 ? (__mmask8)0xFF : tail8(b - i);
        __m512d z = load8d(src, dt, i, k);
        __m512d zp = _mm512_mul_pd(z, it);
        __m512d d = _mm512_sub_pd(zp, Mv);
        __m512d e = exp8(d);
        if (eo) _mm512_mask_storeu_pd(eo + i, k, e);
        __mmask8 top = _mm512_cmp_pd_mask(d, zero, _CMP_EQ_OQ);
        s = _mm512_mask_add_pd(s, k & (__mmask8)~top, s, e);
        nn = _mm512_mask_add_pd(nn, k & top, nn, one);
        sx = _mm512_mask_add_pd(sx, k, sx, _mm512_mul_pd(e, d));
        zs = _mm512_mask_add_pd(zs, k, zs, zp);
    }
    _mm512_storeu_pd(acc->s, s);
    _mm512_storeu_pd(acc->sx, sx);
    _mm512_storeu_pd(acc->z, zs);
    _mm512_storeu_pd(acc->n, nn);
}

/* e[i] = exp(z_i / tau - M), as pass 2 computes it */
static void exp_block_simd(const void *src, xent_dtype dt, int64_t n, double inv_tau,
                           double M, double *e) {
    const __m512d it = _mm512_set1_pd(inv_tau), Mv = _mm512_set1_pd(M);
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m512d z = load8d(src, dt, i, k);
        _mm512_mask_storeu_pd(e + i, k, exp8(_mm512_sub_pd(_mm512_mul_pd(z, it), Mv)));
    }
}

/* val[i] = (g c) (a (e_i s) - b) */
static void grad_vals_simd(const double *e, int64_t n, double gc,
                           const grad_row_params *gp, double *val) {
    const __m512d gcv = _mm512_set1_pd(gc), sv = _mm512_set1_pd(gp->s);
    const __m512d av = _mm512_set1_pd(gp->a), bv = _mm512_set1_pd(gp->b);
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m512d p = _mm512_mul_pd(_mm512_maskz_loadu_pd(k, e + i), sv);
        __m512d v = _mm512_mul_pd(gcv, _mm512_sub_pd(_mm512_mul_pd(av, p), bv));
        _mm512_mask_storeu_pd(val + i, k, v);
    }
}

/* f32 bits of v rounded to odd (see f32_bits_round_odd) */
static inline __m256i round_odd8(__m512d v) {
    __m256 f = _mm512_cvtpd_ps(v);
    __m512d back = _mm512_cvtps_pd(f);
    __mmask8 inexact = _mm512_cmp_pd_mask(back, v, _CMP_NEQ_UQ);
    __mmask8 away = inexact & _mm512_cmp_pd_mask(_mm512_abs_pd(back), _mm512_abs_pd(v), _CMP_GT_OQ);
    __m256i u = _mm256_castps_si256(f);
    const __m256i one = _mm256_set1_epi32(1);
    u = _mm256_mask_sub_epi32(u, away, u, one);
    return _mm256_mask_or_epi32(u, inexact, u, one);
}

static void store_bf16_simd(uint16_t *o, const double *v, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m256i u = round_odd8(_mm512_maskz_loadu_pd(k, v + i));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
        u = _mm256_srli_epi32(u, 16);
        _mm_mask_storeu_epi16(o + i, k, _mm256_cvtepi32_epi16(u));
    }
}

static void store_f16_simd(uint16_t *o, const double *v, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m256i u = round_odd8(_mm512_maskz_loadu_pd(k, v + i));
        __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT);
        _mm_mask_storeu_epi16(o + i, k, h);
    }
}
#endif

/* Pass 1 on buf[a, b): raw max; *bad becomes NaN on a NaN/inf element.
 * Sixteen lanes so that the loop vectorises without reassociation. */
static inline void max_range(const float *buf, int64_t a, int64_t b,
                             float *m, float *bad) {
    float mm[16], bb[16];
    for (int k = 0; k < 16; k++) { mm[k] = -INFINITY; bb[k] = 0.0f; }
    int64_t i = a;
    for (; i + 16 <= b; i += 16)
        for (int k = 0; k < 16; k++) {
            float v = buf[i + k];
            mm[k] = v > mm[k] ? v : mm[k];
            bb[k] += v - v;
        }
    float m1 = *m, b1 = *bad;
    for (; i < b; i++) {
        m1 = buf[i] > m1 ? buf[i] : m1;
        b1 += buf[i] - buf[i];
    }
    for (int k = 0; k < 16; k++) {
        m1 = mm[k] > m1 ? mm[k] : m1;
        b1 += bb[k];
    }
    *m = m1;
    *bad = b1;
}

/* Pass 2 on buf[a, b): lane sums of e = exp(z' - M) over the columns below
 * the max, the count of columns at the max (e = 1 exactly), e (z' - M) and
 * z'. Keeping the max's 1 apart gives S - 1 without cancellation, and so
 * log S = log1p(S - 1) to full relative accuracy when S is close to 1.
 * Eight lanes, always combined in the same order. */

static inline __attribute__((always_inline)) void sum_range(const float *buf, int64_t a, int64_t b,
                             const xform *x, int has_cap, double M,
                             sums8 *acc, double *eo) {
    int64_t i = a;
    for (; i + 8 <= b; i += 8) {
        for (int k = 0; k < 8; k++) {
            double zp = xform_apply(x, (double)buf[i + k], has_cap);
            double d = zp - M;
            double e = exp_kernel(d);
            if (eo) eo[i + k] = e;
            int top = d == 0;
            acc->s[k] += top ? 0.0 : e;
            acc->n[k] += top;
            acc->sx[k] += e * d;
            acc->z[k] += zp;
        }
    }
    for (int k = 0; i < b; i++, k++) {
        double zp = xform_apply(x, (double)buf[i], has_cap);
        double d = zp - M;
        double e = exp_kernel(d);
        if (eo) eo[i] = e;
        int top = d == 0;
        acc->s[k] += top ? 0.0 : e;
        acc->n[k] += top;
        acc->sx[k] += e * d;
        acc->z[k] += zp;
    }
}

/* Pass 2 over the whole row; has_cap is a constant at each call site so
 * the transform is specialised away. */
static inline __attribute__((always_inline)) void
sum_row(const void *row, xent_dtype dt, int64_t V, int64_t tl, const xform *x,
        int has_cap, double M, sums8 *acc, double *ebuf /* [V] or NULL */) {
    float buf[BLOCK];
    size_t esz = xent_dtype_size(dt);
    for (int64_t j0 = 0; j0 < V; j0 += BLOCK) {
        int64_t n = V - j0 < BLOCK ? V - j0 : BLOCK;
        int64_t t = tl - j0;
        double *eo = ebuf ? ebuf + j0 : NULL;
#ifdef XENT_SIMD
        if (!has_cap) { /* straight from the row, same lanes as below */
            const void *src = (const char *)row + (size_t)j0 * esz;
            if (t >= 0 && t < n) {
                sum_range_simd(src, dt, 0, t, x->inv_tau, M, acc, eo);
                sum_range_simd(src, dt, t + 1, n, x->inv_tau, M, acc, eo);
            } else {
                sum_range_simd(src, dt, 0, n, x->inv_tau, M, acc, eo);
            }
            continue;
        }
#endif
        (void)esz;
        load_block(row, dt, j0, n, buf);
        if (t >= 0 && t < n) {
            sum_range(buf, 0, t, x, has_cap, M, acc, eo);
            sum_range(buf, t + 1, n, x, has_cap, M, acc, eo);
        } else {
            sum_range(buf, 0, n, x, has_cap, M, acc, eo);
        }
    }
}

static double lanes_total(const double *v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* Partial statistics of one row over columns [0, V) of `row`; tl is the
 * target's local column or -1 when this shard does not own it. */
/* Pass 1 over the row: max of the raw non-target logits, the NaN/inf flag
 * (any column, the target included) and the target's raw value. */
static void row_max(const void *row, xent_dtype dt, int64_t V, int64_t tl,
                    float *m_out, float *bad_out, double *target_out) {
    float buf[BLOCK];
    float m = -INFINITY, bad = 0.0f;
    double target = 0;
#ifdef XENT_SIMD
    (void)buf;
    if (tl >= 0) {
        float v = xent__load(row, dt, tl);
        target = v;
        bad += v - v;
    }
    if (tl < 0) {
        max_range_simd(row, dt, 0, V, &m, &bad);
    } else {
        max_range_simd(row, dt, 0, tl, &m, &bad);
        max_range_simd(row, dt, tl + 1, V, &m, &bad);
    }
#else
    for (int64_t j0 = 0; j0 < V; j0 += BLOCK) {
        int64_t n = V - j0 < BLOCK ? V - j0 : BLOCK;
        load_block(row, dt, j0, n, buf);
        int64_t t = tl - j0;
        if (t >= 0 && t < n) {
            target = buf[t];
            bad += buf[t] - buf[t];
            max_range(buf, 0, t, &m, &bad);
            max_range(buf, t + 1, n, &m, &bad);
        } else {
            max_range(buf, 0, n, &m, &bad);
        }
    }
#endif
    *m_out = m;
    *bad_out = bad;
    *target_out = target;
}

/* The shift M of pass 2 for a raw max m (0 when there is no column). */
static inline double shift_of(const xform *x, float m) {
    return m == -INFINITY ? 0.0 : xform_apply(x, m, x->has_cap);
}

/* Passes 1 and 2: the row's partial statistics. ebuf [V] (or NULL)
 * receives exp(z'_j - M) of every non-target column (0 at the target) when
 * the row is finite, for the gradient pass to reuse. */
static void row_partial(const void *row, xent_dtype dt, int64_t V, int64_t tl,
                        const xform *x, xent_ce_partial *p, double *ebuf) {
    float m, bad;
    double target;
    row_max(row, dt, V, tl, &m, &bad, &target);
    int has_cap = x->has_cap;
    double M = shift_of(x, m);
    sums8 acc;
    memset(&acc, 0, sizeof acc);
    double zt = 0;
    if (ebuf && tl >= 0) ebuf[tl] = 0;
    if (m != -INFINITY && bad == 0.0f) {
        if (has_cap) sum_row(row, dt, V, tl, x, 1, M, &acc, ebuf);
        else sum_row(row, dt, V, tl, x, 0, M, &acc, ebuf);
    }
    if (tl >= 0) zt = xform_apply(x, target, has_cap);
    p->max = m;
    /* S - 1: at least one column sits at the max when it is finite */
    p->sum = m == -INFINITY ? 0.0 : lanes_total(acc.s) + (lanes_total(acc.n) - 1.0);
    p->sumx = lanes_total(acc.sx);
    p->zsum = lanes_total(acc.z) + zt;
    p->target = target;
    p->flags = (tl >= 0 ? 1 : 0) | (bad != 0.0f ? 2 : 0);
}

/* ------------------------------------------------------------------------ */
/* Combine: partials of S shards -> the row's outputs                        */
/* ------------------------------------------------------------------------ */

typedef struct {
    double lse, nll, entropy, loss;
    int nonfinite;
} row_result;

static inline double softplus(double d) {
    return d > 0 ? d + log1p(exp(-d)) : log1p(exp(d));
}

/* parts[k * stride] for k in [0, S): the same row in each shard. */
static row_result combine_row(const xent_ce_partial *parts, int S,
                              int64_t stride, int counted, const xform *x,
                              double vocab_total, double eps, double kz) {
    row_result r = {0, 0, 0, 0, 0};
    double M = -INFINITY, target = 0;
    int owners = 0;
    for (int k = 0; k < S; k++) {
        const xent_ce_partial *p = &parts[k * stride];
        if (p->flags & 2) r.nonfinite = 1;
        if (p->flags & 1) { target = p->target; owners++; }
        if (p->max != -INFINITY) {
            double mk = xform_apply(x, p->max, x->has_cap);
            M = mk > M ? mk : M;
        }
    }
    if (r.nonfinite) { /* an ignored row still contributes no loss */
        r.lse = r.entropy = NAN;
        r.nll = r.loss = counted ? NAN : 0.0;
        return r;
    }
    /* Sm1 = S - 1, S = sum_{j != t} exp(z'_j - M): the shard(s) at M bring
     * their own S_k - 1, the others w_k S_k, all terms >= 0. */
    double top = 0, rest = 0, SX = 0, Z = 0;
    int have_top = 0;
    for (int k = 0; k < S; k++) {
        const xent_ce_partial *p = &parts[k * stride];
        Z += p->zsum;
        if (p->max == -INFINITY) continue;
        double off = xform_apply(x, p->max, x->has_cap) - M; /* <= 0 */
        double w = exp(off);
        if (off == 0 && !have_top) { top = p->sum; have_top = 1; }
        else rest += w * (p->sum + 1.0);
        SX += w * (p->sumx + off * (p->sum + 1.0));
    }
    double Sm1 = have_top ? top + rest : -1.0;
    double Ssum = Sm1 + 1.0;
    /* L = lse - M >= 0 is formed from non-negative terms, so the entropy
     * sum_{j != t} p_j (lse - z'_j) = e^-L (L S - SX) (both terms >= 0, SX
     * <= 0) keeps its relative accuracy even when it is tiny. */
    double L;
    if (counted && owners) {
        double zt = xform_apply(x, target, x->has_cap);
        double logS = Ssum > 0 ? log1p(Sm1) : -INFINITY;
        double d = (M - zt) + logS; /* lse_{j!=t} - z'_t */
        r.nll = softplus(d);
        r.lse = zt + r.nll;
        L = logS + softplus(-d);
        double nontarget_h = Ssum > 0 ? exp(-L) * (L * Ssum - SX) : 0.0;
        r.entropy = nontarget_h + exp(-r.nll) * r.nll;
        r.loss = (1.0 - eps) * r.nll + eps * (r.lse - Z / vocab_total) +
                 kz * r.lse * r.lse;
    } else {
        L = log1p(Sm1);
        r.lse = M + L;
        r.nll = 0;
        r.entropy = L - SX / Ssum;
        r.loss = 0;
    }
    return r;
}

/* ------------------------------------------------------------------------ */
/* Pass 3: the gradient of one row (or shard)                                */
/* ------------------------------------------------------------------------ */



static inline void store_range(void *grow, xent_dtype gt, int64_t j0,
                               const double *v, int64_t n) {
    if (gt == XENT_F32) {
        float *o = (float *)grow + j0;
        for (int64_t i = 0; i < n; i++) o[i] = (float)v[i];
    } else if (gt == XENT_BF16) {
        uint16_t *o = (uint16_t *)grow + j0;
#ifdef XENT_SIMD
        store_bf16_simd(o, v, n);
#else
        for (int64_t i = 0; i < n; i++) o[i] = store_bf16(v[i]);
#endif
    } else {
        uint16_t *o = (uint16_t *)grow + j0;
#ifdef XENT_SIMD
        store_f16_simd(o, v, n);
#else
        for (int64_t i = 0; i < n; i++) o[i] = store_f16(v[i]);
#endif
    }
}

static inline __attribute__((always_inline)) void
grad_row_impl(const void *row, xent_dtype dt, int64_t V, int64_t tl,
              const xform *x, int has_cap, const grad_row_params *gp,
              const double *ebuf, void *grow, xent_dtype gt) {
    float buf[BLOCK];
    double val[BLOCK], eblk[BLOCK];
    for (int64_t j0 = 0; j0 < V; j0 += BLOCK) {
        int64_t n = V - j0 < BLOCK ? V - j0 : BLOCK;
        int64_t t = tl - j0;
        if (gp->g == 0) {
            memset(val, 0, (size_t)n * sizeof(double));
            store_range(grow, gt, j0, val, n);
            continue;
        }
        /* e_j = exp(z'_j - M): from pass 2's buffer, or computed the same
         * way (backward from saved statistics); p_j = e_j s. */
        const double *e = ebuf ? ebuf + j0 : eblk;
#ifdef XENT_SIMD
        int simd = !has_cap;
#else
        int simd = 0;
#endif
        if (has_cap || (!ebuf && !simd) || (t >= 0 && t < n)) load_block(row, dt, j0, n, buf);
        if (!ebuf) {
#ifdef XENT_SIMD
            if (simd) exp_block_simd((const char *)row + (size_t)j0 * xent_dtype_size(dt), dt, n,
                                     x->inv_tau, gp->M, eblk);
            else
#endif
            for (int64_t i = 0; i < n; i++)
                eblk[i] = exp_kernel(xform_apply(x, buf[i], has_cap) - gp->M);
        }
#ifdef XENT_SIMD
        if (!has_cap) grad_vals_simd(e, n, gp->g * x->inv_tau, gp, val);
        else
#endif
        for (int64_t i = 0; i < n; i++) {
            double c = has_cap ? xform_slope(x, buf[i], 1) : x->inv_tau;
            val[i] = gp->g * c * (gp->a * (e[i] * gp->s) - gp->b);
        }
        if (t >= 0 && t < n)
            val[t] = gp->g * xform_slope(x, buf[t], has_cap) * gp->tgrad;
        store_range(grow, gt, j0, val, n);
    }
}

static void grad_row(const void *row, xent_dtype dt, int64_t V, int64_t tl,
                     const xform *x, const grad_row_params *gp,
                     const double *ebuf, void *grow, xent_dtype gt) {
    if (x->has_cap) grad_row_impl(row, dt, V, tl, x, 1, gp, ebuf, grow, gt);
    else grad_row_impl(row, dt, V, tl, x, 0, gp, ebuf, grow, gt);
}

static grad_row_params grad_params(const xent_ce_stats *st, int counted,
                                   double g, double kz, double eps,
                                   double vocab_total, double M) {
    grad_row_params gp;
    gp.M = M;
    gp.s = exp(M - st->lse);
    gp.g = counted ? g : 0.0;
    gp.lse = st->lse;
    gp.a = 1.0 + 2.0 * kz * st->lse;
    gp.b = eps / vocab_total;
    double pt = exp(-st->nll);
    /* (p_t - 1) + eps (1 - 1/V) written as (1 - eps)(p_t - 1) + eps (p_t - 1/V):
     * the first term is <= 0 and exact to relative u64, the second cancels
     * only within eps max(p_t, 1/V) u64 (docs/numerics.md) */
    gp.tgrad = (1.0 - eps) * expm1(-st->nll) + eps * (pt - 1.0 / vocab_total) +
               2.0 * kz * st->lse * pt;
    return gp;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

void xent_ce_opts_init(xent_ce_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->ignore_index = -100;
    o->reduction = XENT_REDUCE_MEAN;
    o->normalizer = 0;
    o->temperature = 1;
    o->softcap = 0;
    o->z_loss = 0;
    o->label_smoothing = 0;
    o->grad_scale = 1;
    o->vocab_start = 0;
    o->vocab_total = 0;
    o->threads = 0;
}

static int is_float_dtype(xent_dtype t) {
    return t == XENT_F32 || t == XENT_BF16 || t == XENT_F16;
}

xent_status xent__ce_check_opts(const xent_ce_opts *o, int64_t V) {
    if (!(isfinite(o->temperature) && o->temperature > 0))
        return xent__fail(XENT_ERR_VALUE, "opts.temperature = %g must be finite and > 0", o->temperature);
    if (!(isfinite(o->softcap) && o->softcap >= 0))
        return xent__fail(XENT_ERR_VALUE, "opts.softcap = %g must be finite and >= 0 (0 = off)", o->softcap);
    if (!(isfinite(o->z_loss) && o->z_loss >= 0))
        return xent__fail(XENT_ERR_VALUE, "opts.z_loss = %g must be finite and >= 0", o->z_loss);
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1))
        return xent__fail(XENT_ERR_VALUE, "opts.label_smoothing = %g must be in [0, 1]", o->label_smoothing);
    if (!(isfinite(o->normalizer) && o->normalizer >= 0))
        return xent__fail(XENT_ERR_VALUE, "opts.normalizer = %g must be finite and >= 0 (0 = row count)", o->normalizer);
    if (!isfinite(o->grad_scale))
        return xent__fail(XENT_ERR_VALUE, "opts.grad_scale = %g must be finite", o->grad_scale);
    if ((unsigned)o->reduction > XENT_REDUCE_MEAN)
        return xent__fail(XENT_ERR_VALUE, "opts.reduction = %d is not one of NONE (0), SUM (1), MEAN (2)", (int)o->reduction);
    if (o->threads < 0)
        return xent__fail(XENT_ERR_VALUE, "opts.threads = %d must be >= 0 (0 = all cores)", o->threads);
    if (o->vocab_start < 0)
        return xent__fail(XENT_ERR_VALUE, "opts.vocab_start = %lld must be >= 0", (long long)o->vocab_start);
    if (o->vocab_total < 0)
        return xent__fail(XENT_ERR_VALUE, "opts.vocab_total = %lld must be >= 0 (0 = V)", (long long)o->vocab_total);
    int64_t total = o->vocab_total ? o->vocab_total : V;
    if (o->vocab_start > total - V)
        return xent__fail(XENT_ERR_SHAPE,
                          "shard [vocab_start = %lld, + V = %lld) exceeds opts.vocab_total = %lld",
                          (long long)o->vocab_start, (long long)V, (long long)total);
    return XENT_OK;
}

static int64_t vocab_total_of(const xent_ce_opts *o, int64_t V) {
    return o->vocab_total ? o->vocab_total : V;
}

static xent_status check_labels(const xent_ce_input *in, const xent_ce_opts *o,
                                int64_t total) {
    if (!in->labels) return XENT_OK;
    for (int64_t r = 0; r < in->T; r++) {
        int64_t t = xent__label(in->labels, in->label_dtype, r);
        if (t == o->ignore_index) continue;
        if (t < 0 || t >= total)
            return xent__fail(XENT_ERR_LABEL,
                              "labels[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                              (long long)r, (long long)t, (long long)total, (long long)o->ignore_index);
    }
    return XENT_OK;
}

/* opts, or the defaults in *d when opts is NULL (every entry point). */
static const xent_ce_opts *opts_or_default(const xent_ce_opts *opts, xent_ce_opts *d) {
    if (opts) return opts;
    xent_ce_opts_init(d);
    return d;
}

/* Checks `in` and `opts` (not NULL: opts_or_default has run). */
static xent_status check_input(const xent_ce_input *in, const xent_ce_opts *o) {
    if (!in) return xent__fail(XENT_ERR_NULL, "input is NULL");
    if (in->T < 0) return xent__fail(XENT_ERR_SHAPE, "T = %lld must be >= 0", (long long)in->T);
    if (in->V <= 0) return xent__fail(XENT_ERR_SHAPE, "V = %lld must be >= 1", (long long)in->V);
    if (in->ld != 0 && in->ld < in->V)
        return xent__fail(XENT_ERR_SHAPE, "ld = %lld is smaller than V = %lld", (long long)in->ld, (long long)in->V);
    if (!is_float_dtype(in->dtype))
        return xent__fail(XENT_ERR_DTYPE, "logits dtype %s is not supported (f32, bf16, f16)", xent_dtype_name(in->dtype));
    if (in->T > 0 && !in->logits) return xent__fail(XENT_ERR_NULL, "logits is NULL with T = %lld", (long long)in->T);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent__fail(XENT_ERR_DTYPE, "labels dtype %s is not supported (i32, i64)", xent_dtype_name(in->label_dtype));
    if (in->grad_rows)
        for (int64_t r = 0; r < in->T; r++)
            if (!isfinite(in->grad_rows[r]))
                return xent__fail(XENT_ERR_VALUE, "grad_rows[%lld] = %g is not finite", (long long)r, (double)in->grad_rows[r]);
    xent_status s = xent__ce_check_opts(o, in->V);
    if (s) return s;
    return check_labels(in, o, vocab_total_of(o, in->V));
}

static xent_status check_grad(const xent_ce_input *in, const void *grad,
                              xent_dtype gt, int64_t ld_grad) {
    if (!grad) return XENT_OK;
    if (!is_float_dtype(gt))
        return xent__fail(XENT_ERR_DTYPE, "grad dtype %s is not supported (f32, bf16, f16)", xent_dtype_name(gt));
    if (ld_grad != 0 && ld_grad < in->V)
        return xent__fail(XENT_ERR_SHAPE, "ld_grad = %lld is smaller than V = %lld", (long long)ld_grad, (long long)in->V);
    if (grad == in->logits) {
        int64_t ldl = in->ld ? in->ld : in->V, ldg = ld_grad ? ld_grad : in->V;
        if (gt != in->dtype || ldl != ldg)
            return xent__fail(XENT_ERR_SHAPE,
                              "in-place gradient needs grad_dtype == logits dtype (%s vs %s) and equal row strides (%lld vs %lld)",
                              xent_dtype_name(gt), xent_dtype_name(in->dtype), (long long)ldg, (long long)ldl);
    }
    return XENT_OK;
}

/* ------------------------------------------------------------------------ */
/* The row loop                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
    const xent_ce_input *in;
    const xent_ce_opts *o;
    xform x;
    int64_t ld, ld_grad, total;
    double eps, kz, g_base; /* g_base: row scale for SUM/MEAN               */
    /* what to do */
    const xent_ce_stats *stats_in; /* backward only: saved stats             */
    const xent_ce_output *out;     /* forward outputs (may be NULL)          */
    void *grad;
    xent_dtype grad_dtype;
    xent_ce_partial *partial_out;  /* shard stats only                       */
    /* per row block: [nblocks] */
    double *block_loss;
    int64_t *block_counted, *block_nonfinite;
} job;

static int64_t target_of(const job *jb, int64_t r) {
    if (!jb->in->labels) return -1;
    int64_t t = xent__label(jb->in->labels, jb->in->label_dtype, r);
    return t == jb->o->ignore_index ? -1 : t;
}

static double row_scale(const job *jb, int64_t r) {
    if (jb->o->reduction != XENT_REDUCE_NONE) return jb->g_base;
    double g = jb->o->grad_scale;
    return jb->in->grad_rows ? g * (double)jb->in->grad_rows[r] : g;
}

static void write_row_outputs(const xent_ce_output *out, int64_t r,
                              const row_result *rr, int counted) {
    if (out->nll) out->nll[r] = (float)rr->nll;
    if (out->logprob) out->logprob[r] = (float)(-rr->nll) + 0.0f;
    if (out->lse) out->lse[r] = (float)rr->lse;
    if (out->entropy) out->entropy[r] = (float)rr->entropy;
    if (out->stats) {
        out->stats[r].lse = rr->lse;
        out->stats[r].nll = counted ? rr->nll : 0;
    }
}

static void run_rows(void *ctx, int64_t b0, int64_t b1) {
    job *jb = ctx;
    const xent_ce_input *in = jb->in;
    size_t esz = xent_dtype_size(in->dtype), gsz = xent_dtype_size(jb->grad_dtype);
    int64_t v0 = jb->o->vocab_start;
    /* [V] pass 2's exponentials, reused by the gradient pass; without it
     * (allocation failed) the gradient recomputes the same values */
    double *ebuf = jb->grad && !jb->stats_in ? malloc((size_t)in->V * sizeof(double)) : NULL;
    for (int64_t b = b0; b < b1; b++) {
        int64_t r0 = b * ROW_BLOCK, r1 = r0 + ROW_BLOCK < in->T ? r0 + ROW_BLOCK : in->T;
        double loss = 0;
        int64_t counted = 0, nonfinite = 0;
        for (int64_t r = r0; r < r1; r++) {
            const char *row = (const char *)in->logits + (size_t)r * (size_t)jb->ld * esz;
            int64_t t = target_of(jb, r);
            int64_t tl = (t >= v0 && t < v0 + in->V) ? t - v0 : -1;
            int is_counted = t >= 0;
            if (jb->partial_out) { /* shard statistics only */
                row_partial(row, in->dtype, in->V, tl, &jb->x, &jb->partial_out[r], NULL);
                nonfinite += (jb->partial_out[r].flags & 2) != 0;
                counted += is_counted;
                continue;
            }
            xent_ce_stats st;
            float m = -INFINITY;
            const double *e = NULL;
            if (jb->stats_in) { /* backward from saved statistics */
                st = jb->stats_in[r];
                if (jb->grad && row_scale(jb, r) != 0 && is_counted) {
                    float bad;
                    double zt;
                    row_max(row, in->dtype, in->V, tl, &m, &bad, &zt);
                }
            } else {
                xent_ce_partial p;
                row_partial(row, in->dtype, in->V, tl, &jb->x, &p, ebuf);
                m = (float)p.max;
                e = (p.flags & 2) ? NULL : ebuf;
                row_result rr = combine_row(&p, 1, 1, is_counted, &jb->x,
                                            (double)jb->total, jb->eps, jb->kz);
                write_row_outputs(jb->out, r, &rr, is_counted);
                if (jb->out->loss && jb->o->reduction == XENT_REDUCE_NONE)
                    jb->out->loss[r] = (float)rr.loss;
                loss += rr.loss;
                nonfinite += rr.nonfinite;
                st.lse = rr.lse;
                st.nll = rr.nll;
            }
            counted += is_counted;
            if (jb->grad) {
                grad_row_params gp = grad_params(&st, is_counted, row_scale(jb, r), jb->kz,
                                                 jb->eps, (double)jb->total, shift_of(&jb->x, m));
                char *grow = (char *)jb->grad + (size_t)r * (size_t)jb->ld_grad * gsz;
                grad_row(row, in->dtype, in->V, tl, &jb->x, &gp, e, grow, jb->grad_dtype);
            }
        }
        jb->block_loss[b] = loss;
        jb->block_counted[b] = counted;
        jb->block_nonfinite[b] = nonfinite;
    }
    free(ebuf);
}

static int64_t count_targets(const xent_ce_input *in, const xent_ce_opts *o) {
    if (!in->labels) return 0;
    int64_t n = 0;
    for (int64_t r = 0; r < in->T; r++)
        n += xent__label(in->labels, in->label_dtype, r) != o->ignore_index;
    return n;
}

static double mean_divisor(const xent_ce_opts *o, int64_t counted) {
    return o->normalizer > 0 ? o->normalizer : (double)counted;
}

/* Sets up a job, runs the rows, sums the blocks in order. */
static xent_status run_job(job *jb, double *loss_sum, int64_t *counted,
                           int64_t *nonfinite) {
    const xent_ce_input *in = jb->in;
    int64_t nblocks = (in->T + ROW_BLOCK - 1) / ROW_BLOCK;
    size_t nb = nblocks > 0 ? (size_t)nblocks : 1;
    char *mem = malloc(nb * (sizeof(double) + 2 * sizeof(int64_t)));
    if (!mem) return xent__fail(XENT_ERR_ALLOC, "cannot allocate %zu bytes of row-block scratch", nb * 24);
    jb->block_loss = (double *)mem;
    jb->block_counted = (int64_t *)(mem + nb * sizeof(double));
    jb->block_nonfinite = jb->block_counted + nb;
    jb->x = xform_make(jb->o);
    jb->ld = in->ld ? in->ld : in->V;
    jb->total = vocab_total_of(jb->o, in->V);
    jb->eps = jb->o->label_smoothing;
    jb->kz = jb->o->z_loss;
    /* rows per thread: at least ~1M elements each to pay for the thread */
    int threads = xent__threads(jb->o->threads);
    int64_t work = in->T * in->V / (1 << 20);
    if (work < threads) threads = work < 1 ? 1 : (int)work;
    xent__parallel_for(nblocks, threads, run_rows, jb);
    double s = 0;
    int64_t c = 0, nf = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        s += jb->block_loss[b];
        c += jb->block_counted[b];
        nf += jb->block_nonfinite[b];
    }
    free(mem);
    *loss_sum = s;
    *counted = c;
    *nonfinite = nf;
    return XENT_OK;
}

/* ------------------------------------------------------------------------ */
/* Public entry points                                                       */
/* ------------------------------------------------------------------------ */

static void write_reduced(const xent_ce_opts *o, float *loss, double sum,
                          int64_t counted) {
    if (!loss || o->reduction == XENT_REDUCE_NONE) return;
    if (o->reduction == XENT_REDUCE_SUM) {
        *loss = (float)sum;
    } else {
        double n = mean_divisor(o, counted);
        *loss = n > 0 ? (float)(sum / n) : 0.0f;
    }
}

static double base_scale(const xent_ce_opts *o, int64_t counted) {
    if (o->reduction == XENT_REDUCE_MEAN) {
        double n = mean_divisor(o, counted);
        return n > 0 ? o->grad_scale / n : 0.0;
    }
    return o->grad_scale;
}

xent_status xent_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                    xent_ce_output *out) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    if (!out) return xent__fail(XENT_ERR_NULL, "output is NULL");
    xent_status s = check_input(in, opts);
    if (s) return s;
    if (opts->vocab_start != 0 || (opts->vocab_total != 0 && opts->vocab_total != in->V))
        return xent__fail(XENT_ERR_VALUE,
                          "xent_ce needs whole rows (opts.vocab_start = %lld, opts.vocab_total = %lld, V = %lld); "
                          "for a vocabulary shard use xent_ce_shard_stats, xent_ce_combine and xent_ce_backward",
                          (long long)opts->vocab_start, (long long)opts->vocab_total, (long long)in->V);
    s = check_grad(in, out->grad, out->grad_dtype, out->ld_grad);
    if (s) return s;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.out = out;
    jb.grad = out->grad;
    jb.grad_dtype = out->grad ? out->grad_dtype : XENT_F32;
    jb.ld_grad = out->ld_grad ? out->ld_grad : in->V;
    jb.g_base = base_scale(opts, count_targets(in, opts));
    double sum;
    int64_t counted, nonfinite;
    s = run_job(&jb, &sum, &counted, &nonfinite);
    if (s) return s;
    write_reduced(opts, out->loss, sum, counted);
    if (out->n_counted) *out->n_counted = counted;
    if (out->n_nonfinite) *out->n_nonfinite = nonfinite;
    return XENT_OK;
}

xent_status xent_logprobs(const xent_ce_input *in, const xent_ce_opts *opts,
                          float *logprob, float *entropy) {
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.logprob = logprob;
    out.entropy = entropy;
    return xent_ce(in, opts, &out);
}

xent_status xent_ce_backward(const xent_ce_input *in, const xent_ce_opts *opts,
                             const xent_ce_stats *stats, void *grad,
                             xent_dtype grad_dtype, int64_t ld_grad) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    xent_status s = check_input(in, opts);
    if (s) return s;
    if (in->T > 0 && !stats) return xent__fail(XENT_ERR_NULL, "stats is NULL with T = %lld", (long long)in->T);
    if (in->T > 0 && !grad) return xent__fail(XENT_ERR_NULL, "grad is NULL with T = %lld", (long long)in->T);
    s = check_grad(in, grad, grad_dtype, ld_grad);
    if (s) return s;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.stats_in = stats;
    jb.grad = grad;
    jb.grad_dtype = grad_dtype;
    jb.ld_grad = ld_grad ? ld_grad : in->V;
    jb.g_base = base_scale(opts, count_targets(in, opts));
    double sum;
    int64_t counted, nonfinite;
    return run_job(&jb, &sum, &counted, &nonfinite);
}

xent_status xent_ce_shard_stats(const xent_ce_input *in, const xent_ce_opts *opts,
                                xent_ce_partial *partial) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    xent_status s = check_input(in, opts);
    if (s) return s;
    if (in->T > 0 && !partial) return xent__fail(XENT_ERR_NULL, "partial is NULL with T = %lld", (long long)in->T);
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.in = in;
    jb.o = opts;
    jb.partial_out = partial;
    double sum;
    int64_t counted, nonfinite;
    return run_job(&jb, &sum, &counted, &nonfinite);
}

xent_status xent_ce_combine(const xent_ce_partial *parts, int S,
                            const xent_ce_input *in, const xent_ce_opts *opts,
                            xent_ce_output *out) {
    xent_ce_opts dflt;
    opts = opts_or_default(opts, &dflt);
    if (!in) return xent__fail(XENT_ERR_NULL, "input is NULL");
    if (!out) return xent__fail(XENT_ERR_NULL, "output is NULL");
    if (S < 1) return xent__fail(XENT_ERR_SHAPE, "S = %d shards must be >= 1", S);
    if (in->T < 0) return xent__fail(XENT_ERR_SHAPE, "T = %lld must be >= 0", (long long)in->T);
    if (in->T > 0 && !parts) return xent__fail(XENT_ERR_NULL, "parts is NULL with T = %lld", (long long)in->T);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent__fail(XENT_ERR_DTYPE, "labels dtype %s is not supported (i32, i64)", xent_dtype_name(in->label_dtype));
    int64_t total = opts->vocab_total ? opts->vocab_total : (S == 1 ? in->V : 0);
    if (total <= 0)
        return xent__fail(XENT_ERR_SHAPE, "opts.vocab_total = %lld: the whole vocabulary size is needed to combine %d shards",
                          (long long)opts->vocab_total, S);
    xent_ce_opts o = *opts;
    o.vocab_start = 0;
    o.vocab_total = total;
    xent_status s = xent__ce_check_opts(&o, total);
    if (s) return s;
    s = check_labels(in, &o, total);
    if (s) return s;
    int64_t T = in->T;
    /* every counted row needs exactly one owner shard */
    for (int64_t r = 0; r < T; r++) {
        int64_t t = in->labels ? xent__label(in->labels, in->label_dtype, r) : o.ignore_index;
        int owners = 0;
        for (int k = 0; k < S; k++) owners += (int)(parts[(int64_t)k * T + r].flags & 1);
        if ((t != o.ignore_index && owners != 1) || (t == o.ignore_index && owners != 0))
            return xent__fail(XENT_ERR_VALUE,
                              "row %lld (label %lld): %d shards claim the target; expected %d (check each shard's vocab_start)",
                              (long long)r, (long long)t, owners, t != o.ignore_index);
    }
    xform x = xform_make(&o);
    double sum = 0, block = 0;
    int64_t counted = 0, nonfinite = 0;
    for (int64_t r = 0; r < T; r++) {
        int is_counted = in->labels && xent__label(in->labels, in->label_dtype, r) != o.ignore_index;
        row_result rr = combine_row(&parts[r], S, T, is_counted, &x, (double)total,
                                    o.label_smoothing, o.z_loss);
        write_row_outputs(out, r, &rr, is_counted);
        if (out->loss && o.reduction == XENT_REDUCE_NONE) out->loss[r] = (float)rr.loss;
        block += rr.loss; /* summed per ROW_BLOCK rows, as xent_ce does */
        if ((r + 1) % ROW_BLOCK == 0 || r + 1 == T) { sum += block; block = 0; }
        counted += is_counted;
        nonfinite += rr.nonfinite;
    }
    write_reduced(&o, out->loss, sum, counted);
    if (out->n_counted) *out->n_counted = counted;
    if (out->n_nonfinite) *out->n_nonfinite = nonfinite;
    return XENT_OK;
}
