/* tests/test_compare.c: `xent compare` (src/compare/): hand-computed
 * statistics, every validation failure, the readers on hostile input, the
 * input formats agreeing, and the audit's token-id JSON as input. */
#include "harness.h"
#include "compare/compare.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Fixtures live next to this file: tests/data/compare/. */
#define FIX "tests/data/compare/"

/* Exact-ish comparison: hand-computed values are short decimals, computed
 * here with a handful of double operations, so 1e-12 relative is ample
 * (each operation adds at most 2^-53 relative; < 100 operations). */
static int near(double x, double want) {
    return fabs(x - want) <= 1e-12 * (fabs(want) > 1 ? fabs(want) : 1);
}

static char g_dir[64];

static const char *tmpdir(void) {
    if (!g_dir[0]) {
        strcpy(g_dir, "/tmp/xent_cmp_XXXXXX");
        if (!mkdtemp(g_dir)) g_dir[0] = 0;
    }
    return g_dir;
}

static const char *tmp(const char *name) {
    static char buf[64][256]; /* a ring: up to 64 names alive at once */
    static int k;
    char *p = buf[k++ % 64];
    snprintf(p, 256, "%s/%s", tmpdir(), name);
    return p;
}

static char *read_all(const char *path) {
    char *b = NULL;
    size_t n;
    if (xent__cmp_slurp(path, &b, &n)) return NULL;
    return b;
}

static int write_str(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fputs(s, f);
    return fclose(f) == 0;
}

static xent__cmp_cfg cfg_default(const char *a, const char *b) {
    xent__cmp_cfg c;
    memset(&c, 0, sizeof c);
    xent__cmp_opts_default(&c.opts);
    c.a = a;
    c.b = b;
    c.quiet = 1;
    c.opts.threads = 2;
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    c.err = devnull; /* the messages are checked through xent_last_error() */
    return c;
}

/* ---- hand-computed statistics ------------------------------------------ */

/* The fixture a.jsonl / b.jsonl / ref.txt (6 tokens, 2 sequences, prompt_len
 * 1 and 0, so positions 1..5 are used):
 *   A   = [-1, -2,   -0.5,  -0.25 | -3,   -1.5]
 *   B   = [-1, -2.5, -0.25, -0.25 | -2,   -1.5]
 *   ref = [-1, -2.25,-0.5,  -0.25 | -2.5, -1.5]
 *   d   = A - B on positions 1..5 = [0.5, -0.25, 0, -1, 0]
 * sum -0.75, mean -0.15, RMS^2 = (0.25 + 0.0625 + 1) / 5 = 0.2625.
 * |d| sorted [0, 0, 0.25, 0.5, 1]; numpy-linear quantiles h = 4p:
 *   50%: 0.25; 90%: h = 3.6 -> 0.5 + 0.6 * 0.5 = 0.8; 99%: 0.98; 99.9%: 0.998.
 * ratio exp(d) = [1.65, 0.78, 1, 0.37, 1] outside [0.8, 1.28]: 3 -> 0.6;
 * |d| > 0.2: 3 -> 0.6. max |d| = 1 at position 4 (sequence 1, index 0,
 * token 21). Per sequence (completion tokens): seq 0 sum 0.25, mean 1/12;
 * seq 1 sum -1, mean -0.5. Means: mean -5/24, std 7/24 (population),
 * RMS sqrt((1/144 + 1/4) / 2), max |.| = -0.5 at seq 1.
 * e_A = [0.25, 0, 0, -0.5, 0], e_B = [-0.25, 0.25, 0, 0.5, 0]:
 *   mean -0.05 and 0.1; RMS^2 0.0625 and 0.075; E[e_A e_B] = -0.0625,
 *   cross = 0.125 and 0.0625 + 0.075 + 0.125 = 0.2625 = RMS(d)^2;
 *   centred: var 0.06, 0.065, cov -0.0575, rho = -0.0575 / sqrt(0.0039). */
TEST(compare_fixture_hand_computed) {
    xent__cmp_cfg c = cfg_default(FIX "a.jsonl", FIX "b.jsonl");
    c.ref = FIX "ref.txt";
    c.json = tmp("fixture.json");
    c.opts.clamp = 1.0; /* seq 1 has |sum| = 1 >= 0.9 */
    CHECK(xent__cmp_run(&c) == 0, "run failed: %s", xent_last_error());
    /* Same numbers through the in-memory API. */
    xent__cmp_series sa, sb, sr;
    CHECK(!xent__cmp_load_logprobs(FIX "a.jsonl", &sa), "%s", xent_last_error());
    CHECK(!xent__cmp_load_logprobs(FIX "b.jsonl", &sb), "%s", xent_last_error());
    CHECK(!xent__cmp_load_logprobs(FIX "ref.txt", &sr), "%s", xent_last_error());
    if (xt_failed()) return;
    CHECK(sa.n == 6 && sa.nseq == 2 && sa.offsets[1] == 4 && sa.mask && !sa.mask[0] && sa.mask[1],
          "a.jsonl read wrong: n %lld nseq %lld", (long long)sa.n, (long long)sa.nseq);
    xent__cmp_data d = {sa.lp, sb.lp, sr.lp, 6, sa.tokens, sa.offsets, 2, sa.mask, NULL, NULL};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.clamp = 1.0;
    o.threads = 2;
    xent__cmp_result r;
    CHECK(!xent__cmp_compute(&d, &o, &r), "%s", xent_last_error());
    CHECK(r.n == 6 && r.n_selected == 5 && r.n_used == 5 && r.n_excluded == 0, "counts");
    CHECK(near(r.sum, -0.75) && near(r.mean, -0.15), "sum %g mean %g", r.sum, r.mean);
    CHECK(near(r.rms, sqrt(0.2625)), "rms %.17g", r.rms);
    CHECK(r.max_abs == 1 && r.max_tok.pos == 4 && r.max_tok.seq == 1 && r.max_tok.idx == 0 &&
          r.max_tok.token == 21, "max %g at %lld", r.max_abs, (long long)r.max_tok.pos);
    const double q[4] = {0.25, 0.8, 0.98, 0.998};
    for (int k = 0; k < 4; k++) CHECK(near(r.q[k], q[k]), "q[%d] = %.17g", k, r.q[k]);
    CHECK(r.n_clip_ratio == 3 && r.n_clip_log == 3 && near(r.clip_ratio, 0.6), "clip");
    CHECK(r.nseq == 2 && r.nseq_used == 2, "nseq");
    CHECK(near(r.seq_mean, -5.0 / 24) && near(r.seq_std, 7.0 / 24), "seq mean %.17g std %.17g",
          r.seq_mean, r.seq_std);
    CHECK(near(r.seq_rms, sqrt((1.0 / 144 + 0.25) / 2)), "seq rms %.17g", r.seq_rms);
    CHECK(r.seq_max == -0.5 && r.seq_max_idx == 1, "seq max");
    CHECK(r.seq_sum_min == -1 && r.seq_sum_min_idx == 1 && near(r.seq_sum_max, 0.25) &&
          r.seq_sum_max_idx == 0, "seq sums");
    CHECK(r.n_clamp_warn == 1 && r.n_clamp_list == 1 && r.clamp_idx[0] == 1, "clamp warning");
    CHECK(r.ntopseq == 2 && r.topseq[0].seq == 1 && r.topseq[0].n == 2 && r.topseq[0].mean == -0.5 &&
          r.topseq[1].seq == 0 && r.topseq[1].n == 3 && near(r.topseq[1].sum, 0.25),
          "worst sequences");
    CHECK(near(r.mean_ea, -0.05) && near(r.mean_eb, 0.1), "ref means");
    CHECK(near(r.rms_ea, 0.25) && near(r.rms_eb, sqrt(0.075)), "ref rms");
    CHECK(near(r.cross, 0.125), "cross %.17g", r.cross);
    CHECK(near(r.rho, -0.0575 / sqrt(0.0039)), "rho %.17g", r.rho);
    CHECK(near(r.rho0, -0.0625 / (0.25 * sqrt(0.075))), "rho0 %.17g", r.rho0);
    /* worst tokens: |d| 1, 0.5, 0.25, then the two zeros by position */
    const int64_t pos[5] = {4, 1, 2, 3, 5};
    CHECK(r.ntop == 5, "ntop %lld", (long long)r.ntop);
    for (int k = 0; k < 5 && k < r.ntop; k++) CHECK(r.top[k].pos == pos[k], "top[%d]", k);
    CHECK(r.top[0].token == 21 && r.top[0].a == -3 && r.top[0].b == -2 && r.top[0].r == -2.5,
          "top[0] fields");
    /* Bootstrap over 2 sequences: a resample is {0,0}, {0,1}/{1,0} or {1,1};
     * mean delta is then 0.25/3, -0.75/5 or -1/2; the 95% interval lies
     * inside [-0.5, 1/12]. */
    CHECK(r.boot_by_seq && r.boot_units == 2 && r.boot_n == 1000, "boot setup");
    CHECK(r.ci_mean.lo >= -0.5 - 1e-15 && r.ci_mean.hi <= 1.0 / 12 + 1e-15 &&
          r.ci_mean.lo <= r.mean && r.mean <= r.ci_mean.hi, "ci mean [%g, %g]",
          r.ci_mean.lo, r.ci_mean.hi);
    /* the JSON holds the same numbers */
    char *js = read_all(c.json);
    CHECK(js && strstr(js, "\"mean\": -0.14999999999999999") && strstr(js, "\"clamp_warnings\": 1") &&
          strstr(js, "\"99\": 0.97999999999999998"), "JSON content");
    free(js);
    xent__cmp_result_free(&r);
    xent__cmp_series_free(&sa);
    xent__cmp_series_free(&sb);
    xent__cmp_series_free(&sr);
}

