/* src/audit/tables.c: the summary tables, as text cells shared by the
 * console and the HTML report. Every number keeps two significant figures:
 * a column gets as many decimals as its smallest non-zero value needs. */
#include "audit/audit.h"
#include "core/xent_math.h"

#include <stdlib.h>

int xent__audit_decimals_for(double v) {
    if (!isfinite(v) || v == 0) return 0;
    int d = 1 - (int)floor(log10(fabs(v)));
    /* a value that rounds up to the next decade (0.0996 -> "0.100") still
     * keeps two figures with d decimals */
    return d < 0 ? 0 : (d > 12 ? 12 : d);
}

int xent__audit_column_decimals(const double *v, int n) {
    int d = 0;
    for (int i = 0; i < n; i++) {
        int k = xent__audit_decimals_for(v[i]);
        if (k > d) d = k;
    }
    return d;
}

void xa_table_init(xa_table *t, const char *title, int ncol,
                   const char *const *hdr, int nrows) {
    memset(t, 0, sizeof *t);
    snprintf(t->title, sizeof t->title, "%s", title);
    t->ncol = ncol;
    t->nrows = nrows;
    for (int c = 0; c < ncol; c++)
        snprintf(t->hdr[c], sizeof t->hdr[c], "%s", hdr[c]);
}

void xa_table_text(xa_table *t, int row, int col, const char *s) {
    snprintf(t->cell[row][col], sizeof t->cell[row][col], "%s", s);
}

/* mode XA_SIG2: two significant figures; XA_DEV1: decimals chosen from
 * |1 - v| (correlations and slopes near 1); XA_INT: an integer. NaN: "-". */
void xa_table_column(xa_table *t, int col, const double *v, xa_mode mode) {
    double dev[XA_MAX_ROWS] = {0};
    int n = t->nrows;
    for (int i = 0; i < n; i++) dev[i] = mode == XA_DEV1 ? 1.0 - v[i] : v[i];
    int d = mode == XA_INT ? 0 : xent__audit_column_decimals(dev, n);
    if (mode == XA_DEV1 && d < 1) d = 1;
    for (int i = 0; i < n; i++) {
        char *c = t->cell[i][col];
        size_t cap = sizeof t->cell[i][col];
        if (isnan(v[i])) snprintf(c, cap, "-");
        else if (v[i] == 0 && mode != XA_DEV1) snprintf(c, cap, "0");
        else snprintf(c, cap, "%.*f", d, v[i]);
    }
}

/* 1 when every value of the column is "-". */
static int column_empty(const xa_table *t, int col) {
    for (int i = 0; i < t->nrows; i++)
        if (strcmp(t->cell[i][col], "-")) return 0;
    return 1;
}

void xa_table_drop_empty(xa_table *t, int first_col) {
    for (int c = t->ncol - 1; c >= first_col; c--) {
        if (!column_empty(t, c)) continue;
        for (int k = c; k + 1 < t->ncol; k++) {
            memcpy(t->hdr[k], t->hdr[k + 1], sizeof t->hdr[k]);
            t->left[k] = t->left[k + 1];
            for (int i = 0; i < t->nrows; i++)
                memcpy(t->cell[i][k], t->cell[i][k + 1], sizeof t->cell[i][k]);
        }
        t->ncol--;
    }
}

static void print_cell(FILE *f, const xa_table *t, int c, int w,
                       const char *s) {
    int last = c + 1 == t->ncol;
    if (c == 0 || t->left[c]) fprintf(f, "%s%-*s", c ? "  " : "", last ? 0 : w, s);
    else fprintf(f, "  %*s", w, s);
}

void xa_table_print(const xa_table *t, FILE *f) {
    int w[XA_MAX_COLS];
    for (int c = 0; c < t->ncol; c++) {
        w[c] = (int)strlen(t->hdr[c]);
        for (int i = 0; i < t->nrows; i++) {
            int l = (int)strlen(t->cell[i][c]);
            if (l > w[c]) w[c] = l;
        }
    }
    fprintf(f, "\n%s\n", t->title);
    for (int c = 0; c < t->ncol; c++) print_cell(f, t, c, w[c], t->hdr[c]);
    fputc('\n', f);
    for (int i = 0; i < t->nrows; i++) {
        for (int c = 0; c < t->ncol; c++) print_cell(f, t, c, w[c], t->cell[i][c]);
        fputc('\n', f);
    }
    if (t->note[0]) fprintf(f, "%s\n", t->note);
}

/* ------------------------------------------------------------------------ */

static void fill_names(xa_table *t, const xent_audit_result *r) {
    for (int v = 0; v < r->variants.n; v++) {
        char nm[XENT_AUDIT_NAME_MAX + 8];
        snprintf(nm, sizeof nm, "%s%s", r->variants.v[v].name,
                 v == r->ref ? " (ref)" : "");
        xa_table_text(t, v, 0, nm);
    }
}

