/* src/cuda/ce_api.cu: the public xent_cuda_* entry points: argument checks
 * (same rules and messages as the CPU), the label pass, scratch memory and
 * the kernel launches of ce_stream.cu. */
#include "ce_host.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

extern "C" xent_status xent__ce_check_opts(const xent_ce_opts *o, int64_t V); /* src/cpu/ce.c */

static thread_local int g_check_labels = 1;
static thread_local int g_exact = 0;

/* A failed runtime call also leaves its error as the thread's last error,
 * which the next call's launch check (cudaGetLastError) would take for its
 * own: reported once here, then cleared (an error that sticks to the
 * context, such as a kernel's fault, stays). */
xent_status xc_cuda(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return XENT_OK;
    (void)cudaGetLastError();
    return xent_set_error(XENT_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

xent_status xc_alloc(void **ptr, size_t bytes, cudaStream_t s, const char *what) {
    const cudaError_t e = xc_malloc_async(ptr, bytes, s);
    if (e == cudaSuccess) return XENT_OK;
    char w[192];
    snprintf(w, sizeof w, "%s: %zu bytes (stream-ordered allocation)", what, bytes);
    return xc_cuda(e, w);
}

extern "C" int xent_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int xent_cuda_set_label_check(int on) {
    int old = g_check_labels;
    g_check_labels = on != 0;
    return old;
}

extern "C" int xent_cuda_set_exact(int on) {
    int old = g_exact;
    g_exact = on != 0;
    return old;
}

/* ------------------------------------------------------------------ */
/* Argument checks                                                     */
/* ------------------------------------------------------------------ */

static void xc_default_opts(xent_ce_opts *o) { xent_ce_opts_init(o); }

int xc_is_float(xent_dtype t) {
    return t == XENT_F32 || t == XENT_BF16 || t == XENT_F16;
}

/* The CPU's option checks, with the entry point's name in front. */
xent_status xc_check_opts(const char *fn, const xent_ce_opts *o, int64_t V) {
    xent_status st = xent__ce_check_opts(o, V);
    if (st == XENT_OK) return st;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", xent_last_error());
    return xent_set_error(st, "%s: %s", fn, msg);
}

/* need_logits: the call reads in->logits (all but combine). */
static xent_status xc_check_input(const char *fn, const xent_ce_input *in,
                                  const xent_ce_opts *o, int need_logits) {
    if (!in) return xent_set_error(XENT_ERR_NULL, "%s: in is NULL", fn);
    if (in->T < 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s: in.T = %lld must be >= 0", fn, (long long)in->T);
    if (in->V <= 0)
        return xent_set_error(XENT_ERR_SHAPE, "%s: in.V = %lld must be > 0", fn, (long long)in->V);
    if (in->V >= ((int64_t)1 << 33))
        return xent_set_error(XENT_ERR_SHAPE, "%s: in.V = %lld is not below 2^33 (CUDA kernels)", fn,
                          (long long)in->V);
    if (need_logits) {
        if (in->ld != 0 && in->ld < in->V)
            return xent_set_error(XENT_ERR_SHAPE, "%s: in.ld = %lld is smaller than in.V = %lld", fn,
                              (long long)in->ld, (long long)in->V);
        if (!xc_is_float(in->dtype))
            return xent_set_error(XENT_ERR_DTYPE, "%s: in.dtype = %d is not f32, bf16 or f16", fn,
                              (int)in->dtype);
        if (in->T > 0 && !in->logits)
            return xent_set_error(XENT_ERR_NULL, "%s: in.logits is NULL", fn);
    }
    if (in->labels && in->label_dtype != XENT_I32 && in->label_dtype != XENT_I64)
        return xent_set_error(XENT_ERR_DTYPE, "%s: in.label_dtype = %d is not i32 or i64", fn,
                          (int)in->label_dtype);
    return xc_check_opts(fn, o, in->V);
}

xc_params xc_make(const xent_ce_input *in, const xent_ce_opts *o) {
    xc_params p;
    memset(&p, 0, sizeof p);
    p.logits = in->logits;
    p.T = in->T;
    p.V = in->V;
    p.ld = in->ld ? in->ld : in->V;
    p.in_dtype = in->dtype;
    p.labels = in->labels;
    p.labels64 = in->label_dtype == XENT_I64;
    p.ignore_index = o->ignore_index;
    p.vocab_start = o->vocab_start;
    p.vocab_total = o->vocab_total ? o->vocab_total : in->V;
    p.temperature = o->temperature;
    p.inv_tau = 1.0 / o->temperature;
    p.inv_cap = o->softcap > 0 ? 1.0 / o->softcap : 0.0;
    p.softcap = o->softcap;
    p.z_loss = o->z_loss;
    p.eps = o->label_smoothing;
    p.grad_scale = o->grad_scale;
    p.normalizer = o->normalizer;
    p.reduction = o->reduction;
    p.grad_rows = in->grad_rows;
    p.unchecked = !g_check_labels;
    p.exact = g_exact;
    return p;
}

/* ------------------------------------------------------------------ */
/* Scratch: the label record, per-row accumulators and partials        */
/* ------------------------------------------------------------------ */

/* Scratch memory: stream-ordered allocations from a pool that this
 * library creates on each device at first use and that keeps up to
 * XC_POOL_KEEP bytes of freed memory across synchronizations. (The
 * device's default pool keeps none: it releases freed memory at every
 * synchronization, such as the label check's, so each call mapped its
 * scratch again: about 0.1 ms a call, measured on an H200.) Under stream
 * capture the allocation is the graph's (cudaMallocAsync). */
#define XC_POOL_KEEP ((uint64_t)64 << 20)
#define XC_MAX_DEVICES 64

cudaError_t xc_malloc_async(void **ptr, size_t bytes, cudaStream_t s) {
    static std::mutex lock;
    static cudaMemPool_t pools[XC_MAX_DEVICES];
    /* under graph capture: the graph's own allocation nodes */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s, &cs);
    if (e != cudaSuccess) return e;
    if (cs != cudaStreamCaptureStatusNone) return cudaMallocAsync(ptr, bytes, s);
    int dev = 0;
#if CUDART_VERSION >= 12080
    e = s ? cudaStreamGetDevice(s, &dev) : cudaGetDevice(&dev);
#else
    if (s) return cudaMallocAsync(ptr, bytes, s); /* no way to ask the stream's device */
    e = cudaGetDevice(&dev);
#endif
    if (e != cudaSuccess) return e;
    if (dev < 0 || dev >= XC_MAX_DEVICES) return cudaMallocAsync(ptr, bytes, s);
    cudaMemPool_t pool;
    {
        std::lock_guard<std::mutex> g(lock);
        if (!pools[dev]) {
            cudaMemPoolProps pr;
            memset(&pr, 0, sizeof pr);
            pr.allocType = cudaMemAllocationTypePinned;
            pr.location.type = cudaMemLocationTypeDevice;
            pr.location.id = dev;
            cudaMemPool_t np;
            e = cudaMemPoolCreate(&np, &pr);
            if (e != cudaSuccess) return e;
            uint64_t keep = XC_POOL_KEEP;
            e = cudaMemPoolSetAttribute(np, cudaMemPoolAttrReleaseThreshold, &keep);
            if (e != cudaSuccess) { cudaMemPoolDestroy(np); return e; }
            pools[dev] = np;
        }
        pool = pools[dev];
    }
    return cudaMallocFromPoolAsync(ptr, bytes, pool, s);
}

typedef struct xc_scratch {
    xc_label_rec *rec;     /* device, 16 bytes               */
    xc_long_acc *acc;      /* device, 576 bytes, or NULL     */
    xc_rowstat *stat;      /* device, [T] or NULL            */
    cudaStream_t s;
} xc_scratch;

static_assert(sizeof(xc_label_rec) == 16 && sizeof(xc_long_acc) == 576 &&
                  sizeof(xc_rowstat) == 16,
              "the scratch: 16 bytes, 576 for the reductions, 16 a row forward-only");

/* The label record (16 bytes), the reductions' accumulator when a reduced
 * loss or a count is asked for (576 bytes, whatever T), and the forward-only
 * row statistics when the finish is a second kernel (16 bytes a row). */
static xent_status xc_scratch_get(xc_scratch *sc, int64_t T, int want_acc, int want_stat,
                                  cudaStream_t s) {
    sc->rec = NULL;
    sc->acc = NULL;
    sc->stat = NULL;
    sc->s = s;
    const size_t acc_bytes = want_acc ? sizeof(xc_long_acc) : 0;
    const size_t row_bytes = want_stat ? (size_t)T * sizeof(xc_rowstat) : 0;
    void *p = NULL;
    const xent_status st =
        xc_alloc(&p, sizeof(xc_label_rec) + acc_bytes + row_bytes, s, "scratch");
    if (st != XENT_OK) return st;
    char *c = (char *)p;
    sc->rec = (xc_label_rec *)c;
    if (want_acc) sc->acc = (xc_long_acc *)(c + sizeof(xc_label_rec));
    if (want_stat) sc->stat = (xc_rowstat *)(c + sizeof(xc_label_rec) + acc_bytes);
    return XENT_OK;
}

static xent_status xc_scratch_put(xc_scratch *sc, xent_status st) {
    if (sc->rec) {
        cudaError_t e = cudaFreeAsync(sc->rec, sc->s);
        if (st == XENT_OK && e != cudaSuccess) st = xc_cuda(e, "cudaFreeAsync (scratch)");
    }
    return st;
}

/* ------------------------------------------------------------------ */
/* The label check                                                     */
/* ------------------------------------------------------------------ */
/* The label pass writes a 16-byte record: the first bad row, if any. The
 * host must read it to return a status, but need not wait for it before
 * queueing the row kernels: xc_label_begin copies the record into pinned
 * host memory and records an event; the caller queues its kernels with
 * p->gated set (each returns at once, writing nothing, when the record
 * reports a bad row: xc_gate); xc_label_end waits for the event (the label
 * pass, not the row kernels) and reports. So the GPU does not idle while
 * the host reads the record. Without a free pinned slot, or under stream
 * capture, xc_label_begin synchronizes and reports at once, as before (a
 * capture fails there: it must run with the check off, as the Python
 * binding does). The fused LM head calls both at once (xc_label_pass). */

#define XC_PIN_SLOTS 64 /* calls in flight at once on the asynchronous path */

static xc_label_rec *g_pin;                  /* [XC_PIN_SLOTS] pinned host records */
static unsigned long long g_pin_used;        /* bit k: slot k taken (atomic)      */
static std::once_flag g_pin_once;

/* A free pinned slot, or -1 (none left, or no pinned memory). */
static int xc_pin_take(void) {
    std::call_once(g_pin_once, [] {
        void *h = NULL;
        if (cudaHostAlloc(&h, XC_PIN_SLOTS * sizeof(xc_label_rec), cudaHostAllocPortable) ==
            cudaSuccess)
            g_pin = (xc_label_rec *)h;
        else
            (void)cudaGetLastError(); /* not sticky: the calls synchronize instead */
    });
    if (!g_pin) return -1;
    unsigned long long u = __atomic_load_n(&g_pin_used, __ATOMIC_ACQUIRE);
    while (~u) {
        const int k = __builtin_ctzll(~u);
        if (__atomic_compare_exchange_n(&g_pin_used, &u, u | 1ull << k, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return k;
    }
    return -1;
}
static void xc_pin_give(int k) {
    __atomic_fetch_and(&g_pin_used, ~(1ull << k), __ATOMIC_RELEASE);
}

/* A label check in flight between xc_label_begin and xc_label_end. */
typedef struct xc_pending {
    int slot;        /* pinned slot, or -1: nothing left to wait for */
    cudaEvent_t ev;  /* recorded after the record's copy             */
} xc_pending;

static xent_status xc_label_report(const char *fn, const xc_params *p,
                                   const xc_label_rec &rec);

/* Runs the label pass into rec_d (device, 16 bytes). When checking, either
 * starts the record's copy (pend->slot >= 0, p->gated set: the caller
 * queues its kernels, then calls xc_label_end) or synchronizes and reports
 * the first bad row at once. */
static xent_status xc_label_begin(const char *fn, xc_params *p, xc_label_rec *rec_d,
                                  cudaStream_t s, xc_pending *pend) {
    pend->slot = -1;
    p->rec = rec_d;
    xent_status st = xc_cuda((cudaError_t)xc_launch_labels(p, rec_d, s), "label pass");
    if (st != XENT_OK || p->unchecked || (!p->labels && !p->grad_rows && !p->parts)) return st;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    st = xc_cuda(cudaStreamIsCapturing(s, &cs), "cudaStreamIsCapturing");
    if (st != XENT_OK) return st;
    const int k = cs == cudaStreamCaptureStatusNone ? xc_pin_take() : -1;
    if (k >= 0) {
        cudaEvent_t ev;
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            xc_pin_give(k);
        } else {
            st = xc_cuda(cudaMemcpyAsync(g_pin + k, rec_d, sizeof *g_pin,
                                         cudaMemcpyDeviceToHost, s), "label record copy");
            if (st == XENT_OK) st = xc_cuda(cudaEventRecord(ev, s), "label record event");
            if (st != XENT_OK) {
                cudaEventDestroy(ev);
                xc_pin_give(k);
                return st;
            }
            pend->slot = k;
            pend->ev = ev;
            p->gated = 1;
            return XENT_OK;
        }
    }
    xc_label_rec rec;
    st = xc_cuda(cudaMemcpyAsync(&rec, rec_d, sizeof rec, cudaMemcpyDeviceToHost, s),
                 "label record copy");
    if (st == XENT_OK) st = xc_cuda(cudaStreamSynchronize(s), "label pass (synchronize)");
    if (st != XENT_OK) return st;
    return xc_label_report(fn, p, rec);
}

/* Waits for the record started by xc_label_begin (not for the kernels
 * queued since) and reports the first bad row; nothing to do when
 * xc_label_begin has reported. Always called once after it. */
static xent_status xc_label_end(const char *fn, const xc_params *p, xc_pending *pend) {
    if (pend->slot < 0) return XENT_OK;
    xent_status st = xc_cuda(cudaEventSynchronize(pend->ev), "label pass (event)");
    const xc_label_rec rec = g_pin[pend->slot];
    cudaEventDestroy(pend->ev);
    xc_pin_give(pend->slot);
    pend->slot = -1;
    if (st != XENT_OK) return st;
    return xc_label_report(fn, p, rec);
}

xent_status xc_label_pass(const char *fn, const xc_params *p, xc_label_rec *rec_d,
                          cudaStream_t s) {
    xc_params q = *p;
    xc_pending pend;
    const xent_status st = xc_label_begin(fn, &q, rec_d, s, &pend);
    const xent_status se = xc_label_end(fn, &q, &pend);
    return st != XENT_OK ? st : se;
}

/* The first bad row of a label record, as an error (XENT_OK: none). */
static xent_status xc_label_report(const char *fn, const xc_params *p,
                                   const xc_label_rec &rec) {
    if (rec.neg_first_bad == 0) return XENT_OK;
    xent_status st = XENT_OK;
    const int64_t row = p->T - (int64_t)((rec.neg_first_bad >> 2) & ((1ull << 58) - 1));
    const int kind = (int)(rec.neg_first_bad & 3);
    long long v = (long long)p->ignore_index; /* the row's label (none: ignored) */
    if (p->labels && p->labels64) {
        int64_t x = 0;
        st = xc_cuda(cudaMemcpy(&x, (const int64_t *)p->labels + row, 8, cudaMemcpyDeviceToHost),
                     "label copy");
        v = x;
    } else if (p->labels) {
        int32_t x = 0;
        st = xc_cuda(cudaMemcpy(&x, (const int32_t *)p->labels + row, 4, cudaMemcpyDeviceToHost),
                     "label copy");
        v = x;
    }
    if (st != XENT_OK) return st;
    if (kind == 2) {
        float g = 0;
        st = xc_cuda(cudaMemcpy(&g, p->grad_rows + row, 4, cudaMemcpyDeviceToHost),
                     "grad_rows copy");
        if (st != XENT_OK) return st;
        return xent_set_error(XENT_ERR_VALUE, "%s: grad_rows[%lld] = %g is not finite", fn,
                          (long long)row, (double)g);
    }
    if (kind == 1) {
        int owners = 0;
        for (int k = 0; k < p->nshards && st == XENT_OK; k++) {
            xent_ce_partial q;
            st = xc_cuda(cudaMemcpy(&q, p->parts + (int64_t)k * p->T + row, sizeof q,
                                    cudaMemcpyDeviceToHost), "partial copy");
            owners += (int)(q.flags & 1);
        }
        if (st != XENT_OK) return st;
        const int want = v != (long long)p->ignore_index;
        return xent_set_error(XENT_ERR_VALUE,
                          "%s: row %lld (label %lld): %d shards claim the target; expected %d "
                          "(check each shard's vocab_start)", fn, (long long)row, v, owners, want);
    }
    return xent_set_error(XENT_ERR_LABEL, "%s: labels[%lld] = %lld is outside [0, %lld)", fn,
                      (long long)row, v, (long long)p->vocab_total);
}

xent_status xc_zero_rows(xent_ce_output *out, const xent_ce_opts *o, cudaStream_t s) {
    xent_status st = XENT_OK;
    if (out->loss && o->reduction != XENT_REDUCE_NONE)
        st = xc_cuda(cudaMemsetAsync(out->loss, 0, sizeof(float), s), "loss");
    if (st == XENT_OK && out->n_counted)
        st = xc_cuda(cudaMemsetAsync(out->n_counted, 0, 8, s), "n_counted");
    if (st == XENT_OK && out->n_nonfinite)
        st = xc_cuda(cudaMemsetAsync(out->n_nonfinite, 0, 8, s), "n_nonfinite");
    return st;
}

void xc_set_outputs(xc_params *p, const xent_ce_output *out) {
    p->nll = out->nll;
    p->logprob = out->logprob;
    p->lse = out->lse;
    p->entropy = out->entropy;
    p->stats = out->stats;
    p->loss_rows = p->reduction == XENT_REDUCE_NONE ? out->loss : NULL;
    p->extra = out->entropy != NULL || p->eps != 0;
}

/* Common tail of the forward calls: rows (or combine), then reductions. */
static xent_status xc_forward(const char *fn, xc_params *p, xent_ce_output *out,
                              int combine, cudaStream_t s) {
    const int want_acc = (out->loss && p->reduction != XENT_REDUCE_NONE) ||
                         out->n_counted || out->n_nonfinite;
    xc_set_outputs(p, out);
    p->skip_ignored = !combine && p->labels && !out->lse && !out->entropy && !out->stats &&
                      !out->n_nonfinite;
    /* forward only without entropy or smoothing: the row kernel leaves
     * each row's statistics (16 bytes) for a second kernel to finish
     * (xc_launch_rows); with them, the row kernel finishes its rows */
    const int want_stat = !combine && !p->grad && p->mode == XC_MODE_FWD && !p->extra;
    xc_scratch sc;
    xent_status st = xc_scratch_get(&sc, p->T, want_acc, want_stat, s);
    if (st != XENT_OK) return st;
    xc_pending pend;
    p->acc = sc.acc; /* zeroed by the label pass */
    st = xc_label_begin(fn, p, sc.rec, s, &pend);
    if (st == XENT_OK) {
        p->rowstat = sc.stat;
        int e = combine ? xc_launch_combine(p, s) : xc_launch_rows(p, s);
        st = xc_cuda((cudaError_t)e, combine ? "combine kernel" : "row kernel");
    }
    const xent_status se = xc_label_end(fn, p, &pend);
    if (st == XENT_OK) st = se;
    if (st == XENT_OK && want_acc)
        st = xc_cuda((cudaError_t)xc_launch_reduce(p, p->reduction == XENT_REDUCE_NONE
                                                          ? NULL : out->loss,
                                                   out->n_counted, out->n_nonfinite, s),
                     "reduce kernel");
    return xc_scratch_put(&sc, st);
}

/* ------------------------------------------------------------------ */
/* Entry points                                                        */
/* ------------------------------------------------------------------ */

static xent_status xc_check_grad(const char *fn, const xent_ce_input *in, const void *grad,
                                 xent_dtype gdt, int64_t ld_grad) {
    if (!xc_is_float(gdt))
        return xent_set_error(XENT_ERR_DTYPE, "%s: grad_dtype = %d is not f32, bf16 or f16", fn,
                          (int)gdt);
    if (ld_grad != 0 && ld_grad < in->V)
        return xent_set_error(XENT_ERR_SHAPE, "%s: ld_grad = %lld is smaller than in.V = %lld", fn,
                          (long long)ld_grad, (long long)in->V);
    if (grad == in->logits) {
        int64_t ld = in->ld ? in->ld : in->V, lg = ld_grad ? ld_grad : in->V;
        if (gdt != in->dtype || lg != ld)
            return xent_set_error(XENT_ERR_SHAPE,
                              "%s: in-place gradient needs grad_dtype == in.dtype and "
                              "ld_grad == in.ld (got %s/%lld vs %s/%lld)",
                              fn, xent_dtype_name(gdt), (long long)lg,
                              xent_dtype_name(in->dtype), (long long)ld);
    }
    return XENT_OK;
}

/* xent_cuda_ce and xent_cuda_logprobs work on whole rows, as xent_ce. */
static xent_status xc_whole_rows(const char *fn, const xent_ce_input *in, const xent_ce_opts *o) {
    if (o->vocab_start != 0 || (o->vocab_total != 0 && o->vocab_total != in->V))
        return xent_set_error(XENT_ERR_VALUE,
                          "%s needs whole rows (opts.vocab_start = %lld, opts.vocab_total = %lld, "
                          "V = %lld); for a vocabulary shard use xent_cuda_ce_shard_stats, "
                          "xent_cuda_ce_combine and xent_cuda_ce_backward",
                          fn, (long long)o->vocab_start, (long long)o->vocab_total, (long long)in->V);
    return XENT_OK;
}

extern "C" xent_status xent_cuda_ce(const xent_ce_input *in, const xent_ce_opts *opts,
                                    xent_ce_output *out, void *stream) {
    const char *fn = "xent_cuda_ce";
    xent_ce_opts d;
    if (!opts) { xc_default_opts(&d); opts = &d; }
    if (!out) return xent_set_error(XENT_ERR_NULL, "%s: out is NULL", fn);
    xent_status st = xc_check_input(fn, in, opts, 1);
    if (st == XENT_OK) st = xc_whole_rows(fn, in, opts);
    if (st == XENT_OK && out->grad)
        st = xc_check_grad(fn, in, out->grad, out->grad_dtype, out->ld_grad);
    if (st != XENT_OK) return st;
    cudaStream_t s = (cudaStream_t)stream;
    if (in->T == 0) return xc_zero_rows(out, opts, s);
    xc_params p = xc_make(in, opts);
    p.mode = XC_MODE_FWD;
    p.grad = out->grad;
    p.grad_dtype = out->grad_dtype;
    p.ld_grad = out->ld_grad ? out->ld_grad : in->V;
    return xc_forward(fn, &p, out, 0, s);
}

extern "C" xent_status xent_cuda_logprobs(const xent_ce_input *in, const xent_ce_opts *opts,
                                          float *logprob, float *entropy, void *stream) {
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.logprob = logprob;
    out.entropy = entropy;
    const char *fn = "xent_cuda_logprobs";
    xent_ce_opts d;
    if (!opts) { xc_default_opts(&d); opts = &d; }
    xent_status st = xc_check_input(fn, in, opts, 1);
    if (st == XENT_OK) st = xc_whole_rows(fn, in, opts);
    if (st != XENT_OK || in->T == 0) return st;
    xc_params p = xc_make(in, opts);
    p.mode = XC_MODE_FWD;
    return xc_forward(fn, &p, &out, 0, (cudaStream_t)stream);
}

extern "C" xent_status xent_cuda_ce_backward(const xent_ce_input *in, const xent_ce_opts *opts,
                                             const xent_ce_stats *stats, void *grad,
                                             xent_dtype grad_dtype, int64_t ld_grad,
                                             void *stream) {
    const char *fn = "xent_cuda_ce_backward";
    xent_ce_opts d;
    if (!opts) { xc_default_opts(&d); opts = &d; }
    xent_status st = xc_check_input(fn, in, opts, 1);
    if (st == XENT_OK && in->T > 0 && !stats)
        st = xent_set_error(XENT_ERR_NULL, "%s: stats is NULL", fn);
    if (st == XENT_OK && in->T > 0 && !grad)
        st = xent_set_error(XENT_ERR_NULL, "%s: grad is NULL", fn);
    if (st == XENT_OK && grad) st = xc_check_grad(fn, in, grad, grad_dtype, ld_grad);
    if (st != XENT_OK || in->T == 0) return st;
    cudaStream_t s = (cudaStream_t)stream;
    xc_params p = xc_make(in, opts);
    p.mode = XC_MODE_BWD;
    p.in_stats = stats;
    p.grad = grad;
    p.grad_dtype = grad_dtype;
    p.ld_grad = ld_grad ? ld_grad : in->V;
    xc_scratch sc;
    st = xc_scratch_get(&sc, in->T, 0, 0, s);
    if (st != XENT_OK) return st;
    xc_pending pend;
    st = xc_label_begin(fn, &p, sc.rec, s, &pend);
    if (st == XENT_OK)
        st = xc_cuda((cudaError_t)xc_launch_rows(&p, s), "backward kernel");
    const xent_status se = xc_label_end(fn, &p, &pend);
    return xc_scratch_put(&sc, st != XENT_OK ? st : se);
}

extern "C" xent_status xent_cuda_ce_shard_stats(const xent_ce_input *in,
                                                const xent_ce_opts *opts,
                                                xent_ce_partial *partial, void *stream) {
    const char *fn = "xent_cuda_ce_shard_stats";
    xent_ce_opts d;
    if (!opts) { xc_default_opts(&d); opts = &d; }
    xent_status st = xc_check_input(fn, in, opts, 1);
    if (st == XENT_OK && in->T > 0 && !partial)
        st = xent_set_error(XENT_ERR_NULL, "%s: partial is NULL", fn);
    if (st != XENT_OK || in->T == 0) return st;
    cudaStream_t s = (cudaStream_t)stream;
    xc_params p = xc_make(in, opts);
    p.mode = XC_MODE_PART;
    p.partial = partial;
    p.extra = 1;
    xc_scratch sc;
    st = xc_scratch_get(&sc, in->T, 0, 0, s);
    if (st != XENT_OK) return st;
    xc_pending pend;
    st = xc_label_begin(fn, &p, sc.rec, s, &pend);
    if (st == XENT_OK)
        st = xc_cuda((cudaError_t)xc_launch_rows(&p, s),
                     "shard statistics kernel");
    const xent_status se = xc_label_end(fn, &p, &pend);
    return xc_scratch_put(&sc, st != XENT_OK ? st : se);
}

extern "C" xent_status xent_cuda_ce_combine(const xent_ce_partial *parts, int S,
                                            const xent_ce_input *in, const xent_ce_opts *opts,
                                            xent_ce_output *out, void *stream) {
    const char *fn = "xent_cuda_ce_combine";
    xent_ce_opts d;
    if (!opts) { xc_default_opts(&d); opts = &d; }
    if (!out) return xent_set_error(XENT_ERR_NULL, "%s: out is NULL", fn);
    if (S < 1) return xent_set_error(XENT_ERR_SHAPE, "%s: S = %d must be >= 1", fn, S);
    if (!in) return xent_set_error(XENT_ERR_NULL, "%s: in is NULL", fn);
    /* as xent_ce_combine: the whole vocabulary, from column 0 */
    xent_ce_opts o = *opts;
    o.vocab_start = 0;
    if (o.vocab_total == 0) {
        if (S > 1)
            return xent_set_error(XENT_ERR_SHAPE,
                              "%s: opts.vocab_total = 0: the whole vocabulary size is needed to "
                              "combine %d shards", fn, S);
        o.vocab_total = in->V;
    }
    opts = &o;
    xent_ce_input wi = *in;
    wi.V = o.vocab_total;
    in = &wi;
    xent_status st = xc_check_input(fn, in, opts, 0);
    if (st == XENT_OK && in->T > 0 && !parts)
        st = xent_set_error(XENT_ERR_NULL, "%s: parts is NULL", fn);
    if (st != XENT_OK) return st;
    cudaStream_t s = (cudaStream_t)stream;
    if (in->T == 0) return xc_zero_rows(out, opts, s);
    xc_params p = xc_make(in, opts);
    p.parts = parts;
    p.nshards = S;
    return xc_forward(fn, &p, out, 1, s);
}
