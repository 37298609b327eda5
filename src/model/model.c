/* src/model/model.c: configuration, parameter layout, allocation, lookup,
 * RoPE tables and the GGUF rotary permutation. */
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void xent_model_config_init(xent_model_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "llama");
    c->rope_theta = 10000.0;
    c->norm_eps = 1e-5;
    c->rope_scaling = XENT_ROPE_NONE;
    c->bos_id = c->eos_id = -1;
    c->init_std = 0.02;
}

const char *xent_model_supported_archs(void) {
    return "llama (Llama 1/2/3, SmolLM2), qwen2 (q/k/v biases), qwen3 (q/k "
           "norms), mistral (sliding window), gemma2 (sandwich norms, GeGLU, "
           "soft-capping, local/global layers), gemma3_text (q/k norms, "
           "local/global layers and RoPE bases)";
}

static int arch_known(const char *a) {
    return !strcmp(a, "llama") || !strcmp(a, "qwen2") || !strcmp(a, "qwen3") ||
           !strcmp(a, "mistral") || !strcmp(a, "gemma2") ||
           !strcmp(a, "gemma3_text");
}

int xent_model_layer_sliding(const xent_model_config *c, int64_t l) {
    if (!c || c->sliding_window <= 0 || c->swa_pattern <= 0) return 0;
    if (c->swa_pattern == 1) return 1;
    return (l + 1) % c->swa_pattern != 0;
}

xent_status xent_model_config_family(xent_model_config *c) {
    if (!c) return xent_set_error(XENT_ERR_NULL, "model config is NULL");
    if (!arch_known(c->arch))
        return xent_set_error(XENT_ERR_UNSUPPORTED,
                              "architecture '%s' is not supported; supported: %s",
                              c->arch, xent_model_supported_archs());
    int gemma = !strncmp(c->arch, "gemma", 5);
    c->qk_norm = !strcmp(c->arch, "qwen3") || !strcmp(c->arch, "gemma3_text");
    c->sandwich_norm = c->norm_plus_one = c->gelu_tanh = c->embed_scale = gemma;
    c->qkv_bias = !strcmp(c->arch, "qwen2");
    c->swa_pattern = !strcmp(c->arch, "mistral")  ? 1
                     : !strcmp(c->arch, "gemma2") ? 2
                     : !strcmp(c->arch, "gemma3_text") ? 6
                                                       : 0;
    return XENT_OK;
}

static xent_status pos_field(const char *name, int64_t v, int64_t max) {
    if (v <= 0 || v > max)
        return xent_set_error(XENT_ERR_SHAPE,
                          "model config: %s = %lld is outside [1, %lld]", name,
                          (long long)v, (long long)max);
    return XENT_OK;
}

