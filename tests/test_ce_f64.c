/* tests/test_ce_f64.c: xent_ce_f64 (float64 logits, float64 outputs)
 * against a 113-bit oracle (__float128 on x86-64, long double where it is
 * IEEE quad), with its own exp and log so that no libquadmath is needed.
 *
 * Every output must be faithfully rounded: one of the two doubles around
 * the oracle's value (docs/numerics.md, "The float64 path"). The oracle
 * uses cancellation-free forms relative to the row's max (nll = log1p of
 * the non-target mass when the target is the max, else L - x_t; p_t - 1 as
 * minus the non-target mass), so its own error (about 2^-100 relative) is
 * far below half an ulp of double. The exception, as for the fp32 path, is
 * a label-smoothed gradient (a p_j - eps/V cancels): there the bound is
 * absolute, 2^-55 |g/tau| (a p_j + eps/V) plus one ulp. */
#include "harness.h"
#include "xent.h"

#include <float.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__SIZEOF_FLOAT128__)
typedef __float128 qf;
#define Q(x) x##Q
#define HAVE_QUAD 1
#elif LDBL_MANT_DIG == 113
typedef long double qf;
#define Q(x) x##L
#define HAVE_QUAD 1
#else
#define HAVE_QUAD 0
#endif

#if HAVE_QUAD

/* ---------------------------------------------------------------------- */
/* Quad exp / log (about 2^-104 relative)                                  */
/* ---------------------------------------------------------------------- */

static const qf QLN2 = Q(0x1.62e42fefa39ef35793c7673007e6p-1);

static qf q_pow2(long n) { /* exact, |n| <= 16000 */
    qf r = 1, b = n < 0 ? Q(0.5) : Q(2.0);
    unsigned long e = (unsigned long)(n < 0 ? -n : n);
    while (e) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return r;
}

static qf q_exp(qf x) {
    if (x != x) return x;
    if (x < -11300) return 0;
    long n = (long)llround((double)x * 1.4426950408889634);
    qf r = (x - (qf)n * QLN2) / 256; /* |r| <= 0.0014 */
    qf term = 1, s = 1;
    for (int k = 1; k <= 12; k++) {
        term = term * r / k;
        s += term;
    }
    for (int i = 0; i < 8; i++) s *= s;
    /* 2^n in two steps (n may exceed the exponent range alone) */
    long n1 = n / 2;
    return s * q_pow2(n1) * q_pow2(n - n1);
}

static qf q_log(qf y) { /* y > 0, finite */
    int k;
    double f = frexp((double)y, &k);
    qf l = (qf)log(f) + (qf)k * QLN2;
    for (int i = 0; i < 2; i++) l = l + (y * q_exp(-l) - 1);
    return l;
}

static qf q_log1p(qf q) { /* q >= 0 */
    if (q < Q(0x1p-20)) {
        qf s = 0, p = q;
        for (int k = 1; k <= 8; k++) {
            s += (k & 1 ? p : -p) / k;
            p *= q;
        }
        return s;
    }
    return q_log(1 + q);
}

/* ---------------------------------------------------------------------- */
/* Oracle of one row                                                       */
/* ---------------------------------------------------------------------- */

typedef struct {
    int nonfinite;
    qf nll, lse, entropy, loss;
    qf *grad; /* [V], for the upstream g */
} orow;