/* ---- quantiles by selection vs a full sort ----------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

TEST(compare_quantiles_match_sort) {
    xt_rng_t *g = xt_rng();
    const int64_t sizes[] = {1, 2, 3, 10, 17, 100, 1001, 50000};
    const double lv[4] = {0.5, 0.9, 0.99, 0.999};
    for (int si = 0; si < 8; si++) {
        int64_t n = sizes[si];
        double *x = malloc((size_t)n * sizeof *x), *s = malloc((size_t)n * sizeof *s);
        for (int64_t i = 0; i < n; i++) /* many ties: a quarter rounded */
            x[i] = xt_uniform(g) < 0.25 ? floor(xt_uniform(g) * 4) : fabs(xt_normal(g));
        memcpy(s, x, (size_t)n * sizeof *s);
        qsort(s, (size_t)n, sizeof *s, cmp_d);
        double got[4];
        xent__cmp_quantiles(x, n, lv, 4, got);
        for (int k = 0; k < 4; k++) {
            double h = (double)(n - 1) * lv[k];
            int64_t lo = (int64_t)floor(h);
            double want = lo + 1 < n ? s[lo] + (h - (double)lo) * (s[lo + 1] - s[lo]) : s[lo];
            CHECK(got[k] == want, "n %lld q%d: %.17g vs %.17g", (long long)n, k, got[k], want);
        }
        free(x);
        free(s);
    }
}

/* ---- bad values ---------------------------------------------------------- */

/* Positions: 0 ok, 1 NaN, 2 +0.5, 3 -inf, 4..11 eight exact zeros (a run of
 * 8 = --zero-run), 12 ok, 13..19 seven zeros (not a run), 20 ok. */
static void bad_input(double *v) {
    for (int i = 0; i < 21; i++) v[i] = -1.0 - 0.01 * i;
    v[1] = NAN;
    v[2] = 0.5;
    v[3] = -INFINITY;
    for (int i = 4; i < 12; i++) v[i] = 0.0;
    for (int i = 13; i < 20; i++) v[i] = i == 15 ? -0.0 : 0.0;
}

TEST(compare_bad_values_counted_and_refused) {
    double a[21], b[21];
    bad_input(a);
    for (int i = 0; i < 21; i++) b[i] = -1.0 - 0.01 * i;
    xent__cmp_bad bad;
    uint8_t mk[21] = {0};
    xent__cmp_scan_bad(a, 21, NULL, 8, &bad, mk);
    CHECK(bad.nan == 1 && bad.first_nan == 1 && bad.positive == 1 && bad.first_positive == 2 &&
          bad.inf == 1 && bad.first_inf == 3 && bad.zero_run == 8 && bad.first_zero_run == 4,
          "counts nan %lld pos %lld inf %lld zr %lld", (long long)bad.nan,
          (long long)bad.positive, (long long)bad.inf, (long long)bad.zero_run);
    for (int i = 0; i < 21; i++) CHECK(mk[i] == (i >= 1 && i < 12), "mark[%d] = %d", i, mk[i]);
    /* --zero-run 7 also flags the second run (13..19, -0 included) */
    xent__cmp_scan_bad(a, 21, NULL, 7, &bad, NULL);
    CHECK(bad.zero_run == 15, "zero run 7: %lld", (long long)bad.zero_run);
    /* a mask that hides position 11 splits the run along selected tokens */
    uint8_t m[21];
    memset(m, 1, sizeof m);
    m[11] = 0;
    xent__cmp_scan_bad(a, 21, m, 8, &bad, NULL);
    CHECK(bad.zero_run == 0, "masked run: %lld", (long long)bad.zero_run);

    xent__cmp_data d = {a, b, NULL, 21, NULL, NULL, 0, NULL, NULL, NULL};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.bootstrap = 0;
    o.zero_run = 8; /* the default is 32: the run of 8 zeros above counts */
    xent__cmp_result r;
    CHECK(xent__cmp_compute(&d, &o, &r) == XENT_ERR_VALUE, "bad values accepted");
    CHECK(r.n_excluded == 11 && r.bad[0].nan == 1, "refusal counts %lld", (long long)r.n_excluded);
    xent__cmp_result_free(&r);
    /* --exclude-bad: statistics over the 10 good tokens, where A - B = 0
     * except positions 13..19: d = 0 - (-1 - 0.01 i) = 1 + 0.01 i. */
    o.exclude_bad = 1;
    CHECK(!xent__cmp_compute(&d, &o, &r), "%s", xent_last_error());
    double sum = 0;
    for (int i = 13; i < 20; i++) sum += 1 + 0.01 * i;
    CHECK(r.n_used == 10 && r.n_excluded == 11 && near(r.sum, sum) && near(r.mean, sum / 10),
          "excluded stats: used %lld sum %.17g", (long long)r.n_used, r.sum);
    CHECK(r.max_tok.pos == 19, "max at %lld", (long long)r.max_tok.pos);
    xent__cmp_result_free(&r);
    /* B bad too: the union of both is excluded */
    b[20] = 1.0;
    CHECK(!xent__cmp_compute(&d, &o, &r), "%s", xent_last_error());
    CHECK(r.n_used == 9 && r.bad[1].positive == 1 && r.bad[1].first_positive == 20, "union");
    xent__cmp_result_free(&r);
}

/* The CLI refuses bad values with exit 1; --exclude-bad proceeds. */
TEST(compare_cli_refuses_bad_values) {
    CHECK(write_str(tmp("bad_a.txt"), "-1\nnan\n-0.5\n-inf\n0.25\n-2\n"), "write");
    CHECK(write_str(tmp("bad_b.txt"), "-1\n-1\n-0.5\n-1\n-1\n-2\n"), "write");
    xent__cmp_cfg c = cfg_default(tmp("bad_a.txt"), tmp("bad_b.txt"));
    c.json = tmp("bad.json");
    unlink(c.json);
    CHECK(xent__cmp_run(&c) == 1, "bad values not refused");
    CHECK(access(c.json, F_OK) != 0, "JSON written despite refusal");
    c.opts.exclude_bad = 1;
    CHECK(xent__cmp_run(&c) == 0, "--exclude-bad failed: %s", xent_last_error());
    char *js = read_all(c.json);
    CHECK(js && strstr(js, "\"used\": 3, \"excluded\": 3"), "JSON counts: %.120s", js ? js : "");
    CHECK(js && strstr(js, "\"nan\": 1, \"first_nan\": 1, \"inf\": 1, \"first_inf\": 3"),
          "bad counts in JSON");
    free(js);
}

/* ---- validation failures ------------------------------------------------- */

static xent_status compute_once(const xent__cmp_data *d, const xent__cmp_opts *o) {
    xent__cmp_result r;
    xent_status s = xent__cmp_compute(d, o, &r);
    xent__cmp_result_free(&r);
    return s;
}

