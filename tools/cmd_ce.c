/* tools/cmd_ce.c: `xent ce`: cross-entropy of a logits file.
 * Reads logits [T, V] (or [B, S, V], flattened to [B*S, V]) and labels [T]
 * (or [B, S]) from .safetensors/.npy, calls xent_ce and writes loss, nll,
 * logprob, lse, (entropy), (grad) to one .safetensors file or to .npy files. */
#include "cli.h"
#include "xent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ce_args {
    const char *logits, *labels, *out;
    int grad, entropy, have_grad_dtype;
    xent_dtype grad_dtype;
    xent_ce_opts o;
} ce_args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: xent ce --logits FILE[:NAME] --labels FILE[:NAME] --out FILE [options]\n\n"
            "Exact cross-entropy of a logits file. Inputs: .safetensors or .npy; logits\n"
            "F32/BF16/F16 [T, V] or [B, S, V]; labels I32/I64 [T] or [B, S].\n"
            "Writes loss, nll, logprob, lse (and entropy, grad when asked) to FILE:\n"
            "one .safetensors file, or FILE.npy -> FILE.NAME.npy per tensor.\n\n"
            "  --logits FILE[:NAME]    logits tensor (required)\n"
            "  --labels FILE[:NAME]    target ids, in [0, V) or the ignore index (required)\n"
            "  --out FILE              output .safetensors or .npy (required)\n"
            "  --grad                  also write grad = dL/dlogits (default: off)\n"
            "  --grad-dtype f32|bf16|f16  dtype of grad (default: the logits dtype)\n"
            "  --entropy               also write the per-row entropy (default: off)\n"
            "  --ignore-index N        label of rows without a target (default: -100)\n"
            "  --reduction none|sum|mean  loss reduction (default: mean)\n"
            "  --normalizer X          divisor of mean; 0 = counted rows (default: 0)\n"
            "  --temperature X         logits divided by X (default: 1)\n"
            "  --softcap X             X * tanh(z / X) before the temperature; 0 = off (default: 0)\n"
            "  --z-loss X              adds X * lse^2 per row (default: 0)\n"
            "  --label-smoothing X     in [0, 1] (default: 0)\n"
            "  --grad-scale X          upstream gradient of the loss (default: 1)\n"
            "  --threads N             worker threads; 0 = XENT_NUM_THREADS or all cores (default: 0)\n"
            "  -h, --help              this text\n\n"
            "Prints one line: T, V, loss, counted rows, non-finite rows.\n"
            "Exit status: 0 ok, 1 failure (bad file or input), 2 usage error.\n");
}

static int parse_reduction(const char *s, xent_reduction *r) {
    if (!strcmp(s, "none")) *r = XENT_REDUCE_NONE;
    else if (!strcmp(s, "sum")) *r = XENT_REDUCE_SUM;
    else if (!strcmp(s, "mean")) *r = XENT_REDUCE_MEAN;
    else {
        fprintf(stderr, "xent ce: --reduction must be none, sum or mean, got '%s'\n", s);
        return 1;
    }
    return 0;
}

/* A flag with a double value: returns 1 on a usage error, 0 if handled,
 * -1 if argv[*i] is not one of them. */
static int parse_f64_flag(int argc, char **argv, int *i, ce_args *a) {
    static const char *names[] = {"--normalizer", "--temperature", "--softcap", "--z-loss",
                                  "--label-smoothing", "--grad-scale"};
    double *dst[] = {&a->o.normalizer, &a->o.temperature, &a->o.softcap, &a->o.z_loss,
                     &a->o.label_smoothing, &a->o.grad_scale};
    for (int k = 0; k < 6; k++) {
        if (strcmp(argv[*i], names[k])) continue;
        const char *v = xent_cli_value(argc, argv, i);
        return !v || xent_cli_parse_f64(names[k], v, dst[k]);
    }
    return -1;
}

static int parse_i64_flag(int argc, char **argv, int *i, ce_args *a) {
    static const char *names[] = {"--ignore-index", "--threads"};
    int64_t threads = 0;
    int64_t *dst[] = {&a->o.ignore_index, &threads};
    for (int k = 0; k < 2; k++) {
        if (strcmp(argv[*i], names[k])) continue;
        const char *v = xent_cli_value(argc, argv, i);
        if (!v || xent_cli_parse_i64(names[k], v, dst[k])) return 1;
        if (k == 1) {
            if (threads < 0 || threads > 4096) {
                fprintf(stderr, "xent ce: --threads must be in [0, 4096], got %s\n", v);
                return 1;
            }
            a->o.threads = (int)threads;
        }
        return 0;
    }
    return -1;
}