/* t < 0: ignored. lse_ok: 0 when lse cancels (L > 2 |lse|). */
static orow oracle(const double *z, int64_t V, int64_t t, double tau, double eps,
                   double kz, qf g, qf *grad, int *lse_ok) {
    orow o;
    memset(&o, 0, sizeof o);
    o.grad = grad;
    double M = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        if (z[j] != z[j] || z[j] == INFINITY) { o.nonfinite = 1; return o; }
        if (z[j] > M) M = z[j];
    }
    if (M == -INFINITY) { o.nonfinite = 1; return o; }
    qf *x = malloc((size_t)V * sizeof(qf)), *e = malloc((size_t)V * sizeof(qf));
    qf Sm1 = 0, xsum = 0; /* S - 1: the columns at the max counted apart */
    int masked = 0, top = 0;
    for (int64_t j = 0; j < V; j++) {
        if (z[j] == -INFINITY) { x[j] = -INFINITY; e[j] = 0; masked = 1; continue; }
        x[j] = ((qf)z[j] - (qf)M) / (qf)tau;
        e[j] = x[j] == 0 ? 1 : q_exp(x[j]);
        if (x[j] == 0) top++;
        else Sm1 += e[j];
        xsum += x[j];
    }
    Sm1 += (qf)(top - 1);
    qf L = q_log1p(Sm1);
    qf Mq = (qf)M / (qf)tau;
    o.lse = Mq + L;
    *lse_ok = M >= 0 || L <= 2 * (o.lse < 0 ? -o.lse : o.lse);
    qf H = 0;
    for (int64_t j = 0; j < V; j++)
        if (e[j] > 0) H += q_exp(x[j] - L) * (L - x[j]);
    o.entropy = H;
    if (t < 0) {
        for (int64_t j = 0; j < V; j++) grad[j] = 0;
        free(x);
        free(e);
        return o;
    }
    qf pnt = 0; /* 1 - p_t */
    for (int64_t j = 0; j < V; j++)
        if (j != t && e[j] > 0) pnt += q_exp(x[j] - L);
    if (z[t] == -INFINITY) {
        o.nll = INFINITY;
    } else if (x[t] == 0) {
        qf q = 0;
        for (int64_t j = 0; j < V; j++)
            if (j != t) q += e[j];
        o.nll = q_log1p(q);
    } else {
        o.nll = L - x[t];
    }
    qf ls = masked ? (qf)INFINITY : L - xsum / (qf)V;
    o.loss = 0;
    if (eps < 1) o.loss += (1 - (qf)eps) * o.nll;
    if (eps > 0) o.loss += (qf)eps * ls;
    if (kz > 0) o.loss += (qf)kz * o.lse * o.lse;
    qf a = 1 + 2 * (qf)kz * o.lse, G = g / (qf)tau;
    for (int64_t j = 0; j < V; j++) {
        qf pj = e[j] > 0 ? q_exp(x[j] - L) : 0;
        if (j == t)
            grad[j] = G * ((a - 1) * pj - (1 - (qf)eps) * pnt + (qf)eps * (pj - 1 / (qf)V));
        else
            grad[j] = G * (a * pj - (qf)eps / (qf)V);
    }
    free(x);
    free(e);
    return o;
}

/* y is one of the two doubles around X */
static int faithful(double y, qf X) {
    if (X != X) return y != y;
    double a = (double)X;
    if (isinf(a) && (qf)a == X) return y == a;
    if ((qf)a == X) return y == a;
    double b = nextafter(a, (qf)a < X ? INFINITY : -INFINITY);
    return y == a || y == b;
}

static double ulps(double y, qf X) {
    double a = (double)X;
    if (isinf(a) || isinf(y)) return y == a ? 0 : INFINITY;
    double u = a != 0 ? fabs(nextafter(a, INFINITY) - a) : 0x1p-1074;
    if (!(u > 0)) u = 0x1p-1074;
    qf d = (qf)y - X;
    return (double)((d < 0 ? -d : d) / (qf)u);
}

/* ---------------------------------------------------------------------- */
/* Running xent_ce_f64                                                     */
/* ---------------------------------------------------------------------- */

typedef struct {
    double *loss, *nll, *lp, *lse, *ent, *grad;
    int64_t counted, nonfinite;
    xent_status st;
} res;