TEST(compare_validation_in_memory) {
    double a[4] = {-1, -2, -3, -4}, b[4] = {-1, -2, -3, -4.5};
    int64_t off_bad0[3] = {1, 2, 4}, off_dec[3] = {0, 3, 2}, off_end[3] = {0, 2, 3};
    uint8_t mask2[4] = {1, 2, 1, 1}, mask0[4] = {0, 0, 0, 0};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.bootstrap = 10;
    xent__cmp_data d = {a, b, NULL, 4, NULL, NULL, 0, NULL, NULL, NULL};
    CHECK(compute_once(&d, &o) == XENT_OK, "valid input refused: %s", xent_last_error());
    d.offsets = off_bad0; d.nseq = 2;
    CHECK(compute_once(&d, &o) == XENT_ERR_VALUE && strstr(xent_last_error(), "offsets[0]"), "offsets[0]");
    d.offsets = off_dec;
    CHECK(compute_once(&d, &o) == XENT_ERR_VALUE && strstr(xent_last_error(), "offsets[2] = 2"),
          "decreasing: %s", xent_last_error());
    d.offsets = off_end;
    CHECK(compute_once(&d, &o) == XENT_ERR_SHAPE && strstr(xent_last_error(), "token count 4"),
          "end: %s", xent_last_error());
    d.offsets = NULL; d.nseq = 0;
    d.mask = mask2;
    CHECK(compute_once(&d, &o) == XENT_ERR_VALUE && strstr(xent_last_error(), "mask[1] = 2"), "mask value");
    d.mask = mask0;
    CHECK(compute_once(&d, &o) == XENT_ERR_SHAPE, "empty mask");
    d.mask = NULL;
    d.n = 0;
    CHECK(compute_once(&d, &o) == XENT_ERR_SHAPE, "n = 0");
    d.n = 4;
    xent__cmp_opts bad = o;
    bad.eps = 1.0;
    CHECK(compute_once(&d, &bad) == XENT_ERR_VALUE && strstr(xent_last_error(), "--eps"), "eps");
    bad = o; bad.eps_high = 0;
    CHECK(compute_once(&d, &bad) == XENT_ERR_VALUE && strstr(xent_last_error(), "--eps-high"), "eps_high");
    bad = o; bad.clamp = -1;
    CHECK(compute_once(&d, &bad) == XENT_ERR_VALUE && strstr(xent_last_error(), "--clamp"), "clamp");
    bad = o; bad.zero_run = 0;
    CHECK(compute_once(&d, &bad) == XENT_ERR_VALUE && strstr(xent_last_error(), "--zero-run"), "zero_run");
    bad = o; bad.bootstrap = -1;
    CHECK(compute_once(&d, &bad) == XENT_ERR_VALUE && strstr(xent_last_error(), "--bootstrap"), "bootstrap");
    bad = o; bad.top = -1;
    CHECK(compute_once(&d, &bad) == XENT_ERR_VALUE && strstr(xent_last_error(), "--top"), "top");
}

/* Runs the command and checks it fails with a message containing `want`. */
static void run_fails(xent__cmp_cfg *c, const char *want, int line) {
    int rc = xent__cmp_run(c);
    const char *e = xent_last_error();
    if (rc != 1 || !strstr(e, want))
        xt_fail_at(__FILE__, line, "rc %d, message '%s', wanted '%s'", rc, e, want);
}

TEST(compare_validation_cli) {
    const char *A = FIX "a.jsonl", *B = FIX "b.jsonl";
    CHECK(write_str(tmp("five.txt"), "-1\n-2\n-3\n-4\n-5\n"), "write");
    CHECK(write_str(tmp("b_tok.jsonl"),
                    "{\"tokens\": [11, 12, 13, 14], \"logprobs\": [-1, -2.5, -0.25, -0.25], \"prompt_len\": 1}\n"
                    "{\"tokens\": [21, 99], \"logprobs\": [-2, -1.5], \"prompt_len\": 0}\n"), "write");
    CHECK(write_str(tmp("b_plen.jsonl"),
                    "{\"logprobs\": [-1, -2.5, -0.25, -0.25], \"prompt_len\": 2}\n"
                    "{\"logprobs\": [-2, -1.5], \"prompt_len\": 0}\n"), "write");
    CHECK(write_str(tmp("b_seq.jsonl"),
                    "{\"logprobs\": [-1, -2.5, -0.25]}\n{\"logprobs\": [-0.25, -2, -1.5]}\n"), "write");
    CHECK(write_str(tmp("off.txt"), "0\n3\n6\n"), "write");
    CHECK(write_str(tmp("off_short.txt"), "0\n"), "write");
    CHECK(write_str(tmp("mask5.txt"), "1\n1\n1\n1\n1\n"), "write");
    CHECK(write_str(tmp("mask_bad.txt"), "1\n1\n3\n1\n1\n1\n"), "write");
    CHECK(write_str(tmp("tok5.txt"), "1\n2\n3\n4\n5\n"), "write");
    xent__cmp_cfg c = cfg_default(A, tmp("five.txt"));
    run_fails(&c, "lengths differ: A (" FIX "a.jsonl) has 6 log-probs", __LINE__);
    c = cfg_default(A, B);
    c.ref = tmp("five.txt");
    run_fails(&c, "ref (", __LINE__);
    c = cfg_default(A, tmp("b_tok.jsonl"));
    run_fails(&c, "token ids differ at position 5 (sequence 1, index 1)", __LINE__);
    c = cfg_default(A, B);
    c.tokens_b = FIX "audit_tokens_bad.json";
    run_fails(&c, "has 22, " FIX "audit_tokens_bad.json has 23", __LINE__);
    c = cfg_default(A, B);
    c.tokens_a = tmp("tok5.txt");
    run_fails(&c, "has 5 token ids but the log-probs have 6", __LINE__);
    c = cfg_default(A, tmp("b_plen.jsonl"));
    run_fails(&c, "completion masks differ at position 1", __LINE__);
    c = cfg_default(A, tmp("b_seq.jsonl"));
    run_fails(&c, "sequence boundaries differ", __LINE__);
    c = cfg_default(A, B);
    c.offsets = tmp("off.txt");
    run_fails(&c, "sequence boundaries differ", __LINE__);
    c = cfg_default(A, B);
    c.offsets = tmp("off_short.txt");
    run_fails(&c, "at least 2 entries", __LINE__);
    c = cfg_default(A, B);
    c.mask = tmp("mask5.txt");
    run_fails(&c, "--mask has 5 entries", __LINE__);
    c = cfg_default(A, B);
    c.mask = tmp("mask_bad.txt");
    run_fails(&c, "mask[2] = 3", __LINE__);
    c = cfg_default(A, tmp("does_not_exist.npy"));
    run_fails(&c, "does_not_exist", __LINE__);
    c = cfg_default(A, B);
    c.json = "/nonexistent_dir/x.json";
    CHECK(xent__cmp_run(&c) == 1, "unwritable JSON path accepted");
    /* the offsets from --offsets agree with JSONL: accepted */
    CHECK(write_str(tmp("off_ok.txt"), "0\n4\n6\n"), "write");
    c = cfg_default(A, B);
    c.offsets = tmp("off_ok.txt");
    c.tokens_a = FIX "audit_tokens.json";
    CHECK(xent__cmp_run(&c) == 0, "consistent inputs refused: %s", xent_last_error());
}

/* ---- readers on hostile input ------------------------------------------- */

static xent_status parse_lp(const char *s) {
    xent__cmp_series x;
    xent_status st = xent__cmp_parse_json("t", s, strlen(s), 1, &x);
    xent__cmp_series_free(&x);
    return st;
}

static xent_status parse_ids(const char *s) {
    xent__cmp_series x;
    xent_status st = xent__cmp_parse_json("t", s, strlen(s), 0, &x);
    xent__cmp_series_free(&x);
    return st;
}

TEST(compare_json_reader_strict) {
    const char *good[] = {
        "{\"logprobs\": [-1, -2.5e-3, null, NaN, -Infinity]}",
        "{\"logprobs\":[-1],\"tokens\":[3],\"prompt_len\":0}\n\n{\"logprobs\":[-2],\"tokens\":[4],\"prompt_len\":1}\n",
        "{\"a\": {\"b\": [1, {\"c\": \"\\u00e9\\ud83d\\ude00\\n\"}]}, \"logprobs\": [-0.0]}\r\n",
    };
    for (int i = 0; i < 3; i++) CHECK(parse_lp(good[i]) == XENT_OK, "good[%d]: %s", i, xent_last_error());
    const char *bad[] = {
        "", "   \n", "[]", "{", "{\"logprobs\": [-1,]}", "{\"logprobs\": [-1] ,}",
        "{\"logprobs\": [01]}", "{\"logprobs\": [+1]}", "{\"logprobs\": [.5]}", "{\"logprobs\": [1.]}",
        "{\"logprobs\": [1e]}", "{\"logprobs\": [0x10]}", "{\"logprobs\": [nan]}", "{\"logprobs\": [-1]} {\"logprobs\": [-1]}",
        "{\"logprobs\": [-1], \"logprobs\": [-2]}", "{\"tokens\": [1]}", "{\"logprobs\": []}",
        "{\"logprobs\": [-1], \"tokens\": [1, 2]}", "{\"logprobs\": [-1], \"tokens\": [-1]}",
        "{\"logprobs\": [-1], \"tokens\": [1.5]}", "{\"logprobs\": [-1], \"prompt_len\": 2}",
        "{\"logprobs\": [-1], \"prompt_len\": -1}", "{\"logprobs\": [-1], \"tokens\": [1]}\n{\"logprobs\": [-1]}",
        "{\"logprobs\": [-1], \"x\": \"\x01\"}", "{\"logprobs\": [-1], \"x\": \"\\q\"}",
        "{\"logprobs\": [-1], \"x\": \"\\ud800\"}", "{\"logprobs\": [-1], \"x\": \"\xc3\"}",
        "{\"logprobs\": [-1], \"x\": \"\xed\xa0\x80\"}", "{\"logprobs\": [-1], \"x\": tru}",
        "{\"logprobs\": [-1], \"x\": \"abc}", "{\"logprobs\" [-1]}", "{logprobs: [-1]}",
        "{\"logprobs\": [-1], \"tokens\": [99999999999999999999]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        xent_status s = parse_lp(bad[i]);
        CHECK(s != XENT_OK, "bad[%zu] accepted: %s", i, bad[i]);
    }
    /* nesting limit: 100 nested arrays in a skipped member */
    char deep[300] = "{\"x\": ";
    for (int i = 0; i < 100; i++) strcat(deep, "[");
    CHECK(parse_lp(deep) == XENT_ERR_FORMAT && strstr(xent_last_error(), "deep"), "depth: %s",
          xent_last_error());
    /* the message names the line and column */
    CHECK(parse_lp("{\"logprobs\": [-1]}\n{\"logprobs\": [-1,,]}") == XENT_ERR_FORMAT &&
          strstr(xent_last_error(), "t:2:18"), "position: %s", xent_last_error());
    /* token-id documents */
    CHECK(parse_ids("[[1, 2], [3]]") == XENT_OK, "nested ids");
    CHECK(parse_ids("[1, 2, 3]") == XENT_OK, "flat ids");
    CHECK(parse_ids("{\"tokens\": [[1], [2, 3]], \"other\": {\"tokens\": 5}}") == XENT_OK, "audit ids");
    CHECK(parse_ids("[[1, 2], 3]") != XENT_OK, "mixed ids");
    CHECK(parse_ids("{\"other\": 1}") != XENT_OK, "no tokens");
    CHECK(parse_ids("[[]]") != XENT_OK, "no ids");
}

