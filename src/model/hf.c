/* src/model/hf.c: Hugging Face checkpoint directories (config.json plus one
 * or more .safetensors files, F32/BF16/F16) in and out. */
#include "xent.h"
#include "model/model_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_MAX_CONFIG ((uint64_t)64 << 20) /* config.json: 64 MiB at most */

/* config.json and index.json: the whole file, at most HF_MAX_CONFIG bytes */
static xent_status read_file(const char *path, char **text, size_t *len) {
    return xent__read_small_file(path, HF_MAX_CONFIG, text, len);
}

xent_status xent__read_small_file(const char *path, uint64_t max, char **text, size_t *len) {
    uint64_t size = 0;
    FILE *f = xent_file_open(path, &size);
    if (!f) return XENT_ERR_IO;
    if (size > max) {
        fclose(f);
        return xent_set_error(XENT_ERR_FORMAT, "%s: %llu bytes, larger than the limit of %llu", path,
                              (unsigned long long)size, (unsigned long long)max);
    }
    char *p = malloc((size_t)size + 1);
    if (!p) {
        fclose(f);
        return xent_set_error(XENT_ERR_ALLOC, "reading '%s'", path);
    }
    size_t n = fread(p, 1, (size_t)size, f);
    int err = ferror(f);
    fclose(f);
    if (err || n != (size_t)size) {
        free(p);
        return xent_set_error(XENT_ERR_IO, "%s: read %zu of %llu bytes", path, n,
                              (unsigned long long)size);
    }
    p[n] = 0;
    *text = p;
    *len = n;
    return XENT_OK;
}

/* ---- config.json: every value checked --------------------------------- */

/* A member's value as text for messages (numbers keep their text). */
static void shown(const xent_json_node *n, char *buf, size_t cap) {
    static const char *const nm[] = {"null", "false", "true", "", "", "an array", "an object"};
    if (n->type == XENT_JSON_NUM) snprintf(buf, cap, "%.*s", (int)(n->len < 40 ? n->len : 40), n->str);
    else if (n->type == XENT_JSON_STR) {
        snprintf(buf, cap, "\"%.*s\"", (int)(n->len < 40 ? n->len : 40), n->str);
        for (char *c = buf; *c; c++)
            if ((unsigned char)*c < 32) *c = '?';
    } else snprintf(buf, cap, "%s", nm[n->type]);
}

/* Member `k` of o: NULL when absent or null (the default applies). */
static const xent_json_node *member(const xent_json *j, const xent_json_node *o, const char *k) {
    const xent_json_node *n = xent_json_get(j, o, k);
    return n && n->type != XENT_JSON_NULL ? n : NULL;
}

/* A number member as a finite double. 0: absent; 1: *out set; an error
 * status (message naming the key, the value and the file) otherwise. */
static int num_of(const char *path, const char *key, const xent_json_node *n, double *out,
                  xent_status *st) {
    char v[64];
    if (!n) return 0;
    if (n->type != XENT_JSON_NUM || n->len >= 63) {
        shown(n, v, sizeof v);
        *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: must be a number", path, key, v);
        return -1;
    }
    memcpy(v, n->str, n->len);
    v[n->len] = 0;
    char *end;
    *out = strtod(v, &end);
    if (end == v || *end || !isfinite(*out)) {
        *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: not a finite number", path, key, v);
        return -1;
    }
    return 1;
}

/* Integer member in [lo, hi]; dflt when absent (required: an error). */
static int64_t cfg_int(const char *path, const xent_json *j, const xent_json_node *o, const char *key,
                       int64_t lo, int64_t hi, int64_t dflt, int required, xent_status *st) {
    if (*st) return dflt;
    const xent_json_node *n = member(j, o, key);
    double d = 0;
    int r = num_of(path, key, n, &d, st);
    if (r < 0) return dflt;
    if (r == 0) {
        if (required)
            *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' is missing", path, key);
        return dflt;
    }
    char v[64];
    shown(n, v, sizeof v);
    if (d != floor(d)) {
        *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: must be an integer", path, key, v);
        return dflt;
    }
    if (d < (double)lo || d > (double)hi) {
        *st = xent_set_error(XENT_ERR_SHAPE, "%s: '%s' = %s: outside [%lld, %lld]", path, key, v,
                             (long long)lo, (long long)hi);
        return dflt;
    }
    return (int64_t)d;
}

