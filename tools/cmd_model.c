/* tools/cmd_model.c: `xent model info|tokenize|export|loss|bench`. */
#include "cli.h"
#include "input.h"
#include "model/model.h"
#include "xent/io.h"
#include "core/xent_math.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void openblas_set_num_threads(int num_threads);

static const char k_about[] =
    "MODEL is a GGUF file or a Hugging Face checkpoint directory\n"
    "(config.json + model.safetensors or shards with model.safetensors.index.json,\n"
    "tokenizer.json), or random:smollm2-135m (SmolLM2-135M's shapes, random\n"
    "weights, for timing); with --init random --config FILE|NAME, MODEL is left\n"
    "out and the weights are random at the shapes of the configuration (the\n"
    "family's initializer). `make model` prints the default.\n\n"
    "actions:\n"
    "  info                    print the configuration and parameters\n"
    "  tokenize                print the token ids of --text or --file\n"
    "  export                  write an HF checkpoint directory --out\n"
    "  loss                    forward + backward on --text/--file; print the loss\n"
    "  bench                   time one fp32 forward + backward next to sgemm\n"
    "  dump                    forward + backward on --text/--file; write --out\n"
    "                          .safetensors: tokens, logits, logprobs, loss and\n"
    "                          grad.NAME for every parameter (HF names)\n\n";

static const char k_epilog[] =
    "--out is checked before the model is loaded (its directory must exist).\n"
    "A non-finite loss (loss, dump, bench) exits 1 unless --allow-nonfinite.\n";

static const char *const k_actions[] = {"info", "tokenize", "export", "loss", "bench", "dump"};
static const char *const k_dtypes[] = {"f32", "bf16", "f16", NULL};
static const char *const k_inits[] = {"checkpoint", "random", NULL};
static char g_config_help[256];

typedef struct {
    const char *action, *model, *text, *file, *out, *config;
    int decode, allow_nonfinite, init;
    xent_dtype dtype;
    int64_t tokens, seq, reps, threads;
} margs;