/* Every prefix and many random mutations of a valid file parse or fail
 * cleanly (the sanitizer build checks the "cleanly"). */
TEST(compare_json_reader_truncated_and_mutated) {
    const char *src =
        "{\"tokens\": [1, 22, 333], \"logprobs\": [-1.5, -2e-3, null], \"prompt_len\": 1, "
        "\"m\": {\"s\": \"a\\u00e9\\\"\", \"l\": [true, false, null, -0.5E+2]}}\n"
        "{\"tokens\": [4], \"logprobs\": [-Infinity], \"prompt_len\": 0}\n";
    size_t n = strlen(src);
    char *buf = malloc(n + 1);
    int ok = 0;
    for (size_t k = 0; k <= n; k++) {
        memcpy(buf, src, k);
        buf[k] = 0;
        xent__cmp_series x;
        char *exact = malloc(k + 1); /* exact-size copy: overreads are caught */
        memcpy(exact, buf, k + 1);
        ok += xent__cmp_parse_json("t", exact, k, 1, &x) == XENT_OK;
        xent__cmp_series_free(&x);
        free(exact);
    }
    /* complete first line (with or without its newline) or the whole file */
    CHECK(ok >= 2 && ok <= 4, "%d prefixes accepted", ok);
    xt_rng_t *g = xt_rng();
    const char alphabet[] = "{}[],:\"\\-+.0123456789eEnulltrueNaInfity \n\x80\xff";
    for (int t = 0; t < (xt_sanitizer() ? 300 : 3000); t++) {
        memcpy(buf, src, n + 1);
        int m = 1 + (int)xt_randint(g, 4);
        for (int j = 0; j < m; j++)
            buf[xt_randint(g, (int64_t)n)] = alphabet[xt_randint(g, (int64_t)sizeof alphabet - 1)];
        xent__cmp_series x;
        xent_status s = xent__cmp_parse_json("t", buf, n, (int)(t & 1), &x);
        if (s == XENT_OK && (t & 1))
            CHECK(x.n > 0 && x.offsets && x.offsets[x.nseq] == x.n, "inconsistent series");
        xent__cmp_series_free(&x);
    }
    free(buf);
}

TEST(compare_text_reader) {
    double *v = NULL;
    int64_t n = 0;
    const char *ok = "-1.5\n  nan\n-inf\r\n+inf\n-0\n1e-3\t\n-Infinity\n";
    CHECK(!xent__cmp_parse_text("t", ok, strlen(ok), &v, &n), "%s", xent_last_error());
    CHECK(n == 7 && v[0] == -1.5 && isnan(v[1]) && v[2] == -INFINITY && v[3] == INFINITY &&
          v[4] == 0 && signbit(v[4]) && v[5] == 1e-3 && v[6] == -INFINITY, "values");
    free(v);
    const char *bad[] = {"", "-1\n\n-2\n", "-1 -2\n", "0x10\n", "nan(1)\n", "abc\n", "-1,\n", "1e\n"};
    for (int i = 0; i < 8; i++) {
        v = NULL;
        xent_status s = xent__cmp_parse_text("t", bad[i], strlen(bad[i]), &v, &n);
        CHECK(s != XENT_OK, "bad[%d] accepted", i);
        free(v);
    }
    CHECK(xent__cmp_parse_text("t", "-1\0x\n", 5, &v, &n) == XENT_ERR_FORMAT, "NUL inside a line");
    CHECK(xent__cmp_parse_text("t", "-1\n-2\nx\n", 9, &v, &n) == XENT_ERR_FORMAT &&
          strstr(xent_last_error(), "t:3:"), "line number: %s", xent_last_error());
    int64_t *iv = NULL;
    CHECK(!xent__cmp_parse_text_ints("t", "0\n5\n 7 \n", 8, &iv, &n) && n == 3 && iv[2] == 7, "ints");
    free(iv);
    iv = NULL;
    CHECK(xent__cmp_parse_text_ints("t", "1.5\n", 4, &iv, &n) != XENT_OK, "1.5 as int");
    CHECK(xent__cmp_parse_text_ints("t", "99999999999999999999\n", 21, &iv, &n) != XENT_OK, "overflow");
}

/* ---- formats agree ------------------------------------------------------- */

/* Writes the same data in every format; the JSON outputs must be equal byte
 * for byte. Values are f32 (so the tensor files hold them exactly) printed
 * with 17 digits in the text forms (exact round trip through double). */
