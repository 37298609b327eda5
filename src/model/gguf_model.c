/* src/model/gguf_model.c: a Llama-family model from / to a GGUF file. */
#include "model/gguf.h"
#include "model/model_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* HF name of parameter i -> GGUF tensor name. */
static void gguf_name(const xent_model *m, int i, char *out, size_t cap) {
    const char *hf = m->params[i].name;
    static const char *const map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"}};
    long long l;
    int k;
    if (!strcmp(hf, "model.embed_tokens.weight"))
        snprintf(out, cap, "token_embd.weight");
    else if (!strcmp(hf, "model.norm.weight"))
        snprintf(out, cap, "output_norm.weight");
    else if (!strcmp(hf, "lm_head.weight"))
        snprintf(out, cap, "output.weight");
    else if (sscanf(hf, "model.layers.%lld.%n", &l, &k) == 1) {
        for (size_t j = 0; j < sizeof map / sizeof map[0]; j++)
            if (!strcmp(hf + k, map[j][0])) {
                snprintf(out, cap, "blk.%lld.%s", l, map[j][1]);
                return;
            }
        snprintf(out, cap, "?");
    } else
        snprintf(out, cap, "?");
}

static const char *value_type_name(uint32_t t);

/* ---- metadata, every value checked ------------------------------------ */

/* A metadata value as text for messages. */
static void kv_shown(const xent__gguf *g, const xent__gguf_kv *kv, char *buf, size_t cap) {
    const uint8_t *p = g->p + kv->off;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            float f32; uint64_t u64; int64_t i64; double f64; } v;
    memset(&v, 0, sizeof v);
    if (kv->type != XENT__GT_ARR && kv->type != XENT__GT_STR) {
        static const size_t sz[XENT__GT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        memcpy(&v, p, kv->type < XENT__GT_COUNT ? sz[kv->type] : 0);
    }
    switch (kv->type) {
    case XENT__GT_U8: snprintf(buf, cap, "%u (u8)", v.u8); break;
    case XENT__GT_I8: snprintf(buf, cap, "%d (i8)", v.i8); break;
    case XENT__GT_U16: snprintf(buf, cap, "%u (u16)", v.u16); break;
    case XENT__GT_I16: snprintf(buf, cap, "%d (i16)", v.i16); break;
    case XENT__GT_U32: snprintf(buf, cap, "%u (u32)", v.u32); break;
    case XENT__GT_I32: snprintf(buf, cap, "%d (i32)", v.i32); break;
    case XENT__GT_U64: snprintf(buf, cap, "%llu (u64)", (unsigned long long)v.u64); break;
    case XENT__GT_I64: snprintf(buf, cap, "%lld (i64)", (long long)v.i64); break;
    case XENT__GT_F32: snprintf(buf, cap, "%.9g (f32)", (double)v.f32); break;
    case XENT__GT_F64: snprintf(buf, cap, "%.17g (f64)", v.f64); break;
    case XENT__GT_BOOL: snprintf(buf, cap, "%s (bool)", v.u8 ? "true" : "false"); break;
    case XENT__GT_STR: {
        uint64_t n;
        memcpy(&n, p, 8);
        snprintf(buf, cap, "\"%.*s\" (string)", (int)(n < 40 ? n : 40), (const char *)p + 8);
        for (char *c = buf; *c; c++)
            if ((unsigned char)*c < 32 || (unsigned char)*c > 126) *c = '?';
        break;
    }
    default:
        snprintf(buf, cap, "an array of %llu %s", (unsigned long long)kv->n, value_type_name(kv->atype));
    }
}

/* Reads a numeric value as a double (any integer or float type) and says
 * whether its type is an integer type. 0: not a number. */
