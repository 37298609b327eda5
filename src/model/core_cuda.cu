/* src/model/core_cuda.cu: the model's whole forward and backward resident
 * on the GPU (xent_model_run_opts.gemm_device = 2; `xent audit --device
 * cuda`). src/model/core_dev.h states the contract.
 *
 * Every operation is core_impl.h's, in the same order and with the
 * precision policy's rounding (bf16 by the same integer steps as rnd_bf16,
 * fp16 by __float2half_rn: round to nearest even) at the same storage
 * points; the stored values are fp32 arrays holding values of their dtype,
 * laid out as the CPU workspace (xdev_layout). Differences from the CPU
 * emulation, all in summation order:
 *   - matrix products by cuBLAS: when both operands hold values of the
 *     compute dtype (bf16/f16) they are converted (exactly) to that dtype
 *     and multiplied on the tensor cores with fp32 accumulation
 *     (CUBLAS_COMPUTE_32F); otherwise in fp32 with
 *     CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no reduced-precision tricks);
 *   - row reductions done in double (RMSNorm's sum of squares, the
 *     attention softmax's sum) are summed by a warp's tree instead of in
 *     order (differences ~1e-16 relative, below every fp32 rounding);
 *     column sums (norm weight, bias and embedding gradients) keep the CPU's
 *     order exactly (one thread a column, tokens in order);
 *   - the loss by xent_cuda_ce (exact: within 4 ulp of the CPU's xent_ce,
 *     gradients within 1 ulp; include/xent/cuda.h); the common CE forms of
 *     the audit (precision.ce != exact) run on the host as on the CPU.
 * Attention materializes the probabilities [B, nh, S, S] per layer (kept for
 * the backward) and one [B, nh, S, S] gradient scratch, as the CPU does;
 * the products of a (batch, KV head) pair run as one strided batched call
 * over the heads of its group (K and V with stride 0).
 * Everything runs on the legacy default stream; the host waits only for the
 * loss (nll) of each micro-batch and the final copies. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xent.h"

extern "C" {
#include "model/core_dev.h"
#include "model/model_internal.h"
}

/* ---- errors ------------------------------------------------------------- */

static xent_status cu_err(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return XENT_OK;
    (void)cudaGetLastError();
    return xent_set_error(XENT_ERR_CUDA, "--device cuda (resident model): %s: %s (%s)", what,
                          cudaGetErrorString(e), cudaGetErrorName(e));
}

static xent_status blas_err(cublasStatus_t e, const char *what) {
    if (e == CUBLAS_STATUS_SUCCESS) return XENT_OK;
    return xent_set_error(XENT_ERR_CUDA, "--device cuda (resident model): cuBLAS %s: %s", what,
                          cublasGetStatusString(e));
}

#define TRY(expr)                                                                          \
    do {                                                                                   \
        xent_status st_ = (expr);                                                          \
        if (st_ != XENT_OK) return st_;                                                    \
    } while (0)

/* ---- device rounding ---------------------------------------------------- */

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

static int dcode(xent_dtype t) { return t == XENT_BF16 ? DT_BF16 : (t == XENT_F16 ? DT_F16 : DT_F32); }

/* rnd_bf16 of core_impl.h: RNE by carry, NaN kept quiet. */
__device__ __forceinline__ float d_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) r = (u | 0x00400000u) & 0xFFFF0000u;
    return __uint_as_float(r);
}

__device__ __forceinline__ float d_rnd(float x, int dt) {
    if (dt == DT_BF16) return d_bf16(x);
    if (dt == DT_F16) return __half2float(__float2half_rn(x));
    return x;
}

/* 16-bit bit pattern of x rounded to dt (bf16 or f16). */
__device__ __forceinline__ uint16_t d_bits16(float x, int dt) {
    if (dt == DT_BF16) return (uint16_t)(__float_as_uint(d_bf16(x)) >> 16);
    return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float d_load(const void *p, int dt, int64_t i) {
    if (dt == DT_BF16) return xent__bf16_f32(((const uint16_t *)p)[i]);
    if (dt == DT_F16) return xent__f16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* ---- kernels ------------------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);              \
         i += (int64_t)gridDim.x * blockDim.x)

static unsigned nblocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

__global__ void k_round(float *p, int64_t n, int dt) {
    GRID_STRIDE(i, n) p[i] = d_rnd(p[i], dt);
}

/* y[t, o] += b[o], then rounded (linear_fwd). */
__global__ void k_bias_round(float *y, const float *b, int64_t n, int64_t out, int dt) {
    GRID_STRIDE(i, n) {
        float v = y[i];
        if (b) v += b[i % out];
        y[i] = d_rnd(v, dt);
    }
}

/* dst (16-bit, dt) = src rounded to dt. */
__global__ void k_to16(uint16_t *dst, const float *src, int64_t n, int dt) {
    GRID_STRIDE(i, n) dst[i] = d_bits16(src[i], dt);
}

__global__ void k_to32(float *dst, const void *src, int64_t n, int dt) {
    GRID_STRIDE(i, n) dst[i] = d_load(src, dt, i);
}

/* A weight as stored: 16-bit (store16) or fp32 rounded to rdt. */
__global__ void k_weight(void *dst, const float *src, int64_t n, int store16, int rdt) {
    GRID_STRIDE(i, n) {
        if (store16) ((uint16_t *)dst)[i] = d_bits16(src[i], rdt);
        else ((float *)dst)[i] = d_rnd(src[i], rdt);
    }
}

