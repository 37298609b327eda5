/* src/model/core_f64.c: the model in double precision (no rounding): the
 * reference for the precision policies and the gradient check. */
#define R double
#define GEMM cblas_dgemm
#define ROUNDING 0
#include "model/core_impl.h"

#include <stdio.h>

/* Cross-entropy rows in double: nll_t = lse - z_t; dz = rw_t (p - onehot). */
static xent_status loss_step(xm_ctx *c, int backward) {
    int64_t V = c->c->vocab;
    c->loss = 0;
    for (int64_t t = 0; t < c->T; t++) {
        double *z = c->logits + t * V;
        int32_t y = c->lab[t];
        if (y < 0) {
            if (c->logprob) c->logprob[t] = 0;
            if (backward)
                memset(c->dlogits + t * V, 0, (size_t)V * sizeof(double));
            continue;
        }
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        for (int64_t j = 0; j < V; j++) s += exp(z[j] - mx);
        double lse = mx + log(s), nll = lse - z[y];
        c->loss += c->rw[t] * nll;
        if (c->logprob) c->logprob[t] = (float)-nll;
        if (backward) {
            double *d = c->dlogits + t * V;
            for (int64_t j = 0; j < V; j++)
                d[j] = c->rw[t] * (exp(z[j] - lse) - (j == y ? 1.0 : 0.0));
        }
    }
    return XENT_OK;
}

/* Resolved targets and row weights shared with the fp32 driver. */
xent_status xent__model_targets(const xent_model *m,
                                const xent_model_run_opts *o, int32_t *lab,
                                double *rw, int64_t *n_counted);

xent_status xent_model_run_f64_w(const xent_model *m,
                                 const double *const *weights,
                                 const xent_model_run_opts *o, double *loss,
                                 double **grads, double *embed_grad) {
    if (!m || !o || !loss || !weights || !o->tokens)
        return xent_set_error(XENT_ERR_NULL, "model_run_f64: NULL argument");
    if (o->B <= 0 || o->S <= 0 || o->B > ((int64_t)1 << 30) / o->S)
        return xent_set_error(XENT_ERR_SHAPE, "model_run_f64: B = %lld, S = %lld",
                          (long long)o->B, (long long)o->S);
    const xent_model_config *cfg = &m->cfg;
    int64_t T = o->B * o->S, L = cfg->n_layers, n_cnt = 0;
    int backward = grads || embed_grad;
    xent_status st = XENT_ERR_ALLOC;
    int32_t *lab = malloc((size_t)T * sizeof *lab);
    double *rw = malloc((size_t)T * sizeof *rw);
    float *rc = malloc((size_t)(2 * o->S * cfg->head_dim) * sizeof(float));
    xm_ctx c;
    memset(&c, 0, sizeof c);
    c.c = cfg;
    c.x = calloc((size_t)(L + 1), sizeof *c.x);
    c.ly = calloc((size_t)L, sizeof *c.ly);
    double **g = calloc((size_t)m->n_params, sizeof *g);
    double *arena = NULL, *gown = NULL;
    if (!lab || !rw || !rc || !c.x || !c.ly || !g) goto done;
    if ((st = xent__model_targets(m, o, lab, rw, &n_cnt))) goto done;
    st = XENT_ERR_ALLOC;
    int64_t n = plan(&c, NULL, o->B, 0, o->B, o->S, 0);
    arena = malloc((size_t)n * sizeof(double));
    if (!arena) goto done;
    plan(&c, arena, o->B, 0, o->B, o->S, 0);
    if (backward && !grads) {
        gown = malloc((size_t)xent_model_n_weights(m) * sizeof(double));
        if (!gown) goto done;
        int64_t off = 0;
        for (int i = 0; i < m->n_params; i++, off += m->params[i - 1].numel)
            g[i] = gown + off;
    } else if (backward) {
        for (int i = 0; i < m->n_params; i++) g[i] = grads[i];
    }
    xent__rope_tables(cfg, o->S, rc, rc + o->S * cfg->head_dim / 2, 0);
    xent__rope_tables(cfg, o->S, rc + o->S * cfg->head_dim,
                      rc + 3 * o->S * cfg->head_dim / 2, 1);
    c.rcos = rc;
    c.rsin = rc + o->S * cfg->head_dim / 2;
    c.rcos_l = rc + o->S * cfg->head_dim;
    c.rsin_l = c.rcos_l + o->S * cfg->head_dim / 2;
    c.dt_comp = c.dt_res = c.dt_norm = c.dt_att = c.dt_head = c.dt_logits =
        XENT_F32;
    c.w = weights;
    c.w_head = weights[xent__pidx_head(cfg)];
    c.g = backward ? g : NULL;
    c.tok = o->tokens;
    c.lab = lab;
    c.rw = rw;
    c.rec_dx0 = embed_grad;
    c.nthr = xent_num_threads(o->threads);
    openblas_set_num_threads(1); /* see mm_cpu */
    st = model_fwd_bwd(&c, backward);
    if (!st) *loss = c.loss;
done:
    if (st == XENT_ERR_ALLOC)
        xent_set_error(st, "model_run_f64: out of memory for %lld tokens",
                   (long long)T);
    free(lab), free(rw), free(rc), free(c.x), free(c.ly), free(g);
    free(arena), free(gown);
    return st;
}

xent_status xent_model_run_f64(const xent_model *m,
                               const xent_model_run_opts *o, double *loss,
                               double **grads, double *embed_grad) {
    if (!m) return xent_set_error(XENT_ERR_NULL, "model_run_f64: model is NULL");
    double **w = calloc((size_t)m->n_params, sizeof *w);
    double *buf = malloc((size_t)xent_model_n_weights(m) * sizeof(double));
    if (!w || !buf) {
        free(w), free(buf);
        return xent_set_error(XENT_ERR_ALLOC, "model_run_f64: weights");
    }
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        w[i] = buf + off;
        for (int64_t j = 0; j < m->params[i].numel; j++)
            w[i][j] = m->params[i].w[j];
        off += m->params[i].numel;
    }
    xent_status st = xent_model_run_f64_w(m, (const double *const *)w, o,
                                          loss, grads, embed_grad);
    free(w), free(buf);
    return st;
}
