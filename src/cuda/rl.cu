/* src/cuda/rl.cu: the RL loss functions of include/xent/rl.h on CUDA
 * (xent_cuda_rl_*), for training loops that keep everything on the GPU.
 *
 * Arithmetic: the same double operations as the C files of src/rl, in the
 * same order (exp is xc_dexp, the CPU's xent__exp; no FMA contraction), so
 * per-token results equal the CPU's bitwise. Every sum the CPU takes in token order
 * (group means, batch moments, sequence sums, the aggregated loss,
 * kl_mean, the diagnostics' sums) is taken here in that same order, by one
 * thread per group or by thread 0 of a block that stages the addends in
 * parallel (xr_in_order): deterministic and bitwise the CPU's. Counts use
 * integer atomics, whose result does not depend on their order; there are
 * no floating-point atomics. K3 for |d| >= 1/2 is the one place where the
 * libraries differ (CUDA's expm1 vs the C library's): within 1 ulp.
 *
 * Validation before any output is written: options go through the CPU
 * function itself on an empty input (one set of rules, the same messages);
 * array contents are scanned by check kernels that fill an xr_rec (first
 * bad index of each kind and counts), copied back with one synchronization;
 * the host then reports the first problem in the CPU's order with the
 * CPU's message (field and index). */
#include "ce_device.h"
#include "rl/rl_math.h"
#include "ce_host.h" /* xc_alloc, xc_cuda: scratch from the library's pool, CUDA errors */
#include "xent.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>


typedef unsigned long long ull;
#define XR_NONE ULLONG_MAX
#define XR_TPB 256

/* Grid-stride loop over [0, n). */
#define XR_LOOP(i, n)                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);  \
         i += (int64_t)gridDim.x * blockDim.x)

static unsigned xr_blocks(int64_t n) {
    int64_t b = (n + XR_TPB - 1) / XR_TPB;
    return (unsigned)(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

/* ------------------------------------------------------------------------ */
/* Device helpers (the scalar ones are the CPU's: src/rl/rl_math.h)          */
/* ------------------------------------------------------------------------ */

/* First index in a [n] (sorted) with a[idx] >= v. */
__device__ int64_t xr_lower_bound(const int64_t *a, int64_t n, int64_t v) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Sequence of token t (valid offsets [nseq + 1], 0 <= t < T): the largest
 * i with off[i] <= t (empty sequences are skipped over). */
__device__ int64_t xr_seq_of(const int64_t *off, int64_t nseq, int64_t t) {
    return xr_lower_bound(off, nseq + 1, t + 1) - 1;
}

/* Adds v over the warp, lane 0 adds it to *dst. Every lane must call. */
__device__ __forceinline__ void xr_add(ull *dst, ull v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    if ((threadIdx.x & 31) == 0 && v) atomicAdd(dst, v);
}

/* In-order visit of [b, e) by a whole block (blockDim.x == XR_TPB): the
 * threads stage XR_TPB values at a time in shared memory (tile [XR_TPB],
 * load(t) computed in parallel), then thread 0 calls use(v) on them in index
 * order. This is how a sum keeps the CPU's left-to-right order (bitwise the
 * same result) while the loads and the per-element arithmetic run in
 * parallel. Every thread of the block must call it. */
template <class V, class L, class U>
__device__ void xr_in_order(int64_t b, int64_t e, V *tile, L load, U use) {
    for (int64_t t0 = b; t0 < e; t0 += blockDim.x) {
        int64_t t = t0 + threadIdx.x;
        if (t < e) tile[threadIdx.x] = load(t);
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t m = e - t0 < (int64_t)blockDim.x ? e - t0 : (int64_t)blockDim.x;
            for (int64_t j = 0; j < m; j++) use(tile[j]);
        }
        __syncthreads();
    }
}

/* Blocks for one block per sequence (grid-stride over sequences). */
static unsigned xr_seq_blocks(int64_t nseq) {
    return (unsigned)(nseq < 1 ? 1 : (nseq > 8192 ? 8192 : nseq));
}

/* ------------------------------------------------------------------------ */
/* The check record and its kernels                                          */
/* ------------------------------------------------------------------------ */

/* What one log-prob array scan found (the CPU's xent_rl_lp_report). */
typedef struct xr_lp_rec {
    ull n_checked, n_nan, first_nan, n_pos, first_pos, n_ninf, first_ninf;
    ull n_zero, n_zrun, first_zrun, longest;
} xr_lp_rec;

/* First bad index of each kind (XR_NONE: none) and counts. */
typedef struct xr_rec {
    ull first_dec;         /* first i >= 1 with offsets[i] < offsets[i-1]  */
    long long off0, offN;  /* offsets[0], offsets[nseq]                    */
    ull first_mask;        /* first t with mask[t] > 1                     */
    ull first_ids;         /* first i with a bad group id                  */
    ull first_val;         /* first non-finite counted value               */
    xr_lp_rec lp[4];       /* log-prob arrays, in the CPU's check order    */
    ull cnt[4];            /* counters of the compute kernels              */
} xr_rec;

__global__ void xr_k_offsets(const int64_t *off, int64_t nseq, xr_rec *rec) {
    ull first = XR_NONE;
    XR_LOOP(j, nseq) {
        if (off[j + 1] < off[j]) { first = (ull)(j + 1); break; }
    }
    if (first != XR_NONE) atomicMin(&rec->first_dec, first);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        rec->off0 = off[0];
        rec->offN = off[nseq];
    }
}

__global__ void xr_k_mask(const uint8_t *mask, int64_t T, xr_rec *rec) {
    ull first = XR_NONE;
    XR_LOOP(t, T) {
        if (mask[t] > 1) { first = (ull)t; break; }
    }
    if (first != XR_NONE) atomicMin(&rec->first_mask, first);
}

/* ids [n]: in [0, ngroups) and non-decreasing. */
__global__ void xr_k_ids(const int64_t *ids, int64_t n, int64_t ngroups, xr_rec *rec) {
    ull first = XR_NONE;
    XR_LOOP(i, n) {
        if (ids[i] < 0 || ids[i] >= ngroups || (i > 0 && ids[i] < ids[i - 1])) {
            first = (ull)i;
            break;
        }
    }
    if (first != XR_NONE) atomicMin(&rec->first_ids, first);
}

/* x [n]: first counted entry that is not finite. */
__global__ void xr_k_finite(const float *x, int64_t n, const uint8_t *mask, xr_rec *rec) {
    ull first = XR_NONE;
    XR_LOOP(i, n) {
        if (xent__rl_counted(mask, i) && !isfinite(x[i])) { first = (ull)i; break; }
    }
    if (first != XR_NONE) atomicMin(&rec->first_val, first);
}

/* Clamps a sequence's range into [0, T] so that unchecked offsets never
 * lead out of bounds (the result is then discarded by the host). */
__device__ __forceinline__ void xr_range(const int64_t *off, int64_t i, int64_t T,
                                         int64_t *b, int64_t *e) {
    int64_t x = off[i], y = off[i + 1];
    x = x < 0 ? 0 : (x > T ? T : x);
    y = y < x ? x : (y > T ? T : y);
    *b = x;
    *e = y;
}

/* Per-sequence advantages adv [nseq]: first i with a counted token whose
 * advantage is not finite. */
__global__ void xr_k_adv_seq(const float *adv, const int64_t *off, int64_t nseq,
                             int64_t T, const uint8_t *mask, xr_rec *rec) {
    ull first = XR_NONE;
    XR_LOOP(i, nseq) {
        if (isfinite(adv[i])) continue;
        int64_t b, e;
        xr_range(off, i, T, &b, &e);
        int any = 0;
        for (int64_t t = b; t < e && !any; t++) any = xent__rl_counted(mask, t);
        if (any) { first = (ull)i; break; }
    }
    if (first != XR_NONE) atomicMin(&rec->first_val, first);
}