TEST(compare_formats_agree) {
    xt_rng_t *g = xt_rng();
    enum { S = 7 };
    int64_t off[S + 1] = {0}, plen[S];
    for (int q = 0; q < S; q++) {
        off[q + 1] = off[q] + 1 + xt_randint(g, 40);
        plen[q] = xt_randint(g, off[q + 1] - off[q]);
    }
    int64_t n = off[S];
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *r = malloc((size_t)n * 4);
    int64_t *tok = malloc((size_t)n * 8), *mask = malloc((size_t)n * 8);
    for (int q = 0; q < S; q++)
        for (int64_t i = off[q]; i < off[q + 1]; i++) {
            r[i] = (float)(-5 * xt_uniform(g) - 1e-3);
            a[i] = r[i] + (float)(0.05 * xt_normal(g));
            b[i] = r[i] + (float)(0.05 * xt_normal(g));
            if (a[i] >= 0) a[i] = -1e-4f;
            if (b[i] >= 0) b[i] = -1e-4f;
            tok[i] = xt_randint(g, 151936);
            mask[i] = i - off[q] >= plen[q];
        }
    /* tensors */
    xent_tensor t[3];
    memset(t, 0, sizeof t);
    const float *src[3] = {a, b, r};
    const char *nm[3] = {"a", "b", "r"};
    for (int k = 0; k < 3; k++) {
        snprintf(t[k].name, sizeof t[k].name, "%s", nm[k]);
        t[k].dtype = XENT_F32; t[k].ndim = 1; t[k].shape[0] = n;
        t[k].data = (void *)src[k]; t[k].nbytes = (size_t)n * 4;
    }
    CHECK(!xent_tensors_save(tmp("lp.safetensors"), t, 3), "%s", xent_last_error());
    CHECK(!xent_tensors_save(tmp("a.npy"), &t[0], 1), "%s", xent_last_error());
    CHECK(!xent_tensors_save(tmp("b.npy"), &t[1], 1), "%s", xent_last_error());
    CHECK(!xent_tensors_save(tmp("r.npy"), &t[2], 1), "%s", xent_last_error());
    xent_tensor ti[3];
    memset(ti, 0, sizeof ti);
    const int64_t *isrc[3] = {tok, off, mask};
    int64_t ilen[3] = {n, S + 1, n};
    const char *inm[3] = {"tok.npy", "off.npy", "mask.npy"};
    for (int k = 0; k < 3; k++) {
        ti[k].dtype = XENT_I64; ti[k].ndim = 1; ti[k].shape[0] = ilen[k];
        ti[k].data = (void *)isrc[k]; ti[k].nbytes = (size_t)ilen[k] * 8;
        CHECK(!xent_tensors_save(tmp(inm[k]), &ti[k], 1), "%s", xent_last_error());
    }
    /* text and JSON Lines */
    FILE *fa = fopen(tmp("a.txt"), "w"), *fb = fopen(tmp("b.txt"), "w"), *fr = fopen(tmp("r.txt"), "w");
    FILE *ft = fopen(tmp("tok.txt"), "w"), *fo = fopen(tmp("off.txt"), "w"), *fm = fopen(tmp("mask.txt"), "w");
    FILE *ja = fopen(tmp("a.jsonl"), "w"), *jb = fopen(tmp("b.jsonl"), "w");
    for (int q = 0; q <= S; q++) fprintf(fo, "%lld\n", (long long)off[q]);
    for (int q = 0; q < S; q++) {
        FILE *jf[2] = {ja, jb};
        const float *v[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            fprintf(jf[k], "{\"tokens\": [");
            for (int64_t i = off[q]; i < off[q + 1]; i++)
                fprintf(jf[k], "%s%lld", i > off[q] ? ", " : "", (long long)tok[i]);
            fprintf(jf[k], "], \"logprobs\": [");
            for (int64_t i = off[q]; i < off[q + 1]; i++)
                fprintf(jf[k], "%s%.17g", i > off[q] ? ", " : "", (double)v[k][i]);
            fprintf(jf[k], "], \"prompt_len\": %lld}\n", (long long)plen[q]);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        fprintf(fa, "%.17g\n", (double)a[i]);
        fprintf(fb, "%.17g\n", (double)b[i]);
        fprintf(fr, "%.17g\n", (double)r[i]);
        fprintf(ft, "%lld\n", (long long)tok[i]);
        fprintf(fm, "%lld\n", (long long)mask[i]);
    }
    FILE *all[8] = {fa, fb, fr, ft, fo, fm, ja, jb};
    for (int k = 0; k < 8; k++) fclose(all[k]);
    /* run each form */
    struct { const char *a, *b, *r, *tok, *off, *mask; } form[4] = {
        {tmp("a.npy"), tmp("b.npy"), tmp("r.npy"), tmp("tok.npy"), tmp("off.npy"), tmp("mask.npy")},
        {NULL, NULL, NULL, tmp("tok.npy"), tmp("off.npy"), tmp("mask.npy")},
        {tmp("a.txt"), tmp("b.txt"), tmp("r.txt"), tmp("tok.txt"), tmp("off.txt"), tmp("mask.txt")},
        {tmp("a.jsonl"), tmp("b.jsonl"), tmp("r.txt"), NULL, NULL, NULL},
    };
    char st_a[300], st_b[300], st_r[300];
    snprintf(st_a, sizeof st_a, "%s:a", tmp("lp.safetensors"));
    snprintf(st_b, sizeof st_b, "%s:b", tmp("lp.safetensors"));
    snprintf(st_r, sizeof st_r, "%s:r", tmp("lp.safetensors"));
    form[1].a = st_a; form[1].b = st_b; form[1].r = st_r;
    const char *fname[4] = {"npy", "safetensors", "text", "jsonl"};
    char *first = NULL;
    for (int k = 0; k < 4; k++) {
        xent__cmp_cfg c = cfg_default(form[k].a, form[k].b);
        c.ref = form[k].r;
        c.tokens_a = form[k].tok;
        c.offsets = form[k].off;
        c.mask = form[k].mask;
        c.opts.bootstrap = 200;
        c.opts.seed = 7;
        char out[32];
        snprintf(out, sizeof out, "form%d.json", k);
        c.json = tmp(out);
        CHECK(xent__cmp_run(&c) == 0, "%s: %s", fname[k], xent_last_error());
        char *js = read_all(c.json);
        CHECK(js != NULL, "no JSON for %s", fname[k]);
        if (!js) continue;
        if (!first) first = js;
        else {
            CHECK(!strcmp(first, js), "%s output differs from npy", fname[k]);
            free(js);
        }
    }
    CHECK(first && strstr(first, "\"unit\": \"sequence\"") && strstr(first, "\"reference\": {"),
          "JSON lacks sequences or reference");
    free(first);
    free(a); free(b); free(r); free(tok); free(mask);
}

/* ---- the audit's token-id JSON as input ---------------------------------- */

TEST(compare_audit_token_json) {
    xent__cmp_series s;
    CHECK(!xent__cmp_load_ids(FIX "audit_tokens.json", &s), "%s", xent_last_error());
    CHECK(s.ntok == 6 && s.nseq == 2 && s.offsets[1] == 4 && s.tokens[4] == 21, "audit ids read");
    xent__cmp_series_free(&s);
    /* as --tokens-a with text log-probs: boundaries come from the ids */
    CHECK(write_str(tmp("aud_a.txt"), "-1\n-2\n-0.5\n-0.25\n-3\n-1.5\n"), "write");
    CHECK(write_str(tmp("aud_b.txt"), "-1\n-2.5\n-0.25\n-0.25\n-2\n-1.5\n"), "write");
    xent__cmp_cfg c = cfg_default(tmp("aud_a.txt"), tmp("aud_b.txt"));
    c.tokens_a = FIX "audit_tokens.json";
    c.tokens_b = FIX "audit_tokens.json";
    c.json = tmp("aud.json");
    CHECK(xent__cmp_run(&c) == 0, "%s", xent_last_error());
    char *js = read_all(c.json);
    /* max |d| = 1 at position 4 = sequence 1, index 0, token 21 */
    CHECK(js && strstr(js, "\"max_abs_at\": {\"position\": 4, \"sequence\": 1, \"index\": 0, \"token\": 21"),
          "audit ids not used: %.300s", js ? js : "");
    CHECK(js && strstr(js, "\"sequences\": {\"count\": 2"), "boundaries not taken from the ids");
    free(js);
    c.tokens_b = FIX "audit_tokens_bad.json";
    run_fails(&c, "token ids differ at position 5 (sequence 1, index 1)", __LINE__);
}

/* ---- bootstrap ----------------------------------------------------------- */

/* Seeded and independent of the thread count; for iid N(mu, 1) deltas the
 * 95% interval of the mean has width near 2 * 1.96 / sqrt(n): the bootstrap
 * standard error has relative spread ~ 1/sqrt(2 n) (n = 8000: 0.8%) and
 * the 2.5/97.5% quantiles of 1000 resamples ~ 5%, so 20% is a wide bound. */
TEST(compare_bootstrap_seeded) {
    xt_rng_t *g = xt_rng();
    int64_t n = xt_sanitizer() ? 2000 : 8000;
    double *a = malloc((size_t)n * 8), *b = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) {
        b[i] = -3 - xt_uniform(g);
        a[i] = b[i] + 0.1 + 0.1 * xt_normal(g);
    }
    xent__cmp_data d = {a, b, NULL, n, NULL, NULL, 0, NULL, NULL, NULL};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.seed = 42;
    xent__cmp_result r1, r2, r3;
    o.threads = 1;
    CHECK(!xent__cmp_compute(&d, &o, &r1), "%s", xent_last_error());
    o.threads = 2;
    CHECK(!xent__cmp_compute(&d, &o, &r2), "%s", xent_last_error());
    CHECK(!memcmp(&r1.ci_mean, &r2.ci_mean, sizeof r1.ci_mean) &&
          !memcmp(&r1.ci_rms, &r2.ci_rms, sizeof r1.ci_rms) &&
          !memcmp(&r1.ci_clip_log, &r2.ci_clip_log, sizeof r1.ci_clip_log), "threads change the CI");
    o.seed = 43;
    CHECK(!xent__cmp_compute(&d, &o, &r3), "%s", xent_last_error());
    CHECK(r3.ci_mean.lo != r1.ci_mean.lo, "seed ignored");
    double sd = sqrt(r1.rms * r1.rms - r1.mean * r1.mean);
    double want = 2 * 1.959964 * sd / sqrt((double)n), got = r1.ci_mean.hi - r1.ci_mean.lo;
    CHECK(fabs(got / want - 1) < 0.2, "CI width %g, expected about %g", got, want);
    CHECK(r1.ci_mean.lo < r1.mean && r1.mean < r1.ci_mean.hi, "CI misses the estimate");
    CHECK(r1.ci_rms.lo < r1.rms && r1.rms < r1.ci_rms.hi, "RMS CI misses the estimate");
    CHECK(!r1.boot_by_seq && r1.boot_units == n && r1.boot_block == 1, "token bootstrap");
    xent__cmp_result_free(&r1);
    xent__cmp_result_free(&r2);
    xent__cmp_result_free(&r3);
    /* constant delta: every resample gives the same mean and RMS */
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + 0.125;
    CHECK(!xent__cmp_compute(&d, &o, &r1), "%s", xent_last_error());
    CHECK(r1.ci_mean.lo == 0.125 && r1.ci_mean.hi == 0.125 && r1.ci_clip_log.hi == 0,
          "constant delta CI [%.17g, %.17g]", r1.ci_mean.lo, r1.ci_mean.hi);
    xent__cmp_result_free(&r1);
    free(a);
    free(b);
}

/* The decomposition holds on random data to rounding: with s = RMS(d)^2,
 * each of the three terms is a mean of n products computed in double, so
 * the identity's residual is below ~ 4 n 2^-53 (sum of magnitudes). */
