/* src/model/core_f32.c: the fp32 model under a precision policy: the
 * workspace (one arena planned up front) and xent_model_run. */
#define R float
#define GEMM cblas_sgemm
#define ROUNDING 1
#include "model/core_impl.h"
#include "model/core_dev.h"

#include <stdio.h>
#include <sys/mman.h>

/* Large buffers (activations, gradients, weight copies: hundreds of MB) on
 * 2 MiB boundaries with transparent huge pages requested: first touch costs
 * one fault per 2 MiB instead of per 4 KiB, and the matrix products miss the
 * TLB less. Contents are as malloc's (uninitialised); free with free(). */
static void *big_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge) return malloc(bytes ? bytes : 1);
    size_t n = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, n)) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
    return p;
}

struct xent_model_ws {
    const xent_model *m;
    int64_t B, S;       /* planned shape                                    */
    int record;
    int64_t cap;        /* floats in arena                                  */
    float *arena;       /* activations and scratch                          */
    float *grads;       /* [n_weights] returned gradients                   */
    float *gmb;         /* [n_weights] micro-batch gradients (lazy)         */
    float *wc;          /* [n_weights] compute-dtype weights (lazy)         */
    float *whead;       /* [V, D] lm_head-dtype head weight (lazy)          */
    xent_dtype wc_dt, whead_dt; /* what wc / whead hold (F32 = not made)    */
    float **x;          /* [L+1]                                            */
    xm_layer *ly;       /* [L]                                              */
    float **rec_dx;     /* [L]                                              */
    float **gptr;       /* [n_params] into grads                            */
    float **gmbp;       /* [n_params] into gmb                              */
    const float **wptr; /* [n_params]                                       */
    int32_t *lab;       /* [B*S]                                            */
    double *rw;         /* [B*S]                                            */
    float *logprob;     /* [B*S]                                            */
    float *rope;        /* [2, 2, S, hd/2] global and sliding layers' tables */
    float **layer_out;  /* [L] record pointers                              */
    /* The forward through the layers in the arena (reused by the next run
     * when tokens, weights dtype and the body's dtypes are the same, as for
     * two policies that differ only from the final norm on): */
    int reuse_fwd;      /* xent_model_ws_reuse_forward                      */
    int fwd_ok;         /* 1: the fields below describe the arena           */
    xent_dtype fwd_dt[4]; /* compute, residual, norm, attn_softmax          */
    int fwd_dev;        /* gemm_device of that forward                      */
    int64_t fwd_B, fwd_S;
    int32_t *fwd_tok;   /* [B*S]                                            */
    void *dev;          /* the resident pass's device state (gemm_device 2;
                           src/model/core_dev.h), NULL until first used     */
};

void xent_model_run_opts_init(xent_model_run_opts *o) {
    memset(o, 0, sizeof *o);
    o->backward = 1;
}

void xent_model_ws_reuse_forward(xent_model_ws *ws, int on) {
    if (ws) ws->reuse_fwd = on != 0;
}

size_t xent_model_ws_bytes(const xent_model_ws *ws) {
    return ws ? (size_t)ws->cap * sizeof(float) : 0;
}

void xent_model_ws_free(xent_model_ws *ws) {
    if (!ws) return;
    free(ws->arena), free(ws->grads), free(ws->gmb), free(ws->wc);
    free(ws->whead), free(ws->x), free(ws->ly), free(ws->rec_dx);
    free(ws->gptr), free(ws->gmbp), free(ws->wptr), free(ws->lab);
    free(ws->rw), free(ws->logprob), free(ws->rope), free(ws->layer_out);
    free(ws->fwd_tok);
    xent__model_dev_free(ws->dev);
    free(ws);
}

static int64_t ws_plan(xent_model_ws *ws, float *base, int64_t Bfull,
                       int64_t b0, int64_t Bm, int64_t S, int record,
                       xm_ctx *c) {
    memset(c, 0, sizeof *c);
    c->c = &ws->m->cfg;
    c->x = ws->x;
    c->ly = ws->ly;
    c->rec_dx = ws->rec_dx;
    return plan(c, base, Bfull, b0, Bm, S, record);
}