static res run(const double *z, int64_t T, int64_t V, int64_t ld, const int64_t *y,
               const xent_ce_opts *o, const double *grad_rows, int want_grad) {
    res r;
    memset(&r, 0, sizeof r);
    int64_t nl = o->reduction == XENT_REDUCE_NONE ? T : 1;
    r.loss = malloc((size_t)(nl > 0 ? nl : 1) * 8);
    r.nll = malloc((size_t)T * 8 + 8);
    r.lp = malloc((size_t)T * 8 + 8);
    r.lse = malloc((size_t)T * 8 + 8);
    r.ent = malloc((size_t)T * 8 + 8);
    r.grad = want_grad ? malloc((size_t)(T * V) * 8 + 8) : NULL;
    xt_poison(r.nll, (size_t)T * 8);
    if (r.grad) xt_poison(r.grad, (size_t)(T * V) * 8);
    xent_ce_input in = {z, XENT_F64, T, V, ld, y, XENT_I64, NULL};
    xent_ce_output_f64 out = {r.loss, r.nll, r.lp, r.lse, r.ent, NULL, r.grad, 0,
                              &r.counted, &r.nonfinite};
    r.st = xent_ce_f64(&in, o, grad_rows, &out);
    return r;
}

static void res_free(res *r) {
    free(r->loss); free(r->nll); free(r->lp); free(r->lse); free(r->ent); free(r->grad);
}

/* Checks every output of rows [0, T) of r against the oracle; returns the
 * worst error in ulps of the faithful checks. */
static double check_rows(const double *z, int64_t T, int64_t V, int64_t ld, const int64_t *y,
                         const xent_ce_opts *o, const double *gr, qf g_base,
                         const res *r, const char *what) {
    qf *og = malloc((size_t)V * sizeof(qf));
    double worst = 0;
    for (int64_t i = 0; i < T; i++) {
        int64_t t = y[i] == o->ignore_index ? -1 : y[i];
        qf g = o->reduction == XENT_REDUCE_NONE ? (qf)o->grad_scale * (gr ? (qf)gr[i] : 1) : g_base;
        int lse_ok;
        orow w = oracle(z + i * ld, V, t, o->temperature, o->label_smoothing, o->z_loss, g, og, &lse_ok);
        if (w.nonfinite) {
            CHECK(r->nll[i] != r->nll[i] || t < 0, "%s row %lld: expected NaN", what, (long long)i);
            continue;
        }
        struct { const char *n; double got; qf X; int on; } c[] = {
            {"nll", r->nll[i], t >= 0 ? w.nll : 0, 1},
            {"logprob", -r->lp[i], t >= 0 ? w.nll : 0, 1},
            {"entropy", r->ent[i], w.entropy, 1},
            {"lse", r->lse[i], w.lse, lse_ok},
            {"loss", o->reduction == XENT_REDUCE_NONE ? r->loss[i] : 0.0, t >= 0 ? w.loss : 0,
             o->reduction == XENT_REDUCE_NONE},
        };
        for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
            if (!c[k].on) continue;
            CHECK(faithful(c[k].got, c[k].X), "%s row %lld %s: got %.17g, exact %.20Lg (%.3g ulp)", what,
                  (long long)i, c[k].n, c[k].got, (long double)c[k].X, ulps(c[k].got, c[k].X));
            double u = ulps(c[k].got, c[k].X);
            if (u > worst) worst = u;
        }
        if (!r->grad) continue;
        for (int64_t j = 0; j < V; j++) {
            double got = r->grad[i * V + j];
            if (o->label_smoothing == 0 || t < 0) {
                CHECK(faithful(got, og[j]), "%s row %lld grad[%lld]: got %.17g, exact %.20Lg (%.3g ulp)", what,
                      (long long)i, (long long)j, got, (long double)og[j], ulps(got, og[j]));
                double u = ulps(got, og[j]);
                if (u > worst) worst = u;
            } else {
                qf G = (g < 0 ? -g : g) / (qf)o->temperature;
                qf sl = 2 * (qf)o->label_smoothing * (j == t ? 1 : 1 / (qf)V);
                qf X = og[j], ax = X < 0 ? -X : X;
                double a = (double)X;
                qf bound = Q(0x1p-55) * (ax + G * sl) +
                           (qf)(a != 0 ? fabs(nextafter(a, INFINITY) - a) : 0x1p-1074);
                qf d = (qf)got - X;
                CHECK((d < 0 ? -d : d) <= bound, "%s row %lld grad[%lld] (smoothing): got %.17g, exact %.20Lg",
                      what, (long long)i, (long long)j, got, (long double)X);
            }
        }
        if (xt_failed() >= 10) break;
    }
    free(og);
    return worst;
}

