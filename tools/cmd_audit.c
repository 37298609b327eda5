/* tools/cmd_audit.c: `xent audit`: an fp32 reference run and one run per
 * precision variant of a model on the same tokens, compared layer by layer
 * (docs/audit.md). */
#include "audit/audit.h"
#include "cli.h"
#include "model/model.h"
#include "xent.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct audit_args {
    char model[1024];
    const char *json, *html, *device;
    xent_audit_opts o;
    xent_audit_variants variants;
    int have_variants;
} audit_args;

/* $XENT_CACHE, else $HOME/.cache/xent, + the default model file. */
static void default_model(char *buf, size_t n) {
    const char *cache = getenv("XENT_CACHE");
    const char *home = getenv("HOME");
    if (cache && *cache) snprintf(buf, n, "%s/%s", cache, DEFAULT_MODEL_FILE);
    else snprintf(buf, n, "%s/.cache/xent/%s", home ? home : ".",
                  DEFAULT_MODEL_FILE);
}

static void usage(FILE *f) {
    char model[1024];
    default_model(model, sizeof model);
    fprintf(f,
        "usage: xent audit [options]\n\n"
        "Runs the model under an fp32 reference policy and under each precision\n"
        "variant on the same tokens (forward + backward of next-token\n"
        "cross-entropy) and reports, per recorded tensor, the error against the\n"
        "reference: layer outputs, logits, chosen-token log-probs, gradients.\n\n"
        "options:\n"
        "  --model PATH        GGUF file or HF directory (default, fetched by\n"
        "                      `make model`: %s)\n"
        "  --text FILE         tokenize FILE with the model's tokenizer (default:\n"
        "                      none, random tokens)\n"
        "  --random-tokens     uniform random token ids (default input)\n"
        "  --seed N            seed of --random-tokens (default 0)\n"
        "  --seq-len N         tokens per row (default 512)\n"
        "  --batch N           rows (default 1)\n"
        "  --variant SPEC      NAME or NAME:key=value,... (repeatable; replaces\n"
        "                      the default list: fp32, bf16, bf16_fp32head, fp16,\n"
        "                      fp16_fp32head)\n"
        "  --variants FILE     variants from FILE, one per line: NAME key=value ...\n"
        "                      (default: none; like --variant, replaces the list)\n"
        "  --json FILE         write every metric, the settings and the token ids\n"
        "                      (default: none)\n"
        "  --html FILE         write a self-contained report with plots (default:\n"
        "                      none)\n"
        "  --threads N         CPU threads (default 0: XENT_NUM_THREADS, else all\n"
        "                      cores)\n"
        "  --device cpu|cuda   where the variants' matrix products run (default\n"
        "                      cpu: OpenBLAS on the rounded values; cuda: cuBLAS,\n"
        "                      real bf16/fp16 tensor-core products of the same\n"
        "                      values; the fp32 reference always runs on the CPU)\n"
        "  --quiet             no progress lines on stderr (default: one per\n"
        "                      variant)\n"
        "  -h, --help          this text\n\n"
        "variant keys (start from all fp32):\n"
        "  compute residual norm attn_softmax lm_head logits grad_accum all\n"
        "                      fp32 | bf16 | fp16 (all = the first six)\n"
        "  ce                  exact | fp32 | bf16_lse | bf16_probs | f16_probs |\n"
        "                      bf16_logsoftmax (default exact)\n"
        "  micro_batches       >= 1 (default 1)\n"
        "  loss_scale          auto | number > 0 (default 1; auto: a power of two\n"
        "                      from the reference's largest gradient when fp16 is used)\n"
        "The list must hold an fp32 reference (e.g. --variant fp32).\n",
        model);
}

static int add_variant(audit_args *a, const char *spec) {
    xent_audit_variant v;
    if (xent__audit_variant_parse(spec, &v) ||
        xent__audit_variants_add(&a->variants, &v)) {
        fprintf(stderr, "xent audit: --variant: %s\n", xent_last_error());
        return 2;
    }
    a->have_variants = 1;
    return 0;
}

static int parse_count(const char *flag, const char *s, int64_t *out) {
    if (xent_cli_parse_i64(flag, s, out)) return 2;
    if (*out < 1) {
        fprintf(stderr, "xent audit: %s must be >= 1, got %s\n", flag, s);
        return 2;
    }
    return 0;
}