xent_status xent_model_ws_new(const xent_model *m, int64_t B, int64_t S,
                              int record, xent_model_ws **out) {
    if (!m || !out) return xent_set_error(XENT_ERR_NULL, "model_ws_new: NULL");
    if (B <= 0 || S <= 0 || B > ((int64_t)1 << 30) / S)
        return xent_set_error(XENT_ERR_SHAPE, "model_ws_new: B = %lld, S = %lld",
                          (long long)B, (long long)S);
    const xent_model_config *cfg = &m->cfg;
    int64_t L = cfg->n_layers, T = B * S, nw = xent_model_n_weights(m);
    xent_model_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return xent_set_error(XENT_ERR_ALLOC, "model workspace");
    ws->m = m;
    ws->B = B;
    ws->S = S;
    ws->record = record != 0;
    ws->x = calloc((size_t)(L + 1), sizeof *ws->x);
    ws->ly = calloc((size_t)L, sizeof *ws->ly);
    ws->rec_dx = calloc((size_t)L, sizeof *ws->rec_dx);
    ws->layer_out = calloc((size_t)L, sizeof *ws->layer_out);
    ws->gptr = calloc((size_t)m->n_params, sizeof *ws->gptr);
    ws->gmbp = calloc((size_t)m->n_params, sizeof *ws->gmbp);
    ws->wptr = calloc((size_t)m->n_params, sizeof *ws->wptr);
    ws->lab = malloc((size_t)T * sizeof *ws->lab);
    ws->rw = malloc((size_t)T * sizeof *ws->rw);
    ws->logprob = malloc((size_t)T * sizeof *ws->logprob);
    ws->fwd_tok = malloc((size_t)T * sizeof *ws->fwd_tok);
    ws->rope = malloc((size_t)(2 * S * cfg->head_dim) * sizeof(float));
    ws->grads = big_alloc((size_t)nw * sizeof(float));
    xm_ctx c;
    ws->cap = ws_plan(ws, NULL, B, 0, B, S, ws->record, &c);
    ws->arena = big_alloc((size_t)ws->cap * sizeof(float));
    if (!ws->x || !ws->ly || !ws->rec_dx || !ws->layer_out || !ws->gptr ||
        !ws->gmbp || !ws->wptr || !ws->lab || !ws->rw || !ws->logprob ||
        !ws->rope || !ws->grads || !ws->arena || !ws->fwd_tok) {
        xent_model_ws_free(ws);
        return xent_set_error(XENT_ERR_ALLOC,
                          "model workspace: %lld floats for B = %lld, S = "
                          "%lld", (long long)ws->cap, (long long)B,
                          (long long)S);
    }
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        ws->gptr[i] = ws->grads + off;
        off += m->params[i].numel;
    }
    *out = ws;
    return XENT_OK;
}

/* Labels (explicit or shifted) and per-row weights dL/d(nll_t). */
xent_status xent__model_targets(const xent_model *m,
                                const xent_model_run_opts *o, int32_t *lab,
                                double *rw, int64_t *n_counted) {
    int64_t T = o->B * o->S, V = m->cfg.vocab, n = 0;
    for (int64_t t = 0; t < T; t++)
        if (o->tokens[t] < 0 || o->tokens[t] >= V)
            return xent_set_error(XENT_ERR_LABEL,
                              "tokens[%lld] = %d is outside [0, %lld)",
                              (long long)t, o->tokens[t], (long long)V);
    for (int64_t t = 0; t < T; t++) {
        int32_t y;
        if (o->labels) y = o->labels[t];
        else y = (t % o->S == o->S - 1) ? -100 : o->tokens[t + 1];
        if (y != -100 && (y < 0 || y >= V))
            return xent_set_error(XENT_ERR_LABEL,
                              "labels[%lld] = %d is outside [0, %lld)",
                              (long long)t, y, (long long)V);
        if (o->advantages && y != -100 && !isfinite(o->advantages[t]))
            return xent_set_error(XENT_ERR_VALUE, "advantages[%lld] = %g",
                              (long long)t, (double)o->advantages[t]);
        lab[t] = y < 0 ? -100 : y;
        n += y >= 0;
    }
    for (int64_t t = 0; t < T; t++)
        rw[t] = lab[t] < 0 ? 0.0
                           : (o->advantages ? (double)o->advantages[t] : 1.0) /
                                 (double)(n ? n : 1);
    *n_counted = n;
    return XENT_OK;
}

