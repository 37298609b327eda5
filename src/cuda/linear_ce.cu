/* src/cuda/linear_ce.cu: the LM head fused with the cross-entropy.
 *
 * Rows are taken in groups of Tg (the gradient products' size), and each
 * group in chunks of Tl <= Tg rows (the logits buffer's size; Tl = Tg
 * without gradients). For each chunk:
 *   logits [Tl, V] fp32 = hidden_c [Tl, H] @ weight^T (+ bias)   cuBLAS, fp32 accumulation
 *   the row kernel of ce_stream.cu on those fp32 logits, writing the chunk's
 *     forward outputs and its rows of dlogits [Tg, V], rounded once to the
 *     input dtype
 * then for the group:
 *   dhidden_g [Tg, H] = dlogits @ weight                         one product over all of V
 *   dweight [V, H] (+)= dlogits^T @ hidden_g                     fp32 accumulator
 *   dbias [V] (+)= column sums of dlogits                         double accumulator
 * Large groups keep the read-modify-write of the fp32 dweight (8 V H bytes
 * a group) small beside the products; small chunks keep the fp32 logits
 * buffer small.
 * The count of rows with a target (reduction MEAN) comes from one label
 * pass over all T before the first chunk, so every chunk scales its rows
 * as the unchunked kernel would; each row's loss is added exactly into one
 * accumulator (xc_long_acc, integer atomics: no order), rounded at the end.
 *
 * Workspace (device, caller's or allocated here), each region 256-aligned:
 *   rec       16 B             label pass record
 *   acc       576 B            the reductions' exact sums and counts
 *   logits    [Tl, V] f32
 *   dlogits   [Tg, V] dtype    (gradients only)
 *   dweight   [V, H] f32       (weight gradient not in fp32)
 *   dbias     [V] f64          (bias gradient)
 *
 * cuBLAS (column-major) sees a row-major [R, C] matrix as [C, R] with
 * leading dimension C; the three products below are written in those terms. */
#include "ce_host.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#define XL_ALIGN 256
#define XL_MAX_DEVICES 64
#define XL_DEFAULT_CHUNK_BYTES ((int64_t)768 << 20)

/* ------------------------------------------------------------------ */
/* Element access                                                      */
/* ------------------------------------------------------------------ */

__device__ __forceinline__ double xl_load(const void *p, int dt, int64_t i) {
    if (dt == XENT_BF16) return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == XENT_F16) return (double)__half2float(((const __half *)p)[i]);
    return (double)((const float *)p)[i];
}

/* v rounded once to dt */
__device__ __forceinline__ void xl_store(void *p, int dt, int64_t i, double v) {
    if (dt == XENT_BF16) ((__nv_bfloat16 *)p)[i] = __double2bfloat16(v);
    else if (dt == XENT_F16) ((__half *)p)[i] = __double2half(v);
    else ((float *)p)[i] = (float)v;
}

/* dst[i] = src[i] (dtype change, one rounding), i < n */
__global__ void xl_convert_kernel(const void *src, int sdt, void *dst, int ddt, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        xl_store(dst, ddt, i, xl_load(src, sdt, i));
}

/* dst [n] f64 = src [n] (widened) */
__global__ void xl_widen64_kernel(const void *src, int sdt, double *dst, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = xl_load(src, sdt, i);
}

/* dst [n] = src [n] f64, rounded once */
__global__ void xl_narrow64_kernel(const double *src, void *dst, int ddt, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        xl_store(dst, ddt, i, src[i]);
}

/* logits [R, V] f32: every row = bias [V] (the product is then added with
 * beta = 1, so z = fl(h.w + b), one rounding) */
__global__ void xl_bias_fill_kernel(const void *bias, int dt, float *logits, int64_t R,
                                    int64_t V) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < R * V;
         i += (int64_t)gridDim.x * blockDim.x)
        logits[i] = (float)xl_load(bias, dt, i % V);
}

/* acc [V] f64 (+)= column sums of dlogits [R, V]; one thread per column,
 * rows in ascending order (a fixed order: no atomics). */
