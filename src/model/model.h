/* src/model/model.h: a Llama-family decoder (Llama, SmolLM2, Llama 3, Qwen2,
 * Qwen3, Mistral, Gemma 2, Gemma 3 text) in C: checkpoint loaders (GGUF, Hugging Face safetensors directories), the
 * byte-level BPE tokenizer stored in GGUF, and one call that runs forward and
 * backward of next-token cross-entropy (or a policy-gradient loss) under an
 * xent_precision policy, optionally recording every intermediate tensor.
 *
 * Conventions: T = B * S tokens, row-major, int64_t sizes. Weights are kept
 * in fp32 (quantized GGUF tensors are dequantized on load: the dequantized
 * values ARE the fp32 model). Every function returns an xent_status and sets
 * xent_last_error() on failure. */
#ifndef XENT_MODEL_MODEL_H
#define XENT_MODEL_MODEL_H

#include "xent.h"
#include "model/precision.h"

#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */
/* ------------------------------------------------------------------------ */

typedef enum xent_rope_scaling {
    XENT_ROPE_NONE = 0,
    XENT_ROPE_LLAMA3 = 1, /* "rope_type": "llama3" (factor, low/high freq)  */
    XENT_ROPE_LINEAR = 2  /* "rope_type": "linear": inv_freq / factor      */
} xent_rope_scaling;

typedef struct xent_model_config {
    char arch[32];         /* "llama", "qwen2", "qwen3", "mistral", "gemma2",
                              "gemma3_text" (HF model_type)                  */
    int64_t n_layers;
    int64_t dim;           /* hidden size (residual width)                   */
    int64_t hidden;        /* MLP intermediate size                          */
    int64_t n_heads;
    int64_t n_kv_heads;    /* n_heads % n_kv_heads == 0 (GQA)                */
    int64_t head_dim;      /* usually dim / n_heads                          */
    int64_t vocab;
    int64_t max_seq;       /* context length from the checkpoint (0 unknown) */
    double rope_theta;
    xent_rope_scaling rope_scaling;
    double rope_factor;           /* llama3: factor                         */
    double rope_low_freq_factor;  /* llama3: low_freq_factor                */
    double rope_high_freq_factor; /* llama3: high_freq_factor               */
    int64_t rope_orig_ctx;        /* llama3: original_max_position_embeddings*/
    double norm_eps;       /* RMSNorm epsilon                                */
    int tied_head;         /* 1: lm_head shares embed_tokens                 */
    int qkv_bias;          /* 1: q/k/v projections have biases (Qwen2)       */
    int64_t bos_id, eos_id;/* -1 when unknown                                */
    /* Family features (all 0 for Llama/Qwen2; xent_model_config_family sets
     * the family's defaults from arch): */
    int qk_norm;           /* 1: RMSNorm over head_dim of q and k before RoPE
                              (self_attn.q_norm/k_norm.weight [head_dim];
                              Qwen3, Gemma 3)                                */
    int sandwich_norm;     /* 1: RMSNorm of the attention and MLP outputs
                              before the residual add (Gemma 2/3):
                              post_attention_layernorm is then the attention
                              post-norm, pre_feedforward_layernorm the MLP
                              pre-norm, post_feedforward_layernorm the MLP
                              post-norm                                      */
    int norm_plus_one;     /* 1: RMSNorm scales by (1 + w), in fp32 (Gemma)  */
    int gelu_tanh;         /* 1: MLP gelu_tanh(gate) * up (GeGLU, Gemma);
                              0: silu(gate) * up                             */
    int embed_scale;       /* 1: embeddings times sqrt(dim) (Gemma)          */
    double query_scalar;   /* attention scale 1/sqrt(query_scalar); 0: head_dim
                              (Gemma: query_pre_attn_scalar)                 */
    double attn_softcap;   /* scores -> c tanh(scores / c); 0: none (Gemma 2) */
    double final_softcap;  /* logits -> c tanh(logits / c); 0: none          */
    int64_t sliding_window;/* keys j with i - j < window; 0: none            */
    int64_t swa_pattern;   /* which layers slide: 0 none (or no window), 1
                              every layer (Mistral), k > 1: layers l with
                              (l + 1) % k != 0 (Gemma 2: 2, Gemma 3: 6)      */
    double rope_local_theta; /* RoPE base of sliding layers (Gemma 3's
                              rope_local_base_freq, no scaling); 0: rope_theta*/
    double init_std;       /* initializer_range (random weights), 0.02       */
} xent_model_config;

