/* src/compare/stats.c: checks and statistics of delta = A - B for
 * `xent compare`. Definitions and the decomposition: docs/compare.md. */
#include "compare/compare.h"

#include <stdlib.h>
#include <string.h>

const double xent__cmp_qlevels[XENT__CMP_NQ] = {0.5, 0.9, 0.99, 0.999};

/* Units of the bootstrap: at most this many (sequences or token blocks). */
#define XENT__CMP_MAX_UNITS 65536

void xent__cmp_opts_default(xent__cmp_opts *o) {
    /* the RL losses' defaults (xent_rl_loss_opts_init), so that `xent rl`
     * and `xent compare` agree on the clip range, the clamp and what a
     * zero-filled dump is (docs/rl.md, "Defaults") */
    xent_rl_loss_opts rl;
    xent_rl_loss_opts_init(&rl);
    o->eps = rl.eps_low;
    o->eps_high = rl.eps_high;
    o->clamp = rl.log_ratio_clamp;
    o->zero_run = rl.zero_run_limit;
    o->exclude_bad = 0;
    o->seed = 0;
    o->bootstrap = 1000;
    o->top = 10;
    o->threads = 0;
    /* TIS cap: libxent's tis_cap (2, verl's rollout_is_threshold); MIS cap:
     * TRL's vllm_importance_sampling_cap (3, its default mode sequence_mask);
     * ICEPOP band: OpenRLHF's vllm_is_truncated_threshold [0.5, 5]. */
    o->tis_cap = rl.tis_cap;
    o->mis_cap = 3.0;
    o->icepop_lo = 0.5;
    o->icepop_hi = 5.0;
}

void xent__cmp_result_free(xent__cmp_result *r) {
    if (!r) return;
    free(r->top);
    free(r->clamp_idx);
    free(r->clamp_sum);
    free(r->topseq);
    free((void *)r->use);
    memset(r, 0, sizeof *r);
}

/* ---- bad values ---------------------------------------------------------- */

static void mark_first(int64_t *first, int64_t i) {
    if (*first < 0) *first = i;
}

/* Closes a run of zeros [start .. end) (flat positions, selected tokens
 * only) of length len. */
static void close_run(const double *v, const uint8_t *mask, int64_t start,
                      int64_t end, int64_t len, int64_t zero_run,
                      xent__cmp_bad *out, uint8_t *bad_mask) {
    if (len < zero_run) return;
    out->zero_run += len;
    mark_first(&out->first_zero_run, start);
    if (!bad_mask) return;
    for (int64_t i = start; i < end; i++)
        if ((!mask || mask[i]) && v[i] == 0) bad_mask[i] = 1;
}

void xent__cmp_scan_bad(const double *v, int64_t n, const uint8_t *mask,
                        int64_t zero_run, xent__cmp_bad *out,
                        uint8_t *bad_mask) {
    memset(out, 0, sizeof *out);
    out->first_positive = out->first_nan = out->first_inf = out->first_zero_run = -1;
    int64_t run_start = -1, run_len = 0;
    for (int64_t i = 0; i < n; i++) {
        if (mask && !mask[i]) continue;
        double x = v[i];
        if (x == 0) {
            if (run_len++ == 0) run_start = i;
            continue;
        }
        if (run_len) close_run(v, mask, run_start, i, run_len, zero_run, out, bad_mask);
        run_len = 0;
        int bad = 1;
        if (x != x) { out->nan++; mark_first(&out->first_nan, i); }
        else if (isinf(x)) { out->inf++; mark_first(&out->first_inf, i); }
        else if (x > 0) { out->positive++; mark_first(&out->first_positive, i); }
        else bad = 0;
        if (bad && bad_mask) bad_mask[i] = 1;
    }
    if (run_len) close_run(v, mask, run_start, n, run_len, zero_run, out, bad_mask);
}

static int64_t bad_total(const xent__cmp_bad *b) {
    return b->positive + b->nan + b->inf + b->zero_run;
}

/* ---- quantiles by selection ---------------------------------------------- */

static void swap_d(double *x, int64_t i, int64_t j) {
    double t = x[i];
    x[i] = x[j];
    x[j] = t;
}

/* Reorders x[lo..hi] so that x[k] is the k-th smallest, smaller ones before
 * it and larger ones after (Hoare partition around a median of three; a
 * pseudo-random pivot position guards against adversarial orders). */
