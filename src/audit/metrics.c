/* src/audit/metrics.c: error metrics of one tensor against the reference.
 *
 * Two passes over the data, every sum in double (compensated across blocks):
 * pass 1 forms the means of test and ref, pass 2 the centred second moments
 * (so var and cov do not cancel catastrophically when the mean is large
 * against the spread), the raw second moments of d and ref, and max |d|.
 * Inputs are floats, so every product of two of them (or of two centred
 * values rounded to double) carries at most one rounding of 2^-53. */
#include "audit/audit.h"
#include "core/xent_math.h"

#include <stdlib.h>

double xent__audit_rel_denom(const xent_audit_metrics *m) {
    return sqrt(m->ref_scale * m->ref_scale + 1e-8);
}

static void metrics_nan(xent_audit_metrics *m) {
    m->rms_abs = m->ref_scale = m->rms_rel = m->max_abs = NAN;
    m->bias = m->corr = m->slope = m->residual = NAN;
}

/* Blocks of XA_BLOCK elements: plain double sums inside a block (relative
 * error of a block's sum of squares <= XA_BLOCK * 2^-53 = 4.5e-13, far below
 * the two figures reported), Neumaier sums across blocks in block order, so
 * the result does not depend on the number of threads. */
#define XA_BLOCK 4096

typedef struct pass1 { double st, sr; int64_t bad; int same; } pass1;
typedef struct pass2 { double sd, dd, rr, vt, vr, cv, maxd; } pass2;

typedef struct mctx {
    const float *t, *r; /* [n] */
    int64_t n;
    double mt, mr;      /* means (pass 2) */
    pass1 *p1;          /* [nb] */
    pass2 *p2;          /* [nb] */
} mctx;

static void block_pass1(void *c, int64_t b0, int64_t b1) {
    mctx *x = c;
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * XA_BLOCK, hi = lo + XA_BLOCK < x->n ? lo + XA_BLOCK : x->n;
        pass1 p = {0, 0, 0, 1};
        for (int64_t i = lo; i < hi; i++) {
            double a = x->t[i], r = x->r[i];
            if (!isfinite(a) || !isfinite(r)) { p.bad++; continue; }
            if (a != r) p.same = 0;
            p.st += a;
            p.sr += r;
        }
        x->p1[b] = p;
    }
}

static void block_pass2(void *c, int64_t b0, int64_t b1) {
    mctx *x = c;
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * XA_BLOCK, hi = lo + XA_BLOCK < x->n ? lo + XA_BLOCK : x->n;
        pass2 p = {0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = lo; i < hi; i++) {
            double a = x->t[i], r = x->r[i];
            double d = a - r; /* exact: both are floats */
            double ca = a - x->mt, cr = r - x->mr;
            p.sd += d;
            p.dd += d * d;
            p.rr += r * r;
            p.vt += ca * ca;
            p.vr += cr * cr;
            p.cv += ca * cr;
            p.maxd = fabs(d) > p.maxd ? fabs(d) : p.maxd;
        }
        x->p2[b] = p;
    }
}

static void finish(xent_audit_metrics *m, const pass2 *s, int identical) {
    double nn = (double)m->n;
    m->rms_abs = sqrt(s->dd / nn);
    m->ref_scale = sqrt(s->rr / nn);
    m->rms_rel = m->rms_abs / xent__audit_rel_denom(m);
    m->max_abs = s->maxd;
    m->bias = s->sd / nn;
    if (identical) { /* exactly 0 error, whatever rounding would say */
        m->corr = m->slope = 1.0;
        m->residual = 0.0;
        return;
    }
    double var_t = s->vt / nn, var_r = s->vr / nn, cov = s->cv / nn;
    m->corr = (var_t > 0 && var_r > 0) ? cov / sqrt(var_t * var_r) : NAN;
    m->slope = var_r > 0 ? cov / var_r : NAN;
    double res = var_r > 0 ? var_t - cov * cov / var_r : var_t;
    m->residual = sqrt(res > 0 ? res : 0.0);
}

/* Combines pass 1 in block order: means, non-finite count, equality. */
static void combine1(const mctx *x, int64_t nb, xent_audit_metrics *m,
                     double *mt, double *mr, int *identical) {
    xent__ksum st = {0, 0}, sr = {0, 0};
    *identical = 1;
    for (int64_t b = 0; b < nb; b++) {
        xent__ksum_add(&st, x->p1[b].st);
        xent__ksum_add(&sr, x->p1[b].sr);
        m->n_nonfinite += x->p1[b].bad;
        *identical &= x->p1[b].same;
    }
    *mt = xent__ksum_get(&st) / (double)m->n;
    *mr = xent__ksum_get(&sr) / (double)m->n;
}

static void combine2(const mctx *x, int64_t nb, pass2 *out) {
    xent__ksum k[6] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}};
    double maxd = 0;
    for (int64_t b = 0; b < nb; b++) {
        const pass2 *p = &x->p2[b];
        xent__ksum_add(&k[0], p->sd);
        xent__ksum_add(&k[1], p->dd);
        xent__ksum_add(&k[2], p->rr);
        xent__ksum_add(&k[3], p->vt);
        xent__ksum_add(&k[4], p->vr);
        xent__ksum_add(&k[5], p->cv);
        maxd = p->maxd > maxd ? p->maxd : maxd;
    }
    *out = (pass2){xent__ksum_get(&k[0]), xent__ksum_get(&k[1]),
                   xent__ksum_get(&k[2]), xent__ksum_get(&k[3]),
                   xent__ksum_get(&k[4]), xent__ksum_get(&k[5]), maxd};
}

xent_status xent__audit_metrics_mt(const float *test, const float *ref,
                                   int64_t n, int threads,
                                   xent_audit_metrics *m) {
    memset(m, 0, sizeof *m);
    m->n = n;
    if (n <= 0) { metrics_nan(m); return XENT_OK; }
    int64_t nb = (n + XA_BLOCK - 1) / XA_BLOCK;
    mctx x = {test, ref, n, 0, 0, malloc(sizeof(pass1) * (size_t)nb),
              malloc(sizeof(pass2) * (size_t)nb)};
    if (!x.p1 || !x.p2) {
        free(x.p1);
        free(x.p2);
        metrics_nan(m);
        return xent_set_error(XENT_ERR_ALLOC, "audit metrics: out of memory");
    }
    int identical;
    xent_parallel_for(nb, threads, block_pass1, &x);
    combine1(&x, nb, m, &x.mt, &x.mr, &identical);
    if (m->n_nonfinite) {
        metrics_nan(m);
    } else {
        pass2 s;
        xent_parallel_for(nb, threads, block_pass2, &x);
        combine2(&x, nb, &s);
        finish(m, &s, identical);
    }
    free(x.p1);
    free(x.p2);
    return XENT_OK;
}

void xent__audit_metrics(const float *test, const float *ref, int64_t n,
                         xent_audit_metrics *m) {
    xent__audit_metrics_mt(test, ref, n, 1, m);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double xent__audit_median(const double *x, int n) {
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); /* [n] */
    if (!v) return NAN;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) v[k++] = x[i];
    double med = NAN;
    if (k > 0) {
        qsort(v, (size_t)k, sizeof(double), cmp_double);
        med = (k & 1) ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
    }
    free(v);
    return med;
}

int64_t xent__audit_dead_count(const float *test, const float *ref, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if (test[i] == 0.0f && ref[i] != 0.0f) c++;
    return c;
}
