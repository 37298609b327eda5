/* tests/harness.h: a small test runner.
 *
 *   TEST(name) { ... CHECK(cond, "fmt", ...); ... }
 *
 * Tests register themselves (one TEST per case, in any tests/ C file) and
 * are run by tests/main.c in file order. A test passes when none of its
 * CHECKs failed; xt_skip("why") marks it skipped. Random inputs come from
 * xt_rng(), seeded from the run's seed (printed at the start; set it with
 * --seed N or XENT_TEST_SEED) mixed with the test's name, so one test can be
 * re-run alone with the same inputs. The runner's last line is
 * "N passed, N failed, N skipped". */
#ifndef XENT_TEST_HARNESS_H
#define XENT_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*xt_fn)(void);
void xt_register(const char *name, xt_fn fn, const char *file);
void xt_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void xt_skip(const char *why);
int xt_failed(void);          /* CHECKs failed so far in this test          */
uint64_t xt_seed(void);       /* this test's seed                           */
int xt_sanitizer(void);       /* 1 under the ASan/UBSan build (go smaller)  */
/* Path of the xent binary next to the test binary, or NULL if not built. */
const char *xt_xent_bin(void);
/* The default model (`make model`): $XENT_MODEL_GGUF, else
 * $XENT_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf, else the same under
 * ~/.cache/xent; NULL when that file is not readable. */
const char *xt_default_model(void);

/* xoshiro256** seeded per test. */
typedef struct { uint64_t s[4]; } xt_rng_t;
xt_rng_t *xt_rng(void);
uint64_t xt_next(xt_rng_t *r);
double xt_uniform(xt_rng_t *r);             /* [0, 1)                      */
double xt_normal(xt_rng_t *r);              /* N(0, 1)                     */
int64_t xt_randint(xt_rng_t *r, int64_t n); /* [0, n)                      */

/* Fills n bytes with a pattern that is NaN for f32/f16/bf16/f64 alike
 * (0xFF bytes), so an output element a call did not write shows as NaN. */
void xt_poison(void *p, size_t n);

/* Distance in units in the last place between two floats of the same sign
 * region, by bit patterns (NaN -> huge; -0 and +0 are 0 apart). */
double xt_ulp_dist_f32(float a, float b);

#define TEST(name)                                                        \
    static void name(void);                                               \
    __attribute__((constructor)) static void xt_reg_##name(void) {        \
        xt_register(#name, name, __FILE__);                               \
    }                                                                     \
    static void name(void)

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) xt_fail_at(__FILE__, __LINE__, __VA_ARGS__);         \
    } while (0)

/* Stop the current test after too many failures to keep logs short. */
#define CHECK_LIMIT(n) do { if (xt_failed() >= (n)) return; } while (0)

#endif
