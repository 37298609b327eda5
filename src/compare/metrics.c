/* src/compare/metrics.c: the metrics RL trainers log online about the
 * trainer/sampler mismatch (verl's rollout_corr metrics, TRL's sampling metrics,
 * OpenRLHF's vLLM IS correction), computed on an offline dump, and their
 * breakdowns by completion position, entropy and token frequency.
 * A is the trainer, B the sampler: lw = clamp(A - B, +-clamp) is the log
 * importance weight log(pi_train / pi_rollout), w = exp(lw). Definitions
 * and sources: docs/compare.md, "RL-trainer metrics". */
#include "compare/compare.h"

#include <stdlib.h>
#include <string.h>

const int64_t xent__cmp_pos_edges[XENT__CMP_NPOS - 1] = {64, 256, 1024};
const double xent__cmp_ent_edges[XENT__CMP_NENT - 1] = {0.01, 0.1, 1.0};

static double clampc(double x, double c) { return x > c ? c : (x < -c ? -c : x); }

/* Running sums of one group of tokens. */
typedef struct {
    int64_t n, ntis, nmis, nice;
    double s, s2, sabs, k1, k2, k3, chi, w, w2;
} acc_t;

typedef struct { /* per-token values shared by every group it falls in */
    double d, lw, w, k3, chi;
    int tis, mis, ice;
} tokv_t;

static void acc_add(acc_t *a, const tokv_t *t) {
    a->n++;
    a->s += t->d;
    a->s2 += t->d * t->d;
    a->sabs += fabs(t->d);
    a->k1 -= t->lw;
    a->k2 += 0.5 * t->lw * t->lw;
    a->k3 += t->k3;
    a->chi += t->chi;
    a->w += t->w;
    a->w2 += t->w * t->w;
    a->ntis += t->tis;
    a->nmis += t->mis;
    a->nice += t->ice;
}

static void acc_finish(const acc_t *a, xent__cmp_rlm *m) {
    memset(m, 0, sizeof *m);
    m->n = a->n;
    if (!a->n) {
        m->mean = m->rms = m->mean_abs = m->k1 = m->k2 = m->k3 = NAN;
        m->chi2 = m->ess = m->tis = m->mis = m->icepop = NAN;
        return;
    }
    double n = (double)a->n;
    m->mean = a->s / n;
    m->rms = sqrt(a->s2 / n);
    m->mean_abs = a->sabs / n;
    m->k1 = a->k1 / n;
    m->k2 = a->k2 / n;
    m->k3 = a->k3 / n;
    m->chi2 = a->chi / n;
    m->ess = a->w2 > 0 ? a->w * a->w / (n * a->w2) : NAN;
    m->tis = (double)a->ntis / n;
    m->mis = (double)a->nmis / n;
    m->icepop = (double)a->nice / n;
}

static int bucket_pos(int64_t k) {
    int b = 0;
    while (b < XENT__CMP_NPOS - 1 && k >= xent__cmp_pos_edges[b]) b++;
    return b;
}

