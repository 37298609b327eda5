/* src/rl/rl_adv.c: group advantages and batch (pack) normalisation.
 *
 * Exact zeros: a group whose rewards are all equal is detected with an
 * explicit comparison and written as +0 without any arithmetic, so no
 * rounding residual of a mean can survive (a float mean of [0.1] * 7 leaves
 * -7.45e-9, a double mean of [0.1] * 8 leaves 1.39e-11). Other groups use a
 * two-pass mean in double with one correction step
 *   m = sum(r) / n;  m += sum(r - m) / n
 * then the squared deviations about m, all in double. */
#include "rl/rl_internal.h"

void xent_rl_adv_opts_init(xent_rl_adv_opts *o) {
    o->std = XENT_RL_STD_POPULATION;
    o->eps = 1e-6;
    o->subtract_mean = 1;
}

void xent_rl_batch_opts_init(xent_rl_batch_opts *o) {
    o->kind = XENT_RL_BATCH_MEAN_ABS;
    o->std = XENT_RL_STD_POPULATION;
    o->subtract_mean = 0;
    o->eps = 0.0;
}

/* ---- validation ---------------------------------------------------------- */

static xent_status check_adv_opts(const xent_rl_adv_opts *o) {
    if ((unsigned)o->std > XENT_RL_STD_NONE)
        return xent_set_error(XENT_ERR_VALUE, "opts->std = %d is not an xent_rl_std",
                          (int)o->std);
    if (!(o->eps >= 0.0) || isinf(o->eps))
        return xent_set_error(XENT_ERR_VALUE, "opts->eps = %g must be finite and >= 0",
                          o->eps);
    if (o->subtract_mean != 0 && o->subtract_mean != 1)
        return xent_set_error(XENT_ERR_VALUE, "opts->subtract_mean = %d must be 0 or 1",
                          o->subtract_mean);
    return XENT_OK;
}

static xent_status check_ids(const int64_t *ids, int64_t n, int64_t ngroups) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= ngroups)
            return xent_set_error(XENT_ERR_VALUE,
                              "groups->ids[%lld] = %lld is outside [0, %lld)",
                              (long long)i, (long long)ids[i], (long long)ngroups);
        if (i > 0 && ids[i] < ids[i - 1])
            return xent_set_error(XENT_ERR_VALUE,
                              "groups->ids[%lld] = %lld follows ids[%lld] = %lld: "
                              "group ids must be non-decreasing (each group "
                              "contiguous)", (long long)i, (long long)ids[i],
                              (long long)(i - 1), (long long)ids[i - 1]);
    }
    return XENT_OK;
}

static xent_status check_groups(const xent_rl_groups *g) {
    if (g->n < 0)
        return xent_set_error(XENT_ERR_SHAPE, "groups->n = %lld < 0", (long long)g->n);
    if (g->ngroups < 0)
        return xent_set_error(XENT_ERR_SHAPE, "groups->ngroups = %lld < 0",
                          (long long)g->ngroups);
    if ((g->offsets == NULL) == (g->ids == NULL))
        return xent_set_error(XENT_ERR_VALUE, "groups: give exactly one of offsets "
                          "and ids (%s given)", g->offsets ? "both" : "neither");
    if (g->offsets)
        return xent__rl_check_offsets("groups->offsets", g->offsets, g->ngroups, g->n);
    return check_ids(g->ids, g->n, g->ngroups);
}

static xent_status check_finite(const char *what, const float *x, int64_t n,
                                const uint8_t *mask) {
    for (int64_t i = 0; i < n; i++)
        if (xent__rl_counted(mask, i) && !isfinite(x[i]))
            return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = %g is not finite", what,
                              (long long)i, (double)x[i]);
    return XENT_OK;
}

/* ---- one group ----------------------------------------------------------- */

static int all_equal(const float *r, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (r[i] != r[0]) return 0;
    return 1;
}

