/* tests/test_sweep.c: the dead-zone emulations behind `xent sweep`.
 *
 * The common cross-entropy forms must return exactly 0 just above the
 * thresholds of docs/numerics.md section 5 and a nonzero value just below; xent's
 * exact kernel must never return 0 and stay within 1 ulp of the oracle.
 *
 * Why "just below / just above" = predicted margin -/+ 0.02 nats is safe:
 * the forms' decisions are roundings of fl(1 + s) or of p_t = 1/(1 + s) with
 * s = e^-m the non-target mass; the fp32 terms of s carry at most 1 ulp
 * (2^-24 relative) each, which moves the decision by |dm| = |ds / s| < 1e-6.
 * The input rounding moves the row's margin: lse_{j!=t} is a p-weighted mean
 * of the rounding errors of the x_j, each uniform in +-ulp/2 (bf16 at |x| ~ 50:
 * +-0.125, sd 0.072) over an effective V/e terms (N(0,1) weights e^n), so its
 * sd is 0.072 / sqrt(V/e) = 1.3e-3 at V = 8192 (the smallest used here), and
 * the test checks each row's actual margin to 1e-2 (7 sd). A row within 1e-2
 * of m -/+ 0.02 is at least 0.01 from the threshold: 0.01 >> 1e-6. */
#include "harness.h"

#include "audit/ce_forms.h"
#include "xent.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

static int64_t sweep_V(void) { return xt_sanitizer() ? 8192 : 32768; }

typedef struct {
    xent_ce_form form;
    int which;
    double base;
    double anchor;  /* the threshold as docs/numerics.md states it ...            */
    int anchor_is_p; /* ... as p_t (1) or as the margin m (0)              */
    double digits;  /* half a unit of its last stated digit              */
} th_case;

/* docs/numerics.md section 5, with the precision it is stated to. */
static const th_case k_cases[] = {
    {XENT_CE_FP32_NAIVE, XENT__OUT_NLL, 0, 16.64, 0, 0.005},
    {XENT_CE_FP32_NAIVE, XENT__OUT_GRAD, 0, 16.64, 0, 0.005},
    {XENT_CE_BF16_LSE, XENT__OUT_NLL, 8, 0.9692, 1, 5e-5},
    {XENT_CE_BF16_LSE, XENT__OUT_NLL, 16, 0.9394, 1, 5e-5},
    {XENT_CE_BF16_LSE, XENT__OUT_NLL, 32, 0.8825, 1, 5e-5},
    {XENT_CE_BF16_LSE, XENT__OUT_NLL, 64, 0.7788, 1, 5e-5},
    {XENT_CE_BF16_LSE, XENT__OUT_GRAD, 32, 0.8825, 1, 5e-5},
    {XENT_CE_BF16_PROBS, XENT__OUT_GRAD, 0, 0.998047, 1, 5e-7},
    {XENT_CE_F16_PROBS, XENT__OUT_GRAD, 0, 0.999756, 1, 5e-7},
    {XENT_CE_BF16_LOGSOFTMAX, XENT__OUT_NLL, 0, 5.55, 0, 0.005},
    {XENT_CE_BF16_LOGSOFTMAX, XENT__OUT_GRAD, 0, 5.55, 0, 0.005},
};
#define N_CASES ((int)(sizeof k_cases / sizeof *k_cases))

static double p_of(double m) { return 1.0 / (1.0 + exp(-m)); }

/* The predicted thresholds are the ones docs/numerics.md states. */
TEST(sweep_predicted_match_anchors) {
    for (int i = 0; i < N_CASES; i++) {
        const th_case *c = &k_cases[i];
        double m = xent__ce_form_predicted(c->form, c->which, (float)c->base);
        double got = c->anchor_is_p ? p_of(m) : m;
        CHECK(fabs(got - c->anchor) <= c->digits, "%s base %g: predicted %.7f, stated %.7g",
              xent__ce_form_name(c->form), c->base, got, c->anchor);
    }
    CHECK(isinf(xent__ce_form_predicted(XENT_CE_EXACT, XENT__OUT_NLL, 0.0f)), "exact: never");
    CHECK(isinf(xent__ce_form_predicted(XENT_CE_EXACT, XENT__OUT_GRAD, 32.0f)), "exact: never");
}

/* One form's output for `which` at nominal margin m; *actual = row margin. */
static float form_out(const xent__sweep_gen *g, xent_ce_form f, int which, double base,
                      double m, float *z, float *grad, double *actual) {
    xent__sweep_row(g, base, m, z);
    xent__ce_oracle o;
    xent__ce_oracle_row(z, g->V, g->t, &o);
    *actual = (double)o.margin;
    float nll;
    xt_poison(&nll, sizeof nll);
    xt_poison(grad, (size_t)g->V * sizeof *grad);
    xent__ce_form_row(f, z, g->V, g->t, &nll, grad);
    return which == XENT__OUT_GRAD ? grad[g->t] : nll;
}

