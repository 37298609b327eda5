/* src/cuda/ce_kernels.h: the row kernel's parameters, shared by the kernels
 * (ce.cu) and the host entry points (ce_api.cu). */
#ifndef XENT_CUDA_CE_KERNELS_H
#define XENT_CUDA_CE_KERNELS_H

#include "xent.h"

#include <stdint.h>

/* FWD: outputs (and the gradient, if any); PART: shard statistics into
 * `partial`; BWD: the gradient from saved statistics; STAT: forward only,
 * each row's statistics into `rowstat` for xc_stat_kernel to finish. */
enum { XC_MODE_FWD = 0, XC_MODE_PART = 1, XC_MODE_BWD = 2, XC_MODE_STAT = 3 };

/* A row's statistics in 16 bytes (forward only, without entropy or label
 * smoothing, whose sums it leaves out): the same values as the
 * xent_ce_partial the row kernel would write, each exactly (max and target
 * are raw logits, so floats). Flags ride on NaN: max NaN, a non-finite
 * row (flags bit 1; then nothing else is read); target NaN, the row's
 * target was not seen (flags bit 0 clear). */
typedef struct xc_rowstat {
    double sum;   /* xent_ce_partial.sum */
    float max;    /* xent_ce_partial.max, or NaN */
    float target; /* xent_ce_partial.target, or NaN */
} xc_rowstat;

/* The reductions' accumulator, one a call (576 bytes, zeroed with the
 * label record): each row adds its loss exactly, as 32-bit digits of one
 * fixed-point number that spans every double (digit i weighs
 * 2^(32 i - XC_LA_BIAS)), each digit in a 64-bit counter so that carries
 * wait for the finish (fewer than 2^31 rows add at most 2^32 - 1 each).
 * Integer atomics: the sum does not depend on the order of the rows;
 * xc_reduce_kernel rounds it to double once (docs/cuda.md). */
#define XC_LA_DIGITS 68
#define XC_LA_BIAS 1088
typedef struct xc_long_acc {
    unsigned long long digit[XC_LA_DIGITS]; /* signed, two's complement      */
    unsigned long long counted;   /* rows with a target                    */
    unsigned long long nonfinite; /* rows with a NaN/inf logit (or a bad label) */
    unsigned int nan, inf_pos, inf_neg, pad; /* non-finite losses seen     */
} xc_long_acc;

/* Written by the label pass: the error to report as prio << 60 | (T - row) << 2 | kind
 * (0: none; kinds in ce.cu's xc_label_kernel) and the number of rows with
 * a target. */
typedef struct xc_label_rec {
    unsigned long long neg_first_bad;
    unsigned long long counted;
} xc_label_rec;

typedef struct xc_params {
    const void *logits;          /* [T, ld]                                */
    int64_t T, V, ld;
    int in_dtype;
    const void *labels;          /* [T] global ids, or NULL                */
    int labels64;
    int64_t ignore_index, vocab_start, vocab_total;
    double temperature, softcap, z_loss, eps, grad_scale, normalizer;
    double inv_tau, inv_cap;     /* 1 / temperature, 1 / softcap (or 0)   */
    int reduction;
    const float *grad_rows;      /* [T] or NULL                            */
    /* forward outputs, each may be NULL */
    float *loss_rows;            /* [T] (reduction NONE)                   */
    float *nll, *logprob, *lse, *entropy; /* [T]                           */
    xent_ce_stats *stats;        /* [T]                                    */
    xent_ce_partial *partial;    /* [T] (PART mode)                        */
    xc_rowstat *rowstat;         /* [T] forward only, no gradient, no extra:
                                    scratch for the rows' statistics (STAT
                                    mode, then xc_stat_kernel; xc_launch_rows) */
    xc_long_acc *acc;            /* the reductions' sums, or NULL; zeroed
                                    by xc_launch_labels                    */
    const xc_label_rec *rec;     /* label pass result (MEAN's count)       */
    /* gradient */
    void *grad;                  /* [T, ld_grad] or NULL                   */
    int64_t ld_grad;
    int grad_dtype;
    const xent_ce_stats *in_stats; /* [T] (backward mode)                  */
    /* combine: parts [S][T] */
    const xent_ce_partial *parts;
    int nshards;
    int mode;                    /* XC_MODE_*                              */
    int extra;                   /* entropy or label smoothing needed      */
    int unchecked;               /* labels were not validated              */
    int fast_f32;                /* fp32 logits may take the fast path
                                    (the fused LM head; xent_cuda_* calls
                                    keep fp32 logits on the precise path)  */
    int exact;                   /* pass 1 on the precise path for every
                                    dtype (xent_cuda_set_exact); a 16-bit
                                    gradient keeps the fast form          */
    int64_t stage_bytes;         /* shared memory kept for pass 2 (launch) */
    int gated;                   /* the host reads the label record after
                                    the row kernels are queued: every
                                    kernel that writes an output returns
                                    at once when rec reports a bad row
                                    (xc_gate), so nothing is written       */
    int skip_ignored;            /* no output asked reads an ignored row's
                                    logits (no lse, entropy, stats or
                                    n_nonfinite): the streaming kernel
                                    writes such rows' zeros (outputs and
                                    gradient) without reading the row      */
} xc_params;

/* Launchers (ce.cu). Each returns the launch's cudaError_t as an int. */
int xc_launch_rows(const xc_params *p, int block, void *stream);
/* The on-chip kernel (ce_cluster.cu), or -1 when it does not apply (other
 * dtypes or modes, softcap, an fp32 gradient, V too large). */
int xq_launch_rows(const xc_params *p, void *stream);
/* The on-chip kernel's plan takes rows of V columns (16-bit logits). */
int xq_takes(int64_t V);
/* The group kernel (ce_group.cu) for a forward call (with or without a
 * gradient; rows finished inside it) when XENT_CUDA_GROUP asks for it, or
 * -1 when it does not apply (not asked, other dtypes, modes or options, V
 * in the on-chip kernel's range, a GPU without bulk copies or cooperative
 * launches). */
int xg_launch_rows(const xc_params *p, void *stream);
/* The label pass into rec (zeroed first, with p->acc when set). */
int xc_launch_labels(const xc_params *p, xc_label_rec *rec, void *stream);
int xc_launch_combine(const xc_params *p, void *stream);
int xc_launch_reduce(const xc_params *p, float *loss, int64_t *n_counted,
                     int64_t *n_nonfinite, void *stream);

#endif