static double rnd_scale(xt_rng_t *g) { return pow(10.0, -3 + 5 * xt_uniform(g)); }

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */
/* ---------------------------------------------------------------------- */

TEST(ce_f64_random_rows_vs_oracle) {
    xt_rng_t *g = xt_rng();
    const double taus[] = {1.0, 0.7, 3.0};
    const double epss[] = {0.0, 0.1};
    const double kzs[] = {0.0, 1e-3};
    double worst = 0;
    int trials = xt_sanitizer() ? 6 : 24;
    for (int trial = 0; trial < trials; trial++) {
        int64_t T = 1 + xt_randint(g, 6), V = 1 + xt_randint(g, 300);
        double s = rnd_scale(g);
        double *z = malloc((size_t)(T * V) * 8);
        int64_t *y = malloc((size_t)T * 8);
        for (int64_t k = 0; k < T * V; k++) z[k] = xt_normal(g) * s;
        for (int64_t i = 0; i < T; i++) y[i] = xt_randint(g, V);
        if (T > 1) y[1] = -100;
        if (T > 2) z[2 * V + y[2]] += 20 + 30 * xt_uniform(g); /* confident */
        xent_ce_opts o;
        xent_ce_opts_init(&o);
        o.reduction = XENT_REDUCE_NONE;
        o.temperature = taus[trial % 3];
        o.label_smoothing = epss[(trial / 3) % 2];
        o.z_loss = kzs[(trial / 6) % 2];
        o.grad_scale = 0.5 + xt_uniform(g);
        res r = run(z, T, V, V, y, &o, NULL, 1);
        CHECK(r.st == XENT_OK, "status %d: %s", r.st, xent_last_error());
        char what[256];
        snprintf(what, sizeof what, "trial %d (T %lld V %lld tau %g eps %g kz %g)", trial, (long long)T,
                 (long long)V, o.temperature, o.label_smoothing, o.z_loss);
        double w = check_rows(z, T, V, V, y, &o, NULL, 0, &r, what);
        if (w > worst) worst = w;
        res_free(&r);
        free(z);
        free(y);
        CHECK_LIMIT(10);
    }
    printf("    worst %.3f ulp\n", worst);
}

TEST(ce_f64_margins_subnormal_outputs) {
    /* the target m nats above / below the others: nll from subnormal to
     * 800, gradient entries down to the subnormals */
    xt_rng_t *g = xt_rng();
    const double margins[] = {-800, -740, -300, -40, -1, 0, 1, 17, 37, 40, 300, 700, 744, 800};
    int64_t V = 50;
    double worst = 0;
    for (size_t k = 0; k < sizeof margins / sizeof margins[0]; k++) {
        double z[3 * 50];
        int64_t y[3] = {0, 25, 49};
        for (int i = 0; i < 3 * 50; i++) z[i] = xt_normal(g);
        for (int i = 0; i < 3; i++) z[i * V + y[i]] = 3.0 + margins[k] * (i == 2 ? 0.5 : 1.0);
        xent_ce_opts o;
        xent_ce_opts_init(&o);
        o.reduction = XENT_REDUCE_NONE;
        for (int tv = 0; tv < 2; tv++) {
            o.temperature = tv ? 0.9 : 1.0;
            res r = run(z, 3, V, V, y, &o, NULL, 1);
            char what[256];
            snprintf(what, sizeof what, "margin %g tau %g", margins[k], o.temperature);
            double w = check_rows(z, 3, V, V, y, &o, NULL, 0, &r, what);
            if (w > worst) worst = w;
            res_free(&r);
        }
    }
    printf("    worst %.3f ulp\n", worst);
}

