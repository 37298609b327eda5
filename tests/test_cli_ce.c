/* tests/test_cli_ce.c: `xent ce` end to end. Runs the xent binary that sits
 * next to this test binary on small random files and checks every output
 * bitwise against xent_ce called directly with the same options; checks the
 * exit codes (0 ok, 1 bad input, 2 usage) and that --help lists each flag
 * with its default. */
#include "harness.h"
#include "xent.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `xent ARGS > dir/stdout 2> dir/stderr`; returns the exit code. */
static int run_xent(const char *dir, const char *args) {
    const char *bin = xt_xent_bin();
    if (!bin) return -1;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s/stdout' 2> '%s/stderr'", bin, args, dir, dir);
    int rc = system(cmd);
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

/* Contents of dir/name (malloc'ed, NUL-terminated) or "" on failure. */
static char *slurp(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    char *s = calloc(1, 65536);
    if (f && s) {
        size_t n = fread(s, 1, 65535, f);
        s[n] = '\0';
    }
    if (f) fclose(f);
    return s;
}

static void cleanup(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* Random logits [B, S, V] (ndim 3) or [T, V] and labels with ignored rows. */
static void make_inputs(xent_tensor *lg, xent_tensor *lb, xent_dtype dt, int ndim, int64_t T, int64_t V) {
    xt_rng_t *r = xt_rng();
    memset(lg, 0, sizeof *lg);
    memset(lb, 0, sizeof *lb);
    strcpy(lg->name, "logits");
    strcpy(lb->name, "labels");
    lg->dtype = dt;
    lg->ndim = ndim;
    if (ndim == 3) { lg->shape[0] = 2; lg->shape[1] = T / 2; }
    else lg->shape[0] = T;
    lg->shape[ndim - 1] = V;
    lg->nbytes = (size_t)(T * V) * xent_dtype_size(dt);
    lg->data = malloc(lg->nbytes);
    for (int64_t i = 0; i < T * V; i++) {
        float x = (float)(4.0 * xt_normal(r));
        if (dt == XENT_F32) ((float *)lg->data)[i] = x;
        else if (dt == XENT_BF16) ((uint16_t *)lg->data)[i] = xent_f32_to_bf16(x);
        else ((uint16_t *)lg->data)[i] = xent_f32_to_f16(x);
    }
    lb->dtype = XENT_I64;
    lb->ndim = 1;
    lb->shape[0] = T;
    lb->nbytes = (size_t)T * 8;
    lb->data = malloc(lb->nbytes);
    for (int64_t i = 0; i < T; i++)
        ((int64_t *)lb->data)[i] = i % 5 == 3 ? -100 : xt_randint(r, V);
}

/* Loads tensor NAME of the output and compares it bitwise with want. */
static void expect_tensor(const char *out, const char *name, const void *want, size_t nbytes,
                          xent_dtype dt) {
    char spec[1200];
    snprintf(spec, sizeof spec, "%s:%s", out, name);
    xent_tensor t;
    xent_status st = xent_tensor_load(spec, &t);
    CHECK(st == XENT_OK, "load %s: %s", spec, xent_last_error());
    if (st) return;
    CHECK(t.dtype == dt && t.nbytes == nbytes, "%s: dtype %s, %zu bytes; want %s, %zu", name,
          xent_dtype_name(t.dtype), t.nbytes, xent_dtype_name(dt), nbytes);
    CHECK(t.nbytes != nbytes || !memcmp(t.data, want, nbytes), "%s differs from xent_ce", name);
    xent_tensor_free(&t);
}

typedef struct cli_case {
    xent_dtype dt;
    int ndim;
    const char *ext;       /* output extension                           */
    const char *flags;     /* option flags passed to xent ce              */
    xent_reduction red;    /* the same options for the direct call        */
    double temperature, softcap, z_loss, smoothing, grad_scale;
    xent_dtype grad_dt;
} cli_case;

static void run_case(const cli_case *c) {
    char dir[64] = "/tmp/xent_cli_XXXXXX", in[256], out[256], args[2048];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    int64_t T = 10, V = 37;
    xent_tensor ts[2];
    make_inputs(&ts[0], &ts[1], c->dt, c->ndim, T, V);
    snprintf(in, sizeof in, "%s/in.safetensors", dir);
    snprintf(out, sizeof out, "%s/out%s", dir, c->ext);
    CHECK(xent_tensors_save(in, ts, 2) == XENT_OK, "save: %s", xent_last_error());
    snprintf(args, sizeof args, "ce --logits '%s:logits' --labels '%s:labels' --out '%s' --grad --entropy %s",
             in, in, out, c->flags);
    int rc = run_xent(dir, args);
    char *err = slurp(dir, "stderr"), *so = slurp(dir, "stdout");
    CHECK(rc == 0, "xent %s: exit %d: %s", args, rc, err);
    CHECK(strstr(so, "T=10 V=37") && strstr(so, "counted=8") && strstr(so, "nonfinite=0"),
          "summary line: %s", so);
    /* the direct call */
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    o.reduction = c->red;
    o.temperature = c->temperature;
    o.softcap = c->softcap;
    o.z_loss = c->z_loss;
    o.label_smoothing = c->smoothing;
    o.grad_scale = c->grad_scale;
    size_t es = xent_dtype_size(c->grad_dt);
    float *loss = malloc((size_t)T * 4), *nll = malloc((size_t)T * 4), *lp = malloc((size_t)T * 4);
    float *lse = malloc((size_t)T * 4), *ent = malloc((size_t)T * 4);
    void *grad = malloc((size_t)(T * V) * es);
    xt_poison(grad, (size_t)(T * V) * es);
    xt_poison(nll, (size_t)T * 4);
    xent_ce_input ci = {ts[0].data, c->dt, T, V, 0, ts[1].data, XENT_I64, NULL};
    xent_ce_output co = {loss, nll, lp, lse, ent, NULL, grad, c->grad_dt, 0, NULL, NULL};
    CHECK(xent_ce(&ci, &o, &co) == XENT_OK, "xent_ce: %s", xent_last_error());
    size_t nl = c->red == XENT_REDUCE_NONE ? (size_t)T * 4 : 4;
    expect_tensor(out, "loss", loss, nl, XENT_F32);
    expect_tensor(out, "nll", nll, (size_t)T * 4, XENT_F32);
    expect_tensor(out, "logprob", lp, (size_t)T * 4, XENT_F32);
    expect_tensor(out, "lse", lse, (size_t)T * 4, XENT_F32);
    expect_tensor(out, "entropy", ent, (size_t)T * 4, XENT_F32);
    int npy_bf16 = !strcmp(c->ext, ".npy") && c->grad_dt == XENT_BF16;
    if (!npy_bf16) expect_tensor(out, "grad", grad, (size_t)(T * V) * es, c->grad_dt);
    /* shapes follow the logits: [2, 5] per-row outputs for [2, 5, V] logits */
    char spec[400];
    snprintf(spec, sizeof spec, "%s:nll", out);
    xent_tensor t;
    if (xent_tensor_load(spec, &t) == XENT_OK) {
        CHECK(t.ndim == c->ndim - 1 && t.shape[t.ndim - 1] == (c->ndim == 3 ? T / 2 : T), "nll shape");
        xent_tensor_free(&t);
    }
    free(loss); free(nll); free(lp); free(lse); free(ent); free(grad); free(err); free(so);
    xent_tensor_free(&ts[0]);
    xent_tensor_free(&ts[1]);
    cleanup(dir);
}

TEST(cli_ce_matches_library_bitwise) {
    if (!xt_xent_bin()) { xt_skip("build/xent not built"); return; }
    const cli_case cases[] = {
        {XENT_F32, 2, ".safetensors", "", XENT_REDUCE_MEAN, 1, 0, 0, 0, 1, XENT_F32},
        {XENT_BF16, 3, ".safetensors",
         "--reduction sum --temperature 0.7 --softcap 20 --z-loss 1e-3 --label-smoothing 0.1 --grad-scale 0.5 "
         "--threads 2",
         XENT_REDUCE_SUM, 0.7, 20, 1e-3, 0.1, 0.5, XENT_BF16},
        {XENT_F16, 2, ".npy", "--reduction none --grad-dtype f32", XENT_REDUCE_NONE, 1, 0, 0, 0, 1, XENT_F32},
        {XENT_BF16, 2, ".npy", "--reduction mean --threads 1", XENT_REDUCE_MEAN, 1, 0, 0, 0, 1, XENT_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

TEST(cli_ce_exit_codes_and_help) {
    if (!xt_xent_bin()) { xt_skip("build/xent not built"); return; }
    char dir[64] = "/tmp/xent_cli_XXXXXX", in[256], args[1024];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(run_xent(dir, "ce --help") == 0, "--help exits 0");
    char *help = slurp(dir, "stdout");
    const char *flags[] = {"--logits", "--labels", "--out", "--grad ", "--grad-dtype", "--entropy",
                           "--ignore-index", "--reduction", "--normalizer", "--temperature", "--softcap",
                           "--z-loss", "--label-smoothing", "--grad-scale", "--threads"};
    const char *opts = strstr(help, "\n  --"); /* the option list */
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const char *p = opts ? strstr(opts, flags[i]) : NULL;
        char line[512] = "";
        if (p) {
            size_t n = strcspn(p, "\n");
            n = n < sizeof line - 1 ? n : sizeof line - 1;
            memcpy(line, p, n);
            line[n] = '\0';
        }
        CHECK(strstr(line, "(default") || strstr(line, "(required)"), "--help lacks '%s' with its default",
              flags[i]);
    }
    free(help);
    CHECK(run_xent(dir, "ce --labels x.npy --out o.npy") == 2, "missing --logits is a usage error");
    CHECK(run_xent(dir, "ce --logits a --labels b --out o.npy --reduction avg") == 2, "bad --reduction");
    CHECK(run_xent(dir, "ce --logits a --labels b --out o.txt") == 2, "bad --out extension");
    CHECK(run_xent(dir, "ce --logits a --labels b --out o.npy --temperature x") == 2, "bad number");
    char *e2 = slurp(dir, "stderr");
    CHECK(strstr(e2, "--temperature") && strstr(e2, "'x'") && !strstr(e2, "opts."),
          "the message names the flag and the value: %s", e2);
    free(e2);
    CHECK(run_xent(dir, "ce --logits a --labels b --out o.npy --label-smoothing=2") == 2, "range");
    e2 = slurp(dir, "stderr");
    CHECK(strstr(e2, "--label-smoothing expects a number in [0, 1], got '2'") != NULL, "%s", e2);
    free(e2);
    CHECK(run_xent(dir, "ce --bogus") == 2, "unknown flag");
    snprintf(args, sizeof args, "ce --logits '%s/none.npy' --labels b.npy --out '%s/o.npy'", dir, dir);
    CHECK(run_xent(dir, args) == 1, "missing file exits 1");
    char *err = slurp(dir, "stderr");
    CHECK(strstr(err, "--logits") && strstr(err, "none.npy"), "stderr names the file: %s", err);
    free(err);
    /* a label outside [0, V) */
    xent_tensor ts[2];
    make_inputs(&ts[0], &ts[1], XENT_F32, 2, 6, 11);
    ((int64_t *)ts[1].data)[4] = 11;
    snprintf(in, sizeof in, "%s/in.safetensors", dir);
    CHECK(xent_tensors_save(in, ts, 2) == XENT_OK, "save");
    snprintf(args, sizeof args, "ce --logits '%s:logits' --labels '%s:labels' --out '%s/o.safetensors'", in, in,
             dir);
    CHECK(run_xent(dir, args) == 1, "bad label exits 1");
    err = slurp(dir, "stderr");
    CHECK(strstr(err, "labels[4]") != NULL && strstr(err, "in.safetensors") != NULL,
          "stderr names the label and file: %s", err);
    free(err);
    /* labels of the wrong length */
    snprintf(args, sizeof args, "ce --logits '%s:logits' --labels '%s:logits' --out '%s/o.npy'", in, in, dir);
    CHECK(run_xent(dir, args) == 1, "float labels exit 1");
    xent_tensor_free(&ts[0]);
    xent_tensor_free(&ts[1]);
    cleanup(dir);
}

/* `xent logprobs`: every output bitwise equal to xent_sampler_logprobs with
 * the same options, and the summary line's counts. */
TEST(cli_logprobs_matches_library_bitwise) {
    if (!xt_xent_bin()) { xt_skip("build/xent not built"); return; }
    const struct { xent_dtype dt; int ndim; const char *ext, *flags; double temp, top_p, min_p; int64_t k; } cases[] = {
        {XENT_F32, 2, ".safetensors", "--top-p 0.8 --temperature 0.7", 0.7, 0.8, 0, 0},
        {XENT_BF16, 3, ".npy", "--top-k 4 --min-p 0.02 --top-p 0.95 --threads 2", 1, 0.95, 0.02, 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dir[64] = "/tmp/xent_cli_XXXXXX", in[256], out[256], args[2048];
        CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        int64_t T = 10, V = 37;
        xent_tensor ts[2];
        make_inputs(&ts[0], &ts[1], cases[c].dt, cases[c].ndim, T, V);
        snprintf(in, sizeof in, "%s/in.safetensors", dir);
        snprintf(out, sizeof out, "%s/out%s", dir, cases[c].ext);
        CHECK(xent_tensors_save(in, ts, 2) == XENT_OK, "save: %s", xent_last_error());
        snprintf(args, sizeof args, "logprobs --logits '%s:logits' --labels '%s:labels' --out '%s' %s", in, in,
                 out, cases[c].flags);
        int rc = run_xent(dir, args);
        char *err = slurp(dir, "stderr"), *so = slurp(dir, "stdout");
        CHECK(rc == 0, "xent %s: exit %d: %s", args, rc, err);
        xent_sampler_opts o;
        xent_sampler_opts_init(&o);
        o.temperature = cases[c].temp;
        o.top_p = cases[c].top_p;
        o.min_p = cases[c].min_p;
        o.top_k = cases[c].k;
        float lp[10], full[10], lkm[10], ent[10];
        int64_t kept[10], counted = 0, dropped = 0, amb = 0, nonfin = 0;
        int32_t flags[10];
        xent_ce_input ci = {ts[0].data, cases[c].dt, T, V, 0, ts[1].data, XENT_I64, NULL};
        xent_sampler_output so2 = {lp, full, kept, lkm, ent, flags, &counted, &dropped, &amb, &nonfin};
        CHECK(xent_sampler_logprobs(&ci, &o, &so2) == XENT_OK, "%s", xent_last_error());
        expect_tensor(out, "logprob", lp, sizeof lp, XENT_F32);
        expect_tensor(out, "logprob_full", full, sizeof full, XENT_F32);
        expect_tensor(out, "kept", kept, sizeof kept, XENT_I64);
        expect_tensor(out, "log_kept_mass", lkm, sizeof lkm, XENT_F32);
        expect_tensor(out, "entropy", ent, sizeof ent, XENT_F32);
        expect_tensor(out, "flags", flags, sizeof flags, XENT_I32);
        char want[128];
        snprintf(want, sizeof want, "counted=%lld dropped=%lld ambiguous=%lld nonfinite=0", (long long)counted,
                 (long long)dropped, (long long)amb);
        CHECK(strstr(so, want) != NULL, "summary '%s' lacks '%s'", so, want);
        free(err);
        free(so);
        xent_tensor_free(&ts[0]);
        xent_tensor_free(&ts[1]);
        cleanup(dir);
    }
}
