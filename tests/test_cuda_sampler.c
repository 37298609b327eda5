/* tests/test_cuda_sampler.c: xent_cuda_sampler_logprobs against the CPU's
 * xent_sampler_logprobs on the same inputs. Each side is within 1 ulp of the
 * exact value (docs/sampler.md), so where neither flags its cut as near a
 * threshold the kept sets are the same and every output is within 2 ulp of
 * the CPU's. Skips (and says so) without a GPU. */
#include "harness.h"
#include "xent.h"

#ifdef XENT_WITH_CUDA
#include "cuda_harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double ulp32(double x) {
    float f = (float)fabs(x);
    return (double)nextafterf(f, INFINITY) - (double)f;
}

/* a and b agree within k ulp of b (both -inf, or both NaN, agree) */
static int near_ulp(float a, float b, double k) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs((double)a - (double)b) <= k * ulp32(b) + 1e-30;
}

typedef struct {
    double tau;
    int64_t k;
    double p, minp;
} sopts;

TEST(cuda_sampler_vs_cpu) {
    if (!gpu_ready()) return;
    const sopts cases[] = {{1.0, 0, 1.0, 0.0},   {0.7, 50, 1.0, 0.0},  {1.0, 0, 0.9, 0.0},
                           {1.3, 0, 1.0, 0.05},  {0.6, 20, 0.8, 0.02}, {2.0, 1, 1.0, 0.0},
                           {1.0, 0, 0.5, 0.1}};
    const int64_t Vs[] = {1, 7, 1000, 32000};
    const xent_dtype dts[] = {XENT_F32, XENT_BF16, XENT_F16};
    xt_rng_t *r = xt_rng();
    int compared = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int vi = 0; vi < 4; vi++)
            for (int di = 0; di < 3; di++) {
                const int64_t V = Vs[vi], T = 9;
                const xent_dtype dt = dts[di];
                const size_t es = xent_dtype_size(dt);
                unsigned char *h = malloc((size_t)(T * V) * es);
                int64_t lab[9];
                for (int64_t t = 0; t < T; t++) {
                    const double scale = t == 0 ? 0.0 : t < 4 ? 3.0 : 12.0; /* row 0 all equal */
                    for (int64_t j = 0; j < V; j++) {
                        const double z = scale * xt_normal(r);
                        const int64_t i = t * V + j;
                        if (dt == XENT_F32) ((float *)h)[i] = (float)z;
                        else if (dt == XENT_BF16) ((uint16_t *)h)[i] = xent_f64_to_bf16(z);
                        else ((uint16_t *)h)[i] = xent_f64_to_f16(z);
                    }
                    lab[t] = t == 5 ? -100 : xt_randint(r, V);
                }
                xent_ce_input in = {h, dt, T, V, 0, lab, XENT_I64, NULL};
                xent_sampler_opts o;
                xent_sampler_opts_init(&o);
                o.temperature = cases[ci].tau;
                o.top_k = cases[ci].k;
                o.top_p = cases[ci].p;
                o.min_p = cases[ci].minp;
                float lp[9], lpf[9], lkm[9], ent[9];
                int64_t kept[9], cnt[4];
                int32_t fl[9];
                xent_sampler_output co = {lp, lpf, kept, lkm, ent, fl, cnt, cnt + 1, cnt + 2, cnt + 3};
                xent_status s = xent_sampler_logprobs(&in, &o, &co);
                CHECK(s == XENT_OK, "CPU: %s", xent_last_error());
                void *dz = dev_copy(h, (size_t)(T * V) * es), *dl = dev_copy(lab, sizeof lab);
                float *d32 = dev_alloc(4 * 9 * 4);
                int64_t *dk = dev_alloc(8 * 9), *dc = dev_alloc(8 * 4);
                int32_t *df = dev_alloc(4 * 9);
                xent_ce_input gi = {dz, dt, T, V, 0, dl, XENT_I64, NULL};
                xent_sampler_output go = {d32, d32 + 9, dk, d32 + 18, d32 + 27, df,
                                          dc, dc + 1, dc + 2, dc + 3};
                s = xent_cuda_sampler_logprobs(&gi, &o, &go, NULL);
                CHECK(s == XENT_OK, "CUDA: %s", xent_last_error());
                float g32[36];
                int64_t gk[9], gc[4];
                int32_t gf[9];
                cudaDeviceSynchronize();
                host_copy(g32, d32, sizeof g32);
                host_copy(gk, dk, sizeof gk);
                host_copy(gc, dc, sizeof gc);
                host_copy(gf, df, sizeof gf);
                char what[160];
                for (int64_t t = 0; t < T && s == XENT_OK; t++) {
                    snprintf(what, sizeof what, "%s V=%lld tau %g k %lld p %g min_p %g row %lld",
                             xent_dtype_name(dt), (long long)V, o.temperature,
                             (long long)o.top_k, o.top_p, o.min_p, (long long)t);
                    const int near_mask = XENT_SAMPLER_MINP_NEAR | XENT_SAMPLER_TOPP_NEAR |
                                          XENT_SAMPLER_TOPP_TIE | XENT_SAMPLER_LABEL_AMBIGUOUS;
                    if ((fl[t] | gf[t]) & near_mask) continue; /* undecided cut: either side */
                    compared++;
                    CHECK(gk[t] == kept[t], "%s: kept %lld, CPU %lld", what, (long long)gk[t],
                          (long long)kept[t]);
                    CHECK(near_ulp(g32[t], lp[t], 2), "%s: logprob %.9g, CPU %.9g", what,
                          g32[t], lp[t]);
                    CHECK(near_ulp(g32[9 + t], lpf[t], 2), "%s: logprob_full %.9g, CPU %.9g",
                          what, g32[9 + t], lpf[t]);
                    CHECK(near_ulp(g32[18 + t], lkm[t], 2) || fabs(g32[18 + t] - lkm[t]) < 1e-12,
                          "%s: log kept mass %.9g, CPU %.9g", what, g32[18 + t], lkm[t]);
                    CHECK(near_ulp(g32[27 + t], ent[t], 2) || fabs(g32[27 + t] - ent[t]) < 1e-12,
                          "%s: entropy %.9g, CPU %.9g", what, g32[27 + t], ent[t]);
                }
                CHECK(s != XENT_OK || (gc[0] == cnt[0] && gc[3] == cnt[3]),
                      "counts: counted %lld/%lld nonfinite %lld/%lld", (long long)gc[0],
                      (long long)cnt[0], (long long)gc[3], (long long)cnt[3]);
                dev_free(dz); dev_free(dl); dev_free(d32); dev_free(dk); dev_free(dc);
                dev_free(df);
                free(h);
                CHECK_LIMIT(10);
            }
    CHECK(compared > 500, "only %d rows compared (the rest flagged near a cut)", compared);
    printf("    %d rows compared\n", compared);
}
#endif