/* Cross-entropy rows through xent_ce (exact) or a common form. */
static xent_status loss_step(xm_ctx *c, int backward) {
    int64_t T = c->T, V = c->c->vocab;
    float *gr = malloc((size_t)T * sizeof(float));  /* [T] */
    float *nll = malloc((size_t)T * sizeof(float)); /* [T] */
    if (!gr || !nll) {
        free(gr), free(nll);
        return xent_set_error(XENT_ERR_ALLOC, "model loss: %lld rows",
                          (long long)T);
    }
    for (int64_t t = 0; t < T; t++) gr[t] = (float)c->rw[t];
    xent_status st = XENT_OK;
    if (c->form == XENT_CE_EXACT) {
        xent_ce_opts o;
        xent_ce_opts_init(&o);
        o.reduction = XENT_REDUCE_NONE;
        o.threads = c->threads;
        xent_ce_input in = {c->logits, XENT_F32, T, V, V, c->lab, XENT_I32,
                            gr};
        xent_ce_output out;
        memset(&out, 0, sizeof out);
        out.nll = nll;
        out.grad = backward ? c->dlogits : NULL;
        out.grad_dtype = XENT_F32;
        st = xent_ce(&in, &o, &out);
    } else {
        float *row = malloc((size_t)V * sizeof(float)); /* [V] */
        if (!row) st = xent_set_error(XENT_ERR_ALLOC, "model loss: row");
        for (int64_t t = 0; row && t < T; t++) {
            float *z = c->logits + t * V, *d = c->dlogits + t * V;
            if (c->lab[t] < 0) {
                nll[t] = 0;
                if (backward) memset(d, 0, (size_t)V * sizeof(float));
                continue;
            }
            xent__ce_form_row(c->form, z, V, c->lab[t], &nll[t],
                              backward ? row : NULL);
            if (backward)
                for (int64_t j = 0; j < V; j++) d[j] = row[j] * gr[t];
        }
        free(row);
    }
    c->loss = 0;
    for (int64_t t = 0; !st && t < T; t++) {
        c->loss += c->rw[t] * nll[t];
        c->logprob[t] = c->lab[t] < 0 ? 0.0f : -nll[t];
    }
    if (!st && backward) rnd(c->dlogits, T * V, c->dt_comp);
    free(gr), free(nll);
    return st;
}

typedef struct rcopy_job {
    float *dst;
    const float *src;
    xent_dtype t;
} rcopy_job;

static void rcopy_range(void *vj, int64_t i0, int64_t i1) {
    rcopy_job *j = vj;
    memcpy(j->dst + i0, j->src + i0, (size_t)(i1 - i0) * sizeof(float));
    rnd(j->dst + i0, i1 - i0, j->t);
}

/* dst[n] = src[n] rounded to t, elementwise (large copies split over all
 * threads: the first touch of a fresh copy is most of its cost). */
static void round_copy(float *dst, const float *src, int64_t n,
                       xent_dtype t, int threads) {
    rcopy_job j = {dst, src, t};
    xent_parallel_for(n, n < ((int64_t)1 << 20) ? 1 : threads, rcopy_range,
                       &j);
}

/* Weights as the policy stores them: compute-dtype copies (lazy, kept while
 * the dtype is unchanged) and the head in the lm_head dtype. */
