/* src/cpu/ce_isa_base.c: the baseline table (ce_kern.h): the generic loops
 * at the build's -march (x86-64: SSE2, fma() from libm; aarch64: armv8-a,
 * whose NEON and fused multiply-add are always there). */
#include "cpu/ce_kern_generic.h"

XENT__GEN_TABLE(xent__kern_base,
#if defined(__aarch64__)
                "baseline (armv8-a, neon)"
#else
                "baseline"
#endif
);
