/* src/core/xent_internal.h: private helpers shared by the library's sources.
 * Private names use the xent__ prefix. */
#ifndef XENT_INTERNAL_H
#define XENT_INTERNAL_H

#include "xent.h"
#include "core/xent_math.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Checks every field of the cross-entropy options for a call over V
 * columns (src/cpu/ce.c); the CPU and CUDA entry points share it. */
xent_status xent__ce_check_opts(const xent_ce_opts *o, int64_t V);
/* The kernel plan of the calls made on this thread (src/cuda/plan.c). */
const xent_cuda_plan *xent__cuda_plan(void);
#ifdef __cplusplus
}
#endif

#endif