/* Returns 0 to run, 2 on a usage error, -1 after --help. */
static int parse(int argc, char **argv, margs *a, int *act) {
    static xf_flag fl[16];
    static const char *pos[2];
    memset(a, 0, sizeof *a);
    a->dtype = XENT_F32;
    a->tokens = 512;
    a->reps = 3;
    snprintf(g_config_help, sizeof g_config_help,
             "--init random: a config.json (or its directory) or\na built-in: %s",
             xent_model_config_builtins());
    xf_flag t[] = {
        {"--init", XF_ENUM, &a->init, NULL,
         "checkpoint: load MODEL; random: random weights at\nthe shapes of --config", NULL, 0,
         0, 0, k_inits, NULL, NULL, NULL, 0},
        {"--config", XF_STRING, &a->config, "FILE|NAME", g_config_help, "none", 0, 0, 0, NULL,
         NULL, NULL, NULL, 0},
        {"--text", XF_STRING, &a->text, "STR", "input text (tokenize, loss, dump)", NULL, 0, 0, 0,
         NULL, NULL, NULL, NULL, 0},
        {"--file", XF_STRING, &a->file, "PATH", "input text file (tokenize, loss, dump)", NULL, 0,
         0, 0, NULL, NULL, NULL, NULL, 0},
        {"--decode", XF_BOOL, &a->decode, NULL, "tokenize: also print the decoded text", NULL, 0,
         0, 0, NULL, NULL, NULL, NULL, 0},
        {"--out", XF_STRING, &a->out, "PATH",
         "export: output directory; dump: .safetensors file\n(required for both)", NULL,
         XF_NO_DEFAULT, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--dtype", XF_DTYPE, &a->dtype, NULL, "export: tensor dtype", NULL, 0, 0, 0, k_dtypes,
         NULL, NULL, NULL, 0},
        {"--tokens", XF_INT, &a->tokens, NULL, "bench: tokens in the batch", NULL, XF_MIN, 1, 0,
         NULL, NULL, NULL, NULL, 0},
        {"--seq", XF_INT, &a->seq, NULL, "loss/bench/dump: sequence length; rows = tokens / seq",
         "0: all tokens in one row", XF_MIN, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--reps", XF_INT, &a->reps, NULL, "bench: timed repetitions", NULL, XF_MIN | XF_MAX, 1,
         1000, NULL, NULL, NULL, NULL, 0},
        {"--threads", XF_INT, &a->threads, NULL, "threads; 0 = XENT_NUM_THREADS or all cores",
         NULL, XF_MIN | XF_MAX, 0, 256, NULL, NULL, NULL, "threads", 0},
        {"--allow-nonfinite", XF_BOOL, &a->allow_nonfinite, NULL, XENT_CLI_NONFINITE_HELP, NULL,
         0, 0, 0, NULL, NULL, NULL, NULL, 0},
    };
    memcpy(fl, t, sizeof t);
    xf_cmd c = {"model", "xent model ACTION MODEL [options]", k_about, k_epilog, fl,
                (int)(sizeof t / sizeof t[0]), 0, "ACTION MODEL", 1, 2, pos, 0};
    pos[0] = pos[1] = NULL;
    int rc = xf_parse(&c, argc, argv);
    if (rc) return rc;
    a->action = pos[0];
    a->model = pos[1];
    if (a->init == 1 && (!a->config || a->model)) {
        fprintf(stderr, "xent model: --init random needs --config FILE|NAME and no MODEL "
                "(built in: %s)\n", xent_model_config_builtins());
        return 2;
    }
    if (a->init == 0 && (a->config || !a->model)) {
        fprintf(stderr, a->config ? "xent model: --config is for --init random\n"
                                  : "xent model: takes ACTION MODEL, got 1 argument (or ACTION "
                                    "--init random --config FILE|NAME; see xent model --help)\n");
        return 2;
    }
    *act = -1;
    for (int i = 0; i < 6; i++)
        if (!strcmp(a->action, k_actions[i])) *act = i;
    if (*act < 0) {
        fprintf(stderr, "xent model: unknown action '%s'; accepted: info, tokenize, export, "
                "loss, bench, dump\n", a->action);
        return 2;
    }
    if ((*act == 2 || *act == 5) && !a->out) {
        fprintf(stderr, "xent model %s: needs --out\n", a->action);
        return 2;
    }
    if ((*act == 1 || *act == 3 || *act == 5) && !a->text && !a->file) {
        fprintf(stderr, "xent model %s: needs --text or --file\n", a->action);
        return 2;
    }
    if (a->text && a->file) {
        fprintf(stderr, "xent model: --text and --file %s: give one of them\n", a->file);
        return 2;
    }
    if (*act == 5) {
        xent_cli_file outs[1] = {{"--out", a->out}}, ins[2] = {{"MODEL", a->model}, {"--file", a->file}};
        return xent_cli_check_outputs("model", outs, 1, ins, 2);
    }
    if (*act == 2) { /* a directory: its parent must exist */
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", a->out);
        size_t n = strlen(parent);
        while (n > 1 && parent[n - 1] == '/') parent[--n] = '\0';
        char *slash = strrchr(parent, '/');
        if (slash) *(slash == parent ? slash + 1 : slash) = '\0';
        else snprintf(parent, sizeof parent, ".");
        if (access(parent, W_OK) != 0) {
            fprintf(stderr, "xent model export: --out %s: the directory '%s' does not exist or "
                    "is not writable\n", a->out, parent);
            return 2;
        }
    }
    return 0;
}

