/* tests/test_model.c: the Llama-family model: GGUF / safetensors loaders,
 * dequantization, hostile GGUF files, and forward/backward checked by
 * central finite differences in double precision on a tiny random model. */
#include "harness.h"
#include "model/gguf.h"
#include "model/model_internal.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------ */

/* Tiny model: 2 layers, dim 16, 2 heads of 8, 1 kv head, hidden 24, vocab
 * 64, random weights; norms near 1. */
static xent_model *tiny_model(int tied, int bias, const char *arch) {
    xent_model_config c;
    xent_model_config_init(&c);
    snprintf(c.arch, sizeof c.arch, "%s", arch);
    c.n_layers = 2, c.dim = 16, c.hidden = 24, c.n_heads = 2;
    c.n_kv_heads = 1, c.head_dim = 8, c.vocab = 64, c.max_seq = 64;
    c.rope_theta = 10000.0, c.norm_eps = 1e-5;
    c.tied_head = tied, c.qkv_bias = bias;
    xent_model *m = NULL;
    if (xent_model_new(&c, &m)) return NULL;
    xt_rng_t *r = xt_rng();
    for (int i = 0; i < m->n_params; i++) {
        xent_param *p = &m->params[i];
        double sd = p->ndim == 2 ? 1.0 / sqrt((double)p->shape[1]) : 0.1;
        int is_norm = strstr(p->name, "norm") != NULL;
        for (int64_t k = 0; k < p->numel; k++)
            p->w[k] = (float)((is_norm ? 1.0 : 0.0) + sd * xt_normal(r));
    }
    return m;
}

static void random_tokens(int32_t *t, int64_t n, int64_t V) {
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)xt_randint(xt_rng(), V);
}

/* Double copies of the weights: w[i] -> [numel]. */
static double **weights_f64(const xent_model *m) {
    double **w = calloc((size_t)m->n_params, sizeof *w);
    for (int i = 0; w && i < m->n_params; i++) {
        w[i] = malloc((size_t)m->params[i].numel * sizeof(double));
        for (int64_t k = 0; k < m->params[i].numel; k++)
            w[i][k] = m->params[i].w[k];
    }
    return w;
}

static void free_ptrs(void **p, int n) {
    for (int i = 0; p && i < n; i++) free(p[i]);
    free(p);
}

static int read_all(const char *path, uint8_t **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)l);
    *n = *buf ? fread(*buf, 1, (size_t)l, f) : 0;
    fclose(f);
    return !*buf || *n != (size_t)l;
}

/* ---- finite differences ------------------------------------------------- */

/* Central differences, in double, of the loss with respect to entries of
 * every parameter, against the analytic gradient of the double model.
 * Error bound of (L(w+h) - L(w-h)) / 2h: truncation h^2/6 |L'''| plus
 * rounding 2 eps |L| / h. With h = 1e-5, |L| ~ 4, |L'''| < 100 on this model:
 * <= 1.7e-9 + 1.8e-10; the check allows 1e-7 + 1e-6 |g| (over 50x). */
static void fd_check(xent_model *m, const xent_model_run_opts *o, int stride) {
    double **w = weights_f64(m), **g = (double **)weights_f64(m);
    double loss = 0;
    xent_status st = xent_model_run_f64_w(m, (const double *const *)w, o,
                                          &loss, g, NULL);
    CHECK(st == XENT_OK, "run_f64: %s", xent_last_error());
    CHECK(isfinite(loss), "loss %g", loss);
    const double h = 1e-5;
    int64_t checked = 0;
    double worst = 0;
    for (int i = 0; i < m->n_params && !st; i++) {
        int64_t n = m->params[i].numel;
        int64_t start = xt_randint(xt_rng(), stride);
        for (int64_t k = start; k < n; k += stride) {
            double w0 = w[i][k], lp = 0, lm = 0;
            w[i][k] = w0 + h;
            xent_model_run_f64_w(m, (const double *const *)w, o, &lp, NULL,
                                 NULL);
            w[i][k] = w0 - h;
            xent_model_run_f64_w(m, (const double *const *)w, o, &lm, NULL,
                                 NULL);
            w[i][k] = w0;
            double fd = (lp - lm) / (2 * h), an = g[i][k];
            double err = fabs(fd - an), tol = 1e-7 + 1e-6 * fabs(an);
            worst = err / tol > worst ? err / tol : worst;
            CHECK(err <= tol, "%s[%lld]: fd %.12g vs analytic %.12g",
                  m->params[i].name, (long long)k, fd, an);
            CHECK_LIMIT(10);
            checked++;
        }
    }
    CHECK(checked > 0, "nothing checked");
    printf("    fd: %lld entries, worst error / tolerance %.3g\n",
           (long long)checked, worst);
    free_ptrs((void **)w, m->n_params);
    free_ptrs((void **)g, m->n_params);
}

TEST(model_grad_fd_untied) {
    xent_model *m = tiny_model(0, 0, "llama");
    CHECK(m != NULL, "model");
    int32_t tok[10];
    random_tokens(tok, 10, 64);
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = 2, o.S = 5, o.tokens = tok;
    fd_check(m, &o, xt_sanitizer() ? 7 : 1);
    xent_model_free(m);
}

TEST(model_grad_fd_tied_bias_advantages) {
    xent_model *m = tiny_model(1, 1, "qwen2");
    CHECK(m != NULL, "model");
    int32_t tok[12];
    float adv[12];
    random_tokens(tok, 12, 64);
    for (int i = 0; i < 12; i++) adv[i] = (float)xt_normal(xt_rng());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = 3, o.S = 4, o.tokens = tok, o.advantages = adv;
    fd_check(m, &o, xt_sanitizer() ? 7 : 1);
    xent_model_free(m);
}

/* dL/d(embedding output) against dL/dE: with an untied head, the gradient
 * of embedding row v is the sum of the input gradients at positions of v. */