/* Mean in double with one correction pass (see the file comment). */
static double mean2(const float *r, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += r[i];
    double m = s / (double)n, c = 0.0;
    for (int64_t i = 0; i < n; i++) c += (double)r[i] - m;
    return m + c / (double)n;
}

/* Sum of squared deviations about m. */
static double ssd(const float *r, int64_t n, double m) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)r[i] - m;
        s += d * d;
    }
    return s;
}

/* Advantages of one group r [n] (n >= 1) into a [n]; a may equal r. */
static void one_group(const float *r, int64_t n, const xent_rl_adv_opts *o,
                      float *a, double *mean_out, double *std_out,
                      xent_rl_adv_stats *st) {
    if (all_equal(r, n)) {
        *mean_out = r[0];
        *std_out = 0.0;
        st->n_zero_var++;
        st->n_singleton += n == 1;
        for (int64_t i = 0; i < n; i++) a[i] = o->subtract_mean ? 0.0f : r[i];
        return;
    }
    double m = mean2(r, n), sd = 0.0;
    if (o->std != XENT_RL_STD_NONE) {
        double denom = o->std == XENT_RL_STD_SAMPLE ? (double)(n - 1) : (double)n;
        sd = sqrt(ssd(r, n, m) / denom);
    }
    double scale = o->std == XENT_RL_STD_NONE ? 1.0 : sd + o->eps;
    double shift = o->subtract_mean ? m : 0.0;
    *mean_out = m;
    *std_out = sd;
    for (int64_t i = 0; i < n; i++) a[i] = (float)(((double)r[i] - shift) / scale);
}

/* Group g's range [*b, *e) from offsets or from the contiguous ids. */
static void group_range(const xent_rl_groups *g, int64_t gi, int64_t *cursor,
                        int64_t *b, int64_t *e) {
    if (g->offsets) {
        *b = g->offsets[gi];
        *e = g->offsets[gi + 1];
        return;
    }
    *b = *cursor;
    while (*cursor < g->n && g->ids[*cursor] == gi) (*cursor)++;
    *e = *cursor;
}

xent_status xent_rl_group_advantages(const float *rewards,
                                     const xent_rl_groups *groups,
                                     const xent_rl_adv_opts *opts,
                                     float *adv, double *group_mean,
                                     double *group_std,
                                     xent_rl_adv_stats *stats) {
    if (!groups || !opts)
        return xent_set_error(XENT_ERR_NULL, "xent_rl_group_advantages: %s is NULL",
                          !groups ? "groups" : "opts");
    xent_status s;
    if ((s = check_adv_opts(opts)) || (s = check_groups(groups))) return s;
    if (groups->n > 0 && (!rewards || !adv))
        return xent_set_error(XENT_ERR_NULL, "xent_rl_group_advantages: %s is NULL",
                          !rewards ? "rewards" : "adv");
    if ((s = check_finite("rewards", rewards, groups->n, NULL))) return s;

    xent_rl_adv_stats st = {0, 0, 0, 0};
    int64_t cursor = 0;
    for (int64_t gi = 0; gi < groups->ngroups; gi++) {
        int64_t b, e;
        double m = 0.0, sd = 0.0;
        group_range(groups, gi, &cursor, &b, &e);
        if (e == b) st.n_empty++;
        else {
            st.n_groups++;
            one_group(rewards + b, e - b, opts, adv + b, &m, &sd, &st);
        }
        if (group_mean) group_mean[gi] = m;
        if (group_std) group_std[gi] = sd;
    }
    if (stats) *stats = st;
    return XENT_OK;
}

/* ---- batch normalisation ------------------------------------------------- */