/* Counts NaN, > 0, -inf and exact zeros over counted tokens of lp [T]. */
__global__ void xr_k_lp(const float *lp, int64_t T, const uint8_t *mask, xr_lp_rec *r) {
    ull n = 0, nn = 0, np = 0, ni = 0, nz = 0;
    ull fn = XR_NONE, fp = XR_NONE, fi = XR_NONE;
    XR_LOOP(t, T) {
        if (!xent__rl_counted(mask, t)) continue;
        float v = lp[t];
        n++;
        if (isnan(v)) { nn++; fn = fn < (ull)t ? fn : (ull)t; }
        else if (v > 0.0f) { np++; fp = fp < (ull)t ? fp : (ull)t; }
        else if (isinf(v)) { ni++; fi = fi < (ull)t ? fi : (ull)t; }
        nz += v == 0.0f;
    }
    xr_add(&r->n_checked, n);
    xr_add(&r->n_nan, nn);
    xr_add(&r->n_pos, np);
    xr_add(&r->n_ninf, ni);
    xr_add(&r->n_zero, nz);
    if (fn != XR_NONE) atomicMin(&r->first_nan, fn);
    if (fp != XR_NONE) atomicMin(&r->first_pos, fp);
    if (fi != XR_NONE) atomicMin(&r->first_ninf, fi);
}

/* One token of the zero-run scan: counted, and exactly 0 (not NaN). */
typedef struct xr_zv {
    int counted, zero;
} xr_zv;

/* Runs of exact zeros among counted tokens, one block per sequence (runs
 * do not cross sequences; masked tokens neither extend nor break a run),
 * as the CPU's zero_run_step. off NULL: one sequence [0, T). Skipped when
 * the array holds no counted exact zero. */
__global__ void xr_k_zero_runs(const float *lp, int64_t T, const int64_t *off,
                               int64_t nseq, const uint8_t *mask, int64_t limit,
                               xr_lp_rec *r) {
    __shared__ xr_zv tile[XR_TPB];
    if (r->n_zero == 0) return;
    int64_t ns = off ? nseq : 1;
    for (int64_t s = blockIdx.x; s < ns; s += gridDim.x) {
        int64_t b = 0, e = T, run = 0, start = -1;
        if (off) xr_range(off, s, T, &b, &e);
        int64_t t = b; /* index of the next value use() sees */
        ull nr = 0, fr = XR_NONE, lg = 0;
        xr_in_order(b, e, tile, [&](int64_t i) {
            xr_zv v;
            v.counted = xent__rl_counted(mask, i);
            v.zero = v.counted && lp[i] == 0.0f;
            return v;
        }, [&](const xr_zv &v) {
            int64_t i = t++;
            if (!v.counted) return;
            if (!v.zero) { run = 0; return; }
            if (run == 0) start = i;
            run++;
            if ((ull)run > lg) lg = (ull)run;
            if (limit > 0 && run == limit) {
                if (nr == 0) fr = (ull)start;
                nr++;
            }
        });
        if (threadIdx.x != 0) continue;
        if (nr) {
            atomicAdd(&r->n_zrun, nr);
            atomicMin(&r->first_zrun, fr);
        }
        if (lg) atomicMax(&r->longest, lg);
    }
}

/* ------------------------------------------------------------------------ */
/* Host side: errors, the record, scratch                                    */
/* ------------------------------------------------------------------------ */

/* One call: the device record followed by `bytes` of scratch. */
typedef struct xr_ctx {
    cudaStream_t s;
    xr_rec *d;     /* device record                                       */
    char *scratch; /* device scratch after the record, or NULL            */
    xr_rec h;      /* host copy of the record                             */
} xr_ctx;

#define XR_REC_BYTES ((sizeof(xr_rec) + 255) / 256 * 256)

static xent_status xr_begin(xr_ctx *c, void *stream, size_t bytes) {
    c->s = (cudaStream_t)stream;
    c->d = NULL;
    c->scratch = NULL;
    memset(&c->h, 0, sizeof c->h);
    c->h.first_dec = c->h.first_mask = c->h.first_ids = c->h.first_val = XR_NONE;
    for (int k = 0; k < 4; k++) {
        xr_lp_rec *l = &c->h.lp[k];
        l->first_nan = l->first_pos = l->first_ninf = l->first_zrun = XR_NONE;
    }
    void *p = NULL;
    xent_status st = xc_alloc(&p, XR_REC_BYTES + bytes, c->s, "check record and scratch");
    if (st != XENT_OK) return st;
    c->d = (xr_rec *)p;
    c->scratch = bytes ? (char *)p + XR_REC_BYTES : NULL;
    return xc_cuda(cudaMemcpyAsync(c->d, &c->h, sizeof c->h, cudaMemcpyHostToDevice, c->s),
                   "check record upload");
}

static xent_status xr_end(xr_ctx *c, xent_status st) {
    if (c->d) {
        cudaError_t e = cudaFreeAsync(c->d, c->s);
        if (st == XENT_OK) st = xc_cuda(e, "cudaFreeAsync (check record and scratch)");
    }
    return st;
}

/* Copies n bytes back (after the kernels of the stream) and waits. */
static xent_status xr_fetch(const xr_ctx *c, void *h, const void *d, size_t n,
                            const char *what) {
    xent_status st = xc_cuda(cudaGetLastError(), what);
    if (st == XENT_OK)
        st = xc_cuda(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, c->s), what);
    if (st == XENT_OK) st = xc_cuda(cudaStreamSynchronize(c->s), what);
    return st;
}

static xent_status xr_sync_rec(xr_ctx *c) {
    return xr_fetch(c, &c->h, c->d, sizeof c->h, "check kernels");
}

/* Launches the scans of log-prob array k (lp on device). */
static void xr_scan_lp(xr_ctx *c, int k, const float *lp, int64_t T, const int64_t *off,
                       int64_t nseq, const uint8_t *mask, int64_t limit) {
    xr_k_lp<<<xr_blocks(T), XR_TPB, 0, c->s>>>(lp, T, mask, &c->d->lp[k]);
    if (limit > 0)
        xr_k_zero_runs<<<xr_seq_blocks(off ? nseq : 1), XR_TPB, 0, c->s>>>(
            lp, T, off, nseq, mask, limit, &c->d->lp[k]);
}

static void xr_scan_offsets(xr_ctx *c, const int64_t *off, int64_t nseq) {
    xr_k_offsets<<<xr_blocks(nseq), XR_TPB, 0, c->s>>>(off, nseq, c->d);
}

static void xr_scan_mask(xr_ctx *c, const uint8_t *mask, int64_t T) {
    if (mask) xr_k_mask<<<xr_blocks(T), XR_TPB, 0, c->s>>>(mask, T, c->d);
}

/* The CPU's xent__rl_check_offsets messages. */
static xent_status xr_offsets_fail(const xr_ctx *c, const char *what, const int64_t *off,
                                   int64_t nseq, int64_t T) {
    const xr_rec *r = &c->h;
    if (r->off0 != 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s[0] = %lld, must be 0", what, (long long)r->off0);
    if (r->first_dec != XR_NONE) {
        int64_t i = (int64_t)r->first_dec, v[2] = {0, 0};
        xent_status st = xr_fetch(c, v, off + i - 1, sizeof v, "offsets copy");
        if (st != XENT_OK) return st;
        return xent_set_error(XENT_ERR_SHAPE,
                          "%s[%lld] = %lld is below %s[%lld] = %lld: "
                          "offsets must be non-decreasing",
                          what, (long long)i, (long long)v[1], what, (long long)(i - 1),
                          (long long)v[0]);
    }
    if (r->offN != T)
        return xent_set_error(XENT_ERR_SHAPE, "%s[%lld] = %lld, must equal the length %lld", what,
                          (long long)nseq, (long long)r->offN, (long long)T);
    return XENT_OK;
}

/* The CPU's xent__rl_check_mask message. */
static xent_status xr_mask_fail(const xr_ctx *c, const char *what, const uint8_t *mask) {
    if (c->h.first_mask == XR_NONE) return XENT_OK;
    uint8_t v = 0;
    xent_status st = xr_fetch(c, &v, mask + c->h.first_mask, 1, "mask copy");
    if (st != XENT_OK) return st;
    return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = %u, a mask holds 0 or 1", what,
                      (long long)c->h.first_mask, (unsigned)v);
}

/* "%s[%lld] = %g is not finite" for the first bad value of x. */
static xent_status xr_value_fail(const xr_ctx *c, const char *what, const float *x) {
    if (c->h.first_val == XR_NONE) return XENT_OK;
    float v = 0.0f;
    xent_status st = xr_fetch(c, &v, x + c->h.first_val, 4, "value copy");
    if (st != XENT_OK) return st;
    return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = %g is not finite", what,
                      (long long)c->h.first_val, (double)v);
}

static long long xr_first(ull f) { return f == XR_NONE ? -1LL : (long long)f; }