TEST(model_input_grad_matches_embedding_grad) {
    xent_model *m = tiny_model(0, 0, "llama");
    int32_t tok[12];
    random_tokens(tok, 12, 64);
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = 2, o.S = 6, o.tokens = tok;
    double **g = (double **)weights_f64(m), loss;
    double *eg = malloc(12 * 16 * sizeof(double)); /* [T, D] */
    xt_poison(eg, 12 * 16 * sizeof(double));
    CHECK(xent_model_run_f64(m, &o, &loss, g, eg) == XENT_OK, "%s",
          xent_last_error());
    for (int v = 0; v < 64; v++)
        for (int d = 0; d < 16; d++) {
            double s = 0;
            for (int t = 0; t < 12; t++)
                if (tok[t] == v) s += eg[t * 16 + d];
            /* same additions in the same order: equal up to reassociation
             * of at most 12 terms: 12 eps |s| */
            CHECK(fabs(s - g[0][v * 16 + d]) <= 12 * 2.3e-16 * (fabs(s) + 1e-300) + 1e-300,
                  "dE[%d][%d] %.17g vs %.17g", v, d, g[0][v * 16 + d], s);
            CHECK_LIMIT(5);
        }
    free(eg);
    free_ptrs((void **)g, m->n_params);
    xent_model_free(m);
}

/* ---- fp32 against double ------------------------------------------------- */

static double rel_rms(const float *a, const double *b, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        e += d * d;
        r += b[i] * b[i];
    }
    return isfinite(e) ? sqrt(e / (r > 0 ? r : 1e-300)) : INFINITY;
}

/* The fp32 run against the double model. Bound: every stored value carries
 * relative error <= gamma_K = K u / (1 - K u) from its dot product (K <= 64,
 * u = 2^-24: 3.8e-6), and the backward chain has ~40 such stages on this
 * model (2 x (2 layers x 8 + 4)): first order <= 1.5e-4; allow 2e-4. */
TEST(model_fp32_matches_f64) {
    xent_model *m = tiny_model(1, 0, "llama");
    int64_t B = 2, S = 8, T = B * S;
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    random_tokens(tok, T, 64);
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, B, S, 1, &ws) == XENT_OK, "%s",
          xent_last_error());
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s",
          xent_last_error());
    double **g = (double **)weights_f64(m), loss = 0;
    double *eg = malloc((size_t)(T * 16) * sizeof(double));
    CHECK(xent_model_run_f64(m, &o, &loss, g, eg) == XENT_OK, "%s",
          xent_last_error());
    CHECK(fabs(r.loss - loss) <= 2e-4 * fabs(loss), "loss %.9g vs %.9g",
          r.loss, loss);
    CHECK(r.n_counted == B * (S - 1), "n_counted %lld", (long long)r.n_counted);
    for (int i = 0; i < m->n_params; i++) {
        double e = rel_rms(r.param_grads[i], g[i], m->params[i].numel);
        CHECK(e <= 2e-4, "%s: relative RMS %.3g", m->params[i].name, e);
    }
    CHECK(rel_rms(r.embed_grad, eg, T * 16) <= 2e-4, "embed grad");
    /* record: layer 0's input gradient is the embeddings-output gradient,
     * the last layer's output feeds the final norm, logprobs match */
    CHECK(!memcmp(r.layer_in_grad[0], r.embed_grad, (size_t)(T * 16) * 4),
          "layer_in_grad[0] != embed_grad");
    double s = 0;
    for (int64_t t = 0; t < T; t++) s -= (t % S == S - 1) ? 0 : r.logprobs[t];
    CHECK(fabs(s / (double)r.n_counted - r.loss) <= 1e-6 * r.loss,
          "mean -logprob %.9g vs loss %.9g", s / (double)r.n_counted, r.loss);
    CHECK(r.logits && r.dlogits && r.final_norm_out && r.layer_out[1],
          "record pointers");
    /* dlogits rows sum to 0 (softmax minus one-hot, scaled) */
    for (int64_t t = 0; t < T; t++) {
        double z = 0, a = 0;
        for (int v = 0; v < 64; v++)
            z += r.dlogits[t * 64 + v], a += fabs(r.dlogits[t * 64 + v]);
        CHECK(fabs(z) <= 64 * 1.2e-7 * a + 1e-12, "dlogits row %lld sums to %g",
              (long long)t, z);
    }
    free(eg);
    free(tok);
    free_ptrs((void **)g, m->n_params);
    xent_model_ws_free(ws);
    xent_model_free(m);
}

/* Micro-batches: the same gradients up to fp32 summation order (bound as
 * above: one extra addition per element: 2 u relative); advantages = 1 give
 * the cross-entropy loss. */
TEST(model_micro_batches_and_advantages) {
    xent_model *m = tiny_model(0, 0, "llama");
    int64_t B = 4, S = 6, T = B * S;
    int32_t tok[24];
    float ones[24];
    random_tokens(tok, T, 64);
    for (int i = 0; i < 24; i++) ones[i] = 1.0f;
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, B, S, 0, &ws) == XENT_OK, "%s",
          xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s",
          xent_last_error());
    int64_t nw = xent_model_n_weights(m);
    float *g1 = malloc((size_t)nw * 4);
    memcpy(g1, r.param_grads[0], (size_t)nw * 4); /* grads are contiguous */
    double l1 = r.loss;
    p.micro_batches = 2;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s",
          xent_last_error());
    CHECK(fabs(r.loss - l1) <= 1e-6 * l1, "loss %.9g vs %.9g", r.loss, l1);
    double e = 0, n2 = 0;
    for (int64_t i = 0; i < nw; i++) {
        double d = r.param_grads[0][i] - g1[i];
        e += d * d, n2 += (double)g1[i] * g1[i];
    }
    CHECK(sqrt(e / n2) <= 1e-5, "micro-batch grads rel RMS %.3g", sqrt(e / n2));
    p.micro_batches = 3;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_ERR_SHAPE,
          "micro_batches 3 of B 4 accepted");
    p.micro_batches = 1;
    o.advantages = ones;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s",
          xent_last_error());
    CHECK(r.loss == l1, "advantages 1: loss %.9g vs %.9g", r.loss, l1);
    free(g1);
    xent_model_ws_free(ws);
    xent_model_free(m);
}

