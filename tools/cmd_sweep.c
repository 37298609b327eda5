/* tools/cmd_sweep.c: `xent sweep`, the dead-zone table.
 *
 * For one row of V logits and a list of target margins m = z_t - lse_{j!=t},
 * prints the relative error of the NLL and of the target gradient of xent
 * and of CPU emulations of the common cross-entropy forms (src/cpu/ce_forms.c)
 * against a long-double oracle on the same rounded input, "Z" where a form
 * returns exactly 0 (the oracle never does), the sum of the row gradient
 * (0 for an exact gradient; the dead-zone signature when it is not), and the
 * first margin at which each form returns exactly 0 next to the predicted
 * one (the rounding argument is in src/cpu/ce_forms.c). */
#include "cli.h"
#include "cpu/ce_forms.h"
#include "xent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MARGINS 4096
#define MAX_BASES 16

static const double k_default_margins[] = {
    -10, -5, 0, 1, 2, 3, 3.5, 4, 5, 5.5, 5.6, 6, 6.2, 6.3, 7,
    8, 8.3, 8.4, 10, 12, 14, 16, 16.6, 16.7, 18, 20, 30, 40, 60, 80};

typedef struct {
    int64_t V, seed;
    xent_dtype dtype;
    double mmin, mmax, step, base, scale, tol;
    double margins[MAX_MARGINS];
    int nmargins;
    double lse_bases[MAX_BASES];
    int nbases;
    const char *json;
} sweep_args;

static void usage(FILE *f) {
    fprintf(f,
        "usage: xent sweep [options]\n"
        "  Dead-zone table: relative error of the NLL and of the target gradient\n"
        "  of xent and of common cross-entropy forms vs a long-double oracle, per\n"
        "  target margin m = z_t - lse_{j!=t} (p_t = 1/(1+e^-m)); Z = exactly 0.\n"
        "  Rows: z_t = --base, the others --scale*N(0,1) shifted so that\n"
        "  lse_{j!=t} = base - m, then rounded to --dtype.\n\n"
        "options:\n"
        "  --vocab N          columns per row (default 128256)\n"
        "  --dtype T          input rounding of the logits: bf16, f16, f32 (default bf16)\n"
        "  --margin-min M     smallest margin (default -10)\n"
        "  --margin-max M     largest margin (default 80)\n"
        "  --step S           margin step; 0 = the chosen points -10 -5 0 1 2 3 3.5 4\n"
        "                     5 5.5 5.6 6 6.2 6.3 7 8 8.3 8.4 10 12 14 16 16.6 16.7 18\n"
        "                     20 30 40 60 80 within [min, max] (default 0)\n"
        "  --margins LIST     comma-separated margins (overrides the above; default none)\n"
        "  --base B           target logit z_t, sets the logit range (default 0)\n"
        "  --scale S          std of the non-target logits (default 1)\n"
        "  --seed N           seed of the non-target logits (default 1)\n"
        "  --lse-bases LIST   extra --base values for the bf16_lse threshold, or\n"
        "                     'none' (default 8,16,32,64)\n"
        "  --tol T            bisection tolerance of the thresholds, nats (default 1e-4)\n"
        "  --json FILE        also write the results as JSON ('-' = stdout; default none)\n"
        "  -h, --help         this help\n");
}

static int parse_list(const char *flag, const char *s, double *out, int max, int *n) {
    *n = 0;
    if (!strcmp(s, "none") || !*s) return 0;
    char *buf = strdup(s), *save = NULL;
    if (!buf) return 1;
    int rc = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n >= max) { fprintf(stderr, "xent: %s has more than %d values\n", flag, max); rc = 1; break; }
        if (xent_cli_parse_f64(flag, tok, &out[*n])) { rc = 1; break; }
        (*n)++;
    }
    free(buf);
    return rc;
}

static int known_flag(const char *f) {
    static const char *const k[] = {"--vocab", "--seed", "--margin-min", "--margin-max", "--step", "--base", "--scale", "--tol", "--json", "--margins", "--lse-bases", "--dtype"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(f, k[i])) return 1;
    return 0;
}