/* x0[t] = E[tok[t]] (* es), rounded to the residual dtype. */
__global__ void k_embed(float *x0, const void *E, int edt, const int32_t *tok, int64_t T,
                        int64_t D, float es, int scale, int dt) {
    GRID_STRIDE(i, T * D) {
        int64_t t = i / D, j = i % D;
        float v = d_load(E, edt, (int64_t)tok[t] * D + j);
        if (scale) v *= es;
        x0[i] = d_rnd(v, dt);
    }
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

/* RMSNorm rows (rmsnorm_rows): one warp a row. */
__global__ void k_rms_fwd(const float *x, const float *w, float *y, float *r, int64_t rows,
                          int64_t D, double eps, int plus_one, int dt) {
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float *xr = x + row * D;
    double ss = 0;
    for (int64_t i = lane; i < D; i += 32) ss += (double)xr[i] * xr[i];
    ss = warp_sum_d(ss);
    float ri = (float)(1.0 / sqrt(ss / (double)D + eps));
    if (lane == 0) r[row] = ri;
    float *yr = y + row * D;
    for (int64_t i = lane; i < D; i += 32) {
        if (plus_one) yr[i] = d_rnd(xr[i] * ri * (1.0f + w[i]), dt);
        else yr[i] = d_rnd(w[i] * d_rnd(xr[i] * ri, dt), dt);
    }
}

/* dx (+)= r (w dy) - x r^3/D sum_i(w_i dy_i x_i) (rmsnorm_bwd_rows). */
__global__ void k_rms_bwd(const float *x, const float *w, const float *rinv, const float *dy,
                          float *dx, int64_t rows, int64_t D, int acc, int plus_one, int dt) {
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float *xr = x + row * D, *dyr = dy + row * D;
    float r = rinv[row];
    double s = 0;
    for (int64_t i = lane; i < D; i += 32) {
        float wi = plus_one ? 1.0f + w[i] : w[i];
        s += (double)wi * dyr[i] * xr[i];
    }
    s = warp_sum_d(s);
    float k = (float)(s * (double)r * r * r / (double)D);
    float *dxr = dx + row * D;
    for (int64_t i = lane; i < D; i += 32) {
        float wi = plus_one ? 1.0f + w[i] : w[i];
        float v = r * (wi * dyr[i]) - xr[i] * k;
        dxr[i] = d_rnd(acc ? dxr[i] + v : v, dt);
    }
}

/* dw[i] = sum_t dy x r in double, tokens in order (rmsnorm_dw_cols). */
__global__ void k_rms_dw(const float *x, const float *rinv, const float *dy, float *dw,
                         int64_t rows, int64_t D, int dt) {
    GRID_STRIDE(i, D) {
        double acc = 0;
        for (int64_t t = 0; t < rows; t++) acc += (double)(dy[t * D + i] * x[t * D + i] * rinv[t]);
        dw[i] = d_rnd((float)acc, dt);
    }
}

/* RoPE (rope_rows): pairs (i, i + hd/2) of each head. */
__global__ void k_rope(float *q, int64_t T, int64_t nh, int64_t hd, int64_t S, const float *cs,
                       const float *sn, int sign, int dt) {
    int64_t half = hd / 2;
    GRID_STRIDE(e, T * nh * half) {
        int64_t i = e % half, th = e / half, t = th / nh, h = th % nh, s = t % S;
        float *p = q + t * nh * hd + h * hd;
        float a = p[i], b = p[i + half], co = cs[s * half + i], si = (float)sign * sn[s * half + i];
        p[i] = d_rnd(a * co - b * si, dt);
        p[i + half] = d_rnd(b * co + a * si, dt);
    }
}

/* Causal softmax of rows of [B*nh*S, S] in place (softmax_rows): a warp a
 * row. */
__global__ void k_softmax(float *P, float *sc, int64_t rows, int64_t S, int64_t win, float cap,
                          int dt) {
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int64_t i = row % S, lo = win > 0 && i >= win ? i - win + 1 : 0;
    float *p = P + row * S;
    float mx = -INFINITY;
    for (int64_t k = lo + lane; k <= i; k += 32) {
        float v = d_rnd(p[k], dt);
        if (cap > 0) {
            v = d_rnd((float)((double)cap * tanh((double)v / (double)cap)), dt);
            sc[row * S + k] = v;
        }
        p[k] = v;
        mx = v > mx ? v : mx;
    }
    mx = warp_max_f(mx);
    double sum = 0;
    for (int64_t k = lo + lane; k <= i; k += 32) {
        double e = xent__exp((double)p[k] - (double)mx);
        p[k] = (float)e;
        sum += e;
    }
    sum = warp_sum_d(sum);
    double inv = 1.0 / sum;
    for (int64_t k = lane; k < S; k += 32) {
        if (k < lo || k > i) p[k] = 0;
        else p[k] = d_rnd((float)(p[k] * inv), dt);
    }
}

/* dS = P (dP - rowsum(P dP)) in place of dP (dsoftmax_rows). */
__global__ void k_dsoftmax(const float *P, float *dS, const float *sc, int64_t rows, int64_t S,
                           int64_t win, float cap, int dt) {
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int64_t i = row % S, lo = win > 0 && i >= win ? i - win + 1 : 0;
    const float *p = P + row * S;
    float *d = dS + row * S;
    double s = 0;
    for (int64_t k = lo + lane; k <= i; k += 32) s += (double)p[k] * d[k];
    s = warp_sum_d(s);
    for (int64_t k = lane; k < S; k += 32) {
        if (k < lo || k > i) {
            d[k] = 0;
            continue;
        }
        float v = d_rnd(p[k] * (float)(d[k] - s), dt);
        if (cap > 0) {
            float u = sc[row * S + k] / cap;
            v = d_rnd(v * (1 - u * u), dt);
        }
        d[k] = v;
    }
}

/* y = round(a + b) (the residual adds). */
__global__ void k_add(float *y, const float *a, const float *b, int64_t n, int dt) {
    GRID_STRIDE(i, n) y[i] = d_rnd(a[i] + b[i], dt);
}

__global__ void k_glu_fwd(const float *gt, const float *up, float *act, int64_t n, int gelu,
                          int dt) {
    GRID_STRIDE(i, n) {
        if (gelu) {
            double g = gt[i];
            double t = tanh(0.7978845608028654 * (g + 0.044715 * g * g * g));
            act[i] = d_rnd(d_rnd((float)(0.5 * g * (1 + t)), dt) * up[i], dt);
        } else {
            float g = gt[i];
            float s = (float)(1.0 / (1.0 + xent__exp(-(double)g)));
            act[i] = d_rnd(d_rnd(g * s, dt) * up[i], dt);
        }
    }
}

/* dh (in: d act; out: d gate), dh2 (d up) (swiglu_bwd_range). */
__global__ void k_glu_bwd(const float *gt, const float *up, float *dh, float *dh2, int64_t n,
                          int gelu, int dt) {
    GRID_STRIDE(i, n) {
        if (gelu) {
            const double a = 0.7978845608028654, b = 0.044715;
            double g = gt[i], u = up[i], da = dh[i];
            double t = tanh(a * (g + b * g * g * g));
            double ge = 0.5 * g * (1 + t);
            double dge = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * a * (1 + 3 * b * g * g);
            dh2[i] = d_rnd((float)(da * (double)(float)ge), dt);
            dh[i] = d_rnd((float)(da * u * dge), dt);
        } else {
            float g = gt[i], u = up[i], da = dh[i];
            float s = (float)(1.0 / (1.0 + xent__exp(-(double)g)));
            float silu = g * s;
            dh2[i] = d_rnd(da * silu, dt);
            dh[i] = d_rnd(da * u * (s * (1 + g * (1 - s))), dt);
        }
    }
}

/* db[o] = sum_t dy[t, o] in double, tokens in order. */
__global__ void k_colsum(const float *dy, float *db, int64_t T, int64_t out, int dt) {
    GRID_STRIDE(o, out) {
        double acc = 0;
        for (int64_t t = 0; t < T; t++) acc += dy[t * out + o];
        db[o] = d_rnd((float)acc, dt);
    }
}

__global__ void k_softcap(float *z, int64_t n, double fc, int dt) {
    GRID_STRIDE(i, n) z[i] = d_rnd((float)(fc * tanh((double)z[i] / fc)), dt);
}

__global__ void k_softcap_bwd(float *dz, const float *z, int64_t n, double fc, int dt) {
    GRID_STRIDE(i, n) {
        double u = (double)z[i] / fc;
        dz[i] = d_rnd((float)((double)dz[i] * (1 - u * u)), dt);
    }
}

/* dE[tok[t]] += dx[t] (* es), tokens in order: one thread a column. */
__global__ void k_embed_bwd(float *dE, const float *dx, const int32_t *tok, int64_t T, int64_t D,
                            float es, int scale) {
    GRID_STRIDE(i, D) {
        for (int64_t t = 0; t < T; t++) {
            float *row = dE + (int64_t)tok[t] * D;
            row[i] += scale ? dx[t * D + i] * es : dx[t * D + i];
        }
    }
}

__global__ void k_accum(float *g, const float *gmb, int64_t n, float inv, int dt, int first) {
    GRID_STRIDE(i, n) {
        float base = first ? 0.0f : g[i];
        g[i] = d_rnd(base + gmb[i] * inv, dt);
    }
}

__global__ void k_finite(const float *g, int64_t n, int32_t *flag) {
    GRID_STRIDE(i, n) if (!isfinite(g[i])) atomicOr(flag, 1);
}

/* ---- the device state of a workspace ------------------------------------ */

typedef struct dstate {
    const xent_model *m;
    cublasHandle_t h;
    void *wmem;         /* the weights as stored                           */
    size_t wmem_n;
    void **w;           /* [n_params] into wmem                            */
    int *wt;            /* [n_params] DT_* of each                          */
    xent_dtype w_dt;    /* the compute dtype wmem holds                    */
    int w_ok;
    void *hmem;         /* the head in the lm_head dtype (when it differs) */
    size_t hmem_n;
    xent_dtype h_dt;
    int h_ok;
    float *upl;         /* fp32 upload buffer (largest parameter)          */
    size_t upl_n;
    float *grads, *gmb; /* [nw] each                                       */
    float *arena;       /* xdev_layout                                     */
    size_t arena_n;     /* floats                                          */
    float **x, **rec_dx;
    xdev_layer *ly;
} dstate;

extern "C" void xent__model_dev_free(void *vs) {
    dstate *s = (dstate *)vs;
    if (!s) return;
    if (s->h) cublasDestroy(s->h);
    cudaFree(s->wmem), cudaFree(s->hmem), cudaFree(s->upl), cudaFree(s->grads);
    cudaFree(s->gmb), cudaFree(s->arena);
    free(s->w), free(s->wt), free(s->x), free(s->rec_dx), free(s->ly);
    free(s);
}

extern "C" xent_status xent_model_dev_mem(uint64_t *free_bytes, uint64_t *total_bytes) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        return xent_set_error(XENT_ERR_CUDA, "--device cuda: no CUDA device");
    }
    size_t f = 0, t = 0;
    TRY(cu_err(cudaMemGetInfo(&f, &t), "cudaMemGetInfo"));
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return XENT_OK;
}