static int kv_number(const xent__gguf *g, const xent__gguf_kv *kv, double *d, int *is_int) {
    const uint8_t *p = g->p + kv->off;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            float f32; uint64_t u64; int64_t i64; double f64; } v;
    *is_int = 1;
    switch (kv->type) {
    case XENT__GT_U8: memcpy(&v.u8, p, 1); *d = v.u8; return 1;
    case XENT__GT_I8: memcpy(&v.i8, p, 1); *d = v.i8; return 1;
    case XENT__GT_U16: memcpy(&v.u16, p, 2); *d = v.u16; return 1;
    case XENT__GT_I16: memcpy(&v.i16, p, 2); *d = v.i16; return 1;
    case XENT__GT_U32: memcpy(&v.u32, p, 4); *d = v.u32; return 1;
    case XENT__GT_I32: memcpy(&v.i32, p, 4); *d = v.i32; return 1;
    case XENT__GT_U64: memcpy(&v.u64, p, 8); *d = (double)v.u64; return 1;
    case XENT__GT_I64: memcpy(&v.i64, p, 8); *d = (double)v.i64; return 1;
    case XENT__GT_F32: memcpy(&v.f32, p, 4); *d = v.f32; *is_int = 0; return 1;
    case XENT__GT_F64: memcpy(&v.f64, p, 8); *d = v.f64; *is_int = 0; return 1;
    default: return 0;
    }
}

/* Integer metadata `key` in [lo, hi] (any integer type); dflt when absent
 * and not required. A float, a string, NaN, ... is an error naming the
 * key, the value and the file. */
static int64_t g_int(const xent__gguf *g, const char *path, const char *key, int required,
                     int64_t lo, int64_t hi, int64_t dflt, xent_status *st) {
    if (*st) return dflt;
    const xent__gguf_kv *kv = xent__gguf_find(g, key);
    if (!kv) {
        if (required)
            *st = xent_set_error(XENT_ERR_FORMAT, "gguf: %s: metadata '%s' is missing", path, key);
        return dflt;
    }
    double d = 0;
    int is_int = 0;
    char v[96];
    kv_shown(g, kv, v, sizeof v);
    if (!kv_number(g, kv, &d, &is_int) || !is_int) {
        *st = xent_set_error(XENT_ERR_FORMAT, "gguf: %s: metadata '%s' = %s: must be an integer", path,
                             key, v);
        return dflt;
    }
    if (d < (double)lo || d > (double)hi) {
        *st = xent_set_error(XENT_ERR_SHAPE, "gguf: %s: metadata '%s' = %s: outside [%lld, %lld]", path,
                             key, v, (long long)lo, (long long)hi);
        return dflt;
    }
    return (int64_t)d;
}

/* Number metadata in (lo, hi] or [lo, hi]; finite; dflt when absent. */
static double g_f64(const xent__gguf *g, const char *path, const char *key, double lo, int lo_open,
                    double hi, double dflt, xent_status *st) {
    if (*st) return dflt;
    const xent__gguf_kv *kv = xent__gguf_find(g, key);
    if (!kv) return dflt;
    double d = 0;
    int is_int = 0;
    char v[96];
    kv_shown(g, kv, v, sizeof v);
    if (!kv_number(g, kv, &d, &is_int)) {
        *st = xent_set_error(XENT_ERR_FORMAT, "gguf: %s: metadata '%s' = %s: must be a number", path, key, v);
        return dflt;
    }
    if (!isfinite(d) || d < lo || (lo_open && d == lo) || d > hi) {
        *st = xent_set_error(XENT_ERR_VALUE, "gguf: %s: metadata '%s' = %s: outside %s%g, %g]", path, key,
                             v, lo_open ? "(" : "[", lo, hi);
        return dflt;
    }
    return d;
}

/* String metadata: printable (no NUL, no control byte), shorter than cap.
 * 0 when absent. */
static int g_str(const xent__gguf *g, const char *path, const char *key, char *out, size_t cap,
                 xent_status *st) {
    if (*st) return 0;
    const xent__gguf_kv *kv = xent__gguf_find(g, key);
    if (!kv) return 0;
    char v[96];
    kv_shown(g, kv, v, sizeof v);
    const char *s;
    uint64_t n;
    if (!xent__gguf_str(g, key, &s, &n)) {
        *st = xent_set_error(XENT_ERR_FORMAT, "gguf: %s: metadata '%s' = %s: must be a string", path, key, v);
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 32 || s[i] == 127) {
            *st = xent_set_error(XENT_ERR_FORMAT, "gguf: %s: metadata '%s' = %s: holds a NUL or control "
                                 "character (byte %llu)", path, key, v, (unsigned long long)i);
            return 0;
        }
    if (n >= cap) {
        *st = xent_set_error(XENT_ERR_FORMAT, "gguf: %s: metadata '%s' = %s: longer than %zu bytes", path,
                             key, v, cap - 1);
        return 0;
    }
    memcpy(out, s, (size_t)n);
    out[n] = 0;
    return 1;
}