/* 1 with a message when the loss is not finite and that is not allowed. */
static int nonfinite_loss(const margs *a, double loss) {
    if (isfinite(loss) || a->allow_nonfinite) return 0;
    fprintf(stderr, "xent model %s: the loss is %g; exit 1 (--allow-nonfinite accepts it)\n",
            a->action, loss);
    return 1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(const char *what, xent_status st) {
    fprintf(stderr, "xent model %s: %s: %s\n", what, xent_strerror(st),
            xent_last_error());
    return 1;
}

static int do_info(const xent_model *m) {
    const xent_model_config *c = &m->cfg;
    printf("source        %s (%s)\n", m->source, m->source_type);
    printf("arch          %s\nlayers        %lld\ndim           %lld\n"
           "hidden        %lld\nheads         %lld (kv %lld, head_dim %lld)\n"
           "vocab         %lld\nmax_seq       %lld\nrope_theta    %g%s\n"
           "norm_eps      %g\ntied_head     %d\nqkv_bias      %d\n",
           c->arch, (long long)c->n_layers, (long long)c->dim,
           (long long)c->hidden, (long long)c->n_heads,
           (long long)c->n_kv_heads, (long long)c->head_dim,
           (long long)c->vocab, (long long)c->max_seq, c->rope_theta,
           c->rope_scaling == XENT_ROPE_LLAMA3   ? " (llama3 scaling)"
           : c->rope_scaling == XENT_ROPE_LINEAR ? " (linear scaling)"
                                                 : "",
           c->norm_eps, c->tied_head, c->qkv_bias);
    printf("features      qk_norm %d, sandwich_norm %d, norm 1+w %d, %s MLP, embed_scale %d\n",
           c->qk_norm, c->sandwich_norm, c->norm_plus_one, c->gelu_tanh ? "GeGLU (gelu tanh)" : "SwiGLU",
           c->embed_scale);
    if (c->sliding_window > 0 && c->swa_pattern > 0)
        printf("sliding       window %lld on %s\n", (long long)c->sliding_window,
               c->swa_pattern == 1 ? "every layer" : "layers l with (l + 1) % k != 0");
    if (c->attn_softcap > 0 || c->final_softcap > 0 || c->query_scalar > 0 || c->rope_local_theta > 0)
        printf("attention     scale 1/sqrt(%g), softcap %g, final softcap %g, local rope %g\n",
               c->query_scalar > 0 ? c->query_scalar : (double)c->head_dim, c->attn_softcap,
               c->final_softcap, c->rope_local_theta);
    printf("parameters    %lld in %d tensors\n",
           (long long)xent_model_n_weights(m), m->n_params);
    if (m->tok)
        printf("tokenizer     byte-level BPE, %lld tokens, pre '%s'\n",
               (long long)xent_tokenizer_vocab(m->tok),
               xent_tokenizer_pre(m->tok));
    else
        printf("tokenizer     none%s%s\n", m->tok_note[0] ? ": " : "", m->tok_note);
    if (m->random_weights)
        printf("weights       RANDOM (initializer normal(0, %g)), not a trained model\n",
               c->init_std > 0 ? c->init_std : 0.02);
    return 0;
}

static int read_text(const margs *a, char **text, size_t *len) {
    if (a->text) {
        *len = strlen(a->text);
        *text = malloc(*len + 1);
        if (!*text) return 1;
        memcpy(*text, a->text, *len + 1);
        return 0;
    }
    if (!a->file) {
        fprintf(stderr, "xent model: needs --text or --file\n");
        return 2;
    }
    uint64_t n = 0;
    FILE *f = xent_file_open(a->file, &n); /* a regular file only: never blocks */
    if (!f) {
        fprintf(stderr, "xent model: --file %s\n", xent_last_error());
        return 1;
    }
    *text = n < ((uint64_t)1 << 40) ? malloc((size_t)n + 1) : NULL;
    *len = *text ? fread(*text, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!*text || *len != (size_t)n) {
        fprintf(stderr, "xent model: --file %s: %s\n", a->file,
                *text ? "read failed" : "out of memory");
        free(*text);
        *text = NULL;
        return 1;
    }
    (*text)[*len] = 0;
    return 0;
}

static int tokens_of(const xent_model *m, const margs *a, int32_t **ids,
                     int64_t *n) {
    if (!m->tok) {
        fprintf(stderr, "xent model: %s has no tokenizer%s%s\n", m->source,
                m->tok_note[0] ? ": " : "", m->tok_note);
        return 1;
    }
    char *text;
    size_t len;
    int rc = read_text(a, &text, &len);
    if (rc) return rc;
    xent_status st = xent_tokenize(m->tok, text, len, ids, n);
    free(text);
    return st ? fail("tokenize", st) : 0;
}

static int do_tokenize(const xent_model *m, const margs *a) {
    int32_t *ids;
    int64_t n;
    int rc = tokens_of(m, a, &ids, &n);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    if (a->decode) {
        char *t;
        xent_status st = xent_detokenize(m->tok, ids, n, &t, NULL);
        if (st) rc = fail("decode", st);
        else printf("%s\n", t), free(t);
    }
    free(ids);
    return rc;
}

/* One run; prints loss and timing. */
static int run_once(const xent_model *m, const int32_t *ids, int64_t B,
                    int64_t S, int threads, int reps, double *secs,
                    double *loss) {
    xent_model_ws *ws;
    xent_status st = xent_model_ws_new(m, B, S, 0, &ws);
    if (st) return fail("workspace", st);
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = ids, o.threads = threads;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        double t0 = now();
        st = xent_model_run(m, ws, &p, &o, &r);
        double t = now() - t0;
        if (st) break;
        best = t < best ? t : best;
    }
    xent_model_ws_free(ws);
    if (st) return fail("run", st);
    *secs = best;
    *loss = r.loss;
    return 0;
}

