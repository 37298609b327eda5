/* src/cpu/ce_isa_avx512.c: the AVX-512 table (ce_kern.h), compiled for
 * AVX-512 F/DQ/VL/BW whatever the build's -march (target pragma) and used
 * only when cpuid reports them. Each loop does, lane for lane, exactly the
 * operations of the generic C loops (ce_kern_generic.h): the same fma, the
 * same rounding, the same lane assignment of the sums, so the results are
 * bitwise those of the other paths (tests/test_cpu_isa.c). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c")
#endif

#include "cpu/ce_kern.h"

#include <immintrin.h>

static inline __m512d exp8(__m512d x) {
    const __m512d shift = _mm512_set1_pd(0x1.8p52);
    const __m512i tlo = _mm512_loadu_si512(xent__exp_tabb), thi = _mm512_loadu_si512(xent__exp_tabb + 8);
    /* x >= -708 (false on NaN: the NaN goes through, as in the C text) */
    __mmask8 keep = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-708.0), _CMP_NLT_UQ);
    /* x < -708 ? -708 : x (vmaxpd returns its second operand on NaN) */
    __m512d xc = _mm512_max_pd(_mm512_set1_pd(-708.0), x);
    __m512d kd = _mm512_fmadd_pd(xc, _mm512_set1_pd(0x1.71547652b82fep+4), shift);
    __m512i ki = _mm512_castpd_si512(kd);
    /* exp_tabb[k & 15]: the low bits of kd + 1.5 2^52 are those of k */
    __m512i t = _mm512_permutex2var_epi64(tlo, ki, thi);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(0x1.62e42fefa39efp-5), xc);
    __m512d p = _mm512_set1_pd(1.0 / 120.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    /* 2^m 2^(j/16) by integer addition (the C text's tb), then one
     * rounding; 0 below -708 */
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 48));
    return _mm512_maskz_mul_pd(keep, p, _mm512_castsi512_pd(t));
}

/* exp8 of xu vectors, each step applied to all before the next: the same
 * operations per lane (the same bits), with xu independent chains in
 * flight so that the long latency of one chain is hidden. */