static xent_status check_batch_opts(const xent_rl_batch_opts *o) {
    if ((unsigned)o->kind > XENT_RL_BATCH_STD)
        return xent_set_error(XENT_ERR_VALUE, "opts->kind = %d is not an "
                          "xent_rl_batch_norm", (int)o->kind);
    if (o->kind == XENT_RL_BATCH_STD && o->std != XENT_RL_STD_POPULATION &&
        o->std != XENT_RL_STD_SAMPLE)
        return xent_set_error(XENT_ERR_VALUE, "opts->std = %d: BATCH_STD needs "
                          "XENT_RL_STD_POPULATION or XENT_RL_STD_SAMPLE", (int)o->std);
    if (o->subtract_mean != 0 && o->subtract_mean != 1)
        return xent_set_error(XENT_ERR_VALUE, "opts->subtract_mean = %d must be 0 or 1",
                          o->subtract_mean);
    if (!(o->eps >= 0.0) || isinf(o->eps))
        return xent_set_error(XENT_ERR_VALUE, "opts->eps = %g must be finite and >= 0",
                          o->eps);
    return XENT_OK;
}

/* Mean, mean |A| and sum of squared deviations over counted entries. */
static void batch_moments(const float *a, int64_t n, const uint8_t *mask,
                          xent_rl_batch_stats *st, double *mean_abs,
                          double *ss) {
    double s = 0.0, sa = 0.0, c = 0.0, q = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (xent__rl_counted(mask, i)) { s += a[i]; sa += fabs((double)a[i]); k++; }
    double m = k ? s / (double)k : 0.0;
    for (int64_t i = 0; i < n; i++)
        if (xent__rl_counted(mask, i)) c += (double)a[i] - m;
    m = k ? m + c / (double)k : 0.0;
    for (int64_t i = 0; i < n; i++)
        if (xent__rl_counted(mask, i)) { double d = (double)a[i] - m; q += d * d; }
    st->n_counted = k;
    st->mean = m;
    *mean_abs = k ? sa / (double)k : 0.0;
    *ss = q;
}

xent_status xent_rl_batch_normalize(const float *adv_in, int64_t n,
                                    const uint8_t *mask,
                                    const xent_rl_batch_opts *opts,
                                    float *adv_out,
                                    xent_rl_batch_stats *stats) {
    if (!opts) return xent_set_error(XENT_ERR_NULL, "xent_rl_batch_normalize: opts is NULL");
    if (n < 0) return xent_set_error(XENT_ERR_SHAPE, "n = %lld < 0", (long long)n);
    if (n > 0 && (!adv_in || !adv_out))
        return xent_set_error(XENT_ERR_NULL, "xent_rl_batch_normalize: %s is NULL",
                          !adv_in ? "adv_in" : "adv_out");
    xent_status s;
    if ((s = check_batch_opts(opts)) || (s = xent__rl_check_mask("mask", mask, n)) ||
        (s = check_finite("adv_in", adv_in, n, mask)))
        return s;

    xent_rl_batch_stats st;
    double mean_abs, ss;
    batch_moments(adv_in, n, mask, &st, &mean_abs, &ss);
    int is_std = opts->kind == XENT_RL_BATCH_STD;
    int64_t dof = st.n_counted - (opts->std == XENT_RL_STD_SAMPLE ? 1 : 0);
    st.scale = !is_std ? mean_abs : (dof > 0 ? sqrt(ss / (double)dof) : 0.0);
    /* ss == 0 exactly iff every counted entry equals the mean (an all-equal
     * batch): then nothing is divided and a shift leaves exact zeros. */
    st.degenerate = st.n_counted == 0 || st.scale == 0.0 || (is_std && ss == 0.0);
    double shift = is_std && opts->subtract_mean ? st.mean : 0.0;
    double div = st.scale + opts->eps;
    for (int64_t i = 0; i < n; i++) {
        float a = adv_in[i];
        if (!xent__rl_counted(mask, i)) adv_out[i] = a;
        else if (st.degenerate) adv_out[i] = is_std && opts->subtract_mean ? 0.0f : a;
        else adv_out[i] = (float)(((double)a - shift) / div);
    }
    if (stats) *stats = st;
    return XENT_OK;
}
