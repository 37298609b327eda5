/* src/model/gemm_device.h: the model's matrix products on a GPU
 * (src/model/gemm_cuda.cu; without CUDA, src/cuda/stub.c returns
 * XENT_ERR_UNSUPPORTED). Row-major host arrays, BLAS semantics:
 * C[M, N] = alpha op(A) op(B) + beta C (beta = 0: C is not read), op(X) =
 * X or X^T (ta, tb). The operands go to the GPU as `hint` (bf16/f16) when
 * all their values are exactly representable there, else as fp32; the
 * product accumulates in fp32. */
#ifndef XENT_MODEL_GEMM_DEVICE_H
#define XENT_MODEL_GEMM_DEVICE_H

#include "xent.h"

#ifdef __cplusplus
extern "C" {
#endif

xent_status xent__gemm_device(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                              const float *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc, xent_dtype hint);

#ifdef __cplusplus
}
#endif
#endif