TEST(ce_f64_huge_logits_vs_oracle) {
    xt_rng_t *g = xt_rng();
    const double bigs[] = {3e3, 1e20, 1e300, 1.7976931348623157e308};
    int64_t V = 12;
    for (size_t k = 0; k < sizeof bigs / sizeof bigs[0]; k++) {
        double b = bigs[k], z[5 * 12];
        int64_t y[5] = {0, 3, 11, 5, 7};
        for (int j = 0; j < V; j++) {
            z[0 * V + j] = b;                                                  /* equal */
            z[1 * V + j] = -b;
            z[2 * V + j] = b * (1 - (double)xt_randint(g, 4) * 0x1p-52);       /* ulps apart */
            z[3 * V + j] = j % 2 ? b : xt_normal(g);                           /* half huge */
            z[4 * V + j] = j == 7 ? -b : xt_normal(g) * 3;                     /* target alone */
        }
        for (int tv = 0; tv < 2; tv++) {
            xent_ce_opts o;
            xent_ce_opts_init(&o);
            o.reduction = XENT_REDUCE_NONE;
            o.temperature = tv ? 2.5 : 1.0;
            res r = run(z, 5, V, V, y, &o, NULL, 1);
            CHECK(r.st == XENT_OK, "status %d", r.st);
            CHECK(r.nonfinite == 0, "huge rows are finite, %lld counted", (long long)r.nonfinite);
            char what[256];
            snprintf(what, sizeof what, "huge %g tau %g", b, o.temperature);
            check_rows(z, 5, V, V, y, &o, NULL, 0, &r, what);
            if (tv == 0) {
                CHECK(r.grad[1] == 1.0 / 12 && r.grad[0] == 1.0 / 12 - 1, "equal row: %.17g %.17g",
                      r.grad[0], r.grad[1]);
            }
            res_free(&r);
        }
    }
}

TEST(ce_f64_options_sum_mean_threads_bitwise) {
    xt_rng_t *g = xt_rng();
    int64_t T = 53, V = 97, ld = 100;
    double *z = malloc((size_t)(T * ld) * 8);
    int64_t *y = malloc((size_t)T * 8);
    double *gr = malloc((size_t)T * 8);
    for (int64_t k = 0; k < T * ld; k++) z[k] = xt_normal(g) * 4;
    for (int64_t i = 0; i < T; i++) { y[i] = xt_randint(g, V); gr[i] = xt_normal(g); }
    y[3] = y[40] = -100;
    z[5 * ld + y[5]] = 90; /* a confident row */
    int64_t n = T - 2;
    const xent_reduction reds[] = {XENT_REDUCE_SUM, XENT_REDUCE_MEAN, XENT_REDUCE_NONE};
    for (int k = 0; k < 3; k++) {
        xent_ce_opts o;
        xent_ce_opts_init(&o);
        o.reduction = reds[k];
        o.temperature = 1.3;
        o.label_smoothing = k == 2 ? 0.0 : 0.05;
        o.z_loss = 1e-4;
        o.grad_scale = 0.75;
        o.threads = 1;
        res r1 = run(z, T, V, ld, y, &o, k == 2 ? gr : NULL, 1);
        CHECK(r1.st == XENT_OK && r1.counted == n, "status %d counted %lld", r1.st, (long long)r1.counted);
        qf gb = reds[k] == XENT_REDUCE_MEAN ? Q(0.75) / (qf)n : Q(0.75);
        /* per-row outputs and gradient (compact the strided rows) */
        double *zc = malloc((size_t)(T * V) * 8);
        for (int64_t i = 0; i < T; i++) memcpy(zc + i * V, z + i * ld, (size_t)V * 8);
        xent_ce_opts on = o;
        on.reduction = XENT_REDUCE_NONE;
        res rn = run(zc, T, V, V, y, &on, NULL, 0);
        check_rows(zc, T, V, V, y, &o, gr, gb, &r1, reds[k] == XENT_REDUCE_SUM ? "sum" : reds[k] == XENT_REDUCE_MEAN ? "mean" : "none");
        if (reds[k] != XENT_REDUCE_NONE) {
            qf tot = 0, *og = malloc((size_t)V * sizeof(qf));
            int lo;
            for (int64_t i = 0; i < T; i++)
                if (y[i] != -100)
                    tot += oracle(zc + i * V, V, y[i], o.temperature, o.label_smoothing, o.z_loss, 1, og, &lo).loss;
            qf X = reds[k] == XENT_REDUCE_SUM ? tot : tot / (qf)n;
            CHECK(faithful(r1.loss[0], X), "reduced loss %.17g vs %.20Lg", r1.loss[0], (long double)X);
            free(og);
        }
        /* bitwise: more threads, the dense copy, one row alone, in place */
        o.threads = 2;
        res r2 = run(zc, T, V, V, y, &o, k == 2 ? gr : NULL, 1);
        CHECK(r2.loss[0] == r1.loss[0], "threads change the loss");
        CHECK(!memcmp(r2.grad, r1.grad, (size_t)(T * V) * 8), "threads / stride change the gradient");
        CHECK(!memcmp(r2.nll, r1.nll, (size_t)T * 8), "threads change nll");
        if (k == 2) {
            res r3 = run(zc + 7 * V, 1, V, V, y + 7, &o, gr + 7, 1);
            CHECK(!memcmp(r3.grad, r1.grad + 7 * V, (size_t)V * 8) && r3.nll[0] == r1.nll[7],
                  "a row alone differs");
            res_free(&r3);
            double *zi = malloc((size_t)(T * V) * 8);
            memcpy(zi, zc, (size_t)(T * V) * 8);
            xent_ce_input in = {zi, XENT_F64, T, V, 0, y, XENT_I64, NULL};
            xent_ce_output_f64 out;
            memset(&out, 0, sizeof out);
            out.grad = zi;
            CHECK(xent_ce_f64(&in, &o, gr, &out) == XENT_OK, "in place: %s", xent_last_error());
            CHECK(!memcmp(zi, r1.grad, (size_t)(T * V) * 8), "in-place gradient differs");
            free(zi);
        }
        res_free(&r1);
        res_free(&r2);
        res_free(&rn);
        free(zc);
    }
    free(z);
    free(y);
    free(gr);
}