static xent_status ws_weights(xent_model_ws *ws, const xent_precision *p,
                              const float **whead, int thr) {
    const xent_model *m = ws->m;
    int64_t nw = xent_model_n_weights(m), V = m->cfg.vocab, D = m->cfg.dim;
    int ih = xent__pidx_head(&m->cfg);
    if (p->compute == XENT_F32) {
        for (int i = 0; i < m->n_params; i++) ws->wptr[i] = m->params[i].w;
    } else {
        if (!ws->wc) ws->wc = big_alloc((size_t)nw * sizeof(float));
        if (!ws->wc) return xent_set_error(XENT_ERR_ALLOC, "model: weight copy");
        int64_t off = 0;
        for (int i = 0; i < m->n_params; i++) {
            ws->wptr[i] = ws->wc + off;
            if (ws->wc_dt != p->compute)
                round_copy(ws->wc + off, m->params[i].w, m->params[i].numel,
                           p->compute, thr);
            off += m->params[i].numel;
        }
        ws->wc_dt = p->compute;
    }
    if (p->lm_head == p->compute) {
        *whead = ws->wptr[ih];
    } else if (p->lm_head == XENT_F32) {
        *whead = m->params[ih].w;
    } else {
        if (!ws->whead) ws->whead = big_alloc((size_t)(V * D) * sizeof(float));
        if (!ws->whead) return xent_set_error(XENT_ERR_ALLOC, "model: head copy");
        if (ws->whead_dt != p->lm_head) {
            round_copy(ws->whead, m->params[ih].w, V * D, p->lm_head, thr);
            ws->whead_dt = p->lm_head;
        }
        *whead = ws->whead;
    }
    return XENT_OK;
}

static int is_storage_dtype(xent_dtype t) {
    return t == XENT_F32 || t == XENT_BF16 || t == XENT_F16;
}

static xent_status check_run(const xent_model *m, const xent_model_ws *ws,
                             const xent_precision *p,
                             const xent_model_run_opts *o) {
    if (!m || !ws || !p || !o || !o->tokens)
        return xent_set_error(XENT_ERR_NULL, "model_run: NULL argument");
    if (ws->m != m)
        return xent_set_error(XENT_ERR_VALUE,
                          "model_run: workspace made for another model");
    if (o->B <= 0 || o->S <= 0)
        return xent_set_error(XENT_ERR_SHAPE, "model_run: B = %lld, S = %lld",
                          (long long)o->B, (long long)o->S);
    if (o->record && !ws->record)
        return xent_set_error(XENT_ERR_VALUE,
                          "model_run: record needs a workspace made with "
                          "record = 1");
    xent_dtype d[] = {p->compute, p->residual, p->norm, p->attn_softmax,
                      p->lm_head, p->logits, p->grad_accum};
    const char *nm[] = {"compute", "residual", "norm", "attn_softmax",
                        "lm_head", "logits", "grad_accum"};
    for (int i = 0; i < 7; i++)
        if (!is_storage_dtype(d[i]))
            return xent_set_error(XENT_ERR_DTYPE,
                              "precision.%s = %d is not f32, bf16 or f16",
                              nm[i], (int)d[i]);
    if (o->gemm_device < 0 || o->gemm_device > 2)
        return xent_set_error(XENT_ERR_VALUE,
                          "model_run: gemm_device = %d is not 0 (CPU), 1 (GPU "
                          "products) or 2 (resident GPU pass)", o->gemm_device);
    if (p->ce < 0 || p->ce >= XENT_CE_FORM_COUNT)
        return xent_set_error(XENT_ERR_VALUE, "precision.ce = %d", (int)p->ce);
    if (p->micro_batches < 1 || o->B % p->micro_batches)
        return xent_set_error(XENT_ERR_SHAPE,
                          "precision.micro_batches = %d does not divide "
                          "B = %lld", p->micro_batches, (long long)o->B);
    if (!(p->loss_scale >= 0) || !isfinite(p->loss_scale))
        return xent_set_error(XENT_ERR_VALUE, "precision.loss_scale = %g",
                          p->loss_scale);
    xm_ctx c;
    int64_t need = ws_plan((xent_model_ws *)ws, NULL, o->B, 0, o->B, o->S,
                           ws->record, &c);
    if (need > ws->cap || o->B * o->S > ws->B * ws->S || o->S > ws->S)
        return xent_set_error(XENT_ERR_SHAPE,
                          "model_run: B = %lld, S = %lld does not fit the "
                          "workspace planned for B = %lld, S = %lld",
                          (long long)o->B, (long long)o->S, (long long)ws->B,
                          (long long)ws->S);
    return XENT_OK;
}

