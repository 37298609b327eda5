/* src/cuda/ce_kernels.h: the row kernel's parameters, shared by the kernels
 * (ce_stream.cu) and the host entry points (ce_api.cu). */
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
 * (0: none; kinds in ce_stream.cu's xc_label_kernel) and the number of rows with
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

/* ------------------------------------------------------------------ */
/* Kernel selection (select.cu): the one place where a call's row      */
/* kernel and its launch parameters are chosen, from the shape, the    */
/* options and the thread's plan (xent_cuda_set_plan).                 */
/* ------------------------------------------------------------------ */

#define XQ_MAX_NT 256          /* on-chip kernel: most threads a block       */
#define XQ_SLICE_BYTES 65536   /* on-chip kernel: slices up to 64 KiB (three
                                  blocks a multiprocessor)                   */
#define XQ_DEFAULT_MAX_V 16384 /* the on-chip kernel's largest V by default */

/* The on-chip kernel's launch: cluster size C, block size NT, 16-byte
 * chunks a slice P, and at most G clusters (0: as many as fit). */
struct xq_plan_t {
    int C, NT, P;
    int G;
};

enum { XC_K_STREAM = 1, XC_K_ONCHIP = 2 };

/* The row kernel of one launch. */
struct xc_choice {
    int kernel;   /* XC_K_*                                               */
    int fast;     /* the fast path (fp32 lanes, hardware exp2) applies    */
    int block;    /* streaming kernel: threads a block                    */
    xq_plan_t oc; /* on-chip kernel: its launch (kernel == XC_K_ONCHIP)   */
};

/* The row kernel for p (its mode, dtypes, options and V). */
xc_choice xc_choose_rows(const xc_params *p);
/* Streaming kernel: threads a block for V columns (a function of V alone,
 * so that every call on a row sums in the same order). */
int xc_block(int64_t V);
/* Streaming kernel with a gradient: shared memory (bytes) a block of
 * `block` threads keeps of its row between the passes (wide: fp32 logits). */
int xc_stage_bytes(int block, int wide);
/* Fused LM head: logits rows a chunk when gradients are made. */
int64_t xc_linear_rows(void);

/* Launchers. Each returns the launch's cudaError_t as an int. The row
 * kernels of a call, as xc_choose_rows picks them (ce_stream.cu). */
int xc_launch_rows(const xc_params *p, void *stream);
/* The on-chip kernel (ce_onchip.cu) under plan pl. */
int xq_launch_rows(const xc_params *p, const xq_plan_t *pl, void *stream);
/* The label pass into rec (zeroed first, with p->acc when set). */
int xc_launch_labels(const xc_params *p, xc_label_rec *rec, void *stream);
int xc_launch_combine(const xc_params *p, void *stream);
int xc_launch_reduce(const xc_params *p, float *loss, int64_t *n_counted,
                     int64_t *n_nonfinite, void *stream);

#endif
