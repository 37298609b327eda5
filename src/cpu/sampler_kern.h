/* src/cpu/sampler_kern.h: the row loop of src/cpu/sampler.c, included
 * twice there: for the build's baseline and (x86-64) under
 * target("avx2,fma"), where fma() and nearbyint() of xent__exp become
 * instructions instead of libm calls. Same C text, and fma / nearbyint are
 * exact operations, so both give the same bits. XS_FN(name) names the copy.
 * Needs sctx (src/cpu/sampler.c). */
/* The row being worked on. */
#ifndef XS_SROW_DEFINED
#define XS_SROW_DEFINED
typedef struct srow {
    const void *z;
    xent_dtype t;
    int64_t V;
    float zmax;
    uint32_t kmax;
    const xs_params *p;
} srow;
#endif

static inline float XS_FN(ld_z)(const srow *r, int64_t j) { return xent__load(r->z, r->t, j); }

/* exp(x_j - max x) of a column (exactly 1 at the max). */
static inline double XS_FN(term)(const srow *r, float z) {
    return z == r->zmax ? 1.0 : xent__exp(xs_d(z, r->zmax, r->p->tau));
}

/* The k-th largest key among the columns with key >= lo (k >= 1 and at
 * most their count): 4 passes of 8-bit counts. */
static uint32_t XS_FN(select_count)(const srow *r, uint32_t lo, int64_t k) {
    uint32_t prefix = 0, mask = 0;
    int64_t need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t cnt[256];
        memset(cnt, 0, sizeof cnt);
        for (int64_t j = 0; j < r->V; j++) {
            uint32_t key = xs_key(XS_FN(ld_z)(r, j));
            if (key < lo || (key & mask) != prefix) continue;
            cnt[(key >> shift) & 255u]++;
        }
        int b = 255;
        for (; b > 0; b--) {
            if (need <= cnt[b]) break;
            need -= cnt[b];
        }
        prefix |= (uint32_t)b << shift;
        mask |= 255u << shift;
    }
    return prefix;
}

/* The largest key v among the columns with key >= lo such that the mass of
 * those with key >= v is >= target: 4 passes of 8-bit mass histograms.
 * Where rounding leaves the target unreached, the lowest key (the caller's
 * last check flags it). */
static uint32_t XS_FN(select_mass)(const srow *r, uint32_t lo, double target) {
    uint32_t prefix = 0, mask = 0;
    xs_sum above = {0.0, 0.0};
    for (int shift = 24; shift >= 0; shift -= 8) {
        xs_sum bin[256];
        int64_t cnt[256];
        memset(bin, 0, sizeof bin);
        memset(cnt, 0, sizeof cnt);
        for (int64_t j = 0; j < r->V; j++) {
            float z = XS_FN(ld_z)(r, j);
            uint32_t key = xs_key(z);
            if (key < lo || (key & mask) != prefix) continue;
            unsigned b = (key >> shift) & 255u;
            cnt[b]++;
            xs_add(&bin[b], XS_FN(term)(r, z));
        }
        int chosen = -1, last = -1;
        xs_sum above_last = above;
        for (int b = 255; b >= 0; b--) {
            if (!cnt[b]) continue;
            xs_sum t = above;
            xs_merge(&t, bin[b]);
            if (xs_val(t) >= target) {
                chosen = b;
                break;
            }
            last = b;
            above_last = above;
            above = t;
        }
        if (chosen < 0) {
            chosen = last;
            above = above_last;
        }
        prefix |= (uint32_t)chosen << shift;
        mask |= 255u << shift;
    }
    return prefix;
}

