/* tools/cmd_bench.c: `xent bench`, the CPU speed of xent_ce next to the
 * memory floor measured in the same run.
 *
 * The floor of forward+backward is one read of the logits plus one write of
 * the gradient (4 T V bytes for bf16 in and out) at the copy bandwidth
 * (read + write, memcpy over buffers much larger than the last-level cache);
 * the floor of the forward-only log-probabilities is one read of the logits
 * at the read bandwidth. Both bandwidths are measured with the same thread
 * count as the kernel. Times are medians of --reps runs after one warm-up. */
#include "cli.h"
#include "xent.h"
#include "../bench/plain_ce.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <math.h>

#define MAX_THREADS 64

typedef struct {
    int64_t T, V, reps, bw_mib, seed;
    double ignore_frac;
    xent_dtype dtype, grad_dtype;
    int threads[MAX_THREADS];
    int nthreads;
    int isa; /* xent_isa to force (XENT_ISA_AUTO: the library's choice) */
} bench_args;

static const char k_about[] =
    "Times xent_ce forward+backward (reduction mean) and the forward-only\n"
    "xent_logprobs on the CPU, next to the floor: one read of the logits and\n"
    "one write of the gradient at the copy bandwidth measured in this run\n"
    "(forward only: one read at the read bandwidth), per thread count.\n\n";

static const char *const k_dtypes[] = {"bf16", "f16", "f32", NULL};
static const char *const k_isas[] = {"auto", "baseline", "avx2", "avx512", NULL};

static int parse_threads(void *dst, const char *v, const char *flag, const char *cmd) {
    bench_args *a = dst;
    double t[MAX_THREADS];
    int n;
    if (xf_parse_f64_list(cmd, flag, v, t, MAX_THREADS, &n)) return 2;
    if (n == 0) {
        fprintf(stderr, "xent %s: %s expects thread counts, got '%s'\n", cmd, flag, v);
        return 2;
    }
    for (int k = 0; k < n; k++) {
        if (t[k] != (double)(int)t[k] || t[k] < 1 || t[k] > 256) {
            fprintf(stderr, "xent %s: %s expects integers in [1, 256], got '%s'\n", cmd, flag, v);
            return 2;
        }
        a->threads[k] = (int)t[k];
    }
    a->nthreads = n;
    return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    static xf_flag fl[16];
    xf_flag t[] = {
        {"--T", XF_INT, &a->T, NULL, "rows (tokens)", NULL, XF_MIN, 1, 0, NULL, NULL, NULL, NULL, 0},
        {"--V", XF_INT, &a->V, NULL, "vocabulary", NULL, XF_MIN, 1, 0, NULL, NULL, NULL, NULL, 0},
        {"--reps", XF_INT, &a->reps, NULL, "timed runs per case, the median is shown", NULL,
         XF_MIN | XF_MAX, 1, 1000, NULL, NULL, NULL, NULL, 0},
        {"--threads", XF_FUNC, a, "LIST", "comma-separated thread counts", "1,2", 0, 0, 0, NULL,
         NULL, parse_threads, NULL, 0},
        {"--dtype", XF_DTYPE, &a->dtype, NULL, "logits dtype", NULL, 0, 0, 0, k_dtypes, NULL, NULL,
         NULL, 0},
        {"--grad-dtype", XF_DTYPE, &a->grad_dtype, NULL, "gradient dtype", NULL, 0, 0, 0,
         k_dtypes, NULL, NULL, NULL, 0},
        {"--ignore-frac", XF_FLOAT, &a->ignore_frac, "F",
         "fraction of labels set to ignore_index -100", NULL, XF_MIN | XF_MAX, 0, 1, NULL, NULL,
         NULL, NULL, 0},
        {"--bw-mib", XF_INT, &a->bw_mib, NULL, "size of each bandwidth buffer in MiB", NULL,
         XF_MIN | XF_MAX, 1, 1 << 20, NULL, NULL, NULL, NULL, 0},
        {"--seed", XF_INT, &a->seed, NULL, "seed of the logits and labels", NULL, 0, 0, 0, NULL,
         NULL, NULL, NULL, 0},
        {"--isa", XF_ENUM, &a->isa, NULL, "CPU path of the kernels (xent_cpu_set_isa)", NULL, 0,
         0, 0, k_isas, NULL, NULL, NULL, 0},
    };
    memcpy(fl, t, sizeof t);
    xf_cmd c = {"bench", "xent bench [options]", k_about, NULL, fl, (int)(sizeof t / sizeof t[0]),
                0, NULL, 0, 0, NULL, 0};
    return xf_parse(&c, argc, argv);
}

/* ---- timing helpers ------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (all threads). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A run's wall time and its CPU time per thread: on a busy machine the
 * second is what the run costs when it is not waiting for a core. */