#define XU 8 /* at most XU vectors of 8 per iteration of the main loop */
static inline __attribute__((always_inline)) void expn(const __m512d *x, __m512d *e, int clamp, int xu) {
    const __m512d shift = _mm512_set1_pd(0x1.8p52);
    const __m512i tlo = _mm512_loadu_si512(xent__exp_tabb), thi = _mm512_loadu_si512(xent__exp_tabb + 8);
    const __m512d lo = _mm512_set1_pd(-708.0);
    __mmask8 keep[XU];
    __m512d xc[XU], kd[XU], r[XU], p[XU];
    __m512i t[XU];
    for (int u = 0; u < xu; u++) {
        /* clamp == 0: the caller knows x >= -708 (the clamp is the identity) */
        keep[u] = clamp ? _mm512_cmp_pd_mask(x[u], lo, _CMP_NLT_UQ) : (__mmask8)0xFF;
        xc[u] = clamp ? _mm512_max_pd(lo, x[u]) : x[u];
    }
    for (int u = 0; u < xu; u++) kd[u] = _mm512_fmadd_pd(xc[u], _mm512_set1_pd(0x1.71547652b82fep+4), shift);
    for (int u = 0; u < xu; u++) {
        __m512i ki = _mm512_castpd_si512(kd[u]);
        t[u] = _mm512_add_epi64(_mm512_permutex2var_epi64(tlo, ki, thi), _mm512_slli_epi64(ki, 48));
        kd[u] = _mm512_sub_pd(kd[u], shift);
    }
    for (int u = 0; u < xu; u++) r[u] = _mm512_fnmadd_pd(kd[u], _mm512_set1_pd(0x1.62e42fefa39efp-5), xc[u]);
    for (int u = 0; u < xu; u++) p[u] = _mm512_fmadd_pd(_mm512_set1_pd(1.0 / 120.0), r[u], _mm512_set1_pd(1.0 / 24.0));
    for (int u = 0; u < xu; u++) p[u] = _mm512_fmadd_pd(p[u], r[u], _mm512_set1_pd(1.0 / 6.0));
    for (int u = 0; u < xu; u++) p[u] = _mm512_fmadd_pd(p[u], r[u], _mm512_set1_pd(0.5));
    for (int u = 0; u < xu; u++) p[u] = _mm512_fmadd_pd(p[u], r[u], _mm512_set1_pd(1.0));
    for (int u = 0; u < xu; u++) p[u] = _mm512_fmadd_pd(p[u], r[u], _mm512_set1_pd(1.0));
    for (int u = 0; u < xu; u++) e[u] = _mm512_maskz_mul_pd(keep[u], p[u], _mm512_castsi512_pd(t[u]));
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

static void max_range(const void *src, xent_dtype dt, int64_t a, int64_t b,
                      float *m, float *bad) {
    __m512 mm = _mm512_set1_ps(-INFINITY), bb = _mm512_setzero_ps();
    int64_t i = a;
    for (; i + 16 <= b; i += 16) {
        __m512 v = load16f(src, dt, i, (__mmask16)0xFFFF, 0.0f);
        mm = _mm512_max_ps(v, mm); /* v > mm ? v : mm: NaN left out */
        bb = _mm512_add_ps(bb, _mm512_sub_ps(v, v));
    }
    if (i < b) {
        __mmask16 k = tail16(b - i);
        __m512 v = load16f(src, dt, i, k, -INFINITY);
        __m512 vz = load16f(src, dt, i, k, 0.0f);
        mm = _mm512_max_ps(v, mm); /* v > mm ? v : mm: NaN left out */
        bb = _mm512_add_ps(bb, _mm512_sub_ps(vz, vz));
    }
    float m1 = _mm512_reduce_max_ps(mm), b1 = _mm512_reduce_add_ps(bb);
    *m = m1 > *m ? m1 : *m;
    *bad += b1;
}

/* d and the value summed into acc->z, as kg_arg does it; rel == 2: the
 * form of rel == 0 with inv_tau == 1 (z * 1 == z: the same bits) */
static inline __attribute__((always_inline)) __m512d
arg8(__m512d z, int rel, __m512d it, __m512d Mv, __m512d mv, __m512d *zacc) {
    if (rel == 2) {
        *zacc = z;
        return _mm512_sub_pd(z, Mv);
    }
    if (rel) {
        __m512d d = _mm512_mul_pd(_mm512_sub_pd(z, mv), it);
        *zacc = d;
        return d;
    }
    __m512d zp = _mm512_mul_pd(z, it);
    *zacc = zp;
    return _mm512_sub_pd(zp, Mv);
}

/* The stores and the sums of one vector of 8 (lanes of k only), given
 * d, e = exp(d) and the value zp summed for the z sum. */
static inline __attribute__((always_inline)) void
acc8(__m512d d, __m512d e, __m512d zp, __mmask8 top, __mmask8 k, int full, int need, int eok,
     const __m512d *c, __m512d *s, __m512d *nn, __m512d *sx, __m512d *zs, double *eo,
     float *eof) {
    const __m512d one = c[3];
    if (eok == 1) {
        if (full) _mm512_storeu_pd(eo, e);
        else _mm512_mask_storeu_pd(eo, k, e);
    } else if (eok == 2) {
        if (full) _mm256_storeu_ps(eof, _mm512_cvtpd_ps(e));
        else _mm256_mask_storeu_ps(eof, k, _mm512_cvtpd_ps(e));
    }
    *s = _mm512_mask_add_pd(*s, k & (__mmask8)~top, *s, e);
    if (nn) *nn = _mm512_mask_add_pd(*nn, k & top, *nn, one);
    if (need & XENT__NEED_SX) *sx = _mm512_mask_add_pd(*sx, k, *sx, _mm512_mul_pd(e, d));
    if (need & XENT__NEED_Z) *zs = _mm512_mask_add_pd(*zs, k, *zs, zp);
}

/* One vector of 8: d, e, the stores and the sums (lanes of k only). */
static inline __attribute__((always_inline)) void
sum8(__m512d z, __mmask8 k, int full, int rel, int need, int eok, const __m512d *c,
     __m512d *s, __m512d *nn, __m512d *sx, __m512d *zs, double *eo, float *eof) {
    __m512d zp;
    __m512d d = arg8(z, rel, c[0], c[1], c[2], &zp);
    /* the columns at the max: z == m (the raw max; the same as d == 0) */
    __mmask8 top = _mm512_cmp_pd_mask(z, c[2], _CMP_EQ_OQ);
    acc8(d, exp8(d), zp, top, k, full, need, eok, c, s, nn, sx, zs, eo, eof);
}

static inline __attribute__((always_inline)) void
sum_range_t(const void *src, xent_dtype dt, int64_t a, int64_t b, const xent__shift *sh,
            int rel, int need, int eok, int clamp, xent__sums8 *acc, double *eo, float *eof) {
    __m512d s = _mm512_loadu_pd(acc->s), sx = _mm512_loadu_pd(acc->sx);
    __m512d zs = _mm512_loadu_pd(acc->z), nn = _mm512_loadu_pd(acc->n);
    const __m512d c[5] = {_mm512_set1_pd(sh->inv_tau), _mm512_set1_pd(sh->M),
                          _mm512_set1_pd(sh->m), _mm512_set1_pd(1.0), _mm512_setzero_pd()};
    int64_t i = a;
    const __m512 mf = _mm512_set1_ps((float)sh->m);
    int64_t ntop = 0; /* columns at the max in the 32-element loop */
    /* 8 xu elements an iteration (xu interleaved exps, the same lane order
     * of the sums: lane k still takes a + k, a + 8 + k, ... in turn; the
     * count of columns at the max is a total, exact in any order) */
    /* eight vectors an iteration without stores, four with (registers) */
    const int xu = eok ? 4 : XU;
    for (; i + 8 * xu <= b; i += 8 * xu) {
        __m512d z[XU], d[XU], zp[XU], e[XU];
        __mmask8 top[XU];
        for (int h = 0; h < xu / 2; h++) {
            __m512 f = load16f(src, dt, i + 16 * h, (__mmask16)0xFFFF, 0.0f);
            __mmask16 t16 = _mm512_cmp_ps_mask(f, mf, _CMP_EQ_OQ);
            ntop += __builtin_popcount((unsigned)t16);
            top[2 * h] = (__mmask8)t16;
            top[2 * h + 1] = (__mmask8)(t16 >> 8);
            z[2 * h] = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
            z[2 * h + 1] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
        }
        for (int u = 0; u < xu; u++) d[u] = arg8(z[u], rel, c[0], c[1], c[2], &zp[u]);
        expn(d, e, clamp, xu);
        for (int u = 0; u < xu; u++)
            acc8(d[u], e[u], zp[u], top[u], 0xFF, 1, need, eok, c, &s, NULL, &sx, &zs,
                 eok == 1 ? eo + i + 8 * u : NULL, eok == 2 ? eof + i + 8 * u : NULL);
    }
    nn = _mm512_mask_add_pd(nn, 1, nn, _mm512_set1_pd((double)ntop));
    /* 16 elements an iteration (two independent exps, the same lane order) */
    for (; i + 16 <= b; i += 16) {
        __m512 f = load16f(src, dt, i, (__mmask16)0xFFFF, 0.0f);
        __m512d z0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
        __m512d z1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
        sum8(z0, 0xFF, 1, rel, need, eok, c, &s, &nn, &sx, &zs, eok == 1 ? eo + i : NULL,
             eok == 2 ? eof + i : NULL);
        sum8(z1, 0xFF, 1, rel, need, eok, c, &s, &nn, &sx, &zs, eok == 1 ? eo + i + 8 : NULL,
             eok == 2 ? eof + i + 8 : NULL);
    }
    for (; i < b; i += 8) {
        __mmask8 k = b - i >= 8 ? (__mmask8)0xFF : tail8(b - i);
        sum8(load8d(src, dt, i, k), k, 0, rel, need, eok, c, &s, &nn, &sx, &zs,
             eok == 1 ? eo + i : NULL, eok == 2 ? eof + i : NULL);
    }
    _mm512_storeu_pd(acc->s, s);
    _mm512_storeu_pd(acc->sx, sx);
    _mm512_storeu_pd(acc->z, zs);
    _mm512_storeu_pd(acc->n, nn);
}

#define SUM_EO2(rel, need, clamp)                                                            \
    do {                                                                                     \
        if (eo) sum_range_t(src, dt, a, b, sh, rel, need, 1, clamp, acc, eo, NULL);          \
        else if (eof) sum_range_t(src, dt, a, b, sh, rel, need, 2, clamp, acc, NULL, eof);   \
        else sum_range_t(src, dt, a, b, sh, rel, need, 0, clamp, acc, NULL, NULL);           \
    } while (0)
#define SUM_EO1(rel, need, clamp)                                                            \
    do {                                                                                     \
        if (dt == XENT_BF16) {                                                               \
            const xent_dtype dt = XENT_BF16; /* a constant: one loop per dtype */          \
            SUM_EO2(rel, need, clamp);                                                       \
        } else if (dt == XENT_F32) {                                                         \
            const xent_dtype dt = XENT_F32;                                                  \
            SUM_EO2(rel, need, clamp);                                                       \
        } else {                                                                             \
            const xent_dtype dt = XENT_F16;                                                  \
            SUM_EO2(rel, need, clamp);                                                       \
        }                                                                                    \
    } while (0)
#define SUM_EO(rel, need)                        \
    do {                                         \
        if (clamp) SUM_EO1(rel, need, 1);        \
        else SUM_EO1(rel, need, 0);              \
    } while (0)

/* min of src[a, b) as fp32 (finite rows only reach pass 2) */
static float min_range(const void *src, xent_dtype dt, int64_t a, int64_t b) {
    __m512 mn = _mm512_set1_ps(INFINITY);
    for (int64_t i = a; i < b; i += 16) {
        __mmask16 k = b - i >= 16 ? (__mmask16)0xFFFF : tail16(b - i);
        mn = _mm512_min_ps(mn, load16f(src, dt, i, k, INFINITY));
    }
    return _mm512_reduce_min_ps(mn);
}

static void sum_range(const void *src, xent_dtype dt, int64_t a, int64_t b,
                      const xent__shift *sh, int need, xent__sums8 *acc, double *eo,
                      float *eof) {
    /* d is nondecreasing in z (each rounding is), so when d at the block's
     * smallest z is >= -708, exp's clamp is the identity for every column
     * of the block and the loop may skip it (the same bits) */
    int clamp = 1;
    if (b > a) {
        double zmin = (double)min_range(src, dt, a, b);
        double dmin = sh->rel ? (zmin - sh->m) * sh->inv_tau : zmin * sh->inv_tau - sh->M;
        clamp = !(dmin >= -708.0);
    }
    if (sh->rel) {
        SUM_EO(1, 3);
    } else if (need == 0 && sh->inv_tau == 1.0) {
        SUM_EO(2, 0);
    } else if (need == 0) {
        SUM_EO(0, 0);
    } else {
        SUM_EO(0, 3);
    }
}

static void exp_block(const void *src, xent_dtype dt, int64_t n,
                      const xent__shift *sh, double *e) {
    const __m512d it = _mm512_set1_pd(sh->inv_tau), Mv = _mm512_set1_pd(sh->M);
    const __m512d mv = _mm512_set1_pd(sh->m);
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m512d z = load8d(src, dt, i, k), zp;
        _mm512_mask_storeu_pd(e + i, k, exp8(arg8(z, sh->rel, it, Mv, mv, &zp)));
    }
}

