/* tests/main.c: the runner for every TEST registered in tests/ files. */
#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define XT_MAX_TESTS 4096
#define XT_MAX_FAIL_LINES 20

typedef struct { const char *name; xt_fn fn; const char *file; } xt_case;
static xt_case g_cases[XT_MAX_TESTS];
static int g_ncases;
static int g_failed_checks;
static int g_skipped;
static uint64_t g_run_seed, g_test_seed;
static xt_rng_t g_rng;

void xt_register(const char *name, xt_fn fn, const char *file) {
    if (g_ncases < XT_MAX_TESTS) g_cases[g_ncases++] = (xt_case){name, fn, file};
}

void xt_fail_at(const char *file, int line, const char *fmt, ...) {
    g_failed_checks++;
    if (g_failed_checks > XT_MAX_FAIL_LINES) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "    %s:%d: ", file, line);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

void xt_skip(const char *why) {
    g_skipped = 1;
    printf("    skipped: %s\n", why);
}

int xt_failed(void) { return g_failed_checks; }
uint64_t xt_seed(void) { return g_test_seed; }
int xt_sanitizer(void) {
    const char *s = getenv("XENT_SANITIZER");
    return s && *s && strcmp(s, "0") != 0;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t xt_next(xt_rng_t *r) {
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}

double xt_uniform(xt_rng_t *r) { return (double)(xt_next(r) >> 11) * 0x1.0p-53; }

double xt_normal(xt_rng_t *r) {
    double u1 = xt_uniform(r), u2 = xt_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t xt_randint(xt_rng_t *r, int64_t n) {
    return n <= 0 ? 0 : (int64_t)(xt_next(r) % (uint64_t)n);
}

xt_rng_t *xt_rng(void) { return &g_rng; }

const char *xt_xent_bin(void) {
    static char buf[1024];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 8);
    if (n <= 0) return NULL;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) return NULL;
    strcpy(slash + 1, "xent");
    return access(buf, X_OK) == 0 ? buf : NULL;
}

const char *xt_default_model(void) {
    static char buf[1024];
    const char *env = getenv("XENT_MODEL_GGUF"), *cache = getenv("XENT_CACHE"),
               *home = getenv("HOME");
    const char *name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (env && *env) snprintf(buf, sizeof buf, "%s", env);
    else if (cache && *cache) snprintf(buf, sizeof buf, "%s/%s", cache, name);
    else snprintf(buf, sizeof buf, "%s/.cache/xent/%s", home ? home : ".", name);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

void xt_poison(void *p, size_t n) { if (p) memset(p, 0xFF, n); }

double xt_ulp_dist_f32(float a, float b) {
    if (isnan(a) || isnan(b)) return (isnan(a) && isnan(b)) ? 0 : 1e30;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    /* map to a monotone integer line: negative floats below positive ones */
    int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia;
    int64_t lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return (double)llabs(la - lb);
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void usage(const char *argv0) {
    printf("usage: %s [--seed N] [--list] [FILTER...]\n"
           "  --seed N   run seed (default: XENT_TEST_SEED, else from the clock)\n"
           "  --list     list the tests and exit\n"
           "  FILTER     run only tests whose name contains one of these\n",
           argv0);
}

int main(int argc, char **argv) {
    const char *env = getenv("XENT_TEST_SEED");
    g_run_seed = env ? strtoull(env, NULL, 0) : 0;
    int list = 0, nfilters = 0;
    const char *filters[1024];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_run_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(argv[0]); return 0; }
        else if (nfilters < 1024) filters[nfilters++] = argv[i];
        else { fprintf(stderr, "more than 1024 filters\n"); return 2; }
    }
    if (!env && g_run_seed == 0) {
        uint64_t x = (uint64_t)time(NULL);
        g_run_seed = splitmix(&x) & 0xFFFFFFFFull;
    }
    if (list) {
        for (int i = 0; i < g_ncases; i++) printf("%s\n", g_cases[i].name);
        return 0;
    }
    printf("xent tests: seed %llu (re-run with --seed %llu)\n",
           (unsigned long long)g_run_seed, (unsigned long long)g_run_seed);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < g_ncases; i++) {
        const xt_case *c = &g_cases[i];
        if (nfilters) {
            int hit = 0;
            for (int f = 0; f < nfilters; f++) hit |= strstr(c->name, filters[f]) != NULL;
            if (!hit) continue;
        }
        g_failed_checks = 0;
        g_skipped = 0;
        uint64_t x = g_run_seed ^ hash_name(c->name);
        g_test_seed = x;
        for (int k = 0; k < 4; k++) g_rng.s[k] = splitmix(&x);
        printf("  %-48s ...\n", c->name);
        fflush(stdout);
        c->fn();
        if (g_failed_checks) {
            printf("FAIL %s (%d checks failed) [%s]\n", c->name, g_failed_checks, c->file);
            failed++;
        } else if (g_skipped) {
            printf("skip %s\n", c->name);
            skipped++;
        } else {
            printf("ok   %s\n", c->name);
            passed++;
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