static int parse_args(int argc, char **argv, sweep_args *a) {
    const char *v;
    int explicit_list = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return -1; }
        if (!known_flag(f)) {
            fprintf(stderr, "xent: %s: unknown flag '%s' (see xent %s --help)\n", argv[0], f, argv[0]);
            return 2;
        }
        if (!(v = xent_cli_value(argc, argv, &i))) return 2;
        int bad;
        if (!strcmp(f, "--vocab")) bad = xent_cli_parse_i64(f, v, &a->V);
        else if (!strcmp(f, "--seed")) bad = xent_cli_parse_i64(f, v, &a->seed);
        else if (!strcmp(f, "--margin-min")) bad = xent_cli_parse_f64(f, v, &a->mmin);
        else if (!strcmp(f, "--margin-max")) bad = xent_cli_parse_f64(f, v, &a->mmax);
        else if (!strcmp(f, "--step")) bad = xent_cli_parse_f64(f, v, &a->step);
        else if (!strcmp(f, "--base")) bad = xent_cli_parse_f64(f, v, &a->base);
        else if (!strcmp(f, "--scale")) bad = xent_cli_parse_f64(f, v, &a->scale);
        else if (!strcmp(f, "--tol")) bad = xent_cli_parse_f64(f, v, &a->tol);
        else if (!strcmp(f, "--json")) { a->json = v; bad = 0; }
        else if (!strcmp(f, "--margins")) {
            bad = parse_list(f, v, a->margins, MAX_MARGINS, &a->nmargins);
            explicit_list = 1;
        } else if (!strcmp(f, "--lse-bases"))
            bad = parse_list(f, v, a->lse_bases, MAX_BASES, &a->nbases);
        else if (!strcmp(f, "--dtype")) {
            bad = xent_dtype_parse(v, &a->dtype) != XENT_OK ||
                  (a->dtype != XENT_F32 && a->dtype != XENT_BF16 && a->dtype != XENT_F16);
            if (bad) fprintf(stderr, "xent: --dtype expects bf16, f16 or f32, got '%s'\n", v);
        } else {
            fprintf(stderr, "xent: sweep: unknown flag '%s' (see xent sweep --help)\n", f);
            return 2;
        }
        if (bad) return 2;
    }
    if (a->V < 2 || a->V > ((int64_t)1 << 31)) {
        fprintf(stderr, "xent: --vocab = %lld is outside [2, 2^31]\n", (long long)a->V);
        return 2;
    }
    if (!(a->scale >= 0) || !isfinite(a->scale) || !isfinite(a->base) || !(a->tol > 0)) {
        fprintf(stderr, "xent: --scale must be >= 0, --base finite, --tol > 0\n");
        return 2;
    }
    if (!(a->mmin <= a->mmax) || !isfinite(a->mmin) || !isfinite(a->mmax) || a->step < 0) {
        fprintf(stderr, "xent: need finite --margin-min <= --margin-max and --step >= 0\n");
        return 2;
    }
    if (explicit_list) return 0;
    a->nmargins = 0;
    if (a->step > 0) {
        for (int64_t k = 0; a->mmin + (double)k * a->step <= a->mmax + 1e-9; k++) {
            if (a->nmargins >= MAX_MARGINS) {
                fprintf(stderr, "xent: more than %d margins: raise --step\n", MAX_MARGINS);
                return 2;
            }
            a->margins[a->nmargins++] = a->mmin + (double)k * a->step;
        }
    } else {
        for (size_t k = 0; k < sizeof k_default_margins / sizeof *k_default_margins; k++)
            if (k_default_margins[k] >= a->mmin && k_default_margins[k] <= a->mmax)
                a->margins[a->nmargins++] = k_default_margins[k];
    }
    return 0;
}

/* ---- one margin --------------------------------------------------------- */

typedef struct {
    float nll, grad_t;
    long double grad_sum; /* sum_j grad_j                                     */
    double nll_err, grad_err; /* relative errors vs the oracle                */
} form_result;

typedef struct {
    double margin;            /* nominal                                      */
    xent__ce_oracle oracle;   /* on the rounded row                           */
    form_result f[XENT_CE_FORM_COUNT];
} sweep_point;

static double rel_err(float v, long double ref) {
    if (v != v) return NAN;
    return (double)(fabsl((long double)v - ref) / fabsl(ref));
}

