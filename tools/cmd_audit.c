/* tools/cmd_audit.c: `xent audit`: an fp32 reference run and one run per
 * precision variant of a model on the same tokens, compared layer by layer
 * (docs/audit.md). */
#include "audit/audit.h"
#include "cli.h"
#include "input.h"
#include "progress.h"
#include "model/model.h"
#include "xent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct audit_args {
    const char *model, *json, *html;
    int device, random_tokens, quiet, allow_nonfinite, init;
    const char *config;
    int64_t seed, threads, init_seed;
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

static const char k_about[] =
    "Runs the model under an fp32 reference policy and under each precision\n"
    "variant on the same tokens (forward + backward of next-token\n"
    "cross-entropy) and reports, per recorded tensor, the error against the\n"
    "reference: layer outputs, logits, chosen-token log-probs, gradients.\n\n";

static const char k_epilog[] =
    "variant keys (start from all fp32):\n"
    "  compute residual norm attn_softmax lm_head logits grad_accum all\n"
    "                      fp32 | bf16 | fp16 (all = the first six)\n"
    "  ce                  exact | fp32 | bf16_lse | bf16_probs | f16_probs |\n"
    "                      bf16_logsoftmax (default exact)\n"
    "  micro_batches       >= 1 (default 1)\n"
    "  loss_scale          auto | number > 0 (default 1; auto: a power of two\n"
    "                      from the reference's largest gradient when fp16 is used)\n"
    "The list must hold an fp32 reference (e.g. --variant fp32).\n"
    "--device cpu: OpenBLAS on the rounded values; cuda: each variant's whole\n"
    "forward and backward resident on the GPU (weights uploaded once, the same\n"
    "rounding points, real bf16/fp16 tensor-core products; the device memory plan\n"
    "is printed first); cuda-gemm: only the matrix products on the GPU (cuBLAS),\n"
    "the rest on the CPU. The fp32 reference always runs on the CPU.\n"
    "--json and --html are checked before the run (directory, not an input,\n"
    "not the same file). A non-finite loss of a variant exits 1 after the\n"
    "reports are written, unless --allow-nonfinite.\n";

static int add_variant(void *dst, const char *spec, const char *flag, const char *cmd) {
    audit_args *a = dst;
    xent_audit_variant v;
    if (xent__audit_variant_parse(spec, &v) ||
        xent__audit_variants_add(&a->variants, &v)) {
        fprintf(stderr, "xent %s: %s %s: %s\n", cmd, flag, spec, xent_last_error());
        return 2;
    }
    a->have_variants = 1;
    return 0;
}

static int add_variants_file(void *dst, const char *path, const char *flag, const char *cmd) {
    audit_args *a = dst;
    if (xent__audit_variants_file(path, &a->variants)) {
        fprintf(stderr, "xent %s: %s %s: %s\n", cmd, flag, path, xent_last_error());
        return 2;
    }
    a->have_variants = 1;
    return 0;
}

static const char *const k_devices[] = {"cpu", "cuda", "cuda-gemm", NULL};
static const char *const k_inits[] = {"checkpoint", "random", NULL};
static char g_config_help[256];
static xf_flag g_flags[24];
static xf_cmd g_cmd;
static char g_default_model[1024];