static xent_status gguf_config(const xent__gguf *g, const char *path, xent_model_config *c) {
    xent_model_config_init(c);
    xent_status st = XENT_OK;
    if (!g_str(g, path, "general.architecture", c->arch, sizeof c->arch, &st))
        return st ? st : xent_set_error(XENT_ERR_FORMAT, "gguf: %s: general.architecture is missing", path);
    if (strcmp(c->arch, "llama") && strcmp(c->arch, "qwen2"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "gguf: %s: architecture '%s' is "
                          "not supported; supported: %s", path, c->arch,
                          xent_model_supported_archs());
    char key[128];
    const char *A = c->arch;
#define KEY(f) (snprintf(key, sizeof key, "%s.%s", A, f), key)
    const int64_t big = (int64_t)1 << 24;
    c->n_layers = g_int(g, path, KEY("block_count"), 1, 1, 4096, 0, &st);
    c->dim = g_int(g, path, KEY("embedding_length"), 1, 1, big, 0, &st);
    c->hidden = g_int(g, path, KEY("feed_forward_length"), 1, 1, big, 0, &st);
    c->n_heads = g_int(g, path, KEY("attention.head_count"), 1, 1, 4096, 0, &st);
    if (st) return st;
    c->n_kv_heads = g_int(g, path, KEY("attention.head_count_kv"), 0, 1, 4096, c->n_heads, &st);
    c->max_seq = g_int(g, path, KEY("context_length"), 0, 1, (int64_t)1 << 40, 0, &st);
    if (st) return st;
    if (!xent__gguf_find(g, KEY("attention.key_length")) && c->dim % c->n_heads)
        return xent_set_error(XENT_ERR_SHAPE, "gguf: %s: %s.embedding_length = %lld is not a multiple "
                              "of %s.attention.head_count = %lld", path, A, (long long)c->dim, A,
                              (long long)c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        return xent_set_error(XENT_ERR_SHAPE, "gguf: %s: %s.attention.head_count = %lld is not a "
                              "multiple of %s.attention.head_count_kv = %lld", path, A,
                              (long long)c->n_heads, A, (long long)c->n_kv_heads);
    c->head_dim = g_int(g, path, KEY("attention.key_length"), 0, 1, 65536, c->dim / c->n_heads, &st);
    int64_t vd = g_int(g, path, KEY("attention.value_length"), 0, 1, 65536, c->head_dim, &st);
    int64_t rd = g_int(g, path, KEY("rope.dimension_count"), 0, 1, 65536, c->head_dim, &st);
    if (st) return st;
    if (vd != c->head_dim)
        return xent_set_error(XENT_ERR_UNSUPPORTED, "gguf: %s: %s.attention.value_length = %lld differs "
                              "from key_length %lld", path, A, (long long)vd, (long long)c->head_dim);
    if (rd != c->head_dim)
        return xent_set_error(XENT_ERR_UNSUPPORTED, "gguf: %s: %s.rope.dimension_count "
                          "= %lld differs from head_dim %lld (partial rotary "
                          "is not supported)", path, A, (long long)rd,
                          (long long)c->head_dim);
    c->rope_theta = g_f64(g, path, KEY("rope.freq_base"), 0, 1, 1e12, 10000.0, &st);
    c->norm_eps = g_f64(g, path, KEY("attention.layer_norm_rms_epsilon"), 0, 0, 0.5, 1e-5, &st);
    char sc[32];
    if (g_str(g, path, KEY("rope.scaling.type"), sc, sizeof sc, &st) && strcmp(sc, "none"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "gguf: %s: %s = '%s' is not "
                          "supported (none; llama3 scaling via an HF "
                          "checkpoint)", path, key, sc);
    if (st) return st;
    if (xent__gguf_tensor_find(g, "rope_freqs.weight"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "gguf: %s: rope_freqs.weight "
                          "(llama3 rope scaling) is not supported in GGUF; "
                          "load the HF checkpoint", path);
    const xent__gguf_tensor *e = xent__gguf_tensor_find(g, "token_embd.weight");
    if (!e || e->ndim != 2)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: %s: token_embd.weight is "
                          "missing or not 2-D", path);
    c->vocab = e->ne[1];
    /* the vocabulary the metadata states must be the embedding's */
    int64_t vs = g_int(g, path, KEY("vocab_size"), 0, 1, (int64_t)1 << 31, c->vocab, &st);
    if (st) return st;
    if (vs != c->vocab)
        return xent_set_error(XENT_ERR_SHAPE, "gguf: %s: %s.vocab_size = %lld but token_embd.weight has "
                              "%lld rows", path, A, (long long)vs, (long long)c->vocab);
#undef KEY
    c->tied_head = xent__gguf_tensor_find(g, "output.weight") == NULL;
    c->qkv_bias = xent__gguf_tensor_find(g, "blk.0.attn_q.bias") != NULL;
    c->bos_id = g_int(g, path, "tokenizer.ggml.bos_token_id", 0, 0, c->vocab - 1, -1, &st);
    c->eos_id = g_int(g, path, "tokenizer.ggml.eos_token_id", 0, 0, c->vocab - 1, -1, &st);
    if (st) return st;
    st = xent_model_config_check(c);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", xent_last_error());
        return xent_set_error(st, "gguf: %s: %s", path, msg);
    }
    return XENT_OK;
}

/* String array -> malloc'ed pointer/length tables (pointing into the image). */
static xent_status str_array(const xent__gguf *g, const char *key,
                             char ***s, size_t **len, int64_t *n) {
    const xent__gguf_kv *kv = xent__gguf_find(g, key);
    *s = NULL, *len = NULL, *n = 0;
    if (!kv) return XENT_OK;
    if (kv->type != XENT__GT_ARR || kv->atype != XENT__GT_STR)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: %s is not a string array",
                          key);
    *s = malloc((size_t)(kv->n + 1) * sizeof **s);
    *len = malloc((size_t)(kv->n + 1) * sizeof **len);
    if (!*s || !*len) return xent_set_error(XENT_ERR_ALLOC, "gguf: %s", key);
    uint64_t off = kv->off; /* the parser walked these: in bounds */
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t l;
        memcpy(&l, g->p + off, 8);
        (*s)[i] = (char *)g->p + off + 8;
        (*len)[i] = (size_t)l;
        off += 8 + l;
    }
    *n = (int64_t)kv->n;
    return XENT_OK;
}