__global__ void xl_colsum_kernel(const void *dl, int dt, int64_t R, int64_t V, double *acc,
                                 int add) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < V;
         j += (int64_t)gridDim.x * blockDim.x) {
        double s = add ? acc[j] : 0.0;
        for (int64_t r = 0; r < R; r++) s += xl_load(dl, dt, r * V + j);
        acc[j] = s;
    }
}

static int xl_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (int)(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

/* ------------------------------------------------------------------ */
/* cuBLAS                                                              */
/* ------------------------------------------------------------------ */

/* One handle per thread and device (cuBLAS handles are not to be shared
 * between threads); released with the CUDA context. */
static thread_local cublasHandle_t g_handle[XL_MAX_DEVICES];

static xent_status xl_blas(cublasStatus_t e, const char *fn, const char *what) {
    if (e == CUBLAS_STATUS_SUCCESS) return XENT_OK;
    return xent_set_error(XENT_ERR_CUDA, "%s: cuBLAS %s: %s (%s)", fn, what,
                      cublasGetStatusString(e), cublasGetStatusName(e));
}

static xent_status xl_handle(const char *fn, cudaStream_t s, cublasHandle_t *h) {
    int dev = 0;
    xent_status st = xc_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    if (st != XENT_OK) return st;
    if (dev < 0 || dev >= XL_MAX_DEVICES)
        return xent_set_error(XENT_ERR_CUDA, "%s: device %d is beyond the %d supported", fn, dev,
                          XL_MAX_DEVICES);
    if (!g_handle[dev]) {
        st = xl_blas(cublasCreate(&g_handle[dev]), fn, "cublasCreate");
        if (st != XENT_OK) return st;
    }
    *h = g_handle[dev];
    return xl_blas(cublasSetStream(*h, s), fn, "cublasSetStream");
}

static cudaDataType_t xl_type(xent_dtype t) {
    return t == XENT_BF16 ? CUDA_R_16BF : (t == XENT_F16 ? CUDA_R_16F : CUDA_R_32F);
}

typedef struct xl_mat {
    const void *p;
    xent_dtype dt;
    int64_t ld;
} xl_mat;

/* C [m, n] (column-major, ldc) = op(A) op(B) + beta C, fp32 accumulation */
static xent_status xl_gemm(cublasHandle_t h, const char *fn, const char *what,
                           cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                           int64_t k, xl_mat A, xl_mat B, float beta, void *C, xent_dtype ct,
                           int64_t ldc) {
    const float alpha = 1.0f;
    return xl_blas(cublasGemmEx(h, ta, tb, (int)m, (int)n, (int)k, &alpha, A.p, xl_type(A.dt),
                                (int)A.ld, B.p, xl_type(B.dt), (int)B.ld, &beta, C, xl_type(ct),
                                (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   fn, what);
}

/* ------------------------------------------------------------------ */
/* Workspace                                                           */
/* ------------------------------------------------------------------ */

static int64_t xl_size(xent_dtype t) { return t == XENT_F32 ? 4 : 2; }
static int64_t xl_up(int64_t n) { return (n + XL_ALIGN - 1) / XL_ALIGN * XL_ALIGN; }

static int xl_has_grads(const xent_linear_grads *g) {
    return g && (g->hidden || g->weight || g->bias);
}

typedef struct xl_layout {
    int64_t fixed; /* bytes that do not depend on the chunk             */
    int64_t lrow;  /* bytes per logits row (fp32)                       */
    int64_t grow;  /* bytes per dlogits row (0 without gradients)       */
    int64_t sub;   /* logits rows per chunk with gradients              */
    int dw_ws;     /* weight gradient accumulated in the workspace      */
    int db_ws;     /* bias gradient accumulated in the workspace        */
} xl_layout;

static xl_layout xl_plan(const xent_linear_input *in, const xent_linear_grads *g) {
    xl_layout L;
    const int grads = xl_has_grads(g);
    L.dw_ws = grads && g->weight && g->weight_dtype != XENT_F32;
    L.db_ws = grads && g->bias != NULL;
    L.fixed = xl_up(sizeof(xc_label_rec)) + xl_up(sizeof(xc_long_acc)) +
              (L.dw_ws ? xl_up(in->V * in->H * 4) : 0) + (L.db_ws ? xl_up(in->V * 8) : 0);
    L.lrow = in->V * 4;
    L.grow = grads ? in->V * xl_size(in->dtype) : 0;
    L.sub = xc_linear_rows();
    return L;
}

/* Logits rows per chunk for groups of tg rows. */
static int64_t xl_chunk(const xl_layout *L, int64_t tg) {
    return L->grow && tg > L->sub ? L->sub : tg;
}

/* group rows -> chunk buffer bytes (each region padded to XL_ALIGN) */
static int64_t xl_chunk_bytes(const xl_layout *L, int64_t tg) {
    return xl_up(xl_chunk(L, tg) * L->lrow) + xl_up(tg * L->grow);
}

static int64_t xl_bytes(const xl_layout *L, int64_t tg) {
    return L->fixed + xl_chunk_bytes(L, tg);
}

/* The largest group (<= cap) whose chunk buffers fit in `room` bytes; 0 if
 * not even one row fits. */
static int64_t xl_fit(const xl_layout *L, int64_t room, int64_t cap) {
    /* more rows than room / (bytes a row needs at least) cannot fit; the
     * bound also keeps rows * bytes below 2^63 */
    const int64_t least = L->grow ? L->grow : L->lrow;
    int64_t lo = 0, hi = room / least + 1 < cap ? room / least + 1 : cap;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (xl_chunk_bytes(L, mid) <= room) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static int64_t xl_default_rows(const xent_linear_input *in, const xl_layout *L) {
    int64_t r = xl_fit(L, XL_DEFAULT_CHUNK_BYTES, (int64_t)1 << 30);
    if (r > 128) r = r / 128 * 128;
    if (r < 1) r = 1;
    return in->T > 0 && r > in->T ? in->T : r;
}

extern "C" size_t xent_cuda_linear_workspace(const xent_linear_input *in,
                                             const xent_linear_grads *grads,
                                             int64_t chunk_rows) {
    if (!in || in->T < 0 || in->V <= 0 || in->H <= 0) return 0;
    xl_layout L = xl_plan(in, grads);
    int64_t rows = chunk_rows > 0 ? chunk_rows : xl_default_rows(in, &L);
    if (in->T > 0 && rows > in->T) rows = in->T;
    return (size_t)xl_bytes(&L, rows);
}

/* ------------------------------------------------------------------ */
/* Argument checks                                                     */
/* ------------------------------------------------------------------ */

static int64_t xl_bytes_of(const void *p, int64_t n, xent_dtype t) {
    return p ? n * xl_size(t) : 0;
}

static int xl_overlap(const void *a, int64_t na, const void *b, int64_t nb) {
    if (!a || !b || na <= 0 || nb <= 0) return 0;
    const char *x = (const char *)a, *y = (const char *)b;
    return x < y + nb && y < x + na;
}

static xent_status xl_check_input(const char *fn, const xent_linear_input *in,
                                  const xent_ce_opts *o) {
    if (!in) return xent_set_error(XENT_ERR_NULL, "%s: in is NULL", fn);
    const int64_t lim = (int64_t)1 << 31;
    if (in->T < 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s: in.T = %lld must be >= 0", fn, (long long)in->T);
    if (in->H <= 0 || in->H >= lim)
        return xent_set_error(XENT_ERR_SHAPE, "%s: in.H = %lld must be in [1, 2^31)", fn,
                          (long long)in->H);
    if (in->V <= 0 || in->V >= lim)
        return xent_set_error(XENT_ERR_SHAPE, "%s: in.V = %lld must be in [1, 2^31)", fn,
                          (long long)in->V);
    if (!xc_is_float(in->dtype))
        return xent_set_error(XENT_ERR_DTYPE, "%s: in.dtype = %d is not f32, bf16 or f16", fn,
                          (int)in->dtype);
    if (in->T > 0 && !in->hidden) return xent_set_error(XENT_ERR_NULL, "%s: in.hidden is NULL", fn);
    if (in->T > 0 && !in->weight) return xent_set_error(XENT_ERR_NULL, "%s: in.weight is NULL", fn);
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent_set_error(XENT_ERR_DTYPE, "%s: in.label_dtype = %d is not i32 or i64", fn,
                          (int)in->label_dtype);
    return xc_check_opts(fn, o, in->V);
}

static xent_status xl_whole_rows(const char *fn, const xent_linear_input *in,
                                 const xent_ce_opts *o) {
    if (o->vocab_start != 0 || (o->vocab_total != 0 && o->vocab_total != in->V))
        return xent_set_error(XENT_ERR_VALUE,
                          "%s needs the whole vocabulary (opts.vocab_start = %lld, "
                          "opts.vocab_total = %lld, V = %lld); for a shard of the weight use "
                          "xent_cuda_linear_shard_stats, xent_cuda_ce_combine and "
                          "xent_cuda_linear_backward",
                          fn, (long long)o->vocab_start, (long long)o->vocab_total,
                          (long long)in->V);
    return XENT_OK;
}

static xent_status xl_check_grads(const char *fn, const xent_linear_input *in,
                                  const xent_linear_grads *g) {
    if (!xl_has_grads(g)) return XENT_OK;
    const struct { const void *p; xent_dtype t; int64_t n; const char *name; } b[3] = {
        {g->hidden, g->hidden_dtype, in->T * in->H, "grads.hidden"},
        {g->weight, g->weight_dtype, in->V * in->H, "grads.weight"},
        {g->bias, g->bias_dtype, in->V, "grads.bias"}};
    const struct { const void *p; int64_t n; const char *name; } src[3] = {
        {in->hidden, in->T * in->H, "in.hidden"},
        {in->weight, in->V * in->H, "in.weight"},
        {in->bias, in->V, "in.bias"}};
    for (int i = 0; i < 3; i++) {
        if (!b[i].p) continue;
        if (!xc_is_float(b[i].t))
            return xent_set_error(XENT_ERR_DTYPE, "%s: %s_dtype = %d is not f32, bf16 or f16", fn,
                              b[i].name, (int)b[i].t);
        if (i == 0 && b[i].t != XENT_F32 && b[i].t != in->dtype)
            return xent_set_error(XENT_ERR_DTYPE,
                              "%s: grads.hidden_dtype = %s: the hidden gradient is written "
                              "by the product itself, in in.dtype (%s) or f32",
                              fn, xent_dtype_name(b[i].t), xent_dtype_name(in->dtype));
        for (int j = 0; j < 3; j++)
            if (xl_overlap(b[i].p, xl_bytes_of(b[i].p, b[i].n, b[i].t), src[j].p,
                           xl_bytes_of(src[j].p, src[j].n, in->dtype)))
                return xent_set_error(XENT_ERR_VALUE, "%s: %s overlaps %s (the inputs are read "
                                  "while the gradients are written)", fn, b[i].name,
                                  src[j].name);
        for (int j = 0; j < i; j++)
            if (xl_overlap(b[i].p, xl_bytes_of(b[i].p, b[i].n, b[i].t), b[j].p,
                           xl_bytes_of(b[j].p, b[j].n, b[j].t)))
                return xent_set_error(XENT_ERR_VALUE, "%s: %s overlaps %s", fn, b[i].name,
                                  b[j].name);
    }
    return XENT_OK;
}

/* ------------------------------------------------------------------ */
/* The chunk loop                                                      */
/* ------------------------------------------------------------------ */

typedef struct xl_run {
    const char *fn;
    const xent_linear_input *in;
    const xent_ce_opts *opts;
    const xent_linear_grads *g; /* NULL or without pointers: no gradients */
    xc_params base;             /* mode, outputs at row 0, rec, acc       */
    cudaStream_t s;
    cublasHandle_t h;
    int64_t Tg, Tl; /* group and chunk rows */
    /* workspace regions */
    xc_label_rec *rec;
    xc_long_acc *acc;
    float *logits;  /* [Tl, V] */
    void *dlogits;  /* [Tg, V] in->dtype, or NULL */
    float *dw;      /* [V, H] f32: the caller's (fp32) or the workspace's */
    double *db;     /* [V]   */
    int dw_ws;
    int want_reduce; /* run the reduce kernel at the end */
    xent_ce_output *out;
} xl_run;

static void xl_carve(xl_run *r, const xl_layout *L, char *ws) {
    const xent_linear_input *in = r->in;
    r->rec = (xc_label_rec *)ws;
    ws += xl_up(sizeof(xc_label_rec));
    r->acc = (xc_long_acc *)ws;
    ws += xl_up(sizeof(xc_long_acc));
    r->dw = NULL;
    r->db = NULL;
    r->dw_ws = L->dw_ws;
    if (L->dw_ws) {
        r->dw = (float *)ws;
        ws += xl_up(in->V * in->H * 4);
    } else if (r->g && r->g->weight) {
        r->dw = (float *)r->g->weight;
    }
    if (L->db_ws) {
        r->db = (double *)ws;
        ws += xl_up(in->V * 8);
    }
    r->logits = (float *)ws;
    ws += xl_up(r->Tl * L->lrow);
    r->dlogits = xl_has_grads(r->g) ? (void *)ws : NULL;
}

/* Offsets every per-row pointer of the chunk's parameters by r0 rows. */
static xc_params xl_chunk_params(const xl_run *r, int64_t r0, int64_t n) {
    xc_params p = r->base;
    const xent_linear_input *in = r->in;
    p.logits = r->logits;
    p.T = n;
    if (p.labels)
        p.labels = (const char *)p.labels + r0 * (in->label_dtype == XENT_I64 ? 8 : 4);
    if (p.grad_rows) p.grad_rows += r0;
    if (p.loss_rows) p.loss_rows += r0;
    if (p.nll) p.nll += r0;
    if (p.logprob) p.logprob += r0;
    if (p.lse) p.lse += r0;
    if (p.entropy) p.entropy += r0;
    if (p.stats) p.stats += r0;
    if (p.partial) p.partial += r0;
    if (p.in_stats) p.in_stats += r0;
    return p;
}

/* logits [n, V] = hidden [r0 : r0 + n] @ weight^T (+ bias) */
static xent_status xl_logits(const xl_run *r, int64_t r0, int64_t n) {
    const xent_linear_input *in = r->in;
    const int64_t es = xl_size(in->dtype);
    float beta = 0.0f;
    if (in->bias) {
        xl_bias_fill_kernel<<<xl_blocks(n * in->V), 256, 0, r->s>>>(in->bias, in->dtype,
                                                                    r->logits, n, in->V);
        xent_status st = xc_cuda(cudaGetLastError(), "bias kernel");
        if (st != XENT_OK) return st;
        beta = 1.0f;
    }
    xl_mat W = {in->weight, in->dtype, in->H};
    xl_mat X = {(const char *)in->hidden + r0 * in->H * es, in->dtype, in->H};
    return xl_gemm(r->h, r->fn, "logits product", CUBLAS_OP_T, CUBLAS_OP_N, in->V, n, in->H, W,
                   X, beta, r->logits, XENT_F32, in->V);
}

/* The products of the chunk's dlogits [n, V] with weight and hidden. */
static xent_status xl_backprop(const xl_run *r, int64_t r0, int64_t n, int first) {
    const xent_linear_input *in = r->in;
    const xent_linear_grads *g = r->g;
    const int64_t es = xl_size(in->dtype);
    xl_mat D = {r->dlogits, in->dtype, in->V};
    xent_status st = XENT_OK;
    if (g->hidden) { /* [n, H] = dlogits [n, V] @ weight [V, H] */
        xl_mat W = {in->weight, in->dtype, in->H};
        void *C = (char *)g->hidden + r0 * in->H * xl_size(g->hidden_dtype);
        st = xl_gemm(r->h, r->fn, "hidden gradient product", CUBLAS_OP_N, CUBLAS_OP_N, in->H, n,
                     in->V, W, D, g->accumulate ? 1.0f : 0.0f, C, g->hidden_dtype, in->H);
    }
    if (st == XENT_OK && g->weight) { /* [V, H] (+)= dlogits^T [V, n] @ hidden [n, H] */
        xl_mat X = {(const char *)in->hidden + r0 * in->H * es, in->dtype, in->H};
        const int add = !first || g->accumulate;
        st = xl_gemm(r->h, r->fn, "weight gradient product", CUBLAS_OP_N, CUBLAS_OP_T, in->H,
                     in->V, n, X, D, add ? 1.0f : 0.0f, r->dw, XENT_F32, in->H);
    }
    if (st == XENT_OK && g->bias) {
        xl_colsum_kernel<<<xl_blocks(in->V), 256, 0, r->s>>>(
            r->dlogits, in->dtype, n, in->V, r->db, !first || g->accumulate);
        st = xc_cuda(cudaGetLastError(), "bias gradient kernel");
    }
    return st;
}

/* Accumulators that start from the caller's values (accumulate = 1). */
static xent_status xl_grads_begin(const xl_run *r) {
    const xent_linear_grads *g = r->g;
    const xent_linear_input *in = r->in;
    if (!xl_has_grads(g) || !g->accumulate) return XENT_OK;
    if (g->weight && r->dw_ws) {
        xl_convert_kernel<<<xl_blocks(in->V * in->H), 256, 0, r->s>>>(
            g->weight, g->weight_dtype, r->dw, XENT_F32, in->V * in->H);
        xent_status st = xc_cuda(cudaGetLastError(), "weight gradient widening");
        if (st != XENT_OK) return st;
    }
    if (g->bias) {
        xl_widen64_kernel<<<xl_blocks(in->V), 256, 0, r->s>>>(g->bias, g->bias_dtype, r->db,
                                                              in->V);
        return xc_cuda(cudaGetLastError(), "bias gradient widening");
    }
    return XENT_OK;
}

/* Writes the workspace accumulators into the caller's buffers; with T = 0
 * (no chunk ran) the gradients are zero (or left as they are). */
static xent_status xl_grads_end(const xl_run *r, int ran) {
    const xent_linear_grads *g = r->g;
    const xent_linear_input *in = r->in;
    if (!xl_has_grads(g)) return XENT_OK;
    xent_status st = XENT_OK;
    if (!ran && !g->accumulate) {
        if (g->weight)
            st = xc_cuda(cudaMemsetAsync(g->weight, 0, in->V * in->H * xl_size(g->weight_dtype),
                                         r->s), "weight gradient zero");
        if (st == XENT_OK && g->bias)
            st = xc_cuda(cudaMemsetAsync(g->bias, 0, in->V * xl_size(g->bias_dtype), r->s),
                         "bias gradient zero");
        return st;
    }
    if (g->weight && r->dw_ws) {
        xl_convert_kernel<<<xl_blocks(in->V * in->H), 256, 0, r->s>>>(
            r->dw, XENT_F32, g->weight, g->weight_dtype, in->V * in->H);
        st = xc_cuda(cudaGetLastError(), "weight gradient rounding");
    }
    if (st == XENT_OK && g->bias) {
        xl_narrow64_kernel<<<xl_blocks(in->V), 256, 0, r->s>>>(r->db, g->bias, g->bias_dtype,
                                                               in->V);
        st = xc_cuda(cudaGetLastError(), "bias gradient rounding");
    }
    return st;
}

static xent_status xl_chunks(xl_run *r) {
    const xent_linear_input *in = r->in;
    xent_status st = xl_grads_begin(r);
    const int64_t es = xl_size(in->dtype);
    for (int64_t g0 = 0; st == XENT_OK && g0 < in->T; g0 += r->Tg) {
        const int64_t ng = in->T - g0 < r->Tg ? in->T - g0 : r->Tg;
        for (int64_t r0 = g0; st == XENT_OK && r0 < g0 + ng; r0 += r->Tl) {
            const int64_t n = g0 + ng - r0 < r->Tl ? g0 + ng - r0 : r->Tl;
            st = xl_logits(r, r0, n);
            if (st != XENT_OK) break;
            xc_params p = xl_chunk_params(r, r0, n);
            p.grad = r->dlogits ? (char *)r->dlogits + (r0 - g0) * in->V * es : NULL;
            st = xc_cuda((cudaError_t)xc_launch_rows(&p, r->s), "row kernel");
        }
        if (st == XENT_OK && r->dlogits) st = xl_backprop(r, g0, ng, g0 == 0);
    }
    if (st == XENT_OK) st = xl_grads_end(r, in->T > 0);
    if (st == XENT_OK && r->want_reduce) {
        xc_params p = r->base;
        xent_ce_output *o = r->out;
        st = xc_cuda((cudaError_t)xc_launch_reduce(
                         &p, p.reduction == XENT_REDUCE_NONE ? NULL : o->loss, o->n_counted,
                         o->n_nonfinite, r->s),
                     "reduce kernel");
    }
    return st;
}

/* Sizes the chunk from the workspace (or allocates the default one), runs
 * the label pass (checking: one synchronization, nothing written on a bad
 * label), then the chunks. */
static xent_status xl_execute(xl_run *r, void *ws, size_t ws_bytes) {
    const xent_linear_input *in = r->in;
    xl_layout L = xl_plan(in, r->g);
    const char *fn = r->fn;
    void *own = NULL;
    if (!ws) {
        r->Tg = xl_default_rows(in, &L);
        ws_bytes = (size_t)xl_bytes(&L, r->Tg);
        xent_status st = xc_alloc(&own, ws_bytes, r->s, "workspace");
        if (st != XENT_OK) return st;
        ws = own;
    } else {
        const int64_t need1 = xl_bytes(&L, 1);
        if ((int64_t)ws_bytes < need1)
            return xent_set_error(XENT_ERR_SHAPE,
                              "%s: workspace_bytes = %llu is below the %lld needed for one row "
                              "(xent_cuda_linear_workspace gives the default: %llu)",
                              fn, (unsigned long long)ws_bytes, (long long)need1,
                              (unsigned long long)xent_cuda_linear_workspace(in, r->g, 0));
        r->Tg = xl_fit(&L, (int64_t)ws_bytes - L.fixed, in->T > 0 ? in->T : 1);
    }
    r->Tl = xl_chunk(&L, r->Tg);
    if (((uintptr_t)ws) % XL_ALIGN != 0) {
        return xent_set_error(XENT_ERR_VALUE, "%s: workspace %p is not %d-byte aligned", fn, ws,
                          XL_ALIGN);
    }
    xl_carve(r, &L, (char *)ws);
    r->base.rec = r->rec;
    if (r->want_reduce) r->base.acc = r->acc;
    xent_status st = xc_label_pass(fn, &r->base, r->rec, r->s);
    if (st == XENT_OK) st = xl_handle(fn, r->s, &r->h);
    if (st == XENT_OK) st = xl_chunks(r);
    if (own) {
        cudaError_t e = cudaFreeAsync(own, r->s);
        if (st == XENT_OK && e != cudaSuccess) st = xc_cuda(e, "cudaFreeAsync (workspace)");
    }
    return st;
}

/* The row kernel's parameters for the whole of T: the logits are fp32
 * [Tl, V] in the workspace; labels, options and per-row inputs are the
 * caller's. */
static xc_params xl_base(const xent_linear_input *in, const xent_ce_opts *o) {
    xent_ce_input ci;
    memset(&ci, 0, sizeof ci);
    ci.dtype = XENT_F32;
    ci.T = in->T;
    ci.V = in->V;
    ci.labels = in->labels;
    ci.label_dtype = in->label_dtype;
    ci.grad_rows = in->grad_rows;
    xc_params p = xc_make(&ci, o);
    p.grad_dtype = in->dtype;
    p.ld_grad = in->V;
    p.fast_f32 = 1; /* the error is the GEMM's; docs/linear_ce.md */
    p.exact = 0;    /* (so exact mode does not apply either) */
    return p;
}

static void xl_run_init(xl_run *r, const char *fn, const xent_linear_input *in,
                        const xent_ce_opts *o, const xent_linear_grads *g, void *stream) {
    memset(r, 0, sizeof *r);
    r->fn = fn;
    r->in = in;
    r->opts = o;
    r->g = g;
    r->s = (cudaStream_t)stream;
    r->base = xl_base(in, o);
}

/* ------------------------------------------------------------------ */
/* Entry points                                                        */
/* ------------------------------------------------------------------ */

extern "C" xent_status xent_cuda_linear_ce(const xent_linear_input *in,
                                           const xent_ce_opts *opts, xent_ce_output *out,
                                           const xent_linear_grads *grads, void *workspace,
                                           size_t workspace_bytes, void *stream) {
    const char *fn = "xent_cuda_linear_ce";
    xent_ce_opts d;
    if (!opts) { xent_ce_opts_init(&d); opts = &d; }
    if (!out) return xent_set_error(XENT_ERR_NULL, "%s: out is NULL", fn);
    xent_status st = xl_check_input(fn, in, opts);
    if (st == XENT_OK) st = xl_whole_rows(fn, in, opts);
    if (st == XENT_OK && out->grad)
        st = xent_set_error(XENT_ERR_VALUE, "%s: out->grad must be NULL (the fused head keeps no "
                        "logit buffer: its gradients go to `grads`)", fn);
    if (st == XENT_OK) st = xl_check_grads(fn, in, grads);
    if (st != XENT_OK) return st;
    xl_run r;
    xl_run_init(&r, fn, in, opts, xl_has_grads(grads) ? grads : NULL, stream);
    if (in->T == 0 && !xl_has_grads(grads)) return xc_zero_rows(out, opts, r.s);
    xc_params *p = &r.base;
    p->mode = XC_MODE_FWD;
    xc_set_outputs(p, out);
    r.out = out;
    r.want_reduce = (out->loss && p->reduction != XENT_REDUCE_NONE) || out->n_counted ||
                    out->n_nonfinite;
    return xl_execute(&r, workspace, workspace_bytes);
}

extern "C" xent_status xent_cuda_linear_logprobs(const xent_linear_input *in,
                                                 const xent_ce_opts *opts, float *logprob,
                                                 float *entropy, void *workspace,
                                                 size_t workspace_bytes, void *stream) {
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.logprob = logprob;
    out.entropy = entropy;
    const char *fn = "xent_cuda_linear_logprobs";
    xent_ce_opts d;
    if (!opts) { xent_ce_opts_init(&d); opts = &d; }
    xent_status st = xl_check_input(fn, in, opts);
    if (st == XENT_OK) st = xl_whole_rows(fn, in, opts);
    if (st != XENT_OK || in->T == 0) return st;
    xl_run r;
    xl_run_init(&r, fn, in, opts, NULL, stream);
    r.base.mode = XC_MODE_FWD;
    xc_set_outputs(&r.base, &out);
    r.out = &out;
    return xl_execute(&r, workspace, workspace_bytes);
}

extern "C" xent_status xent_cuda_linear_shard_stats(const xent_linear_input *in,
                                                    const xent_ce_opts *opts,
                                                    xent_ce_partial *partial, void *workspace,
                                                    size_t workspace_bytes, void *stream) {
    const char *fn = "xent_cuda_linear_shard_stats";
    xent_ce_opts d;
    if (!opts) { xent_ce_opts_init(&d); opts = &d; }
    xent_status st = xl_check_input(fn, in, opts);
    if (st == XENT_OK && in->T > 0 && !partial)
        st = xent_set_error(XENT_ERR_NULL, "%s: partial is NULL", fn);
    if (st != XENT_OK || in->T == 0) return st;
    xl_run r;
    xl_run_init(&r, fn, in, opts, NULL, stream);
    r.base.mode = XC_MODE_PART;
    r.base.partial = partial;
    r.base.extra = 1;
    return xl_execute(&r, workspace, workspace_bytes);
}

extern "C" xent_status xent_cuda_linear_backward(const xent_linear_input *in,
                                                 const xent_ce_opts *opts,
                                                 const xent_ce_stats *stats,
                                                 const xent_linear_grads *grads,
                                                 void *workspace, size_t workspace_bytes,
                                                 void *stream) {
    const char *fn = "xent_cuda_linear_backward";
    xent_ce_opts d;
    if (!opts) { xent_ce_opts_init(&d); opts = &d; }
    xent_status st = xl_check_input(fn, in, opts);
    if (st == XENT_OK && in->T > 0 && !stats)
        st = xent_set_error(XENT_ERR_NULL, "%s: stats is NULL", fn);
    if (st == XENT_OK && !xl_has_grads(grads))
        st = xent_set_error(XENT_ERR_NULL, "%s: grads is NULL or names no buffer", fn);
    if (st == XENT_OK) st = xl_check_grads(fn, in, grads);
    if (st != XENT_OK) return st;
    xl_run r;
    xl_run_init(&r, fn, in, opts, grads, stream);
    r.base.mode = XC_MODE_BWD;
    r.base.in_stats = stats;
    return xl_execute(&r, workspace, workspace_bytes);
}