/* Nonzero at predicted - 0.02, exactly 0 at predicted + 0.02, for f32, bf16
 * and f16 inputs (bf16_lse needs z_t representable: every base is). */
TEST(sweep_thresholds_nonzero_below_zero_above) {
    int64_t V = sweep_V();
    float *z = malloc((size_t)V * sizeof *z), *grad = malloc((size_t)V * sizeof *grad);
    CHECK(z && grad, "alloc");
    if (!z || !grad) { free(z); free(grad); return; }
    static const xent_dtype dts[] = {XENT_F32, XENT_BF16, XENT_F16};
    for (int d = 0; d < 3; d++) {
        xent__sweep_gen g;
        CHECK(!xent__sweep_gen_init(&g, V, -1, dts[d], 1.0, xt_seed()), "gen");
        for (int i = 0; i < N_CASES; i++) {
            const th_case *c = &k_cases[i];
            double m = xent__ce_form_predicted(c->form, c->which, (float)c->base), a1, a2;
            float below = form_out(&g, c->form, c->which, c->base, m - 0.02, z, grad, &a1);
            float above = form_out(&g, c->form, c->which, c->base, m + 0.02, z, grad, &a2);
            const char *name = xent__ce_form_name(c->form);
            CHECK(below == below && below != 0.0f, "%s %s base %g %s: %g at m = %.4f (want nonzero)",
                  name, c->which ? "grad" : "nll", c->base, xent_dtype_name(dts[d]), below, a1);
            CHECK(above == 0.0f, "%s %s base %g %s: %g at m = %.4f (want 0)", name,
                  c->which ? "grad" : "nll", c->base, xent_dtype_name(dts[d]), above, a2);
            /* the rows really sit on either side, well inside the 0.02 */
            CHECK(fabs(a1 - (m - 0.02)) < 1e-2 && fabs(a2 - (m + 0.02)) < 1e-2,
                  "row margins %.5f %.5f vs nominal %.5f +- 0.02", a1, a2, m);
        }
        xent__sweep_gen_free(&g);
        CHECK_LIMIT(10);
    }
    free(z);
    free(grad);
}

/* The bisection that `xent sweep` prints finds the predicted threshold. */
TEST(sweep_bisection_finds_prediction) {
    int64_t V = 8192;
    xent__sweep_gen g;
    CHECK(!xent__sweep_gen_init(&g, V, -1, XENT_BF16, 1.0, xt_seed()), "gen");
    for (int i = 0; i < N_CASES; i++) {
        const th_case *c = &k_cases[i];
        double pred = xent__ce_form_predicted(c->form, c->which, (float)c->base);
        double m = NAN, actual = NAN;
        int rc = xent__ce_form_threshold(&g, c->form, c->which, c->base, -10, 80, 1e-4,
                                         &m, &actual);
        CHECK(rc == 1 && fabs(actual - pred) < 5e-3, "%s base %g: rc %d, measured %.5f, predicted %.5f",
              xent__ce_form_name(c->form), c->base, rc, actual, pred);
    }
    double m, actual;
    CHECK(xent__ce_form_threshold(&g, XENT_CE_EXACT, XENT__OUT_NLL, 0, -10, 80, 1e-4, &m,
                                  &actual) == 0 && isinf(m), "exact nll is never 0");
    xent__sweep_gen_free(&g);
}

/* xent's kernel: never 0, within 1 ulp of the oracle (NLL and target grad,
 * the bound of docs/numerics.md)
 * at every margin from -10 to 80 and for the three input dtypes. */
TEST(sweep_exact_never_zero_1ulp) {
    int64_t V = sweep_V();
    float *z = malloc((size_t)V * sizeof *z), *grad = malloc((size_t)V * sizeof *grad);
    CHECK(z && grad, "alloc");
    if (!z || !grad) { free(z); free(grad); return; }
    static const xent_dtype dts[] = {XENT_F32, XENT_BF16, XENT_F16};
    static const double bases[] = {0, 16, 40};
    for (int d = 0; d < 3; d++) {
        xent__sweep_gen g;
        CHECK(!xent__sweep_gen_init(&g, V, -1, dts[d], 1.0, xt_seed() + (uint64_t)d), "gen");
        for (int b = 0; b < 3; b++) {
            /* one seeded margin in each step of [-10, 80]: over runs, all of it */
            double step = xt_sanitizer() ? 7.5 : 2.5;
            for (double m0 = -10; m0 < 80; m0 += step) {
                double m = m0 + step * xt_uniform(xt_rng());
                xent__sweep_row(&g, bases[b], m, z);
                xent__ce_oracle o;
                xent__ce_oracle_row(z, V, g.t, &o);
                float nll;
                xt_poison(&nll, sizeof nll);
                xt_poison(grad, (size_t)V * sizeof *grad);
                xent__ce_form_row(XENT_CE_EXACT, z, V, g.t, &nll, grad);
                double un = xt_ulp_dist_f32(nll, (float)o.nll);
                double ug = xt_ulp_dist_f32(grad[g.t], (float)o.grad_t);
                CHECK(nll != 0.0f && grad[g.t] != 0.0f, "%s base %g m %.4f: exact returned 0",
                      xent_dtype_name(dts[d]), bases[b], m);
                CHECK(un <= 1 && ug <= 1, "%s base %g m %.4f: nll %.9g vs %.9Lg (%g ulp), "
                      "grad_t %.9g vs %.9Lg (%g ulp)", xent_dtype_name(dts[d]), bases[b], m,
                      nll, o.nll, un, grad[g.t], o.grad_t, ug);
                CHECK_LIMIT(10);
            }
        }
        xent__sweep_gen_free(&g);
    }
    free(z);
    free(grad);
}

