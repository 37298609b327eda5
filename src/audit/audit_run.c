/* src/audit/audit_run.c: drives the model engine for `xent audit`: one
 * recorded run under the reference policy, then one recorded run per
 * variant on the same tokens, each compared tensor by tensor with the
 * reference. */
#include "audit/audit.h"
#include "xent/io.h"
#include "model/model.h"
#include "model/core_dev.h"
#include "core/xent_math.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *openblas_get_corename(void); /* OpenBLAS */

/* One line on the CPU's matrix-product kernels: OpenBLAS 0.3.21 falls back
 * to its SSE3 "Prescott" kernels on AVX-512 CPUs it does not know. */
static void blas_note(const xent_audit_opts *o) {
    if (!o->progress) return;
    const char *core = openblas_get_corename();
    fprintf(stderr, "audit: CPU matrix products: OpenBLAS kernels %s\n", core ? core : "?");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (core && !strcmp(core, "Prescott") && __builtin_cpu_supports("avx512f"))
        fprintf(stderr, "audit: this CPU has AVX-512 but OpenBLAS runs its SSE3 kernels: "
                        "OPENBLAS_CORETYPE=SkylakeX makes the products about 2.5x faster "
                        "(docs/audit.md)\n");
#endif
}

#define MAX_TEXT_BYTES ((size_t)64 << 20)