/* The CPU's report_fail (src/rl/rl_check.c) for log-prob array k. */
static xent_status xr_lp_fail(const xr_ctx *c, int k, const char *name, const float *lp,
                              int allow_neg_inf, int64_t limit) {
    const xr_lp_rec *r = &c->h.lp[k];
    int bad = r->n_nan || r->n_pos || r->n_zrun || (r->n_ninf && !allow_neg_inf);
    if (!bad) return XENT_OK;
    char counts[256];
    snprintf(counts, sizeof counts,
             "%lld NaN, %lld positive, %lld -inf, %lld zero runs of >= %lld "
             "among %lld counted tokens",
             (long long)r->n_nan, (long long)r->n_pos, (long long)r->n_ninf,
             (long long)r->n_zrun, (long long)limit, (long long)r->n_checked);
    if (r->n_nan)
        return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = nan: a log-prob is never NaN (%s)", name,
                          xr_first(r->first_nan), counts);
    if (r->n_pos) {
        float v = 0.0f;
        xent_status st = xr_fetch(c, &v, lp + r->first_pos, 4, "log-prob copy");
        if (st != XENT_OK) return st;
        return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = %.9g is > 0: a log-prob is <= 0 (%s)",
                          name, xr_first(r->first_pos), (double)v, counts);
    }
    if (r->n_ninf && !allow_neg_inf)
        return xent_set_error(XENT_ERR_VALUE, "%s[%lld] = -inf: these log-probs must be finite (%s)",
                          name, xr_first(r->first_ninf), counts);
    return xent_set_error(XENT_ERR_VALUE,
                      "%s[%lld..]: a run of >= %lld log-probs exactly 0 (a zero-filled "
                      "dump?); longest run %lld (%s)",
                      name, xr_first(r->first_zrun), (long long)limit,
                      (long long)r->longest, counts);
}

/* ------------------------------------------------------------------------ */
/* Group advantages                                                          */
/* ------------------------------------------------------------------------ */

/* One group r [n] (n >= 1) -> a [n], as the CPU's one_group. */
__device__ void xr_one_group(const float *r, int64_t n, int stdk, double eps, int sub,
                             float *a, double *mean_out, double *std_out, ull *zero_var,
                             ull *single) {
    int equal = 1;
    for (int64_t i = 1; i < n && equal; i++) equal = r[i] == r[0];
    if (equal) {
        *mean_out = r[0];
        *std_out = 0.0;
        (*zero_var)++;
        *single += n == 1;
        for (int64_t i = 0; i < n; i++) a[i] = sub ? 0.0f : r[i];
        return;
    }
    double s = 0.0, c = 0.0, q = 0.0;
    for (int64_t i = 0; i < n; i++) s += r[i];
    double m = s / (double)n;
    for (int64_t i = 0; i < n; i++) c += (double)r[i] - m;
    m = m + c / (double)n;
    double sd = 0.0;
    if (stdk != XENT_RL_STD_NONE) {
        for (int64_t i = 0; i < n; i++) {
            double d = (double)r[i] - m;
            q += d * d;
        }
        double denom = stdk == XENT_RL_STD_SAMPLE ? (double)(n - 1) : (double)n;
        sd = sqrt(q / denom);
    }
    double scale = stdk == XENT_RL_STD_NONE ? 1.0 : sd + eps;
    double shift = sub ? m : 0.0;
    *mean_out = m;
    *std_out = sd;
    for (int64_t i = 0; i < n; i++) a[i] = (float)(((double)r[i] - shift) / scale);
}

/* One thread per group. cnt: groups, zero-variance, singletons, empty. */
__global__ void xr_k_groups(const float *r, int64_t n, int64_t ng, const int64_t *off,
                            const int64_t *ids, int stdk, double eps, int sub, float *adv,
                            double *gm, double *gs, xr_rec *rec) {
    ull c_groups = 0, c_zero = 0, c_single = 0, c_empty = 0;
    XR_LOOP(g, ng) {
        int64_t b, e;
        if (off) { b = off[g]; e = off[g + 1]; }
        else { b = xr_lower_bound(ids, n, g); e = xr_lower_bound(ids, n, g + 1); }
        double m = 0.0, sd = 0.0;
        if (e == b) c_empty++;
        else {
            c_groups++;
            xr_one_group(r + b, e - b, stdk, eps, sub, adv + b, &m, &sd, &c_zero, &c_single);
        }
        if (gm) gm[g] = m;
        if (gs) gs[g] = sd;
    }
    xr_add(&rec->cnt[0], c_groups);
    xr_add(&rec->cnt[1], c_zero);
    xr_add(&rec->cnt[2], c_single);
    xr_add(&rec->cnt[3], c_empty);
}

/* The CPU's check_ids messages for the first bad id. */
static xent_status xr_ids_fail(const xr_ctx *c, const int64_t *ids, int64_t ngroups) {
    if (c->h.first_ids == XR_NONE) return XENT_OK;
    int64_t i = (int64_t)c->h.first_ids, v[2] = {0, 0};
    xent_status st = i > 0 ? xr_fetch(c, v, ids + i - 1, 16, "ids copy")
                           : xr_fetch(c, v + 1, ids, 8, "ids copy");
    if (st != XENT_OK) return st;
    if (v[1] < 0 || v[1] >= ngroups)
        return xent_set_error(XENT_ERR_VALUE, "groups->ids[%lld] = %lld is outside [0, %lld)",
                          (long long)i, (long long)v[1], (long long)ngroups);
    return xent_set_error(XENT_ERR_VALUE,
                      "groups->ids[%lld] = %lld follows ids[%lld] = %lld: group ids must be "
                      "non-decreasing (each group contiguous)",
                      (long long)i, (long long)v[1], (long long)(i - 1), (long long)v[0]);
}

static xent_status xr_check_groups_host(const xent_rl_groups *g) {
    if (g->n < 0) return xent_set_error(XENT_ERR_SHAPE, "groups->n = %lld < 0", (long long)g->n);
    if (g->ngroups < 0)
        return xent_set_error(XENT_ERR_SHAPE, "groups->ngroups = %lld < 0", (long long)g->ngroups);
    if ((g->offsets == NULL) == (g->ids == NULL))
        return xent_set_error(XENT_ERR_VALUE, "groups: give exactly one of offsets and ids (%s given)",
                          g->offsets ? "both" : "neither");
    return XENT_OK;
}

extern "C" xent_status xent_cuda_rl_group_advantages(const float *rewards,
                                                     const xent_rl_groups *groups,
                                                     const xent_rl_adv_opts *opts, float *adv,
                                                     double *group_mean, double *group_std,
                                                     xent_rl_adv_stats *stats, void *stream) {
    if (!groups || !opts)
        return xent_set_error(XENT_ERR_NULL, "xent_cuda_rl_group_advantages: %s is NULL",
                          !groups ? "groups" : "opts");
    int64_t off0 = 0;
    xent_rl_groups g0 = {0, 0, &off0, NULL};
    xent_status st = xent_rl_group_advantages(NULL, &g0, opts, NULL, NULL, NULL, NULL);
    if (st != XENT_OK || (st = xr_check_groups_host(groups)) != XENT_OK) return st;
    const int64_t n = groups->n, ng = groups->ngroups;
    xr_ctx c;
    if ((st = xr_begin(&c, stream, 0)) != XENT_OK) return xr_end(&c, st);
    if (groups->offsets) xr_scan_offsets(&c, groups->offsets, ng);
    else xr_k_ids<<<xr_blocks(n), XR_TPB, 0, c.s>>>(groups->ids, n, ng, c.d);
    if (n > 0 && rewards) xr_k_finite<<<xr_blocks(n), XR_TPB, 0, c.s>>>(rewards, n, NULL, c.d);
    if ((st = xr_sync_rec(&c)) != XENT_OK) return xr_end(&c, st);
    if (groups->offsets) st = xr_offsets_fail(&c, "groups->offsets", groups->offsets, ng, n);
    else st = xr_ids_fail(&c, groups->ids, ng);
    if (st == XENT_OK && n > 0 && (!rewards || !adv))
        st = xent_set_error(XENT_ERR_NULL, "xent_cuda_rl_group_advantages: %s is NULL",
                        !rewards ? "rewards" : "adv");
    if (st == XENT_OK) st = xr_value_fail(&c, "rewards", rewards);
    if (st != XENT_OK) return xr_end(&c, st);
    xr_k_groups<<<xr_blocks(ng), XR_TPB, 0, c.s>>>(
        rewards, n, ng, groups->offsets, groups->ids, (int)opts->std, opts->eps,
        opts->subtract_mean, adv, group_mean, group_std, c.d);
    st = xc_cuda(cudaGetLastError(), "group kernel");
    if (st == XENT_OK && stats) {
        ull cnt[4];
        st = xr_fetch(&c, cnt, c.d->cnt, sizeof cnt, "group statistics copy");
        if (st == XENT_OK) {
            stats->n_groups = (int64_t)cnt[0];
            stats->n_zero_var = (int64_t)cnt[1];
            stats->n_singleton = (int64_t)cnt[2];
            stats->n_empty = (int64_t)cnt[3];
        }
    }
    return xr_end(&c, st);
}