/* Returns 0 to run, 2 on a usage error, -1 after --help. */
static int parse_args(int argc, char **argv, ce_args *a) {
    memset(a, 0, sizeof *a);
    xent_ce_opts_init(&a->o);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return -1; }
        if ((r = parse_f64_flag(argc, argv, &i, a)) >= 0) { if (r) return 2; continue; }
        if ((r = parse_i64_flag(argc, argv, &i, a)) >= 0) { if (r) return 2; continue; }
        if (!strcmp(f, "--grad")) { a->grad = 1; continue; }
        if (!strcmp(f, "--entropy")) { a->entropy = 1; continue; }
        const char *v;
        if (!strcmp(f, "--logits") || !strcmp(f, "--labels") || !strcmp(f, "--out") ||
            !strcmp(f, "--reduction") || !strcmp(f, "--grad-dtype")) {
            if (!(v = xent_cli_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "xent ce: unknown option '%s' (see xent ce --help)\n", f);
            return 2;
        }
        if (!strcmp(f, "--logits")) a->logits = v;
        else if (!strcmp(f, "--labels")) a->labels = v;
        else if (!strcmp(f, "--out")) a->out = v;
        else if (!strcmp(f, "--reduction")) { if (parse_reduction(v, &a->o.reduction)) return 2; }
        else {
            if (xent_dtype_parse(v, &a->grad_dtype) != XENT_OK ||
                (a->grad_dtype != XENT_F32 && a->grad_dtype != XENT_BF16 && a->grad_dtype != XENT_F16)) {
                fprintf(stderr, "xent ce: --grad-dtype must be f32, bf16 or f16, got '%s'\n", v);
                return 2;
            }
            a->have_grad_dtype = 1;
        }
    }
    const char *missing = !a->logits ? "--logits" : !a->labels ? "--labels" : !a->out ? "--out" : NULL;
    if (missing) {
        fprintf(stderr, "xent ce: %s is required (see xent ce --help)\n", missing);
        return 2;
    }
    size_t n = strlen(a->out);
    if (!((n > 12 && !strcmp(a->out + n - 12, ".safetensors")) || (n > 4 && !strcmp(a->out + n - 4, ".npy")))) {
        fprintf(stderr, "xent ce: --out must end in .safetensors or .npy, got '%s'\n", a->out);
        return 2;
    }
    return 0;
}

/* Checks the loaded inputs; returns 0 or prints a message and returns 1. */
static int check_inputs(const ce_args *a, const xent_tensor *lg, const xent_tensor *lb,
                        int64_t *T, int64_t *V) {
    if (lg->dtype != XENT_F32 && lg->dtype != XENT_BF16 && lg->dtype != XENT_F16) {
        fprintf(stderr, "xent ce: %s: logits dtype %s is not supported (f32, bf16, f16)\n", a->logits,
                xent_dtype_name(lg->dtype));
        return 1;
    }
    if (lg->ndim != 2 && lg->ndim != 3) {
        fprintf(stderr, "xent ce: %s: logits must be [T, V] or [B, S, V], got %d dimensions\n", a->logits,
                lg->ndim);
        return 1;
    }
    if (lb->dtype != XENT_I32 && lb->dtype != XENT_I64) {
        fprintf(stderr, "xent ce: %s: labels dtype %s is not supported (i32, i64)\n", a->labels,
                xent_dtype_name(lb->dtype));
        return 1;
    }
    *V = lg->shape[lg->ndim - 1];
    *T = lg->ndim == 2 ? lg->shape[0] : lg->shape[0] * lg->shape[1]; /* bounded by the file size */
    int64_t nl = xent_tensor_numel(lb);
    if (lb->ndim < 1 || lb->ndim > 2 || nl != *T) {
        fprintf(stderr, "xent ce: %s: labels must hold T = %lld values ([T] or [B, S]), got %lld in %d dimensions\n",
                a->labels, (long long)*T, (long long)nl, lb->ndim);
        return 1;
    }
    return 0;
}

/* A per-row f32 output tensor shaped like the logits without the last dim. */
static xent_tensor row_tensor(const char *name, float *data, const xent_tensor *lg, int64_t T) {
    xent_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = XENT_F32;
    t.ndim = lg->ndim - 1;
    for (int d = 0; d < t.ndim; d++) t.shape[d] = lg->shape[d];
    t.data = data;
    t.nbytes = (size_t)T * sizeof(float);
    return t;
}

typedef struct ce_bufs {
    float *loss, *nll, *logprob, *lse, *entropy; /* [T] each (loss: [1] if reduced) */
    void *grad;                                  /* [T, V] in grad_dtype            */
} ce_bufs;

static void bufs_free(ce_bufs *b) {
    free(b->loss); free(b->nll); free(b->logprob); free(b->lse); free(b->entropy); free(b->grad);
}

