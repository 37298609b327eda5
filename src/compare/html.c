/* src/compare/html.c: a self-contained HTML report of `xent compare`: the
 * tables and two inline SVG plots (histogram of delta with a log-scale count
 * axis; delta against the reference log-prob, or against B without one).
 * No scripts, fonts or links: it renders offline. */
#include "compare/compare.h"

#include <inttypes.h>
#include <stdlib.h>

#define HIST_BINS 81
#define MAX_POINTS 4000
#define PW 640.0  /* plot area width, height and margins (SVG units) */
#define PH 300.0
#define ML 70.0
#define MT 20.0

static void esc(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A round tick step giving about `want` ticks over span. */
static double tick_step(double span, int want) {
    if (!(span > 0)) return 1;
    double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void svg_open(FILE *f, const char *title) {
    fprintf(f, "<h2>%s</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n", title, PW + ML + 20, PH + MT + 50);
    fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"#fafafa\" stroke=\"#888\"/>\n",
            ML, MT, PW, PH);
}

/* x axis ticks for [lo, hi] mapped to [ML, ML + PW]. */
static void x_axis(FILE *f, double lo, double hi, const char *label) {
    double st = tick_step(hi - lo, 8);
    for (double t = ceil(lo / st) * st; t <= hi + 1e-12 * (hi - lo); t += st) {
        double x = ML + (t - lo) / (hi - lo) * PW;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#888\"/>"
                "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%.3g</text>\n",
                x, MT + PH, x, MT + PH + 5, x, MT + PH + 18, fabs(t) < st * 1e-9 ? 0.0 : t);
    }
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">", ML + PW / 2, MT + PH + 38);
    esc(f, label);
    fputs("</text>\n", f);
}

static void y_label(FILE *f, const char *label) {
    fprintf(f, "<text transform=\"translate(14,%g) rotate(-90)\" text-anchor=\"middle\">", MT + PH / 2);
    esc(f, label);
    fputs("</text>\n", f);
}

static void histogram(FILE *f, const xent__cmp_result *r) {
    double m = r->max_abs > 0 ? r->max_abs : 1;
    int64_t cnt[HIST_BINS] = {0};
    for (int64_t i = 0; i < r->n; i++) {
        if (!r->use[i]) continue;
        double d = r->a[i] - r->b[i];
        int k = (int)floor((d + m) / (2 * m) * HIST_BINS);
        cnt[k < 0 ? 0 : k >= HIST_BINS ? HIST_BINS - 1 : k]++;
    }
    int64_t top = 1;
    for (int k = 0; k < HIST_BINS; k++) if (cnt[k] > top) top = cnt[k];
    double ymax = ceil(log10((double)top) + 1e-9), ymin = -0.3; /* log10 counts */
    if (ymax < 1) ymax = 1;
    svg_open(f, "Histogram of delta = A - B (log-scale counts)");
    for (int e = 0; e <= (int)ymax; e++) {
        double y = MT + PH - (e - ymin) / (ymax - ymin) * PH;
        fprintf(f, "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n",
                ML, y, ML + PW, y, ML - 4, y + 4, e);
    }
    double bw = PW / HIST_BINS;
    for (int k = 0; k < HIST_BINS; k++) {
        if (!cnt[k]) continue;
        double h = (log10((double)cnt[k]) - ymin) / (ymax - ymin) * PH;
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#4a7ab5\">"
                "<title>[%.4g, %.4g): %" PRId64 "</title></rect>\n",
                ML + k * bw, MT + PH - h, bw * 0.9, h, -m + 2 * m * k / HIST_BINS,
                -m + 2 * m * (k + 1) / HIST_BINS, cnt[k]);
    }
    x_axis(f, -m, m, "delta (nats)");
    y_label(f, "tokens");
    fputs("</svg>\n", f);
}

