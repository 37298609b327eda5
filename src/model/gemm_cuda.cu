/* src/model/gemm_cuda.cu: matrix products of host fp32 arrays on the GPU
 * (cuBLAS), for the model's runs with real tensor-core products
 * (`xent audit --device cuda`).
 *
 * The precision policy has already rounded the inputs to their storage
 * dtype. Each operand is packed and converted to `hint` (bf16 or f16) when
 * every one of its values is exactly representable there, else kept in
 * fp32 (both operands then go as fp32: cuBLAS takes one input type);
 * the product accumulates in fp32 (tensor cores for bf16/f16, plain fp32
 * for fp32: no TF32) and the fp32 result comes back. Only the
 * accumulation differs from the CPU's OpenBLAS product of the same values:
 * that difference is what the --device cuda audit measures.
 *
 * One cuBLAS handle and one set of device buffers per process, behind a
 * mutex; calls are synchronous on the legacy default stream. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mutex>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gemm_device.h"

/* XENT_OK, or XENT_ERR_CUDA with `what` and CUDA's message (the error is
 * cleared, so that the next call does not take it for its own). */
static xent_status gc_cuda(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return XENT_OK;
    (void)cudaGetLastError();
    return xent_set_error(XENT_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

static std::mutex g_mu;
static cublasHandle_t g_h;
static void *g_dev;     /* device: A | B | C                      */
static size_t g_dev_n;
static void *g_host;    /* host staging: packed A | B, then C     */
static size_t g_host_n;

/* Is every element of the [rows, cols] block (leading dimension ld)
 * exactly representable in dt? */
static int hg_fits(const float *X, int64_t rows, int64_t cols, int64_t ld, xent_dtype dt) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            float x = X[i * ld + j];
            if (x != x) continue; /* NaN converts to NaN */
            float y = dt == XENT_BF16 ? __bfloat162float(__float2bfloat16_rn(x))
                                      : __half2float(__float2half_rn(x));
            if (y != x) return 0;
        }
    return 1;
}

/* Packs the [rows, cols] block into dst (contiguous) as dt. */
static void hg_pack(void *dst, const float *X, int64_t rows, int64_t cols, int64_t ld,
                    xent_dtype dt) {
    for (int64_t i = 0; i < rows; i++) {
        const float *x = X + i * ld;
        if (dt == XENT_BF16) {
            __nv_bfloat16 *d = (__nv_bfloat16 *)dst + i * cols;
            for (int64_t j = 0; j < cols; j++) d[j] = __float2bfloat16_rn(x[j]);
        } else if (dt == XENT_F16) {
            __half *d = (__half *)dst + i * cols;
            for (int64_t j = 0; j < cols; j++) d[j] = __float2half_rn(x[j]);
        } else {
            memcpy((float *)dst + i * cols, x, (size_t)cols * 4);
        }
    }
}

static xent_status hg_grow(void **p, size_t *n, size_t want, int dev) {
    if (*n >= want) return XENT_OK;
    if (*p) {
        if (dev) cudaFree(*p); else free(*p);
    }
    *p = NULL;
    *n = 0;
    if (dev) {
        xent_status st = gc_cuda(cudaMalloc(p, want), "cudaMalloc (model products)");
        if (st != XENT_OK) return st;
    } else if (!(*p = malloc(want))) {
        return xent_set_error(XENT_ERR_ALLOC, "model products: %zu bytes of host staging", want);
    }
    *n = want;
    return XENT_OK;
}

static xent_status hg_blas(cublasStatus_t e, const char *what) {
    if (e == CUBLAS_STATUS_SUCCESS) return XENT_OK;
    return xent_set_error(XENT_ERR_CUDA, "model products: cuBLAS %s: %s", what,
                      cublasGetStatusString(e));
}

static cudaDataType_t hg_type(xent_dtype t) {
    return t == XENT_BF16 ? CUDA_R_16BF : (t == XENT_F16 ? CUDA_R_16F : CUDA_R_32F);
}

static xent_status hg_run(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const float *A, int64_t lda, const float *B, int64_t ldb,
                          float beta, float *C, int64_t ldc, xent_dtype hint) {
    /* stored shapes: A [M, K] or [K, M] (ta), B [K, N] or [N, K] (tb) */
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    xent_dtype dt = XENT_F32;
    if ((hint == XENT_BF16 || hint == XENT_F16) && hg_fits(A, ar, ac, lda, hint) &&
        hg_fits(B, br, bc, ldb, hint))
        dt = hint;
    const size_t es = dt == XENT_F32 ? 4 : 2;
    const size_t na = (size_t)(ar * ac) * es, nb = (size_t)(br * bc) * es,
                 nc = (size_t)(M * N) * 4;
    const size_t oa = 0, ob = (na + 255) / 256 * 256, oc = ob + (nb + 255) / 256 * 256;
    xent_status st = hg_grow(&g_dev, &g_dev_n, oc + nc, 1);
    if (st == XENT_OK) st = hg_grow(&g_host, &g_host_n, oc + nc, 0);
    if (st != XENT_OK) return st;
    char *h = (char *)g_host, *d = (char *)g_dev;
    hg_pack(h + oa, A, ar, ac, lda, dt);
    hg_pack(h + ob, B, br, bc, ldb, dt);
    st = gc_cuda(cudaMemcpy(d, h, oc, cudaMemcpyHostToDevice), "model products: upload");
    if (st != XENT_OK) return st;
    if (!g_h) {
        st = hg_blas(cublasCreate(&g_h), "cublasCreate");
        if (st != XENT_OK) return st;
    }
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
    const float one = 1.0f, zero = 0.0f;
    st = hg_blas(cublasGemmEx(g_h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              (int)N, (int)M, (int)K, &one, d + ob, hg_type(dt), (int)bc,
                              d + oa, hg_type(dt), (int)ac, &zero, d + oc, CUDA_R_32F, (int)N,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    if (st != XENT_OK) return st;
    float *t = (float *)(h + oc);
    st = gc_cuda(cudaMemcpy(t, d + oc, nc, cudaMemcpyDeviceToHost), "model products: download");
    if (st != XENT_OK) return st;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float p = alpha * t[i * N + j]; /* as cuBLAS's epilogue: one rounding */
            C[i * ldc + j] = beta == 0.0f ? p : p + beta * C[i * ldc + j];
        }
    return XENT_OK;
}

extern "C" xent_status xent__gemm_device(int ta, int tb, int64_t M, int64_t N, int64_t K,
                                         float alpha, const float *A, int64_t lda,
                                         const float *B, int64_t ldb, float beta, float *C,
                                         int64_t ldc, xent_dtype hint) {
    const int64_t lim = (int64_t)1 << 31;
    if (M <= 0 || N <= 0 || K <= 0 || M >= lim || N >= lim || K >= lim)
        return xent_set_error(XENT_ERR_SHAPE, "model products: M, N, K = %lld, %lld, %lld",
                          (long long)M, (long long)N, (long long)K);
    std::lock_guard<std::mutex> lock(g_mu);
    return hg_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, hint);
}
