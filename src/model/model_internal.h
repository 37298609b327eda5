/* src/model/model_internal.h: private pieces shared by the model sources. */
#ifndef XENT_MODEL_INTERNAL_H
#define XENT_MODEL_INTERNAL_H

#include "model/model.h"
#include "core/xent_math.h"

/* 1 when layer parameter kind k exists under c. */
static inline int xent__kind_present(const xent_model_config *c,
                                     xent_param_kind k) {
    switch (k) {
    case XENT_P_BQ: case XENT_P_BK: case XENT_P_BV: return c->qkv_bias != 0;
    case XENT_P_Q_NORM: case XENT_P_K_NORM: return c->qk_norm != 0;
    case XENT_P_POST_ATTN_NORM: case XENT_P_POST_FF_NORM:
        return c->sandwich_norm != 0;
    default: return 1;
    }
}

/* Number of parameters per layer (9 + 3 biases + 2 q/k norms + 2 post-norms
 * as present). */
static inline int xent__layer_nparams(const xent_model_config *c) {
    int n = 0;
    for (int k = 0; k < XENT_P_LAYER_KINDS; k++)
        n += xent__kind_present(c, (xent_param_kind)k);
    return n;
}

/* Index in the parameter list of a layer parameter, -1 if absent. */
static inline int xent__pidx(const xent_model_config *c, int64_t l,
                             xent_param_kind k) {
    if (!xent__kind_present(c, k)) return -1;
    int r = 0;
    for (int j = 0; j < (int)k; j++) r += xent__kind_present(c, (xent_param_kind)j);
    return 1 + (int)l * xent__layer_nparams(c) + r;
}
static inline int xent__pidx_norm(const xent_model_config *c) {
    return 1 + (int)c->n_layers * xent__layer_nparams(c);
}
/* The LM head's weight: lm_head.weight, or the embedding when tied. */
static inline int xent__pidx_head(const xent_model_config *c) {
    return c->tied_head ? 0 : xent__pidx_norm(c) + 1;
}

/* Fills m->params' names and shapes from m->cfg (no data). */
xent_status xent__model_layout(xent_model *m);
/* Allocates the weight arena for the layout (zeroed) and points params. */
xent_status xent__model_alloc(xent_model *m);

/* RoPE tables as HF computes them (fp32 inverse frequencies, fp32 angles):
 * cos/sin [S, head_dim/2]. local = 1: the sliding layers' table (base
 * rope_local_theta, no scaling) when rope_local_theta > 0. */
void xent__rope_tables(const xent_model_config *c, int64_t S, float *cos_,
                       float *sin_, int local);

/* llama.cpp's rotary permutation of q/k rows (HF -> GGUF) and its inverse,
 * on a [n_head * head_dim, cols] matrix. */
void xent__rope_permute(float *w, int64_t n_head, int64_t head_dim,
                        int64_t cols, int inverse);

/* Tokenizer construction from GGUF arrays (tokenizer.c). tokens: [n]
 * strings; merges: [nm] "a b" strings; types: [n] or NULL. */
xent_status xent__tokenizer_new(char **tokens, const size_t *tok_len,
                                int64_t n, char **merges,
                                const size_t *merge_len, int64_t nm,
                                const int32_t *types, const char *pre,
                                xent_tokenizer **out);
/* Arrays for writing a tokenizer back (GGUF writer). */
int64_t xent__tokenizer_n_merges(const xent_tokenizer *tk);
const char *xent__tokenizer_merge(const xent_tokenizer *tk, int64_t i);
int32_t xent__tokenizer_type(const xent_tokenizer *tk, int64_t i);

/* The whole of a regular file of at most max bytes, NUL-terminated, in
 * *text (malloc'ed): FIFOs and devices are refused before they are read
 * (src/model/hf.c; config.json, index.json, tokenizer.json). */
xent_status xent__read_small_file(const char *path, uint64_t max, char **text, size_t *len);

#endif
