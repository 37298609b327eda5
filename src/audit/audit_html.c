/* src/audit/audit_html.c: `xent audit --html FILE`: one self-contained
 * page (no scripts, no network) with the tables and inline SVG plots:
 *   - relative RMS error against depth per variant, forward and backward
 *     (log scale; the reference, exactly 0, has no point on it);
 *   - histogram of chosen-token log-prob deltas (variant - reference);
 *   - scatter of variant against reference chosen-token log-probs. */
#include "audit/audit.h"
#include "core/xent_math.h"

#include <errno.h>
#include <stdlib.h>

#define PW 640 /* plot width  */
#define PH 300 /* plot height */
#define ML 70  /* margins: left, right, top, bottom */
#define MR 150
#define MT 30
#define MB 45

static const char *const k_colors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                       "#ff7f0e", "#9467bd", "#8c564b",
                                       "#e377c2", "#17becf", "#7f7f7f",
                                       "#bcbd22"};
#define NCOLORS ((int)(sizeof k_colors / sizeof k_colors[0]))

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

static void html_table(FILE *f, const xa_table *t) {
    fputs("<h3>", f);
    html_text(f, t->title);
    fputs("</h3>\n<table>\n<tr>", f);
    for (int c = 0; c < t->ncol; c++) {
        fputs("<th>", f);
        html_text(f, t->hdr[c]);
        fputs("</th>", f);
    }
    fputs("</tr>\n", f);
    for (int i = 0; i < t->nrows; i++) {
        fputs("<tr>", f);
        for (int c = 0; c < t->ncol; c++) {
            fputs(c && !t->left[c] ? "<td class=n>" : "<td>", f);
            html_text(f, t->cell[i][c]);
            fputs("</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    if (t->note[0]) {
        fputs("<p class=note>", f);
        html_text(f, t->note);
        fputs("</p>\n", f);
    }
}

/* Plot frame: maps data (x in [x0,x1], y in [y0,y1]) to pixels. */
typedef struct frame {
    double x0, x1, y0, y1;
    int logy;
} frame;

static double px(const frame *fr, double x) {
    return ML + (x - fr->x0) / (fr->x1 - fr->x0) * (PW - ML - MR);
}
static double py(const frame *fr, double y) {
    double v = fr->logy ? log10(y) : y;
    return MT + (1.0 - (v - fr->y0) / (fr->y1 - fr->y0)) * (PH - MT - MB);
}

static void svg_open(FILE *f, const char *title, const char *xl,
                     const char *yl) {
    fprintf(f, "<svg width='%d' height='%d'"
            " font-family='sans-serif' font-size='11'>\n", PW, PH);
    fprintf(f, "<rect width='%d' height='%d' fill='white'/>\n", PW, PH);
    fprintf(f, "<text x='%d' y='18' font-size='13' font-weight='bold'>", ML);
    html_text(f, title);
    fprintf(f, "</text>\n<text x='%d' y='%d' text-anchor='middle'>", (PW - MR + ML) / 2,
            PH - 8);
    html_text(f, xl);
    fprintf(f, "</text>\n<text x='14' y='%d' text-anchor='middle' "
            "transform='rotate(-90 14 %d)'>", PH / 2, PH / 2);
    html_text(f, yl);
    fputs("</text>\n", f);
}

static void axes(FILE *f, const frame *fr, int nxt) {
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' "
            "stroke='#444'/>\n", ML, MT, PW - ML - MR, PH - MT - MB);
    /* y ticks: decades on a log axis, 5 steps on a linear one */
    if (fr->logy) {
        for (int e = (int)ceil(fr->y0); e <= (int)floor(fr->y1); e++) {
            double y = py(fr, pow(10, e));
            fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/>"
                    "<text x='%d' y='%.1f' text-anchor='end'>1e%d</text>\n",
                    ML, PW - MR, y, y, ML - 4, y + 4, e);
        }
    } else {
        for (int k = 0; k <= 4; k++) {
            double v = fr->y0 + (fr->y1 - fr->y0) * k / 4.0;
            double y = py(fr, v);
            fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/>"
                    "<text x='%d' y='%.1f' text-anchor='end'>%.3g</text>\n",
                    ML, PW - MR, y, y, ML - 4, y + 4, v);
        }
    }
    for (int k = 0; nxt > 0 && k <= nxt; k++) {
        double v = fr->x0 + (fr->x1 - fr->x0) * k / (double)nxt;
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle'>%.3g</text>\n",
                px(fr, v), PH - MB + 14, v);
    }
}

/* Integer x ticks every 1, 2, 5, 10, ... layers (at most ~10 labels). */
static void layer_ticks(FILE *f, const frame *fr, int L) {
    static const int steps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000};
    int step = 1000;
    for (int k = 9; k >= 0; k--)
        if (L / steps[k] <= 10) step = steps[k];
    for (int x = 0; x <= L; x += step)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle'>%d</text>\n",
                px(fr, x), PH - MB + 14, x);
}