/* One flag with its value; returns 0, or the exit code. */
static int parse_flag(audit_args *a, int argc, char **argv, int *i) {
    const char *f = argv[*i], *v;
    int64_t n;
    if (!strcmp(f, "--random-tokens")) { a->o.text_path = NULL; return 0; }
    if (!strcmp(f, "--quiet")) { a->o.progress = 0; return 0; }
    if (!(v = xent_cli_value(argc, argv, i))) return 2;
    if (!strcmp(f, "--model")) snprintf(a->model, sizeof a->model, "%s", v);
    else if (!strcmp(f, "--text")) a->o.text_path = v;
    else if (!strcmp(f, "--seed")) {
        if (xent_cli_parse_i64(f, v, &n)) return 2;
        a->o.seed = (uint64_t)n;
    } else if (!strcmp(f, "--seq-len")) return parse_count(f, v, &a->o.seq_len);
    else if (!strcmp(f, "--batch")) return parse_count(f, v, &a->o.batch);
    else if (!strcmp(f, "--threads")) {
        if (xent_cli_parse_i64(f, v, &n) || n < 0 || n > 256) {
            fprintf(stderr, "xent audit: --threads must be in [0, 256]\n");
            return 2;
        }
        a->o.threads = (int)n;
    } else if (!strcmp(f, "--variant")) return add_variant(a, v);
    else if (!strcmp(f, "--variants")) {
        if (xent__audit_variants_file(v, &a->variants)) {
            fprintf(stderr, "xent audit: --variants: %s\n", xent_last_error());
            return 2;
        }
        a->have_variants = 1;
    } else if (!strcmp(f, "--json")) a->json = v;
    else if (!strcmp(f, "--html")) a->html = v;
    else if (!strcmp(f, "--device")) a->device = v;
    else {
        fprintf(stderr, "xent audit: unknown option %s (see xent audit --help)\n", f);
        return 2;
    }
    return 0;
}

static int parse_args(audit_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    default_model(a->model, sizeof a->model);
    xent__audit_opts_init(&a->o);
    a->device = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return -1;
        }
        int rc = parse_flag(a, argc, argv, &i);
        if (rc) return rc;
    }
    if (!strcmp(a->device, "cuda")) {
        if (xent_cuda_device_count() < 1) {
            fprintf(stderr, "xent audit: --device cuda: no CUDA device (this build: %s)\n",
                    xent_version());
            return 2;
        }
        a->o.gemm_device = 1;
    } else if (strcmp(a->device, "cpu")) {
        fprintf(stderr, "xent audit: --device %s: accepted: cpu, cuda\n", a->device);
        return 2;
    }
    if (!a->have_variants) xent__audit_default_variants(&a->variants);
    int ref;
    if (xent__audit_find_reference(&a->variants, &ref)) {
        fprintf(stderr, "xent audit: %s\n", xent_last_error());
        return 2;
    }
    return 0;
}

static int write_reports(const audit_args *a, const xent_audit_result *r) {
    xent__audit_print_tables(r, stdout);
    fflush(stdout);
    if (a->json && xent__audit_write_json(r, a->json)) {
        fprintf(stderr, "xent audit: %s\n", xent_last_error());
        return 1;
    }
    if (a->html && xent__audit_write_html(r, a->html)) {
        fprintf(stderr, "xent audit: %s\n", xent_last_error());
        return 1;
    }
    if (a->json) printf("wrote %s\n", a->json);
    if (a->html) printf("wrote %s\n", a->html);
    printf("total %.1f s\n", r->total_seconds);
    return 0;
}

static int cmd_audit(int argc, char **argv) {
    audit_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    xent_model *m = NULL;
    if (xent_model_load(a.model, &m)) {
        fprintf(stderr, "xent audit: --model %s: %s\n", a.model, xent_last_error());
        return 1;
    }
    int32_t *tokens = NULL;
    int64_t B, S;
    if (xent__audit_tokens(m, &a.o, &tokens, &B, &S)) {
        fprintf(stderr, "xent audit: %s\n", xent_last_error());
        xent_model_free(m);
        return a.o.text_path ? 2 : 1;
    }
    if (B * S < a.o.batch * a.o.seq_len)
        fprintf(stderr, "xent audit: the text gives %lld x %lld tokens (asked "
                "%lld x %lld)\n", (long long)B, (long long)S,
                (long long)a.o.batch, (long long)a.o.seq_len);
    xent_audit_result r;
    rc = 0;
    if (xent__audit_run(m, tokens, B, S, &a.variants, &a.o, &r)) {
        fprintf(stderr, "xent audit: %s\n", xent_last_error());
        rc = 1;
    } else {
        rc = write_reports(&a, &r);
        xent__audit_result_free(&r);
    }
    free(tokens);
    xent_model_free(m);
    return rc;
}

XENT_COMMAND(audit, "precision variants against an fp32 reference, layer by layer",
             cmd_audit)