/* Under compute = bf16 every recorded activation is a bf16 value. */
TEST(model_bf16_policy_stores_bf16) {
    xent_model *m = tiny_model(1, 0, "llama");
    int64_t B = 2, S = 8, T = B * S;
    int32_t tok[16];
    random_tokens(tok, T, 64);
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, B, S, 1, &ws) == XENT_OK, "%s",
          xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    xent_precision p = xent_precision_fp32();
    p.compute = p.residual = p.norm = p.attn_softmax = p.logits = XENT_BF16;
    p.lm_head = XENT_BF16;
    xent_model_record r;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s",
          xent_last_error());
    const float *arrs[] = {r.embed_out, r.layer_out[0], r.layer_out[1],
                           r.final_norm_out, r.logits, r.layer_in_grad[1]};
    int64_t lens[] = {T * 16, T * 16, T * 16, T * 16, T * 64, T * 16};
    for (int a = 0; a < 6; a++)
        for (int64_t i = 0; i < lens[a]; i++) {
            float v = arrs[a][i];
            CHECK(xent_bf16_to_f32(xent_f32_to_bf16(v)) == v && isfinite(v),
                  "array %d [%lld] = %.9g is not bf16", a, (long long)i, v);
            CHECK_LIMIT(5);
        }
    CHECK(isfinite(r.loss) && r.loss > 0, "loss %g", r.loss);
    xent_model_ws_free(ws);
    xent_model_free(m);
}

/* The products on the GPU (gemm_device = 1, xent audit --device cuda)
 * against OpenBLAS on the same stored values. fp32 policy: both are fp32
 * sums of the same products in different orders (|error| <= K u sum|a b|
 * each, K <= 64 here): loss and gradients within 2e-5 relative. bf16
 * policy: the accumulation order moves a stored value across a bf16
 * rounding boundary now and then (one bf16 ulp, 2^-8 relative), and that
 * propagates: the loss within 1e-2 relative, every stored array still
 * bf16. Two bf16 runs that differ only in accumulation order differ by
 * about the bf16 error itself (1-10% on gradients, docs/audit.md), so the
 * gradients are only held to 0.1 relative RMS: enough to catch a wrong
 * product (a transposed or mistyped operand gives O(1)). Without a GPU the
 * run fails with a clear status and message. */
TEST(model_gpu_products_match_cpu) {
    xent_model *m = tiny_model(1, 0, "llama");
    int64_t B = 2, S = 8, T = B * S;
    int32_t tok[16];
    random_tokens(tok, T, 64);
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, B, S, 1, &ws) == XENT_OK, "%s", xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    if (xent_cuda_device_count() < 1) {
        o.gemm_device = 1;
        xent_status st = xent_model_run(m, ws, &p, &o, &r);
        CHECK(st == XENT_ERR_UNSUPPORTED || st == XENT_ERR_CUDA, "status %d", (int)st);
        CHECK(strstr(xent_last_error(), "model products") ||
              strstr(xent_last_error(), "device cuda"), "message: %s", xent_last_error());
        xt_skip("no CUDA device: the GPU products were not compared");
        xent_model_ws_free(ws);
        xent_model_free(m);
        return;
    }
    int64_t nw = xent_model_n_weights(m);
    float *g0 = malloc((size_t)nw * sizeof(float));
    for (int pol = 0; pol < 2; pol++) {
        if (pol == 1) {
            p.compute = p.residual = p.norm = p.attn_softmax = p.logits = XENT_BF16;
            p.lm_head = XENT_BF16;
        }
        o.gemm_device = 0;
        CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s", xent_last_error());
        double l0 = r.loss;
        int64_t off = 0;
        for (int i = 0; i < m->n_params; off += m->params[i].numel, i++)
            memcpy(g0 + off, r.param_grads[i], (size_t)m->params[i].numel * sizeof(float));
        o.gemm_device = 1;
        CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s", xent_last_error());
        double tol = pol ? 1e-2 : 2e-5;
        CHECK(fabs(r.loss - l0) <= tol * fabs(l0), "policy %d: loss %.9g (GPU) vs %.9g",
              pol, r.loss, l0);
        off = 0;
        for (int i = 0; i < m->n_params; off += m->params[i].numel, i++) {
            double num = 0, den = 0;
            for (int64_t k = 0; k < m->params[i].numel; k++) {
                double d = (double)r.param_grads[i][k] - g0[off + k];
                num += d * d;
                den += (double)g0[off + k] * g0[off + k];
            }
            double e = den > 0 ? sqrt(num / den) : sqrt(num);
            printf("    policy %s: %s gradient, GPU vs CPU products: relative RMS %.3g\n",
                   pol ? "bf16" : "fp32", m->params[i].name, e);
            CHECK(e <= (pol ? 0.1 : 2e-5) && e == e, "policy %d: %s: relative RMS %.3g", pol,
                  m->params[i].name, e);
        }
        if (pol == 1)
            for (int64_t i = 0; i < T * 64; i++) {
                float v = r.logits[i];
                CHECK(xent_bf16_to_f32(xent_f32_to_bf16(v)) == v, "logit %lld not bf16",
                      (long long)i);
                CHECK_LIMIT(5);
            }
    }
    free(g0);
    xent_model_ws_free(ws);
    xent_model_free(m);
}

/* ---- loaders -------------------------------------------------------------- */

static char *tmpdir(void) {
    static char buf[64];
    snprintf(buf, sizeof buf, "/tmp/xent_model_XXXXXX");
    return mkdtemp(buf);
}

static void rm_dir(const char *d) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    CHECK(system(cmd) == 0, "rm");
}

static int same_weights(const xent_model *a, const xent_model *b) {
    if (a->n_params != b->n_params) return 0;
    for (int i = 0; i < a->n_params; i++)
        if (strcmp(a->params[i].name, b->params[i].name) ||
            a->params[i].numel != b->params[i].numel ||
            memcmp(a->params[i].w, b->params[i].w,
                   (size_t)a->params[i].numel * 4))
            return 0;
    return 1;
}

static double run_loss(const xent_model *m, const int32_t *tok, int64_t B,
                       int64_t S) {
    xent_model_ws *ws = NULL;
    if (xent_model_ws_new(m, B, S, 0, &ws)) return NAN;
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    double l = xent_model_run(m, ws, &p, &o, &r) ? NAN : r.loss;
    xent_model_ws_free(ws);
    return l;
}

