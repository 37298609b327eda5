/* tools/cmd_rl.c: `xent rl`: checks and diagnostics of RL log-prob dumps.
 * Reads the new (trainer) log-probs and optionally the old and sampler
 * log-probs, a mask and sequence offsets from .npy/.safetensors, checks each
 * array (NaN, > 0, -inf, zero-filled runs) and prints the ratio and
 * importance-weight diagnostics of xent_rl_diagnostics. */
#include "cli.h"
#include "input.h"
#include "xent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct rl_args {
    const char *path[5]; /* new, old, sampler, mask, offsets */
    int allow_nonfinite;
    xent_rl_loss_opts o;
} rl_args;

enum { A_NEW = 0, A_OLD, A_SMP, A_MASK, A_OFF };
static const char *const g_flag_of[5] = {"--new", "--old", "--sampler", "--mask", "--offsets"};
static xf_flag g_flags[16];
static xf_cmd g_cmd;

static const char k_about[] =
    "Checks RL per-token log-prob arrays and prints the trainer/sampler\n"
    "diagnostics. Log-probs: .npy or .safetensors, f32 (f64 is rounded once to f32,\n"
    "the dtype of the checks and diagnostics; bf16, including the '<V2' .npy of\n"
    "ml_dtypes.bfloat16, and f16 are widened exactly) of shape [T] or [B, S]\n"
    "(each row one sequence unless --offsets is given). The clip range, the clamp\n"
    "and the zero-run length are the ones `xent compare` uses (docs/rl.md, \"CLI\n"
    "defaults\": PPO's symmetric 0.2; DAPO's clip-higher is --eps-high 0.28).\n\n";

static const char k_epilog[] =
    "A failed check, or a non-finite diagnostic without --allow-nonfinite, exits 1.\n";

/* Returns 0 to run, 2 on a usage error, -1 after --help. */
static int parse_args(int argc, char **argv, rl_args *a) {
    memset(a, 0, sizeof *a);
    xent_rl_loss_opts_init(&a->o); /* the defaults `xent compare` shares */
    xf_flag fl[] = {
        {"--new", XF_STRING, &a->path[A_NEW], "FILE[:NAME]", "current policy log-probs", NULL,
         XF_REQUIRED, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--old", XF_STRING, &a->path[A_OLD], "FILE[:NAME]",
         "old policy log-probs: ratio statistics", NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--sampler", XF_STRING, &a->path[A_SMP], "FILE[:NAME]",
         "sampler log-probs: ESS, chi2, mismatch KL", NULL, 0, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--mask", XF_STRING, &a->path[A_MASK], "FILE[:NAME]",
         "u8 0/1 (or i32/i64 0/1) [T] tokens to count", "all", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--offsets", XF_STRING, &a->path[A_OFF], "FILE[:NAME]",
         "i64/i32 [nseq + 1] sequence offsets;\nnone: each row of [B, S] is a sequence, [T] is one",
         "none", 0,
         0, 0, NULL, NULL, NULL, NULL, 0},
        {"--eps-low", XF_FLOAT, &a->o.eps_low, NULL, "lower clip 1 - X for the clip fraction",
         NULL, XF_MIN, 0, 0, NULL, NULL, NULL, "eps_low", 0},
        {"--eps-high", XF_FLOAT, &a->o.eps_high, NULL, "upper clip 1 + X for the clip fraction",
         NULL, XF_MIN, 0, 0, NULL, NULL, NULL, "eps_high", 0},
        {"--clamp", XF_FLOAT, &a->o.log_ratio_clamp, NULL, "log-ratio clamp before exp", NULL,
         XF_MIN | XF_MAX | XF_LO_OPEN, 0, 80, NULL, NULL, NULL, "log_ratio_clamp", 0},
        {"--zero-run", XF_INT, &a->o.zero_run_limit, NULL,
         "a run of N exact-zero log-probs is an error; 0 = off", NULL, XF_MIN, 0, 0, NULL, NULL,
         NULL, "zero_run_limit", 0},
        {"--allow-nonfinite", XF_BOOL, &a->allow_nonfinite, NULL, XENT_CLI_NONFINITE_HELP, NULL,
         0, 0, 0, NULL, NULL, NULL, NULL, 0},
    };
    g_cmd = (xf_cmd){"rl", "xent rl --new FILE[:NAME] [options]", k_about, k_epilog, g_flags,
                     (int)(sizeof fl / sizeof fl[0]), 0, NULL, 0, 0, NULL, 0};
    memcpy(g_flags, fl, sizeof fl);
    return xf_parse(&g_cmd, argc, argv);
}