/* 1 when layer l uses the sliding window. */
int xent_model_layer_sliding(const xent_model_config *c, int64_t l);

/* Fills the defaults (theta 10000, eps 1e-5, no scaling, ids -1). */
void xent_model_config_init(xent_model_config *c);
/* Checks shapes and ranges; message names the field. */
xent_status xent_model_config_check(const xent_model_config *c);
/* "llama, qwen2, qwen3, mistral, gemma2, gemma3_text" with notes. */
const char *xent_model_supported_archs(void);
/* Sets the family features of c->arch to that family's defaults (qk_norm,
 * sandwich_norm, norm_plus_one, gelu_tanh, embed_scale, qkv_bias,
 * swa_pattern); XENT_ERR_UNSUPPORTED for an unknown arch. */
xent_status xent_model_config_family(xent_model_config *c);

/* Built-in configurations at real shapes (for --init random): name ->
 * config, e.g. "qwen2.5-0.5b"; XENT_ERR_NOT_FOUND listing the names. */
xent_status xent_model_config_builtin(const char *name, xent_model_config *c);
const char *xent_model_config_builtins(void); /* "qwen2.5-0.5b, ..." */
/* A configuration from a config.json file (as the HF loader reads it). */
xent_status xent_model_config_file(const char *path, xent_model_config *c);
/* spec: a built-in name, else a config.json path (a directory: its
 * config.json). */
xent_status xent_model_config_named(const char *spec, xent_model_config *c);

/* ------------------------------------------------------------------------ */
/* Parameters and the model                                                  */
/* ------------------------------------------------------------------------ */

/* Parameter kinds, per layer in this order (see xent_model_param_index). */
typedef enum xent_param_kind {
    XENT_P_ATTN_NORM = 0, /* input_layernorm.weight            [dim]        */
    XENT_P_WQ,            /* self_attn.q_proj.weight [n_heads*hd, dim]      */
    XENT_P_WK,            /* self_attn.k_proj.weight [n_kv*hd, dim]         */
    XENT_P_WV,            /* self_attn.v_proj.weight [n_kv*hd, dim]         */
    XENT_P_BQ,            /* self_attn.q_proj.bias   [n_heads*hd] (qkv_bias)*/
    XENT_P_BK,            /* self_attn.k_proj.bias   [n_kv*hd]              */
    XENT_P_BV,            /* self_attn.v_proj.bias   [n_kv*hd]              */
    XENT_P_WO,            /* self_attn.o_proj.weight [dim, n_heads*hd]      */
    XENT_P_MLP_NORM,      /* post_attention_layernorm.weight [dim]          */
    XENT_P_WGATE,         /* mlp.gate_proj.weight [hidden, dim]             */
    XENT_P_WUP,           /* mlp.up_proj.weight   [hidden, dim]             */
    XENT_P_WDOWN,         /* mlp.down_proj.weight [dim, hidden]             */
    XENT_P_Q_NORM,        /* self_attn.q_norm.weight [head_dim] (qk_norm)   */
    XENT_P_K_NORM,        /* self_attn.k_norm.weight [head_dim] (qk_norm)   */
    XENT_P_POST_ATTN_NORM,/* post_attention_layernorm.weight [dim] (sandwich:
                             the attention output's norm; MLP_NORM is then
                             pre_feedforward_layernorm.weight)               */
    XENT_P_POST_FF_NORM,  /* post_feedforward_layernorm.weight [dim]        */
    XENT_P_LAYER_KINDS
} xent_param_kind;

