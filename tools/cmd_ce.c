/* tools/cmd_ce.c: `xent ce`: cross-entropy of a logits file, and
 * `xent logprobs`: processed log-probs (temperature, min-p, top-k, top-p).
 * Both read logits [T, V] (or [B, S, V], flattened to [B*S, V]) and labels
 * [T] (or [B, S]) from .safetensors/.npy. `ce` calls xent_ce and writes
 * loss, nll, logprob, lse, (entropy), (grad); `logprobs` calls
 * xent_sampler_logprobs and writes logprob, logprob_full, kept,
 * log_kept_mass, entropy, flags; each to one .safetensors file or to .npy
 * files. */
#include "cli.h"
#include "input.h"
#include "xent.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ce_args {
    const char *logits, *labels, *out;
    int grad, entropy, allow_nonfinite, reduction, have_grad_dtype;
    int64_t threads;
    xent_dtype grad_dtype;
    xent_ce_opts o;
} ce_args;

static const char *const k_red_names[] = {"none", "sum", "mean", NULL};
static const int k_red_values[] = {XENT_REDUCE_NONE, XENT_REDUCE_SUM, XENT_REDUCE_MEAN};
static const char *const k_grad_dtypes[] = {"f32", "bf16", "f16", NULL};

static const char k_about[] =
    "Exact cross-entropy of a logits file. Inputs: .safetensors or .npy; logits\n"
    "f32/bf16/f16 [T, V] or [B, S, V] (a bf16 .npy is the '<V2' array numpy\n"
    "writes for ml_dtypes.bfloat16; f64 logits are rounded once to f32, the dtype\n"
    "the kernel computes in); labels i32/i64 [T] or [B, S].\n\n"
    "Outputs: loss, nll, logprob, lse (and entropy, grad when asked), f32 (grad:\n"
    "--grad-dtype; a bf16 grad is written to .npy as f32, numpy has no bf16). With\n"
    "--out FILE.safetensors: one file holding every tensor by name. With --out\n"
    "FILE.npy: one file per tensor, FILE.loss.npy, FILE.nll.npy, FILE.logprob.npy,\n"
    "FILE.lse.npy[, FILE.entropy.npy, FILE.grad.npy]; FILE.npy itself is not written.\n"
    "The names are checked before any work: an output that is an input, or a\n"
    "directory that does not exist, is a usage error.\n\n";

static const char k_epilog[] =
    "Prints one line: T, V, loss, counted rows, non-finite rows, the files.\n"
    "A non-finite loss (or a non-finite row) writes the outputs and exits 1\n"
    "unless --allow-nonfinite.\n";

static void ce_cmd(xf_cmd *c, xf_flag *fl, int *nfl, ce_args *a) {
    xf_flag t[] = {
        {"--logits", XF_STRING, &a->logits, "FILE[:NAME]", "logits tensor", NULL, XF_REQUIRED,
         0, 0, NULL, NULL, NULL, NULL, 0},
        {"--labels", XF_STRING, &a->labels, "FILE[:NAME]",
         "target ids, in [0, V) or the ignore index", NULL, XF_REQUIRED, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--out", XF_STRING, &a->out, "FILE", "output .safetensors, or .npy: FILE.NAME.npy each",
         NULL, XF_REQUIRED, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--grad", XF_BOOL, &a->grad, NULL, "also write grad = dL/dlogits", NULL, 0, 0, 0, NULL,
         NULL, NULL, NULL, 0},
        {"--grad-dtype", XF_DTYPE, &a->grad_dtype, NULL, "dtype of grad", "the logits dtype", 0,
         0, 0, k_grad_dtypes, NULL, NULL, NULL, 0},
        {"--entropy", XF_BOOL, &a->entropy, NULL, "also write the per-row entropy", NULL, 0, 0,
         0, NULL, NULL, NULL, NULL, 0},
        {"--ignore-index", XF_INT, &a->o.ignore_index, NULL, "label of rows without a target",
         NULL, 0, 0, 0, NULL, NULL, NULL, "ignore_index", 0},
        {"--reduction", XF_ENUM, &a->reduction, NULL, "loss reduction", NULL, 0, 0, 0,
         k_red_names, k_red_values, NULL, "reduction", 0},
        {"--normalizer", XF_FLOAT, &a->o.normalizer, NULL, "divisor of mean; 0 = counted rows",
         NULL, XF_MIN, 0, 0, NULL, NULL, NULL, "normalizer", 0},
        {"--temperature", XF_FLOAT, &a->o.temperature, NULL, "logits divided by X", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "temperature", 0},
        {"--softcap", XF_FLOAT, &a->o.softcap, NULL, "X * tanh(z / X) before the temperature; 0 = off",
         NULL, XF_MIN, 0, 0, NULL, NULL, NULL, "softcap", 0},
        {"--z-loss", XF_FLOAT, &a->o.z_loss, NULL, "adds X * lse^2 per row", NULL, XF_MIN, 0, 0,
         NULL, NULL, NULL, "z_loss", 0},
        {"--label-smoothing", XF_FLOAT, &a->o.label_smoothing, NULL, "smoothing, in [0, 1]", NULL,
         XF_MIN | XF_MAX, 0, 1, NULL, NULL, NULL, "label_smoothing", 0},
        {"--grad-scale", XF_FLOAT, &a->o.grad_scale, NULL, "upstream gradient of the loss", NULL,
         0, 0, 0, NULL, NULL, NULL, "grad_scale", 0},
        {"--threads", XF_INT, &a->threads, NULL, "worker threads; 0 = XENT_NUM_THREADS or all cores",
         NULL, XF_MIN | XF_MAX, 0, 4096, NULL, NULL, NULL, "threads", 0},
        {"--allow-nonfinite", XF_BOOL, &a->allow_nonfinite, NULL, XENT_CLI_NONFINITE_HELP, NULL, 0,
         0, 0, NULL, NULL, NULL, NULL, 0},
    };
    *nfl = (int)(sizeof t / sizeof t[0]);
    memcpy(fl, t, sizeof t);
    memset(c, 0, sizeof *c);
    c->name = "ce";
    c->usage = "xent ce --logits FILE[:NAME] --labels FILE[:NAME] --out FILE [options]";
    c->about = k_about;
    c->epilog = k_epilog;
    c->flags = fl;
    c->nflags = *nfl;
}

