/* src/core/core.c: status strings, error messages, dtypes, conversions, threads. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "core/xent_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static _Thread_local char g_errmsg[1024];

xent_status xent_set_error(xent_status s, const char *fmt, ...) {
    /* formatted aside first: the arguments may include xent_last_error() */
    char buf[sizeof g_errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(g_errmsg, buf, sizeof buf);
    return s;
}

const char *xent_last_error(void) { return g_errmsg; }

const char *xent_strerror(xent_status s) {
    switch (s) {
    case XENT_OK: return "ok";
    case XENT_ERR_NULL: return "a required pointer is NULL";
    case XENT_ERR_SHAPE: return "invalid or inconsistent shape";
    case XENT_ERR_LABEL: return "label out of range";
    case XENT_ERR_DTYPE: return "unsupported dtype";
    case XENT_ERR_VALUE: return "value out of range";
    case XENT_ERR_ALLOC: return "out of memory";
    case XENT_ERR_IO: return "file input/output error";
    case XENT_ERR_FORMAT: return "malformed file";
    case XENT_ERR_NOT_FOUND: return "not found";
    case XENT_ERR_CUDA: return "CUDA error";
    case XENT_ERR_UNSUPPORTED: return "not supported by this build";
    case XENT_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

const char *xent_version(void) {
#ifdef XENT_WITH_CUDA
    return XENT_VERSION " (cpu, cuda)";
#else
    return XENT_VERSION " (cpu)";
#endif
}

size_t xent_dtype_size(xent_dtype t) {
    switch (t) {
    case XENT_F32: case XENT_I32: return 4;
    case XENT_BF16: case XENT_F16: return 2;
    case XENT_F64: case XENT_I64: return 8;
    case XENT_U8: return 1;
    default: return 0;
    }
}

const char *xent_dtype_name(xent_dtype t) {
    static const char *names[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "u8"};
    return (unsigned)t < XENT_DTYPE_COUNT ? names[t] : "invalid";
}

xent_status xent_dtype_parse(const char *s, xent_dtype *out) {
    static const struct { const char *name; xent_dtype t; } tab[] = {
        {"f32", XENT_F32}, {"fp32", XENT_F32}, {"float32", XENT_F32}, {"float", XENT_F32},
        {"bf16", XENT_BF16}, {"bfloat16", XENT_BF16},
        {"f16", XENT_F16}, {"fp16", XENT_F16}, {"float16", XENT_F16}, {"half", XENT_F16},
        {"f64", XENT_F64}, {"fp64", XENT_F64}, {"float64", XENT_F64}, {"double", XENT_F64},
        {"i32", XENT_I32}, {"int32", XENT_I32}, {"i64", XENT_I64}, {"int64", XENT_I64},
        {"u8", XENT_U8}, {"uint8", XENT_U8},
    };
    if (!s || !out) return xent_set_error(XENT_ERR_NULL, "xent_dtype_parse: NULL argument");
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].name)) { *out = tab[i].t; return XENT_OK; }
    return xent_set_error(XENT_ERR_VALUE,
                      "unknown dtype '%s' (accepted: f32, bf16, f16, f64, i32, i64, u8)", s);
}

float xent_bf16_to_f32(uint16_t h) { return xent__bf16_f32(h); }
float xent_f16_to_f32(uint16_t h) { return xent__f16_f32(h); }

uint16_t xent_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7FFFu + lsb;
    return (uint16_t)(u >> 16);
}

/* Rounds a double to the nearest value with `mant` explicit mantissa bits,
 * exponent range [emin, emax] (normal numbers), subnormals below; RNE.
 * Returns the rounded value as a double (exact) or +-inf on overflow. */
