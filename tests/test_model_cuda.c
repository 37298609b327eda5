/* tests/test_model_cuda.c: the model's whole forward + backward resident on
 * the GPU (gemm_device = 2, src/model/core_cuda.cu) against the CPU
 * emulation (the oracle), and its device memory plan (plain C, checked on
 * the CPU).
 *
 * Tolerances of cuda_model_resident_matches_cpu. Both sides store the same
 * values at the same points; they differ only in summation order (cuBLAS
 * vs OpenBLAS products, warp-tree vs in-order double sums, xent_cuda_ce
 * within 4 ulp of xent_ce). How far a summation-order change alone moves a
 * run is measured in the same test: the CPU run with its products on the
 * GPU (gemm_device = 1: the same CPU code, cuBLAS accumulation order) is
 * the "spread" run. For every compared tensor (loss, chosen-token
 * log-probs, embeddings, each layer's output, the final norm, logits,
 * every layer-input gradient, every parameter gradient) the resident run's
 * relative RMS difference from the CPU run must be within
 *     4 * spread + floor,
 * spread = the spread run's relative RMS difference from the CPU run, and
 * floor = a few units of the policy's storage rounding (a value that moves
 * across one rounding boundary is off by one ulp of its dtype and then
 * propagates): fp32 policy 2e-5 (the spread of fp32 accumulation over
 * K <= 96 terms is ~K u = 6e-6 relative at worst, times a few layers);
 * bf16 policies 3e-2 (2^-8 = 3.9e-3 per flipped value, grown through the
 * layers and the backward: docs/audit.md measures 1-10% from summation
 * order alone on real models); fp16 policies 6e-3 (2^-11 per flip, same
 * growth). The loss uses the same rule with floors 1e-5, 4e-3 and 1e-3
 * (relative). The embeddings (a gather and one rounding) must agree bit for
 * bit, and every array a 16-bit policy stores must hold values of its
 * dtype. */
#include "harness.h"
#include "model/core_dev.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "xent.h"

#include <stdlib.h>
#include <string.h>

/* ---- tiny family configs ------------------------------------------------ */

static void family_config(const char *arch, xent_model_config *c) {
    xent_model_config_init(c);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    xent_model_config_family(c);
    c->n_layers = 2, c->dim = 32, c->hidden = 48, c->n_heads = 4, c->n_kv_heads = 2;
    c->head_dim = 8, c->vocab = 96, c->max_seq = 64;
    c->rope_theta = 10000.0, c->norm_eps = 1e-6, c->init_std = 0.15;
    c->tied_head = strcmp(arch, "llama") != 0; /* llama untied, the others tied */
    if (!strcmp(arch, "mistral")) c->sliding_window = 4;
    if (!strcmp(arch, "gemma2")) {
        c->sliding_window = 4;
        c->attn_softcap = 20.0;
        c->final_softcap = 10.0;
        c->query_scalar = 16.0;
    }
    if (!strcmp(arch, "gemma3_text")) {
        c->sliding_window = 4;
        c->swa_pattern = 2; /* layer 0 slides, layer 1 global */
        c->rope_theta = 1000000.0;
        c->rope_local_theta = 10000.0;
    }
}

/* A random model of the family, its vectors (norm weights, biases) moved off
 * their initial 1 / 0 so that they matter. */
static xent_model *family_model(const char *arch) {
    xent_model_config c;
    family_config(arch, &c);
    xent_model *m = NULL;
    if (xent_model_init_random(&c, 1234, &m)) return NULL;
    xt_rng_t *r = xt_rng();
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].ndim == 1)
            for (int64_t k = 0; k < m->params[i].numel; k++)
                m->params[i].w[k] += (float)(0.1 * xt_normal(r));
    return m;
}

/* ---- the plan (CPU) ------------------------------------------------------- */

static int64_t a64(int64_t n) { return (n + 63) / 64 * 64; }

