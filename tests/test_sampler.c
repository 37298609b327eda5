/* tests/test_sampler.c: processed log-probs (include/xent/sampler.h) against
 * a long-double reference that sorts the row (O(V log V), the obvious way)
 * and applies docs/sampler.md's rules: min-p, then top-k (ties at the k-th
 * value kept), then top-p (smallest top-n count whose mass is >= top_p).
 *
 * Tolerance: every float output within 1 ulp of the reference (the
 * contract, docs/sampler.md "Error bound"); the kept count exactly, on every
 * row whose decision margins in the reference exceed 1e-9 (relative); rows
 * built to sit at a boundary check the flags instead. */
#include "harness.h"
#include "xent.h"

#include <float.h>
#include <stdlib.h>

typedef struct {
    long double lp, lpfull, lkm, H;
    int64_t kept;
    int kept_t;      /* label kept                                          */
    int partial_tie; /* top-p cut inside a tie group                        */
    int topk_tie;
    long double topp_margin; /* min |C_n - pS1|, |C_{n-1} - pS1| over S1     */
    long double minp_margin; /* min over columns |d - ln min_p|              */
} ref_out;

static const float *g_sort_z;
static int cmp_desc(const void *a, const void *b) {
    float x = g_sort_z[*(const int64_t *)a], y = g_sort_z[*(const int64_t *)b];
    return x > y ? -1 : x < y ? 1 : 0;
}

static ref_out reference(const float *z, int64_t V, double tau, int64_t k, double p, double minp,
                         int64_t label) {
    ref_out r;
    memset(&r, 0, sizeof r);
    int64_t *ix = malloc((size_t)V * sizeof *ix);
    long double *e = malloc((size_t)V * sizeof *e);
    for (int64_t j = 0; j < V; j++) ix[j] = j;
    g_sort_z = z;
    qsort(ix, (size_t)V, sizeof *ix, cmp_desc);
    long double zmax = z[ix[0]];
    long double Sall = 0;
    for (int64_t j = 0; j < V; j++) {
        e[j] = expl(((long double)z[j] - zmax) / tau);
        Sall += e[j];
    }
    /* min-p: a prefix of the sorted order */
    int64_t n1 = V;
    r.minp_margin = INFINITY;
    if (minp > 0) {
        long double lmp = logl((long double)minp);
        n1 = 0;
        for (int64_t i = 0; i < V; i++) {
            long double d = ((long double)z[ix[i]] - zmax) / tau;
            if (d >= lmp) n1 = i + 1;
            if (fabsl(d - lmp) < r.minp_margin) r.minp_margin = fabsl(d - lmp);
        }
    }
    /* top-k: keep values >= the k-th largest */
    if (k > 0 && k < n1) {
        float vk = z[ix[k - 1]];
        int64_t n = k;
        while (n < n1 && z[ix[n]] == vk) n++;
        r.topk_tie = n > k;
        n1 = n;
    }
    long double S1 = 0;
    for (int64_t i = 0; i < n1; i++) S1 += e[ix[i]];
    int64_t n = n1;
    r.topp_margin = INFINITY;
    if (p < 1) {
        long double target = (long double)p * S1, c = 0, prev = 0;
        for (n = 1; n <= n1; n++) {
            prev = c;
            c += e[ix[n - 1]];
            if (c >= target) break;
        }
        if (n > n1) n = n1;
        r.topp_margin = fminl(fabsl(c - target), fabsl(target - prev)) / S1;
        r.partial_tie = n < n1 && z[ix[n]] == z[ix[n - 1]];
    }
    long double SK = 0, A = 0, R = 0;
    for (int64_t i = n; i < V; i++) R += e[ix[i]];
    for (int64_t i = 0; i < n; i++) {
        long double d = ((long double)z[ix[i]] - zmax) / tau;
        SK += e[ix[i]];
        A += e[ix[i]] * -d;
    }
    /* log S with S - 1 summed apart (the max columns are exactly 1) */
    long double sk1 = -1, sa1 = -1;
    for (int64_t i = 0; i < V; i++) {
        if (z[ix[i]] == z[ix[0]]) { sa1 += 1; if (i < n) sk1 += 1; }
    }
    for (int64_t i = 0; i < V; i++) {
        if (z[ix[i]] == z[ix[0]]) continue;
        sa1 += e[ix[i]];
        if (i < n) sk1 += e[ix[i]];
    }
    long double L = log1pl(sk1), Lall = log1pl(sa1);
    r.kept = n;
    r.H = L + A / SK;
    r.lkm = -log1pl(R / SK); /* R summed apart: no cancellation */
    if (label >= 0) {
        long double dt = ((long double)z[label] - zmax) / tau;
        r.kept_t = z[label] >= z[ix[n - 1]];
        r.lp = r.kept_t ? dt - L : -INFINITY;
        r.lpfull = dt - Lall;
    }
    free(ix);
    free(e);
    return r;
}

