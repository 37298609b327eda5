/* tests/test_cuda_linear.c: the fused LM head (xent_cuda_linear_*) against
 * an oracle computed on the CPU from the same hidden, weight and bias values.
 * Every test skips (and says so) when the build has no CUDA or no GPU is
 * present.
 *
 * The oracle. Logits z = h . w (+ b) are sums of products of the exactly
 * widened input values, in double. Per row, in long double, with z' the
 * transformed logits (softcap, temperature), M = max z' (index a) and
 * S1 = sum_{j != a} exp(z'_j - M):
 *   L = log1p(S1), lse = M + L,
 *   nll = (M - z'_t) + L (or L when t = a): two non-negative terms, so a
 *         nll of 1e-40 (dead zone) keeps its full relative accuracy,
 *   entropy = sum_j p_j ((M - z'_j) + L), all terms >= 0,
 *   lse - mean z' = mean_j ((M - z'_j) + L), all terms >= 0,
 *   dloss/dz'_j = (1 + 2k lse) p_j - eps/V, and at the target
 *   (1 - eps) expm1(-nll) + eps (p_t - 1/V) + 2k lse p_t,
 * times the row's upstream g and dz'/dz. dlogits are kept in double;
 * dhidden = dlogits @ W, dweight = dlogits^T @ hidden, dbias = column sums
 * are sums in double.
 *
 * Inputs on a grid (most cases). hidden, weight and bias entries are
 * k * 2^-7 with |k| <= 127 (exact in bf16, f16 and f32), so a product is
 * k' 2^-14 with |k'| < 2^14 and a logit is an integer multiple of 2^-14 below
 * 96 * 2^14 + 2^14 < 2^21 units: every partial sum the GEMM forms, in any
 * order and blocking, is exact in fp32 (24 bits; the dead rows below stay
 * under 2^23 units). So the GPU's fp32 logits equal the oracle's exactly and
 * the forward outputs carry only the loss kernel's error (within 3 ulp of
 * the exact value, include/xent/cuda.h): 3 * 2^-23 = 3.6e-7 relative.
 * A logit rounded to bf16 anywhere (the failure the fused head exists to
 * avoid) moves a logit of size ~3 by up to 2^-8 and the nll by ~1e-2.
 * One case uses ordinary bf16 values (N(0, s) rounded): there the fp32
 * accumulation error of a logit is that of H/16..H roundings of partial sums
 * of size |z| ~ 3, expected ~ u sqrt(H) |z| = 1.4e-6 (u = 2^-24) and the nll
 * moves by at most twice the largest logit error.
 *
 * Bounds checked (issue 9):
 *   - nll, logprob, lse, entropy, loss, stats: |gpu - ref| <= 1e-5 *
 *     max(|ref|, 1): relative for values above 1, absolute below (a nll of
 *     1e-13 is judged by its absolute error). Above: the grid gives 3.6e-7.
 *     Dead-zone rows are judged relative to their own (tiny) nll.
 *   - gradients, per tensor: ||g - g_ref|| / ||g_ref|| <= 1e-2 when the
 *     dlogits or the gradient are 16-bit: the dlogits are rounded once to
 *     bf16 (relative 2^-9 = 2.0e-3 each, f16 2^-12) and the gradient once to
 *     its dtype (2^-9); the products add fp32 accumulation (~u sqrt(K)).
 *     Independent roundings give ~2^-9 / sqrt(3) times the cancellation
 *     ratio ||(|dl| |W|)|| / ||dl W|| of the product, about 1..3 here, so
 *     ~1e-3 to 3e-3 is expected.
 *   - all-fp32 (f32 inputs, f32 gradient buffers): dlogits fp32 (2^-24) and
 *     fp32 accumulation over K = V <= 5003 (dhidden) or T <= 300 (dweight):
 *     ~ u / sqrt(3) * sqrt(K) = 2.4e-6 expected: bound 1e-5.
 * The measured worst values are printed so that the bounds can be tightened.
 * Every output is poisoned (0xFF bytes: NaN) before each call; NaN fails
 * every comparison. */
#include "harness.h"
#include "xent.h"

#include <float.h>
#include <stdlib.h>

#ifdef XENT_WITH_CUDA
#include "cuda_harness.h"

#define TOL_FWD 1e-5
#define TOL_GRAD16 1e-2
#define TOL_GRAD32 1e-5

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static void sync_ok(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "%s: CUDA error %s", what, cudaGetErrorString(e));
}

/* Stores v (rounded to dt) at a[i]; returns the stored value widened. */
static double put(void *a, xent_dtype dt, size_t i, double v) {
    if (dt == XENT_F32) {
        ((float *)a)[i] = (float)v;
        return ((float *)a)[i];
    }
    uint16_t u = dt == XENT_BF16 ? xent_f64_to_bf16(v) : xent_f64_to_f16(v);
    ((uint16_t *)a)[i] = u;
    return dt == XENT_BF16 ? xent_bf16_to_f32(u) : xent_f16_to_f32(u);
}
static double get(const void *a, xent_dtype dt, size_t i) {
    if (dt == XENT_F64) return ((const double *)a)[i];
    if (dt == XENT_F32) return ((const float *)a)[i];
    uint16_t u = ((const uint16_t *)a)[i];
    return dt == XENT_BF16 ? xent_bf16_to_f32(u) : xent_f16_to_f32(u);
}

/* ------------------------------------------------------------------ */
/* A problem: inputs (host, in dtype and widened) and the oracle        */
/* ------------------------------------------------------------------ */

typedef struct {
    xent_dtype dt;
    int64_t T, H, V;
    int bias, offgrid, i32;
    int64_t dead_row[2];   /* rows forced to a margin (-1: none)         */
    double dead_margin[2]; /* nats, at least                             */
    xent_ce_opts o;
    /* inputs */
    void *hh, *hw, *hb;   /* in dtype                                    */
    double *h, *w, *b;    /* widened                                     */
    int64_t *lab;
    int32_t *lab32;
    float *grad_rows;
    /* oracle */
    long double *nll, *lse, *ent, *rloss; /* [T] (rloss: per-row loss)   */
    long double loss;                     /* reduced (SUM/MEAN)          */
    int64_t count;
    double *dl;         /* [T, V] exact dlogits                           */
    double *gh, *gw, *gb; /* [T, H], [V, H], [V]                          */
} lprob;

static double grid_val(xt_rng_t *r) { return (double)(xt_randint(r, 255) - 127) / 128.0; }

static void lprob_init(lprob *p, xent_dtype dt, int64_t T, int64_t H, int64_t V) {
    memset(p, 0, sizeof *p);
    p->dt = dt;
    p->T = T;
    p->H = H;
    p->V = V;
    p->dead_row[0] = p->dead_row[1] = -1;
    xent_ce_opts_init(&p->o);
}

