/* src/model/core_dev.h: the model's whole forward and backward resident on
 * the GPU (xent_model_run_opts.gemm_device = 2, `xent audit --device cuda`;
 * src/model/core_cuda.cu, without CUDA src/model/gemm_stub.c), and its
 * memory plan (src/model/core_dev_plan.c, plain C, in every build).
 *
 * The device pass runs the same operations as core_impl.h in the same
 * order, with the precision policy's rounding at the same storage points;
 * only the matrix products (cuBLAS: bf16/f16 tensor-core products with fp32
 * accumulation when both operands hold values of that dtype, else fp32
 * with CUBLAS_COMPUTE_32F_PEDANTIC, no TF32) and the order of a few
 * reductions differ. The buffers mirror the CPU workspace (plan() in
 * core_impl.h): xdev_layout below is the one list both the allocation
 * (core_cuda.cu) and the plan (core_dev_plan.c) count. */
#ifndef XENT_MODEL_CORE_DEV_H
#define XENT_MODEL_CORE_DEV_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the memory plan (bytes on the device, per policy) ------------------ */

typedef struct xent_model_dev_plan {
    int64_t weights;     /* matrices in the compute dtype (2 bytes for bf16/
                            f16, 4 for f32), vectors in fp32, plus the head
                            in the lm_head dtype when it differs           */
    int64_t activations; /* what the forward keeps for the backward: layer
                            inputs and outputs, norms, q/k/v, attention
                            probabilities [B, nh, S, S] per layer, MLP, the
                            final norm, logits [T, V]                       */
    int64_t gradients;   /* parameter gradients (fp32, + a second set with
                            micro-batches), backward buffers (dx, dq, ...,
                            attention [B, nh, S, S], dlogits [T, V])       */
    int64_t record;      /* the recorded input gradients (record = 1)      */
    int64_t scratch;     /* 16-bit product operands, rounding scratch,
                            tokens, labels, RoPE tables                     */
    int64_t overhead;    /* cuBLAS and the cross-entropy's scratch pool:
                            a fixed allowance                              */
    int64_t total;       /* the sum                                        */
} xent_model_dev_plan;

/* The plan of a resident run of B x S tokens under policy p (record: the
 * recorded tensors kept). Plain arithmetic on the configuration, no CUDA.
 * XENT_ERR_SHAPE / XENT_ERR_VALUE on a bad config, shape or policy. */
xent_status xent_model_dev_plan_make(const xent_model_config *c, int64_t B, int64_t S,
                                     int record, const xent_precision *p,
                                     xent_model_dev_plan *out);
/* "weights 1.23 GiB, activations ..., total ..." into buf. */
void xent_model_dev_plan_str(const xent_model_dev_plan *pl, char *buf, size_t n);
/* XENT_OK when total <= free_bytes, else XENT_ERR_ALLOC with a message that
 * gives the plan and the card's free memory (of total_bytes). */
xent_status xent_model_dev_plan_fits(const xent_model_dev_plan *pl, uint64_t free_bytes,
                                     uint64_t total_bytes);
/* Free and total memory of the current CUDA device (XENT_ERR_UNSUPPORTED
 * without CUDA, XENT_ERR_CUDA without a device). */
