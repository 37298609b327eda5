/* tests/cuda_harness.h: what the CUDA tests share (include under
 * XENT_WITH_CUDA only): the skip when no GPU is present, and device buffers
 * poisoned with 0xFF (NaN for every float format) so that an element a call
 * failed to write shows. */
#ifndef XENT_TESTS_CUDA_HARNESS_H
#define XENT_TESTS_CUDA_HARNESS_H

#include "harness.h"
#include "xent.h"

#include <cuda_runtime_api.h>
#include <stddef.h>

/* 1 when a GPU is present; else records a skip and returns 0. */
static inline int gpu_ready(void) {
    if (xent_cuda_device_count() > 0) return 1;
    xt_skip("no CUDA device (cudaGetDeviceCount found none): GPU tests not run");
    return 0;
}

/* Device buffer of n bytes, every byte 0xFF; NULL if cudaMalloc fails. */
static inline void *dev_alloc(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemset(p, 0xFF, n ? n : 1);
    return p;
}

/* A device copy of host h [n bytes]; NULL when h is NULL. */
static inline void *dev_copy(const void *h, size_t n) {
    if (!h) return NULL;
    void *p = dev_alloc(n);
    if (p && n) cudaMemcpy(p, h, n, cudaMemcpyHostToDevice);
    return p;
}

static inline void host_copy(void *h, const void *d, size_t n) {
    if (d && n) cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
}

static inline void dev_free(const void *d) {
    if (d) cudaFree((void *)d);
}

#endif