static double logit(const lprob *p, int64_t t, int64_t j) {
    double z = 0;
    const double *h = p->h + t * p->H, *w = p->w + j * p->H;
    for (int64_t k = 0; k < p->H; k++) z += h[k] * w[k];
    return p->bias ? z + p->b[j] : z;
}

/* Fills the inputs. Dead rows: weight column c (c = 0, 1) is zero except at
 * the dead row's target, where it is 1; the row's hidden[c] is the smallest
 * integer that lifts the target's logit `margin` nats over every other one
 * (integers up to 256 are exact in every dtype; the logits stay exact). */
static void lprob_fill(lprob *p) {
    xt_rng_t *r = xt_rng();
    int64_t T = p->T, H = p->H, V = p->V;
    size_t es = xent_dtype_size(p->dt);
    p->hh = malloc((size_t)(T * H) * es + 16);
    p->hw = malloc((size_t)(V * H) * es + 16);
    p->hb = malloc((size_t)V * es + 16);
    p->h = malloc((size_t)(T * H) * 8 + 16);
    p->w = malloc((size_t)(V * H) * 8 + 16);
    p->b = malloc((size_t)V * 8 + 16);
    p->lab = malloc((size_t)T * 8 + 8);
    p->lab32 = malloc((size_t)T * 4 + 4);
    p->grad_rows = malloc((size_t)T * 4 + 4);
    /* off grid: N(0, s) with s chosen so that logits have sd ~ 3 */
    double sh = 1.0, sw = 3.0 / sqrt((double)H);
    for (int64_t i = 0; i < T * H; i++)
        p->h[i] = put(p->hh, p->dt, (size_t)i, p->offgrid ? sh * xt_normal(r) : grid_val(r));
    for (int64_t i = 0; i < V * H; i++)
        p->w[i] = put(p->hw, p->dt, (size_t)i, p->offgrid ? sw * xt_normal(r) : grid_val(r));
    for (int64_t j = 0; j < V; j++)
        p->b[j] = put(p->hb, p->dt, (size_t)j, p->offgrid ? xt_normal(r) : grid_val(r));
    for (int64_t t = 0; t < T; t++) {
        int64_t lab = xt_randint(r, V);
        if (xt_uniform(r) < 0.1) lab = p->o.ignore_index;
        p->lab[t] = lab;
        p->grad_rows[t] = (float)(xt_uniform(r) * 2.0 - 0.5);
    }
    for (int d = 0; d < 2; d++) {
        int64_t row = p->dead_row[d];
        if (row < 0) continue;
        int64_t tgt = (d == 0 ? 3 : 7) % V; /* distinct targets for the two */
        p->lab[row] = tgt;
        for (int64_t j = 0; j < V; j++)
            p->w[j * H + d] = put(p->hw, p->dt, (size_t)(j * H + d), j == tgt ? 1.0 : 0.0);
    }
    for (int d = 0; d < 2; d++) {
        int64_t row = p->dead_row[d];
        if (row < 0) continue;
        int64_t tgt = p->lab[row];
        p->h[row * H + 0] = put(p->hh, p->dt, (size_t)(row * H + 0), 0.0);
        p->h[row * H + 1] = put(p->hh, p->dt, (size_t)(row * H + 1), 0.0);
        double mo = -INFINITY;
        for (int64_t j = 0; j < V; j++)
            if (j != tgt) mo = fmax(mo, logit(p, row, j));
        double lift = ceil(p->dead_margin[d] + mo - logit(p, row, tgt));
        if (lift < 0) lift = 0;
        p->h[row * H + d] = put(p->hh, p->dt, (size_t)(row * H + d), lift);
    }
    for (int64_t t = 0; t < T; t++) p->lab32[t] = (int32_t)p->lab[t];
}

static int counted(const lprob *p, int64_t t) { return p->lab[t] != p->o.ignore_index; }

/* The oracle (see the top of the file). */
static void lprob_oracle(lprob *p) {
    int64_t T = p->T, H = p->H, V = p->V;
    const xent_ce_opts *o = &p->o;
    p->nll = calloc((size_t)T + 1, sizeof(long double));
    p->lse = calloc((size_t)T + 1, sizeof(long double));
    p->ent = calloc((size_t)T + 1, sizeof(long double));
    p->rloss = calloc((size_t)T + 1, sizeof(long double));
    p->dl = calloc((size_t)(T * V) + 1, sizeof(double));
    p->gh = calloc((size_t)(T * H) + 1, sizeof(double));
    p->gw = calloc((size_t)(V * H) + 1, sizeof(double));
    p->gb = calloc((size_t)V + 1, sizeof(double));
    long double *zp = malloc((size_t)V * sizeof(long double));
    double *c = malloc((size_t)V * sizeof(double));
    p->count = 0;
    for (int64_t t = 0; t < T; t++) p->count += counted(p, t);
    double N = o->normalizer > 0 ? o->normalizer : (double)p->count;
    long double tau = o->temperature, s = o->softcap, eps = o->label_smoothing,
                k = o->z_loss, sum = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t a = 0;
        for (int64_t j = 0; j < V; j++) {
            long double z = logit(p, t, j);
            if (s > 0) {
                long double th = tanhl(z / s);
                zp[j] = s * th / tau;
                c[j] = (double)((1 - th * th) / tau);
            } else {
                zp[j] = z / tau;
                c[j] = (double)(1 / tau);
            }
            if (zp[j] > zp[a]) a = j;
        }
        long double M = zp[a], S1 = 0, ent = 0, sm = 0;
        for (int64_t j = 0; j < V; j++)
            if (j != a) S1 += expl(zp[j] - M);
        long double L = log1pl(S1), lse = M + L;
        for (int64_t j = 0; j < V; j++) {
            long double pj = expl(zp[j] - M) / (1 + S1), gap = (M - zp[j]) + L;
            ent += pj * gap;
            sm += gap;
        }
        p->lse[t] = lse;
        p->ent[t] = ent;
        if (!counted(p, t)) continue;
        int64_t tg = p->lab[t];
        long double nll = tg == a ? L : (M - zp[tg]) + L;
        p->nll[t] = nll;
        p->rloss[t] = (1 - eps) * nll + eps * (sm / V) + k * lse * lse;
        sum += p->rloss[t];
        long double g = o->grad_scale;
        if (o->reduction == XENT_REDUCE_NONE) g *= p->grad_rows[t];
        if (o->reduction == XENT_REDUCE_MEAN) g = N > 0 ? g / N : 0;
        for (int64_t j = 0; j < V; j++) {
            long double pj = expl(zp[j] - lse), d;
            if (j == tg)
                d = (1 - eps) * expm1l(-nll) + eps * (pj - 1.0L / V) + 2 * k * lse * pj;
            else
                d = (1 + 2 * k * lse) * pj - eps / V;
            p->dl[t * V + j] = (double)(g * c[j] * d);
        }
    }
    p->loss = o->reduction == XENT_REDUCE_MEAN ? (N > 0 ? sum / N : 0) : sum;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < V; j++) {
            double d = p->dl[t * V + j];
            if (d == 0) continue;
            double *gh = p->gh + t * H, *gw = p->gw + j * H;
            const double *w = p->w + j * H, *h = p->h + t * H;
            for (int64_t q = 0; q < H; q++) {
                gh[q] += d * w[q];
                gw[q] += d * h[q];
            }
            p->gb[j] += d;
        }
    free(zp);
    free(c);
}