static const char *value_type_name(uint32_t t) {
    static const char *const nm[XENT__GT_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
        "array", "u64", "i64", "f64"};
    return t < XENT__GT_COUNT ? nm[t] : "unknown";
}

/* tokenizer.ggml.token_type must be an array of i32, one per token (the
 * tokens array having nt entries). */
static xent_status token_type_check(const xent__gguf *g,
                                    const xent__gguf_kv *ty, int64_t nt) {
    const char *key = "tokenizer.ggml.token_type";
    int has_tokens = xent__gguf_find(g, "tokenizer.ggml.tokens") != NULL;
    if (ty->type != XENT__GT_ARR)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: %s: a scalar %s, expected "
                          "an array of %lld i32 (one per token)", key,
                          value_type_name(ty->type), (long long)nt);
    if (ty->atype != XENT__GT_I32)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: %s: array of %llu %s, "
                          "expected an array of %lld i32 (one per token)", key,
                          (unsigned long long)ty->n,
                          value_type_name(ty->atype), (long long)nt);
    if (has_tokens && ty->n != (uint64_t)nt)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: %s: array of %llu i32, the "
                          "tokens array has %lld", key,
                          (unsigned long long)ty->n, (long long)nt);
    return XENT_OK;
}

static xent_status gguf_tokenizer(const xent__gguf *g, const char *path, xent_model *m) {
    const char *tm;
    uint64_t tn;
    if (!xent__gguf_str(g, "tokenizer.ggml.model", &tm, &tn) ||
        !(tn == 4 && !memcmp(tm, "gpt2", 4)))
        return XENT_OK; /* only byte-level BPE; the model loads without */
    char **toks = NULL, **mer = NULL;
    size_t *tl = NULL, *ml = NULL;
    int64_t nt = 0, nm = 0;
    int32_t *types = NULL;
    char pre[64] = "default";
    xent_status st = XENT_OK;
    g_str(g, path, "tokenizer.ggml.pre", pre, sizeof pre, &st);
    if (!st) st = str_array(g, "tokenizer.ggml.tokens", &toks, &tl, &nt);
    if (!st) st = str_array(g, "tokenizer.ggml.merges", &mer, &ml, &nm);
    const xent__gguf_kv *ty = xent__gguf_find(g, "tokenizer.ggml.token_type");
    if (!st && ty) st = token_type_check(g, ty, nt);
    /* one token per row of the embedding, as llama.cpp requires */
    if (!st && nt != m->cfg.vocab)
        st = xent_set_error(XENT_ERR_SHAPE, "gguf: %s: tokenizer.ggml.tokens has %lld tokens but "
                            "token_embd.weight has %lld rows", path, (long long)nt,
                            (long long)m->cfg.vocab);
    if (!st && ty && nt > 0) {
        types = malloc((size_t)(nt + 1) * sizeof *types);
        if (!types) st = xent_set_error(XENT_ERR_ALLOC, "gguf: token types");
        else memcpy(types, g->p + ty->off, (size_t)nt * 4);
    }
    if (!st && nt > 0)
        st = xent__tokenizer_new(toks, tl, nt, mer, ml, nm, types, pre,
                                 &m->tok);
    free(toks), free(tl), free(mer), free(ml), free(types);
    return st;
}