/* Number member in [lo, hi] (lo_open: lo itself excluded); dflt when absent. */
static double cfg_f64(const char *path, const xent_json *j, const xent_json_node *o, const char *key,
                      double lo, int lo_open, double hi, double dflt, xent_status *st) {
    if (*st) return dflt;
    const xent_json_node *n = member(j, o, key);
    double d = 0;
    int r = num_of(path, key, n, &d, st);
    if (r <= 0) return dflt;
    if (d < lo || (lo_open && d == lo) || d > hi) {
        char v[64];
        shown(n, v, sizeof v);
        *st = xent_set_error(XENT_ERR_VALUE, "%s: '%s' = %s: outside %s%g, %g]", path, key, v,
                             lo_open ? "(" : "[", lo, hi);
        return dflt;
    }
    return d;
}

/* true / false member; dflt when absent. */
static int cfg_bool(const char *path, const xent_json *j, const xent_json_node *o, const char *key,
                    int dflt, xent_status *st) {
    if (*st) return dflt;
    const xent_json_node *n = member(j, o, key);
    if (!n) return dflt;
    if (n->type != XENT_JSON_TRUE && n->type != XENT_JSON_FALSE) {
        char v[64];
        shown(n, v, sizeof v);
        *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: must be true or false", path, key, v);
        return dflt;
    }
    return n->type == XENT_JSON_TRUE;
}

/* A string member without NUL or control characters, shorter than cap. */
static int cfg_str(const char *path, const xent_json *j, const xent_json_node *o, const char *key,
                   char *out, size_t cap, xent_status *st) {
    if (*st) return 0;
    const xent_json_node *n = member(j, o, key);
    if (!n) return 0;
    char v[64];
    shown(n, v, sizeof v);
    if (n->type != XENT_JSON_STR) {
        *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: must be a string", path, key, v);
        return 0;
    }
    for (size_t i = 0; i < n->len; i++)
        if ((unsigned char)n->str[i] < 32) {
            *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: holds a NUL or control character "
                                 "(byte %zu)", path, key, v, i);
            return 0;
        }
    if (n->len >= cap) {
        *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: longer than %zu bytes", path, key, v,
                             cap - 1);
        return 0;
    }
    memcpy(out, n->str, n->len);
    out[n->len] = 0;
    return 1;
}

/* A token id: an integer in [0, vocab), or a list of them (the first is
 * kept; Llama 3.1 lists several end tokens), or absent / null (-1). */
static int64_t cfg_token(const char *path, const xent_json *j, const xent_json_node *o, const char *key,
                         int64_t vocab, xent_status *st) {
    if (*st) return -1;
    const xent_json_node *n = member(j, o, key);
    if (!n) return -1;
    if (n->type != XENT_JSON_ARR) return cfg_int(path, j, o, key, 0, vocab - 1, -1, 0, st);
    int64_t first = -1, k = 0;
    for (int64_t c = n->first; c >= 0 && !*st; c = j->nodes[c].next, k++) {
        char name[96];
        snprintf(name, sizeof name, "%s[%lld]", key, (long long)k);
        double d = 0;
        const xent_json_node *e = &j->nodes[c];
        if (num_of(path, name, e, &d, st) < 0) break;
        if (d != floor(d) || d < 0 || d >= (double)vocab) {
            char v[64];
            shown(e, v, sizeof v);
            *st = xent_set_error(XENT_ERR_FORMAT, "%s: '%s' = %s: not a token id in [0, %lld)", path,
                                 name, v, (long long)vocab);
            break;
        }
        if (first < 0) first = (int64_t)d;
    }
    return first;
}

/* A key repeated in one object means one thing to a first-wins reader and
 * another to Python's last-wins json module: refused. O(k log k). */
typedef struct { const char *k; size_t n; } keyref;
static int keyref_cmp(const void *a, const void *b) {
    const keyref *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int r = m ? memcmp(x->k, y->k, m) : 0;
    return r ? r : (x->n > y->n) - (x->n < y->n);
}
static xent_status no_repeated_keys(const char *path, const xent_json *j, const xent_json_node *o) {
    if (o->type != XENT_JSON_OBJ || o->count < 2) return XENT_OK;
    keyref *ks = malloc((size_t)o->count * sizeof *ks);
    if (!ks) return xent_set_error(XENT_ERR_ALLOC, "%s: keys", path);
    int64_t m = 0;
    for (int64_t c = o->first; c >= 0 && m < o->count; c = j->nodes[c].next)
        ks[m++] = (keyref){j->nodes[c].key, j->nodes[c].key_len};
    qsort(ks, (size_t)m, sizeof *ks, keyref_cmp);
    xent_status st = XENT_OK;
    for (int64_t i = 1; i < m && !st; i++)
        if (!keyref_cmp(&ks[i - 1], &ks[i]))
            st = xent_set_error(XENT_ERR_FORMAT, "%s: key '%.*s' appears twice", path,
                                (int)(ks[i].n < 64 ? ks[i].n : 64), ks[i].k);
    free(ks);
    return st;
}

static xent_status hf_config_json(const xent_json *jp, const char *path,
                                  xent_model_config *c);

