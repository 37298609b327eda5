/* tests/test_audit.c: `xent audit`: metrics against hand-computed values,
 * the variant parser, the reports, and whole audits of a tiny random model
 * built here (no download). */
#include "audit/audit.h"
#include "harness.h"
#include "io/io_internal.h"
#include "model/model.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Metrics of a handful of exact inputs are a few double roundings away from
 * the real numbers: each result passes through at most ~10 operations of
 * relative error 2^-53, so 10 * 2^-53 < 1.2e-15 bounds it; 4e-15 leaves
 * room for the sqrt and division chains of corr. */
#define HAND_TOL 4e-15

static int close_rel(double got, double want, double tol) {
    return fabs(got - want) <= tol * fabs(want);
}

TEST(audit_metrics_hand_computed) {
    const float ref[4] = {1, 2, 3, 4}, test[4] = {1.5f, 2, 2.5f, 5};
    xent_audit_metrics m;
    xt_poison(&m, sizeof m);
    xent__audit_metrics(test, ref, 4, &m);
    /* d = [0.5, 0, -0.5, 1]; means 2.75, 2.5; var_t = 1.8125, var_r = 1.25,
     * cov = 1.375 (population moments) */
    CHECK(m.n == 4 && m.n_nonfinite == 0, "n %lld nonfinite %lld",
          (long long)m.n, (long long)m.n_nonfinite);
    CHECK(close_rel(m.rms_abs, sqrt(0.375), HAND_TOL), "rms_abs %.17g", m.rms_abs);
    CHECK(close_rel(m.ref_scale, sqrt(7.5), HAND_TOL), "ref_scale %.17g", m.ref_scale);
    CHECK(close_rel(m.rms_rel, sqrt(0.375) / sqrt(7.5 + 1e-8), HAND_TOL),
          "rms_rel %.17g", m.rms_rel);
    CHECK(m.max_abs == 1.0, "max_abs %.17g", m.max_abs);
    CHECK(m.bias == 0.25, "bias %.17g", m.bias);
    CHECK(close_rel(m.slope, 1.1, HAND_TOL), "slope %.17g", m.slope);
    CHECK(close_rel(m.corr, 1.375 / sqrt(1.8125 * 1.25), HAND_TOL), "corr %.17g",
          m.corr);
    CHECK(close_rel(m.residual, sqrt(0.3), 1e-14), /* 1.8125 - 1.5125 loses
                                                      ~3 bits */
          "residual %.17g", m.residual);
}

TEST(audit_metrics_identical_is_exactly_zero) {
    int64_t n = xt_sanitizer() ? 10007 : 100003;
    float *a = malloc(sizeof(float) * (size_t)n); /* [n] */
    for (int64_t i = 0; i < n; i++) a[i] = (float)(xt_normal(xt_rng()) * 3 + 7);
    xent_audit_metrics m;
    xt_poison(&m, sizeof m);
    xent__audit_metrics_mt(a, a, n, 2, &m);
    CHECK(m.rms_abs == 0 && m.max_abs == 0 && m.bias == 0 && m.rms_rel == 0 &&
              m.residual == 0 && m.corr == 1 && m.slope == 1,
          "rms %g max %g bias %g rel %g res %g corr %.17g slope %.17g", m.rms_abs,
          m.max_abs, m.bias, m.rms_rel, m.residual, m.corr, m.slope);
    CHECK(m.ref_scale > 7, "ref_scale %g", m.ref_scale);
    free(a);
}

/* Straight long-double moments, for comparison. */
static void metrics_ld(const float *t, const float *r, int64_t n, long double o[6]) {
    long double st = 0, sr = 0;
    for (int64_t i = 0; i < n; i++) { st += t[i]; sr += r[i]; }
    long double mt = st / n, mr = sr / n, dd = 0, rr = 0, vt = 0, vr = 0, cv = 0;
    for (int64_t i = 0; i < n; i++) {
        long double d = (long double)t[i] - r[i], a = t[i] - mt, b = r[i] - mr;
        dd += d * d; rr += (long double)r[i] * r[i];
        vt += a * a; vr += b * b; cv += a * b;
    }
    o[0] = sqrtl(dd / n);
    o[1] = sqrtl(rr / n);
    o[2] = cv / sqrtl(vt * vr);
    o[3] = cv / vr;
    o[4] = sqrtl(vt / n - (cv / n) * (cv / n) / (vr / n));
    o[5] = (st - sr) / n;
}

TEST(audit_metrics_random_vs_long_double_and_threads) {
    int64_t n = xt_sanitizer() ? 20011 : 200003; /* not a block multiple */
    float *r = malloc(sizeof(float) * (size_t)n), *t = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        r[i] = (float)(1000.0 + xt_normal(xt_rng())); /* mean >> spread */
        t[i] = r[i] + (float)(1e-3 * xt_normal(xt_rng()));
    }
    xent_audit_metrics m1, m4;
    xent__audit_metrics_mt(t, r, n, 1, &m1);
    xent__audit_metrics_mt(t, r, n, 4, &m4);
    CHECK(!memcmp(&m1, &m4, sizeof m1), "1 and 4 threads differ");
    long double o[6];
    metrics_ld(t, r, n, o);
    /* Sums of non-negative terms: (4096 in a block + n/4096 blocks) * 2^-53
     * < 5e-13 relative; cov of strongly correlated data (corr ~ 1) is one too.
     * residual = sqrt(var_t - cov^2/var_r) cancels: var_t/res^2 ~ 1e6, so its
     * bound is 1e6 * 5e-13 / 2 relative. bias is exact to 5e-13 * mean|d|. */
    CHECK(close_rel(m1.rms_abs, (double)o[0], 1e-12), "rms %.17g %.17Lg", m1.rms_abs, o[0]);
    CHECK(close_rel(m1.ref_scale, (double)o[1], 1e-12), "scale %.17g", m1.ref_scale);
    CHECK(close_rel(m1.corr, (double)o[2], 1e-12), "corr %.17g %.17Lg", m1.corr, o[2]);
    CHECK(close_rel(m1.slope, (double)o[3], 1e-12), "slope %.17g", m1.slope);
    CHECK(close_rel(m1.residual, (double)o[4], 3e-7), "res %.17g %.17Lg", m1.residual, o[4]);
    CHECK(fabs(m1.bias - (double)o[5]) <= 5e-13 * 1e-3, "bias %.17g %.17Lg", m1.bias, o[5]);
    free(r);
    free(t);
}

TEST(audit_metrics_nonfinite_and_degenerate) {
    float r[5] = {1, 2, 3, 4, 5}, t[5] = {1, 2, NAN, 4, 5};
    xent_audit_metrics m;
    xent__audit_metrics(t, r, 5, &m);
    CHECK(m.n_nonfinite == 1 && isnan(m.rms_abs) && isnan(m.rms_rel) &&
              isnan(m.corr) && isnan(m.max_abs),
          "NaN must not pass: nonfinite %lld rms %g", (long long)m.n_nonfinite,
          m.rms_abs);
    t[2] = INFINITY;
    xent__audit_metrics(t, r, 5, &m);
    CHECK(m.n_nonfinite == 1 && isnan(m.rms_rel), "inf: rel %g", m.rms_rel);
    float c[3] = {2, 2, 2}, u[3] = {2, 3, 2};
    xent__audit_metrics(u, c, 3, &m); /* constant reference */
    CHECK(isnan(m.corr) && isnan(m.slope) && m.residual > 0 && m.max_abs == 1,
          "corr %g slope %g res %g", m.corr, m.slope, m.residual);
    xent__audit_metrics(u, c, 0, &m);
    CHECK(m.n == 0 && isnan(m.rms_abs), "empty: %g", m.rms_abs);
}

