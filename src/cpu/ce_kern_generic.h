/* src/cpu/ce_kern_generic.h: the hot loops in plain C (see ce_kern.h).
 * Included once by each translation unit that builds a table from them
 * (ce_isa_base.c at the build's -march, ce_isa_avx2.c under a target
 * pragma), so the compiler vectorises the same text for each instruction
 * set; the results do not depend on it (no reassociation, fma written out,
 * -ffp-contract=off). Defines XENT__GEN_TABLE(sym, name). */
#ifndef XENT_CE_KERN_GENERIC_H
#define XENT_CE_KERN_GENERIC_H

#include "cpu/ce_kern.h"

/* buf[i] = src[a + i] as fp32 (exact), i in [0, n). */
static void kg_load(const void *src, xent_dtype dt, int64_t a, int64_t n, float *buf) {
    if (dt == XENT_F32) {
        memcpy(buf, (const float *)src + a, (size_t)n * sizeof(float));
    } else if (dt == XENT_BF16) {
        const uint16_t *h = (const uint16_t *)src + a;
        for (int64_t i = 0; i < n; i++) buf[i] = xent__bf16_f32(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)src + a;
        for (int64_t i = 0; i < n; i++) buf[i] = xent__f16_f32(h[i]);
    }
}

/* Sixteen lanes so that the loop vectorises without reassociation. */
static void kg_max_range(const void *src, xent_dtype dt, int64_t a, int64_t b,
                         float *m, float *bad) {
    float buf[XENT__BLOCK];
    float mm[16], bb[16];
    for (int k = 0; k < 16; k++) { mm[k] = -INFINITY; bb[k] = 0.0f; }
    float m1 = *m, b1 = *bad;
    for (int64_t j0 = a; j0 < b; j0 += XENT__BLOCK) {
        int64_t n = b - j0 < XENT__BLOCK ? b - j0 : XENT__BLOCK;
        kg_load(src, dt, j0, n, buf);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int k = 0; k < 16; k++) {
                float v = buf[i + k];
                mm[k] = v > mm[k] ? v : mm[k];
                bb[k] += v - v;
            }
        for (; i < n; i++) {
            m1 = buf[i] > m1 ? buf[i] : m1;
            b1 += buf[i] - buf[i];
        }
    }
    for (int k = 0; k < 16; k++) {
        m1 = mm[k] > m1 ? mm[k] : m1;
        b1 += bb[k];
    }
    *m = m1;
    *bad = b1;
}

static inline __attribute__((always_inline)) double
kg_arg(double z, const xent__shift *sh, double *zacc) {
    if (sh->rel) {
        double d = (z - sh->m) * sh->inv_tau;
        *zacc = d;
        return d;
    }
    double zp = z * sh->inv_tau;
    *zacc = zp;
    return zp - sh->M;
}

static inline __attribute__((always_inline)) void
kg_sum1(double z, const xent__shift *sh, int need, xent__sums8 *acc, int k, double *eo,
        float *eof, int64_t i) {
    double zp;
    double d = kg_arg(z, sh, &zp);
    double e = xent__exp_kernel(d);
    if (eo) eo[i] = e;
    if (eof) eof[i] = (float)e;
    /* the columns at the max: z == m, the raw max (the same as d == 0:
     * distinct floats stay distinct through z / tau and - M) */
    int top = z == sh->m;
    acc->s[k] += top ? 0.0 : e;
    acc->n[k] += top;
    if (need & XENT__NEED_SX) acc->sx[k] += e * d;
    if (need & XENT__NEED_Z) acc->z[k] += zp;
}

static void kg_sum_range(const void *src, xent_dtype dt, int64_t a, int64_t b,
                         const xent__shift *sh, int need, xent__sums8 *acc, double *eo,
                         float *eof) {
    float buf[XENT__BLOCK];
    int64_t n = b - a;
    kg_load(src, dt, a, n, buf);
    if (eo) eo += a;
    if (eof) eof += a;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) kg_sum1((double)buf[i + k], sh, need, acc, k, eo, eof, i + k);
    for (int k = 0; i < n; i++, k++) kg_sum1((double)buf[i], sh, need, acc, k, eo, eof, i);
}

static void kg_exp_block(const void *src, xent_dtype dt, int64_t n,
                         const xent__shift *sh, double *e) {
    float buf[XENT__BLOCK];
    kg_load(src, dt, 0, n, buf);
    for (int64_t i = 0; i < n; i++) {
        double zp;
        e[i] = xent__exp_kernel(kg_arg((double)buf[i], sh, &zp));
    }
}

static void kg_store(void *grow, xent_dtype gt, const double *v, int64_t n) {
    if (gt == XENT_F32) {
        float *o = (float *)grow;
        for (int64_t i = 0; i < n; i++) o[i] = (float)v[i];
    } else if (gt == XENT_BF16) {
        uint16_t *o = (uint16_t *)grow;
        for (int64_t i = 0; i < n; i++) o[i] = xent__store_bf16(v[i]);
    } else {
        uint16_t *o = (uint16_t *)grow;
        for (int64_t i = 0; i < n; i++) o[i] = xent__store_f16(v[i]);
    }
}

static void kg_grad_store(const double *e, int64_t n, double gc, double s, double a,
                          double b, void *o, xent_dtype gt, int nt) {
    (void)nt; /* plain stores: the same values */
    double val[XENT__BLOCK];
    int ua = a != 1.0, ub = b != 0.0;
    for (int64_t i = 0; i < n; i++) {
        double p = e[i] * s;
        if (ua) p = a * p;
        if (ub) p = p - b;
        val[i] = gc * p;
    }
    kg_store(o, gt, val, n);
}

/* fp32 -> bf16 to nearest even (NaN keeps a quiet payload) */
static inline uint16_t kg_bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void kg_grad_f32(const float *e, int64_t n, float c, void *o, xent_dtype gt, int nt) {
    (void)nt;
    uint16_t *h = (uint16_t *)o;
    if (gt == XENT_BF16) {
        for (int64_t i = 0; i < n; i++) h[i] = kg_bf16_rne(e[i] * c);
    } else {
        for (int64_t i = 0; i < n; i++) {
            /* an fp32 value is its own round-to-odd image: one rounding */
            h[i] = xent__store_f16((double)(e[i] * c));
        }
    }
}

#define XENT__GEN_TABLE(sym, nm) \
    const xent__cpu_kern sym = {nm, kg_max_range, kg_sum_range, kg_exp_block, kg_grad_store, \
                                kg_grad_f32, kg_store}

#endif