/* |x - ref| in units of the float spacing at ref. */
static double ulp_err(float x, long double ref) {
    /* beyond the largest float plus half its ulp the rounding is inf */
    if (fabsl(ref) >= 0x1p128L - 0x1p103L && !isinf(ref)) ref = ref < 0 ? -INFINITY : INFINITY;
    if (isinf(ref) || isinf(x)) return (isinf(ref) && isinf(x) && (x < 0) == (ref < 0)) ? 0 : 1e30;
    if (isnan(x)) return 1e30;
    long double a = fabsl(ref);
    int ex;
    frexpl(a, &ex);
    long double ulp = ldexpl(1.0L, ex - 24);
    if (ulp < 0x1p-149L) ulp = 0x1p-149L;
    return (double)(fabsl((long double)x - ref) / ulp);
}

typedef struct {
    float *lp, *lpf, *lkm, *H;
    int64_t *kept;
    int32_t *flags;
    int64_t n_counted, n_dropped, n_amb, n_nonfinite;
} outs;

static void outs_alloc(outs *o, int64_t T) {
    o->lp = malloc(4 * (size_t)T);
    o->lpf = malloc(4 * (size_t)T);
    o->lkm = malloc(4 * (size_t)T);
    o->H = malloc(4 * (size_t)T);
    o->kept = malloc(8 * (size_t)T);
    o->flags = malloc(4 * (size_t)T);
    xt_poison(o->lp, 4 * (size_t)T);
    xt_poison(o->H, 4 * (size_t)T);
}
static void outs_free(outs *o) {
    free(o->lp); free(o->lpf); free(o->lkm); free(o->H); free(o->kept); free(o->flags);
}

static xent_status run(const void *logits, xent_dtype dt, int64_t T, int64_t V, const int64_t *labels,
                       const xent_sampler_opts *opt, outs *o) {
    xent_ce_input in;
    memset(&in, 0, sizeof in);
    in.logits = logits;
    in.dtype = dt;
    in.T = T;
    in.V = V;
    in.labels = labels;
    in.label_dtype = XENT_I64;
    xent_sampler_output out = {o->lp, o->lpf, o->kept, o->lkm, o->H, o->flags,
                               &o->n_counted, &o->n_dropped, &o->n_amb, &o->n_nonfinite};
    return xent_sampler_logprobs(&in, opt, &out);
}

#define AMBIG (XENT_SAMPLER_MINP_NEAR | XENT_SAMPLER_TOPP_NEAR | XENT_SAMPLER_TOPP_TIE)