static int bufs_alloc(const ce_args *a, xent_dtype gdt, int64_t T, int64_t V, ce_bufs *b) {
    size_t rows = (size_t)(T ? T : 1) * sizeof(float);
    memset(b, 0, sizeof *b);
    b->loss = malloc(a->o.reduction == XENT_REDUCE_NONE ? rows : sizeof(float));
    b->nll = malloc(rows);
    b->logprob = malloc(rows);
    b->lse = malloc(rows);
    b->entropy = a->entropy ? malloc(rows) : NULL;
    int ok = b->loss && b->nll && b->logprob && b->lse && (!a->entropy || b->entropy);
    if (ok && a->grad) {
        size_t es = xent_dtype_size(gdt);
        ok = V == 0 || (uint64_t)T <= SIZE_MAX / es / (uint64_t)V;
        b->grad = ok ? malloc(T > 0 && V > 0 ? (size_t)T * (size_t)V * es : 1) : NULL;
        ok = b->grad != NULL;
    }
    if (!ok) {
        fprintf(stderr, "xent ce: out of memory for the outputs (T = %lld, V = %lld)\n", (long long)T,
                (long long)V);
        bufs_free(b);
    }
    return ok ? 0 : 1;
}

/* Writes the outputs; returns the exit code. */
static int write_outputs(const ce_args *a, const ce_bufs *b, const xent_tensor *lg, xent_dtype gdt,
                         int64_t T) {
    xent_tensor ts[6];
    int n = 0;
    if (a->o.reduction == XENT_REDUCE_NONE) ts[n++] = row_tensor("loss", b->loss, lg, T);
    else {
        ts[n] = row_tensor("loss", b->loss, lg, 1);
        ts[n++].ndim = 0;
    }
    ts[n++] = row_tensor("nll", b->nll, lg, T);
    ts[n++] = row_tensor("logprob", b->logprob, lg, T);
    ts[n++] = row_tensor("lse", b->lse, lg, T);
    if (a->entropy) ts[n++] = row_tensor("entropy", b->entropy, lg, T);
    if (a->grad) {
        xent_tensor g = *lg;
        snprintf(g.name, sizeof g.name, "grad");
        g.dtype = gdt;
        g.data = b->grad;
        g.nbytes = (size_t)xent_tensor_numel(lg) * xent_dtype_size(gdt);
        ts[n++] = g;
    }
    if (xent_tensors_save(a->out, ts, n) != XENT_OK) {
        fprintf(stderr, "xent ce: --out: %s\n", xent_last_error());
        return 1;
    }
    return 0;
}

static int run(const ce_args *a, const xent_tensor *lg, const xent_tensor *lb) {
    int64_t T, V;
    if (check_inputs(a, lg, lb, &T, &V)) return 1;
    xent_dtype gdt = a->have_grad_dtype ? a->grad_dtype : lg->dtype;
    ce_bufs b;
    if (bufs_alloc(a, gdt, T, V, &b)) return 1;
    int64_t counted = 0, nonfinite = 0;
    xent_ce_input in = {lg->data, lg->dtype, T, V, 0, lb->data, lb->dtype, NULL};
    xent_ce_output out = {b.loss, b.nll, b.logprob, b.lse, b.entropy, NULL, b.grad, gdt, 0,
                          &counted, &nonfinite};
    xent_status st = xent_ce(&in, &a->o, &out);
    if (st != XENT_OK) {
        fprintf(stderr, "xent ce: %s: %s\n", st == XENT_ERR_LABEL ? a->labels : a->logits, xent_last_error());
        bufs_free(&b);
        return 1;
    }
    int rc = write_outputs(a, &b, lg, gdt, T);
    if (rc == 0) {
        double loss = 0;
        if (a->o.reduction != XENT_REDUCE_NONE) loss = b.loss[0];
        else for (int64_t i = 0; i < T; i++) loss += b.loss[i];
        static const char *red[] = {"none: sum of rows", "sum", "mean"};
        printf("xent ce: T=%lld V=%lld loss=%.9g (%s) counted=%lld nonfinite=%lld -> %s\n", (long long)T,
               (long long)V, loss, red[a->o.reduction], (long long)counted, (long long)nonfinite, a->out);
    }
    bufs_free(&b);
    return rc;
}

static int cmd_ce(int argc, char **argv) {
    ce_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    xent_tensor lg, lb;
    if (xent_tensor_load(a.logits, &lg) != XENT_OK) {
        fprintf(stderr, "xent ce: --logits: %s\n", xent_last_error());
        return 1;
    }
    if (xent_tensor_load(a.labels, &lb) != XENT_OK) {
        fprintf(stderr, "xent ce: --labels: %s\n", xent_last_error());
        xent_tensor_free(&lg);
        return 1;
    }
    rc = run(&a, &lg, &lb);
    xent_tensor_free(&lg);
    xent_tensor_free(&lb);
    return rc;
}

XENT_COMMAND(ce, "cross-entropy, log-probs and gradient of a logits file", cmd_ce)