TEST(audit_median_dead_zone_decimals) {
    double x[5] = {5, 1, NAN, 3, 2};
    CHECK(xent__audit_median(x, 5) == 2.5, "median %g", xent__audit_median(x, 5));
    CHECK(xent__audit_median(x, 3) == 3, "median3 %g", xent__audit_median(x, 3));
    CHECK(isnan(xent__audit_median(x + 2, 1)), "all NaN");
    float ref[4] = {-1e-3f, 0, -2, -5e-8f}, var[4] = {0, 0, -2, 0};
    CHECK(xent__audit_dead_count(var, ref, 4) == 2, "dead %lld",
          (long long)xent__audit_dead_count(var, ref, 4));
    CHECK(xent__audit_decimals_for(1.05) == 1 && xent__audit_decimals_for(0.27) == 2 &&
              xent__audit_decimals_for(0.0123) == 3 && xent__audit_decimals_for(123) == 0 &&
              xent__audit_decimals_for(0) == 0 && xent__audit_decimals_for(9.99) == 1,
          "decimals");
    /* every cell keeps two significant figures */
    xa_table t;
    const char *h[] = {"v", "x"};
    xa_table_init(&t, "t", 2, h, 4);
    double vals[4] = {1.05, 0.00014, 0, 37.0};
    xa_table_column(&t, 1, vals, XA_SIG2);
    for (int i = 0; i < 4; i++) {
        const char *s = t.cell[i][1];
        int sig = 0, started = 0;
        for (; *s; s++)
            if (*s >= '1' && *s <= '9') started = 1, sig++;
            else if (*s == '0' && started) sig++;
        CHECK(vals[i] == 0 ? !strcmp(t.cell[i][1], "0") : sig >= 2,
              "cell '%s' of %g", t.cell[i][1], vals[i]);
    }
    double c[2] = {0.99998, 1.0};
    xa_table_init(&t, "t", 2, h, 2);
    xa_table_column(&t, 1, c, XA_DEV1);
    CHECK(!strcmp(t.cell[0][1], "0.999980"), "corr cell '%s'", t.cell[0][1]);
}

/* ------------------------------------------------------------------------ */
/* Variants                                                                  */
/* ------------------------------------------------------------------------ */

TEST(audit_variants_defaults_and_parse) {
    xent_audit_variants d;
    xent__audit_default_variants(&d);
    CHECK(d.n == 5, "defaults %d", d.n);
    int ref = -1;
    CHECK(xent__audit_find_reference(&d, &ref) == XENT_OK && ref == 0, "ref %d", ref);
    CHECK(d.v[2].p.compute == XENT_BF16 && d.v[2].p.lm_head == XENT_F32 &&
              d.v[2].p.logits == XENT_F32 && d.v[1].p.lm_head == XENT_BF16,
          "bf16_fp32head");
    CHECK(d.v[3].p.loss_scale == 0 && d.v[1].p.loss_scale == 1, "fp16 auto scale");
    xent_audit_variant v;
    CHECK(xent__audit_variant_parse("x:compute=bf16,ce=bf16_lse,micro_batches=4,"
                                    "grad_accum=bf16,loss_scale=auto", &v) == XENT_OK,
          "%s", xent_last_error());
    CHECK(!strcmp(v.name, "x") && v.p.compute == XENT_BF16 &&
              v.p.residual == XENT_F32 && v.p.ce == XENT_CE_BF16_LSE &&
              v.p.micro_batches == 4 && v.p.grad_accum == XENT_BF16 &&
              v.p.loss_scale == 0,
          "parsed fields");
    CHECK(xent__audit_variant_parse("y all=fp16 lm_head=fp32 loss_scale=1024", &v) == XENT_OK &&
              v.p.norm == XENT_F16 && v.p.lm_head == XENT_F32 &&
              v.p.loss_scale == 1024,
          "file form: %s", xent_last_error());
    CHECK(xent__audit_variant_parse("fp16_fp32head", &v) == XENT_OK &&
              v.p.compute == XENT_F16 && v.p.logits == XENT_F32, "bare default");
    char buf[400];
    xent__audit_policy_str(&d.v[3].p, buf, sizeof buf);
    CHECK(strstr(buf, "compute=fp16") && strstr(buf, "loss_scale=auto") &&
              strstr(buf, "ce=exact"), "policy '%s'", buf);
}

static void expect_fail(const char *spec, const char *needle1, const char *needle2) {
    xent_audit_variant v;
    xent_status st = xent__audit_variant_parse(spec, &v);
    const char *e = xent_last_error();
    CHECK(st == XENT_ERR_VALUE && strstr(e, needle1) && strstr(e, needle2),
          "'%s': status %d, message '%s'", spec, st, e);
}

TEST(audit_variants_bad_input) {
    expect_fail("a:computee=bf16", "unknown key 'computee'", "attn_softmax");
    expect_fail("a:compute=int8", "compute=int8", "fp32, bf16, fp16");
    expect_fail("a:ce=softmax", "ce=softmax", "bf16_logsoftmax");
    expect_fail("a:micro_batches=0", "micro_batches=0", "[1,");
    expect_fail("a:loss_scale=-1", "loss_scale=-1", "auto");
    expect_fail("a:compute", "not key=value", "compute");
    expect_fail("mystery", "not a default", "fp16_fp32head");
    expect_fail(":compute=bf16", "empty name", "NAME");
    expect_fail("a/b:compute=bf16", "character '/'", "letters");
    xent_audit_variants l = {.n = 0};
    xent_audit_variant v;
    xent__audit_variant_parse("bf16", &v);
    xent__audit_variants_add(&l, &v);
    CHECK(xent__audit_variants_add(&l, &v) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "twice"), "duplicate: %s", xent_last_error());
    int ref;
    CHECK(xent__audit_find_reference(&l, &ref) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "no fp32 reference"),
          "no reference: %s", xent_last_error());
    xent__audit_variant_parse("r:micro_batches=2", &v); /* not a reference */
    CHECK(!xent__audit_is_reference(&v.p), "micro_batches=2 is not the reference");
}