void xent__audit_opts_init(xent_audit_opts *o) {
    memset(o, 0, sizeof *o);
    o->seed = 0;
    o->seq_len = 512;
    o->batch = 1;
    o->threads = 0;
    o->progress = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Inputs                                                                    */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

xent_status xent__audit_random_tokens(uint64_t seed, int64_t vocab, int64_t n,
                                      int32_t *out /* [n] */) {
    if (vocab < 1 || vocab > INT32_MAX)
        return xent_set_error(XENT_ERR_SHAPE, "vocab = %lld is outside [1, 2^31)",
                          (long long)vocab);
    uint64_t x = seed;
    for (int64_t i = 0; i < n; i++) /* multiply-shift: uniform up to 2^-32 */
        out[i] = (int32_t)(((splitmix64(&x) >> 32) * (uint64_t)vocab) >> 32);
    return XENT_OK;
}

static xent_status read_text(const char *path, char **buf, size_t *len) {
    FILE *f = xent_file_open(path, NULL); /* a regular file only: never blocks */
    if (!f) return XENT_ERR_IO; /* the message names the path */
    char *b = malloc(MAX_TEXT_BYTES + 1);
    if (!b) { fclose(f); return xent_set_error(XENT_ERR_ALLOC, "--text: out of memory"); }
    size_t n = fread(b, 1, MAX_TEXT_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err || n > MAX_TEXT_BYTES) {
        free(b);
        return xent_set_error(err ? XENT_ERR_IO : XENT_ERR_VALUE,
                          "--text %s: %s", path, err ? "read failed"
                          : "larger than 64 MiB");
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return XENT_OK;
}

/* Fits n text tokens into B x S: all rows full; S shrinks to n when the text
 * is shorter than one row. */
static void fit_shape(int64_t n, int64_t *B, int64_t *S) {
    if (n < *S) { *S = n; *B = 1; return; }
    if (n / *S < *B) *B = n / *S;
}

xent_status xent__audit_tokens(const xent_model *m, const xent_audit_opts *o,
                               int32_t **tokens, int64_t *B, int64_t *S) {
    if (o->seq_len < 2)
        return xent_set_error(XENT_ERR_VALUE, "--seq-len = %lld: needs at least 2 "
                          "tokens (one target)", (long long)o->seq_len);
    if (o->batch < 1 || o->batch > (1 << 20) || o->seq_len > (1 << 24))
        return xent_set_error(XENT_ERR_VALUE, "--batch = %lld / --seq-len = %lld "
                          "out of range", (long long)o->batch,
                          (long long)o->seq_len);
    *B = o->batch;
    *S = o->seq_len;
    if (!o->text_path) {
        int32_t *t = malloc(sizeof(int32_t) * (size_t)(*B * *S)); /* [B*S] */
        if (!t) return xent_set_error(XENT_ERR_ALLOC, "tokens: out of memory");
        xent_status st = xent__audit_random_tokens(o->seed, m->cfg.vocab,
                                                   *B * *S, t);
        if (st) { free(t); return st; }
        *tokens = t;
        return XENT_OK;
    }
    if (!m->tok)
        return xent_set_error(XENT_ERR_VALUE, "--text needs the model's tokenizer, "
                          "and %s has none%s%s (a GGUF file or a byte-level BPE "
                          "tokenizer.json carries one): use --random-tokens", m->source,
                          m->tok_note[0] ? ": " : "", m->tok_note);
    char *text = NULL;
    size_t len = 0;
    xent_status st = read_text(o->text_path, &text, &len);
    if (st) return st;
    int32_t *ids = NULL;
    int64_t n = 0;
    st = xent_tokenize(m->tok, text, len, &ids, &n);
    free(text);
    if (st) return st;
    if (n < 2) {
        free(ids);
        return xent_set_error(XENT_ERR_VALUE, "--text %s gives %lld token%s: at "
                          "least 2 are needed (one target)", o->text_path,
                          (long long)n, n == 1 ? "" : "s");
    }
    fit_shape(n, B, S);
    *tokens = ids; /* the first B*S ids are used */
    return XENT_OK;
}

/* ------------------------------------------------------------------------ */
/* Entries                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum src_kind {
    S_EMBED_OUT, S_LAYER_OUT, S_FINAL_NORM, S_LOGITS, S_LOGPROB, S_DLOGITS,
    S_LAYER_GRAD, S_EMBED_GRAD, S_PARAM_GRAD
} src_kind;

typedef struct src { src_kind kind; int idx; } src;

static xent_audit_role param_role(const xent_model *m, int i) {
    const char *nm = m->params[i].name;
    size_t l = strlen(nm);
    if (strstr(nm, "embed_tokens")) return XA_G_EMBED;
    if (strstr(nm, "lm_head")) return XA_G_LM_HEAD;
    if (strstr(nm, "norm")) return XA_G_NORM;
    if (l > 5 && !strcmp(nm + l - 5, ".bias")) return XA_G_BIAS;
    if (m->params[i].ndim == 2) return XA_G_LINEAR;
    return XA_G_OTHER;
}

/* Layer index from "model.layers.N....", else -1. */
static int param_layer(const char *nm) {
    const char *p = strstr(nm, "layers.");
    return p ? atoi(p + 7) : -1;
}

static int add_entry(xent_audit_result *r, src *srcs, int k, const char *name,
                     xent_audit_role role, int layer, src_kind kind, int idx) {
    snprintf(r->entries[k].name, sizeof r->entries[k].name, "%s", name);
    r->entries[k].role = role;
    r->entries[k].layer = layer;
    srcs[k] = (src){kind, idx};
    return k + 1;
}

/* Fills r->entries and srcs in report order; returns the count. */
static int build_entries(const xent_model *m, xent_audit_result *r, src *srcs) {
    int L = (int)m->cfg.n_layers, k = 0;
    char nm[96];
    k = add_entry(r, srcs, k, "embed.out", XA_OTHER, -1, S_EMBED_OUT, 0);
    for (int i = 0; i < L; i++) {
        snprintf(nm, sizeof nm, "layers.%d.out", i);
        k = add_entry(r, srcs, k, nm, XA_FW_LAYER, i, S_LAYER_OUT, i);
    }
    k = add_entry(r, srcs, k, "final_norm.out", XA_OTHER, -1, S_FINAL_NORM, 0);
    k = add_entry(r, srcs, k, "logits", XA_LOGITS, -1, S_LOGITS, 0);
    k = add_entry(r, srcs, k, "chosen_logprob", XA_LOGPROB, -1, S_LOGPROB, 0);
    k = add_entry(r, srcs, k, "dlogits", XA_DLOGITS, -1, S_DLOGITS, 0);
    for (int i = L - 1; i >= 0; i--) {
        snprintf(nm, sizeof nm, "layers.%d.in_grad", i);
        k = add_entry(r, srcs, k, nm, XA_BW_LAYER, i, S_LAYER_GRAD, i);
    }
    k = add_entry(r, srcs, k, "embed.out_grad", XA_OTHER, -1, S_EMBED_GRAD, 0);
    for (int i = 0; i < m->n_params; i++) {
        snprintf(nm, sizeof nm, "grad.%.90s", m->params[i].name);
        k = add_entry(r, srcs, k, nm, param_role(m, i),
                      param_layer(m->params[i].name), S_PARAM_GRAD, i);
    }
    return k;
}

static int n_entries_for(const xent_model *m) {
    return 7 + 2 * (int)m->cfg.n_layers + m->n_params;
}

/* The recorded array behind an entry (NULL when the engine left it out). */
static const float *source_of(const xent_model *m, const xent_model_record *rec,
                              src s, int64_t T, int64_t *n) {
    int64_t D = m->cfg.dim, V = m->cfg.vocab;
    switch (s.kind) {
    case S_EMBED_OUT: *n = T * D; return rec->embed_out;
    case S_LAYER_OUT: *n = T * D; return rec->layer_out ? rec->layer_out[s.idx] : NULL;
    case S_FINAL_NORM: *n = T * D; return rec->final_norm_out;
    case S_LOGITS: *n = T * V; return rec->logits;
    case S_DLOGITS: *n = T * V; return rec->dlogits;
    case S_LAYER_GRAD:
        *n = T * D;
        return rec->layer_in_grad ? rec->layer_in_grad[s.idx] : NULL;
    case S_EMBED_GRAD: *n = T * D; return rec->embed_grad;
    case S_PARAM_GRAD:
        *n = m->params[s.idx].numel;
        return rec->param_grads ? rec->param_grads[s.idx] : NULL;
    default: *n = 0; return NULL;
    }
}

/* ------------------------------------------------------------------------ */
/* Comparing one variant                                                     */
/* ------------------------------------------------------------------------ */

/* Chosen log-probs at the counted positions (s < S-1 of each row). */
static void gather_logprobs(const float *lp /* [B*S] */, int64_t B, int64_t S,
                            float *out /* [B*(S-1)] */) {
    for (int64_t b = 0; b < B; b++)
        memcpy(out + b * (S - 1), lp + b * S, sizeof(float) * (size_t)(S - 1));
}

/* Target gradient dL/dz_t at every counted position. */
static void gather_target_grad(const float *dl /* [T, V] */, const int32_t *tok,
                               int64_t B, int64_t S, int64_t V,
                               float *out /* [B*(S-1)] */) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s + 1 < S; s++) {
            int64_t row = b * S + s;
            out[b * (S - 1) + s] = dl ? dl[row * V + tok[row + 1]] : NAN;
        }
}

