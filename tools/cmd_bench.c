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
} bench_args;

static void usage(FILE *f) {
    fprintf(f,
        "usage: xent bench [options]\n"
        "  Times xent_ce forward+backward (reduction mean) and the forward-only\n"
        "  xent_logprobs on the CPU, next to the floor: one read of the logits and\n"
        "  one write of the gradient at the copy bandwidth measured in this run\n"
        "  (forward only: one read at the read bandwidth), per thread count.\n\n"
        "options:\n"
        "  --T N              rows (tokens) (default 2048)\n"
        "  --V N              vocabulary (default 128256)\n"
        "  --reps N           timed runs per case, the median is shown (default 5)\n"
        "  --threads LIST     comma-separated thread counts (default 1,2)\n"
        "  --dtype T          logits dtype: bf16, f16, f32 (default bf16)\n"
        "  --grad-dtype T     gradient dtype: bf16, f16, f32 (default bf16)\n"
        "  --ignore-frac F    fraction of labels set to ignore_index -100 (default 0.05)\n"
        "  --bw-mib N         size of each bandwidth buffer in MiB (default 1024)\n"
        "  --seed N           seed of the logits and labels (default 1)\n"
        "  -h, --help         this help\n");
}

static int parse_float_dtype(const char *flag, const char *v, xent_dtype *out) {
    if (xent_dtype_parse(v, out) != XENT_OK ||
        (*out != XENT_F32 && *out != XENT_BF16 && *out != XENT_F16)) {
        fprintf(stderr, "xent: %s expects bf16, f16 or f32, got '%s'\n", flag, v);
        return 1;
    }
    return 0;
}

