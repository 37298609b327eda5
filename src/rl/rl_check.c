/* src/rl/rl_check.c: input checks shared by the RL functions: sequence
 * offsets, masks, and log-prob arrays (NaN, > 0, -inf, zero-filled runs). */
#include "rl/rl_internal.h"

#include <stdio.h>

xent_status xent__rl_check_offsets(const char *what, const int64_t *offsets,
                                   int64_t nseq, int64_t T) {
    if (!offsets) return xent_set_error(XENT_ERR_NULL, "%s is NULL", what);
    if (offsets[0] != 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s[0] = %lld, must be 0", what,
                          (long long)offsets[0]);
    for (int64_t i = 1; i <= nseq; i++)
        if (offsets[i] < offsets[i - 1])
            return xent_set_error(XENT_ERR_SHAPE,
                              "%s[%lld] = %lld is below %s[%lld] = %lld: "
                              "offsets must be non-decreasing",
                              what, (long long)i, (long long)offsets[i], what,
                              (long long)(i - 1), (long long)offsets[i - 1]);
    if (offsets[nseq] != T)
        return xent_set_error(XENT_ERR_SHAPE,
                          "%s[%lld] = %lld, must equal the length %lld", what,
                          (long long)nseq, (long long)offsets[nseq],
                          (long long)T);
    return XENT_OK;
}

xent_status xent__rl_check_mask(const char *what, const uint8_t *mask,
                                int64_t T) {
    if (!mask) return XENT_OK;
    for (int64_t t = 0; t < T; t++)
        if (mask[t] > 1)
            return xent_set_error(XENT_ERR_VALUE,
                              "%s[%lld] = %u, a mask holds 0 or 1", what,
                              (long long)t, (unsigned)mask[t]);
    return XENT_OK;
}

/* Records a bad value: count it, remember the first index. */
static void note(int64_t *n, int64_t *first, int64_t t) {
    if (*n == 0) *first = t;
    (*n)++;
}

/* Zero-run bookkeeping of one value of a sequence. */
static void zero_run_step(xent_rl_lp_report *r, float v, int64_t t,
                          int64_t limit, int64_t *run, int64_t *start) {
    if (v != 0.0f || isnan(v)) {
        *run = 0;
        return;
    }
    if (*run == 0) *start = t;
    (*run)++;
    if (*run > r->longest_zero_run) r->longest_zero_run = *run;
    if (limit > 0 && *run == limit) note(&r->n_zero_runs, &r->first_zero_run, *start);
}

static void scan_one(xent_rl_lp_report *r, float v, int64_t t) {
    r->n_checked++;
    if (isnan(v)) note(&r->n_nan, &r->first_nan, t);
    else if (v > 0.0f) note(&r->n_positive, &r->first_positive, t);
    else if (isinf(v)) note(&r->n_neg_inf, &r->first_neg_inf, t);
}

/* Branch-free first pass: 1 when some counted value is NaN, >= 0 or -inf
 * (anything but a finite negative number); *n gets the counted tokens. */
static int any_special(const float *lp, int64_t T, const uint8_t *mask,
                       int64_t *n) {
    int64_t k = 0;
    int bad = 0;
    for (int64_t t = 0; t < T; t++) {
        int c = mask ? mask[t] != 0 : 1;
        float v = lp[t];
        bad |= c & (!(v < 0.0f) | (v == -INFINITY));
        k += c;
    }
    *n = k;
    return bad;
}

static void scan(const float *lp, int64_t T, const int64_t *offsets,
                 int64_t nseq, const uint8_t *mask, int64_t limit,
                 xent_rl_lp_report *r) {
    *r = (xent_rl_lp_report){0, 0, -1, 0, -1, 0, -1, 0, -1, 0};
    if (!any_special(lp, T, mask, &r->n_checked)) return;
    r->n_checked = 0;
    int64_t ns = offsets ? nseq : 1;
    for (int64_t s = 0; s < ns; s++) {
        int64_t b = offsets ? offsets[s] : 0, e = offsets ? offsets[s + 1] : T;
        int64_t run = 0, start = -1;
        for (int64_t t = b; t < e; t++) {
            if (!xent__rl_counted(mask, t)) continue;
            scan_one(r, lp[t], t);
            zero_run_step(r, lp[t], t, limit, &run, &start);
        }
    }
}

/* The message for the first kind of problem found (NaN, > 0, -inf, zeros). */
static xent_status report_fail(const char *name, const float *lp,
                               const xent_rl_lp_report *r, int allow_neg_inf,
                               int64_t limit) {
    char counts[256];
    snprintf(counts, sizeof counts,
             "%lld NaN, %lld positive, %lld -inf, %lld zero runs of >= %lld "
             "among %lld counted tokens",
             (long long)r->n_nan, (long long)r->n_positive,
             (long long)r->n_neg_inf, (long long)r->n_zero_runs,
             (long long)limit, (long long)r->n_checked);
    if (r->n_nan)
        return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = nan: a log-prob is never "
                          "NaN (%s)", name, (long long)r->first_nan, counts);
    if (r->n_positive)
        return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = %.9g is > 0: a log-prob is "
                          "<= 0 (%s)", name, (long long)r->first_positive,
                          (double)lp[r->first_positive], counts);
    if (r->n_neg_inf && !allow_neg_inf)
        return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = -inf: these log-probs "
                          "must be finite (%s)", name,
                          (long long)r->first_neg_inf, counts);
    return xent_set_error(XENT_ERR_VALUE, "%s[%lld..]: a run of >= %lld log-probs "
                      "exactly 0 (a zero-filled dump?); longest run %lld (%s)",
                      name, (long long)r->first_zero_run, (long long)limit,
                      (long long)r->longest_zero_run, counts);
}

xent_status xent_rl_check_logprobs(const char *name, const float *lp,
                                   int64_t T, const int64_t *offsets,
                                   int64_t nseq, const uint8_t *mask,
                                   int allow_neg_inf, int64_t zero_run_limit,
                                   xent_rl_lp_report *report) {
    if (!name) name = "logprobs";
    if (report) *report = (xent_rl_lp_report){0, 0, -1, 0, -1, 0, -1, 0, -1, 0};
    if (T < 0) return xent_set_error(XENT_ERR_SHAPE, "%s: T = %lld < 0", name, (long long)T);
    if (!lp && T > 0) return xent_set_error(XENT_ERR_NULL, "%s is NULL", name);
    if (nseq < 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s: nseq = %lld < 0", name, (long long)nseq);
    if (zero_run_limit < 0)
        return xent_set_error(XENT_ERR_VALUE, "zero_run_limit = %lld < 0",
                          (long long)zero_run_limit);
    xent_status st;
    if (offsets && (st = xent__rl_check_offsets("offsets", offsets, nseq, T)))
        return st;
    if ((st = xent__rl_check_mask("mask", mask, T))) return st;
    xent_rl_lp_report r;
    scan(lp, T, offsets, nseq, mask, zero_run_limit, &r);
    if (report) *report = r;
    int bad = r.n_nan || r.n_positive || r.n_zero_runs ||
              (r.n_neg_inf && !allow_neg_inf);
    return bad ? report_fail(name, lp, &r, allow_neg_inf, zero_run_limit)
               : XENT_OK;
}