/* ------------------------------------------------------------------------ */
/* Batch (pack) normalisation                                                */
/* ------------------------------------------------------------------------ */

/* Moments and scale of the counted entries (the CPU's batch_moments and
 * what follows), summed in index order. */
typedef struct xr_batch {
    xent_rl_batch_stats st;
    double shift, div;
    int zero_out; /* degenerate and shifted: counted entries become +0     */
} xr_batch;

/* One entry of the batch passes: the value and whether it counts. */
typedef struct xr_bv {
    double a;
    int counted;
} xr_bv;

__global__ void xr_k_batch_moments(const float *a, int64_t n, const uint8_t *mask, int is_std,
                                   int sample, int sub, double eps, xr_batch *out) {
    __shared__ xr_bv tile[XR_TPB];
    double s = 0.0, sa = 0.0, c = 0.0, q = 0.0, m = 0.0;
    int64_t k = 0;
    auto load = [&](int64_t i) {
        xr_bv v;
        v.counted = xent__rl_counted(mask, i);
        v.a = v.counted ? (double)a[i] : 0.0;
        return v;
    };
    xr_in_order(0, n, tile, load, [&](const xr_bv &v) {
        if (v.counted) { s += v.a; sa += fabs(v.a); k++; }
    });
    m = k ? s / (double)k : 0.0;
    xr_in_order(0, n, tile, load, [&](const xr_bv &v) {
        if (v.counted) c += v.a - m;
    });
    m = k ? m + c / (double)k : 0.0;
    xr_in_order(0, n, tile, load, [&](const xr_bv &v) {
        if (v.counted) { double d = v.a - m; q += d * d; }
    });
    if (threadIdx.x != 0) return;
    double mean_abs = k ? sa / (double)k : 0.0;
    xr_batch b;
    b.st.n_counted = k;
    b.st.mean = m;
    int64_t dof = k - (sample ? 1 : 0);
    b.st.scale = !is_std ? mean_abs : (dof > 0 ? sqrt(q / (double)dof) : 0.0);
    b.st.degenerate = k == 0 || b.st.scale == 0.0 || (is_std && q == 0.0);
    b.shift = is_std && sub ? m : 0.0;
    b.div = b.st.scale + eps;
    b.zero_out = is_std && sub;
    *out = b;
}

__global__ void xr_k_batch_apply(const float *in, int64_t n, const uint8_t *mask,
                                 const xr_batch *bp, float *out) {
    const xr_batch b = *bp;
    XR_LOOP(i, n) {
        float a = in[i];
        if (!xent__rl_counted(mask, i)) out[i] = a;
        else if (b.st.degenerate) out[i] = b.zero_out ? 0.0f : a;
        else out[i] = (float)(((double)a - b.shift) / b.div);
    }
}

extern "C" xent_status xent_cuda_rl_batch_normalize(const float *adv_in, int64_t n,
                                                    const uint8_t *mask,
                                                    const xent_rl_batch_opts *opts,
                                                    float *adv_out,
                                                    xent_rl_batch_stats *stats, void *stream) {
    if (!opts) return xent_set_error(XENT_ERR_NULL, "xent_cuda_rl_batch_normalize: opts is NULL");
    xent_status st = xent_rl_batch_normalize(NULL, 0, NULL, opts, NULL, NULL);
    if (st != XENT_OK) return st;
    if (n < 0) return xent_set_error(XENT_ERR_SHAPE, "n = %lld < 0", (long long)n);
    if (n > 0 && (!adv_in || !adv_out))
        return xent_set_error(XENT_ERR_NULL, "xent_cuda_rl_batch_normalize: %s is NULL",
                          !adv_in ? "adv_in" : "adv_out");
    xr_ctx c;
    if ((st = xr_begin(&c, stream, sizeof(xr_batch))) != XENT_OK) return xr_end(&c, st);
    xr_scan_mask(&c, mask, n);
    if (n > 0) xr_k_finite<<<xr_blocks(n), XR_TPB, 0, c.s>>>(adv_in, n, mask, c.d);
    if ((st = xr_sync_rec(&c)) == XENT_OK && (st = xr_mask_fail(&c, "mask", mask)) == XENT_OK)
        st = xr_value_fail(&c, "adv_in", adv_in);
    if (st != XENT_OK) return xr_end(&c, st);
    xr_batch *b = (xr_batch *)c.scratch;
    int is_std = opts->kind == XENT_RL_BATCH_STD;
    xr_k_batch_moments<<<1, XR_TPB, 0, c.s>>>(adv_in, n, mask, is_std,
                                          opts->std == XENT_RL_STD_SAMPLE,
                                          opts->subtract_mean, opts->eps, b);
    if (n > 0) xr_k_batch_apply<<<xr_blocks(n), XR_TPB, 0, c.s>>>(adv_in, n, mask, b, adv_out);
    st = xc_cuda(cudaGetLastError(), "batch normalisation kernels");
    if (st == XENT_OK && stats) {
        xr_batch hb;
        st = xr_fetch(&c, &hb, b, sizeof hb, "batch statistics copy");
        if (st == XENT_OK) *stats = hb.st;
    }
    return xr_end(&c, st);
}

/* ------------------------------------------------------------------------ */
/* Policy losses                                                             */
/* ------------------------------------------------------------------------ */

/* Per-token flags (counted into xent_rl_loss_stats). */
enum {
    XF_CLAMP = 1, XF_LOW = 2, XF_HIGH = 4, XF_DUAL = 8,
    XF_TISC = 16, XF_TRUNC = 32, XF_TMASK = 64, XF_KLC = 128
};

typedef struct xr_loss_p {
    const int64_t *off;            /* [nseq + 1]                           */
    int64_t T, nseq;
    const float *lp_new, *lp_old, *lp_smp, *lp_ref, *lp_trn; /* [T]        */
    const float *adv;              /* [nseq] or [T]                        */
    int per_tok;
    const uint8_t *mask;           /* [T] or NULL                          */
    int loss, agg, tis, tis_mode, kl;
    double lo, hi, C, dual, tis_cap, kl_coef, token_norm, seq_norm;
    float *token_loss, *grad;      /* [T] or NULL                          */
    int64_t *seq_n;                /* [nseq] counted tokens                */
    double *seq_w, *seq_lr;        /* [nseq] TIS weight, GSPO log-ratio    */
    double *seq_c;                 /* [nseq] contribution to the loss      */
    uint8_t *seq_flags;            /* [nseq]                               */
    double *tok_l, *tok_k;         /* [T] l_t and the KL term              */
    uint8_t *tok_flags;            /* [T]                                  */
} xr_loss_p;

/* The CPU's tis_cut. */
__device__ __forceinline__ double xr_tis_cut(const xr_loss_p &p, double w, unsigned *fl) {
    if (!(w > p.tis_cap)) return w;
    if (p.tis_mode == XENT_RL_TIS_MASK) { *fl |= XF_TMASK; return 0.0; }
    *fl |= XF_TRUNC;
    return p.tis_cap;
}

/* The CPU's ppo_term. */
__device__ double xr_ppo(double A, double r, double lo, double hi, double dual, double *dl_dr,
                         unsigned *fl) {
    double c = r < lo ? lo : (r > hi ? hi : r);
    double un = -A * r, cl = -A * c;
    double l = un, d = -A;
    unsigned clip = 0;
    if (cl > un) {
        l = cl;
        d = 0.0;
        clip = r < lo ? XF_LOW : XF_HIGH;
    }
    if (dual > 0.0 && A < 0.0 && l > -A * dual) {
        l = -A * dual;
        d = 0.0;
        clip = XF_DUAL;
    }
    *fl |= clip;
    *dl_dr = d;
    return l;
}