TEST(audit_variants_file) {
    char path[] = "/tmp/xent_audit_variantsXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    fputs("# reference first\n\nfp32\n  bf16x compute=bf16 residual=bf16\n"
          "h16 all=fp16 lm_head=fp32 logits=fp32   # trailing comment? no\n", f);
    fclose(f);
    xent_audit_variants l = {.n = 0};
    xent_status st = xent__audit_variants_file(path, &l);
    /* the '#' after the overrides is not a comment: a bad override */
    CHECK(st == XENT_ERR_VALUE && strstr(xent_last_error(), ":5:"),
          "status %d: %s", st, xent_last_error());
    f = fopen(path, "w");
    fputs("# reference first\n\nfp32\n  bf16x compute=bf16 residual=bf16\n"
          "h16 all=fp16 lm_head=fp32 logits=fp32\n", f);
    fclose(f);
    l.n = 0;
    st = xent__audit_variants_file(path, &l);
    CHECK(st == XENT_OK && l.n == 3 && l.v[1].p.compute == XENT_BF16 &&
              l.v[1].p.residual == XENT_BF16 && l.v[1].p.norm == XENT_F32 &&
              l.v[2].p.attn_softmax == XENT_F16 && l.v[2].p.lm_head == XENT_F32,
          "status %d n %d: %s", st, l.n, xent_last_error());
    unlink(path);
    CHECK(xent__audit_variants_file(path, &l) == XENT_ERR_IO, "missing file");
}

TEST(audit_loss_scale_pick) {
    CHECK(xent__audit_pick_loss_scale(1.0) == 4096.0, "%g", xent__audit_pick_loss_scale(1.0));
    CHECK(xent__audit_pick_loss_scale(0) == 1 && xent__audit_pick_loss_scale(NAN) == 1 &&
              xent__audit_pick_loss_scale(INFINITY) == 1, "degenerate");
    for (int k = 0; k < 50; k++) {
        double g = exp(xt_uniform(xt_rng()) * 30 - 20);
        double s = xent__audit_pick_loss_scale(g);
        int e;
        double fr = frexp(s, &e);
        CHECK(fr == 0.5, "not a power of two: %g", s);
        CHECK((s * g <= 65504.0 / 8 && 2 * s * g > 65504.0 / 8) || s == 0x1p24,
              "g %g scale %g", g, s);
    }
}

/* ------------------------------------------------------------------------ */
/* Whole audits on a tiny random model                                       */
/* ------------------------------------------------------------------------ */

static xent_model *tiny_model(int tied, int layers) {
    xent_model_config c;
    xent_model_config_init(&c);
    snprintf(c.arch, sizeof c.arch, "llama");
    c.n_layers = layers;
    c.dim = 32;
    c.hidden = 64;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.vocab = 97;
    c.max_seq = 64;
    c.tied_head = tied;
    xent_model *m = NULL;
    if (xent_model_new(&c, &m) != XENT_OK) return NULL;
    for (int i = 0; i < m->n_params; i++) {
        xent_param *p = &m->params[i];
        int norm = strstr(p->name, "norm") != NULL;
        double sd = p->ndim == 2 ? 1.0 / sqrt((double)p->shape[1]) : 0.1;
        if (strstr(p->name, "embed_tokens")) sd = 1.0;
        for (int64_t k = 0; k < p->numel; k++)
            p->w[k] = (float)((norm ? 1.0 : 0.0) + sd * xt_normal(xt_rng()));
    }
    return m;
}

/* A byte-level BPE tokenizer of n tokens: "w<i>", except 3 = " <b>&",
 * 4 = "\n", 5 = the lone byte 0xE2 (not UTF-8 by itself). */
static xent_tokenizer *tiny_tok(int n) {
    char *j = malloc((size_t)n * 32 + 256);
    size_t k = (size_t)sprintf(j, "{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {");
    for (int i = 0; i < n; i++) {
        const char *sep = i ? ", " : "";
        if (i == 3) k += (size_t)sprintf(j + k, "%s\"\\u0120<b>&\": %d", sep, i);
        else if (i == 4) k += (size_t)sprintf(j + k, "%s\"\\u010a\": %d", sep, i);
        else if (i == 5) k += (size_t)sprintf(j + k, "%s\"\\u00e2\": %d", sep, i);
        else k += (size_t)sprintf(j + k, "%s\"w%d\": %d", sep, i, i);
    }
    k += (size_t)sprintf(j + k, "}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}");
    xent_tokenizer *t = NULL;
    if (xent_tokenizer_from_json(j, k, "tiny tokenizer.json", &t)) t = NULL;
    free(j);
    return t;
}

static const xent_audit_metrics *metric(const xent_audit_result *r, int v, int e) {
    return &r->m[(size_t)v * (size_t)r->n_entries + (size_t)e];
}

static int entry_index(const xent_audit_result *r, xent_audit_role role) {
    for (int e = 0; e < r->n_entries; e++)
        if (r->entries[e].role == role) return e;
    return -1;
}

static void add(xent_audit_variants *l, const char *spec) {
    xent_audit_variant v;
    CHECK(xent__audit_variant_parse(spec, &v) == XENT_OK, "%s: %s", spec,
          xent_last_error());
    xent__audit_variants_add(l, &v);
}

/* A second, independent fp32 run shows exactly 0 in every tensor; bf16 and
 * fp16 show errors of their own size; every tensor is recorded. */
