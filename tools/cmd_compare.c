/* tools/cmd_compare.c: `xent compare A B [--ref R]`: do two engines agree on
 * the per-token log-probs of the same tokens? The work is in src/compare/. */
#include "cli.h"
#include "compare/compare.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: xent compare A B [options]\n\n"
        "Per-token log-probs of the same tokens from two engines (A, B; e.g. a\n"
        "sampler and a trainer): delta = A - B, PPO clip fractions, per-sequence\n"
        "(GSPO) ratios, bootstrap intervals, worst tokens, and with --ref the split\n"
        "of delta into each engine's error against a reference.\n\n"
        "inputs (A, B, --ref): .npy | .safetensors[:NAME] (f32, bf16, f16, f64; any\n"
        "shape, flattened; [S, T] = S sequences of T tokens) | .jsonl/.json (one\n"
        "object per sequence: \"logprobs\", optional \"tokens\" and \"prompt_len\")\n"
        "| anything else: text, one number per line (nan, inf, -inf accepted)\n\n"
        "options:\n"
        "  --ref FILE        reference log-probs (e.g. fp32)          (default: none)\n"
        "  --tokens-a FILE   token ids of A: .npy/.safetensors int tensor, text, JSON\n"
        "                    Lines \"tokens\", or JSON with \"tokens\": [[...], ...]\n"
        "                                                             (default: from A if JSONL)\n"
        "  --tokens-b FILE   token ids of B, same forms               (default: from B if JSONL)\n"
        "  --offsets FILE    sequence boundaries: S+1 integers 0 = o_0 <= ... <= o_S = N\n"
        "                                                             (default: from JSONL, else none)\n"
        "  --mask FILE       N values 0/1 (integer or float tensor, or text), 1 =\n"
        "                    completion token; only those enter the statistics\n"
        "                                   (default: prompt_len from JSONL, else all)\n"
        "  --zero-run K      exact zeros in a run of >= K tokens are bad (default: 8)\n"
        "  --exclude-bad     leave bad log-probs (positive, NaN, inf, zero runs) out\n"
        "                    instead of refusing                      (default: refuse, exit 1)\n"
        "  --eps X           PPO clip: ratio below 1 - X, |delta| > X  (default: 0.2)\n"
        "  --eps-high X      PPO clip: ratio above 1 + X              (default: 0.28)\n"
        "  --clamp X         warn when |sum delta| of a sequence >= 0.9 X (default: 20)\n"
        "  --bootstrap N     bootstrap resamples, 0 = none            (default: 1000)\n"
        "  --seed N          bootstrap seed                           (default: 0)\n"
        "  --top K           worst tokens listed                      (default: 10)\n"
        "  --threads N       threads, 0 = XENT_NUM_THREADS or all cores (default: 0)\n"
        "  --json FILE       write the results as JSON (\"-\" = stdout) (default: none)\n"
        "  --html FILE       write a self-contained HTML report       (default: none)\n"
        "  --quiet           no table on stdout                       (default: off)\n"
        "  -h, --help        this text\n\n"
        "exit status: 0 done, 1 a check failed (lengths, token ids, bad values) or an\n"
        "I/O error, 2 usage error. Definitions: docs/compare.md.\n");
}

/* Parses one flag at argv[*i]; returns 0 ok, 2 usage error, 3 help. */
static int parse_flag(int argc, char **argv, int *i, xent__cmp_cfg *c) {
    const char *a = argv[*i], *v;
    const char **str = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 3;
    if (!strcmp(a, "--exclude-bad")) { c->opts.exclude_bad = 1; return 0; }
    if (!strcmp(a, "--quiet")) { c->quiet = 1; return 0; }
    if (!strcmp(a, "--ref")) str = &c->ref;
    else if (!strcmp(a, "--tokens-a")) str = &c->tokens_a;
    else if (!strcmp(a, "--tokens-b")) str = &c->tokens_b;
    else if (!strcmp(a, "--offsets")) str = &c->offsets;
    else if (!strcmp(a, "--mask")) str = &c->mask;
    else if (!strcmp(a, "--json")) str = &c->json;
    else if (!strcmp(a, "--html")) str = &c->html;
    static const char *const valued[] = {"--eps", "--eps-high", "--clamp", "--zero-run",
                                         "--bootstrap", "--top", "--seed", "--threads"};
    int known = str != NULL;
    for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(a, valued[k]);
    if (!known) {
        fprintf(stderr, "xent compare: unknown option '%s'\n", a);
        return 2;
    }
    if (!(v = xent_cli_value(argc, argv, i))) return 2;
    if (str) { *str = v; return 0; }
    int64_t n;
    if (!strcmp(a, "--eps")) return xent_cli_parse_f64(a, v, &c->opts.eps) ? 2 : 0;
    if (!strcmp(a, "--eps-high")) return xent_cli_parse_f64(a, v, &c->opts.eps_high) ? 2 : 0;
    if (!strcmp(a, "--clamp")) return xent_cli_parse_f64(a, v, &c->opts.clamp) ? 2 : 0;
    if (!strcmp(a, "--zero-run")) return xent_cli_parse_i64(a, v, &c->opts.zero_run) ? 2 : 0;
    if (!strcmp(a, "--bootstrap")) return xent_cli_parse_i64(a, v, &c->opts.bootstrap) ? 2 : 0;
    if (!strcmp(a, "--top")) return xent_cli_parse_i64(a, v, &c->opts.top) ? 2 : 0;
    if (!strcmp(a, "--seed")) {
        if (xent_cli_parse_i64(a, v, &n)) return 2;
        if (n < 0) { fprintf(stderr, "xent compare: --seed = %s must be >= 0\n", v); return 2; }
        c->opts.seed = (uint64_t)n;
        return 0;
    }
    if (!strcmp(a, "--threads")) {
        if (xent_cli_parse_i64(a, v, &n)) return 2;
        if (n < 0 || n > 256) {
            fprintf(stderr, "xent compare: --threads = %s is outside [0, 256]\n", v);
            return 2;
        }
        c->opts.threads = (int)n;
        return 0;
    }
    return 2; /* not reached: every valued flag is handled above */
}

static int cmd_compare(int argc, char **argv) {
    xent__cmp_cfg c;
    memset(&c, 0, sizeof c);
    xent__cmp_opts_default(&c.opts);
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) {
            int rc = parse_flag(argc, argv, &i, &c);
            if (rc == 3) { usage(stdout); return 0; }
            if (rc) { fprintf(stderr, "(xent compare --help lists the options)\n"); return 2; }
        } else if (npos < 2) {
            pos[npos++] = argv[i];
        } else {
            fprintf(stderr, "xent compare: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (npos != 2) {
        fprintf(stderr, "xent compare: needs two log-prob files A and B\n\n");
        usage(stderr);
        return 2;
    }
    if (xent__cmp_check_opts(&c.opts)) {
        fprintf(stderr, "xent compare: %s\n", xent_last_error());
        return 2;
    }
    c.a = pos[0];
    c.b = pos[1];
    return xent__cmp_run(&c);
}

XENT_COMMAND(compare, "do two engines agree on per-token log-probs? (A vs B [vs ref])",
             cmd_compare)