/* The oracle on a 2-column row [0, m]: nll = log1p(e^-m), grad_t = -1/(1+e^m). */
TEST(sweep_oracle_two_columns) {
    for (double m = -30; m <= 80; m += 0.37) {
        float z[2] = {0.0f, (float)m};
        xent__ce_oracle o;
        xent__ce_oracle_row(z, 2, 1, &o);
        double mm = (double)(float)m;
        double nll = mm > 0 ? log1p(exp(-mm)) : -mm + log1p(exp(mm));
        double gt = -1.0 / (1.0 + exp(mm));
        CHECK(fabs((double)o.nll - nll) <= 4 * DBL_EPSILON * nll, "m %g: nll %.17Lg vs %.17g", mm, o.nll, nll);
        CHECK(fabs((double)o.grad_t - gt) <= 4 * DBL_EPSILON * fabs(gt), "m %g: grad %.17Lg vs %.17g",
              mm, o.grad_t, gt);
        CHECK(o.margin == (long double)mm, "m %g: margin %.17Lg", mm, o.margin);
    }
}

/* The dead-zone signature: at m = 20 the fp32 form's loss and target gradient
 * are 0 while the row gradient sums to the non-target mass e^-m (not 0). */
TEST(sweep_fp32_row_gradient_sum) {
    int64_t V = sweep_V();
    float *z = malloc((size_t)V * sizeof *z), *grad = malloc((size_t)V * sizeof *grad);
    xent__sweep_gen g;
    CHECK(z && grad && !xent__sweep_gen_init(&g, V, -1, XENT_F32, 1.0, xt_seed()), "alloc");
    if (!z || !grad) { free(z); free(grad); return; }
    double actual;
    float nll = form_out(&g, XENT_CE_FP32_NAIVE, XENT__OUT_NLL, 0, 20, z, grad, &actual);
    long double sum = 0;
    for (int64_t j = 0; j < V; j++) sum += grad[j];
    /* each fp32 p_j has relative error <= ~2 ulp: the sum is e^-m (1 +- 1e-6) */
    double want = exp(-actual);
    CHECK(nll == 0.0f && grad[g.t] == 0.0f, "nll %g grad_t %g (want 0)", nll, grad[g.t]);
    CHECK(fabs((double)sum - want) <= 1e-5 * want, "row sum %.6Lg vs e^-m = %.6g", sum, want);
    xent__sweep_gen_free(&g);
    free(z);
    free(grad);
}

/* NaN in a row: every form's NLL is NaN (never a silent 0). */
TEST(sweep_forms_nan_row) {
    int64_t V = 1000;
    float *z = malloc((size_t)V * sizeof *z), *grad = malloc((size_t)V * sizeof *grad);
    CHECK(z && grad, "alloc");
    if (!z || !grad) { free(z); free(grad); return; }
    xt_rng_t *r = xt_rng();
    for (int64_t j = 0; j < V; j++) z[j] = (float)xt_normal(r);
    int64_t t = xt_randint(r, V);
    z[xt_randint(r, V)] = NAN;
    for (int f = 0; f < XENT_CE_FORM_COUNT; f++) {
        float nll = 0.0f;
        xent__ce_form_row((xent_ce_form)f, z, V, t, &nll, grad);
        CHECK(nll != nll, "%s: nll %g on a NaN row", xent__ce_form_name((xent_ce_form)f), nll);
    }
    xent_ce_form p;
    CHECK(xent__ce_form_parse("bf16_logsoftmax", &p) == 0 && p == XENT_CE_BF16_LOGSOFTMAX, "parse");
    CHECK(xent__ce_form_parse("nope", &p) != 0, "parse rejects");
    free(z);
    free(grad);
}