typedef struct { double wall, cpu; } run_time;

static run_time median_run(run_time *v, int64_t n) {
    double *w = malloc((size_t)n * 2 * sizeof *w); /* [2n] */
    run_time r = {NAN, NAN};
    if (!w) return r;
    for (int64_t i = 0; i < n; i++) { w[i] = v[i].wall; w[n + i] = v[i].cpu; }
    r.wall = median(w, n);
    r.cpu = median(w + n, n);
    free(w);
    return r;
}

/* ---- memory bandwidth ---------------------------------------------------- */

typedef struct {
    const unsigned char *src;
    unsigned char *dst; /* NULL: read only */
    size_t n;
    uint64_t sum;
} bw_job;

static void *bw_thread(void *arg) {
    bw_job *j = arg;
    if (j->dst) {
        memcpy(j->dst, j->src, j->n);
    } else {
        const uint64_t *p = (const uint64_t *)j->src; /* [n / 8] */
        size_t m = j->n / 8;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= m; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        j->sum = s0 ^ s1 ^ s2 ^ s3;
    }
    return NULL;
}

/* One pass over n bytes (copy when dst != NULL) on `th` threads. */
static run_time bw_pass(const unsigned char *src, unsigned char *dst, size_t n, int th,
                      uint64_t *sink) {
    bw_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    size_t chunk = (n / (size_t)th) & ~(size_t)4095;
    for (int k = 0; k < th; k++) {
        size_t off = chunk * (size_t)k;
        jobs[k] = (bw_job){src + off, dst ? dst + off : NULL, k + 1 == th ? n - off : chunk, 0};
    }
    double t0 = now_s(), c0 = cpu_s();
    for (int k = 1; k < th; k++) started[k] = pthread_create(&tid[k], NULL, bw_thread, &jobs[k]) == 0;
    bw_thread(&jobs[0]);
    for (int k = 1; k < th; k++) {
        if (started[k]) pthread_join(tid[k], NULL);
        else bw_thread(&jobs[k]);
    }
    run_time t = {now_s() - t0, (cpu_s() - c0) / th};
    for (int k = 0; k < th; k++) *sink ^= jobs[k].sum;
    return t;
}

typedef struct { double copy, read, copy_cpu, read_cpu; } bandwidth; /* bytes/s */

static int measure_bandwidth(const bench_args *a, bandwidth *bw /* [nthreads] */) {
    size_t n = (size_t)a->bw_mib << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    run_time *t = malloc((size_t)a->reps * sizeof *t); /* [reps] */
    if (!src || !dst || !t) { free(src); free(dst); free(t); return -1; }
    memset(src, 1, n); /* fault the pages in before timing */
    memset(dst, 2, n);
    uint64_t sink = 0;
    for (int i = 0; i < a->nthreads; i++) {
        int th = a->threads[i];
        bw_pass(src, dst, n, th, &sink); /* warm-up */
        for (int64_t r = 0; r < a->reps; r++) t[r] = bw_pass(src, dst, n, th, &sink);
        run_time c = median_run(t, a->reps);
        for (int64_t r = 0; r < a->reps; r++) t[r] = bw_pass(src, NULL, n, th, &sink);
        run_time rd = median_run(t, a->reps);
        bw[i] = (bandwidth){2.0 * (double)n / c.wall, (double)n / rd.wall,
                            2.0 * (double)n / c.cpu, (double)n / rd.cpu};
    }
    if (sink == 42) fprintf(stderr, " "); /* keeps the read loop alive */
    free(src);
    free(dst);
    free(t);
    return 0;
}

/* ---- inputs ---------------------------------------------------------------- */

static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Logits: a sum of 4 uniforms, roughly N(0, 4) (the speed does not depend
 * on the values); labels uniform with a fraction set to -100. */
static void fill_inputs(const bench_args *a, void *logits /* [T, V] */,
                        int64_t *labels /* [T] */) {
    uint64_t s = (uint64_t)a->seed;
    size_t n = (size_t)a->T * (size_t)a->V;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_u64(&s);
        float x = (float)((double)((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) +
                                   (r >> 48)) / 65536.0 - 2.0) * 3.5f;
        if (a->dtype == XENT_F32) ((float *)logits)[i] = x;
        else if (a->dtype == XENT_BF16) ((uint16_t *)logits)[i] = xent_f32_to_bf16(x);
        else ((uint16_t *)logits)[i] = xent_f32_to_f16(x);
    }
    for (int64_t r = 0; r < a->T; r++) {
        uint64_t u = next_u64(&s);
        labels[r] = (double)(u >> 11) * 0x1.0p-53 < a->ignore_frac ? -100 : (int64_t)(next_u64(&s) % (uint64_t)a->V);
    }
}