static void lprob_free(lprob *p) {
    free(p->hh); free(p->hw); free(p->hb); free(p->h); free(p->w); free(p->b);
    free(p->lab); free(p->lab32); free(p->grad_rows);
    free(p->nll); free(p->lse); free(p->ent); free(p->rloss);
    free(p->dl); free(p->gh); free(p->gw); free(p->gb);
}

/* ------------------------------------------------------------------ */
/* Comparisons                                                         */
/* ------------------------------------------------------------------ */

static double g_worst_fwd, g_worst_g16, g_worst_g32;

/* |a - ref| / max(|ref|, floor); NaN or inf -> huge. */
static double rel_err(double a, long double ref, double floor) {
    if (!isfinite(a)) return 1e300;
    long double sc = fabsl(ref) > floor ? fabsl(ref) : floor;
    return (double)(fabsl((long double)a - ref) / sc);
}

static void cmp_fwd(const char *what, const char *name, const float *a, const long double *ref,
                    int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double e = rel_err(a[i], ref[i], 1.0);
        if (e < 1e300 && e > g_worst_fwd) g_worst_fwd = e;
        CHECK(e <= TOL_FWD, "%s: %s[%lld] gpu %.9g ref %.12Lg (err %.3g > %g)", what, name,
              (long long)i, (double)a[i], ref[i], e, TOL_FWD);
        CHECK_LIMIT(10);
    }
}

/* ||g - (base + ref)|| / ||ref|| over n elements of a buffer of dtype gdt;
 * base (the old contents, for accumulate) may be NULL. Any non-finite
 * element gives +inf. */
static double rel_rms(const void *g, xent_dtype gdt, const double *ref, const float *base,
                      size_t n) {
    long double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double v = get(g, gdt, i);
        if (!isfinite(v)) return INFINITY;
        long double d = (long double)v - (base ? base[i] : 0) - ref[i];
        num += d * d;
        den += (long double)ref[i] * ref[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return (double)sqrtl(num / den);
}

static void cmp_grad(const char *what, const char *name, const void *g, xent_dtype gdt,
                     const double *ref, const float *base, size_t n, double tol) {
    double e = rel_rms(g, gdt, ref, base, n);
    double *worst = tol == TOL_GRAD32 ? &g_worst_g32 : &g_worst_g16;
    if (isfinite(e) && e > *worst) *worst = e;
    printf("    %s: %s (%s) relative RMS %.3g (bound %g)\n", what, name, xent_dtype_name(gdt), e,
           tol);
    CHECK(e <= tol, "%s: %s relative RMS %.3g > %g", what, name, e, tol);
}

/* ------------------------------------------------------------------ */
/* One GPU run of xent_cuda_linear_ce and its comparison                */
/* ------------------------------------------------------------------ */

typedef struct {
    int want_h, want_w, want_b; /* gradients requested                      */
    xent_dtype gdt;             /* their dtype (XENT_DTYPE_COUNT: input's)  */
    int64_t chunk;              /* rows per chunk of the workspace; 0: NULL */
    int accumulate;             /* fp32 buffers holding old values          */
} lrun;

static size_t loss_len(const lprob *p) {
    return p->o.reduction == XENT_REDUCE_NONE ? (size_t)p->T : 1;
}

/* Device copies of the inputs. */
typedef struct {
    void *h, *w, *b, *lab;
    float *gr;
} ldev;

static void ldev_up(ldev *d, const lprob *p) {
    size_t es = xent_dtype_size(p->dt);
    d->h = dev_copy(p->hh, (size_t)(p->T * p->H) * es);
    d->w = dev_copy(p->hw, (size_t)(p->V * p->H) * es);
    d->b = dev_copy(p->hb, (size_t)p->V * es);
    d->lab = p->i32 ? dev_copy(p->lab32, (size_t)p->T * 4) : dev_copy(p->lab, (size_t)p->T * 8);
    d->gr = dev_copy(p->grad_rows, (size_t)p->T * 4);
}
static void ldev_free(ldev *d) {
    dev_free(d->h); dev_free(d->w); dev_free(d->b); dev_free(d->lab); dev_free(d->gr);
}
static xent_linear_input linput(const lprob *p, const ldev *d) {
    xent_linear_input in;
    memset(&in, 0, sizeof in);
    in.hidden = d->h;
    in.weight = d->w;
    in.bias = p->bias ? d->b : NULL;
    in.dtype = p->dt;
    in.T = p->T;
    in.H = p->H;
    in.V = p->V;
    in.labels = d->lab;
    in.label_dtype = p->i32 ? XENT_I32 : XENT_I64;
    in.grad_rows = p->o.reduction == XENT_REDUCE_NONE ? d->gr : NULL;
    return in;
}

static double grad_tol(xent_dtype dt, xent_dtype gdt) {
    return dt == XENT_F32 && gdt == XENT_F32 ? TOL_GRAD32 : TOL_GRAD16;
}

/* Host results of a run. */
typedef struct {
    float *loss, *nll, *lp, *lse, *ent;
    xent_ce_stats *st;
    int64_t cnt[2];
    void *gh, *gw, *gb;
    float *oh, *ow, *ob; /* old contents (accumulate) */
} lres;

static void lres_free(lres *r) {
    free(r->loss); free(r->nll); free(r->lp); free(r->lse); free(r->ent); free(r->st);
    free(r->gh); free(r->gw); free(r->gb); free(r->oh); free(r->ow); free(r->ob);
}

static float *random_old(size_t n, const double *ref) {
    xt_rng_t *r = xt_rng();
    long double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (long double)ref[i] * ref[i];
    double rms = n ? (double)sqrtl(ss / n) : 1;
    if (!(rms > 0)) rms = 1;
    float *o = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) o[i] = (float)(rms * xt_normal(r));
    return o;
}