xent_status xent_model_config_check(const xent_model_config *c) {
    if (!c) return xent_set_error(XENT_ERR_NULL, "model config is NULL");
    if (!arch_known(c->arch))
        return xent_set_error(XENT_ERR_UNSUPPORTED,
                          "architecture '%s' is not supported; supported: %s",
                          c->arch, xent_model_supported_archs());
    const int64_t big = (int64_t)1 << 24;
    xent_status st;
    if ((st = pos_field("n_layers", c->n_layers, 4096)) ||
        (st = pos_field("dim", c->dim, big)) ||
        (st = pos_field("hidden", c->hidden, big)) ||
        (st = pos_field("n_heads", c->n_heads, 4096)) ||
        (st = pos_field("n_kv_heads", c->n_kv_heads, 4096)) ||
        (st = pos_field("head_dim", c->head_dim, 65536)) ||
        (st = pos_field("vocab", c->vocab, (int64_t)1 << 31)))
        return st;
    if (c->n_heads % c->n_kv_heads)
        return xent_set_error(XENT_ERR_SHAPE,
                          "model config: n_heads = %lld is not a multiple of "
                          "n_kv_heads = %lld",
                          (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->head_dim % 2)
        return xent_set_error(XENT_ERR_SHAPE, "model config: head_dim = %lld is odd",
                          (long long)c->head_dim);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return xent_set_error(XENT_ERR_VALUE, "model config: rope_theta = %g",
                          c->rope_theta);
    if (!(c->norm_eps >= 0) || !isfinite(c->norm_eps))
        return xent_set_error(XENT_ERR_VALUE, "model config: norm_eps = %g",
                          c->norm_eps);
    if (c->rope_scaling == XENT_ROPE_LLAMA3 &&
        (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
         !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
         c->rope_orig_ctx <= 0))
        return xent_set_error(XENT_ERR_VALUE,
                          "model config: llama3 rope scaling needs factor > 0, "
                          "high_freq_factor > low_freq_factor > 0 and "
                          "original_max_position_embeddings > 0");
    if (c->rope_scaling == XENT_ROPE_LINEAR && !(c->rope_factor > 0))
        return xent_set_error(XENT_ERR_VALUE,
                              "model config: linear rope scaling needs factor > 0");
    if (!(c->query_scalar >= 0) || !isfinite(c->query_scalar) ||
        !(c->attn_softcap >= 0) || !isfinite(c->attn_softcap) ||
        !(c->final_softcap >= 0) || !isfinite(c->final_softcap) ||
        !(c->rope_local_theta >= 0) || !isfinite(c->rope_local_theta) ||
        !(c->init_std >= 0) || !isfinite(c->init_std))
        return xent_set_error(XENT_ERR_VALUE,
                              "model config: query_scalar %g, attn_softcap %g, "
                              "final_softcap %g, rope_local_theta %g, init_std %g: "
                              "each must be finite and >= 0",
                              c->query_scalar, c->attn_softcap, c->final_softcap,
                              c->rope_local_theta, c->init_std);
    if (c->sliding_window < 0 || c->swa_pattern < 0 || c->swa_pattern > 4096)
        return xent_set_error(XENT_ERR_VALUE,
                              "model config: sliding_window = %lld, swa_pattern = "
                              "%lld", (long long)c->sliding_window,
                              (long long)c->swa_pattern);
    return XENT_OK;
}

static void set_param(xent_param *p, const char *name, int64_t r, int64_t c) {
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = c ? 2 : 1;
    p->shape[0] = r;
    p->shape[1] = c;
    p->numel = c ? r * c : r;
    p->w = NULL;
}

xent_status xent__model_layout(xent_model *m) {
    const xent_model_config *c = &m->cfg;
    xent_status st = xent_model_config_check(c);
    if (st) return st;
    int n = xent__pidx_norm(c) + 1 + (c->tied_head ? 0 : 1);
    xent_param *p = calloc((size_t)n, sizeof *p);
    if (!p) return xent_set_error(XENT_ERR_ALLOC, "model: %d parameters", n);
    int64_t D = c->dim, H = c->hidden, qd = c->n_heads * c->head_dim,
            kvd = c->n_kv_heads * c->head_dim;
    set_param(&p[0], "model.embed_tokens.weight", c->vocab, D);
    static const char *const nm[XENT_P_LAYER_KINDS] = {
        "input_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.q_proj.bias", "self_attn.k_proj.bias",
        "self_attn.v_proj.bias", "self_attn.o_proj.weight",
        "post_attention_layernorm.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight"};
    const int64_t shp[XENT_P_LAYER_KINDS][2] = {
        {D, 0}, {qd, D}, {kvd, D}, {kvd, D}, {qd, 0}, {kvd, 0}, {kvd, 0},
        {D, qd}, {D, 0}, {H, D}, {H, D}, {D, H}};
    static const char *const nm2[] = {"self_attn.q_norm.weight",
                                      "self_attn.k_norm.weight",
                                      "post_attention_layernorm.weight",
                                      "post_feedforward_layernorm.weight"};
    const int64_t shp2[][2] = {{c->head_dim, 0}, {c->head_dim, 0}, {D, 0}, {D, 0}};
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int k = 0; k < XENT_P_LAYER_KINDS; k++) {
            int i = xent__pidx(c, l, (xent_param_kind)k);
            if (i < 0) continue;
            char name[96];
            const char *kn = k < XENT_P_Q_NORM ? nm[k] : nm2[k - XENT_P_Q_NORM];
            if (k == XENT_P_MLP_NORM && c->sandwich_norm)
                kn = "pre_feedforward_layernorm.weight";
            snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, kn);
            if (k >= XENT_P_Q_NORM) {
                set_param(&p[i], name, shp2[k - XENT_P_Q_NORM][0], 0);
                continue;
            }
            set_param(&p[i], name, shp[k][0], shp[k][1]);
        }
    set_param(&p[xent__pidx_norm(c)], "model.norm.weight", D, 0);
    if (!c->tied_head) set_param(&p[n - 1], "lm_head.weight", c->vocab, D);
    free(m->params);
    m->params = p;
    m->n_params = n;
    return XENT_OK;
}

int64_t xent_model_n_weights(const xent_model *m) {
    int64_t s = 0;
    for (int i = 0; i < m->n_params; i++) s += m->params[i].numel;
    return s;
}

xent_status xent__model_alloc(xent_model *m) {
    int64_t n = xent_model_n_weights(m);
    free(m->arena);
    m->arena = calloc((size_t)n, sizeof(float));
    if (!m->arena)
        return xent_set_error(XENT_ERR_ALLOC, "model: %lld weights",
                          (long long)n);
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].w = m->arena + off;
        off += m->params[i].numel;
    }
    return XENT_OK;
}

