/* src/audit/result.c: the audit's result arrays and the per-variant summary
 * (which tensors feed which column: docs/audit.md, "Tables"). */
#include "audit/audit.h"
#include "core/xent_math.h"

#include <stdlib.h>

xent_status xent__audit_result_alloc(xent_audit_result *r, int nv, int ne,
                                     int64_t nt, int64_t nk) {
    if (nv < 1 || ne < 0 || nt < 0 || nk < 0)
        return xent_set_error(XENT_ERR_SHAPE, "audit result: bad sizes nv=%d ne=%d "
                          "nt=%lld nk=%lld", nv, ne, (long long)nt, (long long)nk);
    size_t snv = (size_t)nv;
    r->entries = calloc((size_t)(ne > 0 ? ne : 1), sizeof *r->entries);
    r->m = calloc(snv * (size_t)(ne > 0 ? ne : 1), sizeof *r->m);
    r->logprob = calloc(snv * (size_t)(nt > 0 ? nt : 1), sizeof(float));
    r->tokens = calloc((size_t)(nk > 0 ? nk : 1), sizeof(int32_t));
    r->dead_logprob = calloc(snv, sizeof(int64_t));
    r->dead_grad = calloc(snv, sizeof(int64_t));
    r->dead_any = calloc(snv, sizeof(int64_t));
    r->loss_scale = calloc(snv, sizeof(double));
    r->seconds = calloc(snv, sizeof(double));
    r->loss = calloc(snv, sizeof(double));
    if (!r->entries || !r->m || !r->logprob || !r->tokens || !r->dead_logprob ||
        !r->dead_grad || !r->dead_any || !r->loss_scale || !r->seconds ||
        !r->loss) {
        xent__audit_result_free(r);
        return xent_set_error(XENT_ERR_ALLOC, "audit result: out of memory");
    }
    for (size_t i = 0; i < snv * (size_t)ne; i++) {
        r->m[i].rms_abs = r->m[i].ref_scale = r->m[i].rms_rel = NAN;
        r->m[i].max_abs = r->m[i].bias = r->m[i].corr = NAN;
        r->m[i].slope = r->m[i].residual = NAN;
    }
    r->n_entries = ne;
    r->n_targets = nt;
    r->n_tokens = nk;
    return XENT_OK;
}

void xent__audit_result_free(xent_audit_result *r) {
    if (!r) return;
    free(r->entries);
    free(r->m);
    free(r->logprob);
    free(r->tokens);
    free(r->dead_logprob);
    free(r->dead_grad);
    free(r->dead_any);
    free(r->loss_scale);
    free(r->seconds);
    free(r->loss);
    r->entries = NULL;
    r->m = NULL;
    r->logprob = NULL;
    r->tokens = NULL;
    r->dead_logprob = r->dead_grad = r->dead_any = NULL;
    r->loss_scale = r->seconds = r->loss = NULL;
}

/* Relative error in percent of entry e of variant v. */
static double rel_pct(const xent_audit_result *r, int v, int e) {
    return 100.0 * r->m[(size_t)v * (size_t)r->n_entries + (size_t)e].rms_rel;
}

/* Median and max of the rel % of entries with `role`, layers in
 * [lo, hi] (any layer when lo < 0). */
static void med_max(const xent_audit_result *r, int v, xent_audit_role role,
                    int lo, int hi, double *med, double *max) {
    double *x = malloc(sizeof(double) * (size_t)(r->n_entries + 1)); /* [ne] */
    int k = 0;
    *med = *max = NAN;
    if (!x) return;
    for (int e = 0; e < r->n_entries; e++) {
        const xent_audit_entry *en = &r->entries[e];
        if (en->role != role) continue;
        if (lo >= 0 && (en->layer < lo || en->layer > hi)) continue;
        x[k++] = rel_pct(r, v, e);
    }
    if (k > 0) {
        *med = xent__audit_median(x, k);
        double mx = x[0];
        for (int i = 1; i < k; i++)
            if (x[i] > mx || isnan(x[i])) mx = x[i];
        *max = mx;
    }
    free(x);
}

/* The rel % of the entry with role and layer (any layer when layer < -1). */
static double one(const xent_audit_result *r, int v, xent_audit_role role,
                  int layer) {
    for (int e = 0; e < r->n_entries; e++)
        if (r->entries[e].role == role &&
            (layer < -1 || r->entries[e].layer == layer))
            return rel_pct(r, v, e);
    return NAN;
}

static void summarize_lp(const xent_audit_result *r, int v, double lp[7]) {
    for (int i = 0; i < 7; i++) lp[i] = NAN;
    for (int e = 0; e < r->n_entries; e++) {
        if (r->entries[e].role != XA_LOGPROB) continue;
        const xent_audit_metrics *m =
            &r->m[(size_t)v * (size_t)r->n_entries + (size_t)e];
        double den = xent__audit_rel_denom(m);
        lp[0] = 100.0 * m->rms_rel;
        lp[1] = 100.0 * m->bias / den;
        lp[2] = 100.0 * m->residual / den;
        lp[3] = m->corr;
        lp[4] = m->slope;
        lp[5] = m->max_abs;
        lp[6] = m->ref_scale;
        return;
    }
}

void xent__audit_summarize(const xent_audit_result *r, int v,
                           xent_audit_summary *s) {
    int L = r->n_layers;
    double d;
    s->fw[0] = one(r, v, XA_FW_LAYER, 0);
    med_max(r, v, XA_FW_LAYER, 1, L - 2, &s->fw[1], &s->fw[2]);
    if (L < 3) s->fw[1] = s->fw[2] = NAN;
    s->fw[3] = one(r, v, XA_LOGITS, -2);
    s->fw[4] = one(r, v, XA_FW_LAYER, L - 1);
    s->bw[0] = one(r, v, XA_BW_LAYER, 0);
    s->bw[1] = one(r, v, XA_DLOGITS, -2);
    med_max(r, v, XA_BW_LAYER, 1, L - 2, &s->bw[2], &s->bw[3]);
    if (L < 3) s->bw[2] = s->bw[3] = NAN;
    s->bw[4] = one(r, v, XA_BW_LAYER, L - 1);
    s->grad[0] = one(r, v, XA_G_LM_HEAD, -2);
    med_max(r, v, XA_G_LINEAR, -1, 0, &s->grad[1], &s->grad[2]);
    med_max(r, v, XA_G_NORM, -1, 0, &s->grad[3], &s->grad[4]);
    med_max(r, v, XA_G_BIAS, -1, 0, &s->grad[5], &s->grad[6]);
    med_max(r, v, XA_G_EMBED, -1, 0, &s->grad[7], &d);
    summarize_lp(r, v, s->lp);
}
