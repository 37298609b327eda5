/* src/cpu/sampler_row.h: the scalar pieces of the processed log-probs
 * (include/xent/sampler.h) shared by src/cpu/sampler.c and
 * src/cuda/sampler.cu: value keys, compensated sums, the min-p predicate
 * and the last step (kept set from the sums, outputs). Header only; each
 * function compiles for the host and, under nvcc, for the device (XENT_HD)
 * from the same text. docs/sampler.md gives the rules and the bounds. */
#ifndef XENT_SAMPLER_ROW_H
#define XENT_SAMPLER_ROW_H

#include "core/xent_internal.h"

/* The library's relative error bound on every mass (sum of exp) of a row,
 * with margin (docs/sampler.md: the computed masses are within 2^-42). */
#define XS_MASS_BOUND 0x1p-40
/* The relative bound on a computed x_j - max x and on log(min_p). */
#define XS_LOG_BOUND 0x1p-50

#ifdef __cplusplus
extern "C" {
#endif
/* Checks in / opts / out of a call (src/cpu/sampler.c): the CPU and CUDA
 * entry points share it; labels are not read (they may be device memory).
 * *o receives opts or the defaults. */
xent_status xent__sampler_check(const xent_ce_input *in, const xent_sampler_opts *opts,
                                const xent_sampler_output *out, xent_sampler_opts *o);
#ifdef __cplusplus
}
#endif

/* Per-call constants of a row's decisions. */
typedef struct xs_params {
    double tau;      /* temperature                                         */
    double top_p;    /* 1 = off                                             */
    double lnmp;     /* log(min_p) (computed once, on the host)             */
    double tol_log;  /* absolute slack of the min-p test: 2 * boundary_tol  */
    double tol_mass; /* relative slack of the top-p test: XS_MASS_BOUND +
                        2 * boundary_tol                                    */
    int64_t top_k;   /* 0 = off                                             */
    int use_minp;
} xs_params;

/* A monotone unsigned key of a float value: a < b iff key(a) < key(b);
 * -0 and +0 (equal values) get the same key. */
XENT_HD uint32_t xs_key(float f) {
    uint32_t u;
    if (f == 0.0f) f = 0.0f;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* x_j - max x = (z_j - zmax) / tau: the difference of two floats in double
 * (exact unless their exponents are far apart) then one division: relative
 * error below 2^-52. Monotone in z. */
XENT_HD double xs_d(float z, float zmax, double tau) {
    return ((double)z - (double)zmax) / tau;
}

/* Neumaier's compensated sum. */
typedef struct xs_sum { double s, c; } xs_sum;
XENT_HD void xs_add(xs_sum *a, double x) {
    double t = a->s + x;
    if (fabs(a->s) >= fabs(x)) a->c += (a->s - t) + x;
    else a->c += (x - t) + a->s;
    a->s = t;
}
XENT_HD double xs_val(xs_sum a) { return a.s + a.c; }
XENT_HD void xs_merge(xs_sum *a, xs_sum b) {
    xs_add(a, b.s);
    xs_add(a, b.c);
}

/* min-p: column kept iff d >= ln(min_p) (d = x_j - max x). */
XENT_HD int xs_minp_keep(const xs_params *p, double d) {
    return !p->use_minp || d >= p->lnmp;
}
/* min-p: d is within the bound (or boundary_tol) of the threshold. */
XENT_HD int xs_minp_near(const xs_params *p, double d) {
    if (!p->use_minp || !(d > -INFINITY)) return 0;
    double gap = fabs(d - p->lnmp);
    return gap <= XS_LOG_BOUND * (fabs(d) + fabs(p->lnmp)) + p->tol_log;
}

/* The top-p cut inside the group at the boundary value v*: M_gt is the mass
 * (relative to exp(max x)) of the kept-so-far columns above v*, w the weight
 * of one column at v*, g their count, target = top_p * S1. Returns c in
 * [1, g], the number of group members kept (the smallest with
 * M_gt + c w >= target), and sets *near when the cut could move within the
 * slack tol_mass * S1. */
XENT_HD int64_t xs_topp_count(double M_gt, double w, int64_t g, double target,
                              double S1, double tol, int *near) {
    int64_t c;
    double slack = tol * S1;
    if (!(w > 0.0)) {
        c = g;
        *near = 1;
        return c;
    }
    double q = (target - M_gt) / w;
    if (!(q > 1.0)) c = 1;
    else if (q >= (double)g) c = g;
    else {
        c = (int64_t)ceil(q);
        if (c > g) c = g;
        if (c < 1) c = 1;
    }
    /* exact adjustment (q is rounded): smallest c with M_gt + c w >= target */
    while (c > 1 && M_gt + (double)(c - 1) * w >= target) c--;
    while (c < g && M_gt + (double)c * w < target) c++;
    *near = fabs(M_gt + (double)c * w - target) <= slack ||
            fabs(M_gt + (double)(c - 1) * w - target) <= slack;
    return c;
}

/* A row's sums after the kept set is known. Masses are relative to the
 * largest term (exp(max x) = 1 exactly): cmax columns at the max kept,
 * Sk the other kept columns, Ak = sum over kept of e_j * (-d_j) (>= 0),
 * R the dropped mass, gall the columns at the max, Sall the others. */
typedef struct xs_row {
    int64_t cmax, gall, kept;
    double Sk, Ak, R, Sall;
} xs_row;

/* The row's outputs (in double; the caller rounds each once). */
typedef struct xs_out {
    double L;        /* log sum_K e_j                                        */
    double Lall;     /* log sum_all e_j                                      */
    double entropy;
    double log_kept; /* log kept mass                                        */
} xs_out;

XENT_HD xs_out xs_finish(const xs_row *r) {
    xs_out o;
    /* sum_K e - 1 and sum_all e - 1 with full relative accuracy: the max
     * columns are each exactly 1 and counted apart. */
    double sk1 = (double)(r->cmax - 1) + r->Sk;
    double sa1 = (double)(r->gall - 1) + r->Sall;
    double SK = (double)r->cmax + r->Sk;
    o.L = log1p(sk1);
    o.Lall = log1p(sa1);
    /* H = log S_K + sum_K e (-d) / S_K: two terms >= 0, no cancellation */
    o.entropy = o.L + r->Ak / SK;
    /* log(S_K / S_all) = -log1p(R / S_K), R summed directly */
    o.log_kept = r->R > 0.0 ? -log1p(r->R / SK) : 0.0;
    return o;
}

#endif