/* f32 bits of v rounded to odd (see xent__f32_bits_round_odd): the
 * conversion toward zero, with the last bit set when it was inexact (the
 * odd one of the two neighbours; FLT_MAX above it, the smallest subnormal
 * below it, as the C text gives) */
static inline __m256i round_odd8(__m512d v) {
    __m256 f = _mm512_cvt_roundpd_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(f), v, _CMP_NEQ_UQ);
    __m256i u = _mm256_castps_si256(f);
    return _mm256_mask_or_epi32(u, inexact, u, _mm256_set1_epi32(1));
}

/* bf16 bits (in 32-bit lanes) of fp32 bits u, to nearest even */
static inline __m512i bf16_rne16(__m512i u) {
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
}

static inline __attribute__((always_inline)) void
store8(void *o, xent_dtype gt, int64_t i, __mmask8 k, __m512d v) {
    if (gt == XENT_F32) {
        _mm256_mask_storeu_ps((float *)o + i, k, _mm512_cvtpd_ps(v));
    } else if (gt == XENT_BF16) {
        __m256i u = round_odd8(v);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
        u = _mm256_srli_epi32(u, 16);
        _mm_mask_storeu_epi16((uint16_t *)o + i, k, _mm256_cvtepi32_epi16(u));
    } else {
        __m256i u = round_odd8(v);
        __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT);
        _mm_mask_storeu_epi16((uint16_t *)o + i, k, h);
    }
}