static void XS_FN(do_row)(sctx *c, int64_t i, int64_t *cnt) {
    const xent_ce_input *in = c->in;
    const xent_sampler_output *out = c->out;
    const xs_params *p = &c->p;
    srow r;
    r.z = (const char *)in->logits + (size_t)(i * c->ld) * xent_dtype_size(in->dtype);
    r.t = in->dtype;
    r.V = in->V;
    r.p = p;
    int64_t lab = in->labels ? xent__label(in->labels, in->label_dtype, i) : c->o->ignore_index;
    int counted = lab != c->o->ignore_index;
    if (counted) cnt[0]++;

    /* pass 1: the max, and non-finite logits */
    float zmax = -INFINITY;
    int bad = 0;
    for (int64_t j = 0; j < r.V; j++) {
        float z = XS_FN(ld_z)(&r, j);
        if (!isfinite(z)) bad = 1;
        if (z > zmax) zmax = z;
    }
    if (bad) {
        cnt[3]++;
        if (out->logprob) out->logprob[i] = counted ? NAN : 0.0f;
        if (out->logprob_full) out->logprob_full[i] = counted ? NAN : 0.0f;
        if (out->kept) out->kept[i] = 0;
        if (out->log_kept_mass) out->log_kept_mass[i] = NAN;
        if (out->entropy) out->entropy[i] = NAN;
        if (out->flags) out->flags[i] = 0;
        return;
    }
    r.zmax = zmax;
    r.kmax = xs_key(zmax);
    int flags = 0, lab_amb = 0;

    /* pass 2: the full mass, min-p's set (an upper set: key >= kmp) */
    xs_sum Sall = {0.0, 0.0}, Smp = {0.0, 0.0};
    int64_t gall = 0, nmp = 0;
    uint32_t kmp = r.kmax;
    for (int64_t j = 0; j < r.V; j++) {
        float z = XS_FN(ld_z)(&r, j);
        double d = xs_d(z, zmax, p->tau);
        if (z == zmax) gall++;
        else xs_add(&Sall, xent__exp(d));
        if (xs_minp_keep(p, d)) {
            nmp++;
            if (z != zmax) xs_add(&Smp, xent__exp(d));
            uint32_t key = xs_key(z);
            if (key < kmp) kmp = key;
        }
        if (xs_minp_near(p, d)) {
            flags |= XENT_SAMPLER_MINP_NEAR;
            if (counted && j == lab) lab_amb = 1;
        }
    }

    /* top-k: the top_k-th largest value of min-p's set */
    uint32_t k1 = kmp;
    int64_t n1 = nmp;
    double S1o = xs_val(Smp); /* mass of the set so far, without the max columns */
    if (p->top_k > 0 && p->top_k < nmp) {
        k1 = XS_FN(select_count)(&r, kmp, p->top_k);
        xs_sum s = {0.0, 0.0};
        n1 = 0;
        for (int64_t j = 0; j < r.V; j++) {
            float z = XS_FN(ld_z)(&r, j);
            if (xs_key(z) < k1) continue;
            n1++;
            if (z != zmax) xs_add(&s, xent__exp(xs_d(z, zmax, p->tau)));
        }
        S1o = xs_val(s);
        if (n1 > p->top_k) flags |= XENT_SAMPLER_TOPK_TIE;
    }

    /* top-p: the boundary value v*, then the last pass */
    int topp = p->top_p < 1.0;
    double S1 = (double)gall + S1o;
    double target = p->top_p * S1;
    uint32_t vstar = topp ? XS_FN(select_mass)(&r, k1, target) : k1;
    xs_row s;
    memset(&s, 0, sizeof s);
    s.gall = gall;
    s.Sall = xs_val(Sall);
    xs_sum Sk = {0.0, 0.0}, Ak = {0.0, 0.0}, R = {0.0, 0.0};
    int64_t g = 0, cmax_gt = 0, nkept = 0, have_next = 0;
    uint32_t vnext = 0;
    float zstar = zmax;
    for (int64_t j = 0; j < r.V; j++) {
        float z = XS_FN(ld_z)(&r, j);
        uint32_t key = xs_key(z);
        double d = xs_d(z, zmax, p->tau);
        double e = z == zmax ? 1.0 : xent__exp(d);
        if (key < k1 || (topp && key < vstar)) {
            xs_add(&R, e);
            if (key >= k1 && (!have_next || key > vnext)) {
                vnext = key;
                have_next = 1;
            }
            continue;
        }
        if (topp && key == vstar) {
            g++;
            zstar = z;
            continue;
        }
        nkept++;
        if (z == zmax) cmax_gt++;
        else {
            xs_add(&Sk, e);
            xs_add(&Ak, e * -d);
        }
    }
    int64_t cg = 0;
    if (topp) {
        double w = zstar == zmax ? 1.0 : xent__exp(xs_d(zstar, zmax, p->tau));
        double dstar = xs_d(zstar, zmax, p->tau);
        double Mgt = (double)cmax_gt + xs_val(Sk);
        int near = 0;
        cg = xs_topp_count(Mgt, w, g, target, S1, p->tol_mass, &near);
        if (near) flags |= XENT_SAMPLER_TOPP_NEAR;
        if (cg < g) flags |= XENT_SAMPLER_TOPP_TIE;
        if (vstar == r.kmax) {
            cmax_gt += cg;
            xs_add(&R, (double)(g - cg));
        } else {
            xs_add(&Sk, (double)cg * w);
            xs_add(&Ak, ((double)cg * w) * -dstar);
            xs_add(&R, (double)(g - cg) * w);
        }
        nkept += cg;
        if (counted) {
            uint32_t kt = xs_key(XS_FN(ld_z)(&r, lab));
            if (kt == vstar && cg < g) lab_amb = 1;
            if (near && (kt == vstar || (have_next && kt == vnext))) lab_amb = 1;
        }
    }
    s.cmax = cmax_gt;
    s.kept = nkept;
    s.Sk = xs_val(Sk);
    s.Ak = xs_val(Ak);
    s.R = xs_val(R);
    xs_out o = xs_finish(&s);

    if (counted) {
        float zt = XS_FN(ld_z)(&r, lab);
        uint32_t kt = xs_key(zt);
        double dt = xs_d(zt, zmax, p->tau);
        int kept_t = topp ? kt >= vstar : kt >= k1;
        if (!kept_t) cnt[1]++;
        if (lab_amb) flags |= XENT_SAMPLER_LABEL_AMBIGUOUS;
        if (out->logprob) out->logprob[i] = kept_t ? (float)(dt - o.L) : -INFINITY;
        if (out->logprob_full) out->logprob_full[i] = (float)(dt - o.Lall);
    } else {
        if (out->logprob) out->logprob[i] = 0.0f;
        if (out->logprob_full) out->logprob_full[i] = 0.0f;
    }
    if (flags & (XENT_SAMPLER_MINP_NEAR | XENT_SAMPLER_TOPP_NEAR | XENT_SAMPLER_TOPP_TIE)) cnt[2]++;
    if (out->kept) out->kept[i] = s.kept;
    if (out->log_kept_mass) out->log_kept_mass[i] = (float)o.log_kept;
    if (out->entropy) out->entropy[i] = (float)o.entropy;
    if (out->flags) out->flags[i] = flags;
}

