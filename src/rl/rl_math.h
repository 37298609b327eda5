/* src/rl/rl_math.h: the RL losses' scalar pieces, shared by the CPU
 * (src/rl) and CUDA (src/cuda/rl.cu) from the same text (XENT_HD,
 * src/core/xent_math.h), so both run the same operations in the same
 * order. expm1 is the platform's (the C library's on the host, CUDA's on
 * the device: each within 1 ulp; docs/rl.md). */
#ifndef XENT_RL_MATH_H
#define XENT_RL_MATH_H

#include "core/xent_math.h"

/* 1 when token t counts (mask NULL: every token). */
XENT_HD int xent__rl_counted(const uint8_t *mask, int64_t t) {
    return mask == NULL || mask[t] != 0;
}

/* x clamped to [-c, c]; *hit set to 1 when it was outside (+-inf too). */
XENT_HD double xent__rl_clamp(double x, double c, int *hit) {
    if (x > c) { *hit = 1; return c; }
    if (x < -c) { *hit = 1; return -c; }
    *hit = 0;
    return x;
}

/* a - b for log-probs where b (and a, for old vs sampler) may be -inf:
 * two equal values (two -inf too) give 0, never inf - inf = NaN. */
XENT_HD double xent__rl_logdiff(double a, double b) {
    return a == b ? 0.0 : a - b;
}

/* e^d - 1 - d without cancellation: for |d| < 1/2 the series
 * d^2 sum_{k=2..17} d^(k-2) / k! in Horner form (the first term left out,
 * d^18 / 18!, is below 2^-60 of the sum d^2/2 (1 + O(d))), else
 * expm1(d) - d, whose condition number is below 5 there. */
XENT_HD double xent__rl_k3(double d) {
    const double inv_fact[16] = { /* 1/k!, k = 2..17 */
        1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
        1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
        1.0 / 479001600, 1.0 / 6227020800.0, 1.0 / 87178291200.0,
        1.0 / 1307674368000.0, 1.0 / 20922789888000.0,
        1.0 / 355687428096000.0};
    if (!(fabs(d) < 0.5)) return expm1(d) - d;
    double p = inv_fact[15];
    for (int k = 14; k >= 0; k--) p = p * d + inv_fact[k];
    return p * d * d;
}

#endif