static size_t held_bytes(const dstate *s) {
    return s->wmem_n + s->hmem_n + s->upl_n * 4 + s->arena_n * 4 +
           (s->grads ? (size_t)xent_model_n_weights(s->m) * 4 : 0) +
           (s->gmb ? (size_t)xent_model_n_weights(s->m) * 4 : 0);
}

static xent_status dmalloc(void **p, size_t bytes, const char *what) {
    *p = NULL;
    return cu_err(cudaMalloc(p, bytes ? bytes : 1), what);
}

/* Weights in the policy's dtypes: matrices in the compute dtype (16-bit
 * arrays for bf16/f16), vectors fp32 rounded to it; the head in the
 * lm_head dtype when it differs (fp32 unrounded when that is f32, as
 * ws_weights on the CPU). */
static xent_status ensure_weights(dstate *s, const xent_precision *p) {
    const xent_model *m = s->m;
    int64_t big = 0;
    for (int i = 0; i < m->n_params; i++)
        big = m->params[i].numel > big ? m->params[i].numel : big;
    if (!s->upl) {
        TRY(dmalloc((void **)&s->upl, (size_t)big * 4, "cudaMalloc (weight upload)"));
        s->upl_n = (size_t)big;
    }
    if (!s->w_ok || s->w_dt != p->compute) {
        int c16 = p->compute != XENT_F32;
        size_t need = 0;
        for (int i = 0; i < m->n_params; i++) {
            size_t es = m->params[i].ndim == 2 && c16 ? 2 : 4;
            need += ((size_t)m->params[i].numel * es + 255) / 256 * 256;
        }
        if (s->wmem_n < need) {
            cudaFree(s->wmem);
            s->wmem = NULL;
            s->wmem_n = 0;
            TRY(dmalloc(&s->wmem, need, "cudaMalloc (weights)"));
            s->wmem_n = need;
        }
        size_t off = 0;
        for (int i = 0; i < m->n_params; i++) {
            const xent_param *pr = &m->params[i];
            int st16 = pr->ndim == 2 && c16;
            s->w[i] = (char *)s->wmem + off;
            s->wt[i] = st16 ? dcode(p->compute) : DT_F32;
            off += ((size_t)pr->numel * (st16 ? 2 : 4) + 255) / 256 * 256;
            TRY(cu_err(cudaMemcpy(s->upl, pr->w, (size_t)pr->numel * 4, cudaMemcpyHostToDevice),
                       "weight upload"));
            k_weight<<<nblocks(pr->numel, 256), 256>>>(s->w[i], s->upl, pr->numel, st16,
                                                       dcode(p->compute));
            TRY(cu_err(cudaGetLastError(), "weight conversion"));
        }
        s->w_dt = p->compute;
        s->w_ok = 1;
    }
    if (p->lm_head != p->compute && (!s->h_ok || s->h_dt != p->lm_head)) {
        int ih = xent__pidx_head(&m->cfg);
        const xent_param *pr = &m->params[ih];
        int st16 = p->lm_head != XENT_F32;
        size_t need = (size_t)pr->numel * (st16 ? 2 : 4);
        if (s->hmem_n < need) {
            cudaFree(s->hmem);
            s->hmem = NULL;
            s->hmem_n = 0;
            TRY(dmalloc(&s->hmem, need, "cudaMalloc (head weight)"));
            s->hmem_n = need;
        }
        TRY(cu_err(cudaMemcpy(s->upl, pr->w, (size_t)pr->numel * 4, cudaMemcpyHostToDevice),
                   "head weight upload"));
        k_weight<<<nblocks(pr->numel, 256), 256>>>(s->hmem, s->upl, pr->numel, st16,
                                                   dcode(p->lm_head));
        TRY(cu_err(cudaGetLastError(), "head weight conversion"));
        s->h_dt = p->lm_head;
        s->h_ok = 1;
    }
    return XENT_OK;
}

/* ---- one micro-batch ---------------------------------------------------- */

typedef struct opnd {
    const void *p;
    int dt; /* DT_*: the element type of p */
} opnd;

typedef struct dctx {
    dstate *s;
    const xent_model_config *c;
    int64_t B, S, T;
    xent_dtype dc, dr, dn, da, dh, dl; /* compute, residual, norm, attn, head, logits */
    opnd wh;                          /* the head weight as stored           */
    xent_dtype wh_dt;                 /* its values' dtype                   */
    float **g;                        /* [n_params] device gradients or NULL */
    xdev_bufs b;                      /* this micro-batch's views            */
    const int32_t *tok;               /* device [T]                          */
    const float *rc, *rs, *rcl, *rsl; /* RoPE tables                         */
} dctx;

static opnd W(const dctx *c, int64_t l, xent_param_kind k) {
    int i = xent__pidx(c->c, l, k);
    opnd o = {NULL, DT_F32};
    if (i >= 0) {
        o.p = c->s->w[i];
        o.dt = c->s->wt[i];
    }
    return o;
}
static const float *Wv(const dctx *c, int64_t l, xent_param_kind k) {
    return (const float *)W(c, l, k).p; /* vectors are fp32 */
}
static float *G(const dctx *c, int64_t l, xent_param_kind k) {
    int i = xent__pidx(c->c, l, k);
    return (i < 0 || !c->g) ? NULL : c->g[i];
}

static xent_status launched(const char *what) { return cu_err(cudaGetLastError(), what); }

static xent_status drnd(float *p, int64_t n, xent_dtype t) {
    if (t == XENT_F32 || n <= 0) return XENT_OK;
    k_round<<<nblocks(n, 256), 256>>>(p, n, dcode(t));
    return launched("round");
}

/* The dtype a product runs in: both operands' values of one 16-bit dtype:
 * that dtype; otherwise fp32. */
static xent_dtype prod_dt(xent_dtype a, xent_dtype b) { return a == b ? a : XENT_F32; }

/* src [n] (fp32 array of values) as an operand of dtype want: itself for
 * fp32, else converted into staging slot (0: a, 1: b). */
static xent_status stage(dctx *c, int slot, const float *src, int64_t n, xent_dtype want,
                         opnd *o) {
    if (want == XENT_F32) {
        o->p = src;
        o->dt = DT_F32;
        return XENT_OK;
    }
    uint16_t *dst = (uint16_t *)(slot ? c->b.st_b : c->b.st_a);
    if (!dst) return xent_set_error(XENT_ERR_VALUE, "resident model: no 16-bit staging planned");
    k_to16<<<nblocks(n, 256), 256>>>(dst, src, n, dcode(want));
    o->p = dst;
    o->dt = dcode(want);
    return launched("operand conversion");
}

/* A weight operand in dtype want (fp32 from a 16-bit copy: into the upload
 * buffer, which holds the largest parameter). */
static xent_status wop(dctx *c, opnd w, int64_t n, xent_dtype want, opnd *o) {
    if (w.dt == dcode(want) || want != XENT_F32) {
        *o = w;
        return XENT_OK;
    }
    k_to32<<<nblocks(n, 256), 256>>>(c->s->upl, w.p, n, w.dt);
    o->p = c->s->upl;
    o->dt = DT_F32;
    return launched("weight to fp32");
}

static opnd oadd(opnd o, int64_t elems) {
    size_t es = o.dt == DT_F32 ? 4 : 2;
    o.p = (const char *)o.p + (size_t)elems * es;
    return o;
}

