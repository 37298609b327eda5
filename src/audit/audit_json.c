/* src/audit/audit_json.c: `xent audit --json FILE`: every metric of every
 * tensor and variant, the settings, the exact token ids (and their text
 * when the model has a tokenizer) and the chosen-token log-probabilities.
 * Non-finite numbers are written as null. */
#include "audit/audit.h"
#include "core/xent_math.h"

#include <errno.h>
#include <stdlib.h>

static const char *const k_roles[XA_ROLE_COUNT] = {
    [XA_FW_LAYER] = "forward_layer", [XA_LOGITS] = "logits",
    [XA_BW_LAYER] = "backward_layer", [XA_DLOGITS] = "dlogits",
    [XA_G_LM_HEAD] = "grad_lm_head", [XA_G_LINEAR] = "grad_linear",
    [XA_G_NORM] = "grad_norm", [XA_G_BIAS] = "grad_bias",
    [XA_G_EMBED] = "grad_embedding", [XA_G_OTHER] = "grad_other",
    [XA_LOGPROB] = "chosen_logprob", [XA_OTHER] = "other",
};

static void jnum(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

/* A JSON string with the required escapes. */
static void jstr(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* A JSON string of raw bytes: invalid UTF-8 bytes become U+FFFD. */
static void jstr_bytes(FILE *f, const char *s) {
    fputc('"', f);
    while (*s) {
        unsigned char c = (unsigned char)*s;
        int n = xent__audit_utf8_len(s);
        if (n == 0) { fputs("\\ufffd", f); s++; continue; }
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fwrite(s, 1, (size_t)n, f);
        s += n;
    }
    fputc('"', f);
}

static void write_settings(FILE *f, const xent_audit_result *r) {
    fputs("  \"settings\": {\"model\": ", f);
    jstr(f, r->model);
    fputs(", \"input\": ", f);
    jstr(f, r->input);
    fprintf(f, ", \"seed\": %llu, \"seq_len\": %lld, \"batch\": %lld, "
            "\"n_tokens\": %lld, \"n_targets\": %lld, \"n_layers\": %d, "
            "\"tied_head\": %s, \"random_weights\": %s, \"threads\": %d, "
            "\"variant_products\": \"%s\", \"reference\": ",
            (unsigned long long)r->seed, (long long)r->seq_len,
            (long long)r->batch, (long long)r->n_tokens,
            (long long)r->n_targets, r->n_layers,
            r->tied_head ? "true" : "false", r->random_weights ? "true" : "false", r->threads,
            r->gemm_device == 2   ? "cuda resident (cuBLAS)"
            : r->gemm_device ? "cuda (cuBLAS)"
                             : "cpu (OpenBLAS)");
    jstr(f, r->variants.v[r->ref].name);
    fputs(", \"seconds\": ", f);
    jnum(f, r->total_seconds);
    fputs("},\n", f);
}

static void write_tokens(FILE *f, const xent_audit_result *r) {
    fputs("  \"tokens\": [", f);
    for (int64_t b = 0; b < r->batch; b++) {
        fputs(b ? ",\n    [" : "\n    [", f);
        for (int64_t s = 0; s < r->seq_len; s++)
            fprintf(f, s ? ", %d" : "%d", r->tokens[b * r->seq_len + s]);
        fputc(']', f);
    }
    fputs("\n  ],\n", f);
    if (!r->token_text) return;
    /* the text of each token, the same rows (invalid UTF-8: U+FFFD) */
    fputs("  \"token_text\": [", f);
    for (int64_t b = 0; b < r->batch; b++) {
        fputs(b ? ",\n    [" : "\n    [", f);
        for (int64_t s = 0; s < r->seq_len; s++) {
            if (s) fputs(", ", f);
            const char *t = xent__audit_token_text(r, b * r->seq_len + s);
            jstr_bytes(f, t ? t : "");
        }
        fputc(']', f);
    }
    fputs("\n  ],\n", f);
}

static void write_metrics(FILE *f, const xent_audit_entry *e,
                          const xent_audit_metrics *m) {
    fputs("      {\"name\": ", f);
    jstr(f, e->name);
    fprintf(f, ", \"role\": \"%s\", \"layer\": %d, \"n\": %lld, "
            "\"n_nonfinite\": %lld", k_roles[e->role], e->layer,
            (long long)m->n, (long long)m->n_nonfinite);
    const char *names[] = {"rms_abs", "ref_scale", "rms_rel", "max_abs",
                           "bias", "correlation", "slope", "residual"};
    double vals[] = {m->rms_abs, m->ref_scale, m->rms_rel, m->max_abs,
                     m->bias, m->corr, m->slope, m->residual};
    for (int i = 0; i < 8; i++) {
        fprintf(f, ", \"%s\": ", names[i]);
        jnum(f, vals[i]);
    }
    fputc('}', f);
}

static void jarray(FILE *f, const char *name, const double *v, int n) {
    fprintf(f, "\"%s\": [", name);
    for (int i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        jnum(f, v[i]);
    }
    fputc(']', f);
}

static void write_summary(FILE *f, const xent_audit_result *r, int v) {
    xent_audit_summary s;
    xent__audit_summarize(r, v, &s);
    fputs("    \"summary_percent\": {", f);
    jarray(f, "forward_first_midmedian_midmax_logits_last", s.fw, 5);
    fputs(", ", f);
    jarray(f, "backward_first_logits_midmedian_midmax_last", s.bw, 5);
    fputs(", ", f);
    jarray(f, "grad_lmhead_linmed_linmax_normmed_normmax_biasmed_biasmax_embed",
           s.grad, 8);
    fputs(", ", f);
    jarray(f, "logprob_rmsrel_biasrel_residrel_corr_slope_maxabs_scale",
           s.lp, 7);
    fputs("},\n", f);
}

static void write_policy(FILE *f, const xent_precision *p) {
    fprintf(f, "{\"compute\": \"%s\", \"residual\": \"%s\", \"norm\": \"%s\", "
            "\"attn_softmax\": \"%s\", \"lm_head\": \"%s\", \"logits\": \"%s\", ",
            xent__audit_dtype_name(p->compute),
            xent__audit_dtype_name(p->residual),
            xent__audit_dtype_name(p->norm),
            xent__audit_dtype_name(p->attn_softmax),
            xent__audit_dtype_name(p->lm_head),
            xent__audit_dtype_name(p->logits));
    fprintf(f, "\"ce\": \"%s\", \"grad_accum\": \"%s\", "
            "\"micro_batches\": %d, \"loss_scale\": ", xent__audit_ce_name(p->ce),
            xent__audit_dtype_name(p->grad_accum), p->micro_batches);
    if (p->loss_scale == 0) fputs("\"auto\"}", f);
    else { jnum(f, p->loss_scale); fputc('}', f); }
}

static void write_variant(FILE *f, const xent_audit_result *r, int v) {
    fputs("   {\"name\": ", f);
    jstr(f, r->variants.v[v].name);
    fprintf(f, ", \"reference\": %s, \"policy\": ", v == r->ref ? "true" : "false");
    write_policy(f, &r->variants.v[v].p);
    fputs(",\n    \"loss\": ", f);
    jnum(f, r->loss[v]);
    fputs(", \"loss_scale_used\": ", f);
    jnum(f, r->loss_scale[v]);
    fputs(", \"seconds\": ", f);
    jnum(f, r->seconds[v]);
    fprintf(f, ", \"dead_zone\": {\"logprob\": %lld, \"target_grad\": %lld, "
            "\"either\": %lld},\n", (long long)r->dead_logprob[v],
            (long long)r->dead_grad[v], (long long)r->dead_any[v]);
    write_summary(f, r, v);
    fputs("    \"chosen_logprobs\": [", f);
    const float *lp = r->logprob + (size_t)v * (size_t)r->n_targets;
    for (int64_t i = 0; i < r->n_targets; i++) {
        if (i) fputs(", ", f);
        if (isfinite(lp[i])) fprintf(f, "%.9g", (double)lp[i]);
        else fputs("null", f);
    }
    fputs("],\n    \"tensors\": [\n", f);
    for (int e = 0; e < r->n_entries; e++) {
        write_metrics(f, &r->entries[e],
                      &r->m[(size_t)v * (size_t)r->n_entries + (size_t)e]);
        fputs(e + 1 < r->n_entries ? ",\n" : "\n", f);
    }
    fputs("    ]}", f);
}

xent_status xent__audit_write_json(const xent_audit_result *r,
                                   const char *path) {
    /* written to PATH.tmp.XXXXXX and renamed into place when complete: a
     * failure leaves an existing report as it was */
    char *tmp = NULL;
    FILE *f = xent_file_create(path, &tmp);
    if (!f) return XENT_ERR_IO;
    fprintf(f, "{\n  \"tool\": \"xent audit\", \"version\": \"%s\",\n",
            xent_version());
    write_settings(f, r);
    write_tokens(f, r);
    fputs("  \"variants\": [\n", f);
    for (int v = 0; v < r->variants.n; v++) {
        write_variant(f, r, v);
        fputs(v + 1 < r->variants.n ? ",\n" : "\n", f);
    }
    fputs("  ]\n}\n", f);
    return xent_file_commit(f, tmp, path, !ferror(f));
}