enum { CE_MAX_FLAGS = 24 };

/* --out's form: 1 for NAME.safetensors (one file), 2 for NAME.npy (a
 * file per output), 0 for neither (a usage error). */
static int out_form(const char *out) {
    size_t n = strlen(out);
    if (n > 12 && !strcmp(out + n - 12, ".safetensors")) return 1;
    return n > 4 && !strcmp(out + n - 4, ".npy") ? 2 : 0;
}

/* The output files, in the order written; returns their number. */
static int out_files(const ce_args *a, char names[6][4096]) {
    const char *t[6] = {"loss", "nll", "logprob", "lse", NULL, NULL};
    int n = 4;
    if (out_form(a->out) == 1) { /* one file */
        snprintf(names[0], sizeof names[0], "%s", a->out);
        return 1;
    }
    if (a->entropy) t[n++] = "entropy";
    if (a->grad) t[n++] = "grad";
    for (int k = 0; k < n; k++) xent_cli_out_file(a->out, t[k], n, names[k], sizeof names[k]);
    return n;
}

/* Returns 0 to run, 2 on a usage error, -1 after --help. */
static int parse_args(int argc, char **argv, ce_args *a, xf_cmd *c) {
    static xf_flag fl[CE_MAX_FLAGS];
    int nfl;
    memset(a, 0, sizeof *a);
    xent_ce_opts_init(&a->o);
    a->reduction = (int)a->o.reduction;
    a->threads = a->o.threads;
    a->grad_dtype = XENT_F32;
    ce_cmd(c, fl, &nfl, a);
    int rc = xf_parse(c, argc, argv);
    if (rc) return rc;
    a->o.reduction = (xent_reduction)a->reduction;
    a->o.threads = (int)a->threads;
    a->have_grad_dtype = xf_find(c, "--grad-dtype")->seen > 0;
    if (!out_form(a->out)) {
        fprintf(stderr, "xent ce: --out must end in .safetensors or .npy, got '%s'\n", a->out);
        return 2;
    }
    char files[6][4096], in_l[4096], in_b[4096];
    int nf = out_files(a, files);
    xent_cli_spec_file(a->logits, in_l, sizeof in_l);
    xent_cli_spec_file(a->labels, in_b, sizeof in_b);
    xent_cli_file outs[6], ins[2] = {{"--logits", in_l}, {"--labels", in_b}};
    for (int k = 0; k < nf; k++) outs[k] = (xent_cli_file){"--out", files[k]};
    return xent_cli_check_outputs("ce", outs, nf, ins, 2);
}

