/* tools/cmd_compare.c: `xent compare A B [--ref R]`: do two engines agree on
 * the per-token log-probs of the same tokens? The work is in src/compare/;
 * this file parses the flags and checks the output names before the work. */
#include "cli.h"
#include "compare/compare.h"
#include "input.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_about[] =
    "Per-token log-probs of the same tokens from two engines (A, B; e.g. a\n"
    "trainer and a sampler): delta = A - B, PPO clip fractions, per-sequence\n"
    "(GSPO) ratios, bootstrap intervals, worst tokens, with --ref the split\n"
    "of delta into each engine's error against a reference (delta = floor +\n"
    "(e_A - e_B), rho), and the metrics RL trainers log (A = trainer, B =\n"
    "sampler, weight w = exp(A - B)): perplexities, K1/K2/K3 KL, chi-square,\n"
    "ESS, TIS/MIS/ICEPOP fractions, by position, entropy and token frequency.\n\n"
    "inputs (A, B, --ref): .npy | .safetensors[:NAME] (f32, bf16, f16, f64, all\n"
    "read as double; any shape, flattened; [S, T] = S sequences of T tokens)\n"
    "| .jsonl/.json (one object per sequence: \"logprobs\", optional \"tokens\",\n"
    "\"prompt_len\", \"entropy\" and \"mask\" (0/1 per token, 1 = in the statistics);\n"
    "--key-a/--key-b read the log-probs from another key, e.g. \"processed_logprobs\")\n"
    "| anything else: text, one number per line (nan, inf, -inf accepted)\n\n"
    "The clip range and the zero-run length are the ones `xent rl` uses\n"
    "(docs/compare.md: PPO's symmetric 0.2; DAPO's clip-higher is --eps-high 0.28).\n\n";

static const char k_epilog[] =
    "outputs: the table on stdout (unless --quiet), --json FILE, --html FILE; the\n"
    "names are checked before any work (an output that is an input, two outputs\n"
    "on one file, or a missing directory is a usage error).\n"
    "exit 1 also when a statistic (mean, RMS, sum, max |delta|, a clip fraction)\n"
    "is not finite, unless --allow-nonfinite. Definitions: docs/compare.md.\n";

typedef struct cmp_args {
    xent__cmp_cfg c;
    int64_t seed, threads;
} cmp_args;

static xf_flag g_flags[32];
static const char *g_pos[2];