static void run_point(const xent__sweep_gen *g, double base, double m,
                      float *z /* [V] */, float *grad /* [V] */, sweep_point *p) {
    xent__sweep_row(g, base, m, z);
    p->margin = m;
    xent__ce_oracle_row(z, g->V, g->t, &p->oracle);
    for (int f = 0; f < XENT_CE_FORM_COUNT; f++) {
        form_result *r = &p->f[f];
        xent__ce_form_row((xent_ce_form)f, z, g->V, g->t, &r->nll, grad);
        r->grad_t = grad[g->t];
        r->grad_sum = 0;
        for (int64_t j = 0; j < g->V; j++) r->grad_sum += grad[j];
        r->nll_err = rel_err(r->nll, p->oracle.nll);
        r->grad_err = rel_err(r->grad_t, p->oracle.grad_t);
    }
}

/* "Z" for an exact 0 (the oracle is never 0), else the error, 1 digit. */
static void fmt_err(char *buf, size_t n, float v, double err) {
    if (v == 0.0f) { snprintf(buf, n, "Z"); return; }
    if (err != err) { snprintf(buf, n, "nan"); return; }
    if (err == 0) { snprintf(buf, n, "0"); return; }
    char t[32];
    snprintf(t, sizeof t, "%.0e", err);            /* "3e-03"                 */
    char *e = strchr(t, 'e');
    if (e && (e[1] == '-' || e[1] == '+') && e[2] == '0' && e[3])
        memmove(e + 2, e + 3, strlen(e + 3) + 1);  /* "3e-3"                  */
    if (e && e[1] == '+') memmove(e + 1, e + 2, strlen(e + 2) + 1);
    snprintf(buf, n, "%s", t);
}

static const char *short_name(int f) {
    return f == XENT_CE_BF16_LOGSOFTMAX ? "bf16_lsm" : xent__ce_form_name((xent_ce_form)f);
}

static void print_table(const sweep_args *a, const sweep_point *pts, int n) {
    printf("%6s", "margin");
    for (int f = 0; f < XENT_CE_FORM_COUNT; f++) printf(" %-11s", short_name(f));
    printf(" %10s %10s\n", "sum(g)fp32", "sum(g)xent");
    for (int i = 0; i < n; i++) {
        const sweep_point *p = &pts[i];
        printf("%6g", p->margin);
        for (int f = 0; f < XENT_CE_FORM_COUNT; f++) {
            char c1[32], c2[32], cell[80];
            fmt_err(c1, sizeof c1, p->f[f].nll, p->f[f].nll_err);
            fmt_err(c2, sizeof c2, p->f[f].grad_t, p->f[f].grad_err);
            snprintf(cell, sizeof cell, "%s/%s", c1, c2);
            printf(" %-11s", cell);
        }
        printf(" %+10.1Le %+10.1Le\n", p->f[XENT_CE_FP32_NAIVE].grad_sum,
               p->f[XENT_CE_EXACT].grad_sum);
    }
    (void)a;
}

/* ---- thresholds --------------------------------------------------------- */

typedef struct {
    int form, which;
    double base;
    float zt;
    int found;            /* 1 measured, 0 never (or at the lowest margin)   */
    double measured, actual, predicted;
} threshold;

static void fmt_m(char *buf, size_t n, double m) {
    if (isinf(m)) { snprintf(buf, n, "never"); return; }
    double q = 1.0 - 1.0 / (1.0 + exp(-m)); /* 1 - p_t */
    if (q < 1e-4) snprintf(buf, n, "%8.4f (p=1-%.2g)", m, q);
    else snprintf(buf, n, "%8.4f (p=%.6f)", m, 1.0 - q);
}

static int measure(const xent__sweep_gen *g, const sweep_args *a, int form,
                   int which, double base, threshold *th) {
    th->form = form;
    th->which = which;
    th->base = base;
    /* z_t as the rows hold it: base rounded to the input dtype */
    th->zt = g->dtype == XENT_BF16 ? xent_bf16_to_f32(xent_f64_to_bf16(base))
           : g->dtype == XENT_F16 ? xent_f16_to_f32(xent_f64_to_f16(base)) : (float)base;
    double lo = a->margins[0] < a->mmin ? a->margins[0] : a->mmin;
    double hi = a->mmax > 80 ? a->mmax : 80;
    int rc = xent__ce_form_threshold(g, (xent_ce_form)form, which, base, lo, hi,
                                     a->tol, &th->measured, &th->actual);
    if (rc < 0) return -1;
    th->found = rc;
    th->predicted = xent__ce_form_predicted((xent_ce_form)form, which, th->zt);
    return 0;
}

