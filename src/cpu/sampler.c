/* src/cpu/sampler.c: processed log-probs on the CPU (include/xent/sampler.h,
 * docs/sampler.md). One row at a time, rows spread over threads with
 * xent_parallel_for. No sort: every cut is a threshold on the value axis
 * (a monotone 32-bit key of the float logit), found by a radix selection
 * of 8 bits a pass: by count for top-k, by mass (compensated sums of the
 * exp terms) for top-p. A row reads its logits at most 12 times and takes
 * no heap memory. */
#include <stdatomic.h>

#include "cpu/sampler_row.h"

void xent_sampler_opts_init(xent_sampler_opts *o) {
    if (!o) return;
    o->temperature = 1.0;
    o->top_k = 0;
    o->top_p = 1.0;
    o->min_p = 0.0;
    o->ignore_index = -100;
    o->boundary_tol = 0.0;
    o->threads = 0;
}

xent_status xent__sampler_check(const xent_ce_input *in, const xent_sampler_opts *opts,
                                const xent_sampler_output *out, xent_sampler_opts *o) {
    if (!in) return xent_set_error(XENT_ERR_NULL, "input is NULL");
    if (!out) return xent_set_error(XENT_ERR_NULL, "output is NULL");
    if (opts) *o = *opts;
    else xent_sampler_opts_init(o);
    if (!(isfinite(o->temperature) && o->temperature > 0.0))
        return xent_set_error(XENT_ERR_VALUE, "opts.temperature = %g must be finite and > 0", o->temperature);
    if (o->top_k < 0)
        return xent_set_error(XENT_ERR_VALUE, "opts.top_k = %lld must be >= 0 (0 = off)", (long long)o->top_k);
    if (!(o->top_p > 0.0 && o->top_p <= 1.0))
        return xent_set_error(XENT_ERR_VALUE, "opts.top_p = %g is outside (0, 1] (1 = off)", o->top_p);
    if (!(o->min_p >= 0.0 && o->min_p < 1.0))
        return xent_set_error(XENT_ERR_VALUE, "opts.min_p = %g is outside [0, 1) (0 = off)", o->min_p);
    if (!(o->boundary_tol >= 0.0 && o->boundary_tol < 1.0))
        return xent_set_error(XENT_ERR_VALUE, "opts.boundary_tol = %g is outside [0, 1)", o->boundary_tol);
    if (o->threads < 0)
        return xent_set_error(XENT_ERR_VALUE, "opts.threads = %d must be >= 0 (0 = all cores)", o->threads);
    if (in->T < 0) return xent_set_error(XENT_ERR_SHAPE, "T = %lld must be >= 0", (long long)in->T);
    if (in->V <= 0) return xent_set_error(XENT_ERR_SHAPE, "V = %lld must be >= 1", (long long)in->V);
    if (in->ld != 0 && in->ld < in->V)
        return xent_set_error(XENT_ERR_SHAPE, "ld = %lld is smaller than V = %lld", (long long)in->ld, (long long)in->V);
    if (in->dtype != XENT_F32 && in->dtype != XENT_BF16 && in->dtype != XENT_F16)
        return xent_set_error(XENT_ERR_DTYPE, "logits dtype %s is not supported (f32, bf16, f16)", xent_dtype_name(in->dtype));
    if (in->T > 0 && !in->logits) return xent_set_error(XENT_ERR_NULL, "logits is NULL with T = %lld", (long long)in->T);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent_set_error(XENT_ERR_DTYPE, "labels dtype %s is not supported (i32, i64)", xent_dtype_name(in->label_dtype));
    return XENT_OK;
}

typedef struct sctx {
    const xent_ce_input *in;
    const xent_sampler_opts *o;
    const xent_sampler_output *out;
    xs_params p;
    int64_t ld;
    _Atomic int64_t n_counted, n_dropped, n_ambiguous, n_nonfinite;
} sctx;

#define XS_FN(n) n##_base
#include "cpu/sampler_kern.h"
#undef XS_FN

#if defined(__x86_64__) && defined(__GNUC__)
#define XS_HAVE_FMA 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define XS_FN(n) n##_fma
#include "cpu/sampler_kern.h"
#undef XS_FN
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

static void run_rows(void *vc, int64_t begin, int64_t end) {
    sctx *c = (sctx *)vc;
    int64_t cnt[4] = {0, 0, 0, 0};
#ifdef XS_HAVE_FMA
    /* the AVX2 + FMA copy where xent's CPU path says the CPU has them */
    if (xent_cpu_isa() != XENT_ISA_BASELINE) {
        for (int64_t i = begin; i < end; i++) do_row_fma(c, i, cnt);
    } else
#endif
        for (int64_t i = begin; i < end; i++) do_row_base(c, i, cnt);
    atomic_fetch_add(&c->n_counted, cnt[0]);
    atomic_fetch_add(&c->n_dropped, cnt[1]);
    atomic_fetch_add(&c->n_ambiguous, cnt[2]);
    atomic_fetch_add(&c->n_nonfinite, cnt[3]);
}

xent_status xent_sampler_logprobs(const xent_ce_input *in, const xent_sampler_opts *opts,
                                  xent_sampler_output *out) {
    xent_sampler_opts o;
    xent_status st = xent__sampler_check(in, opts, out, &o);
    if (st != XENT_OK) return st;
    if (in->labels) {
        for (int64_t r = 0; r < in->T; r++) {
            int64_t t = xent__label(in->labels, in->label_dtype, r);
            if (t == o.ignore_index) continue;
            if (t < 0 || t >= in->V)
                return xent_set_error(XENT_ERR_LABEL,
                                      "labels[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                                      (long long)r, (long long)t, (long long)in->V, (long long)o.ignore_index);
        }
    }
    sctx c;
    c.in = in;
    c.o = &o;
    c.out = out;
    c.ld = in->ld ? in->ld : in->V;
    c.p.tau = o.temperature;
    c.p.top_p = o.top_p;
    c.p.use_minp = o.min_p > 0.0;
    c.p.lnmp = c.p.use_minp ? log(o.min_p) : -INFINITY;
    c.p.tol_log = 2.0 * o.boundary_tol;
    c.p.tol_mass = XS_MASS_BOUND + 2.0 * o.boundary_tol;
    c.p.top_k = o.top_k >= in->V ? 0 : o.top_k;
    atomic_init(&c.n_counted, 0);
    atomic_init(&c.n_dropped, 0);
    atomic_init(&c.n_ambiguous, 0);
    atomic_init(&c.n_nonfinite, 0);
    if (in->T > 0) xent_parallel_for(in->T, xent_num_threads(o.threads), run_rows, &c);
    if (out->n_counted) *out->n_counted = atomic_load(&c.n_counted);
    if (out->n_dropped) *out->n_dropped = atomic_load(&c.n_dropped);
    if (out->n_ambiguous) *out->n_ambiguous = atomic_load(&c.n_ambiguous);
    if (out->n_nonfinite) *out->n_nonfinite = atomic_load(&c.n_nonfinite);
    return XENT_OK;
}