static cudaDataType_t ctype(int dt) {
    return dt == DT_BF16 ? CUDA_R_16BF : (dt == DT_F16 ? CUDA_R_16F : CUDA_R_32F);
}

/* Row-major C[M, N] = alpha op(A) op(B) + beta C, batch products with
 * strides sA, sB, sC (elements); C fp32. */
static xent_status gemm(dctx *c, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                        opnd A, int64_t lda, opnd B, int64_t ldb, float beta, float *C,
                        int64_t ldc, int64_t batch, int64_t sA, int64_t sB, int64_t sC) {
    const int64_t lim = ((int64_t)1 << 31) - 1;
    if (M > lim || N > lim || K > lim || lda > lim || ldb > lim || ldc > lim || batch > lim)
        return xent_set_error(XENT_ERR_SHAPE, "resident model: product %lld x %lld x %lld "
                              "exceeds cuBLAS's int range", (long long)M, (long long)N,
                              (long long)K);
    if (A.dt != B.dt)
        return xent_set_error(XENT_ERR_VALUE, "resident model: operands of mixed types");
    cublasComputeType_t ct = A.dt == DT_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
    if (batch == 1)
        return blas_err(cublasGemmEx(c->s->h, ob, oa, (int)N, (int)M, (int)K, &alpha, B.p,
                                     ctype(B.dt), (int)ldb, A.p, ctype(A.dt), (int)lda, &beta, C,
                                     CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
    return blas_err(cublasGemmStridedBatchedEx(c->s->h, ob, oa, (int)N, (int)M, (int)K, &alpha,
                                               B.p, ctype(B.dt), (int)ldb, (long long)sB, A.p,
                                               ctype(A.dt), (int)lda, (long long)sA, &beta, C,
                                               CUDA_R_32F, (int)ldc, (long long)sC, (int)batch,
                                               ct, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmStridedBatchedEx");
}

static xent_status gemm1(dctx *c, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                         opnd A, int64_t lda, opnd B, int64_t ldb, float beta, float *C,
                         int64_t ldc) {
    return gemm(c, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
}

/* ---- RMSNorm -------------------------------------------------------------- */

static xent_status rms_fwd_n(dctx *c, const float *x, const float *w, float *y, float *r,
                             int64_t rows, int64_t wd) {
    int64_t th = rows * 32;
    k_rms_fwd<<<(unsigned)((th + 255) / 256), 256>>>(x, w, y, r, rows, wd, c->c->norm_eps,
                                                     c->c->norm_plus_one, dcode(c->dn));
    return launched("rmsnorm");
}
static xent_status rms_fwd(dctx *c, const float *x, const float *w, float *y, float *r) {
    return rms_fwd_n(c, x, w, y, r, c->T, c->c->dim);
}

static xent_status rms_bwd_n(dctx *c, const float *x, const float *w, const float *r,
                             const float *dy, float *dx, float *dw, int acc, int64_t rows,
                             int64_t wd) {
    if (dw) {
        k_rms_dw<<<nblocks(wd, 128), 128>>>(x, r, dy, dw, rows, wd, dcode(c->dc));
        TRY(launched("rmsnorm dw"));
    }
    int64_t th = rows * 32;
    k_rms_bwd<<<(unsigned)((th + 255) / 256), 256>>>(x, w, r, dy, dx, rows, wd, acc,
                                                     c->c->norm_plus_one, dcode(c->dc));
    return launched("rmsnorm backward");
}
static xent_status rms_bwd(dctx *c, const float *x, const float *w, const float *r,
                           const float *dy, float *dx, float *dw, int acc) {
    return rms_bwd_n(c, x, w, r, dy, dx, dw, acc, c->T, c->c->dim);
}

/* ---- linear layers ---------------------------------------------------------- */

/* y[T, out] = xs W^T (+ bias), rounded to the compute dtype; xs is the input
 * already staged as a compute-dtype operand. */
static xent_status lin_fwd(dctx *c, opnd xs, int64_t in, opnd Wt, const float *bias,
                           int64_t out, float *y) {
    TRY(gemm1(c, 0, 1, c->T, out, in, 1.0f, xs, in, Wt, in, 0.0f, y, out));
    k_bias_round<<<nblocks(c->T * out, 256), 256>>>(y, bias, c->T * out, out, dcode(c->dc));
    return launched("bias");
}

/* dW = dy^T x, db = sum_t dy, dx (+)= dy W (linear_bwd). x: fp32 values,
 * rounded to the compute dtype for dW (as_comp). */
static xent_status lin_bwd(dctx *c, const float *dy, int64_t out, const float *x, int64_t in,
                           opnd Wt, float *dW, float *db, float *dx, float beta) {
    opnd dys, xs;
    TRY(stage(c, 0, dy, c->T * out, c->dc, &dys));
    if (dW) {
        if (c->dc != XENT_F32) {
            TRY(stage(c, 1, x, c->T * in, c->dc, &xs));
        } else {
            xs.p = x;
            xs.dt = DT_F32;
        }
        TRY(gemm1(c, 1, 0, out, in, c->T, 1.0f, dys, out, xs, in, 0.0f, dW, in));
        TRY(drnd(dW, out * in, c->dc));
    }
    if (db) {
        k_colsum<<<nblocks(out, 128), 128>>>(dy, db, c->T, out, dcode(c->dc));
        TRY(launched("bias gradient"));
    }
    if (dx) {
        TRY(gemm1(c, 0, 0, c->T, in, out, 1.0f, dys, out, Wt, in, beta, dx, in));
        TRY(drnd(dx, c->T * in, c->dc));
    }
    return XENT_OK;
}

/* ---- attention -------------------------------------------------------------- */

typedef struct attp {
    int64_t S, hd, nh, nkv, grp, qd, kvd, win;
    float scale, cap;
} attp;

static attp att_plan(dctx *c, int64_t l) {
    const xent_model_config *m = c->c;
    attp a;
    a.S = c->S;
    a.hd = m->head_dim;
    a.nh = m->n_heads;
    a.nkv = m->n_kv_heads;
    a.grp = a.nh / a.nkv;
    a.qd = a.nh * a.hd;
    a.kvd = a.nkv * a.hd;
    double qs = m->query_scalar > 0 ? m->query_scalar : (double)a.hd;
    a.scale = (float)(1.0 / sqrt(qs));
    a.win = xent_model_layer_sliding(m, l) ? m->sliding_window : 0;
    a.cap = (float)m->attn_softcap;
    return a;
}

/* Over (b, KV head): the group's heads as one batched product.
 * which: 0 scores = scale q k^T; 1 ao = P v; 2 dP = dO v^T; 3 dq = scale dS k. */
static xent_status att_grouped(dctx *c, const attp *a, int which, opnd A, opnd Bm, float *C) {
    int64_t S = a->S, hd = a->hd;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t kh = 0; kh < a->nkv; kh++) {
            int64_t h0 = kh * a->grp, bh0 = b * a->nh + h0;
            int64_t qo = b * S * a->qd + h0 * a->hd, kv = b * S * a->kvd + kh * a->hd;
            xent_status st;
            if (which == 0)
                st = gemm(c, 0, 1, S, S, hd, a->scale, oadd(A, qo), a->qd, oadd(Bm, kv), a->kvd,
                          0.0f, C + bh0 * S * S, S, a->grp, hd, 0, S * S);
            else if (which == 1)
                st = gemm(c, 0, 0, S, hd, S, 1.0f, oadd(A, bh0 * S * S), S, oadd(Bm, kv), a->kvd,
                          0.0f, C + qo, a->qd, a->grp, S * S, 0, hd);
            else if (which == 2)
                st = gemm(c, 0, 1, S, S, hd, 1.0f, oadd(A, qo), a->qd, oadd(Bm, kv), a->kvd,
                          0.0f, C + bh0 * S * S, S, a->grp, hd, 0, S * S);
            else
                st = gemm(c, 0, 0, S, hd, S, a->scale, oadd(A, bh0 * S * S), S, oadd(Bm, kv),
                          a->kvd, 0.0f, C + qo, a->qd, a->grp, S * S, 0, hd);
            if (st) return st;
        }
    return XENT_OK;
}

static xent_status attention_fwd(dctx *c, xdev_layer *L, int64_t l) {
    attp a = att_plan(c, l);
    int64_t T = c->T, natt = c->B * a.nh * a.S * a.S;
    opnd qs, ks, ps, vs;
    TRY(stage(c, 0, L->q, T * a.qd, c->dc, &qs));
    TRY(stage(c, 1, L->k, T * a.kvd, c->dc, &ks));
    TRY(att_grouped(c, &a, 0, qs, ks, L->att));
    int64_t rows = c->B * a.nh * a.S;
    k_softmax<<<(unsigned)((rows * 32 + 255) / 256), 256>>>(L->att, L->attc, rows, a.S, a.win,
                                                             a.cap, dcode(c->da));
    TRY(launched("attention softmax"));
    xent_dtype pv = prod_dt(c->da, c->dc);
    TRY(stage(c, 0, L->att, natt, pv, &ps));
    TRY(stage(c, 1, L->v, T * a.kvd, pv, &vs));
    TRY(att_grouped(c, &a, 1, ps, vs, L->ao));
    return drnd(L->ao, T * a.qd, c->dc);
}

/* From dao: dq, dk, dv (the caller undoes RoPE). */
static xent_status attention_bwd(dctx *c, xdev_layer *L, int64_t l) {
    attp a = att_plan(c, l);
    int64_t T = c->T, S = a.S, natt = c->B * a.nh * S * S, rows = c->B * a.nh * S;
    opnd A, Bm;
    /* dP = dO v^T, then dS in place */
    TRY(stage(c, 0, c->b.dao, T * a.qd, c->dc, &A));
    TRY(stage(c, 1, L->v, T * a.kvd, c->dc, &Bm));
    TRY(att_grouped(c, &a, 2, A, Bm, c->b.datt));
    k_dsoftmax<<<(unsigned)((rows * 32 + 255) / 256), 256>>>(L->att, c->b.datt, L->attc, rows, S,
                                                              a.win, a.cap, dcode(c->da));
    TRY(launched("attention softmax backward"));
    /* dq = scale dS k */
    xent_dtype dsk = prod_dt(c->da, c->dc);
    TRY(stage(c, 0, c->b.datt, natt, dsk, &A));
    TRY(stage(c, 1, L->k, T * a.kvd, dsk, &Bm));
    TRY(att_grouped(c, &a, 3, A, Bm, c->b.dq));
    /* dk += scale dS^T q, dv += P^T dO: over the group's heads in order */
    TRY(cu_err(cudaMemsetAsync(c->b.dk, 0, (size_t)(T * a.kvd) * 4, 0), "memset"));
    TRY(cu_err(cudaMemsetAsync(c->b.dv, 0, (size_t)(T * a.kvd) * 4, 0), "memset"));
    opnd qs;
    TRY(stage(c, 1, L->q, T * a.qd, dsk, &qs)); /* A still holds dS as dsk */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            xent_dtype pdo = prod_dt(c->da, c->dc);
            TRY(stage(c, 0, L->att, natt, pdo, &A));
            TRY(stage(c, 1, c->b.dao, T * a.qd, pdo, &qs));
        }
        float *D = pass ? c->b.dv : c->b.dk;
        float alpha = pass ? 1.0f : a.scale;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < a.nh; h++) {
                int64_t bh = b * a.nh + h, qo = b * S * a.qd + h * a.hd,
                        kv = b * S * a.kvd + (h / a.grp) * a.hd;
                TRY(gemm1(c, 1, 0, S, a.hd, S, alpha, oadd(A, bh * S * S), S, oadd(qs, qo), a.qd,
                          1.0f, D + kv, a.kvd));
            }
    }
    TRY(drnd(c->b.dq, T * a.qd, c->dc));
    TRY(drnd(c->b.dk, T * a.kvd, c->dc));
    return drnd(c->b.dv, T * a.kvd, c->dc);
}

static xent_status rope(dctx *c, float *q, int64_t nh, int sign, int local) {
    int64_t hd = c->c->head_dim, n = c->T * nh * (hd / 2);
    k_rope<<<nblocks(n, 256), 256>>>(q, c->T, nh, hd, c->S, local ? c->rcl : c->rc,
                                     local ? c->rsl : c->rs, sign, dcode(c->dc));
    return launched("rope");
}

/* ---- layers ------------------------------------------------------------------ */

static xent_status layer_fwd(dctx *c, int64_t l) {
    const xent_model_config *m = c->c;
    xdev_layer *L = &c->b.ly[l];
    int64_t D = m->dim, H = m->hidden, hd = m->head_dim, qd = m->n_heads * hd,
            kvd = m->n_kv_heads * hd, T = c->T;
    const float *x = c->b.x[l];
    float *y = c->b.x[l + 1];
    int loc = xent_model_layer_sliding(m, l);
    opnd xs;
    TRY(rms_fwd(c, x, Wv(c, l, XENT_P_ATTN_NORM), L->xn1, L->rms1));
    TRY(stage(c, 0, L->xn1, T * D, c->dc, &xs));
    float *qo = m->qk_norm ? L->qpre : L->q, *ko = m->qk_norm ? L->kpre : L->k;
    TRY(lin_fwd(c, xs, D, W(c, l, XENT_P_WQ), Wv(c, l, XENT_P_BQ), qd, qo));
    TRY(lin_fwd(c, xs, D, W(c, l, XENT_P_WK), Wv(c, l, XENT_P_BK), kvd, ko));
    TRY(lin_fwd(c, xs, D, W(c, l, XENT_P_WV), Wv(c, l, XENT_P_BV), kvd, L->v));
    if (m->qk_norm) {
        TRY(rms_fwd_n(c, L->qpre, Wv(c, l, XENT_P_Q_NORM), L->q, L->qn_r, T * m->n_heads, hd));
        TRY(rms_fwd_n(c, L->kpre, Wv(c, l, XENT_P_K_NORM), L->k, L->kn_r, T * m->n_kv_heads, hd));
        TRY(drnd(L->q, T * qd, c->dc));
        TRY(drnd(L->k, T * kvd, c->dc));
    }
    TRY(rope(c, L->q, m->n_heads, 1, loc));
    TRY(rope(c, L->k, m->n_kv_heads, 1, loc));
    TRY(attention_fwd(c, L, l));
    TRY(stage(c, 0, L->ao, T * qd, c->dc, &xs));
    if (m->sandwich_norm) {
        TRY(lin_fwd(c, xs, qd, W(c, l, XENT_P_WO), NULL, D, L->ao_o));
        TRY(rms_fwd(c, L->ao_o, Wv(c, l, XENT_P_POST_ATTN_NORM), L->h1, L->pan_r));
    } else {
        TRY(lin_fwd(c, xs, qd, W(c, l, XENT_P_WO), NULL, D, L->h1));
    }
    k_add<<<nblocks(T * D, 256), 256>>>(L->h1, x, L->h1, T * D, dcode(c->dr));
    TRY(launched("residual"));
    TRY(rms_fwd(c, L->h1, Wv(c, l, XENT_P_MLP_NORM), L->xn2, L->rms2));
    TRY(stage(c, 0, L->xn2, T * D, c->dc, &xs));
    TRY(lin_fwd(c, xs, D, W(c, l, XENT_P_WGATE), NULL, H, L->gt));
    TRY(lin_fwd(c, xs, D, W(c, l, XENT_P_WUP), NULL, H, L->up));
    k_glu_fwd<<<nblocks(T * H, 256), 256>>>(L->gt, L->up, L->act, T * H, m->gelu_tanh,
                                            dcode(c->dc));
    TRY(launched("mlp activation"));
    TRY(stage(c, 0, L->act, T * H, c->dc, &xs));
    if (m->sandwich_norm) {
        TRY(lin_fwd(c, xs, H, W(c, l, XENT_P_WDOWN), NULL, D, L->mo));
        TRY(rms_fwd(c, L->mo, Wv(c, l, XENT_P_POST_FF_NORM), y, L->pfn_r));
    } else {
        TRY(lin_fwd(c, xs, H, W(c, l, XENT_P_WDOWN), NULL, D, y));
    }
    k_add<<<nblocks(T * D, 256), 256>>>(y, L->h1, y, T * D, dcode(c->dr));
    return launched("residual");
}

static xent_status layer_bwd(dctx *c, int64_t l, float *rec) {
    const xent_model_config *m = c->c;
    xdev_layer *L = &c->b.ly[l];
    int64_t D = m->dim, H = m->hidden, hd = m->head_dim, qd = m->n_heads * hd,
            kvd = m->n_kv_heads * hd, T = c->T;
    int loc = xent_model_layer_sliding(m, l);
    xdev_bufs *b = &c->b;
    const float *dmo = b->dx;
    if (m->sandwich_norm) {
        TRY(rms_bwd(c, L->mo, Wv(c, l, XENT_P_POST_FF_NORM), L->pfn_r, b->dx, b->dxb,
                    G(c, l, XENT_P_POST_FF_NORM), 0));
        dmo = b->dxb;
    }
    TRY(lin_bwd(c, dmo, D, L->act, H, W(c, l, XENT_P_WDOWN), G(c, l, XENT_P_WDOWN), NULL, b->dh,
                0.0f));
    k_glu_bwd<<<nblocks(T * H, 256), 256>>>(L->gt, L->up, b->dh, b->dh2, T * H, m->gelu_tanh,
                                            dcode(c->dc));
    TRY(launched("mlp activation backward"));
    TRY(lin_bwd(c, b->dh, H, L->xn2, D, W(c, l, XENT_P_WGATE), G(c, l, XENT_P_WGATE), NULL,
                b->dxn, 0.0f));
    TRY(lin_bwd(c, b->dh2, H, L->xn2, D, W(c, l, XENT_P_WUP), G(c, l, XENT_P_WUP), NULL, b->dxn,
                1.0f));
    TRY(rms_bwd(c, L->h1, Wv(c, l, XENT_P_MLP_NORM), L->rms2, b->dxn, b->dx,
                G(c, l, XENT_P_MLP_NORM), 1));
    const float *dao_o = b->dx;
    if (m->sandwich_norm) {
        TRY(rms_bwd(c, L->ao_o, Wv(c, l, XENT_P_POST_ATTN_NORM), L->pan_r, b->dx, b->dxb,
                    G(c, l, XENT_P_POST_ATTN_NORM), 0));
        dao_o = b->dxb;
    }
    TRY(lin_bwd(c, dao_o, D, L->ao, qd, W(c, l, XENT_P_WO), G(c, l, XENT_P_WO), NULL, b->dao,
                0.0f));
    TRY(attention_bwd(c, L, l));
    TRY(rope(c, b->dq, m->n_heads, -1, loc));
    TRY(rope(c, b->dk, m->n_kv_heads, -1, loc));
    if (m->qk_norm) {
        TRY(rms_bwd_n(c, L->qpre, Wv(c, l, XENT_P_Q_NORM), L->qn_r, b->dq, b->dq,
                      G(c, l, XENT_P_Q_NORM), 0, T * m->n_heads, hd));
        TRY(rms_bwd_n(c, L->kpre, Wv(c, l, XENT_P_K_NORM), L->kn_r, b->dk, b->dk,
                      G(c, l, XENT_P_K_NORM), 0, T * m->n_kv_heads, hd));
    }
    TRY(lin_bwd(c, b->dq, qd, L->xn1, D, W(c, l, XENT_P_WQ), G(c, l, XENT_P_WQ),
                G(c, l, XENT_P_BQ), b->dxn, 0.0f));
    TRY(lin_bwd(c, b->dk, kvd, L->xn1, D, W(c, l, XENT_P_WK), G(c, l, XENT_P_WK),
                G(c, l, XENT_P_BK), b->dxn, 1.0f));
    TRY(lin_bwd(c, b->dv, kvd, L->xn1, D, W(c, l, XENT_P_WV), G(c, l, XENT_P_WV),
                G(c, l, XENT_P_BV), b->dxn, 1.0f));
    TRY(rms_bwd(c, b->x[l], Wv(c, l, XENT_P_ATTN_NORM), L->rms1, b->dxn, b->dx,
                G(c, l, XENT_P_ATTN_NORM), 1));
    if (rec)
        TRY(cu_err(cudaMemcpyAsync(rec, b->dx, (size_t)(T * D) * 4, cudaMemcpyDeviceToDevice, 0),
                   "record copy"));
    return XENT_OK;
}

/* ---- the loss ------------------------------------------------------------------ */

/* logits -> nll (host [T]) and, when backward, dlogits (rounded to the
 * compute dtype): xent_cuda_ce for the exact kernel, the audit's common
 * forms on the host. grow: host [T] row weights (times the loss scale). */
static xent_status loss_step(dctx *c, const int32_t *lab_h, const float *grow_h,
                             const int32_t *lab_d, float *nll_h, xent_ce_form form,
                             int backward) {
    int64_t T = c->T, V = c->c->vocab;
    if (form == XENT_CE_EXACT) {
        TRY(cu_err(cudaMemcpy(c->b.grow, grow_h, (size_t)T * 4, cudaMemcpyHostToDevice),
                   "row weights upload"));
        xent_ce_opts o;
        xent_ce_opts_init(&o);
        o.reduction = XENT_REDUCE_NONE;
        xent_ce_input in;
        memset(&in, 0, sizeof in);
        in.logits = c->b.logits;
        in.dtype = XENT_F32;
        in.T = T;
        in.V = V;
        in.ld = V;
        in.labels = lab_d;
        in.label_dtype = XENT_I32;
        in.grad_rows = c->b.grow;
        xent_ce_output out;
        memset(&out, 0, sizeof out);
        out.nll = c->b.nll;
        out.grad = backward ? c->b.dlogits : NULL;
        out.grad_dtype = XENT_F32;
        TRY(xent_cuda_ce(&in, &o, &out, NULL));
        TRY(cu_err(cudaMemcpy(nll_h, c->b.nll, (size_t)T * 4, cudaMemcpyDeviceToHost),
                   "nll download"));
    } else {
        float *z = (float *)malloc((size_t)(T * V) * sizeof(float)); /* [T, V] */
        float *row = (float *)malloc((size_t)V * sizeof(float));     /* [V] */
        if (!z || !row) {
            free(z), free(row);
            return xent_set_error(XENT_ERR_ALLOC, "resident model: host logits for the CE form");
        }
        xent_status st = cu_err(cudaMemcpy(z, c->b.logits, (size_t)(T * V) * 4,
                                           cudaMemcpyDeviceToHost), "logits download");
        for (int64_t t = 0; !st && t < T; t++) {
            float *d = z + t * V;
            if (lab_h[t] < 0) {
                nll_h[t] = 0;
                if (backward) memset(d, 0, (size_t)V * sizeof(float));
                continue;
            }
            xent__ce_form_row(form, d, V, lab_h[t], &nll_h[t], backward ? row : NULL);
            if (backward)
                for (int64_t j = 0; j < V; j++) d[j] = row[j] * grow_h[t];
        }
        if (!st && backward)
            st = cu_err(cudaMemcpy(c->b.dlogits, z, (size_t)(T * V) * 4, cudaMemcpyHostToDevice),
                        "dlogits upload");
        free(z), free(row);
        if (st) return st;
    }
    if (backward) TRY(drnd(c->b.dlogits, T * V, c->dc));
    return XENT_OK;
}

/* ---- the whole model ------------------------------------------------------------ */

typedef struct dpass {
    const xent_model_run_opts *o;
    const xent__dev_io *io;
    xent_ce_form form;
    int64_t r0;         /* first token of the micro-batch                  */
    float *grow_h;      /* host [T] scratch                                */
    float *nll_h;       /* host [T] scratch                                */
    float **rec;        /* [L] device record views, or NULL                */
    float *rec0;
} dpass;

static xent_status model_fwd_bwd(dctx *c, dpass *ps, int backward) {
    const xent_model_config *m = c->c;
    int64_t D = m->dim, V = m->vocab, T = c->T;
    xdev_bufs *b = &c->b;
    float es = m->embed_scale ? (float)sqrt((double)D) : 1.0f;
    if (m->embed_scale && c->dr != XENT_F32) es = xent_round_to(es, c->dr);
    k_embed<<<nblocks(T * D, 256), 256>>>(b->x[0], c->s->w[0], c->s->wt[0], c->tok, T, D, es,
                                          m->embed_scale, dcode(c->dr));
    TRY(launched("embedding"));
    for (int64_t l = 0; l < m->n_layers; l++) {
        TRY(layer_fwd(c, l));
        if (ps->o->on_layer) ps->o->on_layer(ps->o->on_layer_ctx, l, 0);
    }
    int inorm = xent__pidx_norm(m);
    TRY(rms_fwd(c, b->x[m->n_layers], (const float *)c->s->w[inorm], b->xnf, b->rmsf));
    /* logits = round(xnf, head) W_head^T in the logits dtype */
    const float *xh = b->xnf;
    if (c->dh != XENT_F32) {
        TRY(cu_err(cudaMemcpyAsync(b->scr, b->xnf, (size_t)(T * D) * 4, cudaMemcpyDeviceToDevice,
                                   0), "copy"));
        TRY(drnd(b->scr, T * D, c->dh));
        xh = b->scr;
    }
    opnd xs, wh;
    TRY(stage(c, 0, xh, T * D, c->dh, &xs));
    TRY(wop(c, c->wh, V * D, c->dh, &wh));
    TRY(gemm1(c, 0, 1, T, V, D, 1.0f, xs, D, wh, D, 0.0f, b->logits, V));
    TRY(drnd(b->logits, T * V, c->dl));
    const double fc = m->final_softcap;
    if (fc > 0) {
        k_softcap<<<nblocks(T * V, 256), 256>>>(b->logits, T * V, fc, dcode(c->dl));
        TRY(launched("final softcap"));
    }
    const int32_t *lab_h = ps->io->lab + ps->r0;
    TRY(loss_step(c, lab_h, ps->grow_h, b->lab, ps->nll_h, ps->form, backward));
    if (!backward) return XENT_OK;
    if (fc > 0) {
        k_softcap_bwd<<<nblocks(T * V, 256), 256>>>(b->dlogits, b->logits, T * V, fc,
                                                    dcode(c->dc));
        TRY(launched("final softcap backward"));
    }
    int ih = xent__pidx_head(m);
    float *dWh = c->g[ih];
    opnd dls, xhs;
    xent_dtype pt = prod_dt(c->dc, c->dh);
    TRY(stage(c, 0, b->dlogits, T * V, pt, &dls));
    TRY(stage(c, 1, xh, T * D, pt, &xhs));
    TRY(gemm1(c, 1, 0, V, D, T, 1.0f, dls, V, xhs, D, 0.0f, dWh, D));
    TRY(drnd(dWh, V * D, c->dc));
    TRY(wop(c, c->wh, V * D, pt, &wh));
    TRY(gemm1(c, 0, 0, T, D, V, 1.0f, dls, V, wh, D, 0.0f, b->dxn, D));
    TRY(drnd(b->dxn, T * D, c->dc));
    TRY(rms_bwd(c, b->x[m->n_layers], (const float *)c->s->w[inorm], b->rmsf, b->dxn, b->dx,
                c->g[inorm], 0));
    for (int64_t l = m->n_layers - 1; l >= 0; l--) {
        TRY(layer_bwd(c, l, ps->rec ? ps->rec[l] : NULL));
        if (ps->o->on_layer) ps->o->on_layer(ps->o->on_layer_ctx, l, 1);
    }
    if (ps->rec0)
        TRY(cu_err(cudaMemcpyAsync(ps->rec0, b->dx, (size_t)(T * D) * 4,
                                   cudaMemcpyDeviceToDevice, 0), "record copy"));
    float *dE = c->g[0];
    if (!m->tied_head)
        TRY(cu_err(cudaMemsetAsync(dE, 0, (size_t)(V * D) * 4, 0), "memset"));
    k_embed_bwd<<<nblocks(D, 128), 128>>>(dE, b->dx, c->tok, T, D, es, m->embed_scale);
    TRY(launched("embedding backward"));
    return drnd(dE, V * D, c->dc);
}

/* ---- the driver ------------------------------------------------------------------ */

static xent_status ensure_state(const xent_model *m, void **state, const xent_precision *p,
                                const xent_model_run_opts *o, dstate **out) {
    dstate *s = (dstate *)*state;
    if (!s) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
            (void)cudaGetLastError();
            return xent_set_error(XENT_ERR_CUDA, "--device cuda (resident model): no CUDA "
                                  "device");
        }
        s = (dstate *)calloc(1, sizeof *s);
        if (!s) return xent_set_error(XENT_ERR_ALLOC, "resident model: state");
        int64_t L = m->cfg.n_layers;
        s->m = m;
        s->w = (void **)calloc((size_t)m->n_params, sizeof *s->w);
        s->wt = (int *)calloc((size_t)m->n_params, sizeof *s->wt);
        s->x = (float **)calloc((size_t)(L + 1), sizeof *s->x);
        s->rec_dx = (float **)calloc((size_t)(L + 1), sizeof *s->rec_dx);
        s->ly = (xdev_layer *)calloc((size_t)(L + 1), sizeof *s->ly);
        if (!s->w || !s->wt || !s->x || !s->rec_dx || !s->ly) {
            xent__model_dev_free(s);
            return xent_set_error(XENT_ERR_ALLOC, "resident model: state");
        }
        *state = s;
        xent_status st = blas_err(cublasCreate(&s->h), "cublasCreate");
        if (st) return st;
        /* tensor cores for 16-bit inputs; fp32 products ask for
         * CUBLAS_COMPUTE_32F_PEDANTIC (no TF32) */
        TRY(blas_err(cublasSetMathMode(s->h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
    }
    if (s->m != m)
        return xent_set_error(XENT_ERR_VALUE, "resident model: workspace made for another "
                              "model");
    /* the plan against the card's free memory (what this state holds will
     * be reused or given back) */
    xent_model_dev_plan pl;
    TRY(xent_model_dev_plan_make(&m->cfg, o->B, o->S, o->record, p, &pl));
    uint64_t fr = 0, tot = 0;
    TRY(xent_model_dev_mem(&fr, &tot));
    TRY(xent_model_dev_plan_fits(&pl, fr + held_bytes(s), tot));
    int need16 = p->compute != XENT_F32 || p->lm_head != XENT_F32;
    int64_t n = xdev_layout(&m->cfg, NULL, o->B, 0, o->S, o->record, need16, NULL, NULL);
    if ((int64_t)s->arena_n < n) {
        cudaFree(s->arena);
        s->arena = NULL;
        s->arena_n = 0;
        TRY(dmalloc((void **)&s->arena, (size_t)n * 4, "cudaMalloc (activations)"));
        s->arena_n = (size_t)n;
    }
    int64_t nw = xent_model_n_weights(m);
    if (!s->grads) TRY(dmalloc((void **)&s->grads, (size_t)nw * 4, "cudaMalloc (gradients)"));
    if (p->micro_batches > 1 && !s->gmb)
        TRY(dmalloc((void **)&s->gmb, (size_t)nw * 4, "cudaMalloc (micro-batch gradients)"));
    TRY(ensure_weights(s, p));
    *out = s;
    return XENT_OK;
}

/* The views of micro-batch b0..b0+Bm of a B-row run. */
static void views(dstate *s, const xent_model_run_opts *o, int64_t b0, int need16, xdev_bufs *b) {
    memset(b, 0, sizeof *b);
    b->x = s->x;
    b->ly = s->ly;
    b->rec_dx = s->rec_dx;
    xdev_layout(&s->m->cfg, s->arena, o->B, b0, o->S, o->record, need16, b, NULL);
}

static xent_status run_pass(dstate *s, const xent_precision *p, const xent_model_run_opts *o,
                            const xent__dev_io *io, double ls, double *loss, int *bad,
                            float *grow_h, float *nll_h) {
    const xent_model *m = s->m;
    int nmb = p->micro_batches, bw = o->backward;
    int64_t Bm = o->B / nmb, nw = xent_model_n_weights(m), S = o->S;
    int direct = nmb == 1 && p->grad_accum == XENT_F32 && ls == 1.0;
    int inplace = nmb == 1 && !direct;
    int need16 = p->compute != XENT_F32 || p->lm_head != XENT_F32;
    int ih = xent__pidx_head(&m->cfg);
    float **gp = (float **)calloc((size_t)m->n_params, sizeof *gp);
    if (!gp) return xent_set_error(XENT_ERR_ALLOC, "resident model: gradient pointers");
    float *gbase = direct || inplace ? s->grads : s->gmb;
    int64_t off = 0;
    for (int i = 0; i < m->n_params; off += m->params[i].numel, i++) gp[i] = gbase + off;
    *loss = 0;
    *bad = 0;
    xent_status st = XENT_OK;
    for (int mb = 0; !st && mb < nmb; mb++) {
        dctx c;
        memset(&c, 0, sizeof c);
        c.s = s;
        c.c = &m->cfg;
        c.B = Bm;
        c.S = S;
        c.T = Bm * S;
        c.dc = p->compute, c.dr = p->residual, c.dn = p->norm, c.da = p->attn_softmax;
        c.dh = p->lm_head, c.dl = p->logits;
        if (p->lm_head == p->compute) {
            c.wh.p = s->w[ih];
            c.wh.dt = s->wt[ih];
        } else {
            c.wh.p = s->hmem;
            c.wh.dt = dcode(p->lm_head);
        }
        c.g = bw ? gp : NULL;
        views(s, o, mb * Bm, need16, &c.b);
        int64_t r0 = mb * Bm * S;
        c.tok = c.b.tok + r0;
        const float *rope = c.b.rope;
        int64_t hh = S * m->cfg.head_dim / 2;
        c.rc = rope, c.rs = rope + hh, c.rcl = rope + 2 * hh, c.rsl = rope + 3 * hh;
        dpass ps;
        memset(&ps, 0, sizeof ps);
        ps.o = o;
        ps.io = io;
        ps.form = p->ce;
        ps.r0 = r0;
        ps.grow_h = grow_h;
        ps.nll_h = nll_h;
        if (o->record && bw) {
            ps.rec = c.b.rec_dx;
            ps.rec0 = c.b.rec_dx0;
        }
        for (int64_t t = 0; t < c.T; t++) grow_h[t] = (float)(io->rw[r0 + t] * ls);
        c.b.lab = c.b.lab + r0;
        st = model_fwd_bwd(&c, &ps, bw);
        if (st) break;
        double lsum = 0;
        for (int64_t t = 0; t < c.T; t++) {
            lsum += io->rw[r0 + t] * ls * nll_h[t];
            io->logprob[r0 + t] = io->lab[r0 + t] < 0 ? 0.0f : -nll_h[t];
        }
        *loss += lsum / ls;
        if (!bw || direct) continue;
        k_accum<<<nblocks(nw, 256), 256>>>(s->grads, inplace ? s->grads : s->gmb, nw,
                                           (float)(1.0 / ls), dcode(p->grad_accum), mb == 0);
        st = launched("gradient accumulation");
    }
    free(gp);
    if (st || !bw) return st;
    xdev_bufs b;
    views(s, o, 0, need16, &b);
    TRY(cu_err(cudaMemsetAsync(b.flag, 0, 4, 0), "memset"));
    k_finite<<<nblocks(nw, 256), 256>>>(s->grads, nw, b.flag);
    TRY(launched("finite check"));
    int32_t f = 0;
    TRY(cu_err(cudaMemcpy(&f, b.flag, 4, cudaMemcpyDeviceToHost), "flag download"));
    *bad = f != 0;
    return XENT_OK;
}

extern "C" xent_status xent__model_run_dev(const xent_model *m, void **state, int64_t ws_B,
                                           int64_t ws_S, int ws_record,
                                           const xent_precision *p,
                                           const xent_model_run_opts *o,
                                           const xent__dev_io *io, double *loss, double *ls_out) {
    (void)ws_B, (void)ws_S, (void)ws_record;
    if (!m || !state || !p || !o || !io || !loss || !ls_out)
        return xent_set_error(XENT_ERR_NULL, "resident model: NULL argument");
    dstate *s = NULL;
    TRY(ensure_state(m, state, p, o, &s));
    const xent_model_config *cfg = &m->cfg;
    int64_t T = o->B * o->S, S = o->S, hd = cfg->head_dim;
    int need16 = p->compute != XENT_F32 || p->lm_head != XENT_F32;
    xdev_bufs b;
    views(s, o, 0, need16, &b);
    TRY(cu_err(cudaMemcpy(b.tok, o->tokens, (size_t)T * 4, cudaMemcpyHostToDevice),
               "tokens upload"));
    TRY(cu_err(cudaMemcpy(b.lab, io->lab, (size_t)T * 4, cudaMemcpyHostToDevice),
               "labels upload"));
    TRY(cu_err(cudaMemcpy(b.rope, io->rope, (size_t)(2 * S * hd) * 4, cudaMemcpyHostToDevice),
               "rope upload"));
    float *grow_h = (float *)malloc((size_t)T * sizeof(float)); /* [T] */
    float *nll_h = (float *)malloc((size_t)T * sizeof(float));  /* [T] */
    if (!grow_h || !nll_h) {
        free(grow_h), free(nll_h);
        return xent_set_error(XENT_ERR_ALLOC, "resident model: %lld rows", (long long)T);
    }
    int f16 = p->compute == XENT_F16 || p->residual == XENT_F16 || p->norm == XENT_F16 ||
              p->attn_softmax == XENT_F16 || p->logits == XENT_F16;
    double ls = p->loss_scale > 0 ? p->loss_scale : (f16 ? 65536.0 : 1.0);
    double l = 0;
    int bad = 0;
    xent_status st = XENT_OK;
    for (int tries = 0; tries < 24; tries++) {
        st = run_pass(s, p, o, io, ls, &l, &bad, grow_h, nll_h);
        if (st) break;
        if (!bad || p->loss_scale > 0 || !o->backward || ls <= 1.0) break;
        ls *= 0.5;
    }
    free(grow_h), free(nll_h);
    if (st) return st;
    int64_t D = cfg->dim, V = cfg->vocab, L = cfg->n_layers;
    if (o->backward)
        TRY(cu_err(cudaMemcpy(io->grads, s->grads, (size_t)xent_model_n_weights(m) * 4,
                              cudaMemcpyDeviceToHost), "gradients download"));
    if (o->record && io->x) {
        size_t td = (size_t)(T * D) * 4, tv = (size_t)(T * V) * 4;
        for (int64_t k = 0; k <= L; k++)
            TRY(cu_err(cudaMemcpy(io->x[k], b.x[k], td, cudaMemcpyDeviceToHost), "record"));
        TRY(cu_err(cudaMemcpy(io->xnf, b.xnf, td, cudaMemcpyDeviceToHost), "record"));
        TRY(cu_err(cudaMemcpy(io->logits, b.logits, tv, cudaMemcpyDeviceToHost), "record"));
        if (o->backward) {
            if (io->dlogits && b.dlogits != b.logits)
                TRY(cu_err(cudaMemcpy(io->dlogits, b.dlogits, tv, cudaMemcpyDeviceToHost),
                           "record"));
            for (int64_t k = 0; k < L && io->rec_dx; k++)
                TRY(cu_err(cudaMemcpy(io->rec_dx[k], b.rec_dx[k], td, cudaMemcpyDeviceToHost),
                           "record"));
            if (io->rec_dx0)
                TRY(cu_err(cudaMemcpy(io->rec_dx0, b.rec_dx0, td, cudaMemcpyDeviceToHost),
                           "record"));
        }
    }
    TRY(cu_err(cudaDeviceSynchronize(), "resident model run"));
    *loss = l;
    *ls_out = ls;
    return XENT_OK;
}