xent_status xent_model_dev_mem(uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- the buffers: one list for the allocation and the plan -------------- */

enum { XD_ACT = 0, XD_GRAD = 1, XD_REC = 2, XD_SCR = 3, XD_NCAT = 4 };

typedef struct xdev_layer {
    float *xn1, *rms1, *q, *k, *v, *att, *ao, *h1, *xn2, *rms2, *gt, *up, *act;
    float *qpre, *kpre, *qn_r, *kn_r, *ao_o, *pan_r, *mo, *pfn_r, *attc;
} xdev_layer;

typedef struct xdev_bufs {
    float **x;         /* [L+1] -> [T, D] (x[0] embeddings) or NULL: count   */
    xdev_layer *ly;    /* [L] or NULL                                       */
    float *xnf, *rmsf, *logits, *dlogits; /* dlogits may equal logits       */
    float *dx, *dxb, *dq, *dk, *dv, *dao, *dh, *dh2, *dxn;
    float **rec_dx;    /* [L] or NULL (record = 0)                          */
    float *rec_dx0;
    float *datt;       /* [B, nh, S, S] attention-gradient scratch          */
    float *scr;        /* [T, D] the head's rounded input                   */
    float *wone;       /* [max(D, hd)] 1 + w of a (1 + w) norm              */
    void *st_a, *st_b; /* 16-bit operand staging (NULL when not planned)   */
    float *nll, *grow; /* [T] CE outputs / row weights                      */
    int32_t *tok, *lab;/* [T]                                               */
    float *rope;       /* [4, S, hd/2] cos, sin, cos_l, sin_l               */
    int32_t *flag;     /* [4] non-finite flag                               */
} xdev_bufs;

/* Points bufs into base (NULL: counts only; then bufs may be NULL) for a
 * workspace of Bfull rows, the per-token buffers offset to row b0 (the
 * micro-batch's view, as plan() in core_impl.h). need16: plan the 16-bit
 * staging. Adds each buffer's floats to cat[XD_*] when cat is non-NULL;
 * returns the total in floats (every buffer aligned to 64 floats). */
static inline int64_t xdev_layout(const xent_model_config *m, float *base, int64_t Bfull,
                                  int64_t b0, int64_t S, int record, int need16,
                                  xdev_bufs *bf, int64_t *cat) {
    int64_t L = m->n_layers, D = m->dim, H = m->hidden, V = m->vocab, nh = m->n_heads,
            hd = m->head_dim, qd = nh * hd, kvd = m->n_kv_heads * hd, Tf = Bfull * S,
            r0 = b0 * S, off = 0;
    int sep_dl = record || m->final_softcap > 0;
    int64_t mw = D > H ? D : H;
    mw = mw > qd ? mw : qd;
    int64_t att = Bfull * nh * S * S;
    int64_t sa = Tf * mw, sb = Tf * mw;
    sa = sa > Tf * V ? sa : Tf * V;
    sa = sa > att ? sa : att;
    sb = sb > att ? sb : att;
#define XD_TAKE(ptr, width, k)                                                          \
    do {                                                                                \
        if (base && bf) (ptr) = base + off + r0 * (width);                              \
        int64_t n_ = (Tf * (width) + 63) / 64 * 64;                                     \
        off += n_;                                                                      \
        if (cat) cat[k] += n_;                                                          \
    } while (0)
#define XD_FIXT(ptr, type, n, k)                                                        \
    do {                                                                                \
        if (base && bf) (ptr) = (type)(void *)(base + off);                             \
        int64_t n_ = ((n) + 63) / 64 * 64;                                              \
        off += n_;                                                                      \
        if (cat) cat[k] += n_;                                                          \
    } while (0)
#define XD_FIX(ptr, n, k) XD_FIXT(ptr, float *, n, k)
    for (int64_t l = 0; l <= L; l++) XD_TAKE(bf->x[l], D, XD_ACT);
    for (int64_t l = 0; l < L; l++) {
        xdev_layer *y = bf ? &bf->ly[l] : NULL;
        if (y) {
            y->qpre = y->kpre = y->qn_r = y->kn_r = NULL;
            y->ao_o = y->pan_r = y->mo = y->pfn_r = y->attc = NULL;
        }
        XD_TAKE(y->xn1, D, XD_ACT);
        XD_TAKE(y->rms1, 1, XD_ACT);
        XD_TAKE(y->q, qd, XD_ACT);
        XD_TAKE(y->k, kvd, XD_ACT);
        XD_TAKE(y->v, kvd, XD_ACT);
        XD_TAKE(y->att, nh * S, XD_ACT);
        XD_TAKE(y->ao, qd, XD_ACT);
        XD_TAKE(y->h1, D, XD_ACT);
        XD_TAKE(y->xn2, D, XD_ACT);
        XD_TAKE(y->rms2, 1, XD_ACT);
        XD_TAKE(y->gt, H, XD_ACT);
        XD_TAKE(y->up, H, XD_ACT);
        XD_TAKE(y->act, H, XD_ACT);
        if (m->qk_norm) {
            XD_TAKE(y->qpre, qd, XD_ACT);
            XD_TAKE(y->kpre, kvd, XD_ACT);
            XD_TAKE(y->qn_r, nh, XD_ACT);
            XD_TAKE(y->kn_r, m->n_kv_heads, XD_ACT);
        }
        if (m->sandwich_norm) {
            XD_TAKE(y->ao_o, D, XD_ACT);
            XD_TAKE(y->pan_r, 1, XD_ACT);
            XD_TAKE(y->mo, D, XD_ACT);
            XD_TAKE(y->pfn_r, 1, XD_ACT);
        }
        if (m->attn_softcap > 0) XD_TAKE(y->attc, nh * S, XD_ACT);
    }
    XD_TAKE(bf->xnf, D, XD_ACT);
    XD_TAKE(bf->rmsf, 1, XD_ACT);
    XD_TAKE(bf->logits, V, XD_ACT);
    if (sep_dl) XD_TAKE(bf->dlogits, V, XD_GRAD);
    else if (base && bf) bf->dlogits = bf->logits;
    XD_TAKE(bf->dx, D, XD_GRAD);
    XD_TAKE(bf->dxb, D, XD_GRAD);
    XD_TAKE(bf->dq, qd, XD_GRAD);
    XD_TAKE(bf->dk, kvd, XD_GRAD);
    XD_TAKE(bf->dv, kvd, XD_GRAD);
    XD_TAKE(bf->dao, qd, XD_GRAD);
    XD_TAKE(bf->dh, H, XD_GRAD);
    XD_TAKE(bf->dh2, H, XD_GRAD);
    XD_TAKE(bf->dxn, D, XD_GRAD);
    if (record) {
        for (int64_t l = 0; l < L; l++) XD_TAKE(bf->rec_dx[l], D, XD_REC);
        XD_TAKE(bf->rec_dx0, D, XD_REC);
    } else if (base && bf) {
        bf->rec_dx0 = NULL;
    }
    XD_TAKE(bf->nll, 1, XD_SCR);
    XD_TAKE(bf->grow, 1, XD_SCR);
    XD_FIXT(bf->tok, int32_t *, Tf, XD_SCR); /* full batch; views offset by the caller */
    XD_FIXT(bf->lab, int32_t *, Tf, XD_SCR);
    XD_FIX(bf->datt, att, XD_GRAD);
    XD_FIX(bf->scr, Tf * D, XD_SCR);
    XD_FIX(bf->wone, D > hd ? D : hd, XD_SCR);
    XD_FIX(bf->rope, 2 * S * hd, XD_SCR);
    XD_FIXT(bf->flag, int32_t *, 4, XD_SCR);
    if (need16) { /* 16-bit elements: half as many floats */
        XD_FIXT(bf->st_a, void *, (sa + 1) / 2, XD_SCR);
        XD_FIXT(bf->st_b, void *, (sb + 1) / 2, XD_SCR);
    } else if (base && bf) {
        bf->st_a = bf->st_b = NULL;
    }
#undef XD_TAKE
#undef XD_FIX
#undef XD_FIXT
    return off;
}

/* ---- the run ------------------------------------------------------------ */

/* What the host driver (core_f32.c) hands the device pass: the resolved
 * targets, the RoPE tables, and where the results go on the host. */
typedef struct xent__dev_io {
    const int32_t *lab;  /* [T] targets (-100 ignored)                     */
    const double *rw;    /* [T] dL/d(nll_t) (unscaled)                     */
    const float *rope;   /* [4, S, hd/2]: cos, sin, sliding cos, sliding sin*/
    float *grads;        /* [n_weights] parameter gradients out (unscaled) */
    float *logprob;      /* [T] out                                        */
    /* record = 1 (else NULL): the full-batch arrays of the host workspace */
    float **x;           /* [L+1] -> [T, D]                                */
    float *xnf, *logits, *dlogits; /* dlogits: scaled, as the CPU leaves it */
    float **rec_dx;      /* [L] -> [T, D] (scaled)                          */
    float *rec_dx0;
} xent__dev_io;

/* One resident forward (+ backward) with the loss-scale retries of the CPU
 * driver; *state is the workspace's device state (created on first use,
 * freed by xent__model_dev_free). ws_B, ws_S, ws_record: the workspace's
 * planned shape. *loss, *ls: the loss and the loss scale used. */
xent_status xent__model_run_dev(const xent_model *m, void **state, int64_t ws_B, int64_t ws_S,
                                int ws_record, const xent_precision *p,
                                const xent_model_run_opts *o, const xent__dev_io *io,
                                double *loss, double *ls);
void xent__model_dev_free(void *state);

#ifdef __cplusplus
}
#endif
#endif