/* Checks row i against the reference; returns the largest ulp error. */
static double check_row(const char *what, int64_t i, const float *z, int64_t V, const xent_sampler_opts *op,
                        int64_t label, const outs *o) {
    ref_out r = reference(z, V, op->temperature, op->top_k, op->top_p, op->min_p, label);
    int decided = r.topp_margin > 1e-9L && r.minp_margin > 1e-9L * (1 + fabsl(logl(op->min_p > 0 ? op->min_p : 1)));
    int f = o->flags[i];
    double worst = 0;
    if (!decided) return 0;
    CHECK(!(f & (XENT_SAMPLER_MINP_NEAR | XENT_SAMPLER_TOPP_NEAR)),
          "%s row %lld: flags %d on a row with margins %Lg / %Lg", what, (long long)i, f, r.topp_margin,
          r.minp_margin);
    CHECK(o->kept[i] == r.kept, "%s row %lld: kept %lld, reference %lld (T %g k %lld p %g minp %g)", what,
          (long long)i, (long long)o->kept[i], (long long)r.kept, op->temperature, (long long)op->top_k,
          op->top_p, op->min_p);
    CHECK(!!(f & XENT_SAMPLER_TOPP_TIE) == r.partial_tie, "%s row %lld: TOPP_TIE %d, reference %d", what,
          (long long)i, !!(f & XENT_SAMPLER_TOPP_TIE), r.partial_tie);
    CHECK(!!(f & XENT_SAMPLER_TOPK_TIE) == r.topk_tie, "%s row %lld: TOPK_TIE %d, reference %d", what,
          (long long)i, !!(f & XENT_SAMPLER_TOPK_TIE), r.topk_tie);
    if (o->kept[i] != r.kept) return 1e30;
    double e;
    if (label >= 0) {
        e = ulp_err(o->lp[i], r.lp);
        worst = fmax(worst, e);
        CHECK(e <= 1.0, "%s row %lld: logprob %.9g, reference %.12Lg (%.3g ulp)", what, (long long)i,
              (double)o->lp[i], r.lp, e);
        e = ulp_err(o->lpf[i], r.lpfull);
        worst = fmax(worst, e);
        CHECK(e <= 1.0, "%s row %lld: logprob_full %.9g, reference %.12Lg (%.3g ulp)", what, (long long)i,
              (double)o->lpf[i], r.lpfull, e);
    } else {
        CHECK(o->lp[i] == 0.0f && o->lpf[i] == 0.0f, "%s row %lld: ignored row logprob %g", what, (long long)i,
              (double)o->lp[i]);
    }
    e = ulp_err(o->H[i], r.H);
    worst = fmax(worst, e);
    CHECK(e <= 1.0, "%s row %lld: entropy %.9g, reference %.12Lg (%.3g ulp)", what, (long long)i, (double)o->H[i],
          r.H, e);
    e = ulp_err(o->lkm[i], r.lkm);
    worst = fmax(worst, e);
    CHECK(e <= 1.0, "%s row %lld: log_kept_mass %.9g, reference %.12Lg (%.3g ulp)", what, (long long)i,
          (double)o->lkm[i], r.lkm, e);
    return worst;
}

static void to_dtype(const float *z, int64_t n, xent_dtype dt, void *dst, float *back) {
    for (int64_t j = 0; j < n; j++) {
        if (dt == XENT_F32) {
            ((float *)dst)[j] = z[j];
            back[j] = z[j];
        } else if (dt == XENT_BF16) {
            uint16_t h = xent_f32_to_bf16(z[j]);
            ((uint16_t *)dst)[j] = h;
            back[j] = xent_bf16_to_f32(h);
        } else {
            uint16_t h = xent_f32_to_f16(z[j]);
            ((uint16_t *)dst)[j] = h;
            back[j] = xent_f16_to_f32(h);
        }
    }
}

static void random_opts(xt_rng_t *g, xent_sampler_opts *o, int64_t V) {
    xent_sampler_opts_init(o);
    static const double taus[] = {1.0, 0.7, 1.3, 0.05, 3.0};
    o->temperature = taus[xt_randint(g, 5)];
    if (xt_randint(g, 2)) o->top_k = 1 + xt_randint(g, V + 2);
    if (xt_randint(g, 3)) o->top_p = 0.05 + 0.95 * xt_uniform(g);
    if (xt_randint(g, 3) == 0) o->min_p = 0.3 * xt_uniform(g);
    o->threads = 1 + (int)xt_randint(g, 3);
}

TEST(sampler_random_vs_reference_all_dtypes) {
    xt_rng_t *g = xt_rng();
    const xent_dtype dts[3] = {XENT_F32, XENT_BF16, XENT_F16};
    double worst = 0;
    int64_t rows = 0;
    for (int di = 0; di < 3; di++) {
        for (int rep = 0; rep < 40; rep++) {
            int64_t V = 1 + xt_randint(g, rep % 4 == 0 ? 3000 : 200);
            int64_t T = 1 + xt_randint(g, 6);
            float scale = (float)(0.5 + 8 * xt_uniform(g));
            float *z = malloc(4 * (size_t)(T * V)), *zb = malloc(4 * (size_t)(T * V));
            void *raw = malloc(4 * (size_t)(T * V));
            int64_t *lab = malloc(8 * (size_t)T);
            for (int64_t j = 0; j < T * V; j++) {
                z[j] = (float)(scale * xt_normal(g));
                /* coarse values make ties common */
                if (rep % 3 == 0) z[j] = roundf(z[j]);
            }
            to_dtype(z, T * V, dts[di], raw, zb);
            for (int64_t i = 0; i < T; i++) lab[i] = xt_randint(g, 5) == 0 ? -100 : xt_randint(g, V);
            xent_sampler_opts op;
            random_opts(g, &op, V);
            outs o;
            outs_alloc(&o, T);
            xent_status st = run(raw, dts[di], T, V, lab, &op, &o);
            CHECK(st == XENT_OK, "%s", xent_last_error());
            int64_t cnt = 0, drop = 0;
            for (int64_t i = 0; i < T && st == XENT_OK; i++) {
                worst = fmax(worst, check_row(xent_dtype_name(dts[di]), i, zb + i * V, V, &op, lab[i], &o));
                if (lab[i] >= 0) {
                    cnt++;
                    drop += isinf(o.lp[i]) != 0;
                }
                rows++;
            }
            CHECK(o.n_counted == cnt && o.n_dropped == drop, "counts %lld %lld, expected %lld %lld",
                  (long long)o.n_counted, (long long)o.n_dropped, (long long)cnt, (long long)drop);
            outs_free(&o);
            free(z); free(zb); free(raw); free(lab);
            CHECK_LIMIT(10);
        }
    }
    printf("    %lld rows, worst error %.4f ulp\n", (long long)rows, worst);
}