/* Elementwise loops over all gradients, split over threads (each element
 * is computed alone: the results do not depend on the split). */
typedef struct accum_job {
    float *g;          /* [nw] accumulated gradients                       */
    const float *gmb;  /* [nw] this micro-batch's (scaled) gradients; may
                          be g itself (one micro-batch)                    */
    float inv;         /* 1 / loss scale                                   */
    xent_dtype dt;     /* grad_accum dtype                                 */
    int first;         /* 1: the sum starts here (from +0)                 */
    int64_t n;         /* finite_range: elements, split in `parts` parts   */
    int parts;
    int bad[64];       /* finite_range: 1 where part k saw a non-finite    */
} accum_job;

static void accum_range(void *vj, int64_t i0, int64_t i1) {
    accum_job *j = vj;
    for (int64_t i = i0; i < i1; i++) {
        float base = j->first ? 0.0f : j->g[i];
        j->g[i] = rnd1(base + j->gmb[i] * j->inv, j->dt);
    }
}

/* Parts [k0, k1) of j->parts: bad[k] = 1 when part k holds a non-finite. */
static void finite_range(void *vj, int64_t k0, int64_t k1) {
    accum_job *j = vj;
    for (int64_t k = k0; k < k1; k++) {
        int64_t lo = j->n * k / j->parts, hi = j->n * (k + 1) / j->parts;
        int b = 0;
        for (int64_t i = lo; i < hi; i++) b |= !isfinite(j->g[i]);
        j->bad[k] = b;
    }
}

/* One pass over all micro-batches at loss scale ls; gradients (unscaled,
 * accumulated in the grad_accum dtype) in ws->grads. Returns 1 in *bad when
 * a gradient is not finite. */
static xent_status run_pass(const xent_model *m, xent_model_ws *ws,
                            const xent_precision *p,
                            const xent_model_run_opts *o, const float *whead,
                            double ls, int keep_layers, double *loss,
                            int *bad) {
    int nmb = p->micro_batches, bw = o->backward;
    int64_t Bm = o->B / nmb, nw = xent_model_n_weights(m);
    int direct = nmb == 1 && p->grad_accum == XENT_F32 && ls == 1.0;
    /* one micro-batch: the scaled gradients go to ws->grads and are unscaled
     * there (no second buffer: 0 + g * inv, as with a zeroed sum) */
    int inplace = nmb == 1 && !direct;
    if (bw && !direct && !inplace && !ws->gmb) {
        ws->gmb = big_alloc((size_t)nw * sizeof(float));
        if (!ws->gmb)
            return xent_set_error(XENT_ERR_ALLOC, "model: micro-batch gradients");
        int64_t off = 0;
        for (int i = 0; i < m->n_params; i++, off += m->params[i - 1].numel)
            ws->gmbp[i] = ws->gmb + off;
    }
    *loss = 0;
    *bad = 0;
    for (int mb = 0; mb < nmb; mb++) {
        xm_ctx c;
        ws_plan(ws, ws->arena, o->B, mb * Bm, Bm, o->S, ws->record, &c);
        int64_t r0 = mb * Bm * o->S;
        c.dt_comp = p->compute;
        c.dt_res = p->residual;
        c.dt_norm = p->norm;
        c.dt_att = p->attn_softmax;
        c.dt_head = p->lm_head;
        c.dt_logits = p->logits;
        c.form = p->ce;
        c.threads = o->threads;
        c.nthr = xent_num_threads(o->threads);
        c.keep_layers = keep_layers && nmb == 1;
        c.on_layer = o->on_layer;
        c.on_layer_ctx = o->on_layer_ctx;
        c.gpu = o->gemm_device == 1;
        c.gpu_st = XENT_OK;
        c.w = (const float *const *)ws->wptr;
        c.w_head = whead;
        c.g = bw ? (direct || inplace ? ws->gptr : ws->gmbp) : NULL;
        c.tok = o->tokens + r0;
        c.lab = ws->lab + r0;
        double *rws = malloc((size_t)c.T * sizeof(double)); /* [Tm] */
        if (!rws) return xent_set_error(XENT_ERR_ALLOC, "model: row weights");
        for (int64_t t = 0; t < c.T; t++) rws[t] = ws->rw[r0 + t] * ls;
        c.rw = rws;
        c.rcos = ws->rope;
        c.rsin = ws->rope + o->S * m->cfg.head_dim / 2;
        c.rcos_l = ws->rope + o->S * m->cfg.head_dim;
        c.rsin_l = c.rcos_l + o->S * m->cfg.head_dim / 2;
        c.logprob = ws->logprob + r0;
        if (!o->record) c.rec_dx = NULL, c.rec_dx0 = NULL;
        xent_status st = model_fwd_bwd(&c, bw);
        if (st == XENT_OK && c.gpu_st != XENT_OK) st = c.gpu_st;
        free(rws);
        if (st) return st;
        *loss += c.loss / ls;
        if (!bw || direct) continue;
        accum_job aj = {ws->grads, inplace ? ws->grads : ws->gmb,
                        (float)(1.0 / ls), p->grad_accum, mb == 0, 0, 0, {0}};
        xent_parallel_for(nw, c.nthr, accum_range, &aj);
    }
    if (bw) {
        int nt = xent_num_threads(o->threads);
        nt = nt > 64 ? 64 : nt;
        accum_job fj = {ws->grads, NULL, 0, XENT_F32, 0, nw, nt, {0}};
        xent_parallel_for(nt, nt, finite_range, &fj);
        for (int k = 0; k < nt; k++) *bad |= fj.bad[k];
    }
    return XENT_OK;
}