static double round_to_format(double d, int mant, int emin, int emax) {
    if (!(d == d) || d == 0 || isinf(d)) return d;
    int e;
    frexp(d, &e); /* d = m * 2^e, 0.5 <= |m| < 1 -> exponent of d is e-1 */
    int exp = e - 1;
    if (exp < emin) exp = emin; /* subnormal spacing */
    double q = ldexp(1.0, exp - mant);         /* spacing of the format   */
    double r = nearbyint(d / q) * q;           /* exact: d/q and back     */
    double maxv = ldexp(2.0 - ldexp(1.0, -mant), emax);
    /* overflow: above max + half a spacing goes to inf (RNE rule) */
    if (fabs(r) > maxv) return copysign(INFINITY, d);
    return r;
}

uint16_t xent_f64_to_bf16(double d) {
    if (d != d) return 0x7FC0u;
    double r = round_to_format(d, 7, -126, 127);
    return xent_f32_to_bf16((float)r); /* exact: r is a bf16 value */
}

/* Single rounding from fp32 bits: normal results rebias the exponent and
 * round the 13 dropped bits to nearest even; results below 2^-14 are
 * rounded to a multiple of 2^-24 by one fp32 addition of 0.5 (whose ulp is
 * 2^-24), which rounds to nearest even; inf/NaN keep their class (NaN is
 * quieted). Checked against xent_f64_to_f16 on all 2^32 inputs. */
uint16_t xent_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7FFFFFFFu;
    if (u > 0x7F800000u) return sign | 0x7E00u | (uint16_t)((u >> 13) & 0x3FFu);
    if (u >= 0x477FF000u) return sign | 0x7C00u; /* >= 65520 (or inf): inf */
    if (u < 0x38800000u) {                       /* below 2^-14 */
        float a, half = 0.5f;
        memcpy(&a, &u, 4);
        float s = a + half;
        uint32_t su, hu;
        memcpy(&su, &s, 4);
        memcpy(&hu, &half, 4);
        return sign | (uint16_t)(su - hu);
    }
    u += 0xC8000FFFu + ((u >> 13) & 1u); /* exponent 127 -> 15, round */
    return sign | (uint16_t)(u >> 13);
}

uint16_t xent_f64_to_f16(double d) {
    uint16_t sign = signbit(d) ? 0x8000u : 0;
    if (d != d) return 0x7E00u;
    double r = round_to_format(d, 10, -14, 15);
    double a = fabs(r);
    if (isinf(a)) return sign | 0x7C00u;
    if (a == 0) return sign;
    int e;
    double m = frexp(a, &e); /* a = m 2^e */
    int exp = e - 1;
    if (exp < -14) /* subnormal: a = k * 2^-24 */
        return sign | (uint16_t)(a * 0x1.0p24);
    uint16_t mant = (uint16_t)((m * 2.0 - 1.0) * 1024.0);
    return sign | (uint16_t)((exp + 15) << 10) | mant;
}

static _Atomic int g_default_threads; /* 0: the cores available      */
static _Atomic int g_cores;           /* cached available_cores()      */

/* The CPUs this process may run on (sched_getaffinity), capped by a cgroup
 * v2 CPU quota (/sys/fs/cgroup/cpu.max, "quota period", rounded up) when
 * one is set; at least 1. Computed once. */
static int available_cores(void) {
    int c = atomic_load(&g_cores);
    if (c > 0) return c;
    long n = 0;
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
#ifdef __linux__
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        char q[32] = {0};
        long long period = 0;
        if (fscanf(f, "%31s %lld", q, &period) == 2 && strcmp(q, "max") != 0 && period > 0) {
            long long quota = atoll(q);
            long long lim = (quota + period - 1) / period;
            if (lim >= 1 && lim < n) n = (long)lim;
        }
        fclose(f);
    }
#endif
    c = n > 256 ? 256 : (int)n;
    atomic_store(&g_cores, c);
    return c;
}

int xent_set_num_threads(int n) {
    return atomic_exchange(&g_default_threads, n > 0 ? (n > 256 ? 256 : n) : 0);
}

int xent_num_threads(int requested) {
    int n = requested > 0 ? requested : atomic_load(&g_default_threads);
    if (n <= 0) n = available_cores();
    return n < 1 ? 1 : (n > 256 ? 256 : n);
}

/* ---- one-shot threads: the fallback when the pool is busy --------------- */

