/* src/cpu/ce_forms.h: faithful CPU emulations of the common cross-entropy
 * forms that lose precision (for `xent sweep` and the audit's `ce` policy).
 * Each works on one row of fp32 logits (already in the storage dtype the
 * emulated kernel reads) and writes the NLL and, if grad != NULL, dL/dz for
 * a unit upstream gradient, both as fp32. */
#ifndef XENT_CPU_CE_FORMS_H
#define XENT_CPU_CE_FORMS_H

#include <stdint.h>

typedef enum xent_ce_form {
    XENT_CE_EXACT = 0,       /* xent's exact kernel                          */
    XENT_CE_FP32_NAIVE,      /* fp32: nll = lse - z_t, grad_t = p_t - 1      */
    XENT_CE_BF16_LSE,        /* logsumexp stored in bf16, then z_t - lse     */
    XENT_CE_BF16_PROBS,      /* softmax stored in bf16 before p - 1          */
    XENT_CE_F16_PROBS,       /* softmax stored in fp16 before p - 1          */
    XENT_CE_BF16_LOGSOFTMAX, /* bf16 log_softmax with bf16 accumulation      */
    XENT_CE_FORM_COUNT
} xent_ce_form;

const char *xent__ce_form_name(xent_ce_form f); /* "exact", "fp32", ...    */
int xent__ce_form_parse(const char *s, xent_ce_form *out); /* 0 on success */

/* z: [V] logits of one row; t: target in [0, V). */
void xent__ce_form_row(xent_ce_form form, const float *z, int64_t V, int64_t t,
                       float *nll, float *grad /* [V] or NULL */);

#endif
