/* src/cuda/sampler.cu: processed log-probs on CUDA (include/xent/sampler.h,
 * docs/sampler.md). One block of 256 threads a row (a grid-stride loop over
 * the rows). The cuts are thresholds on the value axis (the monotone key of
 * src/cpu/sampler_row.h) found by bisection over the 32-bit key, each step
 * one block reduction: a count for top-k, a compensated sum in double for
 * top-p. The terms and the last step are those of the CPU
 * (src/cpu/sampler_row.h); every reduction is a fixed tree, so a row's
 * outputs do not depend on T or on the row's position. */
#include <cuda_runtime.h>

#include "cpu/sampler_row.h"

namespace {

constexpr int kThreads = 256;

struct Shared {
    double s[kThreads];
    double c[kThreads];
    unsigned long long u[kThreads];
};

__device__ float load_z(const void *z, xent_dtype t, int64_t j) { return xent__load(z, t, j); }

/* Block sum of a compensated partial (every thread gets the total). */
__device__ xs_sum block_sum(Shared &sh, xs_sum v) {
    int t = threadIdx.x;
    __syncthreads();
    sh.s[t] = v.s;
    sh.c[t] = v.c;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if (t < w) {
            xs_sum a = {sh.s[t], sh.c[t]};
            xs_sum b = {sh.s[t + w], sh.c[t + w]};
            xs_merge(&a, b);
            sh.s[t] = a.s;
            sh.c[t] = a.c;
        }
        __syncthreads();
    }
    xs_sum r = {sh.s[0], sh.c[0]};
    __syncthreads();
    return r;
}

/* Block sum (op 0), max (op 1) or min (op 2) of unsigned 64-bit values. */
__device__ unsigned long long block_u64(Shared &sh, unsigned long long v, int op) {
    int t = threadIdx.x;
    __syncthreads();
    sh.u[t] = v;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
        if (t < w) {
            unsigned long long a = sh.u[t], b = sh.u[t + w];
            sh.u[t] = op == 0 ? a + b : op == 1 ? (a > b ? a : b) : (a < b ? a : b);
        }
        __syncthreads();
    }
    unsigned long long r = sh.u[0];
    __syncthreads();
    return r;
}

struct Args {
    const void *logits;
    xent_dtype dtype;
    int64_t T, V, ld;
    const void *labels;
    xent_dtype label_dtype;
    int64_t ignore_index;
    xs_params p;
    xent_sampler_output out;
};

__device__ double term(float z, float zmax, double tau) {
    return z == zmax ? 1.0 : xent__exp(xs_d(z, zmax, tau));
}