static int do_loss(const xent_model *m, const margs *a) {
    int32_t *ids;
    int64_t n;
    int rc = tokens_of(m, a, &ids, &n);
    if (rc) return rc;
    if (n < 2) {
        fprintf(stderr, "xent model loss: the text gives %lld token(s); at least 2 are needed\n", (long long)n);
        free(ids);
        return 1;
    }
    int64_t S = a->seq > 0 && a->seq < n ? a->seq : n, B = n / S;
    double secs, loss;
    rc = run_once(m, ids, B, S, (int)a->threads, 1, &secs, &loss);
    if (!rc)
        printf("tokens %lld (B %lld, S %lld)  loss %.9g  time %.3f s\n",
               (long long)(B * S), (long long)B, (long long)S, loss, secs);
    free(ids);
    return rc ? rc : nonfinite_loss(a, loss);
}

static xent_tensor mk(const char *name, xent_dtype dt, void *data, int ndim,
                      int64_t d0, int64_t d1) {
    xent_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.data = data;
    t.nbytes = (size_t)(d0 * (ndim == 2 ? d1 : 1)) * xent_dtype_size(dt);
    return t;
}

/* fp32 forward + backward with recording; everything to one file. */
static int do_dump(const xent_model *m, const margs *a) {
    int32_t *ids;
    int64_t n;
    int rc = tokens_of(m, a, &ids, &n);
    if (rc) return rc;
    if (n < 2) {
        fprintf(stderr, "xent model dump: the text gives %lld token(s); at least 2 are needed\n", (long long)n);
        free(ids);
        return 1;
    }
    int64_t S = a->seq > 0 && a->seq < n ? a->seq : n, B = n / S, T = B * S;
    xent_model_ws *ws = NULL;
    xent_status st = xent_model_ws_new(m, B, S, 1, &ws);
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = ids, o.record = 1, o.threads = (int)a->threads;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    if (!st) st = xent_model_run(m, ws, &p, &o, &r);
    xent_tensor *ts = st ? NULL : calloc((size_t)m->n_params + 4, sizeof *ts);
    if (!st && ts) {
        double loss = r.loss;
        ts[0] = mk("tokens", XENT_I32, ids, 1, T, 0);
        ts[1] = mk("logits", XENT_F32, r.logits, 2, T, m->cfg.vocab);
        ts[2] = mk("logprobs", XENT_F32, r.logprobs, 1, T, 0);
        ts[3] = mk("loss", XENT_F64, &loss, 1, 1, 0);
        for (int i = 0; i < m->n_params; i++) {
            char nm[128];
            snprintf(nm, sizeof nm, "grad.%s", m->params[i].name);
            ts[4 + i] = mk(nm, XENT_F32, r.param_grads[i], m->params[i].ndim,
                           m->params[i].shape[0], m->params[i].shape[1]);
        }
        st = xent_tensors_save(a->out, ts, m->n_params + 4);
        if (!st) {
            printf("tokens %lld  loss %.9g -> %s\n", (long long)T, loss, a->out);
            rc = nonfinite_loss(a, loss);
        }
    }
    if (st) rc = fail("dump", st);
    free(ts);
    xent_model_ws_free(ws);
    free(ids);
    return rc;
}

/* sgemm rate on [M, K] x [N, K]^T, GFLOP/s: one warm-up call, then the
 * best of 3 timings of as many calls as fill >= 0.3 s. */
static double sgemm_rate(int64_t M, int64_t N, int64_t K) {
    float *A = calloc((size_t)(M * K), 4), *Bm = calloc((size_t)(K * N), 4),
          *C = calloc((size_t)(M * N), 4);
    double best = 0;
    for (int64_t i = 0; A && i < M * K; i++) A[i] = (float)(i % 7) - 3;
    for (int64_t i = 0; Bm && i < K * N; i++) Bm[i] = (float)(i % 5) - 2;
    int calls = 1;
    for (int k = 0; A && Bm && C && k < 4; k++) {
        double t0 = now();
        for (int c = 0; c < calls; c++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M,
                        (int)N, (int)K, 1.0f, A, (int)K, Bm, (int)K, 0.0f, C,
                        (int)N);
        double t = now() - t0;
        if (k == 0) { /* warm-up: size the timed loops */
            calls = (int)(0.3 / (t > 1e-6 ? t : 1e-6)) + 1;
            continue;
        }
        double g = 2.0 * (double)M * (double)N * (double)K * calls / t / 1e9;
        best = g > best ? g : best;
    }
    free(A), free(Bm), free(C);
    return best;
}

