/* src/audit/audit_html.c: `xent audit --html FILE`: one self-contained
 * page (no scripts, no network, inline SVG), in reading order:
 *   - the verdict: per variant the tightest budget it meets and where its
 *     error enters, the budgets, and one sentence defining each figure;
 *   - relative RMS error against depth per variant, forward and backward
 *     (log scale; each variant its colour, marker and dash; markers of
 *     variants side by side at a layer are spread a few pixels apart, and a
 *     series equal to an earlier one says so in the legend);
 *   - one histogram per variant of |chosen-token log-prob delta| on a
 *     shared log axis (each panel its own count scale);
 *   - the worst tensors and the worst tokens (with their text) per variant;
 *   - the summary tables of the console.
 * Paths are written without their directories (the report may be read
 * anywhere); docs/audit.md, "Report". */
#include "audit/audit.h"
#include "core/xent_math.h"

#include <errno.h>
#include <stdlib.h>

#define PW 600 /* depth plot width  */
#define PH 340 /* depth plot height */
#define ML 70  /* margins: left, right, top, bottom */
#define MR 165
#define MT 30
#define MB 45

/* Okabe-Ito (colour-blind safe), then darker extras; never yellow. */
static const char *const k_colors[] = {"#0072B2", "#D55E00", "#009E73",
                                       "#CC79A7", "#E69F00", "#56B4E9",
                                       "#000000", "#8c564b", "#7f7f7f",
                                       "#bcbd22"};
#define NCOLORS ((int)(sizeof k_colors / sizeof k_colors[0]))
static const char *const k_dash[] = {"", "6 3", "2 2", "8 3 2 3", "4 4", "1 3"};
#define NDASH ((int)(sizeof k_dash / sizeof k_dash[0]))
#define NMARKERS 6 /* circle, square, triangle up, diamond, triangle down, x */

#define TOP_TENSORS 5
#define TOP_TOKENS 6
#define CONTEXT_TOKENS 4

/* ------------------------------------------------------------------------ */
/* Text                                                                      */
/* ------------------------------------------------------------------------ */

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if (*s == '\'') fputs("&#39;", f);
        else fputc(*s, f);
    }
}

/* Like html_text, with every path (a word starting with '/' or "~/")
 * reduced to its last component: "/a/b/model.gguf (gguf)" ->
 * "model.gguf (gguf)". */
static void html_text_nodirs(FILE *f, const char *s) {
    char word[1024];
    while (*s) {
        int start = *s == '/' || (*s == '~' && s[1] == '/');
        if (!start) {
            char c[2] = {*s++, 0};
            html_text(f, c);
            continue;
        }
        size_t n = 0;
        while (s[n] && s[n] != ' ' && s[n] != ',' && s[n] != ')' && s[n] != '(')
            n++;
        size_t k = n < sizeof word - 1 ? n : sizeof word - 1;
        memcpy(word, s, k);
        word[k] = 0;
        while (k > 1 && word[k - 1] == '/') word[--k] = 0; /* "dir/" */
        const char *base = strrchr(word, '/');
        html_text(f, base && base[1] ? base + 1 : word);
        s += n;
    }
}

/* Raw token bytes: valid UTF-8 as is (escaped), control characters and
 * invalid bytes as \n, \t, \xNN, so nothing is hidden. */
static void html_token(FILE *f, const char *s) {
    while (*s) {
        unsigned char c = (unsigned char)*s;
        int n = xent__audit_utf8_len(s);
        if (n == 0 || c < 0x20 || c == 0x7f) {
            if (c == '\n') fputs("\\n", f);
            else if (c == '\t') fputs("\\t", f);
            else if (c == '\r') fputs("\\r", f);
            else fprintf(f, "\\x%02X", c);
            s++;
            continue;
        }
        if (n == 1) {
            char one[2] = {*s, 0};
            html_text(f, one);
        } else {
            fwrite(s, 1, (size_t)n, f);
        }
        s += n;
    }
}