static void dead_zone(xent_audit_result *r, int v, const float *lp_v,
                      const float *lp_r, const float *g_v, const float *g_r) {
    int64_t a = 0, b = 0, e = 0;
    for (int64_t i = 0; i < r->n_targets; i++) {
        int dl = lp_v[i] == 0.0f && lp_r[i] != 0.0f;
        int dg = g_v[i] == 0.0f && g_r[i] != 0.0f;
        a += dl;
        b += dg;
        e += dl || dg;
    }
    r->dead_logprob[v] = a;
    r->dead_grad[v] = b;
    r->dead_any[v] = e;
}

typedef struct cmp_ctx {
    const xent_model *m;
    const xent_model_record *ref, *var;
    const src *srcs;
    const float *lp_ref; /* [nt] compact */
    const float *lp_var; /* [nt] compact */
    int64_t T;
    int threads;
} cmp_ctx;

static xent_status compare(const cmp_ctx *c, xent_audit_result *r, int v) {
    for (int e = 0; e < r->n_entries; e++) {
        xent_audit_metrics *mm = &r->m[(size_t)v * (size_t)r->n_entries + (size_t)e];
        int64_t n = 0;
        const float *a, *b;
        if (c->srcs[e].kind == S_LOGPROB) {
            a = c->lp_var;
            b = c->lp_ref;
            n = r->n_targets;
        } else {
            a = source_of(c->m, c->var, c->srcs[e], c->T, &n);
            b = source_of(c->m, c->ref, c->srcs[e], c->T, &n);
        }
        if (!a || !b) n = 0; /* not recorded: NaN metrics */
        xent_status st = xent__audit_metrics_mt(a, b, n, c->threads, mm);
        if (st) return st;
    }
    return XENT_OK;
}

/* ------------------------------------------------------------------------ */
/* Loss-scale calibration                                                    */
/* ------------------------------------------------------------------------ */

static double max_abs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; x && i < n; i++) {
        double a = fabs((double)x[i]);
        if (a > m) m = a;
    }
    return m;
}