TEST(compare_reference_decomposition) {
    xt_rng_t *g = xt_rng();
    int64_t n = 5000;
    double *a = malloc((size_t)n * 8), *b = malloc((size_t)n * 8), *r = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) {
        r[i] = -4 * xt_uniform(g) - 0.5;
        double common = 0.02 * xt_normal(g);
        a[i] = r[i] + common + 0.01 * xt_normal(g) + 0.003;
        b[i] = r[i] + common + 0.01 * xt_normal(g);
    }
    xent__cmp_data d = {a, b, r, n, NULL, NULL, 0, NULL, NULL, NULL};
    xent__cmp_opts o;
    xent__cmp_opts_default(&o);
    o.bootstrap = 0;
    xent__cmp_result res;
    CHECK(!xent__cmp_compute(&d, &o, &res), "%s", xent_last_error());
    double lhs = res.rms * res.rms;
    double rhs = res.rms_ea * res.rms_ea + res.rms_eb * res.rms_eb + res.cross;
    double scale = res.rms_ea * res.rms_ea + res.rms_eb * res.rms_eb;
    CHECK(fabs(lhs - rhs) <= 4 * (double)n * 0x1p-53 * scale, "identity: %.17g vs %.17g", lhs, rhs);
    /* centred form: var(d) = sd_a^2 + sd_b^2 - 2 rho sd_a sd_b */
    double var = lhs - res.mean * res.mean;
    double cen = res.sd_ea * res.sd_ea + res.sd_eb * res.sd_eb - 2 * res.rho * res.sd_ea * res.sd_eb;
    CHECK(fabs(var - cen) <= 8 * (double)n * 0x1p-53 * scale, "centred: %.17g vs %.17g", var, cen);
    /* the shared error makes rho ~ 0.8 (0.02^2 / (0.02^2 + 0.01^2)) */
    CHECK(res.rho > 0.7 && res.rho < 0.9, "rho %g", res.rho);
    CHECK(res.boot_n == 0 && isnan(res.ci_mean.lo), "bootstrap 0 still ran");
    xent__cmp_result_free(&res);
    free(a); free(b); free(r);
}

/* HTML: written, self-contained (no external references), escapes names. */
TEST(compare_html_self_contained) {
    xent__cmp_cfg c = cfg_default(FIX "a.jsonl", FIX "b.jsonl");
    c.ref = FIX "ref.txt";
    c.html = tmp("r.html");
    CHECK(xent__cmp_run(&c) == 0, "%s", xent_last_error());
    char *h = read_all(c.html);
    CHECK(h && strstr(h, "<svg") && strstr(h, "</html>"), "no SVG");
    CHECK(h && !strstr(h, "src=") && !strstr(h, "href=") && !strstr(h, "<link") &&
          !strstr(h, "url(") && !strstr(h, "@import"), "external reference");
    CHECK(h && !strstr(h, "<script"), "script in report");
    free(h);
}

/* bf16 and f16 log-prob tensors are widened exactly. */
TEST(compare_half_precision_tensors) {
    const float v[4] = {-0.5f, -1.0f / 3, -7.25f, -1e-3f};
    uint16_t hb[4], hh[4];
    for (int i = 0; i < 4; i++) {
        hb[i] = xent_f32_to_bf16(v[i]);
        hh[i] = xent_f32_to_f16(v[i]);
    }
    xent_tensor t[2];
    memset(t, 0, sizeof t);
    strcpy(t[0].name, "bf");
    strcpy(t[1].name, "hf");
    t[0].dtype = XENT_BF16; t[1].dtype = XENT_F16;
    t[0].data = hb; t[1].data = hh;
    for (int k = 0; k < 2; k++) { t[k].ndim = 2; t[k].shape[0] = 2; t[k].shape[1] = 2; t[k].nbytes = 8; }
    CHECK(!xent_tensors_save(tmp("half.safetensors"), t, 2), "%s", xent_last_error());
    char spec[300];
    snprintf(spec, sizeof spec, "%s:bf", tmp("half.safetensors"));
    xent__cmp_series s;
    CHECK(!xent__cmp_load_logprobs(spec, &s), "%s", xent_last_error());
    for (int i = 0; i < 4 && s.n == 4; i++)
        CHECK(s.lp[i] == (double)xent_bf16_to_f32(hb[i]), "bf16[%d]", i);
    xent__cmp_series_free(&s);
    snprintf(spec, sizeof spec, "%s:hf", tmp("half.safetensors"));
    CHECK(!xent__cmp_load_logprobs(spec, &s), "%s", xent_last_error());
    for (int i = 0; i < 4 && s.n == 4; i++)
        CHECK(s.lp[i] == (double)xent_f16_to_f32(hh[i]), "f16[%d]", i);
    CHECK(s.n == 4, "2x2 tensor not flattened to 4: %lld", (long long)s.n);
    CHECK(s.nseq == 2 && s.offsets && s.offsets[1] == 2 && s.offsets[2] == 4,
          "a [2, 2] tensor is 2 sequences of 2 tokens");
    xent__cmp_series_free(&s);
    /* a float mask holding 0/1 is read as integers; 0.5 is refused */
    const float fm[3] = {1, 0, 1}, fh[1] = {0.5f};
    xent_tensor tf;
    memset(&tf, 0, sizeof tf);
    tf.dtype = XENT_F32; tf.ndim = 1; tf.shape[0] = 3; tf.data = (void *)fm; tf.nbytes = 12;
    CHECK(!xent_tensors_save(tmp("fmask.npy"), &tf, 1), "%s", xent_last_error());
    int64_t *mv = NULL, nm = 0;
    CHECK(!xent__cmp_load_ints(tmp("fmask.npy"), &mv, &nm) && nm == 3 && mv[0] == 1 && mv[1] == 0,
          "float mask: %s", xent_last_error());
    free(mv);
    mv = NULL;
    tf.shape[0] = 1; tf.data = (void *)fh; tf.nbytes = 4;
    CHECK(!xent_tensors_save(tmp("fhalf.npy"), &tf, 1), "%s", xent_last_error());
    CHECK(xent__cmp_load_ints(tmp("fhalf.npy"), &mv, &nm) == XENT_ERR_VALUE &&
          strstr(xent_last_error(), "[0] = 0.5"), "0.5 as an integer: %s", xent_last_error());
    free(mv);
    /* an integer tensor is not a log-prob source */
    int32_t iv[2] = {1, 2};
    xent_tensor ti;
    memset(&ti, 0, sizeof ti);
    ti.dtype = XENT_I32; ti.ndim = 1; ti.shape[0] = 2; ti.data = iv; ti.nbytes = 8;
    CHECK(!xent_tensors_save(tmp("ints.npy"), &ti, 1), "%s", xent_last_error());
    CHECK(xent__cmp_load_logprobs(tmp("ints.npy"), &s) == XENT_ERR_DTYPE, "int log-probs accepted");
}

/* The command-line front end: runs the xent binary next to this test
 * binary (build/xent or build-asan/xent). */
static int sh(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(compare_cli_binary) {
    const char *exe = xt_xent_bin();
    if (!exe) { xt_skip("xent binary not built"); return; }
    static char out[1 << 16];
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s compare --help 2>&1", exe);
    CHECK(sh(cmd, out, sizeof out) == 0, "--help failed");
    const char *flags[] = {"--ref", "--tokens-a", "--tokens-b", "--offsets", "--mask", "--zero-run",
                           "--exclude-bad", "--eps ", "--eps-high", "--clamp", "--bootstrap", "--seed",
                           "--top", "--threads", "--json", "--html", "--quiet"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        char pat[40];
        snprintf(pat, sizeof pat, "\n  %s", flags[i]); /* an option line */
        const char *p = strstr(out, pat);
        const char *nl = p ? strchr(p, '\n') : NULL;
        /* the default is on the flag's line or the next two */
        const char *d = p ? strstr(p, "(default:") : NULL;
        int lines = 0;
        for (const char *q = p ? p + 1 : NULL; q && d && q < d; q++) lines += *q == '\n';
        CHECK(p && nl && d && lines <= 2, "--help: %s without its default", flags[i]);
    }
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --ref %sref.txt --top 3 --bootstrap 50 2>&1",
             exe, FIX, FIX, FIX);
    CHECK(sh(cmd, out, sizeof out) == 0, "fixture run failed: %s", out);
    CHECK(strstr(out, "delta = A - B") && strstr(out, "rho = corr(e_A, e_B)") &&
          strstr(out, "worst tokens"), "table incomplete: %.400s", out);
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl 2>&1", exe, FIX);
    CHECK(sh(cmd, out, sizeof out) == 2, "one input accepted");
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --nope 2>&1", exe, FIX, FIX);
    CHECK(sh(cmd, out, sizeof out) == 2 && strstr(out, "--nope"), "unknown flag");
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --eps 1.5 2>&1", exe, FIX, FIX);
    CHECK(sh(cmd, out, sizeof out) == 2 && strstr(out, "--eps"), "bad --eps");
    snprintf(cmd, sizeof cmd, "%s compare %sa.jsonl %sb.jsonl --zero-run x 2>&1", exe, FIX, FIX);
    CHECK(sh(cmd, out, sizeof out) == 2, "bad --zero-run");
    CHECK(write_str(tmp("zeros.txt"), "0\n0\n0\n0\n0\n0\n0\n0\n-1\n"), "write");
    CHECK(write_str(tmp("ones.txt"), "-1\n-1\n-1\n-1\n-1\n-1\n-1\n-1\n-1\n"), "write");
    /* the CLI's default run length is 32 (xent_rl_loss_opts_init): 8 here */
    snprintf(cmd, sizeof cmd, "%s compare %s %s --zero-run 8 2>&1", exe, tmp("zeros.txt"),
             tmp("ones.txt"));
    CHECK(sh(cmd, out, sizeof out) == 1 && strstr(out, "--exclude-bad") &&
          strstr(out, "in runs of exact 0"), "zero-filled dump not refused: %s", out);
    snprintf(cmd, sizeof cmd, "%s compare %s %s --zero-run 8 --exclude-bad --json - --quiet 2>&1",
             exe, tmp("zeros.txt"), tmp("ones.txt"));
    CHECK(sh(cmd, out, sizeof out) == 0 && strstr(out, "\"used\": 1, \"excluded\": 8"),
          "--exclude-bad: %s", out);
    /* a file name that needs escaping in HTML */
    CHECK(write_str(tmp("a<&>.txt"), "-1\n-2\n"), "write");
    CHECK(write_str(tmp("b.txt"), "-1.5\n-2\n"), "write");
    snprintf(cmd, sizeof cmd, "%s compare '%s' %s --html %s --quiet 2>&1", exe, tmp("a<&>.txt"),
             tmp("b.txt"), tmp("esc.html"));
    CHECK(sh(cmd, out, sizeof out) == 0, "html run: %s", out);
    char *h = read_all(tmp("esc.html"));
    CHECK(h && strstr(h, "a&lt;&amp;&gt;.txt") && !strstr(h, "a<&>"), "name not escaped");
    free(h);
}