/* Columns [1, 1 + k) from summary field `off` (fw/bw/grad/lp) per variant. */
typedef enum { F_FW, F_BW, F_GRAD, F_LP } field;

static double sfield(const xent_audit_summary *s, field f, int k) {
    switch (f) {
    case F_FW: return s->fw[k];
    case F_BW: return s->bw[k];
    case F_GRAD: return s->grad[k];
    default: return s->lp[k];
    }
}

static void fill_from_summary(xa_table *t, const xent_audit_result *r,
                              field f, int k, int col, xa_mode mode) {
    double v[XA_MAX_ROWS];
    for (int i = 0; i < r->variants.n; i++) {
        xent_audit_summary s;
        xent__audit_summarize(r, i, &s);
        v[i] = sfield(&s, f, k);
    }
    xa_table_column(t, col, v, mode);
}

void xa_build_fw(xa_table *t, const xent_audit_result *r) {
    static const char *const h[] = {"variant", "first", "mid median",
                                    "mid max", "logits", "last"};
    xa_table_init(t, "Forward: relative RMS error, % (layer outputs)", 6, h,
                  r->variants.n);
    fill_names(t, r);
    for (int k = 0; k < 5; k++) fill_from_summary(t, r, F_FW, k, k + 1, XA_SIG2);
}

void xa_build_bw(xa_table *t, const xent_audit_result *r) {
    static const char *const h[] = {"variant", "first", "logits",
                                    "mid median", "mid max", "last"};
    xa_table_init(t, "Backward: relative RMS error, % (gradients at layer "
                  "inputs; logits = dL/dlogits)", 6, h, r->variants.n);
    fill_names(t, r);
    for (int k = 0; k < 5; k++) fill_from_summary(t, r, F_BW, k, k + 1, XA_SIG2);
}

void xa_build_grad(xa_table *t, const xent_audit_result *r) {
    static const char *const h[] = {"variant", "LM head", "linear med",
                                    "linear max", "norm med", "norm max",
                                    "bias med", "bias max", "embeddings"};
    xa_table_init(t, "Parameter gradients: relative RMS error, %", 9, h,
                  r->variants.n);
    fill_names(t, r);
    for (int k = 0; k < 8; k++)
        fill_from_summary(t, r, F_GRAD, k, k + 1, XA_SIG2);
    xa_table_drop_empty(t, 1);
    if (r->tied_head)
        snprintf(t->note, sizeof t->note, "(the LM head is tied to the "
                 "embeddings: its gradient is part of 'embeddings')");
}

void xa_build_lp(xa_table *t, const xent_audit_result *r) {
    static const char *const h[] = {"variant", "RMS rel %", "bias rel %",
                                    "resid rel %", "corr", "slope",
                                    "max abs", "scale", "dead logp",
                                    "dead grad"};
    xa_table_init(t, "Chosen-token log-probabilities (nats; rel = / scale)",
                  10, h, r->variants.n);
    fill_names(t, r);
    fill_from_summary(t, r, F_LP, 0, 1, XA_SIG2);
    fill_from_summary(t, r, F_LP, 1, 2, XA_SIG2);
    fill_from_summary(t, r, F_LP, 2, 3, XA_SIG2);
    fill_from_summary(t, r, F_LP, 3, 4, XA_DEV1);
    fill_from_summary(t, r, F_LP, 4, 5, XA_DEV1);
    fill_from_summary(t, r, F_LP, 5, 6, XA_SIG2);
    fill_from_summary(t, r, F_LP, 6, 7, XA_SIG2);
    double dl[XA_MAX_ROWS], dg[XA_MAX_ROWS];
    for (int i = 0; i < r->variants.n; i++) {
        dl[i] = (double)r->dead_logprob[i];
        dg[i] = (double)r->dead_grad[i];
    }
    xa_table_column(t, 8, dl, XA_INT);
    xa_table_column(t, 9, dg, XA_INT);
    snprintf(t->note, sizeof t->note,
             "(dead = target tokens whose log p / target gradient is exactly 0"
             " while the reference's is not)");
}

void xa_build_variants(xa_table *t, const xent_audit_result *r) {
    static const char *const h[] = {"variant", "loss", "loss scale",
                                    "seconds", "policy"};
    xa_table_init(t, "Variants", 5, h, r->variants.n);
    t->left[4] = 1;
    fill_names(t, r);
    for (int i = 0; i < r->variants.n; i++) {
        char buf[XA_CELL];
        snprintf(buf, sizeof buf, "%.6f", r->loss[i]);
        xa_table_text(t, i, 1, buf);
        snprintf(buf, sizeof buf, "%g", r->loss_scale[i]);
        xa_table_text(t, i, 2, buf);
        snprintf(buf, sizeof buf, "%.1f", r->seconds[i]);
        xa_table_text(t, i, 3, buf);
        xent__audit_policy_str(&r->variants.v[i].p, buf, sizeof buf);
        xa_table_text(t, i, 4, buf);
    }
}