typedef struct {
    xent_range_fn fn;
    void *ctx;
    int64_t begin, end;
} range_job;

static void *range_thread(void *arg) {
    range_job *j = arg;
    j->fn(j->ctx, j->begin, j->end);
    return NULL;
}

static void parallel_spawn(int64_t n, int threads, xent_range_fn fn, void *ctx) {
    range_job jobs[256];
    pthread_t tids[256];
    int started[256] = {0};
    for (int k = 0; k < threads; k++)
        jobs[k] = (range_job){fn, ctx, n * k / threads, n * (k + 1) / threads};
    for (int k = 1; k < threads; k++)
        started[k] = pthread_create(&tids[k], NULL, range_thread, &jobs[k]) == 0;
    fn(ctx, jobs[0].begin, jobs[0].end);
    for (int k = 1; k < threads; k++) {
        if (started[k]) pthread_join(tids[k], NULL);
        else fn(ctx, jobs[k].begin, jobs[k].end);
    }
}

/* ---- the pool: workers created once, on first need, and kept ------------
 * One call at a time owns the pool (g_pool_call); a call that finds it
 * taken (another thread's call, or a nested call from inside fn) starts
 * one-shot threads instead, so nothing can deadlock. Worker k runs chunk k
 * of the call's range, the caller chunk 0: the same split as before. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    int nworkers;          /* workers started (ids 1..nworkers)           */
    uint64_t gen;          /* bumped for each call                         */
    xent_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;             /* chunks of this call (caller + parts-1)      */
    int remaining;         /* worker chunks not finished                  */
    uint64_t start_gen[257]; /* gen when worker k was started            */
} g_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
            0, 0, NULL, NULL, 0, 0, 0, {0}};
static pthread_mutex_t g_pool_call = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

static void *pool_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&g_pool.mu);
    uint64_t seen = g_pool.start_gen[id]; /* a call may already wait on it */
    for (;;) {
        while (g_pool.gen == seen) pthread_cond_wait(&g_pool.wake, &g_pool.mu);
        seen = g_pool.gen;
        if (id >= g_pool.parts) continue;
        xent_range_fn fn = g_pool.fn;
        void *ctx = g_pool.ctx;
        int64_t n = g_pool.n;
        int parts = g_pool.parts;
        pthread_mutex_unlock(&g_pool.mu);
        fn(ctx, n * id / parts, n * (id + 1) / parts);
        pthread_mutex_lock(&g_pool.mu);
        if (--g_pool.remaining == 0) pthread_cond_signal(&g_pool.done);
    }
    return NULL;
}

/* In a forked child only the forking thread exists: start afresh. */
static void pool_atfork_child(void) {
    pthread_mutex_init(&g_pool.mu, NULL);
    pthread_cond_init(&g_pool.wake, NULL);
    pthread_cond_init(&g_pool.done, NULL);
    pthread_mutex_init(&g_pool_call, NULL);
    g_pool.nworkers = 0;
    g_pool.remaining = 0;
}

static void pool_init_once(void) { pthread_atfork(NULL, NULL, pool_atfork_child); }

void xent_parallel_for(int64_t n, int threads, xent_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (threads > n) threads = (int)n;
    if (threads > 256) threads = 256;
    if (threads <= 1) { fn(ctx, 0, n); return; }
    pthread_once(&g_pool_once, pool_init_once);
    if (pthread_mutex_trylock(&g_pool_call) != 0) {
        parallel_spawn(n, threads, fn, ctx);
        return;
    }
    pthread_mutex_lock(&g_pool.mu);
    while (g_pool.nworkers < threads - 1) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        g_pool.start_gen[g_pool.nworkers + 1] = g_pool.gen;
        int rc = pthread_create(&t, &at, pool_worker, (void *)(intptr_t)(g_pool.nworkers + 1));
        pthread_attr_destroy(&at);
        if (rc != 0) break;
        g_pool.nworkers++;
    }
    int parts = threads <= g_pool.nworkers + 1 ? threads : g_pool.nworkers + 1;
    if (parts != threads) { /* could not start them all: keep the split */
        pthread_mutex_unlock(&g_pool.mu);
        pthread_mutex_unlock(&g_pool_call);
        parallel_spawn(n, threads, fn, ctx);
        return;
    }
    g_pool.fn = fn;
    g_pool.ctx = ctx;
    g_pool.n = n;
    g_pool.parts = parts;
    g_pool.remaining = parts - 1;
    g_pool.gen++;
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.mu);
    fn(ctx, 0, n / parts);
    pthread_mutex_lock(&g_pool.mu);
    while (g_pool.remaining > 0) pthread_cond_wait(&g_pool.done, &g_pool.mu);
    pthread_mutex_unlock(&g_pool.mu);
    pthread_mutex_unlock(&g_pool_call);
}