__global__ void __launch_bounds__(kThreads) sampler_kernel(Args a) {
    __shared__ Shared sh;
    const xs_params *p = &a.p;
    const int tid = threadIdx.x;
    const size_t esz = a.dtype == XENT_F32 ? 4 : 2;
    for (int64_t i = blockIdx.x; i < a.T; i += gridDim.x) {
        const void *z = (const char *)a.logits + (size_t)(i * a.ld) * esz;
        int64_t lab = a.labels ? xent__label(a.labels, a.label_dtype, i) : a.ignore_index;
        int counted = lab != a.ignore_index;

        /* pass 1: the max (as a key) and non-finite logits */
        unsigned long long kmx = 0, bad = 0;
        for (int64_t j = tid; j < a.V; j += kThreads) {
            float v = load_z(z, a.dtype, j);
            if (!isfinite(v)) bad = 1;
            else {
                unsigned long long k = xs_key(v);
                if (k > kmx) kmx = k;
            }
        }
        bad = block_u64(sh, bad, 1);
        kmx = block_u64(sh, kmx, 1);
        if (bad) {
            if (tid == 0) {
                if (a.out.logprob) a.out.logprob[i] = counted ? NAN : 0.0f;
                if (a.out.logprob_full) a.out.logprob_full[i] = counted ? NAN : 0.0f;
                if (a.out.kept) a.out.kept[i] = 0;
                if (a.out.log_kept_mass) a.out.log_kept_mass[i] = NAN;
                if (a.out.entropy) a.out.entropy[i] = NAN;
                if (a.out.flags) a.out.flags[i] = 0;
                if (a.out.n_nonfinite) atomicAdd((unsigned long long *)a.out.n_nonfinite, 1ull);
                if (counted && a.out.n_counted) atomicAdd((unsigned long long *)a.out.n_counted, 1ull);
            }
            continue;
        }
        /* the float of the max key */
        uint32_t kmax = (uint32_t)kmx;
        uint32_t ub = (kmax & 0x80000000u) ? (kmax & 0x7FFFFFFFu) : ~kmax;
        float zmax;
        memcpy(&zmax, &ub, 4);

        /* pass 2: full mass, min-p's set (key >= kmp) and its mass */
        xs_sum Sall = {0.0, 0.0}, Smp = {0.0, 0.0};
        unsigned long long gall = 0, nmp = 0, kmp = kmax, mnear = 0, lnear = 0;
        for (int64_t j = tid; j < a.V; j += kThreads) {
            float v = load_z(z, a.dtype, j);
            double d = xs_d(v, zmax, p->tau);
            if (v == zmax) gall++;
            else xs_add(&Sall, xent__exp(d));
            if (xs_minp_keep(p, d)) {
                nmp++;
                if (v != zmax) xs_add(&Smp, xent__exp(d));
                unsigned long long k = xs_key(v);
                if (k < kmp) kmp = k;
            }
            if (xs_minp_near(p, d)) {
                mnear = 1;
                if (counted && j == lab) lnear = 1;
            }
        }
        Sall = block_sum(sh, Sall);
        Smp = block_sum(sh, Smp);
        gall = block_u64(sh, gall, 0);
        nmp = block_u64(sh, nmp, 0);
        kmp = block_u64(sh, kmp, 2);
        mnear = block_u64(sh, mnear, 1);
        lnear = block_u64(sh, lnear, 1);
        int flags = mnear ? XENT_SAMPLER_MINP_NEAR : 0;
        int lab_amb = (int)lnear;

        /* top-k: the largest key v with count(key >= v) >= top_k */
        uint32_t k1 = (uint32_t)kmp;
        double S1o = xs_val(Smp);
        if (p->top_k > 0 && p->top_k < (int64_t)nmp) {
            unsigned long long lo = kmp, hi = (unsigned long long)kmax + 1;
            while (hi - lo > 1) {
                unsigned long long mid = lo + (hi - lo) / 2, n = 0;
                for (int64_t j = tid; j < a.V; j += kThreads)
                    n += xs_key(load_z(z, a.dtype, j)) >= mid;
                n = block_u64(sh, n, 0);
                if ((int64_t)n >= p->top_k) lo = mid;
                else hi = mid;
            }
            k1 = (uint32_t)lo;
            xs_sum s = {0.0, 0.0};
            unsigned long long n1 = 0;
            for (int64_t j = tid; j < a.V; j += kThreads) {
                float v = load_z(z, a.dtype, j);
                if (xs_key(v) < k1) continue;
                n1++;
                if (v != zmax) xs_add(&s, xent__exp(xs_d(v, zmax, p->tau)));
            }
            S1o = xs_val(block_sum(sh, s));
            n1 = block_u64(sh, n1, 0);
            if ((int64_t)n1 > p->top_k) flags |= XENT_SAMPLER_TOPK_TIE;
        }

        /* top-p: the largest key v >= k1 with mass(key >= v) >= target */
        int topp = p->top_p < 1.0;
        double S1 = (double)gall + S1o;
        double target = p->top_p * S1;
        uint32_t vstar = k1;
        if (topp) {
            unsigned long long lo = k1, hi = (unsigned long long)kmax + 1;
            while (hi - lo > 1) {
                unsigned long long mid = lo + (hi - lo) / 2;
                xs_sum s = {0.0, 0.0};
                for (int64_t j = tid; j < a.V; j += kThreads) {
                    float v = load_z(z, a.dtype, j);
                    if (xs_key(v) >= mid) xs_add(&s, term(v, zmax, p->tau));
                }
                if (xs_val(block_sum(sh, s)) >= target) lo = mid;
                else hi = mid;
            }
            vstar = (uint32_t)lo;
        }

        /* last pass: the kept set's sums */
        xs_sum Sk = {0.0, 0.0}, Ak = {0.0, 0.0}, R = {0.0, 0.0};
        unsigned long long g = 0, cmax = 0, nkept = 0, vnext = 0, has_next = 0;
        for (int64_t j = tid; j < a.V; j += kThreads) {
            float v = load_z(z, a.dtype, j);
            uint32_t key = xs_key(v);
            double d = xs_d(v, zmax, p->tau);
            double e = v == zmax ? 1.0 : xent__exp(d);
            if (key < k1 || (topp && key < vstar)) {
                xs_add(&R, e);
                if (key >= k1) {
                    has_next = 1;
                    if (key > vnext) vnext = key;
                }
                continue;
            }
            if (topp && key == vstar) {
                g++;
                continue;
            }
            nkept++;
            if (v == zmax) cmax++;
            else {
                xs_add(&Sk, e);
                xs_add(&Ak, e * -d);
            }
        }
        Sk = block_sum(sh, Sk);
        Ak = block_sum(sh, Ak);
        R = block_sum(sh, R);
        g = block_u64(sh, g, 0);
        cmax = block_u64(sh, cmax, 0);
        nkept = block_u64(sh, nkept, 0);
        vnext = block_u64(sh, vnext, 1);
        has_next = block_u64(sh, has_next, 1);

        if (tid == 0) {
            if (topp) {
                uint32_t ubs = (vstar & 0x80000000u) ? (vstar & 0x7FFFFFFFu) : ~vstar;
                float zstar;
                memcpy(&zstar, &ubs, 4);
                double dstar = xs_d(zstar, zmax, p->tau);
                double w = zstar == zmax ? 1.0 : xent__exp(dstar);
                double Mgt = (double)cmax + xs_val(Sk);
                int near = 0;
                int64_t cg = xs_topp_count(Mgt, w, (int64_t)g, target, S1, p->tol_mass, &near);
                if (near) flags |= XENT_SAMPLER_TOPP_NEAR;
                if (cg < (int64_t)g) flags |= XENT_SAMPLER_TOPP_TIE;
                if (vstar == kmax) {
                    cmax += (unsigned long long)cg;
                    xs_add(&R, (double)((int64_t)g - cg));
                } else {
                    xs_add(&Sk, (double)cg * w);
                    xs_add(&Ak, ((double)cg * w) * -dstar);
                    xs_add(&R, (double)((int64_t)g - cg) * w);
                }
                nkept += (unsigned long long)cg;
                if (counted) {
                    uint32_t kt = xs_key(load_z(z, a.dtype, lab));
                    if (kt == vstar && cg < (int64_t)g) lab_amb = 1;
                    if (near && (kt == vstar || (has_next && kt == (uint32_t)vnext))) lab_amb = 1;
                }
            }
            xs_row s;
            s.cmax = (int64_t)cmax;
            s.gall = (int64_t)gall;
            s.kept = (int64_t)nkept;
            s.Sk = xs_val(Sk);
            s.Ak = xs_val(Ak);
            s.R = xs_val(R);
            s.Sall = xs_val(Sall);
            xs_out o = xs_finish(&s);
            if (counted) {
                float zt = load_z(z, a.dtype, lab);
                uint32_t kt = xs_key(zt);
                double dt = xs_d(zt, zmax, p->tau);
                int kept_t = topp ? kt >= vstar : kt >= k1;
                if (lab_amb) flags |= XENT_SAMPLER_LABEL_AMBIGUOUS;
                if (a.out.logprob) a.out.logprob[i] = kept_t ? (float)(dt - o.L) : -INFINITY;
                if (a.out.logprob_full) a.out.logprob_full[i] = (float)(dt - o.Lall);
                if (a.out.n_counted) atomicAdd((unsigned long long *)a.out.n_counted, 1ull);
                if (!kept_t && a.out.n_dropped) atomicAdd((unsigned long long *)a.out.n_dropped, 1ull);
            } else {
                if (a.out.logprob) a.out.logprob[i] = 0.0f;
                if (a.out.logprob_full) a.out.logprob_full[i] = 0.0f;
            }
            if ((flags & (XENT_SAMPLER_MINP_NEAR | XENT_SAMPLER_TOPP_NEAR | XENT_SAMPLER_TOPP_TIE)) &&
                a.out.n_ambiguous)
                atomicAdd((unsigned long long *)a.out.n_ambiguous, 1ull);
            if (a.out.kept) a.out.kept[i] = s.kept;
            if (a.out.log_kept_mass) a.out.log_kept_mass[i] = (float)o.log_kept;
            if (a.out.entropy) a.out.entropy[i] = (float)o.entropy;
            if (a.out.flags) a.out.flags[i] = flags;
        }
        __syncthreads();
    }
}

