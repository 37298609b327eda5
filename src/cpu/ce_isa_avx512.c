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
    const __m512d tlo = _mm512_loadu_pd(xent__exp_tab), thi = _mm512_loadu_pd(xent__exp_tab + 8);
    /* x >= -708 (false on NaN: the NaN goes through, as in the C text) */
    __mmask8 keep = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-708.0), _CMP_NLT_UQ);
    /* x < -708 ? -708 : x (vmaxpd returns its second operand on NaN) */
    __m512d xc = _mm512_max_pd(_mm512_set1_pd(-708.0), x);
    __m512d kd = _mm512_fmadd_pd(xc, _mm512_set1_pd(0x1.71547652b82fep+4), shift);
    /* exp_tab[k & 15]: the low bits of kd + 1.5 2^52 are those of k */
    __m512d t = _mm512_permutex2var_pd(tlo, _mm512_castpd_si512(kd), thi);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(0x1.62e42fefa39efp-5), xc);
    __m512d p = _mm512_set1_pd(1.0 / 120.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    /* (p t) 2^floor(k/16), one rounding (the C text's multiply by the
     * constructed 2^m, m >= -1022); 0 below -708 */
    return _mm512_maskz_scalef_pd(keep, _mm512_mul_pd(p, t), _mm512_mul_pd(kd, _mm512_set1_pd(0.0625)));
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

/* One vector of 8: d, e, the stores and the sums (lanes of k only). */
static inline __attribute__((always_inline)) void
sum8(__m512d z, __mmask8 k, int full, int rel, int need, int eok, const __m512d *c,
     __m512d *s, __m512d *nn, __m512d *sx, __m512d *zs, double *eo, float *eof) {
    const __m512d it = c[0], Mv = c[1], mv = c[2], one = c[3], zero = c[4];
    __m512d zp;
    __m512d d = arg8(z, rel, it, Mv, mv, &zp);
    __m512d e = exp8(d);
    if (eok == 1) {
        if (full) _mm512_storeu_pd(eo, e);
        else _mm512_mask_storeu_pd(eo, k, e);
    } else if (eok == 2) {
        if (full) _mm256_storeu_ps(eof, _mm512_cvtpd_ps(e));
        else _mm256_mask_storeu_ps(eof, k, _mm512_cvtpd_ps(e));
    }
    __mmask8 top = _mm512_cmp_pd_mask(d, zero, _CMP_EQ_OQ);
    *s = _mm512_mask_add_pd(*s, k & (__mmask8)~top, *s, e);
    *nn = _mm512_mask_add_pd(*nn, k & top, *nn, one);
    if (need & XENT__NEED_SX) *sx = _mm512_mask_add_pd(*sx, k, *sx, _mm512_mul_pd(e, d));
    if (need & XENT__NEED_Z) *zs = _mm512_mask_add_pd(*zs, k, *zs, zp);
}

static inline __attribute__((always_inline)) void
sum_range_t(const void *src, xent_dtype dt, int64_t a, int64_t b, const xent__shift *sh,
            int rel, int need, int eok, xent__sums8 *acc, double *eo, float *eof) {
    __m512d s = _mm512_loadu_pd(acc->s), sx = _mm512_loadu_pd(acc->sx);
    __m512d zs = _mm512_loadu_pd(acc->z), nn = _mm512_loadu_pd(acc->n);
    const __m512d c[5] = {_mm512_set1_pd(sh->inv_tau), _mm512_set1_pd(sh->M),
                          _mm512_set1_pd(sh->m), _mm512_set1_pd(1.0), _mm512_setzero_pd()};
    int64_t i = a;
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

#define SUM_EO(rel, need)                                                              \
    do {                                                                               \
        if (eo) sum_range_t(src, dt, a, b, sh, rel, need, 1, acc, eo, NULL);           \
        else if (eof) sum_range_t(src, dt, a, b, sh, rel, need, 2, acc, NULL, eof);    \
        else sum_range_t(src, dt, a, b, sh, rel, need, 0, acc, NULL, NULL);            \
    } while (0)

static void sum_range(const void *src, xent_dtype dt, int64_t a, int64_t b,
                      const xent__shift *sh, int need, xent__sums8 *acc, double *eo,
                      float *eof) {
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
             void *o, xent_dtype gt, int ua, int ub) {
    const __m512d gcv = _mm512_set1_pd(gc), sv = _mm512_set1_pd(s);
    const __m512d av = _mm512_set1_pd(a), bv = _mm512_set1_pd(b);
    for (int64_t i = 0; i < n; i += 8) {
        __mmask8 k = n - i >= 8 ? (__mmask8)0xFF : tail8(n - i);
        __m512d p = _mm512_mul_pd(_mm512_maskz_loadu_pd(k, e + i), sv);
        if (ua) p = _mm512_mul_pd(av, p);
        if (ub) p = _mm512_sub_pd(p, bv);
        store8(o, gt, i, k, _mm512_mul_pd(gcv, p));
    }
}

static void grad_store(const double *e, int64_t n, double gc, double s, double a,
                       double b, void *o, xent_dtype gt) {
    int ua = a != 1.0, ub = b != 0.0;
    if (!ua && !ub) grad_store_t(e, n, gc, s, a, b, o, gt, 0, 0);
    else grad_store_t(e, n, gc, s, a, b, o, gt, 1, 1);
}

static void grad_f32(const float *e, int64_t n, float c, void *o, xent_dtype gt) {
    const __m512 cv = _mm512_set1_ps(c);
    uint16_t *h = (uint16_t *)o;
    for (int64_t i = 0; i < n; i += 16) {
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
