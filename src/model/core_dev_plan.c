/* src/model/core_dev_plan.c: the device memory plan of a resident run
 * (src/model/core_dev.h): plain arithmetic on the configuration, in every
 * build (the audit prints it before a --device cuda run; tests check it on
 * the CPU). */
#include "model/core_dev.h"
#include "model/model_internal.h"

#include <stdio.h>
#include <string.h>

static int64_t dt_bytes(xent_dtype t) { return t == XENT_F32 ? 4 : 2; }

/* Allowance for cuBLAS's workspace, the cross-entropy's scratch pool (up
 * to 64 MiB kept) and the weight upload buffer's rounding. */
#define XD_OVERHEAD ((int64_t)160 << 20)

xent_status xent_model_dev_plan_make(const xent_model_config *c, int64_t B, int64_t S,
                                     int record, const xent_precision *p,
                                     xent_model_dev_plan *out) {
    if (!c || !p || !out) return xent_set_error(XENT_ERR_NULL, "device plan: NULL argument");
    xent_status st = xent_model_config_check(c);
    if (st) return st;
    if (B <= 0 || S <= 0 || B > ((int64_t)1 << 30) / S)
        return xent_set_error(XENT_ERR_SHAPE, "device plan: B = %lld, S = %lld", (long long)B,
                              (long long)S);
    if (p->micro_batches < 1 || B % p->micro_batches)
        return xent_set_error(XENT_ERR_SHAPE,
                              "device plan: micro_batches = %d does not divide B = %lld",
                              p->micro_batches, (long long)B);
    int64_t L = c->n_layers, D = c->dim, H = c->hidden, V = c->vocab, hd = c->head_dim,
            qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    /* parameters: matrices and vectors (xent__model_layout's list) */
    int64_t mat = V * D + (c->tied_head ? 0 : V * D), vec = D;
    for (int64_t l = 0; l < L; l++) {
        mat += qd * D + 2 * kvd * D + D * qd + 3 * H * D;
        vec += 2 * D;
        if (c->qkv_bias) vec += qd + 2 * kvd;
        if (c->qk_norm) vec += 2 * hd;
        if (c->sandwich_norm) vec += 2 * D;
    }
    memset(out, 0, sizeof *out);
    out->weights = mat * dt_bytes(p->compute) + vec * 4;
    if (p->lm_head != p->compute) out->weights += V * D * dt_bytes(p->lm_head);
    int64_t nw = mat + vec;
    int need16 = p->compute != XENT_F32 || p->lm_head != XENT_F32;
    int64_t cat[XD_NCAT] = {0, 0, 0, 0};
    xdev_layout(c, NULL, B, 0, S, record != 0, need16, NULL, cat);
    out->activations = cat[XD_ACT] * 4;
    out->gradients = cat[XD_GRAD] * 4 + nw * 4 + (p->micro_batches > 1 ? nw * 4 : 0);
    out->record = cat[XD_REC] * 4;
    /* the weight upload buffer: the largest parameter in fp32 */
    int64_t big = V * D > H * D ? V * D : H * D;
    out->scratch = cat[XD_SCR] * 4 + big * 4;
    out->overhead = XD_OVERHEAD;
    out->total = out->weights + out->activations + out->gradients + out->record + out->scratch +
                 out->overhead;
    return XENT_OK;
}

static void human(int64_t b, char *buf, size_t n) {
    double x = (double)b;
    if (x >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", x / (1024.0 * 1024 * 1024));
    else if (x >= 1024.0 * 1024) snprintf(buf, n, "%.1f MiB", x / (1024.0 * 1024));
    else snprintf(buf, n, "%.1f KiB", x / 1024.0);
}

void xent_model_dev_plan_str(const xent_model_dev_plan *pl, char *buf, size_t n) {
    char w[32], a[32], g[32], r[32], s[32], o[32], t[32];
    human(pl->weights, w, sizeof w);
    human(pl->activations, a, sizeof a);
    human(pl->gradients, g, sizeof g);
    human(pl->record, r, sizeof r);
    human(pl->scratch, s, sizeof s);
    human(pl->overhead, o, sizeof o);
    human(pl->total, t, sizeof t);
    snprintf(buf, n,
             "weights %s, activations %s, gradients %s, record %s, scratch %s, "
             "overhead %s: total %s",
             w, a, g, r, s, o, t);
}

xent_status xent_model_dev_plan_fits(const xent_model_dev_plan *pl, uint64_t free_bytes,
                                     uint64_t total_bytes) {
    if (!pl) return xent_set_error(XENT_ERR_NULL, "device plan: NULL");
    if (pl->total >= 0 && (uint64_t)pl->total <= free_bytes) return XENT_OK;
    char line[400], f[32], t[32];
    xent_model_dev_plan_str(pl, line, sizeof line);
    human((int64_t)free_bytes, f, sizeof f);
    human((int64_t)total_bytes, t, sizeof t);
    return xent_set_error(XENT_ERR_ALLOC,
                          "--device cuda: the resident pass does not fit the GPU: needs %s; "
                          "the card has %s free of %s (layer-by-layer streaming is not "
                          "implemented: use a smaller --batch/--seq-len, --device cuda-gemm "
                          "or --device cpu)",
                          line, f, t);
}