/* Largest gradient magnitude of a recorded run. */
static double largest_grad(const xent_model *m, const xent_model_record *rec,
                           int64_t T) {
    int64_t D = m->cfg.dim, V = m->cfg.vocab;
    double g = max_abs(rec->dlogits, T * V);
    g = fmax(g, max_abs(rec->embed_grad, T * D));
    for (int64_t l = 0; rec->layer_in_grad && l < m->cfg.n_layers; l++)
        g = fmax(g, max_abs(rec->layer_in_grad[l], T * D));
    for (int i = 0; rec->param_grads && i < m->n_params; i++)
        g = fmax(g, max_abs(rec->param_grads[i], m->params[i].numel));
    return g;
}

double xent__audit_pick_loss_scale(double largest_grad) {
    /* the largest scaled gradient stays below 65504 / 2^XA_SCALE_HEADROOM */
    if (!(largest_grad > 0) || !isfinite(largest_grad)) return 1.0;
    double e = floor(log2(65504.0 / 8.0 / largest_grad));
    e = e < -24 ? -24 : (e > 24 ? 24 : e);
    return ldexp(1.0, (int)e);
}

static int uses_f16(const xent_precision *p) {
    return p->compute == XENT_F16 || p->residual == XENT_F16 ||
           p->norm == XENT_F16 || p->attn_softmax == XENT_F16 ||
           p->lm_head == XENT_F16 || p->logits == XENT_F16 ||
           p->grad_accum == XENT_F16;
}

/* ------------------------------------------------------------------------ */
/* The audit                                                                 */
/* ------------------------------------------------------------------------ */

/* One workspace serves every run: after the reference's run, the tensors
 * the comparisons read are copied out (snap), so the variants can reuse the
 * workspace (the activations the backward pass needs are not kept: about a
 * third less memory to fault in than a second workspace). */
typedef struct audit_bufs {
    src *srcs;        /* [ne] */
    float *lp_ref;    /* [nt] */
    float *g_ref;     /* [nt] target gradients of the reference */
    float *g_var;     /* [nt] */
    xent_model_ws *ws;
    float *snap;      /* the reference's recorded tensors (snap_ref)       */
    float **snap_ptr; /* [2 L + n_params] row pointers into snap           */
} audit_bufs;

static void bufs_free(audit_bufs *b) {
    free(b->srcs);
    free(b->lp_ref);
    free(b->g_ref);
    free(b->g_var);
    free(b->snap);
    free(b->snap_ptr);
    xent_model_ws_free(b->ws);
}

typedef struct copy_job { float *dst; const float *src; } copy_job;

static void copy_range(void *vj, int64_t i0, int64_t i1) {
    copy_job *j = vj;
    memcpy(j->dst + i0, j->src + i0, sizeof(float) * (size_t)(i1 - i0));
}

/* dst[n] = src[n] (when src), split over threads; returns dst + n. */
static float *take(float *dst, const float *src, int64_t n, int threads,
                   float **out) {
    *out = src ? dst : NULL;
    if (!src) return dst;
    copy_job j = {dst, src};
    xent_parallel_for(n, n < ((int64_t)1 << 20) ? 1 : threads, copy_range,
                       &j);
    return dst + n;
}

/* *rec with its arrays copied into b->snap (every pointer the comparisons
 * read through source_of; scalars as they are). */
static xent_status snap_ref(const xent_model *m, int64_t T, int threads,
                            audit_bufs *b, xent_model_record *rec) {
    int64_t L = m->cfg.n_layers, D = m->cfg.dim, V = m->cfg.vocab;
    int64_t n = T * D * (2 * L + 3) + 2 * T * V + xent_model_n_weights(m);
    b->snap = malloc(sizeof(float) * (size_t)n);
    b->snap_ptr = calloc((size_t)(2 * L + m->n_params), sizeof(float *));
    if (!b->snap || !b->snap_ptr)
        return xent_set_error(XENT_ERR_ALLOC, "audit: reference copy of %lld "
                          "floats", (long long)n);
    float *p = b->snap, **lo = b->snap_ptr, **lg = lo + L, **pg = lg + L;
    p = take(p, rec->embed_out, T * D, threads, &rec->embed_out);
    for (int64_t l = 0; rec->layer_out && l < L; l++)
        p = take(p, rec->layer_out[l], T * D, threads, &lo[l]);
    rec->layer_out = rec->layer_out ? lo : NULL;
    p = take(p, rec->final_norm_out, T * D, threads, &rec->final_norm_out);
    p = take(p, rec->logits, T * V, threads, &rec->logits);
    p = take(p, rec->dlogits, T * V, threads, &rec->dlogits);
    for (int64_t l = 0; rec->layer_in_grad && l < L; l++)
        p = take(p, rec->layer_in_grad[l], T * D, threads, &lg[l]);
    rec->layer_in_grad = rec->layer_in_grad ? lg : NULL;
    p = take(p, rec->embed_grad, T * D, threads, &rec->embed_grad);
    for (int i = 0; rec->param_grads && i < m->n_params; i++)
        p = take(p, rec->param_grads[i], m->params[i].numel, threads, &pg[i]);
    rec->param_grads = rec->param_grads ? pg : NULL;
    rec->logprobs = NULL; /* gathered into b->lp_ref before */
    return XENT_OK;
}

