/* src/compare/report.c: the table and the JSON of `xent compare`. */
#include "compare/compare.h"

#include <inttypes.h>

static const char *const qnames[XENT__CMP_NQ] = {"50", "90", "99", "99.9"};
static const char *const side[4] = {"a", "b", "ref", "ref_b"};

/* ---- JSON ---------------------------------------------------------------- */

/* A number with 17 significant digits (round-trips), null if not finite. */
static void jnum(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

static void jkv(FILE *f, const char *k, double x, int last) {
    fprintf(f, "\"%s\": ", k);
    jnum(f, x);
    fputs(last ? "" : ", ", f);
}

static void jki(FILE *f, const char *k, int64_t x, int last) {
    fprintf(f, "\"%s\": %" PRId64 "%s", k, x, last ? "" : ", ");
}

static void jci(FILE *f, const char *k, xent__cmp_ci c, int last) {
    fprintf(f, "\"%s\": [", k);
    jnum(f, c.lo);
    fputs(", ", f);
    jnum(f, c.hi);
    fputs(last ? "]" : "], ", f);
}

static void jtok(FILE *f, const xent__cmp_tok *t) {
    fputc('{', f);
    jki(f, "position", t->pos, 0);
    jki(f, "sequence", t->seq, 0);
    jki(f, "index", t->idx, 0);
    jki(f, "token", t->token, 0);
    jkv(f, "a", t->a, 0);
    jkv(f, "b", t->b, 0);
    jkv(f, "ref", t->r, 0);
    jkv(f, "delta", t->a - t->b, 1);
    fputc('}', f);
}

static void jbad(FILE *f, const xent__cmp_bad *b) {
    fputc('{', f);
    jki(f, "positive", b->positive, 0);
    jki(f, "first_positive", b->first_positive, 0);
    jki(f, "nan", b->nan, 0);
    jki(f, "first_nan", b->first_nan, 0);
    jki(f, "inf", b->inf, 0);
    jki(f, "first_inf", b->first_inf, 0);
    jki(f, "zero_run", b->zero_run, 0);
    jki(f, "first_zero_run", b->first_zero_run, 1);
    fputc('}', f);
}

static void json_seq(FILE *f, const xent__cmp_result *r) {
    fputs("  \"sequences\": ", f);
    if (!r->has_seq) { fputs("null,\n", f); return; }
    fputs("{", f);
    jki(f, "count", r->nseq, 0);
    jki(f, "with_tokens", r->nseq_used, 0);
    fputs("\"mean_delta\": {", f);
    jkv(f, "mean", r->seq_mean, 0);
    jkv(f, "std", r->seq_std, 0);
    jkv(f, "rms", r->seq_rms, 0);
    jkv(f, "max_abs", r->seq_max, 0);
    jki(f, "max_abs_sequence", r->seq_max_idx, 1);
    fputs("}, \"sum_delta\": {", f);
    jkv(f, "min", r->seq_sum_min, 0);
    jki(f, "min_sequence", r->seq_sum_min_idx, 0);
    jkv(f, "max", r->seq_sum_max, 0);
    jki(f, "max_sequence", r->seq_sum_max_idx, 0);
    jkv(f, "weight_min", exp(r->seq_sum_min), 0);
    jkv(f, "weight_max", exp(r->seq_sum_max), 1);
    fputs("}, ", f);
    jki(f, "clamp_warnings", r->n_clamp_warn, 0);
    fputs("\"clamp_warned\": [", f);
    for (int64_t i = 0; i < r->n_clamp_list; i++) {
        fprintf(f, "%s{\"sequence\": %" PRId64 ", \"sum_delta\": ", i ? ", " : "", r->clamp_idx[i]);
        jnum(f, r->clamp_sum[i]);
        fputc('}', f);
    }
    fputs("], \"worst\": [", f);
    for (int64_t i = 0; i < r->ntopseq; i++) {
        const xent__cmp_seq *q = &r->topseq[i];
        fprintf(f, "%s{\"sequence\": %" PRId64 ", \"tokens\": %" PRId64 ", ", i ? ", " : "",
                q->seq, q->n);
        jkv(f, "mean_delta", q->mean, 0);
        jkv(f, "sum_delta", q->sum, 0);
        jkv(f, "weight", exp(q->sum), 1);
        fputc('}', f);
    }
    fputs("]},\n", f);
}

static void json_ref(FILE *f, const xent__cmp_result *r) {
    fputs("  \"reference\": ", f);
    if (!r->has_ref) { fputs("null,\n", f); return; }
    fputs("{", f);
    jkv(f, "rms_ea", r->rms_ea, 0);
    jkv(f, "rms_eb", r->rms_eb, 0);
    jkv(f, "mean_ea", r->mean_ea, 0);
    jkv(f, "mean_eb", r->mean_eb, 0);
    jkv(f, "sd_ea", r->sd_ea, 0);
    jkv(f, "sd_eb", r->sd_eb, 0);
    jkv(f, "rho", r->rho, 0);
    jkv(f, "rho_uncentred", r->rho0, 0);
    fprintf(f, "\"own_reference_b\": %s, ", r->has_ref_b ? "true" : "false");
    jkv(f, "floor_mean", r->floor_mean, 0);
    jkv(f, "floor_rms", r->floor_rms, 0);
    jkv(f, "rms_ea_minus_eb", r->rms_eab, 0);
    jkv(f, "floor_cross", r->floor_cross, 0);
    fputs("\"decomposition\": {", f);
    jkv(f, "rms_delta_sq", r->rms * r->rms, 0);
    jkv(f, "rms_ea_sq", r->rms_ea * r->rms_ea, 0);
    jkv(f, "rms_eb_sq", r->rms_eb * r->rms_eb, 0);
    jkv(f, "cross", r->cross, 0);
    jkv(f, "uncorrelated_rms", sqrt(r->rms_ea * r->rms_ea + r->rms_eb * r->rms_eb), 1);
    fputs("}},\n", f);
}

static void jrlm(FILE *f, const xent__cmp_rlm *m) {
    fputc('{', f);
    jki(f, "n", m->n, 0);
    jkv(f, "mean_delta", m->mean, 0);
    jkv(f, "rms_delta", m->rms, 0);
    jkv(f, "mean_abs_delta", m->mean_abs, 0);
    jkv(f, "kl_k1", m->k1, 0);
    jkv(f, "kl_k2", m->k2, 0);
    jkv(f, "kl_k3", m->k3, 0);
    jkv(f, "chi2", m->chi2, 0);
    jkv(f, "ess", m->ess, 0);
    jkv(f, "tis_frac", m->tis, 0);
    jkv(f, "mis_frac", m->mis, 0);
    jkv(f, "icepop_frac", m->icepop, 1);
    fputc('}', f);
}

/* One bucket list: [{"bucket": "0-63", ...metrics}, ...] */
static void jbuckets(FILE *f, const char *key, const xent__cmp_rlm *m, int nb,
                     const char *const *labels, int have, int last) {
    fprintf(f, "    \"%s\": ", key);
    if (!have) { fprintf(f, "null%s\n", last ? "" : ","); return; }
    fputc('[', f);
    for (int k = 0; k < nb; k++) {
        fprintf(f, "%s{\"bucket\": \"%s\", \"metrics\": ", k ? ", " : "", labels[k]);
        jrlm(f, &m[k]);
        fputc('}', f);
    }
    fprintf(f, "]%s\n", last ? "" : ",");
}

static const char *const pos_labels[XENT__CMP_NPOS] = {"0-63", "64-255", "256-1023", "1024+"};
static const char *const ent_labels[XENT__CMP_NENT] = {"<0.01", "0.01-0.1", "0.1-1", ">=1"};
static const char *const freq_labels[XENT__CMP_NFREQ] = {"rare", "mid", "common"};

static void json_rl(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o) {
    const xent__cmp_rl *rl = &r->rl;
    fputs("  \"rl\": {\"token\": ", f);
    jrlm(f, &rl->tok);
    fputs(",\n    ", f);
    jkv(f, "ppl_a", rl->ppl_a, 0);
    jkv(f, "ppl_b", rl->ppl_b, 0);
    jkv(f, "weight_min", rl->w_min, 0);
    jkv(f, "weight_mean", rl->w_mean, 0);
    jkv(f, "weight_max", rl->w_max, 0);
    jkv(f, "ess_truncated", rl->ess_trunc, 0);
    jki(f, "clamped", rl->n_clamped, 0);
    fputs("\n    \"sequence\": ", f);
    if (!r->has_seq) fputs("null", f);
    else {
        fputc('{', f);
        jki(f, "n", rl->nseq, 0);
        jkv(f, "ppl_a", rl->ppl_seq_a, 0);
        jkv(f, "ppl_b", rl->ppl_seq_b, 0);
        jkv(f, "log_ppl_diff", rl->log_ppl_diff, 0);
        jkv(f, "chi2", rl->chi2_seq, 0);
        jkv(f, "ess", rl->ess_seq, 0);
        jkv(f, "tis_frac", rl->tis_seq, 0);
        jkv(f, "mis_frac", rl->mis_seq, 0);
        jkv(f, "mis_frac_geometric", rl->mis_geo, 1);
        fputc('}', f);
    }
    fputs(",\n    \"thresholds\": {", f);
    jkv(f, "tis_cap", o->tis_cap, 0);
    jkv(f, "mis_cap", o->mis_cap, 0);
    jkv(f, "icepop_lo", o->icepop_lo, 0);
    jkv(f, "icepop_hi", o->icepop_hi, 0);
    jkv(f, "clamp", o->clamp, 1);
    fputs("},\n    \"frequency_cuts\": ", f);
    if (rl->has_freq)
        fprintf(f, "{\"rare_max_count\": %" PRId64 ", \"mid_max_count\": %" PRId64
                ", \"distinct_ids\": %" PRId64 "}", rl->freq_cut[0], rl->freq_cut[1], rl->n_ids);
    else fputs("null", f);
    fputs(",\n    \"entropy_missing\": ", f);
    if (rl->has_entropy) fprintf(f, "%" PRId64, rl->n_ent_missing); else fputs("null", f);
    fputs(",\n  \"breakdown\": {\n", f);
    jbuckets(f, "position", rl->pos, XENT__CMP_NPOS, pos_labels, 1, 0);
    jbuckets(f, "entropy", rl->ent, XENT__CMP_NENT, ent_labels, rl->has_entropy, 0);
    jbuckets(f, "frequency", rl->freq, XENT__CMP_NFREQ, freq_labels, rl->has_freq, 1);
    fputs("  }},\n", f);
}

void xent__cmp_write_json(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o) {
    fputs("{\n  ", f);
    jki(f, "tokens", r->n, 0);
    jki(f, "selected", r->n_selected, 0);
    jki(f, "used", r->n_used, 0);
    jki(f, "excluded", r->n_excluded, 1);
    fputs(",\n  \"options\": {", f);
    jkv(f, "eps", o->eps, 0);
    jkv(f, "eps_high", o->eps_high, 0);
    jkv(f, "clamp", o->clamp, 0);
    jki(f, "zero_run", o->zero_run, 0);
    jki(f, "exclude_bad", o->exclude_bad, 0);
    fprintf(f, "\"seed\": %" PRIu64 ", ", o->seed);
    jki(f, "bootstrap", o->bootstrap, 0);
    jki(f, "top", o->top, 1);
    fputs("},\n  \"bad\": {", f);
    for (int k = 0; k < 4; k++) {
        if ((k == 2 && !r->has_ref) || (k == 3 && !r->has_ref_b)) break;
        fprintf(f, "%s\"%s\": ", k ? ", " : "", side[k]);
        jbad(f, &r->bad[k]);
    }
    fputs("},\n  \"delta\": {", f);
    jkv(f, "mean", r->mean, 0);
    jkv(f, "rms", r->rms, 0);
    jkv(f, "sum", r->sum, 0);
    jkv(f, "max_abs", r->max_abs, 0);
    fputs("\"max_abs_at\": ", f);
    jtok(f, &r->max_tok);
    fputs(", \"abs_quantiles\": {", f);
    for (int q = 0; q < XENT__CMP_NQ; q++) jkv(f, qnames[q], r->q[q], q == XENT__CMP_NQ - 1);
    fputs("}},\n  \"clip\": {", f);
    jkv(f, "ratio_low", 1.0 - o->eps, 0);
    jkv(f, "ratio_high", 1.0 + o->eps_high, 0);
    jkv(f, "ratio_outside", r->clip_ratio, 0);
    jki(f, "ratio_outside_count", r->n_clip_ratio, 0);
    jkv(f, "log_eps", o->eps, 0);
    jkv(f, "log_outside", r->clip_log, 0);
    jki(f, "log_outside_count", r->n_clip_log, 1);
    fputs("},\n  \"bootstrap\": {", f);
    jki(f, "resamples", r->boot_n, 0);
    fprintf(f, "\"unit\": \"%s\", ", r->boot_by_seq ? "sequence" : "token");
    jki(f, "units", r->boot_units, 0);
    jki(f, "block", r->boot_block, 0);
    jci(f, "mean", r->ci_mean, 0);
    jci(f, "rms", r->ci_rms, 0);
    jci(f, "ratio_outside", r->ci_clip_ratio, 0);
    jci(f, "log_outside", r->ci_clip_log, 1);
    fputs("},\n", f);
    json_seq(f, r);
    json_ref(f, r);
    json_rl(f, r, o);
    fputs("  \"top\": [", f);
    for (int64_t i = 0; i < r->ntop; i++) {
        fputs(i ? ",\n    " : "\n    ", f);
        jtok(f, &r->top[i]);
    }
    fputs(r->ntop ? "\n  ]\n}\n" : "]\n}\n", f);
}

/* ---- table --------------------------------------------------------------- */

static void where(FILE *f, const xent__cmp_tok *t) {
    fprintf(f, "position %" PRId64, t->pos);
    if (t->seq >= 0) fprintf(f, " (sequence %" PRId64 ", index %" PRId64 ")", t->seq, t->idx);
    if (t->token >= 0) fprintf(f, ", token %" PRId64, t->token);
}

static void bad_line(FILE *f, const char *what, int64_t n, int64_t first) {
    if (n) fprintf(f, "    %-22s %12" PRId64 "   first at position %" PRId64 "\n", what, n, first);
}

void xent__cmp_print_bad(FILE *f, const xent__cmp_result *r, const char *const names[4]) {
    for (int k = 0; k < 4; k++) {
        const xent__cmp_bad *b = &r->bad[k];
        if (!(b->positive + b->nan + b->inf + b->zero_run)) continue;
        fprintf(f, "  bad log-probs in %s (%s):\n", side[k], names[k]);
        bad_line(f, "positive", b->positive, b->first_positive);
        bad_line(f, "NaN", b->nan, b->first_nan);
        bad_line(f, "infinite", b->inf, b->first_inf);
        bad_line(f, "in runs of exact 0", b->zero_run, b->first_zero_run);
    }
}

static void ci(FILE *f, xent__cmp_ci c, int have) {
    if (have) fprintf(f, "   [%.6g, %.6g]", c.lo, c.hi);
    fputc('\n', f);
}

static void table_seq(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o) {
    if (!r->has_seq) {
        fprintf(f, "\nsequences: no boundaries (give --offsets or JSON Lines input)\n");
        return;
    }
    fprintf(f, "\nper sequence (%" PRId64 " sequences, %" PRId64 " with tokens): "
            "mean delta over completion tokens\n", r->nseq, r->nseq_used);
    if (!r->nseq_used) return;
    fprintf(f, "  mean %.6g   std %.6g   RMS %.6g   max |.| %.6g (sequence %" PRId64 ")\n",
            r->seq_mean, r->seq_std, r->seq_rms, r->seq_max, r->seq_max_idx);
    fprintf(f, "  sum delta: min %.6g (sequence %" PRId64 ", weight %.6g)   "
            "max %.6g (sequence %" PRId64 ", weight %.6g)\n",
            r->seq_sum_min, r->seq_sum_min_idx, exp(r->seq_sum_min),
            r->seq_sum_max, r->seq_sum_max_idx, exp(r->seq_sum_max));
    if (r->n_clamp_warn) {
        fprintf(f, "  WARNING: %" PRId64 " sequences have |sum delta| >= %.6g "
                "(within 10%% of the clamp %.6g):", r->n_clamp_warn, 0.9 * o->clamp, o->clamp);
        for (int64_t i = 0; i < r->n_clamp_list; i++)
            fprintf(f, " %" PRId64 " (%.4g)", r->clamp_idx[i], r->clamp_sum[i]);
        fprintf(f, "%s\n", r->n_clamp_list < r->n_clamp_warn ? " ..." : "");
    }
    if (!r->ntopseq) return;
    fprintf(f, "  worst sequences by |mean delta|:\n  %4s %9s %8s %14s %14s %12s\n",
            "#", "sequence", "tokens", "mean delta", "sum delta", "weight");
    for (int64_t i = 0; i < r->ntopseq; i++) {
        const xent__cmp_seq *q = &r->topseq[i];
        fprintf(f, "  %4" PRId64 " %9" PRId64 " %8" PRId64 " %14.7g %14.7g %12.6g\n", i + 1,
                q->seq, q->n, q->mean, q->sum, exp(q->sum));
    }
}

static void table_ref(FILE *f, const xent__cmp_result *r) {
    if (!r->has_ref) return;
    if (r->has_ref_b)
        fprintf(f, "\nreference: e_A = A - ref, e_B = B - ref_b, floor = ref - ref_b\n");
    else
        fprintf(f, "\nreference: e_A = A - ref, e_B = B - ref (one reference: floor = 0)\n");
    fprintf(f, "  delta = floor + (e_A - e_B):  mean delta %.6g   RMS delta %.6g   "
            "floor RMS %.6g (mean %.6g)   rho %.6f\n",
            r->mean, r->rms, r->floor_rms, r->floor_mean, r->rho);
    fprintf(f, "  RMS(e_A) %.6g   RMS(e_B) %.6g   mean(e_A) %.6g   mean(e_B) %.6g\n",
            r->rms_ea, r->rms_eb, r->mean_ea, r->mean_eb);
    fprintf(f, "  rho = corr(e_A, e_B) %.6f   (uncentred %.6f)\n", r->rho, r->rho0);
    fprintf(f, "  RMS(e_A - e_B)^2 %.6g = RMS(e_A)^2 %.6g + RMS(e_B)^2 %.6g + cross %.6g\n",
            r->rms_eab * r->rms_eab, r->rms_ea * r->rms_ea, r->rms_eb * r->rms_eb, r->cross);
    if (r->has_ref_b)
        fprintf(f, "  RMS(delta)^2 %.6g = floor RMS^2 %.6g + RMS(e_A - e_B)^2 %.6g + 2 E[floor (e_A - e_B)] %.6g\n",
                r->rms * r->rms, r->floor_rms * r->floor_rms, r->rms_eab * r->rms_eab,
                r->floor_cross);
    fprintf(f, "  uncorrelated errors would give RMS(e_A - e_B) %.6g\n",
            sqrt(r->rms_ea * r->rms_ea + r->rms_eb * r->rms_eb));
}

static void bucket_row(FILE *f, const char *label, const xent__cmp_rlm *m) {
    fprintf(f, "  %-10s %10" PRId64, label, m->n);
    if (!m->n) { fputs("          -\n", f); return; }
    fprintf(f, " %11.4g %10.4g %10.4g %10.4g %8.4g %8.4g\n", m->mean, m->rms, m->k3, m->chi2,
            m->tis, m->icepop);
}

static void bucket_head(FILE *f, const char *what) {
    fprintf(f, "  %-10s %10s %11s %10s %10s %10s %8s %8s\n", what, "n", "mean delta", "RMS",
            "K3", "chi2", "TIS", "ICEPOP");
}

static void table_rl(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o) {
    const xent__cmp_rl *rl = &r->rl;
    const xent__cmp_rlm *t = &rl->tok;
    fprintf(f, "\nRL-trainer metrics: A = trainer, B = sampler, w = exp(clamp(A - B, %.3g))\n",
            o->clamp);
    fprintf(f, "  perplexity          A %.7g   B %.7g", rl->ppl_a, rl->ppl_b);
    if (r->has_seq)
        fprintf(f, "   (per-sequence mean: A %.7g   B %.7g   log-ppl diff B - A %.4g)",
                rl->ppl_seq_a, rl->ppl_seq_b, rl->log_ppl_diff);
    fprintf(f, "\n  KL(B||A) estimators k1 %.6g   k2 %.6g   k3 %.6g\n", t->k1, t->k2, t->k3);
    fprintf(f, "  chi2 = E[w^2] - 1   token %.6g", t->chi2);
    if (r->has_seq) fprintf(f, "   sequence %.6g", rl->chi2_seq);
    fprintf(f, "\n  ESS / n             token %.6g", t->ess);
    if (r->has_seq) fprintf(f, "   sequence %.6g", rl->ess_seq);
    fprintf(f, "   (w clamped into [1/%.3g, %.3g]: %.6g)\n", o->tis_cap, o->tis_cap, rl->ess_trunc);
    fprintf(f, "  w                   min %.6g   mean %.6g   max %.6g   |delta| mean %.6g",
            rl->w_min, rl->w_mean, rl->w_max, t->mean_abs);
    if (rl->n_clamped) fprintf(f, "   (%" PRId64 " clamped)", rl->n_clamped);
    fprintf(f, "\n  TIS  w > %-8.4g   token %.6g", o->tis_cap, t->tis);
    if (r->has_seq) fprintf(f, "   sequence %.6g", rl->tis_seq);
    fprintf(f, "\n  MIS  w > %-8.4g   token %.6g", o->mis_cap, t->mis);
    if (r->has_seq) fprintf(f, "   sequence %.6g   geometric %.6g", rl->mis_seq, rl->mis_geo);
    fprintf(f, "\n  ICEPOP w outside [%.4g, %.4g]   token %.6g\n", o->icepop_lo, o->icepop_hi,
            t->icepop);
    fputc('\n', f);
    bucket_head(f, "position");
    for (int k = 0; k < XENT__CMP_NPOS; k++) bucket_row(f, pos_labels[k], &rl->pos[k]);
    if (rl->has_entropy) {
        bucket_head(f, "entropy");
        for (int k = 0; k < XENT__CMP_NENT; k++) bucket_row(f, ent_labels[k], &rl->ent[k]);
        if (rl->n_ent_missing)
            fprintf(f, "  (%" PRId64 " tokens without an entropy)\n", rl->n_ent_missing);
    }
    if (rl->has_freq) {
        bucket_head(f, "frequency");
        for (int k = 0; k < XENT__CMP_NFREQ; k++) bucket_row(f, freq_labels[k], &rl->freq[k]);
        fprintf(f, "  (id counts: rare <= %" PRId64 " < mid <= %" PRId64 " < common; %" PRId64
                " distinct ids)\n", rl->freq_cut[0], rl->freq_cut[1], rl->n_ids);
    }
}

static void table_top(FILE *f, const xent__cmp_result *r) {
    if (!r->ntop) return;
    fprintf(f, "\nworst tokens by |delta|:\n  %4s %12s %9s %7s %10s %14s %14s %14s\n",
            "#", "position", "sequence", "index", "token", "A", "B", "delta");
    for (int64_t i = 0; i < r->ntop; i++) {
        const xent__cmp_tok *t = &r->top[i];
        char seq[24] = "-", idx[24] = "-", tok[24] = "-"; /* -1: unknown */
        if (t->seq >= 0) snprintf(seq, sizeof seq, "%" PRId64, t->seq);
        if (t->idx >= 0) snprintf(idx, sizeof idx, "%" PRId64, t->idx);
        if (t->token >= 0) snprintf(tok, sizeof tok, "%" PRId64, t->token);
        fprintf(f, "  %4" PRId64 " %12" PRId64 " %9s %7s %10s %14.7g %14.7g %14.7g\n",
                i + 1, t->pos, seq, idx, tok, t->a, t->b, t->a - t->b);
    }
}

void xent__cmp_print_table(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o,
                           const char *const names[4]) {
    fprintf(f, "compare A = %s\n        B = %s\n", names[0], names[1]);
    if (r->has_ref) fprintf(f, "      ref = %s\n", names[2]);
    if (r->has_ref_b) fprintf(f, "    ref_b = %s\n", names[3]);
    fprintf(f, "tokens %" PRId64 ", selected %" PRId64 ", used %" PRId64
            ", excluded as bad %" PRId64 "\n", r->n, r->n_selected, r->n_used, r->n_excluded);
    xent__cmp_print_bad(f, r, names);
    int have = r->boot_n > 0;
    fprintf(f, "\ndelta = A - B%s\n", have ? "                                 95% bootstrap CI" : "");
    fprintf(f, "  mean          %14.7g", r->mean);
    ci(f, r->ci_mean, have);
    fprintf(f, "  RMS           %14.7g", r->rms);
    ci(f, r->ci_rms, have);
    fprintf(f, "  sum           %14.7g\n", r->sum);
    fprintf(f, "  max |delta|   %14.7g   at ", r->max_abs);
    where(f, &r->max_tok);
    fputc('\n', f);
    fprintf(f, "  |delta| quantiles:");
    for (int q = 0; q < XENT__CMP_NQ; q++) fprintf(f, "  %s%% %.6g", qnames[q], r->q[q]);
    fprintf(f, "\n\nPPO clip: outside ratio [%.6g, %.6g]  %.6g (%" PRId64 " tokens)",
            1.0 - o->eps, 1.0 + o->eps_high, r->clip_ratio, r->n_clip_ratio);
    ci(f, r->ci_clip_ratio, have);
    fprintf(f, "          |delta| > %.6g            %.6g (%" PRId64 " tokens)",
            o->eps, r->clip_log, r->n_clip_log);
    ci(f, r->ci_clip_log, have);
    if (have)
        fprintf(f, "  (bootstrap: %" PRId64 " resamples of %" PRId64 " %s%s, seed %" PRIu64 ")\n",
                r->boot_n, r->boot_units,
                r->boot_by_seq ? (r->boot_block > 1 ? "groups of sequences" : "sequences")
                               : (r->boot_block > 1 ? "token blocks" : "tokens"),
                r->boot_block > 1 ? " (block bootstrap)" : "", o->seed);
    table_seq(f, r, o);
    table_ref(f, r);
    table_rl(f, r, o);
    table_top(f, r);
}