/* The CPU's kl_term. */
__device__ double xr_kl_term(int kind, double lp, double ref, double C, double *dk, int *hit) {
    double d = xent__rl_clamp(xent__rl_logdiff(ref, lp), C, hit);
    double live = *hit ? 0.0 : 1.0;
    switch (kind) {
    case XENT_RL_KL_K1: *dk = live; return -d;
    case XENT_RL_KL_K2: *dk = -d * live; return 0.5 * d * d;
    case XENT_RL_KL_K3: {
        double e = xc_dexp(d);
        *dk = (1.0 - e) * live;
        return xent__rl_k3(d);
    }
    default: *dk = 0.0; return 0.0;
    }
}

/* The CPU's policy_term: l before the TIS weight, *dl = dl/d(lp_new). */
__device__ double xr_policy(const xr_loss_p &p, int64_t t, double A, double lr_seq, int seq_hit,
                            double *dl, unsigned *fl) {
    double lp = p.lp_new[t];
    if (p.loss == XENT_RL_LOSS_REINFORCE) {
        *dl = -A;
        return -A * lp;
    }
    int hit = seq_hit;
    double lr = p.loss == XENT_RL_LOSS_GSPO
                    ? lr_seq
                    : xent__rl_clamp(xent__rl_logdiff(lp, p.lp_old[t]), p.C, &hit);
    double r = xc_dexp(lr);
    if (hit) *fl |= XF_CLAMP;
    if (p.loss == XENT_RL_LOSS_CISPO) {
        double w = r < p.lo ? p.lo : (r > p.hi ? p.hi : r);
        *fl |= r < p.lo ? XF_LOW : (r > p.hi ? XF_HIGH : 0);
        *dl = -w * A;
        return -w * A * lp;
    }
    double dl_dr, l = xr_ppo(A, r, p.lo, p.hi, p.dual, &dl_dr, fl);
    *dl = hit ? 0.0 : dl_dr * r;
    return l;
}

/* One token of the per-sequence pass: clamped TIS log-weight (and whether
 * it hit the clamp), GSPO log-ratio, counted. */
typedef struct xr_sv {
    double lw, ld;
    int hit, counted;
} xr_sv;

/* One block per sequence: counted tokens, sequence TIS weight (SEQUENCE,
 * GEOMETRIC) and GSPO's clamped mean log-ratio, summed in token order. */
__global__ void xr_k_seq(xr_loss_p p) {
    __shared__ xr_sv tile[XR_TPB];
    const int need_tis = p.tis == XENT_RL_TIS_SEQUENCE || p.tis == XENT_RL_TIS_GEOMETRIC;
    const int need_gspo = p.loss == XENT_RL_LOSS_GSPO;
    for (int64_t i = blockIdx.x; i < p.nseq; i += gridDim.x) {
        int64_t n = 0;
        double s_tis = 0.0, s_g = 0.0;
        int any = 0;
        auto load = [&](int64_t t) {
            xr_sv v;
            v.counted = xent__rl_counted(p.mask, t);
            v.lw = v.ld = 0.0;
            v.hit = 0;
            if (v.counted && need_tis)
                v.lw = xent__rl_clamp(xent__rl_logdiff(p.lp_trn[t], p.lp_smp[t]), p.C, &v.hit);
            if (v.counted && need_gspo) v.ld = xent__rl_logdiff(p.lp_new[t], p.lp_old[t]);
            return v;
        };
        xr_in_order(p.off[i], p.off[i + 1], tile, load, [&](const xr_sv &v) {
            if (!v.counted) return;
            n++;
            s_tis += v.lw;
            any |= v.hit;
            s_g += v.ld;
        });
        if (threadIdx.x != 0) continue;
        double w = 1.0, lr = 0.0;
        unsigned fl = 0;
        int hit;
        if (n > 0 && need_tis) {
            if (p.tis == XENT_RL_TIS_GEOMETRIC) s_tis /= (double)n;
            s_tis = xent__rl_clamp(s_tis, p.C, &hit);
            if (any || hit) fl |= XF_TISC;
            w = xr_tis_cut(p, xc_dexp(s_tis), &fl);
        }
        if (n > 0 && need_gspo) {
            lr = xent__rl_clamp(s_g / (double)n, p.C, &hit);
            if (hit) fl |= XF_CLAMP;
        }
        p.seq_n[i] = n;
        p.seq_w[i] = w;
        p.seq_lr[i] = lr;
        p.seq_flags[i] = (uint8_t)fl;
    }
}

/* One thread per token: the CPU's one_token. */
__global__ void xr_k_tok(xr_loss_p p) {
    XR_LOOP(t, p.T) {
        if (!xent__rl_counted(p.mask, t)) {
            if (p.token_loss) p.token_loss[t] = 0.0f;
            if (p.grad) p.grad[t] = 0.0f;
            p.tok_l[t] = 0.0;
            p.tok_k[t] = 0.0;
            p.tok_flags[t] = 0;
            continue;
        }
        int64_t i = xr_seq_of(p.off, p.nseq, t), n = p.seq_n[i];
        unsigned sf = p.seq_flags[i], fl = sf & (XF_TISC | XF_TRUNC | XF_TMASK);
        double A = p.adv[p.per_tok ? t : i], w = p.seq_w[i];
        int hit;
        if (p.tis == XENT_RL_TIS_TOKEN) {
            w = xc_dexp(xent__rl_clamp(xent__rl_logdiff(p.lp_trn[t], p.lp_smp[t]), p.C, &hit));
            if (hit) fl |= XF_TISC;
            w = xr_tis_cut(p, w, &fl);
        }
        double dl, l = xr_policy(p, t, A, p.seq_lr[i], (sf & XF_CLAMP) != 0, &dl, &fl);
        l *= w;
        dl *= w;
        double k = 0.0;
        if (p.kl != XENT_RL_KL_NONE) {
            double dk;
            k = xr_kl_term(p.kl, p.lp_new[t], p.lp_ref[t], p.C, &dk, &hit);
            if (hit) fl |= XF_KLC;
            l += p.kl_coef * k;
            dl += p.kl_coef * dk;
        }
        double scale = p.agg == XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN
                           ? 1.0 / ((double)n * p.seq_norm)
                           : p.agg == XENT_RL_AGG_SEQ_MEAN_TOKEN_SUM
                                 ? 1.0 / (p.seq_norm * p.token_norm)
                                 : 1.0 / p.token_norm;
        if (p.token_loss) p.token_loss[t] = (float)l;
        if (p.grad) p.grad[t] = (float)(dl * scale);
        p.tok_l[t] = l;
        p.tok_k[t] = k;
        p.tok_flags[t] = (uint8_t)fl;
    }
}

/* One token of the sums: l_t, the KL term, flags, counted. */
typedef struct xr_tv {
    double l, k;
    unsigned fl;
    int counted;
} xr_tv;

/* One block per sequence: its contribution to the aggregated loss (the
 * CPU's one_seq sum, in token order) and the counts (integer atomics). */
__global__ void xr_k_seq_sum(xr_loss_p p, double *contrib, ull *cnt) {
    __shared__ xr_tv tile[XR_TPB];
    ull c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = blockIdx.x; i < p.nseq; i += gridDim.x) {
        double s = 0.0;
        auto load = [&](int64_t t) {
            xr_tv v;
            v.counted = xent__rl_counted(p.mask, t);
            v.l = v.counted ? p.tok_l[t] : 0.0;
            v.k = 0.0;
            v.fl = v.counted ? p.tok_flags[t] : 0u;
            return v;
        };
        xr_in_order(p.off[i], p.off[i + 1], tile, load, [&](const xr_tv &v) {
            if (!v.counted) return;
            s += v.l;
            for (int b = 0; b < 8; b++) c[b] += (v.fl >> b) & 1u;
        });
        if (threadIdx.x != 0) continue;
        int64_t n = p.seq_n[i];
        contrib[i] = n == 0 ? 0.0
                     : p.agg == XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN ? s / (double)n : s;
    }
    if (threadIdx.x == 0)
        for (int b = 0; b < 8; b++)
            if (c[b]) atomicAdd(&cnt[b], c[b]);
}

/* One sequence of the final sum: its contribution and counted tokens. */
typedef struct xr_cv {
    double contrib;
    int64_t n;
} xr_cv;