/* Loads a log-prob tensor as float [T]; *rows / *cols give its 2-D shape. */
static float *load_lp(const char *flag, const char *spec, int64_t *T, int64_t *rows,
                      int64_t *cols) {
    xent_tensor t;
    if (xent_cli_load("rl", flag, spec, &t)) return NULL;
    float *out = NULL;
    int ok_dt = t.dtype == XENT_F32 || t.dtype == XENT_F64 || t.dtype == XENT_BF16 ||
                t.dtype == XENT_F16;
    if (!ok_dt || t.ndim < 1 || t.ndim > 2) {
        fprintf(stderr, "xent rl: %s %s: need f32/f64/bf16/f16 of shape [T] or [B, S], got %s "
                "with %d dimensions\n", flag, spec, xent_dtype_name(t.dtype), t.ndim);
        xent_tensor_free(&t);
        return NULL;
    }
    *T = xent_tensor_numel(&t);
    *rows = t.ndim == 2 ? t.shape[0] : 1;
    *cols = t.ndim == 2 ? t.shape[1] : *T;
    out = malloc((size_t)(*T ? *T : 1) * sizeof(float));
    for (int64_t i = 0; out && i < *T; i++) {
        if (t.dtype == XENT_F32) out[i] = ((const float *)t.data)[i];
        else if (t.dtype == XENT_F64) out[i] = (float)((const double *)t.data)[i];
        else if (t.dtype == XENT_BF16) out[i] = xent_bf16_to_f32(((const uint16_t *)t.data)[i]);
        else out[i] = xent_f16_to_f32(((const uint16_t *)t.data)[i]);
    }
    if (!out) fprintf(stderr, "xent rl: out of memory\n");
    xent_tensor_free(&t);
    return out;
}

/* Loads an integer tensor of exactly n elements as int64 (n < 0: any). */
static int64_t *load_int(const char *flag, const char *spec, int64_t n, int64_t *got) {
    xent_tensor t;
    if (xent_cli_load("rl", flag, spec, &t)) return NULL;
    *got = xent_tensor_numel(&t);
    int ok = t.dtype == XENT_U8 || t.dtype == XENT_I32 || t.dtype == XENT_I64;
    if (!ok || (n >= 0 && *got != n)) {
        fprintf(stderr, "xent rl: %s %s: need u8/i32/i64 with %lld elements, got %s with %lld\n",
                flag, spec, (long long)n, xent_dtype_name(t.dtype), (long long)*got);
        xent_tensor_free(&t);
        return NULL;
    }
    int64_t *out = malloc((size_t)(*got ? *got : 1) * sizeof(int64_t));
    for (int64_t i = 0; out && i < *got; i++)
        out[i] = t.dtype == XENT_U8 ? ((const uint8_t *)t.data)[i]
                 : t.dtype == XENT_I32 ? ((const int32_t *)t.data)[i]
                                       : ((const int64_t *)t.data)[i];
    xent_tensor_free(&t);
    return out;
}

typedef struct rl_data {
    float *lp[3];      /* new, old, sampler: [T] each                        */
    uint8_t *mask;     /* [T] or NULL                                        */
    int64_t *off;      /* [nseq + 1]                                         */
    int64_t T, nseq;
} rl_data;

static void data_free(rl_data *d) {
    for (int k = 0; k < 3; k++) free(d->lp[k]);
    free(d->mask);
    free(d->off);
}

/* Mask [T] as 0/1 bytes; another value is reported by the library check. */
static int load_mask(const char *spec, rl_data *d) {
    int64_t got;
    int64_t *m = load_int("--mask", spec, d->T, &got);
    if (!m) return 1;
    d->mask = malloc((size_t)(d->T ? d->T : 1));
    for (int64_t i = 0; d->mask && i < d->T; i++)
        d->mask[i] = m[i] == 0 ? 0 : (m[i] == 1 ? 1 : 2);
    free(m);
    return d->mask == NULL;
}

static int load_offsets(const char *spec, int64_t rows, int64_t cols, rl_data *d) {
    int64_t got;
    if (spec) {
        if (!(d->off = load_int("--offsets", spec, -1, &got))) return 1;
        if (got < 1) {
            fprintf(stderr, "xent rl: --offsets %s: needs at least one element\n", spec);
            return 1;
        }
        d->nseq = got - 1;
        return 0;
    }
    /* one sequence per row; a [R, 0] tensor has no tokens and R can be
     * anything up to 2^62: bound it before sizing the allocation */
    if (rows < 0 || rows > ((int64_t)1 << 40)) {
        fprintf(stderr, "xent rl: %lld rows of log-probs is not supported (at most 2^40)\n",
                (long long)rows);
        return 1;
    }
    d->nseq = rows;
    d->off = malloc((size_t)(rows + 1) * sizeof(int64_t));
    if (!d->off) {
        fprintf(stderr, "xent rl: out of memory (%lld offsets)\n", (long long)rows + 1);
        return 1;
    }
    for (int64_t i = 0; i <= rows; i++) d->off[i] = i * cols;
    return 0;
}