/* A number with two significant figures ("-" when not finite). */
static void fmt2(char *buf, size_t n, double v) {
    if (!isfinite(v)) snprintf(buf, n, "-");
    else if (v == 0) snprintf(buf, n, "0");
    else snprintf(buf, n, "%.*f", xent__audit_decimals_for(v), v);
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

/* ------------------------------------------------------------------------ */
/* Variants' styles                                                          */
/* ------------------------------------------------------------------------ */

/* Slot of a variant among the non-reference ones (-1 for the reference):
 * its colour, marker and dash in every plot. */
static int slot_of(const xent_audit_result *r, int v) {
    if (v == r->ref) return -1;
    return v < r->ref ? v : v - 1;
}

static const char *color_of(int slot) { return k_colors[slot % NCOLORS]; }

/* The marker of `slot` centred at (x, y). */
static void marker(FILE *f, int slot, double x, double y) {
    const char *c = color_of(slot);
    int hollow = (slot / NMARKERS) % 2; /* the 7th variant on: open shapes */
    char fill[40];
    snprintf(fill, sizeof fill, "fill='%s' stroke='%s'", hollow ? "white" : c, c);
    double s = 3.5;
    switch (slot % NMARKERS) {
    case 0:
        fprintf(f, "<circle cx='%.1f' cy='%.1f' r='%.1f' %s/>", x, y, s, fill);
        break;
    case 1:
        fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' %s/>", x - s,
                y - s, 2 * s, 2 * s, fill);
        break;
    case 2:
        fprintf(f, "<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f' %s/>", x,
                y - 1.2 * s, x - 1.1 * s, y + 0.8 * s, x + 1.1 * s, y + 0.8 * s, fill);
        break;
    case 3:
        fprintf(f, "<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f' %s/>", x,
                y - 1.3 * s, x + 1.3 * s, y, x, y + 1.3 * s, x - 1.3 * s, y, fill);
        break;
    case 4:
        fprintf(f, "<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f' %s/>", x,
                y + 1.2 * s, x - 1.1 * s, y - 0.8 * s, x + 1.1 * s, y - 0.8 * s, fill);
        break;
    default:
        fprintf(f, "<path d='M%.1f,%.1fL%.1f,%.1fM%.1f,%.1fL%.1f,%.1f' stroke='%s' "
                "stroke-width='2'/>", x - s, y - s, x + s, y + s, x - s, y + s, x + s,
                y - s, c);
        break;
    }
}

/* ------------------------------------------------------------------------ */
/* Plot frames                                                               */
/* ------------------------------------------------------------------------ */

/* Maps data to pixels inside [l, w - r] x [t, h - b]; log axes take and
 * give log10 of the data in x0..y1. */
typedef struct frame {
    int w, h, l, r, t, b;
    double x0, x1, y0, y1;
    int logx, logy;
} frame;

static double px(const frame *fr, double x) {
    double v = fr->logx ? log10(x) : x;
    return fr->l + (v - fr->x0) / (fr->x1 - fr->x0) * (fr->w - fr->l - fr->r);
}
static double py(const frame *fr, double y) {
    double v = fr->logy ? log10(y) : y;
    return fr->t + (1.0 - (v - fr->y0) / (fr->y1 - fr->y0)) * (fr->h - fr->t - fr->b);
}

static void svg_open(FILE *f, const char *cls, const frame *fr, const char *title,
                     const char *xl, const char *yl) {
    fprintf(f, "<svg class='%s' width='%d' height='%d' font-family='sans-serif' "
            "font-size='11'>\n", cls, fr->w, fr->h);
    fprintf(f, "<rect width='%d' height='%d' fill='white'/>\n", fr->w, fr->h);
    fprintf(f, "<text x='%d' y='16' font-size='13' font-weight='bold'>", fr->l);
    html_text(f, title);
    fprintf(f, "</text>\n<text x='%d' y='%d' text-anchor='middle'>",
            (fr->w - fr->r + fr->l) / 2, fr->h - 6);
    html_text(f, xl);
    fprintf(f, "</text>\n<text x='14' y='%d' text-anchor='middle' "
            "transform='rotate(-90 14 %d)'>", fr->h / 2, fr->h / 2);
    html_text(f, yl);
    fputs("</text>\n", f);
}

static void box(FILE *f, const frame *fr) {
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#444'/>\n",
            fr->l, fr->t, fr->w - fr->l - fr->r, fr->h - fr->t - fr->b);
}

/* "1e-3" style labels at every decade of a log axis (every other one when
 * there are more than 8). */
