/* src/cuda/select.cu: kernel selection, in one place. Every CUDA
 * cross-entropy call (xent_cuda_ce, _logprobs, _ce_backward,
 * _ce_shard_stats and the fused LM head's row kernels) takes its row kernel
 * and launch parameters from these functions, which read the shape, the
 * options and the thread's plan (xent_cuda_set_plan, src/cuda/plan.c), and
 * nothing else. The rule (docs/cuda.md, "Kernel selection"):
 *
 *   fast path  = no softcap, not exact mode, 16-bit logits (or the fused
 *                head's fp32 logits), a 16-bit gradient or none;
 *   on-chip    when the fast path applies, the logits are bf16/f16, the mode
 *                is forward, statistics or shard statistics, and V <= 16384
 *                (one block holds the row: ce_onchip.cu);
 *   streaming  otherwise (ce_stream.cu), 32 threads a block below
 *                V = 33280, above about 62 chunks of 8 columns a thread,
 *                96 to 256 threads; a block with a 16-bit gradient keeps 8
 *                chunks a thread of its row in shared memory between the
 *                passes (4500 bytes a warp).
 *
 * Block sizes are functions of V alone, so every call on the same row (any
 * entry point, any T, any position) sums in the same order. */
#include "ce_host.h"

#include "core/xent_internal.h"

/* The fast path applies: no softcap, not the exact mode, 16-bit logits
 * (or fp32 ones of the fused LM head), a 16-bit gradient or none. */
static int xc_fast(const xc_params *p) {
    const int has_grad = p->grad && p->mode != XC_MODE_PART;
    return !p->exact && p->softcap == 0 && (p->in_dtype != XENT_F32 || p->fast_f32) &&
           (!has_grad || p->grad_dtype == XENT_BF16 || p->grad_dtype == XENT_F16);
}

int xc_block(int64_t V) {
    const int forced = xent__cuda_plan()->block;
    if (forced) return forced;
    /* one warp a row below V = 33280; above, about 62 chunks of 8 columns
     * a thread, 96..256 threads (1024 threads a multiprocessor) */
    int64_t nt = (V / 512 + 31) / 32 * 32;
    return nt <= 64 ? 32 : (nt > 256 ? 256 : (int)nt);
}

int xc_stage_bytes(int block, int wide) {
    const int forced = xent__cuda_plan()->stage_bytes;
    if (forced) return forced < 0 ? 0 : forced;
    /* 512-thread blocks (a forced plan only) keep 110000 bytes of their row
     * (two blocks a multiprocessor); the default blocks keep 8 chunks a
     * thread of 16-bit logits; fp32 logits keep none */
    if (block >= 512) return 110000;
    return wide ? 0 : block / 32 * 4500;
}

int64_t xc_linear_rows(void) {
    const int64_t forced = xent__cuda_plan()->linear_rows;
    return forced ? forced : 512;
}

/* The on-chip kernel's launch for V columns; 0 when V does not fit. */
static int xq_plan(int64_t V, xq_plan_t *pl) {
    const xent_cuda_plan *f = xent__cuda_plan();
    const int64_t nchunk = (V + 7) / 8;
    int c = f->onchip_blocks;
    if (!c) {
        if (V > XQ_DEFAULT_MAX_V && f->kernel != XC_K_ONCHIP) return 0;
        c = 1;
    }
    const int64_t per = (nchunk + c - 1) / c;
    if (per * 16 > XQ_SLICE_BYTES) return 0;
    int nt = f->onchip_threads;
    if (!nt) /* about 16 chunks a thread */
        for (nt = 64; nt < XQ_MAX_NT && (int64_t)nt * 16 < per; nt *= 2) {}
    pl->C = c;
    pl->NT = nt;
    pl->P = (int)per;
    pl->G = f->onchip_groups;
    return 1;
}

/* The on-chip kernel handles the call's mode, dtypes and options. */
static int xq_applies(const xc_params *p) {
    if (p->mode != XC_MODE_FWD && p->mode != XC_MODE_PART && p->mode != XC_MODE_STAT) return 0;
    if (p->in_dtype != XENT_BF16 && p->in_dtype != XENT_F16) return 0;
    if (p->softcap != 0) return 0;
    if (p->grad && p->mode == XC_MODE_FWD && p->grad_dtype != XENT_BF16 &&
        p->grad_dtype != XENT_F16)
        return 0;
    return 1;
}

xc_choice xc_choose_rows(const xc_params *p) {
    xc_choice c = {};
    c.kernel = XC_K_STREAM;
    c.fast = xc_fast(p);
    c.block = xc_block(p->V);
    if (c.fast && xent__cuda_plan()->kernel != XC_K_STREAM && xq_applies(p) &&
        xq_plan(p->V, &c.oc))
        c.kernel = XC_K_ONCHIP;
    return c;
}