static void make_cmd(xf_cmd *cmd, cmp_args *a) {
    xent__cmp_cfg *c = &a->c;
    xf_flag fl[] = {
        {"--ref", XF_STRING, &c->ref, "FILE", "reference log-probs (e.g. fp32); A's own with --ref-b",
         NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--ref-b", XF_STRING, &c->ref_b, "FILE",
         "B's own reference (e.g. B's engine in fp32): e_B = B - ref_b,\n"
         "floor = ref - ref_b (needs --ref)", "--ref", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--entropy", XF_STRING, &c->entropy, "FILE",
         "per-token entropy (nats) for the entropy breakdown: tensor,\ntext, or JSON Lines "
         "with \"entropy\"", "\"entropy\" of ref, A or B JSONL", 0, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--tokens-a", XF_STRING, &c->tokens_a, "FILE",
         "token ids of A: .npy/.safetensors int tensor, text, JSON\nLines \"tokens\", or JSON "
         "with \"tokens\": [[...], ...]", "from A if JSONL", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--tokens-b", XF_STRING, &c->tokens_b, "FILE", "token ids of B, same forms",
         "from B if JSONL", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--offsets", XF_STRING, &c->offsets, "FILE",
         "sequence boundaries: S+1 integers 0 = o_0 <= ... <= o_S = N",
         "from JSONL, else none", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--mask", XF_STRING, &c->mask, "FILE",
         "N values 0/1 (integer or float tensor, or text), 1 =\ncompletion token; only those "
         "enter the statistics", "prompt_len from JSONL, else all", 0, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--key-a", XF_STRING, &c->key_a, "NAME",
         "JSON Lines key of A's log-probs (e.g. processed_logprobs,\nold_log_probs)", "logprobs",
         0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--key-b", XF_STRING, &c->key_b, "NAME", "JSON Lines key of B's log-probs (e.g.\n"
         "rollout_log_probs)", "logprobs", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--key-mask", XF_STRING, &c->key_mask, "NAME",
         "JSON Lines key of the per-token 0/1 mask (e.g. loss_mask);\na token is used where "
         "every input's mask is 1", "mask", 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--zero-run", XF_INT, &c->opts.zero_run, "K",
         "exact zeros in a run of >= K tokens are bad", NULL, XF_MIN, 1, 0, NULL, NULL, NULL,
         "zero_run", 0},
        {"--exclude-bad", XF_BOOL, &c->opts.exclude_bad, NULL,
         "leave bad log-probs (positive, NaN, inf, zero runs) out\ninstead of refusing",
         "refuse, exit 1", 0, 0, 0, NULL, NULL, NULL, "exclude_bad", 0},
        {"--eps", XF_FLOAT, &c->opts.eps, NULL, "PPO clip: ratio below 1 - X, |delta| > X", NULL,
         XF_MIN | XF_MAX | XF_LO_OPEN | XF_HI_OPEN, 0, 1, NULL, NULL, NULL, "eps", 0},
        {"--eps-high", XF_FLOAT, &c->opts.eps_high, NULL, "PPO clip: ratio above 1 + X", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "eps_high", 0},
        {"--clamp", XF_FLOAT, &c->opts.clamp, NULL,
         "warn when |sum delta| of a sequence >= 0.9 X", NULL, XF_MIN | XF_LO_OPEN, 0, 0, NULL,
         NULL, NULL, "clamp", 0},
        {"--tis-cap", XF_FLOAT, &c->opts.tis_cap, "C",
         "TIS truncation fraction: weight exp(A - B) > C (token, sequence)", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "tis_cap", 0},
        {"--mis-cap", XF_FLOAT, &c->opts.mis_cap, "C",
         "MIS masking fraction: weight > C (token, sequence, geometric)", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "mis_cap", 0},
        {"--icepop-lo", XF_FLOAT, &c->opts.icepop_lo, "X",
         "ICEPOP masking fraction: token weight outside [X, --icepop-hi]", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "icepop_lo", 0},
        {"--icepop-hi", XF_FLOAT, &c->opts.icepop_hi, "X", "ICEPOP band's upper end", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "icepop_hi", 0},
        {"--bootstrap", XF_INT, &c->opts.bootstrap, NULL, "bootstrap resamples, 0 = none", NULL,
         XF_MIN | XF_MAX, 0, 1000000, NULL, NULL, NULL, "bootstrap", 0},
        {"--seed", XF_INT, &a->seed, NULL, "bootstrap seed", NULL, XF_MIN, 0, 0, NULL, NULL,
         NULL, "seed", 0},
        {"--top", XF_INT, &c->opts.top, "K", "worst tokens listed", NULL, XF_MIN | XF_MAX, 0,
         100000, NULL, NULL, NULL, "top", 0},
        {"--threads", XF_INT, &a->threads, NULL, "threads, 0 = XENT_NUM_THREADS or all cores",
         NULL, XF_MIN | XF_MAX, 0, 256, NULL, NULL, NULL, "threads", 0},
        {"--json", XF_STRING, &c->json, "FILE", "write the results as JSON (\"-\" = stdout)",
         NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--html", XF_STRING, &c->html, "FILE", "write a self-contained HTML report", NULL, 0, 0,
         0, NULL, NULL, NULL, NULL, 0},
        {"--quiet", XF_BOOL, &c->quiet, NULL, "no table on stdout", NULL, 0, 0, 0, NULL, NULL,
         NULL, NULL, 0},
        {"--allow-nonfinite", XF_BOOL, &a->c.allow_nonfinite, NULL, XENT_CLI_NONFINITE_HELP, NULL, 0,
         0, 0, NULL, NULL, NULL, NULL, 0},
    };
    memcpy(g_flags, fl, sizeof fl);
    *cmd = (xf_cmd){"compare", "xent compare A B [options]", k_about, k_epilog, g_flags,
                    (int)(sizeof fl / sizeof fl[0]), 20, "two log-prob files A and B", 2, 2,
                    g_pos, 0};
}

/* Checks the outputs against each other and the inputs; 0 or 2. */
static int check_names(const xent__cmp_cfg *c) {
    const char *in[9] = {c->a, c->b, c->ref, c->ref_b, c->entropy, c->tokens_a, c->tokens_b,
                         c->offsets, c->mask};
    static const char *const inflag[9] = {"A", "B", "--ref", "--ref-b", "--entropy",
                                          "--tokens-a", "--tokens-b", "--offsets", "--mask"};
    char files[9][4096];
    xent_cli_file ins[9], outs[2] = {{"--json", c->json}, {"--html", c->html}};
    int nin = 0;
    for (int k = 0; k < 9; k++) {
        if (!in[k]) continue;
        xent_cli_spec_file(in[k], files[nin], sizeof files[nin]);
        ins[nin] = (xent_cli_file){inflag[k], files[nin]};
        nin++;
    }
    return xent_cli_check_outputs("compare", outs, 2, ins, nin);
}