static xent_status bufs_new(const xent_model *m, int64_t B, int64_t S, int ne,
                            int64_t nt, audit_bufs *b) {
    memset(b, 0, sizeof *b);
    b->srcs = calloc((size_t)ne, sizeof *b->srcs);
    b->lp_ref = calloc((size_t)nt, sizeof(float));
    b->g_ref = calloc((size_t)nt, sizeof(float));
    b->g_var = calloc((size_t)nt, sizeof(float));
    if (!b->srcs || !b->lp_ref || !b->g_ref || !b->g_var)
        return xent_set_error(XENT_ERR_ALLOC, "audit: out of memory");
    xent_status st = xent_model_ws_new(m, B, S, 1, &b->ws);
    /* variants that differ from the one before only from the final norm on
     * (bf16 -> bf16_fp32head) reuse its forward through the layers */
    if (!st) xent_model_ws_reuse_forward(b->ws, 1);
    return st;
}

static void fill_settings(const xent_model *m, const int32_t *tokens,
                          int64_t B, int64_t S, const xent_audit_opts *o,
                          xent_audit_result *r) {
    int w = (int)sizeof r->model - 80;
    snprintf(r->model, sizeof r->model, "%.*s (%.60s)", w, m->source,
             m->source_type);
    if (o->text_path) snprintf(r->input, sizeof r->input, "text %s", o->text_path);
    else snprintf(r->input, sizeof r->input, "random tokens, seed %llu",
                  (unsigned long long)o->seed);
    r->seed = o->seed;
    r->seq_len = S;
    r->batch = B;
    r->n_layers = (int)m->cfg.n_layers;
    r->tied_head = m->cfg.tied_head;
    r->random_weights = m->random_weights;
    r->threads = xent_num_threads(o->threads);
    r->gemm_device = o->gemm_device;
    memcpy(r->tokens, tokens, sizeof(int32_t) * (size_t)(B * S));
}

/* Per-layer progress: the model engine's layer hook
 * (xent_model_run_opts.on_layer(ctx, layer, backward) after each layer's
 * forward and backward, model/model.h) forwarded to o->on_layer with the
 * variant's index. */
typedef struct layer_relay {
    const xent_audit_opts *o;
    int variant, n_layers;
} layer_relay;

static void relay_layer(void *ctx, int64_t layer, int backward) {
    const layer_relay *lr = ctx;
    lr->o->on_layer(lr->o->on_layer_ctx, lr->variant, (int)layer, lr->n_layers, backward);
}

static xent_status run_one(const xent_model *m, xent_model_ws *ws,
                           const xent_precision *p, const int32_t *tokens,
                           int64_t B, int64_t S, const xent_audit_opts *o,
                           int gemm_device, int variant,
                           xent_model_record *rec) {
    xent_model_run_opts ro;
    xent_model_run_opts_init(&ro);
    ro.B = B;
    ro.S = S;
    ro.tokens = tokens;
    ro.backward = 1;
    ro.record = 1;
    ro.threads = o->threads;
    ro.gemm_device = gemm_device;
    layer_relay lr = {o, variant, (int)m->cfg.n_layers};
    if (o->on_layer) {
        ro.on_layer = relay_layer;
        ro.on_layer_ctx = &lr;
    }
    return xent_model_run(m, ws, p, &ro, rec);
}