static void legend(FILE *f, int slot, int color, const char *name) {
    int y = MT + 12 + 16 * slot;
    fprintf(f, "<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='%s' "
            "stroke-width='2'/><text x='%d' y='%d'>", PW - MR + 10,
            PW - MR + 28, y - 4, y - 4, k_colors[color % NCOLORS],
            PW - MR + 32, y);
    html_text(f, name);
    fputs("</text>\n", f);
}

/* rel % of (variant v, role, layer) or of the role alone (layer -2). */
static double rel_of(const xent_audit_result *r, int v, xent_audit_role role,
                     int layer) {
    for (int e = 0; e < r->n_entries; e++)
        if (r->entries[e].role == role &&
            (layer == -2 || r->entries[e].layer == layer))
            return 100.0 * r->m[(size_t)v * (size_t)r->n_entries + (size_t)e].rms_rel;
    return NAN;
}

/* Series value at x in [0, L]: layers 0..L-1, then the extra role at L. */
static double depth_value(const xent_audit_result *r, int v,
                          xent_audit_role layer_role, xent_audit_role extra,
                          int x) {
    return x < r->n_layers ? rel_of(r, v, layer_role, x)
                           : rel_of(r, v, extra, -2);
}

static void depth_plot(FILE *f, const xent_audit_result *r, int backward) {
    xent_audit_role lr = backward ? XA_BW_LAYER : XA_FW_LAYER;
    xent_audit_role ex = backward ? XA_DLOGITS : XA_LOGITS;
    int L = r->n_layers;
    double lo = INFINITY, hi = -INFINITY;
    for (int v = 0; v < r->variants.n; v++)
        for (int x = 0; x <= L; x++) {
            double y = depth_value(r, v, lr, ex, x);
            if (y > 0 && isfinite(y)) {
                lo = fmin(lo, y);
                hi = fmax(hi, y);
            }
        }
    if (!(lo <= hi)) lo = hi = 1;
    frame fr = {0, L > 0 ? L : 1, floor(log10(lo)), ceil(log10(hi)), 1};
    if (fr.y1 <= fr.y0) fr.y1 = fr.y0 + 1;
    svg_open(f, backward ? "Backward: gradient at layer inputs (x = L: dL/dlogits)"
                         : "Forward: layer outputs (x = L: logits)",
             "layer", "relative RMS error, %");
    axes(f, &fr, 0);
    layer_ticks(f, &fr, L);
    int slot = 0;
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='",
                k_colors[v % NCOLORS]);
        for (int x = 0; x <= L; x++) {
            double y = depth_value(r, v, lr, ex, x);
            if (y > 0 && isfinite(y)) fprintf(f, "%.1f,%.1f ", px(&fr, x), py(&fr, y));
        }
        fputs("'/>\n", f);
        legend(f, slot++, v, r->variants.v[v].name);
    }
    fputs("</svg>\n", f);
}

static const float *lp_of(const xent_audit_result *r, int v) {
    return r->logprob + (size_t)v * (size_t)r->n_targets;
}

#define NBINS 61

static void histogram(FILE *f, const xent_audit_result *r) {
    const float *ref = lp_of(r, r->ref);
    double amax = 0;
    for (int v = 0; v < r->variants.n; v++)
        for (int64_t i = 0; i < r->n_targets; i++) {
            double d = (double)lp_of(r, v)[i] - ref[i];
            if (isfinite(d)) amax = fmax(amax, fabs(d));
        }
    /* the range: 6x the largest RMS delta (outliers land in the edge bins) */
    double rms_max = 0;
    for (int v = 0; v < r->variants.n; v++) {
        double s2 = 0;
        for (int64_t i = 0; i < r->n_targets; i++) {
            double d = (double)lp_of(r, v)[i] - ref[i];
            if (isfinite(d)) s2 += d * d;
        }
        rms_max = fmax(rms_max, sqrt(s2 / (double)(r->n_targets > 0 ? r->n_targets : 1)));
    }
    amax = fmin(amax, 6 * rms_max);
    if (amax == 0) amax = 1e-6;
    int64_t cnt[XENT_AUDIT_MAX_VARIANTS][NBINS];
    memset(cnt, 0, sizeof cnt);
    int64_t cmax = 1;
    for (int v = 0; v < r->variants.n; v++)
        for (int64_t i = 0; i < r->n_targets; i++) {
            double d = (double)lp_of(r, v)[i] - ref[i];
            if (!isfinite(d)) continue;
            int b = (int)floor((d + amax) / (2 * amax) * NBINS);
            b = b < 0 ? 0 : (b >= NBINS ? NBINS - 1 : b);
            if (++cnt[v][b] > cmax && v != r->ref) cmax = cnt[v][b];
        }
    frame fr = {-amax, amax, 0, (double)cmax, 0};
    svg_open(f, "Chosen-token log-prob delta (variant - reference; edge bins "
                "hold the tails)",
             "delta, nats", "tokens");
    axes(f, &fr, 4);
    int slot = 0;
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='",
                k_colors[v % NCOLORS]);
        for (int b = 0; b < NBINS; b++) {
            double xa = -amax + 2 * amax * b / NBINS, xb = xa + 2 * amax / NBINS;
            double y = py(&fr, (double)cnt[v][b]);
            fprintf(f, "%.1f,%.1f %.1f,%.1f ", px(&fr, xa), y, px(&fr, xb), y);
        }
        fputs("'/>\n", f);
        legend(f, slot++, v, r->variants.v[v].name);
    }
    fputs("</svg>\n", f);
}

