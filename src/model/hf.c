/* src/model/hf.c: Hugging Face checkpoint directories (config.json plus one
 * or more .safetensors files, F32/BF16/F16) in and out. */
#include "io/io_internal.h"
#include "model/model_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static xent_status read_file(const char *path, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return xent__fail(XENT_ERR_IO, "cannot open '%s'", path);
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        size_t r = fread(p + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        if (cap >= ((size_t)64 << 20)) {
            free(p);
            fclose(f);
            return xent__fail(XENT_ERR_FORMAT, "'%s' is larger than 64 MiB",
                              path);
        }
        char *q = realloc(p, cap * 2);
        if (!q) free(p);
        p = q;
        cap *= 2;
    }
    fclose(f);
    if (!p) return xent__fail(XENT_ERR_ALLOC, "reading '%s'", path);
    *text = p;
    *len = n;
    return XENT_OK;
}

/* Number member as double; 0 when absent or not a number. */
static int jnum(const xent__json *j, const xent__jnode *o, const char *k,
                double *out) {
    const xent__jnode *n = xent__json_get(j, o, k);
    if (!n || n->type != XENT__J_NUM) return 0;
    char tmp[64];
    size_t l = n->len < sizeof tmp - 1 ? n->len : sizeof tmp - 1;
    memcpy(tmp, n->str, l);
    tmp[l] = 0;
    char *end;
    *out = strtod(tmp, &end);
    return end != tmp && isfinite(*out);
}

static int64_t jint(const xent__json *j, const xent__jnode *o, const char *k,
                    int64_t dflt) {
    double d;
    if (!jnum(j, o, k, &d) || d != floor(d) || fabs(d) > 9e15) return dflt;
    return (int64_t)d;
}

static int jstr_eq(const xent__jnode *n, const char *s) {
    return n && n->type == XENT__J_STR && n->len == strlen(s) &&
           !memcmp(n->str, s, n->len);
}

static xent_status hf_config_json(const xent__json *jp, const char *path,
                                  xent_model_config *c);

static xent_status hf_config(const char *dir, xent_model_config *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    xent_status st = read_file(path, &text, &len);
    if (st) return st;
    xent__json j;
    st = xent__json_parse(text, len, "config.json", &j);
    if (st) {
        free(text);
        return st;
    }
    st = hf_config_json(&j, path, c);
    xent__json_free(&j);
    free(text); /* number nodes point into the text */
    return st;
}