/* Tensor of parameter i with the expected shape (checked before any
 * allocation sized by the metadata). */
static xent_status gguf_find_param(const xent__gguf *g, const xent_model *m,
                                   int i, const xent__gguf_tensor **out) {
    const xent_param *p = &m->params[i];
    char nm[128];
    gguf_name(m, i, nm, sizeof nm);
    const xent__gguf_tensor *t = xent__gguf_tensor_find(g, nm);
    if (!t)
        return xent_set_error(XENT_ERR_NOT_FOUND, "gguf: tensor '%s' (%s) is "
                          "missing", nm, p->name);
    int64_t want0 = p->ndim == 2 ? p->shape[1] : p->shape[0];
    int64_t want1 = p->ndim == 2 ? p->shape[0] : 1;
    if ((int)t->ndim > p->ndim || t->ne[0] != want0 || t->ne[1] != want1 ||
        t->ne[2] != 1 || t->ne[3] != 1)
        return xent_set_error(XENT_ERR_SHAPE, "gguf: tensor '%s' has shape "
                          "[%lld, %lld], expected [%lld, %lld] (ne order)",
                          nm, (long long)t->ne[0], (long long)t->ne[1],
                          (long long)want0, (long long)want1);
    *out = t;
    return XENT_OK;
}

static xent_status gguf_check_tensors(const xent__gguf *g,
                                      const xent_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        const xent__gguf_tensor *t;
        xent_status st = gguf_find_param(g, m, i, &t);
        if (st) return st;
    }
    return XENT_OK;
}

static xent_status gguf_tensors(const xent__gguf *g, xent_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        xent_param *p = &m->params[i];
        const xent__gguf_tensor *t;
        xent_status st = gguf_find_param(g, m, i, &t);
        if (!st) st = xent__gguf_dequant(t->type, g->p + t->off, t->numel, p->w);
        if (st) return st;
        /* llama.cpp permutes q/k rows of "llama" models for its rotary
         * layout (convert_hf_to_gguf.py: permute); undo it */
        int isq = strstr(p->name, "q_proj.weight") != NULL,
            isk = strstr(p->name, "k_proj.weight") != NULL;
        if (!strcmp(m->cfg.arch, "llama") && (isq || isk))
            xent__rope_permute(p->w, isq ? m->cfg.n_heads : m->cfg.n_kv_heads,
                               m->cfg.head_dim, p->shape[1], 1);
    }
    return XENT_OK;
}