typedef struct xent_param {
    char name[96];    /* the HF checkpoint name, e.g.
                         "model.layers.3.self_attn.q_proj.weight"           */
    int ndim;         /* 1 or 2                                             */
    int64_t shape[2]; /* [out, in] for matrices (HF layout), [n] vectors    */
    int64_t numel;
    float *w;         /* [numel] fp32 values (points into the model arena) */
} xent_param;

typedef struct xent_tokenizer xent_tokenizer;

typedef struct xent_model {
    xent_model_config cfg;
    /* Parameters, in this order: model.embed_tokens.weight [V, dim], then
     * per layer the present kinds of xent_param_kind in enum order (biases
     * only when cfg.qkv_bias, q/k norms when cfg.qk_norm, the post-norms
     * when cfg.sandwich_norm), then model.norm.weight [dim], then lm_head.weight
     * [V, dim] unless cfg.tied_head. */
    int n_params;
    xent_param *params;     /* [n_params]                                  */
    xent_tokenizer *tok;    /* from GGUF or tokenizer.json; may be NULL     */
    char source[512];       /* the path it was loaded from                  */
    char source_type[64];   /* e.g. "gguf Q4_1" or "safetensors bf16", or
                               "random weights" (xent_model_init_random)   */
    int random_weights;     /* 1: weights drawn by xent_model_init_random  */
    char tok_note[256];     /* why tok is NULL (HF dir), else ""            */
    float *arena;           /* owns every params[i].w                       */
} xent_model;

/* GGUF file (v2/v3): metadata, tokenizer, tensors F32/F16/BF16/Q8_0/Q4_0/
 * Q4_1 dequantized to fp32; llama.cpp's rotary permutation of q/k undone so
 * the weights equal the HF checkpoint's. *out is allocated; free with
 * xent_model_free. */
xent_status xent_model_load_gguf(const char *path, xent_model **out);
/* Hugging Face directory: config.json, then model.safetensors.index.json
 * (its weight_map names the shard of every tensor; every shard named must
 * exist) when present, else every *.safetensors in the directory; F32/BF16/
 * F16 tensors; tokenizer.json (byte-level BPE: vocab, merges, added tokens,
 * the pre-tokenizer's split pattern) when present, else m->tok stays NULL. */
xent_status xent_model_load_hf(const char *dir, xent_model **out);
/* Picks by path: a directory -> HF, otherwise GGUF. */
xent_status xent_model_load(const char *path, xent_model **out);
/* A model with every parameter allocated and zeroed (tests, conversions). */
xent_status xent_model_new(const xent_model_config *cfg, xent_model **out);
void xent_model_free(xent_model *m); /* NULL ok; frees the tokenizer too */
/* A model of cfg with random weights, the family's initializer: every
 * matrix (and the embeddings) normal(0, cfg->init_std) (0.02 when 0),
 * biases 0, norm weights 1 (0 where the norm scales by 1 + w), drawn from
 * a fixed generator seeded by seed; source_type "random weights",
 * random_weights = 1. Rows are drawn in parallel: the values depend on the
 * seed only. */
xent_status xent_model_init_random(const xent_model_config *cfg,
                                   uint64_t seed, xent_model **out);

/* Index in m->params of a layer parameter (-1 if absent, e.g. biases), and
 * of the global ones. */
int xent_model_param_index(const xent_model *m, int64_t layer,
                           xent_param_kind kind);
int xent_model_param_find(const xent_model *m, const char *name); /* -1 */
int64_t xent_model_n_weights(const xent_model *m); /* sum of numel */

/* Writes an HF checkpoint dir: config.json + model.safetensors (dtype F32,
 * BF16 or F16). Creates the directory if needed. */
xent_status xent_model_save_hf(const xent_model *m, const char *dir,
                               xent_dtype dtype);
/* Writes a GGUF v3 file with F32 tensors, the llama.cpp q/k permutation
 * applied (so xent_model_load_gguf reads back the same model) and the
 * tokenizer if m->tok is set (tests build tiny models with this). */