/* One block: the sum over sequences and kl_sum over every counted token,
 * both in the CPU's order, then the statistics. */
__global__ void xr_k_loss_final(xr_loss_p p, const double *contrib, const ull *cnt,
                                xent_rl_loss_stats *out) {
    __shared__ xr_cv ctile[XR_TPB];
    __shared__ xr_tv tile[XR_TPB];
    double sum = 0.0, kl_sum = 0.0;
    int64_t n_seqs = 0, n_tokens = 0;
    xr_in_order(0, p.nseq, ctile, [&](int64_t i) {
        xr_cv v;
        v.contrib = contrib[i];
        v.n = p.seq_n[i];
        return v;
    }, [&](const xr_cv &v) {
        sum += v.contrib;
        n_seqs += v.n > 0;
        n_tokens += v.n;
    });
    if (p.kl != XENT_RL_KL_NONE)
        xr_in_order(0, p.T, tile, [&](int64_t t) {
            xr_tv v;
            v.counted = xent__rl_counted(p.mask, t);
            v.l = 0.0;
            v.k = v.counted ? p.tok_k[t] : 0.0;
            v.fl = 0;
            return v;
        }, [&](const xr_tv &v) {
            if (v.counted) kl_sum += v.k;
        });
    if (threadIdx.x != 0) return;
    xent_rl_loss_stats st;
    memset(&st, 0, sizeof st);
    st.n_seqs = n_seqs;
    st.n_tokens = n_tokens;
    st.n_clamped = (int64_t)cnt[0];
    st.n_clip_low = (int64_t)cnt[1];
    st.n_clip_high = (int64_t)cnt[2];
    st.n_dual_clip = (int64_t)cnt[3];
    st.n_tis_clamped = (int64_t)cnt[4];
    st.n_tis_truncated = (int64_t)cnt[5];
    st.n_tis_masked = (int64_t)cnt[6];
    st.n_kl_clamped = (int64_t)cnt[7];
    st.loss = p.agg == XENT_RL_AGG_SEQ_MEAN_TOKEN_MEAN ? sum / p.seq_norm
              : p.agg == XENT_RL_AGG_SEQ_MEAN_TOKEN_SUM ? sum / (p.seq_norm * p.token_norm)
                                                        : sum / p.token_norm;
    st.kl_mean = st.n_tokens ? kl_sum / (double)st.n_tokens : 0.0;
    *out = st;
}

/* The CPU's check_needs. */
static xent_status xr_needs(const xent_rl_input *in, const xent_rl_loss_opts *o) {
    if (o->loss != XENT_RL_LOSS_REINFORCE && !in->lp_old)
        return xent_set_error(XENT_ERR_NULL, "in->lp_old is NULL: %s needs the old log-probs",
                          o->loss == XENT_RL_LOSS_PPO     ? "PPO"
                          : o->loss == XENT_RL_LOSS_CISPO ? "CISPO"
                                                          : "GSPO");
    if (o->tis != XENT_RL_TIS_OFF && !in->lp_sampler)
        return xent_set_error(XENT_ERR_VALUE,
                          "opts->tis = %d but in->lp_sampler is NULL: truncated importance "
                          "sampling needs the sampler's log-probs (no fall-back to the policy "
                          "ratio)",
                          (int)o->tis);
    if (o->kl != XENT_RL_KL_NONE && !in->lp_ref)
        return xent_set_error(XENT_ERR_NULL, "opts->kl = %d but in->lp_ref is NULL", (int)o->kl);
    return XENT_OK;
}

static const char *const xr_lp_names[4] = {"in->lp_new", "in->lp_old", "in->lp_sampler",
                                           "in->lp_ref"};

/* Host checks of T, nseq and offsets (before anything reads them). */
static xent_status xr_layout_host(const xent_rl_input *in) {
    if (in->T < 0) return xent_set_error(XENT_ERR_SHAPE, "in->T = %lld < 0", (long long)in->T);
    if (in->nseq < 0)
        return xent_set_error(XENT_ERR_SHAPE, "in->nseq = %lld < 0", (long long)in->nseq);
    if (!in->offsets) return xent_set_error(XENT_ERR_NULL, "in->offsets is NULL");
    return XENT_OK;
}

/* Launches the scans of offsets, mask and the `nlp` log-prob arrays. */
static void xr_scan_input(xr_ctx *c, const xent_rl_input *in, int nlp, int64_t zrl) {
    const float *arrs[4] = {in->lp_new, in->lp_old, in->lp_sampler, in->lp_ref};
    xr_scan_offsets(c, in->offsets, in->nseq);
    xr_scan_mask(c, in->mask, in->T);
    for (int k = 0; k < nlp; k++)
        if (arrs[k]) xr_scan_lp(c, k, arrs[k], in->T, in->offsets, in->nseq, in->mask, zrl);
}

/* Reports, in the CPU's order, what xr_scan_input found; `needs` (may be
 * NULL) runs between the layout and the log-prob checks. */
static xent_status xr_input_fail(const xr_ctx *c, const xent_rl_input *in, int nlp, int64_t zrl,
                                 const xent_rl_loss_opts *needs) {
    const float *arrs[4] = {in->lp_new, in->lp_old, in->lp_sampler, in->lp_ref};
    xent_status st = xr_offsets_fail(c, "in->offsets", in->offsets, in->nseq, in->T);
    if (st == XENT_OK) st = xr_mask_fail(c, "in->mask", in->mask);
    if (st == XENT_OK && needs) st = xr_needs(in, needs);
    if (st == XENT_OK && !in->lp_new) st = xent_set_error(XENT_ERR_NULL, "in->lp_new is NULL");
    for (int k = 0; k < nlp && st == XENT_OK; k++)
        if (arrs[k]) st = xr_lp_fail(c, k, xr_lp_names[k], arrs[k], k > 0, zrl);
    return st;
}

/* Scratch of the policy loss: [nseq] and [T] arrays, then the counters
 * [8] and the statistics. */
static size_t xr_loss_scratch(int64_t T, int64_t nseq) {
    size_t per_seq = 8 * 4 + 1, per_tok = 8 + 8 + 1;
    return ((size_t)nseq * per_seq + (size_t)T * per_tok + 7) / 8 * 8 + 8 * sizeof(ull) +
           sizeof(xent_rl_loss_stats);
}

static void xr_loss_params(xr_loss_p *p, const xent_rl_input *in, const xent_rl_loss_opts *o,
                           float *token_loss, float *grad, char *scratch) {
    memset(p, 0, sizeof *p);
    p->off = in->offsets;
    p->T = in->T;
    p->nseq = in->nseq;
    p->lp_new = in->lp_new;
    p->lp_old = in->lp_old;
    p->lp_smp = in->lp_sampler;
    p->lp_ref = in->lp_ref;
    p->lp_trn = in->lp_old ? in->lp_old : in->lp_new;
    p->adv = in->advantages;
    p->per_tok = in->adv_layout == XENT_RL_ADV_PER_TOKEN;
    p->mask = in->mask;
    p->loss = (int)o->loss;
    p->agg = (int)o->agg;
    p->tis = (int)o->tis;
    p->tis_mode = (int)o->tis_mode;
    p->kl = (int)o->kl;
    p->lo = 1.0 - o->eps_low;
    p->hi = 1.0 + o->eps_high;
    p->C = o->log_ratio_clamp;
    p->dual = o->dual_clip;
    p->tis_cap = o->tis_cap;
    p->kl_coef = o->kl_coef;
    p->token_norm = o->token_norm;
    p->seq_norm = o->seq_norm;
    p->token_loss = token_loss;
    p->grad = grad;
    char *q = scratch; /* doubles first, then int64, then bytes */
    p->seq_w = (double *)q;  q += 8 * (size_t)in->nseq;
    p->seq_lr = (double *)q; q += 8 * (size_t)in->nseq;
    p->tok_l = (double *)q;  q += 8 * (size_t)in->T;
    p->tok_k = (double *)q;  q += 8 * (size_t)in->T;
    p->seq_c = (double *)q;  q += 8 * (size_t)in->nseq;
    p->seq_n = (int64_t *)q; q += 8 * (size_t)in->nseq;
    p->seq_flags = (uint8_t *)q; q += (size_t)in->nseq;
    p->tok_flags = (uint8_t *)q;
}