/* The --key-* flags: printable ASCII, at most XENT__CMP_KEY_MAX bytes, not
 * a key with another meaning, on inputs that are JSON Lines; 0 or 2. */
static int check_keys(const xent__cmp_cfg *c) {
    const char *key[3] = {c->key_a, c->key_b, c->key_mask};
    static const char *const flag[3] = {"--key-a", "--key-b", "--key-mask"};
    static const char *const taken[3] = {"tokens", "prompt_len", "entropy"};
    const char *mask = c->key_mask ? c->key_mask : "mask";
    for (int k = 0; k < 3; k++) {
        const char *v = key[k];
        if (!v) continue;
        size_t n = strlen(v);
        int ok = n >= 1 && n <= XENT__CMP_KEY_MAX;
        for (size_t i = 0; ok && i < n; i++) ok = v[i] >= 0x20 && v[i] <= 0x7e;
        if (!ok) {
            fprintf(stderr, "xent compare: %s expects a JSON key of 1 to %d printable ASCII "
                    "characters, got '%.300s'\n", flag[k], XENT__CMP_KEY_MAX, v);
            return 2;
        }
        for (int t = 0; t < 3; t++)
            if (!strcmp(v, taken[t])) {
                fprintf(stderr, "xent compare: %s '%s': that key has its own meaning (\"tokens\", "
                        "\"prompt_len\", \"entropy\" are read as such)\n", flag[k], v);
                return 2;
            }
        if (k < 2 && !strcmp(v, mask)) {
            fprintf(stderr, "xent compare: %s '%s' is the mask's key (--key-mask)\n", flag[k], v);
            return 2;
        }
        if (k == 2 && (!strcmp(v, "logprobs") || (c->key_a && !strcmp(v, c->key_a)) ||
                       (c->key_b && !strcmp(v, c->key_b)))) {
            fprintf(stderr, "xent compare: --key-mask '%s' is a log-prob key\n", v);
            return 2;
        }
    }
    const char *src[2] = {c->a, c->b};
    static const char *const pos[2] = {"A", "B"};
    for (int k = 0; k < 2; k++)
        if (key[k] && xent__cmp_format(src[k]) != XENT__FMT_JSON) {
            fprintf(stderr, "xent compare: %s '%s' names a JSON Lines key, but %s (%s) is not "
                    ".jsonl, .json or .ndjson\n", flag[k], key[k], pos[k], src[k]);
            return 2;
        }
    if (c->key_mask) {
        const char *lp[5] = {c->a, c->b, c->ref, c->ref_b, c->entropy};
        int any = 0;
        for (int k = 0; k < 5; k++) any |= lp[k] && xent__cmp_format(lp[k]) == XENT__FMT_JSON;
        if (!any) {
            fprintf(stderr, "xent compare: --key-mask '%s' names a JSON Lines key, but no input "
                    "is .jsonl, .json or .ndjson\n", c->key_mask);
            return 2;
        }
    }
    return 0;
}

static int cmd_compare(int argc, char **argv) {
    cmp_args a;
    memset(&a, 0, sizeof a);
    xent__cmp_opts_default(&a.c.opts); /* the RL losses' defaults, as `xent rl` */
    a.seed = (int64_t)a.c.opts.seed;
    a.threads = a.c.opts.threads;
    xf_cmd cmd;
    make_cmd(&cmd, &a);
    int rc = xf_parse(&cmd, argc, argv);
    if (rc) return rc == XF_HELP ? 0 : rc;
    a.c.opts.seed = (uint64_t)a.seed;
    a.c.opts.threads = (int)a.threads;
    a.c.a = cmd.pos[0];
    a.c.b = cmd.pos[1];
    if (xent__cmp_check_opts(&a.c.opts)) {
        xf_lib_error(&cmd, NULL);
        return 2;
    }
    if (a.c.ref_b && !a.c.ref) {
        fprintf(stderr, "xent compare: --ref-b needs --ref (A's reference)\n");
        return 2;
    }
    if (check_keys(&a.c) || check_names(&a.c)) return 2;
    return xent__cmp_run(&a.c);
}

XENT_COMMAND(compare, "do two engines agree on per-token log-probs? (A vs B [vs ref])",
             cmd_compare)