TEST(model_dev_plan_arithmetic) {
    xent_model_config c;
    family_config("llama", &c);
    xent_model *m = NULL;
    CHECK(xent_model_new(&c, &m) == XENT_OK, "%s", xent_last_error());
    if (!m) return;
    int64_t mat = 0, vec = 0, B = 2, S = 8, T = B * S, D = c.dim, V = c.vocab;
    for (int i = 0; i < m->n_params; i++)
        *(m->params[i].ndim == 2 ? &mat : &vec) += m->params[i].numel;
    CHECK(mat + vec == xent_model_n_weights(m), "count");
    xent_precision f32 = xent_precision_fp32(), bf = f32, bfh = f32, mb = f32;
    bf.compute = bf.residual = bf.norm = bf.attn_softmax = bf.lm_head = bf.logits = XENT_BF16;
    bfh = bf;
    bfh.lm_head = bfh.logits = XENT_F32;
    mb.micro_batches = 2;
    xent_model_dev_plan p32, pbf, pbfh, pmb, pnorec;
    CHECK(xent_model_dev_plan_make(&c, B, S, 1, &f32, &p32) == XENT_OK, "%s", xent_last_error());
    CHECK(xent_model_dev_plan_make(&c, B, S, 1, &bf, &pbf) == XENT_OK, "%s", xent_last_error());
    CHECK(xent_model_dev_plan_make(&c, B, S, 1, &bfh, &pbfh) == XENT_OK, "%s",
          xent_last_error());
    CHECK(xent_model_dev_plan_make(&c, B, S, 1, &mb, &pmb) == XENT_OK, "%s", xent_last_error());
    CHECK(xent_model_dev_plan_make(&c, B, S, 0, &f32, &pnorec) == XENT_OK, "%s",
          xent_last_error());
    /* weights: 4 bytes a value in fp32; bf16 matrices 2, vectors 4; a head in
     * another dtype adds its own copy */
    CHECK(p32.weights == 4 * (mat + vec), "fp32 weights %lld, want %lld", (long long)p32.weights,
          (long long)(4 * (mat + vec)));
    CHECK(pbf.weights == 2 * mat + 4 * vec, "bf16 weights %lld, want %lld",
          (long long)pbf.weights, (long long)(2 * mat + 4 * vec));
    CHECK(pbfh.weights == pbf.weights + 4 * V * D, "bf16 + fp32 head weights %lld",
          (long long)pbfh.weights);
    /* gradients: micro-batches add a second fp32 set */
    CHECK(pmb.gradients == p32.gradients + 4 * (mat + vec), "micro-batch gradients %lld vs %lld",
          (long long)pmb.gradients, (long long)p32.gradients);
    CHECK(p32.gradients >= 4 * (mat + vec) + 4 * B * c.n_heads * S * S, "gradients %lld",
          (long long)p32.gradients);
    /* record: L layer-input gradients and the embeddings' gradient [T, D] */
    CHECK(p32.record == 4 * (c.n_layers + 1) * a64(T * D), "record %lld, want %lld",
          (long long)p32.record, (long long)(4 * (c.n_layers + 1) * a64(T * D)));
    CHECK(pnorec.record == 0, "record without recording: %lld", (long long)pnorec.record);
    /* activations hold the attention probabilities of every layer and the
     * logits */
    CHECK(p32.activations >= 4 * (c.n_layers * B * c.n_heads * S * S + T * V + (c.n_layers + 1) *
                                  T * D), "activations %lld", (long long)p32.activations);
    /* 16-bit staging only for 16-bit products */
    CHECK(pbf.scratch > p32.scratch, "staging: bf16 scratch %lld vs fp32 %lld",
          (long long)pbf.scratch, (long long)p32.scratch);
    const xent_model_dev_plan *all[] = {&p32, &pbf, &pbfh, &pmb, &pnorec};
    for (int i = 0; i < 5; i++)
        CHECK(all[i]->total == all[i]->weights + all[i]->activations + all[i]->gradients +
                                   all[i]->record + all[i]->scratch + all[i]->overhead,
              "plan %d: total is not the sum", i);
    /* the plan grows with the shape; soft-capped attention keeps its scores */
    xent_model_dev_plan big, g2, g2nc;
    CHECK(xent_model_dev_plan_make(&c, B, 2 * S, 1, &f32, &big) == XENT_OK, "%s",
          xent_last_error());
    CHECK(big.activations > p32.activations && big.total > p32.total, "bigger S");
    xent_model_config cg;
    family_config("gemma2", &cg);
    CHECK(xent_model_dev_plan_make(&cg, B, S, 1, &f32, &g2) == XENT_OK, "%s", xent_last_error());
    cg.attn_softcap = 0;
    CHECK(xent_model_dev_plan_make(&cg, B, S, 1, &f32, &g2nc) == XENT_OK, "%s",
          xent_last_error());
    CHECK(g2.activations - g2nc.activations == 4 * cg.n_layers * a64(B * cg.n_heads * S * S),
          "soft-capped scores: %lld", (long long)(g2.activations - g2nc.activations));
    /* the fit check: refused with the plan and the free memory named */
    CHECK(xent_model_dev_plan_fits(&p32, (uint64_t)p32.total, 1ull << 34) == XENT_OK, "fits");
    CHECK(xent_model_dev_plan_fits(&p32, (uint64_t)p32.total - 1, 1ull << 34) == XENT_ERR_ALLOC,
          "does not fit");
    CHECK(strstr(xent_last_error(), "free") && strstr(xent_last_error(), "weights") &&
              strstr(xent_last_error(), "total"), "message: %s", xent_last_error());
    char line[400];
    xent_model_dev_plan_str(&p32, line, sizeof line);
    CHECK(strstr(line, "activations") && strstr(line, "gradients"), "line: %s", line);
    /* bad input */
    CHECK(xent_model_dev_plan_make(&c, 0, S, 1, &f32, &big) == XENT_ERR_SHAPE, "B = 0");
    mb.micro_batches = 3;
    CHECK(xent_model_dev_plan_make(&c, B, S, 1, &mb, &big) == XENT_ERR_SHAPE, "3 micro-batches");
    xent_model_free(m);
}