static xent_status hf_config_json(const xent__json *jp, const char *path,
                                  xent_model_config *c) {
    xent__json j = *jp;
    const xent__jnode *r = &j.nodes[0];
    xent_model_config_init(c);
    const xent__jnode *mt = xent__json_get(&j, r, "model_type");
    if (r->type != XENT__J_OBJ || !mt || mt->type != XENT__J_STR) {
        return xent__fail(XENT_ERR_FORMAT, "%s: model_type is missing", path);
    }
    size_t ml = mt->len < sizeof c->arch - 1 ? mt->len : sizeof c->arch - 1;
    memcpy(c->arch, mt->str, ml);
    c->arch[ml] = 0;
    if (!strcmp(c->arch, "mistral")) snprintf(c->arch, sizeof c->arch, "llama");
    /* a numeric key that is present must be a number (null: the default);
     * never silently fall back to a default on a mistyped value */
    static const char *num_keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads", "head_dim",
                                     "vocab_size", "max_position_embeddings", "rope_theta",
                                     "rms_norm_eps"};
    for (size_t i = 0; i < sizeof num_keys / sizeof num_keys[0]; i++) {
        const xent__jnode *n = xent__json_get(&j, r, num_keys[i]);
        if (n && n->type != XENT__J_NULL && (n->type != XENT__J_NUM || n->len >= 63))
            return xent__fail(XENT_ERR_FORMAT, "%s: '%s' must be a number", path, num_keys[i]);
    }
    c->dim = jint(&j, r, "hidden_size", 0);
    c->hidden = jint(&j, r, "intermediate_size", 0);
    c->n_layers = jint(&j, r, "num_hidden_layers", 0);
    c->n_heads = jint(&j, r, "num_attention_heads", 0);
    c->n_kv_heads = jint(&j, r, "num_key_value_heads", c->n_heads);
    c->head_dim = jint(&j, r, "head_dim", c->n_heads ? c->dim / c->n_heads : 0);
    c->vocab = jint(&j, r, "vocab_size", 0);
    c->max_seq = jint(&j, r, "max_position_embeddings", 0);
    c->bos_id = jint(&j, r, "bos_token_id", -1);
    c->eos_id = jint(&j, r, "eos_token_id", -1);
    if (!jnum(&j, r, "rope_theta", &c->rope_theta)) c->rope_theta = 10000.0;
    if (!jnum(&j, r, "rms_norm_eps", &c->norm_eps)) c->norm_eps = 1e-6;
    const xent__jnode *tie = xent__json_get(&j, r, "tie_word_embeddings");
    c->tied_head = tie ? tie->type == XENT__J_TRUE : 0;
    const xent__jnode *ab = xent__json_get(&j, r, "attention_bias");
    c->qkv_bias = !strcmp(c->arch, "qwen2") || (ab && ab->type == XENT__J_TRUE);
    const xent__jnode *sw = xent__json_get(&j, r, "use_sliding_window");
    if (sw && sw->type == XENT__J_TRUE) {
        return xent__fail(XENT_ERR_UNSUPPORTED, "%s: use_sliding_window is "
                          "not supported", path);
    }
    const xent__jnode *rs = xent__json_get(&j, r, "rope_scaling");
    if (rs && rs->type == XENT__J_OBJ) {
        const xent__jnode *ty = xent__json_get(&j, rs, "rope_type");
        if (!ty) ty = xent__json_get(&j, rs, "type");
        if (jstr_eq(ty, "llama3")) {
            c->rope_scaling = XENT_ROPE_LLAMA3;
            jnum(&j, rs, "factor", &c->rope_factor);
            jnum(&j, rs, "low_freq_factor", &c->rope_low_freq_factor);
            jnum(&j, rs, "high_freq_factor", &c->rope_high_freq_factor);
            c->rope_orig_ctx =
                jint(&j, rs, "original_max_position_embeddings", 0);
        } else if (!jstr_eq(ty, "default")) {
            return xent__fail(XENT_ERR_UNSUPPORTED, "%s: rope_scaling type is "
                              "not supported (default, llama3)", path);
        }
    }
    return xent_model_config_check(c);
}

/* Files of the checkpoint: every *.safetensors in dir (sorted). */
static xent_status list_files(const char *dir, char ***files, int *n) {
    DIR *d = opendir(dir);
    if (!d) return xent__fail(XENT_ERR_IO, "cannot open directory '%s'", dir);
    struct dirent *e;
    char **f = NULL;
    int k = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors")) continue;
        char **g = realloc(f, (size_t)(k + 1) * sizeof *f);
        if (!g) break;
        f = g;
        size_t pl = strlen(dir) + l + 2;
        f[k] = malloc(pl);
        if (!f[k]) break;
        snprintf(f[k], pl, "%s/%s", dir, e->d_name);
        k++;
    }
    closedir(d);
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && strcmp(f[j - 1], f[j]) > 0; j--) {
            char *t = f[j];
            f[j] = f[j - 1];
            f[j - 1] = t;
        }
    *files = f;
    *n = k;
    if (!k) return xent__fail(XENT_ERR_NOT_FOUND, "'%s' has no .safetensors "
                              "file", dir);
    return XENT_OK;
}

static xent_status check_param(const xent_param *p, const char *file,
                               const xent_tensor *info) {
    int64_t n = 1;
    for (int d = 0; d < info->ndim; d++) n *= info->shape[d];
    int ok = info->ndim == p->ndim && n == p->numel &&
             info->shape[0] == p->shape[0] &&
             (p->ndim == 1 || info->shape[1] == p->shape[1]);
    if (!ok)
        return xent__fail(XENT_ERR_SHAPE, "%s: tensor '%s' has %d dims / %lld "
                          "elements, expected [%lld%s%lld]", file, p->name,
                          info->ndim, (long long)n, (long long)p->shape[0],
                          p->ndim == 2 ? ", " : "",
                          p->ndim == 2 ? (long long)p->shape[1] : 0LL);
    if (info->dtype != XENT_F32 && info->dtype != XENT_BF16 &&
        info->dtype != XENT_F16)
        return xent__fail(XENT_ERR_DTYPE, "%s: tensor '%s' has dtype %s (F32, "
                          "BF16 or F16 expected)", file, p->name,
                          xent_dtype_name(info->dtype));
    return XENT_OK;
}