TEST(audit_tiny_model_fp32_exact_and_orders) {
    xent_model *m = tiny_model(0, 3);
    CHECK(m != NULL, "model: %s", xent_last_error());
    if (!m) return;
    int64_t B = 2, S = xt_sanitizer() ? 12 : 24;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * S)); /* [B*S] */
    CHECK(xent__audit_random_tokens(xt_seed(), m->cfg.vocab, B * S, tok) == XENT_OK, "tok");
    xent_audit_variants l = {.n = 0};
    add(&l, "fp32");
    add(&l, "fp32again:compute=fp32"); /* the reference policy, run again */
    add(&l, "bf16");
    add(&l, "fp16");
    add(&l, "bf16acc:grad_accum=bf16,micro_batches=2");
    xent_audit_opts o;
    xent__audit_opts_init(&o);
    o.progress = 0;
    o.threads = 2;
    xent_audit_result r;
    xent_status st = xent__audit_run(m, tok, B, S, &l, &o, &r);
    CHECK(st == XENT_OK, "run: %s", xent_last_error());
    if (st) { free(tok); xent_model_free(m); return; }
    CHECK(r.n_tokens == B * S && r.n_targets == B * (S - 1) && r.batch == B &&
              r.seq_len == S && r.ref == 0, "counts %lld %lld",
          (long long)r.n_tokens, (long long)r.n_targets);
    CHECK(!memcmp(r.tokens, tok, sizeof(int32_t) * (size_t)(B * S)), "tokens kept");
    for (int e = 0; e < r.n_entries; e++) {
        const xent_audit_metrics *a = metric(&r, 1, e);
        CHECK(a->n > 0 && a->n_nonfinite == 0, "%s not recorded (n %lld)",
              r.entries[e].name, (long long)a->n);
        CHECK(a->rms_abs == 0 && a->max_abs == 0 && a->bias == 0 &&
                  a->residual == 0 && a->corr == 1 && a->slope == 1,
              "fp32 again, %s: rms %g max %g", r.entries[e].name, a->rms_abs,
              a->max_abs);
        CHECK_LIMIT(10);
    }
    CHECK(r.dead_any[1] == 0 && r.dead_any[0] == 0, "fp32 dead zone");
    int lp = entry_index(&r, XA_LOGPROB), lg = entry_index(&r, XA_LOGITS);
    CHECK(lp >= 0 && lg >= 0, "entries");
    double eb = metric(&r, 2, lp)->rms_rel, eh = metric(&r, 3, lp)->rms_rel;
    double gb = metric(&r, 2, lg)->rms_rel, gh = metric(&r, 3, lg)->rms_rel;
    /* bf16 keeps 8 significant bits (unit roundoff 2^-9 = 0.2%), fp16 11
     * (2^-12): the logits of a bf16 run cannot be closer than a fraction of
     * one rounding, nor further than many: (2^-9/8, 30 * 2^-9); fp16 is
     * 2^3 = 8x finer, and the ratio of the two lies within a factor 4 of
     * that (accumulation, not rounding, can dominate in some tensors). */
    CHECK(gb > 0x1p-12 && gb < 30 * 0x1p-9, "bf16 logits rel %g", gb);
    CHECK(gb / gh > 2 && gb / gh < 32, "bf16/fp16 logits %g / %g", gb, gh);
    CHECK(eb > 0 && eh > 0 && eb / eh > 2, "logprob bf16 %g fp16 %g", eb, eh);
    CHECK(metric(&r, 2, lp)->corr > 0.99, "corr %g", metric(&r, 2, lp)->corr);
    CHECK(r.loss_scale[3] > 1 && frexp(r.loss_scale[3], &(int){0}) == 0.5 &&
              r.loss_scale[2] == 1, "loss scales %g %g", r.loss_scale[3],
          r.loss_scale[2]);
    /* bf16 gradient accumulation over two micro-batches: the activations
     * are the reference's fp32 arithmetic, but from matrix products of half
     * the rows, which OpenBLAS may sum in another order (its AVX-512
     * kernels do; its AVX2 ones gave the same bits): equal up to fp32
     * reassociation carried through the layers (below 2^-16 relative, 256
     * ulps), while the parameter gradients carry bf16's rounding of each
     * micro-batch's sum (2^-9 relative a rounding) */
    int gl = entry_index(&r, XA_G_LINEAR);
    CHECK(metric(&r, 4, lg)->rms_rel < 0x1p-16 && metric(&r, 4, gl)->rms_rel > 0x1p-12,
          "bf16 accumulation: logits rel %g grad rel %g", metric(&r, 4, lg)->rms_rel,
          metric(&r, 4, gl)->rms_rel);
    xent__audit_result_free(&r);
    free(tok);
    xent_model_free(m);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}

static void check_json(const char *path, const xent_audit_result *r) {
    size_t len = 0;
    char *s = slurp(path, &len);
    CHECK(s != NULL, "json not written");
    if (!s) return;
    xent_json j;
    xent_status st = xent_json_parse(s, len, path, &j);
    CHECK(st == XENT_OK, "json: %s", xent_last_error());
    if (st == XENT_OK) {
        const xent_json_node *tk = xent_json_get(&j, &j.nodes[0], "tokens");
        CHECK(tk && tk->type == XENT_JSON_ARR && tk->count == r->batch, "tokens rows");
        const xent_json_node *row0 = tk ? &j.nodes[tk->first] : NULL;
        CHECK(row0 && row0->count == r->seq_len, "tokens row length");
        int64_t id = -1;
        if (row0) xent_json_uint(&j.nodes[row0->first], &id);
        CHECK(id == r->tokens[0], "first token %lld vs %d", (long long)id, r->tokens[0]);
        const xent_json_node *vs = xent_json_get(&j, &j.nodes[0], "variants");
        CHECK(vs && vs->count == r->variants.n, "variants");
        const xent_json_node *tt = xent_json_get(&j, &j.nodes[0], "token_text");
        CHECK(!r->token_text == !tt, "token_text present iff the model has a tokenizer");
        if (tt && r->token_text) {
            const xent_json_node *t0 = tt->count == r->batch ? &j.nodes[tt->first] : NULL;
            CHECK(t0 && t0->count == r->seq_len, "token_text rows");
        }
        xent_json_free(&j);
    }
    free(s);
}

static int count_in(const char *s, const char *end, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) && (!end || p < end); p++) n++;
    return n;
}

/* Rows of the table with class `cls` (the header row not counted). */
static int table_rows(const char *s, const char *cls) {
    char open[64];
    snprintf(open, sizeof open, "<table class=%s>", cls);
    const char *t = strstr(s, open);
    const char *e = t ? strstr(t, "</table>") : NULL;
    return t && e ? count_in(t, e, "<tr><td>") : -1;
}

/* The page a person reads: the verdict first (a sentence per variant), the
 * definitions, two depth plots, one histogram per variant, the worst
 * tensors and tokens, no scatter, no script, no link, no NaN. */
static void check_html(const char *path, const xent_audit_result *r) {
    size_t len = 0;
    char *s = slurp(path, &len);
    CHECK(s != NULL, "html not written");
    if (!s) return;
    int nv = r->variants.n - 1;
    CHECK(count_in(s, NULL, "<svg class='depth'") == 2, "%d depth plots",
          count_in(s, NULL, "<svg class='depth'"));
    CHECK(count_in(s, NULL, "<svg class='hist'") == nv, "%d histograms for %d variants",
          count_in(s, NULL, "<svg class='hist'"), nv);
    CHECK(count_in(s, NULL, "<svg ") == 2 + nv + nv, "%d svg elements",
          count_in(s, NULL, "<svg "));
    CHECK(!strstr(s, "nan") && !strstr(s, "inf'") && !strstr(s, "http:") &&
              !strstr(s, "<script") && !strstr(s, "src="), "NaN, a script or a link");
    CHECK(strstr(s, "</html>") != NULL, "page not closed");
    const char *vd = strstr(s, "<h3 id=verdict>Verdict</h3>");
    const char *df = strstr(s, "<h3>Definitions</h3>");
    const char *pl = strstr(s, "<svg class='depth'");
    CHECK(vd && df && pl && vd < df && df < pl, "verdict, definitions, then plots");
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        char a[128], b[128];
        snprintf(a, sizeof a, "<b>%s</b> is within the <b>", r->variants.v[v].name);
        snprintf(b, sizeof b, "<b>%s</b> is <b>over every budget</b>", r->variants.v[v].name);
        xent_audit_verdict vv;
        xent__audit_verdict(r, v, &vv);
        CHECK(strstr(s, vv.budget < XENT_AUDIT_N_BUDGETS ? a : b) != NULL,
              "verdict sentence of %s", r->variants.v[v].name);
        if (vv.budget < XENT_AUDIT_N_BUDGETS) {
            snprintf(a, sizeof a, "<b>%s</b> budget (%s)",
                     xent__audit_budgets[vv.budget].name, xent__audit_budgets[vv.budget].use);
            CHECK(strstr(s, a) != NULL, "budget named: %s", a);
        }
        if (vv.fw_entry >= 0) {
            snprintf(a, sizeof a, "<code>%s</code> (", r->entries[vv.fw_entry].name);
            CHECK(strstr(s, a) != NULL && strstr(s, a) < df, "where the error enters: %s", a);
        }
    }
    for (int b = 0; b < XENT_AUDIT_N_BUDGETS; b++) {
        char a[96];
        snprintf(a, sizeof a, "<td class='b%d'>%s</td>", b, xent__audit_budgets[b].name);
        CHECK(strstr(s, a) && strstr(s, a) < df, "budget %s stated first", a);
    }
    CHECK(count_in(s, NULL, "<dt>") >= 8, "definitions");
    CHECK(table_rows(s, "worst-tensors") == nv * 5, "worst tensors: %d rows",
          table_rows(s, "worst-tensors"));
    int want = 0; /* per variant: the 6 largest non-zero deltas, or fewer */
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        int k = 0;
        for (int64_t i = 0; i < r->n_targets; i++)
            k += r->logprob[(size_t)v * (size_t)r->n_targets + (size_t)i] !=
                 r->logprob[(size_t)r->ref * (size_t)r->n_targets + (size_t)i];
        want += k < 6 ? k : 6;
    }
    CHECK(table_rows(s, "worst-tokens") == want, "worst tokens: %d rows, want %d",
          table_rows(s, "worst-tokens"), want);
    free(s);
}