/* ABI introspection: struct sizes and field offsets by name, so that
 * bindings (python/xent) can check their mirrors of the public structs. */
#define XENT__ABI_S(t) {#t, sizeof(t)}
#define XENT__ABI_F(t, f) {#t "." #f, offsetof(t, f)}
size_t xent_abi_sizeof(const char *name) {
    static const struct { const char *name; size_t v; } tab[] = {
        XENT__ABI_S(xent_ce_opts), XENT__ABI_S(xent_ce_input),
        XENT__ABI_S(xent_ce_stats), XENT__ABI_S(xent_ce_output),
        XENT__ABI_S(xent_ce_partial), XENT__ABI_S(xent_ce_output_f64),
        XENT__ABI_F(xent_ce_output_f64, loss), XENT__ABI_F(xent_ce_output_f64, nll),
        XENT__ABI_F(xent_ce_output_f64, logprob), XENT__ABI_F(xent_ce_output_f64, lse),
        XENT__ABI_F(xent_ce_output_f64, entropy), XENT__ABI_F(xent_ce_output_f64, stats),
        XENT__ABI_F(xent_ce_output_f64, grad), XENT__ABI_F(xent_ce_output_f64, ld_grad),
        XENT__ABI_F(xent_ce_output_f64, n_counted), XENT__ABI_F(xent_ce_output_f64, n_nonfinite),
        XENT__ABI_F(xent_ce_opts, ignore_index), XENT__ABI_F(xent_ce_opts, reduction),
        XENT__ABI_F(xent_ce_opts, normalizer), XENT__ABI_F(xent_ce_opts, temperature),
        XENT__ABI_F(xent_ce_opts, softcap), XENT__ABI_F(xent_ce_opts, z_loss),
        XENT__ABI_F(xent_ce_opts, label_smoothing), XENT__ABI_F(xent_ce_opts, grad_scale),
        XENT__ABI_F(xent_ce_opts, vocab_start), XENT__ABI_F(xent_ce_opts, vocab_total),
        XENT__ABI_F(xent_ce_opts, threads),
        XENT__ABI_F(xent_ce_input, logits), XENT__ABI_F(xent_ce_input, dtype),
        XENT__ABI_F(xent_ce_input, T), XENT__ABI_F(xent_ce_input, V),
        XENT__ABI_F(xent_ce_input, ld), XENT__ABI_F(xent_ce_input, labels),
        XENT__ABI_F(xent_ce_input, label_dtype), XENT__ABI_F(xent_ce_input, grad_rows),
        XENT__ABI_F(xent_ce_stats, lse), XENT__ABI_F(xent_ce_stats, nll),
        XENT__ABI_F(xent_ce_output, loss), XENT__ABI_F(xent_ce_output, nll),
        XENT__ABI_F(xent_ce_output, logprob), XENT__ABI_F(xent_ce_output, lse),
        XENT__ABI_F(xent_ce_output, entropy), XENT__ABI_F(xent_ce_output, stats),
        XENT__ABI_F(xent_ce_output, grad), XENT__ABI_F(xent_ce_output, grad_dtype),
        XENT__ABI_F(xent_ce_output, ld_grad), XENT__ABI_F(xent_ce_output, n_counted),
        XENT__ABI_F(xent_ce_output, n_nonfinite),
        XENT__ABI_F(xent_ce_partial, max), XENT__ABI_F(xent_ce_partial, sum),
        XENT__ABI_F(xent_ce_partial, sumx), XENT__ABI_F(xent_ce_partial, zsum),
        XENT__ABI_F(xent_ce_partial, target), XENT__ABI_F(xent_ce_partial, flags),
        /* fused LM head (include/xent/cuda.h) */
        XENT__ABI_S(xent_linear_input), XENT__ABI_F(xent_linear_input, hidden),
        XENT__ABI_F(xent_linear_input, weight), XENT__ABI_F(xent_linear_input, bias),
        XENT__ABI_F(xent_linear_input, dtype), XENT__ABI_F(xent_linear_input, T),
        XENT__ABI_F(xent_linear_input, H), XENT__ABI_F(xent_linear_input, V),
        XENT__ABI_F(xent_linear_input, labels), XENT__ABI_F(xent_linear_input, label_dtype),
        XENT__ABI_F(xent_linear_input, grad_rows),
        XENT__ABI_S(xent_linear_grads), XENT__ABI_F(xent_linear_grads, hidden),
        XENT__ABI_F(xent_linear_grads, hidden_dtype), XENT__ABI_F(xent_linear_grads, weight),
        XENT__ABI_F(xent_linear_grads, weight_dtype), XENT__ABI_F(xent_linear_grads, bias),
        XENT__ABI_F(xent_linear_grads, bias_dtype), XENT__ABI_F(xent_linear_grads, accumulate),
        /* RL (include/xent/rl.h) */
        XENT__ABI_S(xent_rl_adv_opts), XENT__ABI_F(xent_rl_adv_opts, std),
        XENT__ABI_F(xent_rl_adv_opts, eps),
        XENT__ABI_F(xent_rl_adv_opts, subtract_mean),
        XENT__ABI_S(xent_rl_groups), XENT__ABI_F(xent_rl_groups, n),
        XENT__ABI_F(xent_rl_groups, ngroups), XENT__ABI_F(xent_rl_groups, offsets),
        XENT__ABI_F(xent_rl_groups, ids),
        XENT__ABI_S(xent_rl_adv_stats), XENT__ABI_F(xent_rl_adv_stats, n_groups),
        XENT__ABI_F(xent_rl_adv_stats, n_zero_var),
        XENT__ABI_F(xent_rl_adv_stats, n_singleton),
        XENT__ABI_F(xent_rl_adv_stats, n_empty),
        XENT__ABI_S(xent_rl_batch_opts), XENT__ABI_F(xent_rl_batch_opts, kind),
        XENT__ABI_F(xent_rl_batch_opts, std),
        XENT__ABI_F(xent_rl_batch_opts, subtract_mean),
        XENT__ABI_F(xent_rl_batch_opts, eps),
        XENT__ABI_S(xent_rl_batch_stats),
        XENT__ABI_F(xent_rl_batch_stats, n_counted),
        XENT__ABI_F(xent_rl_batch_stats, mean),
        XENT__ABI_F(xent_rl_batch_stats, scale),
        XENT__ABI_F(xent_rl_batch_stats, degenerate),
        XENT__ABI_S(xent_rl_loss_opts), XENT__ABI_F(xent_rl_loss_opts, loss),
        XENT__ABI_F(xent_rl_loss_opts, eps_low),
        XENT__ABI_F(xent_rl_loss_opts, eps_high),
        XENT__ABI_F(xent_rl_loss_opts, dual_clip),
        XENT__ABI_F(xent_rl_loss_opts, log_ratio_clamp),
        XENT__ABI_F(xent_rl_loss_opts, agg),
        XENT__ABI_F(xent_rl_loss_opts, token_norm),
        XENT__ABI_F(xent_rl_loss_opts, seq_norm),
        XENT__ABI_F(xent_rl_loss_opts, tis),
        XENT__ABI_F(xent_rl_loss_opts, tis_mode),
        XENT__ABI_F(xent_rl_loss_opts, tis_cap), XENT__ABI_F(xent_rl_loss_opts, kl),
        XENT__ABI_F(xent_rl_loss_opts, kl_coef),
        XENT__ABI_F(xent_rl_loss_opts, zero_run_limit),
        XENT__ABI_S(xent_rl_input), XENT__ABI_F(xent_rl_input, T),
        XENT__ABI_F(xent_rl_input, nseq), XENT__ABI_F(xent_rl_input, offsets),
        XENT__ABI_F(xent_rl_input, lp_new), XENT__ABI_F(xent_rl_input, lp_old),
        XENT__ABI_F(xent_rl_input, lp_sampler), XENT__ABI_F(xent_rl_input, lp_ref),
        XENT__ABI_F(xent_rl_input, advantages),
        XENT__ABI_F(xent_rl_input, adv_layout), XENT__ABI_F(xent_rl_input, mask),
        XENT__ABI_S(xent_rl_loss_stats), XENT__ABI_F(xent_rl_loss_stats, loss),
        XENT__ABI_F(xent_rl_loss_stats, n_tokens),
        XENT__ABI_F(xent_rl_loss_stats, n_seqs),
        XENT__ABI_F(xent_rl_loss_stats, n_clamped),
        XENT__ABI_F(xent_rl_loss_stats, n_clip_low),
        XENT__ABI_F(xent_rl_loss_stats, n_clip_high),
        XENT__ABI_F(xent_rl_loss_stats, n_dual_clip),
        XENT__ABI_F(xent_rl_loss_stats, n_tis_clamped),
        XENT__ABI_F(xent_rl_loss_stats, n_tis_truncated),
        XENT__ABI_F(xent_rl_loss_stats, n_tis_masked),
        XENT__ABI_F(xent_rl_loss_stats, n_kl_clamped),
        XENT__ABI_F(xent_rl_loss_stats, kl_mean),
        XENT__ABI_S(xent_rl_diag), XENT__ABI_F(xent_rl_diag, n_tokens),
        XENT__ABI_F(xent_rl_diag, clip_frac_low),
        XENT__ABI_F(xent_rl_diag, clip_frac_high),
        XENT__ABI_F(xent_rl_diag, ratio_min), XENT__ABI_F(xent_rl_diag, ratio_mean),
        XENT__ABI_F(xent_rl_diag, ratio_max),
        XENT__ABI_F(xent_rl_diag, ratio_frac_out),
        XENT__ABI_F(xent_rl_diag, n_ratio_clamped),
        XENT__ABI_F(xent_rl_diag, has_weights), XENT__ABI_F(xent_rl_diag, ess_frac),
        XENT__ABI_F(xent_rl_diag, chi2), XENT__ABI_F(xent_rl_diag, mismatch_kl_k1),
        XENT__ABI_F(xent_rl_diag, mismatch_kl_k3),
        XENT__ABI_F(xent_rl_diag, weight_max),
        XENT__ABI_F(xent_rl_diag, n_weight_clamped),
        XENT__ABI_S(xent_rl_lp_report), XENT__ABI_F(xent_rl_lp_report, n_checked),
        XENT__ABI_F(xent_rl_lp_report, n_nan),
        XENT__ABI_F(xent_rl_lp_report, first_nan),
        XENT__ABI_F(xent_rl_lp_report, n_positive),
        XENT__ABI_F(xent_rl_lp_report, first_positive),
        XENT__ABI_F(xent_rl_lp_report, n_neg_inf),
        XENT__ABI_F(xent_rl_lp_report, first_neg_inf),
        XENT__ABI_F(xent_rl_lp_report, n_zero_runs),
        XENT__ABI_F(xent_rl_lp_report, first_zero_run),
        XENT__ABI_F(xent_rl_lp_report, longest_zero_run),
    };
    if (!name) return (size_t)-1;
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(name, tab[i].name)) return tab[i].v;
    return (size_t)-1;
}
