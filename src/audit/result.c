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
    free(r->token_text);
    free(r->token_text_off);
    r->token_text = NULL;
    r->token_text_off = NULL;
}

xent_status xent__audit_result_token_text(xent_audit_result *r,
                                          const xent_tokenizer *tk) {
    free(r->token_text);
    free(r->token_text_off);
    r->token_text = NULL;
    r->token_text_off = NULL;
    if (!tk || r->n_tokens < 1) return XENT_OK;
    int64_t n = r->n_tokens;
    r->token_text_off = malloc(sizeof(int64_t) * (size_t)n); /* [n] */
    size_t cap = (size_t)n * 8 + 64, used = 0;
    r->token_text = malloc(cap);
    if (!r->token_text_off || !r->token_text) goto oom;
    for (int64_t i = 0; i < n; i++) {
        char *txt = NULL;
        size_t len = 0;
        int32_t id = r->tokens[i];
        if (xent_detokenize(tk, &id, 1, &txt, &len) != XENT_OK) {
            free(txt);
            txt = NULL;
            len = 0;
        }
        if (used + len + 1 > cap) {
            size_t nc = (used + len + 1) * 2;
            char *nb = realloc(r->token_text, nc);
            if (!nb) { free(txt); goto oom; }
            r->token_text = nb;
            cap = nc;
        }
        if (len) memcpy(r->token_text + used, txt, len);
        r->token_text[used + len] = 0;
        r->token_text_off[i] = (int64_t)used;
        used += len + 1;
        free(txt);
    }
    return XENT_OK;
oom:
    free(r->token_text);
    free(r->token_text_off);
    r->token_text = NULL;
    r->token_text_off = NULL;
    return xent_set_error(XENT_ERR_ALLOC, "audit: token texts: out of memory");
}

int xent__audit_utf8_len(const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] == 0) return 0;
    if (s[0] < 0x80) return 1;
    int n;
    uint32_t c;
    if ((s[0] & 0xE0) == 0xC0) { n = 2; c = s[0] & 0x1F; }
    else if ((s[0] & 0xF0) == 0xE0) { n = 3; c = s[0] & 0x0F; }
    else if ((s[0] & 0xF8) == 0xF0) { n = 4; c = s[0] & 0x07; }
    else return 0;
    for (int k = 1; k < n; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0; /* also stops at NUL */
        c = (c << 6) | (s[k] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    return n;
}

const char *xent__audit_token_text(const xent_audit_result *r, int64_t i) {
    if (!r->token_text || !r->token_text_off || i < 0 || i >= r->n_tokens)
        return NULL;
    return r->token_text + r->token_text_off[i];
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

/* ------------------------------------------------------------------------ */
/* Verdict                                                                   */
/* ------------------------------------------------------------------------ */

const xent_audit_budget xent__audit_budgets[XENT_AUDIT_N_BUDGETS] = {
    {"tight", "evaluation and RL log-probs", 0.5, 0.02, 1.0},
    {"training", "mixed-precision training", 5.0, 0.2, 10.0},
    {"loose", "sampling and rough checks", 15.0, 0.5, 30.0},
};

/* 1 when entry e belongs to the forward (backward) chain. The chains are
 * runs of the entries in report order: forward from the first entry up to
 * the logits; backward from dL/dlogits through the layer-input gradients
 * and the other (non-parameter) tensors that follow them. */
static int chain_bounds(const xent_audit_result *r, int backward, int *lo,
                        int *hi) {
    int lg = -1, dl = -1;
    for (int e = 0; e < r->n_entries; e++) {
        if (r->entries[e].role == XA_LOGITS && lg < 0) lg = e;
        if (r->entries[e].role == XA_DLOGITS && dl < 0) dl = e;
    }
    if (!backward) {
        if (lg < 0) return 0;
        *lo = 0;
        *hi = lg;
        return 1;
    }
    if (dl < 0) return 0;
    int e = dl + 1;
    while (e < r->n_entries && (r->entries[e].role == XA_BW_LAYER ||
                                r->entries[e].role == XA_OTHER))
        e++;
    *lo = dl;
    *hi = e - 1;
    return 1;
}

int xent__audit_error_entry(const xent_audit_result *r, int v, int backward,
                            double *final) {
    int lo, hi;
    *final = NAN;
    if (!chain_bounds(r, backward, &lo, &hi)) return -1;
    const xent_audit_metrics *m = r->m + (size_t)v * (size_t)r->n_entries;
    /* the chain's last tensor with a value (an engine may leave one out) */
    while (hi >= lo && !(m[hi].n > 0)) hi--;
    if (hi < lo) return -1;
    *final = m[hi].rms_rel;
    if (!(*final > 0) || !isfinite(*final)) return -1;
    for (int e = lo; e <= hi; e++)
        if (m[e].n > 0 && (m[e].rms_rel > 0.5 * *final || !isfinite(m[e].rms_rel)))
            return e;
    return hi;
}

void xent__audit_verdict(const xent_audit_result *r, int v,
                         xent_audit_verdict *out) {
    xent_audit_summary s;
    xent__audit_summarize(r, v, &s);
    out->logits_pct = s.fw[3];
    out->grad_pct = s.grad[1];
    out->logprob = NAN;
    for (int e = 0; e < r->n_entries; e++)
        if (r->entries[e].role == XA_LOGPROB) {
            out->logprob = r->m[(size_t)v * (size_t)r->n_entries + (size_t)e].rms_abs;
            break;
        }
    out->budget = XENT_AUDIT_N_BUDGETS;
    for (int b = XENT_AUDIT_N_BUDGETS - 1; b >= 0; b--) {
        const xent_audit_budget *bu = &xent__audit_budgets[b];
        /* a missing gradient (NaN with no linear layer) is not judged; a
         * missing logits or log-prob figure is never within a budget */
        int ok = out->logits_pct <= bu->logits_pct && out->logprob <= bu->logprob &&
                 (out->grad_pct <= bu->grad_pct || isnan(out->grad_pct));
        if (!ok) break;
        out->budget = b;
    }
    /* a non-finite value anywhere: over every budget */
    for (int e = 0; e < r->n_entries; e++)
        if (r->m[(size_t)v * (size_t)r->n_entries + (size_t)e].n_nonfinite)
            out->budget = XENT_AUDIT_N_BUDGETS;
    double f;
    out->fw_entry = xent__audit_error_entry(r, v, 0, &f);
    out->fw_final_pct = 100.0 * f;
    out->bw_entry = xent__audit_error_entry(r, v, 1, &f);
    out->bw_final_pct = 100.0 * f;
}