/* The model from a GGUF image in memory (used by the loader and fuzzing). */
xent_status xent__model_from_gguf(const uint8_t *p, uint64_t size,
                                  const char *path, xent_model **out) {
    xent__gguf g;
    xent_status st = xent__gguf_parse(p, size, &g);
    if (st) return st;
    xent_model *m = calloc(1, sizeof *m);
    if (!m) {
        xent__gguf_free(&g);
        return xent_set_error(XENT_ERR_ALLOC, "model");
    }
    st = gguf_config(&g, path, &m->cfg);
    if (!st) st = xent__model_layout(m);
    if (!st) st = gguf_check_tensors(&g, m);
    if (!st) st = xent__model_alloc(m);
    if (!st) st = gguf_tensors(&g, m);
    if (!st) st = gguf_tokenizer(&g, path, m);
    if (!st) {
        snprintf(m->source, sizeof m->source, "%s", path);
        const xent__gguf_tensor *t = xent__gguf_tensor_find(&g, "blk.0.attn_q.weight");
        const char *tn[] = {"F32", "F16", "Q4_0", "Q4_1"};
        uint32_t ty = t ? t->type : 0;
        snprintf(m->source_type, sizeof m->source_type, "gguf v%u %s",
                 g.version, ty < 4 ? tn[ty] : ty == 8 ? "Q8_0" : "BF16");
    }
    xent__gguf_free(&g);
    if (st) {
        xent_model_free(m);
        return st;
    }
    *out = m;
    return XENT_OK;
}

xent_status xent_model_load_gguf(const char *path, xent_model **out) {
    if (!path || !out) return xent_set_error(XENT_ERR_NULL, "load_gguf: NULL");
    /* a FIFO, a device or a directory is refused before it is read */
    uint64_t size = 0;
    FILE *f = xent_file_open(path, &size);
    if (!f) return XENT_ERR_IO;
    if (size == 0 || size > (uint64_t)SIZE_MAX) {
        fclose(f);
        return xent_set_error(XENT_ERR_FORMAT, "gguf: '%s' is empty or too large", path);
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fileno(f), 0);
    fclose(f);
    if (p == MAP_FAILED)
        return xent_set_error(XENT_ERR_IO, "cannot map '%s'", path);
    xent_status st = xent__model_from_gguf(p, size, path, out);
    munmap(p, (size_t)size);
    return st;
}

