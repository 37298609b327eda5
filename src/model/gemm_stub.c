/* src/model/gemm_stub.c: the model's GPU products in a build without CUDA
 * (compiled only when nvcc is absent, see mk/cuda.mk). */
#include "model/gemm_device.h"

xent_status xent__gemm_device(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                              const float *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc, xent_dtype hint) {
    (void)ta; (void)tb; (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)lda;
    (void)B; (void)ldb; (void)beta; (void)C; (void)ldc; (void)hint;
    return xent_set_error(XENT_ERR_UNSUPPORTED, "--device cuda (model products on the GPU): "
                          "this build has no CUDA support (nvcc was not found)");
}
