/* src/model/gemm_stub.c: the model's GPU products and its resident GPU pass
 * in a build without CUDA (compiled only when nvcc is absent, see
 * mk/cuda.mk): every entry returns XENT_ERR_UNSUPPORTED. */
#include "model/core_dev.h"
#include "model/gemm_device.h"

xent_status xent__gemm_device(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                              const float *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc, xent_dtype hint) {
    (void)ta; (void)tb; (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)lda;
    (void)B; (void)ldb; (void)beta; (void)C; (void)ldc; (void)hint;
    return xent_set_error(XENT_ERR_UNSUPPORTED, "--device cuda (model products on the GPU): "
                          "this build has no CUDA support (nvcc was not found)");
}

xent_status xent__model_run_dev(const xent_model *m, void **state, int64_t ws_B, int64_t ws_S,
                                int ws_record, const xent_precision *p,
                                const xent_model_run_opts *o, const xent__dev_io *io,
                                double *loss, double *ls) {
    (void)m; (void)state; (void)ws_B; (void)ws_S; (void)ws_record; (void)p; (void)o;
    (void)io; (void)loss; (void)ls;
    return xent_set_error(XENT_ERR_UNSUPPORTED, "--device cuda (the resident model pass on the "
                          "GPU): this build has no CUDA support (nvcc was not found)");
}

void xent__model_dev_free(void *state) { (void)state; }

xent_status xent_model_dev_mem(uint64_t *free_bytes, uint64_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return xent_set_error(XENT_ERR_UNSUPPORTED, "--device cuda: this build has no CUDA support "
                          "(nvcc was not found)");
}