static void log_yticks(FILE *f, const frame *fr) {
    int n = (int)(floor(fr->y1) - ceil(fr->y0)) + 1, step = n > 8 ? 2 : 1;
    for (int e = (int)ceil(fr->y0); e <= (int)floor(fr->y1); e += step) {
        double y = py(fr, pow(10, e));
        fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/>"
                "<text x='%d' y='%.1f' text-anchor='end'>1e%d</text>\n",
                fr->l, fr->w - fr->r, y, y, fr->l - 4, y + 4, e);
    }
}

static void log_xticks(FILE *f, const frame *fr) {
    int n = (int)(floor(fr->x1) - ceil(fr->x0)) + 1, step = n > 6 ? 2 : 1;
    for (int e = (int)ceil(fr->x0); e <= (int)floor(fr->x1); e += step) {
        double x = px(fr, pow(10, e));
        fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' stroke='#ddd'/>"
                "<text x='%.1f' y='%d' text-anchor='middle'>1e%d</text>\n",
                x, x, fr->t, fr->h - fr->b, x, fr->h - fr->b + 14, e);
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
                px(fr, x), fr->h - fr->b + 14, x);
}

/* A legend entry at *y: line in the variant's dash, its marker, the name,
 * and the note on a line of its own; advances *y. */
static void legend(FILE *f, const frame *fr, int *yp, int slot, const char *name,
                   const char *note) {
    int x = fr->w - fr->r + 10, y = *yp;
    *yp += note ? 30 : 18;
    fprintf(f, "<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='%s' stroke-width='2'"
            " stroke-dasharray='%s'/>", x, x + 26, y - 4, y - 4, color_of(slot),
            k_dash[slot % NDASH]);
    marker(f, slot, x + 13, y - 4);
    fprintf(f, "<text x='%d' y='%d'>", x + 32, y);
    html_text(f, name);
    fputs("</text>\n", f);
    if (note) {
        fprintf(f, "<text x='%d' y='%d' fill='#555' font-size='10'>", x + 32, y + 12);
        html_text(f, note);
        fputs("</text>\n", f);
    }
}

/* ------------------------------------------------------------------------ */
/* Error against depth                                                       */
/* ------------------------------------------------------------------------ */

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

/* The first variant before v whose series equals v's at every x < upto
 * (-1). */
static int same_series(const xent_audit_result *r, int v, xent_audit_role lr,
                       xent_audit_role ex, int upto) {
    for (int u = 0; u < v; u++) {
        if (u == r->ref) continue;
        int same = 1;
        for (int x = 0; same && x < upto; x++) {
            double a = depth_value(r, u, lr, ex, x), b = depth_value(r, v, lr, ex, x);
            same = a == b || (isnan(a) && isnan(b));
        }
        if (same) return u;
    }
    return -1;
}

static void depth_plot(FILE *f, const xent_audit_result *r, int backward) {
    xent_audit_role lr = backward ? XA_BW_LAYER : XA_FW_LAYER;
    xent_audit_role ex = backward ? XA_DLOGITS : XA_LOGITS;
    int L = r->n_layers, nv = r->variants.n - 1;
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
    frame fr = {PW, PH, ML, MR, MT, MB, 0, L > 0 ? L : 1, floor(log10(lo)),
                ceil(log10(hi)), 0, 1};
    if (fr.y1 <= fr.y0) fr.y1 = fr.y0 + 1;
    svg_open(f, "depth", &fr, backward ? "Backward: gradient at each layer's input (x = L: dL/dlogits)"
                              : "Forward: each layer's output (x = L: the logits)",
             backward ? "layer (the backward pass runs from right to left)" : "layer",
             "relative RMS error, % (log)");
    box(f, &fr);
    log_yticks(f, &fr);
    layer_ticks(f, &fr, L);
    /* markers at every layer up to 40 layers, else every k-th */
    int every = L > 40 ? (L + 39) / 40 : 1;
    double spread = nv > 1 ? fmin(4.0, 14.0 / (nv - 1)) : 0; /* px between slots */
    int ly = fr.t + 12; /* the legend's next row */
    for (int v = 0; v < r->variants.n; v++) {
        int s = slot_of(r, v);
        if (s < 0) continue;
        double dx = (s - (nv - 1) / 2.0) * spread;
        fprintf(f, "<g><polyline fill='none' stroke='%s' stroke-width='1.5' "
                "stroke-dasharray='%s' points='", color_of(s), k_dash[s % NDASH]);
        for (int x = 0; x <= L; x++) {
            double y = depth_value(r, v, lr, ex, x);
            if (y > 0 && isfinite(y)) fprintf(f, "%.1f,%.1f ", px(&fr, x) + dx, py(&fr, y));
        }
        fputs("'/>\n", f);
        for (int x = 0; x <= L; x++) {
            double y = depth_value(r, v, lr, ex, x);
            if (y > 0 && isfinite(y) && (x % every == 0 || x == L))
                marker(f, s, px(&fr, x) + dx, py(&fr, y));
        }
        fputs("</g>\n", f);
        /* a series equal to an earlier one everywhere, or in every layer
         * (the fp32 head changes only the logits), says so */
        char note[XENT_AUDIT_NAME_MAX + 24];
        int u = same_series(r, v, lr, ex, L + 1), ul = -1;
        if (u >= 0) snprintf(note, sizeof note, "= %s everywhere", r->variants.v[u].name);
        else if (!backward && L > 0 && (ul = same_series(r, v, lr, ex, L)) >= 0)
            snprintf(note, sizeof note, "= %s in every layer", r->variants.v[ul].name);
        legend(f, &fr, &ly, s, r->variants.v[v].name, u >= 0 || ul >= 0 ? note : NULL);
    }
    fputs("</svg>\n", f);
}