/* ---- JSON Lines keys (--key-a/--key-b) and the per-line mask ------------- */

static xent_status parse_keys(const char *s, const char *lp, const char *lp_flag,
                              const char *mask, xent__cmp_series *x) {
    xent__cmp_keys k = {lp, lp_flag, mask, mask ? "--key-mask" : NULL};
    return xent__cmp_parse_json_keys("t.jsonl", s, strlen(s), 1, &k, x);
}

/* One hostile line: the status, and every piece of want in the message. */
static void keys_fail(const char *s, const char *lp, const char *mask, xent_status want_st,
                      const char *w1, const char *w2, const char *w3, int line) {
    xent__cmp_series x;
    xent_status st = parse_keys(s, lp, lp ? "--key-a" : NULL, mask, &x);
    const char *e = xent_last_error();
    if (st != want_st || (w1 && !strstr(e, w1)) || (w2 && !strstr(e, w2)) || (w3 && !strstr(e, w3)))
        xt_fail_at(__FILE__, line, "status %d (want %d), message '%s', wanted '%s' '%s' '%s' for %s",
                   (int)st, (int)want_st, e, w1 ? w1 : "", w2 ? w2 : "", w3 ? w3 : "", s);
    xent__cmp_series_free(&x);
}
#define KEYS_FAIL(s, lp, mask, st, w1, w2, w3) keys_fail(s, lp, mask, st, w1, w2, w3, __LINE__)

TEST(compare_jsonl_keys_and_mask_reader) {
    /* the key picks the array; the others are skipped; mask 0/1/true/false */
    const char *two =
        "{\"tokens\": [5, 6, 7], \"logprobs\": [-1, -2, -3], \"old_log_probs\": [-1.5, -2.5, -3.5], "
        "\"mask\": [0, 1, true], \"prompt_len\": 1}\n"
        "{\"tokens\": [8, 9], \"logprobs\": [-4, -5], \"old_log_probs\": [-4.5, -5.5], "
        "\"mask\": [false, 1], \"prompt_len\": 0}\n";
    xent__cmp_series x;
    CHECK(parse_keys(two, "old_log_probs", "--key-a", NULL, &x) == XENT_OK, "%s", xent_last_error());
    CHECK(x.n == 5 && x.lp[0] == -1.5 && x.lp[4] == -5.5 && x.nseq == 2, "old_log_probs read");
    static const uint8_t want_m[5] = {0, 1, 1, 0, 1}, want_p[5] = {0, 1, 1, 1, 1};
    CHECK(x.lmask && x.nlmask == 5 && !memcmp(x.lmask, want_m, 5), "per-line mask read");
    CHECK(x.mask && !memcmp(x.mask, want_p, 5), "prompt_len mask kept apart from \"mask\"");
    xent__cmp_series_free(&x);
    CHECK(parse_keys(two, NULL, NULL, NULL, &x) == XENT_OK && x.lp[0] == -1 && x.lmask,
          "default keys: logprobs and mask: %s", xent_last_error());
    xent__cmp_series_free(&x);
    /* another mask key: "mask" is then an ordinary, skipped member */
    const char *lm = "{\"logprobs\": [-1, -2], \"loss_mask\": [1, 0], \"mask\": \"anything\"}\n";
    CHECK(parse_keys(lm, NULL, NULL, "loss_mask", &x) == XENT_OK && x.lmask && x.lmask[0] == 1 &&
          x.lmask[1] == 0, "--key-mask loss_mask: %s", xent_last_error());
    xent__cmp_series_free(&x);
    CHECK(parse_keys("{\"logprobs\": [-1]}\n", NULL, NULL, NULL, &x) == XENT_OK && !x.lmask,
          "no mask: lmask NULL");
    xent__cmp_series_free(&x);
    /* a key of XENT__CMP_KEY_MAX bytes matches; a longer one in the file does not */
    char key[XENT__CMP_KEY_MAX + 2], doc[700];
    memset(key, 'k', XENT__CMP_KEY_MAX);
    key[XENT__CMP_KEY_MAX] = 0;
    snprintf(doc, sizeof doc, "{\"%s\": [-0.5]}\n", key);
    CHECK(parse_keys(doc, key, "--key-a", NULL, &x) == XENT_OK && x.lp[0] == -0.5, "256-byte key: %s",
          xent_last_error());
    xent__cmp_series_free(&x);
    snprintf(doc, sizeof doc, "{\"%sk\": [-0.5]}\n", key);
    KEYS_FAIL(doc, key, NULL, XENT_ERR_FORMAT, "--key-a", "has no", NULL);

    /* hostile: a missing key names the flag, the key, the file and line, and the keys there */
    KEYS_FAIL("{\"logprobs\": [-1]}\n{\"logprobs\": [-1], \"rollout_log_probs\": [-2]}\n",
              "rollout_log_probs", NULL, XENT_ERR_FORMAT, "t.jsonl:1: --key-a rollout_log_probs",
              "no \"rollout_log_probs\"", "its keys: \"logprobs\"");
    KEYS_FAIL("{\"old_log_probs\": [-1]}\n{\"logprobs\": [-1]}\n", "old_log_probs", NULL,
              XENT_ERR_FORMAT, "t.jsonl:2:", "--key-a old_log_probs", NULL);
    KEYS_FAIL("{\"x\": [-1]}\n", NULL, NULL, XENT_ERR_FORMAT, "t.jsonl:1: object has no \"logprobs\"",
              NULL, NULL);
    KEYS_FAIL("{\"old\": {\"a\": 1}}\n", "old", NULL, XENT_ERR_FORMAT, "\"old\" (--key-a) must be an array",
              NULL, NULL);
    KEYS_FAIL("{\"old\": [-1], \"old\": [-2]}\n", "old", NULL, XENT_ERR_FORMAT,
              "duplicate key \"old\" (--key-a)", NULL, NULL);
    /* hostile masks: wrong length, non-0/1 values, wrong types, on some lines only */
    KEYS_FAIL("{\"logprobs\": [-1, -2], \"mask\": [1]}\n", NULL, NULL, XENT_ERR_SHAPE,
              "t.jsonl:1: \"mask\" has 1 entries but \"logprobs\" has 2", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [1, 0]}\n", NULL, NULL, XENT_ERR_SHAPE, "\"mask\" has 2", NULL,
              NULL);
    KEYS_FAIL("{\"old\": [-1, -2], \"m\": [1, 1, 1]}\n", "old", "m", XENT_ERR_SHAPE,
              "\"m\" (--key-mask) has 3 entries but \"old\" has 2", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1, -2], \"mask\": [1, 2]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "\"mask\"[1] = 2 is not 0 or 1", "t.jsonl:1:", NULL);
    KEYS_FAIL("{\"logprobs\": [-1, -2], \"mask\": [0.5, 1]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "\"mask\"[0] = 0.5 is not 0 or 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1, -2], \"mask\": [1, -1]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "\"mask\"[1] = -1 is not 0 or 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1, -2], \"mask\": [1.0, 1]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "\"mask\"[0] = 1.0 is not 0 or 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [null]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "\"mask\" must be an array of 0 and 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [\"1\"]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "must be an array of 0 and 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [[1]]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "must be an array of 0 and 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": 1}\n", NULL, NULL, XENT_ERR_FORMAT,
              "must be an array of 0 and 1", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"m\": [3]}\n", NULL, "m", XENT_ERR_FORMAT,
              "\"m\"[0] = 3 is not 0 or 1 (--key-mask)", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [1]}\n{\"logprobs\": [-1]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "t.jsonl:2: \"mask\" must be on every line or on none", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [1], \"mask\": [1]}\n", NULL, NULL, XENT_ERR_FORMAT,
              "duplicate key \"mask\"", NULL, NULL);
    KEYS_FAIL("{\"logprobs\": [-1], \"mask\": [1,]}\n", NULL, NULL, XENT_ERR_FORMAT, "t.jsonl:1:", NULL, NULL);
    /* every prefix of a line with a mask parses or fails cleanly (ASan build: no overread) */
    const char *src = "{\"logprobs\": [-1, -2, -3], \"mask\": [1, 0, true], \"prompt_len\": 1}\n";
    size_t n = strlen(src);
    for (size_t k = 0; k <= n; k++) {
        char *exact = malloc(k + 1);
        memcpy(exact, src, k);
        exact[k] = 0;
        xent__cmp_keys kk = {NULL, NULL, NULL, NULL};
        xent_status st = xent__cmp_parse_json_keys("t", exact, k, 1, &kk, &x);
        if (st == XENT_OK) CHECK(x.lmask && x.nlmask == 3, "prefix %zu: mask", k);
        xent__cmp_series_free(&x);
        free(exact);
    }
}