static inline __attribute__((always_inline)) void
grad_store_t(const double *e, int64_t n, double gc, double s, double a, double b,
             void *o, xent_dtype gt, int ua, int ub, int nt) {
    const __m512d gcv = _mm512_set1_pd(gc), sv = _mm512_set1_pd(s);
    const __m512d av = _mm512_set1_pd(a), bv = _mm512_set1_pd(b);
    int64_t i = 0;
    /* fp32 gradient, 32-byte aligned: streaming stores of whole vectors */
    if (nt && gt == XENT_F32 && ((uintptr_t)o & 31) == 0) {
        for (; i + 8 <= n; i += 8) {
            __m512d p = _mm512_mul_pd(_mm512_loadu_pd(e + i), sv);
            if (ua) p = _mm512_mul_pd(av, p);
            if (ub) p = _mm512_sub_pd(p, bv);
            _mm256_stream_ps((float *)o + i, _mm512_cvtpd_ps(_mm512_mul_pd(gcv, p)));
        }
        _mm_sfence();
    }
    for (; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m512d p = _mm512_mul_pd(_mm512_maskz_loadu_pd(k, e + i), sv);
        if (ua) p = _mm512_mul_pd(av, p);
        if (ub) p = _mm512_sub_pd(p, bv);
        store8(o, gt, i, k, _mm512_mul_pd(gcv, p));
    }
}