static void select_k(double *x, int64_t lo, int64_t hi, int64_t k) {
    uint64_t st = 0x9E3779B97F4A7C15ull ^ (uint64_t)(hi - lo);
    while (hi > lo) {
        if (hi - lo < 16) { /* insertion sort */
            for (int64_t i = lo + 1; i <= hi; i++)
                for (int64_t j = i; j > lo && x[j - 1] > x[j]; j--) swap_d(x, j - 1, j);
            return;
        }
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        int64_t r = lo + (int64_t)((st >> 33) % (uint64_t)(hi - lo + 1));
        int64_t mid = lo + (hi - lo) / 2;
        swap_d(x, mid, r);
        if (x[mid] < x[lo]) swap_d(x, mid, lo);
        if (x[hi] < x[lo]) swap_d(x, hi, lo);
        if (x[hi] < x[mid]) swap_d(x, hi, mid);
        double piv = x[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (x[i] < piv) i++;
            while (x[j] > piv) j--;
            if (i <= j) { swap_d(x, i, j); i++; j--; }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return; /* x[j+1 .. i-1] all equal the pivot */
    }
}

void xent__cmp_quantiles(double *x, int64_t n, const double *levels, int nl,
                         double *out) {
    int64_t lo = 0;
    for (int q = 0; q < nl; q++) {
        if (n <= 0) { out[q] = NAN; continue; }
        double h = (double)(n - 1) * levels[q];
        int64_t k = (int64_t)floor(h);
        if (k >= n - 1) k = n - 1;
        if (k < lo) k = lo; /* levels increase: never below the last rank */
        select_k(x, lo, n - 1, k);
        double v = x[k];
        if (k + 1 < n && h > (double)k) { /* next order statistic: min above k */
            double nx = x[k + 1];
            for (int64_t i = k + 2; i < n; i++) if (x[i] < nx) nx = x[i];
            v = v + (h - (double)k) * (nx - v);
        }
        out[q] = v;
        lo = k;
    }
}

/* ---- worst tokens: a min-heap on (|d|, earlier position is worse) -------- */

typedef struct { double ad; int64_t pos; } hent;

static int worse(hent a, hent b) { /* a is worse than b */
    return a.ad > b.ad || (a.ad == b.ad && a.pos < b.pos);
}

static void heap_push(hent *h, int64_t *n, int64_t k, hent e) {
    if (*n < k) {
        int64_t i = (*n)++;
        h[i] = e;
        while (i > 0 && worse(h[(i - 1) / 2], h[i])) {
            hent t = h[i]; h[i] = h[(i - 1) / 2]; h[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
        return;
    }
    if (!worse(e, h[0])) return;
    h[0] = e;
    for (int64_t i = 0;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && worse(h[m], h[l])) m = l;
        if (r < *n && worse(h[m], h[r])) m = r;
        if (m == i) break;
        hent t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

static int cmp_hent(const void *a, const void *b) {
    hent x = *(const hent *)a, y = *(const hent *)b;
    return worse(x, y) ? -1 : worse(y, x) ? 1 : 0;
}

/* ---- token description --------------------------------------------------- */

static void describe(const xent__cmp_data *d, int64_t pos, xent__cmp_tok *t) {
    t->pos = pos;
    t->seq = t->idx = -1;
    if (d->offsets) {
        int64_t lo = 0, hi = d->nseq - 1; /* last q with offsets[q] <= pos */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            if (d->offsets[mid] <= pos) lo = mid; else hi = mid - 1;
        }
        t->seq = lo;
        t->idx = pos - d->offsets[lo];
    }
    t->token = d->tokens ? d->tokens[pos] : -1;
    t->a = d->a[pos];
    t->b = d->b[pos];
    t->r = d->r ? d->r[pos] : NAN;
}

/* ---- the main pass ------------------------------------------------------- */

typedef struct {
    double lo_r, hi_r, eps;           /* ratio bounds, log bound          */
    double s, c, s2;                  /* Neumaier sum of d, its carry, sum d^2 */
    int64_t ncr, ncl;
    double max_abs;
    int64_t max_pos;
    double *absd;                     /* [n_used] |d|, compact            */
    int64_t na;
    hent *heap;                       /* [k]                              */
    int64_t nh, k;
} pass_t;

static void add_neumaier(double *s, double *c, double x) {
    double t = *s + x;
    if (fabs(*s) >= fabs(x)) *c += (*s - t) + x;
    else *c += (x - t) + *s;
    *s = t;
}

/* Accumulates tokens [b, e) into the pass and into one bootstrap unit. */
static void pass_range(const xent__cmp_data *d, const uint8_t *use, int64_t b,
                       int64_t e, pass_t *p, xent__cmp_unit *u) {
    for (int64_t i = b; i < e; i++) {
        if (!use[i]) continue;
        double x = d->a[i] - d->b[i];
        double ax = fabs(x);
        double w = xent__exp(x);
        int cr = w < p->lo_r || w > p->hi_r;
        int cl = ax > p->eps;
        add_neumaier(&p->s, &p->c, x);
        p->s2 += x * x;
        p->ncr += cr;
        p->ncl += cl;
        if (ax > p->max_abs || p->max_pos < 0) { p->max_abs = ax; p->max_pos = i; }
        p->absd[p->na++] = ax;
        if (p->k > 0) heap_push(p->heap, &p->nh, p->k, (hent){ax, i});
        u->n += 1;
        u->s += x;
        u->s2 += x * x;
        u->cr += cr;
        u->cl += cl;
    }
}

/* Reference errors: e_A = A - R, e_B = B - R_B (R_B = R without --ref-b),
 * floor f = R - R_B, so delta = f + (e_A - e_B) (two passes: means, then
 * centred second moments). */
static void ref_stats(const xent__cmp_data *d, const uint8_t *use,
                      xent__cmp_result *r) {
    const double *rb = d->rb ? d->rb : d->r;
    double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0, sf = 0, sff = 0, sfe = 0, see = 0;
    double n = (double)r->n_used;
    for (int64_t i = 0; i < d->n; i++) {
        if (!use[i]) continue;
        double ea = d->a[i] - d->r[i], eb = d->b[i] - rb[i];
        double f = d->rb ? d->r[i] - rb[i] : 0.0, e = ea - eb;
        sa += ea; sb += eb;
        saa += ea * ea; sbb += eb * eb; sab += ea * eb;
        sf += f; sff += f * f; sfe += f * e; see += e * e;
    }
    r->mean_ea = sa / n;
    r->mean_eb = sb / n;
    r->rms_ea = sqrt(saa / n);
    r->rms_eb = sqrt(sbb / n);
    r->cross = -2.0 * sab / n;
    r->rho0 = (r->rms_ea > 0 && r->rms_eb > 0) ? (sab / n) / (r->rms_ea * r->rms_eb) : NAN;
    r->floor_mean = sf / n;
    r->floor_rms = sqrt(sff / n);
    r->floor_cross = 2.0 * sfe / n;
    r->rms_eab = sqrt(see / n);
    double caa = 0, cbb = 0, cab = 0;
    for (int64_t i = 0; i < d->n; i++) {
        if (!use[i]) continue;
        double ea = d->a[i] - d->r[i] - r->mean_ea, eb = d->b[i] - rb[i] - r->mean_eb;
        caa += ea * ea; cbb += eb * eb; cab += ea * eb;
    }
    r->sd_ea = sqrt(caa / n);
    r->sd_eb = sqrt(cbb / n);
    r->rho = (caa > 0 && cbb > 0) ? cab / sqrt(caa * cbb) : NAN;
}

/* The k sequences with the largest |mean delta| (earlier first on ties). */
static xent_status top_sequences(const xent__cmp_unit *u, int64_t nseq, int64_t k,
                                 xent__cmp_result *r) {
    hent *h = malloc((size_t)(k > 0 ? k : 1) * sizeof *h); /* [k] */
    if (!h) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    int64_t nh = 0;
    for (int64_t q = 0; q < nseq && k > 0; q++)
        if (u[q].n > 0) heap_push(h, &nh, k, (hent){fabs(u[q].s / u[q].n), q});
    qsort(h, (size_t)nh, sizeof *h, cmp_hent);
    r->topseq = malloc((size_t)(nh > 0 ? nh : 1) * sizeof *r->topseq); /* [nh] */
    if (!r->topseq) { free(h); return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory"); }
    for (int64_t i = 0; i < nh; i++) {
        const xent__cmp_unit *x = &u[h[i].pos];
        r->topseq[i] = (xent__cmp_seq){h[i].pos, (int64_t)x->n, x->s / x->n, x->s};
    }
    r->ntopseq = nh;
    free(h);
    return XENT_OK;
}

/* Per-sequence summary from the units (one unit per sequence here). */
static xent_status seq_stats(const xent__cmp_unit *u, int64_t nseq, double clamp,
                             int64_t list_max, xent__cmp_result *r) {
    double sm = 0, sm2 = 0;
    int64_t used = 0;
    r->seq_max = NAN;
    r->seq_max_idx = -1;
    r->seq_sum_min = INFINITY;
    r->seq_sum_max = -INFINITY;
    r->seq_sum_min_idx = r->seq_sum_max_idx = -1;
    for (int64_t q = 0; q < nseq; q++) {
        if (u[q].n == 0) continue;
        double m = u[q].s / u[q].n;
        used++;
        sm += m;
        sm2 += m * m;
        if (r->seq_max_idx < 0 || fabs(m) > fabs(r->seq_max)) { r->seq_max = m; r->seq_max_idx = q; }
        if (u[q].s < r->seq_sum_min) { r->seq_sum_min = u[q].s; r->seq_sum_min_idx = q; }
        if (u[q].s > r->seq_sum_max) { r->seq_sum_max = u[q].s; r->seq_sum_max_idx = q; }
        if (fabs(u[q].s) >= 0.9 * clamp) r->n_clamp_warn++;
    }
    r->nseq = nseq;
    r->nseq_used = used;
    if (!used) return XENT_OK;
    r->seq_mean = sm / (double)used;
    r->seq_rms = sqrt(sm2 / (double)used);
    double v = 0;
    for (int64_t q = 0; q < nseq; q++) {
        if (u[q].n == 0) continue;
        double m = u[q].s / u[q].n - r->seq_mean;
        v += m * m;
    }
    r->seq_std = sqrt(v / (double)used);
    xent_status s = top_sequences(u, nseq, list_max, r);
    if (s) return s;
    int64_t nl = r->n_clamp_warn < list_max ? r->n_clamp_warn : list_max;
    if (nl <= 0) return XENT_OK;
    r->clamp_idx = malloc((size_t)nl * sizeof *r->clamp_idx);
    r->clamp_sum = malloc((size_t)nl * sizeof *r->clamp_sum);
    if (!r->clamp_idx || !r->clamp_sum) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    for (int64_t q = 0; q < nseq && r->n_clamp_list < nl; q++) {
        if (u[q].n == 0 || fabs(u[q].s) < 0.9 * clamp) continue;
        r->clamp_idx[r->n_clamp_list] = q;
        r->clamp_sum[r->n_clamp_list++] = u[q].s;
    }
    return XENT_OK;
}

/* Merges groups of g consecutive units into one (in place); returns count. */
static int64_t group_units(xent__cmp_unit *u, int64_t n, int64_t g) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i += g) {
        xent__cmp_unit acc = {0, 0, 0, 0, 0};
        for (int64_t j = i; j < n && j < i + g; j++) {
            acc.n += u[j].n; acc.s += u[j].s; acc.s2 += u[j].s2;
            acc.cr += u[j].cr; acc.cl += u[j].cl;
        }
        u[m++] = acc;
    }
    return m;
}

xent_status xent__cmp_check_opts(const xent__cmp_opts *o) {
    if (!(o->eps > 0 && o->eps < 1))
        return xent_set_error(XENT_ERR_VALUE, "--eps = %g is outside (0, 1)", o->eps);
    if (!(o->eps_high > 0) || isinf(o->eps_high))
        return xent_set_error(XENT_ERR_VALUE, "--eps-high = %g must be > 0", o->eps_high);
    if (!(o->clamp > 0) || isinf(o->clamp))
        return xent_set_error(XENT_ERR_VALUE, "--clamp = %g must be > 0", o->clamp);
    if (o->zero_run < 1)
        return xent_set_error(XENT_ERR_VALUE, "--zero-run = %lld must be >= 1", (long long)o->zero_run);
    if (o->bootstrap < 0 || o->bootstrap > 1000000)
        return xent_set_error(XENT_ERR_VALUE, "--bootstrap = %lld is outside [0, 1000000]",
                          (long long)o->bootstrap);
    if (o->top < 0 || o->top > 100000)
        return xent_set_error(XENT_ERR_VALUE, "--top = %lld is outside [0, 100000]", (long long)o->top);
    if (!(o->tis_cap > 0) || isinf(o->tis_cap))
        return xent_set_error(XENT_ERR_VALUE, "--tis-cap = %g must be > 0", o->tis_cap);
    if (!(o->mis_cap > 0) || isinf(o->mis_cap))
        return xent_set_error(XENT_ERR_VALUE, "--mis-cap = %g must be > 0", o->mis_cap);
    if (!(o->icepop_lo > 0) || !(o->icepop_hi > o->icepop_lo) || isinf(o->icepop_hi))
        return xent_set_error(XENT_ERR_VALUE, "--icepop-lo = %g, --icepop-hi = %g: need "
                              "0 < lo < hi < inf", o->icepop_lo, o->icepop_hi);
    return XENT_OK;
}

static xent_status validate(const xent__cmp_data *d, const xent__cmp_opts *o) {
    if (!d || !o || !d->a || !d->b) return xent_set_error(XENT_ERR_NULL, "compare: missing input");
    if (d->n <= 0) return xent_set_error(XENT_ERR_SHAPE, "compare: no tokens");
    xent_status s = xent__cmp_check_opts(o);
    if (s) return s;
    if (d->offsets) {
        if (d->nseq < 1 || d->offsets[0] != 0)
            return xent_set_error(XENT_ERR_VALUE, "offsets[0] = %lld must be 0",
                              (long long)(d->nseq < 1 ? -1 : d->offsets[0]));
        for (int64_t q = 0; q < d->nseq; q++)
            if (d->offsets[q + 1] < d->offsets[q])
                return xent_set_error(XENT_ERR_VALUE, "offsets[%lld] = %lld is below offsets[%lld] = %lld",
                                  (long long)(q + 1), (long long)d->offsets[q + 1],
                                  (long long)q, (long long)d->offsets[q]);
        if (d->offsets[d->nseq] != d->n)
            return xent_set_error(XENT_ERR_SHAPE, "offsets[%lld] = %lld must equal the token count %lld",
                              (long long)d->nseq, (long long)d->offsets[d->nseq], (long long)d->n);
    }
    if (d->mask)
        for (int64_t i = 0; i < d->n; i++)
            if (d->mask[i] > 1)
                return xent_set_error(XENT_ERR_VALUE, "mask[%lld] = %d is not 0 or 1",
                                  (long long)i, d->mask[i]);
    return XENT_OK;
}

/* Selection, bad values and the `use` mask ([n]). */
static xent_status select_tokens(const xent__cmp_data *d, const xent__cmp_opts *o,
                                 xent__cmp_result *r, uint8_t **use_out) {
    uint8_t *use = calloc((size_t)d->n, 1); /* [n] 1 = bad, then 1 = used */
    if (!use) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    const double *v[4] = {d->a, d->b, d->r, d->r ? d->rb : NULL};
    int64_t nbad = 0;
    for (int k = 0; k < 4; k++) {
        if (!v[k]) continue;
        xent__cmp_scan_bad(v[k], d->n, d->mask, o->zero_run, &r->bad[k], use);
        nbad += bad_total(&r->bad[k]);
    }
    int64_t sel = 0, used = 0;
    for (int64_t i = 0; i < d->n; i++) {
        int s = !d->mask || d->mask[i];
        sel += s;
        use[i] = (uint8_t)(s && !use[i]);
        used += use[i];
    }
    r->n_selected = sel;
    r->n_used = used;
    r->n_excluded = sel - used;
    *use_out = use;
    if (nbad && !o->exclude_bad)
        return xent_set_error(XENT_ERR_VALUE, "bad log-probs (positive, NaN, infinite or "
                          "zero runs) in %lld tokens", (long long)r->n_excluded);
    if (sel == 0) return xent_set_error(XENT_ERR_SHAPE, "compare: the mask selects no tokens");
    if (used == 0) return xent_set_error(XENT_ERR_VALUE, "compare: every selected token is bad");
    return XENT_OK;
}

/* Runs the bootstrap over the units: sequences (grouped when there are more
 * than XENT__CMP_MAX_UNITS) or the token blocks made by main_pass. */
static void boot_units(const xent__cmp_data *d, const xent__cmp_opts *o,
                       xent__cmp_unit *u, int64_t nu, xent__cmp_result *r) {
    if (o->bootstrap == 0) { /* no intervals: NaN bounds */
        xent__cmp_bootstrap(NULL, 0, 0, o->seed, 1, r);
        return;
    }
    if (d->offsets) {
        int64_t g = (nu + XENT__CMP_MAX_UNITS - 1) / XENT__CMP_MAX_UNITS;
        nu = group_units(u, nu, g);
        r->boot_block = g;
        r->boot_by_seq = 1;
    }
    r->boot_units = nu;
    xent__cmp_bootstrap(u, nu, o->bootstrap, o->seed, xent_num_threads(o->threads), r);
}

/* One pass over the used tokens. Units ([nu]): one per sequence with
 * boundaries, else one per block of r->boot_block tokens (blocks of 1 token
 * up to XENT__CMP_MAX_UNITS tokens: the plain token bootstrap). */
static xent_status main_pass(const xent__cmp_data *d, const uint8_t *use,
                             const xent__cmp_opts *o, pass_t *p,
                             xent__cmp_unit **units, int64_t *nu,
                             xent__cmp_result *r) {
    int64_t bs = (d->n + XENT__CMP_MAX_UNITS - 1) / XENT__CMP_MAX_UNITS;
    *nu = d->offsets ? d->nseq : (d->n + bs - 1) / bs;
    r->boot_block = d->offsets ? 1 : bs;
    p->absd = malloc((size_t)r->n_used * sizeof *p->absd); /* [n_used] */
    p->k = o->top;
    p->heap = malloc((size_t)(p->k > 0 ? p->k : 1) * sizeof *p->heap); /* [k] */
    *units = calloc((size_t)(*nu > 0 ? *nu : 1), sizeof **units); /* [nu] */
    if (!p->absd || !p->heap || !*units)
        return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    for (int64_t q = 0; q < *nu; q++) {
        int64_t b = d->offsets ? d->offsets[q] : q * bs;
        int64_t e = d->offsets ? d->offsets[q + 1] : (b + bs < d->n ? b + bs : d->n);
        pass_range(d, use, b, e, p, &(*units)[q]);
    }
    double n = (double)r->n_used;
    r->sum = p->s + p->c;
    r->mean = r->sum / n;
    r->rms = sqrt(p->s2 / n);
    r->max_abs = p->max_abs;
    describe(d, p->max_pos, &r->max_tok);
    r->n_clip_ratio = p->ncr;
    r->n_clip_log = p->ncl;
    r->clip_ratio = (double)p->ncr / n;
    r->clip_log = (double)p->ncl / n;
    return XENT_OK;
}

static xent_status top_list(const xent__cmp_data *d, pass_t *p, xent__cmp_result *r) {
    qsort(p->heap, (size_t)p->nh, sizeof *p->heap, cmp_hent);
    r->top = calloc((size_t)(p->nh > 0 ? p->nh : 1), sizeof *r->top); /* [ntop] */
    if (!r->top) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    for (int64_t i = 0; i < p->nh; i++) describe(d, p->heap[i].pos, &r->top[i]);
    r->ntop = p->nh;
    return XENT_OK;
}

xent_status xent__cmp_compute(const xent__cmp_data *d, const xent__cmp_opts *o,
                              xent__cmp_result *r) {
    memset(r, 0, sizeof *r);
    xent_status s = validate(d, o);
    if (s) return s;
    r->n = d->n;
    r->has_ref = d->r != NULL;
    r->has_ref_b = d->r != NULL && d->rb != NULL;
    r->has_tokens = d->tokens != NULL;
    r->has_seq = d->offsets != NULL;
    r->has_mask = d->mask != NULL;
    r->a = d->a;
    r->b = d->b;
    r->r = d->r;
    uint8_t *use = NULL;
    s = select_tokens(d, o, r, &use);
    r->use = use;
    if (s) return s;
    pass_t p;
    memset(&p, 0, sizeof p);
    p.lo_r = 1.0 - o->eps;
    p.hi_r = 1.0 + o->eps_high;
    p.eps = o->eps;
    p.max_pos = -1;
    xent__cmp_unit *units = NULL;
    int64_t nu = 0;
    s = main_pass(d, use, o, &p, &units, &nu, r);
    if (!s) s = top_list(d, &p, r);
    if (!s) xent__cmp_quantiles(p.absd, p.na, xent__cmp_qlevels, XENT__CMP_NQ, r->q);
    free(p.absd);
    p.absd = NULL;
    if (!s && d->r) ref_stats(d, use, r);
    if (!s) s = xent__cmp_rl_metrics(d, use, o, r);
    if (!s && d->offsets) s = seq_stats(units, d->nseq, o->clamp, o->top, r);
    if (!s) boot_units(d, o, units, nu, r);
    free(units);
    free(p.heap);
    return s;
}