static xent_status run_linear(const char *what, const lprob *p, const lrun *q, lres *r) {
    int64_t T = p->T, H = p->H, V = p->V;
    size_t nT = (size_t)T;
    xent_dtype gdt = q->accumulate ? XENT_F32 : q->gdt == XENT_DTYPE_COUNT ? p->dt : q->gdt;
    size_t gs = xent_dtype_size(gdt);
    memset(r, 0, sizeof *r);
    ldev d;
    ldev_up(&d, p);
    xent_linear_input in = linput(p, &d);
    float *dloss = dev_alloc(loss_len(p) * 4), *dnll = dev_alloc(nT * 4), *dlp = dev_alloc(nT * 4),
          *dlse = dev_alloc(nT * 4), *dent = dev_alloc(nT * 4);
    xent_ce_stats *dst = dev_alloc(nT * sizeof(xent_ce_stats));
    int64_t *dcnt = dev_alloc(16);
    xent_linear_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_dtype = g.weight_dtype = g.bias_dtype = gdt;
    g.accumulate = q->accumulate;
    size_t nh = (size_t)(T * H), nw = (size_t)(V * H), nb = (size_t)V;
    if (q->want_h) g.hidden = dev_alloc(nh * gs);
    if (q->want_w) g.weight = dev_alloc(nw * gs);
    if (q->want_b && p->bias) g.bias = dev_alloc(nb * gs);
    if (q->accumulate) {
        const int h2d = cudaMemcpyHostToDevice;
        if (g.hidden) cudaMemcpy(g.hidden, r->oh = random_old(nh, p->gh), nh * 4, h2d);
        if (g.weight) cudaMemcpy(g.weight, r->ow = random_old(nw, p->gw), nw * 4, h2d);
        if (g.bias) cudaMemcpy(g.bias, r->ob = random_old(nb, p->gb), nb * 4, h2d);
    }
    int has_g = g.hidden || g.weight || g.bias;
    size_t wsb = 0;
    void *ws = NULL;
    if (q->chunk > 0) {
        wsb = xent_cuda_linear_workspace(&in, has_g ? &g : NULL, q->chunk);
        CHECK(wsb > 0, "%s: workspace size 0", what);
        ws = dev_alloc(wsb);
    }
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.loss = dloss; out.nll = dnll; out.logprob = dlp; out.lse = dlse; out.entropy = dent;
    out.stats = dst; out.n_counted = dcnt; out.n_nonfinite = dcnt + 1;
    xent_status s = xent_cuda_linear_ce(&in, &p->o, &out, has_g ? &g : NULL, ws, wsb, NULL);
    CHECK(s == XENT_OK, "%s: status %d (%s)", what, s, xent_last_error());
    sync_ok(what);
    r->loss = malloc(loss_len(p) * 4 + 4);
    r->nll = malloc(nT * 4 + 4);
    r->lp = malloc(nT * 4 + 4);
    r->lse = malloc(nT * 4 + 4);
    r->ent = malloc(nT * 4 + 4);
    r->st = malloc(nT * sizeof(xent_ce_stats) + 16);
    host_copy(r->loss, dloss, loss_len(p) * 4);
    host_copy(r->nll, dnll, nT * 4);
    host_copy(r->lp, dlp, nT * 4);
    host_copy(r->lse, dlse, nT * 4);
    host_copy(r->ent, dent, nT * 4);
    host_copy(r->st, dst, nT * sizeof(xent_ce_stats));
    host_copy(r->cnt, dcnt, 16);
    if (g.hidden) host_copy(r->gh = malloc(nh * gs), g.hidden, nh * gs);
    if (g.weight) host_copy(r->gw = malloc(nw * gs), g.weight, nw * gs);
    if (g.bias) host_copy(r->gb = malloc(nb * gs), g.bias, nb * gs);
    ldev_free(&d);
    dev_free(dloss); dev_free(dnll); dev_free(dlp); dev_free(dlse); dev_free(dent);
    dev_free(dst); dev_free(dcnt); dev_free(g.hidden); dev_free(g.weight); dev_free(g.bias);
    dev_free(ws);
    return s;
}

/* Compares a run's forward outputs and gradients with the oracle. */
static void check_run(const char *what, const lprob *p, const lrun *q, const lres *r) {
    int64_t T = p->T;
    xent_dtype gdt = q->accumulate ? XENT_F32 : q->gdt == XENT_DTYPE_COUNT ? p->dt : q->gdt;
    long double *lp = malloc((size_t)T * sizeof(long double) + 16);
    for (int64_t t = 0; t < T; t++) lp[t] = -p->nll[t];
    if (p->o.reduction == XENT_REDUCE_NONE) {
        cmp_fwd(what, "loss", r->loss, p->rloss, T);
    } else {
        long double l = p->loss;
        cmp_fwd(what, "loss", r->loss, &l, 1);
    }
    cmp_fwd(what, "nll", r->nll, p->nll, T);
    cmp_fwd(what, "logprob", r->lp, lp, T);
    cmp_fwd(what, "lse", r->lse, p->lse, T);
    cmp_fwd(what, "entropy", r->ent, p->ent, T);
    /* stats (double): the same bound */
    for (int64_t t = 0; t < T; t++) {
        double sn = r->st[t].nll, sl = r->st[t].lse;
        double e = fmax(rel_err(sn, p->nll[t], 1.0), rel_err(sl, p->lse[t], 1.0));
        CHECK(e <= TOL_FWD, "%s: stats[%lld] {%.17g, %.17g} ref {%.17Lg, %.17Lg}", what,
              (long long)t, sl, sn, p->lse[t], p->nll[t]);
        CHECK_LIMIT(10);
    }
    CHECK(r->cnt[0] == p->count && r->cnt[1] == 0,
          "%s: n_counted %lld (ref %lld), n_nonfinite %lld", what, (long long)r->cnt[0],
          (long long)p->count, (long long)r->cnt[1]);
    double tol = grad_tol(p->dt, gdt);
    if (r->gh) cmp_grad(what, "dhidden", r->gh, gdt, p->gh, r->oh, (size_t)(T * p->H), tol);
    if (r->gw) cmp_grad(what, "dweight", r->gw, gdt, p->gw, r->ow, (size_t)(p->V * p->H), tol);
    if (r->gb) cmp_grad(what, "dbias", r->gb, gdt, p->gb, r->ob, (size_t)p->V, tol);
    free(lp);
}

/* A whole case: fill, oracle, run, compare. */
static void run_case(const char *what, lprob *p, const lrun *q) {
    lprob_fill(p);
    lprob_oracle(p);
    lres r;
    if (run_linear(what, p, q, &r) == XENT_OK) check_run(what, p, q, &r);
    lres_free(&r);
    lprob_free(p);
}