/* ------------------------------------------------------------------------ */
/* Histograms of |delta log p|                                               */
/* ------------------------------------------------------------------------ */

#define HW 372
#define HH 210
#define BINS_PER_DECADE 5
#define MAX_DECADES 8

static const float *lp_of(const xent_audit_result *r, int v) {
    return r->logprob + (size_t)v * (size_t)r->n_targets;
}

/* The decades [e0, e1] that hold every non-zero |delta| of every variant
 * (at most MAX_DECADES, counted down from the largest). */
static void delta_range(const xent_audit_result *r, int *e0, int *e1) {
    const float *ref = lp_of(r, r->ref);
    double lo = INFINITY, hi = 0;
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        for (int64_t i = 0; i < r->n_targets; i++) {
            double d = fabs((double)lp_of(r, v)[i] - ref[i]);
            if (d > 0 && isfinite(d)) {
                lo = fmin(lo, d);
                hi = fmax(hi, d);
            }
        }
    }
    if (!(hi > 0)) lo = hi = 1e-3;
    *e1 = (int)ceil(log10(hi));
    if (pow(10, *e1) <= hi) (*e1)++;
    *e0 = (int)floor(log10(lo));
    if (*e1 - *e0 > MAX_DECADES) *e0 = *e1 - MAX_DECADES;
    if (*e1 <= *e0) *e1 = *e0 + 1;
}

