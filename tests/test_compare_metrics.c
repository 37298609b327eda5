/* tests/test_compare_metrics.c: the RL-trainer metrics of `xent compare`
 * (src/compare/metrics.c): each metric against a direct formula in long
 * double, the hand-computed fixture, the K3 series against a long Taylor
 * sum and against libxent's public RL API, the three breakdowns, the
 * reference floor (--ref-b), the "entropy" JSONL key and the CLI flags. */
#include "harness.h"
#include "compare/compare.h"

#include <stdlib.h>
#include <sys/wait.h>

#define FIX "tests/data/compare/"

/* |x - want| <= tol * max(1, |want|) */
static int close_to(double x, long double want, double tol) {
    long double s = fabsl(want) > 1 ? fabsl(want) : 1;
    return fabsl((long double)x - want) <= tol * s;
}

/* ---- K3: the series against long double ---------------------------------- */

/* e^x - 1 - x: for |x| < 1/2 a 150-term Taylor sum, else expm1l(x) - x
 * (condition number below 5; long double carries 11 more bits). */
static long double k3_taylor(long double x) {
    if (fabsl(x) >= 0.5L) return expm1l(x) - x;
    long double term = x, sum = 0; /* term = x^k / k! */
    for (int k = 2; k <= 150; k++) {
        term *= x / k;
        sum += term;
    }
    return sum;
}

TEST(rl_k3_series_exact) {
    const double xs[] = {1e-150, -1e-12, 1e-8, -3e-5, 1e-3, 0.1, -0.3, 0.4999, -0.4999, 0.5,
                         -0.5, 0.75, -1, 2, -3, 7.5, -12, 19.99, 20, -20};
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
        double got = xent_rl_k3(xs[i]);
        long double want = k3_taylor(xs[i]);
        /* relative: the series is a few ulps; expm1(x) - x has condition < 5 */
        CHECK(fabsl((long double)got - want) <= 4e-15L * fabsl(want), "k3(%g) = %.17g, want %.20Lg",
              xs[i], got, want);
    }
    /* the naive form cancels: exp(1e-8) - 1 - 1e-8 has no correct digit */
    double x = 1e-8;
    CHECK(fabs(exp(x) - 1 - x - xent_rl_k3(x)) > 1e-3 * xent_rl_k3(x),
          "the naive form happened to be right; the test input is too easy");
}

/* ---- every metric against a direct formula ----------------------------- */

typedef struct {
    int64_t n, nseq;
    double *a, *b, *h;
    int64_t *tok, *off;
    uint8_t *mask;
} dump_t;

/* Sequences of lengths 5, 70, 300 and 1100 (completions after a prompt of
 * 3 tokens), so every position bucket is populated; deltas mostly small,
 * some near the caps (w = 2.5, 4, 6, 0.3) and one beyond the clamp (-25);
 * token ids from a skewed distribution; entropies spanning every bucket,
 * a few NaN. */
static void make_dump(dump_t *d, xt_rng_t *g) {
    static const int64_t len[4] = {5, 70, 300, 1100};
    d->nseq = 4;
    d->n = 0;
    for (int q = 0; q < 4; q++) d->n += len[q];
    d->a = malloc((size_t)d->n * 8);
    d->b = malloc((size_t)d->n * 8);
    d->h = malloc((size_t)d->n * 8);
    d->tok = malloc((size_t)d->n * 8);
    d->off = malloc(5 * 8);
    d->mask = malloc((size_t)d->n);
    d->off[0] = 0;
    for (int q = 0; q < 4; q++) d->off[q + 1] = d->off[q] + len[q];
    for (int64_t i = 0; i < d->n; i++) {
        int q = 0;
        while (d->off[q + 1] <= i) q++;
        d->mask[i] = i - d->off[q] >= 3;
        double bb = -0.05 - 6 * xt_uniform(g);
        double dd = 0.05 * xt_normal(g);
        uint64_t r = xt_next(g) % 100;
        if (r == 0) dd = log(2.5);
        else if (r == 1) dd = log(4.0);
        else if (r == 2) dd = log(6.0);
        else if (r == 3) dd = log(0.3);
        double aa = bb + dd;
        if (aa > 0) { aa = -aa; }
        d->a[i] = aa;
        d->b[i] = bb;
        double u = xt_uniform(g);
        d->tok[i] = (int64_t)(u * u * u * 40); /* skewed: small ids common */
        d->h[i] = pow(10.0, -3 + 4 * xt_uniform(g)); /* 1e-3 .. 10 */
        if (xt_next(g) % 97 == 0) d->h[i] = NAN;
    }
    d->a[700] = -30; /* delta -25 before clamping: beyond the clamp 20 */
    d->b[700] = -5;
}

