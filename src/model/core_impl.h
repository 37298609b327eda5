/* src/model/core_impl.h: the model's forward and backward pass, written once
 * for a real type R and included by core_f32.c (R = float, with the
 * precision policy's rounding at every storage point) and core_f64.c
 * (R = double, no rounding: the reference and the gradient check).
 * Before including, define R, GEMM (cblas_sgemm / cblas_dgemm) and
 * ROUNDING (1: apply the policy, 0: none).
 *
 * Notation: T = B*S tokens, D = dim, H = hidden, qd = n_heads*head_dim,
 * kvd = n_kv_heads*head_dim, V = vocab. Linear layers follow HF: y = x W^T
 * with W [out, in]. */
#include "model/model_internal.h"

#include <cblas.h>
#include <stdlib.h>
#if ROUNDING && defined(__AVX512F__) && !defined(XENT_NO_SIMD)
#include <immintrin.h>
#endif
#include <string.h>

/* Per-layer saved activations (all [T, .] row-major). */
typedef struct {
    R *xn1;   /* [T, D]   attention RMSNorm output                         */
    R *rms1;  /* [T]      1/rms of the layer input                         */
    R *q;     /* [T, qd]  queries after RoPE                               */
    R *k;     /* [T, kvd] keys after RoPE                                  */
    R *v;     /* [T, kvd] values                                           */
    R *att;   /* [B, nh, S, S] softmax probabilities (0 above diagonal)    */
    R *ao;    /* [T, qd]  attention output before o_proj                   */
    R *h1;    /* [T, D]   residual after attention                         */
    R *xn2;   /* [T, D]   MLP RMSNorm output                               */
    R *rms2;  /* [T]                                                        */
    R *gt;    /* [T, H]   gate projection                                  */
    R *up;    /* [T, H]   up projection                                    */
    R *act;   /* [T, H]   silu(gate) * up (gelu_tanh(gate) * up: GeGLU)    */
    /* present with the family's features only (else NULL): */
    R *qpre, *kpre; /* [T, qd], [T, kvd] q, k before their norms (qk_norm) */
    R *qn_r, *kn_r; /* [T*nh], [T*nkv] 1/rms of each head's q, k           */
    R *ao_o;  /* [T, D]   o_proj output before the post-norm (sandwich)    */
    R *pan_r; /* [T]      its 1/rms                                        */
    R *mo;    /* [T, D]   down_proj output before the post-norm (sandwich) */
    R *pfn_r; /* [T]                                                        */
    R *attc;  /* [B, nh, S, S] soft-capped scores (attn_softcap)           */
} xm_layer;

typedef struct {
    const xent_model_config *c;
    int64_t B, S, T;
    xent_dtype dt_comp, dt_res, dt_norm, dt_att, dt_head, dt_logits;
    const R *const *w;   /* [n_params] weights (compute-dtype values)      */
    const R *w_head;     /* [V, D] head weight (lm_head-dtype values)      */
    R **g;               /* [n_params] gradient outputs, or NULL           */
    const int32_t *tok;  /* [T]                                            */
    const int32_t *lab;  /* [T] targets, -100 = ignored                    */
    const double *rw;    /* [T] dL/d(nll_t) weights (times loss scale)     */
    R **x;               /* [L+1] -> [T, D]: x[0] embeddings, x[l+1] the
                            output of layer l                              */
    xm_layer *ly;        /* [L]                                            */
    R *xnf, *rmsf;       /* [T, D], [T] final norm output, 1/rms           */
    R *logits;           /* [T, V]                                         */
    R *dlogits;          /* [T, V]; may equal logits                       */
    R *dx, *dxb;         /* [T, D] residual gradient, scratch              */
    R *dq, *dk, *dv;     /* [T, qd], [T, kvd], [T, kvd]                    */
    R *dao;              /* [T, qd]                                        */
    R *dh, *dh2;         /* [T, H] x2                                      */
    R *dxn;              /* [T, D]                                         */
    R *datt;             /* [B, nh, S, S] attention-gradient scratch       */
    R *scr;              /* [T, max(D, H, qd)] rounding scratch            */
    R **rec_dx;          /* [L] -> [T, D] recorded input grads, or NULL    */
    R *rec_dx0;          /* [T, D] embeddings-output grad, or NULL         */
    const float *rcos, *rsin; /* [S, hd/2]                                 */
    const float *rcos_l, *rsin_l; /* [S, hd/2] sliding layers' (rope_local_theta
                                     > 0), else = rcos, rsin               */
    R *wone;             /* [max(D, hd)] 1 + w of a (1 + w) norm           */
    float *logprob;      /* [T] out                                        */
    xent_ce_form form;   /* loss kernel (fp32 driver)                      */
    int threads;         /* for xent_ce                                    */
    int nthr;            /* resolved worker threads for the row loops      */
    int gpu;             /* 1: matrix products on the GPU (fp32 driver)    */
    xent_status gpu_st;  /* first error of a GPU product (XENT_OK: none)   */
    int keep_layers;     /* 1: x[0..L] and ly[] already hold this forward
                            (same tokens, weights and body dtypes): the
                            embedding and the layers are not recomputed    */
    double loss;         /* out: sum_t rw_t-weighted... see loss_step      */
    void (*on_layer)(void *ctx, int64_t layer, int backward); /* or NULL   */
    void *on_layer_ctx;
} xm_ctx;

/* ---- rounding ----------------------------------------------------------- */

#if ROUNDING
static inline float rnd_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    r = ((u & 0x7FFFFFFFu) > 0x7F800000u) ? (u | 0x00400000u) & 0xFFFF0000u
                                          : r;
    float y;
    memcpy(&y, &r, 4);
    return y;
}
#if defined(__AVX512F__) && !defined(XENT_NO_SIMD)
/* 16 lanes of rnd_bf16: the same integer steps (RNE by carry, NaN kept
 * quiet), so bitwise equal to the scalar form. */
