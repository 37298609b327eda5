/* src/cpu/ce_isa_avx2.c: the generic loops (ce_kern_generic.h) compiled for
 * AVX2 + FMA + F16C, whatever the build's -march; used only when cpuid
 * reports them (src/cpu/ce.c). Same C text, so the same bits. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#endif

#include "cpu/ce_kern_generic.h"

XENT__GEN_TABLE(xent__kern_avx2, "avx2");

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int xent__no_avx2; /* not x86-64: nothing to build */
#endif