static void fill_record(const xent_model *m, xent_model_ws *ws,
                        const xent_model_run_opts *o, xent_model_record *r) {
    xm_ctx c;
    ws_plan(ws, ws->arena, o->B, 0, o->B, o->S, ws->record, &c);
    int64_t L = m->cfg.n_layers;
    r->logprobs = ws->logprob;
    r->param_grads = o->backward ? ws->gptr : NULL;
    if (!o->record) return;
    r->embed_out = c.x[0];
    for (int64_t l = 0; l < L; l++) ws->layer_out[l] = c.x[l + 1];
    r->layer_out = ws->layer_out;
    r->final_norm_out = c.xnf;
    r->logits = c.logits;
    if (o->backward) {
        r->layer_in_grad = c.rec_dx;
        r->embed_grad = c.rec_dx0;
        r->dlogits = c.dlogits;
        /* dlogits were stored scaled by the loss scale */
        if (r->loss_scale != 1.0) {
            float inv = (float)(1.0 / r->loss_scale);
            int64_t n = o->B * o->S * m->cfg.vocab;
            for (int64_t i = 0; i < n; i++) c.dlogits[i] *= inv;
            n = o->B * o->S * m->cfg.dim;
            for (int64_t l = 0; l < L; l++)
                for (int64_t i = 0; i < n; i++) c.rec_dx[l][i] *= inv;
            for (int64_t i = 0; i < n; i++) c.rec_dx0[i] *= inv;
        }
    }
}

/* The whole pass on the GPU (gemm_device 2): the device state lives in
 * ws->dev; the results land where the CPU pass leaves them (ws->grads,
 * ws->logprob and, when recorded, the arena's full-batch arrays), so that
 * fill_record serves both. The arena then holds no reusable forward. */