static lrun all_grads(int64_t chunk) {
    lrun q;
    memset(&q, 0, sizeof q);
    q.want_h = q.want_w = q.want_b = 1;
    q.gdt = XENT_DTYPE_COUNT;
    q.chunk = chunk;
    return q;
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

/* dtypes, shapes, reductions, chunks of 16 rows and the default workspace. */
TEST(cuda_linear_oracle_shapes) {
    if (!gpu_ready()) return;
    int small = xt_sanitizer();
    struct {
        xent_dtype dt;
        int64_t T, H, V;
        int bias, offgrid, i32;
        xent_reduction red;
        int64_t chunk;
    } cs[] = {
        {XENT_BF16, 37, 64, 1000, 1, 0, 0, XENT_REDUCE_MEAN, 16},
        {XENT_BF16, 300, 96, 5003, 0, 0, 1, XENT_REDUCE_MEAN, 0},
        {XENT_BF16, 1, 64, 1000, 1, 0, 0, XENT_REDUCE_SUM, 16},
        {XENT_BF16, 37, 96, 5003, 1, 1, 0, XENT_REDUCE_MEAN, 16}, /* off grid */
        {XENT_F16, 37, 96, 1000, 1, 0, 1, XENT_REDUCE_SUM, 16},
        {XENT_F16, 300, 64, 5003, 0, 0, 0, XENT_REDUCE_SUM, 0},
        {XENT_F32, 37, 64, 1000, 1, 0, 0, XENT_REDUCE_MEAN, 16},
        {XENT_F32, 300, 96, 1000, 1, 0, 0, XENT_REDUCE_SUM, 16},
        {XENT_F32, 1, 96, 5003, 0, 0, 1, XENT_REDUCE_MEAN, 0},
    };
    char what[160];
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        lprob p;
        int64_t T = small && cs[i].T > 37 ? 37 : cs[i].T;
        lprob_init(&p, cs[i].dt, T, cs[i].H, cs[i].V);
        p.bias = cs[i].bias;
        p.offgrid = cs[i].offgrid;
        p.i32 = cs[i].i32;
        p.o.reduction = cs[i].red;
        lrun q = all_grads(cs[i].chunk);
        snprintf(what, sizeof what, "%s T=%lld H=%lld V=%lld%s%s %s chunk %lld",
                 xent_dtype_name(cs[i].dt), (long long)T, (long long)cs[i].H, (long long)cs[i].V,
                 cs[i].bias ? " bias" : "", cs[i].offgrid ? " off-grid" : "",
                 cs[i].red == XENT_REDUCE_MEAN ? "mean" : "sum", (long long)cs[i].chunk);
        run_case(what, &p, &q);
        CHECK_LIMIT(10);
    }
    printf("    worst forward %.3g (bound %g), gradient 16-bit %.3g (%g), fp32 %.3g (%g)\n",
           g_worst_fwd, TOL_FWD, g_worst_g16, TOL_GRAD16, g_worst_g32, TOL_GRAD32);
}

/* Every option of the loss, and gradient subsets and dtypes. */
TEST(cuda_linear_oracle_options) {
    if (!gpu_ready()) return;
    char what[160];
    for (int c = 0; c < 10; c++) {
        lprob p;
        xent_dtype dt = c >= 7 ? XENT_F32 : XENT_BF16;
        if (c == 6) dt = XENT_F16;
        lprob_init(&p, dt, 37, 64, 1000);
        p.bias = c % 2;
        lrun q = all_grads(16);
        const char *name = "";
        switch (c) {
        case 0: p.o.temperature = 0.7; name = "temperature 0.7"; break;
        case 1: p.o.softcap = 5; p.o.temperature = 1.3; name = "softcap 5, temperature 1.3"; break;
        case 2: p.o.z_loss = 1e-3; p.o.label_smoothing = 0.1; name = "z_loss + smoothing"; break;
        case 3:
            p.o.reduction = XENT_REDUCE_NONE; p.o.grad_scale = 0.5; p.i32 = 1;
            name = "NONE, grad_rows, grad_scale 0.5"; break;
        case 4:
            p.o.normalizer = 1000; p.o.ignore_index = 3;
            name = "normalizer 1000, ignore 3"; break;
        case 5: q.want_w = q.want_b = 0; name = "dhidden only"; break;
        case 6:
            p.o.reduction = XENT_REDUCE_NONE; q.gdt = XENT_F32; q.want_h = 0;
            name = "NONE, f32 dweight/dbias"; break;
        case 7: p.o.softcap = 8; p.o.z_loss = 1e-4; name = "softcap 8, z_loss"; break;
        case 8:
            p.o.label_smoothing = 0.2; p.o.reduction = XENT_REDUCE_SUM; q.chunk = 0;
            name = "smoothing, SUM, default workspace"; break;
        case 9: /* the hidden gradient is written by the product: in.dtype or f32 */
            q.gdt = XENT_BF16; q.want_h = 0; p.o.temperature = 2;
            name = "f32 in, bf16 dweight/dbias"; break;
        }
        snprintf(what, sizeof what, "%s %s%s", xent_dtype_name(dt), name, p.bias ? " bias" : "");
        run_case(what, &p, &q);
        CHECK_LIMIT(10);
    }
    printf("    worst forward %.3g (bound %g), gradient 16-bit %.3g (%g), fp32 %.3g (%g)\n",
           g_worst_fwd, TOL_FWD, g_worst_g16, TOL_GRAD16, g_worst_g32, TOL_GRAD32);
}

/* Dead zone: rows whose target beats every other logit by >= 30 and >= 100
 * nats. Their nll (1e-13 .. 1e-10, and 1e-44 .. 1e-40) is judged relative to
 * itself: on the grid the logits are exact, so only the loss kernel's error
 * (3 ulp) is left, far below 1e-5. The margin-100 nll is below fp32's normal
 * range: its float output is only required > 0 when the oracle's is normal;
 * the double stats carry it. The 30-nat row's dhidden is the target's
 * dlogit (column 0 of the weight is 1 at the target, 0 elsewhere) plus
 * sum_j p_j (W_j - W_t): non-zero and within the bound. Inputs bf16 and
 * f32 (f16 dlogits underflow below 6e-8 by design: its range). */