xent_status xent_model_new(const xent_model_config *cfg, xent_model **out) {
    if (!cfg || !out) return xent_set_error(XENT_ERR_NULL, "model_new: NULL");
    xent_model *m = calloc(1, sizeof *m);
    if (!m) return xent_set_error(XENT_ERR_ALLOC, "model");
    m->cfg = *cfg;
    xent_status st = xent__model_layout(m);
    if (!st) st = xent__model_alloc(m);
    if (st) {
        xent_model_free(m);
        return st;
    }
    snprintf(m->source_type, sizeof m->source_type, "new");
    *out = m;
    return XENT_OK;
}

void xent_model_free(xent_model *m) {
    if (!m) return;
    xent_tokenizer_free(m->tok);
    free(m->params);
    free(m->arena);
    free(m);
}

int xent_model_param_index(const xent_model *m, int64_t layer,
                           xent_param_kind kind) {
    if (!m || layer < 0 || layer >= m->cfg.n_layers || kind < 0 ||
        kind >= XENT_P_LAYER_KINDS)
        return -1;
    return xent__pidx(&m->cfg, layer, kind);
}

int xent_model_param_find(const xent_model *m, const char *name) {
    for (int i = 0; m && name && i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

xent_status xent_model_load(const char *path, xent_model **out) {
    struct stat sb;
    if (!path) return xent_set_error(XENT_ERR_NULL, "model path is NULL");
    if (stat(path, &sb) != 0)
        return xent_set_error(XENT_ERR_IO, "cannot open model '%s'", path);
    if (S_ISDIR(sb.st_mode)) return xent_model_load_hf(path, out);
    return xent_model_load_gguf(path, out);
}

/* HF (LlamaRotaryEmbedding, default and llama3 rope types): inv_freq =
 * 1 / base ** (arange(0, hd, 2).float() / hd) in fp32; angle = pos * inv in
 * fp32; cos/sin of that fp32 angle. */
void xent__rope_tables(const xent_model_config *c, int64_t S, float *cos_,
                       float *sin_, int local) {
    int64_t half = c->head_dim / 2;
    local = local && c->rope_local_theta > 0;
    double base = local ? c->rope_local_theta : c->rope_theta;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)c->head_dim;
        float inv = 1.0f / powf((float)base, e);
        if (!local && c->rope_scaling == XENT_ROPE_LINEAR) {
            inv = (float)(inv / c->rope_factor);
        } else if (!local && c->rope_scaling == XENT_ROPE_LLAMA3) {
            double oc = (double)c->rope_orig_ctx;
            double lw = oc / c->rope_low_freq_factor;
            double hw = oc / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / inv;
            if (wl > lw) {
                inv = (float)(inv / c->rope_factor);
            } else if (wl >= hw) {
                double sm = (oc / wl - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
                inv = (float)((1 - sm) * inv / c->rope_factor + sm * inv);
            }
        }
        for (int64_t s = 0; s < S; s++) {
            float a = (float)s * inv;
            cos_[s * half + i] = cosf(a);
            sin_[s * half + i] = sinf(a);
        }
    }
}

/* GGUF row (h, i, j) holds HF row (h, j, i), i < head_dim/2, j < 2. */
void xent__rope_permute(float *w, int64_t n_head, int64_t head_dim,
                        int64_t cols, int inverse) {
    int64_t half = head_dim / 2;
    float *tmp = malloc((size_t)(head_dim * cols) * sizeof(float));
    if (!tmp) return;
    for (int64_t h = 0; h < n_head; h++) {
        float *blk = w + h * head_dim * cols;
        memcpy(tmp, blk, (size_t)(head_dim * cols) * sizeof(float));
        for (int64_t i = 0; i < half; i++)
            for (int64_t j = 0; j < 2; j++) {
                int64_t g = 2 * i + j, hf = j * half + i;
                int64_t dst = inverse ? hf : g, src = inverse ? g : hf;
                memcpy(blk + dst * cols, tmp + src * cols,
                       (size_t)cols * sizeof(float));
            }
    }
    free(tmp);
}

double xent_model_flops(const xent_model_config *c, int64_t B, int64_t S,
                        int backward) {
    double T = (double)B * (double)S, D = (double)c->dim,
           H = (double)c->hidden, qd = (double)(c->n_heads * c->head_dim),
           kvd = (double)(c->n_kv_heads * c->head_dim);
    double per_tok = 2.0 * (D * qd * 2 + D * kvd * 2 + 3 * D * H) *
                         (double)c->n_layers +
                     2.0 * D * (double)c->vocab;
    /* attention: QK^T and PV over the full S x S block we compute */
    double att = 4.0 * (double)S * qd * (double)c->n_layers;
    double f = T * (per_tok + att);
    return backward ? 3.0 * f : f;
}