static void scatter(FILE *f, const xent__cmp_result *r) {
    const double *xs = r->has_ref ? r->r : r->b;
    double xlo = INFINITY, xhi = -INFINITY, m = r->max_abs > 0 ? r->max_abs : 1;
    for (int64_t i = 0; i < r->n; i++) {
        if (!r->use[i]) continue;
        if (xs[i] < xlo) xlo = xs[i];
        if (xs[i] > xhi) xhi = xs[i];
    }
    if (!(xhi > xlo)) { xlo -= 1; xhi += 1; }
    int64_t stride = (r->n_used + MAX_POINTS - 1) / MAX_POINTS, seen = 0;
    svg_open(f, r->has_ref ? "delta against the reference log-prob"
                           : "delta against B's log-prob (no reference given)");
    double y0 = MT + PH / 2;
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#bbb\"/>\n", ML, y0, ML + PW, y0);
    for (int s = -1; s <= 1; s += 2)
        fprintf(f, "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                ML - 4, y0 - s * PH / 2 * 0.95 + 4, s * m);
    fprintf(f, "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">0</text>\n", ML - 4, y0 + 4);
    fputs("<g fill=\"#4a7ab5\" fill-opacity=\"0.5\">\n", f);
    for (int64_t i = 0; i < r->n; i++) {
        if (!r->use[i] || seen++ % stride) continue;
        double x = ML + (xs[i] - xlo) / (xhi - xlo) * PW;
        double y = y0 - (r->a[i] - r->b[i]) / m * PH / 2 * 0.95;
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.6\"/>\n", x, y);
    }
    fputs("</g>\n<g fill=\"#c0392b\">\n", f);
    for (int64_t k = 0; k < r->ntop; k++) {
        const xent__cmp_tok *t = &r->top[k];
        double xv = r->has_ref ? t->r : t->b;
        double x = ML + (xv - xlo) / (xhi - xlo) * PW, y = y0 - (t->a - t->b) / m * PH / 2 * 0.95;
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"><title>position %" PRId64
                ": delta %.6g</title></circle>\n", x, y, t->pos, t->a - t->b);
    }
    fputs("</g>\n", f);
    x_axis(f, xlo, xhi, r->has_ref ? "reference log-prob" : "B log-prob");
    y_label(f, "delta = A - B");
    fprintf(f, "</svg>\n<p class=\"note\">%" PRId64 " of %" PRId64 " tokens drawn (every %" PRId64
            "th); red: the %" PRId64 " worst.</p>\n", (r->n_used + stride - 1) / stride,
            r->n_used, stride, r->ntop);
}

static void row(FILE *f, const char *k, const char *fmt, double v) {
    fprintf(f, "<tr><td>%s</td><td>", k);
    if (isfinite(v)) fprintf(f, fmt, v); else fputs("&ndash;", f);
    fputs("</td></tr>\n", f);
}

static void row_ci(FILE *f, const char *k, double v, xent__cmp_ci c, int have) {
    fprintf(f, "<tr><td>%s</td><td>%.7g</td><td>", k, v);
    if (have) fprintf(f, "[%.5g, %.5g]", c.lo, c.hi);
    fputs("</td></tr>\n", f);
}