TEST(model_gguf_and_safetensors_roundtrip) {
    const char *arch[] = {"llama", "qwen2"};
    for (int a = 0; a < 2; a++) {
        xent_model *m = tiny_model(a, a, arch[a]);
        char *d = tmpdir();
        CHECK(d != NULL, "mkdtemp");
        if (!d) return;
        char gg[128], hf[128], hb[128];
        snprintf(gg, sizeof gg, "%s/tiny.gguf", d);
        snprintf(hf, sizeof hf, "%s/hf", d);
        snprintf(hb, sizeof hb, "%s/hf_bf16", d);
        CHECK(xent_model_save_gguf(m, gg) == XENT_OK, "%s", xent_last_error());
        CHECK(xent_model_save_hf(m, hf, XENT_F32) == XENT_OK, "%s",
              xent_last_error());
        CHECK(xent_model_save_hf(m, hb, XENT_BF16) == XENT_OK, "%s",
              xent_last_error());
        xent_model *mg = NULL, *mh = NULL, *mb = NULL;
        CHECK(xent_model_load(gg, &mg) == XENT_OK, "gguf: %s", xent_last_error());
        CHECK(xent_model_load(hf, &mh) == XENT_OK, "hf: %s", xent_last_error());
        CHECK(xent_model_load(hb, &mb) == XENT_OK, "hf bf16: %s",
              xent_last_error());
        if (mg && mh && mb) {
            CHECK(same_weights(m, mg), "%s: gguf weights differ", arch[a]);
            CHECK(same_weights(m, mh), "%s: hf weights differ", arch[a]);
            CHECK(mg->cfg.tied_head == a && mh->cfg.qkv_bias == a &&
                  mg->cfg.qkv_bias == a, "config flags");
            for (int i = 0; i < m->n_params; i++)
                for (int64_t k = 0; k < m->params[i].numel; k++) {
                    float w = m->params[i].w[k];
                    CHECK(mb->params[i].w[k] ==
                              xent_bf16_to_f32(xent_f32_to_bf16(w)),
                          "bf16 %s[%lld]", m->params[i].name, (long long)k);
                    CHECK_LIMIT(5);
                }
            int32_t tok[16];
            random_tokens(tok, 16, 64);
            double l0 = run_loss(m, tok, 2, 8), l1 = run_loss(mg, tok, 2, 8),
                   l2 = run_loss(mh, tok, 2, 8);
            CHECK(isfinite(l0) && l0 == l1 && l0 == l2,
                  "losses %.9g %.9g %.9g", l0, l1, l2);
        }
        xent_model_free(mg), xent_model_free(mh), xent_model_free(mb);
        xent_model_free(m);
        rm_dir(d);
    }
}

TEST(model_refuses_unsupported_arch) {
    xent_model_config c;
    xent_model_config_init(&c);
    snprintf(c.arch, sizeof c.arch, "falcon");
    c.n_layers = 1, c.dim = 8, c.hidden = 8, c.n_heads = 1, c.n_kv_heads = 1;
    c.head_dim = 8, c.vocab = 8;
    xent_model *m = NULL;
    CHECK(xent_model_new(&c, &m) == XENT_ERR_UNSUPPORTED && !m, "accepted");
    CHECK(strstr(xent_last_error(), "llama") &&
              strstr(xent_last_error(), "qwen2"),
          "message does not list the supported: %s", xent_last_error());
}

/* ---- dequantization ------------------------------------------------------- */

TEST(model_gguf_dequant_blocks) {
    uint8_t blk[34];
    float out[32];
    uint16_t d = xent_f32_to_f16(0.5f), mn = xent_f32_to_f16(-1.25f);
    /* Q8_0: f16 d, int8[32] */
    memcpy(blk, &d, 2);
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(j - 16);
    xt_poison(out, sizeof out);
    CHECK(xent__gguf_dequant(XENT__GG_Q8_0, blk, 32, out) == XENT_OK, "q8_0");
    for (int j = 0; j < 32; j++)
        CHECK(out[j] == 0.5f * (float)(j - 16), "q8_0[%d] = %g", j, out[j]);
    /* Q4_0: f16 d, 16 bytes; element j = low nibble of byte j, j+16 high */
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    xt_poison(out, sizeof out);
    CHECK(xent__gguf_dequant(XENT__GG_Q4_0, blk, 32, out) == XENT_OK, "q4_0");
    for (int j = 0; j < 16; j++) {
        CHECK(out[j] == 0.5f * (float)(j - 8), "q4_0[%d] = %g", j, out[j]);
        CHECK(out[j + 16] == 0.5f * (float)(15 - j - 8), "q4_0[%d]", j + 16);
    }
    /* Q4_1: f16 d, f16 m, 16 bytes; q * d + m */
    memcpy(blk + 2, &mn, 2);
    for (int j = 0; j < 16; j++) blk[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    xt_poison(out, sizeof out);
    CHECK(xent__gguf_dequant(XENT__GG_Q4_1, blk, 32, out) == XENT_OK, "q4_1");
    for (int j = 0; j < 16; j++) {
        CHECK(out[j] == 0.5f * (float)j - 1.25f, "q4_1[%d] = %g", j, out[j]);
        CHECK(out[j + 16] == 0.5f * (float)(15 - j) - 1.25f, "q4_1[%d]",
              j + 16);
    }
    /* F16 / BF16 */
    uint16_t h[2] = {xent_f32_to_f16(-2.5f), xent_f32_to_bf16(3.0f)};
    CHECK(xent__gguf_dequant(XENT__GG_F16, (uint8_t *)h, 1, out) == XENT_OK &&
              out[0] == -2.5f, "f16");
    CHECK(xent__gguf_dequant(XENT__GG_BF16, (uint8_t *)(h + 1), 1, out) ==
              XENT_OK && out[0] == 3.0f, "bf16");
    CHECK(xent__gguf_dequant(XENT__GG_Q4_0, blk, 31, out) == XENT_ERR_FORMAT,
          "31 elements of Q4_0 accepted");
}

/* The llama.cpp rotary permutation round-trips, and moves HF row
 * (h, j, i) to GGUF row (h, i, j). */
TEST(model_rope_permutation) {
    float w[2 * 8 * 3], o[2 * 8 * 3];
    for (int i = 0; i < 48; i++) w[i] = o[i] = (float)i;
    xent__rope_permute(w, 2, 8, 3, 0);
    /* HF row h*8 + j*4 + i -> GGUF row h*8 + 2i + j */
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++)
                CHECK(w[(h * 8 + 2 * i + j) * 3] == o[(h * 8 + j * 4 + i) * 3],
                      "h %d i %d j %d", h, i, j);
    xent__rope_permute(w, 2, 8, 3, 1);
    CHECK(!memcmp(w, o, sizeof w), "inverse");
}

