/* src/model/precision.h: the precision policy the model runs under.
 * Every storage point of the forward and backward pass rounds to the dtype
 * the policy names (values are kept in fp32 arrays holding exactly
 * representable values of that dtype); matrix products accumulate in fp32,
 * as tensor cores do (a product of two bf16 or two fp16 numbers is exact in
 * fp32). The all-F32 policy is the reference. */
#ifndef XENT_MODEL_PRECISION_H
#define XENT_MODEL_PRECISION_H

#include "xent.h"
#include "audit/ce_forms.h"

typedef struct xent_precision {
    xent_dtype compute;      /* matmul inputs and outputs (F32/BF16/F16)    */
    xent_dtype residual;     /* residual stream storage                     */
    xent_dtype norm;         /* RMSNorm arithmetic and output               */
    xent_dtype attn_softmax; /* attention scores / probabilities storage    */
    xent_dtype lm_head;      /* LM-head matmul input dtype (F32: fp32 head) */
    xent_dtype logits;       /* dtype the logits are stored in              */
    xent_ce_form ce;         /* loss kernel: XENT_CE_EXACT or a common form */
    xent_dtype grad_accum;   /* parameter-gradient accumulation dtype       */
    int micro_batches;       /* >= 1: batch split, gradients accumulated    */
    double loss_scale;       /* 0 = auto (fp16: power of two from a
                                calibration pass), 1 = none                 */
} xent_precision;

/* All F32, exact CE, 1 micro-batch, loss scale 1. */
static inline xent_precision xent_precision_fp32(void) {
    xent_precision p = {XENT_F32, XENT_F32, XENT_F32, XENT_F32, XENT_F32,
                        XENT_F32, XENT_CE_EXACT, XENT_F32, 1, 1.0};
    return p;
}

/* Rounds x to the nearest value of dtype t (F32: identity), RNE. */
static inline float xent_round_to(float x, xent_dtype t) {
    if (t == XENT_BF16) return xent_bf16_to_f32(xent_f32_to_bf16(x));
#if defined(__FLT16_MAX__) && defined(__x86_64__) && defined(__F16C__)
    /* the hardware conversion rounds to nearest even, subnormals and
     * overflow included: equal to xent_f32_to_f16 (tests/test_core.c) */
    if (t == XENT_F16) return (float)(_Float16)x;
#else
    if (t == XENT_F16) return xent_f16_to_f32(xent_f32_to_f16(x));
#endif
    return x;
}

#endif