static int do_bench(const xent_model *m, const margs *a) {
    int64_t T = a->tokens > 0 ? a->tokens : 512;
    int64_t S = a->seq > 0 && a->seq < T ? a->seq : T, B = T / S;
    int32_t *ids = malloc((size_t)(B * S) * sizeof *ids);
    if (!ids) return 1;
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < B * S; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)m->cfg.vocab);
    }
    int thr = (int)(a->threads > 0 ? a->threads : 0);
    openblas_set_num_threads(xent_num_threads(thr));
    const xent_model_config *c = &m->cfg;
    double g1 = sgemm_rate(B * S, c->hidden, c->dim);
    double g2 = sgemm_rate(B * S, c->vocab, c->dim);
    double g3 = sgemm_rate(2048, 2048, 2048);
    double secs, loss;
    int rc = run_once(m, ids, B, S, thr, (int)(a->reps > 0 ? a->reps : 1),
                      &secs, &loss);
    free(ids);
    if (rc) return rc;
    double fl = xent_model_flops(c, B, S, 1);
    double ref = g1 > g3 ? g1 : g3;
    printf("model         %s (%lld parameters)\n", m->source,
           (long long)xent_model_n_weights(m));
    printf("step          fp32 forward + backward, B %lld x S %lld, threads %d\n",
           (long long)B, (long long)S, xent_num_threads(thr));
    printf("time          %.3f s (best of %lld), loss %.6g\n", secs,
           (long long)a->reps, loss);
    printf("work          %.2f GFLOP -> %.1f GFLOP/s\n", fl / 1e9,
           fl / secs / 1e9);
    printf("sgemm         %.1f GFLOP/s [T,D]x[D,H]; %.1f [T,D]x[D,V]; "
           "%.1f 2048^3\n", g1, g2, g3);
    printf("ratio         %.0f%% of max(sgemm [T,D]x[D,H], 2048^3)\n",
           100.0 * fl / secs / 1e9 / ref);
    return nonfinite_loss(a, loss);
}

/* SmolLM2-135M's shapes with random weights (timing without the file). */
static xent_status random_smollm2(xent_model **out) {
    xent_model_config c;
    xent_model_config_init(&c);
    c.n_layers = 30, c.dim = 576, c.hidden = 1536, c.n_heads = 9;
    c.n_kv_heads = 3, c.head_dim = 64, c.vocab = 49152, c.max_seq = 8192;
    c.rope_theta = 100000.0, c.tied_head = 1;
    xent_status st = xent_model_new(&c, out);
    if (st) return st;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < (*out)->n_params; i++) {
        xent_param *p = &(*out)->params[i];
        float sd = p->ndim == 2 ? 0.04f : 0.0f;
        for (int64_t k = 0; k < p->numel; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            p->w[k] = (p->ndim == 1 ? 1.0f : 0.0f) +
                      sd * ((float)(x >> 40) / 16777216.0f - 0.5f);
        }
    }
    snprintf((*out)->source, sizeof (*out)->source, "random:smollm2-135m");
    return XENT_OK;
}

static int cmd_model(int argc, char **argv) {
    margs a;
    int act;
    int rc = parse(argc, argv, &a, &act);
    if (rc) return rc < 0 ? 0 : rc;
    xent_model *m;
    xent_status st;
    if (a.init == 1) {
        xent_model_config c;
        st = xent_model_config_named(a.config, &c);
        if (!st) st = xent_model_init_random(&c, 0, &m);
        if (!st)
            snprintf(m->source, sizeof m->source, "random weights, %s (%s)", a.config, c.arch);
    } else {
        st = !strcmp(a.model, "random:smollm2-135m") ? random_smollm2(&m)
                                                      : xent_model_load(a.model, &m);
    }
    if (st) return fail("load", st);
    switch (act) {
    case 0: rc = do_info(m); break;
    case 1: rc = do_tokenize(m, &a); break;
    case 2:
        st = xent_model_save_hf(m, a.out, a.dtype);
        rc = st ? fail("export", st) : 0;
        if (!rc) printf("%s\n", a.out);
        break;
    case 3: rc = do_loss(m, &a); break;
    case 5: rc = do_dump(m, &a); break;
    default: rc = do_bench(m, &a); break;
    }
    xent_model_free(m);
    return rc;
}

XENT_COMMAND(model, "Llama-family model: info, tokenize, export, loss, bench",
             cmd_model)