TEST(audit_tiny_model_reports) {
    xent_model *m = tiny_model(1, 4);
    CHECK(m != NULL, "model: %s", xent_last_error());
    if (!m) return;
    m->tok = tiny_tok((int)m->cfg.vocab);
    CHECK(m->tok != NULL, "tokenizer: %s", xent_last_error());
    int64_t B = 1, S = 16;
    int32_t tok[16];
    xent__audit_random_tokens(7, m->cfg.vocab, 16, tok);
    xent_audit_variants l;
    xent__audit_default_variants(&l);
    xent_audit_opts o;
    xent__audit_opts_init(&o);
    o.progress = 0;
    xent_audit_result r;
    xent_status st = xent__audit_run(m, tok, B, S, &l, &o, &r);
    CHECK(st == XENT_OK, "run: %s", xent_last_error());
    if (st) { xent_model_free(m); return; }
    char jpath[] = "/tmp/xent_audit_jsonXXXXXX", hpath[] = "/tmp/xent_audit_htmlXXXXXX";
    int fj = mkstemp(jpath), fh = mkstemp(hpath);
    CHECK(fj >= 0 && fh >= 0, "mkstemp");
    close(fj);
    close(fh);
    CHECK(r.token_text != NULL, "the token texts");
    for (int i = 0; i < 16; i++) {
        char want[16];
        const char *t = xent__audit_token_text(&r, i);
        int id = r.tokens[i];
        snprintf(want, sizeof want, "w%d", id);
        CHECK(t && !strcmp(t, id == 3 ? " <b>&" : id == 4 ? "\n" : id == 5 ? "\xE2" : want),
              "token %d (id %d): '%s'", i, id, t ? t : "(none)");
    }
    CHECK(xent__audit_write_json(&r, jpath) == XENT_OK, "%s", xent_last_error());
    check_json(jpath, &r);
    CHECK(xent__audit_write_html(&r, hpath) == XENT_OK, "%s", xent_last_error());
    check_html(hpath, &r);
    {
        /* the worst token of bf16 is in its table with its text */
        size_t hl;
        char *h = slurp(hpath, &hl);
        int64_t worst = 0;
        double dmax = -1;
        for (int64_t i = 0; i < r.n_targets; i++) {
            double d = fabs((double)r.logprob[r.n_targets + i] - r.logprob[i]);
            if (d > dmax) { dmax = d; worst = i; }
        }
        int id = r.tokens[worst + 1];
        char cell[96];
        snprintf(cell, sizeof cell, "<td><code class=tok>%s</code></td><td class=n>%d</td>",
                 id == 3 ? " &lt;b&gt;&amp;" : id == 4 ? "\\n" : id == 5 ? "\\xE2" : "", id);
        if (id < 3 || id > 5) snprintf(cell, sizeof cell, "<td><code class=tok>w%d</code></td>"
                             "<td class=n>%d</td>", id, id);
        const char *t = h ? strstr(h, "<table class=worst-tokens>") : NULL;
        CHECK(t && strstr(t, cell), "worst token row: %s", cell);
        free(h);
    }
    xent_audit_summary s;
    xent__audit_summarize(&r, 0, &s);
    for (int k = 0; k < 5; k++) CHECK(s.fw[k] == 0 && s.bw[k] == 0, "ref row %d", k);
    CHECK(s.lp[0] == 0 && s.lp[3] == 1 && s.lp[6] > 0, "ref lp row");
    CHECK(isnan(s.grad[0]), "tied model has no LM head gradient of its own");
    xent__audit_summarize(&r, 1, &s);
    CHECK(s.fw[0] > 0 && s.fw[1] > 0 && s.bw[1] > 0 && s.grad[7] > 0 && s.lp[0] > 0,
          "bf16 row");
    FILE *f = tmpfile();
    xent__audit_print_tables(&r, f);
    long n = ftell(f);
    CHECK(n > 500, "console tables %ld bytes", n);
    fclose(f);
    unlink(jpath);
    unlink(hpath);
    xent__audit_result_free(&r);
    xent_model_free(m);
}

TEST(audit_refuses_bad_runs) {
    xent_model *m = tiny_model(1, 2);
    if (!m) { CHECK(0, "model"); return; }
    int32_t tok[4] = {1, 2, 3, 4};
    xent_audit_variants l;
    xent__audit_default_variants(&l);
    xent_audit_opts o;
    xent__audit_opts_init(&o);
    o.progress = 0;
    xent_audit_result r;
    CHECK(xent__audit_run(m, tok, 1, 1, &l, &o, &r) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "at least"), "one token: %s", xent_last_error());
    xent_audit_variants nor = {.n = 0};
    add(&nor, "bf16");
    CHECK(xent__audit_run(m, tok, 1, 4, &nor, &o, &r) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "reference"), "no ref: %s", xent_last_error());
    o.text_path = "/nonexistent";
    int32_t *t = NULL;
    int64_t B, S;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "tokenizer"), "no tokenizer: %s",
          xent_last_error());
    o.text_path = NULL;
    o.seq_len = 1;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "--seq-len"), "seq-len 1: %s", xent_last_error());
    o.seq_len = 8;
    o.batch = 3;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_OK && B == 3 && S == 8, "random");
    for (int i = 0; t && i < 24; i++) CHECK(t[i] >= 0 && t[i] < 97, "id %d", t[i]);
    free(t);
    xent_model_free(m);
}

/* ------------------------------------------------------------------------ */
/* The command line, end to end on a tiny GGUF model                         */
/* ------------------------------------------------------------------------ */

/* Runs `xent audit ARGS > dir/out 2> dir/err`; returns the exit code. */
static int run_audit(const char *dir, const char *args) {
    const char *bin = xt_xent_bin();
    if (!bin) return -1;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' audit %s > '%s/out' 2> '%s/err'", bin, args,
             dir, dir);
    int rc = system(cmd);
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

static char *read_in(const char *dir, const char *name) {
    char p[1024];
    size_t len;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *s = slurp(p, &len);
    return s ? s : calloc(1, 1);
}