static void histogram(FILE *f, const xent_audit_result *r, int v, int e0, int e1) {
    const float *ref = lp_of(r, r->ref), *lp = lp_of(r, v);
    int nb = (e1 - e0) * BINS_PER_DECADE;
    int64_t cnt[MAX_DECADES * BINS_PER_DECADE + 1] = {0}, zero = 0, bad = 0, below = 0;
    xent__ksum s2 = {0, 0};
    int64_t nfin = 0;
    for (int64_t i = 0; i < r->n_targets; i++) {
        double d = (double)lp[i] - ref[i];
        if (!isfinite(d)) { bad++; continue; }
        xent__ksum_add(&s2, d * d);
        nfin++;
        d = fabs(d);
        if (d == 0) { zero++; continue; }
        int b = (int)floor((log10(d) - e0) * BINS_PER_DECADE);
        if (b < 0) { b = 0; below++; }
        if (b >= nb) b = nb - 1;
        cnt[b]++;
    }
    int64_t cmax = zero;
    for (int b = 0; b < nb; b++) cmax = cnt[b] > cmax ? cnt[b] : cmax;
    if (cmax < 1) cmax = 1;
    double rms = nfin ? sqrt(xent__ksum_get(&s2) / (double)nfin) : NAN;
    int s = slot_of(r, v);
    char title[160], rb[32];
    fmt2(rb, sizeof rb, rms);
    snprintf(title, sizeof title, "%s: RMS %s nats", r->variants.v[v].name, rb);
    /* the zero bar sits left of the log axis */
    frame fr = {HW, HH, 84, 12, 26, 40, e0, e1, 0, (double)cmax, 1, 0};
    svg_open(f, "hist", &fr, title, "|variant - reference| log p of the target, nats (log)",
             "tokens");
    box(f, &fr);
    log_xticks(f, &fr);
    for (int k = 0; k <= 2; k++) {
        double c = cmax * k / 2.0, y = py(&fr, c);
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end'>%.0f</text>\n", 34, y + 4,
                floor(c + 0.5));
    }
    double y0 = py(&fr, 0);
    if (zero) {
        double y = py(&fr, (double)zero);
        fprintf(f, "<rect x='40' y='%.1f' width='14' height='%.1f' fill='%s' "
                "fill-opacity='0.45' stroke='%s'/>", y, y0 - y, color_of(s), color_of(s));
    }
    fprintf(f, "<text x='47' y='%d' text-anchor='middle'>0</text>\n", HH - 40 + 14);
    for (int b = 0; b < nb; b++) {
        if (!cnt[b]) continue;
        double xa = px(&fr, pow(10, e0 + (double)b / BINS_PER_DECADE));
        double xb = px(&fr, pow(10, e0 + (double)(b + 1) / BINS_PER_DECADE));
        double y = py(&fr, (double)cnt[b]);
        fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s' "
                "stroke='white' stroke-width='0.5'/>", xa, y, xb - xa, y0 - y, color_of(s));
    }
    if (rms > 0 && log10(rms) > e0 && log10(rms) < e1) {
        double x = px(&fr, rms);
        fprintf(f, "\n<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' stroke='#222' "
                "stroke-dasharray='4 3'/><text x='%.1f' y='%d' font-size='10'>RMS</text>",
                x, x, fr.t, HH - fr.b, x + 3, fr.t + 10);
    }
    fputc('\n', f);
    if (zero || bad || below) {
        fprintf(f, "<text x='%d' y='%d' font-size='10' fill='#444'>", fr.l + 4, fr.t + 24);
        fprintf(f, "%lld of %lld exactly equal", (long long)zero, (long long)r->n_targets);
        if (below) fprintf(f, "; %lld below 1e%d in the first bar", (long long)below, e0);
        if (bad) fprintf(f, "; %lld not finite", (long long)bad);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
}

/* ------------------------------------------------------------------------ */
/* The verdict                                                               */
/* ------------------------------------------------------------------------ */

static const char *budget_name(const xent_audit_verdict *vd) {
    return vd->budget < XENT_AUDIT_N_BUDGETS ? xent__audit_budgets[vd->budget].name
                                             : "over every budget";
}

/* "layer 3 output" style description of an entry; "-" for -1. */
static void entry_cell(FILE *f, const xent_audit_result *r, int v, int e,
                       double final_pct) {
    if (e < 0) {
        fputs("-", f);
        return;
    }
    char a[32], b[32];
    fmt2(a, sizeof a, 100.0 * r->m[(size_t)v * (size_t)r->n_entries + (size_t)e].rms_rel);
    fmt2(b, sizeof b, final_pct);
    fputs("<code>", f);
    html_text(f, r->entries[e].name);
    fprintf(f, "</code> (%s%% of %s%%)", a, b);
}