/* secs: run plus comparison; r->seconds[v]: the run alone. */
static void progress(const xent_audit_opts *o, const xent_audit_result *r,
                     int k, int v, double secs) {
    if (!o->progress && !o->log) return;
    char line[256];
    snprintf(line, sizeof line, "audit: [%d/%d] %-16s run %6.1f s, compare %4.1f s, loss "
             "%.6f, loss scale %g", k, r->variants.n, r->variants.v[v].name,
             r->seconds[v], secs - r->seconds[v], r->loss[v], r->loss_scale[v]);
    if (o->log) o->log(o->log_ctx, k, r->variants.n, o->progress ? line : NULL);
    else fprintf(stderr, "%s\n", line);
}

/* Runs variant v (not the reference) and compares it. */
/* 1 when a gradient tensor of variant v has a non-finite value. */
static int grads_overflowed(const xent_audit_result *r, int v) {
    for (int e = 0; e < r->n_entries; e++) {
        xent_audit_role role = r->entries[e].role;
        int grad = role == XA_DLOGITS || role == XA_BW_LAYER ||
                   (role >= XA_G_LM_HEAD && role <= XA_G_OTHER);
        if (grad && r->m[(size_t)v * (size_t)r->n_entries + (size_t)e].n_nonfinite)
            return 1;
    }
    return 0;
}

/* One run of variant v at policy p, compared with the reference. */
static xent_status run_and_compare(const xent_model *m, const int32_t *tokens,
                                   int64_t B, int64_t S,
                                   const xent_audit_opts *o, audit_bufs *b,
                                   const xent_model_record *ref,
                                   const xent_precision *p,
                                   xent_audit_result *r, int v) {
    double t0 = now_s();
    xent_model_record rec;
    xent_status st = run_one(m, b->ws, p, tokens, B, S, o, o->gemm_device, v, &rec);
    if (st) return st;
    r->seconds[v] = now_s() - t0;
    r->loss[v] = rec.loss;
    r->loss_scale[v] = rec.loss_scale > 0 ? rec.loss_scale : p->loss_scale;
    float *lp = r->logprob + (size_t)v * (size_t)r->n_targets;
    gather_logprobs(rec.logprobs, B, S, lp);
    gather_target_grad(rec.dlogits, tokens, B, S, m->cfg.vocab, b->g_var);
    dead_zone(r, v, lp, b->lp_ref, b->g_var, b->g_ref);
    cmp_ctx c = {m, ref, &rec, b->srcs, b->lp_ref, lp, B * S,
                 xent_num_threads(o->threads)};
    return compare(&c, r, v);
}

/* Runs variant v (not the reference) and compares it. An auto loss scale
 * starts from the calibration and is halved while a gradient overflows
 * (at most 8 times). */
static xent_status audit_variant(const xent_model *m, const int32_t *tokens,
                                 int64_t B, int64_t S, const xent_audit_opts *o,
                                 audit_bufs *b, const xent_model_record *ref,
                                 double calib_grad, xent_audit_result *r,
                                 int v) {
    xent_precision p = r->variants.v[v].p;
    int autoscale = p.loss_scale == 0 && uses_f16(&p);
    if (p.loss_scale == 0)
        p.loss_scale = autoscale ? xent__audit_pick_loss_scale(calib_grad) : 1.0;
    for (int tries = 0;; tries++) {
        xent_status st = run_and_compare(m, tokens, B, S, o, b, ref, &p, r, v);
        if (st || !autoscale || tries == 8 || !grads_overflowed(r, v)) return st;
        if (o->progress) {
            char line[256];
            snprintf(line, sizeof line, "audit: %s: a gradient overflowed at loss "
                     "scale %g; again at %g", r->variants.v[v].name, p.loss_scale,
                     p.loss_scale / 2);
            if (o->log) o->log(o->log_ctx, -1, r->variants.n, line);
            else fprintf(stderr, "%s\n", line);
        }
        p.loss_scale /= 2;
    }
}

static xent_status audit_reference(const xent_model *m, const int32_t *tokens,
                                   int64_t B, int64_t S,
                                   const xent_audit_opts *o, audit_bufs *b,
                                   xent_model_record *ref,
                                   xent_audit_result *r) {
    int v = r->ref;
    xent_precision p = r->variants.v[v].p;
    p.loss_scale = 1.0;
    double t0 = now_s();
    xent_status st = run_one(m, b->ws, &p, tokens, B, S, o, 0, v, ref);
    if (st) return st;
    r->seconds[v] = now_s() - t0;
    r->loss[v] = ref->loss;
    r->loss_scale[v] = 1.0;
    gather_logprobs(ref->logprobs, B, S, b->lp_ref);
    gather_target_grad(ref->dlogits, tokens, B, S, m->cfg.vocab, b->g_ref);
    memcpy(r->logprob + (size_t)v * (size_t)r->n_targets, b->lp_ref,
           sizeof(float) * (size_t)r->n_targets);
    dead_zone(r, v, b->lp_ref, b->lp_ref, b->g_ref, b->g_ref);
    cmp_ctx c = {m, ref, ref, b->srcs, b->lp_ref, b->lp_ref, B * S,
                 xent_num_threads(o->threads)};
    st = compare(&c, r, v);
    return st ? st : snap_ref(m, B * S, xent_num_threads(o->threads), b, ref);
}