static inline __m512 rnd_bf16_x16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                   _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)),
                                 lsb);
    __m512i q = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
        _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, nan, q);
    return _mm512_castsi512_ps(
        _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* 16 lanes through fp16 and back: vcvtps2ph rounds to nearest even with
 * subnormals and overflow as IEEE says, like the scalar conversion. */
static inline __m512 rnd_f16_x16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(
        x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#define RND_SIMD 1
#else
#define RND_SIMD 0
#endif
static void rnd(R *p, int64_t n, xent_dtype t) {
    int64_t i = 0;
    if (t == XENT_BF16) {
#if RND_SIMD
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(p + i, rnd_bf16_x16(_mm512_loadu_ps(p + i)));
#endif
        for (; i < n; i++) p[i] = rnd_bf16(p[i]);
    } else if (t == XENT_F16) {
#if RND_SIMD
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(p + i, rnd_f16_x16(_mm512_loadu_ps(p + i)));
#endif
        for (; i < n; i++) p[i] = xent_round_to(p[i], XENT_F16);
    }
}
static inline R rnd1(R x, xent_dtype t) {
    if (t == XENT_BF16) return rnd_bf16(x);
    if (t == XENT_F16) return xent_round_to(x, XENT_F16);
    return x;
}
/* src rounded to the compute dtype (a scratch copy unless F32). */
static const R *as_comp(xm_ctx *c, const R *src, int64_t n) {
    if (c->dt_comp == XENT_F32) return src;
    memcpy(c->scr, src, (size_t)n * sizeof(R));
    rnd(c->scr, n, c->dt_comp);
    return c->scr;
}
#else
static void rnd(R *p, int64_t n, xent_dtype t) { (void)p, (void)n, (void)t; }
static inline R rnd1(R x, xent_dtype t) { (void)t; return x; }
static const R *as_comp(xm_ctx *c, const R *src, int64_t n) {
    (void)c, (void)n;
    return src;
}
#endif

/* ---- matrix products (row-major) ---------------------------------------- */

#if ROUNDING
#include "model/gemm_device.h"
/* A product on the GPU (real bf16/f16 tensor-core products of the same
 * stored values); the first error is kept in c->gpu_st and later products
 * are skipped (the run then fails with it). */
static void mm_gpu(xm_ctx *c, int ta, int tb, int64_t M, int64_t N, int64_t K,
                   R alpha, const R *A, int64_t lda, const R *B, int64_t ldb,
                   R beta, R *C, int64_t ldc) {
    if (c->gpu_st == XENT_OK)
        c->gpu_st = xent__gemm_device(ta, tb, M, N, K, alpha, A, lda, B, ldb,
                                      beta, C, ldc, c->dt_comp);
}
#define MM_GPU(ta, tb)                                                        \
    if (c->gpu) {                                                             \
        mm_gpu(c, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);      \
        return;                                                               \
    }
#else
#define MM_GPU(ta, tb) (void)c;
#endif

/* Matrix products in tiles, one single-threaded GEMM call per tile, the
 * tiles spread over the row loops' threads. OpenBLAS itself rounds
 * differently with its thread count (its partition picks the edge kernels,
 * and on AVX-512 a single thread may take its "direct" sgemm): with tiles
 * that depend on the product's shape alone, every output is computed by the
 * same call whatever the thread count, so results are bitwise equal for 1
 * and N threads (test model_threads_bitwise). Tiles are MM_TM x MM_TN
 * outputs, halved (the wider side first, down to 64 x 128) while the
 * product has fewer than MM_MIN_TILES of them, so that the thin products of
 * short batches still spread over many threads. One thread's sgemm measured
 * 95% of the whole product's rate in 256 x 512 tiles, 89-91% in 128 x 256,
 * 80-84% in 64 x 128 ([512,576]x[576,1536] and [2048,576]x[576,1536],
 * OpenBLAS 0.3.21 on a Zen 3 core). */
enum { MM_TM = 256, MM_TN = 512, MM_MIN_TILES = 16 };

typedef struct {
    CBLAS_TRANSPOSE ta, tb;
    int64_t M, N, K, lda, ldb, ldc, tm, tn, nj; /* tile rows, columns; tiles a row */
    R alpha, beta;
    const R *A, *B;
    R *C;
} mm_job;

static void mm_tiles(void *vj, int64_t t0, int64_t t1) {
    const mm_job *j = vj;
    for (int64_t t = t0; t < t1; t++) {
        int64_t i0 = t / j->nj * j->tm, j0 = t % j->nj * j->tn;
        int64_t mi = j->M - i0 < j->tm ? j->M - i0 : j->tm;
        int64_t nj = j->N - j0 < j->tn ? j->N - j0 : j->tn;
        const R *a = j->ta == CblasNoTrans ? j->A + i0 * j->lda : j->A + i0;
        const R *b = j->tb == CblasNoTrans ? j->B + j0 : j->B + j0 * j->ldb;
        GEMM(CblasRowMajor, j->ta, j->tb, (int)mi, (int)nj, (int)j->K,
             j->alpha, a, (int)j->lda, b, (int)j->ldb, j->beta,
             j->C + i0 * j->ldc + j0, (int)j->ldc);
    }
}

/* OpenBLAS's own threads stay off while a model runs (the tiles are the
 * parallelism); declared here, as not every cblas.h has it. */
void openblas_set_num_threads(int num_threads);

static void mm_cpu(xm_ctx *c, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                   int64_t M, int64_t N, int64_t K, R alpha, const R *A,
                   int64_t lda, const R *B, int64_t ldb, R beta, R *C,
                   int64_t ldc) {
    int64_t tm = MM_TM, tn = MM_TN;
    while ((M + tm - 1) / tm * ((N + tn - 1) / tn) < MM_MIN_TILES &&
           (tm > 64 || tn > 128)) {
        if (tn > tm) tn /= 2;
        else tm /= 2;
    }
    int64_t nj = (N + tn - 1) / tn, n = (M + tm - 1) / tm * nj;
    mm_job j = {ta, tb, M, N, K, lda, ldb, ldc, tm, tn, nj, alpha, beta, A, B, C};
    xent_parallel_for(n, c->nthr, mm_tiles, &j);
}

/* C[M,N] = alpha * A[M,K] B[N,K]^T + beta * C */
static void mm_nt(xm_ctx *c, int64_t M, int64_t N, int64_t K, R alpha,
                  const R *A, int64_t lda, const R *B, int64_t ldb, R beta,
                  R *C, int64_t ldc) {
    MM_GPU(0, 1)
    mm_cpu(c, CblasNoTrans, CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta,
           C, ldc);
}
/* C[M,N] = alpha * A[M,K] B[K,N] + beta * C */
static void mm_nn(xm_ctx *c, int64_t M, int64_t N, int64_t K, R alpha,
                  const R *A, int64_t lda, const R *B, int64_t ldb, R beta,
                  R *C, int64_t ldc) {
    MM_GPU(0, 0)
    mm_cpu(c, CblasNoTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
           beta, C, ldc);
}
/* C[M,N] = alpha * A[K,M]^T B[K,N] + beta * C */
static void mm_tn(xm_ctx *c, int64_t M, int64_t N, int64_t K, R alpha,
                  const R *A, int64_t lda, const R *B, int64_t ldb, R beta,
                  R *C, int64_t ldc) {
    MM_GPU(1, 0)
    mm_cpu(c, CblasTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta,
           C, ldc);
}

/* y[T, out] = x[T, in] W[out, in]^T (+ bias), rounded to the compute dtype.
 * x must already hold compute-dtype values. */
static void linear_fwd(xm_ctx *c, const R *x, int64_t in, const R *W,
                       const R *bias, int64_t out, R *y) {
    mm_nt(c, c->T, out, in, 1, x, in, W, in, 0, y, out);
    if (bias)
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t o = 0; o < out; o++) y[t * out + o] += bias[o];
    rnd(y, c->T * out, c->dt_comp);
}

/* Gradients of a linear layer given dy [T, out] and its input x [T, in]:
 * dW[out, in] = dy^T x; dbias = sum_t dy; dx[T, in] (+)= dy W (beta).
 * Each stored value is rounded to the compute dtype. */
static void linear_bwd(xm_ctx *c, const R *dy, int64_t out, const R *x,
                       int64_t in, const R *W, R *dW, R *db, R *dx, R beta) {
    if (dW) {
        const R *xc = as_comp(c, x, c->T * in);
        mm_tn(c, out, in, c->T, 1, dy, out, xc, in, 0, dW, in);
        rnd(dW, out * in, c->dt_comp);
    }
    if (db) { /* summed in double over the tokens */
        for (int64_t o = 0; o < out; o++) {
            double acc = 0;
            for (int64_t t = 0; t < c->T; t++) acc += dy[t * out + o];
            db[o] = (R)acc;
        }
        rnd(db, out, c->dt_comp);
    }
    if (dx) {
        mm_nn(c, c->T, in, out, 1, dy, out, W, in, beta, dx, in);
        rnd(dx, c->T * in, c->dt_comp);
    }
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* Jobs for the row-parallel loops (xent_parallel_for over rows). */
typedef struct {
    xm_ctx *c;
    xm_layer *L;
    const R *x, *w, *rinv, *dy;
    R *y, *r, *dx, *dw, *q;
    int64_t nh;
    int sign, acc;
    int64_t wd, rows;   /* RMSNorm: row width and rows                     */
    int plus_one;       /* RMSNorm: w holds 1 + w (Gemma: no rounding of
                           the normalised value before the scale)          */
    int64_t win;        /* attention: sliding window (0: none)             */
    R cap;              /* attention: soft-cap (0: none)                   */
    R *sc;              /* attention: soft-capped scores of the block      */
    const float *rc, *rs; /* RoPE tables                                   */
} pjob;

/* Starting threads costs ~20 us: small runs (under 64K activations per
 * layer buffer) stay on the calling thread. */
static void pfor(xm_ctx *c, int64_t n, xent_range_fn fn, pjob *j) {
    int small = c->T * c->c->dim < ((int64_t)1 << 16);
    xent_parallel_for(n, small ? 1 : c->nthr, fn, j);
}

/* y = round(w * round(x * r, norm), norm), r = 1/sqrt(mean(x^2) + eps) (HF:
 * normalise in fp32, cast, multiply by the weight). Rows [t0, t1). */
static void rmsnorm_rows(void *vj, int64_t t0, int64_t t1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    int64_t D = j->wd;
    for (int64_t t = t0; t < t1; t++) {
        const R *xr = j->x + t * D;
        double ss = 0;
        for (int64_t i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
        R r = (R)(1.0 / sqrt(ss / (double)D + c->c->norm_eps));
        j->r[t] = r;
        R *yr = j->y + t * D;
        if (j->plus_one)
            for (int64_t i = 0; i < D; i++) yr[i] = rnd1(xr[i] * r * j->w[i], c->dt_norm);
        else
            for (int64_t i = 0; i < D; i++)
                yr[i] = rnd1(j->w[i] * rnd1(xr[i] * r, c->dt_norm), c->dt_norm);
    }
}

/* The weight a norm multiplies by: w, or 1 + w (in R) for Gemma's norms. */
static const R *norm_w(xm_ctx *c, const R *w, int64_t wd) {
    if (!c->c->norm_plus_one) return w;
    for (int64_t i = 0; i < wd; i++) c->wone[i] = (R)1 + w[i];
    return c->wone;
}

/* RMSNorm of `rows` rows of width wd (rows * wd values). */
static void rmsnorm_fwd_n(xm_ctx *c, const R *x, const R *w, R *y, R *rinv,
                          int64_t rows, int64_t wd) {
    pjob j = {.c = c, .x = x, .w = norm_w(c, w, wd), .y = y, .r = rinv, .wd = wd,
              .rows = rows, .plus_one = c->c->norm_plus_one};
    pfor(c, rows, rmsnorm_rows, &j);
}

static void rmsnorm_fwd(xm_ctx *c, const R *x, const R *w, R *y, R *rinv) {
    rmsnorm_fwd_n(c, x, w, y, rinv, c->T, c->c->dim);
}

/* dx (+)= r*(w*dy) - x * r^3/D * sum_i(w_i dy_i x_i), rows [t0, t1). */
static void rmsnorm_bwd_rows(void *vj, int64_t t0, int64_t t1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    int64_t D = j->wd;
    for (int64_t t = t0; t < t1; t++) {
        const R *xr = j->x + t * D, *dyr = j->dy + t * D;
        R r = j->rinv[t];
        double s = 0;
        for (int64_t i = 0; i < D; i++) s += (double)j->w[i] * dyr[i] * xr[i];
        R k = (R)(s * (double)r * r * r / (double)D);
        R *dxr = j->dx + t * D;
        for (int64_t i = 0; i < D; i++) {
            R v = r * (j->w[i] * dyr[i]) - xr[i] * k;
            dxr[i] = rnd1(j->acc ? dxr[i] + v : v, c->dt_comp);
        }
    }
}

/* dw[i] = sum_t dy[t,i] x[t,i] r[t], columns [i0, i1), t in order, summed
 * in double (a float running sum over T tokens loses ~T u relative). */
static void rmsnorm_dw_cols(void *vj, int64_t i0, int64_t i1) {
    pjob *j = vj;
    int64_t D = j->wd;
    for (int64_t i = i0; i < i1; i++) {
        double acc = 0;
        for (int64_t t = 0; t < j->rows; t++)
            acc += (double)(j->dy[t * D + i] * j->x[t * D + i] * j->rinv[t]);
        j->dw[i] = (R)acc;
    }
}

/* dx is added to when acc (the residual connection), then rounded. dx may
 * be dy (in place, acc = 0): dw is summed first, and each row reads its dy
 * before writing it. */
static void rmsnorm_bwd_n(xm_ctx *c, const R *x, const R *w, const R *rinv,
                          const R *dy, R *dx, R *dw, int acc, int64_t rows,
                          int64_t wd) {
    pjob j = {.c = c, .x = x, .w = norm_w(c, w, wd), .rinv = rinv, .dy = dy,
              .dx = dx, .dw = dw, .acc = acc, .wd = wd, .rows = rows};
    if (dw) {
        pfor(c, wd, rmsnorm_dw_cols, &j);
        rnd(dw, wd, c->dt_comp);
    }
    pfor(c, rows, rmsnorm_bwd_rows, &j);
}

static void rmsnorm_bwd(xm_ctx *c, const R *x, const R *w, const R *rinv,
                        const R *dy, R *dx, R *dw, int acc) {
    rmsnorm_bwd_n(c, x, w, rinv, dy, dx, dw, acc, c->T, c->c->dim);
}

/* ---- RoPE (HF rotate_half: pairs (i, i + hd/2)) ------------------------- */

static void rope_rows(void *vj, int64_t t0, int64_t t1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    int64_t hd = c->c->head_dim, half = hd / 2, w = j->nh * hd;
    for (int64_t t = t0; t < t1; t++) {
        int64_t s = t % c->S;
        const float *cs = j->rc + s * half, *sn = j->rs + s * half;
        for (int64_t h = 0; h < j->nh; h++) {
            R *p = j->q + t * w + h * hd;
            for (int64_t i = 0; i < half; i++) {
                R a = p[i], b = p[i + half], co = cs[i], si = j->sign * sn[i];
                p[i] = rnd1(a * co - b * si, c->dt_comp);
                p[i + half] = rnd1(b * co + a * si, c->dt_comp);
            }
        }
    }
}

/* local: the sliding layers' table. */
static void rope(xm_ctx *c, R *q, int64_t nh, int sign, int local) {
    pjob j = {.c = c, .q = q, .nh = nh, .sign = sign,
              .rc = local ? c->rcos_l : c->rcos, .rs = local ? c->rsin_l : c->rsin};
    pfor(c, c->T, rope_rows, &j);
}

/* ---- attention ---------------------------------------------------------- */

/* Causal softmax of score rows [r0, r1) of [B*nh*S, S] in place; row r
 * is query position r % S. exp in double (xent__exp, vectorizable). */
static void softmax_rows(void *vj, int64_t r0, int64_t r1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    int64_t S = c->S;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % S, lo = j->win > 0 && i >= j->win ? i - j->win + 1 : 0;
        R *p = j->y + r * S;
        R mx = -INFINITY;
        for (int64_t k = lo; k <= i; k++) {
            p[k] = rnd1(p[k], c->dt_att);
            if (j->cap > 0) { /* cap * tanh(s / cap), kept for the backward */
                p[k] = rnd1((R)((double)j->cap * tanh((double)p[k] / (double)j->cap)),
                            c->dt_att);
                j->sc[r * S + k] = p[k];
            }
            mx = p[k] > mx ? p[k] : mx;
        }
        double sum = 0;
        for (int64_t k = lo; k <= i; k++) {
            double e = xent__exp((double)p[k] - (double)mx);
            p[k] = (R)e;
            sum += e;
        }
        double inv = 1.0 / sum;
        for (int64_t k = 0; k < lo; k++) p[k] = 0;
        for (int64_t k = lo; k <= i; k++) p[k] = rnd1((R)(p[k] * inv), c->dt_att);
        for (int64_t k = i + 1; k < S; k++) p[k] = 0;
    }
}

/* Attention runs as jobs over (batch, head, block of rows), spread over
 * the threads. On the CPU a block is MM_TM rows and its products are the
 * MM_TM x MM_TN tiles of those rows (the heads give the parallelism), each
 * the same single-threaded call as in mm_cpu, so the bits depend neither on
 * the thread count nor on the blocks. On the GPU a block is the whole head,
 * one cuBLAS product, the jobs on one thread and its rows' softmax over all
 * threads. */
typedef struct {
    xm_ctx *c;
    xm_layer *L;
    int64_t nrb, rows;            /* blocks a head, rows a block */
    int64_t S, hd, nh, grp, qd, kvd; /* sequence, head dims, heads a KV head */
    R scale;                      /* 1 / sqrt(hd), or 1 / sqrt(query_scalar) */
    int64_t win;                  /* the layer's sliding window, 0: none */
    R cap;                        /* attention soft-cap, 0: none */
} att_job;

static att_job att_plan(xm_ctx *c, xm_layer *L) {
    const xent_model_config *m = c->c;
    int64_t rows = c->gpu ? c->S : MM_TM, hd = m->head_dim;
    int64_t l = L - c->ly;
    double qs = m->query_scalar > 0 ? m->query_scalar : (double)hd;
    return (att_job){c,
                     L,
                     (c->S + rows - 1) / rows,
                     rows,
                     c->S,
                     hd,
                     m->n_heads,
                     m->n_heads / m->n_kv_heads,
                     m->n_heads * hd,
                     m->n_kv_heads * hd,
                     (R)(1.0 / sqrt(qs)),
                     xent_model_layer_sliding(m, l) ? m->sliding_window : 0,
                     (R)m->attn_softcap};
}

/* Row block rb (of height aj->rows) of C[M,N] = alpha op(A) op(B) + beta C. */
static void att_mm(const att_job *aj, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                   int64_t rb, int64_t M, int64_t N, int64_t K, R alpha,
                   const R *A, int64_t lda, const R *B, int64_t ldb, R beta,
                   R *C, int64_t ldc) {
#if ROUNDING
    if (aj->c->gpu) {
        mm_gpu(aj->c, ta == CblasTrans, tb == CblasTrans, M, N, K, alpha, A,
               lda, B, ldb, beta, C, ldc);
        return;
    }
#else
    (void)aj;
#endif
    int64_t nj = (N + MM_TN - 1) / MM_TN;
    mm_job j = {ta,    tb, M,     N,    K, lda, ldb, ldc,
                MM_TM, MM_TN, nj, alpha, beta, A, B, C};
    mm_tiles(&j, rb * nj, (rb + 1) * nj);
}

/* A row loop (softmax_rows, dsoftmax_rows) on rows [r0, r1) of one head,
 * pj's arrays pointing at the head's S x S block. */
static void att_rows(const att_job *aj, xent_range_fn fn, pjob *pj,
                     int64_t r0, int64_t r1) {
    if (aj->c->gpu) pfor(aj->c, r1 - r0, fn, pj); /* r0 = 0, r1 = S */
    else fn(pj, r0, r1);
}

static void att_run(att_job *aj, int64_t n, xent_range_fn fn) {
    xent_parallel_for(n, aj->c->gpu ? 1 : aj->c->nthr, fn, aj);
}

/* Job jj = (b * nh + h) * nrb + rb: its head, rows and offsets. */
typedef struct {
    int64_t rb, r0, r1; /* block; its rows [r0, r1) */
    int64_t bh, qo, kv; /* b * nh + h; offsets of its q (dq, ao) and k, v */
} att_blk;

static att_blk att_block(const att_job *aj, int64_t jj) {
    att_blk k;
    k.rb = jj % aj->nrb;
    k.r0 = k.rb * aj->rows;
    k.r1 = k.r0 + aj->rows < aj->S ? k.r0 + aj->rows : aj->S;
    k.bh = jj / aj->nrb;
    int64_t b = k.bh / aj->nh, h = k.bh % aj->nh;
    k.qo = b * aj->S * aj->qd + h * aj->hd;
    k.kv = b * aj->S * aj->kvd + (h / aj->grp) * aj->hd;
    return k;
}

/* Jobs (b, h, rb): scores, softmax and P V for one block of rows. */
static void att_fwd_jobs(void *vj, int64_t j0, int64_t j1) {
    const att_job *aj = vj;
    xm_layer *L = aj->L;
    int64_t S = aj->S, hd = aj->hd, qd = aj->qd, kvd = aj->kvd;
    for (int64_t jj = j0; jj < j1; jj++) {
        att_blk k = att_block(aj, jj);
        R *P = L->att + k.bh * S * S;
        att_mm(aj, CblasNoTrans, CblasTrans, k.rb, S, S, hd, aj->scale,
               L->q + k.qo, qd, L->k + k.kv, kvd, 0, P, S);
        pjob pj = {.c = aj->c, .y = P, .win = aj->win, .cap = aj->cap,
                   .sc = L->attc ? L->attc + k.bh * S * S : NULL};
        att_rows(aj, softmax_rows, &pj, k.r0, k.r1);
        att_mm(aj, CblasNoTrans, CblasNoTrans, k.rb, S, hd, S, 1, P, S,
               L->v + k.kv, kvd, 0, L->ao + k.qo, qd);
    }
}

static void attention_fwd(xm_ctx *c, xm_layer *L) {
    att_job aj = att_plan(c, L);
    att_run(&aj, c->B * aj.nh * aj.nrb, att_fwd_jobs);
    rnd(L->ao, c->T * aj.qd, c->dt_comp);
}

/* dS = P * (dP - rowsum(P * dP)) on rows [r0, r1) of [B*nh*S, S]. */
static void dsoftmax_rows(void *vj, int64_t r0, int64_t r1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    int64_t S = c->S;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % S, lo = j->win > 0 && i >= j->win ? i - j->win + 1 : 0;
        const R *p = j->x + r * S;
        R *d = j->y + r * S;
        double s = 0;
        for (int64_t k = lo; k <= i; k++) s += (double)p[k] * d[k];
        for (int64_t k = 0; k < lo; k++) d[k] = 0;
        for (int64_t k = lo; k <= i; k++)
            d[k] = rnd1(p[k] * (R)(d[k] - s), c->dt_att);
        if (j->cap > 0) /* through cap * tanh(s / cap): 1 - (capped / cap)^2 */
            for (int64_t k = lo; k <= i; k++) {
                R u = j->sc[r * S + k] / j->cap;
                d[k] = rnd1(d[k] * (1 - u * u), c->dt_att);
            }
        for (int64_t k = i + 1; k < S; k++) d[k] = 0;
    }
}

/* Jobs (b, h, rb) of the backward: dP = dO V^T, dS, dq = scale dS K for one
 * block of query rows. */
static void att_bwd_q_jobs(void *vj, int64_t j0, int64_t j1) {
    const att_job *aj = vj;
    xm_ctx *c = aj->c;
    xm_layer *L = aj->L;
    int64_t S = aj->S, hd = aj->hd, qd = aj->qd, kvd = aj->kvd;
    for (int64_t jj = j0; jj < j1; jj++) {
        att_blk k = att_block(aj, jj);
        R *dS = c->datt + k.bh * S * S;
        att_mm(aj, CblasNoTrans, CblasTrans, k.rb, S, S, hd, 1, c->dao + k.qo,
               qd, L->v + k.kv, kvd, 0, dS, S);
        pjob pj = {.c = c, .x = L->att + k.bh * S * S, .y = dS, .win = aj->win,
                   .cap = aj->cap, .sc = L->attc ? L->attc + k.bh * S * S : NULL};
        att_rows(aj, dsoftmax_rows, &pj, k.r0, k.r1);
        att_mm(aj, CblasNoTrans, CblasNoTrans, k.rb, S, hd, S, aj->scale, dS,
               S, L->k + k.kv, kvd, 0, c->dq + k.qo, qd);
    }
}

/* Jobs (dv or dk, b, kv head, rb): one block of key rows of dv += P^T dO or
 * dk += scale dS^T q, summed over the group's heads in ascending order. */
static void att_bwd_kv_jobs(void *vj, int64_t j0, int64_t j1) {
    const att_job *aj = vj;
    xm_ctx *c = aj->c;
    int64_t S = aj->S, hd = aj->hd, qd = aj->qd, kvd = aj->kvd,
            nkv = aj->nh / aj->grp;
    for (int64_t jj = j0; jj < j1; jj++) {
        int64_t rb = jj % aj->nrb, g = jj / aj->nrb % (c->B * nkv),
                is_k = jj / aj->nrb / (c->B * nkv), b = g / nkv, kh = g % nkv;
        int64_t kv = b * S * kvd + kh * hd;
        /* dk: scale dS^T q; dv: P^T dO */
        const R *A = is_k ? c->datt : aj->L->att, *Bm = is_k ? aj->L->q : c->dao;
        R *D = (is_k ? c->dk : c->dv) + kv, alpha = is_k ? aj->scale : 1;
        for (int64_t h = kh * aj->grp; h < (kh + 1) * aj->grp; h++) {
            int64_t bh = b * aj->nh + h, qo = b * S * qd + h * hd;
            att_mm(aj, CblasTrans, CblasNoTrans, rb, S, hd, S, alpha,
                   A + bh * S * S, S, Bm + qo, qd, 1, D, kvd);
        }
    }
}

/* From dao [T, qd]: dq [T, qd], dk, dv [T, kvd] (the caller undoes RoPE). */
static void attention_bwd(xm_ctx *c, xm_layer *L) {
    att_job aj = att_plan(c, L);
    int64_t nkv = aj.nh / aj.grp;
    memset(c->dk, 0, (size_t)(c->T * aj.kvd) * sizeof(R));
    memset(c->dv, 0, (size_t)(c->T * aj.kvd) * sizeof(R));
    att_run(&aj, c->B * aj.nh * aj.nrb, att_bwd_q_jobs);
    att_run(&aj, 2 * c->B * nkv * aj.nrb, att_bwd_kv_jobs);
    rnd(c->dq, c->T * aj.qd, c->dt_comp);
    rnd(c->dk, c->T * aj.kvd, c->dt_comp);
    rnd(c->dv, c->T * aj.kvd, c->dt_comp);
}

/* ---- SwiGLU ------------------------------------------------------------- */

static void swiglu_fwd_range(void *vj, int64_t i0, int64_t i1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    xm_layer *L = j->L;
    if (c->c->gelu_tanh) {
        for (int64_t i = i0; i < i1; i++) {
            double g = L->gt[i];
            double t = tanh(0.7978845608028654 * (g + 0.044715 * g * g * g));
            L->act[i] = rnd1(rnd1((R)(0.5 * g * (1 + t)), c->dt_comp) * L->up[i], c->dt_comp);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) {
        R g = L->gt[i];
        R s = (R)(1.0 / (1.0 + xent__exp(-(double)g)));
        L->act[i] = rnd1(rnd1(g * s, c->dt_comp) * L->up[i], c->dt_comp);
    }
}

static void swiglu_fwd(xm_ctx *c, xm_layer *L) {
    pjob j = {.c = c, .L = L};
    pfor(c, c->T * c->c->hidden, swiglu_fwd_range, &j);
}

/* da = dh -> dgate (dh), dup (dh2) */
static void swiglu_bwd_range(void *vj, int64_t i0, int64_t i1) {
    pjob *j = vj;
    xm_ctx *c = j->c;
    xm_layer *L = j->L;
    if (c->c->gelu_tanh) { /* gelu_tanh(g) = g (1 + t) / 2, t = tanh(a (g + b g^3)) */
        const double a = 0.7978845608028654, b = 0.044715;
        for (int64_t i = i0; i < i1; i++) {
            double g = L->gt[i], u = L->up[i], da = c->dh[i];
            double t = tanh(a * (g + b * g * g * g));
            double ge = 0.5 * g * (1 + t);
            double dge = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * a * (1 + 3 * b * g * g);
            c->dh2[i] = rnd1((R)(da * (double)(R)ge), c->dt_comp);
            c->dh[i] = rnd1((R)(da * u * dge), c->dt_comp);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) {
        R g = L->gt[i], u = L->up[i], da = c->dh[i];
        R s = (R)(1.0 / (1.0 + xent__exp(-(double)g)));
        R silu = g * s;
        c->dh2[i] = rnd1(da * silu, c->dt_comp);
        c->dh[i] = rnd1(da * u * (s * (1 + g * (1 - s))), c->dt_comp);
    }
}

static void swiglu_bwd(xm_ctx *c, xm_layer *L) {
    pjob j = {.c = c, .L = L};
    pfor(c, c->T * c->c->hidden, swiglu_bwd_range, &j);
}

/* ---- layers ------------------------------------------------------------- */

static const R *W(xm_ctx *c, int64_t l, xent_param_kind k) {
    int i = xent__pidx(c->c, l, k);
    return i < 0 ? NULL : c->w[i];
}
static R *G(xm_ctx *c, int64_t l, xent_param_kind k) {
    int i = xent__pidx(c->c, l, k);
    return (i < 0 || !c->g) ? NULL : c->g[i];
}

static void layer_fwd(xm_ctx *c, int64_t l) {
    const xent_model_config *m = c->c;
    xm_layer *L = &c->ly[l];
    int64_t D = m->dim, H = m->hidden, qd = m->n_heads * m->head_dim,
            kvd = m->n_kv_heads * m->head_dim, T = c->T;
    const R *x = c->x[l];
    R *y = c->x[l + 1];
    int64_t hd = m->head_dim;
    int loc = xent_model_layer_sliding(m, l);
    rmsnorm_fwd(c, x, W(c, l, XENT_P_ATTN_NORM), L->xn1, L->rms1);
    const R *xn = as_comp(c, L->xn1, T * D);
    /* q/k norms (qk_norm): the projections go to qpre/kpre, normalised per
     * head into q/k */
    R *qo = m->qk_norm ? L->qpre : L->q, *ko = m->qk_norm ? L->kpre : L->k;
    linear_fwd(c, xn, D, W(c, l, XENT_P_WQ), W(c, l, XENT_P_BQ), qd, qo);
    linear_fwd(c, xn, D, W(c, l, XENT_P_WK), W(c, l, XENT_P_BK), kvd, ko);
    linear_fwd(c, xn, D, W(c, l, XENT_P_WV), W(c, l, XENT_P_BV), kvd, L->v);
    if (m->qk_norm) {
        rmsnorm_fwd_n(c, L->qpre, W(c, l, XENT_P_Q_NORM), L->q, L->qn_r, T * m->n_heads, hd);
        rmsnorm_fwd_n(c, L->kpre, W(c, l, XENT_P_K_NORM), L->k, L->kn_r, T * m->n_kv_heads, hd);
        rnd(L->q, T * qd, c->dt_comp);
        rnd(L->k, T * kvd, c->dt_comp);
    }
    rope(c, L->q, m->n_heads, 1, loc);
    rope(c, L->k, m->n_kv_heads, 1, loc);
    attention_fwd(c, L);
    if (m->sandwich_norm) {
        linear_fwd(c, L->ao, qd, W(c, l, XENT_P_WO), NULL, D, L->ao_o);
        rmsnorm_fwd(c, L->ao_o, W(c, l, XENT_P_POST_ATTN_NORM), L->h1, L->pan_r);
    } else {
        linear_fwd(c, L->ao, qd, W(c, l, XENT_P_WO), NULL, D, L->h1);
    }
    for (int64_t i = 0; i < T * D; i++)
        L->h1[i] = rnd1(x[i] + L->h1[i], c->dt_res);
    rmsnorm_fwd(c, L->h1, W(c, l, XENT_P_MLP_NORM), L->xn2, L->rms2);
    xn = as_comp(c, L->xn2, T * D);
    linear_fwd(c, xn, D, W(c, l, XENT_P_WGATE), NULL, H, L->gt);
    linear_fwd(c, xn, D, W(c, l, XENT_P_WUP), NULL, H, L->up);
    swiglu_fwd(c, L);
    if (m->sandwich_norm) {
        linear_fwd(c, L->act, H, W(c, l, XENT_P_WDOWN), NULL, D, L->mo);
        rmsnorm_fwd(c, L->mo, W(c, l, XENT_P_POST_FF_NORM), y, L->pfn_r);
    } else {
        linear_fwd(c, L->act, H, W(c, l, XENT_P_WDOWN), NULL, D, y);
    }
    for (int64_t i = 0; i < T * D; i++) y[i] = rnd1(L->h1[i] + y[i], c->dt_res);
}

/* c->dx holds dL/d(output of layer l); on return dL/d(input of layer l). */
static void layer_bwd(xm_ctx *c, int64_t l) {
    const xent_model_config *m = c->c;
    xm_layer *L = &c->ly[l];
    int64_t D = m->dim, H = m->hidden, qd = m->n_heads * m->head_dim,
            kvd = m->n_kv_heads * m->head_dim, hd = m->head_dim, T = c->T;
    int loc = xent_model_layer_sliding(m, l);
    /* MLP: y = h1 + down(act) (sandwich: h1 + norm(down(act))) */
    const R *dmo = c->dx;
    if (m->sandwich_norm) {
        rmsnorm_bwd(c, L->mo, W(c, l, XENT_P_POST_FF_NORM), L->pfn_r, c->dx, c->dxb,
                    G(c, l, XENT_P_POST_FF_NORM), 0);
        dmo = c->dxb;
    }
    linear_bwd(c, dmo, D, L->act, H, W(c, l, XENT_P_WDOWN),
               G(c, l, XENT_P_WDOWN), NULL, c->dh, 0);
    swiglu_bwd(c, L);
    linear_bwd(c, c->dh, H, L->xn2, D, W(c, l, XENT_P_WGATE),
               G(c, l, XENT_P_WGATE), NULL, c->dxn, 0);
    linear_bwd(c, c->dh2, H, L->xn2, D, W(c, l, XENT_P_WUP),
               G(c, l, XENT_P_WUP), NULL, c->dxn, 1);
    /* dh1 = dy + norm_bwd(dxn) (in place in c->dx) */
    rmsnorm_bwd(c, L->h1, W(c, l, XENT_P_MLP_NORM), L->rms2, c->dxn, c->dx,
                G(c, l, XENT_P_MLP_NORM), 1);
    /* attention: h1 = x + o_proj(ao) (sandwich: x + norm(o_proj(ao))) */
    const R *dao_o = c->dx;
    if (m->sandwich_norm) {
        rmsnorm_bwd(c, L->ao_o, W(c, l, XENT_P_POST_ATTN_NORM), L->pan_r, c->dx, c->dxb,
                    G(c, l, XENT_P_POST_ATTN_NORM), 0);
        dao_o = c->dxb;
    }
    linear_bwd(c, dao_o, D, L->ao, qd, W(c, l, XENT_P_WO), G(c, l, XENT_P_WO),
               NULL, c->dao, 0);
    attention_bwd(c, L);
    rope(c, c->dq, m->n_heads, -1, loc);
    rope(c, c->dk, m->n_kv_heads, -1, loc);
    if (m->qk_norm) { /* through the per-head norms, in place */
        rmsnorm_bwd_n(c, L->qpre, W(c, l, XENT_P_Q_NORM), L->qn_r, c->dq, c->dq,
                      G(c, l, XENT_P_Q_NORM), 0, T * m->n_heads, hd);
        rmsnorm_bwd_n(c, L->kpre, W(c, l, XENT_P_K_NORM), L->kn_r, c->dk, c->dk,
                      G(c, l, XENT_P_K_NORM), 0, T * m->n_kv_heads, hd);
    }
    linear_bwd(c, c->dq, qd, L->xn1, D, W(c, l, XENT_P_WQ), G(c, l, XENT_P_WQ),
               G(c, l, XENT_P_BQ), c->dxn, 0);
    linear_bwd(c, c->dk, kvd, L->xn1, D, W(c, l, XENT_P_WK),
               G(c, l, XENT_P_WK), G(c, l, XENT_P_BK), c->dxn, 1);
    linear_bwd(c, c->dv, kvd, L->xn1, D, W(c, l, XENT_P_WV),
               G(c, l, XENT_P_WV), G(c, l, XENT_P_BV), c->dxn, 1);
    rmsnorm_bwd(c, c->x[l], W(c, l, XENT_P_ATTN_NORM), L->rms1, c->dxn, c->dx,
                G(c, l, XENT_P_ATTN_NORM), 1);
    if (c->rec_dx)
        memcpy(c->rec_dx[l], c->dx, (size_t)(c->T * D) * sizeof(R));
}

/* Defined by the including file: logits -> loss, logprob, dlogits. */
static xent_status loss_step(xm_ctx *c, int backward);

/* ---- whole model -------------------------------------------------------- */

static xent_status model_fwd_bwd(xm_ctx *c, int backward) {
    const xent_model_config *m = c->c;
    int64_t D = m->dim, V = m->vocab, T = c->T;
    const R *E = c->w[0];
    /* Gemma: embeddings times sqrt(dim), that factor in the residual dtype */
    R es = m->embed_scale ? rnd1((R)sqrt((double)D), c->dt_res) : (R)1;
    for (int64_t t = 0; !c->keep_layers && t < T; t++) {
        memcpy(c->x[0] + t * D, E + (int64_t)c->tok[t] * D,
               (size_t)D * sizeof(R));
        if (m->embed_scale)
            for (int64_t i = 0; i < D; i++) c->x[0][t * D + i] *= es;
        rnd(c->x[0] + t * D, D, c->dt_res);
    }
    for (int64_t l = 0; !c->keep_layers && l < m->n_layers; l++) {
        layer_fwd(c, l);
        if (c->on_layer) c->on_layer(c->on_layer_ctx, l, 0);
    }
    int inorm = xent__pidx_norm(m);
    rmsnorm_fwd(c, c->x[m->n_layers], c->w[inorm], c->xnf, c->rmsf);
    /* logits = round(xnf, head) @ W_head^T, stored in the logits dtype */
    const R *xh = c->xnf;
#if ROUNDING
    if (c->dt_head != XENT_F32) {
        memcpy(c->scr, c->xnf, (size_t)(T * D) * sizeof(R));
        rnd(c->scr, T * D, c->dt_head);
        xh = c->scr;
    }
#endif
    mm_nt(c, T, V, D, 1, xh, D, c->w_head, D, 0, c->logits, V);
    rnd(c->logits, T * V, c->dt_logits);
    const double fc = m->final_softcap;
    if (fc > 0) /* cap * tanh(z / cap), in double, stored in the logits dtype */
        for (int64_t i = 0; i < T * V; i++)
            c->logits[i] = rnd1((R)(fc * tanh((double)c->logits[i] / fc)), c->dt_logits);
    xent_status st = loss_step(c, backward);
    if (st || !backward) return st;
    if (fc > 0) /* dlogits is its own buffer here (plan) */
        for (int64_t i = 0; i < T * V; i++) {
            double u = (double)c->logits[i] / fc;
            c->dlogits[i] = rnd1((R)((double)c->dlogits[i] * (1 - u * u)), c->dt_comp);
        }
    /* head: dxnf = dlogits W_head; dW_head (+)= dlogits^T xnf */
    int ih = xent__pidx_head(m);
    R *dWh = c->g[ih];
    mm_tn(c, V, D, T, 1, c->dlogits, V, xh, D, 0, dWh, D);
    rnd(dWh, V * D, c->dt_comp);
    mm_nn(c, T, D, V, 1, c->dlogits, V, c->w_head, D, 0, c->dxn, D);
    rnd(c->dxn, T * D, c->dt_comp);
    rmsnorm_bwd(c, c->x[m->n_layers], c->w[inorm], c->rmsf, c->dxn, c->dx,
                c->g[inorm], 0);
    for (int64_t l = m->n_layers - 1; l >= 0; l--) {
        layer_bwd(c, l);
        if (c->on_layer) c->on_layer(c->on_layer_ctx, l, 1);
    }
    if (c->rec_dx0)
        memcpy(c->rec_dx0, c->dx, (size_t)(T * D) * sizeof(R));
    /* embeddings: scatter-add (tied: added to the head's gradient) */
    R *dE = c->g[0];
    if (!m->tied_head) memset(dE, 0, (size_t)(V * D) * sizeof(R));
    for (int64_t t = 0; t < T; t++) {
        R *row = dE + (int64_t)c->tok[t] * D;
        if (m->embed_scale)
            for (int64_t i = 0; i < D; i++) row[i] += c->dx[t * D + i] * es;
        else
            for (int64_t i = 0; i < D; i++) row[i] += c->dx[t * D + i];
    }
    rnd(dE, V * D, c->dt_comp);
    return XENT_OK;
}

/* ---- memory plan -------------------------------------------------------- */

/* Points every buffer of c into base (NULL: only counts) for a workspace of
 * Bfull rows, with the per-token buffers offset to row b0 and c->B = Bm
 * (micro-batches share one plan). x, ly and (when record) rec_dx must be
 * arrays of L+1, L and L entries. Returns the number of R elements. */
static int64_t plan(xm_ctx *c, R *base, int64_t Bfull, int64_t b0,
                    int64_t Bm, int64_t S, int record) {
    const xent_model_config *m = c->c;
    int64_t L = m->n_layers, D = m->dim, H = m->hidden, V = m->vocab,
            nh = m->n_heads, qd = nh * m->head_dim,
            kvd = m->n_kv_heads * m->head_dim, Tf = Bfull * S,
            r0 = b0 * S, off = 0;
#define TAKE(ptr, width)                                                     \
    do {                                                                     \
        if (base) (ptr) = base + off + r0 * (width);                        \
        off += Tf * (width);                                                 \
    } while (0)
    c->B = Bm;
    c->S = S;
    c->T = Bm * S;
    for (int64_t l = 0; l <= L; l++) TAKE(c->x[l], D);
    for (int64_t l = 0; l < L; l++) {
        xm_layer *y = &c->ly[l];
        TAKE(y->xn1, D);
        TAKE(y->rms1, 1);
        TAKE(y->q, qd);
        TAKE(y->k, kvd);
        TAKE(y->v, kvd);
        TAKE(y->att, nh * S);
        TAKE(y->ao, qd);
        TAKE(y->h1, D);
        TAKE(y->xn2, D);
        TAKE(y->rms2, 1);
        TAKE(y->gt, H);
        TAKE(y->up, H);
        TAKE(y->act, H);
        y->qpre = y->kpre = y->qn_r = y->kn_r = NULL;
        y->ao_o = y->pan_r = y->mo = y->pfn_r = y->attc = NULL;
        if (m->qk_norm) {
            TAKE(y->qpre, qd);
            TAKE(y->kpre, kvd);
            TAKE(y->qn_r, nh);
            TAKE(y->kn_r, m->n_kv_heads);
        }
        if (m->sandwich_norm) {
            TAKE(y->ao_o, D);
            TAKE(y->pan_r, 1);
            TAKE(y->mo, D);
            TAKE(y->pfn_r, 1);
        }
        if (m->attn_softcap > 0) TAKE(y->attc, nh * S);
    }
    TAKE(c->xnf, D);
    TAKE(c->rmsf, 1);
    TAKE(c->logits, V);
    if (record || m->final_softcap > 0) TAKE(c->dlogits, V);
    else c->dlogits = c->logits;
    TAKE(c->dx, D);
    TAKE(c->dxb, D);
    TAKE(c->dq, qd);
    TAKE(c->dk, kvd);
    TAKE(c->dv, kvd);
    TAKE(c->dao, qd);
    TAKE(c->dh, H);
    TAKE(c->dh2, H);
    TAKE(c->dxn, D);
    if (record) {
        for (int64_t l = 0; l < L; l++) TAKE(c->rec_dx[l], D);
        TAKE(c->rec_dx0, D);
    } else {
        c->rec_dx = NULL;
        c->rec_dx0 = NULL;
    }
#undef TAKE
    int64_t mw = D > H ? D : H;
    mw = mw > qd ? mw : qd;
    if (base) c->datt = base + off;
    off += Bfull * m->n_heads * S * S;
    if (base) c->scr = base + off;
    off += Tf * mw;
    if (base) c->wone = base + off;
    off += D > m->head_dim ? D : m->head_dim;
    return off;
}