TEST(ce_f64_neg_inf_masking_and_nonfinite) {
    const double I = INFINITY;
    double z[] = {0.5, -I, 1.5, -2.0,   /* a masked column          */
                  -I, 0.0, 1.0, 2.0,    /* target masked: nll = inf */
                  -I, -I, 3.0, -I,      /* the target alone         */
                  -I, -I, -I, -I,       /* all masked: NaN          */
                  0.0, NAN, 1.0, 2.0,   /* NaN                      */
                  0.0, I, 1.0, 2.0,     /* +inf                     */
                  -I, -I, -I, -I};      /* ignored, all masked      */
    int64_t y[] = {2, 0, 2, 1, 0, 0, -100};
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    o.reduction = XENT_REDUCE_NONE;
    res r = run(z, 7, 4, 4, y, &o, NULL, 1);
    CHECK(r.st == XENT_OK, "status %d", r.st);
    CHECK(r.nonfinite == 4 && r.counted == 6, "nonfinite %lld counted %lld", (long long)r.nonfinite,
          (long long)r.counted);
    check_rows(z, 1, 4, 4, y, &o, NULL, 0, &r, "masked column");
    CHECK(r.grad[1] == 0.0, "masked column's gradient %g", r.grad[1]);
    CHECK(r.nll[1] == I && r.lp[1] == -I && r.loss[1] == I, "target at -inf: nll %g", r.nll[1]);
    CHECK(r.grad[4] == -1.0, "target at -inf: gradient %g", r.grad[4]);
    double s = r.grad[5] + r.grad[6] + r.grad[7];
    CHECK(fabs(s - 1.0) < 1e-15, "target at -inf: others sum to %.17g", s);
    CHECK(r.nll[2] == 0 && r.lse[2] == 3.0 && r.ent[2] == 0 && r.loss[2] == 0, "target alone");
    for (int j = 8; j < 12; j++) CHECK(r.grad[j] == 0.0, "target alone: grad %g", r.grad[j]);
    for (int i = 3; i < 6; i++) {
        CHECK(isnan(r.nll[i]) && isnan(r.loss[i]) && isnan(r.lse[i]), "row %d not NaN", i);
        for (int j = 0; j < 4; j++) CHECK(isnan(r.grad[i * 4 + j]), "row %d grad not NaN", i);
    }
    CHECK(r.loss[6] == 0 && isnan(r.lse[6]), "ignored all -inf row");
    for (int j = 0; j < 4; j++) CHECK(r.grad[24 + j] == 0.0, "ignored row gradient");
    /* label smoothing over a masked column: +inf, as torch */
    o.label_smoothing = 0.1;
    res r2 = run(z, 1, 4, 4, y, &o, NULL, 1);
    CHECK(r2.loss[0] == I && isfinite(r2.grad[0]), "smoothing with a masked column: %g", r2.loss[0]);
    res_free(&r);
    res_free(&r2);
}

