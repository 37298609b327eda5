/* src/cuda/plan.c: the kernel plan of the calls made on a thread
 * (xent_cuda_set_plan; src/cuda/select.cu applies it). Plain C, built with
 * or without CUDA, so that a plan is checked the same way in every build. */
#include "core/xent_internal.h"

#include <string.h>

static _Thread_local xent_cuda_plan g_plan; /* zero: every choice made by rule */

void xent_cuda_plan_init(xent_cuda_plan *p) {
    if (p) memset(p, 0, sizeof *p);
}

static xent_status bad(const char *field, long long v, const char *range) {
    return xent_set_error(XENT_ERR_VALUE, "xent_cuda_set_plan: plan->%s = %lld is outside %s",
                          field, v, range);
}

xent_status xent_cuda_set_plan(const xent_cuda_plan *p, xent_cuda_plan *old) {
    xent_cuda_plan q;
    xent_cuda_plan_init(&q);
    if (p) {
        if (p->kernel < 0 || p->kernel > 2) return bad("kernel", p->kernel, "{0, 1, 2}");
        if (p->block && (p->block < 32 || p->block > 1024 || p->block % 32))
            return bad("block", p->block, "{0} and the multiples of 32 in [32, 1024]");
        if (p->stage_bytes < -1 || p->stage_bytes > 204800)
            return bad("stage_bytes", p->stage_bytes, "[-1, 204800]");
        if (p->onchip_blocks && p->onchip_blocks != 1 && p->onchip_blocks != 2 &&
            p->onchip_blocks != 4 && p->onchip_blocks != 8)
            return bad("onchip_blocks", p->onchip_blocks, "{0, 1, 2, 4, 8}");
        if (p->onchip_threads && (p->onchip_threads < 32 || p->onchip_threads > 256 ||
                                  p->onchip_threads % 32))
            return bad("onchip_threads", p->onchip_threads,
                       "{0} and the multiples of 32 in [32, 256]");
        if (p->onchip_groups < 0) return bad("onchip_groups", p->onchip_groups, "[0, 2^31)");
        if (p->linear_rows < 0 || p->linear_rows > (1 << 20))
            return bad("linear_rows", (long long)p->linear_rows, "[0, 2^20]");
        q = *p;
    }
    if (old) *old = g_plan;
    g_plan = q;
    return XENT_OK;
}

const xent_cuda_plan *xent__cuda_plan(void) { return &g_plan; }