/* ---- hostile GGUF ---------------------------------------------------------- */

static xent_status parse_copy(const uint8_t *src, size_t n) {
    uint8_t *b = malloc(n ? n : 1); /* exact size: ASan sees any overread */
    memcpy(b, src, n);
    xent_model *m = NULL;
    xent_status st = xent__model_from_gguf(b, n, "<test>", &m);
    xent_model_free(m);
    free(b);
    return st;
}

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

TEST(model_gguf_hostile) {
    xent_model *m = tiny_model(0, 0, "llama");
    char *d = tmpdir();
    if (!d) return;
    char gg[128];
    snprintf(gg, sizeof gg, "%s/tiny.gguf", d);
    CHECK(xent_model_save_gguf(m, gg) == XENT_OK, "%s", xent_last_error());
    uint8_t *f = NULL;
    size_t n = 0;
    CHECK(read_all(gg, &f, &n) == 0, "read");
    if (!f) return;
    CHECK(parse_copy(f, n) == XENT_OK, "valid file: %s", xent_last_error());
    /* every truncation fails cleanly */
    size_t step = xt_sanitizer() ? 97 : 7;
    int bad = 0;
    for (size_t l = 0; l < n; l += (l < 2048 ? 1 : step)) {
        xent_status st = parse_copy(f, l);
        if (st != XENT_ERR_FORMAT && st != XENT_ERR_NOT_FOUND && bad++ < 3)
            CHECK(0, "truncated to %zu: status %d (%s)", l, (int)st,
                  xent_last_error());
    }
    uint8_t *g = malloc(n);
    /* huge counts */
    memcpy(g, f, n), put64(g + 8, (uint64_t)1 << 60);
    CHECK(parse_copy(g, n) == XENT_ERR_FORMAT &&
              strstr(xent_last_error(), "n_tensors"), "n_tensors 2^60: %s",
          xent_last_error());
    memcpy(g, f, n), put64(g + 16, (uint64_t)1 << 60);
    CHECK(parse_copy(g, n) == XENT_ERR_FORMAT &&
              strstr(xent_last_error(), "n_kv"), "n_kv 2^60: %s",
          xent_last_error());
    /* first key's string length 2^60 */
    memcpy(g, f, n), put64(g + 24, (uint64_t)1 << 60);
    CHECK(parse_copy(g, n) == XENT_ERR_FORMAT, "key length 2^60");
    /* bad magic, bad version */
    memcpy(g, f, n), g[0] = 'X';
    CHECK(parse_copy(g, n) == XENT_ERR_FORMAT, "magic");
    memcpy(g, f, n), g[4] = 9;
    CHECK(parse_copy(g, n) == XENT_ERR_FORMAT, "version");
    /* tensor info of token_embd: find its name, then patch type / offset */
    const char *nm = "token_embd.weight";
    uint8_t *p = NULL;
    for (size_t i = 0; i + strlen(nm) < n; i++)
        if (!memcmp(f + i, nm, strlen(nm))) {
            p = f + i;
            break;
        }
    CHECK(p != NULL, "tensor info not found");
    if (p) {
        size_t at = (size_t)(p - f) + strlen(nm) + 4 + 16; /* ndim, 2 dims */
        memcpy(g, f, n), memset(g + at, 0x77, 4);       /* unknown type */
        CHECK(parse_copy(g, n) == XENT_ERR_FORMAT &&
                  strstr(xent_last_error(), "token_embd"),
              "unknown type: %s", xent_last_error());
        memcpy(g, f, n), put64(g + at + 4, (uint64_t)n * 32); /* past EOF */
        CHECK(parse_copy(g, n) == XENT_ERR_FORMAT &&
                  strstr(xent_last_error(), "token_embd"),
              "offset past EOF: %s", xent_last_error());
        memcpy(g, f, n), put64(g + at + 4, UINT64_MAX - 31);  /* overflow */
        CHECK(parse_copy(g, n) == XENT_ERR_FORMAT, "offset 2^64-32");
        memcpy(g, f, n), put64(g + at - 8, (uint64_t)1 << 40); /* dim */
        CHECK(parse_copy(g, n) == XENT_ERR_FORMAT, "dim 2^40");
    }
    /* metadata that sizes the model: errors before any allocation */
    struct { const char *key; uint32_t v; xent_status want; } md[] = {
        {"llama.block_count", 4000, XENT_ERR_NOT_FOUND},
        {"llama.embedding_length", 1u << 24, XENT_ERR_SHAPE},
        {"llama.feed_forward_length", 1u << 24, XENT_ERR_SHAPE},
        {"llama.attention.head_count", 3, XENT_ERR_SHAPE},
    };
    for (size_t k = 0; k < sizeof md / sizeof md[0]; k++) {
        size_t kl = strlen(md[k].key);
        uint8_t *at = NULL;
        for (size_t i = 0; i + kl + 8 < n && !at; i++)
            if (!memcmp(f + i, md[k].key, kl) && f[i + kl] == 4) at = f + i;
        CHECK(at != NULL, "%s not found", md[k].key);
        if (!at) continue;
        size_t off = (size_t)(at - f) + kl + 4; /* after the u32 type */
        memcpy(g, f, n);
        memcpy(g + off, &md[k].v, 4);
        xent_status st = parse_copy(g, n);
        CHECK(st == md[k].want, "%s = %u: status %d, want %d (%s)",
              md[k].key, md[k].v, (int)st, (int)md[k].want,
              xent_last_error());
    }
    /* random corruption: must never crash (ASan checks the reads) */
    int iters = xt_sanitizer() ? 150 : 600;
    for (int it = 0; it < iters; it++) {
        memcpy(g, f, n);
        int k = 1 + (int)xt_randint(xt_rng(), 4);
        for (int j = 0; j < k; j++) {
            size_t at = (size_t)xt_randint(xt_rng(), (int64_t)(n < 4096 ? n : 4096));
            g[at] = (uint8_t)xt_next(xt_rng());
        }
        (void)parse_copy(g, n);
    }
    free(g);
    free(f);
    xent_model_free(m);
    rm_dir(d);
}