xent_status xent_model_save_gguf(const xent_model *m, const char *path);

/* ------------------------------------------------------------------------ */
/* Tokenizer (GPT-2 style byte-level BPE from GGUF or tokenizer.json)        */
/* ------------------------------------------------------------------------ */

/* tokenizer.json text (HF tokenizers, model.type "BPE", byte-level): the
 * vocabulary, the merges ("a b" strings or [a, b] pairs), added_tokens
 * (split out before BPE, like GGUF's control tokens) and the pre-tokenizer
 * recognised from its Split pattern (Llama 3, Qwen2) or Digits (SmolLM) or
 * plain ByteLevel (GPT-2). path names the file in messages. */
xent_status xent_tokenizer_from_json(const char *text, size_t len,
                                     const char *path, xent_tokenizer **out);
/* The same from a file (regular files only, 256 MiB at most). */
xent_status xent_tokenizer_load_json(const char *path, xent_tokenizer **out);

/* Ids of text (no BOS/EOS added). *ids is malloc'ed; free() it. */
xent_status xent_tokenize(const xent_tokenizer *tk, const char *text,
                          size_t len, int32_t **ids, int64_t *n);
/* Bytes of the ids concatenated (malloc'ed, NUL-terminated). */
xent_status xent_detokenize(const xent_tokenizer *tk, const int32_t *ids,
                            int64_t n, char **text, size_t *len);
int64_t xent_tokenizer_vocab(const xent_tokenizer *tk);
const char *xent_tokenizer_pre(const xent_tokenizer *tk); /* "smollm", ...  */
/* Token string as stored (GPT-2 byte-to-unicode form), NULL if out of range*/
const char *xent_tokenizer_token(const xent_tokenizer *tk, int64_t id);
void xent_tokenizer_free(xent_tokenizer *tk);

/* ------------------------------------------------------------------------ */
/* Forward + backward                                                        */
/* ------------------------------------------------------------------------ */

/* Per-run options. Targets: labels[b, s] (ignore_index -100) when given,
 * else next-token: label[b, s] = tokens[b, s + 1], the last position of
 * each row ignored.
 * Loss (a scalar), N = number of counted targets:
 *   advantages == NULL:  L = (1/N) sum_t nll_t              (cross-entropy)
 *   advantages != NULL:  L = -(1/N) sum_t A_t * logp_t      (policy gradient)
 * with A_t = advantages[t] aligned with the labels (same [B, S] index). */
typedef struct xent_model_run_opts {
    int64_t B, S;             /* batch rows and sequence length             */
    const int32_t *tokens;    /* [B, S] ids in [0, vocab)                   */
    const int32_t *labels;    /* [B, S] or NULL (next-token shift)          */
    const float *advantages;  /* [B, S] or NULL                             */
    int backward;             /* 1: also gradients (default 1)              */
    int record;               /* 1: keep every recorded tensor (below)      */
    int threads;              /* 0: XENT_NUM_THREADS else all cores         */
    int gemm_device;          /* 0: matrix products by OpenBLAS (default);
                                 1: on the GPU (cuBLAS: real bf16/f16
                                 tensor-core products of the same values;
                                 src/model/gemm_device.h);
                                 2: the whole forward + backward resident
                                 on the GPU (weights uploaded once per
                                 workspace, the same rounding points;
                                 src/model/core_dev.h). Without CUDA, 1
                                 and 2 fail with XENT_ERR_UNSUPPORTED       */
    /* called after each layer's forward (backward = 0) and backward (1),
     * from the calling thread; NULL: none (a progress line's hook) */
    void (*on_layer)(void *ctx, int64_t layer, int backward);
    void *on_layer_ctx;
} xent_model_run_opts;

void xent_model_run_opts_init(xent_model_run_opts *o);