/* Without a GPU the resident pass fails with a clear status; a bad
 * gemm_device is refused everywhere. */
TEST(model_resident_without_gpu) {
    xent_model *m = family_model("llama");
    CHECK(m != NULL, "%s", xent_last_error());
    if (!m) return;
    int64_t B = 1, S = 6;
    int32_t tok[6] = {1, 5, 9, 3, 7, 2};
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, B, S, 1, &ws) == XENT_OK, "%s", xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    o.gemm_device = 3;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_ERR_VALUE, "gemm_device 3");
    if (xent_cuda_device_count() < 1) {
        o.gemm_device = 2;
        xent_status st = xent_model_run(m, ws, &p, &o, &r);
        CHECK(st == XENT_ERR_UNSUPPORTED || st == XENT_ERR_CUDA, "status %d", (int)st);
        CHECK(strstr(xent_last_error(), "device cuda"), "message: %s", xent_last_error());
        uint64_t fr = 1, tot = 1;
        CHECK(xent_model_dev_mem(&fr, &tot) != XENT_OK, "device memory without a GPU");
    }
    /* the CPU pass still works on the same workspace afterwards */
    o.gemm_device = 0;
    CHECK(xent_model_run(m, ws, &p, &o, &r) == XENT_OK && isfinite(r.loss), "%s",
          xent_last_error());
    xent_model_ws_free(ws);
    xent_model_free(m);
}

/* ---- resident vs CPU (GPU) ------------------------------------------------ */

/* A run's results, copied out of the workspace. */
typedef struct snap {
    double loss;
    int n;           /* arrays                                             */
    float **a;       /* [n] copies                                         */
    int64_t *len;    /* [n]                                                */
    const char **nm; /* [n] names                                          */
} snap;

static void snap_free(snap *s) {
    for (int i = 0; i < s->n; i++) free(s->a[i]);
    free(s->a), free(s->len), free(s->nm);
    memset(s, 0, sizeof *s);
}

static void snap_add(snap *s, const char *nm, const float *x, int64_t n) {
    s->a[s->n] = malloc((size_t)n * sizeof(float));
    memcpy(s->a[s->n], x, (size_t)n * sizeof(float));
    s->len[s->n] = n;
    s->nm[s->n] = nm;
    s->n++;
}