/* ---- hostile HF checkpoint dirs -------------------------------------------- */

static int edit_config(const char *dir, const char *from, const char *to,
                       long truncate_at) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    uint8_t *b = NULL;
    size_t n = 0;
    if (read_all(path, &b, &n)) return 1;
    char *txt = malloc(n + (to ? strlen(to) : 0) + 1);
    memcpy(txt, b, n);
    txt[n] = 0;
    char *hit = from ? strstr(txt, from) : NULL;
    FILE *f = fopen(path, "wb");
    if (hit) {
        fwrite(txt, 1, (size_t)(hit - txt), f);
        fputs(to, f);
        fputs(hit + strlen(from), f);
    } else {
        fwrite(txt, 1, truncate_at >= 0 ? (size_t)truncate_at : n, f);
    }
    fclose(f);
    free(txt), free(b);
    return from && !hit;
}

TEST(model_hf_bad_checkpoints) {
    struct { const char *from, *to; long cut; xent_status want; } cases[] = {
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3", -1,
         XENT_ERR_NOT_FOUND},
        {"\"hidden_size\": 16", "\"hidden_size\": 1000000", -1,
         XENT_ERR_SHAPE},
        {"\"intermediate_size\": 24", "\"intermediate_size\": 16000000", -1,
         XENT_ERR_SHAPE},
        {"\"model_type\": \"llama\"", "\"model_type\": \"falcon\"", -1,
         XENT_ERR_UNSUPPORTED},
        {"\"model_type\": \"llama\"", "\"model_type\": \"gemma2\"", -1,
         XENT_ERR_UNSUPPORTED}, /* hidden_act silu: not Gemma's */
        {"\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3", -1,
         XENT_ERR_SHAPE},
        {NULL, NULL, 40, XENT_ERR_FORMAT},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        xent_model *m = tiny_model(0, 0, "llama");
        char *d = tmpdir();
        if (!d) return;
        char hf[128];
        snprintf(hf, sizeof hf, "%s/hf", d);
        CHECK(xent_model_save_hf(m, hf, XENT_F32) == XENT_OK, "%s",
              xent_last_error());
        CHECK(edit_config(hf, cases[c].from, cases[c].to, cases[c].cut) == 0,
              "case %zu: config.json has no '%s'", c, cases[c].from);
        xent_model *r = NULL;
        xent_status st = xent_model_load_hf(hf, &r);
        CHECK(st == cases[c].want && r == NULL,
              "case %zu: status %d, want %d (%s)", c, (int)st,
              (int)cases[c].want, xent_last_error());
        xent_model_free(r);
        xent_model_free(m);
        rm_dir(d);
    }
}

/* Rows are split over threads but every value is computed the same way:
 * 1 and 2 threads give bitwise-equal losses, logits and gradients. */
TEST(model_threads_bitwise) {
    xent_model *m = tiny_model(1, 1, "qwen2");
    /* T * dim >= 2^16: the row loops really run on 2 threads */
    int64_t B = 8, S = 512, T = B * S;
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    random_tokens(tok, T, 64);
    xent_model_ws *w1 = NULL, *w2 = NULL;
    CHECK(!xent_model_ws_new(m, B, S, 1, &w1) &&
              !xent_model_ws_new(m, B, S, 1, &w2), "%s", xent_last_error());
    if (!w1 || !w2) return;
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    xent_precision p = xent_precision_fp32();
    xent_model_record r1, r2;
    o.threads = 1;
    CHECK(xent_model_run(m, w1, &p, &o, &r1) == XENT_OK, "%s",
          xent_last_error());
    o.threads = 2;
    CHECK(xent_model_run(m, w2, &p, &o, &r2) == XENT_OK, "%s",
          xent_last_error());
    CHECK(r1.loss == r2.loss, "loss %.17g vs %.17g", r1.loss, r2.loss);
    CHECK(!memcmp(r1.logits, r2.logits, (size_t)(T * 64) * 4), "logits");
    CHECK(!memcmp(r1.layer_in_grad[1], r2.layer_in_grad[1],
                  (size_t)(T * 16) * 4), "layer 1 input grad");
    for (int i = 0; i < m->n_params; i++)
        CHECK(!memcmp(r1.param_grads[i], r2.param_grads[i],
                      (size_t)m->params[i].numel * 4), "%s", m->params[i].name);
    xent_model_ws_free(w1);
    xent_model_ws_free(w2);
    xent_model_free(m);
    free(tok);
}

/* llama3 rope scaling: read back from config.json, and the tables keep the
 * high frequencies and divide the low ones by the factor. */
TEST(model_llama3_rope_scaling) {
    xent_model *m = tiny_model(0, 0, "llama");
    m->cfg.rope_scaling = XENT_ROPE_LLAMA3;
    m->cfg.rope_theta = 500000.0;
    m->cfg.rope_factor = 8.0, m->cfg.rope_low_freq_factor = 1.0;
    m->cfg.rope_high_freq_factor = 4.0, m->cfg.rope_orig_ctx = 8192;
    m->cfg.head_dim = 64, m->cfg.n_heads = 1; /* tables only */
    float cs[2 * 32], sn[2 * 32]; /* [S = 2, hd/2] */
    xent__rope_tables(&m->cfg, 2, cs, sn, 0);
    /* i = 0: inv_freq 1, wavelength 2 pi < 8192 / 4: unchanged */
    CHECK(cs[32] == cosf(1.0f) && sn[32] == sinf(1.0f), "i=0: %g %g", cs[32],
          sn[32]);
    /* i = 31: wavelength 2 pi * 500000^(62/64) > 8192: inv_freq / 8 */
    float inv = 1.0f / powf(500000.0f, 62.0f / 64.0f);
    float want = sinf((float)(inv / 8.0));
    CHECK(fabsf(sn[32 + 31] - want) <= 2e-7f * fabsf(want),
          "i=31: sin %.9g, want %.9g", sn[32 + 31], want);
    CHECK(cs[0] == 1.0f && sn[0] == 0.0f, "position 0");
    xent_model_free(m);
    m = tiny_model(0, 0, "llama");
    m->cfg.rope_scaling = XENT_ROPE_LLAMA3;
    m->cfg.rope_factor = 8.0, m->cfg.rope_low_freq_factor = 1.0;
    m->cfg.rope_high_freq_factor = 4.0, m->cfg.rope_orig_ctx = 8192;
    char *d = tmpdir();
    if (!d) return;
    char hf[128];
    snprintf(hf, sizeof hf, "%s/hf", d);
    CHECK(xent_model_save_hf(m, hf, XENT_F32) == XENT_OK, "%s",
          xent_last_error());
    xent_model *r = NULL;
    CHECK(xent_model_load_hf(hf, &r) == XENT_OK, "%s", xent_last_error());
    CHECK(r && r->cfg.rope_scaling == XENT_ROPE_LLAMA3 &&
              r->cfg.rope_factor == 8.0 && r->cfg.rope_high_freq_factor == 4.0 &&
              r->cfg.rope_orig_ctx == 8192, "llama3 fields not read back");
    xent_model_free(r);
    xent_model_free(m);
    rm_dir(d);
}