/* ---- kernel timing ----------------------------------------------------------- */

typedef struct {
    run_time ce, lp; /* medians: forward+backward, forward only */
} kernel_times;

static int time_kernels(const bench_args *a, const void *logits, const int64_t *labels,
                        void *grad, float *logprob, int th, kernel_times *kt) {
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    o.reduction = XENT_REDUCE_MEAN;
    o.threads = th;
    xent_ce_input in = {logits, a->dtype, a->T, a->V, 0, labels, XENT_I64, NULL};
    float loss = 0;
    xent_ce_output out;
    memset(&out, 0, sizeof out);
    out.loss = &loss;
    out.grad = grad;
    out.grad_dtype = a->grad_dtype;
    run_time *t = malloc((size_t)a->reps * sizeof *t); /* [reps] */
    if (!t) return -1;
    xent_status s = XENT_OK;
    for (int64_t r = -1; r < a->reps && !s; r++) { /* r = -1: warm-up */
        double t0 = now_s(), c0 = cpu_s();
        s = xent_ce(&in, &o, &out);
        if (r >= 0) t[r] = (run_time){now_s() - t0, (cpu_s() - c0) / th};
    }
    if (!s) kt->ce = median_run(t, a->reps);
    for (int64_t r = -1; r < a->reps && !s; r++) {
        double t0 = now_s(), c0 = cpu_s();
        s = xent_logprobs(&in, &o, logprob, NULL);
        if (r >= 0) t[r] = (run_time){now_s() - t0, (cpu_s() - c0) / th};
    }
    if (!s) kt->lp = median_run(t, a->reps);
    free(t);
    if (s) {
        fprintf(stderr, "xent bench: %s: %s\n", xent_strerror(s), xent_last_error());
        return -1;
    }
    return 0;
}

/* ---- the plain fp32 anchor (bench/plain_ce.h) --------------------------------- */

typedef struct {
    const uint16_t *logits;
    const int64_t *labels;
    uint16_t *grad; /* NULL: forward only */
    int64_t V;
    float scale;
    float *nll;     /* [T] */
} plain_job;

static void plain_rows(void *ctx, int64_t r0, int64_t r1) {
    plain_job *j = ctx;
    for (int64_t r = r0; r < r1; r++)
        j->nll[r] = plain_row_bf16(j->logits + (size_t)r * (size_t)j->V, j->V, j->labels[r],
                                   j->scale, j->grad ? j->grad + (size_t)r * (size_t)j->V : NULL);
}

/* Times the plain anchor like time_kernels (bf16 in and out only). */
static int time_plain(const bench_args *a, const void *logits, const int64_t *labels,
                      void *grad, float *nll, int th, kernel_times *kt) {
    int64_t counted = 0;
    for (int64_t r = 0; r < a->T; r++) counted += labels[r] != -100;
    plain_job j = {logits, labels, grad, a->V, counted ? 1.0f / (float)counted : 0.0f, nll};
    run_time *t = malloc((size_t)a->reps * sizeof *t); /* [reps] */
    if (!t) return -1;
    for (int pass = 0; pass < 2; pass++) {
        j.grad = pass == 0 ? grad : NULL;
        for (int64_t r = -1; r < a->reps; r++) {
            double t0 = now_s(), c0 = cpu_s();
            xent_parallel_for(a->T, th, plain_rows, &j);
            if (r >= 0) t[r] = (run_time){now_s() - t0, (cpu_s() - c0) / th};
        }
        if (pass == 0) kt->ce = median_run(t, a->reps);
        else kt->lp = median_run(t, a->reps);
    }
    free(t);
    return 0;
}

/* Wall-clock columns, then the same from CPU time per thread. */
static void print_row(const char *path, int th, run_time t, double bytes, double bw,
                      double bw_cpu) {
    double floor_s = bytes / bw, floor_c = bytes / bw_cpu;
    printf("%-20s %3d %9.1f %6.2f %8.1f %5.0f%% | %8.1f %8.1f %5.0f%%\n", path, th,
           1e3 * t.wall, bytes / t.wall / 1e9, 1e3 * floor_s, 100.0 * floor_s / t.wall,
           1e3 * t.cpu, 1e3 * floor_c, 100.0 * floor_c / t.cpu);
}

