/* src/compare/report.c: the table and the JSON of `xent compare`. */
#include "compare/compare.h"

#include <inttypes.h>

static const char *const qnames[XENT__CMP_NQ] = {"50", "90", "99", "99.9"};
static const char *const side[3] = {"a", "b", "ref"};

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
    fputs("\"decomposition\": {", f);
    jkv(f, "rms_delta_sq", r->rms * r->rms, 0);
    jkv(f, "rms_ea_sq", r->rms_ea * r->rms_ea, 0);
    jkv(f, "rms_eb_sq", r->rms_eb * r->rms_eb, 0);
    jkv(f, "cross", r->cross, 0);
    jkv(f, "uncorrelated_rms", sqrt(r->rms_ea * r->rms_ea + r->rms_eb * r->rms_eb), 1);
    fputs("}},\n", f);
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
    for (int k = 0; k < 3; k++) {
        if (k == 2 && !r->has_ref) break;
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

void xent__cmp_print_bad(FILE *f, const xent__cmp_result *r, const char *const names[3]) {
    for (int k = 0; k < 3; k++) {
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
    fprintf(f, "\nreference: e_A = A - ref, e_B = B - ref\n");
    fprintf(f, "  RMS(e_A) %.6g   RMS(e_B) %.6g   mean(e_A) %.6g   mean(e_B) %.6g\n",
            r->rms_ea, r->rms_eb, r->mean_ea, r->mean_eb);
    fprintf(f, "  rho = corr(e_A, e_B) %.6f   (uncentred %.6f)\n", r->rho, r->rho0);
    fprintf(f, "  RMS(delta)^2 %.6g = RMS(e_A)^2 %.6g + RMS(e_B)^2 %.6g + cross %.6g\n",
            r->rms * r->rms, r->rms_ea * r->rms_ea, r->rms_eb * r->rms_eb, r->cross);
    fprintf(f, "  uncorrelated errors would give RMS(delta) %.6g\n",
            sqrt(r->rms_ea * r->rms_ea + r->rms_eb * r->rms_eb));
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
                           const char *const names[3]) {
    fprintf(f, "compare A = %s\n        B = %s\n", names[0], names[1]);
    if (r->has_ref) fprintf(f, "      ref = %s\n", names[2]);
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
    table_top(f, r);
}