/* The tensor where the error enters, or "-". */
static void enters_cell(char *buf, size_t n, const xent_audit_result *r, int e) {
    if (e < 0) { snprintf(buf, n, "-"); return; }
    snprintf(buf, n, "%s", r->entries[e].name);
}

void xa_build_verdict(xa_table *t, const xent_audit_result *r) {
    static const char *const h[] = {"variant", "logits %", "log p RMS nats",
                                    "grad med %", "budget", "forward error enters",
                                    "backward error enters"};
    xa_table_init(t, "Verdict: the tightest budget each variant meets", 7, h,
                  r->variants.n);
    t->left[4] = t->left[5] = t->left[6] = 1;
    fill_names(t, r);
    double lg[XA_MAX_ROWS], lp[XA_MAX_ROWS], gr[XA_MAX_ROWS];
    for (int i = 0; i < r->variants.n; i++) {
        xent_audit_verdict vd;
        xent__audit_verdict(r, i, &vd);
        lg[i] = vd.logits_pct;
        lp[i] = vd.logprob;
        gr[i] = vd.grad_pct;
        char buf[XA_CELL];
        if (i == r->ref) snprintf(buf, sizeof buf, "reference");
        else if (vd.budget < XENT_AUDIT_N_BUDGETS)
            snprintf(buf, sizeof buf, "%s", xent__audit_budgets[vd.budget].name);
        else snprintf(buf, sizeof buf, "over every budget");
        xa_table_text(t, i, 4, buf);
        enters_cell(buf, sizeof buf, r, vd.fw_entry);
        xa_table_text(t, i, 5, buf);
        enters_cell(buf, sizeof buf, r, vd.bw_entry);
        xa_table_text(t, i, 6, buf);
    }
    xa_table_column(t, 1, lg, XA_SIG2);
    xa_table_column(t, 2, lp, XA_SIG2);
    xa_table_column(t, 3, gr, XA_SIG2);
    const xent_audit_budget *b = xent__audit_budgets;
    char note[600];
    snprintf(note, sizeof note,
             "(budgets, logits %% / log p nats / grad %%: %.8s %g/%g/%g, %.8s %g/%g/%g, "
             "%.8s %g/%g/%g; docs/audit.md, \"Verdict\")",
             b[0].name, b[0].logits_pct, b[0].logprob, b[0].grad_pct, b[1].name,
             b[1].logits_pct, b[1].logprob, b[1].grad_pct, b[2].name, b[2].logits_pct,
             b[2].logprob, b[2].grad_pct);
    snprintf(t->note, sizeof t->note, "%.199s", note);
}

/* Variants with non-finite values in some tensor. */
static void print_nonfinite(const xent_audit_result *r, FILE *f) {
    for (int v = 0; v < r->variants.n; v++) {
        int64_t bad = 0;
        const char *first = NULL;
        for (int e = 0; e < r->n_entries; e++) {
            const xent_audit_metrics *m =
                &r->m[(size_t)v * (size_t)r->n_entries + (size_t)e];
            if (m->n_nonfinite) {
                bad += m->n_nonfinite;
                if (!first) first = r->entries[e].name;
            }
        }
        if (bad)
            fprintf(f, "warning: variant %s has %lld non-finite values (first "
                    "in %s): their metrics are NaN (shown '-')\n",
                    r->variants.v[v].name, (long long)bad, first);
    }
}

void xent__audit_print_tables(const xent_audit_result *r, FILE *f) {
    xa_table *t = malloc(sizeof *t);
    if (!t) return;
    if (r->random_weights)
        fprintf(f, "RANDOM WEIGHTS (--init random): not a trained model; the errors below "
                "are those of these shapes with random weights\n");
    fprintf(f, "xent audit: %s\ninput: %s; %lld x %lld = %lld tokens run, "
            "%lld targets; %d layers; variants' matrix products on the %s\n",
            r->model, r->input, (long long)r->batch, (long long)r->seq_len,
            (long long)r->n_tokens, (long long)r->n_targets, r->n_layers,
            r->gemm_device == 2   ? "GPU (cuBLAS), the whole pass resident on the GPU"
            : r->gemm_device ? "GPU (cuBLAS)"
                             : "CPU (OpenBLAS)");
    xa_build_variants(t, r);
    xa_table_print(t, f);
    xa_build_fw(t, r);
    xa_table_print(t, f);
    xa_build_bw(t, r);
    xa_table_print(t, f);
    xa_build_grad(t, r);
    xa_table_print(t, f);
    xa_build_lp(t, r);
    xa_table_print(t, f);
    xa_build_verdict(t, r);
    xa_table_print(t, f);
    print_nonfinite(r, f);
    free(t);
}