static int cmd_bench(int argc, char **argv) {
    bench_args a = {2048, 128256, 5, 1024, 1, 0.05, XENT_BF16, XENT_BF16, {1, 2}, 2, 0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    if (xent_cpu_set_isa((xent_isa)a.isa) != XENT_OK) {
        fprintf(stderr, "xent bench: --isa %s: %s\n", k_isas[a.isa], xent_last_error());
        return 1;
    }

    bandwidth bw[MAX_THREADS];
    if (measure_bandwidth(&a, bw)) { fprintf(stderr, "xent bench: out of memory\n"); return 1; }

    size_t n = (size_t)a.T * (size_t)a.V;
    size_t esz = xent_dtype_size(a.dtype), gsz = xent_dtype_size(a.grad_dtype);
    void *logits = malloc(n * esz);                          /* [T, V] */
    void *grad = malloc(n * gsz);                            /* [T, V] */
    int64_t *labels = malloc((size_t)a.T * sizeof *labels); /* [T] */
    float *logprob = malloc((size_t)a.T * sizeof *logprob); /* [T] */
    kernel_times kt[MAX_THREADS], kp[MAX_THREADS];
    int plain = a.dtype == XENT_BF16 && a.grad_dtype == XENT_BF16;
    rc = 1;
    if (!logits || !grad || !labels || !logprob) {
        fprintf(stderr, "xent bench: cannot allocate %.2f GB\n", (double)n * (double)(esz + gsz) / 1e9);
        goto done;
    }
    fill_inputs(&a, logits, labels);
    memset(grad, 0, n * gsz); /* fault the pages in */
    for (int i = 0; i < a.nthreads; i++)
        if (time_kernels(&a, logits, labels, grad, logprob, a.threads[i], &kt[i]) ||
            (plain && time_plain(&a, logits, labels, grad, logprob, a.threads[i], &kp[i])))
            goto done;

    printf("xent bench: T = %lld, V = %lld, %s logits, %s grad, reduction mean, %.0f%% ignored,\n"
           "median of %lld runs; bandwidth over %lld MiB buffers (GB = 1e9 bytes)\n",
           (long long)a.T, (long long)a.V, xent_dtype_name(a.dtype), xent_dtype_name(a.grad_dtype),
           100.0 * a.ignore_frac, (long long)a.reps, (long long)a.bw_mib);
    for (int i = 0; i < a.nthreads; i++)
        printf("  %d thread%s: copy %.2f GB/s (read + write), read %.2f GB/s; by CPU time: "
               "%.2f, %.2f\n", a.threads[i], a.threads[i] > 1 ? "s" : "", bw[i].copy / 1e9,
               bw[i].read / 1e9, bw[i].copy_cpu / 1e9, bw[i].read_cpu / 1e9);
    for (int i = 0; i < a.nthreads; i++) /* for bench/torch_anchor.py */
        printf("# bw threads=%d copy=%.6e read=%.6e copy_cpu=%.6e read_cpu=%.6e\n", a.threads[i],
               bw[i].copy, bw[i].read, bw[i].copy_cpu, bw[i].read_cpu);
    xent_isa used = xent_cpu_isa();
    xent_cpu_set_isa(XENT_ISA_AUTO);
    xent_isa best = xent_cpu_isa();
    xent_cpu_set_isa(used);
    printf("xent CPU path: %s (this CPU's best: %s)\n", xent_isa_name(used), xent_isa_name(best));
    printf("floor: one read of the logits (+ one write of the gradient) at that bandwidth;\n"
           "right of '|': the same from CPU time per thread (what a busy machine hides)\n");
    printf("%-20s %3s %9s %6s %8s %6s | %8s %8s %6s\n", "path", "thr", "time ms", "GB/s",
           "floor ms", "floor", "cpu ms", "floor ms", "floor");
    double bytes_ce = (double)n * (double)(esz + gsz), bytes_lp = (double)n * (double)esz;
    for (int i = 0; i < a.nthreads; i++)
        print_row("fwd+bwd (xent_ce)", a.threads[i], kt[i].ce, bytes_ce, bw[i].copy, bw[i].copy_cpu);
    for (int i = 0; i < a.nthreads; i++)
        print_row("fwd only (logprobs)", a.threads[i], kt[i].lp, bytes_lp, bw[i].read, bw[i].read_cpu);
    for (int i = 0; plain && i < a.nthreads; i++)
        print_row("plain fp32 fwd+bwd", a.threads[i], kp[i].ce, bytes_ce, bw[i].copy, bw[i].copy_cpu);
    for (int i = 0; plain && i < a.nthreads; i++)
        print_row("plain fp32 fwd only", a.threads[i], kp[i].lp, bytes_lp, bw[i].read, bw[i].read_cpu);
    if (!plain) printf("(the plain fp32 anchor runs for bf16 logits and gradient only)\n");
    double load[3];
    if (getloadavg(load, 3) == 3)
        printf("load average %.2f (%ld cores): above the core count the wall times are shared\n",
               load[0], sysconf(_SC_NPROCESSORS_ONLN));
    rc = 0;
done:
    free(logits);
    free(grad);
    free(labels);
    free(logprob);
    return rc;
}

XENT_COMMAND(bench, "CPU speed of xent_ce next to the memory floor", cmd_bench)