static int bucket_ent(double h) {
    int b = 0;
    while (b < XENT__CMP_NENT - 1 && h >= xent__cmp_ent_edges[b]) b++;
    return b;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

/* Token-frequency buckets: c_i = how often token i's id occurs among the
 * used tokens; with c sorted over the used tokens, cut[0] = c at rank
 * ceil(n/3) - 1 and cut[1] = c at rank ceil(2n/3) - 1; rare: c <= cut[0],
 * common: c > cut[1], mid: the rest. Ties stay in one bucket, so the
 * buckets can be unequal. fb[i] receives the bucket of every used token. */
static xent_status freq_buckets(const xent__cmp_data *d, const uint8_t *use, int64_t nu,
                                uint8_t *fb, xent__cmp_rl *rl) {
    int64_t *ids = malloc((size_t)nu * sizeof *ids);   /* [nu] sorted ids      */
    int64_t *cnt = malloc((size_t)nu * sizeof *cnt);   /* [nu] counts, by rank */
    if (!ids || !cnt) {
        free(ids);
        free(cnt);
        return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    }
    int64_t m = 0;
    for (int64_t i = 0; i < d->n; i++)
        if (use[i]) ids[m++] = d->tokens[i];
    qsort(ids, (size_t)nu, sizeof *ids, cmp_i64);
    /* unique ids (in place) and their counts */
    int64_t nid = 0;
    for (int64_t i = 0; i < nu;) {
        int64_t j = i;
        while (j < nu && ids[j] == ids[i]) j++;
        ids[nid] = ids[i];
        cnt[nid++] = j - i;
        i = j;
    }
    rl->n_ids = nid;
    /* the token-weighted distribution of counts: ranks by sorted count */
    int64_t *cs = malloc((size_t)nid * sizeof *cs); /* [nid] */
    if (!cs) {
        free(ids);
        free(cnt);
        return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    }
    memcpy(cs, cnt, (size_t)nid * sizeof *cs);
    qsort(cs, (size_t)nid, sizeof *cs, cmp_i64);
    int64_t r1 = (nu + 2) / 3 - 1, r2 = (2 * nu + 2) / 3 - 1; /* ceil(n/3) - 1, ceil(2n/3) - 1 */
    int64_t below = 0;
    rl->freq_cut[0] = rl->freq_cut[1] = -1;
    for (int64_t k = 0; k < nid; k++) { /* id k covers token ranks [below, below + cs[k]) */
        below += cs[k];
        if (rl->freq_cut[0] < 0 && below > r1) rl->freq_cut[0] = cs[k];
        if (rl->freq_cut[1] < 0 && below > r2) rl->freq_cut[1] = cs[k];
    }
    free(cs);
    for (int64_t i = 0; i < d->n; i++) {
        if (!use[i]) continue;
        int64_t lo = 0, hi = nid - 1, t = d->tokens[i];
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (ids[mid] < t) lo = mid + 1; else hi = mid;
        }
        int64_t c = cnt[lo];
        fb[i] = c <= rl->freq_cut[0] ? 0 : (c > rl->freq_cut[1] ? 2 : 1);
    }
    free(ids);
    free(cnt);
    return XENT_OK;
}