static void grad_store(const double *e, int64_t n, double gc, double s, double a,
                       double b, void *o, xent_dtype gt, int nt) {
    int ua = a != 1.0, ub = b != 0.0;
    if (!ua && !ub) grad_store_t(e, n, gc, s, a, b, o, gt, 0, 0, nt);
    else grad_store_t(e, n, gc, s, a, b, o, gt, 1, 1, nt);
}

static inline __m256i grad16(const float *e, __mmask16 k, __m512 cv, xent_dtype gt) {
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, e), cv);
    return gt == XENT_BF16 ? _mm512_cvtepi32_epi16(bf16_rne16(_mm512_castps_si512(v)))
                           : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

static void grad_f32(const float *e, int64_t n, float c, void *o, xent_dtype gt, int nt) {
    const __m512 cv = _mm512_set1_ps(c);
    uint16_t *h = (uint16_t *)o;
    int64_t i = 0;
    /* 32-byte aligned output: streaming stores of whole vectors */
    if (nt && ((uintptr_t)o & 31) == 0) {
        for (; i + 16 <= n; i += 16)
            _mm256_stream_si256((__m256i *)(h + i), grad16(e + i, (__mmask16)0xFFFF, cv, gt));
        _mm_sfence();
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : tail16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, e + i), cv);
        __m256i r = gt == XENT_BF16
                        ? _mm512_cvtepi32_epi16(bf16_rne16(_mm512_castps_si512(v)))
                        : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(h + i, k, r);
    }
}

static void store(void *grow, xent_dtype gt, const double *v, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        store8(grow, gt, i, k, _mm512_maskz_loadu_pd(k, v + i));
    }
}

const xent__cpu_kern xent__kern_avx512 = {"avx512",   max_range,  sum_range, exp_block,
                                          grad_store, grad_f32, store};
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int xent__no_avx512; /* not x86-64: nothing to build */
#endif