static void free_dump(dump_t *d) {
    free(d->a); free(d->b); free(d->h); free(d->tok); free(d->off); free(d->mask);
}

/* Direct sums of one group. */
typedef struct {
    long double n, s, s2, sabs, k1, k2, k3, chi, w, w2, tis, mis, ice;
} ref_acc;

static void ref_add(ref_acc *r, long double dd, const xent__cmp_opts *o) {
    long double lw = dd > o->clamp ? o->clamp : (dd < -o->clamp ? -o->clamp : dd);
    long double w = expl(lw);
    r->n += 1;
    r->s += dd;
    r->s2 += dd * dd;
    r->sabs += fabsl(dd);
    r->k1 += -lw;
    r->k2 += lw * lw / 2;
    r->k3 += k3_taylor(lw);
    r->chi += w * w - 1;
    r->w += w;
    r->w2 += w * w;
    r->tis += w > o->tis_cap;
    r->mis += w > o->mis_cap;
    r->ice += w < o->icepop_lo || w > o->icepop_hi;
}

static int ref_check(const char *what, const xent__cmp_rlm *m, const ref_acc *r) {
    int bad = 0;
#define EXPECT(field, want, tol)                                                        \
    do {                                                                                \
        if (!close_to(m->field, (want), (tol))) {                                       \
            CHECK(0, "%s: %s = %.17g, direct %.17Lg", what, #field, m->field, (long double)(want)); \
            bad = 1;                                                                    \
        }                                                                               \
    } while (0)
    CHECK(m->n == (int64_t)r->n, "%s: n %lld vs %.0Lf", what, (long long)m->n, r->n);
    if (!r->n) return m->n == 0;
    long double n = r->n;
    EXPECT(mean, r->s / n, 1e-12);
    EXPECT(rms, sqrtl(r->s2 / n), 1e-12);
    EXPECT(mean_abs, r->sabs / n, 1e-12);
    EXPECT(k1, r->k1 / n, 1e-12);
    EXPECT(k2, r->k2 / n, 1e-12);
    EXPECT(k3, r->k3 / n, 1e-12);
    EXPECT(chi2, r->chi / n, 1e-12);
    EXPECT(ess, r->w * r->w / (n * r->w2), 1e-12);
    EXPECT(tis, r->tis / n, 1e-15); /* counts: 1/n apart */
    EXPECT(mis, r->mis / n, 1e-15);
    EXPECT(icepop, r->ice / n, 1e-15);
#undef EXPECT
    return !bad;
}

static int cmp_ll(const void *x, const void *y) {
    long long a = *(const long long *)x, b = *(const long long *)y;
    return a < b ? -1 : a > b;
}

TEST(compare_rl_metrics_direct) {
    xt_rng_t *g = xt_rng();
    dump_t D;
    make_dump(&D, g);
    xent__cmp_data d = {D.a, D.b, NULL, D.n, D.tok, D.off, D.nseq, D.mask, NULL, D.h};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.bootstrap = 0;
    o.threads = 1;
    CHECK(o.tis_cap == 2 && o.mis_cap == 3 && o.icepop_lo == 0.5 && o.icepop_hi == 5 &&
          o.clamp == 20, "defaults changed: tis %g mis %g icepop [%g, %g] clamp %g", o.tis_cap,
          o.mis_cap, o.icepop_lo, o.icepop_hi, o.clamp);
    xent__cmp_result res;
    CHECK(!xent__cmp_compute(&d, &o, &res), "%s", xent_last_error());
    if (xt_failed()) { free_dump(&D); return; }
    const xent__cmp_rl *rl = &res.rl;
    /* token frequencies over the used tokens (all completion tokens here) */
    long long cnt[40] = {0};
    for (int64_t i = 0; i < D.n; i++) if (D.mask[i]) cnt[D.tok[i]]++;
    long long *cs = malloc((size_t)D.n * sizeof *cs);
    int64_t nu = 0;
    for (int64_t i = 0; i < D.n; i++) if (D.mask[i]) cs[nu++] = cnt[D.tok[i]];
    qsort(cs, (size_t)nu, sizeof *cs, cmp_ll);
    long long cut1 = cs[(nu + 2) / 3 - 1], cut2 = cs[(2 * nu + 2) / 3 - 1];
    free(cs);
    CHECK(rl->has_freq && rl->freq_cut[0] == cut1 && rl->freq_cut[1] == cut2,
          "frequency cuts %lld %lld, direct %lld %lld", (long long)rl->freq_cut[0],
          (long long)rl->freq_cut[1], cut1, cut2);
    ref_acc all, pos[4], ent[4], frq[3];
    memset(&all, 0, sizeof all);
    memset(pos, 0, sizeof pos);
    memset(ent, 0, sizeof ent);
    memset(frq, 0, sizeof frq);
    long double sa = 0, sb = 0, wmin = INFINITY, wmax = 0, wt = 0, wt2 = 0;
    long double ppa = 0, ppb = 0, lpd = 0, chis = 0, sw = 0, sw2 = 0, tiss = 0, miss = 0, misg = 0;
    int64_t nclamp = 0, nmiss = 0;
    for (int64_t q = 0; q < D.nseq; q++) {
        long double S = 0, qa = 0, qb = 0, nq = 0;
        for (int64_t i = D.off[q]; i < D.off[q + 1]; i++) {
            if (!D.mask[i]) continue;
            long double dd = (long double)D.a[i] - D.b[i];
            int64_t k = i - D.off[q] - 3; /* completion index */
            ref_add(&all, dd, &o);
            ref_add(&pos[k < 64 ? 0 : k < 256 ? 1 : k < 1024 ? 2 : 3], dd, &o);
            double hh = D.h[i];
            if (isnan(hh)) nmiss++;
            else ref_add(&ent[hh < 0.01 ? 0 : hh < 0.1 ? 1 : hh < 1 ? 2 : 3], dd, &o);
            long long c = cnt[D.tok[i]];
            ref_add(&frq[c <= cut1 ? 0 : c > cut2 ? 2 : 1], dd, &o);
            long double lw = fabsl(dd) > 20 ? (dd > 0 ? 20 : -20) : dd, w = expl(lw);
            nclamp += fabsl(dd) > 20;
            long double wc = w < 0.5L ? 0.5L : w > 2 ? 2 : w;
            wt += wc;
            wt2 += wc * wc;
            if (w < wmin) wmin = w;
            if (w > wmax) wmax = w;
            sa += D.a[i];
            sb += D.b[i];
            S += lw;
            qa += D.a[i];
            qb += D.b[i];
            nq += 1;
        }
        long double Sc = S > 20 ? 20 : S < -20 ? -20 : S, G = S / nq, ws = expl(Sc);
        ppa += expl(-qa / nq);
        ppb += expl(-qb / nq);
        lpd += (qb - qa) / nq;
        chis += ws * ws - 1;
        sw += ws;
        sw2 += ws * ws;
        tiss += ws > 2;
        miss += ws > 3;
        misg += expl(G) > 3;
    }
    CHECK(ref_check("all tokens", &rl->tok, &all), "token level");
    static const char *const pn[4] = {"0-63", "64-255", "256-1023", "1024+"};
    for (int k = 0; k < 4; k++) {
        CHECK(pos[k].n > 0, "position bucket %s empty: the fixture does not cover it", pn[k]);
        CHECK(ref_check(pn[k], &rl->pos[k], &pos[k]), "position %s", pn[k]);
        CHECK(ref_check("entropy", &rl->ent[k], &ent[k]) && ent[k].n > 0, "entropy bucket %d", k);
    }
    for (int k = 0; k < 3; k++)
        CHECK(ref_check("frequency", &rl->freq[k], &frq[k]) && frq[k].n > 0, "frequency bucket %d", k);
    CHECK(rl->has_entropy && rl->n_ent_missing == nmiss && nmiss > 0, "entropy missing %lld vs %lld",
          (long long)rl->n_ent_missing, (long long)nmiss);
    CHECK(rl->n_clamped == nclamp && nclamp == 1, "clamped %lld", (long long)rl->n_clamped);
    long double n = all.n;
    CHECK(close_to(rl->ppl_a, expl(-sa / n), 1e-12) && close_to(rl->ppl_b, expl(-sb / n), 1e-12),
          "ppl %.17g %.17g", rl->ppl_a, rl->ppl_b);
    CHECK(close_to(rl->w_min, wmin, 1e-14) && close_to(rl->w_max, wmax, 1e-14) &&
          close_to(rl->w_mean, all.w / n, 1e-12), "w min %g max %g", rl->w_min, rl->w_max);
    CHECK(close_to(rl->ess_trunc, wt * wt / (n * wt2), 1e-12), "ess truncated %.17g", rl->ess_trunc);
    CHECK(all.tis > 0 && all.mis > 0 && all.ice > 0 && all.mis < all.tis, "fixture misses a cap");
    long double m = 4;
    CHECK(rl->nseq == 4, "nseq %lld", (long long)rl->nseq);
    CHECK(close_to(rl->ppl_seq_a, ppa / m, 1e-12) && close_to(rl->ppl_seq_b, ppb / m, 1e-12),
          "per-sequence ppl");
    CHECK(close_to(rl->log_ppl_diff, lpd / m, 1e-12), "log ppl diff %.17g", rl->log_ppl_diff);
    CHECK(close_to(rl->chi2_seq, chis / m, 1e-12), "chi2 seq %.17g vs %.17Lg", rl->chi2_seq, chis / m);
    CHECK(close_to(rl->ess_seq, sw * sw / (m * sw2), 1e-12), "ess seq %.17g", rl->ess_seq);
    CHECK(close_to(rl->tis_seq, tiss / m, 1e-15) && close_to(rl->mis_seq, miss / m, 1e-15) &&
          close_to(rl->mis_geo, misg / m, 1e-15), "seq fractions %g %g %g vs %Lg %Lg %Lg", rl->tis_seq,
          rl->mis_seq, rl->mis_geo, tiss / m, miss / m, misg / m);
    xent__cmp_result_free(&res);
    /* other thresholds move the fractions the direct way */
    o.tis_cap = 1.01;
    o.mis_cap = 1.5;
    o.icepop_lo = 0.9;
    o.icepop_hi = 1.1;
    CHECK(!xent__cmp_compute(&d, &o, &res), "%s", xent_last_error());
    ref_acc all2;
    memset(&all2, 0, sizeof all2);
    for (int64_t i = 0; i < D.n; i++) if (D.mask[i]) ref_add(&all2, (long double)D.a[i] - D.b[i], &o);
    CHECK(ref_check("other caps", &res.rl.tok, &all2), "other caps");
    xent__cmp_result_free(&res);
    free_dump(&D);
}

/* ---- the hand-computed fixture (tests/test_compare.c's a/b.jsonl) ------ */

/* d = A - B on the 5 used tokens = [0.5, -0.25, 0, -1, 0] (sequence 0:
 * 0.5, -0.25, 0; sequence 1: -1, 0). k1 = mean(-d) = 0.15; k2 = mean d^2/2
 * = 0.2625 / 2; k3 = mean(e^d - 1 - d); w = e^d: only e^-1 = 0.37 is
 * outside [0.5, 5] (ICEPOP 0.2), none above 2 or 3. Sequences: S = 0.25,
 * -1; chi2_seq = (e^0.5 - 1 + e^-2 - 1) / 2. Perplexity of A: the used
 * A log-probs are -2, -0.5, -0.25, -3, -1.5: exp(7.25 / 5). Per sequence:
 * exp(2.75 / 3) and exp(4.5 / 2), mean of the two. */
TEST(compare_rl_fixture_hand_computed) {
    xent__cmp_cfg c;
    memset(&c, 0, sizeof c);
    xent__cmp_opts_default(&c.opts);
    xent__cmp_series sa, sb;
    CHECK(!xent__cmp_load_logprobs(FIX "a.jsonl", &sa) && !xent__cmp_load_logprobs(FIX "b.jsonl", &sb),
          "%s", xent_last_error());
    if (xt_failed()) return;
    xent__cmp_data d = {sa.lp, sb.lp, NULL, 6, sa.tokens, sa.offsets, 2, sa.mask, NULL, NULL};
    c.opts.bootstrap = 0;
    xent__cmp_result r;
    CHECK(!xent__cmp_compute(&d, &c.opts, &r), "%s", xent_last_error());
    const xent__cmp_rl *rl = &r.rl;
    const double dd[5] = {0.5, -0.25, 0, -1, 0};
    long double k3 = 0;
    for (int i = 0; i < 5; i++) k3 += expl(dd[i]) - 1 - dd[i];
    CHECK(close_to(rl->tok.k1, 0.15L, 1e-15) && close_to(rl->tok.k2, 0.13125L, 1e-15),
          "k1 %.17g k2 %.17g", rl->tok.k1, rl->tok.k2);
    CHECK(close_to(rl->tok.k3, k3 / 5, 1e-14), "k3 %.17g", rl->tok.k3);
    CHECK(rl->tok.icepop == 0.2 && rl->tok.tis == 0 && rl->tok.mis == 0, "fractions");
    CHECK(close_to(rl->chi2_seq, (expl(0.5L) - 1 + expl(-2.0L) - 1) / 2, 1e-14), "chi2 seq %.17g",
          rl->chi2_seq);
    CHECK(close_to(rl->ppl_a, expl(7.25L / 5), 1e-14), "ppl A %.17g", rl->ppl_a);
    CHECK(close_to(rl->ppl_seq_a, (expl(2.75L / 3) + expl(2.25L)) / 2, 1e-14), "ppl seq A %.17g",
          rl->ppl_seq_a);
    CHECK(rl->pos[0].n == 5 && rl->pos[1].n == 0 && !rl->has_entropy, "buckets");
    /* 5 distinct ids, each once: every token is "rare" (ties stay together) */
    CHECK(rl->has_freq && rl->freq[0].n == 5 && rl->n_ids == 5 && rl->freq_cut[0] == 1, "frequency");
    xent__cmp_result_free(&r);
    xent__cmp_series_free(&sa);
    xent__cmp_series_free(&sb);
}

/* ---- the same numbers through libxent's public RL API ------------------- */

/* On float log-probs (exact in double), the double metrics equal the
 * library's: xent_rl_kl_estimate's per-token K1/K2/K3 (each rounded to
 * float: relative 2^-24) and xent_rl_diagnostics' ESS, K1 and K3 (double:
 * the same series and exp). The library's chi2 is mean (w - 1)^2 = ours
 * - 2 (mean w - 1). */
TEST(compare_rl_matches_public_api) {
    xt_rng_t *g = xt_rng();
    enum { N = 4000 };
    float *fa = malloc(N * 4), *fb = malloc(N * 4), *k = malloc(N * 4);
    double *a = malloc(N * 8), *b = malloc(N * 8);
    for (int i = 0; i < N; i++) {
        fb[i] = (float)(-0.01 - 8 * xt_uniform(g));
        fa[i] = fb[i] + (float)(0.03 * xt_normal(g));
        if (fa[i] > 0) fa[i] = -fa[i];
        if (i % 500 == 0) fa[i] = fb[i] - 1.5f;
        a[i] = fa[i];
        b[i] = fb[i];
    }
    xent__cmp_data d = {a, b, NULL, N, NULL, NULL, 0, NULL, NULL, NULL};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.bootstrap = 0;
    xent__cmp_result r;
    CHECK(!xent__cmp_compute(&d, &o, &r), "%s", xent_last_error());
    const xent_rl_kl kinds[3] = {XENT_RL_KL_K1, XENT_RL_KL_K2, XENT_RL_KL_K3};
    const double ours[3] = {r.rl.tok.k1, r.rl.tok.k2, r.rl.tok.k3};
    for (int j = 0; j < 3; j++) {
        /* KL estimators take d = lp_ref - lp_new: lp_ref = A, lp_new = B */
        CHECK(!xent_rl_kl_estimate(kinds[j], fb, fa, N, NULL, o.clamp, k, NULL, NULL), "%s",
              xent_last_error());
        long double s = 0, sabs = 0;
        for (int i = 0; i < N; i++) { s += k[i]; sabs += fabsf(k[i]); }
        CHECK(fabsl(ours[j] - s / N) <= 1.2e-7L * sabs / N, "K%d: ours %.17g, library %.17Lg",
              j == 2 ? 3 : j + 1, ours[j], s / N);
    }
    xent_rl_input in;
    memset(&in, 0, sizeof in);
    int64_t off[2] = {0, N};
    in.T = N;
    in.nseq = 1;
    in.offsets = off;
    in.lp_new = fa;     /* the trainer: w = exp(lp_new - lp_sampler) */
    in.lp_sampler = fb;
    xent_rl_loss_opts lo;
    xent_rl_loss_opts_init(&lo);
    xent_rl_diag dg;
    CHECK(!xent_rl_diagnostics(&in, &lo, &dg), "%s", xent_last_error());
    CHECK(close_to(r.rl.tok.ess, dg.ess_frac, 1e-13), "ESS %.17g vs %.17g", r.rl.tok.ess, dg.ess_frac);
    CHECK(close_to(r.rl.tok.k1, dg.mismatch_kl_k1, 1e-13), "K1 %.17g vs %.17g", r.rl.tok.k1,
          dg.mismatch_kl_k1);
    CHECK(close_to(r.rl.tok.k3, dg.mismatch_kl_k3, 1e-13), "K3 %.17g vs %.17g", r.rl.tok.k3,
          dg.mismatch_kl_k3);
    CHECK(close_to(r.rl.tok.chi2, dg.chi2 + 2 * (r.rl.w_mean - 1), 1e-12), "chi2 %.17g vs %.17g",
          r.rl.tok.chi2, dg.chi2 + 2 * (r.rl.w_mean - 1));
    CHECK(r.rl.w_max == dg.weight_max, "max weight %.17g vs %.17g", r.rl.w_max, dg.weight_max);
    xent__cmp_result_free(&r);
    free(fa); free(fb); free(k); free(a); free(b);
}

/* ---- delta = floor + (e_A - e_B) with each engine's own reference ------ */

TEST(compare_reference_floor) {
    xt_rng_t *g = xt_rng();
    enum { N = 3000 };
    double *a = malloc(N * 8), *b = malloc(N * 8), *ra = malloc(N * 8), *rb = malloc(N * 8);
    long double sf = 0, sff = 0, see = 0, sdd = 0;
    for (int i = 0; i < N; i++) {
        ra[i] = -0.5 - 5 * xt_uniform(g);
        rb[i] = ra[i] + 0.004 * xt_normal(g); /* the fp32-vs-fp32 floor */
        double common = 0.02 * xt_normal(g);
        a[i] = ra[i] + common + 0.01 * xt_normal(g);
        b[i] = rb[i] + common + 0.01 * xt_normal(g);
        long double f = (long double)ra[i] - rb[i];
        long double e = ((long double)a[i] - ra[i]) - ((long double)b[i] - rb[i]);
        long double dd = (long double)a[i] - b[i];
        sf += f; sff += f * f; see += e * e; sdd += dd * dd;
    }
    xent__cmp_data d = {a, b, ra, N, NULL, NULL, 0, NULL, rb, NULL};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.bootstrap = 0;
    xent__cmp_result r;
    CHECK(!xent__cmp_compute(&d, &o, &r), "%s", xent_last_error());
    CHECK(r.has_ref_b, "has_ref_b");
    CHECK(close_to(r.floor_mean, sf / N, 1e-12) && close_to(r.floor_rms, sqrtl(sff / N), 1e-12),
          "floor mean %.17g rms %.17g", r.floor_mean, r.floor_rms);
    CHECK(close_to(r.rms_eab, sqrtl(see / N), 1e-12), "RMS(e_A - e_B) %.17g", r.rms_eab);
    double lhs = r.rms * r.rms, rhs = r.floor_rms * r.floor_rms + r.rms_eab * r.rms_eab + r.floor_cross;
    CHECK(fabs(lhs - rhs) <= 1e-12 * lhs, "RMS(delta)^2 %.17g vs floor + rest %.17g", lhs, rhs);
    CHECK(close_to(r.rms, sqrtl(sdd / N), 1e-12), "RMS delta");
    CHECK(r.rho > 0.6 && r.rho < 0.95, "rho %g (shared error 0.02, own 0.01)", r.rho);
    xent__cmp_result_free(&r);
    /* one reference: the floor is 0 and e_A - e_B is delta */
    d.rb = NULL;
    CHECK(!xent__cmp_compute(&d, &o, &r), "%s", xent_last_error());
    CHECK(!r.has_ref_b && r.floor_rms == 0 && r.floor_mean == 0 &&
          fabs(r.rms_eab - r.rms) <= 1e-12 * r.rms, "single reference: floor %g, %g vs %g",
          r.floor_rms, r.rms_eab, r.rms);
    xent__cmp_result_free(&r);
    /* a bad value in ref_b is counted as bad[3] */
    rb[10] = 0.5;
    d.rb = rb;
    CHECK(xent__cmp_compute(&d, &o, &r) == XENT_ERR_VALUE && r.bad[3].positive == 1 &&
          r.bad[3].first_positive == 10, "positive ref_b not refused");
    xent__cmp_result_free(&r);
    free(a); free(b); free(ra); free(rb);
}

/* ---- the "entropy" key of JSON Lines ------------------------------------ */

static xent_status parse(const char *s, xent__cmp_series *out) {
    return xent__cmp_parse_json("t.jsonl", s, strlen(s), 1, out);
}

TEST(compare_json_entropy) {
    xent__cmp_series s;
    CHECK(!parse("{\"logprobs\": [-1, -2], \"entropy\": [0.5, null]}\n"
                 "{\"logprobs\": [-3], \"entropy\": [2]}\n", &s), "%s", xent_last_error());
    CHECK(s.ent && s.nent == 3 && s.ent[0] == 0.5 && isnan(s.ent[1]) && s.ent[2] == 2, "entropy read");
    xent__cmp_series_free(&s);
    CHECK(parse("{\"logprobs\": [-1, -2], \"entropy\": [0.5]}\n", &s) == XENT_ERR_SHAPE &&
          strstr(xent_last_error(), "\"entropy\" has 1 entries"), "short entropy: %s", xent_last_error());
    CHECK(parse("{\"logprobs\": [-1], \"entropy\": [1]}\n{\"logprobs\": [-1]}\n", &s) == XENT_ERR_FORMAT &&
          strstr(xent_last_error(), "every line or on none"), "entropy on one line: %s", xent_last_error());
    CHECK(parse("{\"logprobs\": [-1], \"entropy\": [1], \"entropy\": [1]}\n", &s) == XENT_ERR_FORMAT &&
          strstr(xent_last_error(), "duplicate key \"entropy\""), "duplicate: %s", xent_last_error());
    CHECK(parse("{\"logprobs\": [-1], \"entropy\": 1}\n", &s) == XENT_ERR_FORMAT &&
          strstr(xent_last_error(), "\"entropy\" must be an array"), "scalar: %s", xent_last_error());
    CHECK(!parse("{\"logprobs\": [-1]}\n", &s) && !s.ent, "no entropy");
    xent__cmp_series_free(&s);
}

/* ---- the command line ----------------------------------------------------- */

static int sh(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *tmpf(const char *name) {
    static char dir[64], buf[8][256];
    static int k;
    if (!dir[0]) {
        strcpy(dir, "/tmp/xent_cmpm_XXXXXX");
        if (!mkdtemp(dir)) dir[0] = 0;
    }
    char *p = buf[k++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

TEST(compare_rl_cli_flags) {
    const char *exe = xt_xent_bin();
    if (!exe) { xt_skip("xent binary not built"); return; }
    static char out[1 << 16];
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s compare --help 2>&1", exe);
    CHECK(sh(cmd, out, sizeof out) == 0, "--help");
    const char *flags[] = {"--ref-b", "--entropy", "--tis-cap C", "--mis-cap C", "--icepop-lo",
                           "--icepop-hi"};
    const char *defs[] = {"(default: --ref)", NULL, "(default: 2)", "(default: 3)", "(default: 0.5)",
                          "(default: 5)"};
    for (int i = 0; i < 6; i++) {
        char pat[40];
        snprintf(pat, sizeof pat, "\n  %s", flags[i]);
        const char *p = strstr(out, pat);
        const char *d = p ? strstr(p, "(default:") : NULL;
        CHECK(p && d && (!defs[i] || !strncmp(d, defs[i], strlen(defs[i]))),
              "--help: %s with its default %s", flags[i], defs[i] ? defs[i] : "");
    }
    const char *bad[][2] = {{"--tis-cap 0", "--tis-cap"}, {"--mis-cap -1", "--mis-cap"},
                            {"--icepop-lo 5 --icepop-hi 1", "--icepop-lo"}, {"--tis-cap x", "--tis-cap"}};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl %s 2>&1", exe, FIX, FIX, bad[i][0]);
        CHECK(sh(cmd, out, sizeof out) == 2 && strstr(out, bad[i][1]), "%s: %s", bad[i][0], out);
    }
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --ref-b %sref.txt 2>&1", exe, FIX, FIX, FIX);
    CHECK(sh(cmd, out, sizeof out) == 2 && strstr(out, "--ref-b needs --ref"), "--ref-b alone: %s", out);
    /* thresholds reach the numbers: w = e^d = [1.65, 0.78, 1, 0.37, 1]:
     * above 1.1 and above 1.6: 1 of 5; outside [0.9, 1.5]: 3 of 5 */
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --tis-cap 1.1 --mis-cap 1.6 "
             "--icepop-lo 0.9 --icepop-hi 1.5 --bootstrap 0 --quiet --json - 2>&1", exe, FIX, FIX);
    CHECK(sh(cmd, out, sizeof out) == 0, "run: %s", out);
    const char *tok = strstr(out, "\"rl\": {\"token\": {");
    CHECK(tok && strstr(tok, "\"tis_frac\": 0.20000000000000001, \"mis_frac\": 0.20000000000000001, "
                              "\"icepop_frac\": 0.59999999999999998"), "thresholds: %.600s", tok ? tok : out);
    CHECK(strstr(out, "\"tis_cap\": 1.1000000000000001, \"mis_cap\": 1.6000000000000001"),
          "thresholds echoed");
    CHECK(strstr(out, "\"position\": [{\"bucket\": \"0-63\", \"metrics\": {\"n\": 5,") &&
          strstr(out, "\"entropy\": null") && strstr(out, "\"frequency\": [{\"bucket\": \"rare\""),
          "breakdown JSON: %.300s", out);
    /* --entropy as text: one value per token; the table shows the buckets */
    FILE *f = fopen(tmpf("h.txt"), "w");
    if (f) { fputs("0.001\n0.05\n0.5\n3\n0.2\nnan\n", f); fclose(f); }
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --ref %sref.txt --ref-b %sref.txt "
             "--entropy %s --bootstrap 0 2>&1", exe, FIX, FIX, FIX, FIX, tmpf("h.txt"));
    CHECK(sh(cmd, out, sizeof out) == 0, "entropy run: %s", out);
    CHECK(strstr(out, "RL-trainer metrics") && strstr(out, "  entropy ") &&
          strstr(out, "  0.01-0.1            1") && strstr(out, "  frequency ") &&
          strstr(out, "delta = floor + (e_A - e_B)") && strstr(out, "floor = ref - ref_b"),
          "table: %.3000s", out);
    f = fopen(tmpf("h3.txt"), "w");
    if (f) { fputs("0.1\n0.2\n0.3\n", f); fclose(f); }
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --entropy %s 2>&1", exe, FIX, FIX,
             tmpf("h3.txt"));
    CHECK(sh(cmd, out, sizeof out) == 1 && strstr(out, "lengths differ"), "short --entropy: %s", out);
}