static void bucket_table(FILE *f, const char *title, const char *const *labels,
                         const xent__cmp_rlm *m, int nb) {
    fprintf(f, "<h2>%s</h2>\n<table><tr><th>bucket</th><th>n</th><th>mean delta</th>"
            "<th>RMS delta</th><th>K1</th><th>K3</th><th>chi2</th><th>ESS/n</th><th>TIS</th>"
            "<th>MIS</th><th>ICEPOP</th></tr>\n", title);
    for (int k = 0; k < nb; k++) {
        const xent__cmp_rlm *x = &m[k];
        fprintf(f, "<tr><td>%s</td><td>%" PRId64 "</td>", labels[k], x->n);
        const double v[9] = {x->mean, x->rms, x->k1, x->k3, x->chi2, x->ess, x->tis, x->mis,
                             x->icepop};
        for (int j = 0; j < 9; j++) {
            if (isfinite(v[j])) fprintf(f, "<td>%.5g</td>", v[j]);
            else fputs("<td>&ndash;</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void rl_tables(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o) {
    static const char *const pl[XENT__CMP_NPOS] = {"0-63", "64-255", "256-1023", "1024+"};
    static const char *const el[XENT__CMP_NENT] = {"&lt;0.01", "0.01-0.1", "0.1-1", "&ge;1"};
    static const char *const fl[XENT__CMP_NFREQ] = {"rare", "mid", "common"};
    const xent__cmp_rl *rl = &r->rl;
    char k[128];
    fputs("<h2>RL-trainer metrics (A = trainer, B = sampler)</h2>\n<table>\n", f);
    row(f, "perplexity A", "%.7g", rl->ppl_a);
    row(f, "perplexity B", "%.7g", rl->ppl_b);
    if (r->has_seq) {
        row(f, "per-sequence mean perplexity A", "%.7g", rl->ppl_seq_a);
        row(f, "per-sequence mean perplexity B", "%.7g", rl->ppl_seq_b);
        row(f, "log-ppl diff (B - A)", "%.6g", rl->log_ppl_diff);
    }
    row(f, "KL k1", "%.6g", rl->tok.k1);
    row(f, "KL k2", "%.6g", rl->tok.k2);
    row(f, "KL k3", "%.6g", rl->tok.k3);
    row(f, "chi2 token E[w^2] - 1", "%.6g", rl->tok.chi2);
    row(f, "ESS/n token", "%.6g", rl->tok.ess);
    snprintf(k, sizeof k, "ESS/n token, w clamped into [1/%g, %g]", o->tis_cap, o->tis_cap);
    row(f, k, "%.6g", rl->ess_trunc);
    row(f, "w min", "%.6g", rl->w_min);
    row(f, "w mean", "%.6g", rl->w_mean);
    row(f, "w max", "%.6g", rl->w_max);
    row(f, "mean |delta|", "%.6g", rl->tok.mean_abs);
    snprintf(k, sizeof k, "TIS w &gt; %g, tokens", o->tis_cap);
    row(f, k, "%.6g", rl->tok.tis);
    snprintf(k, sizeof k, "MIS w &gt; %g, tokens", o->mis_cap);
    row(f, k, "%.6g", rl->tok.mis);
    snprintf(k, sizeof k, "ICEPOP w outside [%g, %g], tokens", o->icepop_lo, o->icepop_hi);
    row(f, k, "%.6g", rl->tok.icepop);
    if (r->has_seq) {
        row(f, "chi2 sequence", "%.6g", rl->chi2_seq);
        row(f, "ESS/n sequence", "%.6g", rl->ess_seq);
        snprintf(k, sizeof k, "TIS w &gt; %g, sequences", o->tis_cap);
        row(f, k, "%.6g", rl->tis_seq);
        snprintf(k, sizeof k, "MIS w &gt; %g, sequences", o->mis_cap);
        row(f, k, "%.6g", rl->mis_seq);
        snprintf(k, sizeof k, "MIS geometric mean &gt; %g, sequences", o->mis_cap);
        row(f, k, "%.6g", rl->mis_geo);
    }
    fputs("</table>\n", f);
    bucket_table(f, "By position in the completion", pl, rl->pos, XENT__CMP_NPOS);
    if (rl->has_entropy) bucket_table(f, "By entropy (nats)", el, rl->ent, XENT__CMP_NENT);
    if (rl->has_freq) bucket_table(f, "By token frequency in the dump", fl, rl->freq, XENT__CMP_NFREQ);
}

static void tables(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o) {
    int have = r->boot_n > 0;
    fprintf(f, "<p>tokens %" PRId64 ", selected %" PRId64 ", used %" PRId64
            ", excluded as bad %" PRId64 "</p>\n", r->n, r->n_selected, r->n_used, r->n_excluded);
    fputs("<h2>delta = A - B</h2>\n<table><tr><th>statistic</th><th>value</th>"
          "<th>95% bootstrap CI</th></tr>\n", f);
    row_ci(f, "mean", r->mean, r->ci_mean, have);
    row_ci(f, "RMS", r->rms, r->ci_rms, have);
    row_ci(f, "sum", r->sum, r->ci_mean, 0);
    fprintf(f, "<tr><td>max |delta|</td><td>%.7g</td><td>at position %" PRId64 "</td></tr>\n",
            r->max_abs, r->max_tok.pos);
    for (int q = 0; q < XENT__CMP_NQ; q++) {
        char k[48];
        snprintf(k, sizeof k, "|delta| quantile %g%%", 100 * xent__cmp_qlevels[q]);
        row_ci(f, k, r->q[q], r->ci_mean, 0);
    }
    char k[96];
    snprintf(k, sizeof k, "outside ratio clip [%g, %g]", 1 - o->eps, 1 + o->eps_high);
    row_ci(f, k, r->clip_ratio, r->ci_clip_ratio, have);
    snprintf(k, sizeof k, "|delta| &gt; %g", o->eps);
    row_ci(f, k, r->clip_log, r->ci_clip_log, have);
    fputs("</table>\n", f);
    if (r->has_seq && r->nseq_used) {
        fputs("<h2>Per sequence: mean delta over completion tokens</h2>\n<table>\n", f);
        row(f, "sequences with tokens", "%.0f", (double)r->nseq_used);
        row(f, "mean", "%.7g", r->seq_mean);
        row(f, "std", "%.7g", r->seq_std);
        row(f, "RMS", "%.7g", r->seq_rms);
        row(f, "max |mean|", "%.7g", r->seq_max);
        row(f, "min sum delta", "%.7g", r->seq_sum_min);
        row(f, "max sum delta", "%.7g", r->seq_sum_max);
        row(f, "sequences near the clamp", "%.0f", (double)r->n_clamp_warn);
        fputs("</table>\n", f);
        if (r->ntopseq) {
            fputs("<h2>Worst sequences by |mean delta|</h2>\n<table><tr><th>sequence</th>"
                  "<th>tokens</th><th>mean delta</th><th>sum delta</th><th>weight exp(sum)</th></tr>\n", f);
            for (int64_t i = 0; i < r->ntopseq; i++) {
                const xent__cmp_seq *q = &r->topseq[i];
                fprintf(f, "<tr><td>%" PRId64 "</td><td>%" PRId64 "</td><td>%.7g</td><td>%.7g</td>"
                        "<td>%.6g</td></tr>\n", q->seq, q->n, q->mean, q->sum, exp(q->sum));
            }
            fputs("</table>\n", f);
        }
    }
    if (r->has_ref) {
        fputs("<h2>Against the reference</h2>\n<table>\n", f);
        row(f, "mean delta", "%.7g", r->mean);
        row(f, "RMS delta", "%.7g", r->rms);
        row(f, r->has_ref_b ? "floor RMS (ref - ref_b)" : "floor RMS (one reference: 0)", "%.7g",
            r->floor_rms);
        row(f, "floor mean", "%.7g", r->floor_mean);
        row(f, "RMS(e_A - e_B)", "%.7g", r->rms_eab);
        row(f, "RMS(e_A)", "%.7g", r->rms_ea);
        row(f, "RMS(e_B)", "%.7g", r->rms_eb);
        row(f, "rho = corr(e_A, e_B)", "%.6f", r->rho);
        row(f, "uncentred rho", "%.6f", r->rho0);
        row(f, "RMS(e_A - e_B)^2", "%.7g", r->rms_eab * r->rms_eab);
        row(f, "RMS(e_A)^2 + RMS(e_B)^2", "%.7g", r->rms_ea * r->rms_ea + r->rms_eb * r->rms_eb);
        row(f, "cross term", "%.7g", r->cross);
        fputs("</table>\n", f);
    }
    rl_tables(f, r, o);
    if (r->ntop) {
        fputs("<h2>Worst tokens</h2>\n<table><tr><th>position</th><th>sequence</th><th>index</th>"
              "<th>token</th><th>A</th><th>B</th><th>delta</th></tr>\n", f);
        for (int64_t i = 0; i < r->ntop; i++) {
            const xent__cmp_tok *t = &r->top[i];
            char seq[24] = "&ndash;", idx[24] = "&ndash;", tok[24] = "&ndash;";
            if (t->seq >= 0) snprintf(seq, sizeof seq, "%" PRId64, t->seq);
            if (t->idx >= 0) snprintf(idx, sizeof idx, "%" PRId64, t->idx);
            if (t->token >= 0) snprintf(tok, sizeof tok, "%" PRId64, t->token);
            fprintf(f, "<tr><td>%" PRId64 "</td><td>%s</td><td>%s</td><td>%s</td>"
                    "<td>%.7g</td><td>%.7g</td><td>%.7g</td></tr>\n",
                    t->pos, seq, idx, tok, t->a, t->b, t->a - t->b);
        }
        fputs("</table>\n", f);
    }
}

void xent__cmp_write_html(FILE *f, const xent__cmp_result *r, const xent__cmp_opts *o,
                          const char *const names[4]) {
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>xent compare</title>\n"
          "<style>body{font-family:sans-serif;margin:2em;max-width:60em}"
          "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;"
          "padding:2px 8px;text-align:right}td:first-child{text-align:left}"
          ".note{color:#666;font-size:small}</style></head><body>\n<h1>xent compare</h1>\n<p>A = ", f);
    esc(f, names[0]);
    fputs("<br>B = ", f);
    esc(f, names[1]);
    if (r->has_ref) { fputs("<br>ref = ", f); esc(f, names[2]); }
    if (r->has_ref_b) { fputs("<br>ref_b = ", f); esc(f, names[3]); }
    fputs("</p>\n", f);
    tables(f, r, o);
    histogram(f, r);
    scatter(f, r);
    fputs("</body></html>\n", f);
}