TEST(model_run_rejects_bad_input) {
    xent_model *m = tiny_model(0, 0, "llama");
    int32_t tok[8] = {1, 2, 3, 4, 5, 64, 6, 7};
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, 2, 4, 0, &ws) == XENT_OK, "%s",
          xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = 2, o.S = 4, o.tokens = tok;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    xt_poison(&r, sizeof r);
    xent_model_record r0 = r;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_ERR_LABEL &&
              strstr(xent_last_error(), "tokens[5] = 64"), "%s",
          xent_last_error());
    CHECK(!memcmp(&r, &r0, sizeof r), "record written on failure");
    tok[5] = 5;
    o.S = 8, o.B = 1;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_ERR_SHAPE,
          "S = 8 accepted by a workspace for S = 4");
    o.S = 4, o.B = 2, o.record = 1;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_ERR_VALUE,
          "record accepted without a recording workspace");
    o.record = 0;
    p.compute = XENT_I32;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_ERR_DTYPE &&
              strstr(xent_last_error(), "compute"), "%s", xent_last_error());
    xent_model_ws_free(ws);
    xent_model_free(m);
}

/* A checkpoint split into two shards with an index file loads the same. */
TEST(model_hf_sharded) {
    xent_model *m = tiny_model(0, 1, "qwen2");
    char *d = tmpdir();
    if (!d) return;
    char hf[128], one[160], s1[192], s2[192], idx[192];
    snprintf(hf, sizeof hf, "%s/hf", d);
    CHECK(xent_model_save_hf(m, hf, XENT_BF16) == XENT_OK, "%s",
          xent_last_error());
    snprintf(one, sizeof one, "%s/model.safetensors", hf);
    snprintf(s1, sizeof s1, "%s/model-00001-of-00002.safetensors", hf);
    snprintf(s2, sizeof s2, "%s/model-00002-of-00002.safetensors", hf);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", hf);
    int n = m->n_params, h = n / 2;
    xent_tensor *ts = calloc((size_t)n, sizeof *ts);
    for (int i = 0; i < n; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "%s:%s", one, m->params[i].name);
        CHECK(xent_tensor_load(spec, &ts[i]) == XENT_OK, "%s",
              xent_last_error());
    }
    CHECK(xent_tensors_save(s1, ts, h) == XENT_OK &&
              xent_tensors_save(s2, ts + h, n - h) == XENT_OK, "%s",
          xent_last_error());
    CHECK(unlink(one) == 0, "unlink");
    FILE *f = fopen(idx, "w");
    fprintf(f, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                i ? ", " : "", m->params[i].name, i < h ? 1 : 2);
    fprintf(f, "}}\n");
    fclose(f);
    xent_model *r = NULL;
    CHECK(xent_model_load(hf, &r) == XENT_OK, "%s", xent_last_error());
    for (int i = 0; r && i < n; i++)
        for (int64_t k = 0; k < m->params[i].numel; k++) {
            CHECK(r->params[i].w[k] ==
                      xent_bf16_to_f32(xent_f32_to_bf16(m->params[i].w[k])),
                  "%s[%lld]", m->params[i].name, (long long)k);
            CHECK_LIMIT(5);
        }
    for (int i = 0; i < n; i++) xent_tensor_free(&ts[i]);
    free(ts);
    xent_model_free(r);
    xent_model_free(m);
    rm_dir(d);
}

/* ---- GGUF duplicates and token types --------------------------------------- */

static uint8_t *find_bytes(uint8_t *b, size_t n, const char *s) {
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(b + i, s, k)) return b + i;
    return NULL;
}

/* parse_copy on f with key/tensor name `from` renamed to `to` (same length). */
static xent_status parse_renamed(const uint8_t *f, size_t n, const char *from,
                                 const char *to) {
    uint8_t *g = malloc(n);
    memcpy(g, f, n);
    uint8_t *at = find_bytes(g, n, from);
    xent_status st = XENT_ERR_INTERNAL;
    if (at && strlen(to) == strlen(from)) {
        memcpy(at, to, strlen(to));
        st = parse_copy(g, n);
    } else {
        CHECK(0, "'%s' not found in the file", from);
    }
    free(g);
    return st;
}