/* The first row whose label is outside [0, V) and not ignore_index. */
__global__ void check_labels_kernel(const void *labels, xent_dtype t, int64_t T, int64_t V,
                                    int64_t ignore, unsigned long long *first) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < T;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = xent__label(labels, t, r);
        if (v != ignore && (v < 0 || v >= V)) atomicMin(first, (unsigned long long)r);
    }
}

xent_status cuda_fail(cudaError_t e, const char *what) {
    return xent_set_error(XENT_ERR_CUDA, "xent_cuda_sampler_logprobs: %s: %s", what, cudaGetErrorString(e));
}

} // namespace

extern "C" xent_status xent_cuda_sampler_logprobs(const xent_ce_input *in, const xent_sampler_opts *opts,
                                                  xent_sampler_output *out, void *stream) {
    xent_sampler_opts o;
    xent_status st = xent__sampler_check(in, opts, out, &o);
    if (st != XENT_OK) return st;
    if (in->V >= ((int64_t)1 << 31))
        return xent_set_error(XENT_ERR_SHAPE, "V = %lld must be below 2^31 on CUDA", (long long)in->V);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    if (in->labels && in->T > 0) {
        unsigned long long *first = NULL, host = 0;
        e = cudaMallocAsync((void **)&first, sizeof *first, s);
        if (e != cudaSuccess) return cuda_fail(e, "cudaMallocAsync");
        cudaMemsetAsync(first, 0xFF, sizeof *first, s);
        int64_t blocks = (in->T + 255) / 256;
        if (blocks > 4096) blocks = 4096;
        check_labels_kernel<<<(unsigned)blocks, 256, 0, s>>>(in->labels, in->label_dtype, in->T, in->V,
                                                             o.ignore_index, first);
        e = cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, s);
        cudaError_t e2 = cudaFreeAsync(first, s);
        cudaError_t e3 = cudaStreamSynchronize(s);
        if (e == cudaSuccess) e = e2;
        if (e == cudaSuccess) e = e3;
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) return cuda_fail(e, "label check");
        if (host != ~0ull) {
            int64_t r = (int64_t)host, v = 0;
            size_t lsz = in->label_dtype == XENT_I32 ? 4 : 8;
            char buf[8];
            e = cudaMemcpy(buf, (const char *)in->labels + (size_t)r * lsz, lsz, cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) return cuda_fail(e, "reading a label");
            v = xent__label(buf, in->label_dtype, 0);
            return xent_set_error(XENT_ERR_LABEL, "labels[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                                  (long long)r, (long long)v, (long long)in->V, (long long)o.ignore_index);
        }
    }
    int64_t *counters[4] = {out->n_counted, out->n_dropped, out->n_ambiguous, out->n_nonfinite};
    for (int k = 0; k < 4; k++) {
        if (!counters[k]) continue;
        e = cudaMemsetAsync(counters[k], 0, sizeof(int64_t), s);
        if (e != cudaSuccess) return cuda_fail(e, "cudaMemsetAsync");
    }
    if (in->T == 0) return XENT_OK;
    Args a;
    a.logits = in->logits;
    a.dtype = in->dtype;
    a.T = in->T;
    a.V = in->V;
    a.ld = in->ld ? in->ld : in->V;
    a.labels = in->labels;
    a.label_dtype = in->label_dtype;
    a.ignore_index = o.ignore_index;
    a.p.tau = o.temperature;
    a.p.top_p = o.top_p;
    a.p.use_minp = o.min_p > 0.0;
    a.p.lnmp = a.p.use_minp ? log(o.min_p) : -INFINITY;
    a.p.tol_log = 2.0 * o.boundary_tol;
    a.p.tol_mass = XS_MASS_BOUND + 2.0 * o.boundary_tol;
    a.p.top_k = o.top_k >= in->V ? 0 : o.top_k;
    a.out = *out;
    int64_t blocks = in->T < 65535 * 16 ? in->T : 65535 * 16;
    sampler_kernel<<<(unsigned)blocks, kThreads, 0, s>>>(a);
    e = cudaGetLastError();
    if (e != cudaSuccess) return cuda_fail(e, "kernel launch");
    return XENT_OK;
}