static void verdict(FILE *f, const xent_audit_result *r) {
    fputs("<h3 id=verdict>Verdict</h3>\n<table class=verdict>\n<tr><th>variant</th>"
          "<th>budget met</th><th>logits error, %</th><th>log p error, nats</th>"
          "<th>weight-gradient error, %</th><th>forward error enters at</th>"
          "<th>backward error enters at</th></tr>\n", f);
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        xent_audit_verdict vd;
        xent__audit_verdict(r, v, &vd);
        int s = slot_of(r, v);
        char a[32], b[32], c[32];
        fmt2(a, sizeof a, vd.logits_pct);
        fmt2(b, sizeof b, vd.logprob);
        fmt2(c, sizeof c, vd.grad_pct);
        fputs("<tr><td><svg class='mk' width='14' height='12'>", f);
        marker(f, s, 7, 6);
        fputs("</svg> ", f);
        html_text(f, r->variants.v[v].name);
        fprintf(f, "</td><td class='b%d'>%s</td><td class=n>%s</td><td class=n>%s</td>"
                "<td class=n>%s</td><td>", vd.budget, budget_name(&vd), a, b, c);
        entry_cell(f, r, v, vd.fw_entry, vd.fw_final_pct);
        fputs("</td><td>", f);
        entry_cell(f, r, v, vd.bw_entry, vd.bw_final_pct);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n<p class=verdict-text>", f);
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        xent_audit_verdict vd;
        xent__audit_verdict(r, v, &vd);
        fputs("<b>", f);
        html_text(f, r->variants.v[v].name);
        if (vd.budget < XENT_AUDIT_N_BUDGETS)
            fprintf(f, "</b> is within the <b>%s</b> budget (%s). ",
                    xent__audit_budgets[vd.budget].name, xent__audit_budgets[vd.budget].use);
        else fputs("</b> is <b>over every budget</b>. ", f);
    }
    fputs("</p>\n<table class=budgets><tr><th>budget</th><th>logits error &le;</th>"
          "<th>log p error &le;</th><th>weight-gradient error &le;</th><th>for</th></tr>\n", f);
    for (int b = 0; b < XENT_AUDIT_N_BUDGETS; b++) {
        const xent_audit_budget *bu = &xent__audit_budgets[b];
        fprintf(f, "<tr><td class='b%d'>%s</td><td class=n>%g %%</td><td class=n>%g nats</td>"
                "<td class=n>%g %%</td><td>%s</td></tr>\n", b, bu->name, bu->logits_pct,
                bu->logprob, bu->grad_pct, bu->use);
    }
    fputs("</table>\n<p class=note>A variant meets a budget when all three of its figures "
          "are within it (a model without linear weights is judged on the first two); a "
          "variant with a non-finite value in any tensor meets none.</p>\n", f);
}

static void definitions(FILE *f) {
    fputs("<h3>Definitions</h3>\n<dl class=defs>\n"
          "<dt>relative RMS error</dt><dd>The root mean square of (variant &minus; "
          "reference) over a tensor's elements, divided by the root mean square of the "
          "reference tensor (in the plots and tables as %).</dd>\n"
          "<dt>logits error</dt><dd>The relative RMS error of the logits, all positions "
          "and all vocabulary entries.</dd>\n"
          "<dt>log p error</dt><dd>The RMS over target tokens of the difference in the "
          "log-probability of the target token, in nats (0.01 nats is a 1% change of "
          "the probability).</dd>\n"
          "<dt>weight-gradient error</dt><dd>The median, over the linear layers' weight "
          "matrices (q, k, v, o, gate, up, down), of the relative RMS error of their "
          "gradient.</dd>\n"
          "<dt>error enters at</dt><dd>The first tensor along the pass (forward: "
          "embeddings, each layer's output, final norm, logits; backward: dL/dlogits, "
          "then the gradient at each layer's input from the last layer down) whose "
          "relative error exceeds half of the pass's last one.</dd>\n"
          "<dt>max abs</dt><dd>The largest |variant &minus; reference| over the "
          "tensor's elements.</dd>\n"
          "<dt>bias</dt><dd>The mean of (variant &minus; reference): a systematic shift "
          "rather than noise.</dd>\n"
          "<dt>corr, slope, resid</dt><dd>The correlation of variant with reference, "
          "the slope of the least-squares line through them, and the RMS left around "
          "that line.</dd>\n"
          "<dt>dead</dt><dd>Target tokens whose log-probability (or target gradient) is "
          "exactly 0 in the variant while the reference's is not.</dd>\n"
          "</dl>\n", f);
}

/* ------------------------------------------------------------------------ */
/* Worst tensors and tokens                                                  */
/* ------------------------------------------------------------------------ */

/* Sort key of a tensor: non-finite first, then by relative error. */
static double tensor_key(const xent_audit_metrics *m) {
    if (m->n_nonfinite) return INFINITY;
    return isfinite(m->rms_rel) ? m->rms_rel : -1;
}