/* What a run leaves behind. Pointers are owned by the workspace and stay
 * valid until the next run on it or xent_model_ws_free. With record == 0
 * only loss, n_counted, logprobs and (when backward) param_grads are set;
 * the others are NULL. All values are fp32 arrays holding exactly the values
 * the policy stored (e.g. bf16-representable under compute = BF16). */
typedef struct xent_model_record {
    double loss;              /* the scalar loss L                          */
    int64_t n_counted;        /* N                                          */
    double loss_scale;        /* the loss scale used (1 unless fp16)        */
    float *logprobs;          /* [T] log p of the label (0 where ignored)   */
    float *embed_out;         /* [T, dim] token embeddings (residual dtype) */
    float **layer_out;        /* [n_layers] -> [T, dim] each layer's output */
    float **layer_in_grad;    /* [n_layers] -> [T, dim] dL/d(layer input)   */
    float *embed_grad;        /* [T, dim] dL/d(embeddings output)           */
    float *final_norm_out;    /* [T, dim] final RMSNorm output              */
    float *logits;            /* [T, V] (logits dtype values)               */
    float *dlogits;           /* [T, V] dL/dlogits (unscaled)               */
    float **param_grads;      /* [n_params] -> [params[i].numel], named by
                                 model->params[i].name; unscaled            */
} xent_model_record;

typedef struct xent_model_ws xent_model_ws;

/* Plans and allocates all memory for runs of up to B x S tokens (one arena;
 * record = 1 reserves the recorded tensors too). A policy whose compute or
 * lm_head dtype is not f32 adds, on first use, one rounded copy of the
 * weights (kept while the dtype stays; the model's weights must not change
 * between runs on one workspace). */
xent_status xent_model_ws_new(const xent_model *m, int64_t B, int64_t S,
                              int record, xent_model_ws **out);
void xent_model_ws_free(xent_model_ws *ws);
/* on = 1: a run with the same tokens, B, S, one micro-batch and the same
 * compute/residual/norm/attn_softmax dtypes as the previous run on ws skips
 * the embedding and the layers' forward and reuses what that run left (the
 * same bits; the caller promises the weights did not change). Default 0. */
void xent_model_ws_reuse_forward(xent_model_ws *ws, int on);
size_t xent_model_ws_bytes(const xent_model_ws *ws); /* arena size         */

/* One forward (+ backward) of the loss under policy `prec`. opts->B/S must
 * fit the workspace; opts->record needs a workspace made with record = 1.
 * Results in *rec (pointers into ws); *rec is untouched on failure.
 * Loss scale: prec->loss_scale > 0 is used as given; 0 means 1, except when
 * a dtype of the policy is f16: then 2^16, halved while a gradient
 * overflows. Rows are split over opts->threads; the results do not depend
 * on the thread count (bitwise). */
xent_status xent_model_run(const xent_model *m, xent_model_ws *ws,
                           const xent_precision *prec,
                           const xent_model_run_opts *opts,
                           xent_model_record *rec);

/* The same model evaluated in double precision (fp32 weights widened; all
 * arithmetic in double, no rounding to any policy): loss, and the gradient
 * of every parameter (grads[i]: [params[i].numel]) and of the embeddings
 * output (embed_grad: [T, dim]) when non-NULL. For gradient checks and as
 * the reference the policies are measured against. Allocates internally. */
xent_status xent_model_run_f64(const xent_model *m,
                               const xent_model_run_opts *opts,
                               double *loss, double **grads,
                               double *embed_grad);
/* Like xent_model_run_f64, with parameters taken from `weights`
 * (weights[i]: [params[i].numel] doubles) instead of m->params (for
 * finite differences at double resolution). */
xent_status xent_model_run_f64_w(const xent_model *m,
                                 const double *const *weights,
                                 const xent_model_run_opts *opts,
                                 double *loss, double **grads,
                                 double *embed_grad);

/* FLOPs of one forward (+ backward: x3) for T tokens, matmuls + attention. */
double xent_model_flops(const xent_model_config *c, int64_t B, int64_t S,
                        int backward);

#endif