TEST(ce_f64_large_vocab_vs_oracle) {
    xt_rng_t *g = xt_rng();
    int64_t V = xt_sanitizer() ? 4096 : 1 << 17;
    double *z = malloc((size_t)(2 * V) * 8);
    int64_t y[2] = {V / 3, V - 1};
    for (int64_t k = 0; k < 2 * V; k++) z[k] = xt_normal(g) * 2;
    z[V + V - 1] = 40; /* confident second row */
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    o.reduction = XENT_REDUCE_NONE;
    res r = run(z, 2, V, V, y, &o, NULL, 1);
    CHECK(r.st == XENT_OK, "status %d", r.st);
    double w = check_rows(z, 2, V, V, y, &o, NULL, 0, &r, "large V");
    printf("    V = %lld: worst %.3f ulp\n", (long long)V, w);
    res_free(&r);
    free(z);
}

TEST(ce_f64_bad_arguments) {
    double z[8] = {0};
    int64_t y[2] = {0, 1};
    xent_ce_input in = {z, XENT_F64, 2, 4, 0, y, XENT_I64, NULL};
    xent_ce_output_f64 out;
    memset(&out, 0, sizeof out);
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    CHECK(xent_ce_f64(&in, NULL, NULL, &out) == XENT_OK, "defaults: %s", xent_last_error());
    o.softcap = 30;
    CHECK(xent_ce_f64(&in, &o, NULL, &out) == XENT_ERR_UNSUPPORTED && strstr(xent_last_error(), "softcap"),
          "softcap: %s", xent_last_error());
    xent_ce_opts_init(&o);
    o.vocab_start = 2;
    o.vocab_total = 6;
    CHECK(xent_ce_f64(&in, &o, NULL, &out) == XENT_ERR_VALUE, "shard refused");
    in.dtype = XENT_F32;
    CHECK(xent_ce_f64(&in, NULL, NULL, &out) == XENT_ERR_DTYPE, "f32 refused");
    in.dtype = XENT_F64;
    xent_ce_output o32;
    memset(&o32, 0, sizeof o32);
    CHECK(xent_ce(&in, NULL, &o32) == XENT_ERR_DTYPE && strstr(xent_last_error(), "xent_ce_f64"),
          "xent_ce names xent_ce_f64: %s", xent_last_error());
    y[1] = 4;
    CHECK(xent_ce_f64(&in, NULL, NULL, &out) == XENT_ERR_LABEL, "label out of range");
    y[1] = 1;
    double bad[2] = {1.0, NAN};
    CHECK(xent_ce_f64(&in, NULL, bad, &out) == XENT_ERR_VALUE, "NaN grad_rows");
    CHECK(xent_ce_f64(NULL, NULL, NULL, &out) == XENT_ERR_NULL, "NULL input");
    CHECK(xent_ce_f64(&in, NULL, NULL, NULL) == XENT_ERR_NULL, "NULL output");
    in.ld = 3;
    CHECK(xent_ce_f64(&in, NULL, NULL, &out) == XENT_ERR_SHAPE, "ld < V");
}

#else

TEST(ce_f64_random_rows_vs_oracle) { xt_skip("no 113-bit floating type for the oracle"); }

#endif