static void worst_tensors(FILE *f, const xent_audit_result *r) {
    fprintf(f, "<h3>Worst tensors</h3>\n<p class=note>Per variant, the %d tensors with the "
            "largest relative RMS error.</p>\n<table class=worst-tensors>\n<tr><th>variant"
            "</th><th>tensor</th><th>relative RMS error, %%</th><th>max abs</th>"
            "<th>bias</th><th>corr</th><th>elements</th></tr>\n", TOP_TENSORS);
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        const xent_audit_metrics *m = r->m + (size_t)v * (size_t)r->n_entries;
        int pick[TOP_TENSORS], np = 0;
        for (int e = 0; e < r->n_entries; e++) {
            if (!(m[e].n > 0)) continue;
            double k = tensor_key(&m[e]);
            int at = np;
            while (at > 0 && tensor_key(&m[pick[at - 1]]) < k) at--;
            if (at >= TOP_TENSORS) continue;
            if (np < TOP_TENSORS) np++;
            for (int j = np - 1; j > at; j--) pick[j] = pick[j - 1];
            pick[at] = e;
        }
        for (int j = 0; j < np; j++) {
            const xent_audit_metrics *t = &m[pick[j]];
            char a[32], b[32], c[32], d[32];
            fmt2(a, sizeof a, 100.0 * t->rms_rel);
            fmt2(b, sizeof b, t->max_abs);
            fmt2(c, sizeof c, t->bias);
            if (isfinite(t->corr)) snprintf(d, sizeof d, "%.6f", t->corr);
            else snprintf(d, sizeof d, "-");
            fputs("<tr><td>", f);
            html_text(f, r->variants.v[v].name);
            fputs("</td><td><code>", f);
            html_text(f, r->entries[pick[j]].name);
            if (t->n_nonfinite)
                fprintf(f, "</code></td><td class=n>non-finite (%lld values)</td>",
                        (long long)t->n_nonfinite);
            else fprintf(f, "</code></td><td class=n>%s</td>", a);
            fprintf(f, "<td class=n>%s</td><td class=n>%s</td><td class=n>%s</td>"
                    "<td class=n>%lld</td></tr>\n", b, c, d, (long long)t->n);
        }
    }
    fputs("</table>\n", f);
}

static double token_key(const float *lp, const float *ref, int64_t i) {
    double d = (double)lp[i] - ref[i];
    if (!isfinite(d)) return INFINITY;
    return fabs(d);
}

/* One token's text cell, or its id alone. */
static void token_cell(FILE *f, const xent_audit_result *r, int64_t i) {
    const char *t = xent__audit_token_text(r, i);
    if (t) {
        fputs("<code class=tok>", f);
        html_token(f, t);
        fputs("</code>", f);
    } else {
        fprintf(f, "<code class=tok>#%d</code>", r->tokens[i]);
    }
}

static void worst_tokens(FILE *f, const xent_audit_result *r) {
    fprintf(f, "<h3>Worst tokens</h3>\n<p class=note>Per variant, the %d target tokens whose "
            "log-probability moved most from the reference's. Context: the %d tokens before "
            "the target; position: row:index of the target.%s</p>\n", TOP_TOKENS,
            CONTEXT_TOKENS, r->token_text ? "" : " The model has no tokenizer: tokens are "
            "shown as #id.");
    fputs("<table class=worst-tokens>\n<tr><th>variant</th><th>position</th><th>context</th>"
          "<th>target</th><th>id</th><th>reference log p</th><th>variant log p</th>"
          "<th>difference, nats</th></tr>\n", f);
    const float *ref = lp_of(r, r->ref);
    int64_t S1 = r->seq_len - 1;
    for (int v = 0; v < r->variants.n; v++) {
        if (v == r->ref) continue;
        const float *lp = lp_of(r, v);
        int64_t pick[TOP_TOKENS];
        int np = 0;
        for (int64_t i = 0; i < r->n_targets; i++) {
            double k = token_key(lp, ref, i);
            if (!(k > 0)) continue;
            int at = np;
            while (at > 0 && token_key(lp, ref, pick[at - 1]) < k) at--;
            if (at >= TOP_TOKENS) continue;
            if (np < TOP_TOKENS) np++;
            for (int j = np - 1; j > at; j--) pick[j] = pick[j - 1];
            pick[at] = i;
        }
        for (int j = 0; j < np; j++) {
            int64_t i = pick[j], b = S1 > 0 ? i / S1 : 0, s = S1 > 0 ? i % S1 : 0;
            int64_t tgt = b * r->seq_len + s + 1; /* the target token */
            fputs("<tr><td>", f);
            html_text(f, r->variants.v[v].name);
            fprintf(f, "</td><td class=n>%lld:%lld</td><td class=ctx>", (long long)b,
                    (long long)(s + 1));
            for (int64_t c = tgt - CONTEXT_TOKENS; c < tgt; c++)
                if (c >= b * r->seq_len) token_cell(f, r, c);
            fputs("</td><td>", f);
            token_cell(f, r, tgt);
            char a[32], bb[32], d[32];
            double diff = (double)lp[i] - ref[i];
            snprintf(a, sizeof a, "%.4f", (double)ref[i]);
            if (isfinite(lp[i])) snprintf(bb, sizeof bb, "%.4f", (double)lp[i]);
            else snprintf(bb, sizeof bb, "not finite");
            if (isfinite(diff)) snprintf(d, sizeof d, "%+.2g", diff);
            else snprintf(d, sizeof d, "-");
            fprintf(f, "</td><td class=n>%d</td><td class=n>%s</td><td class=n>%s</td>"
                    "<td class=n>%s</td></tr>\n", r->tokens[tgt], a, bb, d);
        }
    }
    fputs("</table>\n", f);
}