/* config.json text -> configuration (what hf_config does after reading the
 * file; the fuzz target tests/fuzz/fuzz_hf_config.c calls it on buffers). */
xent_status xent__hf_config_parse(const char *text, size_t len, const char *path,
                                  xent_model_config *c);
xent_status xent__hf_config_parse(const char *text, size_t len, const char *path,
                                  xent_model_config *c) {
    xent_json j;
    xent_status st = xent_json_parse(text, len, path, &j);
    if (st) return st;
    st = hf_config_json(&j, path, c);
    xent_json_free(&j);
    return st;
}

xent_status xent_model_config_file(const char *path, xent_model_config *c) {
    if (!path || !c) return xent_set_error(XENT_ERR_NULL, "config_file: NULL");
    char *text = NULL;
    size_t len = 0;
    xent_status st = read_file(path, &text, &len);
    if (st) return st;
    st = xent__hf_config_parse(text, len, path, c);
    free(text);
    return st;
}

static xent_status hf_config(const char *dir, xent_model_config *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    xent_status st = read_file(path, &text, &len);
    if (st) return st;
    st = xent__hf_config_parse(text, len, path, c);
    free(text); /* number nodes point into the text */
    return st;
}

static xent_status hf_config_json(const xent_json *jp, const char *path,
                                  xent_model_config *c) {
    const xent_json *j = jp;
    const xent_json_node *r = &j->nodes[0];
    xent_model_config_init(c);
    if (r->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    xent_status st = no_repeated_keys(path, j, r);
    if (st) return st;
    if (!cfg_str(path, j, r, "model_type", c->arch, sizeof c->arch, &st))
        return st ? st : xent_set_error(XENT_ERR_FORMAT, "%s: model_type is missing", path);
    if (!strcmp(c->arch, "gemma3") && member(j, r, "text_config"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: model_type 'gemma3' with a text_config "
                              "(the multimodal checkpoint) is not supported; use a text-only "
                              "checkpoint (model_type 'gemma3_text')", path);
    if (!strcmp(c->arch, "gemma3")) snprintf(c->arch, sizeof c->arch, "gemma3_text");
    if ((st = xent_model_config_family(c))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", xent_last_error());
        return xent_set_error(st, "%s: model_type: %s", path, msg);
    }
    const int gemma = c->norm_plus_one;
    {
        /* the MLP's activation: silu, or gelu with the tanh approximation
         * for Gemma (hidden_activation wins over hidden_act, as in HF) */
        char act[64] = "";
        if (!cfg_str(path, j, r, "hidden_activation", act, sizeof act, &st) && !st)
            cfg_str(path, j, r, "hidden_act", act, sizeof act, &st);
        if (st) return st;
        const char *want = gemma ? "gelu_pytorch_tanh" : "silu";
        if (act[0] && strcmp(act, want) && !(gemma && !strcmp(act, "gelu_tanh")))
            return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: activation '%s' is not supported "
                                  "for %s (%s)", path, act, c->arch, want);
    }
    const int64_t big = (int64_t)1 << 24;
    c->dim = cfg_int(path, j, r, "hidden_size", 1, big, 0, 1, &st);
    c->hidden = cfg_int(path, j, r, "intermediate_size", 1, big, 0, 1, &st);
    c->n_layers = cfg_int(path, j, r, "num_hidden_layers", 1, 4096, 0, 1, &st);
    c->n_heads = cfg_int(path, j, r, "num_attention_heads", 1, 4096, 0, 1, &st);
    c->n_kv_heads = cfg_int(path, j, r, "num_key_value_heads", 1, 4096, c->n_heads, 0, &st);
    c->vocab = cfg_int(path, j, r, "vocab_size", 1, (int64_t)1 << 31, 0, 1, &st);
    c->max_seq = cfg_int(path, j, r, "max_position_embeddings", 1, (int64_t)1 << 40, 0, 0, &st);
    if (st) return st;
    if (!member(j, r, "head_dim") && c->dim % c->n_heads)
        return xent_set_error(XENT_ERR_SHAPE, "%s: 'hidden_size' = %lld is not a multiple of "
                              "'num_attention_heads' = %lld (and there is no 'head_dim')", path,
                              (long long)c->dim, (long long)c->n_heads);
    c->head_dim = cfg_int(path, j, r, "head_dim", 1, 65536, c->dim / c->n_heads, 0, &st);
    if (!st && c->n_heads % c->n_kv_heads)
        return xent_set_error(XENT_ERR_SHAPE, "%s: 'num_attention_heads' = %lld is not a multiple of "
                              "'num_key_value_heads' = %lld", path, (long long)c->n_heads,
                              (long long)c->n_kv_heads);
    c->bos_id = cfg_token(path, j, r, "bos_token_id", c->vocab, &st);
    c->eos_id = cfg_token(path, j, r, "eos_token_id", c->vocab, &st);
    c->rope_theta = cfg_f64(path, j, r, "rope_theta", 0, 1, 1e12, 10000.0, &st);
    c->norm_eps = cfg_f64(path, j, r, "rms_norm_eps", 0, 0, 0.5, 1e-6, &st);
    c->tied_head = cfg_bool(path, j, r, "tie_word_embeddings", gemma, &st);
    int ab = cfg_bool(path, j, r, "attention_bias", 0, &st);
    c->qkv_bias = c->qkv_bias || ab;
    c->init_std = cfg_f64(path, j, r, "initializer_range", 0, 0, 10, 0.02, &st);
    if (cfg_bool(path, j, r, "mlp_bias", 0, &st) && !st)
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported", path);
    if (!strcmp(c->arch, "qwen2") || !strcmp(c->arch, "qwen3")) {
        if (cfg_bool(path, j, r, "use_sliding_window", 0, &st) && !st)
            return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: use_sliding_window = true is not "
                                  "supported for %s", path, c->arch);
        c->swa_pattern = 0;
    }
    if (st) return st;
    /* sliding window: a number, or null (no window); absent: the family's
     * default (4096 for mistral, gemma2, gemma3_text) */
    if (c->swa_pattern) {
        const xent_json_node *sw = xent_json_get(j, r, "sliding_window");
        if (sw && sw->type == XENT_JSON_NULL) c->sliding_window = 0;
        else c->sliding_window = cfg_int(path, j, r, "sliding_window", 1, (int64_t)1 << 40, 4096,
                                         0, &st);
        if (!strcmp(c->arch, "gemma3_text"))
            c->swa_pattern = cfg_int(path, j, r, "sliding_window_pattern", 1, 4096, 6, 0, &st);
    }
    if (gemma) {
        c->query_scalar = cfg_f64(path, j, r, "query_pre_attn_scalar", 0, 1, 1e9, 256, &st);
        const int g2 = !strcmp(c->arch, "gemma2");
        const xent_json_node *n = xent_json_get(j, r, "attn_logit_softcapping");
        c->attn_softcap = n && n->type == XENT_JSON_NULL
                              ? 0
                              : cfg_f64(path, j, r, "attn_logit_softcapping", 0, 1, 1e9,
                                        g2 ? 50.0 : 0, &st);
        n = xent_json_get(j, r, "final_logit_softcapping");
        c->final_softcap = n && n->type == XENT_JSON_NULL
                               ? 0
                               : cfg_f64(path, j, r, "final_logit_softcapping", 0, 1, 1e9,
                                         g2 ? 30.0 : 0, &st);
        if (!g2)
            c->rope_local_theta = cfg_f64(path, j, r, "rope_local_base_freq", 0, 1, 1e12,
                                          10000.0, &st);
    }
    if (st) return st;
    /* layer_types, when given, must be what the family's pattern says */
    const xent_json_node *lt = member(j, r, "layer_types");
    if (lt) {
        if (lt->type != XENT_JSON_ARR || lt->count != c->n_layers)
            return xent_set_error(XENT_ERR_FORMAT, "%s: 'layer_types' must be a list of %lld "
                                  "strings", path, (long long)c->n_layers);
        int64_t l = 0;
        for (int64_t k = lt->first; k >= 0; k = j->nodes[k].next, l++) {
            const xent_json_node *e = &j->nodes[k];
            int sl = e->type == XENT_JSON_STR && e->len == 17 &&
                     !memcmp(e->str, "sliding_attention", 17);
            int fu = e->type == XENT_JSON_STR && e->len == 14 &&
                     !memcmp(e->str, "full_attention", 14);
            if (!sl && !fu)
                return xent_set_error(XENT_ERR_FORMAT, "%s: 'layer_types[%lld]' is not "
                                      "\"sliding_attention\" or \"full_attention\"", path,
                                      (long long)l);
            if (sl != xent_model_layer_sliding(c, l))
                return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: 'layer_types[%lld]' = %s "
                                      "differs from the %s pattern (sliding_window %lld, every "
                                      "%lld-th layer global): not supported", path, (long long)l,
                                      sl ? "sliding_attention" : "full_attention", c->arch,
                                      (long long)c->sliding_window, (long long)c->swa_pattern);
        }
    }
    const xent_json_node *rs = member(j, r, "rope_scaling");
    if (rs && rs->type != XENT_JSON_OBJ) {
        char v[64];
        shown(rs, v, sizeof v);
        return xent_set_error(XENT_ERR_FORMAT, "%s: 'rope_scaling' = %s: must be an object or null",
                              path, v);
    }
    if (rs) {
        if ((st = no_repeated_keys(path, j, rs))) return st;
        char ty[32] = "";
        if (!cfg_str(path, j, rs, "rope_type", ty, sizeof ty, &st) && !st)
            cfg_str(path, j, rs, "type", ty, sizeof ty, &st);
        if (st) return st;
        if (!strcmp(ty, "llama3")) {
            c->rope_scaling = XENT_ROPE_LLAMA3;
            c->rope_factor = cfg_f64(path, j, rs, "factor", 0, 1, 1e6, 0, &st);
            c->rope_low_freq_factor = cfg_f64(path, j, rs, "low_freq_factor", 0, 1, 1e6, 0, &st);
            c->rope_high_freq_factor = cfg_f64(path, j, rs, "high_freq_factor", 0, 1, 1e6, 0, &st);
            c->rope_orig_ctx = cfg_int(path, j, rs, "original_max_position_embeddings", 1,
                                       (int64_t)1 << 40, 0, 1, &st);
            if (st) return st;
        } else if (!strcmp(ty, "linear")) {
            c->rope_scaling = XENT_ROPE_LINEAR;
            c->rope_factor = cfg_f64(path, j, rs, "factor", 0, 1, 1e6, 0, &st);
            if (st) return st;
            if (!(c->rope_factor > 0))
                return xent_set_error(XENT_ERR_FORMAT, "%s: rope_scaling 'factor' is missing",
                                      path);
        } else if (strcmp(ty, "default")) {
            return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: rope_scaling type '%s' is "
                                  "not supported (default, llama3, linear)", path, ty);
        }
    }
    st = xent_model_config_check(c);
    if (st) {
        /* name the file too */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", xent_last_error());
        return xent_set_error(st, "%s: %s", path, msg);
    }
    return XENT_OK;
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Files of the checkpoint: every *.safetensors in dir (sorted). */
static xent_status list_files(const char *dir, char ***files, int *n) {
    DIR *d = opendir(dir);
    if (!d) return xent_set_error(XENT_ERR_IO, "cannot open directory '%s'", dir);
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
    if (k > 1) qsort(f, (size_t)k, sizeof *f, str_cmp);
    *files = f;
    *n = k;
    if (!k) return xent_set_error(XENT_ERR_NOT_FOUND, "'%s' has no .safetensors "
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
        return xent_set_error(XENT_ERR_SHAPE, "%s: tensor '%s' has %d dims / %lld "
                          "elements, expected [%lld%s%lld]", file, p->name,
                          info->ndim, (long long)n, (long long)p->shape[0],
                          p->ndim == 2 ? ", " : "",
                          p->ndim == 2 ? (long long)p->shape[1] : 0LL);
    if (info->dtype != XENT_F32 && info->dtype != XENT_BF16 &&
        info->dtype != XENT_F16)
        return xent_set_error(XENT_ERR_DTYPE, "%s: tensor '%s' has dtype %s (F32, "
                          "BF16 or F16 expected)", file, p->name,
                          xent_dtype_name(info->dtype));
    return XENT_OK;
}

/* Tensor lists of every file, listed once (one header parse per file), and
 * one index of every tensor sorted by name for binary search. */
typedef struct {
    const char *name;
    int file;
    const xent_tensor *info;
} hf_entry;

typedef struct {
    char **files;
    int nf;
    xent_tensor **ts; /* [nf] -> [nt[f]] infos (data NULL) */
    int *nt;
    hf_entry *idx;    /* [nidx] sorted by name                      */
    int64_t nidx;
    char *index_text; /* model.safetensors.index.json, when present  */
    xent_json index_json;
    int has_json;
    const xent_json_node *weight_map;
} hf_index;

static void hf_index_free(hf_index *x) {
    for (int f = 0; f < x->nf; f++) {
        free(x->files[f]);
        if (x->ts) free(x->ts[f]);
    }
    free(x->files), free(x->ts), free(x->nt), free(x->idx);
    if (x->has_json) xent_json_free(&x->index_json);
    free(x->index_text);
}

static int entry_cmp(const void *a, const void *b) {
    const hf_entry *x = a, *y = b;
    int r = strcmp(x->name, y->name);
    return r ? r : (x->file > y->file) - (x->file < y->file);
}

/* A shard's file name from the index: a plain name ending in .safetensors
 * (no directory part: the index cannot point outside the checkpoint). */
static int shard_name_ok(const char *s, size_t n) {
    if (n < 13 || n > 255 || strcmp(s + n - 12, ".safetensors")) return 0;
    if (s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/' || s[i] == '\\' || (unsigned char)s[i] < 32) return 0;
    return 1;
}

/* model.safetensors.index.json -> the shard files (sorted, distinct) and
 * the parsed weight_map (kept in x to check each tensor's shard). Returns
 * XENT_ERR_NOT_FOUND silently (no message) when there is no index. */
static xent_status hf_read_index(const char *dir, hf_index *x) {
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) return XENT_ERR_NOT_FOUND;
    size_t len = 0;
    xent_status st = read_file(path, &x->index_text, &len);
    if (st) return st;
    st = xent_json_parse(x->index_text, len, path, &x->index_json);
    if (st) return st;
    x->has_json = 1;
    const xent_json *j = &x->index_json;
    const xent_json_node *r = &j->nodes[0];
    if (r->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    if ((st = no_repeated_keys(path, j, r))) return st;
    const xent_json_node *wm = member(j, r, "weight_map");
    if (!wm || wm->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: 'weight_map' is missing or not an object",
                              path);
    if ((st = no_repeated_keys(path, j, wm))) return st;
    x->weight_map = wm;
    if (wm->count > ((int64_t)1 << 24))
        return xent_set_error(XENT_ERR_FORMAT, "%s: 'weight_map' has %lld entries", path,
                              (long long)wm->count);
    /* distinct shard names */
    char **f = calloc((size_t)(wm->count ? wm->count : 1), sizeof *f);
    if (!f) return xent_set_error(XENT_ERR_ALLOC, "%s: shards", path);
    int k = 0;
    for (int64_t c = wm->first; c >= 0; c = j->nodes[c].next) {
        const xent_json_node *e = &j->nodes[c];
        if (e->type != XENT_JSON_STR || memchr(e->str, 0, e->len) || !shard_name_ok(e->str, e->len)) {
            for (int i = 0; i < k; i++) free(f[i]);
            free(f);
            return xent_set_error(XENT_ERR_FORMAT, "%s: weight_map['%.*s'] is not the name of a "
                                  ".safetensors file in the directory", path,
                                  (int)(e->key_len < 96 ? e->key_len : 96), e->key);
        }
        int seen = 0;
        for (int i = 0; i < k && !seen; i++)
            seen = strlen(f[i]) == e->len + strlen(dir) + 1 &&
                   !memcmp(f[i] + strlen(dir) + 1, e->str, e->len);
        if (seen) continue;
        size_t pl = strlen(dir) + e->len + 2;
        f[k] = malloc(pl);
        if (!f[k]) break;
        snprintf(f[k], pl, "%s/%.*s", dir, (int)e->len, e->str);
        k++;
        if (k > 100000) break;
    }
    if (k > 1) qsort(f, (size_t)k, sizeof *f, str_cmp);
    x->files = f;
    x->nf = k;
    if (!k) return xent_set_error(XENT_ERR_FORMAT, "%s: 'weight_map' is empty", path);
    return XENT_OK;
}

static xent_status hf_index_build(const char *dir, hf_index *x) {
    memset(x, 0, sizeof *x);
    xent_status st = hf_read_index(dir, x);
    if (st == XENT_ERR_NOT_FOUND) st = list_files(dir, &x->files, &x->nf);
    if (st) return st;
    x->ts = calloc((size_t)x->nf, sizeof *x->ts);
    x->nt = calloc((size_t)x->nf, sizeof *x->nt);
    if (!x->ts || !x->nt) return xent_set_error(XENT_ERR_ALLOC, "hf index");
    int64_t total = 0;
    for (int f = 0; !st && f < x->nf; f++) {
        st = xent_safetensors_list(x->files[f], &x->ts[f], &x->nt[f]);
        total += st ? 0 : x->nt[f];
    }
    if (st) return st;
    x->idx = malloc((size_t)(total ? total : 1) * sizeof *x->idx);
    if (!x->idx) return xent_set_error(XENT_ERR_ALLOC, "hf index: %lld tensors", (long long)total);
    for (int f = 0; f < x->nf; f++)
        for (int k = 0; k < x->nt[f]; k++)
            x->idx[x->nidx++] = (hf_entry){x->ts[f][k].name, f, &x->ts[f][k]};
    qsort(x->idx, (size_t)x->nidx, sizeof *x->idx, entry_cmp);
    /* a tensor in two shards: which one is meant? */
    for (int64_t i = 1; i < x->nidx; i++)
        if (!strcmp(x->idx[i - 1].name, x->idx[i].name))
            return xent_set_error(XENT_ERR_FORMAT, "%s: tensor '%s' is in both '%s' and '%s'", dir,
                                  x->idx[i].name, x->files[x->idx[i - 1].file], x->files[x->idx[i].file]);
    return XENT_OK;
}

/* With an index: the shard weight_map names for `name` must be the file
 * that holds it (an index and shards that disagree are refused). */
static xent_status hf_index_check(const char *dir, const hf_index *x, const char *name, int file) {
    if (!x->weight_map) return XENT_OK;
    const xent_json_node *e = xent_json_get(&x->index_json, x->weight_map, name);
    const char *fn = strrchr(x->files[file], '/');
    fn = fn ? fn + 1 : x->files[file];
    if (!e)
        return xent_set_error(XENT_ERR_FORMAT, "%s/model.safetensors.index.json: tensor '%s' "
                              "(in %s) is not in weight_map", dir, name, fn);
    if (e->len != strlen(fn) || memcmp(e->str, fn, e->len))
        return xent_set_error(XENT_ERR_FORMAT, "%s/model.safetensors.index.json: weight_map puts "
                              "'%s' in '%.*s', but it is in '%s'", dir, name,
                              (int)(e->len < 200 ? e->len : 200), e->str, fn);
    return XENT_OK;
}

static int entry_key_cmp(const void *key, const void *elt) {
    return strcmp((const char *)key, ((const hf_entry *)elt)->name);
}

/* File and info of a tensor, or NULL. */
static const xent_tensor *hf_find(const hf_index *x, const char *name,
                                  int *file) {
    const hf_entry *e = x->nidx ? bsearch(name, x->idx, (size_t)x->nidx, sizeof *x->idx, entry_key_cmp)
                                : NULL;
    if (!e) return NULL;
    *file = e->file;
    return e->info;
}

/* Converts the tensors of one file into the parameters (xent_safetensors_read
 * callback: one header parse per file, one tensor in memory at a time). */
typedef struct {
    xent_model *m;
    const int *pidx; /* [n] parameter of the i-th name */
    const char *file;
} hf_fill;

static xent_status fill_param(void *ctx, int i, const xent_tensor *t) {
    hf_fill *h = ctx;
    xent_param *p = &h->m->params[h->pidx[i]];
    if (xent_tensor_numel(t) != p->numel)
        return xent_set_error(XENT_ERR_SHAPE, "%s: tensor '%s' changed size", h->file, p->name);
    for (int64_t k = 0; k < p->numel; k++) p->w[k] = xent__load(t->data, t->dtype, k);
    return XENT_OK;
}

/* Every parameter from its file: one pass per file. */
static xent_status hf_load_params(const hf_index *x, xent_model *m) {
    const char **names = malloc((size_t)m->n_params * sizeof *names);
    int *pidx = malloc((size_t)m->n_params * sizeof *pidx);
    xent_status st = XENT_OK;
    if (!names || !pidx) st = xent_set_error(XENT_ERR_ALLOC, "hf: parameter lists");
    for (int f = 0; !st && f < x->nf; f++) {
        int n = 0;
        for (int i = 0; i < m->n_params; i++) {
            int ff = -1;
            if (hf_find(x, m->params[i].name, &ff) && ff == f) {
                names[n] = m->params[i].name;
                pidx[n++] = i;
            }
        }
        if (!n) continue;
        hf_fill h = {m, pidx, x->files[f]};
        st = xent_safetensors_read(x->files[f], names, n, fill_param, &h);
    }
    free(names), free(pidx);
    return st;
}

/* tokenizer.json when present: a malformed one is an error; a well-formed
 * one of a kind the BPE here does not do (Unigram, a Metaspace pre-tokenizer)
 * leaves m->tok NULL with the reason in m->tok_note. */
static xent_status hf_tokenizer(const char *dir, xent_model *m) {
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) {
        snprintf(m->tok_note, sizeof m->tok_note, "no tokenizer.json");
        return XENT_OK;
    }
    xent_status st = xent_tokenizer_load_json(path, &m->tok);
    if (st == XENT_ERR_UNSUPPORTED) {
        snprintf(m->tok_note, sizeof m->tok_note, "%s", xent_last_error());
        return XENT_OK;
    }
    return st;
}

xent_status xent_model_load_hf(const char *dir, xent_model **out) {
    if (!dir || !out) return xent_set_error(XENT_ERR_NULL, "load_hf: NULL");
    xent_model *m = calloc(1, sizeof *m);
    if (!m) return xent_set_error(XENT_ERR_ALLOC, "model");
    hf_index x;
    memset(&x, 0, sizeof x);
    xent_status st = hf_config(dir, &m->cfg);
    if (!st) st = xent__model_layout(m);
    if (!st) st = hf_index_build(dir, &x);
    /* every tensor present with its shape before allocating */
    xent_dtype seen = XENT_F32;
    for (int i = 0; !st && i < m->n_params; i++) {
        int f;
        const xent_tensor *t = hf_find(&x, m->params[i].name, &f);
        if (!t)
            st = xent_set_error(XENT_ERR_NOT_FOUND, "%s: tensor '%s' is in no "
                            ".safetensors file", dir, m->params[i].name);
        else
            st = check_param(&m->params[i], x.files[f], t);
        if (!st) st = hf_index_check(dir, &x, m->params[i].name, f);
        if (!st) seen = t->dtype;
    }
    if (!st) st = xent__model_alloc(m);
    if (!st) st = hf_load_params(&x, m);
    hf_index_free(&x);
    if (!st) st = hf_tokenizer(dir, m);
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
    if (!m || !dir) return xent_set_error(XENT_ERR_NULL, "save_hf: NULL");
    if (dtype != XENT_F32 && dtype != XENT_BF16 && dtype != XENT_F16)
        return xent_set_error(XENT_ERR_DTYPE, "save_hf: dtype %s (f32, bf16, f16)",
                          xent_dtype_name(dtype));
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return xent_set_error(XENT_ERR_IO, "cannot create '%s'", dir);
    const xent_model_config *c = &m->cfg;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    /* config.json goes to its temporary first and is renamed into place
     * only after model.safetensors is complete: a failure leaves the old
     * checkpoint as it was (each file is replaced whole, never truncated) */
    char *cfg_tmp = NULL;
    FILE *f = xent_file_create(path, &cfg_tmp);
    if (!f) return XENT_ERR_IO;
    static const char *const archs[][2] = {
        {"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
        {"qwen3", "Qwen3ForCausalLM"}, {"mistral", "MistralForCausalLM"},
        {"gemma2", "Gemma2ForCausalLM"}, {"gemma3_text", "Gemma3ForCausalLM"}};
    const char *cls = "LlamaForCausalLM";
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(c->arch, archs[i][0])) cls = archs[i][1];
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", cls,
            c->arch);
    if (c->gelu_tanh)
        fprintf(f, "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n");
    if (c->query_scalar > 0)
        fprintf(f, "  \"query_pre_attn_scalar\": %.17g,\n", c->query_scalar);
    if (c->norm_plus_one) { /* Gemma: null means none */
        const char *k[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
        double v[2] = {c->attn_softcap, c->final_softcap};
        for (int i = 0; i < 2; i++)
            if (v[i] > 0) fprintf(f, "  \"%s\": %.17g,\n", k[i], v[i]);
            else fprintf(f, "  \"%s\": null,\n", k[i]);
    }
    if (c->rope_local_theta > 0)
        fprintf(f, "  \"rope_local_base_freq\": %.17g,\n", c->rope_local_theta);
    if (!strcmp(c->arch, "mistral") || c->norm_plus_one) {
        if (c->sliding_window > 0)
            fprintf(f, "  \"sliding_window\": %lld,\n", (long long)c->sliding_window);
        else
            fprintf(f, "  \"sliding_window\": null,\n");
    }
    if (!strcmp(c->arch, "gemma3_text"))
        fprintf(f, "  \"sliding_window_pattern\": %lld,\n", (long long)c->swa_pattern);
    if (c->rope_scaling == XENT_ROPE_LINEAR)
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %.17g},\n",
                c->rope_factor);
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
            "  \"hidden_act\": \"%s\",\n  \"mlp_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n  \"torch_dtype\": \"%s\",\n",
            c->rope_theta, c->norm_eps, c->tied_head ? "true" : "false",
            c->qkv_bias ? "true" : "false", c->gelu_tanh ? "gelu_pytorch_tanh" : "silu",
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
    char cfg_path[1100];
    snprintf(cfg_path, sizeof cfg_path, "%s", path);
    xent_status st = XENT_OK;
    if (fflush(f) != 0 || ferror(f)) st = xent_set_error(XENT_ERR_IO, "%s: write failed", cfg_path);
    xent_tensor *ts = st ? NULL : calloc((size_t)m->n_params, sizeof *ts);
    if (!st && !ts) st = xent_set_error(XENT_ERR_ALLOC, "save_hf");
    for (int i = 0; ts && !st && i < m->n_params; i++) {
        const xent_param *p = &m->params[i];
        snprintf(ts[i].name, sizeof ts[i].name, "%s", p->name);
        ts[i].dtype = dtype;
        ts[i].ndim = p->ndim;
        ts[i].shape[0] = p->shape[0];
        ts[i].shape[1] = p->shape[1];
        ts[i].nbytes = (size_t)p->numel * xent_dtype_size(dtype);
        ts[i].data = malloc(ts[i].nbytes ? ts[i].nbytes : 1);
        if (!ts[i].data) {
            st = xent_set_error(XENT_ERR_ALLOC, "save_hf: %s", p->name);
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
    for (int i = 0; ts && i < m->n_params; i++) free(ts[i].data);
    free(ts);
    if (st) {
        fclose(f); /* the old config.json stays */
        remove(cfg_tmp);
        free(cfg_tmp);
        return st;
    }
    return xent_file_commit(f, cfg_tmp, cfg_path, 1);
}