/* ---- writer ------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 4096;
        while (c < b->n + n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    put_str(b, k, strlen(k));
    put_u32(b, XENT__GT_U32);
    put_u32(b, v);
}
static void kv_f32(buf *b, const char *k, float v) {
    put_str(b, k, strlen(k));
    put_u32(b, XENT__GT_F32);
    put(b, &v, 4);
}
static void kv_str(buf *b, const char *k, const char *v) {
    put_str(b, k, strlen(k));
    put_u32(b, XENT__GT_STR);
    put_str(b, v, strlen(v));
}

xent_status xent_model_save_gguf(const xent_model *m, const char *path) {
    if (!m || !path) return xent_set_error(XENT_ERR_NULL, "save_gguf: NULL");
    const xent_model_config *c = &m->cfg;
    if (strcmp(c->arch, "llama") && strcmp(c->arch, "qwen2"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "save_gguf: architecture '%s': GGUF is "
                              "written for llama and qwen2 only (use save_hf)", c->arch);
    buf b = {0};
    const xent_tokenizer *tk = m->tok;
    uint64_t nkv = 10 + (tk ? 6 : 0);
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)m->n_params);
    put_u64(&b, nkv);
    char k[128];
    kv_str(&b, "general.architecture", c->arch);
    kv_u32(&b, "general.alignment", 32);
#define KEY(f) (snprintf(k, sizeof k, "%s.%s", c->arch, f), k)
    kv_u32(&b, KEY("block_count"), (uint32_t)c->n_layers);
    kv_u32(&b, KEY("embedding_length"), (uint32_t)c->dim);
    kv_u32(&b, KEY("feed_forward_length"), (uint32_t)c->hidden);
    kv_u32(&b, KEY("attention.head_count"), (uint32_t)c->n_heads);
    kv_u32(&b, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    kv_u32(&b, KEY("attention.key_length"), (uint32_t)c->head_dim);
    kv_f32(&b, KEY("rope.freq_base"), (float)c->rope_theta);
    kv_f32(&b, KEY("attention.layer_norm_rms_epsilon"), (float)c->norm_eps);
#undef KEY
    if (tk) {
        int64_t nv = xent_tokenizer_vocab(tk), nm = xent__tokenizer_n_merges(tk);
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_str(&b, "tokenizer.ggml.pre", xent_tokenizer_pre(tk));
        put_str(&b, "tokenizer.ggml.tokens", 21);
        put_u32(&b, XENT__GT_ARR);
        put_u32(&b, XENT__GT_STR);
        put_u64(&b, (uint64_t)nv);
        for (int64_t i = 0; i < nv; i++) {
            const char *s = xent_tokenizer_token(tk, i);
            put_str(&b, s, strlen(s));
        }
        put_str(&b, "tokenizer.ggml.token_type", 25);
        put_u32(&b, XENT__GT_ARR);
        put_u32(&b, XENT__GT_I32);
        put_u64(&b, (uint64_t)nv);
        for (int64_t i = 0; i < nv; i++) {
            int32_t t = xent__tokenizer_type(tk, i);
            put(&b, &t, 4);
        }
        put_str(&b, "tokenizer.ggml.merges", 21);
        put_u32(&b, XENT__GT_ARR);
        put_u32(&b, XENT__GT_STR);
        put_u64(&b, (uint64_t)nm);
        for (int64_t i = 0; i < nm; i++) {
            const char *s = xent__tokenizer_merge(tk, i);
            put_str(&b, s, strlen(s));
        }
        kv_u32(&b, "tokenizer.ggml.bos_token_id",
               (uint32_t)(c->bos_id < 0 ? 0 : c->bos_id));
    }
    uint64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        const xent_param *p = &m->params[i];
        char nm[128];
        gguf_name(m, i, nm, sizeof nm);
        put_str(&b, nm, strlen(nm));
        put_u32(&b, (uint32_t)p->ndim);
        if (p->ndim == 2) {
            put_u64(&b, (uint64_t)p->shape[1]);
            put_u64(&b, (uint64_t)p->shape[0]);
        } else {
            put_u64(&b, (uint64_t)p->shape[0]);
        }
        put_u32(&b, XENT__GG_F32);
        put_u64(&b, off);
        off += ((uint64_t)p->numel * 4 + 31) / 32 * 32;
    }
    static const uint8_t zero[32] = {0};
    put(&b, zero, (32 - b.n % 32) % 32);
    float *tmp = NULL;
    for (int i = 0; i < m->n_params && !b.oom; i++) {
        const xent_param *p = &m->params[i];
        char nm[128];
        gguf_name(m, i, nm, sizeof nm);
        const float *w = p->w;
        int q = strstr(nm, "attn_q.weight") != NULL,
            kk = strstr(nm, "attn_k.weight") != NULL;
        if (!strcmp(c->arch, "llama") && (q || kk)) {
            free(tmp);
            tmp = malloc((size_t)p->numel * sizeof(float));
            if (!tmp) {
                b.oom = 1;
                break;
            }
            memcpy(tmp, p->w, (size_t)p->numel * sizeof(float));
            xent__rope_permute(tmp, q ? c->n_heads : c->n_kv_heads,
                               c->head_dim, p->shape[1], 0);
            w = tmp;
        }
        put(&b, w, (size_t)p->numel * 4);
        put(&b, zero, (32 - (size_t)p->numel * 4 % 32) % 32);
    }
    free(tmp);
    if (b.oom) {
        free(b.p);
        return xent_set_error(XENT_ERR_ALLOC, "save_gguf: buffer");
    }
    /* to PATH.tmp.XXXXXX, flushed, then renamed over PATH: a failure
     * leaves the old file as it was */
    char *tmpname = NULL;
    FILE *f = xent_file_create(path, &tmpname);
    if (!f) {
        free(b.p);
        return XENT_ERR_IO;
    }
    int ok = fwrite(b.p, 1, b.n, f) == b.n;
    free(b.p);
    return xent_file_commit(f, tmpname, path, ok);
}