extern "C" xent_status xent_cuda_rl_policy_loss(const xent_rl_input *in,
                                                const xent_rl_loss_opts *opts,
                                                float *token_loss, float *grad,
                                                xent_rl_loss_stats *stats, void *stream) {
    if (!in || !opts)
        return xent_set_error(XENT_ERR_NULL, "xent_cuda_rl_policy_loss: %s is NULL",
                          !in ? "in" : "opts");
    int64_t off0 = 0;
    float one = -1.0f;
    xent_rl_input e = {0, 0, &off0, &one, &one, &one, &one, &one, XENT_RL_ADV_PER_TOKEN, NULL};
    xent_status st = xent_rl_policy_loss(&e, opts, NULL, NULL, NULL);
    if (st != XENT_OK || (st = xr_layout_host(in)) != XENT_OK) return st;
    int per_tok = in->adv_layout == XENT_RL_ADV_PER_TOKEN;
    int layout_ok = per_tok || in->adv_layout == XENT_RL_ADV_PER_SEQUENCE;
    xr_ctx c;
    size_t bytes = xr_loss_scratch(in->T, in->nseq);
    if ((st = xr_begin(&c, stream, bytes)) != XENT_OK) return xr_end(&c, st);
    xr_scan_input(&c, in, 4, opts->zero_run_limit);
    if (in->advantages && layout_ok && per_tok && in->T > 0)
        xr_k_finite<<<xr_blocks(in->T), XR_TPB, 0, c.s>>>(in->advantages, in->T, in->mask, c.d);
    if (in->advantages && layout_ok && !per_tok && in->nseq > 0)
        xr_k_adv_seq<<<xr_blocks(in->nseq), XR_TPB, 0, c.s>>>(in->advantages, in->offsets,
                                                               in->nseq, in->T, in->mask, c.d);
    if ((st = xr_sync_rec(&c)) == XENT_OK)
        st = xr_input_fail(&c, in, 4, opts->zero_run_limit, opts);
    if (st == XENT_OK && !in->advantages)
        st = xent_set_error(XENT_ERR_NULL, "in->advantages is NULL");
    if (st == XENT_OK && !layout_ok)
        st = xent_set_error(XENT_ERR_VALUE,
                        "in->adv_layout = %d: set XENT_RL_ADV_PER_SEQUENCE or "
                        "XENT_RL_ADV_PER_TOKEN",
                        (int)in->adv_layout);
    if (st == XENT_OK) st = xr_value_fail(&c, "in->advantages", in->advantages);
    if (st != XENT_OK) return xr_end(&c, st);

    xr_loss_p p;
    xr_loss_params(&p, in, opts, token_loss, grad, c.scratch);
    ull *d_cnt = (ull *)(c.scratch + bytes - sizeof(xent_rl_loss_stats) - 8 * sizeof(ull));
    xent_rl_loss_stats *d_stats =
        (xent_rl_loss_stats *)(c.scratch + bytes - sizeof(xent_rl_loss_stats));
    if (in->nseq > 0) xr_k_seq<<<xr_seq_blocks(in->nseq), XR_TPB, 0, c.s>>>(p);
    if (in->T > 0) xr_k_tok<<<xr_blocks(in->T), XR_TPB, 0, c.s>>>(p);
    if (stats) {
        st = xc_cuda(cudaMemsetAsync(d_cnt, 0, 8 * sizeof(ull), c.s), "counter reset");
        if (st != XENT_OK) return xr_end(&c, st);
        if (in->nseq > 0)
            xr_k_seq_sum<<<xr_seq_blocks(in->nseq), XR_TPB, 0, c.s>>>(p, p.seq_c, d_cnt);
        xr_k_loss_final<<<1, XR_TPB, 0, c.s>>>(p, p.seq_c, d_cnt, d_stats);
    }
    st = xc_cuda(cudaGetLastError(), "policy loss kernels");
    if (st == XENT_OK && stats) {
        xent_rl_loss_stats h;
        st = xr_fetch(&c, &h, d_stats, sizeof h, "loss statistics copy");
        if (st == XENT_OK) *stats = h;
    }
    return xr_end(&c, st);
}

/* ------------------------------------------------------------------------ */
/* KL alone                                                                  */
/* ------------------------------------------------------------------------ */

__global__ void xr_k_kl(int kind, const float *lp_new, const float *lp_ref, int64_t T,
                        const uint8_t *mask, double C, float *kl, float *dkl, xr_rec *rec) {
    ull nc = 0;
    XR_LOOP(t, T) {
        double k = 0.0, dk = 0.0;
        int hit = 0;
        if (xent__rl_counted(mask, t)) k = xr_kl_term(kind, lp_new[t], lp_ref[t], C, &dk, &hit);
        nc += hit;
        if (kl) kl[t] = (float)k;
        if (dkl) dkl[t] = (float)dk;
    }
    xr_add(&rec->cnt[0], nc);
}

extern "C" xent_status xent_cuda_rl_kl_estimate(xent_rl_kl kind, const float *lp_new,
                                                const float *lp_ref, int64_t T,
                                                const uint8_t *mask, double log_ratio_clamp,
                                                float *kl, float *dkl, int64_t *n_clamped,
                                                void *stream) {
    if (T < 0) return xent_set_error(XENT_ERR_SHAPE, "T = %lld < 0", (long long)T);
    if ((unsigned)kind > XENT_RL_KL_K3 || kind == XENT_RL_KL_NONE)
        return xent_set_error(XENT_ERR_VALUE, "kind = %d: use XENT_RL_KL_K1, K2 or K3", (int)kind);
    if (!(log_ratio_clamp > 0.0) || !(log_ratio_clamp <= 80.0))
        return xent_set_error(XENT_ERR_VALUE, "log_ratio_clamp = %g must be in (0, 80]",
                          log_ratio_clamp);
    if (T > 0 && (!lp_new || !lp_ref))
        return xent_set_error(XENT_ERR_NULL, "%s is NULL", !lp_new ? "lp_new" : "lp_ref");
    xr_ctx c;
    xent_status st = xr_begin(&c, stream, 0);
    if (st != XENT_OK) return xr_end(&c, st);
    xr_scan_mask(&c, mask, T);
    if (T > 0) {
        xr_scan_lp(&c, 0, lp_new, T, NULL, 0, mask, 0);
        xr_scan_lp(&c, 1, lp_ref, T, NULL, 0, mask, 0);
    }
    if ((st = xr_sync_rec(&c)) == XENT_OK && (st = xr_mask_fail(&c, "mask", mask)) == XENT_OK &&
        (st = xr_lp_fail(&c, 0, "lp_new", lp_new, 0, 0)) == XENT_OK)
        st = xr_lp_fail(&c, 1, "lp_ref", lp_ref, 1, 0);
    if (st != XENT_OK) return xr_end(&c, st);
    if (T > 0)
        xr_k_kl<<<xr_blocks(T), XR_TPB, 0, c.s>>>((int)kind, lp_new, lp_ref, T, mask,
                                                  log_ratio_clamp, kl, dkl, c.d);
    st = xc_cuda(cudaGetLastError(), "KL kernel");
    if (st == XENT_OK && n_clamped) {
        ull nc = 0;
        st = xr_fetch(&c, &nc, &c.d->cnt[0], sizeof nc, "KL count copy");
        if (st == XENT_OK) *n_clamped = (int64_t)nc;
    }
    return xr_end(&c, st);
}

/* ------------------------------------------------------------------------ */
/* Diagnostics                                                               */
/* ------------------------------------------------------------------------ */

/* Inputs of the diagnostics. */
typedef struct xr_diag_p {
    int64_t T;
    const float *lp_new, *lp_old, *lp_smp, *lp_trn; /* [T]                */
    const uint8_t *mask;                            /* [T] or NULL        */
    double C, lo, hi;
} xr_diag_p;

/* One token: ratio r, weight w, log-weight lw, k3(lw), flags (1: ratio
 * clamped, 2: weight clamped), counted. */
typedef struct xr_dv {
    double r, w, lw, k3;
    unsigned fl;
    int counted;
} xr_dv;

/* One block: per-token values computed in parallel, accumulated by thread
 * 0 in token order (the CPU's add_ratio, add_weight), then its finish. */