static void make_cmd(audit_args *a) {
    xf_flag fl[] = {
        {"--model", XF_STRING, &a->model, "PATH",
         "GGUF file or HF directory; `make model` fetches\nthe default", NULL, 0, 0, 0, NULL,
         NULL, NULL, NULL, 0},
        {"--init", XF_ENUM, &a->init, NULL,
         "checkpoint: load --model; random: random weights at\nthe shapes of --config (the "
         "family's initializer,\nnormal(0, initializer_range)); every output says\n\"random "
         "weights\"", NULL, 0, 0, 0, k_inits, NULL, NULL, NULL, 0},
        {"--config", XF_STRING, &a->config, "FILE|NAME", g_config_help, "none", 0, 0, 0, NULL,
         NULL, NULL, NULL, 0},
        {"--init-seed", XF_INT, &a->init_seed, NULL, "seed of --init random's weights", NULL,
         XF_MIN, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--text", XF_STRING, &a->o.text_path, "FILE",
         "tokenize FILE with the model's tokenizer", "none, random tokens", 0, 0, 0, NULL, NULL,
         NULL, "text_path", 0},
        {"--random-tokens", XF_BOOL, &a->random_tokens, NULL,
         "uniform random token ids (the input without --text)", "on", 0, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--seed", XF_INT, &a->seed, NULL, "seed of --random-tokens", NULL, XF_MIN, 0, 0, NULL,
         NULL, NULL, "seed", 0},
        {"--seq-len", XF_INT, &a->o.seq_len, NULL, "tokens per row", NULL, XF_MIN, 1, 0, NULL,
         NULL, NULL, "seq_len", 0},
        {"--batch", XF_INT, &a->o.batch, NULL, "rows", NULL, XF_MIN, 1, 0, NULL, NULL, NULL,
         "batch", 0},
        {"--variant", XF_FUNC, a, "SPEC",
         "NAME or NAME:key=value,... (repeatable; replaces\nthe default list)",
         "fp32, bf16,\nbf16_fp32head, fp16, fp16_fp32head", 0, 0, 0, NULL, NULL, add_variant,
         NULL, 0},
        {"--variants", XF_FUNC, a, "FILE",
         "variants from FILE, one per line: NAME key=value ...\n(like --variant, replaces the "
         "list)", "none", 0, 0, 0, NULL, NULL, add_variants_file, NULL, 0},
        {"--json", XF_STRING, &a->json, "FILE",
         "write every metric, the settings and the token ids", NULL, 0, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--html", XF_STRING, &a->html, "FILE", "write a self-contained report with plots", NULL,
         0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--threads", XF_INT, &a->threads, NULL,
         "CPU threads; 0 = XENT_NUM_THREADS, else all cores", NULL, XF_MIN | XF_MAX, 0, 256,
         NULL, NULL, NULL, "threads", 0},
        {"--device", XF_ENUM, &a->device, NULL, "where the variants run (cuda: the whole pass;\ncuda-gemm: the products only)",
         NULL, 0, 0, 0, k_devices, NULL, NULL, "gemm_device", 0},
        {"--quiet", XF_BOOL, &a->quiet, NULL,
         "no per-variant lines and no progress line on stderr\n(the progress line shows only "
         "on a terminal)", NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--allow-nonfinite", XF_BOOL, &a->allow_nonfinite, NULL, XENT_CLI_NONFINITE_HELP, NULL,
         0, 0, 0, NULL, NULL, NULL, NULL, 0},
    };
    memcpy(g_flags, fl, sizeof fl);
    g_cmd = (xf_cmd){"audit", "xent audit [options]", k_about, k_epilog, g_flags,
                     (int)(sizeof fl / sizeof fl[0]), 19, NULL, 0, 0, NULL, 0};
}