static xent_status run_resident(const xent_model *m, xent_model_ws *ws,
                                const xent_precision *p,
                                const xent_model_run_opts *o, int64_t n_cnt,
                                xent_model_record *rec) {
    xm_ctx c;
    ws_plan(ws, ws->arena, o->B, 0, o->B, o->S, ws->record, &c);
    xent__dev_io io;
    memset(&io, 0, sizeof io);
    io.lab = ws->lab;
    io.rw = ws->rw;
    io.rope = ws->rope;
    io.grads = ws->grads;
    io.logprob = ws->logprob;
    if (o->record) {
        io.x = c.x;
        io.xnf = c.xnf;
        io.logits = c.logits;
        io.dlogits = c.dlogits != c.logits ? c.dlogits : NULL;
        io.rec_dx = c.rec_dx;
        io.rec_dx0 = c.rec_dx0;
    }
    ws->fwd_ok = 0;
    double loss = 0, ls = 1;
    xent_status st = xent__model_run_dev(m, &ws->dev, ws->B, ws->S, ws->record,
                                         p, o, &io, &loss, &ls);
    if (st) return st;
    memset(rec, 0, sizeof *rec);
    rec->loss = loss;
    rec->n_counted = n_cnt;
    rec->loss_scale = ls;
    fill_record(m, ws, o, rec);
    return XENT_OK;
}

xent_status xent_model_run(const xent_model *m, xent_model_ws *ws,
                           const xent_precision *p,
                           const xent_model_run_opts *o,
                           xent_model_record *rec) {
    xent_status st = check_run(m, ws, p, o);
    if (st) return st;
    if (!rec) return xent_set_error(XENT_ERR_NULL, "model_run: record is NULL");
    int64_t n_cnt = 0;
    if ((st = xent__model_targets(m, o, ws->lab, ws->rw, &n_cnt))) return st;
    int thr = xent_num_threads(o->threads);
    xent__rope_tables(&m->cfg, o->S, ws->rope,
                      ws->rope + o->S * m->cfg.head_dim / 2, 0);
    xent__rope_tables(&m->cfg, o->S, ws->rope + o->S * m->cfg.head_dim,
                      ws->rope + 3 * o->S * m->cfg.head_dim / 2, 1);
    if (o->gemm_device == 2) return run_resident(m, ws, p, o, n_cnt, rec);
    const float *whead = NULL;
    if ((st = ws_weights(ws, p, &whead, thr))) return st;
    openblas_set_num_threads(1); /* see mm_cpu */
    int f16 = p->compute == XENT_F16 || p->residual == XENT_F16 ||
              p->norm == XENT_F16 || p->attn_softmax == XENT_F16 ||
              p->logits == XENT_F16;
    /* auto: fp16 starts at 2^16 and halves while a gradient overflows */
    double ls = p->loss_scale > 0 ? p->loss_scale : (f16 ? 65536.0 : 1.0);
    double loss = 0;
    int bad = 0;
    xent_dtype body[4] = {p->compute, p->residual, p->norm, p->attn_softmax};
    int one = p->micro_batches == 1;
    int keep = one && ws->reuse_fwd && ws->fwd_ok && ws->fwd_B == o->B &&
               ws->fwd_S == o->S && ws->fwd_dev == o->gemm_device &&
               !memcmp(ws->fwd_dt, body, sizeof body) &&
               !memcmp(ws->fwd_tok, o->tokens,
                       (size_t)(o->B * o->S) * sizeof(int32_t));
    ws->fwd_ok = 0; /* until a pass has completed */
    for (int tries = 0; tries < 24; tries++) {
        st = run_pass(m, ws, p, o, whead, ls, keep, &loss, &bad);
        if (st) return st;
        keep = one; /* a retry at a smaller loss scale: the same forward */
        if (!bad || p->loss_scale > 0 || !o->backward || ls <= 1.0) break;
        ls *= 0.5;
    }
    if (one) {
        memcpy(ws->fwd_dt, body, sizeof body);
        ws->fwd_B = o->B;
        ws->fwd_S = o->S;
        ws->fwd_dev = o->gemm_device;
        memcpy(ws->fwd_tok, o->tokens, (size_t)(o->B * o->S) * sizeof(int32_t));
        ws->fwd_ok = 1;
    }
    memset(rec, 0, sizeof *rec);
    rec->loss = loss;
    rec->n_counted = n_cnt;
    rec->loss_scale = ls;
    fill_record(m, ws, o, rec);
    return XENT_OK;
}