TEST(cuda_linear_dead_zone) {
    if (!gpu_ready()) return;
    const xent_dtype dts[] = {XENT_BF16, XENT_F32};
    for (int a = 0; a < 2; a++) {
        lprob p;
        lprob_init(&p, dts[a], 9, 64, 1000);
        p.o.reduction = XENT_REDUCE_SUM;
        p.dead_row[0] = 2;
        p.dead_margin[0] = 30;
        p.dead_row[1] = 5;
        p.dead_margin[1] = 100;
        lprob_fill(&p);
        lprob_oracle(&p);
        char what[64];
        snprintf(what, sizeof what, "dead zone %s", xent_dtype_name(dts[a]));
        lrun q = all_grads(4);
        lres r;
        if (run_linear(what, &p, &q, &r) == XENT_OK) {
            for (int d = 0; d < 2; d++) {
                int64_t t = p.dead_row[d];
                long double ref = p.nll[t];
                CHECK(ref > 0 && ref < 1e-9L, "%s: oracle nll %Lg of the dead row %lld", what, ref,
                      (long long)t);
                double sn = r.st[t].nll;
                double e = rel_err(sn, ref, 0);
                CHECK(sn > 0 && e <= TOL_FWD,
                      "%s: margin %g: stats.nll %.17g ref %.17Lg (err %.3g)", what,
                      p.dead_margin[d], sn, ref, e);
                if (ref >= FLT_MIN) {
                    e = rel_err(r.nll[t], ref, 0);
                    CHECK(r.nll[t] > 0 && e <= TOL_FWD,
                          "%s: margin %g: nll %.9g ref %.12Lg (err %.3g)", what,
                          p.dead_margin[d], (double)r.nll[t], ref, e);
                    CHECK(r.lp[t] < 0, "%s: logprob %g is not < 0", what, (double)r.lp[t]);
                } else {
                    CHECK(r.nll[t] >= 0 && isfinite(r.nll[t]), "%s: nll %g", what,
                          (double)r.nll[t]);
                }
                printf("    %s: margin >= %g: nll %.6Lg, stats.nll rel err %.3g\n", what,
                       p.dead_margin[d], ref, rel_err(sn, ref, 0));
            }
            int64_t t = p.dead_row[0], H = p.H;
            double tol = grad_tol(p.dt, p.dt);
            double g0 = get(r.gh, p.dt, (size_t)(t * H));
            CHECK(g0 != 0 && isfinite(g0), "%s: dhidden[%lld][0] (the target's dlogit) is %g", what,
                  (long long)t, g0);
            CHECK(fabs(g0 - p.gh[t * H]) <= tol * fabs(p.gh[t * H]),
                  "%s: dhidden[%lld][0] %.6g ref %.6g", what, (long long)t, g0, p.gh[t * H]);
            size_t es = xent_dtype_size(p.dt);
            cmp_grad(what, "dhidden of the 30-nat row", (const char *)r.gh + (size_t)(t * H) * es,
                     p.dt, p.gh + t * H, NULL, (size_t)H, tol);
            check_run(what, &p, &q, &r);
        }
        lres_free(&r);
        lprob_free(&p);
        CHECK_LIMIT(10);
    }
}

/* accumulate = 1 into fp32 buffers holding random values of the gradient's
 * size: result = old + new. The sum adds one fp32 rounding (2^-24 of
 * |old + new|, about the gradient's size): within the same bounds. */
TEST(cuda_linear_accumulate) {
    if (!gpu_ready()) return;
    const xent_dtype dts[] = {XENT_BF16, XENT_F32};
    for (int a = 0; a < 2; a++) {
        lprob p;
        lprob_init(&p, dts[a], 37, 64, 1000);
        p.bias = 1;
        p.o.label_smoothing = 0.05;
        lrun q = all_grads(16);
        q.accumulate = 1;
        char what[64];
        snprintf(what, sizeof what, "accumulate, %s in", xent_dtype_name(dts[a]));
        run_case(what, &p, &q);
        CHECK_LIMIT(10);
    }
}

/* Forward only: xent_cuda_linear_logprobs gives bitwise the logprob of
 * xent_cuda_linear_ce with the same workspace (so the same chunks), and its
 * entropy and logprob are within the forward bound of the oracle; with the
 * default workspace too. */
TEST(cuda_linear_logprobs) {
    if (!gpu_ready()) return;
    lprob p;
    lprob_init(&p, XENT_BF16, 37, 96, 5003);
    p.bias = 1;
    p.o.temperature = 0.9;
    lprob_fill(&p);
    lprob_oracle(&p);
    int64_t T = p.T;
    ldev d;
    ldev_up(&d, &p);
    xent_linear_input in = linput(&p, &d);
    size_t wsb = xent_cuda_linear_workspace(&in, NULL, 16);
    void *ws = dev_alloc(wsb);
    float *dlp = dev_alloc((size_t)T * 4), *dent = dev_alloc((size_t)T * 4),
          *dlp2 = dev_alloc((size_t)T * 4), *dent2 = dev_alloc((size_t)T * 4);
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.logprob = dlp;
    out.entropy = dent;
    xent_status s = xent_cuda_linear_ce(&in, &p.o, &out, NULL, ws, wsb, NULL);
    CHECK(s == XENT_OK, "linear_ce: %s", xent_last_error());
    cudaMemset(ws, 0xFF, wsb);
    s = xent_cuda_linear_logprobs(&in, &p.o, dlp2, dent2, ws, wsb, NULL);
    CHECK(s == XENT_OK, "linear_logprobs: %s", xent_last_error());
    sync_ok("logprobs");
    float *lp = malloc((size_t)T * 4), *en = malloc((size_t)T * 4), *lp2 = malloc((size_t)T * 4),
          *en2 = malloc((size_t)T * 4);
    long double *rlp = malloc((size_t)T * sizeof(long double));
    host_copy(lp, dlp, (size_t)T * 4);
    host_copy(en, dent, (size_t)T * 4);
    host_copy(lp2, dlp2, (size_t)T * 4);
    host_copy(en2, dent2, (size_t)T * 4);
    for (int64_t t = 0; t < T; t++) rlp[t] = -p.nll[t];
    CHECK(!memcmp(lp, lp2, (size_t)T * 4), "logprobs differ bitwise from linear_ce's logprob");
    CHECK(!memcmp(en, en2, (size_t)T * 4), "entropy differs bitwise from linear_ce's entropy");
    cmp_fwd("logprobs", "logprob", lp2, rlp, T);
    cmp_fwd("logprobs", "entropy", en2, p.ent, T);
    /* default workspace, entropy only, then logprob only */
    cudaMemset(dlp2, 0xFF, (size_t)T * 4);
    cudaMemset(dent2, 0xFF, (size_t)T * 4);
    s = xent_cuda_linear_logprobs(&in, &p.o, NULL, dent2, NULL, 0, NULL);
    CHECK(s == XENT_OK, "linear_logprobs (entropy only): %s", xent_last_error());
    s = xent_cuda_linear_logprobs(&in, &p.o, dlp2, NULL, NULL, 0, NULL);
    CHECK(s == XENT_OK, "linear_logprobs (logprob only): %s", xent_last_error());
    sync_ok("logprobs default");
    host_copy(lp2, dlp2, (size_t)T * 4);
    host_copy(en2, dent2, (size_t)T * 4);
    cmp_fwd("logprobs default ws", "logprob", lp2, rlp, T);
    cmp_fwd("logprobs default ws", "entropy", en2, p.ent, T);
    ldev_free(&d);
    dev_free(ws); dev_free(dlp); dev_free(dent); dev_free(dlp2); dev_free(dent2);
    free(lp); free(en); free(lp2); free(en2); free(rlp);
    lprob_free(&p);
}

/* Shards of the weight: 3 uneven shards -> shard stats -> combine ->
 * backward per shard (hidden gradients summed over the shards) against the
 * unsharded call and the oracle. Both losses are within 3 ulp of the same
 * exact value (grid: exact logits), so they differ by at most 6 ulp of fp32
 * (7.2e-7 relative) < 1e-6. */