static void snap_take(const xent_model *m, const xent_model_record *r, int64_t T, snap *s) {
    int64_t L = m->cfg.n_layers, D = m->cfg.dim, V = m->cfg.vocab;
    int cap = (int)(2 * L + 8 + m->n_params);
    s->a = calloc((size_t)cap, sizeof *s->a);
    s->len = calloc((size_t)cap, sizeof *s->len);
    s->nm = calloc((size_t)cap, sizeof *s->nm);
    s->n = 0;
    s->loss = r->loss;
    snap_add(s, "logprobs", r->logprobs, T);
    snap_add(s, "embed_out", r->embed_out, T * D);
    for (int64_t l = 0; l < L; l++) snap_add(s, "layer_out", r->layer_out[l], T * D);
    snap_add(s, "final_norm_out", r->final_norm_out, T * D);
    snap_add(s, "logits", r->logits, T * V);
    snap_add(s, "dlogits", r->dlogits, T * V);
    for (int64_t l = 0; l < L; l++) snap_add(s, "layer_in_grad", r->layer_in_grad[l], T * D);
    snap_add(s, "embed_grad", r->embed_grad, T * D);
    for (int i = 0; i < m->n_params; i++)
        snap_add(s, m->params[i].name, r->param_grads[i], m->params[i].numel);
}