static int collect_thresholds(const xent__sweep_gen *g, const sweep_args *a,
                              threshold *th, int *n) {
    static const struct { int form, which; } k_list[] = {
        {XENT_CE_EXACT, XENT__OUT_NLL},        {XENT_CE_EXACT, XENT__OUT_GRAD},
        {XENT_CE_FP32_NAIVE, XENT__OUT_NLL},   {XENT_CE_FP32_NAIVE, XENT__OUT_GRAD},
        {XENT_CE_BF16_LSE, XENT__OUT_NLL},     {XENT_CE_BF16_LSE, XENT__OUT_GRAD},
        {XENT_CE_BF16_PROBS, XENT__OUT_GRAD},  {XENT_CE_F16_PROBS, XENT__OUT_GRAD},
        {XENT_CE_BF16_LOGSOFTMAX, XENT__OUT_NLL}, {XENT_CE_BF16_LOGSOFTMAX, XENT__OUT_GRAD},
    };
    *n = 0;
    for (size_t k = 0; k < sizeof k_list / sizeof *k_list; k++)
        if (measure(g, a, k_list[k].form, k_list[k].which, a->base, &th[(*n)++])) return -1;
    for (int b = 0; b < a->nbases; b++)
        if (measure(g, a, XENT_CE_BF16_LSE, XENT__OUT_NLL, a->lse_bases[b], &th[(*n)++]))
            return -1;
    return 0;
}

static void print_thresholds(const threshold *th, int n) {
    printf("\nfirst margin where each form returns exactly 0 (bisection; the measured\n"
           "margin is the rounded row's; p = p_t); predicted from the roundings\n");
    printf("%-15s %-4s %6s  %-28s %-28s\n", "form", "out", "z_t", "measured", "predicted");
    for (int i = 0; i < n; i++) {
        char c1[64], c2[64];
        if (th[i].found) fmt_m(c1, sizeof c1, th[i].actual);
        else if (isinf(th[i].measured)) snprintf(c1, sizeof c1, "never");
        else snprintf(c1, sizeof c1, "already 0 at %g", th[i].measured);
        fmt_m(c2, sizeof c2, th[i].predicted);
        printf("%-15s %-4s %6g  %-28s %-28s\n", xent__ce_form_name((xent_ce_form)th[i].form),
               th[i].which == XENT__OUT_GRAD ? "grad" : "nll", (double)th[i].zt, c1, c2);
    }
}

/* ---- JSON ------------------------------------------------------------------ */

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fprintf(f, "null");
}

static void write_json(FILE *f, const sweep_args *a, const xent__sweep_gen *g,
                       const sweep_point *pts, int n, const threshold *th, int nth) {
    fprintf(f, "{\"vocab\": %lld, \"target\": %lld, \"dtype\": \"%s\", \"base\": ",
            (long long)a->V, (long long)g->t, xent_dtype_name(a->dtype));
    json_num(f, a->base);
    fprintf(f, ", \"scale\": ");
    json_num(f, a->scale);
    fprintf(f, ", \"seed\": %lld,\n \"points\": [\n", (long long)a->seed);
    for (int i = 0; i < n; i++) {
        const sweep_point *p = &pts[i];
        fprintf(f, "  {\"margin\": ");
        json_num(f, p->margin);
        fprintf(f, ", \"margin_actual\": ");
        json_num(f, (double)p->oracle.margin);
        fprintf(f, ", \"oracle\": {\"nll\": %.17Lg, \"grad_target\": %.17Lg}, \"forms\": {",
                p->oracle.nll, p->oracle.grad_t);
        for (int k = 0; k < XENT_CE_FORM_COUNT; k++) {
            const form_result *r = &p->f[k];
            fprintf(f, "%s\n    \"%s\": {\"nll\": ", k ? "," : "", xent__ce_form_name((xent_ce_form)k));
            json_num(f, r->nll);
            fprintf(f, ", \"grad_target\": ");
            json_num(f, r->grad_t);
            fprintf(f, ", \"nll_rel_err\": ");
            json_num(f, r->nll_err);
            fprintf(f, ", \"grad_rel_err\": ");
            json_num(f, r->grad_err);
            fprintf(f, ", \"nll_zero\": %s, \"grad_zero\": %s, \"grad_row_sum\": ",
                    r->nll == 0.0f ? "true" : "false", r->grad_t == 0.0f ? "true" : "false");
            json_num(f, (double)r->grad_sum);
            fprintf(f, "}");
        }
        fprintf(f, "}}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, " ],\n \"thresholds\": [\n");
    for (int i = 0; i < nth; i++) {
        fprintf(f, "  {\"form\": \"%s\", \"output\": \"%s\", \"target_logit\": ",
                xent__ce_form_name((xent_ce_form)th[i].form),
                th[i].which == XENT__OUT_GRAD ? "grad" : "nll");
        json_num(f, th[i].zt);
        fprintf(f, ", \"measured_margin\": ");
        json_num(f, th[i].found ? th[i].actual : (isinf(th[i].measured) ? NAN : th[i].measured));
        fprintf(f, ", \"predicted_margin\": ");
        json_num(f, th[i].predicted);
        fprintf(f, "}%s\n", i + 1 < nth ? "," : "");
    }
    fprintf(f, " ]}\n");
}