/* A row whose top-p mass sits at / within rounding of / clearly off top_p. */
TEST(sampler_topp_boundary) {
    /* two columns: mass of the top one m1 = 1 / (1 + e^d) */
    float z[2] = {0.0f, -0.75f};
    long double m1 = 1.0L / (1.0L + expl(-0.75L));
    struct { long double rel; int64_t kept; int near; } cases[] = {
        {-1e-9L, 1, 0}, {1e-9L, 2, 0}, {-1e-14L, 1, 1}, {1e-14L, 2, 1}, {0, 1, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        xent_sampler_opts op;
        xent_sampler_opts_init(&op);
        op.top_p = (double)(m1 * (1.0L + cases[c].rel));
        int64_t lab = 1;
        outs o;
        outs_alloc(&o, 1);
        CHECK(run(z, XENT_F32, 1, 2, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
        int near = !!(o.flags[0] & XENT_SAMPLER_TOPP_NEAR);
        CHECK(near == cases[c].near, "case %zu: TOPP_NEAR %d, expected %d", c, near, cases[c].near);
        if (!cases[c].near) CHECK(o.kept[0] == cases[c].kept, "case %zu: kept %lld", c, (long long)o.kept[0]);
        else CHECK(o.kept[0] == 1 || o.kept[0] == 2, "case %zu: kept %lld", c, (long long)o.kept[0]);
        if (near) CHECK(o.flags[0] & XENT_SAMPLER_LABEL_AMBIGUOUS, "case %zu: label not marked ambiguous", c);
        CHECK(o.n_amb == near, "case %zu: n_ambiguous %lld", c, (long long)o.n_amb);
        if (o.kept[0] == 1) CHECK(isinf(o.lp[0]) && o.n_dropped == 1, "case %zu: label kept", c);
        else CHECK(ulp_err(o.lp[0], -0.75L - logl(1 + expl(-0.75L))) <= 1, "case %zu: lp %g", c, (double)o.lp[0]);
        outs_free(&o);
    }
    /* exact mass at p: equal logits, V = 1000, p = 0.3 (the double just
     * below 0.3): n = 300, the cut inside the tie group, near */
    int64_t V = 1000;
    float *zz = calloc((size_t)V, 4);
    xent_sampler_opts op;
    xent_sampler_opts_init(&op);
    op.top_p = 0.3;
    int64_t lab = 7;
    outs o;
    outs_alloc(&o, 1);
    CHECK(run(zz, XENT_F32, 1, V, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.kept[0] == 300, "all-equal p=0.3: kept %lld, expected 300", (long long)o.kept[0]);
    CHECK((o.flags[0] & (XENT_SAMPLER_TOPP_NEAR | XENT_SAMPLER_TOPP_TIE | XENT_SAMPLER_LABEL_AMBIGUOUS)) ==
              (XENT_SAMPLER_TOPP_NEAR | XENT_SAMPLER_TOPP_TIE | XENT_SAMPLER_LABEL_AMBIGUOUS),
          "all-equal p=0.3: flags %d", o.flags[0]);
    CHECK(ulp_err(o.lp[0], -logl(300)) <= 1 && ulp_err(o.H[0], logl(300)) <= 1 &&
              ulp_err(o.lkm[0], logl(0.3L)) <= 1,
          "all-equal p=0.3: lp %g H %g lkm %g", (double)o.lp[0], (double)o.H[0], (double)o.lkm[0]);
    /* p = 0.5 with 3 equal and one far below: exactly 1.5 columns -> 2 */
    outs_free(&o);
    free(zz);
    float z4[4] = {1, 1, 1, -1e30f};
    op.top_p = 0.5;
    outs_alloc(&o, 1);
    lab = 3;
    CHECK(run(z4, XENT_F32, 1, 4, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.kept[0] == 2 && (o.flags[0] & XENT_SAMPLER_TOPP_TIE) && !(o.flags[0] & XENT_SAMPLER_TOPP_NEAR),
          "3 equal p=0.5: kept %lld flags %d", (long long)o.kept[0], o.flags[0]);
    CHECK(isinf(o.lp[0]) && o.lp[0] < 0, "3 equal: label below the cut kept");
    outs_free(&o);
}

TEST(sampler_topk_ties_and_minp_boundary) {
    float z[5] = {3, 2, 2, 2, 1};
    xent_sampler_opts op;
    xent_sampler_opts_init(&op);
    op.top_k = 2;
    int64_t labs[2] = {2, 4};
    float zz[10];
    memcpy(zz, z, sizeof z);
    memcpy(zz + 5, z, sizeof z);
    outs o;
    outs_alloc(&o, 2);
    CHECK(run(zz, XENT_F32, 2, 5, labs, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.kept[0] == 4 && (o.flags[0] & XENT_SAMPLER_TOPK_TIE) && !(o.flags[0] & AMBIG),
          "top-k tie: kept %lld flags %d", (long long)o.kept[0], o.flags[0]);
    CHECK(!isinf(o.lp[0]) && isinf(o.lp[1]) && o.n_dropped == 1, "top-k tie: lp %g %g", (double)o.lp[0],
          (double)o.lp[1]);
    check_row("topk-tie", 0, zz, 5, &op, labs[0], &o);
    outs_free(&o);

    /* min-p: column 1 at d = ln(min_p) to within 1e-16 -> MINP_NEAR */
    float zm[2] = {0.0f, -1.3862944f};
    op.top_k = 0;
    op.min_p = exp((double)zm[1]);
    int64_t lab = 1;
    outs_alloc(&o, 1);
    CHECK(run(zm, XENT_F32, 1, 2, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK((o.flags[0] & XENT_SAMPLER_MINP_NEAR) && (o.flags[0] & XENT_SAMPLER_LABEL_AMBIGUOUS),
          "min-p at the threshold: flags %d", o.flags[0]);
    /* clearly off (1e-8 relative): decided, no flag; with boundary_tol flagged */
    op.min_p = exp((double)zm[1]) * (1 + 1e-8);
    CHECK(run(zm, XENT_F32, 1, 2, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.flags[0] == 0 && o.kept[0] == 1 && isinf(o.lp[0]), "min-p above: flags %d kept %lld", o.flags[0],
          (long long)o.kept[0]);
    op.min_p = exp((double)zm[1]) * (1 - 1e-8);
    CHECK(run(zm, XENT_F32, 1, 2, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.flags[0] == 0 && o.kept[0] == 2 && !isinf(o.lp[0]), "min-p below: flags %d kept %lld", o.flags[0],
          (long long)o.kept[0]);
    op.boundary_tol = 1e-6;
    CHECK(run(zm, XENT_F32, 1, 2, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.flags[0] & XENT_SAMPLER_MINP_NEAR, "boundary_tol 1e-6: min-p not flagged (%d)", o.flags[0]);
    outs_free(&o);
}

TEST(sampler_huge_tiny_v1_equal_ignored_nonfinite) {
    xt_rng_t *g = xt_rng();
    const double taus[] = {1.0, 1e-3, 1e30, 1e-30};
    float huge[6] = {3e38f, -3e38f, 3e38f, 1e38f, -3.4e38f, 2.9999998e38f};
    float tiny[6] = {1e-38f, -1e-45f, 0.0f, -0.0f, 1e-45f, 2e-38f};
    for (int ti = 0; ti < 4; ti++) {
        for (int rep = 0; rep < 20; rep++) {
            xent_sampler_opts op;
            random_opts(g, &op, 6);
            op.temperature = taus[ti];
            const float *z = rep % 2 ? huge : tiny;
            int64_t lab = xt_randint(g, 6);
            outs o;
            outs_alloc(&o, 1);
            CHECK(run(z, XENT_F32, 1, 6, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
            check_row(rep % 2 ? "huge" : "tiny", 0, z, 6, &op, lab, &o);
            outs_free(&o);
        }
    }
    /* V = 1 */
    float one = -5.0f;
    int64_t lab = 0;
    xent_sampler_opts op;
    xent_sampler_opts_init(&op);
    op.top_p = 0.1;
    op.top_k = 1;
    op.min_p = 0.5;
    outs o;
    outs_alloc(&o, 1);
    CHECK(run(&one, XENT_F32, 1, 1, &lab, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.lp[0] == 0 && o.H[0] == 0 && o.lkm[0] == 0 && o.kept[0] == 1 && o.lpf[0] == 0,
          "V=1: lp %g H %g lkm %g kept %lld", (double)o.lp[0], (double)o.H[0], (double)o.lkm[0],
          (long long)o.kept[0]);
    outs_free(&o);
    /* all equal, no truncation; an ignored row; a non-finite row */
    float rows[3 * 50];
    for (int j = 0; j < 150; j++) rows[j] = 2.5f;
    rows[100 + 17] = NAN;
    int64_t labs[3] = {4, -100, 3};
    xent_sampler_opts_init(&op);
    op.top_k = 10;
    outs_alloc(&o, 3);
    CHECK(run(rows, XENT_F32, 3, 50, labs, &op, &o) == XENT_OK, "%s", xent_last_error());
    CHECK(o.kept[0] == 50 && (o.flags[0] & XENT_SAMPLER_TOPK_TIE) && ulp_err(o.lp[0], -logl(50)) <= 1 &&
              o.lkm[0] == 0 && ulp_err(o.H[0], logl(50)) <= 1,
          "all equal: kept %lld lp %g", (long long)o.kept[0], (double)o.lp[0]);
    CHECK(o.lp[1] == 0 && o.lpf[1] == 0 && o.kept[1] == 50, "ignored row: lp %g", (double)o.lp[1]);
    CHECK(isnan(o.lp[2]) && isnan(o.H[2]) && o.kept[2] == 0, "non-finite row: lp %g", (double)o.lp[2]);
    CHECK(o.n_counted == 2 && o.n_nonfinite == 1 && o.n_dropped == 0, "counts %lld %lld %lld",
          (long long)o.n_counted, (long long)o.n_nonfinite, (long long)o.n_dropped);
    outs_free(&o);
}

TEST(sampler_threads_bitwise_and_labels_null) {
    xt_rng_t *g = xt_rng();
    int64_t T = 37, V = 500;
    float *z = malloc(4 * (size_t)(T * V));
    int64_t *lab = malloc(8 * (size_t)T);
    for (int64_t j = 0; j < T * V; j++) z[j] = (float)(3 * xt_normal(g));
    for (int64_t i = 0; i < T; i++) lab[i] = xt_randint(g, V);
    xent_sampler_opts op;
    xent_sampler_opts_init(&op);
    op.top_k = 50;
    op.top_p = 0.9;
    op.min_p = 0.01;
    op.temperature = 0.8;
    outs a, b;
    outs_alloc(&a, T);
    outs_alloc(&b, T);
    op.threads = 1;
    CHECK(run(z, XENT_F32, T, V, lab, &op, &a) == XENT_OK, "%s", xent_last_error());
    op.threads = 4;
    CHECK(run(z + V, XENT_F32, T - 1, V, lab + 1, &op, &b) == XENT_OK, "%s", xent_last_error());
    for (int64_t i = 1; i < T; i++)
        CHECK(!memcmp(&a.lp[i], &b.lp[i - 1], 4) && !memcmp(&a.H[i], &b.H[i - 1], 4) &&
                  !memcmp(&a.lkm[i], &b.lkm[i - 1], 4) && a.kept[i] == b.kept[i - 1],
              "row %lld differs across threads / position", (long long)i);
    /* the baseline copy of the row loop gives the same bits as the FMA one */
    if (xent_cpu_set_isa(XENT_ISA_BASELINE) == XENT_OK) {
        op.threads = 1;
        CHECK(run(z + V, XENT_F32, T - 1, V, lab + 1, &op, &b) == XENT_OK, "%s", xent_last_error());
        xent_cpu_set_isa(XENT_ISA_AUTO);
        for (int64_t i = 1; i < T; i++)
            CHECK(!memcmp(&a.lp[i], &b.lp[i - 1], 4) && !memcmp(&a.H[i], &b.H[i - 1], 4) &&
                      !memcmp(&a.lkm[i], &b.lkm[i - 1], 4) && !memcmp(&a.lpf[i], &b.lpf[i - 1], 4),
                  "row %lld differs between the baseline and the %s path", (long long)i,
                  xent_isa_name(xent_cpu_isa()));
    }
    /* identity: logprob = logprob_full - log_kept_mass (kept labels) */
    for (int64_t i = 0; i < T; i++)
        if (!isinf(a.lp[i]))
            CHECK(fabs((double)a.lp[i] - ((double)a.lpf[i] - (double)a.lkm[i])) <= 1e-5 * (1 + fabs(a.lpf[i])),
                  "row %lld: lp %g vs lpf - lkm %g", (long long)i, (double)a.lp[i],
                  (double)a.lpf[i] - (double)a.lkm[i]);
    /* no labels: every row ignored, entropy still written */
    xent_ce_input in = {z, XENT_F32, T, V, 0, NULL, XENT_I64, NULL};
    int64_t nc = -1;
    xent_sampler_output out = {b.lp, NULL, NULL, NULL, b.H, NULL, &nc, NULL, NULL, NULL};
    CHECK(xent_sampler_logprobs(&in, &op, &out) == XENT_OK, "%s", xent_last_error());
    CHECK(nc == 0 && b.lp[3] == 0 && !memcmp(&b.H[3], &a.H[3], 4), "labels NULL: n_counted %lld",
          (long long)nc);
    outs_free(&a);
    outs_free(&b);
    free(z);
    free(lab);
}

TEST(sampler_errors) {
    float z[4] = {0, 1, 2, 3};
    int64_t lab = 1;
    xent_sampler_opts op;
    outs o;
    outs_alloc(&o, 1);
    struct { const char *field; double v; const char *msg; } bad[] = {
        {"top_p", 1.5, "top_p = 1.5 is outside (0, 1]"}, {"top_p", 0.0, "top_p = 0 is outside (0, 1]"},
        {"min_p", 1.0, "min_p = 1 is outside [0, 1)"},   {"temperature", 0.0, "temperature = 0 must be"},
        {"temperature", NAN, "temperature = nan"},       {"top_k", -1, "top_k = -1 must be >= 0"},
        {"boundary_tol", -1, "boundary_tol = -1 is outside"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        xent_sampler_opts_init(&op);
        if (!strcmp(bad[c].field, "top_p")) op.top_p = bad[c].v;
        if (!strcmp(bad[c].field, "min_p")) op.min_p = bad[c].v;
        if (!strcmp(bad[c].field, "temperature")) op.temperature = bad[c].v;
        if (!strcmp(bad[c].field, "top_k")) op.top_k = (int64_t)bad[c].v;
        if (!strcmp(bad[c].field, "boundary_tol")) op.boundary_tol = bad[c].v;
        o.lp[0] = 123.0f;
        xent_status st = run(z, XENT_F32, 1, 4, &lab, &op, &o);
        CHECK(st == XENT_ERR_VALUE && strstr(xent_last_error(), bad[c].msg) && o.lp[0] == 123.0f,
              "%s: status %d, message '%s'", bad[c].field, (int)st, xent_last_error());
    }
    lab = 4;
    CHECK(run(z, XENT_F32, 1, 4, &lab, NULL, &o) == XENT_ERR_LABEL && strstr(xent_last_error(), "labels[0] = 4"),
          "label 4 of V 4: '%s'", xent_last_error());
    CHECK(run(z, XENT_F64, 1, 4, &lab, NULL, &o) == XENT_ERR_DTYPE, "f64 logits accepted");
    CHECK(xent_sampler_logprobs(NULL, NULL, NULL) == XENT_ERR_NULL, "NULL input accepted");
    xent_ce_input in = {z, XENT_F32, 1, 4, 0, NULL, XENT_I64, NULL};
    xent_sampler_output out;
    memset(&out, 0, sizeof out);
    if (xent_cuda_device_count() == 0)
        CHECK(xent_cuda_sampler_logprobs(&in, NULL, &out, NULL) != XENT_OK, "CUDA entry point without a GPU");
    outs_free(&o);
}