/* A mean delta from the --json report ("mean": X after "\"delta\""). */
static double json_mean_delta(const char *path, long long *used) {
    char *s = read_all(path);
    double v = NAN;
    *used = -1;
    const char *u = s ? strstr(s, "\"used\": ") : NULL;
    if (u) *used = strtoll(u + 8, NULL, 10);
    const char *dl = u ? strstr(u, "\"delta\": {") : NULL;
    const char *m = dl ? strstr(dl, "\"mean\": ") : NULL;
    if (m) v = strtod(m + 8, NULL);
    free(s);
    return v;
}

TEST(compare_jsonl_keys_and_mask_run) {
    /* A: a TRL/verl-like record with two arrays and a loss mask; B: a plain
     * dump (prompt_len only). Selected: i >= prompt_len and mask 1.
     *   seq 0: old   [-1, -2, -3, -4], rollout [-1, -2.5, -3, -3], plen 1, mask [1, 1, 0, 1]
     *   seq 1: old   [-1, -1],          rollout [-2, -0.5],         plen 0, mask [1, 1]
     * B = rollout; A = old: delta on selected {1, 3 | 0, 1} = [0.5, -1, 1, -0.5]: mean 0. */
    CHECK(write_str(tmp("k_a.jsonl"),
                    "{\"tokens\": [1, 2, 3, 4], \"old_log_probs\": [-1, -2, -3, -4], "
                    "\"rollout_log_probs\": [-1, -2.5, -3, -3], \"mask\": [1, 1, 0, 1], \"prompt_len\": 1}\n"
                    "{\"tokens\": [5, 6], \"old_log_probs\": [-1, -1], \"rollout_log_probs\": [-2, -0.5], "
                    "\"mask\": [1, 1], \"prompt_len\": 0}\n"), "write");
    CHECK(write_str(tmp("k_b.jsonl"),
                    "{\"tokens\": [1, 2, 3, 4], \"logprobs\": [null, -2.5, NaN, -3], \"prompt_len\": 1}\n"
                    "{\"tokens\": [5, 6], \"logprobs\": [-2, -0.5], \"prompt_len\": 0}\n"), "write");
    xent__cmp_cfg c = cfg_default(tmp("k_a.jsonl"), tmp("k_b.jsonl"));
    c.key_a = "old_log_probs";
    c.json = tmp("k.json");
    c.opts.bootstrap = 0;
    CHECK(xent__cmp_run(&c) == 0, "run: %s", xent_last_error());
    long long used;
    double mean = json_mean_delta(tmp("k.json"), &used);
    CHECK(used == 4 && fabs(mean) < 1e-15, "A's mask and B's prompt_len: used %lld, mean %g", used, mean);
    /* the same file on both sides, two keys */
    c = cfg_default(tmp("k_a.jsonl"), tmp("k_a.jsonl"));
    c.key_a = "old_log_probs";
    c.key_b = "rollout_log_probs";
    c.json = tmp("k2.json");
    c.opts.bootstrap = 0;
    CHECK(xent__cmp_run(&c) == 0, "run: %s", xent_last_error());
    mean = json_mean_delta(tmp("k2.json"), &used);
    CHECK(used == 4 && fabs(mean) < 1e-15, "one file, --key-a/--key-b: used %lld, mean %g", used, mean);
    /* without the mask, B's NaN at index 2 is selected and refused */
    CHECK(write_str(tmp("k_a2.jsonl"),
                    "{\"tokens\": [1, 2, 3, 4], \"old_log_probs\": [-1, -2, -3, -4], \"prompt_len\": 1}\n"
                    "{\"tokens\": [5, 6], \"old_log_probs\": [-1, -1], \"prompt_len\": 0}\n"), "write");
    c = cfg_default(tmp("k_a2.jsonl"), tmp("k_b.jsonl"));
    c.key_a = "old_log_probs";
    c.opts.bootstrap = 0;
    CHECK(xent__cmp_run(&c) == 1, "the NaN outside any mask is refused");
    /* a missing key through the whole run: the flag, the key, the file and line */
    c = cfg_default(tmp("k_a.jsonl"), tmp("k_b.jsonl"));
    c.key_a = "old_log_probs";
    c.key_b = "rollout_log_probs";
    run_fails(&c, "k_b.jsonl:1: --key-b rollout_log_probs: the object has no \"rollout_log_probs\"",
              __LINE__);
    /* a mask that selects nothing */
    CHECK(write_str(tmp("k_z.jsonl"), "{\"logprobs\": [-1, -2], \"mask\": [0, 0]}\n"), "write");
    CHECK(write_str(tmp("k_z2.jsonl"), "{\"logprobs\": [-1, -3]}\n"), "write");
    c = cfg_default(tmp("k_z.jsonl"), tmp("k_z2.jsonl"));
    CHECK(xent__cmp_run(&c) == 1, "an all-zero mask: nothing to compare, exit 1");
}

TEST(compare_jsonl_keys_cli) {
    const char *exe = xt_xent_bin();
    if (!exe) { xt_skip("xent binary not built"); return; }
    static char out[1 << 16];
    char cmd[8192];
    CHECK(write_str(tmp("kc_a.jsonl"),
                    "{\"logprobs\": [-1, -2], \"processed_logprobs\": [-0.5, -1.5], \"mask\": [1, 1]}\n"), "write");
    CHECK(write_str(tmp("kc_b.txt"), "-1\n-2\n"), "write");
    struct { const char *args; int rc; const char *want; } cases[] = {
        {"--key-a processed_logprobs", 0, "delta = A - B"},
        {"--key-a nope", 1, "kc_a.jsonl:1: --key-a nope: the object has no \"nope\" (its keys: \"logprobs\", "
                            "\"processed_logprobs\", \"mask\")"},
        {"--key-b logprobs", 2, "--key-b 'logprobs' names a JSON Lines key, but B ("},
        {"--key-a tokens", 2, "--key-a 'tokens': that key has its own meaning"},
        {"--key-a mask", 2, "--key-a 'mask' is the mask's key (--key-mask)"},
        {"--key-mask logprobs", 2, "--key-mask 'logprobs' is a log-prob key"},
        {"--key-a ''", 2, "--key-a expects a non-empty value"},
        {"--key-a=kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
         "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
         "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", 2, "--key-a expects a JSON key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd, "%s compare %s %s --bootstrap 0 %s 2>&1", exe, tmp("kc_a.jsonl"),
                 tmp("kc_b.txt"), cases[i].args);
        int rc = sh(cmd, out, sizeof out);
        CHECK(rc == cases[i].rc && strstr(out, cases[i].want), "%s: exit %d (want %d): %.600s", cases[i].args,
              rc, cases[i].rc, out);
    }
    snprintf(cmd, sizeof cmd, "%s compare %s %s --key-mask m 2>&1", exe, tmp("kc_b.txt"), tmp("kc_b.txt"));
    CHECK(sh(cmd, out, sizeof out) == 2 && strstr(out, "--key-mask 'm' names a JSON Lines key, but no input"),
          "--key-mask with no JSON input: %s", out);
    snprintf(cmd, sizeof cmd, "%s compare --help 2>&1", exe);
    CHECK(sh(cmd, out, sizeof out) == 0 && strstr(out, "--key-a NAME") && strstr(out, "--key-b NAME") &&
          strstr(out, "--key-mask NAME"), "--help lists the key flags");
}