static void expect_cli(const char *dir, const char *args, int rc_want,
                       const char *file, const char *needle) {
    int rc = run_audit(dir, args);
    char *s = read_in(dir, file);
    CHECK(rc == rc_want && strstr(s, needle), "xent audit %s: exit %d (want %d), "
          "%s lacks '%s': %.300s", args, rc, rc_want, file, needle, s);
    free(s);
}

TEST(audit_cli_end_to_end) {
    if (!xt_xent_bin()) { xt_skip("no xent binary next to the tests"); return; }
    char dir[] = "/tmp/xent_audit_cliXXXXXX";
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    xent_model *m = tiny_model(1, 3);
    char gguf[1200], args[3000];
    snprintf(gguf, sizeof gguf, "%s/tiny.gguf", dir);
    CHECK(m && xent_model_save_gguf(m, gguf) == XENT_OK, "save: %s", xent_last_error());
    xent_model_free(m);
    snprintf(args, sizeof args, "--model %s --seq-len 9 --batch 2 --seed 3 --quiet "
             "--json %s/a.json --html %s/a.html --threads 2", gguf, dir, dir);
    expect_cli(dir, args, 0, "out", "2 x 9 = 18 tokens run, 16 targets");
    char *j = read_in(dir, "a.json");
    CHECK(strstr(j, "\"tokens\": [") && strstr(j, "\"n_tokens\": 18"), "json");
    free(j);
    char *h = read_in(dir, "a.html");
    CHECK(strstr(h, "<svg") && strstr(h, "</html>"), "html");
    CHECK(!strstr(h, dir) && strstr(h, "model: tiny.gguf ("), "the page names the model "
          "without its directory (%s)", dir);
    free(h);
    snprintf(args, sizeof args, "--model %s --seq-len 4 --variant fp32 "
             "--variant 'b:compute=bf16,ce=bf16_probs'", gguf);
    expect_cli(dir, args, 0, "err", "[2/2] b");
    snprintf(args, sizeof args, "--model %s --variant 'b:computee=bf16'", gguf);
    expect_cli(dir, args, 2, "err", "accepted keys: compute, residual");
    snprintf(args, sizeof args, "--model %s --variant bf16", gguf);
    expect_cli(dir, args, 2, "err", "no fp32 reference");
    snprintf(args, sizeof args, "--model %s --device tpu", gguf);
    expect_cli(dir, args, 2, "err", "accepted: cpu, cuda");
    if (xent_cuda_device_count() < 1) {
        snprintf(args, sizeof args, "--model %s --device cuda", gguf);
        expect_cli(dir, args, 2, "err", "no CUDA device");
    } else { /* the variants' products on the GPU */
        snprintf(args, sizeof args, "--model %s --seq-len 4 --device cuda --variant fp32 "
                 "--variant bf16", gguf);
        expect_cli(dir, args, 0, "out", "products on the GPU (cuBLAS)");
    }
    snprintf(args, sizeof args, "--model %s/missing.gguf", dir);
    expect_cli(dir, args, 1, "err", "missing.gguf");
    snprintf(args, sizeof args, "--model %s --text %s", gguf, gguf);
    expect_cli(dir, args, 2, "err", "tokenizer");
    expect_cli(dir, "--help", 0, "out", "--seq-len N         tokens per row (default: 512)");
    static const char *const flags[] = {"--model", "--text", "--random-tokens",
        "--seed", "--seq-len", "--batch", "--variant", "--variants", "--json",
        "--html", "--threads", "--device", "--quiet"};
    char *help = read_in(dir, "out");
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const char *p = strstr(help, flags[i]);
        const char *nl = p ? strchr(p, '\n') : NULL;
        const char *d = p ? strstr(p, "default") : NULL;
        /* the default is on the flag's line or the next one */
        CHECK(p && d && (!nl || d < strchr(nl + 1, '\n')), "--help: %s default", flags[i]);
    }
    free(help);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* With the default model in the cache (make model): text inputs. A text of
 * one token is refused; a short text runs as one shorter row; the counts
 * the report states are the tokens actually run. Skipped without the file
 * (CI) and under the sanitizers (loading dequantizes 135 M weights). */
TEST(audit_text_inputs_default_model) {
    const char *path = xt_default_model();
    if (xt_sanitizer() || !path) {
        xt_skip("default model not in the cache (make model), or sanitizer build");
        return;
    }
    xent_model *m = NULL;
    CHECK(xent_model_load(path, &m) == XENT_OK && m->tok, "load: %s", xent_last_error());
    if (!m || !m->tok) { xent_model_free(m); return; }
    char tpath[] = "/tmp/xent_audit_textXXXXXX";
    int fd = mkstemp(tpath);
    CHECK(fd >= 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    fputs("the", f);
    fclose(f);
    xent_audit_opts o;
    xent__audit_opts_init(&o);
    o.text_path = tpath;
    int32_t *t = NULL;
    int64_t B = 0, S = 0;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_ERR_VALUE &&
              strstr(xent_last_error(), "gives 1 token: at least 2"),
          "one token: %s", xent_last_error());
    f = fopen(tpath, "w");
    fputs("The quick brown fox jumps over the lazy dog.", f);
    fclose(f);
    o.batch = 4;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_OK && B == 1 && S >= 8 &&
              S < 16, "short text: %lld x %lld", (long long)B, (long long)S);
    free(t);
    t = NULL;
    f = fopen(tpath, "w");
    for (int i = 0; i < 40; i++) fputs("one two three four five six seven eight ", f);
    fclose(f);
    o.seq_len = 64;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_OK && S == 64 && B == 4,
          "rows: %lld x %lld", (long long)B, (long long)S);
    o.batch = 1000;
    free(t);
    t = NULL;
    CHECK(xent__audit_tokens(m, &o, &t, &B, &S) == XENT_OK && S == 64 && B >= 4 &&
              B < 1000, "whole rows only: %lld x %lld", (long long)B, (long long)S);
    free(t);
    unlink(tpath);
    xent_model_free(m);
}

/* A variant with a NaN: its metrics are NaN in the tables ("-"), null in the
 * JSON (which stays valid JSON), and the page draws no NaN coordinate. */