xent_status xent__cmp_rl_metrics(const xent__cmp_data *d, const uint8_t *use,
                                 const xent__cmp_opts *o, xent__cmp_result *res) {
    xent__cmp_rl *rl = &res->rl;
    memset(rl, 0, sizeof *rl);
    const double C = o->clamp, lt = o->tis_cap, lm = o->mis_cap;
    uint8_t *fb = NULL;
    if (d->tokens) {
        fb = malloc((size_t)d->n); /* [n] frequency bucket of each used token */
        if (!fb) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
        xent_status s = freq_buckets(d, use, res->n_used, fb, rl);
        if (s) { free(fb); return s; }
        rl->has_freq = 1;
    }
    rl->has_entropy = d->entropy != NULL;
    acc_t all, pos[XENT__CMP_NPOS], ent[XENT__CMP_NENT], frq[XENT__CMP_NFREQ];
    memset(&all, 0, sizeof all);
    memset(pos, 0, sizeof pos);
    memset(ent, 0, sizeof ent);
    memset(frq, 0, sizeof frq);
    double sa = 0, sb = 0, wt = 0, wt2 = 0;
    rl->w_min = INFINITY;
    rl->w_max = -INFINITY;
    /* sequence level */
    acc_t sq;
    memset(&sq, 0, sizeof sq);
    double ppl_a = 0, ppl_b = 0, lpd = 0, chi_s = 0;
    int64_t nsq = 0, ntis_s = 0, nmis_s = 0, nmis_g = 0;
    int64_t nq = d->offsets ? d->nseq : 1;
    for (int64_t q = 0; q < nq; q++) {
        int64_t b = d->offsets ? d->offsets[q] : 0, e = d->offsets ? d->offsets[q + 1] : d->n;
        int64_t k = 0, nq_used = 0; /* completion index; used tokens of q */
        double slw = 0, sqa = 0, sqb = 0;
        for (int64_t i = b; i < e; i++) {
            if (d->mask && !d->mask[i]) continue;
            int64_t idx = k++;
            if (!use[i]) continue;
            tokv_t t;
            t.d = d->a[i] - d->b[i];
            t.lw = clampc(t.d, C);
            rl->n_clamped += fabs(t.d) > C;
            t.w = xent__exp(t.lw);
            t.k3 = xent_rl_k3(t.lw);
            t.chi = expm1(2 * t.lw);
            t.tis = t.w > lt;
            t.mis = t.w > lm;
            t.ice = t.w < o->icepop_lo || t.w > o->icepop_hi;
            acc_add(&all, &t);
            acc_add(&pos[bucket_pos(idx)], &t);
            if (fb) acc_add(&frq[fb[i]], &t);
            if (d->entropy) {
                double h = d->entropy[i];
                if (isfinite(h)) acc_add(&ent[bucket_ent(h)], &t);
                else rl->n_ent_missing++;
            }
            double wc = t.w < 1 / lt ? 1 / lt : (t.w > lt ? lt : t.w);
            wt += wc;
            wt2 += wc * wc;
            if (t.w < rl->w_min) rl->w_min = t.w;
            if (t.w > rl->w_max) rl->w_max = t.w;
            sa += d->a[i];
            sb += d->b[i];
            slw += t.lw;
            sqa += d->a[i];
            sqb += d->b[i];
            nq_used++;
        }
        if (!d->offsets || !nq_used) continue;
        double nn = (double)nq_used, S = clampc(slw, C), G = clampc(slw / nn, C);
        double ws = xent__exp(S);
        nsq++;
        ppl_a += exp(-sqa / nn);
        ppl_b += exp(-sqb / nn);
        lpd += (sqb - sqa) / nn;
        chi_s += expm1(2 * S);
        sq.w += ws;
        sq.w2 += ws * ws;
        ntis_s += ws > lt;
        nmis_s += ws > lm;
        nmis_g += xent__exp(G) > lm;
    }
    free(fb);
    acc_finish(&all, &rl->tok);
    for (int k = 0; k < XENT__CMP_NPOS; k++) acc_finish(&pos[k], &rl->pos[k]);
    for (int k = 0; k < XENT__CMP_NENT; k++) acc_finish(&ent[k], &rl->ent[k]);
    for (int k = 0; k < XENT__CMP_NFREQ; k++) acc_finish(&frq[k], &rl->freq[k]);
    double n = (double)all.n;
    rl->ppl_a = exp(-sa / n);
    rl->ppl_b = exp(-sb / n);
    rl->w_mean = all.w / n;
    rl->ess_trunc = wt2 > 0 ? wt * wt / (n * wt2) : NAN;
    rl->nseq = nsq;
    if (d->offsets && nsq) {
        double m = (double)nsq;
        rl->ppl_seq_a = ppl_a / m;
        rl->ppl_seq_b = ppl_b / m;
        rl->log_ppl_diff = lpd / m;
        rl->chi2_seq = chi_s / m;
        rl->ess_seq = sq.w2 > 0 ? sq.w * sq.w / (m * sq.w2) : NAN;
        rl->tis_seq = (double)ntis_s / m;
        rl->mis_seq = (double)nmis_s / m;
        rl->mis_geo = (double)nmis_g / m;
    } else {
        rl->ppl_seq_a = rl->ppl_seq_b = rl->log_ppl_diff = rl->chi2_seq = NAN;
        rl->ess_seq = rl->tis_seq = rl->mis_seq = rl->mis_geo = NAN;
    }
    return XENT_OK;
}