static int param_index(const xent_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

TEST(model_gguf_duplicates_and_token_types) {
    xent_model *m = tiny_model(0, 0, "llama");
    CHECK(m != NULL, "model");
    if (!m) return;
    /* a 64-token tokenizer ("t0".."t63", no merges) so the file carries
     * tokenizer.ggml.tokens / token_type / merges */
    char names[64][16], *toks[64];
    size_t tl[64];
    int32_t types[64];
    for (int i = 0; i < 64; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        toks[i] = names[i], tl[i] = strlen(names[i]), types[i] = 1;
    }
    CHECK(xent__tokenizer_new(toks, tl, 64, NULL, NULL, 0, types, "default",
                              &m->tok) == XENT_OK, "%s", xent_last_error());
    char *d = tmpdir();
    if (!d) {
        xent_model_free(m);
        return;
    }
    char gg[128];
    snprintf(gg, sizeof gg, "%s/tok.gguf", d);
    CHECK(xent_model_save_gguf(m, gg) == XENT_OK, "%s", xent_last_error());
    uint8_t *f = NULL;
    size_t n = 0;
    CHECK(read_all(gg, &f, &n) == 0, "read");
    if (!f) goto done;
    CHECK(parse_copy(f, n) == XENT_OK, "valid file: %s", xent_last_error());
    const char *err;

    /* duplicate metadata keys: general.alignment (key 1) renamed to
     * llama.block_count (key 2); tokenizer.ggml.merges (key 14) renamed to
     * tokenizer.ggml.tokens (key 12) */
    xent_status st = parse_renamed(f, n, "general.alignment",
                                   "llama.block_count");
    err = xent_last_error();
    CHECK(st == XENT_ERR_FORMAT && strstr(err, "'llama.block_count'") &&
              strstr(err, "keys 1 and 2"),
          "duplicate key: status %d (%s)", (int)st, err);
    st = parse_renamed(f, n, "tokenizer.ggml.merges", "tokenizer.ggml.tokens");
    err = xent_last_error();
    CHECK(st == XENT_ERR_FORMAT && strstr(err, "'tokenizer.ggml.tokens'") &&
              strstr(err, "keys 12 and 14"),
          "duplicate tokens key: status %d (%s)", (int)st, err);

    /* duplicate tensor: blk.0.attn_q.weight renamed to blk.1.attn_q.weight
     * (tensor infos are written in parameter order) */
    int i0 = param_index(m, "model.layers.0.self_attn.q_proj.weight"),
        i1 = param_index(m, "model.layers.1.self_attn.q_proj.weight");
    char want[64];
    snprintf(want, sizeof want, "tensor infos %d and %d", i0 < i1 ? i0 : i1,
             i0 < i1 ? i1 : i0);
    st = parse_renamed(f, n, "blk.0.attn_q.weight", "blk.1.attn_q.weight");
    err = xent_last_error();
    CHECK(i0 >= 0 && i1 >= 0 && st == XENT_ERR_FORMAT &&
              strstr(err, "'blk.1.attn_q.weight'") && strstr(err, want),
          "duplicate tensor: status %d (%s), want '%s'", (int)st, err, want);

    /* token_type with the wrong element type (same size: the file stays
     * well-formed): u32, f32 */
    const char *tk = "tokenizer.ggml.token_type";
    uint8_t *g = malloc(n);
    uint8_t *at = find_bytes(f, n, tk);
    CHECK(at != NULL, "token_type not found");
    if (!at) goto done_g;
    size_t atype_off = (size_t)(at - f) + strlen(tk) + 4;
    uint32_t bad_t[] = {XENT__GT_U32, XENT__GT_F32};
    const char *bad_nm[] = {"array of 64 u32", "array of 64 f32"};
    for (int k = 0; k < 2; k++) {
        memcpy(g, f, n);
        memcpy(g + atype_off, &bad_t[k], 4);
        st = parse_copy(g, n);
        err = xent_last_error();
        CHECK(st == XENT_ERR_FORMAT && strstr(err, tk) &&
                  strstr(err, bad_nm[k]) && strstr(err, "i32"),
              "token_type of %s: status %d (%s)", bad_nm[k], (int)st, err);
    }

    /* 63 tokens, 64 token types: the tokens array's last two strings
     * become one ("t62" takes in the length field and bytes of "t63") */
    const char *tkk = "tokenizer.ggml.tokens";
    at = find_bytes(f, n, tkk);
    CHECK(at != NULL, "tokens not found");
    if (!at) goto done_g;
    size_t cnt_off = (size_t)(at - f) + strlen(tkk) + 8, pos = cnt_off + 8;
    uint64_t cnt, len = 0;
    memcpy(&cnt, f + cnt_off, 8);
    CHECK(cnt == 64, "tokens count %llu", (unsigned long long)cnt);
    for (int k = 0; k < 62 && pos + 8 <= n; k++) {
        memcpy(&len, f + pos, 8);
        pos += 8 + len;
    }
    memcpy(g, f, n);
    put64(g + cnt_off, 63);
    put64(g + pos, 3 + 8 + 3); /* "t62" + len("t63") + "t63" */
    st = parse_copy(g, n);
    err = xent_last_error();
    CHECK(st == XENT_ERR_FORMAT && strstr(err, tk) &&
              strstr(err, "array of 64 i32, the tokens array has 63"),
          "token_type count: status %d (%s)", (int)st, err);
done_g:
    free(g);
done:
    free(f);
    xent_model_free(m);
    rm_dir(d);
}

/* Many keys (distinct, then one repeated) are checked in O(n log n): the
 * parser alone, on a hand-built header. */
TEST(model_gguf_many_keys) {
    const int nk = xt_sanitizer() ? 20000 : 200000;
    size_t cap = 24 + (size_t)(nk + 1) * 21 + 64;
    uint8_t *b = calloc(1, cap);
    size_t n = 0;
    uint32_t u;
    uint64_t v;
#define W(x, k) (memcpy(b + n, (x), (k)), n += (k))
    u = 0x46554747u, W(&u, 4);
    u = 3, W(&u, 4);
    v = 0, W(&v, 8);              /* n_tensors */
    v = (uint64_t)nk, W(&v, 8);   /* n_kv */
    for (int i = 0; i < nk; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%07d", i);
        v = 8, W(&v, 8);
        W(key, 8);
        u = XENT__GT_U8, W(&u, 4);
        b[n++] = (uint8_t)i;
    }
#undef W
    xent__gguf g;
    CHECK(xent__gguf_parse(b, n, &g) == XENT_OK, "%d distinct keys: %s", nk,
          xent_last_error());
    xent__gguf_free(&g);
    /* the last key becomes a copy of key 17 */
    char key[16];
    snprintf(key, sizeof key, "k%07d", 17);
    memcpy(b + n - 13, key, 8);
    xent_status st = xent__gguf_parse(b, n, &g);
    char want[64];
    snprintf(want, sizeof want, "keys 17 and %d", nk - 1);
    const char *err = xent_last_error();
    CHECK(st == XENT_ERR_FORMAT && strstr(err, "'k0000017'") &&
              strstr(err, want),
          "duplicate: status %d (%s), want '%s'", (int)st, err, want);
    if (st == XENT_OK) xent__gguf_free(&g);
    free(b);
}