TEST(audit_reports_with_nonfinite_variant) {
    xent_audit_result r;
    memset(&r, 0, sizeof r);
    int64_t nt = 6, nk = 7;
    CHECK(xent__audit_result_alloc(&r, 2, 3, nt, nk) == XENT_OK, "alloc");
    xent__audit_default_variants(&r.variants);
    r.variants.n = 2;
    r.ref = 0;
    r.batch = 1;
    r.seq_len = 7;
    r.n_layers = 1;
    snprintf(r.model, sizeof r.model, "synthetic \"model\"");
    snprintf(r.input, sizeof r.input, "none");
    const xent_audit_role roles[3] = {XA_FW_LAYER, XA_LOGITS, XA_LOGPROB};
    float ref[6] = {-1, -2, -0.5f, -3, -0.25f, -4}, bad[6] = {-1, NAN, -0.5f, -3, -0.25f, -4};
    for (int e = 0; e < 3; e++) {
        snprintf(r.entries[e].name, sizeof r.entries[e].name, "t%d", e);
        r.entries[e].role = roles[e];
        r.entries[e].layer = e == 0 ? 0 : -1;
        xent__audit_metrics(ref, ref, nt, &r.m[e]);
        xent__audit_metrics(e == 2 ? bad : ref, ref, nt, &r.m[3 + e]);
    }
    memcpy(r.logprob, ref, sizeof ref);
    memcpy(r.logprob + nt, bad, sizeof bad);
    for (int i = 0; i < nk; i++) r.tokens[i] = i;
    char jpath[] = "/tmp/xent_audit_nanXXXXXX", hpath[] = "/tmp/xent_audit_nanhXXXXXX";
    int fj = mkstemp(jpath), fh = mkstemp(hpath);
    close(fj);
    close(fh);
    CHECK(xent__audit_write_json(&r, jpath) == XENT_OK, "%s", xent_last_error());
    size_t len = 0;
    char *s = slurp(jpath, &len);
    xent_json j;
    CHECK(s && xent_json_parse(s, len, jpath, &j) == XENT_OK, "json: %s", xent_last_error());
    if (s) xent_json_free(&j);
    CHECK(s && strstr(s, "\"rms_rel\": null") && strstr(s, "\"n_nonfinite\": 1") &&
              strstr(s, "synthetic \\\"model\\\""), "null metrics / escapes");
    free(s);
    CHECK(xent__audit_write_html(&r, hpath) == XENT_OK, "%s", xent_last_error());
    s = slurp(hpath, &len);
    CHECK(s && !strstr(s, "nan") && !strstr(s, "inf"), "NaN in the page");
    free(s);
    xa_table t;
    xa_build_lp(&t, &r);
    CHECK(!strcmp(t.cell[1][1], "-") && !strcmp(t.cell[0][1], "0"), "lp cells '%s' '%s'",
          t.cell[1][1], t.cell[0][1]);
    unlink(jpath);
    unlink(hpath);
    xent__audit_result_free(&r);
}

/* An explicit loss scale that overflows fp16: the gradients are not finite,
 * their metrics are NaN (never a small error), and the console says so. */
TEST(audit_overflowing_loss_scale_is_reported) {
    xent_model *m = tiny_model(0, 2);
    if (!m) { CHECK(0, "model"); return; }
    int32_t tok[10];
    xent__audit_random_tokens(xt_seed(), m->cfg.vocab, 10, tok);
    xent_audit_variants l = {.n = 0};
    add(&l, "fp32");
    add(&l, "over:all=fp16,loss_scale=1e30");
    xent_audit_opts o;
    xent__audit_opts_init(&o);
    o.progress = 0;
    xent_audit_result r;
    xent_status st = xent__audit_run(m, tok, 1, 10, &l, &o, &r);
    CHECK(st == XENT_OK, "run: %s", xent_last_error());
    if (st) { xent_model_free(m); return; }
    int dl = entry_index(&r, XA_DLOGITS), lg = entry_index(&r, XA_LOGITS);
    CHECK(metric(&r, 1, dl)->n_nonfinite > 0 && isnan(metric(&r, 1, dl)->rms_rel),
          "dlogits: nonfinite %lld rel %g", (long long)metric(&r, 1, dl)->n_nonfinite,
          metric(&r, 1, dl)->rms_rel);
    CHECK(metric(&r, 1, lg)->n_nonfinite == 0 && metric(&r, 1, lg)->rms_rel > 0,
          "the forward is unaffected");
    FILE *f = tmpfile();
    xent__audit_print_tables(&r, f);
    rewind(f);
    char buf[1 << 14];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    CHECK(strstr(buf, "warning: variant over has") != NULL, "no warning");
    xent__audit_result_free(&r);
    xent_model_free(m);
}

/* The verdict on hand-set errors: the budget is the tightest that holds all
 * three figures; the error enters at the first tensor past half the last
 * one, forward and backward; a non-finite value meets no budget. */
TEST(audit_verdict_budgets_and_entry) {
    xent_audit_result r;
    memset(&r, 0, sizeof r);
    enum { NE = 11 };
    CHECK(xent__audit_result_alloc(&r, 2, NE, 4, 5) == XENT_OK, "alloc");
    xent__audit_default_variants(&r.variants);
    r.variants.n = 2;
    r.ref = 0;
    r.n_layers = 3;
    static const struct { const char *n; xent_audit_role role; int layer; double rel; }
    ent[NE] = {
        {"embed.out", XA_OTHER, -1, 0.0005}, {"layers.0.out", XA_FW_LAYER, 0, 0.004},
        {"layers.1.out", XA_FW_LAYER, 1, 0.011}, {"layers.2.out", XA_FW_LAYER, 2, 0.015},
        {"final_norm.out", XA_OTHER, -1, 0.016}, {"logits", XA_LOGITS, -1, 0.02},
        {"chosen_logprob", XA_LOGPROB, -1, 0.01}, {"dlogits", XA_DLOGITS, -1, 0.001},
        {"layers.2.in_grad", XA_BW_LAYER, 2, 0.06}, {"layers.1.in_grad", XA_BW_LAYER, 1, 0.1},
        {"grad.w", XA_G_LINEAR, 0, 0.05},
    };
    for (int e = 0; e < NE; e++) {
        snprintf(r.entries[e].name, sizeof r.entries[e].name, "%s", ent[e].n);
        r.entries[e].role = ent[e].role;
        r.entries[e].layer = ent[e].layer;
        xent_audit_metrics *m0 = &r.m[e], *m1 = &r.m[NE + e];
        memset(m0, 0, sizeof *m0);
        m0->n = m1->n = 8;
        m0->corr = m0->slope = 1;
        m1->rms_rel = ent[e].rel;
        m1->rms_abs = ent[e].rel * 4; /* log p: 0.04 nats */
    }
    xent_audit_verdict vd;
    xent__audit_verdict(&r, 1, &vd);
    /* logits 2% (training: <= 3), log p 0.04 nats (<= 0.1), gradient 5% (<= 10) */
    CHECK(fabs(vd.logits_pct - 2) < 1e-12 && fabs(vd.logprob - 0.04) < 1e-12 &&
              fabs(vd.grad_pct - 5) < 1e-12 && vd.budget == 1, "figures %g %g %g budget %d",
          vd.logits_pct, vd.logprob, vd.grad_pct, vd.budget);
    CHECK(vd.fw_entry == 2 && vd.bw_entry == 8, "entries %d %d (want layers.1.out, "
          "layers.2.in_grad)", vd.fw_entry, vd.bw_entry);
    CHECK(fabs(vd.fw_final_pct - 2) < 1e-12 && fabs(vd.bw_final_pct - 10) < 1e-12,
          "finals %g %g", vd.fw_final_pct, vd.bw_final_pct);
    r.m[NE + 10].rms_rel = 0.2; /* gradient 20%: only loose */
    xent__audit_verdict(&r, 1, &vd);
    CHECK(vd.budget == 2, "loose: %d", vd.budget);
    r.m[NE + 5].rms_rel = 0.004; /* logits 0.4%, log p 0.005, gradient 0.5% */
    r.m[NE + 10].rms_rel = 0.005;
    r.m[NE + 6].rms_abs = 0.005;
    xent__audit_verdict(&r, 1, &vd);
    CHECK(vd.budget == 0, "tight: %d", vd.budget);
    r.m[NE + 9].n_nonfinite = 1;
    xent__audit_verdict(&r, 1, &vd);
    CHECK(vd.budget == XENT_AUDIT_N_BUDGETS, "non-finite: %d", vd.budget);
    xent__audit_verdict(&r, 0, &vd);
    CHECK(vd.fw_entry == -1 && vd.bw_entry == -1, "the reference has no error to enter");
    xa_table t; /* logits now 0.4%: layers.0.out (0.4%) is past half of it */
    xa_build_verdict(&t, &r);
    CHECK(!strcmp(t.cell[0][4], "reference") && !strcmp(t.cell[1][4], "over every budget") &&
              !strcmp(t.cell[1][5], "layers.0.out"), "console verdict '%s' '%s' '%s'",
          t.cell[0][4], t.cell[1][4], t.cell[1][5]);
    xent__audit_result_free(&r);
}