static int parse_args(audit_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    default_model(g_default_model, sizeof g_default_model);
    a->model = g_default_model;
    xent__audit_opts_init(&a->o);
    a->seed = (int64_t)a->o.seed;
    a->threads = a->o.threads;
    make_cmd(a);
    snprintf(g_config_help, sizeof g_config_help,
             "--init random: a config.json (or its directory) or\na built-in: %s",
             xent_model_config_builtins());
    int rc = xf_parse(&g_cmd, argc, argv);
    if (rc) return rc;
    if (a->init == 1 && !a->config) {
        fprintf(stderr, "xent audit: --init random needs --config FILE|NAME (built in: %s)\n",
                xent_model_config_builtins());
        return 2;
    }
    if (a->init == 0 && a->config) {
        fprintf(stderr, "xent audit: --config %s is for --init random\n", a->config);
        return 2;
    }
    if (a->random_tokens && a->o.text_path) {
        fprintf(stderr, "xent audit: --random-tokens and --text %s: give one of them\n",
                a->o.text_path);
        return 2;
    }
    a->o.seed = (uint64_t)a->seed;
    a->o.threads = (int)a->threads;
    a->o.progress = !a->quiet;
    if (a->device == 1 || a->device == 2) {
        if (xent_cuda_device_count() < 1) {
            fprintf(stderr, "xent audit: --device %s: no CUDA device (this build: %s)\n",
                    k_devices[a->device], xent_version());
            return 2;
        }
        /* cuda: the resident pass (2); cuda-gemm: the products only (1) */
        a->o.gemm_device = a->device == 1 ? 2 : 1;
    }
    if (!a->have_variants) xent__audit_default_variants(&a->variants);
    int ref;
    if (xent__audit_find_reference(&a->variants, &ref)) {
        xf_lib_error(&g_cmd, NULL);
        return 2;
    }
    char model_file[1100];
    xent_cli_file ins[2] = {{"--model", a->init == 1 ? NULL : model_file},
                            {"--text", a->o.text_path}};
    snprintf(model_file, sizeof model_file, "%s", a->model);
    xent_cli_file outs[2] = {{"--json", a->json}, {"--html", a->html}};
    return xent_cli_check_outputs("audit", outs, 2, ins, 2);
}

/* The progress line. Items are layer passes, 2 L per variant (L forward,
 * L backward); the line names the variant and the layer running, e.g.
 * "now bf16 (2/5), layer 7/24 backward". */
typedef struct audit_progress {
    xent_progress *p;
    const xent_audit_variants *vs;
    int ref;
    int64_t steps; /* per variant: 2 L, or 0 when the unit is variants */
    char label[96];
} audit_progress;

/* Position of variant v in the run order (the reference runs first). */
static int run_index(const audit_progress *ap, int v) {
    if (v == ap->ref) return 0;
    return v < ap->ref ? v + 1 : v;
}

static const char *running_name(const audit_progress *ap, int done) {
    if (done == 0) return ap->vs->v[ap->ref].name;
    for (int v = 0, k = 1; v < ap->vs->n; v++) {
        if (v == ap->ref) continue;
        if (k++ == done) return ap->vs->v[v].name;
    }
    return NULL;
}

static void on_log(void *ctx, int done, int total, const char *line) {
    audit_progress *ap = ctx;
    if (line) xent_progress_log(ap->p, line);
    if (done < 0) return;
    const char *next = running_name(ap, done);
    if (ap->steps && next) {
        snprintf(ap->label, sizeof ap->label, "%s (%d/%d)", next, done + 1, total);
        xent_progress_update(ap->p, done * ap->steps, ap->label);
    } else {
        xent_progress_update(ap->p, ap->steps ? done * ap->steps : done, next);
    }
}

static void on_layer(void *ctx, int variant, int layer, int n_layers, int backward) {
    audit_progress *ap = ctx;
    int k = run_index(ap, variant);
    /* forward: layers 0..L-1 are steps 1..L; backward: L-1..0 are L+1..2L */
    int64_t step = backward ? (int64_t)n_layers + (n_layers - layer) : (int64_t)layer + 1;
    snprintf(ap->label, sizeof ap->label, "%s (%d/%d), layer %d/%d %s",
             ap->vs->v[variant].name, k + 1, ap->vs->n, backward ? n_layers - layer : layer + 1,
             n_layers, backward ? "backward" : "forward");
    xent_progress_update(ap->p, (int64_t)k * ap->steps + step, ap->label);
}

static int write_reports(const audit_args *a, const xent_audit_result *r) {
    xent__audit_print_tables(r, stdout);
    fflush(stdout);
    if (a->json && xent__audit_write_json(r, a->json)) {
        fprintf(stderr, "xent audit: --json: %s\n", xent_last_error());
        return 1;
    }
    if (a->html && xent__audit_write_html(r, a->html)) {
        fprintf(stderr, "xent audit: --html: %s\n", xent_last_error());
        return 1;
    }
    if (a->json) printf("wrote %s\n", a->json);
    if (a->html) printf("wrote %s\n", a->html);
    printf("total %.1f s\n", r->total_seconds);
    return 0;
}

