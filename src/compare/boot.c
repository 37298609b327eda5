/* src/compare/boot.c: seeded bootstrap of mean delta, RMS delta and the two
 * clip fractions over units (sequences, or blocks of tokens).
 *
 * One resample draws nu units uniformly with replacement (the multinomial
 * over units) and adds up their sufficient statistics (tokens, sum d,
 * sum d^2, clipped counts): no array is copied, the cost is O(nu) per
 * resample. Resample b uses its own generator seeded from (seed, b), so the
 * result does not depend on the number of threads. The 95% interval is the
 * 2.5% and 97.5% quantiles (linear interpolation) of the resampled values. */
#include "compare/compare.h"

#include <stdlib.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct { uint64_t s[4]; } rng4;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro(rng4 *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static void rng_seed(rng4 *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

/* Uniform index in [0, n) by Lemire's multiply-shift with rejection. */
static uint64_t below(rng4 *r, uint64_t n) {
    unsigned __int128 m = (unsigned __int128)xoshiro(r) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t t = -n % n;
        while (lo < t) {
            m = (unsigned __int128)xoshiro(r) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

typedef struct {
    const xent__cmp_unit *u;
    int64_t nu;
    uint64_t seed;
    double *mean, *rms, *cr, *cl; /* [B] each */
} boot_ctx;

static void boot_range(void *vctx, int64_t b0, int64_t b1) {
    boot_ctx *c = vctx;
    for (int64_t b = b0; b < b1; b++) {
        rng4 r;
        rng_seed(&r, c->seed, (uint64_t)b + 1);
        double n = 0, s = 0, s2 = 0, cr = 0, cl = 0;
        for (int64_t j = 0; j < c->nu; j++) {
            const xent__cmp_unit *x = &c->u[below(&r, (uint64_t)c->nu)];
            n += x->n; s += x->s; s2 += x->s2; cr += x->cr; cl += x->cl;
        }
        c->mean[b] = n > 0 ? s / n : NAN;
        c->rms[b] = n > 0 ? sqrt(s2 / n) : NAN;
        c->cr[b] = n > 0 ? cr / n : NAN;
        c->cl[b] = n > 0 ? cl / n : NAN;
    }
}

/* Drops NaN (resamples that drew only empty units), then the interval. */
static xent__cmp_ci interval(double *v, int64_t B) {
    int64_t m = 0;
    for (int64_t i = 0; i < B; i++) if (v[i] == v[i]) v[m++] = v[i];
    const double lv[2] = {0.025, 0.975};
    double q[2];
    xent__cmp_quantiles(v, m, lv, 2, q);
    return (xent__cmp_ci){q[0], q[1]};
}

void xent__cmp_bootstrap(const xent__cmp_unit *u, int64_t nu, int64_t B,
                         uint64_t seed, int threads, xent__cmp_result *res) {
    res->boot_n = 0;
    res->ci_mean = res->ci_rms = res->ci_clip_ratio = res->ci_clip_log =
        (xent__cmp_ci){NAN, NAN};
    if (B <= 0 || nu <= 0) return;
    double *buf = malloc((size_t)B * 4 * sizeof *buf); /* [4, B] */
    if (!buf) return;
    boot_ctx c = {u, nu, seed, buf, buf + B, buf + 2 * B, buf + 3 * B};
    xent_parallel_for(B, threads, boot_range, &c);
    res->ci_mean = interval(c.mean, B);
    res->ci_rms = interval(c.rms, B);
    res->ci_clip_ratio = interval(c.cr, B);
    res->ci_clip_log = interval(c.cl, B);
    res->boot_n = B;
    free(buf);
}