/* ------------------------------------------------------------------------ */
/* The page                                                                  */
/* ------------------------------------------------------------------------ */

static void write_head(FILE *f, const xent_audit_result *r) {
    fputs("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n"
          "<title>xent audit</title>\n<style>\n"
          "body{font-family:sans-serif;margin:16px 20px;max-width:1400px;color:#111}\n"
          "h2{margin:0 0 4px 0}h3{margin:14px 0 4px 0}\n"
          "table{border-collapse:collapse;font-size:12px;margin:2px 0}\n"
          "td,th{border:1px solid #ccc;padding:2px 8px}th{background:#f3f3f3}\n"
          "td.n{text-align:right;font-family:monospace}\n"
          ".note,.meta{font-size:12px;color:#555;margin:3px 0}\n"
          ".verdict-text{margin:4px 0;font-size:14px}\n"
          ".b0{background:#d8f0d8}.b1{background:#e6f2c8}.b2{background:#fbeccb}"
          ".b3{background:#f6d0cc}\n"
          "dl.defs{font-size:12px;margin:2px 0;display:grid;grid-template-columns:"
          "max-content auto;column-gap:10px;row-gap:1px}\n"
          "dl.defs dt{font-weight:bold}dl.defs dd{margin:0}\n"
          "code.tok{background:#eef;border:1px solid #ccd;padding:0 2px;margin:0 1px;"
          "white-space:pre}\ntd.ctx code.tok{background:#f6f6f6;color:#555}\n"
          ".hists svg,.plots svg{margin:4px 6px 4px 0}\n"
          "</style></head><body>\n<h2>xent audit</h2>\n", f);
    if (r->random_weights)
        fputs("<p style='background:#fff3cd;border:1px solid #e0b000;padding:4px 6px;"
              "margin:4px 0'><b>Random weights</b>: this model was not loaded from a "
              "checkpoint; its weights are drawn at random (--init random), so the numbers "
              "show the precision policies on these shapes, not on a trained model.</p>\n", f);
    fputs("<p class=meta>model: ", f);
    html_text_nodirs(f, r->model);
    fputs("; input: ", f);
    html_text_nodirs(f, r->input);
    fprintf(f, "; %lld x %lld = %lld tokens run, %lld targets; %d layers; reference: ",
            (long long)r->batch, (long long)r->seq_len, (long long)r->n_tokens,
            (long long)r->n_targets, r->n_layers);
    html_text(f, r->variants.v[r->ref].name);
    fprintf(f, "; variants' matrix products on the %s</p>\n",
            r->gemm_device == 2   ? "GPU (cuBLAS), the whole pass resident on the GPU"
            : r->gemm_device ? "GPU (cuBLAS)"
                             : "CPU (OpenBLAS)");
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
    verdict(f, r);
    definitions(f);
    fputs("<h3>Error against depth</h3>\n<div class=plots>\n", f);
    depth_plot(f, r, 0);
    depth_plot(f, r, 1);
    fputs("</div>\n<h3>Chosen-token log-probabilities: one histogram per variant</h3>\n"
          "<p class=note>How far each target token's log-probability moved from the "
          "reference's, on a shared log axis (the bar at 0: tokens that did not move); "
          "each panel has its own count scale.</p>\n<div class=hists>\n", f);
    int e0, e1;
    delta_range(r, &e0, &e1);
    for (int v = 0; v < r->variants.n; v++)
        if (v != r->ref) histogram(f, r, v, e0, e1);
    fputs("</div>\n", f);
    worst_tensors(f, r);
    worst_tokens(f, r);
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