/* ---- main ------------------------------------------------------------------ */

static int cmd_sweep(int argc, char **argv) {
    static sweep_args a;
    memset(&a, 0, sizeof a);
    a.V = 128256;
    a.seed = 1;
    a.dtype = XENT_BF16;
    a.mmin = -10;
    a.mmax = 80;
    a.scale = 1;
    a.tol = 1e-4;
    a.nbases = 4;
    a.lse_bases[0] = 8, a.lse_bases[1] = 16, a.lse_bases[2] = 32, a.lse_bases[3] = 64;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    if (a.nmargins == 0) { fprintf(stderr, "xent: no margins in the range\n"); return 2; }

    xent__sweep_gen g;
    float *z = malloc((size_t)a.V * sizeof *z);         /* [V] */
    float *grad = malloc((size_t)a.V * sizeof *grad);   /* [V] */
    sweep_point *pts = calloc((size_t)a.nmargins, sizeof *pts); /* [n] */
    threshold th[16 + MAX_BASES];
    int nth = 0;
    rc = 1;
    if (!z || !grad || !pts ||
        xent__sweep_gen_init(&g, a.V, -1, a.dtype, a.scale, (uint64_t)a.seed)) {
        fprintf(stderr, "xent: sweep: out of memory\n");
        goto done_nogen;
    }
    for (int i = 0; i < a.nmargins; i++) run_point(&g, a.base, a.margins[i], z, grad, &pts[i]);
    if (collect_thresholds(&g, &a, th, &nth)) {
        fprintf(stderr, "xent: sweep: out of memory\n");
        goto done;
    }
    int to_stdout_json = a.json && !strcmp(a.json, "-");
    if (!to_stdout_json) {
        printf("xent sweep: V = %lld, %s logits, z_t = %g, others %g*N(0,1) shifted to\n"
               "lse_{j!=t} = z_t - m (seed %lld). Relative error of NLL / target grad vs\n"
               "a long-double oracle on the same input; Z = exactly 0. bf16_lsm =\n"
               "bf16_logsoftmax; sum(g) = sum of the row gradient (exact: 0).\n",
               (long long)a.V, xent_dtype_name(a.dtype), a.base, a.scale, (long long)a.seed);
        print_table(&a, pts, a.nmargins);
        print_thresholds(th, nth);
    }
    if (a.json) {
        FILE *f = to_stdout_json ? stdout : fopen(a.json, "w");
        if (!f) { fprintf(stderr, "xent: cannot write %s\n", a.json); goto done; }
        write_json(f, &a, &g, pts, a.nmargins, th, nth);
        if (!to_stdout_json && fclose(f)) { fprintf(stderr, "xent: cannot write %s\n", a.json); goto done; }
    }
    rc = 0;
done:
    xent__sweep_gen_free(&g);
done_nogen:
    free(z);
    free(grad);
    free(pts);
    return rc;
}

XENT_COMMAND(sweep, "dead-zone table: error of common CE forms vs margin", cmd_sweep)