static int load_all(const rl_args *a, rl_data *d) {
    int64_t rows, cols, T2, r2, c2;
    memset(d, 0, sizeof *d);
    if (!(d->lp[0] = load_lp("--new", a->path[A_NEW], &d->T, &rows, &cols))) return 1;
    for (int k = 1; k < 3; k++) {
        if (!a->path[k]) continue;
        if (!(d->lp[k] = load_lp(g_flag_of[k], a->path[k], &T2, &r2, &c2))) return 1;
        if (T2 != d->T) {
            fprintf(stderr, "xent rl: %s %s has %lld values, --new has %lld\n", g_flag_of[k],
                    a->path[k], (long long)T2, (long long)d->T);
            return 1;
        }
    }
    if (a->path[A_MASK] && load_mask(a->path[A_MASK], d)) return 1;
    return load_offsets(a->path[A_OFF], rows, cols, d);
}

static int check_one(const char *name, const float *lp, const rl_data *d, int allow_inf,
                     int64_t zr) {
    xent_rl_lp_report r;
    xent_status s = xent_rl_check_logprobs(name, lp, d->T, d->off, d->nseq, d->mask, allow_inf,
                                           zr, &r);
    if (s == XENT_ERR_VALUE || s == XENT_OK)
        printf("%-8s checked %lld: NaN %lld, > 0 %lld, -inf %lld, zero runs %lld (longest %lld)\n",
               name, (long long)r.n_checked, (long long)r.n_nan, (long long)r.n_positive,
               (long long)r.n_neg_inf, (long long)r.n_zero_runs, (long long)r.longest_zero_run);
    if (s) xf_lib_error(&g_cmd, NULL);
    return s != XENT_OK;
}

static void print_diag(const xent_rl_diag *g, int has_old) {
    printf("tokens   %lld\n", (long long)g->n_tokens);
    if (has_old)
        printf("ratio    min %.6g mean %.6g max %.6g; outside [1/8, 8] %.6g; clip low %.6g "
               "high %.6g; clamped %lld\n", g->ratio_min, g->ratio_mean, g->ratio_max,
               g->ratio_frac_out, g->clip_frac_low, g->clip_frac_high,
               (long long)g->n_ratio_clamped);
    if (g->has_weights)
        printf("weights  ESS %.6g chi2 %.6g KL(sampler||trainer) k1 %.6g k3 %.6g; max %.6g; "
               "clamped %lld\n", g->ess_frac, g->chi2, g->mismatch_kl_k1, g->mismatch_kl_k3,
               g->weight_max, (long long)g->n_weight_clamped);
}

/* The name of the first non-finite diagnostic printed, or NULL. */
static const char *nonfinite_diag(const xent_rl_diag *g, int has_old) {
    if (has_old) {
        const double v[] = {g->ratio_min, g->ratio_mean, g->ratio_max, g->ratio_frac_out,
                            g->clip_frac_low, g->clip_frac_high};
        static const char *const n[] = {"ratio min", "ratio mean", "ratio max",
                                        "ratio outside [1/8, 8]", "clip low", "clip high"};
        for (int k = 0; k < 6; k++)
            if (!isfinite(v[k])) return n[k];
    }
    if (g->has_weights) {
        const double v[] = {g->ess_frac, g->chi2, g->mismatch_kl_k1, g->mismatch_kl_k3,
                            g->weight_max};
        static const char *const n[] = {"ESS", "chi2", "KL k1", "KL k3", "weight max"};
        for (int k = 0; k < 5; k++)
            if (!isfinite(v[k])) return n[k];
    }
    return NULL;
}

static int cmd_rl(int argc, char **argv) {
    rl_args a;
    int r = parse_args(argc, argv, &a);
    if (r) return r < 0 ? 0 : r;
    rl_data d;
    if (load_all(&a, &d)) { data_free(&d); return 1; }
    static const char *names[3] = {"new", "old", "sampler"};
    int bad = 0;
    for (int k = 0; k < 3; k++)
        if (d.lp[k]) bad |= check_one(names[k], d.lp[k], &d, k > 0, a.o.zero_run_limit);
    xent_rl_input in = {d.T, d.nseq, d.off, d.lp[0], d.lp[1], d.lp[2], NULL, NULL,
                        XENT_RL_ADV_PER_TOKEN, d.mask};
    xent_rl_diag g;
    if (!bad) {
        xent_status s = xent_rl_diagnostics(&in, &a.o, &g);
        if (s) { xf_lib_error(&g_cmd, NULL); bad = 1; }
        else {
            print_diag(&g, d.lp[1] != NULL);
            const char *nf = nonfinite_diag(&g, d.lp[1] != NULL);
            if (nf && !a.allow_nonfinite) {
                fprintf(stderr, "xent rl: the %s is not finite; exit 1 (--allow-nonfinite "
                        "accepts it)\n", nf);
                bad = 1;
            }
        }
    }
    data_free(&d);
    return bad;
}

XENT_COMMAND(rl, "checks and trainer/sampler diagnostics of RL log-prob files", cmd_rl)