static xent_status load_param(xent_param *p, const char *file) {
    char spec[1400];
    snprintf(spec, sizeof spec, "%s:%s", file, p->name);
    xent_tensor t;
    xent_status st = xent_tensor_load(spec, &t);
    if (st) return st;
    if (xent_tensor_numel(&t) != p->numel) {
        xent_tensor_free(&t);
        return xent__fail(XENT_ERR_SHAPE, "%s: tensor '%s' changed size",
                          file, p->name);
    }
    for (int64_t i = 0; i < p->numel; i++) p->w[i] = xent__load(t.data, t.dtype, i);
    xent_tensor_free(&t);
    return XENT_OK;
}

/* Tensor lists of every file, listed once. */
typedef struct {
    char **files;
    int nf;
    xent_tensor **ts; /* [nf] -> [nt[f]] infos (data NULL) */
    int *nt;
} hf_index;

static void hf_index_free(hf_index *x) {
    for (int f = 0; f < x->nf; f++) {
        free(x->files[f]);
        if (x->ts) free(x->ts[f]);
    }
    free(x->files), free(x->ts), free(x->nt);
}

static xent_status hf_index_build(const char *dir, hf_index *x) {
    memset(x, 0, sizeof *x);
    xent_status st = list_files(dir, &x->files, &x->nf);
    if (st) return st;
    x->ts = calloc((size_t)x->nf, sizeof *x->ts);
    x->nt = calloc((size_t)x->nf, sizeof *x->nt);
    if (!x->ts || !x->nt) return xent__fail(XENT_ERR_ALLOC, "hf index");
    for (int f = 0; !st && f < x->nf; f++)
        st = xent_safetensors_list(x->files[f], &x->ts[f], &x->nt[f]);
    return st;
}

/* File and info of a tensor, or NULL. */
static const xent_tensor *hf_find(const hf_index *x, const char *name,
                                  int *file) {
    for (int f = 0; f < x->nf; f++)
        for (int k = 0; k < x->nt[f]; k++)
            if (!strcmp(x->ts[f][k].name, name)) {
                *file = f;
                return &x->ts[f][k];
            }
    return NULL;
}

xent_status xent_model_load_hf(const char *dir, xent_model **out) {
    if (!dir || !out) return xent__fail(XENT_ERR_NULL, "load_hf: NULL");
    xent_model *m = calloc(1, sizeof *m);
    if (!m) return xent__fail(XENT_ERR_ALLOC, "model");
    hf_index x;
    memset(&x, 0, sizeof x);
    xent_status st = hf_config(dir, &m->cfg);
    if (!st) st = xent__model_layout(m);
    if (!st) st = hf_index_build(dir, &x);
    /* every tensor present with its shape before allocating */
    for (int i = 0; !st && i < m->n_params; i++) {
        int f;
        const xent_tensor *t = hf_find(&x, m->params[i].name, &f);
        if (!t)
            st = xent__fail(XENT_ERR_NOT_FOUND, "%s: tensor '%s' is in no "
                            ".safetensors file", dir, m->params[i].name);
        else
            st = check_param(&m->params[i], x.files[f], t);
    }
    if (!st) st = xent__model_alloc(m);
    xent_dtype seen = XENT_F32;
    for (int i = 0; !st && i < m->n_params; i++) {
        int f;
        const xent_tensor *t = hf_find(&x, m->params[i].name, &f);
        seen = t->dtype;
        st = load_param(&m->params[i], x.files[f]);
    }
    hf_index_free(&x);
    if (st) {
        xent_model_free(m);
        return st;
    }
    snprintf(m->source, sizeof m->source, "%s", dir);
    snprintf(m->source_type, sizeof m->source_type, "safetensors %s",
             xent_dtype_name(seen));
    *out = m;
    return XENT_OK;
}