TEST(cuda_linear_shards) {
    if (!gpu_ready()) return;
    lprob p;
    lprob_init(&p, XENT_BF16, 37, 64, 5003);
    p.bias = 1;
    p.o.label_smoothing = 0.05;
    p.o.z_loss = 1e-4;
    lprob_fill(&p);
    lprob_oracle(&p);
    int64_t T = p.T, H = p.H, V = p.V;
    const int S = 3;
    const int64_t cut[4] = {0, 1500 + 7, 3400 - 5, 5003};
    ldev d;
    ldev_up(&d, &p);
    /* unsharded */
    lrun q = all_grads(16);
    lres ur;
    xent_status s = run_linear("unsharded", &p, &q, &ur);
    xent_linear_input in = linput(&p, &d);
    xent_ce_partial *dparts = dev_alloc((size_t)S * T * sizeof(xent_ce_partial));
    for (int k = 0; k < S && s == XENT_OK; k++) {
        xent_linear_input si = in;
        si.weight = (const uint16_t *)d.w + cut[k] * H;
        si.bias = (const uint16_t *)d.b + cut[k];
        si.V = cut[k + 1] - cut[k];
        xent_ce_opts o = p.o;
        o.vocab_start = cut[k];
        o.vocab_total = V;
        xent_status sk =
            xent_cuda_linear_shard_stats(&si, &o, dparts + (size_t)k * T, NULL, 0, NULL);
        CHECK(sk == XENT_OK, "shard %d stats: %s", k, xent_last_error());
    }
    float *dloss = dev_alloc(4), *dnll = dev_alloc((size_t)T * 4);
    xent_ce_stats *dst = dev_alloc((size_t)T * sizeof(xent_ce_stats));
    xent_ce_opts o = p.o;
    o.vocab_total = V;
    xent_ce_input ci = {NULL, p.dt, T, V, 0, d.lab, XENT_I64, NULL};
    xent_ce_output go;
    memset(&go, 0, sizeof go);
    go.loss = dloss;
    go.nll = dnll;
    go.stats = dst;
    CHECK(xent_cuda_ce_combine(dparts, S, &ci, &o, &go, NULL) == XENT_OK, "combine: %s",
          xent_last_error());
    float *gh[3];
    uint16_t *dgw = dev_alloc((size_t)(V * H) * 2), *dgb = dev_alloc((size_t)V * 2);
    for (int k = 0; k < S; k++) {
        gh[k] = dev_alloc((size_t)(T * H) * 4);
        xent_linear_input si = in;
        si.weight = (const uint16_t *)d.w + cut[k] * H;
        si.bias = (const uint16_t *)d.b + cut[k];
        si.V = cut[k + 1] - cut[k];
        xent_ce_opts ok = p.o;
        ok.vocab_start = cut[k];
        ok.vocab_total = V;
        xent_linear_grads g;
        memset(&g, 0, sizeof g);
        g.hidden = gh[k];
        g.hidden_dtype = XENT_F32;
        g.weight = dgw + cut[k] * H;
        g.weight_dtype = XENT_BF16;
        g.bias = dgb + cut[k];
        g.bias_dtype = XENT_BF16;
        size_t wsb = k == 1 ? 0 : xent_cuda_linear_workspace(&si, &g, 16);
        void *ws = wsb ? dev_alloc(wsb) : NULL;
        xent_status sk = xent_cuda_linear_backward(&si, &ok, dst, &g, ws, wsb, NULL);
        CHECK(sk == XENT_OK, "shard %d backward: %s", k, xent_last_error());
        sync_ok("shard backward");
        dev_free(ws);
    }
    float loss = NAN, *nll = malloc((size_t)T * 4), *hs = malloc((size_t)(T * H) * 4);
    double *sum = calloc((size_t)(T * H), sizeof(double));
    uint16_t *gw = malloc((size_t)(V * H) * 2), *gb = malloc((size_t)V * 2);
    host_copy(&loss, dloss, 4);
    host_copy(nll, dnll, (size_t)T * 4);
    host_copy(gw, dgw, (size_t)(V * H) * 2);
    host_copy(gb, dgb, (size_t)V * 2);
    for (int k = 0; k < S; k++) {
        host_copy(hs, gh[k], (size_t)(T * H) * 4);
        for (int64_t i = 0; i < T * H; i++) sum[i] += hs[i];
    }
    if (s == XENT_OK) {
        double e = rel_err(loss, (long double)ur.loss[0], 0);
        printf("    shards: loss %.9g unsharded %.9g (rel %.3g), oracle %.9Lg\n", (double)loss,
               (double)ur.loss[0], e, p.loss);
        CHECK(e <= 1e-6, "sharded loss %.9g vs unsharded %.9g: rel %.3g > 1e-6", (double)loss,
              (double)ur.loss[0], e);
        long double l = p.loss;
        cmp_fwd("shards", "loss", &loss, &l, 1);
        cmp_fwd("shards", "nll", nll, p.nll, T);
        /* summed hidden gradient: each shard's part is a product of bf16
         * dlogits; the sum adds fp32 roundings only */
        cmp_grad("shards", "sum of dhidden", sum, XENT_F64, p.gh, NULL, (size_t)(T * H),
                 TOL_GRAD16);
        cmp_grad("shards", "dweight", gw, XENT_BF16, p.gw, NULL, (size_t)(V * H), TOL_GRAD16);
        cmp_grad("shards", "dbias", gb, XENT_BF16, p.gb, NULL, (size_t)V, TOL_GRAD16);
        for (int k = 0; k < S; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "dweight rows of shard %d", k);
            cmp_grad("shards", nm, gw + cut[k] * H, XENT_BF16, p.gw + cut[k] * H, NULL,
                     (size_t)((cut[k + 1] - cut[k]) * H), TOL_GRAD16);
        }
        if (ur.gh)
            cmp_grad("unsharded", "dhidden", ur.gh, XENT_BF16, p.gh, NULL, (size_t)(T * H),
                     TOL_GRAD16);
    }
    for (int k = 0; k < S; k++) dev_free(gh[k]);
    dev_free(dgw); dev_free(dgb); dev_free(dparts); dev_free(dloss); dev_free(dnll); dev_free(dst);
    ldev_free(&d);
    free(nll); free(hs); free(sum); free(gw); free(gb);
    lres_free(&ur);
    lprob_free(&p);
}

/* ------------------------------------------------------------------ */
/* Bad input: a status, a message, and nothing written (bitwise)        */
/* ------------------------------------------------------------------ */

typedef struct {
    float *loss, *nll, *lp, *ent;
    void *gh, *gw;
    size_t ngh, ngw;
    int64_t T;
} bad_outs;