/* Exit 1 for a non-finite loss (after the reports), unless allowed. */
static int check_losses(const audit_args *a, const xent_audit_result *r) {
    int bad = 0;
    for (int v = 0; v < r->variants.n; v++)
        if (!isfinite(r->loss[v])) {
            fprintf(stderr, "xent audit: the loss of variant %s is %g%s\n", r->variants.v[v].name,
                    r->loss[v], a->allow_nonfinite ? " (--allow-nonfinite)" : "");
            bad = 1;
        }
    if (bad && !a->allow_nonfinite) {
        fprintf(stderr, "xent audit: exit 1 for the non-finite loss (--allow-nonfinite accepts "
                "it)\n");
        return 1;
    }
    return 0;
}

static int cmd_audit(int argc, char **argv) {
    audit_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    xent_model *m = NULL;
    if (a.init == 1) {
        xent_model_config c;
        if (xent_model_config_named(a.config, &c)) {
            fprintf(stderr, "xent audit: --config %s: %s\n", a.config, xent_last_error());
            return 2;
        }
        if (xent_model_init_random(&c, (uint64_t)a.init_seed, &m)) {
            fprintf(stderr, "xent audit: --init random: %s\n", xent_last_error());
            return 1;
        }
        snprintf(m->source, sizeof m->source, "random weights, %s (%s), seed %lld", a.config,
                 c.arch, (long long)a.init_seed);
        if (!a.quiet)
            fprintf(stderr, "xent audit: RANDOM WEIGHTS at the shapes of %s (%lld parameters)\n",
                    a.config, (long long)xent_model_n_weights(m));
    } else if (xent_model_load(a.model, &m)) {
        fprintf(stderr, "xent audit: --model %s: %s\n", a.model, xent_last_error());
        return 1;
    }
    int32_t *tokens = NULL;
    int64_t B, S;
    if (xent__audit_tokens(m, &a.o, &tokens, &B, &S)) {
        xf_lib_error(&g_cmd, a.o.text_path ? "--text" : NULL);
        xent_model_free(m);
        return a.o.text_path ? 2 : 1;
    }
    if (B * S < a.o.batch * a.o.seq_len)
        fprintf(stderr, "xent audit: the text gives %lld x %lld tokens (asked "
                "%lld x %lld)\n", (long long)B, (long long)S,
                (long long)a.o.batch, (long long)a.o.seq_len);
    xent_audit_result r;
    int ref = 0;
    xent__audit_find_reference(&a.variants, &ref);
    audit_progress ap = {NULL, &a.variants, ref, 0, ""};
    int64_t L = m->cfg.n_layers;
    if (L > 0) ap.steps = 2 * L;
    ap.p = xent_progress_start("xent audit", ap.steps ? "layer passes" : "variants",
                               ap.steps ? a.variants.n * ap.steps : a.variants.n,
                               xent_progress_wanted(a.quiet));
    on_log(&ap, 0, a.variants.n, NULL);
    a.o.log = on_log;
    a.o.log_ctx = &ap;
    if (ap.steps) {
        a.o.on_layer = on_layer;
        a.o.on_layer_ctx = &ap;
    }
    xent_status st = xent__audit_run(m, tokens, B, S, &a.variants, &a.o, &r);
    xent_progress_end(ap.p);
    if (st) {
        xf_lib_error(&g_cmd, NULL);
        rc = 1;
    } else {
        rc = write_reports(&a, &r);
        if (!rc) rc = check_losses(&a, &r);
        xent__audit_result_free(&r);
    }
    free(tokens);
    xent_model_free(m);
    return rc;
}

XENT_COMMAND(audit, "precision variants against an fp32 reference, layer by layer",
             cmd_audit)