/* Checks the loaded inputs; returns 0 or prints a message and returns 1. */
static int check_inputs(const char *cmd, const char *logits, const char *labels,
                        const xent_tensor *lg, const xent_tensor *lb, int64_t *T, int64_t *V) {
    if (lg->dtype != XENT_F32 && lg->dtype != XENT_BF16 && lg->dtype != XENT_F16) {
        fprintf(stderr, "xent %s: --logits %s: dtype %s is not supported (f32, bf16, f16, f64)\n", cmd, logits,
                xent_dtype_name(lg->dtype));
        return 1;
    }
    if (lg->ndim != 2 && lg->ndim != 3) {
        fprintf(stderr, "xent %s: --logits %s: must be [T, V] or [B, S, V], got %d dimensions\n", cmd, logits,
                lg->ndim);
        return 1;
    }
    if (lb->dtype != XENT_I32 && lb->dtype != XENT_I64) {
        fprintf(stderr, "xent %s: --labels %s: dtype %s is not supported (i32, i64)\n", cmd, labels,
                xent_dtype_name(lb->dtype));
        return 1;
    }
    *V = lg->shape[lg->ndim - 1];
    *T = lg->ndim == 2 ? lg->shape[0] : lg->shape[0] * lg->shape[1]; /* bounded by the file size */
    int64_t nl = xent_tensor_numel(lb);
    if (lb->ndim < 1 || lb->ndim > 2 || nl != *T) {
        fprintf(stderr, "xent %s: --labels %s: must hold T = %lld values ([T] or [B, S]), got %lld in %d dimensions\n",
                cmd, labels, (long long)*T, (long long)nl, lb->ndim);
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

/* "o.safetensors" or "o.{loss,nll,logprob,lse}.npy" */
static void files_text(const ce_args *a, char *buf, size_t cap) {
    size_t n = strlen(a->out);
    if (out_form(a->out) == 1) {
        snprintf(buf, cap, "%s", a->out);
        return;
    }
    snprintf(buf, cap, "%.*s.{loss,nll,logprob,lse%s%s}.npy", (int)(n - 4), a->out,
             a->entropy ? ",entropy" : "", a->grad ? ",grad" : "");
}

static int run(const ce_args *a, const xf_cmd *c, const xent_tensor *lg, const xent_tensor *lb) {
    int64_t T, V;
    if (check_inputs("ce", a->logits, a->labels, lg, lb, &T, &V)) return 1;
    xent_dtype gdt = a->have_grad_dtype ? a->grad_dtype : lg->dtype;
    ce_bufs b;
    if (bufs_alloc(a, gdt, T, V, &b)) return 1;
    int64_t counted = 0, nonfinite = 0;
    xent_ce_input in = {lg->data, lg->dtype, T, V, 0, lb->data, lb->dtype, NULL};
    xent_ce_output out = {b.loss, b.nll, b.logprob, b.lse, b.entropy, NULL, b.grad, gdt, 0,
                          &counted, &nonfinite};
    xent_status st = xent_ce(&in, &a->o, &out);
    if (st != XENT_OK) {
        char what[4200];
        snprintf(what, sizeof what, "%s %s", st == XENT_ERR_LABEL ? "--labels" : "--logits",
                 st == XENT_ERR_LABEL ? a->labels : a->logits);
        xf_lib_error(c, what);
        bufs_free(&b);
        return 1;
    }
    int rc = write_outputs(a, &b, lg, gdt, T);
    if (rc == 0) {
        double loss = 0;
        if (a->o.reduction != XENT_REDUCE_NONE) loss = b.loss[0];
        else for (int64_t i = 0; i < T; i++) loss += b.loss[i];
        static const char *red[] = {"none: sum of rows", "sum", "mean"};
        char files[4200];
        files_text(a, files, sizeof files);
        printf("xent ce: T=%lld V=%lld loss=%.9g (%s) counted=%lld nonfinite=%lld -> %s\n", (long long)T,
               (long long)V, loss, red[a->o.reduction], (long long)counted, (long long)nonfinite, files);
        if ((!isfinite(loss) || nonfinite > 0) && !a->allow_nonfinite) {
            fprintf(stderr, "xent ce: the loss is %g with %lld non-finite row%s (outputs written); "
                    "exit 1 (--allow-nonfinite accepts it)\n", loss, (long long)nonfinite,
                    nonfinite == 1 ? "" : "s");
            rc = 1;
        }
    }
    bufs_free(&b);
    return rc;
}

/* Loads --logits (as f32 when it is f64) and --labels, then runs
 * fn(args, cmd, logits, labels); 1 when a file cannot be read. */
typedef int (*run_fn)(void *args, xf_cmd *c, xent_tensor *lg, xent_tensor *lb);
static int with_inputs(const char *cmd, const char *logits, const char *labels, run_fn fn,
                       void *args, xf_cmd *c) {
    xent_tensor lg, lb;
    if (xent_cli_load(cmd, "--logits", logits, &lg)) return 1;
    if (xent_cli_to_f32(cmd, &lg)) { xent_tensor_free(&lg); return 1; }
    if (xent_cli_load(cmd, "--labels", labels, &lb)) {
        xent_tensor_free(&lg);
        return 1;
    }
    int rc = fn(args, c, &lg, &lb);
    xent_tensor_free(&lg);
    xent_tensor_free(&lb);
    return rc;
}

static int run_ce(void *a, xf_cmd *c, xent_tensor *lg, xent_tensor *lb) { return run(a, c, lg, lb); }

static int cmd_ce(int argc, char **argv) {
    ce_args a;
    xf_cmd c;
    int rc = parse_args(argc, argv, &a, &c);
    if (rc) return rc < 0 ? 0 : rc;
    return with_inputs("ce", a.logits, a.labels, run_ce, &a, &c);
}

XENT_COMMAND(ce, "cross-entropy, log-probs and gradient of a logits file", cmd_ce)

/* ---- xent logprobs --------------------------------------------------------- */

typedef struct lp_args {
    const char *logits, *labels, *out;
    int allow_nonfinite;
    int64_t threads;
    xent_sampler_opts o;
} lp_args;

/* The outputs, in the order written (every one, always). */
enum { LP_NOUT = 6 };
static const char *const k_lp_names[LP_NOUT] = {"logprob", "logprob_full", "kept",
                                                "log_kept_mass", "entropy", "flags"};

static const char k_lp_about[] =
    "Processed log-probs of a logits file: the log-prob of each label under the\n"
    "distribution a sampler draws from after temperature, min-p, top-k and top-p\n"
    "(vLLM's v1 sampler order and tie rule), renormalized over the kept tokens\n"
    "(xent_sampler_logprobs; the rules and the error bound: docs/sampler.md).\n"
    "Inputs as for `xent ce`: logits f32/bf16/f16 (f64 rounded once to f32)\n"
    "[T, V] or [B, S, V]; labels i32/i64 [T] or [B, S].\n\n"
    "Outputs, one value a row, shaped like the labels:\n"
    "  logprob        f32  log q(label) over the kept set; -inf when the label is\n"
    "                      outside it (counted: 'dropped'); 0 on ignored rows\n"
    "  logprob_full   f32  log softmax(logits / temperature)(label); 0 if ignored\n"
    "  kept           i64  size of the kept set\n"
    "  log_kept_mass  f32  log of the mass the kept set holds (<= 0)\n"
    "  entropy        f32  entropy of the processed distribution\n"
    "  flags          i32  bits: 1 min-p cut within rounding, 2 top-p cut within\n"
    "                      rounding (or --boundary-tol), 4 top-p cut inside a tie\n"
    "                      group, 8 top-k kept more than K (ties), 16 the label's\n"
    "                      own membership is one of these undecided cases\n"
    "With --out FILE.safetensors: one file holding every tensor by name. With\n"
    "--out FILE.npy: FILE.logprob.npy, FILE.logprob_full.npy, FILE.kept.npy,\n"
    "FILE.log_kept_mass.npy, FILE.entropy.npy, FILE.flags.npy; FILE.npy itself is\n"
    "not written. The names are checked before any work: an output that is an\n"
    "input, or a directory that does not exist, is a usage error.\n\n";

static const char k_lp_epilog[] =
    "Prints one line: T, V, counted rows, dropped (labels outside the kept set:\n"
    "logprob -inf; not an error), ambiguous (rows with flag 1, 2 or 4), non-finite\n"
    "rows, the sum of logprob over the kept labels, the files. A label outside\n"
    "[0, V) (not the ignore index) exits 1 and writes nothing; a row with a NaN or\n"
    "infinite logit writes the outputs (NaN on that row) and exits 1 unless\n"
    "--allow-nonfinite.\n";

static void lp_cmd(xf_cmd *c, xf_flag *fl, int *nfl, lp_args *a) {
    xf_flag t[] = {
        {"--logits", XF_STRING, &a->logits, "FILE[:NAME]", "logits tensor", NULL, XF_REQUIRED,
         0, 0, NULL, NULL, NULL, NULL, 0},
        {"--labels", XF_STRING, &a->labels, "FILE[:NAME]",
         "target ids, in [0, V) or the ignore index", NULL, XF_REQUIRED, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--out", XF_STRING, &a->out, "FILE", "output .safetensors, or .npy: FILE.NAME.npy each",
         NULL, XF_REQUIRED, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--temperature", XF_FLOAT, &a->o.temperature, NULL, "logits divided by X", NULL,
         XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "temperature", 0},
        {"--top-k", XF_INT, &a->o.top_k, "K", "keep the K largest (and ties with the K-th); 0 = off",
         NULL, XF_MIN, 0, 0, NULL, NULL, NULL, "top_k", 0},
        {"--top-p", XF_FLOAT, &a->o.top_p, "P",
         "keep the fewest largest whose mass is >= P, in (0, 1]; 1 = off", NULL,
         XF_MIN | XF_MAX | XF_LO_OPEN, 0, 1, NULL, NULL, NULL, "top_p", 0},
        {"--min-p", XF_FLOAT, &a->o.min_p, "P",
         "keep p >= P * max p, in [0, 1); 0 = off", NULL, XF_MIN | XF_MAX | XF_HI_OPEN, 0, 1,
         NULL, NULL, NULL, "min_p", 0},
        {"--boundary-tol", XF_FLOAT, &a->o.boundary_tol, "X",
         "also flag cuts a relative change X of the probabilities could move,\n"
         "in [0, 1) (e.g. 1e-6: rows where an fp32 sampler may disagree)",
         NULL, XF_MIN | XF_MAX | XF_HI_OPEN, 0, 1, NULL, NULL, NULL, "boundary_tol", 0},
        {"--ignore-index", XF_INT, &a->o.ignore_index, NULL, "label of rows without a target",
         NULL, 0, 0, 0, NULL, NULL, NULL, "ignore_index", 0},
        {"--threads", XF_INT, &a->threads, NULL, "worker threads; 0 = XENT_NUM_THREADS or all cores",
         NULL, XF_MIN | XF_MAX, 0, 4096, NULL, NULL, NULL, "threads", 0},
        {"--allow-nonfinite", XF_BOOL, &a->allow_nonfinite, NULL, XENT_CLI_NONFINITE_HELP, NULL, 0,
         0, 0, NULL, NULL, NULL, NULL, 0},
    };
    *nfl = (int)(sizeof t / sizeof t[0]);
    memcpy(fl, t, sizeof t);
    memset(c, 0, sizeof *c);
    c->name = "logprobs";
    c->usage = "xent logprobs --logits FILE[:NAME] --labels FILE[:NAME] --out FILE [options]";
    c->about = k_lp_about;
    c->epilog = k_lp_epilog;
    c->flags = fl;
    c->nflags = *nfl;
}

/* Returns 0 to run, 2 on a usage error, -1 after --help. */
static int lp_parse_args(int argc, char **argv, lp_args *a, xf_cmd *c) {
    static xf_flag fl[CE_MAX_FLAGS];
    int nfl;
    memset(a, 0, sizeof *a);
    xent_sampler_opts_init(&a->o);
    a->threads = a->o.threads;
    lp_cmd(c, fl, &nfl, a);
    int rc = xf_parse(c, argc, argv);
    if (rc) return rc;
    a->o.threads = (int)a->threads;
    if (!out_form(a->out)) {
        fprintf(stderr, "xent logprobs: --out must end in .safetensors or .npy, got '%s'\n", a->out);
        return 2;
    }
    char files[LP_NOUT][4096], in_l[4096], in_b[4096];
    int nf = out_form(a->out) == 1 ? 1 : LP_NOUT;
    for (int k = 0; k < nf; k++) xent_cli_out_file(a->out, k_lp_names[k], nf, files[k], sizeof files[k]);
    xent_cli_spec_file(a->logits, in_l, sizeof in_l);
    xent_cli_spec_file(a->labels, in_b, sizeof in_b);
    xent_cli_file outs[LP_NOUT], ins[2] = {{"--logits", in_l}, {"--labels", in_b}};
    for (int k = 0; k < nf; k++) outs[k] = (xent_cli_file){"--out", files[k]};
    return xent_cli_check_outputs("logprobs", outs, nf, ins, 2);
}

typedef struct lp_bufs {
    float *logprob, *full, *lkm, *entropy;
    int64_t *kept;
    int32_t *flags;
} lp_bufs;

static void lp_bufs_free(lp_bufs *b) {
    free(b->logprob); free(b->full); free(b->lkm); free(b->entropy); free(b->kept); free(b->flags);
}

static int lp_run(const lp_args *a, const xf_cmd *c, const xent_tensor *lg, const xent_tensor *lb) {
    int64_t T, V;
    if (check_inputs("logprobs", a->logits, a->labels, lg, lb, &T, &V)) return 1;
    size_t rows = (size_t)(T ? T : 1);
    lp_bufs b = {malloc(rows * 4), malloc(rows * 4), malloc(rows * 4), malloc(rows * 4),
                 malloc(rows * 8), malloc(rows * 4)};
    if (!b.logprob || !b.full || !b.lkm || !b.entropy || !b.kept || !b.flags) {
        fprintf(stderr, "xent logprobs: out of memory for the outputs (T = %lld)\n", (long long)T);
        lp_bufs_free(&b);
        return 1;
    }
    int64_t counted = 0, dropped = 0, ambiguous = 0, nonfinite = 0;
    xent_ce_input in = {lg->data, lg->dtype, T, V, 0, lb->data, lb->dtype, NULL};
    xent_sampler_output out = {b.logprob, b.full, b.kept, b.lkm, b.entropy, b.flags,
                               &counted, &dropped, &ambiguous, &nonfinite};
    xent_status st = xent_sampler_logprobs(&in, &a->o, &out);
    if (st != XENT_OK) {
        char what[4200];
        snprintf(what, sizeof what, "%s %s", st == XENT_ERR_LABEL ? "--labels" : "--logits",
                 st == XENT_ERR_LABEL ? a->labels : a->logits);
        xf_lib_error(c, what);
        lp_bufs_free(&b);
        return 1;
    }
    xent_tensor ts[LP_NOUT];
    void *data[LP_NOUT] = {b.logprob, b.full, b.kept, b.lkm, b.entropy, b.flags};
    xent_dtype dts[LP_NOUT] = {XENT_F32, XENT_F32, XENT_I64, XENT_F32, XENT_F32, XENT_I32};
    for (int k = 0; k < LP_NOUT; k++) {
        ts[k] = row_tensor(k_lp_names[k], data[k], lg, T);
        ts[k].dtype = dts[k];
        ts[k].nbytes = (size_t)T * xent_dtype_size(dts[k]);
    }
    int rc = 0;
    if (xent_tensors_save(a->out, ts, LP_NOUT) != XENT_OK) {
        fprintf(stderr, "xent logprobs: --out: %s\n", xent_last_error());
        rc = 1;
    }
    if (rc == 0) {
        double sum = 0; /* over the counted rows whose label is kept */
        for (int64_t i = 0; i < T; i++)
            if (!isinf(b.logprob[i])) sum += b.logprob[i];
        char files[4200];
        size_t n = strlen(a->out);
        if (out_form(a->out) == 1) snprintf(files, sizeof files, "%s", a->out);
        else
            snprintf(files, sizeof files, "%.*s.{logprob,logprob_full,kept,log_kept_mass,entropy,flags}.npy",
                     (int)(n - 4), a->out);
        printf("xent logprobs: T=%lld V=%lld counted=%lld dropped=%lld ambiguous=%lld nonfinite=%lld "
               "sum_logprob=%.9g -> %s\n", (long long)T, (long long)V, (long long)counted,
               (long long)dropped, (long long)ambiguous, (long long)nonfinite, sum, files);
        if (nonfinite > 0 && !a->allow_nonfinite) {
            fprintf(stderr, "xent logprobs: %lld row%s with a NaN or infinite logit (outputs written); "
                    "exit 1 (--allow-nonfinite accepts it)\n", (long long)nonfinite,
                    nonfinite == 1 ? "" : "s");
            rc = 1;
        }
    }
    lp_bufs_free(&b);
    return rc;
}

static int run_lp(void *a, xf_cmd *c, xent_tensor *lg, xent_tensor *lb) { return lp_run(a, c, lg, lb); }

static int cmd_logprobs(int argc, char **argv) {
    lp_args a;
    xf_cmd c;
    int rc = lp_parse_args(argc, argv, &a, &c);
    if (rc) return rc < 0 ? 0 : rc;
    return with_inputs("logprobs", a.logits, a.labels, run_lp, &a, &c);
}

XENT_COMMAND(logprobs, "processed log-probs (temperature, top-k, top-p, min-p) of a logits file",
             cmd_logprobs)