static int parse_threads(const char *v, bench_args *a) {
    char *buf = strdup(v), *save = NULL;
    int rc = 0;
    a->nthreads = 0;
    for (char *tok = buf ? strtok_r(buf, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t n;
        if (xent_cli_parse_i64("--threads", tok, &n)) { rc = 1; break; }
        if (n < 1 || n > 256 || a->nthreads >= MAX_THREADS) {
            fprintf(stderr, "xent: --threads values must be in [1, 256] (at most %d values)\n", MAX_THREADS);
            rc = 1;
            break;
        }
        a->threads[a->nthreads++] = (int)n;
    }
    free(buf);
    if (!rc && a->nthreads == 0) { fprintf(stderr, "xent: --threads is empty\n"); rc = 1; }
    return rc;
}

static int known_flag(const char *f) {
    static const char *const k[] = {"--T", "--V", "--reps", "--bw-mib", "--seed", "--ignore-frac", "--threads", "--dtype", "--grad-dtype"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(f, k[i])) return 1;
    return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    const char *v;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return -1; }
        if (!known_flag(f)) {
            fprintf(stderr, "xent: %s: unknown flag '%s' (see xent %s --help)\n", argv[0], f, argv[0]);
            return 2;
        }
        if (!(v = xent_cli_value(argc, argv, &i))) return 2;
        int bad;
        if (!strcmp(f, "--T")) bad = xent_cli_parse_i64(f, v, &a->T);
        else if (!strcmp(f, "--V")) bad = xent_cli_parse_i64(f, v, &a->V);
        else if (!strcmp(f, "--reps")) bad = xent_cli_parse_i64(f, v, &a->reps);
        else if (!strcmp(f, "--bw-mib")) bad = xent_cli_parse_i64(f, v, &a->bw_mib);
        else if (!strcmp(f, "--seed")) bad = xent_cli_parse_i64(f, v, &a->seed);
        else if (!strcmp(f, "--ignore-frac")) bad = xent_cli_parse_f64(f, v, &a->ignore_frac);
        else if (!strcmp(f, "--threads")) bad = parse_threads(v, a);
        else if (!strcmp(f, "--dtype")) bad = parse_float_dtype(f, v, &a->dtype);
        else if (!strcmp(f, "--grad-dtype")) bad = parse_float_dtype(f, v, &a->grad_dtype);
        else {
            fprintf(stderr, "xent: bench: unknown flag '%s' (see xent bench --help)\n", f);
            return 2;
        }
        if (bad) return 2;
    }
    if (a->T < 1 || a->V < 1 || a->reps < 1 || a->reps > 1000 || a->bw_mib < 1 ||
        !(a->ignore_frac >= 0 && a->ignore_frac <= 1)) {
        fprintf(stderr, "xent: need --T, --V >= 1, --reps in [1, 1000], --bw-mib >= 1, "
                        "--ignore-frac in [0, 1]\n");
        return 2;
    }
    return 0;
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
        fprintf(stderr, "xent: bench: %s: %s\n", xent_strerror(s), xent_last_error());
        return -1;
    }
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
    bench_args a = {2048, 128256, 5, 1024, 1, 0.05, XENT_BF16, XENT_BF16, {1, 2}, 2};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;

    bandwidth bw[MAX_THREADS];
    if (measure_bandwidth(&a, bw)) { fprintf(stderr, "xent: bench: out of memory\n"); return 1; }

    size_t n = (size_t)a.T * (size_t)a.V;
    size_t esz = xent_dtype_size(a.dtype), gsz = xent_dtype_size(a.grad_dtype);
    void *logits = malloc(n * esz);                          /* [T, V] */
    void *grad = malloc(n * gsz);                            /* [T, V] */
    int64_t *labels = malloc((size_t)a.T * sizeof *labels); /* [T] */
    float *logprob = malloc((size_t)a.T * sizeof *logprob); /* [T] */
    kernel_times kt[MAX_THREADS];
    rc = 1;
    if (!logits || !grad || !labels || !logprob) {
        fprintf(stderr, "xent: bench: cannot allocate %.2f GB\n", (double)n * (double)(esz + gsz) / 1e9);
        goto done;
    }
    fill_inputs(&a, logits, labels);
    memset(grad, 0, n * gsz); /* fault the pages in */
    for (int i = 0; i < a.nthreads; i++)
        if (time_kernels(&a, logits, labels, grad, logprob, a.threads[i], &kt[i])) goto done;

    printf("xent bench: T = %lld, V = %lld, %s logits, %s grad, reduction mean, %.0f%% ignored,\n"
           "median of %lld runs; bandwidth over %lld MiB buffers (GB = 1e9 bytes)\n",
           (long long)a.T, (long long)a.V, xent_dtype_name(a.dtype), xent_dtype_name(a.grad_dtype),
           100.0 * a.ignore_frac, (long long)a.reps, (long long)a.bw_mib);
    for (int i = 0; i < a.nthreads; i++)
        printf("  %d thread%s: copy %.2f GB/s (read + write), read %.2f GB/s; by CPU time: "
               "%.2f, %.2f\n", a.threads[i], a.threads[i] > 1 ? "s" : "", bw[i].copy / 1e9,
               bw[i].read / 1e9, bw[i].copy_cpu / 1e9, bw[i].read_cpu / 1e9);
    printf("floor: one read of the logits (+ one write of the gradient) at that bandwidth;\n"
           "right of '|': the same from CPU time per thread (what a busy machine hides)\n");
    printf("%-20s %3s %9s %6s %8s %6s | %8s %8s %6s\n", "path", "thr", "time ms", "GB/s",
           "floor ms", "floor", "cpu ms", "floor ms", "floor");
    double bytes_ce = (double)n * (double)(esz + gsz), bytes_lp = (double)n * (double)esz;
    for (int i = 0; i < a.nthreads; i++)
        print_row("fwd+bwd (xent_ce)", a.threads[i], kt[i].ce, bytes_ce, bw[i].copy, bw[i].copy_cpu);
    for (int i = 0; i < a.nthreads; i++)
        print_row("fwd only (logprobs)", a.threads[i], kt[i].lp, bytes_lp, bw[i].read, bw[i].read_cpu);
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