xent_status xent_model_save_hf(const xent_model *m, const char *dir,
                               xent_dtype dtype) {
    if (!m || !dir) return xent__fail(XENT_ERR_NULL, "save_hf: NULL");
    if (dtype != XENT_F32 && dtype != XENT_BF16 && dtype != XENT_F16)
        return xent__fail(XENT_ERR_DTYPE, "save_hf: dtype %s (f32, bf16, f16)",
                          xent_dtype_name(dtype));
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return xent__fail(XENT_ERR_IO, "cannot create '%s'", dir);
    const xent_model_config *c = &m->cfg;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return xent__fail(XENT_ERR_IO, "cannot write '%s'", path);
    int q = !strcmp(c->arch, "qwen2");
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
            q ? "Qwen2ForCausalLM" : "LlamaForCausalLM", c->arch);
    fprintf(f, "  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n  \"head_dim\": %lld,\n"
            "  \"vocab_size\": %lld,\n  \"max_position_embeddings\": %lld,\n",
            (long long)c->dim, (long long)c->hidden, (long long)c->n_layers,
            (long long)c->n_heads, (long long)c->n_kv_heads,
            (long long)c->head_dim, (long long)c->vocab,
            (long long)(c->max_seq > 0 ? c->max_seq : 8192));
    fprintf(f, "  \"rope_theta\": %.17g,\n  \"rms_norm_eps\": %.17g,\n"
            "  \"tie_word_embeddings\": %s,\n  \"attention_bias\": %s,\n"
            "  \"hidden_act\": \"silu\",\n  \"mlp_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n  \"torch_dtype\": \"%s\",\n",
            c->rope_theta, c->norm_eps, c->tied_head ? "true" : "false",
            c->qkv_bias ? "true" : "false",
            dtype == XENT_F32 ? "float32" : dtype == XENT_BF16 ? "bfloat16"
                                                               : "float16");
    if (c->rope_scaling == XENT_ROPE_LLAMA3)
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"llama3\", "
                "\"factor\": %.17g, \"low_freq_factor\": %.17g, "
                "\"high_freq_factor\": %.17g, "
                "\"original_max_position_embeddings\": %lld},\n",
                c->rope_factor, c->rope_low_freq_factor,
                c->rope_high_freq_factor, (long long)c->rope_orig_ctx);
    if (c->bos_id >= 0) fprintf(f, "  \"bos_token_id\": %lld,\n",
                                (long long)c->bos_id);
    if (c->eos_id >= 0) fprintf(f, "  \"eos_token_id\": %lld,\n",
                                (long long)c->eos_id);
    fprintf(f, "  \"transformers_version\": \"4.44.0\"\n}\n");
    if (fclose(f) != 0) return xent__fail(XENT_ERR_IO, "cannot write '%s'", path);
    xent_tensor *ts = calloc((size_t)m->n_params, sizeof *ts);
    if (!ts) return xent__fail(XENT_ERR_ALLOC, "save_hf");
    xent_status st = XENT_OK;
    for (int i = 0; !st && i < m->n_params; i++) {
        const xent_param *p = &m->params[i];
        snprintf(ts[i].name, sizeof ts[i].name, "%s", p->name);
        ts[i].dtype = dtype;
        ts[i].ndim = p->ndim;
        ts[i].shape[0] = p->shape[0];
        ts[i].shape[1] = p->shape[1];
        ts[i].nbytes = (size_t)p->numel * xent_dtype_size(dtype);
        ts[i].data = malloc(ts[i].nbytes ? ts[i].nbytes : 1);
        if (!ts[i].data) {
            st = xent__fail(XENT_ERR_ALLOC, "save_hf: %s", p->name);
            break;
        }
        for (int64_t k = 0; k < p->numel; k++) {
            if (dtype == XENT_F32) ((float *)ts[i].data)[k] = p->w[k];
            else if (dtype == XENT_BF16)
                ((uint16_t *)ts[i].data)[k] = xent_f32_to_bf16(p->w[k]);
            else ((uint16_t *)ts[i].data)[k] = xent_f32_to_f16(p->w[k]);
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!st) st = xent_tensors_save(path, ts, m->n_params);
    for (int i = 0; i < m->n_params; i++) free(ts[i].data);
    free(ts);
    return st;
}
