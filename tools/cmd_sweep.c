/* tools/cmd_sweep.c: `xent sweep`, the dead-zone table.
 *
 * For one row of V logits and a list of target margins m = z_t - lse_{j!=t},
 * prints the relative error of the NLL and of the target gradient of xent
 * and of CPU emulations of the common cross-entropy forms (src/audit/ce_forms.c)
 * against a long-double oracle on the same rounded input, "Z" where a form
 * returns exactly 0 (the oracle never does), the sum of the row gradient
 * (0 for an exact gradient; the dead-zone signature when it is not), and the
 * first margin at which each form returns exactly 0 next to the predicted
 * one (the rounding argument is in src/audit/ce_forms.c). */
#include "cli.h"
#include "input.h"
#include "audit/ce_forms.h"
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

static const char k_about[] =
    "Dead-zone table: relative error of the NLL and of the target gradient\n"
    "of xent and of common cross-entropy forms vs a long-double oracle, per\n"
    "target margin m = z_t - lse_{j!=t} (p_t = 1/(1+e^-m)); Z = exactly 0.\n"
    "Rows: z_t = --base, the others --scale*N(0,1) shifted so that\n"
    "lse_{j!=t} = base - m, then rounded to --dtype. A NaN in the table is a\n"
    "result (a form that fails there), not an error: the exit status is 0.\n\n";

static const char *const k_dtypes[] = {"bf16", "f16", "f32", NULL};

static int set_margins(void *dst, const char *v, const char *flag, const char *cmd) {
    sweep_args *a = dst;
    return xf_parse_f64_list(cmd, flag, v, a->margins, MAX_MARGINS, &a->nmargins);
}

static int set_bases(void *dst, const char *v, const char *flag, const char *cmd) {
    sweep_args *a = dst;
    return xf_parse_f64_list(cmd, flag, v, a->lse_bases, MAX_BASES, &a->nbases);
}

static int parse_args(int argc, char **argv, sweep_args *a) {
    static xf_flag fl[16];
    xf_flag t[] = {
        {"--vocab", XF_INT, &a->V, NULL, "columns per row", NULL, XF_MIN | XF_MAX, 2,
         (double)((int64_t)1 << 31), NULL, NULL, NULL, NULL, 0},
        {"--dtype", XF_DTYPE, &a->dtype, NULL, "input rounding of the logits", NULL, 0, 0, 0,
         k_dtypes, NULL, NULL, NULL, 0},
        {"--margin-min", XF_FLOAT, &a->mmin, "M", "smallest margin", NULL, 0, 0, 0, NULL, NULL,
         NULL, NULL, 0},
        {"--margin-max", XF_FLOAT, &a->mmax, "M", "largest margin", NULL, 0, 0, 0, NULL, NULL,
         NULL, NULL, 0},
        {"--step", XF_FLOAT, &a->step, "S",
         "margin step; 0 = the chosen points -10 -5 0 1 2 3 3.5 4\n5 5.5 5.6 6 6.2 6.3 7 8 8.3 "
         "8.4 10 12 14 16 16.6 16.7 18\n20 30 40 60 80 within [min, max]", NULL, XF_MIN, 0, 0,
         NULL, NULL, NULL, NULL, 0},
        {"--margins", XF_FUNC, a, "LIST", "comma-separated margins (overrides the above)", "none",
         0, 0, 0, NULL, NULL, set_margins, NULL, 0},
        {"--base", XF_FLOAT, &a->base, "B", "target logit z_t, sets the logit range", NULL, 0, 0,
         0, NULL, NULL, NULL, NULL, 0},
        {"--scale", XF_FLOAT, &a->scale, "S", "std of the non-target logits", NULL, XF_MIN, 0, 0,
         NULL, NULL, NULL, NULL, 0},
        {"--seed", XF_INT, &a->seed, NULL, "seed of the non-target logits", NULL, 0, 0, 0, NULL,
         NULL, NULL, NULL, 0},
        {"--lse-bases", XF_FUNC, a, "LIST",
         "extra --base values for the bf16_lse threshold, or\n'none'", "8,16,32,64", 0, 0, 0,
         NULL, NULL, set_bases, NULL, 0},
        {"--tol", XF_FLOAT, &a->tol, "T", "bisection tolerance of the thresholds, nats", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--json", XF_STRING, &a->json, "FILE", "also write the results as JSON ('-' = stdout)",
         NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0},
    };
    memcpy(fl, t, sizeof t);
    xf_cmd c = {"sweep", "xent sweep [options]", k_about, NULL, fl, (int)(sizeof t / sizeof t[0]),
                0, NULL, 0, 0, NULL, 0};
    int rc = xf_parse(&c, argc, argv);
    if (rc) return rc;
    if (!(a->mmin <= a->mmax)) {
        fprintf(stderr, "xent sweep: --margin-min %g is above --margin-max %g\n", a->mmin, a->mmax);
        return 2;
    }
    xent_cli_file outs[1] = {{"--json", a->json}};
    if (xent_cli_check_outputs("sweep", outs, 1, NULL, 0)) return 2;
    if (xf_find(&c, "--margins")->seen) return 0;
    a->nmargins = 0;
    if (a->step > 0) {
        for (int64_t k = 0; a->mmin + (double)k * a->step <= a->mmax + 1e-9; k++) {
            if (a->nmargins >= MAX_MARGINS) {
                fprintf(stderr, "xent sweep: --step %g gives more than %d margins: raise it\n",
                        a->step, MAX_MARGINS);
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
    if (a.nmargins == 0) {
        fprintf(stderr, "xent sweep: no margins in [--margin-min %g, --margin-max %g]\n", a.mmin,
                a.mmax);
        return 2;
    }

    xent__sweep_gen g;
    float *z = malloc((size_t)a.V * sizeof *z);         /* [V] */
    float *grad = malloc((size_t)a.V * sizeof *grad);   /* [V] */
    sweep_point *pts = calloc((size_t)a.nmargins, sizeof *pts); /* [n] */
    threshold th[16 + MAX_BASES];
    int nth = 0;
    rc = 1;
    if (!z || !grad || !pts ||
        xent__sweep_gen_init(&g, a.V, -1, a.dtype, a.scale, (uint64_t)a.seed)) {
        fprintf(stderr, "xent sweep: out of memory\n");
        goto done_nogen;
    }
    for (int i = 0; i < a.nmargins; i++) run_point(&g, a.base, a.margins[i], z, grad, &pts[i]);
    if (collect_thresholds(&g, &a, th, &nth)) {
        fprintf(stderr, "xent sweep: out of memory\n");
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
        /* a file is written whole or not at all (xent_file_create) */
        char *tmp = NULL;
        FILE *f = to_stdout_json ? stdout : xent_file_create(a.json, &tmp);
        if (!f) { fprintf(stderr, "xent sweep: --json: %s\n", xent_last_error()); goto done; }
        write_json(f, &a, &g, pts, a.nmargins, th, nth);
        if (to_stdout_json ? fflush(f) != 0
                           : xent_file_commit(f, tmp, a.json, !ferror(f)) != XENT_OK) {
            fprintf(stderr, "xent sweep: --json: %s\n",
                    to_stdout_json ? "cannot write to stdout" : xent_last_error());
            goto done;
        }
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