/* Token texts in the page: escaped, control characters and stray bytes
 * shown as \n and \xNN, the context before the target; in the JSON the
 * stray byte is U+FFFD. No directory of a path reaches the page. */
TEST(audit_report_token_text_and_paths) {
    xent_audit_result r;
    memset(&r, 0, sizeof r);
    int64_t nt = 6, nk = 7;
    CHECK(xent__audit_result_alloc(&r, 2, 1, nt, nk) == XENT_OK, "alloc");
    xent__audit_default_variants(&r.variants);
    r.variants.n = 2;
    r.ref = 0;
    r.batch = 1;
    r.seq_len = 7;
    r.n_layers = 1;
    snprintf(r.model, sizeof r.model, "/home/someone/models/tiny.gguf (gguf F32)");
    snprintf(r.input, sizeof r.input, "text /data/texts/a.txt");
    r.entries[0].role = XA_LOGPROB;
    r.entries[0].layer = -1;
    snprintf(r.entries[0].name, sizeof r.entries[0].name, "chosen_logprob");
    static const int32_t ids[7] = {0, 3, 4, 5, 6, 1, 2};
    memcpy(r.tokens, ids, sizeof ids);
    float ref[6] = {-1, -2, -3, -4, -5, -6}, var[6] = {-1, -2.5f, -3.25f, -4.125f, -5, -6};
    memcpy(r.logprob, ref, sizeof ref);
    memcpy(r.logprob + nt, var, sizeof var);
    xent__audit_metrics(ref, ref, nt, &r.m[0]);
    xent__audit_metrics(var, ref, nt, &r.m[1]);
    xent_tokenizer *tk = tiny_tok(16);
    CHECK(tk && xent__audit_result_token_text(&r, tk) == XENT_OK, "texts: %s", xent_last_error());
    xent_tokenizer_free(tk);
    char hpath[] = "/tmp/xent_audit_tokhXXXXXX", jpath[] = "/tmp/xent_audit_tokjXXXXXX";
    int fh = mkstemp(hpath), fj = mkstemp(jpath);
    close(fh);
    close(fj);
    CHECK(xent__audit_write_html(&r, hpath) == XENT_OK, "%s", xent_last_error());
    size_t len = 0;
    char *s = slurp(hpath, &len);
    CHECK(s && table_rows(s, "worst-tokens") == 3, "3 tokens moved: %d rows",
          s ? table_rows(s, "worst-tokens") : -1);
    /* the worst: target 1 (token 4, "\n", after " <b>&"), then 0xE2, then w6 */
    const char *t = s ? strstr(s, "<table class=worst-tokens>") : NULL;
    const char *r1 = t ? strstr(t, "<td class=ctx><code class=tok>w0</code><code class=tok> "
                                   "&lt;b&gt;&amp;</code></td><td><code class=tok>\\n</code>")
                       : NULL;
    const char *r2 = t ? strstr(t, "<code class=tok>\\xE2</code></td><td class=n>5</td>") : NULL;
    const char *r3 = t ? strstr(t, "<code class=tok>w6</code></td><td class=n>6</td>") : NULL;
    CHECK(r1 && r2 && r3 && r1 < r2 && r2 < r3, "rows in order with their text");
    CHECK(s && strstr(s, "model: tiny.gguf (gguf F32); input: text a.txt;") &&
              !strstr(s, "/home") && !strstr(s, "/data"), "paths without directories");
    free(s);
    CHECK(xent__audit_write_json(&r, jpath) == XENT_OK, "%s", xent_last_error());
    s = slurp(jpath, &len);
    xent_json j;
    CHECK(s && xent_json_parse(s, len, jpath, &j) == XENT_OK, "json: %s", xent_last_error());
    if (s) xent_json_free(&j);
    CHECK(s && strstr(s, "\"token_text\": [\n    [\"w0\", \" <b>&\", \"\\n\", \"\\ufffd\", \"w6\""),
          "json token_text: %.200s", s && strstr(s, "\"token_text\"") ? strstr(s, "\"token_text\"") : "(none)");
    free(s);
    unlink(hpath);
    unlink(jpath);
    xent__audit_result_free(&r);
}

/* Per-layer progress: with an engine that reports its layers, on_layer sees
 * every run's forward 0..L-1 then its backward L-1..0 (a run that reuses the
 * previous forward: the backward only), variants in run order; without
 * one it is never called. */
typedef struct { int n, bad, last_variant; int seq[64]; } layer_log;

static void log_layer(void *ctx, int variant, int layer, int n_layers, int backward) {
    layer_log *g = ctx;
    if (n_layers != 3 || layer < 0 || layer >= 3) g->bad++;
    if (g->n < 64) g->seq[g->n] = variant * 100 + backward * 10 + layer;
    g->n++;
    g->last_variant = variant;
}

TEST(audit_progress_per_layer) {
    xent_model *m = tiny_model(0, 3);
    if (!m) { CHECK(0, "model"); return; }
    int32_t tok[12];
    xent__audit_random_tokens(5, m->cfg.vocab, 12, tok);
    xent_audit_variants l = {.n = 0};
    add(&l, "bf16");
    add(&l, "fp32");
    add(&l, "fp16");
    xent_audit_opts o;
    xent__audit_opts_init(&o);
    o.progress = 0;
    layer_log g = {0, 0, -1, {0}};
    o.on_layer = log_layer;
    o.on_layer_ctx = &g;
    xent_audit_result r;
    xent_status st = xent__audit_run(m, tok, 1, 12, &l, &o, &r);
    CHECK(st == XENT_OK, "run: %s", xent_last_error());
    {
        /* reference (index 1) first, then bf16 (0), then fp16 (2) */
        static const int want[18] = {100, 101, 102, 112, 111, 110, 0, 1, 2, 12, 11, 10,
                                     200, 201, 202, 212, 211, 210};
        CHECK(g.n == 18 && !g.bad, "%d calls, %d bad", g.n, g.bad);
        for (int i = 0; i < 18 && i < g.n; i++)
            CHECK(g.seq[i] == want[i], "call %d: %d, want %d", i, g.seq[i], want[i]);
    }
    if (!st) xent__audit_result_free(&r);
    xent_model_free(m);
}