/* --device cuda (gemm_device 2): each variant's device memory plan, printed
 * before any run (a line each, like the progress lines), and the largest
 * checked against the card's free memory: a model that does not fit is
 * refused before the reference's run. */
static xent_status device_plan(const xent_model *m, int64_t B, int64_t S,
                               const xent_audit_variants *vs, int ref,
                               const xent_audit_opts *o) {
    uint64_t fr = 0, tot = 0;
    xent_status st = xent_model_dev_mem(&fr, &tot);
    if (st) return st;
    xent_model_dev_plan worst;
    memset(&worst, 0, sizeof worst);
    for (int v = 0; v < vs->n; v++) {
        if (v == ref) continue;
        xent_model_dev_plan pl;
        st = xent_model_dev_plan_make(&m->cfg, B, S, 1, &vs->v[v].p, &pl);
        if (st) return st;
        if (pl.total > worst.total) worst = pl;
        if (!o->progress) continue;
        char line[512], plan[400];
        xent_model_dev_plan_str(&pl, plan, sizeof plan);
        snprintf(line, sizeof line, "audit: device plan %-16s %s (GPU: %.2f GiB free of %.2f)",
                 vs->v[v].name, plan, (double)fr / (1024.0 * 1024 * 1024),
                 (double)tot / (1024.0 * 1024 * 1024));
        if (o->log) o->log(o->log_ctx, -1, vs->n, line);
        else fprintf(stderr, "%s\n", line);
    }
    return xent_model_dev_plan_fits(&worst, fr, tot);
}

xent_status xent__audit_run(const xent_model *m, const int32_t *tokens,
                            int64_t B, int64_t S,
                            const xent_audit_variants *vs,
                            const xent_audit_opts *o, xent_audit_result *r) {
    int ref;
    xent_status st = xent__audit_find_reference(vs, &ref);
    if (st) return st;
    if (S < 2 || B < 1)
        return xent_set_error(XENT_ERR_VALUE, "audit: %lld x %lld tokens: at least "
                          "2 per row are needed", (long long)B, (long long)S);
    if (o->gemm_device == 2 && (st = device_plan(m, B, S, vs, ref, o))) return st;
    double t_start = now_s();
    blas_note(o);
    int ne = n_entries_for(m);
    int64_t nt = B * (S - 1);
    memset(r, 0, sizeof *r);
    st = xent__audit_result_alloc(r, vs->n, ne, nt, B * S);
    if (st) return st;
    r->variants = *vs;
    r->ref = ref;
    fill_settings(m, tokens, B, S, o, r);
    st = xent__audit_result_token_text(r, m->tok);
    if (st) {
        xent__audit_result_free(r);
        return st;
    }
    audit_bufs b;
    st = bufs_new(m, B, S, ne, nt, &b);
    if (!st) r->n_entries = build_entries(m, r, b.srcs);
    xent_model_record rec_ref;
    double t0 = now_s();
    if (!st) st = audit_reference(m, tokens, B, S, o, &b, &rec_ref, r);
    if (!st) progress(o, r, 1, ref, now_s() - t0);
    double calib = st ? 0 : largest_grad(m, &rec_ref, B * S);
    for (int v = 0, k = 2; !st && v < vs->n; v++) {
        if (v == ref) continue;
        t0 = now_s();
        st = audit_variant(m, tokens, B, S, o, &b, &rec_ref, calib, r, v);
        if (!st) progress(o, r, k++, v, now_s() - t0);
    }
    bufs_free(&b);
    r->total_seconds = now_s() - t_start;
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", xent_last_error());
        xent__audit_result_free(r);
        return xent_set_error(st, "audit: %s", msg);
    }
    return XENT_OK;
}