/* 1 when every output byte is still 0xFF. */
static int untouched(const bad_outs *b) {
    size_t n = (size_t)b->T * 4;
    size_t big = b->ngh > b->ngw ? b->ngh : b->ngw;
    if (big < n) big = n;
    unsigned char *h = malloc(big + 4);
    int ok = 1;
    const void *bufs[6] = {b->loss, b->nll, b->lp, b->ent, b->gh, b->gw};
    size_t lens[6] = {4, n, n, n, b->ngh, b->ngw};
    for (int i = 0; i < 6; i++) {
        host_copy(h, bufs[i], lens[i]);
        for (size_t j = 0; j < lens[i]; j++) ok &= h[j] == 0xFF;
    }
    free(h);
    return ok;
}

TEST(cuda_linear_bad_input) {
    if (!gpu_ready()) return;
    lprob p;
    lprob_init(&p, XENT_BF16, 8, 64, 100);
    p.bias = 1;
    lprob_fill(&p);
    for (int64_t t = 0; t < p.T; t++) p.lab[t] = t; /* all valid */
    p.lab[5] = p.V + 7;
    ldev d;
    ldev_up(&d, &p);
    int64_t T = p.T, H = p.H, V = p.V;
    bad_outs b;
    b.T = T;
    b.ngh = (size_t)(T * H) * 2;
    b.ngw = (size_t)(V * H) * 2;
    b.loss = dev_alloc(4); b.nll = dev_alloc((size_t)T * 4); b.lp = dev_alloc((size_t)T * 4);
    b.ent = dev_alloc((size_t)T * 4); b.gh = dev_alloc(b.ngh); b.gw = dev_alloc(b.ngw);
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.loss = b.loss; out.nll = b.nll; out.logprob = b.lp; out.entropy = b.ent;
    xent_linear_grads g;
    memset(&g, 0, sizeof g);
    g.hidden = b.gh; g.hidden_dtype = XENT_BF16;
    g.weight = b.gw; g.weight_dtype = XENT_BF16;
    xent_linear_input in0 = linput(&p, &d);
    size_t need1 = xent_cuda_linear_workspace(&in0, &g, 1);
    void *ws = dev_alloc(need1);
    for (int c = 0; c < 10; c++) {
        xent_linear_input in = in0;
        xent_ce_opts o = p.o;
        xent_linear_grads gc = g;
        xent_ce_output oc = out;
        void *w = NULL;
        size_t wb = 0;
        xent_status want = XENT_OK; /* XENT_OK here: any error status */
        const char *name = "", *msg = NULL;
        int64_t lab5 = p.V + 7;
        uint16_t dummy_grad;
        switch (c) {
        case 0: name = "label out of range"; want = XENT_ERR_LABEL; msg = "labels[5]"; break;
        case 1: name = "hidden NULL"; in.hidden = NULL; want = XENT_ERR_NULL; msg = "hidden"; break;
        case 2: name = "H = 0"; in.H = 0; want = XENT_ERR_SHAPE; break;
        case 3: name = "H < 0"; in.H = -3; want = XENT_ERR_SHAPE; break;
        case 4: name = "dtype i32"; in.dtype = XENT_I32; want = XENT_ERR_DTYPE; break;
        case 5: name = "grad dtype i64"; gc.hidden_dtype = XENT_I64; want = XENT_ERR_DTYPE; break;
        case 6: name = "label dtype f32"; in.label_dtype = XENT_F32; want = XENT_ERR_DTYPE; break;
        case 7: name = "out->grad set"; oc.grad = &dummy_grad; oc.grad_dtype = XENT_BF16; break;
        case 8:
            name = "workspace below one row"; w = ws; wb = need1 - 1; break;
        case 9: name = "vocab_start 10"; o.vocab_start = 10; o.vocab_total = V + 10; break;
        }
        if (c != 0) {
            /* valid labels everywhere except case 0 */
            int64_t ok5 = 5;
            cudaMemcpy((int64_t *)d.lab + 5, &ok5, 8, cudaMemcpyHostToDevice);
        } else {
            cudaMemcpy((int64_t *)d.lab + 5, &lab5, 8, cudaMemcpyHostToDevice);
        }
        xent_status s = xent_cuda_linear_ce(&in, &o, &oc, &gc, w, wb, NULL);
        sync_ok(name);
        const char *e = xent_last_error();
        if (want != XENT_OK)
            CHECK(s == want, "%s: status %d, expected %d (%s)", name, s, want, e);
        else
            CHECK(s != XENT_OK, "%s: accepted", name);
        CHECK(e && *e, "%s: no message", name);
        if (msg) CHECK(strstr(e, msg) != NULL, "%s: message does not name %s: %s", name, msg, e);
        CHECK(untouched(&b), "%s: outputs were written", name);
        printf("    %s: %s\n", name, e);
    }
    /* the other entry points: a bad label and a NULL hidden */
    int64_t lab5 = p.V + 7;
    cudaMemcpy((int64_t *)d.lab + 5, &lab5, 8, cudaMemcpyHostToDevice);
    xent_status s = xent_cuda_linear_logprobs(&in0, &p.o, b.lp, b.ent, NULL, 0, NULL);
    CHECK(s == XENT_ERR_LABEL && strstr(xent_last_error(), "labels[5]"),
          "logprobs bad label: status %d (%s)", s, xent_last_error());
    xent_linear_input in1 = in0;
    in1.hidden = NULL;
    xent_ce_partial *parts = dev_alloc((size_t)T * sizeof(xent_ce_partial));
    s = xent_cuda_linear_shard_stats(&in1, &p.o, parts, NULL, 0, NULL);
    CHECK(s == XENT_ERR_NULL, "shard_stats hidden NULL: status %d", s);
    xent_ce_stats *st = dev_alloc((size_t)T * sizeof(xent_ce_stats));
    s = xent_cuda_linear_backward(&in1, &p.o, st, &g, NULL, 0, NULL);
    CHECK(s == XENT_ERR_NULL, "backward hidden NULL: status %d", s);
    sync_ok("other entry points");
    CHECK(untouched(&b), "other entry points: outputs were written");
    dev_free(parts); dev_free(st); dev_free(ws);
    dev_free(b.loss); dev_free(b.nll); dev_free(b.lp); dev_free(b.ent); dev_free(b.gh);
    dev_free(b.gw);
    ldev_free(&d);
    lprob_free(&p);
}

#else /* no CUDA in this build */

TEST(cuda_linear_not_built) {
    xent_linear_input in;
    memset(&in, 0, sizeof in);
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    CHECK(xent_cuda_linear_ce(&in, NULL, &out, NULL, NULL, 0, NULL) == XENT_ERR_UNSUPPORTED,
          "stub must say unsupported");
    xt_skip("built without nvcc: the CUDA kernels are not in this build");
}

#endif