static double rel_rms(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (!(num == num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int run_snap(const xent_model *m, xent_model_ws *ws, const xent_precision *p,
                    xent_model_run_opts *o, int dev, snap *s) {
    xent_model_record r;
    o->gemm_device = dev;
    xent_status st = xent_model_run(m, ws, p, o, &r);
    CHECK(st == XENT_OK, "gemm_device %d: %s", dev, xent_last_error());
    if (st) return 1;
    snap_take(m, &r, o->B * o->S, s);
    return 0;
}

static int is_dtype(float v, xent_dtype t) {
    if (t == XENT_BF16) return xent_bf16_to_f32(xent_f32_to_bf16(v)) == v;
    if (t == XENT_F16) return xent_f16_to_f32(xent_f32_to_f16(v)) == v;
    return 1;
}

typedef struct pol {
    const char *name;
    xent_precision p;
    double floor, loss_floor;
} pol;

static void compare_family(const char *arch, const pol *pols, int npol) {
    xent_model *m = family_model(arch);
    CHECK(m != NULL, "%s: %s", arch, xent_last_error());
    if (!m) return;
    int64_t B = 2, S = 8, T = B * S;
    int32_t tok[16];
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)xt_randint(xt_rng(), m->cfg.vocab);
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, B, S, 1, &ws) == XENT_OK, "%s", xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    for (int k = 0; k < npol; k++) {
        const xent_precision *p = &pols[k].p;
        snap cpu = {0}, spread = {0}, res = {0};
        if (run_snap(m, ws, p, &o, 0, &cpu) || run_snap(m, ws, p, &o, 1, &spread) ||
            run_snap(m, ws, p, &o, 2, &res)) {
            snap_free(&cpu), snap_free(&spread), snap_free(&res);
            continue;
        }
        double fl = pols[k].floor;
        double ls = fabs(spread.loss - cpu.loss) / fabs(cpu.loss),
               lr = fabs(res.loss - cpu.loss) / fabs(cpu.loss);
        printf("    %s %s: loss CPU %.9g, GPU products %.9g, resident %.9g\n", arch,
               pols[k].name, cpu.loss, spread.loss, res.loss);
        CHECK(lr <= 4 * ls + pols[k].loss_floor, "%s %s: loss %.9g resident vs %.9g CPU "
              "(relative %.3g, spread %.3g)", arch, pols[k].name, res.loss, cpu.loss, lr, ls);
        double worst = 0;
        const char *wn = "";
        for (int i = 0; i < cpu.n; i++) {
            double e = rel_rms(res.a[i], cpu.a[i], cpu.len[i]),
                   sp = rel_rms(spread.a[i], cpu.a[i], cpu.len[i]);
            double tol = 4 * sp + fl;
            if (e / tol > worst) worst = e / tol, wn = cpu.nm[i];
            CHECK(e <= tol, "%s %s: %s [%d]: relative RMS %.3g (spread %.3g, allowed %.3g)", arch,
                  pols[k].name, cpu.nm[i], i, e, sp, tol);
            CHECK_LIMIT(8);
        }
        printf("    %s %s: worst tensor %s at %.3g of its tolerance\n", arch, pols[k].name, wn,
               worst);
        /* embeddings bit for bit (index 1); stored dtypes */
        CHECK(!memcmp(res.a[1], cpu.a[1], (size_t)cpu.len[1] * sizeof(float)),
              "%s %s: embeddings differ", arch, pols[k].name);
        for (int i = 1; i <= (int)m->cfg.n_layers + 1; i++) /* embed_out, layer_out */
            for (int64_t j = 0; j < res.len[i]; j++) {
                CHECK(is_dtype(res.a[i][j], p->residual), "%s %s: %s[%lld] = %.9g not in the "
                      "residual dtype", arch, pols[k].name, res.nm[i], (long long)j,
                      (double)res.a[i][j]);
                CHECK_LIMIT(8);
            }
        snap_free(&cpu), snap_free(&spread), snap_free(&res);
    }
    xent_model_ws_free(ws);
    xent_model_free(m);
}

TEST(cuda_model_resident_matches_cpu) {
    if (xent_cuda_device_count() < 1) {
        xt_skip("no CUDA device: the resident pass was not compared");
        return;
    }
    pol pols[6];
    int np = 0;
    xent_precision f = xent_precision_fp32();
    pols[np++] = (pol){"fp32", f, 2e-5, 1e-5};
    xent_precision b = f;
    b.compute = b.residual = b.norm = b.attn_softmax = b.lm_head = b.logits = XENT_BF16;
    pols[np++] = (pol){"bf16", b, 3e-2, 4e-3};
    xent_precision bh = b;
    bh.lm_head = bh.logits = XENT_F32;
    pols[np++] = (pol){"bf16_fp32head", bh, 3e-2, 4e-3};
    xent_precision h = f;
    h.compute = h.residual = h.norm = h.attn_softmax = h.lm_head = h.logits = XENT_F16;
    h.loss_scale = 0; /* auto: 2^16, halved while a gradient overflows */
    pols[np++] = (pol){"fp16", h, 6e-3, 1e-3};
    xent_precision mixed = b; /* fp32 softmax with bf16 products: mixed-type products */
    mixed.attn_softmax = XENT_F32;
    mixed.micro_batches = 2;
    mixed.grad_accum = XENT_BF16;
    pols[np++] = (pol){"bf16_mb2_f32softmax", mixed, 3e-2, 4e-3};
    static const char *const fam[] = {"llama", "qwen2", "qwen3", "mistral", "gemma2",
                                      "gemma3_text"};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) compare_family(fam[i], pols, np);
}

/* The plan's refusal on the real card: a plan far beyond its memory. */
TEST(cuda_model_resident_refuses_too_big) {
    if (xent_cuda_device_count() < 1) {
        xt_skip("no CUDA device");
        return;
    }
    uint64_t fr = 0, tot = 0;
    CHECK(xent_model_dev_mem(&fr, &tot) == XENT_OK && fr > 0 && tot >= fr, "%s",
          xent_last_error());
    xent_model_config c;
    family_config("llama", &c);
    c.vocab = 1 << 20, c.dim = 8192, c.hidden = 16384, c.n_heads = 64, c.n_kv_heads = 8;
    c.head_dim = 128, c.n_layers = 80;
    xent_precision p = xent_precision_fp32();
    xent_model_dev_plan pl;
    CHECK(xent_model_dev_plan_make(&c, 8, 4096, 1, &p, &pl) == XENT_OK, "%s", xent_last_error());
    CHECK(xent_model_dev_plan_fits(&pl, fr, tot) == XENT_ERR_ALLOC && strstr(xent_last_error(),
          "free"), "a %lld-byte plan should not fit %llu free bytes", (long long)pl.total,
          (unsigned long long)fr);
}