__global__ void xr_k_diag(xr_diag_p p, xent_rl_diag *o) {
    __shared__ xr_dv tile[XR_TPB];
    int64_t n = 0, n_low = 0, n_high = 0, n_out = 0, n_rc = 0, n_wc = 0;
    double r_sum = 0.0, r_min = INFINITY, r_max = -INFINITY;
    double w_sum = 0.0, w_sq = 0.0, w_max = 0.0, chi = 0.0, k1 = 0.0, k3 = 0.0;
    auto load = [&](int64_t t) {
        xr_dv v;
        int hit;
        v.r = v.w = v.lw = v.k3 = 0.0;
        v.fl = 0;
        v.counted = xent__rl_counted(p.mask, t);
        if (v.counted && p.lp_old) {
            v.r = xc_dexp(xent__rl_clamp(xent__rl_logdiff(p.lp_new[t], p.lp_old[t]), p.C, &hit));
            v.fl |= hit ? 1u : 0u;
        }
        if (v.counted && p.lp_smp) {
            v.lw = xent__rl_clamp(xent__rl_logdiff(p.lp_trn[t], p.lp_smp[t]), p.C, &hit);
            v.w = xc_dexp(v.lw);
            v.k3 = xent__rl_k3(v.lw);
            v.fl |= hit ? 2u : 0u;
        }
        return v;
    };
    xr_in_order(0, p.T, tile, load, [&](const xr_dv &v) {
        if (!v.counted) return;
        n++;
        if (p.lp_old) {
            double r = v.r;
            n_rc += (v.fl & 1u) != 0;
            r_sum += r;
            if (r < r_min) r_min = r;
            if (r > r_max) r_max = r;
            n_low += r < p.lo;
            n_high += r > p.hi;
            n_out += r < 0.125 || r > 8.0;
        }
        if (p.lp_smp) {
            double w = v.w;
            n_wc += (v.fl & 2u) != 0;
            w_sum += w;
            w_sq += w * w;
            if (w > w_max) w_max = w;
            chi += (w - 1.0) * (w - 1.0);
            k1 += -v.lw;
            k3 += v.k3;
        }
    });
    if (threadIdx.x != 0) return;
    xent_rl_diag d;
    memset(&d, 0, sizeof d);
    d.n_tokens = n;
    d.has_weights = p.lp_smp != NULL;
    double nd = (double)n;
    if (n > 0 && p.lp_old) {
        d.clip_frac_low = (double)n_low / nd;
        d.clip_frac_high = (double)n_high / nd;
        d.ratio_min = r_min;
        d.ratio_mean = r_sum / nd;
        d.ratio_max = r_max;
        d.ratio_frac_out = (double)n_out / nd;
        d.n_ratio_clamped = n_rc;
    }
    if (n > 0 && p.lp_smp) {
        d.ess_frac = w_sq > 0.0 ? w_sum * w_sum / (nd * w_sq) : 0.0;
        d.chi2 = chi / nd;
        d.mismatch_kl_k1 = k1 / nd;
        d.mismatch_kl_k3 = k3 / nd;
        d.weight_max = w_max;
        d.n_weight_clamped = n_wc;
    }
    *o = d;
}

extern "C" xent_status xent_cuda_rl_diagnostics(const xent_rl_input *in,
                                                const xent_rl_loss_opts *opts,
                                                xent_rl_diag *out, void *stream) {
    if (!in || !opts || !out)
        return xent_set_error(XENT_ERR_NULL, "xent_cuda_rl_diagnostics: %s is NULL",
                          !in ? "in" : !opts ? "opts" : "out");
    int64_t off0 = 0;
    float one = -1.0f;
    xent_rl_input e = {0, 0, &off0, &one, NULL, NULL, NULL, NULL, XENT_RL_ADV_PER_TOKEN, NULL};
    xent_rl_diag tmp;
    xent_status st = xent_rl_diagnostics(&e, opts, &tmp);
    if (st != XENT_OK) return st;
    if (in->T < 0 || in->nseq < 0)
        return xent_set_error(XENT_ERR_SHAPE, "in->T = %lld, in->nseq = %lld: must be >= 0",
                          (long long)in->T, (long long)in->nseq);
    if (!in->offsets) return xent_set_error(XENT_ERR_NULL, "in->offsets is NULL");
    xr_ctx c;
    if ((st = xr_begin(&c, stream, sizeof(xent_rl_diag))) != XENT_OK) return xr_end(&c, st);
    xr_scan_input(&c, in, 3, opts->zero_run_limit);
    if ((st = xr_sync_rec(&c)) == XENT_OK)
        st = xr_input_fail(&c, in, 3, opts->zero_run_limit, NULL);
    if (st != XENT_OK) return xr_end(&c, st);
    xr_diag_p p;
    memset(&p, 0, sizeof p);
    p.T = in->T;
    p.lp_new = in->lp_new;
    p.lp_old = in->lp_old;
    p.lp_smp = in->lp_sampler;
    p.lp_trn = in->lp_old ? in->lp_old : in->lp_new;
    p.mask = in->mask;
    p.C = opts->log_ratio_clamp;
    p.lo = 1.0 - opts->eps_low;
    p.hi = 1.0 + opts->eps_high;
    xent_rl_diag *d_out = (xent_rl_diag *)c.scratch;
    xr_k_diag<<<1, XR_TPB, 0, c.s>>>(p, d_out);
    xent_rl_diag h;
    st = xr_fetch(&c, &h, d_out, sizeof h, "diagnostics copy");
    if (st == XENT_OK) *out = h;
    return xr_end(&c, st);
}

/* ------------------------------------------------------------------------ */
/* Input checks                                                              */
/* ------------------------------------------------------------------------ */

/* The report of a scan (first_* = -1 when none). */
static xent_rl_lp_report xr_report(const xr_lp_rec *r) {
    xent_rl_lp_report o;
    o.n_checked = (int64_t)r->n_checked;
    o.n_nan = (int64_t)r->n_nan;
    o.first_nan = xr_first(r->first_nan);
    o.n_positive = (int64_t)r->n_pos;
    o.first_positive = xr_first(r->first_pos);
    o.n_neg_inf = (int64_t)r->n_ninf;
    o.first_neg_inf = xr_first(r->first_ninf);
    o.n_zero_runs = (int64_t)r->n_zrun;
    o.first_zero_run = xr_first(r->first_zrun);
    o.longest_zero_run = (int64_t)r->longest;
    return o;
}

extern "C" xent_status xent_cuda_rl_check_logprobs(const char *name, const float *lp, int64_t T,
                                                   const int64_t *offsets, int64_t nseq,
                                                   const uint8_t *mask, int allow_neg_inf,
                                                   int64_t zero_run_limit,
                                                   xent_rl_lp_report *report, void *stream) {
    if (!name) name = "logprobs";
    if (report) {
        memset(report, 0, sizeof *report);
        report->first_nan = report->first_positive = report->first_neg_inf = -1;
        report->first_zero_run = -1;
    }
    if (T < 0) return xent_set_error(XENT_ERR_SHAPE, "%s: T = %lld < 0", name, (long long)T);
    if (!lp && T > 0) return xent_set_error(XENT_ERR_NULL, "%s is NULL", name);
    if (nseq < 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s: nseq = %lld < 0", name, (long long)nseq);
    if (zero_run_limit < 0)
        return xent_set_error(XENT_ERR_VALUE, "zero_run_limit = %lld < 0", (long long)zero_run_limit);
    xr_ctx c;
    xent_status st = xr_begin(&c, stream, 0);
    if (st != XENT_OK) return xr_end(&c, st);
    if (offsets) xr_scan_offsets(&c, offsets, nseq);
    xr_scan_mask(&c, mask, T);
    if (T > 0) {
        xr_k_lp<<<xr_blocks(T), XR_TPB, 0, c.s>>>(lp, T, mask, &c.d->lp[0]);
        xr_k_zero_runs<<<xr_seq_blocks(offsets ? nseq : 1), XR_TPB, 0, c.s>>>(
            lp, T, offsets, nseq, mask, zero_run_limit, &c.d->lp[0]);
    }
    if ((st = xr_sync_rec(&c)) != XENT_OK) return xr_end(&c, st);
    if (offsets) st = xr_offsets_fail(&c, "offsets", offsets, nseq, T);
    if (st == XENT_OK) st = xr_mask_fail(&c, "mask", mask);
    if (st != XENT_OK) return xr_end(&c, st);
    if (report) *report = xr_report(&c.h.lp[0]);
    return xr_end(&c, xr_lp_fail(&c, 0, name, lp, allow_neg_inf, zero_run_limit));
}
