/* bench/plain_ce.h: the anchor of `xent bench` for "what exactness costs":
 * a plain, vectorised fp32 cross-entropy (max, sum of exp, lse, gradient
 * softmax - onehot scaled for a mean), the way a hand-written fast kernel
 * does it, with a polynomial expf that the compiler vectorises. Not exact
 * (it has the fp32 dead zone of docs/numerics.md section 5) and not part of
 * the library: tools/cmd_bench.c includes it. The body (plain_ce_body.h) is
 * compiled at -O3 for AVX-512, AVX2 + FMA and the baseline, and
 * plain_row_bf16 picks the best this CPU has, so the anchor gets this
 * machine's vectors from the same portable binary as xent's kernels. */
#ifndef XENT_BENCH_PLAIN_CE_H
#define XENT_BENCH_PLAIN_CE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define PLAIN_BLOCK 1024

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3")
#endif

#define PLAIN_FN(x) plain_base_##x
#include "plain_ce_body.h"
#undef PLAIN_FN

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PLAIN_X86 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#define PLAIN_FN(x) plain_avx2_##x
#include "plain_ce_body.h"
#undef PLAIN_FN
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
#define PLAIN_FN(x) plain_avx512_##x
#include "plain_ce_body.h"
#undef PLAIN_FN
#pragma GCC pop_options
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* One bf16 row: returns its nll (lse - z_t), 0 for t < 0; grad (bf16, may
 * be NULL) = scale (softmax - onehot), zeros for t < 0. */
static float plain_row_bf16(const uint16_t *z, int64_t V, int64_t t, float scale, uint16_t *grad) {
#ifdef PLAIN_X86
    static int isa = -1;
    if (isa < 0) {
        __builtin_cpu_init();
        isa = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") ? 2
              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")      ? 1
                                                                                      : 0;
    }
    if (isa == 2) return plain_avx512_row(z, V, t, scale, grad);
    if (isa == 1) return plain_avx2_row(z, V, t, scale, grad);
#endif
    return plain_base_row(z, V, t, scale, grad);
}

#endif