#define MAX_POINTS 3000

static void scatter(FILE *f, const xent_audit_result *r) {
    const float *ref = lp_of(r, r->ref);
    double lo = 0, hi = 0;
    for (int v = 0; v < r->variants.n; v++)
        for (int64_t i = 0; i < r->n_targets; i++) {
            double y = lp_of(r, v)[i];
            if (isfinite(y)) { lo = fmin(lo, y); hi = fmax(hi, y); }
        }
    if (hi <= lo) hi = lo + 1;
    frame fr = {lo, hi, lo, hi, 0};
    svg_open(f, "Chosen-token log-prob: variant against reference",
             "reference log p", "variant log p");
    axes(f, &fr, 4);
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#999' "
            "stroke-dasharray='4 3'/>\n", px(&fr, lo), py(&fr, lo),
            px(&fr, hi), py(&fr, hi));
    int64_t step = r->n_targets / MAX_POINTS + 1;
    int slot = 0;
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        fprintf(f, "<g fill='%s' fill-opacity='0.5'>", k_colors[v % NCOLORS]);
        for (int64_t i = 0; i < r->n_targets; i += step) {
            double y = lp_of(r, v)[i];
            if (isfinite(y) && isfinite(ref[i]))
                fprintf(f, "<circle cx='%.1f' cy='%.1f' r='1.6'/>",
                        px(&fr, ref[i]), py(&fr, y));
        }
        fputs("</g>\n", f);
        legend(f, slot++, v, r->variants.v[v].name);
    }
    fputs("</svg>\n", f);
}

static void write_head(FILE *f, const xent_audit_result *r) {
    fputs("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>\n"
          "<title>xent audit</title>\n<style>\n"
          "body{font-family:sans-serif;margin:20px;max-width:1400px}\n"
          "table{border-collapse:collapse;font-size:12px}\n"
          "td,th{border:1px solid #ccc;padding:2px 8px}\n"
          "td.n{text-align:right;font-family:monospace}\n"
          ".note{font-size:12px;color:#555}\nsvg{margin:6px}\n"
          "</style></head><body>\n<h2>xent audit</h2>\n", f);
    if (r->random_weights)
        fputs("<p style='background:#fff3cd;border:1px solid #e0b000;padding:6px'><b>Random "
              "weights</b>: this model was not loaded from a checkpoint; its weights are drawn "
              "at random (--init random), so the numbers show the precision policies on these "
              "shapes, not on a trained model.</p>\n", f);
    fputs("<p>model: ", f);
    html_text(f, r->model);
    fputs("<br>input: ", f);
    html_text(f, r->input);
    fprintf(f, "<br>%lld x %lld = %lld tokens run, %lld targets, %d layers, "
            "reference: ", (long long)r->batch, (long long)r->seq_len,
            (long long)r->n_tokens, (long long)r->n_targets, r->n_layers);
    html_text(f, r->variants.v[r->ref].name);
    fputs("</p>\n", f);
}

xent_status xent__audit_write_html(const xent_audit_result *r,
                                   const char *path) {
    xa_table *t = malloc(sizeof *t);
    if (!t) return xent_set_error(XENT_ERR_ALLOC, "--html: out of memory");
    /* written to PATH.tmp.XXXXXX and renamed into place when complete */
    char *tmp = NULL;
    FILE *f = xent_file_create(path, &tmp);
    if (!f) {
        free(t);
        return XENT_ERR_IO;
    }
    write_head(f, r);
    depth_plot(f, r, 0);
    depth_plot(f, r, 1);
    fputs("<br>\n", f);
    histogram(f, r);
    scatter(f, r);
    void (*builders[])(xa_table *, const xent_audit_result *) = {
        xa_build_lp, xa_build_fw, xa_build_bw, xa_build_grad, xa_build_variants};
    for (size_t k = 0; k < sizeof builders / sizeof builders[0]; k++) {
        builders[k](t, r);
        html_table(f, t);
    }
    fputs("</body></html>\n", f);
    free(t);
    return xent_file_commit(f, tmp, path, !ferror(f));
}
